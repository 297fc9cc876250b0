/* GPU test: the CUDA backend's decode attention over an fp32 cache
 * (bn_cb_attn_decode, q|k|v epilogue fused), both ways of merging its
 * ranges - through a ticket and a last block (every split count it may be
 * given) and through a thread-block cluster (every cluster size, where the
 * device has clusters) - against a double-precision CPU reference:
 *
 *   - q, k and v of the token come from bn_cb_qkv_post on the same raw row
 *     (the contract: the same values bit for bit), so the reference
 *     attention uses exactly the GPU's q and k, v;
 *   - k and v stored at the token's position must equal bn_cb_qkv_post's
 *     bit for bit, and no other cache position may change;
 *   - the output (poisoned with NaN first) within 2e-5 * max|v| + 1e-6 of
 *     the reference: the output is a convex combination of value rows, so
 *     a weight error moves it by at most (error) * max|v|; the fp32 dots,
 *     expf and rescaling make weight errors of ~1e-6 (the test prints the
 *     worst seen);
 *   - the ticket's counters back at zero after every launch;
 *   - positions 0, 1, tile edges (31, 32, 33), long ones, the last slot,
 *     and positions outside the cache (zeros out, nothing stored);
 *   - shapes: the 2B-4T heads (20 / 5 x 128: 4 heads per block), groups of
 *     2 and 1, head_dim 256 (two chunks per lane), head_dim 36 (a partial
 *     lane, RoPE halves not a multiple of 4), partial RoPE and none; q
 *     scaled small and large (flat and peaked softmax);
 *   - a captured CUDA graph replayed for several positions (the position
 *     read from device memory), for each merge, and with its node disabled
 *     and enabled again (bench e2e's stage costs);
 *   - the L2 prefetch of another cache's rows (the next layer's) on or off;
 *   - bn_cb_qkv_post over many rows: its float4 kernel bit for bit its
 *     scalar one (q and both caches, fp32 and fp16, positions past the
 *     RoPE table and outside the cache);
 *   - the cluster kernel computing the q|k|v product itself (w_qkv): random
 *     ternary weights and int8 codes, the raw row made by the W2A8 GEMV
 *     (weight scale 1) for the reference; outputs as the reference, the
 *     cache bit for bit, and outputs bit for bit those of the kernel fed the
 *     GEMV's raw row, at every cluster size, with and without pdl, for row
 *     lengths of whole and partial chunk-groups.
 *
 * Also prints the time of one launch at the 2B-4T shape per merge
 * (information, not a check). Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_kernels.h"
#include "cuda_layout.h"
#include "ops_cuda.h"
#include "test_util.h"
#include "test_util_cuda.h"
#include "w2a8_cuda.h"

typedef struct shape {
    int n_heads, n_kv, hd, rope_dim;
    int64_t capacity;
} shape;

/* One problem on the device: the raw q|k|v row, the cache (and a copy as
 * bn_cb_qkv_post leaves it), the RoPE table, the ticket's workspace. */
typedef struct problem {
    shape s;
    int64_t q_dim, kv_dim, row, cache_elems;
    float *raw, *kc, *vc;      /* host: the raw row; the cache before the step */
    double *ref;               /* host: the reference outputs (q_dim)             */
    float *k_new, *v_new;      /* host: the token's k and v qkv_post stored       */
    float *d_raw, *d_kc, *d_vc, *d_kc2, *d_vc2, *d_q, *d_table, *d_out, *d_ws;
    unsigned *d_counters;
    int32_t *d_pos;
    bn_rope_freqs freqs;
    float sq, sk, sv;
    float vmax;
} problem;

static double worst_rel = 0.0;

