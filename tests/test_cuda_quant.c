/* GPU test: ternary weight quantization on the GPU (quant_kernels.cu) and
 * the device quantizer's CUDA table (quant_gpu_ops.c).
 *
 *   absmean + codes  scale equal to bn_quantize_weights_absmean's, or (if
 *                    the blocked double sum rounds the float mean the other
 *                    way: never seen, but allowed) one ulp away; codes equal
 *                    when the scales are equal, else differing only where
 *                    |w * q| is within 2 ulp of 0.5
 *   packers          bytes equal to the CPU packers of the same codes and
 *                    scale (I2_S, TQ2_0, TL1 and TL2 with random tilings),
 *                    on a poisoned output
 *   device quantizer GPU operations counted, unsupported types fall back
 *                    (counted), results identical to the CPU path
 *
 * Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>

#include "device_quantizer.h"
#include "fmt_bitnet.h"
#include "fmt_dense.h"
#include "fmt_tl.h"
#include "fmt_tq.h"
#include "fp16.h"
#include "quant_cuda.h"
#include "quant_rules.h"
#include "test_util.h"
#include "test_util_cuda.h"
#include "w2a8.h"

static int scale_differences; /* GPU means rounded differently from the CPU's */

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

static bool same_value(float a, float b) { return same_bits(a, b) || (isnan(a) && isnan(b)); }

static void *dev_upload(const void *host, size_t bytes)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    CUDA_OK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void *dev_poisoned(size_t bytes, int byte)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    CUDA_OK(cudaMemset(p, byte, bytes));
    return p;
}

static void *host_download(const void *dev, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(p, dev, bytes, cudaMemcpyDeviceToHost));
    return p;
}

/* The multiplier q the CPU rule uses (bn_quantize_weights_absmean keeps it
 * internal): needed to tell a near-tie from a real difference. */
static float cpu_q(const float *w, size_t n)
{
    double total = 0.0;
    for (size_t i = 0; i < n; i++)
        total += fabs((double)w[i]);
    float mean = n ? (float)(total / (double)n) : 0.0f;
    if (!(mean >= BN_QUANT_EPS))
        mean = BN_QUANT_EPS;
    return 1.0f / mean;
}

/* True when the codes agree, or the scales differ by one ulp and every
 * differing code sits at a near-tie |w * q| ~ 0.5. */
static bool codes_agree(const float *w, size_t n, const int8_t *gpu, const int8_t *cpu,
                        float gpu_scale, float cpu_scale, const char *what)
{
    if (same_bits(gpu_scale, cpu_scale))
        return memcmp(gpu, cpu, n) == 0;
    const uint32_t a = bits_of(gpu_scale), b = bits_of(cpu_scale);
    if ((a > b ? a - b : b - a) != 1) {
        fprintf(stderr, "%s: scale %.9g (GPU) vs %.9g (CPU): more than one ulp apart\n", what,
                (double)gpu_scale, (double)cpu_scale);
        return false;
    }
    scale_differences++;
    const float q = cpu_q(w, n);
    for (size_t i = 0; i < n; i++)
        if (gpu[i] != cpu[i] && !(fabsf(fabsf(w[i] * q) - 0.5f) <= 2.0f * 5.96e-8f)) {
            fprintf(stderr, "%s: code %zu differs (%d vs %d) away from a tie (|w q| = %.9g)\n",
                    what, i, gpu[i], cpu[i], (double)fabsf(w[i] * q));
            return false;
        }
    return true;
}

/* ---- absmean and codes ----------------------------------------------------------- */

enum { W_UNIFORM, W_BELL, W_TIES, W_NAN, W_INF, W_TINY, W_KINDS };

