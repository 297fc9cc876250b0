/*
 * w2a8_kernels.cu - ternary weights x int8 activations on the GPU.
 *
 * Weights use the tile layout of src/kernels/cuda_layout.h (8-row tiles,
 * 512-byte blocks per 256 weights of the 8 rows). Activations are int8 rows
 * of k_padded bytes, zero past k. Every kernel produces
 *
 *     acc = sum code * x  (exact int32; code = weight + 1)
 *     y   = ((float)(acc - act_sum) / act_scale) * weight_scale
 *
 * the same float epilogue as the CPU kernels (bn_w2a8_epilogue), so results
 * are bit-identical to the CPU reference.
 *
 * GEMV (M = 1, decode): memory-bound. A warp reads one 512-byte block per
 * load instruction (16 bytes per lane, fully coalesced); lane l owns row
 * l % 8 of the tile and quarter l / 8 of the block, decodes its 64 codes
 * with shift-and-mask and multiplies them with dp4a. The K loop of a tile
 * is split over WARPS warps (split-K, summed in shared memory) so that even
 * small matrices keep enough loads in flight to fill the memory system.
 *
 * GEMM (M > 1, prefill): int8 tensor cores (mma.sync m16n8k32). A block
 * computes a 64 x 64 output tile; codes are expanded to int8 in shared
 * memory and multiplied with the activation tile; the +1 of the codes is
 * removed with the activation row sums in the epilogue.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "cuda_layout.h"
#include "pdl.cuh"
#include "smem_opt_in.cuh"
#include "w2a8_gemv.cuh"
#include "w2a8_cuda.h"

namespace {

constexpr int kTileRows = kGemvTileRows;
constexpr int kGroup = kGemvGroup;
constexpr int kBlockBytes = kGemvBlockBytes;
/* The longest activation row the GEMVs stage in shared memory (bytes);
 * longer rows are read through L1. */
constexpr int64_t kRowSmemMax = 160 * 1024;

__device__ __forceinline__ float epilogue(int32_t acc, float act_scale, float w_scale)
{
    /* Written exactly as bn_w2a8_epilogue: IEEE division and multiply. */
    return __fmul_rn(__fdiv_rn((float)acc, act_scale), w_scale);
}

/* u8 x s8 dot of four byte pairs (PTX dp4a.u32.s32), for fields kept in
 * place (values up to 192, so they must be unsigned). */
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* As gemv_entry_dot, but each 2-bit field is masked in place instead of shifted
 * down: field j then holds code * 4^j, accumulated separately and divided
 * out at the end (exactly: every term is a multiple of 4^j). One logic op
 * per field instead of two. */
__device__ __forceinline__ void entry_dot_fields(uint4 w, const int8_t *x, int acc[4])
{
    const int4 *xv = reinterpret_cast<const int4 *>(x);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int4 a = xv[i];
        const uint32_t wd = words[i];
        acc[0] = dp4a_us(wd & 0x03030303u, a.x, acc[0]);
        acc[1] = dp4a_us(wd & 0x0c0c0c0cu, a.y, acc[1]);
        acc[2] = dp4a_us(wd & 0x30303030u, a.z, acc[2]);
        acc[3] = dp4a_us(wd & 0xc0c0c0c0u, a.w, acc[3]);
    }
}

/* One block: TILES tiles of 8 rows, WARPS warps per tile splitting K.
 * UNROLL chunk-groups are loaded before any is used (bytes in flight).
 * X_SMEM stages the activation row in shared memory (dynamic, k_padded
 * bytes) instead of reading it through L1. */
template <int WARPS, int TILES, int UNROLL, bool X_SMEM, bool FIELDS = false>
__global__ void __launch_bounds__(32 * WARPS * TILES)
    gemv_kernel(const uint4 *__restrict__ w, const int8_t *__restrict__ x, int64_t n,
                int64_t groups, int64_t tiles, const float *__restrict__ act_scale,
                const int32_t *__restrict__ act_sum, float w_scale, float *__restrict__ y)
{
    extern __shared__ __align__(16) int8_t x_shared[];
    __shared__ int partial[TILES][WARPS][kTileRows];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int tile_in_block = warp / WARPS;
    const int split = warp % WARPS;
    const int64_t tile = (int64_t)blockIdx.x * TILES + tile_in_block;

    const int8_t *xs = x;
    if (X_SMEM) {
        const int64_t words = groups * kGroup / 16;
        gemv_stage_row(x_shared, x, words, (int)threadIdx.x, (int)blockDim.x);
        __syncthreads();
        xs = x_shared;
    }

    int acc = 0;
    int fields[4] = {0, 0, 0, 0};
    if (tile < tiles) {
        const int quarter = lane >> 3;
        const uint4 *blocks = w + tile * groups * (kBlockBytes / 16) + lane;
        const int8_t *xq = xs + quarter * 64;
        int64_t g = split;
        for (; g + (UNROLL - 1) * WARPS < groups; g += UNROLL * WARPS) {
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                v[u] = gemv_load_stream(blocks + (g + u * WARPS) * (kBlockBytes / 16));
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (FIELDS)
                    entry_dot_fields(v[u], xq + (g + u * WARPS) * kGroup, fields);
                else
                    acc = gemv_entry_dot(v[u], xq + (g + u * WARPS) * kGroup, acc);
            }
        }
        for (; g < groups; g += WARPS) {
            if (FIELDS)
                entry_dot_fields(gemv_load_stream(blocks + g * (kBlockBytes / 16)), xq + g * kGroup,
                                 fields);
            else
                acc = gemv_entry_dot(gemv_load_stream(blocks + g * (kBlockBytes / 16)),
                                     xq + g * kGroup, acc);
        }
    }
    if (FIELDS)
        acc = fields[0] + (fields[1] >> 2) + (fields[2] >> 4) + (fields[3] >> 6);
    gemv_tile_epilogue<WARPS, TILES>(acc, partial, tile_in_block, split, lane, threadIdx.x, n,
                                     [&](int64_t out_row, int total) {
                                         y[out_row] =
                                             epilogue(total - act_sum[0], act_scale[0], w_scale);
                                     });
}

template <int WARPS, int TILES, int UNROLL, bool X_SMEM, bool FIELDS>
cudaError_t launch_gemv(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    const int64_t blocks = (a->tiles + TILES - 1) / TILES;
    const size_t smem = X_SMEM ? (size_t)(a->groups * kGroup) : 0;
    auto kernel = gemv_kernel<WARPS, TILES, UNROLL, X_SMEM, FIELDS>;
    const cudaError_t rc = allow_dynamic_smem(kernel, smem);
    if (rc != cudaSuccess)
        return rc;
    kernel<<<(unsigned)blocks, 32 * WARPS * TILES, smem, stream>>>(
        reinterpret_cast<const uint4 *>(a->weights), a->x, a->n, a->groups, a->tiles,
        a->act_scale, a->act_sum, a->weight_scale, a->y);
    return cudaGetLastError();
}

