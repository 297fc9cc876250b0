/* Kernel providers against the scalar reference, and the scalar reference
 * against a direct computation from the codes: random ragged shapes, M from
 * 1 to 17, outputs poisoned before every call, any thread count. Integer
 * paths are compared exactly (bit patterns of the float results). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "head_screen.h"
#include "kernel_manager.h"
#include "quant_rules.h"
#include "test_util.h"
#include "w2a8.h"

static const float POISON = -12345.678f;

static void random_codes(int8_t *codes, int64_t n)
{
    /* Vary the zero density per matrix: BitNet weights are ~1/3 zeros. */
    int zero_pct = (int)test_rand_range(0, 90);
    for (int64_t i = 0; i < n; i++)
        codes[i] = (int)test_rand_range(0, 99) < zero_pct ? 0 : (test_rand_u64() & 1) ? 1 : -1;
}

static void random_activations(float *x, int64_t n)
{
    float range = test_rand_float(0.01f, 50.0f);
    for (int64_t i = 0; i < n; i++)
        x[i] = test_rand_float(-range, range);
    /* Occasional outliers, as real activations have. */
    if (n > 3 && (test_rand_u64() & 1))
        x[test_rand_range(0, n - 1)] = range * 20.0f;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Direct definition: y = (sum code*xq) / s * ws. */
static float direct(const int8_t *codes, int64_t k, const int8_t *xq, float s, float ws)
{
    int32_t acc = 0;
    for (int64_t c = 0; c < k; c++)
        acc += codes[c] * xq[c];
    return bn_w2a8_epilogue(acc, s, ws);
}

static void test_quantize_rules(void)
{
    /* absmax: 127 / 2 = 63.5 -> 0.5*63.5 = 31.75 -> 32; -2 -> -127; ties to even. */
    const float x[4] = {0.5f, -2.0f, 1.0f / 63.5f, 0.0f};
    int8_t q[4];
    float s;
    int32_t sum;
    bn_quantize_activations_row(x, 4, q, &s, &sum);
    CHECK(s == 63.5f);
    CHECK(q[0] == 32 && q[1] == -127 && q[2] == 1 && q[3] == 0);
    CHECK(sum == 32 - 127 + 1);
    /* All zeros: the 1e-5 floor, no division by zero. */
    const float z[3] = {0, 0, 0};
    bn_quantize_activations_row(z, 3, q, &s, &sum);
    CHECK(s == 127.0f / 1e-5f && q[0] == 0 && sum == 0);
    /* NaN values quantize to 0 and do not poison the scale. */
    const float n[3] = {NAN, 1.0f, -1.0f};
    bn_quantize_activations_row(n, 3, q, &s, &sum);
    CHECK(s == 127.0f && q[0] == 0 && q[1] == 127 && q[2] == -127);

    /* absmean: mean|w| = 0.5; w / 0.5 rounds half to even: 0.25/0.5 = 0.5 -> 0. */
    const float w[4] = {1.0f, -0.5f, 0.25f, -0.25f};
    int8_t codes[4];
    float ws;
    bn_quantize_weights_absmean(w, 4, codes, &ws);
    CHECK(ws == 0.5f);
    CHECK(codes[0] == 1 && codes[1] == -1 && codes[2] == 0 && codes[3] == 0);
    const float zw[2] = {0, 0};
    bn_quantize_weights_absmean(zw, 2, codes, &ws);
    CHECK(ws == BN_QUANT_EPS && codes[0] == 0);

    /* RMSNorm + int8: codes round(127 u / max|u|), ties to even (0.5 -> 0,
     * -63.5 -> -64, 95.25 -> 95), the scale 127 / max|normed x|. */
    const float nx[4] = {254.0f, 1.0f, -127.0f, 190.5f}, nw[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    int8_t nq[4];
    float ns;
    int32_t nsum;
    bn_norm_quantize_row(nx, nw, 4, 0.0f, nq, &ns, &nsum);
    CHECK(nq[0] == 127 && nq[1] == 0 && nq[2] == -64 && nq[3] == 95 && nsum == 158);
    const double rms = sqrt((254.0 * 254.0 + 1.0 + 127.0 * 127.0 + 190.5 * 190.5) / 4.0);
    CHECK_MSG(fabs(ns - 127.0 / (254.0 / rms)) < 1e-4, "scale %g", ns);
}

/* Every provider's activation quantizer equals the scalar one, byte for byte. */
static void test_quantizers(const bn_kernel_provider *p)
{
    for (int iter = 0; iter < 200; iter++) {
        int64_t k = test_rand_range(1, 700);
        float *x = malloc((size_t)k * sizeof *x);
        int8_t *q_ref = malloc((size_t)k), *q = malloc((size_t)k);
        random_activations(x, k);
        if (iter % 7 == 0)
            x[test_rand_range(0, k - 1)] = NAN;
        float s_ref, s;
        int32_t sum_ref, sum;
        bn_quantize_activations_row(x, k, q_ref, &s_ref, &sum_ref);
        memset(q, 0x5a, (size_t)k);
        s = POISON;
        sum = -999;
        p->quantize_activations(x, k, q, &s, &sum);
        CHECK_MSG(memcmp(q, q_ref, (size_t)k) == 0 && same_bits(s, s_ref) && sum == sum_ref,
                  "%s quantize k=%lld differs", p->name, (long long)k);
        free(x);
        free(q_ref);
        free(q);
    }
}

/* Every provider's RMSNorm + int8 row equals the scalar one (codes, sum,
 * scale bit for bit) on rows that reach every path: smooth random rows,
 * integer rows whose codes are exact ties (127 * u / max|u| = j + 1/2),
 * tiny and zero rows (the plain rule), rows with a NaN or an infinity,
 * and lengths that are and are not whole vectors. Outputs poisoned. */
static void test_norm_quantizers(const bn_kernel_provider *p)
{
    for (int iter = 0; iter < 300; iter++) {
        const int64_t n = iter % 3 == 0 ? test_rand_range(1, 300) : 16 * test_rand_range(1, 440);
        float *x = malloc((size_t)n * sizeof *x), *w = malloc((size_t)n * sizeof *w);
        int8_t *q_ref = malloc((size_t)n), *q = malloc((size_t)n);
        const int kind = iter % 6;
        for (int64_t i = 0; i < n; i++) {
            w[i] = kind == 1 ? 1.0f : test_rand_float(0.5f, 2.0f);
            x[i] = kind == 1 ? (float)test_rand_range(-254, 254) : test_rand_float(-3.0f, 3.0f);
            if (kind == 2)
                x[i] *= 1e-30f; /* tiny: umax underflows to small doubles */
        }
        if (kind == 1)
            x[test_rand_range(0, n - 1)] = 254.0f; /* max|u| = 254: ties at odd u */
        if (kind == 3)
            memset(x, 0, (size_t)n * sizeof *x);
        if (kind == 4)
            x[test_rand_range(0, n - 1)] = (iter & 1) ? NAN : INFINITY;
        if (kind == 5)
            w[test_rand_range(0, n - 1)] = 0.0f;
        float s_ref, s = POISON;
        int32_t sum_ref, sum = -999;
        bn_norm_quantize_row(x, w, n, 1e-5f, q_ref, &s_ref, &sum_ref);
        memset(q, 0x5a, (size_t)n);
        p->norm_quantize_row(x, w, n, 1e-5f, q, &s, &sum);
        CHECK_MSG(memcmp(q, q_ref, (size_t)n) == 0 && same_bits(s, s_ref) && sum == sum_ref,
                  "%s norm_quantize_row n=%lld kind %d differs", p->name, (long long)n, kind);
        free(x);
        free(w);
        free(q_ref);
        free(q);
    }
}

/* One random problem: every provider and thread count equals the reference. */
static void check_problem(int64_t n, int64_t k, int64_t m, bn_threadpool *pools[3])
{
    int8_t *codes = malloc((size_t)(n * k));
    float *x = malloc((size_t)(m * k) * sizeof *x);
    float *ref = malloc((size_t)(m * n) * sizeof *ref);
    float *y = malloc((size_t)(m * n) * sizeof *y);
    random_codes(codes, n * k);
    random_activations(x, m * k);
    const float ws = test_rand_float(0.001f, 3.0f);

    bn_q8_rows xq;
    CHECK(bn_q8_rows_alloc(&xq, m, k, NULL) == BN_OK);
    bn_w2a8_quantize(&bn_provider_scalar, x, m, k, &xq);

    /* The reference, checked against the direct definition. */
    bn_w2a8_weights wref;
    CHECK(bn_w2a8_pack(&bn_provider_scalar, codes, n, k, ws, &wref, NULL) == BN_OK);
    for (int64_t i = 0; i < m * n; i++)
        ref[i] = POISON;
    CHECK(bn_w2a8_matmul(&wref, &xq, ref, n, NULL, NULL) == BN_OK);
    int bad = 0;
    for (int64_t mi = 0; mi < m; mi++)
        for (int64_t r = 0; r < n; r++)
            bad += !same_bits(ref[mi * n + r], direct(codes + r * k, k, xq.q + mi * xq.lda,
                                                       xq.scale[mi], ws));
    CHECK_MSG(bad == 0, "scalar vs direct: %d of %lld differ (n=%lld k=%lld m=%lld)", bad,
              (long long)(m * n), (long long)n, (long long)k, (long long)m);

    const bn_kernel_provider *const *list;
    int count = bn_kernel_providers(&list);
    for (int i = 0; i < count; i++) {
        const bn_kernel_provider *p = list[i];
        if (!p->is_available())
            continue;
        bn_w2a8_weights w;
        CHECK(bn_w2a8_pack(p, codes, n, k, ws, &w, NULL) == BN_OK);
        for (int t = 0; t < 3; t++) {
            for (int64_t j = 0; j < m * n; j++)
                y[j] = POISON;
            CHECK(bn_w2a8_matmul(&w, &xq, y, n, pools[t], NULL) == BN_OK);
            int diff = 0;
            for (int64_t j = 0; j < m * n; j++)
                diff += !same_bits(y[j], ref[j]);
            CHECK_MSG(diff == 0, "%s, %d threads: %d of %lld outputs differ (n=%lld k=%lld m=%lld)",
                      p->name, bn_threadpool_size(pools[t]), diff, (long long)(m * n),
                      (long long)n, (long long)k, (long long)m);
        }
        bn_w2a8_weights_free(&w);
    }
    bn_w2a8_weights_free(&wref);
    bn_q8_rows_free(&xq);
    free(codes);
    free(x);
    free(ref);
    free(y);
}

/* A group of products of one input (q, k, v in one job of the pool) on
 * ragged row counts: every output equals its own product's, bit for bit,
 * for any thread count, and nothing outside the outputs is written. */
static void check_group(int64_t k, int64_t m, bn_threadpool *pools[3])
{
    enum { COUNT = 3 };
    int64_t n[COUNT];
    int8_t *codes[COUNT];
    bn_w2a8_weights w[COUNT];
    float *ref[COUNT], *y[COUNT];
    float *x = malloc((size_t)(m * k) * sizeof *x);
    random_activations(x, m * k);
    bn_q8_rows xq;
    CHECK(bn_q8_rows_alloc(&xq, m, k, NULL) == BN_OK);
    bn_w2a8_quantize(&bn_provider_scalar, x, m, k, &xq);
    const bn_kernel_provider *best = &bn_provider_scalar;
    CHECK(bn_kernel_select(&best, NULL) == BN_OK);
    for (int i = 0; i < COUNT; i++) {
        n[i] = test_rand_range(1, 90);
        codes[i] = malloc((size_t)(n[i] * k));
        random_codes(codes[i], n[i] * k);
        CHECK(bn_w2a8_pack(best, codes[i], n[i], k, test_rand_float(0.01f, 2.0f), &w[i], NULL) ==
              BN_OK);
        ref[i] = malloc((size_t)(m * n[i] + 1) * sizeof(float));
        y[i] = malloc((size_t)(m * n[i] + 1) * sizeof(float));
        CHECK(bn_w2a8_matmul(&w[i], &xq, ref[i], n[i], NULL, NULL) == BN_OK);
    }
    const bn_w2a8_weights *wp[COUNT] = {&w[0], &w[1], &w[2]};
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < COUNT; i++)
            for (int64_t j = 0; j <= m * n[i]; j++)
                y[i][j] = POISON;
        CHECK(bn_w2a8_matmul_group(wp, COUNT, &xq, y, n, pools[t], NULL) == BN_OK);
        for (int i = 0; i < COUNT; i++) {
            int diff = 0;
            for (int64_t j = 0; j < m * n[i]; j++)
                diff += !same_bits(y[i][j], ref[i][j]);
            CHECK_MSG(diff == 0 && same_bits(y[i][m * n[i]], POISON),
                      "group, %d threads: product %d (n=%lld k=%lld m=%lld): %d outputs differ "
                      "or one past them was written",
                      bn_threadpool_size(pools[t]), i, (long long)n[i], (long long)k,
                      (long long)m, diff);
        }
    }
    for (int i = 0; i < COUNT; i++) {
        bn_w2a8_weights_free(&w[i]);
        free(codes[i]);
        free(ref[i]);
        free(y[i]);
    }
    bn_q8_rows_free(&xq);
    free(x);
}

