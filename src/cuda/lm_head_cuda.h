/*
 * lm_head_cuda.h - logits = W . x on the GPU for the LM head (lm_head.c,
 * kernels in lm_head_kernels.cu).
 *
 * W is [vocab][dim] row-major on the device, F16 or BF16 (the official
 * 2B-4T GGUF ties the head to token_embd, F16). x is m rows of dim fp32
 * (stride ldx); logits are m rows of vocab fp32 (stride ldl).
 *
 * Paths (bn_lm_head_type):
 *   F16 / BF16: x is rounded to W's type (fp16 saturating at +-65504) and
 *     cublasGemmEx multiplies with fp32 accumulation and fp32 output.
 *   INT8: at init W is quantized per row to int8 (scale = absmax / 127,
 *     round to nearest even); per call x is quantized per row with absmax
 *     (bn_cuda_quantize_rows, the BitLinear activation rule) and a dp4a
 *     kernel computes acc * w_scale[row] / x_scale. Halves the bytes read
 *     per token (the head is memory-bound at small m). Measured on an H200
 *     (tests/test_cuda_lm_head.c prints error and timings of every path on
 *     the 2B-4T shape, 128256 x 2560): m = 1 takes 106 us against 162 us
 *     for cuBLAS F16 / BF16 (1.5x faster), with ~3% relative L2 error
 *     against fp32 on Gaussian test data whose activations carry a few 8x
 *     outliers (the per-row absmax of x sets the step; outliers cost
 *     accuracy) - versus 2e-4 (F16) and 2e-3 (BF16, from rounding x) for
 *     cuBLAS. At m = 8 the int8 kernel is slower (262 us vs 164 us): use
 *     it for decode (m = 1, 2) only; for prefill logits of many rows the
 *     cuBLAS paths are the better choice. Needs W (F16) kept anyway when
 *     token_embd doubles as the input embedding: +vocab * dim bytes.
 *
 * The cuBLAS handle gets its own workspace, so forward calls can be
 * captured in a CUDA graph. One bn_lm_head must not be used from two
 * streams at once (it owns the scratch for x).
 */
#ifndef BN_LM_HEAD_CUDA_H
#define BN_LM_HEAD_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"
#include "cublas_loader.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum bn_lm_head_type {
    BN_LM_HEAD_F16 = 0,
    BN_LM_HEAD_BF16 = 1,
    BN_LM_HEAD_INT8 = 2
} bn_lm_head_type;

typedef struct bn_lm_head {
    bn_lm_head_type type;
    int64_t vocab, dim, max_rows;
    /* F16 / BF16: the caller's weights (not owned). */
    const void *weight;
    void *x_half;            /* max_rows x dim, W's type                 */
    const bn_cublas *blas;
    cublasHandle_t handle;
    void *blas_workspace;
    size_t blas_workspace_bytes;
    /* INT8 (owned). */
    int8_t *wq;              /* vocab x ldq                               */
    float *w_scale;          /* vocab                                     */
    int8_t *xq;              /* max_rows x ldq                            */
    float *x_scale;          /* max_rows: 127 / absmax                    */
    int32_t *x_sum;          /* max_rows (written by the quantizer)       */
    int64_t ldq;             /* dim rounded up to 16 bytes, zero padded   */
} bn_lm_head;

/* Prepares a head of `type` over device weights of weight_type (F16 or
 * BF16) for up to max_rows rows per call. F16 / BF16 need type ==
 * weight_type and keep using `weight`; INT8 quantizes it now (on
 * `stream`, waited for before returning) and never reads it again, so
 * the caller may free it. */
bn_status bn_lm_head_init(bn_lm_head *h, bn_lm_head_type type, const void *weight,
                          bn_lm_head_type weight_type, int64_t vocab, int64_t dim,
                          int64_t max_rows, cudaStream_t stream, bn_error *err);

/* logits[i * ldl + v] = sum_k W[v][k] x[i * ldx + k] for i < m <= max_rows.
 * Asynchronous on stream. */
bn_status bn_lm_head_forward(bn_lm_head *h, const float *x, int64_t ldx, int64_t m,
                             float *logits, int64_t ldl, cudaStream_t stream, bn_error *err);

void bn_lm_head_free(bn_lm_head *h);

/* ---- kernels (lm_head_kernels.cu) ------------------------------------------ */

/* m rows of k fp32 (stride ldx) to fp16 (bf16 == 0, saturating) or bf16,
 * round to nearest even, into out (stride ldo elements). */
cudaError_t bn_cuda_rows_to_half(const float *x, int64_t m, int64_t k, int64_t ldx, void *out,
                                 int64_t ldo, int bf16, cudaStream_t stream);

/* Per-row int8 quantization of a fp16 / bf16 matrix (rows x k, stride k):
 * scale[r] = absmax / 127 (0 for an all-zero row), q = clamp(rint(w *
 * 127 / absmax), -127, 127), zero from k to ldq. */
cudaError_t bn_cuda_quantize_weight_rows(const void *w, int bf16, int64_t rows, int64_t k,
                                         int8_t *q, int64_t ldq, float *scale,
                                         cudaStream_t stream);

/* y[i * ldy + r] = (sum_k wq[r][k] xq[i][k]) * w_scale[r] / x_scale[i] for
 * r < n, i < m; both operands with stride ldq (a multiple of 16, zero
 * padded), dp4a with int32 accumulation. */
cudaError_t bn_cuda_int8_gemv(const int8_t *wq, const float *w_scale, int64_t n,
                              const int8_t *xq, const float *x_scale, int64_t m, int64_t ldq,
                              float *y, int64_t ldy, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
