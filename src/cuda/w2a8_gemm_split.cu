/*
 * w2a8_gemm_split.cu - BN_W2A8_MMA_SPLIT: the W2A8 GEMM as output tiles of
 * 128 weight rows x 64 activation rows whose K is split over the blocks of
 * a thread-block cluster, for products of few tiles (the batched pass's
 * q|k|v, Wo and down at 17-64 rows: 20-54 tiles on 132 SMs).
 *
 * The mma-rows kernel streams the weights and lets every 16-row block read
 * its activation rows again from L2 for each pair of weight tiles; at 64
 * rows its warps wait on those reads. Here a block stages its tile's
 * activation rows and weights for its part of K in shared memory once, by
 * bulk copies (the weights before the PDL wait: they do not depend on the
 * kernel before), and its eight warps multiply them there, each two weight
 * tiles against every 16-row fragment (mma m16n8k32 in the mma-rows
 * kernel's k order). The cluster's blocks then add their int32 sums
 * through distributed shared memory, each block the epilogue of a slice of
 * the tile. K longer than a block's shared memory is taken in rounds.
 *
 * Same contract as every W2A8 kernel (w2a8_cuda.h); the int32 sums are
 * exact, so the results are the other kernels' bit for bit. sm_90 only
 * (clusters, bulk copies): elsewhere cudaErrorNotSupported, nothing
 * launched.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_layout.h"
#include "pdl.cuh"
#include "smem_opt_in.cuh"
#include "w2a8_cuda.h"
#include "w2a8_epilogue.cuh"
#include "w2a8_gemv.cuh"

namespace
{

constexpr int kTiles = 16;                     /* layout tiles (8 weight rows each) a block */
constexpr int kRowsW = kTiles * kGemvTileRows; /* 128 weight rows            */
constexpr int kRowsA = 64;                     /* activation rows a block: 4 fragments      */
constexpr int kWarps = kTiles / 2;             /* a warp: two tiles                       */
constexpr int kThreads = 32 * kWarps;
constexpr int kRound = 8;    /* chunk-groups a block holds at once        */
constexpr int kMaxSplit = 8; /* blocks a cluster (portable)               */
constexpr int kActPad = 64;  /* row stride = 64 mod 128: a quarter warp's 16-byte
                                loads of eight rows hit distinct banks    */
constexpr int kGroupWords = kGemvBlockBytes / 4;

struct SplitArgs {
    const uint8_t *w;
    int64_t n, tiles, groups;
    float w_scale;
    const int8_t *x;
    int64_t ldx, m;
    const float *act_scale;
    const int32_t *act_sum;
    float *y;
    int64_t ldy;
    int per; /* chunk-groups a split (the last may have fewer)              */
};

/* The staged activation rows' stride and the dynamic shared memory: the
 * rows and the tiles of one round, or the tile's int32 sums if more. */
__host__ __device__ constexpr int64_t act_stride() { return kRound * kGemvGroup + kActPad; }
__host__ __device__ constexpr int64_t wts_offset() { return kRowsA * act_stride(); }
__host__ __device__ constexpr size_t split_smem()
{
    return (size_t)(wts_offset() + (int64_t)kTiles * kRound * kGemvBlockBytes) >
                   (size_t)kRowsA * kRowsW * sizeof(int32_t)
               ? (size_t)(wts_offset() + (int64_t)kTiles * kRound * kGemvBlockBytes)
               : (size_t)kRowsA * kRowsW * sizeof(int32_t);
}

/* Grid: clusters of S blocks (S = gridDim's cluster size), cluster c the
 * output tile (c % column tiles, c / column tiles), block rank r its
 * chunk-groups r per .. r per + per - 1. */
