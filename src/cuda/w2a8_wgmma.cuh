/*
 * w2a8_wgmma.cuh - the pieces of the W2A8 GEMM on Hopper's warpgroup
 * tensor-core instruction (wgmma.mma_async m64nNk32 .s32.s8.s8) for
 * prefill-sized M: the configuration, the index maps of its operands, the
 * stream-K partition, the epilogue and the PTX wrappers. The kernel and its
 * launch are w2a8_gemm_wgmma.cu, which alone includes this file.
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
 * ---- Operands: the product is computed transposed -------------------------
 *
 * wgmma takes its A operand (M x K) from registers or shared memory and its
 * B operand (N x K) from shared memory only. The weights are the A operand
 * here (wgmma's M = weight rows = output columns) and the activations the B
 * operand (wgmma's N = activation rows), D = W . X^T, stored transposed.
 * That way the 2-bit codes are expanded straight into A registers, exactly
 * as the mma.sync kernel (w2a8_gemm_pipelined.cu) builds its B fragments:
 * the register layout of an m64nNk32 s8 A fragment is, per warp w of the
 * warpgroup, that of mma.m16n8k32's A for rows 16w .. 16w + 15 (CUTLASS
 * ALayout_64x32: m = 16 w + gid + 8 (r & 1), k = 4 tig + byte + 16 (r >> 1)
 * for register r of lane 4 gid + tig), so register r of thread (gid, tig)
 * for k step s is 2-bit field tig of word 2 (s & 1) + (r >> 1) of row
 * gid + 8 (r & 1)'s 16-byte entry, quarter s / 2 (cuda_layout.h): one shift
 * and one mask. Expanded weights never touch shared memory, and shared
 * memory carries only the activations (read by wgmma) and the packed
 * weights (read once per thread).
 *
 * ---- Shared memory: activations K-major with 128-byte swizzle ---------------
 *
 * A stage holds k = BK (128) of the activation tile: per 128 k, BA
 * rows of 128 bytes, row r at r * 128 with its 16-byte chunk c at chunk
 * c ^ (r & 7); every such BA x 128 tile 1024-byte aligned. That is the
 * canonical K-major 128B-swizzle layout of wgmma (PTX ISA "Shared Memory
 * Matrix Layout": Swizzle<3,4,3> o ((8,m),(T,2k)):((8T,SBO),(1,T)), T = 16
 * bytes): rows 128 bytes apart, 8-row groups SBO = 1024 apart, address
 * bits 4-6 XORed with bits 7-9. The descriptor of k step s (32 bytes)
 * starts 32 (s % 4) bytes into 128-k tile s / 4 (the swizzle works on
 * absolute address bits, so the pattern still starts at the 1024-aligned
 * base: base offset 0):
 *
 *     bits  0-13  start address >> 4        (tile + 32 (s % 4)) >> 4
 *     bits 16-29  leading byte offset >> 4  1 (unused for swizzled K-major)
 *     bits 32-45  stride byte offset >> 4   1024 >> 4
 *     bits 49-51  base offset               0
 *     bits 62-63  swizzle mode              1 (128-byte)
 *
 * After the activations, the stage holds the weight tiles' packed k-tiles
 * (BW / 8 tiles x 8 rows x BK / 4 bytes, contiguous in the layout).
 *
 * ---- Warp-specialized and persistent ------------------------------------------
 *
 * One block per SM loops over output tiles (64 CW MI weight rows x BA
 * activation rows; tile t = blockIdx.x + i gridDim.x, activation blocks
 * fastest so the blocks sharing a weight tile run side by side), or with
 * stream-K over its share of all tiles' k-tiles (Segments, below). Its
 * warps:
 *
 *   warps 0 .. 4 CW - 1      CW consumer warpgroups (MI slices of 64 weight
 *                            rows each)
 *   then                     the copy issuer (lane 0 of its first warp): one
 *                            warp, or with CW = 3 or MI = 2 a whole
 *                            warpgroup that hands its registers to the
 *                            consumers (setmaxnreg)
 *
 * Stage s of a STAGES-deep ring holds one k-tile (BK = 128): the activation
 * tile (BA x 128 bytes, K-major with the 128-byte swizzle) and the block's
 * packed weights (4 KB per 128 rows). Each consumer builds the A fragments
 * of its weight rows from the stage's packed box (frag_tile, frag_reg) and
 * runs register-A wgmma; it holds kDepth + 1 fragment sets and defines the
 * one no group in flight reads (with MI = 2, half-k-tile sets and two
 * groups a k-tile), so ptxas keeps the wgmmas asynchronous.
 *
 * The k-tiles of all the block's segments form one sequence (g counts
 * them); stage g % S, mbarrier phase (g / S) % 2. Per k-tile g:
 *
 *   issuer     wait empty (consumers released g - S); expect_tx copied;
 *              two tensor-memory-accelerator copies (the activation box of
 *              act_map, swizzled by the copy engine as wgmma reads it, and
 *              the box of packed weights of w_map), which complete copied;
 *   consumers  wait copied; expand the A fragments; BK / 32 wgmma; commit;
 *              wait_group kDepth; release the k-tile that retired (arrive
 *              on empty). After a segment's last k-tile: wait_group 0,
 *              release, then the epilogue (or stream-K's fixup), while the
 *              issuer already fills the next segment's stages.
 *              A segment's first wgmma overwrites the accumulators (scale-d
 *              false) instead of zeroing them: instructions defining
 *              accumulators between wgmmas make ptxas serialize every wgmma
 *              of the kernel (C7515).
 *
 * Launched with programmatic dependent launch (a->pdl, pdl.cuh; a kernel
 * instantiation of its own), the issuer sends the weight copies of the
 * first kPdlEarly stages, then waits for the kernel that wrote the
 * activations, then copies those; every other thread waits before its
 * first global access. Weights never change, so their copies may overlap
 * the kernel before.
 */
