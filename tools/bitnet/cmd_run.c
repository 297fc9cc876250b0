/* bitnet run: generate text from a prompt, or from each line of a prompt
 * file. The text goes to stdout as it is produced; the startup line,
 * timings and errors go to stderr, so stdout holds nothing but the model's
 * words. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define CMD "run"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet run [-m MODEL] (-p PROMPT | --prompt-ids LIST | --prompt-file FILE)\n"
            "                  [options]\n"
            "\n"
            "Generates text with a BitNet b1.58 model: a GGUF file (bitnet.cpp's I2_S,\n"
            "llama.cpp's TQ1_0/TQ2_0, ...) or a Hugging Face directory. Only the generated text\n"
            "is printed, to stdout, as it is produced; the startup line and timings go to stderr.\n"
            "\n"
            "  -m, --model MODEL      GGUF file or Hugging Face model directory (default:\n"
            "                         BITNET_MODEL, else the small model shipped with bitnet,\n"
            "                         bitnet-kjv-7m, trained on the King James Bible)\n"
            "  -p, --prompt TEXT      the prompt; special tokens such as <|eot_id|> written in\n"
            "                         it are read as those tokens; BOS is added when the\n"
            "                         tokenizer asks for it\n"
            "      --prompt-ids LIST  the prompt as comma-separated token ids instead of -p, used\n"
            "                         exactly as given (nothing added; e.g. from a receipt)\n"
            "      --prompt-file FILE one prompt per line ('-' reads stdin; empty lines are\n"
            "                         skipped), each run as its own request with the same\n"
            "                         options and seed (a line gives the text -p LINE gives);\n"
            "                         each response is followed by a newline, and stderr gets a\n"
            "                         'request i/N' line per request and a summary. The next\n"
            "                         prompt is tokenized on a second thread while the current\n"
            "                         one generates. Not with --receipt or\n"
            "                         --dump-logits, which describe one request\n"
            "      --max-file-mib N   refuse a prompt file of more than N MiB (default %d)\n"
            "      --parallel N       with --prompt-file: run up to N prompts at once in shared\n"
            "                         forward passes (continuous batching; default 1); each\n"
            "                         response is the text its own run gives, printed in the\n"
            "                         file's order once all have finished\n"
            "      --batch-tokens N   with --parallel: rows of a shared pass, one per decoding\n"
            "                         prompt, then prompt chunks up to N in all (default 512)\n"
            "      --kv-cache-mib N   with --parallel: the paged KV cache's size (default room\n"
            "                         for N full contexts); too small a cache makes sequences\n"
            "                         wait and be computed again, never changing their text\n"
            "      --kv-block N       positions per KV block (default 32)\n"
            "      --kv-evict P       lru, fifo or lfu: which cached prompt prefix goes first\n"
            "                         (default lru)\n"
            "      --no-prefix-sharing  compute every prompt's prefix itself, even when an\n"
            "                         earlier prompt's is in the cache\n"
            "  -n, --n-predict N      tokens to generate at most (default 128); generation also\n"
            "                         stops at an end-of-generation token\n"
            "      --chat             wrap the prompt in the BitNet b1.58 2B-4T chat format\n"
            "      --system TEXT      system message for --chat\n"
            "\n"
            "sampling (order: repeat penalty, top-k, temperature, top-p, min-p):\n"
            "      --temp T           temperature (default 0.8); 0 = greedy (always the most\n"
            "                         likely token, no randomness)\n"
            "      --top-k K          keep the K most likely tokens (default 40; 0 = off)\n"
            "      --top-p P          keep the smallest set with probability >= P (default 0.95;\n"
            "                         1 = off)\n"
            "      --min-p P          drop tokens below P x the top probability (default 0.05;\n"
            "                         0 = off)\n"
            "      --repeat-penalty R penalise tokens seen in the last --repeat-last-n tokens\n"
            "                         (default 1.0 = off)\n"
            "      --repeat-last-n N  tokens the penalty looks back (default 64; -1 = all)\n"
            "      --seed S           sampling seed (default: BITNET_SEED, 0 under\n"
            "                         BITNET_DETERMINISTIC=1, else random)\n"
            "\n"
            "engine:\n"
            "      --device D         auto, cpu, gpu, cuda[:N], vulkan[:N]; cuda:N,M,... or\n"
            "                         cuda:all: a replica on each device for --parallel (default:\n"
            "                         BITNET_DEVICE, else auto: the GPU when CUDA is usable,\n"
            "                         then a Vulkan GPU, else the CPU; a GPU\n"
            "                         failure under auto falls back to the CPU unless\n"
            "                         BITNET_STRICT_MODE=1)\n"
            "      --threads N        CPU threads (default: BITNET_NUM_THREADS, else every core)\n"
            "      --ctx N            context (KV cache) positions (default: the model's training\n"
            "                         context); prompt + -n must fit\n"
            "      --kv f32|f16|fp8   CUDA KV cache precision (default f32: the CPU's numbers;\n"
            "                         f16 halves its memory and bandwidth, and logits may then\n"
            "                         differ from the CPU's by ~1e-2 of their range; fp8, with\n"
            "                         --parallel, keeps the shared passes' cache in 8-bit\n"
            "                         floats, a quarter of f32's, at a larger error: one\n"
            "                         prompt alone runs over f16)\n"
            "      --tensor-parallel N  split the model across N CUDA GPUs (NCCL): --device\n"
            "                         cuda:0,1 names them, cuda takes the first N; requests\n"
            "                         then run one at a time\n"
            "\n"
            "output:\n"
            "      --receipt FILE     write a JSON receipt of the run (see docs/CLI.md)\n"
            "      --dump-logits FILE write the logits after the prompt, one per line\n"
            "      --verbose          model details, memory and info-level logs on stderr\n"
            "      --help             show this help\n"
            "\n"
            "exit codes: 2 bad command line or request (e.g. longer than the context, a prompt\n"
            "file over --max-file-mib), 4 device unusable, 5 a model, prompt or output file\n"
            "that cannot be read or written, or a malformed or unsupported one, 6 out of\n"
            "memory.\n",
            CLI_MAX_FILE_MIB_DEFAULT);
}

typedef struct run_opts {
    const char *model, *prompt, *system, *receipt, *dump_logits, *prompt_file;
    int32_t *ids; /* --prompt-ids */
    size_t n_ids;
    long long n_predict;
    size_t max_file_bytes; /* --max-file-mib */
    long long parallel, kv_mib, kv_block; /* --parallel, --kv-cache-mib, --kv-block */
    long long batch_tokens;               /* --batch-tokens                          */
    bn_kv_evict kv_evict;
    bool no_prefix_sharing;
    bool chat, verbose;
    cli_gen_opts gen;       /* sampling and engine options shared with chat */
    bn_generate_params gp;  /* gen's sampling and -n, as the library takes them */
} run_opts;

