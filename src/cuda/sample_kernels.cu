/*
 * sample_kernels.cu - greedy and top-k / top-p sampling on the GPU
 * (semantics: sample_cuda.h).
 *
 * Every token becomes one 64-bit key whose unsigned order is the CPU
 * sampler's order of preference:
 *
 *     key = ordered(logit) << 32 | (0xffffffff - id)
 *
 * ordered() maps a float to a uint32 with the same order (NaN is first
 * turned into -inf and -0 into +0, which the CPU compares as equal), and
 * the low half makes a lower id win a tie. Keys are unique, so "the best
 * k" has exactly one answer, and key 0 (below every real key) pads.
 *
 * Greedy is a max over keys: one pass of blocks, each writing its best
 * key, and one block reducing those.
 *
 * Top-k (k <= 64) is one launch. Over the vocabulary, each block takes a
 * slice into shared memory and keeps its 64 best keys with a bitonic
 * top-k: every 64-key run is sorted descending, then pairs of runs A, B
 * are folded into max(A[j], B[63 - j]) - a bitonic sequence holding the
 * 64 best of both - and re-sorted with a bitonic merge, until one run is
 * left; the last block to finish (a ticket in the workspace) does the same
 * over the blocks' runs. Over a candidate list (the screened LM head's:
 * a few hundred keys), block 0 alone ranks the list, the keys below the
 * list's floor left out. Then the (at most 64) candidates are walked
 * exactly as the CPU sampler does: weights, z, min-p, top-p, draw, all in
 * the same order and precision; by one warp for a top-k set, which is
 * sorted best first (draw_sorted), by one thread when top-k is off (a
 * vocabulary of at most 64, walked in index order). The parameters come
 * with the launch, or from device memory when the launch is one a graph
 * replays for every request (bn_cuda_sample_cand_dev).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "sample_key.cuh"
#include "smem_opt_in.cuh"

#include "sample_cuda.h"

namespace {

constexpr int kTopK = BN_CUDA_SAMPLE_MAX_K; /* run length, 64 */
constexpr int kMaxBlocks = 64;              /* pass-1 blocks (top-k) */
constexpr int kMinSlice = 2048;             /* pass-1 keys per block, at least */
constexpr int kSelectThreads = 512;
static_assert(BN_CUDA_SAMPLE_MAX_CAND <= kMaxBlocks * kTopK,
              "a candidate list fits pass 2's shared keys");
constexpr int kGreedySlice = 1024;
constexpr int kGreedyThreads = 256;

/* A real candidate: not padding, not -inf (which the CPU never keeps). */
__device__ __forceinline__ bool key_live(uint64_t key)
{
    return (uint32_t)(key >> 32) > ordered(-INFINITY);
}

/* ---- greedy --------------------------------------------------------------- */

/* The larger of best and the key of logit x at index i. */
__device__ __forceinline__ uint64_t max_key(uint64_t best, float x, int32_t i)
{
    const uint64_t key = make_key(x, i);
    return key > best ? key : best;
}

/* The same over the logits of f, at indices at .. at + 3. */
__device__ __forceinline__ uint64_t max_key4(uint64_t best, float4 f, int32_t at)
{
    best = max_key(best, f.x, at);
    best = max_key(best, f.y, at + 1);
    best = max_key(best, f.z, at + 2);
    return max_key(best, f.w, at + 3);
}

__device__ __forceinline__ uint64_t block_max_key(uint64_t v)
{
    __shared__ uint64_t warp_best[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t other = __shfl_xor_sync(0xffffffffu, v, o);
        v = other > v ? other : v;
    }
    if (lane == 0)
        warp_best[warp] = v;
    __syncthreads();
    v = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++)
        v = warp_best[w] > v ? warp_best[w] : v;
    return v;
}

__global__ void __launch_bounds__(kGreedyThreads)
    greedy_partial(const float *__restrict__ logits, int32_t vocab, uint64_t *__restrict__ ws)
{
    const int32_t begin = blockIdx.x * kGreedySlice;
    const int32_t end = min(vocab, begin + kGreedySlice);
    uint64_t best = 0;
    for (int32_t i = begin + threadIdx.x; i < end; i += blockDim.x)
        best = max_key(best, logits[i], i);
    best = block_max_key(best);
    if (threadIdx.x == 0)
        ws[blockIdx.x] = best;
}

