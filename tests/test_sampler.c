/* The sampler (src/model/sampler.c) against its definition:
 *  - parameter validation and the defaults;
 *  - greedy: argmax, lowest index on ties; top-k = 1 is greedy at any
 *    temperature;
 *  - reproducibility: same seed, same tokens (two samplers, after reset),
 *    and a golden sequence computed outside C by a transcription of
 *    splitmix64 + xoshiro256** that reproduces the published vectors
 *    (splitmix64 from 0 gives 0xe220a8397b1dcdaf; xoshiro256** from the
 *    state {1, 2, 3, 4} gives 11520, 0, 1509978240, ...);
 *  - the empirical distribution of many draws against the softmax, alone
 *    and after top-k, top-p and min-p (chi-square with a fixed seed, so the
 *    result is deterministic);
 *  - top-p and min-p never return a token outside the allowed set, on
 *    crafted and on random logits;
 *  - repetition penalty arithmetic, window, distinct tokens once;
 *  - NaN and infinities; a vocabulary of 1; a 128256-token vocabulary.
 * Random logits come from test_util.h's per-run seed (BN_TEST_SEED repeats
 * a run); the samplers' own seeds are fixed. */
#include <float.h>
#include <stdint.h>

#include "sampler.h"
#include "test_util.h"

static bn_sampler *make(float temperature, int top_k, float top_p, float min_p, uint64_t seed,
                        int32_t vocab)
{
    bn_sampler_params p;
    bn_sampler_params_default(&p);
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = seed;
    bn_sampler *s = NULL;
    bn_error err;
    bn_error_clear(&err);
    const bn_status st = bn_sampler_create(&p, vocab, &s, &err);
    CHECK_MSG(st == BN_OK && s, "create failed: %s", err.message);
    return s;
}

/* Samples from a copy, since the sampler may modify the logits. */
static int32_t sample_copy(bn_sampler *s, const float *logits, float *scratch, int32_t n,
                           const int32_t *hist, size_t n_hist)
{
    memcpy(scratch, logits, (size_t)n * sizeof *logits);
    return bn_sampler_sample(s, scratch, hist, n_hist);
}

