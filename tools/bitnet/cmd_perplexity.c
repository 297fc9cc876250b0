/* bitnet perplexity: how well a model predicts a text. The result goes to
 * stdout; the startup line and progress go to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define CMD "perplexity"
#define DEFAULT_CTX 512

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet perplexity [-m MODEL] -f TEXT [options]\n"
            "\n"
            "Perplexity of a model over a text file: the text is tokenized as a whole and cut\n"
            "into consecutive chunks; each chunk runs from position 0 as BOS + ctx - 1 tokens\n"
            "and every token of it is predicted. perplexity = exp(mean negative log-likelihood\n"
            "per token). The result goes to stdout, progress to stderr.\n"
            "\n"
            "  -m, --model MODEL   GGUF file or Hugging Face model directory (default:\n"
            "                      BITNET_MODEL, else the shipped default model)\n"
            "  -f, --file TEXT     the text file ('-' reads stdin)\n"
            "      --ctx N         positions per chunk, BOS included (default 512, or the\n"
            "                      model's training context if smaller)\n"
            "      --device D      auto, cpu, gpu, cuda[:N], vulkan[:N] (default:\n"
            "                      BITNET_DEVICE, else auto)\n"
            "      --threads N     CPU threads (default: BITNET_NUM_THREADS, else every core)\n"
            "      --kv f32|f16    the KV cache's precision on a GPU (default f32; the CPU\n"
            "                      keeps fp32; fp8 is the batching engine's only)\n"
            "      --json          print the result as one JSON object\n"
            "      --max-file-mib N  refuse a text file of more than N MiB (default %d)\n"
            "      --help          show this help\n"
            "\n"
            "exit codes: 2 bad command line, a text too short or over --max-file-mib, 4 device\n"
            "unusable, 5 a model or text file that cannot be read, or a malformed or\n"
            "unsupported one, 6 out of memory.\n",
            CLI_MAX_FILE_MIB_DEFAULT);
}

typedef struct ppl_opts {
    const char *model, *file, *device;
    long long ctx, threads;
    size_t max_file_bytes;
    bool json;
    bn_kv_precision kv;
} ppl_opts;

/* 0 = parsed, -1 = --help, otherwise the exit code. */
static int parse(int argc, char **argv, ppl_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_file_bytes = (size_t)CLI_MAX_FILE_MIB_DEFAULT << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
#define VALUE()                                                                                    \
    do {                                                                                           \
        if (!(v = cli_value(argc, argv, &i, CMD)))                                                 \
            return BN_EXIT_USAGE;                                                                  \
    } while (0)
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        } else if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) {
            VALUE();
            o->model = v;
        } else if (strcmp(a, "-f") == 0 || strcmp(a, "--file") == 0) {
            VALUE();
            o->file = v;
        } else if (strcmp(a, "--ctx") == 0 || strcmp(a, "-c") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 2, 1 << 24, &o->ctx))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--device") == 0) {
            VALUE();
            if (!cli_check_device(CMD, v))
                return BN_EXIT_USAGE;
            o->device = v;
        } else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, 4096, &o->threads))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--kv") == 0) {
            VALUE();
            if (!cli_parse_kv(CMD, v, &o->kv))
                return BN_EXIT_USAGE;
            if (o->kv == BN_KV_FP8) {
                fprintf(stderr, "bitnet perplexity: error: --kv fp8 is the batching engine's "
                                "paged cache; one sequence runs over f32 or f16\n");
                return BN_EXIT_USAGE;
            }
        } else if (strcmp(a, "--json") == 0) {
            o->json = true;
        } else if (strcmp(a, "--max-file-mib") == 0) {
            VALUE();
            if (!cli_parse_max_file_mib(CMD, v, &o->max_file_bytes))
                return BN_EXIT_USAGE;
        } else {
            fprintf(stderr, "bitnet perplexity: error: unknown option '%s'\n", a);
            usage(stderr);
            return BN_EXIT_USAGE;
        }
#undef VALUE
    }
    if (!o->file) {
        fprintf(stderr, "bitnet perplexity: error: no text: give -f FILE\n"
                        "bitnet: hint: 'bitnet perplexity --help' lists the options\n");
        return BN_EXIT_USAGE;
    }
    return 0;
}

