/*
 * tokenizer.c - the tokenizer's core (see tokenizer.h): building it from
 * plain arrays, vocabulary and merge lookup, splitting special tokens out
 * of the input. The two encoders live in tokenizer_bpe.c and
 * tokenizer_spm.c, decoding and the chat prompt in tokenizer_decode.c, the
 * file adapters in tokenizer_gguf.c and tokenizer_json.c.
 *
 * Behaviour, and where it comes from:
 *  - Special tokens (CONTROL, USER_DEFINED, UNKNOWN) are found in the text
 *    leftmost first, the longest one where several start at the same byte,
 *    as Hugging Face's added-vocabulary matcher does. With parse_special
 *    false only USER_DEFINED tokens are matched (Hugging Face: non-special
 *    added tokens; llama.cpp does the same).
 *  - End of generation: EOS, EOT, EOM and any token whose text is one of
 *    llama.cpp's end-of-generation texts that concern LLaMA-family
 *    vocabularies (<|eot_id|>, <|eom_id|>, <|end_of_text|>, ...).
 *  - Decoding gives every token's bytes: byte-level BPE tokens through the
 *    inverse GPT-2 byte table, SPM tokens with U+2581 turned back into
 *    spaces and <0xXX> into the byte, special tokens as their text.
 *    No clean-up of spaces is applied, so decode(encode(x)) == x.
 */
#include "tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8 /* CMake sets it too */
#endif
#include <pcre2.h>

static const char HINT_FILE[] = "the tokenizer data is malformed; re-convert or re-download the model";

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

size_t bn_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len = bn_utf8_len(c);
    if (len == 1 || len > n)
        return 0;
    uint32_t v = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min_for_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_for_len[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

bool bn_tok_vec_push(bn_tok_vec *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p)
            return false;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return true;
}

void *bn_tok_grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap && p)
        return p;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(p, n * elem);
    if (q)
        *cap = n;
    return q;
}

static bool merge_before(const bn_tok_candidate *a, const bn_tok_candidate *b)
{
    return a->key < b->key || (a->key == b->key && a->pos < b->pos);
}

