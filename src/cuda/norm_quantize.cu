/*
 * norm_quantize.cu - the CUDA backend's RMSNorm + int8 quantization with the
 * CPU backend's exact rounding rule, for four row sources (a row, a residual
 * add, the squared-ReLU gate of gate and up, the embedding row of the decode
 * step's token), and the output RMSNorm: the kernels between the W2A8
 * products of a layer. Contracts: cuda_backend_kernels.h.
 *
 * As in ops_kernels.cu, every fp32 operation the CPU performs separately
 * is written with an __f*_rn intrinsic, because nvcc would otherwise fuse
 * a multiply and an add into one FMA with a single rounding, and the codes
 * of the next quantization would then differ from the CPU's. Double
 * operations use __d*_rn for the same reason.
 *
 * The decode step is latency-bound (one token: a few KB per kernel), so its
 * kernels are written for latency: a row is loaded once, with every load in
 * flight at once, into registers; reductions take one barrier pair each;
 * what does not depend on the previous kernel is loaded before waiting for
 * it (programmatic dependent launch, pdl.cuh).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "attn_paged_shares.cuh"
#include "block_reduce.cuh"
#include "cuda_backend_kernels.h"
#include "half_bits.cuh"
#include "pdl.cuh"
#include "qtype.h"
#include "w2a8_cuda.h"
#include "w2a8_epilogue.cuh"

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kNormThreads = 512;
constexpr int kRowThreads = 1024;  /* the register-held row kernels: at most  */
constexpr int kRowMaxPer = 8;      /* values per thread, so rows up to 8192   */
constexpr int kRowMaxM = 256;      /* rows; more go to the lean kernel's batch
                                      form (or the streaming kernel)        */
constexpr float kQuantEps = 1e-5f; /* BN_QUANT_EPS */

/* The register-held row kernel's shape for a row of k values (k <= 8192):
 * values per thread and threads. */
__host__ __device__ __forceinline__ int row_per(int64_t k)
{
    return k <= kRowThreads ? 1 : k <= 2 * kRowThreads ? 2 : k <= 4 * kRowThreads ? 4 : 8;
}
__host__ __device__ __forceinline__ int row_threads(int64_t k)
{
    const int per = row_per(k);
    return (int)(((k + per - 1) / per + 31) / 32 * 32);
}

/* ---- block reductions (every thread gets the result; block_reduce.cuh) -------- */

struct SumD {
    __device__ double operator()(double a, double b) const { return __dadd_rn(a, b); }
};
struct MaxF {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumI {
    __device__ int operator()(int a, int b) const { return a + b; }
};

/* The sum of ss and the maximum of umax over the block in one round (one
 * barrier pair instead of two: the norm kernels are latency-bound on a
 * single row). Both levels are xor butterflies, after which every lane holds
 * the same value (each step adds the same two operands in both partners),
 * so all threads leave with identical results; the second level is 5
 * shuffles instead of a chain of up to 32 dependent adds. The padding
 * lanes add 0, which changes neither (ss >= 0, umax >= 0). fmax returns the
 * other operand for a NaN, as the CPU's `u > umax` skips it. red: 64 shared
 * slots; any multiple of 32 threads up to 1024. */
__device__ void block_sum_max(double &ss, double &umax, double *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (int)(blockDim.x >> 5);
    for (int o = 16; o > 0; o >>= 1) {
        ss = __dadd_rn(ss, __shfl_xor_sync(kFull, ss, o));
        umax = fmax(umax, __shfl_xor_sync(kFull, umax, o));
    }
    if (lane == 0) {
        red[warp] = ss;
        red[32 + warp] = umax;
    }
    __syncthreads();
    ss = lane < warps ? red[lane] : 0.0;
    umax = lane < warps ? red[32 + lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) {
        ss = __dadd_rn(ss, __shfl_xor_sync(kFull, ss, o));
        umax = fmax(umax, __shfl_xor_sync(kFull, umax, o));
    }
    __syncthreads();
}

/* The same for the normed maximum (fp32, >= 0) and the sum of the codes.
 * red_f, red_i: 32 shared slots each. */
__device__ void block_max_sum(float &amax, int &total, float *red_f, int *red_i)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (int)(blockDim.x >> 5);
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, o));
        total += __shfl_xor_sync(kFull, total, o);
    }
    if (lane == 0) {
        red_f[warp] = amax;
        red_i[warp] = total;
    }
    __syncthreads();
    amax = lane < warps ? red_f[lane] : 0.0f;
    total = lane < warps ? red_i[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, o));
        total += __shfl_xor_sync(kFull, total, o);
    }
    __syncthreads();
}

/* ---- RMSNorm + quantization ----------------------------------------------------- */

constexpr int kSrcPlain = 0, kSrcAdd = 1, kSrcRelu2 = 2;
/* The decode step's first norm reading its row from the embedding table
 * (the lean kernel only: bn_cb_embed_norm_quantize). */
constexpr int kSrcEmbed = 4;
/* The batched pass's attn_sub_norm reading its rows from the paged
 * attention's shares (the lean kernel only: bn_cb_merge_norm_quantize). */
constexpr int kSrcMerge = 5;
/* x += the W2A8 epilogue of a row of int32 sums (bn_w2a8_cuda_gemm_add_sums)
 * over the codes whose scale and sum this kernel then overwrites; the sums
 * are zeroed (the lean kernel only: bn_cb_add_sums_norm_quantize). */
constexpr int kSrcSums = 6;

struct NormQuantArgs {
    float *x;        /* plain / add: the row source (add writes x + r back) */
    int64_t ldx;
    const float *r;  /* add: the residual to add                           */
    int64_t ldr;
    const float *g, *u; /* relu2: raw gate and up rows                     */
    int64_t ldgu;
    float sg, su;
    const void *embed;     /* embed: the table (F32 / F16 / BF16 rows of k)  */
    int embed_type;        /* ... its bn_qtype                                */
    const int32_t *token;  /* ... the row to read, in device memory           */
    int32_t *sums;         /* sums: the product's int32 sums, zeroed here     */
    int64_t ld_sums;
    float sums_w_scale;      /* ... its weight scale                            */
    const float *part;       /* merge: the attention's shares                   */
    const int32_t *part_pos; /* ... each row's position                         */
    int part_splits, part_heads, part_hd;
    int64_t k;
    const float *w;
    float eps;
    int8_t *q;
    int64_t ldq;
    float *scale;
    int32_t *sum;
};