/* ---- the screened LM head's kernels and bound (head_screen.h) ---- */
/*
 *   - every integer dot product kernel the CPU has gives the exact integer
 *     sum, on random codes with the extremes +-127;
 *   - the bounds hold: for random heads and hidden states of every scale,
 *     lo <= the row's logit <= hi, with the logit summed in fp32 in two
 *     different orders (the bound covers any) and in double;
 *   - rows the bound does not cover (all zero, tiny, inf, NaN weights) and
 *     hidden states with NaN or inf make every row a candidate.
 */
/* A head for the screen to copy: rows of a float matrix. */
typedef struct float_head {
    const float *w;
    int64_t dim;
} float_head;

static void float_row(void *ctx, int64_t r, float *out)
{
    const float_head *h = ctx;
    memcpy(out, h->w + r * h->dim, (size_t)h->dim * sizeof(float));
}

static void alloc_x(const bn_head_screen *s, bn_head_screen_x *hx)
{
    hx->y = bn_aligned_alloc(64, (size_t)s->lda);
    hx->y_u8 = bn_aligned_alloc(64, (size_t)s->lda);
}

static void free_x(bn_head_screen_x *hx)
{
    bn_aligned_free(hx->y);
    bn_aligned_free(hx->y_u8);
}

/* The screen of a vocab x dim float head, and x quantized for it. */
static void screen_of(const float *w, int64_t vocab, int64_t dim, const float *x,
                      bn_head_screen *s, bn_head_screen_x *hx)
{
    float_head fh = {w, dim};
    float *scratch = malloc((size_t)dim * sizeof *scratch);
    CHECK(bn_head_screen_alloc(s, vocab, dim, NULL) == BN_OK);
    bn_head_screen_fill(s, 0, vocab, float_row, &fh, scratch);
    alloc_x(s, hx);
    bn_head_screen_quantize(s, x, hx);
    free(scratch);
}

