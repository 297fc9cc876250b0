/*
 * provider_avx512vnni.c - W2A8 with AVX-512 VNNI (vpdpbusd: four u8 x s8
 * products summed into each int32 lane in one instruction).
 *
 * Layout: x86_layout.h. Instead of shifting each 2-bit field down, we mask
 * it in place: field j of a byte is code_j * 4^j, so
 *
 *     sum code*x = acc0 + acc1/4 + acc2/16 + acc3/64
 *
 * with one accumulator per field; each accumulator lane is an exact
 * multiple of its 4^j, so the arithmetic shifts are exact. That saves the
 * three shifts per 64 bytes of weights. Lane bounds: field 3 adds at most
 * 4 * 128 * 128 = 65536 per group, so k <= 4194304 (16384 groups) is safe.
 *
 * Tiles: matvec handles 4 weight rows against one activation row (the four
 * activation loads are shared); matmul handles 1 weight row against 4
 * activation rows (the mask work is shared). Row tails of fewer than 256
 * activations use masked loads, which read nothing past k.
 */
#include <immintrin.h>

#include "quant_rules.h"
#include "x86_layout.h"

void bn_avx512_quantize_activations(const float *x, int64_t k, int8_t *xq, float *scale,
                                    int32_t *sum);

static bool vnni_available(void)
{
    const bn_cpu_features *f = bn_cpu_features_get();
    return f->avx512f && f->avx512bw && f->avx512vnni;
}

static bn_status vnni_pack(const int8_t *codes, int64_t n, int64_t k, float scale,
                           bn_w2a8_weights *w, bn_error *err)
{
    return bn_x86_pack_weights(&bn_provider_avx512vnni, codes, n, k, scale, w, err);
}

/* Byte masks for the valid activations of a tail group, one per field. */
static inline __attribute__((always_inline)) void load_x(const int8_t *x, const __mmask64 *masks, __m512i xv[4])
{
    if (masks) {
        for (int j = 0; j < 4; j++)
            xv[j] = _mm512_maskz_loadu_epi8(masks[j], x + 64 * j);
    } else {
        for (int j = 0; j < 4; j++)
            xv[j] = _mm512_loadu_si512((const void *)(x + 64 * j));
    }
}

/* acc[0..3] for one weight group against one activation group. */
static inline __attribute__((always_inline)) void group_dot(const uint8_t *wg, const __m512i xv[4], __m512i acc[4])
{
    const __m512i w = _mm512_load_si512((const void *)wg);
    acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_and_si512(w, _mm512_set1_epi8(0x03)), xv[0]);
    acc[1] = _mm512_dpbusd_epi32(acc[1], _mm512_and_si512(w, _mm512_set1_epi8(0x0c)), xv[1]);
    acc[2] = _mm512_dpbusd_epi32(acc[2], _mm512_and_si512(w, _mm512_set1_epi8(0x30)), xv[2]);
    acc[3] = _mm512_dpbusd_epi32(acc[3], _mm512_and_si512(w, _mm512_set1_epi8((char)0xc0)), xv[3]);
}

static inline int32_t combine(const __m512i acc[4])
{
    __m512i v = _mm512_add_epi32(acc[0], _mm512_srai_epi32(acc[1], 2));
    v = _mm512_add_epi32(v, _mm512_srai_epi32(acc[2], 4));
    v = _mm512_add_epi32(v, _mm512_srai_epi32(acc[3], 6));
    return _mm512_reduce_add_epi32(v);
}

/* Four weight rows against one activation row: the activation loads are
 * shared by the four rows. The loops over rows and fields are unrolled so
 * the sixteen accumulators stay in registers. */
