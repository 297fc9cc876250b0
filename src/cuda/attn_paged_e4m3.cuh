/*
 * attn_paged_e4m3.cuh - the paged decode attention over an 8-bit cache
 * (fp8 e4m3: a byte a value, half the fp16 cache's reads) on the tensor
 * cores; part of attn_paged.cu, which launches it for groups of up to 8 q
 * heads a kv head (the FMA kernel there takes the rest).
 *
 * The cache keeps the fp16 cache's layout, a row of n_kv * head_dim bytes
 * a position for K and for V. A block (row, kv head, split) of four warps
 * takes 64 positions a tile, two tiles in flight (the bytes of 32 fp16
 * positions):
 *
 *   scores^T (64 keys x heads) = K q^T     warp w: keys 16 w .. + 15, all
 *                                          dims; K fragments by ldmatrix on
 *                                          byte rows: a b16 element is two
 *                                          values, so lane (g, t) receives
 *                                          dims 4 t .. 4 t + 3 of key g
 *   online softmax                         every warp alike from the shared
 *                                          scores, in base 2
 *   out^T (dims x heads) += V^T P^T        warp w: dims 32 w .. + 31; lane
 *                                          (g, t) reads keys 4 t .. + 3 of
 *                                          dims 4 g .. + 3 as four words and
 *                                          transposes them in registers
 *
 * Each byte pair widens to an fp16 pair (cvt e4m3x2, one instruction); the
 * k order this gives (4 t, 4 t + 1 at k = 2 t, 2 t + 1; 4 t + 2, 4 t + 3 at
 * k = 2 t + 8, 2 t + 9) is matched by how q and P are packed, and the dims
 * a lane's rows stand for by where its outputs go. q (scaled by head_dim^-0.5
 * log2(e)) and P are single fp16 values: the cache's own rounding (2^-4
 * relative) dwarfs theirs. Sums are fp32; outputs and shares have the
 * other kernels' layout (the shares' maximum in natural units).
 *
 * Tiles sit in shared memory unpadded with each row's 16-byte chunks
 * permuted (chunk c of row r at c ^ f(r)) so that the lanes of one ldmatrix
 * or of one transposing read fall in different banks; without padding six
 * blocks fit an SM. Row offsets come from table entries loaded a tile ahead
 * (attn_paged_block.cuh), and cp.async's ignore-src zero-fills positions
 * past the range. dev/cuda/attn_paged_mma.cu holds this kernel's forms and
 * their timings.
 */
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "attn_paged_block.cuh"
#include "cp_async.cuh"
#include "e4m3.cuh"
#include "mma_f16.cuh"

