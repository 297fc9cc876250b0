/*
 * cuda_backend_kernels.cu - the CUDA backend's own kernels: RMSNorm +
 * quantization with the CPU backend's exact rounding rule (three row
 * sources), the final RMSNorm, the q/k/v epilogue with RoPE and the KV
 * cache store, attention over an fp32 cache (decode, with that epilogue
 * fused, and prefill), and the LM head with fp32 activations. Contracts:
 * cuda_backend_kernels.h.
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
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <cooperative_groups.h>
#include <stdint.h>
#include <string.h>

#include "block_reduce.cuh"
#include "cuda_backend_kernels.h"
#include "half_bits.cuh"
#include "head_row.cuh"
#include "pdl.cuh"
#include "qtype.h"
#include "smem_opt_in.cuh"
#include "w2a8_gemv.cuh"
#include "w2a8_cuda.h"

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
struct SumF {
    __device__ float operator()(float a, float b) const { return a + b; }
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
    const bool exact = amax >= kQuantEps && umax > 0.0 && isfinite(umax);
    const float s = exact ? __fdiv_rn(127.0f, amax)
                          : __fdiv_rn(127.0f, amax >= kQuantEps ? amax : kQuantEps);
    const ExactCoder coder(umax);
    int8_t *out = a.q + row * a.ldq;
    int total = 0;
    for (int64_t i = threadIdx.x; i < a.ldq; i += kNormThreads) {
        int val = 0;
        if (i < k) {
            const float v = source_value<kSrc>(a, row, i, false);
            val = exact ? coder.code(w[i], v) : plain_code(w[i], v, inv, s);
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
    const uintptr_t ptrs = kSrc == kSrcRelu2
                               ? ((uintptr_t)a.g | (uintptr_t)a.u | (uintptr_t)(a.ldgu * 4))
                               : ((uintptr_t)a.x | (uintptr_t)(a.ldx * 4) |
                                  (kSrc == kSrcAdd ? (uintptr_t)a.r | (uintptr_t)(a.ldr * 4) : 0));
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

/* ---- RoPE and the q, k, v epilogue ----------------------------------------------------- */

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

__global__ void __launch_bounds__(256)
    rope_table_kernel(bn_rope_freqs freqs, int64_t n_pos, float2 *__restrict__ table)
{
    const int half = freqs.rope_dim / 2;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_pos * half)
        table[i] = rope_cos_sin((int)(i / half), freqs.inv_freq[(int)(i % half)]);
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
 * previous kernel, read through L2 (see source_value), or (kSm) from shared
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

template <bool kHalf> __device__ __forceinline__ void store_kv(void *cache, int64_t i, float v)
{
    if (kHalf)
        static_cast<__half *>(cache)[i] = __float2half_rn(v);
    else
        static_cast<float *>(cache)[i] = v;
}

/* Where value idx of a token's q|k|v row belongs: its region (0 q, 1 k,
 * 2 v), its index within the region, its offset d within its head and
 * the region's scale. Indices within a row fit 32 bits (bn_cb_qkv_post
 * caps a row at 65535 blocks of 256 values). */
struct QkvSlot {
    int region, local, d;
    float sc;
};

__device__ __forceinline__ QkvSlot qkv_slot(const bn_cb_qkv_shape &s, int idx)
{
    const int q_dim = s.n_heads * s.head_dim, kv_dim = s.n_kv_heads * s.head_dim;
    QkvSlot a;
    a.region = idx < q_dim ? 0 : idx < q_dim + kv_dim ? 1 : 2;
    a.local = a.region == 0 ? idx : a.region == 1 ? idx - q_dim : idx - q_dim - kv_dim;
    a.d = a.local % s.head_dim;
    a.sc = a.region == 0 ? s.scale_q : a.region == 1 ? s.scale_k : s.scale_v;
    return a;
}

/* grid (m, ceil(values / (256 kVec))): kVec consecutive values of q, k and
 * v a thread (1, or 4 with float4 loads and stores where head_dim and the
 * rotated half are multiples of 4 and every row and cache is aligned for
 * them: qkv_post_vec_fits), so a single token spreads over many blocks.
 * The kVec values share a region and a side of the rotation; each takes
 * rope_pair on its own pair (it and its partner half a rotation away), as
 * rope_value does, so both widths give the same bits. A prefill chunk is
 * hundreds of rows of 3840 values (2B-4T): with kVec = 4 a quarter of the
 * blocks (H100, a 512-token chunk: 424 -> 286 us). */
template <int kVec> __device__ __forceinline__ void load_vals(const float *p, float (&v)[kVec])
{
    if constexpr (kVec == 4) {
        const float4 x = __ldcg(reinterpret_cast<const float4 *>(p));
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
#pragma unroll
        for (int e = 0; e < kVec; e++)
            v[e] = __ldcg(p + e);
    }
}

template <bool kHalf, int kVec>
__global__ void __launch_bounds__(256)
    qkv_post_kernel(const float *raw, int64_t ldraw, bn_cb_qkv_shape s, bn_rope_freqs freqs,
                    const float2 *__restrict__ table, int64_t table_len, const int32_t *pos,
                    float *q_out, int64_t ldq, void *k_cache, void *v_cache)
{
    pdl_trigger();
    pdl_wait();
    const int64_t t = blockIdx.x;
    const int kv_dim = s.n_kv_heads * s.head_dim;
    const int idx = kVec * (int)(blockIdx.y * blockDim.x + threadIdx.x);
    if (idx >= s.n_heads * s.head_dim + 2 * kv_dim)
        return;
    const int p = __ldcg(pos + t);
    const int half = freqs.rope_dim / 2;
    const QkvSlot at = qkv_slot(s, idx);
    const float *head = raw + t * ldraw + (idx - at.d);
    float own[kVec], v[kVec];
    load_vals<kVec>(head + at.d, own);
    if (at.region != 2 && at.d < 2 * half) {
        const bool low = at.d < half;
        const int j = low ? at.d : at.d - half;
        float other[kVec];
        load_vals<kVec>(head + (low ? at.d + half : at.d - half), other);
        float2 cs[kVec];
        if (p >= 0 && (int64_t)p < table_len) {
            const float2 *tp = table + (int64_t)p * half + j;
            if constexpr (kVec == 4) {
                const float4 c01 = reinterpret_cast<const float4 *>(tp)[0];
                const float4 c23 = reinterpret_cast<const float4 *>(tp)[1];
                cs[0] = make_float2(c01.x, c01.y), cs[1] = make_float2(c01.z, c01.w);
                cs[2] = make_float2(c23.x, c23.y), cs[3] = make_float2(c23.z, c23.w);
            } else {
#pragma unroll
                for (int e = 0; e < kVec; e++)
                    cs[e] = tp[e];
            }
        } else {
#pragma unroll
            for (int e = 0; e < kVec; e++)
                cs[e] = rope_cos_sin(p, freqs.inv_freq[j + e]);
        }
#pragma unroll
        for (int e = 0; e < kVec; e++)
            v[e] = rope_pair(__fmul_rn(own[e], at.sc), __fmul_rn(other[e], at.sc), low, cs[e]);
    } else {
#pragma unroll
        for (int e = 0; e < kVec; e++)
            v[e] = __fmul_rn(own[e], at.sc);
    }
    if (at.region == 0) {
        float *q = q_out + t * ldq + at.local;
        if constexpr (kVec == 4)
            *reinterpret_cast<float4 *>(q) = make_float4(v[0], v[1], v[2], v[3]);
        else
            q[0] = v[0];
    } else if (p >= 0 && (int64_t)p < s.capacity) {
        const int64_t off = (int64_t)p * kv_dim + at.local;
        void *cache = at.region == 1 ? k_cache : v_cache;
        if constexpr (kHalf && kVec == 4) {
            __half2 *h = reinterpret_cast<__half2 *>(static_cast<__half *>(cache) + off);
            h[0] = __floats2half2_rn(v[0], v[1]);
            h[1] = __floats2half2_rn(v[2], v[3]);
        } else if constexpr (kVec == 4) {
            *reinterpret_cast<float4 *>(static_cast<float *>(cache) + off) =
                make_float4(v[0], v[1], v[2], v[3]);
        } else {
            store_kv<kHalf>(cache, off, v[0]);
        }
    }
}

/* Whether qkv_post_kernel can take four values a thread (see there). */
static bool qkv_post_vec_fits(const float *raw, int64_t ldraw, const bn_cb_qkv_shape *s,
                              const bn_rope_freqs *freqs, const float *table,
                              const float *q_out, int64_t ldq, const void *k_cache,
                              const void *v_cache)
{
    const uintptr_t a16 = (uintptr_t)raw | (uintptr_t)q_out | (uintptr_t)table;
    return s->head_dim % 4 == 0 && (freqs->rope_dim / 2) % 4 == 0 && ldraw % 4 == 0 &&
           ldq % 4 == 0 && (a16 & 15) == 0 && (((uintptr_t)k_cache | (uintptr_t)v_cache) & 15) == 0;
}

/* ---- attention over an fp32 cache ------------------------------------------------- */

constexpr int kAttnWarps = 4; /* prefill */
constexpr int kMaxChunks = 2; /* float4 chunks per lane: head_dim <= 256 */
constexpr int kDecWarps = 8;  /* decode: warps per block                  */
/* Decode: positions per warp per tile. With 5 a 2B-4T block of a cluster
 * of 8 has all of its 80 positions at context 640 in flight before the PDL
 * wait (then as two tiles of 8 warps, now one of 16: cluster_warps), where
 * 4 left a third tile to load after it: the H200 step 985-992 against
 * 1001-1008 us (6: 995-1004), alternated in one run. */
