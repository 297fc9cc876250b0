/*
 * fmt_tq.c - llama.cpp's ternary block formats TQ1_0 and TQ2_0.
 *
 * Both hold 256 weights per block, each weight a "digit" t in {0, 1, 2}
 * meaning t - 1 in {-1, 0, +1}, and end with the block's scale d as a
 * little-endian IEEE half:  x = (t - 1) * d.
 *
 * TQ2_0 - 66 bytes, 2 bits per weight:
 *
 *     +-------------------------------+-------------------------------+------+
 *     | qs[0..31]  elements   0..127  | qs[32..63] elements 128..255  |  d   |
 *     +-------------------------------+-------------------------------+------+
 *     0                               32                              64     66
 *
 *   Byte qs[32c + m] (c = 0, 1; m = 0..31) holds the four elements
 *   128c + m, 128c + m + 32, 128c + m + 64, 128c + m + 96 in bits 1-0, 3-2,
 *   5-4, 7-6. The code 3 is never written; read back it means +2 * d.
 *
 * TQ1_0 - 54 bytes, 1.6875 bits per weight, five digits per byte in base 3:
 *
 *     +--------------------+--------------------+----------+------+
 *     | qs[0..31]          | qs[32..47]         | qh[0..3] |  d   |
 *     | elements 0..159    | elements 160..239  | 240..255 |      |
 *     +--------------------+--------------------+----------+------+
 *     0                    32                   48         52     54
 *
 *     qs[m]      (m = 0..31) holds elements m, m+32, m+64, m+96, m+128
 *     qs[32 + m] (m = 0..15) holds elements 160+m, 176+m, 192+m, 208+m, 224+m
 *     qh[m]      (m = 0..3)  holds elements 240+m, 244+m, 248+m, 252+m, and 0
 *
 *   The five digits, first element most significant, form v in 0..242. The
 *   byte stores v / 243 as a fixed-point fraction rounded up,
 *   ceil(v * 256 / 243) = (v * 256 + 242) / 243, so that digit k (k = 0 is
 *   the most significant) comes back as: multiply the byte by 3^k modulo
 *   256 (shifting the fraction k digits left and dropping the whole part),
 *   then take the integer part of 3 * fraction, i.e. (byte * 3) >> 8.
 *
 * Quantizing arbitrary floats (both formats, as ggml's quantize_row_tq*_ref
 * and gguf-py do): d = max |x| over the block (in float), t = round(x / d)
 * + 1 with ties away from zero, computed as x * (1/d) (all 1 when d = 0),
 * and the half of d is stored.
 *
 * Per-tensor form (pack/unpack): a BitNet tensor is codes {-1, 0, 1} times
 * one scale. pack stores fp16(scale) in every block holding a non-zero code
 * and 0 in all-zero blocks, which is byte for byte what quantize_row gives
 * for the floats codes * scale when scale >= 0. unpack accepts a tensor
 * whose blocks all carry the same scale, except blocks that contribute only
 * zeros (all codes 0, or d = +-0: their codes come back as 0); it returns
 * that common d as a float, or 0 when every block is zero.
 */
#include "fmt_tq.h"

#include <math.h>
#include <string.h>

#include "fp16.h"

enum {
    TQ_BLOCK_ELEMS = 256,
    TQ1_0_BLOCK_BYTES = 54,
    TQ1_0_SCALE_OFFSET = 52,
    TQ2_0_BLOCK_BYTES = 66,
    TQ2_0_SCALE_OFFSET = 64,
};

static const uint8_t powers_of_3[5] = {1, 3, 9, 27, 81};

static uint16_t load_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static void store_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/* The digit for x * (1/d): round half away from zero (C's roundf, gguf-py's
 * np_roundf) plus one. |x * (1/d)| never exceeds 1 by more than rounding
 * error, so the clamp and the NaN test only matter for inputs on which the
 * references are undefined (NaN, or 1/d overflowing). */
static uint8_t ternary_digit(float v)
{
    if (!(v == v))
        return 1;
    const float r = roundf(v);
    if (r >= 1.0f)
        return 2;
    if (r <= -1.0f)
        return 0;
    return 1;
}

