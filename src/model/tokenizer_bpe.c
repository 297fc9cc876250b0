/*
 * tokenizer_bpe.c - byte-level BPE encoding (GPT-2 / LLaMA-3).
 *
 * 1. Pre-tokenization: the regex splits the text into pieces; text between
 *    matches (none with LLaMA-3's regex, which matches everything) becomes
 *    a piece of its own, as Hugging Face's Split with "Isolated" does.
 * 2. Each piece is read as bytes; byte b starts as the token of GPT-2's
 *    character for b.
 * 3. ignore_merges: a piece whose whole byte-level text is a token is that
 *    token (llama-bpe; Meta's tiktoken encoder behaves the same way).
 * 4. Otherwise adjacent symbols merge, lowest merge rank first and the
 *    leftmost pair among equal ranks, until no adjacent pair has a merge.
 *    A min-heap of candidate pairs keeps this O(n log n) in the piece
 *    length; entries made stale by earlier merges are skipped when popped.
 * The regex comes from the model file, so its work is bounded per text
 * (see match_budgeted): a pattern that backtracks catastrophically is
 * refused as a malformed file instead of running for minutes.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8 /* CMake sets it too */
#endif
#include <pcre2.h>

/* Split regexes, verified against Llama 3's tokenizer.json and llama.cpp's
 * llama-vocab.cpp. llama.cpp spells the contractions as '[sS]|'[tT]|...
 * because its own regex engine lacks (?i:); the two differ only where
 * Unicode case folding makes 's' match U+017F (long s): Hugging Face and
 * tiktoken split "'ſt" as "'ſ" + "t", as this form does under PCRE2. */
const char bn_tok_llama3_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char bn_tok_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Queues the pair (pos, its next symbol) if the two have a merge. */
static bool push_pair(const bn_tokenizer *t, bn_tok_scratch *s, int32_t pos)
{
    if (pos < 0 || s->sym[pos].next < 0)
        return true;
    int32_t l = s->sym[pos].id, r = s->sym[s->sym[pos].next].id;
    const bn_tok_merge *m = bn_tok_merge_find(t, l, r);
    if (!m)
        return true;
    /* Ranks are below 2^24, so the float key holds them exactly. */
    return bn_tok_heap_push(s, (bn_tok_candidate){(float)m->rank, pos, l, r, m->result, 0});
}

/* Runs the merges over the symbols s->sym[0..n). */
static bool merge_symbols(const bn_tokenizer *t, bn_tok_scratch *s, int32_t n)
{
    s->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++)
        if (!push_pair(t, s, i))
            return false;
    while (s->heap_n > 0) {
        bn_tok_candidate p = bn_tok_heap_pop(s);
        bn_tok_sym *a = &s->sym[p.pos];
        if (a->id < 0 || a->next < 0)
            continue;
        bn_tok_sym *b = &s->sym[a->next];
        if (a->id != p.left || b->id != p.right)
            continue; /* one side merged since this pair was queued */
        a->id = p.result;
        b->id = -1;
        a->next = b->next;
        if (b->next >= 0)
            s->sym[b->next].prev = p.pos;
        if (!push_pair(t, s, a->prev) || !push_pair(t, s, p.pos))
            return false;
    }
    return true;
}

static bn_status oom(bn_error *err)
{
    return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory while tokenizing");
}

/* Encodes one pre-token. */
static bn_status encode_piece(const bn_tokenizer *t, bn_tok_scratch *s, const unsigned char *p,
                              size_t len, bn_tok_vec *out, bn_error *err)
{
    if (t->ignore_merges) {
        /* The piece's byte-level text: at most 2 bytes per byte. */
        char *buf = bn_tok_grow(s->buf, &s->buf_cap, 2 * len, 1);
        if (!buf)
            return oom(err);
        s->buf = buf;
        size_t n = 0;
        bool complete = true;
        for (size_t i = 0; i < len && complete; i++) {
            int32_t id = t->byte_token[p[i]];
            size_t k = 0;
            const char *c = id >= 0 ? bn_tok_text(t, id, &k) : NULL;
            complete = c != NULL; /* a byte without a token: merges decide */
            if (complete) {
                memcpy(s->buf + n, c, k);
                n += k;
            }
        }
        int32_t whole = complete ? bn_tok_lookup(t, s->buf, n) : -1;
        if (whole >= 0) {
            bool ok = bn_tok_vec_push(out, whole);
            return ok ? BN_OK : oom(err);
        }
    }
    bn_tok_sym *sym = bn_tok_grow(s->sym, &s->sym_cap, len, sizeof *sym);
    if (!sym)
        return oom(err);
    s->sym = sym;
    int32_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_token[p[i]];
        if (id < 0)
            continue; /* like Hugging Face without an unknown token: dropped */
        s->sym[n] = (bn_tok_sym){id, n - 1, n + 1, 0, 0};
        n++;
    }
    if (n == 0)
        return BN_OK;
    s->sym[n - 1].next = -1;
    if (n > 1 && !merge_symbols(t, s, n))
        return oom(err);
    for (int32_t i = 0; i >= 0; i = s->sym[i].next)
        if (!bn_tok_vec_push(out, s->sym[i].id))
            return oom(err);
    return BN_OK;
}

