/*
 * cuda_backend_kernels.cu - the CUDA backend's own kernels: RMSNorm +
 * quantization with the CPU backend's exact rounding rule (three row
 * sources), the final RMSNorm, the q/k/v epilogue with RoPE and the KV
 * cache store, attention over an fp32 cache (decode and prefill), and the
 * LM head with fp32 activations. Contracts: cuda_backend_kernels.h.
 *
 * As in ops_kernels.cu, every fp32 operation the CPU performs separately
 * is written with an __f*_rn intrinsic, because nvcc would otherwise fuse
 * a multiply and an add into one FMA with a single rounding, and the codes
 * of the next quantization would then differ from the CPU's. Double
 * operations use __d*_rn for the same reason.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kNormThreads = 512;
constexpr float kQuantEps = 1e-5f; /* BN_QUANT_EPS */

/* ---- block reductions (every thread gets the result) ------------------------- */

struct SumD {
    __device__ double operator()(double a, double b) const { return __dadd_rn(a, b); }
};
struct MaxF {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumI {
    __device__ int operator()(int a, int b) const { return a + b; }
};
struct SumF {
    __device__ float operator()(float a, float b) const { return a + b; }
};

template <typename T, typename Op> __device__ T warp_reduce(T v, Op op)
{
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(kFull, v, o));
    return v;
}

/* red: 32 shared slots. The trailing barrier lets the caller reuse them. */
template <typename T, typename Op> __device__ T block_reduce(T v, Op op, T *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_reduce(v, op);
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    T r = red[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++)
        r = op(r, red[i]);
    __syncthreads();
    return r;
}

/* The sum of ss and the maximum of umax over the block in one round (one
 * barrier pair instead of two: the norm kernels are latency-bound on a
 * single row). fmax returns the other operand for a NaN, as the CPU's
 * `u > umax` skips it. red: 64 shared slots. */
__device__ void block_sum_max(double &ss, double &umax, double *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        ss = __dadd_rn(ss, __shfl_xor_sync(kFull, ss, o));
        umax = fmax(umax, __shfl_xor_sync(kFull, umax, o));
    }
    if (lane == 0) {
        red[warp] = ss;
        red[32 + warp] = umax;
    }
    __syncthreads();
    ss = red[0];
    umax = red[32];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) {
        ss = __dadd_rn(ss, red[i]);
        umax = fmax(umax, red[32 + i]);
    }
    __syncthreads();
}

/* ---- RMSNorm + quantization ----------------------------------------------------- */

constexpr int kSrcPlain = 0, kSrcAdd = 1, kSrcRelu2 = 2;

struct NormQuantArgs {
    float *x;        /* plain / add: the row source (add writes x + r back) */
    int64_t ldx;
    const float *r;  /* add: the residual to add                           */
    int64_t ldr;
    const float *g, *u; /* relu2: raw gate and up rows                     */
    int64_t ldgu;
    float sg, su;
    int64_t k;
    const float *w;
    float eps;
    int8_t *q;
    int64_t ldq;
    float *scale;
    int32_t *sum;
};

/* Value i of row `row` for the first pass (which, for kSrcAdd, performs the
 * add and stores it) and for the later passes (which read it back: the
 * same thread wrote it, so no barrier is needed). */
template <int kSrc>
__device__ __forceinline__ float source_value(const NormQuantArgs &a, int64_t row, int64_t i,
                                              bool first)
{
    if (kSrc == kSrcPlain)
        return a.x[row * a.ldx + i];
    if (kSrc == kSrcAdd) {
        float *p = a.x + row * a.ldx + i;
        if (!first)
            return *p;
        const float v = __fadd_rn(*p, a.r[row * a.ldr + i]);
        *p = v;
        return v;
    }
    /* relu(gate)^2 * up with gate = g * sg and up = u * su, each one fp32
     * rounding as in the CPU's epilogue; a NaN gate counts as 0. */
    const float gate = __fmul_rn(a.g[row * a.ldgu + i], a.sg);
    const float up = __fmul_rn(a.u[row * a.ldgu + i], a.su);
    const float rg = gate > 0.0f ? gate : 0.0f;
    return __fmul_rn(__fmul_rn(rg, rg), up);
}

