/* bitnet serve: an OpenAI-compatible HTTP server (docs/SERVER.md): the
 * options, loading the model behind a listening socket (/health says
 * "loading" meanwhile), and the end on SIGINT / SIGTERM: stop accepting,
 * let running requests finish for --grace seconds, cancel the rest, exit
 * 0. serve_http.c and serve_openai.c do the serving. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

#define CMD "serve"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet serve [-m MODEL] [options]\n"
            "\n"
            "Serves the model over HTTP in the OpenAI wire format: POST /v1/chat/completions,\n"
            "POST /v1/completions (both streamed as server-sent events with \"stream\": true),\n"
            "GET /v1/models, POST /tokenize and /detokenize, GET /health and GET /metrics\n"
            "(Prometheus). Requests running at once are decoded together. One line per request\n"
            "goes to stderr. SIGINT or SIGTERM stops accepting, lets running requests finish\n"
            "for --grace seconds, cancels the rest and exits 0.\n"
            "\n"
            "  -m, --model MODEL      GGUF file or Hugging Face directory (default: BITNET_MODEL,\n"
            "                         else the model shipped with bitnet)\n"
            "      --host ADDR        address to listen on (default 127.0.0.1: this machine\n"
            "                         only; 0.0.0.0 for every IPv4 interface)\n"
            "      --port N           port (default 8080; 0: any free port, printed)\n"
            "      --parallel N       requests generated at once (default 8)\n"
            "      --batch-tokens N   rows of a shared forward pass: one per decoding\n"
            "                         request, then prompt chunks up to N in all (default\n"
            "                         512; more: earlier first tokens and more throughput\n"
            "                         under load, each request's next token later)\n"
            "      --max-queue N      requests waiting beyond those before 429 (default 64)\n"
            "      --timeout S        a generation's limit in seconds (default 600; 0: none)\n"
            "      --grace S          seconds running requests get to finish on SIGINT /\n"
            "                         SIGTERM (default 10)\n"
            "      --max-body-kib N   largest request body (default 1024)\n"
            "      --api-key KEY      require 'Authorization: Bearer KEY' on /v1 routes\n"
            "                         (default: BITNET_API_KEY; none: open)\n"
            "  -c, --ctx N            positions a request may hold (default: the model's)\n"
            "      --device D         auto, cpu, gpu, cuda[:N], vulkan[:N]; cuda:N,M,... or\n"
            "                         cuda:all: a replica on each device (default:\n"
            "                         BITNET_DEVICE, else auto)\n"
            "  -t, --threads N        CPU threads (default: BITNET_NUM_THREADS, else all)\n"
            "      --kv T             KV cache on the GPU: f32 (default), f16, or fp8 (the\n"
            "                         batched requests' cache in 8-bit floats)\n"
            "      --tensor-parallel N  split the model across N CUDA GPUs (NCCL): --device\n"
            "                         cuda:0,1 names them, cuda takes the first N; requests\n"
            "                         then run one at a time\n"
            "  -h, --help\n");
}

static bool parse_double(const char *opt, const char *text, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    const double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "bitnet " CMD ": error: %s wants a number from %g to %g, not '%s'\n",
                opt, lo, hi, text);
        return false;
    }
    *out = v;
    return true;
}

/* The options; BN_EXIT_OK to go on, -1 after --help, an exit code else. */
static int parse(int argc, char **argv, serve_opts *o)
{
    long long port = 8080, parallel = 8, queue = 64, body_kib = 1024, batch_tokens = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return -1;
        }
        /* The engine's options `run` has too; not its sampling, which each
         * request sets. */
        static const char *const engine[] = {"--device", "--threads", "-t", "--ctx", "-c",
                                             "--kv", "--tensor-parallel"};
        bool is_engine = false;
        for (size_t k = 0; k < sizeof engine / sizeof engine[0]; k++)
            is_engine |= strcmp(a, engine[k]) == 0;
        if (is_engine) {
            if (cli_gen_option(argc, argv, &i, CMD, &o->gen) < 0)
                return BN_EXIT_USAGE;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i, CMD)))
            return BN_EXIT_USAGE;
        bool ok = true;
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0)
            o->model = v;
        else if (strcmp(a, "--host") == 0)
            o->host = v;
        else if (strcmp(a, "--port") == 0)
            ok = cli_parse_i64(CMD, a, v, 0, 65535, &port);
        else if (strcmp(a, "--parallel") == 0)
            ok = cli_parse_i64(CMD, a, v, 1, 4096, &parallel);
        else if (strcmp(a, "--batch-tokens") == 0)
            ok = cli_parse_i64(CMD, a, v, 1, BN_BATCH_TOKENS_MAX, &batch_tokens);
        else if (strcmp(a, "--max-queue") == 0)
            ok = cli_parse_i64(CMD, a, v, 0, 100000, &queue);
        else if (strcmp(a, "--timeout") == 0)
            ok = parse_double(a, v, 0.0, 1e9, &o->timeout_s);
        else if (strcmp(a, "--grace") == 0)
            ok = parse_double(a, v, 0.0, 86400.0, &o->grace_s);
        else if (strcmp(a, "--max-body-kib") == 0)
            ok = cli_parse_i64(CMD, a, v, 1, 1 << 20, &body_kib);
        else if (strcmp(a, "--api-key") == 0)
            o->api_key = v;
        else {
            fprintf(stderr, "bitnet " CMD ": error: unknown option '%s'\n", a);
            usage(stderr);
            return BN_EXIT_USAGE;
        }
        if (!ok)
            return BN_EXIT_USAGE;
    }
    for (const char *k = o->api_key; k && *k; k++)
        if ((unsigned char)*k <= ' ' || (unsigned char)*k >= 0x7f) {
            fprintf(stderr, "bitnet " CMD ": error: an API key is printable ASCII without "
                            "spaces\n");
            return BN_EXIT_USAGE;
        }
    if (o->api_key && !o->api_key[0]) {
        fprintf(stderr, "bitnet " CMD ": error: the API key is empty\n");
        return BN_EXIT_USAGE;
    }
    o->port = (int)port;
    o->parallel = (int)parallel;
    o->batch_tokens = (int)batch_tokens;
    o->max_queue = (int)queue;
    o->max_body = (size_t)body_kib * 1024;
    return BN_EXIT_OK;
}

