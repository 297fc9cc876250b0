/* The device-aware quantizer: CPU results equal the direct functions, a
 * working GPU table is used and counted, a failing one falls back (or
 * errors under strict mode), and the statistics add up. */
#include "device_quantizer.h"
#include "quant_rules.h"
#include "test_util.h"
#include "w2a8.h"

/* A stand-in GPU: computes on the CPU, or fails, as the test says. */
typedef struct fake_gpu {
    bool fail;
    int calls;
} fake_gpu;

static bn_status fake_weights(void *ctx, bn_qtype type, const float *w, int64_t rows,
                              int64_t cols, void *dst, float *scale, bn_error *err)
{
    fake_gpu *g = ctx;
    g->calls++;
    if (g->fail)
        return bn_error_set(err, BN_ERR_GPU, NULL, "fake GPU failure %d", g->calls);
    int8_t *codes = malloc((size_t)(rows * cols));
    bn_quantize_weights_absmean(w, (size_t)(rows * cols), codes, scale);
    bn_status st = bn_qtype_get(type)->pack(codes, *scale, rows, cols, dst, err);
    free(codes);
    return st;
}

static bn_status fake_activations(void *ctx, const float *x, int64_t m, int64_t k, int64_t ldx,
                                  bn_q8_rows *out, bn_error *err)
{
    fake_gpu *g = ctx;
    g->calls++;
    if (g->fail)
        return bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY, NULL, "fake GPU out of memory");
    for (int64_t i = 0; i < m; i++)
        bn_quantize_activations_row(x + i * ldx, k, out->q + i * out->lda, &out->scale[i],
                                    &out->sum[i]);
    return BN_OK;
}

static bn_config config(const char *device, bool strict)
{
    bn_config c;
    bn_config_defaults(&c);
    CHECK(bn_parse_device_request(device, &c.device));
    c.strict_mode = strict;
    return c;
}

enum { ROWS = 8, COLS = 256 };
static float w[ROWS * COLS], x[3 * COLS];

static void test_cpu_only(void)
{
    bn_device_quantizer q;
    bn_config c = config("auto", false);
    CHECK(bn_device_quantizer_init(&q, &c, NULL, NULL) == BN_OK);
    CHECK(!q.prefer_gpu);

    /* Weights: equal to absmean + pack done by hand. */
    size_t bytes;
    CHECK(bn_qtype_tensor_size(BN_QTYPE_I2_S, ROWS, COLS, &bytes, NULL) == BN_OK);
    uint8_t *got = calloc(1, bytes), *want = calloc(1, bytes);
    int8_t codes[ROWS * COLS];
    float scale = 0, want_scale;
    bn_quantize_weights_absmean(w, ROWS * COLS, codes, &want_scale);
    CHECK(bn_qtype_get(BN_QTYPE_I2_S)->pack(codes, want_scale, ROWS, COLS, want, NULL) == BN_OK);
    CHECK(bn_dq_quantize_weights(&q, BN_QTYPE_I2_S, w, ROWS, COLS, got, &scale, NULL) == BN_OK);
    CHECK(memcmp(got, want, bytes) == 0 && scale == want_scale);

    /* Dequantize gives codes * scale. */
    float *back = malloc(sizeof(float) * ROWS * COLS);
    CHECK(bn_dq_dequantize(&q, BN_QTYPE_I2_S, got, bytes, ROWS, COLS, back, NULL) == BN_OK);
    int bad = 0;
    for (int i = 0; i < ROWS * COLS; i++)
        bad += back[i] != (float)codes[i] * scale;
    CHECK(bad == 0);

    /* Activations. */
    bn_q8_rows rows;
    CHECK(bn_q8_rows_alloc(&rows, 3, COLS, NULL) == BN_OK);
    CHECK(bn_dq_quantize_activations(&q, x, 3, COLS, COLS, &rows, NULL) == BN_OK);
    for (int i = 0; i < 3; i++) {
        int8_t ref[COLS];
        float s;
        int32_t sum;
        bn_quantize_activations_row(x + i * COLS, COLS, ref, &s, &sum);
        CHECK(memcmp(ref, rows.q + i * rows.lda, COLS) == 0 && s == rows.scale[i] &&
              sum == rows.sum[i]);
    }

    /* Bad requests are errors and are counted. */
    bn_error e;
    CHECK(bn_dq_quantize_weights(&q, BN_QTYPE_Q8_0, w, ROWS, COLS, got, &scale, &e) ==
          BN_ERR_UNSUPPORTED);
    CHECK(bn_dq_quantize_weights(&q, BN_QTYPE_I2_S, w, ROWS, 100, got, &scale, &e) ==
          BN_ERR_INVALID_ARGUMENT);

    bn_device_stats s = bn_dq_stats(&q);
    CHECK(s.ops[BN_QOP_QUANTIZE_WEIGHTS] == 3 && s.ops[BN_QOP_DEQUANTIZE] == 1 &&
          s.ops[BN_QOP_QUANTIZE_ACTIVATIONS] == 1);
    CHECK(s.cpu_ops == 3 && s.gpu_ops == 0 && s.fallbacks == 0 && s.errors == 2);
    CHECK(s.last_error[0] != '\0');
    CHECK(!bn_device_stats_gpu_effective(&s) && bn_device_stats_gpu_share(&s) == 0.0);
    CHECK(bn_device_stats_average_seconds(&s, BN_QOP_QUANTIZE_WEIGHTS) > 0.0);
    CHECK(s.host_memory_total > 0 && s.host_memory_used > 0);
    char text[1024];
    bn_device_stats_summary(&s, text, sizeof text);
    CHECK_STR_CONTAINS(text, "3 CPU ops");
    CHECK_STR_CONTAINS(text, "quantize_weights");
    bn_dq_reset_stats(&q);
    s = bn_dq_stats(&q);
    CHECK(s.cpu_ops == 0 && s.ops[BN_QOP_QUANTIZE_WEIGHTS] == 0);

    bn_q8_rows_free(&rows);
    free(back);
    free(got);
    free(want);
    bn_device_quantizer_destroy(&q);
}