__global__ void __launch_bounds__(1024)
    greedy_final(const uint64_t *__restrict__ ws, int blocks, int32_t *__restrict__ token)
{
    uint64_t best = 0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x)
        best = ws[i] > best ? ws[i] : best;
    best = block_max_key(best);
    /* Every logit -inf or NaN: no token can be chosen (-1), as the CPU
     * sampler says with BN_SAMPLER_NO_TOKEN. */
    if (threadIdx.x == 0)
        *token = key_live(best) ? key_id(best) : -1;
}

/* ---- top-k ---------------------------------------------------------------- */

/* The 64 largest of keys[0, n) (n a power of two >= 64), sorted
 * descending, into keys[0, 64); the rest of keys is scratch. runs_sorted:
 * every 64-run is already sorted descending (pass 1's output). All
 * threads of the block must call it. */
__device__ void block_top64(uint64_t *keys, int n, bool runs_sorted)
{
    const int nt = blockDim.x;
    /* Phase 1: bitonic sort of every 64-run, descending. The direction of a
     * size-k stage alternates between k-blocks; at k = 64 (the run itself)
     * it is descending for every run. */
    for (int k = 2; k <= kTopK && !runs_sorted; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int t = threadIdx.x; t < n / 2; t += nt) {
                const int i = 2 * j * (t / j) + t % j, p = i + j;
                const bool desc = ((i & (kTopK - 1)) & k) == 0;
                const uint64_t a = keys[i], b = keys[p];
                if (desc ? a < b : a > b) {
                    keys[i] = b;
                    keys[p] = a;
                }
            }
            __syncthreads();
        }
    }
    /* Phase 2: fold pairs of runs (at distance `span`) and re-sort. The run
     * A at r * 2 span keeps max(A[j], B[63 - j]): only the thread for j
     * reads or writes A[j], and B is only read, so no barrier is needed
     * between the reads and the writes. */
    for (int span = kTopK; span < n; span <<= 1) {
        const int pairs = n / (2 * span);
        for (int t = threadIdx.x; t < pairs * kTopK; t += nt) {
            const int base = (t / kTopK) * 2 * span, jj = t % kTopK;
            const uint64_t a = keys[base + jj], b = keys[base + span + kTopK - 1 - jj];
            keys[base + jj] = a > b ? a : b;
        }
        __syncthreads();
        for (int j = kTopK / 2; j > 0; j >>= 1) {
            for (int t = threadIdx.x; t < pairs * (kTopK / 2); t += nt) {
                const int w = t % (kTopK / 2);
                const int i = (t / (kTopK / 2)) * 2 * span + 2 * j * (w / j) + w % j;
                const uint64_t a = keys[i], b = keys[i + j];
                if (a < b) {
                    keys[i] = b;
                    keys[i + j] = a;
                }
            }
            __syncthreads();
        }
    }
}

struct walk_params {
    int32_t vocab;
    int top_k;
    float temperature, top_p, min_p;
};

/* What a request asks of the sampler (sample_cuda.h): a draw, the argmax
 * (temperature <= 0), or nothing it serves (NaN or infinite parameters, a
 * top-k above 64, top-k off over more than 64 tokens). The host launchers
 * and the kernel reading its parameters from device memory judge alike. */
enum sample_verdict { SAMPLE_DRAW, SAMPLE_GREEDY, SAMPLE_REFUSED };
__host__ __device__ sample_verdict judge(const walk_params &p)
{
    if (isnan(p.temperature) || p.temperature == INFINITY || isnan(p.top_p) || isnan(p.min_p))
        return SAMPLE_REFUSED;
    if (!(p.temperature > 0.0f))
        return SAMPLE_GREEDY;
    const bool top_k_on = p.top_k > 0 && p.top_k < p.vocab;
    return (top_k_on ? p.top_k <= kTopK : p.vocab <= kTopK) ? SAMPLE_DRAW : SAMPLE_REFUSED;
}

struct cand {
    float logit, w;
    int32_t id;
};

