/*
 * attention_kernels.cu - decode and prefill attention (GQA, causal) over
 * an fp16 cache. Layout and contracts: attention_cuda.h.
 *
 * Kernels: decode_kernel + decode_combine (flash-decoding), prefill_kernel
 * (fp32 FMA, tiled: head_dim 256) and prefill_mma_kernel (tensor cores:
 * head_dim 64 and 128). They are templated on the cache's element type T,
 * __half, through the widen2 / pack2 / mma16816 overloads.
 *
 * Numerics shared by all kernels: queries are read in fp32 and multiplied
 * once by scale * log2(e), so every score is already in the base-2 domain
 * and exp2f gives the softmax weights (exp(x) = 2^(x log2 e)); the
 * running maximum is subtracted before every exponential, so no weight
 * exceeds 1 and nothing overflows. Keys and values are widened to fp32
 * on load; all sums are fp32.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention_cuda.h"
#include "mma_f16.cuh"
#include "smem_opt_in.cuh"

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxSplits = 256;
constexpr int kMinChunk = 32; /* positions per decode range, at least */

/* ---- element access ------------------------------------------------------- */

__device__ __forceinline__ float2 widen2(uint32_t w, __half)
{
    __half2 h;
    memcpy(&h, &w, sizeof h);
    return __half22float2(h);
}

/* N consecutive 2-byte elements (N = 2, 4 or 8, aligned to 2N bytes) to
 * fp32 with one vector load through the read-only path. */
template <typename T, int N>
__device__ __forceinline__ void load_row(const T *p, float (&f)[N])
{
    static_assert(N == 2 || N == 4 || N == 8, "2, 4 or 8 elements per lane");
    uint32_t w[N / 2];
    if constexpr (N == 8) {
        const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (N == 4) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
        w[0] = v.x, w[1] = v.y;
    } else {
        w[0] = __ldg(reinterpret_cast<const unsigned int *>(p));
    }
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        const float2 t = widen2(w[i], T());
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

/* 2^(a - b) for the online softmax: a == -inf (nothing seen yet, or a
 * masked score) gives 0; b is never -inf where this is called. */
__device__ __forceinline__ float exp2_diff(float a, float b) { return exp2f(a - b); }

/* ---- decode --------------------------------------------------------------- */

constexpr int kDecodeWarps = 4;

/* Parameters shared by the decode kernels. */
struct decode_params {
    const float *q;
    int64_t ldq;
    const void *k, *v;
    int64_t seq_stride;
    const int32_t *kv_len;
    float *out;
    int64_t ldo;
    float *ws_ml;  /* [seq][head][split][2]: running max, sum */
    float *ws_acc; /* [seq][head][split][head_dim]            */
    int n_heads, n_kv_heads, group, splits;
    int64_t capacity;
    float qscale; /* scale * log2(e) */
};

/* The kv length clamped to [0, capacity], cut into ranges of
 * max(ceil(len / splits), kMinChunk) positions: short lengths use only the
 * first few of the launched ranges instead of spreading a handful of
 * positions over all of them. Returns the number of non-empty ranges and
 * range `split`'s bounds. */
__device__ __forceinline__ int decode_range(int len, int64_t capacity, int splits, int split,
                                            int *begin, int *end)
{
    len = len < 0 ? 0 : len > capacity ? (int)capacity : len;
    int chunk = (len + splits - 1) / splits;
    chunk = splits > 1 && chunk < kMinChunk ? kMinChunk : chunk;
    *begin = min(len, split * chunk);
    *end = min(len, *begin + chunk);
    return chunk > 0 ? (len + chunk - 1) / chunk : 0;
}

/* Block (split, unit, seq), 4 warps. With G > 1 the unit is a kv head and
 * the block serves its G query heads (group == G), reading every key and
 * value once for all of them. G == 1 is the general case: the unit is one
 * query head, for any group size.
 *
 * Warp w takes keys begin + KPW w, stepping by 4 KPW: a lane holds HD/32
 * consecutive dims of q (per head), of the KPW keys and of the KPW values
 * it loads before using any (KPW rows in flight per lane). Each warp keeps
 * its own running max m, sum l and unnormalised output acc per head; the
 * four are merged through shared memory at the end. */
template <typename T, int HD, int G>
__global__ void __launch_bounds__(32 * kDecodeWarps) decode_kernel(decode_params p)
{
    constexpr int EPL = HD / 32;
    constexpr int KPW = G * EPL <= 16 ? 4 : 2;
    __shared__ float sm_m[kDecodeWarps][G], sm_l[kDecodeWarps][G];
    __shared__ float sm_acc[kDecodeWarps][G][HD];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int split = blockIdx.x, seq = blockIdx.z;
    const int head0 = G == 1 ? (int)blockIdx.y : (int)blockIdx.y * G;
    const int kvh = G == 1 ? head0 / p.group : (int)blockIdx.y;

    int begin, end;
    decode_range(p.kv_len[seq], p.capacity, p.splits, split, &begin, &end);
    /* Ranges past the length are left out by the combine kernel too. */
    if (p.splits > 1 && begin >= end)
        return;

    float q[G][EPL];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < EPL; e++)
            q[g][e] = p.q[seq * p.ldq + (int64_t)(head0 + g) * HD + lane * EPL + e] * p.qscale;

    const T *kbase = static_cast<const T *>(p.k) + seq * p.seq_stride + (int64_t)kvh * HD +
                     lane * EPL;
    const T *vbase = static_cast<const T *>(p.v) + seq * p.seq_stride + (int64_t)kvh * HD +
                     lane * EPL;
    const int64_t row = (int64_t)p.n_kv_heads * HD;

    float m[G], l[G], acc[G][EPL];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            acc[g][e] = 0.0f;
    }

    for (int t0 = begin + warp * KPW; t0 < end; t0 += kDecodeWarps * KPW) {
        float kf[KPW][EPL], vf[KPW][EPL];
#pragma unroll
        for (int j = 0; j < KPW; j++) {
            if (t0 + j < end) {
                load_row(kbase + (t0 + j) * row, kf[j]);
                load_row(vbase + (t0 + j) * row, vf[j]);
            } else {
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    kf[j][e] = vf[j][e] = 0.0f;
            }
        }
        float s[KPW][G];
#pragma unroll
        for (int j = 0; j < KPW; j++)
#pragma unroll
            for (int g = 0; g < G; g++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; e++)
                    d = fmaf(q[g][e], kf[j][e], d);
                s[j][g] = d;
            }
        /* All KPW * G partial dots reduced together: independent shuffles. */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < KPW; j++)
