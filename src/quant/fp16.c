/*
 * fp16.c - IEEE binary16 ("half") and bfloat16 <-> binary32 conversions.
 *
 * Bit layouts (sign s, exponent e, mantissa m):
 *
 *   binary32  s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   bias 127
 *   binary16  s eeeee mmmmmmmmmm                   bias 15, subnormals below 2^-14
 *   bfloat16  s eeeeeeee mmmmmmm                   the top half of a binary32
 *
 * Everything is done on integer bit patterns, so the results do not depend
 * on the FPU, its rounding mode, flush-to-zero settings or F16C support,
 * and they match the references bit for bit:
 *
 *   - float -> half is what numpy's astype(np.float16) gives (its portable
 *     npy_floatbits_to_halfbits): round to nearest, ties to even, including
 *     in the subnormal range; overflow (|x| >= 65520) becomes infinity; a NaN
 *     keeps its sign and the top 10 bits of its payload, and if those are
 *     all zero the payload becomes 1 so the result is still a NaN. A quiet
 *     NaN therefore stays quiet, a signalling one stays signalling, and every
 *     half survives half -> float -> half unchanged.
 *   - half -> float is exact (every half is a float); NaN payloads are kept.
 *   - float -> bf16 is ggml's ggml_compute_fp32_to_bf16 and gguf-py's BF16
 *     quantizer: add 0x7fff plus the lowest kept bit, then truncate (round to
 *     nearest even, overflow carries into infinity); subnormals are rounded,
 *     not flushed; a NaN keeps its top 16 bits and gets the quiet bit set.
 *   - bf16 -> float is a 16-bit shift.
 */
#include "fp16.h"

#include <string.h>

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float bn_fp16_to_fp32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;

    if (exponent == 0x1f) /* infinity or NaN: keep the payload */
        return bits_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent != 0) /* normal: rebias 15 -> 127 */
        return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    if (mantissa == 0)
        return bits_float(sign);

    /* Subnormal half: value = mantissa * 2^-24. Shift the leading one up to
     * the implicit-bit position; each shift lowers the exponent by one. */
    uint32_t float_exponent = 113; /* biased exponent of 2^-14 */
    while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        float_exponent--;
    }
    return bits_float(sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13));
}

uint16_t bn_fp32_to_fp16(float f)
{
    const uint32_t bits = float_bits(f);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    const uint32_t exponent = magnitude >> 23; /* biased by 127 */
    const uint32_t mantissa = magnitude & 0x7fffffu;

    if (exponent == 0xff) {
        if (mantissa == 0)
            return (uint16_t)(sign | 0x7c00u);
        uint16_t payload = (uint16_t)(mantissa >> 13);
        if (payload == 0)
            payload = 1; /* the payload lived only in the dropped bits */
        return (uint16_t)(sign | 0x7c00u | payload);
    }
    if (exponent >= 143) /* |f| >= 2^16: beyond any half, even after rounding */
        return (uint16_t)(sign | 0x7c00u);

    uint32_t half;      /* the truncated result                          */
    uint32_t dropped;   /* the bits shifted out                          */
    uint32_t halfway;   /* the value of `dropped` exactly between halves */
    if (exponent >= 113) {
        /* Normal half (|f| >= 2^-14): keep 10 of the 23 mantissa bits. */
        half = ((exponent - 112) << 10) | (mantissa >> 13);
        dropped = mantissa & 0x1fffu;
        halfway = 0x1000u;
    } else {
        /* Subnormal half or zero: the result counts units of 2^-24. With
         * the implicit one restored the float is full * 2^(exponent-150),
         * so the count is full >> (126 - exponent). Below 2^-25 (shift 25
         * and more) everything rounds to zero. */
        if (exponent < 102)
            return sign;
        const uint32_t full = mantissa | 0x800000u;
        const uint32_t shift = 126 - exponent; /* 14 ... 24 */
        half = full >> shift;
        dropped = full & ((1u << shift) - 1);
        halfway = 1u << (shift - 1);
    }
    /* Round to nearest, ties to even. A carry out of the mantissa moves to
     * the next exponent (or from the largest subnormal to the smallest
     * normal, or from 65504 to infinity), which is the correct encoding. */
    if (dropped > halfway || (dropped == halfway && (half & 1u)))
        half++;
    return (uint16_t)(sign | half);
}

float bn_bf16_to_fp32(uint16_t b)
{
    return bits_float((uint32_t)b << 16);
}

uint16_t bn_fp32_to_bf16(float f)
{
    const uint32_t bits = float_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it, make it quiet */
        return (uint16_t)((bits >> 16) | 0x40u);
    /* Cannot overflow: the largest non-NaN pattern is 0xff800000. */
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
