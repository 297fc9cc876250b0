/*
 * w2a8_gemm_cluster.cu - lab: the W2A8 GEMM for 17 to 64 activation rows
 * (the batched decode pass) with K split over the blocks of a thread-block
 * cluster and the int32 partial sums added through distributed shared
 * memory, timed beside the shipped picks' shapes.
 *
 * At 64 rows the shipped kernels stream a tile's whole K on one SM (the
 * wgmma 192 x 64 tiles: 20 tiles for 3840 x 2560, ~10 us, a tile's k-tiles
 * one after another) or re-read every activation fragment per 16 weight
 * rows (mma rows: 7.9 us), ~8x the weights' byte time. Here:
 *
 *   block    WARPS warps, each TW layout tiles (8 TW weight rows) x all M
 *            rows (MB blocks of 16), over the chunk-groups of its split;
 *            B fragments straight from the packed weights and A fragments
 *            straight from the activation rows (read through L1: the block's
 *            warps read the same bytes), as mma rows does, no shared memory
 *            in the loop
 *   cluster  S blocks, the splits of one column of weight rows; each writes
 *            its int32 sums to its shared memory, and after a cluster
 *            barrier block r adds the S blocks' sums of its share of the
 *            column's outputs (distributed shared memory) and writes them
 *            through the epilogue. Integer sums: exact, any order.
 *
 * That is form 1; forms 2 and 3 (below) stage the split's activations in
 * shared memory instead.
 *
 * usage: w2a8_gemm_cluster [M] [NxK ...]   (M 64; default: the 2B-4T shapes)
 *        LAB_ONLY=form,tw,warps,splits: that configuration alone (for ncu)
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "cp_async.cuh"
#include "pdl.cuh"
#include "mma_words.cuh"
#include "w2a8_gemv.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int kTileRows = kGemvTileRows;
constexpr int kGroup = kGemvGroup;
constexpr int kBlockBytes = kGemvBlockBytes;

/* Shared memory a block: its column's sums, [16 MB rows][cols + 4] int32
 * (the pad spreads a fragment's rows over the banks). */
template <int TW, int WARPS, int MB> struct ClusterCfg {
    static constexpr int kCols = WARPS * TW * kTileRows;
    static constexpr int kRows = 16 * MB;
    static constexpr int kStride = kCols + 4;
    static constexpr size_t kSmem = sizeof(int32_t) * (size_t)kRows * kStride;
};


/* After every block of the cluster wrote its sums: block r adds the S
 * blocks' sums of its share of the column's outputs (4 columns a thread,
 * row-major, so that consecutive threads write consecutive columns; the S
 * remote loads issued together) and writes them through the epilogue. The
 * second barrier keeps every block's sums alive until all are read. */
template <class C>
__device__ __forceinline__ void cluster_reduce(cg::cluster_group &cluster, int32_t *sums,
                                               int64_t col0, int64_t m, int64_t n,
                                               const float *__restrict__ act_scale,
                                               const int32_t *__restrict__ act_sum, float w_scale,
                                               float *__restrict__ y, int64_t ldy)
{
    constexpr int kMaxSplits = 16, kQuads = C::kCols / 4;
    cluster.sync();
    const int S = (int)cluster.num_blocks(), split = (int)cluster.block_rank();
    const int rows = m < C::kRows ? (int)m : C::kRows;
    for (int o = split * (int)blockDim.x + (int)threadIdx.x; o < rows * kQuads;
         o += S * (int)blockDim.x) {
        const int r = o / kQuads, c = 4 * (o % kQuads);
        int4 part[kMaxSplits];
#pragma unroll
        for (int s = 0; s < kMaxSplits; s++)
            if (s < S)
                part[s] = *reinterpret_cast<const int4 *>(cluster.map_shared_rank(sums, s) +
                                                          r * C::kStride + c);
        int v[4] = {0, 0, 0, 0};
#pragma unroll
        for (int s = 0; s < kMaxSplits; s++)
            if (s < S) {
                v[0] += part[s].x;
                v[1] += part[s].y;
                v[2] += part[s].z;
                v[3] += part[s].w;
            }
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (col0 + c + e < n)
                y[(int64_t)r * ldy + col0 + c + e] =
                    w2a8_epilogue(v[e] - act_sum[r], act_scale[r], w_scale);
    }
    cluster.sync();
}

