/*
 * w2a8_gemm_staged.cu - lab: the W2A8 GEMM for 17 to 64 activation rows
 * (the batched decode pass) with the activation rows staged once a block
 * in shared memory and K split over blocks that meet through global
 * memory, no thread-block clusters; timed beside the shipped mma-rows
 * kernel (src/cuda/w2a8_gemm_rows.cu, linked in) in the same run.
 *
 * At 64 rows the mma-rows kernel makes every 16-row block of every 16
 * weight rows read its activation rows from L2 again: for 2560 x 6912 some
 * 70 MB of activation reads against 4.4 MB of weights. Here a block owns
 * COLS = WARPS x TW x 8 weight rows and all M rows over its split's
 * chunk-groups:
 *
 *   staging   its activation rows of the split, copied by cp.async (16
 *             bytes a copy, one commit group a chunk-group, so the products
 *             of group j start once j is in) into rows kStride bytes apart
 *             (kStride = 64 mod 128: the lds.128 of a quarter warp, rows
 *             gid and gid + 1, fall in distinct banks)
 *   products  each warp loads all its TW tiles' weight words of the split
 *             into registers at the start (every load in flight at once,
 *             before the PDL wait) and multiplies them with the staged
 *             rows on the tensor cores (mma m16n8k32, mma rows' k order):
 *             form 1 the rows as A (16 rows a fragment) and a tile as B,
 *             as mma rows does, which costs ~4 register moves an mma (A's
 *             four registers come from two loads); form 2 two tiles as A
 *             (their 2-bit fields masked straight into place) and 8 rows
 *             as B, one lds.128 holding both steps' B fragments of a
 *             quarter as register pairs
 *   splits    S > 1, LAB_REDUCE=1: each block writes its int32 sums to a
 *             workspace, adds one to its column's ticket and waits until
 *             the column's S blocks have (the grid never exceeds the
 *             blocks the device holds at once, so all are resident); block
 *             s then adds the S sums of its share of the column's outputs
 *             and writes them through the epilogue. LAB_REDUCE=2: each
 *             block's sums go through shared memory to bulk adds in L2
 *             (cp.reduce.async.bulk .add.s32) into an int32 accumulator,
 *             which a second kernel turns into y and zeroes (in the pass,
 *             the norm kernel that reads the product would). S = 1: the
 *             epilogue from registers.
 *
 * Integer sums: exact in any order, so every output equals the CPU's bit
 * for bit. Also timed: the tensor cores' mma m16n8k32 s8 rate with no
 * memory at all (the products' floor).
 *
 * usage: w2a8_gemm_staged [M] [NxK ...]   (M 64; default: the 2B-4T shapes)
 *        LAB_ONLY=form,tw,warps,splits: that configuration alone (for ncu)
 *        LAB_REDUCE=0|1|2: the splits' sums not added (timing the products
 *        alone), added through tickets (the default), or by bulk adds
 *        into an accumulator that a second kernel turns into y
 *        LAB_PDL=1: every call launched with programmatic dependent launch
 *        (the staged kernel's weights asked for before its wait, mma rows'
 *        first chunk-group), as the batched pass launches its products
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "cp_async.cuh"
#include "pdl.cuh"
#include "w2a8_cuda.h"
#include "mma_words.cuh"
#include "w2a8_gemv.cuh"

/* The mma-rows kernel's file also holds the q|k|v launcher, which asks
 * the kernel table, and the dp4a rows kernel, which asks the GEMV's split;
 * the lab takes neither path. */
extern "C" int bn_w2a8_cuda_gemv_split(int64_t, int64_t, int) { return 1; }
extern "C" bn_w2a8_kernel bn_w2a8_cuda_gemm_pick(int64_t, int64_t, int64_t, int, int, int)
{
    return BN_W2A8_MMA_ROWS_X2;
}
extern "C" int bn_w2a8_cuda_gemm_wgmma_usable(void) { return 0; }

