/*
 * decode_persistent.cu - the decode step's layers as one persistent kernel
 * (decode_persistent.h). One block an SM runs every stage of every layer;
 * the stages meet at a grid-wide barrier (a counter in global memory)
 * instead of at kernel boundaries. A layer is five stages:
 *
 *   A  q|k|v   xq = q(attn_norm(x)); qkv = Wqkv xq (raw, weight scale 1)
 *   B  attention over the fp32 cache: the ticket kernel's ranges
 *      (attn_ticket_range: scales, RoPE, the token's k and v stored),
 *      merged by the last range of each column; att
 *   C  Wo      xq = q(attn_sub_norm(att)); x += Wo xq
 *   D  gate|up xq = q(ffn_norm(x)); h = relu(gate)^2 * up (pairs of tiles)
 *   E  down    xq = q(ffn_sub_norm(h)); x += Wdown xq (the last layer: out)
 *
 * Each product stage's block computes the norm and int8 codes of the whole
 * input row itself (every block the same integers: norm_code.cuh's exact
 * rule), so no stage waits for a separate norm. Before waiting at the
 * barrier, each warp loads its first weight entries into registers:
 * weights never change, so their loads overlap the wait.
 *
 * Every value a stage reads that another block wrote in this launch is
 * read through L2 (__ldcg); the barrier's release and acquire order the
 * writes before the reads. The results are those of the kernel chain
 * (the same products, epilogues and attention code): the integer sums are
 * exact, and only the double sum of squares of a norm is added in another
 * order.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn_decode_block.cuh"
#include "decode_persistent.h"
#include "norm_code.cuh"
#include "smem_opt_in.cuh"
#include "w2a8_gemv.cuh"

namespace
{

constexpr int kWarps = kDecWarps;
constexpr int kThreads = 32 * kWarps;
/* The attention stage runs on the first kDecThreads threads (the ticket
 * attention's block: all of them), which meet at named barrier 1. */
constexpr int kAttnBarrier = 1;
constexpr int kMaxK = 8192;   /* widest input row a block stages            */
constexpr int kMaxItems = 64; /* (tile, split) items of a block's share     */
constexpr int kPre = 8;       /* weight entries a warp loads before waiting */
constexpr int kEntryWords = kGemvBlockBytes / 16;

struct Smem {
    float vec[kMaxK], nw[kMaxK]; /* the input row and its norm's weights */
    __align__(16) int8_t codes[kMaxK];
    int partial[kMaxItems][kGemvTileRows];
    double red_d[64];
    float red_f[32];
    int red_i[32];
};

/* ---- the grid-wide barrier ------------------------------------------------------- */

/* The block's outputs of the stage are written: every thread's writes are
 * ordered before thread 0's release of its arrival. */
__device__ __forceinline__ void arrive(unsigned *bar)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
    }
}

/* Waits until every block has arrived `n` times (the acquire orders the
 * block's later reads after every arrival's release). */
__device__ __forceinline__ void wait_arrivals(unsigned *bar, int n)
{
    if (threadIdx.x == 0) {
        const unsigned target = (unsigned)n * gridDim.x;
        unsigned seen;
        do
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
        while (seen < target);
    }
    __syncthreads();
}

/* The same for the attention's threads alone. */
__device__ __forceinline__ void attn_sync()
{
    asm volatile("bar.sync %0, %1;" ::"n"(kAttnBarrier), "n"(kDecThreads) : "memory");
}

__device__ __forceinline__ void wait_arrivals_attn(unsigned *bar, int n)
{
    if (threadIdx.x == 0) {
        const unsigned target = (unsigned)n * gridDim.x;
        unsigned seen;
        do
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
        while (seen < target);
    }
    attn_sync();
}

__device__ __forceinline__ unsigned long long now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* ---- the norm and codes of a stage's input row ------------------------------------- */

/* A stage's norm weights into sm.nw (they never change: copied while the
 * block waits at the barrier, landing with stage_row's wait). */
__device__ __forceinline__ void stage_norm_weights(const float *nw, int k, Smem &sm)
{
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm.nw);
    for (int i = (int)threadIdx.x; i < k; i += kThreads)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(base + 4u * (uint32_t)i),
                     "l"(nw + i)
                     : "memory");
}