/*
 * Fragments as in mma rows (src/cuda/w2a8_gemm_rows.cu): a chunk-group's
 * 256 k are four quarters u, each two steps h; lane (gid, tig) holds in
 * step (u, h) k = 64 u + 16 tig + 8 h + 0..3 (A regs 0, 1 / B reg 0) and
 * + 4..7 (A regs 2, 3 / B reg 1): word tig of the weight entry (u, gid),
 * fields 2h and 2h + 1, and the 16 activation bytes 64 u + 16 tig .. of
 * rows gid and gid + 8.
 */

/* Step h of a quarter: the TW tiles' B fragments (fields 2h, 2h + 1 of
 * their words bu) against the MB A fragments. */
template <int TW, int MB>
__device__ __forceinline__ void mma_step(int32_t (&acc)[TW][MB][4], uint32_t (&af)[MB][4],
                                         const uint32_t (&bu)[TW], int h)
{
#pragma unroll
    for (int t = 0; t < TW; t++) {
        const uint32_t bf[2] = {(bu[t] >> (4 * h)) & 0x03030303u,
                                (bu[t] >> (4 * h + 2)) & 0x03030303u};
#pragma unroll
        for (int i = 0; i < MB; i++)
            w2a8_mma_s8(acc[t][i], af[i], bf);
    }
}

/* The warp's sums into the block's: c0, c1 are row gid + 16 i, columns
 * 2 tig, 2 tig + 1 of tile t; c2, c3 row gid + 8 + 16 i. */
template <class C, int TW, int MB>
__device__ __forceinline__ void store_sums(int32_t *sums, const int32_t (&acc)[TW][MB][4],
                                           int warp, int lane)
{
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int t = 0; t < TW; t++)
#pragma unroll
        for (int i = 0; i < MB; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int row = 16 * i + 8 * j + gid;
                const int col = (warp * TW + t) * kTileRows + 2 * tig;
                *reinterpret_cast<int2 *>(&sums[row * C::kStride + col]) =
                    make_int2(acc[t][i][2 * j], acc[t][i][2 * j + 1]);
            }
}

template <int TW, int WARPS, int MB>
__global__ void __launch_bounds__(32 * WARPS, 1)
    cluster_kernel(const uint32_t *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                   int64_t m, int64_t n, int64_t groups, int64_t tiles, int per_split,
                   const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                   float w_scale, float *__restrict__ y, int64_t ldy)
{
    using C = ClusterCfg<TW, WARPS, MB>;
    extern __shared__ __align__(16) int32_t sums[]; /* [kRows][kStride] */
    cg::cluster_group cluster = cg::this_cluster();
    const int split = (int)cluster.block_rank();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t col0 = (int64_t)blockIdx.y * C::kCols;
    const int64_t tile0 = col0 / kTileRows + (int64_t)warp * TW;
    const int64_t g0 = (int64_t)split * per_split;
    const int64_t g1 = g0 + per_split < groups ? g0 + per_split : groups;

    /* Rows gid + 16 i and gid + 8 + 16 i; null past m (zeros). */
    const int8_t *xr[MB][2];
#pragma unroll
    for (int i = 0; i < MB; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int64_t r = 16 * i + 8 * j + gid;
            xr[i][j] = r < m ? x + r * ldx + 16 * tig : nullptr;
        }
    const uint32_t *words = w + tile0 * groups * (kBlockBytes / 4) + gid * 4 + tig;

    int32_t acc[TW][MB][4] = {};

    for (int64_t g = g0; g < g1; g++) {
        /* Every weight word of the chunk-group first: 4 TW loads in flight. */
        uint32_t b[4][TW];
        load_words<TW>(b, words, groups, g, tile0, tiles);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            uint4 a[MB][2];
#pragma unroll
            for (int i = 0; i < MB; i++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    a[i][j] = xr[i][j] ? __ldg(reinterpret_cast<const uint4 *>(
                                             xr[i][j] + g * kGroup + 64 * u))
                                       : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t af[MB][4];
#pragma unroll
                for (int i = 0; i < MB; i++) {
                    af[i][0] = h ? a[i][0].z : a[i][0].x;
                    af[i][1] = h ? a[i][1].z : a[i][1].x;
                    af[i][2] = h ? a[i][0].w : a[i][0].y;
                    af[i][3] = h ? a[i][1].w : a[i][1].y;
                }
                mma_step<TW, MB>(acc, af, b[u], h);
            }
        }
    }

    store_sums<C, TW, MB>(sums, acc, warp, lane);
    cluster_reduce<C>(cluster, sums, col0, m, n, act_scale, act_sum, w_scale, y, ldy);
}