/* Value i of row `row` for the first pass (which, for kSrcAdd, performs the
 * add and stores it) and for the later passes (which read it back: the
 * same thread wrote it, so no barrier is needed).
 *
 * Rows come from the previous kernel, which under programmatic dependent
 * launch may have run alongside this one: they are read through L2
 * (__ldcg), never from a possibly stale L1 line or the read-only path. */
template <int kSrc>
__device__ __forceinline__ float source_value(const NormQuantArgs &a, int64_t row, int64_t i,
                                              bool first)
{
    if (kSrc == kSrcPlain)
        return __ldcg(a.x + row * a.ldx + i);
    if (kSrc == kSrcAdd) {
        float *p = a.x + row * a.ldx + i;
        if (!first)
            return __ldcg(p);
        const float v = __fadd_rn(__ldcg(p), __ldcg(a.r + row * a.ldr + i));
        *p = v;
        return v;
    }
    /* relu(gate)^2 * up with gate = g * sg and up = u * su, each one fp32
     * rounding as in the CPU's epilogue; a NaN gate counts as 0. */
    const float gate = __fmul_rn(__ldcg(a.g + row * a.ldgu + i), a.sg);
    const float up = __fmul_rn(__ldcg(a.u + row * a.ldgu + i), a.su);
    const float rg = gate > 0.0f ? gate : 0.0f;
    return __fmul_rn(__fmul_rn(rg, rg), up);
}

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

/* The last pass of the streaming kernels: row `row`'s codes (zeros from k
 * to ldq) under the exact rule or, for tiny or non-finite rows, the plain
 * one with scale s; its scale and the sum of its codes stored by thread 0. */
template <int kSrc>
__device__ void store_codes(const NormQuantArgs &a, int64_t row, double umax, float amax,
                            float inv, int *red_i)
{
    const bool exact = amax >= kQuantEps && umax > 0.0 && isfinite(umax);
    const float s = exact ? __fdiv_rn(127.0f, amax)
                          : __fdiv_rn(127.0f, amax >= kQuantEps ? amax : kQuantEps);
    const ExactCoder coder(umax);
    int8_t *out = a.q + row * a.ldq;
    int total = 0;
    for (int64_t i = threadIdx.x; i < a.ldq; i += kNormThreads) {
        int val = 0;
        if (i < a.k) {
            const float v = source_value<kSrc>(a, row, i, false);
            val = exact ? coder.code(a.w[i], v) : plain_code(a.w[i], v, inv, s);
        }
        out[i] = (int8_t)val;
        total += val;
    }
    total = block_reduce(total, SumI(), red_i);
    if (threadIdx.x == 0) {
        a.scale[row] = s;
        a.sum[row] = total;
    }
}

/* Long rows (more than kRowThreads * kRowMaxPer values) and many rows: one
 * block of kNormThreads per row, three passes over the row. */
template <int kSrc>
__global__ void __launch_bounds__(kNormThreads) norm_quantize_kernel(NormQuantArgs a)
{
    __shared__ double red_d[64];
    __shared__ float red_f[32];
    __shared__ int red_i[32];
    const int64_t row = blockIdx.x;
    const int64_t k = a.k;
    const float *w = a.w;
    pdl_trigger();
    pdl_wait();

    /* Pass 1: sum of squares and max |w x|, both exact per element in
     * double (x^2 is exact, so the fma is the add of the CPU's sum). */
    double ss = 0.0, umax = 0.0;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads) {
        const float v = source_value<kSrc>(a, row, i, true);
        ss = __fma_rn((double)v, (double)v, ss);
        umax = fmax(umax, fabs(__dmul_rn((double)w[i], (double)v)));
    }
    block_sum_max(ss, umax, red_d);
    const float inv = inv_rms(ss, k, a.eps);

    /* Pass 2: the largest normed value in fp32 (sets the scale). */
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads) {
        const float v = source_value<kSrc>(a, row, i, false);
        amax = fmaxf(amax, fabsf(__fmul_rn(w[i], __fmul_rn(v, inv))));
    }
    amax = block_reduce(amax, MaxF(), red_f);

    /* Pass 3: the codes. The exact rule needs a usable maximum; tiny or
     * non-finite rows take the plain fp32 rule, as on the CPU. */
    store_codes<kSrc>(a, row, umax, amax, inv, red_i);
}

/* Rows of at most blockDim.x * kPer values (the decode step's): value
 * i = threadIdx.x + j * blockDim.x of the row lives in register j of its
 * thread, loaded once with all loads in flight, so the kernel is one
 * round trip to memory and two block reductions:
 *
 *   1. sum of squares and max|w x| (double, exact per element);
 *   2. the normed maximum (fp32) and the codes under the exact rule, with
 *      the sum of those codes;
 *   3. only for rows the exact rule does not apply to (tiny or non-finite,
 *      block-uniform): the plain-rule codes and their sum.
 *
 * The results are those of norm_quantize_kernel: the same expressions,
 * and integer sums and maxima do not depend on order (the double sum of
 * squares does, within the contract). */
