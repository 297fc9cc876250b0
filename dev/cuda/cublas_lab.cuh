/* cublas_lab.cuh - for the labs that link cuBLAS: CUBLAS_CHECK exits with
 * the call and its status when a cuBLAS call fails; lab_gemm_tn runs the
 * one product form they time. */
#ifndef LAB_CUBLAS_LAB_CUH
#define LAB_CUBLAS_LAB_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        const cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_);  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* out [cols][rows] = b [cols][k] . a [rows][k]^T on stream s (row-major
 * views of cuBLAS's column-major TN product): a and b of type `in`, out
 * fp32 (fp16 / bf16 in) or int32 with exact sums (int8 in). ldb: b's row
 * stride. cudaErrorUnknown where cuBLAS refuses. */
static inline cudaError_t lab_gemm_tn(cublasHandle_t cb, cudaStream_t s, cudaDataType in,
                                      const void *a, int64_t rows, int64_t k, const void *b,
                                      int64_t cols, int64_t ldb, void *out)
{
    const bool i8 = in == CUDA_R_8I;
    const float onef = 1.0f, zerof = 0.0f;
    const int32_t onei = 1, zeroi = 0;
    if (cublasSetStream(cb, s) != CUBLAS_STATUS_SUCCESS)
        return cudaErrorUnknown;
    return cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)cols, (int)k,
                        i8 ? (const void *)&onei : &onef, a, in, (int)k, b, in, (int)ldb,
                        i8 ? (const void *)&zeroi : &zerof, out, i8 ? CUDA_R_32I : CUDA_R_32F,
                        (int)rows, i8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS
               ? cudaSuccess
               : cudaErrorUnknown;
}

#endif