/* ---- form 2: the split's activations staged in shared memory --------------
 *
 * As cluster_kernel, but each chunk-group's activation rows are copied once
 * a block into shared memory (two buffers: the next group's copies run
 * while this one is multiplied), and each warp takes its A fragments with
 * ldmatrix (one instruction a 16-row fragment) instead of two 16-byte
 * global loads a row pair. ldmatrix gives the standard m16n8k32 A layout
 * (lane (gid, tig): bytes 4 tig .. and 16 + 4 tig .. of the step's 32), so
 * the copy permutes each quarter's 4-byte words into the order the weight
 * fragments use: actual word 4 c + j (k = 64 u + 16 c + 4 j) goes to word
 * 8 (j >> 1) + 4 (j & 1) + c of the quarter, which puts step h = j >> 1's
 * k = 64 u + 16 tig + 8 h + 0..3 at slot 4 tig and + 4..7 at 16 + 4 tig.
 * Rows are 272 bytes apart, so ldmatrix's eight rows fall in different
 * banks. */
template <int MB> struct StagedCfg {
    static constexpr int kRowBytes = kGroup + 16;
    static constexpr int kStage = 16 * MB * kRowBytes;
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* Copy i (4 bytes) of chunk-group g's activation rows into the stage at
 * shared address dst: row i / 64's word a = i % 64 at its permuted place
 * in the quarter (zeros past row m). */
template <int MB>
__device__ __forceinline__ void stage_word(uint32_t dst, const int8_t *x, int64_t ldx, int64_t m,
                                           int64_t g, int i)
{
    const int r = i >> 6, a = i & 63;
    const int u = a >> 4, c = (a >> 2) & 3, j = a & 3;
    const int to = 16 * u + 8 * (j >> 1) + 4 * (j & 1) + c;
    const bool ok = r < m;
    cp_async<4>(dst + (uint32_t)(r * StagedCfg<MB>::kRowBytes + 4 * to),
                ok ? x + (int64_t)r * ldx + g * kGroup + 4 * a : x, ok);
}

/* A staged chunk-group's products: A fragments by ldmatrix from the stage
 * (base: the stage plus this lane's ldmatrix offset), B from the words b. */
template <int TW, int MB>
__device__ __forceinline__ void mma_staged(int32_t (&acc)[TW][MB][4], const uint32_t (&b)[4][TW],
                                           uint32_t base)
{
#pragma unroll
    for (int u = 0; u < 4; u++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t af[MB][4];
#pragma unroll
            for (int i = 0; i < MB; i++)
                ldmatrix_x4(af[i], base + (uint32_t)(16 * i * StagedCfg<MB>::kRowBytes + 64 * u +
                                                     32 * h));
            mma_step<TW, MB>(acc, af, b[u], h);
        }
}

template <int TW, int WARPS, int MB>
__global__ void __launch_bounds__(32 * WARPS)
    staged_kernel(const uint32_t *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                  int64_t m, int64_t n, int64_t groups, int64_t tiles, int per_split,
                  const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                  float w_scale, float *__restrict__ y, int64_t ldy)
{
    using C = ClusterCfg<TW, WARPS, MB>;
    using SC = StagedCfg<MB>;
    extern __shared__ __align__(16) uint8_t smem[]; /* [2][16 MB][272], then the sums */
    int32_t *sums = reinterpret_cast<int32_t *>(smem);
    cg::cluster_group cluster = cg::this_cluster();
    const int split = (int)cluster.block_rank();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t col0 = (int64_t)blockIdx.y * C::kCols;
    const int64_t tile0 = col0 / kTileRows + (int64_t)warp * TW;
    const int64_t g0 = (int64_t)split * per_split;
    const int64_t g1 = g0 + per_split < groups ? g0 + per_split : groups;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);

    auto stage = [&](int64_t g, int buf) {
        for (int i = threadIdx.x; i < 16 * MB * 64; i += 32 * WARPS)
            stage_word<MB>(sbase + (uint32_t)(buf * SC::kStage), x, ldx, m, g, i);
    };
    const uint32_t *words = w + tile0 * groups * (kBlockBytes / 4) + gid * 4 + tig;

    int32_t acc[TW][MB][4] = {};

    uint32_t b[4][TW];
    if (g0 < g1) {
        stage(g0, 0);
        load_words<TW>(b, words, groups, g0, tile0, tiles);
    }
    cp_async_commit();
    /* Lane l addresses row (l & 7) + 8 ((l >> 3) & 1), bytes 16 (l >> 4) ..
     * of ldmatrix's four 8 x 16-byte matrices. */
    const uint32_t lane_off =
        (uint32_t)(((lane & 7) + 8 * ((lane >> 3) & 1)) * SC::kRowBytes + 16 * (lane >> 4));
    for (int64_t g = g0, buf = 0; g < g1; g++, buf ^= 1) {
        uint32_t nb[4][TW];
        if (g + 1 < g1) {
            stage(g + 1, (int)buf ^ 1);
            load_words<TW>(nb, words, groups, g + 1, tile0, tiles);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        mma_staged<TW, MB>(acc, b, sbase + (uint32_t)(buf * SC::kStage) + lane_off);
        __syncthreads(); /* buffer buf is free for group g + 2 */
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int t = 0; t < TW; t++)
                b[u][t] = nb[u][t];
    }
    cp_async_wait<0>();
    __syncthreads();

    store_sums<C, TW, MB>(sums, acc, warp, lane);
    cluster_reduce<C>(cluster, sums, col0, m, n, act_scale, act_sum, w_scale, y, ldy);
}