/* "1,22,333" -> ids (malloc'ed). */
static bool parse_ids(const char *text, run_opts *o)
{
    size_t n = 1;
    for (const char *p = text; *p; p++)
        n += *p == ',';
    o->ids = malloc(n * sizeof *o->ids);
    if (!o->ids)
        return false;
    o->n_ids = 0;
    const char *p = text;
    for (;;) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            fprintf(stderr, "bitnet run: error: --prompt-ids must be token ids separated by "
                            "commas, not '%s'\n", text);
            return false;
        }
        o->ids[o->n_ids++] = (int32_t)v;
        if (*end == '\0')
            return true;
        p = end + 1;
    }
}

/* 0 = parsed, otherwise the exit code to return. */
static int parse(int argc, char **argv, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->max_file_bytes = (size_t)CLI_MAX_FILE_MIB_DEFAULT << 20;
    cli_gen_defaults(&o->gen);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        const int shared = cli_gen_option(argc, argv, &i, CMD, &o->gen);
        if (shared < 0)
            return BN_EXIT_USAGE;
        if (shared > 0)
            continue;
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
        } else if (strcmp(a, "-p") == 0 || strcmp(a, "--prompt") == 0) {
            VALUE();
            o->prompt = v;
        } else if (strcmp(a, "--prompt-ids") == 0) {
            VALUE();
            free(o->ids);
            if (!parse_ids(v, o))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--prompt-file") == 0) {
            VALUE();
            o->prompt_file = v;
        } else if (strcmp(a, "--parallel") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, 4096, &o->parallel))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--batch-tokens") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, BN_BATCH_TOKENS_MAX, &o->batch_tokens))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--kv-cache-mib") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, 1 << 24, &o->kv_mib))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--kv-block") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, 1024, &o->kv_block))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--kv-evict") == 0) {
            VALUE();
            if (strcmp(v, "lru") == 0) {
                o->kv_evict = BN_KV_EVICT_LRU;
            } else if (strcmp(v, "fifo") == 0) {
                o->kv_evict = BN_KV_EVICT_FIFO;
            } else if (strcmp(v, "lfu") == 0) {
                o->kv_evict = BN_KV_EVICT_LFU;
            } else {
                fprintf(stderr, "bitnet run: error: --kv-evict takes lru, fifo or lfu, not '%s'\n",
                        v);
                return BN_EXIT_USAGE;
            }
        } else if (strcmp(a, "--no-prefix-sharing") == 0) {
            o->no_prefix_sharing = true;
        } else if (strcmp(a, "--max-file-mib") == 0) {
            VALUE();
            if (!cli_parse_max_file_mib(CMD, v, &o->max_file_bytes))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "-n") == 0 || strcmp(a, "--n-predict") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, 1 << 24, &o->n_predict))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--chat") == 0) {
            o->chat = true;
        } else if (strcmp(a, "--system") == 0) {
            VALUE();
            o->system = v;
        } else if (strcmp(a, "--receipt") == 0) {
            VALUE();
            o->receipt = v;
        } else if (strcmp(a, "--dump-logits") == 0) {
            VALUE();
            o->dump_logits = v;
        } else if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
            o->verbose = true;
        } else {
            fprintf(stderr, "bitnet run: error: unknown option '%s'\n", a);
            usage(stderr);
            return BN_EXIT_USAGE;
        }
