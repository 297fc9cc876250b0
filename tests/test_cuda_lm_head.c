/* GPU test: the LM head (lm_head_cuda.h) - cuBLAS F16 / BF16 paths and the
 * int8 dp4a path - against a double precision CPU reference on ragged
 * shapes and on 2B-4T's 128256 x 2560, with poisoned logits padding; the
 * int8 weight quantizer bit for bit against the host. Prints the measured
 * error of every path and cudaEvent timings on the 2B-4T shape. Exits 77
 * without a usable GPU (or without cuBLAS).
 *
 * Tolerance (F16 / BF16), per logit, a worst-case bound rather than a
 * statistical guess:
 *     |gpu - ref| <= (u + (dim + 2) 2^-24) sum_k |w_k x_k| + 2^-24 sum_k |w_k|
 * u is the unit roundoff of rounding x to W's type (2^-11 for fp16, 2^-8
 * for bf16): W is used exactly (the reference reads the same fp16 / bf16
 * values), x is rounded once, and an fp32 accumulation of dim products
 * errs by at most dim * 2^-24 of sum |w x| in any order; the last term
 * covers x rounded into fp16's subnormal range (absolute error 2^-25).
 *
 * INT8: no hard bound is asserted beyond a sanity limit (relative L2 error
 * below 5% on these Gaussian data); the measured error is printed: per-row
 * absmax int8 quantization of both operands gives roughly 1% relative L2
 * error on Gaussian data, more when activations have outliers. */
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "lm_head_cuda.h"
#include "fp16.h"
#include "test_util.h"
#include "test_util_cuda.h"

/* ---- fp16 / bf16 on the host ---------------------------------------------- */