static void fill_weights(float *w, int64_t n, int kind)
{
    const float range = test_rand_float(1e-3f, 4.0f);
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case W_BELL: /* sum of uniforms: most weights near 0, like real ones */
            w[i] = (test_rand_float(-1, 1) + test_rand_float(-1, 1) + test_rand_float(-1, 1)) *
                   range;
            break;
        case W_TIES: /* |w| in {0.5, 1.5} half and half: mean exactly 1, so
                      * w * q hits 0.5 and 1.5 exactly (0.5 rounds to 0) */
            w[i] = (i % 2 ? 0.5f : 1.5f) * (test_rand_range(0, 1) ? 1.0f : -1.0f);
            break;
        case W_TINY:
            w[i] = test_rand_float(-1e-6f, 1e-6f);
            break;
        default:
            w[i] = test_rand_float(-range, range);
            break;
        }
    }
    if (kind == W_TIES && n % 2)
        w[n - 1] = 0.0f; /* the unpaired 1.5 goes: the mean is (n-1)/n, no exact ties */
    if (kind == W_NAN)
        w[test_rand_range(0, n - 1)] = NAN;
    if (kind == W_INF)
        w[test_rand_range(0, n - 1)] = test_rand_range(0, 1) ? INFINITY : -INFINITY;
}

static void check_absmean(int64_t n, int kind)
{
    float *w = malloc(sizeof(float) * (size_t)n);
    fill_weights(w, n, kind);
    float *d_w = dev_upload(w, sizeof(float) * (size_t)n);
    void *d_work = dev_poisoned(bn_cuda_absmean_workspace_bytes(n), 0xff);
    float *d_qs = dev_poisoned(2 * sizeof(float), 0xff);
    int8_t *d_codes = dev_poisoned((size_t)n, 0x7f);
    CUDA_OK(bn_cuda_absmean(d_w, n, d_work, d_qs, 0));
    CUDA_OK(bn_cuda_ternary_codes(d_w, n, d_qs, d_codes, 0));
    float *qs = host_download(d_qs, 2 * sizeof(float));
    int8_t *codes = host_download(d_codes, (size_t)n);

    int8_t *ref = malloc((size_t)n);
    float scale;
    bn_quantize_weights_absmean(w, (size_t)n, ref, &scale);
    char what[96];
    snprintf(what, sizeof what, "absmean n=%lld kind=%d", (long long)n, kind);
    CHECK_MSG(codes_agree(w, (size_t)n, codes, ref, qs[1], scale, what), "%s: codes differ", what);
    if (same_bits(qs[1], scale))
        CHECK_MSG(same_bits(qs[0], cpu_q(w, (size_t)n)), "%s: q differs from 1/mean", what);
    if (kind == W_TIES && n % 2 == 0)
        CHECK_MSG(qs[0] == 1.0f && qs[1] == 1.0f, "%s: mean of the tie set is not 1 (q %g)", what,
                  (double)qs[0]);

    CUDA_OK(cudaFree(d_w));
    CUDA_OK(cudaFree(d_work));
    CUDA_OK(cudaFree(d_qs));
    CUDA_OK(cudaFree(d_codes));
    free(w);
    free(qs);
    free(codes);
    free(ref);
}

/* ---- packers ------------------------------------------------------------------------ */

/* Random ternary codes; with zero_blocks, some 256-code runs are all zero. */
static int8_t *random_codes(int64_t n, bool zero_blocks)
{
    int8_t *c = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++)
        c[i] = (int8_t)test_rand_range(-1, 1);
    if (zero_blocks)
        for (int64_t b = 0; b + 256 <= n; b += 256)
            if (test_rand_range(0, 3) == 0)
                memset(c + b, 0, 256);
    return c;
}