#undef VALUE
    }
    cli_gen_params(&o->gen, &o->gp);
    o->gp.max_tokens = (int)o->n_predict;
    if (!o->prompt && !o->ids && !o->prompt_file) {
        fprintf(stderr, "bitnet run: error: no prompt: give -p PROMPT (or --prompt-file FILE)\n");
        fprintf(stderr, "bitnet: hint: 'bitnet run --help' lists the options\n");
        return BN_EXIT_USAGE;
    }
    if (o->prompt_file) {
        if (o->prompt || o->ids) {
            fprintf(stderr, "bitnet run: error: give one of -p, --prompt-ids or --prompt-file\n");
            return BN_EXIT_USAGE;
        }
        if (o->receipt || o->dump_logits) {
            fprintf(stderr, "bitnet run: error: %s describes one request; it does not apply to "
                            "--prompt-file (run that prompt alone with -p)\n",
                    o->receipt ? "--receipt" : "--dump-logits");
            return BN_EXIT_USAGE;
        }
    }
    const bool batch_flags = o->kv_mib || o->kv_block || o->no_prefix_sharing ||
                             o->kv_evict != BN_KV_EVICT_LRU || o->batch_tokens;
    if ((o->parallel > 1 || batch_flags) && !o->prompt_file) {
        fprintf(stderr, "bitnet run: error: --parallel, --batch-tokens and the --kv-* options "
                        "apply to --prompt-file (several prompts)\n");
        return BN_EXIT_USAGE;
    }
    if (batch_flags && o->parallel <= 1) {
        fprintf(stderr, "bitnet run: error: --batch-tokens and the --kv-* options shape the "
                        "passes and cache of --parallel N (N > 1)\n");
        return BN_EXIT_USAGE;
    }
    if (o->prompt && o->ids) {
        fprintf(stderr, "bitnet run: error: give -p or --prompt-ids, not both\n");
        return BN_EXIT_USAGE;
    }
    if (o->ids && o->chat) {
        fprintf(stderr, "bitnet run: error: --chat formats a text prompt; it does not apply to "
                        "--prompt-ids\n");
        return BN_EXIT_USAGE;
    }
    if (o->system && !o->chat) {
        fprintf(stderr, "bitnet run: error: --system only applies with --chat\n");
        return BN_EXIT_USAGE;
    }
    return 0;
}

/* The text on stdout has begun a line it has not ended. */
static bool text_line_open;

static bool print_text(void *ctx, int32_t token, const char *text, size_t len)
{
    (void)ctx;
    (void)token;
    if (len > 0) {
        fwrite(text, 1, len, stdout);
        fflush(stdout); /* stream: a reader sees each word as it comes */
        text_line_open = text[len - 1] != '\n';
    }
    return true;
}

/* On a terminal, ends the generated text's line, so that what follows it
 * there (stderr's timings or error, the shell's prompt) starts on a line
 * of its own; stdout that is a file or a pipe holds the model's text
 * alone, byte for byte. */
static void end_text_line(void)
{
    if (text_line_open && isatty(STDOUT_FILENO))
        fputc('\n', stdout);
    text_line_open = false;
    fflush(stdout);
}

static double rate(double count, double seconds) { return seconds > 0.0 ? count / seconds : 0.0; }

static void print_verbose(bn_model *m)
{
    bn_model_info info;
    bn_model_stats st;
    if (bn_model_get_info(m, &info, NULL) != BN_OK || bn_model_get_stats(m, &st, NULL) != BN_OK)
        return;
    const double mib = 1024.0 * 1024.0;
    fprintf(stderr,
            "model: %s\n  %s\n  %d layers, dim %d, ffn %d, heads %d/%d (head_dim %d), vocab %d, "
            "trained context %lld\n  context %lld positions\n"
            "memory: model weights %.1f MiB, backend %.1f MiB (weights %.1f, KV cache %.1f, "
            "scratch %.1f)\n",
            info.path, info.flavour, info.n_layer, info.dim, info.ffn_dim, info.n_head,
            info.n_head_kv, info.head_dim, info.vocab_size,
            (long long)info.n_ctx_train, (long long)info.n_ctx,
            (double)st.model_weight_bytes / mib, (double)st.total_bytes / mib,
            (double)st.weights_bytes / mib, (double)st.kv_cache_bytes / mib,
            (double)st.scratch_bytes / mib);
    if (st.gpu)
        fprintf(stderr,
                "gpu memory: %s %s: %.1f MiB (ternary weights %.1f, embedding %.1f, "
                "LM head %.1f, its int8 copy %.1f, norms %.2f, KV cache %.1f (%s, %lld "
                "positions), scratch %.1f); "
                "peak %.1f MiB; %.1f of %.1f GiB free after loading; decode %s\n",
                info.device, info.device_name, (double)st.gpu_total_bytes / mib,
                (double)st.gpu_weights_bytes / mib, (double)st.gpu_embedding_bytes / mib,
                (double)st.gpu_lm_head_bytes / mib, (double)st.gpu_lm_head_screen_bytes / mib,
                (double)st.gpu_norms_bytes / mib, (double)st.gpu_kv_cache_bytes / mib, st.kv_type,
                (long long)info.n_ctx, (double)st.gpu_scratch_bytes / mib,
                (double)st.gpu_peak_bytes / mib,
                (double)st.gpu_device_free_bytes / (1024.0 * mib),
                (double)st.gpu_device_total_bytes / (1024.0 * mib),
                st.gpu_graphs ? "replays a CUDA graph" : "launches kernels one by one");
    if (st.gpu) {
        char limit[48] = "no limit";
        if (st.gpu_pool_limit_bytes)
            snprintf(limit, sizeof limit, "limit %.1f MiB", (double)st.gpu_pool_limit_bytes / mib);
        fprintf(stderr,
                "gpu pool:   %llu buffers, %.1f MiB held from the driver (peak %.1f MiB), %s, "
                "%llu allocations, %llu refused\n",
                (unsigned long long)st.gpu_pool_buffers, (double)st.gpu_pool_reserved_bytes / mib,
                (double)st.gpu_pool_peak_reserved_bytes / mib, limit,
                (unsigned long long)st.gpu_pool_allocations,
                (unsigned long long)st.gpu_pool_failures);
    }
    if (info.fallback[0])
        fprintf(stderr, "note: %s; computing on the CPU\n", info.fallback);
}

