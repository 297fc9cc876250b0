/* The Vulkan forward-pass kernels of vk_ops.h against a copy of the CPU
 * backend's arithmetic (cpu_backend.c: rmsnorm, dot_f32, rope_heads,
 * attention_slot, head_row_logits) on the first Vulkan device (the
 * residual add and the squared-ReLU gate are the W2A8 products' epilogues:
 * test_vulkan_w2a8):
 *
 *   - rmsnorm bit for bit: smooth, huge, tiny, zero rows, a NaN, an
 *     infinity, eps 0;
 *   - the LM head bit for bit, F32 and F16 (subnormal halves too), dims a
 *     multiple of 8 (a row an invocation; one x row through its own
 *     kernel) and not, 1 to 9 x rows, a part starting past row 0 (the
 *     logits around it left alone);
 *   - attention over a cache filled as the q, k, v product fills it
 *     (RoPE and the store: test_vulkan_w2a8) against the CPU within 1e-5
 *     of the values' range (exp is not libm's expf), and bit for bit
 *     against the same arithmetic with exp in double rounded to float
 *     (what the kernel computes); several sequences of different lengths
 *     with scattered blocks, prefill rows at consecutive positions, a
 *     decode row, GQA groups 1, 2, 4 and 5, head_dim 64, 128, 100, 58
 *     (keys not on 16 bytes: scalar loads) and a random 8 k + 4, a
 *     context of 700 positions (past a workgroup's 512); passes of fewer
 *     than 8 rows and of 8 or more (a workgroup a row and KV head, or of
 *     128 invocations, past their positions too);
 *   - rows whose sequence or position fall outside the tables: attention
 *     writes NaN;
 *   - the greedy picks of logit rows (bn_vk_argmax_record) against the
 *     sampler's rule: ties, +infinity, NaN, -infinity, -0 and +0, rows of
 *     nothing to pick, a 128 256-token vocabulary, a single token;
 *   - sizes that do not fit their buffers are refused with
 *     BN_ERR_INVALID_ARGUMENT.
 * Outputs are poisoned first, with a guard value after the last.
 *
 * The RMSNorm and the attention are checked in their float variants too
 * (BITNET_VULKAN_FP64=0, as a device without fp64 runs them).
 *
 * Exits 77 (skipped) when no Vulkan device can be opened, saying why. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "test_util.h"
#include "test_util_vulkan.h"
#include "vk_ops.h"

/* ---- the CPU backend's arithmetic (cpu_backend.c), copied ---------------------- */

static void ref_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * (double)x[i];
    const float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = w[i] * (x[i] * inv);
}

static float ref_dot_f32(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++)
        acc[l] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void ref_rope_heads(float *v, int n_heads, int head_dim, int rope_dim, const float *cosv,
                           const float *sinv)
{
    const int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *hv = v + (int64_t)h * head_dim;
        for (int j = 0; j < half; j++) {
            const float x0 = hv[j], x1 = hv[j + half];
            hv[j] = x0 * cosv[j] - x1 * sinv[j];
            hv[j + half] = x1 * cosv[j] + x0 * sinv[j];
        }
    }
}

/* The kernel's exp: exp in double rounded to float (glibc's exp is within
 * an ulp of a double, so this is the correctly rounded float but for
 * values within ~1e-16 of halfway). */
static float exp_double(float x) { return (float)exp((double)x); }

/* attention_slot for one row and one head: q (head_dim floats) against
 * positions 0 .. n_pos - 1 at the float offsets kv_at[t] of the caches. */
static void ref_attention(const float *q, const float *kc, const float *vc, const int64_t *kv_at,
                          int64_t n_pos, int hd, float (*expfn)(float), float *scores,
                          float *out)
{
    const float scale = (float)(1.0 / sqrt((double)hd));
    for (int64_t t = 0; t < n_pos; t++)
        scores[t] = ref_dot_f32(q, kc + kv_at[t], hd) * scale;
    float max = -INFINITY, sum = 0.0f;
    for (int64_t t = 0; t < n_pos; t++)
        max = scores[t] > max ? scores[t] : max;
    for (int64_t t = 0; t < n_pos; t++) {
        scores[t] = expfn(scores[t] - max);
        sum += scores[t];
    }
    const float inv_sum = 1.0f / sum;
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int64_t t = 0; t < n_pos; t++) {
        const float p = scores[t] * inv_sum;
        for (int i = 0; i < hd; i++)
            out[i] += p * vc[kv_at[t] + i];
    }
}

/* ---- helpers ------------------------------------------------------------------- */

static bool same(float a, float b) { return memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b)); }

/* A sentinel no kernel computes here. */
#define POISON 1234.5f

static bn_vk_buffer upload(bn_vk *vk, const void *data, size_t bytes)
{
    bn_vk_buffer b;
    bn_error err;
    CHECK(bn_vk_buffer_create(vk, bytes, &b, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &b, data, bytes, &err) == BN_OK);
    return b;
}

static void download(bn_vk *vk, const bn_vk_buffer *b, void *data, size_t bytes)
{
    bn_error err;
    CHECK(bn_vk_read(vk, b, data, bytes, &err) == BN_OK);
}

static float *floats(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    CHECK(p != NULL);
    if (!p)
        exit(1);
    return p;
}

static void fill(float *p, int64_t n, float value)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = value;
}

static void submit(bn_vk *vk)
{
    bn_error err;
    const bn_status st = bn_vk_submit(vk, &err);
    CHECK_MSG(st == BN_OK, "submit: %s", err.message);
}

/* ---- greedy picks ------------------------------------------------------------------ */

/* The sampler's greedy rule, written again: the largest finite logit (the
 * lowest token among equal ones), a +infinity first (the lowest), NaN and
 * -infinity never, -1 where none is left. */
