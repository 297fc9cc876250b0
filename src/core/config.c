/*
 * config.c - the one place where BITNET_* environment variables are read.
 *
 * Each variable has a row in `variables` below: its name, the form it
 * accepts (quoted verbatim in error messages and in `bitnet --help`), and a
 * parser. A malformed value is always an error naming the variable; it is
 * never ignored or replaced by a default.
 */
#include "bitnet.h"

#include <ctype.h>
#include <stdio.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef bool (*parse_fn)(bn_config *cfg, const char *value);

/* ---- value parsers: true on success --------------------------------------- */

static bool parse_bool(const char *v, bool *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = true;
            return true;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = false;
            return true;
        }
    }
    return false;
}

/* Whole-string unsigned decimal; no sign, no spaces, no trailing text. */
static bool parse_u64(const char *v, uint64_t *out)
{
    if (!isdigit((unsigned char)v[0]))
        return false;
    errno = 0;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || *end != '\0')
        return false;
    *out = (uint64_t)x;
    return true;
}

static bool parse_int_range(const char *v, long lo, long hi, int *out)
{
    uint64_t x;
    if (!parse_u64(v, &x) || x < (uint64_t)lo || x > (uint64_t)hi)
        return false;
    *out = (int)x;
    return true;
}

/* Plain decimal number such as "2", "0.5"; no exponent, inf or nan. */
static bool parse_positive_decimal(const char *v, double *out)
{
    size_t n = strlen(v), digits = 0, dots = 0;
    for (size_t i = 0; i < n; i++) {
        if (isdigit((unsigned char)v[i]))
            digits++;
        else if (v[i] == '.')
            dots++;
        else
            return false;
    }
    if (digits == 0 || dots > 1)
        return false;
    double x = strtod(v, NULL);
    if (!(x > 0.0) || !isfinite(x))
        return false;
    *out = x;
    return true;
}

bool bn_parse_memory_size(const char *text, uint64_t *bytes)
{
    if (!text || !bytes)
        return false;
    /* Split "<number><unit>": the number may have one decimal point. */
    const char *p = text;
    size_t num_len = 0;
    while (isdigit((unsigned char)p[num_len]) || p[num_len] == '.')
        num_len++;
    if (num_len == 0 || num_len >= 64)
        return false;
    char num[64];
    memcpy(num, p, num_len);
    num[num_len] = '\0';
    const char *unit = p + num_len;

    static const struct {
        const char *name;
        uint64_t scale;
    } units[] = {
        {"", 1},          {"b", 1},
        {"k", 1ull << 10}, {"kb", 1ull << 10}, {"kib", 1ull << 10},
        {"m", 1ull << 20}, {"mb", 1ull << 20}, {"mib", 1ull << 20},
        {"g", 1ull << 30}, {"gb", 1ull << 30}, {"gib", 1ull << 30},
        {"t", 1ull << 40}, {"tb", 1ull << 40}, {"tib", 1ull << 40},
    };
    uint64_t scale = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(unit, units[i].name) == 0)
            scale = units[i].scale;
    if (scale == 0)
        return false;

    if (strchr(num, '.')) {
        double x;
        if (!parse_positive_decimal(num, &x))
            return false;
        double total = x * (double)scale;
        if (total >= 18446744073709551615.0 || total < 1.0)
            return false;
        *bytes = (uint64_t)total;
        return true;
    }
    uint64_t x;
    if (!parse_u64(num, &x) || x == 0)
        return false;
    if (x > UINT64_MAX / scale)
        return false;
    *bytes = x * scale;
    return true;
}

/* "N" or "N,M,..." (CUDA device numbers): r->index the first, and for
 * two or more r->count and r->list. */
