/*
 * w2a8_gemm_wgmma.cu - the W2A8 GEMM for prefill-sized M on Hopper: the
 * warp-specialized, persistent wgmma kernel (its pieces and how it works:
 * w2a8_wgmma.cuh) in the configurations the kernel table of w2a8_select.c
 * picks (weight rows x activation rows a tile):
 *
 *   BN_W2A8_WGMMA_128X128          two consumer warpgroups, 8 stages of
 *                                  20 KB, the epilogue staged through
 *                                  shared memory (store_warp_staged)
 *   BN_W2A8_WGMMA_192X128          three consumer warpgroups, the issuer a
 *                                  whole warpgroup (setmaxnreg), 22 KB
 *   BN_W2A8_WGMMA_256X128          two consumers of two 64-row slices each,
 *                                  two wgmma groups a k-tile, 24 KB
 *   BN_W2A8_WGMMA_192X64           as 192X128 with 64 activation rows
 *                                  (wgmma n = 64), two groups in flight
 *   ..._STREAMK (128X128, 192X128) the k-tiles of all output tiles shared
 *                                  evenly by the blocks (a->streamk)
 *   BN_W2A8_WGMMA_192X64_SPLIT2/4  each tile's k-tiles shared by a cluster
 *                                  of 2 / 4 blocks, their sums added
 *                                  through distributed shared memory
 *
 * Build: wgmma needs sm_90a code. CMake compiles this file alone for
 * compute_90a/sm_90a when 90 is among the architectures (and defines
 * BN_W2A8_WGMMA_SM90A); elsewhere the kernel body is empty and the launcher
 * answers cudaErrorNotSupported, as it does on any device other than 9.0
 * and where the driver cannot encode tensor maps, so callers fall back.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "w2a8_cuda.h"
#include "w2a8_wgmma.cuh"

#ifndef BN_W2A8_WGMMA_SM90A
#define BN_W2A8_WGMMA_SM90A 0
#endif

namespace bn_wgmma {
namespace {

/* PDL: launched with programmatic stream serialization (an instantiation
 * of its own: one kernel testing a run-time flag compiled to different
 * code and ran 0.55 us slower at 2560 x 2560). SPLIT > 1: launched in
 * clusters of SPLIT blocks, each cluster one output tile whose k-tiles its
 * blocks share, the sums added through distributed shared memory
 * (split_reduce) and stored by the cluster's block 0. */