static int32_t ref_greedy(const float *l, int64_t n)
{
    int64_t best = -1, inf_at = -1;
    for (int64_t t = 0; t < n; t++) {
        if (isnan(l[t]) || l[t] == -INFINITY)
            continue;
        if (l[t] == INFINITY) {
            if (inf_at < 0)
                inf_at = t;
        } else if (best < 0 || l[t] > l[best]) {
            best = t;
        }
    }
    return (int32_t)(inf_at >= 0 ? inf_at : best);
}

/* bn_vk_argmax_record over rows first .. first + rows - 1 of `total` rows
 * of vocab logits: random rows, rows with the maximum planted twice (the
 * lower token wins), at the last token, +infinity at two places, only NaN
 * and -infinity (-1), NaN before the maximum, -0 and +0 tying, a single
 * token; the picks against ref_greedy, poisoned first, a guard after. */
static void check_argmax(bn_vk *vk, bn_vk_ops *ops, int64_t vocab, int64_t total, int64_t first,
                         int64_t rows)
{
    float *l = floats(total * vocab);
    for (int64_t i = 0; i < total * vocab; i++)
        l[i] = test_rand_float(-30.0f, 30.0f);
    for (int64_t r = 0; r < total; r++) {
        float *row = l + r * vocab;
        const int64_t a = test_rand_range(0, vocab - 1), b = test_rand_range(0, vocab - 1);
        switch (r % 8) {
        case 1:
            row[a] = row[b] = 99.0f;
            break;
        case 2:
            row[vocab - 1] = 99.0f;
            break;
        case 3:
            row[a] = row[b] = INFINITY;
            break;
        case 4:
            for (int64_t t = 0; t < vocab; t++)
                row[t] = t % 2 ? NAN : -INFINITY;
            break;
        case 5:
            row[0] = NAN;
            row[a] = 99.0f;
            break;
        case 6:
            for (int64_t t = 0; t < vocab; t++)
                row[t] = -1.0f;
            row[b] = -0.0f;
            row[a] = 0.0f;
            break;
        default:
            break;
        }
    }
    int32_t *got = malloc((size_t)(rows + 1) * sizeof *got);
    CHECK(got != NULL);
    for (int64_t i = 0; i <= rows; i++)
        got[i] = -7;
    bn_vk_buffer bl = upload(vk, l, (size_t)(total * vocab) * 4);
    bn_vk_buffer bp = upload(vk, got, (size_t)(rows + 1) * 4);
    bn_error err;
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK_MSG(bn_vk_argmax_record(vk, ops, &bl, first, rows, vocab, &bp, &err) == BN_OK,
              "argmax: %s", err.message);
    submit(vk);
    download(vk, &bp, got, (size_t)(rows + 1) * 4);
    int bad = 0;
    for (int64_t i = 0; i < rows; i++) {
        const int32_t want = ref_greedy(l + (first + i) * vocab, vocab);
        if (got[i] != want && bad++ < 3)
            CHECK_MSG(false, "argmax, vocab %lld, row %lld (kind %lld): %d, want %d",
                      (long long)vocab, (long long)(first + i), (long long)((first + i) % 8),
                      got[i], want);
    }
    CHECK_MSG(bad == 0 && got[rows] == -7,
              "argmax, vocab %lld: %d rows differ or the guard "
              "was written",
              (long long)vocab, bad);
    /* Refused: rows past the logits, too few picks. */
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_argmax_record(vk, ops, &bl, first + 1, total - first, vocab, &bp, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_vk_argmax_record(vk, ops, &bl, 0, rows + 2, vocab, &bp, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    submit(vk);
    bn_vk_buffer_free(vk, &bl);
    bn_vk_buffer_free(vk, &bp);
    free(l);
    free(got);
}

/* ---- rmsnorm ----------------------------------------------------------------------- */

/* The kernels under test: the fp64 variants (exact) or the float ones a
 * device without fp64 runs (within a few roundings; attention within the
 * same 1e-5 of its range, rmsnorm within 1e-5 of each output but on rows
 * whose squares overflow a float). */
static bool exact_kernels = true;

static void check_rmsnorm(bn_vk *vk, bn_vk_ops *ops, int64_t n, int64_t rows, float eps)
{
    float *x = floats(rows * n), *w = floats(n), *got = floats((rows + 1) * n),
          *ref = floats(n);
    for (int64_t i = 0; i < n; i++)
        w[i] = test_rand_float(-2.0f, 2.0f);
    if (n > 2)
        w[test_rand_range(0, n - 1)] = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * n;
        const int kind = (int)(r % 8);
        for (int64_t i = 0; i < n; i++) {
            const float u = test_rand_float(-3.0f, 3.0f);
            xr[i] = kind == 1 ? u * 1e19f : kind == 2 ? u * 1e-25f : kind == 3 ? 0.0f : u;
            /* Kind 7: ss / n = 1 + 2^-11 + 2^-24 exactly, halfway between two
             * floats: the kernel's tree sum cannot decide the rounding and
             * adds the squares in the CPU's order instead. */
            if (kind == 7)
                xr[i] = (test_rand_u64() & 1 ? 1.0f : -1.0f) * (1.0f + 0x1p-12f);
        }
        if (kind == 4)
            xr[test_rand_range(0, n - 1)] = NAN;
        if (kind == 5)
            xr[test_rand_range(0, n - 1)] = -INFINITY;
    }
    fill(got, (rows + 1) * n, NAN);
    for (int64_t i = 0; i < n; i++)
        got[rows * n + i] = POISON;
    bn_vk_buffer bx = upload(vk, x, (size_t)(rows * n) * 4), bw = upload(vk, w, (size_t)n * 4);
    bn_vk_buffer bo = upload(vk, got, (size_t)((rows + 1) * n) * 4);
    bn_error err;
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_rmsnorm_record(vk, ops, &bx, &bw, &bo, rows, n, eps, &err) == BN_OK);
    submit(vk);
    download(vk, &bo, got, (size_t)((rows + 1) * n) * 4);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        ref_rmsnorm(ref, x + r * n, w, n, eps);
        if (!exact_kernels && r % 8 == 1)
            continue; /* values of 1e19: their squares overflow a float */
        for (int64_t i = 0; i < n; i++)
            if (exact_kernels ? !same(got[r * n + i], ref[i])
                              : !(fabsf(got[r * n + i] - ref[i]) <= 1e-5f * fabsf(ref[i]) ||
                                  same(got[r * n + i], ref[i]))) {
                if (bad++ < 3)
                    CHECK_MSG(false,
                              "rmsnorm n=%lld eps=%g row %lld (kind %d) [%lld]: %.9g, want %.9g",
                              (long long)n, eps, (long long)r, (int)(r % 7), (long long)i,
                              got[r * n + i], ref[i]);
                break;
            }
    }
    int64_t guard_ok = 1;
    for (int64_t i = 0; i < n; i++)
        guard_ok &= got[rows * n + i] == POISON;
    CHECK_MSG(bad == 0 && guard_ok, "rmsnorm n=%lld: %d of %lld rows differ, guard row %s",
              (long long)n, bad, (long long)rows, guard_ok ? "kept" : "written");
    bn_vk_buffer_free(vk, &bx);
    bn_vk_buffer_free(vk, &bw);
    bn_vk_buffer_free(vk, &bo);
    free(x);
    free(w);
    free(got);
    free(ref);
}

