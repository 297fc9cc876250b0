/*
 * api.c - the public model, session and generation API (bitnet.h) over the
 * engine (src/engine/engine.h).
 *
 * One engine a model: its weights on the device, one KV cache. Sessions
 * hold tokens only. The model remembers which tokens its cache holds
 * (cache_tokens: the first bn_engine_kv_filled tokens of the last sequence
 * computed); a session's request reuses the longest common prefix of those
 * and the session's tokens, so a conversation that goes on, or a session
 * that starts like the one before, computes only what is new. A mutex runs
 * one computation a model at a time.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bitnet.h"
#include "engine.h"
#include "model.h"
#include "tokenizer.h"

static bn_status no_memory(bn_error *err, const char *what);

/* A request waiting for the scheduler thread. */
typedef struct queued {
    bn_batch_request req;
    bn_batch_result *out;
} queued;

struct bn_model {
    bn_engine *engine;
    pthread_mutex_t lock;   /* one computation (and cache update) at a time */
    int32_t *cache_tokens;  /* what the engine's cache holds, from position 0 */
    size_t n_cache, cap_cache;
    char path[1024];
    /* Many sequences at once (an engine that batches): a scheduler thread
     * runs the engine's batcher a pass at a time (under `lock`, so other
     * calls go between passes); generations queue their requests and wait
     * for them to end. */
    bn_batcher *batcher;
    pthread_t sched_thread;
    bool sched_started, sched_stop;
    pthread_mutex_t q_lock;
    pthread_cond_t q_work, q_done;
    queued *queue;
    size_t n_queue, cap_queue;
};

/* The scheduler thread: takes the queued requests, runs passes while any
 * is active, and wakes the waiting callers after each. */
static void *scheduler_main(void *arg)
{
    bn_model *m = arg;
    size_t active = 0;
    queued *taken = NULL;
    size_t cap_taken = 0;
    pthread_mutex_lock(&m->q_lock);
    for (;;) {
        while (!m->sched_stop && m->n_queue == 0 && active == 0)
            pthread_cond_wait(&m->q_work, &m->q_lock);
        if (m->sched_stop && m->n_queue == 0 && active == 0)
            break;
        /* Swap the queue out, so callers can queue while the pass runs. */
        queued *q = m->queue;
        const size_t nq = m->n_queue, cap_q = m->cap_queue;
        m->queue = taken;
        m->cap_queue = cap_taken;
        m->n_queue = 0;
        taken = q;
        cap_taken = cap_q;
        pthread_mutex_unlock(&m->q_lock);
        pthread_mutex_lock(&m->lock);
        size_t before = active, refused = 0;
        for (size_t i = 0; i < nq; i++) {
            bn_error err;
            bn_error_clear(&err);
            if (bn_batcher_add(m->batcher, &taken[i].req, taken[i].out, &err) != BN_OK) {
                taken[i].out->status = err.status;
                taken[i].out->error = err;
                atomic_store(&taken[i].out->done, true);
                refused++;
            } else {
                before++;
            }
        }
        bn_error err;
        bn_error_clear(&err);
        /* A failed pass fails its requests (their results say why). */
        (void)bn_batcher_step(m->batcher, &active, &err);
        pthread_mutex_unlock(&m->lock);
        pthread_mutex_lock(&m->q_lock);
        /* The callers wait for their requests to end: wake them only when
         * one did, not after every pass (with many callers waiting, waking
         * them all each pass costs the scheduler its lock). */
        if (refused > 0 || active < before)
            pthread_cond_broadcast(&m->q_done);
    }
    pthread_mutex_unlock(&m->q_lock);
    free(taken);
    return NULL;
}

/* Starts the scheduler thread where the engine batches. */
static bn_status start_scheduler(bn_model *m, bn_error *err)
{
    bn_batch_stats bs;
    bn_engine_batch_stats(m->engine, &bs);
    if (!bs.enabled)
        return BN_OK;
    bn_status st = bn_batcher_create(m->engine, &m->batcher, err);
    if (st != BN_OK)
        return st;
    pthread_mutex_init(&m->q_lock, NULL);
    pthread_cond_init(&m->q_work, NULL);
    pthread_cond_init(&m->q_done, NULL);
    const int rc = pthread_create(&m->sched_thread, NULL, scheduler_main, m);
    if (rc != 0) {
        bn_batcher_free(m->batcher);
        m->batcher = NULL;
        pthread_mutex_destroy(&m->q_lock);
        pthread_cond_destroy(&m->q_work);
        pthread_cond_destroy(&m->q_done);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "could not start the model's scheduler thread: %s", strerror(rc));
    }
    m->sched_started = true;
    return BN_OK;
}

static void stop_scheduler(bn_model *m)
{
    if (!m->sched_started)
        return;
    pthread_mutex_lock(&m->q_lock);
    m->sched_stop = true;
    pthread_cond_signal(&m->q_work);
    pthread_mutex_unlock(&m->q_lock);
    pthread_join(m->sched_thread, NULL);
    bn_batcher_free(m->batcher);
    free(m->queue);
    pthread_mutex_destroy(&m->q_lock);
    pthread_cond_destroy(&m->q_work);
    pthread_cond_destroy(&m->q_done);
    m->sched_started = false;
}

/* Queues requests for the scheduler thread and waits until every one has
 * ended. */
static bn_status run_on_scheduler(bn_model *m, const bn_batch_request *reqs, size_t n,
                                  bn_batch_result *out, bn_error *err)
{
    pthread_mutex_lock(&m->q_lock);
    if (m->n_queue + n > m->cap_queue) {
        size_t cap = m->cap_queue ? m->cap_queue : 16;
        while (cap < m->n_queue + n)
            cap *= 2;
        queued *q = realloc(m->queue, cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&m->q_lock);
            return no_memory(err, "queued requests");
        }
        m->queue = q;
        m->cap_queue = cap;
    }
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        atomic_init(&out[i].done, false);
        m->queue[m->n_queue++] = (queued){reqs[i], &out[i]};
    }
    pthread_cond_signal(&m->q_work);
    for (size_t i = 0; i < n; i++)
        while (!atomic_load(&out[i].done))
            pthread_cond_wait(&m->q_done, &m->q_lock);
    pthread_mutex_unlock(&m->q_lock);
    return BN_OK;
}

