/*
 * w2a8_gemm_wgmma.cu - the W2A8 GEMM on Hopper's warpgroup tensor-core
 * instruction (wgmma.mma_async m64nNk32 .s32.s8.s8), for prefill-sized M.
 *
 * Same contract as every W2A8 kernel (w2a8_kernels.cu): weights in the
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
 * A stage holds k = BK (128 or 256) of the activation tile: per 128 k, BA
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
 * ---- Tiles and pipeline -----------------------------------------------------
 *
 * A block is WG warpgroups; warpgroup g owns MI slices of 64 weight rows
 * and all BA activation rows: MI x (BA / 2) int32 accumulators per thread.
 * Configurations (BN_W2A8_WGMMA_*; weight rows x activation rows):
 *
 *   256x128:     2 warpgroups x 2 slices, BK 128, 24 KB per stage, 6 stages,
 *                1 block per SM, 128 accumulators (BK 256 spills: 64
 *                fragment registers).
 *   128x128 1wg: 1 warpgroup x 2 slices, BK 128, 20 KB per stage, 4 stages,
 *                2 blocks per SM, 128 accumulators.
 *   128x128:     2 warpgroups x 1 slice, BK 128, 20 KB per stage, 4 stages,
 *                2 blocks per SM, 64 accumulators.
 *   128x128 ss:  as 128x128 with both operands in shared memory (weights
 *                expanded there; wgmma_ss_kernel, below): 6 stages + 3
 *                expanded 16 KB slots, 169 KB, 1 block per SM.
 *   128x128 tma: warp-specialized and persistent: a copy-issuing warp
 *                (tensor memory accelerator), one expanding warpgroup, two
 *                consuming warpgroups (wgmma_ws_kernel, below): 6 stages of
 *                36 KB, 1 block per SM looping over output tiles.
 *   128x128 tma stream-K: the same kernel with the k-tiles of all output
 *                tiles shared evenly by the blocks (Segments, below).
 *   128x128 tma rs (and stream-K): the same kernel without expanders, the
 *                consumers expanding into wgmma's A registers; 8 stages of
 *                20 KB.
 *   192x128 tma rs (and stream-K): three consuming warpgroups, the copy
 *                issuer a whole warpgroup (setmaxnreg); 8 stages of 22 KB.
 *   256x128 tma rs: two consuming warpgroups of two slices; 8 stages of
 *                24 KB.
 *   192x64 tma rs: as 192x128 tma rs with 64 activation rows (wgmma n =
 *                64), two wgmma groups in flight; 8 stages of 14 KB.
 *
 * The warp-specialized kernels (tma) may be launched with programmatic
 * dependent launch (a->pdl, pdl.cuh; a kernel of its own): the copy issuer
 * sends the weight copies of the first two stages, then waits for the
 * kernel that wrote the activations, then copies those; every other thread
 * waits before its first global access. Weights never change, so their
 * copies may overlap the kernel before, and the block's launch and set-up
 * overlap that kernel's last blocks.
 *
 * Per k, 256x128 moves 256 / 4 + 128 = 192 bytes into shared memory for
 * 32768 multiply-adds (5.9e-3 B per multiply-add, the 64x256 mma.sync
 * kernel 7.8e-3), the 128x128 ones 9.8e-3. wgmma reads the activations from
 * shared memory (1/64 byte per multiply-add); the packed weights are read
 * once per thread.
 *
 * Every thread copies (cp.async, zero-filled past M and past the weight
 * tiles) and every warpgroup computes. Iteration it:
 *
 *     cp.async.wait (k-tile it landed) ; fence.proxy.async ; __syncthreads
 *     cp.async k-tile it + S - 1 into the slot of k-tile it - 1
 *     load + expand the A fragments of k-tile it
 *     wgmma.fence ; BK / 32 k steps x MI wgmma ; commit ; wgmma.wait_group 0
 *
 * wait_group 0, not 1: ptxas serializes every wgmma of a kernel in which A
 * registers are defined while an older wgmma group is in flight (C7513),
 * so a warpgroup cannot overlap its own expansion with its own wgmma; the
 * tensor cores are kept busy by the other warpgroup of the block and, for
 * the 128x128 configurations, by the second block on the SM. After the
 * barrier every warpgroup has retired k-tile it - 1, so its slot may be
 * refilled (prefetch distance S - 1). fence.proxy.async makes the
 * generic-proxy cp.async writes visible to wgmma (async proxy).
 *
 * ---- Build ------------------------------------------------------------------
 *
 * wgmma needs sm_90a code: CMake compiles this file alone for
 * compute_90a/sm_90a when 90 is among the architectures (and defines
 * BN_W2A8_WGMMA_SM90A); elsewhere the kernel body is empty and the launcher
 * answers cudaErrorNotSupported, as it does on any device other than 9.0,
 * so callers fall back to the other kernels.
 */
#include <cuda.h> /* CUtensorMap (types only: the encoder comes from the runtime) */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "cp_async.cuh"
#include "pdl.cuh"
#include "w2a8_cuda.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BN_WGMMA_DEVICE 1
#else
#define BN_WGMMA_DEVICE 0
#endif

#ifndef BN_W2A8_WGMMA_SM90A
#define BN_W2A8_WGMMA_SM90A 0
#endif