static float rand_normal(void)
{
    const double u1 = ((double)(test_rand_u64() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = (double)(test_rand_u64() >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- one problem ------------------------------------------------------------- */

typedef struct problem {
    int64_t vocab, dim, m;
    bool bf16;
    uint16_t *w;   /* host bits */
    float *wf;     /* host values of w */
    float *x;      /* m x dim */
    double *ref;   /* m x vocab */
    double *bound; /* m x vocab: the F16 / BF16 error bound */
    void *dw;      /* device bits */
    float *dx;
    int64_t ldx;
} problem;

static void problem_init(problem *p, int64_t vocab, int64_t dim, int64_t m, bool bf16)
{
    memset(p, 0, sizeof *p);
    p->vocab = vocab, p->dim = dim, p->m = m, p->bf16 = bf16;
    const size_t nw = (size_t)(vocab * dim);
    p->w = malloc(nw * 2);
    p->wf = malloc(nw * sizeof(float));
    const float sigma = test_rand_float(0.005f, 0.2f);
    for (size_t i = 0; i < nw; i++) {
        const float v = sigma * rand_normal();
        p->w[i] = bf16 ? bn_fp32_to_bf16(v) : bn_fp32_to_fp16(v);
        p->wf[i] = bf16 ? bn_bf16_to_fp32(p->w[i]) : bn_fp16_to_fp32(p->w[i]);
    }
    /* Activations ~ N(0, 1) with a few outliers, like a normed hidden
     * state; one row with tiny values (fp16 subnormals). */
    p->ldx = dim + 3;
    p->x = malloc(sizeof(float) * (size_t)(m * p->ldx));
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = 0; k < dim; k++) {
            float v = rand_normal();
            if (test_rand_range(0, 199) == 0)
                v *= 8.0f;
            if (i == 1)
                v *= 1e-5f;
            p->x[i * p->ldx + k] = v;
        }
    p->ref = malloc(sizeof(double) * (size_t)(m * vocab));
    p->bound = malloc(sizeof(double) * (size_t)(m * vocab));
    const double u = bf16 ? 0x1.0p-8 : 0x1.0p-11;
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < vocab; r++) {
            const float *wr = p->wf + r * dim, *xr = p->x + i * p->ldx;
            double s = 0.0, sa = 0.0, sw = 0.0;
            for (int64_t k = 0; k < dim; k++) {
                s += (double)wr[k] * xr[k];
                sa += fabs((double)wr[k] * xr[k]);
                sw += fabs((double)wr[k]);
            }
            p->ref[i * vocab + r] = s;
            p->bound[i * vocab + r] = (u + (double)(dim + 2) * 0x1.0p-24) * sa + 0x1.0p-24 * sw;
        }
    CUDA_OK(cudaMalloc(&p->dw, nw * 2));
    CUDA_OK(cudaMemcpy(p->dw, p->w, nw * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&p->dx, sizeof(float) * (size_t)(m * p->ldx)));
    CUDA_OK(cudaMemcpy(p->dx, p->x, sizeof(float) * (size_t)(m * p->ldx),
                       cudaMemcpyHostToDevice));
}

static void problem_free(problem *p)
{
    free(p->w);
    free(p->wf);
    free(p->x);
    free(p->ref);
    free(p->bound);
    cudaFree(p->dw);
    cudaFree(p->dx);
}

static const char *type_name(bn_lm_head_type t)
{
    return t == BN_LM_HEAD_F16 ? "f16" : t == BN_LM_HEAD_BF16 ? "bf16" : "int8";
}

/* The int8 weights and scales against the host rule, bit for bit. */
static void check_weight_quant(const problem *p, const bn_lm_head *h)
{
    int8_t *q = malloc((size_t)(p->vocab * h->ldq));
    float *sc = malloc(sizeof(float) * (size_t)p->vocab);
    CUDA_OK(cudaMemcpy(q, h->wq, (size_t)(p->vocab * h->ldq), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(sc, h->w_scale, sizeof(float) * (size_t)p->vocab, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t r = 0; r < p->vocab; r++) {
        float amax = 0.0f;
        for (int64_t k = 0; k < p->dim; k++)
            amax = fmaxf(amax, fabsf(p->wf[r * p->dim + k]));
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        bad += sc[r] != amax / 127.0f;
        for (int64_t k = 0; k < h->ldq; k++) {
            int want = 0;
            if (k < p->dim) {
                const float v = rintf(p->wf[r * p->dim + k] * inv);
                want = (int)fminf(fmaxf(v, -127.0f), 127.0f);
            }
            bad += q[r * h->ldq + k] != want;
        }
    }
    CHECK_MSG(bad == 0, "int8 weight quantization %lld x %lld: %lld values differ",
              (long long)p->vocab, (long long)p->dim, (long long)bad);
    free(q);
    free(sc);
}

/* Runs one head type on the problem; checks (F16 / BF16) or reports
 * (INT8) the error; returns the relative L2 error. */
static double run_head(const problem *p, bn_lm_head_type type, bool verbose)
{
    bn_lm_head h;
    bn_error err;
    const bn_lm_head_type wt = p->bf16 ? BN_LM_HEAD_BF16 : BN_LM_HEAD_F16;
    bn_status st = bn_lm_head_init(&h, type, p->dw, wt, p->vocab, p->dim, p->m, 0, &err);
    if (st == BN_ERR_UNSUPPORTED && type != BN_LM_HEAD_INT8)
        TEST_SKIP("%s", err.message); /* no libcublas */
    CHECK_MSG(st == BN_OK, "bn_lm_head_init %s: %s", type_name(type), err.message);
    if (st != BN_OK)
        return 1.0;
    if (type == BN_LM_HEAD_INT8)
        check_weight_quant(p, &h);
    const int64_t ldl = p->vocab + 5;
    float *dl;
    CUDA_OK(cudaMalloc((void **)&dl, sizeof(float) * (size_t)(p->m * ldl)));
    CUDA_OK(cudaMemset(dl, 0xff, sizeof(float) * (size_t)(p->m * ldl)));
    st = bn_lm_head_forward(&h, p->dx, p->ldx, p->m, dl, ldl, 0, &err);
    CHECK_MSG(st == BN_OK, "bn_lm_head_forward %s: %s", type_name(type), err.message);
    CUDA_OK(cudaDeviceSynchronize());
    float *y = malloc(sizeof(float) * (size_t)(p->m * ldl));
    CUDA_OK(cudaMemcpy(y, dl, sizeof(float) * (size_t)(p->m * ldl), cudaMemcpyDeviceToHost));

    double e2 = 0.0, r2 = 0.0, worst_ratio = 0.0;
    int64_t bad = 0, pad = 0, top_agree = 0, top_rows = 0;
    for (int64_t i = 0; i < p->m; i++) {
        int64_t arg_y = 0, arg_r = 0;
        for (int64_t r = 0; r < p->vocab; r++) {
            const double g = y[i * ldl + r], want = p->ref[i * p->vocab + r];
            const double e = fabs(g - want);
            e2 += e * e;
            r2 += want * want;
            const double ratio = e / p->bound[i * p->vocab + r];
            worst_ratio = !(ratio <= worst_ratio) ? ratio : worst_ratio;
            bad += !(e <= p->bound[i * p->vocab + r]);
            if (g > y[i * ldl + arg_y])
                arg_y = r;
            if (want > p->ref[i * p->vocab + arg_r])
                arg_r = r;
        }
        for (int64_t r = p->vocab; r < ldl; r++) {
            uint32_t b;
            memcpy(&b, &y[i * ldl + r], 4);
            pad += b != 0xffffffffu;
        }
        if (i != 1) { /* the tiny row's argmax is noise for int8 */
            top_rows++;
            top_agree += arg_y == arg_r;
        }
    }
    const double rel = r2 > 0.0 ? sqrt(e2 / r2) : sqrt(e2);
    CHECK_MSG(pad == 0, "%s wrote %lld padding logits", type_name(type), (long long)pad);
    if (type != BN_LM_HEAD_INT8) {
        CHECK_MSG(bad == 0,
                  "%s %lld x %lld, m %lld: %lld logits beyond the bound (worst %.3g x bound)",
                  type_name(type), (long long)p->vocab, (long long)p->dim, (long long)p->m,
                  (long long)bad, worst_ratio);
    } else {
        CHECK_MSG(rel < 0.05, "int8 %lld x %lld: relative L2 error %.4g", (long long)p->vocab,
                  (long long)p->dim, rel);
    }
    if (verbose)
        printf("error: %-4s %s weights %lld x %lld, m %lld: relative L2 %.3e, worst/bound %.3f, "
               "argmax agrees %lld/%lld\n",
               type_name(type), p->bf16 ? "bf16" : "f16", (long long)p->vocab,
               (long long)p->dim, (long long)p->m, rel, worst_ratio, (long long)top_agree,
               (long long)top_rows);
    free(y);
    cudaFree(dl);
    bn_lm_head_free(&h);
    return rel;
}

/* ---- timing (printed, not checked) --------------------------------------------- */

static void time_head(const problem *p, bn_lm_head_type type, int64_t m)
{
    bn_lm_head h;
    bn_error err;
    const bn_lm_head_type wt = p->bf16 ? BN_LM_HEAD_BF16 : BN_LM_HEAD_F16;
    if (bn_lm_head_init(&h, type, p->dw, wt, p->vocab, p->dim, m, 0, &err) != BN_OK) {
        printf("time: %s: %s\n", type_name(type), err.message);
        return;
    }
    float *dx, *dl;
    CUDA_OK(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(m * p->dim)));
    CUDA_OK(cudaMemset(dx, 0, sizeof(float) * (size_t)(m * p->dim)));
    CUDA_OK(cudaMemcpy(dx, p->x, sizeof(float) * (size_t)p->dim, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&dl, sizeof(float) * (size_t)(m * p->vocab)));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int r = 0; r < 10; r++)
        CHECK(bn_lm_head_forward(&h, dx, p->dim, m, dl, p->vocab, 0, &err) == BN_OK);
    const int reps = 100;
    CUDA_OK(cudaEventRecord(e0, 0));
    for (int r = 0; r < reps; r++)
        CHECK(bn_lm_head_forward(&h, dx, p->dim, m, dl, p->vocab, 0, &err) == BN_OK);
    CUDA_OK(cudaEventRecord(e1, 0));
    CUDA_OK(cudaEventSynchronize(e1));
    float ms;
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = ms * 1000.0 / reps;
    const double bytes = (double)p->vocab * (double)p->dim * (type == BN_LM_HEAD_INT8 ? 1 : 2);
    printf("time: %-4s LM head %lld x %lld, m %lld: %8.1f us (weights at %.0f GB/s)\n",
           type_name(type), (long long)p->vocab, (long long)p->dim, (long long)m, us,
           bytes / (us * 1e-6) / 1e9);
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    cudaFree(dx);
    cudaFree(dl);
    bn_lm_head_free(&h);
}

int main(void)
{
    test_require_cuda(8, "BF16 GEMM");
    const bool quick = getenv("BN_TEST_QUICK") != NULL;

    /* Argument checks. */
    {
        bn_lm_head h;
        bn_error err;
        CHECK(bn_lm_head_init(&h, BN_LM_HEAD_BF16, &h, BN_LM_HEAD_F16, 10, 10, 1, 0, &err) ==
              BN_ERR_INVALID_ARGUMENT);
        CHECK(bn_lm_head_init(&h, BN_LM_HEAD_F16, &h, BN_LM_HEAD_F16, 0, 10, 1, 0, &err) ==
              BN_ERR_INVALID_ARGUMENT);
    }

    /* Ragged shapes, every path, both weight types; m up to 11 takes the
     * int8 kernel through two passes. */
    for (int iter = 0; iter < (quick ? 4 : 16); iter++) {
        problem p;
        problem_init(&p, test_rand_range(1, 3000), test_rand_range(1, 3000),
                     test_rand_range(1, 11), iter & 1);
        run_head(&p, p.bf16 ? BN_LM_HEAD_BF16 : BN_LM_HEAD_F16, false);
        run_head(&p, BN_LM_HEAD_INT8, false);
        problem_free(&p);
    }

    /* 2B-4T: 128256 x 2560 (F16 in the official GGUF; BF16 as in the HF
     * checkpoint), decode (m = 1) and a few rows. */
    for (int t = 0; t < 2; t++) {
        problem p;
        problem_init(&p, 128256, 2560, quick ? 1 : 3, t == 1);
        run_head(&p, p.bf16 ? BN_LM_HEAD_BF16 : BN_LM_HEAD_F16, true);
        run_head(&p, BN_LM_HEAD_INT8, true);
        if (!quick) {
            const int64_t ms[] = {1, 8};
            for (int i = 0; i < 2; i++) {
                time_head(&p, p.bf16 ? BN_LM_HEAD_BF16 : BN_LM_HEAD_F16, ms[i]);
                time_head(&p, BN_LM_HEAD_INT8, ms[i]);
            }
        }
        problem_free(&p);
    }
    TEST_EXIT();
}