/* Digits of one block of floats; returns the block maximum d (float). */
static float quantize_block_digits(const float *x, uint8_t digits[TQ_BLOCK_ELEMS])
{
    float amax = 0.0f;
    for (int i = 0; i < TQ_BLOCK_ELEMS; i++) {
        const float a = fabsf(x[i]);
        if (a > amax)
            amax = a;
    }
    const float inverse_d = amax != 0.0f ? 1.0f / amax : 0.0f;
    for (int i = 0; i < TQ_BLOCK_ELEMS; i++)
        digits[i] = ternary_digit(x[i] * inverse_d);
    return amax;
}

/* ---- TQ2_0 block coding ----------------------------------------------------- */

static void tq2_0_encode(const uint8_t digits[TQ_BLOCK_ELEMS], uint8_t *block)
{
    for (int c = 0; c < 2; c++)
        for (int m = 0; m < 32; m++) {
            const uint8_t *d = digits + 128 * c + m;
            block[32 * c + m] = (uint8_t)(d[0] | (d[32] << 2) | (d[64] << 4) | (d[96] << 6));
        }
}

/* Digits 0..3 (3 only in blocks ggml never writes). */
static void tq2_0_decode(const uint8_t *block, uint8_t digits[TQ_BLOCK_ELEMS])
{
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 4; k++)
            for (int m = 0; m < 32; m++)
                digits[128 * c + 32 * k + m] = (block[32 * c + m] >> (2 * k)) & 3;
}

/* ---- TQ1_0 block coding ----------------------------------------------------- */

/* ceil(v * 256 / 243): the base-3 number v (0..242) as a byte fraction. */
static uint8_t base3_to_byte(unsigned v)
{
    return (uint8_t)((v * 256 + 242) / 243);
}

/* Digit k (0 = most significant) of a byte written by base3_to_byte. */
static uint8_t byte_digit(uint8_t byte, int k)
{
    const uint8_t shifted = (uint8_t)(byte * powers_of_3[k]); /* modulo 256 */
    return (uint8_t)((shifted * 3u) >> 8);
}

static void tq1_0_encode(const uint8_t digits[TQ_BLOCK_ELEMS], uint8_t *block)
{
    for (int m = 0; m < 32; m++) {
        unsigned v = 0;
        for (int k = 0; k < 5; k++)
            v = v * 3 + digits[32 * k + m];
        block[m] = base3_to_byte(v);
    }
    for (int m = 0; m < 16; m++) {
        unsigned v = 0;
        for (int k = 0; k < 5; k++)
            v = v * 3 + digits[160 + 16 * k + m];
        block[32 + m] = base3_to_byte(v);
    }
    for (int m = 0; m < 4; m++) {
        unsigned v = 0;
        for (int k = 0; k < 4; k++)
            v = v * 3 + digits[240 + 4 * k + m];
        block[48 + m] = base3_to_byte(v * 3); /* fifth digit 0 */
    }
}

static void tq1_0_decode(const uint8_t *block, uint8_t digits[TQ_BLOCK_ELEMS])
{
    for (int k = 0; k < 5; k++)
        for (int m = 0; m < 32; m++)
            digits[32 * k + m] = byte_digit(block[m], k);
    for (int k = 0; k < 5; k++)
        for (int m = 0; m < 16; m++)
            digits[160 + 16 * k + m] = byte_digit(block[32 + m], k);
    for (int k = 0; k < 4; k++)
        for (int m = 0; m < 4; m++)
            digits[240 + 4 * k + m] = byte_digit(block[48 + m], k);
}

/* ---- what the two formats share ----------------------------------------------- */

typedef struct tq_format {
    bn_qtype type;
    const char *name;
    int block_bytes;
    int scale_offset;
    void (*encode)(const uint8_t digits[TQ_BLOCK_ELEMS], uint8_t *block);
    void (*decode)(const uint8_t *block, uint8_t digits[TQ_BLOCK_ELEMS]);
} tq_format;