/* ---- the LM head --------------------------------------------------------------------- */

/* A random half: mostly of magnitude 2^-8 .. 2^2, some subnormal. */
static uint16_t rand_half(void)
{
    const uint16_t sign = (uint16_t)((test_rand_u64() & 1) << 15);
    const uint16_t mant = (uint16_t)(test_rand_u64() & 1023);
    const uint16_t e = test_rand_range(0, 9) == 0 ? 0 : (uint16_t)test_rand_range(7, 17);
    return (uint16_t)(sign | (e << 10) | mant);
}

static void check_head(bn_vk *vk, bn_vk_ops *ops, bn_vk_head_type type, int64_t dim,
                       int64_t n_rows, int64_t first, int64_t rows)
{
    const bool f16 = type == BN_VK_HEAD_F16;
    const int64_t words = f16 ? dim / 2 : dim, ld = first + n_rows + 3;
    uint32_t *head = malloc((size_t)(n_rows * words) * 4);
    float *w = floats(n_rows * dim), *x = floats(rows * dim), *got = floats(rows * ld + 1);
    CHECK(head != NULL);
    for (int64_t j = 0; j < n_rows; j++)
        for (int64_t i = 0; i < dim; i++) {
            float v;
            if (f16) {
                const uint16_t h = rand_half();
                v = bn_fp16_to_fp32(h);
                uint32_t *word = &head[j * words + i / 2];
                *word = i % 2 ? (*word & 0xffffu) | ((uint32_t)h << 16) : h;
            } else {
                v = test_rand_float(-0.1f, 0.1f);
                memcpy(&head[j * words + i], &v, 4);
            }
            w[j * dim + i] = v;
        }
    for (int64_t i = 0; i < rows * dim; i++)
        x[i] = test_rand_float(-2.0f, 2.0f);
    fill(got, rows * ld + 1, POISON);
    bn_vk_buffer bh = upload(vk, head, (size_t)(n_rows * words) * 4);
    bn_vk_buffer bx = upload(vk, x, (size_t)(rows * dim) * 4);
    bn_vk_buffer bl = upload(vk, got, (size_t)(rows * ld + 1) * 4);
    bn_error err;
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_head_record(vk, ops, &bh, type, first, n_rows, dim, &bx, rows, &bl, ld, &err) ==
          BN_OK);
    submit(vk);
    download(vk, &bl, got, (size_t)(rows * ld + 1) * 4);
    int64_t bad = 0, outside = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld; c++) {
            const float g = got[r * ld + c];
            if (c < first || c >= first + n_rows) {
                outside += g != POISON;
                continue;
            }
            const float want = ref_dot_f32(w + (c - first) * dim, x + r * dim, dim);
            if (!same(g, want) && bad++ < 3)
                CHECK_MSG(false, "head %s dim %lld row %lld of x row %lld: %.9g, want %.9g",
                          f16 ? "F16" : "F32", (long long)dim, (long long)c, (long long)r, g,
                          want);
        }
    CHECK_MSG(bad == 0 && outside == 0 && got[rows * ld] == POISON,
              "head %s, %lld rows from %lld of %lld against %lld x rows: %lld differ, %lld "
              "written outside the part, guard %g",
              f16 ? "F16" : "F32", (long long)n_rows, (long long)first, (long long)dim,
              (long long)rows, (long long)bad, (long long)outside, got[rows * ld]);
    bn_vk_buffer_free(vk, &bh);
    bn_vk_buffer_free(vk, &bx);
    bn_vk_buffer_free(vk, &bl);
    free(head);
    free(w);
    free(x);
    free(got);
}

/* ---- attention --------------------------------------------------------------------------- */

/* Sequences in a paged cache: block b of sequence s at cache block
 * table[s * max_blocks + b], blocks handed out in a random order (and one
 * left over); pass rows at (seq, pos). */
typedef struct layout {
    int n_seq, block_size, max_blocks;
    int64_t cache_rows;
    int32_t *table;     /* [n_seq][max_blocks] */
    int64_t rows;
    int32_t *info;      /* [rows][2] */
} layout;

