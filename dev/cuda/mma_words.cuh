/*
 * mma_words.cuh - the weight side of the labs' tensor-core products for a
 * few rows (w2a8_gemm_cluster.cu, w2a8_gemm_staged.cu), in the shipped
 * mma-rows kernel's k order (src/cuda/w2a8_gemm_rows.cu): a chunk-group's
 * 256 k are four quarters u, each two steps h; lane (gid, tig) holds in
 * step (u, h) the fields 2h and 2h + 1 of word tig of the weight entry
 * (u, gid), its k = 64 u + 16 tig + 8 h + 0..3 and + 4..7.
 */
#pragma once

#include <stdint.h>

#include "w2a8_gemv.cuh"

/* Word tig of the entries (u, gid), u = 0..3, of chunk-group g of the
 * warp's TW tiles (words: word tig of entry (0, gid) of its first tile's
 * first chunk-group); 0 past the last tile. */
template <int TW>
__device__ __forceinline__ void load_words(uint32_t (&b)[4][TW], const uint32_t *words,
                                           int64_t groups, int64_t g, int64_t tile0, int64_t tiles)
{
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int t = 0; t < TW; t++) {
            uint32_t v = 0;
            if (tile0 + t < tiles)
                asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];"
                             : "=r"(v)
                             : "l"(words + ((int64_t)t * groups + g) * (kGemvBlockBytes / 4) +
                                   u * 32));
            b[u][t] = v;
        }
}
