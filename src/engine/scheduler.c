/*
 * scheduler.c - many sequences at once (continuous batching): every step
 * gathers rows of the running sequences into one forward pass over the
 * backend's paged KV cache (bn_backend_ops.forward_rows), and sequences
 * join and leave between steps. The contract is in engine.h
 * (bn_engine_generate_batch).
 *
 * A sequence's history is its prompt followed by the tokens generated so
 * far; the positions [0, computed) of it are in the cache, and the last
 * history token is always still to compute: its logits give the next
 * token. A step gives each running sequence rows in admission order:
 *
 *   1. every sequence with one row left (decoding) gets it, so decodes are
 *      never starved by long prompts;
 *   2. the others (prefilling) share what is left of the token budget,
 *      first come first served, a prompt in chunks across steps.
 *
 * A row's KV needs a block of the cache (kv_blocks.h). When none is free,
 * the newest running sequence is preempted: its blocks are released (full,
 * computed ones stay cached, so its prefix usually comes back from the
 * cache; blocks it took in this step are freed, never computed) and
 * it waits at the head of the queue to be computed again from its history.
 * The tokens it already streamed are not streamed again, and its sampler
 * goes on from where it was, so preemption changes no token. A request
 * that could not fit the cache even alone fails by itself.
 *
 * Without forward_rows (or with one sequence at a time) the requests run
 * one after another through bn_engine_generate.
 *
 * Replicas (cuda:N,M,...): the engine holds one more engine per further
 * device (engine.c), and the batcher one lane per engine, each the
 * scheduler above over its own cache. A new request joins the lane with
 * the fewest requests not ended; a step gathers every lane's rows, runs
 * the lanes' passes at once (one host thread a further lane, each binding
 * its device), then hands out every lane's tokens on the calling thread,
 * so callbacks never run on another thread.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

typedef enum seq_state { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE } seq_state;

typedef struct seq {
    bn_batch_request req;   /* a copy: the caller's may go once added       */
    bn_batch_result *out;
    seq_state state;
    int32_t kv;             /* its sequence in the block table, -1 when none */
    int32_t *history;       /* prompt + generated: n_prompt + n_predict room */
    size_t n_hist;
    int64_t computed;       /* positions in the cache                      */
    int64_t admitted_at;    /* admission order: the newest is preempted    */
    bn_sampler *sampler;
    bool device_pick;       /* the backend can pick its tokens on the device */
    engine_streamer stream;
    engine_text text;
    double t_added, t_admitted;
    bool have_first;
} seq;

/* A pass one lane runs (step_prepare -> step_forward -> step_finish). */
typedef struct lane_pass {
    bn_batch_rows rows;
    int64_t n_logits;
    bool pick, decode_only;
    double t0, t1;
    bn_status status;
    bn_error err;
} lane_pass;

/* The scheduler over one engine's paged cache. */
struct lane {
    bn_engine *e;
    seq **seqs;             /* the requests not yet reported ended, in order */
    size_t n, cap;
    int64_t admissions;
    /* One step's rows. */
    int32_t *tokens, *row_seq;
    int64_t *pos, *logit_rows;
    seq **logit_owner;      /* the seq of each logit row */
    float *logits;
    float *raw;             /* a logits row before sampling (log-probabilities) */
    /* A step whose tokens the device picks: each logit row's sampling,
     * uniform number and token. */
    bn_pick_params *picks;
    double *uniform;
    int32_t *picked;
    int64_t cap_rows;
    const int32_t **tables;
    int32_t *table_len;
    lane_pass pass;
};
typedef struct lane sched;

/* The batcher: one lane per engine (the first, then its replicas), and a
 * host thread for each lane after the first, woken to run its pass. */
struct bn_batcher {
    sched **lanes;
    int n_lanes;
    pthread_t *threads;
    int n_threads;          /* started                                     */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t round;         /* incremented to start the workers' passes     */
    int pending;            /* workers still running this round's pass      */
    bool quit;
    bool sync_ready;        /* mu, go and done initialised                  */
};

static bn_status seq_fail(seq *s, bn_kv_blocks *kv, const bn_error *err)
{
    if (s->kv >= 0)
        bn_kv_seq_close(kv, s->kv);
    s->kv = -1;
    s->state = SEQ_DONE;
    s->out->status = err->status;
    s->out->error = *err;
    return err->status;
}

/* Ends a sequence: its text, tokens and flags into its result, its blocks
 * released (full ones stay cached for later prompts). */
