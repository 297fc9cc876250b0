/*
 * grouped_layout.h - the packing shared by the SIMD providers: 2-bit codes
 * (code = weight + 1) in groups of G weights stored in G/4 bytes, where
 * byte p of a group holds elements p, p + G/4, p + 2G/4, p + 3G/4 at bits
 * 0-1, 2-3, 4-5, 6-7. One load of G/4 bytes then splits into four vectors
 * of G/4 codes, each pairing with a contiguous run of G/4 activations.
 *
 * Rows are padded to whole groups with code 1 (weight 0); kernels pair the
 * padding with zero activations. row_stride = ceil(k / G) * G/4 bytes.
 * G is 256 on x86 (one 64-byte register per group, x86_layout.h) and 64
 * on aarch64 (one 16-byte register, neon_layout.h).
 */
#ifndef BN_GROUPED_LAYOUT_H
#define BN_GROUPED_LAYOUT_H

#include "kernel_provider.h"

/* Packs codes [n][k] with group size `group` (a multiple of 4); the result
 * belongs to `owner`. */
bn_status bn_pack_grouped(const bn_kernel_provider *owner, int64_t group, const int8_t *codes,
                          int64_t n, int64_t k, float scale, bn_w2a8_weights *w, bn_error *err);

#endif
