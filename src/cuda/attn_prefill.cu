/*
 * attn_prefill.cu - prefill attention over the fp32 KV cache: the entry point
 * bn_cb_attn_prefill, which runs the register-tiled kernel
 * (attn_prefill_tiled.cu) where it takes the shape, else the warp-per-row
 * kernel of this file (any head_dim that is a multiple of 4 up to 256).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "attn_f32.cuh"
#include "block_reduce.cuh"
#include "cuda_backend_kernels.h"
#include "smem_opt_in.cuh"

namespace {

constexpr int kAttnWarps = 4;

/* Prefill: grid (ceil(n / 16), n_heads), kAttnWarps warps, each warp owning
 * 4 query rows. Keys and values go through shared memory in tiles of 32
 * positions (rows padded by 4 floats: conflict-free float4 reads by key);
 * for each of its rows a warp scores the tile's 32 keys (lane j: key j),
 * updates its online softmax and accumulates p . V (lane l: chunks l,
 * l + 32). */
constexpr int kPrefillRows = 16;
constexpr int kRowsPerWarp = kPrefillRows / kAttnWarps;
constexpr int kKeyTile = 32;

__host__ __device__ constexpr size_t prefill_smem(int hd)
{
    return sizeof(float) * ((size_t)kPrefillRows * hd + 2 * (size_t)kKeyTile * (hd + 4)) +
           sizeof(int) * kPrefillRows;
}

__global__ void __launch_bounds__(32 * kAttnWarps)
    attn_prefill_kernel(bn_cb_attn_shape s, const float *__restrict__ q, int64_t ldq, int n,
                        const int32_t *__restrict__ pos, const float *__restrict__ kc,
                        const float *__restrict__ vc, float scale, float *__restrict__ out,
                        int64_t ldo)
{
    extern __shared__ __align__(16) float smem[];
    const int hd = s.head_dim, nc = hd / 4, ks = hd + 4;
    float *qs = smem;                            /* [16][hd]    */
    float *kt = qs + kPrefillRows * hd;          /* [32][hd+4]  */
    float *vt = kt + kKeyTile * ks;              /* [32][hd+4]  */
    int *qpos = reinterpret_cast<int *>(vt + kKeyTile * ks);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y;
    const int row0 = blockIdx.x * kPrefillRows;
    const int group = s.n_heads / s.n_kv_heads;
    const int64_t kv_dim = (int64_t)s.n_kv_heads * hd;
    const int64_t head_off = (int64_t)(h / group) * hd;

    for (int i = threadIdx.x; i < kPrefillRows * nc; i += blockDim.x) {
        const int r = i / nc, ch = i % nc;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row0 + r < n)
            v = reinterpret_cast<const float4 *>(q + (int64_t)(row0 + r) * ldq +
                                                 (int64_t)h * hd)[ch];
        reinterpret_cast<float4 *>(qs + r * hd)[ch] = v;
    }
    if (threadIdx.x < kPrefillRows) {
        const int r = row0 + threadIdx.x;
        int p = r < n ? pos[r] : -1;
        if ((int64_t)p >= s.capacity)
            p = -1; /* nothing there to attend to: the row is not written */
        qpos[threadIdx.x] = p;
    }
    __syncthreads();
    int max_pos = -1;
    for (int r = 0; r < kPrefillRows; r++)
        max_pos = max(max_pos, qpos[r]);

    float m[kRowsPerWarp], l[kRowsPerWarp];
    float4 acc[kRowsPerWarp][kMaxChunks];
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; j++) {
        m[j] = -INFINITY;
        l[j] = 0.0f;
#pragma unroll
        for (int c = 0; c < kMaxChunks; c++)
            acc[j][c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    for (int t0 = 0; t0 <= max_pos; t0 += kKeyTile) {
        __syncthreads(); /* the previous tile is no longer read */
        for (int i = threadIdx.x; i < kKeyTile * nc; i += blockDim.x) {
            const int r = i / nc, ch = i % nc;
            const int t = t0 + r;
            float4 kv4 = make_float4(0.f, 0.f, 0.f, 0.f), vv4 = kv4;
            if (t <= max_pos) {
                kv4 = reinterpret_cast<const float4 *>(kc + (int64_t)t * kv_dim + head_off)[ch];
                vv4 = reinterpret_cast<const float4 *>(vc + (int64_t)t * kv_dim + head_off)[ch];
            }
            reinterpret_cast<float4 *>(kt + r * ks)[ch] = kv4;
            reinterpret_cast<float4 *>(vt + r * ks)[ch] = vv4;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; j++) {
            const int r = warp * kRowsPerWarp + j;
            const int p = qpos[r];
            if (p < t0)
                continue; /* warp-uniform: no key of this tile is visible */
            const bool visible = t0 + lane <= p;
            float score = -INFINITY;
            if (visible) {
                const float4 *qr = reinterpret_cast<const float4 *>(qs + r * hd);
                const float4 *kr = reinterpret_cast<const float4 *>(kt + lane * ks);
                float dot = 0.0f;
                for (int ch = 0; ch < nc; ch++)
                    dot = f4_dot(qr[ch], kr[ch], dot);
                score = dot * scale;
            }
            const float m_new = fmaxf(m[j], warp_reduce(score, MaxF()));
            const float corr = expf(m[j] - m_new);
            const float pj = visible ? expf(score - m_new) : 0.0f;
            l[j] = fmaf(l[j], corr, warp_reduce(pj, SumF()));
#pragma unroll
            for (int c = 0; c < kMaxChunks; c++)
                acc[j][c] = f4_scale(acc[j][c], corr);
            const int last = min(kKeyTile - 1, p - t0);
            for (int key = 0; key <= last; key++) {
                const float pk = __shfl_sync(kFull, pj, key);
#pragma unroll
                for (int c = 0; c < kMaxChunks; c++) {
                    const int ch = lane + 32 * c;
                    if (ch < nc)
                        acc[j][c] = f4_axpy(pk, reinterpret_cast<const float4 *>(vt + key * ks)[ch],
                                            acc[j][c]);
                }
            }
            m[j] = m_new;
        }
    }

#pragma unroll
    for (int j = 0; j < kRowsPerWarp; j++) {
        const int r = warp * kRowsPerWarp + j;
        if (qpos[r] < 0)
            continue;
        const float inv = 1.0f / l[j];
        float4 *o = reinterpret_cast<float4 *>(out + (int64_t)(row0 + r) * ldo + (int64_t)h * hd);
#pragma unroll
        for (int c = 0; c < kMaxChunks; c++) {
            const int ch = lane + 32 * c;
            if (ch < nc)
                o[ch] = f4_scale(acc[j][c], inv);
        }
    }
}

} // namespace

