/*
 * simple: greedy text from a prompt, with libbitnet's public API only.
 *
 *     simple [-m MODEL] -p PROMPT [-n N]
 *
 * Opens MODEL (default: BITNET_MODEL, else the model shipped with bitnet)
 * on the device BITNET_DEVICE asks for (default: a usable CUDA GPU, else
 * the CPU), generates up to N tokens (default 128) greedily after the
 * prompt and streams them to stdout as they come. stdout holds the
 * generated text and nothing else, so it is what
 * `bitnet run -p PROMPT -n N --temp 0` prints into a file or a pipe (on a
 * terminal both end the text with a newline). Errors go to stderr, with
 * the library's message and hint, and the exit status is 1 (2 for a bad
 * command line).
 *
 * Build against an installed libbitnet:
 *     cc simple.c -o simple $(pkg-config --cflags --libs bitnet)
 */
#define _POSIX_C_SOURCE 200809L /* isatty */

#include <bitnet.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out, "usage: simple [-m MODEL] -p PROMPT [-n N]\n"
                 "  -m MODEL   GGUF file or Hugging Face directory (default: BITNET_MODEL,\n"
                 "             else the model shipped with bitnet)\n"
                 "  -p PROMPT  the text to continue\n"
                 "  -n N       tokens to generate at most (default 128)\n"
                 "The device is BITNET_DEVICE's (default auto). The generated text goes to\n"
                 "stdout, nothing else.\n");
}

static int fail(const bn_error *err)
{
    fprintf(stderr, "simple: error: %s\n", err->message);
    if (err->hint[0])
        fprintf(stderr, "simple: hint: %s\n", err->hint);
    return 1;
}

/* Each call brings the text the token completes (possibly empty); written
 * at once, so a reader sees each word as it comes. */
static bool on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)user;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *prompt = NULL;
    long n = 128;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if ((strcmp(a, "-m") == 0 || strcmp(a, "-p") == 0 || strcmp(a, "-n") == 0) &&
            i + 1 >= argc) {
            fprintf(stderr, "simple: error: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "-m") == 0) {
            model = argv[++i];
        } else if (strcmp(a, "-p") == 0) {
            prompt = argv[++i];
        } else if (strcmp(a, "-n") == 0) {
            char *end;
            n = strtol(argv[++i], &end, 10);
            if (*end != '\0' || end == argv[i] || n < 1 || n > 1000000) {
                fprintf(stderr, "simple: error: -n must be a number of tokens from 1 to "
                                "1000000, not '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "simple: error: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!prompt) {
        fprintf(stderr, "simple: error: no prompt: give -p PROMPT\n");
        usage(stderr);
        return 2;
    }

    bn_error err;
    bn_error_clear(&err);

    /* The model: path NULL is BITNET_MODEL, else the shipped one; device
     * NULL is BITNET_DEVICE, else auto. */
    bn_model_options opt;
    bn_model_options_default(&opt);
    opt.path = model;
    bn_model *m = NULL;
    if (bn_model_open(&opt, &m, &err) != BN_OK)
        return fail(&err);

    bn_session *s = NULL;
    if (bn_session_create(m, &s, &err) != BN_OK) {
        bn_model_close(m);
        return fail(&err);
    }

    /* Greedy: temperature 0 always takes the most likely token. */
    bn_generate_params p;
    bn_generate_params_default(&p);
    p.prompt = prompt;
    p.max_tokens = (int)n;
    p.temperature = 0.0f;

    bn_generate_result r;
    const bn_status st = bn_session_generate(s, &p, on_token, NULL, &r, &err);
    if (st == BN_OK && isatty(STDOUT_FILENO))
        fputc('\n', stdout); /* leave the shell's prompt on a line of its own */
    fflush(stdout);

    bn_session_free(s);
    bn_model_close(m);
    return st == BN_OK ? 0 : fail(&err);
}