/* 1 / sqrtf((float)(ss / n) + eps), as the CPU writes it. */
__device__ __forceinline__ float inv_rms(double ss, int64_t n, float eps)
{
    const float mean = __double2float_rn(__ddiv_rn(ss, (double)n));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

template <int kSrc>
__global__ void __launch_bounds__(kNormThreads) norm_quantize_kernel(NormQuantArgs a)
{
    __shared__ double red_d[64];
    __shared__ float red_f[32];
    __shared__ int red_i[32];
    const int64_t row = blockIdx.x;
    const int64_t k = a.k;
    const float *w = a.w;

    /* Pass 1: sum of squares and max |w x|, both exact per element in
     * double. */
    double ss = 0.0, umax = 0.0;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads) {
        const float v = source_value<kSrc>(a, row, i, true);
        ss = __dadd_rn(ss, __dmul_rn((double)v, (double)v));
        umax = fmax(umax, fabs(__dmul_rn((double)w[i], (double)v)));
    }
    block_sum_max(ss, umax, red_d);
    const float inv = inv_rms(ss, k, a.eps);

    /* Pass 2: the largest normed value in fp32 (sets the scale). */
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads) {
        const float v = source_value<kSrc>(a, row, i, false);
        amax = fmaxf(amax, fabsf(__fmul_rn(w[i], __fmul_rn(v, inv))));
    }
    amax = block_reduce(amax, MaxF(), red_f);

    /* Pass 3: the codes. The exact rule needs a usable maximum; tiny or
     * non-finite rows take the plain fp32 rule, as on the CPU. */
    const bool exact = amax >= kQuantEps && umax > 0.0 && isfinite(umax);
    const float s = exact ? __fdiv_rn(127.0f, amax)
                          : __fdiv_rn(127.0f, amax >= kQuantEps ? amax : kQuantEps);
    int8_t *out = a.q + row * a.ldq;
    int total = 0;
    for (int64_t i = threadIdx.x; i < a.ldq; i += kNormThreads) {
        int val = 0;
        if (i < k) {
            const float v = source_value<kSrc>(a, row, i, false);
            if (exact) {
                const double ratio = __ddiv_rn(__dmul_rn((double)w[i], (double)v), umax);
                val = (int)rint(__dmul_rn(127.0, ratio));
            } else {
                const float t = rintf(__fmul_rn(__fmul_rn(w[i], __fmul_rn(v, inv)), s));
                val = t != t ? 0 : t > 127.0f ? 127 : t < -128.0f ? -128 : (int)t;
            }
        }
        out[i] = (int8_t)val;
        total += val;
    }
    total = block_reduce(total, SumI(), red_i);
    if (threadIdx.x == 0) {
        a.scale[row] = s;
        a.sum[row] = total;
    }
}

template <int kSrc> cudaError_t launch_norm_quantize(const NormQuantArgs &a, int64_t m,
                                                     cudaStream_t stream)
{
    if (m < 0 || m > INT32_MAX || a.k <= 0 || a.ldq < a.k || !a.w || !a.q || !a.scale || !a.sum)
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    norm_quantize_kernel<kSrc><<<(unsigned)m, kNormThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

/* x += r (when r), then y = w * (x * inv). */
__global__ void __launch_bounds__(kNormThreads)
    add_rmsnorm_kernel(float *x, int64_t ldx, const float *r, int64_t ldr, int64_t k,
                       const float *__restrict__ w, float eps, float *y, int64_t ldy)
{
    __shared__ double red_d[32];
    float *xr = x + (int64_t)blockIdx.x * ldx;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads) {
        float v = xr[i];
        if (r) {
            v = __fadd_rn(v, r[(int64_t)blockIdx.x * ldr + i]);
            xr[i] = v;
        }
        ss = __dadd_rn(ss, __dmul_rn((double)v, (double)v));
    }
    ss = block_reduce(ss, SumD(), red_d);
    const float inv = inv_rms(ss, k, eps);
    float *yr = y + (int64_t)blockIdx.x * ldy;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads)
        yr[i] = __fmul_rn(w[i], __fmul_rn(xr[i], inv));
}

/* ---- q, k, v epilogue --------------------------------------------------------------- */