static bool parse_device_list(const char *text, bn_device_request *r)
{
    int n = 0;
    int list[BN_DEVICE_LIST_MAX];
    for (const char *p = text;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char one[16];
        if (len == 0 || len >= sizeof one || n == BN_DEVICE_LIST_MAX)
            return false;
        memcpy(one, p, len);
        one[len] = '\0';
        if (!parse_int_range(one, 0, BN_CUDA_MAX_DEVICES - 1, &list[n]))
            return false;
        n++;
        if (!comma)
            break;
        p = comma + 1;
    }
    r->index = list[0];
    if (n >= 2) {
        r->count = n;
        memcpy(r->list, list, (size_t)n * sizeof list[0]);
    }
    return true;
}

bool bn_parse_device_request(const char *text, bn_device_request *req)
{
    if (!text || !req)
        return false;
    static const struct {
        const char *name;
        bn_device_kind kind;
    } kinds[] = {
        {"auto", BN_DEVICE_AUTO},
        {"cpu", BN_DEVICE_CPU},
        {"gpu", BN_DEVICE_GPU},
        {"cuda", BN_DEVICE_CUDA},
        {"vulkan", BN_DEVICE_VULKAN},
    };
    bn_device_request r;
    memset(&r, 0, sizeof r);
    r.index = -1;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcasecmp(text, kinds[i].name) == 0) {
            r.kind = kinds[i].kind;
            *req = r;
            return true;
        }
    }
    if (strncasecmp(text, "cuda:", 5) == 0) {
        r.kind = BN_DEVICE_CUDA;
        if (strcasecmp(text + 5, "all") == 0) {
            r.index = 0;
            r.count = -1;
            *req = r;
            return true;
        }
        if (!parse_device_list(text + 5, &r))
            return false;
        *req = r;
        return true;
    }
    if (strncasecmp(text, "vulkan:", 7) == 0) {
        int index;
        if (!parse_int_range(text + 7, 0, BN_VULKAN_MAX_DEVICES - 1, &index))
            return false;
        r.kind = BN_DEVICE_VULKAN;
        r.index = index;
        *req = r;
        return true;
    }
    return false;
}

const char *bn_gpu_backend_name(bn_gpu_backend backend)
{
    static const char *const names[BN_GPU_BACKEND_COUNT] = {"cuda", "rocm", "metal", "vulkan",
                                                            "opencl"};
    if ((int)backend < 0 || backend >= BN_GPU_BACKEND_COUNT)
        return "unknown";
    return names[backend];
}

/* "cuda,rocm" -> mask; "" and "none" -> 0. Names are case-insensitive and
 * may have spaces around them. */
static bool parse_backend_list(const char *v, unsigned *mask)
{
    unsigned m = 0;
    char buf[256];
    if (strlen(v) >= sizeof buf)
        return false;
    strcpy(buf, v);
    char *save = NULL;
    bool saw_none = false, saw_backend = false;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok))
            tok++;
        char *end = tok + strlen(tok);
        while (end > tok && isspace((unsigned char)end[-1]))
            *--end = '\0';
        if (*tok == '\0')
            continue;
        if (strcasecmp(tok, "none") == 0) {
            saw_none = true;
            continue;
        }
        int found = -1;
        for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++)
            if (strcasecmp(tok, bn_gpu_backend_name((bn_gpu_backend)b)) == 0)
                found = b;
        if (found < 0)
            return false;
        m |= 1u << found;
        saw_backend = true;
    }
    if (saw_none && saw_backend) /* "none,cuda" is contradictory */
        return false;
    *mask = m;
    return true;
}

/* ---- one parser per variable ---------------------------------------------- */

static bool set_log(bn_config *c, const char *v)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, names[i]) == 0) {
            c->log_level = (bn_log_level)i;
            return true;
        }
    }
    if (strcasecmp(v, "warning") == 0) {
        c->log_level = BN_LOG_WARN;
        return true;
    }
    return false;
}
static bool set_device(bn_config *c, const char *v) { return bn_parse_device_request(v, &c->device); }
static bool set_model(bn_config *c, const char *v)
{
    const size_t n = strlen(v);
    if (n == 0 || n >= sizeof c->model)
        return false;
    memcpy(c->model, v, n + 1);
    return true;
}
static bool set_api_key(bn_config *c, const char *v)
{
    const size_t n = strlen(v);
    if (n == 0 || n >= sizeof c->api_key)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)v[i] <= ' ' || (unsigned char)v[i] >= 0x7f)
            return false; /* it travels in an HTTP header */
    memcpy(c->api_key, v, n + 1);
    return true;
}
/* The Python package reads BITNET_LIBRARY itself; the library only knows
 * the name, so that it is not reported as unknown. */
