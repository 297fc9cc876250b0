/*
 * attn_prefill_tiled.cu - causal prefill attention over an fp32, fp16 or
 * e4m3 KV cache, register-tiled on the CUDA cores (head_dim 64 and 128).
 *
 * The warp-per-row kernel in attn_prefill.cu reads a shared-memory
 * value for every one or two multiply-adds, and a 512-token prefill of the
 * 2B-4T shape spent about half its time there. This kernel is laid out
 * like a small SGEMM instead: a block takes 64 query rows of one head and
 * walks the cache in tiles of 64 positions; each of its 256 threads
 * (16 x 16: ty, tx) owns
 *
 *   - a 4 x 4 block of the tile's scores: rows 4 ty .. 4 ty + 3 against
 *     positions tx, tx + 16, tx + 32, tx + 48, i.e. 16 multiply-adds per
 *     pair of 16-byte shared loads (one q chunk, one k chunk per row and
 *     position, over head_dim / 4 chunks);
 *   - the same 4 rows of the output, head_dim / 16 columns of each, i.e.
 *     4 x (head_dim / 16) multiply-adds per position of p . V.
 *
 * A row's 64 scores of a tile live in the 16 threads of one half-warp, so
 * its maximum is four shuffles, and its probabilities go to the half-warp's
 * own slots of shared memory (no block barrier between writing and reading
 * them). The softmax is online, as in the other kernels: per tile the new
 * maximum, the old sums rescaled by exp(m_old - m_new); each thread keeps
 * its own share of a row's sum, added across the half-warp at the end.
 *
 * The cache tiles arrive by cp.async into one k and one v buffer: the next
 * tile's k while this tile's softmax and p . V run, the next v while the
 * next scores run. Positions past the block's last visible one are
 * zero-filled (their weight is 0 and 0 * v must not be NaN).
 *
 * Shared memory (floats): q 64 x hd, k 64 x hd, v 64 x hd, p 64 x 64 (112
 * KiB for head_dim 128: two blocks an SM). Bank conflicts are avoided by
 * XOR swizzles on 16-byte chunks, not padding (padding would not leave room
 * for two blocks): k chunk c of position t at c ^ (t & 7), the
 * probabilities of rows 4 ty .. 4 ty + 3 at position t in slot ty ^ (t & 7).
 *
 * An fp16 cache's tiles stay fp16 in shared memory (k and v half the
 * bytes: 80 KiB for head_dim 128) and a chunk of 4 values is widened when
 * it is read; the swizzle moves 16-byte pairs of chunks (pair c / 2 of
 * position t at (c / 2) ^ (t & 7)), so that each pair arrives by one copy.
 * An e4m3 cache's tiles stay bytes the same way (16-byte pieces of four
 * chunks, piece p of position t at p ^ (t & 7), or & 3 for head_dim 64's
 * four pieces). The batched passes take their prompt chunks through this
 * kernel for every cache (bn_cb_attn_prefill_runs).
 *
 * Parts: a launch may split each row block's positions into up to
 * BN_CB_PREFILL_MAX_PARTS even ranges of tiles, one block each; a part
 * leaves its unnormalized output, maximum and sum in a workspace and a
 * second kernel merges them (out = sum_p e^(m_p - M) o_p / sum_p e^(m_p - M)
 * l_p), so that the last row blocks of a first chunk, which see every
 * position, no longer set the time alone. Measured faster (H100, 2B-4T
 * heads: a first 512-token chunk 70-72 us a layer in 2 or 4 parts against
 * 94 in one; 512 tokens after 1536 positions 333 against 490; 32 tokens
 * after 1000 positions 50 in 8 parts against 164);
 * bn_cb_attn_prefill_parts picks the count for a chunk.
 *
 * Results are fp32 throughout: the dot products add in the same order as
 * the warp-per-row kernel's; the online softmax's tiles are 64 positions
 * instead of 32, so outputs differ from it in the last bits only.
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "cp_async.cuh"
#include "e4m3.cuh"
#include "cuda_backend_kernels.h"
#include "kv_store.cuh"
#include "smem_opt_in.cuh"

namespace {

constexpr int kRows = 64;     /* query rows a block               */
constexpr int kKeys = 64;     /* cache positions a tile           */
constexpr int kThreads = 256; /* 16 x 16                          */
constexpr int kSlots = kRows / 4; /* float4 slots of a probability row */
constexpr unsigned kFull = 0xffffffffu;