/* Every kernel the CPU has equals the plain integer sum. */
static void test_screen_kernels(void)
{
    const int64_t vocab = test_rand_range(1, 40), dim = test_rand_range(1, 700);
    float *w = malloc((size_t)(vocab * dim) * sizeof *w);
    float *x = malloc((size_t)dim * sizeof *x);
    for (int64_t i = 0; i < vocab * dim; i++)
        w[i] = test_rand_range(0, 9) == 0 ? (test_rand_range(0, 1) ? 1.0f : -1.0f)
                                          : test_rand_float(-1.0f, 1.0f);
    for (int64_t i = 0; i < dim; i++)
        x[i] = test_rand_range(0, 9) == 0 ? (test_rand_range(0, 1) ? 3.0f : -3.0f)
                                          : test_rand_float(-3.0f, 3.0f);
    bn_head_screen s;
    bn_head_screen_x hx;
    screen_of(w, vocab, dim, x, &s, &hx);
    static const char *const names[] = {"scalar", "avx2", "avx512vnni", "neon", "neondot"};
    static bool listed = false;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if (!bn_head_screen_force_kernel(&s, names[k]))
            continue;
        if (!listed)
            printf("head screen kernel checked: %s\n", names[k]);
        int bad = 0;
        for (int64_t r = 0; r < vocab; r++) {
            int32_t want = 0;
            for (int64_t i = 0; i < dim; i++)
                want += (int32_t)s.codes[r * s.lda + i] * hx.y[i];
            bad += bn_head_screen_dot(&s, r, &hx) != want;
        }
        CHECK_MSG(bad == 0, "%s: %d of %lld integer sums wrong (dim %lld)", names[k], bad,
                  (long long)vocab, (long long)dim);
    }
    listed = true;
    CHECK(bn_head_screen_force_kernel(&s, "scalar"));
    CHECK(!bn_head_screen_force_kernel(&s, "sse9"));
    free_x(&hx);
    bn_head_screen_free(&s);
    free(w);
    free(x);
}