namespace bn_wgmma {

constexpr int kTileRows = 8;     /* weight rows per layout tile               */
constexpr int kBlockBytes = 512; /* one tile's chunk-group (cuda_layout.h)    */

template <int WG, int MI, int BA, int BK, int STAGES, int MIN_BLOCKS>
struct Cfg {
    static constexpr int kThreads = 128 * WG;
    static constexpr int kBW = 64 * MI * WG; /* weight rows per block */
    static constexpr int kWTiles = kBW / kTileRows;
    static constexpr int kSteps = BK / 32;          /* wgmma k steps per stage    */
    static constexpr int kWTileBytes = 2 * BK;      /* one tile (8 rows) packed k-tile */
    static constexpr int kActBytes = BA * BK;
    static constexpr int kWBytes = kWTiles * kWTileBytes;
    static constexpr int kStageBytes = kActBytes + kWBytes;
    /* + 1024: the dynamic shared memory base is rounded up to 1024. */
    static constexpr int kSmemBytes = STAGES * kStageBytes + 1024;
    static constexpr int kActChunks = BA * BK / 16;
    static constexpr int kWChunks = kWBytes / 16;
    static constexpr int kAcc = BA / 2; /* accumulators per slice */
    static_assert(BK == 128 || BK == 256, "a stage is half or all of a chunk-group");
    static_assert(BA == 128, "wgmma n of the wrapper below (m64n128k32)");
    static_assert(kActChunks % kThreads == 0 && kWChunks % kThreads == 0, "even copy split");
    static_assert(kStageBytes % 1024 == 0 && kActBytes % 1024 == 0,
                  "stages and their activation tiles keep the 1024-byte swizzle alignment");
    static_assert(STAGES >= 2, "prefetch distance STAGES - 1");
};

/* ---- Index maps (also __host__, so host code can check them) ------------ */

/* Byte offset in a stage of 16-byte chunk `chunk` (0 .. BK / 16 - 1) of
 * activation row `row`: k-half chunk / 8 is its own BA x 128-byte
 * 128B-swizzled tile. */
template <int BA>
__host__ __device__ __forceinline__ uint32_t act_offset(int row, int chunk)
{
    return (uint32_t)((chunk >> 3) * BA * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

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

/* ---- Split-K over a thread-block cluster (configuration 128x128 k/split) --
 *
 * The `split` blocks of one output tile are one cluster (x = m block *
 * split + rank). n_kt k-tiles are cut into slices of ceil(n_kt / split);
 * the launcher passes a split for which every slice is non-empty. */
__host__ __device__ __forceinline__ void split_range(int n_kt, int split, int rank, int &kt0,
                                                     int &count)
{
    const int per = (n_kt + split - 1) / split;
    kt0 = rank * per;
    count = n_kt - kt0 < per ? n_kt - kt0 : per;
}

/* Block `rank` sums and stores accumulator group j (accumulators 4 j ..
 * 4 j + 3 of every slice: activation rows 8 j .. 8 j + 7 of the tile). */
__host__ __device__ __forceinline__ bool split_owns(int j, int split, int rank)
{
    return j % split == rank;
}

/* int4 index of accumulator group j of slice i of thread tid in the
 * reduction buffer (the pipeline's shared memory, reused). */
template <int MI, int BA, int THREADS>
__host__ __device__ __forceinline__ int red_index(int i, int j, int tid)
{
    return (i * (BA / 8) + j) * THREADS + tid;
}

/* ---- Both operands from shared memory (configuration 128x128 ss) ---------
 *
 * Besides the STAGES stages, ASLOTS expanded-weight slots of kBW rows x BK
 * int8, laid out exactly like the activation tile (K-major, 128-byte
 * swizzle, act_offset<kBW>), so the A descriptor is built like B's. */
template <int WG, int MI, int BA, int BK, int STAGES, int MIN_BLOCKS, int ASLOTS>
struct CfgSS : Cfg<WG, MI, BA, BK, STAGES, MIN_BLOCKS> {
    using Base = Cfg<WG, MI, BA, BK, STAGES, MIN_BLOCKS>;
    static constexpr int kASlotBytes = Base::kBW * BK;
    static constexpr int kARing = STAGES * Base::kStageBytes; /* offset from the 1024-aligned base */
    static constexpr int kSmemBytes = kARing + ASLOTS * kASlotBytes + 1024;
    static_assert(ASLOTS >= 3, "a slot is rewritten only once every warpgroup retired its group");
    static_assert(STAGES >= 3, "prefetch distance STAGES - 2");
    static_assert(kSmemBytes <= 227 * 1024, "fits one block's shared memory (and 18-bit descriptors)");
    static_assert(kASlotBytes % 1024 == 0 && (64 * 128) % 1024 == 0,
                  "slots and 64-row slices keep the 1024-byte swizzle alignment");
};

/* The 16 int8 codes of k offsets 16 i + 4 j .. + 3 (j = 0..3) of a layout
 * entry's word i: expanded chunk i of the entry's 64 k is
 * {expand(w, 0), expand(w, 1), expand(w, 2), expand(w, 3)}. */
__host__ __device__ __forceinline__ uint32_t expand_codes(uint32_t word, int j)
{
    return (word >> (2 * j)) & 0x03030303u;
}

/* Packed chunk c (0 .. kWChunks - 1) of a stage: layout tile t = c / (2 BK
 * / 16) of the block, entry e = c % (2 BK / 16) of the k-tile, i.e. row
 * 8 t + e % 8, k offsets 64 (e / 8) .. + 63 of the k-tile; its expanded
 * 16-byte chunk i (0..3) is chunk 4 (e / 8) + i of that row. */
template <int BK>
__host__ __device__ __forceinline__ void ss_entry(int c, int &row, int &chunk0)
{
    const int t = c / (2 * BK / 16), e = c % (2 * BK / 16);
    row = 8 * t + (e & 7);
    chunk0 = 4 * (e >> 3);
}

/* Byte offset in an expanded slot of the start of wgmma k step s of the
 * 64-row slice `slice`. */
template <int BW>
__host__ __device__ __forceinline__ uint32_t ss_a_step_offset(int slice, int s)
{
    return act_step_offset<BW>(s) + (uint32_t)(slice * 64 * 128);
}

/* ---- Warp-specialized, persistent (configuration 128x128 tma) ------------
 *
 * One block per SM loops over output tiles (64 CW MI weight rows x 128
 * activation rows; tile t = blockIdx.x + i gridDim.x, activation blocks
 * fastest so the blocks sharing a weight tile run side by side), or with
 * stream-K over its share of all tiles' k-tiles (Segments, below). Its
 * warps:
 *
 *   warps 0 .. 4 PW - 1      expanders (PW warpgroups; none with PW = 0)
 *   warps 4 PW .. +4 CW - 1  CW consumer warpgroups (MI slices of 64 weight
 *                            rows each)
 *   then                     the copy issuer (lane 0 of its first warp): one
 *                            warp, or with CW = 3 or MI = 2 a whole
 *                            warpgroup that hands its registers to the
 *                            consumers (setmaxnreg)
 *
 * PW = 0 (configurations tma rs): no expanders and no expanded tile; each
 * consumer builds its A fragments from the stage's packed box (as
 * wgmma_kernel does from its stage) and runs register-A wgmma, so a k-tile
 * moves 16 KB fewer bytes into and 16 KB fewer out of shared memory, and a
 * stage is 20-24 KB instead of 36 (8 stages). A consumer holds two fragment
 * sets and defines the one not used by its group in flight (with MI = 2,
 * half-k-tile sets and two groups a k-tile).
 *
 * Stage s of a STAGES-deep ring holds one k-tile (BK = 128): the activation
 * tile (16 KB), the block's packed weights (4 KB for 128 rows) and, with
 * expanders, those weights expanded to int8 (16 KB). Activations and
 * expanded weights are K-major with the
 * 128-byte swizzle (act_offset), so every wgmma reads both operands from
 * shared memory and no register is defined between a consumer's wgmmas: a
 * consumer keeps a wgmma group in flight.
 *
 * The k-tiles of all the block's segments form one sequence (g counts
 * them); stage g % S, mbarrier phase (g / S) % 2. Per k-tile g:
 *
 *   issuer     wait empty (consumers released g - S); expect_tx copied;
 *              two tensor-memory-accelerator copies (the activation box of
 *              act_map, swizzled by the copy engine exactly as act_offset,
 *              and the 16 x 256-byte box of packed weights of w_map), which
 *              complete copied;
 *   expanders  wait copied; expand the packed entries (each thread its
 *              own); fence.proxy.async (their generic writes become visible
 *              to wgmma's async proxy); arrive on full (one arrival per
 *              expander completes it);
 *   consumers  wait full (and copied, observing the copy engine's writes
 *              directly); BK / 32 wgmma m64n128k32; commit; wait_group 1;
 *              release k-tile g - 1 of the same segment (arrive on empty,
 *              256 arrivals complete it). After a segment's last k-tile:
 *              wait_group 0, release it, then the epilogue (or stream-K's
 *              fixup), while the issuer and expanders already fill the
 *              next segment's stages.
 *              A segment's first wgmma overwrites the accumulators (scale-d
 *              false) instead of zeroing them: instructions defining
 *              accumulators between wgmmas make ptxas serialize every wgmma
 *              of the kernel (C7515), which cost this kernel 20-30 %.
 *
 * Each role waits only on the one before it in the pipeline (the issuer on
 * releases of k-tiles S back), so no role can hold back one it feeds. */

/* The per-warp epilogue staging area of the register-A warp-specialized
 * kernels: 32 activation rows x 16 weight rows of int32, rows kEpiStride
 * words apart (the transposed writes hit 32 distinct banks; rows stay
 * 16-byte aligned for the reads). */
constexpr int kEpiRows = 32;
constexpr int kEpiStride = 20;
constexpr int kEpiWarpBytes = kEpiRows * kEpiStride * 4;

/* Launched with PDL, the warp-specialized kernel copies the weights of this
 * many stages before it waits (wgmma_ws_kernel). */
constexpr int kPdlEarly = 2;

template <int STAGES, int PW, int CW = 2, int MI = 1, int BA = 128>
struct CfgWS {
    /* weight rows: CW consumer warpgroups x MI slices of 64 */
    static constexpr int kBW = 64 * CW * MI;
    static constexpr int kBA = BA; /* activation rows: wgmma's n */
    static constexpr int kBK = 128;
    static constexpr int kExpanders = 128 * PW;
    static constexpr int kConsumers = 128 * CW;
    static constexpr int kIssuerWarp = 4 * PW + 4 * CW;
    /* More than two consumer warpgroups, or two slices each: the issuer is
     * a whole warpgroup that hands its registers to the consumers
     * (setmaxnreg), since the default split of the register file (by the
     * warps each scheduler holds) would leave a consumer thread too few and
     * serialize its wgmma (C7511/C7512). */
    static constexpr int kIssuerWarps = CW > 2 || MI > 1 ? 4 : 1;
    static constexpr int kIssuerRegs = 40;
    static constexpr int kConsumerRegs = CW == 3 ? 152 : MI == 2 ? 232 : 0;
    static constexpr int kThreads = kExpanders + kConsumers + 32 * kIssuerWarps;
    static constexpr int kSteps = kBK / 32;
    static constexpr int kActBytes = kBA * kBK;
    static constexpr int kWBytes = PW > 0 ? kBW * kBK : 0; /* expanded to int8 */
    static constexpr int kPackedBytes = kBW * kBK / 4;     /* 2 bits per weight */
    static constexpr int kStageBytes = kActBytes + kWBytes + kPackedBytes;
    /* PW = 0 with two consumer warpgroups: each consumer warp's epilogue
     * staging area (store_warp_staged) after the stages. (With three, the
     * staged epilogue measured slower than store_group: H200, M = 512,
     * 13824 x 2560 45.6 -> 46.6-48.1 us.) */
    static constexpr bool kStagedEpilogue = PW == 0 && CW == 2 && MI == 1;
    static constexpr int kEpilogueBytes = kStagedEpilogue ? kConsumers / 32 * kEpiWarpBytes : 0;
    static constexpr int kSmemBytes = STAGES * kStageBytes + kEpilogueBytes + 1024;
    static constexpr int kPackedPerThread =
        PW > 0 ? kPackedBytes / 16 / (kExpanders > 0 ? kExpanders : 1) : 0; /* entries */
    static constexpr int kAcc = BA / 2; /* m64nBA accumulators per thread */
    /* wgmma groups a consumer keeps in flight: two where the accumulators
     * leave registers for a third fragment set (64 activation rows; H200,
     * M = 512, 2560 x 6912: 21.3 -> 21.0 us); with 128 rows ptxas would
     * serialize the wgmmas (C7512). */
    static constexpr int kDepth = PW == 0 && MI == 1 && BA == 64 ? 2 : 1;
    static_assert(PW >= 0 && PW <= 2, "consumers expanding, or one or two expander warpgroups");
    static_assert((CW == 2 && MI == 1) || (PW == 0 && CW == 3 && MI == 1) ||
                      (PW == 0 && CW == 2 && MI == 2),
                  "the expanders are laid out for two consumer warpgroups of one slice");
    static_assert(PW == 0 || kPackedPerThread * kExpanders * 16 == kPackedBytes,
                  "even expansion split");
    static_assert(kPackedBytes == kBW / kTileRows * 256, "layout tiles x 256 bytes per k-tile");
    static_assert(kStageBytes % 1024 == 0 && kActBytes % 1024 == 0, "swizzle alignment");
    static_assert(kSmemBytes <= 227 * 1024, "fits one block's shared memory");
    static_assert(BA == 128 || BA == 64, "wgmma_rs's widths");
    static_assert(PW == 0 || BA == 128, "the expander path issues wgmma_ss<128>");
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
 * its stream-K range cut at tile boundaries. (A form that ran every full
 * wave of G tiles whole and shared only the remaining tiles measured slower:
 * docs/KERNELS.md.) */
struct Segments {
    int64_t n_kt, n_tiles, grid, next, end;
    bool streamk;

    __host__ __device__ Segments(int64_t b, int64_t grid_, int64_t n_tiles_, int64_t n_kt_,
                                 bool streamk_)
        : n_kt(n_kt_), n_tiles(n_tiles_), grid(grid_), streamk(streamk_)
    {
        if (streamk) {
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

__device__ __forceinline__ float epilogue(int32_t acc, float act_scale, float w_scale)
{
    /* Written exactly as bn_w2a8_epilogue: IEEE division and multiply. */
    return __fmul_rn(__fdiv_rn((float)acc, act_scale), w_scale);
}

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
                        yrow[col] = epilogue(acc[i][4 * j + 2 * half + h] - sum, sc, w_scale);
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
                    o[e] = epilogue(qa[e] - sum, sc, w_scale);
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

/* Generic-proxy writes (cp.async) -> visible to the async proxy (wgmma). */
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

/* accumulate 0: d = A B (scale-d false), as wgmma_ss below. */
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

/* Both operands from shared memory: PTX ISA integer form
 * wgmma.mma_async.sync.aligned.shape.s32.atype.btype d, a-desc, b-desc,
 * scale-d (no scale/transpose immediates for integer types; A and B are
 * both K-major). */
template <int N>
__device__ __forceinline__ void wgmma_ss(int32_t (&d)[N / 2], uint64_t adesc, uint64_t bdesc,
                                         int accumulate = 1);

/* accumulate 0: d = A B, the old d ignored (scale-d false), so a new tile
 * needs no zeroing instructions between wgmmas (ptxas serializes wgmma
 * whose accumulators other instructions define, C7515). */
template <>
__device__ __forceinline__ void wgmma_ss<128>(int32_t (&d)[64], uint64_t adesc, uint64_t bdesc,
                                              int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                 "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                 "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                 "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
                 "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
                 "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
                 "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
                 "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "l"(adesc), "l"(bdesc), "r"(accumulate)
                 : "memory");
}

/* A warpgroup's registers per thread from here on (all its warps execute
 * it): fewer for the copy issuer, more for the consumers. */
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

#endif /* BN_WGMMA_DEVICE */

/*
 * Grid: x = activation block (BA rows; the blocks sharing a weight tile are
 * adjacent, so the weights come from DRAM once and from L2 for the others),
 * y = weight block (BW rows).
 */
template <int WG, int MI, int BA, int BK, int STAGES, int MIN_BLOCKS, bool SPLITK>
__global__ void __launch_bounds__(128 * WG, MIN_BLOCKS)
    wgmma_kernel(const uint8_t *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                 int64_t m, int64_t n, int64_t tiles, int64_t groups, int split,
                 const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                 float w_scale, float *__restrict__ y, int64_t ldy)
{
#if BN_WGMMA_DEVICE
    using C = Cfg<WG, MI, BA, BK, STAGES, MIN_BLOCKS>;
    constexpr int S = STAGES;
    constexpr int kSteps = C::kSteps;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sbase = (raw + 1023u) & ~1023u;
    const uint8_t *const sptr = smem_raw + (sbase - raw);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = warp >> 2, wq = warp & 3;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t tile0 = (int64_t)blockIdx.y * C::kWTiles;
    /* k-tiles of BK; k_padded (256 groups) is a multiple of BK. Without
     * split-K the block runs all of them (kt0 = 0); with it, its slice. */
    int n_kt = (int)(groups * (256 / BK));
    int kt0 = 0, rank = 0;
    int64_t m_block = blockIdx.x;
    if constexpr (SPLITK) {
        if (split > 1) {
            rank = (int)cooperative_groups::this_cluster().block_rank();
            m_block = blockIdx.x / (unsigned)split;
            split_range(n_kt, split, rank, kt0, n_kt);
        }
    }
    const int64_t m0 = m_block * BA;

    /* Queues the copies of k-tile kt into slot `slot`. */
    auto load_stage = [&](int slot, int kt) {
        const uint32_t as = sbase + (uint32_t)(slot * C::kStageBytes);
        const uint32_t ws = as + C::kActBytes;
#pragma unroll
        for (int p = 0; p < C::kActChunks / C::kThreads; p++) {
            const int c = p * C::kThreads + tid;
            const int row = c / (BK / 16), chunk = c % (BK / 16);
            const bool ok = m0 + row < m;
            const int8_t *src =
                ok ? x + (m0 + row) * ldx + (int64_t)(kt0 + kt) * BK + chunk * 16 : x;
            cp_async<16>(as + act_offset<BA>(row, chunk), src, ok);
        }
#pragma unroll
        for (int p = 0; p < C::kWChunks / C::kThreads; p++) {
            const int c = p * C::kThreads + tid;
            const int t = c / (C::kWTileBytes / 16), e = c % (C::kWTileBytes / 16);
            const bool ok = tile0 + t < tiles;
            /* Tile t's blocks are contiguous, (t G + g) 512: k-tile kt is
             * the 2 BK bytes from kt * 2 BK on. */
            const uint8_t *src = ok ? w + (tile0 + t) * groups * kBlockBytes +
                                          (int64_t)(kt0 + kt) * C::kWTileBytes + e * 16
                                    : w;
            cp_async<16>(ws + (uint32_t)(t * C::kWTileBytes + e * 16), src, ok);
        }
    };

    int32_t acc[MI][C::kAcc];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int v = 0; v < C::kAcc; v++)
            acc[i][v] = 0;

    /* Prologue: k-tiles 0 .. S - 2 in flight; a group is committed even when
     * empty so the group count stays uniform. */
#pragma unroll
    for (int st = 0; st < S - 1; st++) {
        if (st < n_kt)
            load_stage(st, st);
        cp_async_commit();
    }

    for (int it = 0; it < n_kt; it++) {
        /* k-tile it has landed (this thread's copies; after the barrier,
         * everyone's). Every warpgroup finished k-tile it - 1 (wait_group 0)
         * before the barrier, so its slot is free for k-tile it + S - 1. */
        cp_async_wait<S - 2>();
        fence_proxy_async();
        __syncthreads();
        const int pre = it + S - 1;
        if (pre < n_kt)
            load_stage(pre % S, pre);
        cp_async_commit();

        const int slot = it % S;
        const uint8_t *wsp = sptr + slot * C::kStageBytes + C::kActBytes;
        uint32_t frag[MI][kSteps][4];
#pragma unroll
        for (int i = 0; i < MI; i++) {
            const int t = frag_tile<MI>(g, i, wq);
#pragma unroll
            for (int q = 0; q < BK / 64; q++)
                packed_to_frags(wsp, t, C::kWTileBytes, q, gid, tig, frag[i], 2 * q);
        }
        /* All fragment and accumulator registers are final before the fence. */
#pragma unroll
        for (int i = 0; i < MI; i++) {
#pragma unroll
            for (int s = 0; s < kSteps; s++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    pin(frag[i][s][r]);
#pragma unroll
            for (int v = 0; v < C::kAcc; v++)
                pin(acc[i][v]);
        }
        wgmma_fence();
        const uint32_t stage_addr = sbase + (uint32_t)(slot * C::kStageBytes);
#pragma unroll
        for (int s = 0; s < kSteps; s++) {
            const uint64_t desc = sw128_desc(stage_addr + act_step_offset<BA>(s));
#pragma unroll
            for (int i = 0; i < MI; i++)
                wgmma_rs<BA>(acc[i], frag[i][s], desc);
        }
        wgmma_commit();
        /* Retire the whole group: the fragments are rewritten next k-tile
         * (ptxas serializes wgmma whose A registers are redefined while an
         * older group is in flight), and the slot is refilled. */
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int v = 0; v < C::kAcc; v++)
                pin(acc[i][v]);
    }
    cp_async_wait<0>();

    if constexpr (SPLITK) {
        if (split > 1) {
            /* Every block parks its partial accumulators in its own shared
             * memory; after a cluster barrier block `rank` sums the groups j
             * it owns from all blocks, in rank order (distributed shared
             * memory), and stores them; a second barrier keeps the partials
             * alive until every block has read them. */
            namespace cg = cooperative_groups;
            cg::cluster_group cluster = cg::this_cluster();
            int4 *red = reinterpret_cast<int4 *>(smem_raw + (sbase - raw));
            static_assert((size_t)MI * C::kAcc * C::kThreads * 4 <= (size_t)STAGES * C::kStageBytes,
                          "the partials fit in the pipeline buffers");
            __syncthreads(); /* every warpgroup retired its wgmma (wait_group 0) */
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < BA / 8; j++)
                    red[red_index<MI, BA, C::kThreads>(i, j, tid)] =
                        make_int4(acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2],
                                  acc[i][4 * j + 3]);
            cluster.sync(); /* release/acquire: the partials are visible cluster-wide */
#pragma unroll
            for (int j = 0; j < BA / 8; j++) {
                if (!split_owns(j, split, rank))
                    continue;
#pragma unroll
                for (int i = 0; i < MI; i++) {
                    const int idx = red_index<MI, BA, C::kThreads>(i, j, tid);
                    int4 t = make_int4(0, 0, 0, 0);
                    for (int q = 0; q < split; q++) {
                        const int4 v = cluster.map_shared_rank(red, q)[idx];
                        t.x += v.x;
                        t.y += v.y;
                        t.z += v.z;
                        t.w += v.w;
                    }
                    acc[i][4 * j] = t.x;
                    acc[i][4 * j + 1] = t.y;
                    acc[i][4 * j + 2] = t.z;
                    acc[i][4 * j + 3] = t.w;
                }
            }
            cluster.sync(); /* no block leaves while another still reads its partials */
        }
    }

    /* Epilogue (store_group). */
    const int64_t col0 = tile0 * kTileRows + 16 * wq + gid;
#pragma unroll
    for (int j = 0; j < BA / 8; j++) {
        if (SPLITK && split > 1 && !split_owns(j, split, rank))
            continue; /* another block of the cluster stores it */
        store_group<MI>(acc, j, m0, m, n, col0, MI * g, tig, act_scale + m0, act_sum + m0,
                        w_scale, y, ldy);
    }
#else
    (void)w, (void)x, (void)ldx, (void)m, (void)n, (void)tiles, (void)groups, (void)split;
    (void)act_scale;
    (void)act_sum, (void)w_scale, (void)y, (void)ldy;
#endif
}

/*
 * Configuration 128x128 ss: both wgmma operands from shared memory. The
 * threads expand each stage's packed weights into an int8 slot laid out as
 * the activation tile (K-major, 128-byte swizzle), so A is a descriptor
 * like B and no A register is defined between wgmmas: a warpgroup keeps
 * one wgmma group in flight (wait_group 1) while the block expands the
 * next k-tile. Iteration it:
 *
 *     cp.async.wait (this thread's copies of k-tile it landed)
 *     expand the packed chunks this thread copied -> slot it % ASLOTS
 *     fence.proxy.async ; __syncthreads
 *     cp.async k-tile it + S - 2 into the slot of k-tile it - 2
 *     wgmma.fence ; BK / 32 x MI wgmma (A, B descriptors) ; commit ;
 *     wgmma.wait_group 1
 *
 * Each thread expands exactly the packed chunks it copied itself, so no
 * barrier is needed between its cp.async.wait and its expansion.
 * Reuse: a thread passing the barrier of iteration it - 1 knows that every
 * thread finished iteration it - 2, whose wait_group 1 retired group
 * it - 3: groups it - 2 and it - 1 may still read their expanded slots, so
 * slot it % ASLOTS is free when ASLOTS >= 3. After the barrier of
 * iteration it, every thread finished iteration it - 1 (group it - 2
 * retired), so the stage of k-tile it - 2 may be refilled (prefetch
 * distance S - 2; group it - 1 still reads stage it - 1).
 */
template <int WG, int MI, int BA, int BK, int STAGES, int MIN_BLOCKS, int ASLOTS>
__global__ void __launch_bounds__(128 * WG, MIN_BLOCKS)
    wgmma_ss_kernel(const uint8_t *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                    int64_t m, int64_t n, int64_t tiles, int64_t groups, int split,
                    const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                    float w_scale, float *__restrict__ y, int64_t ldy)
{
#if BN_WGMMA_DEVICE
    using C = CfgSS<WG, MI, BA, BK, STAGES, MIN_BLOCKS, ASLOTS>;
    constexpr int S = STAGES;
    constexpr int kSteps = C::kSteps;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sbase = (raw + 1023u) & ~1023u;
    uint8_t *const sptr = smem_raw + (sbase - raw);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = warp >> 2, wq = warp & 3;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t tile0 = (int64_t)blockIdx.y * C::kWTiles;
    const int n_kt = (int)(groups * (256 / BK));
    const int64_t m0 = (int64_t)blockIdx.x * BA;
    (void)split;

    /* Queues the copies of k-tile kt into slot `slot` (as wgmma_kernel). */
    auto load_stage = [&](int slot, int kt) {
        const uint32_t as = sbase + (uint32_t)(slot * C::kStageBytes);
        const uint32_t ws = as + C::kActBytes;
#pragma unroll
        for (int p = 0; p < C::kActChunks / C::kThreads; p++) {
            const int c = p * C::kThreads + tid;
            const int row = c / (BK / 16), chunk = c % (BK / 16);
            const bool ok = m0 + row < m;
            const int8_t *src = ok ? x + (m0 + row) * ldx + (int64_t)kt * BK + chunk * 16 : x;
            cp_async<16>(as + act_offset<BA>(row, chunk), src, ok);
        }
#pragma unroll
        for (int p = 0; p < C::kWChunks / C::kThreads; p++) {
            const int c = p * C::kThreads + tid;
            const int t = c / (C::kWTileBytes / 16), e = c % (C::kWTileBytes / 16);
            const bool ok = tile0 + t < tiles;
            const uint8_t *src = ok ? w + (tile0 + t) * groups * kBlockBytes +
                                          (int64_t)kt * C::kWTileBytes + e * 16
                                    : w;
            cp_async<16>(ws + (uint32_t)(c * 16), src, ok);
        }
    };

    int32_t acc[MI][C::kAcc];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int v = 0; v < C::kAcc; v++)
            acc[i][v] = 0;

    /* Prologue: k-tiles 0 .. S - 3 in flight (one group each, even empty). */
#pragma unroll
    for (int st = 0; st < S - 2; st++) {
        if (st < n_kt)
            load_stage(st, st);
        cp_async_commit();
    }

    for (int it = 0; it < n_kt; it++) {
        const int slot = it % S, aslot = it % ASLOTS;
        cp_async_wait<S - 3>(); /* this thread's copies of k-tile it */
        {
            const uint8_t *wsp = sptr + slot * C::kStageBytes + C::kActBytes;
            uint8_t *ap = sptr + C::kARing + aslot * C::kASlotBytes;
#pragma unroll
            for (int p = 0; p < C::kWChunks / C::kThreads; p++) {
                const int c = p * C::kThreads + tid;
                const uint4 v = *reinterpret_cast<const uint4 *>(wsp + c * 16);
                const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
                int row, chunk0;
                ss_entry<BK>(c, row, chunk0);
#pragma unroll
                for (int i = 0; i < 4; i++)
                    *reinterpret_cast<uint4 *>(ap + act_offset<C::kBW>(row, chunk0 + i)) =
                        make_uint4(expand_codes(wd[i], 0), expand_codes(wd[i], 1),
                                   expand_codes(wd[i], 2), expand_codes(wd[i], 3));
            }
        }
        /* This thread's cp.async and expanded writes -> async proxy; after
         * the barrier, everyone's. */
        fence_proxy_async();
        __syncthreads();
        const int pre = it + S - 2;
        if (pre < n_kt)
            load_stage(pre % S, pre);
        cp_async_commit();

        wgmma_fence();
        const uint32_t stage_addr = sbase + (uint32_t)(slot * C::kStageBytes);
        const uint32_t a_addr = sbase + (uint32_t)(C::kARing + aslot * C::kASlotBytes);
#pragma unroll
        for (int s = 0; s < kSteps; s++) {
            const uint64_t bdesc = sw128_desc(stage_addr + act_step_offset<BA>(s));
#pragma unroll
            for (int i = 0; i < MI; i++)
                wgmma_ss<BA>(acc[i], sw128_desc(a_addr + ss_a_step_offset<C::kBW>(MI * g + i, s)),
                             bdesc);
        }
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int v = 0; v < C::kAcc; v++)
            pin(acc[i][v]);
    cp_async_wait<0>();

    /* Epilogue (store_group). */
    const int64_t col0 = tile0 * kTileRows + 16 * wq + gid;
#pragma unroll
    for (int j = 0; j < BA / 8; j++)
        store_group<MI>(acc, j, m0, m, n, col0, MI * g, tig, act_scale + m0, act_sum + m0,
                        w_scale, y, ldy);
#else
    (void)w, (void)x, (void)ldx, (void)m, (void)n, (void)tiles, (void)groups, (void)split;
    (void)act_scale;
    (void)act_sum, (void)w_scale, (void)y, (void)ldy;
#endif
}

#if BN_WGMMA_DEVICE

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

#endif /* BN_WGMMA_DEVICE */

/* PDL: launched with programmatic stream serialization (its own
 * instantiation, so the kernel without it keeps its code as it was). */
template <int STAGES, int PW, int CW, int MI, int BA, bool PDL>
__global__ void __launch_bounds__(CfgWS<STAGES, PW, CW, MI, BA>::kThreads, 1)
    wgmma_ws_kernel(int64_t m, int64_t n, int64_t tiles, int64_t groups, int64_t m_blocks,
                    int64_t n_tiles, const float *__restrict__ act_scale,
                    const int32_t *__restrict__ act_sum, float w_scale, float *__restrict__ y,
                    int64_t ldy, int32_t *__restrict__ streamk,
                    const __grid_constant__ CUtensorMap act_map,
                    const __grid_constant__ CUtensorMap w_map)
{
#if BN_WGMMA_DEVICE
    using C = CfgWS<STAGES, PW, CW, MI, BA>;
    constexpr int S = STAGES;
    constexpr int BK = C::kBK;
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full_bar[S], empty_bar[S], copied_bar[S];
    /* The epilogue's scales and sums of a segment's tile, copied while its
     * k-tiles run (two buffers: segments alternate). */
    __shared__ __align__(16) float tile_scale[2][C::kBA];
    __shared__ __align__(16) int32_t tile_sum[2][C::kBA];
    __shared__ int last_segment;
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw);
    const uint32_t sbase = (raw + 1023u) & ~1023u;
    uint8_t *const sptr = smem_raw + (sbase - raw);
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(full_bar);
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
            if (PW > 0)
                mbar_init(full0 + 8 * st, C::kExpanders);
            mbar_init(empty0 + 8 * st, C::kConsumers);
            mbar_init(copied0 + 8 * st, 1); /* one expect_tx arrival + the bytes */
        }
    }
    __syncthreads();
    if constexpr (PDL)
        pdl_trigger();

    Segments segs(b, grid, n_tiles, n_kt, streamk != nullptr);
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
                        tma_load_2d(sbase + (uint32_t)(st * C::kStageBytes) + C::kActBytes +
                                        C::kWBytes,
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
                    tma_load_2d(as + C::kActBytes + C::kWBytes, &w_map, kt * 2 * BK, (int)tile0,
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
        return;
    }

    if (PW > 0 && warp < 4 * PW) {
        /* ---- expanders ----
         * Packed entry c = q kExpanders + tid of a k-tile: layout tile c / 16,
         * entry c % 16 (ss_entry), i.e. row 8 (c / 16) + c % 8 of the block, k
         * chunks 4 ((c % 16) / 8) .. + 3, whose swizzle term depends on
         * c % 8 = tid % 8 only: the addresses are fixed per thread. */
        const int went = tid & 15;
        const int wrow = 8 * (tid >> 4) + (went & 7), wchunk0 = 4 * (went >> 3);
        if constexpr (PDL)
            pdl_wait(); /* (shared memory only; every thread waits, pdl.cuh) */
        int slot = 0;
        uint32_t phase = 0;
        while (segs.take(tile, kt0, kt1)) {
            for (int kt = kt0; kt < kt1; kt++) {
                mbar_wait(copied0 + 8 * slot, phase);
                const uint8_t *pk = sptr + slot * C::kStageBytes + C::kActBytes + C::kWBytes;
                uint8_t *ap = sptr + slot * C::kStageBytes + C::kActBytes;
#pragma unroll
                for (int q = 0; q < C::kPackedPerThread; q++) {
                    const uint4 v =
                        *reinterpret_cast<const uint4 *>(pk + (q * C::kExpanders + tid) * 16);
                    const uint32_t wd[4] = {v.x, v.y, v.z, v.w};
                    uint8_t *rowp = ap + (q * (C::kExpanders / 2) + wrow) * 128;
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        *reinterpret_cast<uint4 *>(rowp + (((wchunk0 + j) ^ (wrow & 7)) << 4)) =
                            make_uint4(expand_codes(wd[j], 0), expand_codes(wd[j], 1),
                                       expand_codes(wd[j], 2), expand_codes(wd[j], 3));
                }
                fence_proxy_async();
                mbar_arrive(full0 + 8 * slot);
                if (++slot == S) {
                    slot = 0;
                    phase ^= 1u;
                }
            }
        }
        return;
    }

    /* ---- consumer warpgroups ---- */
    if constexpr (C::kIssuerWarps == 4)
        setmaxnreg_inc<C::kConsumerRegs>();
    const int ctid = tid - C::kExpanders; /* 0 .. kConsumers - 1 */
    const int cg = (warp >> 2) - PW, wq = warp & 3;
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
        if constexpr (PW > 0) {
            for (int kt = kt0; kt < kt1; kt++) {
                mbar_wait(full0 + 8 * slot, phase);
                mbar_wait(copied0 + 8 * slot, phase);
                wgmma_fence();
                const uint32_t stage_addr = sbase + (uint32_t)(slot * C::kStageBytes);
                const uint32_t a_addr = stage_addr + C::kActBytes;
#pragma unroll
                for (int st = 0; st < C::kSteps; st++)
                    wgmma_ss<128>(acc[0], sw128_desc(a_addr + ss_a_step_offset<C::kBW>(cg, st)),
                                  sw128_desc(stage_addr + act_step_offset<C::kBA>(st)),
                                  kt > kt0 || st > 0);
                retire(kt);
            }
        } else if constexpr (MI == 2) {
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
             * into A fragments (as wgmma_kernel; frag_tile, frag_reg) from
             * the stage's packed box, laid out as wgmma_kernel's stage.
             * kDepth + 1 fragment sets, taken in turn by k-tile: the set
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
        if constexpr (MI == 1) /* stream-K: one slice a warpgroup (LaunchWS) */
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

} // namespace

/*
 * The split-K factor (1-8) that minimises a model of the busiest SM, in
 * units of one k-tile of a block alone on its SM (H200, variant 7 at
 * M = 512: about 0.7 us; two blocks sharing an SM take about 1.8 units per
 * k-tile each). `blocks` output tiles x split slices are spread over `sms`
 * SMs, two at a time; each sequential pair also pays a fixed 3 units
 * (pipeline fill and epilogue) and a split one more (the cluster
 * exchange). Only splits whose every slice is non-empty count, and a split
 * is taken only when it gains at least 3 % over the best smaller one.
 * Host-only.
 */
inline int choose_split(int64_t blocks, int64_t n_kt, int sms)
{
    int best = 1;
    double best_cost = 0.0;
    for (int s = 1; s <= BN_W2A8_WGMMA_MAX_SPLIT && s <= n_kt; s++) {
        const int64_t per = (n_kt + s - 1) / s;
        if ((n_kt + per - 1) / per != s)
            continue;
        const int64_t c = (blocks * s + sms - 1) / sms; /* blocks on the busiest SM */
        const double cost = (double)(c / 2 * 1.8 + (double)(c % 2)) * (double)per +
                            3.0 * (double)((c + 1) / 2) + (s > 1 ? 1.0 : 0.0);
        if (s == 1 || cost < 0.97 * best_cost) {
            best = s;
            best_cost = cost;
        }
    }
    return best;
}

/* split <= 0: chosen for the shape; otherwise clamped to 1..MAX_SPLIT and
 * to the k-tiles, then reduced so every slice is non-empty. */
inline int effective_split(int64_t m, int64_t tiles, int64_t groups, int sm_count, int ba,
                           int w_tiles, int bk, int split)
{
    const int64_t n_kt = groups * (256 / bk);
    if (split <= 0) {
        const int64_t blocks = ((m + ba - 1) / ba) * ((tiles + w_tiles - 1) / w_tiles);
        split = choose_split(blocks, n_kt, sm_count > 0 ? sm_count : 132);
    }
    if (split > BN_W2A8_WGMMA_MAX_SPLIT)
        split = BN_W2A8_WGMMA_MAX_SPLIT;
    if (split > n_kt)
        split = (int)n_kt;
    if (split <= 1)
        return 1;
    const int64_t per = (n_kt + split - 1) / split;
    return (int)((n_kt + per - 1) / per);
}

namespace {

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

/* ASLOTS 0: wgmma_kernel; otherwise wgmma_ss_kernel with that many
 * expanded-weight slots (no split-K). */
template <int WG, int MI, int BA, int BK, int STAGES, int MIN_BLOCKS, bool SPLITK, int ASLOTS = 0>
struct Launch {
    using C = Cfg<WG, MI, BA, BK, STAGES, MIN_BLOCKS>;
    static_assert(!(SPLITK && ASLOTS), "the ss kernel has no split-K");

    static constexpr int smem_bytes()
    {
        if constexpr (ASLOTS > 0)
            return CfgSS<WG, MI, BA, BK, STAGES, MIN_BLOCKS, ASLOTS>::kSmemBytes;
        else
            return C::kSmemBytes;
    }

    static auto kernel_fn()
    {
        if constexpr (ASLOTS > 0)
            return wgmma_ss_kernel<WG, MI, BA, BK, STAGES, MIN_BLOCKS, ASLOTS>;
        else
            return wgmma_kernel<WG, MI, BA, BK, STAGES, MIN_BLOCKS, SPLITK>;
    }

    static int split_for(const bn_w2a8_cuda_args *a, int split)
    {
        if (!SPLITK)
            return 1;
        return effective_split(a->m, a->tiles, a->groups, a->sm_count, BA, C::kWTiles, BK, split);
    }

    static cudaError_t run(const bn_w2a8_cuda_args *a, int split, cudaStream_t stream)
    {
        bool nothing = false;
        cudaError_t rc = prepare(a, kernel_fn(), smem_bytes(), &nothing);
        if (rc != cudaSuccess || nothing)
            return rc;
        split = split_for(a, split);
        const int64_t m_blocks = (a->m + BA - 1) / BA;
        const int64_t n_blocks = (a->tiles + C::kWTiles - 1) / C::kWTiles;
        if (n_blocks > 65535 || m_blocks * split > 0x7fffffff || 2 * a->groups > 0x7fffffff)
            return cudaErrorInvalidConfiguration;
        auto kernel = kernel_fn();
        constexpr int kSmemBytes = smem_bytes();
        const dim3 grid((unsigned)(m_blocks * split), (unsigned)n_blocks);
        const uint8_t *w = static_cast<const uint8_t *>(a->weights);
        if (split == 1) {
            kernel<<<grid, C::kThreads, kSmemBytes, stream>>>(
                w, a->x, a->ldx, a->m, a->n, a->tiles, a->groups, 1, a->act_scale, a->act_sum,
                a->weight_scale, a->y, a->ldy);
            return cudaGetLastError();
        }
        /* The split blocks of one output tile: one cluster along x. */
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = dim3(C::kThreads);
        cfg.dynamicSmemBytes = kSmemBytes;
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
 * through a->streamk. */
template <int STAGES, int PW, int CW = 2, int MI = 1, int BA = 128>
struct LaunchWS {
    using C = CfgWS<STAGES, PW, CW, MI, BA>;

    static cudaError_t run(const bn_w2a8_cuda_args *a, bool streamk, cudaStream_t stream)
    {
        auto kernel = a->pdl ? wgmma_ws_kernel<STAGES, PW, CW, MI, BA, true>
                             : wgmma_ws_kernel<STAGES, PW, CW, MI, BA, false>;
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
        const unsigned grid = (unsigned)(units < sms ? units : sms);
        return pdl_launch(kernel, dim3(grid), dim3(C::kThreads), (size_t)C::kSmemBytes, stream,
                          a->pdl, a->m, a->n, a->tiles, a->groups, m_blocks, n_tiles,
                          a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy,
                          streamk ? a->streamk : nullptr, act_map, w_map);
    }
};

} // namespace
} // namespace bn_wgmma

extern "C" int bn_w2a8_cuda_gemm_wgmma_compiled(void)
{
    return BN_W2A8_WGMMA_SM90A;
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_wgmma_split(const bn_w2a8_cuda_args *a, int config,
                                                     int split, cudaStream_t stream)
{
    using namespace bn_wgmma;
    switch (config) {
    /*                                  WG MI  BA   BK  S  blocks/SM split-K */
    case BN_W2A8_WGMMA_256X128: return Launch<2, 2, 128, 128, 6, 1, false>::run(a, 1, stream);
    case BN_W2A8_WGMMA_128X128_1WG: return Launch<1, 2, 128, 128, 4, 2, false>::run(a, 1, stream);
    case BN_W2A8_WGMMA_128X128: return Launch<2, 1, 128, 128, 4, 2, false>::run(a, 1, stream);
    case BN_W2A8_WGMMA_128X128_SPLITK:
        return Launch<2, 1, 128, 128, 4, 2, true>::run(a, split, stream);
    case BN_W2A8_WGMMA_128X128_SS:
        return Launch<2, 1, 128, 128, 6, 1, false, 3>::run(a, 1, stream);
    /*                                         S  expander warpgroups */
    case BN_W2A8_WGMMA_128X128_TMA: return LaunchWS<6, 1>::run(a, false, stream);
    case BN_W2A8_WGMMA_128X128_TMA_STREAMK: return LaunchWS<6, 1>::run(a, true, stream);
    case BN_W2A8_WGMMA_128X128_TMA_RS: return LaunchWS<8, 0>::run(a, false, stream);
    case BN_W2A8_WGMMA_128X128_TMA_RS_STREAMK: return LaunchWS<8, 0>::run(a, true, stream);
    /*                                         S  expanders  consumer warpgroups */
    case BN_W2A8_WGMMA_192X128_TMA_RS: return LaunchWS<8, 0, 3>::run(a, false, stream);
    case BN_W2A8_WGMMA_192X128_TMA_RS_STREAMK: return LaunchWS<8, 0, 3>::run(a, true, stream);
    /*                                         S  expanders  consumers  slices each */
    case BN_W2A8_WGMMA_256X128_TMA_RS: return LaunchWS<8, 0, 2, 2>::run(a, false, stream);
    /*                                       S  expanders  consumers  slices  act rows */
    case BN_W2A8_WGMMA_192X64_TMA_RS: return LaunchWS<8, 0, 3, 1, 64>::run(a, false, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_wgmma(const bn_w2a8_cuda_args *a, int config,
                                               cudaStream_t stream)
{
    return bn_w2a8_cuda_gemm_wgmma_split(a, config, 0, stream);
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

extern "C" int bn_w2a8_cuda_gemm_wgmma_split_factor(const bn_w2a8_cuda_args *a, int config,
                                                    int split)
{
    using namespace bn_wgmma;
    if (config != BN_W2A8_WGMMA_128X128_SPLITK)
        return 1;
    return Launch<2, 1, 128, 128, 4, 2, true>::split_for(a, split);
}
