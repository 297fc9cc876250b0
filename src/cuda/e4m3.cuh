/*
 * e4m3.cuh - reading fp8 e4m3 values (the 8-bit KV cache's element,
 * kv_store.cuh): four bytes as two fp16 pairs, one cvt instruction a pair
 * (sm_89 and up; every e4m3 value is an fp16 exactly).
 */
#pragma once

#include <stdint.h>

/* Bytes 0, 1 of x as an fp16 pair (lo: byte 0 in the low half), bytes 2,
 * 3 (hi). */
static __device__ __forceinline__ void e4m3x4_to_f16(uint32_t x, uint32_t &lo, uint32_t &hi)
{
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
}
