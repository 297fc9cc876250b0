/*
 * head_screen.c - the CPU's screened LM head (head_screen.h has the design
 * and the bound). The integer dot products come in five forms, one
 * picked by the CPU: AVX-512 VNNI (vpdpbusd: the hidden state's codes
 * offset by 128 as unsigned bytes, the offset taken out with the row's code
 * sum), AVX2 (vpmaddubsw on |q| and y with q's sign, whose pairs stay
 * below 2^15 since both are at most 127), NEON with the dot product
 * (sdot), plain NEON (smull, then pairwise adds into int32) and scalar.
 * All give the same exact integer.
 */
#include "head_screen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

enum { KERNEL_SCALAR, KERNEL_AVX2, KERNEL_AVX512VNNI, KERNEL_NEON, KERNEL_NEONDOT, KERNEL_COUNT };
static const char *const kernel_names[] = {"scalar", "avx2", "avx512vnni", "neon", "neondot"};

static bool kernel_available(int k)
{
    const bn_cpu_features *cpu = bn_cpu_features_get();
#if defined(__x86_64__)
    if (k == KERNEL_AVX2)
        return cpu->avx2;
    if (k == KERNEL_AVX512VNNI)
        return cpu->avx512f && cpu->avx512bw && cpu->avx512vnni;
#elif defined(__aarch64__)
    if (k == KERNEL_NEON)
        return true;
    if (k == KERNEL_NEONDOT)
        return cpu->dotprod;
#endif
    (void)cpu;
    return k == KERNEL_SCALAR;
}

bn_status bn_head_screen_alloc(bn_head_screen *s, int64_t vocab, int64_t dim, bn_error *err)
{
    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    s->dim = dim;
    s->lda = (dim + 63) / 64 * 64;
    s->codes = bn_aligned_alloc(64, (size_t)(vocab * s->lda));
    s->scale = malloc((size_t)vocab * sizeof *s->scale);
    s->err = malloc((size_t)vocab * sizeof *s->err);
    s->code_sum = malloc((size_t)vocab * sizeof *s->code_sum);
    if (!s->codes || !s->scale || !s->err || !s->code_sum) {
        bn_head_screen_free(s);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "use a machine with more memory",
                            "no memory for the LM head's int8 copy (%.1f MiB)",
                            (double)(vocab * s->lda) / 1048576.0);
    }
    /* The best this CPU has, in this order. */
    static const int best_first[] = {KERNEL_AVX512VNNI, KERNEL_AVX2, KERNEL_NEONDOT, KERNEL_NEON};
    s->kernel = KERNEL_SCALAR;
    for (size_t i = 0; i < sizeof best_first / sizeof best_first[0]; i++)
        if (kernel_available(best_first[i])) {
            s->kernel = best_first[i];
            break;
        }
    return BN_OK;
}

void bn_head_screen_fill(bn_head_screen *s, int64_t begin, int64_t end, bn_head_row_fn row,
                         void *ctx, float *w)
{
    /* g of the bound for the exact head's fp32 dot products of dim terms. */
    const double u = ldexp(1.0, -24), nu = (double)(s->dim + 8) * u, g = nu / (1.0 - nu);
    for (int64_t r = begin; r < end; r++) {
        row(ctx, r, w);
        float m = 0.0f;
        bool finite = true;
        for (int64_t i = 0; i < s->dim; i++) {
            finite &= isfinite(w[i]) != 0;
            m = fabsf(w[i]) > m ? fabsf(w[i]) : m;
        }
        int8_t *q = s->codes + r * s->lda;
        memset(q, 0, (size_t)s->lda);
        const float sc = m / 127.0f;
        /* Rows the bound does not cover are always candidates. */
        if (!finite || !(m >= 0x1p-100f) || !isnormal(sc)) {
            s->scale[r] = 0.0f;
            s->err[r] = 0.0;
            s->code_sum[r] = 0;
            continue;
        }
        int32_t sum = 0;
        for (int64_t i = 0; i < s->dim; i++) {
            double v = rint((double)w[i] / (double)sc);
            v = v > 127.0 ? 127.0 : v < -127.0 ? -127.0 : v;
            q[i] = (int8_t)v;
            sum += (int32_t)v;
        }
        s->scale[r] = sc;
        s->err[r] = 0.501 * (double)sc + g * (double)m;
        s->code_sum[r] = sum;
    }
}

void bn_head_screen_free(bn_head_screen *s)
{
    if (!s)
        return;
    bn_aligned_free(s->codes);
    free(s->scale);
    free(s->err);
    free(s->code_sum);
    memset(s, 0, sizeof *s);
}

uint64_t bn_head_screen_bytes(const bn_head_screen *s)
{
    return (uint64_t)(s->vocab * s->lda) +
           (uint64_t)s->vocab * (sizeof *s->scale + sizeof *s->err + sizeof *s->code_sum);
}

void bn_head_screen_quantize(const bn_head_screen *s, const float *x, bn_head_screen_x *hx)
{
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < s->dim; i++) {
        finite &= isfinite(x[i]) != 0;
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    }
    memset(hx->y, 0, (size_t)s->lda);
    memset(hx->y_u8, 128, (size_t)s->lda);
    hx->sx = amax / 127.0f;
    if (!finite) {
        hx->l1 = hx->ex = NAN; /* every row a candidate */
        return;
    }
    double l1 = 0.0, ex = 0.0;
    for (int64_t i = 0; i < s->dim; i++) {
        double v = hx->sx > 0.0f ? rint((double)x[i] / (double)hx->sx) : 0.0;
        v = v > 127.0 ? 127.0 : v < -127.0 ? -127.0 : v;
        hx->y[i] = (int8_t)v;
        hx->y_u8[i] = (uint8_t)(v + 128.0);
        l1 += fabs((double)x[i]);
        ex += fabs((double)x[i] - (double)hx->sx * v); /* sx * v is exact in double */
    }
    /* The double sums' own rounding (n terms, 2^-53 each) is far below this. */
    hx->l1 = l1 * (1.0 + 1e-12);
    hx->ex = ex * (1.0 + 1e-12);
}

