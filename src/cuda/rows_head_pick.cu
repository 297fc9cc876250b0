/*
 * rows_head_pick.cu - the greedy tokens of many rows at once (the batched
 * pass's LM head, cuda_backend_rows.c) from a GEMM of one 16-bit part of
 * each row instead of all of them: the token the head GEMV (head_row.cuh)
 * + argmax would choose for each row, without that row's full logits.
 * Contracts in cuda_backend_kernels.h.
 *
 * The batched head meets each fp32 row y as 16-bit parts (rows_head.cu);
 * the GEMM of the first parts alone gives every (row, vocabulary row v) an
 * estimate a_v = back sum hi_i w_vi, and rows_head.cu's factor F bounds
 * how far the GEMV's logit of v can be from it: b_v = m_v F, m_v = max_i
 * |w_vi| (bn_cb_head_row_max). As in the single-row screen (head_screen.cu):
 * with T the largest lower end a_v - b_v of the row, a vocabulary row whose
 * upper end a_v + b_v is below T is below some other row's logit, so it is
 * neither the argmax nor tied with it; every other row gets its logit from
 * head_row_dot, the GEMV's own code (the same value bit for bit), and the
 * largest key (sample_key.cuh) of those is the token, ties and NaN rules
 * included. Rows whose ends are not finite or whose bound is huge are
 * always computed.
 *
 * One kernel over a grid of (vocabulary slices, rows), each block reading
 * its slice's estimates once (at 256 rows 131 MB in all, where the full
 * head wrote every part's logits, added them and sampled them): the
 * slice's largest lower end T_s <= T rules out at least the rows T would
 * rule out, so each block computes the rows of its slice that T_s leaves
 * (a few a slice) and raises the row's key with them (atomicMax); the
 * last block of a row, by a ticket, turns the key into the token and
 * resets the key and ticket for the next call. While streaming, a warp
 * keeps the rows whose upper end reaches its largest lower end so far
 * (a superset of those T_s leaves) in a shared list; when that list
 * overflows (a row whose every bound is untrusted), the block scans its
 * slice again, a group of rows at a time.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "block_reduce.cuh"
#include "cuda_backend_kernels.h"
#include "head_row.cuh"
#include "sample_key.cuh"
#include "smem_opt_in.cuh"

namespace
{

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
/* Loads a thread has in flight while streaming (of four rows each where
 * the estimates can be read as float4): a stream, not a chain of loads. */
constexpr int kAhead = 4;
constexpr int kVecRows = 4;
/* The block's list of rows still in the running. */
constexpr int kListCap = 1024;
/* Bounds at or above this are not trusted (the exact sum could overflow). */
constexpr float kMaxBound = 0x1p92f;
/* Added to every bound: the estimate's scaling back by a power of two is
 * exact unless it lands among the subnormals, where it errs by less. */
constexpr float kTinyBound = 0x1p-140f;

struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* The ends of vocabulary row v's logit interval for a row with scale-back
 * `back` and factor F, from its estimate before scaling (acc) and m_v;
 * false when they are not to be trusted. Every test of a row calls this,
 * so all agree on its ends. */
__device__ __forceinline__ bool logit_ends(float acc, float back, float F, float mv, float &hi,
                                           float &lo)
{
    const float a = __fmul_rn(acc, back);
    const float b = __fadd_ru(__fmul_ru(mv, F), kTinyBound);
    hi = __fadd_ru(a, b);
    lo = __fsub_rd(a, b);
    return b < kMaxBound && isfinite(a) && isfinite(hi) && isfinite(lo);
}

/* A row that the largest lower end `top` leaves: one whose ends are not
 * trusted, or whose upper end is not below top (NaN: kept). */
__device__ __forceinline__ bool still_in(bool trusted, float hi, float top)
{
    return !trusted || !(hi < top);
}

/* The key a row starts from: (-inf, token 0), the answer when no computed
 * logit is above -inf (the greedy sampler's over logits that are -inf or
 * NaN everywhere). */
__device__ __forceinline__ unsigned long long start_key()
{
    return (unsigned long long)make_key(-INFINITY, 0);
}