static void problem_init(problem *pr, const shape *s, float qrange)
{
    memset(pr, 0, sizeof *pr);
    pr->s = *s;
    pr->q_dim = (int64_t)s->n_heads * s->hd;
    pr->kv_dim = (int64_t)s->n_kv * s->hd;
    pr->row = pr->q_dim + 2 * pr->kv_dim;
    pr->cache_elems = s->capacity * pr->kv_dim;
    pr->sq = qrange;
    pr->sk = 1.25f;
    pr->sv = 0.75f;
    pr->raw = malloc((size_t)pr->row * sizeof(float));
    pr->kc = malloc((size_t)pr->cache_elems * sizeof(float));
    pr->vc = malloc((size_t)pr->cache_elems * sizeof(float));
    pr->ref = malloc((size_t)pr->q_dim * sizeof(double));
    pr->k_new = malloc((size_t)pr->kv_dim * sizeof(float));
    pr->v_new = malloc((size_t)pr->kv_dim * sizeof(float));
    for (int64_t i = 0; i < pr->row; i++)
        pr->raw[i] = test_rand_float(-1.0f, 1.0f);
    pr->vmax = 0.0f;
    for (int64_t i = 0; i < pr->cache_elems; i++) {
        pr->kc[i] = test_rand_float(-1.0f, 1.0f);
        pr->vc[i] = test_rand_float(-1.0f, 1.0f);
        pr->vmax = fmaxf(pr->vmax, fabsf(pr->vc[i]));
    }
    for (int64_t i = 0; i < pr->kv_dim; i++) /* the token's own v */
        pr->vmax = fmaxf(pr->vmax, fabsf(pr->raw[pr->q_dim + pr->kv_dim + i] * pr->sv));
    const size_t cb = (size_t)pr->cache_elems * sizeof(float);
    CUDA_OK(cudaMalloc((void **)&pr->d_raw, (size_t)pr->row * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&pr->d_kc, cb));
    CUDA_OK(cudaMalloc((void **)&pr->d_vc, cb));
    CUDA_OK(cudaMalloc((void **)&pr->d_kc2, cb));
    CUDA_OK(cudaMalloc((void **)&pr->d_vc2, cb));
    CUDA_OK(cudaMalloc((void **)&pr->d_q, (size_t)pr->q_dim * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&pr->d_out, (size_t)pr->q_dim * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&pr->d_pos, sizeof(int32_t)));
    const bn_cb_attn_shape as = {s->n_heads, s->n_kv, s->hd, s->capacity};
    const int splits = bn_cb_attn_decode_splits(s->capacity);
    /* room for any split count the test passes (up to 64) */
    CUDA_OK(cudaMalloc((void **)&pr->d_ws, bn_cb_attn_decode_workspace_bytes(&as, 64)));
    CHECK(splits >= 1 && splits <= 64);
    CUDA_OK(cudaMalloc((void **)&pr->d_counters, (size_t)s->n_heads * sizeof(unsigned)));
    CUDA_OK(cudaMemset(pr->d_counters, 0, (size_t)s->n_heads * sizeof(unsigned)));
    CUDA_OK(cudaMemcpy(pr->d_raw, pr->raw, (size_t)pr->row * sizeof(float),
                       cudaMemcpyHostToDevice));
    if (s->rope_dim > 0) {
        CUDA_OK(bn_rope_freqs_init(&pr->freqs, 10000.0f, s->rope_dim));
        const size_t tb = (size_t)s->capacity * (size_t)(s->rope_dim / 2) * 2 * sizeof(float);
        CUDA_OK(cudaMalloc((void **)&pr->d_table, tb));
        CUDA_OK(bn_cb_rope_table(&pr->freqs, s->capacity, pr->d_table, 0));
    } else {
        pr->freqs.rope_dim = 0;
    }
}

static void problem_free(problem *pr)
{
    cudaFree(pr->d_raw), cudaFree(pr->d_kc), cudaFree(pr->d_vc), cudaFree(pr->d_kc2),
        cudaFree(pr->d_vc2), cudaFree(pr->d_q), cudaFree(pr->d_table), cudaFree(pr->d_out),
        cudaFree(pr->d_ws), cudaFree(pr->d_counters), cudaFree(pr->d_pos);
    free(pr->raw), free(pr->kc), free(pr->vc), free(pr->ref), free(pr->k_new), free(pr->v_new);
}

