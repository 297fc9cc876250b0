/*
 * attn_paged.cu - decode and prefill attention for rows of many sequences
 * over the paged fp32 KV cache (bn_cb_attn_paged in cuda_backend_kernels.h),
 * the batched pass's attention (cuda_backend_rows.c).
 *
 * Row r is one token of sequence row_seq[r] at position row_pos[r]; its
 * keys and values for positions 0..row_pos[r] live in cache rows
 * tables[seq * max_blocks + t / block_size] * block_size + t % block_size.
 * One block per (row, kv head): its warps are the q heads that share the kv
 * head (GQA), so each cache row is read once for all of them. The block
 * gathers tiles of 32 positions through the table into shared memory; each
 * warp scores the tile's keys (lane j: key j), keeps an online softmax and
 * accumulates p . V (lane l: the head's float4 chunk l). dev/cuda/
 * attn_paged.cu holds the same kernel with its timing.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"

namespace {

constexpr int kTile = 32;

template <int HD>
__global__ void attn_paged_kernel(int n_heads, int n_kv, const float *__restrict__ q, int64_t ldq,
                                  const int32_t *__restrict__ row_seq,
                                  const int32_t *__restrict__ row_pos,
                                  const int32_t *__restrict__ tables, int max_blocks, int bs,
                                  const float *__restrict__ kc, const float *__restrict__ vc,
                                  float scale, float *__restrict__ out, int64_t ldo)
{
    constexpr int NC = HD / 4, KS = HD + 4;
    extern __shared__ __align__(16) float smem[];
    const int group = n_heads / n_kv;
    float *qs = smem;               /* [group][HD]  */
    float *kt = qs + group * HD;    /* [32][HD + 4] */
    float *vt = kt + kTile * KS;    /* [32][HD + 4] */
    const int row = blockIdx.x, kvh = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = kvh * group + warp;
    const int64_t kv_dim = (int64_t)n_kv * HD, head_off = (int64_t)kvh * HD;
    const int seq = row_seq[row], pos = row_pos[row];
    const int32_t *table = tables + (int64_t)seq * max_blocks;

    for (int i = threadIdx.x; i < group * NC; i += blockDim.x) {
        const int w = i / NC, ch = i % NC;
        reinterpret_cast<float4 *>(qs + w * HD)[ch] = reinterpret_cast<const float4 *>(
            q + (int64_t)row * ldq + (int64_t)(kvh * group + w) * HD)[ch];
    }
    float m = -INFINITY, l = 0.0f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f); /* chunk `lane` (HD = 128) */
    float4 acc2 = acc;                            /* HD = 256: chunk lane + 32 */
    for (int t0 = 0; t0 <= pos; t0 += kTile) {
        __syncthreads(); /* the previous tile is read; qs is in place */
        for (int i = threadIdx.x; i < kTile * NC; i += blockDim.x) {
            const int r = i / NC, ch = i % NC, t = t0 + r;
            float4 k4 = make_float4(0.f, 0.f, 0.f, 0.f), v4 = k4;
            if (t <= pos) {
                const int64_t cr = (int64_t)table[t / bs] * bs + t % bs;
                k4 = __ldcs(reinterpret_cast<const float4 *>(kc + cr * kv_dim + head_off) + ch);
                v4 = __ldcs(reinterpret_cast<const float4 *>(vc + cr * kv_dim + head_off) + ch);
            }
            reinterpret_cast<float4 *>(kt + r * KS)[ch] = k4;
            reinterpret_cast<float4 *>(vt + r * KS)[ch] = v4;
        }
        __syncthreads();
        const bool visible = t0 + lane <= pos;
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
        const int last = min(kTile - 1, pos - t0);
        for (int key = 0; key <= last; key++) {
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
    const float inv = 1.0f / l;
    float4 *o = reinterpret_cast<float4 *>(out + (int64_t)row * ldo + (int64_t)h * HD);
    if (lane < NC)
        o[lane] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    if (NC > 32 && lane + 32 < NC)
        o[lane + 32] = make_float4(acc2.x * inv, acc2.y * inv, acc2.z * inv, acc2.w * inv);
}

size_t paged_smem(int n_heads, int n_kv, int hd)
{
    return sizeof(float) * ((size_t)(n_heads / n_kv) * hd + 2 * (size_t)kTile * (hd + 4));
}

} // namespace

extern "C" cudaError_t bn_cb_attn_paged(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                        int n_rows, const int32_t *row_seq,
                                        const int32_t *row_pos, const int32_t *tables,
                                        int max_blocks, int block_size, const float *k_cache,
                                        const float *v_cache, float *out, int64_t ldo,
                                        cudaStream_t stream)
{
    if (!s || !q || !row_seq || !row_pos || !tables || !k_cache || !v_cache || !out ||
        n_rows < 0 || max_blocks < 1 || block_size < 1 || s->n_kv_heads < 1 ||
        s->n_heads % s->n_kv_heads != 0 || s->n_heads / s->n_kv_heads > 32 || ldq % 4 != 0 ||
        ldo % 4 != 0 || ldq < (int64_t)s->n_heads * s->head_dim ||
        ldo < (int64_t)s->n_heads * s->head_dim)
        return cudaErrorInvalidValue;
    if (!bn_cb_attn_paged_supports(s->head_dim))
        return cudaErrorNotSupported;
    if (n_rows == 0)
        return cudaSuccess;
    const dim3 grid((unsigned)n_rows, (unsigned)s->n_kv_heads);
    const dim3 block(32u * (unsigned)(s->n_heads / s->n_kv_heads));
    const size_t smem = paged_smem(s->n_heads, s->n_kv_heads, s->head_dim);
    const float scale = (float)(1.0 / sqrt((double)s->head_dim));
    if (s->head_dim == 128) {
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(attn_paged_kernel<128>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attn_paged_kernel<128><<<grid, block, smem, stream>>>(
            s->n_heads, s->n_kv_heads, q, ldq, row_seq, row_pos, tables, max_blocks, block_size,
            k_cache, v_cache, scale, out, ldo);
    } else {
        attn_paged_kernel<64><<<grid, block, smem, stream>>>(
            s->n_heads, s->n_kv_heads, q, ldq, row_seq, row_pos, tables, max_blocks, block_size,
            k_cache, v_cache, scale, out, ldo);
    }
    return cudaGetLastError();
}

extern "C" int bn_cb_attn_paged_supports(int head_dim)
{
    return head_dim == 64 || head_dim == 128;
}
