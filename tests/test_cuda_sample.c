/* GPU test: greedy, top-k and top-k / temperature / top-p / min-p sampling
 * on the device against (a) a CPU reference written here (full sort, the
 * same inverse-CDF walk) and (b) the CPU sampler itself (bn_sampler), fed
 * the same uniform numbers: the test reproduces the sampler's documented
 * generator (splitmix64-seeded xoshiro256**, u = top 53 bits * 2^-53) so
 * that both sides draw with the same u. Ragged vocabularies up to beyond
 * 2B-4T's 128256, ties, NaN, +-inf, -0; a poisoned token slot; graph
 * capture. Exits 77 without a usable GPU.
 *
 * Tolerance: greedy and top-k selection must match exactly. A draw must
 * match exactly unless it is ambiguous: the weights are exp rounded to
 * float on both sides, by different exp implementations (within about an
 * ulp of each other), so a draw whose target u * total lies within 1e-6
 * (relative) of a cumulative boundary - or whose top-p cut does - may
 * legitimately differ; such draws are counted and reported, not failed
 * (with random u they are a few in a million; the edge value u = 0.5 on
 * all-equal logits lands exactly on one and is counted too). */
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "sample_cuda.h"
#include "sampler.h"
#include "test_util.h"
#include "test_util_cuda.h"

/* ---- the CPU sampler's generator (sampler.c documents it) ------------------ */

typedef struct xoshiro {
    uint64_t s[4];
} xoshiro;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void xo_seed(xoshiro *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static double xo_uniform(xoshiro *r)
{
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(out >> 11) * 0x1.0p-53;
}

/* ---- reference ------------------------------------------------------------- */

typedef struct rcand {
    float logit, w;
    int32_t id;
} rcand;

static int better_first(const void *pa, const void *pb)
{
    const rcand *a = pa, *b = pb;
    if (a->logit != b->logit)
        return a->logit > b->logit ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* NaN -> -inf; +inf tokens -> 0 and everything else -inf when any exists. */
static float *clean(const float *logits, int32_t V)
{
    float *l = malloc(sizeof(float) * (size_t)V);
    int pinf = 0;
    for (int32_t i = 0; i < V; i++) {
        l[i] = isnan(logits[i]) ? -INFINITY : logits[i];
        pinf += l[i] == INFINITY;
    }
    if (pinf)
        for (int32_t i = 0; i < V; i++)
            l[i] = l[i] == INFINITY ? 0.0f : -INFINITY;
    return l;
}

static int32_t ref_argmax(const float *logits, int32_t V)
{
    /* Strict >: the lowest index wins a tie; nothing above -inf (every
     * logit NaN or -inf) leaves -1, no token. */
    float *l = clean(logits, V);
    int32_t best = -1;
    float best_logit = -INFINITY;
    for (int32_t i = 0; i < V; i++)
        if (l[i] > best_logit) {
            best = i;
            best_logit = l[i];
        }
    free(l);
    return best;
}

/* Every token above -inf, best first. */
static int32_t ref_sorted(const float *l, int32_t V, rcand *c)
{
    int32_t n = 0;
    for (int32_t i = 0; i < V; i++)
        if (l[i] > -INFINITY)
            c[n++] = (rcand){l[i], 0.0f, i};
    qsort(c, (size_t)n, sizeof *c, better_first);
    return n;
}

static bool near(double a, double b, double scale) { return fabs(a - b) <= 1e-6 * scale; }

/* The sampler's walk with a full sort; *ambiguous when a cut or the draw
 * lands within 1e-6 of a boundary. */
static int32_t ref_sample(const float *logits, int32_t V, const bn_cuda_sample_params *p,
                          double u, bool *ambiguous)
{
    *ambiguous = false;
    if (!(p->temperature > 0.0f))
        return ref_argmax(logits, V);
    float *l = clean(logits, V);
    rcand *c = malloc(sizeof(rcand) * (size_t)V);
    int32_t n;
    const bool sorted = p->top_k > 0 && p->top_k < V;
    if (sorted) {
        n = ref_sorted(l, V, c);
        n = n < p->top_k ? n : p->top_k;
    } else {
        n = 0;
        for (int32_t i = 0; i < V; i++)
            if (l[i] > -INFINITY)
                c[n++] = (rcand){l[i], 0.0f, i};
    }
    free(l);
    if (n == 0) {
        free(c);
        return -1; /* nothing above -inf: no token */
    }
    float max = c[0].logit;
    for (int32_t i = 1; i < n; i++)
        max = c[i].logit > max ? c[i].logit : max;
    double z = 0.0;
    for (int32_t i = 0; i < n; i++) {
        c[i].w = expf((c[i].logit - max) / p->temperature);
        z += c[i].w;
    }
    const float thr = p->min_p < 1.0f ? p->min_p : 1.0f;
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (c[i].w > 0.0f && near(c[i].w, thr, 1.0) && thr > 0.0f)
            *ambiguous = true;
        if (c[i].w > 0.0f && c[i].w >= thr)
            c[m++] = c[i];
    }
    n = m;
    if (p->top_p < 1.0f && n > 1) {
        if (!sorted)
            qsort(c, (size_t)n, sizeof *c, better_first);
        const double target = (double)p->top_p * z;
        double cum = 0.0;
        int32_t keep = 0;
        while (keep < n) {
            cum += c[keep++].w;
            if (near(cum, target, z))
                *ambiguous = true;
            if (cum >= target)
                break;
        }
        n = keep;
    }
    double total = 0.0;
    for (int32_t i = 0; i < n; i++)
        total += c[i].w;
    const double target = u * total;
    double cum = 0.0;
    int32_t tok = c[n - 1].id;
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].w;
        /* The last boundary is the total itself, the same sum on both
         * sides: u < 1 always falls before it, whatever exp returned. */
        if (i < n - 1 && near(cum, target, total))
            *ambiguous = true;
        if (target < cum) {
            tok = c[i].id;
            break;
        }
    }
    free(c);
    return tok;
}

