/*
 * attn_paged_mma.cu - lab: decode attention for many sequences at once over
 * a paged fp16 KV cache on the tensor cores, against the shipped kernel
 * (src/cuda/attn_paged.cu, fp32 and fp16 caches, linked in).
 *
 * The shipped kernel scores and sums with fp32 FMAs: per 32-key tile each
 * of a block's warps (one per q head of the kv head's group) reads the
 * whole K and V tile from shared memory and widens it. Here one warp holds
 * all q heads of the group as the rows of an m16n8k16 fp16 product (rows
 * past the group are zero), so
 *   S (heads x 16 keys) = Q K^T      16 mma.sync for HD = 128
 *   O (heads x HD)     += P V        16 mma.sync
 * with K and V fragments read by ldmatrix straight from the staged rows
 * (V transposed by ldmatrix.trans). A block of four warps takes 64 keys a
 * stage (16 each) in a STAGES-deep cp.async pipeline; each warp keeps its
 * own running maximum and sum, and the four are merged in shared memory at
 * the end. Positions are split over blocks as the shipped kernel does, in
 * ranges of about SPLIT positions, the shares merged by a second kernel.
 *
 * Precision: q is scaled by head_dim^-0.5 and rounded to fp16, the
 * probabilities are rounded to fp16 before P V; scores, sums and outputs
 * are fp32. The check compares against a double-precision reference over
 * the same fp16 cache values.
 *
 *   make -C dev/cuda attn_paged_mma && dev/cuda/attn_paged_mma [len]
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "common.cuh"
#include "cp_async.cuh"

#include "cuda_backend_kernels.h"

namespace {

constexpr int kChunk = 64; /* keys a stage: 16 a warp */
constexpr int kWarps = 4;

/* The splits a row of position pos uses out of the launch's, and the whole
 * chunks of positions each covers: about split_len positions a split. */
__device__ __forceinline__ int row_splits_len(int pos, int splits, int split_len, int *span)
{
    const int len = pos + 1;
    const int used = min(splits, (len + split_len - 1) / split_len);
    *span = ((len + used - 1) / used + kChunk - 1) / kChunk * kChunk;
    return used;
}

__device__ __forceinline__ int cache_row(const int32_t *table, int bs, int t, int end)
{
    const int block = t < end ? table[t / bs] : -1;
    return block < 0 ? -1 : block * bs + t % bs;
}