#pragma once

#include <cuda.h> /* CUtensorMap (types only: the encoder comes from the runtime) */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cp_async.cuh"
#include "pdl.cuh"
#include "w2a8_epilogue.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BN_WGMMA_DEVICE 1
#else
#define BN_WGMMA_DEVICE 0
#endif

namespace bn_wgmma {

constexpr int kTileRows = 8;     /* weight rows per layout tile               */
constexpr int kBlockBytes = 512; /* one tile's chunk-group (cuda_layout.h)    */

/* ---- Index maps (also __host__, so host code can check them) ------------ */

/* Byte offset in a stage of the start of wgmma k step s (32 k). */
template <int BA>
__host__ __device__ __forceinline__ uint32_t act_step_offset(int s)
{
    return (uint32_t)((s >> 2) * BA * 128 + 32 * (s & 3));
}

/* The wgmma descriptor of a K-major, 128B-swizzled operand at shared
 * address `addr` (8-row groups 1024 bytes apart). */
__host__ __device__ __forceinline__ uint64_t sw128_desc(uint32_t addr)
{
    return ((uint64_t)1 << 62) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 16) |
           (uint64_t)((addr & 0x3FFFF) >> 4);
}

/* Layout tile (within the block) of the low 8 rows of warp wq's 16-row
 * piece of slice i of warpgroup g; the high 8 rows are the next tile. */
template <int MI>
__host__ __device__ __forceinline__ int frag_tile(int g, int i, int wq)
{
    return 8 * (MI * g + i) + 2 * wq;
}

/* A-fragment register r (0..3) of k step s from the two rows' 16-byte
 * entries of quarter s / 2 of the stage: lo = row gid, hi = row gid + 8. */
__host__ __device__ __forceinline__ uint32_t frag_reg(const uint32_t lo[4], const uint32_t hi[4],
                                                      int s, int r, int tig)
{
    const uint32_t word = (r & 1) ? hi[2 * (s & 1) + (r >> 1)] : lo[2 * (s & 1) + (r >> 1)];
    return (word >> (2 * tig)) & 0x03030303u;
}

#if BN_WGMMA_DEVICE
/* The A fragments of k steps 2 q and 2 q + 1 (quarter q of a stage's packed
 * k-tile) of the 16 weight rows at layout tiles t and t + 1, tiles
 * tile_bytes apart, into f[s0] and f[s0 + 1]. */