constexpr int kDecRows = 5;
constexpr int kDecTile = kDecWarps * kDecRows;
constexpr int kMinRange = kDecTile;
constexpr int kMaxSplits = 64;
constexpr int kMergeBatch = 16; /* ranges a merging thread loads at once */
constexpr int kMergeParts = 8;  /* at most this many threads per output  */

__device__ __forceinline__ float4 f4_scale(float4 a, float c)
{
    return make_float4(a.x * c, a.y * c, a.z * c, a.w * c);
}

__device__ __forceinline__ float4 f4_axpy(float p, float4 v, float4 acc)
{
    return make_float4(fmaf(p, v.x, acc.x), fmaf(p, v.y, acc.y), fmaf(p, v.z, acc.z),
                       fmaf(p, v.w, acc.w));
}

__device__ __forceinline__ float f4_dot(float4 a, float4 b, float acc)
{
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

__device__ __forceinline__ float4 f4_div(float4 a, float d)
{
    return make_float4(a.x / d, a.y / d, a.z / d, a.w / d);
}

/* Positions per range for a length len cut into `splits` ranges. */
__host__ __device__ __forceinline__ int split_chunk(int len, int splits)
{
    const int chunk = (len + splits - 1) / splits;
    return chunk < kMinRange ? kMinRange : chunk;
}

/* The (cos, sin) of values 4 ch .. 4 ch + 3 of a head from the position's
 * table row (zeros beyond the rotated dimensions, or without a row). The
 * table is written once at create(): it may be read before the wait. vec:
 * half % 4 == 0 and the table 16-byte aligned, so a chunk lies in one half
 * and its four pairs are two float4 loads. */
__device__ __forceinline__ void rope_cs(float2 (&c)[4], const float2 *row, int ch, int half,
                                        bool vec)
{
    const int d0 = 4 * ch;
#pragma unroll
    for (int e = 0; e < 4; e++)
        c[e] = make_float2(0.0f, 0.0f);
    if (!row || d0 >= 2 * half)
        return;
    if (vec) {
        const float4 *r4 = reinterpret_cast<const float4 *>(row + (d0 < half ? d0 : d0 - half));
        const float4 x = __ldg(r4), y = __ldg(r4 + 1);
        c[0] = make_float2(x.x, x.y);
        c[1] = make_float2(x.z, x.w);
        c[2] = make_float2(y.x, y.y);
        c[3] = make_float2(y.z, y.w);
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int d = d0 + e;
        if (d < 2 * half)
            c[e] = __ldg(row + (d < half ? d : d - half));
    }
}

/* Values 4 ch .. 4 ch + 3 of a head after scale and RoPE: rope_pair's
 * operations, as in rope_value (so bn_cb_qkv_post's values bit for bit), with the head's raw
 * values loaded as float4 (the chunk and, rotated, its partner chunk) when
 * vec (see rope_cs). */
template <bool kSm = false>
__device__ __forceinline__ float4 rope4(const float *head, int ch, float sc, int half,
                                        const float2 (&c)[4], bool vec)
{
    const int d0 = 4 * ch;
    const float4 *h4 = reinterpret_cast<const float4 *>(head);
    if (d0 >= 2 * half) {
        const float4 r = raw_ld<kSm>(h4 + ch);
        return make_float4(__fmul_rn(r.x, sc), __fmul_rn(r.y, sc), __fmul_rn(r.z, sc),
                           __fmul_rn(r.w, sc));
    }
    float r[4];
    if (vec) {
        const bool lo = d0 < half;
        const float4 own = raw_ld<kSm>(h4 + ch);
        const float4 oth = raw_ld<kSm>(h4 + (lo ? ch + half / 4 : ch - half / 4));
        const float o[4] = {own.x, own.y, own.z, own.w}, t[4] = {oth.x, oth.y, oth.z, oth.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
            r[e] = rope_pair(__fmul_rn(o[e], sc), __fmul_rn(t[e], sc), lo, c[e]);
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++)
            r[e] = rope_value<kSm>(head, d0 + e, sc, half, c[e]);
    }
    return make_float4(r[0], r[1], r[2], r[3]);
}

/* v[g] holds a lane's partial sum for query head g; on return every lane
 * holds the warp's sums. G = 1: the butterfly. G = 2, 4: a reduce-scatter
 * first (at xor 16 each lane keeps half the heads and sends the other half,
 * at xor 8 (G = 4) half again), so the lanes of each 32/G-lane group sum one
 * head with the remaining xor steps, then broadcast: 8 (G = 2) or 10
 * (G = 4) shuffles instead of 5 G. Each step adds the same two operands in
 * both partners, so every lane of a group holds the same value and the sums
 * do not depend on the lane. */
template <int G> __device__ __forceinline__ void reduce_heads(float (&v)[G], int lane)
{
    if constexpr (G == 1) {
        v[0] = warp_reduce(v[0], SumF());
    } else if constexpr (G == 2) {
        const bool b16 = (lane & 16) != 0;
        float k = b16 ? v[1] : v[0];
        k += __shfl_xor_sync(kFull, b16 ? v[0] : v[1], 16);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1)
            k += __shfl_xor_sync(kFull, k, o);
        v[0] = __shfl_sync(kFull, k, 0);
        v[1] = __shfl_sync(kFull, k, 16);
    } else {
        static_assert(G == 4, "G is 1, 2 or 4");
        const bool b16 = (lane & 16) != 0, b8 = (lane & 8) != 0;
        float k0 = b16 ? v[2] : v[0], k1 = b16 ? v[3] : v[1];
        k0 += __shfl_xor_sync(kFull, b16 ? v[0] : v[2], 16);
        k1 += __shfl_xor_sync(kFull, b16 ? v[1] : v[3], 16);
        /* lanes with b16 hold heads 2, 3, the others 0, 1 */
        float k = b8 ? k1 : k0;
        k += __shfl_xor_sync(kFull, b8 ? k0 : k1, 8);
        /* lane holds head (lane >> 3) & 3 */
#pragma unroll
        for (int o = 4; o > 0; o >>= 1)
            k += __shfl_xor_sync(kFull, k, o);
#pragma unroll
        for (int g = 0; g < 4; g++)
            v[g] = __shfl_sync(kFull, k, 8 * g);
    }
}

struct DecodeArgs {
    bn_cb_attn_shape s;
    const float *qkv;
    float sq, sk, sv;
    const float2 *rope;
    int half;
    int rope_vec; /* rope_cs's vec */
    const int32_t *pos;
    float *kc, *vc;
    int splits;
    int subgroups; /* group / G: blocks per kv head and range */
    float scale;
    float *ws_acc, *ws_ml;
    unsigned *counters;
    float *out;
    const float *pf_k, *pf_v; /* the next layer's cache, or NULL */
    /* The q|k|v product inside the cluster kernel (attn_decode_cluster_kernel
     * with kQkv): the fused weights (tile layout, rows q | k | v), the
     * normed row's int8 codes (k_padded bytes) with their scale and sum,
     * and the block's share of the column's tiles. */
    const uint8_t *w_qkv;
    const int8_t *xq;
    const float *act_scale;
    const int32_t *act_sum;
    int groups;          /* chunk-groups per weight row (k_padded / 256)     */
    int q_tiles, kv_tiles; /* tiles of q (n_heads hd / 8) and of k, of v   */
    int col_tiles;       /* tiles of a block column: (G + 2) hd / 8        */
    int block_tiles;     /* a cluster block's share: ceil(col_tiles / C)   */
};

/* Rows [0, p) of the next layer's cache into L2, this block's share of them
 * (one bulk prefetch per cache, issued by thread 0 without waiting): they
 * are final since the last step, and the next layer's attention, a layer's
 * worth of weights later, then reads them from L2 instead of from memory
 * behind the weight traffic of the kernels in flight. */
__device__ __forceinline__ void prefetch_next_layer(const DecodeArgs &a, int p, int block,
                                                    int blocks)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x != 0 || !a.pf_k || p <= 0 || (int64_t)p > a.s.capacity)
        return;
    /* 16-byte units: a row is a multiple of 16 bytes (head_dim % 4 == 0). */
    const int64_t units = (int64_t)p * a.s.n_kv_heads * a.s.head_dim / 4;
    const int64_t per = (units + blocks - 1) / blocks;
    const int64_t begin = (int64_t)block * per;
    if (begin >= units)
        return;
    const unsigned bytes = (unsigned)(16 * (units - begin < per ? units - begin : per));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a.pf_k + 4 * begin),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a.pf_v + 4 * begin),
                 "r"(bytes)
                 : "memory");
#else
    (void)a, (void)p, (void)block, (void)blocks;
#endif
}

/* Cache rows t0 + warp * kDecRows + i (i < kDecRows) of kv head `head_off`
 * into registers, lane l holding float4 chunks l and l + 32: rows at or past
 * `stop` (the range's end, or the token's own position, which is not in the
 * cache yet) read as zeros. */
template <int KC>
__device__ __forceinline__ void load_rows(float4 (&kr)[kDecRows][KC], float4 (&vr)[kDecRows][KC],
                                          const DecodeArgs &a, int t0, int stop, int64_t head_off)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nc = a.s.head_dim / 4;
    const int64_t kv_dim = (int64_t)a.s.n_kv_heads * a.s.head_dim;
#pragma unroll
    for (int i = 0; i < kDecRows; i++) {
        const int t = t0 + warp * kDecRows + i;
#pragma unroll
        for (int c = 0; c < KC; c++) {
            const int ch = lane + 32 * c;
            kr[i][c] = make_float4(0.f, 0.f, 0.f, 0.f);
            vr[i][c] = kr[i][c];
            if (t < stop && ch < nc) {
                const int64_t off = (int64_t)t * kv_dim + head_off;
                kr[i][c] = __ldg(reinterpret_cast<const float4 *>(a.kc + off) + ch);
                vr[i][c] = __ldg(reinterpret_cast<const float4 *>(a.vc + off) + ch);
            }
        }
    }
}

