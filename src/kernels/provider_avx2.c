/*
 * provider_avx2.c - W2A8 with AVX2 (vpmaddubsw / vpmaddwd), and the AVX2
 * activation quantizer.
 *
 * Layout: x86_layout.h. A 64-byte group is two 32-byte halves; half h of
 * field j pairs with activations [64j + 32h, 64j + 32h + 32). Codes are
 * shifted down and masked to {0,1,2}; vpmaddubsw adds pairs into int16
 * (|pair| <= 512, four fields <= 2048: no saturation) and vpmaddwd widens
 * to int32 once per half group.
 *
 * AVX2 has no byte-masked loads, so a row's last, partial group reads its
 * activations from a zero-padded copy (one per activation row per call).
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "quant_rules.h"
#include "x86_layout.h"

static bool avx2_available(void) { return bn_cpu_features_get()->avx2; }

static bn_status avx2_pack(const int8_t *codes, int64_t n, int64_t k, float scale,
                           bn_w2a8_weights *w, bn_error *err)
{
    return bn_x86_pack_weights(&bn_provider_avx2, codes, n, k, scale, w, err);
}

/* Sum over one group of code * x for one activation group (256 values). */
static inline __m256i group_dot(const uint8_t *wg, const int8_t *x, __m256i acc)
{
    const __m256i three = _mm256_set1_epi8(3);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
        const __m256i w = _mm256_load_si256((const __m256i *)(wg + 32 * h));
        __m256i p = _mm256_maddubs_epi16(_mm256_and_si256(w, three),
                                         _mm256_loadu_si256((const __m256i *)(x + 32 * h)));
        for (int j = 1; j < 4; j++) {
            const __m256i c = _mm256_and_si256(_mm256_srli_epi16(w, 2 * j), three);
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + 64 * j + 32 * h));
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(c, xv));
        }
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
    return acc;
}

static inline int32_t hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* Activation row prepared for one call: full groups read in place, the
 * partial last group from a zero-padded copy. */
typedef struct act_row {
    const int8_t *x;
    _Alignas(32) int8_t tail[BN_X86_GROUP];
} act_row;

static void act_row_init(act_row *a, const int8_t *x, int64_t k)
{
    const int64_t full = k / BN_X86_GROUP, tail = k % BN_X86_GROUP;
    a->x = x;
    memset(a->tail, 0, sizeof a->tail);
    memcpy(a->tail, x + full * BN_X86_GROUP, (size_t)tail);
}

static int32_t row_dot(const bn_w2a8_weights *w, int64_t r, const act_row *a)
{
    const int64_t full = w->k / BN_X86_GROUP, tail = w->k % BN_X86_GROUP;
    const uint8_t *row = w->data + r * w->row_stride;
    __m256i acc = _mm256_setzero_si256();
    for (int64_t g = 0; g < full; g++)
        acc = group_dot(row + g * BN_X86_GROUP_BYTES, a->x + g * BN_X86_GROUP, acc);
    if (tail)
        acc = group_dot(row + full * BN_X86_GROUP_BYTES, a->tail, acc);
    return hsum_epi32(acc);
}

static void avx2_matvec(const bn_w2a8_weights *w, const int8_t *xq, float act_scale,
                        int32_t act_sum, int64_t row_begin, int64_t row_end, float *y)
{
    act_row a;
    act_row_init(&a, xq, w->k);
    for (int64_t r = row_begin; r < row_end; r++)
        y[r] = bn_w2a8_epilogue(row_dot(w, r, &a) - act_sum, act_scale, w->scale);
}

static void avx2_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t row_begin,
                        int64_t row_end, float *y, int64_t ldy)
{
    for (int64_t m = 0; m < x->m; m++) {
        act_row a;
        act_row_init(&a, x->q + m * x->lda, w->k);
        for (int64_t r = row_begin; r < row_end; r++)
            y[m * ldy + r] =
                bn_w2a8_epilogue(row_dot(w, r, &a) - x->sum[m], x->scale[m], w->scale);
    }
}

/* Same arithmetic as bn_quantize_activations_row, 8 lanes at a time; the
 * last k % 8 values go through the scalar routine's per-element rule. */
static void avx2_quantize_activations(const float *x, int64_t k, int8_t *xq, float *scale,
                                      int32_t *sum)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const int64_t k8 = k / 8 * 8;
    __m256 amax_v = _mm256_setzero_ps();
    for (int64_t i = 0; i < k8; i += 8)
        amax_v = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), amax_v);
    _Alignas(32) float lanes[8];
    _mm256_store_ps(lanes, amax_v);
    float amax = 0.0f;
    for (int i = 0; i < 8; i++)
        amax = lanes[i] > amax ? lanes[i] : amax;
    for (int64_t i = k8; i < k; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    if (!(amax >= BN_QUANT_EPS))
        amax = BN_QUANT_EPS;
    const float s = 127.0f / amax;
    const __m256 sv = _mm256_set1_ps(s);
    const __m256 lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
    __m256i sum_v = _mm256_setzero_si256();
    for (int64_t i = 0; i < k8; i += 8) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q)); /* NaN -> 0 */
        r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
        const __m256i q = _mm256_cvtps_epi32(r);
        sum_v = _mm256_add_epi32(sum_v, q);
        /* int32 -> int8: pack within 128-bit lanes, then gather the 8 bytes. */
        const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        _mm_storel_epi64((__m128i *)(xq + i), _mm_packs_epi16(q16, q16));
    }
    int32_t total = hsum_epi32(sum_v);
    for (int64_t i = k8; i < k; i++) {
        int v = bn_round_clamp(x[i] * s, -128, 127);
        xq[i] = (int8_t)v;
        total += v;
    }
    *scale = s;
    *sum = total;
}

