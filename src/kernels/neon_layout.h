/*
 * neon_layout.h - the packed weight layout, activation quantizer and tile
 * drivers shared by the two aarch64 providers: "neon" (baseline ARMv8
 * ASIMD, provider_neon.c) and "neondot" (SDOT, provider_neon_dotprod.c).
 * The shared code lives in provider_neon.c and uses baseline ASIMD only.
 *
 * Layout (grouped_layout.h with groups of 64). Each row is cut into groups
 * of 64 weights stored in 16 bytes, one
 * 128-bit register. Byte p of a group holds the 2-bit codes (code = weight
 * + 1) of elements p, p+16, p+32 and p+48, least significant first:
 *
 *     group byte p:  [ e(p+48) | e(p+32) | e(p+16) | e(p) ]
 *                      bits 7-6   bits 5-4  bits 3-2  bits 1-0
 *
 *     row r:  | group 0 | group 1 | ... | group G-1 |    G = ceil(k / 64)
 *               16 B      16 B            16 B, padded with code 1
 *
 *     row_stride = G * 16 bytes; row r starts at data + r * row_stride.
 *
 * So one 16-byte load, split by shift and mask, gives four vectors of 16
 * codes ("fields"), and field j pairs with the 16 activations
 * [64g + 16j, 64g + 16j + 16): every load, of weights and of activations,
 * is a contiguous 16-byte stream along the row. A 64-weight group (rather
 * than the 256 of x86_layout.h) is exactly one register, which keeps the
 * decode to one load and keeps a ragged tail at most one 64-byte copy.
 *
 * Codes stay unsigned (0, 1, 2): they are also valid int8 values, so the
 * same decoded vector feeds SDOT and SMLAL (both int8 x int8), and the
 * activation row sum corrects for the +1:  sum w*x = sum code*x - sum x.
 * Padding has code 1 and meets zero activations, so it adds nothing.
 *
 * Exactness: bn_w2a8_pack caps k at 2^22, so sum code*x is at most
 * 2 * 128 * 2^22 = 2^30 in magnitude and every int32 sum here is exact.
 */
#ifndef BN_NEON_LAYOUT_H
#define BN_NEON_LAYOUT_H

#include <arm_neon.h>

#include "grouped_layout.h"

enum { BN_NEON_GROUP = 64, BN_NEON_GROUP_BYTES = 16 };

/* The largest tile: weight rows times activation rows. The drivers below
 * use these shapes only:
 *   matvec: 4 x 1, then 1 x 1 for the last rows of the range;
 *   matmul: 2 x 4 and 2 x 2 (1 x 4, 1 x 2 for an odd last weight row), and
 *           the matvec shapes for a last single activation row. */
enum { BN_NEON_TILE_ROWS = 4, BN_NEON_TILE_ACTS = 4 };

/* One activation row prepared for a call. Whole groups are read in place;
 * the last, partial group comes from a zero-padded copy, because AArch64
 * has no masked loads and the row must not be read past k. */
typedef struct bn_neon_act {
    const int8_t *x;
    _Alignas(16) int8_t tail[BN_NEON_GROUP];
} bn_neon_act;

/* What a provider supplies: adds groups [0, groups) of the weight rows
 * wrow[0 .. rows) times the activation rows xrow[0 .. acts_n) into
 * acc[a][i], int32 lanes that sum to sum code * x (codes 0..2; the driver
 * subtracts the activation sum). The drivers call it for the whole groups
 * of a row, then once more for the zero-padded tail group. It must accept
 * any rows in 1..BN_NEON_TILE_ROWS and acts_n in 1..BN_NEON_TILE_ACTS. */
typedef void bn_neon_tile_fn(const uint8_t *const wrow[], int rows, const int8_t *const xrow[],
                             int acts_n, int64_t groups,
                             int32x4_t acc[BN_NEON_TILE_ACTS][BN_NEON_TILE_ROWS]);

