/*
 * x86_layout.h - the packed weight layout shared by the AVX2, AVX-512 and
 * AVX-512 VNNI providers: grouped_layout.h with groups of 256.
 *
 * Each row is cut into groups of 256 weights stored in 64 bytes. Byte p of
 * a group holds the 2-bit codes (code = weight + 1) of elements p, p+64,
 * p+128 and p+192, least significant first:
 *
 *     group byte p:  [ e(p+192) | e(p+128) | e(p+64) | e(p) ]
 *                      bits 7-6    5-4        3-2      1-0
 *
 * so one 64-byte load, split by shift-and-mask (or by mask alone, keeping
 * each field at its place value), gives four vectors of 64 codes that pair
 * with four consecutive 64-byte runs of activations. Unsigned codes feed
 * the u8 x s8 instructions (vpmaddubsw, vpdpbusd) directly; the activation
 * row sum corrects for the +1:  sum w*x = sum code*x - sum x.
 *
 * Rows are padded to whole groups with code 1 (weight 0); kernels pair the
 * padding with zero activations. row_stride = ceil(k / 256) * 64 bytes.
 */
#ifndef BN_X86_LAYOUT_H
#define BN_X86_LAYOUT_H

#include "grouped_layout.h"

enum { BN_X86_GROUP = 256, BN_X86_GROUP_BYTES = 64 };

static inline bn_status bn_x86_pack_weights(const bn_kernel_provider *owner, const int8_t *codes,
                                            int64_t n, int64_t k, float scale,
                                            bn_w2a8_weights *w, bn_error *err)
{
    return bn_pack_grouped(owner, BN_X86_GROUP, codes, n, k, scale, w, err);
}

#ifdef __AVX512BW__
#include <immintrin.h>

/* Byte masks selecting the valid activations of a row's last, partial
 * group (tail = k % 256 values), one mask per 64-byte field. Masked loads
 * read nothing outside the mask. */
static inline void bn_x86_tail_masks(int64_t tail, __mmask64 masks[4])
{
    for (int j = 0; j < 4; j++) {
        int64_t valid = tail - 64 * j;
        valid = valid < 0 ? 0 : valid > 64 ? 64 : valid;
        masks[j] = valid == 64 ? ~(__mmask64)0 : (((__mmask64)1 << valid) - 1);
    }
}
#endif

#endif