/* bn_norm_quantize_row with the same operations, 8 values a step: the sum
 * of squares in its eight lanes (two vectors of four doubles; an FMA adds
 * the exact square once rounded, as the scalar += does), the maxima by
 * compare-and-select (NaN never compares greater, as in the scalar loop),
 * the codes by the same double multiply, divide and multiply, rounded to
 * nearest-even. Rows of other lengths than whole steps, and the rare rows
 * of the plain rule, take the scalar routine. */
static void avx2_norm_quantize_row(const float *x, const float *w, int64_t n, float eps,
                                   int8_t *q, float *scale, int32_t *sum)
{
    if (n % 8 != 0 || n == 0) {
        bn_norm_quantize_row(x, w, n, eps, q, scale, sum);
        return;
    }
    const __m256d abs_d = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256 abs_f = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256d ss_lo = _mm256_setzero_pd(), ss_hi = _mm256_setzero_pd();
    __m256d umax_v = _mm256_setzero_pd();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i), wv = _mm256_loadu_ps(w + i);
        const __m256d x_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(xv));
        const __m256d x_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1));
        const __m256d w_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(wv));
        const __m256d w_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(wv, 1));
        ss_lo = _mm256_fmadd_pd(x_lo, x_lo, ss_lo);
        ss_hi = _mm256_fmadd_pd(x_hi, x_hi, ss_hi);
        const __m256d u_lo = _mm256_and_pd(_mm256_mul_pd(w_lo, x_lo), abs_d);
        const __m256d u_hi = _mm256_and_pd(_mm256_mul_pd(w_hi, x_hi), abs_d);
        umax_v = _mm256_blendv_pd(umax_v, u_lo, _mm256_cmp_pd(u_lo, umax_v, _CMP_GT_OQ));
        umax_v = _mm256_blendv_pd(umax_v, u_hi, _mm256_cmp_pd(u_hi, umax_v, _CMP_GT_OQ));
    }
    double lane[8], um[4];
    _mm256_storeu_pd(lane, ss_lo);
    _mm256_storeu_pd(lane + 4, ss_hi);
    _mm256_storeu_pd(um, umax_v);
    double umax = 0.0;
    for (int i = 0; i < 4; i++)
        umax = um[i] > umax ? um[i] : umax;
    const float inv = 1.0f / sqrtf((float)(bn_norm_lanes_sum(lane) / (double)n) + eps);
    const __m256 inv_v = _mm256_set1_ps(inv);
    __m256 amax_v = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 a = _mm256_and_ps(
            _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), inv_v)),
            abs_f);
        amax_v = _mm256_blendv_ps(amax_v, a, _mm256_cmp_ps(a, amax_v, _CMP_GT_OQ));
    }
    float am[8], amax = 0.0f;
    _mm256_storeu_ps(am, amax_v);
    for (int i = 0; i < 8; i++)
        amax = am[i] > amax ? am[i] : amax;
    if (!(amax >= BN_QUANT_EPS && umax > 0.0 && isfinite(umax))) {
        bn_norm_quantize_row(x, w, n, eps, q, scale, sum);
        return;
    }
    const __m256d umax_d = _mm256_set1_pd(umax), c127 = _mm256_set1_pd(127.0);
    __m256i sum_v = _mm256_setzero_si256();
    for (int64_t i = 0; i < n; i += 8) {
        __m128i half[2];
        for (int h = 0; h < 2; h++) {
            const __m256d p = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + i + 4 * h)),
                                            _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * h)));
            __m256d r = _mm256_round_pd(_mm256_mul_pd(c127, _mm256_div_pd(p, umax_d)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm256_and_pd(r, _mm256_cmp_pd(r, r, _CMP_ORD_Q)); /* NaN -> 0 */
            half[h] = _mm256_cvtpd_epi32(r);
        }
        const __m256i v = _mm256_set_m128i(half[1], half[0]);
        sum_v = _mm256_add_epi32(sum_v, v);
        const __m128i v16 = _mm_packs_epi32(half[0], half[1]);
        _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(v16, v16));
    }
    *scale = 127.0f / amax;
    *sum = hsum_epi32(sum_v);
}

const bn_kernel_provider bn_provider_avx2 = {
    .name = "avx2",
    .priority = 30,
    .is_available = avx2_available,
    .pack_weights = avx2_pack,
    .matmul = avx2_matmul,
    .matvec = avx2_matvec,
    .quantize_activations = avx2_quantize_activations,
    .norm_quantize_row = avx2_norm_quantize_row,
};