__device__ __forceinline__ uint32_t pack_half2(float a, float b)
{
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                            uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                                  uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* d += a b: m16n8k16, fp16 inputs, fp32 accumulators. */
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int HD> struct Stage {
    static constexpr int kStride = HD + 8;                /* halves a row: 16-byte pad */
    static constexpr int kHalves = 2 * kChunk * kStride; /* K rows, then V rows       */
};

template <int HD, int STAGES> size_t mma_smem()
{
    const size_t stages = sizeof(__half) * (size_t)STAGES * Stage<HD>::kHalves;
    const size_t merge = sizeof(float) * (size_t)kWarps * 16 * (HD + 2);
    return stages > merge ? stages : merge;
}

template <int HD, int STAGES>
__global__ void __launch_bounds__(kWarps * 32)
    attn_paged_mma(int n_heads, int n_kv, const float *__restrict__ q, int64_t ldq,
                   const int32_t *__restrict__ row_seq, const int32_t *__restrict__ row_pos,
                   const int32_t *__restrict__ tables, int max_blocks, int bs,
                   const __half *__restrict__ kc, const __half *__restrict__ vc, float scale,
                   int split_len, float *__restrict__ out, int64_t ldo, float *__restrict__ part)
{
    using S = Stage<HD>;
    constexpr int KSTEPS = HD / 16, NT = HD / 8, PIECES = HD / 8; /* 16-byte pieces a row */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half *stages = reinterpret_cast<__half *>(smem_raw);
    const int group = n_heads / n_kv;
    const int row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int seq = row_seq[row], pos = row_pos[row];
    int span;
    if (split >= row_splits_len(pos, (int)gridDim.z, split_len, &span))
        return;
    const int32_t *table = tables + (int64_t)seq * max_blocks;
    const int begin = split * span, end = min(begin + span, pos + 1);
    const int n_chunks = (end - begin + kChunk - 1) / kChunk;
    const int64_t kv_dim = (int64_t)n_kv * HD, head_off = (int64_t)kvh * HD;

    /* Chunk c's K and V rows into stage c % STAGES: thread i copies piece
     * i % PIECES of rows i / PIECES + k * (128 / PIECES). */
    auto issue = [&](int c) {
        __half *kd = stages + (c % STAGES) * S::kHalves, *vd = kd + kChunk * S::kStride;
        const int piece = threadIdx.x % PIECES;
        for (int r = threadIdx.x / PIECES; r < kChunk; r += kWarps * 32 / PIECES) {
            const int cr = cache_row(table, bs, begin + c * kChunk + r, end);
            const int64_t src = (int64_t)(cr < 0 ? 0 : cr) * kv_dim + head_off + piece * 8;
            const int at = r * S::kStride + piece * 8;
            cp_async16((uint32_t)__cvta_generic_to_shared(kd + at), kc + src, cr >= 0);
            cp_async16((uint32_t)__cvta_generic_to_shared(vd + at), vc + src, cr >= 0);
        }
    };
    for (int c = 0; c < STAGES - 1; c++) {
        if (c < n_chunks)
            issue(c);
        cp_async_commit();
    }

    /* Q as A fragments, scaled, rows past the group zero: row g and g + 8,
     * columns 16 ks + 2 t4 (+1) and + 8. */
    uint32_t qa[KSTEPS][4];
    {
        const float *q0 = q + (int64_t)row * ldq + (int64_t)kvh * group * HD;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = g + (i & 1) * 8, col = ks * 16 + 2 * t4 + (i >> 1) * 8;
                float2 v = make_float2(0.f, 0.f);
                if (r < group)
                    v = *reinterpret_cast<const float2 *>(q0 + (int64_t)r * HD + col);
                qa[ks][i] = pack_half2(v.x * scale, v.y * scale);
            }
    }

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; /* rows g, g + 8 */

    for (int c = 0; c < n_chunks; c++) {
        cp_async_wait<STAGES - 2>(); /* chunk c's copies (this thread's) */
        __syncthreads();             /* everyone's; chunk c - 1 is done   */
        if (c + STAGES - 1 < n_chunks)
            issue(c + STAGES - 1);
        cp_async_commit();

        const __half *ks_rows = stages + (c % STAGES) * S::kHalves + warp * 16 * S::kStride;
        const __half *vs_rows = ks_rows + kChunk * S::kStride;
        /* S = Q K^T for the warp's 16 keys: n-tile j holds keys 8 j .. 8 j + 7. */
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks += 2) {
                uint32_t b0, b1, b2, b3;
                ldmatrix_x4((uint32_t)__cvta_generic_to_shared(ks_rows + (8 * j + ri) * S::kStride +
                                                               ks * 16 + mi * 8),
                            b0, b1, b2, b3);
                mma16816(s[j], qa[ks], b0, b1);
                mma16816(s[j], qa[ks + 1], b2, b3);
            }
        /* Online softmax of rows g (s[.][0..1]) and g + 8 (s[.][2..3]). */
        const int key0 = begin + c * kChunk + warp * 16 + 2 * t4;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (key0 + 8 * j + (e & 1) >= end)
                    s[j][e] = -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            const float m_new = fmaxf(m[h], mx[h]);
            corr[h] = m_new == -INFINITY ? 1.0f : __expf(m[h] - m_new);
            m[h] = m_new;
        }
        float p[2][4];
        l[0] *= corr[0], l[1] *= corr[1];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[j][e] = s[j][e] == -INFINITY ? 0.0f : __expf(s[j][e] - m[e >> 1]);
                l[e >> 1] += p[j][e];
            }