template <int UNROLL, bool X_SMEM, bool FIELDS = false>
cudaError_t launch_gemv_split(const bn_w2a8_cuda_args *a, int split, cudaStream_t stream)
{
    switch (split) {
    case 1: return launch_gemv<1, 4, UNROLL, X_SMEM, FIELDS>(a, stream);
    case 2: return launch_gemv<2, 2, UNROLL, X_SMEM, FIELDS>(a, stream);
    case 4: return launch_gemv<4, 1, UNROLL, X_SMEM, FIELDS>(a, stream);
    case 8: return launch_gemv<8, 1, UNROLL, X_SMEM, FIELDS>(a, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* Blocks of 512 threads (split 8, two tiles) must fit three to an SM, so
 * that a whole grid of them is resident at once (at 44 registers a thread
 * only two fit: 5120 x 27648 chained 10.7 -> 13.3 us on an H200). Others
 * leave ptxas its own choice (0: as if no minimum were given; a minimum of
 * 1 let it take 11-60 more registers a thread, and the decode step, whose
 * GEMVs share SMs with the kernels around them, went 980 -> 1030 us). */
template <int WARPS, int TILES>
constexpr int gemv_pdl_min_blocks()
{
    return WARPS * TILES == 16 ? 3 : 0;
}

/* ---- GEMV of the decode step (programmatic dependent launch) ---------------
 *
 * gemv_kernel's work split (WARPS warps per tile splitting K, TILES tiles
 * per block, activations staged in shared memory when X_SMEM), with the
 * order of its loads changed for latency: each warp first loads up to 8 (4 at
 * split 8) of its chunk-groups' weight entries into registers (all in flight at
 * once), and only then waits for the kernel that wrote the activations
 * (pdl.cuh) and stages them. Weights never change, so this is allowed
 * before the wait; launched with programmatic serialization, the weight
 * stream overlaps the previous kernel. The int32 sums are exact, so the
 * output is gemv_kernel's bit for bit.
 *
 * CL > 1 (with X_SMEM; launched in clusters of CL blocks along x): the
 * activations are staged once per cluster by the tensor memory accelerator
 * (pdl.cuh's row_multicast) instead of by every block from L2.
 *
 * PAIR (w2a8_cuda.h's relu2_pair): the matrix is [gate; up], tiles / 2 tiles
 * each; a block's first TILES / 2 tiles are gate tiles and the others the up
 * tiles of the same rows, so each output row meets its gate and up products
 * in one block and the block writes relu(g sg)^2 (u su) (g and u with weight
 * scale 1, as the separate relu^2 kernel would scale them) instead of the
 * two raw values. */
template <int WARPS, int TILES, bool X_SMEM, int CL = 1, bool PAIR = false>
__global__ void __launch_bounds__(32 * WARPS * TILES, (gemv_pdl_min_blocks<WARPS, TILES>()))
    gemv_pdl_kernel(const uint4 *__restrict__ w, const int8_t *x, int64_t n, int64_t groups,
                    int64_t tiles, const float *act_scale, const int32_t *act_sum, float w_scale,
                    float *__restrict__ y, float sg, float su)
{
    static_assert(CL == 1 || X_SMEM, "the cluster stages into shared memory");
    static_assert(!PAIR || TILES % 2 == 0, "a pair block holds gate and up tiles");
    extern __shared__ __align__(16) int8_t x_shared[];
    __shared__ int partial[TILES][WARPS][kTileRows];
    __shared__ unsigned long long row_bar; /* CL > 1: the staged row's bytes */
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int tile_in_block = warp / WARPS;
    const int split = warp % WARPS;
    constexpr int kPairs = PAIR ? TILES / 2 : 1;
    const int64_t pair = (int64_t)blockIdx.x * kPairs + tile_in_block % kPairs;
    const int64_t tile = !PAIR                    ? (int64_t)blockIdx.x * TILES + tile_in_block
                         : tile_in_block < kPairs ? pair
                                                  : tiles / 2 + pair;
    const bool live = PAIR ? pair < tiles / 2 : tile < tiles;
    const uint4 *blocks = w + (live ? tile : 0) * groups * (kBlockBytes / 16) + lane;
    /* Eight entries per warp cover every chunk-group of a 2560-wide row at
     * split 1 or 2; at split 8, four cover rows up to 8192 (down: 6912). */
    constexpr int kPre = WARPS >= 8 ? 4 : 8;

    uint4 v[kPre];
    gemv_prefetch<WARPS>(v, blocks, split, live, groups);
    const unsigned row_bytes = (unsigned)(groups * kGroup);
    if (CL > 1)
        row_multicast_arm(&row_bar, row_bytes);
    pdl_trigger();
    pdl_wait();

    /* The activations (and their scale and sum) were written by the kernel
     * waited for, which may have run alongside this one: they are read
     * through L2 (__ldcg), never through the read-only path. The scale and
     * sum are loaded first, by the threads that write rows, so they arrive
     * while the activations are staged and multiplied (loaded after the
     * reduction, they were one more L2 round trip on the critical path). */
    const bool writer = threadIdx.x < TILES * kTileRows;
    const int32_t x_sum = writer ? __ldcg(act_sum) : 0;
    const float x_scale = writer ? __ldcg(act_scale) : 1.0f;
    const int8_t *xs = x;
    if (CL > 1) {
        row_multicast(x_shared, x, row_bytes, &row_bar, CL);
        xs = x_shared;
    } else if (X_SMEM) {
        const int64_t words = groups * kGroup / 16;
        gemv_stage_row(x_shared, x, words, (int)threadIdx.x, (int)blockDim.x);
        __syncthreads();
        xs = x_shared;
    }
    pdl_mark(0);

    /* Rows longer than the prefetch stream the rest after the wait. */
    const int acc =
        live ? gemv_warp_product<WARPS, kPre, !X_SMEM>(v, blocks, xs + (lane >> 3) * 64, split,
                                                       groups)
             : 0;
    pdl_mark(1);
    if constexpr (PAIR) {
        /* gemv_tile_epilogue's sums, gate tile t and up tile t + kPairs. */
        gemv_tile_partials<WARPS, TILES>(acc, partial, tile_in_block, split, lane);
        if (threadIdx.x < kPairs * kTileRows) {
            const int t = threadIdx.x / kTileRows, r = threadIdx.x % kTileRows;
            const int64_t out = ((int64_t)blockIdx.x * kPairs + t) * kTileRows + r;
            if (out < n / 2) {
                int gs = 0, us = 0;
#pragma unroll
                for (int s = 0; s < WARPS; s++) {
                    gs += partial[t][s][r];
                    us += partial[t + kPairs][s][r];
                }
                /* The CPU's expressions: each product's epilogue with weight
                 * scale 1, then relu(g sg)^2 (u su), one rounding a step. */
                const float gate = __fmul_rn(epilogue(gs - x_sum, x_scale, 1.0f), sg);
                const float up = __fmul_rn(epilogue(us - x_sum, x_scale, 1.0f), su);
                const float rg = gate > 0.0f ? gate : 0.0f;
                y[out] = __fmul_rn(__fmul_rn(rg, rg), up);
            }
        }
    } else {
        gemv_tile_epilogue<WARPS, TILES>(acc, partial, tile_in_block, split, lane, threadIdx.x,
                                         n, [&](int64_t out_row, int total) {
                                             y[out_row] = epilogue(total - x_sum, x_scale,
                                                                   w_scale);
                                         });
    }
    pdl_mark(2);
}

/* Launches gemv_pdl_kernel for a; or, with `resident` non-NULL, launches
 * nothing and stores how many of its clusters the device can hold at once
 * (0: a cluster of CL of its blocks does not fit). */
template <int WARPS, int TILES, bool X_SMEM, int CL, bool PAIR = false>
cudaError_t launch_gemv_pdl(const bn_w2a8_cuda_args *a, int pdl, cudaStream_t stream,
                            int *resident = nullptr)
{
    /* In clusters the grid is a whole number of them (the extra blocks
     * have no tile: they stage the row and write nothing). */
    const int64_t per_block = PAIR ? TILES / 2 : TILES;
    const int64_t units = PAIR ? a->tiles / 2 : a->tiles;
    const int64_t blocks = ((units + per_block - 1) / per_block + CL - 1) / CL * CL;
    const size_t smem = X_SMEM ? (size_t)(a->groups * kGroup) : 0;
    auto kernel = gemv_pdl_kernel<WARPS, TILES, X_SMEM, CL, PAIR>;
    if (CL > 8) { /* clusters of 16: a size the device must be told to allow */
        cudaError_t rc =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (rc != cudaSuccess)
            return rc;
    }
    {
        const cudaError_t rc = allow_dynamic_smem(kernel, smem);
        if (rc != cudaSuccess)
            return rc;
    }
    if (resident)
        return resident_clusters(kernel, dim3((unsigned)blocks), dim3(32 * WARPS * TILES), smem,
                                 dim3(CL, 1, 1), resident);
    return pdl_launch_clustered(kernel, dim3((unsigned)blocks), dim3(32 * WARPS * TILES), smem,
                                dim3(CL, 1, 1), stream, pdl,
                                reinterpret_cast<const uint4 *>(a->weights), a->x, a->n,
                                a->groups, a->tiles, a->act_scale, a->act_sum, a->weight_scale,
                                a->y, a->relu2_sg, a->relu2_su);
}

/* The relu2_pair GEMV: every split with two tiles (one pair) a block, four
 * (two pairs) at split 1. resident: as launch_gemv_pdl's. */
template <int CL>
cudaError_t launch_gemv_pair(const bn_w2a8_cuda_args *a, int split, int pdl, cudaStream_t stream,
                             int *resident = nullptr)
{
    switch (split) {
    case 1: return launch_gemv_pdl<1, 4, true, CL, true>(a, pdl, stream, resident);
    case 2: return launch_gemv_pdl<2, 2, true, CL, true>(a, pdl, stream, resident);
    case 4: return launch_gemv_pdl<4, 2, true, CL, true>(a, pdl, stream, resident);
    case 8: return launch_gemv_pdl<8, 2, true, CL, true>(a, pdl, stream, resident);
    default: return cudaErrorInvalidValue;
    }
}

template <bool X_SMEM, int CL = 1>
cudaError_t launch_gemv_pdl_split(const bn_w2a8_cuda_args *a, int split, int pdl,
                                  cudaStream_t stream)
{
    switch (split) {
    case 1: return launch_gemv_pdl<1, 4, X_SMEM, CL>(a, pdl, stream);
    case 2: return launch_gemv_pdl<2, 2, X_SMEM, CL>(a, pdl, stream);
    case 4: return launch_gemv_pdl<4, 1, X_SMEM, CL>(a, pdl, stream);
    case 8:
        /* Many tiles (at least four per SM): two a block, so each block's
         * staging of the row serves twice the weights (H200, 5120 x 27648
         * chained: 10.87 -> 10.66 us; three or four tiles a block 13.8 and
         * 15.2, the row read through L1 instead of staged 16.7). */
        if constexpr (X_SMEM && CL == 1)
            if (a->tiles >= 4 * (int64_t)(a->sm_count > 0 ? a->sm_count : 132))
                return launch_gemv_pdl<8, 2, X_SMEM, CL>(a, pdl, stream);
        return launch_gemv_pdl<8, 1, X_SMEM, CL>(a, pdl, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- GEMV with every operand copied in bulk ---------------------------------
 *
 * One tile (8 rows) per block, WARPS warps splitting its K as gemv_kernel
 * does. Thread 0 copies the tile's packed weights (groups x 512 bytes,
 * contiguous in the layout) into shared memory with one bulk copy by the
 * tensor memory accelerator before the PDL wait, and the activation row
 * (groups x 256 bytes) after it. Every byte a block needs is requested at
 * once and no registers are held for loads in flight, so a GPU full of
 * blocks has the matrix in flight from the start (a register-prefetching
 * warp has at most 8 entries out), and a chained kernel's waiting blocks
 * hold only shared memory. The int32 sums are exact, so the output is
 * gemv_kernel's bit for bit. sm_90 only (bn_w2a8_cuda_gemv_bulk says where
 * it runs). */
template <int WARPS>
__global__ void __launch_bounds__(32 * WARPS)
    gemv_bulk_kernel(const uint4 *__restrict__ w, const int8_t *x, int64_t n, int64_t groups,
                     const float *act_scale, const int32_t *act_sum, float w_scale,
                     float *__restrict__ y)
{
    extern __shared__ __align__(128) int8_t bulk_smem[];
    __shared__ int partial[1][WARPS][kTileRows];
    __shared__ unsigned long long bars[2]; /* weights, activations */
    const int lane = threadIdx.x & 31;
    const int split = threadIdx.x >> 5;
    const unsigned w_bytes = (unsigned)(groups * kBlockBytes);
    const uint4 *ws = reinterpret_cast<const uint4 *>(bulk_smem);
    const int8_t *xs = bulk_smem + w_bytes;
    if (threadIdx.x == 0) {
        bulk_bar_init(&bars[0]);
        bulk_bar_init(&bars[1]);
        bulk_copy(bulk_smem, w + (int64_t)blockIdx.x * groups * (kBlockBytes / 16), w_bytes,
                  &bars[0]);
    }
    __syncthreads(); /* the barriers are initialised before anyone waits */
    pdl_trigger();
    pdl_wait();
    if (threadIdx.x == 0)
        bulk_copy(bulk_smem + w_bytes, x, (unsigned)(groups * kGroup), &bars[1]);
    const bool writer = threadIdx.x < kTileRows;
    const int32_t x_sum = writer ? __ldcg(act_sum) : 0;
    const float x_scale = writer ? __ldcg(act_scale) : 1.0f;
    bulk_wait(&bars[0]);
    bulk_wait(&bars[1]);
    pdl_mark(0);
    int acc = 0;
    const int8_t *xq = xs + (lane >> 3) * 64;
    for (int64_t g = split; g < groups; g += WARPS)
        acc = gemv_entry_dot<false>(ws[g * (kBlockBytes / 16) + lane], xq + g * kGroup, acc);
    gemv_tile_epilogue<WARPS, 1>(acc, partial, 0, split, lane, threadIdx.x, n,
                                 [&](int64_t out_row, int total) {
                                     y[out_row] = epilogue(total - x_sum, x_scale, w_scale);
                                 });
}

template <int WARPS>
cudaError_t launch_gemv_bulk(const bn_w2a8_cuda_args *a, int pdl, cudaStream_t stream)
{
    const size_t smem = (size_t)(a->groups * (kBlockBytes + kGroup));
    auto kernel = gemv_bulk_kernel<WARPS>;
    const cudaError_t rc = allow_dynamic_smem(kernel, smem);
    if (rc != cudaSuccess)
        return rc;
    return pdl_launch(kernel, dim3((unsigned)a->tiles), dim3(32 * WARPS), smem, stream, pdl,
                      reinterpret_cast<const uint4 *>(a->weights), a->x, a->n, a->groups,
                      a->act_scale, a->act_sum, a->weight_scale, a->y);
}

extern "C" int bn_w2a8_cuda_gemv_bulk_usable(const bn_w2a8_cuda_args *a)
{
    /* Asked once per process: bulk copies need sm_90 code and a device that
     * runs it (the same condition as clusters). */
    static int usable = -1;
    if (usable < 0)
        usable = clusters_usable(gemv_bulk_kernel<4>);
    return usable && a->groups * (kBlockBytes + kGroup) <= BN_W2A8_GEMV_BULK_MAX_SMEM;
}

extern "C" cudaError_t bn_w2a8_cuda_gemv_bulk(const bn_w2a8_cuda_args *a, int split, int pdl,
                                              cudaStream_t stream)
{
    if (!bn_w2a8_cuda_gemv_bulk_usable(a))
        return cudaErrorNotSupported;
    switch (split) {
    case 1: return launch_gemv_bulk<1>(a, pdl, stream);
    case 2: return launch_gemv_bulk<2>(a, pdl, stream);
    case 4: return launch_gemv_bulk<4>(a, pdl, stream);
    case 8: return launch_gemv_bulk<8>(a, pdl, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- GEMV with a block's whole share of the matrix copied in bulk -----------
 *
 * As gemv_bulk_kernel, but a block takes `per_block` consecutive tiles (up
 * to kBulkTilesMax; the layout keeps them contiguous), each copied into
 * shared memory by one bulk copy on a barrier of its own, all issued before
 * the PDL wait; the activation row is copied once per block after it. The
 * host sizes per_block so that the grid is a few blocks per SM: every
 * weight byte is then requested before the kernel's inputs are ready, and
 * an SM stages the row a few times instead of once per tile (variant 9
 * stages it ~19 times per SM on 20480 x 3200, 8.5 MB of L2 reads after the
 * wait for 17 MB of weights). Each warp takes a contiguous range of the
 * block's (tile, chunk-group) entries, waits for a tile's copy only when it
 * reaches it, masks the 2-bit fields in place (entry_dot_fields: one logic
 * op a field) and adds its sum into the tile's rows in shared memory with
 * integer atomics, exact in any order: the output is gemv_kernel's bit for
 * bit. sm_90 only (bn_w2a8_cuda_gemv_bulk_tiles says where it runs). */
constexpr int kBulkTilesMax = 32;
constexpr int kBulkTilesWarps = 8;

__global__ void __launch_bounds__(32 * kBulkTilesWarps)
    gemv_bulk_tiles_kernel(const uint4 *__restrict__ w, const int8_t *x, int64_t n, int groups,
                           int64_t tiles, int per_block, const float *act_scale,
                           const int32_t *act_sum, float w_scale, float *__restrict__ y)
{
    extern __shared__ __align__(128) int8_t bulk_smem[];
    __shared__ int row_sums[kBulkTilesMax][kTileRows];
    __shared__ unsigned long long bars[kBulkTilesMax + 1]; /* tiles, then the row */
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int64_t first = (int64_t)blockIdx.x * per_block;
    const int here = (int)(tiles - first < per_block ? tiles - first : per_block);
    const unsigned tile_bytes = (unsigned)groups * kBlockBytes;
    const uint4 *ws = reinterpret_cast<const uint4 *>(bulk_smem);
    const int8_t *xs = bulk_smem + (size_t)per_block * tile_bytes;
    if (threadIdx.x == 0) {
        for (int t = 0; t <= here; t++)
            bulk_bar_init(&bars[t == here ? kBulkTilesMax : t]);
        const uint4 *src = w + first * groups * (kBlockBytes / 16);
        for (int t = 0; t < here; t++)
            bulk_copy(bulk_smem + (size_t)t * tile_bytes,
                      src + (int64_t)t * groups * (kBlockBytes / 16), tile_bytes, &bars[t]);
    }
    for (int i = threadIdx.x; i < here * kTileRows; i += blockDim.x)
        row_sums[i / kTileRows][i % kTileRows] = 0;
    __syncthreads(); /* barriers initialised, sums zeroed */
    pdl_trigger();
    pdl_wait();
    if (threadIdx.x == 0)
        bulk_copy(bulk_smem + (size_t)per_block * tile_bytes, x, (unsigned)groups * kGroup,
                  &bars[kBulkTilesMax]);
    const bool writer = threadIdx.x < here * kTileRows;
    const int32_t x_sum = writer ? __ldcg(act_sum) : 0;
    const float x_scale = writer ? __ldcg(act_scale) : 1.0f;
    bulk_wait(&bars[kBulkTilesMax]);
    pdl_mark(0);

    const int entries = here * groups;
    const int begin = warp * entries / kBulkTilesWarps;
    const int end = (warp + 1) * entries / kBulkTilesWarps;
    const int8_t *xq = xs + (lane >> 3) * 64;
    int t = begin / groups, g = begin - t * groups;
    for (int e = begin; e < end;) {
        /* The entries of tile t in this warp's range: one barrier wait,
         * then the products, then one add per row. */
        const int stop = min(end - e, groups - g);
        bulk_wait(&bars[t]);
        int fields[4] = {0, 0, 0, 0};
        const uint4 *tw = ws + (int64_t)t * groups * (kBlockBytes / 16) + lane;
        for (int i = 0; i < stop; i++)
            entry_dot_fields(tw[(g + i) * (kBlockBytes / 16)], xq + (g + i) * kGroup, fields);
        int acc = fields[0] + (fields[1] >> 2) + (fields[2] >> 4) + (fields[3] >> 6);
        acc += __shfl_xor_sync(0xffffffffu, acc, 8);
        acc += __shfl_xor_sync(0xffffffffu, acc, 16);
        if (lane < kTileRows)
            atomicAdd(&row_sums[t][lane], acc);
        e += stop;
        t++;
        g = 0;
    }
    pdl_mark(1);
    __syncthreads();
    if (writer) {
        const int64_t row = first * kTileRows + threadIdx.x;
        if (row < n)
            y[row] = epilogue(row_sums[threadIdx.x / kTileRows][threadIdx.x % kTileRows] - x_sum,
                              x_scale, w_scale);
    }
}

} // namespace

extern "C" int bn_w2a8_cuda_gemv_bulk_tiles_per_block(const bn_w2a8_cuda_args *a,
                                                      int blocks_per_sm)
{
    /* Asked once per process: bulk copies need sm_90 code and a device
     * that runs it; then the share of the matrix a block would hold must
     * fit the barriers and the shared memory of one block. */
    static int usable = -1;
    if (usable < 0)
        usable = clusters_usable(gemv_bulk_tiles_kernel);
    if (!usable || blocks_per_sm < 1 || a->tiles < 1 || a->groups < 1 || a->groups > (1 << 20))
        return 0;
    const int64_t sms = a->sm_count > 0 ? a->sm_count : 132;
    const int64_t per_block = (a->tiles + sms * blocks_per_sm - 1) / (sms * blocks_per_sm);
    const int64_t smem = per_block * a->groups * kBlockBytes + a->groups * kGroup;
    return per_block <= kBulkTilesMax && smem <= BN_W2A8_GEMV_BULK_TILES_MAX_SMEM
               ? (int)per_block
               : 0;
}

extern "C" cudaError_t bn_w2a8_cuda_gemv_bulk_tiles(const bn_w2a8_cuda_args *a,
                                                    int blocks_per_sm, int pdl,
                                                    cudaStream_t stream)
{
    const int per_block = bn_w2a8_cuda_gemv_bulk_tiles_per_block(a, blocks_per_sm);
    if (per_block == 0)
        return cudaErrorNotSupported;
    const size_t smem = (size_t)per_block * (size_t)(a->groups * kBlockBytes) +
                        (size_t)(a->groups * kGroup);
    const cudaError_t rc = allow_dynamic_smem(gemv_bulk_tiles_kernel, smem);
    if (rc != cudaSuccess)
        return rc;
    const int64_t blocks = (a->tiles + per_block - 1) / per_block;
    return pdl_launch(gemv_bulk_tiles_kernel, dim3((unsigned)blocks), dim3(32 * kBulkTilesWarps),
                      smem, stream, pdl, reinterpret_cast<const uint4 *>(a->weights), a->x, a->n,
                      (int)a->groups, a->tiles, per_block, a->act_scale, a->act_sum,
                      a->weight_scale, a->y);
}

namespace {

/* ---- GEMM on int8 tensor cores -------------------------------------------- */

constexpr int kBM = 64, kBN = 64, kBK = 256;
constexpr int kPad = 16; /* bytes added per shared row: conflict-free fragment loads */
constexpr int kStride = kBK + kPad;

__device__ __forceinline__ void mma_s8(int32_t c[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* 128 threads; block (bm, bn) computes rows [64bm, +64) of activations
 * against weight rows [64bn, +64). Warp w owns a 32 x 32 quadrant. */
__global__ void __launch_bounds__(128)
    gemm_kernel(const uint4 *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx, int64_t m,
                int64_t n, int64_t groups, const float *__restrict__ act_scale,
                const int32_t *__restrict__ act_sum, float w_scale, float *__restrict__ y,
                int64_t ldy)
{
    __shared__ __align__(16) int8_t As[kBM * kStride];
    __shared__ __align__(16) int8_t Bs[kBN * kStride];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t m0 = (int64_t)blockIdx.y * kBM, n0 = (int64_t)blockIdx.x * kBN;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int gid = lane >> 2, tig = lane & 3;

    int32_t acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int v = 0; v < 4; v++)
                acc[i][j][v] = 0;

    for (int64_t g = 0; g < groups; g++) {
        /* Activations: 64 rows x 256 bytes, 16 bytes per thread per pass. */
#pragma unroll
        for (int p = 0; p < (kBM * kBK / 16) / 128; p++) {
            const int idx = p * 128 + tid;
            const int r = idx / (kBK / 16), c16 = idx % (kBK / 16);
            int4 v = make_int4(0, 0, 0, 0);
            if (m0 + r < m)
                v = __ldg(reinterpret_cast<const int4 *>(x + (m0 + r) * ldx + g * kGroup) + c16);
            *reinterpret_cast<int4 *>(&As[r * kStride + c16 * 16]) = v;
        }
        /* Weights: 8 tiles x one 512-byte block, each 16-byte entry
         * expanded to 64 codes in row order. */
#pragma unroll
        for (int p = 0; p < (kBN / kTileRows) * 32 / 128; p++) {
            const int idx = p * 128 + tid;
            const int t = idx / 32, e = idx % 32;
            const int q = e / 8, r = e % 8;
            const int64_t tile = n0 / kTileRows + t;
            uint4 wv = make_uint4(0x55555555u, 0x55555555u, 0x55555555u, 0x55555555u);
            if (tile * kTileRows < n)
                wv = __ldg(w + (tile * groups + g) * (kBlockBytes / 16) + e);
            const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
            int8_t *dst = &Bs[(t * kTileRows + r) * kStride + q * 64];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint4 out;
                out.x = words[i] & 0x03030303u;
                out.y = (words[i] >> 2) & 0x03030303u;
                out.z = (words[i] >> 4) & 0x03030303u;
                out.w = (words[i] >> 6) & 0x03030303u;
                *reinterpret_cast<uint4 *>(dst + 16 * i) = out;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 32) {
            uint32_t af[2][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int8_t *base = &As[(wm + 16 * i + gid) * kStride + kk + tig * 4];
                af[i][0] = *reinterpret_cast<const uint32_t *>(base);
                af[i][1] = *reinterpret_cast<const uint32_t *>(base + 8 * kStride);
                af[i][2] = *reinterpret_cast<const uint32_t *>(base + 16);
                af[i][3] = *reinterpret_cast<const uint32_t *>(base + 8 * kStride + 16);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int8_t *base = &Bs[(wn + 8 * j + gid) * kStride + kk + tig * 4];
                bf[j][0] = *reinterpret_cast<const uint32_t *>(base);
                bf[j][1] = *reinterpret_cast<const uint32_t *>(base + 16);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    mma_s8(acc[i][j], af[i], bf[j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int64_t row = m0 + wm + 16 * i + gid + 8 * half;
            if (row >= m)
                continue;
            const float s = act_scale[row];
            const int32_t sum = act_sum[row];
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int64_t col = n0 + wn + 8 * j + 2 * tig + c;
                    if (col < n)
                        y[row * ldy + col] = epilogue(acc[i][j][2 * half + c] - sum, s, w_scale);
                }
            }
        }
    }
}

/* ---- small M on tensor cores, B fragments straight from the packed weights ---
 *
 * For a few activation rows the weights dominate: each weight is used M
 * times only, so expanding it through shared memory costs more than the
 * multiply. Here a thread builds its mma B fragment directly from the
 * packed layout: for m16n8k32 the thread (gid, tig) needs the codes of row
 * gid at k = 4 tig .. 4 tig + 3 (b0) and 16 + 4 tig .. (b1) of a 32-wide
 * k-step, which are field tig of words 2s and 2s + 1 of its row's 16-byte
 * entry (cuda_layout.h): one shift and one mask each. The activation tile
 * (16 x 256 per chunk-group) is staged in shared memory. K is split over
 * blockIdx.y when the row blocks alone would not fill the GPU; the int32
 * partial sums then meet in a workspace (exact, order-free) and a second
 * kernel applies the epilogue. */

constexpr int kSkinnyWarps = 4;
constexpr int kSkinnyTilesPerWarp = 4; /* 4 x 8 = 32 weight rows per warp */
constexpr int kSkinnyRows = kSkinnyWarps * kSkinnyTilesPerWarp * kTileRows; /* 128 */
constexpr int kSkinnyStride = kGroup + 16;

template <int MT>
__global__ void __launch_bounds__(32 * kSkinnyWarps)
    skinny_kernel(const uint4 *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                  int64_t m, int64_t n, int64_t groups, int64_t tiles, int groups_per_split,
                  const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                  float w_scale, float *__restrict__ y, int64_t ldy, int32_t *__restrict__ ws)
{
    __shared__ __align__(16) int8_t xs[16 * MT * kSkinnyStride];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t m0 = (int64_t)blockIdx.z * 16 * MT;
    const int64_t tile0 = (int64_t)blockIdx.x * (kSkinnyRows / kTileRows) +
                          warp * kSkinnyTilesPerWarp;
    const int64_t g_begin = (int64_t)blockIdx.y * groups_per_split;
    const int64_t g_end = min(groups, g_begin + groups_per_split);

    int32_t acc[MT][kSkinnyTilesPerWarp][4] = {};
    for (int64_t g = g_begin; g < g_end; g++) {
        /* Stage activations rows m0 .. m0 + 16 MT, columns of chunk-group g. */
        for (int i = tid; i < 16 * MT * (kGroup / 16); i += 32 * kSkinnyWarps) {
            const int r = i / (kGroup / 16), c16 = i % (kGroup / 16);
            int4 v = make_int4(0, 0, 0, 0);
            if (m0 + r < m)
                v = __ldg(reinterpret_cast<const int4 *>(x + (m0 + r) * ldx + g * kGroup) + c16);
            *reinterpret_cast<int4 *>(&xs[r * kSkinnyStride + c16 * 16]) = v;
        }
        __syncthreads();
        /* All B entries of this chunk-group first: 16 loads in flight. */
        uint4 bw[4][kSkinnyTilesPerWarp];
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int t = 0; t < kSkinnyTilesPerWarp; t++) {
                const int64_t tile = tile0 + t;
                bw[q][t] = tile < tiles ? gemv_load_stream(w + (tile * groups + g) *
                                                                   (kBlockBytes / 16) +
                                                           q * 8 + gid)
                                        : make_uint4(0x55555555u, 0x55555555u, 0x55555555u,
                                                     0x55555555u);
            }
#pragma unroll
        for (int q = 0; q < 4; q++) {
#pragma unroll
            for (int s = 0; s < 2; s++) {
                const int kk = q * 64 + s * 32;
                uint32_t af[MT][4];
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    const int8_t *base = &xs[(16 * i + gid) * kSkinnyStride + kk + tig * 4];
                    af[i][0] = *reinterpret_cast<const uint32_t *>(base);
                    af[i][1] = *reinterpret_cast<const uint32_t *>(base + 8 * kSkinnyStride);
                    af[i][2] = *reinterpret_cast<const uint32_t *>(base + 16);
                    af[i][3] = *reinterpret_cast<const uint32_t *>(base + 8 * kSkinnyStride + 16);
                }
#pragma unroll
                for (int t = 0; t < kSkinnyTilesPerWarp; t++) {
                    const uint32_t lo = s ? bw[q][t].z : bw[q][t].x;
                    const uint32_t hi = s ? bw[q][t].w : bw[q][t].y;
                    const uint32_t bf[2] = {(lo >> (2 * tig)) & 0x03030303u,
                                            (hi >> (2 * tig)) & 0x03030303u};
#pragma unroll
                    for (int i = 0; i < MT; i++)
                        mma_s8(acc[i][t], af[i], bf);
                }
            }
        }
        __syncthreads();
    }

    const bool split = gridDim.y > 1;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int64_t row = m0 + 16 * i + gid + 8 * half;
            if (row >= m)
                continue;
#pragma unroll
            for (int t = 0; t < kSkinnyTilesPerWarp; t++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int64_t col = (tile0 + t) * kTileRows + 2 * tig + c;
                    if (col >= n)
                        continue;
                    const int32_t v = acc[i][t][2 * half + c];
                    if (split)
                        atomicAdd(&ws[row * n + col], v);
                    else
                        y[row * ldy + col] = epilogue(v - act_sum[row], act_scale[row], w_scale);
                }
        }
}

__global__ void skinny_epilogue(const int32_t *__restrict__ ws, int64_t m, int64_t n,
                                const float *__restrict__ act_scale,
                                const int32_t *__restrict__ act_sum, float w_scale,
                                float *__restrict__ y, int64_t ldy)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m * n)
        return;
    const int64_t row = i / n, col = i % n;
    y[row * ldy + col] = epilogue(ws[i] - act_sum[row], act_scale[row], w_scale);
}

/* ---- a few rows: the GEMV's stream, each weight entry met by R rows --------
 *
 * For M of a few rows (batched decode, short prompts) the weights still
 * dominate. rows_kernel streams them as gemv_kernel does (a warp reads a
 * tile's 512-byte chunk-group, 16 bytes a lane, WARPS warps splitting K) and
 * multiplies every entry with up to R activation rows (blockIdx.y picks rows
 * m0 .. m0 + R - 1): the 2-bit fields are masked out once per entry and
 * dotted with each row's 64 bytes (read through L1: the eight lanes of a
 * quarter read the same bytes). The int32 sums are exact, so the results
 * are the other kernels' bit for bit. */
constexpr int kRowsR = 8;

template <int WARPS, int TILES>
__global__ void __launch_bounds__(32 * WARPS * TILES)
    rows_kernel(const uint4 *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx, int64_t m,
                int64_t n, int64_t groups, int64_t tiles, const float *__restrict__ act_scale,
                const int32_t *__restrict__ act_sum, float w_scale, float *__restrict__ y,
                int64_t ldy)
{
    __shared__ int partial[kRowsR][TILES][WARPS][kTileRows];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tile_in_block = warp / WARPS, split = warp % WARPS;
    const int64_t tile = (int64_t)blockIdx.x * TILES + tile_in_block;
    const int64_t m0 = (int64_t)blockIdx.y * kRowsR;
    const int rows = m - m0 < kRowsR ? (int)(m - m0) : kRowsR;
    int acc[kRowsR];
#pragma unroll
    for (int r = 0; r < kRowsR; r++)
        acc[r] = 0;
    if (tile < tiles) {
        const uint4 *blocks = w + tile * groups * (kBlockBytes / 16) + lane;
        const int8_t *xq = x + m0 * ldx + (lane >> 3) * 64;
        for (int64_t g = split; g < groups; g += WARPS) {
            const uint4 v = gemv_load_stream(blocks + g * (kBlockBytes / 16));
            const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
            int f[4][4]; /* field j of word i: the codes meeting bytes 16 i + 4 j .. */
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    f[i][j] = (int)((wd[i] >> (2 * j)) & 0x03030303u);
#pragma unroll
            for (int r = 0; r < kRowsR; r++) {
                if (r >= rows)
                    break;
                const int4 *xv = reinterpret_cast<const int4 *>(xq + r * ldx + g * kGroup);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int4 a = __ldg(xv + i);
                    acc[r] = __dp4a(f[i][0], a.x, acc[r]);
                    acc[r] = __dp4a(f[i][1], a.y, acc[r]);
                    acc[r] = __dp4a(f[i][2], a.z, acc[r]);
                    acc[r] = __dp4a(f[i][3], a.w, acc[r]);
                }
            }
        }
    }
    /* The four quarters of a tile row (lanes r, r + 8, r + 16, r + 24),
     * then the split warps of a tile through shared memory. */
#pragma unroll
    for (int r = 0; r < kRowsR; r++) {
        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 8);
        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 16);
        if (lane < kTileRows)
            partial[r][tile_in_block][split][lane] = acc[r];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kRowsR * TILES * kTileRows; i += blockDim.x) {
        const int r = i / (TILES * kTileRows), t = (i / kTileRows) % TILES, o = i % kTileRows;
        const int64_t out_row = ((int64_t)blockIdx.x * TILES + t) * kTileRows + o;
        if (r >= rows || out_row >= n)
            continue;
        int total = 0;
#pragma unroll
        for (int s = 0; s < WARPS; s++)
            total += partial[r][t][s][o];
        y[(m0 + r) * ldy + out_row] =
            epilogue(total - act_sum[m0 + r], act_scale[m0 + r], w_scale);
    }
}

template <int WARPS, int TILES>
static cudaError_t launch_rows_t(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    const int64_t blocks = (a->tiles + TILES - 1) / TILES;
    const int64_t row_blocks = (a->m + kRowsR - 1) / kRowsR;
    if (row_blocks > 65535)
        return cudaErrorInvalidConfiguration;
    rows_kernel<WARPS, TILES><<<dim3((unsigned)blocks, (unsigned)row_blocks),
                                32 * WARPS * TILES, 0, stream>>>(
        reinterpret_cast<const uint4 *>(a->weights), a->x, a->ldx, a->m, a->n, a->groups,
        a->tiles, a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy);
    return cudaGetLastError();
}

/* Variant 18, at the K split the GEMV takes for this matrix. */
static cudaError_t launch_rows(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    if (a->m <= 0 || a->n <= 0)
        return cudaSuccess;
    /* 16-byte activation loads. */
    if ((a->ldx & 15) != 0 || (reinterpret_cast<uintptr_t>(a->x) & 15) != 0)
        return cudaErrorMisalignedAddress;
    switch (bn_w2a8_cuda_gemv_split(a->tiles, a->groups, a->sm_count)) {
    case 1: return launch_rows_t<1, 4>(a, stream);
    case 2: return launch_rows_t<2, 2>(a, stream);
    case 4: return launch_rows_t<4, 1>(a, stream);
    default: return launch_rows_t<8, 1>(a, stream);
    }
}

/* ---- a few rows on tensor cores: the GEMV's stream into mma fragments ------
 *
 * For a few activation rows (short prompts, small batches) variant 18's
 * dp4a work grows with the rows, and the skinny kernel's per-chunk-group
 * staging (a barrier and a round trip each) leaves the weight stream idle.
 * Here a warp streams its TW tiles' chunk-groups (split, split + WARPS, ...)
 * as the GEMV does and multiplies them on the tensor cores (mma m16n8k32:
 * 16 activation rows as m, the 8 rows of a tile as n), with no shared
 * memory in the loop: the activations are read straight from global memory
 * (they stay in L1, which the weight loads bypass).
 *
 * Which k a fragment slot stands for is free, as long as A and B agree. A
 * chunk-group's 256 k are taken as four quarters u (64u ..), each in two
 * steps h; lane (gid, tig) holds, in step (u, h), the k
 *
 *     64 u + 16 tig + 8 h + 0..3  (slots 4 tig ..,      b0 / a0, a1)
 *     64 u + 16 tig + 8 h + 4..7  (slots 16 + 4 tig .., b1 / a2, a3)
 *
 * In the tile layout these are fields 2h and 2h + 1 of word tig of the
 * entry (quarter u, row gid), so a lane loads that one word per quarter
 * (the warp's load of a quarter reads its 128 bytes once), and the 16 bytes
 * 64 u + 16 tig .. of activation rows gid and gid + 8 serve both steps.
 *
 * More than 16 rows take more blocks, each of 16 rows; the blocks of one
 * weight column are consecutive, so they run together and all but the
 * first find its weights in L2. The int32 sums are exact, so the results
 * are the other kernels' bit for bit. */
constexpr int kMmaRows = 16;

/* Word tig of the entries (u, gid), u = 0..3, of one tile's chunk-group. */
__device__ __forceinline__ void mma_rows_load_b(uint32_t (&b)[4], const uint32_t *entry_words,
                                                bool live)
{
#pragma unroll
    for (int u = 0; u < 4; u++) {
        uint32_t v = 0;
        if (live)
            asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];"
                         : "=r"(v)
                         : "l"(entry_words + u * 8 * 4));
        b[u] = v;
    }
}