/* lo <= logit <= hi for the logit in fp32 forwards, fp32 backwards and
 * double; scale: the weights' and activations' magnitude. */
static void test_bounds(float scale)
{
    const int64_t vocab = test_rand_range(1, 60), dim = test_rand_range(1, 3000);
    float *w = malloc((size_t)(vocab * dim) * sizeof *w);
    float *x = malloc((size_t)dim * sizeof *x);
    for (int64_t i = 0; i < vocab * dim; i++)
        w[i] = test_rand_float(-1.0f, 1.0f) * scale;
    for (int64_t i = 0; i < dim; i++)
        x[i] = test_rand_float(-1.0f, 1.0f) * scale * (test_rand_range(0, 20) == 0 ? 50.0f : 1.0f);
    bn_head_screen s;
    bn_head_screen_x hx;
    screen_of(w, vocab, dim, x, &s, &hx);
    double *lo = malloc((size_t)vocab * sizeof *lo), *hi = malloc((size_t)vocab * sizeof *hi);
    bn_head_screen_bounds(&s, &hx, 0, vocab, lo, hi);
    int bad = 0;
    for (int64_t r = 0; r < vocab; r++) {
        float fwd = 0.0f, bwd = 0.0f;
        double exact = 0.0;
        for (int64_t i = 0; i < dim; i++) {
            fwd += w[r * dim + i] * x[i];
            bwd += w[r * dim + dim - 1 - i] * x[dim - 1 - i];
            exact += (double)w[r * dim + i] * x[i];
        }
        const bool ok = lo[r] <= fwd && fwd <= hi[r] && lo[r] <= bwd && bwd <= hi[r] &&
                        lo[r] <= exact && exact <= hi[r] && isfinite(lo[r]) && isfinite(hi[r]);
        if (!ok && bad++ == 0)
            fprintf(stderr, "row %lld: %.9g not in [%.9g, %.9g]\n", (long long)r, (double)fwd,
                    lo[r], hi[r]);
    }
    CHECK_MSG(bad == 0, "scale %g, dim %lld: %d of %lld rows outside their bounds",
              (double)scale, (long long)dim, bad, (long long)vocab);
    free(lo);
    free(hi);
    free_x(&hx);
    bn_head_screen_free(&s);
    free(w);
    free(x);
}