static void seq_finish(sched *sc, seq *s)
{
    bn_kv_blocks *kv = sc->e->kv;
    bn_generation *g = &s->out->gen;
    if (s->kv >= 0)
        bn_kv_seq_close(kv, s->kv);
    s->kv = -1;
    s->state = SEQ_DONE;
    bn_error err;
    bn_error_clear(&err);
    if (s->stream.buf && engine_stream_token(&s->stream, 0, true, &err) != BN_OK) {
        seq_fail(s, kv, &err);
        return;
    }
    g->text = s->text.data;
    g->text_len = s->text.len;
    s->text.data = NULL;
    g->gen_seconds = bn_time_seconds() - s->t_admitted - g->prompt_seconds;
    s->out->status = BN_OK;
}

/* The next token of a sequence from its logits row (or, logits NULL, the
 * token the device picked); false once it ends. */
static bool seq_take_token(sched *sc, seq *s, float *logits, int32_t picked)
{
    const bn_batch_request *r = &s->req;
    bn_generation *g = &s->out->gen;
    const bn_tokenizer *tok = bn_checkpoint_tokenizer(sc->e->model);
    const int32_t vocab = bn_checkpoint_hparams(sc->e->model)->vocab;
    if (!s->have_first) {
        s->have_first = true;
        g->prompt_seconds = bn_time_seconds() - s->t_admitted;
        s->out->first_token_seconds = bn_time_seconds() - s->t_added;
        if (r->prompt_logits && logits)
            memcpy(r->prompt_logits, logits, (size_t)vocab * sizeof(float));
    } else {
        g->decode_steps++;
    }
    if (r->cancel && atomic_load(r->cancel)) {
        g->cancelled = true;
        return false;
    }
    int32_t id = picked;
    if (logits && r->on_logprobs) /* the sampler changes the logits in place */
        memcpy(sc->raw, logits, (size_t)vocab * sizeof *sc->raw);
    if (logits)
        id = bn_sampler_sample(s->sampler, logits, s->history, s->n_hist);
    else if (r->sampling.temperature > 0.0f)
        bn_sampler_skip(s->sampler); /* the number the device's draw used */
    bn_error err;
    bn_error_clear(&err);
    if (id < 0 || id >= vocab) {
        bn_error_set(&err, BN_ERR_FORMAT, "the model's weights may hold values that overflow",
                     "the model's logits are not finite: every logit is NaN or -inf, so no "
                     "token can be chosen for position %lld",
                     (long long)s->n_hist);
        seq_fail(s, sc->e->kv, &err);
        return false;
    }
    if (tok && !r->ignore_eog && bn_tokenizer_is_eog(tok, id)) {
        g->stopped_at_eog = true;
        g->eog_token = id;
        return false;
    }
    s->history[s->n_hist++] = id;
    g->tokens[g->n_tokens++] = id;
    if (logits && r->on_logprobs)
        engine_logprobs_report(sc->raw, vocab, id, r->top_logprobs, r->on_logprobs,
                               r->logprobs_ctx);
    if (tok) {
        if (engine_stream_token(&s->stream, id, false, &err) != BN_OK) {
            seq_fail(s, sc->e->kv, &err);
            return false;
        }
    } else if (r->on_token && !r->on_token(r->ctx, id, "", 0)) {
        s->stream.stop = true;
    }
    if (s->stream.stop) {
        g->stopped_by_caller = true;
        return false;
    }
    return g->n_tokens < (size_t)r->n_predict;
}