template <int STAGES, int CW, int MI, int BA, bool PDL, int SPLIT = 1>
__global__ void __launch_bounds__(CfgWS<STAGES, CW, MI, BA>::kThreads, 1)
    wgmma_ws_kernel(int64_t m, int64_t n, int64_t tiles, int64_t groups, int64_t m_blocks,
                    int64_t n_tiles, const float *__restrict__ act_scale,
                    const int32_t *__restrict__ act_sum, float w_scale, float *__restrict__ y,
                    int64_t ldy, int32_t *__restrict__ streamk,
                    const __grid_constant__ CUtensorMap act_map,
                    const __grid_constant__ CUtensorMap w_map)
{
#if BN_WGMMA_DEVICE
    using C = CfgWS<STAGES, CW, MI, BA>;
    constexpr int S = STAGES;
    constexpr int BK = C::kBK;
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t empty_bar[S], copied_bar[S];
    /* The epilogue's scales and sums of a segment's tile, copied while its
     * k-tiles run (two buffers: segments alternate). */
    __shared__ __align__(16) float tile_scale[2][C::kBA];
    __shared__ __align__(16) int32_t tile_sum[2][C::kBA];
    __shared__ int last_segment;
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sbase = (raw + 1023u) & ~1023u;
    uint8_t *const sptr = smem_raw + (sbase - raw);
    const uint32_t empty0 = (uint32_t)__cvta_generic_to_shared(empty_bar);
    const uint32_t copied0 = (uint32_t)__cvta_generic_to_shared(copied_bar);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n_kt = (int)(groups * (256 / BK));
    const int64_t b = blockIdx.x, grid = gridDim.x;
    auto tile_origin = [&](int64_t t, int64_t &m0, int64_t &tile0) {
        m0 = (t % m_blocks) * C::kBA;
        tile0 = (t / m_blocks) * (C::kBW / kTileRows);
    };

    if (tid == 0) {
        for (int st = 0; st < S; st++) {
            mbar_init(empty0 + 8 * st, C::kConsumers);
            mbar_init(copied0 + 8 * st, 1); /* one expect_tx arrival + the bytes */
        }
    }
    __syncthreads();
    if constexpr (PDL)
        pdl_trigger();

    static_assert(SPLIT == 1 || MI == 1, "split sums move one slice a warpgroup");
    static_assert(C::kAcc * 4 * C::kConsumers <= S * C::kStageBytes,
                  "a block's sums fit its idle stages");
    Segments segs(b, grid, n_tiles, n_kt, streamk != nullptr, SPLIT);
    int64_t tile;
    int kt0, kt1;

    if (warp >= C::kIssuerWarp) {
        /* ---- copy issuer ---- */
        if constexpr (C::kIssuerWarps == 4)
            setmaxnreg_dec<C::kIssuerRegs>();
        if (warp == C::kIssuerWarp && lane == 0) {
            /* Fetch both tensor maps while the consumers start up. */
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(&act_map) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(&w_map) : "memory");
            /* Stage and phase of k-tile g, advanced by one per k-tile. */
            int slot = 0;
            uint32_t phase = 0;
            bool reuse = false; /* the stage held an earlier k-tile */
            bool waited = !PDL;
            while (segs.take(tile, kt0, kt1)) {
                int64_t m0, tile0;
                tile_origin(tile, m0, tile0);
                int kt = kt0;
                if (PDL && !waited) {
                    /* The weights of the first segment's first kPdlEarly
                     * stages, before the wait for the activations' writer;
                     * more queue the first stage's activations behind
                     * them (H200, M = 512, 2560 x 2560 chained: 2 stages
                     * 10.57 us, 4 10.65, 8 10.91). */
                    const int pre = kt1 - kt0 < kPdlEarly ? kt1 - kt0 : kPdlEarly;
                    for (int st = 0; st < pre; st++) {
                        mbar_expect_tx(copied0 + 8 * st, C::kActBytes + C::kPackedBytes);
                        tma_load_2d(sbase + (uint32_t)(st * C::kStageBytes) + C::kActBytes,
                                    &w_map, (kt0 + st) * 2 * BK, (int)tile0, copied0 + 8 * st);
                    }
                    pdl_wait();
                    waited = true;
                    for (int st = 0; st < pre; st++)
                        tma_load_2d(sbase + (uint32_t)(st * C::kStageBytes), &act_map,
                                    (kt0 + st) * BK, (int)m0, copied0 + 8 * st);
                    kt = kt0 + pre;
                    slot = pre;
                }
                for (; kt < kt1; kt++) {
                    if (reuse)
                        mbar_wait(empty0 + 8 * slot, phase ^ 1u);
                    const uint32_t as = sbase + (uint32_t)(slot * C::kStageBytes);
                    mbar_expect_tx(copied0 + 8 * slot, C::kActBytes + C::kPackedBytes);
                    tma_load_2d(as, &act_map, kt * BK, (int)m0, copied0 + 8 * slot);
                    tma_load_2d(as + C::kActBytes, &w_map, kt * 2 * BK, (int)tile0,
                                copied0 + 8 * slot);
                    if (++slot == S) {
                        slot = 0;
                        phase ^= 1u;
                        reuse = true;
                    }
                }
            }
            if (!waited)
                pdl_wait(); /* no segment: still every thread waits (pdl.cuh) */
        } else if constexpr (PDL) {
            pdl_wait();
        }
        if constexpr (SPLIT > 1)
            split_sync_rounds<SPLIT>();
        return;
    }

    /* ---- consumer warpgroups ---- */
    if constexpr (C::kIssuerWarps == 4)
        setmaxnreg_inc<C::kConsumerRegs>();
    const int ctid = tid; /* 0 .. kConsumers - 1 */
    const int cg = warp >> 2, wq = warp & 3;
    const int gid = lane >> 2, tig = lane & 3;
    /* Stage of this k-tile and of the one and two before. */
    int slot = 0, prev = 0, prev2 = 0;
    uint32_t phase = 0;
    /* A segment's first wgmma overwrites the accumulators (accumulate 0). */
    int32_t acc[MI][C::kAcc];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int v = 0; v < C::kAcc; v++)
            acc[i][v] = 0;
    if constexpr (PDL)
        pdl_wait(); /* before the scales, sums, stream-K workspace and y */
    for (int seg = 0; segs.take(tile, kt0, kt1); seg++) {
        int64_t m0, tile0;
        tile_origin(tile, m0, tile0);
        /* The tile's scales (threads 0 .. BA - 1) and sums (BA .. 2 BA - 1), in flight
         * while the k-tiles run; rows past m read as zero and are not
         * stored. Buffer seg % 2 was last read in segment seg - 2's
         * epilogue, before segment seg - 1's closing barrier. */
        {
            const int r = ctid % C::kBA;
            const bool ok = m0 + r < m;
            if (ctid < C::kBA)
                cp_async<4>((uint32_t)__cvta_generic_to_shared(&tile_scale[seg & 1][r]),
                          act_scale + (ok ? m0 + r : 0), ok);
            else if (ctid < 2 * C::kBA)
                cp_async<4>((uint32_t)__cvta_generic_to_shared(&tile_sum[seg & 1][r]),
                          act_sum + (ok ? m0 + r : 0), ok);
            cp_async_commit();
        }
        /* This k-tile's stage becomes the one before; step to the next. */
        auto next_stage = [&] {
            prev2 = prev;
            prev = slot;
            if (++slot == S) {
                slot = 0;
                phase ^= 1u;
            }
        };
        /* After k-tile kt's wgmma group is committed: keep kDepth groups in
         * flight (wait_group), release the stage of the one that retired
         * (k-tile kt - kDepth), step to the next stage. */
        auto retire = [&](int kt) {
            wgmma_commit();
            wgmma_wait<C::kDepth>();
            if (kt > kt0 + C::kDepth - 1)
                mbar_arrive(empty0 + 8 * (C::kDepth == 2 ? prev2 : prev));
            next_stage();
        };
        if constexpr (MI == 2) {
            /* Two slices a consumer: 128 accumulators a thread leave room
             * for two half-k-tile fragment sets, not two whole ones (ptxas
             * serializes the wgmmas otherwise, C7512). Each k-tile is two
             * wgmma groups, steps 0-1 from set x and 2-3 from set y; a set
             * is redefined only once the group that read it retired. */
            uint32_t frag_x[MI][2][4], frag_y[MI][2][4];
            auto run_half = [&](uint32_t(&frag)[MI][2][4], int q, int kt) {
                const uint32_t stage_addr = sbase + (uint32_t)(slot * C::kStageBytes);
                const uint8_t *wsp = sptr + slot * C::kStageBytes + C::kActBytes;
#pragma unroll
                for (int i = 0; i < MI; i++) {
                    packed_to_frags(wsp, frag_tile<MI>(cg, i, wq), 2 * BK, q, gid, tig, frag[i],
                                    0);
#pragma unroll
                    for (int s = 0; s < 2; s++)
#pragma unroll
                        for (int r = 0; r < 4; r++)
                            pin(frag[i][s][r]);
                }
                wgmma_fence();
#pragma unroll
                for (int s = 0; s < 2; s++)
#pragma unroll
                    for (int i = 0; i < MI; i++)
                        wgmma_rs<BA>(acc[i], frag[i][s],
                                      sw128_desc(stage_addr + act_step_offset<C::kBA>(2 * q + s)),
                                      kt > kt0 || q > 0 || s > 0);
                wgmma_commit();
                wgmma_wait<1>();
            };
            for (int kt = kt0; kt < kt1; kt++) {
                mbar_wait(copied0 + 8 * slot, phase);
                run_half(frag_x, 0, kt);
                /* The group before (k-tile kt - 1's second half) retired. */
                if (kt > kt0)
                    mbar_arrive(empty0 + 8 * prev);
                run_half(frag_y, 1, kt);
                next_stage();
            }
        } else {
            /* The consumer expands its own MI x 64 weight rows straight
             * into A fragments (frag_tile, frag_reg) from the stage's
             * packed box. kDepth + 1 fragment sets, taken in turn by k-tile: the set
             * being defined is never that of a group still in flight, so
             * ptxas keeps the wgmmas asynchronous (C7513 otherwise). */
            auto run_ktile = [&](uint32_t(&frag)[MI][C::kSteps][4], int kt) {
                mbar_wait(copied0 + 8 * slot, phase);
                const uint32_t stage_addr = sbase + (uint32_t)(slot * C::kStageBytes);
                const uint8_t *wsp = sptr + slot * C::kStageBytes + C::kActBytes;
#pragma unroll
                for (int i = 0; i < MI; i++)
#pragma unroll
                    for (int q = 0; q < BK / 64; q++)
                        packed_to_frags(wsp, frag_tile<MI>(cg, i, wq), 2 * BK, q, gid, tig,
                                        frag[i], 2 * q);
#pragma unroll
                for (int i = 0; i < MI; i++)
#pragma unroll
                    for (int st = 0; st < C::kSteps; st++)
#pragma unroll
                        for (int r = 0; r < 4; r++)
                            pin(frag[i][st][r]);
                wgmma_fence();
#pragma unroll
                for (int st = 0; st < C::kSteps; st++)
#pragma unroll
                    for (int i = 0; i < MI; i++)
                        wgmma_rs<BA>(acc[i], frag[i][st],
                                      sw128_desc(stage_addr + act_step_offset<C::kBA>(st)),
                                      kt > kt0 || st > 0);
                retire(kt);
            };
            uint32_t frag_a[MI][C::kSteps][4], frag_b[MI][C::kSteps][4];
            int kt = kt0;
            if constexpr (C::kDepth == 2) {
                uint32_t frag_c[MI][C::kSteps][4];
                for (; kt + 2 < kt1; kt += 3) {
                    run_ktile(frag_a, kt);
                    run_ktile(frag_b, kt + 1);
                    run_ktile(frag_c, kt + 2);
                }
                if (kt < kt1)
                    run_ktile(frag_a, kt);
                if (kt + 1 < kt1)
                    run_ktile(frag_b, kt + 1);
            } else {
                for (; kt + 1 < kt1; kt += 2) {
                    run_ktile(frag_a, kt);
                    run_ktile(frag_b, kt + 1);
                }
                if (kt < kt1)
                    run_ktile(frag_a, kt);
            }
        }
        wgmma_wait<0>();
        if (C::kDepth == 2 && kt1 - kt0 >= 2)
            mbar_arrive(empty0 + 8 * prev2);
        mbar_arrive(empty0 + 8 * prev);
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int v = 0; v < C::kAcc; v++)
                pin(acc[i][v]);

        bool store = kt0 == 0 && kt1 == n_kt; /* a whole tile */
        if constexpr (SPLIT > 1) {
            split_reduce<SPLIT, C::kAcc, C::kConsumers>(acc[0], sptr, ctid);
            store = b % SPLIT == 0;
        } else if constexpr (MI == 1) /* stream-K: one slice a warpgroup (LaunchWS) */
            store = store || streamk_fixup<C::kAcc, C::kConsumers>(acc[0], streamk, b, grid,
                                                                   n_tiles, n_kt, tile, kt0, kt1,
                                                                   ctid, &last_segment);
        cp_async_wait<0>();
        consumer_sync<C::kConsumers>(); /* every consumer's scales and sums landed */
        if (store && C::kStagedEpilogue) {
            /* Epilogue through the warp's staging area: consumer cg is
             * weight rows 64 cg .. of the tile, its warp wq 16 of them. */
            int32_t *stage = reinterpret_cast<int32_t *>(sptr + S * C::kStageBytes +
                                                         (ctid >> 5) * kEpiWarpBytes);
            const bool vec_ok = (reinterpret_cast<uintptr_t>(y) & 15) == 0 && (ldy & 3) == 0;
            store_warp_staged<BA>(acc[0], stage, lane, m0, m, n,
                              tile0 * kTileRows + 64 * cg + 16 * wq, tile_scale[seg & 1],
                              tile_sum[seg & 1], w_scale, y, ldy, vec_ok);
        } else if (store) {
            /* Epilogue (store_tile_fast, else store_group): consumer cg is
             * slices MI cg .. */
            const int64_t col0 = tile0 * kTileRows + 16 * wq + gid;
            if (!store_tile_fast<MI, C::kBA>(acc, m0, m, n, tile0 * kTileRows + C::kBW, col0,
                                             MI * cg, tig, tile_scale[seg & 1],
                                             tile_sum[seg & 1], w_scale, y, ldy))
#pragma unroll
                for (int j = 0; j < C::kBA / 8; j++)
                    store_group<MI>(acc, j, m0, m, n, col0, MI * cg, tig, tile_scale[seg & 1],
                                    tile_sum[seg & 1], w_scale, y, ldy);
        }
    }
