/*
 * quant_kernels.cu - ternary weight quantization on the GPU: absmean,
 * codes, and packing into the ternary file formats, byte for byte as the CPU
 * packers of src/quant (layouts are documented there: fmt_bitnet.c for
 * I2_S, fmt_tq.c for TQ2_0, fmt_tl.c for TL1/TL2). Contracts are in
 * quant_cuda.h.
 *
 * Every packer is a gather: one thread computes one output byte from the
 * canonical codes, inverting the CPU packer's loop nest (a mixed-radix
 * decomposition of the byte index), so no two threads write the same byte
 * and no output needs zeroing first.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant_cuda.h"

extern "C" {
#include "fp16.h" /* a C header without C++ guards */
}

namespace {

constexpr int kSumThreads = 256;
constexpr int kFinalThreads = 1024;
constexpr int64_t kChunk = 8192; /* weights per first-stage block */
constexpr int kGatherThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

/* Sum over a block of `kThreads` threads in a fixed order (xor-shuffle tree
 * per warp, then warps in order); thread 0 gets the result. */
template <int kThreads> __device__ double block_sum(double v, double *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFullMask, v, o);
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    double r = red[0];
    for (int i = 1; i < kThreads / 32; i++)
        r += red[i];
    return r;
}

/* Stage 1: the double sum of |w| over one kChunk chunk per block. */
__global__ void __launch_bounds__(kSumThreads)
    abs_sum_kernel(const float *__restrict__ w, int64_t n, double *__restrict__ partial)
{
    __shared__ double red[kSumThreads / 32];
    const int64_t begin = (int64_t)blockIdx.x * kChunk;
    const int64_t end = begin + kChunk < n ? begin + kChunk : n;
    double acc = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += kSumThreads)
        acc += fabs((double)w[i]);
    acc = block_sum<kSumThreads>(acc, red);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = acc;
}

/* Stage 2: one block adds the chunks' sums and applies the absmean rule of
 * bn_quantize_weights_absmean. */
__global__ void __launch_bounds__(kFinalThreads)
    absmean_final_kernel(const double *__restrict__ partial, int64_t chunks, int64_t n,
                         float *__restrict__ q_scale)
{
    __shared__ double red[kFinalThreads / 32];
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < chunks; i += kFinalThreads)
        acc += partial[i];
    const double total = block_sum<kFinalThreads>(acc, red);
    if (threadIdx.x == 0) {
        float mean = __double2float_rn(__ddiv_rn(total, (double)n));
        if (!(mean >= 1e-5f)) /* BN_QUANT_EPS; also catches NaN */
            mean = 1e-5f;
        const float q = __fdiv_rn(1.0f, mean);
        q_scale[0] = q;
        q_scale[1] = __fdiv_rn(1.0f, q);
    }
}

__global__ void __launch_bounds__(kGatherThreads)
    codes_kernel(const float *__restrict__ w, int64_t n, const float *__restrict__ q_scale,
                 int8_t *__restrict__ codes)
{
    const float q = q_scale[0];
    for (int64_t i = (int64_t)blockIdx.x * kGatherThreads + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kGatherThreads) {
        const float r = rintf(__fmul_rn(w[i], q));
        codes[i] = (int8_t)(r != r ? 0 : r > 1.0f ? 1 : r < -1.0f ? -1 : (int)r);
    }
}