namespace {

constexpr int kTileRows = kGemvTileRows;
constexpr int kGroup = kGemvGroup;
constexpr int kBlockBytes = kGemvBlockBytes;

/* ---- the tensor cores' rate ------------------------------------------- */

/* Each warp: 8 independent accumulators, `iters` rounds of 8 mma. */
__global__ void mma_rate_kernel(int iters, int32_t *out)
{
    int32_t acc[8][4] = {};
    uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x ^ 5u, 7u};
    uint32_t b[2] = {threadIdx.x * 11u, 13u};
    for (int i = 0; i < iters; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            w2a8_mma_s8(acc[j], a, b);
    int32_t s = 0;
#pragma unroll
    for (int j = 0; j < 8; j++)
        s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    if (s == 0x12345678)
        out[0] = s; /* keeps the products */
}

/* mma m16n8k32 a clock an SM, and int8 TOPS, at `warps` warps a block. */
void mma_rate(int sms, int warps)
{
    int32_t *out = nullptr;
    CUDA_CHECK(cudaMalloc((void **)&out, sizeof(int32_t)));
    const int iters = 4096;
    mma_rate_kernel<<<sms, 32 * warps>>>(iters, out);
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    CUDA_CHECK(cudaEventRecord(t0));
    mma_rate_kernel<<<sms, 32 * warps>>>(iters, out);
    CUDA_CHECK(cudaEventRecord(t1));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    int dev = 0, khz = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
    const double mmas = (double)sms * warps * iters * 8;
    const double per_sm_clk = mmas / sms / ((double)ms * 1e-3 * khz * 1e3);
    printf("mma m16n8k32 s8, %d warps a block, one block an SM: %.3f a clock an SM at %d MHz "
           "(%.0f TOPS)\n",
           warps, per_sm_clk, khz / 1000, mmas * 16 * 8 * 32 * 2 / ((double)ms * 1e-3) / 1e12);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(out);
}

/* ---- the staged GEMM ---------------------------------------------------- */

/* Waits until at most n (0..7) of this thread's commit groups are in
 * flight. */
__device__ __forceinline__ void cp_async_wait_n(int n)
{
    switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
    }
}

constexpr int kMaxSplits = 8;

/* Shared memory: the staged rows (kStride bytes apart), later (reduce
 * mode 2) the block's int32 sums, [64][kCols + 4]. */
template <int G, int kCols> struct StagedShape {
    static constexpr int kStride = G * kGroup + 64; /* 64 mod 128 */
    static constexpr int kSumStride = kCols + 4;
    static constexpr size_t kRows = (size_t)64 * kStride;
    static constexpr size_t kSums = (size_t)64 * kSumStride * sizeof(int32_t);
    static constexpr size_t kSmem = kRows > kSums ? kRows : kSums;
};

