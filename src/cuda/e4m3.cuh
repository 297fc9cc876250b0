/*
 * e4m3.cuh - reading fp8 e4m3 values (the 8-bit KV cache's element,
 * kv_store.cuh): four bytes as two fp16 pairs (every e4m3 value is an fp16
 * exactly), one cvt instruction a pair from sm_89 on, cuda_fp8.h's
 * conversion (integer operations) before.
 */
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* Bytes 0, 1 of x as an fp16 pair (lo: byte 0 in the low half), bytes 2,
 * 3 (hi). */
static __device__ __forceinline__ void e4m3x4_to_f16(uint32_t x, uint32_t &lo, uint32_t &hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
#else
    const __half2_raw a =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x >> 16), __NV_E4M3);
    lo = (uint32_t)a.x | (uint32_t)a.y << 16;
    hi = (uint32_t)b.x | (uint32_t)b.y << 16;
#endif
}

/* Four e4m3 bytes (x's, byte 0 first) as floats. */
static __device__ __forceinline__ float4 e4m3x4_to_float4(uint32_t x)
{
    uint32_t lo, hi;
    e4m3x4_to_f16(x, lo, hi);
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&hi));
    return make_float4(a.x, a.y, b.x, b.y);
}
