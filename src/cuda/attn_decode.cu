/*
 * attn_decode.cu - the decode step's attention over the fp32 KV cache: one
 * token's q against every cached position, with its q|k|v epilogue (scales,
 * RoPE, the KV store) done inside (bn_cb_attn_decode and its helpers in
 * cuda_backend_kernels.h). Two kernels share a block's work
 * (attn_decode_block.cuh) and differ in how the length is cut and merged:
 * in thread-block clusters through distributed shared memory where the
 * device has them (sm_90), which may also compute the q|k|v product itself;
 * else in ranges merged through a workspace by the last block of a column.
 * docs/CUDA.md, "The decode step".
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn_decode_block.cuh"
#include "pdl.cuh"
#include "smem_opt_in.cuh"
#include "w2a8_gemv.cuh"

namespace {

/* Decode through a ticket, grid (n_heads / G, splits), kDecWarps warps.
 * Block (x, split) takes G query heads of one kv head (kv head
 * x / subgroups, its heads (x % subgroups) G .. + G - 1), so each cache row
 * it reads serves G heads, over its range of positions in tiles of
 * kDecTile; warp w takes the tile's positions w * kDecRows .. + kDecRows - 1,
 * all loaded at once.
 *
 *   1. Before waiting for the q|k|v product (pdl.cuh): the range's first
 *      tile of cached rows (earlier tokens: final since the last step) and
 *      the position's RoPE table entries (written at create()).
 *   2. q of the G heads; the tiles (DecodeBlock::tile); the warps merge in
 *      shared memory in warp order.
 *   3. A length that fits one range (active == 1) is written to out
 *      directly. Otherwise each block writes (max, sum, acc) of its range
 *      and heads to the workspace, and the block that completes the column's
 *      last range (a counter per column, reset by it) merges the ranges:
 *      up to kMergeParts threads per output value, each over a fixed subset
 *      of the ranges in a fixed order (ranges part, part + parts, ...;
 *      kMergeBatch loads in flight), then the parts in part order. The
 *      order depends on the length only, never on which block is last.
 *
 * Ranges past the length (short contexts) have nothing to do; range 0
 * always takes part, so a head is written (zeros) even at length 0. The
 * cluster kernel below does without the workspace and the ticket where the
 * device has thread-block clusters. */