template <int FORM, int TW, int WARPS, int MB, int G>
__global__ void __launch_bounds__(32 * WARPS, 1)
    staged_kernel(const uint32_t *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                  int64_t m, int64_t n, int64_t groups, int64_t tiles, int splits, int per,
                  const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                  float w_scale, float *__restrict__ y, int64_t ldy, int32_t *__restrict__ ws,
                  unsigned *tickets, int reduce, int32_t *__restrict__ total, int64_t ldt)
{
    constexpr int kCols = WARPS * TW * kTileRows;
    using Shape = StagedShape<G, kCols>;
    constexpr int kStride = Shape::kStride;
    constexpr int kThreads = 32 * WARPS;
    extern __shared__ __align__(16) uint8_t smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int split = (int)(blockIdx.x % (unsigned)splits);
    const int64_t column = blockIdx.x / (unsigned)splits;
    const int64_t col0 = column * kCols;
    const int64_t tile0 = col0 / kTileRows + (int64_t)warp * TW;
    const int64_t g0 = (int64_t)split * per;
    const int count = (int)(groups - g0 < per ? groups - g0 : per); /* >= 1: see the launch */
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t *words = w + tile0 * groups * (kBlockBytes / 4) + gid * 4 + tig;

    /* Every weight word of the split, into registers at once (they depend
     * on nothing before; past the split's groups: no tiles, zeros). */
    uint32_t b[G][4][TW];
#pragma unroll
    for (int q = 0; q < G; q++)
        load_words<TW>(b[q], words, groups, g0 + q, tile0, q < count ? tiles : tile0);
    /* Launched with PDL (LAB_PDL), the kernel before may still run: the
     * weights are asked for before the wait, the activations after it;
     * the kernel after may launch now (its own weights do not wait). */
    pdl_trigger();
    pdl_wait();

    /* Rows 16 MB of the split's chunk-groups, a commit group each. */
#pragma unroll
    for (int j = 0; j < G; j++) {
        if (j < count)
            for (int i = threadIdx.x; i < 16 * MB * (kGroup / 16); i += kThreads) {
                const int r = i / (kGroup / 16), c = i % (kGroup / 16);
                const bool ok = r < m;
                cp_async16(sbase + (uint32_t)(r * kStride + j * kGroup + 16 * c),
                           ok ? x + r * ldx + (g0 + j) * kGroup + 16 * c : x, ok);
            }
        cp_async_commit();
    }

    /* Form 1: the activation rows as mma's A (16 rows a fragment), the
     * weights as B (a tile's 8 rows); form 2 the other way round: two
     * tiles' rows as A, 8 activation rows as B, so that one lds.128 holds
     * the B fragments of both steps of a quarter in register pairs. */
    constexpr int kAcc1 = FORM == 1 ? TW : 1, kRow1 = FORM == 1 ? MB : 1;
    constexpr int kAcc2 = FORM == 2 ? TW / 2 : 1, kRow2 = FORM == 2 ? 2 * MB : 1;
    int32_t acc[kAcc1][kRow1][4] = {};
    int32_t acc2[kAcc2][kRow2][4] = {};
    /* This lane's bytes 16 tig of row gid. */
    const uint8_t *arow = smem + gid * kStride + 16 * tig;
#pragma unroll
    for (int j = 0; j < G; j++) {
        if (j >= count)
            break;
        cp_async_wait_n(G - 1 - j);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if constexpr (FORM == 1) {
                uint4 a[MB][2];
#pragma unroll
                for (int i = 0; i < MB; i++) {
                    a[i][0] = *reinterpret_cast<const uint4 *>(arow + (16 * i) * kStride +
                                                               j * kGroup + 64 * u);
                    a[i][1] = *reinterpret_cast<const uint4 *>(arow + (16 * i + 8) * kStride +
                                                               j * kGroup + 64 * u);
                }
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int t = 0; t < TW; t++) {
                        const uint32_t bf[2] = {(b[j][u][t] >> (4 * h)) & 0x03030303u,
                                                (b[j][u][t] >> (4 * h + 2)) & 0x03030303u};
#pragma unroll
                        for (int i = 0; i < MB; i++) {
                            const uint32_t af[4] = {h ? a[i][0].z : a[i][0].x,
                                                    h ? a[i][1].z : a[i][1].x,
                                                    h ? a[i][0].w : a[i][0].y,
                                                    h ? a[i][1].w : a[i][1].y};
                            w2a8_mma_s8(acc[t][i], af, bf);
                        }
                    }
            } else {
                uint4 bv[2 * MB];
#pragma unroll
                for (int r = 0; r < 2 * MB; r++)
                    bv[r] = *reinterpret_cast<const uint4 *>(arow + (8 * r) * kStride +
                                                             j * kGroup + 64 * u);
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int f = 0; f < TW / 2; f++) {
                        const uint32_t w0 = b[j][u][2 * f], w1 = b[j][u][2 * f + 1];
                        const uint32_t af[4] = {(w0 >> (4 * h)) & 0x03030303u,
                                                (w1 >> (4 * h)) & 0x03030303u,
                                                (w0 >> (4 * h + 2)) & 0x03030303u,
                                                (w1 >> (4 * h + 2)) & 0x03030303u};
#pragma unroll
                        for (int r = 0; r < 2 * MB; r++) {
                            const uint32_t bf[2] = {h ? bv[r].z : bv[r].x, h ? bv[r].w : bv[r].y};
                            w2a8_mma_s8(acc2[f][r], af, bf);
                        }
                    }
            }
        }
    }

    /* Output e of this lane's fragment: (activation row, column of the
     * block's kCols). Form 1: c0, c1 row 16 i + gid, weight rows 2 tig,
     * 2 tig + 1 of tile t; c2, c3 row 16 i + gid + 8. Form 2: c0, c1
     * weight row gid of tile 2 f, activation rows 8 r + 2 tig, + 1; c2,
     * c3 the same of tile 2 f + 1. */
    auto each_output = [&](auto &&fn) {
        if constexpr (FORM == 1) {
#pragma unroll
            for (int t = 0; t < TW; t++)
#pragma unroll
                for (int i = 0; i < MB; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        fn(16 * i + gid + 8 * (e >> 1),
                           (warp * TW + t) * kTileRows + 2 * tig + (e & 1), acc[t][i][e]);
        } else {
#pragma unroll
            for (int f = 0; f < TW / 2; f++)
#pragma unroll
                for (int r = 0; r < 2 * MB; r++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        fn(8 * r + 2 * tig + (e & 1),
                           (warp * TW + 2 * f + (e >> 1)) * kTileRows + gid, acc2[f][r][e]);
        }
    };
    if (splits == 1) {
        each_output([&](int row, int c, int32_t v) {
            if (row < m && col0 + c < n)
                y[row * ldy + col0 + c] = w2a8_epilogue(v - act_sum[row], act_scale[row], w_scale);
        });
        return;
    }
    if (reduce == 2) {
        /* The block's sums into shared memory, then each row added to
         * `total` by the copy engine (cp.reduce.async.bulk .add.s32: the
         * adds happen in L2, exact in any order); a kernel after reads
         * total and zeroes it. */
        __syncthreads(); /* every warp is done with the staged rows */
        int32_t *sums = reinterpret_cast<int32_t *>(smem);
        each_output([&](int row, int c, int32_t v) { sums[row * Shape::kSumStride + c] = v; });
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        const int rows = m < 16 * MB ? (int)m : 16 * MB;
        const int64_t left = n - col0;
        const int cols = left < kCols ? (int)((left + 3) & ~3) : kCols;
        for (int r = threadIdx.x; r < rows; r += kThreads)
            asm volatile(
                "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.s32 [%0], [%1], %2;" ::"l"(
                    total + r * ldt + col0),
                "r"(sbase + (uint32_t)(r * Shape::kSumStride * 4)), "r"(cols * 4)
                : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); /* the adds done */
        return;
    }
    /* ws: [column][split][16 MB rows][kCols]. */
    int32_t *mine = ws + (column * splits + split) * (16 * MB * kCols);
    each_output([&](int row, int c, int32_t v) { __stcg(mine + row * kCols + c, v); });
    if (!reduce)
        return; /* timing the products alone: the outputs are not written */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned ticket = atomicAdd(tickets + column, 1u);
        const unsigned target = (ticket / (unsigned)splits + 1u) * (unsigned)splits;
        unsigned now;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(tickets + column));
        } while ((int)(now - target) < 0);
    }
    __syncthreads(); /* the column's S sums are all in the workspace */
    /* This block's share of the column's outputs, 4 a thread. */
    const int rows = m < 16 * MB ? (int)m : 16 * MB;
    const int quads = rows * kCols / 4;
    const int share = (quads + splits - 1) / splits;
    const int q0 = split * share, q1 = q0 + share < quads ? q0 + share : quads;
    const int32_t *all = ws + column * splits * (16 * MB * kCols);
    for (int q = q0 + (int)threadIdx.x; q < q1; q += kThreads) {
        int4 p[kMaxSplits];
#pragma unroll
        for (int s = 0; s < kMaxSplits; s++) /* every load in flight at once */
            p[s] = s < splits
                       ? __ldcg(reinterpret_cast<const int4 *>(all + s * (16 * MB * kCols)) + q)
                       : make_int4(0, 0, 0, 0);
        int4 v = make_int4(0, 0, 0, 0);
#pragma unroll
        for (int s = 0; s < kMaxSplits; s++) {
            v.x += p[s].x;
            v.y += p[s].y;
            v.z += p[s].z;
            v.w += p[s].w;
        }
        const int row = 4 * q / kCols, c = 4 * q % kCols;
        const int sv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (col0 + c + e < n)
                y[(int64_t)row * ldy + col0 + c + e] =
                    w2a8_epilogue(sv[e] - act_sum[row], act_scale[row], w_scale);
    }
}

