/* Environment configuration: every variable, good and bad values, and the
 * error message naming the variable and the accepted form. */
#include <stdlib.h>

#include "bitnet.h"
#include "test_util.h"

static void test_status_and_errors(void)
{
    CHECK(strcmp(bn_status_str(BN_OK), "ok") == 0);
    CHECK(strcmp(bn_status_str(BN_ERR_INVALID_CONFIG), "invalid-config") == 0);
    CHECK(strcmp(bn_status_str((bn_status)999), "unknown-status") == 0);
    for (int s = 0; s < BN_STATUS_COUNT; s++)
        CHECK(strcmp(bn_status_str((bn_status)s), "unknown-status") != 0);

    bn_error e;
    bn_error_clear(&e);
    CHECK(e.status == BN_OK && e.message[0] == '\0' && e.hint[0] == '\0');
    bn_status st = bn_error_set(&e, BN_ERR_IO, "check the path", "cannot open %s", "x.gguf");
    CHECK(st == BN_ERR_IO && e.status == BN_ERR_IO);
    CHECK(strcmp(e.message, "cannot open x.gguf") == 0);
    CHECK(strcmp(e.hint, "check the path") == 0);
    CHECK(bn_error_set(NULL, BN_ERR_FORMAT, NULL, "ignored") == BN_ERR_FORMAT);
    CHECK(strcmp(bn_version(), BITNET_VERSION_STRING) == 0);
}

static void test_defaults(void)
{
    bn_config c;
    bn_config_defaults(&c);
    CHECK(c.log_level == BN_LOG_WARN);
    CHECK(c.device.kind == BN_DEVICE_AUTO && c.device.index == -1);
    CHECK(!c.gpu_fake_set && !c.strict_mode && !c.strict_no_fake_gpu);
    CHECK(c.num_threads == 0 && c.batch_size == 0 && c.memory_limit_bytes == 0);
}

/* Sets name=value on fresh defaults; returns the status. */
static bn_status set1(bn_config *c, const char *name, const char *value, bn_error *e)
{
    bn_config_defaults(c);
    bn_error_clear(e);
    return bn_config_set(c, name, value, e);
}

static void expect_invalid(const char *name, const char *value)
{
    bn_config c;
    bn_error e;
    bn_status st = set1(&c, name, value, &e);
    CHECK_MSG(st == BN_ERR_INVALID_CONFIG, "%s='%s' was accepted", name, value);
    CHECK_STR_CONTAINS(e.message, name);
    CHECK_STR_CONTAINS(e.message, "expected");
    CHECK_STR_CONTAINS(e.message, bn_config_variable_accepted(name));
}

