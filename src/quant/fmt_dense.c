/*
 * fmt_dense.c - the dense encodings an embedding or LM head arrives in:
 * F32, F16, BF16 and ggml's block formats Q8_0, Q4_K and Q6_K.
 *
 * All multi-byte fields are little-endian and read byte by byte, so blocks
 * may sit at any address (a Q6_K block is 210 bytes: rows are not aligned).
 * "fp16" below is an IEEE half (see fp16.c).
 *
 * F32 / F16 / BF16: one element per 4 / 2 / 2 bytes, no blocks.
 *
 * Q8_0 - 32 elements in 34 bytes:
 *
 *     +--------+--------------------------------+
 *     | d fp16 | qs[32] int8                    |   x[i] = qs[i] * d
 *     +--------+--------------------------------+
 *     0        2                               34
 *
 *   Quantizing: amax = max |x|, d = amax / 127, qs[i] = round(x[i] * (1/d))
 *   with ties away from zero (0 when d is 0), then d is stored as fp16.
 *
 * Q4_K - 256 elements in 144 bytes, eight sub-blocks of 32:
 *
 *     +--------+-----------+------------+-------------------------+
 *     | d fp16 | dmin fp16 | scales[12] | qs[128] 4-bit, 2 per B  |
 *     +--------+-----------+------------+-------------------------+
 *     0        2           4            16                       144
 *
 *   Sub-block j has a 6-bit scale sc[j] and a 6-bit min mn[j], packed in
 *   the 12 scale bytes; for k = 0..3 (bit 7 on the left):
 *
 *                  bits 7-6         bits 5-0
 *     byte k       sc[k+4] >> 4     sc[k]
 *     byte k+4     mn[k+4] >> 4     mn[k]
 *
 *                  bits 7-4         bits 3-0
 *     byte k+8     mn[k+4] & 15     sc[k+4] & 15
 *
 *   The quants of sub-blocks 2c and 2c+1 share qs[32c .. 32c+31]: the low
 *   nibble of qs[32c + l] is element l of sub-block 2c, the high nibble
 *   element l of sub-block 2c+1.
 *     x = (d * sc[j]) * q - (dmin * mn[j])
 *
 * Q6_K - 256 elements in 210 bytes, sixteen groups of 16 sharing a scale:
 *
 *     +----------------+----------------+--------------------+--------+
 *     | ql[128] low 4b | qh[64] high 2b | scales[16] int8    | d fp16 |
 *     +----------------+----------------+--------------------+--------+
 *     0                128              192                  208    210
 *
 *   The block is two halves of 128 elements; half h uses ql[64h .. 64h+63]
 *   and qh[32h .. 32h+31]. Element e (0..127) of a half:
 *     low 4 bits:  e < 64: low nibble of ql[e];  e >= 64: high nibble of
 *                  ql[e - 64]
 *     high 2 bits: bits 2*(e/32) .. 2*(e/32)+1 of qh[e % 32]
 *     q = (high << 4 | low) - 32,   x = (d * scales[i / 16]) * q
 *   where i is the element's index in the whole block.
 *
 * Numerics: every result must be bit-identical to gguf-py's numpy code,
 * which works in float32 and evaluates exactly the products written above,
 * in that order, each rounded to float32. In Q4_K d*sc, dmin*mn and (d*sc)*q
 * are exact (11 x 6 x 4 significant bits), so only the final subtraction
 * rounds and a fused multiply-add would give the same answer. In Q6_K
 * (d * scale) * q has no addition to fuse; the order of the two products
 * is kept as written.
 */
#include "fmt_dense.h"

#include <math.h>
#include <string.h>

#include "fp16.h"

enum {
    Q8_0_ELEMS = 32,
    Q8_0_BYTES = 34,
    QK_ELEMS = 256,
    Q4_K_BYTES = 144,
    Q6_K_BYTES = 210,
};

static uint16_t load_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static void store_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static void store_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)((v >> 8) & 0xff);
    p[2] = (uint8_t)((v >> 16) & 0xff);
    p[3] = (uint8_t)(v >> 24);
}

static float load_fp16(const uint8_t *p)
{
    return bn_fp16_to_fp32(load_le16(p));
}

/* ---- F32 / F16 / BF16 ---------------------------------------------------- */

void bn_dequantize_row_f32(const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t bits = load_le32(p + 4 * i);
        memcpy(&dst[i], &bits, sizeof bits); /* bit copy: NaN payloads kept */
    }
}

void bn_dequantize_row_f16(const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = bn_fp16_to_fp32(load_le16(p + 2 * i));
}

void bn_dequantize_row_bf16(const void *src, float *dst, int64_t n)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = bn_bf16_to_fp32(load_le16(p + 2 * i));
}