template <int kSrc, int kPer>
__global__ void __launch_bounds__(kRowThreads, 1) norm_quantize_row_kernel(NormQuantArgs a)
{
    __shared__ double red_d[64];
    __shared__ float red_f[32];
    __shared__ int red_i[32];
    const int64_t row = blockIdx.x;
    const int k = (int)a.k, T = (int)blockDim.x, tid = (int)threadIdx.x;

    /* The norm weights never change: read them while the kernel that
     * produces the row may still be running. The row itself is read after
     * the wait, through L2 (see source_value). */
    float w[kPer];
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        const int i = tid + j * T;
        w[j] = i < k ? a.w[i] : 0.0f;
    }
    pdl_trigger();
    pdl_wait();

    float v[kPer];
    if (kSrc == kSrcPlain) {
        const float *x = a.x + row * a.ldx;
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            const int i = tid + j * T;
            v[j] = i < k ? __ldcg(x + i) : 0.0f;
        }
    } else if (kSrc == kSrcAdd) {
        float *x = a.x + row * a.ldx;
        const float *r = a.r + row * a.ldr;
        float rv[kPer];
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            const int i = tid + j * T;
            v[j] = i < k ? __ldcg(x + i) : 0.0f;
            rv[j] = i < k ? __ldcg(r + i) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            const int i = tid + j * T;
            v[j] = __fadd_rn(v[j], rv[j]);
            if (i < k)
                x[i] = v[j];
        }
    } else {
        const float *g = a.g + row * a.ldgu, *u = a.u + row * a.ldgu;
        float gv[kPer], uv[kPer];
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            const int i = tid + j * T;
            gv[j] = i < k ? __ldcg(g + i) : 0.0f;
            uv[j] = i < k ? __ldcg(u + i) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            /* As source_value: one fp32 rounding per step, NaN gate -> 0. */
            const float gate = __fmul_rn(gv[j], a.sg);
            const float up = __fmul_rn(uv[j], a.su);
            const float rg = gate > 0.0f ? gate : 0.0f;
            v[j] = __fmul_rn(__fmul_rn(rg, rg), up);
        }
    }

    double ss = 0.0, umax = 0.0;
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        if (tid + j * T < k) {
            ss = __fma_rn((double)v[j], (double)v[j], ss);
            umax = fmax(umax, fabs(__dmul_rn((double)w[j], (double)v[j])));
        }
    }
    block_sum_max(ss, umax, red_d);
    const float inv = inv_rms(ss, k, a.eps);
    const bool usable = umax > 0.0 && isfinite(umax);
    const ExactCoder coder(umax);

    float amax = 0.0f;
    int code[kPer];
    int total = 0;
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        code[j] = 0;
        if (tid + j * T < k) {
            amax = fmaxf(amax, fabsf(__fmul_rn(w[j], __fmul_rn(v[j], inv))));
            if (usable)
                code[j] = coder.code(w[j], v[j]);
        }
        total += code[j];
    }
    block_max_sum(amax, total, red_f, red_i);

    const bool exact = amax >= kQuantEps && usable;
    float s;
    if (exact) {
        s = __fdiv_rn(127.0f, amax);
    } else {
        s = __fdiv_rn(127.0f, amax >= kQuantEps ? amax : kQuantEps);
        total = 0;
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            code[j] = tid + j * T < k ? plain_code(w[j], v[j], inv, s) : 0;
            total += code[j];
        }
        float unused = 0.0f;
        block_max_sum(unused, total, red_f, red_i);
    }

    int8_t *out = a.q + row * a.ldq;
#pragma unroll
    for (int j = 0; j < kPer; j++) {
        const int i = tid + j * T;
        if (i < k)
            out[i] = (int8_t)code[j];
    }
    for (int64_t i = k + tid; i < a.ldq; i += T)
        out[i] = 0;
    if (tid == 0) {
        a.scale[row] = s;
        a.sum[row] = total;
    }
}

/* ---- a norm over rows split across ranks (tensor parallelism) ---------------------
 *
 * Under tensor parallelism a rank holds only its columns of the attn_sub and
 * ffn_sub norms' rows. The whole row's statistics are its sum of squares and
 * max|w x|: each rank computes them over its columns (norm_part_stats_kernel),
 * the ranks exchange them (an all-gather of [ranks][m][2] doubles), and each
 * rank codes its columns with the combined values (norm_part_codes_kernel),
 * adding the parts in rank order so that every rank gets the same scale.
 * The codes follow the exact rule of the whole-row kernels (max|w x| does
 * not depend on order); the scale's normed maximum is max|w x| times the
 * inverse RMS rather than the maximum of the rounded normed values, which
 * is the same number up to an ulp or two of fp32. */
template <int kSrc>
__global__ void __launch_bounds__(kNormThreads) norm_part_stats_kernel(NormQuantArgs a,
                                                                      double *stats)
{
    __shared__ double red_d[64];
    const int64_t row = blockIdx.x;
    double ss = 0.0, umax = 0.0;
    for (int64_t i = threadIdx.x; i < a.k; i += kNormThreads) {
        const float v = source_value<kSrc>(a, row, i, false);
        ss = __fma_rn((double)v, (double)v, ss);
        umax = fmax(umax, fabs(__dmul_rn((double)a.w[i], (double)v)));
    }
    block_sum_max(ss, umax, red_d);
    if (threadIdx.x == 0) {
        stats[2 * row] = ss;
        stats[2 * row + 1] = umax;
    }
}

template <int kSrc>
__global__ void __launch_bounds__(kNormThreads)
    norm_part_codes_kernel(NormQuantArgs a, const double *stats, int ranks, int64_t k_total)
{
    __shared__ int red_i[32];
    const int64_t row = blockIdx.x, m = gridDim.x;
    double ss = 0.0, umax = 0.0;
    for (int r = 0; r < ranks; r++) {
        ss = __dadd_rn(ss, stats[2 * (r * m + row)]);
        umax = fmax(umax, stats[2 * (r * m + row) + 1]);
    }
    const float inv = inv_rms(ss, k_total, a.eps);
    store_codes<kSrc>(a, row, umax, __fmul_rn(__double2float_rn(umax), inv), inv, red_i);
}

/* Four codes as the four bytes of one char4 store. */
__device__ __forceinline__ char4 pack_codes4(const int (&c)[4])
{
    return make_char4((signed char)c[0], (signed char)c[1], (signed char)c[2], (signed char)c[3]);
}

/* relu(g * sg)^2 * (u * su) of four values, with source_value's
 * expressions (one fp32 rounding per step, a NaN gate counts as 0). */
__device__ __forceinline__ float4 relu2_gate4(float4 g, float4 u, float sg, float su)
{
    const float *gp = &g.x, *up = &u.x;
    float4 v;
    float *vp = &v.x;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float gate = __fmul_rn(gp[e], sg);
        const float upv = __fmul_rn(up[e], su);
        const float rg = gate > 0.0f ? gate : 0.0f;
        vp[e] = __fmul_rn(__fmul_rn(rg, rg), upv);
    }
    return v;
}

/* ---- the lean row kernel: rows of 4-aligned values, fewer instructions ----------
 *
 * The decode step runs four norm + int8 rows per layer, each as one block on
 * one SM, so its time is the block's critical path (Nsight Compute: the
 * register-held kernel above issues ~750 instructions per warp over 20 warps
 * for a 2560-value row, 3.4 us of issue). This kernel computes the same
 * codes, scale and sum with about a third of the work per value:
 *
 *   - float4 loads and char4 stores (one or two per thread, so each
 *     thread's chain of dependent instructions stays short: the block is
 *     latency-bound, not issue-bound, with fewer values per thread);
 *   - the exact rule's maximum M = max|w v| comes out of the first pass and
 *     reduction (a double product per value); fl32(M) is the largest fp32
 *     product, all the fp32 estimate of ExactCoder needs (r = 127 / fl32(M));
 *   - the estimate t = fl(fl(w v) r) reuses the first pass's product. Values
 *     whose t is within 2^-12 of a tie (or NaN, or every value when fl32(M)
 *     is outside [2^-100, 2^100]) are coded with the double expression in
 *     the same pass: M is known by then, so no third step is needed (the
 *     decode trace showed that step, run for most rows of 2560 values,
 *     costing about as much as a reduction).
 *
 * Reductions: (1) the double sum of squares and M; (2) the normed maximum
 * and the codes' sum. Each is a butterfly within the warps, then the same
 * butterfly over the warps' partials in every warp, so all threads hold the
 * same values. The double sum of squares is added in this kernel's order
 * (within the contract). */