template <int STEPS>
__device__ __forceinline__ void packed_to_frags(const uint8_t *packed, int t, int tile_bytes,
                                                int q, int gid, int tig, uint32_t (&f)[STEPS][4],
                                                int s0)
{
    const uint4 lo4 =
        *reinterpret_cast<const uint4 *>(packed + t * tile_bytes + q * 128 + gid * 16);
    const uint4 hi4 =
        *reinterpret_cast<const uint4 *>(packed + (t + 1) * tile_bytes + q * 128 + gid * 16);
    const uint32_t lo[4] = {lo4.x, lo4.y, lo4.z, lo4.w};
    const uint32_t hi[4] = {hi4.x, hi4.y, hi4.z, hi4.w};
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            f[s0 + s][r] = frag_reg(lo, hi, 2 * q + s, r, tig);
}
#endif

/* The per-warp epilogue staging area of the two-consumer configuration
 * (CfgWS::kStagedEpilogue): 32 activation rows x 16 weight rows of int32, rows kEpiStride
 * words apart (the transposed writes hit 32 distinct banks; rows stay
 * 16-byte aligned for the reads). */
constexpr int kEpiRows = 32;
constexpr int kEpiStride = 20;
constexpr int kEpiWarpBytes = kEpiRows * kEpiStride * 4;

/* Launched with PDL, the warp-specialized kernel copies the weights of this
 * many stages before it waits (wgmma_ws_kernel). */
constexpr int kPdlEarly = 2;

template <int STAGES, int CW = 2, int MI = 1, int BA = 128>
struct CfgWS {
    /* weight rows: CW consumer warpgroups x MI slices of 64 */
    static constexpr int kBW = 64 * CW * MI;
    static constexpr int kBA = BA; /* activation rows: wgmma's n */
    static constexpr int kBK = 128;
    static constexpr int kConsumers = 128 * CW;
    static constexpr int kIssuerWarp = 4 * CW;
    /* More than two consumer warpgroups, or two slices each: the issuer is
     * a whole warpgroup that hands its registers to the consumers
     * (setmaxnreg), since the default split of the register file (by the
     * warps each scheduler holds) would leave a consumer thread too few and
     * serialize its wgmma (C7511/C7512). */
    static constexpr int kIssuerWarps = CW > 2 || MI > 1 ? 4 : 1;
    static constexpr int kIssuerRegs = 40;
    static constexpr int kConsumerRegs = CW == 3 ? 152 : MI == 2 ? 232 : 0;
    static constexpr int kThreads = kConsumers + 32 * kIssuerWarps;
    static constexpr int kSteps = kBK / 32;
    static constexpr int kActBytes = kBA * kBK;
    static constexpr int kPackedBytes = kBW * kBK / 4; /* 2 bits per weight */
    static constexpr int kStageBytes = kActBytes + kPackedBytes;
    /* Two consumer warpgroups of one slice: each consumer warp's epilogue
     * staging area (store_warp_staged) after the stages. (With three, the
     * staged epilogue measured slower than store_group: H200, M = 512,
     * 13824 x 2560 45.6 -> 46.6-48.1 us.) */
    static constexpr bool kStagedEpilogue = CW == 2 && MI == 1;
    static constexpr int kEpilogueBytes = kStagedEpilogue ? kConsumers / 32 * kEpiWarpBytes : 0;
    static constexpr int kSmemBytes = STAGES * kStageBytes + kEpilogueBytes + 1024;
    static constexpr int kAcc = BA / 2; /* m64nBA accumulators per thread */
    /* wgmma groups a consumer keeps in flight: two where the accumulators
     * leave registers for a third fragment set (64 activation rows; H200,
     * M = 512, 2560 x 6912: 21.3 -> 21.0 us); with 128 rows ptxas would
     * serialize the wgmmas (C7512). */
    static constexpr int kDepth = MI == 1 && BA == 64 ? 2 : 1;
    static_assert((CW == 2 && MI == 1) || (CW == 3 && MI == 1) || (CW == 2 && MI == 2),
                  "two or three consumer warpgroups of one slice, or two of two");
    static_assert(kPackedBytes == kBW / kTileRows * 256, "layout tiles x 256 bytes per k-tile");
    static_assert(kStageBytes % 1024 == 0 && kActBytes % 1024 == 0, "swizzle alignment");
    static_assert(kSmemBytes <= 227 * 1024, "fits one block's shared memory");
    static_assert(BA == 128 || BA == 64, "wgmma_rs's widths");
    static_assert(2 * BA <= kConsumers, "the consumers copy a tile's scales and sums at once");
    static_assert(BA % 32 == 0, "store_warp_staged's rounds of 32 activation rows");
    static_assert(STAGES > kPdlEarly, "the stages copied before the PDL wait fit the ring");
};

