/*
 * engine.c - backend selection, model loading and token-by-token generation
 * (the contract is in engine.h).
 */
#include "engine.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/random.h>
#endif

#include "cpu_backend.h"
#include "kernel_manager.h"
#include "tokenizer.h"

struct bn_engine {
    bn_model *model;
    bn_cpu_backend *cpu;
    float *logits;            /* vocab floats, reused every step */
    char model_path[1024];
    char requested[32];
    const char *requested_from;
    char detected[256];
    char selected[32];
    char kernel[32];
    char fallback[256];
    char startup[512];
    int threads;
    double load_seconds;
};

/* ---- backend selection ------------------------------------------------------ */

static void device_text(const bn_device_request *r, char *buf, size_t size)
{
    switch (r->kind) {
    case BN_DEVICE_AUTO: snprintf(buf, size, "auto"); break;
    case BN_DEVICE_CPU: snprintf(buf, size, "cpu"); break;
    case BN_DEVICE_GPU: snprintf(buf, size, "gpu"); break;
    case BN_DEVICE_CUDA:
        if (r->index >= 0)
            snprintf(buf, size, "cuda:%d", r->index);
        else
            snprintf(buf, size, "cuda");
        break;
    }
}

static void append_name(char *buf, size_t size, const char *name)
{
    size_t used = strlen(buf);
    if (used < size)
        snprintf(buf + used, size - used, "%s%s", used ? "," : "", name);
}

/* Real GPU backends first (fakes never compute, so they are not listed),
 * then the CPU kernel providers this CPU can run, best first. Sets
 * *cuda_usable when a real CUDA device answered. */
static bn_status detect(const bn_config *cfg, char *buf, size_t size, bool *cuda_usable,
                        bn_error *err)
{
    bn_gpu_info *gpu = calloc(1, sizeof *gpu); /* large: keep it off the stack */
    if (!gpu)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for GPU detection");
    bn_status st = bn_gpu_detect(cfg, gpu, err);
    if (st != BN_OK) {
        free(gpu);
        return st;
    }
    buf[0] = '\0';
    *cuda_usable = false;
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++) {
        const bn_gpu_backend_info *bi = &gpu->backends[b];
        if (!bi->available || bi->fake)
            continue;
        append_name(buf, size, bn_gpu_backend_name((bn_gpu_backend)b));
        if (b == BN_GPU_CUDA)
            *cuda_usable = true;
    }
    if (gpu->fake_override)
        bn_log(BN_LOG_INFO, "BITNET_GPU_FAKE is set: fake GPUs are reported by 'bitnet devices' "
                            "but never used to compute");
    free(gpu);

    const bn_kernel_provider *const *list;
    const int n = bn_kernel_providers(&list);
    for (int i = 0; i < n; i++)
        if (!list[i]->runs_on_device && list[i]->is_available())
            append_name(buf, size, list[i]->name);
    return BN_OK;
}

/* Decides the backend before anything heavy is read, so that a request the
 * build cannot serve fails at once. */
static bn_status select_backend(bn_engine *e, const bn_config *cfg, const char *device,
                                bn_error *err)
{
    bn_device_request req = cfg->device;
    /* Only whether the variable is present, for the receipt and the hint;
     * its value was parsed and validated by bn_config. */
    e->requested_from = getenv("BITNET_DEVICE") ? "BITNET_DEVICE" : "default";
    if (device) {
        if (!bn_parse_device_request(device, &req))
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                "use auto, cpu, gpu, cuda or cuda:N (N a device number)",
                                "unknown device '%s'", device);
        e->requested_from = "flag";
    }
    device_text(&req, e->requested, sizeof e->requested);

    bool cuda_usable = false;
    bn_status st = detect(cfg, e->detected, sizeof e->detected, &cuda_usable, err);
    if (st != BN_OK)
        return st;

    switch (req.kind) {
    case BN_DEVICE_CPU:
        break;
    case BN_DEVICE_AUTO:
        if (cuda_usable) {
            snprintf(e->fallback, sizeof e->fallback,
                     "a CUDA GPU is usable but the CUDA inference backend is not built yet");
            bn_log(BN_LOG_INFO, "%s; computing on the CPU", e->fallback);
        }
        break;
    case BN_DEVICE_GPU:
    case BN_DEVICE_CUDA:
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            strcmp(e->requested_from, "BITNET_DEVICE") == 0
                                ? "unset BITNET_DEVICE or set it to cpu or auto"
                                : "--device auto also falls back to the CPU",
                            "the CUDA inference backend is not available in this build yet; use "
                            "--device cpu (requested %s)",
                            e->requested);
    }
    snprintf(e->selected, sizeof e->selected, "cpu");
    return BN_OK;
}

