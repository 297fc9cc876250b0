/*
 * head_screen.cu - the screened LM head of steps that pick their token on
 * the device: the token the full head + argmax (or + a top-k sampler) would
 * choose, reading half the head's bytes.
 * Contracts in cuda_backend_kernels.h; design in docs/CUDA.md ("Screened
 * LM head").
 *
 * A greedy step needs only the argmax of the logits, not the logits. An
 * int8 copy of the head (one scale per row) gives every row r an estimate
 * a_r and a bound b_r with |logit_r - a_r| <= b_r, where logit_r is what
 * the head kernel computes (head_row.cuh) in fp32. With T the largest
 * lower end a_r - b_r, a row whose upper end a_r + b_r is below T is below
 * some other row's logit, so it cannot be the argmax, nor tie with it. The
 * exact pass computes the logit of every other row with the head kernel's
 * own code (the same value bit for bit) and writes -inf for the rest, and
 * the usual argmax then chooses exactly the token it would have chosen
 * from the full logits, ties and NaN rules included (sample_cuda.h). For a
 * top-k sampler T is instead the k-th largest of the blocks' largest lower
 * ends (exact_kernel), which keeps every row that can be among the top k;
 * the exact pass also lists the rows it computed, so the sampler can rank
 * just those (bn_cuda_sample_cand).
 *
 * The bound, per row (m = max |w_i|, s = fl(m / 127), q_i = rint(w_i / s)
 * clamped to [-127, 127], L >= sum |x_i|, n = dim, u = 2^-24, g = (n + 8) u
 * / (1 - (n + 8) u)); the estimate meets x as two int8 codes per value,
 * x ~ y = sx (128 h + l) (screen_codes):
 *   - quantization: |w_i - s q_i| <= s (1/2 + 128 u) <= 0.501 s, so
 *     |sum x_i w_i - s sum x_i q_i| <= 0.501 s L;
 *   - the head kernel's fp32 sum of n products (any order, fmaf or not)
 *     errs by at most g sum |x_i w_i| <= g m L;
 *   - x's codes: |s sum q_i (x_i - y_i)| <= 127 s ex, ex = sum |x_i - y_i|
 *     (summed exactly in double, rounded up);
 *   - the estimate's integer sums are exact; converting them and the two
 *     products round by at most 5 u 127 s sum |y_i| <= g 127 s L.
 * So b_r = L e_r + 127 s ex with e_r = 1.01 (0.501 s + g (m + 127 s)),
 * each part rounded up, and the ends a_r +- b_r are rounded outwards
 * (__fadd_ru, __fsub_rd). L is summed with upward rounding, so it is at
 * least the exact sum. Rows
 * for which the reasoning may not hold are always recomputed: a row with
 * a non-finite or tiny (< 2^-100) largest weight, an estimate or end that
 * is not finite, or a bound of 2^92 or more (where the exact sum could
 * overflow); x with NaN or inf makes every bound non-finite, so every row
 * is recomputed then, and the result is the full head's.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "block_reduce.cuh"
#include "cuda_backend_kernels.h"
#include "head_row.cuh"
#include "pdl.cuh"
#include "sample_key.cuh"
#include "smem_opt_in.cuh"

namespace {

constexpr int kScreenThreads = 256;
constexpr int kScreenWarps = kScreenThreads / 32;
/* A warp reads kScreenRows rows at once, kScreenUnroll 16-byte loads per
 * lane of each in flight: a 2560-wide int8 row is 160 of them, five per
 * lane, so two rows take one round trip. */
constexpr int kScreenRows = 2;
constexpr int kScreenBlocksPerSm = 3;
constexpr int kScreenUnroll = 5;
/* Bounds at or above this are not trusted (the exact sum could overflow). */
constexpr float kMaxBound = 0x1p92f;

/* The reductions' operations (block_reduce.cuh): an upward-rounded sum
 * (never below the exact sum of non-negative values) and a maximum (NaN
 * never wins). */
