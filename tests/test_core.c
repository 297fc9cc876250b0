/* Core helpers: aligned allocation, timers, host memory, CPU features,
 * the JSON writer, logging levels and backtraces. */
#include <stdint.h>
#include <unistd.h>

#include "bitnet.h"
#include "test_util.h"

static void test_aligned_alloc(void)
{
    size_t aligns[] = {8, 16, 64, 128, 4096};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        unsigned char *p = bn_aligned_alloc(aligns[i], 1000);
        CHECK(p != NULL && ((uintptr_t)p % aligns[i]) == 0);
        if (p) {
            memset(p, 0xA5, 1000); /* must be writable over its whole size */
            CHECK(p[999] == 0xA5);
        }
        bn_aligned_free(p);
    }
    CHECK(bn_aligned_alloc(48, 10) == NULL); /* not a power of two */
    CHECK(bn_aligned_alloc(2, 10) == NULL);  /* below sizeof(void *) */
    void *z = bn_aligned_alloc(64, 0);
    CHECK(z != NULL);
    bn_aligned_free(z);
    CHECK(bn_aligned_alloc(64, SIZE_MAX - 4096) == NULL);
}

static void test_timers(void)
{
    uint64_t a = bn_time_ns();
    usleep(2000);
    uint64_t b = bn_time_ns();
    CHECK(b > a && b - a >= 1500000 && b - a < 2000000000ull);
    double s = bn_time_seconds();
    CHECK(s > 0.0);
}

static void test_host_memory(void)
{
    bn_host_memory m;
    bn_error e;
    CHECK(bn_host_memory_query(&m, &e) == BN_OK);
    CHECK(m.system_total_bytes > (64ull << 20));
    CHECK(m.system_available_bytes > 0 && m.system_available_bytes <= m.system_total_bytes);
    CHECK(m.process_resident_bytes > 0 && m.process_resident_bytes < m.system_total_bytes);
    CHECK(m.process_peak_bytes >= m.process_resident_bytes);
    CHECK(bn_host_memory_query(NULL, &e) == BN_ERR_INVALID_ARGUMENT);
}

#if defined(__x86_64__) && defined(__linux__)
/* True when /proc/cpuinfo's flags line has the word. */
static bool cpuinfo_has(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return false;
    char line[8192];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        char *tok = strtok(strchr(line, ':') + 1, " \t\n");
        for (; tok && !found; tok = strtok(NULL, " \t\n"))
            found = strcmp(tok, flag) == 0;
        break;
    }
    fclose(f);
    return found;
}
#endif

static void test_cpu_features(void)
{
    const bn_cpu_features *f = bn_cpu_features_get();
    CHECK(f == bn_cpu_features_get()); /* detected once */
    CHECK(f->logical_cores >= 1);
    CHECK(f->arch[0] != '\0');
#if defined(__x86_64__) && defined(__linux__)
    /* The kernel reports what the CPU and OS support; so must we. */
    CHECK(f->avx2 == cpuinfo_has("avx2"));
    CHECK(f->avx512f == cpuinfo_has("avx512f"));
    CHECK(f->avx512bw == cpuinfo_has("avx512bw"));
    CHECK(f->avx512vnni == cpuinfo_has("avx512_vnni"));
    CHECK(f->avxvnni == cpuinfo_has("avx_vnni"));
    CHECK(!f->neon);
#elif defined(__aarch64__)
    CHECK(f->neon && !f->avx2);
#endif
}

static void test_json_writer(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    if (!f)
        return;
    bn_json j;
    bn_json_init(&j, f);
    bn_json_begin_object(&j);
    bn_json_kv_string(&j, "s", "quote\" back\\ nl\n ctl\x01");
    bn_json_kv_int(&j, "i", -42);
    bn_json_kv_uint(&j, "u", UINT64_MAX);
    bn_json_kv_double(&j, "d", 0.5);
    bn_json_kv_double(&j, "nan", NAN);
    bn_json_kv_bool(&j, "b", true);
    bn_json_key(&j, "empty");
    bn_json_begin_array(&j);
    bn_json_end_array(&j);
    bn_json_key(&j, "arr");
    bn_json_begin_array(&j);
    bn_json_int(&j, 1);
    bn_json_null(&j);
    bn_json_end_array(&j);
    bn_json_end_object(&j);
    fclose(f);
    const char *expected = "{\n"
                           "  \"s\": \"quote\\\" back\\\\ nl\\n ctl\\u0001\",\n"
                           "  \"i\": -42,\n"
                           "  \"u\": 18446744073709551615,\n"
                           "  \"d\": 0.5,\n"
                           "  \"nan\": null,\n"
                           "  \"b\": true,\n"
                           "  \"empty\": [],\n"
                           "  \"arr\": [\n"
                           "    1,\n"
                           "    null\n"
                           "  ]\n"
                           "}\n";
    CHECK_MSG(strcmp(buf, expected) == 0, "got:\n%s", buf);
    free(buf);
}

static void test_log_level(void)
{
    bn_log_level old = bn_log_get_level();
    bn_log_set_level(BN_LOG_DEBUG);
    CHECK(bn_log_get_level() == BN_LOG_DEBUG);
    bn_log(BN_LOG_DEBUG, "test_core: a debug message (expected in the output)");
    bn_log_set_level(old);
    CHECK(bn_log_get_level() == old);
}

static void test_backtrace(void)
{
    bn_backtrace bt;
    bn_backtrace_capture(&bt, 0);
    char text[4096];
    bn_backtrace_format(&bt, text, sizeof text);
#ifdef BITNET_DEBUG
    CHECK(bt.depth > 0);
    CHECK_STR_CONTAINS(text, "#0");
#else
    CHECK(bt.depth == 0);
    CHECK_STR_CONTAINS(text, "no backtrace");
#endif
}

int main(void)
{
    test_aligned_alloc();
    test_timers();
    test_host_memory();
    test_cpu_features();
    test_json_writer();
    test_log_level();
    test_backtrace();
    TEST_EXIT();
}