/* ---- device helpers ---------------------------------------------------------- */

typedef struct dev {
    float *logits;
    double *u;
    void *ws;
    int32_t *token;
    int32_t *h_token; /* pinned */
    bn_cuda_sample_params *params; /* bn_cuda_sample_cand_dev's */
    int32_t *token_dev;            /* ... and its token */
    int32_t cap;
} dev;

static void dev_init(dev *d, int32_t cap)
{
    d->cap = cap;
    CUDA_OK(cudaMalloc((void **)&d->logits, sizeof(float) * (size_t)cap));
    CUDA_OK(cudaMalloc((void **)&d->u, sizeof(double)));
    CUDA_OK(cudaMalloc(&d->ws, bn_cuda_sample_workspace_bytes(cap)));
    CUDA_OK(cudaMemset(d->ws, 0, bn_cuda_sample_workspace_bytes(cap)));
    CUDA_OK(cudaMalloc((void **)&d->token, sizeof(int32_t)));
    CUDA_OK(cudaMallocHost((void **)&d->h_token, sizeof(int32_t)));
    CUDA_OK(cudaMalloc((void **)&d->params, sizeof *d->params));
    CUDA_OK(cudaMalloc((void **)&d->token_dev, sizeof(int32_t)));
}

static void dev_free(dev *d)
{
    cudaFree(d->logits);
    cudaFree(d->u);
    cudaFree(d->ws);
    cudaFree(d->token);
    cudaFreeHost(d->h_token);
    cudaFree(d->params);
    cudaFree(d->token_dev);
}

/* The sampler over the logits alone (no candidate list). */
static cudaError_t sample_logits(const float *logits, int32_t V, const bn_cuda_sample_params *p,
                                 const double *u, void *ws, int32_t *token, int32_t *h_token,
                                 cudaStream_t stream)
{
    return bn_cuda_sample_cand(logits, V, NULL, NULL, 0, NULL, p, u, ws, token, h_token, stream);
}

/* bn_cuda_sample_cand_dev over d->logits (and a list when given) with p
 * written to device memory: the token it leaves. */
static int32_t dev_sample_params(dev *d, int32_t V, const bn_cuda_sample_params *p,
                                 const uint64_t *list, const unsigned *n, int cap,
                                 const float *floor)
{
    CUDA_OK(cudaMemcpy(d->params, p, sizeof *p, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d->token_dev, 0xa5, sizeof(int32_t))); /* poison */
    CUDA_OK(bn_cuda_sample_cand_dev(d->logits, V, list, n, cap, floor, d->params, d->u, d->ws,
                                    d->token_dev, 0));
    int32_t tok;
    CUDA_OK(cudaMemcpy(&tok, d->token_dev, sizeof tok, cudaMemcpyDeviceToHost));
    return tok;
}

/* Runs the device sampler; returns the token, checking that the device
 * slot and the host copy agree. */
static int32_t dev_sample(dev *d, const float *logits, int32_t V, const bn_cuda_sample_params *p,
                          double u)
{
    CUDA_OK(cudaMemcpy(d->logits, logits, sizeof(float) * (size_t)V, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d->u, &u, sizeof u, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d->token, 0xa5, sizeof(int32_t))); /* poison */
    *d->h_token = -7;
    CUDA_OK(sample_logits(d->logits, V, p, d->u, d->ws, d->token, d->h_token, 0));
    CUDA_OK(cudaDeviceSynchronize());
    int32_t tok;
    CUDA_OK(cudaMemcpy(&tok, d->token, sizeof tok, cudaMemcpyDeviceToHost));
    CHECK_MSG(tok == *d->h_token, "device token %d, host copy %d", tok, *d->h_token);
    /* -1: no token (every logit NaN or -inf); the callers compare it with
     * the references, which say the same. */
    CHECK_MSG(tok >= -1 && tok < V, "token %d outside the vocabulary of %d", tok, V);
    /* The same draw with the parameters read on the device (greedy is not
     * its job: -1). */
    const int32_t from_dev = dev_sample_params(d, V, p, NULL, NULL, 0, NULL);
    const int32_t want = p->temperature > 0.0f ? tok : -1;
    CHECK_MSG(from_dev == want, "V=%d T=%g k=%d: parameters in device memory give %d, not %d", V,
              (double)p->temperature, p->top_k, from_dev, want);
    return tok;
}

/* ---- logits ------------------------------------------------------------------ */