template <bool kHalf> __device__ __forceinline__ void store_kv(void *cache, int64_t i, float v)
{
    if (kHalf)
        static_cast<__half *>(cache)[i] = __float2half_rn(v);
    else
        static_cast<float *>(cache)[i] = v;
}

/* One block per token row: the row's cos/sin table, then every value of
 * q, k and v. A RoPE pair (j, j + half) is handled by the thread of j. */
template <bool kHalf>
__global__ void __launch_bounds__(256)
    qkv_post_kernel(const float *__restrict__ raw, int64_t ldraw, bn_cb_qkv_shape s,
                    bn_rope_freqs freqs, const int32_t *__restrict__ pos, float *q_out,
                    int64_t ldq, void *k_cache, void *v_cache)
{
    __shared__ float table[BN_ROPE_MAX_DIM]; /* cos [0, half), sin [half, 2 half) */
    const int64_t t = blockIdx.x;
    const int p = pos[t];
    const int half = freqs.rope_dim / 2;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        /* The CPU's angle, (float)pos * inv_freq[j] in fp32; cos and sin in
         * double, rounded once to float (cosf/sinf of the same float). */
        const float angle = __fmul_rn((float)p, freqs.inv_freq[j]);
        double sn, cs;
        sincos((double)angle, &sn, &cs);
        table[j] = __double2float_rn(cs);
        table[half + j] = __double2float_rn(sn);
    }
    __syncthreads();

    const int hd = s.head_dim;
    const int64_t q_dim = (int64_t)s.n_heads * hd, kv_dim = (int64_t)s.n_kv_heads * hd;
    const int64_t total = q_dim + 2 * kv_dim;
    const bool store = p >= 0 && (int64_t)p < s.capacity;
    const float *row = raw + t * ldraw;
    float *qrow = q_out + t * ldq;
    const int64_t cache_row = (int64_t)p * kv_dim;

    for (int64_t idx = threadIdx.x; idx < total; idx += blockDim.x) {
        int region; /* 0 q, 1 k, 2 v */
        int64_t local;
        if (idx < q_dim) {
            region = 0;
            local = idx;
        } else if (idx < q_dim + kv_dim) {
            region = 1;
            local = idx - q_dim;
        } else {
            region = 2;
            local = idx - q_dim - kv_dim;
        }
        const float sc = region == 0 ? s.scale_q : region == 1 ? s.scale_k : s.scale_v;
        const int d = (int)(local % hd);
        const int64_t head_base = local - d;
        const float *src = row + (idx - local); /* start of the region */
        if (region != 2 && d < freqs.rope_dim) {
            if (d >= half)
                continue; /* the partner (d - half) writes this one */
            const float x0 = __fmul_rn(src[head_base + d], sc);
            const float x1 = __fmul_rn(src[head_base + d + half], sc);
            const float c = table[d], sn = table[half + d];
            const float o0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
            const float o1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, sn));
            if (region == 0) {
                qrow[head_base + d] = o0;
                qrow[head_base + d + half] = o1;
            } else if (store) {
                store_kv<kHalf>(k_cache, cache_row + head_base + d, o0);
                store_kv<kHalf>(k_cache, cache_row + head_base + d + half, o1);
            }
        } else {
            const float v = __fmul_rn(src[local], sc);
            if (region == 0)
                qrow[local] = v;
            else if (store)
                store_kv<kHalf>(region == 1 ? k_cache : v_cache, cache_row + local, v);
        }
    }
}

/* ---- attention over an fp32 cache ------------------------------------------------- */

constexpr int kAttnWarps = 4;
constexpr int kMinRange = 32;
constexpr int kMaxSplits = 64;
constexpr int kMaxChunks = 2; /* float4 chunks per lane: head_dim <= 256 */

__device__ __forceinline__ float4 f4_scale(float4 a, float c)
{
    return make_float4(a.x * c, a.y * c, a.z * c, a.w * c);
}

__device__ __forceinline__ float4 f4_axpy(float p, float4 v, float4 acc)
{
    return make_float4(fmaf(p, v.x, acc.x), fmaf(p, v.y, acc.y), fmaf(p, v.z, acc.z),
                       fmaf(p, v.w, acc.w));
}

