/*
 * test_cuda_norm.c - the CUDA backend's RMSNorm + int8 kernels
 * (bn_cb_norm_quantize, bn_cb_add_norm_quantize, bn_cb_relu2_norm_quantize)
 * against the CPU backend's (bn_norm_quantize_row), row by row, on rows chosen to reach every
 * path of the exact rule:
 *
 *   - smooth random rows (the fp32 estimate decides almost every code);
 *   - few-bit rows whose codes are exact ties (127 * u / max|u| = n + 1/2),
 *     which the estimate must leave to the double path;
 *   - rows whose products underflow fp32 (1e-25 * 1e-25) or overflow it
 *     (1e20 * 1e20), where the fp32 maximum is 0 or inf and the exact one
 *     is found among the candidates;
 *   - a zero row, rows with a NaN or an infinity (the plain rule).
 *
 * Codes and code sums must be identical; the scale may differ by one ulp
 * (the double sum of squares is added in another order). Widths: the
 * decode step's (2560, 6912), a small one (100), an odd one (90, which
 * the register-held kernel takes), up to 256 rows at once, prefill chunks
 * of 257-512 rows (the batch kernel), and rows longer than 8192 (the
 * streaming kernel). Outputs are poisoned first.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "cuda_backend_kernels.h"
#include "fp16.h"
#include "ops_cuda.h"
#include "qtype.h"
#include "quant_rules.h"
#include "test_util.h"
#include "test_util_cuda.h"

enum { ROW_SMOOTH, ROW_FEWBIT, ROW_TINY, ROW_HUGE, ROW_ZERO, ROW_NAN, ROW_INF, ROW_KINDS };
static const char *const kind_name[ROW_KINDS] = {"smooth", "few-bit", "tiny", "huge",
                                                 "zero",   "nan",     "inf"};

/* Row values and norm weights of one kind. */
static void fill_row(int kind, float *x, float *w, int64_t k)
{
    for (int64_t i = 0; i < k; i++) {
        switch (kind) {
        case ROW_FEWBIT:
            /* Multiples of 1/8 up to 8 with weights 1 or 2: max|u| = 16 and
             * many u = n/8, so 127 * u / 16 hits exact halves. */
            x[i] = (float)test_rand_range(-64, 64) / 8.0f;
            w[i] = (float)test_rand_range(1, 2);
            break;
        case ROW_TINY:
            x[i] = test_rand_float(-1.0f, 1.0f) * 1e-25f;
            w[i] = test_rand_float(0.5f, 1.5f) * 1e-25f;
            break;
        case ROW_HUGE:
            x[i] = test_rand_float(-1.0f, 1.0f) * 1e20f;
            w[i] = test_rand_float(0.5f, 1.5f) * 1e20f;
            break;
        case ROW_ZERO:
            x[i] = 0.0f;
            w[i] = 1.0f;
            break;
        default:
            x[i] = test_rand_float(-3.0f, 3.0f);
            w[i] = test_rand_float(0.8f, 1.2f);
            break;
        }
    }
    if (kind == ROW_FEWBIT) /* make sure the maximum is there */
        x[test_rand_range(0, k - 1)] = 8.0f, w[0] = 2.0f, x[0] = -8.0f;
    if (kind == ROW_NAN)
        x[test_rand_range(0, k - 1)] = NAN;
    if (kind == ROW_INF)
        x[test_rand_range(0, k - 1)] = INFINITY;
}

static bool ulp_close(float a, float b)
{
    if (a == b)
        return true;
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return isfinite(a) && isfinite(b) && (ia > ib ? ia - ib : ib - ia) <= 1;
}

enum { SRC_PLAIN, SRC_ADD, SRC_RELU2 };
static const char *const src_name[] = {"norm", "add+norm", "relu2+norm"};

/* m rows of width k (row r of kind r % ROW_KINDS) normed with weights of
 * kind wkind, through one launcher, against ref_row. */
