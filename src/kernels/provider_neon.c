/*
 * provider_neon.c - W2A8 with baseline ARMv8 ASIMD (SMLAL / SADALP), and the
 * code both aarch64 providers share: packing, the activation quantizer and
 * the tile drivers (declared in neon_layout.h).
 *
 * Layout: neon_layout.h. Without SDOT, each field of 16 codes meets its 16
 * activations through two widening multiply-accumulates (SMLAL on the low
 * 8 lanes, SMLAL2 on the high 8) into one int16x8 partial sum, and SADALP
 * folds the partial sums into int32 lanes once per block of
 * NEON_I16_BLOCK_GROUPS groups. Int16 bound: a product code * x lies in
 * [-256, 254]; one group adds 4 fields x 2 = 8 products to each int16 lane,
 * so a block of 8 groups stays within [-16384, 16256], far from overflow.
 */
#include <string.h>

#include "neon_layout.h"
#include "quant_rules.h"

/* ------------------------------------------------------------------------ */
/* Shared with provider_neon_dotprod.c                                       */
/* ------------------------------------------------------------------------ */

bool bn_neon_dotprod_available(void)
{
    const bn_cpu_features *f = bn_cpu_features_get();
    return f->neon && f->dotprod;
}

/* Same arithmetic as bn_quantize_activations_row, 16 values at a time:
 *  - max|x| keeps a lane only when it compares greater, as the scalar loop
 *    does, so NaN is skipped (vmaxq_f32 would propagate it, and vmaxnmq_f32
 *    does not skip a signalling NaN);
 *  - x * s is the same fp32 multiply;
 *  - FCVTNS (vcvtnq_s32_f32) rounds to nearest, ties to even, turns NaN
 *    into 0 and saturates to int32, and the two saturating narrows (SQXTN)
 *    clamp to int16 then int8: together exactly bn_round_clamp(v, -128, 127);
 *  - the sum adds the stored int8 values, widened pairwise (exact).
 * The last k % 16 values go through the scalar rule itself. */
void bn_neon_quantize_activations(const float *x, int64_t k, int8_t *xq, float *scale,
                                  int32_t *sum)
{
    const int64_t k16 = k / 16 * 16;
    float32x4_t amax_v[4];
    for (int j = 0; j < 4; j++)
        amax_v[j] = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < k16; i += 16) {
        for (int j = 0; j < 4; j++) {
            const float32x4_t a = vabsq_f32(vld1q_f32(x + i + 4 * j));
            amax_v[j] = vbslq_f32(vcgtq_f32(a, amax_v[j]), a, amax_v[j]);
        }
    }
    float lanes[16];
    for (int j = 0; j < 4; j++)
        vst1q_f32(lanes + 4 * j, amax_v[j]);
    float amax = 0.0f;
    for (int i = 0; i < 16; i++)
        amax = lanes[i] > amax ? lanes[i] : amax;
    for (int64_t i = k16; i < k; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    if (!(amax >= BN_QUANT_EPS))
        amax = BN_QUANT_EPS;
    const float s = 127.0f / amax;

    const float32x4_t sv = vdupq_n_f32(s);
    int32x4_t total_v = vdupq_n_s32(0);
    for (int64_t i = 0; i < k16; i += 16) {
        int32x4_t q[4];
        for (int j = 0; j < 4; j++)
            q[j] = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + i + 4 * j), sv));
        const int16x8_t lo = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
        const int16x8_t hi = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
        const int8x16_t q8 = vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi));
        vst1q_s8(xq + i, q8);
        total_v = vpadalq_s16(total_v, vpaddlq_s8(q8));
    }
    int32_t total = vaddvq_s32(total_v);
    for (int64_t i = k16; i < k; i++) {
        const int v = bn_round_clamp(x[i] * s, -128, 127);
        xq[i] = (int8_t)v;
        total += v;
    }
    *scale = s;
    *sum = total;
}

static void act_init(bn_neon_act *a, const int8_t *x, int64_t k)
{
    const int64_t full = k / BN_NEON_GROUP, tail = k % BN_NEON_GROUP;
    a->x = x;
    memset(a->tail, 0, sizeof a->tail);
    memcpy(a->tail, x + full * BN_NEON_GROUP, (size_t)tail);
}

/* One tile: rows weight rows from `row` against acts_n activation rows,
 * dots[a * rows + i] = sum code * x. The provider's tile function runs over
 * the whole groups in place, then over the tail group from the copies. */
