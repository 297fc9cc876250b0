/*
 * provider_scalar.c - the reference kernels: plain C, one element at a time,
 * built without auto-vectorization. Every other provider is tested against
 * this one.
 *
 * Layout: row-major 2-bit codes, code = weight + 1 (0, 1, 2 for -1, 0, +1),
 * element c of row r at byte r * row_stride + c / 4, bits 2 * (c % 4):
 *
 *     byte:  [ e3 | e2 | e1 | e0 ]   (e0 in the low bits)
 *     row_stride = ceil(k / 4)
 */
#include <string.h>

#include "kernel_provider.h"
#include "quant_rules.h"

static bool scalar_available(void) { return true; }

static bn_status scalar_pack(const int8_t *codes, int64_t n, int64_t k, float scale,
                             bn_w2a8_weights *w, bn_error *err)
{
    const int64_t stride = (k + 3) / 4;
    uint8_t *data = bn_aligned_alloc(64, (size_t)(n * stride));
    if (!data)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to pack %lld x %lld weights",
                            (long long)n, (long long)k);
    memset(data, 0, (size_t)(n * stride));
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < k; c++)
            data[r * stride + c / 4] |= (uint8_t)((codes[r * k + c] + 1) << (2 * (c % 4)));
    w->provider = &bn_provider_scalar;
    w->n = n;
    w->k = k;
    w->scale = scale;
    w->data = data;
    w->bytes = (size_t)(n * stride);
    w->row_stride = stride;
    return BN_OK;
}

static int32_t dot_row(const bn_w2a8_weights *w, int64_t r, const int8_t *xq)
{
    const uint8_t *row = w->data + r * w->row_stride;
    int32_t acc = 0;
    for (int64_t c = 0; c < w->k; c++) {
        int weight = ((row[c / 4] >> (2 * (c % 4))) & 3) - 1;
        acc += weight * xq[c];
    }
    return acc;
}

static void scalar_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t row_begin,
                          int64_t row_end, float *y, int64_t ldy)
{
    for (int64_t m = 0; m < x->m; m++)
        for (int64_t r = row_begin; r < row_end; r++)
            y[m * ldy + r] =
                bn_w2a8_epilogue(dot_row(w, r, x->q + m * x->lda), x->scale[m], w->scale);
}

static void scalar_matvec(const bn_w2a8_weights *w, const int8_t *xq, float act_scale,
                          int32_t act_sum, int64_t row_begin, int64_t row_end, float *y)
{
    (void)act_sum;
    for (int64_t r = row_begin; r < row_end; r++)
        y[r] = bn_w2a8_epilogue(dot_row(w, r, xq), act_scale, w->scale);
}

const bn_kernel_provider bn_provider_scalar = {
    .name = "scalar",
    .priority = 0,
    .is_available = scalar_available,
    .pack_weights = scalar_pack,
    .matmul = scalar_matmul,
    .matvec = scalar_matvec,
    .quantize_activations = bn_quantize_activations_row,
    .norm_quantize_row = bn_norm_quantize_row,
};