/* ---- open / free ------------------------------------------------------------ */

bn_status bn_engine_open(const bn_config *cfg_in, const bn_engine_options *opt, bn_engine **out,
                         bn_error *err)
{
    *out = NULL;
    if (!opt || (!opt->random_shape && (!opt->model_path || !opt->model_path[0])))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "name a GGUF file or a model directory",
                            "no model given");
    bn_config env_cfg;
    const bn_config *cfg = cfg_in;
    if (!cfg) {
        bn_status st = bn_config_from_env(&env_cfg, err);
        if (st != BN_OK)
            return st;
        cfg = &env_cfg;
    }
    if (opt->n_ctx < 0 || opt->n_threads < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "context and thread counts cannot be negative");

    bn_engine *e = calloc(1, sizeof *e);
    if (!e)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the engine");
    bn_status st = select_backend(e, cfg, opt->device, err);
    if (st != BN_OK) {
        bn_engine_free(e);
        return st;
    }

    const double t0 = bn_time_seconds();
    if (opt->random_shape) {
        st = bn_model_create_random(opt->random_shape, opt->random_seed, &e->model, err);
    } else {
        snprintf(e->model_path, sizeof e->model_path, "%s", opt->model_path);
        st = bn_model_load(opt->model_path, &e->model, err);
    }
    if (st != BN_OK) {
        bn_engine_free(e);
        return st;
    }
    const bn_hparams *hp = bn_model_hparams(e->model);
    if (opt->n_ctx > hp->n_ctx_train) {
        bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                     "ask for a context of at most the training context",
                     "a context of %lld positions is more than the %d this model was trained for",
                     (long long)opt->n_ctx, (int)hp->n_ctx_train);
        bn_engine_free(e);
        return BN_ERR_INVALID_ARGUMENT;
    }
    const int threads = opt->n_threads > 0 ? opt->n_threads : cfg->num_threads;
    st = bn_cpu_backend_create(e->model, opt->n_ctx, threads, &e->cpu, err);
    if (st != BN_OK) {
        bn_engine_free(e);
        return st;
    }
    e->logits = malloc((size_t)hp->vocab * sizeof(float));
    if (!e->logits) {
        bn_engine_free(e);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for %d logits",
                            (int)hp->vocab);
    }
    e->load_seconds = bn_time_seconds() - t0;
    e->threads = bn_cpu_backend_threads(e->cpu);
    snprintf(e->kernel, sizeof e->kernel, "%s", bn_cpu_backend_kernel_name(e->cpu));
    snprintf(e->startup, sizeof e->startup, "requested=%s detected=[%s] selected=%s (%s, %d %s)",
             e->requested, e->detected, e->selected, e->kernel, e->threads,
             e->threads == 1 ? "thread" : "threads");
    *out = e;
    return BN_OK;
}

void bn_engine_free(bn_engine *e)
{
    if (!e)
        return;
    bn_cpu_backend_free(e->cpu);
    bn_model_free(e->model);
    free(e->logits);
    free(e);
}

const bn_model *bn_engine_model(const bn_engine *e) { return e->model; }
const char *bn_engine_startup_line(const bn_engine *e) { return e->startup; }
int64_t bn_engine_n_ctx(const bn_engine *e) { return bn_cpu_backend_kv_len(e->cpu); }

void bn_engine_get_info(const bn_engine *e, bn_engine_info *info)
{
    memset(info, 0, sizeof *info);
    info->model_path = e->model_path;
    info->requested = e->requested;
    info->requested_from = e->requested_from;
    info->detected = e->detected;
    info->selected = e->selected;
    info->kernel = e->kernel;
    info->fallback = e->fallback;
    info->threads = e->threads;
    info->n_ctx = bn_cpu_backend_kv_len(e->cpu);
    info->load_seconds = e->load_seconds;
    info->model_weight_bytes = bn_model_weight_bytes(e->model);
    bn_cpu_memory mem;
    bn_cpu_backend_memory(e->cpu, &mem);
    info->backend_weight_bytes = mem.weights;
    info->backend_kv_bytes = mem.kv_cache;
    info->backend_scratch_bytes = mem.scratch;
    info->backend_total_bytes = mem.total;
}

/* ---- seeds ------------------------------------------------------------------ */

