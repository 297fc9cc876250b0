/*
 * w2a8_cuda.h - C launchers for the CUDA W2A8 kernels (w2a8_kernels.cu).
 * All pointers are device pointers; launches are asynchronous on `stream`
 * and return the launch error (cudaSuccess when queued).
 */
#ifndef BN_W2A8_CUDA_H
#define BN_W2A8_CUDA_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bn_w2a8_cuda_args {
    const void *weights;      /* cuda_layout.h packing                     */
    int64_t n;                /* weight rows (outputs)                     */
    int64_t tiles, groups;    /* from bn_cuda_layout                       */
    float weight_scale;
    const int8_t *x;          /* m rows of ldx bytes, zero from k to k_pad */
    int64_t m, ldx;
    const float *act_scale;   /* m scales (127 / absmax)                   */
    const int32_t *act_sum;   /* m sums of the int8 values                 */
    float *y;                 /* y[row * ldy + col]                        */
    int64_t ldy;
    int32_t *workspace;       /* m * n int32 for split-K GEMM, or NULL     */
    int sm_count;             /* the device's SMs (sizes split-K)          */
} bn_w2a8_cuda_args;

/* Split-K factor (1, 2, 4 or 8) that fills a GPU of sm_count SMs. */
int bn_w2a8_cuda_gemv_split(int64_t tiles, int64_t groups, int sm_count);
/* M = 1. */
cudaError_t bn_w2a8_cuda_gemv(const bn_w2a8_cuda_args *a, int split, cudaStream_t stream);

/* GEMV implementation variants, for tests and the benchmark:
 *   0: 2 chunk-groups in flight per warp, activations through L1
 *   1: 4 in flight, activations through L1
 *   2: 4 in flight, activations staged in shared memory
 *   3: 8 in flight, activations through L1
 *   4: as 2, with 2-bit fields masked in place (one logic op per field) */
#define BN_W2A8_GEMV_VARIANTS 5
#define BN_W2A8_GEMV_DEFAULT_VARIANT 2
cudaError_t bn_w2a8_cuda_gemv_variant(const bn_w2a8_cuda_args *a, int split, int variant,
                                      cudaStream_t stream);
/* M >= 1 on int8 tensor cores (requires compute capability 8.0). */
cudaError_t bn_w2a8_cuda_gemm(const bn_w2a8_cuda_args *a, cudaStream_t stream);

/* GEMM variants: 0 tiled 64 x 64 with weights expanded in shared memory;
 * 1 "skinny": weights straight into tensor-core fragments, activations in
 * 16- or 32-row slices, K split over blocks when a workspace is given.
 * bn_w2a8_cuda_gemm uses 1 up to BN_W2A8_SKINNY_MAX_M rows. */
#define BN_W2A8_GEMM_VARIANTS 2
#define BN_W2A8_SKINNY_MAX_M 32
cudaError_t bn_w2a8_cuda_gemm_variant(const bn_w2a8_cuda_args *a, int variant,
                                      cudaStream_t stream);

/* Per-row absmax int8 quantization of m rows of k floats (stride ldx)
 * into q (stride ldq >= k, zero-filled from k to ldq), with scales and
 * sums; bit-identical to bn_quantize_activations_row. */
cudaError_t bn_cuda_quantize_rows(const float *x, int64_t m, int64_t k, int64_t ldx, int8_t *q,
                                  int64_t ldq, float *scale, int32_t *sum, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