static bool set_library_path(bn_config *c, const char *v)
{
    (void)c;
    return v[0] != '\0';
}
static bool set_gpu_fake(bn_config *c, const char *v)
{
    if (!parse_backend_list(v, &c->gpu_fake_mask))
        return false;
    c->gpu_fake_set = true;
    return true;
}
static bool set_strict(bn_config *c, const char *v) { return parse_bool(v, &c->strict_mode); }
static bool set_strict_no_fake(bn_config *c, const char *v)
{
    return parse_bool(v, &c->strict_no_fake_gpu);
}
/* A boolean whose 0 turns something off: *off = !value. */
static bool parse_off(const char *v, bool *off)
{
    bool on;
    if (!parse_bool(v, &on))
        return false;
    *off = !on;
    return true;
}
static bool set_vulkan_fp64(bn_config *c, const char *v)
{
    return parse_off(v, &c->vulkan_no_fp64);
}
static bool set_vulkan_dot(bn_config *c, const char *v)
{
    return parse_off(v, &c->vulkan_no_dot);
}
static bool set_vulkan_screen(bn_config *c, const char *v)
{
    return parse_off(v, &c->vulkan_no_screen);
}
static bool set_vulkan_matrix(bn_config *c, const char *v)
{
    return parse_off(v, &c->vulkan_no_matrix);
}
static bool set_threads(bn_config *c, const char *v)
{
    return parse_int_range(v, 1, 4096, &c->num_threads);
}
static bool set_batch(bn_config *c, const char *v)
{
    return parse_int_range(v, 1, 1 << 20, &c->batch_size);
}
static bool set_memory_limit(bn_config *c, const char *v)
{
    return bn_parse_memory_size(v, &c->memory_limit_bytes);
}
static bool set_deterministic(bn_config *c, const char *v) { return parse_bool(v, &c->deterministic); }
static bool set_seed(bn_config *c, const char *v)
{
    if (!parse_u64(v, &c->seed))
        return false;
    c->seed_set = true;
    return true;
}

/* Provider names are checked against the build by the kernel manager; here
 * only the spelling. */
static bool set_kernel(bn_config *c, const char *v)
{
    static const char *const names[] = {"scalar", "avx2",    "avx512", "avx512vnni",
                                        "neon",   "neondot", "cuda"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(v, names[i]) == 0) {
            snprintf(c->kernel, sizeof c->kernel, "%s", v);
            return true;
        }
    }
    return false;
}