constexpr int kLeanThreads = 1024; /* at most; one float4 per thread up to 4096 values */

struct LeanRed {
    double d[2][32];
    float f[32];
    int i[32];
};

/* The sum of v over the block, the same in every thread: a butterfly in
 * each warp, then the same butterfly over the warps' sums in every warp.
 * slots: 32 shared ints, free once every thread has passed the first
 * barrier. */
__device__ __forceinline__ int lean_block_sum(int v, int *slots)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFull, v, o);
    __syncthreads();
    if (lane == 0)
        slots[warp] = v;
    __syncthreads();
    v = lane < W ? slots[lane] : 0;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFull, v, o);
    return v;
}

/* Values tid + j T (j < KV4, in float4 units; 0 past the row) of row `row`
 * as float4s, with source_value's expressions, through L2; kSrcAdd writes
 * x + r back. */
template <int kSrc, int KV4>
__device__ __forceinline__ void load_row4(const NormQuantArgs &a, int64_t row, int tid, int T,
                                          float4 (&v)[KV4])
{
    const int k4 = (int)(a.k / 4);
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (kSrc == kSrcPlain) {
        const float4 *x = reinterpret_cast<const float4 *>(a.x + row * a.ldx);
#pragma unroll
        for (int j = 0; j < KV4; j++)
            v[j] = tid + j * T < k4 ? __ldcg(x + tid + j * T) : z4;
    } else if (kSrc == kSrcAdd) {
        float4 *x = reinterpret_cast<float4 *>(a.x + row * a.ldx);
        const float4 *r = reinterpret_cast<const float4 *>(a.r + row * a.ldr);
        float4 rv[KV4];
#pragma unroll
        for (int j = 0; j < KV4; j++) {
            const bool in = tid + j * T < k4;
            v[j] = in ? __ldcg(x + tid + j * T) : z4;
            rv[j] = in ? __ldcg(r + tid + j * T) : z4;
        }
#pragma unroll
        for (int j = 0; j < KV4; j++) {
            v[j] = make_float4(__fadd_rn(v[j].x, rv[j].x), __fadd_rn(v[j].y, rv[j].y),
                               __fadd_rn(v[j].z, rv[j].z), __fadd_rn(v[j].w, rv[j].w));
            if (tid + j * T < k4)
                x[tid + j * T] = v[j];
        }
    } else if (kSrc == kSrcSums) {
        /* The product's values are the GEMM epilogue of its sums over the
         * codes of this row (scale and sum written at the end of this block,
         * after every thread has read them here), as the GEMM would have
         * written them; then the residual add, as kSrcAdd. */
        float4 *x = reinterpret_cast<float4 *>(a.x + row * a.ldx);
        int4 *t = reinterpret_cast<int4 *>(a.sums + row * a.ld_sums);
        const float ps = __ldcg(a.scale + row);
        const int32_t pz = __ldcg(a.sum + row);
        int4 tv[KV4];
#pragma unroll
        for (int j = 0; j < KV4; j++) {
            const bool in = tid + j * T < k4;
            v[j] = in ? __ldcg(x + tid + j * T) : z4;
            tv[j] = in ? __ldcg(t + tid + j * T) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < KV4; j++) {
            if (tid + j * T >= k4)
                continue; /* padding stays 0: the epilogue of no sums is not */
            const float4 y = make_float4(w2a8_epilogue(tv[j].x - pz, ps, a.sums_w_scale),
                                         w2a8_epilogue(tv[j].y - pz, ps, a.sums_w_scale),
                                         w2a8_epilogue(tv[j].z - pz, ps, a.sums_w_scale),
                                         w2a8_epilogue(tv[j].w - pz, ps, a.sums_w_scale));
            v[j] = make_float4(__fadd_rn(v[j].x, y.x), __fadd_rn(v[j].y, y.y),
                               __fadd_rn(v[j].z, y.z), __fadd_rn(v[j].w, y.w));
            x[tid + j * T] = v[j];
            t[tid + j * T] = make_int4(0, 0, 0, 0);
        }
    } else if (kSrc == kSrcEmbed) {
        /* Row *token of the table, each value converted exactly (as
         * bn_cuda_embed_rows does), stored to x as the residual stream. */
        const int64_t id = __ldcg(a.token);
        float4 *x = reinterpret_cast<float4 *>(a.x + row * a.ldx);
#pragma unroll
        for (int j = 0; j < KV4; j++) {
            const int i = tid + j * T;
            if (i >= k4) {
                v[j] = z4;
                continue;
            }
            if (a.embed_type == BN_QTYPE_F32) {
                v[j] = __ldg(reinterpret_cast<const float4 *>(a.embed) + id * k4 + i);
            } else {
                const uint2 h = __ldg(reinterpret_cast<const uint2 *>(a.embed) + id * k4 + i);
                const bool bf = a.embed_type == BN_QTYPE_BF16;
                const unsigned short e[4] = {(unsigned short)(h.x & 0xffffu),
                                             (unsigned short)(h.x >> 16),
                                             (unsigned short)(h.y & 0xffffu),
                                             (unsigned short)(h.y >> 16)};
                float f[4];
#pragma unroll
                for (int c = 0; c < 4; c++)
                    f[c] = bf ? bf16_bits_to_f32(e[c]) : f16_bits_to_f32(e[c]);
                v[j] = make_float4(f[0], f[1], f[2], f[3]);
            }
            x[i] = v[j];
        }
    } else if (kSrc == kSrcMerge) {
        /* Values 4i .. 4i + 3 lie in one head (head_dim is a multiple of
         * 4): combined from the row's shares as the attention's merge
         * combines them. */
        int span;
        const int used = paged_row_splits(__ldcg(a.part_pos + row), a.part_splits, &span);
#pragma unroll
        for (int j = 0; j < KV4; j++) {
            const int i = tid + j * T;
            if (i >= k4) {
                v[j] = z4;
                continue;
            }
            const int h = 4 * i / a.part_hd, d = 4 * i % a.part_hd;
            float o[4];
            paged_combine<4>(paged_share(a.part, row, h, 0, a.part_heads, a.part_splits,
                                         a.part_hd),
                             used, a.part_hd, d, o);
            v[j] = make_float4(o[0], o[1], o[2], o[3]);
        }
    } else {
        const float4 *g = reinterpret_cast<const float4 *>(a.g + row * a.ldgu);
        const float4 *u = reinterpret_cast<const float4 *>(a.u + row * a.ldgu);
        float4 gv[KV4], uv[KV4];
#pragma unroll
        for (int j = 0; j < KV4; j++) {
            const bool in = tid + j * T < k4;
            gv[j] = in ? __ldcg(g + tid + j * T) : z4;
            uv[j] = in ? __ldcg(u + tid + j * T) : z4;
        }
#pragma unroll
        for (int j = 0; j < KV4; j++)
            v[j] = relu2_gate4(gv[j], uv[j], a.sg, a.su);
    }
}

