/*
 * tokenizer_internal.h - what the tokenizer's source files share, and the
 * format-neutral constructor that the GGUF and tokenizer.json adapters
 * (and tests) use: a tokenizer is built from plain arrays.
 */
#ifndef BN_TOKENIZER_INTERNAL_H
#define BN_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. */
enum {
    BN_TOKEN_NORMAL = 1,
    BN_TOKEN_UNKNOWN = 2,
    BN_TOKEN_CONTROL = 3,
    BN_TOKEN_USER_DEFINED = 4,
    BN_TOKEN_UNUSED = 5,
    BN_TOKEN_BYTE = 6
};

/* A byte string that is not NUL-terminated. */
typedef struct bn_tok_str {
    const char *ptr;
    size_t len;
} bn_tok_str;

/* Everything a tokenizer is made of. Arrays are copied by the builder. */
typedef struct bn_tokenizer_spec {
    bn_tokenizer_kind kind;
    int32_t n_vocab;
    const bn_tok_str *tokens; /* n_vocab token texts, by id               */
    const int32_t *types;     /* n_vocab BN_TOKEN_* values; NULL = normal */
    const float *scores;      /* n_vocab SPM scores; NULL = all zero      */
    /* Byte-level BPE merges, highest priority first: merge i joins
     * merge_left[i] and merge_right[i] (token texts). */
    int32_t n_merges;
    const bn_tok_str *merge_left;
    const bn_tok_str *merge_right;
    /* Pre-tokenizer regex (byte-level BPE); NULL = LLaMA-3's. */
    const char *pre_regex;
    bool ignore_merges;    /* a whole pre-token found in the vocab wins   */
    bool add_space_prefix; /* SPM: prepend U+2581 to the text             */
    bool add_bos;          /* the model's default for add_bos             */
    /* Special ids, -1 when absent. EOT and EOM, when -1, are looked up by
     * text ("<|eot_id|>", "<|eom_id|>"), as llama.cpp does. */
    int32_t bos, eos, eot, eom, unk;
} bn_tokenizer_spec;

/* LLaMA-3's split regex as its tokenizer.json writes it. */
extern const char bn_tok_llama3_regex[];
/* GPT-2's split regex (ByteLevel with use_regex and no Split). */
extern const char bn_tok_gpt2_regex[];

/* Validates the spec (every id in range, every merge made of known tokens,
 * no duplicate token texts) and builds the tokenizer. */
bn_status bn_tokenizer_build(const bn_tokenizer_spec *spec, bn_tokenizer **out, bn_error *err);

/* Splits a merge written "A B" at its first space after the first byte
 * (a token may itself start with a space). False when there is none. */
bool bn_tok_split_merge(const char *s, size_t len, bn_tok_str *left, bn_tok_str *right);

/* ---- UTF-8 --------------------------------------------------------------- */

/* Length of the UTF-8 sequence that starts with byte c (1 for a stray
 * continuation byte or an invalid lead byte). */
static inline size_t bn_utf8_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

/* Bytes of the character at p (avail bytes left): the lead byte's length
 * when that many continuation bytes really follow, else 1, so a truncated
 * sequence never swallows the bytes after it. */
static inline size_t bn_utf8_char_len(const unsigned char *p, size_t avail)
{
    size_t k = bn_utf8_len(p[0]);
    if (k > avail)
        return 1;
    for (size_t j = 1; j < k; j++)
        if ((p[j] & 0xC0) != 0x80)
            return 1;
    return k;
}

/* Writes code point cp as UTF-8 into out (4 bytes of room); returns the
 * number of bytes. */
static inline size_t bn_utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes one well-formed UTF-8 sequence at s[0..n); returns its length
 * and sets *cp, or 0 when the bytes there are not a complete, valid
 * sequence (overlong forms, surrogates and values above U+10FFFF are
 * invalid). */
size_t bn_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* ---- internals shared by the source files -------------------------------- */

/* One entry of the merge table: the pair (left id, right id) merges into
 * result with priority rank (lower first). An empty slot has rank -1. */
typedef struct bn_tok_merge {
    uint64_t key; /* left << 32 | right */
    int32_t rank;
    int32_t result;
} bn_tok_merge;

struct bn_tokenizer {
    bn_tokenizer_kind kind;
    int32_t n_vocab;

    char *text;         /* every token's text, one after another      */
    uint32_t *text_off; /* n_vocab + 1 offsets into text              */
    char *piece;        /* every token's decoded bytes                */
    uint32_t *piece_off;
    uint8_t *type;      /* BN_TOKEN_* per token                       */
    uint8_t *eog;       /* 1 where generation stops                   */
    float *score;       /* SPM merge scores                           */