/* The stage's input row (k floats, k % 4 == 0, written in this launch) into
 * sm.vec through L2, every copy in flight at once; then every copy of the
 * thread landed (the norm weights' too) and, after the barrier, the
 * block's. */
__device__ __forceinline__ void stage_row(const float *src, int k, Smem &sm)
{
    gemv_stage_row(sm.vec, src, k / 4, (int)threadIdx.x, kThreads);
    __syncthreads();
}

/* The codes of rmsnorm(sm.vec) (k values, weights sm.nw) into sm.codes,
 * zero from k to kp; *scale and *sum as the norm kernels store them (the
 * row kernel's expressions, norm_quantize.cu). Every thread leaves with
 * them; the codes are published by the closing barrier. */
__device__ void norm_codes(int k, int kp, float eps, Smem &sm, float *scale, int *sum)
{
    const int tid = (int)threadIdx.x;
    double ss = 0.0, umax = 0.0;
    for (int i = tid; i < k; i += kThreads) {
        const float v = sm.vec[i];
        ss = __fma_rn((double)v, (double)v, ss);
        umax = fmax(umax, fabs(__dmul_rn((double)sm.nw[i], (double)v)));
    }
    block_sum_max(ss, umax, sm.red_d);
    const float inv = inv_rms(ss, k, eps);
    const bool usable = umax > 0.0 && isfinite(umax);
    const ExactCoder coder(umax);
    float amax = 0.0f;
    int total = 0;
    for (int i = tid; i < k; i += kThreads) {
        const float v = sm.vec[i], w = sm.nw[i];
        amax = fmaxf(amax, fabsf(__fmul_rn(w, __fmul_rn(v, inv))));
        const int c = usable ? coder.code(w, v) : 0;
        sm.codes[i] = (int8_t)c;
        total += c;
    }
    block_max_sum(amax, total, sm.red_f, sm.red_i);
    float s;
    if (amax >= kQuantEps && usable) {
        s = __fdiv_rn(127.0f, amax);
    } else { /* tiny or non-finite rows: the plain rule */
        s = __fdiv_rn(127.0f, amax >= kQuantEps ? amax : kQuantEps);
        total = 0;
        for (int i = tid; i < k; i += kThreads) {
            const int c = plain_code(sm.nw[i], sm.vec[i], inv, s);
            sm.codes[i] = (int8_t)c;
            total += c;
        }
        float unused = 0.0f;
        block_max_sum(unused, total, sm.red_f, sm.red_i);
    }
    for (int i = k + tid; i < kp; i += kThreads)
        sm.codes[i] = 0;
    __syncthreads();
    *scale = s;
    *sum = total;
}

/* ---- a product stage: the block's share of the tiles ---------------------------------
 *
 * The block takes units [u0, u0 + n) of the stage's U units, U split evenly
 * over the grid: a unit is a tile of 8 rows, or (pair) a gate tile and the
 * up tile of the same rows. Its n_t tiles are cut into `split` ranges of
 * chunk-groups each, so that its warps have n_t split >= kWarps items where
 * it can; warp w takes items w, w + kWarps, ... */
struct Share {
    int u0, n_u, n_t, split, items, tiles, groups;
    bool pair;

    __device__ Share(int64_t tiles_, int64_t groups_, bool pair_)
    {
        tiles = (int)tiles_;
        groups = (int)groups_;
        pair = pair_;
        const int U = pair ? tiles / 2 : tiles, B = (int)gridDim.x, b = (int)blockIdx.x;
        u0 = (int)((int64_t)b * U / B);
        n_u = (int)((int64_t)(b + 1) * U / B) - u0;
        n_t = pair ? 2 * n_u : n_u;
        split = n_t > 0 && n_t < kWarps ? kWarps / n_t : 1;
        split = split < groups ? split : groups;
        items = n_t * split;
    }

    /* Tile i of the block's n_t: units' tiles, then (pair) their up tiles. */
    __device__ int tile(int i) const
    {
        return !pair || i < n_u ? u0 + i : tiles / 2 + u0 + (i - n_u);
    }
};

/* The block's share of a stage's weights into L2 (thread 0, one bulk
 * prefetch per contiguous run of tiles), ahead of the stage. */
