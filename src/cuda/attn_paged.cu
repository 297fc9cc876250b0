/*
 * attn_paged.cu - decode and prefill attention for rows of many sequences
 * over the paged KV cache (bn_cb_attn_paged in cuda_backend_kernels.h),
 * the batched pass's attention (cuda_backend_rows.c).
 *
 * Row r is one token of sequence row_seq[r] at position row_pos[r]; its
 * keys and values for positions 0..row_pos[r] live in cache rows
 * tables[seq * max_blocks + t / block_size] * block_size + t % block_size.
 *
 * One block per (row, kv head, split), covering the q heads that share
 * the kv head (GQA), so each cache row is read once for all of them;
 * the positions are split into `splits` ranges of whole 32-position tiles,
 * so that a pass of few rows still has blocks enough to keep the memory
 * busy. The block gathers tiles through the table into shared memory; over
 * an fp32 cache each warp scores the tile's keys (lane j: key j), keeps an
 * online softmax and accumulates p . V (lane l: the head's float4 chunk l);
 * over an fp16 cache the four warps compute the tile on the tensor cores
 * (attn_paged_mma_kernel, below). With one split the block writes the head's
 * output; with more, each writes its unnormalised sum with its max and
 * weight, and paged_merge combines a row's splits in split order (or, with
 * bn_cb_attn_paged_shares, the next norm does: attn_paged_shares.cuh).
 *
 * A row takes only the splits its own length needs (paged_row_splits:
 * about 128 positions each, at most the launch's), so a launch sized for the whole
 * context (a captured pass, which cannot know the lengths) costs little
 * more than one sized for the rows: the other blocks return at once, and
 * the merge reads only the shares written.
 * dev/cuda/attn_paged.cu holds the one-split kernel with its timing.
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "attn_paged_block.cuh"
#include "attn_paged_e4m3.cuh"
#include "attn_paged_shares.cuh"
#include "cp_async.cuh"
#include "mma_f16.cuh"
#include "cuda_backend_kernels.h"
#include "kv_store.cuh"
#include "smem_opt_in.cuh"

namespace {

constexpr int kTile = kPagedTile;

/* A tile's rows in shared memory: fp32, fp16 or e4m3 as stored, padded by
 * 16 bytes a row so that lanes reading different rows at the same column
 * fall in different banks. */
template <typename T, int HD> struct TileRow {
    static constexpr int kStride = HD + 16 / (int)sizeof(T); /* elements a row */
    static constexpr int kCopies = HD * (int)sizeof(T) / 16;  /* 16-byte copies a row */
};