struct bn_session {
    bn_model *model;
    int32_t *tokens;
    size_t n, cap;
    _Atomic int cancel;
    /* The last generation, for its receipt. */
    bool has_last;
    bn_generate_request last_req; /* its settings (no pointers kept) */
    bn_generation last;
};

static bn_status no_memory(bn_error *err, const char *what)
{
    return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for %s", what);
}

/* Room for at least need tokens in *buf (capacity *cap). */
static bool reserve(int32_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c = c <= SIZE_MAX / 2 / sizeof(int32_t) ? c * 2 : need;
    int32_t *p = realloc(*buf, c * sizeof *p);
    if (!p)
        return false;
    *buf = p;
    *cap = c;
    return true;
}

/* Copies what fits of src[0, n) to dst (capacity cap), NUL after it when
 * there is room; *len = n. The two-call sizing convention of bitnet.h. */
static void copy_out(const char *src, size_t n, char *dst, size_t cap, size_t *len)
{
    *len = n;
    if (!dst || cap == 0)
        return;
    const size_t k = n < cap ? n : cap;
    memcpy(dst, src, k);
    if (k < cap)
        dst[k] = '\0';
}

/* ---- models ---------------------------------------------------------------- */

void bn_model_options_default(bn_model_options *opt)
{
    if (opt)
        memset(opt, 0, sizeof *opt);
}

bn_status bn_model_open(const bn_model_options *opt, bn_model **out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "bn_model_open: NULL out");
    *out = NULL;
    bn_model_options o;
    bn_model_options_default(&o);
    if (opt)
        o = *opt;
    if (o.n_threads < 0 || o.n_ctx < 0 ||
        (o.kv != BN_KV_F32 && o.kv != BN_KV_F16 && o.kv != BN_KV_FP8))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_model_open: n_threads and n_ctx must be >= 0 and kv BN_KV_F32, "
                            "BN_KV_F16 or BN_KV_FP8 (got %d, %lld, %d)",
                            o.n_threads, (long long)o.n_ctx, (int)o.kv);
    bn_config cfg;
    bn_status st = bn_config_from_env(&cfg, err);
    if (st != BN_OK)
        return st;
    if (o.memory_limit_bytes)
        cfg.memory_limit_bytes = o.memory_limit_bytes;

    bn_model *m = calloc(1, sizeof *m);
    if (!m)
        return no_memory(err, "the model");
    if (o.path) {
        if ((size_t)snprintf(m->path, sizeof m->path, "%s", o.path) >= sizeof m->path) {
            free(m);
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "bn_model_open: the path is longer than %zu bytes",
                                sizeof m->path - 1);
        }
    } else if ((st = bn_default_model_path(m->path, sizeof m->path, err)) != BN_OK) {
        free(m);
        return st;
    }
    if (o.tensor_parallel < 0 || o.tensor_parallel > BN_DEVICE_LIST_MAX) {
        free(m);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_model_open: tensor_parallel is 0..%d, not %d",
                            BN_DEVICE_LIST_MAX, o.tensor_parallel);
    }
    if (o.max_sequences < 0 || o.max_sequences > 4096 || o.kv_block_size < 0 ||
        o.kv_block_size > 1024 || (unsigned)o.kv_evict > BN_KV_EVICT_LFU || o.batch_tokens < 0 ||
        o.batch_tokens > BN_BATCH_TOKENS_MAX) {
        free(m);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_model_open: max_sequences 0..4096, kv_block_size 0..1024, a "
                            "known kv_evict and batch_tokens 0..%d (got %d, %d, %d, %d)",
                            BN_BATCH_TOKENS_MAX, o.max_sequences, o.kv_block_size, (int)o.kv_evict,
                            o.batch_tokens);
    }
    bn_engine_options eo = {.model_path = m->path,
                            .max_seqs = o.max_sequences,
                            .kv_bytes = o.kv_cache_bytes,
                            .kv_block = o.kv_block_size,
                            .kv_evict = o.kv_evict,
                            .no_prefix_sharing = o.no_prefix_sharing,
                            .token_budget = o.batch_tokens,
                            .device = o.device,
                            .n_threads = o.n_threads,
                            .n_ctx = o.n_ctx,
                            .kv = o.kv,
                            .tensor_parallel = o.tensor_parallel};
    st = bn_engine_open(&cfg, &eo, &m->engine, err);
    if (st != BN_OK) {
        free(m);
        return st;
    }
    pthread_mutex_init(&m->lock, NULL);
    st = start_scheduler(m, err);
    if (st != BN_OK) {
        bn_model_close(m);
        return st;
    }
    *out = m;
    return BN_OK;
}

void bn_model_close(bn_model *m)
{
    if (!m)
        return;
    stop_scheduler(m);
    bn_engine_free(m->engine);
    pthread_mutex_destroy(&m->lock);
    free(m->cache_tokens);
    free(m);
}

static const bn_tokenizer *model_tokenizer(const bn_model *m)
{
    return bn_checkpoint_tokenizer(bn_engine_model(m->engine));
}

/* The chat format a tokenizer supports: BitNet b1.58 2B-4T's
 * ("<|begin_of_text|>System: ...<|eot_id|>User: ...<|eot_id|>Assistant: "),
 * which needs those two special tokens; NULL when it has neither. */
static const char *chat_format(const bn_tokenizer *t)
{
    if (t && bn_tokenizer_find(t, "<|begin_of_text|>") >= 0 &&
        bn_tokenizer_find(t, "<|eot_id|>") >= 0)
        return "bitnet-2b4t";
    return NULL;
}

