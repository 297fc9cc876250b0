/* The Vulkan W2A8 kernel (shaders/w2a8_matvec.comp, vk_w2a8.h) against the
 * CPU's scalar provider on the first Vulkan device (lavapipe in CI):
 *
 *   - the int32 sums exactly: with both scales 1 the output is (float) sum;
 *   - the outputs with real scales bit-identical to the CPU's on a device
 *     with fp64 (the exact division), else within the division's allowance
 *     (vk_w2a8.h), counting the bit-identical ones; every check below for
 *     the portable sums and, where the device has integer dot products
 *     (lavapipe, NVIDIA), the dot-product ones;
 *   - ragged shapes (k not a multiple of 16, one row, k to 40000; more
 *     rows than a grid column's 65535 workgroups of 8 outputs hold for the
 *     first plain variant and the rows kernel, whose grids unfold),
 *     outputs poisoned with NaN, a guard value after the last row;
 *   - several activation rows in one dispatch (1, 8, 13 and 21 rows,
 *     starting past row 0) equal bit for bit to each row alone;
 *   - every check above and below again with the kernel of eight rows a
 *     workgroup (bn_vk_w2a8_rows_kernel, where the device has fp64 and
 *     integer dot products), with the tiled one (bn_vk_w2a8_tiles_kernel:
 *     32 rows a workgroup, so passes of 70 and 131 rows too) and, where the
 *     device has int8 subgroup matrix products (NVIDIA's driver; not
 *     lavapipe, where the kernel is refused), the same tiles on them
 *     (bn_vk_w2a8_matrix_kernel), their rows against the one-row kernel's;
 *   - the epilogues: the residual add (NaN, -0, infinities, subnormals in
 *     y) and the gate and up products in one dispatch with the squared-ReLU
 *     gate (negative, -0 and infinite gates), the CPU's float operations on
 *     the plain outputs, bit for bit; an unknown epilogue refused;
 *   - a sequence of dispatches equal to their runs alone, one reading what
 *     the one before wrote; no copy or second sequence while one is open;
 *     copies from and to a host buffer inside a kept sequence, replayed
 *     with new inputs, as a decode step runs;
 *   - errors: a device index past the list, a buffer larger than the
 *     device's memory, a shape larger than its buffers.
 *
 * Exits 77 (skipped) when no Vulkan device can be opened, saying why. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_provider.h"
#include "quant_rules.h"
#include "test_util.h"
#include "test_util_vulkan.h"
#include "vk_w2a8.h"
#include "w2a8.h"

extern const bn_kernel_provider bn_provider_scalar;

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ulps between two finite floats of the same sign (a large number else). */
static int64_t ulps(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if ((ia < 0) != (ib < 0))
        return a == b ? 0 : INT32_MAX;
    return llabs((long long)ia - (long long)ib);
}

static int exact_total, compared_total;

/* A new buffer holding bytes of data. */
static bn_vk_buffer buffer_of(bn_vk *vk, const void *data, size_t bytes)
{
    bn_vk_buffer b;
    bn_error err;
    CHECK(bn_vk_buffer_create(vk, bytes, &b, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &b, data, bytes, &err) == BN_OK);
    return b;
}

/* A buffer holding one activation scale. */
static bn_vk_buffer scale_buffer(bn_vk *vk, float v)
{
    bn_vk_buffer b;
    bn_error err;
    CHECK(bn_vk_buffer_create(vk, sizeof v, &b, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &b, &v, sizeof v, &err) == BN_OK);
    return b;
}