bool bn_tok_heap_push(bn_tok_scratch *s, bn_tok_candidate m)
{
    bn_tok_candidate *h = bn_tok_grow(s->heap, &s->heap_cap, s->heap_n + 1, sizeof *h);
    if (!h)
        return false;
    s->heap = h;
    size_t i = s->heap_n++;
    while (i > 0 && merge_before(&m, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = m;
    return true;
}

bn_tok_candidate bn_tok_heap_pop(bn_tok_scratch *s)
{
    bn_tok_candidate *h = s->heap;
    bn_tok_candidate top = h[0], last = h[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && merge_before(&h[c + 1], &h[c]))
            c++;
        if (!merge_before(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (n > 0)
        h[i] = last;
    return top;
}

bool bn_tok_split_merge(const char *s, size_t len, bn_tok_str *left, bn_tok_str *right)
{
    for (size_t i = 1; i < len; i++) {
        if (s[i] == ' ') {
            left->ptr = s;
            left->len = i;
            right->ptr = s + i + 1;
            right->len = len - i - 1;
            return true;
        }
    }
    return false;
}

/* FNV-1a: token texts are short, and this is plenty for them. */
static uint64_t hash_bytes(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* A power of two at least twice n, so open addressing stays short. */
static uint32_t table_size(size_t n)
{
    uint32_t size = 16;
    while (size < 2 * n)
        size *= 2;
    return size;
}

/* ------------------------------------------------------------------------ */
/* Lookup                                                                    */
/* ------------------------------------------------------------------------ */

int32_t bn_tok_lookup(const bn_tokenizer *t, const char *s, size_t len)
{
    if (len == 0)
        return -1;
    uint32_t i = (uint32_t)hash_bytes(s, len) & t->vocab_mask;
    for (;; i = (i + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slots[i];
        if (id < 0)
            return -1;
        size_t n;
        const char *text = bn_tok_text(t, id, &n);
        if (n == len && memcmp(text, s, len) == 0)
            return id;
    }
}

const bn_tok_merge *bn_tok_merge_find(const bn_tokenizer *t, int32_t left, int32_t right)
{
    if (!t->merges)
        return NULL;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint32_t i = (uint32_t)hash_u64(key) & t->merge_mask;
    for (;; i = (i + 1) & t->merge_mask) {
        const bn_tok_merge *m = &t->merges[i];
        if (m->rank < 0)
            return NULL;
        if (m->key == key)
            return m;
    }
}

/* ------------------------------------------------------------------------ */
/* Building                                                                  */
/* ------------------------------------------------------------------------ */

/* GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for
 * themselves; the other 68 bytes (0-32, 127-160 and 173: controls, space,
 * DEL, NBSP, soft hyphen) get the code points 256, 257, ... in byte order,
 * so that every byte has a visible character and BPE never sees
 * whitespace or control bytes. */
static uint32_t byte_to_cp(unsigned b)
{
    if (b <= 32)
        return 256 + b;
    if (b >= 127 && b <= 160)
        return 256 + 33 + (b - 127);
    if (b == 173)
        return 256 + 67;
    return b;
}

/* The inverse: the byte a code point stands for, or -1. */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_to_cp(cp) == cp ? (int)cp : -1;
    if (cp < 256 + 33)
        return (int)(cp - 256);
    if (cp < 256 + 67)
        return (int)(cp - 256 - 33 + 127);
    return cp == 256 + 67 ? 173 : -1;
}

/* Writes the GPT-2 character of byte b (1 or 2 bytes of UTF-8). */
static size_t byte_char(unsigned b, char *out) { return bn_utf8_put(byte_to_cp(b), out); }

/* Parses an SPM byte token "<0xXX>"; -1 when text is not one. */
static int parse_byte_token(const char *s, size_t len)
{
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0'
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Short printable rendering of a token text for error messages. */
static const char *show(const char *s, size_t len, char *buf, size_t size)
{
    size_t n = len < size - 4 ? len : size - 4;
    memcpy(buf, s, n);
    strcpy(buf + n, len > n ? "..." : "");
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)buf[i] < 0x20)
            buf[i] = '?';
    return buf;
}

static bn_status build_texts(bn_tokenizer *t, const bn_tokenizer_spec *spec, bn_error *err)
{
    size_t total = 0;
    for (int32_t i = 0; i < spec->n_vocab; i++) {
        if (!spec->tokens[i].ptr && spec->tokens[i].len)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "token %d has no text", i);
        total += spec->tokens[i].len;
        if (total > UINT32_MAX / 2)
            return bn_error_set(err, BN_ERR_FORMAT, HINT_FILE, "the vocabulary's texts are too large");
    }
    t->text = malloc(total + 1);
    t->text_off = malloc((size_t)(spec->n_vocab + 1) * sizeof *t->text_off);
    t->type = malloc((size_t)spec->n_vocab);
    t->eog = calloc((size_t)spec->n_vocab, 1);
    t->score = calloc((size_t)spec->n_vocab, sizeof *t->score);
    if (!t->text || !t->text_off || !t->type || !t->eog || !t->score)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the vocabulary");
    uint32_t off = 0;
    for (int32_t i = 0; i < spec->n_vocab; i++) {
        t->text_off[i] = off;
        if (spec->tokens[i].len)
            memcpy(t->text + off, spec->tokens[i].ptr, spec->tokens[i].len);
        off += (uint32_t)spec->tokens[i].len;
        int type = spec->types ? spec->types[i] : BN_TOKEN_NORMAL;
        if (type < BN_TOKEN_NORMAL || type > BN_TOKEN_BYTE)
            return bn_error_set(err, BN_ERR_FORMAT, HINT_FILE,
                                "token %d has type %d; token types are 1 to 6", i, type);
        t->type[i] = (uint8_t)type;
        if (spec->scores)
            t->score[i] = spec->scores[i];
    }
    t->text_off[spec->n_vocab] = off;
    return BN_OK;
}

static bn_status build_vocab_index(bn_tokenizer *t, bn_error *err)
{
    uint32_t size = table_size((size_t)t->n_vocab);
    t->vocab_mask = size - 1;
    t->vocab_slots = malloc((size_t)size * sizeof *t->vocab_slots);
    if (!t->vocab_slots)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the vocabulary");
    memset(t->vocab_slots, 0xFF, (size_t)size * sizeof *t->vocab_slots);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *s = bn_tok_text(t, id, &len);
        if (len == 0)
            continue; /* an empty token can never be produced by encoding */
        int32_t other = bn_tok_lookup(t, s, len);
        if (other >= 0) {
            char buf[48];
            return bn_error_set(err, BN_ERR_FORMAT, HINT_FILE,
                                "duplicate token text '%s' (ids %d and %d)",
                                show(s, len, buf, sizeof buf), other, id);
        }
        uint32_t i = (uint32_t)hash_bytes(s, len) & t->vocab_mask;
        while (t->vocab_slots[i] >= 0)
            i = (i + 1) & t->vocab_mask;
        t->vocab_slots[i] = id;
    }
    return BN_OK;
}

/* Looks up one side of merge i; names it in the error when it is unknown. */
static bn_status merge_side(const bn_tokenizer *t, int32_t i, bn_tok_str s, const char *what,
                            int32_t *id, bn_error *err)
{
    *id = s.ptr ? bn_tok_lookup(t, s.ptr, s.len) : -1;
    if (*id >= 0)
        return BN_OK;
    char buf[48];
    return bn_error_set(err, BN_ERR_FORMAT, HINT_FILE,
                        "merge %d refers to an unknown token (%s '%s')", i, what,
                        show(s.ptr ? s.ptr : "", s.ptr ? s.len : 0, buf, sizeof buf));
}

static bn_status build_merges(bn_tokenizer *t, const bn_tokenizer_spec *spec, bn_error *err)
{
    if (spec->n_merges <= 0)
        return BN_OK;
    uint32_t size = table_size((size_t)spec->n_merges);
    t->merge_mask = size - 1;
    t->merges = malloc((size_t)size * sizeof *t->merges);
    char *joined = NULL;
    size_t joined_cap = 0;
    if (!t->merges)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the merges");
    for (uint32_t i = 0; i < size; i++)
        t->merges[i].rank = -1;
    bn_status st = BN_OK;
    for (int32_t r = 0; r < spec->n_merges && st == BN_OK; r++) {
        bn_tok_str l = spec->merge_left[r], rt = spec->merge_right[r];
        int32_t left, right, result;
        if ((st = merge_side(t, r, l, "left", &left, err)) != BN_OK ||
            (st = merge_side(t, r, rt, "right", &right, err)) != BN_OK)
            break;
        char *grown = bn_tok_grow(joined, &joined_cap, l.len + rt.len, 1);
        if (!grown) {
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the merges");
            break;
        }
        joined = grown;
        memcpy(joined, l.ptr, l.len);
        memcpy(joined + l.len, rt.ptr, rt.len);
        bn_tok_str both = {joined, l.len + rt.len};
        if ((st = merge_side(t, r, both, "merged", &result, err)) != BN_OK)
            break;
        /* A pair listed twice keeps its first (highest-priority) rank. */
        uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
        uint32_t i = (uint32_t)hash_u64(key) & t->merge_mask;
        while (t->merges[i].rank >= 0 && t->merges[i].key != key)
            i = (i + 1) & t->merge_mask;
        if (t->merges[i].rank < 0) {
            t->merges[i].key = key;
            t->merges[i].rank = r;
            t->merges[i].result = result;
        }
    }
    free(joined);
    return st;
}

static void build_byte_tokens(bn_tokenizer *t)
{
    for (unsigned b = 0; b < 256; b++) {
        char buf[8];
        size_t n;
        if (t->kind == BN_TOKENIZER_BYTE_BPE) {
            n = byte_char(b, buf);
        } else {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            n = 6;
        }
        t->byte_token[b] = bn_tok_lookup(t, buf, n);
    }
}

/* The bytes a normal byte-level BPE token stands for: each character
 * through the inverse GPT-2 table; a character outside the table (which a
 * well-formed vocabulary never has) is kept as its own UTF-8. */
static size_t decode_byte_level(const char *s, size_t len, char *out)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = bn_utf8_decode((const unsigned char *)s + i, len - i, &cp);
        int b = k ? cp_to_byte(cp) : -1;
        if (b >= 0) {
            out[n++] = (char)b;
        } else {
            k = k ? k : 1;
            memcpy(out + n, s + i, k);
            n += k;
        }
        i += k;
    }
    return n;
}