static void test_gpu_paths(void)
{
    fake_gpu g = {false, 0};
    bn_gpu_quant_ops ops = {"fake", fake_weights, fake_activations, NULL, &g};
    size_t bytes;
    CHECK(bn_qtype_tensor_size(BN_QTYPE_TQ2_0, ROWS, COLS, &bytes, NULL) == BN_OK);
    uint8_t *dst = calloc(1, bytes);
    float scale;
    bn_q8_rows rows;
    CHECK(bn_q8_rows_alloc(&rows, 3, COLS, NULL) == BN_OK);

    /* Working GPU under auto: used, effective. */
    bn_device_quantizer q;
    bn_config c = config("auto", false);
    CHECK(bn_device_quantizer_init(&q, &c, &ops, NULL) == BN_OK && q.prefer_gpu);
    for (int i = 0; i < 9; i++)
        CHECK(bn_dq_quantize_activations(&q, x, 3, COLS, COLS, &rows, NULL) == BN_OK);
    CHECK(bn_dq_quantize_weights(&q, BN_QTYPE_TQ2_0, w, ROWS, COLS, dst, &scale, NULL) == BN_OK);
    /* No GPU dequantize: the CPU does it, a fallback. */
    float *back = malloc(sizeof(float) * ROWS * COLS);
    CHECK(bn_dq_dequantize(&q, BN_QTYPE_TQ2_0, dst, bytes, ROWS, COLS, back, NULL) == BN_OK);
    bn_device_stats s = bn_dq_stats(&q);
    CHECK(g.calls == 10 && s.gpu_ops == 10 && s.cpu_ops == 1 && s.fallbacks == 1);
    CHECK(bn_device_stats_gpu_effective(&s)); /* 10 of 11 > 80 % */
    CHECK_STR_CONTAINS(s.last_gpu_error, "no dequantize");
    bn_device_quantizer_destroy(&q);

    /* Failing GPU: falls back, counts, remembers why. */
    g.fail = true;
    g.calls = 0;
    CHECK(bn_device_quantizer_init(&q, &c, &ops, NULL) == BN_OK);
    CHECK(bn_dq_quantize_activations(&q, x, 3, COLS, COLS, &rows, NULL) == BN_OK);
    CHECK(bn_dq_quantize_weights(&q, BN_QTYPE_TQ2_0, w, ROWS, COLS, dst, &scale, NULL) == BN_OK);
    s = bn_dq_stats(&q);
    CHECK(s.gpu_ops == 0 && s.cpu_ops == 2 && s.fallbacks == 2 && s.errors == 0);
    CHECK_STR_CONTAINS(s.last_gpu_error, "fake GPU failure");
    CHECK(!bn_device_stats_gpu_effective(&s));
    bn_device_quantizer_destroy(&q);

    /* Strict mode: the GPU failure is the caller's error. */
    bn_config strict = config("cuda", true);
    bn_error e;
    CHECK(bn_device_quantizer_init(&q, &strict, &ops, NULL) == BN_OK);
    CHECK(bn_dq_quantize_activations(&q, x, 3, COLS, COLS, &rows, &e) ==
          BN_ERR_GPU_OUT_OF_MEMORY);
    s = bn_dq_stats(&q);
    CHECK(s.errors == 1 && s.fallbacks == 0 && s.cpu_ops == 0);
    bn_device_quantizer_destroy(&q);

    /* A GPU request with no GPU: strict refuses, otherwise CPU with fallbacks. */
    CHECK(bn_device_quantizer_init(&q, &strict, NULL, &e) == BN_ERR_NO_DEVICE);
    bn_config cuda = config("cuda", false);
    CHECK(bn_device_quantizer_init(&q, &cuda, NULL, NULL) == BN_OK);
    CHECK(bn_dq_quantize_activations(&q, x, 3, COLS, COLS, &rows, NULL) == BN_OK);
    s = bn_dq_stats(&q);
    CHECK(s.cpu_ops == 1 && s.fallbacks == 1);
    bn_device_quantizer_destroy(&q);

    bn_q8_rows_free(&rows);
    free(back);
    free(dst);
}

int main(void)
{
    test_seed_init();
    for (int i = 0; i < ROWS * COLS; i++)
        w[i] = test_rand_float(-1.0f, 1.0f);
    for (int i = 0; i < 3 * COLS; i++)
        x[i] = test_rand_float(-4.0f, 4.0f);
    test_cpu_only();
    test_gpu_paths();
    TEST_EXIT();
}