/* ---- many rows at once (prefill chunks): the batch form -------------------------
 *
 * The lean kernel is shaped for one row's latency: just enough threads for
 * the row, each holding its values, products and codes, so a 2560-value row
 * takes a 640-thread block and few blocks fit an SM. A prefill chunk has
 * hundreds of rows, where what counts is how many rows an SM works on at
 * once. Its batch form (kBatch) gives a row a block of ceil(k / 16) threads
 * (rounded to a warp), each four float4 of it: the values and the norm
 * weights stay in registers (32), the products are recomputed in the
 * second pass instead of kept, and the codes are stored as they are made
 * (a row the exact rule does not apply to is recoded after). The same
 * codes, scale and sum (the same expressions; the double sum of squares in
 * this block's order, within the contract). Rows of k % 4 == 0 values up
 * to 8192 (512 threads); the lean kernel's alignment. */
constexpr int kBatchV4 = 4;           /* float4 a thread */
constexpr int kBatchMaxThreads = 512; /* rows up to 8192 values */

template <int kSrc, int KV4, bool kBatch = false>
__global__ void __launch_bounds__(kBatch ? kBatchMaxThreads : kLeanThreads)
    norm_quantize_lean_kernel(NormQuantArgs a)
{
    __shared__ LeanRed red;
    const int64_t row = blockIdx.x;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int W = (int)(blockDim.x >> 5), T = (int)blockDim.x;
    const int k4 = (int)(a.k / 4);
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    float4 w[KV4];
#pragma unroll
    for (int j = 0; j < KV4; j++) {
        const int i = tid + j * T;
        w[j] = i < k4 ? __ldg(reinterpret_cast<const float4 *>(a.w) + i) : z4;
    }
    pdl_trigger();
    pdl_wait();

    /* The row (source_value's expressions), through L2. */
    float4 v[KV4];
    load_row4<kSrc, KV4>(a, row, tid, T, v);

    /* Pass 1: sum of squares (double, exact squares) and the exact maximum
     * M = max|w v| (double products: a product of two floats is exact in
     * double). Padding values are 0 and add nothing to either; NaN products
     * are skipped by fmax. The lean form keeps fl(w v) for pass 2. */
    float p[kBatch ? 1 : KV4][4]; /* fl(w v), signed */
    double ss = 0.0, mx = 0.0;
#pragma unroll
    for (int j = 0; j < KV4; j++) {
        const float *vp = &v[j].x, *wp = &w[j].x;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            ss = __fma_rn((double)vp[e], (double)vp[e], ss);
            if constexpr (!kBatch)
                p[j][e] = __fmul_rn(wp[e], vp[e]);
            mx = fmax(mx, fabs(__dmul_rn((double)wp[e], (double)vp[e])));
        }
    }
    for (int o = 16; o > 0; o >>= 1)
        ss = __dadd_rn(ss, __shfl_xor_sync(kFull, ss, o));
    mx = warp_max_nonneg(mx);
    pdl_mark(0);
    if (lane == 0) {
        red.d[0][warp] = ss;
        red.d[1][warp] = mx;
    }
    __syncthreads();
    /* Second level: every warp runs the same butterfly over the warps'
     * partials (0 past the last warp), so all threads get the same bits. */
    ss = lane < W ? red.d[0][lane] : 0.0;
    mx = warp_max_nonneg(lane < W ? red.d[1][lane] : 0.0);
    for (int o = 16; o > 0; o >>= 1)
        ss = __dadd_rn(ss, __shfl_xor_sync(kFull, ss, o));
    const float inv = inv_rms(ss, a.k, a.eps);
    /* fl32(M) is the largest fp32 product (rounding is monotone): all the
     * estimate needs. */
    const float fm = __double2float_rn(mx);
    const bool fast = fm >= 0x1p-100f && fm <= 0x1p100f;
    const float rr = fast ? __fdiv_rn(127.0f, fm) : 0.0f;
    const bool usable = mx > 0.0 && isfinite(mx);
    pdl_mark(1);

    /* Pass 2: normed maximum and the codes: the estimate, or the double
     * expression for the values it leaves open (rare: within 2^-12 of a
     * tie, NaN, or all of a row outside the estimate's range). The batch
     * form stores each float4's codes at once. */
    float amax = 0.0f;
    int code[kBatch ? 1 : KV4][4];
    int total = 0;