/* Enough blocks to fill any current GPU; the loops stride over the rest. */
unsigned grid_for(int64_t n)
{
    const int64_t blocks = (n + kGatherThreads - 1) / kGatherThreads;
    return (unsigned)(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

/* ---- I2_S -------------------------------------------------------------------- */

/* Byte p of a 128-weight block: weights p, p+32, p+64, p+96 at shifts 6, 4,
 * 2, 0, as code + 1. Then the float scale, then zeros. */
__global__ void __launch_bounds__(kGatherThreads)
    pack_i2s_kernel(const int8_t *__restrict__ codes, int64_t n, uint32_t scale_bits,
                    uint8_t *__restrict__ dst)
{
    const int64_t code_bytes = n / 4, total = code_bytes + 32;
    for (int64_t b = (int64_t)blockIdx.x * kGatherThreads + threadIdx.x; b < total;
         b += (int64_t)gridDim.x * kGatherThreads) {
        unsigned v = 0;
        if (b < code_bytes) {
            const int8_t *c = codes + (b / 32) * 128 + b % 32;
            for (int j = 0; j < 4; j++)
                v |= (unsigned)((c[32 * j] + 1) & 3) << (6 - 2 * j);
        } else if (b - code_bytes < 4) {
            v = (scale_bits >> (8 * (b - code_bytes))) & 0xffu; /* little-endian float */
        }
        dst[b] = (uint8_t)v;
    }
}

/* ---- TQ2_0 ------------------------------------------------------------------- */

/* One 64-thread block per 256-weight block: thread t makes qs byte t
 * (weights 128c + m + 32k at bits 2k, c = t / 32, m = t % 32), and the block
 * decides together whether its d is the scale or 0. */
__global__ void __launch_bounds__(64)
    pack_tq2_0_kernel(const int8_t *__restrict__ codes, uint16_t d_half, uint8_t *__restrict__ dst)
{
    const int64_t blk = blockIdx.x;
    const int t = threadIdx.x, c = t / 32, m = t % 32;
    const int8_t *w = codes + blk * 256 + 128 * c + m;
    unsigned v = 0;
    bool nonzero = false;
    for (int k = 0; k < 4; k++) {
        v |= (unsigned)((w[32 * k] + 1) & 3) << (2 * k);
        nonzero |= w[32 * k] != 0;
    }
    uint8_t *out = dst + blk * 66;
    out[t] = (uint8_t)v;
    const bool any = __syncthreads_or(nonzero) != 0;
    if (t == 0) {
        const uint16_t d = any ? d_half : 0;
        out[64] = (uint8_t)(d & 0xff);
        out[65] = (uint8_t)(d >> 8);
    }
}

/* ---- TL1 / TL2 ----------------------------------------------------------------- */

struct Tiling {
    int64_t BM, BK, bm;
};

__device__ __forceinline__ int pair_index(const int8_t *w) { return 3 * w[0] + w[1] + 4; }

__device__ __forceinline__ int triple_value(const int8_t *w) { return 9 * w[0] + 3 * w[1] + w[2]; }

/* TL2 tiles put row groups 0, 2, 1, 3 (of 8 rows) in byte groups 0..3. */
__device__ __forceinline__ int tile_row(int pos)
{
    const int g = pos / 8;
    return (((g & 1) << 1) | (g >> 1)) * 8 + pos % 8;
}

/* bn_pack_tl1_tiled's loop nest, outermost first: BM-row block r0, BK-column
 * block c0, bm-row tile r1, by-column tile c1, 16-row group r2, 4 columns c2,
 * row v; one byte [pair(c2, c2+1) << 4 | pair(c2+2, c2+3)] each. */
__global__ void __launch_bounds__(kGatherThreads)
    pack_tl1_kernel(const int8_t *__restrict__ codes, int64_t rows, int64_t cols, Tiling t,
                    uint8_t *__restrict__ dst)
{
    const int64_t by = 256 / t.bm;
    const int64_t total = rows * cols / 4;
    for (int64_t b = (int64_t)blockIdx.x * kGatherThreads + threadIdx.x; b < total;
         b += (int64_t)gridDim.x * kGatherThreads) {
        int64_t x = b;
        const int64_t v = x % 16;
        x /= 16;
        const int64_t c2 = x % (by / 4);
        x /= by / 4;
        const int64_t r2 = x % (t.bm / 16);
        x /= t.bm / 16;
        const int64_t c1 = x % (t.BK / by);
        x /= t.BK / by;
        const int64_t r1 = x % (t.BM / t.bm);
        x /= t.BM / t.bm;
        const int64_t c0 = x % (cols / t.BK);
        const int64_t r0 = x / (cols / t.BK);
        const int64_t row = r0 * t.BM + r1 * t.bm + r2 * 16 + v;
        const int64_t col = c0 * t.BK + c1 * by + c2 * 4;
        const int8_t *w = codes + row * cols + col;
        dst[b] = (uint8_t)(pair_index(w) << 4 | pair_index(w + 2));
    }
}

/* bn_pack_tl2_tiled's three areas, each a loop nest of 32-byte tiles:
 *   magnitudes  r0, t0 (BK/3 triples), r1 (32 rows), pair of triples, pos
 *   signs       r0, t0, r1, 8 triples, 32 bytes = 16 LE words of sign bits
 *   tail        r0, 16 pairs, r1, pair of pairs, pos
 * then zero padding. */
__global__ void __launch_bounds__(kGatherThreads)
    pack_tl2_kernel(const int8_t *__restrict__ codes, int64_t rows, int64_t cols, Tiling t,
                    int64_t total, uint8_t *__restrict__ dst)
{
    const int64_t tail_cols = cols % t.BK, triple_cols = cols - tail_cols;
    const int64_t sign_offset = rows * triple_cols / 6;
    const int64_t tail_offset = sign_offset + rows * triple_cols / 24;
    const int64_t data_end = tail_offset + rows * tail_cols / 4;
    const int64_t per_block = t.BK / 3;                 /* triples per BK block */
    const int64_t col_blocks = triple_cols / t.BK;      /* BK blocks per row    */
    const int64_t row_tiles = t.BM / 32;
    const int64_t tail_blocks = tail_cols / 32;         /* 16-pair blocks       */
    for (int64_t b = (int64_t)blockIdx.x * kGatherThreads + threadIdx.x; b < total;
         b += (int64_t)gridDim.x * kGatherThreads) {
        unsigned v = 0;
        if (b < sign_offset) {
            int64_t x = b;
            const int pos = (int)(x % 32);
            x /= 32;
            const int64_t t1 = x % (per_block / 2);
            x /= per_block / 2;
            const int64_t r1 = x % row_tiles;
            x /= row_tiles;
            const int64_t t0 = x % col_blocks;
            const int64_t r0 = x / col_blocks;
            const int64_t row = r0 * t.BM + r1 * 32 + tile_row(pos);
            const int8_t *w = codes + row * cols + 3 * (t0 * per_block + 2 * t1);
            v = (unsigned)(abs(triple_value(w)) << 4 | abs(triple_value(w + 3)));
        } else if (b < tail_offset) {
            const int64_t bb = b - sign_offset;
            const int bi = (int)(bb % 32);
            int64_t x = bb / 32;
            const int64_t t1 = x % (per_block / 8);
            x /= per_block / 8;
            const int64_t r1 = x % row_tiles;
            x /= row_tiles;
            const int64_t t0 = x % col_blocks;
            const int64_t r0 = x / col_blocks;
            const int64_t row0 = r0 * t.BM + r1 * 32;
            const int64_t triple0 = t0 * per_block + 8 * t1;
            /* Byte bi is half bi % 2 of word bi / 2; word bit `bit` holds
             * triple q of row s with 2q + s/16 = 15 - bit, s % 16 = word. */
            const int word = bi / 2;
            for (int j = 0; j < 8; j++) {
                const int idx = 15 - (8 * (bi % 2) + j);
                const int q = idx / 2, s = word + 16 * (idx % 2);
                const int8_t *w = codes + (row0 + s) * cols + 3 * (triple0 + q);
                if (triple_value(w) < 0)
                    v |= 1u << j;
            }
        } else if (b < data_end) {
            const int64_t bb = b - tail_offset;
            const int pos = (int)(bb % 32);
            int64_t x = bb / 32;
            const int64_t p1 = x % 8;
            x /= 8;
            const int64_t r1 = x % row_tiles;
            x /= row_tiles;
            const int64_t p0 = x % tail_blocks;
            const int64_t r0 = x / tail_blocks;
            const int64_t row = r0 * t.BM + r1 * 32 + tile_row(pos);
            const int8_t *w = codes + row * cols + triple_cols + 2 * (p0 * 16 + 2 * p1);
            v = (unsigned)(pair_index(w) << 4 | pair_index(w + 2));
        }
        dst[b] = (uint8_t)v;
    }
}

/* ---- I2_S dequantization --------------------------------------------------------- */

__global__ void __launch_bounds__(kGatherThreads)
    dequantize_i2s_kernel(const uint8_t *__restrict__ src, int64_t n, float scale,
                          float *__restrict__ y, int *bad)
{
    for (int64_t i = (int64_t)blockIdx.x * kGatherThreads + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kGatherThreads) {
        const int j = (int)(i % 128);
        const int code = (src[(i / 128) * 32 + j % 32] >> (6 - 2 * (j / 32))) & 3;
        if (code == 3) {
            if (bad)
                atomicExch(bad, 1);
            y[i] = __uint_as_float(0x7fc00000u);
        } else {
            y[i] = __fmul_rn((float)(code - 1), scale);
        }
    }
}

/* TL1 / TL2 shape rules (bn_tl_tiling_check), repeated here because the
 * kernels index out of bounds without them. */
bool tl1_ok(int64_t rows, int64_t cols, const bn_tl_tiling *t)
{
    if (!t || rows <= 0 || cols <= 0 || t->block_rows <= 0 || t->block_cols <= 0 ||
        (t->compute_rows != 32 && t->compute_rows != 64))
        return false;
    const int by = 256 / t->compute_rows;
    return t->block_cols % by == 0 && t->block_rows % t->compute_rows == 0 &&
           rows % t->block_rows == 0 && cols % t->block_cols == 0;
}

bool tl2_ok(int64_t rows, int64_t cols, const bn_tl_tiling *t, int64_t *total)
{
    if (!t || rows <= 0 || cols < 256 || t->block_rows <= 0 || t->block_cols <= 0 ||
        t->compute_rows != 32 || t->block_cols % 24 != 0 || t->block_rows % 32 != 0 ||
        rows % t->block_rows != 0)
        return false;
    const int64_t tail = cols % t->block_cols, triple_cols = cols - tail;
    if (tail % 32 != 0 || tail > 256)
        return false;
    /* bn_tl2_tensor_bytes: the converter's formula, same operation order. */
    *total = (cols - 256) * rows / 3 * 5 / 8 + 256 * rows / 2 * 4 / 8;
    const int64_t data = rows * triple_cols / 6 + rows * triple_cols / 24 + rows * tail / 4;
    return data <= *total;
}

constexpr int64_t kMaxElements = INT64_C(1) << 40; /* bn_qtype_tensor_size's bound */

bool shape_ok(int64_t rows, int64_t cols)
{
    return rows > 0 && cols > 0 && rows <= kMaxElements / cols;
}

} // namespace

/* ---- launchers ---------------------------------------------------------------------- */

extern "C" size_t bn_cuda_absmean_workspace_bytes(int64_t n)
{
    const int64_t chunks = n > 0 ? (n + kChunk - 1) / kChunk : 1;
    return (size_t)chunks * sizeof(double);
}

extern "C" cudaError_t bn_cuda_absmean(const float *w, int64_t n, void *workspace, float *q_scale,
                                       cudaStream_t stream)
{
    if (n <= 0 || n > kMaxElements || !w || !workspace || !q_scale)
        return cudaErrorInvalidValue;
    const int64_t chunks = (n + kChunk - 1) / kChunk; /* <= 2^27 */
    double *partial = static_cast<double *>(workspace);
    abs_sum_kernel<<<(unsigned)chunks, kSumThreads, 0, stream>>>(w, n, partial);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    absmean_final_kernel<<<1, kFinalThreads, 0, stream>>>(partial, chunks, n, q_scale);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_ternary_codes(const float *w, int64_t n, const float *q_scale,
                                             int8_t *codes, cudaStream_t stream)
{
    if (n < 0 || (n > 0 && (!w || !q_scale || !codes)))
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    codes_kernel<<<grid_for(n), kGatherThreads, 0, stream>>>(w, n, q_scale, codes);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_pack_i2s(const int8_t *codes, int64_t rows, int64_t cols,
                                        float scale, uint8_t *dst, cudaStream_t stream)
{
    if (!shape_ok(rows, cols) || cols % 128 != 0 || !codes || !dst)
        return cudaErrorInvalidValue;
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    const int64_t n = rows * cols;
    pack_i2s_kernel<<<grid_for(n / 4 + 32), kGatherThreads, 0, stream>>>(codes, n, bits, dst);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_pack_tq2_0(const int8_t *codes, int64_t rows, int64_t cols,
                                          float scale, uint8_t *dst, cudaStream_t stream)
{
    if (!shape_ok(rows, cols) || cols % 256 != 0 || !codes || !dst)
        return cudaErrorInvalidValue;
    const int64_t blocks = rows * cols / 256;
    if (blocks > INT32_MAX)
        return cudaErrorInvalidValue;
    /* The CPU packer's own conversion, so d matches it bit for bit. */
    const uint16_t d_half = bn_fp32_to_fp16(scale);
    pack_tq2_0_kernel<<<(unsigned)blocks, 64, 0, stream>>>(codes, d_half, dst);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_pack_tl1(const int8_t *codes, int64_t rows, int64_t cols,
                                        const bn_tl_tiling *tiling, uint8_t *dst,
                                        cudaStream_t stream)
{
    if (!shape_ok(rows, cols) || !tl1_ok(rows, cols, tiling) || !codes || !dst)
        return cudaErrorInvalidValue;
    const Tiling t = {tiling->block_rows, tiling->block_cols, tiling->compute_rows};
    pack_tl1_kernel<<<grid_for(rows * cols / 4), kGatherThreads, 0, stream>>>(codes, rows, cols,
                                                                             t, dst);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_pack_tl2(const int8_t *codes, int64_t rows, int64_t cols,
                                        const bn_tl_tiling *tiling, uint8_t *dst,
                                        cudaStream_t stream)
{
    int64_t total = 0;
    if (!shape_ok(rows, cols) || !tl2_ok(rows, cols, tiling, &total) || !codes || !dst)
        return cudaErrorInvalidValue;
    const Tiling t = {tiling->block_rows, tiling->block_cols, tiling->compute_rows};
    pack_tl2_kernel<<<grid_for(total), kGatherThreads, 0, stream>>>(codes, rows, cols, t, total,
                                                                   dst);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_dequantize_i2s(const void *src, int64_t rows, int64_t cols,
                                              float scale, float *y, int *bad,
                                              cudaStream_t stream)
{
    if (!shape_ok(rows, cols) || cols % 128 != 0 || !src || !y)
        return cudaErrorInvalidValue;
    const int64_t n = rows * cols;
    dequantize_i2s_kernel<<<grid_for(n), kGatherThreads, 0, stream>>>(
        static_cast<const uint8_t *>(src), n, scale, y, bad);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cuda_quant_probe(void)
{
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, codes_kernel);
}