namespace {

constexpr int kE4m3Tile = 64; /* positions a tile */
constexpr int kE4m3Warps = 4;
constexpr int kE4m3MaxGroup = 8; /* q heads a kv head: the n = 8 columns */
constexpr int kE4m3ScoreStride = kE4m3Tile + 4;

/* Four words of four keys' bytes (x[i]: key i, dims 0-3) as four words of
 * four dims' bytes (y[k]: dim k, keys 0-3). */
__device__ __forceinline__ void transpose_4x4_bytes(const uint32_t (&x)[4], uint32_t (&y)[4])
{
    const uint32_t a = __byte_perm(x[0], x[1], 0x5140), b = __byte_perm(x[0], x[1], 0x7362);
    const uint32_t c = __byte_perm(x[2], x[3], 0x5140), d = __byte_perm(x[2], x[3], 0x7362);
    y[0] = __byte_perm(a, c, 0x5410), y[1] = __byte_perm(a, c, 0x7632);
    y[2] = __byte_perm(b, d, 0x5410), y[3] = __byte_perm(b, d, 0x7632);
}

template <int HD> struct E4m3Tiles {
    static_assert(HD == 64 || HD == 128, "head_dim 64 or 128");
    static constexpr int kChunks = HD / 16; /* 16-byte chunks a row */
    /* K rows, read by ldmatrix: eight rows at one chunk in eight bank
     * groups. */
    static __device__ __forceinline__ int k_at(int r, int c)
    {
        return r * HD + 16 * (HD == 128 ? c ^ (r & 7) : c ^ ((r >> 1) & 3));
    }
    /* V rows, read as words (rows 4 t + i, words 8 w + g of the lanes):
     * for head_dim 128 the 32 lanes in 32 banks, for 64 two to a bank. */
    static __device__ __forceinline__ int v_at(int r, int c)
    {
        return r * HD + 16 * (c ^ (2 * ((r >> 2) & (HD == 128 ? 3 : 1))));
    }
    static constexpr int TILE = kE4m3Tile * HD; /* bytes of K (or V) a tile */
    /* A thread's copies: chunk c of rows r0, r0 + kRowStep, ... of both
     * tiles; the steps keep every row's chunk permutation. */
    static constexpr int kThreads = 32 * kE4m3Warps;
    static constexpr int kRowStep = kThreads / kChunks, kRounds = kE4m3Tile / kRowStep;
    static_assert(kRowStep % 8 == 0 && kE4m3Tile % kRowStep == 0, "row steps of 8");
    /* Two buffers of K and V tiles, the scores, the two tiles' offsets. */
    static constexpr size_t kSmem = 4 * (size_t)TILE +
                                    sizeof(float) * kE4m3MaxGroup * kE4m3ScoreStride +
                                    sizeof(int64_t) * 2 * kE4m3Tile;
};

template <int HD>
__global__ void __launch_bounds__(32 * kE4m3Warps, 6) /* six blocks an SM: at most 80 registers */
    attn_paged_e4m3_kernel(int n_heads, int n_kv, const float *__restrict__ q, int64_t ldq,
                           const int32_t *__restrict__ row_seq,
                           const int32_t *__restrict__ row_pos,
                           const int32_t *__restrict__ tables, int max_blocks, int bs,
                           const __nv_fp8_e4m3 *__restrict__ kc,
                           const __nv_fp8_e4m3 *__restrict__ vc, float scale,
                           const int32_t *__restrict__ rows, float *__restrict__ out,
                           int64_t ldo, float *__restrict__ part)
{
    using T = E4m3Tiles<HD>;
    constexpr int TILE = T::TILE;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* [2][K, V][64][HD] bytes, the scores [8][68], the offsets [2][64]. */
    uint8_t *tiles = smem_raw;
    float *sc = reinterpret_cast<float *>(tiles + 4 * TILE);
    int64_t *rofs = reinterpret_cast<int64_t *>(sc + kE4m3MaxGroup * kE4m3ScoreStride);
    const uint8_t *kb = reinterpret_cast<const uint8_t *>(kc);
    const uint8_t *vb = reinterpret_cast<const uint8_t *>(vc);
    const int group = n_heads / n_kv;
    const int kvh = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t kv_dim = (int64_t)n_kv * HD, head_off = (int64_t)kvh * HD;
    PagedRange range;
    if (!paged_block_range(rows, row_seq, row_pos, tables, max_blocks, range))
        return;
    const int row = range.row, begin = range.begin, end = range.end;

    /* The first tile's offsets, and the second tile's table entries. */
    int ahead = paged_offsets_first<kE4m3Tile>(rofs, range, bs, kv_dim, head_off);

    /* q of head gid (zeros past the group) as B fragments in base 2: k16
     * step s takes dims 16 s + 4 tig + {0, 1} and + {2, 3}. */
    uint32_t qb[HD / 16][2];
    {
        const float qscale = scale * kLog2e;
        const bool live = gid < group;
        const float *qr = q + (int64_t)row * ldq + (int64_t)(kvh * group + (live ? gid : 0)) * HD +
                          4 * tig;
#pragma unroll
        for (int s = 0; s < HD / 16; s++) {
            const float4 v = live ? *reinterpret_cast<const float4 *>(qr + 16 * s)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            qb[s][0] = f16x2_of(v.x * qscale, v.y * qscale);
            qb[s][1] = f16x2_of(v.z * qscale, v.w * qscale);
        }
    }

    const int r0 = threadIdx.x / T::kChunks, c = threadIdx.x % T::kChunks;
    const uint32_t tiles_s = (uint32_t)__cvta_generic_to_shared(tiles);
    auto copy_tiles = [&](int b) {
        const uint32_t kt_s = tiles_s + (uint32_t)(b * 2 * TILE);
        const uint32_t k_at = kt_s + T::k_at(r0, c), v_at = kt_s + TILE + T::v_at(r0, c);
#pragma unroll
        for (int k = 0; k < T::kRounds; k++) {
            const int64_t o = rofs[b * kE4m3Tile + r0 + k * T::kRowStep];
            const uint32_t step = (uint32_t)(k * T::kRowStep * HD);
            cp_async16_or_zero(k_at + step, kb + o + 16 * c, o < 0);
            cp_async16_or_zero(v_at + step, vb + o + 16 * c, o < 0);
        }
    };
    __syncthreads();
    if (begin < end)
        copy_tiles(0);
    cp_async_commit();

    float m = -INFINITY, l = 0.0f; /* head gid's running maximum (base 2) and weight */
    float o[2][4] = {};            /* dims 32 warp + 4 gid + 2 mt (+ 1) x heads */
    for (int t0 = begin, buf = 0; t0 < end; t0 += kE4m3Tile, buf ^= 1) {
        paged_tile_turn<kE4m3Tile>(t0, buf, rofs, ahead, range, bs, kv_dim, head_off,
                                   copy_tiles);
        const uint8_t *kt = tiles + buf * 2 * TILE, *vt = kt + TILE;

        /* Scores of keys 16 warp .. + 15 over all dims, as two chains of
         * products (even and odd k16 steps). */
        float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s4b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int u = 0; u < HD / 32; u++) {
            uint32_t r[4], a0[4], a1[4];
            ldmatrix_x4(r, kt + T::k_at(16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1),
                                        2 * u + (lane >> 4)));
            e4m3x4_to_f16(r[0], a0[0], a0[2]);
            e4m3x4_to_f16(r[1], a0[1], a0[3]);
            e4m3x4_to_f16(r[2], a1[0], a1[2]);
            e4m3x4_to_f16(r[3], a1[1], a1[3]);
            mma_f16_16816(s4, a0, qb[2 * u][0], qb[2 * u][1]);
            mma_f16_16816(s4b, a1, qb[2 * u + 1][0], qb[2 * u + 1][1]);
        }
        /* c0, c1: key 16 warp + gid, heads 2 tig, 2 tig + 1; c2, c3: key + 8. */
        float *sh = sc + 16 * warp + gid;
        sh[(2 * tig) * kE4m3ScoreStride] = s4[0] + s4b[0];
        sh[(2 * tig + 1) * kE4m3ScoreStride] = s4[1] + s4b[1];
        sh[(2 * tig) * kE4m3ScoreStride + 8] = s4[2] + s4b[2];
        sh[(2 * tig + 1) * kE4m3ScoreStride + 8] = s4[3] + s4b[3];
        __syncthreads();