/* ---- the integer dot products ------------------------------------------------ */

static int32_t dot_scalar(const int8_t *q, const bn_head_screen_x *hx, int64_t n)
{
    int32_t acc = 0;
    for (int64_t i = 0; i < n; i++)
        acc += (int32_t)q[i] * (int32_t)hx->y[i];
    return acc;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static int32_t dot_avx2(const int8_t *q,
                                                        const bn_head_screen_x *hx, int64_t n)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int64_t i = 0; i < n; i += 32) {
        const __m256i w = _mm256_load_si256((const __m256i *)(q + i));
        const __m256i x = _mm256_load_si256((const __m256i *)(hx->y + i));
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, ones));
    }
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xb1)));
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int32_t
dot_avx512vnni(const int8_t *q, const bn_head_screen_x *hx, int64_t n, int32_t code_sum)
{
    __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        acc0 = _mm512_dpbusd_epi32(acc0, _mm512_load_si512(hx->y_u8 + i),
                                   _mm512_load_si512(q + i));
        acc1 = _mm512_dpbusd_epi32(acc1, _mm512_load_si512(hx->y_u8 + i + 64),
                                   _mm512_load_si512(q + i + 64));
    }
    for (; i < n; i += 64)
        acc0 = _mm512_dpbusd_epi32(acc0, _mm512_load_si512(hx->y_u8 + i),
                                   _mm512_load_si512(q + i));
    /* sum (y + 128) q = sum y q + 128 sum q */
    return _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1)) - 128 * code_sum;
}
#elif defined(__aarch64__)
/* Products of two int8 in [-127, 127] fit int16; pairs of them are added
 * into int32 lanes at once (vpadalq), so nothing can overflow. */
static int32_t dot_neon(const int8_t *q, const bn_head_screen_x *hx, int64_t n)
{
    int32x4_t acc = vdupq_n_s32(0);
    for (int64_t i = 0; i < n; i += 16) {
        const int8x16_t w = vld1q_s8(q + i), x = vld1q_s8(hx->y + i);
        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w), vget_low_s8(x)));
        acc = vpadalq_s16(acc, vmull_high_s8(w, x));
    }
    return vaddvq_s32(acc);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static int32_t
dot_neondot(const int8_t *q, const bn_head_screen_x *hx, int64_t n)
{
    int32x4_t acc0 = vdupq_n_s32(0), acc1 = vdupq_n_s32(0);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = vdotq_s32(acc0, vld1q_s8(q + i), vld1q_s8(hx->y + i));
        acc1 = vdotq_s32(acc1, vld1q_s8(q + i + 16), vld1q_s8(hx->y + i + 16));
    }
    for (; i < n; i += 16)
        acc0 = vdotq_s32(acc0, vld1q_s8(q + i), vld1q_s8(hx->y + i));
    return vaddvq_s32(vaddq_s32(acc0, acc1));
}
#endif

static int32_t row_dot(const bn_head_screen *s, int64_t r, const bn_head_screen_x *hx)
{
    const int8_t *q = s->codes + r * s->lda;
#if defined(__x86_64__)
    if (s->kernel == KERNEL_AVX512VNNI)
        return dot_avx512vnni(q, hx, s->lda, s->code_sum[r]);
    if (s->kernel == KERNEL_AVX2)
        return dot_avx2(q, hx, s->lda);
#elif defined(__aarch64__)
    if (s->kernel == KERNEL_NEONDOT)
        return dot_neondot(q, hx, s->lda);
    if (s->kernel == KERNEL_NEON)
        return dot_neon(q, hx, s->lda);
#endif
    return dot_scalar(q, hx, s->dim);
}

int32_t bn_head_screen_dot(const bn_head_screen *s, int64_t r, const bn_head_screen_x *hx)
{
    return row_dot(s, r, hx);
}

void bn_head_screen_bounds(const bn_head_screen *s, const bn_head_screen_x *hx, int64_t begin,
                           int64_t end, double *lo, double *hi)
{
    const bool x_finite = !isnan(hx->l1);
    for (int64_t r = begin; r < end; r++) {
        const double sc = (double)s->scale[r];
        if (!x_finite || sc == 0.0) {
            lo[r] = -INFINITY;
            hi[r] = INFINITY;
            continue;
        }
        const double a = sc * (double)hx->sx * (double)row_dot(s, r, hx);
        const double b = (hx->l1 * s->err[r] + 127.0 * sc * hx->ex) * (1.0 + 1e-9) + 1e-9 * fabs(a);
        lo[r] = a - b;
        hi[r] = a + b;
    }
}

bool bn_head_screen_has_vector_kernel(void)
{
    for (int k = KERNEL_SCALAR + 1; k < KERNEL_COUNT; k++)
        if (kernel_available(k))
            return true;
    return false;
}

const char *bn_head_screen_kernel_name(const bn_head_screen *s)
{
    return kernel_names[s->kernel];
}

bool bn_head_screen_force_kernel(bn_head_screen *s, const char *name)
{
    for (int k = 0; k < KERNEL_COUNT; k++)
        if (strcmp(name, kernel_names[k]) == 0 && kernel_available(k)) {
            s->kernel = k;
            return true;
        }
    return false;
}
