/* GPU test: the CUDA backend's LM head with fp32 activations
 * (bn_cb_head_gemv: the decode step's logits) for F32, F16 and BF16 weight
 * rows, against a double-precision CPU reference over the same weights:
 *
 *   - shapes with whole 16-byte rows (the vector path: dim % 4 for F32,
 *     dim % 8 for F16 / BF16), with rows that are not (the scalar path),
 *     rows of a single load per lane up to several passes (dim 2560 is 320
 *     loads of 16 bytes: one pass of the kernel's loads in flight; 4104
 *     takes two), row counts that are not multiples of a block's warps, and a
 *     vocabulary-sized row count;
 *   - logits poisoned with NaN first, with a guard value past the last row
 *     that must survive;
 *   - tolerance per logit: an fp32 sum of dim products in any order errs by
 *     at most (dim + 1) 2^-24 sum |w x| (the weights are exact in fp32, x is
 *     used as given), plus a tiny absolute term.
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

static const char *const type_names[] = {"f32", "f16", "bf16"};

/* The batched head's input (bn_cb_rows_head_in, rows_head.cu): rows picked
 * out of M rows of x + r in any order, normed, each row's parts side by
 * side; form F32 must equal bn_cb_add_rmsnorm's output exactly; the 16-bit
 * forms' parts must add up, times the row's factor, to it within 2^-20 of
 * each value (they keep 22 or 24 bits) plus a tiny share of the row's
 * largest; output rows past n_rows stay poisoned. The 16-bit forms also
 * write the rows themselves (bn_cb_add_rmsnorm's output bit for bit) and
 * each row's bound factor (finite, positive, and at least the distance
 * of the row from its first part, which it bounds). */
