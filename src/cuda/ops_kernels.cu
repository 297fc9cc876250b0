/*
 * ops_kernels.cu - the fp32 glue of a BitNet block on the GPU: RMSNorm
 * (plain, and fused with the absmax int8 quantizer), the squared-ReLU gate
 * (plain, and fused with the ffn_sub_norm and the quantizer), rotate-half
 * RoPE, residual add, fp16/bf16 row stores and embedding lookup (which
 * also dequantizes whole tables of any row format it knows, TQ2_0 included).
 * Contracts are in ops_cuda.h.
 *
 * Two rules run through the file:
 *
 *   - Every multiply and add that the CPU backend performs as a separate
 *     fp32 operation is written with the __f*_rn intrinsics. nvcc contracts
 *     a * b + c into one fused multiply-add by default, and that single
 *     rounding would make results differ from the CPU in the last bit.
 *
 *   - Reductions run in a fixed order: per-thread running sums over a
 *     fixed stride, a xor-shuffle tree inside each warp, then the warps'
 *     partials added in warp order. The norm kernels always use
 *     kNormThreads threads, so a row's result never depends on how many
 *     rows were launched with it.
 *
 * The norm kernels give a whole row to one block. The fused ones read the
 * row three times (sum of squares, absmax of the normed values, quantize)
 * and recompute the normed value each time instead of staging it in shared
 * memory: the row (10-28 KB for BitNet 2B) stays in L1, any k works, and the
 * recomputation is the same expression, so it gives the same bits.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "half_bits.cuh"
#include "ops_cuda.h"

namespace {

constexpr int kNormThreads = 256;
constexpr int kNormWarps = kNormThreads / 32;
constexpr int kEltThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

/* ---- reductions ------------------------------------------------------------ */

struct SumOp {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
    /* fmaxf returns the other operand when one is NaN, so NaN never wins
     * (the CPU's `if (a > amax)` skips NaN the same way). */
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* Reduces v over a block of kNormThreads threads; every thread gets the
 * result. red is kNormWarps shared slots; the trailing barrier lets the
 * caller reuse them at once. */
template <typename T, typename Op> __device__ T block_reduce(T v, Op op, T *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(kFullMask, v, o));
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    T r = red[0];
    for (int i = 1; i < kNormWarps; i++)
        r = op(r, red[i]);
    __syncthreads();
    return r;
}

/* ---- element rules shared with the CPU ----------------------------------------- */

/* relu(g)^2 * u as the CPU writes it: (g * g) * u, a NaN gate counts as 0. */
__device__ __forceinline__ float relu2_mul(float g, float u)
{
    const float r = g > 0.0f ? g : 0.0f;
    return __fmul_rn(__fmul_rn(r, r), u);
}

/* The normed value w * (x * inv). */
__device__ __forceinline__ float norm_value(float x, float w, float inv)
{
    return __fmul_rn(w, __fmul_rn(x, inv));
}

/* bn_round_clamp(y * s, -128, 127). */
__device__ __forceinline__ int quantize_value(float y, float s)
{
    const float r = rintf(__fmul_rn(y, s));
    return r != r ? 0 : r > 127.0f ? 127 : r < -128.0f ? -128 : (int)r;
}

/* ---- rows the norm kernels read --------------------------------------------------- */

/* A plain fp32 row. */
struct PlainRows {
    const float *x;
    int64_t ldx;
    struct Row {
        const float *x;
        __device__ float operator()(int64_t i) const { return x[i]; }
    };
    __device__ Row row(int64_t r) const { return Row{x + r * ldx}; }
};

/* The squared-ReLU product of a gate row and an up row, computed on the fly. */
struct Relu2Rows {
    const float *gate, *up;
    int64_t ldg, ldu;
    struct Row {
        const float *g, *u;
        __device__ float operator()(int64_t i) const { return relu2_mul(g[i], u[i]); }
    };
    __device__ Row row(int64_t r) const { return Row{gate + r * ldg, up + r * ldu}; }
};