struct SumUp {
    __device__ float operator()(float a, float b) const { return __fadd_ru(a, b); }
};
struct SumUpD {
    __device__ double operator()(double a, double b) const { return __dadd_ru(a, b); }
};
struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* One warp per row: the scale, the bound factor and the int8 codes. */
template <int kType>
__global__ void __launch_bounds__(kScreenThreads)
    quantize_head_kernel(const uint8_t *__restrict__ w, int64_t rows, int64_t dim,
                         int8_t *__restrict__ q, float2 *__restrict__ se)
{
    using E = HeadElem<kType>;
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * kScreenWarps + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const uint8_t *row = w + r * dim * E::kBytes;
    float m = 0.0f;
    bool bad = false;
    for (int64_t i = lane; i < dim; i += 32) {
        const float v = E::at(row, i);
        bad |= !isfinite(v);
        m = fmaxf(m, fabsf(v));
    }
    for (int o = 16; o > 0; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    bad = __any_sync(0xffffffffu, bad) || (m > 0.0f && m < 0x1p-100f);
    const float s = bad ? __int_as_float(0x7fc00000) : __fdiv_rn(m, 127.0f);
    int8_t *qr = q + r * dim;
    for (int64_t i = lane; i < dim; i += 32) {
        float c = 0.0f;
        if (!bad && m > 0.0f)
            c = fminf(fmaxf(rintf(__fdiv_rn(E::at(row, i), s)), -127.0f), 127.0f);
        qr[i] = (int8_t)(int)c;
    }
    if (lane == 0) {
        float e = s; /* NaN for a bad row, 0 for a zero row */
        if (!bad && m > 0.0f) {
            double g = (double)(dim + 8) * 0x1p-24;
            g = g / (1.0 - g);
            const double sd = s, md = m;
            e = __double2float_ru(1.01 * (0.501 * sd + g * (md + 127.0 * sd)));
        }
        se[r] = make_float2(s, e);
    }
}

/* x as two int8 codes per value, x ~ sx (128 h + l): what the int8 rows
 * meet in dp4a (int32 sums, so no int-to-float conversion per weight, which
 * the GPU issues at a quarter of the fp32 rate). Computed by every block in
 * the same way (the same sx, codes and sums in all of them):
 *   sx = max|x| / 16383, h = rint(x / (128 sx)), l = rint(x / sx - 128 h),
 * so |l| <= 64 + 1 and |x - sx (128 h + l)| is about sx / 2. The bound
 * takes the exact sum of those differences, ex (below), rather than a
 * worst case. */
struct ScreenX {
    float L;   /* >= sum |x_i|; +inf or NaN when x is not finite or is tiny  */
    float sx;  /* the codes' scale                                          */
    float e127; /* >= 127 sum |x_i - sx (128 h_i + l_i)|                     */
};

/* Block-wide: x's codes into xh, xl (dim bytes each, shared memory) and
 * the sums above, identical in every thread. red: 32 slots. x is the
 * kernel before's output (the screen runs with PDL): read through L2. */
__device__ ScreenX screen_codes(const float *__restrict__ x, int64_t dim, int8_t *xh, int8_t *xl,
                                float *red)
{
    float l1 = 0.0f, mx = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += kScreenThreads) {
        const float v = __ldcg(x + i);
        l1 = __fadd_ru(l1, fabsf(v));
        mx = fmaxf(mx, fabsf(v));
    }
    ScreenX sx;
    sx.L = block_reduce(l1, SumUp(), red);
    mx = block_reduce(mx, Max(), red);
    /* Tiny x (codes would underflow) is treated like a non-finite one:
     * every row recomputed. */
    if (mx > 0.0f && mx < 0x1p-100f)
        sx.L = INFINITY;
    const bool ok = isfinite(sx.L) && mx > 0.0f;
    sx.sx = ok ? __fdiv_rn(mx, 16383.0f) : 0.0f;
    double ex = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += kScreenThreads) {
        float h = 0.0f, l = 0.0f;
        if (ok) {
            const float v = __ldcg(x + i);
            h = fminf(fmaxf(rintf(__fdiv_rn(v, __fmul_rn(128.0f, sx.sx))), -127.0f), 127.0f);
            l = fminf(fmaxf(rintf(__fsub_rn(__fdiv_rn(v, sx.sx), __fmul_rn(128.0f, h))), -127.0f),
                      127.0f);
            /* sx (128 h + l) is exact in double (24 + 15 bits). */
            ex = __dadd_ru(ex, fabs((double)v - (double)sx.sx * (128.0 * h + l)));
        }
        xh[i] = (int8_t)(int)h;
        xl[i] = (int8_t)(int)l;
    }
    /* The double sum, rounded up, over the block (sums of non-negative
     * values rounded up are at least the exact sum); its barriers also
     * publish xh, xl. */
    __shared__ double dred[32];
    const double tot = block_reduce(ex, SumUpD(), dred);
    sx.e127 = __double2float_ru(__dmul_ru(127.0, tot));
    return sx;
}