/* ---- Stream-K for the warp-specialized kernel ------------------------------
 *
 * The grid's G blocks share the k-tiles of all output tiles, T = tiles x
 * n_kt in tile order, evenly: block b runs [b T / G, (b + 1) T / G). Its
 * range cuts into segments, one per output tile it touches; a segment that
 * is a whole tile is stored as usual. A partial one writes its int32
 * partial sums to a slot of the workspace (the block's first segment to
 * slot b, its last to slot G + b), and adds its k-tile count to the tile's
 * counter; the segment that completes the count adds the other segments'
 * slots to its own accumulators and stores the tile. int32 addition is
 * exact in any order, so the result is the whole-tile kernel's bit for bit
 * whichever block finishes last. The completing block resets the counter,
 * so every call leaves the workspace's counters at zero (the caller zeroes
 * them once, at allocation).
 *
 * Counters: one per partial tile, indexed by the block that runs the
 * tile's last k-tile (distinct for distinct partial tiles: a block that
 * ran the ends of two tiles ran the second whole). Layout of the
 * workspace: kStreamkMaxBlocks counters (at fixed places, so calls with
 * different grids share one workspace), then 2 G slots of 192 x 128 int32
 * (the largest tile; values 4 q .. 4 q + 3 of consumer thread c of T as the
 * int4 at q T + c, so a warp's stores are contiguous). Ordering: a segment's threads store their
 * slot values, meet at the consumers' barrier, and one thread adds to the
 * counter after a release fence; the completing one's acquire fence and a
 * second barrier make every counted segment's values visible to its
 * threads. A segment that finds (acquire load) every other one counted
 * completes the tile without storing its own. */
constexpr int kSlotInts = 192 * 128; /* the largest tile (three consumer warpgroups) */
constexpr int kStreamkMaxBlocks = 1024;

__host__ __device__ __forceinline__ int64_t streamk_begin(int64_t b, int64_t total, int64_t grid)
{
    return b * total / grid;
}

/* The block whose range holds k-tile g. */
__host__ __device__ __forceinline__ int64_t streamk_owner(int64_t g, int64_t total, int64_t grid)
{
    return ((g + 1) * grid - 1) / total;
}

/* The slot of block o's partial segment of the tile whose first k-tile is
 * t0: its first segment (its range starts in this tile) writes slot o, its
 * last (the range started in an earlier tile) slot G + o. The writer and
 * the completing reader both use this. */
__host__ __device__ __forceinline__ int64_t streamk_slot(int64_t o, int64_t t0, int64_t total,
                                                          int64_t grid)
{
    return streamk_begin(o, total, grid) >= t0 ? o : grid + o;
}

/* The segments a block runs: whole tiles b, b + G, ... (no workspace), or
 * its stream-K range cut at tile boundaries, or (split > 1, a cluster of
 * `split` blocks a tile) part b % split of tile b / split's k-tiles. (A
 * form that ran every full wave of G tiles whole and shared only the
 * remaining tiles measured slower: docs/KERNELS.md.) */
struct Segments {
    int64_t n_kt, n_tiles, grid, next, end;
    bool streamk;

    __host__ __device__ Segments(int64_t b, int64_t grid_, int64_t n_tiles_, int64_t n_kt_,
                                 bool streamk_, int split = 1)
        : n_kt(n_kt_), n_tiles(n_tiles_), grid(grid_), streamk(streamk_ || split > 1)
    {
        if (split > 1) {
            const int64_t t = b / split, part = b % split;
            next = t * n_kt + part * n_kt / split;
            end = t * n_kt + (part + 1) * n_kt / split;
        } else if (streamk) {
            next = streamk_begin(b, n_tiles * n_kt, grid);
            end = streamk_begin(b + 1, n_tiles * n_kt, grid);
        } else {
            next = b;
            end = n_tiles;
        }
    }