#else
    (void)m, (void)n, (void)tiles, (void)groups, (void)m_blocks, (void)n_tiles;
    (void)act_scale, (void)act_sum, (void)w_scale, (void)y, (void)ldy, (void)streamk;
    (void)act_map, (void)w_map;
#endif
}

/* The checks and function attributes every wgmma launch needs: sm_90a code
 * on a 9.0 device (else cudaErrorNotSupported), 16-byte aligned operands
 * (cp.async), the kernel's dynamic shared memory. *nothing: an empty
 * product, no launch needed. */
template <typename Kernel>
cudaError_t prepare(const bn_w2a8_cuda_args *a, Kernel kernel, int smem, bool *nothing)
{
    *nothing = false;
    if (!BN_W2A8_WGMMA_SM90A)
        return cudaErrorNotSupported; /* not built with sm_90a code */
    int dev = 0, major = 0, minor = 0;
    cudaError_t rc = cudaGetDevice(&dev);
    if (rc == cudaSuccess)
        rc = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (rc == cudaSuccess)
        rc = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (rc != cudaSuccess)
        return rc;
    /* sm_90a code runs on compute capability 9.0 only. */
    if (major != 9 || minor != 0)
        return cudaErrorNotSupported;
    if (a->m <= 0 || a->n <= 0) {
        *nothing = true;
        return cudaSuccess;
    }
    /* cp.async moves aligned 16-byte chunks. */
    if ((a->ldx & 15) != 0 || (reinterpret_cast<uintptr_t>(a->x) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(a->weights) & 15) != 0)
        return cudaErrorMisalignedAddress;
    cudaFuncAttributes fa;
    rc = cudaFuncGetAttributes(&fa, kernel);
    if (rc != cudaSuccess) {
        cudaGetLastError(); /* no sm_90a image for this device: not this stream's error */
        return cudaErrorNotSupported;
    }
    rc = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (rc == cudaSuccess)
        rc = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  (int)cudaSharedmemCarveoutMaxShared);
    return rc;
}