#pragma unroll
                for (int g = 0; g < G; g++)
                    s[j][g] += __shfl_xor_sync(0xffffffffu, s[j][g], o);
#pragma unroll
        for (int j = 0; j < KPW; j++)
            if (t0 + j >= end)
#pragma unroll
                for (int g = 0; g < G; g++)
                    s[j][g] = -INFINITY;

#pragma unroll
        for (int g = 0; g < G; g++) {
            float mt = s[0][g]; /* key t0 < end: finite */
#pragma unroll
            for (int j = 1; j < KPW; j++)
                mt = fmaxf(mt, s[j][g]);
            const float mn = fmaxf(m[g], mt);
            const float corr = exp2_diff(m[g], mn);
            float pj[KPW], psum = 0.0f;
#pragma unroll
            for (int j = 0; j < KPW; j++) {
                pj[j] = exp2_diff(s[j][g], mn);
                psum += pj[j];
            }
            l[g] = l[g] * corr + psum;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                float a = acc[g][e] * corr;
#pragma unroll
                for (int j = 0; j < KPW; j++)
                    a = fmaf(pj[j], vf[j][e], a);
                acc[g][e] = a;
            }
            m[g] = mn;
        }
    }

#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) {
            sm_m[warp][g] = m[g];
            sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < EPL; e++)
            sm_acc[warp][g][lane * EPL + e] = acc[g][e];
    }
    __syncthreads();

    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
        const int g = i / HD, d = i % HD;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < kDecodeWarps; w++)
            mx = fmaxf(mx, sm_m[w][g]);
        float lsum = 0.0f, a = 0.0f;
        if (mx != -INFINITY) { /* else this range is empty */
#pragma unroll
            for (int w = 0; w < kDecodeWarps; w++) {
                const float c = exp2_diff(sm_m[w][g], mx);
                lsum = fmaf(sm_l[w][g], c, lsum);
                a = fmaf(sm_acc[w][g][d], c, a);
            }
        }
        const int head = head0 + g;
        if (p.splits == 1) {
            p.out[seq * p.ldo + (int64_t)head * HD + d] = lsum > 0.0f ? a / lsum : 0.0f;
        } else {
            const int64_t slot = ((int64_t)seq * p.n_heads + head) * p.splits + split;
            p.ws_acc[slot * HD + d] = a;
            if (d == 0) {
                p.ws_ml[2 * slot] = mx;
                p.ws_ml[2 * slot + 1] = lsum;
            }
        }
    }
}

constexpr int kCombineThreads = 512;

