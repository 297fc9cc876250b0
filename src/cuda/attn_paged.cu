/*
 * attn_paged.cu - decode and prefill attention for rows of many sequences
 * over the paged KV cache (bn_cb_attn_paged in cuda_backend_kernels.h),
 * the batched pass's attention (cuda_backend_rows.c).
 *
 * Row r is one token of sequence row_seq[r] at position row_pos[r]; its
 * keys and values for positions 0..row_pos[r] live in cache rows
 * tables[seq * max_blocks + t / block_size] * block_size + t % block_size.
 *
 * One block per (row, kv head, split): its warps are the q heads that
 * share the kv head (GQA), so each cache row is read once for all of them;
 * the positions are split into `splits` ranges of whole 32-position tiles,
 * so that a pass of few rows still has blocks enough to keep the memory
 * busy. The block gathers tiles through the table into shared memory (fp16
 * caches widened to fp32 on the way); each warp scores the tile's keys
 * (lane j: key j), keeps an online softmax and accumulates p . V (lane l:
 * the head's float4 chunk l). With one split the block writes the head's
 * output; with more, each writes its unnormalised sum with its max and
 * weight, and paged_merge combines a row's splits in split order.
 *
 * A row takes only the splits its own length needs (row_splits: about 128
 * positions each, at most the launch's), so a launch sized for the whole
 * context (a captured pass, which cannot know the lengths) costs little
 * more than one sized for the rows: the other blocks return at once, and
 * the merge reads only the shares written.
 * dev/cuda/attn_paged.cu holds the one-split kernel with its timing.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cp_async.cuh"
#include "cuda_backend_kernels.h"
#include "smem_opt_in.cuh"

namespace {

constexpr int kTile = 32;

/* A tile's rows in shared memory: fp32 as stored, or fp16 as stored,
 * padded by 16 bytes a row so that lanes reading different rows at the
 * same column fall in different banks. */
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

/* The splits row position pos uses out of the launch's, and the whole
 * tiles of positions each covers: at most 128 positions a split, so a
 * short row is not spread thinly over many blocks. */
__device__ __forceinline__ int row_splits(int pos, int splits, int *span)
{
    const int len = pos + 1;
    const int used = min(splits, (len + 127) / 128);
    *span = ((len + used - 1) / used + kTile - 1) / kTile * kTile;
    return used;
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
    const int row = rows ? rows[listed] : listed;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = kvh * group + warp;
    const int64_t kv_dim = (int64_t)n_kv * HD, head_off = (int64_t)kvh * HD;
    const int seq = row_seq[row], pos = row_pos[row];
    int span;
    if (split >= row_splits(pos, (int)gridDim.z, &span))
        return; /* a split this row does not need: paged_merge skips it */
    const int32_t *table = tables + (int64_t)seq * max_blocks;
    const int begin = split * span, end = min(begin + span, pos + 1); /* [begin, end) */

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

/* Block (row, head), thread d < HD: the shares of value d of the splits
 * the row used combined in split order,
 * out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s. */
__global__ void paged_merge(int n_heads, int hd, int splits, const int32_t *__restrict__ row_pos,
                            const int32_t *__restrict__ rows, const float *__restrict__ part,
                            float *__restrict__ out, int64_t ldo)
{
    const int listed = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const int row = rows ? rows[listed] : listed;
    int span;
    const int used = row_splits(row_pos[row], splits, &span);
    const float *pr = part + ((int64_t)listed * n_heads + h) * splits * (hd + 4);
    float M = -INFINITY;
    for (int s = 0; s < used; s++)
        M = fmaxf(M, pr[s * (hd + 4) + hd]);
    float sum = 0.0f, weight = 0.0f;
    for (int s = 0; s < used; s++) {
        const float *ps = pr + s * (hd + 4);
        const float w = ps[hd + 1] > 0.0f ? expf(ps[hd] - M) : 0.0f;
        sum = fmaf(w, ps[d], sum);
        weight = fmaf(w, ps[hd + 1], weight);
    }
    out[(int64_t)row * ldo + (int64_t)h * hd + d] = sum / weight;
}

template <int HD, typename T>
cudaError_t launch(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n_rows,
                   const int32_t *row_seq, const int32_t *row_pos, const int32_t *tables,
                   int max_blocks, int block_size, const void *k_cache, const void *v_cache,
                   int splits, const int32_t *rows, float *out, int64_t ldo,
                   float *part, cudaStream_t stream)
{
    const size_t smem = paged_smem_of<T, HD>(s->n_heads / s->n_kv_heads);
    {
        const cudaError_t rc = allow_dynamic_smem(attn_paged_kernel<HD, T>, smem);
        if (rc != cudaSuccess)
            return rc;
    }
    const dim3 grid((unsigned)n_rows, (unsigned)s->n_kv_heads, (unsigned)splits);
    const dim3 block(32u * (unsigned)(s->n_heads / s->n_kv_heads));
    const float scale = (float)(1.0 / sqrt((double)HD));
    attn_paged_kernel<HD, T><<<grid, block, smem, stream>>>(
        s->n_heads, s->n_kv_heads, q, ldq, row_seq, row_pos, tables, max_blocks, block_size,
        static_cast<const T *>(k_cache), static_cast<const T *>(v_cache), scale, rows, out, ldo,
        part);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess || splits == 1)
        return rc;
    paged_merge<<<dim3((unsigned)n_rows, (unsigned)s->n_heads), (unsigned)HD, 0, stream>>>(
        s->n_heads, HD, splits, row_pos, rows, part, out, ldo);
    return cudaGetLastError();
}