/* KV: the cache's element, float, __half or __nv_fp8_e4m3. */
template <int HD, typename KV> struct Tiled {
    static constexpr int kChunks = HD / 4; /* 4-value chunks per row */
    static constexpr int kOut = kChunks / 16; /* output float4 per thread per row */
    static constexpr int kPieces = HD * (int)sizeof(KV) / 16; /* 16-byte copies per k / v row */
    /* The swizzle of a row's pieces: p ^ (t & kSwz). */
    static constexpr int kSwz = kPieces < 8 ? kPieces - 1 : 7;
    static constexpr size_t kSmem = sizeof(float) * ((size_t)kRows * HD + (size_t)kKeys * kRows) +
                                    2 * sizeof(KV) * (size_t)kKeys * HD + kRows * sizeof(int);
};

/* Chunk c (4 values) of row r of a k or v tile, as floats; swz: the row's
 * swizzle (0: none), of 16-byte chunks for fp32, of 16-byte pairs of
 * chunks for fp16 (load_tile). */
template <int HD>
__device__ __forceinline__ float4 tile_chunk(const float *tile, int r, int c, int swz)
{
    return reinterpret_cast<const float4 *>(tile)[r * (HD / 4) + (c ^ swz)];
}

template <int HD>
__device__ __forceinline__ float4 tile_chunk(const __half *tile, int r, int c, int swz)
{
    const uint2 u = reinterpret_cast<const uint2 *>(
        tile)[r * (HD / 4) + ((((c >> 1) ^ swz) << 1) | (c & 1))];
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

template <int HD>
__device__ __forceinline__ float4 tile_chunk(const __nv_fp8_e4m3 *tile, int r, int c, int swz)
{
    constexpr int kSwz = Tiled<HD, __nv_fp8_e4m3>::kSwz;
    return e4m3x4_to_float4(reinterpret_cast<const uint32_t *>(
        tile)[r * (HD / 4) + ((((c >> 2) ^ (swz & kSwz)) << 2) | (c & 3))]);
}

/* One 16-byte chunk into shared memory (zero-filled when !ok). */
__device__ __forceinline__ void copy16(float4 *dst, const float4 *src, bool ok)
{
    cp_async16((uint32_t)__cvta_generic_to_shared(dst), src, ok);
}

/* Where position t of the rows' sequence lives in the cache: row t of a
 * contiguous cache (table NULL), or row table[t / bs] * bs + t % bs of a
 * paged one. */
struct Paged {
    const int32_t *table;
    int bs;
    /* Several sequences' runs in one launch (bn_cb_attn_prefill_runs): the
     * row blocks, each (first row, rows, sequence), heaviest first, and the
     * sequences' tables, max_blocks entries each; NULL: one run, table. */
    const int4 *blocks;
    const int32_t *tables;
    int max_blocks;
};

__device__ __forceinline__ int64_t cache_row(const Paged &pg, int t)
{
    return pg.table ? (int64_t)pg.table[t / pg.bs] * pg.bs + t % pg.bs : (int64_t)t;
}

/* Copies cache positions [t0, t0 + 64) of one head into buf (16-byte
 * piece p of position t at slot p ^ (t & kSwz) when swizzled), zero past
 * last. */
template <int HD, bool kSwizzle, typename KV>
__device__ __forceinline__ void load_tile(KV *buf, const KV *cache, int64_t kv_dim,
                                          int64_t head_off, int t0, int last, const Paged &pg)
{
    constexpr int P = Tiled<HD, KV>::kPieces;
    float4 *dst = reinterpret_cast<float4 *>(buf);
    for (int i = threadIdx.x; i < kKeys * P; i += kThreads) {
        const int r = i / P, p = i % P;
        const int t = t0 + r;
        const bool ok = t <= last;
        const float4 *src =
            reinterpret_cast<const float4 *>(cache + (ok ? cache_row(pg, t) : 0) * kv_dim +
                                             head_off) +
            p;
        copy16(dst + r * P + (kSwizzle ? p ^ (r & Tiled<HD, KV>::kSwz) : p), src, ok);
    }
}

/* Where the parts of a row block's positions leave their partial results
 * when there is more than one: part p of row r (of n), head h at slot
 * (p * n + r) * n_heads + h, head_dim floats of output in o and (maximum,
 * sum) in ml. */
struct Split {
    int parts;
    float *o;
    float2 *ml;
};

/* Combines the parts: a warp per (row, head), a lane per 16-byte chunk of
 * the output. out = sum_p e^(m_p - M) o_p / sum_p e^(m_p - M) l_p. */
__global__ void __launch_bounds__(256)
    attn_prefill_merge_kernel(bn_cb_attn_shape s, int n, const int32_t *__restrict__ pos,
                              Split split, float *__restrict__ out, int64_t ldo,
                              const int4 *__restrict__ blocks, int n_blocks)
{
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    int row = (int)(warp / s.n_heads);
    const int h = (int)(warp % s.n_heads);
    if (blocks) { /* runs: warps for every row of each row block */
        if (row >= n_blocks * kRows)
            return;
        const int4 e = blocks[row / kRows];
        if (row % kRows >= e.y)
            return;
        row = e.x + row % kRows;
    } else if (warp >= (int64_t)n * s.n_heads) {
        return;
    }
    const int p = pos[row];
    if (p < 0 || (int64_t)p >= s.capacity)
        return; /* not written, as by the one-part kernel */
    const int chunks = s.head_dim / 4;
    float mx = -INFINITY;
    for (int q = 0; q < split.parts; q++)
        mx = fmaxf(mx, split.ml[((int64_t)q * n + row) * s.n_heads + h].x);
    for (int c = lane; c < chunks; c += 32) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        float total = 0.0f;
        for (int q = 0; q < split.parts; q++) {
            const int64_t slot = ((int64_t)q * n + row) * s.n_heads + h;
            const float2 ml = split.ml[slot];
            if (ml.x == -INFINITY)
                continue; /* no visible position in this part */
            const float w = expf(ml.x - mx);
            const float4 o = reinterpret_cast<const float4 *>(split.o + slot * s.head_dim)[c];
            acc.x = fmaf(w, o.x, acc.x);
            acc.y = fmaf(w, o.y, acc.y);
            acc.z = fmaf(w, o.z, acc.z);
            acc.w = fmaf(w, o.w, acc.w);
            total = fmaf(w, ml.y, total);
        }
        const float inv = 1.0f / total;
        reinterpret_cast<float4 *>(out + (int64_t)row * ldo + (int64_t)h * s.head_dim)[c] =
            make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    }
}