static void run_tile(bn_neon_tile_fn *tile, const bn_w2a8_weights *w, int64_t row, int rows,
                     const bn_neon_act *acts, int acts_n, int32_t *dots)
{
    const int64_t full = w->k / BN_NEON_GROUP;
    const uint8_t *wrow[BN_NEON_TILE_ROWS];
    const int8_t *xrow[BN_NEON_TILE_ACTS];
    int32x4_t acc[BN_NEON_TILE_ACTS][BN_NEON_TILE_ROWS];
    for (int a = 0; a < BN_NEON_TILE_ACTS; a++)
        for (int i = 0; i < BN_NEON_TILE_ROWS; i++)
            acc[a][i] = vdupq_n_s32(0);
    for (int i = 0; i < rows; i++)
        wrow[i] = w->data + (row + i) * w->row_stride;
    for (int a = 0; a < acts_n; a++)
        xrow[a] = acts[a].x;
    if (full > 0)
        tile(wrow, rows, xrow, acts_n, full, acc);
    if (w->k % BN_NEON_GROUP) {
        for (int i = 0; i < rows; i++)
            wrow[i] += full * BN_NEON_GROUP_BYTES;
        for (int a = 0; a < acts_n; a++)
            xrow[a] = acts[a].tail;
        tile(wrow, rows, xrow, acts_n, 1, acc);
    }
    for (int a = 0; a < acts_n; a++)
        for (int i = 0; i < rows; i++)
            dots[a * rows + i] = vaddvq_s32(acc[a][i]);
}

/* Tile shapes of the drivers (see BN_NEON_TILE_ROWS in neon_layout.h). A
 * matmul tile is 2 weight rows x 4 activation rows: with 4 x 4 the
 * accumulators and decoded codes would no longer fit in 32 registers. */
enum { MATVEC_TILE_ROWS = 4, MATMUL_TILE_ROWS = 2, MATMUL_TILE_ACTS = 4 };

/* Weight rows [row_begin, row_end) against one activation row: tiles of 4
 * rows share each activation load, single rows finish the range. */
static void rows_against_one_act(bn_neon_tile_fn *tile, const bn_w2a8_weights *w,
                                 const bn_neon_act *a, float act_scale, int32_t act_sum,
                                 int64_t row_begin, int64_t row_end, float *y)
{
    int32_t dots[BN_NEON_TILE_ROWS];
    int64_t r = row_begin;
    for (; r + MATVEC_TILE_ROWS <= row_end; r += MATVEC_TILE_ROWS) {
        run_tile(tile, w, r, MATVEC_TILE_ROWS, a, 1, dots);
        for (int i = 0; i < MATVEC_TILE_ROWS; i++)
            y[r + i] = bn_w2a8_epilogue(dots[i] - act_sum, act_scale, w->scale);
    }
    for (; r < row_end; r++) {
        run_tile(tile, w, r, 1, a, 1, dots);
        y[r] = bn_w2a8_epilogue(dots[0] - act_sum, act_scale, w->scale);
    }
}

void bn_neon_matvec(bn_neon_tile_fn *tile, const bn_w2a8_weights *w, const int8_t *xq,
                    float act_scale, int32_t act_sum, int64_t row_begin, int64_t row_end,
                    float *y)
{
    bn_neon_act a;
    act_init(&a, xq, w->k);
    rows_against_one_act(tile, w, &a, act_scale, act_sum, row_begin, row_end, y);
}

/* Activation rows go in blocks of 4 (then 2) that share every decoded
 * weight group; within a block, tiles of 2 weight rows share every
 * activation load. A last single activation row is a matvec. */
void bn_neon_matmul(bn_neon_tile_fn *tile, const bn_w2a8_weights *w, const bn_q8_rows *x,
                    int64_t row_begin, int64_t row_end, float *y, int64_t ldy)
{
    bn_neon_act acts[BN_NEON_TILE_ACTS];
    int32_t dots[BN_NEON_TILE_ROWS * BN_NEON_TILE_ACTS];
    int64_t m = 0;
    while (m < x->m) {
        const int64_t left = x->m - m;
        const int act_rows = left >= MATMUL_TILE_ACTS ? MATMUL_TILE_ACTS : left >= 2 ? 2 : 1;
        if (act_rows == 1) {
            act_init(&acts[0], x->q + m * x->lda, w->k);
            rows_against_one_act(tile, w, &acts[0], x->scale[m], x->sum[m], row_begin, row_end,
                                 y + m * ldy);
            m++;
            continue;
        }
        for (int a = 0; a < act_rows; a++)
            act_init(&acts[a], x->q + (m + a) * x->lda, w->k);
        for (int64_t r = row_begin; r < row_end;) {
            const int rows = row_end - r >= MATMUL_TILE_ROWS ? MATMUL_TILE_ROWS : 1;
            run_tile(tile, w, r, rows, acts, act_rows, dots);
            for (int a = 0; a < act_rows; a++)
                for (int i = 0; i < rows; i++)
                    y[(m + a) * ldy + r + i] = bn_w2a8_epilogue(
                        dots[a * rows + i] - x->sum[m + a], x->scale[m + a], w->scale);
            r += rows;
        }
        m += act_rows;
    }
}