typedef struct progress_state {
    bool tty;
    int last_tenth;
} progress_state;

/* On a terminal one line rewritten after each chunk; otherwise a line at
 * every tenth of the chunks. */
static void on_progress(void *ctx, int64_t chunk, int64_t n_chunks, const bn_perplexity *r)
{
    progress_state *p = ctx;
    const int tenth = (int)(chunk * 10 / n_chunks);
    if (!p->tty && tenth == p->last_tenth && chunk != n_chunks)
        return;
    p->last_tenth = tenth;
    fprintf(stderr, "%s[%lld/%lld] %lld tokens, perplexity so far %.4f, %.0f tok/s%s",
            p->tty ? "\r" : "", (long long)chunk, (long long)n_chunks,
            (long long)r->n_predicted, r->perplexity,
            r->seconds > 0 ? (double)r->n_predicted / r->seconds : 0.0,
            p->tty && chunk != n_chunks ? "" : "\n");
}

/* Built on the public API of bitnet.h alone. */
int cmd_perplexity(int argc, char **argv, const bn_config *cfg)
{
    (void)cfg; /* bn_model_open reads the environment itself */
    ppl_opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? BN_EXIT_OK : rc;

    bn_error err;
    bn_error_clear(&err);
    size_t len = 0;
    char *text = cli_read_all(o.file, "the text file", o.max_file_bytes, &len, &err);
    if (!text)
        return cli_fail(&err);

    bn_model_options mo;
    bn_model_options_default(&mo);
    mo.path = o.model; /* NULL: BITNET_MODEL, else the shipped model */
    mo.device = o.device;
    mo.n_threads = (int)o.threads;
    mo.n_ctx = o.ctx;
    mo.kv = o.kv;
    bn_model *m = NULL;
    bn_model_info info;
    if (bn_model_open(&mo, &m, &err) != BN_OK || bn_model_get_info(m, &info, &err) != BN_OK) {
        bn_model_close(m);
        free(text);
        return cli_fail(&err);
    }
    fprintf(stderr, "%s\n", info.selection);
    int64_t ctx = o.ctx;
    if (ctx == 0)
        ctx = info.n_ctx < DEFAULT_CTX ? info.n_ctx : DEFAULT_CTX;

    progress_state ps = {.tty = isatty(STDERR_FILENO) != 0, .last_tenth = 0};
    bn_perplexity r;
    const bn_status st = bn_model_perplexity(m, text, len, ctx, on_progress, &ps, &r, &err);
    free(text);
    if (st != BN_OK) {
        bn_model_close(m);
        return cli_fail(&err);
    }
    /* A GPU step that failed during the run: the CPU took over. */
    if (bn_model_get_info(m, &info, &err) != BN_OK) {
        bn_model_close(m);
        return cli_fail(&err);
    }
    if (o.json) {
        bn_json j;
        bn_json_init(&j, stdout);
        bn_json_begin_object(&j);
        bn_json_kv_string(&j, "model", info.path);
        bn_json_kv_string(&j, "file", o.file);
        bn_json_kv_string(&j, "device", info.device);
        bn_json_kv_int(&j, "ctx", r.ctx);
        bn_json_kv_int(&j, "chunks", r.n_chunks);
        bn_json_kv_int(&j, "text_tokens", r.n_text_tokens);
        bn_json_kv_int(&j, "predicted_tokens", r.n_predicted);
        bn_json_kv_double(&j, "mean_nll", r.mean_nll);
        bn_json_kv_double(&j, "perplexity", r.perplexity);
        bn_json_kv_double(&j, "seconds", r.seconds);
        bn_json_end_object(&j);
        fputc('\n', stdout);
    } else {
        printf("perplexity %.4f (mean negative log-likelihood %.6f nats over %lld tokens; %lld "
               "chunks of %lld positions; %s)\n",
               r.perplexity, r.mean_nll, (long long)r.n_predicted, (long long)r.n_chunks,
               (long long)r.ctx, info.device);
    }
    if (info.fallback[0])
        fprintf(stderr, "note: %s; computed on the CPU\n", info.fallback);
    bn_model_close(m);
    return BN_EXIT_OK;
}