uint64_t bn_engine_choose_seed(const bn_config *cfg, bool have_seed, uint64_t seed, bool *fixed)
{
    *fixed = true;
    if (have_seed)
        return seed;
    if (cfg && cfg->seed_set)
        return cfg->seed;
    if (cfg && cfg->deterministic)
        return BN_ENGINE_DETERMINISTIC_SEED;
    *fixed = false;
    uint64_t r = 0;
#if defined(__linux__)
    if (getrandom(&r, sizeof r, 0) == (ssize_t)sizeof r)
        return r;
#endif
    /* No entropy source: the clock and the process id still differ per run. */
    r = bn_time_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
    return r;
}

/* ---- generation ------------------------------------------------------------- */

/* A growing byte buffer for the generated text. */
typedef struct text_buf {
    char *data;
    size_t len, cap;
} text_buf;

static bool text_append(text_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return false;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

/* Streams whatever complete text the decoder holds after `id` (or the rest,
 * when flushing) to the caller and into the text buffer. */
typedef struct streamer {
    bn_detok_stream ds;
    char *buf;
    size_t cap;
    const bn_generate_request *req;
    text_buf *text;
} streamer;

static bn_status stream_token(streamer *s, int32_t id, bool flush, bn_error *err)
{
    for (;;) {
        size_t need = flush ? bn_detok_stream_flush(&s->ds, s->buf, s->cap)
                            : bn_detok_stream_push(&s->ds, id, s->buf, s->cap);
        if (need < s->cap) {
            if (need > 0) {
                if (!text_append(s->text, s->buf, need))
                    return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                                        "no memory for the generated text");
                if (s->req->on_text)
                    s->req->on_text(s->req->ctx, s->buf, need);
            }
            return BN_OK;
        }
        /* Nothing was consumed: retry with room for the whole piece. */
        char *p = realloc(s->buf, need + 1);
        if (!p)
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to decode a token");
        s->buf = p;
        s->cap = need + 1;
    }
}

static bn_status prompt_tokens(const bn_engine *e, const bn_generate_request *req,
                               int32_t **tokens, size_t *n, bn_error *err)
{
    const int32_t vocab = bn_model_hparams(e->model)->vocab;
    if (req->prompt_tokens) {
        *tokens = malloc((req->n_prompt_tokens ? req->n_prompt_tokens : 1) * sizeof(int32_t));
        if (!*tokens)
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the prompt");
        for (size_t i = 0; i < req->n_prompt_tokens; i++) {
            if (req->prompt_tokens[i] < 0 || req->prompt_tokens[i] >= vocab) {
                free(*tokens);
                *tokens = NULL;
                return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                    "prompt token %d is outside the vocabulary (0..%d)",
                                    (int)req->prompt_tokens[i], (int)vocab - 1);
            }
            (*tokens)[i] = req->prompt_tokens[i];
        }
        *n = req->n_prompt_tokens;
        return BN_OK;
    }

    const bn_tokenizer *t = bn_model_tokenizer(e->model);
    if (!t)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "give the prompt as token ids, or use a file with tokenizer metadata "
                            "or a directory with tokenizer.json",
                            "this model has no tokenizer, so it cannot read a text prompt");
    const char *text = req->prompt ? req->prompt : "";
    if (!req->chat) {
        /* Special-token text in a prompt (e.g. "<|eot_id|>") is meant as
         * the token, as llama.cpp reads prompts too. */
        const bool add_bos = bn_tokenizer_add_bos_default(t);
        bn_status st = bn_tokenize(t, text, strlen(text), add_bos, true, tokens, n, err);
        /* Kept as asked (transformers does the same), but rarely meant. */
        if (st == BN_OK && add_bos && *n >= 2 && (*tokens)[0] == (*tokens)[1] &&
            (*tokens)[0] == bn_tokenizer_bos(t))
            bn_log(BN_LOG_WARN, "the prompt starts with BOS and the tokenizer adds another; "
                                "leave BOS out of the prompt text");
        return st;
    }
    if (bn_tokenizer_find(t, "<|eot_id|>") < 0 || bn_tokenizer_find(t, "<|begin_of_text|>") < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "run without --chat and format the prompt yourself",
                            "the chat format needs the <|begin_of_text|> and <|eot_id|> tokens, "
                            "which this model's vocabulary lacks");
    char *chat = bn_chat_prompt_2b4t(req->system ? req->system : "", text);
    if (!chat)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the chat prompt");
    /* The template starts with <|begin_of_text|> itself. */
    bn_status st = bn_tokenize(t, chat, strlen(chat), false, true, tokens, n, err);
    free(chat);
    return st;
}