/* ------------------------------------------------------------------------ */
/* The baseline provider                                                     */
/* ------------------------------------------------------------------------ */

enum { NEON_I16_BLOCK_GROUPS = 8 };

static bool neon_available(void) { return bn_cpu_features_get()->neon; }

static bn_status neon_pack(const int8_t *codes, int64_t n, int64_t k, float scale,
                           bn_w2a8_weights *w, bn_error *err)
{
    return bn_neon_pack_weights(&bn_provider_neon, codes, n, k, scale, w, err);
}

/* The bn_neon_tile_fn of this provider. Always inlined with constant rows
 * and acts_n (see neon_tile), so the loops over them unroll and every
 * accumulator lives in a register. */
static inline __attribute__((always_inline)) void
accumulate_groups(const uint8_t *const wrow[], const int rows, const int8_t *const xrow[],
                  const int acts_n, int64_t groups,
                  int32x4_t acc[BN_NEON_TILE_ACTS][BN_NEON_TILE_ROWS])
{
    for (int64_t g0 = 0; g0 < groups; g0 += NEON_I16_BLOCK_GROUPS) {
        const int64_t g1 =
            groups - g0 < NEON_I16_BLOCK_GROUPS ? groups : g0 + NEON_I16_BLOCK_GROUPS;
        int16x8_t part[BN_NEON_TILE_ACTS][BN_NEON_TILE_ROWS];
        for (int a = 0; a < acts_n; a++)
            for (int i = 0; i < rows; i++)
                part[a][i] = vdupq_n_s16(0);
        for (int64_t g = g0; g < g1; g++) {
            int8x16_t codes[BN_NEON_TILE_ROWS][4];
            for (int i = 0; i < rows; i++)
                bn_neon_decode_group(wrow[i] + g * BN_NEON_GROUP_BYTES, codes[i]);
            for (int a = 0; a < acts_n; a++) {
                int8x16_t xv[4];
                bn_neon_load_group(xrow[a] + g * BN_NEON_GROUP, xv);
                for (int i = 0; i < rows; i++)
                    for (int j = 0; j < 4; j++) {
                        part[a][i] = vmlal_s8(part[a][i], vget_low_s8(codes[i][j]),
                                              vget_low_s8(xv[j]));
                        part[a][i] = vmlal_high_s8(part[a][i], codes[i][j], xv[j]);
                    }
            }
        }
        for (int a = 0; a < acts_n; a++)
            for (int i = 0; i < rows; i++)
                acc[a][i] = vpadalq_s16(acc[a][i], part[a][i]);
    }
}

BN_NEON_DEFINE_TILE(neon_tile, accumulate_groups)

static void neon_matvec(const bn_w2a8_weights *w, const int8_t *xq, float act_scale,
                        int32_t act_sum, int64_t row_begin, int64_t row_end, float *y)
{
    bn_neon_matvec(neon_tile, w, xq, act_scale, act_sum, row_begin, row_end, y);
}

static void neon_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t row_begin,
                        int64_t row_end, float *y, int64_t ldy)
{
    bn_neon_matmul(neon_tile, w, x, row_begin, row_end, y, ldy);
}

/* bn_norm_quantize_row with the same operations, 8 values a step: the sum
 * of squares in its eight lanes (four vectors of two doubles; FMLA adds the
 * exact square once rounded, as the scalar += does), the maxima by
 * compare-and-select (NaN never compares greater, as in the scalar loop),
 * the codes by the same double multiply, divide and multiply, FRINTN
 * rounding to nearest-even and NaN turned into 0 by a compare. Rows of
 * other lengths than whole steps, and the rare rows of the plain rule,
 * take the scalar routine. */