static const tq_format tq1_0_format = {BN_QTYPE_TQ1_0, "tq1_0", TQ1_0_BLOCK_BYTES,
                                       TQ1_0_SCALE_OFFSET, tq1_0_encode, tq1_0_decode};
static const tq_format tq2_0_format = {BN_QTYPE_TQ2_0, "tq2_0", TQ2_0_BLOCK_BYTES,
                                       TQ2_0_SCALE_OFFSET, tq2_0_encode, tq2_0_decode};

static void dequantize_row(const tq_format *f, const void *src, float *dst, int64_t n)
{
    const uint8_t *block = src;
    uint8_t digits[TQ_BLOCK_ELEMS];
    for (int64_t b = 0; b < n / TQ_BLOCK_ELEMS; b++, block += f->block_bytes) {
        const float d = bn_fp16_to_fp32(load_le16(block + f->scale_offset));
        f->decode(block, digits);
        float *y = dst + b * TQ_BLOCK_ELEMS;
        for (int i = 0; i < TQ_BLOCK_ELEMS; i++)
            y[i] = (float)(digits[i] - 1) * d;
    }
}

static void quantize_row(const tq_format *f, const float *src, void *dst, int64_t n)
{
    uint8_t *block = dst;
    uint8_t digits[TQ_BLOCK_ELEMS];
    for (int64_t b = 0; b < n / TQ_BLOCK_ELEMS; b++, block += f->block_bytes) {
        const float d = quantize_block_digits(src + b * TQ_BLOCK_ELEMS, digits);
        f->encode(digits, block);
        store_le16(block + f->scale_offset, bn_fp32_to_fp16(d));
    }
}

static bn_status pack(const tq_format *f, const int8_t *codes, float scale, int64_t rows,
                      int64_t cols, void *dst, bn_error *err)
{
    if (!codes || !dst)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "%s pack: codes and destination must not be NULL", f->name);
    size_t bytes;
    bn_status st = bn_qtype_tensor_size(f->type, rows, cols, &bytes, err);
    if (st != BN_OK)
        return st;
    const uint16_t scale_half = bn_fp32_to_fp16(scale);
    if (!isfinite(scale) || (scale_half & 0x7c00u) == 0x7c00u)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "a ternary scale must be finite and at most 65504",
                            "%s pack: scale %g does not fit in an fp16 block scale", f->name,
                            (double)scale);

    /* Check every code before writing anything, so a bad input leaves dst
     * untouched. */
    const size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = 0; i < n; i++)
        if (codes[i] < -1 || codes[i] > 1)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                "ternary codes must be -1, 0 or +1",
                                "%s pack: code %d at row %lld, column %lld", f->name,
                                (int)codes[i], (long long)(i / (size_t)cols),
                                (long long)(i % (size_t)cols));

    uint8_t *block = dst;
    uint8_t digits[TQ_BLOCK_ELEMS];
    for (size_t first = 0; first < n; first += TQ_BLOCK_ELEMS, block += f->block_bytes) {
        bool any_nonzero = false;
        for (int i = 0; i < TQ_BLOCK_ELEMS; i++) {
            digits[i] = (uint8_t)(codes[first + (size_t)i] + 1);
            any_nonzero |= codes[first + (size_t)i] != 0;
        }
        f->encode(digits, block);
        /* An all-zero block gets d = 0, as quantize_row would write. */
        store_le16(block + f->scale_offset, any_nonzero ? scale_half : 0);
    }
    return BN_OK;
}

