/*
 * cublas_loader.h - cuBLAS opened at run time (dlopen), so a binary built
 * with CUDA starts on machines without the CUDA libraries and needs cuBLAS
 * only for the features that use it (the benchmarks' BF16 baselines).
 */
#ifndef BN_CUBLAS_LOADER_H
#define BN_CUBLAS_LOADER_H

#include <cublas_v2.h>

#include "bitnet.h"

typedef struct bn_cublas {
    cublasStatus_t (*create)(cublasHandle_t *handle);
    cublasStatus_t (*destroy)(cublasHandle_t handle);
    cublasStatus_t (*set_stream)(cublasHandle_t handle, cudaStream_t stream);
    cublasStatus_t (*set_workspace)(cublasHandle_t handle, void *workspace, size_t bytes);
    cublasStatus_t (*gemm_ex)(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const void *alpha,
                              const void *A, cudaDataType Atype, int lda, const void *B,
                              cudaDataType Btype, int ldb, const void *beta, void *C,
                              cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                              cublasGemmAlgo_t algo);
    char library[64]; /* the file that was opened */
} bn_cublas;

/* Loads libcublas once per process; BN_ERR_UNSUPPORTED with the loader's
 * message when it is not installed. */
bn_status bn_cublas_get(const bn_cublas **out, bn_error *err);

#endif