/* ---- form 3: one round trip a block ----------------------------------------
 *
 * As staged_kernel, but a split holds at most G chunk-groups and the block
 * asks for all of them at once: every weight word of its warps' tiles into
 * registers, every activation row of the split into shared memory (G
 * buffers), one wait, then the products. A block's critical path is one
 * trip to memory, the multiplies and the cluster's reduction. */
template <int TW, int WARPS, int MB, int G>
__global__ void __launch_bounds__(32 * WARPS)
    oneshot_kernel(const uint32_t *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                   int64_t m, int64_t n, int64_t groups, int64_t tiles, int per_split,
                   const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                   float w_scale, float *__restrict__ y, int64_t ldy)
{
    using C = ClusterCfg<TW, WARPS, MB>;
    using SC = StagedCfg<MB>;
    extern __shared__ __align__(16) uint8_t smem[]; /* [G][16 MB][272], then the sums */
    int32_t *sums = reinterpret_cast<int32_t *>(smem);
    cg::cluster_group cluster = cg::this_cluster();
    const int split = (int)cluster.block_rank();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t col0 = (int64_t)blockIdx.y * C::kCols;
    const int64_t tile0 = col0 / kTileRows + (int64_t)warp * TW;
    const int64_t g0 = (int64_t)split * per_split;
    const int count = (int)(g0 + per_split < groups ? per_split : groups > g0 ? groups - g0 : 0);
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);

    const uint32_t *words = w + tile0 * groups * (kBlockBytes / 4) + gid * 4 + tig;
    uint32_t b[G][4][TW];