static layout make_layout(int n_seq, int block_size, int max_blocks)
{
    layout l = {n_seq, block_size, max_blocks, 0, NULL, 0, NULL};
    const int blocks = n_seq * max_blocks + 1;
    l.cache_rows = (int64_t)blocks * block_size;
    l.table = malloc((size_t)(n_seq * max_blocks) * sizeof *l.table);
    int32_t *order = malloc((size_t)blocks * sizeof *order);
    CHECK(l.table && order);
    for (int i = 0; i < blocks; i++)
        order[i] = i;
    for (int i = blocks - 1; i > 0; i--) {
        const int j = (int)test_rand_range(0, i);
        const int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int i = 0; i < n_seq * max_blocks; i++)
        l.table[i] = order[i];
    free(order);
    l.info = malloc(2 * sizeof *l.info);
    return l;
}

static void add_row(layout *l, int seq, int pos)
{
    l->info = realloc(l->info, (size_t)(l->rows + 1) * 2 * sizeof *l->info);
    CHECK(l->info != NULL);
    l->info[2 * l->rows] = seq;
    l->info[2 * l->rows + 1] = pos;
    l->rows++;
}

static int64_t cache_row(const layout *l, int seq, int64_t t)
{
    return (int64_t)l->table[seq * l->max_blocks + t / l->block_size] * l->block_size +
           t % l->block_size;
}

static void free_layout(layout *l)
{
    free(l->table);
    free(l->info);
}

/* Device copies of a layout's tables, and the bn_vk_rows naming them. */
typedef struct dev_rows {
    bn_vk_buffer info, tables;
    bn_vk_rows rows;
} dev_rows;

static void upload_rows(bn_vk *vk, const layout *l, dev_rows *d)
{
    d->info = upload(vk, l->info, (size_t)l->rows * 8);
    d->tables = upload(vk, l->table, (size_t)(l->n_seq * l->max_blocks) * 4);
    d->rows = (bn_vk_rows){&d->info, &d->tables, l->rows, l->block_size, l->max_blocks};
}

static void free_rows(bn_vk *vk, dev_rows *d)
{
    bn_vk_buffer_free(vk, &d->info);
    bn_vk_buffer_free(vk, &d->tables);
}

/* Row r's cos and sin as the CPU backend makes them (pos * inv_freq). */
static float *rope_tables(const layout *l, int rope_dim)
{
    const int half = rope_dim / 2;
    float *cs = floats(l->rows * rope_dim);
    for (int64_t r = 0; r < l->rows; r++)
        for (int j = 0; j < half; j++) {
            const double angle = l->info[2 * r + 1] * pow(500000.0, -2.0 * j / rope_dim);
            cs[r * rope_dim + j] = cosf((float)angle);
            cs[r * rope_dim + half + j] = sinf((float)angle);
        }
    return cs;
}

static int64_t attn_compared, attn_same_expf, attn_same_double;
static float split_worst_all; /* the split form's largest difference over the range */

/* A layer's attention as attention_block runs it: the rows' q and k turned
 * and their k and v stored (on the host, as the q, k, v product does it),
 * then attention over the cache, layer 1 of two. Sequences of lengths len[s]; each
 * gets rows at its last n_rows[s] positions (a prefill, or a decode row
 * when 1); the earlier positions are already in the cache. */