static int32_t ref_argmax(const float *l, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

/* Reference probabilities (double) of softmax(logits / T) over the tokens
 * with keep[i] != 0; the others get 0. */
static void ref_softmax(const float *l, const unsigned char *keep, int n, double T, double *p)
{
    double mx = -INFINITY, z = 0.0;
    for (int i = 0; i < n; i++)
        if (keep[i] && l[i] > mx)
            mx = l[i];
    for (int i = 0; i < n; i++) {
        p[i] = keep[i] ? exp(((double)l[i] - mx) / T) : 0.0;
        z += p[i];
    }
    for (int i = 0; i < n; i++)
        p[i] /= z;
}

/* Chi-square statistic of counts against probabilities; tokens with
 * probability 0 must never be drawn (reported as a failure). */
static double chi_square(const long *count, const double *p, int n, long draws, int *dof)
{
    double chi = 0.0;
    *dof = -1;
    for (int i = 0; i < n; i++) {
        if (p[i] == 0.0) {
            CHECK_MSG(count[i] == 0, "token %d has probability 0 but was drawn %ld times", i,
                      count[i]);
            continue;
        }
        const double e = p[i] * (double)draws;
        chi += (count[i] - e) * (count[i] - e) / e;
        (*dof)++;
    }
    return chi;
}

/* ------------------------------------------------------------------------ */

static void test_create_and_defaults(void)
{
    bn_sampler_params p;
    bn_sampler_params_default(&p);
    CHECK(p.temperature <= 0.0f);
    CHECK(p.repeat_penalty == 1.0f);
    CHECK(p.top_k <= 0 && p.top_p >= 1.0f && p.min_p <= 0.0f);

    bn_sampler *s = (bn_sampler *)&p; /* must be overwritten with NULL on failure */
    bn_error err;
    CHECK(bn_sampler_create(&p, 0, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(s == NULL);
    CHECK(err.message[0] != '\0');
    CHECK(bn_sampler_create(NULL, 10, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_sampler_create(&p, 10, NULL, &err) == BN_ERR_INVALID_ARGUMENT);

    bn_sampler_params bad = p;
    bad.temperature = NAN;
    CHECK(bn_sampler_create(&bad, 10, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    bad = p;
    bad.temperature = INFINITY;
    CHECK(bn_sampler_create(&bad, 10, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    bad = p;
    bad.top_p = NAN;
    CHECK(bn_sampler_create(&bad, 10, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    bad = p;
    bad.min_p = NAN;
    CHECK(bn_sampler_create(&bad, 10, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    bad = p;
    bad.repeat_penalty = 0.0f;
    CHECK(bn_sampler_create(&bad, 10, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    bad.repeat_penalty = -1.1f;
    CHECK(bn_sampler_create(&bad, 10, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    bad.repeat_penalty = INFINITY;
    CHECK(bn_sampler_create(&bad, 10, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_sampler_create(&bad, 10, &s, NULL) == BN_ERR_INVALID_ARGUMENT);

    /* NULL arguments never crash. */
    bn_sampler_free(NULL);
    bn_sampler_reset(NULL, 1);
    bn_sampler_params_default(NULL);
    float l[2] = {0, 1};
    CHECK(bn_sampler_sample(NULL, l, NULL, 0) == -1);
    s = make(0.0f, 0, 1.0f, 0.0f, 0, 2);
    CHECK(bn_sampler_sample(s, NULL, NULL, 0) == -1);
    /* history NULL with a count is ignored rather than read */
    CHECK(bn_sampler_sample(s, l, NULL, 5) == 1);
    bn_sampler_free(s);
}

static void test_greedy(void)
{
    float buf[16];
    const float ties[8] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 2.0f, -3.0f, 0.0f};
    const float temps[] = {0.0f, -1.0f, -INFINITY};
    for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++) {
        bn_sampler *s = make(temps[t], 3, 0.5f, 0.2f, 7, 8);
        for (int rep = 0; rep < 3; rep++)
            CHECK(sample_copy(s, ties, buf, 8, NULL, 0) == 1);
        bn_sampler_free(s);
    }
    /* Every logit equal: index 0. */
    const float flat[4] = {3, 3, 3, 3};
    bn_sampler *s = make(0.0f, 0, 1.0f, 0.0f, 0, 4);
    CHECK(sample_copy(s, flat, buf, 4, NULL, 0) == 0);
    bn_sampler_free(s);
    /* Random logits: the reference argmax. */
    s = make(0.0f, 0, 1.0f, 0.0f, 0, 16);
    float l[16];
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < 16; i++)
            l[i] = (float)test_rand_range(-3, 3); /* small integers: many ties */
        CHECK(sample_copy(s, l, buf, 16, NULL, 0) == ref_argmax(l, 16));
    }
    bn_sampler_free(s);
}

static void test_top_k_one_is_greedy(void)
{
    enum { N = 64 };
    float l[N], buf[N];
    const float temps[] = {1e-3f, 0.3f, 0.8f, 1.0f, 5.0f, 1e4f};
    for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++) {
        bn_sampler *s = make(temps[t], 1, 1.0f, 0.0f, 1234 + t, N);
        bn_sampler *s2 = make(temps[t], 1, 0.3f, 0.5f, 99, N); /* other filters too */
        for (int trial = 0; trial < 100; trial++) {
            for (int i = 0; i < N; i++)
                l[i] = trial % 2 ? (float)test_rand_range(-2, 2) : test_rand_float(-10, 10);
            const int32_t want = ref_argmax(l, N);
            CHECK(sample_copy(s, l, buf, N, NULL, 0) == want);
            CHECK(sample_copy(s2, l, buf, N, NULL, 0) == want);
        }
        bn_sampler_free(s);
        bn_sampler_free(s2);
    }
}

static void test_reproducible(void)
{
    enum { N = 100, DRAWS = 300 };
    float l[N], buf[N];
    for (int i = 0; i < N; i++)
        l[i] = test_rand_float(-2, 2);
    int32_t a[DRAWS], b[DRAWS], c[DRAWS];

    bn_sampler *s1 = make(0.9f, 50, 0.95f, 0.02f, 20240601, N);
    bn_sampler *s2 = make(0.9f, 50, 0.95f, 0.02f, 20240601, N);
    bn_sampler *s3 = make(0.9f, 50, 0.95f, 0.02f, 20240602, N);
    int same_other = 0;
    for (int i = 0; i < DRAWS; i++) {
        a[i] = sample_copy(s1, l, buf, N, NULL, 0);
        b[i] = sample_copy(s2, l, buf, N, NULL, 0);
        c[i] = sample_copy(s3, l, buf, N, NULL, 0);
        same_other += a[i] == c[i];
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_MSG(same_other < DRAWS / 2, "seed 20240602 repeats seed 20240601 (%d of %d)",
              same_other, DRAWS);

    /* Reset to the same seed: the same sequence again. */
    bn_sampler_reset(s1, 20240601);
    for (int i = 0; i < DRAWS; i++)
        b[i] = sample_copy(s1, l, buf, N, NULL, 0);
    CHECK(memcmp(a, b, sizeof a) == 0);
    /* Reset to the other seed: s3's sequence. */
    bn_sampler_reset(s1, 20240602);
    for (int i = 0; i < DRAWS; i++)
        b[i] = sample_copy(s1, l, buf, N, NULL, 0);
    CHECK(memcmp(b, c, sizeof c) == 0);
    bn_sampler_free(s1);
    bn_sampler_free(s2);
    bn_sampler_free(s3);

    /* Every sampled call advances the stream by one step, whatever it
     * keeps: five calls that can only give one token, then twenty flat
     * draws, give the same twenty as five flat draws first. Greedy calls
     * (another sampler) use no randomness at all. */
    float one[N], flat[N];
    for (int i = 0; i < N; i++) {
        one[i] = i == 17 ? 0.0f : -INFINITY;
        flat[i] = 0.0f;
    }
    s1 = make(1.0f, 0, 1.0f, 0.0f, 5, N);
    s2 = make(1.0f, 0, 1.0f, 0.0f, 5, N);
    for (int i = 0; i < 5; i++) {
        CHECK(sample_copy(s1, one, buf, N, NULL, 0) == 17);
        sample_copy(s2, flat, buf, N, NULL, 0);
    }
    for (int i = 0; i < 20; i++)
        CHECK(sample_copy(s1, flat, buf, N, NULL, 0) == sample_copy(s2, flat, buf, N, NULL, 0));
    bn_sampler_free(s1);
    bn_sampler_free(s2);

    /* top_k >= vocab is top-k off: the same sequence as top_k = 0. */
    s1 = make(0.7f, 0, 1.0f, 0.0f, 77, N);
    s2 = make(0.7f, N, 1.0f, 0.0f, 77, N);
    s3 = make(0.7f, N + 1000, 1.0f, 0.0f, 77, N);
    for (int i = 0; i < 200; i++) {
        const int32_t x = sample_copy(s1, l, buf, N, NULL, 0);
        CHECK(x == sample_copy(s2, l, buf, N, NULL, 0));
        CHECK(x == sample_copy(s3, l, buf, N, NULL, 0));
    }
    bn_sampler_free(s1);
    bn_sampler_free(s2);
    bn_sampler_free(s3);
}

/* With every logit 0 each weight is exactly 1, so a draw is
 * floor(u * V) with u the generator's next double: the tokens below were
 * computed that way by an independent (Python) transcription of
 * splitmix64 and xoshiro256** checked against the published vectors. They
 * pin the generator, its seeding and the uniform conversion, which must
 * not change between platforms or releases. */
static void test_golden_sequence(void)
{
    enum { N = 1000 };
    static const struct {
        uint64_t seed;
        int32_t tokens[16];
    } golden[] = {
        {0, {601, 747, 103, 416, 732, 999, 422, 535, 855, 918, 114, 67, 106, 654, 496, 296}},
        {42, {83, 378, 680, 924, 991, 769, 719, 850, 761, 583, 682, 290, 801, 321, 711, 877}},
        {0xdeadbeefcafebabeull,
         {135, 605, 851, 810, 362, 687, 501, 270, 171, 947, 215, 24, 677, 225, 73, 643}},
    };
    float zero[N], buf[N];
    for (int i = 0; i < N; i++)
        zero[i] = 0.0f;
    for (size_t g = 0; g < sizeof golden / sizeof golden[0]; g++) {
        bn_sampler *s = make(1.0f, 0, 1.0f, 0.0f, golden[g].seed, N);
        for (int i = 0; i < 16; i++) {
            const int32_t t = sample_copy(s, zero, buf, N, NULL, 0);
            CHECK_MSG(t == golden[g].tokens[i], "seed %llu draw %d: %d, want %d",
                      (unsigned long long)golden[g].seed, i, (int)t, (int)golden[g].tokens[i]);
        }
        bn_sampler_free(s);
    }
}

/* Draws many tokens from fixed logits and compares the counts with the
 * reference distribution. The sampler's seed is fixed, so the statistic is
 * the same on every run; the bound is the chi-square quantile for
 * p = 1e-6 at the largest degrees of freedom used, so a correct sampler
 * passes with any seed and a wrong normalisation (or a filter that lets
 * through the wrong set) fails by a wide margin. */
static void check_distribution(const char *what, const float *l, int n, float T, int top_k,
                               float top_p, float min_p, const unsigned char *keep)
{
    enum { DRAWS = 200000 };
    long count[16] = {0};
    double p[16];
    float buf[16];
    bn_sampler *s = make(T, top_k, top_p, min_p, 0x5eed, n);
    for (long d = 0; d < DRAWS; d++) {
        const int32_t t = sample_copy(s, l, buf, n, NULL, 0);
        CHECK(t >= 0 && t < n);
        if (t >= 0 && t < n)
            count[t]++;
    }
    bn_sampler_free(s);
    ref_softmax(l, keep, n, T, p);
    int dof;
    const double chi = chi_square(count, p, n, DRAWS, &dof);
    /* chi-square 1e-6 upper quantiles: dof 1: 23.9, 2: 27.6, 3: 30.7,
     * 5: 35.9, 7: 40.5, 9: 44.8, 11: 48.6. */
    static const double bound[12] = {0, 23.9, 27.6, 30.7, 33.4, 35.9, 38.3, 40.5, 42.7, 44.8,
                                     46.8, 48.6};
    CHECK_MSG(dof >= 0 && dof < 12 && chi < bound[dof < 0 ? 0 : dof], "%s: chi-square %.2f, dof %d",
              what, chi, dof);
    printf("%-28s chi-square %6.2f with %d degrees of freedom\n", what, chi, dof);
}

static void test_distribution(void)
{
    /* Distinct logits so every filter's boundary is clear of rounding. */
    const float l[10] = {1.0f, -0.5f, 2.0f, 0.3f, 1.5f, -2.0f, 0.0f, 0.9f, -1.0f, 2.4f};
    unsigned char all[10], keep[10];
    memset(all, 1, sizeof all);
    check_distribution("softmax T=1", l, 10, 1.0f, 0, 1.0f, 0.0f, all);
    check_distribution("softmax T=0.6", l, 10, 0.6f, 0, 1.0f, 0.0f, all);
    check_distribution("softmax T=2.5", l, 10, 2.5f, 0, 1.0f, 0.0f, all);

    /* top-k = 4: logits 2.4 (9), 2.0 (2), 1.5 (4), 1.0 (0). */
    memset(keep, 0, sizeof keep);
    keep[9] = keep[2] = keep[4] = keep[0] = 1;
    check_distribution("top-k 4, T=0.8", l, 10, 0.8f, 4, 1.0f, 0.0f, keep);

    /* top-p at T = 1: sorted probabilities 0.350, 0.234, 0.142, 0.086,
     * ... (cumulative 0.350, 0.584, 0.726, 0.812): 0.8 keeps four tokens,
     * the smallest prefix reaching it. */
    memset(keep, 0, sizeof keep);
    keep[9] = keep[2] = keep[4] = keep[0] = 1;
    check_distribution("top-p 0.8", l, 10, 1.0f, 0, 0.8f, 0.0f, keep);
    /* min-p 0.3 at T = 1: p >= 0.3 p_max means logit >= 2.4 + ln 0.3 =
     * 1.196: three tokens. */
    memset(keep, 0, sizeof keep);
    keep[9] = keep[2] = keep[4] = 1;
    check_distribution("min-p 0.3", l, 10, 1.0f, 0, 1.0f, 0.3f, keep);
    /* Temperature comes before min-p: at T = 0.5 the bound is
     * 2.4 + 0.5 ln 0.3 = 1.798, two tokens. */
    memset(keep, 0, sizeof keep);
    keep[9] = keep[2] = 1;
    check_distribution("min-p 0.3, T=0.5", l, 10, 0.5f, 0, 1.0f, 0.3f, keep);
    /* top-p measures mass within the top-k set: top-k 6 (9, 2, 4, 0, 7, 3)
     * renormalises to 0.375, 0.251, 0.152, ... so top-p 0.6 stops after two
     * tokens (0.626), where over the whole vocabulary it would take three
     * (0.584 < 0.6). */
    memset(keep, 0, sizeof keep);
    keep[9] = keep[2] = 1;
    check_distribution("top-k 6, top-p 0.6", l, 10, 1.0f, 6, 0.6f, 0.0f, keep);
    /* All three: top-p 0.7 keeps 9, 2, 4 (0.778); min-p 0.5 keeps logits
     * >= 2.4 + ln 0.5 = 1.707, i.e. 9 and 2: the intersection. */
    memset(keep, 0, sizeof keep);
    keep[9] = keep[2] = keep[4] = 1;
    check_distribution("top-k 6, top-p 0.7", l, 10, 1.0f, 6, 0.7f, 0.0f, keep);
    memset(keep, 0, sizeof keep);
    keep[9] = keep[2] = 1;
    check_distribution("top-k 6, top-p .7, min-p .5", l, 10, 1.0f, 6, 0.7f, 0.5f, keep);
}

/* Tokens in descending logit order (ties: lower index first), as the
 * filters see them. */
typedef struct ranked {
    float l;
    int32_t id;
} ranked;

static int cmp_ranked(const void *pa, const void *pb)
{
    const ranked *a = pa, *b = pb;
    if (a->l != b->l)
        return a->l > b->l ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static void sort_desc(const float *l, int32_t *order, int n)
{
    ranked *r = malloc((size_t)n * sizeof *r);
    if (!r)
        abort();
    for (int i = 0; i < n; i++)
        r[i] = (ranked){l[i], i};
    qsort(r, (size_t)n, sizeof *r, cmp_ranked);
    for (int i = 0; i < n; i++)
        order[i] = r[i].id;
    free(r);
}

/* Random logits and settings: every drawn token must pass top-k (its rank),
 * top-p (the tokens ranked above it had not yet reached top_p of the top-k
 * mass) and min-p (p >= min_p * p_max), each with a little slack for the
 * float arithmetic. n above 2048 with top-k off takes top-p's bucketed
 * path, below it the heap. */
static void check_filters_random(int n, int trials, int draws)
{
    float *l = malloc((size_t)n * sizeof *l), *buf = malloc((size_t)n * sizeof *buf);
    int32_t *order = malloc((size_t)n * sizeof *order), *rank_of = malloc((size_t)n * sizeof *rank_of);
    double *p = malloc((size_t)n * sizeof *p), *before = malloc((size_t)n * sizeof *before);
    unsigned char *keep = malloc((size_t)n);
    if (!l || !buf || !order || !rank_of || !p || !before || !keep)
        abort();
    for (int trial = 0; trial < trials; trial++) {
        const int scale = (int)test_rand_range(1, 4);
        for (int i = 0; i < n; i++)
            l[i] = test_rand_float(-2.0f * (float)scale, 2.0f * (float)scale);
        if (trial % 3 == 0) /* ties */
            for (int i = 0; i < n; i++)
                l[i] = roundf(l[i]);
        const float T = test_rand_float(0.2f, 2.0f);
        const int top_k = trial % 4 == 0 ? 0 : (int)test_rand_range(1, n + 10);
        const float top_p = trial % 5 == 0 ? 1.0f : test_rand_float(0.05f, 0.99f);
        const float min_p = trial % 2 == 0 ? 0.0f : test_rand_float(0.0f, 0.9f);

        sort_desc(l, order, n);
        for (int r = 0; r < n; r++)
            rank_of[order[r]] = r;
        const int kk = top_k <= 0 || top_k > n ? n : top_k;
        for (int i = 0; i < n; i++)
            keep[i] = rank_of[i] < kk;
        ref_softmax(l, keep, n, T, p);
        const double pmax = p[order[0]];
        double acc = 0.0;
        for (int r = 0; r < n; r++) {
            before[r] = acc;
            acc += p[order[r]];
        }

        bn_sampler *s = make(T, top_k, top_p, min_p, (uint64_t)trial, n);
        for (int d = 0; d < draws; d++) {
            const int32_t t = sample_copy(s, l, buf, n, NULL, 0);
            if (!(t >= 0 && t < n)) {
                CHECK_MSG(0, "token %d out of range", (int)t);
                break;
            }
            const int r = rank_of[t];
            /* Ties at the k-th logit are cut by id, never either way. */
            CHECK_MSG(r < kk, "n %d trial %d: rank %d outside top-k %d", n, trial, r, kk);
            if (top_p < 1.0f)
                CHECK_MSG(before[r] < top_p + 1e-5,
                          "n %d trial %d: rank %d after %.6f >= top-p %.4f", n, trial, r,
                          before[r], (double)top_p);
            CHECK_MSG(p[t] >= min_p * pmax * (1 - 1e-5),
                      "n %d trial %d: p %.3g < min-p %.3g * %.3g", n, trial, p[t],
                      (double)min_p, pmax);
        }
        bn_sampler_free(s);
    }
    free(l);
    free(buf);
    free(order);
    free(rank_of);
    free(p);
    free(before);
    free(keep);
}

/* Top-p's bucketed path with heavy ties: 3000 tokens on 10 logit levels
 * (300 each, ids interleaved), so the cut falls inside a level and must
 * keep that level's lowest ids. The kept set is computed here from the
 * definition; the draws must stay in it and follow its renormalised
 * distribution, checked per level (chi-square). */
static void test_top_p_large_ties(void)
{
    enum { N = 3000, LEVELS = 10, DRAWS = 100000 };
    float *l = malloc(N * sizeof *l), *buf = malloc(N * sizeof *buf);
    int32_t *order = malloc(N * sizeof *order);
    double *p = malloc(N * sizeof *p);
    unsigned char *allowed = calloc(N, 1), *all = malloc(N);
    if (!l || !buf || !order || !p || !allowed || !all)
        abort();
    for (int i = 0; i < N; i++) {
        l[i] = -0.5f * (float)(i % LEVELS);
        all[i] = 1;
    }
    const float top_p = 0.83f;
    ref_softmax(l, all, N, 1.0, p);
    sort_desc(l, order, N);
    double cum = 0.0;
    int kept = 0;
    while (kept < N) {
        cum += p[order[kept]];
        allowed[order[kept++]] = 1;
        if (cum >= top_p)
            break;
    }
    /* Level probabilities after the cut, and which level it cut. */
    double lp[LEVELS] = {0};
    for (int i = 0; i < N; i++)
        if (allowed[i])
            lp[i % LEVELS] += p[i];
    double z = 0.0;
    for (int v = 0; v < LEVELS; v++)
        z += lp[v];
    for (int v = 0; v < LEVELS; v++)
        lp[v] /= z;

    long count[LEVELS] = {0};
    bn_sampler *s = make(1.0f, 0, top_p, 0.0f, 99, N);
    int outside = 0;
    for (int d = 0; d < DRAWS; d++) {
        const int32_t t = sample_copy(s, l, buf, N, NULL, 0);
        if (t < 0 || t >= N || !allowed[t]) {
            outside++;
            continue;
        }
        count[t % LEVELS]++;
    }
    CHECK_MSG(outside == 0, "%d draws outside the top-p set of %d tokens", outside, kept);
    int dof;
    const double chi = chi_square(count, lp, LEVELS, DRAWS - outside, &dof);
    CHECK_MSG(chi < 44.8, "top-p over ties: chi-square %.2f, dof %d", chi, dof);
    printf("top-p %.2f over 3000 tied     chi-square %6.2f with %d degrees of freedom (%d kept)\n",
           (double)top_p, chi, dof, kept);
    bn_sampler_free(s);
    free(l);
    free(buf);
    free(order);
    free(p);
    free(allowed);
    free(all);
}

static void test_filters_allowed_set(void)
{
    check_filters_random(200, 60, 300);
    check_filters_random(5000, 24, 200);

    /* Crafted: the kept set is exactly what the definitions say, and top-p
     * below the first token's probability still keeps one token. */
    const float c[6] = {0.0f, 3.0f, -1.0f, 2.0f, 1.0f, -5.0f}; /* order: 1, 3, 4, 0, 2, 5 */
    float cb[6];
    struct {
        float top_p, min_p;
        unsigned char allowed[6];
    } cases[] = {
        {0.0f, 0.0f, {0, 1, 0, 0, 0, 0}},    /* top-p 0: the best token only  */
        {0.5f, 0.0f, {0, 1, 0, 0, 0, 0}},    /* p(1) = 0.64 already >= 0.5   */
        {0.8f, 0.0f, {0, 1, 0, 1, 0, 0}},    /* 0.64 + 0.235 = 0.875          */
        {0.9f, 0.0f, {0, 1, 0, 1, 1, 0}},    /* + 0.087 = 0.962               */
        {1.0f, 0.3f, {0, 1, 0, 1, 0, 0}},    /* e^-1 = 0.37 >= 0.3 > e^-2     */
        {1.0f, 0.1f, {0, 1, 0, 1, 1, 0}},    /* e^-2 = 0.135 >= 0.1           */
        {1.0f, 1.0f, {0, 1, 0, 0, 0, 0}},    /* only the maximum              */
        {1.0f, 5.0f, {0, 1, 0, 0, 0, 0}},    /* above 1: still the maximum    */
        {0.9f, 0.3f, {0, 1, 0, 1, 0, 0}},    /* the smaller of the two        */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        bn_sampler *s = make(1.0f, 0, cases[k].top_p, cases[k].min_p, 3, 6);
        int seen[6] = {0};
        for (int d = 0; d < 20000; d++) {
            const int32_t t = sample_copy(s, c, cb, 6, NULL, 0);
            if (t >= 0 && t < 6)
                seen[t]++;
            else
                CHECK(0);
        }
        for (int i = 0; i < 6; i++)
            CHECK_MSG(cases[k].allowed[i] ? seen[i] > 0 : seen[i] == 0,
                      "case %zu (top-p %.2f, min-p %.2f): token %d drawn %d times", k,
                      (double)cases[k].top_p, (double)cases[k].min_p, i, seen[i]);
        bn_sampler_free(s);
    }

    /* top-k ties at the cut keep the lower ids. */
    const float eq[5] = {1, 1, 1, 1, 1};
    float eb[5];
    bn_sampler *s = make(1.0f, 2, 1.0f, 0.0f, 11, 5);
    int seen[5] = {0};
    for (int d = 0; d < 2000; d++) {
        const int32_t t = sample_copy(s, eq, eb, 5, NULL, 0);
        if (t >= 0 && t < 5)
            seen[t]++;
    }
    CHECK(seen[0] > 0 && seen[1] > 0 && seen[2] == 0 && seen[3] == 0 && seen[4] == 0);
    bn_sampler_free(s);
}

static bn_sampler *make_penalty(float penalty, int last_n, int32_t vocab)
{
    bn_sampler_params p;
    bn_sampler_params_default(&p);
    p.repeat_penalty = penalty;
    p.repeat_last_n = last_n;
    bn_sampler *s = NULL;
    CHECK(bn_sampler_create(&p, vocab, &s, NULL) == BN_OK);
    return s;
}

static void test_repetition_penalty(void)
{
    /* The arithmetic, read back from the logits the sampler modified (the
     * header allows it): positive / penalty, negative * penalty, zero
     * unchanged, each distinct token once however often it repeats, tokens
     * outside the window or the vocabulary ignored. */
    bn_sampler *s = make_penalty(1.5f, 6, 8);
    float l[8] = {3.0f, -2.0f, 0.0f, 1.2f, -0.6f, 5.0f, 7.0f, -INFINITY};
    const int32_t hist[] = {6, 0, 0, 1, 2, 3, 3, 3, 4, -1, 100, 7};
    /* window: the last 6 = {3, 3, 4, -1, 100, 7} */
    (void)bn_sampler_sample(s, l, hist, sizeof hist / sizeof hist[0]);
    CHECK(l[0] == 3.0f && l[1] == -2.0f && l[2] == 0.0f && l[6] == 7.0f); /* outside */
    CHECK(l[3] == 1.2f / 1.5f); /* three times in the window: once */
    CHECK(l[4] == -0.6f * 1.5f);
    CHECK(l[5] == 5.0f);
    CHECK(l[7] == -INFINITY);
    bn_sampler_free(s);

    /* The whole history (repeat_last_n < 0). */
    s = make_penalty(1.5f, -1, 8);
    float m[8] = {3.0f, -2.0f, 0.0f, 1.2f, -0.6f, 5.0f, 7.0f, 1.0f};
    (void)bn_sampler_sample(s, m, hist, sizeof hist / sizeof hist[0]);
    CHECK(m[0] == 2.0f && m[1] == -3.0f && m[2] == 0.0f && m[6] == 7.0f / 1.5f);
    CHECK(m[3] == 1.2f / 1.5f && m[4] == -0.6f * 1.5f && m[5] == 5.0f && m[7] == 1.0f / 1.5f);
    bn_sampler_free(s);

    /* Off: penalty 1 or window 0. */
    s = make_penalty(1.0f, 64, 8);
    float o[8] = {3.0f, -2.0f, 0, 0, 0, 0, 0, 0};
    (void)bn_sampler_sample(s, o, hist, 3);
    CHECK(o[0] == 3.0f);
    bn_sampler_free(s);
    s = make_penalty(2.0f, 0, 8);
    (void)bn_sampler_sample(s, o, hist, 3);
    CHECK(o[0] == 3.0f);
    bn_sampler_free(s);

    /* The effect on the choice (greedy). */
    float buf[4];
    const float g[4] = {2.0f, 1.9f, -1.0f, -1.05f};
    const int32_t h0[] = {0}, h000[] = {0, 0, 0}, h2[] = {2};
    s = make_penalty(1.1f, 64, 4);
    CHECK(sample_copy(s, g, buf, 4, h0, 1) == 1); /* 2 / 1.1 = 1.82 < 1.9 */
    bn_sampler_free(s);
    s = make_penalty(1.04f, 64, 4);
    CHECK(sample_copy(s, g, buf, 4, h0, 1) == 0);   /* 2 / 1.04 = 1.92 > 1.9 */
    CHECK(sample_copy(s, g, buf, 4, h000, 3) == 0); /* thrice would be 1.78 */
    bn_sampler_free(s);
    /* A negative logit becomes less likely too, not more. */
    const float neg[4] = {-INFINITY, -INFINITY, -1.0f, -1.05f};
    s = make_penalty(1.1f, 64, 4);
    CHECK(sample_copy(s, neg, buf, 4, h2, 1) == 3); /* -1.1 < -1.05 */
    CHECK(sample_copy(s, neg, buf, 4, NULL, 0) == 2);
    bn_sampler_free(s);
    /* A penalty below 1 rewards repetition. */
    s = make_penalty(0.9f, 64, 4);
    const int32_t h1[] = {1};
    CHECK(sample_copy(s, g, buf, 4, h1, 1) == 1); /* 1.9 / 0.9 = 2.11 */
    bn_sampler_free(s);
    /* A finite logit stays finite under the penalty, so it still beats
     * the -inf ones instead of falling back to token 0. */
    const float edge[3] = {-INFINITY, -INFINITY, -FLT_MAX};
    s = make_penalty(2.0f, 64, 3);
    const int32_t he[] = {2};
    CHECK(sample_copy(s, edge, buf, 3, he, 1) == 2);
    bn_sampler_free(s);

    /* The penalty applies before sampling, too: with temperature and the
     * repeated token's logit cut from 4 to 2 (penalty 2), the two tokens
     * become equally likely. */
    bn_sampler_params p;
    bn_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.repeat_penalty = 2.0f;
    p.seed = 8;
    CHECK(bn_sampler_create(&p, 2, &s, NULL) == BN_OK);
    const float two[2] = {4.0f, 2.0f};
    const int32_t hz[] = {0};
    long c0 = 0;
    for (int d = 0; d < 40000; d++)
        c0 += sample_copy(s, two, buf, 2, hz, 1) == 0;
    /* 5 sigma of a fair coin over 40000 draws is 500. */
    CHECK_MSG(labs(c0 - 20000) < 500, "token 0 drawn %ld of 40000 times", c0);
    bn_sampler_free(s);
}

static void test_nan_inf(void)
{
    enum { N = 6 };
    float buf[N];
    const float with_nan[N] = {0.0f, NAN, 1.0f, NAN, -INFINITY, 0.5f};
    const float all_nan[N] = {NAN, NAN, NAN, NAN, NAN, NAN};
    const float all_ninf[N] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const float mixed_bad[N] = {NAN, -INFINITY, NAN, -INFINITY, -INFINITY, NAN};
    const float one_pinf[N] = {1e30f, 0.0f, NAN, INFINITY, FLT_MAX, -INFINITY};
    const float two_pinf[N] = {0.0f, INFINITY, 3.0f, NAN, INFINITY, FLT_MAX};
    const float temps[] = {0.0f, 0.01f, 1.0f, 50.0f};
    for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
        const float T = temps[ti];
        const int ks[] = {0, 2};
        for (size_t ki = 0; ki < 2; ki++) {
            bn_sampler *s = make(T, ks[ki], 0.9f, 0.0f, 31, N);
            bn_sampler *t = make(T, ks[ki], 1.0f, 0.0f, 32, N);
            int pinf_seen[2] = {0, 0};
            for (int d = 0; d < 2000; d++) {
                int32_t x = sample_copy(s, with_nan, buf, N, NULL, 0);
                CHECK_MSG(x == 0 || x == 2 || x == 5, "T %g: drew %d (NaN or -inf)", (double)T,
                          (int)x);
                x = sample_copy(t, with_nan, buf, N, NULL, 0);
                CHECK(x == 0 || x == 2 || x == 5);
                /* Nothing to choose: no token, never a made-up one. */
                CHECK(sample_copy(s, all_nan, buf, N, NULL, 0) == BN_SAMPLER_NO_TOKEN);
                CHECK(sample_copy(s, all_ninf, buf, N, NULL, 0) == BN_SAMPLER_NO_TOKEN);
                CHECK(sample_copy(s, mixed_bad, buf, N, NULL, 0) == BN_SAMPLER_NO_TOKEN);
                /* +inf beats everything, FLT_MAX included. */
                CHECK(sample_copy(s, one_pinf, buf, N, NULL, 0) == 3);
                /* Two +inf: only they, and (sampling) both of them. */
                x = sample_copy(t, two_pinf, buf, N, NULL, 0);
                CHECK(x == 1 || x == 4);
                if (x == 1 || x == 4)
                    pinf_seen[x == 4]++;
            }
            if (T > 0.0f)
                CHECK_MSG(pinf_seen[0] > 800 && pinf_seen[1] > 800, "T %g: +inf split %d/%d",
                          (double)T, pinf_seen[0], pinf_seen[1]);
            else
                CHECK(pinf_seen[0] == 2000);
            bn_sampler_free(s);
            bn_sampler_free(t);
        }
    }
    /* Huge finite logits and a tiny temperature: no overflow to NaN. */
    const float huge[N] = {-FLT_MAX, FLT_MAX, FLT_MAX / 2, -1.0f, 0.0f, 1.0f};
    bn_sampler *s = make(1e-30f, 0, 0.5f, 0.1f, 4, N);
    for (int d = 0; d < 100; d++)
        CHECK(sample_copy(s, huge, buf, N, NULL, 0) == 1);
    bn_sampler_free(s);
    s = make(1e30f, 0, 1.0f, 0.0f, 4, N);
    for (int d = 0; d < 100; d++) {
        const int32_t x = sample_copy(s, huge, buf, N, NULL, 0);
        CHECK(x >= 0 && x < N);
    }
    bn_sampler_free(s);
}

static void test_vocab_one(void)
{
    float l[1];
    const float vals[] = {0.0f, -3.0f, 7.0f, NAN, INFINITY, -INFINITY};
    const float temps[] = {0.0f, 0.5f, 2.0f};
    const int32_t hist[] = {0, 0, 5, -2};
    for (size_t t = 0; t < 3; t++) {
        bn_sampler *s = make(temps[t], 1, 0.1f, 0.9f, 1, 1);
        bn_sampler *u = make(temps[t], 0, 1.0f, 0.0f, 1, 1);
        for (size_t v = 0; v < sizeof vals / sizeof vals[0]; v++) {
            /* The one token, unless its logit is NaN or -inf: then none. */
            const int32_t want = isnan(vals[v]) || vals[v] == -INFINITY ? BN_SAMPLER_NO_TOKEN : 0;
            l[0] = vals[v];
            CHECK(bn_sampler_sample(s, l, hist, 4) == want);
            l[0] = vals[v];
            CHECK(bn_sampler_sample(u, l, NULL, 0) == want);
        }
        bn_sampler_free(s);
        bn_sampler_free(u);
    }
}

/* next_uniform is the number the next sampled pick draws: with two equally
 * likely tokens the pick is token 0 exactly when u < 1/2 (the first token
 * whose cumulative weight, 1 of 2, exceeds u x 2). Peeking changes nothing;
 * skip uses the number up as a pick would; greedy picks draw none. */
static void test_next_uniform(void)
{
    bn_sampler *s = make(1.0f, 0, 1.0f, 0.0f, 77, 2);
    bn_sampler *peeked = make(1.0f, 0, 1.0f, 0.0f, 77, 2);
    bn_sampler *skipper = make(1.0f, 0, 1.0f, 0.0f, 77, 2);
    int low = 0, mismatches = 0;
    /* said[j][a - 1]: what uniform_ahead(s, a) said, a picks before pick j. */
    static double said[256 + 3][3];
    for (int i = 0; i < 256 && s && peeked && skipper; i++) {
        const double u = bn_sampler_next_uniform(s);
        CHECK(u >= 0.0 && u < 1.0);
        CHECK(bn_sampler_next_uniform(s) == u); /* a peek does not move the stream */
        CHECK(bn_sampler_next_uniform(skipper) == u);
        CHECK(bn_sampler_uniform_ahead(s, 0) == u);
        for (int a = 1; a <= 3; a++) {
            mismatches += i >= a && said[i][a - 1] != u;
            said[i + a][a - 1] = bn_sampler_uniform_ahead(s, a);
        }
        CHECK(bn_sampler_next_uniform(s) == u);
        float l[2] = {0.0f, 0.0f}, m[2] = {0.0f, 0.0f};
        const int32_t t = bn_sampler_sample(s, l, NULL, 0);
        (void)bn_sampler_next_uniform(peeked);
        mismatches += bn_sampler_sample(peeked, m, NULL, 0) != t;
        mismatches += t != (u < 0.5 ? 0 : 1);
        low += u < 0.5;
        bn_sampler_skip(skipper);
    }
    CHECK_MSG(mismatches == 0, "%d picks did not follow next_uniform", mismatches);
    CHECK_MSG(low > 64 && low < 192, "%d of 256 numbers below 1/2", low);
    bn_sampler_free(s);
    bn_sampler_free(peeked);
    bn_sampler_free(skipper);

    /* A greedy pick draws nothing. */
    bn_sampler *g = make(0.0f, 0, 1.0f, 0.0f, 5, 2);
    const double before = bn_sampler_next_uniform(g);
    float l[2] = {1.0f, 0.0f};
    CHECK(bn_sampler_sample(g, l, NULL, 0) == 0);
    CHECK(bn_sampler_next_uniform(g) == before);
    bn_sampler_free(g);
}

/* The size of Llama 3's vocabulary (BitNet b1.58 2B4T uses it): every
 * configuration runs, returns a valid token, and respects its filter. */
static void test_large_vocab(void)
{
    enum { V = 128256 };
    float *l = malloc(V * sizeof *l);
    float *buf = malloc(V * sizeof *buf);
    int32_t *hist = malloc(64 * sizeof *hist);
    CHECK(l && buf && hist);
    if (!l || !buf || !hist) {
        free(l);
        free(buf);
        free(hist);
        return;
    }
    /* Roughly what a model gives: a broad bulk and a few standouts. */
    for (int i = 0; i < V; i++) {
        const float a = test_rand_float(0, 1), b = test_rand_float(0, 1), c = test_rand_float(0, 1);
        l[i] = 2.0f * (a + b + c - 1.5f);
    }
    for (int i = 0; i < 20; i++)
        l[test_rand_range(0, V - 1)] = test_rand_float(8.0f, 14.0f);
    for (int i = 0; i < 64; i++)
        hist[i] = (int32_t)test_rand_range(0, V - 1);
    const int32_t best = ref_argmax(l, V);

    /* The 40th-best logit, for the top-k check. */
    float kth = INFINITY;
    {
        float prev = INFINITY;
        int taken = 0;
        while (taken < 40) { /* 40 passes of O(V): fine for a test */
            float m = -INFINITY;
            int cnt = 0;
            for (int i = 0; i < V; i++) {
                if (l[i] < prev && l[i] > m) {
                    m = l[i];
                    cnt = 1;
                } else if (l[i] == m) {
                    cnt++;
                }
            }
            taken += cnt;
            prev = m;
        }
        kth = prev;
    }

    struct {
        const char *name;
        float T;
        int k;
        float top_p, min_p, penalty;
    } cfg[] = {
        {"greedy", 0.0f, 0, 1.0f, 0.0f, 1.0f},
        {"greedy + penalty", 0.0f, 0, 1.0f, 0.0f, 1.1f},
        {"softmax only", 1.0f, 0, 1.0f, 0.0f, 1.0f},
        {"top-k 40", 0.8f, 40, 1.0f, 0.0f, 1.0f},
        {"top-p 0.9 only", 1.0f, 0, 0.9f, 0.0f, 1.0f},
        {"top-p 0.999, flat-ish", 3.0f, 0, 0.999f, 0.0f, 1.0f},
        {"min-p 0.05 only", 0.8f, 0, 1.0f, 0.05f, 1.0f},
        {"llama.cpp-like chain", 0.8f, 40, 0.95f, 0.05f, 1.1f},
        {"top-k 1", 0.8f, 1, 1.0f, 0.0f, 1.0f},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        bn_sampler_params p;
        bn_sampler_params_default(&p);
        p.temperature = cfg[c].T;
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.repeat_penalty = cfg[c].penalty;
        p.repeat_last_n = 64;
        p.seed = 2024;
        bn_sampler *s = NULL;
        bn_error err;
        CHECK_MSG(bn_sampler_create(&p, V, &s, &err) == BN_OK, "%s", err.message);
        if (!s)
            continue;
        const int draws = 50;
        const uint64_t t0 = bn_time_ns();
        int ok = 1;
        for (int d = 0; d < draws; d++) {
            const int32_t t = sample_copy(s, l, buf, V, hist, 64);
            if (t < 0 || t >= V) {
                ok = 0;
                break;
            }
            if (cfg[c].T <= 0.0f && cfg[c].penalty == 1.0f)
                ok &= t == best;
            if (cfg[c].k == 1)
                ok &= t == best || cfg[c].penalty != 1.0f;
            if (cfg[c].k > 0 && cfg[c].penalty == 1.0f)
                ok &= l[t] >= kth;
            if (cfg[c].min_p > 0.0f && cfg[c].penalty == 1.0f)
                ok &= (l[best] - l[t]) / cfg[c].T <= -logf(cfg[c].min_p) + 1e-4f;
        }
        const double us = (double)(bn_time_ns() - t0) / 1e3 / draws;
        CHECK_MSG(ok, "%s: a draw broke its filter", cfg[c].name);
        printf("vocab %d, %-24s %8.1f us per token\n", V, cfg[c].name, us);
        bn_sampler_free(s);
    }
    free(l);
    free(buf);
    free(hist);
}

int main(void)
{
    test_seed_init();
    test_create_and_defaults();
    test_greedy();
    test_top_k_one_is_greedy();
    test_reproducible();
    test_golden_sequence();
    test_distribution();
    test_filters_allowed_set();
    test_top_p_large_ties();
    test_repetition_penalty();
    test_nan_inf();
    test_vocab_one();
    test_next_uniform();
    test_large_vocab();
    TEST_EXIT();
}