/* Packs codes on the GPU (into a poisoned buffer) and on the CPU; compares. */
static void check_pack(bn_qtype type, int64_t rows, int64_t cols, const bn_tl_tiling *tiling)
{
    size_t bytes;
    if (type == BN_QTYPE_TL1)
        bytes = bn_tl1_tensor_bytes(rows, cols);
    else if (type == BN_QTYPE_TL2)
        bytes = bn_tl2_tensor_bytes(rows, cols);
    else
        CHECK(bn_qtype_tensor_size(type, rows, cols, &bytes, NULL) == BN_OK);
    const int64_t n = rows * cols;
    int8_t *codes = random_codes(n, type == BN_QTYPE_TQ2_0);
    const float scale = test_rand_float(1e-3f, 3.0f);

    uint8_t *want = malloc(bytes);
    memset(want, 0x3c, bytes);
    bn_status st;
    if (type == BN_QTYPE_TL1)
        st = bn_pack_tl1_tiled(codes, rows, cols, tiling, want, NULL);
    else if (type == BN_QTYPE_TL2)
        st = bn_pack_tl2_tiled(codes, rows, cols, tiling, want, NULL);
    else
        st = bn_qtype_get(type)->pack(codes, scale, rows, cols, want, NULL);
    CHECK(st == BN_OK);

    int8_t *d_codes = dev_upload(codes, (size_t)n);
    uint8_t *d_out = dev_poisoned(bytes, 0xa5);
    switch (type) {
    case BN_QTYPE_I2_S: CUDA_OK(bn_cuda_pack_i2s(d_codes, rows, cols, scale, d_out, 0)); break;
    case BN_QTYPE_TQ2_0: CUDA_OK(bn_cuda_pack_tq2_0(d_codes, rows, cols, scale, d_out, 0)); break;
    case BN_QTYPE_TL1: CUDA_OK(bn_cuda_pack_tl1(d_codes, rows, cols, tiling, d_out, 0)); break;
    default: CUDA_OK(bn_cuda_pack_tl2(d_codes, rows, cols, tiling, d_out, 0)); break;
    }
    uint8_t *got = host_download(d_out, bytes);
    size_t first = bytes;
    for (size_t i = 0; i < bytes && first == bytes; i++)
        if (got[i] != want[i])
            first = i;
    CHECK_MSG(first == bytes,
              "pack %s %lld x %lld (BM %d BK %d bm %d): byte %zu of %zu is 0x%02x, CPU 0x%02x",
              bn_qtype_get(type)->name, (long long)rows, (long long)cols,
              tiling ? tiling->block_rows : 0, tiling ? tiling->block_cols : 0,
              tiling ? tiling->compute_rows : 0, first, bytes, first < bytes ? got[first] : 0,
              first < bytes ? want[first] : 0);
    CUDA_OK(cudaFree(d_codes));
    CUDA_OK(cudaFree(d_out));
    free(codes);
    free(want);
    free(got);
}

static void check_pack_tl_for_shape(bn_qtype type, int64_t rows, int64_t cols)
{
    bn_tl_tiling t;
    bn_error err;
    const bn_status st = bn_tl_tiling_for_shape(type, rows, cols, &t, &err);
    CHECK_MSG(st == BN_OK, "no %s tiling for %lld x %lld: %s", bn_qtype_get(type)->name,
              (long long)rows, (long long)cols, err.message);
    if (st == BN_OK)
        check_pack(type, rows, cols, &t);
}

static void check_pack_tl1_random(void)
{
    bn_tl_tiling t;
    t.compute_rows = test_rand_range(0, 1) ? 32 : 64;
    const int by = 256 / t.compute_rows;
    t.block_cols = by * (int)test_rand_range(1, 4);
    t.block_rows = t.compute_rows * (int)test_rand_range(1, 4);
    const int64_t rows = t.block_rows * test_rand_range(1, 3);
    const int64_t cols = t.block_cols * test_rand_range(1, 4);
    CHECK(bn_tl_tiling_check(BN_QTYPE_TL1, rows, cols, &t, NULL) == BN_OK);
    check_pack(BN_QTYPE_TL1, rows, cols, &t);
}

static void check_pack_tl2_random(void)
{
    for (int tries = 0; tries < 1000; tries++) {
        bn_tl_tiling t = {32 * (int)test_rand_range(1, 4), 24 * (int)test_rand_range(1, 8), 32};
        const int64_t max_tail = (t.block_cols - 1) / 32 < 8 ? (t.block_cols - 1) / 32 : 8;
        const int64_t rows = t.block_rows * test_rand_range(1, 3);
        const int64_t cols = t.block_cols * test_rand_range(0, 12) + 32 * test_rand_range(0, max_tail);
        if (cols < 256 || bn_tl_tiling_check(BN_QTYPE_TL2, rows, cols, &t, NULL) != BN_OK)
            continue;
        check_pack(BN_QTYPE_TL2, rows, cols, &t);
        return;
    }
    CHECK_MSG(false, "found no valid random TL2 tiling");
}

