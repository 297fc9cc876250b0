/*
 * w2a8_gemm_sums.cu - the W2A8 product of 49 to 64 activation rows as
 * int32 sums added into an accumulator (bn_w2a8_cuda_gemm_add_sums): the
 * batched pass's down product, whose epilogue the norm kernel after it
 * applies as it reads the sums (bn_cb_add_sums_norm_quantize).
 *
 * At 64 rows the mma-rows kernel lets every 16-row block read its rows
 * again from L2 for every 16 weight rows; here a block owns 128 weight
 * rows (8 warps of 2 tiles) and all the rows over a split of K, so each
 * row byte crosses from L2 once a block:
 *
 *   weights   every weight word of the block's split into registers at the
 *             start, before the PDL wait (they depend on nothing before)
 *   rows      the split's activation rows copied into shared memory by
 *             cp.async, a commit group a chunk-group, so the products of
 *             chunk-group j start once j is in; rows kStride bytes apart
 *             (64 mod 128: a quarter warp's 16-byte loads, rows gid and
 *             gid + 1, fall in distinct banks)
 *   products  mma m16n8k32 with two tiles' weights as A (their 2-bit
 *             fields masked straight into place) and 8 rows as B, so one
 *             16-byte load holds both steps' B fragments of a quarter as
 *             register pairs (the k order is mma rows': lane (gid, tig)
 *             takes k = 64 u + 16 tig + 8 h + 0..7 of step (u, h))
 *   sums      the block's int32 sums through shared memory to bulk adds in
 *             L2 (cp.reduce.async.bulk .add.s32), a row of 128 a copy:
 *             the K splits meet in the accumulator with no barrier between
 *             blocks, exact in any order
 *
 * dev/cuda/w2a8_gemm_staged.cu has the forms this one was chosen among and
 * their H200 figures. sm_90 only (bulk adds): elsewhere, or for shapes it
 * does not take (bn_w2a8_cuda_gemm_add_sums_fits), nothing is launched.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cp_async.cuh"
#include "pdl.cuh"
#include "smem_opt_in.cuh"
#include "w2a8_cuda.h"
#include "w2a8_epilogue.cuh"
#include "w2a8_gemv.cuh"

namespace
{

constexpr int kTileRows = kGemvTileRows;
constexpr int kGroup = kGemvGroup;
constexpr int kWarps = 8, kTw = 2;              /* a warp: 2 tiles, 16 weight rows */
constexpr int kCols = kWarps * kTw * kTileRows; /* 128 weight rows a block          */
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = BN_W2A8_SUMS_MAX_ROWS; /* activation rows: 8 fragments of 8 */
constexpr int kMaxGroups = 8;         /* chunk-groups a split, at most     */
constexpr int kSumStride = kCols + 4; /* int32s between staged sum rows    */

template <int G> struct Shape {
    static constexpr int kStride = G * kGroup + 64;
    static constexpr size_t kRowBytes = (size_t)kRows * kStride;
    static constexpr size_t kSumBytes = (size_t)kRows * kSumStride * sizeof(int32_t);
    static constexpr size_t kSmem = kRowBytes > kSumBytes ? kRowBytes : kSumBytes;
};

/* Waits until at most n (0..7) of this thread's commit groups are in
 * flight (n known once the loop over the groups is unrolled). */
__device__ __forceinline__ void cp_async_wait_n(int n)
{
    switch (n) {
    case 0:
        cp_async_wait<0>();
        break;
    case 1:
        cp_async_wait<1>();
        break;
    case 2:
        cp_async_wait<2>();
        break;
    case 3:
        cp_async_wait<3>();
        break;
    case 4:
        cp_async_wait<4>();
        break;
    case 5:
        cp_async_wait<5>();
        break;
    case 6:
        cp_async_wait<6>();
        break;
    default:
        cp_async_wait<7>();
        break;
    }
}

struct SumsArgs {
    const uint32_t *w;
    int64_t n, groups, tiles;
    const int8_t *x;
    int64_t ldx, m;
    int32_t *sums;
    int64_t ld_sums;
    int splits, per;
};

