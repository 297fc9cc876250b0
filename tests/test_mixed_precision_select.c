/* CPU test: the mixed-precision matmul's precision selection on synthetic
 * device records (no GPU needed), names and parsing, and the error bounds the
 * GPU test measures against. */
#include "precision_select.h"
#include "test_util.h"

static bn_cuda_device synthetic(const char *name, int major, int minor)
{
    bn_cuda_device d;
    memset(&d, 0, sizeof d);
    d.id = 3;
    snprintf(d.name, sizeof d.name, "%s", name);
    d.cc_major = major;
    d.cc_minor = minor;
    bn_cuda_device_derive_caps(&d);
    return d;
}

typedef struct expectation {
    const char *name;
    int major, minor;
    bn_precision auto_pick;
    bool fp16_ok, bf16_ok;
} expectation;

static void check_device(const expectation *e)
{
    const bn_cuda_device d = synthetic(e->name, e->major, e->minor);
    bn_precision got = BN_PRECISION_COUNT;
    bn_error err;

    CHECK(bn_precision_select(&d, BN_PRECISION_AUTO, &got, &err) == BN_OK);
    CHECK_MSG(got == e->auto_pick, "%s (%d.%d): auto picked %s, expected %s", e->name,
              e->major, e->minor, bn_precision_name(got), bn_precision_name(e->auto_pick));

    /* FP32 runs everywhere. */
    got = BN_PRECISION_COUNT;
    CHECK(bn_precision_select(&d, BN_PRECISION_FP32, &got, &err) == BN_OK);
    CHECK(got == BN_PRECISION_FP32);

    const struct {
        bn_precision p;
        bool ok;
        const char *needs;
    } explicit_requests[] = {{BN_PRECISION_FP16, e->fp16_ok, "6.1"},
                             {BN_PRECISION_BF16, e->bf16_ok, "8.0"}};
    for (size_t i = 0; i < 2; i++) {
        got = BN_PRECISION_COUNT;
        bn_error_clear(&err);
        const bn_status st = bn_precision_select(&d, explicit_requests[i].p, &got, &err);
        if (explicit_requests[i].ok) {
            CHECK_MSG(st == BN_OK && got == explicit_requests[i].p, "%s: %s refused: %s",
                      e->name, bn_precision_name(explicit_requests[i].p), err.message);
        } else {
            CHECK_MSG(st == BN_ERR_UNSUPPORTED, "%s: %s gave %s, expected unsupported",
                      e->name, bn_precision_name(explicit_requests[i].p), bn_status_str(st));
            CHECK(err.status == BN_ERR_UNSUPPORTED);
            /* The message says what is needed and what the device has. */
            CHECK_STR_CONTAINS(err.message, bn_precision_name(explicit_requests[i].p));
            CHECK_STR_CONTAINS(err.message, explicit_requests[i].needs);
            CHECK_STR_CONTAINS(err.message, e->name);
            char cc[16];
            snprintf(cc, sizeof cc, "%d.%d", e->major, e->minor);
            CHECK_STR_CONTAINS(err.message, cc);
            CHECK_STR_CONTAINS(err.hint, "auto");
        }
    }
}

int main(void)
{
    /* Real devices and the edges of each rule (6.0/6.1, 7.5/8.0). */
    const expectation cases[] = {
        {"NVIDIA H100 80GB HBM3", 9, 0, BN_PRECISION_BF16, true, true},
        {"NVIDIA H200", 9, 0, BN_PRECISION_BF16, true, true},
        {"NVIDIA GeForce RTX 4090", 8, 9, BN_PRECISION_BF16, true, true},
        {"NVIDIA GeForce RTX 3060", 8, 6, BN_PRECISION_BF16, true, true},
        {"NVIDIA A100-SXM4-80GB", 8, 0, BN_PRECISION_BF16, true, true},
        {"Tesla T4", 7, 5, BN_PRECISION_FP16, true, false},
        {"Tesla V100-SXM2-16GB", 7, 0, BN_PRECISION_FP16, true, false},
        {"NVIDIA GeForce GTX 1080", 6, 1, BN_PRECISION_FP16, true, false},
        {"Tesla P100-PCIE-16GB", 6, 0, BN_PRECISION_FP32, false, false},
        {"Tesla K80", 3, 7, BN_PRECISION_FP32, false, false},
        {"NVIDIA B200", 10, 0, BN_PRECISION_BF16, true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_device(&cases[i]);

    /* Bad arguments. */
    bn_error err;
    bn_precision got;
    const bn_cuda_device h100 = synthetic("NVIDIA H100", 9, 0);
    CHECK(bn_precision_select(NULL, BN_PRECISION_AUTO, &got, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_precision_select(&h100, BN_PRECISION_AUTO, NULL, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_precision_select(&h100, BN_PRECISION_COUNT, &got, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_precision_select(&h100, (bn_precision)-1, &got, &err) == BN_ERR_INVALID_ARGUMENT);
    /* A NULL error record is allowed. */
    CHECK(bn_precision_select(&h100, BN_PRECISION_BF16, &got, NULL) == BN_OK);
    const bn_cuda_device p100 = synthetic("Tesla P100", 6, 0);
    CHECK(bn_precision_select(&p100, BN_PRECISION_FP16, &got, NULL) == BN_ERR_UNSUPPORTED);

    /* Names and parsing round-trip. */
    for (int p = 0; p < BN_PRECISION_COUNT; p++) {
        bn_precision back = BN_PRECISION_COUNT;
        CHECK(bn_precision_parse(bn_precision_name((bn_precision)p), &back));
        CHECK(back == (bn_precision)p);
    }
    CHECK(bn_precision_parse("BF16", &got) && got == BN_PRECISION_BF16);
    CHECK(!bn_precision_parse("fp8", &got));
    CHECK(!bn_precision_parse("", &got));
    CHECK(!bn_precision_parse(NULL, &got));
    CHECK(strcmp(bn_precision_name(BN_PRECISION_COUNT), "?") == 0);

    /* Unit roundoffs and the bound used by the GPU test. */
    CHECK(bn_precision_unit_roundoff(BN_PRECISION_FP32) == 1.0 / 16777216.0);
    CHECK(bn_precision_unit_roundoff(BN_PRECISION_FP16) == 1.0 / 2048.0);
    CHECK(bn_precision_unit_roundoff(BN_PRECISION_BF16) == 1.0 / 256.0);
    CHECK(bn_precision_unit_roundoff(BN_PRECISION_AUTO) == 0.0);
    const double b32 = bn_precision_matmul_error_bound(BN_PRECISION_FP32, 256);
    const double b16 = bn_precision_matmul_error_bound(BN_PRECISION_FP16, 256);
    const double bb16 = bn_precision_matmul_error_bound(BN_PRECISION_BF16, 256);
    CHECK(b32 > 0 && b32 < b16 && b16 < bb16);
    CHECK(fabs(b16 - (2.0 / 2048 + 1.0 / (2048.0 * 2048) + 256.0 / 16777216)) < 1e-15);
    CHECK(bn_precision_matmul_error_bound(BN_PRECISION_FP16, 1024) > b16); /* grows with k */
    CHECK(bn_precision_matmul_error_bound(BN_PRECISION_AUTO, 256) == 0.0);
    CHECK(bn_precision_matmul_error_bound(BN_PRECISION_FP16, -1) == 0.0);

    TEST_EXIT();
}