template <int HD, typename KV>
__global__ void __launch_bounds__(kThreads, 2)
    attn_prefill_tiled_kernel(bn_cb_attn_shape s, const float *__restrict__ q, int64_t ldq, int n,
                              const int32_t *__restrict__ pos, const KV *__restrict__ kc,
                              const KV *__restrict__ vc, float scale, float *__restrict__ out,
                              int64_t ldo, Split split, Paged pg)
{
    using T = Tiled<HD, KV>;
    constexpr int C = T::kChunks, NO = T::kOut;
    extern __shared__ __align__(16) float4 smem4[];
    float4 *qs = smem4;                                  /* [64][C]                  */
    KV *ks = reinterpret_cast<KV *>(qs + kRows * C);     /* [64][HD], swizzled       */
    KV *vs = ks + kKeys * HD;                            /* [64][HD]                 */
    float4 *ps = reinterpret_cast<float4 *>(vs + kKeys * HD); /* [64 positions][16 slots] */
    int *qpos = reinterpret_cast<int *>(ps + kKeys * kSlots);

    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    /* Blocks in order of decreasing work: all heads' and parts' last row
     * block (the most tiles), then the one before, ... The scheduler hands
     * out blocks in this order, so the longest ones start first on SMs of
     * their own and the short ones fill in. */
    const unsigned per_row_block = (unsigned)s.n_heads * (unsigned)split.parts;
    const int h = (int)(blockIdx.x % per_row_block) / split.parts;
    const int part = (int)(blockIdx.x % per_row_block) % split.parts;
    const int row_blocks = (n + kRows - 1) / kRows;
    int row0 = (row_blocks - 1 - (int)(blockIdx.x / per_row_block)) * kRows, row_end = n;
    if (pg.blocks) { /* a run's row block: its rows and its sequence's table */
        const int4 e = pg.blocks[blockIdx.x / per_row_block];
        row0 = e.x;
        row_end = e.x + e.y;
        pg.table = pg.tables + (int64_t)e.z * pg.max_blocks;
    }
    const int group = s.n_heads / s.n_kv_heads;
    const int64_t kv_dim = (int64_t)s.n_kv_heads * HD;
    const int64_t head_off = (int64_t)(h / group) * HD;

    if (tid < kRows) {
        const int r = row0 + tid;
        int p = r < row_end ? pos[r] : -1;
        if (p < 0 || (int64_t)p >= s.capacity)
            p = -1; /* nothing there to attend to: the row is not written */
        qpos[tid] = p;
    }
    for (int i = tid; i < kRows * C; i += kThreads) {
        const int r = i / C, c = i % C;
        const bool ok = row0 + r < row_end;
        const float *row = q + (int64_t)(ok ? row0 + r : 0) * ldq + (int64_t)h * HD;
        copy16(qs + i, reinterpret_cast<const float4 *>(row) + c, ok);
    }
    __syncthreads();
    int max_pos = -1;
    for (int r = 0; r < kRows; r++)
        max_pos = max(max_pos, qpos[r]);
    int my_pos[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        my_pos[i] = qpos[4 * ty + i];
    /* This part's tiles: an even share of the row block's. */
    const int tiles = max_pos < 0 ? 0 : max_pos / kKeys + 1;
    const int t_begin = (int)((int64_t)tiles * part / split.parts) * kKeys;
    const int t_end = (int)((int64_t)tiles * (part + 1) / split.parts) * kKeys;

    load_tile<HD, true, KV>(ks, kc, kv_dim, head_off, t_begin, max_pos, pg);
    cp_async_commit(); /* q and the first k */
    load_tile<HD, false, KV>(vs, vc, kv_dim, head_off, t_begin, max_pos, pg);
    cp_async_commit();

    float m[4], l[4];
    float4 acc[4][NO];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int o = 0; o < NO; o++)
            acc[i][o] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    for (int t0 = t_begin; t0 < t_end; t0 += kKeys) {
        const bool more = t0 + kKeys < t_end;
        cp_async_wait<1>(); /* this tile's k (and q) */
        __syncthreads();

        /* Scores of rows 4 ty + i against positions t0 + tx + 16 j. */
        float sc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                sc[i][j] = 0.0f;
        const int swz = tx & 7; /* (tx + 16 j) & 7 */
#pragma unroll 4
        for (int c = 0; c < C; c++) {
            float4 qa[4], kb[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                qa[i] = qs[(4 * ty + i) * C + c];
#pragma unroll
            for (int j = 0; j < 4; j++)
                kb[j] = tile_chunk<HD>(ks, tx + 16 * j, c, swz);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float d = sc[i][j];
                    d = fmaf(qa[i].x, kb[j].x, d);
                    d = fmaf(qa[i].y, kb[j].y, d);
                    d = fmaf(qa[i].z, kb[j].z, d);
                    d = fmaf(qa[i].w, kb[j].w, d);
                    sc[i][j] = d;
                }
        }
        __syncthreads(); /* every thread is done with this k tile */
        if (more)
            load_tile<HD, true, KV>(ks, kc, kv_dim, head_off, t0 + kKeys, max_pos, pg);
        cp_async_commit();

        /* Online softmax, a row's 64 scores over its half-warp. */
        float p[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float tile_max = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const bool visible = t0 + tx + 16 * j <= my_pos[i];
                sc[i][j] = visible ? sc[i][j] * scale : -INFINITY;
                tile_max = fmaxf(tile_max, sc[i][j]);
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1)
                tile_max = fmaxf(tile_max, __shfl_xor_sync(kFull, tile_max, o));
            const float m_new = fmaxf(m[i], tile_max);
            const float corr = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                p[i][j] = sc[i][j] == -INFINITY ? 0.0f : expf(sc[i][j] - m_new);
                sum += p[i][j];
            }
            l[i] = fmaf(l[i], corr, sum);
            m[i] = m_new;
#pragma unroll
            for (int o = 0; o < NO; o++) {
                acc[i][o].x *= corr;
                acc[i][o].y *= corr;
                acc[i][o].z *= corr;
                acc[i][o].w *= corr;
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            ps[(tx + 16 * j) * kSlots + (ty ^ swz)] = make_float4(p[0][j], p[1][j], p[2][j], p[3][j]);

        cp_async_wait<1>(); /* this tile's v */
        __syncthreads();     /* v and every half-warp's probabilities visible */

        const int keys = min(kKeys, max_pos - t0 + 1);
        for (int t = 0; t < keys; t++) {
            const float4 pt = ps[t * kSlots + (ty ^ (t & 7))];
#pragma unroll
            for (int o = 0; o < NO; o++) {
                const float4 v = tile_chunk<HD>(vs, t, tx + 16 * o, 0);
                acc[0][o].x = fmaf(pt.x, v.x, acc[0][o].x);
                acc[0][o].y = fmaf(pt.x, v.y, acc[0][o].y);
                acc[0][o].z = fmaf(pt.x, v.z, acc[0][o].z);
                acc[0][o].w = fmaf(pt.x, v.w, acc[0][o].w);
                acc[1][o].x = fmaf(pt.y, v.x, acc[1][o].x);
                acc[1][o].y = fmaf(pt.y, v.y, acc[1][o].y);
                acc[1][o].z = fmaf(pt.y, v.z, acc[1][o].z);
                acc[1][o].w = fmaf(pt.y, v.w, acc[1][o].w);
                acc[2][o].x = fmaf(pt.z, v.x, acc[2][o].x);
                acc[2][o].y = fmaf(pt.z, v.y, acc[2][o].y);
                acc[2][o].z = fmaf(pt.z, v.z, acc[2][o].z);
                acc[2][o].w = fmaf(pt.z, v.w, acc[2][o].w);
                acc[3][o].x = fmaf(pt.w, v.x, acc[3][o].x);
                acc[3][o].y = fmaf(pt.w, v.y, acc[3][o].y);
                acc[3][o].z = fmaf(pt.w, v.z, acc[3][o].z);
                acc[3][o].w = fmaf(pt.w, v.w, acc[3][o].w);
            }
        }
        __syncthreads(); /* every thread is done with this v tile and p */
        if (more)
            load_tile<HD, false, KV>(vs, vc, kv_dim, head_off, t0 + kKeys, max_pos, pg);
        cp_async_commit();
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < 4; i++) {
        float sum = l[i];
#pragma unroll
        for (int o = 8; o > 0; o >>= 1)
            sum += __shfl_xor_sync(kFull, sum, o);
        if (my_pos[i] < 0)
            continue;
        const int64_t row = row0 + 4 * ty + i;
        if (split.parts > 1) {
            /* A part's unnormalized output, its maximum and sum; the merge
             * weighs the parts (a part with no visible position has
             * maximum -inf and is skipped there). */
            const int64_t slot = ((int64_t)part * n + row) * s.n_heads + h;
            float4 *dst = reinterpret_cast<float4 *>(split.o + slot * HD);
#pragma unroll
            for (int o = 0; o < NO; o++)
                dst[tx + 16 * o] = acc[i][o];
            if (tx == 0)
                split.ml[slot] = make_float2(m[i], sum);
            continue;
        }
        const float inv = 1.0f / sum;
        float4 *dst = reinterpret_cast<float4 *>(out + row * ldo + (int64_t)h * HD);
#pragma unroll
        for (int o = 0; o < NO; o++)
            dst[tx + 16 * o] = make_float4(acc[i][o].x * inv, acc[i][o].y * inv,
                                           acc[i][o].z * inv, acc[i][o].w * inv);
    }
}

