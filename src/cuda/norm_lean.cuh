/*
 * norm_lean.cuh - the RMSNorm + int8 pieces shared by norm_quantize.cu and
 * the kernels that norm a row inside themselves (the mma-rows GEMM's norm
 * tail, w2a8_gemm_rows.cu): the row sources and arguments, the CPU's exact
 * code rule, and the lean kernel's body (a row by one block, its values
 * in registers). norm_quantize.cu has the contracts and the proofs' use.
 */
#ifndef BN_NORM_LEAN_CUH
#define BN_NORM_LEAN_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "attn_paged_shares.cuh"
#include "block_reduce.cuh"
#include "half_bits.cuh"
#include "pdl.cuh"
#include "qtype.h"

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr float kQuantEps = 1e-5f; /* BN_QUANT_EPS */

constexpr int kSrcPlain = 0, kSrcAdd = 1, kSrcRelu2 = 2;
/* The decode step's first norm reading its row from the embedding table
 * (the lean kernel only: bn_cb_embed_norm_quantize). */
constexpr int kSrcEmbed = 4;
/* The batched pass's attn_sub_norm reading its rows from the paged
 * attention's shares (the lean kernel only: bn_cb_merge_norm_quantize). */
constexpr int kSrcMerge = 5;

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

/* One row of a.k values (row `row`) by the whole block: the lean kernel's
 * body, also run by blocks of other kernels (the mma-rows GEMM's norm
 * tail, w2a8_gemm_rows.cu) with T = their block size (KV4 float4 a
 * thread must cover the row). red: the block's shared scratch. */
template <int kSrc, int KV4, bool kBatch>
__device__ __forceinline__ void lean_norm_row(const NormQuantArgs &a, int64_t row, LeanRed &red)
{
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

} // namespace

#endif