__global__ void __launch_bounds__(kThreads) split_kernel(SplitArgs a)
{
#if BN_HAS_CLUSTERS
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ unsigned long long bar;
    unsigned rank = 0, ranks = 1;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(ranks));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t col_tiles = (a.tiles + kTiles - 1) / kTiles;
    const int64_t c = blockIdx.x / ranks;
    const int64_t t0 = (c % col_tiles) * kTiles, r0 = (c / col_tiles) * kRowsA;
    const int ntl = a.tiles - t0 < kTiles ? (int)(a.tiles - t0) : kTiles;
    const int rows = a.m - r0 < kRowsA ? (int)(a.m - r0) : kRowsA;
    const int64_t g0 = (int64_t)rank * a.per;
    const int ng = a.groups - g0 < 0 ? 0 : a.groups - g0 < a.per ? (int)(a.groups - g0) : a.per;
    int8_t *acts = reinterpret_cast<int8_t *>(smem);
    const uint32_t *wts = reinterpret_cast<const uint32_t *>(smem + wts_offset());

    if (threadIdx.x == 0)
        bulk_bar_init(&bar);
    /* Rows past m are never copied: zeros, once. */
    for (int i = threadIdx.x; i < (kRowsA - rows) * (int)(act_stride() / 16); i += kThreads)
        reinterpret_cast<int4 *>(acts + rows * act_stride())[i] = make_int4(0, 0, 0, 0);
    const int rg0 = ng < kRound ? ng : kRound;
    if (threadIdx.x == 0 && ng > 0)
        bar_expect(&bar, (unsigned)(rg0 * (ntl * kGemvBlockBytes + rows * kGemvGroup)));
    __syncthreads();

    /* Round j0's copies, thread t the weights of tile t and the row t
     * (all counted on the barrier's phase armed above). */
    auto issue_weights = [&](int j0, int rg) {
        const int t = threadIdx.x;
        if (t < ntl)
            bulk_issue(smem + wts_offset() + (int64_t)t * kRound * kGemvBlockBytes,
                       a.w + ((t0 + t) * a.groups + g0 + j0) * kGemvBlockBytes,
                       (unsigned)(rg * kGemvBlockBytes), &bar);
    };
    auto issue_rows = [&](int j0, int rg) {
        const int r = threadIdx.x;
        if (r < rows)
            bulk_issue(acts + r * act_stride(), a.x + (r0 + r) * a.ldx + (g0 + j0) * kGemvGroup,
                       (unsigned)(rg * kGemvGroup), &bar);
    };
    if (ng > 0)
        issue_weights(0, rg0);
    pdl_wait();
    if (ng > 0)
        issue_rows(0, rg0);

    /* Warp (half, quad): fragments 2 half, 2 half + 1 (rows 32 half ..) of
     * tiles 4 quad .. 4 quad + 3. */
    const int half = warp >> 2, quad = warp & 3;
    int32_t acc[2][4][4];
#pragma unroll
    for (int f = 0; f < 2; f++)
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[f][t][e] = 0;
    bool live[4];
#pragma unroll
    for (int t = 0; t < 4; t++)
        live[t] = 4 * quad + t < ntl;
    const bool rows_here = 32 * half < rows;
    const bool frag1 = 32 * half + 16 < rows;
    unsigned phase = 0;
    for (int j0 = 0; j0 < ng; j0 += kRound) {
        const int rg = ng - j0 < kRound ? ng - j0 : kRound;
        if (j0 > 0) {
            /* The warps' reads of the last round before these copies. */
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            if (threadIdx.x == 0)
                bar_expect(&bar, (unsigned)(rg * (ntl * kGemvBlockBytes + rows * kGemvGroup)));
            __syncthreads();
            issue_weights(j0, rg);
            issue_rows(j0, rg);
        }
        bulk_wait_parity(&bar, phase);
        phase ^= 1u;
        if (rows_here)
            for (int j = 0; j < rg; j++) {
                /* Word tig of entry (u, gid) of the warp's four tiles. */
                const uint32_t *w0 = wts + ((4 * quad) * kRound + j) * kGroupWords + gid * 4 + tig;
                const int8_t *xr =
                    acts + (32 * half + gid) * act_stride() + j * kGemvGroup + 16 * tig;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    uint32_t b[4];
#pragma unroll
                    for (int t = 0; t < 4; t++)
                        b[t] = live[t] ? w0[t * kRound * kGroupWords + u * 32] : 0u;
#pragma unroll
                    for (int f = 0; f < 2; f++) {
                        if (f == 1 && !frag1)
                            break;
                        const int8_t *xf = xr + 16 * f * act_stride() + 64 * u;
                        const uint4 lo = *reinterpret_cast<const uint4 *>(xf);
                        const uint4 hi = *reinterpret_cast<const uint4 *>(xf + 8 * act_stride());
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const uint32_t af[4] = {h ? lo.z : lo.x, h ? hi.z : hi.x,
                                                    h ? lo.w : lo.y, h ? hi.w : hi.y};
#pragma unroll
                            for (int t = 0; t < 4; t++) {
                                const uint32_t bf[2] = {(b[t] >> (4 * h)) & 0x03030303u,
                                                        (b[t] >> (4 * h + 2)) & 0x03030303u};
                                w2a8_mma_s8(acc[f][t], af, bf);
                            }
                        }
                    }
                }
            }
        __syncthreads(); /* every warp is done with the round's stage */
    }

    /* The block's sums into shared memory (over the stage): c0, c1 row gid,
     * weight rows 2 tig, 2 tig + 1 of the tile; c2, c3 row gid + 8. */
    int32_t *part = reinterpret_cast<int32_t *>(smem);