template <int HD, typename KV>
cudaError_t launch_tiled(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n,
                         const int32_t *pos, const void *k_cache, const void *v_cache,
                         float scale, float *out, int64_t ldo, const Split &split,
                         const Paged &pg, int n_row_blocks, cudaStream_t stream)
{
    auto kernel = attn_prefill_tiled_kernel<HD, KV>;
    const cudaError_t rc = allow_dynamic_smem(kernel, Tiled<HD, KV>::kSmem);
    if (rc != cudaSuccess)
        return rc;
    const int64_t row_blocks = pg.blocks ? n_row_blocks : (n + kRows - 1) / kRows;
    const int64_t blocks = row_blocks * s->n_heads * split.parts;
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidConfiguration;
    kernel<<<(unsigned)blocks, kThreads, Tiled<HD, KV>::kSmem, stream>>>(
        *s, q, ldq, n, pos, static_cast<const KV *>(k_cache), static_cast<const KV *>(v_cache),
        scale, out, ldo, split, pg);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || split.parts == 1)
        return err;
    const int64_t threads = (pg.blocks ? row_blocks * kRows : (int64_t)n) * s->n_heads * 32;
    attn_prefill_merge_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, stream>>>(
        *s, n, pos, split, out, ldo, pg.blocks, (int)row_blocks);
    return cudaGetLastError();
}

