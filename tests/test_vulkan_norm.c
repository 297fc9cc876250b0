/* The Vulkan RMSNorm + int8 kernel (shaders/norm_quantize.comp, vk_norm.h)
 * against the CPU's rule (bn_norm_quantize_row) on the first Vulkan
 * device: codes, scales and sums bit for bit, on rows that reach every
 * path - smooth random rows, integer rows full of exact ties
 * (127 u / max|u| = j + 1/2), few-bit rows, tiny rows (the plain rule),
 * a zero row, rows with a NaN or an infinity, zero weights, rows whose
 * mean square lies halfway between two floats (the kernel's sum of
 * squares then in the CPU's order) - at the
 * decode step's widths (2560, 6912), ragged ones and one value; codes and
 * scales poisoned first, a guard row after the last; then a layer's
 * input projection (norm, then the W2A8 product reading the codes and
 * scales it wrote) in one sequence against the CPU; the product that
 * norms its input itself (check_normed). Exits 77 (skipped)
 * when no Vulkan device can be opened or it has no fp64, saying why. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_rules.h"
#include "test_util.h"
#include "test_util_vulkan.h"
#include "vk_norm.h"
#include "vk_w2a8.h"
#include "w2a8.h"

/* Row r of kind r % KINDS. Kind 8: every value +-(1 + 2^-12), so that
 * ss / n = 1 + 2^-11 + 2^-24 exactly, halfway between two floats: the
 * kernel's tree sum cannot decide the rounding and adds the squares in the
 * CPU's eight lanes instead. */
#define KINDS 9
static void fill_row(float *x, int64_t n, int kind)
{
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case 8: x[i] = (test_rand_u64() & 1 ? 1.0f : -1.0f) * (1.0f + 0x1p-12f); break;
        case 0: x[i] = test_rand_float(-3.0f, 3.0f); break;
        case 1: x[i] = (float)test_rand_range(-254, 254); break;           /* ties */
        case 2: x[i] = (float)test_rand_range(-8, 8) * 0.25f; break;       /* few bits */
        case 3: x[i] = test_rand_float(-1.0f, 1.0f) * 1e-30f; break;       /* tiny */
        case 4: x[i] = 0.0f; break;
        case 5: x[i] = test_rand_float(-50.0f, 50.0f); break;
        case 6: x[i] = test_rand_float(-2.0f, 2.0f); break;
        default: x[i] = (float)test_rand_range(-127, 127) * 2.0f; break;  /* ties */
        }
    }
    if (kind == 1 || kind == 7)
        x[test_rand_range(0, n - 1)] = kind == 1 ? 254.0f : -254.0f;
    if (kind == 5 && n > 1)
        x[test_rand_range(0, n - 1)] = (test_rand_u64() & 1) ? NAN : INFINITY;
}

/* exact: the fp64 kernel, the CPU's codes, scales and sums bit for bit;
 * else the float one (a device without fp64): every code within one of the
 * CPU's (exact ties may round either way), the scale within 1e-5 of it,
 * the sum that of the kernel's own codes. */