/* Block-wide max or sum of one float per thread (all threads call). */
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float *scratch)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, other) : v + other;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* scratch free from any previous use */
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = MAX ? -INFINITY : 0.0f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        v = MAX ? fmaxf(v, scratch[w]) : v + scratch[w];
    return v;
}

/* Block (head, seq), 512 threads: merges the non-empty ranges' partial
 * results, each rescaled to the largest maximum. Thread (part, d) sums
 * every P-th range of output dim d (P = 512 / head_dim), so the loads of
 * many ranges are in flight at once; the parts meet in shared memory. */
__global__ void __launch_bounds__(kCombineThreads)
    decode_combine(const float *__restrict__ ws_ml, const float *__restrict__ ws_acc,
                   const int32_t *__restrict__ kv_len, int64_t capacity, int n_heads,
                   int splits, int head_dim, float *__restrict__ out, int64_t ldo)
{
    __shared__ float scale[kMaxSplits];
    __shared__ float scratch[kCombineThreads / 32];
    __shared__ float parts[kCombineThreads];
    const int head = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
    int b, e;
    const int used = decode_range(kv_len[seq], capacity, splits, 0, &b, &e);
    const int64_t slot0 = ((int64_t)seq * n_heads + head) * splits;

    float mx = -INFINITY;
    for (int s = tid; s < used; s += blockDim.x)
        mx = fmaxf(mx, ws_ml[2 * (slot0 + s)]);
    mx = block_reduce<true>(mx, scratch);
    float lsum = 0.0f;
    for (int s = tid; s < used; s += blockDim.x) {
        const float c = mx == -INFINITY ? 0.0f : exp2_diff(ws_ml[2 * (slot0 + s)], mx);
        scale[s] = c;
        lsum = fmaf(ws_ml[2 * (slot0 + s) + 1], c, lsum);
    }
    lsum = block_reduce<false>(lsum, scratch); /* its barriers publish scale[] */

    const int P = blockDim.x / head_dim, part = tid / head_dim, d = tid % head_dim;
    float a = 0.0f;
    if (part < P) {
#pragma unroll 4
        for (int s = part; s < used; s += P)
            a = fmaf(ws_acc[(slot0 + s) * head_dim + d], scale[s], a);
    }
    parts[tid] = a;
    __syncthreads();
    if (tid < head_dim) {
        for (int q = 1; q < P; q++)
            a += parts[q * head_dim + tid];
        out[seq * ldo + (int64_t)head * head_dim + tid] = lsum > 0.0f ? a / lsum : 0.0f;
    }
}

/* ---- prefill -------------------------------------------------------------- */

constexpr int kBQ = 16;  /* queries per block                     */
constexpr int kBK = 32;  /* keys per shared-memory tile           */
constexpr int kPrefillThreads = 128;
constexpr int kRowThreads = kPrefillThreads / kBQ; /* 8 threads per query row */

constexpr size_t prefill_smem_bytes(int hd)
{
    /* Q and K rows padded by one float: the 8 threads of a row read K rows
     * c, c+1, ... at the same dim, and the 4 rows of a warp read Q rows at
     * the same dim; with a stride of hd + 1 those fall in distinct banks. */
    return sizeof(float) *
           ((size_t)kBQ * (hd + 1) + (size_t)kBK * (hd + 1) + (size_t)kBK * hd + kBQ * (kBK + 1));
}

/* Block (query tile, head). Thread t owns query row r = t / 8 of the tile:
 * it scores keys c = t % 8 + 8 j of each key tile and accumulates output
 * dims d = t % 8 + 8 i. A row's 8 threads are consecutive lanes of one
 * warp, so the row's max and sum need only three shuffles and its
 * probabilities only a __syncwarp before the P.V product reads them. */