#pragma unroll
    for (int f = 0; f < 2; f++)
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 32 * half + 16 * f + gid + 8 * (e >> 1);
                const int col = (4 * quad + t) * kGemvTileRows + 2 * tig + (e & 1);
                part[r * kRowsW + col] = acc[f][t][e];
            }
    cluster_sync_all();
    /* Each block the epilogue of every S-th output, the blocks' sums loaded
     * from their shared memory together, then added (integer sums: any
     * order is exact). */
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int32_t *peer[kMaxSplit];
#pragma unroll
    for (int s2 = 0; s2 < kMaxSplit; s2++)
        peer[s2] = s2 < (int)ranks ? cluster.map_shared_rank(part, (unsigned)s2) : part;
    for (int o = (int)rank * kThreads + threadIdx.x; o < rows * kRowsW;
         o += kThreads * (int)ranks) {
        const int r = o / kRowsW, col = o % kRowsW;
        const int64_t out = t0 * kGemvTileRows + col;
        if (out >= a.n)
            continue;
        int32_t v[kMaxSplit];
#pragma unroll
        for (int s2 = 0; s2 < kMaxSplit; s2++)
            v[s2] = s2 < (int)ranks ? peer[s2][o] : 0;
        int32_t total = 0;
#pragma unroll
        for (int s2 = 0; s2 < kMaxSplit; s2++)
            total += v[s2];
        const int64_t row = r0 + r;
        a.y[row * a.ldy + out] =
            w2a8_epilogue(total - __ldcg(a.act_sum + row), __ldcg(a.act_scale + row), a.w_scale);
    }
    /* No block leaves while another may still read its sums. */
    cluster_sync_all();
#else
    (void)a;
    __trap(); /* the launcher declines where this code was not compiled */
#endif
}

} // namespace

extern "C" cudaError_t bn_w2a8_cuda_gemm_split(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    if (a->m <= 0 || a->n <= 0)
        return cudaSuccess;
    if ((a->ldx & 15) != 0 || (reinterpret_cast<uintptr_t>(a->x) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(a->weights) & 15) != 0)
        return cudaErrorMisalignedAddress;
    if (!clusters_usable(split_kernel))
        return cudaErrorNotSupported;
    const int64_t col_tiles = (a->tiles + kTiles - 1) / kTiles;
    const int64_t tiles = col_tiles * ((a->m + kRowsA - 1) / kRowsA);
    /* Splits: as many as keep one cluster a tile within the SMs, at most
     * kMaxSplit and the chunk-groups. */
    const int sms = a->sm_count > 0 ? a->sm_count : 132;
    int64_t split = sms / tiles;
    if (split > kMaxSplit)
        split = kMaxSplit;
    if (split > a->groups)
        split = a->groups;
    if (split < 1)
        split = 1;
    const int64_t per = (a->groups + split - 1) / split;
    split = (a->groups + per - 1) / per; /* no block without chunk-groups */
    SplitArgs s;
    s.w = static_cast<const uint8_t *>(a->weights);
    s.n = a->n;
    s.tiles = a->tiles;
    s.groups = a->groups;
    s.w_scale = a->weight_scale;
    s.x = a->x;
    s.ldx = a->ldx;
    s.m = a->m;
    s.act_scale = a->act_scale;
    s.act_sum = a->act_sum;
    s.y = a->y;
    s.ldy = a->ldy;
    s.per = (int)per;
    if (tiles * split > 0x7fffffff)
        return cudaErrorInvalidConfiguration;
    const cudaError_t rc = allow_dynamic_smem(split_kernel, split_smem());
    if (rc != cudaSuccess)
        return rc;
    static const bool pdl_ok = pdl_compiled(split_kernel);
    return pdl_launch_clustered(split_kernel, dim3((unsigned)(tiles * split)), dim3(kThreads),
                                split_smem(), dim3((unsigned)split, 1, 1), stream, a->pdl && pdl_ok,
                                s);
}