void bn_neon_norm_quantize_row(const float *x, const float *w, int64_t n, float eps, int8_t *q,
                               float *scale, int32_t *sum)
{
    if (n % 8 != 0 || n == 0) {
        bn_norm_quantize_row(x, w, n, eps, q, scale, sum);
        return;
    }
    float64x2_t ss_v[4], umax_v = vdupq_n_f64(0.0);
    for (int j = 0; j < 4; j++)
        ss_v[j] = vdupq_n_f64(0.0);
    for (int64_t i = 0; i < n; i += 8) {
        for (int h = 0; h < 2; h++) {
            const float32x4_t xv = vld1q_f32(x + i + 4 * h), wv = vld1q_f32(w + i + 4 * h);
            const float64x2_t xd[2] = {vcvt_f64_f32(vget_low_f32(xv)), vcvt_high_f64_f32(xv)};
            const float64x2_t wd[2] = {vcvt_f64_f32(vget_low_f32(wv)), vcvt_high_f64_f32(wv)};
            for (int k = 0; k < 2; k++) {
                ss_v[2 * h + k] = vfmaq_f64(ss_v[2 * h + k], xd[k], xd[k]);
                const float64x2_t u = vabsq_f64(vmulq_f64(wd[k], xd[k]));
                umax_v = vbslq_f64(vcgtq_f64(u, umax_v), u, umax_v);
            }
        }
    }
    double lane[8];
    for (int j = 0; j < 4; j++)
        vst1q_f64(lane + 2 * j, ss_v[j]);
    const double u0 = vgetq_lane_f64(umax_v, 0), u1 = vgetq_lane_f64(umax_v, 1);
    const double umax = u1 > u0 ? u1 : u0;
    const float inv = 1.0f / sqrtf((float)(bn_norm_lanes_sum(lane) / (double)n) + eps);
    const float32x4_t inv_v = vdupq_n_f32(inv);
    float32x4_t amax_v = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < n; i += 4) {
        const float32x4_t a =
            vabsq_f32(vmulq_f32(vld1q_f32(w + i), vmulq_f32(vld1q_f32(x + i), inv_v)));
        amax_v = vbslq_f32(vcgtq_f32(a, amax_v), a, amax_v);
    }
    float am[4], amax = 0.0f;
    vst1q_f32(am, amax_v);
    for (int i = 0; i < 4; i++)
        amax = am[i] > amax ? am[i] : amax;
    if (!(amax >= BN_QUANT_EPS && umax > 0.0 && isfinite(umax))) {
        bn_norm_quantize_row(x, w, n, eps, q, scale, sum);
        return;
    }
    const float64x2_t umax_d = vdupq_n_f64(umax), c127 = vdupq_n_f64(127.0);
    int32x4_t sum_v = vdupq_n_s32(0);
    for (int64_t i = 0; i < n; i += 8) {
        int32x2_t part[4];
        for (int h = 0; h < 2; h++) {
            const float32x4_t xv = vld1q_f32(x + i + 4 * h), wv = vld1q_f32(w + i + 4 * h);
            const float64x2_t p[2] = {
                vmulq_f64(vcvt_f64_f32(vget_low_f32(wv)), vcvt_f64_f32(vget_low_f32(xv))),
                vmulq_f64(vcvt_high_f64_f32(wv), vcvt_high_f64_f32(xv))};
            for (int k = 0; k < 2; k++) {
                float64x2_t r = vrndnq_f64(vmulq_f64(c127, vdivq_f64(p[k], umax_d)));
                /* NaN -> 0, as the scalar rule has it. */
                r = vbslq_f64(vceqq_f64(r, r), r, vdupq_n_f64(0.0));
                part[2 * h + k] = vmovn_s64(vcvtq_s64_f64(r));
            }
        }
        const int32x4_t v0 = vcombine_s32(part[0], part[1]), v1 = vcombine_s32(part[2], part[3]);
        sum_v = vaddq_s32(sum_v, vaddq_s32(v0, v1));
        const int16x8_t v16 = vcombine_s16(vmovn_s32(v0), vmovn_s32(v1));
        vst1_s8(q + i, vmovn_s16(v16));
    }
    *scale = 127.0f / amax;
    *sum = vaddvq_s32(sum_v);
}

const bn_kernel_provider bn_provider_neon = {
    .name = "neon",
    .priority = 30,
    .is_available = neon_available,
    .pack_weights = neon_pack,
    .matmul = neon_matmul,
    .matvec = neon_matvec,
    .quantize_activations = bn_neon_quantize_activations,
    .norm_quantize_row = bn_neon_norm_quantize_row,
};
