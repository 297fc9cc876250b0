/*
 * provider_neon_dotprod.c - W2A8 with the ARMv8.2 dot product (SDOT: four
 * int8 x int8 products summed into each int32 lane in one instruction).
 *
 * Layout, packing, activation quantizer and tile drivers: neon_layout.h
 * (shared with the baseline "neon" provider). This file is compiled with
 * -march=armv8.2-a+dotprod and runs only after bn_neon_dotprod_available()
 * (HWCAP_ASIMDDP) said yes; that check lives in provider_neon.c so that it
 * is itself baseline code.
 *
 * The decoded codes (0, 1, 2) go to SDOT as signed bytes. Unsigned x signed
 * (USDOT) would need the i8mm extension, which dotprod CPUs may lack. Lane
 * bound: one group adds 4 fields x 4 products of at most 256 in magnitude
 * to a lane, and k <= 2^22 means at most 2^16 groups: 2^28, exact in int32.
 */

#include "neon_layout.h"

static bn_status neondot_pack(const int8_t *codes, int64_t n, int64_t k, float scale,
                              bn_w2a8_weights *w, bn_error *err)
{
    return bn_neon_pack_weights(&bn_provider_neondot, codes, n, k, scale, w, err);
}

/* The bn_neon_tile_fn of this provider. Always inlined with constant rows
 * and acts_n (see neondot_tile), so the loops over them unroll and every
 * accumulator lives in a register. */
static inline __attribute__((always_inline)) void
accumulate_groups(const uint8_t *const wrow[], const int rows, const int8_t *const xrow[],
                  const int acts_n, int64_t groups,
                  int32x4_t acc[BN_NEON_TILE_ACTS][BN_NEON_TILE_ROWS])
{
    for (int64_t g = 0; g < groups; g++) {
        int8x16_t codes[BN_NEON_TILE_ROWS][4];
        for (int i = 0; i < rows; i++)
            bn_neon_decode_group(wrow[i] + g * BN_NEON_GROUP_BYTES, codes[i]);
        for (int a = 0; a < acts_n; a++) {
            int8x16_t xv[4];
            bn_neon_load_group(xrow[a] + g * BN_NEON_GROUP, xv);
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < 4; j++)
                    acc[a][i] = vdotq_s32(acc[a][i], codes[i][j], xv[j]);
        }
    }
}

BN_NEON_DEFINE_TILE(neondot_tile, accumulate_groups)

static void neondot_matvec(const bn_w2a8_weights *w, const int8_t *xq, float act_scale,
                           int32_t act_sum, int64_t row_begin, int64_t row_end, float *y)
{
    bn_neon_matvec(neondot_tile, w, xq, act_scale, act_sum, row_begin, row_end, y);
}

static void neondot_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t row_begin,
                           int64_t row_end, float *y, int64_t ldy)
{
    bn_neon_matmul(neondot_tile, w, x, row_begin, row_end, y, ldy);
}

const bn_kernel_provider bn_provider_neondot = {
    .name = "neondot",
    .priority = 32,
    .is_available = bn_neon_dotprod_available,
    .pack_weights = neondot_pack,
    .matmul = neondot_matmul,
    .matvec = neondot_matvec,
    .quantize_activations = bn_neon_quantize_activations,
    .norm_quantize_row = bn_neon_norm_quantize_row,
};