/* Chunk ch (4 values) of a tile row, as floats. */
__device__ __forceinline__ float4 chunk4(const float *row, int ch)
{
    return reinterpret_cast<const float4 *>(row)[ch];
}
__device__ __forceinline__ float4 chunk4(const __half *row, int ch)
{
    const uint2 u = reinterpret_cast<const uint2 *>(row)[ch];
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 chunk4(const __nv_fp8_e4m3 *row, int ch)
{
    return e4m3x4_to_float4(reinterpret_cast<const uint32_t *>(row)[ch]);
}

/* The cache row of position t of a sequence (its table), -1 past end or
 * where the table has no block (a padding row of a captured pass: its
 * keys and values read as zeros). */
__device__ __forceinline__ int cache_row(const int32_t *table, int bs, int t, int end)
{
    const int block = t < end ? table[t / bs] : -1;
    return block < 0 ? -1 : block * bs + t % bs;
}

/* Issues the copies of one tile (rows crow[0 .. 32), -1: zero-filled) of
 * the head's K and V into kt and vt. */
template <typename T, int HD>
__device__ __forceinline__ void copy_tile(T *kt, T *vt, const int *crow, const T *kc,
                                          const T *vc, int64_t kv_dim, int64_t head_off)
{
    using R = TileRow<T, HD>;
    for (int i = threadIdx.x; i < kTile * R::kCopies; i += blockDim.x) {
        const int r = i / R::kCopies, c = i % R::kCopies, cr = crow[r];
        const int64_t src = (int64_t)(cr < 0 ? 0 : cr) * kv_dim + head_off;
        const int at = r * R::kStride + c * (16 / (int)sizeof(T));
        cp_async16((uint32_t)__cvta_generic_to_shared(kt + at),
                   reinterpret_cast<const uint4 *>(kc + src) + c, cr >= 0);
        cp_async16((uint32_t)__cvta_generic_to_shared(vt + at),
                   reinterpret_cast<const uint4 *>(vc + src) + c, cr >= 0);
    }
}

/* Shared memory: q [group][HD] floats, then two buffers of K and V tiles
 * (the next tile's copies run while this one is computed), then the two
 * tiles' cache rows. */
template <typename T, int HD> size_t paged_smem_of(int group)
{
    using R = TileRow<T, HD>;
    return sizeof(float) * (size_t)group * HD + 4 * sizeof(T) * (size_t)kTile * R::kStride +
           2 * kTile * sizeof(int);
}

template <int HD, typename T>
__global__ void attn_paged_kernel(int n_heads, int n_kv, const float *__restrict__ q, int64_t ldq,
                                  const int32_t *__restrict__ row_seq,
                                  const int32_t *__restrict__ row_pos,
                                  const int32_t *__restrict__ tables, int max_blocks, int bs,
                                  const T *__restrict__ kc, const T *__restrict__ vc,
                                  float scale, const int32_t *__restrict__ rows,
                                  float *__restrict__ out, int64_t ldo, float *__restrict__ part)
{
    using R = TileRow<T, HD>;
    constexpr int NC = HD / 4, KS = R::kStride, TILE = kTile * KS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int group = n_heads / n_kv;
    float *qs = reinterpret_cast<float *>(smem_raw);      /* [group][HD]           */
    T *tiles = reinterpret_cast<T *>(qs + group * HD);    /* [2][K, V][32][KS]     */
    int *crow = reinterpret_cast<int *>(tiles + 4 * TILE); /* [2][32]              */
    const int listed = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = kvh * group + warp;
    const int64_t kv_dim = (int64_t)n_kv * HD, head_off = (int64_t)kvh * HD;
    PagedRange range;
    if (!paged_block_range(rows, row_seq, row_pos, tables, max_blocks, range))
        return;
    const int row = range.row, begin = range.begin, end = range.end;
    const int32_t *table = range.table;

    for (int i = threadIdx.x; i < group * NC; i += blockDim.x) {
        const int w = i / NC, ch = i % NC;
        reinterpret_cast<float4 *>(qs + w * HD)[ch] = reinterpret_cast<const float4 *>(
            q + (int64_t)row * ldq + (int64_t)(kvh * group + w) * HD)[ch];
    }
    if (warp == 0)
        crow[lane] = cache_row(table, bs, begin + lane, end);
    __syncthreads();
    if (begin < end)
        copy_tile<T, HD>(tiles, tiles + TILE, crow, kc, vc, kv_dim, head_off);
    cp_async_commit();

    float m = -INFINITY, l = 0.0f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f); /* chunk `lane` (HD = 128) */
    for (int t0 = begin, buf = 0; t0 < end; t0 += kTile, buf ^= 1) {
        /* The next tile's rows, then its copies, while this one is used. */
        const bool more = t0 + kTile < end;
        if (warp == 0 && more)
            crow[(buf ^ 1) * kTile + lane] = cache_row(table, bs, t0 + kTile + lane, end);
        __syncthreads(); /* those rows are in place; the other buffer is free */
        if (more)
            copy_tile<T, HD>(tiles + (buf ^ 1) * 2 * TILE, tiles + (buf ^ 1) * 2 * TILE + TILE,
                             crow + (buf ^ 1) * kTile, kc, vc, kv_dim, head_off);
        cp_async_commit();
        cp_async_wait<1>(); /* this tile's copies */
        __syncthreads();
        const T *kt = tiles + buf * 2 * TILE, *vt = kt + TILE;

        const bool visible = t0 + lane < end;
        float score = -INFINITY;
        if (visible) {
            const float4 *qr = reinterpret_cast<const float4 *>(qs + warp * HD);
            const T *kr = kt + lane * KS;
            /* Four sums in flight rather than one chain of HD. */
            float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma unroll
            for (int ch = 0; ch < NC; ch++) {
                const float4 a = qr[ch], b = chunk4(kr, ch);
                d0 = fmaf(a.x, b.x, d0);
                d1 = fmaf(a.y, b.y, d1);
                d2 = fmaf(a.z, b.z, d2);
                d3 = fmaf(a.w, b.w, d3);
            }
            score = ((d0 + d1) + (d2 + d3)) * scale;
        }
        float mx = score;
        for (int o = 16; o > 0; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_new = fmaxf(m, mx);
        const float corr = expf(m - m_new);
        const float p = visible ? expf(score - m_new) : 0.0f;
        float sum = p;
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        l = fmaf(l, corr, sum);
        acc = make_float4(acc.x * corr, acc.y * corr, acc.z * corr, acc.w * corr);
        /* Every key of the tile, unrolled so the loads run ahead: keys past
         * the range weigh 0 over zero-filled rows. */
#pragma unroll
        for (int key = 0; key < kTile; key++) {
            const float pk = __shfl_sync(0xffffffffu, p, key);
            if (lane < NC) {
                const float4 v = chunk4(vt + key * KS, lane);
                acc = make_float4(fmaf(pk, v.x, acc.x), fmaf(pk, v.y, acc.y),
                                  fmaf(pk, v.z, acc.z), fmaf(pk, v.w, acc.w));
            }
        }
        m = m_new;
    }
    cp_async_wait<0>();
    if (gridDim.z == 1) {
        /* One split: the output itself, acc / l, as paged_merge gives a row
         * of one share (its weight e^0 = 1), so a launch of more splits
         * gives such a row bit for bit the same. */
        float4 *o = reinterpret_cast<float4 *>(out + (int64_t)row * ldo + (int64_t)h * HD);
        if (lane < NC)
            o[lane] = make_float4(acc.x / l, acc.y / l, acc.z / l, acc.w / l);
        return;
    }
    /* This split's share: [sum (HD)][max][weight]. */
    float *pr = part + (((int64_t)listed * n_heads + h) * gridDim.z + split) * (HD + 4);
    if (lane == 0) {
        pr[HD] = m;
        pr[HD + 1] = l;
    }
    if (lane < NC)
        reinterpret_cast<float4 *>(pr)[lane] = acc;
}

/* ---- fp16 caches on the tensor cores ----------------------------------------
 *
 * The kernel above spends most of its issue slots widening fp16 rows and
 * on fp32 multiply-adds (each of a block's warps reads the whole tile for
 * its q head). For an fp16 cache and groups of at most 8 q heads the same
 * block (4 warps, 32-position tiles copied through the table, two buffers)
 * computes a tile with mma.sync m16n8k16 instead, the group's q heads as
 * the n = 8 columns:
 *
 *   scores^T (32 keys x heads) = K q^T   warp w: keys 16 (w & 1) .., dims
 *                                        of half w >> 1 (A = K by ldmatrix,
 *                                        B = q from registers); the two
 *                                        halves meet in shared memory
 *   online softmax                       every warp the same, from the
 *                                        shared scores: lane (g, t) holds
 *                                        head g's keys 2t, 2t + 1, 2t + 8,
 *                                        2t + 9 of each 16, which is the B
 *                                        layout of P^T below
 *   out^T (dims x heads) += V^T P^T      warp w: dims w HD / 4 .. (A = V by
 *                                        ldmatrix.trans)
 *
 * Precision as the prefill kernel's: q and the weights P are split into
 * fp16 hi + lo parts and both are multiplied (~22 significant bits), K and
 * V are used exactly as stored, sums are fp32. q is scaled by head_dim^-0.5
 * log2(e) before the split, so the scores come out in base 2 and the
 * weights are one MUFU ex2 each. Outputs and shares (their maximum back in
 * natural units) have the kernel above's layout, so paged_merge combines
 * either.
 *
 * What a tile costs besides its products is kept off the block's path:
 * the table entries of the tile after next are loaded a tile ahead (lane
 * i of warp 0: position i), so the offsets warp 0 leaves before the
 * barrier need no global load; the copies read those offsets (no
 * multiply, no size register: cp.async's ignore-src zero-fills rows past
 * the range). */
constexpr int kMmaWarps = 4;
constexpr int kMmaMaxGroup = 8;         /* q heads a kv head: the n = 8 columns */
constexpr int kScoreStride = kTile + 4; /* floats a head's scores: distinct banks */

template <int HD> struct PagedMma {
    using R = TileRow<__half, HD>;
    static constexpr int KS = R::kStride, TILE = kTile * KS;
    static constexpr int SK = HD / 32; /* k16 steps of a warp's half of the dims */
    static constexpr int MT = HD / 64; /* m16 tiles of a warp's quarter of the dims */
    /* Two buffers of K and V tiles, the two halves' scores, the two tiles'
     * row offsets. */
    static constexpr size_t kSmem = sizeof(__half) * 4 * TILE +
                                    sizeof(float) * 2 * kMmaMaxGroup * kScoreStride +
                                    sizeof(int64_t) * 2 * kTile;
    /* A thread's copies: 16-byte chunk c of rows r0, r0 + kRowStep, ... of
     * both the K and the V tile. */
    static constexpr int kThreads = 32 * kMmaWarps;
    static constexpr int kRowStep = kThreads / R::kCopies, kRounds = kTile / kRowStep;
    static_assert(kThreads % R::kCopies == 0 && kTile % kRowStep == 0, "whole rounds");
};

template <int HD>
__global__ void __launch_bounds__(32 * kMmaWarps)
    attn_paged_mma_kernel(int n_heads, int n_kv, const float *__restrict__ q, int64_t ldq,
                          const int32_t *__restrict__ row_seq, const int32_t *__restrict__ row_pos,
                          const int32_t *__restrict__ tables, int max_blocks, int bs,
                          const __half *__restrict__ kc, const __half *__restrict__ vc,
                          float scale, const int32_t *__restrict__ rows, float *__restrict__ out,
                          int64_t ldo, float *__restrict__ part)
{
    using P = PagedMma<HD>;
    constexpr int KS = P::KS, TILE = P::TILE;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half *tiles = reinterpret_cast<__half *>(smem_raw);         /* [2][K, V][32][KS] */
    float *sc = reinterpret_cast<float *>(tiles + 4 * TILE);        /* [2][8][kScoreStride] */
    int64_t *rofs = reinterpret_cast<int64_t *>(sc + 2 * kMmaMaxGroup * kScoreStride); /* [2][32] */
    const int group = n_heads / n_kv;
    const int kvh = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t kv_dim = (int64_t)n_kv * HD, head_off = (int64_t)kvh * HD;
    PagedRange range;
    if (!paged_block_range(rows, row_seq, row_pos, tables, max_blocks, range))
        return;
    const int row = range.row, begin = range.begin, end = range.end;

    /* The first tile's offsets, and the second tile's table entries
     * (warp 0, a lane a position). */
    int ahead = paged_offsets_first<kTile>(rofs, range, bs, kv_dim, head_off);

    /* This warp's scores: keys 16 ks .. + 15 of a tile over the dims of
     * half kh; B fragments of q scaled to base 2 (head gid; zeros past the
     * group): dims kh HD / 2 + 16 s + 2 tig + {0, 1} and + 8. */
    const int ks = warp & 1, kh = warp >> 1;
    uint32_t qhi[P::SK][2], qlo[P::SK][2];
    {
        const float qscale = scale * kLog2e;
        const bool live = gid < group;
        const float *qr = q + (int64_t)row * ldq + (int64_t)(kvh * group + (live ? gid : 0)) * HD +
                          kh * (HD / 2) + 2 * tig;
#pragma unroll
        for (int s = 0; s < P::SK; s++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float2 v = live ? *reinterpret_cast<const float2 *>(qr + 16 * s + 8 * e)
                                      : make_float2(0.0f, 0.0f);
                split_f16x2(v.x * qscale, v.y * qscale, qhi[s][e], qlo[s][e]);
            }
    }

    /* This thread's copies: chunk c of rows r0 + k kRowStep of both tiles. */
    const int r0 = threadIdx.x / P::R::kCopies, c8 = 8 * (threadIdx.x % P::R::kCopies);
    const uint32_t tiles_s = (uint32_t)__cvta_generic_to_shared(tiles);
    auto copy_tiles = [&](int b) {
        const uint32_t kt_s = tiles_s + (uint32_t)(b * 2 * TILE * (int)sizeof(__half));
#pragma unroll
        for (int k = 0; k < P::kRounds; k++) {
            const int r = r0 + k * P::kRowStep;
            const int64_t o = rofs[b * kTile + r];
            const uint32_t at = kt_s + (uint32_t)((r * KS + c8) * (int)sizeof(__half));
            cp_async16_or_zero(at, kc + o + c8, o < 0);
            cp_async16_or_zero(at + TILE * (int)sizeof(__half), vc + o + c8, o < 0);
        }
    };
    __syncthreads();
    if (begin < end)
        copy_tiles(0);
    cp_async_commit();

    float m = -INFINITY, l = 0.0f; /* head gid's running maximum (base 2) and weight */
    float o[P::MT][4] = {};        /* dims (16 mt + gid, + 8) of this warp's quarter x heads */
    for (int t0 = begin, buf = 0; t0 < end; t0 += kTile, buf ^= 1) {
        paged_tile_turn<kTile>(t0, buf, rofs, ahead, range, bs, kv_dim, head_off, copy_tiles);
        const __half *kt = tiles + buf * 2 * TILE, *vt = kt + TILE;

        /* Scores of this warp's keys and half (rows past the range were
         * zero-filled; they are masked below). */
        float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < P::SK; s++) {
            uint32_t a[4];
            ldmatrix_x4(a, kt + (16 * ks + (lane & 15)) * KS + kh * (HD / 2) + 16 * s +
                               8 * (lane >> 4));
            mma_f16_16816(s4, a, qhi[s][0], qhi[s][1]);
            mma_f16_16816(s4, a, qlo[s][0], qlo[s][1]);
        }
        /* c0, c1: key 16 ks + gid, heads 2 tig, 2 tig + 1; c2, c3: key + 8. */
        float *sh = sc + kh * kMmaMaxGroup * kScoreStride + 16 * ks + gid;
        sh[(2 * tig) * kScoreStride] = s4[0];
        sh[(2 * tig + 1) * kScoreStride] = s4[1];
        sh[(2 * tig) * kScoreStride + 8] = s4[2];
        sh[(2 * tig + 1) * kScoreStride + 8] = s4[3];
        __syncthreads();

        /* Head gid's keys 16 j + 8 e + 2 tig + {0, 1}: the two halves'
         * sums (base 2); -inf past the range. */
        float p[2][4];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = 16 * j + 8 * e + 2 * tig;
                const float2 a = *reinterpret_cast<const float2 *>(sc + gid * kScoreStride + key);
                const float2 b = *reinterpret_cast<const float2 *>(
                    sc + (kMmaMaxGroup + gid) * kScoreStride + key);
                p[j][2 * e] = t0 + key < end ? a.x + b.x : -INFINITY;
                p[j][2 * e + 1] = t0 + key + 1 < end ? a.y + b.y : -INFINITY;
                mx = fmaxf(mx, fmaxf(p[j][2 * e], p[j][2 * e + 1]));
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx); /* finite: key t0 is in the range */
        const float corr = exp2_approx(m - m_new);
        float sum = 0.0f;
        uint32_t phi[2][2], plo[2][2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                p[j][i] = exp2_approx(p[j][i] - m_new);
                sum += p[j][i];
            }
            split_f16x2(p[j][0], p[j][1], phi[j][0], plo[j][0]);
            split_f16x2(p[j][2], p[j][3], phi[j][1], plo[j][1]);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l = fmaf(l, corr, sum);
        m = m_new;

        /* The accumulators of heads 2 tig and 2 tig + 1 (lanes 8 tig and
         * 8 tig + 4 hold those heads' factors), then this tile's P V. */
        const float ca = __shfl_sync(0xffffffffu, corr, 8 * tig);
        const float cb = __shfl_sync(0xffffffffu, corr, 8 * tig + 4);
#pragma unroll
        for (int mt = 0; mt < P::MT; mt++) {
            o[mt][0] *= ca;
            o[mt][1] *= cb;
            o[mt][2] *= ca;
            o[mt][3] *= cb;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                uint32_t a[4];
                ldmatrix_x4_trans(a, vt + (16 * j + (lane & 7) + 8 * (lane >> 4)) * KS +
                                         warp * (HD / 4) + 16 * mt + 8 * ((lane >> 3) & 1));
                mma_f16_16816(o[mt], a, phi[j][0], phi[j][1]);
                mma_f16_16816(o[mt], a, plo[j][0], plo[j][1]);
            }
        }
    }
    cp_async_wait<0>();
    /* o[mt][e]: dim 16 mt + gid (+ 8 for e >= 2) of this warp's quarter. */
    paged_write_result<HD, P::MT>(
        o, m, l, [&](int mt, int half) { return warp * (HD / 4) + 16 * mt + gid + 8 * half; },
        warp == 0, n_heads, group, row, kvh, out, ldo, part);
}

