/*
 * attn_paged_shares.cuh - the batched pass's paged attention splits a row's
 * positions into ranges whose blocks each write a share; these are the
 * rules both the attention (attn_paged.cu) and whoever combines the shares
 * (paged_merge there, the merging norm in norm_quantize.cu) follow.
 */
#pragma once

#include <math.h>

constexpr int kPagedTile = 32; /* positions a tile */

/* The splits row position pos uses out of the launch's, and the whole
 * tiles of positions each covers: at most 128 positions a split, so a
 * short row is not spread thinly over many blocks. */
static __device__ __forceinline__ int paged_row_splits(int pos, int splits, int *span)
{
    const int len = pos + 1;
    const int used = min(splits, (len + 127) / 128);
    *span = ((len + used - 1) / used + kPagedTile - 1) / kPagedTile * kPagedTile;
    return used;
}

/* A share of head h of listed row r for split s: [sum (hd)][max][weight]. */
static __device__ __forceinline__ const float *paged_share(const float *part, int64_t r, int h,
                                                           int s, int n_heads, int splits, int hd)
{
    return part + (((int64_t)r * n_heads + h) * splits + s) * (hd + 4);
}

/* Split s's maximum, weight and values d .. d + N - 1 (ps: the first
 * share, hd + 4 floats apart). */
template <int N> struct PagedShare {
    float m, l, v[N];
};

template <int N>
static __device__ __forceinline__ PagedShare<N> paged_share_load(const float *ps, int s, int hd,
                                                                 int d)
{
    const float *p = ps + (int64_t)s * (hd + 4);
    PagedShare<N> a;
    a.m = __ldcg(p + hd);
    a.l = __ldcg(p + hd + 1);
    if constexpr (N == 4) { /* d and the share 16-byte aligned */
        const float4 q = __ldcg(reinterpret_cast<const float4 *>(p + d));
        a.v[0] = q.x, a.v[1] = q.y, a.v[2] = q.z, a.v[3] = q.w;
    } else {
#pragma unroll
        for (int e = 0; e < N; e++)
            a.v[e] = __ldcg(p + d + e);
    }
    return a;
}

/* Share a into the running sums (its weight w = e^(m_s - M)). */
template <int N>
static __device__ __forceinline__ void paged_share_add(const PagedShare<N> &a, float M,
                                                       float (&sum)[N], float &weight)
{
    const float w = a.l > 0.0f ? expf(a.m - M) : 0.0f;
#pragma unroll
    for (int e = 0; e < N; e++)
        sum[e] = fmaf(w, a.v[e], sum[e]);
    weight = fmaf(w, a.l, weight);
}

/* Value d .. d + N - 1 of head h's output from its `used` shares (ps: the
 * first share), combined in split order:
 * out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s. Up to kQuick
 * shares are all requested at once (one trip to memory), more in turn. */
template <int N>
static __device__ __forceinline__ void paged_combine(const float *ps, int used, int hd, int d,
                                                     float (&out)[N])
{
    constexpr int kQuick = 8;
    float M = -INFINITY, sum[N], weight = 0.0f;
#pragma unroll
    for (int e = 0; e < N; e++)
        sum[e] = 0.0f;
    if (used <= kQuick) {
        PagedShare<N> a[kQuick];
#pragma unroll
        for (int s = 0; s < kQuick; s++)
            if (s < used)
                a[s] = paged_share_load<N>(ps, s, hd, d);
#pragma unroll
        for (int s = 0; s < kQuick; s++)
            if (s < used)
                M = fmaxf(M, a[s].m);
#pragma unroll
        for (int s = 0; s < kQuick; s++)
            if (s < used)
                paged_share_add<N>(a[s], M, sum, weight);
    } else {
        for (int s = 0; s < used; s++)
            M = fmaxf(M, __ldcg(ps + (int64_t)s * (hd + 4) + hd));
        for (int s = 0; s < used; s++)
            paged_share_add<N>(paged_share_load<N>(ps, s, hd, d), M, sum, weight);
    }
#pragma unroll
    for (int e = 0; e < N; e++)
        out[e] = sum[e] / weight;
}