    /* The next segment: k-tiles [kt0, kt1) of output tile `tile`. */
    __host__ __device__ bool take(int64_t &tile, int &kt0, int &kt1)
    {
        if (next >= end)
            return false;
        if (!streamk) {
            tile = next;
            kt0 = 0;
            kt1 = (int)n_kt;
            next += grid;
            return true;
        }
        tile = next / n_kt;
        kt0 = (int)(next - tile * n_kt);
        const int64_t left = end - next;
        kt1 = left < n_kt - kt0 ? kt0 + (int)left : (int)n_kt;
        next += kt1 - kt0;
        return true;
    }
};

} // namespace bn_wgmma

namespace bn_wgmma {
namespace {

#if BN_WGMMA_DEVICE

/* ---- The epilogue's division, a row at a time ----------------------------
 *
 * __fdiv_rn(a, d) compiles to a range check of a and d (FCHK) and, where it
 * passes, the reciprocal of d refined by one Newton step, the quotient, its
 * residual and one correction (five FFMA and a MUFU.RCP); elsewhere a long
 * software path. Per value that is ~15 instructions, and the branch around
 * the slow path keeps the compiler from interleaving values, so a tile's
 * epilogue (64 values a thread) ran as one long dependent chain. Here the
 * reciprocal is computed once per row and the quotient takes three
 * instructions, the same operations in the same order as that fast path,
 * where a is an integer-valued float of magnitude at most 2^31 and d lies in
 * [2^-90, 2^100] (quotients far from overflow and underflow, where the range
 * check passes); other rows divide with __fdiv_rn. bn_w2a8_cuda_division_check
 * compares the two on random pairs (test_cuda_kernels). */
__device__ __forceinline__ bool row_div_fast(float d)
{
    return d >= 0x1p-90f && d <= 0x1p100f;
}

__device__ __forceinline__ float row_reciprocal(float d)
{
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    return __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
}

__device__ __forceinline__ float row_div(float a, float d, float r)
{
    const float q = __fmul_rn(a, r);
    return __fmaf_rn(r, __fmaf_rn(-d, q, a), q);
}

/* Stores accumulator group j (activation rows 8 j .. 8 j + 7 of the tile)
 * of a warpgroup's MI slices (CUTLASS CLayout_64xN): accumulator 4 j + v of
 * slice i is weight row 16 wq + gid + 8 (v >> 1) of slice slice0 + i,
 * activation row 8 j + 2 tig + (v & 1); stored transposed, y[act row][weight
 * row]. col0 = the block's first weight row + 16 wq + gid; tile_scale and
 * tile_sum hold the scales and sums of the tile's activation rows (m0 on). */
template <int MI, int ACC>
__device__ __forceinline__ void store_group(const int32_t (&acc)[MI][ACC], int j, int64_t m0,
                                            int64_t m, int64_t n, int64_t col0, int slice0,
                                            int tig, const float *tile_scale,
                                            const int32_t *tile_sum, float w_scale, float *y,
                                            int64_t ldy)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = 8 * j + 2 * tig + h; /* row of the tile */
        const int64_t row = m0 + r;
        if (row >= m)
            continue;
        const float sc = tile_scale[r];
        const int32_t sum = tile_sum[r];
        float *yrow = y + row * ldy;
        if (row_div_fast(sc)) {
            const float rc = row_reciprocal(sc);
#pragma unroll
            for (int i = 0; i < MI; i++) {
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int64_t col = col0 + 64 * (slice0 + i) + 8 * half;
                    const float a = (float)(acc[i][4 * j + 2 * half + h] - sum);
                    if (col < n)
                        yrow[col] = __fmul_rn(row_div(a, sc, rc), w_scale);
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < MI; i++) {
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int64_t col = col0 + 64 * (slice0 + i) + 8 * half;
                    if (col < n)
                        yrow[col] = w2a8_epilogue(acc[i][4 * j + 2 * half + h] - sum, sc, w_scale);
                }
            }
        }
    }
}