static void test_each_variable(void)
{
    bn_config c;
    bn_error e;

    CHECK(set1(&c, "BITNET_LOG", "debug", &e) == BN_OK && c.log_level == BN_LOG_DEBUG);
    CHECK(set1(&c, "BITNET_LOG", "ERROR", &e) == BN_OK && c.log_level == BN_LOG_ERROR);
    expect_invalid("BITNET_LOG", "verbose");

    CHECK(set1(&c, "BITNET_DEVICE", "cpu", &e) == BN_OK && c.device.kind == BN_DEVICE_CPU);
    CHECK(set1(&c, "BITNET_DEVICE", "gpu", &e) == BN_OK && c.device.kind == BN_DEVICE_GPU);
    CHECK(set1(&c, "BITNET_DEVICE", "cuda", &e) == BN_OK && c.device.kind == BN_DEVICE_CUDA &&
          c.device.index == -1);
    CHECK(set1(&c, "BITNET_DEVICE", "cuda:3", &e) == BN_OK && c.device.index == 3);
    expect_invalid("BITNET_DEVICE", "cuda:");
    expect_invalid("BITNET_DEVICE", "cuda:-1");
    expect_invalid("BITNET_DEVICE", "cuda:1x");
    expect_invalid("BITNET_DEVICE", "tpu");

    CHECK(set1(&c, "BITNET_VULKAN_FP64", "0", &e) == BN_OK && c.vulkan_no_fp64);
    CHECK(set1(&c, "BITNET_VULKAN_FP64", "on", &e) == BN_OK && !c.vulkan_no_fp64);
    expect_invalid("BITNET_VULKAN_FP64", "maybe");
    CHECK(set1(&c, "BITNET_VULKAN_DOT", "0", &e) == BN_OK && c.vulkan_no_dot);
    CHECK(set1(&c, "BITNET_VULKAN_DOT", "yes", &e) == BN_OK && !c.vulkan_no_dot);
    expect_invalid("BITNET_VULKAN_DOT", "2");
    CHECK(set1(&c, "BITNET_VULKAN_MATRIX", "off", &e) == BN_OK && c.vulkan_no_matrix);
    CHECK(set1(&c, "BITNET_VULKAN_MATRIX", "1", &e) == BN_OK && !c.vulkan_no_matrix);
    expect_invalid("BITNET_VULKAN_MATRIX", "maybe");

    CHECK(set1(&c, "BITNET_GPU_FAKE", "cuda,rocm", &e) == BN_OK && c.gpu_fake_set &&
          c.gpu_fake_mask == ((1u << BN_GPU_CUDA) | (1u << BN_GPU_ROCM)));
    CHECK(set1(&c, "BITNET_GPU_FAKE", " CUDA , vulkan ", &e) == BN_OK &&
          c.gpu_fake_mask == ((1u << BN_GPU_CUDA) | (1u << BN_GPU_VULKAN)));
    CHECK(set1(&c, "BITNET_GPU_FAKE", "none", &e) == BN_OK && c.gpu_fake_set && c.gpu_fake_mask == 0);
    CHECK(set1(&c, "BITNET_GPU_FAKE", "", &e) == BN_OK && c.gpu_fake_set && c.gpu_fake_mask == 0);
    expect_invalid("BITNET_GPU_FAKE", "cuda,tpu");
    expect_invalid("BITNET_GPU_FAKE", "none,cuda");

    CHECK(set1(&c, "BITNET_STRICT_MODE", "1", &e) == BN_OK && c.strict_mode);
    CHECK(set1(&c, "BITNET_STRICT_MODE", "off", &e) == BN_OK && !c.strict_mode);
    expect_invalid("BITNET_STRICT_MODE", "2");
    expect_invalid("BITNET_STRICT_MODE", "");
    CHECK(set1(&c, "BITNET_STRICT_NO_FAKE_GPU", "true", &e) == BN_OK && c.strict_no_fake_gpu);
    expect_invalid("BITNET_STRICT_NO_FAKE_GPU", "maybe");

    CHECK(set1(&c, "BITNET_NUM_THREADS", "8", &e) == BN_OK && c.num_threads == 8);
    expect_invalid("BITNET_NUM_THREADS", "abc");
    expect_invalid("BITNET_NUM_THREADS", "0");
    expect_invalid("BITNET_NUM_THREADS", "-4");
    expect_invalid("BITNET_NUM_THREADS", "4 ");
    expect_invalid("BITNET_NUM_THREADS", "99999999999999999999999");

    CHECK(set1(&c, "BITNET_BATCH_SIZE", "64", &e) == BN_OK && c.batch_size == 64);
    expect_invalid("BITNET_BATCH_SIZE", "1.5");

    CHECK(set1(&c, "BITNET_MEMORY_LIMIT", "2GB", &e) == BN_OK &&
          c.memory_limit_bytes == 2ull << 30);
    CHECK(set1(&c, "BITNET_MEMORY_LIMIT", "512MB", &e) == BN_OK &&
          c.memory_limit_bytes == 512ull << 20);
    expect_invalid("BITNET_MEMORY_LIMIT", "lots");
    expect_invalid("BITNET_MEMORY_LIMIT", "0");

    CHECK(set1(&c, "BITNET_DETERMINISTIC", "yes", &e) == BN_OK && c.deterministic);
    expect_invalid("BITNET_DETERMINISTIC", "sometimes");

    CHECK(set1(&c, "BITNET_SEED", "18446744073709551615", &e) == BN_OK && c.seed_set &&
          c.seed == UINT64_MAX);
    CHECK(set1(&c, "BITNET_SEED", "0", &e) == BN_OK && c.seed_set && c.seed == 0);
    expect_invalid("BITNET_SEED", "18446744073709551616");
    expect_invalid("BITNET_SEED", "-1");
    CHECK(set1(&c, "BITNET_API_KEY", "sk-local_123", &e) == BN_OK &&
          strcmp(c.api_key, "sk-local_123") == 0);
    expect_invalid("BITNET_API_KEY", "");
    expect_invalid("BITNET_API_KEY", "two words");

    CHECK(set1(&c, "BITNET_NOT_A_THING", "1", &e) == BN_ERR_INVALID_CONFIG);
    CHECK_STR_CONTAINS(e.message, "BITNET_NOT_A_THING");

    /* Every listed variable has an accepted-form text. */
    int n = 0;
    for (const char *const *name = bn_config_variable_names(); *name; name++, n++)
        CHECK_MSG(bn_config_variable_accepted(*name) != NULL, "%s", *name);
    CHECK(n >= 12);
}