/* One chunk-group of TW tiles: 8 steps x TW mma. xlo, xhi: this lane's
 * bytes 16 tig .. of activation rows gid and gid + 8 (null: past m). */
template <int TW>
__device__ __forceinline__ void mma_rows_group(int32_t (&acc)[TW][4], const uint32_t (&b)[TW][4],
                                               const int8_t *xlo, const int8_t *xhi, int64_t koff)
{
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const uint4 lo = xlo ? __ldg(reinterpret_cast<const uint4 *>(xlo + koff + 64 * u))
                             : make_uint4(0, 0, 0, 0);
        const uint4 hi = xhi ? __ldg(reinterpret_cast<const uint4 *>(xhi + koff + 64 * u))
                             : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t af[4] = {h ? lo.z : lo.x, h ? hi.z : hi.x, h ? lo.w : lo.y,
                                    h ? hi.w : hi.y};
#pragma unroll
            for (int t = 0; t < TW; t++) {
                const uint32_t bf[2] = {(b[t][u] >> (4 * h)) & 0x03030303u,
                                        (b[t][u] >> (4 * h + 2)) & 0x03030303u};
                mma_s8(acc[t], af, bf);
            }
        }
    }
}

/* Block: COLS columns of WARPS warps; column c of weight block wb owns
 * tiles (wb COLS + c) TW .. + TW - 1, its warps splitting K. Block b is
 * row block b % row_blocks (activation rows 16 (b % row_blocks) ..) of
 * weight block b / row_blocks. */