/* The CPU sampler's draw without a top-k (a vocabulary of at most 64;
 * a top-k set is draw_sorted's) over the candidates c[0, n), best first,
 * in three steps (the comments name the step of bn_sampler_sample each
 * mirrors): walk_prepare and walk_finish run on one thread, the weights
 * in between on one thread per candidate. */

/* +inf handling and the working order (the CPU's, without top-k: index
 * order); returns the max logit, or NaN when there is nothing to draw
 * from (n == 0). */
__device__ float walk_prepare(cand *c, int *n_io)
{
    int n = *n_io;
    if (n == 0)
        return NAN; /* nothing above -inf: no token (-1) */
    /* +inf tokens share everything: they sort first, by id. */
    if (c[0].logit == INFINITY) {
        int m = 0;
        while (m < n && c[m].logit == INFINITY)
            c[m++].logit = 0.0f;
        n = m;
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && c[j - 1].id > c[j].id; j--) {
            const cand t = c[j];
            c[j] = c[j - 1];
            c[j - 1] = t;
        }
    float max = c[0].logit;
    for (int i = 1; i < n; i++)
        max = c[i].logit > max ? c[i].logit : max;
    *n_io = n;
    return max;
}

/* Temperature and softmax: w in float, as the CPU's expf, from a double
 * exp (about 1 ulp in double, so the float rounding is all but always the
 * correctly rounded value glibc's expf also returns). */
__device__ __forceinline__ float walk_weight(float logit, float max, float T)
{
    return (float)exp((double)__fdiv_rn(__fsub_rn(logit, max), T));
}

__device__ int32_t walk_finish(cand *c, int n, const walk_params &p, double u)
{
    double z = 0.0;
    for (int i = 0; i < n; i++)
        z += c[i].w;
    /* Min-p (before top-p, same result as the documented order). */
    const float thr = p.min_p < 1.0f ? p.min_p : 1.0f;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (c[i].w > 0.0f && c[i].w >= thr)
            c[m++] = c[i];
    n = m;
    /* Top-p over the best-first order (the CPU's heap pops it in that
     * order from the index-ordered set). */
    if (p.top_p < 1.0f && n > 1) {
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0; j--) {
                const bool worse = c[j - 1].logit < c[j].logit ||
                                   (c[j - 1].logit == c[j].logit && c[j - 1].id > c[j].id);
                if (!worse)
                    break;
                const cand t = c[j];
                c[j] = c[j - 1];
                c[j - 1] = t;
            }
        const double target = (double)p.top_p * z;
        double cum = 0.0;
        int keep = 0;
        while (keep < n) {
            cum += c[keep++].w;
            if (cum >= target)
                break;
        }
        n = keep;
    }
    /* Draw. */
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += c[i].w;
    const double target = u * total;
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += c[i].w;
        if (target < cum)
            return c[i].id;
    }
    return c[n - 1].id;
}

/* The CPU sampler's draw over a top-k set (best first) by one warp, in
 * the steps walk_prepare and walk_finish take for the set without top-k
 * but in far fewer dependent ones: the same token from the same numbers. The
 * per-candidate steps (+inf, weights, min-p, the cuts' and the draw's
 * searches) take a lane per candidate (two for k > 32); what must stay in
 * order are the double sums, and one lane does those, twice: z over the
 * candidates, then the running sums cum[i] over the ones min-p keeps. The
 * CPU's top-p sum and its draw's total and running sum are those same
 * running sums (the same weights added in the same order from 0), so
 * top-p keeps up to the first i with cum[i] >= top_p z, the total is the
 * last kept cum, and the draw is the first kept i with u total < cum[i].
 * keys[0, k): the top k (k <= 64), live ones first. Lane 0's result. */