static void test_memory_sizes(void)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } good[] = {
        {"4096", 4096},           {"1b", 1},
        {"1K", 1024},             {"2kb", 2048},
        {"512MB", 512ull << 20},  {"512MiB", 512ull << 20},
        {"2GB", 2ull << 30},      {"2gib", 2ull << 30},
        {"1.5GB", 3ull << 29},    {"1TB", 1ull << 40},
        {"0.5kb", 512},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t b = 0;
        CHECK_MSG(bn_parse_memory_size(good[i].text, &b) && b == good[i].bytes, "%s -> %llu",
                  good[i].text, (unsigned long long)b);
    }
    static const char *const bad[] = {"",      "GB",     "-1GB", "1.2.3GB", "2 GB", "2XB",
                                      "0",     "0.0001b", "1e9", "99999999999TB",
                                      "18446744073709551616"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t b = 0;
        CHECK_MSG(!bn_parse_memory_size(bad[i], &b), "'%s' accepted as %llu", bad[i],
                  (unsigned long long)b);
    }
}

static void test_from_env(void)
{
    bn_config c;
    bn_error e;
    setenv("BITNET_NUM_THREADS", "3", 1);
    setenv("BITNET_MEMORY_LIMIT", "1GB", 1);
    setenv("BITNET_GPU_FAKE", "", 1);
    CHECK(bn_config_from_env(&c, &e) == BN_OK);
    CHECK(c.num_threads == 3 && c.memory_limit_bytes == 1ull << 30);
    CHECK(c.gpu_fake_set && c.gpu_fake_mask == 0);

    setenv("BITNET_NUM_THREADS", "abc", 1);
    bn_error_clear(&e);
    CHECK(bn_config_from_env(&c, &e) == BN_ERR_INVALID_CONFIG);
    CHECK_STR_CONTAINS(e.message, "BITNET_NUM_THREADS='abc'");
    CHECK(e.hint[0] != '\0');
    unsetenv("BITNET_NUM_THREADS");
    unsetenv("BITNET_MEMORY_LIMIT");
    unsetenv("BITNET_GPU_FAKE");
    CHECK(bn_config_from_env(&c, &e) == BN_OK && !c.gpu_fake_set);
}

int main(void)
{
    /* Start from a clean environment for the variables under test. */
    for (const char *const *n = bn_config_variable_names(); *n; n++)
        unsetenv(*n);
    test_status_and_errors();
    test_defaults();
    test_each_variable();
    test_memory_sizes();
    test_from_env();
    TEST_EXIT();
}
