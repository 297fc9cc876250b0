/*
 * fuzz_engine.c - the path every user takes, on a GGUF file made of
 * arbitrary bytes: bn_engine_open on the CPU (the model loader, then the
 * CPU backend packing every projection for its kernels), generation from a
 * text prompt, in the chat format and from token ids, refused requests,
 * the receipt, and perplexity (src/engine/engine.c and perplexity.c).
 *
 * The input goes into a memfd and is opened as /proc/self/fd/N, as
 * `bitnet run -m FILE --device cpu` opens a file. Work per input is
 * bounded by the options, never by the file: one thread, a KV cache of
 * FUZZ_CTX positions (the model's training context when that is shorter),
 * 2 generated tokens per request, a short perplexity text in pieces of
 * FUZZ_PPL_CTX. The weights a file can describe are bounded by its size
 * (bn_checkpoint_check_fits), so a forward pass stays cheap at the few hundred
 * KB of the seeds.
 *
 * GPU detection is replaced by BITNET_GPU_FAKE=none's (no device): with
 * device "cpu" it only fills the startup line, and the real one runs
 * external programs and loads drivers, which nothing in the file changes.
 *
 * Checked beyond "no crash, leak or undefined behaviour": every error
 * leaves a message; token ids inside the vocabulary are never refused as
 * such, and ids outside it always are; generated ids are inside the
 * vocabulary; the streamed text is the returned text; perplexity is at
 * least 1 and scores the number of tokens its chunking rule says.
 *
 * Seeds: fuzz/corpus/engine (the model fixtures of tests/data/models cut
 * to one layer, with their tokenizer, and one without a tokenizer and with
 * a training context of 8 positions).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "fuzz_common.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* KV cache positions asked for, and the perplexity's context. */
#define FUZZ_CTX 64
#define FUZZ_PPL_CTX 8
#define FUZZ_PREDICT 2

static bn_config g_cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    bn_log_set_level(BN_LOG_ERROR); /* "no tokenizer metadata" and the like */
    bn_config_defaults(&g_cfg);
    g_cfg.gpu_fake_set = true; /* BITNET_GPU_FAKE=none: no GPU, nothing probed */
    g_cfg.gpu_fake_mask = 0;
    g_cfg.num_threads = 1;
    return 0;
}

/* What the text callback saw, to compare with the returned text. */
typedef struct streamed {
    size_t bytes;
    unsigned sum;
} streamed;

static bool on_token(void *ctx, int32_t token, const char *text, size_t len)
{
    streamed *s = ctx;
    if (token < 0 && len == 0)
        fuzz_die("the final text call got an empty piece", NULL);
    s->bytes += len;
    s->sum += fuzz_touch(text, len);
    return true;
}

static void on_progress(void *ctx, int64_t chunk, int64_t n_chunks,
                        const bn_perplexity_result *so_far)
{
    int64_t *calls = ctx;
    if (chunk != ++*calls || chunk > n_chunks || so_far->n_chunks != chunk)
        fuzz_die("perplexity progress out of order", NULL);
}

static void sampling(bn_sampler_params *p, float temperature, int top_k, uint64_t seed)
{
    bn_sampler_params_default(p);
    p->temperature = temperature;
    p->top_k = top_k;
    p->seed = seed;
}

/* The generated tokens and text of a successful request. */
static void check_generation(const bn_engine *e, const bn_generation *g, const streamed *s,
                             bool have_tokenizer)
{
    const int32_t vocab = bn_checkpoint_hparams(bn_engine_model(e))->vocab;
    if (g->n_prompt == 0 || !g->prompt_tokens)
        fuzz_die("a generation without prompt tokens", NULL);
    for (size_t i = 0; i < g->n_prompt; i++)
        if (g->prompt_tokens[i] < 0 || g->prompt_tokens[i] >= vocab)
            fuzz_die("a prompt token outside the vocabulary", NULL);
    if (g->n_tokens > FUZZ_PREDICT || (g->n_tokens > 0 && !g->tokens))
        fuzz_die("more tokens than asked for", NULL);
    for (size_t i = 0; i < g->n_tokens; i++)
        if (g->tokens[i] < 0 || g->tokens[i] >= vocab)
            fuzz_die("a generated token outside the vocabulary", NULL);
    if (g->stopped_at_eog != (g->eog_token >= 0) || g->eog_token >= vocab)
        fuzz_die("an inconsistent end-of-generation token", NULL);
    if (!g->text || g->text[g->text_len] != '\0')
        fuzz_die("the generated text is not terminated", NULL);
    if (s->bytes != g->text_len || s->sum != fuzz_touch(g->text, g->text_len))
        fuzz_die("the streamed text differs from the returned text", NULL);
    if (!have_tokenizer && g->text_len != 0)
        fuzz_die("text generated without a tokenizer", NULL);
}

