/*
 * attn_decode_block.cuh - one block's work in the decode attention over the
 * fp32 KV cache (attn_decode.cu): the kernels' arguments; a tile of cache
 * rows loaded into registers; q and the token's own k and v from the raw
 * q|k|v row (scale, RoPE: rope.cuh); scores, online softmax and p . V for G
 * query heads of one kv head; the merge of a block's warps; the L2 prefetch
 * of the next layer's cache. The ticket and cluster kernels share all of
 * it and differ in how they cut the length and merge their blocks.
 */
#ifndef BN_ATTN_DECODE_BLOCK_CUH
#define BN_ATTN_DECODE_BLOCK_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "attn_f32.cuh"
#include "block_reduce.cuh"
#include "cuda_backend_kernels.h"
#include "rope.cuh"

constexpr int kDecWarps = 8;  /* decode: warps per block                  */
/* Decode: positions per warp per tile. With 5 a 2B-4T block of a cluster
 * of 8 has all of its 80 positions at context 640 in flight before the PDL
 * wait (then as two tiles of 8 warps, now one of 16: cluster_warps), where
 * 4 left a third tile to load after it: the H200 step 985-992 against
 * 1001-1008 us (6: 995-1004), alternated in one run. */
constexpr int kDecRows = 5;
constexpr int kDecTile = kDecWarps * kDecRows;
constexpr int kMinRange = kDecTile;
constexpr int kMaxSplits = 64;
constexpr int kMergeBatch = 16; /* ranges a merging thread loads at once */
constexpr int kMergeParts = 8;  /* at most this many threads per output  */

/* Positions per range for a length len cut into `splits` ranges. */
__host__ __device__ __forceinline__ int split_chunk(int len, int splits)
{
    const int chunk = (len + splits - 1) / splits;
    return chunk < kMinRange ? kMinRange : chunk;
}

/* The (cos, sin) of values 4 ch .. 4 ch + 3 of a head from the position's
 * table row (zeros beyond the rotated dimensions, or without a row). The
 * table is written once at create(): it may be read before the wait. vec:
 * half % 4 == 0 and the table 16-byte aligned, so a chunk lies in one half
 * and its four pairs are two float4 loads. */
__device__ __forceinline__ void rope_cs(float2 (&c)[4], const float2 *row, int ch, int half,
                                        bool vec)
{
    const int d0 = 4 * ch;
#pragma unroll
    for (int e = 0; e < 4; e++)
        c[e] = make_float2(0.0f, 0.0f);
    if (!row || d0 >= 2 * half)
        return;
    if (vec) {
        const float4 *r4 = reinterpret_cast<const float4 *>(row + (d0 < half ? d0 : d0 - half));
        const float4 x = __ldg(r4), y = __ldg(r4 + 1);
        c[0] = make_float2(x.x, x.y);
        c[1] = make_float2(x.z, x.w);
        c[2] = make_float2(y.x, y.y);
        c[3] = make_float2(y.z, y.w);
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int d = d0 + e;
        if (d < 2 * half)
            c[e] = __ldg(row + (d < half ? d : d - half));
    }
}

/* Values 4 ch .. 4 ch + 3 of a head after scale and RoPE: rope_pair's
 * operations, as in rope_value (so bn_cb_qkv_post's values bit for bit), with the head's raw
 * values loaded as float4 (the chunk and, rotated, its partner chunk) when
 * vec (see rope_cs). */
template <bool kSm = false>
__device__ __forceinline__ float4 rope4(const float *head, int ch, float sc, int half,
                                        const float2 (&c)[4], bool vec)
{
    const int d0 = 4 * ch;
    const float4 *h4 = reinterpret_cast<const float4 *>(head);
    if (d0 >= 2 * half) {
        const float4 r = raw_ld<kSm>(h4 + ch);
        return make_float4(__fmul_rn(r.x, sc), __fmul_rn(r.y, sc), __fmul_rn(r.z, sc),
                           __fmul_rn(r.w, sc));
    }
    float r[4];
    if (vec) {
        const bool lo = d0 < half;
        const float4 own = raw_ld<kSm>(h4 + ch);
        const float4 oth = raw_ld<kSm>(h4 + (lo ? ch + half / 4 : ch - half / 4));
        const float o[4] = {own.x, own.y, own.z, own.w}, t[4] = {oth.x, oth.y, oth.z, oth.w};
#pragma unroll
        for (int e = 0; e < 4; e++)
            r[e] = rope_pair(__fmul_rn(o[e], sc), __fmul_rn(t[e], sc), lo, c[e]);
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++)
            r[e] = rope_value<kSm>(head, d0 + e, sc, half, c[e]);
    }
    return make_float4(r[0], r[1], r[2], r[3]);
}

