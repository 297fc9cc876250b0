/* Device helpers of the W2A8 GEMV (cuda_layout.h's tile layout), shared by
 * w2a8_gemv.cu and w2a8_gemm_rows.cu, the decode attention's q|k|v product
 * (attn_decode.cu) and (the streaming load) the LM head and the
 * benchmark's read floor. */
#ifndef BN_W2A8_GEMV_CUH
#define BN_W2A8_GEMV_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* cuda_layout.h's tile layout. */
constexpr int kGemvTileRows = 8;     /* rows per tile                        */
constexpr int kGemvGroup = 256;      /* weights per row in one chunk-group   */
constexpr int kGemvBlockBytes = 512; /* one tile's chunk-group               */

/* Weights are read exactly once: load them without allocating in L1, which
 * then keeps the activations every warp re-reads. */
__device__ __forceinline__ uint4 gemv_load_stream(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* dot of one 16-byte entry (64 codes) with 64 activations into N sums (word
 * i of the entry into acc[i % N]); kL2: the activations read through L2
 * (__ldcg: written by a kernel that may have run alongside this one), else
 * plain loads (shared memory, or final data). The sums are integers: how
 * they are split does not change their total. */
template <bool kL2, int N>
__device__ __forceinline__ void gemv_entry_dot_n(uint4 w, const int8_t *x, int (&acc)[N])
{
    const int4 *xv = reinterpret_cast<const int4 *>(x);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int4 a = kL2 ? __ldcg(xv + i) : xv[i]; /* activations 16i .. 16i + 15 */
        const uint32_t wd = words[i];
        int &s = acc[i % N];
        s = __dp4a((int)(wd & 0x03030303u), a.x, s);
        s = __dp4a((int)((wd >> 2) & 0x03030303u), a.y, s);
        s = __dp4a((int)((wd >> 4) & 0x03030303u), a.z, s);
        s = __dp4a((int)((wd >> 6) & 0x03030303u), a.w, s);
    }
}

/* One sum: the streaming GEMVs, whose loads in flight hide the chain. */
template <bool kL2 = false>
__device__ __forceinline__ int gemv_entry_dot(uint4 w, const int8_t *x, int acc)
{
    int s[1] = {acc};
    gemv_entry_dot_n<kL2, 1>(w, x, s);
    return s[0];
}

/* Four sums, chains a quarter as long: a warp running many entries from
 * shared memory back to back with little else in flight (the attention's
 * q|k|v product). The caller adds the four. */
__device__ __forceinline__ void gemv_entry_dot4(uint4 w, const int8_t *x, int (&acc)[4])
{
    gemv_entry_dot_n<false, 4>(w, x, acc);
}

/* Stages `words` 16-byte words of src (16-byte aligned) in shared memory at
 * dst: thread tid of nthreads copies words tid, tid + nthreads, ... with
 * cp.async, so all of a thread's copies are in flight at once (a load-store
 * loop waits one L2 round trip per word: a 27648-wide row over 512 threads
 * was four of them in a row). The copies go through L2 only (.cg): the row
 * may have been written by the kernel this one waited for (PDL). Returns
 * once this thread's copies landed; the caller's __syncthreads then
 * publishes the whole row. */
__device__ __forceinline__ void gemv_stage_row(void *dst, const void *src, int64_t words, int tid,
                                               int nthreads)
{
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(dst);
    const char *from = static_cast<const char *>(src);
    for (int64_t i = tid; i < words; i += nthreads)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(base + (uint32_t)(16 * i)),
                     "l"(from + 16 * i)
                     : "memory");
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

/* ---- the pieces of the decode GEMVs -----------------------------------------
 *
 * Used by w2a8_gemv.cu's gemv_pdl_kernel. A block holds TILES tiles with WARPS warps each; warp
 * `split` of a tile streams the tile's chunk-groups split, split + WARPS,
 * ... (blocks: the tile's first entry of this lane). The first kPre of them
 * are loaded before the PDL wait (pdl.cuh): weights never change, so their
 * loads may overlap the kernel that writes the activations. */
