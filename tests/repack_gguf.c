/*
 * repack_gguf.c - test helper: a GGUF model rewritten with its projections
 * in another encoding (repack_gguf.h).
 */
#include "repack_gguf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model.h"

const test_encoding test_encodings[] = {
    {BN_QTYPE_TQ2_0, ".scale", false, "TQ2_0 + upstream .scale tensors"},
    {BN_QTYPE_F16, NULL, true, "F16 values + output + rope_freqs"},
    {BN_QTYPE_F32, NULL, false, "F32 code * scale values"},
    {BN_QTYPE_TL1, "_scale", false, "TL1 + <name>_scale tensors"},
    {BN_QTYPE_TL2, "_scale", false, "TL2 + <name>_scale tensors"},
};
const int test_encoding_count = (int)(sizeof test_encodings / sizeof test_encodings[0]);

/* Rewrites the GGUF model src (tests/data/models/i2s.gguf) to dst with
 * every projection in `type`. scale_suffix NULL: the format carries the
 * scale (F16/F32 hold code * scale). Otherwise the format gets scale 1 and
 * a separate F32 tensor "<blk.N.name><suffix>" holds it: ".scale" as upstream llama.cpp writes, "_scale" after ".weight"
 * as bitnet.cpp's TL1/TL2 converter writes. Returns false when the format
 * cannot hold these shapes (reported, not a failure). extras: also a
 * separate output.weight (a copy of token_embd) and a rope_freqs.weight,
 * which must be ignored. */
bool test_write_repacked_gguf(const char *src, const char *dst, bn_qtype type,
                              const char *scale_suffix, bool extras)
{
    bn_gguf *g = NULL;
    bn_checkpoint *m = NULL;
    bn_gguf_writer *w = NULL;
    bn_error err;
    bool ok = bn_gguf_open(src, &g, &err) == BN_OK &&
              bn_checkpoint_load_gguf(src, &m, &err) == BN_OK &&
              bn_gguf_writer_create(&w, &err) == BN_OK;
    void *blobs[64] = {0};
    float scales[64];
    int n_blobs = 0;
    for (uint64_t i = 0; ok && i < bn_gguf_kv_count(g); i++) {
        const bn_gguf_kv *kv = bn_gguf_kv_at(g, i);
        char key[128], str[128];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (!strncmp(key, "tokenizer.", 10))
            continue;
        if (kv->type == BN_GGUF_STRING) {
            snprintf(str, sizeof str, "%.*s", (int)kv->v.str.len, kv->v.str.ptr);
            ok = bn_gguf_writer_set_str(w, key, str, &err) == BN_OK;
        } else if (kv->type == BN_GGUF_UINT32) {
            ok = bn_gguf_writer_set_u32(w, key, (uint32_t)kv->v.u64, &err) == BN_OK;
        } else if (kv->type == BN_GGUF_FLOAT32) {
            ok = bn_gguf_writer_set_f32(w, key, (float)kv->v.f64, &err) == BN_OK;
        }
    }
    for (uint64_t i = 0; ok && i < bn_gguf_tensor_count(g); i++) {
        const bn_gguf_tensor *t = bn_gguf_tensor_at(g, i);
        int layer = -1, p = -1;
        static const char *const names[BN_PROJ_COUNT] = {"attn_q", "attn_k", "attn_v",
                                                         "attn_output", "ffn_gate", "ffn_up",
                                                         "ffn_down"};
        char which[32];
        if (sscanf(t->name, "blk.%d.%31[a-z_].weight", &layer, which) == 2)
            for (int j = 0; j < BN_PROJ_COUNT; j++)
                if (!strcmp(which, names[j]))
                    p = j;
        if (p < 0) {
            ok = bn_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
                                           t->bytes, &err) == BN_OK;
            if (ok && extras && !strcmp(t->name, "token_embd.weight")) {
                static float freqs[64];
                for (int j = 0; j < 64; j++)
                    freqs[j] = 1.0f + (float)j; /* nonsense: must not be used */
                const int64_t half[1] = {32};
                ok = bn_gguf_writer_add_tensor(w, "output.weight", t->type, t->n_dims, t->ne,
                                               t->data, t->bytes, &err) == BN_OK &&
                     bn_gguf_writer_add_tensor(w, "rope_freqs.weight", BN_QTYPE_F32, 1, half,
                                               freqs, sizeof(float) * 32, &err) == BN_OK;
            }
            continue;
        }
        const int64_t n = t->ne[1], k = t->ne[0];
        int8_t *codes = malloc((size_t)(n * k));
        float scale = 0.0f;
        size_t bytes = 0;
        ok = bn_checkpoint_projection_codes(m, layer, (bn_proj)p, codes, &scale, &err) == BN_OK;
        bn_status st = ok ? bn_qtype_tensor_size(type, n, k, &bytes, &err) : BN_ERR_INTERNAL;
        if (st != BN_OK) {
            if (ok)
                printf("  %s cannot hold %s: %s\n", bn_qtype_get(type)->name, t->name,
                       err.message);
            free(codes);
            ok = false;
            break;
        }
        void *blob = blobs[n_blobs] = malloc(bytes);
        const bn_qtype_info *q = bn_qtype_get(type);
        if (q->ternary) {
            ok = q->pack(codes, scale_suffix ? 1.0f : scale, n, k, blob, &err) == BN_OK;
        } else {
            float *row = malloc((size_t)k * sizeof(float));
            for (int64_t r = 0; r < n; r++) {
                for (int64_t c = 0; c < k; c++)
                    row[c] = (float)codes[r * k + c] * scale;
                q->quantize_row(row, (uint8_t *)blob + (size_t)r * (bytes / (size_t)n), k);
            }
            free(row);
        }
        free(codes);
        ok = ok && bn_gguf_writer_add_tensor(w, t->name, (uint32_t)type, 2, t->ne, blob, bytes,
                                             &err) == BN_OK;
        if (ok && scale_suffix) {
            char name[96];
            if (!strcmp(scale_suffix, "_scale"))
                snprintf(name, sizeof name, "%s_scale", t->name);
            else
                snprintf(name, sizeof name, "blk.%d.%s%s", layer, names[p], scale_suffix);
            scales[n_blobs] = scale;
            const int64_t one[1] = {1};
            ok = bn_gguf_writer_add_tensor(w, name, BN_QTYPE_F32, 1, one, &scales[n_blobs],
                                           sizeof(float), &err) == BN_OK;
        }
        n_blobs++;
    }
    if (ok)
        ok = bn_gguf_writer_finish(w, dst, NULL, NULL, &err) == BN_OK;
    for (int i = 0; i < n_blobs; i++)
        free(blobs[i]);
    bn_gguf_writer_free(w);
    bn_checkpoint_free(m);
    bn_gguf_close(g);
    return ok;
}
