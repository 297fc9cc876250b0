/*
 * test_head_screen.c - the CPU's screened LM head (src/cpu/head_screen.h).
 *
 *   - every integer dot product kernel the CPU has gives the exact integer
 *     sum, on random codes with the extremes +-127;
 *   - the bounds hold: for random heads and hidden states of every scale,
 *     lo <= the row's logit <= hi, with the logit summed in fp32 in two
 *     different orders (the bound covers any) and in double;
 *   - rows the bound does not cover (all zero, tiny, inf, NaN weights) and
 *     hidden states with NaN or inf make every row a candidate;
 *   - through the CPU backend, on random models: the greedy token of
 *     forward_greedy and forward_rows_greedy equals the host's greedy rule
 *     over forward()'s full logits, at every step of a prompt and its
 *     continuation.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "head_screen.h"
#include "model.h"
#include "sampler.h"
#include "test_util.h"

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

/* Every kernel the CPU has equals the plain integer sum. */
static void test_kernels(void)
{
    const int64_t vocab = test_rand_range(1, 40), dim = test_rand_range(1, 700);
    float *w = malloc((size_t)(vocab * dim) * sizeof *w);
    float *x = malloc((size_t)dim * sizeof *x), *scratch = malloc((size_t)dim * sizeof *scratch);
    for (int64_t i = 0; i < vocab * dim; i++)
        w[i] = test_rand_range(0, 9) == 0 ? (test_rand_range(0, 1) ? 1.0f : -1.0f)
                                          : test_rand_float(-1.0f, 1.0f);
    for (int64_t i = 0; i < dim; i++)
        x[i] = test_rand_range(0, 9) == 0 ? (test_rand_range(0, 1) ? 3.0f : -3.0f)
                                          : test_rand_float(-3.0f, 3.0f);
    float_head fh = {w, dim};
    bn_head_screen s;
    CHECK(bn_head_screen_alloc(&s, vocab, dim, NULL) == BN_OK);
    bn_head_screen_fill(&s, 0, vocab, float_row, &fh, scratch);
    bn_head_screen_x hx;
    alloc_x(&s, &hx);
    bn_head_screen_quantize(&s, x, &hx);
    static const char *const names[] = {"scalar", "avx2", "avx512vnni"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if (!bn_head_screen_force_kernel(&s, names[k]))
            continue;
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
    CHECK(bn_head_screen_force_kernel(&s, "scalar"));
    CHECK(!bn_head_screen_force_kernel(&s, "sse9"));
    free_x(&hx);
    bn_head_screen_free(&s);
    free(w);
    free(x);
    free(scratch);
}

/* lo <= logit <= hi for the logit in fp32 forwards, fp32 backwards and
 * double; scale: the weights' and activations' magnitude. */
static void test_bounds(float scale)
{
    const int64_t vocab = test_rand_range(1, 60), dim = test_rand_range(1, 3000);
    float *w = malloc((size_t)(vocab * dim) * sizeof *w);
    float *x = malloc((size_t)dim * sizeof *x), *scratch = malloc((size_t)dim * sizeof *scratch);
    for (int64_t i = 0; i < vocab * dim; i++)
        w[i] = test_rand_float(-1.0f, 1.0f) * scale;
    for (int64_t i = 0; i < dim; i++)
        x[i] = test_rand_float(-1.0f, 1.0f) * scale * (test_rand_range(0, 20) == 0 ? 50.0f : 1.0f);
    float_head fh = {w, dim};
    bn_head_screen s;
    CHECK(bn_head_screen_alloc(&s, vocab, dim, NULL) == BN_OK);
    bn_head_screen_fill(&s, 0, vocab, float_row, &fh, scratch);
    bn_head_screen_x hx;
    alloc_x(&s, &hx);
    bn_head_screen_quantize(&s, x, &hx);
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
    free(scratch);
}

/* Rows and hidden states the bound does not cover: always candidates. */
static void test_uncovered(void)
{
    const int64_t vocab = 6, dim = 70;
    float *w = calloc((size_t)(vocab * dim), sizeof *w);
    float x[70], scratch[70];
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
    float_head fh = {w, dim};
    bn_head_screen s;
    CHECK(bn_head_screen_alloc(&s, vocab, dim, NULL) == BN_OK);
    bn_head_screen_fill(&s, 0, vocab, float_row, &fh, scratch);
    bn_head_screen_x hx;
    alloc_x(&s, &hx);
    bn_head_screen_quantize(&s, x, &hx);
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

/* The backend's greedy picks against the host's greedy rule on full logits. */
static void test_backend(int round)
{
    bn_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_head_kv = (int)test_rand_range(1, 2);
    hp.n_head = hp.n_head_kv * (int)test_rand_range(1, 3);
    hp.head_dim = 2 * (int)test_rand_range(2, 10);
    hp.dim = hp.n_head * hp.head_dim;
    hp.ffn = (int)test_rand_range(9, 120);
    hp.vocab = (int)test_rand_range(40, 3000);
    hp.n_layer = (int)test_rand_range(1, 2);
    hp.n_ctx_train = 64;
    hp.rope_dim = hp.head_dim;
    hp.rms_eps = 1e-5f;
    hp.rope_theta = 10000.0f;
    hp.tied_embeddings = test_rand_range(0, 1) != 0;
    bn_checkpoint *m = NULL;
    bn_error err;
    CHECK(bn_checkpoint_create_random(&hp, test_rand_u64(), &m, &err) == BN_OK);
    if (!m)
        return;
    bn_cpu_backend *full = NULL, *screened = NULL;
    const int threads = (int)test_rand_range(1, 3);
    CHECK(bn_cpu_backend_create_paged(m, 0, 64, threads, &full, &err) == BN_OK);
    CHECK(bn_cpu_backend_create_paged(m, 0, 64, threads, &screened, &err) == BN_OK);
    bn_sampler_params sp;
    bn_sampler_params_default(&sp);
    bn_sampler *greedy = NULL;
    CHECK(bn_sampler_create(&sp, hp.vocab, &greedy, &err) == BN_OK);
    float *logits = malloc((size_t)hp.vocab * sizeof *logits);
    if (full && screened && greedy && logits) {
        const int64_t n_prompt = test_rand_range(1, 20);
        int32_t tokens[64];
        for (int64_t i = 0; i < n_prompt; i++)
            tokens[i] = (int32_t)test_rand_range(0, hp.vocab - 1);
        int64_t pos = 0, n = n_prompt;
        int differ = 0, steps = 0;
        while (pos + n <= 40) {
            CHECK(bn_cpu_backend_forward(full, tokens + pos, n, pos, BN_LOGITS_LAST, logits,
                                         &err) == BN_OK);
            const int32_t want = bn_sampler_sample(greedy, logits, NULL, 0);
            int32_t got = -7;
            CHECK(bn_cpu_backend_forward_greedy(screened, tokens + pos, n, pos, &got, &err) ==
                  BN_OK);
            differ += got != want;
            steps++;
            pos += n;
            tokens[pos] = want >= 0 ? want : 0;
            n = 1;
        }
        CHECK_MSG(differ == 0, "round %d (vocab %d, dim %d): %d of %d greedy picks differ",
                  round, hp.vocab, hp.dim, differ, steps);

        /* Batches: two sequences in blocks of 8, the last row of each
         * picked, one at a time (the screen) and both together. */
        int32_t table0[4] = {0, 1, 2, 3}, table1[4] = {4, 5, 6, 7};
        const int32_t *tables[2] = {table0, table1};
        const int32_t table_len[2] = {4, 4};
        int32_t btok[12], bseq[12];
        int64_t bpos[12], logit_rows[2] = {5, 11};
        for (int i = 0; i < 12; i++) {
            btok[i] = (int32_t)test_rand_range(0, hp.vocab - 1);
            bseq[i] = i < 6 ? 0 : 1;
            bpos[i] = i < 6 ? i : i - 6;
        }
        bn_batch_rows rows = {.tokens = btok, .pos = bpos, .seq = bseq, .n_rows = 12,
                              .tables = tables, .table_len = table_len, .block_size = 8,
                              .logit_rows = logit_rows, .n_logits = 2};
        float *two = malloc((size_t)(2 * hp.vocab) * sizeof *two);
        int32_t picked[2] = {-7, -7};
        CHECK(bn_cpu_backend_forward_rows(full, &rows, two, &err) == BN_OK);
        CHECK(bn_cpu_backend_forward_rows_greedy(screened, &rows, picked, &err) == BN_OK);
        for (int k = 0; k < 2; k++)
            CHECK_MSG(picked[k] == bn_sampler_sample(greedy, two + k * hp.vocab, NULL, 0),
                      "round %d: batch row %d picked %d", round, k, picked[k]);
        rows.n_logits = 1;
        rows.logit_rows = &logit_rows[1];
        picked[0] = -7;
        CHECK(bn_cpu_backend_forward_rows_greedy(screened, &rows, picked, &err) == BN_OK);
        CHECK(bn_cpu_backend_forward_rows(full, &rows, two, &err) == BN_OK);
        CHECK(picked[0] == bn_sampler_sample(greedy, two, NULL, 0));
        free(two);
    }
    free(logits);
    bn_sampler_free(greedy);
    bn_cpu_backend_free(full);
    bn_cpu_backend_free(screened);
    bn_checkpoint_free(m);
}

int main(void)
{
    test_seed_init();
    for (int i = 0; i < 20; i++)
        test_kernels();
    static const float scales[] = {1e-3f, 0.05f, 1.0f, 30.0f, 1e4f};
    for (int i = 0; i < 40; i++)
        test_bounds(scales[i % 5]);
    test_uncovered();
    for (int round = 0; round < 12; round++)
        test_backend(round);
    TEST_EXIT();
}