static void check_rows_head_in(int form, int64_t M, int64_t dim)
{
    const int parts = bn_cb_rows_head_parts(form);
    const int64_t n = M / 2 + 1, plane = (n + 1) * dim; /* room for one more row's parts */
    const size_t elem = form == BN_CB_ROWS_HEAD_F32 ? 4 : 2;
    float *x = malloc(sizeof(float) * (size_t)(M * dim)), *r = malloc(sizeof(float) * (size_t)(M * dim));
    float *w = malloc(sizeof(float) * (size_t)dim), *want = malloc(sizeof(float) * (size_t)(M * dim));
    int32_t *lrow = malloc(sizeof(int32_t) * (size_t)n);
    void *got = malloc(elem * (size_t)(parts * plane));
    float *scale = malloc(sizeof(float) * (size_t)(n + 1));
    CHECK(x && r && w && want && lrow && got && scale);
    for (int64_t i = 0; i < M * dim; i++) {
        x[i] = test_rand_float(-3.0f, 3.0f) * (i % 97 == 0 ? 100.0f : 1.0f);
        r[i] = test_rand_float(-1.0f, 1.0f) * (i % 13 == 0 ? 1e-6f : 1.0f);
    }
    for (int64_t i = 0; i < dim; i++)
        w[i] = test_rand_float(0.1f, 4.0f);
    for (int64_t k = 0; k < n; k++)
        lrow[k] = (int32_t)((k * 5 + 3) % M);
    float *dx, *dr, *dw, *dy, *dscale, *drow = NULL, *dfactor = NULL;
    float *rows = malloc(sizeof(float) * (size_t)(n * dim)),
          *factor = malloc(sizeof(float) * (size_t)n);
    CHECK(rows && factor);
    const bool sixteen = form != BN_CB_ROWS_HEAD_F32;
    if (sixteen) {
        CUDA_OK(cudaMalloc((void **)&drow, sizeof(float) * (size_t)(n * dim)));
        CUDA_OK(cudaMalloc((void **)&dfactor, sizeof(float) * (size_t)n));
        CUDA_OK(cudaMemset(drow, 0xff, sizeof(float) * (size_t)(n * dim)));
        CUDA_OK(cudaMemset(dfactor, 0xff, sizeof(float) * (size_t)n));
    }
    int32_t *dl;
    void *dparts;
    CUDA_OK(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(M * dim)));
    CUDA_OK(cudaMalloc((void **)&dr, sizeof(float) * (size_t)(M * dim)));
    CUDA_OK(cudaMalloc((void **)&dw, sizeof(float) * (size_t)dim));
    CUDA_OK(cudaMalloc((void **)&dy, sizeof(float) * (size_t)(M * dim)));
    CUDA_OK(cudaMalloc((void **)&dl, sizeof(int32_t) * (size_t)n));
    CUDA_OK(cudaMalloc(&dparts, elem * (size_t)(parts * plane)));
    CUDA_OK(cudaMalloc((void **)&dscale, sizeof(float) * (size_t)(n + 1)));
    CUDA_OK(cudaMemcpy(dx, x, sizeof(float) * (size_t)(M * dim), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dr, r, sizeof(float) * (size_t)(M * dim), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dw, w, sizeof(float) * (size_t)dim, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dl, lrow, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dparts, 0x7f, elem * (size_t)(parts * plane))); /* poison */
    CUDA_OK(cudaMemset(dscale, 0x7f, sizeof(float) * (size_t)(n + 1)));
    CUDA_OK(bn_cb_rows_head_in(dx, dr, dim, dim, dl, n, dw, 1e-5f, form, dparts, dscale, drow,
                               dfactor, 0));
    /* The reference: bn_cb_add_rmsnorm over every row (it adds r into x). */
    CUDA_OK(bn_cb_add_rmsnorm(dx, dim, dr, dim, M, dim, dw, 1e-5f, dy, dim, 0, 0));
    CUDA_OK(cudaMemcpy(want, dy, sizeof(float) * (size_t)(M * dim), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got, dparts, elem * (size_t)(parts * plane), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(scale, dscale, sizeof(float) * (size_t)(n + 1), cudaMemcpyDeviceToHost));
    if (sixteen) {
        CUDA_OK(cudaMemcpy(rows, drow, sizeof(float) * (size_t)(n * dim), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(factor, dfactor, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));
    }
    int bad = 0;
    for (int64_t k = 0; sixteen && k < n && bad < 5; k++) {
        const float *ref = want + (int64_t)lrow[k] * dim;
        double rest = 0.0;
        for (int64_t i = 0; i < dim; i++) {
            const uint16_t h = ((const uint16_t *)got)[k * parts * dim + i];
            const double hi = form == BN_CB_ROWS_HEAD_F16 ? bn_fp16_to_fp32(h) : bn_bf16_to_fp32(h);
            rest += fabs((double)ref[i] - hi * scale[k]);
        }
        if (memcmp(rows + k * dim, ref, sizeof(float) * (size_t)dim) != 0 ||
            !(factor[k] > 0.0f && isfinite(factor[k]) && factor[k] >= rest)) {
            fprintf(stderr,
                    "rows_head_in %s M=%lld dim=%lld: row %lld's fp32 copy or factor "
                    "%.9g (rest %.9g) wrong\n",
                    type_names[form], (long long)M, (long long)dim, (long long)k, (double)factor[k],
                    rest);
            bad++;
        }
    }
    for (int64_t k = 0; k < n && bad < 5; k++) {
        const float *ref = want + (int64_t)lrow[k] * dim;
        double big = 0.0;
        for (int64_t i = 0; i < dim; i++)
            big = fmax(big, fabs(ref[i]));
        for (int64_t i = 0; i < dim && bad < 5; i++) {
            double v = 0.0;
            for (int p = 0; p < parts; p++) {
                const int64_t at = (k * parts + p) * dim + i;
                if (form == BN_CB_ROWS_HEAD_F32)
                    v += ((const float *)got)[at];
                else if (form == BN_CB_ROWS_HEAD_F16)
                    v += bn_fp16_to_fp32(((const uint16_t *)got)[at]);
                else
                    v += bn_bf16_to_fp32(((const uint16_t *)got)[at]);
            }
            v *= scale[k];
            const double tol =
                form == BN_CB_ROWS_HEAD_F32 ? 0.0 : 0x1.0p-20 * fabs(ref[i]) + 0x1.0p-30 * big;
            if (!(fabs(v - ref[i]) <= tol)) {
                fprintf(stderr, "rows_head_in %s M=%lld dim=%lld: row %lld [%lld] %.9g, want %.9g\n",
                        type_names[form], (long long)M, (long long)dim, (long long)k, (long long)i,
                        v, (double)ref[i]);
                bad++;
            }
        }
    }
    CHECK(bad == 0);
    /* Row n's parts and its factor: not written. */
    const unsigned char *tail = (const unsigned char *)got + elem * (size_t)(n * parts * dim);
    CHECK(tail[0] == 0x7f && tail[elem * (size_t)(parts * dim) - 1] == 0x7f);
    CHECK(((const unsigned char *)scale)[4 * n] == 0x7f);
    CHECK(bn_cb_rows_head_in(dx, dr, dim, dim, dl, n, dw, 1e-5f, 3, dparts, dscale, NULL, NULL,
                             0) == cudaErrorInvalidValue);
    /* The rows and factors come together, and only with 16-bit parts. */
    CHECK(bn_cb_rows_head_in(dx, dr, dim, dim, dl, n, dw, 1e-5f, form, dparts, dscale, dy, NULL,
                             0) == cudaErrorInvalidValue);
    if (!sixteen)
        CHECK(bn_cb_rows_head_in(dx, dr, dim, dim, dl, n, dw, 1e-5f, form, dparts, dscale, dy,
                                 dscale, 0) == cudaErrorInvalidValue);
    cudaFree(drow);
    cudaFree(dfactor);
    free(rows);
    free(factor);
    cudaFree(dx);
    cudaFree(dr);
    cudaFree(dw);
    cudaFree(dy);
    cudaFree(dl);
    cudaFree(dparts);
    cudaFree(dscale);
    free(x);
    free(r);
    free(w);
    free(want);
    free(lrow);
    free(got);
    free(scale);
}

static void check_head(int type, int64_t rows, int64_t dim, int sm_count)
{
    const size_t esize = type == BN_CB_HEAD_F32 ? 4 : 2;
    void *w = malloc((size_t)rows * (size_t)dim * esize);
    float *wf = malloc((size_t)rows * (size_t)dim * sizeof(float)); /* w as the GPU reads it */
    float *x = malloc((size_t)dim * sizeof(float));
    float *got = malloc((size_t)(rows + 1) * sizeof(float));
    for (int64_t i = 0; i < rows * dim; i++) {
        const float v = test_rand_float(-1.0f, 1.0f);
        if (type == BN_CB_HEAD_F32) {
            ((float *)w)[i] = v;
            wf[i] = v;
        } else if (type == BN_CB_HEAD_F16) {
            ((uint16_t *)w)[i] = bn_fp32_to_fp16(v);
            wf[i] = bn_fp16_to_fp32(((uint16_t *)w)[i]);
        } else {
            ((uint16_t *)w)[i] = bn_fp32_to_bf16(v);
            wf[i] = bn_bf16_to_fp32(((uint16_t *)w)[i]);
        }
    }
    for (int64_t i = 0; i < dim; i++)
        x[i] = test_rand_float(-2.0f, 2.0f);

    void *d_w;
    float *d_x, *d_logits;
    CUDA_OK(cudaMalloc(&d_w, (size_t)rows * (size_t)dim * esize));
    CUDA_OK(cudaMalloc((void **)&d_x, (size_t)dim * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_logits, (size_t)(rows + 1) * sizeof(float)));
    CUDA_OK(cudaMemcpy(d_w, w, (size_t)rows * (size_t)dim * esize, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_x, x, (size_t)dim * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_logits, 0xff, (size_t)rows * sizeof(float))); /* NaN */
    const float guard = 12345.0f;
    CUDA_OK(cudaMemcpy(d_logits + rows, &guard, sizeof guard, cudaMemcpyHostToDevice));
    CUDA_OK(bn_cb_head_prepare(type, dim));
    CUDA_OK(bn_cb_head_gemv(d_w, type, rows, dim, d_x, d_logits, sm_count, 0));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got, d_logits, (size_t)(rows + 1) * sizeof(float),
                       cudaMemcpyDeviceToHost));

    int64_t bad = 0, first = -1;
    double worst = 0.0; /* error / bound */
    for (int64_t r = 0; r < rows; r++) {
        double ref = 0.0, mag = 0.0;
        for (int64_t i = 0; i < dim; i++) {
            const double p = (double)wf[r * dim + i] * (double)x[i];
            ref += p;
            mag += fabs(p);
        }
        const double bound = (double)(dim + 1) * 0x1p-24 * mag + 1e-30;
        const double e = fabs((double)got[r] - ref);
        if (!(e <= bound)) {
            if (bad++ == 0)
                first = r;
        } else if (e / bound > worst) {
            worst = e / bound;
        }
    }
    CHECK_MSG(bad == 0, "%s %lld x %lld: %lld logits off (first row %lld: gpu %.9g)",
              type_names[type], (long long)rows, (long long)dim, (long long)bad,
              (long long)first, first >= 0 ? got[first] : 0.0);
    CHECK_MSG(got[rows] == guard, "%s %lld x %lld: the value past the last row was written",
              type_names[type], (long long)rows, (long long)dim);
    printf("%-4s %6lld x %-5lld (%s path): %s, worst error %.3f of the bound\n", type_names[type],
           (long long)rows, (long long)dim,
           dim % (type == BN_CB_HEAD_F32 ? 4 : 8) == 0 ? "vector" : "scalar",
           bad ? "FAILED" : "as the reference", worst);
    cudaFree(d_w), cudaFree(d_x), cudaFree(d_logits);
    free(w), free(wf), free(x), free(got);
}

