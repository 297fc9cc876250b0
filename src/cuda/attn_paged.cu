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
 * dev/cuda/attn_paged.cu holds the one-split kernel with its timing.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"

namespace {

constexpr int kTile = 32;

/* Chunk ch (4 values) of cache row cr's head: fp32 as stored, fp16 widened. */
template <typename T> __device__ __forceinline__ float4 load4(const T *row, int ch);
template <> __device__ __forceinline__ float4 load4<float>(const float *row, int ch)
{
    return __ldcs(reinterpret_cast<const float4 *>(row) + ch);
}
template <> __device__ __forceinline__ float4 load4<__half>(const __half *row, int ch)
{
    const uint2 u = __ldcs(reinterpret_cast<const uint2 *>(row) + ch);
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

template <int HD, typename T>
__global__ void attn_paged_kernel(int n_heads, int n_kv, const float *__restrict__ q, int64_t ldq,
                                  const int32_t *__restrict__ row_seq,
                                  const int32_t *__restrict__ row_pos,
                                  const int32_t *__restrict__ tables, int max_blocks, int bs,
                                  const T *__restrict__ kc, const T *__restrict__ vc,
                                  float scale, int span, float *__restrict__ out, int64_t ldo,
                                  float *__restrict__ part)
{
    constexpr int NC = HD / 4, KS = HD + 4;
    extern __shared__ __align__(16) float smem[];
    const int group = n_heads / n_kv;
    float *qs = smem;               /* [group][HD]  */
    float *kt = qs + group * HD;    /* [32][HD + 4] */
    float *vt = kt + kTile * KS;    /* [32][HD + 4] */
    const int row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = kvh * group + warp;
    const int64_t kv_dim = (int64_t)n_kv * HD, head_off = (int64_t)kvh * HD;
    const int seq = row_seq[row], pos = row_pos[row];
    const int32_t *table = tables + (int64_t)seq * max_blocks;
    const int begin = split * span, end = min(begin + span, pos + 1); /* [begin, end) */

    for (int i = threadIdx.x; i < group * NC; i += blockDim.x) {
        const int w = i / NC, ch = i % NC;
        reinterpret_cast<float4 *>(qs + w * HD)[ch] = reinterpret_cast<const float4 *>(
            q + (int64_t)row * ldq + (int64_t)(kvh * group + w) * HD)[ch];
    }
    float m = -INFINITY, l = 0.0f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f); /* chunk `lane` (HD = 128) */
    float4 acc2 = acc;                            /* HD = 256: chunk lane + 32 */
    for (int t0 = begin; t0 < end; t0 += kTile) {
        __syncthreads(); /* the previous tile is read; qs is in place */
        for (int i = threadIdx.x; i < kTile * NC; i += blockDim.x) {
            const int r = i / NC, ch = i % NC, t = t0 + r;
            float4 k4 = make_float4(0.f, 0.f, 0.f, 0.f), v4 = k4;
            if (t < end) {
                const int64_t cr = (int64_t)table[t / bs] * bs + t % bs;
                k4 = load4(kc + cr * kv_dim + head_off, ch);
                v4 = load4(vc + cr * kv_dim + head_off, ch);
            }
            reinterpret_cast<float4 *>(kt + r * KS)[ch] = k4;
            reinterpret_cast<float4 *>(vt + r * KS)[ch] = v4;
        }
        __syncthreads();
        const bool visible = t0 + lane < end;
        float score = -INFINITY;
        if (visible) {
            const float4 *qr = reinterpret_cast<const float4 *>(qs + warp * HD);
            const float4 *kr = reinterpret_cast<const float4 *>(kt + lane * KS);
            float dot = 0.0f;
#pragma unroll
            for (int ch = 0; ch < NC; ch++) {
                const float4 a = qr[ch], b = kr[ch];
                dot = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, dot))));
            }
            score = dot * scale;
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
        acc2 = make_float4(acc2.x * corr, acc2.y * corr, acc2.z * corr, acc2.w * corr);
        const int last = min(kTile, end - t0);
        for (int key = 0; key < last; key++) {
            const float pk = __shfl_sync(0xffffffffu, p, key);
            if (lane < NC) {
                const float4 v = reinterpret_cast<const float4 *>(vt + key * KS)[lane];
                acc = make_float4(fmaf(pk, v.x, acc.x), fmaf(pk, v.y, acc.y),
                                  fmaf(pk, v.z, acc.z), fmaf(pk, v.w, acc.w));
            }
            if (NC > 32 && lane + 32 < NC) {
                const float4 v = reinterpret_cast<const float4 *>(vt + key * KS)[lane + 32];
                acc2 = make_float4(fmaf(pk, v.x, acc2.x), fmaf(pk, v.y, acc2.y),
                                   fmaf(pk, v.z, acc2.z), fmaf(pk, v.w, acc2.w));
            }
        }
        m = m_new;
    }
    float4 *o;
    float inv = 1.0f;
    if (gridDim.z == 1) { /* one split: the output itself */
        inv = 1.0f / l;
        o = reinterpret_cast<float4 *>(out + (int64_t)row * ldo + (int64_t)h * HD);
    } else { /* this split's share: [sum (HD)][max][weight] */
        float *pr = part + (((int64_t)row * n_heads + h) * gridDim.z + split) * (HD + 4);
        if (lane == 0) {
            pr[HD] = m;
            pr[HD + 1] = l;
        }
        o = reinterpret_cast<float4 *>(pr);
    }
    if (lane < NC)
        o[lane] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    if (NC > 32 && lane + 32 < NC)
        o[lane + 32] = make_float4(acc2.x * inv, acc2.y * inv, acc2.z * inv, acc2.w * inv);
}

