/*
 * provider_avx512.c - W2A8 with AVX-512 F/BW, for CPUs without VNNI
 * (Skylake-X and similar), plus the AVX-512 activation quantizer that the
 * VNNI provider shares.
 *
 * Layout: x86_layout.h. Per 64-byte group each 2-bit field is shifted down
 * and masked to a code in {0,1,2}; vpmaddubsw multiplies codes by int8
 * activations and adds pairs into int16 (|pair| <= 2*2*128 = 512, so the
 * four fields' sum stays within +-2048: no saturation), and vpmaddwd with
 * ones widens to int32 once per group.
 */
#include <immintrin.h>
#include <math.h>

#include "quant_rules.h"
#include "x86_layout.h"

static bool avx512_available(void)
{
    const bn_cpu_features *f = bn_cpu_features_get();
    return f->avx512f && f->avx512bw;
}

static bn_status avx512_pack(const int8_t *codes, int64_t n, int64_t k, float scale,
                             bn_w2a8_weights *w, bn_error *err)
{
    return bn_x86_pack_weights(&bn_provider_avx512, codes, n, k, scale, w, err);
}

/* The four code vectors of one 64-byte group. */
static inline void decode_group(const uint8_t *wg, __m512i c[4])
{
    const __m512i three = _mm512_set1_epi8(3);
    const __m512i w = _mm512_load_si512((const void *)wg);
    c[0] = _mm512_and_si512(w, three);
    c[1] = _mm512_and_si512(_mm512_srli_epi16(w, 2), three);
    c[2] = _mm512_and_si512(_mm512_srli_epi16(w, 4), three);
    c[3] = _mm512_and_si512(_mm512_srli_epi16(w, 6), three);
}

/* acc += sum over the group of code * x, widened to int32 lanes. */
static inline __m512i group_dot(const __m512i c[4], const int8_t *x, const __mmask64 *masks,
                                __m512i acc)
{
    __m512i p = _mm512_setzero_si512();
    for (int j = 0; j < 4; j++) {
        const __m512i xv = masks ? _mm512_maskz_loadu_epi8(masks[j], x + 64 * j)
                                 : _mm512_loadu_si512((const void *)(x + 64 * j));
        p = _mm512_add_epi16(p, _mm512_maddubs_epi16(c[j], xv));
    }
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
}

/* One weight row against up to 4 activation rows; acc[i] per activation. */
static void row_dot(const bn_w2a8_weights *w, int64_t r, const int8_t *const *xs, int mb,
                    int32_t *out)
{
    const int64_t full = w->k / BN_X86_GROUP, tail = w->k % BN_X86_GROUP;
    __mmask64 masks[4];
    bn_x86_tail_masks(tail, masks);
    const uint8_t *row = w->data + r * w->row_stride;
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    for (int64_t g = 0; g <= full; g++) {
        if (g == full && tail == 0)
            break;
        __m512i c[4];
        decode_group(row + g * BN_X86_GROUP_BYTES, c);
        for (int i = 0; i < mb; i++)
            acc[i] = group_dot(c, xs[i] + g * BN_X86_GROUP, g == full ? masks : NULL, acc[i]);
    }
    for (int i = 0; i < mb; i++)
        out[i] = _mm512_reduce_add_epi32(acc[i]);
}

/* Also the VNNI provider's matvec (it streams faster than a VNNI one). */
void bn_avx512_matvec(const bn_w2a8_weights *w, const int8_t *xq, float act_scale,
                      int32_t act_sum, int64_t row_begin, int64_t row_end, float *y);
void bn_avx512_matvec(const bn_w2a8_weights *w, const int8_t *xq, float act_scale,
                      int32_t act_sum, int64_t row_begin, int64_t row_end, float *y)
{
    const int8_t *xs[1] = {xq};
    for (int64_t r = row_begin; r < row_end; r++) {
        int32_t acc;
        row_dot(w, r, xs, 1, &acc);
        y[r] = bn_w2a8_epilogue(acc - act_sum, act_scale, w->scale);
    }
}

static void avx512_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t row_begin,
                          int64_t row_end, float *y, int64_t ldy)
{
    for (int64_t m0 = 0; m0 < x->m; m0 += 4) {
        const int mb = x->m - m0 < 4 ? (int)(x->m - m0) : 4;
        const int8_t *xs[4];
        for (int i = 0; i < mb; i++)
            xs[i] = x->q + (m0 + i) * x->lda;
        for (int64_t r = row_begin; r < row_end; r++) {
            int32_t acc[4];
            row_dot(w, r, xs, mb, acc);
            for (int i = 0; i < mb; i++) {
                const int64_t m = m0 + i;
                y[m * ldy + r] = bn_w2a8_epilogue(acc[i] - x->sum[m], x->scale[m], w->scale);
            }
        }
    }
}