static void check_attention(bn_vk *vk, bn_vk_ops *ops, int n_head, int n_kv, int hd,
                            const int *len, const int *n_rows, int n_seq)
{
    const int block_size = 16;
    int max_len = 0;
    for (int s = 0; s < n_seq; s++)
        max_len = len[s] > max_len ? len[s] : max_len;
    layout l = make_layout(n_seq, block_size, (max_len + block_size - 1) / block_size);
    for (int s = 0; s < n_seq; s++)
        for (int p = len[s] - n_rows[s]; p < len[s]; p++)
            add_row(&l, s, p);
    const int64_t rows = l.rows, q_dim = (int64_t)n_head * hd, kv_dim = (int64_t)n_kv * hd;
    const int64_t layer_floats = l.cache_rows * kv_dim, layer_off = layer_floats;
    const int64_t stride = (int64_t)l.max_blocks * block_size; /* the cache's length */
    const int rope_dim = hd;
    float *q = floats(rows * q_dim), *k = floats(rows * kv_dim), *v = floats(rows * kv_dim);
    float *kc = floats(2 * layer_floats), *vc = floats(2 * layer_floats);
    for (int64_t i = 0; i < rows * q_dim; i++)
        q[i] = test_rand_float(-3.0f, 3.0f);
    for (int64_t i = 0; i < rows * kv_dim; i++) {
        k[i] = test_rand_float(-1.0f, 1.0f);
        v[i] = test_rand_float(-1.0f, 1.0f);
    }
    float range = 0.0f;
    for (int64_t i = 0; i < 2 * layer_floats; i++) {
        kc[i] = test_rand_float(-1.0f, 1.0f);
        vc[i] = test_rand_float(-1.0f, 1.0f);
        range = fabsf(vc[i]) > range ? fabsf(vc[i]) : range;
    }
    float *cs = rope_tables(&l, rope_dim);
    float *att = floats(rows * q_dim + 1);
    float *scratch = floats(rows * n_head * stride);
    fill(att, rows * q_dim + 1, NAN);
    att[rows * q_dim] = POISON;
    fill(scratch, rows * n_head * stride, NAN);
    /* The rows' q and k turned and their k and v stored, as the q, k, v
     * product leaves them (test_vulkan_w2a8 checks that). */
    const int half = rope_dim / 2, group = n_head / n_kv;
    for (int64_t r = 0; r < rows; r++) {
        const float *cosv = cs + r * rope_dim, *sinv = cosv + half;
        ref_rope_heads(q + r * q_dim, n_head, hd, rope_dim, cosv, sinv);
        ref_rope_heads(k + r * kv_dim, n_kv, hd, rope_dim, cosv, sinv);
        const int64_t c = cache_row(&l, l.info[2 * r], l.info[2 * r + 1]);
        memcpy(kc + layer_off + c * kv_dim, k + r * kv_dim, (size_t)kv_dim * 4);
        memcpy(vc + layer_off + c * kv_dim, v + r * kv_dim, (size_t)kv_dim * 4);
    }

    dev_rows d;
    upload_rows(vk, &l, &d);
    bn_vk_buffer bq = upload(vk, q, (size_t)(rows * q_dim) * 4);
    bn_vk_buffer bkc = upload(vk, kc, (size_t)(2 * layer_floats) * 4);
    bn_vk_buffer bvc = upload(vk, vc, (size_t)(2 * layer_floats) * 4);
    bn_vk_buffer bs = upload(vk, scratch, (size_t)(rows * n_head * stride) * 4);
    bn_vk_buffer ba = upload(vk, att, (size_t)(rows * q_dim + 1) * 4);
    const bn_vk_attn_shape s = {n_head, n_kv, hd, l.cache_rows};
    bn_error err;
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    const bn_status st = bn_vk_attention_record(vk, ops, &s, &d.rows, &bq, &bkc, &bvc, layer_off,
                                                &bs, stride, &ba, &err);
    CHECK_MSG(st == BN_OK, "attention: %s", err.message);
    submit(vk);
    download(vk, &ba, att, (size_t)(rows * q_dim + 1) * 4);
    /* The split form over the same rows (positions up to the cache's
     * length, as a decode step asks), its partials poisoned but for the
     * merge's counters (zero, as the dispatch must leave them). */
    const uint64_t n_part = bn_vk_attention_split_floats(&s, rows, stride);
    const int64_t n_counters = rows * n_head;
    float *part = floats((int64_t)n_part), *att_split = floats(rows * q_dim + 1);
    fill(part, (int64_t)n_part, NAN);
    memset(part, 0, (size_t)n_counters * 4);
    fill(att_split, rows * q_dim + 1, NAN);
    att_split[rows * q_dim] = POISON;
    bn_vk_buffer bp = upload(vk, part, n_part * 4);
    bn_vk_buffer bas = upload(vk, att_split, (size_t)(rows * q_dim + 1) * 4);
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK_MSG(bn_vk_attention_split_record(vk, ops, &s, &d.rows, &bq, &bkc, &bvc, layer_off, &bp,
                                           stride, &bas, &err) == BN_OK,
              "split attention: %s", err.message);
    submit(vk);
    download(vk, &bas, att_split, (size_t)(rows * q_dim + 1) * 4);
    uint32_t *counters = calloc((size_t)n_counters, 4);
    CHECK(counters != NULL);
    download(vk, &bp, counters, (size_t)n_counters * 4);
    int64_t counters_left = 0;
    for (int64_t i = 0; i < n_counters; i++)
        counters_left += counters[i] != 0;
    CHECK_MSG(counters_left == 0, "split attention: %lld of %lld counters left nonzero",
              (long long)counters_left, (long long)n_counters);
    free(counters);

    /* The CPU: each row and head. */
    int64_t *kv_at = malloc((size_t)stride * sizeof *kv_at);
    float *sc = floats(stride), *want = floats(hd), *want_d = floats(hd);
    CHECK(kv_at != NULL);
    int64_t far = 0, same_expf = 0, same_double = 0, split_far = 0;
    float worst = 0.0f, split_worst = 0.0f;
    for (int64_t r = 0; r < rows; r++) {
        const int seq = l.info[2 * r], n_pos = l.info[2 * r + 1] + 1;
        for (int h = 0; h < n_head; h++) {
            for (int t = 0; t < n_pos; t++)
                kv_at[t] = layer_off + cache_row(&l, seq, t) * kv_dim + (int64_t)(h / group) * hd;
            const float *qh = q + r * q_dim + (int64_t)h * hd;
            ref_attention(qh, kc, vc, kv_at, n_pos, hd, expf, sc, want);
            ref_attention(qh, kc, vc, kv_at, n_pos, hd, exp_double, sc, want_d);
            for (int i = 0; i < hd; i++) {
                const float g = att[r * q_dim + (int64_t)h * hd + i];
                const float e = fabsf(g - want[i]);
                if (!(e <= 1e-5f * range) && far++ < 3)
                    CHECK_MSG(false, "attention %d/%d heads of %d, row %lld (seq %d pos %d) head "
                              "%d [%d]: %.9g, want %.9g",
                              n_head, n_kv, hd, (long long)r, seq, n_pos - 1, h, i, g, want[i]);
                worst = e > worst ? e : worst;
                const float es = fabsf(att_split[r * q_dim + (int64_t)h * hd + i] - want[i]);
                split_far += !(es <= 1e-5f * range);
                split_worst = es > split_worst ? es : split_worst;
                same_expf += same(g, want[i]);
                same_double += same(g, want_d[i]);
            }
        }
    }
    const int64_t n_out = rows * q_dim;
    CHECK_MSG(far == 0 && att[n_out] == POISON,
              "attention %d/%d heads of %d: %lld of %lld outputs off by more than 1e-5 of %g, "
              "guard %g",
              n_head, n_kv, hd, (long long)far, (long long)n_out, range, att[n_out]);
    CHECK_MSG(split_far == 0 && att_split[n_out] == POISON,
              "split attention %d/%d heads of %d: %lld of %lld outputs off by more than 1e-5 of "
              "%g (largest %g), guard %g",
              n_head, n_kv, hd, (long long)split_far, (long long)n_out, range, split_worst,
              att_split[n_out]);
    split_worst_all = split_worst / range > split_worst_all ? split_worst / range : split_worst_all;
    /* With exp computed as the kernel does it, the rest of the arithmetic
     * is the CPU's: all equal but for a rare exp rounded differently. */
    CHECK_MSG(!exact_kernels || same_double >= n_out - n_out / 100,
              "attention %d/%d heads of %d: %lld of %lld outputs equal to the CPU's arithmetic "
              "with the kernel's exp",
              n_head, n_kv, hd, (long long)same_double, (long long)n_out);
    printf("attention %2d/%d heads of %3d, %3lld rows, contexts up to %4d: largest difference "
           "%.3g (%.2g of the range); bit-identical %lld of %lld (libm expf), %lld (exp in "
           "double)\n",
           n_head, n_kv, hd, (long long)rows, max_len, worst, worst / range,
           (long long)same_expf, (long long)n_out, (long long)same_double);
    attn_compared += n_out;
    attn_same_expf += same_expf;
    attn_same_double += same_double;

    bn_vk_buffer *const all[] = {&bq, &bkc, &bvc, &bs, &ba, &bp, &bas};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    free(part);
    free(att_split);
    free_rows(vk, &d);
    free_layout(&l);
    free(q);
    free(k);
    free(v);
    free(kc);
    free(vc);
    free(cs);
    free(att);
    free(scratch);
    free(kv_at);
    free(sc);
    free(want);
    free(want_d);
}