/* Block (row, head), thread d < HD: the splits' shares of value d combined
 * in split order, out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s. */
__global__ void paged_merge(int n_heads, int hd, int splits, const float *__restrict__ part,
                            float *__restrict__ out, int64_t ldo)
{
    const int row = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const float *pr = part + ((int64_t)row * n_heads + h) * splits * (hd + 4);
    float M = -INFINITY;
    for (int s = 0; s < splits; s++)
        M = fmaxf(M, pr[s * (hd + 4) + hd]);
    float sum = 0.0f, weight = 0.0f;
    for (int s = 0; s < splits; s++) {
        const float *ps = pr + s * (hd + 4);
        const float w = ps[hd + 1] > 0.0f ? expf(ps[hd] - M) : 0.0f;
        sum = fmaf(w, ps[d], sum);
        weight = fmaf(w, ps[hd + 1], weight);
    }
    out[(int64_t)row * ldo + (int64_t)h * hd + d] = sum / weight;
}

size_t paged_smem(int n_heads, int n_kv, int hd)
{
    return sizeof(float) * ((size_t)(n_heads / n_kv) * hd + 2 * (size_t)kTile * (hd + 4));
}

template <int HD, typename T>
cudaError_t launch(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n_rows,
                   const int32_t *row_seq, const int32_t *row_pos, const int32_t *tables,
                   int max_blocks, int block_size, const void *k_cache, const void *v_cache,
                   int splits, int span, float *out, int64_t ldo, float *part,
                   cudaStream_t stream)
{
    const size_t smem = paged_smem(s->n_heads, s->n_kv_heads, HD);
    if (smem > 48 * 1024) {
        const cudaError_t rc = cudaFuncSetAttribute(
            attn_paged_kernel<HD, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (rc != cudaSuccess)
            return rc;
    }
    const dim3 grid((unsigned)n_rows, (unsigned)s->n_kv_heads, (unsigned)splits);
    const dim3 block(32u * (unsigned)(s->n_heads / s->n_kv_heads));
    const float scale = (float)(1.0 / sqrt((double)HD));
    attn_paged_kernel<HD, T><<<grid, block, smem, stream>>>(
        s->n_heads, s->n_kv_heads, q, ldq, row_seq, row_pos, tables, max_blocks, block_size,
        static_cast<const T *>(k_cache), static_cast<const T *>(v_cache), scale, span, out, ldo,
        part);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess || splits == 1)
        return rc;
    paged_merge<<<dim3((unsigned)n_rows, (unsigned)s->n_heads), (unsigned)HD, 0, stream>>>(
        s->n_heads, HD, splits, part, out, ldo);
    return cudaGetLastError();
}

} // namespace

extern "C" int bn_cb_attn_paged_splits(int n_rows, int max_pos)
{
    /* About 128 positions a split, at most 64 splits, and no more shares
     * than the workspace holds. */
    int splits = (max_pos + 1 + 127) / 128;
    if (splits > 64)
        splits = 64;
    while (splits > 1 && (int64_t)splits * n_rows > BN_CB_ATTN_PAGED_SHARES)
        splits--;
    return splits < 1 ? 1 : splits;
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
                                        const void *v_cache, int kv_f16, int splits, int max_pos,
                                        float *out, int64_t ldo, float *ws, cudaStream_t stream)
{
    if (!s || !q || !row_seq || !row_pos || !tables || !k_cache || !v_cache || !out ||
        n_rows < 0 || max_blocks < 1 || block_size < 1 || s->n_kv_heads < 1 ||
        s->n_heads % s->n_kv_heads != 0 || s->n_heads / s->n_kv_heads > 32 || ldq % 4 != 0 ||
        ldo % 4 != 0 || ldq < (int64_t)s->n_heads * s->head_dim ||
        ldo < (int64_t)s->n_heads * s->head_dim || splits < 1 || splits > 64 || max_pos < 0 ||
        (splits > 1 && (!ws || (int64_t)splits * n_rows > BN_CB_ATTN_PAGED_SHARES)))
        return cudaErrorInvalidValue;
    if (!bn_cb_attn_paged_supports(s->head_dim))
        return cudaErrorNotSupported;
    if (n_rows == 0)
        return cudaSuccess;
    /* Whole tiles a split, enough splits to cover max_pos. */
    const int span = ((max_pos + 1 + splits - 1) / splits + kTile - 1) / kTile * kTile;
    if (s->head_dim == 128)
        return kv_f16 ? launch<128, __half>(s, q, ldq, n_rows, row_seq, row_pos, tables,
                                            max_blocks, block_size, k_cache, v_cache, splits,
                                            span, out, ldo, ws, stream)
                      : launch<128, float>(s, q, ldq, n_rows, row_seq, row_pos, tables,
                                           max_blocks, block_size, k_cache, v_cache, splits,
                                           span, out, ldo, ws, stream);
    return kv_f16 ? launch<64, __half>(s, q, ldq, n_rows, row_seq, row_pos, tables, max_blocks,
                                       block_size, k_cache, v_cache, splits, span, out, ldo, ws,
                                       stream)
                  : launch<64, float>(s, q, ldq, n_rows, row_seq, row_pos, tables, max_blocks,
                                      block_size, k_cache, v_cache, splits, span, out, ldo, ws,
                                      stream);
}

extern "C" int bn_cb_attn_paged_supports(int head_dim)
{
    return head_dim == 64 || head_dim == 128;
}
