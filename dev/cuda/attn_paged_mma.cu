/*
 * attn_paged_mma.cu - lab: decode attention for many sequences at once over
 * a paged KV cache of 8-bit floats (fp8 e4m3 or e5m2) on the tensor cores,
 * in the forms that led to the shipped e4m3 kernel (src/cuda/
 * attn_paged_e4m3.cuh), timed beside the shipped kernels (src/cuda/
 * attn_paged.cu: fp32, fp16 caches; linked in).
 *
 * Both operands of the tensor-core products come from shared memory as
 * byte rows: a b16 element of ldmatrix is two 8-bit values, so lane (g, t)
 * receives four consecutive bytes; each pair widens to an fp16 pair (cvt
 * for e4m3; e5m2 is the high byte of an fp16, one byte permute), and the k
 * order this gives (4t, 4t + 1 at k = 2t, 2t + 1; 4t + 2, 4t + 3 at k = 2t
 * + 8, 2t + 9) is matched by how q and P are packed. Block as the shipped
 * fp16 kernel's (four warps a (row, kv head, split), two buffers of tiles
 * through cp.async) with 64 keys a tile (the bytes of 32 fp16 keys):
 *   scores^T (64 keys x heads) = K q^T     warp w: keys 16 w .., all dims
 *   online softmax (base 2)                every warp alike from the shared
 *                                          scores
 *   out^T (dims x heads) += V^T P^T        warp w: dims w HD / 4 ..
 * q and P are single fp16 values (the cache's own rounding, 2^-4 or 2^-3
 * relative, dwarfs theirs); sums fp32. The forms (Variant):
 *   - V transposed a block at a time in the cache ([block][n_kv][HD][bs]),
 *     read by ldmatrix like K; tiles padded (five blocks an SM) or
 *     unpadded with swizzled 16-byte chunks (six);
 *   - V as the cache's rows (the fp16 cache's layout): the shipped kernel,
 *     each lane reading four keys of four dims as words and transposing the
 *     4 x 4 bytes in registers (timed here through bn_cb_attn_paged).
 * Offsets of a tile's rows come from table entries loaded a tile ahead;
 * copies use cp.async's ignore-src for rows past the range.
 *
 * `e4m3 warps` (attn_paged_warps) drops the block's step: every warp its
 * own 16-key sub-tiles and softmax, merged at the end. H200, 577
 * positions, us a layer against the shipped kernel's ranges (2026-12-02):
 * 64 rows 15.7 (4 warps x 3 stages, one range a row) against 17.3, 128
 * 35.1 (8 x 2) against 30.8, 256 58.5 (4 x 3) against 57.6; not shipped.

 *   make -C dev/cuda attn_paged_mma BUILD=<configured build> && dev/cuda/attn_paged_mma [len]
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <type_traits>
#include <vector>

#include "common.cuh"
#include "cp_async.cuh"

#include "cuda_backend_kernels.h"

namespace {

constexpr int kChunk = 64; /* keys a tile */
constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;            /* q heads a kv head: the n = 8 columns */
constexpr int kScoreStride = kChunk + 4; /* floats a head's scores */

enum Fp8 { E4M3 = 0, E5M2 = 1 };

/* The splits a row of position pos uses out of the launch's, and the whole
 * tiles of positions each covers: about split_len positions a split. */
__device__ __forceinline__ int row_splits_len(int pos, int splits, int split_len, int *span)
{
    const int len = pos + 1;
    const int used = min(splits, (len + split_len - 1) / split_len);
    *span = ((len + used - 1) / used + kChunk - 1) / kChunk * kChunk;
    return used;
}

__device__ __forceinline__ uint32_t pack_half2(float a, float b)
{
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* Four 8 x 8 b16 matrices (here 8 rows of 16 bytes each). */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *smem_row)
{
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Bytes 0, 1 of x as an fp16 pair (lo), bytes 2, 3 (hi). */
template <int FMT>
__device__ __forceinline__ void widen2(uint32_t x, uint32_t &lo, uint32_t &hi)
{
    if constexpr (FMT == E5M2) {
        lo = __byte_perm(x, 0u, 0x1404u);
        hi = __byte_perm(x, 0u, 0x3424u);
    } else {
        asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
            "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
            : "=r"(lo), "=r"(hi)
            : "r"(x));
    }
}

/* The A fragments of two k16 steps from one ldmatrix_x4 over rows 0-7 and
 * 8-15 of bytes 0-15 (r0, r1) and 16-31 (r2, r3). */
template <int FMT>
__device__ __forceinline__ void widen_steps(const uint32_t (&r)[4], uint32_t (&a0)[4],
                                            uint32_t (&a1)[4])
{
    widen2<FMT>(r[0], a0[0], a0[2]);
    widen2<FMT>(r[1], a0[1], a0[3]);
    widen2<FMT>(r[2], a1[0], a1[2]);
    widen2<FMT>(r[3], a1[1], a1[3]);
}

/* Where a tile's rows sit in shared memory: rows padded by 16 bytes
 * (SWZ 0), or unpadded with each row's 16-byte chunks permuted (SWZ 1:
 * chunk c of row r at c ^ f(r)) so that the eight rows one ldmatrix
 * matrix reads at one chunk still fall in eight different bank groups; the
 * swizzle saves the padding (six blocks an SM instead of five). Rows are
 * 64 or 128 bytes. */
template <int BYTES, int SWZ> struct RowLayout {
    static constexpr int kChunks = BYTES / 16;
    static constexpr int kStride = SWZ ? BYTES : BYTES + 16;
    static_assert(kChunks == 4 || kChunks == 8, "rows of 64 or 128 bytes");
    static __device__ __forceinline__ int at(int r, int c)
    {
        if constexpr (!SWZ)
            return r * kStride + 16 * c;
        else
            return r * kStride + 16 * (kChunks == 8 ? c ^ (r & 7) : c ^ ((r >> 1) & 3));
    }
};

template <int HD, int SWZ> struct Fp8Tiles {
    using K = RowLayout<HD, SWZ>;     /* a key's dims */
    using V = RowLayout<kChunk, SWZ>; /* a dim's keys */
    static constexpr int K_BYTES = kChunk * K::kStride, V_BYTES = HD * V::kStride;
    static constexpr int BUF = K_BYTES + V_BYTES;
    /* Two buffers, the scores, then each buffer's source offsets: a key's
     * K row and a 16-key piece's V^T rows (-1: zeros). */
    static constexpr size_t kSmem = 2 * (size_t)BUF +
                                    sizeof(float) * kMaxGroup * kScoreStride +
                                    sizeof(int64_t) * 2 * (kChunk + kChunk / 16);
};