/* An output file (--dump-logits, --receipt) that cannot be created or
 * written: exit code 5, as for any file, whichever step failed. */
static int output_failed(const char *what, const char *path, int errnum)
{
    bn_error err;
    bn_error_set(&err, BN_ERR_IO, "check that the directory exists, is writable and has space",
                 "cannot write the %s %s: %s", what, path, strerror(errnum ? errnum : EIO));
    return cli_fail(&err);
}

static int write_logits(const char *path, const float *logits, int32_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return output_failed("logits", path, errno);
    for (int32_t i = 0; i < n; i++)
        fprintf(f, "%.9g\n", logits[i]);
    const bool write_error = ferror(f) != 0;
    if (fclose(f) != 0 || write_error)
        return output_failed("logits", path, errno);
    return BN_EXIT_OK;
}

static int write_receipt(const char *path, const bn_session *s, const bn_receipt_options *ro)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return output_failed("receipt", path, errno);
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_session_write_receipt(s, ro, f, &err);
    if (fclose(f) != 0 && st == BN_OK)
        return output_failed("receipt", path, errno);
    return st == BN_OK ? BN_EXIT_OK : cli_fail(&err);
}

/* After the run (--verbose): the kernels that ran and the GPU's work. */
static void print_verbose_work(bn_model *m)
{
    bn_model_info info;
    bn_model_stats st;
    if (bn_model_get_info(m, &info, NULL) != BN_OK || bn_model_get_stats(m, &st, NULL) != BN_OK)
        return;
    fprintf(stderr, "kernels     %s\n", st.kernels);
    if (st.gpu)
        fprintf(stderr,
                "gpu work    %llu kernel launches; host to device %llu copies, %.1f MiB; "
                "device to host %llu copies, %.1f KiB (since loading)\n",
                (unsigned long long)st.gpu_kernel_launches,
                (unsigned long long)st.gpu_h2d_transfers,
                (double)st.gpu_h2d_bytes / (1024.0 * 1024.0),
                (unsigned long long)st.gpu_d2h_transfers, (double)st.gpu_d2h_bytes / 1024.0);
    if (info.fallback[0]) /* a step may have failed during generation */
        fprintf(stderr, "note: %s; computed on the CPU\n", info.fallback);
}

/* The prompt text of a request: -p's text, or with --chat the model's chat
 * format around it (malloc'ed); NULL after an error set in err. */
static char *prompt_text(bn_model *m, const run_opts *o, const char *prompt, bn_error *err)
{
    if (!o->chat)
        return strdup(prompt);
    bn_chat_message msgs[2];
    size_t n = 0;
    if (o->system && o->system[0])
        msgs[n++] = (bn_chat_message){"system", o->system};
    msgs[n++] = (bn_chat_message){"user", prompt};
    size_t len = 0;
    if (bn_model_apply_chat(m, msgs, n, true, NULL, 0, &len, err) != BN_OK)
        return NULL;
    char *text = malloc(len + 1);
    if (!text) {
        bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the chat prompt");
        return NULL;
    }
    if (bn_model_apply_chat(m, msgs, n, true, text, len + 1, &len, err) != BN_OK) {
        free(text);
        return NULL;
    }
    return text;
}

/* ---- --prompt-file ---------------------------------------------------------
 * The prompts are read (and checked) before the model is loaded, so a bad
 * file costs nothing. Request i + 1 is tokenized on a worker thread while
 * request i generates on this one (the library's tokenizer may be used
 * while the model computes). Each request runs in a fresh session. */