__device__ __forceinline__ float f4_dot(float4 a, float4 b, float acc)
{
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

/* The range of positions of split `split` for a length len. */
__device__ __forceinline__ void split_range(int len, int splits, int split, int *begin, int *end)
{
    int chunk = (len + splits - 1) / splits;
    chunk = chunk < kMinRange ? kMinRange : chunk;
    const int64_t b = (int64_t)split * chunk;
    *begin = b < len ? (int)b : len;
    *end = (int64_t)*begin + chunk < len ? *begin + chunk : len;
}

/* grid (n_heads, splits), kAttnWarps warps. Each warp walks the positions
 * begin + warp, + kAttnWarps, ... with its own online softmax; the warps
 * then merge in shared memory and the block writes (max, sum, acc) of its
 * range to the workspace. Lane l owns the float4 chunks l and l + 32 of the
 * head. */
__global__ void __launch_bounds__(32 * kAttnWarps)
    attn_decode_kernel(bn_cb_attn_shape s, const float *__restrict__ q,
                       const float *__restrict__ kc, const float *__restrict__ vc,
                       const int32_t *__restrict__ kv_len, int splits, float scale,
                       float *__restrict__ ws_ml, float *__restrict__ ws_acc)
{
    __shared__ float sm_m[kAttnWarps], sm_l[kAttnWarps];
    __shared__ float4 sm_acc[kAttnWarps][64];
    const int h = blockIdx.x, split = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hd = s.head_dim, nc = hd / 4;
    const int group = s.n_heads / s.n_kv_heads;
    const int64_t kv_dim = (int64_t)s.n_kv_heads * hd;
    const int64_t head_off = (int64_t)(h / group) * hd;
    int len = *kv_len;
    len = len < 0 ? 0 : (int64_t)len > s.capacity ? (int)s.capacity : len;
    int begin, end;
    split_range(len, splits, split, &begin, &end);

    float4 qv[kMaxChunks], acc[kMaxChunks];
#pragma unroll
    for (int c = 0; c < kMaxChunks; c++) {
        const int ch = lane + 32 * c;
        qv[c] = ch < nc ? reinterpret_cast<const float4 *>(q + (int64_t)h * hd)[ch]
                        : make_float4(0.f, 0.f, 0.f, 0.f);
        acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float m = -INFINITY, l = 0.0f;
    for (int t = begin + warp; t < end; t += kAttnWarps) {
        const float4 *krow = reinterpret_cast<const float4 *>(kc + (int64_t)t * kv_dim + head_off);
        const float4 *vrow = reinterpret_cast<const float4 *>(vc + (int64_t)t * kv_dim + head_off);
        float4 kv[kMaxChunks], vv[kMaxChunks];
        float part = 0.0f;
#pragma unroll
        for (int c = 0; c < kMaxChunks; c++) {
            const int ch = lane + 32 * c;
            kv[c] = ch < nc ? krow[ch] : make_float4(0.f, 0.f, 0.f, 0.f);
            vv[c] = ch < nc ? vrow[ch] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int c = 0; c < kMaxChunks; c++)
            part = f4_dot(qv[c], kv[c], part);
        const float score = warp_reduce(part, SumF()) * scale;
        const float m_new = fmaxf(m, score);
        const float corr = expf(m - m_new); /* m == -inf: 0 */
        const float p = expf(score - m_new);
        l = fmaf(l, corr, p);
#pragma unroll
        for (int c = 0; c < kMaxChunks; c++)
            acc[c] = f4_axpy(p, vv[c], f4_scale(acc[c], corr));
        m = m_new;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int c = 0; c < kMaxChunks; c++)
        if (lane + 32 * c < nc)
            sm_acc[warp][lane + 32 * c] = acc[c];
    __syncthreads();

    float mx = -INFINITY;
    for (int w = 0; w < kAttnWarps; w++)
        mx = fmaxf(mx, sm_m[w]);
    const int64_t slot = (int64_t)h * splits + split;
    if (threadIdx.x == 0) {
        float total = 0.0f;
        if (mx != -INFINITY)
            for (int w = 0; w < kAttnWarps; w++)
                total += sm_l[w] * expf(sm_m[w] - mx);
        ws_ml[2 * slot] = mx;
        ws_ml[2 * slot + 1] = total;
    }
    for (int ch = threadIdx.x; ch < nc; ch += blockDim.x) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        if (mx != -INFINITY)
            for (int w = 0; w < kAttnWarps; w++)
                a = f4_axpy(expf(sm_m[w] - mx), sm_acc[w][ch], a);
        reinterpret_cast<float4 *>(ws_acc + slot * hd)[ch] = a;
    }
}

/* One block per head: merges the ranges. */
__global__ void __launch_bounds__(128)
    attn_combine_kernel(int hd, int splits, const float *__restrict__ ws_ml,
                        const float *__restrict__ ws_acc, float *__restrict__ out)
{
    const int h = blockIdx.x;
    float mx = -INFINITY;
    for (int sp = 0; sp < splits; sp++) {
        const int64_t slot = (int64_t)h * splits + sp;
        if (ws_ml[2 * slot + 1] > 0.0f)
            mx = fmaxf(mx, ws_ml[2 * slot]);
    }
    float total = 0.0f;
    if (mx != -INFINITY)
        for (int sp = 0; sp < splits; sp++) {
            const int64_t slot = (int64_t)h * splits + sp;
            if (ws_ml[2 * slot + 1] > 0.0f)
                total += ws_ml[2 * slot + 1] * expf(ws_ml[2 * slot] - mx);
        }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        if (total > 0.0f) {
            for (int sp = 0; sp < splits; sp++) {
                const int64_t slot = (int64_t)h * splits + sp;
                if (ws_ml[2 * slot + 1] > 0.0f)
                    a = fmaf(expf(ws_ml[2 * slot] - mx), ws_acc[slot * hd + d], a);
            }
            a = a / total;
        }
        out[(int64_t)h * hd + d] = a;
    }
}

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