/* ---- I2_S dequantization ------------------------------------------------------------- */

static void check_dequantize_i2s(int64_t rows, int64_t cols)
{
    const int64_t n = rows * cols;
    int8_t *codes = random_codes(n, false);
    const float scale = test_rand_float(-2.0f, 2.0f); /* negative: 0 * scale is -0 */
    const size_t bytes = bn_i2s_tensor_bytes(rows, cols);
    uint8_t *packed = malloc(bytes);
    CHECK(bn_pack_i2s(codes, scale, rows, cols, packed, NULL) == BN_OK);
    float *want = malloc(sizeof(float) * (size_t)n);
    CHECK(bn_dequantize_tensor(BN_QTYPE_I2_S, packed, bytes, rows, cols, want, NULL) == BN_OK);

    uint8_t *d_src = dev_upload(packed, bytes);
    float *d_y = dev_poisoned(sizeof(float) * (size_t)n, 0xff);
    int *d_bad = dev_poisoned(sizeof(int), 0);
    CUDA_OK(bn_cuda_dequantize_i2s(d_src, rows, cols, scale, d_y, d_bad, 0));
    float *y = host_download(d_y, sizeof(float) * (size_t)n);
    int *bad = host_download(d_bad, sizeof(int));
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++)
        differ += !same_bits(y[i], want[i]);
    CHECK_MSG(differ == 0 && *bad == 0, "dequantize i2_s %lld x %lld: %lld values differ",
              (long long)rows, (long long)cols, (long long)differ);

    /* A code 3 is flagged. */
    packed[test_rand_range(0, n / 4 - 1)] |= 0x30;
    CUDA_OK(cudaMemcpy(d_src, packed, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(bn_cuda_dequantize_i2s(d_src, rows, cols, scale, d_y, d_bad, 0));
    free(bad);
    bad = host_download(d_bad, sizeof(int));
    CHECK_MSG(*bad == 1, "dequantize i2_s: code 3 not flagged");

    CUDA_OK(cudaFree(d_src));
    CUDA_OK(cudaFree(d_y));
    CUDA_OK(cudaFree(d_bad));
    free(codes);
    free(packed);
    free(want);
    free(y);
    free(bad);
}

/* ---- the device quantizer -------------------------------------------------------------- */

static bn_config config(const char *device, bool strict)
{
    bn_config c;
    bn_config_defaults(&c);
    CHECK(bn_parse_device_request(device, &c.device));
    c.strict_mode = strict;
    return c;
}

/* Weights through the quantizer (GPU) and through the CPU rule + packer. */
static void dq_weights(bn_device_quantizer *q, bn_qtype type, int64_t rows, int64_t cols)
{
    const bn_qtype_info *info = bn_qtype_get(type);
    size_t bytes;
    CHECK(bn_qtype_tensor_size(type, rows, cols, &bytes, NULL) == BN_OK);
    const size_t n = (size_t)(rows * cols);
    float *w = malloc(sizeof(float) * n);
    fill_weights(w, (int64_t)n, test_rand_range(0, 1) ? W_UNIFORM : W_BELL);
    uint8_t *got = malloc(bytes), *want = malloc(bytes);
    memset(got, 0xa5, bytes);
    memset(want, 0x5a, bytes);
    float got_scale = 0.0f, want_scale;
    bn_error err;
    bn_error_clear(&err);
    CHECK_MSG(bn_dq_quantize_weights(q, type, w, rows, cols, got, &got_scale, &err) == BN_OK,
              "quantize %s %lld x %lld: %s", info->name, (long long)rows, (long long)cols,
              err.message);
    int8_t *codes = malloc(n);
    bn_quantize_weights_absmean(w, n, codes, &want_scale);
    CHECK(info->pack(codes, want_scale, rows, cols, want, NULL) == BN_OK);
    if (same_bits(got_scale, want_scale)) {
        CHECK_MSG(memcmp(got, want, bytes) == 0, "quantize %s %lld x %lld: bytes differ",
                  info->name, (long long)rows, (long long)cols);
    } else {
        /* Compare the codes with the near-tie rule. */
        int8_t *got_codes = malloc(n);
        float unpacked_scale;
        CHECK(info->unpack(got, bytes, rows, cols, got_codes, &unpacked_scale, NULL) == BN_OK);
        CHECK(codes_agree(w, n, got_codes, codes, got_scale, want_scale, info->name));
        free(got_codes);
    }
    free(w);
    free(got);
    free(want);
    free(codes);
}

static void dq_dequantize(bn_device_quantizer *q, bn_qtype type, int64_t rows, int64_t cols)
{
    const bn_qtype_info *info = bn_qtype_get(type);
    size_t bytes;
    CHECK(bn_qtype_tensor_size(type, rows, cols, &bytes, NULL) == BN_OK);
    const size_t n = (size_t)(rows * cols);
    uint8_t *src = malloc(bytes);
    if (info->ternary) {
        int8_t *codes = random_codes((int64_t)n, true);
        CHECK(info->pack(codes, test_rand_float(0.01f, 2.0f), rows, cols, src, NULL) == BN_OK);
        free(codes);
    } else if (info->quantize_row) {
        float *row = malloc(sizeof(float) * (size_t)cols);
        const size_t row_bytes = bytes / (size_t)rows;
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++)
                row[c] = test_rand_float(-3.0f, 3.0f);
            info->quantize_row(row, src + (size_t)r * row_bytes, cols);
        }
        free(row);
    } else { /* Q4_K / Q6_K: random quants, realistic fp16 scales */
        for (size_t i = 0; i < bytes; i++)
            src[i] = (uint8_t)test_rand_u64();
        for (size_t b = 0; b < bytes / (size_t)info->block_bytes; b++) {
            uint8_t *blk = src + b * (size_t)info->block_bytes;
            const size_t at = type == BN_QTYPE_Q4_K ? 0 : (size_t)info->block_bytes - 2;
            const uint16_t d = bn_fp32_to_fp16(test_rand_float(1e-4f, 0.05f));
            blk[at] = (uint8_t)(d & 0xff);
            blk[at + 1] = (uint8_t)(d >> 8);
            if (type == BN_QTYPE_Q4_K) {
                const uint16_t dmin = bn_fp32_to_fp16(test_rand_float(1e-4f, 0.05f));
                blk[2] = (uint8_t)(dmin & 0xff);
                blk[3] = (uint8_t)(dmin >> 8);
            }
        }
    }
    float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    memset(got, 0xff, sizeof(float) * n);
    bn_error err;
    bn_error_clear(&err);
    CHECK_MSG(bn_dq_dequantize(q, type, src, bytes, rows, cols, got, &err) == BN_OK,
              "dequantize %s: %s", info->name, err.message);
    CHECK(bn_dequantize_tensor(type, src, bytes, rows, cols, want, NULL) == BN_OK);
    int64_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += !same_value(got[i], want[i]);
    CHECK_MSG(differ == 0, "dequantize %s %lld x %lld: %lld values differ", info->name,
              (long long)rows, (long long)cols, (long long)differ);
    free(src);
    free(got);
    free(want);
}