/* 1 / sqrt(sum(v^2) / k + eps) of one row, the sum in fp32 (fixed order). */
template <class Row> __device__ float row_inv_rms(const Row &v, int64_t k, float eps, float *red)
{
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads) {
        const float a = v(i);
        acc = __fmaf_rn(a, a, acc);
    }
    const float ss = block_reduce(acc, SumOp(), red);
    const float mean = __fdiv_rn(ss, (float)k);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

/* ---- norm kernels ------------------------------------------------------------------ */

template <class Rows>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_kernel(Rows rows, int64_t k, const float *__restrict__ w, float eps, float *y,
                   int64_t ldy)
{
    __shared__ float red[kNormWarps];
    const int64_t r = blockIdx.x;
    const auto v = rows.row(r);
    const float inv = row_inv_rms(v, k, eps, red);
    /* Each thread writes only the elements it read itself after the
     * barrier in row_inv_rms, so y may be x. */
    float *out = y + r * ldy;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads)
        out[i] = norm_value(v(i), w[i], inv);
}

template <class Rows>
__global__ void __launch_bounds__(kNormThreads)
    norm_quantize_kernel(Rows rows, int64_t k, const float *__restrict__ w, float eps,
                         int8_t *__restrict__ q, int64_t ldq, float *__restrict__ scale,
                         int32_t *__restrict__ sum, float *normed, int64_t ldn)
{
    __shared__ float red_f[kNormWarps];
    __shared__ int red_i[kNormWarps];
    const int64_t r = blockIdx.x;
    const auto v = rows.row(r);
    const float inv = row_inv_rms(v, k, eps, red_f);

    float amax = 0.0f;
    float *nrow = normed ? normed + r * ldn : nullptr;
    for (int64_t i = threadIdx.x; i < k; i += kNormThreads) {
        const float y = norm_value(v(i), w[i], inv);
        if (nrow)
            nrow[i] = y;
        amax = fmaxf(amax, fabsf(y));
    }
    amax = block_reduce(amax, MaxOp(), red_f);
    if (!(amax >= 1e-5f)) /* BN_QUANT_EPS; also the all-NaN row */
        amax = 1e-5f;
    const float s = __fdiv_rn(127.0f, amax);

    int8_t *out = q + r * ldq;
    int total = 0;
    for (int64_t i = threadIdx.x; i < ldq; i += kNormThreads) {
        const int val = i < k ? quantize_value(norm_value(v(i), w[i], inv), s) : 0;
        out[i] = (int8_t)val;
        total += val;
    }
    total = block_reduce(total, SumOp(), red_i);
    if (threadIdx.x == 0) {
        scale[r] = s;
        sum[r] = total;
    }
}

/* ---- element-wise kernels ------------------------------------------------------------ */

/* Columns across grid.x, rows strided over grid.y (at most 65535 rows per
 * pass, so any m works). */
template <class F> __global__ void __launch_bounds__(kEltThreads) rows_kernel(int64_t m, int64_t k, F f)
{
    const int64_t c = (int64_t)blockIdx.x * kEltThreads + threadIdx.x;
    if (c >= k)
        return;
    for (int64_t r = blockIdx.y; r < m; r += gridDim.y)
        f(r, c);
}

template <class F> cudaError_t launch_rows(int64_t m, int64_t k, const F &f, cudaStream_t stream)
{
    if (m < 0 || k < 0)
        return cudaErrorInvalidValue;
    if (m == 0 || k == 0)
        return cudaSuccess;
    const dim3 grid((unsigned)((k + kEltThreads - 1) / kEltThreads),
                    (unsigned)(m < 65535 ? m : 65535));
    rows_kernel<<<grid, kEltThreads, 0, stream>>>(m, k, f);
    return cudaGetLastError();
}

struct Relu2Op {
    const float *gate, *up;
    float *h;
    int64_t ldg, ldu, ldh;
    __device__ void operator()(int64_t r, int64_t c) const
    {
        h[r * ldh + c] = relu2_mul(gate[r * ldg + c], up[r * ldu + c]);
    }
};

