/* bitnet run: generate text from a prompt. The text goes to stdout as it is
 * produced; the startup line, timings and errors go to stderr, so stdout
 * holds nothing but the model's words. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "engine.h"

#define CMD "run"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet run [-m MODEL] (-p PROMPT | --prompt-ids LIST) [options]\n"
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
            "      --device D         auto, cpu, gpu, cuda, cuda:N (default: BITNET_DEVICE, else\n"
            "                         auto: the GPU when CUDA is usable, else the CPU; a GPU\n"
            "                         failure under auto falls back to the CPU unless\n"
            "                         BITNET_STRICT_MODE=1)\n"
            "      --threads N        CPU threads (default: BITNET_NUM_THREADS, else every core)\n"
            "      --ctx N            context (KV cache) positions (default: the model's training\n"
            "                         context); prompt + -n must fit\n"
            "      --kv f32|f16       CUDA KV cache precision (default f32: the CPU's numbers;\n"
            "                         f16 halves its memory and bandwidth, and logits may then\n"
            "                         differ from the CPU's by ~1e-2 of their range)\n"
            "\n"
            "output:\n"
            "      --receipt FILE     write a JSON receipt of the run (see docs/CLI.md)\n"
            "      --dump-logits FILE write the logits after the prompt, one per line\n"
            "      --verbose          model details, memory and info-level logs on stderr\n"
            "      --help             show this help\n"
            "\n"
            "exit codes: 2 bad command line or request (e.g. longer than the context), 4 device\n"
            "unusable, 5 unreadable or malformed model, 6 out of memory.\n");
}

typedef struct run_opts {
    const char *model, *prompt, *system, *device, *receipt, *dump_logits;
    int32_t *ids; /* --prompt-ids */
    size_t n_ids;
    long long n_predict, threads, ctx;
    bool chat, verbose, have_seed, kv_f16;
    uint64_t seed;
    bn_sampler_params sp;
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
    bn_sampler_params_default(&o->sp);
    o->sp.temperature = 0.8f;
    o->sp.top_k = 40;
    o->sp.top_p = 0.95f;
    o->sp.min_p = 0.05f;
    o->sp.repeat_penalty = 1.0f;
    o->sp.repeat_last_n = 64;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        long long n;
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
        } else if (strcmp(a, "-n") == 0 || strcmp(a, "--n-predict") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, 1 << 24, &o->n_predict))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--chat") == 0) {
            o->chat = true;
        } else if (strcmp(a, "--system") == 0) {
            VALUE();
            o->system = v;
        } else if (strcmp(a, "--temp") == 0) {
            VALUE();
            if (!cli_parse_float(CMD, a, v, 0.0, 100.0, &o->sp.temperature))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--top-k") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 0, 1 << 24, &n))
                return BN_EXIT_USAGE;
            o->sp.top_k = (int)n;
        } else if (strcmp(a, "--top-p") == 0) {
            VALUE();
            if (!cli_parse_float(CMD, a, v, 0.0, 1.0, &o->sp.top_p))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--min-p") == 0) {
            VALUE();
            if (!cli_parse_float(CMD, a, v, 0.0, 1.0, &o->sp.min_p))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--repeat-penalty") == 0) {
            VALUE();
            if (!cli_parse_float(CMD, a, v, 0.01, 100.0, &o->sp.repeat_penalty))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--repeat-last-n") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, -1, 1 << 24, &n))
                return BN_EXIT_USAGE;
            o->sp.repeat_last_n = (int)n;
        } else if (strcmp(a, "--seed") == 0) {
            VALUE();
            if (!cli_parse_u64(CMD, a, v, &o->seed))
                return BN_EXIT_USAGE;
            o->have_seed = true;
        } else if (strcmp(a, "--device") == 0) {
            VALUE();
            if (!cli_check_device(CMD, v))
                return BN_EXIT_USAGE;
            o->device = v;
        } else if (strcmp(a, "--threads") == 0 || strcmp(a, "-t") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, 4096, &o->threads))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--ctx") == 0 || strcmp(a, "-c") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, 1 << 24, &o->ctx))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--kv") == 0) {
            VALUE();
            if (strcmp(v, "f32") != 0 && strcmp(v, "f16") != 0) {
                fprintf(stderr, "bitnet run: error: --kv must be f32 or f16, not '%s'\n", v);
                return BN_EXIT_USAGE;
            }
            o->kv_f16 = strcmp(v, "f16") == 0;
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
    if (!o->prompt && !o->ids) {
        fprintf(stderr, "bitnet run: error: no prompt: give -p PROMPT\n");
        fprintf(stderr, "bitnet: hint: 'bitnet run --help' lists the options\n");
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

static void print_text(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout); /* stream: a reader sees each word as it comes */
}

static double rate(double count, double seconds) { return seconds > 0.0 ? count / seconds : 0.0; }

static void print_verbose(const bn_engine *e)
{
    const bn_hparams *hp = bn_model_hparams(bn_engine_model(e));
    bn_engine_info info;
    bn_engine_get_info(e, &info);
    const double mib = 1024.0 * 1024.0;
    fprintf(stderr,
            "model: %s\n  %s\n  %d layers, dim %d, ffn %d, heads %d/%d (head_dim %d), vocab %d, "
            "trained context %d\n  context %lld positions\n"
            "memory: model weights %.1f MiB, backend %.1f MiB (weights %.1f, KV cache %.1f, "
            "scratch %.1f)\n",
            info.model_path, hp->flavour, hp->n_layer, hp->dim, hp->ffn, hp->n_head,
            hp->n_head_kv, hp->head_dim, hp->vocab, hp->n_ctx_train, (long long)info.n_ctx,
            (double)info.model_weight_bytes / mib, (double)info.backend_total_bytes / mib,
            (double)info.backend_weight_bytes / mib, (double)info.backend_kv_bytes / mib,
            (double)info.backend_scratch_bytes / mib);
    if (info.gpu)
        fprintf(stderr,
                "gpu memory: cuda:%d %s: %.1f MiB (ternary weights %.1f, embedding %.1f, "
                "LM head %.1f, its int8 copy %.1f, norms %.2f, KV cache %.1f (%s, %lld "
                "positions), scratch %.1f); "
                "peak %.1f MiB; %.1f of %.1f GiB free after loading; decode %s\n",
                info.gpu_device, info.gpu_name, (double)info.gpu_total_bytes / mib,
                (double)info.gpu_weights_bytes / mib, (double)info.gpu_embedding_bytes / mib,
                (double)info.gpu_lm_head_bytes / mib,
                (double)info.gpu_lm_head_screen_bytes / mib, (double)info.gpu_norms_bytes / mib,
                (double)info.gpu_kv_bytes / mib, info.kv_type, (long long)info.n_ctx,
                (double)info.gpu_scratch_bytes / mib, (double)info.gpu_peak_bytes / mib,
                (double)info.gpu_device_free_bytes / (1024.0 * mib),
                (double)info.gpu_device_total_bytes / (1024.0 * mib),
                info.cuda_graphs ? "replays a CUDA graph" : "launches kernels one by one");
    if (info.fallback[0])
        fprintf(stderr, "note: %s; computing on the CPU\n", info.fallback);
}

static int write_logits(const char *path, const float *logits, int32_t n)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bitnet run: error: cannot write %s\n", path);
        return BN_EXIT_FAILURE;
    }
    for (int32_t i = 0; i < n; i++)
        fprintf(f, "%.9g\n", logits[i]);
    if (fclose(f) != 0) {
        fprintf(stderr, "bitnet run: error: cannot write %s\n", path);
        return BN_EXIT_FAILURE;
    }
    return BN_EXIT_OK;
}