static void check_shape(bn_vk *vk, bn_vk_kernel *kernel, bool exact_division, int64_t n,
                        int64_t k)
{
    int8_t *codes = malloc((size_t)(n * k));
    float *x = malloc((size_t)k * sizeof *x);
    const size_t words = bn_vk_w2a8_words(k);
    uint32_t *packed = malloc((size_t)n * words * 4);
    int8_t *xq = calloc(words * 16, 1);
    float *ref = malloc((size_t)n * sizeof *ref), *got = malloc((size_t)(n + 1) * sizeof *got);
    CHECK(codes && x && packed && xq && ref && got);
    const int zero_pct = (int)test_rand_range(0, 80);
    for (int64_t i = 0; i < n * k; i++)
        codes[i] = (int)test_rand_range(0, 99) < zero_pct ? 0 : (test_rand_u64() & 1) ? 1 : -1;
    const float range = test_rand_float(0.1f, 20.0f);
    for (int64_t i = 0; i < k; i++)
        x[i] = test_rand_float(-range, range);
    float act_scale;
    int32_t act_sum;
    bn_quantize_activations_row(x, k, xq, &act_scale, &act_sum);
    const float weight_scale = test_rand_float(0.01f, 2.0f);

    /* The CPU's answer: the scalar provider's matvec. */
    bn_w2a8_weights wref;
    CHECK(bn_w2a8_pack(&bn_provider_scalar, codes, n, k, weight_scale, &wref, NULL) == BN_OK);
    bn_provider_scalar.matvec(&wref, xq, act_scale, act_sum, 0, n, ref);
    bn_w2a8_weights_free(&wref);

    bn_vk_buffer w, xb, y;
    bn_error err;
    bn_vk_w2a8_pack(codes, n, k, packed);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)n * words * 4, &w, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, words * 16, &xb, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(n + 1) * sizeof(float), &y, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &w, packed, (size_t)n * words * 4, &err) == BN_OK);
    CHECK(bn_vk_write(vk, &xb, xq, words * 16, &err) == BN_OK);

    /* Scales 1: the outputs are the integer sums themselves. */
    for (int64_t i = 0; i <= n; i++)
        got[i] = NAN;
    const float guard = -12345.5f;
    got[n] = guard;
    CHECK(bn_vk_write(vk, &y, got, (size_t)(n + 1) * sizeof(float), &err) == BN_OK);
    bn_vk_buffer one = scale_buffer(vk, 1.0f), real = scale_buffer(vk, act_scale);
    CHECK(test_vk_w2a8_matvec(vk, kernel, &w, &xb, &one, 0, &y, n, k, 1.0f, &err) == BN_OK);
    CHECK(bn_vk_read(vk, &y, got, (size_t)(n + 1) * sizeof(float), &err) == BN_OK);
    int bad = 0;
    for (int64_t r = 0; r < n; r++) {
        int32_t sum = 0;
        for (int64_t c = 0; c < k; c++)
            sum += codes[r * k + c] * xq[c];
        bad += !same_bits(got[r], (float)sum);
    }
    CHECK_MSG(bad == 0, "%lld x %lld: %d integer sums differ", (long long)n, (long long)k, bad);
    CHECK_MSG(same_bits(got[n], guard), "%lld x %lld: the value after the last row was written",
              (long long)n, (long long)k);

    /* Real scales: the CPU's outputs within the division's allowance. */
    for (int64_t i = 0; i < n; i++)
        got[i] = NAN;
    CHECK(bn_vk_write(vk, &y, got, (size_t)n * sizeof(float), &err) == BN_OK);
    CHECK(test_vk_w2a8_matvec(vk, kernel, &w, &xb, &real, 0, &y, n, k, weight_scale, &err) ==
          BN_OK);
    CHECK(bn_vk_read(vk, &y, got, (size_t)n * sizeof(float), &err) == BN_OK);
    int far = 0, exact = 0;
    for (int64_t r = 0; r < n; r++) {
        exact += same_bits(got[r], ref[r]);
        far += !(isfinite(got[r]) && ulps(got[r], ref[r]) <= 3);
    }
    CHECK_MSG(far == 0, "%lld x %lld: %d outputs more than 3 ulp from the CPU's", (long long)n,
              (long long)k, far);
    CHECK_MSG(!exact_division || exact == n,
              "%lld x %lld: %lld outputs differ from the CPU's despite the exact division",
              (long long)n, (long long)k, (long long)(n - exact));
    exact_total += exact;
    compared_total += (int)n;

    bn_vk_buffer_free(vk, &w);
    bn_vk_buffer_free(vk, &xb);
    bn_vk_buffer_free(vk, &y);
    bn_vk_buffer_free(vk, &one);
    bn_vk_buffer_free(vk, &real);
    free(codes);
    free(x);
    free(packed);
    free(xq);
    free(ref);
    free(got);
}

/* Random ternary weights (n x k, packed), act_rows rows of int8
 * activations and their scales, uploaded into new buffers bw, bx, bs. */
static void upload_random_product(bn_vk *vk, int64_t n, int64_t k, int64_t act_rows,
                                  bn_vk_buffer *bw, bn_vk_buffer *bx, bn_vk_buffer *bs)
{
    const size_t words = bn_vk_w2a8_words(k);
    int8_t *codes = malloc((size_t)(n * k)), *xq = calloc((size_t)act_rows * words * 16, 1);
    uint32_t *packed = malloc((size_t)n * words * 4);
    float *scales = malloc((size_t)act_rows * sizeof *scales);
    CHECK(codes && xq && packed && scales);
    for (int64_t i = 0; i < n * k; i++)
        codes[i] = (int8_t)test_rand_range(-1, 1);
    for (int64_t r = 0; r < act_rows; r++) {
        for (int64_t i = 0; i < k; i++)
            xq[(size_t)r * words * 16 + (size_t)i] = (int8_t)test_rand_range(-127, 127);
        scales[r] = test_rand_float(0.5f, 200.0f);
    }
    bn_vk_w2a8_pack(codes, n, k, packed);
    bn_error err;
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)n * words * 4, bw, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)act_rows * words * 16, bx, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)act_rows * 4, bs, &err) == BN_OK);
    CHECK(bn_vk_write(vk, bw, packed, (size_t)n * words * 4, &err) == BN_OK);
    CHECK(bn_vk_write(vk, bx, xq, (size_t)act_rows * words * 16, &err) == BN_OK);
    CHECK(bn_vk_write(vk, bs, scales, (size_t)act_rows * 4, &err) == BN_OK);
    free(codes);
    free(xq);
    free(packed);
    free(scales);
}

/* Several activation rows in one dispatch (bn_vk_w2a8_record_rows; 1, 8,
 * 13 and 21 rows starting past row 0):
 * each output row bit for bit the same row's product alone, the rows
 * after the last left poisoned. */