static void check_width(bn_vk *vk, bn_vk_kernel *kernel, int64_t n, int64_t rows, bool exact)
{
    const size_t words = 4 * bn_vk_w2a8_words(n);
    float *x = malloc((size_t)(rows * n) * sizeof *x), *w = malloc((size_t)n * sizeof *w);
    uint32_t *codes = malloc((rows + 1) * words * 4);
    float *scales = malloc((size_t)(rows + 1) * sizeof *scales);
    int32_t *sums = malloc((size_t)(rows + 1) * sizeof *sums);
    int8_t *ref = malloc(words * 4);
    CHECK(x && w && codes && scales && sums && ref);
    const bool unit = test_rand_u64() & 1; /* weights of 1: ties stay ties */
    for (int64_t i = 0; i < n; i++)
        w[i] = unit ? 1.0f : test_rand_float(0.25f, 2.0f);
    if (!unit && n > 2)
        w[test_rand_range(0, n - 1)] = 0.0f;
    for (int64_t r = 0; r < rows; r++)
        fill_row(x + r * n, n, (int)(r % KINDS));

    bn_error err;
    bn_vk_buffer bx, bw, bc, bs, bsum;
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(rows * n) * 4, &bx, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)n * 4, &bw, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (rows + 1) * words * 4, &bc, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(rows + 1) * 4, &bs, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(rows + 1) * 4, &bsum, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &bx, x, (size_t)(rows * n) * 4, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &bw, w, (size_t)n * 4, &err) == BN_OK);
    memset(codes, 0x5a, (rows + 1) * words * 4);
    for (int64_t r = 0; r <= rows; r++) {
        scales[r] = NAN;
        sums[r] = -999;
    }
    CHECK(bn_vk_write(vk, &bc, codes, (rows + 1) * words * 4, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &bs, scales, (size_t)(rows + 1) * 4, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &bsum, sums, (size_t)(rows + 1) * 4, &err) == BN_OK);
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_norm_record(vk, kernel, &bx, &bw, &bc, &bs, &bsum, rows, n, 1e-5f, &err) ==
          BN_OK);
    CHECK(bn_vk_submit(vk, &err) == BN_OK);
    CHECK(bn_vk_read(vk, &bc, codes, (rows + 1) * words * 4, &err) == BN_OK);
    CHECK(bn_vk_read(vk, &bs, scales, (size_t)(rows + 1) * 4, &err) == BN_OK);
    CHECK(bn_vk_read(vk, &bsum, sums, (size_t)(rows + 1) * 4, &err) == BN_OK);

    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        float s;
        int32_t sum;
        memset(ref, 0, words * 4);
        bn_norm_quantize_row(x + r * n, w, n, 1e-5f, ref, &s, &sum);
        const int8_t *got = (const int8_t *)(codes + r * words);
        int64_t first = -1, own_sum = 0;
        for (size_t i = 0; i < words * 4; i++) {
            own_sum += got[i];
            if (first < 0 && (exact ? got[i] != ref[i] : abs(got[i] - ref[i]) > 1))
                first = (int64_t)i;
        }
        const bool ok = exact ? first < 0 && memcmp(&scales[r], &s, 4) == 0 && sums[r] == sum
                              : first < 0 && fabsf(scales[r] - s) <= 1e-5f * fabsf(s) &&
                                    sums[r] == own_sum;
        if (!ok && bad++ < 3)
            CHECK_MSG(false,
                      "n=%lld row %lld (kind %d, %s weights): first differing code at %lld "
                      "(%d, want %d), scale %.9g want %.9g, sum %d want %d",
                      (long long)n, (long long)r, (int)(r % KINDS), unit ? "unit" : "random",
                      (long long)first, first >= 0 ? got[first] : 0, first >= 0 ? ref[first] : 0,
                      scales[r], s, sums[r], sum);
    }
    CHECK_MSG(bad == 0, "n=%lld: %d of %lld rows differ", (long long)n, bad, (long long)rows);
    uint32_t guard;
    memcpy(&guard, codes + rows * words, 4);
    CHECK_MSG(guard == 0x5a5a5a5au && isnan(scales[rows]) && sums[rows] == -999,
              "n=%lld: the guard row was written", (long long)n);
    bn_vk_buffer_free(vk, &bx);
    bn_vk_buffer_free(vk, &bw);
    bn_vk_buffer_free(vk, &bc);
    bn_vk_buffer_free(vk, &bs);
    bn_vk_buffer_free(vk, &bsum);
    free(x);
    free(w);
    free(codes);
    free(scales);
    free(sums);
    free(ref);
}

extern const bn_kernel_provider bn_provider_scalar;

/* A layer's input projection in one sequence: rows normed and quantized,
 * then each row times a ternary matrix of m rows, reading the codes and
 * scales the norm wrote; equal bit for bit to the CPU's rule followed by
 * the scalar provider's product. */
