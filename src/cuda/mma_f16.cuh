/*
 * mma_f16.cuh - fp16 tensor-core pieces the attention kernels share:
 * mma.sync m16n8k16 with fp32 accumulators, ldmatrix (plain and
 * transposed), and the split of fp32 values into fp16 hi + lo parts.
 */
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

/* c += a b: A 16 x 16 (row), B 16 x 8 (col), fp16 inputs, fp32 sums. */
static __device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8 x 8 b16 matrices from shared memory: lane l gives the address of
 * row l % 8 of matrix l / 8; lane (g, t) receives row g, columns 2t, 2t + 1
 * of each. */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *smem_row)
{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* The same, transposed: lane (g, t) receives rows 2t, 2t + 1 of column g. */
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *smem_row)
{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* a, b rounded to a packed fp16 pair (a in the low half). */
static __device__ __forceinline__ uint32_t f16x2_of(float a, float b)
{
    const __half2 h = __floats2half2_rn(a, b);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* x0, x1 as packed fp16 pairs hi (rounded) and lo (hi's rounding error,
 * rounded): hi + lo keeps ~22 significant bits of each value. */
static __device__ __forceinline__ void split_f16x2(float x0, float x1, uint32_t &hi, uint32_t &lo)
{
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 back = __half22float2(h);
    const __half2 l = __floats2half2_rn(x0 - back.x, x1 - back.y);
    memcpy(&hi, &h, sizeof hi);
    memcpy(&lo, &l, sizeof lo);
}