/* ---- LM head ---------------------------------------------------------------------- */

constexpr int kHeadThreads = 256;
constexpr int kHeadUnroll = 4;

template <int kType> struct HeadElem;
template <> struct HeadElem<BN_CB_HEAD_F32> {
    static constexpr int kPer16 = 4;
    __device__ static float at(const void *row, int64_t i)
    {
        return static_cast<const float *>(row)[i];
    }
    __device__ static float dot16(uint4 w, const float *x, float acc)
    {
        acc = fmaf(__uint_as_float(w.x), x[0], acc);
        acc = fmaf(__uint_as_float(w.y), x[1], acc);
        acc = fmaf(__uint_as_float(w.z), x[2], acc);
        return fmaf(__uint_as_float(w.w), x[3], acc);
    }
};
template <> struct HeadElem<BN_CB_HEAD_F16> {
    static constexpr int kPer16 = 8;
    __device__ static float at(const void *row, int64_t i)
    {
        return __half2float(static_cast<const __half *>(row)[i]);
    }
    __device__ static float dot16(uint4 w, const float *x, float acc)
    {
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&words[i]));
            acc = fmaf(f.x, x[2 * i], acc);
            acc = fmaf(f.y, x[2 * i + 1], acc);
        }
        return acc;
    }
};
template <> struct HeadElem<BN_CB_HEAD_BF16> {
    static constexpr int kPer16 = 8;
    __device__ static float at(const void *row, int64_t i)
    {
        return __uint_as_float((uint32_t)static_cast<const uint16_t *>(row)[i] << 16);
    }
    __device__ static float dot16(uint4 w, const float *x, float acc)
    {
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc = fmaf(__uint_as_float(words[i] << 16), x[2 * i], acc);
            acc = fmaf(__uint_as_float(words[i] & 0xffff0000u), x[2 * i + 1], acc);
        }
        return acc;
    }
};

/* x is staged in shared memory; each warp takes whole rows (grid-stride)
 * and reads them 16 bytes per lane, kHeadUnroll loads in flight, with the
 * streaming cache hint (every row is read once per token). kVec needs
 * dim a multiple of 16 bytes' worth of elements. */