struct Config {
    int form, tw, warps, splits;
};

/* Reduce mode 2's end: y from the added sums, which it zeroes for the
 * next call (in the pass, the kernel that reads the product would). */
__global__ void finish_kernel(int32_t *total, int64_t ldt, int64_t n,
                              const float *__restrict__ act_scale,
                              const int32_t *__restrict__ act_sum, float w_scale, float *y,
                              int64_t ldy)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= ((n + 3) & ~3)) /* the adds cover whole 16-byte runs: zero those too */
        return;
    const int32_t v = __ldcg(total + r * ldt + c);
    total[r * ldt + c] = 0;
    if (c < n)
        y[r * ldy + c] = w2a8_epilogue(v - act_sum[r], act_scale[r], w_scale);
}

unsigned *g_tickets = nullptr; /* one a column, zeroed once */
int32_t *g_ws = nullptr;
size_t g_ws_bytes = 0;
/* How the splits' sums meet (LAB_REDUCE): 0 not at all (timing the
 * products alone), 1 the tickets, 2 bulk adds into g_total, then
 * finish_kernel (g_finish; 0: the products and adds alone). */
int g_reduce = 1;
int g_finish = 1;
int g_pdl = 0; /* LAB_PDL=1: every call launched with programmatic dependent launch */
int32_t *g_total = nullptr;
int64_t g_ldt = 0;