#pragma unroll
    for (int q = 0; q < G; q++) /* past the split's groups: no tiles, zeros */
        load_words<TW>(b[q], words, groups, g0 + q, tile0, q < count ? tiles : tile0);
    for (int i = threadIdx.x; i < count * 16 * MB * 64; i += 32 * WARPS) {
        const int q = i / (16 * MB * 64);
        stage_word<MB>(sbase + (uint32_t)(q * SC::kStage), x, ldx, m, g0 + q, i % (16 * MB * 64));
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    int32_t acc[TW][MB][4] = {};
    const uint32_t lane_off =
        (uint32_t)(((lane & 7) + 8 * ((lane >> 3) & 1)) * SC::kRowBytes + 16 * (lane >> 4));
#pragma unroll
    for (int q = 0; q < G; q++) {
        if (q >= count)
            break;
        mma_staged<TW, MB>(acc, b[q], sbase + (uint32_t)(q * SC::kStage) + lane_off);
    }
    __syncthreads(); /* the staged rows are read: the sums may take their place */
    store_sums<C, TW, MB>(sums, acc, warp, lane);
    cluster_reduce<C>(cluster, sums, col0, m, n, act_scale, act_sum, w_scale, y, ldy);
}

struct Config {
    int form, tw, warps, splits; /* form 1: cluster_kernel, 2: staged_, 3: oneshot_ */
};

