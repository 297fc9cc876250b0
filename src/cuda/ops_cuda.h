/*
 * ops_cuda.h - C launchers for the fp32 building blocks of a BitNet block on
 * the GPU (ops_kernels.cu): RMSNorm (plain and fused with the int8
 * activation quantizer), rotate-half RoPE, the squared-ReLU gate, residual
 * add, fp32 -> fp16/bf16 row stores for the KV cache, and embedding lookup.
 *
 * All pointers are device pointers unless a comment says otherwise; launches
 * are asynchronous on `stream` and return cudaGetLastError() (cudaSuccess
 * when queued), or cudaErrorInvalidValue for arguments the kernels cannot
 * honour. m == 0 (no rows) launches nothing and succeeds. Strides (ld*)
 * count elements, not bytes.
 *
 * Numerical contract, against the CPU backend (src/cpu/cpu_backend.c):
 *
 *   bit-identical   squared-ReLU gate, residual add, fp16/bf16 stores,
 *                   embedding rows (every table type, NaN payloads kept),
 *                   and the int8 rows, scales and sums of the fused
 *                   kernels given the normed floats they computed;
 *   last bits       RMSNorm: the sum of squares is accumulated in fp32 in a
 *                   fixed order (the CPU uses double), so the normed values
 *                   carry a relative error of a few 1e-7 (tests allow 1e-5);
 *                   RoPE: cos/sin come from CUDA's sincosf (at most 2 ulp
 *                   from the true value; glibc's is within 1 ulp), so a
 *                   rotated value may differ by a few ulp of the larger of
 *                   the pair (at most ~5e-7 of |x0| + |x1|; tests allow
 *                   2e-6).
 *
 * Determinism: every kernel gives the same bits run to run. The norm
 * kernels reduce with a fixed block size whatever the number of rows, so a
 * row's normed values (and hence its int8 row) do not depend on the batch it
 * is part of, and the plain and fused kernels agree bit for bit on them.
 */
#ifndef BN_OPS_CUDA_H
#define BN_OPS_CUDA_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "qtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- RMSNorm ---------------------------------------------------------------
 *
 *   y[i] = w[i] * (x[i] * (1 / sqrt(sum(x^2) / k + eps)))
 *
 * evaluated in fp32 in exactly this order (as the CPU does), the sum of
 * squares accumulated in fp32 with fused multiply-adds in a fixed order.
 * m rows of k values; y may be x (in place) when ldy == ldx. */
cudaError_t bn_cuda_rmsnorm_rows(const float *x, int64_t m, int64_t k, int64_t ldx,
                                 const float *w, float eps, float *y, int64_t ldy,
                                 cudaStream_t stream);

/* RMSNorm then per-row absmax int8 quantization in one kernel (the input of
 * a BitLinear). q, scale and sum are exactly what bn_cuda_quantize_rows
 * (= bn_quantize_activations_row) gives for the normed row this kernel
 * computed: s = 127 / max(max|y|, 1e-5), round half to even, NaN -> 0,
 * clamp to [-128, 127], the exact int32 sum, zeros from k to ldq (ldq >= k).
 * The normed floats are those of bn_cuda_rmsnorm_rows, bit for bit; they are
 * also stored to `normed` (stride ldn) when it is not NULL. `normed` must
 * not overlap x. */
cudaError_t bn_cuda_rmsnorm_quantize_rows(const float *x, int64_t m, int64_t k, int64_t ldx,
                                          const float *w, float eps, int8_t *q, int64_t ldq,
                                          float *scale, int32_t *sum, float *normed,
                                          int64_t ldn, cudaStream_t stream);

/* ---- squared-ReLU gate ------------------------------------------------------
 *
 *   h = relu(gate)^2 * up,  relu(g) = g > 0 ? g : 0 (so a NaN gate gives 0 * up)
 *
 * in fp32, (g * g) * up, as the CPU. gate and up may be two halves of one
 * fused projection output (hence separate strides). h may be gate or up
 * (in place) when its stride equals that operand's. */
cudaError_t bn_cuda_relu2_mul(const float *gate, int64_t ldg, const float *up, int64_t ldu,
                              int64_t m, int64_t k, float *h, int64_t ldh, cudaStream_t stream);

/* The gate, then the ffn_sub_norm RMSNorm with weight w, then the absmax
 * quantization: one kernel producing the int8 input of the down projection.
 * Same contracts as bn_cuda_relu2_mul followed by
 * bn_cuda_rmsnorm_quantize_rows (bit for bit: h is recomputed, never
 * stored). `normed` (the normed h, optional) must not overlap gate or up. */
cudaError_t bn_cuda_relu2_mul_norm_quantize(const float *gate, int64_t ldg, const float *up,
                                            int64_t ldu, int64_t m, int64_t k, const float *w,
                                            float eps, int8_t *q, int64_t ldq, float *scale,
                                            int32_t *sum, float *normed, int64_t ldn,
                                            cudaStream_t stream);

/* ---- residual add and row stores ------------------------------------------ */

/* y += x over m rows of k values (one fp32 addition per element). */
cudaError_t bn_cuda_add_rows(float *y, int64_t ldy, const float *x, int64_t ldx, int64_t m,
                             int64_t k, cudaStream_t stream);

/* Stores m fp32 rows of k values as `type` (BN_QTYPE_F32, F16 or BF16) into
 * row dst_rows[i] of dst (row i when dst_rows is NULL), rows ld_dst
 * elements apart. dst_rows lives on the device, so a captured CUDA graph
 * writes the KV cache at the positions of each replay. Conversions equal
 * bn_fp32_to_fp16 / bn_fp32_to_bf16 bit for bit: round to nearest even,
 * subnormals kept, overflow to infinity, NaN payloads kept as those do.
 * Rows with a negative dst_rows entry are skipped. */
cudaError_t bn_cuda_store_rows(const float *x, int64_t m, int64_t k, int64_t ldx, bn_qtype type,
                               void *dst, int64_t ld_dst, const int32_t *dst_rows,
                               cudaStream_t stream);

/* ---- RoPE -------------------------------------------------------------------
 *
 * Rotate-half ("NEOX"): in every head, the pairs (j, j + rope_dim/2) for
 * j < rope_dim/2 turn by the angle pos * inv_freq[j]:
 *
 *     x0' = x0 * cos - x1 * sin,    x1' = x1 * cos + x0 * sin
 *
 * Values from rope_dim to head_dim are untouched. */
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

/* In place on q [n_tokens][n_heads][head_dim] (token rows ldq floats apart)
 * and k [n_tokens][n_kv_heads][head_dim] (ldk apart; k may be NULL with
 * n_kv_heads 0). Token t is at position pos[t] (device int32 array, so a
 * graph is reused across decode steps). The angle is the fp32 product
 * (float)pos * inv_freq[j], exactly as on the CPU; cos and sin come from
 * sincosf (full-precision math, never the fast intrinsics), which may
 * differ from glibc's cosf/sinf in the last bit or two, and so may each
 * rotated value (see the top of this file). The products and the sum are
 * separate fp32 operations (never fused), as on the CPU. rope_dim <=
 * head_dim is required. */
cudaError_t bn_cuda_rope_neox(float *q, int64_t ldq, int n_heads, float *k, int64_t ldk,
                              int n_kv_heads, int64_t n_tokens, int head_dim,
                              const int32_t *pos, const bn_rope_freqs *freqs,
                              cudaStream_t stream);

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
