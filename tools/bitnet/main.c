/* bitnet - command-line entry point: global options, environment
 * configuration, and dispatch to one subcommand per file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static const struct command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv, const bn_config *cfg);
} commands[] = {
    {"devices", "show GPU backends, CUDA devices, CPU features and memory", cmd_devices},
    {"run", "generate text from a prompt with a model file or directory", cmd_run},
    {"chat", "an interactive conversation with a chat model", cmd_chat},
    {"inspect", "show a GGUF file's or Hugging Face directory's metadata and tensors", cmd_inspect},
    {"convert", "convert a Hugging Face BitNet directory to GGUF (i2_s, tq2_0, tq1_0, f16)",
     cmd_convert},
    {"perplexity", "perplexity of a model over a text file", cmd_perplexity},
    {"bench", "benchmarks: kernels against this machine's ceilings, end-to-end tok/s", cmd_bench},
#if defined(BITNET_HAVE_SERVER)
    {"serve", "an OpenAI-compatible HTTP server (chat, completions, streaming)", cmd_serve},
#endif
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void print_help(FILE *out)
{
    fprintf(out,
            "bitnet %s - run 1.58-bit (ternary) language models on NVIDIA GPUs and CPUs\n"
            "\n"
            "usage: bitnet [--help] [--version] <command> [options]\n"
            "\n"
            "commands:\n",
            bn_version());
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-11s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'bitnet <command> --help' describes a command's options.\n"
                 "\nenvironment variables (a malformed value is an error, exit code 3):\n");
    for (const char *const *n = bn_config_variable_names(); *n; n++)
        fprintf(out, "  %-29s %s\n", *n, bn_config_variable_accepted(*n));
    fprintf(out, "\nexit codes:\n"
                 "  0  success\n"
                 "  1  the command failed\n"
                 "  2  bad command line\n"
                 "  3  malformed BITNET_* environment variable\n"
                 "  4  requested device unusable (including strict-mode refusals)\n"
                 "  5  a file cannot be read or written, or is malformed or unsupported\n"
                 "  6  out of host or GPU memory\n");
}

int cli_exit_code(bn_status status)
{
    switch (status) {
    case BN_OK: return BN_EXIT_OK;
    case BN_ERR_INVALID_ARGUMENT: return BN_EXIT_USAGE;
    case BN_ERR_INVALID_CONFIG: return BN_EXIT_CONFIG;
    case BN_ERR_NO_DEVICE:
    case BN_ERR_DRIVER:
    case BN_ERR_FAKE_GPU: return BN_EXIT_DEVICE;
    /* A file that cannot be read or written, or whose content is malformed
     * or uses something this build does not support (a newer GGUF version,
     * an unknown tensor type or tokenizer model). */
    case BN_ERR_IO:
    case BN_ERR_FORMAT:
    case BN_ERR_UNSUPPORTED: return BN_EXIT_INPUT;
    case BN_ERR_OUT_OF_MEMORY:
    case BN_ERR_GPU_OUT_OF_MEMORY: return BN_EXIT_OUT_OF_MEMORY;
    default: return BN_EXIT_FAILURE;
    }
}

int cli_fail(const bn_error *err)
{
    fprintf(stderr, "bitnet: error: %s\n", err->message);
    if (err->hint[0])
        fprintf(stderr, "bitnet: hint: %s\n", err->hint);
    return cli_exit_code(err->status);
}

char *cli_read_all(const char *path, const char *what, size_t max_bytes, size_t *len,
                   bn_error *err)
{
    const bool is_stdin = strcmp(path, "-") == 0;
    const char *name = is_stdin ? "- (stdin)" : path;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        bn_error_set(err, BN_ERR_IO, "check the path", "cannot open %s %s: %s", what, name,
                     strerror(errno));
        return NULL;
    }
    /* Read at most max_bytes + 1: one byte more than the limit proves the
     * file is over it without reading the rest. */
    const size_t want = max_bytes < SIZE_MAX - 1 ? max_bytes + 1 : SIZE_MAX - 1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1 || n >= want)
            break; /* end of file or an error (told apart below), or over the limit */
        const size_t grown = cap <= SIZE_MAX / 2 ? cap * 2 : 0;
        const size_t next = grown > want + 1 ? want + 1 : grown;
        char *bigger = next ? realloc(buf, next) : NULL;
        if (!bigger)
            free(buf);
        buf = bigger;
        cap = next;
    }
    const bool failed = buf && ferror(f);
    const int read_errno = errno;
    if (!is_stdin)
        fclose(f);
    if (!buf) {
        bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory reading %s %s", what, name);
        return NULL;
    }
    if (failed) {
        free(buf);
        bn_error_set(err, BN_ERR_IO, NULL, "cannot read %s %s: %s", what, name,
                     strerror(read_errno));
        return NULL;
    }
    if (n > max_bytes) {
        free(buf);
        bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "raise the limit with --max-file-mib N",
                     "%s %s holds more than %zu MiB", what, name, max_bytes >> 20);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