/* Defines `name`, a bn_neon_tile_fn that calls the provider's
 * accumulate(wrow, rows, xrow, acts_n, groups, acc) with constant shapes for
 * the shapes the drivers use (so the compiler keeps the accumulators in
 * registers) and with the run-time shape otherwise. */
#define BN_NEON_DEFINE_TILE(name, accumulate)                                               \
    static void name(const uint8_t *const wrow[], int rows, const int8_t *const xrow[],     \
                     int acts_n, int64_t groups,                                            \
                     int32x4_t acc[BN_NEON_TILE_ACTS][BN_NEON_TILE_ROWS])                   \
    {                                                                                       \
        if (rows == 4 && acts_n == 1)                                                       \
            accumulate(wrow, 4, xrow, 1, groups, acc);                                      \
        else if (rows == 1 && acts_n == 1)                                                  \
            accumulate(wrow, 1, xrow, 1, groups, acc);                                      \
        else if (rows == 2 && acts_n == 4)                                                  \
            accumulate(wrow, 2, xrow, 4, groups, acc);                                      \
        else if (rows == 1 && acts_n == 4)                                                  \
            accumulate(wrow, 1, xrow, 4, groups, acc);                                      \
        else if (rows == 2 && acts_n == 2)                                                  \
            accumulate(wrow, 2, xrow, 2, groups, acc);                                      \
        else if (rows == 1 && acts_n == 2)                                                  \
            accumulate(wrow, 1, xrow, 2, groups, acc);                                      \
        else                                                                                \
            accumulate(wrow, rows, xrow, acts_n, groups, acc);                              \
    }

/* The 64 codes of one group as four int8 vectors; codes[j] holds elements
 * 16j .. 16j + 15 of the group. */
static inline void bn_neon_decode_group(const uint8_t *group, int8x16_t codes[4])
{
    const uint8x16_t packed = vld1q_u8(group);
    const uint8x16_t three = vdupq_n_u8(3);
    codes[0] = vreinterpretq_s8_u8(vandq_u8(packed, three));
    codes[1] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(packed, 2), three));
    codes[2] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(packed, 4), three));
    codes[3] = vreinterpretq_s8_u8(vshrq_n_u8(packed, 6));
}

/* The 64 activations of one group, in the same four pieces. */
static inline void bn_neon_load_group(const int8_t *x, int8x16_t xv[4])
{
    for (int j = 0; j < 4; j++)
        xv[j] = vld1q_s8(x + 16 * j);
}

/* Packs canonical codes [n][k] into the layout above; w->provider = owner. */
static inline bn_status bn_neon_pack_weights(const bn_kernel_provider *owner, const int8_t *codes,
                                             int64_t n, int64_t k, float scale,
                                             bn_w2a8_weights *w, bn_error *err)
{
    return bn_pack_grouped(owner, BN_NEON_GROUP, codes, n, k, scale, w, err);
}

/* bn_quantize_activations_row, 16 values at a time; identical results. */
void bn_neon_quantize_activations(const float *x, int64_t k, int8_t *xq, float *scale,
                                  int32_t *sum);
/* bn_norm_quantize_row, 8 values a step; identical results. */
void bn_neon_norm_quantize_row(const float *x, const float *w, int64_t n, float eps, int8_t *q,
                               float *scale, int32_t *sum);

/* The provider matvec / matmul contracts, computed tile by tile with the
 * provider's tile function. */
void bn_neon_matvec(bn_neon_tile_fn *tile, const bn_w2a8_weights *w, const int8_t *xq,
                    float act_scale, int32_t act_sum, int64_t row_begin, int64_t row_end,
                    float *y);
void bn_neon_matmul(bn_neon_tile_fn *tile, const bn_w2a8_weights *w, const bn_q8_rows *x,
                    int64_t row_begin, int64_t row_end, float *y, int64_t ldy);

/* Whether SDOT may run: in provider_neon.c, so that the check itself is
 * compiled for baseline ARMv8 and not with the dotprod file's flags. */
bool bn_neon_dotprod_available(void);

#endif