static void dq_activations(bn_device_quantizer *q, int64_t m, int64_t k)
{
    const int64_t ldx = k + test_rand_range(0, 9);
    float *x = malloc(sizeof(float) * (size_t)(m * ldx));
    const float range = test_rand_float(0.05f, 20.0f);
    for (int64_t i = 0; i < m * ldx; i++)
        x[i] = test_rand_float(-range, range);
    x[test_rand_range(0, k - 1)] = NAN;
    bn_q8_rows got, want;
    CHECK(bn_q8_rows_alloc(&got, m, k, NULL) == BN_OK);
    CHECK(bn_q8_rows_alloc(&want, m, k, NULL) == BN_OK);
    memset(got.q, 0x5a, (size_t)(m * got.lda)); /* padding must stay as it was */
    memset(want.q, 0x5a, (size_t)(m * want.lda));
    bn_error err;
    bn_error_clear(&err);
    CHECK_MSG(bn_dq_quantize_activations(q, x, m, k, ldx, &got, &err) == BN_OK,
              "quantize activations: %s", err.message);
    for (int64_t i = 0; i < m; i++)
        bn_quantize_activations_row(x + i * ldx, k, want.q + i * want.lda, &want.scale[i],
                                    &want.sum[i]);
    CHECK_MSG(memcmp(got.q, want.q, (size_t)(m * got.lda)) == 0 &&
                  memcmp(got.scale, want.scale, sizeof(float) * (size_t)m) == 0 &&
                  memcmp(got.sum, want.sum, sizeof(int32_t) * (size_t)m) == 0,
              "quantize activations m=%lld k=%lld: results differ from the CPU", (long long)m,
              (long long)k);
    bn_q8_rows_free(&got);
    bn_q8_rows_free(&want);
    free(x);
}