/* SPM: U+2581 (3 bytes) becomes a space. */
static size_t decode_spm(const char *s, size_t len, char *out)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        if (i + 3 <= len && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
            out[n++] = ' ';
            i += 3;
        } else {
            out[n++] = s[i++];
        }
    }
    return n;
}

static bn_status build_pieces(bn_tokenizer *t, bn_error *err)
{
    /* Decoding never makes a token longer than its text. */
    t->piece = malloc((size_t)t->text_off[t->n_vocab] + 1);
    t->piece_off = malloc((size_t)(t->n_vocab + 1) * sizeof *t->piece_off);
    if (!t->piece || !t->piece_off)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the vocabulary");
    uint32_t off = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len, n = 0;
        const char *s = bn_tok_text(t, id, &len);
        char *out = t->piece + off;
        int type = t->type[id];
        if (bn_tok_is_special_type(type)) {
            memcpy(out, s, len);
            n = len;
        } else if (type == BN_TOKEN_BYTE) {
            int b = parse_byte_token(s, len);
            if (b < 0) {
                char buf[48];
                return bn_error_set(err, BN_ERR_FORMAT, HINT_FILE,
                                    "token %d has type BYTE but its text '%s' is not <0xXX>", id,
                                    show(s, len, buf, sizeof buf));
            }
            out[0] = (char)b;
            n = 1;
        } else if (type == BN_TOKEN_NORMAL) {
            n = t->kind == BN_TOKENIZER_BYTE_BPE ? decode_byte_level(s, len, out)
                                                 : decode_spm(s, len, out);
        } /* UNUSED: nothing */
        t->piece_off[id] = off;
        off += (uint32_t)n;
    }
    t->piece_off[t->n_vocab] = off;
    return BN_OK;
}