static int write_receipt(const char *path, const bn_engine *e, const bn_receipt_info *ri)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bitnet run: error: cannot write the receipt %s\n", path);
        return BN_EXIT_FAILURE;
    }
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_engine_write_receipt(e, ri, f, &err);
    if (fclose(f) != 0 && st == BN_OK)
        st = bn_error_set(&err, BN_ERR_IO, NULL, "could not write the receipt %s", path);
    return st == BN_OK ? BN_EXIT_OK : cli_fail(&err);
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

    char default_model[4096];
    if (!o.model && !(o.model = cli_default_model(cfg, default_model, sizeof default_model, CMD))) {
        free(o.ids);
        return BN_EXIT_INPUT;
    }
    bn_error err;
    bn_error_clear(&err);
    bn_engine_options eo = {.model_path = o.model,
                            .device = o.device,
                            .n_threads = (int)o.threads,
                            .n_ctx = o.ctx,
                            .kv_f16 = o.kv_f16};
    bn_engine *e = NULL;
    if (bn_engine_open(cfg, &eo, &e, &err) != BN_OK) {
        free(o.ids);
        return cli_fail(&err);
    }
    fprintf(stderr, "%s\n", bn_engine_startup_line(e));
    if (o.verbose)
        print_verbose(e);

    bool seed_fixed;
    o.sp.seed = bn_engine_choose_seed(cfg, o.have_seed, o.seed, &seed_fixed);
    const int32_t vocab = bn_model_hparams(bn_engine_model(e))->vocab;
    float *logits = NULL;
    if (o.dump_logits && !(logits = malloc((size_t)vocab * sizeof *logits))) {
        free(o.ids);
        bn_engine_free(e);
        fprintf(stderr, "bitnet run: error: out of memory\n");
        return BN_EXIT_OUT_OF_MEMORY;
    }
    bn_generate_request req = {.prompt = o.prompt,
                               .chat = o.chat,
                               .system = o.system,
                               .prompt_tokens = o.ids,
                               .n_prompt_tokens = o.n_ids,
                               .n_predict = (int)o.n_predict,
                               .sampling = o.sp,
                               .on_text = print_text,
                               .prompt_logits = logits};
    bn_generation g;
    if (bn_engine_generate(e, &req, &g, &err) != BN_OK) {
        free(o.ids);
        free(logits);
        bn_engine_free(e);
        return cli_fail(&err);
    }
    if (isatty(STDOUT_FILENO))
        fputc('\n', stdout);
    fflush(stdout);

    bn_engine_info info;
    bn_engine_get_info(e, &info);
    fprintf(stderr,
            "load        %.3f s\n"
            "prompt      %zu tokens in %.3f s (%.1f tok/s)\n"
            "generation  %zu tokens in %.3f s (%.1f tok/s)%s\n",
            info.load_seconds, g.n_prompt, g.prompt_seconds,
            rate((double)g.n_prompt, g.prompt_seconds), g.n_tokens, g.gen_seconds,
            rate((double)g.n_tokens, g.gen_seconds),
            g.stopped_at_eog ? ", stopped at end of generation" : "");
    if (o.verbose && g.decode_steps > 0)
        fprintf(stderr, "decode      %lld forward steps in %.3f s (%.1f tok/s), seed %llu%s\n",
                (long long)g.decode_steps, g.decode_seconds,
                rate((double)g.decode_steps, g.decode_seconds), (unsigned long long)o.sp.seed,
                seed_fixed ? "" : " (random)");
    if (o.verbose) {
        fprintf(stderr, "kernels     %s\n", info.kernels);
        if (info.gpu)
            fprintf(stderr,
                    "gpu work    %llu kernel launches; host to device %llu copies, %.1f MiB; "
                    "device to host %llu copies, %.1f KiB (since loading)\n",
                    (unsigned long long)info.gpu_kernel_launches,
                    (unsigned long long)info.gpu_h2d_transfers,
                    (double)info.gpu_h2d_bytes / (1024.0 * 1024.0),
                    (unsigned long long)info.gpu_d2h_transfers,
                    (double)info.gpu_d2h_bytes / 1024.0);
        if (info.fallback[0]) /* a step may have failed during generation */
            fprintf(stderr, "note: %s; computed on the CPU\n", info.fallback);
    }

    rc = BN_EXIT_OK;
    if (o.dump_logits)
        rc = write_logits(o.dump_logits, logits, vocab);
    if (rc == BN_EXIT_OK && o.receipt) {
        bn_receipt_info ri = {.command = "run", .req = &req, .gen = &g, .seed_fixed = seed_fixed};
        rc = write_receipt(o.receipt, e, &ri);
    }
    bn_generation_free(&g);
    free(o.ids);
    free(logits);
    bn_engine_free(e);
    return rc;
}