constexpr int kThreads = kWarps * 32;

/* 16 bytes global -> shared, or zeros where skip (the source is then not
 * read): cp.async's ignore-src operand, so no size register to compute. */
__device__ __forceinline__ void cp_async16_or_zero(uint32_t dst, const void *src, bool skip)
{
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t"
                 "cp.async.cg.shared.global [%0], [%1], 16, p;\n\t}\n" ::"r"(dst),
                 "l"(src), "r"((int)skip)
                 : "memory");
}

/* 2^x, the MUFU's approximation (denormal results flushed to zero: a weight
 * that small adds nothing to the fp32 sums). */
__device__ __forceinline__ float exp2_fast(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The table entry of this thread's item of tile t0, loaded a tile ahead of
 * its use so that the global load's latency is not on the block's path:
 * threads 0-63 a key, 64-67 the block of a 16-key piece of V^T; -1: none.
 * bs = 1 << bs_log2. */
__device__ __forceinline__ int table_ahead(const int32_t *table, int bs_log2, int t0, int end)
{
    const int i = threadIdx.x;
    const int t = i < kChunk ? t0 + i : t0 + 16 * (i - kChunk);
    return i < kChunk + kChunk / 16 && t < end ? table[t >> bs_log2] : -1;
}

/* Where tile t0's K rows and V^T pieces start in the byte caches, from the
 * entries loaded ahead (block: this thread's): -1 past end or where the
 * table has no block (a padding row). */
template <int HD>
__device__ __forceinline__ void tile_offsets(int64_t *kofs, int64_t *vofs, int block, int bs_log2,
                                             int t0, int n_kv, int kvh)
{
    const int i = threadIdx.x, mask = (1 << bs_log2) - 1;
    if (i < kChunk) {
        const int t = t0 + i;
        kofs[i] = block < 0 ? -1
                            : (((int64_t)block << bs_log2) + (t & mask)) * n_kv * HD +
                                  (int64_t)kvh * HD;
    } else if (i < kChunk + kChunk / 16) {
        const int t = t0 + 16 * (i - kChunk);
        vofs[i - kChunk] =
            block < 0 ? -1 : ((((int64_t)block * n_kv + kvh) * HD) << bs_log2) + (t & mask);
    }
}

/* This thread's share of a tile's copies: K chunk column c of rows r0,
 * r0 + kThreads / KP, ...; V^T piece p of dims d0, d0 + kThreads / VP, ...
 * Those strides are multiples of 8 rows, so every row of a thread has the
 * same swizzled chunk: the shared addresses are a base plus a stride. */
template <int HD, int SWZ> struct TileCopy {
    using T = Fp8Tiles<HD, SWZ>;
    static constexpr int KP = HD / 16, VP = kChunk / 16;
    static constexpr int KR = kChunk * KP / kThreads, VR = HD * VP / kThreads; /* rounds */
    static_assert(kChunk * KP % kThreads == 0 && HD * VP % kThreads == 0, "whole rounds");
    static_assert(kThreads / KP % 8 == 0 && kThreads / VP % 8 == 0, "row strides of 8");
    int r0, c, p;
    uint32_t kdst, vdst; /* within a buffer */
    int64_t vsrc;        /* dim d0's row within a piece: d0 bs */

    __device__ __forceinline__ TileCopy(int bs_log2)
    {
        const int i = threadIdx.x;
        r0 = i / KP, c = i % KP, p = i % VP;
        const int d0 = i / VP;
        kdst = (uint32_t)T::K::at(r0, c);
        vdst = (uint32_t)(T::K_BYTES + T::V::at(d0, p));
        vsrc = (int64_t)d0 << bs_log2;
    }

    /* The copies into the buffer at shared address buf. */
    __device__ __forceinline__ void issue(uint32_t buf, const int64_t *kofs, const int64_t *vofs,
                                          int bs_log2, const uint8_t *kc, const uint8_t *vtc) const
    {
#pragma unroll
        for (int k = 0; k < KR; k++) {
            const int64_t o = kofs[r0 + k * (kThreads / KP)];
            cp_async16_or_zero(buf + kdst + k * (kThreads / KP) * T::K::kStride, kc + o + 16 * c,
                               o < 0);
        }
        const int64_t o = vofs[p];
        const uint8_t *src = vtc + o + vsrc;
#pragma unroll
        for (int k = 0; k < VR; k++)
            cp_async16_or_zero(buf + vdst + k * (kThreads / VP) * T::V::kStride,
                               src + ((int64_t)(k * (kThreads / VP)) << bs_log2), o < 0);
    }
};

/* The range of positions block (row, kv head, split) takes: [begin, end)
 * of its row and the row's table; false where the row leaves the split
 * unused. */
struct LabRange {
    int row, begin, end;
    const int32_t *table;
};

__device__ __forceinline__ bool lab_range(const int32_t *row_seq, const int32_t *row_pos,
                                          const int32_t *tables, int max_blocks, int split_len,
                                          LabRange &r)
{
    r.row = blockIdx.x;
    const int pos = row_pos[r.row], split = blockIdx.z;
    int span;
    if (split >= row_splits_len(pos, (int)gridDim.z, split_len, &span))
        return false;
    r.table = tables + (int64_t)row_seq[r.row] * max_blocks;
    r.begin = split * span;
    r.end = min(r.begin + span, pos + 1);
    return true;
}

/* q of head gid (lane / 4) as fp16 fragments (zeros past the group), scaled
 * by scale log2(e) so that the scores come out in base 2: k16 step s takes
 * dims 16 s + 4 tig + {0, 1} and + {2, 3}. */
template <int HD>
__device__ __forceinline__ void lab_q_fragments(uint32_t (&qf)[HD / 16][2], const float *q,
                                                int64_t ldq, int row, int kvh, int group,
                                                float scale)
{
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const float scale2 = scale * 1.4426950408889634f;
    const bool live = gid < group;
    const float *qr =
        q + (int64_t)row * ldq + (int64_t)(kvh * group + (live ? gid : 0)) * HD + 4 * tig;
#pragma unroll
    for (int s = 0; s < HD / 16; s++) {
        const float4 v =
            live ? *reinterpret_cast<const float4 *>(qr + 16 * s) : make_float4(0.f, 0.f, 0.f, 0.f);
        qf[s][0] = pack_half2(v.x * scale2, v.y * scale2);
        qf[s][1] = pack_half2(v.z * scale2, v.w * scale2);
    }
}

template <int HD, int FMT, int SWZ>
__global__ void __launch_bounds__(kWarps * 32)
    attn_paged_fp8(int n_heads, int n_kv, const float *__restrict__ q, int64_t ldq,
                   const int32_t *__restrict__ row_seq, const int32_t *__restrict__ row_pos,
                   const int32_t *__restrict__ tables, int max_blocks, int bs_log2,
                   const uint8_t *__restrict__ kc, const uint8_t *__restrict__ vtc, float scale,
                   int split_len, float *__restrict__ out, int64_t ldo, float *__restrict__ part)
{
    using T = Fp8Tiles<HD, SWZ>;
    constexpr int SK = HD / 32; /* ldmatrix_x4 a key row: two k16 steps each */
    constexpr int MT = HD / 64; /* m16 tiles of a warp's quarter of the dims */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *tiles = smem_raw;                                      /* [2][K | V^T] */
    float *sc = reinterpret_cast<float *>(tiles + 2 * T::BUF);      /* [8][stride]  */
    int64_t *kofs = reinterpret_cast<int64_t *>(sc + kMaxGroup * kScoreStride); /* [2][64] */
    int64_t *vofs = kofs + 2 * kChunk;                                           /* [2][4]  */
    const int group = n_heads / n_kv;
    const int kvh = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    LabRange range;
    if (!lab_range(row_seq, row_pos, tables, max_blocks, split_len, range))
        return;
    const int row = range.row, begin = range.begin, end = range.end;
    const int32_t *table = range.table;

    tile_offsets<HD>(kofs, vofs, table_ahead(table, bs_log2, begin, end), bs_log2, begin, n_kv,
                     kvh);
    int ahead = table_ahead(table, bs_log2, begin + kChunk, end);

    uint32_t qb[HD / 16][2]; /* as B fragments */
    lab_q_fragments<HD>(qb, q, ldq, row, kvh, group, scale);
    __syncthreads();
    const TileCopy<HD, SWZ> copy(bs_log2);
    const uint32_t tiles_s = (uint32_t)__cvta_generic_to_shared(tiles);
    if (begin < end)
        copy.issue(tiles_s, kofs, vofs, bs_log2, kc, vtc);
    cp_async_commit();

    float m = -INFINITY, l = 0.0f; /* head gid's running maximum (base 2) and weight */
    float o[MT][4] = {};           /* dims (HD / 4 warp + 16 mt + gid, + 8) x heads */
    for (int t0 = begin, buf = 0; t0 < end; t0 += kChunk, buf ^= 1) {
        const bool more = t0 + kChunk < end;
        if (more) {
            tile_offsets<HD>(kofs + (buf ^ 1) * kChunk, vofs + (buf ^ 1) * (kChunk / 16), ahead,
                             bs_log2, t0 + kChunk, n_kv, kvh);
            ahead = table_ahead(table, bs_log2, t0 + 2 * kChunk, end);
        }
        __syncthreads();
        if (more)
            copy.issue(tiles_s + (buf ^ 1) * T::BUF, kofs + (buf ^ 1) * kChunk,
                       vofs + (buf ^ 1) * (kChunk / 16), bs_log2, kc, vtc);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const uint8_t *kt = tiles + buf * T::BUF, *vt = kt + T::K_BYTES;

        /* Scores of keys 16 warp .. + 15 over all dims, as two chains of
         * products (even and odd k16 steps) added at the end. */
        float s4[4] = {0.f, 0.f, 0.f, 0.f}, s4b[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int u = 0; u < SK; u++) {
            uint32_t r[4], a0[4], a1[4];
            ldmatrix_x4(r, kt + T::K::at(16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1),
                                         2 * u + (lane >> 4)));
            widen_steps<FMT>(r, a0, a1);
            mma16816(s4, a0, qb[2 * u][0], qb[2 * u][1]);
            mma16816(s4b, a1, qb[2 * u + 1][0], qb[2 * u + 1][1]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            s4[i] += s4b[i];
        /* c0, c1: key 16 warp + gid, heads 2 tig, 2 tig + 1; c2, c3: key + 8. */
        float *sh = sc + 16 * warp + gid;
        sh[(2 * tig) * kScoreStride] = s4[0];
        sh[(2 * tig + 1) * kScoreStride] = s4[1];
        sh[(2 * tig) * kScoreStride + 8] = s4[2];
        sh[(2 * tig + 1) * kScoreStride + 8] = s4[3];
        __syncthreads();

        /* Head gid's keys 16 j + 4 tig + {0 .. 3}. */
        float p[4][4];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int key = 16 * j + 4 * tig;
            const float4 a = *reinterpret_cast<const float4 *>(sc + gid * kScoreStride + key);
            p[j][0] = a.x, p[j][1] = a.y, p[j][2] = a.z, p[j][3] = a.w;
            if (t0 + kChunk > end) /* the range's last tile */
#pragma unroll
                for (int i = 0; i < 4; i++)
                    p[j][i] = t0 + key + i < end ? p[j][i] : -INFINITY;
            mx = fmaxf(mx, fmaxf(fmaxf(p[j][0], p[j][1]), fmaxf(p[j][2], p[j][3])));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx);
        const float corr = exp2_fast(m - m_new);
        float sum = 0.0f;
        uint32_t pb[4][2];
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                p[j][i] = exp2_fast(p[j][i] - m_new);
                sum += p[j][i];
            }
            pb[j][0] = pack_half2(p[j][0], p[j][1]);
            pb[j][1] = pack_half2(p[j][2], p[j][3]);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l = fmaf(l, corr, sum);
        m = m_new;

        const float ca = __shfl_sync(0xffffffffu, corr, 8 * tig);
        const float cb = __shfl_sync(0xffffffffu, corr, 8 * tig + 4);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            o[mt][0] *= ca;
            o[mt][1] *= cb;
            o[mt][2] *= ca;
            o[mt][3] *= cb;
#pragma unroll
            for (int v = 0; v < kChunk / 32; v++) {
                uint32_t r[4], a0[4], a1[4];
                ldmatrix_x4(r, vt + T::V::at(warp * (HD / 4) + 16 * mt + (lane & 7) +
                                                 8 * ((lane >> 3) & 1),
                                             2 * v + (lane >> 4)));
                widen_steps<FMT>(r, a0, a1);
                mma16816(o[mt], a0, pb[2 * v][0], pb[2 * v][1]);
                mma16816(o[mt], a1, pb[2 * v + 1][0], pb[2 * v + 1][1]);
            }
        }
    }
    cp_async_wait<0>();
    const float la = __shfl_sync(0xffffffffu, l, 8 * tig);
    const float lb = __shfl_sync(0xffffffffu, l, 8 * tig + 4);
    const int ha = 2 * tig, hb = 2 * tig + 1;
    if (gridDim.z == 1) {
        float *orow = out + (int64_t)row * ldo + (int64_t)kvh * group * HD;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int d0 = warp * (HD / 4) + 16 * mt + gid, d2 = d0 + 8;
            if (ha < group) {
                orow[ha * HD + d0] = o[mt][0] / la;
                orow[ha * HD + d2] = o[mt][2] / la;
            }
            if (hb < group) {
                orow[hb * HD + d0] = o[mt][1] / lb;
                orow[hb * HD + d2] = o[mt][3] / lb;
            }
        }
        return;
    }
    auto share = [&](int hg) {
        return part + (((int64_t)row * n_heads + kvh * group + hg) * gridDim.z + split) * (HD + 4);
    };
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int d0 = warp * (HD / 4) + 16 * mt + gid, d2 = d0 + 8;
        if (ha < group) {
            share(ha)[d0] = o[mt][0];
            share(ha)[d2] = o[mt][2];
        }
        if (hb < group) {
            share(hb)[d0] = o[mt][1];
            share(hb)[d2] = o[mt][3];
        }
    }
    if (warp == 0 && tig == 0 && gid < group) {
        share(gid)[HD] = m * 0.6931471805599453f; /* the merge's natural units */
        share(gid)[HD + 1] = l;
    }
}