__device__ int32_t draw_sorted(const uint64_t *keys, int k, const walk_params &p, double u)
{
    __shared__ float w_s[kTopK];
    __shared__ double cum_s[kTopK];
    __shared__ int32_t id_s[kTopK];
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const unsigned below = (1u << lane) - 1u; /* lanes before this one */
    uint64_t key[2];
    float logit[2];
    bool live[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int i = lane + 32 * j;
        key[j] = i < k ? keys[i] : 0;
        live[j] = key_live(key[j]);
        logit[j] = key_logit(key[j]);
    }
    /* Live keys are a prefix (sorted, -inf and padding last). */
    int n = __popc(__ballot_sync(all, live[0])) + __popc(__ballot_sync(all, live[1]));
    if (n == 0)
        return -1; /* nothing above -inf: no token can be chosen */
    /* +inf tokens share everything: they are the prefix, weight 1 each. */
    if (__shfl_sync(all, logit[0], 0) == INFINITY) {
        n = __popc(__ballot_sync(all, live[0] && logit[0] == INFINITY)) +
            __popc(__ballot_sync(all, live[1] && logit[1] == INFINITY));
#pragma unroll
        for (int j = 0; j < 2; j++)
            if (logit[j] == INFINITY)
                logit[j] = 0.0f;
    }
    const float max = __shfl_sync(all, logit[0], 0); /* best first */
    float w[2];
    bool in[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        in[j] = lane + 32 * j < n;
        w[j] = in[j] ? walk_weight(logit[j], max, p.temperature) : 0.0f;
        if (in[j])
            w_s[lane + 32 * j] = w[j];
    }
    __syncwarp();
    double z = 0.0;
    if (lane == 0)
        for (int i = 0; i < n; i++)
            z += w_s[i];
    z = __shfl_sync(all, z, 0);
    /* Min-p, order kept: a kept candidate's place is the count of kept
     * ones before it. */
    const float thr = p.min_p < 1.0f ? p.min_p : 1.0f;
    bool keep[2];
#pragma unroll
    for (int j = 0; j < 2; j++)
        keep[j] = in[j] && w[j] > 0.0f && w[j] >= thr;
    const unsigned k0 = __ballot_sync(all, keep[0]), k1 = __ballot_sync(all, keep[1]);
    const int m = __popc(k0) + __popc(k1);
    __syncwarp(); /* lane 0 has read w_s */
    if (keep[0]) {
        w_s[__popc(k0 & below)] = w[0];
        id_s[__popc(k0 & below)] = key_id(key[0]);
    }
    if (keep[1]) {
        w_s[__popc(k0) + __popc(k1 & below)] = w[1];
        id_s[__popc(k0) + __popc(k1 & below)] = key_id(key[1]);
    }
    __syncwarp();
    if (lane == 0) {
        double cum = 0.0;
        for (int i = 0; i < m; i++) {
            cum += w_s[i];
            cum_s[i] = cum;
        }
    }
    __syncwarp();
    /* The first i in [0, m) with pred(cum[i]), m when none. */
    auto first = [&](double bar, bool at_least) {
        bool hit[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int i = lane + 32 * j;
            hit[j] = i < m && (at_least ? cum_s[i] >= bar : bar < cum_s[i]);
        }
        const unsigned h0 = __ballot_sync(all, hit[0]), h1 = __ballot_sync(all, hit[1]);
        return h0 ? __ffs(h0) - 1 : h1 ? 32 + __ffs(h1) - 1 : m;
    };
    int kept = m;
    if (p.top_p < 1.0f && m > 1) {
        const int f = first((double)p.top_p * z, true);
        kept = f < m ? f + 1 : m;
    }
    const double total = cum_s[kept - 1];
    const int d = first(u * total, false);
    return id_s[d < kept ? d : kept - 1];
}

/* The 64 best keys of a candidate list (listed keys in list, every key
 * that can be among the top k: bn_cuda_sample_cand) sorted descending into
 * keys[0, 64), padded with 0. Only keys whose logit is at least f
 * (NaN: no floor) are ranked: the top k are among them. Up to one key a
 * thread is left, each key's rank is the count of larger keys (keys are
 * unique: their low half is the id), else a bitonic top-64. keys holds
 * kMaxBlocks * kTopK >= listed keys. All threads of the block call it. */
