/*
 * engine_generate.c - token-by-token generation: a request's prompt, the
 * prefill, the next token picked on the device or by the host's sampler,
 * chained GPU steps, text streamed in whole characters, the next request's
 * prompt staged, forward passes that return logits (the contract is in
 * engine.h).
 */
#include "engine.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "tokenizer.h"

/* ---- generation ------------------------------------------------------------- */

/* The request's prompt tokens (malloc'ed), checked against the
 * vocabulary. */
static bn_status prompt_tokens(const bn_engine *e, const bn_generate_request *req,
                               int32_t **tokens, size_t *n, bn_error *err)
{
    *tokens = NULL;
    *n = 0;
    const int32_t vocab = bn_checkpoint_hparams(e->model)->vocab;
    if (!req->prompt_tokens && req->n_prompt_tokens)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "the prompt's tokens are NULL");
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

/* The next token as the backend picks it on the device (engine_forward,
 * the backend's forward_pick): the request's sampling and its sampler,
 * whose stream supplies each sampled pick's uniform number, so the device
 * picks what the CPU sampler would from the same logits. */
typedef struct device_pick {
    const bn_sampler_params *sp;
    bn_pick_params pp; /* the same, as the backend takes them */
    bn_sampler *sampler;
} device_pick;

/* Whether the device can pick the tokens itself: greedy or a sampler it
 * supports (a top-k of at most 64 for a large vocabulary), with no
 * repetition penalty changing the logits first (that needs the history on
 * the host). Only the token then crosses to the host, and the next step is
 * queued before the token is streamed. */
static bool device_pick_rule(const bn_engine *e, const bn_sampler_params *p)
{
    if (!(p->repeat_penalty == 1.0f || p->repeat_last_n == 0))
        return false;
    const bn_backend_ops *ops = e->backend->ops;
    if (!ops->pick_supported)
        return false;
    const bn_pick_params pp = engine_pick_params(p);
    return ops->pick_supported(e->backend, &pp);
}

bool bn_engine_picks_on_device(const bn_engine *e, const bn_sampler_params *p)
{
    return e && p && e->backend && device_pick_rule(e, p);
}

/* The uniform number of the device's next pick (0 for greedy, which draws
 * none), and its use once the device's token is in. */
static double pick_uniform(const device_pick *pick)
{
    return pick->sp->temperature > 0.0f ? bn_sampler_next_uniform(pick->sampler) : 0.0;
}
/* The same for a pick queued while `ahead` earlier ones are still to be
 * used. */
static double pick_uniform_ahead(const device_pick *pick, int ahead)
{
    return pick->sp->temperature > 0.0f ? bn_sampler_uniform_ahead(pick->sampler, ahead) : 0.0;
}
static void pick_used(const device_pick *pick)
{
    if (pick->sp->temperature > 0.0f)
        bn_sampler_skip(pick->sampler);
}

/* Runs `n` tokens at `pos` on the backend computing; history holds the
 * tokens of positions [0, pos + n), for a CPU fallback to recompute. With
 * `pick` only the token the device picks comes back (*have_next true);
 * otherwise the logits are in e->logits. */
static bn_status engine_forward(bn_engine *e, const int32_t *history, const int32_t *tokens,
                                int64_t n, int64_t pos, const device_pick *pick, int32_t *next,
                                bool *have_next, bn_error *err)
{
    *have_next = false;
    bn_backend *b = e->backend;
    const bool is_cpu = b->ops == bn_backend_cpu_ops();
    if (!b->ops->forward_pick) /* the CPU after a fallback: the host picks */
        pick = NULL;
    bn_error berr;
    bn_error_clear(&berr);
    bn_status st;
    if (pick)
        st = b->ops->forward_pick(b, tokens, n, pos, &pick->pp, pick_uniform(pick), next, &berr);
    else
        st = b->ops->forward(b, tokens, n, pos, e->logits, &berr);
    if (st == BN_OK) {
        if (pick)
            pick_used(pick);
        *have_next = pick != NULL;
        return BN_OK;
    }
    /* The request's error, or the CPU's (nothing to fall back to). */
    if (st == BN_ERR_INVALID_ARGUMENT || is_cpu) {
        if (err)
            *err = berr;
        return st;
    }
    return engine_step_failed(e, &berr, history, pos + n, err);
}

