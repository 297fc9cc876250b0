/*
 * w2a8_gemv.cu - the W2A8 GEMV (M = 1, decode): ternary weights x one int8
 * activation row on the GPU.
 *
 * Weights use the tile layout of src/kernels/cuda_layout.h (8-row tiles,
 * 512-byte blocks per 256 weights of the 8 rows). The activation row is
 * k_padded int8 bytes, zero past k. Every kernel produces
 *
 *     acc = sum code * x  (exact int32; code = weight + 1)
 *     y   = ((float)(acc - act_sum) / act_scale) * weight_scale
 *
 * the same float epilogue as the CPU kernels (bn_w2a8_epilogue), so results
 * are bit-identical to the CPU reference.
 *
 * The GEMV is memory-bound. A warp reads one 512-byte block per load
 * instruction (16 bytes per lane, fully coalesced); lane l owns row l % 8
 * of the tile and quarter l / 8 of the block, decodes its 64 codes with
 * shift-and-mask and multiplies them with dp4a. The K loop of a tile is
 * split over WARPS warps (split-K, summed in shared memory) so that even
 * small matrices keep enough loads in flight to fill the memory system.
 * The activation row is staged in shared memory (cp.async), except rows
 * longer than kRowSmemMax, which are read through L1.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "pdl.cuh"
#include "smem_opt_in.cuh"
#include "w2a8_epilogue.cuh"
#include "w2a8_gemv.cuh"
#include "w2a8_cuda.h"

namespace {

constexpr int kTileRows = kGemvTileRows;
constexpr int kGroup = kGemvGroup;
constexpr int kBlockBytes = kGemvBlockBytes;
/* The longest activation row the GEMVs stage in shared memory (bytes);
 * longer rows are read through L1. The staged row (x_shared) starts
 * 128-byte aligned: the cluster staging writes it by bulk copies. */
constexpr int64_t kRowSmemMax = 160 * 1024;

/* One block: TILES tiles of 8 rows, WARPS warps per tile splitting K.
 * kUnroll chunk-groups are loaded before any is used (bytes in flight).
 * X_SMEM stages the activation row in shared memory (dynamic, k_padded
 * bytes) instead of reading it through L1. */
constexpr int kUnroll = 4;

template <int WARPS, int TILES, bool X_SMEM>
__global__ void __launch_bounds__(32 * WARPS * TILES)
    gemv_kernel(const uint4 *__restrict__ w, const int8_t *__restrict__ x, int64_t n,
                int64_t groups, int64_t tiles, const float *__restrict__ act_scale,
                const int32_t *__restrict__ act_sum, float w_scale, float *__restrict__ y)
{
    extern __shared__ __align__(128) int8_t x_shared[];
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
    if (tile < tiles) {
        const int quarter = lane >> 3;
        const uint4 *blocks = w + tile * groups * (kBlockBytes / 16) + lane;
        const int8_t *xq = xs + quarter * 64;
        int64_t g = split;
        for (; g + (kUnroll - 1) * WARPS < groups; g += kUnroll * WARPS) {
            uint4 v[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
                v[u] = gemv_load_stream(blocks + (g + u * WARPS) * (kBlockBytes / 16));
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
                acc = gemv_entry_dot(v[u], xq + (g + u * WARPS) * kGroup, acc);
        }
        for (; g < groups; g += WARPS)
            acc = gemv_entry_dot(gemv_load_stream(blocks + g * (kBlockBytes / 16)),
                                 xq + g * kGroup, acc);
    }
    gemv_tile_epilogue<WARPS, TILES>(
        acc, partial, tile_in_block, split, lane, threadIdx.x, n, [&](int64_t out_row, int total) {
            y[out_row] = w2a8_epilogue(total - act_sum[0], act_scale[0], w_scale);
        });
}

template <int WARPS, int TILES, bool X_SMEM>
cudaError_t launch_gemv(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    const int64_t blocks = (a->tiles + TILES - 1) / TILES;
    const size_t smem = X_SMEM ? (size_t)(a->groups * kGroup) : 0;
    auto kernel = gemv_kernel<WARPS, TILES, X_SMEM>;
    const cudaError_t rc = allow_dynamic_smem(kernel, smem);
    if (rc != cudaSuccess)
        return rc;
    kernel<<<(unsigned)blocks, 32 * WARPS * TILES, smem, stream>>>(
        reinterpret_cast<const uint4 *>(a->weights), a->x, a->n, a->groups, a->tiles,
        a->act_scale, a->act_sum, a->weight_scale, a->y);
    return cudaGetLastError();
}

template <bool X_SMEM>
cudaError_t launch_gemv_split(const bn_w2a8_cuda_args *a, int split, cudaStream_t stream)
{
    switch (split) {
    case 1: return launch_gemv<1, 4, X_SMEM>(a, stream);
    case 2: return launch_gemv<2, 2, X_SMEM>(a, stream);
    case 4: return launch_gemv<4, 1, X_SMEM>(a, stream);
    case 8: return launch_gemv<8, 1, X_SMEM>(a, stream);
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
    extern __shared__ __align__(128) int8_t x_shared[];
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
                const float gate = __fmul_rn(w2a8_epilogue(gs - x_sum, x_scale, 1.0f), sg);
                const float up = __fmul_rn(w2a8_epilogue(us - x_sum, x_scale, 1.0f), su);
                const float rg = gate > 0.0f ? gate : 0.0f;
                y[out] = __fmul_rn(__fmul_rn(rg, rg), up);
            }
        }
    } else {
        gemv_tile_epilogue<WARPS, TILES>(acc, partial, tile_in_block, split, lane, threadIdx.x,
                                         n, [&](int64_t out_row, int total) {
                                             y[out_row] = w2a8_epilogue(total - x_sum, x_scale,
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

extern "C" cudaError_t bn_w2a8_cuda_gemv(const bn_w2a8_cuda_args *a, int split,
                                         cudaStream_t stream)
{
    /* Activations staged in shared memory measured fastest on every shape
     * (docs/KERNELS.md); rows longer than the shared memory a block can
     * comfortably take read them through L1 instead. */
    if (a->groups * kGroup <= kRowSmemMax)
        return launch_gemv_split<true>(a, split, stream);
    return launch_gemv_split<false>(a, split, stream);
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

#ifdef BN_DECODE_TRACE
BN_TRACE_ATTACH(bn_w2a8_trace_attach)
#endif