/* sum q_i h_i and sum q_i l_i over 16 bytes of a row. */
__device__ __forceinline__ void dot_codes16(uint4 w, uint4 h, uint4 l, int &acc_h, int &acc_l)
{
    acc_h = __dp4a((int)w.x, (int)h.x, acc_h);
    acc_h = __dp4a((int)w.y, (int)h.y, acc_h);
    acc_h = __dp4a((int)w.z, (int)h.z, acc_h);
    acc_h = __dp4a((int)w.w, (int)h.w, acc_h);
    acc_l = __dp4a((int)w.x, (int)l.x, acc_l);
    acc_l = __dp4a((int)w.y, (int)l.y, acc_l);
    acc_l = __dp4a((int)w.z, (int)l.z, acc_l);
    acc_l = __dp4a((int)w.w, (int)l.w, acc_l);
}

/* Each warp takes kScreenRows whole rows at a time (grid-stride): the
 * estimate a = s sx (128 sum q h + sum q l), its bound L e + 127 s ex
 * (e per row from bn_cb_head_quantize: the weights' quantization and both
 * sums' rounding; 127 s ex: x's codes), the row's upper end (+inf for a
 * row that is always recomputed) into upper[r], and the block's largest
 * trusted lower end into partial[blockIdx.x]. kVec: dim % 16 == 0
 * (16-byte loads). The integer sums are exact (|q h| <= 127^2, 2^31 /
 * 127^2 > 2^17 values); only their conversion and the products round,
 * within the g 127 s L part of e. */
template <bool kVec>
__global__ void __launch_bounds__(kScreenThreads, kScreenBlocksPerSm)
    screen_kernel(const int8_t *__restrict__ q, const float2 *__restrict__ se, int64_t rows,
                  int64_t dim, const float *__restrict__ x, float *__restrict__ upper,
                  float *__restrict__ partial, unsigned long long *__restrict__ best,
                  unsigned *__restrict__ cand_n)
{
    /* The exact pass's argmax starts from (-inf, token 0): the answer when
     * no kept row is above -inf, as the greedy sampler gives it over logits
     * that are -inf (or NaN) everywhere; its candidate list starts empty.
     * Nothing still running reads either (launched with PDL, the kernel
     * starts during the output norm, after the step's earlier kernels). */
    if (best && blockIdx.x == 0 && threadIdx.x == 0)
        *best = make_key(-INFINITY, 0);
    if (cand_n && blockIdx.x == 0 && threadIdx.x == 0)
        *cand_n = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* The block's first rows (its warps' first kScreenRows each: one
     * contiguous span) asked of L2 before x is ready, so that they stream in
     * while the kernel before finishes and the codes below are computed,
     * instead of the memory system idling through both. */
    if (kVec && threadIdx.x == 0) {
        const int64_t r0 = (int64_t)blockIdx.x * kScreenWarps * kScreenRows;
        const int64_t n = rows - r0 < kScreenWarps * kScreenRows ? rows - r0
                                                                  : kScreenWarps * kScreenRows;
        if (n > 0)
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(q + r0 * dim),
                         "r"((unsigned)(n * dim)));
    }