__device__ __forceinline__ void prefetch_share(const void *w, const Share &s)
{
    if (threadIdx.x != 0 || s.n_u == 0)
        return;
    const unsigned tile_bytes = (unsigned)s.groups * kGemvBlockBytes;
    const char *base = static_cast<const char *>(w);
    const int runs = s.pair ? 2 : 1;
    for (int r = 0; r < runs; r++) {
        const char *p = base + (size_t)(s.u0 + r * (s.tiles / 2)) * tile_bytes;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p),
                     "r"((unsigned)s.n_u * tile_bytes)
                     : "memory");
    }
}

/* Item `it`'s entries: tile, this lane's first entry, its split. */
__device__ __forceinline__ const uint4 *item_entries(const uint4 *w, const Share &s, int it)
{
    const int lane = threadIdx.x & 31;
    return w + (int64_t)s.tile(it / s.split) * s.groups * kEntryWords + lane;
}

/* The first kPre entries of item it (its chunk-groups sp, sp + split, ...). */
__device__ __forceinline__ void load_first(uint4 (&v)[kPre], const uint4 *w, const Share &s, int it)
{
    const bool live = it < s.items;
    const uint4 *e = live ? item_entries(w, s, it) : w;
    const int sp = live ? it % s.split : 0;
#pragma unroll
    for (int u = 0; u < kPre; u++) {
        const int g = sp + u * s.split;
        v[u] = live && g < s.groups ? gemv_load_stream(e + (int64_t)g * kEntryWords)
                                    : make_uint4(0, 0, 0, 0);
    }
}

/* The warp's int32 sum of item it: the first entries (loaded), then the
 * rest four in flight at a time. xs: the codes row in shared memory. */
__device__ __forceinline__ int item_sum(const uint4 (&v)[kPre], const uint4 *w, const Share &s,
                                        int it, const int8_t *xs)
{
    const int lane = threadIdx.x & 31;
    const uint4 *e = item_entries(w, s, it);
    const int sp = it % s.split, S = s.split;
    const int8_t *xq = xs + (lane >> 3) * 64;
    int acc = 0;
#pragma unroll
    for (int u = 0; u < kPre; u++) {
        const int g = sp + u * S;
        if (g < s.groups)
            acc = gemv_entry_dot(v[u], xq + g * kGemvGroup, acc);
    }
    int g = sp + kPre * S;
    for (; g + 3 * S < s.groups; g += 4 * S) {
        uint4 r[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            r[u] = gemv_load_stream(e + (int64_t)(g + u * S) * kEntryWords);
#pragma unroll
        for (int u = 0; u < 4; u++)
            acc = gemv_entry_dot(r[u], xq + (g + u * S) * kGemvGroup, acc);
    }
    for (; g < s.groups; g += S)
        acc = gemv_entry_dot(gemv_load_stream(e + (int64_t)g * kEntryWords), xq + g * kGemvGroup,
                             acc);
    return acc;
}

/* Every item of the block's share into sm.partial[item][row] (the lanes
 * of a row summed), published. first: the warp's first item's entries. */
__device__ void share_sums(const uint4 (&first)[kPre], const uint4 *w, const Share &s, Smem &sm)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int it = warp; it < s.items; it += kWarps) {
        int acc;
        if (it == warp) {
            acc = item_sum(first, w, s, it, sm.codes);
        } else {
            uint4 v[kPre];
            load_first(v, w, s, it);
            acc = item_sum(v, w, s, it, sm.codes);
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 8);
        acc += __shfl_xor_sync(0xffffffffu, acc, 16);
        if (lane < kGemvTileRows)
            sm.partial[it][lane] = acc;
    }
    __syncthreads();
}

/* Row r of the block's tile i: the sum over its splits. */
__device__ __forceinline__ int tile_row_sum(const Share &s, const Smem &sm, int i, int r)
{
    int total = 0;
    for (int sp = 0; sp < s.split; sp++)
        total += sm.partial[i * s.split + sp][r];
    return total;
}

/* The CPU epilogue, bn_w2a8_epilogue's operations (w2a8_gemv.cu). */
__device__ __forceinline__ float epilogue(int32_t acc, float act_scale, float w_scale)
{
    return __fmul_rn(__fdiv_rn((float)acc, act_scale), w_scale);
}