bool aligned16(const void *p)
{
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

} // namespace

extern "C" int bn_cb_attn_prefill_tiled_supports(const bn_cb_attn_shape *s, const float *q,
                                                 int64_t ldq, const void *k_cache,
                                                 const void *v_cache, const float *out,
                                                 int64_t ldo)
{
    return (s->head_dim == 64 || s->head_dim == 128) && aligned16(q) && aligned16(k_cache) &&
           aligned16(v_cache) && aligned16(out) && ldq % 4 == 0 && ldo % 4 == 0;
}

/* Bytes of a part's slots for n rows: outputs, then (maximum, sum). */
static size_t part_bytes(const bn_cb_attn_shape *s, int n)
{
    return (size_t)n * (size_t)s->n_heads * ((size_t)s->head_dim * sizeof(float) + sizeof(float2));
}

extern "C" size_t bn_cb_attn_prefill_workspace_bytes(const bn_cb_attn_shape *s, int n, int parts)
{
    return parts > 1 && n > 0 ? (size_t)parts * part_bytes(s, n) : 0;
}

/* Parts: as many as halve the longest row block's scan (the last one's,
 * which sees `visible` positions) while each part keeps at least one tile,
 * the grid stays within four waves of two blocks an SM and the workspace
 * holds them. Measured on an H100 (2B-4T heads, us a layer in 1/2/4/8
 * parts): a first 512-token chunk 94/70/72/91 (8 parts is 1280 blocks of
 * one tile each: over the cap, 4 taken), 512 tokens after 1536 positions
 * 491/375/333/348 (4 taken), 32 tokens after 1000 positions 164/91/53/50
 * (8 taken). */