/* store_group over a whole tile (all BA / 8 groups), straight-line, where
 * that is possible: the tile lies inside y (rows m0 .. m0 + BA - 1 below m,
 * its weight rows below n: col_end <= n) and every row's scale is in
 * row_div's range. Returns false, storing nothing, otherwise (the caller
 * then runs store_group). The same operations as store_group's fast path,
 * bit for bit; without its per-row and per-value branches and its inlined
 * slow divisions the code a tile's epilogue runs once, cold in the
 * instruction cache, is a fraction of the size (H200, 192 x 64 tiles,
 * 2560 x 2560 at M = 512: the stores took ~2.6 us of an 11 us call). The
 * scales and sums of a thread's rows 8 j + 2 tig + {0, 1} are read as
 * pairs. */
template <int MI, int BA, int ACC>
__device__ __forceinline__ bool store_tile_fast(const int32_t (&acc)[MI][ACC], int64_t m0,
                                                int64_t m, int64_t n, int64_t col_end,
                                                int64_t col0, int slice0, int tig,
                                                const float *tile_scale, const int32_t *tile_sum,
                                                float w_scale, float *y, int64_t ldy)
{
    if (m0 + BA > m || col_end > n)
        return false;
    float2 sc[BA / 8];
    int2 sum[BA / 8];
    bool fast = true;
#pragma unroll
    for (int j = 0; j < BA / 8; j++) {
        sc[j] = *reinterpret_cast<const float2 *>(tile_scale + 8 * j + 2 * tig);
        sum[j] = *reinterpret_cast<const int2 *>(tile_sum + 8 * j + 2 * tig);
        fast = fast && row_div_fast(sc[j].x) && row_div_fast(sc[j].y);
    }
    if (!fast)
        return false;
#pragma unroll
    for (int j = 0; j < BA / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float d = h ? sc[j].y : sc[j].x;
            const int32_t s = h ? sum[j].y : sum[j].x;
            const float rc = row_reciprocal(d);
            float *yrow = y + (m0 + 8 * j + 2 * tig + h) * ldy;
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const float a = (float)(acc[i][4 * j + 2 * half + h] - s);
                    yrow[col0 + 64 * (slice0 + i) + 8 * half] =
                        __fmul_rn(row_div(a, d, rc), w_scale);
                }
        }
    return true;
}

/* Stores a consumer warp's piece of the tile (16 weight rows from col_w, the
 * tile's BA activation rows; accumulators as store_group's) through its
 * staging area `stage`: in BA / 32 rounds of 32 activation rows the warp writes
 * its accumulators there transposed, then each lane reads back four
 * consecutive weight rows of one activation row and stores them as one
 * 16-byte value (vec_ok: y 16-byte aligned and ldy a multiple of 4; else,
 * and at the right edge, one value at a time). A tile's epilogue runs once
 * per tile, cold in the instruction cache: as a small loop with 16 wide
 * stores a thread it costs less than store_group's 64 unrolled scattered
 * ones (H200, M = 512, 2560 x 2560: 14.3 -> 13.2 us). The arithmetic is
 * store_group's, bit for bit. */
template <int BA>
__device__ __forceinline__ void store_warp_staged(const int32_t (&acc)[BA / 2], int32_t *stage,
                                                  int lane, int64_t m0, int64_t m, int64_t n,
                                                  int64_t col_w, const float *tile_scale,
                                                  const int32_t *tile_sum, float w_scale, float *y,
                                                  int64_t ldy, bool vec_ok)
{
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int round = 0; round < BA / kEpiRows; round++) {
#pragma unroll
        for (int jj = 0; jj < 4; jj++)
#pragma unroll
            for (int v = 0; v < 4; v++)
                stage[(8 * jj + 2 * tig + (v & 1)) * kEpiStride + gid + 8 * (v >> 1)] =
                    acc[4 * (4 * round + jj) + v];
        __syncwarp();
        /* Rolled: unrolled, this loop measured slower (H200, M = 512,
         * 2560 x 2560 13.2 -> 14.7 us): the epilogue's code is fetched cold
         * once per tile. */
#pragma unroll 1
        for (int it = 0; it < kEpiRows / 8; it++) {
            const int rl = 8 * it + (lane >> 2), c4 = lane & 3;
            const int tr = kEpiRows * round + rl; /* row of the tile */
            const int64_t row = m0 + tr;
            if (row >= m)
                continue;
            const int4 q = *reinterpret_cast<const int4 *>(stage + rl * kEpiStride + 4 * c4);
            const int32_t qa[4] = {q.x, q.y, q.z, q.w};
            const float sc = tile_scale[tr];
            const int32_t sum = tile_sum[tr];
            float o[4];
            if (row_div_fast(sc)) {
                const float rc = row_reciprocal(sc);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    o[e] = __fmul_rn(row_div((float)(qa[e] - sum), sc, rc), w_scale);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    o[e] = w2a8_epilogue(qa[e] - sum, sc, w_scale);
            }
            const int64_t col = col_w + 4 * c4;
            float *dst = y + row * ldy + col;
            if (vec_ok && col + 3 < n) {
                *reinterpret_cast<float4 *>(dst) = make_float4(o[0], o[1], o[2], o[3]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (col + e < n)
                        dst[e] = o[e];
            }
        }
        __syncwarp(); /* the reads are done before the next round's writes */
    }
}