static void check_chain(bn_vk *vk, bn_vk_kernel *norm, bn_vk_kernel *w2a8, int64_t n, int64_t m,
                        int64_t rows)
{
    const size_t words = bn_vk_w2a8_words(n);
    float *x = malloc((size_t)(rows * n) * sizeof *x), *w = malloc((size_t)n * sizeof *w);
    int8_t *codes = malloc((size_t)(m * n)), *q = calloc(words * 16, 1);
    uint32_t *packed = malloc((size_t)m * words * 4);
    float *ref = malloc((size_t)m * sizeof *ref), *got = malloc((size_t)m * sizeof *got);
    CHECK(x && w && codes && q && packed && ref && got);
    for (int64_t i = 0; i < n; i++)
        w[i] = test_rand_float(0.25f, 2.0f);
    for (int64_t r = 0; r < rows; r++)
        fill_row(x + r * n, n, (int)(r % 3)); /* smooth, ties, few bits */
    for (int64_t i = 0; i < m * n; i++)
        codes[i] = (int8_t)test_rand_range(-1, 1);
    bn_vk_w2a8_pack(codes, m, n, packed);
    const float weight_scale = test_rand_float(0.01f, 2.0f);

    bn_error err;
    bn_vk_buffer bx, bw, bq, bs, bsum, bcodes, by[8];
    CHECK(rows <= 8);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(rows * n) * 4, &bx, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)n * 4, &bw, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, rows * words * 16, &bq, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)rows * 4, &bs, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)rows * 4, &bsum, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)m * words * 4, &bcodes, &err) == BN_OK);
    for (int64_t r = 0; r < rows; r++)
        CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)m * 4, &by[r], &err) == BN_OK);
    CHECK(bn_vk_write(vk, &bx, x, (size_t)(rows * n) * 4, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &bw, w, (size_t)n * 4, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &bcodes, packed, (size_t)m * words * 4, &err) == BN_OK);
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_norm_record(vk, norm, &bx, &bw, &bq, &bs, &bsum, rows, n, 1e-5f, &err) == BN_OK);
    for (int64_t r = 0; r < rows; r++)
        CHECK(test_vk_w2a8_record(vk, w2a8, &bcodes, &bq, &bs, r, &by[r], m, n, weight_scale,
                                &err) == BN_OK);
    CHECK(bn_vk_submit(vk, &err) == BN_OK);

    bn_w2a8_weights wref;
    CHECK(bn_w2a8_pack(&bn_provider_scalar, codes, m, n, weight_scale, &wref, NULL) == BN_OK);
    for (int64_t r = 0; r < rows; r++) {
        float s;
        int32_t sum;
        bn_norm_quantize_row(x + r * n, w, n, 1e-5f, q, &s, &sum);
        bn_provider_scalar.matvec(&wref, q, s, sum, 0, m, ref);
        CHECK(bn_vk_read(vk, &by[r], got, (size_t)m * 4, &err) == BN_OK);
        CHECK_MSG(memcmp(got, ref, (size_t)m * 4) == 0,
                  "norm then W2A8, %lld x %lld, row %lld: differs from the CPU's", (long long)m,
                  (long long)n, (long long)r);
    }
    bn_w2a8_weights_free(&wref);
    bn_vk_buffer *const all[] = {&bx, &bw, &bq, &bs, &bsum, &bcodes};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    for (int64_t r = 0; r < rows; r++)
        bn_vk_buffer_free(vk, &by[r]);
    free(x);
    free(w);
    free(codes);
    free(q);
    free(packed);
    free(ref);
    free(got);
}

/* A normed product's inputs: the row x of k values of kind `kind`, its
 * norm weights nw, n rows of ternary codes wc and their packing. */
static void random_normed_inputs(float *x, float *nw, int64_t k, int kind, int8_t *wc, int64_t n,
                                 uint32_t *packed)
{
    fill_row(x, k, kind);
    for (int64_t i = 0; i < k; i++)
        nw[i] = test_rand_float(0.25f, 2.0f);
    for (int64_t i = 0; i < n * k; i++)
        wc[i] = (int8_t)test_rand_range(-1, 1);
    bn_vk_w2a8_pack(wc, n, k, packed);
}

/* Their device buffers: the packed weights (w_rows rows of k), the row, its
 * norm weights, and the codes, scale and sum the norm kernel writes. */
