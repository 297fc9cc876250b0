/* attn_ref.h - what the Vulkan attention labs share (after lab.h): the
 * CPU's attention for their checks, one decode row at position n_pos - 1
 * of a flat cache of [positions][n_kv][hd] floats, attention_slot's
 * arithmetic (cpu_backend.c) with exp in double rounded to float, as the
 * kernels compute it (build with -ffp-contract=off, as the Makefile does);
 * the shipped attentions' dispatches and a lab shader's over the same
 * seven buffers. */
#ifndef BN_VK_ATTN_REF_H
#define BN_VK_ATTN_REF_H

#include <math.h>
#include <stdlib.h>

#include "vk_ops.h"

/* dot_f32 of the CPU backend: element i in lane i % 8, each lane in order,
 * the lanes added ((0+1)+(2+3))+((4+5)+(6+7)). */
static float dot_f32(const float *a, const float *b, int n)
{
    float acc[8] = {0};
    for (int i = 0; i < n; i++)
        acc[i % 8] = acc[i % 8] + a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* out[n_head][hd] for q[n_head][hd]. */
static void cpu_attention(const float *q, const float *kc, const float *vc, int n_pos, int n_head,
                          int n_kv, int hd, float *out)
{
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *e = malloc((size_t)n_pos * sizeof *e);
    for (int h = 0; h < n_head; h++) {
        const int kv = h / (n_head / n_kv);
        float max = -INFINITY, sum = 0.0f;
        for (int t = 0; t < n_pos; t++) {
            e[t] = dot_f32(q + h * hd, kc + ((size_t)t * n_kv + kv) * hd, hd) * scale;
            max = e[t] > max ? e[t] : max;
        }
        for (int t = 0; t < n_pos; t++) {
            e[t] = (float)exp((double)(e[t] - max));
            sum = sum + e[t];
        }
        const float inv = 1.0f / sum;
        for (int i = 0; i < hd; i++) {
            float o = 0.0f;
            for (int t = 0; t < n_pos; t++)
                o = o + (e[t] * inv) * vc[((size_t)t * n_kv + kv) * hd + i];
            out[h * hd + i] = o;
        }
    }
    free(e);
}

/* A shipped attention over rows: `work` its scratch (the exact one, of
 * `extent` floats a (row, head)) or partials (the split one, over `extent`
 * positions). */
typedef struct {
    bn_vk_ops *ops;
    bn_vk_attn_shape shape;
    bn_vk_rows rows;
    bn_vk_buffer *q, *kc, *vc, *work, *att;
    int64_t extent;
} shipped_attn;

static inline void record_shipped_exact(bn_vk *vk, void *ctx)
{
    shipped_attn *c = ctx;
    OK(bn_vk_attention_record(vk, c->ops, &c->shape, &c->rows, c->q, c->kc, c->vc, 0, c->work,
                              c->extent, c->att, &err),
       "attention");
}

static inline void record_shipped_split(bn_vk *vk, void *ctx)
{
    shipped_attn *c = ctx;
    OK(bn_vk_attention_split_record(vk, c->ops, &c->shape, &c->rows, c->q, c->kc, c->vc, 0, c->work,
                                    c->extent, c->att, &err),
       "split attention");
}

/* The attention shaders' push constants (vk_ops.c: attn_params; extent:
 * the exact ones' scratch stride, the split one's blocks). */
typedef struct {
    uint32_t rows, n_head, head_dim, group, kv_dim, block_size, max_blocks, n_seq, cache_rows,
        layer_off, extent;
    float scale;
} attn_push;

/* Those of `rows` rows of one sequence over a flat cache of `cache`
 * positions (one block, at layer offset 0). */
static inline attn_push flat_attn_push(uint32_t rows, int n_head, int n_kv, int hd, uint32_t cache,
                                uint32_t extent)
{
    return (attn_push){rows,  (uint32_t)n_head, (uint32_t)hd, (uint32_t)(n_head / n_kv),
                       (uint32_t)(n_kv * hd), cache, 1, 1, cache, 0, extent,
                       (float)(1.0 / sqrt((double)hd))};
}

/* A lab shader's dispatch of `groups` workgroups: the rows' info, the
 * tables, q, the caches, its scratch or partials, att. */
typedef struct {
    bn_vk_kernel *k;
    bn_vk_buffer *bufs[7];
    attn_push push;
    uint32_t groups;
} attn_case;

static inline void record_attn_case(bn_vk *vk, void *ctx)
{
    attn_case *c = ctx;
    OK(bn_vk_dispatch(vk, c->k, c->bufs, &c->push, c->groups, 1, &err), "dispatch");
}

#endif