#endif
    pdl_wait();
    /* x is ready: the exact pass may start taking the room this kernel
     * leaves (it reads x before its own wait). */
    pdl_trigger();
    extern __shared__ __align__(16) int8_t xcodes[]; /* h [dim], then l [dim] */
    __shared__ float red[32];
    int8_t *xh = xcodes, *xl = xcodes + dim;
    const ScreenX X = screen_codes(x, dim, xh, xl, red);
    const int64_t chunks = dim / 16;
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * kScreenWarps;
    float best_lower = -INFINITY;
    for (int64_t r0 = ((int64_t)blockIdx.x * kScreenWarps + (threadIdx.x >> 5)) * kScreenRows;
         r0 < rows; r0 += warps * kScreenRows) {
        int acc_h[kScreenRows], acc_l[kScreenRows];
#pragma unroll
        for (int k = 0; k < kScreenRows; k++)
            acc_h[k] = acc_l[k] = 0;
        if (kVec) {
            const uint4 *h4 = reinterpret_cast<const uint4 *>(xh);
            const uint4 *l4 = reinterpret_cast<const uint4 *>(xl);
            for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kScreenUnroll) {
                uint4 buf[kScreenRows][kScreenUnroll];
#pragma unroll
                for (int k = 0; k < kScreenRows; k++) {
                    const uint4 *v = reinterpret_cast<const uint4 *>(q + (r0 + k) * dim);
#pragma unroll
                    for (int u = 0; u < kScreenUnroll; u++) {
                        const int64_t c = c0 + 32 * u;
                        buf[k][u] = c < chunks && r0 + k < rows ? __ldcs(v + c)
                                                                : make_uint4(0, 0, 0, 0);
                    }
                }
#pragma unroll
                for (int u = 0; u < kScreenUnroll; u++) {
                    const int64_t c = c0 + 32 * u;
                    if (c < chunks) {
                        const uint4 hv = h4[c], lv = l4[c];
#pragma unroll
                        for (int k = 0; k < kScreenRows; k++)
                            dot_codes16(buf[k][u], hv, lv, acc_h[k], acc_l[k]);
                    }
                }
            }
        } else {
#pragma unroll
            for (int k = 0; k < kScreenRows; k++)
                if (r0 + k < rows)
                    for (int64_t i = lane; i < dim; i += 32) {
                        const int w = q[(r0 + k) * dim + i];
                        acc_h[k] += w * xh[i];
                        acc_l[k] += w * xl[i];
                    }
        }
#pragma unroll
        for (int k = 0; k < kScreenRows; k++) {
            const int64_t r = r0 + k;
            int ah = acc_h[k], al = acc_l[k];
            for (int o = 16; o > 0; o >>= 1) {
                ah += __shfl_xor_sync(0xffffffffu, ah, o);
                al += __shfl_xor_sync(0xffffffffu, al, o);
            }
            if (r >= rows)
                break;
            const float2 p = se[r];
            const float t = __fmaf_rn(128.0f, (float)ah, (float)al);
            const float a = __fmul_rn(__fmul_rn(p.x, X.sx), t);
            const float b = __fadd_ru(__fmul_ru(X.L, p.y), __fmul_ru(X.e127, p.x));
            const float hi = __fadd_ru(a, b), lo = __fsub_rd(a, b);
            const bool trusted = b < kMaxBound && isfinite(a) && isfinite(hi) && isfinite(lo);
            if (lane == 0)
                upper[r] = trusted ? hi : INFINITY;
            if (trusted)
                best_lower = fmaxf(best_lower, lo);
        }
    }
    best_lower = block_reduce(best_lower, Max(), red);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = best_lower;
}

/* Partials compared a chunk at a time in shared memory (kth_ranked). */
constexpr int kRankChunk = 1024;
/* Up to this many partials are counted instead (kth_counted): every screen
 * launch on a GPU of up to 170 SMs (kScreenBlocksPerSm a SM). */
constexpr int kCountMax = 2 * kScreenThreads;

/* The k-th largest of p[0, n) (ties: the lower index first), -inf when n <
 * k: each thread ranks its own values against all n, read from shared
 * memory a chunk at a time (every thread the same word: a broadcast); the
 * ranks are a permutation of 0 .. n - 1, so exactly one value has rank
 * k - 1. n^2 / threads comparisons a thread: only for n > kCountMax. */
