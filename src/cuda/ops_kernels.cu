/*
 * ops_kernels.cu - embedding lookup on the GPU (which also dequantizes whole
 * tables of any row format it knows, TQ2_0 included) and the host-side RoPE
 * frequency table the backend's fused kernels take. Contracts are in
 * ops_cuda.h.
 *
 * Every multiply and add that the CPU's bn_dequantize_row_* performs as a
 * separate fp32 operation is written with the __f*_rn intrinsics: nvcc
 * contracts a * b + c into one fused multiply-add by default, and that
 * single rounding would make results differ from the CPU in the last bit.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "half_bits.cuh"
#include "ops_cuda.h"

namespace {

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