        /* Head gid's keys 16 j + 4 tig + {0 .. 3}; -inf past the range. */
        float p[4][4];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int key = 16 * j + 4 * tig;
            const float4 a = *reinterpret_cast<const float4 *>(sc + gid * kE4m3ScoreStride + key);
            p[j][0] = a.x, p[j][1] = a.y, p[j][2] = a.z, p[j][3] = a.w;
            if (t0 + kE4m3Tile > end) /* the range's last tile */
#pragma unroll
                for (int e = 0; e < 4; e++)
                    p[j][e] = t0 + key + e < end ? p[j][e] : -INFINITY;
            mx = fmaxf(mx, fmaxf(fmaxf(p[j][0], p[j][1]), fmaxf(p[j][2], p[j][3])));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx); /* finite: key t0 is in the range */
        const float corr = exp2_approx(m - m_new);
        float sum = 0.0f;
        uint32_t pb[4][2];
#pragma unroll
        for (int j = 0; j < 4; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[j][e] = exp2_approx(p[j][e] - m_new);
                sum += p[j][e];
            }
            pb[j][0] = f16x2_of(p[j][0], p[j][1]);
            pb[j][1] = f16x2_of(p[j][2], p[j][3]);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l = fmaf(l, corr, sum);
        m = m_new;

        /* The accumulators of heads 2 tig and 2 tig + 1 (lanes 8 tig and
         * 8 tig + 4 hold those heads' factors), then this tile's P V. */
        const float ca = __shfl_sync(0xffffffffu, corr, 8 * tig);
        const float cb = __shfl_sync(0xffffffffu, corr, 8 * tig + 4);
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            o[mt][0] *= ca;
            o[mt][1] *= cb;
            o[mt][2] *= ca;
            o[mt][3] *= cb;
        }
        if (warp < HD / 32) {
            const int w = 8 * warp + gid; /* the word of dims 4 gid .. + 3 */
#pragma unroll
            for (int j = 0; j < kE4m3Tile / 16; j++) {
                uint32_t x[4], y[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 16 * j + 4 * tig + e;
                    x[e] = *reinterpret_cast<const uint32_t *>(vt + T::v_at(r, w >> 2) +
                                                               4 * (w & 3));
                }
                transpose_4x4_bytes(x, y);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    uint32_t a[4];
                    e4m3x4_to_f16(y[2 * mt], a[0], a[2]);
                    e4m3x4_to_f16(y[2 * mt + 1], a[1], a[3]);
                    mma_f16_16816(o[mt], a, pb[j][0], pb[j][1]);
                }
            }
        }
    }
    cp_async_wait<0>();
    if (warp >= HD / 32)
        return;
    /* o[mt][e]: dim 32 warp + 4 gid + 2 mt (+ 1 for e >= 2). */
    paged_write_result<HD, 2>(
        o, m, l, [&](int mt, int half) { return 32 * warp + 4 * gid + 2 * mt + half; },
        warp == 0, n_heads, group, row, kvh, out, ldo, part);
}

} // namespace