/* Block (row, head), thread d < HD: value d of the head's output from
 * the shares of the splits the row used (paged_combine). */
__global__ void paged_merge(int n_heads, int hd, int splits, const int32_t *__restrict__ row_pos,
                            const int32_t *__restrict__ rows, const float *__restrict__ part,
                            float *__restrict__ out, int64_t ldo)
{
    const int listed = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const int row = rows ? rows[listed] : listed;
    int span;
    const int used = paged_row_splits(row_pos[row], splits, &span);
    float v[1];
    paged_combine<1>(paged_share(part, listed, h, 0, n_heads, splits, hd), used, hd, d, v);
    out[(int64_t)row * ldo + (int64_t)h * hd + d] = v[0];
}

/* The kernel a launch of group q heads a kv head takes: an fp16 or e4m3
 * cache of groups up to 8 on the tensor cores, the rest on the FMA kernel
 * (all write the same outputs and shares). */
template <int HD, typename T> struct PagedPick {
    decltype(&attn_paged_kernel<HD, T>) fn;
    size_t smem;
    int threads;
};

template <int HD, typename T> PagedPick<HD, T> paged_pick(int group)
{
    if constexpr (std::is_same<T, __half>::value) {
        if (group <= kMmaMaxGroup)
            return {attn_paged_mma_kernel<HD>, PagedMma<HD>::kSmem, 32 * kMmaWarps};
    }
    if constexpr (std::is_same<T, __nv_fp8_e4m3>::value) {
        if (group <= kE4m3MaxGroup)
            return {attn_paged_e4m3_kernel<HD>, E4m3Tiles<HD>::kSmem, 32 * kE4m3Warps};
    }
    return {attn_paged_kernel<HD, T>, paged_smem_of<T, HD>(group), 32 * group};
}

