/*
 * half_bits.cuh - 16-bit float bits to fp32 on the device, bit for bit as
 * the CPU converts them (src/core/fp16.c), NaN payloads included: the
 * embedding rows the GPU reads must be the CPU backend's exactly.
 */
#ifndef BN_HALF_BITS_CUH
#define BN_HALF_BITS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

/* IEEE half bits -> fp32, exact; NaN payloads kept (bn_fp16_to_fp32: the
 * hardware conversion need not keep them). */
static __device__ __forceinline__ float f16_bits_to_f32(uint16_t h)
{
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0)
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u |
                               ((uint32_t)(h & 0x3ffu) << 13));
    return __half2float(__ushort_as_half(h));
}

/* bfloat16 bits -> fp32: the upper half of the float's bits (exact). */
static __device__ __forceinline__ float bf16_bits_to_f32(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

#endif