/* Sets a request up; a request that cannot run fails alone. */
static bn_status seq_init(sched *sc, seq *s, const bn_batch_request *r, bn_batch_result *out)
{
    bn_engine *e = sc->e;
    const bn_hparams *hp = bn_checkpoint_hparams(e->model);
    /* Every field but done, which the caller set and may be reading. */
    out->status = BN_OK;
    bn_error_clear(&out->error);
    memset(&out->gen, 0, sizeof out->gen);
    out->gen.eog_token = -1;
    out->reused = 0;
    out->preemptions = 0;
    out->first_token_seconds = 0.0;
    s->req = *r;
    s->out = out;
    s->t_added = bn_time_seconds();
    s->kv = -1;
    s->state = SEQ_WAITING;
    bn_error err;
    bn_error_clear(&err);
    const size_t room = r->n_prompt + (size_t)(r->n_predict > 0 ? r->n_predict : 0);
    if (r->n_prompt == 0 || r->n_predict < 1)
        bn_error_set(&err, BN_ERR_INVALID_ARGUMENT, "give a non-empty prompt and n_predict >= 1",
                     "a request needs prompt tokens and at least one token to generate");
    else if ((int64_t)room > e->n_ctx)
        bn_error_set(&err, BN_ERR_INVALID_ARGUMENT,
                     "shorten the prompt, generate fewer tokens or use a larger context",
                     "the prompt (%zu tokens) plus %d tokens to generate needs %zu positions, "
                     "more than the context of %lld",
                     r->n_prompt, r->n_predict, room, (long long)e->n_ctx);
    else if (bn_kv_blocks_for(e->kv, (int64_t)room) > e->kv_cfg.n_blocks)
        bn_error_set(&err, BN_ERR_OUT_OF_MEMORY,
                     "raise the KV cache size or shorten the request",
                     "the request needs %zu positions, more than the whole KV cache holds (%lld "
                     "positions in blocks of %d)",
                     room, (long long)e->kv_cfg.n_blocks * e->kv_cfg.block_size,
                     e->kv_cfg.block_size);
    if (err.status != BN_OK)
        return seq_fail(s, e->kv, &err);
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= hp->vocab) {
            bn_error_set(&err, BN_ERR_INVALID_ARGUMENT, NULL,
                         "prompt token %d is outside the vocabulary (0..%d)", (int)r->prompt[i],
                         (int)hp->vocab - 1);
            return seq_fail(s, e->kv, &err);
        }
    s->history = malloc(room * sizeof *s->history);
    out->gen.prompt_tokens = malloc(r->n_prompt * sizeof(int32_t));
    out->gen.tokens = malloc(((size_t)r->n_predict + 1) * sizeof(int32_t));
    s->stream.cap = 64;
    s->stream.buf = malloc(s->stream.cap);
    if (!s->history || !out->gen.prompt_tokens || !out->gen.tokens || !s->stream.buf ||
        !engine_text_append(&s->text, "", 0)) {
        bn_error_set(&err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a request");
        return seq_fail(s, e->kv, &err);
    }
    if (bn_sampler_create(&r->sampling, hp->vocab, &s->sampler, &err) != BN_OK)
        return seq_fail(s, e->kv, &err);
    /* Log-probabilities need the logits on the host. */
    s->device_pick = e->backend->ops->forward_rows_pick && !r->on_logprobs &&
                     bn_engine_picks_on_device(e, &r->sampling);
    memcpy(s->history, r->prompt, r->n_prompt * sizeof *s->history);
    memcpy(out->gen.prompt_tokens, r->prompt, r->n_prompt * sizeof(int32_t));
    out->gen.n_prompt = r->n_prompt;
    s->n_hist = r->n_prompt;
    const bn_tokenizer *tok = bn_checkpoint_tokenizer(e->model);
    if (tok)
        bn_detok_stream_init(&s->stream.ds, tok);
    s->stream.on_token = r->on_token;
    s->stream.ctx = r->ctx;
    s->stream.text = &s->text;
    return BN_OK;
}

static void seq_free(seq *s)
{
    free(s->history);
    free(s->stream.buf);
    free(s->text.data);
    bn_sampler_free(s->sampler);
}

/* Opens the waiting sequence in the cache, taking whatever prefix of its
 * history the cache already holds. */
static bool seq_admit(sched *sc, seq *s)
{
    bn_kv_blocks *kv = sc->e->kv;
    bn_error err;
    if (bn_kv_seq_open(kv, &s->kv, &err) != BN_OK)
        return false;
    int64_t reused = 0;
    if (bn_kv_seq_reuse_prefix(kv, s->kv, s->history, (int64_t)s->n_hist, &reused, &err) !=
        BN_OK) {
        bn_kv_seq_close(kv, s->kv);
        s->kv = -1;
        return false;
    }
    s->computed = reused;
    if (s->out->reused == 0 && !s->have_first)
        s->out->reused = reused;
    s->state = SEQ_RUNNING;
    s->admitted_at = sc->admissions++;
    if (!s->have_first)
        s->t_admitted = bn_time_seconds();
    return true;
}

/* Frees the newest running sequence's blocks (but not `keep`'s); it waits
 * to be computed again. False when there is none. */
static bool preempt_newest(sched *sc, const seq *keep)
{
    seq *newest = NULL;
    for (size_t i = 0; i < sc->n; i++) {
        seq *s = sc->seqs[i];
        if (s->state == SEQ_RUNNING && s != keep &&
            (!newest || s->admitted_at > newest->admitted_at))
            newest = s;
    }
    if (!newest)
        return false;
    bn_kv_seq_close(sc->e->kv, newest->kv);
    newest->kv = -1;
    newest->computed = 0;
    newest->state = SEQ_WAITING;
    newest->out->preemptions++;
    sc->e->preemptions++;
    return true;
}

/* *p grown to n elements of `size` bytes; false (and *p as it was) when
 * there is no memory. */
static bool grow(void **p, int64_t n, size_t size)
{
    void *q = realloc(*p, (size_t)n * size);
    if (q)
        *p = q;
    return q != NULL;
}