/* Same arithmetic as bn_quantize_activations_row, 16 lanes at a time:
 * max ignores NaN (vmaxps returns its second operand when the first is
 * NaN), rounding is to nearest-even, NaN products become 0. */
void bn_avx512_quantize_activations(const float *x, int64_t k, int8_t *xq, float *scale,
                                    int32_t *sum);
void bn_avx512_quantize_activations(const float *x, int64_t k, int8_t *xq, float *scale,
                                    int32_t *sum)
{
    __m512 amax_v = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) {
        const __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        amax_v = _mm512_max_ps(_mm512_abs_ps(v), amax_v);
    }
    float amax = _mm512_reduce_max_ps(amax_v);
    if (!(amax >= BN_QUANT_EPS))
        amax = BN_QUANT_EPS;
    const float s = 127.0f / amax;
    const __m512 sv = _mm512_set1_ps(s);
    const __m512 lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
    __m512i sum_v = _mm512_setzero_si512();
    for (int64_t i = 0; i < k; i += 16) {
        const __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - i)) - 1);
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sv),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);
        r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
        const __m512i q = _mm512_cvtps_epi32(r);
        _mm512_mask_cvtsepi32_storeu_epi8(xq + i, m, q);
        sum_v = _mm512_add_epi32(sum_v, q);
    }
    *scale = s;
    *sum = _mm512_reduce_add_epi32(sum_v);
}

/* bn_norm_quantize_row with the same operations, 8 doubles or 16 floats a
 * step: the sum of squares in its eight lanes (one vector of doubles; an
 * FMA adds the exact square once rounded, as the scalar += does), the
 * maxima with vmaxpd/vmaxps (which return the second operand when the
 * first is NaN, as the scalar comparison skips NaN), the codes by the same
 * double multiply, divide and multiply, rounded to nearest-even. Rows of
 * other lengths than whole vectors, and the rare rows of the plain rule,
 * take the scalar routine. */
void bn_avx512_norm_quantize_row(const float *x, const float *w, int64_t n, float eps,
                                 int8_t *q, float *scale, int32_t *sum);
void bn_avx512_norm_quantize_row(const float *x, const float *w, int64_t n, float eps,
                                 int8_t *q, float *scale, int32_t *sum)
{
    if (n % 16 != 0 || n == 0) {
        bn_norm_quantize_row(x, w, n, eps, q, scale, sum);
        return;
    }
    __m512d ss_v = _mm512_setzero_pd(), umax_v = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 8) {
        const __m512d xd = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        const __m512d wd = _mm512_cvtps_pd(_mm256_loadu_ps(w + i));
        ss_v = _mm512_fmadd_pd(xd, xd, ss_v);
        umax_v = _mm512_max_pd(_mm512_abs_pd(_mm512_mul_pd(wd, xd)), umax_v);
    }
    double lane[8];
    _mm512_storeu_pd(lane, ss_v);
    const double umax = _mm512_reduce_max_pd(umax_v);
    const float inv = 1.0f / sqrtf((float)(bn_norm_lanes_sum(lane) / (double)n) + eps);
    const __m512 inv_v = _mm512_set1_ps(inv);
    __m512 amax_v = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(w + i),
                                       _mm512_mul_ps(_mm512_loadu_ps(x + i), inv_v));
        amax_v = _mm512_max_ps(_mm512_abs_ps(a), amax_v);
    }
    const float amax = _mm512_reduce_max_ps(amax_v);
    if (!(amax >= BN_QUANT_EPS && umax > 0.0 && isfinite(umax))) {
        bn_norm_quantize_row(x, w, n, eps, q, scale, sum);
        return;
    }
    const __m512d umax_d = _mm512_set1_pd(umax), c127 = _mm512_set1_pd(127.0);
    __m256i sum_v = _mm256_setzero_si256();
    for (int64_t i = 0; i < n; i += 8) {
        const __m512d p = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(w + i)),
                                        _mm512_cvtps_pd(_mm256_loadu_ps(x + i)));
        __m512d r = _mm512_roundscale_pd(_mm512_mul_pd(c127, _mm512_div_pd(p, umax_d)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(r, r, _CMP_ORD_Q), r); /* NaN -> 0 */
        const __m256i v = _mm512_cvtpd_epi32(r);
        _mm_storel_epi64((__m128i *)(q + i), _mm256_cvtepi32_epi8(v));
        sum_v = _mm256_add_epi32(sum_v, v);
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum_v), _mm256_extracti128_si256(sum_v, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    *scale = 127.0f / amax;
    *sum = _mm_cvtsi128_si32(s4);
}

const bn_kernel_provider bn_provider_avx512 = {
    .name = "avx512",
    .priority = 40,
    .is_available = avx512_available,
    .pack_weights = avx512_pack,
    .matmul = avx512_matmul,
    .matvec = bn_avx512_matvec,
    .quantize_activations = bn_avx512_quantize_activations,
    .norm_quantize_row = bn_avx512_norm_quantize_row,
};