extern "C" int bn_cb_attn_prefill_parts(const bn_cb_attn_shape *s, int n, int64_t visible,
                                        int sm_count, size_t ws_bytes)
{
    if (!s || n <= 0 || visible <= 0 || sm_count <= 0 || s->n_heads <= 0 ||
        (s->head_dim != 64 && s->head_dim != 128))
        return 1;
    const int64_t tiles = (visible + kKeys - 1) / kKeys;
    const int64_t row_blocks = (n + kRows - 1) / kRows;
    const int64_t max_blocks = 4 * 2 * (int64_t)sm_count;
    int parts = 1;
    while (2 * parts <= BN_CB_PREFILL_MAX_PARTS && 2 * parts <= tiles &&
           row_blocks * s->n_heads * 2 * parts <= max_blocks &&
           bn_cb_attn_prefill_workspace_bytes(s, n, 2 * parts) <= ws_bytes)
        parts *= 2;
    return parts;
}

static cudaError_t prefill_tiled(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n,
                                 const int32_t *pos, const Paged &pg, int n_row_blocks,
                                 const void *k_cache, const void *v_cache, int kv,
                                 float scale, float *out, int64_t ldo, int parts, void *ws,
                                 size_t ws_bytes, cudaStream_t stream)
{
    if (!bn_cb_attn_prefill_tiled_supports(s, q, ldq, k_cache, v_cache, out, ldo))
        return cudaErrorNotSupported;
    if (parts < 1 || parts > BN_CB_PREFILL_MAX_PARTS ||
        (parts > 1 && (!ws || !aligned16(ws) ||
                       ws_bytes < bn_cb_attn_prefill_workspace_bytes(s, n, parts))))
        return cudaErrorInvalidValue;
    if (n <= 0)
        return cudaSuccess;
    Split split = {parts, NULL, NULL};
    if (parts > 1) {
        split.o = static_cast<float *>(ws);
        split.ml = reinterpret_cast<float2 *>(static_cast<char *>(ws) +
                                              (size_t)parts * n * s->n_heads * s->head_dim *
                                                  sizeof(float));
    }
    return with_kv_element(kv, [&](auto *t) {
        using KV = std::remove_pointer_t<decltype(t)>;
        if (s->head_dim == 64)
            return launch_tiled<64, KV>(s, q, ldq, n, pos, k_cache, v_cache, scale, out, ldo,
                                        split, pg, n_row_blocks, stream);
        return launch_tiled<128, KV>(s, q, ldq, n, pos, k_cache, v_cache, scale, out, ldo, split,
                                     pg, n_row_blocks, stream);
    });
}