template <int FORM, int TW, int WARPS, int MB, int G>
cudaError_t launch_t(const w2a8_args *a, int splits, cudaStream_t stream)
{
    auto kernel = staged_kernel<FORM, TW, WARPS, MB, G>;
    constexpr int kCols = WARPS * TW * kTileRows;
    const size_t smem = StagedShape<G, kCols>::kSmem;
    cudaError_t rc =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (rc != cudaSuccess)
        return rc;
    const int per = (int)((a->groups + splits - 1) / splits);
    splits = (int)((a->groups + per - 1) / per); /* no split without groups */
    const int64_t columns = (a->n + kCols - 1) / kCols;
    int resident = 0;
    rc = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, 32 * WARPS, smem);
    if (rc != cudaSuccess)
        return rc;
    if (splits > 1 && g_reduce == 1 && columns * splits > (int64_t)resident * a->sm_count)
        return cudaErrorCooperativeLaunchTooLarge; /* the ticket wait needs every block resident */
    if ((size_t)(columns * splits * 16 * MB * kCols) * sizeof(int32_t) > g_ws_bytes)
        return cudaErrorMemoryAllocation;
    rc = pdl_launch(kernel, dim3((unsigned)(columns * splits)), dim3(32 * WARPS), smem, stream,
                    g_pdl, static_cast<const uint32_t *>(a->weights), a->x, a->ldx, a->m, a->n,
                    a->groups, a->tiles, splits, per, a->act_scale, a->act_sum, a->weight_scale,
                    a->y, a->ldy, g_ws, g_tickets, splits > 1 ? g_reduce : 1, g_total, g_ldt);
    if (rc != cudaSuccess)
        return rc;
    if (splits > 1 && g_reduce == 2 && g_finish)
        finish_kernel<<<dim3((unsigned)((a->n + 3 + 255) / 256), (unsigned)a->m), 256, 0, stream>>>(
            g_total, g_ldt, a->n, a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy);
    return cudaGetLastError();
}

template <int FORM, int TW, int WARPS, int MB>
cudaError_t launch_g(const w2a8_args *a, int splits, cudaStream_t stream)
{
    switch ((a->groups + splits - 1) / splits) {
    case 1: return launch_t<FORM, TW, WARPS, MB, 1>(a, splits, stream);
    case 2: return launch_t<FORM, TW, WARPS, MB, 2>(a, splits, stream);
    case 3: return launch_t<FORM, TW, WARPS, MB, 3>(a, splits, stream);
    case 4: return launch_t<FORM, TW, WARPS, MB, 4>(a, splits, stream);
    case 5: return launch_t<FORM, TW, WARPS, MB, 5>(a, splits, stream);
    case 6: return launch_t<FORM, TW, WARPS, MB, 6>(a, splits, stream);
    case 7: return launch_t<FORM, TW, WARPS, MB, 7>(a, splits, stream);
    case 8: return launch_t<FORM, TW, WARPS, MB, 8>(a, splits, stream);
    default: return cudaErrorInvalidValue;
    }
}

template <int FORM, int TW, int WARPS>
cudaError_t launch_mb(const w2a8_args *a, int splits, cudaStream_t stream)
{
    switch ((a->m + 15) / 16) {
    case 1: return launch_g<FORM, TW, WARPS, 1>(a, splits, stream);
    case 2: return launch_g<FORM, TW, WARPS, 2>(a, splits, stream);
    case 3: return launch_g<FORM, TW, WARPS, 3>(a, splits, stream);
    case 4: return launch_g<FORM, TW, WARPS, 4>(a, splits, stream);
    default: return cudaErrorInvalidValue;
    }
}

bool runnable(const Config &c, int64_t groups)
{
    const int64_t g = (groups + c.splits - 1) / c.splits;
    return c.splits <= groups && c.splits <= kMaxSplits && g <= 8 && g * c.tw <= 24;
}