static void check_device_quantizer(void)
{
    const bn_gpu_quant_ops *ops = bn_cuda_quant_ops();
    CHECK_MSG(ops != NULL, "bn_cuda_quant_ops() is NULL although a GPU is usable");
    if (!ops)
        return;
    CHECK(bn_cuda_quant_ops() == ops);

    bn_device_quantizer q;
    bn_config c = config("cuda", false);
    CHECK(bn_device_quantizer_init(&q, &c, ops, NULL) == BN_OK);
    CHECK(q.prefer_gpu);

    /* Everything the GPU supports runs there. */
    uint64_t expect_gpu = 0;
    const struct { bn_qtype type; int64_t rows, cols; } weights[] = {
        {BN_QTYPE_I2_S, 40, 384},   {BN_QTYPE_I2_S, 640, 2560},  {BN_QTYPE_TQ2_0, 24, 512},
        {BN_QTYPE_TQ2_0, 640, 2560}, {BN_QTYPE_TL1, 64, 256},    {BN_QTYPE_TL1, 640, 2560},
        {BN_QTYPE_TL2, 64, 320},    {BN_QTYPE_TL2, 640, 2560},
    };
    for (size_t i = 0; i < sizeof weights / sizeof weights[0]; i++, expect_gpu++)
        dq_weights(&q, weights[i].type, weights[i].rows, weights[i].cols);
    for (int i = 0; i < 4; i++, expect_gpu++)
        dq_activations(&q, test_rand_range(1, 9), test_rand_range(1, 3000));
    const struct { bn_qtype type; int64_t rows, cols; } deq[] = {
        {BN_QTYPE_I2_S, 12, 256},  {BN_QTYPE_TQ2_0, 7, 512}, {BN_QTYPE_F32, 5, 77},
        {BN_QTYPE_F16, 9, 130},    {BN_QTYPE_BF16, 3, 64},   {BN_QTYPE_Q8_0, 6, 96},
        {BN_QTYPE_Q4_K, 4, 512},   {BN_QTYPE_Q6_K, 5, 768},
    };
    for (size_t i = 0; i < sizeof deq / sizeof deq[0]; i++, expect_gpu++)
        dq_dequantize(&q, deq[i].type, deq[i].rows, deq[i].cols);
    bn_device_stats s = bn_dq_stats(&q);
    CHECK_MSG(s.gpu_ops == expect_gpu && s.cpu_ops == 0 && s.fallbacks == 0 && s.errors == 0,
              "stats: %llu GPU ops (want %llu), %llu CPU, %llu fallbacks, %llu errors (%s)",
              (unsigned long long)s.gpu_ops, (unsigned long long)expect_gpu,
              (unsigned long long)s.cpu_ops, (unsigned long long)s.fallbacks,
              (unsigned long long)s.errors, s.last_gpu_error);

    /* Unsupported on the GPU: the CPU runs, a fallback is counted, the
     * result is the CPU's. */
    bn_dq_reset_stats(&q);
    dq_weights(&q, BN_QTYPE_TQ1_0, 8, 512);
    dq_dequantize(&q, BN_QTYPE_TL1, 64, 256);
    dq_dequantize(&q, BN_QTYPE_TQ1_0, 4, 256);
    s = bn_dq_stats(&q);
    CHECK_MSG(s.gpu_ops == 0 && s.cpu_ops == 3 && s.fallbacks == 3 && s.errors == 0,
              "fallback stats: %llu GPU, %llu CPU, %llu fallbacks, %llu errors",
              (unsigned long long)s.gpu_ops, (unsigned long long)s.cpu_ops,
              (unsigned long long)s.fallbacks, (unsigned long long)s.errors);
    CHECK_STR_CONTAINS(s.last_gpu_error, "does not dequantize");

    /* A corrupt I2_S tensor: the GPU notices, the CPU reports the error. */
    bn_dq_reset_stats(&q);
    {
        const int64_t rows = 4, cols = 128;
        size_t bytes = bn_i2s_tensor_bytes(rows, cols);
        uint8_t *src = calloc(1, bytes);
        int8_t *codes = random_codes(rows * cols, false);
        CHECK(bn_pack_i2s(codes, 0.5f, rows, cols, src, NULL) == BN_OK);
        src[17] |= 0xc0; /* code 3 */
        float *out = malloc(sizeof(float) * (size_t)(rows * cols));
        bn_error err;
        CHECK(bn_dq_dequantize(&q, BN_QTYPE_I2_S, src, bytes, rows, cols, out, &err) ==
              BN_ERR_FORMAT);
        s = bn_dq_stats(&q);
        CHECK(s.fallbacks == 1 && s.errors == 1 && s.gpu_ops == 0);
        free(src);
        free(codes);
        free(out);
    }
    bn_device_quantizer_destroy(&q);

    /* Strict mode: no fallback, the GPU's refusal is the answer. */
    c = config("cuda", true);
    CHECK(bn_device_quantizer_init(&q, &c, ops, NULL) == BN_OK);
    {
        size_t bytes;
        CHECK(bn_qtype_tensor_size(BN_QTYPE_TQ1_0, 2, 256, &bytes, NULL) == BN_OK);
        float w[512];
        fill_weights(w, 512, W_UNIFORM);
        uint8_t *dst = malloc(bytes);
        float scale;
        bn_error err;
        CHECK(bn_dq_quantize_weights(&q, BN_QTYPE_TQ1_0, w, 2, 256, dst, &scale, &err) ==
              BN_ERR_UNSUPPORTED);
        s = bn_dq_stats(&q);
        CHECK(s.errors == 1 && s.fallbacks == 0 && s.cpu_ops == 0);
        free(dst);
    }
    bn_device_quantizer_destroy(&q);
}

