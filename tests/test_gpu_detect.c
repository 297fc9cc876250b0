/* GPU detection under fake and strict modes, and the CUDA query on this
 * machine whatever it has: it must never crash and always say why. */
#include <stdlib.h>

#include "bitnet.h"
#include "test_util.h"

static bn_config config_with(const char *fake, bool strict, bool no_fake)
{
    bn_config c;
    bn_config_defaults(&c);
    if (fake)
        CHECK(bn_config_set(&c, "BITNET_GPU_FAKE", fake, NULL) == BN_OK);
    c.strict_mode = strict;
    c.strict_no_fake_gpu = no_fake;
    return c;
}

static bn_gpu_info info; /* large: keep it off the stack */

static void test_fake_cuda_rocm(void)
{
    bn_config c = config_with("cuda,rocm", false, false);
    bn_error e;
    CHECK(bn_gpu_detect(&c, &info, &e) == BN_OK);
    CHECK(info.fake_override && !info.fake_ignored);
    CHECK(info.backends[BN_GPU_CUDA].available && info.backends[BN_GPU_CUDA].fake);
    CHECK(info.backends[BN_GPU_ROCM].available && info.backends[BN_GPU_ROCM].fake);
    CHECK(!info.backends[BN_GPU_VULKAN].available && !info.backends[BN_GPU_VULKAN].fake);
    CHECK(bn_gpu_info_available(&info));
    CHECK(!info.preflight_ok); /* fakes never compute */
    CHECK_STR_CONTAINS(info.preflight, "BITNET_GPU_FAKE=cuda,rocm");
    CHECK(info.cuda.device_count == 0);
    CHECK_STR_CONTAINS(info.summary, "CUDA fake");
}

static void test_fake_none_and_empty(void)
{
    const char *values[] = {"none", ""};
    for (int i = 0; i < 2; i++) {
        bn_config c = config_with(values[i], false, false);
        CHECK(bn_gpu_detect(&c, &info, NULL) == BN_OK);
        CHECK(info.fake_override);
        CHECK(!bn_gpu_info_available(&info));
        for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++)
            CHECK(!info.backends[b].fake && !info.backends[b].available);
    }
}

static void test_strict_ignores_fake(void)
{
    bn_config c = config_with("cuda", true, false);
    CHECK(bn_gpu_detect(&c, &info, NULL) == BN_OK);
    CHECK(!info.fake_override && info.fake_ignored);
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++)
        CHECK(!info.backends[b].fake);
    /* Real detection ran: CUDA either works or says why not. */
    CHECK(info.backends[BN_GPU_CUDA].available || info.backends[BN_GPU_CUDA].detail[0]);
    CHECK(info.preflight[0] != '\0');
}

static void test_strict_no_fake_is_error(void)
{
    bn_error e;
    bn_config c = config_with("cuda", false, true);
    CHECK(bn_gpu_detect(&c, &info, &e) == BN_ERR_FAKE_GPU);
    CHECK_STR_CONTAINS(e.message, "BITNET_STRICT_NO_FAKE_GPU");
    c = config_with("cuda", true, true);
    CHECK(bn_gpu_detect(&c, &info, &e) == BN_ERR_FAKE_GPU);
    /* "none" configures no fake GPU, so it is not refused. */
    c = config_with("none", false, true);
    CHECK(bn_gpu_detect(&c, &info, &e) == BN_OK);
}

static void test_env_path(void)
{
    setenv("BITNET_GPU_FAKE", "opencl", 1);
    CHECK(bn_gpu_available());
    CHECK(bn_gpu_detect(NULL, &info, NULL) == BN_OK && info.backends[BN_GPU_OPENCL].fake);
    setenv("BITNET_GPU_FAKE", "bogus", 1);
    bn_error e;
    CHECK(bn_gpu_detect(NULL, &info, &e) == BN_ERR_INVALID_CONFIG);
    CHECK_STR_CONTAINS(e.message, "BITNET_GPU_FAKE");
    CHECK(!bn_gpu_available());
    unsetenv("BITNET_GPU_FAKE");
}

static void test_real_detection(void)
{
    bn_config c = config_with(NULL, false, false);
    CHECK(bn_gpu_detect(&c, &info, NULL) == BN_OK);
    CHECK(!info.fake_override);
    const bn_cuda_report *r = &info.cuda;
    if (r->status == BN_OK) {
        CHECK(r->device_count > 0);
        CHECK(info.preflight_ok);
        CHECK_STR_CONTAINS(info.preflight, "ready");
    } else {
        /* The "no CUDA device" path: clean, explained, actionable. */
        CHECK(r->device_count == 0);
        CHECK(r->reason[0] != '\0');
        CHECK(r->hint[0] != '\0');
        CHECK(!info.preflight_ok);
        CHECK_STR_CONTAINS(info.preflight, "no usable CUDA GPU");
        CHECK(!info.backends[BN_GPU_CUDA].available);
    }
    CHECK(strlen(info.summary) > 40);
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++)
        CHECK(info.backends[b].available || info.backends[b].detail[0] != '\0');
    printf("summary: %s\n", info.summary);
}

int main(void)
{
    for (const char *const *n = bn_config_variable_names(); *n; n++)
        unsetenv(*n);
    test_fake_cuda_rocm();
    test_fake_none_and_empty();
    test_strict_ignores_fake();
    test_strict_no_fake_is_error();
    test_env_path();
    test_real_detection();
    TEST_EXIT();
}