/* cuTensorMapEncodeTiled from the driver, through the runtime (no link to
 * libcuda); NULL when the driver does not have it. */
typedef CUresult (*EncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled()
{
    static EncodeTiled fn = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            p = nullptr;
        }
        return reinterpret_cast<EncodeTiled>(p);
    }();
    return fn;
}

/* A 2-D byte tensor of `rows` rows of `cols` bytes, `stride` bytes apart,
 * read in boxes of box_rows x box_cols bytes (rows past the end read as
 * zeros). */
cudaError_t byte_map(CUtensorMap *map, const void *base, uint64_t cols, uint64_t rows,
                     uint64_t stride, uint32_t box_cols, uint32_t box_rows, bool swizzle128)
{
    const EncodeTiled encode = encode_tiled();
    if (!encode)
        return cudaErrorNotSupported;
    const cuuint64_t dims[2] = {cols, rows};
    const cuuint64_t strides[1] = {stride};
    const cuuint32_t box[2] = {box_cols, box_rows};
    const cuuint32_t elem[2] = {1, 1};
    const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void *>(base),
                              dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/* The warp-specialized persistent kernel: one block per SM (at most one per
 * output tile, or per k-tile with stream-K), copies through tensor maps of
 * both operands; with `streamk`, the blocks share the k-tiles evenly
 * through a->streamk. SPLIT > 1: SPLIT blocks a tile, in clusters (a
 * product of fewer k-tiles than SPLIT runs whole tiles). */
template <int STAGES, int CW = 2, int MI = 1, int BA = 128, int SPLIT = 1>
struct LaunchWS {
    using C = CfgWS<STAGES, CW, MI, BA>;

    static cudaError_t run(const bn_w2a8_cuda_args *a, bool streamk, cudaStream_t stream)
    {
        auto kernel = a->pdl ? wgmma_ws_kernel<STAGES, CW, MI, BA, true, SPLIT>
                             : wgmma_ws_kernel<STAGES, CW, MI, BA, false, SPLIT>;
        if (SPLIT > 1 && (streamk || a->groups * (256 / C::kBK) < SPLIT))
            return LaunchWS<STAGES, CW, MI, BA>::run(a, streamk, stream);
        if (streamk && MI != 1)
            return cudaErrorInvalidValue; /* stream-K slots hold one slice a warpgroup */
        if (streamk && (!a->streamk || (reinterpret_cast<uintptr_t>(a->streamk) & 15) != 0))
            return cudaErrorInvalidValue;
        bool nothing = false;
        cudaError_t rc = prepare(a, kernel, C::kSmemBytes, &nothing);
        if (rc != cudaSuccess || nothing)
            return rc;
        const int64_t m_blocks = (a->m + C::kBA - 1) / C::kBA;
        const int64_t n_blocks = (a->tiles + C::kBW / kTileRows - 1) / (C::kBW / kTileRows);
        /* Box coordinates are int32: the k offset (bytes of a packed row),
         * the activation row and the layout tile. */
        if (a->groups * kBlockBytes > 0x7fffffff || a->m > 0x7fffffff || a->tiles > 0x7fffffff)
            return cudaErrorInvalidConfiguration;
        CUtensorMap act_map, w_map;
        rc = byte_map(&act_map, a->x, (uint64_t)(a->groups * 256), (uint64_t)a->m,
                      (uint64_t)a->ldx, C::kBK, C::kBA, true);
        if (rc == cudaSuccess)
            rc = byte_map(&w_map, a->weights, (uint64_t)(a->groups * kBlockBytes),
                          (uint64_t)a->tiles, (uint64_t)(a->groups * kBlockBytes), 2 * C::kBK,
                          C::kBW / kTileRows, false);
        if (rc != cudaSuccess)
            return rc;
        const int64_t n_tiles = m_blocks * n_blocks;
        int sms = a->sm_count > 0 ? a->sm_count : 132;
        if (streamk && sms > kStreamkMaxBlocks)
            sms = kStreamkMaxBlocks;
        /* Stream-K shares k-tiles (the workspace is sized for sms blocks). */
        const int64_t units = streamk ? n_tiles * a->groups * (256 / C::kBK) : n_tiles;
        const unsigned grid =
            SPLIT > 1 ? (unsigned)(n_tiles * SPLIT) : (unsigned)(units < sms ? units : sms);
        return pdl_launch_clustered(
            kernel, dim3(grid), dim3(C::kThreads), (size_t)C::kSmemBytes, dim3(SPLIT, 1, 1), stream,
            a->pdl, a->m, a->n, a->tiles, a->groups, m_blocks, n_tiles, a->act_scale, a->act_sum,
            a->weight_scale, a->y, a->ldy, streamk ? a->streamk : nullptr, act_map, w_map);
    }
};

} // namespace
} // namespace bn_wgmma

