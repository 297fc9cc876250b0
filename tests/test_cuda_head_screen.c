/* GPU test: the screened LM head (bn_cb_head_quantize, _screen, _exact;
 * head_screen.cu) against the full head (bn_cb_head_gemv) on the same
 * weights and x, for F32, F16 and BF16 rows:
 *
 *   - the greedy token (bn_cuda_sample_greedy) over the screened logits is
 *     the one over the full logits;
 *   - every screened logit is either the full head's bit for bit or -inf,
 *     and a -inf row's full logit is finite and strictly below the largest
 *     (so dropping it cannot change the argmax or a tie);
 *   - the logits are poisoned with NaN first, so a row the exact pass did
 *     not write fails the check above; a guard value past the last row must
 *     survive.
 *
 * Cases: random rows (vector and scalar paths, partial blocks, a
 * vocabulary-sized head); near ties (copies of the best row with one weight
 * nudged by one ulp, and exact copies: the lowest index must win); rows the
 * bound cannot be trusted for (NaN, inf, all zero, tiny); x with a NaN or an
 * inf (every row recomputed: the full head's logits); grids sized for one
 * SM (every kernel's grid-stride loop). Prints how many rows
 * each case recomputed. Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_kernels.h"
#include "fp16.h"
#include "sample_cuda.h"
#include "test_util.h"
#include "test_util_cuda.h"

static const char *const type_names[] = {"f32", "f16", "bf16"};

enum { ROWS_RANDOM, ROWS_NEAR_TIES, ROWS_UNTRUSTED };
enum { X_RANDOM, X_NAN, X_INF };

static int sm_count;

static void put(void *w, int type, int64_t i, float v)
{
    if (type == BN_CB_HEAD_F32)
        ((float *)w)[i] = v;
    else if (type == BN_CB_HEAD_F16)
        ((uint16_t *)w)[i] = bn_fp32_to_fp16(v);
    else
        ((uint16_t *)w)[i] = bn_fp32_to_bf16(v);
}

/* The next representable value above element i (one ulp of its type). */
static void nudge(void *w, int type, int64_t i)
{
    if (type == BN_CB_HEAD_F32) {
        ((float *)w)[i] = nextafterf(((float *)w)[i], INFINITY);
    } else {
        uint16_t *h = (uint16_t *)w + i;
        const int neg = *h & 0x8000;
        if ((*h & 0x7fff) == 0)
            *h = 1; /* +-0 -> smallest positive */
        else
            *h = (uint16_t)(neg ? *h - 1 : *h + 1);
    }
}