/* y[row] (or, add, y[row] += ) the product's value of every row of the
 * block's tiles (n rows in all). */
__device__ void store_rows(const Share &s, const Smem &sm, int64_t n, float x_scale, int x_sum,
                           float w_scale, float *y, bool add)
{
    const int t = (int)threadIdx.x;
    if (t >= s.n_t * kGemvTileRows)
        return;
    const int i = t / kGemvTileRows, r = t % kGemvTileRows;
    const int64_t row = (int64_t)s.tile(i) * kGemvTileRows + r;
    if (row >= n)
        return;
    const float v = epilogue(tile_row_sum(s, sm, i, r) - x_sum, x_scale, w_scale);
    y[row] = add ? __fadd_rn(__ldcg(y + row), v) : v;
}

/* h[row] = relu(gate sg)^2 (up su) of the block's pairs (the pair GEMV's
 * expressions, w2a8_gemv.cu). */
__device__ void store_pairs(const Share &s, const Smem &sm, int64_t ffn, float x_scale, int x_sum,
                            float sg, float su, float *h)
{
    const int t = (int)threadIdx.x;
    if (t >= s.n_u * kGemvTileRows)
        return;
    const int i = t / kGemvTileRows, r = t % kGemvTileRows;
    const int64_t row = (int64_t)(s.u0 + i) * kGemvTileRows + r;
    if (row >= ffn)
        return;
    const float gate = __fmul_rn(epilogue(tile_row_sum(s, sm, i, r) - x_sum, x_scale, 1.0f), sg);
    const float up =
        __fmul_rn(epilogue(tile_row_sum(s, sm, i + s.n_u, r) - x_sum, x_scale, 1.0f), su);
    const float rg = gate > 0.0f ? gate : 0.0f;
    h[row] = __fmul_rn(__fmul_rn(rg, rg), up);
}

/* ---- the kernel ------------------------------------------------------------------- */

struct Args {
    bn_cb_persist_args p;
    DecodeArgs attn; /* the layer-independent part; kc, vc, pf_*, scales per layer */
    int cols;        /* attention columns: n_heads / G */
};