static bool reserve_rows(sched *sc, int64_t n)
{
    if (n <= sc->cap_rows)
        return true;
    const size_t vocab = (size_t)bn_checkpoint_hparams(sc->e->model)->vocab;
    bool ok = grow((void **)&sc->tokens, n, sizeof *sc->tokens);
    ok = grow((void **)&sc->row_seq, n, sizeof *sc->row_seq) && ok;
    ok = grow((void **)&sc->pos, n, sizeof *sc->pos) && ok;
    ok = grow((void **)&sc->logit_rows, n, sizeof *sc->logit_rows) && ok;
    ok = grow((void **)&sc->logit_owner, n, sizeof *sc->logit_owner) && ok;
    ok = grow((void **)&sc->logits, n, vocab * sizeof *sc->logits) && ok;
    ok = grow((void **)&sc->picks, n, sizeof *sc->picks) && ok;
    ok = grow((void **)&sc->uniform, n, sizeof *sc->uniform) && ok;
    ok = grow((void **)&sc->picked, n, sizeof *sc->picked) && ok;
    if (ok)
        sc->cap_rows = n;
    return ok;
}

/* Gives sequence s up to `want` rows of its history in this step, taking
 * cache blocks for them (preempting newer sequences when there are none);
 * returns the rows given. */
static int64_t take_rows(sched *sc, seq *s, int64_t want, int64_t *n_rows, int64_t *n_logits,
                         bn_error *err)
{
    bn_kv_blocks *kv = sc->e->kv;
    const int64_t left = (int64_t)s->n_hist - s->computed;
    int64_t k = want < left ? want : left;
    while (k > 0) {
        if (bn_kv_seq_append(kv, s->kv, s->history + s->computed, k, err) == BN_OK)
            break;
        /* Fewer rows, as many as the free blocks hold; else a newer
         * sequence gives its blocks up. */
        const int64_t room = (int64_t)bn_kv_blocks_available(kv) * sc->e->kv_cfg.block_size +
                             (int64_t)bn_kv_blocks_for(kv, bn_kv_seq_len(kv, s->kv)) *
                                 sc->e->kv_cfg.block_size -
                             bn_kv_seq_len(kv, s->kv);
        if (room > 0 && room < k) {
            k = room;
            continue;
        }
        if (!preempt_newest(sc, s))
            return -1; /* alone and still no room: seq_init ruled that out */
    }
    if (!reserve_rows(sc, *n_rows + k)) {
        bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a step's rows");
        return -1;
    }
    for (int64_t i = 0; i < k; i++) {
        sc->tokens[*n_rows + i] = s->history[s->computed + i];
        sc->pos[*n_rows + i] = s->computed + i;
        sc->row_seq[*n_rows + i] = s->kv;
    }
    *n_rows += k;
    s->computed += k;
    if (s->computed == (int64_t)s->n_hist) { /* the last row gives the next token */
        sc->logit_rows[*n_logits] = *n_rows - 1;
        sc->logit_owner[*n_logits] = s;
        (*n_logits)++;
    }
    return k;
}

/* A step's first part: rows for the running sequences (sc->pass; no rows:
 * pass.rows.n_rows 0). */