template <int kType, bool kVec>
__global__ void __launch_bounds__(kHeadThreads)
    head_kernel(const uint8_t *__restrict__ w, int64_t rows, int64_t dim,
                const float *__restrict__ x, float *__restrict__ logits)
{
    extern __shared__ __align__(16) float xs[];
    using E = HeadElem<kType>;
    const int64_t row_bytes = dim * (kType == BN_CB_HEAD_F32 ? 4 : 2);
    for (int64_t i = threadIdx.x; i < dim; i += kHeadThreads)
        xs[i] = x[i];
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (kHeadThreads / 32);
    for (int64_t r = (int64_t)blockIdx.x * (kHeadThreads / 32) + (threadIdx.x >> 5); r < rows;
         r += warps) {
        const uint8_t *row = w + r * row_bytes;
        float acc = 0.0f;
        if (kVec) {
            const uint4 *v = reinterpret_cast<const uint4 *>(row);
            const int64_t chunks = dim / E::kPer16;
            for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kHeadUnroll) {
                uint4 buf[kHeadUnroll];
#pragma unroll
                for (int u = 0; u < kHeadUnroll; u++) {
                    const int64_t c = c0 + 32 * u;
                    buf[u] = c < chunks ? __ldcs(v + c) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
                for (int u = 0; u < kHeadUnroll; u++) {
                    const int64_t c = c0 + 32 * u;
                    if (c < chunks)
                        acc = E::dot16(buf[u], xs + c * E::kPer16, acc);
                }
            }
        } else {
            for (int64_t i = lane; i < dim; i += 32)
                acc = fmaf(E::at(row, i), xs[i], acc);
        }
        acc = warp_reduce(acc, SumF());
        if (lane == 0)
            logits[r] = acc;
    }
}

template <int kType, bool kVec>
cudaError_t launch_head(const void *w, int64_t rows, int64_t dim, const float *x, float *logits,
                        int sm_count, cudaStream_t stream)
{
    const int64_t per_block = kHeadThreads / 32;
    int64_t blocks = (rows + per_block - 1) / per_block;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 132) * 8;
    blocks = blocks < cap ? blocks : cap;
    head_kernel<kType, kVec><<<(unsigned)blocks, kHeadThreads, sizeof(float) * (size_t)dim,
                               stream>>>(static_cast<const uint8_t *>(w), rows, dim, x, logits);
    return cudaGetLastError();
}