#pragma unroll
        for (int n = 0; n < NT; n++) {
            o[n][0] *= corr[0], o[n][1] *= corr[0];
            o[n][2] *= corr[1], o[n][3] *= corr[1];
        }
        /* P as the A fragment of P V (k = the warp's 16 keys). */
        const uint32_t pa[4] = {pack_half2(p[0][0], p[0][1]), pack_half2(p[0][2], p[0][3]),
                                pack_half2(p[1][0], p[1][1]), pack_half2(p[1][2], p[1][3])};
#pragma unroll
        for (int u = 0; u < NT / 2; u++) {
            uint32_t b0, b1, b2, b3;
            ldmatrix_x4_trans((uint32_t)__cvta_generic_to_shared(
                                  vs_rows + (ri + 8 * (mi & 1)) * S::kStride + 16 * u + 8 * (mi >> 1)),
                              b0, b1, b2, b3);
            mma16816(o[2 * u], pa, b0, b1);
            mma16816(o[2 * u + 1], pa, b2, b3);
        }
    }
    cp_async_wait<0>();
    __syncthreads(); /* the stages are free: the warps' shares go there */

    float *ms = reinterpret_cast<float *>(smem_raw);  /* [warp][16]     */
    float *ls = ms + kWarps * 16;                     /* [warp][16]     */
    float *os = ls + kWarps * 16;                     /* [warp][16][HD] */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
        if (t4 == 0) {
            ms[warp * 16 + g + 8 * h] = m[h];
            ls[warp * 16 + g + 8 * h] = l[h];
        }
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            os[(warp * 16 + g + 8 * (e >> 1)) * HD + 8 * n + 2 * t4 + (e & 1)] = o[n][e];
    __syncthreads();
    for (int i = threadIdx.x; i < group * HD; i += kWarps * 32) {
        const int r = i / HD, d = i % HD;
        float mmax = -INFINITY;
        for (int w = 0; w < kWarps; w++)
            mmax = fmaxf(mmax, ms[w * 16 + r]);
        float num = 0.f, den = 0.f;
        for (int w = 0; w < kWarps; w++) {
            const float mw = ms[w * 16 + r];
            const float f = mw == -INFINITY ? 0.0f : __expf(mw - mmax);
            num = fmaf(f, os[(w * 16 + r) * HD + d], num);
            den = fmaf(f, ls[w * 16 + r], den);
        }
        const int h = kvh * group + r;
        if (gridDim.z == 1) {
            out[(int64_t)row * ldo + (int64_t)h * HD + d] = num / den;
        } else {
            float *pr = part + (((int64_t)row * n_heads + h) * gridDim.z + split) * (HD + 4);
            pr[d] = num;
            if (d == 0) {
                pr[HD] = mmax;
                pr[HD + 1] = den;
            }
        }
    }
}