cudaError_t run(const Config &c, const w2a8_args *a, cudaStream_t stream)
{
    if (c.splits < 1 || !runnable(c, a->groups))
        return cudaErrorInvalidValue;
#define LAB_FORM(F, T, W)                                                                  \
    if (c.form == F && c.tw == T && c.warps == W)                                          \
        return launch_mb<F, T, W>(a, c.splits, stream);
    LAB_FORM(1, 2, 4)
    LAB_FORM(1, 2, 8)
    LAB_FORM(1, 4, 4)
    LAB_FORM(2, 2, 4)
    LAB_FORM(2, 2, 8)
    LAB_FORM(2, 4, 4)
    LAB_FORM(2, 4, 8)
#undef LAB_FORM
    return cudaErrorInvalidValue;
}

std::vector<Config> configs = {
    {1, 2, 4, 6}, {1, 2, 8, 6}, {1, 4, 4, 6}, {2, 2, 4, 2}, {2, 2, 4, 3}, {2, 2, 4, 4},
    {2, 2, 4, 6}, {2, 2, 8, 2}, {2, 2, 8, 3}, {2, 2, 8, 4}, {2, 2, 8, 6}, {2, 2, 8, 7},
    {2, 4, 4, 2}, {2, 4, 4, 3}, {2, 4, 4, 4}, {2, 4, 4, 6}, {2, 4, 4, 7}, {2, 4, 8, 4},
    {2, 4, 8, 6}, {2, 4, 8, 8},
};

/* The shipped mma-rows kernel (TW 2 or 4) on the lab's problem. */
cudaError_t run_mma_rows(const w2a8_args *l, int tw, int pdl, cudaStream_t stream)
{
    bn_w2a8_cuda_args a = {};
    a.weights = l->weights;
    a.n = l->n;
    a.tiles = l->tiles;
    a.groups = l->groups;
    a.weight_scale = l->weight_scale;
    a.x = l->x;
    a.m = l->m;
    a.ldx = l->ldx;
    a.act_scale = l->act_scale;
    a.act_sum = l->act_sum;
    a.y = l->y;
    a.ldy = l->ldy;
    a.sm_count = l->sm_count;
    a.pdl = pdl;
    return bn_w2a8_cuda_gemm_mma_rows(&a, tw, stream);
}