bn_status bn_model_get_info(const bn_model *m, bn_model_info *info, bn_error *err)
{
    if (!m || !info)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_model_get_info: NULL model or info");
    memset(info, 0, sizeof *info);
    const bn_checkpoint *c = bn_engine_model(m->engine);
    const bn_hparams *hp = bn_checkpoint_hparams(c);
    const bn_tokenizer *t = bn_checkpoint_tokenizer(c);
    bn_engine_info ei;
    bn_engine_get_info(m->engine, &ei);
    snprintf(info->path, sizeof info->path, "%s", m->path);
    snprintf(info->architecture, sizeof info->architecture, "%s", hp->arch);
    snprintf(info->flavour, sizeof info->flavour, "%s", hp->flavour);
    snprintf(info->device, sizeof info->device, "%s", ei.selected);
    snprintf(info->device_name, sizeof info->device_name, "%s",
             ei.gpu && ei.gpu_name ? ei.gpu_name : ei.kernel);
    const char *chat = chat_format(t);
    snprintf(info->chat_template, sizeof info->chat_template, "%s", chat ? chat : "");
    info->vocab_size = hp->vocab;
    info->n_ctx = bn_engine_n_ctx(m->engine);
    info->n_ctx_train = hp->n_ctx_train;
    info->n_layer = hp->n_layer;
    info->dim = hp->dim;
    info->n_head = hp->n_head;
    info->n_head_kv = hp->n_head_kv;
    info->head_dim = hp->head_dim;
    info->ffn_dim = hp->ffn;
    info->n_params = (uint64_t)bn_hparams_ternary_count(hp) +
                     (uint64_t)hp->vocab * (uint64_t)hp->dim * (hp->tied_embeddings ? 1u : 2u);
    info->has_tokenizer = t != NULL;
    info->bos = t ? bn_tokenizer_bos(t) : -1;
    info->eos = t ? bn_tokenizer_eos(t) : -1;
    info->eot = t ? bn_tokenizer_eot(t) : -1;
    snprintf(info->selection, sizeof info->selection, "%s", bn_engine_startup_line(m->engine));
    snprintf(info->fallback, sizeof info->fallback, "%s", ei.fallback);
    return BN_OK;
}

bn_status bn_model_get_stats(bn_model *m, bn_model_stats *stats, bn_error *err)
{
    if (!m || !stats)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_model_get_stats: NULL model or stats");
    memset(stats, 0, sizeof *stats);
    bn_engine_info ei;
    pthread_mutex_lock(&m->lock); /* the backend's counters move while it computes */
    bn_engine_get_info(m->engine, &ei);
    pthread_mutex_unlock(&m->lock);
    stats->load_seconds = ei.load_seconds;
    stats->threads = ei.threads;
    stats->model_weight_bytes = ei.model_weight_bytes;
    stats->weights_bytes = ei.backend_weight_bytes;
    stats->kv_cache_bytes = ei.backend_kv_bytes;
    stats->scratch_bytes = ei.backend_scratch_bytes;
    stats->total_bytes = ei.backend_total_bytes;
    snprintf(stats->kernels, sizeof stats->kernels, "%s", ei.kernels);
    snprintf(stats->kv_type, sizeof stats->kv_type, "%s", ei.kv_type ? ei.kv_type : "f32");
    bn_batch_stats bs;
    pthread_mutex_lock(&m->lock);
    bn_engine_batch_stats(m->engine, &bs);
    pthread_mutex_unlock(&m->lock);
    if (bs.enabled) {
        stats->max_sequences = bs.max_seqs;
        stats->kv_block_size = bs.block_size;
        stats->kv_blocks = bs.blocks.n_blocks;
        stats->kv_blocks_held = bs.blocks.held;
        stats->kv_blocks_cached = bs.blocks.cached;
        stats->batch_steps = bs.steps;
        stats->batch_rows = bs.rows;
        stats->batch_preemptions = bs.preemptions;
        stats->batch_forward_seconds = bs.forward_seconds;
        stats->batch_token_seconds = bs.token_seconds;
    }
    stats->gpu = ei.gpu;
    if (!ei.gpu)
        return BN_OK;
    stats->gpu_graphs = ei.cuda_graphs;
    stats->gpu_weights_bytes = ei.gpu_weights_bytes;
    stats->gpu_embedding_bytes = ei.gpu_embedding_bytes;
    stats->gpu_lm_head_bytes = ei.gpu_lm_head_bytes;
    stats->gpu_lm_head_screen_bytes = ei.gpu_lm_head_screen_bytes;
    stats->gpu_norms_bytes = ei.gpu_norms_bytes;
    stats->gpu_kv_cache_bytes = ei.gpu_kv_bytes;
    stats->gpu_scratch_bytes = ei.gpu_scratch_bytes;
    stats->gpu_total_bytes = ei.gpu_total_bytes;
    stats->gpu_peak_bytes = ei.gpu_peak_bytes;
    stats->gpu_device_total_bytes = ei.gpu_device_total_bytes;
    stats->gpu_device_free_bytes = ei.gpu_device_free_bytes;
    stats->gpu_pool_reserved_bytes = ei.gpu_pool_reserved_bytes;
    stats->gpu_pool_peak_reserved_bytes = ei.gpu_pool_peak_reserved_bytes;
    stats->gpu_pool_limit_bytes = ei.gpu_pool_limit_bytes;
    stats->gpu_pool_buffers = ei.gpu_pool_buffers;
    stats->gpu_pool_allocations = ei.gpu_pool_allocations;
    stats->gpu_pool_failures = ei.gpu_pool_failures;
    stats->gpu_kernel_launches = ei.gpu_kernel_launches;
    stats->gpu_h2d_transfers = ei.gpu_h2d_transfers;
    stats->gpu_h2d_bytes = ei.gpu_h2d_bytes;
    stats->gpu_d2h_transfers = ei.gpu_d2h_transfers;
    stats->gpu_d2h_bytes = ei.gpu_d2h_bytes;
    return BN_OK;
}

bool bn_model_token_is_eog(const bn_model *m, int32_t token)
{
    const bn_tokenizer *t = m ? model_tokenizer(m) : NULL;
    return t && bn_tokenizer_is_eog(t, token);
}

/* ---- tokens ------------------------------------------------------------------ */

static bn_status need_tokenizer(const bn_tokenizer *t, bn_error *err)
{
    return t ? BN_OK
             : bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "use token ids, or a model file with tokenizer metadata",
                            "this model has no tokenizer");
}