/* Rows and hidden states the bound does not cover: always candidates. */
static void test_uncovered(void)
{
    const int64_t vocab = 6, dim = 70;
    float *w = calloc((size_t)(vocab * dim), sizeof *w);
    float x[70];
    for (int64_t i = 0; i < vocab * dim; i++)
        w[i] = test_rand_float(-1.0f, 1.0f);
    for (int64_t i = 0; i < dim; i++) {
        x[i] = test_rand_float(-1.0f, 1.0f);
        w[0 * dim + i] = 0.0f;  /* row 0: all zero  */
        w[1 * dim + i] *= 1e-35f; /* row 1: tiny  */
        w[4 * dim + i] = w[5 * dim + i]; /* rows 4 and 5: equal */
    }
    w[2 * dim + 5] = INFINITY; /* row 2 */
    w[3 * dim + 9] = NAN;      /* row 3 */
    bn_head_screen s;
    bn_head_screen_x hx;
    screen_of(w, vocab, dim, x, &s, &hx);
    double lo[6], hi[6];
    bn_head_screen_bounds(&s, &hx, 0, vocab, lo, hi);
    for (int r = 0; r < 4; r++)
        CHECK_MSG(lo[r] == -INFINITY && hi[r] == INFINITY, "row %d is not always a candidate", r);
    CHECK(lo[4] == lo[5] && hi[4] == hi[5] && lo[4] < hi[4]); /* ties stay together */
    x[7] = NAN;
    bn_head_screen_quantize(&s, x, &hx);
    bn_head_screen_bounds(&s, &hx, 0, vocab, lo, hi);
    int open = 0;
    for (int r = 0; r < 6; r++)
        open += lo[r] == -INFINITY && hi[r] == INFINITY;
    CHECK_MSG(open == 6, "a NaN in the hidden state leaves %d of 6 rows candidates", open);
    free_x(&hx);
    bn_head_screen_free(&s);
    free(w);
}