static const struct variable {
    const char *name;
    const char *accepted; /* shown to the user on a bad value */
    parse_fn parse;
} variables[] = {
    {"BITNET_LOG", "one of error, warn, info, debug", set_log},
    {"BITNET_DEVICE", "one of auto, cpu, gpu, cuda, cuda:N, cuda:N,M,..., cuda:all, vulkan, vulkan:N (N a device index)",
     set_device},
    {"BITNET_GPU_FAKE", "a comma-separated list of cuda, rocm, metal, vulkan, opencl; or none; or empty",
     set_gpu_fake},
    {"BITNET_STRICT_MODE", "0 or 1 (also true/false, yes/no, on/off)", set_strict},
    {"BITNET_STRICT_NO_FAKE_GPU", "0 or 1 (also true/false, yes/no, on/off)", set_strict_no_fake},
    {"BITNET_NUM_THREADS", "a whole number from 1 to 4096", set_threads},
    {"BITNET_BATCH_SIZE", "a whole number from 1 to 1048576", set_batch},
    {"BITNET_MEMORY_LIMIT",
     "a size above zero such as 2GB, 512MB, 1.5GiB or a byte count (KB/MB/GB are powers of 1024)",
     set_memory_limit},
    {"BITNET_DETERMINISTIC", "0 or 1 (also true/false, yes/no, on/off)", set_deterministic},
    {"BITNET_SEED", "a whole number from 0 to 18446744073709551615", set_seed},
    {"BITNET_KERNEL", "one of scalar, avx2, avx512, avx512vnni, neon, neondot, cuda", set_kernel},
    {"BITNET_MODEL", "a path (1 to 1023 bytes) to a GGUF file or Hugging Face model directory",
     set_model},
    {"BITNET_API_KEY", "1 to 255 printable ASCII characters, no spaces", set_api_key},
    {"BITNET_LIBRARY", "a path to libbitnet.so (read by the Python package only)",
     set_library_path},
    {"BITNET_VULKAN_FP64", "0 or 1 (also true/false, yes/no, on/off)", set_vulkan_fp64},
    {"BITNET_VULKAN_DOT", "0 or 1 (also true/false, yes/no, on/off)", set_vulkan_dot},
    {"BITNET_VULKAN_SCREEN", "0 or 1 (also true/false, yes/no, on/off)", set_vulkan_screen},
    {"BITNET_VULKAN_MATRIX", "0 or 1 (also true/false, yes/no, on/off)", set_vulkan_matrix},
};
#define N_VARIABLES (sizeof variables / sizeof variables[0])

const char *const *bn_config_variable_names(void)
{
    static const char *names[N_VARIABLES + 1];
    /* Filled on every call: the table is constant, so this is idempotent. */
    for (size_t i = 0; i < N_VARIABLES; i++)
        names[i] = variables[i].name;
    names[N_VARIABLES] = NULL;
    return names;
}

const char *bn_config_variable_accepted(const char *name)
{
    for (size_t i = 0; name && i < N_VARIABLES; i++)
        if (strcmp(name, variables[i].name) == 0)
            return variables[i].accepted;
    return NULL;
}

void bn_config_defaults(bn_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->log_level = BN_LOG_WARN;
    cfg->device.kind = BN_DEVICE_AUTO;
    cfg->device.index = -1;
}

bn_status bn_config_set(bn_config *cfg, const char *name, const char *value, bn_error *err)
{
    if (!cfg || !name || !value)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "bn_config_set: NULL argument");
    for (size_t i = 0; i < N_VARIABLES; i++) {
        if (strcmp(name, variables[i].name) != 0)
            continue;
        if (variables[i].parse(cfg, value))
            return BN_OK;
        return bn_error_set(err, BN_ERR_INVALID_CONFIG, "fix or unset the variable",
                            "%s='%.100s' is not valid: expected %s", name, value,
                            variables[i].accepted);
    }
    return bn_error_set(err, BN_ERR_INVALID_CONFIG, "run 'bitnet --help' for the list of variables",
                        "%s is not a variable bitnet knows", name);
}

extern char **environ;

/* A misspelt variable (BITNET_NUM_THREAD) would otherwise do nothing at all. */
static void warn_unknown_variables(void)
{
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "BITNET_", 7) != 0)
            continue;
        size_t len = strcspn(*e, "=");
        bool known = false;
        for (size_t i = 0; i < N_VARIABLES && !known; i++)
            known = strlen(variables[i].name) == len && strncmp(*e, variables[i].name, len) == 0;
        if (!known)
            bn_log(BN_LOG_WARN, "ignoring unknown environment variable %.*s", (int)len, *e);
    }
}

bn_status bn_config_from_env(bn_config *cfg, bn_error *err)
{
    if (!cfg)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "bn_config_from_env: NULL config");
    bn_config_defaults(cfg);
    for (size_t i = 0; i < N_VARIABLES; i++) {
        const char *v = getenv(variables[i].name);
        if (!v)
            continue;
        bn_status st = bn_config_set(cfg, variables[i].name, v, err);
        if (st != BN_OK)
            return st;
    }
    warn_unknown_variables();
    return BN_OK;
}