/* The receipt of a run, written where `bitnet run --receipt` writes it. */
static void write_receipt(const bn_engine *e, const bn_generate_request *req,
                          const bn_generation *g)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        fuzz_die("open_memstream", NULL);
    const bn_receipt_info info = {.command = "run", .req = req, .gen = g, .seed_fixed = true};
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_engine_write_receipt(e, &info, f, &err);
    fuzz_check_error(st, &err);
    if (fclose(f) != 0)
        fuzz_die("fclose of a memstream", NULL);
    if (st == BN_OK && (len == 0 || buf[0] != '{'))
        fuzz_die("the receipt is not a JSON object", NULL);
    free(buf);
}

/* One request; returns its status after checking what came back. */
static bn_status generate(bn_engine *e, bn_generate_request *req, bool receipt)
{
    const bn_checkpoint *m = bn_engine_model(e);
    const bool have_tokenizer = bn_checkpoint_tokenizer(m) != NULL;
    streamed s = {0};
    req->on_token = on_token;
    req->ctx = &s;
    bn_generation g;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_engine_generate(e, req, &g, &err);
    fuzz_check_error(st, &err);
    if (st != BN_OK) {
        if (g.prompt_tokens || g.tokens || g.text || g.n_tokens)
            fuzz_die("a failed generation left results behind", err.message);
        return st;
    }
    check_generation(e, &g, &s, have_tokenizer);
    if (receipt)
        write_receipt(e, req, &g);
    bn_generation_free(&g);
    return st;
}