__device__ void list_top64(uint64_t *keys, const uint64_t *__restrict__ list, unsigned listed,
                           float f)
{
    __shared__ unsigned kept;
    const uint32_t bar = f == f ? ordered(f) : 0u; /* NaN: no floor */
    if (threadIdx.x == 0)
        kept = 0;
    __syncthreads();
    for (unsigned t = threadIdx.x; t < listed; t += blockDim.x) {
        const uint64_t key = list[t];
        if ((uint32_t)(key >> 32) >= bar)
            keys[atomicAdd(&kept, 1u)] = key;
    }
    __syncthreads();
    const int n = (int)kept;
    if (n <= (int)blockDim.x) {
        const uint64_t mine = (int)threadIdx.x < n ? keys[threadIdx.x] : 0;
        int rank = 0;
        for (int j = 0; j < n; j++)
            rank += keys[j] > mine;
        __syncthreads();
        if (threadIdx.x < kTopK)
            keys[threadIdx.x] = 0;
        __syncthreads();
        if ((int)threadIdx.x < n && rank < kTopK)
            keys[rank] = mine;
        __syncthreads();
        return;
    }
    int m = kTopK; /* a power of two >= 64 holding the kept keys */
    while (m < n)
        m <<= 1;
    for (int t = n + (int)threadIdx.x; t < m; t += blockDim.x)
        keys[t] = 0;
    __syncthreads();
    block_top64(keys, m, false);
}

/* The 64 best keys of the whole vocabulary sorted descending into
 * keys[0, 64), by every block of the grid: block b keeps the 64 best of
 * logits[b * slice, + slice) in ws, and the last block to finish (a
 * ticket, reset to 0 by that block) merges the runs. Returns whether this
 * block is that last one (the others are done). keys holds slice and
 * kMaxBlocks * kTopK keys. */
__device__ bool vocab_top64(uint64_t *keys, const float *__restrict__ logits, int32_t vocab,
                            int slice, uint64_t *ws, unsigned *ticket)
{
    const int64_t begin = (int64_t)blockIdx.x * slice;
    for (int t = threadIdx.x; t < slice; t += blockDim.x) {
        const int64_t i = begin + t;
        keys[t] = i < vocab ? make_key(logits[i], (int32_t)i) : 0;
    }
    __syncthreads();
    block_top64(keys, slice, false);
    if (threadIdx.x < kTopK) {
        ws[blockIdx.x * kTopK + threadIdx.x] = keys[threadIdx.x];
        __threadfence(); /* the run is visible before the ticket counts it */
    }
    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x == 0)
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last)
        return false;
    __threadfence();
    const int count = (int)gridDim.x * kTopK;
    int n = kTopK;
    while (n < count)
        n <<= 1;
    for (int t = threadIdx.x; t < n; t += blockDim.x)
        keys[t] = t < count ? __ldcg(ws + t) : 0;
    if (threadIdx.x == 0)
        *ticket = 0; /* every block has counted itself */
    __syncthreads();
    block_top64(keys, n, true);
    return true;
}

/* Top-k and the draw in one launch: the 64 best keys, from the candidate
 * list when one is given and fits (*cand_n <= cap, cap <= kMaxBlocks *
 * kTopK: block 0 alone, the other blocks return at once) or else from the
 * whole vocabulary (vocab_top64), then the draw (token). dp (device
 * memory), when given, replaces
 * p's parameters but the vocabulary; what judge() refuses or calls greedy
 * then draws token -1. */