/* Grid: columns x splits, block c * splits + s: weight rows 128 c .., the
 * split's chunk-groups s per ... */
template <int G> __global__ void __launch_bounds__(kThreads, 1) sums_kernel(SumsArgs a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int kStride = Shape<G>::kStride;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int split = (int)(blockIdx.x % (unsigned)a.splits);
    const int64_t column = blockIdx.x / (unsigned)a.splits;
    const int64_t col0 = column * kCols;
    const int64_t tile0 = col0 / kTileRows + (int64_t)warp * kTw;
    const int64_t g0 = (int64_t)split * a.per;
    const int count = (int)(a.groups - g0 < a.per ? a.groups - g0 : a.per); /* >= 1 */
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);

    /* Word tig of entry (u, gid) of tile t's chunk-group g: a warp's load
     * of a quarter reads its 128 bytes once. Zeros past the last tile and
     * the split's groups. */
    const uint32_t *words = a.w + tile0 * a.groups * (kGemvBlockBytes / 4) + gid * 4 + tig;
    uint32_t b[G][4][kTw];
#pragma unroll
    for (int q = 0; q < G; q++)
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int t = 0; t < kTw; t++) {
                uint32_t v = 0;
                if (q < count && tile0 + t < a.tiles)
                    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];"
                                 : "=r"(v)
                                 : "l"(words +
                                       ((int64_t)t * a.groups + g0 + q) * (kGemvBlockBytes / 4) +
                                       u * 32));
                b[q][u][t] = v;
            }
    pdl_wait();

    /* The split's rows, a commit group a chunk-group (rows past m: zeros). */
#pragma unroll
    for (int j = 0; j < G; j++) {
        if (j < count)
            for (int i = threadIdx.x; i < kRows * (kGroup / 16); i += kThreads) {
                const int r = i / (kGroup / 16), c = i % (kGroup / 16);
                const bool ok = r < a.m;
                cp_async16(sbase + (uint32_t)(r * kStride + j * kGroup + 16 * c),
                           ok ? a.x + r * a.ldx + (g0 + j) * kGroup + 16 * c : a.x, ok);
            }
        cp_async_commit();
    }

    /* acc[f][r]: weight rows gid (c0, c1) and gid + 8 (c2, c3) of tiles
     * 2f, 2f + 1 of the warp's pair; activation rows 8 r + 2 tig, + 1. */
    int32_t acc[kTw / 2][kRows / 8][4] = {};
    const uint8_t *row0 = smem + gid * kStride + 16 * tig;
#pragma unroll
    for (int j = 0; j < G; j++) {
        if (j >= count)
            break;
        cp_async_wait_n(G - 1 - j);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < 4; u++) {
            uint4 bv[kRows / 8];
#pragma unroll
            for (int r = 0; r < kRows / 8; r++)
                bv[r] = *reinterpret_cast<const uint4 *>(row0 + (8 * r) * kStride + j * kGroup +
                                                         64 * u);
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int f = 0; f < kTw / 2; f++) {
                    const uint32_t w0 = b[j][u][2 * f], w1 = b[j][u][2 * f + 1];
                    const uint32_t af[4] = {
                        (w0 >> (4 * h)) & 0x03030303u, (w1 >> (4 * h)) & 0x03030303u,
                        (w0 >> (4 * h + 2)) & 0x03030303u, (w1 >> (4 * h + 2)) & 0x03030303u};
#pragma unroll
                    for (int r = 0; r < kRows / 8; r++) {
                        const uint32_t bf[2] = {h ? bv[r].z : bv[r].x, h ? bv[r].w : bv[r].y};
                        w2a8_mma_s8(acc[f][r], af, bf);
                    }
                }
        }
    }

    /* The sums into shared memory (over the staged rows), then a bulk add
     * a row into the accumulator. */
    __syncthreads();
    int32_t *staged = reinterpret_cast<int32_t *>(smem);
#pragma unroll
    for (int f = 0; f < kTw / 2; f++)