/* The regex's work budget. PCRE2's match limit bounds one pcre2_match
 * call, and a text takes a call per piece, so a pattern that backtracks
 * catastrophically at every position costs the limit times the text's
 * length: with the default limit, a minute for 1000 bytes in the
 * interpreter. Instead each call starts with a small limit and is retried
 * with REGEX_GROWTH times more while it runs out, every try charged its
 * whole limit to the text's budget, REGEX_BUDGET_BASE + REGEX_BUDGET_PER_BYTE
 * units a byte; a call that needs more than is left fails, and so does
 * the text. The work is then at most the budget, linear in the text.
 * Measured with PCRE2 10.42: LLaMA-3's and GPT-2's regexes need at most
 * ~50 units for a piece of ordinary text (interpreter; the JIT counts
 * fewer) and ~3 a byte over the KJV text and the fixtures' corpus; a run
 * of n spaces, one try of about n. So they are charged REGEX_FIRST_LIMIT
 * a piece, at most a quarter of the budget even with a piece per byte,
 * and a long piece at most ~5 units a byte. The heap limit bounds the
 * interpreter's backtracking memory (the JIT's stack has its own). */
#define REGEX_FIRST_LIMIT 256u
#define REGEX_GROWTH 4u
#define REGEX_BUDGET_BASE (1u << 16)
#define REGEX_BUDGET_PER_BYTE 1024u
#define REGEX_HEAP_LIMIT_KIB (64u << 10)

uint64_t bn_bpe_regex_budget(size_t len)
{
    if ((uint64_t)len > (UINT64_MAX - REGEX_BUDGET_BASE) / REGEX_BUDGET_PER_BYTE)
        return UINT64_MAX;
    return REGEX_BUDGET_BASE + (uint64_t)len * REGEX_BUDGET_PER_BYTE;
}

/* One pcre2_match from at within what is left of the budget (above). */
static int match_budgeted(const pcre2_code *re, bn_tok_scratch *s, const unsigned char *u,
                          size_t len, size_t at, uint32_t *opts)
{
    pcre2_match_context *mc = s->match_ctx;
    pcre2_set_heap_limit(mc, REGEX_HEAP_LIMIT_KIB);
    uint64_t limit = REGEX_FIRST_LIMIT;
    for (;;) {
        const uint64_t try_limit = limit < s->regex_budget ? limit : s->regex_budget;
        if (try_limit == 0)
            return PCRE2_ERROR_MATCHLIMIT;
        pcre2_set_match_limit(mc, (uint32_t)try_limit);
        int rc = pcre2_match(re, u, len, at, *opts, s->match, mc);
        s->regex_budget -= try_limit;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !(*opts & PCRE2_NO_JIT)) {
            *opts |= PCRE2_NO_JIT; /* the interpreter has no such limit */
            continue;
        }
        /* Out of budget, or of what one call may be given. */
        if (rc != PCRE2_ERROR_MATCHLIMIT || try_limit < limit || limit == UINT32_MAX)
            return rc;
        limit = limit > UINT32_MAX / REGEX_GROWTH ? UINT32_MAX : limit * REGEX_GROWTH;
    }
}

bn_status bn_bpe_encode(const bn_tokenizer *t, bn_tok_scratch *s, const char *text, size_t len,
                        bn_tok_vec *out, bn_error *err)
{
    const pcre2_code *re = t->regex;
    pcre2_match_data *md = s->match;
    const unsigned char *u = (const unsigned char *)text;
    size_t done = 0, at = 0; /* emitted up to done; search from at */
    uint32_t opts = 0;
    bn_status st = BN_OK;
    while (at < len && st == BN_OK) {
        int rc = match_budgeted(re, s, u, len, at, &opts);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
            rc == PCRE2_ERROR_DEPTHLIMIT)
            return bn_error_set(err, BN_ERR_FORMAT,
                                "the tokenizer's pre-tokenizer pattern (a Split regex in "
                                "tokenizer.json) backtracks catastrophically; use a known one "
                                "such as LLaMA-3's",
                                "the pre-tokenizer regex \"%.80s\" is too costly: splitting "
                                "%zu bytes of text needs more than its budget of %llu PCRE2 "
                                "match steps",
                                t->pre_regex ? t->pre_regex : "?", s->text_len,
                                (unsigned long long)bn_bpe_regex_budget(s->text_len));
        if (rc == PCRE2_ERROR_NOMEMORY)
            return oom(err);
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return bn_error_set(err, BN_ERR_INTERNAL, NULL, "pre-tokenizer regex failed: %s",
                                (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (b == a) { /* an empty match: move on by one character */
            at = a + bn_utf8_len(u[a]);
            continue;
        }
        if (a > done)
            st = encode_piece(t, s, u + done, a - done, out, err);
        if (st == BN_OK)
            st = encode_piece(t, s, u + a, b - a, out, err);
        done = at = b;
    }
    if (st == BN_OK && done < len)
        st = encode_piece(t, s, u + done, len - done, out, err);
    return st;
}
