/*
 * sample_key.cuh - a token and its logit as one 64-bit key whose unsigned
 * order is the CPU sampler's order of preference (sample_kernels.cu's
 * comment): key = ordered(logit) << 32 | (0xffffffff - id), NaN counted as
 * -inf and -0 as +0, a lower id winning a tie. The greedy samplers
 * (sample_kernels.cu) and the screened LM head's argmax (head_screen.cu)
 * both take the largest key, so they choose the same token. The host reads
 * a key's token as 0xffffffff - (uint32_t)key (bn_cuda_key_token).
 */
#ifndef BN_SAMPLE_KEY_CUH
#define BN_SAMPLE_KEY_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ uint32_t ordered(float f)
{
    if (f != f)
        f = -INFINITY;
    if (f == 0.0f)
        f = 0.0f; /* -0 -> +0 */
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ float unordered(uint32_t u)
{
    return __uint_as_float((u & 0x80000000u) ? u & 0x7fffffffu : ~u);
}

__device__ __forceinline__ uint64_t make_key(float logit, int32_t id)
{
    return ((uint64_t)ordered(logit) << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

__device__ __forceinline__ float key_logit(uint64_t key) { return unordered((uint32_t)(key >> 32)); }
__device__ __forceinline__ int32_t key_id(uint64_t key)
{
    return (int32_t)(0xffffffffu - (uint32_t)key);
}

} // namespace

#endif
