/*
 * engine_stream.c - a generation's text: tokens decoded into whole UTF-8
 * characters, handed to the caller as they complete and kept (the
 * contract is in engine_internal.h).
 */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

bool engine_text_append(engine_text *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return false;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

bn_status engine_stream_token(engine_streamer *s, int32_t id, bool flush, bn_error *err)
{
    for (;;) {
        size_t need = flush ? bn_detok_stream_flush(&s->ds, s->buf, s->cap)
                            : bn_detok_stream_push(&s->ds, id, s->buf, s->cap);
        if (need < s->cap) {
            if (need > 0 && !engine_text_append(s->text, s->buf, need))
                return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                                    "no memory for the generated text");
            if (s->on_token && (!flush || need > 0) &&
                !s->on_token(s->ctx, flush ? -1 : id, s->buf, need))
                s->stop = true;
            return BN_OK;
        }
        /* Nothing was consumed: retry with room for the whole piece. */
        char *p = realloc(s->buf, need + 1);
        if (!p)
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to decode a token");
        s->buf = p;
        s->cap = need + 1;
    }
}