template <int WARPS, int COLS, int TW>
__global__ void __launch_bounds__(32 * WARPS * COLS)
    mma_rows_kernel(const uint4 *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                    int64_t m, int64_t n, int64_t groups, int64_t tiles, int64_t row_blocks,
                    const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                    float w_scale, float *__restrict__ y, int64_t ldy)
{
    constexpr int kCols = TW * kTileRows;
    /* Loads of kBatch chunk-groups in flight: 32 registers of weight words. */
    constexpr int kBatch = 8 / TW;
    __shared__ int32_t partial[COLS][WARPS][kMmaRows][kCols];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col = warp / WARPS, split = warp % WARPS;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t wb = (int64_t)blockIdx.x / row_blocks;
    const int64_t m0 = ((int64_t)blockIdx.x % row_blocks) * kMmaRows;
    const int64_t tile0 = (wb * COLS + col) * TW;

    const int8_t *xlo = m0 + gid < m ? x + (m0 + gid) * ldx + 16 * tig : nullptr;
    const int8_t *xhi = m0 + gid + 8 < m ? x + (m0 + gid + 8) * ldx + 16 * tig : nullptr;
    /* Word tig of entry (0, gid) of tile t's chunk-group g: words + t stride
     * + g * 128 (a chunk-group is 512 bytes). */
    const uint32_t *words = reinterpret_cast<const uint32_t *>(w) +
                            (tile0 * groups) * (kBlockBytes / 4) + gid * 4 + tig;
    bool live[TW];
#pragma unroll
    for (int t = 0; t < TW; t++)
        live[t] = tile0 + t < tiles;

    int32_t acc[TW][4];
#pragma unroll
    for (int t = 0; t < TW; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[t][e] = 0;

    int64_t g = split;
    for (; g + (kBatch - 1) * WARPS < groups; g += kBatch * WARPS) {
        uint32_t b[kBatch][TW][4];
#pragma unroll
        for (int j = 0; j < kBatch; j++)
#pragma unroll
            for (int t = 0; t < TW; t++)
                mma_rows_load_b(b[j][t],
                                words + ((int64_t)t * groups + g + j * WARPS) * (kBlockBytes / 4),
                                live[t]);
#pragma unroll
        for (int j = 0; j < kBatch; j++)
            mma_rows_group<TW>(acc, b[j], xlo, xhi, (g + j * WARPS) * kGroup);
    }
    for (; g < groups; g += WARPS) {
        uint32_t b[TW][4];
#pragma unroll
        for (int t = 0; t < TW; t++)
            mma_rows_load_b(b[t], words + ((int64_t)t * groups + g) * (kBlockBytes / 4), live[t]);
        mma_rows_group<TW>(acc, b, xlo, xhi, g * kGroup);
    }

    /* c0, c1: activation row gid, tile rows 2 tig, 2 tig + 1; c2, c3: row
     * gid + 8. The split warps of a column meet in shared memory. */
#pragma unroll
    for (int t = 0; t < TW; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            partial[col][split][gid + 8 * (e >> 1)][t * kTileRows + 2 * tig + (e & 1)] =
                acc[t][e];
    __syncthreads();
    for (int o = threadIdx.x; o < COLS * kMmaRows * kCols; o += blockDim.x) {
        const int c = o / (kMmaRows * kCols), r = (o / kCols) % kMmaRows, j = o % kCols;
        const int64_t row = m0 + r;
        const int64_t out = (wb * COLS + c) * kCols + j;
        if (row >= m || out >= n)
            continue;
        int total = 0;
#pragma unroll
        for (int s = 0; s < WARPS; s++)
            total += partial[c][s][r][j];
        y[row * ldy + out] = epilogue(total - act_sum[row], act_scale[row], w_scale);
    }
}

/* Blocks of mma_rows_kernel<WARPS, COLS, TW> resident on one SM of device
 * dev (0 if unknown), asked of the runtime once per device. */
constexpr int kMmaRowsMaxDevices = 64;

template <int WARPS, int COLS, int TW> static int mma_rows_resident(int dev)
{
    static std::atomic<int> cache[kMmaRowsMaxDevices]; /* 0: not asked yet, -1: unknown */
    if (dev < 0 || dev >= kMmaRowsMaxDevices)
        return 0;
    int v = cache[dev].load(std::memory_order_relaxed);
    if (v == 0) {
        int blocks = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &blocks, mma_rows_kernel<WARPS, COLS, TW>, 32 * WARPS * COLS, 0) != cudaSuccess ||
            blocks <= 0) {
            (void)cudaGetLastError();
            blocks = -1;
        }
        cache[dev].store(blocks, std::memory_order_relaxed);
        v = blocks;
    }
    return v > 0 ? v : 0;
}