bn_status bn_model_tokenize(const bn_model *m, const char *text, size_t len, bool add_bos,
                            int32_t *tokens, size_t cap, size_t *n, bn_error *err)
{
    if (!m || (!text && len) || (!tokens && cap) || !n)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_model_tokenize: NULL model, text, tokens or n");
    const bn_tokenizer *t = model_tokenizer(m);
    bn_status st = need_tokenizer(t, err);
    if (st != BN_OK)
        return st;
    int32_t *ids = NULL;
    size_t count = 0;
    st = bn_tokenize(t, text ? text : "", len, false, true, &ids, &count, err);
    if (st != BN_OK)
        return st;
    /* BOS first when asked for, once: a text that writes it (a chat
     * format's) keeps its own, as bn_session_generate does. */
    const int32_t bos = bn_tokenizer_bos(t);
    const bool add = add_bos && bos >= 0 && bn_tokenizer_add_bos_default(t) &&
                     (count == 0 || ids[0] != bos);
    if (add) {
        int32_t *with = realloc(ids, (count + 1) * sizeof *ids);
        if (!with) {
            free(ids);
            return no_memory(err, "the tokens");
        }
        ids = with;
        memmove(ids + 1, ids, count * sizeof *ids);
        ids[0] = bos;
        count++;
    }
    *n = count;
    if (tokens)
        memcpy(tokens, ids, (count < cap ? count : cap) * sizeof *ids);
    free(ids);
    return BN_OK;
}

static bn_status check_ids(const bn_model *m, const int32_t *ids, size_t n, bn_error *err)
{
    const int32_t vocab = bn_checkpoint_hparams(bn_engine_model(m->engine))->vocab;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "token %d (at %zu) is outside the vocabulary (0..%d)", (int)ids[i],
                                i, (int)vocab - 1);
    return BN_OK;
}

bn_status bn_model_detokenize(const bn_model *m, const int32_t *tokens, size_t n, char *buf,
                              size_t cap, size_t *len, bn_error *err)
{
    if (!m || (!tokens && n) || (!buf && cap) || !len)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_model_detokenize: NULL model, tokens, buffer or len");
    const bn_tokenizer *t = model_tokenizer(m);
    bn_status st = need_tokenizer(t, err);
    if (st == BN_OK)
        st = check_ids(m, tokens, n, err);
    if (st != BN_OK)
        return st;
    char *text = NULL;
    st = bn_detokenize(t, tokens, n, &text, err);
    if (st != BN_OK)
        return st;
    copy_out(text, strlen(text), buf, cap, len);
    free(text);
    return BN_OK;
}

/* ---- chat ---------------------------------------------------------------------- */

typedef struct text_out {
    char *buf;
    size_t cap, len;
} text_out;

static void put(text_out *o, const char *s, size_t n)
{
    if (o->len < o->cap) {
        const size_t k = o->cap - o->len < n ? o->cap - o->len : n;
        memcpy(o->buf + o->len, s, k);
    }
    o->len += n;
}

bn_status bn_model_apply_chat(const bn_model *m, const bn_chat_message *messages, size_t n,
                              bool add_assistant, char *buf, size_t cap, size_t *len,
                              bn_error *err)
{
    if (!m || (!messages && n) || (!buf && cap) || !len)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_model_apply_chat: NULL model, messages, buffer or len");
    if (!chat_format(model_tokenizer(m)))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "format the prompt yourself",
                            "this model has no chat format (it needs the <|begin_of_text|> and "
                            "<|eot_id|> tokens of BitNet b1.58 2B-4T's)");
    static const struct {
        const char *role, *tag;
    } roles[] = {{"system", "System: "}, {"user", "User: "}, {"assistant", "Assistant: "}};
    text_out o = {buf, cap, 0};
    put(&o, "<|begin_of_text|>", 17);
    for (size_t i = 0; i < n; i++) {
        const char *tag = NULL;
        for (size_t r = 0; r < 3 && messages[i].role; r++)
            if (strcmp(messages[i].role, roles[r].role) == 0)
                tag = roles[r].tag;
        if (!tag || !messages[i].content)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                "roles are system, user and assistant",
                                "chat message %zu: role '%.32s' %s", i,
                                messages[i].role ? messages[i].role : "(null)",
                                tag ? "has no content" : "is not one the format knows");
        size_t k;
        const char *text = bn_chat_trim(messages[i].content, &k);
        put(&o, tag, strlen(tag));
        put(&o, text, k);
        put(&o, "<|eot_id|>", 10);
    }
    if (add_assistant)
        put(&o, "Assistant: ", 11);
    *len = o.len;
    if (buf && o.len < cap)
        buf[o.len] = '\0';
    return BN_OK;
}

/* ---- sessions -------------------------------------------------------------------- */

bn_status bn_session_create(bn_model *m, bn_session **out, bn_error *err)
{
    if (!m || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_session_create: NULL model or out");
    bn_session *s = calloc(1, sizeof *s);
    if (!s)
        return no_memory(err, "a session");
    s->model = m;
    atomic_init(&s->cancel, 0);
    *out = s;
    return BN_OK;
}

void bn_session_free(bn_session *s)
{
    if (!s)
        return;
    bn_generation_free(&s->last);
    free(s->tokens);
    free(s);
}

bn_status bn_session_tokens(const bn_session *s, int32_t *tokens, size_t cap, size_t *n,
                            bn_error *err)
{
    if (!s || (!tokens && cap) || !n)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_session_tokens: NULL session, tokens or n");
    *n = s->n;
    if (tokens && s->n)
        memcpy(tokens, s->tokens, (s->n < cap ? s->n : cap) * sizeof *tokens);
    return BN_OK;
}

void bn_session_reset(bn_session *s)
{
    if (s)
        s->n = 0;
}

bn_status bn_session_truncate(bn_session *s, size_t n, bn_error *err)
{
    if (!s || n > s->n)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_session_truncate: %zu tokens asked, the session holds %zu", n,
                            s ? s->n : 0);
    s->n = n;
    return BN_OK;
}

