/* GPU test: the batched pass's greedy picks from the rows' first parts
 * (bn_cb_rows_pick, rows_head_pick.cu) for F16 and BF16 heads. For every
 * row the token must be the one the head GEMV's logits of that row
 * (bn_cb_head_gemv over the row's fp32 copy) give under the greedy rule:
 * the largest logit, NaN counted as -inf, -0 as +0, the lower token on a
 * tie. The rows come through bn_cb_rows_head_in (their first parts, fp32
 * copies and bound factors); the estimates stand in for the tensor cores'
 * GEMM of the first parts: the exact sums (double) moved by up to dim 2^-21
 * sum |hi w| (inside the bound the factor allows for that GEMM), at random
 * for some rows and against the winner for others (the winner's estimate
 * down, every other one up). The head has duplicate rows (ties), a row
 * with a NaN weight and one with an infinite weight; the inputs include a
 * row that norms to zeros and a row with an infinity. Tokens start
 * poisoned. One case moves a winner's estimate far outside its bound: the
 * pick must then differ, which shows that rows are ruled out at all.
 *
 * Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_kernels.h"
#include "fp16.h"
#include "test_util.h"
#include "test_util_cuda.h"

/* The greedy rule's order of (logit, token): true when a beats b. */
static int beats(float a, int32_t ia, float b, int32_t ib)
{
    if (a != a)
        a = -INFINITY;
    if (b != b)
        b = -INFINITY;
    return a > b || (a == b && ia < ib);
}

static int32_t greedy_token(const float *logits, int64_t vocab)
{
    int32_t best = 0;
    for (int32_t v = 1; v < (int32_t)vocab; v++)
        if (beats(logits[v], v, logits[best], best))
            best = v;
    return best;
}

static float head_at(const uint16_t *w, int type, int64_t i)
{
    return type == BN_CB_HEAD_F16 ? bn_fp16_to_fp32(w[i]) : bn_bf16_to_fp32(w[i]);
}

typedef enum { EST_RANDOM, EST_AGAINST_WINNER, EST_WINNER_OUT } est_mode;

