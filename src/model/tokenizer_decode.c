/*
 * tokenizer_decode.c - token ids back to text: single tokens, whole
 * sequences, the streaming decoder that only ever hands out complete UTF-8
 * characters, and the BitNet b1.58 2B-4T chat prompt.
 *
 * Every token's bytes are computed once when the tokenizer is built (see
 * build_pieces in tokenizer.c), so decoding is copying.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Decoding                                                                  */
/* ------------------------------------------------------------------------ */

int bn_token_to_bytes(const bn_tokenizer *t, int32_t id, char *buf, size_t size)
{
    if (!t || id < 0 || id >= t->n_vocab)
        return -1;
    size_t n = t->piece_off[id + 1] - t->piece_off[id];
    if (buf)
        memcpy(buf, t->piece + t->piece_off[id], n < size ? n : size);
    return (int)n;
}

void bn_detok_stream_init(bn_detok_stream *s, const bn_tokenizer *t)
{
    if (!s)
        return;
    memset(s, 0, sizeof *s);
    s->tok = t;
}

static const char REPLACEMENT[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* Appends n bytes to out when there is room; always counts them. */
static void emit(char *out, size_t cap, size_t *used, const char *s, size_t n)
{
    if (out && *used + n <= cap)
        memcpy(out + *used, s, n);
    *used += n;
}

/* Turns pending + piece into complete UTF-8: whole sequences are copied,
 * bytes that cannot start or continue one become U+FFFD, and an unfinished
 * sequence at the end is left in *pend for the next token. */
static size_t utf8_assemble(const char *pending, int n_pending, const char *piece, size_t n,
                            char *out, size_t cap, char *pend, int *n_pend)
{
    size_t used = 0, i = 0;
    *n_pend = 0;
    if (n_pending > 0) {
        /* Complete the pending sequence with the piece's continuation bytes. */
        unsigned char seq[4];
        size_t have = (size_t)n_pending, need = bn_utf8_len((unsigned char)pending[0]);
        memcpy(seq, pending, have);
        while (have < need && i < n && ((unsigned char)piece[i] & 0xC0) == 0x80)
            seq[have++] = (unsigned char)piece[i++];
        uint32_t cp;
        if (have < need && i == n) {
            memcpy(pend, seq, have);
            *n_pend = (int)have;
            return 0;
        }
        if (have == need && bn_utf8_decode(seq, have, &cp) == have)
            emit(out, cap, &used, (const char *)seq, have);
        else
            emit(out, cap, &used, REPLACEMENT, 3);
    }
    while (i < n) {
        const unsigned char *p = (const unsigned char *)piece + i;
        size_t need = bn_utf8_len(p[0]);
        uint32_t cp;
        size_t k = bn_utf8_decode(p, n - i, &cp);
        if (k) {
            emit(out, cap, &used, (const char *)p, k);
            i += k;
            continue;
        }
        /* An unfinished sequence at the very end waits for more bytes. */
        bool tail = need > 1 && i + need > n;
        for (size_t j = 1; tail && i + j < n; j++)
            tail = (p[j] & 0xC0) == 0x80;
        if (tail) {
            memcpy(pend, p, n - i);
            *n_pend = (int)(n - i);
            break;
        }
        emit(out, cap, &used, REPLACEMENT, 3);
        i++;
    }
    return used;
}

size_t bn_detok_stream_push(bn_detok_stream *s, int32_t id, char *out, size_t size)
{
    if (!s || !s->tok || !out || size == 0)
        return 0;
    out[0] = '\0';
    const bn_tokenizer *t = s->tok;
    if (id < 0 || id >= t->n_vocab)
        return 0;
    const char *piece = t->piece + t->piece_off[id];
    size_t n = t->piece_off[id + 1] - t->piece_off[id];
    char pend[8];
    int n_pend;
    /* Measure first, so a too-small buffer consumes nothing. */
    size_t need = utf8_assemble(s->pending, s->n_pending, piece, n, NULL, 0, pend, &n_pend);
    if (need >= size)
        return need;
    utf8_assemble(s->pending, s->n_pending, piece, n, out, size - 1, pend, &n_pend);
    out[need] = '\0';
    memcpy(s->pending, pend, (size_t)n_pend);
    s->n_pending = n_pend;
    return need;
}

size_t bn_detok_stream_flush(bn_detok_stream *s, char *out, size_t size)
{
    if (!s || !out || size == 0)
        return 0;
    out[0] = '\0';
    if (s->n_pending == 0)
        return 0;
    if (size <= 3)
        return 3;
    memcpy(out, REPLACEMENT, 4);
    s->n_pending = 0;
    return 3;
}

bn_status bn_detokenize(const bn_tokenizer *t, const int32_t *ids, size_t n, char **text,
                        bn_error *err)
{
    if (!t || !text || (!ids && n))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_detokenize needs a tokenizer, ids and an output pointer");
    *text = NULL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "token %zu has id %d, outside the vocabulary (0..%d)", i, ids[i],
                                t->n_vocab - 1);
        total += t->piece_off[ids[i] + 1] - t->piece_off[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the text");
    /* SPM: the encoder put one U+2581 before each text that follows the
     * start or a CONTROL token; the space it decodes to is removed. */
    bool strip = t->add_space_prefix;
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        const char *p = t->piece + t->piece_off[id];
        size_t k = t->piece_off[id + 1] - t->piece_off[id];
        if (t->type[id] == BN_TOKEN_CONTROL || t->type[id] == BN_TOKEN_UNKNOWN) {
            strip = t->add_space_prefix;
        } else if (strip && k > 0) {
            if (p[0] == ' ' && t->type[id] != BN_TOKEN_USER_DEFINED) {
                p++;
                k--;
            }
            strip = false;
        }
        memcpy(s + used, p, k);
        used += k;
    }
    s[used] = '\0';
    *text = s;
    return BN_OK;
}

/* ------------------------------------------------------------------------ */
/* Chat prompt                                                               */
/* ------------------------------------------------------------------------ */

/* Length of the whitespace character at s (Python's str.isspace set, which
 * the Hugging Face template's `trim` uses), or 0. */
static size_t space_len(const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F))
        return 1;
    uint32_t cp;
    size_t k = bn_utf8_decode((const unsigned char *)s, n, &cp);
    if (!k)
        return 0;
    bool space = cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
                 cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
    return space ? k : 0;
}

static bn_tok_str trim(const char *s)
{
    if (!s)
        return (bn_tok_str){"", 0};
    size_t n = strlen(s), a = 0, k;
    while (a < n && (k = space_len(s + a, n - a)) > 0)
        a += k;
    size_t b = n;
    while (b > a) {
        /* Step back to the start of the last character. */
        size_t c = b - 1;
        while (c > a && ((unsigned char)s[c] & 0xC0) == 0x80)
            c--;
        if (space_len(s + c, b - c) != b - c)
            break;
        b = c;
    }
    return (bn_tok_str){s + a, b - a};
}

const char *bn_chat_trim(const char *text, size_t *len)
{
    const bn_tok_str t = trim(text);
    *len = t.len;
    return t.ptr;
}

