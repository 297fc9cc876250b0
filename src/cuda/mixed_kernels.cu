/*
 * mixed_kernels.cu - fp32 <-> fp16 / bf16 conversion on the GPU for the
 * mixed-precision matmul (mixed_matmul.h).
 *
 * The results must equal the CPU conversions of src/quant/fp16.c bit for bit
 * (tests compare them), including NaN payloads, subnormals and overflow, so
 * the kernels work on integer bit patterns rather than through the
 * hardware's cvt instructions: cvt replaces every NaN by one canonical NaN,
 * and its subnormal handling depends on the -ftz compile flags. The rules:
 *
 *   fp32 -> fp16  round to nearest, ties to even (also in the subnormal
 *                 range); |x| >= 65520 becomes infinity; a NaN keeps its
 *                 sign and the top 10 payload bits, made non-zero.
 *   fp32 -> bf16  round to nearest, ties to even, overflow carries into
 *                 infinity; a NaN keeps its top 16 bits and becomes quiet.
 *   back          exact (every fp16 and bf16 value is an fp32 value).
 *
 * Memory-bound elementwise loops: a grid-stride loop with enough blocks to
 * fill the GPU; the conversions cost a few integer operations per element.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "mixed_matmul.h"

namespace {

constexpr int kThreads = 256;
/* Enough blocks for every SM of current GPUs to hold several; the loop
 * strides over the rest. */
constexpr int64_t kMaxBlocks = 8192;

__device__ __forceinline__ uint16_t f32_to_f16_bits(uint32_t u)
{
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) { /* NaN */
        const uint32_t payload = (mag >> 13) & 0x3ffu;
        return (uint16_t)(sign | 0x7c00u | (payload ? payload : 1u));
    }
    if (mag >= 0x477ff000u) /* 65520 and up (infinity too) round past 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (mag >= 0x38800000u) {
        /* A normal half (>= 2^-14): rebias the exponent (127 -> 15) in place,
         * then round away the 13 low mantissa bits; 0xfff plus the lowest
         * kept bit makes exact halves round to even. A carry ripples into
         * the exponent, which is the correct next value. */
        uint32_t v = mag - 0x38000000u;
        v += 0xfffu + ((v >> 13) & 1u);
        return (uint16_t)(sign | (v >> 13));
    }
    if (mag < 0x33000000u) /* below 2^-25: nearer to zero than to 2^-24 */
        return (uint16_t)sign;
    /* Subnormal half: count units of 2^-24. The float is
     * (mantissa | implicit one) * 2^(e - 150), so the count is that
     * significand shifted right by 126 - e, which is 14 ... 24 here. */
    const uint32_t e = mag >> 23;
    const uint32_t significand = (mag & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;
    uint32_t q = significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1u);
    const uint32_t half_unit = 1u << (shift - 1u);
    if (rest > half_unit || (rest == half_unit && (q & 1u)))
        q++; /* from the largest subnormal this carries into the smallest normal */
    return (uint16_t)(sign | q);
}

__device__ __forceinline__ uint32_t f16_bits_to_f32_bits(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu;
    const uint32_t m = h & 0x3ffu;
    if (e == 0x1fu)
        return sign | 0x7f800000u | (m << 13);
    if (e != 0)
        return sign | ((e + 112u) << 23) | (m << 13);
    if (m == 0)
        return sign;
    /* Subnormal: m * 2^-24 with the leading one at bit p (0..9) is
     * 1.f * 2^(p - 24); biased exponent p - 24 + 127. */
    const uint32_t p = 31u - (uint32_t)__clz(m);
    return sign | ((p + 103u) << 23) | ((m << (23u - p)) & 0x7fffffu);
}

__device__ __forceinline__ uint16_t f32_to_bf16_bits(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void f32_to_f16_kernel(const float *__restrict__ src, uint16_t *__restrict__ dst,
                                  int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = f32_to_f16_bits(__float_as_uint(src[i]));
}

__global__ void f32_to_bf16_kernel(const float *__restrict__ src, uint16_t *__restrict__ dst,
                                   int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = f32_to_bf16_bits(__float_as_uint(src[i]));
}

__global__ void f16_to_f32_kernel(const uint16_t *__restrict__ src, float *__restrict__ dst,
                                  int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __uint_as_float(f16_bits_to_f32_bits(src[i]));
}

__global__ void bf16_to_f32_kernel(const uint16_t *__restrict__ src, float *__restrict__ dst,
                                   int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

unsigned blocks_for(int64_t n)
{
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

/* Shared launcher shape: nothing to do for n == 0 (a zero-block launch is an
 * error), and the launch error (cudaSuccess when queued) as the result. */
template <typename In, typename Out>
cudaError_t launch(void (*kernel)(const In *, Out *, int64_t), const In *src, Out *dst,
                   int64_t n, cudaStream_t stream)
{
    if (n < 0 || (n > 0 && (!src || !dst)))
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, dst, n);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t bn_cuda_convert_f32_to_f16(const float *src, uint16_t *dst, int64_t n,
                                                  cudaStream_t stream)
{
    return launch(f32_to_f16_kernel, src, dst, n, stream);
}

extern "C" cudaError_t bn_cuda_convert_f32_to_bf16(const float *src, uint16_t *dst, int64_t n,
                                                   cudaStream_t stream)
{
    return launch(f32_to_bf16_kernel, src, dst, n, stream);
}

extern "C" cudaError_t bn_cuda_convert_f16_to_f32(const uint16_t *src, float *dst, int64_t n,
                                                  cudaStream_t stream)
{
    return launch(f16_to_f32_kernel, src, dst, n, stream);
}

extern "C" cudaError_t bn_cuda_convert_bf16_to_f32(const uint16_t *src, float *dst, int64_t n,
                                                   cudaStream_t stream)
{
    return launch(bf16_to_f32_kernel, src, dst, n, stream);
}