template <int HD, typename T>
cudaError_t launch(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n_rows,
                   const int32_t *row_seq, const int32_t *row_pos, const int32_t *tables,
                   int max_blocks, int block_size, const void *k_cache, const void *v_cache,
                   int splits, const int32_t *rows, float *out, int64_t ldo,
                   float *part, bool merge, cudaStream_t stream)
{
    const PagedPick<HD, T> k = paged_pick<HD, T>(s->n_heads / s->n_kv_heads);
    {
        const cudaError_t rc = allow_dynamic_smem(k.fn, k.smem);
        if (rc != cudaSuccess)
            return rc;
    }
    const dim3 grid((unsigned)n_rows, (unsigned)s->n_kv_heads, (unsigned)splits);
    const float scale = (float)(1.0 / sqrt((double)HD));
    k.fn<<<grid, (unsigned)k.threads, k.smem, stream>>>(
        s->n_heads, s->n_kv_heads, q, ldq, row_seq, row_pos, tables, max_blocks, block_size,
        static_cast<const T *>(k_cache), static_cast<const T *>(v_cache), scale, rows, out, ldo,
        part);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess || splits == 1 || !merge)
        return rc;
    paged_merge<<<dim3((unsigned)n_rows, (unsigned)s->n_heads), (unsigned)HD, 0, stream>>>(
        s->n_heads, HD, splits, row_pos, rows, part, out, ldo);
    return cudaGetLastError();
}