void bn_generation_free(bn_generation *g)
{
    if (!g)
        return;
    free(g->prompt_tokens);
    free(g->tokens);
    free(g->text);
    memset(g, 0, sizeof *g);
    g->eog_token = -1;
}

bn_status bn_engine_generate(bn_engine *e, const bn_generate_request *req, bn_generation *g,
                             bn_error *err)
{
    memset(g, 0, sizeof *g);
    g->eog_token = -1;
    if (!req || req->n_predict < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "the number of tokens to generate must be at least 1");

    bn_status st = prompt_tokens(e, req, &g->prompt_tokens, &g->n_prompt, err);
    if (st != BN_OK)
        return st;
    if (g->n_prompt == 0) {
        bn_generation_free(g);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "give a non-empty prompt",
                            "the prompt is empty (and the vocabulary has no BOS token to start "
                            "from)");
    }
    const int64_t n_ctx = bn_cpu_backend_kv_len(e->cpu);
    if ((int64_t)g->n_prompt + req->n_predict > n_ctx) {
        const int64_t n_prompt = (int64_t)g->n_prompt;
        bn_generation_free(g);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "shorten the prompt, generate fewer tokens or use a larger context",
                            "the prompt (%lld tokens) plus %d tokens to generate needs %lld "
                            "positions, more than the context of %lld",
                            (long long)n_prompt, req->n_predict,
                            (long long)(n_prompt + req->n_predict), (long long)n_ctx);
    }

    const bn_hparams *hp = bn_model_hparams(e->model);
    const bn_tokenizer *tok = bn_model_tokenizer(e->model);
    const size_t history_cap = g->n_prompt + (size_t)req->n_predict;
    int32_t *history = malloc(history_cap * sizeof(int32_t));
    g->tokens = malloc((size_t)req->n_predict * sizeof(int32_t));
    bn_sampler *sampler = NULL;
    text_buf text = {0};
    streamer s = {.cap = 64, .req = req, .text = &text};
    s.buf = malloc(s.cap);
    if (!history || !g->tokens || !s.buf || !text_append(&text, "", 0)) {
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for generation");
        goto done;
    }
    st = bn_sampler_create(&req->sampling, hp->vocab, &sampler, err);
    if (st != BN_OK)
        goto done;
    if (tok)
        bn_detok_stream_init(&s.ds, tok);
    memcpy(history, g->prompt_tokens, g->n_prompt * sizeof(int32_t));
    size_t n_history = g->n_prompt;

    bn_cpu_backend_reset(e->cpu);
    double t0 = bn_time_seconds();
    st = bn_cpu_backend_forward(e->cpu, g->prompt_tokens, (int64_t)g->n_prompt, 0, BN_LOGITS_LAST,
                                e->logits, err);
    if (st != BN_OK)
        goto done;
    const double t1 = bn_time_seconds();
    g->prompt_seconds = t1 - t0;
    if (req->prompt_logits)
        memcpy(req->prompt_logits, e->logits, (size_t)hp->vocab * sizeof(float));

    int64_t pos = (int64_t)g->n_prompt;
    for (int i = 0; i < req->n_predict; i++) {
        const int32_t id = bn_sampler_sample(sampler, e->logits, history, n_history);
        history[n_history++] = id;
        if (tok && !req->ignore_eog && bn_tokenizer_is_eog(tok, id)) {
            g->stopped_at_eog = true;
            g->eog_token = id;
            break;
        }
        g->tokens[g->n_tokens++] = id;
        if (tok) {
            st = stream_token(&s, id, false, err);
            if (st != BN_OK)
                goto done;
        }
        if (i + 1 == req->n_predict)
            break; /* the last token needs no forward pass */
        const double f0 = bn_time_seconds();
        st = bn_cpu_backend_forward(e->cpu, &id, 1, pos, BN_LOGITS_LAST, e->logits, err);
        if (st != BN_OK)
            goto done;
        g->decode_seconds += bn_time_seconds() - f0;
        g->decode_steps++;
        pos++;
    }
    if (tok) {
        st = stream_token(&s, 0, true, err);
        if (st != BN_OK)
            goto done;
    }
    g->gen_seconds = bn_time_seconds() - t1;
    g->text = text.data;
    g->text_len = text.len;
    text.data = NULL;

done:
    free(text.data);
    free(s.buf);
    free(history);
    bn_sampler_free(sampler);
    if (st != BN_OK)
        bn_generation_free(g);
    return st;
}