extern "C" cudaError_t bn_cb_attn_prefill_prepare(int head_dim)
{
    if (head_dim <= 0 || head_dim % 4 != 0 || head_dim > 32 * 4 * kMaxChunks)
        return cudaErrorInvalidValue;
    return allow_dynamic_smem(attn_prefill_kernel, prefill_smem(head_dim));
}

static bool prefill_args_ok(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n,
                            const int32_t *pos, const float *k_cache, const float *v_cache,
                            const float *out, int64_t ldo)
{
    return attn_shape_ok(s) && q && pos && k_cache && v_cache && out && n >= 0 &&
           s->n_heads <= 65535 && ldq >= (int64_t)s->n_heads * s->head_dim &&
           ldo >= (int64_t)s->n_heads * s->head_dim && ldq % 4 == 0 && ldo % 4 == 0;
}

static float prefill_scale(const bn_cb_attn_shape *s)
{
    return (float)(1.0 / sqrt((double)s->head_dim));
}

/* The warp-per-row kernel on arguments already checked. */
static cudaError_t launch_prefill_rowwise(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                          int n, const int32_t *pos, const float *k_cache,
                                          const float *v_cache, float *out, int64_t ldo,
                                          cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    const dim3 grid((unsigned)((n + kPrefillRows - 1) / kPrefillRows), (unsigned)s->n_heads);
    attn_prefill_kernel<<<grid, 32 * kAttnWarps, prefill_smem(s->head_dim), stream>>>(
        *s, q, ldq, n, pos, k_cache, v_cache, prefill_scale(s), out, ldo);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_attn_prefill(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                          int n, const int32_t *pos, const float *k_cache,
                                          const float *v_cache, float *out, int64_t ldo,
                                          int parts, void *ws, size_t ws_bytes,
                                          cudaStream_t stream)
{
    if (!prefill_args_ok(s, q, ldq, n, pos, k_cache, v_cache, out, ldo))
        return cudaErrorInvalidValue;
    if (bn_cb_attn_prefill_tiled_supports(s, q, ldq, k_cache, v_cache, out, ldo))
        return bn_cb_attn_prefill_tiled(s, q, ldq, n, pos, k_cache, v_cache, prefill_scale(s),
                                        out, ldo, parts, ws, ws_bytes, stream);
    return launch_prefill_rowwise(s, q, ldq, n, pos, k_cache, v_cache, out, ldo, stream);
}