uint64_t cli_choose_seed(const bn_config *cfg, const cli_gen_opts *o, bool *fixed)
{
    *fixed = true;
    if (o->have_seed)
        return o->seed;
    if (cfg && cfg->seed_set)
        return cfg->seed;
    if (cfg && cfg->deterministic)
        return 0;
    *fixed = false;
    uint64_t r = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        const bool ok = fread(&r, sizeof r, 1, f) == 1;
        fclose(f);
        if (ok)
            return r;
    }
    /* No entropy source: the clock and the process id still differ per run. */
    return bn_time_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
}

void cli_gen_defaults(cli_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->temperature = 0.8f;
    o->top_k = 40;
    o->top_p = 0.95f;
    o->min_p = 0.05f;
    o->repeat_penalty = 1.0f;
    o->repeat_last_n = 64;
}

int cli_gen_option(int argc, char **argv, int *i, const char *cmd, cli_gen_opts *o)
{
    const char *a = argv[*i];
    static const char *const names[] = {"--temp",           "--top-k",          "--top-p",
                                        "--min-p",          "--repeat-penalty", "--repeat-last-n",
                                        "--seed",           "--device",         "--threads",
                                        "-t",               "--ctx",            "-c",
                                        "--kv",             "--tensor-parallel"};
    bool known = false;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        known |= strcmp(a, names[k]) == 0;
    if (!known)
        return 0;
    const char *v = cli_value(argc, argv, i, cmd);
    if (!v)
        return -1;
    long long n = 0;
    bool ok = true;
    if (strcmp(a, "--temp") == 0) {
        ok = cli_parse_float(cmd, a, v, 0.0, 100.0, &o->temperature);
    } else if (strcmp(a, "--top-k") == 0) {
        ok = cli_parse_i64(cmd, a, v, 0, 1 << 24, &n);
        o->top_k = (int)n;
    } else if (strcmp(a, "--top-p") == 0) {
        ok = cli_parse_float(cmd, a, v, 0.0, 1.0, &o->top_p);
    } else if (strcmp(a, "--min-p") == 0) {
        ok = cli_parse_float(cmd, a, v, 0.0, 1.0, &o->min_p);
    } else if (strcmp(a, "--repeat-penalty") == 0) {
        ok = cli_parse_float(cmd, a, v, 0.01, 100.0, &o->repeat_penalty);
    } else if (strcmp(a, "--repeat-last-n") == 0) {
        ok = cli_parse_i64(cmd, a, v, -1, 1 << 24, &n);
        o->repeat_last_n = (int)n;
    } else if (strcmp(a, "--seed") == 0) {
        ok = o->have_seed = cli_parse_u64(cmd, a, v, &o->seed);
    } else if (strcmp(a, "--device") == 0) {
        ok = cli_check_device(cmd, v);
        o->device = v;
    } else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) {
        ok = cli_parse_i64(cmd, a, v, 1, 4096, &o->threads);
    } else if (strcmp(a, "--ctx") == 0 || strcmp(a, "-c") == 0) {
        ok = cli_parse_i64(cmd, a, v, 1, 1 << 24, &o->ctx);
    } else if (strcmp(a, "--tensor-parallel") == 0) {
        ok = cli_parse_i64(cmd, a, v, 1, BN_DEVICE_LIST_MAX, &o->tensor_parallel);
    } else { /* --kv */
        ok = cli_parse_kv(cmd, v, &o->kv);
    }
    return ok ? 1 : -1;
}

