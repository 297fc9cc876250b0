/* Every function of include/bitnet.h called with NULL and out-of-range
 * arguments: a function returning bn_status answers
 * BN_ERR_INVALID_ARGUMENT with a message, a void function given NULL does
 * nothing, and none of them crashes, overflows or reads out of bounds (the
 * sanitizer build runs this test too). */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "bitnet.h"
#include "test_util.h"

/* A bn_status result with the error record it filled. */
#define CHECK_INVALID(call, e)                                                     \
    do {                                                                           \
        bn_error_clear(&(e));                                                      \
        bn_status st_ = (call);                                                    \
        CHECK_MSG(st_ == BN_ERR_INVALID_ARGUMENT, "%s returned %s", #call,         \
                  bn_status_str(st_));                                             \
        CHECK_MSG((e).status == BN_ERR_INVALID_ARGUMENT && (e).message[0] != '\0', \
                  "%s left err as %s '%s'", #call, bn_status_str((e).status),      \
                  (e).message);                                                    \
    } while (0)

/* Runs fn with stderr sent to a file, and returns what it printed. */
static void capture_stderr(void (*fn)(void), char *out, size_t size)
{
    out[0] = '\0';
    char path[] = "/tmp/bn_test_public_api_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, out, size - 1, 0);
    out[n > 0 ? (size_t)n : 0] = '\0';
    close(fd);
    unlink(path);
}

static void test_status_and_errors(void)
{
    CHECK(strcmp(bn_status_str(BN_OK), "ok") == 0);
    CHECK(strcmp(bn_status_str(BN_ERR_INVALID_ARGUMENT), "invalid-argument") == 0);
    CHECK(strcmp(bn_status_str((bn_status)-1), "unknown-status") == 0);
    CHECK(strcmp(bn_status_str(BN_STATUS_COUNT), "unknown-status") == 0);
    CHECK(strcmp(bn_status_str((bn_status)INT_MAX), "unknown-status") == 0);
    CHECK(strcmp(bn_status_str((bn_status)INT_MIN), "unknown-status") == 0);

    bn_error_clear(NULL);
    bn_error e;
    memset(&e, 0x5a, sizeof e);
    bn_error_clear(&e);
    CHECK(e.status == BN_OK && e.message[0] == '\0' && e.hint[0] == '\0');

    CHECK(bn_error_set(NULL, BN_ERR_IO, NULL, "no record %d", 1) == BN_ERR_IO);
    CHECK(bn_error_set(&e, BN_ERR_IO, NULL, "cannot open %s", "x") == BN_ERR_IO);
    CHECK(e.status == BN_ERR_IO && strcmp(e.message, "cannot open x") == 0 && e.hint[0] == '\0');
    /* A NULL format: the message names the status instead. */
    const char *volatile no_format = NULL;
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-security"
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#endif
    CHECK(bn_error_set(&e, BN_ERR_FORMAT, "a hint", no_format) == BN_ERR_FORMAT);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    CHECK(e.status == BN_ERR_FORMAT && strcmp(e.hint, "a hint") == 0);
    CHECK_STR_CONTAINS(e.message, "format-error");
    /* Long messages and hints are cut, never overflow. */
    char big[2048];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    bn_error_set(&e, BN_ERR_INTERNAL, big, "%s", big);
    CHECK(strlen(e.message) == BN_ERROR_MESSAGE_MAX - 1 && strlen(e.hint) == BN_ERROR_HINT_MAX - 1);
    /* An out-of-range status is kept as given. */
    CHECK(bn_error_set(&e, (bn_status)999, NULL, "odd") == (bn_status)999 && e.status == 999);

    CHECK(bn_version() != NULL && strcmp(bn_version(), BITNET_VERSION_STRING) == 0);
}

static void log_bad_levels(void)
{
    bn_log_set_level((bn_log_level)1000000); /* ignored: debug stays */
    bn_log((bn_log_level)-1, "negative level");
    bn_log((bn_log_level)4, "level four");
    bn_log((bn_log_level)1000000, "level a million");
    bn_log((bn_log_level)INT_MIN, "level INT_MIN");
    const char *volatile no_format = NULL;
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-security"
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#endif
    bn_log(BN_LOG_ERROR, no_format);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    bn_log(BN_LOG_DEBUG, "good %d", 42);
}