template <int KC, int G>
__global__ void __launch_bounds__(32 * kDecWarps, KC == 1 ? 2 : 1) attn_decode_kernel(DecodeArgs a)
{
    constexpr int kSlots = WarpParts<KC, G>::kSlots;
    __shared__ WarpParts<KC, G> parts_sm;
    __shared__ float sm_pm[32 * kDecWarps], sm_pl[32 * kDecWarps];
    __shared__ bool sm_last;
    const int col = blockIdx.x, split = blockIdx.y;
    DecodeBlock<KC, G> b(a, col);
    const int nc = b.nc, p = b.p, len = b.len, h0 = b.h0;
    const int chunk = split_chunk(len, a.splits);
    const int active = len > 0 ? (len + chunk - 1) / chunk : 1;
    const int begin = (int)min((int64_t)split * chunk, (int64_t)len);
    const int end = (int)min((int64_t)begin + chunk, (int64_t)len);

    float4 kr[kDecRows][KC], vr[kDecRows][KC];
    if (split < active) {
        load_rows<KC>(kr, vr, a, begin, p < end ? p : end, b.head_off);
        b.load_rope(a);
    }
    prefetch_next_layer(a, p, col + gridDim.x * split, gridDim.x * gridDim.y);
    pdl_trigger();
    pdl_wait();
    if (split >= active)
        return;

    b.start(a);
    pdl_mark(0);
    for (int t0 = begin; t0 < end; t0 += kDecTile) {
        if (t0 != begin)
            load_rows<KC>(kr, vr, a, t0, p < end ? p : end, b.head_off);
        b.tile(a, kr, vr, t0, end);
    }

    /* The warps' (max, sum, acc) into one per head for the range. */
    parts_sm.put(b);
    __syncthreads();
    pdl_mark(1);
    float4 *out4 = reinterpret_cast<float4 *>(a.out);
    for (int o = threadIdx.x; o < kSlots; o += blockDim.x) {
        const int g = o / (32 * KC), ch = o % (32 * KC);
        if (ch >= nc)
            continue;
        float mx, total;
        const float4 r = parts_sm.merge(o, g, mx, total);
        const int h = h0 + g;
        if (active == 1) {
            out4[(int64_t)h * nc + ch] =
                total > 0.0f ? f4_div(r, total) : make_float4(0.f, 0.f, 0.f, 0.f);
        } else {
            const int64_t slot = (int64_t)h * a.splits + split;
            reinterpret_cast<float4 *>(a.ws_acc)[slot * nc + ch] = r;
            if (ch == 0) {
                a.ws_ml[2 * slot] = mx;
                a.ws_ml[2 * slot + 1] = total;
            }
        }
    }
    if (active == 1) /* block-uniform: the only range, written above */
        return;

    /* Last block of the column? The barrier orders the block's workspace
     * writes before thread 0's release fence and ticket, so they are
     * visible to whoever sees the ticket; the last block's thread 0
     * acquires after every ticket, and the barrier after it orders the
     * block's reads (through L2) behind that. Only thread 0 fences
     * (acquire-release at GPU scope, not the sequentially consistent
     * __threadfence of every thread). */
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        const bool last = atomicAdd(&a.counters[col], 1u) == (unsigned)active - 1;
        if (last) {
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            a.counters[col] = 0; /* every range has counted: ready for the next launch */
        }
        sm_last = last;
    }
    __syncthreads();
    pdl_mark(2);
    if (!sm_last)
        return;

    /* Merge the ranges: a range's weight is exp(m_s - M) over the ranges
     * that saw any position (sum > 0). Thread (part, o) takes output float4
     * o (head g, chunk ch) over ranges part, part + parts, ... in order,
     * kMergeBatch loads at a time, with a running maximum. */
    const int nq = G * nc;
    int parts = (int)blockDim.x / nq;
    parts = parts < 1 ? 1 : parts > kMergeParts ? kMergeParts : parts;
    const int t = threadIdx.x;
    float M = -INFINITY, L = 0.0f;
    float4 R = make_float4(0.f, 0.f, 0.f, 0.f);
    const bool merger = t < parts * nq;
    if (merger) {
        const int o = t % nq, part = t / nq;
        const int g = o / nc, ch = o % nc, h = h0 + g;
        const float2 *ml = reinterpret_cast<const float2 *>(a.ws_ml) + (int64_t)h * a.splits;
        const float4 *wa =
            reinterpret_cast<const float4 *>(a.ws_acc) + (int64_t)h * a.splits * nc + ch;
        for (int b0 = part; b0 < active; b0 += parts * kMergeBatch) {
            float2 mlv[kMergeBatch];
            float4 av[kMergeBatch];
#pragma unroll
            for (int j = 0; j < kMergeBatch; j++) {
                const int sp = b0 + j * parts;
                mlv[j] = make_float2(-INFINITY, 0.0f);
                av[j] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (sp < active) {
                    mlv[j] = __ldcg(ml + sp);
                    av[j] = __ldcg(wa + (int64_t)sp * nc);
                }
            }
            float mb = M;
#pragma unroll
            for (int j = 0; j < kMergeBatch; j++)
                if (mlv[j].y > 0.0f)
                    mb = fmaxf(mb, mlv[j].x);
            if (mb == -INFINITY)
                continue;
            const float c = expf(M - mb); /* M == -inf: 0 */
            L *= c;
            R = f4_scale(R, c);
#pragma unroll
            for (int j = 0; j < kMergeBatch; j++)
                if (mlv[j].y > 0.0f) {
                    const float w = expf(mlv[j].x - mb);
                    L += mlv[j].y * w;
                    R = f4_axpy(w, av[j], R);
                }
            M = mb;
        }
    }
    /* The parts of each output, in part order. */
    if (merger) {
        sm_pm[t] = M;
        sm_pl[t] = L;
        parts_sm.acc[t] = R;
    }
    __syncthreads();
    if (t < nq) {
        const int g = t / nc, ch = t % nc;
        float mx = -INFINITY;
        for (int q = 0; q < parts; q++)
            if (sm_pl[q * nq + t] > 0.0f)
                mx = fmaxf(mx, sm_pm[q * nq + t]);
        float total = 0.0f;
        float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
        if (mx != -INFINITY)
            for (int q = 0; q < parts; q++)
                if (sm_pl[q * nq + t] > 0.0f) {
                    const float e = expf(sm_pm[q * nq + t] - mx);
                    total += sm_pl[q * nq + t] * e;
                    r = f4_axpy(e, parts_sm.acc[q * nq + t], r);
                }
        out4[(int64_t)(h0 + g) * nc + ch] =
            total > 0.0f ? f4_div(r, total) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    pdl_mark(3);
}