static void upload_normed_inputs(bn_vk *vk, int64_t w_rows, int64_t k, const uint32_t *packed,
                                 const float *x, const float *nw, bn_vk_buffer *bw,
                                 bn_vk_buffer *bx, bn_vk_buffer *bn, bn_vk_buffer *bc,
                                 bn_vk_buffer *bs, bn_vk_buffer *bsum)
{
    const size_t words = bn_vk_w2a8_words(k);
    bn_error err;
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)w_rows * words * 4, bw, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)k * 4, bx, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)k * 4, bn, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, words * 16, bc, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, 4, bs, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, 4, bsum, &err) == BN_OK);
    CHECK(bn_vk_write(vk, bw, packed, (size_t)w_rows * words * 4, &err) == BN_OK);
    CHECK(bn_vk_write(vk, bx, x, (size_t)k * 4, &err) == BN_OK);
    CHECK(bn_vk_write(vk, bn, nw, (size_t)k * 4, &err) == BN_OK);
}

/* The q, k, v product that norms its input (bn_vk_w2a8_record_qkv_normed)
 * over one row of k values of kind `kind` at position pos of sequence seq
 * (past the tables: nothing stored) through shuffled block tables: q and
 * both caches, guards included, bit for bit what the norm kernel followed
 * by the plain q, k, v product gives (test_vulkan_w2a8 holds that to the
 * CPU). */
