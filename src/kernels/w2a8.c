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

/* Up to BN_W2A8_GROUP_MAX products of one activation block as one range
 * of output rows: product i's rows start at offset[i], a multiple of the
 * 16-row grain, so every thread's share is whole tiles of each. */
typedef struct matmul_job {
    const bn_w2a8_weights *const *w;
    const bn_q8_rows *x;
    float *const *y;
    const int64_t *ldy;
    int count;
    int64_t offset[BN_W2A8_GROUP_MAX + 1];
} matmul_job;

static void matmul_rows(void *ctx, int64_t begin, int64_t end)
{
    const matmul_job *job = ctx;
    for (int i = 0; i < job->count; i++) {
        const bn_w2a8_weights *w = job->w[i];
        const int64_t lo = begin > job->offset[i] ? begin - job->offset[i] : 0;
        const int64_t hi = end - job->offset[i] < w->n ? end - job->offset[i] : w->n;
        if (lo >= hi)
            continue;
        const bn_kernel_provider *p = w->provider;
        if (job->x->m == 1)
            p->matvec(w, job->x->q, job->x->scale[0], job->x->sum[0], lo, hi, job->y[i]);
        else
            p->matmul(w, job->x, lo, hi, job->y[i], job->ldy[i]);
    }
}

bn_status bn_w2a8_matmul_group(const bn_w2a8_weights *const *w, int count, const bn_q8_rows *x,
                               float *const *y, const int64_t *ldy, bn_threadpool *pool,
                               bn_error *err)
{
    if (!w || !x || !y || !ldy || count < 1 || count > BN_W2A8_GROUP_MAX)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "w2a8 matmul: NULL argument or %d products (1..%d)", count,
                            BN_W2A8_GROUP_MAX);
    matmul_job job = {w, x, y, ldy, count, {0}};
    bool on_device = false;
    for (int i = 0; i < count; i++) {
        if (!w[i] || !w[i]->provider || !y[i])
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "w2a8 matmul: NULL argument");
        if (x->k != w[i]->k)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "w2a8 matmul: activations have %lld columns, weights %lld",
                                (long long)x->k, (long long)w[i]->k);
        if (x->m > 1 && ldy[i] < w[i]->n)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "w2a8 matmul: output stride %lld < %lld rows", (long long)ldy[i],
                                (long long)w[i]->n);
        on_device |= w[i]->provider->runs_on_device;
        job.offset[i + 1] = job.offset[i] + (w[i]->n + 15) / 16 * 16;
    }
    const int64_t rows = job.offset[count];
    if (on_device) {
        matmul_rows(&job, 0, rows); /* the device parallelises by itself */
        return BN_OK;
    }
    /* 16-row grains keep each thread's rows in whole tiles of 4. */
    bn_threadpool_run(pool, rows, 16, matmul_rows, &job);
    return BN_OK;
}

bn_status bn_w2a8_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, float *y, int64_t ldy,
                         bn_threadpool *pool, bn_error *err)
{
    return bn_w2a8_matmul_group(&w, 1, x, &y, &ldy, pool, err);
}