#pragma unroll
    for (int j = 0; j < KV4; j++) {
        const float *vp = &v[j].x, *wp = &w[j].x;
        int *c = code[kBatch ? 0 : j];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            amax = fmaxf(amax, fabsf(__fmul_rn(wp[e], __fmul_rn(vp[e], inv))));
            float pe;
            if constexpr (kBatch)
                pe = __fmul_rn(wp[e], vp[e]);
            else
                pe = p[j][e];
            const float t = __fmul_rn(pe, rr);
            const float n = rintf(t);
            int ce = (int)n;
            if (!(fast && fabsf(__fsub_rn(t, n)) < kTieGuard))
                ce = usable && tid + j * T < k4 ? ExactCoder::exact(wp[e], vp[e], mx) : 0;
            c[e] = ce;
            total += ce;
        }
        if (kBatch && tid + j * T < k4)
            reinterpret_cast<char4 *>(a.q + row * a.ldq)[tid + j * T] = pack_codes4(code[0]);
    }
    /* Both by redux.sync (one instruction each instead of five shuffle
     * steps): amax is >= +0 and never NaN (fmaxf from 0 drops NaN), and the
     * integer sum is exact in any order. */
    amax = warp_max_nonneg(amax);
    total = __reduce_add_sync(kFull, total);
    /* (Pass 1's partials are in red.d: no barrier needed before these.) */
    if (lane == 0) {
        red.f[warp] = amax;
        red.i[warp] = total;
    }
    __syncthreads();
    amax = warp_max_nonneg(lane < W ? red.f[lane] : 0.0f);
    total = __reduce_add_sync(kFull, lane < W ? red.i[lane] : 0);
    pdl_mark(2);

    const bool exact = amax >= kQuantEps && usable;
    float s;
    if (exact) {
        s = __fdiv_rn(127.0f, amax);
    } else {
        /* Tiny or non-finite rows: the plain rule, as on the CPU. */
        s = __fdiv_rn(127.0f, amax >= kQuantEps ? amax : kQuantEps);
        total = 0;
#pragma unroll
        for (int j = 0; j < KV4; j++) {
            const float *vp = &v[j].x, *wp = &w[j].x;
            int *c = code[kBatch ? 0 : j];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                c[e] = tid + j * T < k4 ? plain_code(wp[e], vp[e], inv, s) : 0;
                total += c[e];
            }
            if (kBatch && tid + j * T < k4)
                reinterpret_cast<char4 *>(a.q + row * a.ldq)[tid + j * T] = pack_codes4(code[0]);
        }
        total = lean_block_sum(total, red.i);
    }

    char4 *out = reinterpret_cast<char4 *>(a.q + row * a.ldq);
    if constexpr (!kBatch) {
#pragma unroll
        for (int j = 0; j < KV4; j++)
            if (tid + j * T < k4)
                out[tid + j * T] = pack_codes4(code[j]);
    }
    /* The padding to ldq (k and ldq are multiples of 4 here): 4 bytes a
     * store (byte stores, ~7 a thread for a 2560-value row padded to 6912,
     * showed in the decode trace as ~0.4 us of the norm's critical path). */
    for (int64_t i = k4 + tid; i < a.ldq / 4; i += T)
        out[i] = make_char4(0, 0, 0, 0);
    if (tid == 0) {
        a.scale[row] = s;
        a.sum[row] = total;
    }
    pdl_mark(3);
}

/* Rows and buffers the float4 kernels (lean, batch) can read and write:
 * k a multiple of 4, rows, weights and codes aligned for float4 and char4. */
bool rows_aligned4(const NormQuantArgs &a, int kSrc)
{
    const uintptr_t ptrs =
        kSrc == kSrcRelu2 ? ((uintptr_t)a.g | (uintptr_t)a.u | (uintptr_t)(a.ldgu * 4))
        : kSrc == kSrcMerge
            ? ((uintptr_t)a.part | (uintptr_t)(a.part_hd % 4))
            : ((uintptr_t)a.x | (uintptr_t)(a.ldx * 4) |
               (kSrc == kSrcAdd ? (uintptr_t)a.r | (uintptr_t)(a.ldr * 4) : 0) |
               (kSrc == kSrcSums ? (uintptr_t)a.sums | (uintptr_t)(a.ld_sums * 4) : 0));
    return a.k % 4 == 0 && a.ldq % 4 == 0 && ((ptrs | (uintptr_t)a.w) & 15) == 0 &&
           ((uintptr_t)a.q & 3) == 0;
}

/* Whether the lean kernel takes rows of k values: at most 2 float4 per
 * thread (8192 values). */
bool lean_fits(const NormQuantArgs &a, int kSrc)
{
    return rows_aligned4(a, kSrc) && a.k <= 2 * 4 * kLeanThreads;
}

/* Whether the batch form does: up to kBatchV4 float4 a thread of
 * kBatchMaxThreads (8192 values). */
bool batch_fits(const NormQuantArgs &a, int kSrc)
{
    return rows_aligned4(a, kSrc) && a.k <= 4 * kBatchV4 * (int64_t)kBatchMaxThreads;
}

template <int kSrc, int KV4>
cudaError_t launch_lean_t(const NormQuantArgs &a, int64_t m, int pdl, cudaStream_t stream)
{
    const int64_t per_thread = (a.k / 4 + KV4 - 1) / KV4;
    const int threads = (int)((per_thread + 31) / 32 * 32);
    return pdl_launch(norm_quantize_lean_kernel<kSrc, KV4>, dim3((unsigned)m), dim3(threads), 0,
                      stream, pdl, a);
}

template <int kSrc>
cudaError_t launch_lean(const NormQuantArgs &a, int64_t m, int pdl, cudaStream_t stream)
{
    return a.k <= 4 * kLeanThreads ? launch_lean_t<kSrc, 1>(a, m, pdl, stream)
                                   : launch_lean_t<kSrc, 2>(a, m, pdl, stream);
}

template <int kSrc, int kPer>
cudaError_t launch_row_kernel(const NormQuantArgs &a, int64_t m, int threads, int pdl,
                              cudaStream_t stream)
{
    return pdl_launch(norm_quantize_row_kernel<kSrc, kPer>, dim3((unsigned)m), dim3(threads), 0,
                      stream, pdl, a);
}

template <int kSrc> cudaError_t launch_norm_quantize(const NormQuantArgs &a, int64_t m, int pdl,
                                                     cudaStream_t stream)
{
    if (m < 0 || m > INT32_MAX || a.k <= 0 || a.ldq < a.k || !a.w || !a.q || !a.scale || !a.sum)
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    if (m <= kRowMaxM && lean_fits(a, kSrc))
        return launch_lean<kSrc>(a, m, pdl, stream);
    if (m > kRowMaxM && batch_fits(a, kSrc)) {
        const int64_t threads = (a.k / 4 + kBatchV4 - 1) / kBatchV4;
        return pdl_launch(norm_quantize_lean_kernel<kSrc, kBatchV4, true>, dim3((unsigned)m),
                          dim3((unsigned)((threads + 31) / 32 * 32)), 0, stream, pdl, a);
    }
    if (m <= kRowMaxM && a.k <= (int64_t)kRowThreads * kRowMaxPer) {
        /* The fewest values per thread that fit 1024 threads, and just
         * enough warps for the row (2560 values: 640 threads of 4). */
        const int per = row_per(a.k);
        const int threads = row_threads(a.k);
        switch (per) {
        case 1: return launch_row_kernel<kSrc, 1>(a, m, threads, pdl, stream);
        case 2: return launch_row_kernel<kSrc, 2>(a, m, threads, pdl, stream);
        case 4: return launch_row_kernel<kSrc, 4>(a, m, threads, pdl, stream);
        default: return launch_row_kernel<kSrc, kRowMaxPer>(a, m, threads, pdl, stream);
        }
    }
    return pdl_launch(norm_quantize_kernel<kSrc>, dim3((unsigned)m), dim3(kNormThreads), 0, stream,
                      pdl, a);
}

