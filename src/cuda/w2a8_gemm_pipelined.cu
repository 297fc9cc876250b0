/*
 * w2a8_gemm_pipelined.cu - the W2A8 GEMMs for prefill-sized M (more than
 * 64 activation rows) on GPUs without wgmma: int8 tensor cores (mma.sync
 * m16n8k32) fed by a multi-stage cp.async pipeline, with the packed 2-bit
 * weights kept packed in shared memory and expanded straight into mma
 * fragments (BN_W2A8_PIPE, BN_W2A8_PIPE_SPLITK); and a tiled kernel without
 * pipeline for shapes with few tiles and short rows (BN_W2A8_TILED).
 *
 * Same contract as every W2A8 kernel (w2a8_cuda.h): weights in the
 * cuda_layout.h tile layout, activations int8 rows of ldx bytes, zero from
 * k to k_padded, and
 *
 *     acc = sum code * x      (exact int32; code = weight + 1)
 *     y   = ((float)(acc - act_sum) / act_scale) * weight_scale
 *
 * so the output is bit-identical to the CPU reference.
 *
 * ---- Tiles ------------------------------------------------------------------
 *
 * A block computes BM activation rows x BN weight rows (output columns);
 * every warp owns a 64 x 64 piece of it: 4 m16 tiles x 8 n8 tiles = 32
 * mma per 32-wide k step, 128 int32 accumulators per thread. K advances in
 * k-tiles of 128 = half a chunk-group of the layout, so a k-tile of one
 * 8-row weight tile is 256 contiguous bytes (entries q = 2h, 2h + 1 of
 * block (t, g), k-tile 2g + h) and k-tiles never straddle a block. K needs
 * no tail handling: k_padded is a multiple of 256, the activations are zero
 * past k and the weights' padding codes meet those zeros.
 *
 * Per stage, shared memory holds
 *     A: BM rows x 128 int8            (BM * 128 bytes)
 *     B: BN / 8 weight tiles x 256     (BN * 32 bytes, still 2-bit packed)
 * The weights stay packed because expanding them costs nothing at the
 * fragments: thread (gid, tig) of an m16n8k32 needs, for n = gid, the codes
 * at k = 4 tig .. 4 tig + 3 (b0) and 16 + 4 tig .. (b1), which are 2-bit
 * field tig of words 2s and 2s + 1 of row gid's 16-byte entry (see
 * cuda_layout.h): one shift and one mask per register. One 16-byte shared
 * load gives a thread the B fragments of two k steps of one n8 tile, each
 * used by 4 m16 tiles: 1 integer op per mma.
 *
 * A fragments come from ldmatrix.x4 (the four 8 x 16-byte matrices are
 * exactly a0..a3 of m16n8k32.s8). A rows are 128 bytes, so the eight rows
 * one ldmatrix phase reads would all start in bank 0; the 16-byte chunk c
 * of row r is stored at chunk c ^ (r & 7) instead, which puts those eight
 * reads (and the cp.async writes) in eight different bank groups.
 *
 * ---- Configuration ---------------------------------------------------------
 *
 *   BM = 64 activation rows x BN = 256 weight rows, 4 warps (1 x 4), 2
 *   blocks per SM: 16 KB per stage, 4 stages.
 *
 * BN is wide because a weight costs a quarter of an activation in bytes:
 * per k and block, 64x256 moves 64 + 256 / 4 = 128 bytes into shared memory
 * for 2 * 64 * 256 = 32768 int8 ops (3.9e-3 B/op; a 128 x 128 tile would
 * need 4.9e-3). At 1 POPS that is ~4 TB/s out of L2 for the whole GPU,
 * below what H100/H200 L2 delivers.
 *
 * ---- Expected throughput ------------------------------------------------------
 *
 * H100/H200 int8 peak is ~1979 TOPS through wgmma; mma.sync reaches a part
 * of it (about 2/3 is the usual figure), ~5000 int8 ops per clock per SM,
 * i.e. one m16n8k32 (8192 ops) per ~1.6 clocks per SM. Per warp and k step
 * the issue slots are 32 mma, 4 ldmatrix, 4 LDS.128 (8 every other step)
 * and 32 shift/mask ops, so the tensor pipe, not issue, is the limit.
 * Shared memory passes ~1.25 wavefronts (128 B, one per clock) per mma:
 * ldmatrix 0.5, the B loads 0.5 (the four threads of a quad read the same
 * 16 bytes, so a 16-byte load takes 4 wavefronts for 128 useful bytes) and
 * the cp.async writes 0.25 - busy against ~1.6 clocks per mma, not the
 * limit. If profiles say otherwise: B read one word per thread (mma k order
 * permuted to match, with the A chunks word-transposed) would take ~0.9. cuBLAS
 * BF16 reaches 640-790 TFLOPS on these shapes at M = 512 (docs/PERFORMANCE.md);
 * at 70-80 % of the mma.sync rate this kernel would be ~1.1-1.4x faster on
 * the large shapes.
 *
 * ---- Split-K through a thread-block cluster (sm_90) -------------------------
 *
 * Small N x M grids leave SMs idle (2560 x 2560 at M = 512 is 80 blocks of
 * 64x256 for 132 SMs). There the K range is split over `split` blocks
 * (2..8) that form one cluster: each accumulates its slice, stores its
 * accumulators in its own shared memory, and after a cluster barrier block
 * r sums the n8 tiles j with j % split == r over all blocks of the cluster
 * (distributed shared memory), applies the epilogue and stores them; a
 * second barrier keeps every block's shared memory alive until all reads
 * are done. No workspace, no atomics, no second kernel, exact integer sums.
 * Clusters need compute capability 9.0 and code compiled for it; elsewhere
 * the split is 1. The split is chosen by a small model of the last wave
 * (choose_split below).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "smem_opt_in.cuh"

#include <cooperative_groups.h>

#include "cp_async.cuh"
#include "pdl.cuh"
#include "w2a8_cuda.h"
#include "w2a8_epilogue.cuh"


namespace {

constexpr int kBK = 128;          /* k per pipeline stage: half a chunk-group */
constexpr int kTileRows = 8;      /* weight rows per layout tile              */
constexpr int kBlockBytes = 512;  /* one tile's chunk-group (cuda_layout.h)   */
constexpr int kKTileBytes = 256;  /* one tile's k-tile: half a block          */
constexpr int kWarpM = 64, kWarpN = 64;
constexpr int kMI = kWarpM / 16;  /* m16 tiles per warp */
constexpr int kNJ = kWarpN / 8;   /* n8 tiles per warp  */
constexpr int kStages = 4;