__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Pins a register's value at this point of the (volatile) asm order, so the
 * compiler neither computes an A fragment after wgmma.fence nor touches an
 * accumulator between a wgmma and its wait. */
__device__ __forceinline__ void pin(int32_t &r)
{
    asm volatile("" : "+r"(r)::"memory");
}

__device__ __forceinline__ void pin(uint32_t &r)
{
    asm volatile("" : "+r"(r)::"memory");
}


/* Register-A wgmma, m64nNk32: d (+)= A B, with accumulate 0 d = A B, the
 * old d ignored (scale-d false), so a new tile needs no zeroing
 * instructions between wgmmas (ptxas serializes wgmma whose accumulators
 * other instructions define, C7515). */
template <int N>
__device__ __forceinline__ void wgmma_rs(int32_t (&d)[N / 2], const uint32_t (&a)[4],
                                         uint64_t desc, int accumulate = 1);

template <>
__device__ __forceinline__ void wgmma_rs<128>(int32_t (&d)[64], const uint32_t (&a)[4],
                                              uint64_t desc, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                 "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                 "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                 "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
                 "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
                 "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
                 "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
                 "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate)
                 : "memory");
}

template <>
__device__ __forceinline__ void wgmma_rs<64>(int32_t (&d)[32], const uint32_t (&a)[4],
                                             uint64_t desc, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                 "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                 "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                 "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate)
                 : "memory");
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

/* mbarriers of the warp-specialized kernel (shared::cta addresses). An
 * arrival releases this thread's earlier writes; a completed wait acquires
 * those of every arrival of the phase. */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* One arrival that also expects `bytes` of asynchronous copies (the
 * phase completes when both are in). */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

/* Tensor memory accelerator: the box at (c0, c1) of the 2-D tensor `map`
 * (a __grid_constant__ kernel parameter) into shared memory at dst,
 * completing `bar` with its byte count. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                            uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* Returns once the phase of parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred done;\nWAIT_AGAIN:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_AGAIN;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}


/* The consumer warpgroups' barrier (named barrier 1, THREADS threads). */
template <int THREADS = 256>
__device__ __forceinline__ void consumer_sync()
{
    asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
}

/* A partial segment's turn (consumer thread c of THREADS, accumulators
 * final):
 * returns true when this segment completed the tile, its accumulators now
 * holding the whole tile's sums. *last is shared memory. */
