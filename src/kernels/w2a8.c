#include "w2a8.h"

#include <string.h>

void bn_w2a8_weights_free(bn_w2a8_weights *w)
{
    if (!w)
        return;
    if (w->provider && w->provider->free_weights)
        w->provider->free_weights(w);
    else
        bn_aligned_free(w->data);
    memset(w, 0, sizeof *w);
}

bn_status bn_q8_rows_alloc(bn_q8_rows *x, int64_t m, int64_t k, bn_error *err)
{
    memset(x, 0, sizeof *x);
    if (m <= 0 || k <= 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "activation rows %lld x %lld",
                            (long long)m, (long long)k);
    x->m = m;
    x->k = k;
    x->lda = (k + 63) / 64 * 64;
    x->q = bn_aligned_alloc(64, (size_t)(m * x->lda));
    x->scale = bn_aligned_alloc(64, (size_t)m * sizeof(float));
    x->sum = bn_aligned_alloc(64, (size_t)m * sizeof(int32_t));
    if (!x->q || !x->scale || !x->sum) {
        bn_q8_rows_free(x);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "reduce the batch size",
                            "no memory for %lld activation rows of %lld", (long long)m,
                            (long long)k);
    }
    return BN_OK;
}

void bn_q8_rows_free(bn_q8_rows *x)
{
    if (!x)
        return;
    bn_aligned_free(x->q);
    bn_aligned_free(x->scale);
    bn_aligned_free(x->sum);
    memset(x, 0, sizeof *x);
}

void bn_w2a8_quantize(const bn_kernel_provider *p, const float *src, int64_t m, int64_t ldx,
                      bn_q8_rows *x)
{
    for (int64_t i = 0; i < m; i++)
        p->quantize_activations(src + i * ldx, x->k, x->q + i * x->lda, &x->scale[i],
                                &x->sum[i]);
}

bn_status bn_w2a8_pack(const bn_kernel_provider *p, const int8_t *codes, int64_t n, int64_t k,
                       float scale, bn_w2a8_weights *w, bn_error *err)
{
    memset(w, 0, sizeof *w);
    if (n <= 0 || k <= 0 || n > (INT64_C(1) << 31) || k > (INT64_C(1) << 22))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "ternary matrix %lld x %lld is empty or too large (k <= 4194304 keeps "
                            "int32 sums exact)",
                            (long long)n, (long long)k);
    for (int64_t i = 0; i < n * k; i++)
        if (codes[i] < -1 || codes[i] > 1)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "weight code %d at %lld is not -1, 0 or +1", codes[i],
                                (long long)i);
    return p->pack_weights(codes, n, k, scale, w, err);
}

typedef struct matmul_job {
    const bn_w2a8_weights *w;
    const bn_q8_rows *x;
    float *y;
    int64_t ldy;
} matmul_job;

static void matmul_rows(void *ctx, int64_t begin, int64_t end)
{
    const matmul_job *job = ctx;
    const bn_kernel_provider *p = job->w->provider;
    if (job->x->m == 1)
        p->matvec(job->w, job->x->q, job->x->scale[0], job->x->sum[0], begin, end, job->y);
    else
        p->matmul(job->w, job->x, begin, end, job->y, job->ldy);
}

bn_status bn_w2a8_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, float *y, int64_t ldy,
                         bn_threadpool *pool, bn_error *err)
{
    if (!w || !w->provider || !x || !y)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "w2a8 matmul: NULL argument");
    if (x->k != w->k)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "w2a8 matmul: activations have %lld columns, weights %lld",
                            (long long)x->k, (long long)w->k);
    if (x->m > 1 && ldy < w->n)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "w2a8 matmul: output stride %lld < %lld rows", (long long)ldy,
                            (long long)w->n);
    matmul_job job = {w, x, y, ldy};
    if (w->provider->runs_on_device) {
        matmul_rows(&job, 0, w->n); /* the device parallelises by itself */
        return BN_OK;
    }
    /* 16-row grains keep each thread's rows in whole tiles of 4. */
    bn_threadpool_run(pool, w->n, 16, matmul_rows, &job);
    return BN_OK;
}
