/*
 * w2a8_gemm_rows.cu - the W2A8 GEMM for a few activation rows (2 to 64,
 * up to 128 on narrow matrices: short prompts, batched decode), where the
 * weights still dominate: the GEMV's weight stream (w2a8_gemv.cuh) met by
 * every row, with dp4a (BN_W2A8_ROWS) or on the tensor cores
 * (BN_W2A8_MMA_ROWS_X2 / X4); and the batched pass's q|k|v product with
 * its epilogue (bn_w2a8_cuda_gemm_qkv).
 *
 * Same contract as every W2A8 kernel (w2a8_cuda.h): weights in the
 * cuda_layout.h tile layout, activations int8 rows of ldx bytes, zero from
 * k to k_padded, and y = ((float)(sum code * x - act_sum) / act_scale) *
 * weight_scale with exact int32 sums, bit-identical to the CPU reference.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "cuda_layout.h"
#include "kv_store.cuh"
#include "pdl.cuh"
#include "rope.cuh"
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

/* The q|k|v epilogue's parameters (bn_w2a8_qkv_out, as the kernel reads
 * them): its columns pair tile t of a head with tile t + pair (pair =
 * head_dim / 16), the two halves of its rotation. */
struct MmaQkv {
    float *q;
    int64_t ldq;
    void *k_cache, *v_cache;
    int kv; /* BN_CB_KV_* */
    const int32_t *pos, *slot;
    const float2 *table;
    int64_t table_len, capacity;
    int q_dim, kv_dim, half, pair;
    float sq, sk, sv;
};

/* The first tile of column c and the step to its next: TW consecutive
 * tiles, or (the q|k|v epilogue, TW = 2) tiles i and i + pair of head
 * c / pair, i = c % pair. */
template <bool kPaired, int TW>
__device__ __forceinline__ int64_t mma_rows_tile0(int64_t c, const MmaQkv &qkv)
{
    if (!kPaired)
        return c * TW;
    const int ci = (int)c, head = ci / qkv.pair; /* columns fit 32 bits (n does) */
    return (int64_t)head * 2 * qkv.pair + (ci - head * qkv.pair);
}

/* Where one output of the q|k|v epilogue goes: its part (0 q, 1 k, 2 v),
 * its index in that part and the part's scale; the (cos, sin) of its
 * rotation pair (NaN where the row's position p is outside the table: its
 * q is then NaN); its cache row (-1: stored nowhere). */
struct QkvDest {
    int region, local, crow;
    float sc;
    float2 cs;
};

/* Output rr of tile t of grid column ci (tiles i and i + pair of head
 * ci / pair, i = ci % pair), of a row at position p with cache row slot,
 * found before the sums are (its table entry loaded meanwhile). 32-bit
 * arithmetic: n fits 32 bits. */
__device__ __forceinline__ QkvDest qkv_dest(const MmaQkv &o, int ci, int t, int rr, int p,
                                            int slot)
{
    const int head = ci / o.pair, ii = ci - head * o.pair;
    const int idx = ((head * 2 + t) * o.pair + ii) * kTileRows + rr;
    QkvDest d;
    d.region = idx < o.q_dim ? 0 : idx < o.q_dim + o.kv_dim ? 1 : 2;
    d.local = d.region == 0 ? idx : d.region == 1 ? idx - o.q_dim : idx - o.q_dim - o.kv_dim;
    d.sc = d.region == 0 ? o.sq : d.region == 1 ? o.sk : o.sv;
    const bool in_table = p >= 0 && (int64_t)p < o.table_len;
    d.cs = make_float2(1.0f, 0.0f);
    if (d.region != 2 && o.half > 0)
        d.cs = in_table ? __ldg(o.table + (int64_t)p * o.half + ii * kTileRows + rr)
                        : make_float2(__int_as_float(0x7fc00000), __int_as_float(0x7fc00000));
    d.crow = d.region == 0 || (o.half > 0 && !in_table) ? -1 : slot;
    return d;
}