static bn_status unpack(const tq_format *f, const void *src, size_t src_bytes, int64_t rows,
                        int64_t cols, int8_t *codes, float *scale, bn_error *err)
{
    if (!src || !codes || !scale)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "%s unpack: source, codes and scale must not be NULL", f->name);
    size_t need;
    bn_status st = bn_qtype_tensor_size(f->type, rows, cols, &need, err);
    if (st != BN_OK)
        return st;
    if (src_bytes < need)
        return bn_error_set(err, BN_ERR_FORMAT, "the file is truncated or the shape is wrong",
                            "%s tensor %lld x %lld needs %zu bytes, have %zu", f->name,
                            (long long)rows, (long long)cols, need, src_bytes);

    const int64_t blocks_per_row = cols / TQ_BLOCK_ELEMS;
    const uint8_t *block = src;
    uint8_t digits[TQ_BLOCK_ELEMS];
    bool have_common = false;
    uint16_t common_half = 0;
    int64_t common_row = 0, common_block = 0;

    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < blocks_per_row; b++, block += f->block_bytes) {
            const uint16_t d_half = load_le16(block + f->scale_offset);
            if ((d_half & 0x7c00u) == 0x7c00u)
                return bn_error_set(err, BN_ERR_FORMAT, "the file is corrupt",
                                    "%s tensor: block %lld of row %lld has a non-finite scale "
                                    "(fp16 0x%04x)",
                                    f->name, (long long)b, (long long)r, (unsigned)d_half);
            f->decode(block, digits);
            int8_t *out = codes + r * cols + b * TQ_BLOCK_ELEMS;
            bool any_nonzero = false, any_plus_two = false;
            for (int i = 0; i < TQ_BLOCK_ELEMS; i++) {
                out[i] = (int8_t)(digits[i] - 1);
                any_nonzero |= digits[i] != 1;
                any_plus_two |= digits[i] == 3;
            }
            if (!any_nonzero)
                continue;
            if ((d_half & 0x7fffu) == 0) {
                /* Scale zero: every value is 0 whatever the codes say. */
                memset(out, 0, TQ_BLOCK_ELEMS);
                continue;
            }
            if (any_plus_two)
                return bn_error_set(err, BN_ERR_UNSUPPORTED,
                                    "dequantize this tensor to floats instead",
                                    "%s tensor: block %lld of row %lld holds the 2-bit code 3 "
                                    "(value +2 * d), which is not ternary",
                                    f->name, (long long)b, (long long)r);
            if (!have_common) {
                have_common = true;
                common_half = d_half;
                common_row = r;
                common_block = b;
            } else if (d_half != common_half) {
                return bn_error_set(
                    err, BN_ERR_UNSUPPORTED,
                    "this tensor has a scale per block (not one per tensor); dequantize it "
                    "to floats instead",
                    "%s tensor: block scales differ: %g in block %lld of row %lld, %g in "
                    "block %lld of row %lld",
                    f->name, (double)bn_fp16_to_fp32(common_half), (long long)common_block,
                    (long long)common_row, (double)bn_fp16_to_fp32(d_half), (long long)b,
                    (long long)r);
            }
        }
    }
    *scale = have_common ? bn_fp16_to_fp32(common_half) : 0.0f;
    return BN_OK;
}

/* ---- public entry points ---------------------------------------------------- */

void bn_dequantize_row_tq1_0(const void *src, float *dst, int64_t n)
{
    dequantize_row(&tq1_0_format, src, dst, n);
}

void bn_dequantize_row_tq2_0(const void *src, float *dst, int64_t n)
{
    dequantize_row(&tq2_0_format, src, dst, n);
}

void bn_quantize_row_tq1_0(const float *src, void *dst, int64_t n)
{
    quantize_row(&tq1_0_format, src, dst, n);
}

void bn_quantize_row_tq2_0(const float *src, void *dst, int64_t n)
{
    quantize_row(&tq2_0_format, src, dst, n);
}

bn_status bn_unpack_tq1_0(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                          int8_t *codes, float *scale, bn_error *err)
{
    return unpack(&tq1_0_format, src, src_bytes, rows, cols, codes, scale, err);
}

bn_status bn_pack_tq1_0(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                        bn_error *err)
{
    return pack(&tq1_0_format, codes, scale, rows, cols, dst, err);
}

bn_status bn_unpack_tq2_0(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                          int8_t *codes, float *scale, bn_error *err)
{
    return unpack(&tq2_0_format, src, src_bytes, rows, cols, codes, scale, err);
}

bn_status bn_pack_tq2_0(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                        bn_error *err)
{
    return pack(&tq2_0_format, codes, scale, rows, cols, dst, err);
}