/* Rows the tables do not hold (a sequence past them, a position past the
 * scratch or the tables, a block past the cache) beside a good row:
 * attention writes NaN for them (the q, k, v product stores nothing for
 * them: test_vulkan_w2a8). */
static void check_bad_rows(bn_vk *vk, bn_vk_ops *ops, bool many)
{
    const int n_head = 2, n_kv = 1, hd = 16;
    layout l = make_layout(2, 4, 3);
    l.table[1 * 3 + 2] = 1000; /* sequence 1's third block: past the cache */
    add_row(&l, 0, 2);         /* good */
    add_row(&l, 2, 0);         /* no sequence 2 */
    add_row(&l, 0, 12);        /* past the tables (3 blocks of 4) */
    add_row(&l, 1, 9);         /* its block is past the cache */
    add_row(&l, 1, -1);        /* a negative position */
    for (int i = 0; many && i < 4; i++) /* a pass of 8 or more rows */
        add_row(&l, i % 2 ? 5 : 0, i % 2 ? 1 : 12 + i);
    const int64_t rows = l.rows, q_dim = n_head * hd, kv_dim = n_kv * hd;
    const int64_t cache_floats = l.cache_rows * kv_dim, stride = 12;
    float *q = floats(rows * q_dim), *cache = floats(cache_floats), *att = floats(rows * q_dim);
    for (int64_t i = 0; i < rows * q_dim; i++)
        q[i] = test_rand_float(-1.0f, 1.0f);
    for (int64_t i = 0; i < cache_floats; i++)
        cache[i] = test_rand_float(-1.0f, 1.0f);
    dev_rows d;
    upload_rows(vk, &l, &d);
    bn_vk_buffer bq = upload(vk, q, (size_t)(rows * q_dim) * 4);
    bn_vk_buffer bkc = upload(vk, cache, (size_t)cache_floats * 4);
    bn_vk_buffer bvc = upload(vk, cache, (size_t)cache_floats * 4);
    bn_vk_buffer bs, ba;
    bn_error err;
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(rows * n_head * stride) * 4, &bs, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(rows * q_dim) * 4, &ba, &err) == BN_OK);
    const bn_vk_attn_shape s = {n_head, n_kv, hd, l.cache_rows};
    bn_vk_buffer bp;
    CHECK(bn_vk_buffer_create(vk, bn_vk_attention_split_floats(&s, rows, stride) * 4, &bp, &err) ==
          BN_OK);
    uint32_t *zero = calloc((size_t)(rows * n_head), 4); /* the merge's counters */
    CHECK(zero && bn_vk_write(vk, &bp, zero, (size_t)(rows * n_head) * 4, &err) == BN_OK);
    free(zero);
    for (int form = 0; form < 2; form++) { /* the exact one, then the split one */
        CHECK(bn_vk_begin(vk, &err) == BN_OK);
        if (form == 0)
            CHECK(bn_vk_attention_record(vk, ops, &s, &d.rows, &bq, &bkc, &bvc, 0, &bs, stride, &ba,
                                         &err) == BN_OK);
        else
            CHECK(bn_vk_attention_split_record(vk, ops, &s, &d.rows, &bq, &bkc, &bvc, 0, &bp,
                                               stride, &ba, &err) == BN_OK);
        submit(vk);
        download(vk, &ba, att, (size_t)(rows * q_dim) * 4);
        bool good = true;
        for (int64_t i = 0; i < q_dim; i++)
            good &= !isnan(att[i]);
        int64_t nan_rows = 0;
        for (int64_t r = 1; r < rows; r++) {
            bool all_nan = true;
            for (int64_t i = 0; i < q_dim; i++)
                all_nan &= isnan(att[r * q_dim + i]) != 0;
            nan_rows += all_nan;
        }
        CHECK_MSG(good && nan_rows == rows - 1,
                  "%s attention, rows outside the tables: the good row %s, %lld of %lld bad rows "
                  "NaN",
                  form == 0 ? "exact" : "split", good ? "finite" : "not finite",
                  (long long)nan_rows, (long long)(rows - 1));
    }
    /* Partials too small for the positions: refused. */
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_attention_split_record(vk, ops, &s, &d.rows, &bq, &bkc, &bvc, 0, &bp, 1000, &ba,
                                       &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "partials");
    submit(vk);
    bn_vk_buffer *const all[] = {&bq, &bkc, &bvc, &bs, &ba, &bp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    free_rows(vk, &d);
    free_layout(&l);
    free(q);
    free(cache);
    free(att);
}