/* ---- warps on their own: a warp a 16-key sub-tile at a time ---------------
 *
 * The forms above move a block of four warps through 64-key tiles in step:
 * copies, a barrier, scores, a barrier, softmax, P V. Here every warp of a
 * (row, kv head, split) block takes its own 16-key sub-tiles (w, w + W, ...
 * of the range) through S stages of its own cp.async copies and runs its
 * own online softmax; no block barrier until the warps' results are merged
 * through shared memory at the end. Head dim 128, groups of up to 8 q
 * heads, V as the cache's rows (the shipped layout).
 *
 *   scores (16 heads x 8 keys, twice) = q K^T  q as A (rows gid + 8 the
 *       padding heads: zero), K^T fragments by ldmatrix on the key rows, in
 *       the k order the byte pairs give (as the shipped kernel's);
 *   lane (gid, tig) then holds head gid's keys 2 tig, 2 tig + 1 and 8 + 2
 *       tig, 9 + 2 tig: exactly P^T's B fragment for the P V product;
 *   out^T (dims x heads) += V^T P^T   A from four words a lane (keys 2 tig,
 *       2 tig + 1, 2 tig + 8, 2 tig + 9, four dims each) transposed in
 *       registers: m-tile (G, j) row gid is dim 32 G + 4 gid + 2 j, row
 *       gid + 8 the dim after it. */
