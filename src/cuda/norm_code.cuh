/*
 * norm_code.cuh - the CPU backend's RMSNorm + int8 rounding rule on the
 * GPU: the inverse RMS, the exact code of a normed value without a double
 * division per value (ExactCoder, with its proof), and the plain rule for
 * tiny or non-finite rows. Shared by the norm kernels (norm_quantize.cu)
 * and the products that norm their own output (w2a8_gemm_norm.cu).
 */
#ifndef BN_NORM_CODE_CUH
#define BN_NORM_CODE_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace
{

constexpr float kQuantEps = 1e-5f; /* BN_QUANT_EPS */

/* 1 / sqrtf((float)(ss / n) + eps), as the CPU writes it. */
__device__ __forceinline__ float inv_rms(double ss, int64_t n, float eps)
{
    const float mean = __double2float_rn(__ddiv_rn(ss, (double)n));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

/* ---- the exact code without a division per value ----------------------------------
 *
 * The CPU's code of value i is rint(D) with D = fl64(127 * fl64(P / M)),
 * P = w_i x_i and M = max|w x| (both exact in double: a product of two
 * floats has at most 48 significant bits and an exponent in [-298, 256]).
 * A double division per value is slow on the GPU (a software sequence), so
 * an fp32 estimate
 *
 *     t = fl32(fl32(w_i * x_i) * r),   r = fl32(127 / fl32(M))
 *
 * decides the code n = rint(t) whenever |t - n| < 1/2 - 2^-12; otherwise the
 * double expression itself is evaluated. Why that is the same integer:
 *
 *  - with 2^-100 <= M <= 2^100 (else every value takes the double path),
 *    fl32(M) and r are normal floats, |P| <= M so nothing overflows, and
 *    |t| <= ~127. Each of the four roundings is relative, at most u = 2^-24,
 *    where its result is a normal float, so t = e (1 + d) with
 *    e = 127 P / M and |d| <= (1 + u)^3 / (1 - u) - 1 < 4.0001 u, i.e.
 *    |t - e| <= 127 * 4.0001 * 2^-24 < 3.03e-5. Where fl32(P) or t is
 *    subnormal the rounding is absolute instead: at most 2^-150 * r <=
 *    2^-150 * 127 * 2^100 (1 + u)^2 < 2^-42, resp. 2^-150: negligible.
 *  - D = e (1 + d1)(1 + d2) with |d1|, |d2| <= 2^-53 (P / M is a normal
 *    double or 0), so |D - e| <= 127 * 2.0001 * 2^-53 < 2.9e-14.
 *  - Hence |D - n| <= |t - n| + |t - D| < 1/2 - 2^-12 + 3.1e-5 < 1/2: D is
 *    nearer to n than to any other integer and rint(D) = n.
 *
 * Only values within 2^-12 of a half-integer (and NaN products, for which
 * the comparison fails) pay for the division. */
constexpr float kTieGuard = 0.5f - 0x1p-12f;

struct ExactCoder {
    double umax;
    float r;
    bool fast;

    __device__ explicit ExactCoder(double m) : umax(m), r(0.0f), fast(m >= 0x1p-100 && m <= 0x1p100)
    {
        if (fast)
            r = __fdiv_rn(127.0f, __double2float_rn(m));
    }

    __device__ __forceinline__ int code(float w, float v) const
    {
        if (fast) {
            const float t = __fmul_rn(__fmul_rn(w, v), r);
            const float n = rintf(t);
            if (fabsf(__fsub_rn(t, n)) < kTieGuard)
                return (int)n;
        }
        return exact(w, v, umax);
    }

    /* The double expression itself: rint(127 (w v / M)), w v exact in
     * double. */
    __device__ __forceinline__ static int exact(float w, float v, double m)
    {
        const double ratio = __ddiv_rn(__dmul_rn((double)w, (double)v), m);
        return (int)rint(__dmul_rn(127.0, ratio));
    }
};

/* The plain rule for tiny or non-finite rows: the normed value times the
 * fp32 scale, rounded half to even, NaN to 0, clamped. */
__device__ __forceinline__ int plain_code(float w, float v, float inv, float s)
{
    const float t = rintf(__fmul_rn(__fmul_rn(w, __fmul_rn(v, inv)), s));
    return t != t ? 0 : t > 127.0f ? 127 : t < -128.0f ? -128 : (int)t;
}

} // namespace

#endif
