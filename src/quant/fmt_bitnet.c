/*
 * fmt_bitnet.c - ternary layouts from the BitNet world (not llama.cpp's
 * block formats): Microsoft's I2_S, the Hugging Face packed checkpoint, and
 * BitNet.rs's BitNet32-F16.
 *
 * I2_S (bitnet.cpp, x86 layout; src/ggml-bitnet-mad.cpp quantize_i2_s)
 *   The tensor is one flat run of rows*cols elements in blocks of 128; each
 *   block is 32 bytes. Byte p of a block holds elements p, p+32, p+64, p+96
 *   at bit shifts 6, 4, 2, 0. Codes 0, 1, 2 mean -1, 0, +1. After the
 *   rows*cols/4 code bytes comes one float32, the tensor's scale, and the
 *   whole tensor is padded to rows*cols/4 + 32 bytes.
 *
 *       block byte p:  [ e(p) | e(p+32) | e(p+64) | e(p+96) ]
 *                       bits 7-6  5-4      3-2      1-0
 *
 *   bitnet.cpp writes max|W| as the scale, which for ternary-valued weights
 *   is the per-tensor value itself.
 *
 * Hugging Face packed (BitNetForCausalLM, quantization_mode "offline")
 *   uint8 tensor of shape (rows/4, cols). Output row r lives in packed row
 *   r % (rows/4), at bits 2 * (r / (rows/4)); codes 0, 1, 2 mean -1, 0, +1.
 *   The scale is a separate `weight_scale` tensor, so it is not handled here.
 *
 *       packed[i][c] = code(r=i) | code(r=i+R)<<2 | code(i+2R)<<4 | code(i+3R)<<6,
 *       R = rows/4
 *
 * BitNet32-F16 (BitNet.rs "I2S")
 *   32-element blocks of 10 bytes: 8 bytes of 2-bit codes then an fp16
 *   scale (the block's absmax). Element j of a block sits in byte j/4 at
 *   bits 2*(j%4) (least significant first); code = value + 2, so -1, 0, +1
 *   are 1, 2, 3 (code 0, i.e. -2, is never written by a ternary quantizer).
 */
#include "fmt_bitnet.h"

#include <math.h>
#include <string.h>

#include "fp16.h"
#include "quant_rules.h"

static bn_status short_buffer(bn_error *err, const char *name, size_t need, size_t have)
{
    return bn_error_set(err, BN_ERR_FORMAT, "the file is truncated or the tensor shape is wrong",
                        "%s tensor needs %zu bytes, only %zu available", name, need, have);
}

static bn_status bad_code(bn_error *err, const char *name, int64_t index, int code)
{
    return bn_error_set(err, BN_ERR_FORMAT, "the tensor data is corrupt or not ternary",
                        "%s element %lld has code %d, which is not a ternary value", name,
                        (long long)index, code);
}

static bool codes_are_ternary(const int8_t *codes, size_t n, bn_error *err, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (codes[i] < -1 || codes[i] > 1) {
            bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                         "%s: code %d at element %zu is not -1, 0 or +1", name, codes[i], i);
            return false;
        }
    }
    return true;
}

/* ---- I2_S ----------------------------------------------------------------- */

enum { I2S_BLOCK = 128, I2S_BLOCK_BYTES = 32, I2S_TRAILER = 32 };

size_t bn_i2s_tensor_bytes(int64_t rows, int64_t cols)
{
    return (size_t)(rows * cols / 4) + I2S_TRAILER;
}

bool bn_i2s_shape_ok(int64_t rows, int64_t cols, bn_error *err)
{
    (void)rows;
    if (cols % I2S_BLOCK != 0) {
        bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "use tq2_0 for rows of other lengths",
                     "i2_s needs rows whose length is a multiple of 128; got %lld",
                     (long long)cols);
        return false;
    }
    return true;
}

