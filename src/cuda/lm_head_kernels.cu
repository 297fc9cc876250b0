/*
 * lm_head_kernels.cu - the LM head's helper kernels (lm_head_cuda.h):
 * activation rounding for cuBLAS, per-row int8 weight quantization and
 * the int8 x int8 dp4a GEMV.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "lm_head_cuda.h"
#include "smem_opt_in.cuh"
#include "w2a8_gemv.cuh"

namespace {

/* ---- fp32 -> fp16 / bf16 --------------------------------------------------- */

__global__ void rows_to_half_kernel(const float *__restrict__ x, int64_t k, int64_t ldx,
                                    void *__restrict__ out, int64_t ldo, int bf16)
{
    const int64_t row = blockIdx.y;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < k;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[row * ldx + i];
        if (bf16) {
            static_cast<__nv_bfloat16 *>(out)[row * ldo + i] = __float2bfloat16_rn(v);
        } else {
            /* Saturate: an activation past fp16's range would otherwise
             * become inf and turn its whole logits row into inf / NaN. */
            const float c = fminf(fmaxf(v, -65504.0f), 65504.0f);
            static_cast<__half *>(out)[row * ldo + i] = __float2half_rn(v != v ? v : c);
        }
    }
}

/* ---- per-row int8 weights -------------------------------------------------- */

__device__ __forceinline__ float load_elem(const void *w, int bf16, int64_t i)
{
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(w)[i])
                : __half2float(static_cast<const __half *>(w)[i]);
}

/* One block per row. */
__global__ void __launch_bounds__(256)
    quantize_weight_kernel(const void *__restrict__ w, int bf16, int64_t k,
                           int8_t *__restrict__ q, int64_t ldq, float *__restrict__ scale)
{
    __shared__ float red[8];
    const int64_t row = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float amax = 0.0f;
    for (int64_t i = tid; i < k; i += blockDim.x)
        amax = fmaxf(amax, fabsf(load_elem(w, bf16, row * k + i)));
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0)
        red[warp] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        amax = fmaxf(amax, red[i]);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = tid; i < ldq; i += blockDim.x) {
        int v = 0;
        if (i < k) {
            const float r = rintf(load_elem(w, bf16, row * k + i) * inv);
            v = r != r ? 0 : (int)fminf(fmaxf(r, -127.0f), 127.0f);
        }
        q[row * ldq + i] = (int8_t)v;
    }
    if (tid == 0)
        scale[row] = amax / 127.0f;
}

/* ---- int8 GEMV ------------------------------------------------------------- */

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kUnroll = 4;

__device__ __forceinline__ int dot16(uint4 w, int4 x, int acc)
{
    acc = __dp4a((int)w.x, x.x, acc);
    acc = __dp4a((int)w.y, x.y, acc);
    acc = __dp4a((int)w.z, x.z, acc);
    return __dp4a((int)w.w, x.w, acc);
}

/* Block: 8 warps x 4 weight rows each; the MT activation rows (ldq bytes
 * each) staged in shared memory. A warp reads a weight row 512 bytes per
 * instruction (16 per lane, coalesced, not kept in L1), kUnroll
 * instructions in flight, and reduces with shuffles. */