__device__ float kth_ranked(const float *__restrict__ p, int n, int k)
{
    __shared__ float chunk[kRankChunk];
    __shared__ float kth;
    if (threadIdx.x == 0)
        kth = -INFINITY;
    for (int i0 = 0; i0 < n; i0 += kScreenThreads) {
        const int i = i0 + (int)threadIdx.x;
        const float v = i < n ? __ldcg(p + i) : -INFINITY;
        int rank = 0;
        for (int c0 = 0; c0 < n; c0 += kRankChunk) {
            const int m = n - c0 < kRankChunk ? n - c0 : kRankChunk;
            __syncthreads();
            for (int j = threadIdx.x; j < m; j += kScreenThreads)
                chunk[j] = __ldcg(p + c0 + j);
            __syncthreads();
            for (int j = 0; j < m; j++) {
                const float u = chunk[j];
                rank += u > v || (u == v && c0 + j < i);
            }
        }
        if (i < n && rank == k - 1)
            kth = v;
    }
    __syncthreads();
    return kth;
}

/* The same value for n <= kCountMax, bit by bit: T, the k-th largest as
 * an ordered integer (sample_key.cuh), is the largest x with at least k
 * partials >= x, so from the top bit down a bit stays set when enough
 * partials reach the prefix with it. Each bit is one or two block-wide
 * counts (__syncthreads_count), 32 to 64 barriers in all, and no shared
 * memory. Every one of the exact pass's blocks pays this: ranking every
 * partial against all (kth_ranked), and then a bitonic sort of them (45
 * compare-exchange stages for 512), took most of what a top-k step's exact
 * pass costs beyond a greedy one's on an H200 (396 partials, four blocks an
 * SM). With k > n no x qualifies: T = 0, which reads back as -inf. */
__device__ float kth_counted(const float *__restrict__ p, int n, int k)
{
    const int i0 = threadIdx.x, i1 = threadIdx.x + kScreenThreads;
    const uint32_t v0 = i0 < n ? ordered(__ldcg(p + i0)) : 0u; /* 0: below every value */
    const uint32_t v1 = i1 < n ? ordered(__ldcg(p + i1)) : 0u;
    uint32_t t = 0;
    for (int bit = 31; bit >= 0; bit--) {
        const uint32_t x = t | 1u << bit;
        int count = __syncthreads_count(v0 >= x);
        if (n > kScreenThreads)
            count += __syncthreads_count(v1 >= x);
        if (count >= k)
            t = x;
    }
    return t == 0 ? -INFINITY : unordered(t);
}

/* The k-th largest of the n partials (-inf when n < k). Called by the
 * whole block; its barriers also publish what the threads stored in shared
 * memory before it. */
__device__ float kth_partial(const float *__restrict__ p, int n, int k)
{
    return n <= kCountMax ? kth_counted(p, n, k) : kth_ranked(p, n, k);
}

/* T = the k-th largest lower end among the blocks' largest (k = *d_k, 1
 * when d_k is NULL or *d_k < 1; the largest when k = 1): k rows, one from
 * each of k blocks, have logits of at least T, so a row whose upper end is
 * below T has k logits above it and is neither in the top k nor tied with
 * its last. Per group of 32 rows, one lane a row: such a row gets -inf,
 * every other row its exact logit from head_row_dot, one row at a time by
 * the whole warp. */