typedef struct prompt_list {
    char *buf;          /* the file; each prompt NUL-terminated in place */
    const char **text;  /* the prompts, empty lines left out */
    size_t *line;       /* each prompt's line number (from 1) */
    size_t n;
    const char *name;   /* the path, or "- (stdin)" */
} prompt_list;

static void prompt_list_free(prompt_list *pl)
{
    free(pl->buf);
    free(pl->text);
    free(pl->line);
    memset(pl, 0, sizeof *pl);
}

/* One prompt per line: a trailing '\r' is dropped and empty lines are
 * skipped. 0 or the exit code after an error printed. */
static int read_prompts(const char *path, size_t max_bytes, prompt_list *pl)
{
    memset(pl, 0, sizeof *pl);
    pl->name = strcmp(path, "-") == 0 ? "- (stdin)" : path;
    size_t len = 0;
    bn_error err;
    bn_error_clear(&err);
    if (!(pl->buf = cli_read_all(path, "the prompt file", max_bytes, &len, &err)))
        return cli_fail(&err);
    size_t max_lines = 1;
    for (size_t i = 0; i < len; i++)
        max_lines += pl->buf[i] == '\n';
    pl->text = malloc(max_lines * sizeof *pl->text);
    pl->line = malloc(max_lines * sizeof *pl->line);
    if (!pl->text || !pl->line) {
        fprintf(stderr, "bitnet run: error: out of memory reading the prompt file %s\n",
                pl->name);
        prompt_list_free(pl);
        return BN_EXIT_OUT_OF_MEMORY;
    }
    size_t line = 0;
    for (size_t start = 0; start < len;) {
        line++;
        const char *nl = memchr(pl->buf + start, '\n', len - start);
        const size_t next = nl ? (size_t)(nl - pl->buf) + 1 : len;
        size_t end = nl ? next - 1 : len;
        if (end > start && pl->buf[end - 1] == '\r')
            end--;
        /* A prompt is a C string: a NUL inside would silently cut it. */
        if (memchr(pl->buf + start, '\0', end - start)) {
            fprintf(stderr, "bitnet run: error: line %zu of the prompt file %s holds a NUL "
                            "byte; prompts are text\n", line, pl->name);
            prompt_list_free(pl);
            return BN_EXIT_INPUT;
        }
        if (end > start) {
            pl->buf[end] = '\0';
            pl->text[pl->n] = pl->buf + start;
            pl->line[pl->n] = line;
            pl->n++;
        }
        start = next;
    }
    if (pl->n == 0) {
        fprintf(stderr, "bitnet run: error: the prompt file %s holds no prompt (one prompt per "
                        "line; empty lines are skipped)\n", pl->name);
        prompt_list_free(pl);
        return BN_EXIT_USAGE;
    }
    return 0;
}

/* A request's tokens, written by the worker thread; `done` is set
 * (release) once everything else is written, so the generating thread may
 * read them as soon as it sees it (acquire). */
typedef struct next_tokens {
    bn_model *m;
    const run_opts *o;
    const char *prompt;
    int32_t *tokens;
    size_t n;
    bn_status status;
    bn_error err;
    double seconds;
    atomic_bool done;
} next_tokens;

/* The tokens a fresh session reads for the prompt: BOS first where the
 * tokenizer asks for it (a chat format writes it itself). */
