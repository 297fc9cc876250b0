/*
 * attn_paged.cu - lab: decode attention for many sequences at once over a
 * paged fp32 KV cache in its simplest form: one block per (row, kv head)
 * over every position, tiles staged through registers. The shipped kernel
 * (src/cuda/attn_paged.cu) splits the positions into merged ranges and
 * copies tiles by cp.async into double buffers; this form is the baseline
 * its timing is compared with.
 *
 * Row r is one token of sequence seq[r] at position pos[r]; its keys and
 * values for positions 0..pos[r] live in cache rows
 * table[seq][t / bs] * bs + t % bs. One block per (row, kv head): its warps
 * are the q heads that share the kv head (GQA), so each cache row is read
 * once for all of them. The block gathers tiles of 32 positions through
 * the table into shared memory; each warp scores the tile's keys (lane j:
 * key j), keeps an online softmax and accumulates p . V (lane l: the
 * head's float4 chunk l).
 *
 * The check: every row and head against a double-precision CPU reference
 * (random sequences, lengths and block tables, blocks scattered). The
 * timing: 64 sequences of 640 positions on the 2B-4T head shape (20 / 5
 * heads of 128), one layer's cache (210 MB, beyond L2), against the
 * device's copy bandwidth measured in the same run.
 *
 *   make -C dev/cuda attn_paged && dev/cuda/attn_paged [rows] [ctx]
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "common.cuh"

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

struct Shape {
    int n_heads, n_kv, hd, bs;
};

size_t smem_bytes(const Shape &s)
{
    return sizeof(float) * ((size_t)(s.n_heads / s.n_kv) * s.hd + 2 * (size_t)kTile * (s.hd + 4));
}

void launch(const Shape &s, int n_rows, const float *q, const int32_t *seq, const int32_t *pos,
            const int32_t *tables, int max_blocks, const float *kc, const float *vc, float *out,
            cudaStream_t st)
{
    const dim3 grid((unsigned)n_rows, (unsigned)s.n_kv), block(32 * (s.n_heads / s.n_kv));
    const float scale = (float)(1.0 / sqrt((double)s.hd));
    const int64_t ld = (int64_t)s.n_heads * s.hd;
    if (s.hd == 128)
        attn_paged_kernel<128><<<grid, block, smem_bytes(s), st>>>(
            s.n_heads, s.n_kv, q, ld, seq, pos, tables, max_blocks, s.bs, kc, vc, scale, out, ld);
    else
        attn_paged_kernel<64><<<grid, block, smem_bytes(s), st>>>(
            s.n_heads, s.n_kv, q, ld, seq, pos, tables, max_blocks, s.bs, kc, vc, scale, out, ld);
    CUDA_CHECK(cudaGetLastError());
}

/* A batch: n_seqs sequences of random lengths up to max_len (each row the
 * last position of its sequence), their blocks scattered over the cache. */
struct Batch {
    Shape s;
    int n_rows, max_blocks, n_blocks;
    std::vector<int32_t> seq, pos, tables;
    std::vector<float> q, k, v;
    int64_t touched_bytes = 0; /* K and V bytes the rows read */
};

Batch make_batch(const Shape &s, int n_rows, int min_len, int max_len)
{
    Batch b;
    b.s = s;
    b.n_rows = n_rows;
    b.max_blocks = (max_len + s.bs - 1) / s.bs;
    b.n_blocks = n_rows * b.max_blocks;
    std::vector<int32_t> order(b.n_blocks);
    for (int i = 0; i < b.n_blocks; i++)
        order[i] = i;
    for (int i = b.n_blocks - 1; i > 0; i--) {
        const int j = (int)lab_rand_range(0, i);
        std::swap(order[i], order[j]);
    }
    b.tables.assign((size_t)n_rows * b.max_blocks, -1);
    const int64_t kv_dim = (int64_t)s.n_kv * s.hd;
    for (int r = 0; r < n_rows; r++) {
        b.seq.push_back(r);
        const int len = (int)lab_rand_range(min_len, max_len);
        b.pos.push_back(len - 1);
        for (int i = 0; i < (len + s.bs - 1) / s.bs; i++)
            b.tables[(size_t)r * b.max_blocks + i] = order[(size_t)r * b.max_blocks + i];
        b.touched_bytes += (int64_t)len * kv_dim * 2 * (int64_t)sizeof(float);
    }
    const int64_t rows = (int64_t)b.n_blocks * s.bs;
    b.k.resize((size_t)(rows * kv_dim));
    b.v.resize((size_t)(rows * kv_dim));
    b.q.resize((size_t)n_rows * s.n_heads * s.hd);
    for (auto &x : b.k)
        x = (float)lab_rand_range(-1000, 1000) / 500.0f;
    for (auto &x : b.v)
        x = (float)lab_rand_range(-1000, 1000) / 1000.0f;
    for (auto &x : b.q)
        x = (float)lab_rand_range(-1000, 1000) / 700.0f;
    return b;
}