static bn_status step_prepare(sched *sc, bn_error *err)
{
    bn_engine *e = sc->e;
    bn_kv_blocks *kv = e->kv;
    lane_pass *p = &sc->pass;
    int64_t n_rows = 0, n_logits = 0;
    int64_t budget = e->token_budget;
    /* Decodes first, then prefills, each in admission order. */
    for (int pass = 0; pass < 2; pass++) {
        for (;;) {
            seq *next = NULL;
            for (size_t i = 0; i < sc->n; i++) {
                seq *s = sc->seqs[i];
                const int64_t left = (int64_t)s->n_hist - s->computed;
                const bool decoding = left == 1;
                if (s->state != SEQ_RUNNING || left <= 0 || decoding != (pass == 0))
                    continue;
                if (!next || s->admitted_at < next->admitted_at)
                    next = s;
            }
            if (!next || (pass == 1 && budget <= 0))
                break;
            const int64_t got = take_rows(sc, next, pass == 0 ? 1 : budget, &n_rows, &n_logits,
                                          err);
            if (got < 0)
                return err->status != BN_OK ? err->status
                                            : bn_error_set(err, BN_ERR_INTERNAL, NULL,
                                                           "scheduler: no cache block for a "
                                                           "sequence that fits alone");
            budget -= got;
        }
    }
    if (n_rows == 0)
        return BN_OK;
    /* Rows of sequences preempted after their rows were taken are dropped
     * (their positions are computed again when they return). */
    int64_t kept = 0, kept_logits = 0;
    for (int64_t i = 0, l = 0; i < n_rows; i++) {
        const int32_t sid = sc->row_seq[i];
        bool live = false;
        for (size_t j = 0; j < sc->n && !live; j++)
            live = sc->seqs[j]->state == SEQ_RUNNING && sc->seqs[j]->kv == sid;
        const bool has_logit = l < n_logits && sc->logit_rows[l] == i;
        if (live) {
            sc->tokens[kept] = sc->tokens[i];
            sc->pos[kept] = sc->pos[i];
            sc->row_seq[kept] = sid;
            if (has_logit) {
                sc->logit_rows[kept_logits] = kept;
                sc->logit_owner[kept_logits++] = sc->logit_owner[l];
            }
            kept++;
        }
        l += has_logit;
    }
    n_rows = kept;
    n_logits = kept_logits;
    const int32_t max_seqs = e->kv_cfg.max_seqs;
    for (int32_t q = 0; q < max_seqs; q++)
        sc->tables[q] = bn_kv_seq_table(kv, q, &sc->table_len[q]);
    p->rows = (bn_batch_rows){n_rows,     sc->tokens,        sc->pos,
                              sc->row_seq, sc->tables,       sc->table_len,
                              e->kv_cfg.block_size, sc->logit_rows, n_logits};
    p->n_logits = n_logits;
    p->decode_only = n_logits == n_rows;
    /* The device picks the tokens when it can for every logit row (and no
     * row's logits are wanted: a first token's prompt_logits). */
    bool pick = n_logits > 0;
    for (int64_t l = 0; l < n_logits; l++) {
        const seq *s = sc->logit_owner[l];
        pick = pick && s->device_pick && !(s->req.prompt_logits && !s->have_first);
    }
    for (int64_t l = 0; pick && l < n_logits; l++) {
        const seq *s = sc->logit_owner[l];
        sc->picks[l] = engine_pick_params(&s->req.sampling);
        sc->uniform[l] =
            s->req.sampling.temperature > 0.0f ? bn_sampler_next_uniform(s->sampler) : 0.0;
    }
    p->pick = pick;
    return BN_OK;
}

/* The pass itself, where the step prepared one: touches only the lane's
 * backend and buffers, so lanes run theirs on different threads at once. */
static void step_forward(sched *sc)
{
    bn_engine *e = sc->e;
    lane_pass *p = &sc->pass;
    if (p->rows.n_rows == 0 || p->status != BN_OK)
        return;
    p->t0 = bn_time_seconds();
    p->status = p->pick ? e->backend->ops->forward_rows_pick(e->backend, &p->rows, sc->picks,
                                                             sc->uniform, sc->picked, &p->err)
                        : e->backend->ops->forward_rows(e->backend, &p->rows, sc->logits,
                                                        &p->err);
    p->t1 = bn_time_seconds();
}

/* After the pass: the counters, the computed blocks, the next tokens. */
static void step_finish(sched *sc)
{
    bn_engine *e = sc->e;
    const lane_pass *p = &sc->pass;
    const int32_t vocab = bn_checkpoint_hparams(e->model)->vocab;
    e->batch_steps++;
    e->batch_rows += (uint64_t)p->rows.n_rows;
    e->forward_seconds += p->t1 - p->t0;
    if (p->decode_only) {
        e->decode_passes++;
        e->decode_rows += (uint64_t)p->rows.n_rows;
        e->decode_seconds += p->t1 - p->t0;
    }
    const double t1 = bn_time_seconds();
    /* The positions are computed: their full blocks may be shared now. */
    for (size_t i = 0; i < sc->n; i++)
        if (sc->seqs[i]->state == SEQ_RUNNING)
            bn_kv_seq_commit(e->kv, sc->seqs[i]->kv, sc->seqs[i]->computed);
    for (int64_t l = 0; l < p->n_logits; l++) {
        seq *s = sc->logit_owner[l];
        float *logits = p->pick ? NULL : sc->logits + l * vocab;
        if (s->state == SEQ_RUNNING &&
            !seq_take_token(sc, s, logits, p->pick ? sc->picked[l] : -1) &&
            s->state == SEQ_RUNNING)
            seq_finish(sc, s);
    }
    e->token_seconds += bn_time_seconds() - t1;
}

/* Without forward_rows: the requests one after another. */
static bn_status generate_one_by_one(bn_engine *e, const bn_batch_request *reqs, size_t n,
                                     bn_batch_result *out)
{
    const double t0 = bn_time_seconds();
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        atomic_init(&out[i].done, false);
        const bn_generate_request req = {.prompt_tokens = reqs[i].prompt,
                                         .n_prompt_tokens = reqs[i].n_prompt,
                                         .n_predict = reqs[i].n_predict,
                                         .ignore_eog = reqs[i].ignore_eog,
                                         .sampling = reqs[i].sampling,
                                         .on_token = reqs[i].on_token,
                                         .ctx = reqs[i].ctx,
                                         .cancel = reqs[i].cancel,
                                         .prompt_logits = reqs[i].prompt_logits};
        const double t = bn_time_seconds();
        out[i].status = bn_engine_generate(e, &req, &out[i].gen, &out[i].error);
        out[i].first_token_seconds = t - t0 + out[i].gen.prompt_seconds;
        atomic_store(&out[i].done, true);
    }
    return BN_OK;
}