template <int G> __global__ void __launch_bounds__(kThreads, 1) decode_layers_kernel(Args a)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &sm = *reinterpret_cast<Smem *>(smem_raw);
    __shared__ TicketShared<1, G> tsm;
    const bn_cb_persist_args &p = a.p;
    const int q_dim = p.attn.n_heads * p.attn.head_dim;
    const int64_t kv_dim = (int64_t)p.attn.n_kv_heads * p.attn.head_dim;
    const int64_t qkv_n = q_dim + 2 * kv_dim;
    const int64_t layer_cache = p.attn.capacity * kv_dim;
    const bool tracer = p.trace && blockIdx.x == 0 && threadIdx.x == 0;
    const Share s_qkv(p.tiles[0], p.groups[0], false), s_o(p.tiles[1], p.groups[1], false);
    const Share s_gu(p.tiles[2], p.groups[2], true), s_down(p.tiles[3], p.groups[3], false);
    const int warp = threadIdx.x >> 5;
    uint4 first[kPre];
    float x_scale;
    int x_sum;

    /* A product stage's start: its first weight entries into registers and
     * its norm's weights copying (neither depends on the stages before),
     * then the wait for the stage before (wait: false for layer 0's first,
     * whose input the launch's predecessor wrote), its input row and its
     * codes. */
    auto begin_product = [&](const uint4 *w, const Share &s, const float *nw, const float *src,
                             int k, int which, int stage, bool wait) {
        load_first(first, w, s, warp);
        stage_norm_weights(nw, k, sm);
        if (wait)
            wait_arrivals(p.barrier, stage);
        if (tracer)
            p.trace[stage] = now_ns();
        stage_row(src, k, sm);
        norm_codes(k, (int)p.groups[which] * kGemvGroup, p.eps, sm, &x_scale, &x_sum);
    };

    for (int l = 0; l < p.n_layer; l++) {
        const bn_cb_persist_layer L = p.layers[l];
        const float *norms = p.norms + (int64_t)l * p.layer_norms;
        const int stage0 = l * BN_CB_PERSIST_STAGES;
        const bool last = l + 1 == p.n_layer;

        /* A: q|k|v. Layer 0's x is the embedding, written before the launch.
         * The layer's other weights (and the next layer's q|k|v) start
         * streaming into L2 now: the products read them from there. */
        const uint4 *w = static_cast<const uint4 *>(L.w_qkv);
        begin_product(w, s_qkv, norms + p.norm_off[0], p.x, p.dim, 0, stage0, l > 0);
        prefetch_share(L.w_o, s_o);
        prefetch_share(L.w_gu, s_gu);
        prefetch_share(L.w_down, s_down);
        if (!last)
            prefetch_share(p.layers[l + 1].w_qkv, s_qkv);
        share_sums(first, w, s_qkv, sm);
        store_rows(s_qkv, sm, qkv_n, x_scale, x_sum, 1.0f, p.qkv, false);
        arrive(p.barrier);

        /* B: attention, the ticket kernel's ranges dealt out over the grid. */
        DecodeArgs d = a.attn;
        d.sq = L.scale_q;
        d.sk = L.scale_k;
        d.sv = L.scale_v;
        d.kc = p.k_cache + l * layer_cache;
        d.vc = p.v_cache + l * layer_cache;
        d.pf_k = !last ? d.kc + layer_cache : nullptr;
        d.pf_v = !last ? d.vc + layer_cache : nullptr;
        const int units = a.cols * d.splits;
        if (threadIdx.x < kDecThreads) {
            bool waited = false;
            auto wait_once = [&] {
                if (!waited) {
                    wait_arrivals_attn(p.barrier, stage0 + 1);
                    if (tracer)
                        p.trace[stage0 + 1] = now_ns();
                }
                waited = true;
            };
            for (int u = blockIdx.x; u < units; u += gridDim.x) {
                attn_ticket_range<1, G>(d, u % a.cols, u / a.cols, u, units, tsm, wait_once,
                                        attn_sync);
                attn_sync(); /* tsm is the next range's */
            }
            wait_once();
        }
        arrive(p.barrier);

        /* C: Wo, added to the residual stream. */
        w = static_cast<const uint4 *>(L.w_o);
        begin_product(w, s_o, norms + p.norm_off[1], p.att, q_dim, 1, stage0 + 2, true);
        share_sums(first, w, s_o, sm);
        store_rows(s_o, sm, p.dim, x_scale, x_sum, L.scale_o, p.x, true);
        arrive(p.barrier);

        /* D: gate|up in pairs: h = relu(gate)^2 * up. */
        w = static_cast<const uint4 *>(L.w_gu);
        begin_product(w, s_gu, norms + p.norm_off[2], p.x, p.dim, 2, stage0 + 3, true);
        share_sums(first, w, s_gu, sm);
        store_pairs(s_gu, sm, p.ffn, x_scale, x_sum, L.scale_gate, L.scale_up, p.h);
        arrive(p.barrier);

        /* E: down: into the residual stream, or (the last layer) into out,
         * which the output norm adds. */
        w = static_cast<const uint4 *>(L.w_down);
        begin_product(w, s_down, norms + p.norm_off[3], p.h, p.ffn, 3, stage0 + 4, true);
        share_sums(first, w, s_down, sm);
        store_rows(s_down, sm, p.dim, x_scale, x_sum, L.scale_down, last ? p.out : p.x, !last);
        if (!last)
            arrive(p.barrier);
    }
    if (p.trace) { /* the end: when the last block is done */
        __syncthreads();
        if (threadIdx.x == 0)
            atomicMax(p.trace + BN_CB_PERSIST_STAGES * p.n_layer, now_ns());
    }
}

/* The query heads a block of the ticket attention takes (its choice,
 * attn_decode.cu's decode_kernels, for head_dim <= 128). */
int heads_per_column(const bn_cb_attn_shape &s)
{
    const int group = s.n_heads / s.n_kv_heads;
    return group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
}

typedef void (*layers_kernel)(Args);

layers_kernel kernel_for(int g)
{
    return g == 4   ? decode_layers_kernel<4>
           : g == 2 ? decode_layers_kernel<2>
                    : decode_layers_kernel<1>;
}