template <typename T, int HD>
__global__ void __launch_bounds__(kPrefillThreads, 4)
    prefill_kernel(const float *__restrict__ q, int64_t ldq, int n,
                   const int32_t *__restrict__ pos0_ptr, const T *__restrict__ kc,
                   const T *__restrict__ vc, int n_kv_heads, int group, int64_t capacity,
                   float qscale, float *__restrict__ out, int64_t ldo)
{
    constexpr int DPT = HD / kRowThreads; /* output dims per thread */
    constexpr int KPT = kBK / kRowThreads; /* scores per thread per tile */
    extern __shared__ float smem[];
    float *Qs = smem;                     /* [kBQ][HD + 1] */
    float *Ks = Qs + kBQ * (HD + 1);      /* [kBK][HD + 1] */
    float *Vs = Ks + kBK * (HD + 1);      /* [kBK][HD]     */
    float *Ps = Vs + kBK * HD;            /* [kBQ][kBK + 1] */

    const int tid = threadIdx.x;
    const int r = tid / kRowThreads, sub = tid % kRowThreads;
    const int q0 = blockIdx.x * kBQ;
    const int head = blockIdx.y, kvh = head / group;
    /* Positions fit in int: capacity <= INT32_MAX (bn_attn_check_shape). */
    const int pos0 = *pos0_ptr;
    if (pos0 < 0 || (int64_t)pos0 + q0 >= capacity)
        return;
    /* Rows past n (or past the cache) compute on zero queries and are not
     * written; they use the last valid position so no row is all masked. */
    const int rows_valid = (int)min((int64_t)min(n - q0, kBQ), capacity - pos0 - q0);
    const int qpos = pos0 + q0 + min(r, rows_valid - 1);
    const int kv_end = pos0 + q0 + rows_valid; /* keys [0, kv_end) */

    for (int i = tid; i < kBQ * HD; i += kPrefillThreads) {
        const int rr = i / HD, d = i % HD;
        Qs[rr * (HD + 1) + d] =
            rr < rows_valid ? q[(int64_t)(q0 + rr) * ldq + (int64_t)head * HD + d] * qscale
                            : 0.0f;
    }

    float o[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++)
        o[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int64_t row = (int64_t)n_kv_heads * HD;

    for (int k0 = 0; k0 < kv_end; k0 += kBK) {
        __syncthreads(); /* previous tile fully used (and Qs written) */
        /* Stage keys and values in pairs of elements; keys past kv_end
         * become zeros, so no garbage (or NaN) from unwritten cache slots
         * reaches the sums. */
        for (int i = tid; i < kBK * HD / 2; i += kPrefillThreads) {
            const int c = i / (HD / 2), d = 2 * (i % (HD / 2));
            float2 kv2 = make_float2(0.0f, 0.0f), vv2 = make_float2(0.0f, 0.0f);
            if (k0 + c < kv_end) {
                const int64_t off = (int64_t)(k0 + c) * row + (int64_t)kvh * HD + d;
                kv2 = widen2(__ldg(reinterpret_cast<const unsigned int *>(kc + off)), T());
                vv2 = widen2(__ldg(reinterpret_cast<const unsigned int *>(vc + off)), T());
            }
            Ks[c * (HD + 1) + d] = kv2.x;
            Ks[c * (HD + 1) + d + 1] = kv2.y;
            Vs[c * HD + d] = vv2.x;
            Vs[c * HD + d + 1] = vv2.y;
        }
        __syncthreads();

        float s[KPT];
#pragma unroll
        for (int j = 0; j < KPT; j++)
            s[j] = 0.0f;
        const float *qrow = Qs + r * (HD + 1);
#pragma unroll 8
        for (int d = 0; d < HD; d++) {
            const float qd = qrow[d];
#pragma unroll
            for (int j = 0; j < KPT; j++)
                s[j] = fmaf(qd, Ks[(sub + kRowThreads * j) * (HD + 1) + d], s[j]);
        }
        float mt = -INFINITY;
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            if (k0 + sub + kRowThreads * j > qpos) /* causal (and past kv_end) */
                s[j] = -INFINITY;
            mt = fmaxf(mt, s[j]);
        }
#pragma unroll
        for (int o2 = 1; o2 < kRowThreads; o2 <<= 1)
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o2));
        /* Key 0 is in the first tile and visible to every row, so m is
         * finite from the first tile on; a tile wholly masked for this row
         * leaves mt = -inf and mn = m. */
        const float mn = fmaxf(m, mt);
        const float corr = exp2_diff(m, mn);
        float psum = 0.0f;
#pragma unroll
        for (int j = 0; j < KPT; j++) {
            const float pj = exp2_diff(s[j], mn);
            psum += pj;
            Ps[r * (kBK + 1) + sub + kRowThreads * j] = pj;
        }
#pragma unroll
        for (int o2 = 1; o2 < kRowThreads; o2 <<= 1)
            psum += __shfl_xor_sync(0xffffffffu, psum, o2);
        l = l * corr + psum;
        m = mn;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < DPT; i++)
            o[i] *= corr;
        const int cmax = min(kBK, kv_end - k0);
        for (int c = 0; c < cmax; c++) {
            const float pc = Ps[r * (kBK + 1) + c];
#pragma unroll
            for (int i = 0; i < DPT; i++)
                o[i] = fmaf(pc, Vs[c * HD + sub + kRowThreads * i], o[i]);
        }
    }

    if (r < rows_valid) {
        const float inv = 1.0f / l; /* l >= 1: the maximum's own weight */
        float *orow = out + (int64_t)(q0 + r) * ldo + (int64_t)head * HD;
#pragma unroll
        for (int i = 0; i < DPT; i++)
            orow[sub + kRowThreads * i] = o[i] * inv;
    }
}