/* One output of the q|k|v epilogue (low: the low side of its rotation
 * pair): total and its partner's int32 sums, turned into q, k or v and
 * stored as bn_cb_qkv_post_slots does: raw = the GEMM's value, then the
 * part's scale, RoPE from the table, k and v into the row's cache slot. */
__device__ __forceinline__ void mma_rows_qkv_store(const MmaQkv &o, int64_t row, bool low,
                                                   int32_t total, int32_t partner, int32_t sum,
                                                   float act_scale, float w_scale,
                                                   const QkvDest &d)
{
    const float raw = w2a8_epilogue(total - sum, act_scale, w_scale);
    float v;
    if (d.region == 2 || o.half == 0) {
        v = __fmul_rn(raw, d.sc);
    } else {
        const float praw = w2a8_epilogue(partner - sum, act_scale, w_scale);
        v = rope_pair(__fmul_rn(raw, d.sc), __fmul_rn(praw, d.sc), low, d.cs);
    }
    if (d.region == 0) {
        o.q[row * o.ldq + d.local] = v;
        return;
    }
    if (d.crow < 0 || (int64_t)d.crow >= o.capacity)
        return;
    const int64_t at = (int64_t)d.crow * o.kv_dim + d.local;
    kv_store1(d.region == 1 ? o.k_cache : o.v_cache, o.kv, at, v);
}

/* Block: COLS columns of WARPS warps; column c of weight block wb owns
 * TW tiles from mma_rows_tile0(wb COLS + c), its warps splitting K. Block
 * b is row block b % row_blocks (activation rows 16 (b % row_blocks) ..)
 * of weight block b / row_blocks. kQkv: the q|k|v epilogue instead of y. */
template <int WARPS, int COLS, int TW, bool kQkv>
__global__ void __launch_bounds__(32 * WARPS * COLS)
    mma_rows_kernel(const uint4 *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                    int64_t m, int64_t n, int64_t groups, int64_t tiles, int64_t row_blocks,
                    const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                    float w_scale, float *__restrict__ y, int64_t ldy, const MmaQkv qkv)
{
    static_assert(!kQkv || TW == 2, "the q|k|v epilogue pairs two tiles a column");
    constexpr int kCols = TW * kTileRows;
    /* Loads of kBatch chunk-groups in flight: 32 registers of weight words. */
    constexpr int kBatch = 8 / TW;
    __shared__ int32_t partial[COLS][WARPS][kMmaRows][kCols];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col = warp / WARPS, split = warp % WARPS;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t wb = (int64_t)blockIdx.x / row_blocks;
    const int64_t m0 = ((int64_t)blockIdx.x % row_blocks) * kMmaRows;
    const int64_t tile0 = mma_rows_tile0<kQkv, TW>(wb * COLS + col, qkv);
    const int64_t tstep = kQkv ? qkv.pair : 1;

    const int8_t *xlo = m0 + gid < m ? x + (m0 + gid) * ldx + 16 * tig : nullptr;
    const int8_t *xhi = m0 + gid + 8 < m ? x + (m0 + gid + 8) * ldx + 16 * tig : nullptr;
    /* Word tig of entry (0, gid) of tile t's chunk-group g: words + t stride
     * + g * 128 (a chunk-group is 512 bytes). */
    const uint32_t *words = reinterpret_cast<const uint32_t *>(w) +
                            (tile0 * groups) * (kBlockBytes / 4) + gid * 4 + tig;
    bool live[TW];
#pragma unroll
    for (int t = 0; t < TW; t++)
        live[t] = tile0 + t * tstep < tiles;

    /* The q|k|v epilogue: the positions and cache slots of the (at most
     * two) activation rows this thread's outputs belong to, rows r0 and
     * r0 ^ 8 (the output loop below steps by the block, a multiple of
     * 8 kCols outputs), read now so that the epilogue waits for nothing
     * but the table. */
    constexpr int kOuts = kQkv ? kMmaRows * kCols / (32 * WARPS) : 1;
    const int r0 = (int)(threadIdx.x / kCols) % kMmaRows;
    int row_pos[2] = {0, 0}, row_slot[2] = {-1, -1};
    if constexpr (kQkv) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = m0 + (r0 ^ (8 * h));
            if (row < m) {
                row_pos[h] = __ldg(qkv.pos + row);
                row_slot[h] = __ldg(qkv.slot + row);
            }
        }
    }

    int32_t acc[TW][4];