constexpr int kSub = 16; /* keys a sub-tile */

template <int W, int S, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
    attn_paged_warps(int n_heads, int n_kv, const float *__restrict__ q, int64_t ldq,
                     const int32_t *__restrict__ row_seq, const int32_t *__restrict__ row_pos,
                     const int32_t *__restrict__ tables, int max_blocks, int bs_log2,
                     const uint8_t *__restrict__ kc, const uint8_t *__restrict__ vc, float scale,
                     int split_len, float *__restrict__ out, int64_t ldo, float *__restrict__ part)
{
    constexpr int HD = 128, STAGE = 2 * kSub * HD; /* K then V rows of a sub-tile */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int group = n_heads / n_kv;
    const int kvh = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    LabRange range;
    if (!lab_range(row_seq, row_pos, tables, max_blocks, split_len, range))
        return;
    const int row = range.row, begin = range.begin, end = range.end;
    const int32_t *table = range.table;
    const int64_t kv_dim = (int64_t)n_kv * HD, head_off = (int64_t)kvh * HD;
    const int mask = (1 << bs_log2) - 1;

    uint32_t qa[HD / 16][2]; /* as A fragments (rows gid + 8: zeros) */
    lab_q_fragments<HD>(qa, q, ldq, row, kvh, group, scale);

    uint8_t *mine = smem_raw + (size_t)warp * S * STAGE;
    const uint32_t mine_s = (uint32_t)__cvta_generic_to_shared(mine);
    const int nsub = (end - begin + kSub - 1) / kSub;
    /* Sub-tile i of this warp: keys begin + 16 (warp + W i) ..; its cache
     * block's table entry (a sub-tile lies in one block: 16 | bs). */
    auto key0 = [&](int i) { return begin + kSub * (warp + W * i); };
    auto entry = [&](int i) {
        const int t = key0(i);
        return warp + W * i < nsub ? table[t >> bs_log2] : -1;
    };
    /* Lane L copies chunk L & 7 of rows L / 8 + 4 k of K and of V. */
    const int cr = lane >> 3, cc = lane & 7;
    auto issue = [&](int i, int blk) {
        if (warp + W * i < nsub) {
            const int t = key0(i);
            const uint32_t st = mine_s + (uint32_t)((i % S) * STAGE);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int r = cr + 4 * k;
                const bool none = blk < 0 || t + r >= end;
                const int64_t o =
                    (((int64_t)blk << bs_log2) + ((t + r) & mask)) * kv_dim + head_off + 16 * cc;
                cp_async16_or_zero(st + r * HD + 16 * (cc ^ (r & 7)), kc + (none ? 0 : o), none);
                cp_async16_or_zero(st + kSub * HD + r * HD + 16 * (cc ^ (2 * ((r >> 1) & 3))),
                                   vc + (none ? 0 : o), none);
            }
        }
        cp_async_commit();
    };

    int ahead = entry(0);