/* x += r (when r), then y = w * (x * inv). Launched with PDL (the decode
 * step's output norm), it lets the screened head's kernel start at once. */
__global__ void __launch_bounds__(kNormThreads)
    add_rmsnorm_kernel(float *x, int64_t ldx, const float *r, int64_t ldr, int64_t k,
                       const float *__restrict__ w, float eps, float *y, int64_t ldy)
{
    __shared__ double red_d[32];
    pdl_trigger();
    pdl_wait();
    /* x and r come from the kernels before (with PDL): read through L2. */
    float *xr = x + (int64_t)blockIdx.x * ldx;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads) {
        float v = __ldcg(xr + i);
        if (r) {
            v = __fadd_rn(v, __ldcg(r + (int64_t)blockIdx.x * ldr + i));
            xr[i] = v;
        }
        ss = __dadd_rn(ss, __dmul_rn((double)v, (double)v));
    }
    ss = block_reduce(ss, SumD(), red_d);
    const float inv = inv_rms(ss, k, eps);
    float *yr = y + (int64_t)blockIdx.x * ldy;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads)
        yr[i] = __fmul_rn(w[i], __fmul_rn(__ldcg(xr + i), inv));
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------ */

extern "C" int bn_cb_pdl_supported(int device)
{
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    /* Every kernel launched with the attribute must contain the wait; one
     * kernel per file stands for its file (all are compiled alike). */
    return major >= 9 && pdl_compiled(norm_quantize_row_kernel<kSrcAdd, 4>) &&
           bn_cb_rope_pdl_compiled() && bn_cb_attn_decode_pdl_compiled() &&
           bn_w2a8_cuda_gemv_pdl_compiled();
}

/* The fields every row source shares: the row width, the norm and where
 * the codes, scale and sum go. */
static NormQuantArgs norm_args(int64_t k, const float *w, float eps, int8_t *q, int64_t ldq,
                               float *scale, int32_t *sum)
{
    NormQuantArgs a = {};
    a.k = k;
    a.w = w;
    a.eps = eps;
    a.q = q;
    a.ldq = ldq;
    a.scale = scale;
    a.sum = sum;
    return a;
}

extern "C" cudaError_t bn_cb_norm_quantize(const float *x, int64_t ldx, int64_t m, int64_t k,
                                           const float *w, float eps, int8_t *q, int64_t ldq,
                                           float *scale, int32_t *sum, int pdl,
                                           cudaStream_t stream)
{
    if (!x || ldx < k)
        return cudaErrorInvalidValue;
    NormQuantArgs a = norm_args(k, w, eps, q, ldq, scale, sum);
    a.x = const_cast<float *>(x); /* the plain source only reads */
    a.ldx = ldx;
    return launch_norm_quantize<kSrcPlain>(a, m, pdl, stream);
}

static NormQuantArgs merge_args(const float *part, int splits, int n_heads, int head_dim,
                                const int32_t *row_pos, const float *w, float eps, int8_t *q,
                                int64_t ldq, float *scale, int32_t *sum)
{
    NormQuantArgs a = norm_args((int64_t)n_heads * head_dim, w, eps, q, ldq, scale, sum);
    a.part = part;
    a.part_pos = row_pos;
    a.part_splits = splits;
    a.part_heads = n_heads;
    a.part_hd = head_dim;
    return a;
}

extern "C" int bn_cb_merge_norm_fits(const float *part, int n_heads, int head_dim, int64_t m,
                                     const float *w, const int8_t *q, int64_t ldq)
{
    const NormQuantArgs a =
        merge_args(part, 2, n_heads, head_dim, NULL, w, 0.0f, const_cast<int8_t *>(q), ldq,
                   NULL, NULL);
    return n_heads > 0 && head_dim > 0 && m <= kRowMaxM && lean_fits(a, kSrcMerge);
}

extern "C" cudaError_t bn_cb_merge_norm_quantize(const float *part, int splits, int n_heads,
                                                  int head_dim, const int32_t *row_pos,
                                                  int64_t m, const float *w, float eps, int8_t *q,
                                                  int64_t ldq, float *scale, int32_t *sum,
                                                  cudaStream_t stream)
{
    if (!part || !row_pos || splits < 1 || n_heads < 1 || head_dim < 1 || m < 0 || !w || !q ||
        !scale || !sum)
        return cudaErrorInvalidValue;
    const NormQuantArgs a =
        merge_args(part, splits, n_heads, head_dim, row_pos, w, eps, q, ldq, scale, sum);
    if (!bn_cb_merge_norm_fits(part, n_heads, head_dim, m, w, q, ldq))
        return cudaErrorNotSupported;
    if (a.ldq < a.k)
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    return launch_lean<kSrcMerge>(a, m, 0, stream);
}

extern "C" int bn_cb_embed_norm_fits(int type, int64_t k, const float *x, const float *w,
                                     const int8_t *q, int64_t ldq)
{
    NormQuantArgs a = norm_args(k, w, 0.0f, const_cast<int8_t *>(q), ldq, nullptr, nullptr);
    a.x = const_cast<float *>(x);
    a.ldx = k;
    return (type == BN_QTYPE_F32 || type == BN_QTYPE_F16 || type == BN_QTYPE_BF16) && k > 0 &&
           ldq >= k && lean_fits(a, kSrcPlain);
}

extern "C" cudaError_t bn_cb_embed_norm_quantize(const void *table, int type,
                                                 const int32_t *token, float *x, int64_t k,
                                                 const float *w, float eps, int8_t *q,
                                                 int64_t ldq, float *scale, int32_t *sum,
                                                 int pdl, cudaStream_t stream)
{
    NormQuantArgs a = norm_args(k, w, eps, q, ldq, scale, sum);
    a.x = x;
    a.ldx = k;
    a.embed = table;
    a.embed_type = type;
    a.token = token;
    if (!table || !token || !x || !w || !q || !scale || !sum ||
        !bn_cb_embed_norm_fits(type, k, x, w, q, ldq) || ((uintptr_t)table & 15))
        return cudaErrorInvalidValue;
    return launch_lean<kSrcEmbed>(a, 1, pdl, stream);
}