/* f(HD, cache element) for head_dim 64 or 128 and cache type kv
 * (BN_CB_KV_*): f receives std::integral_constant<int, HD> and a T *. */
template <class F> cudaError_t for_shape(int head_dim, int kv, F &&f)
{
    return with_kv_element(kv, [&](auto *t) {
        if (head_dim == 128)
            return f(std::integral_constant<int, 128>{}, t);
        return f(std::integral_constant<int, 64>{}, t);
    });
}

/* Blocks of the kernel an SM holds at once. */
template <int HD, typename T> cudaError_t resident_per_sm(int group, int *per_sm)
{
    const PagedPick<HD, T> k = paged_pick<HD, T>(group);
    const cudaError_t rc = allow_dynamic_smem(k.fn, k.smem);
    if (rc != cudaSuccess)
        return rc;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, k.fn, k.threads, k.smem);
}

} // namespace

extern "C" int bn_cb_attn_paged_splits(int n_rows, int max_pos, int n_kv_heads, int resident,
                                       int kv)
{
    /* Rows whose blocks fill the device by themselves: one range each
     * (H200, 2B-4T heads, fp16 cache, 256 rows at position 528: a pass's
     * attention 3760 against 3990 us in five ranges; at 128 rows, 640
     * blocks of the 792 resident, fewer ranges were slower). */
    const int64_t row_blocks = (int64_t)n_rows * n_kv_heads;
    if (resident > 0 && row_blocks >= resident)
        return 1;
    /* About 128 positions a split, at most 64 splits, and no more shares
     * than the workspace holds. */
    int splits = (max_pos + 1 + 127) / 128;
    if (splits > 64)
        splits = 64;
    /* The e4m3 kernel's tile is quick enough that a range's fixed cost
     * (its first table and cache reads, its share and the merge) weighs:
     * its ranges are as long as keeps every block resident in one wave
     * (H200, 2B-4T heads, 577 positions: 64 rows in two ranges 17.6 us a
     * layer against 20.8 in five; dev/cuda/attn_paged_mma). */
    if (kv == BN_CB_KV_E4M3 && resident > 0 && row_blocks > 0 && splits > resident / row_blocks)
        splits = (int)(resident / row_blocks);
    while (splits > 1 && (int64_t)splits * n_rows > BN_CB_ATTN_PAGED_SHARES)
        splits--;
    return splits < 1 ? 1 : splits;
}