/* bn_cb_rows_combine: n rows of `parts` parts' logits, combined in place;
 * rows 0 .. n must be (part 0 + part 1 + ...) * factor bit for bit, the
 * sums in part order, over a vocabulary that is no multiple of the block. */
static void check_rows_combine(int parts, int64_t n, int64_t vocab)
{
    const size_t count = (size_t)(n * parts * vocab);
    float *in = malloc(count * sizeof *in), *got = malloc(count * sizeof *got);
    float *unscale = malloc((size_t)n * sizeof *unscale);
    CHECK(in && got && unscale);
    for (size_t i = 0; i < count; i++)
        in[i] = test_rand_float(-1e4f, 1e4f) * (i % 7 == 0 ? 1e-4f : 1.0f);
    for (int64_t k = 0; k < n; k++)
        unscale[k] = ldexpf(1.0f, (int)test_rand_range(-20, 0));
    float *dl, *ds;
    CUDA_OK(cudaMalloc((void **)&dl, count * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&ds, (size_t)n * sizeof(float)));
    CUDA_OK(cudaMemcpy(dl, in, count * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(ds, unscale, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(bn_cb_rows_combine(dl, vocab, n, parts, ds, 0));
    CUDA_OK(cudaMemcpy(got, dl, count * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int64_t k = 0; k < n && bad < 5; k++)
        for (int64_t v = 0; v < vocab && bad < 5; v++) {
            volatile float sum = in[(size_t)(k * parts * vocab + v)];
            for (int p = 1; p < parts; p++)
                sum = sum + in[(size_t)((k * parts + p) * vocab + v)];
            const float want = sum * unscale[k];
            if (memcmp(&want, &got[(size_t)(k * vocab + v)], sizeof want) != 0) {
                fprintf(stderr, "rows_combine parts %d n %lld: row %lld [%lld] %.9g, want %.9g\n",
                        parts, (long long)n, (long long)k, (long long)v,
                        (double)got[(size_t)(k * vocab + v)], (double)want);
                bad++;
            }
        }
    CHECK(bad == 0);
    CHECK(bn_cb_rows_combine(dl, vocab, n, 0, ds, 0) == cudaErrorInvalidValue);
    cudaFree(dl);
    cudaFree(ds);
    free(in);
    free(got);
    free(unscale);
}

int main(void)
{
    const struct cudaDeviceProp prop = test_require_cuda(0, "");
    static const int64_t shapes[][2] = {
        {1000, 2560}, /* 2B-4T rows: one pass of loads per row (f16 / bf16) */
        {77, 4104},   /* two passes, the second partial */
        {513, 256},   /* short rows, a partial last block */
        {33, 100},    /* f32: vector; f16 / bf16: scalar */
        {9, 90},      /* scalar for every type */
        {20000, 2560}, /* more rows than the grid has warps: grid-stride */
    };
    for (int type = BN_CB_HEAD_F32; type <= BN_CB_HEAD_BF16; type++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            check_head(type, shapes[i][0], shapes[i][1], prop.multiProcessorCount);
    for (int form = BN_CB_ROWS_HEAD_F32; form <= BN_CB_ROWS_HEAD_BF16; form++) {
        check_rows_head_in(form, 9, 2560);
        check_rows_head_in(form, 64, 256);
        check_rows_head_in(form, 3, 100);
    }
    check_rows_combine(2, 1, 1000);
    check_rows_combine(2, 64, 12345);
    check_rows_combine(3, 37, 513);
    check_rows_combine(2, 256, 12345); /* rounds of 1, 1, 2, .. 128 rows */
    check_rows_combine(2, 100, 777);   /* a last round of 36: a partial batch */
    check_rows_combine(3, 90, 300);
    check_rows_combine(1, 5, 300);
    /* Bad arguments are refused. */
    float *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, 64));
    CHECK(bn_cb_head_gemv(d, BN_CB_HEAD_F16, 0, 8, d, d, 1, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_head_gemv(d, 7, 1, 8, d, d, 1, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_head_prepare(BN_CB_HEAD_F16, 0) == cudaErrorInvalidValue);
    cudaFree(d);
    TEST_EXIT();
}