/* Blocks of the kernel an SM holds at once. */
template <int HD, typename T> cudaError_t resident_per_sm(int group, int *per_sm)
{
    const size_t smem = paged_smem_of<T, HD>(group);
    const cudaError_t rc = allow_dynamic_smem(attn_paged_kernel<HD, T>, smem);
    if (rc != cudaSuccess)
        return rc;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, attn_paged_kernel<HD, T>,
                                                         32 * group, smem);
}

} // namespace

extern "C" int bn_cb_attn_paged_splits(int n_rows, int max_pos, int n_kv_heads, int resident)
{
    /* Rows whose blocks fill the device by themselves: one range each
     * (H200, 2B-4T heads, fp16 cache, 256 rows at position 528: a pass's
     * attention 3760 against 3990 us in five ranges; at 128 rows, 640
     * blocks of the 792 resident, fewer ranges were slower). */
    if (resident > 0 && (int64_t)n_rows * n_kv_heads >= resident)
        return 1;
    /* About 128 positions a split, at most 64 splits, and no more shares
     * than the workspace holds. */
    int splits = (max_pos + 1 + 127) / 128;
    if (splits > 64)
        splits = 64;
    while (splits > 1 && (int64_t)splits * n_rows > BN_CB_ATTN_PAGED_SHARES)
        splits--;
    return splits < 1 ? 1 : splits;
}

extern "C" int bn_cb_attn_paged_resident(const bn_cb_attn_shape *s, int kv_f16, int sm_count)
{
    if (!s || s->n_kv_heads < 1 || s->n_heads % s->n_kv_heads != 0 || sm_count < 1 ||
        !bn_cb_attn_paged_supports(s->head_dim))
        return 0;
    const int group = s->n_heads / s->n_kv_heads;
    int per_sm = 0;
    cudaError_t rc;
    if (s->head_dim == 128)
        rc = kv_f16 ? resident_per_sm<128, __half>(group, &per_sm)
                    : resident_per_sm<128, float>(group, &per_sm);
    else
        rc = kv_f16 ? resident_per_sm<64, __half>(group, &per_sm)
                    : resident_per_sm<64, float>(group, &per_sm);
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

extern "C" cudaError_t bn_cb_attn_paged(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                        int n_rows, const int32_t *row_seq,
                                        const int32_t *row_pos, const int32_t *tables,
                                        int max_blocks, int block_size, const void *k_cache,
                                        const void *v_cache, int kv_f16, int splits,
                                        const int32_t *rows, float *out, int64_t ldo, float *ws,
                                        cudaStream_t stream)
{
    if (!s || !q || !row_seq || !row_pos || !tables || !k_cache || !v_cache || !out ||
        n_rows < 0 || max_blocks < 1 || block_size < 1 || s->n_kv_heads < 1 ||
        s->n_heads % s->n_kv_heads != 0 || s->n_heads / s->n_kv_heads > 32 || ldq % 4 != 0 ||
        ldo % 4 != 0 || ldq < (int64_t)s->n_heads * s->head_dim ||
        ldo < (int64_t)s->n_heads * s->head_dim || splits < 1 || splits > 64 ||
        (splits > 1 && (!ws || (int64_t)splits * n_rows > BN_CB_ATTN_PAGED_SHARES)))
        return cudaErrorInvalidValue;
    if (!bn_cb_attn_paged_supports(s->head_dim))
        return cudaErrorNotSupported;
    if (n_rows == 0)
        return cudaSuccess;
    if (s->head_dim == 128)
        return kv_f16 ? launch<128, __half>(s, q, ldq, n_rows, row_seq, row_pos, tables,
                                            max_blocks, block_size, k_cache, v_cache, splits,
                                            rows, out, ldo, ws, stream)
                      : launch<128, float>(s, q, ldq, n_rows, row_seq, row_pos, tables,
                                           max_blocks, block_size, k_cache, v_cache, splits,
                                           rows, out, ldo, ws, stream);
    return kv_f16 ? launch<64, __half>(s, q, ldq, n_rows, row_seq, row_pos, tables, max_blocks,
                                       block_size, k_cache, v_cache, splits, rows, out,
                                       ldo, ws, stream)
                  : launch<64, float>(s, q, ldq, n_rows, row_seq, row_pos, tables, max_blocks,
                                      block_size, k_cache, v_cache, splits, rows, out,
                                      ldo, ws, stream);
}

extern "C" int bn_cb_attn_paged_supports(int head_dim)
{
    return head_dim == 64 || head_dim == 128;
}