bn_status bn_session_copy(const bn_session *src, size_t n, bn_session **out, bn_error *err)
{
    if (!src || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_session_copy: NULL session or out");
    if (n == SIZE_MAX)
        n = src->n;
    if (n > src->n)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_session_copy: %zu tokens asked, the session holds %zu", n, src->n);
    bn_session *s = NULL;
    bn_status st = bn_session_create(src->model, &s, err);
    if (st != BN_OK)
        return st;
    if (n && !reserve(&s->tokens, &s->cap, n)) {
        bn_session_free(s);
        return no_memory(err, "a session's tokens");
    }
    if (n)
        memcpy(s->tokens, src->tokens, n * sizeof *s->tokens);
    s->n = n;
    *out = s;
    return BN_OK;
}

void bn_session_cancel(bn_session *s)
{
    if (s)
        atomic_store(&s->cancel, 1);
}

/* ---- generation -------------------------------------------------------------------- */

void bn_generate_params_default(bn_generate_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->max_tokens = 128;
    p->temperature = 0.0f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
}

static bn_status check_params(const bn_generate_params *p, bn_error *err)
{
    if (!(p->temperature >= 0.0f && p->temperature <= 100.0f) || p->top_k < 0 ||
        !(p->top_p >= 0.0f && p->top_p <= 1.0f) || !(p->min_p >= 0.0f && p->min_p <= 1.0f) ||
        !(p->repeat_penalty > 0.0f && p->repeat_penalty <= 100.0f) || p->repeat_last_n < -1 ||
        p->max_tokens < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "generate parameters out of range: max_tokens %d (>= 1), "
                            "temperature %g (0..100), top_k %d (>= 0), top_p %g and min_p %g "
                            "(0..1), repeat_penalty %g (0..100], repeat_last_n %d (>= -1)",
                            p->max_tokens, (double)p->temperature, p->top_k, (double)p->top_p,
                            (double)p->min_p, (double)p->repeat_penalty, p->repeat_last_n);
    if (p->top_logprobs < 0 || p->top_logprobs > BN_MAX_TOP_LOGPROBS)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "top_logprobs %d is outside 0..%d", p->top_logprobs,
                            BN_MAX_TOP_LOGPROBS);
    if (p->prompt && p->prompt_tokens)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "give prompt or prompt_tokens, not both");
    if (!p->prompt_tokens && p->n_prompt_tokens)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "n_prompt_tokens is %zu but prompt_tokens is NULL", p->n_prompt_tokens);
    for (int i = 0; i < BN_MAX_STOP_STRINGS && p->stop[i]; i++)
        if (!p->stop[i][0])
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "stop string %d is empty", i);
    return BN_OK;
}

/* The session's tokens followed by the prompt's, into *all (malloc'ed). A
 * text prompt starts with BOS when the session is empty, the tokenizer
 * asks for one and the text does not write it itself (a chat format
 * does). */
static bn_status sequence(const bn_session *s, const int32_t *ids, size_t n_ids, const char *text,
                          int32_t **all, size_t *n_all, size_t *n_new, bn_error *err)
{
    const bn_model *m = s->model;
    int32_t *owned = NULL; /* a tokenized text's tokens */
    const int32_t *fresh = NULL;
    size_t n_fresh = 0;
    bn_status st = BN_OK;
    if (text) {
        const bn_tokenizer *t = model_tokenizer(m);
        if ((st = need_tokenizer(t, err)) != BN_OK)
            return st;
        if ((st = bn_tokenize(t, text, strlen(text), false, true, &owned, &n_fresh, err)) != BN_OK)
            return st;
        const int32_t bos = bn_tokenizer_bos(t);
        if (s->n == 0 && bos >= 0 && bn_tokenizer_add_bos_default(t) &&
            (n_fresh == 0 || owned[0] != bos)) {
            int32_t *with = malloc((n_fresh + 1) * sizeof *with);
            if (!with) {
                free(owned);
                return no_memory(err, "the prompt");
            }
            with[0] = bos;
            memcpy(with + 1, owned, n_fresh * sizeof *with);
            free(owned);
            owned = with;
            n_fresh++;
        }
        fresh = owned;
    } else if (ids) {
        if ((st = check_ids(m, ids, n_ids, err)) != BN_OK)
            return st;
        fresh = ids;
        n_fresh = n_ids;
    }
    int32_t *out = malloc((s->n + n_fresh + 1) * sizeof *out);
    if (!out) {
        free(owned);
        return no_memory(err, "the prompt");
    }
    if (s->n)
        memcpy(out, s->tokens, s->n * sizeof *out);
    if (n_fresh)
        memcpy(out + s->n, fresh, n_fresh * sizeof *out);
    free(owned);
    if (s->n + n_fresh == 0) {
        free(out);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "give a prompt",
                            "nothing to continue from: the session is empty and the prompt "
                            "has no tokens");
    }
    *all = out;
    *n_all = s->n + n_fresh;
    *n_new = n_fresh;
    return BN_OK;
}

/* Positions of seq the model's cache holds: the common prefix with
 * cache_tokens, leaving at least one token to compute. */
static size_t cached_prefix(const bn_model *m, const int32_t *seq, size_t n)
{
    size_t limit = m->n_cache;
    const int64_t filled = bn_engine_kv_filled(m->engine);
    if ((int64_t)limit > filled)
        limit = filled > 0 ? (size_t)filled : 0;
    if (limit > n - 1)
        limit = n - 1;
    size_t k = 0;
    while (k < limit && m->cache_tokens[k] == seq[k])
        k++;
    return k;
}

/* After a computation: the cache holds the first bn_engine_kv_filled
 * tokens of seq (ok), or after a failure at most the n_cached it started
 * from. */
static void note_cache(bn_model *m, const int32_t *seq, size_t n, size_t n_cached, bool ok)
{
    int64_t filled = bn_engine_kv_filled(m->engine);
    size_t keep = filled > 0 ? (size_t)filled : 0;
    if (keep > n)
        keep = n;
    if (!ok && keep > n_cached)
        keep = n_cached;
    if (!reserve(&m->cache_tokens, &m->cap_cache, keep ? keep : 1)) {
        m->n_cache = 0; /* forgetting is always correct */
        return;
    }
    memmove(m->cache_tokens, seq, keep * sizeof *seq);
    m->n_cache = keep;
}