extern "C" int bn_w2a8_cuda_gemm_wgmma_compiled(void)
{
    return BN_W2A8_WGMMA_SM90A;
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_wgmma(const bn_w2a8_cuda_args *a, bn_w2a8_kernel kernel,
                                               cudaStream_t stream)
{
    using namespace bn_wgmma;
    switch (kernel) {
    /*                                              stages  consumers  slices  act rows */
    case BN_W2A8_WGMMA_128X128: return LaunchWS<8>::run(a, false, stream);
    case BN_W2A8_WGMMA_128X128_STREAMK: return LaunchWS<8>::run(a, true, stream);
    case BN_W2A8_WGMMA_192X128: return LaunchWS<8, 3>::run(a, false, stream);
    case BN_W2A8_WGMMA_192X128_STREAMK: return LaunchWS<8, 3>::run(a, true, stream);
    case BN_W2A8_WGMMA_256X128: return LaunchWS<8, 2, 2>::run(a, false, stream);
    case BN_W2A8_WGMMA_192X64: return LaunchWS<8, 3, 1, 64>::run(a, false, stream);
    case BN_W2A8_WGMMA_192X64_SPLIT2: return LaunchWS<8, 3, 1, 64, 2>::run(a, false, stream);
    case BN_W2A8_WGMMA_192X64_SPLIT4: return LaunchWS<8, 3, 1, 64, 4>::run(a, false, stream);
    default: return cudaErrorInvalidValue;
    }
}

namespace bn_wgmma {
namespace {

/* Pair i of the division check: a an integer of 1 to 31 bits (either
 * sign), d a float in [2^-90, 2^100] with a random mantissa (splitmix64 of
 * seed + i). Counts the pairs where row_div differs from __fdiv_rn. */
__global__ void division_check_kernel(int64_t pairs, uint64_t seed,
                                      unsigned long long *mismatches)
{
#if BN_WGMMA_DEVICE
    unsigned long long bad = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < pairs;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const int bits = 1 + (int)(z % 31);
        int32_t ai = (int32_t)((z >> 8) & ((1ull << bits) - 1));
        if (z & 0x80)
            ai = -ai;
        const int e = -90 + (int)((z >> 40) % 190);
        const float d = __uint_as_float(((uint32_t)(e + 127) << 23) | (uint32_t)(z >> 41 & 0x7FFFFF));
        const float a = (float)ai;
        const float ref = __fdiv_rn(a, d);
        const float got = row_div(a, d, row_reciprocal(d));
        if (!row_div_fast(d) || __float_as_uint(ref) != __float_as_uint(got))
            bad++;
    }
    if (bad)
        atomicAdd(mismatches, bad);
#else
    (void)pairs, (void)seed, (void)mismatches;
#endif
}

} // namespace
} // namespace bn_wgmma

