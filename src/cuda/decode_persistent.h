/*
 * decode_persistent.h - the decode step's layers as one persistent kernel
 * (decode_persistent.cu): every layer of one token, from the embedding row
 * in x to the last layer's down product in out, with the stages of a layer
 * separated by a grid-wide barrier instead of kernel boundaries.
 * docs/CUDA.md, "The persistent decode kernel", has the design and figures.
 */
#ifndef BN_DECODE_PERSISTENT_H
#define BN_DECODE_PERSISTENT_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One layer's products (cuda_layout.h's tile layout, in device memory):
 * q|k|v fused (weight scale 1; the attention scales each part), Wo, gate|up
 * fused with gate's tiles first and up's after (the GEMV pair's layout),
 * Wdown; and the scales. */
typedef struct bn_cb_persist_layer {
    const void *w_qkv, *w_o, *w_gu, *w_down;
    float scale_q, scale_k, scale_v, scale_o, scale_gate, scale_up, scale_down;
} bn_cb_persist_layer;

/* Stages a layer: q|k|v, attention, Wo, gate|up, down. */
#define BN_CB_PERSIST_STAGES 5

typedef struct bn_cb_persist_args {
    int n_layer, dim, ffn;
    bn_cb_attn_shape attn;             /* heads, kv heads, head_dim, cache capacity      */
    int64_t tiles[4], groups[4];       /* q|k|v, o, gate|up, down: tiles of 8 rows and
                                         chunk-groups of 256 inputs a row              */
    const bn_cb_persist_layer *layers; /* n_layer, device memory                */
    const float *norms;                /* layer l's norm `which` at norms + l layer_norms
                                          + norm_off[which] (bn_norm order)             */
    int64_t layer_norms, norm_off[4];
    float eps;
    const float *rope; /* the (cos, sin) table, or NULL (rope_dim 0)     */
    int rope_dim;
    const int32_t *pos;             /* the token's position, device memory            */
    float *k_cache, *v_cache;       /* layer 0's fp32 cache; layers capacity x kv_dim
                                       floats apart                                   */
    int splits;                     /* the ticket attention's ranges a column         */
    float *workspace;               /* bn_cb_attn_decode_workspace_bytes(splits)      */
    unsigned *counters;             /* n_heads, zero (every launch leaves them so)    */
    float *x, *qkv, *att, *h, *out; /* the step's rows (x holds the embedding)    */
    unsigned *barrier;              /* one counter, zeroed before every launch        */
    unsigned long long *trace;      /* NULL, or BN_CB_PERSIST_STAGES n_layer + 1 time
                                       stamps (ns) of block 0 entering each stage     */
} bn_cb_persist_args;

/* Blocks of the persistent kernel for these shapes on the current device
 * (one an SM, all resident at once under a cooperative launch), or 0 where
 * it does not take them (head_dim > 128, rows wider than it stages, a
 * device without cooperative launches). */
int bn_cb_decode_persistent_blocks(const bn_cb_persist_args *a, int sm_count);

/* Launches it over `blocks` (from bn_cb_decode_persistent_blocks), after
 * zeroing the barrier. After it x holds the residual stream before the last
 * layer's down product and out that product (the output norm adds them);
 * the caches hold the token's k and v. */
cudaError_t bn_cb_decode_persistent(const bn_cb_persist_args *a, int blocks, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
