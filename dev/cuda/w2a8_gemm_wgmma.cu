/*
 * w2a8_gemm_wgmma.cu - lab: the W2A8 GEMM on Hopper's warpgroup tensor-core
 * instruction (wgmma.mma_async m64nNk32 .s32.s8.s8) in its plain form, one
 * block per output tile, every thread copying (cp.async) and every
 * warpgroup computing. The product ships the warp-specialized, persistent
 * form (src/cuda/w2a8_gemm_wgmma.cu: tensor-memory-accelerator copies,
 * stream-K), which measured faster on every benchmark shape; this lab keeps
 * the plain kernels it grew from, checked bit for bit against the CPU and
 * timed:
 *
 *   1  256x128      2 warpgroups x 2 slices, 6 stages, 1 block per SM
 *   2  128x128 1wg  1 warpgroup x 2 slices, 4 stages, 2 blocks per SM
 *   3  128x128      2 warpgroups x 1 slice, 4 stages, 2 blocks per SM
 *   4  128x128 split-K: as 3, K split over a thread-block cluster where the
 *      tiles do not fill the GPU (partials summed through distributed
 *      shared memory; the split from a model of the busiest SM)
 *   5  128x128 ss: both operands from shared memory, the weights expanded
 *      into a swizzled int8 tile there, one wgmma group in flight
 *
 * (weight rows x activation rows). Needs an sm_90a build and a compute
 * capability 9.0 device.
 *
 * usage: w2a8_gemm_wgmma [KERNEL] [M] [NxK ...]   (KERNEL 0: all; M 512)
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
 * Configurations (weight rows x activation rows): the five kernels above.
 *   256x128 BK 128, 24 KB per stage (BK 256 spills: 64 fragment registers);
 *   128x128 1wg and 128x128 20 KB per stage; 128x128 ss 6 stages + 3
 *   expanded 16 KB slots, 169 KB (wgmma_ss_kernel, below).
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
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include <cooperative_groups.h>

#include "common.cuh"
#include "cp_async.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BN_WGMMA_DEVICE 1
#else
#define BN_WGMMA_DEVICE 0
#endif

namespace bn_wgmma {

constexpr int kMaxSplit = 8;  /* the most blocks splitting one tile's K (kernel 4) */
constexpr int kTileRows = 8;     /* weight rows per layout tile               */
[[maybe_unused]] constexpr int kBlockBytes = 512; /* one tile's chunk-group (cuda_layout.h) */

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
 * check passes); other rows divide with __fdiv_rn. The product's test_cuda_kernels
 * compares the two on random pairs (bn_w2a8_cuda_division_check). */
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

/*
 * The split-K factor (1-8) that minimises a model of the busiest SM, in
 * units of one k-tile of a block alone on its SM (H200, kernel 3 at
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
    for (int s = 1; s <= kMaxSplit && s <= n_kt; s++) {
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
    if (split > kMaxSplit)
        split = kMaxSplit;
    if (split > n_kt)
        split = (int)n_kt;
    if (split <= 1)
        return 1;
    const int64_t per = (n_kt + split - 1) / split;
    return (int)((n_kt + per - 1) / per);
}

/* The checks and function attributes every wgmma launch needs: sm_90a code
 * on a 9.0 device (else cudaErrorNotSupported), 16-byte aligned operands
 * (cp.async), the kernel's dynamic shared memory. *nothing: an empty
 * product, no launch needed. */
