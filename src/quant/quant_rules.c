#include "quant_rules.h"

#include <math.h>

void bn_quantize_weights_absmean(const float *w, size_t n, int8_t *codes, float *scale)
{
    double total = 0.0;
    for (size_t i = 0; i < n; i++)
        total += fabs((double)w[i]);
    float mean = n ? (float)(total / (double)n) : 0.0f;
    if (!(mean >= BN_QUANT_EPS)) /* also catches NaN */
        mean = BN_QUANT_EPS;
    const float q = 1.0f / mean;
    for (size_t i = 0; i < n; i++) {
        codes[i] = (int8_t)bn_round_clamp(w[i] * q, -1, 1);
    }
    *scale = 1.0f / q;
}

void bn_quantize_activations_row(const float *x, int64_t k, int8_t *xq, float *scale,
                                 int32_t *sum)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < k; i++) {
        float a = fabsf(x[i]);
        if (a > amax)
            amax = a;
    }
    if (!(amax >= BN_QUANT_EPS))
        amax = BN_QUANT_EPS;
    const float s = 127.0f / amax;
    int32_t total = 0;
    for (int64_t i = 0; i < k; i++) {
        int v = bn_round_clamp(x[i] * s, -128, 127);
        xq[i] = (int8_t)v;
        total += v;
    }
    *scale = s;
    *sum = total;
}