template <int BM, int BN>
struct Cfg {
    static constexpr int kWarpsM = BM / kWarpM, kWarpsN = BN / kWarpN;
    static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
    /* Two blocks of 4 warps share an SM (registers: 2 x 128 x <= 256). */
    static constexpr int kMinBlocks = kThreads <= 128 ? 2 : 1;
    static constexpr int kABytes = BM * kBK;
    static constexpr int kBBytes = BN / kTileRows * kKTileBytes;
    static constexpr int kStageBytes = kABytes + kBBytes;
    static constexpr int kPipeBytes = kStages * kStageBytes;
    /* Split-K: every thread's accumulators, as int4 per (i, j). */
    static constexpr int kRedBytes = kThreads * kMI * kNJ * 16;
    static constexpr int kAChunks = BM * kBK / 16; /* 16-byte cp.async per stage */
    static constexpr int kBChunks = kBBytes / 16;
    static_assert(BM % kWarpM == 0 && BN % kWarpN == 0, "whole warp tiles");
    static_assert(kAChunks % kThreads == 0 && kBChunks % kThreads == 0, "even copy split");
    static_assert(kStageBytes % 128 == 0, "stages keep the 128-byte swizzle alignment");
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* A pure function of its registers: left to the scheduler. */
__device__ __forceinline__ void mma_s8(int32_t c[4], const uint32_t a[4], const uint32_t b[2])
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Byte offset of 16-byte chunk `chunk` (0..7) of A row `row` in a stage. */
__device__ __forceinline__ int a_offset(int row, int chunk)
{
    return row * kBK + ((chunk ^ (row & 7)) << 4);
}

/*
 * Grid: x = m-block * split + split rank (the split ranks of one output
 * tile are adjacent, so a cluster of `split` along x is exactly them, and
 * the m-blocks sharing a weight tile run together: the weights come from
 * DRAM once and from L2 for the other m-blocks); y = n-block.
 */
template <int BM, int BN>
__global__ void __launch_bounds__(Cfg<BM, BN>::kThreads, Cfg<BM, BN>::kMinBlocks)
    pipelined_kernel(const uint8_t *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                     int64_t m, int64_t n, int64_t tiles, int64_t groups, int split,
                     const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                     float w_scale, float *__restrict__ y, int64_t ldy)
{
    using C = Cfg<BM, BN>;
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
    const int rank = (int)(blockIdx.x % (unsigned)split);
    const int64_t m0 = (int64_t)(blockIdx.x / (unsigned)split) * BM;
    const int64_t tile0 = (int64_t)blockIdx.y * (BN / kTileRows);

    /* This block's k-tiles: [kt_begin, kt_begin + n_kt). */
    const int64_t k_tiles = 2 * groups;
    const int64_t per = (k_tiles + split - 1) / split;
    const int64_t kt_begin = rank * per;
    const int n_kt = (int)max((int64_t)0, min(k_tiles, kt_begin + per) - kt_begin);

    const uint32_t smem_base = (uint32_t)__cvta_generic_to_shared(smem);

    /* Queues the copies of k-tile kt into stage slot `slot`. */
    auto load_stage = [&](int slot, int64_t kt) {
        const uint32_t as = smem_base + slot * C::kStageBytes;
        const uint32_t bs = as + C::kABytes;
#pragma unroll
        for (int p = 0; p < C::kAChunks / C::kThreads; p++) {
            const int c = p * C::kThreads + tid;
            const int row = c >> 3, chunk = c & 7;
            const bool ok = m0 + row < m;
            const int8_t *src = ok ? x + (m0 + row) * ldx + kt * kBK + chunk * 16 : x;
            cp_async16(as + a_offset(row, chunk), src, ok);
        }
#pragma unroll
        for (int p = 0; p < C::kBChunks / C::kThreads; p++) {
            const int c = p * C::kThreads + tid;
            const int t = c >> 4, e = c & 15;
            const bool ok = tile0 + t < tiles;
            /* Block (t, g) at (t G + g) 512; k-tile kt = 2g + h is its half h. */
            const uint8_t *src =
                ok ? w + (tile0 + t) * groups * kBlockBytes + kt * kKTileBytes + e * 16 : w;
            cp_async16(bs + t * kKTileBytes + e * 16, src, ok);
        }
    };

    int32_t acc[kMI][kNJ][4];
#pragma unroll
    for (int i = 0; i < kMI; i++)
#pragma unroll
        for (int j = 0; j < kNJ; j++)
#pragma unroll
            for (int v = 0; v < 4; v++)
                acc[i][j][v] = 0;

    /* ldmatrix.x4: lanes 0-7 address rows 0-7 of matrix 0 (k bytes 0-15),
     * 8-15 rows 8-15 (matrix 1), 16-23 rows 0-7 at bytes 16-31 (matrix 2),
     * 24-31 rows 8-15 at bytes 16-31 (matrix 3) = a0, a1, a2, a3. */
    const int a_row = wm * kWarpM + (lane & 15);
    const int a_half = lane >> 4;
    /* B: row gid of weight tile wn * 8 + j, entry (quarter, gid). */
    const int b_base = wn * kNJ * kKTileBytes + gid * 16;
    const int shift = 2 * tig;

    /* Prologue: the first kStages - 1 k-tiles in flight. A group is
     * committed even when empty so that the group count stays uniform. */
#pragma unroll
    for (int st = 0; st < kStages - 1; st++) {
        if (st < n_kt)
            load_stage(st, kt_begin + st);
        cp_async_commit();
    }

    for (int it = 0; it < n_kt; it++) {
        /* k-tile `it` has landed (this thread's copies), and after the
         * barrier everyone's; the barrier also retires the reads of the
         * slot computed last iteration, which the next copies overwrite. */
        cp_async_wait<kStages - 2>();
        __syncthreads();
        const int pre = it + kStages - 1;
        if (pre < n_kt)
            load_stage(pre % kStages, kt_begin + pre);
        cp_async_commit();

        const int slot = it % kStages;
        const uint32_t as = smem_base + slot * C::kStageBytes;
        const uint8_t *bs = smem + slot * C::kStageBytes + C::kABytes;
        uint4 braw[kNJ];
#pragma unroll
        for (int s = 0; s < kBK / 32; s++) {
            if ((s & 1) == 0) {
                /* Quarter s / 2 of the k-tile: words 0, 1 serve step s,
                 * words 2, 3 step s + 1. */
#pragma unroll
                for (int j = 0; j < kNJ; j++)
                    braw[j] = *reinterpret_cast<const uint4 *>(bs + b_base + j * kKTileBytes +
                                                               (s >> 1) * 128);
            }
            uint32_t af[kMI][4];
#pragma unroll
            for (int i = 0; i < kMI; i++)
                ldmatrix_x4(af[i], as + a_offset(a_row + 16 * i, 2 * s + a_half));
#pragma unroll
            for (int j = 0; j < kNJ; j++) {
                const uint32_t lo = (s & 1) ? braw[j].z : braw[j].x;
                const uint32_t hi = (s & 1) ? braw[j].w : braw[j].y;
                const uint32_t bf[2] = {(lo >> shift) & 0x03030303u, (hi >> shift) & 0x03030303u};
#pragma unroll
                for (int i = 0; i < kMI; i++)
                    mma_s8(acc[i][j], af[i], bf);
            }
        }
    }
    /* Only empty groups can be pending; drain them anyway before shared
     * memory is reused below. */
    cp_async_wait<0>();

    if (split > 1) {
#if BN_HAS_CLUSTERS
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        int4 *red = reinterpret_cast<int4 *>(smem);
        __syncthreads(); /* every warp is done with the pipeline buffers */
#pragma unroll
        for (int i = 0; i < kMI; i++)
#pragma unroll
            for (int j = 0; j < kNJ; j++)
                red[(i * kNJ + j) * C::kThreads + tid] =
                    make_int4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
        cluster.sync(); /* release/acquire: the partials are visible cluster-wide */
#pragma unroll
        for (int j = 0; j < kNJ; j++) {
            if (j % split != rank)
                continue;
#pragma unroll
            for (int i = 0; i < kMI; i++) {
                const int idx = (i * kNJ + j) * C::kThreads + tid;
                int4 t = make_int4(0, 0, 0, 0);
                for (int q = 0; q < split; q++) {
                    const int4 v = cluster.map_shared_rank(red, q)[idx];
                    t.x += v.x;
                    t.y += v.y;
                    t.z += v.z;
                    t.w += v.w;
                }
                acc[i][j][0] = t.x;
                acc[i][j][1] = t.y;
                acc[i][j][2] = t.z;
                acc[i][j][3] = t.w;
            }
        }
        cluster.sync(); /* no block leaves while another still reads its partials */
#else
        __trap(); /* the launcher never splits without clusters */
#endif
    }

    /* Epilogue: c0, c1 = (row gid, cols 2 tig, 2 tig + 1), c2, c3 = row
     * gid + 8. With a split, block `rank` stores the n8 tiles it summed. */
    const bool pairs = (ldy & 1) == 0 && (reinterpret_cast<uintptr_t>(y) & 7) == 0;
#pragma unroll
    for (int i = 0; i < kMI; i++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int64_t row = m0 + wm * kWarpM + 16 * i + gid + 8 * half;
            if (row >= m)
                continue;
            const float s = act_scale[row];
            const int32_t sum = act_sum[row];
            float *yrow = y + row * ldy;
#pragma unroll
            for (int j = 0; j < kNJ; j++) {
                if (j % split != rank)
                    continue;
                const int64_t col = tile0 * kTileRows + wn * kWarpN + 8 * j + 2 * tig;
                const float v0 = w2a8_epilogue(acc[i][j][2 * half] - sum, s, w_scale);
                const float v1 = w2a8_epilogue(acc[i][j][2 * half + 1] - sum, s, w_scale);
                if (pairs && col + 1 < n) {
                    *reinterpret_cast<float2 *>(yrow + col) = make_float2(v0, v1);
                } else {
                    if (col < n)
                        yrow[col] = v0;
                    if (col + 1 < n)
                        yrow[col + 1] = v1;
                }
            }
        }
    }
}