/* ---- prefill on tensor cores ------------------------------------------------
 *
 * FlashAttention-2 style with mma.sync m16n8k16 (fp16 inputs, the
 * cache's type, fp32 accumulation). Block (64-query tile, head), 4 warps;
 * warp w owns query rows 16w .. 16w + 15. Per tile of 64 keys staged in
 * shared memory (K and V row-major, rows padded by 8 elements so fragment
 * loads hit distinct banks):
 *
 *   S = Q K^T        A = Q fragments (registers, loaded once),
 *                    B = K straight from shared memory (32-bit loads);
 *   online softmax   on the S accumulators, per row: the 4 lanes of a quad
 *                    hold a row's columns, so max and sum take 2 shuffles;
 *   O += P V         A = P, built from the S accumulators in registers
 *                    (the m16n8 C layout of two key n-tiles is the A
 *                    layout of one k16 step), B = V via ldmatrix.trans.
 *
 * Precision: Q (fp32, scaled) and P (fp32 in [0, 1]) are each split into
 * hi + lo parts of the cache's type (lo = the rounding error of hi) and
 * both parts are multiplied: the products then carry ~22 significant bits
 * instead of 11, while K and V are used exactly as stored. Measured worst
 * error 2.3e-5 * max|v| against a double reference (the FMA kernel:
 * 5.4e-6); single-part operands would add the rounding of Q and P
 * themselves (2^-12 relative) to every score and weight. This doubles the mma count, which
 * tensor cores easily absorb: 6-9x faster than the FMA kernel on an H200.
 */

constexpr int kMmaBQ = 64, kMmaBK = 64, kMmaWarps = 4;

__device__ __forceinline__ uint32_t pack2(float lo, float hi, __half)
{
    const __half2 h = __floats2half2_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* x0, x1 -> hi (rounded) and lo (rounded remainder), each a packed pair. */
template <typename T>
__device__ __forceinline__ void split2(float x0, float x1, uint32_t &hi, uint32_t &lo)
{
    hi = pack2(x0, x1, T());
    const float2 h = widen2(hi, T());
    lo = pack2(x0 - h.x, x1 - h.y, T());
}

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b0,
                                         const uint32_t b1, __half)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T, int HD>
__global__ void __launch_bounds__(32 * kMmaWarps, 1)
    prefill_mma_kernel(const float *__restrict__ q, int64_t ldq, int n,
                       const int32_t *__restrict__ pos0_ptr, const T *__restrict__ kc,
                       const T *__restrict__ vc, int n_kv_heads, int group, int64_t capacity,
                       float qscale, float *__restrict__ out, int64_t ldo)
{
    constexpr int KS = HD + 8;       /* shared row stride, elements (16-byte multiple) */
    constexpr int KSTEPS = HD / 16;  /* k16 steps over the head dim */
    constexpr int DT = HD / 8;       /* n8 tiles of output dims     */
    constexpr int NT = kMmaBK / 8;   /* n8 tiles of keys            */
    __shared__ __align__(16) T Ks[kMmaBK * KS];
    __shared__ __align__(16) T Vs[kMmaBK * KS];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int q0 = blockIdx.x * kMmaBQ;
    const int head = blockIdx.y, kvh = head / group;
    const int pos0 = *pos0_ptr;
    if (pos0 < 0 || (int64_t)pos0 + q0 >= capacity)
        return;
    const int rows_valid = (int)min((int64_t)min(n - q0, kMmaBQ), capacity - pos0 - q0);
    const int kv_end = pos0 + q0 + rows_valid;
    /* This lane's two rows (gid, gid + 8 of the warp's 16); rows past the
     * valid ones use the last valid position, so none is all masked. */
    const int r0 = warp * 16 + gid, r1 = r0 + 8;
    const int qpos0 = pos0 + q0 + min(r0, rows_valid - 1);
    const int qpos1 = pos0 + q0 + min(r1, rows_valid - 1);
    const int warp_last = pos0 + q0 + min(warp * 16 + 15, rows_valid - 1);

    uint32_t qh[KSTEPS][4], ql[KSTEPS][4];
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = (r & 1) ? r1 : r0;
            const int col = 16 * kk + 2 * tig + ((r & 2) ? 8 : 0);
            float x0 = 0.0f, x1 = 0.0f;
            if (row < rows_valid) {
                const float *src = q + (int64_t)(q0 + row) * ldq + (int64_t)head * HD + col;
                x0 = src[0] * qscale;
                x1 = src[1] * qscale;
            }
            split2<T>(x0, x1, qh[kk][r], ql[kk][r]);
        }

    float o[DT][4];