extern "C" int bn_cb_attn_paged_resident(const bn_cb_attn_shape *s, int kv, int sm_count)
{
    if (!s || s->n_kv_heads < 1 || s->n_heads % s->n_kv_heads != 0 || sm_count < 1 ||
        !bn_cb_attn_paged_supports(s->head_dim))
        return 0;
    const int group = s->n_heads / s->n_kv_heads;
    int per_sm = 0;
    const cudaError_t rc = for_shape(s->head_dim, kv, [&](auto hd, auto *t) {
        using T = std::remove_pointer_t<decltype(t)>;
        return resident_per_sm<decltype(hd)::value, T>(group, &per_sm);
    });
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return per_sm * sm_count;
}

extern "C" size_t bn_cb_attn_paged_workspace_bytes(int n_heads, int head_dim)
{
    return (size_t)BN_CB_ATTN_PAGED_SHARES * (size_t)n_heads * (size_t)(head_dim + 4) *
           sizeof(float);
}

static cudaError_t attn_paged(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                              int n_rows, const int32_t *row_seq, const int32_t *row_pos,
                              const int32_t *tables, int max_blocks, int block_size,
                              const void *k_cache, const void *v_cache, int kv, int splits,
                              const int32_t *rows, float *out, int64_t ldo, float *ws, bool merge,
                              cudaStream_t stream)
{
    /* Without the merge (shares only) there is no output. */
    if (!s || !q || !row_seq || !row_pos || !tables || !k_cache || !v_cache ||
        (merge && (!out || ldo % 4 != 0 || ldo < (int64_t)s->n_heads * s->head_dim)) ||
        n_rows < 0 || max_blocks < 1 || block_size < 1 || s->n_kv_heads < 1 ||
        s->n_heads % s->n_kv_heads != 0 || s->n_heads / s->n_kv_heads > 32 || ldq % 4 != 0 ||
        ldq < (int64_t)s->n_heads * s->head_dim || splits < 1 || splits > 64 ||
        (splits > 1 && (!ws || (int64_t)splits * n_rows > BN_CB_ATTN_PAGED_SHARES)))
        return cudaErrorInvalidValue;
    if (!bn_cb_attn_paged_supports(s->head_dim))
        return cudaErrorNotSupported;
    if (n_rows == 0)
        return cudaSuccess;
    return for_shape(s->head_dim, kv, [&](auto hd, auto *t) {
        using T = std::remove_pointer_t<decltype(t)>;
        return launch<decltype(hd)::value, T>(s, q, ldq, n_rows, row_seq, row_pos, tables,
                                              max_blocks, block_size, k_cache, v_cache, splits,
                                              rows, out, ldo, ws, merge, stream);
    });
}

