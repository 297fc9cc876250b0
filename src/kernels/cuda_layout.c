#include "cuda_layout.h"

#include <string.h>

void bn_cuda_layout_init(bn_cuda_layout *l, int64_t n, int64_t k)
{
    l->n = n;
    l->k = k;
    l->tiles = (n + BN_CUDA_TILE_ROWS - 1) / BN_CUDA_TILE_ROWS;
    l->groups = (k + BN_CUDA_GROUP - 1) / BN_CUDA_GROUP;
    l->k_padded = l->groups * BN_CUDA_GROUP;
    l->bytes = (size_t)(l->tiles * l->groups * BN_CUDA_BLOCK_BYTES);
}

/* Byte and bit position of weight (r, c). */
static size_t locate(const bn_cuda_layout *l, int64_t r, int64_t c, int *shift)
{
    const int64_t t = r / BN_CUDA_TILE_ROWS, row = r % BN_CUDA_TILE_ROWS;
    const int64_t g = c / BN_CUDA_GROUP, in_group = c % BN_CUDA_GROUP;
    const int64_t q = in_group / 64, in_entry = in_group % 64;
    const int64_t word = in_entry / 16, in_word = in_entry % 16;
    const int64_t byte = in_word % 4, field = in_word / 4;
    *shift = (int)(2 * field);
    return (size_t)((t * l->groups + g) * BN_CUDA_BLOCK_BYTES + (q * 8 + row) * 16 + word * 4 +
                    byte);
}

void bn_cuda_layout_pack(const bn_cuda_layout *l, const int8_t *codes, uint8_t *dst)
{
    memset(dst, 0x55, l->bytes); /* code 1 everywhere: padding is weight 0 */
    for (int64_t r = 0; r < l->n; r++) {
        for (int64_t c = 0; c < l->k; c++) {
            int shift;
            uint8_t *b = dst + locate(l, r, c, &shift);
            *b = (uint8_t)((*b & ~(3 << shift)) | ((codes[r * l->k + c] + 1) << shift));
        }
    }
}

int bn_cuda_layout_get(const bn_cuda_layout *l, const uint8_t *packed, int64_t r, int64_t c)
{
    int shift;
    return ((packed[locate(l, r, c, &shift)] >> shift) & 3) - 1;
}