#pragma unroll
    for (int u = 0; u < DT; u++)
        o[u][0] = o[u][1] = o[u][2] = o[u][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int64_t row_elems = (int64_t)n_kv_heads * HD;

    for (int k0 = 0; k0 < kv_end; k0 += kMmaBK) {
        __syncthreads(); /* the previous tile is no longer read */
        /* Stage 64 keys and values, 16 bytes per load; keys past kv_end
         * become zeros (never garbage from unwritten slots). */
        for (int i = tid; i < kMmaBK * HD / 8; i += 32 * kMmaWarps) {
            const int c = i / (HD / 8), d8 = (i % (HD / 8)) * 8;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (k0 + c < kv_end) {
                const int64_t off = (int64_t)(k0 + c) * row_elems + (int64_t)kvh * HD + d8;
                kv = __ldg(reinterpret_cast<const uint4 *>(kc + off));
                vv = __ldg(reinterpret_cast<const uint4 *>(vc + off));
            }
            *reinterpret_cast<uint4 *>(&Ks[c * KS + d8]) = kv;
            *reinterpret_cast<uint4 *>(&Vs[c * KS + d8]) = vv;
        }
        __syncthreads();
        if (k0 > warp_last)
            continue; /* every key of the tile is after this warp's queries */

        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const T *krow = &Ks[(8 * j + gid) * KS + 2 * tig];
#pragma unroll
            for (int kk = 0; kk < KSTEPS; kk++) {
                const uint32_t b0 = *reinterpret_cast<const uint32_t *>(krow + 16 * kk);
                const uint32_t b1 = *reinterpret_cast<const uint32_t *>(krow + 16 * kk + 8);
                mma16816(s[j], qh[kk], b0, b1, T());
                mma16816(s[j], ql[kk], b0, b1, T());
            }
        }
        /* Causal mask, then the row maxima (a row's columns are spread over
         * the 4 lanes of a quad). */
        float mt0 = -INFINITY, mt1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kp = k0 + 8 * j + 2 * tig + (e & 1);
                if (kp > ((e & 2) ? qpos1 : qpos0))
                    s[j][e] = -INFINITY;
                if (e & 2)
                    mt1 = fmaxf(mt1, s[j][e]);
                else
                    mt0 = fmaxf(mt0, s[j][e]);
            }
#pragma unroll
        for (int o2 = 1; o2 < 4; o2 <<= 1) {
            mt0 = fmaxf(mt0, __shfl_xor_sync(0xffffffffu, mt0, o2));
            mt1 = fmaxf(mt1, __shfl_xor_sync(0xffffffffu, mt1, o2));
        }
        /* Key 0 is in the first tile, which no warp skips, and every row
         * sees it: m0 and m1 are finite from then on. */
        const float mn0 = fmaxf(m0, mt0), mn1 = fmaxf(m1, mt1);
        const float c0 = exp2_diff(m0, mn0), c1 = exp2_diff(m1, mn1);
        m0 = mn0;
        m1 = mn1;
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = exp2_diff(s[j][0], mn0);
            s[j][1] = exp2_diff(s[j][1], mn0);
            s[j][2] = exp2_diff(s[j][2], mn1);
            s[j][3] = exp2_diff(s[j][3], mn1);
            ps0 += s[j][0] + s[j][1];
            ps1 += s[j][2] + s[j][3];
        }
        l0 = l0 * c0 + ps0; /* per-lane partial sums; the quad adds them at the end */
        l1 = l1 * c1 + ps1;
#pragma unroll
        for (int u = 0; u < DT; u++) {
            o[u][0] *= c0;
            o[u][1] *= c0;
            o[u][2] *= c1;
            o[u][3] *= c1;
        }

        /* O += P V, one k16 step per pair of key n-tiles. */
        const int lrow = (lane & 7) + ((lane >> 3) & 1) * 8, lcol = (lane >> 4) * 8;