template <int MT>
__global__ void __launch_bounds__(32 * kWarps, 2)
    int8_gemv_kernel(const int8_t *__restrict__ wq, const float *__restrict__ w_scale, int64_t n,
                     const int8_t *__restrict__ xq, const float *__restrict__ x_scale,
                     int64_t ldq, float *__restrict__ y, int64_t ldy)
{
    extern __shared__ int4 xs[]; /* [MT][ldq / 16] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t vecs = ldq / 16;
    for (int64_t i = threadIdx.x; i < MT * vecs; i += blockDim.x)
        xs[i] = __ldg(reinterpret_cast<const int4 *>(xq) + i);
    __syncthreads();

    for (int r = 0; r < kRowsPerWarp; r++) {
        const int64_t row = (int64_t)blockIdx.x * kRowsPerBlock + warp * kRowsPerWarp + r;
        if (row >= n)
            break;
        const uint4 *wrow = reinterpret_cast<const uint4 *>(wq + row * ldq);
        int acc[MT];
#pragma unroll
        for (int i = 0; i < MT; i++)
            acc[i] = 0;
        int64_t v = lane;
        for (; v + 32 * (kUnroll - 1) < vecs; v += 32 * kUnroll) {
            uint4 wv[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
                wv[u] = gemv_load_stream(wrow + v + 32 * u);
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
#pragma unroll
                for (int i = 0; i < MT; i++)
                    acc[i] = dot16(wv[u], xs[i * vecs + v + 32 * u], acc[i]);
        }
        for (; v < vecs; v += 32) {
            const uint4 wv = gemv_load_stream(wrow + v);
#pragma unroll
            for (int i = 0; i < MT; i++)
                acc[i] = dot16(wv, xs[i * vecs + v], acc[i]);
        }
#pragma unroll
        for (int i = 0; i < MT; i++) {
            int a = acc[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                a += __shfl_xor_sync(0xffffffffu, a, o);
            if (lane == i)
                y[i * ldy + row] = (float)a * w_scale[row] / x_scale[i];
        }
    }
}

template <int MT>
cudaError_t launch_int8_gemv(const int8_t *wq, const float *w_scale, int64_t n, const int8_t *xq,
                             const float *x_scale, int64_t ldq, float *y, int64_t ldy,
                             cudaStream_t stream)
{
    const size_t smem = (size_t)MT * (size_t)ldq;
    auto kernel = int8_gemv_kernel<MT>;
    const cudaError_t rc = allow_dynamic_smem(kernel, smem);
    if (rc != cudaSuccess)
        return rc;
    const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
    kernel<<<(unsigned)blocks, 32 * kWarps, smem, stream>>>(wq, w_scale, n, xq, x_scale, ldq, y,
                                                            ldy);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t bn_cuda_rows_to_half(const float *x, int64_t m, int64_t k, int64_t ldx,
                                            void *out, int64_t ldo, int bf16,
                                            cudaStream_t stream)
{
    if (m <= 0 || k <= 0)
        return cudaSuccess;
    if (m > 65535)
        return cudaErrorInvalidValue;
    const unsigned threads = 256;
    int64_t bx = (k + threads - 1) / threads;
    bx = bx > 64 ? 64 : bx;
    rows_to_half_kernel<<<dim3((unsigned)bx, (unsigned)m), threads, 0, stream>>>(x, k, ldx, out,
                                                                                ldo, bf16);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_quantize_weight_rows(const void *w, int bf16, int64_t rows,
                                                    int64_t k, int8_t *q, int64_t ldq,
                                                    float *scale, cudaStream_t stream)
{
    if (rows <= 0)
        return cudaSuccess;
    if (ldq < k || rows > INT32_MAX)
        return cudaErrorInvalidValue;
    quantize_weight_kernel<<<(unsigned)rows, 256, 0, stream>>>(w, bf16, k, q, ldq, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_int8_gemv(const int8_t *wq, const float *w_scale, int64_t n,
                                         const int8_t *xq, const float *x_scale, int64_t m,
                                         int64_t ldq, float *y, int64_t ldy, cudaStream_t stream)
{
    /* int32 accumulation: |127 * 128| * ldq stays below 2^31 up to 131072. */
    if (ldq % 16 != 0 || ldq <= 0 || ldq > 131072)
        return cudaErrorInvalidValue;
    /* Up to 8 rows per pass, as many as fit in 96 KiB of shared memory. */
    int64_t per_pass = 8;
    while (per_pass > 1 && per_pass * ldq > 96 * 1024)
        per_pass /= 2;
    for (int64_t i0 = 0; i0 < m; i0 += per_pass) {
        const int64_t rows = m - i0 < per_pass ? m - i0 : per_pass;
        const int8_t *x = xq + i0 * ldq;
        const float *s = x_scale + i0;
        float *out = y + i0 * ldy;
        cudaError_t rc;
        if (rows == 1)
            rc = launch_int8_gemv<1>(wq, w_scale, n, x, s, ldq, out, ldy, stream);
        else if (rows == 2)
            rc = launch_int8_gemv<2>(wq, w_scale, n, x, s, ldq, out, ldy, stream);
        else if (rows <= 4)
            rc = rows == 4 ? launch_int8_gemv<4>(wq, w_scale, n, x, s, ldq, out, ldy, stream)
                           : launch_int8_gemv<3>(wq, w_scale, n, x, s, ldq, out, ldy, stream);
        else
            rc = rows == 8   ? launch_int8_gemv<8>(wq, w_scale, n, x, s, ldq, out, ldy, stream)
                 : rows == 7 ? launch_int8_gemv<7>(wq, w_scale, n, x, s, ldq, out, ldy, stream)
                 : rows == 6 ? launch_int8_gemv<6>(wq, w_scale, n, x, s, ldq, out, ldy, stream)
                             : launch_int8_gemv<5>(wq, w_scale, n, x, s, ldq, out, ldy, stream);
        if (rc != cudaSuccess)
            return rc;
    }
    return cudaSuccess;
}
