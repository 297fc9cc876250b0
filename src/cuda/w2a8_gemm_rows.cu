/*
 * w2a8_gemm_rows.cu - the W2A8 GEMM for a few activation rows (2 to 64:
 * short prompts, batched decode), where the weights still dominate: the
 * GEMV's weight stream (w2a8_gemv.cuh) met by every row, with dp4a
 * (BN_W2A8_ROWS) or on the tensor cores (BN_W2A8_MMA_ROWS_X2 / X4).
 *
 * Same contract as every W2A8 kernel (w2a8_cuda.h): weights in the
 * cuda_layout.h tile layout, activations int8 rows of ldx bytes, zero from
 * k to k_padded, and y = ((float)(sum code * x - act_sum) / act_scale) *
 * weight_scale with exact int32 sums, bit-identical to the CPU reference.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "w2a8_epilogue.cuh"
#include "w2a8_gemv.cuh"
#include "w2a8_cuda.h"

namespace {

constexpr int kTileRows = kGemvTileRows;
constexpr int kGroup = kGemvGroup;
constexpr int kBlockBytes = kGemvBlockBytes;

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
            w2a8_epilogue(total - act_sum[m0 + r], act_scale[m0 + r], w_scale);
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

/* BN_W2A8_ROWS, at the K split the GEMV takes for this matrix. */
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
 * For a few activation rows (short prompts, small batches) rows_kernel's
 * dp4a work grows with the rows, and staging each chunk-group's activations
 * in shared memory (a barrier and a round trip each) would leave the weight
 * stream idle. Here a warp streams its TW tiles' chunk-groups (split, split + WARPS, ...)
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
                w2a8_mma_s8(acc[t], af, bf);
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
        y[row * ldy + out] = w2a8_epilogue(total - act_sum[row], act_scale[row], w_scale);
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

/* BN_W2A8_MMA_ROWS_X2 (TW = 2) and X4 (TW = 4). */
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

} // namespace

extern "C" cudaError_t bn_w2a8_cuda_gemm_rows(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    return launch_rows(a, stream);
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_mma_rows(const bn_w2a8_cuda_args *a, int tiles_per_warp,
                                                  cudaStream_t stream)
{
    switch (tiles_per_warp) {
    case 2: return launch_mma_rows<2>(a, stream);
    case 4: return launch_mma_rows<4>(a, stream);
    default: return cudaErrorInvalidValue;
    }
}