extern "C" cudaError_t bn_cb_add_norm_quantize(float *x, int64_t ldx, const float *r, int64_t ldr,
                                               int64_t m, int64_t k, const float *w, float eps,
                                               int8_t *q, int64_t ldq, float *scale, int32_t *sum,
                                               int pdl, cudaStream_t stream)
{
    if (!x || !r || ldx < k || ldr < k)
        return cudaErrorInvalidValue;
    NormQuantArgs a = norm_args(k, w, eps, q, ldq, scale, sum);
    a.x = x;
    a.ldx = ldx;
    a.r = r;
    a.ldr = ldr;
    return launch_norm_quantize<kSrcAdd>(a, m, pdl, stream);
}

/* The arguments of bn_cb_add_sums_norm_quantize (x, sums: see there). */
static NormQuantArgs sums_args(float *x, int64_t ldx, int32_t *sums, int64_t ld_sums,
                               float sums_w_scale, int64_t k, const float *w, float eps, int8_t *q,
                               int64_t ldq, float *scale, int32_t *sum)
{
    NormQuantArgs a = norm_args(k, w, eps, q, ldq, scale, sum);
    a.x = x;
    a.ldx = ldx;
    a.sums = sums;
    a.ld_sums = ld_sums;
    a.sums_w_scale = sums_w_scale;
    return a;
}

extern "C" int bn_cb_add_sums_norm_fits(const float *x, int64_t ldx, const int32_t *sums,
                                        int64_t ld_sums, int64_t m, int64_t k, const float *w,
                                        const int8_t *q, int64_t ldq)
{
    const NormQuantArgs a =
        sums_args(const_cast<float *>(x), ldx, const_cast<int32_t *>(sums), ld_sums, 1.0f, k, w,
                  0.0f, const_cast<int8_t *>(q), ldq, nullptr, nullptr);
    return x && sums && ldx >= k && ld_sums >= k && m >= 0 && m <= kRowMaxM && ldq >= k &&
           lean_fits(a, kSrcSums);
}

extern "C" cudaError_t bn_cb_add_sums_norm_quantize(float *x, int64_t ldx, int32_t *sums,
                                                    int64_t ld_sums, float sums_w_scale, int64_t m,
                                                    int64_t k, const float *w, float eps, int8_t *q,
                                                    int64_t ldq, float *scale, int32_t *sum,
                                                    int pdl, cudaStream_t stream)
{
    if (!w || !q || !scale || !sum)
        return cudaErrorInvalidValue;
    if (!bn_cb_add_sums_norm_fits(x, ldx, sums, ld_sums, m, k, w, q, ldq))
        return cudaErrorNotSupported;
    if (m == 0)
        return cudaSuccess;
    const NormQuantArgs a =
        sums_args(x, ldx, sums, ld_sums, sums_w_scale, k, w, eps, q, ldq, scale, sum);
    return launch_lean<kSrcSums>(a, m, pdl, stream);
}

extern "C" cudaError_t bn_cb_relu2_norm_quantize(const float *g, const float *u, int64_t ldgu,
                                                 float sg, float su, int64_t m, int64_t k,
                                                 const float *w, float eps, int8_t *q,
                                                 int64_t ldq, float *scale, int32_t *sum, int pdl,
                                                 cudaStream_t stream)
{
    if (!g || !u || ldgu < k)
        return cudaErrorInvalidValue;
    NormQuantArgs a = norm_args(k, w, eps, q, ldq, scale, sum);
    a.g = g;
    a.u = u;
    a.ldgu = ldgu;
    a.sg = sg;
    a.su = su;
    return launch_norm_quantize<kSrcRelu2>(a, m, pdl, stream);
}

/* The row source of a split norm: plain rows, or (x NULL) relu2 of g, u. */
static bool part_source(NormQuantArgs &a, const bn_cb_norm_source *src, int64_t k)
{
    if (!src)
        return false;
    if (src->x) {
        a.x = const_cast<float *>(src->x);
        a.ldx = src->ldx;
        return src->ldx >= k;
    }
    a.g = src->g;
    a.u = src->u;
    a.ldgu = src->ldgu;
    a.sg = src->sg;
    a.su = src->su;
    return src->g && src->u && src->ldgu >= k;
}

extern "C" cudaError_t bn_cb_norm_part_stats(const bn_cb_norm_source *src, int64_t m, int64_t k,
                                             const float *w, double *stats, cudaStream_t stream)
{
    NormQuantArgs a = norm_args(k, w, 0.0f, nullptr, 0, nullptr, nullptr);
    if (!part_source(a, src, k) || !w || !stats || k <= 0 || m <= 0 || m > INT32_MAX)
        return cudaErrorInvalidValue;
    if (src->x)
        norm_part_stats_kernel<kSrcPlain><<<(unsigned)m, kNormThreads, 0, stream>>>(a, stats);
    else
        norm_part_stats_kernel<kSrcRelu2><<<(unsigned)m, kNormThreads, 0, stream>>>(a, stats);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_norm_part_quantize(const bn_cb_norm_source *src, int64_t m,
                                                int64_t k, int64_t k_total, const float *w,
                                                float eps, const double *stats, int ranks,
                                                int8_t *q, int64_t ldq, float *scale,
                                                int32_t *sum, cudaStream_t stream)
{
    NormQuantArgs a = norm_args(k, w, eps, q, ldq, scale, sum);
    if (!part_source(a, src, k) || !w || !stats || !q || !scale || !sum || k <= 0 ||
        k_total < k || ldq < k || ranks < 1 || m <= 0 || m > INT32_MAX)
        return cudaErrorInvalidValue;
    if (src->x)
        norm_part_codes_kernel<kSrcPlain>
            <<<(unsigned)m, kNormThreads, 0, stream>>>(a, stats, ranks, k_total);
    else
        norm_part_codes_kernel<kSrcRelu2>
            <<<(unsigned)m, kNormThreads, 0, stream>>>(a, stats, ranks, k_total);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_add_rmsnorm(float *x, int64_t ldx, const float *r, int64_t ldr,
                                         int64_t m, int64_t k, const float *w, float eps, float *y,
                                         int64_t ldy, int pdl, cudaStream_t stream)
{
    if (!x || !w || !y || k <= 0 || ldx < k || ldy < k || (r && ldr < k) || m < 0 ||
        m > INT32_MAX)
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    return pdl_launch(add_rmsnorm_kernel, dim3((unsigned)m), dim3(kNormThreads), 0, stream, pdl, x,
                      ldx, r, ldr, k, w, eps, y, ldy);
}

#ifdef BN_DECODE_TRACE
BN_TRACE_ATTACH(bn_cb_norm_trace_attach)
#endif