extern "C" cudaError_t bn_cb_attn_paged(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                        int n_rows, const int32_t *row_seq,
                                        const int32_t *row_pos, const int32_t *tables,
                                        int max_blocks, int block_size, const void *k_cache,
                                        const void *v_cache, int kv, int splits,
                                        const int32_t *rows, float *out, int64_t ldo, float *ws,
                                        cudaStream_t stream)
{
    return attn_paged(s, q, ldq, n_rows, row_seq, row_pos, tables, max_blocks, block_size,
                      k_cache, v_cache, kv, splits, rows, out, ldo, ws, true, stream);
}

extern "C" cudaError_t bn_cb_attn_paged_shares(const bn_cb_attn_shape *s, const float *q,
                                               int64_t ldq, int n_rows, const int32_t *row_seq,
                                               const int32_t *row_pos, const int32_t *tables,
                                               int max_blocks, int block_size,
                                               const void *k_cache, const void *v_cache,
                                               int kv, int splits, float *ws,
                                               cudaStream_t stream)
{
    if (splits < 2)
        return cudaErrorInvalidValue; /* one split writes the output itself */
    return attn_paged(s, q, ldq, n_rows, row_seq, row_pos, tables, max_blocks, block_size,
                      k_cache, v_cache, kv, splits, NULL, NULL, 0, ws, false, stream);
}

extern "C" int bn_cb_attn_paged_supports(int head_dim)
{
    return head_dim == 64 || head_dim == 128;
}