int main(void)
{
    test_require_cuda(8, "this build's kernels");

    for (int kind = 0; kind < W_KINDS; kind++)
        for (int iter = 0; iter < 4; iter++)
            check_absmean(test_rand_range(1, 300000), kind);
    check_absmean(2560 * 6912, W_BELL); /* a real FFN matrix */
    check_absmean(8192, W_TIES);
    check_absmean(8193 * 2, W_TIES);

    for (int iter = 0; iter < 10; iter++) {
        check_pack(BN_QTYPE_I2_S, test_rand_range(1, 64), 128 * test_rand_range(1, 16), NULL);
        check_pack(BN_QTYPE_TQ2_0, test_rand_range(1, 32), 256 * test_rand_range(1, 8), NULL);
        check_pack_tl1_random();
        check_pack_tl2_random();
    }
    check_pack_tl_for_shape(BN_QTYPE_TL1, 64, 128);
    check_pack_tl_for_shape(BN_QTYPE_TL1, 1536, 1536); /* bitnet.cpp's bm = 64 setting */
    check_pack_tl_for_shape(BN_QTYPE_TL1, 640, 2560);
    check_pack_tl_for_shape(BN_QTYPE_TL2, 32, 288);
    check_pack_tl_for_shape(BN_QTYPE_TL2, 64, 320);
    check_pack_tl_for_shape(BN_QTYPE_TL2, 1536, 1536); /* BK = 192 */
    check_pack_tl_for_shape(BN_QTYPE_TL2, 640, 2560);  /* a 64-column tail */

    for (int iter = 0; iter < 5; iter++)
        check_dequantize_i2s(test_rand_range(1, 40), 128 * test_rand_range(1, 10));

    check_device_quantizer();
    if (scale_differences)
        printf("note: %d tensors had a GPU mean one ulp from the CPU's (codes checked with the "
               "near-tie rule)\n",
               scale_differences);
    TEST_EXIT();
}