/* Decode through a thread-block cluster (sm_90), grid (n_heads / G, C) in
 * clusters of (1, C): the C blocks of a column form one cluster. Block r
 * of the cluster takes the tiles r, r + C, r + 2 C, ... of the length (the
 * tiles dealt out in turn, so the blocks' loads differ by at most a tile;
 * a tile is kDecRows positions per warp, cluster_warps warps), its first
 * tile loaded before the wait: C tiles of positions are in registers when
 * q is ready.
 *
 * The merge: output slot o (head g, chunk ch: o = g nc + ch) belongs to
 * block o % C. After its own warp merge each block stores its (max, sum,
 * acc) of every slot straight into the owning block's shared memory, in
 * the row of its rank, once every block of the cluster has started (a
 * cluster barrier phase, arrived at on entry), by asynchronous remote
 * stores (st.async) that count their bytes on the owner's transaction
 * barrier; each block armed its own for exactly what it receives before
 * that phase, and waits on it alone: no cluster-wide barrier at the end (a
 * cluster barrier there cost ~0.8 us; with these stores the 2B-4T step
 * went 918 -> 905 us). A block leaves only once everything sent to it has
 * landed, so every store finds its target alive. Then the owner's thread
 * (j, s), s < C, takes block s's values of
 * slot j C + r from its own shared memory, and the C threads (consecutive
 * lanes of one warp) combine them with a butterfly over the lanes: the
 * result depends on the length and C only. No workspace, no counters, no
 * last block, no L2 round trip of the partial results. */
constexpr int kMaxCluster = 16;

/* Warps of a cluster decode block: 16 where a lane holds one float4 chunk
 * of a head (head_dim <= 128), so a block's 80 positions at the 2B-4T
 * shape's context 640 are one tile, scored by 16 warps at once instead of
 * two tiles one after the other on 8; then only that one tile is loaded
 * before the wait, which keeps a thread within the 128 registers that 512
 * threads an SM allow (two tiles in registers took 156). Two chunks a lane
 * keep 8 warps and one tile. */
template <int KC> __host__ __device__ constexpr int cluster_warps() { return KC == 1 ? 16 : 8; }

/* The kQkv kernel's dynamic shared memory: the codes row (k_padded bytes),
 * the column's raw q|k|v ((G + 2) hd floats), the block's weight tiles. */
__host__ __device__ __forceinline__ size_t qkv_raw_offset(const DecodeArgs &a)
{
    return (size_t)a.groups * kGemvGroup;
}
__host__ __device__ __forceinline__ size_t qkv_tiles_offset(const DecodeArgs &a)
{
    return qkv_raw_offset(a) + (size_t)a.col_tiles * kGemvTileRows * sizeof(float);
}
__host__ __device__ __forceinline__ size_t qkv_smem(const DecodeArgs &a)
{
    return qkv_tiles_offset(a) + (size_t)a.block_tiles * a.groups * kGemvBlockBytes;
}

/* Column tile j (of (G + 2) hd / 8: q of the column's G heads, then k,
 * then v of its kv head) as a tile of the fused q|k|v weights. */
__device__ __forceinline__ int64_t qkv_tile(const DecodeArgs &a, int h0, int kvh, int G, int j)
{
    const int ht = a.s.head_dim / kGemvTileRows; /* tiles per head */
    if (j < G * ht)
        return (int64_t)h0 * ht + j;
    if (j < (G + 1) * ht)
        return (int64_t)a.q_tiles + (int64_t)kvh * ht + (j - G * ht);
    return (int64_t)a.q_tiles + a.kv_tiles + (int64_t)kvh * ht + (j - (G + 1) * ht);
}