template <int kType> cudaError_t set_head_smem(int64_t dim)
{
    const size_t smem = sizeof(float) * (size_t)dim;
    if (smem <= 48 * 1024)
        return cudaSuccess;
    cudaError_t rc = cudaFuncSetAttribute(head_kernel<kType, true>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (rc == cudaSuccess)
        rc = cudaFuncSetAttribute(head_kernel<kType, false>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return rc;
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------ */

extern "C" cudaError_t bn_cb_norm_quantize(const float *x, int64_t ldx, int64_t m, int64_t k,
                                           const float *w, float eps, int8_t *q, int64_t ldq,
                                           float *scale, int32_t *sum, cudaStream_t stream)
{
    if (!x || ldx < k)
        return cudaErrorInvalidValue;
    NormQuantArgs a = {};
    a.x = const_cast<float *>(x); /* the plain source only reads */
    a.ldx = ldx;
    a.k = k;
    a.w = w;
    a.eps = eps;
    a.q = q;
    a.ldq = ldq;
    a.scale = scale;
    a.sum = sum;
    return launch_norm_quantize<kSrcPlain>(a, m, stream);
}

extern "C" cudaError_t bn_cb_add_norm_quantize(float *x, int64_t ldx, const float *r, int64_t ldr,
                                               int64_t m, int64_t k, const float *w, float eps,
                                               int8_t *q, int64_t ldq, float *scale, int32_t *sum,
                                               cudaStream_t stream)
{
    if (!x || !r || ldx < k || ldr < k)
        return cudaErrorInvalidValue;
    NormQuantArgs a = {};
    a.x = x;
    a.ldx = ldx;
    a.r = r;
    a.ldr = ldr;
    a.k = k;
    a.w = w;
    a.eps = eps;
    a.q = q;
    a.ldq = ldq;
    a.scale = scale;
    a.sum = sum;
    return launch_norm_quantize<kSrcAdd>(a, m, stream);
}

extern "C" cudaError_t bn_cb_relu2_norm_quantize(const float *g, const float *u, int64_t ldgu,
                                                 float sg, float su, int64_t m, int64_t k,
                                                 const float *w, float eps, int8_t *q,
                                                 int64_t ldq, float *scale, int32_t *sum,
                                                 cudaStream_t stream)
{
    if (!g || !u || ldgu < k)
        return cudaErrorInvalidValue;
    NormQuantArgs a = {};
    a.g = g;
    a.u = u;
    a.ldgu = ldgu;
    a.sg = sg;
    a.su = su;
    a.k = k;
    a.w = w;
    a.eps = eps;
    a.q = q;
    a.ldq = ldq;
    a.scale = scale;
    a.sum = sum;
    return launch_norm_quantize<kSrcRelu2>(a, m, stream);
}

extern "C" cudaError_t bn_cb_add_rmsnorm(float *x, int64_t ldx, const float *r, int64_t ldr,
                                         int64_t m, int64_t k, const float *w, float eps, float *y,
                                         int64_t ldy, cudaStream_t stream)
{
    if (!x || !w || !y || k <= 0 || ldx < k || ldy < k || (r && ldr < k) || m < 0 ||
        m > INT32_MAX)
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    add_rmsnorm_kernel<<<(unsigned)m, kNormThreads, 0, stream>>>(x, ldx, r, ldr, k, w, eps, y,
                                                                 ldy);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_qkv_post(const float *raw, int64_t ldraw, int64_t m,
                                      const bn_cb_qkv_shape *s, const bn_rope_freqs *freqs,
                                      const int32_t *pos, float *q_out, int64_t ldq,
                                      void *k_cache, void *v_cache, int kv_f16,
                                      cudaStream_t stream)
{
    if (!raw || !s || !freqs || !pos || !q_out || !k_cache || !v_cache || m < 0 ||
        m > INT32_MAX || s->head_dim <= 0 || s->n_heads <= 0 || s->n_kv_heads <= 0 ||
        freqs->rope_dim < 0 || freqs->rope_dim % 2 != 0 || freqs->rope_dim > s->head_dim ||
        freqs->rope_dim > BN_ROPE_MAX_DIM ||
        ldraw < (int64_t)(s->n_heads + 2 * s->n_kv_heads) * s->head_dim ||
        ldq < (int64_t)s->n_heads * s->head_dim)
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    if (kv_f16)
        qkv_post_kernel<true><<<(unsigned)m, 256, 0, stream>>>(raw, ldraw, *s, *freqs, pos, q_out,
                                                               ldq, k_cache, v_cache);
    else
        qkv_post_kernel<false><<<(unsigned)m, 256, 0, stream>>>(raw, ldraw, *s, *freqs, pos,
                                                                q_out, ldq, k_cache, v_cache);
    return cudaGetLastError();
}

static bool attn_shape_ok(const bn_cb_attn_shape *s)
{
    return s && s->n_heads > 0 && s->n_kv_heads > 0 && s->n_heads % s->n_kv_heads == 0 &&
           s->head_dim > 0 && s->head_dim % 4 == 0 && s->head_dim <= 32 * 4 * kMaxChunks &&
           s->capacity > 0 && s->capacity <= INT32_MAX;
}

extern "C" int bn_cb_attn_decode_splits(int64_t capacity)
{
    /* About 64 positions per range at the full length; at shorter lengths
     * the ranges keep at least kMinRange positions and the rest stay empty. */
    int64_t splits = (capacity + 63) / 64;
    return (int)(splits < 1 ? 1 : splits > kMaxSplits ? kMaxSplits : splits);
}

extern "C" size_t bn_cb_attn_decode_workspace_bytes(const bn_cb_attn_shape *s, int splits)
{
    if (!s || splits < 1)
        return 0;
    return sizeof(float) * (size_t)s->n_heads * (size_t)splits * (2 + (size_t)s->head_dim);
}

extern "C" cudaError_t bn_cb_attn_decode(const bn_cb_attn_shape *s, const float *q,
                                         const float *k_cache, const float *v_cache,
                                         const int32_t *kv_len, int splits, float *workspace,
                                         float *out, cudaStream_t stream)
{
    if (!attn_shape_ok(s) || !q || !k_cache || !v_cache || !kv_len || !workspace || !out ||
        splits < 1 || splits > kMaxSplits || s->n_heads > 65535)
        return cudaErrorInvalidValue;
    const float scale = (float)(1.0 / sqrt((double)s->head_dim));
    /* Accumulators first: every slot's float4 row stays 16-byte aligned. */
    float *ws_acc = workspace;
    float *ws_ml = workspace + (size_t)s->n_heads * (size_t)splits * (size_t)s->head_dim;
    attn_decode_kernel<<<dim3((unsigned)s->n_heads, (unsigned)splits), 32 * kAttnWarps, 0,
                         stream>>>(*s, q, k_cache, v_cache, kv_len, splits, scale, ws_ml, ws_acc);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    attn_combine_kernel<<<(unsigned)s->n_heads, 128, 0, stream>>>(s->head_dim, splits, ws_ml,
                                                                  ws_acc, out);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_attn_prefill_prepare(int head_dim)
{
    if (head_dim <= 0 || head_dim % 4 != 0 || head_dim > 32 * 4 * kMaxChunks)
        return cudaErrorInvalidValue;
    const size_t smem = prefill_smem(head_dim);
    if (smem <= 48 * 1024)
        return cudaSuccess;
    return cudaFuncSetAttribute(attn_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem);
}

extern "C" cudaError_t bn_cb_attn_prefill(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                          int n, const int32_t *pos, const float *k_cache,
                                          const float *v_cache, float *out, int64_t ldo,
                                          cudaStream_t stream)
{
    if (!attn_shape_ok(s) || !q || !pos || !k_cache || !v_cache || !out || n < 0 ||
        s->n_heads > 65535 || ldq < (int64_t)s->n_heads * s->head_dim ||
        ldo < (int64_t)s->n_heads * s->head_dim || ldq % 4 != 0 || ldo % 4 != 0)
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    const float scale = (float)(1.0 / sqrt((double)s->head_dim));
    const dim3 grid((unsigned)((n + kPrefillRows - 1) / kPrefillRows), (unsigned)s->n_heads);
    attn_prefill_kernel<<<grid, 32 * kAttnWarps, prefill_smem(s->head_dim), stream>>>(
        *s, q, ldq, n, pos, k_cache, v_cache, scale, out, ldo);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_head_prepare(int type, int64_t dim)
{
    if (dim <= 0 || dim > 56 * 1024)
        return cudaErrorInvalidValue;
    switch (type) {
    case BN_CB_HEAD_F32: return set_head_smem<BN_CB_HEAD_F32>(dim);
    case BN_CB_HEAD_F16: return set_head_smem<BN_CB_HEAD_F16>(dim);
    case BN_CB_HEAD_BF16: return set_head_smem<BN_CB_HEAD_BF16>(dim);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t bn_cb_head_gemv(const void *w, int type, int64_t rows, int64_t dim,
                                       const float *x, float *logits, int sm_count,
                                       cudaStream_t stream)
{
    if (!w || !x || !logits || rows <= 0 || dim <= 0 || dim > 56 * 1024)
        return cudaErrorInvalidValue;
    /* 16-byte loads need rows of a whole number of 16-byte chunks. */
    const int s = sm_count;
    switch (type) {
    case BN_CB_HEAD_F32:
        return dim % 4 == 0 ? launch_head<BN_CB_HEAD_F32, true>(w, rows, dim, x, logits, s, stream)
                            : launch_head<BN_CB_HEAD_F32, false>(w, rows, dim, x, logits, s, stream);
    case BN_CB_HEAD_F16:
        return dim % 8 == 0 ? launch_head<BN_CB_HEAD_F16, true>(w, rows, dim, x, logits, s, stream)
                            : launch_head<BN_CB_HEAD_F16, false>(w, rows, dim, x, logits, s, stream);
    case BN_CB_HEAD_BF16:
        return dim % 8 == 0 ? launch_head<BN_CB_HEAD_BF16, true>(w, rows, dim, x, logits, s, stream)
                            : launch_head<BN_CB_HEAD_BF16, false>(w, rows, dim, x, logits, s, stream);
    default:
        return cudaErrorInvalidValue;
    }
}