struct AddOp {
    float *y;
    const float *x;
    int64_t ldy, ldx;
    __device__ void operator()(int64_t r, int64_t c) const
    {
        y[r * ldy + c] = __fadd_rn(y[r * ldy + c], x[r * ldx + c]);
    }
};

/* fp32 -> IEEE half bits as bn_fp32_to_fp16: the hardware conversion rounds
 * to nearest even (subnormals and overflow included); a NaN keeps its sign
 * and top payload bits (made non-zero), which the hardware need not do. */
__device__ __forceinline__ uint16_t f32_to_f16_bits(float f)
{
    const uint32_t b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        uint32_t payload = (b >> 13) & 0x3ffu;
        if (payload == 0)
            payload = 1;
        return (uint16_t)(((b >> 16) & 0x8000u) | 0x7c00u | payload);
    }
    return __half_as_ushort(__float2half_rn(f));
}

/* fp32 -> bfloat16 bits as bn_fp32_to_bf16: round to nearest even on the
 * bit pattern (an overflow carries into infinity); a NaN gets its quiet bit. */
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f)
{
    const uint32_t b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((b >> 16) | 0x40u);
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

template <int kType> struct StoreOp {
    const float *x;
    void *dst;
    const int32_t *dst_rows;
    int64_t ldx, ld_dst;
    __device__ void operator()(int64_t r, int64_t c) const
    {
        const int64_t d = dst_rows ? (int64_t)dst_rows[r] : r;
        if (d < 0)
            return;
        const float v = x[r * ldx + c];
        if (kType == BN_QTYPE_F32)
            static_cast<float *>(dst)[d * ld_dst + c] = v;
        else if (kType == BN_QTYPE_F16)
            static_cast<uint16_t *>(dst)[d * ld_dst + c] = f32_to_f16_bits(v);
        else
            static_cast<uint16_t *>(dst)[d * ld_dst + c] = f32_to_bf16_bits(v);
    }
};

/* ---- RoPE ------------------------------------------------------------------------------ */

/* One block per token: the token's cos/sin table first (rope_dim/2 sincosf,
 * shared by all heads), then every (head, pair) of q and k. */
__global__ void __launch_bounds__(128)
    rope_kernel(float *q, int64_t ldq, int n_heads, float *k, int64_t ldk, int n_kv_heads,
                int head_dim, const int32_t *__restrict__ pos, const bn_rope_freqs freqs)
{
    extern __shared__ float table[]; /* cos[half], sin[half] */
    const int half = freqs.rope_dim / 2;
    const int64_t t = blockIdx.x;
    const float p = (float)pos[t];
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float s, c;
        sincosf(__fmul_rn(p, freqs.inv_freq[j]), &s, &c);
        table[j] = c;
        table[half + j] = s;
    }
    __syncthreads();
    const int pairs = (n_heads + n_kv_heads) * half;
    for (int idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
        const int h = idx / half, j = idx % half;
        float *v = h < n_heads ? q + t * ldq + (int64_t)h * head_dim
                               : k + t * ldk + (int64_t)(h - n_heads) * head_dim;
        const float x0 = v[j], x1 = v[j + half];
        const float c = table[j], s = table[half + j];
        v[j] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        v[j + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}

/* ---- embeddings ------------------------------------------------------------------------ */

__device__ __forceinline__ uint16_t load_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* Element e of a row of `kType`, the arithmetic of bn_dequantize_row_*. Byte
 * loads throughout: Q8_0 (34 B) and Q6_K (210 B) blocks are not aligned. */
template <int kType> __device__ __forceinline__ float dequant_element(const uint8_t *row, int64_t e)
{
    if (kType == BN_QTYPE_F32) {
        const uint8_t *p = row + 4 * e; /* a bit copy: NaN payloads kept */
        return __uint_as_float((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                               (uint32_t)p[3] << 24);
    } else if (kType == BN_QTYPE_F16) {
        return f16_bits_to_f32(load_le16(row + 2 * e));
    } else if (kType == BN_QTYPE_BF16) {
        return bf16_bits_to_f32(load_le16(row + 2 * e));
    } else if (kType == BN_QTYPE_Q8_0) {
        const uint8_t *block = row + 34 * (e / 32);
        const float d = f16_bits_to_f32(load_le16(block));
        return __fmul_rn((float)(int8_t)block[2 + e % 32], d);
    } else if (kType == BN_QTYPE_Q4_K) {
        const uint8_t *block = row + 144 * (e / 256);
        const int i = (int)(e % 256), j = i / 32, l = i % 32;
        const float d = f16_bits_to_f32(load_le16(block));
        const float dmin = f16_bits_to_f32(load_le16(block + 2));
        const uint8_t *sc = block + 4;
        int scale, min;
        if (j < 4) {
            scale = sc[j] & 0x3f;
            min = sc[j + 4] & 0x3f;
        } else {
            scale = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4);
            min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        }
        const int quant = (block[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
        const float sub_scale = __fmul_rn(d, (float)scale);
        const float sub_min = __fmul_rn(dmin, (float)min);
        return __fsub_rn(__fmul_rn(sub_scale, (float)quant), sub_min);
    } else if (kType == BN_QTYPE_TQ2_0) {
        /* Byte 32c + m of a block holds elements 128c + m + 32k at bits 2k. */
        const uint8_t *block = row + 66 * (e / 256);
        const int i = (int)(e % 256), c = i / 128, k = (i % 128) / 32, m = i % 32;
        const int digit = (block[32 * c + m] >> (2 * k)) & 3;
        const float d = f16_bits_to_f32(load_le16(block + 64));
        return __fmul_rn((float)(digit - 1), d);
    } else { /* Q6_K */
        const uint8_t *block = row + 210 * (e / 256);
        const int i = (int)(e % 256), half = i / 128, el = i % 128;
        const uint8_t low_byte = block[64 * half + el % 64];
        const int low = el < 64 ? (low_byte & 0x0f) : (low_byte >> 4);
        const int high = (block[128 + 32 * half + el % 32] >> (2 * (el / 32))) & 0x03;
        const int quant = ((high << 4) | low) - 32;
        const float d = f16_bits_to_f32(load_le16(block + 208));
        const float group_scale = __fmul_rn(d, (float)(int8_t)block[192 + i / 16]);
        return __fmul_rn(group_scale, (float)quant);
    }
}

/* One block per output row. */
template <int kType>
__global__ void __launch_bounds__(256)
    embed_kernel(const uint8_t *__restrict__ table, int64_t n_rows, int64_t dim, int64_t row_bytes,
                 const int32_t *__restrict__ ids, float *__restrict__ y, int64_t ldy)
{
    const int64_t i = blockIdx.x;
    const int64_t id = ids ? (int64_t)ids[i] : i;
    float *out = y + i * ldy;
    if (id < 0 || id >= n_rows) {
        for (int64_t e = threadIdx.x; e < dim; e += blockDim.x)
            out[e] = __uint_as_float(0x7fc00000u);
        return;
    }
    const uint8_t *row = table + id * row_bytes;
    for (int64_t e = threadIdx.x; e < dim; e += blockDim.x)
        out[e] = dequant_element<kType>(row, e);
}

/* Elements per block and bytes per block of the embedding types. */
bool embed_block(bn_qtype type, int *elems, int *bytes)
{
    switch (type) {
    case BN_QTYPE_F32: *elems = 1; *bytes = 4; return true;
    case BN_QTYPE_F16: *elems = 1; *bytes = 2; return true;
    case BN_QTYPE_BF16: *elems = 1; *bytes = 2; return true;
    case BN_QTYPE_Q8_0: *elems = 32; *bytes = 34; return true;
    case BN_QTYPE_Q4_K: *elems = 256; *bytes = 144; return true;
    case BN_QTYPE_Q6_K: *elems = 256; *bytes = 210; return true;
    case BN_QTYPE_TQ2_0: *elems = 256; *bytes = 66; return true;
    default: return false;
    }
}

template <int kType>
cudaError_t launch_embed(const void *table, int64_t n_rows, int64_t dim, int64_t row_bytes,
                         const int32_t *ids, int64_t n, float *y, int64_t ldy, cudaStream_t stream)
{
    embed_kernel<kType><<<(unsigned)n, 256, 0, stream>>>(static_cast<const uint8_t *>(table),
                                                         n_rows, dim, row_bytes, ids, y, ldy);
    return cudaGetLastError();
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------- */

static bool rows_ok(int64_t m, int64_t k, int64_t ld) { return m >= 0 && k > 0 && ld >= k; }

/* One block per row: grid.x is limited to 2^31 - 1 rows. */
static bool norm_rows_ok(int64_t m) { return m <= INT32_MAX; }

extern "C" cudaError_t bn_cuda_rmsnorm_rows(const float *x, int64_t m, int64_t k, int64_t ldx,
                                            const float *w, float eps, float *y, int64_t ldy,
                                            cudaStream_t stream)
{
    if (!rows_ok(m, k, ldx) || ldy < k || !norm_rows_ok(m))
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    rmsnorm_kernel<<<(unsigned)m, kNormThreads, 0, stream>>>(PlainRows{x, ldx}, k, w, eps, y, ldy);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_rmsnorm_quantize_rows(const float *x, int64_t m, int64_t k,
                                                     int64_t ldx, const float *w, float eps,
                                                     int8_t *q, int64_t ldq, float *scale,
                                                     int32_t *sum, float *normed, int64_t ldn,
                                                     cudaStream_t stream)
{
    if (!rows_ok(m, k, ldx) || ldq < k || (normed && ldn < k) || !norm_rows_ok(m))
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    norm_quantize_kernel<<<(unsigned)m, kNormThreads, 0, stream>>>(
        PlainRows{x, ldx}, k, w, eps, q, ldq, scale, sum, normed, ldn);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_relu2_mul(const float *gate, int64_t ldg, const float *up,
                                         int64_t ldu, int64_t m, int64_t k, float *h, int64_t ldh,
                                         cudaStream_t stream)
{
    if (!rows_ok(m, k, ldg) || ldu < k || ldh < k)
        return cudaErrorInvalidValue;
    return launch_rows(m, k, Relu2Op{gate, up, h, ldg, ldu, ldh}, stream);
}

extern "C" cudaError_t bn_cuda_relu2_mul_norm_quantize(const float *gate, int64_t ldg,
                                                       const float *up, int64_t ldu, int64_t m,
                                                       int64_t k, const float *w, float eps,
                                                       int8_t *q, int64_t ldq, float *scale,
                                                       int32_t *sum, float *normed, int64_t ldn,
                                                       cudaStream_t stream)
{
    if (!rows_ok(m, k, ldg) || ldu < k || ldq < k || (normed && ldn < k) || !norm_rows_ok(m))
        return cudaErrorInvalidValue;
    if (m == 0)
        return cudaSuccess;
    norm_quantize_kernel<<<(unsigned)m, kNormThreads, 0, stream>>>(
        Relu2Rows{gate, up, ldg, ldu}, k, w, eps, q, ldq, scale, sum, normed, ldn);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_add_rows(float *y, int64_t ldy, const float *x, int64_t ldx,
                                        int64_t m, int64_t k, cudaStream_t stream)
{
    if (!rows_ok(m, k, ldy) || ldx < k)
        return cudaErrorInvalidValue;
    return launch_rows(m, k, AddOp{y, x, ldy, ldx}, stream);
}

extern "C" cudaError_t bn_cuda_store_rows(const float *x, int64_t m, int64_t k, int64_t ldx,
                                          bn_qtype type, void *dst, int64_t ld_dst,
                                          const int32_t *dst_rows, cudaStream_t stream)
{
    if (!rows_ok(m, k, ldx) || ld_dst < k)
        return cudaErrorInvalidValue;
    switch (type) {
    case BN_QTYPE_F32:
        return launch_rows(m, k, StoreOp<BN_QTYPE_F32>{x, dst, dst_rows, ldx, ld_dst}, stream);
    case BN_QTYPE_F16:
        return launch_rows(m, k, StoreOp<BN_QTYPE_F16>{x, dst, dst_rows, ldx, ld_dst}, stream);
    case BN_QTYPE_BF16:
        return launch_rows(m, k, StoreOp<BN_QTYPE_BF16>{x, dst, dst_rows, ldx, ld_dst}, stream);
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t bn_rope_freqs_init(bn_rope_freqs *f, float theta, int rope_dim)
{
    if (!f || rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > BN_ROPE_MAX_DIM || !(theta > 0.0f))
        return cudaErrorInvalidValue;
    f->rope_dim = rope_dim;
    /* The CPU backend's expression, evaluated by the same host libm. */
    for (int j = 0; j < BN_ROPE_MAX_DIM / 2; j++)
        f->inv_freq[j] =
            j < rope_dim / 2 ? 1.0f / powf(theta, (float)(2 * j) / (float)rope_dim) : 0.0f;
    return cudaSuccess;
}

extern "C" cudaError_t bn_cuda_rope_neox(float *q, int64_t ldq, int n_heads, float *k,
                                         int64_t ldk, int n_kv_heads, int64_t n_tokens,
                                         int head_dim, const int32_t *pos,
                                         const bn_rope_freqs *freqs, cudaStream_t stream)
{
    if (!freqs || !pos || n_heads < 0 || n_kv_heads < 0 || n_tokens < 0 ||
        n_tokens > INT32_MAX || head_dim <= 0)
        return cudaErrorInvalidValue;
    const int rope_dim = freqs->rope_dim;
    if (rope_dim < 2 || rope_dim % 2 != 0 || rope_dim > BN_ROPE_MAX_DIM || rope_dim > head_dim)
        return cudaErrorInvalidValue;
    if ((n_heads > 0 && (!q || ldq < (int64_t)n_heads * head_dim)) ||
        (n_kv_heads > 0 && (!k || ldk < (int64_t)n_kv_heads * head_dim)))
        return cudaErrorInvalidValue;
    if (n_tokens == 0 || n_heads + n_kv_heads == 0)
        return cudaSuccess;
    rope_kernel<<<(unsigned)n_tokens, 128, sizeof(float) * (size_t)rope_dim, stream>>>(
        q, ldq, n_heads, k, ldk, n_kv_heads, head_dim, pos, *freqs);
    return cudaGetLastError();
}

extern "C" bool bn_cuda_embed_supports(bn_qtype type)
{
    int elems, bytes;
    return embed_block(type, &elems, &bytes);
}

extern "C" cudaError_t bn_cuda_embed_rows(const void *table, bn_qtype type, int64_t n_rows,
                                          int64_t dim, const int32_t *ids, int64_t n, float *y,
                                          int64_t ldy, cudaStream_t stream)
{
    int elems, bytes;
    if (!embed_block(type, &elems, &bytes) || !table || n_rows <= 0 || dim <= 0 ||
        dim % elems != 0 || n < 0 || n > INT32_MAX || ldy < dim)
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    const int64_t row_bytes = dim / elems * bytes;
    switch (type) {
    case BN_QTYPE_F32:
        return launch_embed<BN_QTYPE_F32>(table, n_rows, dim, row_bytes, ids, n, y, ldy, stream);
    case BN_QTYPE_F16:
        return launch_embed<BN_QTYPE_F16>(table, n_rows, dim, row_bytes, ids, n, y, ldy, stream);
    case BN_QTYPE_BF16:
        return launch_embed<BN_QTYPE_BF16>(table, n_rows, dim, row_bytes, ids, n, y, ldy, stream);
    case BN_QTYPE_Q8_0:
        return launch_embed<BN_QTYPE_Q8_0>(table, n_rows, dim, row_bytes, ids, n, y, ldy, stream);
    case BN_QTYPE_Q4_K:
        return launch_embed<BN_QTYPE_Q4_K>(table, n_rows, dim, row_bytes, ids, n, y, ldy, stream);
    case BN_QTYPE_TQ2_0:
        return launch_embed<BN_QTYPE_TQ2_0>(table, n_rows, dim, row_bytes, ids, n, y, ldy, stream);
    default:
        return launch_embed<BN_QTYPE_Q6_K>(table, n_rows, dim, row_bytes, ids, n, y, ldy, stream);
    }
}