void bn_quantize_row_f32(const float *src, void *dst, int64_t n)
{
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &src[i], sizeof bits);
        store_le32(p + 4 * i, bits);
    }
}

void bn_quantize_row_f16(const float *src, void *dst, int64_t n)
{
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++)
        store_le16(p + 2 * i, bn_fp32_to_fp16(src[i]));
}

void bn_quantize_row_bf16(const float *src, void *dst, int64_t n)
{
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++)
        store_le16(p + 2 * i, bn_fp32_to_bf16(src[i]));
}

/* ---- Q8_0 ------------------------------------------------------------------ */

/* round() with ties away from zero (C's roundf, gguf-py's np_roundf),
 * clamped to the int8 range. The clamp and the NaN test never change a
 * reference result (|x / d| <= 127 up to rounding); they only keep the
 * conversion defined for inputs the references leave undefined (NaN, or a
 * block maximum so small that 1/d overflows). */
static int8_t round_to_int8(float v)
{
    if (!(v == v))
        return 0;
    if (v > 127.0f)
        return 127;
    if (v < -128.0f)
        return -128;
    const float rounded = roundf(v);
    return (int8_t)rounded;
}

void bn_dequantize_row_q8_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *block = src;
    for (int64_t b = 0; b < n / Q8_0_ELEMS; b++, block += Q8_0_BYTES) {
        const float d = load_fp16(block);
        const int8_t *qs = (const int8_t *)(block + 2);
        float *y = dst + b * Q8_0_ELEMS;
        for (int i = 0; i < Q8_0_ELEMS; i++)
            y[i] = (float)qs[i] * d;
    }
}

void bn_quantize_row_q8_0(const float *src, void *dst, int64_t n)
{
    uint8_t *block = dst;
    for (int64_t b = 0; b < n / Q8_0_ELEMS; b++, block += Q8_0_BYTES) {
        const float *x = src + b * Q8_0_ELEMS;
        float amax = 0.0f;
        for (int i = 0; i < Q8_0_ELEMS; i++) {
            const float a = fabsf(x[i]);
            if (a > amax)
                amax = a;
        }
        /* The division and the reciprocal are in float, as in both
         * references; the quants use the unrounded float d. */
        const float d = amax / 127.0f;
        const float inverse_d = d != 0.0f ? 1.0f / d : 0.0f;
        store_le16(block, bn_fp32_to_fp16(d));
        for (int i = 0; i < Q8_0_ELEMS; i++)
            block[2 + i] = (uint8_t)round_to_int8(x[i] * inverse_d);
    }
}

/* ---- Q4_K ------------------------------------------------------------------ */

/* The 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes. */
static void q4_k_scale_min(const uint8_t *packed, int j, uint8_t *scale, uint8_t *min)
{
    if (j < 4) {
        *scale = packed[j] & 0x3f;
        *min = packed[j + 4] & 0x3f;
    } else {
        *scale = (uint8_t)((packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4));
        *min = (uint8_t)((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
    }
}

void bn_dequantize_row_q4_k(const void *src, float *dst, int64_t n)
{
    const uint8_t *block = src;
    for (int64_t b = 0; b < n / QK_ELEMS; b++, block += Q4_K_BYTES) {
        const float d = load_fp16(block);
        const float dmin = load_fp16(block + 2);
        const uint8_t *packed_scales = block + 4;
        const uint8_t *qs = block + 16;
        float *y = dst + b * QK_ELEMS;

        for (int j = 0; j < 8; j++) {
            uint8_t scale, min;
            q4_k_scale_min(packed_scales, j, &scale, &min);
            const float sub_scale = d * (float)scale;
            const float sub_min = dmin * (float)min;
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                const float product = sub_scale * (float)((q[l] >> shift) & 0x0f);
                y[32 * j + l] = product - sub_min;
            }
        }
    }
}

/* ---- Q6_K ------------------------------------------------------------------ */

void bn_dequantize_row_q6_k(const void *src, float *dst, int64_t n)
{
    const uint8_t *block = src;
    for (int64_t b = 0; b < n / QK_ELEMS; b++, block += Q6_K_BYTES) {
        const uint8_t *ql = block;
        const uint8_t *qh = block + 128;
        const int8_t *scales = (const int8_t *)(block + 192);
        const float d = load_fp16(block + 208);
        float *y = dst + b * QK_ELEMS;

        for (int i = 0; i < QK_ELEMS; i++) {
            const int half = i / 128;
            const int e = i % 128;
            const uint8_t low_byte = ql[64 * half + e % 64];
            const int low = e < 64 ? (low_byte & 0x0f) : (low_byte >> 4);
            const int high = (qh[32 * half + e % 32] >> (2 * (e / 32))) & 0x03;
            const int q = ((high << 4) | low) - 32;
            const float group_scale = d * (float)scales[i / 16];
            y[i] = group_scale * (float)q;
        }
    }
}