/* The vocabulary rows of slice s: [s span, min((s + 1) span, vocab)). */
struct Slice {
    int64_t begin, end;
    __device__ Slice(int64_t vocab, int64_t span, int s)
        : begin(s * span), end((s + 1) * span < vocab ? (s + 1) * span : vocab)
    {
    }
};

/* kPer rows' estimates and largest weights from v on (kPer = 4: 16-byte
 * loads). */
template <int kPer>
__device__ __forceinline__ void load_rows(const float *row, const float *wmax, int64_t v, float *a,
                                          float *m)
{
    if constexpr (kPer == 4) {
        const float4 e = __ldcs(reinterpret_cast<const float4 *>(row + v));
        const float4 w = __ldg(reinterpret_cast<const float4 *>(wmax + v));
        a[0] = e.x, a[1] = e.y, a[2] = e.z, a[3] = e.w;
        m[0] = w.x, m[1] = w.y, m[2] = w.z, m[3] = w.w;
    } else {
        a[0] = __ldcs(row + v);
        m[0] = __ldg(wmax + v);
    }
}

/* Block (s, k): row k's slice s, as the file's comment says. */
template <int kType, bool kVec, bool kVec4>
__global__ void __launch_bounds__(kThreads)
    pick_kernel(const uint8_t *__restrict__ w, int64_t vocab, int64_t dim, int64_t span,
                const float *__restrict__ est, const float *__restrict__ back,
                const float *__restrict__ factor, const float *__restrict__ wmax,
                const float *__restrict__ y, unsigned long long *__restrict__ best,
                unsigned *__restrict__ count, int32_t *__restrict__ tokens)
{
    extern __shared__ __align__(16) float xs[];
    __shared__ float red[32];
    __shared__ int32_t list[kListCap];
    __shared__ unsigned list_n;
    const int s = blockIdx.x, k = blockIdx.y, lane = threadIdx.x & 31;
    if (threadIdx.x == 0)
        list_n = 0;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads)
        xs[i] = y[(int64_t)k * dim + i];
    __syncthreads();
    const float bk = back[k], F = factor[k];
    const float *row = est + (int64_t)k * vocab;
    const Slice sl(vocab, span, s);

    /* The stream: kAhead loads in flight a thread; after each round the
     * warp's largest lower end so far, and the round's rows still in the
     * running against it into the list. */
    constexpr int kPer = kVec4 ? kVecRows : 1;
    const int64_t step = (int64_t)kThreads * kPer;
    float top = -INFINITY;
    for (int64_t v0 = sl.begin + kPer * threadIdx.x; v0 - kPer * threadIdx.x < sl.end;
         v0 += step * kAhead) {
        float a[kAhead][kPer], m[kAhead][kPer];
#pragma unroll
        for (int u = 0; u < kAhead; u++)
            if (v0 + u * step < sl.end)
                load_rows<kPer>(row, wmax, v0 + u * step, a[u], m[u]);
        float hi[kAhead][kPer];
        bool ok[kAhead][kPer];
#pragma unroll
        for (int u = 0; u < kAhead; u++)
#pragma unroll
            for (int j = 0; j < kPer; j++) {
                float lo;
                ok[u][j] =
                    v0 + u * step < sl.end && logit_ends(a[u][j], bk, F, m[u][j], hi[u][j], lo);
                if (ok[u][j])
                    top = fmaxf(top, lo);
            }
        top = warp_reduce(top, Max());
#pragma unroll
        for (int u = 0; u < kAhead; u++)
#pragma unroll
            for (int j = 0; j < kPer; j++) {
                const int64_t v = v0 + u * step + j;
                if (v < sl.end && still_in(ok[u][j], hi[u][j], top)) {
                    const unsigned i = atomicAdd(&list_n, 1u);
                    if (i < kListCap)
                        list[i] = (int32_t)v;
                }
            }
    }
    const float T = block_reduce(top, Max(), red); /* its barriers also publish the list */
    const unsigned listed = list_n;
    const int64_t row_bytes = dim * HeadElem<kType>::kBytes;
    const int warp = threadIdx.x >> 5;
    if (listed <= kListCap) {
        for (unsigned i = warp; i < listed; i += kWarps) {
            const int64_t v = list[i];
            float hi, lo;
            const bool ok = logit_ends(row[v], bk, F, wmax[v], hi, lo);
            if (!still_in(ok, hi, T))
                continue;
            const float logit = head_row_dot<kType, kVec>(w + v * row_bytes, xs, dim, lane);
            if (lane == 0)
                atomicMax(best + k, (unsigned long long)make_key(logit, (int32_t)v));
        }
    } else {
        /* The list overflowed: the slice again, 32 rows a warp at a time,
         * each row T leaves computed by the whole warp. */
        for (int64_t g = sl.begin + (int64_t)warp * 32; g < sl.end; g += kThreads) {
            const int64_t v = g + lane;
            bool keep = false;
            if (v < sl.end) {
                float hi, lo;
                const bool ok = logit_ends(row[v], bk, F, wmax[v], hi, lo);
                keep = still_in(ok, hi, T);
            }
            unsigned bits = __ballot_sync(0xffffffffu, keep);
            while (bits) {
                const int i = __ffs(bits) - 1;
                bits &= bits - 1;
                const int64_t R = g + i;
                const float logit = head_row_dot<kType, kVec>(w + R * row_bytes, xs, dim, lane);
                if (lane == 0)
                    atomicMax(best + k, (unsigned long long)make_key(logit, (int32_t)R));
            }
        }
    }

    /* The ticket: the block's keys are raised (device-scope atomics)
     * before its ticket is taken; the row's last block reads the key,
     * stores the token and leaves key and ticket as the next call expects
     * them. */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(count + k, 1u) == gridDim.x - 1) {
            __threadfence();
            tokens[k] = key_id(atomicAdd(best + k, 0ull));
            best[k] = start_key();
            count[k] = 0;
        }
    }
}