static void run_requests(bn_engine *e)
{
    const bn_hparams *hp = bn_checkpoint_hparams(bn_engine_model(e));
    const int32_t vocab = hp->vocab;
    const int64_t n_ctx = bn_engine_n_ctx(e);

    /* A text prompt, special-token text included, tokenized as the API
     * does for `bitnet run -p`, then the 2B-4T chat text (its special
     * tokens read as such where the vocabulary has them). */
    const bn_tokenizer *tok = bn_checkpoint_tokenizer(bn_engine_model(e));
    float *prompt_logits = malloc((size_t)vocab * sizeof *prompt_logits);
    if (!prompt_logits)
        fuzz_die("out of memory", NULL);
    static const char *const texts[] = {
        "Hello w\xC3\xB6rld<|eot_id|> the",
        "<|begin_of_text|>System: Be brief.<|eot_id|>User: Hi<|eot_id|>Assistant: "};
    for (size_t i = 0; tok && i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        bn_error terr;
        bn_error_clear(&terr);
        const bn_status tst = bn_tokenize(tok, texts[i], strlen(texts[i]),
                                          bn_tokenizer_add_bos_default(tok), true, &ids, &n_ids,
                                          &terr);
        fuzz_check_error(tst, &terr);
        if (tst != BN_OK)
            continue;
        bn_generate_request req = {.prompt_tokens = ids,
                                   .n_prompt_tokens = n_ids,
                                   .n_predict = FUZZ_PREDICT,
                                   .chat = i == 1,
                                   .prompt_logits = i == 0 ? prompt_logits : NULL};
        sampling(&req.sampling, i == 0 ? 0.8f : 1.0f, i == 0 ? 40 : 0, i == 0 ? 1234 : 7);
        if (i == 0) {
            req.sampling.top_p = 0.95f;
            req.sampling.min_p = 0.05f;
            req.sampling.repeat_penalty = 1.1f;
            req.sampling.repeat_last_n = 64;
        }
        (void)generate(e, &req, i == 0);
        free(ids);
    }
    free(prompt_logits);
    bn_generate_request req;

    /* Token ids at both ends of the vocabulary: never refused as such. */
    const int32_t ids[] = {0, vocab - 1, vocab / 2};
    req = (bn_generate_request){.prompt_tokens = ids,
                                .n_prompt_tokens = sizeof ids / sizeof ids[0],
                                .n_predict = FUZZ_PREDICT, .ignore_eog = true};
    sampling(&req.sampling, 1.5f, 3, 99);
    bn_status st = generate(e, &req, true);
    if (st == BN_ERR_INVALID_ARGUMENT && (int64_t)req.n_prompt_tokens + FUZZ_PREDICT <= n_ctx)
        fuzz_die("token ids inside the vocabulary were refused", NULL);

    /* Ids outside the vocabulary, and nothing to generate: refused. */
    const int32_t past[] = {0, vocab};
    const int32_t negative[] = {-1};
    const struct {
        const int32_t *ids;
        size_t n;
        int n_predict;
    } bad[] = {{past, 2, FUZZ_PREDICT}, {negative, 1, FUZZ_PREDICT}, {ids, 1, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        req = (bn_generate_request){.prompt_tokens = bad[i].ids, .n_prompt_tokens = bad[i].n,
                                    .n_predict = bad[i].n_predict};
        sampling(&req.sampling, 0.8f, 40, 5);
        if (generate(e, &req, false) != BN_ERR_INVALID_ARGUMENT)
            fuzz_die("a request with a bad token id or n_predict was not refused", NULL);
    }
}

static void run_perplexity(bn_engine *e)
{
    static const char text[] = "The Word was with God.\n<|eot_id|> Caf\xC3\xA9 \xE2\x96";
    const bn_tokenizer *tok = bn_checkpoint_tokenizer(bn_engine_model(e));
    const int64_t n_ctx = bn_engine_n_ctx(e);
    bn_perplexity_result r;
    bn_error err;

    /* Contexts outside 2..n_ctx are refused. */
    const int64_t bad_ctx[] = {1, n_ctx + 1};
    for (size_t i = 0; i < 2; i++) {
        bn_error_clear(&err);
        bn_status st = bn_engine_perplexity(e, text, sizeof text - 1, bad_ctx[i], NULL, NULL,
                                            &r, &err);
        fuzz_check_error(st, &err);
        if (st != BN_ERR_INVALID_ARGUMENT)
            fuzz_die("perplexity accepted a context outside 2..n_ctx", NULL);
    }

    const int64_t ctx = n_ctx < FUZZ_PPL_CTX ? n_ctx : FUZZ_PPL_CTX;
    int64_t calls = 0;
    bn_error_clear(&err);
    bn_status st = bn_engine_perplexity(e, text, sizeof text - 1, ctx, on_progress, &calls, &r,
                                        &err);
    fuzz_check_error(st, &err);
    if (st != BN_OK) {
        if (!tok && st != BN_ERR_INVALID_ARGUMENT)
            fuzz_die("perplexity without a tokenizer was not refused as such", err.message);
        return;
    }
    if (!tok)
        fuzz_die("perplexity ran without a tokenizer", NULL);
    const int64_t piece = bn_tokenizer_bos(tok) >= 0 ? ctx - 1 : ctx;
    const int64_t chunks = (r.n_text_tokens + piece - 1) / piece;
    const int64_t predicted =
        bn_tokenizer_bos(tok) >= 0 ? r.n_text_tokens : r.n_text_tokens - chunks;
    if (r.ctx != ctx || r.n_chunks != chunks || calls != chunks || r.n_predicted != predicted)
        fuzz_die("perplexity did not score what its chunking rule says", NULL);
    if (!(r.mean_nll >= 0.0) || !(r.perplexity >= 1.0) || !isfinite(r.mean_nll))
        fuzz_die("a perplexity below 1 or not finite", NULL);
}

/* Opens an engine on path with a KV cache of n_ctx positions. */
static bn_status open_engine(const char *path, int64_t n_ctx, bn_engine **e)
{
    const bn_engine_options opt = {.model_path = path, .device = "cpu", .n_threads = 1,
                                   .n_ctx = n_ctx};
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_engine_open(&g_cfg, &opt, e, &err);
    fuzz_check_error(st, &err);
    if ((st == BN_OK) != (*e != NULL))
        fuzz_die("bn_engine_open's status and engine disagree", err.message);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    bn_engine *e = NULL;
    int64_t n_ctx = FUZZ_CTX;
    bn_status st = open_engine(path, n_ctx, &e);
    if (st == BN_ERR_INVALID_ARGUMENT) {
        /* Refused, as it must be, when the model was trained for fewer
         * positions: open it with its own context then. */
        bn_checkpoint *m = NULL;
        bn_error err;
        bn_error_clear(&err);
        if (bn_checkpoint_load(path, &m, &err) == BN_OK) {
            const int ctx_train = bn_checkpoint_hparams(m)->n_ctx_train;
            bn_checkpoint_free(m);
            if (ctx_train < FUZZ_CTX) {
                n_ctx = ctx_train;
                st = open_engine(path, n_ctx, &e);
            }
        }
    }
    close(fd); /* the model keeps its own mapping */
    if (st != BN_OK)
        return 0;

    if (bn_engine_n_ctx(e) != n_ctx)
        fuzz_die("the engine's context is not the one asked for", NULL);
    const char *line = bn_engine_startup_line(e);
    fuzz_touch(line, strlen(line));
    bn_engine_info info;
    bn_engine_get_info(e, &info);
    if (strcmp(info.selected, "cpu") != 0 || info.gpu)
        fuzz_die("device cpu did not select the CPU", info.selected);

    run_requests(e);
    run_perplexity(e);
    bn_engine_free(e);
    return 0;
}