bn_status bn_unpack_i2s(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                        int8_t *codes, float *scale, bn_error *err)
{
    if (!bn_i2s_shape_ok(rows, cols, err))
        return BN_ERR_INVALID_ARGUMENT;
    const size_t n = (size_t)(rows * cols);
    /* The scale must be present; the trailing padding may be absent. */
    if (src_bytes < n / 4 + sizeof(float))
        return short_buffer(err, "i2_s", n / 4 + sizeof(float), src_bytes);
    const uint8_t *bytes = src;
    for (size_t block = 0; block < n / I2S_BLOCK; block++) {
        const uint8_t *b = bytes + block * I2S_BLOCK_BYTES;
        int8_t *out = codes + block * I2S_BLOCK;
        for (int j = 0; j < I2S_BLOCK; j++) {
            int code = (b[j % 32] >> (6 - 2 * (j / 32))) & 3;
            if (code == 3)
                return bad_code(err, "i2_s", (int64_t)(block * I2S_BLOCK) + j, code);
            out[j] = (int8_t)(code - 1);
        }
    }
    float s;
    memcpy(&s, bytes + n / 4, sizeof s);
    if (!isfinite(s))
        return bn_error_set(err, BN_ERR_FORMAT, "the tensor data is corrupt",
                            "i2_s tensor scale is not a finite number");
    *scale = s;
    return BN_OK;
}

bn_status bn_pack_i2s(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                      bn_error *err)
{
    if (!bn_i2s_shape_ok(rows, cols, err))
        return BN_ERR_INVALID_ARGUMENT;
    const size_t n = (size_t)(rows * cols);
    if (!codes_are_ternary(codes, n, err, "i2_s"))
        return BN_ERR_INVALID_ARGUMENT;
    uint8_t *bytes = dst;
    memset(bytes, 0, bn_i2s_tensor_bytes(rows, cols));
    for (size_t block = 0; block < n / I2S_BLOCK; block++) {
        uint8_t *b = bytes + block * I2S_BLOCK_BYTES;
        const int8_t *in = codes + block * I2S_BLOCK;
        for (int j = 0; j < I2S_BLOCK; j++)
            b[j % 32] |= (uint8_t)((in[j] + 1) << (6 - 2 * (j / 32)));
    }
    memcpy(bytes + n / 4, &scale, sizeof scale);
    return BN_OK;
}

/* ---- Hugging Face packed ------------------------------------------------- */

bool bn_hf_packed_shape_ok(int64_t rows, int64_t cols, bn_error *err)
{
    (void)cols;
    if (rows % 4 != 0) {
        bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                     "the Hugging Face packed layout needs a row count divisible by 4; got %lld",
                     (long long)rows);
        return false;
    }
    return true;
}

size_t bn_hf_packed_tensor_bytes(int64_t rows, int64_t cols)
{
    return (size_t)(rows / 4 * cols);
}

bn_status bn_unpack_hf_packed(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                              int8_t *codes, float *scale, bn_error *err)
{
    if (!bn_hf_packed_shape_ok(rows, cols, err))
        return BN_ERR_INVALID_ARGUMENT;
    const int64_t packed_rows = rows / 4;
    const size_t need = (size_t)(packed_rows * cols);
    if (src_bytes < need)
        return short_buffer(err, "hf_packed", need, src_bytes);
    const uint8_t *p = src;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *in = p + (r % packed_rows) * cols;
        const int shift = (int)(2 * (r / packed_rows));
        for (int64_t c = 0; c < cols; c++) {
            int code = (in[c] >> shift) & 3;
            if (code == 3)
                return bad_code(err, "hf_packed", r * cols + c, code);
            codes[r * cols + c] = (int8_t)(code - 1);
        }
    }
    *scale = 1.0f;
    return BN_OK;
}

bn_status bn_pack_hf_packed(const int8_t *codes, float scale, int64_t rows, int64_t cols,
                            void *dst, bn_error *err)
{
    (void)scale;
    if (!bn_hf_packed_shape_ok(rows, cols, err))
        return BN_ERR_INVALID_ARGUMENT;
    if (!codes_are_ternary(codes, (size_t)(rows * cols), err, "hf_packed"))
        return BN_ERR_INVALID_ARGUMENT;
    const int64_t packed_rows = rows / 4;
    uint8_t *p = dst;
    memset(p, 0, (size_t)(packed_rows * cols));
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *out = p + (r % packed_rows) * cols;
        const int shift = (int)(2 * (r / packed_rows));
        for (int64_t c = 0; c < cols; c++)
            out[c] |= (uint8_t)((codes[r * cols + c] + 1) << shift);
    }
    return BN_OK;
}

/* ---- BitNet32-F16 ---------------------------------------------------------- */

enum { B32_BLOCK = 32, B32_BYTES = 10 };