template <int ACC, int THREADS>
__device__ bool streamk_fixup(int32_t (&acc)[ACC], int32_t *ws, int64_t b, int64_t grid,
                              int64_t n_tiles, int64_t n_kt, int64_t tile, int kt0, int kt1, int c,
                              int *last)
{
    static_assert(ACC % 4 == 0, "slots hold int4s");
    static_assert(ACC * THREADS <= kSlotInts, "a tile fits its slot");
    const int64_t total = n_tiles * n_kt, t0 = tile * n_kt;
    int *const counters = reinterpret_cast<int *>(ws);
    int4 *const slots = reinterpret_cast<int4 *>(ws + kStreamkMaxBlocks);
    const int64_t lo = streamk_owner(t0, total, grid), hi = streamk_owner(t0 + n_kt - 1, total, grid);
    const int got = kt1 - kt0;
    /* Every other segment already counted: this one completes the tile and
     * need not store its partial sums (the usual case for the segment that
     * a block runs last, the others having run at their blocks' starts). */
    if (c == 0) {
        int seen;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counters + hi) : "memory");
        *last = seen + got == (int)n_kt;
    }
    consumer_sync<THREADS>();
    if (!*last) {
        int4 *mine = slots + streamk_slot(b, t0, total, grid) * (kSlotInts / 4) + c;
#pragma unroll
        for (int q = 0; q < ACC / 4; q++)
            __stcg(mine + q * THREADS,
                   make_int4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
        consumer_sync<THREADS>();
        if (c == 0) {
            asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); /* release the slot */
            *last = atomicAdd(counters + hi, got) + got == (int)n_kt;
            if (*last)
                asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); /* acquire the others' */
        }
        consumer_sync<THREADS>();
        if (!*last)
            return false;
    }
    for (int64_t o = lo; o <= hi; o++) {
        if (o == b)
            continue;
        const int4 *theirs = slots + streamk_slot(o, t0, total, grid) * (kSlotInts / 4) + c;
#pragma unroll
        for (int q = 0; q < ACC / 4; q++) {
            const int4 p = __ldcg(theirs + q * THREADS);
            acc[4 * q] += p.x;
            acc[4 * q + 1] += p.y;
            acc[4 * q + 2] += p.z;
            acc[4 * q + 3] += p.w;
        }
    }
    if (c == 0)
        counters[hi] = 0; /* every other segment has counted */
    return true;
}

/* The whole cluster's barrier: every thread of every block arrives (its
 * shared-memory writes released) and waits (the others' acquired). */
__device__ __forceinline__ void cluster_sync_all()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/* Split K over a cluster of SPLIT blocks, one output tile: each block's
 * accumulators are the sums of its part of the k-tiles; split_reduce adds
 * them into block 0's, in rounds of a tree (round d: block r with
 * r % 2d == d writes its sums into block r - d's shared memory at `buf`,
 * which adds them), through distributed shared memory instead of global
 * memory. Called by the consumers (thread c of THREADS) once every block's
 * stages are idle; the other threads of every block make the same
 * cluster_sync_all calls (split_sync_rounds). buf: shared memory of ACC x
 * THREADS words, 16-byte aligned, the same offset in every block. */
template <int SPLIT> __device__ __forceinline__ void split_sync_rounds()
{
    for (int d = 1; d < SPLIT; d *= 2) {
        cluster_sync_all();
        cluster_sync_all();
    }
}

template <int SPLIT, int ACC, int THREADS>
__device__ __forceinline__ void split_reduce(int32_t (&acc)[ACC], const uint8_t *buf, int c)
{
    static_assert(ACC % 4 == 0, "the sums move as int4s");
    const int4 *mine = reinterpret_cast<const int4 *>(buf) + c;
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    for (unsigned d = 1; d < (unsigned)SPLIT; d *= 2) {
        cluster_sync_all(); /* the receiver's stages (or last round's sums) are read */
        if (rank % (2 * d) == d) {
            const unsigned dst = cluster_addr(mine, rank - d);
#pragma unroll
            for (int q = 0; q < ACC / 4; q++)
                asm volatile("st.shared::cluster.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                                 dst + (unsigned)(q * THREADS * 16)),
                             "r"(acc[4 * q]), "r"(acc[4 * q + 1]), "r"(acc[4 * q + 2]),
                             "r"(acc[4 * q + 3])
                             : "memory");
        }
        cluster_sync_all(); /* the sender's sums landed */
        if (rank % (2 * d) == 0 && rank + d < (unsigned)SPLIT) {
#pragma unroll
            for (int q = 0; q < ACC / 4; q++) {
                const int4 p = mine[q * THREADS];
                acc[4 * q] += p.x;
                acc[4 * q + 1] += p.y;
                acc[4 * q + 2] += p.z;
                acc[4 * q + 3] += p.w;
            }
        }
    }
}

#endif /* BN_WGMMA_DEVICE */

} // namespace
} // namespace bn_wgmma
