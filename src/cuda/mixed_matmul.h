/*
 * mixed_matmul.h - C = alpha * A.B + beta * C for fp32 matrices on the GPU,
 * with the product computed in FP32, FP16 or BF16 (AUTO: the best the device
 * has; see precision_select.h), on tensor cores through cuBLASLt, or through
 * cublasGemmEx when cuBLASLt is missing or has no algorithm for the shape.
 *
 * Matrices are dense and row-major: A is m x k, B is k x n, C is m x n.
 * Each may live in host or device memory (found out per call with
 * cudaPointerGetAttributes; device memory must be on the context's device,
 * managed memory counts as device memory). Host inputs are uploaded on the
 * copy stream, device inputs are used in place.
 *
 *   FP32  A, B as they are, products in fp32 (TF32 off: CUBLAS_COMPUTE_32F
 *         with the default math mode), accumulation in fp32.
 *   FP16  A, B rounded to fp16 on the GPU (round to nearest even, bit-
 *   BF16  identical to bn_fp32_to_fp16 / bn_fp32_to_bf16), products on
 *         tensor cores, accumulation and C in fp32.
 *
 * A call is synchronous: it returns when C holds the result. Buffers for
 * uploads and conversions are kept between calls and grow to the largest
 * problem seen (bn_mixed_matmul_trim frees them); they, and the cuBLASLt
 * workspace, are the device memory the metrics report.
 *
 * One bn_mixed_matmul serves one thread at a time; several may share a
 * context (each call ends with the streams idle of its work).
 */
#ifndef BN_MIXED_MATMUL_H
#define BN_MIXED_MATMUL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "bitnet.h"
#include "precision_select.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Conversion kernels (mixed_kernels.cu)                                     */
/* ------------------------------------------------------------------------ */

/* n elements, device pointers, asynchronous on `stream`; returns the launch
 * error (cudaSuccess when queued; nothing is launched for n == 0). The
 * results equal src/quant/fp16.h's conversions bit for bit, NaN payloads,
 * subnormals and overflow included. */
cudaError_t bn_cuda_convert_f32_to_f16(const float *src, uint16_t *dst, int64_t n,
                                       cudaStream_t stream);
cudaError_t bn_cuda_convert_f32_to_bf16(const float *src, uint16_t *dst, int64_t n,
                                        cudaStream_t stream);
cudaError_t bn_cuda_convert_f16_to_f32(const uint16_t *src, float *dst, int64_t n,
                                       cudaStream_t stream);
cudaError_t bn_cuda_convert_bf16_to_f32(const uint16_t *src, float *dst, int64_t n,
                                        cudaStream_t stream);

/* ------------------------------------------------------------------------ */
/* The matmul                                                                */
/* ------------------------------------------------------------------------ */

typedef struct bn_cuda_context bn_cuda_context;
typedef struct bn_mixed_matmul bn_mixed_matmul;

typedef enum bn_matmul_engine {
    BN_MATMUL_ENGINE_AUTO = 0, /* cuBLASLt, else cublasGemmEx            */
    BN_MATMUL_ENGINE_CUBLASLT, /* only cuBLASLt (an error if it cannot)  */
    BN_MATMUL_ENGINE_GEMM_EX,  /* only cublasGemmEx                      */
    BN_MATMUL_ENGINE_COUNT
} bn_matmul_engine;

/* "auto", "cublaslt", "gemm-ex"; "?" otherwise. */
const char *bn_matmul_engine_name(bn_matmul_engine engine);

/* What one call did. */
typedef struct bn_matmul_run {
    bn_precision precision;  /* what ran: never AUTO                       */
    bn_matmul_engine engine; /* which library ran it: never AUTO           */
    double compute_ms;       /* GPU time of conversions + product (events) */
    double total_ms;         /* host time of the call, transfers included  */
} bn_matmul_run;

/* Totals since creation or the last reset. Arrays are indexed by
 * bn_precision (the AUTO entry stays 0: requests count under what ran). */
typedef struct bn_mixed_matmul_metrics {
    uint64_t operations;                               /* calls that succeeded   */
    uint64_t operations_by_precision[BN_PRECISION_COUNT];
    uint64_t flops_by_precision[BN_PRECISION_COUNT];   /* 2 m n k per call       */
    double compute_ms_by_precision[BN_PRECISION_COUNT];
    double total_ms_by_precision[BN_PRECISION_COUNT];
    uint64_t cublaslt_runs, gemm_ex_runs;              /* sum = operations       */
    uint64_t h2d_transfers, h2d_bytes;                 /* inputs (and C if beta) */
    uint64_t d2h_transfers, d2h_bytes;                 /* results to host        */
    uint64_t device_bytes_current;                     /* buffers held now       */
    uint64_t device_bytes_peak;                        /* most ever held at once */
} bn_mixed_matmul_metrics;

/* The context must outlive the matmul. Nothing is allocated on the device
 * until the first call. */
bn_status bn_mixed_matmul_create(bn_cuda_context *ctx, bn_mixed_matmul **out, bn_error *err);
/* Frees the buffers. NULL is allowed. */
void bn_mixed_matmul_destroy(bn_mixed_matmul *mm);

/* Forces an engine (AUTO by default), for tests and comparisons. */
void bn_mixed_matmul_set_engine(bn_mixed_matmul *mm, bn_matmul_engine engine);

/* C = alpha * A.B + beta * C (C is not read when beta == 0, so it may hold
 * anything, NaN included). m, n, k >= 1 and each at most INT32_MAX; run may
 * be NULL. An explicit FP16/BF16 the device lacks is BN_ERR_UNSUPPORTED
 * (nothing runs); out of device memory is BN_ERR_GPU_OUT_OF_MEMORY with the
 * hint to reduce the batch or the context. */
bn_status bn_mixed_matmul_run(bn_mixed_matmul *mm, bn_precision precision, int64_t m, int64_t n,
                              int64_t k, float alpha, const float *a, const float *b, float beta,
                              float *c, bn_matmul_run *run, bn_error *err);

void bn_mixed_matmul_get_metrics(const bn_mixed_matmul *mm, bn_mixed_matmul_metrics *out);
/* Zeroes the counters and times; the peak restarts from what is held now. */
void bn_mixed_matmul_reset_metrics(bn_mixed_matmul *mm);
/* Frees the kept buffers (device memory held drops to 0). */
void bn_mixed_matmul_trim(bn_mixed_matmul *mm);

#ifdef __cplusplus
}
#endif

#endif