/* Block shapes by K split: COLS columns so that a block has 4 warps or
 * more. */
template <int S> struct MmaRowsShape {
    static constexpr int kCols = S >= 4 ? 1 : 4 / S;
};

/* The grid of mma_rows_kernel: columns of TW tiles, rows of 16. */
struct MmaRowsGrid {
    int64_t columns, row_blocks;
};

template <int S> static int64_t mma_rows_blocks(const MmaRowsGrid &g)
{
    constexpr int C = MmaRowsShape<S>::kCols;
    return (g.columns + C - 1) / C * g.row_blocks;
}

template <int S, int TW> static bool mma_rows_one_wave(const MmaRowsGrid &g, int dev, int sms)
{
    const int64_t resident = mma_rows_resident<S, MmaRowsShape<S>::kCols, TW>(dev);
    return resident > 0 && mma_rows_blocks<S>(g) <= resident * sms;
}

/* The K split of mma_rows_kernel: the largest (at most 8, at most the
 * chunk-groups) whose grid runs as one wave, then, for long rows, larger
 * until a warp has at most 24 chunk-groups (as the GEMV: more loads in
 * flight sooner). H200, M = 24 on 3840 x 2560: 5.7 us at one wave (split
 * 4) against 7.2 at 1.2 waves (split 8); 20480 x 3200 at M <= 16: split 2
 * (one wave of 4-warp blocks) 10.4 us against 22.8 at split 1. */
