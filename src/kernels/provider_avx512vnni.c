/*
 * provider_avx512vnni.c - W2A8 with AVX-512 VNNI (vpdpbusd: four u8 x s8
 * products summed into each int32 lane in one instruction).
 *
 * Layout: x86_layout.h. Rows of activations (prompt chunks, batches) are
 * compute-bound: a tile of two weight rows against four activation rows
 * shifts each 2-bit field of a weight group down to its code (0, 1, 2)
 * once and feeds it to four vpdpbusd, one per activation row, so a group
 * costs 18 loads and 14 shifts and masks for 32 vpdpbusd. On the 2-core
 * Zen 4 VM that is 1.2x the AVX-512 BW provider's prompt speed. A single
 * activation row (decode) streams the weights from memory, where the
 * AVX-512 BW provider's matvec measured faster (a VNNI matvec with the
 * fields masked in place streamed at about half its speed): this provider
 * uses that matvec.
 */
#include <immintrin.h>

#include "quant_rules.h"
#include "x86_layout.h"

void bn_avx512_quantize_activations(const float *x, int64_t k, int8_t *xq, float *scale,
                                    int32_t *sum);
void bn_avx512_norm_quantize_row(const float *x, const float *w, int64_t n, float eps,
                                 int8_t *q, float *scale, int32_t *sum);
void bn_avx512_matvec(const bn_w2a8_weights *w, const int8_t *xq, float act_scale,
                      int32_t act_sum, int64_t row_begin, int64_t row_end, float *y);

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

/* Two weight rows (r and r + 1; with nr 1, row r twice) against four
 * activation rows from m0 (rows past mb repeat row m0 and are not used):
 * out[a][i] = sum of code * x, exactly. */
static inline __attribute__((always_inline)) void
tile_2x4(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t m0, int mb, int64_t r, int nr,
         const __mmask64 masks[4], int32_t out[2][4])
{
    const int64_t full = w->k / BN_X86_GROUP, tail = w->k % BN_X86_GROUP;
    const uint8_t *w0 = w->data + r * w->row_stride;
    const uint8_t *w1 = nr > 1 ? w0 + w->row_stride : w0;
    const __m512i three = _mm512_set1_epi8(3);
    const int8_t *xs[4];
    __m512i acc[2][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        xs[i] = x->q + (m0 + (i < mb ? i : 0)) * x->lda;
        acc[0][i] = acc[1][i] = _mm512_setzero_si512();
    }
    for (int64_t g = 0; g <= full; g++) {
        if (g == full && tail == 0)
            break;
        const __m512i a = _mm512_load_si512((const void *)(w0 + g * BN_X86_GROUP_BYTES));
        const __m512i b = _mm512_load_si512((const void *)(w1 + g * BN_X86_GROUP_BYTES));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            /* vpsrlw shifts 16-bit lanes; the mask drops the bits that
             * came in from the next byte. */
            const __m512i ca = _mm512_and_si512(_mm512_srli_epi16(a, 2 * j), three);
            const __m512i cb = _mm512_and_si512(_mm512_srli_epi16(b, 2 * j), three);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int8_t *xp = xs[i] + g * BN_X86_GROUP + 64 * j;
                const __m512i xv = g == full ? _mm512_maskz_loadu_epi8(masks[j], xp)
                                             : _mm512_loadu_si512((const void *)xp);
                acc[0][i] = _mm512_dpbusd_epi32(acc[0][i], ca, xv);
                acc[1][i] = _mm512_dpbusd_epi32(acc[1][i], cb, xv);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        out[0][i] = _mm512_reduce_add_epi32(acc[0][i]);
        out[1][i] = _mm512_reduce_add_epi32(acc[1][i]);
    }
}

static void vnni_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t row_begin,
                        int64_t row_end, float *y, int64_t ldy)
{
    __mmask64 masks[4];
    bn_x86_tail_masks(w->k % BN_X86_GROUP, masks);
    for (int64_t m0 = 0; m0 < x->m; m0 += 4) {
        const int mb = x->m - m0 < 4 ? (int)(x->m - m0) : 4;
        for (int64_t r = row_begin; r < row_end; r += 2) {
            const int nr = row_end - r < 2 ? 1 : 2;
            int32_t acc[2][4];
            tile_2x4(w, x, m0, mb, r, nr, masks, acc);
            for (int a = 0; a < nr; a++)
                for (int i = 0; i < mb; i++) {
                    const int64_t m = m0 + i;
                    y[m * ldy + r + a] =
                        bn_w2a8_epilogue(acc[a][i] - x->sum[m], x->scale[m], w->scale);
                }
        }
    }
}

const bn_kernel_provider bn_provider_avx512vnni = {
    .name = "avx512vnni",
    .priority = 45,
    .is_available = vnni_available,
    .pack_weights = vnni_pack,
    .matmul = vnni_matmul,
    .matvec = bn_avx512_matvec,
    .quantize_activations = bn_avx512_quantize_activations,
    .norm_quantize_row = bn_avx512_norm_quantize_row,
};