template <int WARPS, int kPre>
__device__ __forceinline__ void gemv_prefetch(uint4 (&wv)[kPre], const uint4 *blocks, int split,
                                              bool live, int64_t groups)
{
#pragma unroll
    for (int u = 0; u < kPre; u++) {
        const int64_t g = split + (int64_t)u * WARPS;
        wv[u] = live && g < groups ? gemv_load_stream(blocks + g * (kGemvBlockBytes / 16))
                                   : make_uint4(0, 0, 0, 0);
    }
}

/* The warp's int32 sum over its chunk-groups: the prefetched entries, then
 * the rest four in flight at a time (as w2a8_gemv.cu's gemv_kernel).
 * xq: the activations this lane's entries meet (its quarter of the row). */
template <int WARPS, int kPre, bool kL2 = false>
__device__ __forceinline__ int gemv_warp_product(const uint4 (&wv)[kPre], const uint4 *blocks,
                                                 const int8_t *xq, int split, int64_t groups)
{
    int acc = 0;
#pragma unroll
    for (int u = 0; u < kPre; u++) {
        const int64_t g = split + (int64_t)u * WARPS;
        if (g < groups)
            acc = gemv_entry_dot<kL2>(wv[u], xq + g * kGemvGroup, acc);
    }
    int64_t g = split + (int64_t)kPre * WARPS;
    for (; g + 3 * WARPS < groups; g += 4 * WARPS) {
        uint4 r4[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            r4[u] = gemv_load_stream(blocks + (g + u * WARPS) * (kGemvBlockBytes / 16));
#pragma unroll
        for (int u = 0; u < 4; u++)
            acc = gemv_entry_dot<kL2>(r4[u], xq + (g + u * WARPS) * kGemvGroup, acc);
    }
    for (; g < groups; g += WARPS)
        acc = gemv_entry_dot<kL2>(gemv_load_stream(blocks + g * (kGemvBlockBytes / 16)),
                             xq + g * kGemvGroup, acc);
    return acc;
}

/* Every warp's sum into its rows: the lanes of one row (r, r + 8, r + 16,
 * r + 24 hold its four quarters), then the split warps of one tile through
 * shared memory. Thread tid < TILES * 8 then owns output row out_row of the
 * block and, when out_row < n, calls write(out_row, sum) with the row's
 * int32 sum. The callers' epilogues differ in where the activation scale
 * and code sum come from (read there from global memory, or already in
 * registers) and in the residual add, so the float epilogue is theirs.
 * tid is the thread's index in the block as the caller holds it (int, or
 * threadIdx.x itself): the row index is computed in that type, so each
 * caller keeps the instructions it had with its own copy of this code.
 * Called by every thread of the block. gemv_tile_partials is its first
 * half: each warp's row sums into partial[tile][split][row], published. */
template <int WARPS, int TILES>
__device__ __forceinline__ void gemv_tile_partials(int acc,
                                                   int (&partial)[TILES][WARPS][kGemvTileRows],
                                                   int tile_in_block, int split, int lane)
{
    acc += __shfl_xor_sync(0xffffffffu, acc, 8);
    acc += __shfl_xor_sync(0xffffffffu, acc, 16);
    if (lane < kGemvTileRows)
        partial[tile_in_block][split][lane] = acc;
    __syncthreads();
}

template <int WARPS, int TILES, class Tid, class Write>
__device__ __forceinline__ void gemv_tile_epilogue(int acc,
                                                   int (&partial)[TILES][WARPS][kGemvTileRows],
                                                   int tile_in_block, int split, int lane, Tid tid,
                                                   int64_t n, Write write)
{
    gemv_tile_partials<WARPS, TILES>(acc, partial, tile_in_block, split, lane);
    if (tid < TILES * kGemvTileRows) {
        const int t = tid / kGemvTileRows, r = tid % kGemvTileRows;
        const int64_t out_row = ((int64_t)blockIdx.x * TILES + t) * kGemvTileRows + r;
        if (out_row < n) {
            int sum = 0;
#pragma unroll
            for (int s = 0; s < WARPS; s++)
                sum += partial[t][s][r];
            write(out_row, sum);
        }
    }
}

#endif