/* v[g] holds a lane's partial sum for query head g; on return every lane
 * holds the warp's sums. G = 1: the butterfly. G = 2, 4: a reduce-scatter
 * first (at xor 16 each lane keeps half the heads and sends the other half,
 * at xor 8 (G = 4) half again), so the lanes of each 32/G-lane group sum one
 * head with the remaining xor steps, then broadcast: 8 (G = 2) or 10
 * (G = 4) shuffles instead of 5 G. Each step adds the same two operands in
 * both partners, so every lane of a group holds the same value and the sums
 * do not depend on the lane. */
template <int G> __device__ __forceinline__ void reduce_heads(float (&v)[G], int lane)
{
    if constexpr (G == 1) {
        v[0] = warp_reduce(v[0], SumF());
    } else if constexpr (G == 2) {
        const bool b16 = (lane & 16) != 0;
        float k = b16 ? v[1] : v[0];
        k += __shfl_xor_sync(kFull, b16 ? v[0] : v[1], 16);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1)
            k += __shfl_xor_sync(kFull, k, o);
        v[0] = __shfl_sync(kFull, k, 0);
        v[1] = __shfl_sync(kFull, k, 16);
    } else {
        static_assert(G == 4, "G is 1, 2 or 4");
        const bool b16 = (lane & 16) != 0, b8 = (lane & 8) != 0;
        float k0 = b16 ? v[2] : v[0], k1 = b16 ? v[3] : v[1];
        k0 += __shfl_xor_sync(kFull, b16 ? v[0] : v[2], 16);
        k1 += __shfl_xor_sync(kFull, b16 ? v[1] : v[3], 16);
        /* lanes with b16 hold heads 2, 3, the others 0, 1 */
        float k = b8 ? k1 : k0;
        k += __shfl_xor_sync(kFull, b8 ? k0 : k1, 8);
        /* lane holds head (lane >> 3) & 3 */
#pragma unroll
        for (int o = 4; o > 0; o >>= 1)
            k += __shfl_xor_sync(kFull, k, o);
#pragma unroll
        for (int g = 0; g < 4; g++)
            v[g] = __shfl_sync(kFull, k, 8 * g);
    }
}

struct DecodeArgs {
    bn_cb_attn_shape s;
    const float *qkv;
    float sq, sk, sv;
    const float2 *rope;
    int half;
    int rope_vec; /* rope_cs's vec */
    const int32_t *pos;
    float *kc, *vc;
    int splits;
    int subgroups; /* group / G: blocks per kv head and range */
    float scale;
    float *ws_acc, *ws_ml;
    unsigned *counters;
    float *out;
    const float *pf_k, *pf_v; /* the next layer's cache, or NULL */
    /* The q|k|v product inside the cluster kernel (attn_decode_cluster_kernel
     * with kQkv): the fused weights (tile layout, rows q | k | v), the
     * normed row's int8 codes (k_padded bytes) with their scale and sum,
     * and the block's share of the column's tiles. */
    const uint8_t *w_qkv;
    const int8_t *xq;
    const float *act_scale;
    const int32_t *act_sum;
    int groups;          /* chunk-groups per weight row (k_padded / 256)     */
    int q_tiles, kv_tiles; /* tiles of q (n_heads hd / 8) and of k, of v   */
    int col_tiles;       /* tiles of a block column: (G + 2) hd / 8        */
    int block_tiles;     /* a cluster block's share: ceil(col_tiles / C)   */
};

/* Rows [0, p) of the next layer's cache into L2, this block's share of them
 * (one bulk prefetch per cache, issued by thread 0 without waiting): they
 * are final since the last step, and the next layer's attention, a layer's
 * worth of weights later, then reads them from L2 instead of from memory
 * behind the weight traffic of the kernels in flight. */
__device__ __forceinline__ void prefetch_next_layer(const DecodeArgs &a, int p, int block,
                                                    int blocks)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x != 0 || !a.pf_k || p <= 0 || (int64_t)p > a.s.capacity)
        return;
    /* 16-byte units: a row is a multiple of 16 bytes (head_dim % 4 == 0). */
    const int64_t units = (int64_t)p * a.s.n_kv_heads * a.s.head_dim / 4;
    const int64_t per = (units + blocks - 1) / blocks;
    const int64_t begin = (int64_t)block * per;
    if (begin >= units)
        return;
    const unsigned bytes = (unsigned)(16 * (units - begin < per ? units - begin : per));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a.pf_k + 4 * begin),
                 "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a.pf_v + 4 * begin),
                 "r"(bytes)
                 : "memory");
#else
    (void)a, (void)p, (void)block, (void)blocks;
#endif
}

/* Cache rows t0 + warp * kDecRows + i (i < kDecRows) of kv head `head_off`
 * into registers, lane l holding float4 chunks l and l + 32: rows at or past
 * `stop` (the range's end, or the token's own position, which is not in the
 * cache yet) read as zeros. */