/* ---- sizes that do not fit --------------------------------------------------------------- */

static void check_refusals(bn_vk *vk, bn_vk_ops *ops)
{
    bn_error err;
    bn_vk_buffer small, big;
    CHECK(bn_vk_buffer_create(vk, 64, &small, &err) == BN_OK);       /* 16 floats */
    CHECK(bn_vk_buffer_create(vk, 1 << 16, &big, &err) == BN_OK);    /* 16384 floats */
    const int32_t info[2] = {0, 0}, table[1] = {0};
    CHECK(bn_vk_write(vk, &small, info, sizeof info, &err) == BN_OK);
    bn_vk_buffer tables = upload(vk, table, sizeof table);
    const bn_vk_rows rows = {&small, &tables, 1, 64, 1};
    const bn_vk_attn_shape s = {4, 2, 16, 64};
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
#define REFUSED(call, what)                                                                 \
    do {                                                                                    \
        const bn_status st_ = (call);                                                       \
        CHECK_MSG(st_ == BN_ERR_INVALID_ARGUMENT, "%s: status %d", what, (int)st_);         \
        if (st_ == BN_ERR_INVALID_ARGUMENT)                                                 \
            CHECK_STR_CONTAINS(err.message, "Vulkan");                                      \
    } while (0)
    REFUSED(bn_vk_rmsnorm_record(vk, ops, &big, &small, &big, 2, 100, 1e-5f, &err),
            "rmsnorm with a short weight");
    REFUSED(bn_vk_rmsnorm_record(vk, ops, &big, &big, &small, 2, 100, 1e-5f, &err),
            "rmsnorm past out");
    REFUSED(bn_vk_head_record(vk, ops, &big, BN_VK_HEAD_F16, 0, 10, 15, &big, 1, &big, 10, &err),
            "head F16 of odd dim");
    REFUSED(bn_vk_head_record(vk, ops, &big, BN_VK_HEAD_F32, 5, 10, 16, &big, 2, &big, 12, &err),
            "head with ld < first + n_rows");
    REFUSED(bn_vk_head_record(vk, ops, &big, BN_VK_HEAD_F32, 0, 2000, 16, &big, 1, &big, 2000,
                              &err),
            "head past its part");
    REFUSED(bn_vk_head_record(vk, ops, &big, BN_VK_HEAD_F32, 0, 20, 16, &big, 1, &small, 20,
                              &err),
            "head past the logits");
    const bn_vk_attn_shape odd = {4, 3, 16, 64};
    REFUSED(bn_vk_attention_record(vk, ops, &odd, &rows, &big, &big, &big, 0, &big, 64, &big,
                                   &err),
            "attention with n_head not a multiple of n_kv");
    REFUSED(bn_vk_attention_record(vk, ops, &s, &rows, &big, &big, &big, 0, &small, 64, &big,
                                   &err),
            "attention past the scratch");
    REFUSED(bn_vk_attention_record(vk, ops, &s, &rows, &big, &big, &big, 0, &big, 0, &big, &err),
            "attention with scratch_stride 0");
    const bn_vk_attn_shape wide = {1, 1, 1024, 4};
    REFUSED(bn_vk_attention_record(vk, ops, &wide, &rows, &big, &big, &big, 0, &big, 4, &big,
                                   &err),
            "attention with head_dim 1024");
    const bn_vk_rows no_info = {&small, &tables, 9, 64, 1};
    REFUSED(bn_vk_attention_record(vk, ops, &s, &no_info, &big, &big, &big, 0, &big, 4, &big,
                                   &err),
            "attention past the rows' info");
    const bn_vk_rows no_table = {&small, &tables, 1, 64, 2};
    REFUSED(bn_vk_attention_record(vk, ops, &s, &no_table, &big, &big, &big, 0, &big, 4, &big,
                                   &err),
            "attention with tables shorter than max_blocks");
#undef REFUSED
    /* Nothing to do records nothing. */
    CHECK(bn_vk_rmsnorm_record(vk, ops, &small, &small, &small, 0, 4, 1e-5f, &err) == BN_OK);
    submit(vk);
    bn_vk_buffer_free(vk, &small);
    bn_vk_buffer_free(vk, &big);
    bn_vk_buffer_free(vk, &tables);
}

