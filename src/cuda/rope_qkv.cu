/*
 * rope_qkv.cu - the RoPE table (cos and sin of every cache position, once at
 * load) and the q|k|v epilogue of prefill chunks and of the fp16 cache's
 * decode step: each part's scale, RoPE on q and k, k and v into the cache
 * (bn_cb_rope_table, bn_cb_qkv_post in cuda_backend_kernels.h). The fp32
 * cache's decode step does the same inside its attention kernel, with the
 * same device code (rope.cuh).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"
#include "kv_store.cuh"
#include "pdl.cuh"
#include "rope.cuh"

namespace {

__global__ void __launch_bounds__(256)
    rope_table_kernel(bn_rope_freqs freqs, int64_t n_pos, float2 *__restrict__ table)
{
    const int half = freqs.rope_dim / 2;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_pos * half)
        table[i] = rope_cos_sin((int)(i / half), freqs.inv_freq[(int)(i % half)]);
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

template <int KV, int kVec>
__global__ void __launch_bounds__(256)
    qkv_post_kernel(const float *raw, int64_t ldraw, bn_cb_qkv_shape s, bn_rope_freqs freqs,
                    const float2 *__restrict__ table, int64_t table_len, const int32_t *pos,
                    const int32_t *slot, float *q_out, int64_t ldq, void *k_cache, void *v_cache)
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
    } else if (const int row = slot ? __ldcg(slot + t) : p; row >= 0 && (int64_t)row < s.capacity) {
        const int64_t off = (int64_t)row * kv_dim + at.local;
        void *cache = at.region == 1 ? k_cache : v_cache;
        if constexpr (kVec == 4)
            kv_store4(cache, KV, off, make_float4(v[0], v[1], v[2], v[3]));
        else
            kv_store1(cache, KV, off, v[0]);
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

} // namespace

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

/* bn_cb_qkv_post with each row's k and v stored in cache row slot[t]
 * (NULL: at its position), for the paged cache of many sequences. */
static cudaError_t qkv_post(const float *raw, int64_t ldraw, int64_t m, const bn_cb_qkv_shape *s,
                            const bn_rope_freqs *freqs, const float *table, int64_t table_len,
                            const int32_t *pos, const int32_t *slot, float *q_out, int64_t ldq,
                            void *k_cache, void *v_cache, int kv, int pdl,
                            cudaStream_t stream)
{
    /* Only the paged cache (slots) holds e4m3. */
    if (kv != BN_CB_KV_F32 && kv != BN_CB_KV_F16 && !(kv == BN_CB_KV_E4M3 && slot))
        return cudaErrorInvalidValue;
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
    /* The kernel for this cache element and vector width. */
    const auto go = [&](auto kernel, unsigned per_thread) {
        const dim3 grid((unsigned)m, (unsigned)((values / per_thread + 255) / 256));
        return pdl_launch(kernel, grid, dim3(256), 0, stream, pdl, raw, ldraw, *s, *freqs, t,
                          table_len, pos, slot, q_out, ldq, k_cache, v_cache);
    };
    if (qkv_post_vec_fits(raw, ldraw, s, freqs, table, q_out, ldq, k_cache, v_cache))
        return kv == BN_CB_KV_E4M3  ? go(qkv_post_kernel<BN_CB_KV_E4M3, 4>, 4)
               : kv == BN_CB_KV_F16 ? go(qkv_post_kernel<BN_CB_KV_F16, 4>, 4)
                                    : go(qkv_post_kernel<BN_CB_KV_F32, 4>, 4);
    return kv == BN_CB_KV_E4M3  ? go(qkv_post_kernel<BN_CB_KV_E4M3, 1>, 1)
           : kv == BN_CB_KV_F16 ? go(qkv_post_kernel<BN_CB_KV_F16, 1>, 1)
                                : go(qkv_post_kernel<BN_CB_KV_F32, 1>, 1);
}

extern "C" cudaError_t bn_cb_qkv_post(const float *raw, int64_t ldraw, int64_t m,
                                      const bn_cb_qkv_shape *s, const bn_rope_freqs *freqs,
                                      const float *table, int64_t table_len, const int32_t *pos,
                                      float *q_out, int64_t ldq, void *k_cache, void *v_cache,
                                      int kv, int pdl, cudaStream_t stream)
{
    return qkv_post(raw, ldraw, m, s, freqs, table, table_len, pos, NULL, q_out, ldq, k_cache,
                    v_cache, kv, pdl, stream);
}

extern "C" cudaError_t bn_cb_qkv_post_slots(const float *raw, int64_t ldraw, int64_t m,
                                            const bn_cb_qkv_shape *s, const bn_rope_freqs *freqs,
                                            const float *table, int64_t table_len,
                                            const int32_t *pos, const int32_t *slot,
                                            float *q_out, int64_t ldq, void *k_cache,
                                            void *v_cache, int kv, cudaStream_t stream)
{
    if (!slot)
        return cudaErrorInvalidValue;
    return qkv_post(raw, ldraw, m, s, freqs, table, table_len, pos, slot, q_out, ldq, k_cache,
                    v_cache, kv, 0, stream);
}

extern "C" int bn_cb_rope_pdl_compiled(void)
{
    return pdl_compiled(qkv_post_kernel<BN_CB_KV_F32, 4>);
}

#ifdef BN_DECODE_TRACE
BN_TRACE_ATTACH(bn_cb_rope_trace_attach)
#endif