/* A special token's sort key: first byte, then longest first. */
typedef struct special_key {
    unsigned char first;
    uint32_t len;
    int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b)
{
    const special_key *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static bn_status build_specials(bn_tokenizer *t, bn_error *err)
{
    int32_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (bn_tok_is_special_type(t->type[id]) && t->text_off[id + 1] > t->text_off[id])
            n++;
    special_key *keys = malloc(((size_t)n + 1) * sizeof *keys);
    t->special = malloc(((size_t)n + 1) * sizeof *t->special);
    if (!keys || !t->special) {
        free(keys);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for special tokens");
    }
    n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t len = t->text_off[id + 1] - t->text_off[id];
        if (bn_tok_is_special_type(t->type[id]) && len > 0)
            keys[n++] = (special_key){(unsigned char)t->text[t->text_off[id]], len, id};
    }
    qsort(keys, (size_t)n, sizeof *keys, cmp_special);
    int32_t k = 0;
    for (int b = 0; b < 256; b++) {
        t->special_first[b] = k;
        while (k < n && keys[k].first == b)
            t->special[k] = keys[k].id, k++;
    }
    t->special_first[256] = n;
    free(keys);
    return BN_OK;
}

static bn_status build_regex(bn_tokenizer *t, const char *pattern, bn_error *err)
{
    int code;
    PCRE2_SIZE where;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &code, &where,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return bn_error_set(err, BN_ERR_FORMAT, HINT_FILE,
                            "the pre-tokenizer regex does not compile at offset %zu: %s",
                            (size_t)where, (const char *)msg);
    }
    /* JIT is an optimisation: without it (or where it fails) the
     * interpreter gives the same matches. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    t->regex = re;
    t->pre_regex = strdup(pattern);
    if (!t->pre_regex)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the regex");
    /* The GGUF name is given only where the pattern is exactly the one the
     * name stands for: any other spelling could split differently. */
    t->pre_name = strcmp(pattern, bn_tok_llama3_regex) == 0 ? "llama-bpe" : NULL;
    return BN_OK;
}

/* Special ids: in range or -1; EOT and EOM fall back to their usual text. */
static bn_status build_special_ids(bn_tokenizer *t, const bn_tokenizer_spec *spec, bn_error *err)
{
    const int32_t ids[5] = {spec->bos, spec->eos, spec->eot, spec->eom, spec->unk};
    static const char *const names[5] = {"BOS", "EOS", "EOT", "EOM", "UNK"};
    for (int i = 0; i < 5; i++)
        if (ids[i] < -1 || ids[i] >= t->n_vocab)
            return bn_error_set(err, BN_ERR_FORMAT, HINT_FILE,
                                "%s token id %d is outside the vocabulary (0..%d)", names[i],
                                ids[i], t->n_vocab - 1);
    t->bos = spec->bos;
    t->eos = spec->eos;
    t->eot = spec->eot >= 0 ? spec->eot : bn_tok_lookup(t, "<|eot_id|>", 10);
    t->eom = spec->eom >= 0 ? spec->eom : bn_tok_lookup(t, "<|eom_id|>", 10);
    t->unk = spec->unk;
    return BN_OK;
}

/* End-of-turn texts that llama.cpp treats as end of generation, the ones
 * that occur in LLaMA-family and similar vocabularies. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|endoftext|>",
    "<|im_end|>", "<|end|>", "<end_of_turn>", "<EOT>",
};

/* As llama.cpp does, a NORMAL token with one of those texts (a file
 * without token types) becomes CONTROL, so it is matched as a special
 * token rather than spelled out. */
