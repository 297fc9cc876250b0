/*
 * cuda_decode_form.h - the form of the CUDA backend's decode step: which
 * kernel each of its stages runs. One table (bn_cuda_decode_form_choose)
 * maps what the device offers and the model's shapes allow to the form;
 * the backend asks the device and the kernels at creation
 * (bn_cuda_backend_create) and keeps the form for its life. The default on
 * an H200 and where each fallback comes from: docs/CUDA.md, "The decode
 * step". Plain C without CUDA headers, so tests check the table anywhere.
 */
#ifndef BN_CUDA_DECODE_FORM_H
#define BN_CUDA_DECODE_FORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The LM head is screened through an int8 copy from this size of head up:
 * below it the screen's two kernels cost about what they save. */
#define BN_CUDA_HEAD_SCREEN_MIN ((uint64_t)64 << 20)
/* The decode GEMVs stage their int8 row once per cluster of this many
 * blocks where the device has clusters: ~20 us shorter for the 2B-4T step
 * on an H200 than every block staging it from L2 (~1060 against ~1080 us,
 * alternated runs); clusters of 2 and 4 gained nothing. */
#define BN_CUDA_GEMV_CLUSTER 8
/* The gate|up GEMV in pairs, the step's largest grid, stages per cluster
 * of 16 (half as many clusters asking L2 for the same row) where the
 * device holds such a cluster. */
#define BN_CUDA_GATE_UP_CLUSTER 16

/* What the device and the model's shapes allow the decode step. */
typedef struct bn_cuda_decode_caps {
    bool pdl;               /* programmatic dependent launch: compute capability 9.0
                               and the kernels compiled for it (bn_cb_pdl_supported)  */
    bool gemv_clusters;     /* the W2A8 GEMV stages its row per thread-block cluster
                               here (bn_w2a8_cuda_gemv_cluster_usable)               */
    int attn_cluster;       /* the largest cluster (2 to 16 blocks) at which every
                               column of the fp32 decode attention is resident at
                               once (bn_cb_attn_decode_cluster); 0: no clusters     */
    bool attn_qkv;          /* at that size its clusters hold their share of the
                               q|k|v weights (bn_cb_attn_decode_qkv_prepare)        */
    bool gate_up_pairs;     /* gate and up fill whole tiles of one launch
                               (bn_w2a8_cuda_gemv_pair_fits)                         */
    bool gate_up_cluster16; /* the device holds that GEMV in clusters of 16
                               (bn_w2a8_cuda_gemv_pair_cluster16)                    */
    bool embed_norm;        /* the embedding's rows are ones the first norm reads
                               itself: F32, F16 or BF16 of a width it takes
                               (bn_cb_embed_norm_fits)                               */
    bool kv_f16;            /* the fp16 KV cache: the attention module's kernels    */
    uint64_t head_bytes;    /* the LM head's rows on the device                     */
    bool head_copy_fits;    /* its int8 copy fits the memory plan                   */
    bool mapped_pinned;     /* the device addresses pinned host memory              */
} bn_cuda_decode_caps;

/* The decode step's form. */
typedef struct bn_cuda_decode_form {
    bool pdl;            /* the kernels after the first start while the one before
                            runs, loading what does not depend on it              */
    int attn_cluster;    /* the fp32 attention merges in clusters of this many
                            blocks; 0: in ranges merged by the last block (ticket) */
    bool attn_qkv;       /* the attention computes the q|k|v product itself (no
                            GEMV before it)                                         */
    int gemv_cluster;    /* the decode GEMVs stage their int8 row once per cluster
                            of this many blocks; 0: every block stages its own     */
    bool gate_up_pair;   /* the gate|up GEMV writes relu(gate)^2 * up; else the raw
                            values, squared in the norm kernel after                */
    int gate_up_cluster; /* that GEMV's staging cluster (0: every block)            */
    bool embed_norm;     /* the first norm reads the token's embedding row itself
                            (no embedding kernel)                                   */
    bool head_screen;    /* steps that pick on the device screen the LM head through
                            its int8 copy                                           */
    bool copy_token;     /* the chosen token reaches the host by a copy after the
                            step, not stored by its last kernel into mapped pinned
                            memory                                                  */
} bn_cuda_decode_form;

/* The table: the fastest form the caps allow (the one measured on an H200
 * where everything is offered), each piece falling back by itself. */
void bn_cuda_decode_form_choose(const bn_cuda_decode_caps *caps, bn_cuda_decode_form *form);

/* The form in words, for the startup line: "attention merge cluster 8 with
 * q|k|v, gemv stage cluster 8 (gate|up cluster 16), greedy head screened".
 * kv_f16: the fp16 cache's attention (its own merge kernel). */
void bn_cuda_decode_form_describe(const bn_cuda_decode_form *f, bool kv_f16, char *buf,
                                  size_t size);

/* ---- tests ------------------------------------------------------------------
 *
 * A device or model that offers less than the one at hand, so that one GPU
 * runs, against the CPU, the forms other devices and models take: the caps
 * the backend finds, less these, go through the same table
 * (bn_cuda_backend_create_as). */
typedef struct bn_cuda_as_if {
    bool no_clusters;      /* no thread-block clusters (compute capability 8.x)    */
    bool no_pdl;           /* no programmatic dependent launch (8.x)               */
    bool no_attn_qkv;      /* the q|k|v weights beyond the attention's shared memory */
    bool no_gate_up_pairs; /* gate and up not in whole tiles                        */
    bool no_cluster16;     /* no cluster of 16 gate|up GEMV blocks resident         */
    bool no_mapped_pinned; /* pinned host memory the device does not address        */
    bool screen_any_head;  /* a head large enough to screen, whatever its size      */
} bn_cuda_as_if;

void bn_cuda_decode_caps_limit(bn_cuda_decode_caps *caps, const bn_cuda_as_if *as_if);

#ifdef __cplusplus
}
#endif

#endif