/*
 * The split of K that minimises a model of the busiest SM: `blocks` output
 * tiles times `split` slices spread over `sms` SMs; the busiest SM runs
 * ceil(blocks * split / sms) slices of 1/split of a tile each, plus, per
 * slice, the cluster reduction (an exchange of 64 KB-class partials,
 * modelled as 256 / k_padded of a whole tile's work). An SM with one block
 * of 4 warps runs slower than one with two (one warp per scheduler leaves
 * latency uncovered): `single` is that rate. A split is taken only when it
 * gains at least 3 % over the best smaller one.
 */
int choose_split(int64_t blocks, int64_t k_tiles, int64_t k_padded, int sms, double single)
{
    int best = 1;
    double best_cost = 0.0;
    for (int s = 1; s <= BN_W2A8_PIPE_MAX_SPLIT && s <= k_tiles; s++) {
        const int64_t busiest = (blocks * s + sms - 1) / sms;
        double cost = (double)busiest * (1.0 / s + (s > 1 ? 256.0 / (double)k_padded : 0.0));
        if (busiest < 2)
            cost /= single;
        if (s == 1 || cost < 0.97 * best_cost) {
            best = s;
            best_cost = cost;
        }
    }
    return best;
}

template <int BM, int BN>
struct Launch {
    using C = Cfg<BM, BN>;