template <int KC>
__device__ __forceinline__ void load_rows(float4 (&kr)[kDecRows][KC], float4 (&vr)[kDecRows][KC],
                                          const DecodeArgs &a, int t0, int stop, int64_t head_off)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nc = a.s.head_dim / 4;
    const int64_t kv_dim = (int64_t)a.s.n_kv_heads * a.s.head_dim;
#pragma unroll
    for (int i = 0; i < kDecRows; i++) {
        const int t = t0 + warp * kDecRows + i;
#pragma unroll
        for (int c = 0; c < KC; c++) {
            const int ch = lane + 32 * c;
            kr[i][c] = make_float4(0.f, 0.f, 0.f, 0.f);
            vr[i][c] = kr[i][c];
            if (t < stop && ch < nc) {
                const int64_t off = (int64_t)t * kv_dim + head_off;
                kr[i][c] = __ldg(reinterpret_cast<const float4 *>(a.kc + off) + ch);
                vr[i][c] = __ldg(reinterpret_cast<const float4 *>(a.vc + off) + ch);
            }
        }
    }
}

/* What one block of the decode attention works with: its place (kv head,
 * its G query heads, the token's position and length) and, per warp, q of
 * the G heads and their online softmax (running max m, sum l, p . V). */
template <int KC, int G, bool kSm = false> struct DecodeBlock {
    int kvh, sub, h0, p, len, nc;
    int64_t head_off;
    bool vec;
    /* The raw q of head h0, k and v of the kv head: the q|k|v row in
     * global memory, or (kSm) the cluster kernel's own product in shared
     * memory, which sets them. */
    const float *src_q, *src_k, *src_v;
    float2 cs[KC][4]; /* the position's (cos, sin), per chunk */
    float4 q[G][KC], acc[G][KC];
    float m[G], l[G];

    __device__ DecodeBlock(const DecodeArgs &a, int col)
    {
        const int group = a.s.n_heads / a.s.n_kv_heads;
        kvh = col / a.subgroups;
        sub = col % a.subgroups;
        h0 = kvh * group + sub * G;
        nc = a.s.head_dim / 4;
        head_off = (int64_t)kvh * a.s.head_dim;
        vec = a.rope_vec != 0;
        /* The position is one of the step's inputs, uploaded before the
         * step's first kernel (which is launched without programmatic
         * serialization), so it is final before the wait (read through L2
         * all the same). */
        p = __ldcg(a.pos);
        len = p >= 0 && (int64_t)p < a.s.capacity ? p + 1 : 0;
        const int64_t q_dim = (int64_t)a.s.n_heads * a.s.head_dim;
        const int64_t kv_dim = (int64_t)a.s.n_kv_heads * a.s.head_dim;
        src_q = a.qkv ? a.qkv + (int64_t)h0 * a.s.head_dim : nullptr;
        src_k = a.qkv ? a.qkv + q_dim + head_off : nullptr;
        src_v = a.qkv ? a.qkv + q_dim + kv_dim + head_off : nullptr;
    }

    /* The position's RoPE table entries (written at create(): may be read
     * before the wait). */
    __device__ __forceinline__ void load_rope(const DecodeArgs &a)
    {
        const int lane = threadIdx.x & 31;
        /* (At length 0 there is no valid position and no table row.) */
        const float2 *row = a.half > 0 && len > 0 ? a.rope + (int64_t)p * a.half : nullptr;
#pragma unroll
        for (int c = 0; c < KC; c++)
            rope_cs(cs[c], lane + 32 * c < nc ? row : nullptr, lane + 32 * c, a.half, vec);
    }

    /* q of the G heads (scale + RoPE) from the raw product, and an empty
     * softmax. After the wait. */
    __device__ __forceinline__ void start(const DecodeArgs &a)
    {
        const int lane = threadIdx.x & 31;
        const int hd = a.s.head_dim;
#pragma unroll
        for (int g = 0; g < G; g++) {
#pragma unroll
            for (int c = 0; c < KC; c++) {
                const int ch = lane + 32 * c;
                q[g][c] = ch < nc && len > 0
                              ? rope4<kSm>(src_q + (int64_t)g * hd, ch, a.sq, a.half, cs[c], vec)
                              : make_float4(0.f, 0.f, 0.f, 0.f);
                acc[g][c] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
            m[g] = -INFINITY;
            l[g] = 0.0f;
        }
    }

    /* One tile of positions t0 .. t0 + (warps) kDecRows - 1 (those before `end`),
     * its cached rows in kr, vr (loaded with stop <= p). The warp holding
     * the token's own position computes its k and v the same way as
     * bn_cb_qkv_post (bit for bit) and uses them from registers; the kv
     * head's first block column (subgroup 0) stores them to the cache, one
     * lane per float4. Then per warp: the G heads' scores (lane-partial
     * dots, reduce_heads), the softmax update and p . V. */
    __device__ __forceinline__ void tile(const DecodeArgs &a, float4 (&kr)[kDecRows][KC],
                                         float4 (&vr)[kDecRows][KC], int t0, int end)
    {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        const int64_t kv_dim = (int64_t)a.s.n_kv_heads * a.s.head_dim;
        const int tw = t0 + warp * kDecRows; /* this warp's first position */
        if (p >= tw && p < tw + kDecRows && p < end) {
            const float *kraw = src_k;
            const float4 *vraw = reinterpret_cast<const float4 *>(src_v);
            float4 kn[KC], vn[KC];
#pragma unroll
            for (int c = 0; c < KC; c++) {
                const int ch = lane + 32 * c;
                kn[c] = vn[c] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (ch < nc) {
                    kn[c] = rope4<kSm>(kraw, ch, a.sk, a.half, cs[c], vec);
                    const float4 r = raw_ld<kSm>(vraw + ch);
                    vn[c] = make_float4(__fmul_rn(r.x, a.sv), __fmul_rn(r.y, a.sv),
                                        __fmul_rn(r.z, a.sv), __fmul_rn(r.w, a.sv));
                    if (sub == 0) {
                        const int64_t off = (int64_t)p * kv_dim + head_off;
                        reinterpret_cast<float4 *>(a.kc + off)[ch] = kn[c];
                        reinterpret_cast<float4 *>(a.vc + off)[ch] = vn[c];
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < kDecRows; i++)
                if (tw + i == p)
#pragma unroll
                    for (int c = 0; c < KC; c++) {
                        kr[i][c] = kn[c];
                        vr[i][c] = vn[c];
                    }
        }
        if (tw >= end)
            return; /* warp-uniform: no position of this warp in the tile */
        float score[kDecRows][G];
#pragma unroll
        for (int i = 0; i < kDecRows; i++) {
            float part[G];
#pragma unroll
            for (int g = 0; g < G; g++) {
                part[g] = 0.0f;
#pragma unroll
                for (int c = 0; c < KC; c++)
                    part[g] = f4_dot(q[g][c], kr[i][c], part[g]);
            }
            /* Every lane takes part in the sums; rows past the end score
             * -inf (weight 0). */
            reduce_heads<G>(part, lane);
#pragma unroll
            for (int g = 0; g < G; g++)
                score[i][g] = tw + i < end ? __fmul_rn(part[g], a.scale) : -INFINITY;
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mt = score[0][g];
#pragma unroll
            for (int i = 1; i < kDecRows; i++)
                mt = fmaxf(mt, score[i][g]);
            const float m_new = fmaxf(m[g], mt);
            if (m_new == -INFINITY)
                continue;
            const float corr = expf(m[g] - m_new); /* m == -inf: 0 */
            l[g] *= corr;
#pragma unroll
            for (int c = 0; c < KC; c++)
                acc[g][c] = f4_scale(acc[g][c], corr);
#pragma unroll
            for (int i = 0; i < kDecRows; i++) {
                const float pi = expf(score[i][g] - m_new);
                l[g] += pi;
#pragma unroll
                for (int c = 0; c < KC; c++)
                    acc[g][c] = f4_axpy(pi, vr[i][c], acc[g][c]);
            }
            m[g] = m_new;
        }
    }
};

/* The warps' partial results of a block, in shared memory, and their merge
 * into one (max, sum, acc) per head and chunk, in warp order. */
template <int KC, int G, int W = kDecWarps> struct WarpParts {
    static constexpr int kSlots = G * 32 * KC; /* (head, chunk) slots of a block */
    float m[W][G], l[W][G];
    float4 acc[W * kSlots];

    template <class Block> __device__ __forceinline__ void put(const Block &b)
    {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        if (lane == 0)
#pragma unroll
            for (int g = 0; g < G; g++) {
                m[warp][g] = b.m[g];
                l[warp][g] = b.l[g];
            }
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int c = 0; c < KC; c++)
                if (lane + 32 * c < b.nc)
                    acc[warp * kSlots + g * 32 * KC + lane + 32 * c] = b.acc[g][c];
    }

    /* Slot o (head g = o / (32 KC)) over the warps: its max, sum and
     * weighted acc. After a barrier that follows every warp's put(). */
    __device__ __forceinline__ float4 merge(int o, int g, float &mx, float &total) const
    {
        mx = -INFINITY;
        for (int w = 0; w < W; w++)
            mx = fmaxf(mx, m[w][g]);
        total = 0.0f;
        float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
        if (mx != -INFINITY)
            for (int w = 0; w < W; w++) {
                const float e = expf(m[w][g] - mx);
                total += l[w][g] * e;
                r = f4_axpy(e, acc[w * kSlots + o], r);
            }
        return r;
    }
};

#endif