__global__ void pick_reset_kernel(unsigned long long *__restrict__ best,
                                  unsigned *__restrict__ count, int64_t n)
{
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) {
        best[k] = start_key();
        count[k] = 0;
    }
}

/* Per vocabulary row, one warp: the largest |w|, +inf when a weight is not
 * finite (the row's bound is then never trusted). */
template <int kType>
__global__ void __launch_bounds__(kThreads)
    row_max_kernel(const uint8_t *__restrict__ w, int64_t rows, int64_t dim, float *__restrict__ m)
{
    const int64_t r = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    const uint8_t *row = w + r * dim * HeadElem<kType>::kBytes;
    float mx = 0.0f;
    bool bad = false;
    for (int64_t i = lane; i < dim; i += 32) {
        const float v = HeadElem<kType>::at(row, i);
        bad |= !isfinite(v);
        mx = fmaxf(mx, fabsf(v));
    }
    mx = warp_reduce(mx, Max());
    if (__any_sync(0xffffffffu, bad))
        mx = INFINITY;
    if (lane == 0)
        m[r] = mx;
}

/* The slices' span: a multiple of 128 rows, so that 16-byte loads and
 * 32-row groups never straddle two slices. */
int64_t slice_span(int64_t vocab, int slices)
{
    return ((vocab + slices - 1) / slices + 127) / 128 * 128;
}

/* Whether the estimates and bounds can be read four rows at a time. */
bool rows_vec4(int64_t vocab, const float *est, const float *wmax)
{
    return vocab % kVecRows == 0 && (((uintptr_t)est | (uintptr_t)wmax) & 15) == 0;
}

template <int kType> cudaError_t allow_pick_smem(size_t bytes)
{
    cudaError_t rc = allow_dynamic_smem(pick_kernel<kType, true, true>, bytes);
    if (rc == cudaSuccess)
        rc = allow_dynamic_smem(pick_kernel<kType, false, true>, bytes);
    if (rc == cudaSuccess)
        rc = allow_dynamic_smem(pick_kernel<kType, true, false>, bytes);
    return rc == cudaSuccess ? allow_dynamic_smem(pick_kernel<kType, false, false>, bytes) : rc;
}