/* The model's name in /v1/models: its file or directory name without
 * ".gguf". */
static void model_name(const char *path, char *out, size_t size)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/')
        start--;
    size_t n = len - start;
    if (n > 5 && strncmp(path + start + n - 5, ".gguf", 5) == 0)
        n -= 5;
    snprintf(out, size, "%.*s", (int)n, path + start);
}

static void sleep_ms(int ms)
{
    const struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Waits until no generation is running or waiting, at most `seconds`. */
static bool drained(server *s, double seconds)
{
    for (double waited = 0.0; waited < seconds; waited += 0.05) {
        if (atomic_load(&s->in_flight) == 0)
            return true;
        sleep_ms(50);
    }
    return atomic_load(&s->in_flight) == 0;
}

/* Short generations before the server says it is ready, so that its first
 * requests do not pay what a device's first passes cost once: loading
 * kernels and libraries and, on a GPU, capturing the graph of each batch
 * size (captured at a size's second decode pass), so a round for each
 * power of two up to --parallel sequences. A failure here is left to the
 * requests to meet and report. */
static void warm_up(server *s)
{
    const bool gpu = strncmp(s->info.device, "cpu", 3) != 0;
    const int most = gpu ? s->opt.parallel : 1;
    bn_session **sessions = calloc((size_t)most, sizeof *sessions);
    bn_batch_item *items = calloc((size_t)most, sizeof *items);
    bn_generate_params p;
    bn_generate_params_default(&p);
    const int32_t prompt[2] = {s->info.bos >= 0 ? s->info.bos : 0, 1 % s->info.vocab_size};
    p.prompt_tokens = prompt;
    p.n_prompt_tokens = 2;
    p.max_tokens = 3;
    p.temperature = 0.0f;
    p.ignore_eog = true;
    bn_error err;
    int made = 0;
    while (sessions && items && made < most &&
           bn_session_create(s->model, &sessions[made], &err) == BN_OK)
        made++;
    /* Rounds of 1, 2, 4, ... sessions, the last of all of them. */
    for (int n = 1; made > 0; n = 2 * n < made ? 2 * n : made) {
        for (int i = 0; i < n; i++) {
            bn_session_reset(sessions[i]);
            items[i] = (bn_batch_item){.session = sessions[i], .params = &p};
        }
        if (bn_generate_batch(s->model, items, (size_t)n, &err) != BN_OK || n == made)
            break;
    }
    for (int i = 0; i < made; i++)
        bn_session_free(sessions[i]);
    free(sessions);
    free(items);
}

int cmd_serve(int argc, char **argv, const bn_config *cfg)
{
    static server s; /* one a process; zero-initialised */
    serve_opts *o = &s.opt;
    o->host = "127.0.0.1";
    o->timeout_s = 600.0;
    o->grace_s = 10.0;
    cli_gen_defaults(&o->gen);
    o->api_key = cfg && cfg->api_key[0] ? cfg->api_key : NULL; /* BITNET_API_KEY */
    int rc = parse(argc, argv, o);
    if (rc != BN_EXIT_OK)
        return rc < 0 ? BN_EXIT_OK : rc;
    char default_model[1024];
    const char *path = o->model ? o->model
                                : cli_default_model(cfg, default_model, sizeof default_model, CMD);
    if (!path)
        return BN_EXIT_INPUT;
    model_name(path, s.model_id, sizeof s.model_id);
    s.started = (int64_t)time(NULL);
    pthread_mutex_init(&s.lock, NULL);

    /* SIGINT / SIGTERM are taken by sigwait below: blocked before any
     * thread starts, so every thread inherits the mask. SIGPIPE from a
     * client that left is ignored (the write fails instead). */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* Without the waker thread tokens still stream: their poster wakes
     * the readers itself. */
    (void)serve_waker_start(&s.waker, 2 * (size_t)(o->parallel + o->max_queue) + 64);
    char why[256];
    int port = 0;
    serve_http *http = serve_http_start(&s, &port, why, sizeof why);
    if (!http) {
        fprintf(stderr, "bitnet " CMD ": error: %s\n", why);
        serve_waker_stop(&s.waker);
        return BN_EXIT_FAILURE;
    }
    fprintf(stderr, "bitnet serve: listening on http://%s%s%s:%d, loading %s\n",
            strchr(o->host, ':') ? "[" : "", o->host, strchr(o->host, ':') ? "]" : "", port,
            path);

    bn_model_options mo;
    cli_gen_model_options(&o->gen, path, &mo);
    mo.max_sequences = o->parallel;
    mo.batch_tokens = o->batch_tokens;
    bn_error err;
    if (bn_model_open(&mo, &s.model, &err) != BN_OK ||
        bn_model_get_info(s.model, &s.info, &err) != BN_OK) {
        serve_http_stop(http);
        serve_waker_stop(&s.waker);
        bn_model_close(s.model);
        return cli_fail(&err);
    }
    fprintf(stderr, "%s\n", s.info.selection);
    warm_up(&s);
    atomic_store(&s.ready, true);
    fprintf(stderr, "bitnet serve: ready: model '%s', context %lld, %d at once, up to %d "
                    "waiting%s\n",
            s.model_id, (long long)s.info.n_ctx, o->parallel, o->max_queue,
            o->api_key ? ", API key required on /v1" : "");

    /* Wait for the signal, looking for late requests every second. */
    int sig = -1;
    while (sig < 0) {
        const struct timespec second = {1, 0};
        sig = sigtimedwait(&stop, NULL, &second);
        if (sig < 0 && o->timeout_s > 0.0)
            serve_cancel_late(&s);
    }
    fprintf(stderr, "bitnet serve: %s: no new requests; %d running or waiting get %.0f s\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", atomic_load(&s.in_flight), o->grace_s);
    atomic_store(&s.draining, true);
    serve_http_quiesce(http);
    if (!drained(&s, o->grace_s)) {
        fprintf(stderr, "bitnet serve: cancelling %d requests\n", atomic_load(&s.in_flight));
        serve_cancel_all(&s);
        drained(&s, 30.0);
    }
    serve_http_stop(http);
    serve_waker_stop(&s.waker);
    bn_model_close(s.model);
    pthread_mutex_destroy(&s.lock);
    fprintf(stderr, "bitnet serve: stopped\n");
    return BN_EXIT_OK;
}