static void retire_ended(sched *sc)
{
    size_t kept = 0;
    for (size_t i = 0; i < sc->n; i++) {
        seq *s = sc->seqs[i];
        if (s->state != SEQ_DONE) {
            sc->seqs[kept++] = s;
            continue;
        }
        if (s->out->status != BN_OK)
            bn_generation_free(&s->out->gen);
        atomic_store_explicit(&s->out->done, true, memory_order_release);
        seq_free(s);
        free(s);
    }
    sc->n = kept;
}

/* Whether a running sequence is computing blocks that the waiting s could
 * take from the cache once they are done: whole blocks of s's prompt
 * (short of its last token, which s computes itself) equal to that
 * sequence's history and not yet computed by it. s then waits for them
 * instead of computing them again, so a prompt that many requests share
 * is computed once even when they all come at the same time. */
static bool prefix_in_flight(const sched *sc, const seq *s)
{
    if (!sc->e->kv_cfg.prefix_sharing)
        return false;
    const int64_t bs = sc->e->kv_cfg.block_size;
    for (size_t i = 0; i < sc->n; i++) {
        const seq *r = sc->seqs[i];
        if (r->state != SEQ_RUNNING)
            continue;
        const size_t n = s->n_hist - 1 < r->n_hist ? s->n_hist - 1 : r->n_hist;
        size_t same = 0;
        while (same < n && s->history[same] == r->history[same])
            same++;
        const int64_t shared = (int64_t)same / bs * bs;
        if (shared > 0 && r->computed < shared)
            return true;
    }
    return false;
}

/* ---- one lane ------------------------------------------------------------------ */

static void lane_free(sched *sc)
{
    if (!sc)
        return;
    bn_error err;
    bn_error_set(&err, BN_ERR_INVALID_ARGUMENT, NULL, "the scheduler was closed");
    for (size_t i = 0; i < sc->n; i++)
        if (sc->seqs[i]->state != SEQ_DONE)
            seq_fail(sc->seqs[i], sc->e->kv, &err);
    retire_ended(sc);
    free(sc->seqs);
    free(sc->tables);
    free(sc->table_len);
    free(sc->tokens);
    free(sc->row_seq);
    free(sc->pos);
    free(sc->logit_rows);
    free(sc->logit_owner);
    free(sc->logits);
    free(sc->raw);
    free(sc->picks);
    free(sc->uniform);
    free(sc->picked);
    free(sc);
}

static bn_status lane_create(bn_engine *e, sched **out, bn_error *err)
{
    sched *sc = calloc(1, sizeof *sc);
    if (sc) {
        sc->e = e;
        sc->tables = calloc((size_t)e->kv_cfg.max_seqs, sizeof *sc->tables);
        sc->table_len = calloc((size_t)e->kv_cfg.max_seqs, sizeof *sc->table_len);
        sc->raw = malloc((size_t)bn_checkpoint_hparams(e->model)->vocab * sizeof *sc->raw);
    }
    if (!sc || !sc->tables || !sc->table_len || !sc->raw) {
        lane_free(sc);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the scheduler");
    }
    *out = sc;
    return BN_OK;
}

static bn_status lane_add(sched *sc, const bn_batch_request *req, bn_batch_result *out,
                          bn_error *err)
{
    if (sc->n == sc->cap) {
        const size_t cap = sc->cap ? 2 * sc->cap : 16;
        seq **p = realloc(sc->seqs, cap * sizeof *p);
        if (!p)
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a request");
        sc->seqs = p;
        sc->cap = cap;
    }
    seq *s = calloc(1, sizeof *s);
    if (!s)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a request");
    (void)seq_init(sc, s, req, out); /* a request that cannot run ends at once */
    sc->seqs[sc->n++] = s;
    return BN_OK;
}

/* Admission, first come first served, then the step's rows (sc->pass). */
static bn_status lane_prepare(sched *sc, bn_error *err)
{
    bn_engine *e = sc->e;
    sc->pass.rows.n_rows = 0;
    int running = 0;
    bool waiting = false;
    for (size_t i = 0; i < sc->n; i++)
        running += sc->seqs[i]->state == SEQ_RUNNING;
    for (size_t i = 0; i < sc->n && running < e->kv_cfg.max_seqs; i++)
        if (sc->seqs[i]->state == SEQ_WAITING && !prefix_in_flight(sc, sc->seqs[i]) &&
            seq_admit(sc, sc->seqs[i]))
            running++;
    for (size_t i = 0; i < sc->n; i++)
        waiting |= sc->seqs[i]->state == SEQ_WAITING;
    if (running == 0 && waiting)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL,
                            "scheduler: a waiting request could not be admitted");
    return running > 0 ? step_prepare(sc, err) : BN_OK;
}