static void check_qkv_normed(bn_vk *vk, bn_vk_kernel *normed, bn_vk_kernel *norm,
                             bn_vk_kernel *plain, int n_head, int n_kv, int hd, int rope_dim,
                             int64_t k, int kind, int seq, int pos)
{
    enum { BLOCK = 4, MAX_BLOCKS = 4, N_SEQ = 2, CACHE_ROWS = BLOCK * 8 };
    const int64_t q_dim = (int64_t)n_head * hd, kv_dim = (int64_t)n_kv * hd;
    const int64_t n = q_dim + 2 * kv_dim, cache = CACHE_ROWS * kv_dim;
    const size_t words = bn_vk_w2a8_words(k);
    float *x = malloc((size_t)k * 4), *nw = malloc((size_t)k * 4);
    float *cs = malloc((size_t)(rope_dim > 0 ? rope_dim : 1) * 4);
    float *init = malloc((size_t)(q_dim + 1 + 2 * cache) * 4);
    float *want = malloc((size_t)(q_dim + 1 + 2 * cache) * 4);
    float *got = malloc((size_t)(q_dim + 1 + 2 * cache) * 4);
    int8_t *wc = malloc((size_t)(n * k));
    uint32_t *packed = malloc((size_t)n * words * 4);
    CHECK(x && nw && cs && init && want && got && wc && packed);
    random_normed_inputs(x, nw, k, kind, wc, n, packed);
    for (int i = 0; i < rope_dim; i++)
        cs[i] = test_rand_float(-1.0f, 1.0f);
    for (int64_t i = 0; i < q_dim + 1 + 2 * cache; i++)
        init[i] = i < q_dim ? NAN : -12345.5f; /* q poisoned, a guard after it, caches guarded */
    int32_t tables[N_SEQ * MAX_BLOCKS], info[2] = {seq, pos};
    test_shuffled_tables(tables, N_SEQ * MAX_BLOCKS);

    bn_error err;
    bn_vk_buffer bw, bx, bn, bq, bk, bv, bt, bi, bcs, bc, bs, bsum;
    upload_normed_inputs(vk, n, k, packed, x, nw, &bw, &bx, &bn, &bc, &bs, &bsum);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(q_dim + 1) * 4, &bq, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)cache * 4, &bk, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)cache * 4, &bv, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, sizeof tables, &bt, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, sizeof info, &bi, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(rope_dim > 0 ? rope_dim : 1) * 4, &bcs, &err) ==
          BN_OK);
    CHECK(bn_vk_write(vk, &bt, tables, sizeof tables, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &bi, info, sizeof info, &err) == BN_OK);
    if (rope_dim > 0)
        CHECK(bn_vk_write(vk, &bcs, cs, (size_t)rope_dim * 4, &err) == BN_OK);
    const bn_vk_qkv qs = {n_head,
                          n_kv,
                          hd,
                          rope_dim,
                          test_rand_float(0.01f, 2.0f),
                          test_rand_float(0.01f, 2.0f),
                          test_rand_float(0.01f, 2.0f),
                          &bi,
                          &bt,
                          &bcs,
                          &bk,
                          &bv,
                          BLOCK,
                          MAX_BLOCKS,
                          CACHE_ROWS,
                          0};
    float *out[2] = {want, got};
    for (int form = 0; form < 2; form++) { /* norm + product, then the normed one */
        CHECK(bn_vk_write(vk, &bq, init, (size_t)(q_dim + 1) * 4, &err) == BN_OK);
        CHECK(bn_vk_write(vk, &bk, init + q_dim + 1, (size_t)cache * 4, &err) == BN_OK);
        CHECK(bn_vk_write(vk, &bv, init + q_dim + 1 + cache, (size_t)cache * 4, &err) == BN_OK);
        CHECK(bn_vk_begin(vk, &err) == BN_OK);
        bn_status st;
        if (form == 0) {
            CHECK(bn_vk_norm_record(vk, norm, &bx, &bn, &bc, &bs, &bsum, 1, k, 1e-5f, &err) ==
                  BN_OK);
            st = bn_vk_w2a8_record_qkv(vk, plain, &bw, &bc, &bs, 0, 1, &bq, k, &qs, &err);
        } else {
            st = bn_vk_w2a8_record_qkv_normed(vk, normed, &bw, &bx, &bn, 1e-5f, &bq, k, &qs, &err);
        }
        CHECK_MSG(st == BN_OK, "q, k, v form %d: %s", form, err.message);
        CHECK(bn_vk_submit(vk, &err) == BN_OK);
        CHECK(bn_vk_read(vk, &bq, out[form], (size_t)(q_dim + 1) * 4, &err) == BN_OK);
        CHECK(bn_vk_read(vk, &bk, out[form] + q_dim + 1, (size_t)cache * 4, &err) == BN_OK);
        CHECK(bn_vk_read(vk, &bv, out[form] + q_dim + 1 + cache, (size_t)cache * 4, &err) == BN_OK);
    }
    int64_t bad = 0, first = -1, stored = 0, q_nan = 0;
    for (int64_t i = 0; i < q_dim + 1 + 2 * cache; i++) {
        if (memcmp(&got[i], &want[i], 4) != 0 && bad++ == 0)
            first = i;
        stored += i > q_dim && want[i] != -12345.5f;
        q_nan += i < q_dim && isnan(got[i]);
    }
    CHECK_MSG(q_nan == 0, "normed q, k, v: %lld of q's %lld values not written", (long long)q_nan,
              (long long)q_dim);
    CHECK_MSG(bad == 0,
              "normed q, k, v (%d + %d heads of %d, rope %d, k %lld, kind %d): %lld values differ "
              "from norm + product (first %lld: %.9g, want %.9g)",
              n_head, n_kv, hd, rope_dim, (long long)k, kind, (long long)bad, (long long)first,
              first >= 0 ? got[first] : 0.0, first >= 0 ? want[first] : 0.0);
    CHECK_MSG(stored == (seq < N_SEQ ? 2 * kv_dim : 0), "normed q, k, v: %lld cache values stored",
              (long long)stored);
    bn_vk_buffer *const all[] = {&bw, &bx, &bn, &bq, &bk, &bv, &bt, &bi, &bcs, &bc, &bs, &bsum};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    free(x);
    free(nw);
    free(cs);
    free(init);
    free(want);
    free(got);
    free(wc);
    free(packed);
}

/* The product that norms its input (bn_vk_w2a8_record_normed) over one
 * row x of k values of kind `kind`: y bit for bit what the norm kernel
 * followed by the plain product gives (which check_chain holds to the
 * CPU), stored or added to y; for the store also the CPU's norm and
 * scalar product directly; the value after y's last left alone. */