/* Items of the largest share of a stage over `blocks` blocks. */
int64_t most_items(int64_t tiles, bool pair, int blocks)
{
    const int64_t units = pair ? tiles / 2 : tiles;
    const int64_t n_t = (units + blocks - 1) / blocks * (pair ? 2 : 1);
    return n_t >= kWarps ? n_t : kWarps;
}

} // namespace

extern "C" int bn_cb_decode_persistent_blocks(const bn_cb_persist_args *a, int sm_count)
{
    if (!a || sm_count <= 0 || a->n_layer <= 0 || !attn_shape_ok(&a->attn) ||
        a->attn.head_dim > 32 * 4 || a->rope_dim < 0 || a->rope_dim % 2 != 0 ||
        a->rope_dim > a->attn.head_dim || a->splits < 1 || a->splits > kMaxSplits)
        return 0;
    const int64_t q_dim = (int64_t)a->attn.n_heads * a->attn.head_dim;
    const int64_t widths[4] = {a->dim, q_dim, a->dim, a->ffn};
    for (int i = 0; i < 4; i++)
        if (widths[i] <= 0 || widths[i] % 4 != 0 || a->groups[i] * kGemvGroup > kMaxK ||
            a->groups[i] * kGemvGroup < widths[i] || a->tiles[i] <= 0 ||
            most_items(a->tiles[i], i == 2, sm_count) > kMaxItems)
            return 0;
    if (a->tiles[2] % 2 != 0 || a->tiles[2] / 2 * kGemvTileRows < a->ffn)
        return 0;
    int device = 0, coop = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device) != cudaSuccess ||
        !coop) {
        (void)cudaGetLastError();
        return 0;
    }
    const layers_kernel k = kernel_for(heads_per_column(a->attn));
    if (allow_dynamic_smem(k, sizeof(Smem)) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, sizeof(Smem)) !=
            cudaSuccess ||
        per_sm < 1) {
        (void)cudaGetLastError();
        return 0;
    }
    return sm_count;
}

extern "C" cudaError_t bn_cb_decode_persistent(const bn_cb_persist_args *a, int blocks,
                                               cudaStream_t stream)
{
    if (!a || blocks <= 0 || !a->layers || !a->norms || !a->pos || !a->k_cache || !a->v_cache ||
        !a->workspace || !a->counters || !a->x || !a->qkv || !a->att || !a->h || !a->out ||
        !a->barrier || (a->rope_dim > 0 && !a->rope))
        return cudaErrorInvalidValue;
    /* The rows a stage copies whole (16-byte copies). */
    const float *rows[3] = {a->x, a->att, a->h};
    for (int i = 0; i < 3; i++)
        if (((uintptr_t)rows[i] & 15) != 0)
            return cudaErrorInvalidValue;
    Args k;
    k.p = *a;
    const int g = heads_per_column(a->attn);
    k.cols = a->attn.n_heads / g;
    DecodeArgs &d = k.attn;
    memset(&d, 0, sizeof d);
    d.s = a->attn;
    d.qkv = a->qkv;
    d.rope = reinterpret_cast<const float2 *>(a->rope);
    d.half = a->rope_dim / 2;
    d.rope_vec = d.half > 0 && d.half % 4 == 0 && ((uintptr_t)a->rope & 15) == 0;
    d.pos = a->pos;
    d.splits = a->splits;
    d.subgroups = a->attn.n_heads / a->attn.n_kv_heads / g;
    d.scale = (float)(1.0 / sqrt((double)a->attn.head_dim));
    d.ws_acc = a->workspace;
    d.ws_ml = a->workspace + (size_t)a->attn.n_heads * (size_t)a->splits * (size_t)a->attn.head_dim;
    d.counters = a->counters;
    d.out = a->att;
    const layers_kernel kernel = kernel_for(g);
    cudaError_t rc = allow_dynamic_smem(kernel, sizeof(Smem));
    if (rc == cudaSuccess)
        rc = cudaMemsetAsync(a->barrier, 0, sizeof(unsigned), stream);
    if (rc != cudaSuccess)
        return rc;
    /* Cooperative: every block resident at once, which the barrier needs. */
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)blocks);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = sizeof(Smem);
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, k);
}