#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        const int e = ahead;
        ahead = entry(i + 1);
        issue(i, e);
    }
    float m = -INFINITY, l = 0.0f; /* head gid's running maximum (base 2) and weight */
    float o[8][4] = {};            /* m-tile 2 G + j: dims 32 G + 4 gid + 2 j (+ 1) x heads */
    for (int i = 0; warp + W * i < nsub; i++) {
        {
            const int e = ahead;
            ahead = entry(i + S);
            issue(i + S - 1, e);
        }
        cp_async_wait<S - 1>();
        __syncwarp();
        const uint8_t *kt = mine + (i % S) * STAGE, *vt = kt + kSub * HD;
        const int t0 = key0(i);

        float sa[4] = {0.f, 0.f, 0.f, 0.f}, sb[4] = {0.f, 0.f, 0.f, 0.f}; /* keys 0-7, 8-15 */
#pragma unroll
        for (int u = 0; u < HD / 32; u++) {
            uint32_t r[4];
            const int key = (lane & 7) + 8 * ((lane >> 3) & 1), c = 2 * u + (lane >> 4);
            ldmatrix_x4(r, kt + key * HD + 16 * (c ^ (key & 7)));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t b0, b1, b2, b3;
                widen2<E4M3>(r[2 * h], b0, b1);     /* keys 0-7, step 2 u + h */
                widen2<E4M3>(r[2 * h + 1], b2, b3); /* keys 8-15 */
                const uint32_t a[4] = {qa[2 * u + h][0], 0u, qa[2 * u + h][1], 0u};
                mma16816(sa, a, b0, b1);
                mma16816(sb, a, b2, b3);
            }
        }
        float p[4] = {sa[0], sa[1], sb[0], sb[1]}; /* keys 2 tig, + 1, 8 + 2 tig, + 1 */
        if (t0 + kSub > end) {
            p[0] = t0 + 2 * tig < end ? p[0] : -INFINITY;
            p[1] = t0 + 2 * tig + 1 < end ? p[1] : -INFINITY;
            p[2] = t0 + 8 + 2 * tig < end ? p[2] : -INFINITY;
            p[3] = t0 + 9 + 2 * tig < end ? p[3] : -INFINITY;
        }
        float mx = fmaxf(fmaxf(p[0], p[1]), fmaxf(p[2], p[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx); /* finite: key t0 is in the range */
        const float corr = exp2_fast(m - m_new);
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            p[e] = exp2_fast(p[e] - m_new);
            sum += p[e];
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l = fmaf(l, corr, sum);
        m = m_new;
        const uint32_t pb0 = pack_half2(p[0], p[1]), pb1 = pack_half2(p[2], p[3]);
        const float ca = __shfl_sync(0xffffffffu, corr, 8 * tig);
        const float cb = __shfl_sync(0xffffffffu, corr, 8 * tig + 4);
#pragma unroll
        for (int g = 0; g < HD / 32; g++) {
            uint32_t x[4], y[4];
            const int c = 2 * g + (gid >> 2);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = 2 * tig + (e & 1) + 8 * (e >> 1);
                x[e] = *reinterpret_cast<const uint32_t *>(vt + key * HD + 16 * (c ^ (2 * tig)) +
                                                           4 * (gid & 3));
            }
            /* y[k]: dim 32 g + 4 gid + k of keys 2 tig, 2 tig + 1, 8 + 2 tig, 9 + 2 tig */
            const uint32_t a0 = __byte_perm(x[0], x[1], 0x5140),
                           b0 = __byte_perm(x[0], x[1], 0x7362);
            const uint32_t c0 = __byte_perm(x[2], x[3], 0x5140),
                           d0 = __byte_perm(x[2], x[3], 0x7362);
            y[0] = __byte_perm(a0, c0, 0x5410), y[1] = __byte_perm(a0, c0, 0x7632);
            y[2] = __byte_perm(b0, d0, 0x5410), y[3] = __byte_perm(b0, d0, 0x7632);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                float(&acc)[4] = o[2 * g + j];
                acc[0] *= ca, acc[1] *= cb, acc[2] *= ca, acc[3] *= cb;
                uint32_t a[4];
                widen2<E4M3>(y[2 * j], a[0], a[2]);
                widen2<E4M3>(y[2 * j + 1], a[1], a[3]);
                mma16816(acc, a, pb0, pb1);
            }
        }
        __syncwarp(); /* every lane done with the stage before it is refilled */
    }
    cp_async_wait<0>();
    __syncthreads(); /* the stages are free: the warps' results go there */

    float *mw = reinterpret_cast<float *>(smem_raw); /* [W][8] maxima, [W][8] weights */
    float *lw = mw + W * 8;
    float *ow = lw + W * 8; /* [W][8 heads][HD] */
    if (tig == 0)
        mw[warp * 8 + gid] = m, lw[warp * 8 + gid] = l;
#pragma unroll
    for (int mt = 0; mt < 8; mt++) {
        const int d = 32 * (mt >> 1) + 4 * gid + 2 * (mt & 1);
        float *oa = ow + (warp * 8 + 2 * tig) * HD, *ob = oa + HD;
        oa[d] = o[mt][0], ob[d] = o[mt][1], oa[d + 1] = o[mt][2], ob[d + 1] = o[mt][3];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < group * HD; idx += W * 32) {
        const int h = idx / HD, d = idx % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++)
            M = fmaxf(M, mw[w * 8 + h]);
        float L = 0.0f, acc = 0.0f;
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float f = exp2_fast(mw[w * 8 + h] - M);
            L = fmaf(lw[w * 8 + h], f, L);
            acc = fmaf(ow[(w * 8 + h) * HD + d], f, acc);
        }
        if (gridDim.z == 1) {
            out[(int64_t)row * ldo + (int64_t)(kvh * group + h) * HD + d] = acc / L;
        } else {
            float *share =
                part + (((int64_t)row * n_heads + kvh * group + h) * gridDim.z + split) * (HD + 4);
            share[d] = acc;
            if (d == 0)
                share[HD] = M * 0.6931471805599453f, share[HD + 1] = L;
        }
    }
}

/* The shares of a row's splits combined in split order (as src's paged_merge). */
__global__ void merge_len(int n_heads, int hd, int splits, int split_len,
                          const int32_t *__restrict__ row_pos, const float *__restrict__ part,
                          float *__restrict__ out, int64_t ldo)
{
    const int row = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    int span;
    const int used = row_splits_len(row_pos[row], splits, split_len, &span);
    const float *pr = part + ((int64_t)row * n_heads + h) * splits * (hd + 4);
    float M = -INFINITY;
    for (int s = 0; s < used; s++)
        M = fmaxf(M, pr[s * (hd + 4) + hd]);
    float sum = 0.0f, weight = 0.0f;
    for (int s = 0; s < used; s++) {
        const float *ps = pr + s * (hd + 4);
        const float w = ps[hd + 1] > 0.0f ? expf(ps[hd] - M) : 0.0f;
        sum = fmaf(w, ps[d], sum);
        weight = fmaf(w, ps[hd + 1], weight);
    }
    out[(int64_t)row * ldo + (int64_t)h * hd + d] = sum / weight;
}

struct Shape {
    int n_heads, n_kv, hd, bs;
};

/* A batch: n_rows sequences of random lengths in [min_len, max_len] (each
 * row the last position of its sequence), blocks scattered over the cache. */