void bn_dequantize_row_bitnet32(const void *src, float *dst, int64_t n)
{
    const uint8_t *b = src;
    for (int64_t blk = 0; blk < n / B32_BLOCK; blk++, b += B32_BYTES) {
        uint16_t h;
        memcpy(&h, b + 8, sizeof h);
        const float d = bn_fp16_to_fp32(h);
        for (int j = 0; j < B32_BLOCK; j++)
            dst[blk * B32_BLOCK + j] = (float)(((b[j / 4] >> (2 * (j % 4))) & 3) - 2) * d;
    }
}

void bn_quantize_row_bitnet32(const float *src, void *dst, int64_t n)
{
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < n / B32_BLOCK; blk++, b += B32_BYTES) {
        const float *x = src + blk * B32_BLOCK;
        float amax = 0.0f;
        for (int j = 0; j < B32_BLOCK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const uint16_t h = bn_fp32_to_fp16(amax);
        const float d = bn_fp16_to_fp32(h);
        const float inv = d > 0.0f ? 1.0f / d : 0.0f;
        memset(b, 0, 8);
        for (int j = 0; j < B32_BLOCK; j++) {
            int v = bn_round_clamp(x[j] * inv, -1, 1);
            b[j / 4] |= (uint8_t)((v + 2) << (2 * (j % 4)));
        }
        memcpy(b + 8, &h, sizeof h);
    }
}

bn_status bn_unpack_bitnet32(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                             int8_t *codes, float *scale, bn_error *err)
{
    if (cols % B32_BLOCK != 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bitnet32_f16 needs rows whose length is a multiple of 32; got %lld",
                            (long long)cols);
    const int64_t blocks = rows * cols / B32_BLOCK;
    const size_t need = (size_t)blocks * B32_BYTES;
    if (src_bytes < need)
        return short_buffer(err, "bitnet32_f16", need, src_bytes);
    const uint8_t *b = src;
    uint16_t common = 0;
    bool have_common = false;
    for (int64_t blk = 0; blk < blocks; blk++, b += B32_BYTES) {
        uint16_t h;
        memcpy(&h, b + 8, sizeof h);
        bool any_nonzero = false;
        for (int j = 0; j < B32_BLOCK; j++) {
            int code = (b[j / 4] >> (2 * (j % 4))) & 3;
            if (code == 0)
                return bad_code(err, "bitnet32_f16", blk * B32_BLOCK + j, code);
            codes[blk * B32_BLOCK + j] = (int8_t)(code - 2);
            any_nonzero |= code != 2;
        }
        if (!any_nonzero)
            continue;
        if (have_common && h != common)
            return bn_error_set(err, BN_ERR_UNSUPPORTED,
                                "convert the model with one scale per tensor",
                                "bitnet32_f16 blocks have different scales (block %lld): not a "
                                "per-tensor ternary tensor",
                                (long long)blk);
        common = h;
        have_common = true;
    }
    *scale = have_common ? bn_fp16_to_fp32(common) : 0.0f;
    return BN_OK;
}

bn_status bn_pack_bitnet32(const int8_t *codes, float scale, int64_t rows, int64_t cols,
                           void *dst, bn_error *err)
{
    if (cols % B32_BLOCK != 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bitnet32_f16 needs rows whose length is a multiple of 32; got %lld",
                            (long long)cols);
    if (!codes_are_ternary(codes, (size_t)(rows * cols), err, "bitnet32_f16"))
        return BN_ERR_INVALID_ARGUMENT;
    const uint16_t h = bn_fp32_to_fp16(scale);
    uint8_t *b = dst;
    for (int64_t blk = 0; blk < rows * cols / B32_BLOCK; blk++, b += B32_BYTES) {
        const int8_t *in = codes + blk * B32_BLOCK;
        bool any_nonzero = false;
        memset(b, 0, 8);
        for (int j = 0; j < B32_BLOCK; j++) {
            b[j / 4] |= (uint8_t)((in[j] + 2) << (2 * (j % 4)));
            any_nonzero |= in[j] != 0;
        }
        /* All-zero blocks get d = 0, as quantize_row gives for zeros. */
        const uint16_t d = any_nonzero ? h : 0;
        memcpy(b + 8, &d, sizeof d);
    }
    return BN_OK;
}
