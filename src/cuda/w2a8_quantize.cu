/*
 * w2a8_quantize.cu - the W2A8 activations on the GPU: per-row absmax int8
 * quantization, bit-identical to the CPU's bn_quantize_activations_row.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "w2a8_cuda.h"

namespace {

/* The int8 code of x at scale s: round half to even, NaN -> 0, clamped. */
__device__ __forceinline__ int quantize_code(float x, float s)
{
    const float r = rintf(__fmul_rn(x, s));
    return r != r ? 0 : r > 127.0f ? 127 : r < -128.0f ? -128 : (int)r;
}

/* One block per row: absmax (NaN ignored), s = 127 / max(absmax, 1e-5),
 * round half to even, NaN -> 0, clamp, exact sum; zero padding to ldq.
 * VEC: four values a load and a store (k, ldx and ldq multiples of 4, x
 * 16-byte and q 4-byte aligned); the same codes, scale and sum (a maximum
 * and an integer sum do not depend on the order). */
template <bool VEC>
__global__ void __launch_bounds__(1024)
    quantize_kernel(const float *__restrict__ x, int64_t k, int64_t ldx, int8_t *__restrict__ q,
                    int64_t ldq, float *__restrict__ scale, int32_t *__restrict__ sum)
{
    __shared__ float red_f[32];
    __shared__ int red_i[32];
    const float *row = x + blockIdx.x * ldx;
    int8_t *out = q + blockIdx.x * ldq;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float4 *row4 = reinterpret_cast<const float4 *>(row);

    float amax = 0.0f; /* fmaxf drops a NaN operand */
    if constexpr (VEC) {
        for (int64_t i = tid; i < k / 4; i += blockDim.x) {
            const float4 v = row4[i];
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
    } else {
        for (int64_t i = tid; i < k; i += blockDim.x)
            amax = fmaxf(amax, fabsf(row[i]));
    }
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0)
        red_f[warp] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        amax = fmaxf(amax, red_f[i]);
    if (!(amax >= 1e-5f))
        amax = 1e-5f;
    const float s = __fdiv_rn(127.0f, amax);

    int total = 0;
    if constexpr (VEC) {
        for (int64_t i = tid; i < ldq / 4; i += blockDim.x) {
            int c[4] = {0, 0, 0, 0};
            if (4 * i < k) { /* k is a multiple of 4: all four or none */
                const float4 v = row4[i];
                c[0] = quantize_code(v.x, s);
                c[1] = quantize_code(v.y, s);
                c[2] = quantize_code(v.z, s);
                c[3] = quantize_code(v.w, s);
            }
            reinterpret_cast<uint32_t *>(out)[i] = (uint32_t)(c[0] & 0xff) |
                                                   (uint32_t)(c[1] & 0xff) << 8 |
                                                   (uint32_t)(c[2] & 0xff) << 16 |
                                                   (uint32_t)(c[3] & 0xff) << 24;
            total += c[0] + c[1] + c[2] + c[3];
        }
    } else {
        for (int64_t i = tid; i < ldq; i += blockDim.x) {
            const int v = i < k ? quantize_code(row[i], s) : 0;
            out[i] = (int8_t)v;
            total += v;
        }
    }
    for (int o = 16; o > 0; o >>= 1)
        total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0)
        red_i[warp] = total;
    __syncthreads();
    if (tid == 0) {
        int t = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++)
            t += red_i[i];
        scale[blockIdx.x] = s;
        sum[blockIdx.x] = t;
    }
}

} // namespace

extern "C" cudaError_t bn_cuda_quantize_rows(const float *x, int64_t m, int64_t k, int64_t ldx,
                                             int8_t *q, int64_t ldq, float *scale, int32_t *sum,
                                             cudaStream_t stream)
{
    if (m <= 0)
        return cudaSuccess;
    /* One block per row; few rows (decode) get wide blocks so one row is not
     * walked by a handful of warps. */
    const unsigned threads = m < 64 ? 1024 : 256;
    const bool vec = k % 4 == 0 && ldx % 4 == 0 && ldq % 4 == 0 &&
                     (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(q) & 3) == 0;
    if (vec)
        quantize_kernel<true><<<(unsigned)m, threads, 0, stream>>>(x, k, ldx, q, ldq, scale, sum);
    else
        quantize_kernel<false><<<(unsigned)m, threads, 0, stream>>>(x, k, ldx, q, ldq, scale, sum);
    return cudaGetLastError();
}
