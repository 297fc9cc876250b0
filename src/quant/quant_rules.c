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

/* RMSNorm followed by absmax int8 quantization, as one step.
 *
 * Absmax quantization is scale-invariant, so RMSNorm's 1/rms factor cancels
 * from the codes: code_i = round(127 * u_i / max|u|) with u = w * x. The
 * codes are computed that way, in double (u_i is exact there), which gives
 * what exact arithmetic gives. That matters on the first layer: embeddings
 * and norm weights carry 8-11 significant bits, so an element that is
 * exactly half the largest one (code 63.5, a tie rounded to even) is
 * common, and fp32 rounding of the normed value would push it either way.
 * The scale is 127 / max|normed x| in fp32, as the reference computes it;
 * the sum of squares in the lanes of bn_norm_lanes_sum. */
void bn_norm_quantize_row(const float *x, const float *w, int64_t n, float eps, int8_t *q,
                          float *scale, int32_t *sum)
{
    double lane[8] = {0}, umax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        lane[i % 8] += (double)x[i] * (double)x[i];
        const double u = fabs((double)w[i] * (double)x[i]);
        umax = u > umax ? u : umax;
    }
    const float inv = 1.0f / sqrtf((float)(bn_norm_lanes_sum(lane) / (double)n) + eps);
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float a = fabsf(w[i] * (x[i] * inv));
        amax = a > amax ? a : amax;
    }
    int32_t total = 0;
    if (amax >= BN_QUANT_EPS && umax > 0.0 && isfinite(umax)) {
        for (int64_t i = 0; i < n; i++) {
            /* A NaN value's code is 0 (converting NaN to int is undefined). */
            const double r = rint(127.0 * (((double)w[i] * (double)x[i]) / umax));
            const int v = r == r ? (int)r : 0;
            q[i] = (int8_t)v;
            total += v;
        }
        *scale = 127.0f / amax;
    } else {
        /* Tiny or non-finite rows: the plain rule on the normed values. */
        const float s = 127.0f / (amax >= BN_QUANT_EPS ? amax : BN_QUANT_EPS);
        for (int64_t i = 0; i < n; i++) {
            const int v = bn_round_clamp(w[i] * (x[i] * inv) * s, -128, 127);
            q[i] = (int8_t)v;
            total += v;
        }
        *scale = s;
    }
    *sum = total;
}