    static int64_t blocks(const bn_w2a8_cuda_args *a)
    {
        return ((a->m + BM - 1) / BM) * ((a->tiles * kTileRows + BN - 1) / BN);
    }

    /* split <= 0: chosen for the shape; otherwise clamped to what K and
     * the device allow. Every k-slice gets at least one k-tile. */
    static int effective_split(const bn_w2a8_cuda_args *a, int split)
    {
        const int64_t k_tiles = 2 * a->groups;
        if (split <= 0) {
            const int sms = a->sm_count > 0 ? a->sm_count : 132;
            split = choose_split(blocks(a), k_tiles, a->groups * 256, sms,
                                 C::kMinBlocks > 1 ? 0.75 : 1.0);
        }
        if (split > BN_W2A8_PIPE_MAX_SPLIT)
            split = BN_W2A8_PIPE_MAX_SPLIT;
        if (split > k_tiles)
            split = (int)k_tiles;
        if (split <= 1 || !clusters_usable(pipelined_kernel<BM, BN>))
            return 1;
        const int64_t per = (k_tiles + split - 1) / split;
        return (int)((k_tiles + per - 1) / per);
    }

    static cudaError_t run(const bn_w2a8_cuda_args *a, int split, cudaStream_t stream)
    {
        if (a->m <= 0 || a->n <= 0)
            return cudaSuccess;
        /* cp.async moves aligned 16-byte chunks. */
        if ((a->ldx & 15) != 0 || (reinterpret_cast<uintptr_t>(a->x) & 15) != 0 ||
            (reinterpret_cast<uintptr_t>(a->weights) & 15) != 0)
            return cudaErrorMisalignedAddress;
        split = effective_split(a, split);
        const int64_t m_blocks = (a->m + BM - 1) / BM;
        const int64_t n_blocks = (a->tiles * kTileRows + BN - 1) / BN;
        if (n_blocks > 65535 || m_blocks * split > 0x7fffffff)
            return cudaErrorInvalidConfiguration;
        const size_t smem =
            (size_t)(split > 1 && C::kRedBytes > C::kPipeBytes ? C::kRedBytes : C::kPipeBytes);
        auto kernel = pipelined_kernel<BM, BN>;
        /* What this launch needs fits GPUs with ~100 KB per block without
         * split (smem_opt_in.cuh). */
        cudaError_t rc = allow_dynamic_smem(kernel, smem);
        /* Shared memory over L1: only the epilogue's scales pass through L1. */
        if (rc == cudaSuccess)
            rc = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      (int)cudaSharedmemCarveoutMaxShared);
        if (rc != cudaSuccess)
            return rc;