template <int TW> static int mma_rows_split(const MmaRowsGrid &g, int64_t groups, int sm_count)
{
    const int sms = sm_count > 0 ? sm_count : 132;
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        dev = -1; /* occupancy unknown: split 1, then the long-row rule */
    }
    int split = 1;
    if (groups >= 8 && mma_rows_one_wave<8, TW>(g, dev, sms))
        split = 8;
    else if (groups >= 4 && mma_rows_one_wave<4, TW>(g, dev, sms))
        split = 4;
    else if (groups >= 2 && mma_rows_one_wave<2, TW>(g, dev, sms))
        split = 2;
    while (split < 8 && groups > 24 * split)
        split *= 2;
    return split;
}

template <int WARPS, int TW>
static cudaError_t launch_mma_rows_t(const bn_w2a8_cuda_args *a, const MmaRowsGrid &g,
                                     cudaStream_t stream)
{
    constexpr int COLS = MmaRowsShape<WARPS>::kCols;
    const int64_t blocks = mma_rows_blocks<WARPS>(g);
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidConfiguration;
    mma_rows_kernel<WARPS, COLS, TW><<<(unsigned)blocks, 32 * WARPS * COLS, 0, stream>>>(
        reinterpret_cast<const uint4 *>(a->weights), a->x, a->ldx, a->m, a->n, a->groups,
        a->tiles, g.row_blocks, a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy);
    return cudaGetLastError();
}

/* Variants 19 (TW = 2) and 20 (TW = 4). */
template <int TW> static cudaError_t launch_mma_rows(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    if (a->m <= 0 || a->n <= 0)
        return cudaSuccess;
    /* 16-byte activation loads. */
    if ((a->ldx & 15) != 0 || (reinterpret_cast<uintptr_t>(a->x) & 15) != 0)
        return cudaErrorMisalignedAddress;
    const MmaRowsGrid g = {(a->tiles + TW - 1) / TW, (a->m + kMmaRows - 1) / kMmaRows};
    switch (mma_rows_split<TW>(g, a->groups, a->sm_count)) {
    case 1: return launch_mma_rows_t<1, TW>(a, g, stream);
    case 2: return launch_mma_rows_t<2, TW>(a, g, stream);
    case 4: return launch_mma_rows_t<4, TW>(a, g, stream);
    default: return launch_mma_rows_t<8, TW>(a, g, stream);
    }
}

/* ---- activation quantization ---------------------------------------------- */

/* The int8 code of x at scale s: round half to even, NaN -> 0, clamped. */
__device__ __forceinline__ int quantize_code(float x, float s)
{
    const float r = rintf(__fmul_rn(x, s));
    return r != r ? 0 : r > 127.0f ? 127 : r < -128.0f ? -128 : (int)r;
}

/* One block per row: absmax (NaN ignored), s = 127 / max(absmax, 1e-5),
 * round half to even, NaN -> 0, clamp, exact sum; zero padding to ldq.
 * VEC: four values a load and a store (k, ldx and ldq multiples of 4, x
 * 16-byte and q 4-byte aligned); the same codes, scale and sum (a maximum
 * and an integer sum do not depend on the order). */
template <bool VEC>
__global__ void __launch_bounds__(1024)
    quantize_kernel(const float *__restrict__ x, int64_t k, int64_t ldx, int8_t *__restrict__ q,
                    int64_t ldq, float *__restrict__ scale, int32_t *__restrict__ sum)
{
    __shared__ float red_f[32];
    __shared__ int red_i[32];
    const float *row = x + blockIdx.x * ldx;
    int8_t *out = q + blockIdx.x * ldq;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float4 *row4 = reinterpret_cast<const float4 *>(row);

    float amax = 0.0f; /* fmaxf drops a NaN operand */
    if constexpr (VEC) {
        for (int64_t i = tid; i < k / 4; i += blockDim.x) {
            const float4 v = row4[i];
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
    } else {
        for (int64_t i = tid; i < k; i += blockDim.x)
            amax = fmaxf(amax, fabsf(row[i]));
    }
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0)
        red_f[warp] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        amax = fmaxf(amax, red_f[i]);
    if (!(amax >= 1e-5f))
        amax = 1e-5f;
    const float s = __fdiv_rn(127.0f, amax);

    int total = 0;
    if constexpr (VEC) {
        for (int64_t i = tid; i < ldq / 4; i += blockDim.x) {
            int c[4] = {0, 0, 0, 0};
            if (4 * i < k) { /* k is a multiple of 4: all four or none */
                const float4 v = row4[i];
                c[0] = quantize_code(v.x, s);
                c[1] = quantize_code(v.y, s);
                c[2] = quantize_code(v.z, s);
                c[3] = quantize_code(v.w, s);
            }
            reinterpret_cast<uint32_t *>(out)[i] = (uint32_t)(c[0] & 0xff) |
                                                   (uint32_t)(c[1] & 0xff) << 8 |
                                                   (uint32_t)(c[2] & 0xff) << 16 |
                                                   (uint32_t)(c[3] & 0xff) << 24;
            total += c[0] + c[1] + c[2] + c[3];
        }
    } else {
        for (int64_t i = tid; i < ldq; i += blockDim.x) {
            const int v = i < k ? quantize_code(row[i], s) : 0;
            out[i] = (int8_t)v;
            total += v;
        }
    }
    for (int o = 16; o > 0; o >>= 1)
        total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0)
        red_i[warp] = total;
    __syncthreads();
    if (tid == 0) {
        int t = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++)
            t += red_i[i];
        scale[blockIdx.x] = s;
        sum[blockIdx.x] = t;
    }
}

} // namespace