template <int kType, bool kVec>
__global__ void __launch_bounds__(kScreenThreads)
    exact_kernel(const uint8_t *__restrict__ w, int64_t rows, int64_t dim,
                 const float *__restrict__ x, const float *__restrict__ upper,
                 const float *__restrict__ partial, int n_partial,
                 const int32_t *__restrict__ d_k, float *__restrict__ logits,
                 unsigned long long *__restrict__ best, uint64_t *__restrict__ cand,
                 unsigned *__restrict__ cand_n, int cand_cap, float *__restrict__ cand_floor)
{
    extern __shared__ __align__(16) float xs[];
    __shared__ float red[32];
    /* x and k are ready before the screen is (with PDL the screen let this
     * kernel launch only once x was): read them before the wait. */
    for (int64_t i = threadIdx.x; i < dim; i += kScreenThreads)
        xs[i] = __ldcg(x + i);
    const int k = d_k && *d_k > 1 ? *d_k : 1;
    pdl_wait();
    pdl_trigger();
    float T;
    if (k == 1) {
        float t = -INFINITY;
        for (int i = threadIdx.x; i < n_partial; i += kScreenThreads)
            t = fmaxf(t, __ldcg(partial + i));
        T = block_reduce(t, Max(), red); /* its barriers also publish xs */
    } else {
        T = kth_partial(partial, n_partial, k); /* likewise */
    }
    if (cand_floor && blockIdx.x == 0 && threadIdx.x == 0)
        *cand_floor = T; /* the top k's logits are all at least T */
    const int lane = threadIdx.x & 31;
    const int64_t row_bytes = dim * HeadElem<kType>::kBytes;
    const int64_t groups = (rows + 31) / 32;
    const int64_t warps = (int64_t)gridDim.x * kScreenWarps;
    for (int64_t g = (int64_t)blockIdx.x * kScreenWarps + (threadIdx.x >> 5); g < groups;
         g += warps) {
        const int64_t r = g * 32 + lane;
        const bool in = r < rows;
        /* The screen's outputs (with PDL, the kernel before): through L2. */
        const bool keep = in && !(__ldcg(upper + r) < T); /* NaN: kept */
        if (in && !keep)
            logits[r] = -INFINITY;
        unsigned m = __ballot_sync(0xffffffffu, keep);
        while (m) {
            const int j = __ffs(m) - 1;
            m &= m - 1;
            const int64_t R = g * 32 + j;
            const float v = head_row_dot<kType, kVec>(w + R * row_bytes, xs, dim, lane);
            if (lane == 0) {
                logits[R] = v;
                /* The greedy token: the largest key (sample_key.cuh) of the
                 * kept rows; the others are -inf and below (-inf, 0). */
                if (best)
                    atomicMax(best, (unsigned long long)make_key(v, (int32_t)R));
                /* The candidate list of the sampler's top-k (its count
                 * keeps growing past cand_cap: an overflow it can see). */
                if (cand_n) {
                    const unsigned i = atomicAdd(cand_n, 1u);
                    if (i < (unsigned)cand_cap)
                        cand[i] = make_key(v, (int32_t)R);
                }
            }
        }
    }
}

template <int kType> cudaError_t allow_exact_smem(size_t bytes)
{
    const cudaError_t rc = allow_dynamic_smem(exact_kernel<kType, true>, bytes);
    return rc == cudaSuccess ? allow_dynamic_smem(exact_kernel<kType, false>, bytes) : rc;
}

/* The vector path by the head kernel's rule (head_row_vec), so a kept
 * row's value is the one bn_cb_head_gemv computes. */
template <int kType>
cudaError_t launch_exact(const void *w, int64_t rows, int64_t dim, const float *x,
                         const float *upper, const float *partial, int n_partial,
                         const int32_t *d_k, float *logits, unsigned long long *best,
                         uint64_t *cand, unsigned *cand_n, int cand_cap, float *cand_floor,
                         unsigned blocks, int pdl, cudaStream_t stream)
{
    const auto kernel = head_row_vec<kType>(dim) ? exact_kernel<kType, true>
                                                 : exact_kernel<kType, false>;
    return pdl_launch(kernel, dim3(blocks), dim3(kScreenThreads), sizeof(float) * (size_t)dim,
                      stream, pdl, static_cast<const uint8_t *>(w), rows, dim, x, upper, partial,
                      n_partial, d_k, logits, best, cand, cand_n, cand_cap, cand_floor);
}

bool head_args_ok(int type, int64_t rows, int64_t dim)
{
    return rows > 0 && dim > 0 && dim <= BN_CB_HEAD_MAX_DIM &&
           (type == BN_CB_HEAD_F32 || type == BN_CB_HEAD_F16 || type == BN_CB_HEAD_BF16);
}

} // namespace

extern "C" int bn_cb_head_screen_blocks(int64_t rows, int sm_count)
{
    /* One wave: the blocks an SM the launch bounds guarantee, each paying
     * the codes' prologue once. */
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 132) * kScreenBlocksPerSm;
    const int64_t per_block = (int64_t)kScreenWarps * kScreenRows;
    const int64_t need = rows > 0 ? (rows + per_block - 1) / per_block : 1;
    return (int)(need < cap ? need : cap);
}