    int32_t *vocab_slots; /* open addressing over token texts: id or -1 */
    uint32_t vocab_mask;
    bn_tok_merge *merges; /* open addressing over (left, right) pairs */
    uint32_t merge_mask;

    /* Tokens matched verbatim in the input (CONTROL, USER_DEFINED,
     * UNKNOWN), grouped by first byte and longest first within a group:
     * group b is special[special_first[b] .. special_first[b + 1]). */
    int32_t *special;
    int32_t special_first[257];

    /* Byte-level BPE: the token of each byte's GPT-2 character.
     * SPM: the <0xXX> byte-fallback token. -1 where the vocab has none. */
    int32_t byte_token[256];

    void *regex;          /* pcre2_code (byte-level BPE)                 */
    char *pre_regex;      /* its pattern (byte-level BPE), else NULL     */
    const char *pre_name; /* its GGUF tokenizer.ggml.pre name, or NULL   */

    int32_t bos, eos, eot, eom, unk;
    bool add_bos, add_space_prefix, ignore_merges;
};

static inline const char *bn_tok_text(const bn_tokenizer *t, int32_t id, size_t *len)
{
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->text + t->text_off[id];
}

static inline bool bn_tok_is_special_type(int type)
{
    return type == BN_TOKEN_CONTROL || type == BN_TOKEN_USER_DEFINED || type == BN_TOKEN_UNKNOWN;
}

/* A growable array of token ids. */
typedef struct bn_tok_vec {
    int32_t *ids;
    size_t n, cap;
} bn_tok_vec;

bool bn_tok_vec_push(bn_tok_vec *v, int32_t id);

/* Token id of an exact text, or -1. */
int32_t bn_tok_lookup(const bn_tokenizer *t, const char *s, size_t len);

/* Merge result of the pair (left, right), or NULL. */
const bn_tok_merge *bn_tok_merge_find(const bn_tokenizer *t, int32_t left, int32_t right);

/* One symbol of a word being merged: a token id or a span of text, linked
 * to its neighbours (-1 at the ends). */
typedef struct bn_tok_sym {
    int32_t id;
    int32_t prev, next;
    uint32_t start, len; /* SPM: the symbol's bytes in the word */
} bn_tok_sym;

/* A candidate merge in the BPE and SPM merge queues. The queue pops the
 * lowest key first (BPE: the merge's rank; SPM: minus the merged token's
 * score), then the leftmost position. left/right/result/size let the
 * encoder spot entries made stale by an earlier merge. */
typedef struct bn_tok_candidate {
    float key;
    int32_t pos;
    int32_t left, right;
    int32_t result;
    uint32_t size;
} bn_tok_candidate;

/* Scratch memory one bn_tokenize call reuses from piece to piece. */
typedef struct bn_tok_scratch {
    char *buf; /* mapped text of the current piece */
    size_t buf_cap;
    bn_tok_sym *sym;
    size_t sym_cap;
    bn_tok_candidate *heap; /* the merge queue, a binary min-heap */
    size_t heap_n, heap_cap;
    void *match;     /* pcre2_match_data */
    void *match_ctx; /* pcre2_match_context: the match limit of each try */
    /* PCRE2 match-limit units the regex may still use on this text (see
     * tokenizer_bpe.c), and the text's length for the error message. */
    uint64_t regex_budget;
    size_t text_len;
} bn_tok_scratch;

/* Grows array p (of *cap elements of elem bytes) to hold need elements:
 * returns the array, moved or not, or NULL (p untouched) without memory. */
void *bn_tok_grow(void *p, size_t *cap, size_t need, size_t elem);

/* The merge queue: push (false without memory) and pop (heap_n > 0). */
bool bn_tok_heap_push(bn_tok_scratch *s, bn_tok_candidate m);
bn_tok_candidate bn_tok_heap_pop(bn_tok_scratch *s);

/* The pre-tokenizer regex's work budget for a text of len bytes, in PCRE2
 * match-limit units (see tokenizer_bpe.c). */
uint64_t bn_bpe_regex_budget(size_t len);

/* Encodes one fragment of ordinary text (no special tokens in it). */
bn_status bn_bpe_encode(const bn_tokenizer *t, bn_tok_scratch *s, const char *text, size_t len,
                        bn_tok_vec *out, bn_error *err);
bn_status bn_spm_encode(const bn_tokenizer *t, bn_tok_scratch *s, const char *text, size_t len,
                        bool add_prefix, bn_tok_vec *out, bn_error *err);

#endif