void cli_gen_model_options(const cli_gen_opts *o, const char *model, bn_model_options *mo)
{
    bn_model_options_default(mo);
    mo->path = model;
    mo->device = o->device;
    mo->n_threads = (int)o->threads;
    mo->n_ctx = o->ctx;
    mo->kv = o->kv;
    mo->tensor_parallel = (int)o->tensor_parallel;
}

void cli_gen_params(const cli_gen_opts *o, bn_generate_params *gp)
{
    bn_generate_params_default(gp);
    gp->temperature = o->temperature;
    gp->top_k = o->top_k;
    gp->top_p = o->top_p;
    gp->min_p = o->min_p;
    gp->repeat_penalty = o->repeat_penalty;
    gp->repeat_last_n = o->repeat_last_n;
}

bool cli_parse_max_file_mib(const char *cmd, const char *text, size_t *bytes)
{
    long long mib;
    if (!cli_parse_i64(cmd, "--max-file-mib", text, 1, CLI_MAX_FILE_MIB_MAX, &mib))
        return false;
    *bytes = (size_t)mib << 20;
    return true;
}

/* ---- option values shared by the subcommands ------------------------------ */

const char *cli_value(int argc, char **argv, int *i, const char *cmd)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "bitnet %s: error: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool cli_parse_i64(const char *cmd, const char *opt, const char *text, long long lo, long long hi,
                   long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || errno == ERANGE || v < lo || v > hi) {
        fprintf(stderr, "bitnet %s: error: %s must be an integer from %lld to %lld, not '%s'\n",
                cmd, opt, lo, hi, text);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_u64(const char *cmd, const char *opt, const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    /* strtoull accepts "-1" as a huge number: refuse signs outright. */
    if (end == text || *end || errno == ERANGE || text[0] == '-' || text[0] == '+') {
        fprintf(stderr, "bitnet %s: error: %s must be an integer from 0 to 2^64-1, not '%s'\n",
                cmd, opt, text);
        return false;
    }
    *out = v;
    return true;
}

bool cli_check_device(const char *cmd, const char *text)
{
    bn_device_request req;
    if (bn_parse_device_request(text, &req))
        return true;
    fprintf(stderr, "bitnet %s: error: --device must be auto, cpu, gpu, cuda, cuda:N, "
                    "cuda:N,M,..., cuda:all, vulkan or vulkan:N, not '%s'\n",
            cmd, text);
    return false;
}

bool cli_parse_kv(const char *cmd, const char *text, bn_kv_precision *out)
{
    static const struct {
        const char *name;
        bn_kv_precision kv;
    } kinds[] = {{"f32", BN_KV_F32}, {"f16", BN_KV_F16}, {"fp8", BN_KV_FP8}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(text, kinds[i].name) == 0) {
            *out = kinds[i].kv;
            return true;
        }
    fprintf(stderr, "bitnet %s: error: --kv must be f32, f16 or fp8, not '%s'\n", cmd, text);
    return false;
}

bool cli_parse_float(const char *cmd, const char *opt, const char *text, double lo, double hi,
                     float *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno == ERANGE || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "bitnet %s: error: %s must be a number from %g to %g, not '%s'\n", cmd,
                opt, lo, hi, text);
        return false;
    }
    *out = (float)v;
    return true;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_help(stderr);
        return BN_EXIT_USAGE;
    }
    const char *first = argv[1];
    if (strcmp(first, "--help") == 0 || strcmp(first, "-h") == 0 || strcmp(first, "help") == 0) {
        print_help(stdout);
        return BN_EXIT_OK;
    }
    if (strcmp(first, "--version") == 0 || strcmp(first, "-V") == 0) {
        printf("bitnet %s\n", bn_version());
        return BN_EXIT_OK;
    }

    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(first, commands[i].name) != 0)
            continue;
        bn_config cfg;
        bn_error err;
        bn_error_clear(&err);
        if (bn_config_from_env(&cfg, &err) != BN_OK)
            return cli_fail(&err);
        bn_log_set_level(cfg.log_level);
        return commands[i].run(argc - 1, argv + 1, &cfg);
    }
    fprintf(stderr, "bitnet: error: unknown command '%s'\nbitnet: hint: 'bitnet --help' lists the "
                    "commands\n",
            first);
    return BN_EXIT_USAGE;
}