static void check_rows(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_kernel *one_row, int64_t n, int64_t k,
                       int64_t first, int64_t rows)
{
    const int64_t total = first + rows;
    float *got = malloc((size_t)(rows + 1) * (size_t)n * sizeof *got), *one = malloc((size_t)n * 4);
    CHECK(got && one);
    bn_error err;
    bn_vk_buffer bw, bx, bs, by, b1;
    upload_random_product(vk, n, k, total, &bw, &bx, &bs);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(rows + 1) * n * 4, &by, &err) == BN_OK);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)n * 4, &b1, &err) == BN_OK);
    for (int64_t i = 0; i < (rows + 1) * n; i++)
        got[i] = NAN;
    CHECK(bn_vk_write(vk, &by, got, (size_t)(rows + 1) * n * 4, &err) == BN_OK);
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_w2a8_record_rows(vk, kernel, &bw, &bx, &bs, first, rows, &by, n, k, 0.37f,
                                 BN_VK_W2A8_STORE, &err) == BN_OK);
    CHECK(bn_vk_submit(vk, &err) == BN_OK);
    CHECK(bn_vk_read(vk, &by, got, (size_t)(rows + 1) * n * 4, &err) == BN_OK);
    int bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        CHECK(test_vk_w2a8_matvec(vk, one_row, &bw, &bx, &bs, first + r, &b1, n, k, 0.37f, &err) ==
              BN_OK);
        CHECK(bn_vk_read(vk, &b1, one, (size_t)n * 4, &err) == BN_OK);
        for (int64_t o = 0; o < n; o++)
            bad += !same_bits(got[r * n + o], one[o]);
    }
    int poisoned = 1;
    for (int64_t o = 0; o < n; o++)
        poisoned &= isnan(got[rows * n + o]);
    CHECK_MSG(bad == 0 && poisoned, "%lld x %lld, rows %lld..%lld: %d outputs differ from the "
                                    "rows alone%s",
              (long long)n, (long long)k, (long long)first, (long long)(first + rows - 1), bad,
              poisoned ? "" : ", and the row after the last was written");
    bn_vk_buffer *const all[] = {&bw, &bx, &bs, &by, &b1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    free(got);
    free(one);
}

/* The squared-ReLU gate of the CPU's relu2_span: g = max(gate, 0), NaN and
 * -0 giving +0, then (g * g) * up. */
static float relu2_of(float gate, float up)
{
    int32_t bits;
    memcpy(&bits, &gate, 4);
    const float g = bits > 0 && bits <= 0x7f800000 ? gate : 0.0f;
    return (g * g) * up;
}

/* Vulkan lets a device flush float subnormals to zero, inputs and results
 * (NVIDIA's driver does): v with its subnormals flushed. */
static float ftz(float v) { return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v; }

/* The plain outputs (BN_VK_W2A8_STORE) of w_rows rows for `rows`
 * activation rows into out ([rows][w_rows]). */
static void run_store(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *bw, bn_vk_buffer *bx,
                      bn_vk_buffer *bs, int64_t rows, bn_vk_buffer *by, int64_t w_rows, int64_t k,
                      float scale, float *out)
{
    bn_error err;
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_w2a8_record_rows(vk, kernel, bw, bx, bs, 0, rows, by, w_rows, k, scale,
                                 BN_VK_W2A8_STORE, &err) == BN_OK);
    CHECK(bn_vk_submit(vk, &err) == BN_OK);
    CHECK(bn_vk_read(vk, by, out, (size_t)(rows * w_rows) * 4, &err) == BN_OK);
}

/* The epilogues over `rows` activation rows of weights of 2n rows, outputs
 * poisoned and a guard after the last:
 *   - BN_VK_W2A8_ADD (the first n rows): y's value (NaN, -NaN, -0,
 *     infinities and subnormals among them) plus the plain output, one
 *     float add;
 *   - the gate and up at once (bn_vk_w2a8_record_gate_up): relu2_of the
 *     first n rows' plain output with the gate's scale and the last n
 *     rows' with the up's, for scales that give negative gates, -0 (a
 *     negative scale) and infinite gates (a scale near FLT_MAX);
 * all bit for bit; an unknown epilogue refused. */