#pragma unroll
        for (int t = 0; t < NT / 2; t++) {
            uint32_t ph[4], pl[4];
            split2<T>(s[2 * t][0], s[2 * t][1], ph[0], pl[0]);
            split2<T>(s[2 * t][2], s[2 * t][3], ph[1], pl[1]);
            split2<T>(s[2 * t + 1][0], s[2 * t + 1][1], ph[2], pl[2]);
            split2<T>(s[2 * t + 1][2], s[2 * t + 1][3], ph[3], pl[3]);
#pragma unroll
            for (int u = 0; u < DT; u += 2) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, &Vs[(16 * t + lrow) * KS + 8 * u + lcol]);
                mma16816(o[u], ph, b[0], b[1], T());
                mma16816(o[u], pl, b[0], b[1], T());
                mma16816(o[u + 1], ph, b[2], b[3], T());
                mma16816(o[u + 1], pl, b[2], b[3], T());
            }
        }
    }

#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1; /* >= 1: the maximum's own weight */
#pragma unroll
    for (int u = 0; u < DT; u++) {
        const int col = head * HD + 8 * u + 2 * tig;
        if (r0 < rows_valid) {
            float *dst = out + (int64_t)(q0 + r0) * ldo + col;
            dst[0] = o[u][0] * inv0;
            dst[1] = o[u][1] * inv0;
        }
        if (r1 < rows_valid) {
            float *dst = out + (int64_t)(q0 + r1) * ldo + col;
            dst[0] = o[u][2] * inv1;
            dst[1] = o[u][3] * inv1;
        }
    }
}

/* ---- dispatch ------------------------------------------------------------- */