static void check_pick(int type, int64_t vocab, int64_t dim, int64_t n, int sm_count, est_mode mode)
{
    const int form = type == BN_CB_HEAD_F16 ? BN_CB_ROWS_HEAD_F16 : BN_CB_ROWS_HEAD_BF16;
    const int parts = bn_cb_rows_head_parts(form);
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(vocab * dim));
    float *x = malloc(sizeof(float) * (size_t)(n * dim)),
          *r = malloc(sizeof(float) * (size_t)(n * dim));
    float *nw = malloc(sizeof(float) * (size_t)dim);
    int32_t *lrow = malloc(sizeof(int32_t) * (size_t)n);
    uint16_t *hin = malloc(sizeof(uint16_t) * (size_t)(n * parts * dim));
    float *back = malloc(sizeof(float) * (size_t)n),
          *est = malloc(sizeof(float) * (size_t)(n * vocab));
    float *logits = malloc(sizeof(float) * (size_t)vocab),
          *wmax = malloc(sizeof(float) * (size_t)vocab);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)n), *got = malloc(sizeof(int32_t) * (size_t)n);
    CHECK(w && x && r && nw && lrow && hin && back && est && logits && wmax && want && got);
    for (int64_t i = 0; i < vocab * dim; i++) {
        const float v = test_rand_float(-1.0f, 1.0f);
        w[i] = type == BN_CB_HEAD_F16 ? bn_fp32_to_fp16(v) : bn_fp32_to_bf16(v);
    }
    /* Ties: rows 7 and 3, vocab - 1 and 0 are the same; a NaN weight in
     * row 11, an infinite one (and a NaN, so that its logit is never +inf)
     * in row 12. */
    memcpy(w + 7 * dim, w + 3 * dim, sizeof(uint16_t) * (size_t)dim);
    memcpy(w + (vocab - 1) * dim, w, sizeof(uint16_t) * (size_t)dim);
    const uint16_t nan16 = type == BN_CB_HEAD_F16 ? 0x7e00 : 0x7fc0;
    w[11 * dim + dim / 2] = nan16;
    w[12 * dim + 1] = type == BN_CB_HEAD_F16 ? 0x7c00 : 0x7f80;
    w[12 * dim + 2] = nan16;
    for (int64_t i = 0; i < n * dim; i++) {
        x[i] = test_rand_float(-2.0f, 2.0f);
        r[i] = test_rand_float(-1.0f, 1.0f);
    }
    for (int64_t i = 0; i < dim; i++)
        nw[i] = test_rand_float(0.5f, 2.0f);
    for (int64_t k = 0; k < n; k++)
        lrow[k] = (int32_t)k;
    if (n > 2) {
        for (int64_t i = 0; i < dim; i++) /* row 1 norms to zeros */
            r[dim + i] = -x[dim + i];
        x[2 * dim + 5] = INFINITY; /* row 2: every logit NaN or inf */
    }
    if (n > 3) /* row 3 is row 0 again */
        memcpy(x + 3 * dim, x, sizeof(float) * (size_t)dim),
            memcpy(r + 3 * dim, r, sizeof(float) * (size_t)dim);
    if (n > 4) /* row 4 along head row 0, which likely wins, tied with row vocab - 1 */
        for (int64_t i = 0; i < dim; i++) {
            x[4 * dim + i] = head_at(w, type, i) < 0.0f ? -1.5f : 1.5f;
            r[4 * dim + i] = 0.0f;
        }

    uint16_t *dw;
    float *dx, *dr, *dnw, *dy, *dback, *dfactor, *dest, *dwmax, *dlog;
    unsigned *dcount;
    int32_t *dl, *dtok;
    void *dparts;
    unsigned long long *dbest;
    const int slices = bn_cb_rows_pick_slices(n, vocab, sm_count);
    CUDA_OK(cudaMalloc((void **)&dw, sizeof(uint16_t) * (size_t)(vocab * dim)));
    CUDA_OK(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(n * dim)));
    CUDA_OK(cudaMalloc((void **)&dr, sizeof(float) * (size_t)(n * dim)));
    CUDA_OK(cudaMalloc((void **)&dnw, sizeof(float) * (size_t)dim));
    CUDA_OK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)(n * dim)));
    CUDA_OK(cudaMalloc((void **)&dback, sizeof(float) * (size_t)n));
    CUDA_OK(cudaMalloc((void **)&dfactor, sizeof(float) * (size_t)n));
    CUDA_OK(cudaMalloc((void **)&dest, sizeof(float) * (size_t)(n * vocab)));
    CUDA_OK(cudaMalloc((void **)&dwmax, sizeof(float) * (size_t)vocab));
    CUDA_OK(cudaMalloc((void **)&dcount, sizeof(unsigned) * (size_t)n));
    CUDA_OK(cudaMalloc((void **)&dlog, sizeof(float) * (size_t)vocab));
    CUDA_OK(cudaMalloc((void **)&dl, sizeof(int32_t) * (size_t)n));
    CUDA_OK(cudaMalloc((void **)&dtok, sizeof(int32_t) * (size_t)n));
    CUDA_OK(cudaMalloc(&dparts, sizeof(uint16_t) * (size_t)(n * parts * dim)));
    CUDA_OK(cudaMalloc((void **)&dbest, sizeof(unsigned long long) * (size_t)n));
    CUDA_OK(cudaMemcpy(dw, w, sizeof(uint16_t) * (size_t)(vocab * dim), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dx, x, sizeof(float) * (size_t)(n * dim), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dr, r, sizeof(float) * (size_t)(n * dim), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dnw, nw, sizeof(float) * (size_t)dim, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dl, lrow, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    CUDA_OK(bn_cb_rows_head_in(dx, dr, dim, dim, dl, n, dnw, 1e-5f, form, dparts, dback, dy,
                               dfactor, 0));
    CUDA_OK(bn_cb_head_row_max(dw, type, vocab, dim, dwmax, 0));
    CUDA_OK(bn_cb_head_prepare(type, dim));
    CUDA_OK(bn_cb_rows_pick_prepare(type, dim));
    CUDA_OK(bn_cb_rows_pick_reset(dbest, dcount, n, 0));
    CUDA_OK(cudaMemcpy(hin, dparts, sizeof(uint16_t) * (size_t)(n * parts * dim),
                       cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(back, dback, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(wmax, dwmax, sizeof(float) * (size_t)vocab, cudaMemcpyDeviceToHost));
    CHECK(isinf(wmax[11]) && isinf(wmax[12]) && wmax[0] > 0.0f && wmax[0] <= 1.0f);

    /* The reference tokens: the GEMV over each row's fp32 copy. */
    for (int64_t k = 0; k < n; k++) {
        CUDA_OK(bn_cb_head_gemv(dw, type, vocab, dim, dy + k * dim, dlog, sm_count, 0));
        CUDA_OK(cudaMemcpy(logits, dlog, sizeof(float) * (size_t)vocab, cudaMemcpyDeviceToHost));
        want[k] = greedy_token(logits, vocab);
    }
    /* The estimates, before scaling back. */
    for (int64_t k = 0; k < n; k++) {
        const uint16_t *hi = hin + k * parts * dim;
        double H = 0.0;
        for (int64_t i = 0; i < dim; i++)
            H += fabs((double)head_at(hi, type, i));
        for (int64_t v = 0; v < vocab; v++) {
            double e = 0.0;
            for (int64_t i = 0; i < dim; i++)
                e += (double)head_at(hi, type, i) * (double)head_at(w, type, v * dim + i);
            const double room = isfinite(wmax[v]) ? (double)dim * 0x1p-21 * wmax[v] * H : 0.0;
            double move;
            if (mode == EST_RANDOM || k % 2 == 0)
                move = room * (2.0 * test_rand_float(0.0f, 1.0f) - 1.0);
            else
                move = v == want[k] ? -room : room;
            const bool always = n > 2 && (k == 1 || k == 2); /* see below */
            if (mode == EST_WINNER_OUT && v == want[k] && !always)
                move = -1e6 * (room + 1.0);
            est[k * vocab + v] = (float)(e + move);
        }
    }
    CUDA_OK(cudaMemcpy(dest, est, sizeof(float) * (size_t)(n * vocab), cudaMemcpyHostToDevice));
    /* Twice: a call leaves the keys and tickets as the next expects, so
     * the second call's tokens are the first's. */
    int32_t *first = malloc(sizeof(int32_t) * (size_t)n);
    CHECK(first);
    for (int call = 0; call < 2; call++) {
        CUDA_OK(cudaMemset(dtok, 0xa5, sizeof(int32_t) * (size_t)n)); /* poison */
        CUDA_OK(bn_cb_rows_pick(dw, type, vocab, dim, dest, dback, dfactor, dwmax, dy, n, slices,
                                dbest, dcount, dtok, 0));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(call ? got : first, dtok, sizeof(int32_t) * (size_t)n,
                           cudaMemcpyDeviceToHost));
    }
    int bad = 0, moved = 0;
    for (int64_t k = 0; k < n; k++)
        if (first[k] != got[k] && bad++ < 5)
            fprintf(stderr, "rows_pick: row %lld picked %d, then %d\n", (long long)k, first[k],
                    got[k]);
    free(first);
    for (int64_t k = 0; k < n; k++) {
        /* Rows whose winner is not moved: the zeros (every logit 0, the
         * estimates exact) and the infinity (no estimate trusted). */
        const bool always = n > 2 && (k == 1 || k == 2);
        if (mode == EST_WINNER_OUT && !always) {
            moved += got[k] != want[k];
            continue;
        }
        if (got[k] != want[k] && bad++ < 5)
            fprintf(stderr,
                    "rows_pick %s vocab %lld dim %lld n %lld mode %d: row %lld token %d, "
                    "want %d\n",
                    type == BN_CB_HEAD_F16 ? "f16" : "bf16", (long long)vocab, (long long)dim,
                    (long long)n, (int)mode, (long long)k, got[k], want[k]);
    }
    CHECK(bad == 0);
    if (mode == EST_WINNER_OUT)
        CHECK_MSG(moved > 0, "a winner estimated far below its bound was still picked: "
                             "nothing is ruled out");
    if (n > 3 && mode != EST_WINNER_OUT)
        CHECK(want[1] == 0 && want[3] == want[0]);
    printf("rows_pick %-4s vocab %6lld dim %5lld rows %3lld slices %3d %s: %s\n",
           type == BN_CB_HEAD_F16 ? "f16" : "bf16", (long long)vocab, (long long)dim, (long long)n,
           slices,
           mode == EST_RANDOM           ? "random estimates"
           : mode == EST_AGAINST_WINNER ? "estimates against the winner"
                                        : "winner far out of bound",
           bad                      ? "FAILED"
           : mode == EST_WINNER_OUT ? "winners ruled out"
                                    : "tokens as the GEMV's");

    /* Bad arguments are refused. */
    CHECK(bn_cb_rows_pick(dw, BN_CB_HEAD_F32, vocab, dim, dest, dback, dfactor, dwmax, dy, n,
                          slices, dbest, dcount, dtok, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_rows_pick(dw, type, vocab, dim, dest, dback, dfactor, dwmax, dy, n, 0, dbest,
                          dcount, dtok, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_rows_pick(dw, type, vocab, dim, NULL, dback, dfactor, dwmax, dy, n, slices, dbest,
                          dcount, dtok, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_rows_pick_reset(dbest, NULL, n, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_head_row_max(dw, BN_CB_HEAD_F32, vocab, dim, dwmax, 0) == cudaErrorInvalidValue);
    cudaFree(dw), cudaFree(dx), cudaFree(dr), cudaFree(dnw), cudaFree(dy), cudaFree(dback);
    cudaFree(dfactor), cudaFree(dest), cudaFree(dwmax), cudaFree(dcount), cudaFree(dlog);
    cudaFree(dl), cudaFree(dtok), cudaFree(dparts), cudaFree(dbest);
    free(w), free(x), free(r), free(nw), free(lrow), free(hin), free(back), free(est);
    free(logits), free(wmax), free(want), free(got);
}

int main(void)
{
    const struct cudaDeviceProp prop = test_require_cuda(0, "");
    const int sm = prop.multiProcessorCount;
    const int quick = getenv("BN_TEST_QUICK") != NULL;
    for (int type = BN_CB_HEAD_F16; type <= BN_CB_HEAD_BF16; type++) {
        /* vocab % 4 == 0: estimates four at a time; else one */
        check_pick(type, 3000, 256, 6, sm, EST_RANDOM);
        check_pick(type, 3000, 256, 6, sm, EST_AGAINST_WINNER);
        check_pick(type, 3000, 256, 6, sm, EST_WINNER_OUT);
        check_pick(type, 3001, 256, 6, sm, EST_AGAINST_WINNER);
        check_pick(type, 3001, 256, 6, sm, EST_WINNER_OUT);
        check_pick(type, 1501, 100, 5, sm, EST_AGAINST_WINNER); /* head rows of dim % 8 */
        check_pick(type, 1500, 100, 5, sm, EST_RANDOM);
        check_pick(type, 40, 64, 4, sm, EST_RANDOM); /* one slice */
        if (!quick)
            check_pick(type, 20012, 2560, 9, sm, EST_AGAINST_WINNER); /* 2B-4T rows */
    }
    TEST_EXIT();
}