static void tokenize_next(next_tokens *nt)
{
    bn_error_clear(&nt->err);
    nt->tokens = NULL;
    nt->n = 0;
    const double t0 = bn_time_seconds();
    char *text = prompt_text(nt->m, nt->o, nt->prompt, &nt->err);
    nt->status = text ? BN_OK : nt->err.status;
    size_t n = 0;
    if (text)
        nt->status = bn_model_tokenize(nt->m, text, strlen(text), true, NULL, 0, &n, &nt->err);
    if (nt->status == BN_OK && !(nt->tokens = malloc((n ? n : 1) * sizeof *nt->tokens)))
        nt->status = bn_error_set(&nt->err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a prompt");
    if (nt->status == BN_OK)
        nt->status = bn_model_tokenize(nt->m, text, strlen(text), true, nt->tokens, n, &nt->n,
                                       &nt->err);
    if (nt->status != BN_OK) {
        free(nt->tokens);
        nt->tokens = NULL;
    }
    free(text);
    nt->seconds = bn_time_seconds() - t0;
    atomic_store_explicit(&nt->done, true, memory_order_release);
}

static void *tokenize_worker(void *arg)
{
    tokenize_next(arg);
    return NULL;
}

typedef struct batch_state {
    size_t streamed;  /* bytes of the current response written */
} batch_state;

static bool print_batch_text(void *ctx, int32_t token, const char *text, size_t len)
{
    batch_state *b = ctx;
    b->streamed += len;
    return print_text(NULL, token, text, len);
}

/* A request's failure: which request and line, then the error as
 * cli_fail prints it; returns its exit code. */
static int request_fail(const prompt_list *pl, size_t i, const bn_error *err)
{
    fprintf(stderr, "bitnet: error: request %zu/%zu (line %zu of %s): %s\n", i + 1, pl->n,
            pl->line[i], pl->name, err->message);
    if (err->hint[0])
        fprintf(stderr, "bitnet: hint: %s\n", err->hint);
    return cli_exit_code(err->status);
}

/* Runs every prompt of pl in order, each in a fresh session with o's
 * options; stops at the first request that fails, with its exit code. */
static int run_prompt_file(bn_model *m, bn_session *s, const run_opts *o, const prompt_list *pl)
{
    const double t_start = bn_time_seconds();
    next_tokens next = {.m = m, .o = o};
    batch_state b = {0};

    /* Request 1's tokens, here: there is nothing yet to overlap them with. */
    next.prompt = pl->text[0];
    atomic_init(&next.done, false);
    tokenize_next(&next);
    if (next.status != BN_OK)
        return request_fail(pl, 0, &next.err);
    int32_t *cur = next.tokens;
    size_t n_cur = next.n;
    next.tokens = NULL;

    size_t overlapped = 0;
    double tokenize_seconds = 0.0, waited_seconds = 0.0;
    int rc = BN_EXIT_OK;
    for (size_t i = 0; i < pl->n; i++) {
        /* Request i + 1's tokens on the worker while request i generates. */
        const bool has_next = i + 1 < pl->n;
        bool threaded = false;
        pthread_t worker;
        if (has_next) {
            next.prompt = pl->text[i + 1];
            atomic_store(&next.done, false);
            int err_no = pthread_create(&worker, NULL, tokenize_worker, &next);
            threaded = err_no == 0;
            if (!threaded) /* still correct, only not overlapped */
                bn_log(BN_LOG_WARN, "could not start a thread to tokenize the next prompt "
                                    "(%s); tokenizing it after this request", strerror(err_no));
        }
        bn_generate_params gp = o->gp;
        gp.prompt_tokens = cur;
        gp.n_prompt_tokens = n_cur;
        bn_session_reset(s);
        b.streamed = 0;
        bn_generate_result r;
        bn_error err;
        bn_error_clear(&err);
        const bn_status st = bn_session_generate(s, &gp, print_batch_text, &b, &r, &err);
        free(cur);
        cur = NULL;

        if (has_next) {
            const double t_wait = bn_time_seconds();
            if (threaded) {
                if (atomic_load_explicit(&next.done, memory_order_acquire))
                    overlapped++;
                pthread_join(worker, NULL);
            } else {
                tokenize_next(&next);
            }
            waited_seconds += bn_time_seconds() - t_wait;
            tokenize_seconds += next.seconds;
        }

        if (st != BN_OK) {
            if (b.streamed > 0) /* keep the responses before it apart from the error */
                fputc('\n', stdout);
            fflush(stdout);
            free(next.tokens);
            return request_fail(pl, i, &err);
        }
        /* Always a newline, so the responses stay apart in a file or pipe. */
        fputc('\n', stdout);
        fflush(stdout);
        fprintf(stderr,
                "request %zu/%zu: prompt %zu tokens in %.3f s (%.1f tok/s), generation %zu "
                "tokens in %.3f s (%.1f tok/s)%s\n",
                i + 1, pl->n, r.n_prompt_tokens, r.prompt_seconds,
                rate((double)r.n_prompt_tokens, r.prompt_seconds), r.n_tokens,
                r.generate_seconds, rate((double)r.n_tokens, r.generate_seconds),
                r.stop == BN_STOP_EOG ? ", stopped at end of generation" : "");
        if (o->verbose && r.decode_steps > 0)
            fprintf(stderr, "  decode %lld forward steps in %.3f s (%.1f tok/s)\n",
                    (long long)r.decode_steps, r.decode_seconds,
                    rate((double)r.decode_steps, r.decode_seconds));

        if (has_next) {
            if (next.status != BN_OK) {
                rc = request_fail(pl, i + 1, &next.err);
                break;
            }
            cur = next.tokens;
            n_cur = next.n;
            next.tokens = NULL;
        }
    }
    free(cur);
    if (rc != BN_EXIT_OK)
        return rc;

    bn_model_stats stats;
    if (bn_model_get_stats(m, &stats, NULL) != BN_OK)
        memset(&stats, 0, sizeof stats);
    fprintf(stderr,
            "load        %.3f s\n"
            "requests    %zu in %.3f s; next prompts tokenized during generation: %zu of %zu "
            "(tokenizing took %.3f ms, waited %.3f ms)\n",
            stats.load_seconds, pl->n, bn_time_seconds() - t_start, overlapped, pl->n - 1,
            tokenize_seconds * 1e3, waited_seconds * 1e3);
    if (o->verbose)
        print_verbose_work(m);
    return BN_EXIT_OK;
}

/* ---- --prompt-file --parallel N ---------------------------------------------
 * Every prompt is one item of one bn_generate_batch, up to N running at
 * once; each response is collected as it streams and printed in the
 * file's order at the end. */

typedef struct collected_text {
    char *data;
    size_t len, cap;
    bool oom;
} collected_text;

static bool collect_text(void *ctx, int32_t token, const char *text, size_t len)
{
    (void)token;
    collected_text *c = ctx;
    if (c->len + len + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 256;
        while (cap < c->len + len + 1)
            cap *= 2;
        char *p = realloc(c->data, cap);
        if (!p) {
            c->oom = true;
            return false;
        }
        c->data = p;
        c->cap = cap;
    }
    memcpy(c->data + c->len, text, len);
    c->len += len;
    c->data[c->len] = '\0';
    return true;
}

static int run_prompt_file_parallel(bn_model *m, const run_opts *o, const prompt_list *pl)
{
    const double t_start = bn_time_seconds();
    bn_batch_item *items = calloc(pl->n, sizeof *items);
    bn_generate_params *params = calloc(pl->n, sizeof *params);
    collected_text *texts = calloc(pl->n, sizeof *texts);
    char **prompts = calloc(pl->n, sizeof *prompts);
    int rc = BN_EXIT_OK;
    if (!items || !params || !texts || !prompts) {
        fprintf(stderr, "bitnet run: error: out of memory for %zu requests\n", pl->n);
        rc = BN_EXIT_OUT_OF_MEMORY;
    }
    bn_error err;
    bn_error_clear(&err);
    for (size_t i = 0; rc == BN_EXIT_OK && i < pl->n; i++) {
        params[i] = o->gp;
        if (!(prompts[i] = prompt_text(m, o, pl->text[i], &err)))
            rc = request_fail(pl, i, &err);
        else if (bn_session_create(m, &items[i].session, &err) != BN_OK)
            rc = cli_fail(&err);
        params[i].prompt = prompts[i];
        items[i].params = &params[i];
        items[i].on_token = collect_text;
        items[i].user = &texts[i];
    }
    if (rc == BN_EXIT_OK && bn_generate_batch(m, items, pl->n, &err) != BN_OK)
        rc = cli_fail(&err);
    /* Every response in the file's order; a failed request leaves an empty
     * line, its error on stderr, and the run's exit code is the first
     * failure's. */
    int first_failure = BN_EXIT_OK;
    for (size_t i = 0; rc == BN_EXIT_OK && i < pl->n; i++) {
        const bn_generate_result *r = &items[i].result;
        if (items[i].status == BN_OK && texts[i].oom)
            items[i].status = bn_error_set(&items[i].error, BN_ERR_OUT_OF_MEMORY, NULL,
                                           "out of memory collecting the response");
        if (items[i].status == BN_OK && texts[i].len)
            fwrite(texts[i].data, 1, texts[i].len, stdout);
        fputc('\n', stdout);
        if (items[i].status != BN_OK) {
            const int code = request_fail(pl, i, &items[i].error);
            if (first_failure == BN_EXIT_OK)
                first_failure = code;
            continue;
        }
        fprintf(stderr,
                "request %zu/%zu: prompt %zu tokens (%zu from the cache), generation %zu tokens "
                "in %.3f s (%.1f tok/s)%s\n",
                i + 1, pl->n, r->n_prompt_tokens, r->n_cached, r->n_tokens, r->generate_seconds,
                rate((double)r->n_tokens, r->generate_seconds),
                r->stop == BN_STOP_EOG ? ", stopped at end of generation" : "");
    }
    fflush(stdout);
    if (rc == BN_EXIT_OK) {
        bn_model_stats st;
        if (bn_model_get_stats(m, &st, NULL) != BN_OK)
            memset(&st, 0, sizeof st);
        const double seconds = bn_time_seconds() - t_start;
        uint64_t generated = 0;
        for (size_t i = 0; i < pl->n; i++)
            generated += items[i].status == BN_OK ? items[i].result.n_tokens : 0;
        fprintf(stderr,
                "load        %.3f s\n"
                "requests    %zu in %.3f s, %llu tokens generated (%.1f tok/s together)\n",
                st.load_seconds, pl->n, seconds, (unsigned long long)generated,
                rate((double)generated, seconds));
        if (st.max_sequences > 1)
            fprintf(stderr,
                    "batching    up to %d at once: %llu passes of %.1f rows on average, %llu "
                    "preempted; KV cache %d blocks of %d positions, %d holding cached "
                    "prefixes\n",
                    st.max_sequences, (unsigned long long)st.batch_steps,
                    st.batch_steps ? (double)st.batch_rows / (double)st.batch_steps : 0.0,
                    (unsigned long long)st.batch_preemptions, st.kv_blocks, st.kv_block_size,
                    st.kv_blocks_cached);
        else
            fprintf(stderr, "batching    none on this device: the requests ran one at a time\n");
        if (o->verbose)
            print_verbose_work(m);
        rc = first_failure;
    }
    for (size_t i = 0; items && i < pl->n; i++) {
        bn_session_free(items[i].session);
        free(prompts[i]);
        free(texts[i].data);
    }
    free(items);
    free(params);
    free(texts);
    free(prompts);
    return rc;
}

int cmd_run(int argc, char **argv, const bn_config *cfg)
{
    run_opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0) {
        free(o.ids);
        return rc < 0 ? BN_EXIT_OK : rc;
    }
    if (o.verbose && bn_log_get_level() < BN_LOG_INFO)
        bn_log_set_level(BN_LOG_INFO);

    prompt_list pl = {0};
    if (o.prompt_file && (rc = read_prompts(o.prompt_file, o.max_file_bytes, &pl)) != 0)
        return rc;
    char default_model[4096];
    if (!o.model && !(o.model = cli_default_model(cfg, default_model, sizeof default_model, CMD))) {
        free(o.ids);
        prompt_list_free(&pl);
        return BN_EXIT_INPUT;
    }
    bn_error err;
    bn_error_clear(&err);
    bn_model_options mo;
    cli_gen_model_options(&o.gen, o.model, &mo);
    if (o.parallel > 1) {
        mo.max_sequences = (int)o.parallel;
        mo.kv_cache_bytes = (uint64_t)o.kv_mib << 20;
        mo.kv_block_size = (int)o.kv_block;
        mo.kv_evict = o.kv_evict;
        mo.no_prefix_sharing = o.no_prefix_sharing;
        mo.batch_tokens = (int)o.batch_tokens;
    }
    bn_model *m = NULL;
    bn_session *s = NULL;
    bn_model_info info;
    if (bn_model_open(&mo, &m, &err) != BN_OK || bn_session_create(m, &s, &err) != BN_OK ||
        bn_model_get_info(m, &info, &err) != BN_OK) {
        bn_model_close(m);
        free(o.ids);
        prompt_list_free(&pl);
        return cli_fail(&err);
    }
    fprintf(stderr, "%s\n", info.selection);
    if (o.verbose)
        print_verbose(m);

    bool seed_fixed;
    o.gp.seed = cli_choose_seed(cfg, &o.gen, &seed_fixed);
    if (o.prompt_file) {
        if (o.verbose)
            fprintf(stderr, "seed        %llu%s, the same for every request\n",
                    (unsigned long long)o.gp.seed, seed_fixed ? "" : " (random)");
        rc = o.parallel > 1 ? run_prompt_file_parallel(m, &o, &pl)
                            : run_prompt_file(m, s, &o, &pl);
        prompt_list_free(&pl);
        bn_session_free(s);
        bn_model_close(m);
        return rc;
    }
    float *logits = NULL;
    char *text = NULL;
    rc = BN_EXIT_OK;
    if (o.dump_logits && !(logits = malloc((size_t)info.vocab_size * sizeof *logits))) {
        fprintf(stderr, "bitnet run: error: out of memory\n");
        rc = BN_EXIT_OUT_OF_MEMORY;
    } else if (o.prompt && !(text = prompt_text(m, &o, o.prompt, &err))) {
        rc = cli_fail(&err);
    }
    bn_generate_result r;
    if (rc == BN_EXIT_OK) {
        bn_generate_params gp = o.gp;
        gp.prompt = text;
        gp.prompt_tokens = o.ids;
        gp.n_prompt_tokens = o.n_ids;
        gp.prompt_logits = logits;
        if (bn_session_generate(s, &gp, print_text, NULL, &r, &err) != BN_OK) {
            end_text_line(); /* an error after some text: on a line of its own */
            rc = cli_fail(&err);
        }
    }
    if (rc != BN_EXIT_OK) {
        free(text);
        free(o.ids);
        free(logits);
        bn_session_free(s);
        bn_model_close(m);
        return rc;
    }
    end_text_line();

    bn_model_stats stats;
    if (bn_model_get_stats(m, &stats, NULL) != BN_OK)
        memset(&stats, 0, sizeof stats);
    fprintf(stderr,
            "load        %.3f s\n"
            "prompt      %zu tokens in %.3f s (%.1f tok/s)\n"
            "generation  %zu tokens in %.3f s (%.1f tok/s)%s\n",
            stats.load_seconds, r.n_prompt_tokens, r.prompt_seconds,
            rate((double)r.n_prompt_tokens, r.prompt_seconds), r.n_tokens, r.generate_seconds,
            rate((double)r.n_tokens, r.generate_seconds),
            r.stop == BN_STOP_EOG ? ", stopped at end of generation" : "");
    if (o.verbose && r.decode_steps > 0)
        fprintf(stderr, "decode      %lld forward steps in %.3f s (%.1f tok/s), seed %llu%s\n",
                (long long)r.decode_steps, r.decode_seconds,
                rate((double)r.decode_steps, r.decode_seconds), (unsigned long long)o.gp.seed,
                seed_fixed ? "" : " (random)");
    if (o.verbose)
        print_verbose_work(m);

    if (o.dump_logits)
        rc = write_logits(o.dump_logits, logits, info.vocab_size);
    if (rc == BN_EXIT_OK && o.receipt) {
        const bn_receipt_options ro = {.command = "run", .chat = o.chat, .seed_fixed = seed_fixed};
        rc = write_receipt(o.receipt, s, &ro);
    }
    free(text);
    free(o.ids);
    free(logits);
    bn_session_free(s);
    bn_model_close(m);
    return rc;
}
