/*
 * test_api.c - the public model / session / generation API (bitnet.h) on
 * the shipped default model, against the engine it is built on:
 *   - bn_model_open with no path finds the shipped model; the info;
 *   - tokenize / detokenize round trip, the two-call sizing convention;
 *   - greedy generation gives the engine's tokens and text; a session that
 *     goes on (no prompt) gives what one longer generation gives, reusing
 *     the cached positions; two sessions interleaved each give what they
 *     give alone; copy, truncate, reset;
 *   - stop strings (text up to the string, streamed pieces add up to it),
 *     a callback that stops, bn_session_cancel from the callback and from
 *     another thread, sampling with a seed repeats;
 *   - bn_session_eval's logits against the engine's prompt logits;
 *   - the chat format against its literal text; perplexity against the
 *     engine's;
 *   - bad arguments and a request past the context leave the session as
 *     it was.
 * usage: test_api DEVICE (cpu, or cuda: skipped without a usable GPU)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitnet.h"
#include "engine.h"
#include "test_util.h"
#include "tokenizer.h"

#define PROMPT "The LORD is my shepherd"
#define N_GREEDY 24

static const char *device;

typedef struct collected {
    char text[8192];
    size_t len;
    int calls, final_calls;
    int32_t tokens[512];
    int n_tokens;
    int stop_after;       /* return false after this many tokens (0: never) */
    bn_session *cancel_in; /* cancel this session after cancel_after tokens */
    int cancel_after;
} collected;

static bool collect(void *user, int32_t token, const char *text, size_t len)
{
    collected *c = user;
    c->calls++;
    if (token < 0)
        c->final_calls++;
    else if (c->n_tokens < 512)
        c->tokens[c->n_tokens++] = token;
    if (c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = '\0';
    }
    if (c->cancel_in && token >= 0 && c->n_tokens == c->cancel_after)
        bn_session_cancel(c->cancel_in);
    return !(c->stop_after && token >= 0 && c->n_tokens >= c->stop_after);
}

/* The engine's greedy tokens and text for PROMPT (the reference). */
static void engine_reference(const char *path, int n, bn_generation *g, float *prompt_logits)
{
    bn_config cfg;
    bn_config_defaults(&cfg);
    bn_engine_options eo = {.model_path = path, .device = device};
    bn_engine *e = NULL;
    bn_error err;
    bn_error_clear(&err);
    CHECK_MSG(bn_engine_open(&cfg, &eo, &e, &err) == BN_OK, "engine: %s", err.message);
    /* The prompt's tokens as the tokenizer gives them (BOS as it asks). */
    const bn_tokenizer *t = e ? bn_checkpoint_tokenizer(bn_engine_model(e)) : NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK(t && bn_tokenize(t, PROMPT, strlen(PROMPT), bn_tokenizer_add_bos_default(t), true, &ids,
                           &n_ids, &err) == BN_OK);
    bn_generate_request req = {.prompt_tokens = ids,
                               .n_prompt_tokens = n_ids,
                               .n_predict = n,
                               .ignore_eog = true,
                               .prompt_logits = prompt_logits};
    bn_sampler_params_default(&req.sampling);
    CHECK_MSG(e && bn_engine_generate(e, &req, g, &err) == BN_OK, "engine generate: %s",
              err.message);
    free(ids);
    bn_engine_free(e);
}

static bn_generate_params greedy(const char *prompt, int n)
{
    bn_generate_params p;
    bn_generate_params_default(&p);
    p.prompt = prompt;
    p.max_tokens = n;
    return p;
}

static size_t session_count(const bn_session *s)
{
    size_t n = 0;
    bn_error err;
    CHECK(bn_session_tokens(s, NULL, 0, &n, &err) == BN_OK);
    return n;
}

static void check_tokens_text(bn_model *m, const bn_model_info *info)
{
    bn_error err;
    size_t n = 0;
    CHECK(bn_model_tokenize(m, PROMPT, strlen(PROMPT), true, NULL, 0, &n, &err) == BN_OK);
    CHECK(n > 2);
    int32_t ids[64];
    size_t n2 = 0;
    CHECK(bn_model_tokenize(m, PROMPT, strlen(PROMPT), true, ids, 2, &n2, &err) == BN_OK);
    CHECK(n2 == n); /* the count, whatever the room */
    CHECK(n <= 64 && bn_model_tokenize(m, PROMPT, strlen(PROMPT), true, ids, 64, &n2, &err) ==
                         BN_OK);
    CHECK(info->bos < 0 || ids[0] == info->bos);
    const size_t skip = info->bos >= 0 && ids[0] == info->bos ? 1 : 0;
    char text[256];
    size_t len = 0;
    CHECK(bn_model_detokenize(m, ids + skip, n - skip, text, sizeof text, &len, &err) == BN_OK);
    CHECK_MSG(len == strlen(PROMPT) && strcmp(text, PROMPT) == 0, "round trip gave '%s'", text);
    char small[4];
    CHECK(bn_model_detokenize(m, ids + skip, n - skip, small, sizeof small, &len, &err) == BN_OK);
    CHECK(len == strlen(PROMPT) && memcmp(small, PROMPT, 4) == 0);
    const int32_t bad = info->vocab_size;
    CHECK(bn_model_detokenize(m, &bad, 1, text, sizeof text, &len, &err) ==
          BN_ERR_INVALID_ARGUMENT);
}