extern "C" cudaError_t bn_cb_attn_prefill_tiled(const bn_cb_attn_shape *s, const float *q,
                                                int64_t ldq, int n, const int32_t *pos,
                                                const float *k_cache, const float *v_cache,
                                                float scale, float *out, int64_t ldo, int parts,
                                                void *ws, size_t ws_bytes, cudaStream_t stream)
{
    const Paged contiguous = {NULL, 1, NULL, NULL, 0};
    return prefill_tiled(s, q, ldq, n, pos, contiguous, 0, k_cache, v_cache, 0, scale, out, ldo,
                         parts, ws, ws_bytes, stream);
}

extern "C" cudaError_t bn_cb_attn_prefill_runs(const bn_cb_attn_shape *s, const float *q,
                                              int64_t ldq, int n, const int32_t *pos,
                                              const int32_t *row_blocks, int n_row_blocks,
                                              const int32_t *tables, int max_blocks,
                                              int block_size, const void *k_cache,
                                              const void *v_cache, int kv, float *out,
                                              int64_t ldo, int parts, void *ws, size_t ws_bytes,
                                              cudaStream_t stream)
{
    if (!row_blocks || n_row_blocks < 1 || !tables || max_blocks < 1 || block_size < 1 ||
        (reinterpret_cast<uintptr_t>(row_blocks) & 15) != 0)
        return cudaErrorInvalidValue;
    const Paged pg = {NULL, block_size, reinterpret_cast<const int4 *>(row_blocks), tables,
                      max_blocks};
    return prefill_tiled(s, q, ldq, n, pos, pg, n_row_blocks, k_cache, v_cache, kv,
                         (float)(1.0 / sqrt((double)s->head_dim)), out, ldo, parts, ws, ws_bytes,
                         stream);
}