static void check_rows(int src, int wkind, int64_t m, int64_t k)
{
    const int64_t ldx = k + 4, ldq = (k + 15) / 16 * 16 + 16;
    const size_t nv = (size_t)(m * ldx);
    float *x = calloc(nv, sizeof(float)), *r = calloc(nv, sizeof(float));
    float *w = calloc((size_t)k, sizeof(float)), *unused = calloc((size_t)k, sizeof(float));
    float *xout = calloc(nv, sizeof(float));
    int8_t *q = malloc((size_t)(m * ldq)), *ref_q = malloc((size_t)k);
    float *scale = malloc((size_t)m * sizeof(float));
    int32_t *sum = malloc((size_t)m * sizeof(int32_t));
    float *xs = calloc((size_t)(m * k), sizeof(float)); /* the rows as normed */
    const float sg = 0.75f, su = 1.25f;
    fill_row(wkind, unused, w, k);
    for (int64_t row = 0; row < m; row++) {
        fill_row((int)(row % ROW_KINDS), xs + row * k, unused, k);
        for (int64_t i = 0; i < k; i++) {
            const float t = xs[row * k + i];
            if (src == SRC_PLAIN) {
                x[row * ldx + i] = t;
            } else if (src == SRC_ADD) {
                /* the kernel normalises x + r */
                const float a = (float)test_rand_range(-4, 4);
                x[row * ldx + i] = a;
                r[row * ldx + i] = t - a;
                xs[row * k + i] = a + r[row * ldx + i];
            } else {
                /* relu(g sg)^2 (u su) with u = the row's value */
                x[row * ldx + i] = test_rand_float(-1.0f, 2.0f);
                r[row * ldx + i] = t;
                const float gate = x[row * ldx + i] * sg;
                const float rg = gate > 0.0f ? gate : 0.0f;
                xs[row * k + i] = (rg * rg) * (t * su);
            }
        }
    }
    float *wk = w;

    float *d_x, *d_r, *d_w, *d_scale;
    int8_t *d_q;
    int32_t *d_sum;
    CUDA_OK(cudaMalloc((void **)&d_x, nv * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_r, nv * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_w, (size_t)k * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_q, (size_t)(m * ldq)));
    CUDA_OK(cudaMalloc((void **)&d_scale, (size_t)m * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_sum, (size_t)m * sizeof(int32_t)));
    CUDA_OK(cudaMemcpy(d_x, x, nv * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_r, r, nv * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_w, wk, (size_t)k * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_q, 0x5a, (size_t)(m * ldq)));
    CUDA_OK(cudaMemset(d_scale, 0xff, (size_t)m * sizeof(float)));
    CUDA_OK(cudaMemset(d_sum, 0x7f, (size_t)m * sizeof(int32_t)));

    cudaError_t rc;
    if (src == SRC_PLAIN)
        rc = bn_cb_norm_quantize(d_x, ldx, m, k, d_w, 1e-5f, d_q, ldq, d_scale, d_sum, 0, 0);
    else if (src == SRC_ADD)
        rc = bn_cb_add_norm_quantize(d_x, ldx, d_r, ldx, m, k, d_w, 1e-5f, d_q, ldq, d_scale,
                                     d_sum, 0, 0);
    else
        rc = bn_cb_relu2_norm_quantize(d_x, d_r, ldx, sg, su, m, k, d_w, 1e-5f, d_q, ldq,
                                       d_scale, d_sum, 0, 0);
    CUDA_OK(rc);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(q, d_q, (size_t)(m * ldq), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(scale, d_scale, (size_t)m * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(sum, d_sum, (size_t)m * sizeof(int32_t), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(xout, d_x, nv * sizeof(float), cudaMemcpyDeviceToHost));

    int bad_rows = 0;
    for (int64_t row = 0; row < m; row++) {
        float ref_scale;
        int32_t ref_sum;
        bn_norm_quantize_row(xs + row * k, wk, k, 1e-5f, ref_q, &ref_scale, &ref_sum);
        int64_t first = -1;
        for (int64_t i = 0; i < ldq && first < 0; i++)
            if (q[row * ldq + i] != (i < k ? ref_q[i] : 0))
                first = i;
        bool add_ok = true;
        if (src == SRC_ADD)
            for (int64_t i = 0; i < k; i++)
                add_ok = add_ok && (memcmp(&xout[row * ldx + i], &xs[row * k + i], 4) == 0 ||
                                    (isnan(xout[row * ldx + i]) && isnan(xs[row * k + i])));
        const bool ok = first < 0 && sum[row] == ref_sum && ulp_close(scale[row], ref_scale) &&
                        add_ok;
        if (!ok && bad_rows++ < 3)
            CHECK_MSG(false,
                      "%s k=%lld, %s weights, row %lld (%s): first differing code at %lld (gpu "
                      "%d, cpu %d), sum %d vs %d, scale %.9g vs %.9g, residual written %s",
                      src_name[src], (long long)k, kind_name[wkind], (long long)row,
                      kind_name[row % ROW_KINDS],
                      (long long)first, first >= 0 ? q[row * ldq + first] : 0,
                      first >= 0 && first < k ? ref_q[first] : 0, sum[row], ref_sum, scale[row],
                      ref_scale, add_ok ? "ok" : "WRONG");
    }
    CHECK_MSG(bad_rows == 0, "%s k=%lld, %s weights: %d of %lld rows differ", src_name[src],
              (long long)k, kind_name[wkind], bad_rows, (long long)m);
    printf("%-10s k=%-5lld m=%-3lld %-7s weights: %s\n", src_name[src], (long long)k,
           (long long)m, kind_name[wkind], bad_rows ? "DIFFERS" : "codes and sums equal the CPU's");

    cudaFree(d_x), cudaFree(d_r), cudaFree(d_w), cudaFree(d_q), cudaFree(d_scale),
        cudaFree(d_sum);
    free(x), free(r), free(w), free(unused), free(xout), free(q), free(ref_q), free(scale),
        free(sum), free(xs);
}

/* bn_cb_embed_norm_quantize: for rows of every kind stored as `type`
 * (F32, F16, BF16), x is the row bn_cuda_embed_rows gives, and the codes,
 * scale and sum are bn_cb_norm_quantize's of that row bit for bit (and the
 * CPU's codes and sum); outputs poisoned before each call. */
static void check_embed(int type, int64_t k)
{
    enum { ROWS = 2 * ROW_KINDS + 1 };
    const size_t elem = type == BN_QTYPE_F32 ? 4 : 2;
    const int64_t ldq = (k + 15) / 16 * 16 + 16;
    float *vals = malloc((size_t)k * sizeof(float)), *w = malloc((size_t)k * sizeof(float));
    float *unused = malloc((size_t)k * sizeof(float)), *row = malloc((size_t)k * sizeof(float));
    unsigned char *table = malloc((size_t)(ROWS * k) * elem);
    int8_t *q = malloc((size_t)ldq), *q_ref = malloc((size_t)ldq), *cpu_q = malloc((size_t)k);
    fill_row(ROW_SMOOTH, unused, w, k);
    for (int r = 0; r < ROWS; r++) {
        fill_row(r % ROW_KINDS, vals, unused, k);
        for (int64_t i = 0; i < k; i++) {
            unsigned char *p = table + ((size_t)r * (size_t)k + (size_t)i) * elem;
            if (type == BN_QTYPE_F32) {
                memcpy(p, &vals[i], 4);
            } else {
                const uint16_t h =
                    type == BN_QTYPE_F16 ? bn_fp32_to_fp16(vals[i]) : bn_fp32_to_bf16(vals[i]);
                memcpy(p, &h, 2);
            }
        }
    }
    void *d_table;
    float *d_x, *d_y, *d_w, *d_scale;
    int8_t *d_q;
    int32_t *d_sum, *d_tok;
    CUDA_OK(cudaMalloc(&d_table, (size_t)(ROWS * k) * elem));
    CUDA_OK(cudaMalloc((void **)&d_x, (size_t)k * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_y, (size_t)k * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_w, (size_t)k * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_q, (size_t)ldq));
    CUDA_OK(cudaMalloc((void **)&d_scale, 2 * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_sum, 2 * sizeof(int32_t)));
    CUDA_OK(cudaMalloc((void **)&d_tok, sizeof(int32_t)));
    CUDA_OK(cudaMemcpy(d_table, table, (size_t)(ROWS * k) * elem, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_w, w, (size_t)k * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(bn_cb_embed_norm_fits(type, k, d_x, d_w, d_q, ldq));
    int bad = 0;
    for (int32_t t = 0; t < ROWS; t++) {
        float scale[2];
        int32_t sum[2];
        CUDA_OK(cudaMemcpy(d_tok, &t, sizeof t, cudaMemcpyHostToDevice));
        /* The separate kernels: the row, then its norm and codes. */
        CUDA_OK(bn_cuda_embed_rows(d_table, (bn_qtype)type, ROWS, k, d_tok, 1, d_y, k, 0));
        CUDA_OK(cudaMemset(d_q, 0x5a, (size_t)ldq));
        CUDA_OK(bn_cb_norm_quantize(d_y, k, 1, k, d_w, 1e-5f, d_q, ldq, d_scale + 1, d_sum + 1,
                                    0, 0));
        CUDA_OK(cudaMemcpy(q_ref, d_q, (size_t)ldq, cudaMemcpyDeviceToHost));
        /* The fused kernel, every output poisoned. */
        CUDA_OK(cudaMemset(d_x, 0xff, (size_t)k * sizeof(float)));
        CUDA_OK(cudaMemset(d_q, 0x5a, (size_t)ldq));
        CUDA_OK(cudaMemset(d_scale, 0xff, sizeof(float)));
        CUDA_OK(cudaMemset(d_sum, 0x7f, sizeof(int32_t)));
        CUDA_OK(bn_cb_embed_norm_quantize(d_table, type, d_tok, d_x, k, d_w, 1e-5f, d_q, ldq,
                                          d_scale, d_sum, t & 1, 0));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(q, d_q, (size_t)ldq, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(scale, d_scale, sizeof scale, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(row, d_x, (size_t)k * sizeof(float), cudaMemcpyDeviceToHost));
        float *want = unused; /* the row bn_cuda_embed_rows gave */
        CUDA_OK(cudaMemcpy(want, d_y, (size_t)k * sizeof(float), cudaMemcpyDeviceToHost));
        float cpu_scale;
        int32_t cpu_sum;
        bn_norm_quantize_row(want, w, k, 1e-5f, cpu_q, &cpu_scale, &cpu_sum);
        const bool same = memcmp(row, want, (size_t)k * sizeof(float)) == 0 &&
                          memcmp(q, q_ref, (size_t)ldq) == 0 &&
                          memcmp(&scale[0], &scale[1], sizeof(float)) == 0 && sum[0] == sum[1];
        const bool cpu = memcmp(q, cpu_q, (size_t)k) == 0 && sum[0] == cpu_sum &&
                         (ulp_close(scale[0], cpu_scale) ||
                          (isnan(scale[0]) && isnan(cpu_scale)));
        if (!(same && cpu) && bad++ < 3)
            CHECK_MSG(false, "embed+norm type %d k=%lld, row %d (%s): %s the separate kernels, "
                             "%s the CPU's codes",
                      type, (long long)k, (int)t, kind_name[t % ROW_KINDS],
                      same ? "equals" : "DIFFERS FROM", cpu ? "equals" : "DIFFERS FROM");
    }
    printf("embed+norm type %-2d k=%-5lld %d rows: %s\n", type, (long long)k, ROWS,
           bad ? "DIFFER" : "x, codes, scale and sum equal the separate kernels'");
    /* What it does not take: refused before any launch. */
    CHECK(!bn_cb_embed_norm_fits(BN_QTYPE_Q8_0, k, d_x, d_w, d_q, ldq));
    CHECK(!bn_cb_embed_norm_fits(type, k + 2, d_x, d_w, d_q, ldq + 16));
    CHECK(bn_cb_embed_norm_quantize(d_table, BN_QTYPE_Q8_0, d_tok, d_x, k, d_w, 1e-5f, d_q, ldq,
                                    d_scale, d_sum, 0, 0) == cudaErrorInvalidValue);
    cudaFree(d_table), cudaFree(d_x), cudaFree(d_y), cudaFree(d_w), cudaFree(d_q),
        cudaFree(d_scale), cudaFree(d_sum), cudaFree(d_tok);
    free(vals), free(w), free(unused), free(row), free(table), free(q), free(q_ref), free(cpu_q);
}

int main(void)
{
    test_require_cuda(0, "");
    static const int64_t widths[] = {2560, 6912, 100, 90, 8200};
    for (int src = SRC_PLAIN; src <= SRC_RELU2; src++)
        for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
            for (int wkind = ROW_SMOOTH; wkind <= ROW_HUGE; wkind++)
                check_rows(src, wkind, widths[i] == 8200 ? 7 : 21, widths[i]);
    check_rows(SRC_PLAIN, ROW_FEWBIT, 256, 2560); /* the most rows the lean kernel takes */
    check_rows(SRC_PLAIN, ROW_FEWBIT, 256, 90);   /* the most the register-held kernel does */
    /* Prefill chunks (more than 256 rows): the batch kernel, rows of at
     * most 8192 values; longer ones the streaming kernel. */
    for (int src = SRC_PLAIN; src <= SRC_RELU2; src++) {
        check_rows(src, ROW_SMOOTH, 512, 2560);
        check_rows(src, ROW_FEWBIT, 300, 6912);
        check_rows(src, ROW_HUGE, 257, 100);
    }
    check_rows(SRC_RELU2, ROW_SMOOTH, 260, 8200);
    check_embed(BN_QTYPE_F16, 2560);
    check_embed(BN_QTYPE_BF16, 2560);
    check_embed(BN_QTYPE_F32, 2560);
    check_embed(BN_QTYPE_F16, 100);
    check_embed(BN_QTYPE_BF16, 6912);
    TEST_EXIT();
}
