/*
 * lm_head.cu - the LM head with fp32 activations: logits of every row of an
 * F32, F16 or BF16 head (bn_cb_head_gemv in cuda_backend_kernels.h), each
 * row's dot product by head_row.cuh, the code the screened head's exact
 * pass (head_screen.cu) also runs on the rows it keeps.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"
#include "head_row.cuh"
#include "smem_opt_in.cuh"

namespace {

constexpr int kHeadThreads = 256;

/* x is staged in shared memory; each warp takes whole rows (grid-stride),
 * each one head_row_dot (head_row.cuh). */
template <int kType, bool kVec>
__global__ void __launch_bounds__(kHeadThreads)
    head_kernel(const uint8_t *__restrict__ w, int64_t rows, int64_t dim,
                const float *__restrict__ x, float *__restrict__ logits)
{
    extern __shared__ __align__(16) float xs[];
    const int64_t row_bytes = dim * HeadElem<kType>::kBytes;
    for (int64_t i = threadIdx.x; i < dim; i += kHeadThreads)
        xs[i] = x[i];
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (kHeadThreads / 32);
    for (int64_t r = (int64_t)blockIdx.x * (kHeadThreads / 32) + (threadIdx.x >> 5); r < rows;
         r += warps) {
        const float acc = head_row_dot<kType, kVec>(w + r * row_bytes, xs, dim, lane);
        if (lane == 0)
            logits[r] = acc;
    }
}

template <int kType>
cudaError_t launch_head(const void *w, int64_t rows, int64_t dim, const float *x, float *logits,
                        int sm_count, cudaStream_t stream)
{
    const int64_t per_block = kHeadThreads / 32;
    int64_t blocks = (rows + per_block - 1) / per_block;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 132) * 8;
    blocks = blocks < cap ? blocks : cap;
    const auto kernel = head_row_vec<kType>(dim) ? head_kernel<kType, true>
                                                 : head_kernel<kType, false>;
    kernel<<<(unsigned)blocks, kHeadThreads, sizeof(float) * (size_t)dim, stream>>>(
        static_cast<const uint8_t *>(w), rows, dim, x, logits);
    return cudaGetLastError();
}

template <int kType> cudaError_t set_head_smem(int64_t dim)
{
    const size_t smem = sizeof(float) * (size_t)dim;
    const cudaError_t rc = allow_dynamic_smem(head_kernel<kType, true>, smem);
    return rc == cudaSuccess ? allow_dynamic_smem(head_kernel<kType, false>, smem) : rc;
}
} // namespace

extern "C" cudaError_t bn_cb_head_prepare(int type, int64_t dim)
{
    if (dim <= 0 || dim > BN_CB_HEAD_MAX_DIM)
        return cudaErrorInvalidValue;
    switch (type) {
    case BN_CB_HEAD_F32: return set_head_smem<BN_CB_HEAD_F32>(dim);
    case BN_CB_HEAD_F16: return set_head_smem<BN_CB_HEAD_F16>(dim);
    case BN_CB_HEAD_BF16: return set_head_smem<BN_CB_HEAD_BF16>(dim);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t bn_cb_head_gemv(const void *w, int type, int64_t rows, int64_t dim,
                                       const float *x, float *logits, int sm_count,
                                       cudaStream_t stream)
{
    if (!w || !x || !logits || rows <= 0 || dim <= 0 || dim > BN_CB_HEAD_MAX_DIM)
        return cudaErrorInvalidValue;
    const int s = sm_count;
    switch (type) {
    case BN_CB_HEAD_F32: return launch_head<BN_CB_HEAD_F32>(w, rows, dim, x, logits, s, stream);
    case BN_CB_HEAD_F16: return launch_head<BN_CB_HEAD_F16>(w, rows, dim, x, logits, s, stream);
    case BN_CB_HEAD_BF16: return launch_head<BN_CB_HEAD_BF16>(w, rows, dim, x, logits, s, stream);
    default: return cudaErrorInvalidValue;
    }
}