/* After the pass (or a failure, st): tokens handed out, or every request not
 * ended failed with the error; the ended ones reported. */
static void lane_finish(sched *sc, bn_status st, const bn_error *err)
{
    if (st == BN_OK && sc->pass.rows.n_rows > 0)
        step_finish(sc);
    for (size_t i = 0; i < sc->n && st != BN_OK; i++)
        if (sc->seqs[i]->state != SEQ_DONE)
            seq_fail(sc->seqs[i], sc->e->kv, err);
    retire_ended(sc);
}

/* ---- the lanes' passes at once ------------------------------------------------ */

/* Worker for lane `index` (>= 1): runs that lane's pass each round. */
typedef struct worker_arg {
    bn_batcher *bt;
    int index;
} worker_arg;

static void *lane_worker(void *p)
{
    worker_arg *a = p;
    bn_batcher *bt = a->bt;
    sched *sc = bt->lanes[a->index];
    free(a);
    uint64_t seen = 0;
    pthread_mutex_lock(&bt->mu);
    for (;;) {
        while (!bt->quit && bt->round == seen)
            pthread_cond_wait(&bt->go, &bt->mu);
        if (bt->quit)
            break;
        seen = bt->round;
        pthread_mutex_unlock(&bt->mu);
        step_forward(sc);
        pthread_mutex_lock(&bt->mu);
        if (--bt->pending == 0)
            pthread_cond_signal(&bt->done);
    }
    pthread_mutex_unlock(&bt->mu);
    return NULL;
}

/* Every lane's prepared pass: the first on this thread, the others on
 * their workers, all at once. */
static void run_passes(bn_batcher *bt)
{
    if (bt->n_threads > 0) {
        pthread_mutex_lock(&bt->mu);
        bt->pending = bt->n_threads;
        bt->round++;
        pthread_cond_broadcast(&bt->go);
        pthread_mutex_unlock(&bt->mu);
    }
    step_forward(bt->lanes[0]);
    if (bt->n_threads > 0) {
        pthread_mutex_lock(&bt->mu);
        while (bt->pending > 0)
            pthread_cond_wait(&bt->done, &bt->mu);
        pthread_mutex_unlock(&bt->mu);
    }
}

static void stop_workers(bn_batcher *bt)
{
    if (bt->n_threads == 0)
        return;
    pthread_mutex_lock(&bt->mu);
    bt->quit = true;
    pthread_cond_broadcast(&bt->go);
    pthread_mutex_unlock(&bt->mu);
    for (int i = 0; i < bt->n_threads; i++)
        pthread_join(bt->threads[i], NULL);
    bt->n_threads = 0;
}

/* ---- the batcher ----------------------------------------------------------------- */

bn_status bn_batcher_create(bn_engine *e, bn_batcher **out, bn_error *err)
{
    *out = NULL;
    if (!e || !e->kv || !e->backend->ops->forward_rows)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "the backend computing does not batch sequences");
    bn_batcher *bt = calloc(1, sizeof *bt);
    if (!bt)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the scheduler");
    bt->n_lanes = 1 + e->n_replicas;
    bt->lanes = calloc((size_t)bt->n_lanes, sizeof *bt->lanes);
    bt->threads = calloc((size_t)bt->n_lanes, sizeof *bt->threads);
    bn_status st = bt->lanes && bt->threads
                       ? BN_OK
                       : bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                                      "no memory for the scheduler");
    for (int i = 0; st == BN_OK && i < bt->n_lanes; i++)
        st = lane_create(i == 0 ? e : e->replicas[i - 1], &bt->lanes[i], err);
    if (st == BN_OK && bt->n_lanes > 1) {
        pthread_mutex_init(&bt->mu, NULL);
        pthread_cond_init(&bt->go, NULL);
        pthread_cond_init(&bt->done, NULL);
        bt->sync_ready = true;
        for (int i = 1; st == BN_OK && i < bt->n_lanes; i++) {
            worker_arg *a = malloc(sizeof *a);
            if (a) {
                *a = (worker_arg){bt, i};
                if (pthread_create(&bt->threads[bt->n_threads], NULL, lane_worker, a) == 0) {
                    bt->n_threads++;
                    continue;
                }
                free(a);
            }
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                              "could not start the thread of replica %d", i);
        }
    }
    if (st != BN_OK) {
        bn_batcher_free(bt);
        return st;
    }
    *out = bt;
    return BN_OK;
}