__global__ void __launch_bounds__(kSelectThreads)
    topk_select(const float *__restrict__ logits, int32_t vocab, int slice,
                uint64_t *__restrict__ ws, unsigned *__restrict__ ticket, walk_params p,
                const bn_cuda_sample_params *__restrict__ dp, const double *__restrict__ uniform,
                int32_t *__restrict__ token, const uint64_t *__restrict__ list, const unsigned *__restrict__ cand_n, int cap,
                const float *__restrict__ floor, int64_t ld, int64_t ws_words, bool rows)
{
    extern __shared__ uint64_t keys[];
    __shared__ cand c[kTopK];
    /* Row blockIdx.y of many (bn_cuda_sample_rows; 0 otherwise): its
     * logits, workspace, parameters, number and token. */
    logits += (int64_t)blockIdx.y * ld;
    ws += (int64_t)blockIdx.y * ws_words;
    ticket = reinterpret_cast<unsigned *>(ws + kMaxBlocks * kTopK);
    if (rows) {
        dp += blockIdx.y;
        uniform += blockIdx.y;
        token += blockIdx.y;
    }
    /* Every small input first, all loads in flight at once: each is a trip
     * to L2, and one after another they would add up. */
    const unsigned listed = cand_n ? *cand_n : 0;
    const float f = floor ? *floor : -INFINITY;
    const double u = uniform ? *uniform : 0.0;
    if (dp) {
        const bn_cuda_sample_params q = *dp;
        p.top_k = q.top_k;
        p.temperature = q.temperature;
        p.top_p = q.top_p;
        p.min_p = q.min_p;
    }
    if (rows && judge(p) != SAMPLE_DRAW)
        return; /* greedy_rows has this row */
    if (cand_n && listed <= (unsigned)cap) {
        if (blockIdx.x != 0)
            return;
        list_top64(keys, list, listed, f);
    } else if (!vocab_top64(keys, logits, vocab, slice, ws, ticket)) {
        return;
    }
    if (dp && judge(p) != SAMPLE_DRAW) {
        if (threadIdx.x == 0)
            *token = -1;
        return;
    }
    const int k = p.top_k > 0 && p.top_k < kTopK ? p.top_k : kTopK;
    /* A top-k set is sorted: one warp draws (draw_sorted). */
    if (p.top_k > 0 && p.top_k < p.vocab) {
        if (threadIdx.x < 32) {
            const int32_t t = draw_sorted(keys, k, p, u);
            if (threadIdx.x == 0)
                *token = t;
        }
        return;
    }
    __shared__ int n_cand;
    __shared__ float max_logit;
    if (threadIdx.x == 0) {
        int m = 0;
        while (m < k && key_live(keys[m])) {
            c[m].logit = key_logit(keys[m]);
            c[m].w = 0.0f;
            c[m].id = key_id(keys[m]);
            m++;
        }
        max_logit = walk_prepare(c, &m);
        n_cand = m;
    }
    __syncthreads();
    const int m = n_cand;
    if (threadIdx.x < m)
        c[threadIdx.x].w = walk_weight(c[threadIdx.x].logit, max_logit, p.temperature);
    __syncthreads();
    if (threadIdx.x == 0)
        *token = m == 0 ? -1 : walk_finish(c, m, p, u);
}

int next_pow2(int64_t x)
{
    int64_t p = 1;
    while (p < x)
        p <<= 1;
    return (int)p;
}

/* Pass-1 slice: at least kMinSlice keys, few enough blocks for pass 2. */
int topk_slice(int32_t vocab)
{
    const int64_t need = (vocab + kMaxBlocks - 1) / kMaxBlocks;
    return next_pow2(need > kMinSlice ? need : kMinSlice);
}

cudaError_t copy_out(const int32_t *d_token, int32_t *h_token, cudaStream_t stream)
{
    if (!h_token)
        return cudaSuccess;
    return cudaMemcpyAsync(h_token, d_token, sizeof *h_token, cudaMemcpyDeviceToHost, stream);
}

/* The ticket vocab_top64's blocks count themselves on: after the runs in
 * the workspace (bn_cuda_sample_workspace_bytes). */
unsigned *topk_ticket(void *workspace)
{
    return reinterpret_cast<unsigned *>(static_cast<uint64_t *>(workspace) + kMaxBlocks * kTopK);
}

cudaError_t launch_topk_select(const float *logits, int32_t vocab, void *workspace,
                               const walk_params &wp, const bn_cuda_sample_params *dp,
                               const double *uniform, int32_t *token, const uint64_t *list,
                               const unsigned *cand_n, int cap, const float *floor,
                               cudaStream_t stream)
{
    const int slice = topk_slice(vocab);
    const int blocks = (int)((vocab + slice - 1) / slice);
    const int held = slice > kMaxBlocks * kTopK ? slice : kMaxBlocks * kTopK;
    const size_t smem = (size_t)held * sizeof(uint64_t);
    const cudaError_t rc = allow_dynamic_smem(topk_select, smem);
    if (rc != cudaSuccess)
        return rc;
    topk_select<<<blocks, kSelectThreads, smem, stream>>>(
        logits, vocab, slice, static_cast<uint64_t *>(workspace), topk_ticket(workspace), wp, dp,
        uniform, token, list, cand_n, cap, floor, 0, 0, false);
    return cudaGetLastError();
}