/* The cache as before the step, on the device (both copies), and p. */
static void reset_cache(problem *pr, int p)
{
    const size_t cb = (size_t)pr->cache_elems * sizeof(float);
    CUDA_OK(cudaMemcpy(pr->d_kc, pr->kc, cb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(pr->d_vc, pr->vc, cb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(pr->d_kc2, pr->kc, cb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(pr->d_vc2, pr->vc, cb, cudaMemcpyHostToDevice));
    const int32_t pos = p;
    CUDA_OK(cudaMemcpy(pr->d_pos, &pos, sizeof pos, cudaMemcpyHostToDevice));
}

static bn_cb_attn_decode_args decode_args(const problem *pr, int splits, int cluster)
{
    bn_cb_attn_decode_args a;
    memset(&a, 0, sizeof a);
    a.qkv = pr->d_raw;
    a.scale_q = pr->sq;
    a.scale_k = pr->sk;
    a.scale_v = pr->sv;
    a.rope = pr->s.rope_dim > 0 ? pr->d_table : NULL;
    a.rope_dim = pr->s.rope_dim;
    a.pos = pr->d_pos;
    a.k_cache = pr->d_kc;
    a.v_cache = pr->d_vc;
    a.splits = splits;
    a.workspace = pr->d_ws;
    a.counters = pr->d_counters;
    a.out = pr->d_out;
    a.cluster = cluster;
    /* The L2 prefetch of a "next layer" (the reference's cache copy: any
     * cache of the shape), except with one range (NULL: none). */
    a.next_k_cache = splits == 1 ? NULL : pr->d_kc2;
    a.next_v_cache = splits == 1 ? NULL : pr->d_vc2;
    return a;
}

/* The reference for position p: q and the token's k, v from bn_cb_qkv_post
 * (into the second cache copy), the attention in double, into pr->ref (q_dim
 * values; zeros for a position outside the cache) and pr->k_new, v_new (the
 * kv_dim values qkv_post stored). */
static void reference(problem *pr, int p)
{
    double *ref = pr->ref;
    float *k_new = pr->k_new, *v_new = pr->v_new;
    const shape *s = &pr->s;
    const bool valid = p >= 0 && p < s->capacity;
    memset(ref, 0, (size_t)pr->q_dim * sizeof(double));
    const bn_cb_qkv_shape qs = {s->n_heads, s->n_kv, s->hd, s->capacity, pr->sq, pr->sk, pr->sv};
    CUDA_OK(bn_cb_qkv_post(pr->d_raw, pr->row, 1, &qs, &pr->freqs,
                           s->rope_dim > 0 ? pr->d_table : NULL, s->rope_dim > 0 ? s->capacity : 0,
                           pr->d_pos, pr->d_q, pr->q_dim, pr->d_kc2, pr->d_vc2, 0, 0, 0));
    CUDA_OK(cudaDeviceSynchronize());
    if (!valid)
        return;
    float *q = malloc((size_t)pr->q_dim * sizeof(float));
    CUDA_OK(cudaMemcpy(q, pr->d_q, (size_t)pr->q_dim * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(k_new, pr->d_kc2 + (int64_t)p * pr->kv_dim,
                       (size_t)pr->kv_dim * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(v_new, pr->d_vc2 + (int64_t)p * pr->kv_dim,
                       (size_t)pr->kv_dim * sizeof(float), cudaMemcpyDeviceToHost));
    const int group = s->n_heads / s->n_kv;
    const double scale = (double)(float)(1.0 / sqrt((double)s->hd));
    double *w = malloc((size_t)(p + 1) * sizeof(double));
    for (int h = 0; h < s->n_heads; h++) {
        const int64_t kvo = (int64_t)(h / group) * s->hd;
        double mx = -INFINITY;
        for (int t = 0; t <= p; t++) {
            const float *k = t == p ? k_new + kvo : pr->kc + (int64_t)t * pr->kv_dim + kvo;
            double d = 0.0;
            for (int i = 0; i < s->hd; i++)
                d += (double)q[(int64_t)h * s->hd + i] * (double)k[i];
            w[t] = d * scale;
            mx = fmax(mx, w[t]);
        }
        double sum = 0.0;
        for (int t = 0; t <= p; t++) {
            w[t] = exp(w[t] - mx);
            sum += w[t];
        }
        for (int t = 0; t <= p; t++) {
            const float *v = t == p ? v_new + kvo : pr->vc + (int64_t)t * pr->kv_dim + kvo;
            for (int i = 0; i < s->hd; i++)
                ref[(int64_t)h * s->hd + i] += w[t] / sum * (double)v[i];
        }
    }
    free(w), free(q);
}

/* The outputs and the cache after one launch, against the reference.
 * Returns whether everything held. */
static bool verify(problem *pr, int p, const char *what)
{
    const double *ref = pr->ref;
    const float *k_new = pr->k_new, *v_new = pr->v_new;
    const shape *s = &pr->s;
    const bool valid = p >= 0 && p < s->capacity;
    float *out = malloc((size_t)pr->q_dim * sizeof(float));
    float *kc = malloc((size_t)pr->cache_elems * sizeof(float));
    float *vc = malloc((size_t)pr->cache_elems * sizeof(float));
    unsigned *cnt = malloc((size_t)s->n_heads * sizeof(unsigned));
    CUDA_OK(cudaMemcpy(out, pr->d_out, (size_t)pr->q_dim * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(kc, pr->d_kc, (size_t)pr->cache_elems * sizeof(float),
                       cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(vc, pr->d_vc, (size_t)pr->cache_elems * sizeof(float),
                       cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(cnt, pr->d_counters, (size_t)s->n_heads * sizeof(unsigned),
                       cudaMemcpyDeviceToHost));
    const double tol = 2e-5 * pr->vmax + 1e-6;
    int64_t bad = 0, at = -1;
    double worst = 0.0;
    for (int64_t i = 0; i < pr->q_dim; i++) {
        const double e = fabs((double)out[i] - ref[i]);
        if (!(e <= tol)) {
            if (bad++ == 0)
                at = i;
        } else if (e > worst) {
            worst = e;
        }
    }
    if (pr->vmax > 0.0f && worst / pr->vmax > worst_rel)
        worst_rel = worst / pr->vmax;
    /* The cache: position p holds qkv_post's k and v, the rest is as before. */
    int64_t cache_bad = 0, cache_at = -1;
    for (int64_t i = 0; i < pr->cache_elems; i++) {
        const int64_t t = i / pr->kv_dim, j = i % pr->kv_dim;
        const bool own = valid && t == p;
        const float ek = own ? k_new[j] : pr->kc[i], ev = own ? v_new[j] : pr->vc[i];
        if (memcmp(&kc[i], &ek, 4) != 0 || memcmp(&vc[i], &ev, 4) != 0) {
            if (cache_bad++ == 0)
                cache_at = i;
        }
    }
    int counters_bad = 0;
    for (int h = 0; h < s->n_heads; h++)
        counters_bad += cnt[h] != 0;
    CHECK_MSG(bad == 0, "%s: %lld of %lld outputs off (first at %lld: gpu %.9g ref %.9g, tol %.3g)",
              what, (long long)bad, (long long)pr->q_dim, (long long)at,
              at >= 0 ? out[at] : 0.0, at >= 0 ? ref[at] : 0.0, tol);
    CHECK_MSG(cache_bad == 0, "%s: %lld cache values wrong (first at position %lld, value %lld)",
              what, (long long)cache_bad, (long long)(cache_at >= 0 ? cache_at / pr->kv_dim : -1),
              (long long)(cache_at >= 0 ? cache_at % pr->kv_dim : -1));
    CHECK_MSG(counters_bad == 0, "%s: %d counters not back at zero", what, counters_bad);
    free(out), free(kc), free(vc), free(cnt);
    return bad == 0 && cache_bad == 0 && counters_bad == 0;
}

/* The merges to check: the ticket with the backend's split count, one
 * range, an odd count and the most; then each cluster size up to what the
 * device allows. */
typedef struct merge {
    int splits, cluster;
} merge;

static int merges_for(const problem *pr, int max_cluster, merge *m)
{
    int n = 0;
    m[n++] = (merge){bn_cb_attn_decode_splits(pr->s.capacity), 0};
    m[n++] = (merge){1, 0};
    m[n++] = (merge){3, 0};
    m[n++] = (merge){64, 0};
    for (int c = 2; c <= max_cluster; c *= 2)
        m[n++] = (merge){0, c};
    return n;
}

static void merge_name(const merge *m, char *buf, size_t size)
{
    if (m->cluster)
        snprintf(buf, size, "cluster %d", m->cluster);
    else
        snprintf(buf, size, "ticket, %d splits", m->splits);
}

static void check_shape(const shape *s, float qrange, int max_cluster)
{
    problem pr;
    problem_init(&pr, s, qrange);
    const int cap = (int)s->capacity;
    const int positions[] = {0, 1, 31, 32, 33, 100, 255, 511, 639, cap - 1, cap, -1};
    merge m[16];
    const int nm = merges_for(&pr, max_cluster, m);
    const bn_cb_attn_shape as = {s->n_heads, s->n_kv, s->hd, s->capacity};
    int failed = 0, runs = 0;
    for (size_t i = 0; i < sizeof positions / sizeof positions[0]; i++) {
        const int p = positions[i];
        if (p > cap)
            continue; /* beyond a small cache: cap itself is the outside case */
        reset_cache(&pr, p);
        reference(&pr, p);
        for (int j = 0; j < nm; j++) {
            reset_cache(&pr, p);
            CUDA_OK(cudaMemset(pr.d_out, 0xff, (size_t)pr.q_dim * sizeof(float))); /* NaN */
            const bn_cb_attn_decode_args a = decode_args(&pr, m[j].splits, m[j].cluster);
            CUDA_OK(bn_cb_attn_decode(&as, &a, j % 2, 0)); /* with and without pdl */
            CUDA_OK(cudaDeviceSynchronize());
            char name[64], what[256];
            merge_name(&m[j], name, sizeof name);
            snprintf(what, sizeof what, "%d/%d heads x %d, rope %d, cap %lld, q x%g, p %d, %s",
                     s->n_heads, s->n_kv, s->hd, s->rope_dim, (long long)s->capacity,
                     (double)qrange, p, name);
            failed += !verify(&pr, p, what);
            runs++;
        }
    }
    printf("%2d/%d heads x %3d, rope %3d, cap %4lld, q x%-3g: %d launches over %d merges: %s\n",
           s->n_heads, s->n_kv, s->hd, s->rope_dim, (long long)s->capacity, (double)qrange, runs,
           nm, failed ? "FAILED" : "outputs, cache and counters as the reference");
    problem_free(&pr);
}

/* One graph per merge, replayed for a sequence of positions (written to
 * device memory between replays): each replay must match the reference. */
static void check_graph(const shape *s, int max_cluster)
{
    problem pr;
    problem_init(&pr, s, 1.0f);
    merge m[16];
    const int nm = merges_for(&pr, max_cluster, m);
    const bn_cb_attn_shape as = {s->n_heads, s->n_kv, s->hd, s->capacity};
    const int steps[] = {5, 40, 300, 700};
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int j = 0; j < nm; j++) {
        if (j == 1 || j == 2)
            continue; /* the ticket's split counts: one is enough here */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        const bn_cb_attn_decode_args a = decode_args(&pr, m[j].splits, m[j].cluster);
        CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        CUDA_OK(bn_cb_attn_decode(&as, &a, 0, st));
        CUDA_OK(cudaStreamEndCapture(st, &g));
        CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
        char name[64];
        merge_name(&m[j], name, sizeof name);
        int failed = 0;
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
            const int p = steps[i];
            reset_cache(&pr, p);
            reference(&pr, p);
            reset_cache(&pr, p);
            CUDA_OK(cudaMemset(pr.d_out, 0xff, (size_t)pr.q_dim * sizeof(float)));
            /* The copies and the memset run on the legacy stream, which a
             * non-blocking stream does not wait for: without this the
             * poison could land after the replay's outputs. */
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaGraphLaunch(ge, st));
            CUDA_OK(cudaStreamSynchronize(st));
            char what[160];
            snprintf(what, sizeof what, "graph (%s), replay at p %d", name, p);
            failed += !verify(&pr, p, what);
        }
        /* The node disabled (bench e2e's stage costs do this) and enabled
         * again: disabled, the replay leaves out alone; enabled, as before. */
        cudaGraphNode_t node;
        size_t n_nodes = 1;
        CUDA_OK(cudaGraphGetNodes(g, &node, &n_nodes));
        CHECK(n_nodes == 1);
        const int p = 77;
        reset_cache(&pr, p);
        reference(&pr, p);
        reset_cache(&pr, p);
        CUDA_OK(cudaMemset(pr.d_out, 0xff, (size_t)pr.q_dim * sizeof(float)));
        CUDA_OK(cudaDeviceSynchronize()); /* as above */
        const cudaError_t off = cudaGraphNodeSetEnabled(ge, node, 0);
        /* Drivers refuse it for non-portable cluster sizes (above 8); the
         * backend's stage-cost timing says so (cuda_backend.h). */
        const bool refused = off == cudaErrorInvalidClusterSize && m[j].cluster > 8;
        CHECK_MSG(off == cudaSuccess || refused, "graph (%s): disabling the node: %s", name,
                  cudaGetErrorString(off));
        (void)cudaGetLastError();
        if (off == cudaSuccess) {
            CUDA_OK(cudaGraphLaunch(ge, st));
            CUDA_OK(cudaStreamSynchronize(st));
            uint32_t first = 0;
            CUDA_OK(cudaMemcpy(&first, pr.d_out, sizeof first, cudaMemcpyDeviceToHost));
            CHECK_MSG(first == 0xffffffffu, "graph (%s): the disabled node ran", name);
            CUDA_OK(cudaGraphNodeSetEnabled(ge, node, 1));
            CUDA_OK(cudaGraphLaunch(ge, st));
            CUDA_OK(cudaStreamSynchronize(st));
            char what[160];
            snprintf(what, sizeof what, "graph (%s), enabled again, p %d", name, p);
            failed += !verify(&pr, p, what);
        }
        printf("graph %-18s: %zu replays as the reference%s; node disabled and enabled: %s\n",
               name, sizeof steps / sizeof steps[0], failed ? " (NOT ALL)" : "",
               refused ? "refused by the driver (cudaErrorInvalidClusterSize)"
               : off != cudaSuccess ? "FAILED"
                                    : "as the reference");
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
    }
    cudaStreamDestroy(st);
    problem_free(&pr);
}

/* The q|k|v product inside the cluster kernel (a->w_qkv), row length k. */
static void check_qkv_inside(const shape *s, int64_t k, int max_cluster)
{
    problem pr;
    problem_init(&pr, s, 1.0f);
    const bn_cb_attn_shape as = {s->n_heads, s->n_kv, s->hd, s->capacity};
    bn_cuda_layout l;
    bn_cuda_layout_init(&l, pr.row, k);
    int8_t *codes = malloc((size_t)(pr.row * k));
    uint8_t *packed = malloc(l.bytes);
    int8_t *xq = calloc((size_t)l.k_padded, 1);
    for (int64_t i = 0; i < pr.row * k; i++)
        codes[i] = (int8_t)test_rand_range(-1, 1);
    bn_cuda_layout_pack(&l, codes, packed);
    int32_t sum = 0;
    for (int64_t i = 0; i < k; i++) {
        xq[i] = (int8_t)test_rand_range(-127, 127);
        sum += xq[i];
    }
    const float scale = 1500.0f;
    uint8_t *d_w;
    int8_t *d_xq;
    float *d_scale, *d_out2;
    int32_t *d_sum;
    CUDA_OK(cudaMalloc((void **)&d_w, l.bytes));
    CUDA_OK(cudaMalloc((void **)&d_xq, (size_t)l.k_padded));
    CUDA_OK(cudaMalloc((void **)&d_scale, sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_sum, sizeof(int32_t)));
    CUDA_OK(cudaMalloc((void **)&d_out2, (size_t)pr.q_dim * sizeof(float)));
    CUDA_OK(cudaMemcpy(d_w, packed, l.bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_xq, xq, (size_t)l.k_padded, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_scale, &scale, sizeof scale, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_sum, &sum, sizeof sum, cudaMemcpyHostToDevice));
    /* The raw row as the backend's GEMV makes it: the reference's input. */
    bn_w2a8_cuda_args g;
    memset(&g, 0, sizeof g);
    g.weights = d_w;
    g.n = l.n;
    g.tiles = l.tiles;
    g.groups = l.groups;
    g.weight_scale = 1.0f;
    g.x = d_xq;
    g.m = 1;
    g.ldx = l.k_padded;
    g.act_scale = d_scale;
    g.act_sum = d_sum;
    g.y = pr.d_raw;
    g.ldy = l.n;
    CUDA_OK(bn_w2a8_cuda_gemv(&g, bn_w2a8_cuda_gemv_split(l.tiles, l.groups, 132), 0));
    CUDA_OK(cudaMemcpy(pr.raw, pr.d_raw, (size_t)pr.row * sizeof(float), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < pr.kv_dim; i++)
        pr.vmax = fmaxf(pr.vmax, fabsf(pr.raw[pr.q_dim + pr.kv_dim + i] * pr.sv));
    const int positions[] = {0, 33, 100, (int)s->capacity - 1};
    int failed = 0, runs = 0, prepared = 0;
    for (int c = 2; c <= max_cluster; c *= 2) {
        const cudaError_t prep = bn_cb_attn_decode_qkv_prepare(&as, c, k);
        if (prep != cudaSuccess) {
            CHECK_MSG(prep == cudaErrorNotSupported, "qkv prepare, cluster %d: %s", c,
                      cudaGetErrorString(prep));
            continue;
        }
        prepared++;
        for (size_t i = 0; i < sizeof positions / sizeof positions[0]; i++) {
            const int p = positions[i];
            reset_cache(&pr, p);
            reference(&pr, p);
            /* The kernel fed the GEMV's raw row, for the bit-for-bit check. */
            bn_cb_attn_decode_args a = decode_args(&pr, 0, c);
            reset_cache(&pr, p);
            CUDA_OK(bn_cb_attn_decode(&as, &a, 0, 0));
            CUDA_OK(cudaMemcpy(d_out2, pr.d_out, (size_t)pr.q_dim * sizeof(float),
                               cudaMemcpyDeviceToDevice));
            reset_cache(&pr, p);
            CUDA_OK(cudaMemset(pr.d_out, 0xff, (size_t)pr.q_dim * sizeof(float))); /* NaN */
            a.qkv = NULL;
            a.w_qkv = d_w;
            a.w_k = k;
            a.xq = d_xq;
            a.act_scale = d_scale;
            a.act_sum = d_sum;
            CUDA_OK(bn_cb_attn_decode(&as, &a, (int)(i % 2), 0));
            CUDA_OK(cudaDeviceSynchronize());
            char what[200];
            snprintf(what, sizeof what, "%d/%d heads x %d, k %lld, q|k|v inside, cluster %d, p %d",
                     s->n_heads, s->n_kv, s->hd, (long long)k, c, p);
            bool ok = verify(&pr, p, what);
            float *o1 = malloc((size_t)pr.q_dim * sizeof(float));
            float *o2 = malloc((size_t)pr.q_dim * sizeof(float));
            CUDA_OK(cudaMemcpy(o1, pr.d_out, (size_t)pr.q_dim * sizeof(float),
                               cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(o2, d_out2, (size_t)pr.q_dim * sizeof(float),
                               cudaMemcpyDeviceToHost));
            const bool same = memcmp(o1, o2, (size_t)pr.q_dim * sizeof(float)) == 0;
            CHECK_MSG(same, "%s: outputs differ from the kernel fed the GEMV's row", what);
            failed += !ok || !same;
            runs++;
            free(o1), free(o2);
        }
    }
    printf("%2d/%d heads x %3d, k %5lld, q|k|v inside: %d launches over %d cluster sizes: %s\n",
           s->n_heads, s->n_kv, s->hd, (long long)k, runs, prepared,
           failed ? "FAILED" : "as the reference, bit for bit as the GEMV-fed kernel");
    cudaFree(d_w), cudaFree(d_xq), cudaFree(d_scale), cudaFree(d_sum), cudaFree(d_out2);
    free(codes), free(packed), free(xq);
    problem_free(&pr);
}

/* Bad arguments are refused, not launched. */
static void check_errors(void)
{
    const shape s = {20, 5, 128, 128, 64};
    problem pr;
    problem_init(&pr, &s, 1.0f);
    const bn_cb_attn_shape as = {s.n_heads, s.n_kv, s.hd, s.capacity};
    bn_cb_attn_decode_args a = decode_args(&pr, 2, 3); /* not a power of two */
    CHECK(bn_cb_attn_decode(&as, &a, 0, 0) == cudaErrorInvalidValue);
    a = decode_args(&pr, 2, 32); /* above 16 */
    CHECK(bn_cb_attn_decode(&as, &a, 0, 0) == cudaErrorInvalidValue);
    a = decode_args(&pr, 0, 0); /* the ticket without ranges */
    CHECK(bn_cb_attn_decode(&as, &a, 0, 0) == cudaErrorInvalidValue);
    a = decode_args(&pr, 2, 0);
    a.counters = NULL;
    CHECK(bn_cb_attn_decode(&as, &a, 0, 0) == cudaErrorInvalidValue);
    const bn_cb_attn_shape odd = {20, 5, 130, 64}; /* head_dim not a multiple of 4 */
    a = decode_args(&pr, 2, 0);
    CHECK(bn_cb_attn_decode(&odd, &a, 0, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_attn_decode_cluster(&odd, 0) == 0);
    CHECK(bn_cb_attn_decode_cluster(NULL, 0) == 0);
    CHECK(cudaGetLastError() == cudaSuccess); /* nothing left behind */
    problem_free(&pr);
}

/* One launch at the 2B-4T shape, p = 639, per merge: information. */
static void time_2b4t(int max_cluster)
{
    const shape s = {20, 5, 128, 128, 4096};
    problem pr;
    problem_init(&pr, &s, 1.0f);
    merge m[16];
    const int nm = merges_for(&pr, max_cluster, m);
    const bn_cb_attn_shape as = {s.n_heads, s.n_kv, s.hd, s.capacity};
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int p = 127; p < 4096; p = p * 4 + 3) {
        reset_cache(&pr, p);
        printf("time: 20/5 x 128, p %4d:", p);
        for (int j = 0; j < nm; j++) {
            if (j == 1 || j == 2)
                continue;
            const bn_cb_attn_decode_args a = decode_args(&pr, m[j].splits, m[j].cluster);
            for (int w = 0; w < 20; w++)
                CUDA_OK(bn_cb_attn_decode(&as, &a, 0, 0));
            CUDA_OK(cudaEventRecord(e0, 0));
            for (int r = 0; r < 200; r++)
                CUDA_OK(bn_cb_attn_decode(&as, &a, 0, 0));
            CUDA_OK(cudaEventRecord(e1, 0));
            CUDA_OK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
            char name[64];
            merge_name(&m[j], name, sizeof name);
            printf(" | %s %.2f us", name, ms * 1000.0f / 200);
        }
        printf("\n");
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    problem_free(&pr);
}

/* bn_cb_qkv_post over m rows: its float4 kernel (rows aligned, ldraw a
 * multiple of 4) against its scalar one (the same rows ldraw + 1 apart),
 * bit for bit: q, and the k and v cache (fp32 and fp16) including
 * positions past the RoPE table (computed, not looked up) and outside the
 * cache (q only). */
static void check_qkv_post_rows(const shape *sh, int kv_f16)
{
    const int m = 37, hd = sh->hd;
    const int q_dim = sh->n_heads * hd, kv_dim = sh->n_kv * hd, width = q_dim + 2 * kv_dim;
    const int64_t cap = sh->capacity, table_len = cap / 2;
    const size_t elem = kv_f16 ? 2 : 4, cache_bytes = (size_t)cap * (size_t)kv_dim * elem;
    float *raw = malloc(sizeof(float) * (size_t)m * (size_t)(width + 1));
    int32_t pos[37];
    for (int i = 0; i < m * (width + 1); i++)
        raw[i] = test_rand_float(-2.0f, 2.0f);
    for (int t = 0; t < m; t++) /* distinct: in the table, past it, outside the cache */
        pos[t] = t == m - 1 ? -1 : t == m - 2 ? (int32_t)cap : (int32_t)((t * 7919) % cap);
    bn_rope_freqs freqs;
    memset(&freqs, 0, sizeof freqs);
    if (sh->rope_dim > 0)
        CUDA_OK(bn_rope_freqs_init(&freqs, 10000.0f, sh->rope_dim));
    float *d_raw4, *d_raw1, *d_table = NULL, *d_q[2];
    void *d_k[2], *d_v[2];
    int32_t *d_pos;
    CUDA_OK(cudaMalloc((void **)&d_raw4, sizeof(float) * (size_t)m * (size_t)width));
    CUDA_OK(cudaMalloc((void **)&d_raw1, sizeof(float) * (size_t)m * (size_t)(width + 1)));
    CUDA_OK(cudaMalloc((void **)&d_pos, sizeof pos));
    CUDA_OK(cudaMemcpy(d_pos, pos, sizeof pos, cudaMemcpyHostToDevice));
    if (sh->rope_dim > 0) {
        CUDA_OK(cudaMalloc((void **)&d_table, sizeof(float) * (size_t)table_len * sh->rope_dim));
        CUDA_OK(bn_cb_rope_table(&freqs, table_len, d_table, 0));
    }
    CUDA_OK(cudaMemcpy(d_raw1, raw, sizeof(float) * (size_t)m * (size_t)(width + 1),
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy2D(d_raw4, sizeof(float) * (size_t)width, raw,
                         sizeof(float) * (size_t)(width + 1), sizeof(float) * (size_t)width,
                         (size_t)m, cudaMemcpyHostToDevice));
    const bn_cb_qkv_shape qs = {sh->n_heads, sh->n_kv, hd, cap, 0.75f, 1.25f, 0.5f};
    for (int w = 0; w < 2; w++) {
        CUDA_OK(cudaMalloc((void **)&d_q[w], sizeof(float) * (size_t)m * (size_t)q_dim));
        CUDA_OK(cudaMalloc(&d_k[w], cache_bytes));
        CUDA_OK(cudaMalloc(&d_v[w], cache_bytes));
        CUDA_OK(cudaMemset(d_q[w], 0xff, sizeof(float) * (size_t)m * (size_t)q_dim));
        CUDA_OK(cudaMemset(d_k[w], 0x7f, cache_bytes));
        CUDA_OK(cudaMemset(d_v[w], 0x7f, cache_bytes));
        CUDA_OK(bn_cb_qkv_post(w ? d_raw1 : d_raw4, w ? width + 1 : width, m, &qs, &freqs,
                               d_table, d_table ? table_len : 0, d_pos, d_q[w], q_dim, d_k[w],
                               d_v[w], kv_f16, 0, 0));
    }
    CUDA_OK(cudaDeviceSynchronize());
    const size_t qb = sizeof(float) * (size_t)m * (size_t)q_dim;
    unsigned char *a = malloc(qb > cache_bytes ? qb : cache_bytes);
    unsigned char *b = malloc(qb > cache_bytes ? qb : cache_bytes);
    const void *bufs[3][2] = {{d_q[0], d_q[1]}, {d_k[0], d_k[1]}, {d_v[0], d_v[1]}};
    const size_t sizes[3] = {qb, cache_bytes, cache_bytes};
    static const char *const what[3] = {"q", "k cache", "v cache"};
    for (int i = 0; i < 3; i++) {
        CUDA_OK(cudaMemcpy(a, bufs[i][0], sizes[i], cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(b, bufs[i][1], sizes[i], cudaMemcpyDeviceToHost));
        CHECK_MSG(memcmp(a, b, sizes[i]) == 0,
                  "qkv_post %d/%d x %d rope %d %s: the float4 kernel's %s differs from the "
                  "scalar kernel's",
                  sh->n_heads, sh->n_kv, hd, sh->rope_dim, kv_f16 ? "f16" : "f32", what[i]);
    }
    printf("qkv_post %d/%d x %d, rope %d, %s cache, %d rows: float4 kernel = scalar kernel\n",
           sh->n_heads, sh->n_kv, hd, sh->rope_dim, kv_f16 ? "f16" : "f32", m);
    for (int w = 0; w < 2; w++) {
        cudaFree(d_q[w]);
        cudaFree(d_k[w]);
        cudaFree(d_v[w]);
    }
    cudaFree(d_raw4);
    cudaFree(d_raw1);
    cudaFree(d_table);
    cudaFree(d_pos);
    free(raw);
    free(a);
    free(b);
}

int main(void)
{
    test_require_cuda(0, "");
    const shape s2b = {20, 5, 128, 128, 700};
    const bn_cb_attn_shape as2b = {s2b.n_heads, s2b.n_kv, s2b.hd, s2b.capacity};
    const int max_cluster = bn_cb_attn_decode_cluster(&as2b, 0);
    CUDA_OK(cudaGetLastError());
    /* A cap gives the largest allowed size no larger than it. */
    for (int cap = 1; cap <= 20; cap++) {
        int want = max_cluster;
        while (want > cap)
            want /= 2;
        if (want < 2)
            want = 0;
        const int got = bn_cb_attn_decode_cluster(&as2b, cap);
        CHECK_MSG(got == want, "cluster size with cap %d: %d, expected %d", cap, got, want);
    }
    printf("cluster size for the 2B-4T heads: %d%s\n", max_cluster,
           max_cluster ? "" : " (no thread-block clusters: the ticket merge only)");
    const shape shapes[] = {
        {20, 5, 128, 128, 700}, /* 2B-4T heads: 4 per block */
        {8, 4, 128, 64, 300},   /* groups of 2, partial RoPE */
        {6, 6, 64, 0, 200},     /* no grouping, no RoPE */
        {8, 2, 256, 256, 130},  /* two chunks per lane, 2 heads per block */
        {3, 3, 256, 128, 90},   /* two chunks, one head per block */
        {4, 2, 36, 36, 70},     /* a partial lane; RoPE halves of 18 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const bn_cb_attn_shape as = {shapes[i].n_heads, shapes[i].n_kv, shapes[i].hd,
                                     shapes[i].capacity};
        const int mc = bn_cb_attn_decode_cluster(&as, 0);
        for (int qi = 0; qi < 2; qi++)
            check_shape(&shapes[i], qi ? 8.0f : 1.0f, mc);
    }
    check_graph(&s2b, max_cluster);
    for (int f16 = 0; f16 < 2; f16++) {
        check_qkv_post_rows(&s2b, f16);
        check_qkv_post_rows(&shapes[1], f16); /* partial RoPE */
        check_qkv_post_rows(&shapes[2], f16); /* none */
    }
    if (max_cluster > 0) {
        check_qkv_inside(&s2b, 2560, max_cluster); /* 2B-4T: whole chunk-groups */
        const shape s8 = {8, 4, 128, 64, 300};
        check_qkv_inside(&s8, 1000, max_cluster); /* a partial last chunk-group */
        const shape s6 = {6, 6, 64, 0, 200};
        check_qkv_inside(&s6, 512, max_cluster); /* one head a block, no RoPE */
    }
    check_errors();
    printf("worst |gpu - ref| / max|v|: %.2e\n", worst_rel);
    if (!getenv("BN_TEST_QUICK"))
        time_2b4t(max_cluster);
    TEST_EXIT();
}