template <typename T, int HD>
cudaError_t launch_decode_t(const decode_params &p, int n_seq, cudaStream_t stream)
{
    const dim3 block(32 * kDecodeWarps);
    const dim3 by_kv((unsigned)p.splits, (unsigned)p.n_kv_heads, (unsigned)n_seq);
    switch (p.group) {
    case 2: decode_kernel<T, HD, 2><<<by_kv, block, 0, stream>>>(p); break;
    case 4: decode_kernel<T, HD, 4><<<by_kv, block, 0, stream>>>(p); break;
    case 8: decode_kernel<T, HD, 8><<<by_kv, block, 0, stream>>>(p); break;
    default: /* any group size, one query head per block */
        decode_kernel<T, HD, 1>
            <<<dim3((unsigned)p.splits, (unsigned)p.n_heads, (unsigned)n_seq), block, 0, stream>>>(p);
        break;
    }
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_decode(const decode_params &p, int head_dim, int n_seq, cudaStream_t stream)
{
    switch (head_dim) {
    case 64: return launch_decode_t<T, 64>(p, n_seq, stream);
    case 128: return launch_decode_t<T, 128>(p, n_seq, stream);
    case 256: return launch_decode_t<T, 256>(p, n_seq, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* Tensor cores up to head_dim 128; at 256 their accumulators would not fit
 * in registers, and the FMA kernel computes. */
template <typename T, int HD>
cudaError_t launch_prefill_t(const bn_attn_shape *s, const float *q, int64_t ldq, int n,
                             const int32_t *pos0, const void *kc, const void *vc, float *out,
                             int64_t ldo, float qscale, cudaStream_t stream)
{
    const int group = s->n_heads / s->n_kv_heads;
    const T *k = static_cast<const T *>(kc), *v = static_cast<const T *>(vc);
    if constexpr (HD <= 128) {
        const dim3 grid((unsigned)((n + kMmaBQ - 1) / kMmaBQ), (unsigned)s->n_heads);
        prefill_mma_kernel<T, HD><<<grid, 32 * kMmaWarps, 0, stream>>>(
            q, ldq, n, pos0, k, v, s->n_kv_heads, group, s->capacity, qscale, out, ldo);
        return cudaGetLastError();
    } else {
        const size_t smem = prefill_smem_bytes(HD);
        auto kernel = prefill_kernel<T, HD>;
        const cudaError_t rc = allow_dynamic_smem(kernel, smem);
        if (rc != cudaSuccess)
            return rc;
        const dim3 grid((unsigned)((n + kBQ - 1) / kBQ), (unsigned)s->n_heads);
        kernel<<<grid, kPrefillThreads, smem, stream>>>(q, ldq, n, pos0, k, v, s->n_kv_heads,
                                                        group, s->capacity, qscale, out, ldo);
        return cudaGetLastError();
    }
}

template <typename T>
cudaError_t launch_prefill(const bn_attn_shape *s, const float *q, int64_t ldq, int n,
                           const int32_t *pos0, const void *kc, const void *vc, float *out,
                           int64_t ldo, float qscale, cudaStream_t stream)
{
    switch (s->head_dim) {
    case 64:
        return launch_prefill_t<T, 64>(s, q, ldq, n, pos0, kc, vc, out, ldo, qscale, stream);
    case 128:
        return launch_prefill_t<T, 128>(s, q, ldq, n, pos0, kc, vc, out, ldo, qscale, stream);
    case 256:
        return launch_prefill_t<T, 256>(s, q, ldq, n, pos0, kc, vc, out, ldo, qscale, stream);
    default: return cudaErrorInvalidValue;
    }
}

float score_scale(const bn_attn_shape *s)
{
    const float scale = s->scale > 0.0f ? s->scale : 1.0f / sqrtf((float)s->head_dim);
    return scale * kLog2e;
}

} // namespace

extern "C" cudaError_t bn_attn_check_shape(const bn_attn_shape *s)
{
    if (!s || s->n_heads < 1 || s->n_kv_heads < 1 || s->n_heads % s->n_kv_heads != 0 ||
        (s->head_dim != 64 && s->head_dim != 128 && s->head_dim != 256) || s->capacity < 1 ||
        s->capacity > INT32_MAX || s->kv_type != BN_ATTN_KV_F16)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

extern "C" int bn_attn_decode_splits(const bn_attn_shape *s, int n_seq, int64_t max_kv_len,
                                     int sm_count)
{
    if (!s || n_seq < 1 || s->n_kv_heads < 1 || max_kv_len <= 2 * kMinChunk)
        return 1;
    /* Four blocks per SM, enough loads in flight to approach the memory
     * bandwidth; the G == 1 fallback has n_heads units instead of
     * n_kv_heads, so it needs fewer ranges, but kv heads is the safe side. */
    const int64_t units = (int64_t)n_seq * s->n_kv_heads;
    const int64_t want = 4 * (int64_t)(sm_count > 0 ? sm_count : 132);
    int64_t splits = (want + units - 1) / units;
    const int64_t by_len = (max_kv_len + kMinChunk - 1) / kMinChunk;
    splits = splits > by_len ? by_len : splits;
    splits = splits > kMaxSplits ? kMaxSplits : splits < 1 ? 1 : splits;
    return (int)splits;
}

extern "C" size_t bn_attn_decode_workspace_bytes(const bn_attn_shape *s, int n_seq, int splits)
{
    if (!s || splits <= 1 || n_seq < 1)
        return 0;
    const size_t slots = (size_t)n_seq * (size_t)s->n_heads * (size_t)splits;
    return slots * sizeof(float) * (2 + (size_t)s->head_dim);
}

extern "C" cudaError_t bn_attn_decode(const bn_attn_shape *s, const bn_attn_decode_args *a,
                                      cudaStream_t stream)
{
    cudaError_t rc = bn_attn_check_shape(s);
    if (rc != cudaSuccess)
        return rc;
    if (!a || a->splits < 1 || a->splits > kMaxSplits || (a->splits > 1 && !a->workspace) ||
        a->n_seq > 65535)
        return cudaErrorInvalidValue;
    if (a->n_seq <= 0)
        return cudaSuccess;
    decode_params p;
    p.q = a->q;
    p.ldq = a->ldq;
    p.k = a->k_cache;
    p.v = a->v_cache;
    p.seq_stride = a->seq_stride;
    p.kv_len = a->kv_len;
    p.out = a->out;
    p.ldo = a->ldo;
    const size_t slots = (size_t)a->n_seq * (size_t)s->n_heads * (size_t)a->splits;
    p.ws_ml = static_cast<float *>(a->workspace);
    p.ws_acc = p.ws_ml ? p.ws_ml + 2 * slots : nullptr;
    p.n_heads = s->n_heads;
    p.n_kv_heads = s->n_kv_heads;
    p.group = s->n_heads / s->n_kv_heads;
    p.splits = a->splits;
    p.capacity = s->capacity;
    p.qscale = score_scale(s);
    rc = launch_decode<__half>(p, s->head_dim, a->n_seq, stream);
    if (rc != cudaSuccess || a->splits == 1)
        return rc;
    decode_combine<<<dim3((unsigned)s->n_heads, (unsigned)a->n_seq), kCombineThreads, 0,
                     stream>>>(p.ws_ml, p.ws_acc, a->kv_len, s->capacity, s->n_heads, a->splits,
                               s->head_dim, a->out, a->ldo);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_attn_prefill(const bn_attn_shape *s, const float *q, int64_t ldq, int n,
                                       const int32_t *pos0, const void *k_cache,
                                       const void *v_cache, float *out, int64_t ldo,
                                       cudaStream_t stream)
{
    const cudaError_t rc = bn_attn_check_shape(s);
    if (rc != cudaSuccess)
        return rc;
    if (n <= 0)
        return cudaSuccess;
    return launch_prefill<__half>(s, q, ldq, n, pos0, k_cache, v_cache, out, ldo, score_scale(s),
                                  stream);
}