/* The shares of a row's splits combined in split order (as src's paged_merge). */
__global__ void merge_len(int n_heads, int hd, int splits, int split_len,
                          const int32_t *__restrict__ row_pos, const float *__restrict__ part,
                          float *__restrict__ out, int64_t ldo)
{
    const int row = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    int span;
    const int used = row_splits_len(row_pos[row], splits, split_len, &span);
    const float *pr = part + ((int64_t)row * n_heads + h) * splits * (hd + 4);
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

struct Shape {
    int n_heads, n_kv, hd, bs;
};

/* A batch: n_rows sequences of random lengths in [min_len, max_len] (each
 * row the last position of its sequence), blocks scattered over the cache. */
struct Batch {
    Shape s;
    int n_rows, max_blocks, n_blocks, max_len;
    std::vector<int32_t> seq, pos, tables;
    std::vector<float> q, k, v; /* k, v: the fp16 cache's values */
    int64_t touched = 0;        /* K and V elements the rows read */
};

Batch make_batch(const Shape &s, int n_rows, int min_len, int max_len)
{
    Batch b;
    b.s = s;
    b.n_rows = n_rows;
    b.max_len = max_len;
    b.max_blocks = (max_len + s.bs - 1) / s.bs;
    b.n_blocks = n_rows * b.max_blocks;
    std::vector<int32_t> order(b.n_blocks);
    for (int i = 0; i < b.n_blocks; i++)
        order[i] = i;
    for (int i = b.n_blocks - 1; i > 0; i--)
        std::swap(order[i], order[(size_t)lab_rand_range(0, i)]);
    b.tables.assign((size_t)n_rows * b.max_blocks, -1);
    const int64_t kv_dim = (int64_t)s.n_kv * s.hd;
    for (int r = 0; r < n_rows; r++) {
        b.seq.push_back(r);
        const int len = (int)lab_rand_range(min_len, max_len);
        b.pos.push_back(len - 1);
        for (int i = 0; i < (len + s.bs - 1) / s.bs; i++)
            b.tables[(size_t)r * b.max_blocks + i] = order[(size_t)r * b.max_blocks + i];
        b.touched += (int64_t)len * kv_dim * 2;
    }
    const int64_t rows = (int64_t)b.n_blocks * s.bs;
    b.k.resize((size_t)(rows * kv_dim));
    b.v.resize((size_t)(rows * kv_dim));
    b.q.resize((size_t)n_rows * s.n_heads * s.hd);
    for (auto &x : b.k)
        x = __half2float(__float2half((float)lab_rand_range(-1000, 1000) / 500.0f));
    for (auto &x : b.v)
        x = __half2float(__float2half((float)lab_rand_range(-1000, 1000) / 1000.0f));
    for (auto &x : b.q)
        x = (float)lab_rand_range(-1000, 1000) / 300.0f;
    return b;
}

std::vector<float> reference(const Batch &b)
{
    const Shape &s = b.s;
    const int group = s.n_heads / s.n_kv;
    const int64_t kv_dim = (int64_t)s.n_kv * s.hd;
    std::vector<float> out((size_t)b.n_rows * s.n_heads * s.hd);
    for (int r = 0; r < b.n_rows; r++)
        for (int h = 0; h < s.n_heads; h++) {
            const float *qh = &b.q[((size_t)r * s.n_heads + h) * s.hd];
            const int64_t off = (int64_t)(h / group) * s.hd;
            std::vector<double> sc(b.pos[r] + 1);
            std::vector<int64_t> crs(b.pos[r] + 1);
            double mx = -1e300;
            for (int t = 0; t <= b.pos[r]; t++) {
                crs[t] = (int64_t)b.tables[(size_t)b.seq[r] * b.max_blocks + t / s.bs] * s.bs +
                         t % s.bs;
                double d = 0.0;
                for (int i = 0; i < s.hd; i++)
                    d += (double)qh[i] * b.k[(size_t)(crs[t] * kv_dim + off + i)];
                sc[t] = d / sqrt((double)s.hd);
                mx = sc[t] > mx ? sc[t] : mx;
            }
            double sum = 0.0;
            for (auto &x : sc)
                sum += (x = exp(x - mx));
            for (int i = 0; i < s.hd; i++) {
                double a = 0.0;
                for (int t = 0; t <= b.pos[r]; t++)
                    a += sc[t] * b.v[(size_t)(crs[t] * kv_dim + off + i)];
                out[((size_t)r * s.n_heads + h) * s.hd + i] = (float)(a / sum);
            }
        }
    return out;
}

struct Device {
    float *q, *out, *ws, *k32, *v32;
    __half *k16, *v16;
    int32_t *seq, *pos, *tables;
};

Device to_device(const Batch &b, bool with_f32)
{
    Device d{};
    d.q = upload(b.q);
    std::vector<__half> k16(b.k.size()), v16(b.v.size());
    for (size_t i = 0; i < b.k.size(); i++)
        k16[i] = __float2half(b.k[i]), v16[i] = __float2half(b.v[i]);
    d.k16 = upload(k16);
    d.v16 = upload(v16);
    if (with_f32) {
        d.k32 = upload(b.k);
        d.v32 = upload(b.v);
    }
    d.seq = upload(b.seq);
    d.pos = upload(b.pos);
    d.tables = upload(b.tables);
    CUDA_CHECK(cudaMalloc((void **)&d.out, b.q.size() * sizeof(float)));
    CUDA_CHECK(cudaMemset(d.out, 0xff, b.q.size() * sizeof(float))); /* poisoned: NaN */
    CUDA_CHECK(cudaMalloc((void **)&d.ws, bn_cb_attn_paged_workspace_bytes(b.s.n_heads, b.s.hd)));
    return d;
}

void free_device(Device &d)
{
    cudaFree(d.q), cudaFree(d.out), cudaFree(d.ws), cudaFree(d.k32), cudaFree(d.v32);
    cudaFree(d.k16), cudaFree(d.v16), cudaFree(d.seq), cudaFree(d.pos), cudaFree(d.tables);
}

/* A way to run the batch's attention: the shipped kernel (fp32 or fp16
 * cache), or the mma kernel with STAGES stages and ranges of split_len. */
struct Variant {
    const char *name;
    int kind; /* 0 shipped fp32, 1 shipped fp16, 2 mma */
    int stages, split_len;
};

int mma_splits(int n_rows, int max_len, int split_len)
{
    int splits = (max_len + split_len - 1) / split_len;
    splits = splits > 64 ? 64 : splits;
    while (splits > 1 && (int64_t)splits * n_rows > BN_CB_ATTN_PAGED_SHARES)
        splits--;
    return splits;
}

template <int HD, int STAGES>
void launch_mma(const Batch &b, const Device &d, int split_len, cudaStream_t st)
{
    const Shape &s = b.s;
    const size_t smem = mma_smem<HD, STAGES>();
    CUDA_CHECK(cudaFuncSetAttribute(attn_paged_mma<HD, STAGES>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int splits = mma_splits(b.n_rows, b.max_len, split_len);
    const int64_t ld = (int64_t)s.n_heads * s.hd;
    attn_paged_mma<HD, STAGES><<<dim3(b.n_rows, s.n_kv, splits), kWarps * 32, smem, st>>>(
        s.n_heads, s.n_kv, d.q, ld, d.seq, d.pos, d.tables, b.max_blocks, s.bs, d.k16, d.v16,
        (float)(1.0 / sqrt((double)HD)), split_len, d.out, ld, d.ws);
    CUDA_CHECK(cudaGetLastError());
    if (splits > 1) {
        merge_len<<<dim3(b.n_rows, s.n_heads), HD, 0, st>>>(s.n_heads, HD, splits, split_len,
                                                           d.pos, d.ws, d.out, ld);
        CUDA_CHECK(cudaGetLastError());
    }
}

void run(const Variant &v, const Batch &b, const Device &d, cudaStream_t st)
{
    const Shape &s = b.s;
    const int64_t ld = (int64_t)s.n_heads * s.hd;
    if (v.kind < 2) {
        const bn_cb_attn_shape as = {s.n_heads, s.n_kv, s.hd, 0};
        /* split_len: ranges of about that many positions instead of the
         * shipped choice (~128). */
        const int splits = v.split_len
                               ? mma_splits(b.n_rows, b.max_len, v.split_len)
                               : bn_cb_attn_paged_splits(b.n_rows, b.max_len - 1, s.n_kv, 0);
        CUDA_CHECK(bn_cb_attn_paged(&as, d.q, ld, b.n_rows, d.seq, d.pos, d.tables, b.max_blocks,
                                    s.bs, v.kind ? (const void *)d.k16 : d.k32,
                                    v.kind ? (const void *)d.v16 : d.v32, v.kind, splits, NULL,
                                    d.out, ld, d.ws, st));
        return;
    }
    if (s.hd == 128)
        v.stages == 2 ? launch_mma<128, 2>(b, d, v.split_len, st)
                      : launch_mma<128, 3>(b, d, v.split_len, st);
    else
        v.stages == 2 ? launch_mma<64, 2>(b, d, v.split_len, st)
                      : launch_mma<64, 3>(b, d, v.split_len, st);
}

bool check(const Variant &v, const Shape &s, int n_rows, int min_len, int max_len)
{
    Batch b = make_batch(s, n_rows, min_len, max_len);
    Device d = to_device(b, v.kind == 0);
    run(v, b, d, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got(b.q.size());
    CUDA_CHECK(cudaMemcpy(got.data(), d.out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const std::vector<float> want = reference(b);
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); i++) {
        const double e = fabs((double)got[i] - want[i]);
        worst = !(e <= worst) ? e : worst; /* NaN wins */
    }
    free_device(d);
    const double tol = v.kind == 2 ? 4e-3 : 2e-5;
    const bool ok = worst <= tol;
    printf("check %-22s heads %2d/%d hd %3d block %2d, %2d rows of %3d-%4d positions: max |err| "
           "%.2e %s\n",
           v.name, s.n_heads, s.n_kv, s.hd, s.bs, n_rows, min_len, max_len, worst,
           ok ? "ok" : "FAIL");
    return ok;
}

void time_variant(const Variant &v, const Batch &b, const Device &d, double copy_rate)
{
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreate(&st));
    run(v, b, d, st);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    const int calls = 20;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++)
        run(v, b, d, st);
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int rep = 0; rep < 3; rep++) {
        CUDA_CHECK(cudaEventRecord(e0, st));
        CUDA_CHECK(cudaGraphLaunch(ge, st));
        CUDA_CHECK(cudaEventRecord(e1, st));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        best = ms < best ? ms : best;
    }
    const double us = best * 1e3 / calls;
    const double bytes = (double)b.touched * (v.kind == 0 ? 4 : 2);
    const double gbs = bytes / (us * 1e-6) / 1e9;
    printf("time %-22s %3d rows x %4d positions: %8.1f us a layer, %6.0f GB/s of K and V (%3.0f "
           "%% of copy)\n",
           v.name, b.n_rows, b.max_len, us, gbs, 100.0 * gbs / copy_rate);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(st);
}

} // namespace