static void check_generation(bn_model *m, const bn_generation *ref)
{
    bn_error err;
    bn_session *s = NULL;
    CHECK(bn_session_create(m, &s, &err) == BN_OK);
    collected c = {0};
    bn_generate_params p = greedy(PROMPT, N_GREEDY);
    p.ignore_eog = true;
    bn_generate_result r;
    CHECK_MSG(bn_session_generate(s, &p, collect, &c, &r, &err) == BN_OK, "%s", err.message);
    CHECK(r.n_tokens == (size_t)N_GREEDY && r.stop == BN_STOP_MAX_TOKENS && r.n_cached == 0);
    CHECK(c.n_tokens == N_GREEDY && c.calls >= N_GREEDY);
    bool same = ref->n_tokens == (size_t)N_GREEDY;
    for (int i = 0; same && i < N_GREEDY; i++)
        same = c.tokens[i] == ref->tokens[i];
    CHECK_MSG(same, "the session's greedy tokens differ from the engine's");
    CHECK_MSG(ref->text && strcmp(c.text, ref->text) == 0, "text '%s', engine '%s'", c.text,
              ref->text ? ref->text : "");
    CHECK(session_count(s) == ref->n_prompt + (size_t)N_GREEDY);

    /* Going on: the first half, then the rest with no prompt, is the whole
     * greedy run; the second call reuses the cache. */
    bn_session_reset(s);
    CHECK(session_count(s) == 0);
    collected a = {0}, b = {0};
    p = greedy(PROMPT, N_GREEDY / 2);
    p.ignore_eog = true;
    CHECK(bn_session_generate(s, &p, collect, &a, &r, &err) == BN_OK);
    CHECK_MSG(r.n_cached == 0 || r.n_cached == ref->n_prompt - 1,
              "a first call may reuse the prompt from the run before: %zu", r.n_cached);
    p = greedy(NULL, N_GREEDY - N_GREEDY / 2);
    p.ignore_eog = true;
    CHECK(bn_session_generate(s, &p, collect, &b, &r, &err) == BN_OK);
    CHECK_MSG(r.n_cached == ref->n_prompt + N_GREEDY / 2 - 1,
              "going on reuses every computed position: %zu", r.n_cached);
    CHECK(r.n_prompt_tokens == 0);
    same = a.n_tokens + b.n_tokens == N_GREEDY;
    for (int i = 0; same && i < N_GREEDY; i++)
        same = (i < a.n_tokens ? a.tokens[i] : b.tokens[i - a.n_tokens]) == ref->tokens[i];
    CHECK_MSG(same, "half and half differ from one greedy run");
    char joined[16384];
    snprintf(joined, sizeof joined, "%s%s", a.text, b.text);
    CHECK_MSG(strcmp(joined, ref->text) == 0, "half and half text '%s'", joined);

    /* Two sessions interleaved: each gives what it gives alone. */
    bn_session *t = NULL;
    CHECK(bn_session_create(m, &t, &err) == BN_OK);
    collected x = {0}, y = {0}, z = {0};
    p = greedy("And God said", 8);
    p.ignore_eog = true;
    CHECK(bn_session_generate(t, &p, collect, &x, NULL, &err) == BN_OK);
    bn_session_reset(s);
    p = greedy(PROMPT, 4);
    p.ignore_eog = true;
    CHECK(bn_session_generate(s, &p, collect, &y, NULL, &err) == BN_OK);
    p = greedy(NULL, 4);
    p.ignore_eog = true;
    CHECK(bn_session_generate(t, &p, collect, &z, NULL, &err) == BN_OK);
    collected alone = {0};
    bn_session *u = NULL;
    CHECK(bn_session_create(m, &u, &err) == BN_OK);
    p = greedy("And God said", 12);
    p.ignore_eog = true;
    CHECK(bn_session_generate(u, &p, collect, &alone, NULL, &err) == BN_OK);
    same = alone.n_tokens == 12 && x.n_tokens == 8 && z.n_tokens == 4;
    for (int i = 0; same && i < 12; i++)
        same = alone.tokens[i] == (i < 8 ? x.tokens[i] : z.tokens[i - 8]);
    CHECK_MSG(same, "an interleaved session differs from the same session alone");
    for (int i = 0; i < 4 && y.n_tokens == 4; i++)
        CHECK(y.tokens[i] == ref->tokens[i]);

    /* Copy and truncate: a copy of the prompt's tokens goes on as the
     * original did. */
    bn_session *cp = NULL;
    const size_t n_u = session_count(u);
    CHECK(bn_session_copy(u, n_u - 4, &cp, &err) == BN_OK);
    CHECK(session_count(cp) == n_u - 4);
    collected w = {0};
    p = greedy(NULL, 4);
    p.ignore_eog = true;
    CHECK(bn_session_generate(cp, &p, collect, &w, NULL, &err) == BN_OK);
    for (int i = 0; i < 4 && w.n_tokens == 4; i++)
        CHECK(w.tokens[i] == alone.tokens[8 + i]);
    CHECK(bn_session_truncate(cp, n_u + 100, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_session_truncate(cp, 2, &err) == BN_OK && session_count(cp) == 2);
    bn_session *all = NULL;
    CHECK(bn_session_copy(u, SIZE_MAX, &all, &err) == BN_OK && session_count(all) == n_u);
    bn_session_free(all);
    bn_session_free(cp);
    bn_session_free(u);
    bn_session_free(t);
    bn_session_free(s);
}

static void check_stops(bn_model *m, const bn_generation *ref)
{
    bn_error err;
    bn_session *s = NULL;
    CHECK(bn_session_create(m, &s, &err) == BN_OK);
    /* A stop string from the middle of the greedy text. */
    const size_t L = strlen(ref->text);
    char stop[8] = "";
    if (L > 12)
        memcpy(stop, ref->text + L / 2, 3);
    const char *at = stop[0] ? strstr(ref->text, stop) : NULL;
    CHECK(at != NULL);
    collected c = {0};
    bn_generate_params p = greedy(PROMPT, N_GREEDY);
    p.ignore_eog = true;
    p.stop[0] = "never-in-this-text";
    p.stop[1] = stop;
    bn_generate_result r;
    CHECK(bn_session_generate(s, &p, collect, &c, &r, &err) == BN_OK);
    CHECK_MSG(r.stop == BN_STOP_STRING, "stop reason %d", (int)r.stop);
    CHECK_MSG(at && c.len == (size_t)(at - ref->text) && memcmp(c.text, ref->text, c.len) == 0,
              "text before the stop string '%s': '%s'", stop, c.text);
    CHECK(r.n_tokens < (size_t)N_GREEDY && session_count(s) == ref->n_prompt + r.n_tokens);

    /* A stop string that never comes: the whole text, nothing held back. */
    bn_session_reset(s);
    collected d = {0};
    p.stop[1] = NULL;
    p.stop[0] = "zzzzqqqq";
    CHECK(bn_session_generate(s, &p, collect, &d, &r, &err) == BN_OK);
    CHECK(r.stop == BN_STOP_MAX_TOKENS && strcmp(d.text, ref->text) == 0);

    /* The callback stops after 3 tokens. */
    bn_session_reset(s);
    collected e = {.stop_after = 3};
    p = greedy(PROMPT, N_GREEDY);
    p.ignore_eog = true;
    CHECK(bn_session_generate(s, &p, collect, &e, &r, &err) == BN_OK);
    CHECK_MSG(r.stop == BN_STOP_CALLBACK && r.n_tokens == 3, "stop %d after %zu", (int)r.stop,
              r.n_tokens);
    /* Cancelled from the callback at 2 tokens: no third token. */
    bn_session_reset(s);
    collected f = {.cancel_in = s, .cancel_after = 2};
    CHECK(bn_session_generate(s, &p, collect, &f, &r, &err) == BN_OK);
    CHECK_MSG(r.stop == BN_STOP_CANCELLED && r.n_tokens == 2, "stop %d after %zu", (int)r.stop,
              r.n_tokens);
    /* A cancel when nothing runs does not affect the next generation. */
    bn_session_reset(s);
    bn_session_cancel(s);
    collected g = {0};
    p.max_tokens = 4;
    CHECK(bn_session_generate(s, &p, collect, &g, &r, &err) == BN_OK);
    CHECK(r.stop == BN_STOP_MAX_TOKENS && r.n_tokens == 4);

    /* Sampling: the same seed repeats, a sequence of draws. */
    char first[8192] = "";
    for (int rep = 0; rep < 2; rep++) {
        bn_session_reset(s);
        collected h = {0};
        p = greedy(PROMPT, 16);
        p.ignore_eog = true;
        p.temperature = 0.9f;
        p.seed = 1234;
        CHECK(bn_session_generate(s, &p, collect, &h, &r, &err) == BN_OK);
        if (rep == 0)
            snprintf(first, sizeof first, "%s", h.text);
        else
            CHECK_MSG(strcmp(first, h.text) == 0, "seed 1234 gave '%s' then '%s'", first, h.text);
    }
    bn_session_free(s);
}

typedef struct canceller {
    bn_session *s;
    atomic_int started;
} canceller;

static bool count_tokens(void *user, int32_t token, const char *text, size_t len)
{
    (void)text;
    (void)len;
    canceller *c = user;
    if (token >= 0)
        atomic_store(&c->started, 1);
    return true;
}

static void *cancel_soon(void *arg)
{
    canceller *c = arg;
    for (int i = 0; i < 20000 && !atomic_load(&c->started); i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    bn_session_cancel(c->s);
    return NULL;
}

static void check_cancel_thread(bn_model *m, const bn_model_info *info)
{
    bn_error err;
    bn_session *s = NULL;
    CHECK(bn_session_create(m, &s, &err) == BN_OK);
    canceller c = {.s = s};
    atomic_init(&c.started, 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, cancel_soon, &c) == 0);
    bn_generate_params p = greedy(PROMPT, (int)(info->n_ctx - 16));
    p.ignore_eog = true;
    bn_generate_result r;
    CHECK(bn_session_generate(s, &p, count_tokens, &c, &r, &err) == BN_OK);
    pthread_join(th, NULL);
    /* The cancel may come after the last token on a fast device; it must
     * never be an error, and stop before the end when it came in time. */
    CHECK(r.stop == BN_STOP_CANCELLED || r.stop == BN_STOP_MAX_TOKENS);
    printf("cancel from another thread: stop %d after %zu of %d tokens\n", (int)r.stop,
           r.n_tokens, p.max_tokens);
    bn_session_free(s);
}

static void check_eval(bn_model *m, const bn_model_info *info, const bn_generation *ref,
                       const float *ref_logits)
{
    bn_error err;
    bn_session *s = NULL;
    CHECK(bn_session_create(m, &s, &err) == BN_OK);
    float *logits = malloc((size_t)info->vocab_size * sizeof *logits);
    CHECK(bn_session_eval(s, ref->prompt_tokens, ref->n_prompt, logits, &err) == BN_OK);
    double worst = 0.0, range = 0.0;
    int32_t best = 0;
    for (int32_t i = 0; i < info->vocab_size; i++) {
        const double d = fabs((double)logits[i] - (double)ref_logits[i]);
        worst = d > worst ? d : worst;
        range = fabs(ref_logits[i]) > range ? fabs(ref_logits[i]) : range;
        best = logits[i] > logits[best] ? i : best;
    }
    CHECK_MSG(worst <= 1e-5 * (range + 1.0), "eval logits differ from the engine's by %g", worst);
    CHECK(best == ref->tokens[0]);
    CHECK(session_count(s) == ref->n_prompt);
    /* Going on from an eval: the greedy continuation. */
    collected c = {0};
    bn_generate_params p = greedy(NULL, 4);
    p.ignore_eog = true;
    bn_generate_result r;
    CHECK(bn_session_generate(s, &p, collect, &c, &r, &err) == BN_OK);
    CHECK(r.n_cached == ref->n_prompt - 1);
    for (int i = 0; i < 4 && c.n_tokens == 4; i++)
        CHECK(c.tokens[i] == ref->tokens[i]);
    free(logits);
    bn_session_free(s);
}

/* A generation's prompt_logits are the eval's; the stats after it hold the
 * backend's memory and the kernels that ran; the receipt describes that
 * generation (and a session that has not generated has none). */
static void check_stats_receipt(bn_model *m, const bn_model_info *info, const bn_generation *ref,
                                const float *ref_logits)
{
    bn_error err;
    bn_session *s = NULL;
    CHECK(bn_session_create(m, &s, &err) == BN_OK);
    FILE *f = tmpfile();
    CHECK(f != NULL);
    const bn_receipt_options ro = {.command = "test", .chat = false, .seed_fixed = true};
    CHECK(bn_session_write_receipt(s, &ro, f, &err) == BN_ERR_INVALID_ARGUMENT);
    float *logits = malloc((size_t)info->vocab_size * sizeof *logits);
    for (int32_t i = 0; i < info->vocab_size; i++)
        logits[i] = NAN; /* poisoned: every one must be written */
    bn_generate_params p = greedy(NULL, 3);
    p.prompt_tokens = ref->prompt_tokens;
    p.n_prompt_tokens = ref->n_prompt;
    p.prompt_logits = logits;
    p.ignore_eog = true;
    bn_generate_result r;
    CHECK(bn_session_generate(s, &p, NULL, NULL, &r, &err) == BN_OK);
    double worst = 0.0, range = 0.0;
    for (int32_t i = 0; i < info->vocab_size; i++) {
        const double d = fabs((double)logits[i] - (double)ref_logits[i]);
        worst = isnan(d) ? INFINITY : d > worst ? d : worst;
        range = fabs(ref_logits[i]) > range ? fabs(ref_logits[i]) : range;
    }
    CHECK_MSG(worst <= 1e-5 * (range + 1.0), "prompt_logits differ from the engine's by %g",
              worst);
    CHECK(r.decode_steps == 2 && r.decode_seconds >= 0.0);

    bn_model_stats st;
    CHECK(bn_model_get_stats(m, &st, &err) == BN_OK);
    CHECK(st.load_seconds > 0.0 && st.model_weight_bytes > 0 && st.weights_bytes > 0);
    CHECK(st.kv_cache_bytes > 0 && st.total_bytes >= st.weights_bytes + st.kv_cache_bytes);
    CHECK(st.kernels[0] != '\0' && (strcmp(st.kv_type, "f32") == 0 || strcmp(st.kv_type, "f16") == 0));
    CHECK(st.gpu == (strncmp(info->device, "cuda", 4) == 0));
    CHECK(!st.gpu || (st.gpu_total_bytes > 0 && st.gpu_kernel_launches > 0 &&
                      st.gpu_device_total_bytes >= st.gpu_total_bytes));
    CHECK(st.gpu || st.threads > 0);
    /* Every GPU buffer comes from the pool: it holds at least the footprint. */
    CHECK(!st.gpu || (st.gpu_pool_reserved_bytes >= st.gpu_total_bytes &&
                      st.gpu_pool_peak_reserved_bytes >= st.gpu_pool_reserved_bytes &&
                      st.gpu_pool_buffers > 0 && st.gpu_pool_allocations >= st.gpu_pool_buffers &&
                      st.gpu_pool_failures == 0));
    CHECK(bn_model_get_stats(NULL, &st, &err) == BN_ERR_INVALID_ARGUMENT);

    CHECK(bn_session_write_receipt(s, &ro, f, &err) == BN_OK);
    const long size = ftell(f);
    CHECK(size > 0);
    char *json = calloc((size_t)size + 1, 1);
    rewind(f);
    CHECK(fread(json, 1, (size_t)size, f) == (size_t)size);
    CHECK_STR_CONTAINS(json, "\"command\": \"test\"");
    CHECK_STR_CONTAINS(json, "\"seed_fixed\": true");
    CHECK_STR_CONTAINS(json, "\"max_tokens\": 3");
    char want[128];
    snprintf(want, sizeof want, "\"selected\": \"%s\"", info->device);
    CHECK_STR_CONTAINS(json, want);
    CHECK_STR_CONTAINS(json, "\"stop_reason\": \"length\"");
    if (st.gpu)
        CHECK_STR_CONTAINS(json, "\"peak_reserved_bytes\"");
    free(json);
    fclose(f);
    free(logits);
    bn_session_free(s);
}

static void check_chat(bn_model *m, const bn_model_info *info)
{
    bn_error err;
    CHECK(strcmp(info->chat_template, "bitnet-2b4t") == 0);
    const bn_chat_message msgs[] = {{"system", "  Be brief. "}, {"user", "Who is my shepherd?\n"}};
    size_t len = 0;
    CHECK(bn_model_apply_chat(m, msgs, 2, true, NULL, 0, &len, &err) == BN_OK);
    char *buf = malloc(len + 1);
    size_t len2 = 0;
    CHECK(bn_model_apply_chat(m, msgs, 2, true, buf, len + 1, &len2, &err) == BN_OK);
    const char *want = "<|begin_of_text|>System: Be brief.<|eot_id|>User: Who is my "
                       "shepherd?<|eot_id|>Assistant: ";
    CHECK_MSG(len2 == len && strcmp(buf, want) == 0, "chat '%s', want '%s'", buf, want);
    free(buf);
    /* Unicode whitespace is trimmed as the CLI's chat prompt trims it. */
    const bn_chat_message nbsp[] = {{"user", "\xc2\xa0hello\xc2\xa0\x0b"}};
    char nb[256];
    CHECK(bn_model_apply_chat(m, nbsp, 1, true, nb, sizeof nb, &len, &err) == BN_OK);
    want = "<|begin_of_text|>User: hello<|eot_id|>Assistant: ";
    CHECK_MSG(strcmp(nb, want) == 0, "chat '%s', want '%s'", nb, want);
    /* Tokenizing a chat text with add_bos gives BOS once. */
    int32_t t2[64];
    size_t n_t2 = 0;
    CHECK(bn_model_tokenize(m, nb, len, true, t2, 64, &n_t2, &err) == BN_OK);
    CHECK(n_t2 >= 2 && t2[0] == info->bos && t2[1] != info->bos);
    const bn_chat_message bad[] = {{"narrator", "x"}};
    CHECK(bn_model_apply_chat(m, bad, 1, true, NULL, 0, &len, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "narrator");
    /* A chat prompt in a session: BOS once. */
    bn_session *s = NULL;
    CHECK(bn_session_create(m, &s, &err) == BN_OK);
    bn_generate_params p = greedy("<|begin_of_text|>User: hi<|eot_id|>Assistant: ", 2);
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_OK);
    int32_t ids[4];
    size_t n = 0;
    CHECK(bn_session_tokens(s, ids, 4, &n, &err) == BN_OK);
    CHECK(n >= 2 && ids[0] == info->bos && ids[1] != info->bos);
    bn_session_free(s);
}

static void check_errors(bn_model *m, const bn_model_info *info)
{
    bn_error err;
    bn_session *s = NULL;
    CHECK(bn_session_create(m, &s, &err) == BN_OK);
    bn_generate_params p = greedy(PROMPT, 4);
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_OK);
    const size_t before = session_count(s);
    /* Past the context: refused, the session unchanged. */
    p = greedy(" and more", (int)info->n_ctx);
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "more than the context");
    CHECK(session_count(s) == before);
    /* Bad parameters and ids. */
    p = greedy(PROMPT, 0);
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    p = greedy(PROMPT, 4);
    p.top_p = 2.0f;
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    p = greedy(NULL, 4);
    const int32_t bad[2] = {1, info->vocab_size};
    p.prompt_tokens = bad;
    p.n_prompt_tokens = 2;
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "outside the vocabulary");
    p = greedy(PROMPT, 4);
    p.prompt_tokens = bad;
    p.n_prompt_tokens = 1;
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    p = greedy(PROMPT, 4);
    p.stop[0] = "";
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(session_count(s) == before);
    /* An empty session with no prompt has nothing to continue from. */
    bn_session_reset(s);
    p = greedy(NULL, 4);
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    /* NULL arguments. */
    CHECK(bn_session_generate(NULL, &p, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_session_generate(s, NULL, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_session_create(NULL, &s, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_session_eval(s, NULL, 1, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_model_get_info(NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_model_tokenize(m, NULL, 3, false, NULL, 0, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_model_perplexity(m, "x", 1, -1, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_model_open(NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    bn_model_options bad_opt;
    bn_model_options_default(&bad_opt);
    bad_opt.path = "/nonexistent/model.gguf";
    bn_model *none = NULL;
    CHECK(bn_model_open(&bad_opt, &none, &err) == BN_ERR_IO && none == NULL);
    bn_model_options_default(&bad_opt);
    bad_opt.tensor_parallel = -1;
    CHECK(bn_model_open(&bad_opt, &none, &err) == BN_ERR_INVALID_ARGUMENT && none == NULL);
    bad_opt.tensor_parallel = BN_DEVICE_LIST_MAX + 1;
    CHECK(bn_model_open(&bad_opt, &none, &err) == BN_ERR_INVALID_ARGUMENT && none == NULL);
    CHECK_STR_CONTAINS(err.message, "tensor_parallel");
    bad_opt.tensor_parallel = 2;
    bad_opt.device = "cpu";
    CHECK(bn_model_open(&bad_opt, &none, &err) == BN_ERR_NO_DEVICE && none == NULL);
    bn_model_options_default(&bad_opt);
    bad_opt.batch_tokens = -1;
    CHECK(bn_model_open(&bad_opt, &none, &err) == BN_ERR_INVALID_ARGUMENT && none == NULL);
    CHECK_STR_CONTAINS(err.message, "batch_tokens");
    bad_opt.batch_tokens = BN_BATCH_TOKENS_MAX + 1;
    CHECK(bn_model_open(&bad_opt, &none, &err) == BN_ERR_INVALID_ARGUMENT && none == NULL);
    bn_session_free(NULL);
    bn_model_close(NULL);
    bn_session_cancel(NULL);
    bn_session_reset(NULL);
    bn_session_free(s);
}

static void on_ppl(void *user, int64_t chunk, int64_t n_chunks, const bn_perplexity *so_far)
{
    int *calls = user;
    (*calls)++;
    CHECK(chunk >= 1 && chunk <= n_chunks && so_far->n_predicted > 0);
}

static const char *const batch_prompts[6] = {"The LORD is my shepherd", "In the beginning",
                                             "And God said", "Blessed are the",
                                             "For God so loved", "Let there be"};

/* A model of max_sequences at once (blocks of `block`, passes of at most
 * batch_tokens rows; 0: the defaults) and one of a sequence at a time,
 * both on the test's device; false when either fails to open (both closed
 * then). */
static bool open_pair(int max_sequences, int block, int batch_tokens, bn_model **batched,
                      bn_model **alone)
{
    bn_model_options opt;
    bn_model_options_default(&opt);
    opt.device = device;
    opt.max_sequences = max_sequences;
    opt.kv_block_size = block;
    opt.batch_tokens = batch_tokens;
    bn_error err;
    *batched = *alone = NULL;
    CHECK_MSG(bn_model_open(&opt, batched, &err) == BN_OK, "%s", err.message);
    opt.max_sequences = 0;
    CHECK(bn_model_open(&opt, alone, &err) == BN_OK);
    if (*batched && *alone)
        return true;
    bn_model_close(*batched);
    bn_model_close(*alone);
    return false;
}

/* What on_logprobs reported for one generation. */
typedef struct logprob_log {
    int calls, n_top;
    int32_t token[64];
    float logprob[64], top_lp[64][5];
    int32_t top_tok[64][5];
} logprob_log;

static void on_logprob(void *user, int32_t token, float logprob, const bn_token_logprob *top,
                       int n_top)
{
    logprob_log *l = user;
    if (l->calls < 64) {
        l->token[l->calls] = token;
        l->logprob[l->calls] = logprob;
        for (int k = 0; k < n_top && k < 5; k++) {
            l->top_tok[l->calls][k] = top[k].token;
            l->top_lp[l->calls][k] = top[k].logprob;
        }
    }
    l->n_top = n_top;
    l->calls++;
}

/* Log-probabilities (bn_generate_params.on_logprobs): one call per
 * generated token; greedily, the token is the best of its top list with
 * the same log-probability, the list is ordered and its probabilities add
 * to at most 1; the tokens are those of a run without log-probabilities;
 * a model that batches reports the same numbers. top_logprobs out of range
 * is refused. */
static void check_logprobs(const bn_model_info *info)
{
    bn_model *bm, *alone;
    bn_error err;
    if (!open_pair(2, 0, 0, &bm, &alone))
        return;
    (void)info;
    logprob_log logs[2];
    int32_t plain[64];
    size_t n_plain = 0;
    for (int run = 0; run < 3; run++) {
        bn_model *m = run == 1 ? bm : alone;
        bn_session *s = NULL;
        CHECK(bn_session_create(m, &s, &err) == BN_OK);
        bn_generate_params p;
        bn_generate_params_default(&p);
        p.prompt = "And it came to pass";
        p.max_tokens = 24;
        p.temperature = 0.0f;
        logprob_log *l = run < 2 ? &logs[run] : NULL;
        if (l) {
            memset(l, 0, sizeof *l);
            p.on_logprobs = on_logprob;
            p.top_logprobs = 5;
        }
        bn_generate_result res;
        CHECK(bn_session_generate(s, &p, NULL, l, &res, &err) == BN_OK);
        if (l) {
            CHECK_MSG(l->calls == (int)res.n_tokens && l->n_top == 5, "%d calls for %zu tokens",
                      l->calls, res.n_tokens);
            for (int i = 0; i < l->calls && i < 64; i++) {
                CHECK(l->top_tok[i][0] == l->token[i] && l->top_lp[i][0] == l->logprob[i]);
                double mass = 0.0;
                for (int k = 0; k < 5; k++) {
                    mass += exp((double)l->top_lp[i][k]);
                    CHECK(l->top_lp[i][k] <= 0.0f);
                    if (k > 0)
                        CHECK(l->top_lp[i][k] <= l->top_lp[i][k - 1]);
                }
                CHECK_MSG(mass <= 1.0 + 1e-5, "top probabilities add to %g", mass);
            }
        } else {
            CHECK(bn_session_tokens(s, plain, 64, &n_plain, &err) == BN_OK && n_plain <= 64);
        }
        bn_session_free(s);
    }
    /* The tokens with and without log-probabilities (the session also
     * holds the prompt: compare the generated tail). */
    CHECK(n_plain >= (size_t)logs[0].calls);
    for (int i = 0; i < logs[0].calls && n_plain >= (size_t)logs[0].calls; i++)
        CHECK(plain[n_plain - (size_t)logs[0].calls + (size_t)i] == logs[0].token[i]);
    /* Batched and alone: the same numbers on the CPU, bit for bit. */
    if (strcmp(device, "cpu") == 0)
        CHECK(logs[0].calls == logs[1].calls &&
              memcmp(logs[0].logprob, logs[1].logprob, sizeof logs[0].logprob) == 0 &&
              memcmp(logs[0].top_tok, logs[1].top_tok, sizeof logs[0].top_tok) == 0);
    bn_session *s = NULL;
    CHECK(bn_session_create(alone, &s, &err) == BN_OK);
    bn_generate_params p;
    bn_generate_params_default(&p);
    p.prompt = "x";
    p.on_logprobs = on_logprob;
    p.top_logprobs = BN_MAX_TOP_LOGPROBS + 1;
    CHECK(bn_session_generate(s, &p, NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    bn_session_free(s);
    bn_model_close(bm);
    bn_model_close(alone);
}

/* bn_generate_batch on a model of 3 sequences at once: six items
 * (greedy and sampled, a stop string, one going on from a session that
 * holds tokens) give what bn_session_generate gives each of them alone on
 * the test's own model; an item too long for the context fails alone; a
 * session twice is refused. */
static void check_batch(const bn_model_info *info)
{
    const char *const *prompts = batch_prompts;
    bn_model *bm, *alone;
    bn_error err;
    if (!open_pair(3, 16, 0, &bm, &alone))
        return;
    bn_generate_params p[6];
    bn_batch_item items[6];
    collected got[6], want[6];
    memset(items, 0, sizeof items);
    memset(got, 0, sizeof got);
    memset(want, 0, sizeof want);
    for (int i = 0; i < 6; i++) {
        p[i] = greedy(prompts[i], 6 + 3 * i);
        p[i].ignore_eog = true;
        if (i % 2)
            p[i].temperature = 0.7f, p[i].seed = 40u + (uint64_t)i;
        if (i == 4)
            p[i].stop[0] = "e";
    }
    /* Item 5 goes on from a session that already holds a generation. */
    bn_session *pre_b = NULL, *pre_a = NULL;
    CHECK(bn_session_create(bm, &pre_b, &err) == BN_OK &&
          bn_session_create(alone, &pre_a, &err) == BN_OK);
    bn_generate_params first = greedy("Vanity of vanities", 5);
    first.ignore_eog = true;
    CHECK(bn_session_generate(pre_b, &first, NULL, NULL, NULL, &err) == BN_OK);
    CHECK(bn_session_generate(pre_a, &first, NULL, NULL, NULL, &err) == BN_OK);
    for (int i = 0; i < 6; i++) {
        bn_session *a = i == 5 ? pre_a : NULL;
        if (!a)
            CHECK(bn_session_create(alone, &a, &err) == BN_OK);
        bn_generate_result r;
        CHECK(bn_session_generate(a, &p[i], collect, &want[i], &r, &err) == BN_OK);
        if (i != 5)
            bn_session_free(a);
        items[i].session = pre_b;
        if (i != 5)
            CHECK(bn_session_create(bm, &items[i].session, &err) == BN_OK);
        items[i].params = &p[i];
        items[i].on_token = collect;
        items[i].user = &got[i];
    }
    CHECK_MSG(bn_generate_batch(bm, items, 6, &err) == BN_OK, "%s", err.message);
    for (int i = 0; i < 6; i++) {
        CHECK_MSG(items[i].status == BN_OK, "item %d: %s", i, items[i].error.message);
        CHECK_MSG(got[i].n_tokens == want[i].n_tokens && strcmp(got[i].text, want[i].text) == 0 &&
                      memcmp(got[i].tokens, want[i].tokens,
                             (size_t)want[i].n_tokens * sizeof(int32_t)) == 0,
                  "item %d: '%s' alone '%s'", i, got[i].text, want[i].text);
        CHECK(items[i].result.n_tokens == (size_t)got[i].n_tokens);
    }
    CHECK(items[4].result.stop == BN_STOP_STRING || want[4].len == 0);
    CHECK(session_count(pre_b) == session_count(pre_a));
    bn_model_stats st;
    CHECK(bn_model_get_stats(bm, &st, &err) == BN_OK);
    if (strcmp(device, "cpu") == 0)
        CHECK(st.max_sequences == 3 && st.kv_block_size == 16 && st.batch_steps > 0 &&
              st.batch_rows >= st.batch_steps && st.kv_blocks > 0);
    /* An item beyond the context fails alone; a session twice is refused. */
    memset(got, 0, sizeof got);
    bn_generate_params big = greedy(prompts[0], (int)info->n_ctx);
    items[1].params = &big;
    CHECK(bn_generate_batch(bm, items, 3, &err) == BN_OK);
    CHECK(items[0].status == BN_OK && items[2].status == BN_OK);
    CHECK(items[1].status == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(items[1].error.message, "more than the context");
    bn_session *own = items[1].session;
    items[1].session = items[0].session;
    CHECK(bn_generate_batch(bm, items, 3, &err) == BN_ERR_INVALID_ARGUMENT);
    items[1].session = own;
    CHECK_STR_CONTAINS(err.message, "share a session");
    CHECK(bn_generate_batch(bm, NULL, 1, &err) == BN_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 5; i++)
        bn_session_free(items[i].session);
    bn_session_free(pre_b);
    bn_session_free(pre_a);
    bn_model_close(bm);
    bn_model_close(alone);
}

/* Passes of at most two rows (bn_model_options.batch_tokens): the prompts
 * go in chunks of a row or two beside the decodes, in more passes, and
 * every item's tokens are still those it gives alone. */
static void check_batch_tokens(void)
{
    bn_model *bm, *alone;
    bn_error err;
    if (!open_pair(3, 0, 2, &bm, &alone))
        return;
    bn_generate_params p[3];
    bn_batch_item items[3];
    collected got[3], want[3];
    memset(items, 0, sizeof items);
    memset(got, 0, sizeof got);
    memset(want, 0, sizeof want);
    for (int i = 0; i < 3; i++) {
        p[i] = greedy(batch_prompts[i], 5);
        p[i].ignore_eog = true;
        bn_session *a = NULL;
        CHECK(bn_session_create(alone, &a, &err) == BN_OK);
        CHECK(bn_session_generate(a, &p[i], collect, &want[i], NULL, &err) == BN_OK);
        bn_session_free(a);
        CHECK(bn_session_create(bm, &items[i].session, &err) == BN_OK);
        items[i].params = &p[i];
        items[i].on_token = collect;
        items[i].user = &got[i];
    }
    CHECK_MSG(bn_generate_batch(bm, items, 3, &err) == BN_OK, "%s", err.message);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(items[i].status == BN_OK, "item %d: %s", i, items[i].error.message);
        CHECK_MSG(got[i].n_tokens == want[i].n_tokens &&
                      memcmp(got[i].tokens, want[i].tokens,
                             (size_t)want[i].n_tokens * sizeof(int32_t)) == 0,
                  "item %d with passes of 2 rows: '%s' alone '%s'", i, got[i].text, want[i].text);
        bn_session_free(items[i].session);
    }
    bn_model_stats st;
    CHECK(bn_model_get_stats(bm, &st, &err) == BN_OK);
    /* At most two rows a pass, or one a decoding item where three decode. */
    if (st.max_sequences == 3)
        CHECK_MSG(st.batch_steps > 0 && st.batch_rows <= 3 * st.batch_steps,
                  "%llu rows in %llu passes", (unsigned long long)st.batch_rows,
                  (unsigned long long)st.batch_steps);
    bn_model_close(bm);
    bn_model_close(alone);
}

/* Replicas (a CUDA device list): a session's receipt lists each replica
 * with its device and the rows it computed. */
static void check_replica_receipt(void)
{
    bn_model *bm, *alone;
    bn_error err;
    if (!open_pair(3, 16, 0, &bm, &alone))
        return;
    bn_session *s = NULL;
    CHECK(bn_session_create(bm, &s, &err) == BN_OK);
    bn_generate_params p = greedy("In the beginning", 4);
    p.ignore_eog = true;
    bn_generate_result r;
    CHECK(bn_session_generate(s, &p, NULL, NULL, &r, &err) == BN_OK);
    FILE *f = tmpfile();
    const bn_receipt_options ro = {.command = "test", .chat = false, .seed_fixed = true};
    CHECK(f && bn_session_write_receipt(s, &ro, f, &err) == BN_OK);
    const long size = f ? ftell(f) : 0;
    char *json = calloc((size_t)size + 1, 1);
    if (f && json) {
        rewind(f);
        CHECK(fread(json, 1, (size_t)size, f) == (size_t)size);
        CHECK_STR_CONTAINS(json, "\"replicas\": [");
        CHECK_STR_CONTAINS(json, "\"gpu_device\": 0");
        CHECK_STR_CONTAINS(json, "\"requested\": \"cuda:0,0\"");
        CHECK_STR_CONTAINS(json, "\"selected\": \"cuda:0,0\"");
    }
    free(json);
    if (f)
        fclose(f);
    bn_session_free(s);
    bn_model_close(bm);
    bn_model_close(alone);
}

/* Threads generating at once on a model of 4 sequences at once: each
 * bn_session_generate joins the scheduler thread's passes, and each thread
 * gets the text a model of one sequence at a time gives it. */
typedef struct thread_job {
    bn_model *m;
    const char *prompt;
    pthread_barrier_t *start;
    collected got;
    bn_status st;
} thread_job;

static void *generate_job(void *arg)
{
    thread_job *j = arg;
    bn_session *s = NULL;
    bn_error err;
    j->st = bn_session_create(j->m, &s, &err);
    pthread_barrier_wait(j->start);
    bn_generate_params p = greedy(j->prompt, 48);
    p.ignore_eog = true;
    if (j->st == BN_OK)
        j->st = bn_session_generate(s, &p, collect, &j->got, NULL, &err);
    bn_session_free(s);
    return NULL;
}

static void check_threads(void)
{
    const char *const *prompts = batch_prompts;
    bn_model *bm, *alone;
    bn_error err;
    if (!open_pair(4, 0, 0, &bm, &alone))
        return;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 6);
    thread_job jobs[6];
    pthread_t threads[6];
    for (int i = 0; i < 6; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i] = (thread_job){.m = bm, .prompt = prompts[i], .start = &start};
        CHECK(pthread_create(&threads[i], NULL, generate_job, &jobs[i]) == 0);
    }
    for (int i = 0; i < 6; i++)
        pthread_join(threads[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < 6; i++) {
        collected want = {0};
        bn_session *s = NULL;
        CHECK(bn_session_create(alone, &s, &err) == BN_OK);
        bn_generate_params p = greedy(prompts[i], 48);
        p.ignore_eog = true;
        CHECK(bn_session_generate(s, &p, collect, &want, NULL, &err) == BN_OK);
        bn_session_free(s);
        CHECK_MSG(jobs[i].st == BN_OK && strcmp(jobs[i].got.text, want.text) == 0,
                  "thread %d: '%s', alone '%s'", i, jobs[i].got.text, want.text);
    }
    bn_model_stats st;
    CHECK(bn_model_get_stats(bm, &st, &err) == BN_OK);
    if (strcmp(device, "cpu") == 0) /* the passes held rows of several threads */
        CHECK_MSG(st.batch_rows > st.batch_steps, "%llu rows in %llu passes",
                  (unsigned long long)st.batch_rows, (unsigned long long)st.batch_steps);
    printf("threads: 6 at once on a model of 4: %llu passes, %llu rows\n",
           (unsigned long long)st.batch_steps, (unsigned long long)st.batch_rows);
    bn_model_close(bm);
    bn_model_close(alone);
}

static void check_perplexity(bn_model *m, const char *path)
{
    int calls = 0;
    const char *text = "And God said, Let there be light: and there was light. And God saw the "
                       "light, that it was good: and God divided the light from the darkness.";
    bn_error err;
    bn_perplexity got;
    CHECK_MSG(bn_model_perplexity(m, text, strlen(text), 16, on_ppl, &calls, &got, &err) == BN_OK, "%s",
              err.message);
    bn_config cfg;
    bn_config_defaults(&cfg);
    bn_engine_options eo = {.model_path = path, .device = device};
    bn_engine *e = NULL;
    bn_perplexity_result want;
    CHECK(bn_engine_open(&cfg, &eo, &e, &err) == BN_OK);
    CHECK(e && bn_engine_perplexity(e, text, strlen(text), 16, NULL, NULL, &want, &err) == BN_OK);
    CHECK_MSG(got.n_predicted == want.n_predicted && got.n_chunks == want.n_chunks &&
                  fabs(got.perplexity - want.perplexity) <= 1e-9 * want.perplexity,
              "perplexity %g over %lld, engine %g over %lld", got.perplexity,
              (long long)got.n_predicted, want.perplexity, (long long)want.n_predicted);
    CHECK(calls == (int)got.n_chunks && got.ctx == 16 &&
          got.n_text_tokens == want.n_text_tokens && got.n_text_tokens > 0);
    bn_engine_free(e);
    /* After perplexity a session still gives the greedy tokens. */
}

int main(int argc, char **argv)
{
    device = argc > 1 ? argv[1] : "cpu";
    bn_error err;
    bn_model_options opt;
    bn_model_options_default(&opt);
    opt.device = device;
    bn_model *m = NULL;
    const bn_status st = bn_model_open(&opt, &m, &err);
    if (st != BN_OK && strcmp(device, "cpu") != 0 &&
        (st == BN_ERR_NO_DEVICE || st == BN_ERR_DRIVER))
        TEST_SKIP("no usable CUDA device: %s", err.message);
    CHECK_MSG(st == BN_OK, "bn_model_open: %s", err.message);
    if (!m)
        TEST_EXIT();
    bn_model_info info;
    CHECK(bn_model_get_info(m, &info, &err) == BN_OK);
    printf("model %s: %s on %s (%s), vocab %d, ctx %lld, chat '%s'\n", info.path,
           info.architecture, info.device, info.device_name, (int)info.vocab_size,
           (long long)info.n_ctx, info.chat_template);
    CHECK(strstr(info.path, "bitnet-kjv-7m") != NULL && info.has_tokenizer);
    CHECK(strncmp(info.device, device, strlen(device)) == 0);
    CHECK(info.vocab_size > 0 && info.n_ctx > 64 && info.n_layer > 0 && info.n_params > 0);
    CHECK_STR_CONTAINS(info.selection, "selected=");
    CHECK(info.fallback[0] == '\0');

    float *ref_logits = malloc((size_t)info.vocab_size * sizeof *ref_logits);
    bn_generation ref;
    engine_reference(info.path, N_GREEDY, &ref, ref_logits);
    CHECK(ref.n_tokens == (size_t)N_GREEDY && ref.text != NULL);
    check_tokens_text(m, &info);
    check_generation(m, &ref);
    check_stops(m, &ref);
    check_cancel_thread(m, &info);
    check_eval(m, &info, &ref, ref_logits);
    check_stats_receipt(m, &info, &ref, ref_logits);
    check_chat(m, &info);
    check_errors(m, &info);
    check_perplexity(m, info.path);
    check_batch(&info);
    check_batch_tokens();
    if (strcmp(device, "cpu") != 0) {
        /* The same through two replicas on one GPU. */
        const char *one = device;
        device = "cuda:0,0";
        check_batch(&info);
        check_replica_receipt();
        device = one;
    }
    check_logprobs(&info);
    check_threads();
    bn_generation_free(&ref);
    free(ref_logits);
    bn_model_close(m);
    TEST_EXIT();
}