int main(void)
{
    test_seed_init();
    int n_dev;
    bn_vk *vk = test_require_vulkan(&n_dev);
    bn_error err;
    bn_vk_ops *ops = NULL;
    exact_kernels = bn_vk_device(vk)->fp64;
    const bn_status st = bn_vk_ops_create(vk, &ops, &err);
    CHECK_MSG(st == BN_OK, "bn_vk_ops_create: %s", err.message);
    if (st != BN_OK) {
        bn_vk_close(vk);
        TEST_EXIT();
    }

    static const int64_t widths[] = {2560, 1, 3, 17, 1000};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        check_rmsnorm(vk, ops, widths[i], 14, 1e-5f);
    check_rmsnorm(vk, ops, 2560, 7, 0.0f);
    for (int i = 0; i < 3; i++)
        check_rmsnorm(vk, ops, test_rand_range(1, 3000), test_rand_range(1, 20), 1e-6f);

    check_head(vk, ops, BN_VK_HEAD_F32, 2560, 300, 0, 1);
    check_head(vk, ops, BN_VK_HEAD_F16, 2560, 300, 0, 2);
    check_head(vk, ops, BN_VK_HEAD_F32, 17, 1003, 37, 5);
    check_head(vk, ops, BN_VK_HEAD_F16, 18, 999, 5, 6);
    check_head(vk, ops, BN_VK_HEAD_F32, 333, 200, 1000, 4);
    check_head(vk, ops, BN_VK_HEAD_F16, 250, 123, 77, 3);
    check_head(vk, ops, BN_VK_HEAD_F32, 1, 9, 0, 1);
    /* dims of 8 k: a row an invocation */
    check_head(vk, ops, BN_VK_HEAD_F16, 64, 130, 7, 6);
    check_head(vk, ops, BN_VK_HEAD_F32, 8, 65, 3, 5);
    /* 16 x rows or more: four invocations a head row, each four of 16. */
    check_head(vk, ops, BN_VK_HEAD_F16, 2560, 300, 0, 64);
    check_head(vk, ops, BN_VK_HEAD_F32, 64, 131, 7, 21);
    check_head(vk, ops, BN_VK_HEAD_F16, 256, 1001, 13, 16);
    check_head(vk, ops, BN_VK_HEAD_F32, 40, 77, 0, 37);
    check_head(vk, ops, BN_VK_HEAD_F16, 16, 1, 0, 1);
    check_head(vk, ops, BN_VK_HEAD_F16, 2560, 300, 50, 1); /* one x row: its own kernel */
    check_head(vk, ops, BN_VK_HEAD_F32, 64, 77, 7, 1);
    check_head(vk, ops, BN_VK_HEAD_F16, 2 * test_rand_range(1, 700), test_rand_range(1, 500),
               test_rand_range(0, 1000), test_rand_range(1, 9));
    check_head(vk, ops, BN_VK_HEAD_F32, test_rand_range(1, 1400), test_rand_range(1, 500),
               test_rand_range(0, 1000), test_rand_range(1, 9));

    check_argmax(vk, ops, 128256, 9, 1, 8); /* the 2B-4T vocabulary, every kind */
    check_argmax(vk, ops, 1000, 20, 3, 16);
    check_argmax(vk, ops, 1, 4, 0, 4);
    check_argmax(vk, ops, test_rand_range(2, 5000), 10, 2, 8);

    {
        static const int len[] = {37, 70, 4}, n_rows[] = {5, 1, 4};
        check_attention(vk, ops, 8, 8, 64, len, n_rows, 3);    /* group 1 */
        check_attention(vk, ops, 8, 2, 128, len, n_rows, 3);   /* group 4 */
        check_attention(vk, ops, 6, 3, 100, len, n_rows, 3);   /* group 2, ragged head_dim */
        check_attention(vk, ops, 4, 2, 58, len, n_rows, 3);    /* keys not on 16 bytes */
    }
    {
        /* The 2B model's heads, a context past a workgroup's positions. */
        static const int len[] = {700, 130, 17}, n_rows[] = {3, 2, 1};
        check_attention(vk, ops, 20, 5, 128, len, n_rows, 3);
        /* nine rows: a workgroup a row and KV head; a group of 5 (past
         * its 4) in workgroups of 128 */
        static const int len9[] = {300, 40}, n_rows9[] = {6, 3};
        check_attention(vk, ops, 20, 5, 128, len9, n_rows9, 2);
        check_attention(vk, ops, 10, 2, 24, len9, n_rows9, 2);
    }
    {
        const int len[] = {(int)test_rand_range(1, 300), (int)test_rand_range(1, 300)};
        const int n_rows[] = {(int)test_rand_range(1, len[0] < 6 ? len[0] : 6), 1};
        check_attention(vk, ops, 5, 1, 8 * (int)test_rand_range(1, 20) + 4, len, n_rows, 2);
    }
    printf("attention: %lld outputs, %lld bit-identical to the CPU (libm expf), %lld to its "
           "arithmetic with exp in double\n",
           (long long)attn_compared, (long long)attn_same_expf, (long long)attn_same_double);
    printf("split attention: largest difference %.3g of the range\n", split_worst_all);
    check_bad_rows(vk, ops, false);
    check_bad_rows(vk, ops, true);
    check_refusals(vk, ops);
    bn_vk_ops_free(vk, ops);
    if (bn_vk_device(vk)->fp64 && bn_vk_device(vk)->subgroup_arithmetic) {
        /* The split attention's shared-memory trees, as a device without
         * subgroup arithmetic runs them. */
        bn_vk_ops *trees = NULL;
        CHECK(bn_vk_ops_create_trees(vk, &trees, &err) == BN_OK);
        static const int len[] = {700, 130, 17}, n_rows[] = {3, 2, 1};
        if (trees) {
            check_attention(vk, trees, 20, 5, 128, len, n_rows, 3);
            check_attention(vk, trees, 6, 3, 100, len, n_rows, 3);
            check_bad_rows(vk, trees, false);
        }
        bn_vk_ops_free(vk, trees);
    }
    bn_vk_close(vk);

    if (exact_kernels) {
        /* The float RMSNorm and attention, as a device without fp64 runs them. */
        setenv("BITNET_VULKAN_FP64", "0", 1);
        exact_kernels = false;
        bn_vk *vf = NULL;
        bn_vk_ops *of = NULL;
        CHECK(bn_vk_open(0, &vf, &err) == BN_OK && !bn_vk_device(vf)->fp64);
        CHECK(vf && bn_vk_ops_create(vf, &of, &err) == BN_OK);
        for (size_t i = 0; of && i < sizeof widths / sizeof widths[0]; i++)
            check_rmsnorm(vf, of, widths[i], 14, 1e-5f);
        static const int len[] = {700, 130, 17}, n_rows[] = {3, 2, 1};
        if (of) {
            check_attention(vf, of, 20, 5, 128, len, n_rows, 3);
            check_attention(vf, of, 6, 3, 100, len, n_rows, 3);
        }
        bn_vk_ops_free(vf, of);
        bn_vk_close(vf);
        unsetenv("BITNET_VULKAN_FP64");
    }
    TEST_EXIT();
}