template <typename Kernel>
cudaError_t prepare(const w2a8_args *a, Kernel kernel, int smem, bool *nothing)
{
    *nothing = false;
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

    static int split_for(const w2a8_args *a, int split)
    {
        if (!SPLITK)
            return 1;
        return effective_split(a->m, a->tiles, a->groups, a->sm_count, BA, C::kWTiles, BK, split);
    }

    static cudaError_t run(const w2a8_args *a, int split, cudaStream_t stream)
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

/* Kernel `kernel` (1-5; the table at the top). */
cudaError_t run(int kernel, const w2a8_args *a, cudaStream_t stream)
{
    switch (kernel) {
    /*                     WG MI  BA   BK  S  blocks/SM split-K */
    case 1: return Launch<2, 2, 128, 128, 6, 1, false>::run(a, 1, stream);
    case 2: return Launch<1, 2, 128, 128, 4, 2, false>::run(a, 1, stream);
    case 3: return Launch<2, 1, 128, 128, 4, 2, false>::run(a, 1, stream);
    case 4: return Launch<2, 1, 128, 128, 4, 2, true>::run(a, 0, stream);
    case 5: return Launch<2, 1, 128, 128, 6, 1, false, 3>::run(a, 1, stream);
    default: return cudaErrorInvalidValue;
    }
}

constexpr int kKernels = 5;
const char *const kNames[kKernels + 1] = {"",          "256x128",         "128x128 1wg",
                                          "128x128",   "128x128 split-K", "128x128 ss"};

} // namespace
} // namespace bn_wgmma

using namespace bn_wgmma;

/* Every kernel (or `only`) on one problem; kernel 4 also at every split. */
static bool check_all(int64_t n, int64_t k, int64_t m, int only, int sms)
{
    Problem p = make_problem(n, k, m);
    const w2a8_args a = p.args(sms);
    bool ok = true;
    for (int kernel = 1; kernel <= kKernels; kernel++) {
        if (only && kernel != only)
            continue;
        for (int split = 0; split <= (kernel == 4 ? kMaxSplit : 0); split++) {
            char what[96];
            snprintf(what, sizeof what, "%lldx%lld M %lld kernel %d%s", (long long)n,
                     (long long)k, (long long)m, kernel, split ? " split" : "");
            poison(p);
            const cudaError_t rc =
                split ? Launch<2, 1, 128, 128, 4, 2, true>::run(&a, split, 0) : run(kernel, &a, 0);
            ok = check(p, rc, what) && ok;
        }
    }
    free_problem(p);
    return ok;
}

int main(int argc, char **argv)
{
    const int only = argc > 1 ? atoi(argv[1]) : 0;
    const int64_t m = argc > 2 ? atoll(argv[2]) : 512;
    if (only < 0 || only > kKernels || m < 1) {
        fprintf(stderr, "usage: %s [KERNEL 1-%d] [M] [NxK ...]\n", argv[0], kKernels);
        return 2;
    }
    lab_shape_list shapes;
    if (!lab_shapes(argc, argv, 3, &shapes))
        return 2;
    int dev = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0) {
        fprintf(stderr, "%s: needs a compute capability 9.0 device (this is %d.%d)\n", argv[0],
                major, minor);
        return 1;
    }
    const int sms = device_sms();

    /* M around the 128-row blocks, N not a multiple of 8 or 256, K not a
     * multiple of 128; then the timed shapes. */
    bool ok = true;
    const int64_t ms[] = {1, 17, 127, 128, 129, 300};
    for (int64_t rows : ms)
        ok = check_all(lab_rand_range(1, 600), lab_rand_range(1, 1500), rows, only, sms) && ok;
    ok = check_all(255, 129, 65, only, sms) && ok;
    for (const auto &s : shapes)
        ok = check_all(s.first, s.second, m, only, sms) && ok;
    printf("check: %s\n\n", ok ? "every kernel bit for bit the CPU's" : "FAILED");

    printf("%d SMs; M = %lld\n\n| N x K | kernel | us | TOPS |\n|---|---|---|---|\n", sms,
           (long long)m);
    for (const auto &s : shapes) {
        Problem p = make_problem(s.first, s.second, m);
        make_copies(p);
        for (int kernel = 1; kernel <= kKernels; kernel++) {
            if (only && kernel != only)
                continue;
            const w2a8_args base = p.args(sms);
            const double us = time_calls([&](int i, cudaStream_t st) {
                w2a8_args a = base;
                a.weights = p.copies[(size_t)i % p.copies.size()];
                return run(kernel, &a, st);
            });
            printf("| %lldx%lld | %d %s | %.2f | %.0f |\n", (long long)s.first,
                   (long long)s.second, kernel, kNames[kernel], us,
                   2.0 * (double)m * (double)s.first * (double)s.second / (us * 1e-6) / 1e12);
        }
        free_problem(p);
    }
    return ok ? 0 : 1;
}
