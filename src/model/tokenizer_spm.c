/*
 * tokenizer_spm.c - SentencePiece-style BPE encoding ("llama" in GGUF).
 *
 * As SentencePiece's BPE model and llama.cpp's llm_tokenizer_spm do:
 * spaces become U+2581 ("▁"), with one more in front of the text when the
 * model adds a dummy prefix; the text starts as one symbol per UTF-8
 * character; repeatedly, the adjacent pair whose concatenation is a token
 * with the highest score merges (the leftmost pair among equal scores);
 * each final symbol is its token, or, when it is not in the vocabulary,
 * its bytes as <0xXX> byte-fallback tokens (the unknown token where the
 * vocabulary has no byte tokens).
 *
 * Merges only form NORMAL and USER_DEFINED tokens. SentencePiece can also
 * pass through UNUSED pieces and split them again at the end; vocabularies
 * with UNUSED pieces are rare, and such a piece is simply never formed
 * here.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* A token that merging may produce. */
static int32_t mergeable(const bn_tokenizer *t, const char *s, size_t len)
{
    int32_t id = bn_tok_lookup(t, s, len);
    if (id >= 0 && t->type[id] != BN_TOKEN_NORMAL && t->type[id] != BN_TOKEN_USER_DEFINED)
        return -1;
    return id;
}

/* Queues symbols (left, right) if their concatenation is a token. */
static bool try_bigram(const bn_tokenizer *t, bn_tok_scratch *s, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return true;
    const bn_tok_sym *a = &s->sym[left], *b = &s->sym[right];
    int32_t id = mergeable(t, s->buf + a->start, a->len + b->len);
    if (id < 0)
        return true;
    /* Highest score first: the queue pops the lowest key. */
    return bn_tok_heap_push(s, (bn_tok_candidate){-t->score[id], left, left, right, id,
                                               a->len + b->len});
}

static bool merge_all(const bn_tokenizer *t, bn_tok_scratch *s, int32_t n)
{
    s->heap_n = 0;
    for (int32_t i = 1; i < n; i++)
        if (!try_bigram(t, s, i - 1, i))
            return false;
    while (s->heap_n > 0) {
        bn_tok_candidate g = bn_tok_heap_pop(s);
        bn_tok_sym *a = &s->sym[g.left], *b = &s->sym[g.right];
        if (a->len == 0 || b->len == 0 || a->next != g.right || a->len + b->len != g.size)
            continue; /* stale: one side has merged since */
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0)
            s->sym[b->next].prev = g.left;
        if (!try_bigram(t, s, a->prev, g.left) || !try_bigram(t, s, g.left, a->next))
            return false;
    }
    return true;
}

/* Emits a final symbol: its token, else byte fallback, else unknown. */
static bool emit_symbol(const bn_tokenizer *t, const char *p, size_t len, bn_tok_vec *out)
{
    int32_t id = mergeable(t, p, len);
    if (id >= 0)
        return bn_tok_vec_push(out, id);
    bool bytes = true;
    for (size_t i = 0; i < len; i++)
        bytes = bytes && t->byte_token[(unsigned char)p[i]] >= 0;
    if (!bytes)
        return t->unk < 0 || bn_tok_vec_push(out, t->unk);
    for (size_t i = 0; i < len; i++)
        if (!bn_tok_vec_push(out, t->byte_token[(unsigned char)p[i]]))
            return false;
    return true;
}

bn_status bn_spm_encode(const bn_tokenizer *t, bn_tok_scratch *s, const char *text, size_t len,
                        bool add_prefix, bn_tok_vec *out, bn_error *err)
{
    static const char space[] = "\xE2\x96\x81"; /* U+2581 */
    size_t cap = 3 * (len + 1);
    char *buf = bn_tok_grow(s->buf, &s->buf_cap, cap, 1);
    if (buf)
        s->buf = buf;
    bn_tok_sym *sym = buf ? bn_tok_grow(s->sym, &s->sym_cap, cap, sizeof *sym) : NULL;
    if (!sym)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory while tokenizing");
    s->sym = sym;
    size_t n = 0;
    if (add_prefix) {
        memcpy(s->buf, space, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + n, space, 3);
            n += 3;
        } else {
            s->buf[n++] = text[i];
        }
    }
    int32_t count = 0;
    for (size_t i = 0; i < n; count++) {
        size_t k = bn_utf8_char_len((const unsigned char *)s->buf + i, n - i);
        s->sym[count] = (bn_tok_sym){-1, count - 1, count + 1, (uint32_t)i, (uint32_t)k};
        i += k;
    }
    if (count == 0)
        return BN_OK;
    s->sym[count - 1].next = -1;
    bool ok = merge_all(t, s, count);
    for (int32_t i = 0; ok && i >= 0; i = s->sym[i].next)
        ok = emit_symbol(t, s->buf + s->sym[i].start, s->sym[i].len, out);
    return ok ? BN_OK : bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory while tokenizing");
}
