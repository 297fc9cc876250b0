/*
 * lm_head.c - the LM head on the GPU: cuBLAS for F16 / BF16 weights, a
 * dp4a kernel for int8 weights (see lm_head_cuda.h).
 */
#include "lm_head_cuda.h"

#include <limits.h>
#include <string.h>

#include "cuda_check.h"
#include "w2a8_cuda.h"

/* cuBLAS's recommended workspace on Hopper; given explicitly so that a
 * forward call captured in a graph never asks cuBLAS to allocate. */
#define LM_HEAD_BLAS_WORKSPACE ((size_t)32 << 20)

void bn_lm_head_free(bn_lm_head *h)
{
    if (!h)
        return;
    if (h->handle && h->blas)
        h->blas->destroy(h->handle);
    cudaFree(h->blas_workspace);
    cudaFree(h->x_half);
    cudaFree(h->wq);
    cudaFree(h->w_scale);
    cudaFree(h->xq);
    cudaFree(h->x_scale);
    cudaFree(h->x_sum);
    memset(h, 0, sizeof *h);
}

static bn_status init_blas(bn_lm_head *h, bn_error *err)
{
    bn_status st = bn_cublas_get(&h->blas, err);
    if (st != BN_OK)
        return st;
    cublasStatus_t cs = h->blas->create(&h->handle);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        h->handle = NULL;
        return bn_cublas_error(err, cs, "cublasCreate");
    }
    h->blas_workspace_bytes = LM_HEAD_BLAS_WORKSPACE;
    BN_CUDA_TRY(err, cudaMalloc(&h->blas_workspace, h->blas_workspace_bytes));
    const size_t elem = 2; /* fp16 and bf16 */
    BN_CUDA_TRY(err, cudaMalloc(&h->x_half, (size_t)(h->max_rows * h->dim) * elem));
    return BN_OK;
}

static bn_status init_int8(bn_lm_head *h, const void *weight, bn_lm_head_type weight_type,
                           cudaStream_t stream, bn_error *err)
{
    h->ldq = (h->dim + 15) / 16 * 16;
    BN_CUDA_TRY(err, cudaMalloc((void **)&h->wq, (size_t)(h->vocab * h->ldq)));
    BN_CUDA_TRY(err, cudaMalloc((void **)&h->w_scale, sizeof(float) * (size_t)h->vocab));
    BN_CUDA_TRY(err, cudaMalloc((void **)&h->xq, (size_t)(h->max_rows * h->ldq)));
    BN_CUDA_TRY(err, cudaMalloc((void **)&h->x_scale, sizeof(float) * (size_t)h->max_rows));
    BN_CUDA_TRY(err, cudaMalloc((void **)&h->x_sum, sizeof(int32_t) * (size_t)h->max_rows));
    BN_CUDA_TRY(err, bn_cuda_quantize_weight_rows(weight, weight_type == BN_LM_HEAD_BF16,
                                                    h->vocab, h->dim, h->wq, h->ldq, h->w_scale,
                                                    stream));
    /* The caller may free the weights once this returns. */
    BN_CUDA_TRY(err, cudaStreamSynchronize(stream));
    return BN_OK;
}

bn_status bn_lm_head_init(bn_lm_head *h, bn_lm_head_type type, const void *weight,
                          bn_lm_head_type weight_type, int64_t vocab, int64_t dim,
                          int64_t max_rows, cudaStream_t stream, bn_error *err)
{
    if (!h || !weight)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_lm_head_init: head and weights must not be NULL");
    memset(h, 0, sizeof *h);
    if (weight_type != BN_LM_HEAD_F16 && weight_type != BN_LM_HEAD_BF16)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "pass F16 or BF16 weights",
                            "LM head weights must be F16 or BF16 (type %d)", (int)weight_type);
    if (type != BN_LM_HEAD_INT8 && type != weight_type)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "use the weights' own type, or BN_LM_HEAD_INT8",
                            "LM head type %d does not match its weights' type %d", (int)type,
                            (int)weight_type);
    /* cuBLAS takes int dimensions; the int8 kernel's int32 sums need
     * dim <= 131072 (bn_cuda_int8_gemv). */
    if (vocab < 1 || dim < 1 || max_rows < 1 || vocab > INT_MAX || dim > 131056 ||
        max_rows > 65535)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "LM head shape %lld x %lld (max %lld rows) is out of range",
                            (long long)vocab, (long long)dim, (long long)max_rows);
    h->type = type;
    h->vocab = vocab;
    h->dim = dim;
    h->max_rows = max_rows;
    bn_status st;
    if (type == BN_LM_HEAD_INT8) {
        st = init_int8(h, weight, weight_type, stream, err);
    } else {
        h->weight = weight;
        st = init_blas(h, err);
    }
    if (st != BN_OK)
        bn_lm_head_free(h);
    return st;
}

bn_status bn_lm_head_forward(bn_lm_head *h, const float *x, int64_t ldx, int64_t m,
                             float *logits, int64_t ldl, cudaStream_t stream, bn_error *err)
{
    if (!h || !x || !logits || m < 0 || m > h->max_rows || ldx < h->dim || ldl < h->vocab ||
        ldl > INT_MAX)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_lm_head_forward: bad arguments (m %lld of at most %lld)",
                            (long long)m, h ? (long long)h->max_rows : 0LL);
    if (m == 0)
        return BN_OK;
    if (h->type == BN_LM_HEAD_INT8) {
        BN_CUDA_TRY(err, bn_cuda_quantize_rows(x, m, h->dim, ldx, h->xq, h->ldq, h->x_scale,
                                                 h->x_sum, stream));
        BN_CUDA_TRY(err, bn_cuda_int8_gemv(h->wq, h->w_scale, h->vocab, h->xq, h->x_scale, m,
                                             h->ldq, logits, ldl, stream));
        return BN_OK;
    }

    const bool bf16 = h->type == BN_LM_HEAD_BF16;
    BN_CUDA_TRY(err, bn_cuda_rows_to_half(x, m, h->dim, ldx, h->x_half, h->dim, bf16, stream));
    /* SetStream resets the workspace to cuBLAS's own pool: set it after. */
    cublasStatus_t cs = h->blas->set_stream(h->handle, stream);
    if (cs == CUBLAS_STATUS_SUCCESS)
        cs = h->blas->set_workspace(h->handle, h->blas_workspace, h->blas_workspace_bytes);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return bn_cublas_error(err, cs, "cublasSetStream / cublasSetWorkspace");
    /* Row-major W [vocab][dim] is column-major dim x vocab (lda = dim);
     * logits^T (vocab x m, column-major, ldc = ldl) = W^T-view . x. */
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    cs = h->blas->gemm_ex(h->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)h->vocab, (int)m, (int)h->dim,
                          &one, h->weight, t, (int)h->dim, h->x_half, t, (int)h->dim, &zero,
                          logits, CUDA_R_32F, (int)ldl, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return bn_cublas_error(err, cs, "cublasGemmEx (LM head)");
    return BN_OK;
}
