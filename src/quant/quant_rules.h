/*
 * quant_rules.h - the two BitNet b1.58 quantizers, exactly as the reference
 * (Hugging Face transformers' BitNet, microsoft/BitNet) defines them:
 *
 *   weights, per tensor (absmean):  q = 1 / max(mean|W|, 1e-5)
 *                                   code = clamp(round(W * q), -1, 1)
 *                                   scale = 1 / q   (so W ~ code * scale)
 *   activations, per row (absmax):  s = 127 / max(max|x|, 1e-5)
 *                                   xq = clamp(round(x * s), -128, 127)
 *
 * round() is round-half-to-even (torch.round). Both compute in fp32; the
 * mean is accumulated in double, the closest we can get to the exact value
 * (torch's summation order is not reproducible).
 *
 * A W2A8 product then is y = (sum_k code * xq) / s * scale: an exact int32
 * dot product followed by bn_w2a8_epilogue, which every kernel uses.
 */
#ifndef BN_QUANT_RULES_H
#define BN_QUANT_RULES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define BN_QUANT_EPS 1e-5f

/* round-half-even then clamp to [lo, hi]; NaN becomes 0 (never undefined).
 * The per-element rule of both quantizers, shared by their SIMD versions. */
static inline int bn_round_clamp(float v, int lo, int hi)
{
    float r = rintf(v);
    if (r != r)
        return 0;
    return r > (float)hi ? hi : r < (float)lo ? lo : (int)r;
}

/* Ternary codes for n weights and the per-tensor scale (mean|W|, at least
 * 1e-5). codes may not alias w. */
void bn_quantize_weights_absmean(const float *w, size_t n, int8_t *codes, float *scale);

/* One activation row of k values: int8 values, the scale s (127/absmax)
 * and the sum of the int8 values (used by kernels that store codes + 1). */
void bn_quantize_activations_row(const float *x, int64_t k, int8_t *xq, float *scale,
                                 int32_t *sum);

/* RMSNorm (weights w, epsilon eps) then absmax int8 quantization of one
 * row of n values, as every layer's projections take their input: q[0..n)
 * the codes, *scale the activation scale (127 / max|normed x|), *sum the
 * sum of the codes. The rule the kernel providers' SIMD versions and the
 * GPU kernels reproduce (quant_rules.c says how it is evaluated). */
void bn_norm_quantize_row(const float *x, const float *w, int64_t n, float eps, int8_t *q,
                          float *scale, int32_t *sum);

/* The sum of squares of bn_norm_quantize_row: element i in running sum
 * i % 8 (each square exact in double), the eight combined pairwise. SIMD
 * versions keep these lanes, so they add in the same order. */
static inline double bn_norm_lanes_sum(const double lane[8])
{
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
           ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* The float epilogue shared by every W2A8 kernel; keep it the only one so
 * all providers agree bit for bit. */
static inline float bn_w2a8_epilogue(int32_t acc, float act_scale, float weight_scale)
{
    return ((float)acc / act_scale) * weight_scale;
}

#endif