static int cmp_desc(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The k-th largest of n logits (NaN counting as -inf, as the samplers
 * take it); -inf when n < k. */
static float kth_largest(const float *v, int64_t n, int k)
{
    if (n < k)
        return -INFINITY;
    float *c = malloc((size_t)n * sizeof(float));
    if (!c) {
        fprintf(stderr, "FAIL: no host memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++)
        c[i] = isnan(v[i]) ? -INFINITY : v[i];
    qsort(c, (size_t)n, sizeof(float), cmp_desc);
    const float t = c[k - 1];
    free(c);
    return t;
}

/* top_k: the exact pass computes every row that can be among the top_k
 * largest logits (1: the argmax), read from device memory. */
static void check_case(int type, int64_t rows, int64_t dim, int rows_kind, int x_kind,
                       const char *what, int top_k)
{
    const size_t esize = type == BN_CB_HEAD_F32 ? 4 : 2;
    const size_t wbytes = (size_t)rows * (size_t)dim * esize;
    void *w = malloc(wbytes);
    float *x = malloc((size_t)dim * sizeof(float));
    float *full = malloc((size_t)(rows + 1) * sizeof(float));
    float *scr = malloc((size_t)(rows + 1) * sizeof(float));
    if (!w || !x || !full || !scr) {
        fprintf(stderr, "FAIL: no host memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < rows * dim; i++)
        put(w, type, i, test_rand_float(-0.1f, 0.1f));
    for (int64_t i = 0; i < dim; i++)
        x[i] = test_rand_float(-2.0f, 2.0f);
    if (rows_kind == ROWS_NEAR_TIES && rows >= 8) {
        /* Rows 1..n copy row 0 aligned with x (so it is likely the best);
         * odd rows get one weight nudged up by one ulp, even ones are
         * exact copies (a tie: the lowest index wins). */
        for (int64_t i = 0; i < dim; i++)
            put(w, type, i, x[i] > 0 ? 0.1f : -0.1f);
        const int64_t n = rows < 40 ? rows - 1 : 39;
        for (int64_t r = 1; r <= n; r++) {
            memcpy((char *)w + (size_t)r * dim * esize, w, (size_t)dim * esize);
            if (r % 2)
                nudge(w, type, r * dim + (r * 7) % dim);
        }
    } else if (rows_kind == ROWS_UNTRUSTED && rows >= 8) {
        put(w, type, 1 * dim + 3, NAN);
        put(w, type, 2 * dim + 0, INFINITY);
        put(w, type, 3 * dim + 5, -INFINITY);
        for (int64_t i = 0; i < dim; i++) {
            put(w, type, 4 * dim + i, 0.0f);
            /* tiny row: below 2^-100 in f32 / bf16; f16 cannot hold it (0) */
            put(w, type, 5 * dim + i, i % 3 ? 1e-35f : -1e-35f);
        }
    }
    if (x_kind == X_NAN)
        x[dim / 2] = NAN;
    else if (x_kind == X_INF)
        x[dim - 1] = INFINITY;

    const int n_part = bn_cb_head_screen_blocks(rows, sm_count);
    void *d_w, *d_ws;
    float *d_x, *d_full, *d_scr, *d_se, *d_upper, *d_part;
    int8_t *d_q;
    int32_t *d_tok, *d_k;
    double *d_u;
    uint64_t *d_cand;
    unsigned *d_cand_n;
    float *d_floor;
    CUDA_OK(cudaMalloc((void **)&d_floor, sizeof(float)));
    CUDA_OK(cudaMemset(d_floor, 0xff, sizeof(float))); /* poison (NaN): the exact pass sets it */
    CUDA_OK(cudaMalloc((void **)&d_cand, BN_CUDA_SAMPLE_MAX_CAND * sizeof(uint64_t)));
    CUDA_OK(cudaMalloc((void **)&d_cand_n, sizeof(unsigned)));
    CUDA_OK(cudaMemset(d_cand_n, 0x55, sizeof(unsigned))); /* poison: the screen empties it */
    unsigned long long *d_best;
    CUDA_OK(cudaMalloc(&d_w, wbytes));
    CUDA_OK(cudaMalloc((void **)&d_k, sizeof(int32_t)));
    CUDA_OK(cudaMemcpy(d_k, &top_k, sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_u, sizeof(double)));
    CUDA_OK(cudaMalloc((void **)&d_best, sizeof *d_best));
    CUDA_OK(cudaMemset(d_best, 0x55, sizeof *d_best)); /* poison: the screen sets it */
    CUDA_OK(cudaMalloc((void **)&d_x, (size_t)dim * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_full, (size_t)(rows + 1) * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_scr, (size_t)(rows + 1) * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_q, (size_t)rows * (size_t)dim));
    CUDA_OK(cudaMalloc((void **)&d_se, (size_t)rows * 2 * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_upper, (size_t)rows * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_part, (size_t)n_part * sizeof(float)));
    CUDA_OK(cudaMalloc(&d_ws, bn_cuda_sample_workspace_bytes((int32_t)rows)));
    CUDA_OK(cudaMemset(d_ws, 0, bn_cuda_sample_workspace_bytes((int32_t)rows)));
    CUDA_OK(cudaMalloc((void **)&d_tok, 17 * sizeof(int32_t)));
    CUDA_OK(cudaMemcpy(d_w, w, wbytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_x, x, (size_t)dim * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_full, 0xff, (size_t)rows * sizeof(float))); /* NaN */
    CUDA_OK(cudaMemset(d_scr, 0xff, (size_t)rows * sizeof(float)));
    CUDA_OK(cudaMemset(d_upper, 0xff, (size_t)rows * sizeof(float)));
    const float guard = 12345.0f;
    CUDA_OK(cudaMemcpy(d_scr + rows, &guard, sizeof guard, cudaMemcpyHostToDevice));

    CUDA_OK(bn_cb_head_prepare(type, dim));
    CUDA_OK(bn_cb_head_screen_prepare(type, dim));
    CUDA_OK(bn_cb_head_gemv(d_w, type, rows, dim, d_x, d_full, sm_count, 0));
    CUDA_OK(bn_cuda_sample_greedy(d_full, (int32_t)rows, d_ws, d_tok, NULL, 0));
    CUDA_OK(bn_cb_head_quantize(d_w, type, rows, dim, d_q, d_se, 0));
    /* Every second screen launched with PDL (as the decode step runs it):
     * the same results. */
    static int screens;
    const int pdl = (screens++ & 1) && bn_cb_pdl_supported(0);
    CUDA_OK(bn_cb_head_screen(d_q, d_se, rows, dim, d_x, d_upper, d_part, d_best, d_cand_n,
                              sm_count, pdl, 0));
    CUDA_OK(bn_cb_head_exact(d_w, type, rows, dim, d_x, d_upper, d_part, n_part,
                             top_k > 1 ? d_k : NULL, d_scr, d_best, d_cand, d_cand_n,
                             BN_CUDA_SAMPLE_MAX_CAND, d_floor, sm_count, pdl, 0));
    CUDA_OK(bn_cuda_sample_greedy(d_scr, (int32_t)rows, d_ws, d_tok + 1, NULL, 0));
    /* With a top-k, the sampler's pick over the screened logits is its
     * pick over the full ones, for a few uniform numbers: over the logits,
     * over the exact pass's candidate list (all of it, and only its keys at
     * or above the exact pass's floor), and over the logits again when the
     * list is taken to have overflowed (a cap of 1). */
    const double us[3] = {0.05, 0.5, 0.97};
    const bn_cuda_sample_params sp = {0.8f, top_k, 0.95f, 0.0f};
    const bool sampled = top_k > 1 && top_k <= BN_CUDA_SAMPLE_MAX_K;
    for (int i = 0; i < 3 && sampled; i++) {
        int32_t *t = d_tok + 2 + 5 * i;
        CUDA_OK(cudaMemcpy(d_u, &us[i], sizeof(double), cudaMemcpyHostToDevice));
        CUDA_OK(bn_cuda_sample_cand(d_full, (int32_t)rows, NULL, NULL, 0, NULL, &sp, d_u, d_ws, t,
                                    NULL, 0));
        CUDA_OK(bn_cuda_sample_cand(d_scr, (int32_t)rows, NULL, NULL, 0, NULL, &sp, d_u, d_ws,
                                    t + 1, NULL, 0));
        CUDA_OK(bn_cuda_sample_cand(d_scr, (int32_t)rows, d_cand, d_cand_n,
                                    BN_CUDA_SAMPLE_MAX_CAND, NULL, &sp, d_u, d_ws, t + 2, NULL,
                                    0));
        CUDA_OK(bn_cuda_sample_cand(d_scr, (int32_t)rows, d_cand, d_cand_n,
                                    BN_CUDA_SAMPLE_MAX_CAND, d_floor, &sp, d_u, d_ws, t + 3,
                                    NULL, 0));
        CUDA_OK(bn_cuda_sample_cand(d_scr, (int32_t)rows, d_cand, d_cand_n, 1, d_floor, &sp, d_u,
                                    d_ws, t + 4, NULL, 0));
    }
    CUDA_OK(cudaDeviceSynchronize());
    int32_t tok[17];
    CUDA_OK(cudaMemcpy(tok, d_tok, sizeof tok, cudaMemcpyDeviceToHost));
    unsigned listed = 0;
    CUDA_OK(cudaMemcpy(&listed, d_cand_n, sizeof listed, cudaMemcpyDeviceToHost));
    int sample_diff = 0;
    for (int i = 0; i < 3 && sampled; i++)
        for (int j = 1; j < 5; j++)
            sample_diff += tok[2 + 5 * i] != tok[2 + 5 * i + j];
    CHECK_MSG(sample_diff == 0,
              "%s %lld x %lld %s, top-k %d: %d of 12 sampled picks differ from the full head's",
              type_names[type], (long long)rows, (long long)dim, what, top_k, sample_diff);
    unsigned long long key;
    CUDA_OK(cudaMemcpy(&key, d_best, sizeof key, cudaMemcpyDeviceToHost));
    /* The two kernels' own argmax (the key) is the sampler's over the full
     * logits too. */
    CHECK_MSG(bn_cuda_key_token(key) == tok[0],
              "%s %lld x %lld %s: the screened head's key gives token %d, the full head's "
              "argmax %d",
              type_names[type], (long long)rows, (long long)dim, what, bn_cuda_key_token(key),
              tok[0]);
    CUDA_OK(cudaMemcpy(full, d_full, (size_t)rows * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(scr, d_scr, (size_t)(rows + 1) * sizeof(float),
                       cudaMemcpyDeviceToHost));

    /* The top_k-th largest full logit (NaN never counts; with top_k 1 the
     * largest, as the argmax sees it): a dropped row must be below it. */
    const float best = kth_largest(full, rows, top_k);
    /* The floor the exact pass leaves: the top k's logits all reach it. */
    float floor_v;
    CUDA_OK(cudaMemcpy(&floor_v, d_floor, sizeof floor_v, cudaMemcpyDeviceToHost));
    CHECK_MSG(!isnan(floor_v) && floor_v <= best,
              "%s %lld x %lld %s, top-k %d: floor %g above the k-th largest logit %g",
              type_names[type], (long long)rows, (long long)dim, what, top_k, (double)floor_v,
              (double)best);
    int64_t kept = 0, bad = 0, first = -1;
    for (int64_t r = 0; r < rows; r++) {
        bool ok;
        if (scr[r] == -INFINITY && full[r] != -INFINITY)
            ok = isfinite(full[r]) && full[r] < best; /* dropped */
        else
            ok = memcmp(&scr[r], &full[r], sizeof(float)) == 0, kept++;
        if (!ok && bad++ == 0)
            first = r;
    }
    CHECK_MSG(tok[0] == tok[1], "%s %lld x %lld %s: screened token %d, full head's %d",
              type_names[type], (long long)rows, (long long)dim, what, tok[1], tok[0]);
    CHECK_MSG(bad == 0,
              "%s %lld x %lld %s: %lld rows wrong (first %lld: screened %.9g, full %.9g, "
              "best %.9g)",
              type_names[type], (long long)rows, (long long)dim, what, (long long)bad,
              (long long)first, first >= 0 ? scr[first] : 0.0, first >= 0 ? full[first] : 0.0,
              best);
    CHECK_MSG(scr[rows] == guard, "%s %lld x %lld %s: the value past the last row was written",
              type_names[type], (long long)rows, (long long)dim, what);
    /* The candidate list counts every row the exact pass computed: at
     * least the rows left above -inf, at most every row. */
    int64_t live = 0;
    for (int64_t r = 0; r < rows; r++)
        live += scr[r] > -INFINITY;
    CHECK_MSG((int64_t)listed >= live && (int64_t)listed <= rows,
              "%s %lld x %lld %s: %u candidates listed for %lld rows above -inf",
              type_names[type], (long long)rows, (long long)dim, what, listed, (long long)live);
    printf("%-4s %6lld x %-5lld %-22s top-%-2d token %6d: %s, %lld of %lld rows recomputed, "
           "%u listed\n",
           type_names[type], (long long)rows, (long long)dim, what, top_k, tok[1],
           bad || tok[0] != tok[1] || sample_diff ? "FAILED" : "as the full head",
           (long long)kept, (long long)rows, listed);
    cudaFree(d_w), cudaFree(d_x), cudaFree(d_full), cudaFree(d_scr), cudaFree(d_q);
    cudaFree(d_se), cudaFree(d_upper), cudaFree(d_part), cudaFree(d_ws), cudaFree(d_tok);
    cudaFree(d_best), cudaFree(d_k), cudaFree(d_u), cudaFree(d_cand), cudaFree(d_cand_n);
    cudaFree(d_floor);
    free(w), free(x), free(full), free(scr);
}

int main(void)
{
    const struct cudaDeviceProp prop = test_require_cuda(0, "");
    sm_count = prop.multiProcessorCount;
    static const int64_t shapes[][2] = {
        {1000, 2560}, /* 2B-4T rows: the vector paths */
        {77, 4104},   /* screen: scalar (4104 % 16); head: vector, two passes */
        {513, 256},   /* short rows, a partial last block */
        {33, 100},    /* scalar for the screen; f32 head vector */
        {9, 90},      /* scalar everywhere */
    };
    for (int type = BN_CB_HEAD_F32; type <= BN_CB_HEAD_BF16; type++) {
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const int64_t rows = shapes[i][0], dim = shapes[i][1];
            check_case(type, rows, dim, ROWS_RANDOM, X_RANDOM, "random", 1);
            check_case(type, rows, dim, ROWS_NEAR_TIES, X_RANDOM, "near ties", 1);
            check_case(type, rows, dim, ROWS_UNTRUSTED, X_RANDOM, "nan/inf/zero/tiny rows", 1);
        }
        check_case(type, 1000, 2560, ROWS_RANDOM, X_NAN, "x with a NaN", 1);
        check_case(type, 1000, 2560, ROWS_RANDOM, X_INF, "x with an inf", 1);
    }
    /* A vocabulary-sized head: more rows than the grids have warps (not in
     * the quick mode of the sanitizer runs: 20000 rows there). */
    const bool quick = getenv("BN_TEST_QUICK") && strcmp(getenv("BN_TEST_QUICK"), "0") != 0;
    const int64_t vocab = quick ? 20000 : 128256;
    check_case(BN_CB_HEAD_F16, vocab, 2560, ROWS_RANDOM, X_RANDOM, "vocabulary, random", 1);
    check_case(BN_CB_HEAD_F16, vocab, 2560, ROWS_NEAR_TIES, X_RANDOM, "vocabulary, near ties", 1);
    /* Grids sized for one SM: every kernel loops over its rows. */
    sm_count = 1;
    check_case(BN_CB_HEAD_BF16, 20000, 2560, ROWS_NEAR_TIES, X_RANDOM, "grids of one SM", 1);
    /* ... and a top-k larger than its 3 screen blocks: every row computed. */
    check_case(BN_CB_HEAD_BF16, 20000, 2560, ROWS_NEAR_TIES, X_RANDOM, "grids of one SM", 40);
    sm_count = prop.multiProcessorCount;

    /* Top k > 1 (the device sampler's top-k): every row that can be among
     * the k largest is computed, ties with the k-th included. */
    static const int ks[] = {2, 8, 40, 64, 500};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        check_case(BN_CB_HEAD_F16, 1000, 2560, ROWS_RANDOM, X_RANDOM, "random", ks[i]);
        check_case(BN_CB_HEAD_F32, 1000, 2560, ROWS_NEAR_TIES, X_RANDOM, "near ties", ks[i]);
        check_case(BN_CB_HEAD_BF16, 513, 256, ROWS_UNTRUSTED, X_RANDOM, "nan/inf/zero/tiny rows",
                   ks[i]);
    }
    check_case(BN_CB_HEAD_F16, vocab, 2560, ROWS_NEAR_TIES, X_RANDOM, "vocabulary, near ties", 40);
    check_case(BN_CB_HEAD_F16, 1000, 2560, ROWS_RANDOM, X_NAN, "x with a NaN", 40);
    /* Grids sized for 400 SMs: 1200 screen blocks, more partials than the
     * exact pass sorts (it ranks them instead). */
    sm_count = 400;
    check_case(BN_CB_HEAD_F16, vocab, 2560, ROWS_NEAR_TIES, X_RANDOM, "1200 partials", 40);
    sm_count = prop.multiProcessorCount;

    /* Bad arguments are refused. */
    float *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, 64));
    CHECK(bn_cb_head_quantize(d, BN_CB_HEAD_F16, 0, 8, (int8_t *)d, d, 0) ==
          cudaErrorInvalidValue);
    CHECK(bn_cb_head_quantize(d, 7, 1, 8, (int8_t *)d, d, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_head_screen(NULL, d, 1, 8, d, d, d, NULL, NULL, 1, 0, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_head_exact(d, BN_CB_HEAD_F16, 1, 8, d, d, d, 0, NULL, d, NULL, NULL, NULL, 0,
                           NULL, 1, 0, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_head_exact(d, BN_CB_HEAD_F16, 1, 8, d, d, d, 1, NULL, d, NULL, NULL,
                           (unsigned *)d, 4, NULL, 1, 0, 0) == cudaErrorInvalidValue); /* no list */
    const bn_cuda_sample_params sp = {0.8f, 4, 0.95f, 0.0f};
    CHECK(bn_cuda_sample_cand(d, 8, (uint64_t *)d, (unsigned *)d, BN_CUDA_SAMPLE_MAX_CAND + 1,
                              NULL, &sp, (double *)d, d, (int32_t *)d, NULL,
                              0) == cudaErrorInvalidValue);
    CHECK(bn_cb_head_screen_prepare(BN_CB_HEAD_F16, 0) == cudaErrorInvalidValue);
    cudaFree(d);
    TEST_EXIT();
}