extern "C" int bn_w2a8_cuda_gemv_split(int64_t tiles, int64_t groups, int sm_count)
{
    /* Enough warps to keep ~16 per SM busy, but no more splits than
     * chunk-groups (each split needs at least one); and long rows split
     * until a warp has at most 24 chunk-groups: its loads are then spread
     * over more warps and in flight sooner (5120 x 27648 on an H200: split
     * 8 72 % of copy bandwidth, split 4 59 %). */
    const int64_t want = (int64_t)sm_count * 16;
    int split = 1;
    while (split < 8 && groups >= 2 * split && (tiles * split < want || groups > 24 * split))
        split *= 2;
    return split;
}

extern "C" cudaError_t bn_w2a8_cuda_gemv_variant(const bn_w2a8_cuda_args *a, int split,
                                                 int variant, cudaStream_t stream)
{
    switch (variant) {
    case 0: return launch_gemv_split<2, false>(a, split, stream);
    case 1: return launch_gemv_split<4, false>(a, split, stream);
    case 2: return launch_gemv_split<4, true>(a, split, stream);
    case 3: return launch_gemv_split<8, false>(a, split, stream);
    case 4: return launch_gemv_split<4, true, true>(a, split, stream);
    case 5: return bn_w2a8_cuda_gemv_pdl(a, split, 0, stream);
    case 6:
    case 7:
    case 8: {
        bn_w2a8_cuda_args c = *a;
        c.cluster = 1 << (variant - 5);
        return bn_w2a8_cuda_gemv_pdl(&c, split, 0, stream);
    }
    case 9: {
        /* Where bulk copies cannot run (or the row is too long for them),
         * variant 5. */
        const cudaError_t rc = bn_w2a8_cuda_gemv_bulk(a, split, 0, stream);
        return rc == cudaErrorNotSupported ? bn_w2a8_cuda_gemv_pdl(a, split, 0, stream) : rc;
    }
    case 10: {
        /* split: blocks an SM. Where it cannot run, variant 5. */
        const cudaError_t rc = bn_w2a8_cuda_gemv_bulk_tiles(a, split, 0, stream);
        return rc == cudaErrorNotSupported ? bn_w2a8_cuda_gemv_pdl(a, split, 0, stream) : rc;
    }
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t bn_w2a8_cuda_gemv(const bn_w2a8_cuda_args *a, int split,
                                         cudaStream_t stream)
{
    /* Activations staged in shared memory measured fastest on every shape
     * (docs/PERFORMANCE.md); rows longer than the shared memory a block can
     * comfortably take read them through L1 instead. */
    const bool fits = a->groups * kGroup <= kRowSmemMax;
    return bn_w2a8_cuda_gemv_variant(a, split, fits ? BN_W2A8_GEMV_DEFAULT_VARIANT : 1, stream);
}

extern "C" cudaError_t bn_w2a8_cuda_gemv_pdl(const bn_w2a8_cuda_args *a, int split, int pdl,
                                             cudaStream_t stream)
{
    /* The same choice as bn_w2a8_cuda_gemv: activations in shared memory
     * when they fit comfortably; staged once per cluster when asked for and
     * the device and the build have clusters. */
    if (a->cluster != 0 && a->cluster != 1 && a->cluster != 2 && a->cluster != 4 &&
        a->cluster != 8 && a->cluster != 16)
        return cudaErrorInvalidValue;
    if (a->relu2_pair) {
        if (!bn_w2a8_cuda_gemv_pair_fits(a->n, a->tiles, a->groups))
            return cudaErrorInvalidValue;
        if (a->cluster <= 1 || !bn_w2a8_cuda_gemv_cluster_usable())
            return launch_gemv_pair<1>(a, split, pdl, stream);
        switch (a->cluster) {
        case 2: return launch_gemv_pair<2>(a, split, pdl, stream);
        case 4: return launch_gemv_pair<4>(a, split, pdl, stream);
        case 8: return launch_gemv_pair<8>(a, split, pdl, stream);
        default: return launch_gemv_pair<16>(a, split, pdl, stream);
        }
    }
    if (a->groups * kGroup > kRowSmemMax)
        return launch_gemv_pdl_split<false>(a, split, pdl, stream);
    if (a->cluster <= 1 || !bn_w2a8_cuda_gemv_cluster_usable())
        return launch_gemv_pdl_split<true>(a, split, pdl, stream);
    switch (a->cluster) {
    case 2: return launch_gemv_pdl_split<true, 2>(a, split, pdl, stream);
    case 4: return launch_gemv_pdl_split<true, 4>(a, split, pdl, stream);
    case 8: return launch_gemv_pdl_split<true, 8>(a, split, pdl, stream);
    case 16: return launch_gemv_pdl_split<true, 16>(a, split, pdl, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" int bn_w2a8_cuda_gemv_pair_cluster16(const bn_w2a8_cuda_args *a, int split)
{
    if (!a->relu2_pair || !bn_w2a8_cuda_gemv_pair_fits(a->n, a->tiles, a->groups) ||
        !bn_w2a8_cuda_gemv_cluster_usable())
        return 0;
    int resident = 0;
    if (launch_gemv_pair<16>(a, split, 0, nullptr, &resident) != cudaSuccess) {
        (void)cudaGetLastError(); /* a device that refuses the size: not an error to keep */
        return 0;
    }
    return resident > 0;
}

extern "C" int bn_w2a8_cuda_gemv_pair_fits(int64_t n, int64_t tiles, int64_t groups)
{
    /* [gate; up] of f rows each, f a multiple of 8 (so up's tiles start at
     * tiles / 2), activations in shared memory. */
    return n > 0 && n % 16 == 0 && tiles == n / kTileRows && groups * kGroup <= kRowSmemMax;
}

extern "C" int bn_w2a8_cuda_gemv_cluster_usable(void)
{
    /* Asked once per process: the answer is the device's and the build's. */
    static int usable = -1;
    if (usable < 0)
        usable = clusters_usable(gemv_pdl_kernel<8, 1, true, 8>) &&
                 clusters_usable(gemv_pdl_kernel<1, 4, true, 2>);
    return usable;
}

extern "C" int bn_w2a8_cuda_gemv_pdl_compiled(void)
{
    return pdl_compiled(gemv_pdl_kernel<1, 4, true>) && pdl_compiled(gemv_pdl_kernel<8, 1, true>);
}

static cudaError_t launch_tiled(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    const dim3 grid((unsigned)((a->n + kBN - 1) / kBN), (unsigned)((a->m + kBM - 1) / kBM));
    gemm_kernel<<<grid, 128, 0, stream>>>(reinterpret_cast<const uint4 *>(a->weights), a->x,
                                          a->ldx, a->m, a->n, a->groups, a->act_scale,
                                          a->act_sum, a->weight_scale, a->y, a->ldy);
    return cudaGetLastError();
}

static cudaError_t launch_skinny(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    const int mt = a->m <= 16 ? 1 : 2;
    const int64_t row_blocks = (a->tiles * kTileRows + kSkinnyRows - 1) / kSkinnyRows;
    const int64_t m_blocks = (a->m + 16 * mt - 1) / (16 * mt);
    /* Split K until about two blocks per SM exist (needs the workspace). */
    int64_t splits = 1;
    if (a->workspace) {
        const int64_t want = 2 * (int64_t)(a->sm_count > 0 ? a->sm_count : 132);
        splits = (want + row_blocks * m_blocks - 1) / (row_blocks * m_blocks);
        splits = splits < 1 ? 1 : splits > a->groups ? a->groups : splits;
    }
    const int64_t per_split = (a->groups + splits - 1) / splits;
    splits = (a->groups + per_split - 1) / per_split;
    if (splits > 1) {
        cudaError_t rc =
            cudaMemsetAsync(a->workspace, 0, (size_t)(a->m * a->n) * sizeof(int32_t), stream);
        if (rc != cudaSuccess)
            return rc;
    }
    const dim3 grid((unsigned)row_blocks, (unsigned)splits, (unsigned)m_blocks);
    if (mt == 1)
        skinny_kernel<1><<<grid, 32 * kSkinnyWarps, 0, stream>>>(
            reinterpret_cast<const uint4 *>(a->weights), a->x, a->ldx, a->m, a->n, a->groups,
            a->tiles, (int)per_split, a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy,
            a->workspace);
    else
        skinny_kernel<2><<<grid, 32 * kSkinnyWarps, 0, stream>>>(
            reinterpret_cast<const uint4 *>(a->weights), a->x, a->ldx, a->m, a->n, a->groups,
            a->tiles, (int)per_split, a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy,
            a->workspace);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess || splits == 1)
        return rc;
    const int64_t total = a->m * a->n;
    skinny_epilogue<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(
        a->workspace, a->m, a->n, a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_variant(const bn_w2a8_cuda_args *a, int variant,
                                                 cudaStream_t stream)
{
    switch (variant) {
    case 0: return launch_tiled(a, stream);
    case 1: return launch_skinny(a, stream);
    case 2: return bn_w2a8_cuda_gemm_pipelined(a, BN_W2A8_PIPE_64X256, 0, stream);
    case 3: return bn_w2a8_cuda_gemm_pipelined(a, BN_W2A8_PIPE_64X256, 1, stream);
    case 4: return bn_w2a8_cuda_gemm_pipelined(a, BN_W2A8_PIPE_128X256, 0, stream);
    case 5: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_256X128, stream);
    case 6: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_128X128_1WG, stream);
    case 7: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_128X128, stream);
    case 8: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_128X128_SPLITK, stream);
    case 9: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_128X128_SS, stream);
    case 10: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_128X128_TMA, stream);
    case 11: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_128X128_TMA_STREAMK, stream);
    case 12: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_128X128_TMA_RS, stream);
    case 13: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_128X128_TMA_RS_STREAMK, stream);
    case 14: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_192X128_TMA_RS, stream);
    case 15: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_192X128_TMA_RS_STREAMK, stream);
    case 16: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_256X128_TMA_RS, stream);
    case 17: return bn_w2a8_cuda_gemm_wgmma(a, BN_W2A8_WGMMA_192X64_TMA_RS, stream);
    case 18: return launch_rows(a, stream);
    case 19: return launch_mma_rows<2>(a, stream);
    case 20: return launch_mma_rows<4>(a, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* Variants 10-17: the warp-specialized wgmma kernels (tensor maps, PDL). */
static bool warp_specialized(int variant)
{
    return variant >= 10 && variant <= 17;
}

extern "C" int bn_w2a8_cuda_gemm_variant_pdl(int variant)
{
    return warp_specialized(variant);
}

extern "C" int bn_w2a8_cuda_gemm_variant_streamk(int variant)
{
    return variant == 11 || variant == 13 || variant == 15;
}

/* Whether stream-K (variants 11, 13, 15) saves the warp-specialized kernel's
 * busiest SM at least BN_W2A8_STREAMK_MIN_SAVED k-tiles (of its wg_tiles
 * output tiles of k / 128 k-tiles each): whole tiles put
 * ceil(tiles / G) tiles on it, stream-K an even share of all k-tiles. */
static bool streamk_pays(int64_t wg_tiles, int64_t k, int sm_count)
{
    const int64_t n_kt = (k + 127) / 128, total = wg_tiles * n_kt;
    const int64_t grid = sm_count > 0 ? sm_count : 132;
    if (grid <= 1 || total <= 0)
        return false;
    const int64_t whole = (wg_tiles + grid - 1) / grid * n_kt;
    const int64_t even = (total + grid - 1) / grid;
    return whole - even >= BN_W2A8_STREAMK_MIN_SAVED;
}

/* Measured on an H200 and an H100 (docs/PERFORMANCE.md). Up to 3 rows on
 * matrices of at most BN_W2A8_ROWS_SMALL_WEIGHTS weights, the GEMV's
 * stream dotted with each row (18: 2560 x 2560 at M = 2 3.2 us against 4.1
 * for 19). Up to 64 rows the same stream into mma fragments (19, 20), except
 * above 16 rows where the 192 x 64 wgmma tiles fill half the SMs or more
 * (17: 13824 x 2560 at M = 48 11.3 us against 19.7; 20480 x 3200 at M = 24
 * 12.5 against 23.9): H200, M = 16, 1.5-3.7x cuBLAS BF16 on the seven
 * benchmark shapes, where the skinny kernel (1) was 0.8-2.2x. Four tiles a
 * warp (20) where columns of two would number at least 8 an SM (55296 x
 * 5120 at M = 16 37.3 us against 38.8 with two; 13824 x 2560 8.3 against
 * 8.2: level). With Hopper's wgmma available (sm_90a code, a 9.0 device)
 * and more rows: the warp-specialized persistent kernels with the weights
 * expanded into wgmma's A registers. The widest tiles that still fill every
 * SM, since per multiply-add they move fewer activation bytes: 256 weight
 * rows a block (16) once those tiles fill every SM (13824 x 2560 at M = 512:
 * 50 us with 128 rows, 45-48 with 192, 38-41 with 256); else 192 (14; 15
 * with stream-K) once those do or the rows are long (BN_W2A8_WGMMA_LONG_K;
 * 5120 x 27648: 167 us with 128 rows, 100 with 192 and stream-K); else 192
 * x 64 (17) where those tiles fit one wave: three quarters of a 128 x 128
 * tile's work on more SMs (2560 x 2560: 10.5-11.0 us against 13.2; 2560 x
 * 6912: 20.7-21.2 against 23.8-24.1 with 128 x 128 and stream-K); else 128
 * (12; 13 with stream-K). Stream-K where whole tiles leave the busiest SM
 * far behind the others. Without wgmma: the pipelined 64 x 256 kernel once
 * its tiles fill every SM about twice; with fewer tiles, split-K for long
 * rows, else the 64 x 64 tiled kernel. */
extern "C" int bn_w2a8_cuda_gemm_default_variant(int64_t m, int64_t n, int64_t k, int wgmma,
                                                 int sm_count)
{
    const int64_t sms = sm_count > 0 ? sm_count : 132;
    if (m <= BN_W2A8_ROWS_MAX_M && n * k <= BN_W2A8_ROWS_SMALL_WEIGHTS)
        return 18;
    /* Output tiles of `rows` weight rows x `acts` activation rows. */
    auto tiles_of = [m, n](int64_t rows, int64_t acts) {
        return ((m + acts - 1) / acts) * ((n + rows - 1) / rows);
    };
    if (m <= BN_W2A8_NARROW_MAX_M) {
        /* Up to 16 rows, and up to 64 where the 192 x 64 tiles of the wgmma
         * kernel cannot fill half the SMs: the weight stream into mma
         * fragments, four tiles a warp where columns of two would number at
         * least 8 an SM (H100 / H200, docs/PERFORMANCE.md). */
        if (m > BN_W2A8_MMA_ROWS_MAX_M && wgmma && tiles_of(192, 64) * 2 >= sms)
            return 17;
        /* Three or four 16-row blocks over long rows: four tiles a warp
         * read each activation fragment half as often (5120 x 27648 at
         * M = 48 / 64: 45.5 / 65.5 us against 60.3 / 79.1 with two, H100;
         * 45.4 / 65.2 against 57.3 / 75.9, H200). */
        if (m > BN_W2A8_MMA_ROWS_WIDE_M && k >= BN_W2A8_MMA_ROWS_LONG_K)
            return 20;
        return (n + 15) / 16 >= 8 * sms ? 20 : 19;
    }
    if (wgmma) {
        const int64_t t128 = tiles_of(128, 128), t192 = tiles_of(192, 128);
        const int64_t t192x64 = tiles_of(192, 64);
        if (tiles_of(256, 128) >= sms)
            return 16;
        if (t192 >= sms || k >= BN_W2A8_WGMMA_LONG_K)
            return streamk_pays(t192, k, sm_count) ? 15 : 14;
        if (t192x64 <= sms)
            return 17;
        if (t128 >= BN_W2A8_WGMMA_WS_MIN_TILES || k >= BN_W2A8_WGMMA_SHORT_K)
            return streamk_pays(t128, k, sm_count) ? 13 : 12;
    }
    const int64_t tiles = tiles_of(256, 64);
    if (tiles >= BN_W2A8_PIPE_MIN_TILES)
        return 3;
    return k >= BN_W2A8_PIPE_SPLIT_MIN_K ? 2 : 0;
}

/* Whether the wgmma kernel can run on the current device: compiled for
 * sm_90a and a compute capability 9.0 device. */
extern "C" int bn_w2a8_cuda_gemm_wgmma_usable(void)
{
    if (!bn_w2a8_cuda_gemm_wgmma_compiled())
        return 0;
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return 0;
    return major == 9 && minor == 0;
}

extern "C" cudaError_t bn_w2a8_cuda_gemm(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    const int64_t k = a->groups * BN_CUDA_GROUP; /* the padded row length */
    int v = bn_w2a8_cuda_gemm_default_variant(a->m, a->n, k, bn_w2a8_cuda_gemm_wgmma_usable(),
                                              a->sm_count);
    if (bn_w2a8_cuda_gemm_variant_streamk(v) && !a->streamk)
        v -= 1; /* no stream-K workspace: whole tiles */
    const cudaError_t rc = bn_w2a8_cuda_gemm_variant(a, v, stream);
    /* The warp-specialized kernels also need the driver's tensor-map
     * encoder; without it, the other wgmma kernel (nothing was launched). */
    if (rc == cudaErrorNotSupported && warp_specialized(v))
        return bn_w2a8_cuda_gemm_variant(a, 7, stream);
    return rc;
}

extern "C" cudaError_t bn_cuda_quantize_rows(const float *x, int64_t m, int64_t k, int64_t ldx,
                                             int8_t *q, int64_t ldq, float *scale, int32_t *sum,
                                             cudaStream_t stream)
{
    if (m <= 0)
        return cudaSuccess;
    /* One block per row; few rows (decode) get wide blocks so one row is not
     * walked by a handful of warps. */
    const unsigned threads = m < 64 ? 1024 : 256;
    const bool vec = k % 4 == 0 && ldx % 4 == 0 && ldq % 4 == 0 &&
                     (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(q) & 3) == 0;
    if (vec)
        quantize_kernel<true><<<(unsigned)m, threads, 0, stream>>>(x, k, ldx, q, ldq, scale, sum);
    else
        quantize_kernel<false><<<(unsigned)m, threads, 0, stream>>>(x, k, ldx, q, ldq, scale, sum);
    return cudaGetLastError();
}

#ifdef BN_DECODE_TRACE
BN_TRACE_ATTACH(bn_w2a8_trace_attach)
#endif
