/*
 * rope.cuh - rotate-half RoPE with the CPU backend's fp32 operations, shared
 * by the q|k|v epilogue (rope_qkv.cu) and the decode attention, which turns
 * the token's q and k itself (attn_decode_block.cuh): both calling these
 * functions is what makes their values equal bit for bit.
 */
#ifndef BN_ROPE_CUH
#define BN_ROPE_CUH

#include <cuda_runtime.h>

/* cos and sin of the CPU's angle, (float)pos * inv_freq in fp32, computed
 * in double and rounded once to float (cosf/sinf of the same float). The
 * table kernel and the on-the-fly fallback both call this, so a tabulated
 * value is the computed one bit for bit. */
__device__ __forceinline__ float2 rope_cos_sin(int pos, float inv_freq)
{
    const float angle = __fmul_rn((float)pos, inv_freq);
    double sn, cs;
    sincos((double)angle, &sn, &cs);
    return make_float2(__double2float_rn(cs), __double2float_rn(sn));
}

/* A raw q|k|v value: through L2 from global memory (written by the kernel
 * before), or, kSm, from shared memory (the attention's own product). */
template <bool kSm, typename T> __device__ __forceinline__ T raw_ld(const T *p)
{
    if constexpr (kSm)
        return *p;
    else
        return __ldcg(p);
}

/* One value of a rotate-half RoPE pair, both values already scaled: mine is
 * the value being computed, partner the one half a rotation away, cs the
 * pair's (cos, sin). The CPU's fp32 operations (rope_heads in
 * cpu_backend.c), with x0 the low value and x1 the high one:
 *
 *   low side (d < half):          x0 c - x1 s   = mine c - partner s
 *   high side (half <= d < 2 half): x1 c + x0 s = mine c + partner s
 */
__device__ __forceinline__ float rope_pair(float mine, float partner, bool low, float2 cs)
{
    const float a = __fmul_rn(mine, cs.x), b = __fmul_rn(partner, cs.y);
    return low ? __fsub_rn(a, b) : __fadd_rn(a, b);
}

/* Value d of one head after its scale and rotate-half RoPE, from the head's
 * raw values (values beyond 2 half are only scaled). cs is the (cos, sin)
 * of pair d mod half (ignored beyond 2 half). The raw values come from the
 * previous kernel, read through L2 (under programmatic dependent launch it
 * may have run alongside: never a stale L1 line), or (kSm) from shared
 * memory (raw_ld). */
template <bool kSm = false>
__device__ __forceinline__ float rope_value(const float *head, int d, float sc, int half,
                                            float2 cs)
{
    if (d < 2 * half) {
        const bool low = d < half;
        const float mine = __fmul_rn(raw_ld<kSm>(head + d), sc);
        const float partner = __fmul_rn(raw_ld<kSm>(head + (low ? d + half : d - half)), sc);
        return rope_pair(mine, partner, low, cs);
    }
    return __fmul_rn(raw_ld<kSm>(head + d), sc);
}

#endif