bn_status bn_engine_forward_logits(bn_engine *e, const int32_t *history, int64_t pos, int64_t n,
                                   float *logits, bn_error *err)
{
    if (!e || !history || !logits || pos < 0 || n < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "forward_logits needs tokens, a position >= 0 and n >= 1");
    const int64_t vocab = bn_checkpoint_hparams(e->model)->vocab;
    /* A backend that returns the last row's logits only runs one pass per
     * token (each a decode step; a failure falls back as in generation,
     * after which the rest runs on the CPU as one batch). */
    int64_t i = 0;
    for (; i < n && !e->backend->ops->forward_all; i++) {
        bool have_next;
        bn_status st = engine_forward(e, history, history + pos + i, 1, pos + i, NULL, NULL,
                                      &have_next, err);
        if (st != BN_OK)
            return st;
        memcpy(logits + i * vocab, e->logits, (size_t)vocab * sizeof(float));
    }
    if (i == n)
        return BN_OK;
    return e->backend->ops->forward_all(e->backend, history + pos + i, n - i, pos + i,
                                        logits + i * vocab, err);
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

/* No token can be chosen for position pos: every logit is NaN or -inf
 * (bn_sampler_sample's BN_SAMPLER_NO_TOKEN, or the device's pick saying
 * the same). The same error on every backend and sampling path, and the
 * same words perplexity uses: the model computes garbage, and a pick from
 * it would be garbage too. */
static bn_status logits_not_finite(int64_t pos, bn_error *err)
{
    return bn_error_set(err, BN_ERR_FORMAT, "the model's weights may hold values that overflow",
                        "the model's logits are not finite: every logit is NaN or -inf, so no "
                        "token can be chosen for position %lld",
                        (long long)pos);
}

bn_status bn_engine_generate(bn_engine *e, const bn_generate_request *req, bn_generation *g,
                             bn_error *err)
{
    memset(g, 0, sizeof *g);
    g->eog_token = -1;
    if (!e || !req || (!req->prompt_only && req->n_predict < 1))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "the number of tokens to generate must be at least 1");
    const int n_predict = req->prompt_only ? 0 : req->n_predict;

    bn_status st = prompt_tokens(e, req, &g->prompt_tokens, &g->n_prompt, err);
    if (st != BN_OK)
        return st;
    if (g->n_prompt == 0) {
        bn_generation_free(g);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "give a non-empty prompt",
                            "the prompt is empty (and the vocabulary has no BOS token to start "
                            "from)");
    }
    const int64_t n_ctx = e->n_ctx;
    if ((int64_t)g->n_prompt + n_predict > n_ctx) {
        const int64_t n_prompt = (int64_t)g->n_prompt;
        bn_generation_free(g);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "shorten the prompt, generate fewer tokens or use a larger context",
                            "the prompt (%lld tokens) plus %d tokens to generate needs %lld "
                            "positions, more than the context of %lld",
                            (long long)n_prompt, n_predict, (long long)(n_prompt + n_predict),
                            (long long)n_ctx);
    }
    /* Positions the cache holds for the prompt's first tokens: at least one
     * prompt token must run, for the logits after it. */
    const size_t n_cached = req->n_cached;
    if (n_cached > 0 && (n_cached >= g->n_prompt || (int64_t)n_cached > bn_engine_kv_filled(e))) {
        const size_t n_prompt = g->n_prompt;
        bn_generation_free(g);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "%zu cached positions asked for a prompt of %zu tokens, with %lld in "
                            "the cache",
                            n_cached, n_prompt, (long long)bn_engine_kv_filled(e));
    }

    const bn_hparams *hp = bn_checkpoint_hparams(e->model);
    const bn_tokenizer *tok = bn_checkpoint_tokenizer(e->model);
    const size_t history_cap = g->n_prompt + (size_t)n_predict;
    int32_t *history = malloc(history_cap * sizeof(int32_t));
    g->tokens = malloc(((size_t)n_predict + 1) * sizeof(int32_t));
    bn_sampler *sampler = NULL;
    float *raw = NULL; /* with on_logprobs: a position's logits before sampling */
    engine_text text = {0};
    engine_streamer s = {.cap = 64, .on_token = req->on_token, .ctx = req->ctx, .text = &text};
    s.buf = malloc(s.cap);
    if (!history || !g->tokens || !s.buf || !engine_text_append(&text, "", 0)) {
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

    if (n_cached == 0)
        e->backend->ops->reset(e->backend);
    const device_pick pick_spec = {
        .sp = &req->sampling, .pp = engine_pick_params(&req->sampling), .sampler = sampler};
    /* Log-probabilities need the logits on the host: no device pick. */
    const device_pick *pick =
        device_pick_rule(e, &req->sampling) && !req->on_logprobs ? &pick_spec : NULL;
    raw = req->on_logprobs ? malloc((size_t)hp->vocab * sizeof *raw) : NULL;
    if (req->on_logprobs && !raw) {
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for log-probabilities");
        goto done;
    }
    bool have_next = false;
    int32_t next = -1;
    double t0 = bn_time_seconds();
    st = engine_forward(e, history, g->prompt_tokens + n_cached,
                        (int64_t)(g->n_prompt - n_cached), (int64_t)n_cached,
                        req->prompt_logits ? NULL : pick, &next, &have_next, err);
    if (st != BN_OK)
        goto done;
    const double t1 = bn_time_seconds();
    g->prompt_seconds = t1 - t0;
    if (req->prompt_logits)
        memcpy(req->prompt_logits, e->logits, (size_t)hp->vocab * sizeof(float));

    int64_t pos = (int64_t)g->n_prompt;
    /* On a device that picks the tokens and queues steps, the step after
     * this token's is chained onto it (queued before its token is known:
     * the device feeds it), so the device runs from step to step while the
     * host streams text and waits; `in_flight`: this token's step was
     * queued that way. */
    const bn_backend_ops *ops0 = e->backend->ops;
    const bool queues = pick && ops0->submit && ops0->wait;
    bool in_flight = false;
    for (int i = 0; i < n_predict; i++) {
        if (req->cancel && atomic_load(req->cancel)) {
            g->cancelled = true;
            break;
        }
        if (raw) /* the sampler changes the logits in place */
            memcpy(raw, e->logits, (size_t)hp->vocab * sizeof *raw);
        const int32_t id = have_next ? next : bn_sampler_sample(sampler, e->logits, history,
                                                                n_history);
        if (id < 0 || id >= hp->vocab) {
            st = logits_not_finite(pos, err);
            goto done; /* a submitted step is dropped below */
        }
        history[n_history++] = id;
        if (tok && !req->ignore_eog && bn_tokenizer_is_eog(tok, id)) {
            g->stopped_at_eog = true;
            g->eog_token = id;
            break; /* a step queued past the end is dropped below */
        }
        g->tokens[g->n_tokens++] = id;
        if (raw)
            engine_logprobs_report(raw, hp->vocab, id, req->top_logprobs, req->on_logprobs,
                                   req->logprobs_ctx);
        const bool more = i + 1 < n_predict; /* the last token needs no forward pass */
        const double f0 = bn_time_seconds();
        /* On such a device the next step is queued before this token's
         * text is streamed, so detokenizing and the caller's callback
         * overlap it (a fallback to the CPU ends the queueing). */
        bool submitted = false, recomputed = false;
        bn_backend *b = e->backend;
        if (more && queues && b->ops == ops0) {
            bn_error cerr;
            bn_error_clear(&cerr);
            bn_status cst = BN_OK;
            if (!in_flight)
                cst = b->ops->submit(b, id, pos, &pick->pp, pick_uniform(pick), &cerr);
            in_flight = false;
            /* The step after it, chained: its pick is one ahead. */
            if (cst == BN_OK && i + 2 < n_predict && b->ops->submit_chained) {
                cst = b->ops->submit_chained(b, &pick->pp, pick_uniform_ahead(pick, 1), &cerr);
                in_flight = cst == BN_OK;
            }
            if (cst == BN_OK) {
                submitted = true;
            } else { /* a device failure leaves nothing pending (the backend drains
                        both steps); a request error ends the generation, and the next
                        reset drains what is left */
                if (cerr.status == BN_ERR_INVALID_ARGUMENT) { /* the request */
                    if (err)
                        *err = cerr;
                    st = cerr.status;
                } else {
                    st = engine_step_failed(e, &cerr, history, pos + 1, err);
                }
                if (st != BN_OK)
                    goto done;
                recomputed = true;
            }
        }
        if (tok) {
            st = engine_stream_token(&s, id, false, err);
            if (st != BN_OK)
                goto done; /* submitted steps are dropped below */
        } else if (req->on_token && !req->on_token(req->ctx, id, "", 0)) {
            s.stop = true;
        }
        if (s.stop) {
            g->stopped_by_caller = true;
            break; /* a step queued for this token is dropped below */
        }
        if (!more)
            break;
        have_next = false;
        if (submitted) {
            bn_error cerr;
            bn_error_clear(&cerr);
            if (e->backend->ops->wait(e->backend, &next, &cerr) == BN_OK) {
                pick_used(pick);
                have_next = true;
            } else {
                in_flight = false; /* dropped with it */
                st = engine_step_failed(e, &cerr, history, pos + 1, err);
                if (st != BN_OK)
                    goto done;
            }
            recomputed = true;
        }
        if (!recomputed) {
            st = engine_forward(e, history, &id, 1, pos, pick, &next, &have_next, err);
            if (st != BN_OK)
                goto done;
        }
        g->decode_seconds += bn_time_seconds() - f0;
        g->decode_steps++;
        pos++;
    }
    if (tok) {
        st = engine_stream_token(&s, 0, true, err);
        if (st != BN_OK)
            goto done;
    }
    g->gen_seconds = bn_time_seconds() - t1;
    g->text = text.data;
    g->text_len = text.len;
    text.data = NULL;

done:
    /* Steps queued past the last token kept (chained ahead, or for a token
     * after which the caller stopped) are discarded and their positions
     * forgotten, so that the cache holds exactly what bn_engine_kv_filled
     * says for the next request. */
    if (e->backend && e->backend->ops->pending && e->backend->ops->pending(e->backend))
        e->backend->ops->drop_pending(e->backend);
    free(text.data);
    free(s.buf);
    free(raw);
    free(history);
    bn_sampler_free(sampler);
    if (st != BN_OK)
        bn_generation_free(g);
    return st;
}