/* Stop strings over the streamed text: text that could be the start of a
 * stop string is held back until the next tokens decide. */
typedef struct streaming {
    const bn_generate_params *p;
    bn_token_callback fn;
    void *user;
    char *held;
    size_t n_held, cap_held;
    bool matched, oom;
} streaming;

/* Length of the longest suffix of s[0, n) that starts some stop string. */
static size_t stop_prefix_len(const bn_generate_params *p, const char *s, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < BN_MAX_STOP_STRINGS && p->stop[i]; i++) {
        const size_t L = strlen(p->stop[i]);
        for (size_t k = (L - 1 < n ? L - 1 : n); k > best; k--)
            if (memcmp(s + n - k, p->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* The first stop string in s[0, n): its offset, or n. */
static size_t stop_at(const bn_generate_params *p, const char *s, size_t n)
{
    size_t first = n;
    for (int i = 0; i < BN_MAX_STOP_STRINGS && p->stop[i]; i++) {
        const size_t L = strlen(p->stop[i]);
        for (size_t at = 0; at + L <= n && at < first; at++)
            if (memcmp(s + at, p->stop[i], L) == 0) {
                first = at;
                break;
            }
    }
    return first;
}

static bool on_engine_token(void *ctx, int32_t token, const char *text, size_t len)
{
    streaming *st = ctx;
    if (st->matched)
        return false;
    if (len) {
        if (st->n_held + len + 1 > st->cap_held) {
            size_t c = st->cap_held ? st->cap_held : 256;
            while (c < st->n_held + len + 1)
                c *= 2;
            char *p = realloc(st->held, c);
            if (!p) {
                st->oom = true;
                return false;
            }
            st->held = p;
            st->cap_held = c;
        }
        memcpy(st->held + st->n_held, text, len);
        st->n_held += len;
    }
    size_t give = st->n_held;
    if (token >= 0 && st->p->stop[0]) {
        const size_t at = stop_at(st->p, st->held, st->n_held);
        if (at < st->n_held) {
            give = at;
            st->matched = true;
        } else {
            give = st->n_held - stop_prefix_len(st->p, st->held, st->n_held);
        }
    }
    bool go_on = true;
    /* Never a NULL text, even before any was held: "" with length 0. */
    if (st->fn && (token >= 0 || give > 0))
        go_on = st->fn(st->user, token, st->held ? st->held : "", give);
    if (give > 0) {
        memmove(st->held, st->held + give, st->n_held - give);
        st->n_held -= give;
    }
    if (st->matched)
        st->n_held = 0; /* the stop string and what follows it are not text */
    return go_on && !st->matched;
}

/* After a generation over seq: the session becomes seq followed by the
 * tokens generated, and the model notes the tokens its cache holds now.
 * Out of memory leaves the session as it was, and the cache noted as after
 * a failure (only the prefix it started from), which is always true. */
/* The session becomes seq followed by the generated tokens. */
static bn_status session_keep(bn_session *s, const int32_t *seq, size_t n_seq,
                              const bn_generation *g, bn_error *err)
{
    const size_t total = n_seq + g->n_tokens;
    if (!reserve(&s->tokens, &s->cap, total ? total : 1))
        return no_memory(err, "the session's tokens");
    memmove(s->tokens, seq, n_seq * sizeof *seq);
    if (g->n_tokens)
        memcpy(s->tokens + n_seq, g->tokens, g->n_tokens * sizeof *s->tokens);
    s->n = total;
    return BN_OK;
}

/* After a generation over seq: the session keeps it, and the model notes
 * the tokens its single-sequence cache holds now. Out of memory leaves the
 * session as it was, and the cache noted as after a failure (only the
 * prefix it started from), which is always true. */
static bn_status keep_generated(bn_session *s, const int32_t *seq, size_t n_seq,
                                const bn_generation *g, size_t n_cached, bn_error *err)
{
    bn_model *m = s->model;
    const size_t total = n_seq + g->n_tokens;
    int32_t *all = malloc((total ? total : 1) * sizeof *all);
    if (!all) {
        note_cache(m, seq, n_seq, n_cached, false);
        return no_memory(err, "the session's tokens");
    }
    memcpy(all, seq, n_seq * sizeof *all);
    if (g->n_tokens)
        memcpy(all + n_seq, g->tokens, g->n_tokens * sizeof *all);
    note_cache(m, all, total, n_cached, true);
    const bn_status st = session_keep(s, all, n_seq, g, err);
    free(all);
    return st;
}

/* The engine request of generate params (the pointers set by the caller). */
static bn_generate_request engine_request(const bn_generate_params *p)
{
    bn_generate_request req = {.n_predict = p->max_tokens,
                               .ignore_eog = p->ignore_eog,
                               .prompt_logits = p->prompt_logits,
                               .on_logprobs = p->on_logprobs,
                               .top_logprobs = p->top_logprobs};
    bn_sampler_params_default(&req.sampling);
    req.sampling.temperature = p->temperature;
    req.sampling.top_k = p->top_k;
    req.sampling.top_p = p->top_p;
    req.sampling.min_p = p->min_p;
    req.sampling.repeat_penalty = p->repeat_penalty;
    req.sampling.repeat_last_n = p->repeat_last_n;
    req.sampling.seed = p->seed;
    return req;
}

/* A finished generation: the result's fields, and the generation kept in
 * the session for its receipt (g is taken). */
static void finish_result(bn_session *s, const bn_generate_request *req, bn_generation *g,
                          const streaming *sm, size_t n_new, size_t n_cached,
                          bn_generate_result *result)
{
    if (result) {
        result->n_prompt_tokens = n_new;
        result->n_cached = n_cached;
        result->n_tokens = g->n_tokens;
        result->stop = sm->matched            ? BN_STOP_STRING
                       : g->cancelled         ? BN_STOP_CANCELLED
                       : g->stopped_by_caller ? BN_STOP_CALLBACK
                       : g->stopped_at_eog    ? BN_STOP_EOG
                                              : BN_STOP_MAX_TOKENS;
        result->prompt_seconds = g->prompt_seconds;
        result->generate_seconds = g->gen_seconds;
        result->decode_steps = g->decode_steps;
        result->decode_seconds = g->decode_seconds;
    }
    bn_generation_free(&s->last);
    s->last = *g;
    s->last_req = (bn_generate_request){
        .n_predict = req->n_predict, .ignore_eog = req->ignore_eog, .sampling = req->sampling};
    s->has_last = true;
    memset(g, 0, sizeof *g);
}

/* Runs one request over seq (the session's tokens and the prompt's) with
 * the cache's prefix reused; the caller holds the model's lock. */
static bn_status run_request(bn_session *s, bn_generate_request *req, const int32_t *seq,
                             size_t n_seq, bn_generation *g, size_t *n_cached, bn_error *err)
{
    bn_model *m = s->model;
    *n_cached = cached_prefix(m, seq, n_seq);
    req->prompt_tokens = seq;
    req->n_prompt_tokens = n_seq;
    req->n_cached = *n_cached;
    req->cancel = &s->cancel;
    bn_status st = bn_engine_generate(m->engine, req, g, err);
    return st;
}

bn_status bn_session_generate(bn_session *s, const bn_generate_params *p,
                              bn_token_callback on_token, void *user, bn_generate_result *result,
                              bn_error *err)
{
    if (result)
        memset(result, 0, sizeof *result);
    if (!s || !p)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_session_generate: NULL session or params");
    bn_status st = check_params(p, err);
    if (st != BN_OK)
        return st;
    bn_model *m = s->model;
    if (m->batcher) { /* many sequences at once: join the scheduler's passes */
        bn_batch_item item = {.session = s, .params = p, .on_token = on_token, .user = user};
        st = bn_generate_batch(m, &item, 1, err);
        if (st == BN_OK && item.status != BN_OK) {
            if (err)
                *err = item.error;
            st = item.status;
        }
        if (result && st == BN_OK)
            *result = item.result;
        return st;
    }
    /* From here a cancel counts, also while this call waits for the model. */
    atomic_store(&s->cancel, 0);
    pthread_mutex_lock(&m->lock);
    int32_t *seq = NULL;
    size_t n_seq = 0, n_new = 0;
    st = sequence(s, p->prompt_tokens, p->n_prompt_tokens, p->prompt, &seq, &n_seq, &n_new, err);
    if (st != BN_OK) {
        pthread_mutex_unlock(&m->lock);
        return st;
    }
    streaming sm = {.p = p, .fn = on_token, .user = user};
    bn_generate_request req = engine_request(p);
    req.on_token = on_engine_token;
    req.ctx = &sm;
    req.logprobs_ctx = user;
    bn_generation g;
    size_t n_cached = 0;
    st = run_request(s, &req, seq, n_seq, &g, &n_cached, err);
    if (st == BN_OK && sm.oom) {
        bn_generation_free(&g);
        st = no_memory(err, "the streamed text");
    }
    if (st == BN_OK) {
        /* The text still held back (an unfinished stop string). */
        if (sm.n_held && !sm.matched && on_token)
            (void)on_token(user, -1, sm.held, sm.n_held);
        st = keep_generated(s, seq, n_seq, &g, n_cached, err);
        if (st == BN_OK)
            finish_result(s, &req, &g, &sm, n_new, n_cached, result);
        else
            bn_generation_free(&g);
    } else {
        note_cache(m, seq, n_seq, n_cached, false);
    }
    pthread_mutex_unlock(&m->lock);
    free(seq);
    free(sm.held);
    return st;
}

/* ---- many sequences at once -------------------------------------------------- */

/* One batch item's state while the batch runs. */
typedef struct batch_slot {
    int32_t *seq;          /* the session's tokens and the prompt's */
    size_t n_seq, n_new;
    streaming sm;
    bn_generate_request req;
} batch_slot;

bn_status bn_generate_batch(bn_model *m, bn_batch_item *items, size_t n, bn_error *err)
{
    if (!m || (!items && n))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_generate_batch: NULL model or items");
    for (size_t i = 0; i < n; i++) {
        if (!items[i].session || !items[i].params || items[i].session->model != m)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "bn_generate_batch: item %zu needs a session of this model and "
                                "params",
                                i);
        for (size_t j = 0; j < i; j++)
            if (items[j].session == items[i].session)
                return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                    "give every item its own session",
                                    "bn_generate_batch: items %zu and %zu share a session", j, i);
    }
    batch_slot *slots = calloc(n ? n : 1, sizeof *slots);
    bn_batch_request *reqs = calloc(n ? n : 1, sizeof *reqs);
    bn_batch_result *res = calloc(n ? n : 1, sizeof *res);
    if (!slots || !reqs || !res) {
        free(slots);
        free(reqs);
        free(res);
        return no_memory(err, "a batch");
    }
    for (size_t i = 0; i < n; i++)
        atomic_store(&items[i].session->cancel, 0);
    /* With a scheduler thread the batch joins whatever it runs; else the
     * engine runs it here, the model held for the whole batch. */
    const bool threaded = m->batcher != NULL;
    if (!threaded)
        pthread_mutex_lock(&m->lock);
    /* Each item's sequence; an item that cannot start fails alone (it is
     * left out of the engine's batch: n_prompt 0 marks it). */
    for (size_t i = 0; i < n; i++) {
        bn_batch_item *it = &items[i];
        batch_slot *sl = &slots[i];
        memset(&it->result, 0, sizeof it->result);
        bn_error_clear(&it->error);
        it->status = check_params(it->params, &it->error);
        if (it->status == BN_OK)
            it->status = sequence(it->session, it->params->prompt_tokens,
                                  it->params->n_prompt_tokens, it->params->prompt, &sl->seq,
                                  &sl->n_seq, &sl->n_new, &it->error);
        if (it->status != BN_OK)
            continue;
        sl->sm = (streaming){.p = it->params, .fn = it->on_token, .user = it->user};
        sl->req = engine_request(it->params);
        reqs[i] = (bn_batch_request){.prompt = sl->seq,
                                     .n_prompt = sl->n_seq,
                                     .n_predict = sl->req.n_predict,
                                     .ignore_eog = sl->req.ignore_eog,
                                     .sampling = sl->req.sampling,
                                     .on_token = on_engine_token,
                                     .ctx = &sl->sm,
                                     .cancel = &it->session->cancel,
                                     .prompt_logits = sl->req.prompt_logits,
                                     .on_logprobs = sl->req.on_logprobs,
                                     .top_logprobs = sl->req.top_logprobs,
                                     .logprobs_ctx = it->user};
    }
    /* The engine runs the items that could start, in their order. */
    size_t n_run = 0;
    for (size_t i = 0; i < n; i++)
        if (items[i].status == BN_OK)
            reqs[n_run++] = reqs[i];
    bn_status st = threaded ? run_on_scheduler(m, reqs, n_run, res, err)
                            : bn_engine_generate_batch(m->engine, reqs, n_run, res, err);
    for (size_t i = 0, k = 0; i < n; i++) {
        bn_batch_item *it = &items[i];
        batch_slot *sl = &slots[i];
        if (it->status == BN_OK) {
            bn_batch_result *r = &res[k++];
            it->status = r->status;
            it->error = r->error;
            if (it->status == BN_OK && sl->sm.oom) {
                it->status = no_memory(&it->error, "the streamed text");
                bn_generation_free(&r->gen);
            }
            if (it->status == BN_OK) {
                if (sl->sm.n_held && !sl->sm.matched && it->on_token)
                    (void)it->on_token(it->user, -1, sl->sm.held, sl->sm.n_held);
                it->status = session_keep(it->session, sl->seq, sl->n_seq, &r->gen, &it->error);
                if (it->status == BN_OK)
                    finish_result(it->session, &sl->req, &r->gen, &sl->sm, sl->n_new,
                                  (size_t)r->reused, &it->result);
            }
            bn_generation_free(&r->gen);
        }
        free(sl->seq);
        free(sl->sm.held);
    }
    if (!threaded)
        pthread_mutex_unlock(&m->lock);
    free(slots);
    free(reqs);
    free(res);
    return st;
}

bn_status bn_session_eval(bn_session *s, const int32_t *tokens, size_t n, float *logits,
                          bn_error *err)
{
    if (!s || (!tokens && n) || !logits)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_session_eval: NULL session, tokens or logits");
    bn_model *m = s->model;
    atomic_store(&s->cancel, 0);
    pthread_mutex_lock(&m->lock);
    int32_t *seq = NULL;
    size_t n_seq = 0, n_new = 0;
    bn_status st = sequence(s, tokens, n, NULL, &seq, &n_seq, &n_new, err);
    if (st == BN_OK) {
        bn_generate_request req = {.prompt_only = true, .prompt_logits = logits};
        bn_sampler_params_default(&req.sampling);
        bn_generation g;
        size_t n_cached = 0;
        st = run_request(s, &req, seq, n_seq, &g, &n_cached, err);
        note_cache(m, seq, n_seq, n_cached, st == BN_OK);
        if (st == BN_OK) {
            bn_generation_free(&g);
            if (!reserve(&s->tokens, &s->cap, n_seq)) {
                st = no_memory(err, "the session's tokens");
            } else {
                memcpy(s->tokens, seq, n_seq * sizeof *seq);
                s->n = n_seq;
            }
        }
    }
    pthread_mutex_unlock(&m->lock);
    free(seq);
    return st;
}

bn_status bn_session_write_receipt(const bn_session *s, const bn_receipt_options *o, FILE *out,
                                   bn_error *err)
{
    if (!s || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_session_write_receipt: NULL session or file");
    if (!s->has_last)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "generate in the session first",
                            "the session has generated nothing to write a receipt of");
    bn_generate_request req = s->last_req;
    req.chat = o && o->chat;
    const bn_receipt_info ri = {.command = o && o->command ? o->command : "",
                                .req = &req,
                                .gen = &s->last,
                                .seed_fixed = o && o->seed_fixed};
    pthread_mutex_lock(&s->model->lock);
    const bn_status st = bn_engine_write_receipt(s->model->engine, &ri, out, err);
    pthread_mutex_unlock(&s->model->lock);
    return st;
}

/* ---- perplexity ------------------------------------------------------------------------ */

static void copy_perplexity(const bn_perplexity_result *r, bn_perplexity *out)
{
    out->perplexity = r->perplexity;
    out->mean_nll = r->mean_nll;
    out->n_predicted = r->n_predicted;
    out->n_text_tokens = r->n_text_tokens;
    out->n_chunks = r->n_chunks;
    out->ctx = r->ctx;
    out->seconds = r->seconds;
}

typedef struct ppl_relay {
    bn_perplexity_progress fn;
    void *user;
} ppl_relay;

static void relay_progress(void *ctx, int64_t chunk, int64_t n_chunks,
                           const bn_perplexity_result *so_far)
{
    const ppl_relay *r = ctx;
    bn_perplexity p;
    copy_perplexity(so_far, &p);
    r->fn(r->user, chunk, n_chunks, &p);
}

bn_status bn_model_perplexity(bn_model *m, const char *text, size_t len, int64_t ctx,
                              bn_perplexity_progress progress, void *user, bn_perplexity *out,
                              bn_error *err)
{
    if (!m || (!text && len) || !out || ctx < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_model_perplexity: NULL model, text or out, or ctx < 0");
    memset(out, 0, sizeof *out);
    if (ctx == 0) {
        const int64_t n_ctx = bn_engine_n_ctx(m->engine);
        ctx = n_ctx < 512 ? n_ctx : 512;
    }
    ppl_relay relay = {progress, user};
    pthread_mutex_lock(&m->lock);
    bn_perplexity_result r;
    bn_status st = bn_engine_perplexity(m->engine, text ? text : "", len, ctx,
                                        progress ? relay_progress : NULL, &relay, &r, err);
    m->n_cache = 0; /* the chunks overwrote the cache */
    pthread_mutex_unlock(&m->lock);
    if (st == BN_OK)
        copy_perplexity(&r, out);
    return st;
}