/* What one block of the decode attention works with: its place (kv head,
 * its G query heads, the token's position and length) and, per warp, q of
 * the G heads and their online softmax (running max m, sum l, p . V). */
template <int KC, int G, bool kSm = false> struct DecodeBlock {
    int kvh, sub, h0, p, len, nc;
    int64_t head_off;
    bool vec;
    /* The raw q of head h0, k and v of the kv head: the q|k|v row in
     * global memory, or (kSm) the cluster kernel's own product in shared
     * memory, which sets them. */
    const float *src_q, *src_k, *src_v;
    float2 cs[KC][4]; /* the position's (cos, sin), per chunk */
    float4 q[G][KC], acc[G][KC];
    float m[G], l[G];

    __device__ DecodeBlock(const DecodeArgs &a, int col)
    {
        const int group = a.s.n_heads / a.s.n_kv_heads;
        kvh = col / a.subgroups;
        sub = col % a.subgroups;
        h0 = kvh * group + sub * G;
        nc = a.s.head_dim / 4;
        head_off = (int64_t)kvh * a.s.head_dim;
        vec = a.rope_vec != 0;
        /* The position is one of the step's inputs, uploaded before the
         * step's first kernel (which is launched without programmatic
         * serialization), so it is final before the wait (read through L2
         * all the same). */
        p = __ldcg(a.pos);
        len = p >= 0 && (int64_t)p < a.s.capacity ? p + 1 : 0;
        const int64_t q_dim = (int64_t)a.s.n_heads * a.s.head_dim;
        const int64_t kv_dim = (int64_t)a.s.n_kv_heads * a.s.head_dim;
        src_q = a.qkv ? a.qkv + (int64_t)h0 * a.s.head_dim : nullptr;
        src_k = a.qkv ? a.qkv + q_dim + head_off : nullptr;
        src_v = a.qkv ? a.qkv + q_dim + kv_dim + head_off : nullptr;
    }

    /* The position's RoPE table entries (written at create(): may be read
     * before the wait). */
    __device__ __forceinline__ void load_rope(const DecodeArgs &a)
    {
        const int lane = threadIdx.x & 31;
        /* (At length 0 there is no valid position and no table row.) */
        const float2 *row = a.half > 0 && len > 0 ? a.rope + (int64_t)p * a.half : nullptr;
#pragma unroll
        for (int c = 0; c < KC; c++)
            rope_cs(cs[c], lane + 32 * c < nc ? row : nullptr, lane + 32 * c, a.half, vec);
    }

    /* q of the G heads (scale + RoPE) from the raw product, and an empty
     * softmax. After the wait. */
    __device__ __forceinline__ void start(const DecodeArgs &a)
    {
        const int lane = threadIdx.x & 31;
        const int hd = a.s.head_dim;
#pragma unroll
        for (int g = 0; g < G; g++) {
#pragma unroll
            for (int c = 0; c < KC; c++) {
                const int ch = lane + 32 * c;
                q[g][c] = ch < nc && len > 0
                              ? rope4<kSm>(src_q + (int64_t)g * hd, ch, a.sq, a.half, cs[c], vec)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
                acc[g][c] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
            m[g] = -INFINITY;
            l[g] = 0.0f;
        }
    }

    /* One tile of positions t0 .. t0 + (warps) kDecRows - 1 (those before `end`),
     * its cached rows in kr, vr (loaded with stop <= p). The warp holding
     * the token's own position computes its k and v the same way as
     * bn_cb_qkv_post (bit for bit) and uses them from registers; the kv
     * head's first block column (subgroup 0) stores them to the cache, one
     * lane per float4. Then per warp: the G heads' scores (lane-partial
     * dots, reduce_heads), the softmax update and p . V. */
    __device__ __forceinline__ void tile(const DecodeArgs &a, float4 (&kr)[kDecRows][KC],
                                         float4 (&vr)[kDecRows][KC], int t0, int end)
    {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        const int64_t kv_dim = (int64_t)a.s.n_kv_heads * a.s.head_dim;
        const int tw = t0 + warp * kDecRows; /* this warp's first position */
        if (p >= tw && p < tw + kDecRows && p < end) {
            const float *kraw = src_k;
            const float4 *vraw = reinterpret_cast<const float4 *>(src_v);
            float4 kn[KC], vn[KC];
#pragma unroll
            for (int c = 0; c < KC; c++) {
                const int ch = lane + 32 * c;
                kn[c] = vn[c] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (ch < nc) {
                    kn[c] = rope4<kSm>(kraw, ch, a.sk, a.half, cs[c], vec);
                    const float4 r = raw_ld<kSm>(vraw + ch);
                    vn[c] = make_float4(__fmul_rn(r.x, a.sv), __fmul_rn(r.y, a.sv),
                                        __fmul_rn(r.z, a.sv), __fmul_rn(r.w, a.sv));
                    if (sub == 0) {
                        const int64_t off = (int64_t)p * kv_dim + head_off;
                        reinterpret_cast<float4 *>(a.kc + off)[ch] = kn[c];
                        reinterpret_cast<float4 *>(a.vc + off)[ch] = vn[c];
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < kDecRows; i++)
                if (tw + i == p)
#pragma unroll
                    for (int c = 0; c < KC; c++) {
                        kr[i][c] = kn[c];
                        vr[i][c] = vn[c];
                    }
        }
        if (tw >= end)
            return; /* warp-uniform: no position of this warp in the tile */
        float score[kDecRows][G];
#pragma unroll
        for (int i = 0; i < kDecRows; i++) {
            float part[G];
#pragma unroll
            for (int g = 0; g < G; g++) {
                part[g] = 0.0f;
#pragma unroll
                for (int c = 0; c < KC; c++)
                    part[g] = f4_dot(q[g][c], kr[i][c], part[g]);
            }
            /* Every lane takes part in the sums; rows past the end score
             * -inf (weight 0). */
            reduce_heads<G>(part, lane);
#pragma unroll
            for (int g = 0; g < G; g++)
                score[i][g] = tw + i < end ? __fmul_rn(part[g], a.scale) : -INFINITY;
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mt = score[0][g];
#pragma unroll
            for (int i = 1; i < kDecRows; i++)
                mt = fmaxf(mt, score[i][g]);
            const float m_new = fmaxf(m[g], mt);
            if (m_new == -INFINITY)
                continue;
            const float corr = expf(m[g] - m_new); /* m == -inf: 0 */
            l[g] *= corr;
#pragma unroll
            for (int c = 0; c < KC; c++)
                acc[g][c] = f4_scale(acc[g][c], corr);
#pragma unroll
            for (int i = 0; i < kDecRows; i++) {
                const float pi = expf(score[i][g] - m_new);
                l[g] += pi;
#pragma unroll
                for (int c = 0; c < KC; c++)
                    acc[g][c] = f4_axpy(pi, vr[i][c], acc[g][c]);
            }
            m[g] = m_new;
        }
    }
};

/* The warps' partial results of a block, in shared memory, and their merge
 * into one (max, sum, acc) per head and chunk, in warp order. */
template <int KC, int G, int W = kDecWarps> struct WarpParts {
    static constexpr int kSlots = G * 32 * KC; /* (head, chunk) slots of a block */
    float m[W][G], l[W][G];
    float4 acc[W * kSlots];

    template <class Block> __device__ __forceinline__ void put(const Block &b)
    {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        if (lane == 0)
#pragma unroll
            for (int g = 0; g < G; g++) {
                m[warp][g] = b.m[g];
                l[warp][g] = b.l[g];
            }
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int c = 0; c < KC; c++)
                if (lane + 32 * c < b.nc)
                    acc[warp * kSlots + g * 32 * KC + lane + 32 * c] = b.acc[g][c];
    }

    /* Slot o (head g = o / (32 KC)) over the warps: its max, sum and
     * weighted acc. After a barrier that follows every warp's put(). */
    __device__ __forceinline__ float4 merge(int o, int g, float &mx, float &total) const
    {
        mx = -INFINITY;
        for (int w = 0; w < W; w++)
            mx = fmaxf(mx, m[w][g]);
        total = 0.0f;
        float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
        if (mx != -INFINITY)
            for (int w = 0; w < W; w++) {
                const float e = expf(m[w][g] - mx);
                total += l[w][g] * e;
                r = f4_axpy(e, acc[w * kSlots + o], r);
            }
        return r;
    }
};

/* Decode through a ticket, grid (n_heads / G, splits), kDecWarps warps.
 * Block (x, split) takes G query heads of one kv head (kv head
 * x / subgroups, its heads (x % subgroups) G .. + G - 1), so each cache row
 * it reads serves G heads, over its range of positions in tiles of
 * kDecTile; warp w takes the tile's positions w * kDecRows .. + kDecRows - 1,
 * all loaded at once.
 *
 *   1. Before waiting for the q|k|v product (pdl.cuh): the range's first
 *      tile of cached rows (earlier tokens: final since the last step) and
 *      the position's RoPE table entries (written at create()).
 *   2. q of the G heads; the tiles (DecodeBlock::tile); the warps merge in
 *      shared memory in warp order.
 *   3. A length that fits one range (active == 1) is written to out
 *      directly. Otherwise each block writes (max, sum, acc) of its range
 *      and heads to the workspace, and the block that completes the column's
 *      last range (a counter per column, reset by it) merges the ranges:
 *      up to kMergeParts threads per output value, each over a fixed subset
 *      of the ranges in a fixed order (ranges part, part + parts, ...;
 *      kMergeBatch loads in flight), then the parts in part order. The
 *      order depends on the length only, never on which block is last.
 *
 * Ranges past the length (short contexts) have nothing to do; range 0
 * always takes part, so a head is written (zeros) even at length 0. The
 * cluster kernel below does without the workspace and the ticket where the
 * device has thread-block clusters. */
template <int KC, int G>
__global__ void __launch_bounds__(32 * kDecWarps, KC == 1 ? 2 : 1) attn_decode_kernel(DecodeArgs a)
{
    constexpr int kSlots = WarpParts<KC, G>::kSlots;
    __shared__ WarpParts<KC, G> parts_sm;
    __shared__ float sm_pm[32 * kDecWarps], sm_pl[32 * kDecWarps];
    __shared__ bool sm_last;
    const int col = blockIdx.x, split = blockIdx.y;
    DecodeBlock<KC, G> b(a, col);
    const int nc = b.nc, p = b.p, len = b.len, h0 = b.h0;
    const int chunk = split_chunk(len, a.splits);
    const int active = len > 0 ? (len + chunk - 1) / chunk : 1;
    const int begin = (int)min((int64_t)split * chunk, (int64_t)len);
    const int end = (int)min((int64_t)begin + chunk, (int64_t)len);

    float4 kr[kDecRows][KC], vr[kDecRows][KC];
    if (split < active) {
        load_rows<KC>(kr, vr, a, begin, p < end ? p : end, b.head_off);
        b.load_rope(a);
    }
    prefetch_next_layer(a, p, col + gridDim.x * split, gridDim.x * gridDim.y);
    pdl_trigger();
    pdl_wait();
    if (split >= active)
        return;

    b.start(a);
    pdl_mark(0);
    for (int t0 = begin; t0 < end; t0 += kDecTile) {
        if (t0 != begin)
            load_rows<KC>(kr, vr, a, t0, p < end ? p : end, b.head_off);
        b.tile(a, kr, vr, t0, end);
    }

    /* The warps' (max, sum, acc) into one per head for the range. */
    parts_sm.put(b);
    __syncthreads();
    pdl_mark(1);
    float4 *out4 = reinterpret_cast<float4 *>(a.out);
    for (int o = threadIdx.x; o < kSlots; o += blockDim.x) {
        const int g = o / (32 * KC), ch = o % (32 * KC);
        if (ch >= nc)
            continue;
        float mx, total;
        const float4 r = parts_sm.merge(o, g, mx, total);
        const int h = h0 + g;
        if (active == 1) {
            out4[(int64_t)h * nc + ch] =
                total > 0.0f ? f4_div(r, total) : make_float4(0.f, 0.f, 0.f, 0.f);
        } else {
            const int64_t slot = (int64_t)h * a.splits + split;
            reinterpret_cast<float4 *>(a.ws_acc)[slot * nc + ch] = r;
            if (ch == 0) {
                a.ws_ml[2 * slot] = mx;
                a.ws_ml[2 * slot + 1] = total;
            }
        }
    }
    if (active == 1) /* block-uniform: the only range, written above */
        return;

    /* Last block of the column? The barrier orders the block's workspace
     * writes before thread 0's release fence and ticket, so they are
     * visible to whoever sees the ticket; the last block's thread 0
     * acquires after every ticket, and the barrier after it orders the
     * block's reads (through L2) behind that. Only thread 0 fences
     * (acquire-release at GPU scope, not the sequentially consistent
     * __threadfence of every thread). */
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        const bool last = atomicAdd(&a.counters[col], 1u) == (unsigned)active - 1;
        if (last) {
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            a.counters[col] = 0; /* every range has counted: ready for the next launch */
        }
        sm_last = last;
    }
    __syncthreads();
    pdl_mark(2);
    if (!sm_last)
        return;

    /* Merge the ranges: a range's weight is exp(m_s - M) over the ranges
     * that saw any position (sum > 0). Thread (part, o) takes output float4
     * o (head g, chunk ch) over ranges part, part + parts, ... in order,
     * kMergeBatch loads at a time, with a running maximum. */
    const int nq = G * nc;
    int parts = (int)blockDim.x / nq;
    parts = parts < 1 ? 1 : parts > kMergeParts ? kMergeParts : parts;
    const int t = threadIdx.x;
    float M = -INFINITY, L = 0.0f;
    float4 R = make_float4(0.f, 0.f, 0.f, 0.f);
    const bool merger = t < parts * nq;
    if (merger) {
        const int o = t % nq, part = t / nq;
        const int g = o / nc, ch = o % nc, h = h0 + g;
        const float2 *ml = reinterpret_cast<const float2 *>(a.ws_ml) + (int64_t)h * a.splits;
        const float4 *wa =
            reinterpret_cast<const float4 *>(a.ws_acc) + (int64_t)h * a.splits * nc + ch;
        for (int b0 = part; b0 < active; b0 += parts * kMergeBatch) {
            float2 mlv[kMergeBatch];
            float4 av[kMergeBatch];
#pragma unroll
            for (int j = 0; j < kMergeBatch; j++) {
                const int sp = b0 + j * parts;
                mlv[j] = make_float2(-INFINITY, 0.0f);
                av[j] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (sp < active) {
                    mlv[j] = __ldcg(ml + sp);
                    av[j] = __ldcg(wa + (int64_t)sp * nc);
                }
            }
            float mb = M;
#pragma unroll
            for (int j = 0; j < kMergeBatch; j++)
                if (mlv[j].y > 0.0f)
                    mb = fmaxf(mb, mlv[j].x);
            if (mb == -INFINITY)
                continue;
            const float c = expf(M - mb); /* M == -inf: 0 */
            L *= c;
            R = f4_scale(R, c);
#pragma unroll
            for (int j = 0; j < kMergeBatch; j++)
                if (mlv[j].y > 0.0f) {
                    const float w = expf(mlv[j].x - mb);
                    L += mlv[j].y * w;
                    R = f4_axpy(w, av[j], R);
                }
            M = mb;
        }
    }
    /* The parts of each output, in part order. */
    if (merger) {
        sm_pm[t] = M;
        sm_pl[t] = L;
        parts_sm.acc[t] = R;
    }
    __syncthreads();
    if (t < nq) {
        const int g = t / nc, ch = t % nc;
        float mx = -INFINITY;
        for (int q = 0; q < parts; q++)
            if (sm_pl[q * nq + t] > 0.0f)
                mx = fmaxf(mx, sm_pm[q * nq + t]);
        float total = 0.0f;
        float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
        if (mx != -INFINITY)
            for (int q = 0; q < parts; q++)
                if (sm_pl[q * nq + t] > 0.0f) {
                    const float e = expf(sm_pm[q * nq + t] - mx);
                    total += sm_pl[q * nq + t] * e;
                    r = f4_axpy(e, parts_sm.acc[q * nq + t], r);
                }
        out4[(int64_t)(h0 + g) * nc + ch] =
            total > 0.0f ? f4_div(r, total) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    pdl_mark(3);
}

/* Decode through a thread-block cluster (sm_90), grid (n_heads / G, C) in
 * clusters of (1, C): the C blocks of a column form one cluster. Block r
 * of the cluster takes the tiles r, r + C, r + 2 C, ... of the length (the
 * tiles dealt out in turn, so the blocks' loads differ by at most a tile;
 * a tile is kDecRows positions per warp, cluster_warps warps), its first
 * tile loaded before the wait: C tiles of positions are in registers when
 * q is ready.
 *
 * The merge: output slot o (head g, chunk ch: o = g nc + ch) belongs to
 * block o % C. After its own warp merge each block stores its (max, sum,
 * acc) of every slot straight into the owning block's shared memory, in
 * the row of its rank, once every block of the cluster has started (a
 * cluster barrier phase, arrived at on entry), by asynchronous remote
 * stores (st.async) that count their bytes on the owner's transaction
 * barrier; each block armed its own for exactly what it receives before
 * that phase, and waits on it alone: no cluster-wide barrier at the end (a
 * cluster barrier there cost ~0.8 us; with these stores the 2B-4T step
 * went 918 -> 905 us). A block leaves only once everything sent to it has
 * landed, so every store finds its target alive. Then the owner's thread
 * (j, s), s < C, takes block s's values of
 * slot j C + r from its own shared memory, and the C threads (consecutive
 * lanes of one warp) combine them with a butterfly over the lanes: the
 * result depends on the length and C only. No workspace, no counters, no
 * last block, no L2 round trip of the partial results. */
constexpr int kMaxCluster = 16;

/* Warps of a cluster decode block: 16 where a lane holds one float4 chunk
 * of a head (head_dim <= 128), so a block's 80 positions at the 2B-4T
 * shape's context 640 are one tile, scored by 16 warps at once instead of
 * two tiles one after the other on 8; then only that one tile is loaded
 * before the wait, which keeps a thread within the 128 registers that 512
 * threads an SM allow (two tiles in registers took 156). Two chunks a lane
 * keep 8 warps and one tile. */
template <int KC> __host__ __device__ constexpr int cluster_warps() { return KC == 1 ? 16 : 8; }

/* The kQkv kernel's dynamic shared memory: the codes row (k_padded bytes),
 * the column's raw q|k|v ((G + 2) hd floats), the block's weight tiles. */
__host__ __device__ __forceinline__ size_t qkv_raw_offset(const DecodeArgs &a)
{
    return (size_t)a.groups * kGemvGroup;
}
__host__ __device__ __forceinline__ size_t qkv_tiles_offset(const DecodeArgs &a)
{
    return qkv_raw_offset(a) + (size_t)a.col_tiles * kGemvTileRows * sizeof(float);
}
__host__ __device__ __forceinline__ size_t qkv_smem(const DecodeArgs &a)
{
    return qkv_tiles_offset(a) + (size_t)a.block_tiles * a.groups * kGemvBlockBytes;
}

/* Column tile j (of (G + 2) hd / 8: q of the column's G heads, then k,
 * then v of its kv head) as a tile of the fused q|k|v weights. */
__device__ __forceinline__ int64_t qkv_tile(const DecodeArgs &a, int h0, int kvh, int G, int j)
{
    const int ht = a.s.head_dim / kGemvTileRows; /* tiles per head */
    if (j < G * ht)
        return (int64_t)h0 * ht + j;
    if (j < (G + 1) * ht)
        return (int64_t)a.q_tiles + (int64_t)kvh * ht + (j - G * ht);
    return (int64_t)a.q_tiles + a.kv_tiles + (int64_t)kvh * ht + (j - (G + 1) * ht);
}

/* kQkv: the q|k|v product is computed here instead of by a GEMV before.
 * Before the PDL wait each block bulk-copies its share of the column's
 * weight tiles (block_tiles of 8 rows: the 2B-4T shape's 64 rows, 40 KB)
 * into shared memory and arms the codes row's multicast; after it the
 * cluster stages the codes row once (row_multicast), each warp multiplies
 * whole tiles (the GEMV's entry dot and epilogue with weight scale 1, so
 * the raw values are the GEMV's bit for bit), and every value goes to
 * every block's copy of the column's raw q|k|v by an asynchronous remote
 * store (st.async) that counts its bytes on that block's transaction
 * barrier, armed at the start for the whole column: a block goes on once
 * all of its column's values have landed, with no cluster-wide barrier
 * (one measured ~0.8 us here). The blocks of such a kernel start right
 * after the one-block norm kernel (the GPU is free), so the copies and the
 * cache rows are in flight early, where a cluster after the q|k|v GEMV's
 * grid starts only as it drains. */
template <int KC, int G, bool kQkv>
__global__ void __launch_bounds__(32 * cluster_warps<KC>(), 1)
    attn_decode_cluster_kernel(DecodeArgs a)
{
#if BN_HAS_CLUSTERS
    namespace cg = cooperative_groups;
    constexpr int W = cluster_warps<KC>();
    constexpr int kTile = W * kDecRows; /* positions of a block's tile */
    constexpr int kOut = G * 32 * KC; /* at most this many output slots (G nc) */
    static_assert(kOut + kMaxCluster <= 32 * W, "one merge pass: a thread per (slot, block)");
    __shared__ WarpParts<KC, G, W> parts_sm;
    /* What the cluster's blocks send this one: block s's (max, sum) of head
     * g at [s][g], its acc of this block's j-th slot at [s * per + j]. */
    __shared__ float in_m[kMaxCluster][G], in_l[kMaxCluster][G];
    __shared__ float4 in_acc[kOut + kMaxCluster];
    cg::cluster_group cluster = cg::this_cluster();
    const int C = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    DecodeBlock<KC, G, kQkv> b(a, blockIdx.x);
    extern __shared__ __align__(128) unsigned char qkv_sm[];
    /* The codes row, the weight tiles, the column's raw values from the
     * cluster's blocks. */
    __shared__ unsigned long long qkv_bars[3];
    int8_t *xs = reinterpret_cast<int8_t *>(qkv_sm);
    float *raw = reinterpret_cast<float *>(qkv_sm + qkv_raw_offset(a));
    unsigned char *wsm = qkv_sm + qkv_tiles_offset(a);
    const int j0 = rank * a.block_tiles;
    const int nt = kQkv ? min(a.block_tiles, a.col_tiles - j0) : 0;
    const unsigned tile_bytes = (unsigned)a.groups * kGemvBlockBytes;
    const unsigned row_bytes = (unsigned)qkv_raw_offset(a); /* the codes row */
    /* The blocks' partial results reach their owners by asynchronous remote
     * stores counted on this barrier, armed here for what this block will
     * receive: from each block its slots o = rank, rank + C, ... of the nq
     * (16 bytes each) and the (max, sum) of the G heads. */
    __shared__ unsigned long long parts_bar;
    if (threadIdx.x == 0) {
        const int nq = G * (a.s.head_dim / 4);
        const int mine = nq > rank ? (nq - 1 - rank) / C + 1 : 0;
        bulk_bar_init(&parts_bar);
        bar_expect(&parts_bar, (unsigned)(C * (mine * (int)sizeof(float4) +
                                               2 * G * (int)sizeof(float))));
    }
    /* Distributed shared memory may be written only once every block of
     * the cluster has started: each block says so here, and waits for the
     * others just before its first remote store (by then long since true,
     * so the wait costs nothing). With kQkv the codes row's multicast arms
     * and arrives (it waits at the row, the first remote writes). */
    if constexpr (kQkv) {
        if (threadIdx.x == 0) {
            /* The raw values arrive by asynchronous remote stores that count
             * their bytes on this barrier: armed now for the whole column. */
            bulk_bar_init(&qkv_bars[2]);
            bar_expect(&qkv_bars[2], (unsigned)(a.col_tiles * kGemvTileRows * sizeof(float)));
            bulk_bar_init(&qkv_bars[1]);
            if (nt > 0) {
                bar_expect(&qkv_bars[1], (unsigned)nt * tile_bytes);
                for (int j = 0; j < nt; j++)
                    bulk_issue(wsm + (size_t)j * tile_bytes,
                               a.w_qkv + qkv_tile(a, b.h0, b.kvh, G, j0 + j) * tile_bytes,
                               tile_bytes, &qkv_bars[1]);
            }
        }
        row_multicast_arm(&qkv_bars[0], row_bytes);
    } else {
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    }
    const int nc = b.nc, p = b.p, len = b.len;
    const int nq = G * nc, per = (nq + C - 1) / C; /* slots, and slots per block */
    const int step = C * kTile;
    const int first = rank * kTile;

    /* Rows before p only: p's own k and v come from the product. */
    float4 kA[kDecRows][KC], vA[kDecRows][KC];
    if (first < len)
        load_rows<KC>(kA, vA, a, first, p, b.head_off);
    b.load_rope(a);
    prefetch_next_layer(a, p, blockIdx.x + gridDim.x * rank, gridDim.x * C);
    pdl_trigger();
    pdl_wait();

    if constexpr (kQkv) {
        /* The scale and sum first: their L2 round trip overlaps the row's. */
        const float x_scale = __ldcg(a.act_scale);
        const int32_t x_sum = __ldcg(a.act_sum);
        row_multicast(xs, a.xq, row_bytes, &qkv_bars[0], C);
        pdl_mark(0); /* (kQkv's marks: the codes row, the product, raw published, stored) */
        if (nt > 0)
            bulk_wait(&qkv_bars[1]);
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        for (int j = warp; j < nt; j += W) {
            const uint4 *tw = reinterpret_cast<const uint4 *>(wsm + (size_t)j * tile_bytes);
            const int8_t *xl = xs + (lane / 8) * (kGemvGroup / 4);
            int acc4[4] = {0, 0, 0, 0};
            for (int g = 0; g < a.groups; g++)
                gemv_entry_dot4(tw[g * 32 + lane], xl + g * kGemvGroup, acc4);
            int acc = (acc4[0] + acc4[1]) + (acc4[2] + acc4[3]);
            acc += __shfl_xor_sync(kFull, acc, 8);
            acc += __shfl_xor_sync(kFull, acc, 16);
            /* Lanes r, r + 8, r + 16, r + 24 all hold row r's sum: each
             * sends it to a quarter of the blocks. The GEMV's epilogue with
             * weight scale 1 (x 1 is exact). */
            const float v = __fdiv_rn((float)(acc - x_sum), x_scale);
            const int idx = (j0 + j) * kGemvTileRows + lane % kGemvTileRows;
            for (int q = lane / kGemvTileRows; q < C; q += 32 / kGemvTileRows)
                st_async_to(raw + idx, v, &qkv_bars[2], (unsigned)q);
        }
        pdl_mark(1);
        bulk_wait(&qkv_bars[2]); /* every block's values of the column have landed */
        pdl_mark(2);
        b.src_q = raw;
        b.src_k = raw + G * a.s.head_dim;
        b.src_v = raw + (G + 1) * a.s.head_dim;
    }
    b.start(a);
    if constexpr (!kQkv)
        pdl_mark(0);
    for (int t0 = first; t0 < len; t0 += step) {
        if (t0 != first) /* the first tile was loaded before the wait */
            load_rows<KC>(kA, vA, a, t0, p, b.head_off);
        b.tile(a, kA, vA, t0, len);
    }

    /* The block's (max, sum, acc) per slot, sent to the slot's owner. */
    parts_sm.put(b);
    __syncthreads();
    if constexpr (!kQkv) /* (kQkv: waited at the codes row) */
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); /* every block has started */
    for (int o = threadIdx.x; o < nq; o += blockDim.x) {
        const int g = o / nc, ch = o % nc;
        float mx, total;
        const float4 r = parts_sm.merge(g * 32 * KC + ch, g, mx, total);
        st_async_to(&in_acc[rank * per + o / C], r, &parts_bar, (unsigned)(o % C));
        if (ch == 0)
            for (int q = 0; q < C; q++) {
                st_async_to(&in_m[0][0] + rank * G + g, mx, &parts_bar, (unsigned)q);
                st_async_to(&in_l[0][0] + rank * G + g, total, &parts_bar, (unsigned)q);
            }
    }
    if constexpr (!kQkv)
        pdl_mark(1);
    bulk_wait(&parts_bar); /* every block's values for this one have landed */
    if constexpr (!kQkv)
        pdl_mark(2);

    const int s = threadIdx.x % C, j = threadIdx.x / C, o = j * C + rank;
    const bool mine = o < nq;
    float ms = -INFINITY, ls = 0.0f;
    float4 rs = make_float4(0.f, 0.f, 0.f, 0.f);
    if (mine) {
        ms = in_m[s][o / nc];
        ls = in_l[s][o / nc];
        rs = in_acc[s * per + j];
    }
    /* Blocks that saw no position (sum 0) weigh 0. */
    float M = ls > 0.0f ? ms : -INFINITY;
    for (int x = 1; x < C; x <<= 1)
        M = fmaxf(M, __shfl_xor_sync(kFull, M, x));
    const float e = ls > 0.0f ? expf(ms - M) : 0.0f;
    float L = ls * e;
    float4 R = f4_scale(rs, e);
    for (int x = 1; x < C; x <<= 1) {
        L += __shfl_xor_sync(kFull, L, x);
        R.x += __shfl_xor_sync(kFull, R.x, x);
        R.y += __shfl_xor_sync(kFull, R.y, x);
        R.z += __shfl_xor_sync(kFull, R.z, x);
        R.w += __shfl_xor_sync(kFull, R.w, x);
    }
    if (mine && s == 0) {
        const int g = o / nc, ch = o % nc;
        reinterpret_cast<float4 *>(a.out)[(int64_t)(b.h0 + g) * nc + ch] =
            L > 0.0f ? f4_div(R, L) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    pdl_mark(3);
#else
    (void)a;
    __trap(); /* the launcher uses clusters only where this code was compiled */
#endif
}

/* Prefill: grid (ceil(n / 16), n_heads), kAttnWarps warps, each warp owning
 * 4 query rows. Keys and values go through shared memory in tiles of 32
 * positions (rows padded by 4 floats: conflict-free float4 reads by key);
 * for each of its rows a warp scores the tile's 32 keys (lane j: key j),
 * updates its online softmax and accumulates p . V (lane l: chunks l,
 * l + 32). */
constexpr int kPrefillRows = 16;
constexpr int kRowsPerWarp = kPrefillRows / kAttnWarps;
constexpr int kKeyTile = 32;

__host__ __device__ constexpr size_t prefill_smem(int hd)
{
    return sizeof(float) * ((size_t)kPrefillRows * hd + 2 * (size_t)kKeyTile * (hd + 4)) +
           sizeof(int) * kPrefillRows;
}

__global__ void __launch_bounds__(32 * kAttnWarps)
    attn_prefill_kernel(bn_cb_attn_shape s, const float *__restrict__ q, int64_t ldq, int n,
                        const int32_t *__restrict__ pos, const float *__restrict__ kc,
                        const float *__restrict__ vc, float scale, float *__restrict__ out,
                        int64_t ldo)
{
    extern __shared__ __align__(16) float smem[];
    const int hd = s.head_dim, nc = hd / 4, ks = hd + 4;
    float *qs = smem;                            /* [16][hd]    */
    float *kt = qs + kPrefillRows * hd;          /* [32][hd+4]  */
    float *vt = kt + kKeyTile * ks;              /* [32][hd+4]  */
    int *qpos = reinterpret_cast<int *>(vt + kKeyTile * ks);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y;
    const int row0 = blockIdx.x * kPrefillRows;
    const int group = s.n_heads / s.n_kv_heads;
    const int64_t kv_dim = (int64_t)s.n_kv_heads * hd;
    const int64_t head_off = (int64_t)(h / group) * hd;

    for (int i = threadIdx.x; i < kPrefillRows * nc; i += blockDim.x) {
        const int r = i / nc, ch = i % nc;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row0 + r < n)
            v = reinterpret_cast<const float4 *>(q + (int64_t)(row0 + r) * ldq +
                                                 (int64_t)h * hd)[ch];
        reinterpret_cast<float4 *>(qs + r * hd)[ch] = v;
    }
    if (threadIdx.x < kPrefillRows) {
        const int r = row0 + threadIdx.x;
        int p = r < n ? pos[r] : -1;
        if ((int64_t)p >= s.capacity)
            p = -1; /* nothing there to attend to: the row is not written */
        qpos[threadIdx.x] = p;
    }
    __syncthreads();
    int max_pos = -1;
    for (int r = 0; r < kPrefillRows; r++)
        max_pos = max(max_pos, qpos[r]);

    float m[kRowsPerWarp], l[kRowsPerWarp];
    float4 acc[kRowsPerWarp][kMaxChunks];
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; j++) {
        m[j] = -INFINITY;
        l[j] = 0.0f;
#pragma unroll
        for (int c = 0; c < kMaxChunks; c++)
            acc[j][c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    for (int t0 = 0; t0 <= max_pos; t0 += kKeyTile) {
        __syncthreads(); /* the previous tile is no longer read */
        for (int i = threadIdx.x; i < kKeyTile * nc; i += blockDim.x) {
            const int r = i / nc, ch = i % nc;
            const int t = t0 + r;
            float4 kv4 = make_float4(0.f, 0.f, 0.f, 0.f), vv4 = kv4;
            if (t <= max_pos) {
                kv4 = reinterpret_cast<const float4 *>(kc + (int64_t)t * kv_dim + head_off)[ch];
                vv4 = reinterpret_cast<const float4 *>(vc + (int64_t)t * kv_dim + head_off)[ch];
            }
            reinterpret_cast<float4 *>(kt + r * ks)[ch] = kv4;
            reinterpret_cast<float4 *>(vt + r * ks)[ch] = vv4;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; j++) {
            const int r = warp * kRowsPerWarp + j;
            const int p = qpos[r];
            if (p < t0)
                continue; /* warp-uniform: no key of this tile is visible */
            const bool visible = t0 + lane <= p;
            float score = -INFINITY;
            if (visible) {
                const float4 *qr = reinterpret_cast<const float4 *>(qs + r * hd);
                const float4 *kr = reinterpret_cast<const float4 *>(kt + lane * ks);
                float dot = 0.0f;
                for (int ch = 0; ch < nc; ch++)
                    dot = f4_dot(qr[ch], kr[ch], dot);
                score = dot * scale;
            }
            const float m_new = fmaxf(m[j], warp_reduce(score, MaxF()));
            const float corr = expf(m[j] - m_new);
            const float pj = visible ? expf(score - m_new) : 0.0f;
            l[j] = fmaf(l[j], corr, warp_reduce(pj, SumF()));
#pragma unroll
            for (int c = 0; c < kMaxChunks; c++)
                acc[j][c] = f4_scale(acc[j][c], corr);
            const int last = min(kKeyTile - 1, p - t0);
            for (int key = 0; key <= last; key++) {
                const float pk = __shfl_sync(kFull, pj, key);
#pragma unroll
                for (int c = 0; c < kMaxChunks; c++) {
                    const int ch = lane + 32 * c;
                    if (ch < nc)
                        acc[j][c] = f4_axpy(pk, reinterpret_cast<const float4 *>(vt + key * ks)[ch],
                                            acc[j][c]);
                }
            }
            m[j] = m_new;
        }
    }

#pragma unroll
    for (int j = 0; j < kRowsPerWarp; j++) {
        const int r = warp * kRowsPerWarp + j;
        if (qpos[r] < 0)
            continue;
        const float inv = 1.0f / l[j];
        float4 *o = reinterpret_cast<float4 *>(out + (int64_t)(row0 + r) * ldo + (int64_t)h * hd);
#pragma unroll
        for (int c = 0; c < kMaxChunks; c++) {
            const int ch = lane + 32 * c;
            if (ch < nc)
                o[ch] = f4_scale(acc[j][c], inv);
        }
    }
}

/* ---- LM head ---------------------------------------------------------------------- */

constexpr int kHeadThreads = 256;

/* x is staged in shared memory; each warp takes whole rows (grid-stride),
 * each one head_row_dot (head_row.cuh). */
template <int kType, bool kVec>
__global__ void __launch_bounds__(kHeadThreads)
    head_kernel(const uint8_t *__restrict__ w, int64_t rows, int64_t dim,
                const float *__restrict__ x, float *__restrict__ logits)
{
    extern __shared__ __align__(16) float xs[];
    const int64_t row_bytes = dim * HeadElem<kType>::kBytes;
    for (int64_t i = threadIdx.x; i < dim; i += kHeadThreads)
        xs[i] = x[i];
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (kHeadThreads / 32);
    for (int64_t r = (int64_t)blockIdx.x * (kHeadThreads / 32) + (threadIdx.x >> 5); r < rows;
         r += warps) {
        const float acc = head_row_dot<kType, kVec>(w + r * row_bytes, xs, dim, lane);
        if (lane == 0)
            logits[r] = acc;
    }
}

template <int kType>
cudaError_t launch_head(const void *w, int64_t rows, int64_t dim, const float *x, float *logits,
                        int sm_count, cudaStream_t stream)
{
    const int64_t per_block = kHeadThreads / 32;
    int64_t blocks = (rows + per_block - 1) / per_block;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 132) * 8;
    blocks = blocks < cap ? blocks : cap;
    const auto kernel = head_row_vec<kType>(dim) ? head_kernel<kType, true>
                                                 : head_kernel<kType, false>;
    kernel<<<(unsigned)blocks, kHeadThreads, sizeof(float) * (size_t)dim, stream>>>(
        static_cast<const uint8_t *>(w), rows, dim, x, logits);
    return cudaGetLastError();
}

template <int kType> cudaError_t set_head_smem(int64_t dim)
{
    const size_t smem = sizeof(float) * (size_t)dim;
    const cudaError_t rc = allow_dynamic_smem(head_kernel<kType, true>, smem);
    return rc == cudaSuccess ? allow_dynamic_smem(head_kernel<kType, false>, smem) : rc;
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
           pdl_compiled(attn_decode_kernel<1, 4>) &&
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

extern "C" cudaError_t bn_cb_rope_table(const bn_rope_freqs *freqs, int64_t n_pos, float *table,
                                        cudaStream_t stream)
{
    if (!freqs || !table || n_pos < 0 || n_pos > INT32_MAX || freqs->rope_dim < 2 ||
        freqs->rope_dim % 2 != 0 || freqs->rope_dim > BN_ROPE_MAX_DIM)
        return cudaErrorInvalidValue;
    const int64_t total = n_pos * (freqs->rope_dim / 2);
    if (total == 0)
        return cudaSuccess;
    rope_table_kernel<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(
        *freqs, n_pos, reinterpret_cast<float2 *>(table));
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_qkv_post(const float *raw, int64_t ldraw, int64_t m,
                                      const bn_cb_qkv_shape *s, const bn_rope_freqs *freqs,
                                      const float *table, int64_t table_len, const int32_t *pos,
                                      float *q_out, int64_t ldq, void *k_cache, void *v_cache,
                                      int kv_f16, int pdl, cudaStream_t stream)
{
    if (!raw || !s || !freqs || !pos || !q_out || !k_cache || !v_cache || m < 0 ||
        m > INT32_MAX || s->head_dim <= 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 ||
        freqs->rope_dim < 0 || freqs->rope_dim % 2 != 0 || freqs->rope_dim > s->head_dim ||
        freqs->rope_dim > BN_ROPE_MAX_DIM || table_len < 0 || (table_len > 0 && !table) ||
        ldraw < (int64_t)(s->n_heads + 2 * s->n_kv_heads) * s->head_dim ||
        ldq < (int64_t)s->n_heads * s->head_dim)
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    const int64_t values = (int64_t)(s->n_heads + 2 * s->n_kv_heads) * s->head_dim;
    if ((values + 255) / 256 > 65535)
        return cudaErrorInvalidValue;
    const float2 *t = reinterpret_cast<const float2 *>(table);
    if (qkv_post_vec_fits(raw, ldraw, s, freqs, table, q_out, ldq, k_cache, v_cache)) {
        const dim3 grid4((unsigned)m, (unsigned)((values / 4 + 255) / 256));
        if (kv_f16)
            return pdl_launch(qkv_post_kernel<true, 4>, grid4, dim3(256), 0, stream, pdl, raw,
                              ldraw, *s, *freqs, t, table_len, pos, q_out, ldq, k_cache, v_cache);
        return pdl_launch(qkv_post_kernel<false, 4>, grid4, dim3(256), 0, stream, pdl, raw, ldraw,
                          *s, *freqs, t, table_len, pos, q_out, ldq, k_cache, v_cache);
    }
    const dim3 grid((unsigned)m, (unsigned)((values + 255) / 256));
    if (kv_f16)
        return pdl_launch(qkv_post_kernel<true, 1>, grid, dim3(256), 0, stream, pdl, raw, ldraw,
                          *s, *freqs, t, table_len, pos, q_out, ldq, k_cache, v_cache);
    return pdl_launch(qkv_post_kernel<false, 1>, grid, dim3(256), 0, stream, pdl, raw, ldraw, *s,
                      *freqs, t, table_len, pos, q_out, ldq, k_cache, v_cache);
}

static bool attn_shape_ok(const bn_cb_attn_shape *s)
{
    return s && s->n_heads > 0 && s->n_kv_heads > 0 && s->n_heads % s->n_kv_heads == 0 &&
           s->head_dim > 0 && s->head_dim % 4 == 0 && s->head_dim <= 32 * 4 * kMaxChunks &&
           s->capacity > 0 && s->capacity <= INT32_MAX;
}

extern "C" int bn_cb_attn_decode_splits(int64_t capacity)
{
    /* One tile (kDecTile positions) per range at the full length, as many ranges
     * as that takes up to kMaxSplits; at shorter lengths the ranges keep at
     * least kMinRange positions and the rest stay empty. */
    const int64_t splits = (capacity + kMinRange - 1) / kMinRange;
    return (int)(splits < 1 ? 1 : splits > kMaxSplits ? kMaxSplits : splits);
}

extern "C" size_t bn_cb_attn_decode_workspace_bytes(const bn_cb_attn_shape *s, int splits)
{
    if (!s || splits < 1)
        return 0;
    return sizeof(float) * (size_t)s->n_heads * (size_t)splits * (2 + (size_t)s->head_dim);
}

/* The decode kernels of a shape. G query heads of a kv head per block (each
 * cache row read once for them). The ticket kernel: 4 where the group
 * allows (2 with head_dim > 128, for the registers), else 2, else 1. The
 * cluster kernel: 2 where the group is even, else 1; measured on the 2B-4T
 * shape (H200, 20 query / 5 kv heads), 2 heads a block in clusters of 8 (80
 * blocks of 80 positions at context 640) made the decode step 1005-1015 us
 * against 1034-1049 us with 4 in clusters of 16 (80 blocks of 40
 * positions), alternated in one run; 1 head a block was no better than 2. */
struct DecodeKernels {
    void (*ticket)(DecodeArgs);
    void (*cluster)(DecodeArgs);
    void (*cluster_qkv)(DecodeArgs); /* with the q|k|v product inside */
    int g_ticket, g_cluster;
    int cluster_threads; /* a block of the cluster kernels */

    int g(bool clustered) const { return clustered ? g_cluster : g_ticket; }
};

static DecodeKernels decode_kernels(const bn_cb_attn_shape *s)
{
    const int group = s->n_heads / s->n_kv_heads;
    const bool wide = s->head_dim > 32 * 4;
    const int gc = group % 2 == 0 ? 2 : 1;
    DecodeKernels k;
    k.g_cluster = gc;
    k.cluster_threads = 32 * (wide ? cluster_warps<2>() : cluster_warps<1>());
    if (!wide) {
        k.cluster = gc == 2 ? attn_decode_cluster_kernel<1, 2, false>
                            : attn_decode_cluster_kernel<1, 1, false>;
        k.cluster_qkv = gc == 2 ? attn_decode_cluster_kernel<1, 2, true>
                                : attn_decode_cluster_kernel<1, 1, true>;
        k.g_ticket = group % 4 == 0 ? 4 : gc;
        k.ticket = k.g_ticket == 4   ? attn_decode_kernel<1, 4>
                   : k.g_ticket == 2 ? attn_decode_kernel<1, 2>
                                     : attn_decode_kernel<1, 1>;
    } else {
        k.cluster = gc == 2 ? attn_decode_cluster_kernel<2, 2, false>
                            : attn_decode_cluster_kernel<2, 1, false>;
        k.cluster_qkv = gc == 2 ? attn_decode_cluster_kernel<2, 2, true>
                                : attn_decode_cluster_kernel<2, 1, true>;
        k.g_ticket = gc;
        k.ticket = gc == 2 ? attn_decode_kernel<2, 2> : attn_decode_kernel<2, 1>;
    }
    return k;
}

static bool decode_cluster_size_ok(int c)
{
    return c == 2 || c == 4 || c == 8 || c == kMaxCluster;
}

/* Whether `cols` clusters of c blocks of the decode kernel (with smem bytes
 * of dynamic shared memory) can be resident at once: cudaSuccess, else
 * cudaErrorNotSupported or the query's error (cleared). */
static cudaError_t clusters_resident(void (*kernel)(DecodeArgs), int threads, int cols, int c,
                                     size_t smem)
{
    int n = 0;
    const cudaError_t rc = resident_clusters(kernel, dim3((unsigned)cols, (unsigned)c),
                                             dim3((unsigned)threads), smem,
                                             dim3(1, (unsigned)c, 1), &n);
    if (rc != cudaSuccess)
        return rc;
    return n >= cols ? cudaSuccess : cudaErrorNotSupported;
}

extern "C" int bn_cb_attn_decode_cluster(const bn_cb_attn_shape *s, int cap)
{
    if (!attn_shape_ok(s))
        return 0;
    const DecodeKernels k = decode_kernels(s);
    if (!clusters_usable(k.cluster) ||
        cudaFuncSetAttribute(k.cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
            cudaSuccess) {
        (void)cudaGetLastError(); /* a failed query is nobody's launch error */
        return 0;
    }
    /* The largest size up to the cap of which every column's cluster can be
     * resident at once. */
    const int cols = s->n_heads / k.g(true);
    int largest = kMaxCluster;
    while (cap > 0 && largest > cap)
        largest /= 2;
    for (int c = largest; c >= 2; c /= 2)
        if (clusters_resident(k.cluster, k.cluster_threads, cols, c, 0) == cudaSuccess)
            return c;
    return 0;
}

/* The kQkv kernel's share of a column's tiles per block and its shared
 * memory, for cluster size C and rows of k weights; false where the shape
 * does not allow the product inside (head_dim % 8, the dynamic shared
 * memory). */
static bool qkv_plan(const bn_cb_attn_shape *s, int g, int C, int64_t k, DecodeArgs *d)
{
    if (s->head_dim % kGemvTileRows != 0 || k <= 0 || C < 2)
        return false;
    d->groups = (int)((k + kGemvGroup - 1) / kGemvGroup);
    d->q_tiles = s->n_heads * s->head_dim / kGemvTileRows;
    d->kv_tiles = s->n_kv_heads * s->head_dim / kGemvTileRows;
    d->col_tiles = (g + 2) * s->head_dim / kGemvTileRows;
    d->block_tiles = (d->col_tiles + C - 1) / C;
    return qkv_smem(*d) <= 160 * 1024;
}

extern "C" cudaError_t bn_cb_attn_decode_qkv_prepare(const bn_cb_attn_shape *s, int cluster,
                                                     int64_t k)
{
    if (!attn_shape_ok(s) || !decode_cluster_size_ok(cluster))
        return cudaErrorInvalidValue;
    const DecodeKernels kd = decode_kernels(s);
    DecodeArgs d;
    memset(&d, 0, sizeof d);
    d.s = *s;
    if (!qkv_plan(s, kd.g_cluster, cluster, k, &d))
        return cudaErrorNotSupported;
    const size_t smem = qkv_smem(d);
    cudaError_t rc = cudaFuncSetAttribute(kd.cluster_qkv,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (rc == cudaSuccess && cluster > 8)
        rc = cudaFuncSetAttribute(kd.cluster_qkv,
                                  cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return rc;
    }
    /* Every column's cluster resident at once, as the kernel without. */
    return clusters_resident(kd.cluster_qkv, kd.cluster_threads, s->n_heads / kd.g_cluster,
                             cluster, smem);
}

extern "C" cudaError_t bn_cb_attn_decode(const bn_cb_attn_shape *s,
                                         const bn_cb_attn_decode_args *a, int pdl,
                                         cudaStream_t stream)
{
    const bool inside = a && a->w_qkv;
    if (inside && (a->cluster == 0 || !a->xq || !a->act_scale || !a->act_sum || a->w_k <= 0 ||
                   ((uintptr_t)a->w_qkv & 15) != 0 || ((uintptr_t)a->xq & 15) != 0))
        return cudaErrorInvalidValue;
    if (!attn_shape_ok(s) || !a || (!inside && !a->qkv) || !a->pos || !a->k_cache || !a->v_cache ||
        !a->out || a->rope_dim < 0 || a->rope_dim % 2 != 0 || a->rope_dim > s->head_dim ||
        (a->rope_dim > 0 && !a->rope) || ((uintptr_t)a->qkv & 15) != 0 ||
        ((uintptr_t)a->k_cache & 15) != 0 || ((uintptr_t)a->v_cache & 15) != 0 ||
        (a->cluster != 0 && !decode_cluster_size_ok(a->cluster)))
        return cudaErrorInvalidValue;
    /* The ticket's merge needs the workspace and counters. */
    if (a->cluster == 0 && (!a->workspace || !a->counters || a->splits < 1 ||
                            a->splits > kMaxSplits || ((uintptr_t)a->workspace & 15) != 0))
        return cudaErrorInvalidValue;
    DecodeArgs d;
    memset(&d, 0, sizeof d);
    d.s = *s;
    d.qkv = inside ? nullptr : a->qkv;
    d.sq = a->scale_q;
    d.sk = a->scale_k;
    d.sv = a->scale_v;
    d.rope = reinterpret_cast<const float2 *>(a->rope);
    d.half = a->rope_dim / 2;
    d.rope_vec = d.half > 0 && d.half % 4 == 0 && ((uintptr_t)a->rope & 15) == 0;
    d.pos = a->pos;
    d.kc = a->k_cache;
    d.vc = a->v_cache;
    d.splits = a->cluster != 0 ? a->cluster : a->splits;
    d.scale = (float)(1.0 / sqrt((double)s->head_dim));
    /* Accumulators first: every slot's float4 row stays 16-byte aligned
     * (and the (max, sum) pairs 8-byte aligned). */
    d.ws_acc = a->cluster != 0 ? nullptr : a->workspace;
    d.ws_ml = a->cluster != 0 ? nullptr
                              : a->workspace + (size_t)s->n_heads * (size_t)a->splits *
                                                   (size_t)s->head_dim;
    d.counters = a->cluster != 0 ? nullptr : a->counters;
    d.out = a->out;
    d.pf_k = a->next_k_cache && a->next_v_cache ? a->next_k_cache : nullptr;
    d.pf_v = d.pf_k ? a->next_v_cache : nullptr;
    const DecodeKernels k = decode_kernels(s);
    const int g = k.g(a->cluster != 0);
    d.subgroups = s->n_heads / s->n_kv_heads / g;
    const dim3 grid((unsigned)(s->n_heads / g), (unsigned)d.splits);
    const dim3 block(a->cluster != 0 ? k.cluster_threads : 32 * kDecWarps);
    if (inside) {
        if (!qkv_plan(s, g, a->cluster, a->w_k, &d))
            return cudaErrorInvalidValue;
        d.w_qkv = a->w_qkv;
        d.xq = a->xq;
        d.act_scale = a->act_scale;
        d.act_sum = a->act_sum;
        return pdl_launch_clustered(k.cluster_qkv, grid, block, qkv_smem(d),
                                    dim3(1, (unsigned)a->cluster, 1), stream, pdl, d);
    }
    if (a->cluster != 0)
        return pdl_launch_clustered(k.cluster, grid, block, 0, dim3(1, (unsigned)a->cluster, 1),
                                    stream, pdl, d);
    return pdl_launch(k.ticket, grid, block, 0, stream, pdl, d);
}

extern "C" cudaError_t bn_cb_attn_prefill_prepare(int head_dim)
{
    if (head_dim <= 0 || head_dim % 4 != 0 || head_dim > 32 * 4 * kMaxChunks)
        return cudaErrorInvalidValue;
    return allow_dynamic_smem(attn_prefill_kernel, prefill_smem(head_dim));
}

static bool prefill_args_ok(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n,
                            const int32_t *pos, const float *k_cache, const float *v_cache,
                            const float *out, int64_t ldo)
{
    return attn_shape_ok(s) && q && pos && k_cache && v_cache && out && n >= 0 &&
           s->n_heads <= 65535 && ldq >= (int64_t)s->n_heads * s->head_dim &&
           ldo >= (int64_t)s->n_heads * s->head_dim && ldq % 4 == 0 && ldo % 4 == 0;
}

static float prefill_scale(const bn_cb_attn_shape *s)
{
    return (float)(1.0 / sqrt((double)s->head_dim));
}

/* The warp-per-row kernel on arguments already checked. */
static cudaError_t launch_prefill_rowwise(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                          int n, const int32_t *pos, const float *k_cache,
                                          const float *v_cache, float *out, int64_t ldo,
                                          cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    const dim3 grid((unsigned)((n + kPrefillRows - 1) / kPrefillRows), (unsigned)s->n_heads);
    attn_prefill_kernel<<<grid, 32 * kAttnWarps, prefill_smem(s->head_dim), stream>>>(
        *s, q, ldq, n, pos, k_cache, v_cache, prefill_scale(s), out, ldo);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_attn_prefill(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                          int n, const int32_t *pos, const float *k_cache,
                                          const float *v_cache, float *out, int64_t ldo,
                                          int parts, void *ws, size_t ws_bytes,
                                          cudaStream_t stream)
{
    if (!prefill_args_ok(s, q, ldq, n, pos, k_cache, v_cache, out, ldo))
        return cudaErrorInvalidValue;
    if (bn_cb_attn_prefill_tiled_supports(s, q, ldq, k_cache, v_cache, out, ldo))
        return bn_cb_attn_prefill_tiled(s, q, ldq, n, pos, k_cache, v_cache, prefill_scale(s),
                                        out, ldo, parts, ws, ws_bytes, stream);
    return launch_prefill_rowwise(s, q, ldq, n, pos, k_cache, v_cache, out, ldo, stream);
}

extern "C" cudaError_t bn_cb_attn_prefill_rowwise(const bn_cb_attn_shape *s, const float *q,
                                                  int64_t ldq, int n, const int32_t *pos,
                                                  const float *k_cache, const float *v_cache,
                                                  float *out, int64_t ldo, cudaStream_t stream)
{
    if (!prefill_args_ok(s, q, ldq, n, pos, k_cache, v_cache, out, ldo))
        return cudaErrorInvalidValue;
    return launch_prefill_rowwise(s, q, ldq, n, pos, k_cache, v_cache, out, ldo, stream);
}

extern "C" cudaError_t bn_cb_head_prepare(int type, int64_t dim)
{
    if (dim <= 0 || dim > BN_CB_HEAD_MAX_DIM)
        return cudaErrorInvalidValue;
    switch (type) {
    case BN_CB_HEAD_F32: return set_head_smem<BN_CB_HEAD_F32>(dim);
    case BN_CB_HEAD_F16: return set_head_smem<BN_CB_HEAD_F16>(dim);
    case BN_CB_HEAD_BF16: return set_head_smem<BN_CB_HEAD_BF16>(dim);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t bn_cb_head_gemv(const void *w, int type, int64_t rows, int64_t dim,
                                       const float *x, float *logits, int sm_count,
                                       cudaStream_t stream)
{
    if (!w || !x || !logits || rows <= 0 || dim <= 0 || dim > BN_CB_HEAD_MAX_DIM)
        return cudaErrorInvalidValue;
    const int s = sm_count;
    switch (type) {
    case BN_CB_HEAD_F32: return launch_head<BN_CB_HEAD_F32>(w, rows, dim, x, logits, s, stream);
    case BN_CB_HEAD_F16: return launch_head<BN_CB_HEAD_F16>(w, rows, dim, x, logits, s, stream);
    case BN_CB_HEAD_BF16: return launch_head<BN_CB_HEAD_BF16>(w, rows, dim, x, logits, s, stream);
    default: return cudaErrorInvalidValue;
    }
}

#ifdef BN_DECODE_TRACE
BN_TRACE_ATTACH(bn_cb_trace_attach)
#endif