static void vnni_matvec_4rows(const bn_w2a8_weights *w, const int8_t *xq, int64_t r,
                              const __mmask64 masks[4], int32_t out[4])
{
    const int64_t full = w->k / BN_X86_GROUP, tail = w->k % BN_X86_GROUP;
    const uint8_t *rows[4];
    __m512i acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        rows[i] = w->data + (r + i) * w->row_stride;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            acc[i][j] = _mm512_setzero_si512();
    }
    for (int64_t g = 0; g < full; g++) {
        __m512i xv[4];
        load_x(xq + g * BN_X86_GROUP, NULL, xv);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            group_dot(rows[i] + g * BN_X86_GROUP_BYTES, xv, acc[i]);
    }
    if (tail) {
        __m512i xv[4];
        load_x(xq + full * BN_X86_GROUP, masks, xv);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            group_dot(rows[i] + full * BN_X86_GROUP_BYTES, xv, acc[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        out[i] = combine(acc[i]);
}

static int32_t vnni_row(const bn_w2a8_weights *w, const int8_t *xq, int64_t r,
                        const __mmask64 masks[4])
{
    const int64_t full = w->k / BN_X86_GROUP, tail = w->k % BN_X86_GROUP;
    const uint8_t *row = w->data + r * w->row_stride;
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    __m512i xv[4];
    for (int64_t g = 0; g < full; g++) {
        load_x(xq + g * BN_X86_GROUP, NULL, xv);
        group_dot(row + g * BN_X86_GROUP_BYTES, xv, acc);
    }
    if (tail) {
        load_x(xq + full * BN_X86_GROUP, masks, xv);
        group_dot(row + full * BN_X86_GROUP_BYTES, xv, acc);
    }
    return combine(acc);
}

static void vnni_matvec(const bn_w2a8_weights *w, const int8_t *xq, float act_scale,
                        int32_t act_sum, int64_t row_begin, int64_t row_end, float *y)
{
    __mmask64 masks[4];
    bn_x86_tail_masks(w->k % BN_X86_GROUP, masks);
    int64_t r = row_begin;
    for (; r + 4 <= row_end; r += 4) {
        int32_t acc[4];
        vnni_matvec_4rows(w, xq, r, masks, acc);
        for (int i = 0; i < 4; i++)
            y[r + i] = bn_w2a8_epilogue(acc[i] - act_sum, act_scale, w->scale);
    }
    for (; r < row_end; r++)
        y[r] = bn_w2a8_epilogue(vnni_row(w, xq, r, masks) - act_sum, act_scale, w->scale);
}

/* One weight row against up to four activation rows: the masked fields of
 * each weight group are computed once and used by every activation row. */
static void vnni_matmul_row(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t m0, int mb,
                            int64_t r, const __mmask64 masks[4], int32_t out[4])
{
    const int64_t full = w->k / BN_X86_GROUP, tail = w->k % BN_X86_GROUP;
    const uint8_t *row = w->data + r * w->row_stride;
    const int8_t *xs[4];
    __m512i acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        xs[i] = x->q + (m0 + (i < mb ? i : 0)) * x->lda; /* unused rows repeat row m0 */
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            acc[i][j] = _mm512_setzero_si512();
    }
    for (int64_t g = 0; g <= full; g++) {
        if (g == full && tail == 0)
            break;
        const __mmask64 *mk = g == full ? masks : NULL;
        const __m512i wv = _mm512_load_si512((const void *)(row + g * BN_X86_GROUP_BYTES));
        const __m512i c[4] = {_mm512_and_si512(wv, _mm512_set1_epi8(0x03)),
                              _mm512_and_si512(wv, _mm512_set1_epi8(0x0c)),
                              _mm512_and_si512(wv, _mm512_set1_epi8(0x30)),
                              _mm512_and_si512(wv, _mm512_set1_epi8((char)0xc0))};
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512i xv[4];
            load_x(xs[i] + g * BN_X86_GROUP, mk, xv);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], c[j], xv[j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        out[i] = combine(acc[i]);
}

static void vnni_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t row_begin,
                        int64_t row_end, float *y, int64_t ldy)
{
    __mmask64 masks[4];
    bn_x86_tail_masks(w->k % BN_X86_GROUP, masks);
    for (int64_t m0 = 0; m0 < x->m; m0 += 4) {
        const int mb = x->m - m0 < 4 ? (int)(x->m - m0) : 4;
        for (int64_t r = row_begin; r < row_end; r++) {
            int32_t acc[4];
            vnni_matmul_row(w, x, m0, mb, r, masks, acc);
            for (int i = 0; i < mb; i++) {
                const int64_t m = m0 + i;
                y[m * ldy + r] = bn_w2a8_epilogue(acc[i] - x->sum[m], x->scale[m], w->scale);
            }
        }
    }
}

const bn_kernel_provider bn_provider_avx512vnni = {
    .name = "avx512vnni",
    .priority = 35,
    .is_available = vnni_available,
    .pack_weights = vnni_pack,
    .matmul = vnni_matmul,
    .matvec = vnni_matvec,
    .quantize_activations = bn_avx512_quantize_activations,
};