        const dim3 grid((unsigned)(m_blocks * split), (unsigned)n_blocks);
        const uint8_t *w = static_cast<const uint8_t *>(a->weights);
        if (split == 1) {
            kernel<<<grid, C::kThreads, smem, stream>>>(w, a->x, a->ldx, a->m, a->n, a->tiles,
                                                        a->groups, 1, a->act_scale, a->act_sum,
                                                        a->weight_scale, a->y, a->ldy);
            return cudaGetLastError();
        }
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = dim3(C::kThreads);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)split;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        return cudaLaunchKernelEx(&cfg, kernel, w, a->x, a->ldx, a->m, a->n, a->tiles, a->groups,
                                  split, a->act_scale, a->act_sum, a->weight_scale, a->y,
                                  a->ldy);
    }
};

/* ---- Tiled, without pipeline (BN_W2A8_TILED) ----------------------------------
 *
 * A block computes a 64 x 64 output tile; codes are expanded to int8 in
 * shared memory and multiplied with the activation tile, one chunk-group
 * (256 k) a step; the +1 of the codes is removed with the activation row
 * sums in the epilogue. Faster than the pipelined kernel on the shapes
 * whose 256-row tiles are too few to fill the GPU and whose rows are too
 * short for split-K to pay. */
namespace tiled {

constexpr int kGroup = 256; /* weights per row in one chunk-group */
constexpr int kBM = 64, kBN = 64, kBK = 256;
constexpr int kPad = 16; /* bytes added per shared row: conflict-free fragment loads */
constexpr int kStride = kBK + kPad;

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
                    w2a8_mma_s8(acc[i][j], af[i], bf[j]);
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
                        y[row * ldy + col] =
                            w2a8_epilogue(acc[i][j][2 * half + c] - sum, s, w_scale);
                }
            }
        }
    }
}

} // namespace tiled

} // namespace

extern "C" int bn_w2a8_cuda_gemm_pipelined_split(const bn_w2a8_cuda_args *a, int split)
{
    return Launch<64, 256>::effective_split(a, split);
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_pipelined(const bn_w2a8_cuda_args *a, int split,
                                                   cudaStream_t stream)
{
    return Launch<64, 256>::run(a, split, stream);
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_tiled(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    using namespace tiled;
    if (a->m <= 0 || a->n <= 0)
        return cudaSuccess;
    const dim3 grid((unsigned)((a->n + kBN - 1) / kBN), (unsigned)((a->m + kBM - 1) / kBM));
    gemm_kernel<<<grid, 128, 0, stream>>>(reinterpret_cast<const uint4 *>(a->weights), a->x,
                                          a->ldx, a->m, a->n, a->groups, a->act_scale,
                                          a->act_sum, a->weight_scale, a->y, a->ldy);
    return cudaGetLastError();
}