#pragma unroll
        for (int r = 0; r < kRows / 8; r++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                staged[(8 * r + 2 * tig + (e & 1)) * kSumStride +
                       (warp * kTw + 2 * f + (e >> 1)) * kTileRows + gid] = acc[f][r][e];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const int rows = a.m < kRows ? (int)a.m : kRows;
    const int64_t left = a.n - col0;
    const int cols = left < kCols ? (int)left : kCols; /* n % 4 == 0: whole 16-byte runs */
    for (int r = threadIdx.x; r < rows; r += kThreads)
        asm volatile(
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s32 [%0], [%1], %2;" ::"l"(
                a.sums + r * a.ld_sums + col0),
            "r"(sbase + (uint32_t)(r * kSumStride * 4)), "r"(cols * 4)
            : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); /* the adds done */
#else
    (void)a;
    __trap(); /* the launcher declines where this code was not compiled */
#endif
}

/* The K split: as many blocks as fill the SMs once, each at most
 * kMaxGroups chunk-groups; 0 where the matrix takes more. */
int split_for(int64_t groups, int64_t n, int sm_count)
{
    const int64_t columns = (n + kCols - 1) / kCols;
    const int sms = sm_count > 0 ? sm_count : 132;
    int64_t splits = sms / columns;
    if (splits < 1)
        splits = 1;
    if (splits > groups)
        splits = groups;
    const int64_t per = (groups + splits - 1) / splits;
    return per <= kMaxGroups ? (int)splits : 0;
}

template <int G> cudaError_t launch_g(const SumsArgs &a, cudaStream_t stream, int pdl)
{
    const cudaError_t rc = allow_dynamic_smem(sums_kernel<G>, Shape<G>::kSmem);
    if (rc != cudaSuccess)
        return rc;
    const int64_t columns = (a.n + kCols - 1) / kCols;
    return pdl_launch(sums_kernel<G>, dim3((unsigned)(columns * a.splits)), dim3(kThreads),
                      Shape<G>::kSmem, stream, pdl, a);
}

} // namespace

extern "C" int bn_w2a8_cuda_gemm_add_sums_fits(int64_t m, int64_t n, int64_t groups, int sm_count)
{
    static const bool compiled = pdl_compiled(sums_kernel<1>);
    return compiled && m >= 49 && m <= kRows && n > 0 && n % 4 == 0 && groups > 0 &&
           split_for(groups, n, sm_count) > 0;
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_add_sums(const bn_w2a8_cuda_args *a, int32_t *sums,
                                                  int64_t ld_sums, cudaStream_t stream)
{
    if (!a || !sums)
        return cudaErrorInvalidValue;
    if (!bn_w2a8_cuda_gemm_add_sums_fits(a->m, a->n, a->groups, a->sm_count))
        return cudaErrorNotSupported;
    if (ld_sums < a->n || (ld_sums & 3) != 0 || (reinterpret_cast<uintptr_t>(sums) & 15) != 0)
        return cudaErrorInvalidValue;
    if ((a->ldx & 15) != 0 || (reinterpret_cast<uintptr_t>(a->x) & 15) != 0)
        return cudaErrorMisalignedAddress;
    SumsArgs s;
    s.w = static_cast<const uint32_t *>(a->weights);
    s.n = a->n;
    s.groups = a->groups;
    s.tiles = a->tiles;
    s.x = a->x;
    s.ldx = a->ldx;
    s.m = a->m;
    s.sums = sums;
    s.ld_sums = ld_sums;
    s.splits = split_for(a->groups, a->n, a->sm_count);
    s.per = (int)((a->groups + s.splits - 1) / s.splits);
    s.splits = (int)((a->groups + s.per - 1) / s.per); /* no split without groups */
    const int pdl = a->pdl; /* _fits above: the sm_90 code PDL needs is there */
    switch (s.per) {
    case 1:
        return launch_g<1>(s, stream, pdl);
    case 2:
        return launch_g<2>(s, stream, pdl);
    case 3:
        return launch_g<3>(s, stream, pdl);
    case 4:
        return launch_g<4>(s, stream, pdl);
    case 5:
        return launch_g<5>(s, stream, pdl);
    case 6:
        return launch_g<6>(s, stream, pdl);
    case 7:
        return launch_g<7>(s, stream, pdl);
    default:
        return launch_g<8>(s, stream, pdl);
    }
}