static float rand_normal(void)
{
    const double u1 = ((double)(test_rand_u64() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (double)(test_rand_u64() >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Kinds: 0 normal, 1 normal with a few strong peaks, 2 heavy ties (small
 * integers), 3 all equal, 4 normal with NaN / -inf sprinkled, 5 with +inf. */
static void make_logits(float *l, int32_t V, int kind)
{
    const float sigma = test_rand_float(0.5f, 8.0f);
    for (int32_t i = 0; i < V; i++) {
        switch (kind) {
        case 2: l[i] = (float)test_rand_range(-3, 3); break;
        case 3: l[i] = 1.25f; break;
        default: l[i] = sigma * rand_normal(); break;
        }
    }
    if (kind == 1)
        for (int i = 0; i < 5; i++)
            l[test_rand_range(0, V - 1)] = 6.0f * sigma + test_rand_float(0.0f, 3.0f);
    if (kind == 4)
        for (int i = 0; i < 1 + V / 50; i++) {
            l[test_rand_range(0, V - 1)] = NAN;
            l[test_rand_range(0, V - 1)] = -INFINITY;
        }
    if (kind == 5) {
        const int n = (int)test_rand_range(1, 4);
        for (int i = 0; i < n; i++)
            l[test_rand_range(0, V - 1)] = INFINITY;
        l[test_rand_range(0, V - 1)] = NAN;
    }
}

/* ---- tests --------------------------------------------------------------------- */

static void check_greedy_one(dev *d, const float *l, int32_t V, const char *what)
{
    const bn_cuda_sample_params p = {0.0f, 0, 1.0f, 0.0f};
    const int32_t got = dev_sample(d, l, V, &p, 0.5);
    const int32_t want = ref_argmax(l, V);
    /* The CPU sampler itself, greedy. */
    bn_sampler_params sp;
    bn_sampler_params_default(&sp);
    bn_sampler *s = NULL;
    bn_error err;
    CHECK(bn_sampler_create(&sp, V, &s, &err) == BN_OK);
    float *copy = malloc(sizeof(float) * (size_t)V);
    memcpy(copy, l, sizeof(float) * (size_t)V);
    const int32_t cpu = s ? bn_sampler_sample(s, copy, NULL, 0) : -1;
    bn_sampler_free(s);
    free(copy);
    CHECK_MSG(got == want && got == cpu, "greedy %s V=%d: device %d, reference %d, sampler %d",
              what, V, got, want, cpu);
}

/* Every logit NaN or -inf: the device's draws say no token (-1), as the
 * CPU sampler does, for a top-k set (draw_sorted) and, for a vocabulary
 * small enough, with top-k off (the index-order walk). */
static void check_draw_none(dev *d, const float *l, int32_t V, const char *what)
{
    float *copy = malloc(sizeof(float) * (size_t)V);
    for (int off = 0; off < 2; off++) {
        if (off && V > BN_CUDA_SAMPLE_MAX_K)
            break;
        const bn_cuda_sample_params p = {0.8f, off ? 0 : 40, 0.95f, 0.05f};
        bn_sampler_params sp;
        bn_sampler_params_default(&sp);
        sp.temperature = p.temperature;
        sp.top_k = p.top_k;
        sp.top_p = p.top_p;
        sp.min_p = p.min_p;
        bn_sampler *s = NULL;
        bn_error err;
        CHECK(bn_sampler_create(&sp, V, &s, &err) == BN_OK);
        memcpy(copy, l, sizeof(float) * (size_t)V);
        const int32_t cpu = s ? bn_sampler_sample(s, copy, NULL, 0) : -2;
        bn_sampler_free(s);
        const int32_t got = dev_sample(d, l, V, &p, 0.5);
        CHECK_MSG(got == -1 && cpu == BN_SAMPLER_NO_TOKEN,
                  "draw %s V=%d top-k %d: device %d, sampler %d (no token expected)", what, V,
                  p.top_k, got, cpu);
    }
    free(copy);
}

static void check_greedy(dev *d, int32_t V)
{
    float *l = malloc(sizeof(float) * (size_t)V);
    for (int kind = 0; kind < 6; kind++) {
        make_logits(l, V, kind);
        check_greedy_one(d, l, V, "random");
    }
    /* Ties at the maximum: the lowest index wins, wherever the copies are. */
    make_logits(l, V, 0);
    const int32_t a = (int32_t)test_rand_range(0, V - 1), b = (int32_t)test_rand_range(0, V - 1);
    l[a] = l[b] = 100.0f;
    check_greedy_one(d, l, V, "tie");
    /* NaN is never chosen, even where the maximum would be. */
    l[a < b ? a : b] = NAN;
    check_greedy_one(d, l, V, "NaN at max");
    /* All -inf / NaN: no token (-1). */
    for (int32_t i = 0; i < V; i++)
        l[i] = (i & 1) ? NAN : -INFINITY;
    check_greedy_one(d, l, V, "all masked");
    check_draw_none(d, l, V, "all masked");
    for (int32_t i = 0; i < V; i++)
        l[i] = NAN;
    check_greedy_one(d, l, V, "all NaN");
    check_draw_none(d, l, V, "all NaN");
    /* -0 and +0 compare equal: the lower index wins, whichever sign. */
    for (int32_t i = 0; i < V; i++)
        l[i] = -1.0f - (float)(i % 7);
    l[b] = -0.0f;
    l[a] = 0.0f;
    check_greedy_one(d, l, V, "signed zeros");
    free(l);
}

/* The top-k selection, rank by rank: at a temperature so high that every
 * kept weight rounds to exactly 1, the draw with u = (i + 0.5) / m over
 * the m kept tokens is the i-th best of them (best first: higher logit,
 * then lower index; NaN never; the +inf tokens alone when there are any),
 * so the launches the backend makes show the whole order, exactly. */
static void check_top_k(dev *d, int32_t V)
{
    if (V < 2)
        return; /* a top-k set needs k < V */
    float *l = malloc(sizeof(float) * (size_t)V);
    rcand *c = malloc(sizeof(rcand) * (size_t)V);
    for (int kind = 0; kind < 6; kind++) {
        make_logits(l, V, kind);
        const int max_k = V - 1 < BN_CUDA_SAMPLE_MAX_K ? (int)V - 1 : BN_CUDA_SAMPLE_MAX_K;
        const int k = (int)test_rand_range(1, max_k);
        const bn_cuda_sample_params p = {1e30f, k, 1.0f, 0.0f};
        CUDA_OK(cudaMemcpy(d->logits, l, sizeof(float) * (size_t)V, cudaMemcpyHostToDevice));
        float *cl = clean(l, V);
        const int32_t n = ref_sorted(cl, V, c);
        free(cl);
        const int m = n < k ? (int)n : k;
        int bad = 0, first_bad = -1;
        int32_t got_bad = 0;
        for (int i = 0; i < (m > 0 ? m : 1); i++) {
            const double u = m > 0 ? (i + 0.5) / m : 0.5;
            CUDA_OK(cudaMemcpy(d->u, &u, sizeof u, cudaMemcpyHostToDevice));
            CUDA_OK(sample_logits(d->logits, V, &p, d->u, d->ws, d->token, d->h_token, 0));
            CUDA_OK(cudaDeviceSynchronize());
            const int32_t want = m > 0 ? c[i].id : -1;
            if (*d->h_token != want && bad++ == 0) {
                first_bad = i;
                got_bad = *d->h_token;
            }
        }
        CHECK_MSG(bad == 0,
                  "top_k V=%d k=%d kind %d: %d of %d ranks differ (first: rank %d gave %d, not "
                  "%d)",
                  V, k, kind, bad, m, first_bad, got_bad,
                  first_bad >= 0 && m > 0 ? c[first_bad].id : -1);
    }
    free(l);
    free(c);
}

static int ambiguous_draws, total_draws;

static void check_draws(dev *d, int32_t V, int cases)
{
    float *l = malloc(sizeof(float) * (size_t)V), *copy = malloc(sizeof(float) * (size_t)V);
    for (int cs = 0; cs < cases; cs++) {
        const int kind = (int)test_rand_range(0, 5);
        make_logits(l, V, kind);
        bn_cuda_sample_params p;
        p.temperature = test_rand_float(0.05f, 2.5f);
        p.top_k = (int)test_rand_range(1, BN_CUDA_SAMPLE_MAX_K);
        if (V <= BN_CUDA_SAMPLE_MAX_K && test_rand_range(0, 1))
            p.top_k = 0; /* off: the index-order walk */
        p.top_p = test_rand_range(0, 2) ? test_rand_float(0.05f, 0.999f) : 1.0f;
        p.min_p = test_rand_range(0, 2) ? 0.0f : test_rand_float(0.0f, 0.4f);

        bn_sampler_params sp;
        bn_sampler_params_default(&sp);
        sp.temperature = p.temperature;
        sp.top_k = p.top_k;
        sp.top_p = p.top_p;
        sp.min_p = p.min_p;
        sp.seed = test_rand_u64();
        bn_sampler *s = NULL;
        bn_error err;
        CHECK(bn_sampler_create(&sp, V, &s, &err) == BN_OK);
        xoshiro rng;
        xo_seed(&rng, sp.seed);
        for (int draw = 0; draw < 8; draw++) {
            const double u = xo_uniform(&rng); /* the sampler's next u */
            bool amb;
            const int32_t want = ref_sample(l, V, &p, u, &amb);
            const int32_t got = dev_sample(d, l, V, &p, u);
            memcpy(copy, l, sizeof(float) * (size_t)V);
            const int32_t cpu = s ? bn_sampler_sample(s, copy, NULL, 0) : -1;
            total_draws++;
            if (amb) {
                ambiguous_draws++;
                continue;
            }
            CHECK_MSG(got == want && got == cpu,
                      "draw V=%d kind %d T=%g k=%d top_p=%g min_p=%g u=%.17g: device %d, "
                      "reference %d, sampler %d",
                      V, kind, (double)p.temperature, p.top_k, (double)p.top_p,
                      (double)p.min_p, u, got, want, cpu);
        }
        bn_sampler_free(s);
        /* The extremes of u against the reference. */
        const double edges[] = {0.0, 1.0 - 0x1.0p-53, 0.5};
        for (int e = 0; e < 3; e++) {
            bool amb;
            const int32_t want = ref_sample(l, V, &p, edges[e], &amb);
            const int32_t got = dev_sample(d, l, V, &p, edges[e]);
            total_draws++;
            if (amb) {
                ambiguous_draws++;
                continue;
            }
            CHECK_MSG(got == want, "draw V=%d u=%.17g: device %d, reference %d", V, edges[e],
                      got, want);
        }
    }
    free(l);
    free(copy);
}

/* ---- candidate lists (bn_cuda_sample_cand) --------------------------------------- */

/* sample_key.cuh's key on the host: ordered(logit) << 32 | (0xffffffff - id). */
static uint64_t host_key(float logit, int32_t id)
{
    if (logit != logit)
        logit = -INFINITY;
    if (logit == 0.0f)
        logit = 0.0f;
    uint32_t b;
    memcpy(&b, &logit, sizeof b);
    const uint32_t o = (b & 0x80000000u) ? ~b : b | 0x80000000u;
    return (uint64_t)o << 32 | (0xffffffffu - (uint32_t)id);
}

static int key_desc(const void *pa, const void *pb)
{
    const uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return a > b ? -1 : a < b;
}

/* A list of the n best keys (in shuffled order) holds every token of the
 * top k, so the draw over it is the draw over the logits: with no floor,
 * with the k-th best logit as floor, a lower one, -inf and NaN (no floor),
 * and with a cap below n (the list taken to have overflowed: the logits
 * are read instead). n from k to BN_CUDA_SAMPLE_MAX_CAND covers the
 * one-key-a-thread ranking and the bitonic one. */
static void check_lists(dev *d, int32_t V)
{
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)V);
    float *l = malloc(sizeof(float) * (size_t)V);
    uint64_t *d_list;
    unsigned *d_n;
    float *d_floor;
    int32_t *d_tok;
    CUDA_OK(cudaMalloc((void **)&d_list, BN_CUDA_SAMPLE_MAX_CAND * sizeof(uint64_t)));
    CUDA_OK(cudaMalloc((void **)&d_n, sizeof(unsigned)));
    CUDA_OK(cudaMalloc((void **)&d_floor, sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_tok, 7 * sizeof(int32_t)));
    const int sizes[] = {0, 63, 64, 65, 200, 512, 513, 2000, BN_CUDA_SAMPLE_MAX_CAND};
    int compared = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int kind = (int)test_rand_range(0, 5);
        make_logits(l, V, kind);
        bn_cuda_sample_params p = {test_rand_float(0.3f, 1.5f),
                                   (int)test_rand_range(1, BN_CUDA_SAMPLE_MAX_K), 0.95f, 0.05f};
        if (p.top_k >= V)
            p.top_k = V - 1 > 0 ? V - 1 : 1;
        int n = sizes[si] < p.top_k ? p.top_k : sizes[si];
        if (n > V)
            n = V;
        for (int32_t i = 0; i < V; i++)
            keys[i] = host_key(l[i], i);
        qsort(keys, (size_t)V, sizeof *keys, key_desc);
        /* The k-th best logit, -inf when it is not a real one. */
        const uint64_t kth = keys[p.top_k - 1];
        uint32_t o = (uint32_t)(kth >> 32);
        const uint32_t bits = (o & 0x80000000u) ? o & 0x7fffffffu : ~o;
        float kth_logit;
        memcpy(&kth_logit, &bits, sizeof kth_logit);
        for (int i = n - 1; i > 0; i--) { /* shuffle the n best */
            const int j = (int)test_rand_range(0, i);
            const uint64_t t = keys[i];
            keys[i] = keys[j];
            keys[j] = t;
        }
        const unsigned un = (unsigned)n;
        CUDA_OK(cudaMemcpy(d_list, keys, (size_t)n * sizeof(uint64_t), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_n, &un, sizeof un, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d->logits, l, sizeof(float) * (size_t)V, cudaMemcpyHostToDevice));
        const double u = test_rand_float(0.0f, 0.999f);
        CUDA_OK(cudaMemcpy(d->u, &u, sizeof u, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(d_tok, 0xa5, 7 * sizeof(int32_t))); /* poison */
        CUDA_OK(sample_logits(d->logits, V, &p, d->u, d->ws, d_tok, NULL, 0));
        const float floors[4] = {kth_logit, kth_logit - 1.0f, -INFINITY, NAN};
        CUDA_OK(bn_cuda_sample_cand(d->logits, V, d_list, d_n, BN_CUDA_SAMPLE_MAX_CAND, NULL, &p,
                                    d->u, d->ws, d_tok + 1, NULL, 0));
        for (int f = 0; f < 4; f++) {
            CUDA_OK(cudaMemcpy(d_floor, &floors[f], sizeof(float), cudaMemcpyHostToDevice));
            CUDA_OK(bn_cuda_sample_cand(d->logits, V, d_list, d_n, BN_CUDA_SAMPLE_MAX_CAND,
                                        d_floor, &p, d->u, d->ws, d_tok + 2 + f, NULL, 0));
        }
        CUDA_OK(bn_cuda_sample_cand(d->logits, V, d_list, d_n, n - 1, d_floor, &p, d->u, d->ws,
                                    d_tok + 6, NULL, 0)); /* overflowed */
        int32_t tok[8];
        CUDA_OK(cudaMemcpy(tok, d_tok, 7 * sizeof(int32_t), cudaMemcpyDeviceToHost));
        /* The list and the k-th best as floor, the parameters on the device. */
        CUDA_OK(cudaMemcpy(d_floor, &floors[0], sizeof(float), cudaMemcpyHostToDevice));
        tok[7] = dev_sample_params(d, V, &p, d_list, d_n, BN_CUDA_SAMPLE_MAX_CAND, d_floor);
        for (int i = 1; i < 8; i++) {
            compared++;
            CHECK_MSG(tok[i] == tok[0],
                      "list V=%d n=%d kind %d k=%d u=%.9g, variant %d: token %d, over the "
                      "logits %d",
                      V, n, kind, p.top_k, u, i, tok[i], tok[0]);
        }
    }
    CHECK(compared > 0);
    cudaFree(d_list);
    cudaFree(d_n);
    cudaFree(d_floor);
    cudaFree(d_tok);
    free(keys);
    free(l);
}

/* A draw whose token goes straight to mapped pinned memory, where the host
 * reads it once the stream is past the kernel. */
static void check_pinned_draw(dev *d)
{
    int32_t *pinned, *pinned_dev;
    CUDA_OK(cudaHostAlloc((void **)&pinned, sizeof(int32_t), cudaHostAllocMapped));
    CUDA_OK(cudaHostGetDevicePointer((void **)&pinned_dev, pinned, 0));
    const int32_t V = 5000;
    float *l = malloc(sizeof(float) * (size_t)V);
    make_logits(l, V, 0);
    const bn_cuda_sample_params p = {0.9f, 20, 0.9f, 0.0f};
    const int32_t want = dev_sample(d, l, V, &p, 0.375); /* leaves l and u on the device */
    memset(pinned, 0xa5, sizeof(uint32_t));
    CUDA_OK(sample_logits(d->logits, V, &p, d->u, d->ws, (int32_t *)pinned_dev, NULL, 0));
    CUDA_OK(cudaDeviceSynchronize());
    CHECK_MSG(*(volatile int32_t *)pinned == want, "token stored in pinned memory %d, not %d",
              *(volatile int32_t *)pinned, want);
    free(l);
    cudaFreeHost(pinned);
}

static void check_invalid(dev *d)
{
    const int32_t V = 1000;
    bn_cuda_sample_params p = {1.0f, 0, 1.0f, 0.0f};
    CHECK(sample_logits(d->logits, V, &p, d->u, d->ws, d->token, NULL, 0) ==
          cudaErrorInvalidValue); /* top-k off over 64 tokens */
    p.top_k = BN_CUDA_SAMPLE_MAX_K + 1;
    CHECK(sample_logits(d->logits, V, &p, d->u, d->ws, d->token, NULL, 0) ==
          cudaErrorInvalidValue);
    p.top_k = 10;
    p.temperature = NAN;
    CHECK(sample_logits(d->logits, V, &p, d->u, d->ws, d->token, NULL, 0) ==
          cudaErrorInvalidValue);
    /* Parameters in device memory: what the host launcher refuses, and
     * greedy, draw -1; no parameters at all is refused at the launch. */
    const bn_cuda_sample_params refused[] = {{1.0f, 0, 1.0f, 0.0f},
                                             {1.0f, BN_CUDA_SAMPLE_MAX_K + 1, 1.0f, 0.0f},
                                             {NAN, 10, 1.0f, 0.0f},
                                             {INFINITY, 10, 1.0f, 0.0f},
                                             {1.0f, 10, NAN, 0.0f},
                                             {1.0f, 10, 1.0f, NAN},
                                             {0.0f, 10, 1.0f, 0.0f},
                                             {-1.0f, 10, 1.0f, 0.0f}};
    float *l = malloc(sizeof(float) * (size_t)V);
    make_logits(l, V, 0);
    CUDA_OK(cudaMemcpy(d->logits, l, sizeof(float) * (size_t)V, cudaMemcpyHostToDevice));
    free(l);
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const int32_t tok = dev_sample_params(d, V, &refused[i], NULL, NULL, 0, NULL);
        CHECK_MSG(tok == -1, "device parameters %zu (T %g, k %d): token %d, not -1", i,
                  (double)refused[i].temperature, refused[i].top_k, tok);
    }
    CHECK(bn_cuda_sample_cand_dev(d->logits, V, NULL, NULL, 0, NULL, NULL, d->u, d->ws,
                                  d->token_dev, 0) == cudaErrorInvalidValue);
    CHECK(bn_cuda_sample_workspace_bytes(0) == 0);
    CHECK(bn_cuda_sample_workspace_bytes(128256) > 0);
}

/* Capture once, replay with new logits and u: the graph reads both from
 * device memory and leaves the token in d->token and pinned h_token. */
static void check_graph(dev *d, int32_t V)
{
    const bn_cuda_sample_params p = {0.8f, 40, 0.95f, 0.05f};
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(sample_logits(d->logits, V, &p, d->u, d->ws, d->token, d->h_token, st));
    CUDA_OK(cudaStreamEndCapture(st, &g));
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    float *l = malloc(sizeof(float) * (size_t)V);
    int bad = 0, amb_n = 0;
    for (int i = 0; i < 20; i++) {
        make_logits(l, V, (int)test_rand_range(0, 2));
        const double u = (double)(test_rand_u64() >> 11) * 0x1.0p-53;
        CUDA_OK(cudaMemcpyAsync(d->logits, l, sizeof(float) * (size_t)V, cudaMemcpyHostToDevice,
                                st));
        CUDA_OK(cudaMemcpyAsync(d->u, &u, sizeof u, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaGraphLaunch(exec, st));
        CUDA_OK(cudaStreamSynchronize(st));
        bool amb;
        const int32_t want = ref_sample(l, V, &p, u, &amb);
        amb_n += amb;
        bad += !amb && *d->h_token != want;
    }
    CHECK_MSG(bad == 0, "graph replays: %d of 20 tokens differ (%d ambiguous)", bad, amb_n);
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(g));

    /* One capture of the launch that reads its parameters from device
     * memory serves requests that differ at every replay. */
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(bn_cuda_sample_cand_dev(d->logits, V, NULL, NULL, 0, NULL, d->params, d->u, d->ws,
                                    d->token_dev, st));
    CUDA_OK(cudaStreamEndCapture(st, &g));
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    bad = amb_n = 0;
    for (int i = 0; i < 20; i++) {
        make_logits(l, V, (int)test_rand_range(0, 2));
        const double u = (double)(test_rand_u64() >> 11) * 0x1.0p-53;
        const bn_cuda_sample_params q = {test_rand_float(0.2f, 2.0f),
                                         (int)test_rand_range(1, BN_CUDA_SAMPLE_MAX_K),
                                         test_rand_range(0, 1) ? 0.9f : 1.0f,
                                         test_rand_range(0, 1) ? 0.05f : 0.0f};
        CUDA_OK(cudaMemcpyAsync(d->logits, l, sizeof(float) * (size_t)V, cudaMemcpyHostToDevice,
                                st));
        CUDA_OK(cudaMemcpyAsync(d->u, &u, sizeof u, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemcpyAsync(d->params, &q, sizeof q, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaGraphLaunch(exec, st));
        int32_t tok;
        CUDA_OK(cudaMemcpyAsync(&tok, d->token_dev, sizeof tok, cudaMemcpyDeviceToHost, st));
        CUDA_OK(cudaStreamSynchronize(st));
        bool amb;
        const int32_t want = ref_sample(l, V, &q, u, &amb);
        amb_n += amb;
        bad += !amb && tok != want;
    }
    CHECK_MSG(bad == 0, "graph replays, parameters on the device: %d of 20 tokens differ (%d "
                        "ambiguous)",
              bad, amb_n);
    free(l);
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaStreamDestroy(st));
}

static void time_sampling(dev *d, int32_t V)
{
    float *l = malloc(sizeof(float) * (size_t)V);
    make_logits(l, V, 0);
    CUDA_OK(cudaMemcpy(d->logits, l, sizeof(float) * (size_t)V, cudaMemcpyHostToDevice));
    const double u = 0.3;
    CUDA_OK(cudaMemcpy(d->u, &u, sizeof u, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    const bn_cuda_sample_params ps[2] = {{0.0f, 0, 1.0f, 0.0f}, {0.8f, 64, 0.95f, 0.05f}};
    for (int i = 0; i < 2; i++) {
        for (int r = 0; r < 10; r++)
            CUDA_OK(sample_logits(d->logits, V, &ps[i], d->u, d->ws, d->token, NULL, 0));
        CUDA_OK(cudaEventRecord(e0, 0));
        for (int r = 0; r < 200; r++)
            CUDA_OK(sample_logits(d->logits, V, &ps[i], d->u, d->ws, d->token, NULL, 0));
        CUDA_OK(cudaEventRecord(e1, 0));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        printf("time: %s over %d logits: %.2f us per token\n",
               i ? "top-k 64 / top-p sampling" : "greedy", V, ms * 1000.0f / 200);
    }
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    free(l);
}

/* The test's units of work, numbered in order: with BN_TEST_PART=i/n (the
 * racecheck runs split the test over processes) this process runs units
 * i, i + n, ... Each unit draws from a random stream of its own (the run's
 * seed and the unit's number), so a unit checks the same problems whichever
 * part runs it, and the parts together check what one run does. */
/* Many rows in one launch (bn_cuda_sample_rows): each row, with its own
 * parameters and number (greedy, sampled, refused), gives the token the
 * one-row launcher gives on that row alone; rows of ld >= V floats (ld a
 * multiple of 4: every row on 16 bytes, the argmax's four-wide loads; else
 * most rows off them); run twice on the same workspace (its tickets go
 * back to 0); poisoned token slots. */
static void check_rows(dev *d, int32_t V, int64_t ld, int n_rows)
{
    float *l = malloc(sizeof(float) * (size_t)(ld * n_rows));
    bn_cuda_sample_params *p = malloc(sizeof *p * (size_t)n_rows);
    double *u = malloc(sizeof *u * (size_t)n_rows);
    int32_t *got = malloc(sizeof *got * (size_t)n_rows);
    CHECK(l && p && u && got);
    bool any_sampled = false;
    for (int r = 0; r < n_rows; r++) {
        make_logits(l + r * ld, V, r % 6);
        const int kind = (int)test_rand_range(0, 3);
        const int k = V <= 64 ? (int)test_rand_range(0, 2) * V : (int)test_rand_range(1, 64);
        p[r] = (bn_cuda_sample_params){kind == 0 ? 0.0f : test_rand_float(0.3f, 2.0f), k,
                                       kind == 2 ? test_rand_float(0.5f, 1.0f) : 1.0f,
                                       kind == 3 ? 0.05f : 0.0f};
        if (r == 3)
            p[r].temperature = NAN; /* refused: -1 */
        u[r] = (double)(test_rand_u64() >> 11) * 0x1.0p-53;
        any_sampled |= p[r].temperature > 0.0f;
    }
    float *dl = NULL;
    bn_cuda_sample_params *dp = NULL;
    double *du = NULL;
    int32_t *dt = NULL;
    void *ws = NULL;
    const size_t ws_bytes = bn_cuda_sample_workspace_bytes(V) * (size_t)n_rows;
    CUDA_OK(cudaMalloc((void **)&dl, sizeof(float) * (size_t)(ld * n_rows)));
    CUDA_OK(cudaMalloc((void **)&dp, sizeof *dp * (size_t)n_rows));
    CUDA_OK(cudaMalloc((void **)&du, sizeof *du * (size_t)n_rows));
    CUDA_OK(cudaMalloc((void **)&dt, sizeof *dt * (size_t)n_rows));
    CUDA_OK(cudaMalloc(&ws, ws_bytes));
    CUDA_OK(cudaMemset(ws, 0, ws_bytes));
    CUDA_OK(cudaMemcpy(dl, l, sizeof(float) * (size_t)(ld * n_rows), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dp, p, sizeof *dp * (size_t)n_rows, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(du, u, sizeof *du * (size_t)n_rows, cudaMemcpyHostToDevice));
    for (int pass = 0; pass < 2; pass++) {
        CUDA_OK(cudaMemset(dt, 0xa5, sizeof *dt * (size_t)n_rows)); /* poison */
        CUDA_OK(bn_cuda_sample_rows(dl, ld, V, n_rows, dp, du, ws, any_sampled, dt, 0));
        CUDA_OK(cudaMemcpy(got, dt, sizeof *got * (size_t)n_rows, cudaMemcpyDeviceToHost));
        for (int r = 0; r < n_rows; r++) {
            int32_t want = -1;
            if (!isnan(p[r].temperature)) {
                CUDA_OK(cudaMemcpy(d->logits, l + r * ld, sizeof(float) * (size_t)V,
                                   cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d->u, &u[r], sizeof u[r], cudaMemcpyHostToDevice));
                CUDA_OK(sample_logits(d->logits, V, &p[r], d->u, d->ws, d->token, NULL, 0));
                CUDA_OK(cudaMemcpy(&want, d->token, sizeof want, cudaMemcpyDeviceToHost));
            }
            CHECK_MSG(got[r] == want,
                      "V=%d rows=%d pass %d: row %d (T=%g k=%d) gives %d, the one-row "
                      "launcher %d",
                      V, n_rows, pass, r, (double)p[r].temperature, p[r].top_k, got[r], want);
            if (p[r].temperature == 0.0f)
                CHECK(got[r] == ref_argmax(l + r * ld, V));
        }
    }
    /* Only greedy rows: the argmax kernel alone. */
    for (int r = 0; r < n_rows; r++)
        p[r].temperature = 0.0f;
    CUDA_OK(cudaMemcpy(dp, p, sizeof *dp * (size_t)n_rows, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dt, 0xa5, sizeof *dt * (size_t)n_rows));
    CUDA_OK(bn_cuda_sample_rows(dl, ld, V, n_rows, dp, du, ws, 0, dt, 0));
    CUDA_OK(cudaMemcpy(got, dt, sizeof *got * (size_t)n_rows, cudaMemcpyDeviceToHost));
    for (int r = 0; r < n_rows; r++)
        CHECK_MSG(got[r] == ref_argmax(l + r * ld, V), "V=%d greedy row %d: %d", V, r, got[r]);
    CHECK(bn_cuda_sample_rows(dl, V - 1, V, n_rows, dp, du, ws, 0, dt, 0) ==
          cudaErrorInvalidValue);
    cudaFree(dl);
    cudaFree(dp);
    cudaFree(du);
    cudaFree(dt);
    cudaFree(ws);
    free(l);
    free(p);
    free(u);
    free(got);
}

static uint64_t run_seed;
static int next_unit;
static bool unit_runs(void)
{
    const int k = next_unit++;
    if (!test_in_part(k))
        return false;
    test_rng_state = run_seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(k + 1));
    return true;
}

int main(void)
{
    test_require_cuda(0, "sampling");
    run_seed = test_rng_state; /* test_require_cuda seeded it */
    const bool quick = getenv("BN_TEST_QUICK") != NULL;

    const int32_t big = 300000; /* beyond 2B-4T's vocabulary: larger pass-1 slices */
    dev d;
    dev_init(&d, big);
    if (unit_runs()) {
        check_invalid(&d);
        check_pinned_draw(&d);
    }

    const int32_t vocabs[] = {1, 2, 5, 63, 64, 65, 1000, 2048, 2049, 4097, 50000, 128256, 151936,
                              big};
    /* Quick (compute-sanitizer) runs stop at 2B-4T's vocabulary. */
    const size_t n_vocabs = quick ? 12 : sizeof vocabs / sizeof vocabs[0];
    for (size_t i = 0; i < n_vocabs; i++) {
        if (!unit_runs())
            continue;
        check_greedy(&d, vocabs[i]);
        check_top_k(&d, vocabs[i]);
        check_draws(&d, vocabs[i], quick ? 4 : 25);
    }
    for (int i = 0; i < (quick ? 2 : 30); i++) {
        if (!unit_runs())
            continue;
        const int32_t V = (int32_t)test_rand_range(1, 200000);
        check_greedy(&d, V);
        check_top_k(&d, V);
        check_draws(&d, V, 3);
    }
    const int32_t list_vocabs[] = {1, 64, 1000, 128256};
    for (size_t i = 0; i < sizeof list_vocabs / sizeof list_vocabs[0]; i++)
        if (unit_runs())
            check_lists(&d, list_vocabs[i]);
    if (unit_runs())
        check_graph(&d, 128256);
    const int32_t row_vocabs[] = {5, 64, 1000, 128256};
    for (size_t i = 0; i < sizeof row_vocabs / sizeof row_vocabs[0]; i++)
        if (unit_runs())
            for (int aligned = 0; aligned < 2; aligned++)
                check_rows(&d, row_vocabs[i],
                           aligned ? (row_vocabs[i] + 3) / 4 * 4 : row_vocabs[i] + 7,
                           quick ? 5 : 37);
    printf("draws: %d, ambiguous (not compared): %d\n", total_draws, ambiguous_draws);
    /* Mostly exact ties (all-equal logits with u = 0.5 hit a boundary
     * exactly, and both sides then agree anyway); random u almost never. */
    CHECK_MSG(ambiguous_draws * 20 <= total_draws, "too many ambiguous draws: %d of %d",
              ambiguous_draws, total_draws);
    if (!quick && unit_runs())
        time_sampling(&d, 128256);
    dev_free(&d);
    TEST_EXIT();
}
