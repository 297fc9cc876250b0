/*
 * cublaslt_loader.h - cuBLASLt, and the cuBLAS entry points that
 * cublas_loader.h does not carry, opened at run time (dlopen) like cuBLAS
 * itself: a binary built with CUDA starts without these libraries and only
 * the features that use them (the mixed-precision matmul) report them
 * missing, as BN_ERR_UNSUPPORTED naming the library.
 *
 * Only the types come from the toolkit headers; nothing here is linked.
 */
#ifndef BN_CUBLASLT_LOADER_H
#define BN_CUBLASLT_LOADER_H

/* cublasLt.h declares cublasLtLoggerForceDisable() without (void), which
 * -Wstrict-prototypes reports in every file including it; the declaration is
 * NVIDIA's, not ours. */
#if defined(__GNUC__) && !defined(__cplusplus)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#endif
#include <cublasLt.h>
#if defined(__GNUC__) && !defined(__cplusplus)
#pragma GCC diagnostic pop
#endif
#include <cublas_v2.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bn_cublaslt {
    cublasStatus_t (*create)(cublasLtHandle_t *handle);
    cublasStatus_t (*destroy)(cublasLtHandle_t handle);
    size_t (*get_version)(void);
    cublasStatus_t (*matmul_desc_create)(cublasLtMatmulDesc_t *desc,
                                         cublasComputeType_t compute, cudaDataType_t scale);
    cublasStatus_t (*matmul_desc_destroy)(cublasLtMatmulDesc_t desc);
    cublasStatus_t (*matmul_desc_set_attribute)(cublasLtMatmulDesc_t desc,
                                                cublasLtMatmulDescAttributes_t attr,
                                                const void *buf, size_t size);
    cublasStatus_t (*matrix_layout_create)(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                           uint64_t rows, uint64_t cols, int64_t ld);
    cublasStatus_t (*matrix_layout_destroy)(cublasLtMatrixLayout_t layout);
    cublasStatus_t (*preference_create)(cublasLtMatmulPreference_t *pref);
    cublasStatus_t (*preference_destroy)(cublasLtMatmulPreference_t pref);
    cublasStatus_t (*preference_set_attribute)(cublasLtMatmulPreference_t pref,
                                               cublasLtMatmulPreferenceAttributes_t attr,
                                               const void *buf, size_t size);
    cublasStatus_t (*algo_get_heuristic)(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                         cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                         cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                         cublasLtMatmulPreference_t pref, int requested,
                                         cublasLtMatmulHeuristicResult_t results[],
                                         int *returned);
    cublasStatus_t (*matmul)(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                             const void *alpha, const void *a, cublasLtMatrixLayout_t a_desc,
                             const void *b, cublasLtMatrixLayout_t b_desc, const void *beta,
                             const void *c, cublasLtMatrixLayout_t c_desc, void *d,
                             cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t *algo,
                             void *workspace, size_t workspace_bytes, cudaStream_t stream);
    char library[64]; /* the file that was opened */
} bn_cublaslt;

/* Loads libcublasLt once per process; BN_ERR_UNSUPPORTED naming the library
 * and the loader's message when it is missing or incomplete. */
bn_status bn_cublaslt_get(const bn_cublaslt **out, bn_error *err);

/* cuBLAS entry points beyond bn_cublas (same library, opened again by the
 * name bn_cublas_get found, which only takes a reference). */
typedef struct bn_cublas_extra {
    /* The FP32 path must not run on TF32 tensor cores: the math mode says so. */
    cublasStatus_t (*set_math_mode)(cublasHandle_t handle, cublasMath_t mode);
    cublasStatus_t (*get_version)(cublasHandle_t handle, int *version);
} bn_cublas_extra;

bn_status bn_cublas_extra_get(const bn_cublas_extra **out, bn_error *err);

#ifdef __cplusplus
}
#endif

#endif