template <int FORM, int TW, int WARPS, int MB, int G = 2>
cudaError_t launch_t(const w2a8_args *a, int splits, cudaStream_t stream)
{
    using C = ClusterCfg<TW, WARPS, MB>;
    const size_t staged = (FORM == 3 ? G : 2) * (size_t)StagedCfg<MB>::kStage;
    const size_t smem = FORM == 1 || C::kSmem > staged ? C::kSmem : staged;
    auto kernel = FORM == 1   ? cluster_kernel<TW, WARPS, MB>
                  : FORM == 2 ? staged_kernel<TW, WARPS, MB>
                              : oneshot_kernel<TW, WARPS, MB, G>;
    cudaError_t rc =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (rc != cudaSuccess)
        return rc;
    if (splits > 8)
        (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    const int per_split = (int)((a->groups + splits - 1) / splits);
    const int64_t columns = (a->n + C::kCols - 1) / C::kCols;
    return pdl_launch_clustered(kernel, dim3((unsigned)splits, (unsigned)columns),
                                dim3(32 * WARPS), smem, dim3((unsigned)splits, 1, 1), stream, 0,
                                static_cast<const uint32_t *>(a->weights), a->x, a->ldx, a->m,
                                a->n, a->groups, a->tiles, per_split, a->act_scale, a->act_sum,
                                a->weight_scale, a->y, a->ldy);
}

template <int FORM, int TW, int WARPS, int G = 2>
cudaError_t launch_mb(const w2a8_args *a, int splits, cudaStream_t stream)
{
    switch ((a->m + 15) / 16) {
    case 1: return launch_t<FORM, TW, WARPS, 1, G>(a, splits, stream);
    case 2: return launch_t<FORM, TW, WARPS, 2, G>(a, splits, stream);
    case 3: return launch_t<FORM, TW, WARPS, 3, G>(a, splits, stream);
    case 4: return launch_t<FORM, TW, WARPS, 4, G>(a, splits, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* Form 3: the groups a split holds, at most 4. */
template <int TW, int WARPS>
cudaError_t launch_oneshot(const w2a8_args *a, int splits, cudaStream_t stream)
{
    switch ((a->groups + splits - 1) / splits) {
    case 1: return launch_mb<3, TW, WARPS, 1>(a, splits, stream);
    case 2: return launch_mb<3, TW, WARPS, 2>(a, splits, stream);
    case 3: return launch_mb<3, TW, WARPS, 3>(a, splits, stream);
    case 4: return launch_mb<3, TW, WARPS, 4>(a, splits, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* Whether configuration c takes a matrix of `groups` chunk-groups a row. */
bool runnable(const Config &c, int64_t groups)
{
    return c.splits <= groups && (c.form != 3 || (groups + c.splits - 1) / c.splits <= 4);
}

cudaError_t run(const Config &c, const w2a8_args *a, cudaStream_t stream)
{
    if (c.splits < 1 || c.splits > 16 || !runnable(c, a->groups))
        return cudaErrorInvalidValue;
    if (c.form == 1 && c.tw == 2 && c.warps == 4)
        return launch_mb<1, 2, 4>(a, c.splits, stream);
    if (c.form == 1 && c.tw == 4 && c.warps == 2)
        return launch_mb<1, 4, 2>(a, c.splits, stream);
    if (c.form == 2 && c.tw == 2 && c.warps == 4)
        return launch_mb<2, 2, 4>(a, c.splits, stream);
    if (c.form == 2 && c.tw == 4 && c.warps == 4)
        return launch_mb<2, 4, 4>(a, c.splits, stream);
    if (c.form == 2 && c.tw == 2 && c.warps == 8)
        return launch_mb<2, 2, 8>(a, c.splits, stream);
    if (c.form == 2 && c.tw == 4 && c.warps == 8)
        return launch_mb<2, 4, 8>(a, c.splits, stream);
    if (c.form == 2 && c.tw == 8 && c.warps == 4)
        return launch_mb<2, 8, 4>(a, c.splits, stream);
    if (c.form == 3 && c.tw == 2 && c.warps == 4)
        return launch_oneshot<2, 4>(a, c.splits, stream);
    if (c.form == 3 && c.tw == 4 && c.warps == 4)
        return launch_oneshot<4, 4>(a, c.splits, stream);
    if (c.form == 3 && c.tw == 2 && c.warps == 8)
        return launch_oneshot<2, 8>(a, c.splits, stream);
    if (c.form == 3 && c.tw == 4 && c.warps == 2)
        return launch_oneshot<4, 2>(a, c.splits, stream);
    return cudaErrorInvalidValue;
}

const std::vector<Config> kAllConfigs = {
    {1, 2, 4, 4}, {2, 2, 8, 5}, {2, 4, 4, 8}, {2, 4, 4, 16}, {2, 2, 8, 8}, {3, 2, 4, 3},
    {3, 2, 4, 4}, {3, 2, 4, 5}, {3, 2, 4, 7}, {3, 2, 4, 8}, {3, 2, 4, 10}, {3, 2, 4, 14},
    {3, 2, 4, 16}, {3, 4, 4, 3}, {3, 4, 4, 4}, {3, 4, 4, 5}, {3, 4, 4, 7}, {3, 4, 4, 8},
    {3, 4, 4, 10}, {3, 4, 4, 14}, {3, 4, 4, 16}, {3, 2, 8, 3}, {3, 2, 8, 4}, {3, 2, 8, 5},
    {3, 2, 8, 7}, {3, 2, 8, 8}, {3, 2, 8, 10}, {3, 2, 8, 14}, {3, 2, 8, 16}, {3, 4, 2, 3},
    {3, 4, 2, 4}, {3, 4, 2, 5}, {3, 4, 2, 7}, {3, 4, 2, 8}, {3, 4, 2, 10}, {3, 4, 2, 14},
    {3, 4, 2, 16},
};

std::vector<Config> configs = kAllConfigs;

bool check_config(Problem &p, const Config &c, int sms)
{
    if (!runnable(c, p.l.groups))
        return true;
    char what[96];
    snprintf(what, sizeof what, "%lldx%lld M %lld form %d tw %d warps %d splits %d",
             (long long)p.l.n, (long long)p.l.k, (long long)p.m, c.form, c.tw, c.warps, c.splits);
    poison(p);
    const w2a8_args a = p.args(sms);
    const cudaError_t rc = run(c, &a, 0);
    if (rc == cudaErrorInvalidClusterSize) {
        (void)cudaGetLastError();
        printf("  %s: not launched (%s)\n", what, cudaGetErrorString(rc));
        return true; /* a cluster this device cannot hold: timed as -1 */
    }
    return check(p, rc, what);
}

} // namespace

int main(int argc, char **argv)
{
    const int64_t m = argc > 1 ? atoll(argv[1]) : 64;
    if (m < 1 || m > 64) {
        fprintf(stderr, "usage: %s [M 1-64] [NxK ...]\n", argv[0]);
        return 2;
    }
    /* The 2B-4T projections by default. */
    static const int64_t k2b4t[][2] = {{3840, 2560}, {2560, 2560}, {13824, 2560}, {2560, 6912}};
    lab_shape_list shapes;
    if (!lab_shapes(argc, argv, 2, &shapes, k2b4t, 4))
        return 2;
    const int sms = device_sms();

    bool ok = true;
    /* LAB_ONLY="form,tw,warps,splits": that configuration alone (ncu). */
    if (const char *only = getenv("LAB_ONLY")) {
        Config c = {};
        if (sscanf(only, "%d,%d,%d,%d", &c.form, &c.tw, &c.warps, &c.splits) != 4) {
            fprintf(stderr, "%s: LAB_ONLY must be form,tw,warps,splits\n", argv[0]);
            return 2;
        }
        configs.assign(1, c);
    }
    for (int i = 0; i < 8; i++) { /* ragged shapes and row counts */
        Problem p = make_problem(lab_rand_range(1, 900), lab_rand_range(1, 3000),
                                 lab_rand_range(1, 64));
        for (const Config &c : configs)
            ok = check_config(p, c, sms) && ok;
        free_problem(p);
    }
    for (const auto &s : shapes) {
        Problem p = make_problem(s.first, s.second, m);
        for (const Config &c : configs)
            ok = check_config(p, c, sms) && ok;
        free_problem(p);
    }
    printf("check: %s\n\n", ok ? "every configuration bit for bit the CPU's" : "FAILED");

    const double copy = copy_gbs();
    printf("copy bandwidth %.0f GB/s (read + write); %d SMs; M = %lld\n\n", copy, sms,
           (long long)m);
    printf("| N x K | form | tiles a warp | warps | splits | blocks | us | GB/s |\n"
           "|---|---|---|---|---|---|---|---|\n");
    for (const auto &s : shapes) {
        Problem p = make_problem(s.first, s.second, m);
        make_copies(p);
        const double bytes = (double)p.l.bytes + (double)(m * p.l.k_padded) +
                             4.0 * (double)(m * p.l.n);
        double best = 1e30;
        Config best_c = {};
        for (const Config &c : configs) {
            if (!runnable(c, p.l.groups))
                continue;
            const w2a8_args base = p.args(sms);
            const double us = time_calls([&](int i, cudaStream_t st) {
                w2a8_args a = base;
                a.weights = p.copies[(size_t)i % p.copies.size()];
                return run(c, &a, st);
            });
            const int64_t cols = c.warps * c.tw * kTileRows;
            const int64_t blocks = (p.l.n + cols - 1) / cols * c.splits;
            printf("| %lldx%lld | %d | %d | %d | %d | %lld | %.2f | %.0f |\n", (long long)s.first,
                   (long long)s.second, c.form, c.tw, c.warps, c.splits, (long long)blocks, us,
                   us > 0 ? bytes / (us * 1e-6) / 1e9 : 0.0);
            if (us > 0 && us < best) {
                best = us;
                best_c = c;
            }
        }
        printf("| %lldx%lld | best: form %d tw %d warps %d splits %d | | | | | %.2f | |\n",
               (long long)s.first, (long long)s.second, best_c.form, best_c.tw, best_c.warps,
               best_c.splits, best);
        free_problem(p);
    }
    return ok ? 0 : 1;
}