extern "C" cudaError_t bn_w2a8_cuda_division_check(int64_t pairs, uint64_t seed,
                                                   unsigned long long *mismatches,
                                                   cudaStream_t stream)
{
    if (!BN_W2A8_WGMMA_SM90A)
        return cudaErrorNotSupported;
    if (pairs <= 0 || !mismatches)
        return cudaErrorInvalidValue;
    bn_wgmma::division_check_kernel<<<1024, 256, 0, stream>>>(pairs, seed, mismatches);
    return cudaGetLastError();
}

/* Walks the stream-K plan of n_tiles x n_kt k-tiles over `grid` blocks
 * with the kernel's own Segments, streamk_begin, streamk_owner and
 * streamk_slot, and checks what the fixup relies on: every k-tile run once;
 * each block's segments contiguous from its range's start to the next
 * block's; a partial tile's counter (its last owner) used by no other
 * partial tile; every slot written at most once; and the slots a
 * completing segment reads (the owners between the tile's first and last
 * but itself) exactly the other segments' slots. Host-only
 * (test_w2a8_streamk). */
extern "C" int bn_w2a8_cuda_streamk_plan_check(int64_t n_tiles, int64_t n_kt, int64_t grid,
                                               char *why, size_t size)
{
    using namespace bn_wgmma;
    const int64_t total = n_tiles * n_kt;
    if (n_tiles <= 0 || n_kt <= 0 || grid <= 0 || grid > kStreamkMaxBlocks || grid > total ||
        total > (int64_t)1 << 24) {
        snprintf(why, size, "plan %lld x %lld over %lld blocks: outside the checked range",
                 (long long)n_tiles, (long long)n_kt, (long long)grid);
        return 0;
    }
    int *covered = (int *)calloc((size_t)total, sizeof(int));
    int *counter_of = (int *)malloc((size_t)grid * sizeof(int));
    unsigned char *slot_used = (unsigned char *)calloc((size_t)(2 * grid), 1);
    /* Per tile: the slots its partial segments wrote (2 grid flags). */
    unsigned char *written = (unsigned char *)calloc((size_t)n_tiles * 2 * grid, 1);
    int ok = covered && counter_of && slot_used && written;
    if (!ok)
        snprintf(why, size, "out of host memory");
    for (int64_t i = 0; ok && i < grid; i++)
        counter_of[i] = -1;
    for (int64_t b = 0; ok && b < grid; b++) {
        Segments segs(b, grid, n_tiles, n_kt, true);
        int64_t tile, next = streamk_begin(b, total, grid);
        int kt0, kt1;
        while (ok && segs.take(tile, kt0, kt1)) {
            const int64_t t0 = tile * n_kt;
            /* Segments are contiguous, in order, inside one tile. */
            if (tile < 0 || tile >= n_tiles || kt0 < 0 || kt1 > n_kt || kt0 >= kt1 ||
                t0 + kt0 != next) {
                snprintf(why, size, "block %lld: segment tile %lld [%d, %d) out of order",
                         (long long)b, (long long)tile, kt0, kt1);
                ok = 0;
                break;
            }
            next = t0 + kt1;
            for (int kt = kt0; kt < kt1; kt++)
                covered[t0 + kt]++;
            if (kt1 - kt0 == n_kt)
                continue;
            /* A partial segment: its block lies between the tile's first and
             * last owners, the tile's counter is no other partial tile's,
             * and its slot is written once. */
            const int64_t lo = streamk_owner(t0, total, grid);
            const int64_t hi = streamk_owner(t0 + n_kt - 1, total, grid);
            const int64_t slot = streamk_slot(b, t0, total, grid);
            if (b < lo || b > hi || hi >= grid ||
                (counter_of[hi] >= 0 && counter_of[hi] != tile) || slot_used[slot]) {
                snprintf(why, size,
                         "block %lld, tile %lld [%d, %d): owners %lld..%lld, counter of %d, slot "
                         "%lld%s",
                         (long long)b, (long long)tile, kt0, kt1, (long long)lo, (long long)hi,
                         counter_of[hi < grid ? hi : 0], (long long)slot,
                         slot_used[slot] ? " written twice" : "");
                ok = 0;
                break;
            }
            counter_of[hi] = (int)tile;
            slot_used[slot] = 1;
            written[tile * 2 * grid + slot] = 1;
        }
        if (ok && next != streamk_begin(b + 1, total, grid)) {
            snprintf(why, size, "block %lld stops at %lld, not at the next block's start",
                     (long long)b, (long long)next);
            ok = 0;
        }
    }
    for (int64_t g = 0; ok && g < total; g++)
        if (covered[g] != 1) {
            snprintf(why, size, "k-tile %lld run %d times", (long long)g, covered[g]);
            ok = 0;
        }
    /* Whichever segment completes a partial tile, what it reads is what
     * the others wrote. */
    for (int64_t t = 0; ok && t < n_tiles; t++) {
        const int64_t t0 = t * n_kt;
        const int64_t lo = streamk_owner(t0, total, grid);
        const int64_t hi = streamk_owner(t0 + n_kt - 1, total, grid);
        if (lo == hi)
            continue; /* one block ran it whole */
        int writes = 0;
        for (int64_t sl = 0; sl < 2 * grid; sl++)
            writes += written[t * 2 * grid + sl];
        for (int64_t c = lo; ok && c <= hi; c++) {
            int reads = 0;
            for (int64_t o = lo; ok && o <= hi; o++) {
                if (o == c)
                    continue;
                const int64_t slot = streamk_slot(o, t0, total, grid);
                reads++;
                if (!written[t * 2 * grid + slot]) {
                    snprintf(why, size, "tile %lld: block %lld would read slot %lld, not written",
                             (long long)t, (long long)c, (long long)slot);
                    ok = 0;
                }
            }
            if (ok && reads != writes - 1) {
                snprintf(why, size, "tile %lld: block %lld reads %d slots of %d others",
                         (long long)t, (long long)c, reads, writes - 1);
                ok = 0;
            }
        }
    }
    free(covered);
    free(counter_of);
    free(slot_used);
    free(written);
    return ok;
}

extern "C" size_t bn_w2a8_cuda_gemm_streamk_bytes(int sm_count)
{
    using namespace bn_wgmma;
    size_t g = (size_t)(sm_count > 0 ? sm_count : 132);
    if (g > (size_t)kStreamkMaxBlocks)
        g = kStreamkMaxBlocks;
    return (kStreamkMaxBlocks + 2 * g * kSlotInts) * sizeof(int32_t);
}