static void check_normed(bn_vk *vk, bn_vk_kernel *normed, bn_vk_kernel *norm, bn_vk_kernel *plain,
                         int64_t n, int64_t k, int kind, bn_vk_w2a8_epilogue epilogue)
{
    const int64_t w_rows = n;
    const size_t words = bn_vk_w2a8_words(k);
    float *x = malloc((size_t)k * 4), *nw = malloc((size_t)k * 4);
    float *y0 = malloc((size_t)(n + 1) * 4), *got = malloc((size_t)(n + 1) * 4);
    float *want = malloc((size_t)(n + 1) * 4), *cpu = malloc((size_t)n * 4);
    int8_t *wc = malloc((size_t)(w_rows * k)), *q = calloc(words * 16, 1);
    uint32_t *packed = malloc((size_t)w_rows * words * 4);
    CHECK(x && nw && y0 && got && want && cpu && wc && q && packed);
    random_normed_inputs(x, nw, k, kind, wc, w_rows, packed);
    for (int64_t i = 0; i < n; i++)
        y0[i] = epilogue == BN_VK_W2A8_ADD ? test_rand_float(-4.0f, 4.0f) : NAN;
    y0[n] = -12345.5f; /* the guard */
    const float w_scale = test_rand_float(0.01f, 2.0f);

    bn_error err;
    bn_vk_buffer bw, bx, bn, by, bc, bs, bsum;
    upload_normed_inputs(vk, w_rows, k, packed, x, nw, &bw, &bx, &bn, &bc, &bs, &bsum);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(n + 1) * 4, &by, &err) == BN_OK);

    /* The norm kernel, then the plain product. */
    CHECK(bn_vk_write(vk, &by, y0, (size_t)(n + 1) * 4, &err) == BN_OK);
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_norm_record(vk, norm, &bx, &bn, &bc, &bs, &bsum, 1, k, 1e-5f, &err) == BN_OK);
    CHECK(bn_vk_w2a8_record_rows(vk, plain, &bw, &bc, &bs, 0, 1, &by, n, k, w_scale, epilogue,
                                 &err) == BN_OK);
    CHECK(bn_vk_submit(vk, &err) == BN_OK);
    CHECK(bn_vk_read(vk, &by, want, (size_t)(n + 1) * 4, &err) == BN_OK);

    /* The normed product. */
    CHECK(bn_vk_write(vk, &by, y0, (size_t)(n + 1) * 4, &err) == BN_OK);
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    const bn_status st = bn_vk_w2a8_record_normed(vk, normed, &bw, &bx, &bn, 1e-5f, &by, n, k,
                                                  w_scale, epilogue, &err);
    CHECK_MSG(st == BN_OK, "normed: %s", err.message);
    CHECK(bn_vk_submit(vk, &err) == BN_OK);
    CHECK(bn_vk_read(vk, &by, got, (size_t)(n + 1) * 4, &err) == BN_OK);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i <= n; i++)
        if (memcmp(&got[i], &want[i], 4) != 0 && bad++ == 0)
            first = i;
    CHECK_MSG(bad == 0,
              "normed %s %lld x %lld, row kind %d: %lld outputs differ from norm + product "
              "(first %lld: %.9g, want %.9g)",
              epilogue == BN_VK_W2A8_ADD ? "add" : "store", (long long)n, (long long)k, kind,
              (long long)bad, (long long)first, first >= 0 ? got[first] : 0.0,
              first >= 0 ? want[first] : 0.0);
    if (epilogue == BN_VK_W2A8_STORE) { /* the CPU's own, directly */
        float s;
        int32_t sum;
        bn_norm_quantize_row(x, nw, k, 1e-5f, q, &s, &sum);
        bn_w2a8_weights wref;
        CHECK(bn_w2a8_pack(&bn_provider_scalar, wc, n, k, w_scale, &wref, NULL) == BN_OK);
        bn_provider_scalar.matvec(&wref, q, s, sum, 0, n, cpu);
        bn_w2a8_weights_free(&wref);
        CHECK_MSG(memcmp(got, cpu, (size_t)n * 4) == 0,
                  "normed store %lld x %lld, row kind %d: differs from the CPU's", (long long)n,
                  (long long)k, kind);
    }
    bn_vk_buffer *const all[] = {&bw, &bx, &bn, &by, &bc, &bs, &bsum};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    free(x);
    free(nw);
    free(y0);
    free(got);
    free(want);
    free(cpu);
    free(wc);
    free(q);
    free(packed);
}