/* kQkv: the q|k|v product is computed here instead of by a GEMV before.
 * Before the PDL wait each block bulk-copies its share of the column's
 * weight tiles (block_tiles of 8 rows: the 2B-4T shape's 64 rows, 40 KB)
 * into shared memory and arms the codes row's multicast; after it the
 * cluster stages the codes row once (row_multicast), each warp multiplies
 * whole tiles (the GEMV's entry dot and epilogue with weight scale 1, so
 * the raw values are the GEMV's bit for bit), and every value goes to
 * every block's copy of the column's raw q|k|v by an asynchronous remote
 * store (st.async) that counts its bytes on that block's transaction
 * barrier, armed at the start for the whole column: a block goes on once
 * all of its column's values have landed, with no cluster-wide barrier
 * (one measured ~0.8 us here). The blocks of such a kernel start right
 * after the one-block norm kernel (the GPU is free), so the copies and the
 * cache rows are in flight early, where a cluster after the q|k|v GEMV's
 * grid starts only as it drains. */
template <int KC, int G, bool kQkv>
__global__ void __launch_bounds__(32 * cluster_warps<KC>(), 1)
    attn_decode_cluster_kernel(DecodeArgs a)
{
#if BN_HAS_CLUSTERS
    namespace cg = cooperative_groups;
    constexpr int W = cluster_warps<KC>();
    constexpr int kTile = W * kDecRows; /* positions of a block's tile */
    constexpr int kOut = G * 32 * KC; /* at most this many output slots (G nc) */
    static_assert(kOut + kMaxCluster <= 32 * W, "one merge pass: a thread per (slot, block)");
    __shared__ WarpParts<KC, G, W> parts_sm;
    /* What the cluster's blocks send this one: block s's (max, sum) of head
     * g at [s][g], its acc of this block's j-th slot at [s * per + j]. */
    __shared__ float in_m[kMaxCluster][G], in_l[kMaxCluster][G];
    __shared__ float4 in_acc[kOut + kMaxCluster];
    cg::cluster_group cluster = cg::this_cluster();
    const int C = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    DecodeBlock<KC, G, kQkv> b(a, blockIdx.x);
    extern __shared__ __align__(128) unsigned char qkv_sm[];
    /* The codes row, the weight tiles, the column's raw values from the
     * cluster's blocks. */
    __shared__ unsigned long long qkv_bars[3];
    int8_t *xs = reinterpret_cast<int8_t *>(qkv_sm);
    float *raw = reinterpret_cast<float *>(qkv_sm + qkv_raw_offset(a));
    unsigned char *wsm = qkv_sm + qkv_tiles_offset(a);
    const int j0 = rank * a.block_tiles;
    const int nt = kQkv ? min(a.block_tiles, a.col_tiles - j0) : 0;
    const unsigned tile_bytes = (unsigned)a.groups * kGemvBlockBytes;
    const unsigned row_bytes = (unsigned)qkv_raw_offset(a); /* the codes row */
    /* The blocks' partial results reach their owners by asynchronous remote
     * stores counted on this barrier, armed here for what this block will
     * receive: from each block its slots o = rank, rank + C, ... of the nq
     * (16 bytes each) and the (max, sum) of the G heads. */
    __shared__ unsigned long long parts_bar;
    if (threadIdx.x == 0) {
        const int nq = G * (a.s.head_dim / 4);
        const int mine = nq > rank ? (nq - 1 - rank) / C + 1 : 0;
        bulk_bar_init(&parts_bar);
        bar_expect(&parts_bar, (unsigned)(C * (mine * (int)sizeof(float4) +
                                               2 * G * (int)sizeof(float))));
    }
    /* Distributed shared memory may be written only once every block of
     * the cluster has started: each block says so here, and waits for the
     * others just before its first remote store (by then long since true,
     * so the wait costs nothing). With kQkv the codes row's multicast arms
     * and arrives (it waits at the row, the first remote writes). */
    if constexpr (kQkv) {
        if (threadIdx.x == 0) {
            /* The raw values arrive by asynchronous remote stores that count
             * their bytes on this barrier: armed now for the whole column. */
            bulk_bar_init(&qkv_bars[2]);
            bar_expect(&qkv_bars[2], (unsigned)(a.col_tiles * kGemvTileRows * sizeof(float)));
            bulk_bar_init(&qkv_bars[1]);
            if (nt > 0) {
                bar_expect(&qkv_bars[1], (unsigned)nt * tile_bytes);
                for (int j = 0; j < nt; j++)
                    bulk_issue(wsm + (size_t)j * tile_bytes,
                               a.w_qkv + qkv_tile(a, b.h0, b.kvh, G, j0 + j) * tile_bytes,
                               tile_bytes, &qkv_bars[1]);
            }
        }
        row_multicast_arm(&qkv_bars[0], row_bytes);
    } else {
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    }
    const int nc = b.nc, p = b.p, len = b.len;
    const int nq = G * nc, per = (nq + C - 1) / C; /* slots, and slots per block */
    const int step = C * kTile;
    const int first = rank * kTile;

    /* Rows before p only: p's own k and v come from the product. */
    float4 kA[kDecRows][KC], vA[kDecRows][KC];
    if (first < len)
        load_rows<KC>(kA, vA, a, first, p, b.head_off);
    b.load_rope(a);
    prefetch_next_layer(a, p, blockIdx.x + gridDim.x * rank, gridDim.x * C);
    pdl_trigger();
    pdl_wait();

    if constexpr (kQkv) {
        /* The scale and sum first: their L2 round trip overlaps the row's. */
        const float x_scale = __ldcg(a.act_scale);
        const int32_t x_sum = __ldcg(a.act_sum);
        row_multicast(xs, a.xq, row_bytes, &qkv_bars[0], C);
        pdl_mark(0); /* (kQkv's marks: the codes row, the product, raw published, stored) */
        if (nt > 0)
            bulk_wait(&qkv_bars[1]);
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        for (int j = warp; j < nt; j += W) {
            const uint4 *tw = reinterpret_cast<const uint4 *>(wsm + (size_t)j * tile_bytes);
            const int8_t *xl = xs + (lane / 8) * (kGemvGroup / 4);
            int acc4[4] = {0, 0, 0, 0};
            for (int g = 0; g < a.groups; g++)
                gemv_entry_dot4(tw[g * 32 + lane], xl + g * kGemvGroup, acc4);
            int acc = (acc4[0] + acc4[1]) + (acc4[2] + acc4[3]);
            acc += __shfl_xor_sync(kFull, acc, 8);
            acc += __shfl_xor_sync(kFull, acc, 16);
            /* Lanes r, r + 8, r + 16, r + 24 all hold row r's sum: each
             * sends it to a quarter of the blocks. The GEMV's epilogue with
             * weight scale 1 (x 1 is exact). */
            const float v = __fdiv_rn((float)(acc - x_sum), x_scale);
            const int idx = (j0 + j) * kGemvTileRows + lane % kGemvTileRows;
            for (int q = lane / kGemvTileRows; q < C; q += 32 / kGemvTileRows)
                st_async_to(raw + idx, v, &qkv_bars[2], (unsigned)q);
        }
        pdl_mark(1);
        bulk_wait(&qkv_bars[2]); /* every block's values of the column have landed */
        pdl_mark(2);
        b.src_q = raw;
        b.src_k = raw + G * a.s.head_dim;
        b.src_v = raw + (G + 1) * a.s.head_dim;
    }
    b.start(a);
    if constexpr (!kQkv)
        pdl_mark(0);
    for (int t0 = first; t0 < len; t0 += step) {
        if (t0 != first) /* the first tile was loaded before the wait */
            load_rows<KC>(kA, vA, a, t0, p, b.head_off);
        b.tile(a, kA, vA, t0, len);
    }

    /* The block's (max, sum, acc) per slot, sent to the slot's owner. */
    parts_sm.put(b);
    __syncthreads();
    if constexpr (!kQkv) /* (kQkv: waited at the codes row) */
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); /* every block has started */
    for (int o = threadIdx.x; o < nq; o += blockDim.x) {
        const int g = o / nc, ch = o % nc;
        float mx, total;
        const float4 r = parts_sm.merge(g * 32 * KC + ch, g, mx, total);
        st_async_to(&in_acc[rank * per + o / C], r, &parts_bar, (unsigned)(o % C));
        if (ch == 0)
            for (int q = 0; q < C; q++) {
                st_async_to(&in_m[0][0] + rank * G + g, mx, &parts_bar, (unsigned)q);
                st_async_to(&in_l[0][0] + rank * G + g, total, &parts_bar, (unsigned)q);
            }
    }
    if constexpr (!kQkv)
        pdl_mark(1);
    bulk_wait(&parts_bar); /* every block's values for this one have landed */
    if constexpr (!kQkv)
        pdl_mark(2);

    const int s = threadIdx.x % C, j = threadIdx.x / C, o = j * C + rank;
    const bool mine = o < nq;
    float ms = -INFINITY, ls = 0.0f;
    float4 rs = make_float4(0.f, 0.f, 0.f, 0.f);
    if (mine) {
        ms = in_m[s][o / nc];
        ls = in_l[s][o / nc];
        rs = in_acc[s * per + j];
    }
    /* Blocks that saw no position (sum 0) weigh 0. */
    float M = ls > 0.0f ? ms : -INFINITY;
    for (int x = 1; x < C; x <<= 1)
        M = fmaxf(M, __shfl_xor_sync(kFull, M, x));
    const float e = ls > 0.0f ? expf(ms - M) : 0.0f;
    float L = ls * e;
    float4 R = f4_scale(rs, e);
    for (int x = 1; x < C; x <<= 1) {
        L += __shfl_xor_sync(kFull, L, x);
        R.x += __shfl_xor_sync(kFull, R.x, x);
        R.y += __shfl_xor_sync(kFull, R.y, x);
        R.z += __shfl_xor_sync(kFull, R.z, x);
        R.w += __shfl_xor_sync(kFull, R.w, x);
    }
    if (mine && s == 0) {
        const int g = o / nc, ch = o % nc;
        reinterpret_cast<float4 *>(a.out)[(int64_t)(b.h0 + g) * nc + ch] =
            L > 0.0f ? f4_div(R, L) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    pdl_mark(3);
#else
    (void)a;
    __trap(); /* the launcher uses clusters only where this code was compiled */
#endif
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------ */

extern "C" int bn_cb_attn_decode_splits(int64_t capacity)
{
    /* One tile (kDecTile positions) per range at the full length, as many ranges
     * as that takes up to kMaxSplits; at shorter lengths the ranges keep at
     * least kMinRange positions and the rest stay empty. */
    const int64_t splits = (capacity + kMinRange - 1) / kMinRange;
    return (int)(splits < 1 ? 1 : splits > kMaxSplits ? kMaxSplits : splits);
}

extern "C" size_t bn_cb_attn_decode_workspace_bytes(const bn_cb_attn_shape *s, int splits)
{
    if (!s || splits < 1)
        return 0;
    return sizeof(float) * (size_t)s->n_heads * (size_t)splits * (2 + (size_t)s->head_dim);
}

/* The decode kernels of a shape. G query heads of a kv head per block (each
 * cache row read once for them). The ticket kernel: 4 where the group
 * allows (2 with head_dim > 128, for the registers), else 2, else 1. The
 * cluster kernel: 2 where the group is even, else 1; measured on the 2B-4T
 * shape (H200, 20 query / 5 kv heads), 2 heads a block in clusters of 8 (80
 * blocks of 80 positions at context 640) made the decode step 1005-1015 us
 * against 1034-1049 us with 4 in clusters of 16 (80 blocks of 40
 * positions), alternated in one run; 1 head a block was no better than 2. */
struct DecodeKernels {
    void (*ticket)(DecodeArgs);
    void (*cluster)(DecodeArgs);
    void (*cluster_qkv)(DecodeArgs); /* with the q|k|v product inside */
    int g_ticket, g_cluster;
    int cluster_threads; /* a block of the cluster kernels */

    int g(bool clustered) const { return clustered ? g_cluster : g_ticket; }
};

static DecodeKernels decode_kernels(const bn_cb_attn_shape *s)
{
    const int group = s->n_heads / s->n_kv_heads;
    const bool wide = s->head_dim > 32 * 4;
    const int gc = group % 2 == 0 ? 2 : 1;
    DecodeKernels k;
    k.g_cluster = gc;
    k.cluster_threads = 32 * (wide ? cluster_warps<2>() : cluster_warps<1>());
    if (!wide) {
        k.cluster = gc == 2 ? attn_decode_cluster_kernel<1, 2, false>
                            : attn_decode_cluster_kernel<1, 1, false>;
        k.cluster_qkv = gc == 2 ? attn_decode_cluster_kernel<1, 2, true>
                                : attn_decode_cluster_kernel<1, 1, true>;
        k.g_ticket = group % 4 == 0 ? 4 : gc;
        k.ticket = k.g_ticket == 4   ? attn_decode_kernel<1, 4>
                   : k.g_ticket == 2 ? attn_decode_kernel<1, 2>
                                     : attn_decode_kernel<1, 1>;
    } else {
        k.cluster = gc == 2 ? attn_decode_cluster_kernel<2, 2, false>
                            : attn_decode_cluster_kernel<2, 1, false>;
        k.cluster_qkv = gc == 2 ? attn_decode_cluster_kernel<2, 2, true>
                                : attn_decode_cluster_kernel<2, 1, true>;
        k.g_ticket = gc;
        k.ticket = gc == 2 ? attn_decode_kernel<2, 2> : attn_decode_kernel<2, 1>;
    }
    return k;
}

static bool decode_cluster_size_ok(int c)
{
    return c == 2 || c == 4 || c == 8 || c == kMaxCluster;
}

/* Whether `cols` clusters of c blocks of the decode kernel (with smem bytes
 * of dynamic shared memory) can be resident at once: cudaSuccess, else
 * cudaErrorNotSupported or the query's error (cleared). */
static cudaError_t clusters_resident(void (*kernel)(DecodeArgs), int threads, int cols, int c,
                                     size_t smem)
{
    int n = 0;
    const cudaError_t rc = resident_clusters(kernel, dim3((unsigned)cols, (unsigned)c),
                                             dim3((unsigned)threads), smem,
                                             dim3(1, (unsigned)c, 1), &n);
    if (rc != cudaSuccess)
        return rc;
    return n >= cols ? cudaSuccess : cudaErrorNotSupported;
}

extern "C" int bn_cb_attn_decode_cluster(const bn_cb_attn_shape *s, int cap)
{
    if (!attn_shape_ok(s))
        return 0;
    const DecodeKernels k = decode_kernels(s);
    if (!clusters_usable(k.cluster) ||
        cudaFuncSetAttribute(k.cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
            cudaSuccess) {
        (void)cudaGetLastError(); /* a failed query is nobody's launch error */
        return 0;
    }
    /* The largest size up to the cap of which every column's cluster can be
     * resident at once. */
    const int cols = s->n_heads / k.g(true);
    int largest = kMaxCluster;
    while (cap > 0 && largest > cap)
        largest /= 2;
    for (int c = largest; c >= 2; c /= 2)
        if (clusters_resident(k.cluster, k.cluster_threads, cols, c, 0) == cudaSuccess)
            return c;
    return 0;
}

/* The kQkv kernel's share of a column's tiles per block and its shared
 * memory, for cluster size C and rows of k weights; false where the shape
 * does not allow the product inside (head_dim % 8, the dynamic shared
 * memory). */
static bool qkv_plan(const bn_cb_attn_shape *s, int g, int C, int64_t k, DecodeArgs *d)
{
    if (s->head_dim % kGemvTileRows != 0 || k <= 0 || C < 2)
        return false;
    d->groups = (int)((k + kGemvGroup - 1) / kGemvGroup);
    d->q_tiles = s->n_heads * s->head_dim / kGemvTileRows;
    d->kv_tiles = s->n_kv_heads * s->head_dim / kGemvTileRows;
    d->col_tiles = (g + 2) * s->head_dim / kGemvTileRows;
    d->block_tiles = (d->col_tiles + C - 1) / C;
    return qkv_smem(*d) <= 160 * 1024;
}

extern "C" cudaError_t bn_cb_attn_decode_qkv_prepare(const bn_cb_attn_shape *s, int cluster,
                                                     int64_t k)
{
    if (!attn_shape_ok(s) || !decode_cluster_size_ok(cluster))
        return cudaErrorInvalidValue;
    const DecodeKernels kd = decode_kernels(s);
    DecodeArgs d;
    memset(&d, 0, sizeof d);
    d.s = *s;
    if (!qkv_plan(s, kd.g_cluster, cluster, k, &d))
        return cudaErrorNotSupported;
    const size_t smem = qkv_smem(d);
    cudaError_t rc = allow_dynamic_smem(kd.cluster_qkv, smem);
    if (rc == cudaSuccess && cluster > 8)
        rc = cudaFuncSetAttribute(kd.cluster_qkv,
                                  cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return rc;
    }
    /* Every column's cluster resident at once, as the kernel without. */
    return clusters_resident(kd.cluster_qkv, kd.cluster_threads, s->n_heads / kd.g_cluster,
                             cluster, smem);
}

extern "C" cudaError_t bn_cb_attn_decode(const bn_cb_attn_shape *s,
                                         const bn_cb_attn_decode_args *a, int pdl,
                                         cudaStream_t stream)
{
    const bool inside = a && a->w_qkv;
    if (inside && (a->cluster == 0 || !a->xq || !a->act_scale || !a->act_sum || a->w_k <= 0 ||
                   ((uintptr_t)a->w_qkv & 15) != 0 || ((uintptr_t)a->xq & 15) != 0))
        return cudaErrorInvalidValue;
    if (!attn_shape_ok(s) || !a || (!inside && !a->qkv) || !a->pos || !a->k_cache || !a->v_cache ||
        !a->out || a->rope_dim < 0 || a->rope_dim % 2 != 0 || a->rope_dim > s->head_dim ||
        (a->rope_dim > 0 && !a->rope) || ((uintptr_t)a->qkv & 15) != 0 ||
        ((uintptr_t)a->k_cache & 15) != 0 || ((uintptr_t)a->v_cache & 15) != 0 ||
        (a->cluster != 0 && !decode_cluster_size_ok(a->cluster)))
        return cudaErrorInvalidValue;
    /* The ticket's merge needs the workspace and counters. */
    if (a->cluster == 0 && (!a->workspace || !a->counters || a->splits < 1 ||
                            a->splits > kMaxSplits || ((uintptr_t)a->workspace & 15) != 0))
        return cudaErrorInvalidValue;
    DecodeArgs d;
    memset(&d, 0, sizeof d);
    d.s = *s;
    d.qkv = inside ? nullptr : a->qkv;
    d.sq = a->scale_q;
    d.sk = a->scale_k;
    d.sv = a->scale_v;
    d.rope = reinterpret_cast<const float2 *>(a->rope);
    d.half = a->rope_dim / 2;
    d.rope_vec = d.half > 0 && d.half % 4 == 0 && ((uintptr_t)a->rope & 15) == 0;
    d.pos = a->pos;
    d.kc = a->k_cache;
    d.vc = a->v_cache;
    d.splits = a->cluster != 0 ? a->cluster : a->splits;
    d.scale = (float)(1.0 / sqrt((double)s->head_dim));
    /* Accumulators first: every slot's float4 row stays 16-byte aligned
     * (and the (max, sum) pairs 8-byte aligned). */
    d.ws_acc = a->cluster != 0 ? nullptr : a->workspace;
    d.ws_ml = a->cluster != 0 ? nullptr
                              : a->workspace + (size_t)s->n_heads * (size_t)a->splits *
                                                   (size_t)s->head_dim;
    d.counters = a->cluster != 0 ? nullptr : a->counters;
    d.out = a->out;
    d.pf_k = a->next_k_cache && a->next_v_cache ? a->next_k_cache : nullptr;
    d.pf_v = d.pf_k ? a->next_v_cache : nullptr;
    const DecodeKernels k = decode_kernels(s);
    const int g = k.g(a->cluster != 0);
    d.subgroups = s->n_heads / s->n_kv_heads / g;
    const dim3 grid((unsigned)(s->n_heads / g), (unsigned)d.splits);
    const dim3 block(a->cluster != 0 ? k.cluster_threads : 32 * kDecWarps);
    if (inside) {
        if (!qkv_plan(s, g, a->cluster, a->w_k, &d))
            return cudaErrorInvalidValue;
        d.w_qkv = a->w_qkv;
        d.xq = a->xq;
        d.act_scale = a->act_scale;
        d.act_sum = a->act_sum;
        return pdl_launch_clustered(k.cluster_qkv, grid, block, qkv_smem(d),
                                    dim3(1, (unsigned)a->cluster, 1), stream, pdl, d);
    }
    if (a->cluster != 0)
        return pdl_launch_clustered(k.cluster, grid, block, 0, dim3(1, (unsigned)a->cluster, 1),
                                    stream, pdl, d);
    return pdl_launch(k.ticket, grid, block, 0, stream, pdl, d);
}

extern "C" int bn_cb_attn_decode_pdl_compiled(void)
{
    return pdl_compiled(attn_decode_kernel<1, 4>);
}

#ifdef BN_DECODE_TRACE
BN_TRACE_ATTACH(bn_cb_attn_trace_attach)
#endif