/* Block k: the argmax of row k when its parameters ask for greedy, -1
 * when bn_cuda_sample_cand would refuse them; sampled rows are
 * topk_select's. */
__global__ void __launch_bounds__(1024)
    greedy_rows(const float *__restrict__ logits, int64_t ld, int32_t vocab,
                const bn_cuda_sample_params *__restrict__ dp, int32_t *__restrict__ tokens)
{
    const bn_cuda_sample_params q = dp[blockIdx.x];
    const walk_params p = {vocab, q.top_k, q.temperature, q.top_p, q.min_p};
    const sample_verdict v = judge(p);
    if (v == SAMPLE_DRAW)
        return;
    const float *row = logits + (int64_t)blockIdx.x * ld;
    uint64_t best = 0;
    int32_t i = threadIdx.x; /* the logits left to the loop below */
    if (v == SAMPLE_GREEDY && reinterpret_cast<uintptr_t>(row) % 16 == 0) {
        /* Four logits a load, four loads in flight: a row is one block's,
         * so its loads must overlap (the keys' maximum does not depend on
         * the order they are met in). */
        const float4 *row4 = reinterpret_cast<const float4 *>(row);
        const int32_t n4 = vocab / 4, step = (int32_t)blockDim.x;
        int32_t j = threadIdx.x;
        for (; j + 3 * step < n4; j += 4 * step) {
            float4 f[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                f[u] = row4[j + u * step];
#pragma unroll
            for (int u = 0; u < 4; u++)
                best = max_key4(best, f[u], 4 * (j + u * step));
        }
        for (; j < n4; j += step)
            best = max_key4(best, row4[j], 4 * j);
        i = 4 * n4 + threadIdx.x;
    }
    if (v == SAMPLE_GREEDY)
        for (; i < vocab; i += blockDim.x)
            best = max_key(best, row[i], i);
    best = block_max_key(best);
    if (threadIdx.x == 0)
        tokens[blockIdx.x] = key_live(best) ? key_id(best) : -1;
}

} // namespace

extern "C" size_t bn_cuda_sample_workspace_bytes(int32_t vocab)
{
    if (vocab < 1)
        return 0;
    /* Enough for every vocabulary up to this one: top-k's vocabulary pass
     * never has more than kMaxBlocks blocks (a smaller vocabulary can have
     * more blocks than a larger one, with smaller slices), greedy has one
     * key per kGreedySlice logits (at most 1024 < kMaxBlocks * kTopK); then
     * the ticket (topk_ticket), padded to a key. */
    static_assert((BN_CUDA_SAMPLE_MAX_VOCAB + kGreedySlice - 1) / kGreedySlice <=
                      kMaxBlocks * kTopK,
                  "greedy's keys fit before the ticket");
    return ((size_t)kMaxBlocks * kTopK + 1) * sizeof(uint64_t);
}

extern "C" cudaError_t bn_cuda_sample_greedy(const float *logits, int32_t vocab, void *workspace,
                                             int32_t *d_token, int32_t *h_token,
                                             cudaStream_t stream)
{
    if (vocab < 1 || vocab > BN_CUDA_SAMPLE_MAX_VOCAB || !logits || !workspace || !d_token)
        return cudaErrorInvalidValue;
    const int blocks = (vocab + kGreedySlice - 1) / kGreedySlice;
    uint64_t *ws = static_cast<uint64_t *>(workspace);
    greedy_partial<<<blocks, kGreedyThreads, 0, stream>>>(logits, vocab, ws);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    greedy_final<<<1, 1024, 0, stream>>>(ws, blocks, d_token);
    rc = cudaGetLastError();
    return rc != cudaSuccess ? rc : copy_out(d_token, h_token, stream);
}