extern "C" cudaError_t bn_cb_head_screen_prepare(int type, int64_t dim)
{
    if (!head_args_ok(type, 1, dim))
        return cudaErrorInvalidValue;
    /* The screen keeps x's two int8 codes (2 dim bytes), the exact pass x
     * itself (4 dim); smem_opt_in.cuh says when a kernel needs the
     * attribute. */
    cudaError_t rc = allow_dynamic_smem(screen_kernel<true>, 2 * (size_t)dim);
    if (rc == cudaSuccess)
        rc = allow_dynamic_smem(screen_kernel<false>, 2 * (size_t)dim);
    const auto allow = type == BN_CB_HEAD_F32   ? allow_exact_smem<BN_CB_HEAD_F32>
                       : type == BN_CB_HEAD_F16 ? allow_exact_smem<BN_CB_HEAD_F16>
                                                : allow_exact_smem<BN_CB_HEAD_BF16>;
    return rc == cudaSuccess ? allow(sizeof(float) * (size_t)dim) : rc;
}

extern "C" cudaError_t bn_cb_head_quantize(const void *w, int type, int64_t rows, int64_t dim,
                                           int8_t *q, float *se, cudaStream_t stream)
{
    if (!w || !q || !se || !head_args_ok(type, rows, dim))
        return cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)((rows + kScreenWarps - 1) / kScreenWarps);
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    float2 *se2 = reinterpret_cast<float2 *>(se);
    if (type == BN_CB_HEAD_F32)
        quantize_head_kernel<BN_CB_HEAD_F32><<<blocks, kScreenThreads, 0, stream>>>(wb, rows, dim,
                                                                                   q, se2);
    else if (type == BN_CB_HEAD_F16)
        quantize_head_kernel<BN_CB_HEAD_F16><<<blocks, kScreenThreads, 0, stream>>>(wb, rows, dim,
                                                                                   q, se2);
    else
        quantize_head_kernel<BN_CB_HEAD_BF16><<<blocks, kScreenThreads, 0, stream>>>(wb, rows, dim,
                                                                                    q, se2);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_head_screen(const int8_t *q, const float *se, int64_t rows,
                                         int64_t dim, const float *x, float *upper,
                                         float *partial, unsigned long long *best,
                                         unsigned *cand_n, int sm_count, int pdl,
                                         cudaStream_t stream)
{
    if (!q || !se || !x || !upper || !partial || !head_args_ok(BN_CB_HEAD_F32, rows, dim))
        return cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)bn_cb_head_screen_blocks(rows, sm_count);
    const size_t smem = 2 * (size_t)dim; /* x's two int8 codes */
    const float2 *se2 = reinterpret_cast<const float2 *>(se);
    if (dim % 16 == 0)
        return pdl_launch(screen_kernel<true>, dim3(blocks), dim3(kScreenThreads), smem, stream,
                          pdl, q, se2, rows, dim, x, upper, partial, best, cand_n);
    return pdl_launch(screen_kernel<false>, dim3(blocks), dim3(kScreenThreads), smem, stream, pdl,
                      q, se2, rows, dim, x, upper, partial, best, cand_n);
}

extern "C" cudaError_t bn_cb_head_exact(const void *w, int type, int64_t rows, int64_t dim,
                                        const float *x, const float *upper, const float *partial,
                                        int n_partial, const int32_t *d_k, float *logits,
                                        unsigned long long *best, uint64_t *cand,
                                        unsigned *cand_n, int cand_cap, float *cand_floor,
                                        int sm_count, int pdl, cudaStream_t stream)
{
    if (!w || !x || !upper || !partial || !logits || n_partial < 1 ||
        !head_args_ok(type, rows, dim) || (cand_n && (!cand || cand_cap < 0)))
        return cudaErrorInvalidValue;
    const int64_t groups = (rows + 31) / 32;
    const int64_t per_block = kScreenWarps;
    int64_t blocks = (groups + per_block - 1) / per_block;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 132) * 4;
    const unsigned n = (unsigned)(blocks < cap ? blocks : cap);
    const auto launch = type == BN_CB_HEAD_F32   ? launch_exact<BN_CB_HEAD_F32>
                        : type == BN_CB_HEAD_F16 ? launch_exact<BN_CB_HEAD_F16>
                                                 : launch_exact<BN_CB_HEAD_BF16>;
    return launch(w, rows, dim, x, upper, partial, n_partial, d_k, logits, best, cand, cand_n,
                  cand_cap, cand_floor, n, pdl, stream);
}