/* Double-precision attention of every row and head. */
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
            double mx = -1e300;
            for (int t = 0; t <= b.pos[r]; t++) {
                const int64_t cr =
                    (int64_t)b.tables[(size_t)b.seq[r] * b.max_blocks + t / s.bs] * s.bs +
                    t % s.bs;
                double d = 0.0;
                for (int i = 0; i < s.hd; i++)
                    d += (double)qh[i] * b.k[(size_t)(cr * kv_dim + off + i)];
                sc[t] = d / sqrt((double)s.hd);
                mx = sc[t] > mx ? sc[t] : mx;
            }
            double sum = 0.0;
            for (auto &x : sc)
                sum += (x = exp(x - mx));
            for (int i = 0; i < s.hd; i++) {
                double a = 0.0;
                for (int t = 0; t <= b.pos[r]; t++) {
                    const int64_t cr =
                        (int64_t)b.tables[(size_t)b.seq[r] * b.max_blocks + t / s.bs] * s.bs +
                        t % s.bs;
                    a += sc[t] * b.v[(size_t)(cr * kv_dim + off + i)];
                }
                out[((size_t)r * s.n_heads + h) * s.hd + i] = (float)(a / sum);
            }
        }
    return out;
}

struct Device {
    float *q, *k, *v, *out;
    int32_t *seq, *pos, *tables;
};

Device to_device(const Batch &b)
{
    Device d;
    d.q = upload(b.q);
    d.k = upload(b.k);
    d.v = upload(b.v);
    d.seq = upload(b.seq);
    d.pos = upload(b.pos);
    d.tables = upload(b.tables);
    CUDA_CHECK(cudaMalloc((void **)&d.out, b.q.size() * sizeof(float)));
    CUDA_CHECK(cudaMemset(d.out, 0xff, b.q.size() * sizeof(float))); /* poisoned: NaN */
    return d;
}

void free_device(Device &d)
{
    cudaFree(d.q), cudaFree(d.k), cudaFree(d.v), cudaFree(d.out);
    cudaFree(d.seq), cudaFree(d.pos), cudaFree(d.tables);
}

bool check(const Shape &s, int n_rows, int min_len, int max_len)
{
    Batch b = make_batch(s, n_rows, min_len, max_len);
    Device d = to_device(b);
    CUDA_CHECK(cudaFuncSetAttribute(attn_paged_kernel<128>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    CUDA_CHECK(cudaFuncSetAttribute(attn_paged_kernel<64>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    launch(s, n_rows, d.q, d.seq, d.pos, d.tables, b.max_blocks, d.k, d.v, d.out, 0);
    std::vector<float> got(b.q.size());
    CUDA_CHECK(cudaMemcpy(got.data(), d.out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const std::vector<float> want = reference(b);
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); i++) {
        const double e = fabs((double)got[i] - want[i]);
        worst = !(e <= worst) ? e : worst; /* NaN wins */
    }
    free_device(d);
    const bool ok = worst <= 2e-5;
    printf("check heads %d/%d hd %d block %d, %d rows of %d-%d positions: max |err| %.2e %s\n",
           s.n_heads, s.n_kv, s.hd, s.bs, n_rows, min_len, max_len, worst, ok ? "ok" : "FAIL");
    return ok;
}

void time_batch(const Shape &s, int n_rows, int len, double copy_rate)
{
    Batch b = make_batch(s, n_rows, len, len);
    Device d = to_device(b);
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreate(&st));
    launch(s, n_rows, d.q, d.seq, d.pos, d.tables, b.max_blocks, d.k, d.v, d.out, st);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    const int calls = 20;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++)
        launch(s, n_rows, d.q, d.seq, d.pos, d.tables, b.max_blocks, d.k, d.v, d.out, st);
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, st));
    CUDA_CHECK(cudaGraphLaunch(ge, st));
    CUDA_CHECK(cudaEventRecord(e1, st));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = ms * 1e3 / calls;
    const double gbs = (double)b.touched_bytes / (us * 1e-6) / 1e9;
    printf("time %3d rows x %4d positions, heads %d/%d hd %d: %8.1f us a layer, %6.0f GB/s of K "
           "and V read (%2.0f %% of copy)\n",
           n_rows, len, s.n_heads, s.n_kv, s.hd, us, gbs, 100.0 * gbs / copy_rate);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(st);
    free_device(d);
}

} // namespace

int main(int argc, char **argv)
{
    bool ok = true;
    ok &= check({20, 5, 128, 32}, 9, 1, 200);
    ok &= check({20, 5, 128, 16}, 5, 30, 70);
    ok &= check({8, 2, 64, 32}, 12, 1, 100);
    ok &= check({4, 4, 128, 64}, 3, 60, 130);
    if (!ok) {
        printf("FAILED\n");
        return 1;
    }
    const double copy = copy_gbs();
    printf("copy bandwidth %.0f GB/s (read + write)\n", copy);
    const int rows = argc > 1 ? atoi(argv[1]) : 64, len = argc > 2 ? atoi(argv[2]) : 640;
    for (int r : {1, 8, 32, 64})
        if (r <= rows)
            time_batch({20, 5, 128, 32}, r, len, copy);
    return 0;
}