bn_status bn_batcher_add(bn_batcher *bt, const bn_batch_request *req, bn_batch_result *out,
                         bn_error *err)
{
    if (!bt || !req || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "batcher_add: NULL argument");
    /* The least-loaded lane: the fewest requests not ended (the first of
     * equals). */
    sched *to = bt->lanes[0];
    for (int i = 1; i < bt->n_lanes; i++)
        if (bt->lanes[i]->n < to->n)
            to = bt->lanes[i];
    return lane_add(to, req, out, err);
}

bn_status bn_batcher_step(bn_batcher *bt, size_t *active, bn_error *err)
{
    bn_status first = BN_OK;
    for (int i = 0; i < bt->n_lanes; i++) {
        sched *sc = bt->lanes[i];
        bn_error_clear(&sc->pass.err);
        sc->pass.status = lane_prepare(sc, &sc->pass.err);
    }
    run_passes(bt);
    *active = 0;
    for (int i = 0; i < bt->n_lanes; i++) {
        sched *sc = bt->lanes[i];
        const bn_status st = sc->pass.status;
        lane_finish(sc, st, &sc->pass.err);
        if (st != BN_OK && first == BN_OK) {
            first = st;
            if (err)
                *err = sc->pass.err;
        }
        *active += sc->n;
    }
    return first;
}

void bn_batcher_free(bn_batcher *bt)
{
    if (!bt)
        return;
    stop_workers(bt);
    if (bt->sync_ready) {
        pthread_mutex_destroy(&bt->mu);
        pthread_cond_destroy(&bt->go);
        pthread_cond_destroy(&bt->done);
    }
    for (int i = 0; bt->lanes && i < bt->n_lanes; i++)
        lane_free(bt->lanes[i]);
    free(bt->lanes);
    free(bt->threads);
    free(bt);
}

bn_status bn_engine_generate_batch(bn_engine *e, const bn_batch_request *reqs, size_t n,
                                   bn_batch_result *out, bn_error *err)
{
    if (!e || (!reqs && n) || (!out && n))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "generate_batch: NULL engine, requests or results");
    if (!e->kv || !e->backend->ops->forward_rows)
        return generate_one_by_one(e, reqs, n, out);
    bn_batcher *bt = NULL;
    bn_status st = bn_batcher_create(e, &bt, err);
    for (size_t i = 0; i < n; i++)
        atomic_init(&out[i].done, false);
    for (size_t i = 0; st == BN_OK && i < n; i++)
        st = bn_batcher_add(bt, &reqs[i], &out[i], err);
    size_t active = n;
    while (st == BN_OK && active > 0)
        st = bn_batcher_step(bt, &active, err);
    bn_batcher_free(bt);
    return st;
}

/* One engine's counters into out (added to what is there). */
static void add_stats(const bn_engine *e, bn_batch_stats *out)
{
    bn_kv_blocks_stats b;
    bn_kv_blocks_get_stats(e->kv, &b);
    out->blocks.n_blocks += b.n_blocks;
    out->blocks.free += b.free;
    out->blocks.held += b.held;
    out->blocks.cached += b.cached;
    out->blocks.seqs_open += b.seqs_open;
    out->blocks.reused_blocks += b.reused_blocks;
    out->blocks.evictions += b.evictions;
    out->blocks.failed += b.failed;
    out->blocks.peak_held += b.peak_held;
    out->steps += e->batch_steps;
    out->rows += e->batch_rows;
    out->preemptions += e->preemptions;
    out->decode_passes += e->decode_passes;
    out->decode_rows += e->decode_rows;
    out->decode_seconds += e->decode_seconds;
    out->forward_seconds += e->forward_seconds;
    out->token_seconds += e->token_seconds;
}

void bn_engine_batch_stats(const bn_engine *e, bn_batch_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!e || !e->kv)
        return;
    out->enabled = true;
    out->max_seqs = e->kv_cfg.max_seqs;
    out->block_size = e->kv_cfg.block_size;
    add_stats(e, out);
    for (int i = 0; i < e->n_replicas; i++)
        add_stats(e->replicas[i], out);
}

int bn_engine_replica_count(const bn_engine *e)
{
    return e ? 1 + e->n_replicas : 0;
}

void bn_engine_replica_batch_stats(const bn_engine *e, int i, bn_batch_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!e || i < 0 || i > e->n_replicas)
        return;
    bn_engine_batch_stats(i == 0 ? e : e->replicas[i - 1], out);
}

void bn_engine_batch_reset_peak(bn_engine *e)
{
    if (!e)
        return;
    if (e->kv)
        bn_kv_blocks_reset_peak(e->kv);
    for (int i = 0; i < e->n_replicas; i++)
        bn_engine_batch_reset_peak(e->replicas[i]);
}