static void mark_eog_controls(bn_tokenizer *t)
{
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = bn_tok_lookup(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && t->type[id] == BN_TOKEN_NORMAL)
            t->type[id] = BN_TOKEN_CONTROL;
    }
}

/* End of generation: those texts, plus EOS, EOT and EOM by id. */
static void build_eog(bn_tokenizer *t)
{
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = bn_tok_lookup(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0)
            t->eog[id] = 1;
    }
    const int32_t ids[3] = {t->eos, t->eot, t->eom};
    for (int i = 0; i < 3; i++)
        if (ids[i] >= 0)
            t->eog[ids[i]] = 1;
}

bn_status bn_tokenizer_build(const bn_tokenizer_spec *spec, bn_tokenizer **out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "out must not be NULL");
    *out = NULL;
    if (!spec || (spec->n_vocab > 0 && !spec->tokens))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "no tokenizer spec");
    if (spec->n_vocab <= 0)
        return bn_error_set(err, BN_ERR_FORMAT, HINT_FILE, "the vocabulary is empty");
    if (spec->n_merges > 0 && (!spec->merge_left || !spec->merge_right))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "merges without texts");
    if (spec->kind != BN_TOKENIZER_BYTE_BPE && spec->kind != BN_TOKENIZER_SPM_BPE)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "unknown tokenizer kind %d",
                            (int)spec->kind);
    bn_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the tokenizer");
    t->kind = spec->kind;
    t->n_vocab = spec->n_vocab;
    t->add_bos = spec->add_bos;
    t->add_space_prefix = spec->kind == BN_TOKENIZER_SPM_BPE && spec->add_space_prefix;
    t->ignore_merges = spec->kind == BN_TOKENIZER_BYTE_BPE && spec->ignore_merges;
    bn_status st = build_texts(t, spec, err);
    if (st == BN_OK)
        st = build_vocab_index(t, err);
    if (st == BN_OK && spec->kind == BN_TOKENIZER_BYTE_BPE)
        st = build_merges(t, spec, err);
    if (st == BN_OK)
        st = build_special_ids(t, spec, err);
    if (st == BN_OK) {
        mark_eog_controls(t);
        st = build_pieces(t, err);
    }
    if (st == BN_OK)
        st = build_specials(t, err);
    if (st == BN_OK && spec->kind == BN_TOKENIZER_BYTE_BPE)
        st = build_regex(t, spec->pre_regex ? spec->pre_regex : bn_tok_llama3_regex, err);
    if (st != BN_OK) {
        bn_tokenizer_free(t);
        return st;
    }
    build_byte_tokens(t);
    build_eog(t);
    *out = t;
    return BN_OK;
}

void bn_tokenizer_free(bn_tokenizer *t)
{
    if (!t)
        return;
    free(t->text);
    free(t->text_off);
    free(t->piece);
    free(t->piece_off);
    free(t->type);
    free(t->eog);
    free(t->score);
    free(t->vocab_slots);
    free(t->merges);
    free(t->special);
    pcre2_code_free((pcre2_code *)t->regex);
    free(t->pre_regex);
    free(t);
}

/* ------------------------------------------------------------------------ */
/* Accessors                                                                 */
/* ------------------------------------------------------------------------ */