extern "C" cudaError_t bn_cuda_sample_cand(const float *logits, int32_t vocab,
                                           const uint64_t *cand, const unsigned *cand_n,
                                           int cand_cap, const float *cand_floor,
                                           const bn_cuda_sample_params *p,
                                           const double *d_uniform, void *workspace,
                                           int32_t *d_token, int32_t *h_token,
                                           cudaStream_t stream)
{
    if (cand_n && (!cand || cand_cap < 0 || cand_cap > BN_CUDA_SAMPLE_MAX_CAND))
        return cudaErrorInvalidValue;
    if (!p)
        return cudaErrorInvalidValue;
    const walk_params wp = {vocab, p->top_k, p->temperature, p->top_p, p->min_p};
    const sample_verdict v = judge(wp);
    if (v == SAMPLE_GREEDY)
        return bn_cuda_sample_greedy(logits, vocab, workspace, d_token, h_token, stream);
    /* Refused: NaN or infinite parameters, or a top-k for the CPU sampler. */
    if (v == SAMPLE_REFUSED || vocab < 1 || vocab > BN_CUDA_SAMPLE_MAX_VOCAB || !logits ||
        !workspace || !d_token || !d_uniform)
        return cudaErrorInvalidValue;
    const cudaError_t rc = launch_topk_select(logits, vocab, workspace, wp, nullptr, d_uniform,
                                              d_token, cand, cand_n, cand_cap, cand_floor, stream);
    return rc != cudaSuccess ? rc : copy_out(d_token, h_token, stream);
}

extern "C" cudaError_t bn_cuda_sample_cand_dev(const float *logits, int32_t vocab,
                                               const uint64_t *cand, const unsigned *cand_n,
                                               int cand_cap, const float *cand_floor,
                                               const bn_cuda_sample_params *d_p,
                                               const double *d_uniform, void *workspace,
                                               int32_t *d_token, cudaStream_t stream)
{
    if (cand_n && (!cand || cand_cap < 0 || cand_cap > BN_CUDA_SAMPLE_MAX_CAND))
        return cudaErrorInvalidValue;
    if (vocab < 1 || vocab > BN_CUDA_SAMPLE_MAX_VOCAB || !logits || !workspace || !d_token ||
        !d_uniform || !d_p)
        return cudaErrorInvalidValue;
    const walk_params wp = {vocab, 0, 0.0f, 0.0f, 0.0f}; /* all but vocab from d_p */
    return launch_topk_select(logits, vocab, workspace, wp, d_p, d_uniform, d_token, cand, cand_n,
                              cand_cap, cand_floor, stream);
}

extern "C" cudaError_t bn_cuda_sample_rows(const float *logits, int64_t ld, int32_t vocab,
                                           int n_rows, const bn_cuda_sample_params *d_p,
                                           const double *d_u, void *workspace, int any_sampled,
                                           int32_t *d_tokens, cudaStream_t stream)
{
    if (vocab < 1 || vocab > BN_CUDA_SAMPLE_MAX_VOCAB || !logits || ld < vocab || n_rows < 0 ||
        n_rows > 65535 || !d_p || !d_u || !workspace || !d_tokens)
        return cudaErrorInvalidValue;
    if (n_rows == 0)
        return cudaSuccess;
    greedy_rows<<<n_rows, 1024, 0, stream>>>(logits, ld, vocab, d_p, d_tokens);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess || !any_sampled)
        return rc;
    const int slice = topk_slice(vocab);
    const int blocks = (int)((vocab + slice - 1) / slice);
    const int held = slice > kMaxBlocks * kTopK ? slice : kMaxBlocks * kTopK;
    const size_t smem = (size_t)held * sizeof(uint64_t);
    rc = allow_dynamic_smem(topk_select, smem);
    if (rc != cudaSuccess)
        return rc;
    const walk_params wp = {vocab, 0, 0.0f, 0.0f, 0.0f}; /* all but vocab from d_p */
    uint64_t *ws = static_cast<uint64_t *>(workspace);
    topk_select<<<dim3((unsigned)blocks, (unsigned)n_rows), kSelectThreads, smem, stream>>>(
        logits, vocab, slice, ws, topk_ticket(ws), wp, d_p, d_u, d_tokens, nullptr, nullptr, 0,
        nullptr, ld, (int64_t)(bn_cuda_sample_workspace_bytes(vocab) / sizeof(uint64_t)), true);
    return cudaGetLastError();
}