int main(int argc, char **argv)
{
    const Variant variants[] = {
        {"shipped fp32", 0, 0, 0},       {"shipped fp16", 1, 0, 0},
        {"shipped fp16, 256", 1, 0, 256}, {"shipped fp32, 256", 0, 0, 256},
        {"mma 2 stages, 128", 2, 2, 128}, {"mma 2 stages, 256", 2, 2, 256},
        {"mma 3 stages, 128", 2, 3, 128}, {"mma 3 stages, 256", 2, 3, 256},
    };
    bool ok = true;
    for (const Variant &v : variants) {
        ok &= check(v, {20, 5, 128, 32}, 9, 1, 300);
        ok &= check(v, {20, 5, 128, 16}, 5, 30, 70);
        ok &= check(v, {8, 2, 64, 32}, 12, 1, 200);
        ok &= check(v, {4, 4, 128, 64}, 3, 60, 130);
        ok &= check(v, {32, 2, 128, 16}, 4, 100, 700); /* 16 q heads a kv head */
    }
    if (!ok) {
        printf("FAILED\n");
        return 1;
    }
    const double copy = copy_gbs();
    printf("copy bandwidth %.0f GB/s (read + write)\n", copy);
    const int len = argc > 1 ? atoi(argv[1]) : 577;
    for (int rows : {1, 8, 64, 256}) {
        Batch b = make_batch({20, 5, 128, 32}, rows, len, len);
        Device d = to_device(b, true);
        for (const Variant &v : variants)
            time_variant(v, b, d, copy);
        free_device(d);
    }
    return 0;
}
