/*
 * cuda_layout.h - the packed weight layout of the CUDA W2A8 kernels, built
 * on the host (plain C, so CPU CI tests the packer) and uploaded once.
 *
 * Rows are grouped in tiles of 8; K is cut into chunk-groups of 256
 * weights. Tile t, chunk-group g is one contiguous 512-byte block:
 *
 *     block (t, g) at byte (t * G + g) * 512,   G = ceil(K / 256)
 *     entry e = q * 8 + r  (16 bytes each):  row 8t + r, weights
 *                                            k = 256g + 64q + [0, 64)
 *
 * so the 32 lanes of a warp loading 16 bytes each read one whole block:
 * lane l gets row l % 8, quarter l / 8. Inside an entry, 32-bit word i
 * covers k offsets 16i .. 16i+15; its byte p holds the 2-bit codes
 * (code = weight + 1) of offsets 16i + p, +4, +8, +12 at bits 0-1, 2-3,
 * 4-5, 6-7:
 *
 *     (word >> 2j) & 0x03030303  =  codes of offsets 16i + 4j .. 16i + 4j + 3
 *
 * which is exactly one dp4a operand against one int32 of activations.
 * Padding rows and the K tail carry code 1 (weight 0) and meet zero
 * activations, so they add nothing; sum w*x = sum code*x - sum x.
 */
#ifndef BN_CUDA_LAYOUT_H
#define BN_CUDA_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

enum {
    BN_CUDA_TILE_ROWS = 8,
    BN_CUDA_GROUP = 256,      /* weights per row in one chunk-group */
    BN_CUDA_BLOCK_BYTES = 512 /* one tile's chunk-group */
};

typedef struct bn_cuda_layout {
    int64_t n, k;     /* logical shape        */
    int64_t tiles;    /* ceil(n / 8)          */
    int64_t groups;   /* G = ceil(k / 256)    */
    int64_t k_padded; /* G * 256              */
    size_t bytes;     /* tiles * G * 512      */
} bn_cuda_layout;

void bn_cuda_layout_init(bn_cuda_layout *l, int64_t n, int64_t k);

/* Packs codes [n][k] (values -1, 0, +1) into dst (l->bytes). */
void bn_cuda_layout_pack(const bn_cuda_layout *l, const int8_t *codes, uint8_t *dst);

/* The weight (-1, 0, +1) at row r, column c of a packed buffer; the
 * definition the kernels implement, used by tests. */
int bn_cuda_layout_get(const bn_cuda_layout *l, const uint8_t *packed, int64_t r, int64_t c);

#endif