struct Batch {
    Shape s;
    int n_rows, max_blocks, n_blocks, max_len;
    std::vector<int32_t> seq, pos, tables;
    std::vector<float> q, k, v; /* k, v: the cache's values (fp16, or fp8 when fmt >= 0) */
    int fmt = -1;
    int64_t touched = 0;        /* K and V elements the rows read */
};

/* v rounded to the 8-bit format fmt (saturating), and its byte. */
uint8_t fp8_byte(float v, int fmt)
{
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt == E4M3 ? __NV_E4M3 : __NV_E5M2);
}
float fp8_value(uint8_t b, int fmt)
{
    const __half_raw h = __nv_cvt_fp8_to_halfraw(b, fmt == E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
}

/* fmt >= 0: the cache's values on that 8-bit format's grid (every such
 * value is an fp16 too, so every kernel sees the same cache). */
Batch make_batch(const Shape &s, int n_rows, int min_len, int max_len, int fmt = -1)
{
    Batch b;
    b.s = s;
    b.fmt = fmt;
    b.n_rows = n_rows;
    b.max_len = max_len;
    b.max_blocks = (max_len + s.bs - 1) / s.bs;
    b.n_blocks = n_rows * b.max_blocks;
    std::vector<int32_t> order(b.n_blocks);
    for (int i = 0; i < b.n_blocks; i++)
        order[i] = i;
    for (int i = b.n_blocks - 1; i > 0; i--)
        std::swap(order[i], order[(size_t)lab_rand_range(0, i)]);
    b.tables.assign((size_t)n_rows * b.max_blocks, -1);
    const int64_t kv_dim = (int64_t)s.n_kv * s.hd;
    for (int r = 0; r < n_rows; r++) {
        b.seq.push_back(r);
        const int len = (int)lab_rand_range(min_len, max_len);
        b.pos.push_back(len - 1);
        for (int i = 0; i < (len + s.bs - 1) / s.bs; i++)
            b.tables[(size_t)r * b.max_blocks + i] = order[(size_t)r * b.max_blocks + i];
        b.touched += (int64_t)len * kv_dim * 2;
    }
    const int64_t rows = (int64_t)b.n_blocks * s.bs;
    b.k.resize((size_t)(rows * kv_dim));
    b.v.resize((size_t)(rows * kv_dim));
    b.q.resize((size_t)n_rows * s.n_heads * s.hd);
    for (auto &x : b.k)
        x = __half2float(__float2half((float)lab_rand_range(-1000, 1000) / 500.0f));
    for (auto &x : b.v)
        x = __half2float(__float2half((float)lab_rand_range(-1000, 1000) / 1000.0f));
    for (auto &x : b.q)
        x = (float)lab_rand_range(-1000, 1000) / 300.0f;
    if (fmt >= 0) {
        for (auto &x : b.k)
            x = fp8_value(fp8_byte(x, fmt), fmt);
        for (auto &x : b.v)
            x = fp8_value(fp8_byte(x, fmt), fmt);
    }
    return b;
}

std::vector<float> reference(const Batch &b)
{
    const Shape &s = b.s;
    const int group = s.n_heads / s.n_kv;
    const int64_t kv_dim = (int64_t)s.n_kv * s.hd;
    std::vector<float> out((size_t)b.n_rows * s.n_heads * s.hd);
    for (int r = 0; r < b.n_rows; r++)
        for (int h = 0; h < s.n_heads; h++) {
            const float *qh = &b.q[((size_t)r * s.n_heads + h) * s.hd];
            const int64_t off = (int64_t)(h / group) * s.hd;
            std::vector<double> sc(b.pos[r] + 1);
            std::vector<int64_t> crs(b.pos[r] + 1);
            double mx = -1e300;
            for (int t = 0; t <= b.pos[r]; t++) {
                crs[t] = (int64_t)b.tables[(size_t)b.seq[r] * b.max_blocks + t / s.bs] * s.bs +
                         t % s.bs;
                double d = 0.0;
                for (int i = 0; i < s.hd; i++)
                    d += (double)qh[i] * b.k[(size_t)(crs[t] * kv_dim + off + i)];
                sc[t] = d / sqrt((double)s.hd);
                mx = sc[t] > mx ? sc[t] : mx;
            }
            double sum = 0.0;
            for (auto &x : sc)
                sum += (x = exp(x - mx));
            for (int i = 0; i < s.hd; i++) {
                double a = 0.0;
                for (int t = 0; t <= b.pos[r]; t++)
                    a += sc[t] * b.v[(size_t)(crs[t] * kv_dim + off + i)];
                out[((size_t)r * s.n_heads + h) * s.hd + i] = (float)(a / sum);
            }
        }
    return out;
}

struct Device {
    float *q, *out, *ws, *k32, *v32;
    __half *k16, *v16;
    uint8_t *k8, *vt8, *v8; /* fmt >= 0: K, V transposed a block at a time, V as rows */
    int32_t *seq, *pos, *tables;
};

Device to_device(const Batch &b, bool with_f32)
{
    Device d{};
    d.q = upload(b.q);
    std::vector<__half> k16(b.k.size()), v16(b.v.size());
    for (size_t i = 0; i < b.k.size(); i++)
        k16[i] = __float2half(b.k[i]), v16[i] = __float2half(b.v[i]);
    d.k16 = upload(k16);
    d.v16 = upload(v16);
    if (b.fmt >= 0) {
        const Shape &s = b.s;
        const int64_t kv_dim = (int64_t)s.n_kv * s.hd;
        std::vector<uint8_t> k8(b.k.size()), vt8(b.v.size());
        for (size_t i = 0; i < b.k.size(); i++)
            k8[i] = fp8_byte(b.k[i], b.fmt);
        for (int64_t cr = 0; cr < (int64_t)b.n_blocks * s.bs; cr++)
            for (int64_t j = 0; j < kv_dim; j++) {
                const int64_t h = j / s.hd, dim = j % s.hd, block = cr / s.bs;
                vt8[(size_t)(((block * s.n_kv + h) * s.hd + dim) * s.bs + cr % s.bs)] =
                    fp8_byte(b.v[(size_t)(cr * kv_dim + j)], b.fmt);
            }
        std::vector<uint8_t> v8(b.v.size());
        for (size_t i = 0; i < b.v.size(); i++)
            v8[i] = fp8_byte(b.v[i], b.fmt);
        d.k8 = upload(k8);
        d.vt8 = upload(vt8);
        d.v8 = upload(v8);
    }
    if (with_f32) {
        d.k32 = upload(b.k);
        d.v32 = upload(b.v);
    }
    d.seq = upload(b.seq);
    d.pos = upload(b.pos);
    d.tables = upload(b.tables);
    CUDA_CHECK(cudaMalloc((void **)&d.out, b.q.size() * sizeof(float)));
    CUDA_CHECK(cudaMemset(d.out, 0xff, b.q.size() * sizeof(float))); /* poisoned: NaN */
    CUDA_CHECK(cudaMalloc((void **)&d.ws, bn_cb_attn_paged_workspace_bytes(b.s.n_heads, b.s.hd)));
    return d;
}

void free_device(Device &d)
{
    cudaFree(d.q), cudaFree(d.out), cudaFree(d.ws), cudaFree(d.k32), cudaFree(d.v32);
    cudaFree(d.k16), cudaFree(d.v16), cudaFree(d.k8), cudaFree(d.vt8), cudaFree(d.v8);
    cudaFree(d.seq), cudaFree(d.pos), cudaFree(d.tables);
}

/* A way to run the batch's attention: the shipped kernel (fp32 or fp16
 * cache) or the 8-bit kernel, with ranges of about split_len positions
 * (0: the shipped choice). */
struct Variant {
    const char *name;
    /* 0 shipped fp32, 1 shipped fp16, 2 fp8 e4m3 (V^T, padded tiles), 3 fp8
     * e5m2, 4 e4m3 swizzled, 6 shipped e4m3 (V as the cache's rows), 7-9
     * e4m3 warps on their own (4 warps x 2 stages, 4 x 3, 8 x 2, 4 x 2 at six
     * blocks an SM) */
    int kind;
    int split_len;
};

int fmt_of(const Variant &v) { return v.kind == 3 ? E5M2 : v.kind >= 2 ? E4M3 : -1; }

/* The shipped kernels' cache element for a variant. */
int shipped_kv(const Variant &v) { return v.kind == 6 ? BN_CB_KV_E4M3 : v.kind; }

/* The shipped kernel's blocks resident at once for cache element kv. */
int resident(const bn_cb_attn_shape &as, int kv)
{
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    return bn_cb_attn_paged_resident(&as, kv, sms);
}

int lab_splits(int n_rows, int max_len, int split_len)
{
    int splits = (max_len + split_len - 1) / split_len;
    splits = splits > 64 ? 64 : splits;
    while (splits > 1 && (int64_t)splits * n_rows > BN_CB_ATTN_PAGED_SHARES)
        splits--;
    return splits;
}

template <int HD, int FMT, int SWZ>
void launch_fp8(const Batch &b, const Device &d, int split_len, cudaStream_t st)
{
    const Shape &s = b.s;
    const size_t smem = Fp8Tiles<HD, SWZ>::kSmem;
    CUDA_CHECK(cudaFuncSetAttribute(attn_paged_fp8<HD, FMT, SWZ>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int splits = lab_splits(b.n_rows, b.max_len, split_len);
    const int64_t ld = (int64_t)s.n_heads * s.hd;
    int bs_log2 = 0;
    while ((1 << bs_log2) < s.bs)
        bs_log2++;
    if ((1 << bs_log2) != s.bs || s.bs < 16) {
        fprintf(stderr, "the 8-bit kernel takes blocks of a power of two >= 16 positions\n");
        exit(1);
    }
    attn_paged_fp8<HD, FMT, SWZ><<<dim3(b.n_rows, s.n_kv, splits), kThreads, smem, st>>>(
        s.n_heads, s.n_kv, d.q, ld, d.seq, d.pos, d.tables, b.max_blocks, bs_log2, d.k8,
        d.vt8,
        (float)(1.0 / sqrt((double)HD)), split_len, d.out, ld, d.ws);
    CUDA_CHECK(cudaGetLastError());
    if (splits > 1) {
        merge_len<<<dim3(b.n_rows, s.n_heads), HD, 0, st>>>(s.n_heads, HD, splits, split_len,
                                                           d.pos, d.ws, d.out, ld);
        CUDA_CHECK(cudaGetLastError());
    }
}

template <int W, int S, int MINB = 1>
void launch_warps(const Batch &b, const Device &d, int split_len, cudaStream_t st)
{
    const Shape &s = b.s;
    const size_t smem = (size_t)W * S * 2 * kSub * 128;
    CUDA_CHECK(cudaFuncSetAttribute(attn_paged_warps<W, S, MINB>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int splits = lab_splits(b.n_rows, b.max_len, split_len);
    const int64_t ld = (int64_t)s.n_heads * s.hd;
    int bs_log2 = 0;
    while ((1 << bs_log2) < s.bs)
        bs_log2++;
    attn_paged_warps<W, S, MINB><<<dim3(b.n_rows, s.n_kv, splits), W * 32, smem, st>>>(
        s.n_heads, s.n_kv, d.q, ld, d.seq, d.pos, d.tables, b.max_blocks, bs_log2, d.k8, d.v8,
        (float)(1.0 / sqrt(128.0)), split_len, d.out, ld, d.ws);
    CUDA_CHECK(cudaGetLastError());
    if (splits > 1) {
        merge_len<<<dim3(b.n_rows, s.n_heads), 128, 0, st>>>(s.n_heads, 128, splits, split_len,
                                                             d.pos, d.ws, d.out, ld);
        CUDA_CHECK(cudaGetLastError());
    }
}

void run(const Variant &v, const Batch &b, const Device &d, cudaStream_t st)
{
    const Shape &s = b.s;
    const int64_t ld = (int64_t)s.n_heads * s.hd;
    if (v.kind < 2 || v.kind == 6) {
        const bn_cb_attn_shape as = {s.n_heads, s.n_kv, s.hd, 0};
        const int splits = v.split_len
                               ? lab_splits(b.n_rows, b.max_len, v.split_len)
                               : bn_cb_attn_paged_splits(b.n_rows, b.max_len - 1, s.n_kv,
                                                         resident(as, shipped_kv(v)),
                                                         shipped_kv(v));
        CUDA_CHECK(bn_cb_attn_paged(&as, d.q, ld, b.n_rows, d.seq, d.pos, d.tables, b.max_blocks,
                                    s.bs,
                                    v.kind == 6   ? (const void *)d.k8
                                    : v.kind == 1 ? (const void *)d.k16
                                                  : d.k32,
                                    v.kind == 6   ? (const void *)d.v8
                                    : v.kind == 1 ? (const void *)d.v16
                                                  : d.v32,
                                    shipped_kv(v), splits, NULL, d.out, ld, d.ws, st));
        return;
    }
    const int split_len = v.split_len ? v.split_len : 128;
    if (v.kind >= 7) {
        v.kind == 7   ? launch_warps<4, 2>(b, d, split_len, st)
        : v.kind == 8 ? launch_warps<4, 3>(b, d, split_len, st)
        : v.kind == 9 ? launch_warps<8, 2>(b, d, split_len, st)
                      : launch_warps<4, 2, 6>(b, d, split_len, st);
        return;
    }
    if (s.hd == 128)
        v.kind == 2   ? launch_fp8<128, E4M3, 0>(b, d, split_len, st)
        : v.kind == 3 ? launch_fp8<128, E5M2, 0>(b, d, split_len, st)
                      : launch_fp8<128, E4M3, 1>(b, d, split_len, st);
    else
        v.kind == 2   ? launch_fp8<64, E4M3, 0>(b, d, split_len, st)
        : v.kind == 3 ? launch_fp8<64, E5M2, 0>(b, d, split_len, st)
                      : launch_fp8<64, E4M3, 1>(b, d, split_len, st);
}

bool check(const Variant &v, const Shape &s, int n_rows, int min_len, int max_len)
{
    if (v.kind >= 2 && s.n_heads / s.n_kv > kMaxGroup)
        return true; /* the 8-bit kernel's groups: at most 8 q heads */
    if (v.kind >= 7 && (s.hd != 128 || s.bs < kSub))
        return true; /* the warps' kernel: head dim 128, blocks of 16 or more */
    Batch b = make_batch(s, n_rows, min_len, max_len, fmt_of(v));
    Device d = to_device(b, v.kind == 0);
    run(v, b, d, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got(b.q.size());
    CUDA_CHECK(cudaMemcpy(got.data(), d.out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const std::vector<float> want = reference(b);
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); i++) {
        const double e = fabs((double)got[i] - want[i]);
        worst = !(e <= worst) ? e : worst; /* NaN wins */
    }
    free_device(d);
    /* fp16 q and P against the reference's exact ones (the cache values are
     * the same). */
    const double tol = v.kind >= 2 ? 1e-2 : 2e-5;
    const bool ok = worst <= tol;
    printf("check %-22s heads %2d/%d hd %3d block %2d, %2d rows of %3d-%4d positions: max |err| "
           "%.2e %s\n",
           v.name, s.n_heads, s.n_kv, s.hd, s.bs, n_rows, min_len, max_len, worst,
           ok ? "ok" : "FAIL");
    return ok;
}

void time_variant(const Variant &v, const Batch &b, const Device &d, double copy_rate)
{
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreate(&st));
    run(v, b, d, st);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    const int calls = 20;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++)
        run(v, b, d, st);
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int rep = 0; rep < 3; rep++) {
        CUDA_CHECK(cudaEventRecord(e0, st));
        CUDA_CHECK(cudaGraphLaunch(ge, st));
        CUDA_CHECK(cudaEventRecord(e1, st));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        best = ms < best ? ms : best;
    }
    const double us = best * 1e3 / calls;
    const double bytes = (double)b.touched * (v.kind == 0 ? 4 : v.kind == 1 ? 2 : 1);
    const double gbs = bytes / (us * 1e-6) / 1e9;
    printf("time %-22s %3d rows x %4d positions: %8.1f us a layer, %6.0f GB/s of K and V (%3.0f "
           "%% of copy)\n",
           v.name, b.n_rows, b.max_len, us, gbs, 100.0 * gbs / copy_rate);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(st);
}

} // namespace

int main(int argc, char **argv)
{
    const Variant variants[] = {
        {"shipped fp32", 0, 0},
        {"shipped fp16", 1, 0},
        {"shipped fp16, 256", 1, 256},
        {"fp8 e4m3, 128", 2, 128},
        {"fp8 e4m3, 256", 2, 256},
        {"fp8 e4m3, 512", 2, 512},
        {"fp8 e5m2, 256", 3, 256},
        {"e4m3 swizzled, 128", 4, 128},
        {"e4m3 swizzled, 256", 4, 256},
        {"e4m3 swizzled, 512", 4, 512},
        {"shipped e4m3, 128", 6, 128},
        {"shipped e4m3, 256", 6, 256},
        {"shipped e4m3", 6, 0},
        {"e4m3 warps 4x2, 320", 7, 320},
        {"e4m3 warps 4x2, 640", 7, 640},
        {"e4m3 warps 4x3, 320", 8, 320},
        {"e4m3 warps 4x3, 640", 8, 640},
        {"e4m3 warps 8x2, 320", 9, 320},
        {"e4m3 warps 8x2, 640", 9, 640},
        {"e4m3 warps 4x2/6, 320", 10, 320},
        {"e4m3 warps 4x2/6, 640", 10, 640},
    };
    /* LAB_PROFILE=rows,len: each variant once on that batch, no checks
     * and no graphs (for ncu). */
    if (const char *prof = getenv("LAB_PROFILE")) {
        int rows = 64, len = 577;
        sscanf(prof, "%d,%d", &rows, &len);
        Batch b = make_batch({20, 5, 128, 32}, rows, len, len, E4M3);
        Device d = to_device(b, true);
        for (const Variant &v : variants)
            run(v, b, d, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        free_device(d);
        return 0;
    }
    bool ok = true;
    for (const Variant &v : variants) {
        ok &= check(v, {20, 5, 128, 32}, 9, 1, 300);
        ok &= check(v, {20, 5, 128, 16}, 5, 30, 70);
        ok &= check(v, {8, 2, 64, 32}, 12, 1, 200);
        ok &= check(v, {4, 4, 128, 64}, 3, 60, 130);
        ok &= check(v, {32, 2, 128, 16}, 4, 100, 700); /* 16 q heads a kv head */
    }
    if (!ok) {
        printf("FAILED\n");
        return 1;
    }
    const double copy = copy_gbs();
    printf("copy bandwidth %.0f GB/s (read + write)\n", copy);
    for (int a = 1; a < (argc > 1 ? argc : 2); a++) {
        const int len = argc > 1 ? atoi(argv[a]) : 577;
        for (int rows : {1, 8, 32, 64, 128, 256}) {
            /* e4m3 bytes; the e5m2 variants read them as e5m2 (finite at
             * these magnitudes): timing only. */
            Batch b = make_batch({20, 5, 128, 32}, rows, len, len, E4M3);
            Device d = to_device(b, true);
            for (const Variant &v : variants)
                time_variant(v, b, d, copy);
            free_device(d);
        }
    }
    return 0;
}