#pragma unroll
    for (int t = 0; t < TW; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[t][e] = 0;

    /* Launched with programmatic dependent launch (a->pdl), the kernel
     * before may still run: the warp's first chunk-group is loaded and the
     * rest of its weights asked of L2 before the wait, the activations,
     * scales and sums read after it. (Without PDL the wait returns at
     * once.) */
    int64_t g = split;
    uint32_t first[TW][4];
#pragma unroll
    for (int t = 0; t < TW; t++)
        mma_rows_load_b(first[t], words + (t * tstep * groups + g) * (kBlockBytes / 4),
                        live[t] && g < groups);
    for (int64_t r = g + WARPS; r < groups; r += WARPS)
#pragma unroll
        for (int t = 0; t < TW; t++)
            if (live[t]) /* lanes of tig u: the chunk-group's 128-byte quarter u */
                asm volatile("prefetch.global.L2 [%0];" ::"l"(
                    words + (t * tstep * groups + r) * (kBlockBytes / 4) + 32 * tig));
    pdl_wait();
    if (g < groups) {
        mma_rows_group<TW>(acc, first, xlo, xhi, g * kGroup);
        g += WARPS;
    }
    for (; g + (kBatch - 1) * WARPS < groups; g += kBatch * WARPS) {
        uint32_t b[kBatch][TW][4];
#pragma unroll
        for (int j = 0; j < kBatch; j++)
#pragma unroll
            for (int t = 0; t < TW; t++)
                mma_rows_load_b(b[j][t],
                                words + (t * tstep * groups + g + j * WARPS) * (kBlockBytes / 4),
                                live[t]);
#pragma unroll
        for (int j = 0; j < kBatch; j++)
            mma_rows_group<TW>(acc, b[j], xlo, xhi, (g + j * WARPS) * kGroup);
    }
    for (; g < groups; g += WARPS) {
        uint32_t b[TW][4];
#pragma unroll
        for (int t = 0; t < TW; t++)
            mma_rows_load_b(b[t], words + (t * tstep * groups + g) * (kBlockBytes / 4), live[t]);
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
    if constexpr (kQkv) {
        /* Output i of this thread (o = tid + i kThreads of the block's
         * COLS x 16 x kCols): column c and row r0 or r0 ^ 8 known at
         * compile time, j = tid % kCols (tile t = j / 8 of the pair, row
         * rr of it) the same for all. Every output's destination (and
         * table entry) first, then the stores. The column's tiles are
         * whole: n is whole heads of whole tiles. */
        constexpr int kThreads = 32 * WARPS * COLS;
        const int j = (int)threadIdx.x % kCols, t = j / kTileRows, rr = j % kTileRows;
        QkvDest dest[kOuts];
#pragma unroll
        for (int i = 0; i < kOuts; i++) {
            const int c = i * kThreads / (kMmaRows * kCols);
            const int h = (i * kThreads / kCols) % kMmaRows == 8 ? 1 : 0;
            dest[i] = qkv_dest(qkv, (int)(wb * COLS + c), t, rr, row_pos[h], row_slot[h]);
        }
#pragma unroll
        for (int i = 0; i < kOuts; i++) {
            const int c = i * kThreads / (kMmaRows * kCols);
            const int h = (i * kThreads / kCols) % kMmaRows == 8 ? 1 : 0;
            const int r = r0 ^ (8 * h);
            const int64_t row = m0 + r;
            if (row >= m)
                continue;
            int total = 0, partner = 0;
#pragma unroll
            for (int s = 0; s < WARPS; s++) {
                total += partial[c][s][r][j];
                partner += partial[c][s][r][j ^ kTileRows];
            }
            mma_rows_qkv_store(qkv, row, t == 0, total, partner, act_sum[row], act_scale[row],
                               w_scale, dest[i]);
        }
    } else {
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
}

/* Blocks of mma_rows_kernel<WARPS, COLS, TW, kQkv> resident on one SM of
 * device dev (0 if unknown), asked of the runtime once per device. */
constexpr int kMmaRowsMaxDevices = 64;

template <int WARPS, int COLS, int TW, bool kQkv> static int mma_rows_resident(int dev)
{
    static std::atomic<int> cache[kMmaRowsMaxDevices]; /* 0: not asked yet, -1: unknown */
    if (dev < 0 || dev >= kMmaRowsMaxDevices)
        return 0;
    int v = cache[dev].load(std::memory_order_relaxed);
    if (v == 0) {
        int blocks = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &blocks, mma_rows_kernel<WARPS, COLS, TW, kQkv>, 32 * WARPS * COLS, 0) !=
                cudaSuccess ||
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

template <int S, int TW, bool kQkv>
static bool mma_rows_one_wave(const MmaRowsGrid &g, int dev, int sms)
{
    const int64_t resident = mma_rows_resident<S, MmaRowsShape<S>::kCols, TW, kQkv>(dev);
    return resident > 0 && mma_rows_blocks<S>(g) <= resident * sms;
}

/* The K split of mma_rows_kernel: the largest (at most 8, at most the
 * chunk-groups) whose grid runs as one wave, then, for long rows, larger
 * until a warp has at most 24 chunk-groups (as the GEMV: more loads in
 * flight sooner). H200, M = 24 on 3840 x 2560: 5.7 us at one wave (split
 * 4) against 7.2 at 1.2 waves (split 8); 20480 x 3200 at M <= 16: split 2
 * (one wave of 4-warp blocks) 10.4 us against 22.8 at split 1. */
template <int TW, bool kQkv>
static int mma_rows_split(const MmaRowsGrid &g, int64_t groups, int sm_count)
{
    const int sms = sm_count > 0 ? sm_count : 132;
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        dev = -1; /* occupancy unknown: split 1, then the long-row rule */
    }
    int split = 1;
    if (groups >= 8 && mma_rows_one_wave<8, TW, kQkv>(g, dev, sms))
        split = 8;
    else if (groups >= 4 && mma_rows_one_wave<4, TW, kQkv>(g, dev, sms))
        split = 4;
    else if (groups >= 2 && mma_rows_one_wave<2, TW, kQkv>(g, dev, sms))
        split = 2;
    while (split < 8 && groups > 24 * split)
        split *= 2;
    return split;
}

template <int WARPS, int TW, bool kQkv>
static cudaError_t launch_mma_rows_t(const bn_w2a8_cuda_args *a, const MmaRowsGrid &g,
                                     const MmaQkv &qkv, cudaStream_t stream)
{
    constexpr int COLS = MmaRowsShape<WARPS>::kCols;
    const int64_t blocks = mma_rows_blocks<WARPS>(g);
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidConfiguration;
    auto kernel = mma_rows_kernel<WARPS, COLS, TW, kQkv>;
    /* PDL only where the kernel was built with its wait (sm_90 code). */
    static const bool pdl_ok = pdl_compiled(kernel);
    return pdl_launch(kernel, dim3((unsigned)blocks), dim3(32 * WARPS * COLS), 0, stream,
                      a->pdl && pdl_ok, reinterpret_cast<const uint4 *>(a->weights), a->x, a->ldx,
                      a->m, a->n, a->groups, a->tiles, g.row_blocks, a->act_scale, a->act_sum,
                      a->weight_scale, a->y, a->ldy, qkv);
}

/* BN_W2A8_MMA_ROWS_X2 (TW = 2) and X4 (TW = 4), or (kQkv, TW = 2) with
 * the q|k|v epilogue. */
template <int TW, bool kQkv = false>
static cudaError_t launch_mma_rows(const bn_w2a8_cuda_args *a, cudaStream_t stream,
                                   const MmaQkv &qkv = MmaQkv())
{
    if (a->m <= 0 || a->n <= 0)
        return cudaSuccess;
    /* 16-byte activation loads. */
    if ((a->ldx & 15) != 0 || (reinterpret_cast<uintptr_t>(a->x) & 15) != 0)
        return cudaErrorMisalignedAddress;
    const MmaRowsGrid g = {(a->tiles + TW - 1) / TW, (a->m + kMmaRows - 1) / kMmaRows};
    switch (mma_rows_split<TW, kQkv>(g, a->groups, a->sm_count)) {
    case 1: return launch_mma_rows_t<1, TW, kQkv>(a, g, qkv, stream);
    case 2: return launch_mma_rows_t<2, TW, kQkv>(a, g, qkv, stream);
    case 4: return launch_mma_rows_t<4, TW, kQkv>(a, g, qkv, stream);
    default: return launch_mma_rows_t<8, TW, kQkv>(a, g, qkv, stream);
    }
}

} // namespace

extern "C" cudaError_t bn_w2a8_cuda_gemm_rows(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    return launch_rows(a, stream);
}

/* Whether bn_w2a8_cuda_gemm_qkv takes a with o (w2a8_cuda.h). */
static bool qkv_fits(const bn_w2a8_cuda_args *a, const bn_w2a8_qkv_out *o)
{
    if (!a || !o || a->m <= 0 || o->head_dim <= 0 || o->head_dim % (2 * kTileRows) != 0 ||
        o->n_heads <= 0 || o->n_kv_heads <= 0 || (o->rope_dim != 0 && o->rope_dim != o->head_dim) ||
        a->n != (int64_t)(o->n_heads + 2 * o->n_kv_heads) * o->head_dim ||
        a->tiles * kTileRows != a->n || a->n > INT32_MAX || !o->pos || !o->slot || !o->q ||
        !o->k_cache || !o->v_cache || o->ldq < (int64_t)o->n_heads * o->head_dim ||
        (o->rope_dim > 0 && (!o->rope_table || o->table_len <= 0)))
        return false;
    const int64_t k = a->groups * BN_CUDA_GROUP;
    return bn_w2a8_cuda_gemm_pick(a->m, a->n, k, bn_w2a8_cuda_gemm_wgmma_usable(), a->sm_count,
                                  a->streamk != NULL) == BN_W2A8_MMA_ROWS_X2;
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_qkv(const bn_w2a8_cuda_args *a, const bn_w2a8_qkv_out *o,
                                             cudaStream_t stream)
{
    if (!qkv_fits(a, o))
        return cudaErrorNotSupported;
    MmaQkv q;
    q.q = o->q;
    q.ldq = o->ldq;
    q.k_cache = o->k_cache;
    q.v_cache = o->v_cache;
    q.kv = o->kv;
    q.pos = o->pos;
    q.slot = o->slot;
    q.table = reinterpret_cast<const float2 *>(o->rope_table);
    q.table_len = o->rope_dim > 0 ? o->table_len : 0;
    q.capacity = o->capacity;
    q.q_dim = o->n_heads * o->head_dim;
    q.kv_dim = o->n_kv_heads * o->head_dim;
    q.half = o->rope_dim / 2;
    q.pair = o->head_dim / (2 * kTileRows);
    q.sq = o->scale_q;
    q.sk = o->scale_k;
    q.sv = o->scale_v;
    return launch_mma_rows<2, true>(a, stream, q);
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