static void test_errors(void)
{
    bn_w2a8_weights w;
    bn_error e;
    int8_t bad[4] = {0, 1, 2, -1};
    CHECK(bn_w2a8_pack(&bn_provider_scalar, bad, 1, 4, 1.0f, &w, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "code 2");
    CHECK(bn_w2a8_pack(&bn_provider_scalar, bad, 0, 4, 1.0f, &w, &e) == BN_ERR_INVALID_ARGUMENT);
    int8_t ok[4] = {0, 1, -1, 0};
    CHECK(bn_w2a8_pack(&bn_provider_scalar, ok, 1, 4, 1.0f, &w, &e) == BN_OK);
    bn_q8_rows x;
    CHECK(bn_q8_rows_alloc(&x, 1, 8, &e) == BN_OK);
    float y[1];
    CHECK(bn_w2a8_matmul(&w, &x, y, 1, NULL, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "columns");
    const bn_w2a8_weights *group[5] = {&w, &w, &w, &w, &w};
    float *ys[5] = {y, y, y, y, y};
    const int64_t ld[5] = {1, 1, 1, 1, 1};
    CHECK(bn_w2a8_matmul_group(group, 5, &x, ys, ld, NULL, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "5 products");
    bn_q8_rows_free(&x);
    bn_w2a8_weights_free(&w);
}

static void test_manager(void)
{
    const bn_kernel_provider *const *list;
    int n = bn_kernel_providers(&list);
    CHECK(n >= 1);
    CHECK(strcmp(list[n - 1]->name, "scalar") == 0);
#if defined(BITNET_HAVE_CUDA)
    CHECK(list[0] == &bn_provider_cuda && list[0]->runs_on_device);
#endif
    for (int i = 1; i < n; i++)
        CHECK(list[i - 1]->priority > list[i]->priority);
    const bn_kernel_provider *chosen = NULL;
    CHECK(bn_kernel_select(&chosen, NULL) == BN_OK && chosen && chosen->is_available());
    const char *forced = getenv("BITNET_KERNEL");
    if (forced && chosen) {
        CHECK(strcmp(chosen->name, forced) == 0);
    } else if (chosen) {
        for (int i = 0; i < n && list[i] != chosen; i++) /* no better CPU provider skipped */
            CHECK(list[i]->runs_on_device || !list[i]->is_available());
        CHECK(!chosen->runs_on_device);
    }
    CHECK(bn_kernel_by_name("scalar") == &bn_provider_scalar);
    CHECK(bn_kernel_by_name("nope") == NULL);
    CHECK(strstr(bn_kernel_compiled_names(), "scalar") != NULL);
#if defined(__x86_64__)
    const bn_cpu_features *f = bn_cpu_features_get();
    CHECK(bn_provider_avx2.is_available() == f->avx2);
    CHECK(bn_provider_avx512vnni.is_available() == (f->avx512f && f->avx512bw && f->avx512vnni));
#endif
    printf("providers: %s; selected %s\n", bn_kernel_compiled_names(),
           chosen ? chosen->name : "(none)");
}

int main(void)
{
    test_seed_init();
    test_quantize_rules();
    test_errors();
    test_manager();

    const bn_kernel_provider *const *list;
    int count = bn_kernel_providers(&list);
    for (int i = 0; i < count; i++)
        if (list[i]->is_available()) {
            test_quantizers(list[i]);
            test_norm_quantizers(list[i]);
        }

    bn_threadpool *pools[3] = {NULL, NULL, NULL};
    CHECK(bn_threadpool_create(1, &pools[0], NULL) == BN_OK);
    CHECK(bn_threadpool_create(2, &pools[1], NULL) == BN_OK);
    CHECK(bn_threadpool_create(3, &pools[2], NULL) == BN_OK);

    /* Shapes that hit every tail: k around multiples of 4/64/256, n not a
     * multiple of 4 or 16, and the 2B-4T row length. */
    const int64_t ks[] = {1, 3, 4, 63, 64, 65, 255, 256, 257, 511, 640, 1000, 2560};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (int64_t m = 1; m <= 17; m += (m < 5 ? 1 : 4))
            check_problem(test_rand_range(1, 70), ks[i], m, pools);
    for (int iter = 0; iter < 60; iter++)
        check_problem(test_rand_range(1, 200), test_rand_range(1, 1500), test_rand_range(1, 17),
                      pools);
    for (int iter = 0; iter < 20; iter++)
        check_group(test_rand_range(1, 700), test_rand_range(1, 9), pools);
    for (int i = 0; i < 20; i++)
        test_screen_kernels();
    static const float scales[] = {1e-3f, 0.05f, 1.0f, 30.0f, 1e4f};
    for (int i = 0; i < 40; i++)
        test_bounds(scales[i % 5]);
    test_uncovered();

    for (int t = 0; t < 3; t++)
        bn_threadpool_destroy(pools[t]);
    TEST_EXIT();
}