static void check_epilogues(bn_vk *vk, bn_vk_kernel *kernel, int64_t n, int64_t k, int64_t rows)
{
    const int64_t total = rows * n;
    float *plain = malloc((size_t)(2 * total) * 4), *up = malloc((size_t)(2 * total) * 4),
          *start = malloc((size_t)(2 * total + 1) * 4), *got = malloc((size_t)(total + 1) * 4);
    CHECK(plain && up && start && got);
    bn_error err;
    bn_vk_buffer bw, bx, bs, by;
    upload_random_product(vk, 2 * n, k, rows, &bw, &bx, &bs);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(2 * total + 1) * 4, &by, &err) == BN_OK);
    const float guard = -12345.5f;
    static const float special[] = {NAN, -NAN, -0.0f, 0.0f, INFINITY, -INFINITY, 1e-40f, -1e-40f};
    static const float scales[][2] = {{0.37f, 1.7f}, {-0.8f, 0.05f}, {3e38f, -1.0f}};
    for (int c = -1; c < (int)(sizeof scales / sizeof scales[0]); c++) {
        const bool add = c < 0;
        const float gate_scale = add ? 0.61f : scales[c][0], up_scale = add ? 0.0f : scales[c][1];
        run_store(vk, kernel, &bw, &bx, &bs, rows, &by, 2 * n, k, gate_scale, plain);
        if (!add)
            run_store(vk, kernel, &bw, &bx, &bs, rows, &by, 2 * n, k, up_scale, up);
        for (int64_t i = 0; i < total; i++)
            start[i] = !add ? NAN
                       : i % 7 == 0 ? special[test_rand_range(0, 7)]
                                    : test_rand_float(-10.0f, 10.0f);
        start[total] = guard;
        CHECK(bn_vk_write(vk, &by, start, (size_t)(total + 1) * 4, &err) == BN_OK);
        CHECK(bn_vk_begin(vk, &err) == BN_OK);
        if (add)
            CHECK(bn_vk_w2a8_record_rows(vk, kernel, &bw, &bx, &bs, 0, rows, &by, n, k,
                                         gate_scale, BN_VK_W2A8_ADD, &err) == BN_OK);
        else
            CHECK(bn_vk_w2a8_record_gate_up(vk, kernel, &bw, &bx, &bs, 0, rows, &by, n, k,
                                            gate_scale, up_scale, &err) == BN_OK);
        CHECK(bn_vk_submit(vk, &err) == BN_OK);
        CHECK(bn_vk_read(vk, &by, got, (size_t)(total + 1) * 4, &err) == BN_OK);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < total; i++) {
            /* Row a's output o: the plain outputs are [rows][2n]. */
            const int64_t a = i / n, o = i % n;
            const float g = plain[a * 2 * n + o], u = add ? 0.0f : up[a * 2 * n + n + o];
            const float want = add ? start[i] + g : relu2_of(g, u);
            const float flushed = ftz(add ? ftz(start[i]) + g : relu2_of(ftz(g), ftz(u)));
            if (!same_bits(got[i], want) && !same_bits(got[i], flushed) &&
                !(isnan(got[i]) && isnan(want)) && bad++ == 0)
                first = i;
        }
        CHECK_MSG(bad == 0 && same_bits(got[total], guard),
                  "%lld x %lld, %lld rows, epilogue %s (scales %g, %g): %lld outputs differ "
                  "(first at %lld: %g)%s",
                  (long long)n, (long long)k, (long long)rows, add ? "add" : "gate and up",
                  gate_scale, up_scale, (long long)bad, (long long)first,
                  first >= 0 ? got[first] : 0.0,
                  same_bits(got[total], guard) ? "" : ", and the value after the last was written");
    }
    /* An epilogue that does not exist is refused. */
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    CHECK(bn_vk_w2a8_record_rows(vk, kernel, &bw, &bx, &bs, 0, rows, &by, n, k, 1.0f,
                                 (bn_vk_w2a8_epilogue)2, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "epilogue");
    /* Gate and up rows past the weights (2n rows held, 2 (n + 1) read). */
    CHECK(bn_vk_w2a8_record_gate_up(vk, kernel, &bw, &bx, &bs, 0, rows, &by, n + 1, k, 1.0f,
                                    1.0f, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_vk_submit(vk, &err) == BN_OK);
    bn_vk_buffer *const all[] = {&bw, &bx, &bs, &by};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    free(plain);
    free(up);
    free(start);
    free(got);
}

/* The attention's q, k and v in one dispatch (bn_vk_w2a8_record_qkv) over
 * `rows` activation rows of two sequences through shuffled block tables,
 * into the second layer of a two-layer cache: q turned by RoPE
 * (rope_heads) into its buffer, k turned and v stored at each row's cache
 * row, all bit for bit the plain products' outputs (each part with its
 * scale) turned on the CPU; a last row whose sequence is past the tables
 * gets its q and stores nothing; the first layer, the cache rows no row
 * names and the value after q's last are left alone. */
static void check_qkv(bn_vk *vk, bn_vk_kernel *kernel, int n_head, int n_kv, int hd,
                      int rope_dim, int64_t k, int rows)
{
    const int64_t q_dim = (int64_t)n_head * hd, kv_dim = (int64_t)n_kv * hd;
    const int64_t n = q_dim + 2 * kv_dim, half = rope_dim / 2;
    enum { BLOCK = 4, MAX_BLOCKS = 4, N_SEQ = 2, CACHE_ROWS = BLOCK * 8 };
    const int64_t layer = CACHE_ROWS * kv_dim;
    bn_error err;
    bn_vk_buffer bw, bx, bs, by;
    upload_random_product(vk, n, k, rows, &bw, &bx, &bs);
    CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)(rows * n + 1) * 4, &by, &err) == BN_OK);
    const float scale[3] = {test_rand_float(0.01f, 2.0f), test_rand_float(0.01f, 2.0f),
                            test_rand_float(0.01f, 2.0f)};
    float *plain[3];
    for (int part = 0; part < 3; part++) {
        plain[part] = malloc((size_t)(rows * n) * 4);
        CHECK(plain[part] != NULL);
        run_store(vk, kernel, &bw, &bx, &bs, rows, &by, n, k, scale[part], plain[part]);
    }
    /* Blocks 0..7 shuffled over the two sequences' tables; row r of
     * sequence r % 2 at position r / 2 * 3 + 1 (within 4 blocks of 4);
     * the last row's sequence is past the tables, and so are those of the
     * rows past the tenth (their q alone is stored). */
    int32_t tables[N_SEQ * MAX_BLOCKS], info[2 * 128];
    test_shuffled_tables(tables, N_SEQ * MAX_BLOCKS);
    CHECK(rows <= 128);
    for (int r = 0; r < rows; r++) {
        info[2 * r] = r == rows - 1 || r >= 10 ? N_SEQ + 3 : r % 2;
        info[2 * r + 1] = r / 2 * 3 + 1;
    }
    float *cs = malloc((size_t)(rows * (rope_dim > 0 ? rope_dim : 1)) * 4);
    for (int64_t i = 0; i < rows * rope_dim; i++)
        cs[i] = test_rand_float(-1.0f, 1.0f);
    float *kc = malloc((size_t)(2 * layer) * 4), *vc = malloc((size_t)(2 * layer) * 4);
    const int64_t got_n = rows * q_dim + 1 > 2 * layer ? rows * q_dim + 1 : 2 * layer;
    float *qref = malloc((size_t)(rows * q_dim + 1) * 4), *got = malloc((size_t)got_n * 4);
    CHECK(cs && kc && vc && qref && got);
    const float guard = -12345.5f;
    for (int64_t i = 0; i < 2 * layer; i++)
        kc[i] = vc[i] = guard;
    bn_vk_buffer bt = buffer_of(vk, tables, sizeof tables), bi = buffer_of(vk, info, 8 * rows);
    bn_vk_buffer bc = buffer_of(vk, cs, (size_t)(rows * (rope_dim > 0 ? rope_dim : 1)) * 4);
    bn_vk_buffer bkc = buffer_of(vk, kc, (size_t)(2 * layer) * 4);
    bn_vk_buffer bvc = buffer_of(vk, vc, (size_t)(2 * layer) * 4);
    for (int64_t i = 0; i <= rows * q_dim; i++)
        qref[i] = NAN;
    qref[rows * q_dim] = guard;
    CHECK(bn_vk_write(vk, &by, qref, (size_t)(rows * q_dim + 1) * 4, &err) == BN_OK);

    /* The CPU: each part's plain outputs, q and k turned (rope_heads). */
    for (int r = 0; r < rows; r++) {
        const float *c = cs + (int64_t)r * rope_dim, *sn = c + half;
        for (int part = 0; part < 3; part++) {
            const int heads = part == 0 ? n_head : n_kv;
            const int64_t base = part == 0 ? 0 : part == 1 ? q_dim : q_dim + kv_dim;
            float row[4096];
            CHECK(heads * hd <= 4096);
            for (int64_t i = 0; i < (int64_t)heads * hd; i++)
                row[i] = plain[part][(int64_t)r * n + base + i];
            for (int h = 0; part < 2 && h < heads; h++)
                for (int64_t j = 0; j < half; j++) {
                    const float x0 = row[h * hd + j], x1 = row[h * hd + j + half];
                    row[h * hd + j] = x0 * c[j] - x1 * sn[j];
                    row[h * hd + j + half] = x1 * c[j] + x0 * sn[j];
                }
            if (part == 0) {
                memcpy(qref + (int64_t)r * q_dim, row, (size_t)q_dim * 4);
                continue;
            }
            if (info[2 * r] >= N_SEQ)
                continue;
            const int pos = info[2 * r + 1];
            const int64_t cr = (int64_t)tables[info[2 * r] * MAX_BLOCKS + pos / BLOCK] * BLOCK +
                               pos % BLOCK;
            memcpy((part == 1 ? kc : vc) + layer + cr * kv_dim, row, (size_t)kv_dim * 4);
        }
    }
    const bn_vk_qkv qs = {n_head, n_kv,  hd,    rope_dim, scale[0],   scale[1],   scale[2], &bi,
                          &bt,    &bc,   &bkc,  &bvc,     BLOCK,      MAX_BLOCKS, CACHE_ROWS,
                          layer};
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    const bn_status st =
        bn_vk_w2a8_record_qkv(vk, kernel, &bw, &bx, &bs, 0, rows, &by, k, &qs, &err);
    CHECK_MSG(st == BN_OK, "qkv: %s", err.message);
    CHECK(bn_vk_submit(vk, &err) == BN_OK);
    int64_t bad = 0;
    CHECK(bn_vk_read(vk, &by, got, (size_t)(rows * q_dim + 1) * 4, &err) == BN_OK);
    for (int64_t i = 0; i <= rows * q_dim; i++)
        bad += !same_bits(got[i], qref[i]) && !same_bits(got[i], ftz(qref[i]));
    CHECK_MSG(bad == 0, "qkv %d + %d heads of %d, rope %d, %d rows: %lld of q differ", n_head,
              n_kv, hd, rope_dim, rows, (long long)bad);
    for (int part = 1; part < 3; part++) {
        const float *want = part == 1 ? kc : vc;
        CHECK(bn_vk_read(vk, part == 1 ? &bkc : &bvc, got, (size_t)(2 * layer) * 4, &err) ==
              BN_OK);
        bad = 0;
        for (int64_t i = 0; i < 2 * layer; i++)
            bad += !same_bits(got[i], want[i]) && !same_bits(got[i], ftz(want[i]));
        CHECK_MSG(bad == 0, "qkv %d + %d heads of %d, rope %d, %d rows: %lld of the %s cache "
                            "differ",
                  n_head, n_kv, hd, rope_dim, rows, (long long)bad, part == 1 ? "k" : "v");
    }
    /* Refused: an odd rope_dim, a cache too small for the layer. */
    CHECK(bn_vk_begin(vk, &err) == BN_OK);
    bn_vk_qkv odd = qs;
    odd.rope_dim = 3;
    CHECK(bn_vk_w2a8_record_qkv(vk, kernel, &bw, &bx, &bs, 0, rows, &by, k, &odd, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    bn_vk_qkv past = qs;
    past.layer_off = 2 * layer;
    CHECK(bn_vk_w2a8_record_qkv(vk, kernel, &bw, &bx, &bs, 0, rows, &by, k, &past, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "cache");
    CHECK(bn_vk_submit(vk, &err) == BN_OK);
    bn_vk_buffer *const all[] = {&bw, &bx, &bs, &by, &bt, &bi, &bc, &bkc, &bvc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    for (int part = 0; part < 3; part++)
        free(plain[part]);
    free(cs);
    free(kc);
    free(vc);
    free(qref);
    free(got);
}

int main(void)
{
    test_seed_init();
    int n_dev;
    bn_vk *vk = test_require_vulkan(&n_dev);
    bn_error err;
    const bool fp64 = bn_vk_device(vk)->fp64;

    /* Every variant the device has: portable sums and (with integer dot
     * products) the dot-product ones, each with the device's division and
     * (with fp64) the exact one. */
    const bool dot_ok = bn_vk_w2a8_dot_fits(vk);
    /* Long rows too: k to 40000. */
    static const int64_t shapes[][2] = {{1, 1},     {1, 16},     {3, 17},      {64, 2560},
                                        {37, 640},  {200, 1000}, {5, 6912},    {530000, 16},
                                        {9, 9000},  {4, 16384},  {3, 16400},   {2, 40000}};
    bn_vk_kernel *kernel = NULL, *one_row = NULL;
    bool folding_checked = false; /* a plain variant ran the 530 000-row shape */
    const bool rows_ok = bn_vk_w2a8_rows_kernel_fits(vk);
    CHECK(rows_ok == (fp64 && dot_ok));
    const bool matrix_ok = bn_vk_w2a8_matrix_fits(vk);
    CHECK(!matrix_ok || rows_ok);
    for (int v = 0; v < (dot_ok ? 4 : 2) + (rows_ok ? 2 : 0) + (matrix_ok ? 1 : 0); v++) {
        /* v = 4: eight rows a workgroup, 5: tiles of 32 rows, 6: the same
         * tiles on subgroup matrix products (exact division, dot
         * products). */
        const bool rows_kernel = v >= 4, tiled = v >= 5, matrix = v == 6, dot = v >= 2;
        const bool exact_division = v % 2 == 0 || rows_kernel;
        if (exact_division && !fp64)
            continue;
        if (kernel && kernel != one_row)
            bn_vk_kernel_free(vk, kernel);
        kernel = NULL;
        if (rows_kernel) { /* its reference: the one-row kernel of the same arithmetic */
            if (one_row)
                bn_vk_kernel_free(vk, one_row);
            one_row = NULL;
            CHECK(bn_vk_w2a8_kernel(vk, true, true, &one_row, &err) == BN_OK);
            CHECK((matrix  ? bn_vk_w2a8_matrix_kernel(vk, &kernel, &err)
                   : tiled ? bn_vk_w2a8_tiles_kernel(vk, &kernel, &err)
                           : bn_vk_w2a8_rows_kernel(vk, &kernel, &err)) == BN_OK);
        } else {
            if (one_row)
                bn_vk_kernel_free(vk, one_row);
            one_row = NULL;
            CHECK(bn_vk_w2a8_kernel(vk, exact_division, dot, &one_row, &err) == BN_OK);
            kernel = one_row;
        }
        exact_total = compared_total = 0;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            /* More rows than a grid column holds (a few seconds a run on
             * lavapipe): the plain variants share the shader's grid
             * unfolding, so the first of them to run and the rows kernel
             * (the tiles' grid stays in one column at this shape). */
            const bool folds = shapes[i][0] > 65535 * 8;
            if (folds && (tiled || (!rows_kernel && folding_checked)))
                continue;
            folding_checked |= folds;
            check_shape(vk, kernel, exact_division, shapes[i][0], shapes[i][1]);
        }
        for (int i = 0; i < 6; i++)
            check_shape(vk, kernel, exact_division, test_rand_range(1, 300),
                        test_rand_range(1, 3000));
        static const int64_t row_counts[] = {1, 8, 13, 21, 70, 131};
        for (size_t i = 0; i < sizeof row_counts / sizeof row_counts[0] - (tiled ? 0 : 2); i++)
            check_rows(vk, kernel, one_row, test_rand_range(1, 300), test_rand_range(1, 700), 3,
                       row_counts[i]);
        check_epilogues(vk, kernel, test_rand_range(1, 300), test_rand_range(1, 3000), 1);
        check_epilogues(vk, kernel, test_rand_range(1, 300), test_rand_range(1, 700), 5);
        check_qkv(vk, kernel, 20, 5, 128, 128, 2560, 1);  /* the 2B-4T heads, a decode row */
        check_qkv(vk, kernel, 4, 2, 16, 16, 64, 5);       /* the fixtures' */
        check_qkv(vk, kernel, 6, 3, 20, 12, 100, 7);      /* values past rope_dim */
        check_qkv(vk, kernel, 3, 1, 10, 0, 33, 3);        /* no rotation */
        if (tiled) {                                      /* more rows than a tile */
            check_epilogues(vk, kernel, test_rand_range(1, 300), test_rand_range(1, 700), 70);
            check_qkv(vk, kernel, 4, 2, 16, 16, 64, 70);
        }
        printf("%s sums, %s division%s: outputs bit-identical to the CPU's: %d of %d\n",
               dot ? "dot-product" : "portable", exact_division ? "exact (fp64)" : "the device's",
               matrix        ? ", tiles of 32 rows on subgroup matrix products"
               : tiled       ? ", tiles of 32 rows"
               : rows_kernel ? ", eight rows a workgroup"
                             : "",
               exact_total, compared_total);
    }
    const uint32_t *shape = bn_vk_device(vk)->int8_matrix;
    if (matrix_ok) {
        printf("int8 subgroup matrix products: %u x %u x %u\n", shape[0], shape[1], shape[2]);
    } else {
        bn_vk_kernel *none = NULL;
        CHECK(bn_vk_w2a8_matrix_kernel(vk, &none, &err) == BN_ERR_UNSUPPORTED && !none);
        CHECK_STR_CONTAINS(err.message, "matrix");
        printf("int8 subgroup matrix products: not on this device (the matrix kernel refused)\n");
    }
    if (!fp64) {
        bn_vk_kernel *none = NULL;
        CHECK(bn_vk_w2a8_kernel(vk, true, false, &none, &err) == BN_ERR_UNSUPPORTED && !none);
    }
    if (!dot_ok) {
        bn_vk_kernel *none = NULL;
        CHECK(bn_vk_w2a8_kernel(vk, false, true, &none, &err) == BN_ERR_UNSUPPORTED && !none);
        CHECK_STR_CONTAINS(err.message, "dot products");
    }
    if (!rows_ok) {
        bn_vk_kernel *none = NULL;
        CHECK(bn_vk_w2a8_rows_kernel(vk, &none, &err) == BN_ERR_UNSUPPORTED && !none);
        CHECK(bn_vk_w2a8_tiles_kernel(vk, &none, &err) == BN_ERR_UNSUPPORTED && !none);
    }

    /* A sequence of three products recorded into one command buffer: each
     * equal, bit for bit, to its own run. The third reads the first's output
     * as its weights' words, so the barrier between them must hold. */
    {
        const int64_t n = 48, k = 256;
        const size_t words = bn_vk_w2a8_words(k);
        int8_t *codes = malloc((size_t)(n * k)), *xq = calloc(words * 16, 1);
        uint32_t *packed = malloc((size_t)n * words * 4);
        float alone[3][48], seq[3][48];
        CHECK(codes && xq && packed);
        for (int64_t i = 0; i < n * k; i++)
            codes[i] = (int8_t)test_rand_range(-1, 1);
        for (int64_t i = 0; i < k; i++)
            xq[i] = (int8_t)test_rand_range(-127, 127);
        bn_vk_w2a8_pack(codes, n, k, packed);
        bn_vk_buffer w, xb, y[3];
        CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)n * words * 4, &w, &err) == BN_OK);
        CHECK(bn_vk_buffer_create(vk, words * 16, &xb, &err) == BN_OK);
        for (int i = 0; i < 3; i++)
            CHECK(bn_vk_buffer_create(vk, (VkDeviceSize)n * words * 4, &y[i], &err) == BN_OK);
        CHECK(bn_vk_write(vk, &w, packed, (size_t)n * words * 4, &err) == BN_OK);
        CHECK(bn_vk_write(vk, &xb, xq, words * 16, &err) == BN_OK);
        /* Alone: y0 = W x, y1 = W x scaled, y2 = (y0's bits as weights) x. */
        bn_vk_buffer one = scale_buffer(vk, 1.0f), three = scale_buffer(vk, 3.0f);
        CHECK(test_vk_w2a8_matvec(vk, kernel, &w, &xb, &one, 0, &y[0], n, k, 1.0f, &err) == BN_OK);
        CHECK(test_vk_w2a8_matvec(vk, kernel, &w, &xb, &three, 0, &y[1], n, k, 0.5f, &err) ==
              BN_OK);
        CHECK(test_vk_w2a8_matvec(vk, kernel, &y[0], &xb, &one, 0, &y[2], 1, 16, 1.0f, &err) ==
              BN_OK);
        for (int i = 0; i < 3; i++)
            CHECK(bn_vk_read(vk, &y[i], alone[i], sizeof alone[i], &err) == BN_OK);
        const float nan_row[48] = {NAN};
        for (int i = 0; i < 3; i++)
            CHECK(bn_vk_write(vk, &y[i], nan_row, sizeof nan_row, &err) == BN_OK);
        CHECK(bn_vk_begin(vk, &err) == BN_OK);
        CHECK(test_vk_w2a8_record(vk, kernel, &w, &xb, &one, 0, &y[0], n, k, 1.0f, &err) == BN_OK);
        CHECK(test_vk_w2a8_record(vk, kernel, &w, &xb, &three, 0, &y[1], n, k, 0.5f, &err) ==
              BN_OK);
        CHECK(test_vk_w2a8_record(vk, kernel, &y[0], &xb, &one, 0, &y[2], 1, 16, 1.0f, &err) ==
              BN_OK);
        /* No copy, and no second sequence, while one is open. */
        CHECK(bn_vk_read(vk, &y[0], seq[0], sizeof seq[0], &err) == BN_ERR_INTERNAL);
        CHECK(bn_vk_begin(vk, &err) == BN_ERR_INTERNAL);
        CHECK(bn_vk_submit(vk, &err) == BN_OK);
        CHECK(bn_vk_submit(vk, &err) == BN_ERR_INTERNAL);
        for (int i = 0; i < 3; i++) {
            CHECK(bn_vk_read(vk, &y[i], seq[i], sizeof seq[i], &err) == BN_OK);
            const int64_t rows = i == 2 ? 1 : n;
            CHECK_MSG(memcmp(seq[i], alone[i], (size_t)rows * sizeof(float)) == 0,
                      "product %d of the sequence differs from its own run", i);
        }

        /* The first product in a kept sequence that copies its activations
         * in from a host buffer and its outputs back out (bn_vk_copy_record,
         * as a decode step runs): the host reads the product alone's
         * outputs; replayed with other activations written into the host
         * buffer, that product's. xb and y[0] poisoned before each run. */
        const size_t xbytes = words * 16, ybytes = (size_t)n * sizeof(float);
        int8_t *xq2 = malloc(xbytes), *junk = malloc(xbytes);
        float alone2[48];
        CHECK(xq2 && junk);
        for (size_t i = 0; i < xbytes; i++) {
            xq2[i] = (int8_t)(i < (size_t)k ? test_rand_range(-127, 127) : 0);
            junk[i] = 127;
        }
        CHECK(bn_vk_write(vk, &xb, xq2, xbytes, &err) == BN_OK);
        CHECK(test_vk_w2a8_matvec(vk, kernel, &w, &xb, &one, 0, &y[1], n, k, 1.0f, &err) == BN_OK);
        CHECK(bn_vk_read(vk, &y[1], alone2, ybytes, &err) == BN_OK);
        bn_vk_buffer io;
        void *map = NULL;
        CHECK(bn_vk_host_buffer_create(vk, xbytes + ybytes, &io, &map, &err) == BN_OK && map);
        char *io_bytes = map;
        memcpy(io_bytes, xq, xbytes);
        memset(io_bytes + xbytes, 0xff, ybytes); /* NaN */
        CHECK(bn_vk_write(vk, &xb, junk, xbytes, &err) == BN_OK);
        CHECK(bn_vk_write(vk, &y[0], nan_row, sizeof nan_row, &err) == BN_OK);
        CHECK(bn_vk_begin(vk, &err) == BN_OK);
        CHECK(bn_vk_copy_record(vk, &io, 0, &xb, 0, xbytes, &err) == BN_OK);
        CHECK(test_vk_w2a8_record(vk, kernel, &w, &xb, &one, 0, &y[0], n, k, 1.0f, &err) == BN_OK);
        CHECK(bn_vk_copy_record(vk, &y[0], 0, &io, xbytes, ybytes, &err) == BN_OK);
        CHECK(bn_vk_copy_record(vk, &y[0], 0, &io, xbytes + 4, ybytes, &err) ==
              BN_ERR_INVALID_ARGUMENT); /* past the host buffer's end */
        bn_vk_kept *kept = NULL;
        CHECK(bn_vk_submit_keep(vk, &kept, &err) == BN_OK && kept);
        CHECK_MSG(memcmp(io_bytes + xbytes, alone[0], ybytes) == 0,
                  "a product between copies from and to a host buffer differs from its own run");
        memcpy(io_bytes, xq2, xbytes);
        memset(io_bytes + xbytes, 0xff, ybytes);
        CHECK(bn_vk_write(vk, &xb, junk, xbytes, &err) == BN_OK);
        CHECK(kept && bn_vk_replay(vk, kept, &err) == BN_OK);
        CHECK_MSG(memcmp(io_bytes + xbytes, alone2, ybytes) == 0,
                  "the kept sequence replayed with new inputs differs from their own run");
        CHECK(bn_vk_copy_record(vk, &io, 0, &xb, 0, 4, &err) == BN_ERR_INTERNAL); /* no sequence */
        bn_vk_kept_free(vk, kept);
        bn_vk_buffer_free(vk, &io);
        free(xq2);
        free(junk);
        bn_vk_buffer_free(vk, &w);
        bn_vk_buffer_free(vk, &xb);
        for (int i = 0; i < 3; i++)
            bn_vk_buffer_free(vk, &y[i]);
        bn_vk_buffer_free(vk, &one);
        bn_vk_buffer_free(vk, &three);
        free(codes);
        free(xq);
        free(packed);
    }

    /* Errors. */
    bn_vk *none = NULL;
    CHECK(bn_vk_open(n_dev, &none, &err) == BN_ERR_NO_DEVICE && none == NULL);
    CHECK_STR_CONTAINS(err.message, "no device");
    bn_vk_buffer huge;
    const bn_status st = bn_vk_buffer_create(vk, (VkDeviceSize)1 << 50, &huge, &err);
    CHECK_MSG(st == BN_ERR_GPU_OUT_OF_MEMORY, "a 1 PiB buffer: status %d (%s)", (int)st,
              err.message);
    bn_vk_buffer small;
    CHECK(bn_vk_buffer_create(vk, 64, &small, &err) == BN_OK);
    CHECK(test_vk_w2a8_matvec(vk, kernel, &small, &small, &small, 0, &small, 100, 100, 1.0f,
                            &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(test_vk_w2a8_matvec(vk, kernel, &small, &small, &small, 9, &small, 1, 16, 1.0f, &err) ==
          BN_ERR_INVALID_ARGUMENT); /* an activation row past the buffers */
    CHECK(bn_vk_dispatch(vk, kernel, (bn_vk_buffer *const[]){&small, &small, &small, &small},
                         NULL, 1, 1, &err) == BN_ERR_INTERNAL); /* outside a sequence */
    bn_vk_buffer_free(vk, &small);

    if (one_row != kernel)
        bn_vk_kernel_free(vk, one_row);
    bn_vk_kernel_free(vk, kernel);
    bn_vk_close(vk);
    TEST_EXIT();
}