bool check_config(Problem &p, const Config &c, int sms)
{
    if (!runnable(c, p.l.groups))
        return true;
    char what[96];
    snprintf(what, sizeof what, "%lldx%lld M %lld form %d tw %d warps %d splits %d",
             (long long)p.l.n, (long long)p.l.k, (long long)p.m, c.form, c.tw, c.warps, c.splits);
    poison(p);
    CUDA_CHECK(cudaMemset(g_tickets, 0, 65536 * sizeof(unsigned))); /* the ticket counts from 0 */
    const w2a8_args a = p.args(sms);
    const cudaError_t rc = run(c, &a, 0);
    if (!g_reduce) { /* LAB_REDUCE=0: nothing written to check */
        CUDA_CHECK(cudaDeviceSynchronize());
        (void)cudaGetLastError();
        return true;
    }
    if (rc == cudaErrorCooperativeLaunchTooLarge) {
        (void)cudaGetLastError();
        return true; /* more blocks than the device holds at once: not timed */
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
    static const int64_t k2b4t[][2] = {{3840, 2560}, {2560, 2560}, {13824, 2560}, {2560, 6912}};
    lab_shape_list shapes;
    if (!lab_shapes(argc, argv, 2, &shapes, k2b4t, 4))
        return 2;
    const int sms = device_sms();
    if (const char *only = getenv("LAB_ONLY")) {
        Config c = {};
        if (sscanf(only, "%d,%d,%d,%d", &c.form, &c.tw, &c.warps, &c.splits) != 4) {
            fprintf(stderr, "%s: LAB_ONLY must be form,tw,warps,splits\n", argv[0]);
            return 2;
        }
        configs.assign(1, c);
    }
    if (getenv("LAB_PDL"))
        g_pdl = atoi(getenv("LAB_PDL")) != 0;
    if (const char *rm = getenv("LAB_REDUCE"))
        g_reduce = atoi(rm);
    if (g_reduce < 0 || g_reduce > 2) {
        fprintf(stderr, "%s: LAB_REDUCE must be 0, 1 or 2\n", argv[0]);
        return 2;
    }
    if (g_pdl && g_reduce == 1) {
        /* A grid launched early could hold the SMs the ticket wait needs. */
        fprintf(stderr, "%s: LAB_PDL takes LAB_REDUCE 0 or 2\n", argv[0]);
        return 2;
    }
    g_ldt = 16384;
    CUDA_CHECK(cudaMalloc((void **)&g_total, (size_t)64 * g_ldt * sizeof(int32_t)));
    CUDA_CHECK(cudaMemset(g_total, 0, (size_t)64 * g_ldt * sizeof(int32_t)));
    g_ws_bytes = (size_t)64 << 20;
    CUDA_CHECK(cudaMalloc((void **)&g_ws, g_ws_bytes));
    CUDA_CHECK(cudaMalloc((void **)&g_tickets, 65536 * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(g_tickets, 0, 65536 * sizeof(unsigned)));

    if (!getenv("LAB_ONLY")) {
        mma_rate(sms, 4);
        mma_rate(sms, 8);
        mma_rate(sms, 16);
    }

    bool ok = true;
    for (int i = 0; i < 8; i++) { /* ragged shapes and row counts */
        Problem p = make_problem(lab_rand_range(1, 900), lab_rand_range(1, 2040),
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
    if (!g_reduce)
        ok = true; /* LAB_REDUCE=0: the outputs are not written, nothing to check */
    printf("check: %s\n\n", !g_reduce ? "skipped (LAB_REDUCE=0)"
                            : ok        ? "every configuration bit for bit the CPU's"
                                        : "FAILED");

    const double copy = copy_gbs();
    printf("copy bandwidth %.0f GB/s (read + write); %d SMs; M = %lld; reduce mode %d; %s\n\n",
           copy, sms, (long long)m, g_reduce, g_pdl ? "PDL-chained" : "plain launches");
    printf("| N x K | kernel | tiles a warp | warps | splits | blocks | us |\n"
           "|---|---|---|---|---|---|---|\n");
    for (const auto &s : shapes) {
        Problem p = make_problem(s.first, s.second, m);
        make_copies(p);
        const w2a8_args base = p.args(sms);
        for (int tw = 2; tw <= 4; tw += 2) {
            const double us = time_calls([&](int i, cudaStream_t st) {
                w2a8_args a = base;
                a.weights = p.copies[(size_t)i % p.copies.size()];
                return run_mma_rows(&a, tw, g_pdl, st);
            });
            printf("| %lldx%lld | mma rows (shipped) | %d | | | | %.2f |\n", (long long)s.first,
                   (long long)s.second, tw, us);
        }
        double best = 1e30;
        Config best_c = {};
        for (const Config &c : configs) {
            if (!runnable(c, p.l.groups))
                continue;
            CUDA_CHECK(cudaMemset(g_tickets, 0, 65536 * sizeof(unsigned)));
            const double us = time_calls([&](int i, cudaStream_t st) {
                w2a8_args a = base;
                a.weights = p.copies[(size_t)i % p.copies.size()];
                return run(c, &a, st);
            });
            if (us < 0)
                continue;
            /* Mode 2: also without the finishing kernel. */
            double bare = -1.0;
            if (g_reduce == 2 && c.splits > 1) {
                g_finish = 0;
                bare = time_calls([&](int i, cudaStream_t st) {
                    w2a8_args a = base;
                    a.weights = p.copies[(size_t)i % p.copies.size()];
                    return run(c, &a, st);
                });
                g_finish = 1;
                CUDA_CHECK(cudaMemset(g_total, 0, (size_t)64 * g_ldt * sizeof(int32_t)));
            }
            const int64_t cols = c.warps * c.tw * kTileRows;
            printf("| %lldx%lld | staged form %d | %d | %d | %d | %lld | %.2f |",
                   (long long)s.first, (long long)s.second, c.form, c.tw, c.warps, c.splits,
                   (long long)((p.l.n + cols - 1) / cols * c.splits), us);
            if (bare > 0)
                printf(" %.2f without the finishing kernel |", bare);
            printf("\n");
            if (us < best) {
                best = us;
                best_c = c;
            }
        }
        printf("| %lldx%lld | best staged: form %d tw %d warps %d splits %d | | | | | %.2f |\n",
               (long long)s.first, (long long)s.second, best_c.form, best_c.tw, best_c.warps,
               best_c.splits, best);
        free_problem(p);
    }
    cudaFree(g_ws);
    cudaFree(g_tickets);
    cudaFree(g_total);
    return ok ? 0 : 1;
}