static void test_log(void)
{
    bn_log_level old = bn_log_get_level();
    bn_log_set_level(BN_LOG_INFO);
    CHECK(bn_log_get_level() == BN_LOG_INFO);
    /* An invalid level is ignored: the current one stays. */
    bn_log_set_level((bn_log_level)-1);
    CHECK(bn_log_get_level() == BN_LOG_INFO);
    bn_log_set_level((bn_log_level)1000000);
    CHECK(bn_log_get_level() == BN_LOG_INFO);
    bn_log_set_level((bn_log_level)4);
    CHECK(bn_log_get_level() == BN_LOG_INFO);
    bn_log_set_level(BN_LOG_DEBUG);
    CHECK(bn_log_get_level() == BN_LOG_DEBUG);

    /* Messages at an invalid level, or without a format, print nothing. */
    char printed[4096];
    capture_stderr(log_bad_levels, printed, sizeof printed);
    CHECK_MSG(strcmp(printed, "bitnet: debug: good 42\n") == 0, "printed '%s'", printed);
    bn_log_set_level(old);
}

static void test_config(void)
{
    bn_error e;
    bn_config_defaults(NULL);
    bn_config cfg;
    memset(&cfg, 0x5a, sizeof cfg);
    bn_config_defaults(&cfg);
    CHECK(cfg.log_level == BN_LOG_WARN && cfg.device.kind == BN_DEVICE_AUTO &&
          cfg.device.index == -1 && cfg.num_threads == 0 && cfg.kernel[0] == '\0');

    CHECK_INVALID(bn_config_from_env(NULL, &e), e);
    CHECK(bn_config_from_env(NULL, NULL) == BN_ERR_INVALID_ARGUMENT);

    CHECK_INVALID(bn_config_set(NULL, "BITNET_LOG", "info", &e), e);
    CHECK_INVALID(bn_config_set(&cfg, NULL, "info", &e), e);
    CHECK_INVALID(bn_config_set(&cfg, "BITNET_LOG", NULL, &e), e);
    CHECK(bn_config_set(NULL, NULL, NULL, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_config_set(&cfg, "BITNET_LOG", "info", &e) == BN_OK && cfg.log_level == BN_LOG_INFO);
    CHECK(bn_config_set(&cfg, "BITNET_NOPE", "1", &e) == BN_ERR_INVALID_CONFIG);

    const char *const *names = bn_config_variable_names();
    CHECK(names != NULL && names[0] != NULL);
    size_t n = 0;
    while (names && names[n])
        n++;
    CHECK(n > 5 && n < 100);
    CHECK(bn_config_variable_accepted(NULL) == NULL);
    CHECK(bn_config_variable_accepted("") == NULL);
    CHECK(bn_config_variable_accepted("BITNET_NOPE") == NULL);
    CHECK(bn_config_variable_accepted("BITNET_LOG") != NULL);

    uint64_t bytes = 7;
    CHECK(!bn_parse_memory_size(NULL, &bytes) && bytes == 7);
    CHECK(!bn_parse_memory_size("1GB", NULL));
    CHECK(!bn_parse_memory_size("", &bytes));
    CHECK(!bn_parse_memory_size("-1", &bytes));
    CHECK(!bn_parse_memory_size("99999999999999999999", &bytes));
    CHECK(!bn_parse_memory_size("17179869184GB", &bytes)); /* 2^64 bytes */
    CHECK(!bn_parse_memory_size("16777216.5TB", &bytes));
    CHECK(bytes == 7);
    CHECK(bn_parse_memory_size("2GB", &bytes) && bytes == 2ull << 30);

    bn_device_request req = {.kind = BN_DEVICE_CPU, .index = 5};
    CHECK(!bn_parse_device_request(NULL, &req));
    CHECK(!bn_parse_device_request("cuda", NULL));
    CHECK(!bn_parse_device_request("cuda:-1", &req));
    CHECK(!bn_parse_device_request("cuda:64", &req));
    CHECK(!bn_parse_device_request("cuda:99999999999999999999", &req));
    CHECK(req.kind == BN_DEVICE_CPU && req.index == 5);
    CHECK(bn_parse_device_request("cuda:63", &req) && req.kind == BN_DEVICE_CUDA && req.index == 63);
    CHECK(req.count == 0);
    /* Device lists: one replica a device, a device may repeat; cuda:all. */
    CHECK(bn_parse_device_request("cuda:0,1", &req) && req.kind == BN_DEVICE_CUDA &&
          req.index == 0 && req.count == 2 && req.list[0] == 0 && req.list[1] == 1);
    CHECK(bn_parse_device_request("cuda:3,3,1", &req) && req.index == 3 && req.count == 3 &&
          req.list[0] == 3 && req.list[1] == 3 && req.list[2] == 1);
    CHECK(bn_parse_device_request("CUDA:ALL", &req) && req.kind == BN_DEVICE_CUDA &&
          req.index == 0 && req.count == -1);
    CHECK(bn_parse_device_request("cuda", &req) && req.index == -1 && req.count == 0);
    const char *bad_lists[] = {"cuda:0,",   "cuda:,1",  "cuda:0,,1", "cuda:0,64",
                               "cuda:a,1",  "cuda:0 ,1", "cuda:all,0", "vulkan:0,1",
                               "cuda:0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16"};
    for (size_t i = 0; i < sizeof bad_lists / sizeof bad_lists[0]; i++) {
        req = (bn_device_request){.kind = BN_DEVICE_CPU, .index = 5};
        CHECK_MSG(!bn_parse_device_request(bad_lists[i], &req) && req.kind == BN_DEVICE_CPU &&
                      req.index == 5 && req.count == 0,
                  "'%s' was accepted", bad_lists[i]);
    }
    CHECK(bn_parse_device_request("cuda:0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15", &req) &&
          req.count == BN_DEVICE_LIST_MAX && req.list[15] == 15);

    CHECK(strcmp(bn_gpu_backend_name(BN_GPU_CUDA), "cuda") == 0);
    CHECK(strcmp(bn_gpu_backend_name(BN_GPU_OPENCL), "opencl") == 0);
    CHECK(strcmp(bn_gpu_backend_name(BN_GPU_BACKEND_COUNT), "unknown") == 0);
    CHECK(strcmp(bn_gpu_backend_name((bn_gpu_backend)-1), "unknown") == 0);
    CHECK(strcmp(bn_gpu_backend_name((bn_gpu_backend)INT_MAX), "unknown") == 0);
}

static void test_alloc_and_time(void)
{
    CHECK(bn_aligned_alloc(0, 16) == NULL);
    CHECK(bn_aligned_alloc(1, 16) == NULL);
    CHECK(bn_aligned_alloc(3 * sizeof(void *), 16) == NULL);
    CHECK(bn_aligned_alloc(SIZE_MAX, 16) == NULL);
    CHECK(bn_aligned_alloc(64, SIZE_MAX) == NULL);
    CHECK(bn_aligned_alloc(4096, SIZE_MAX - 100) == NULL);
    CHECK(bn_aligned_alloc((size_t)1 << (sizeof(size_t) * 8 - 1), 16) == NULL);
    bn_aligned_free(NULL);
    void *p = bn_aligned_alloc(64, 0);
    CHECK(p != NULL && (uintptr_t)p % 64 == 0);
    bn_aligned_free(p);

    uint64_t a = bn_time_ns(), b = bn_time_ns();
    CHECK(a > 0 && b >= a);
    CHECK(bn_time_seconds() > 0.0);
}

static void test_backtrace(void)
{
    bn_backtrace_capture(NULL, 0);
    bn_backtrace_capture(NULL, INT_MAX);
    bn_backtrace bt;
    bn_backtrace_capture(&bt, INT_MAX); /* skips more frames than there are */
    CHECK(bt.depth == 0);
    bn_backtrace_capture(&bt, INT_MIN); /* as 0 */
    CHECK(bt.depth >= 0 && bt.depth <= BN_BACKTRACE_MAX);

    char buf[8192];
    bn_backtrace_format(&bt, NULL, 100);
    bn_backtrace_format(&bt, buf, 0);
    bn_backtrace_format(NULL, NULL, 0);
    memset(buf, 'z', sizeof buf);
    bn_backtrace_format(NULL, buf, 1);
    CHECK(buf[0] == '\0' && buf[1] == 'z');
    bn_backtrace_format(NULL, buf, sizeof buf);
    CHECK_STR_CONTAINS(buf, "no backtrace");

    /* A depth out of [0, BN_BACKTRACE_MAX] is clamped, never trusted. */
    bn_backtrace bad;
    memset(&bad, 0, sizeof bad);
    int depths[] = {-1, INT_MIN, BN_BACKTRACE_MAX + 1, 1000000, INT_MAX};
    for (size_t i = 0; i < sizeof depths / sizeof depths[0]; i++) {
        bad.depth = depths[i];
        memset(buf, 'z', sizeof buf);
        bn_backtrace_format(&bad, buf, sizeof buf);
        CHECK_MSG(memchr(buf, '\0', sizeof buf) != NULL && buf[0] != '\0',
                  "depth %d: not a non-empty string", depths[i]);
        if (depths[i] < 0) {
            CHECK_STR_CONTAINS(buf, "no backtrace");
        } else {
            /* At most BN_BACKTRACE_MAX frames: lines #0 to #31. */
            char last[16];
            snprintf(last, sizeof last, "#%d ", BN_BACKTRACE_MAX);
            CHECK(strstr(buf, last) == NULL);
        }
        /* A buffer too small for one line is cut, still terminated. */
        memset(buf, 'z', sizeof buf);
        bn_backtrace_format(&bad, buf, 5);
        CHECK(memchr(buf, '\0', 5) != NULL && buf[5] == 'z');
    }
}

static void test_host_and_cpu(void)
{
    bn_error e;
    CHECK_INVALID(bn_host_memory_query(NULL, &e), e);
    CHECK(bn_host_memory_query(NULL, NULL) == BN_ERR_INVALID_ARGUMENT);
    bn_host_memory m;
    CHECK(bn_host_memory_query(&m, NULL) == BN_OK && m.system_total_bytes > 0);

    const bn_cpu_features *f = bn_cpu_features_get();
    CHECK(f != NULL && f->arch[0] != '\0' && f == bn_cpu_features_get());
}

static bn_cuda_device h100(void)
{
    bn_cuda_device d;
    memset(&d, 0, sizeof d);
    d.cc_major = 9;
    d.sm_count = 132;
    d.max_threads_per_block = 1024;
    d.max_threads_per_sm = 2048;
    d.warp_size = 32;
    d.shared_mem_per_block = 48 * 1024;
    d.shared_mem_per_block_optin = 227 * 1024;
    d.total_memory_bytes = 80ull << 30;
    return d;
}

static void test_cuda_records(void)
{
    bn_cuda_query(NULL);
    bn_cuda_report *r = malloc(sizeof *r);
    CHECK(r != NULL);
    if (r) {
        memset(r, 0x5a, sizeof *r);
        bn_cuda_query(r);
        CHECK(r->device_count >= 0 && r->device_count <= BN_CUDA_MAX_DEVICES);
        CHECK(r->status == BN_OK ? r->device_count > 0 : r->reason[0] != '\0');
        CHECK(memchr(r->reason, '\0', sizeof r->reason) != NULL);
        free(r);
    }

    bn_cuda_device_derive_caps(NULL);
    bn_cuda_device d = h100();
    d.cc_major = INT_MAX, d.cc_minor = INT_MAX; /* a future device: everything */
    bn_cuda_device_derive_caps(&d);
    CHECK(d.fp16 && d.bf16 && d.int8_dot && d.tensor_cores && d.int8_tensor_cores && d.fp8);
    d.cc_major = INT_MIN, d.cc_minor = INT_MIN; /* nonsense: nothing */
    bn_cuda_device_derive_caps(&d);
    CHECK(!d.fp16 && !d.bf16 && !d.int8_dot && !d.tensor_cores && !d.int8_tensor_cores && !d.fp8);
    d.cc_major = -8, d.cc_minor = 0;
    bn_cuda_device_derive_caps(&d);
    CHECK(!d.fp16 && !d.tensor_cores);
    d.cc_major = 8, d.cc_minor = -1; /* (major, minor) compare in order: below 8.0 */
    bn_cuda_device_derive_caps(&d);
    CHECK(!d.bf16 && d.tensor_cores && d.int8_tensor_cores);
    d.cc_major = 7, d.cc_minor = 100; /* above 7.2, below 8.0 */
    bn_cuda_device_derive_caps(&d);
    CHECK(d.int8_tensor_cores && !d.bf16 && !d.fp8);

    CHECK(bn_cuda_memory_bandwidth_gbs(-1, 5120) == 0.0);
    CHECK(bn_cuda_memory_bandwidth_gbs(2619000, -64) == 0.0);
    CHECK(bn_cuda_memory_bandwidth_gbs(INT_MIN, INT_MIN) == 0.0);
    CHECK(bn_cuda_memory_bandwidth_gbs(0, 5120) == 0.0);
    double peak = bn_cuda_memory_bandwidth_gbs(INT_MAX, INT_MAX);
    CHECK(peak > 0.0 && peak < 1e15);
    CHECK(fabs(bn_cuda_memory_bandwidth_gbs(2619000, 5120) - 3352.32) < 0.01);

    bn_cuda_device two[2] = {h100(), h100()};
    two[1].sm_count = 200;
    CHECK(bn_cuda_best_device(NULL, 2) == -1);
    CHECK(bn_cuda_best_device(NULL, 0) == -1);
    CHECK(bn_cuda_best_device(two, 0) == -1);
    CHECK(bn_cuda_best_device(two, -1) == -1);
    CHECK(bn_cuda_best_device(two, INT_MIN) == -1);
    CHECK(bn_cuda_best_device(two, 2) == 1);
}

static void test_launch_params(void)
{
    bn_error e;
    bn_launch_params lp;
    bn_cuda_device d = h100();

    CHECK_INVALID(bn_launch_params_compute(NULL, 100, 0, 0, 0, &lp, &e), e);
    CHECK_INVALID(bn_launch_params_compute(&d, 100, 0, 0, 0, NULL, &e), e);
    CHECK(bn_launch_params_compute(NULL, 100, 0, 0, 0, NULL, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK_INVALID(bn_launch_params_compute(&d, 0, 0, 0, 0, &lp, &e), e);

    /* Device records without limits. */
    int *fields[] = {&d.warp_size, &d.sm_count, &d.max_threads_per_block};
    int values[] = {0, -1, INT_MIN};
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            d = h100();
            *fields[f] = values[v];
            CHECK_INVALID(bn_launch_params_compute(&d, 1000, 0, 0, 0, &lp, &e), e);
        }
    }
    d = h100();
    d.max_threads_per_block = 16; /* less than one warp */
    CHECK_INVALID(bn_launch_params_compute(&d, 1000, 0, 0, 0, &lp, &e), e);

    /* Work within a warp of 2^64: the rounding must not wrap. */
    d = h100();
    uint64_t huge[] = {UINT64_MAX, UINT64_MAX - 1, UINT64_MAX - 31, UINT64_MAX - 32,
                       (uint64_t)INT64_MAX + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        CHECK_INVALID(bn_launch_params_compute(&d, huge[i], 0, 0, 0, &lp, &e), e);
        CHECK_STR_CONTAINS(e.message, "grid");
        CHECK_INVALID(bn_launch_params_compute(&d, huge[i], UINT_MAX, 0, 0, &lp, &e), e);
    }
    /* The largest grid that fits, and one block more. */
    const uint64_t grid_max = 0x7fffffffull;
    CHECK(bn_launch_params_compute(&d, grid_max * 1024, 1024, 0, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 1024 && lp.grid == grid_max);
    CHECK_INVALID(bn_launch_params_compute(&d, grid_max * 1024 + 1, 1024, 0, 0, &lp, &e), e);
    /* One work item, any preferred block. */
    CHECK(bn_launch_params_compute(&d, 1, UINT_MAX, 0, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 32 && lp.grid == 1 && lp.shared_bytes == 0 && !lp.needs_optin);

    /* Shared memory sizes whose sums or products would wrap. */
    uint64_t per_thread[] = {UINT64_MAX, 1ull << 59, 1ull << 58, (UINT64_MAX / 32) + 1, 0, 1};
    uint64_t fixed[] = {0, 0, 0, 0, UINT64_MAX, UINT64_MAX - 10};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        CHECK_INVALID(bn_launch_params_compute(&d, 1000, 256, per_thread[i], fixed[i], &lp, &e),
                      e);
        CHECK_STR_CONTAINS(e.message, "shared memory");
    }
    /* Exactly at the opt-in limit: one warp fits. */
    CHECK(bn_launch_params_compute(&d, 1000, 256, 1, 227 * 1024 - 32, &lp, &e) == BN_OK);
    CHECK(lp.block == 32 && lp.shared_bytes == 227 * 1024 && lp.needs_optin);
}

static void test_gpu_detect(void)
{
    bn_error e;
    bn_config cfg;
    bn_config_defaults(&cfg);
    CHECK_INVALID(bn_gpu_detect(&cfg, NULL, &e), e);
    CHECK_INVALID(bn_gpu_detect(NULL, NULL, &e), e);
    CHECK(bn_gpu_detect(NULL, NULL, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK(!bn_gpu_info_available(NULL));

    bn_gpu_info *info = malloc(sizeof *info);
    CHECK(info != NULL);
    if (!info)
        return;
    /* Mask bits beyond the known backends are ignored. */
    cfg.gpu_fake_set = true;
    cfg.gpu_fake_mask = ~0u;
    CHECK(bn_gpu_detect(&cfg, info, &e) == BN_OK);
    CHECK(info->fake_override && bn_gpu_info_available(info));
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++)
        CHECK(info->backends[b].fake && (int)info->backends[b].backend == b);
    cfg.gpu_fake_mask = ~0u << BN_GPU_BACKEND_COUNT; /* none known */
    CHECK(bn_gpu_detect(&cfg, info, &e) == BN_OK);
    CHECK(info->fake_override && !bn_gpu_info_available(info));
    free(info);

    /* bn_gpu_available: under the environment, false on a malformed one. */
    setenv("BITNET_GPU_FAKE", "cuda", 1);
    CHECK(bn_gpu_available());
    setenv("BITNET_GPU_FAKE", "none", 1);
    CHECK(!bn_gpu_available());
    setenv("BITNET_GPU_FAKE", "cuda", 1);
    setenv("BITNET_DEVICE", "cuda:999", 1);
    CHECK(!bn_gpu_available());
    unsetenv("BITNET_DEVICE");
    unsetenv("BITNET_GPU_FAKE");
}

static void test_kernels(void)
{
    bn_kernel_query(NULL);
    bn_kernel_report k;
    memset(&k, 0x5a, sizeof k);
    bn_kernel_query(&k);
    CHECK(k.n_providers >= 1 && k.n_providers <= BN_KERNEL_PROVIDERS_MAX);
    CHECK_MSG(k.selection_status == BN_OK, "%s", k.selection_error);
    /* Best first; the scalar provider last and always available; the
     * selection is the first available CPU provider. */
    int n_selected = 0, first_cpu = -1;
    for (int i = 0; i < k.n_providers && i < BN_KERNEL_PROVIDERS_MAX; i++) {
        const bn_kernel_provider_info *p = &k.providers[i];
        CHECK(p->name[0] != '\0' && memchr(p->name, '\0', sizeof p->name) != NULL);
        if (i > 0)
            CHECK(p->priority <= k.providers[i - 1].priority);
        if (first_cpu < 0 && p->available && !p->device)
            first_cpu = i;
        n_selected += p->selected;
    }
    const bn_kernel_provider_info *last = &k.providers[k.n_providers - 1];
    CHECK(strcmp(last->name, "scalar") == 0 && last->available && !last->device);
    CHECK(n_selected == 1 && first_cpu >= 0 && k.providers[first_cpu].selected);

    const char *const *cuda = bn_cuda_kernel_families();
    CHECK(cuda != NULL);
    int n_cuda = 0;
    for (; cuda && cuda[n_cuda]; n_cuda++)
        CHECK(strchr(cuda[n_cuda], ':') != NULL);
    CHECK(bn_cuda_kernel_families() == cuda);
#ifndef BITNET_HAVE_CUDA
    CHECK(n_cuda == 0);
#endif
}

static void test_inspect_arguments(void)
{
    bn_error e;
    CHECK_INVALID(bn_inspect(NULL, NULL, stdout, &e), e);
    CHECK_INVALID(bn_inspect("model.gguf", NULL, NULL, &e), e);
    const bn_inspect_options o = {.json = true};
    CHECK_INVALID(bn_inspect(NULL, &o, NULL, &e), e);
    CHECK(bn_inspect(NULL, NULL, NULL, NULL) == BN_ERR_INVALID_ARGUMENT);
}

static void test_convert_arguments(void)
{
    bn_error e;
    bn_convert_type t = BN_CONVERT_TQ1_0;
    CHECK(!bn_convert_type_parse(NULL, &t) && t == BN_CONVERT_TQ1_0);
    CHECK(!bn_convert_type_parse("i2_s", NULL));
    CHECK(!bn_convert_type_parse("q4_0", &t) && t == BN_CONVERT_TQ1_0);
    CHECK(!bn_convert_type_parse("", &t) && t == BN_CONVERT_TQ1_0);
    static const char *const names[] = {"i2_s", "tq2_0", "tq1_0", "f16"};
    for (int i = 0; i < 4; i++) {
        CHECK(bn_convert_type_parse(names[i], &t) && (int)t == i);
        CHECK(strcmp(bn_convert_type_name(t), names[i]) == 0);
    }
    CHECK(strcmp(bn_convert_type_name((bn_convert_type)4), "unknown") == 0);
    CHECK(strcmp(bn_convert_type_name((bn_convert_type)-1), "unknown") == 0);

    bn_convert_options_default(NULL);
    bn_convert_options o;
    memset(&o, 0x5a, sizeof o);
    bn_convert_options_default(&o);
    CHECK(o.type == BN_CONVERT_I2_S && o.progress == NULL && o.user == NULL);

    bn_convert_report r;
    memset(&r, 0x5a, sizeof r);
    CHECK_INVALID(bn_convert_hf_to_gguf(NULL, "/tmp/x.gguf", NULL, &r, &e), e);
    CHECK(r.n_tensors == 0 && r.file_bytes == 0); /* cleared even on failure */
    CHECK_INVALID(bn_convert_hf_to_gguf("/tmp", NULL, NULL, NULL, &e), e);
    CHECK(bn_convert_hf_to_gguf(NULL, NULL, NULL, NULL, NULL) == BN_ERR_INVALID_ARGUMENT);
    o.type = (bn_convert_type)4;
    CHECK_INVALID(bn_convert_hf_to_gguf("/tmp", "/tmp/x.gguf", &o, NULL, &e), e);
    CHECK_STR_CONTAINS(e.message, "unknown output type 4");
    o.type = (bn_convert_type)-1;
    CHECK_INVALID(bn_convert_hf_to_gguf("/tmp", "/tmp/x.gguf", &o, NULL, &e), e);

    /* Nothing being written: nothing to remove. */
    bn_convert_remove_temp_files();
}

int main(void)
{
    test_status_and_errors();
    test_log();
    test_config();
    test_alloc_and_time();
    test_backtrace();
    test_host_and_cpu();
    test_cuda_records();
    test_launch_params();
    test_gpu_detect();
    test_kernels();
    test_inspect_arguments();
    test_convert_arguments();
    TEST_EXIT();
}