int main(void)
{
    test_seed_init();
    int n_dev;
    bn_vk *vk = test_require_vulkan(&n_dev);
    bn_error err;
    bn_vk_kernel *kernel = NULL;
    /* The fp64 kernels where the device has fp64: trees, then (where the
     * device can) subgroups, which the backend then runs. */
    const bool fp64 = bn_vk_device(vk)->fp64, sg = bn_vk_norm_subgroups(vk);
    printf("norm variants: fp64 %s, subgroups %s\n", fp64 ? "yes" : "no", sg ? "yes" : "no");
    static const int64_t widths[] = {2560, 6912, 640, 1, 3, 17, 100, 1000, 1023, 1025, 4097};
    for (int variant = 0; variant < (sg ? 2 : 1); variant++) {
        if (kernel)
            bn_vk_kernel_free(vk, kernel);
        kernel = NULL;
        CHECK(bn_vk_norm_kernel(vk, variant == 1, &kernel, &err) == BN_OK && kernel);
        for (size_t i = 0; fp64 && kernel && i < sizeof widths / sizeof widths[0]; i++)
            for (int rep = 0; rep < 3; rep++)
                check_width(vk, kernel, widths[i], 16, true);
        for (int i = 0; fp64 && kernel && i < 10; i++)
            check_width(vk, kernel, test_rand_range(1, 3000), test_rand_range(1, 40), true);
    }
    if (!sg) {
        bn_vk_kernel *none = NULL;
        CHECK(bn_vk_norm_kernel(vk, true, &none, &err) == BN_ERR_UNSUPPORTED && !none);
        CHECK_STR_CONTAINS(err.message, "subgroup");
    }
    {
        /* The float kernel, as a device without fp64 runs it. */
        setenv("BITNET_VULKAN_FP64", "0", 1);
        bn_vk *vf = NULL;
        bn_vk_kernel *kf = NULL;
        CHECK(bn_vk_open(0, &vf, &err) == BN_OK && !bn_vk_device(vf)->fp64);
        CHECK(vf && bn_vk_norm_kernel(vf, false, &kf, &err) == BN_OK);
        CHECK(vf && !bn_vk_norm_subgroups(vf)); /* the subgroup variant needs fp64 */
        for (size_t i = 0; kf && i < sizeof widths / sizeof widths[0]; i++)
            check_width(vf, kf, widths[i], 16, false);
        for (int i = 0; kf && i < 5; i++)
            check_width(vf, kf, test_rand_range(1, 3000), test_rand_range(1, 40), false);
        if (kf)
            bn_vk_kernel_free(vf, kf);
        bn_vk_close(vf);
        unsetenv("BITNET_VULKAN_FP64");
    }
    bn_vk_kernel *w2a8 = NULL;
    const bool dot = bn_vk_w2a8_dot_fits(vk);
    if (fp64 && kernel && bn_vk_w2a8_kernel(vk, true, dot, &w2a8, &err) == BN_OK) {
        check_chain(vk, kernel, w2a8, 2560, 640, 3);
        check_chain(vk, kernel, w2a8, 6912, 256, 2);
        check_chain(vk, kernel, w2a8, test_rand_range(1, 2000), test_rand_range(1, 300), 4);
        bn_vk_kernel_free(vk, w2a8);
    }
    /* The product that norms its input, where the device runs it: the
     * decode step's two (Wo, down) on rows of every kind, stores of more
     * groups than workgroups, ragged widths, the widest row. */
    const bool normed_ok = bn_vk_w2a8_normed_fits(vk);
    printf("product that norms its input: %s\n", normed_ok ? "yes" : "no");
    CHECK(normed_ok == (dot && sg));
    bn_vk_kernel *normed = NULL, *plain = NULL;
    if (normed_ok && sg && kernel && bn_vk_w2a8_normed_kernel(vk, &normed, &err) == BN_OK &&
        bn_vk_w2a8_kernel(vk, true, true, &plain, &err) == BN_OK) {
        bn_vk_kernel *norm_sg = NULL; /* the subgroup variant, as the backend runs it */
        CHECK(bn_vk_norm_kernel(vk, true, &norm_sg, &err) == BN_OK);
        for (int kind = 0; norm_sg && kind < KINDS; kind++)
            check_normed(vk, normed, norm_sg, plain, 2560, 2560, kind, BN_VK_W2A8_ADD);
        check_normed(vk, normed, norm_sg, plain, 2560, 6912, 0, BN_VK_W2A8_ADD);
        check_normed(vk, normed, norm_sg, plain, 2560, 6912, 8, BN_VK_W2A8_ADD);
        check_normed(vk, normed, norm_sg, plain, 6912, 2560, 0, BN_VK_W2A8_STORE);
        check_normed(vk, normed, norm_sg, plain, 5000, 1000, 1, BN_VK_W2A8_STORE);
        for (int i = 0; i < 4; i++)
            check_normed(vk, normed, norm_sg, plain, test_rand_range(1, 600),
                         test_rand_range(1, 3000), (int)test_rand_range(0, KINDS - 1),
                         (bn_vk_w2a8_epilogue)(i % 2));
        check_normed(vk, normed, norm_sg, plain, 37, BN_VK_NORMED_MAX_K, 2, BN_VK_W2A8_STORE);
        /* q, k and v normed: the 2B-4T heads, a head without RoPE's tail,
         * no RoPE, a ragged row, a row that stores nothing. */
        for (int kind = 0; norm_sg && kind < KINDS; kind += 4)
            check_qkv_normed(vk, normed, norm_sg, plain, 20, 5, 128, 128, 2560, kind, 1, 9);
        if (norm_sg) {
            check_qkv_normed(vk, normed, norm_sg, plain, 6, 3, 20, 12, 300, 0, 0, 5);
            check_qkv_normed(vk, normed, norm_sg, plain, 4, 2, 16, 0, 77, 1, 1, 14);
            check_qkv_normed(vk, normed, norm_sg, plain, 4, 1, 24, 24, 1000, 2, 0, 0);
            check_qkv_normed(vk, normed, norm_sg, plain, 4, 2, 16, 16, 64, 0, 5, 3);
        }
        /* Refused: a row past the kernel's, an unknown epilogue. */
        bn_vk_buffer b;
        CHECK(bn_vk_buffer_create(vk, 1 << 20, &b, &err) == BN_OK);
        CHECK(bn_vk_begin(vk, &err) == BN_OK);
        CHECK(bn_vk_w2a8_record_normed(vk, normed, &b, &b, &b, 1e-5f, &b, 4, BN_VK_NORMED_MAX_K + 1,
                                       1.0f, BN_VK_W2A8_STORE, &err) == BN_ERR_INVALID_ARGUMENT);
        CHECK(bn_vk_w2a8_record_normed(vk, normed, &b, &b, &b, 1e-5f, &b, 4, 16, 1.0f,
                                       (bn_vk_w2a8_epilogue)2, &err) == BN_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(err.message, "epilogue");
        CHECK(bn_vk_submit(vk, &err) == BN_OK);
        bn_vk_buffer_free(vk, &b);
        if (norm_sg)
            bn_vk_kernel_free(vk, norm_sg);
    } else if (!normed_ok) {
        CHECK(bn_vk_w2a8_normed_kernel(vk, &normed, &err) == BN_ERR_UNSUPPORTED && !normed);
    }
    if (normed)
        bn_vk_kernel_free(vk, normed);
    if (plain)
        bn_vk_kernel_free(vk, plain);
    bn_vk_kernel_free(vk, kernel);
    bn_vk_close(vk);
    TEST_EXIT();
}