bn_tokenizer_kind bn_tokenizer_kind_of(const bn_tokenizer *t)
{
    return t ? t->kind : BN_TOKENIZER_BYTE_BPE;
}
int32_t bn_tokenizer_vocab_size(const bn_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t bn_tokenizer_bos(const bn_tokenizer *t) { return t ? t->bos : -1; }
int32_t bn_tokenizer_eos(const bn_tokenizer *t) { return t ? t->eos : -1; }
int32_t bn_tokenizer_eot(const bn_tokenizer *t) { return t ? t->eot : -1; }
bool bn_tokenizer_add_bos_default(const bn_tokenizer *t) { return t && t->add_bos; }
const char *bn_tokenizer_pre_regex(const bn_tokenizer *t) { return t ? t->pre_regex : NULL; }
const char *bn_tokenizer_pre_name(const bn_tokenizer *t) { return t ? t->pre_name : NULL; }
bool bn_tokenizer_ignore_merges(const bn_tokenizer *t) { return t && t->ignore_merges; }

int32_t bn_tokenizer_find(const bn_tokenizer *t, const char *text)
{
    if (!t || !text)
        return -1;
    return bn_tok_lookup(t, text, strlen(text));
}

bool bn_tokenizer_is_eog(const bn_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && t->eog[id];
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                  */
/* ------------------------------------------------------------------------ */

/* The longest special token allowed here that starts at text[i], or -1. */
static int32_t special_at(const bn_tokenizer *t, const char *text, size_t len, size_t i,
                          bool parse_special)
{
    unsigned char c = (unsigned char)text[i];
    for (int32_t k = t->special_first[c]; k < t->special_first[c + 1]; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->type[id] != BN_TOKEN_USER_DEFINED)
            continue;
        size_t n;
        const char *s = bn_tok_text(t, id, &n);
        if (n <= len - i && memcmp(text + i, s, n) == 0)
            return id;
    }
    return -1;
}

typedef struct encode_state {
    const bn_tokenizer *t;
    bn_tok_scratch scratch;
    bn_tok_vec out;
    bool prefix_pending; /* SPM: the next text starts a new "sentence" */
} encode_state;

static bn_status encode_text(encode_state *e, const char *text, size_t len, bn_error *err)
{
    if (e->t->kind == BN_TOKENIZER_BYTE_BPE)
        return len ? bn_bpe_encode(e->t, &e->scratch, text, len, &e->out, err) : BN_OK;
    bool prefix = e->prefix_pending && e->t->add_space_prefix;
    if (!len && !prefix)
        return BN_OK;
    e->prefix_pending = false;
    return bn_spm_encode(e->t, &e->scratch, text, len, prefix, &e->out, err);
}

/* SPM's dummy prefix follows SentencePiece where it can: one U+2581 before
 * the text, and user-defined pieces are part of the text (so "<|tool|>b"
 * gives "▁", "<|tool|>", "b"). A CONTROL token matched with parse_special
 * starts a new text, as llama.cpp treats it, so the text after it gets
 * its own prefix. */
static bn_status encode_special(encode_state *e, int32_t id, bn_error *err)
{
    bn_status st = BN_OK;
    if (e->t->type[id] == BN_TOKEN_USER_DEFINED)
        st = encode_text(e, "", 0, err);
    else
        e->prefix_pending = true;
    if (st == BN_OK && !bn_tok_vec_push(&e->out, id))
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for tokens");
    return st;
}

bn_status bn_tokenize(const bn_tokenizer *t, const char *text, size_t len, bool add_bos,
                      bool parse_special, int32_t **tokens, size_t *n_tokens, bn_error *err)
{
    if (!t || !tokens || !n_tokens || (!text && len))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_tokenize needs a tokenizer, text and output pointers");
    *tokens = NULL;
    *n_tokens = 0;
    encode_state e = {.t = t, .prefix_pending = true};
    bn_status st = BN_OK;
    if (t->regex) {
        e.scratch.match = pcre2_match_data_create_from_pattern((const pcre2_code *)t->regex, NULL);
        e.scratch.match_ctx = pcre2_match_context_create(NULL);
        if (!e.scratch.match || !e.scratch.match_ctx)
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the regex");
        /* One budget for the whole text, however special tokens cut it. */
        e.scratch.regex_budget = bn_bpe_regex_budget(len);
        e.scratch.text_len = len;
    }
    if (st == BN_OK && add_bos && t->bos >= 0 && !bn_tok_vec_push(&e.out, t->bos))
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for tokens");
    size_t start = 0;
    for (size_t i = 0; st == BN_OK && i < len;) {
        int32_t id = special_at(t, text, len, i, parse_special);
        if (id < 0) {
            i++;
            continue;
        }
        if (i > start)
            st = encode_text(&e, text + start, i - start, err);
        if (st == BN_OK)
            st = encode_special(&e, id, err);
        i += t->text_off[id + 1] - t->text_off[id];
        start = i;
    }
    if (st == BN_OK && start < len)
        st = encode_text(&e, text + start, len - start, err);
    pcre2_match_data_free((pcre2_match_data *)e.scratch.match);
    pcre2_match_context_free((pcre2_match_context *)e.scratch.match_ctx);
    free(e.scratch.buf);
    free(e.scratch.sym);
    free(e.scratch.heap);
    if (st != BN_OK) {
        free(e.out.ids);
        return st;
    }
    if (!e.out.ids) /* an empty result still gets a valid allocation */
        e.out.ids = malloc(sizeof(int32_t));
    if (!e.out.ids)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for tokens");
    *tokens = e.out.ids;
    *n_tokens = e.out.n;
    return BN_OK;
}