template <int kType>
void launch_pick(const void *w, int64_t vocab, int64_t dim, int64_t span, dim3 grid,
                 const float *est, const float *back, const float *factor, const float *wmax,
                 const float *y, unsigned long long *best, unsigned *count, int32_t *tokens,
                 cudaStream_t stream)
{
    const bool vec = head_row_vec<kType>(dim), vec4 = rows_vec4(vocab, est, wmax);
    const auto kernel =
        vec ? (vec4 ? pick_kernel<kType, true, true> : pick_kernel<kType, true, false>)
            : (vec4 ? pick_kernel<kType, false, true> : pick_kernel<kType, false, false>);
    kernel<<<grid, kThreads, sizeof(float) * (size_t)dim, stream>>>(
        static_cast<const uint8_t *>(w), vocab, dim, span, est, back, factor, wmax, y, best, count,
        tokens);
}

bool pick_type_ok(int type) { return type == BN_CB_HEAD_F16 || type == BN_CB_HEAD_BF16; }

} // namespace

extern "C" int bn_cb_rows_pick_slices(int64_t n_rows, int64_t vocab, int sm_count)
{
    /* About four blocks an SM over all rows, each slice at least 1024
     * vocabulary rows. */
    const int64_t want =
        n_rows > 0 ? (4 * (int64_t)(sm_count > 0 ? sm_count : 132) + n_rows - 1) / n_rows : 1;
    const int64_t most = vocab / 1024 > 1 ? vocab / 1024 : 1;
    const int64_t s = want < most ? want : most;
    return (int)(s > 1 ? (s < 65535 ? s : 65535) : 1);
}

extern "C" cudaError_t bn_cb_rows_pick_prepare(int type, int64_t dim)
{
    if (!pick_type_ok(type) || dim <= 0 || dim > BN_CB_HEAD_MAX_DIM)
        return cudaErrorInvalidValue;
    const size_t bytes = sizeof(float) * (size_t)dim;
    return type == BN_CB_HEAD_F16 ? allow_pick_smem<BN_CB_HEAD_F16>(bytes)
                                  : allow_pick_smem<BN_CB_HEAD_BF16>(bytes);
}

extern "C" cudaError_t bn_cb_head_row_max(const void *w, int type, int64_t rows, int64_t dim,
                                          float *m, cudaStream_t stream)
{
    if (!w || !m || !pick_type_ok(type) || rows <= 0 || dim <= 0)
        return cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)((rows + kWarps - 1) / kWarps);
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    if (type == BN_CB_HEAD_F16)
        row_max_kernel<BN_CB_HEAD_F16><<<blocks, kThreads, 0, stream>>>(wb, rows, dim, m);
    else
        row_max_kernel<BN_CB_HEAD_BF16><<<blocks, kThreads, 0, stream>>>(wb, rows, dim, m);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_rows_pick_reset(unsigned long long *best, unsigned *count, int64_t n,
                                             cudaStream_t stream)
{
    if (!best || !count || n < 1 || n > 65535)
        return cudaErrorInvalidValue;
    pick_reset_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(best, count, n);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_rows_pick(const void *w, int type, int64_t vocab, int64_t dim,
                                       const float *est, const float *back, const float *factor,
                                       const float *wmax, const float *y, int64_t n_rows,
                                       int slices, unsigned long long *best, unsigned *count,
                                       int32_t *tokens, cudaStream_t stream)
{
    if (!w || !est || !back || !factor || !wmax || !y || !best || !count || !tokens ||
        !pick_type_ok(type) || vocab <= 0 || vocab > INT32_MAX || dim <= 0 ||
        dim > BN_CB_HEAD_MAX_DIM || n_rows < 0 || n_rows > 65535 || slices < 1 || slices > 65535)
        return cudaErrorInvalidValue;
    if (n_rows == 0)
        return cudaSuccess;
    const int64_t span = slice_span(vocab, slices);
    const dim3 grid((unsigned)slices, (unsigned)n_rows);
    if (type == BN_CB_HEAD_F16)
        launch_pick<BN_CB_HEAD_F16>(w, vocab, dim, span, grid, est, back, factor, wmax, y, best,
                                    count, tokens, stream);
    else
        launch_pick<BN_CB_HEAD_BF16>(w, vocab, dim, span, grid, est, back, factor, wmax, y, best,
                                     count, tokens, stream);
    return cudaGetLastError();
}
