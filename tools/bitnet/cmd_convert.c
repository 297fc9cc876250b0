/* bitnet convert HF_DIR -o OUT.gguf --type T: a Hugging Face BitNet
 * directory as the GGUF file other runtimes expect (bn_convert_hf_to_gguf;
 * src/engine/convert.c lists the conventions and where they come from). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet convert HF_DIR -o OUT.gguf [--type i2_s|tq2_0|tq1_0|f16]\n"
            "\n"
            "Converts a Hugging Face BitNet b1.58 directory (packed ternary checkpoint or bf16\n"
            "master weights, with config.json and tokenizer.json) to one GGUF file:\n"
            "\n"
            "  i2_s    Microsoft bitnet.cpp's format (architecture bitnet-25): I2_S projections,\n"
            "          F16 token embedding, F32 norms (default)\n"
            "  tq2_0   upstream llama.cpp (architecture bitnet): TQ2_0 projections, F16 embedding\n"
            "  tq1_0   upstream llama.cpp: TQ1_0 projections (1.69 bits per weight)\n"
            "  f16     upstream llama.cpp: projections as F16 values (code x scale)\n"
            "\n"
            "Projections whose rows do not fit the block size (256 for TQ types) are written as\n"
            "F16, as llama.cpp's converter does. The file is written to a temporary file of its\n"
            "own beside OUT, synced and renamed when complete, so OUT never holds a partial\n"
            "file; an interrupted convert (SIGINT, SIGTERM, SIGHUP) removes it. An existing OUT\n"
            "that is not a regular file (device, FIFO, directory, symbolic link) is refused.\n"
            "A value the encoding stores as F16 but F16 cannot hold (above 65504) is an error.\n"
            "\n"
            "  -o, --output FILE   the GGUF file to write (required)\n"
            "  --type T            output encoding (default i2_s)\n"
            "  --help              show this help\n");
}

/* A one-line bar redrawn in place; only drawn when stderr is a terminal,
 * so logs and pipes never fill with carriage returns. */
typedef struct bar {
    const char *stage;
    int last_percent;
} bar;

static void on_progress(void *ctx, const char *stage, uint64_t done, uint64_t total)
{
    bar *b = ctx;
    const int percent = total ? (int)(100.0 * (double)done / (double)total) : 100;
    if (b->stage == stage && percent == b->last_percent)
        return;
    if (b->stage && b->stage != stage)
        fputc('\n', stderr);
    b->stage = stage;
    b->last_percent = percent;
    char cells[31];
    const int filled = percent * 30 / 100;
    for (int i = 0; i < 30; i++)
        cells[i] = i < filled ? '#' : '.';
    cells[30] = '\0';
    fprintf(stderr, "\r%-8s [%s] %3d%%", stage, cells, percent);
    fflush(stderr);
}

/* The library installs no signal handlers; the command does, for the
 * length of the conversion only. On SIGINT, SIGTERM or SIGHUP the handler
 * removes the temporary file the conversion is filling
 * (bn_convert_remove_temp_files is async-signal-safe), then re-raises the
 * signal, whose action SA_RESETHAND has already reset to the default, so the
 * process ends as it would have without the handler. An existing OUT is
 * never touched: it is only ever replaced by the final rename. */
static const int cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP};
enum { N_CLEANUP_SIGNALS = sizeof cleanup_signals / sizeof cleanup_signals[0] };

static void on_fatal_signal(int sig)
{
    bn_convert_remove_temp_files();
    raise(sig); /* delivered when the handler returns */
}

static void set_cleanup_handlers(struct sigaction old[N_CLEANUP_SIGNALS])
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_CLEANUP_SIGNALS; i++) {
        sigaction(cleanup_signals[i], NULL, &old[i]);
        /* A signal the shell set to be ignored (nohup, background jobs)
         * stays ignored. */
        if (old[i].sa_handler != SIG_IGN)
            sigaction(cleanup_signals[i], &sa, NULL);
    }
}

static void restore_handlers(const struct sigaction old[N_CLEANUP_SIGNALS])
{
    for (int i = 0; i < N_CLEANUP_SIGNALS; i++)
        sigaction(cleanup_signals[i], &old[i], NULL);
}

int cmd_convert(int argc, char **argv, const bn_config *cfg)
{
    (void)cfg;
    const char *in = NULL, *out = NULL;
    bn_convert_options opt;
    bn_convert_options_default(&opt);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return BN_EXIT_OK;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            if (!(out = cli_value(argc, argv, &i, "convert")))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--type") == 0) {
            const char *v = cli_value(argc, argv, &i, "convert");
            if (!v)
                return BN_EXIT_USAGE;
            if (!bn_convert_type_parse(v, &opt.type)) {
                fprintf(stderr, "bitnet convert: error: --type must be i2_s, tq2_0, tq1_0 or f16, "
                                "not '%s'\n", v);
                return BN_EXIT_USAGE;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "bitnet convert: error: unknown option '%s'\n", a);
            usage(stderr);
            return BN_EXIT_USAGE;
        } else if (in) {
            fprintf(stderr, "bitnet convert: error: one input directory at a time ('%s' and "
                            "'%s')\n", in, a);
            return BN_EXIT_USAGE;
        } else {
            in = a;
        }
    }
    if (!in || !out) {
        fprintf(stderr, "bitnet convert: error: %s\n",
                !in ? "no input directory given" : "no output file: give -o OUT.gguf");
        usage(stderr);
        return BN_EXIT_USAGE;
    }

    bar b = {NULL, -1};
    if (isatty(STDERR_FILENO)) {
        opt.progress = on_progress;
        opt.user = &b;
    }
    bn_convert_report rep;
    bn_error err;
    bn_error_clear(&err);
    const double t0 = bn_time_seconds();
    struct sigaction old[N_CLEANUP_SIGNALS];
    set_cleanup_handlers(old);
    const bn_status st = bn_convert_hf_to_gguf(in, out, &opt, &rep, &err);
    restore_handlers(old);
    if (b.stage)
        fputc('\n', stderr);
    if (st != BN_OK)
        return cli_fail(&err);
    printf("wrote %s: %s, architecture %s, %d tensors, %.1f MiB in %.1f s\n", out,
           bn_convert_type_name(opt.type), rep.architecture, rep.n_tensors,
           (double)rep.file_bytes / (1024.0 * 1024.0), bn_time_seconds() - t0);
    if (rep.n_f16_fallback)
        printf("  %d of %d projections written as F16: their rows do not fit %s blocks\n",
               rep.n_f16_fallback, rep.n_ternary + rep.n_f16_fallback,
               bn_convert_type_name(opt.type));
    return BN_EXIT_OK;
}
