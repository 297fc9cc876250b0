/*
 * ops_cuda.h - embedding lookup on the GPU and the RoPE frequency table
 * (ops_kernels.cu); the rest of a BitNet block runs in the backend's fused
 * kernels (cuda_backend_kernels.h).
 *
 * All pointers are device pointers unless a comment says otherwise; launches
 * are asynchronous on `stream` and return cudaGetLastError() (cudaSuccess
 * when queued), or cudaErrorInvalidValue for arguments the kernels cannot
 * honour. Strides (ld*) count elements, not bytes.
 *
 * Numerical contract, against the CPU backend (src/cpu/cpu_backend.c):
 * embedding rows are bit-identical (every table type, NaN payloads kept),
 * and the inverse frequencies equal the CPU's bit for bit. The embedding
 * kernel gives the same bits run to run.
 */
#ifndef BN_OPS_CUDA_H
#define BN_OPS_CUDA_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "qtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- RoPE -------------------------------------------------------------------
 *
 * Rotate-half ("NEOX"): in every head, the pairs (j, j + rope_dim/2) for
 * j < rope_dim/2 turn by the angle pos * inv_freq[j]:
 *
 *     x0' = x0 * cos - x1 * sin,    x1' = x1 * cos + x0 * sin
 *
 * Values from rope_dim to head_dim are untouched. The backend's fused kernels
 * apply it (bn_cb_rope_table, bn_cb_qkv_post in cuda_backend_kernels.h). */
#define BN_ROPE_MAX_DIM 512

/* The inverse frequencies, computed once on the host with the CPU backend's
 * formula, inv_freq[j] = 1 / powf(theta, (float)(2j) / (float)rope_dim), so
 * they equal the CPU's bit for bit. The table travels to the kernel by value
 * (kernel parameters), so nothing needs uploading and a graph captures it. */
typedef struct bn_rope_freqs {
    int rope_dim; /* even, 2 .. BN_ROPE_MAX_DIM */
    float inv_freq[BN_ROPE_MAX_DIM / 2];
} bn_rope_freqs;

/* Host function. cudaErrorInvalidValue when rope_dim is odd, < 2 or larger
 * than BN_ROPE_MAX_DIM, or theta is not positive. */
cudaError_t bn_rope_freqs_init(bn_rope_freqs *f, float theta, int rope_dim);

/* ---- embeddings -------------------------------------------------------------
 *
 * Row ids[i] of a [n_rows][dim] table of `type` (F32, F16, BF16, Q8_0, Q4_K
 * or Q6_K, ggml block layouts as in src/quant/fmt_dense.c, and TQ2_0 as in
 * fmt_tq.c; dim a multiple of the block size) dequantized into
 * y[i * ldy ...], bit-identical to the matching bn_dequantize_row_* (same
 * products, in the same order, never fused; a TQ2_0 code 3 reads as +2 d,
 * as on the CPU). ids is a device int32 array, or NULL for rows 0 .. n-1 (that
 * dequantizes a whole table). An id outside [0, n_rows) yields a row of
 * NaN (quiet, 0x7fc00000): visible downstream, never an out-of-bounds read.
 * Other types: cudaErrorInvalidValue. */
bool bn_cuda_embed_supports(bn_qtype type);
cudaError_t bn_cuda_embed_rows(const void *table, bn_qtype type, int64_t n_rows, int64_t dim,
                               const int32_t *ids, int64_t n, float *y, int64_t ldy,
                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
