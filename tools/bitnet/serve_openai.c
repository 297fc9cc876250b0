/* serve_openai.c - the OpenAI wire format of `bitnet serve` (serve.h):
 * completions and chat completions (one choice, streamed as server-sent
 * events or whole), models, tokenize / detokenize, health and metrics.
 *
 * A generation is a job: its own session on the shared model, the
 * request's sampling, and the text as it comes. A whole answer runs the
 * job on the connection's thread; a streamed one runs it on a thread of
 * its own whose token callback turns each piece into an event in a
 * queue the connection's thread sends from (serve_job_read). Requests
 * running at once are decoded together by the model's scheduler
 * (max_sequences = --parallel). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

double serve_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* cJSON's text of o (freed with free), then o deleted; NULL: no memory. */
static char *print_and_delete(cJSON *o)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return text;
}

void serve_error(serve_reply *r, int status, const char *type, const char *code,
                 const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    r->status = status;
    r->body = print_and_delete(o);
    r->content_type = "application/json";
}

static void reply_json(serve_reply *r, int status, cJSON *o)
{
    r->status = status;
    r->body = print_and_delete(o);
    r->content_type = "application/json";
    if (!r->body)
        serve_error(r, 500, "server_error", NULL, "out of memory");
}

/* ---- request fields ------------------------------------------------------------------- */

/* A request's JSON object, or NULL after a 400 (malformed JSON, not an
 * object). */
static cJSON *parse_object(const char *body, size_t len, serve_reply *r)
{
    cJSON *o = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        serve_error(r, 400, "invalid_request_error", NULL,
                    "the request body must be a JSON object");
        return NULL;
    }
    return o;
}

/* Field `name` of o as a number in [lo, hi] (absent or null: *out kept);
 * false after a 400. */
static bool get_number(const cJSON *o, const char *name, double lo, double hi, double *out,
                       serve_reply *r)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!f || cJSON_IsNull(f))
        return true;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || f->valuedouble < lo ||
        f->valuedouble > hi) {
        serve_error(r, 400, "invalid_request_error", NULL, "'%s' must be a number from %g to %g",
                    name, lo, hi);
        return false;
    }
    *out = f->valuedouble;
    return true;
}

static bool get_int(const cJSON *o, const char *name, double lo, double hi, long long *out,
                    serve_reply *r)
{
    double v = (double)*out;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (f && cJSON_IsNumber(f) && f->valuedouble != floor(f->valuedouble)) {
        serve_error(r, 400, "invalid_request_error", NULL, "'%s' must be an integer", name);
        return false;
    }
    if (!get_number(o, name, lo, hi, &v, r))
        return false;
    *out = (long long)v;
    return true;
}

static bool get_bool(const cJSON *o, const char *name, bool *out, serve_reply *r)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!f || cJSON_IsNull(f))
        return true;
    if (!cJSON_IsBool(f)) {
        serve_error(r, 400, "invalid_request_error", NULL, "'%s' must be true or false", name);
        return false;
    }
    *out = cJSON_IsTrue(f);
    return true;
}

/* ---- jobs ------------------------------------------------------------------------------- */

struct serve_job {
    server *s;
    serve_job *next;          /* in s->jobs                                */
    bn_session *session;
    bn_generate_params params;
    int32_t *prompt;
    size_t n_prompt;
    char *stops[BN_MAX_STOP_STRINGS];
    bool chat, stream, include_usage;
    /* Choices (the request's n): each its own job and session, answering
     * choice `index`; their events go to the carrier's queue (choice 0's),
     * which holds every choice and counts those still running. */
    int index;
    serve_job *carrier;
    serve_job **choices;
    int n_choices, running;
    bool seeded;               /* the request gave a seed                     */
    int logprobs;              /* -1: none; else the top alternatives a token */
    cJSON *lp_pending;         /* log-probability entries not yet sent        */
    size_t lp_offset;          /* text bytes before them (completions' offsets) */
    char id[48];
    int64_t created;
    double t_start, deadline;  /* deadline 0: none                           */
    bool first_seen, timed_out;
    atomic_bool gone;          /* the client left: stop                     */
    atomic_bool late;          /* past the deadline: cancelled (serve_cancel_late) */
    /* The answer so far, and the result. */
    char *text;
    size_t text_len, text_cap;
    bn_generate_result result;
    bn_status status;
    bn_error err;
    /* Streaming: events not yet sent; done once the last is queued. */
    pthread_t thread;
    bool threaded;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *q;
    size_t q_len, q_off, q_cap;
    bool done;
    /* A token's chunk, printed once around the piece's place (its text
     * before the piece's JSON string: frame_head bytes); NULL with
     * log-probabilities, whose chunks differ. */
    char *frame;
    size_t frame_head;
    bool reader_waiting;       /* serve_job_read sleeps on cv               */
    bool wake_posted;          /* on the waker's list                       */
};

static bool append(char **buf, size_t *len, size_t *cap, const char *text, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return false;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, text, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

/* Appends one server-sent event carrying o (deleted), or the text given,
 * to the carrier's queue; true when its reader sleeps and needs waking.
 * The caller holds the carrier's mutex. */
static bool queue_event(serve_job *j, cJSON *o, const char *raw)
{
    char *text = o ? print_and_delete(o) : NULL;
    if (text || raw) {
        append(&j->q, &j->q_len, &j->q_cap, "data: ", 6);
        const char *t = text ? text : raw;
        append(&j->q, &j->q_len, &j->q_cap, t, strlen(t));
        append(&j->q, &j->q_len, &j->q_cap, "\n\n", 2);
    }
    free(text);
    return j->reader_waiting;
}

/* Queues an event and wakes the reader: for the job's own thread. */
static void push_event(serve_job *job, cJSON *o, const char *raw)
{
    serve_job *j = job->carrier;
    pthread_mutex_lock(&j->mu);
    if (queue_event(j, o, raw))
        pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static cJSON *chunk(serve_job *j, const char *text, size_t len, bool role, const char *finish);

/* Appends text as a JSON string, escaped as cJSON prints strings. */
static void append_json_string(serve_job *j, const char *text, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    append(&j->q, &j->q_len, &j->q_cap, "\"", 1);
    size_t plain = 0; /* bytes since the last escape, copied at once */
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)text[i];
        if (c >= 32 && c != '"' && c != '\\')
            continue;
        append(&j->q, &j->q_len, &j->q_cap, text + plain, i - plain);
        plain = i + 1;
        char esc[6] = {'\\', (char)c};
        size_t n = 2;
        switch (c) {
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '"': case '\\': break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            n = 6;
        }
        append(&j->q, &j->q_len, &j->q_cap, esc, n);
    }
    append(&j->q, &j->q_len, &j->q_cap, text + plain, len - plain);
    append(&j->q, &j->q_len, &j->q_cap, "\"", 1);
}

/* Queues a token's event on the scheduler's thread, which hands the
 * reader's wake-up to the waker (serve_wake.c). A chunk without
 * log-probabilities is the same text every time but for the piece, so
 * cJSON prints it once, around a marker, and each token then costs copies
 * and the piece's escaping: this thread's time is time the device waits. */
static void push_token_event(serve_job *job, const char *text, size_t len)
{
    if (!job->frame && job->logprobs < 0) {
        char *t = print_and_delete(chunk(job, "\x01", 1, false, NULL));
        const char *mark = t ? strstr(t, "\"\\u0001\"") : NULL;
        if (mark) {
            job->frame = t;
            job->frame_head = (size_t)(mark - t);
        } else {
            free(t);
        }
    }
    cJSON *o = job->frame ? NULL : chunk(job, text, len, false, NULL);
    serve_job *j = job->carrier;
    pthread_mutex_lock(&j->mu);
    bool wake;
    if (job->frame) {
        append(&j->q, &j->q_len, &j->q_cap, "data: ", 6);
        append(&j->q, &j->q_len, &j->q_cap, job->frame, job->frame_head);
        append_json_string(j, text, len);
        const char *tail = job->frame + job->frame_head + 8; /* past "\u0001" */
        append(&j->q, &j->q_len, &j->q_cap, tail, strlen(tail));
        append(&j->q, &j->q_len, &j->q_cap, "\n\n", 2);
        wake = j->reader_waiting;
    } else {
        wake = queue_event(j, o, NULL);
    }
    const bool post = wake && !j->wake_posted;
    j->wake_posted |= post;
    pthread_mutex_unlock(&j->mu);
    if (post && !serve_waker_post(&j->s->waker, j))
        serve_job_wake(j);
}

void serve_job_wake(serve_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->wake_posted = false;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* ---- log-probabilities ------------------------------------------------------------------ */

/* A token and its log-probability as an entry: its text as a JSON string
 * (bytes that are not well-formed UTF-8, where a token cuts a character,
 * as U+FFFD), its exact bytes, the log-probability (-inf, which JSON
 * lacks, as the most negative float). */
static cJSON *token_entry(const serve_job *j, int32_t token, float logprob)
{
    char raw[256], text[768];
    size_t len = 0, out = 0;
    bn_error err;
    if (bn_model_detokenize(j->s->model, &token, 1, raw, sizeof raw, &len, &err) != BN_OK)
        len = 0;
    if (len >= sizeof raw)
        len = sizeof raw - 1;
    for (size_t i = 0; i < len;) {
        const unsigned char c = (unsigned char)raw[i];
        const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= len;
        for (size_t k = 1; ok && k < n; k++)
            ok = ((unsigned char)raw[i + k] >> 6) == 2;
        if (ok) {
            memcpy(text + out, raw + i, n);
            out += n;
            i += n;
        } else {
            memcpy(text + out, "\xef\xbf\xbd", 3); /* U+FFFD */
            out += 3;
            i++;
        }
    }
    text[out] = '\0';
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "token", text);
    cJSON_AddNumberToObject(e, "logprob", isfinite(logprob) ? logprob : -3.4e38);
    cJSON *bytes = cJSON_AddArrayToObject(e, "bytes");
    for (size_t i = 0; i < len; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)raw[i]));
    return e;
}

/* Called on the thread that calls on_token, which sends the entries with
 * the token's text: no lock. */
static void on_logprob(void *user, int32_t token, float logprob, const bn_token_logprob *top,
                       int n_top)
{
    serve_job *j = user;
    cJSON *e = token_entry(j, token, logprob);
    cJSON *alts = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int k = 0; k < n_top && k < j->logprobs; k++)
        cJSON_AddItemToArray(alts, token_entry(j, top[k].token, top[k].logprob));
    cJSON_AddItemToArray(j->lp_pending, e);
}

/* The pending entries as a choice's "logprobs": {"content": [...]} for
 * chat; for completions the legacy form, {"tokens", "token_logprobs",
 * "top_logprobs" ({text: logprob} a token), "text_offset"}, the offsets
 * counted from j->lp_offset (advanced). The pending list starts again. */
static cJSON *take_logprobs(serve_job *j)
{
    cJSON *entries = j->lp_pending;
    j->lp_pending = cJSON_CreateArray();
    if (j->chat) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "content", entries);
        return o;
    }
    cJSON *o = cJSON_CreateObject(), *tokens = cJSON_AddArrayToObject(o, "tokens"),
          *lps = cJSON_AddArrayToObject(o, "token_logprobs"),
          *tops = cJSON_AddArrayToObject(o, "top_logprobs"),
          *offs = cJSON_AddArrayToObject(o, "text_offset");
    const cJSON *e;
    cJSON_ArrayForEach(e, entries)
    {
        cJSON_AddItemToArray(tokens,
                             cJSON_CreateString(cJSON_GetObjectItem(e, "token")->valuestring));
        cJSON_AddItemToArray(
            lps, cJSON_CreateNumber(cJSON_GetObjectItem(e, "logprob")->valuedouble));
        cJSON *d = cJSON_CreateObject();
        const cJSON *a;
        cJSON_ArrayForEach(a, cJSON_GetObjectItem(e, "top_logprobs"))
        {
            const char *at = cJSON_GetObjectItem(a, "token")->valuestring;
            if (!cJSON_GetObjectItemCaseSensitive(d, at))
                cJSON_AddNumberToObject(d, at, cJSON_GetObjectItem(a, "logprob")->valuedouble);
        }
        cJSON_AddItemToArray(tops, d);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)j->lp_offset));
        j->lp_offset += (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(e, "bytes"));
    }
    cJSON_Delete(entries);
    return o;
}

/* A chunk of the stream: the choice's delta (chat) or text, and its
 * finish reason (NULL: none yet). */
static cJSON *chunk(serve_job *j, const char *text, size_t len, bool role, const char *finish)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", j->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->s->model_id);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", j->index);
    char *piece = malloc(len + 1);
    if (piece) {
        memcpy(piece, text, len);
        piece[len] = '\0';
    }
    if (j->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (len || role)
            cJSON_AddStringToObject(d, "content", piece ? piece : "");
    } else {
        cJSON_AddStringToObject(c, "text", piece ? piece : "");
    }
    free(piece);
    /* The log-probabilities of the tokens so far, with the text they wrote
     * (or at the end). */
    if (j->logprobs >= 0 && (len || finish) && cJSON_GetArraySize(j->lp_pending) > 0)
        cJSON_AddItemToObject(c, "logprobs", take_logprobs(j));
    else
        cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    return o;
}

static void ttft_observe(server *s, double seconds)
{
    static const double bounds[SERVE_TTFT_BUCKETS] = {0.01, 0.025, 0.05, 0.1, 0.25,
                                                      0.5,  1.0,   2.5,  5.0, 10.0};
    pthread_mutex_lock(&s->lock);
    int b = 0;
    while (b < SERVE_TTFT_BUCKETS && seconds > bounds[b])
        b++;
    s->ttft_count[b]++;
    s->ttft_sum += seconds;
    pthread_mutex_unlock(&s->lock);
}

static bool on_token(void *user, int32_t token, const char *text, size_t len)
{
    serve_job *j = user;
    (void)token;
    if (!j->first_seen) {
        j->first_seen = true;
        ttft_observe(j->s, serve_now() - j->t_start);
    }
    if (len && !append(&j->text, &j->text_len, &j->text_cap, text, len))
        return false;
    if (j->stream && len)
        push_token_event(j, text, len);
    if (j->deadline > 0.0 && serve_now() > j->deadline) {
        j->timed_out = true;
        return false;
    }
    return !atomic_load(&j->gone);
}

static const char *finish_reason(const serve_job *j)
{
    return j->result.stop == BN_STOP_MAX_TOKENS ? "length" : "stop";
}

/* The request's usage (j: the carrier): its prompt once, every choice's
 * generated tokens. */
static cJSON *usage(const serve_job *j)
{
    size_t out = 0;
    for (int k = 0; k < j->n_choices; k++)
        out += j->choices[k]->result.n_tokens;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->result.n_prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)out);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(j->result.n_prompt_tokens + out));
    return u;
}

/* Runs the generation (on the connection's thread or the job's own). */
static void job_run(serve_job *j)
{
    server *s = j->s;
    atomic_fetch_add(&s->active, 1);
    j->status = bn_session_generate(j->session, &j->params, on_token, j, &j->result, &j->err);
    atomic_fetch_sub(&s->active, 1);
    if (atomic_load(&j->late))
        j->timed_out = true; /* cancelled while it waited or read its prompt */
    if (j->status == BN_OK) {
        atomic_fetch_add(&s->prompt_tokens, j->result.n_prompt_tokens);
        atomic_fetch_add(&s->completion_tokens, j->result.n_tokens);
        pthread_mutex_lock(&s->lock);
        s->gen_seconds += j->result.generate_seconds;
        pthread_mutex_unlock(&s->lock);
    }
}

static void *job_thread(void *arg)
{
    serve_job *j = arg;
    push_event(j, chunk(j, "", 0, j->chat, NULL), NULL);
    job_run(j);
    if (j->status != BN_OK || j->timed_out) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s",
                 j->timed_out ? "the request took longer than the server's --timeout"
                              : j->err.message);
        cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "message", msg);
        cJSON_AddStringToObject(e, "type", j->timed_out ? "timeout" : "server_error");
        push_event(j, o, NULL);
    } else {
        push_event(j, chunk(j, "", 0, false, finish_reason(j)), NULL);
    }
    /* The last choice to end closes the stream. */
    serve_job *c = j->carrier;
    pthread_mutex_lock(&c->mu);
    const bool last = --c->running == 0;
    pthread_mutex_unlock(&c->mu);
    if (!last)
        return NULL;
    if (c->include_usage) {
        cJSON *o = chunk(c, "", 0, false, NULL);
        cJSON_ReplaceItemInObject(o, "choices", cJSON_CreateArray());
        cJSON_AddItemToObject(o, "usage", usage(c));
        push_event(c, o, NULL);
    }
    push_event(c, NULL, "[DONE]");
    pthread_mutex_lock(&c->mu);
    c->done = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

size_t serve_job_read(serve_job *j, char *buf, size_t max)
{
    pthread_mutex_lock(&j->mu);
    if (j->q_off == j->q_len && !j->done) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        j->reader_waiting = true;
        pthread_cond_timedwait(&j->cv, &j->mu, &until);
        j->reader_waiting = false;
    }
    size_t n = 0;
    if (j->q_off < j->q_len) {
        n = j->q_len - j->q_off < max ? j->q_len - j->q_off : max;
        memcpy(buf, j->q + j->q_off, n);
        j->q_off += n;
        if (j->q_off == j->q_len)
            j->q_off = j->q_len = 0;
    } else if (!j->done) {
        /* Nothing for a second: a comment, so that a client that left is
         * noticed (the write fails) even before the next token. */
        static const char keepalive[] = ": keep-alive\n\n";
        n = sizeof keepalive - 1 < max ? sizeof keepalive - 1 : max;
        memcpy(buf, keepalive, n);
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

static void job_unlink(serve_job *j)
{
    server *s = j->s;
    pthread_mutex_lock(&s->lock);
    for (serve_job **p = &s->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    pthread_mutex_unlock(&s->lock);
}

/* One choice's job freed (its thread, if any, joined before). */
static void job_free(serve_job *j)
{
    job_unlink(j);
    bn_session_free(j->session);
    for (int i = 0; i < BN_MAX_STOP_STRINGS; i++)
        free(j->stops[i]);
    free(j->prompt);
    free(j->text);
    free(j->q);
    free(j->frame);
    cJSON_Delete(j->lp_pending);
    free(j);
}

void serve_job_release(serve_job *j, size_t *in, size_t *out)
{
    if (!j)
        return;
    bool early = false;
    if (j->threaded) {
        pthread_mutex_lock(&j->mu);
        early = !j->done;
        pthread_mutex_unlock(&j->mu);
        if (early) /* the client left before the end */
            atomic_fetch_add(&j->s->disconnects, 1);
    }
    for (int k = 0; k < j->n_choices; k++) {
        serve_job *c = j->choices[k];
        if (early) {
            atomic_store(&c->gone, true);
            bn_session_cancel(c->session);
        }
    }
    for (int k = 0; k < j->n_choices; k++)
        if (j->choices[k]->threaded)
            pthread_join(j->choices[k]->thread, NULL);
    if (j->threaded) {
        serve_waker_forget(&j->s->waker, j); /* nothing posts it now */
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
    }
    size_t generated = 0;
    for (int k = 0; k < j->n_choices; k++)
        generated += j->choices[k]->result.n_tokens;
    if (in)
        *in = j->result.n_prompt_tokens;
    if (out)
        *out = generated;
    atomic_fetch_sub(&j->s->in_flight, j->n_choices > 0 ? j->n_choices : 1);
    for (int k = 1; k < j->n_choices; k++)
        job_free(j->choices[k]);
    free(j->choices);
    job_free(j);
}

void serve_cancel_all(server *s)
{
    pthread_mutex_lock(&s->lock);
    for (serve_job *j = s->jobs; j; j = j->next)
        bn_session_cancel(j->session);
    pthread_mutex_unlock(&s->lock);
}

void serve_cancel_late(server *s)
{
    const double now = serve_now();
    pthread_mutex_lock(&s->lock);
    for (serve_job *j = s->jobs; j; j = j->next)
        if (j->deadline > 0.0 && now > j->deadline && !atomic_load(&j->late)) {
            atomic_store(&j->late, true);
            bn_session_cancel(j->session);
        }
    pthread_mutex_unlock(&s->lock);
}

/* ---- building a job from a request ------------------------------------------------------- */

/* The prompt's tokens from text (BOS added where the tokenizer asks). */
static bool tokenize_text(server *s, serve_job *j, const char *text, serve_reply *r)
{
    bn_error err;
    size_t n = 0;
    if (bn_model_tokenize(s->model, text, strlen(text), true, NULL, 0, &n, &err) != BN_OK) {
        serve_error(r, 400, "invalid_request_error", NULL, "%s", err.message);
        return false;
    }
    j->prompt = malloc((n ? n : 1) * sizeof *j->prompt);
    if (!j->prompt ||
        bn_model_tokenize(s->model, text, strlen(text), true, j->prompt, n, &n, &err) != BN_OK) {
        serve_error(r, 500, "server_error", NULL, "could not tokenize the prompt");
        return false;
    }
    j->n_prompt = n;
    return true;
}

/* A chat message's content: a string, or an array of {"type": "text",
 * "text": ...} parts (joined). NULL after a 400. */
static char *message_content(const cJSON *m, serve_reply *r)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(c))
        return strdup(c->valuestring);
    if (cJSON_IsNull(c) || !c)
        return strdup("");
    if (!cJSON_IsArray(c)) {
        serve_error(r, 400, "invalid_request_error", NULL,
                    "a message's 'content' must be a string or an array of text parts");
        return NULL;
    }
    char *out = NULL;
    size_t len = 0, cap = 0;
    append(&out, &len, &cap, "", 0);
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            free(out);
            serve_error(r, 400, "invalid_request_error", NULL,
                        "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
            return NULL;
        }
        append(&out, &len, &cap, text->valuestring, strlen(text->valuestring));
    }
    return out;
}

/* The chat messages through the model's chat template. */
static bool chat_prompt(server *s, serve_job *j, const cJSON *req, serve_reply *r)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
    const int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : 0;
    if (n < 1) {
        serve_error(r, 400, "invalid_request_error", NULL,
                    "'messages' must be a non-empty array of {\"role\", \"content\"}");
        return false;
    }
    bn_chat_message *m = calloc((size_t)n, sizeof *m);
    char **contents = calloc((size_t)n, sizeof *contents);
    bool ok = m && contents;
    for (int i = 0; i < n && ok; i++) {
        const cJSON *msg = cJSON_GetArrayItem(msgs, i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) {
            serve_error(r, 400, "invalid_request_error", NULL,
                        "message %d needs a 'role' string", i);
            ok = false;
            break;
        }
        contents[i] = message_content(msg, r);
        ok = contents[i] != NULL;
        m[i] = (bn_chat_message){role->valuestring, contents[i]};
    }
    char *text = NULL;
    if (ok) {
        bn_error err;
        size_t len = 0;
        bn_status st = bn_model_apply_chat(s->model, m, (size_t)n, true, NULL, 0, &len, &err);
        if (st == BN_OK && (text = malloc(len + 1)) != NULL)
            st = bn_model_apply_chat(s->model, m, (size_t)n, true, text, len + 1, &len, &err);
        if (st != BN_OK) {
            serve_error(r, 400, "invalid_request_error", NULL, "%s", err.message);
            ok = false;
        }
    }
    ok = ok && tokenize_text(s, j, text, r);
    for (int i = 0; contents && i < n; i++)
        free(contents[i]);
    free(contents);
    free(m);
    free(text);
    return ok;
}

/* The completion's prompt: a string, token ids, or an array of one string. */
static bool completion_prompt(server *s, serve_job *j, const cJSON *req, serve_reply *r)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p))
        return tokenize_text(s, j, p->valuestring, r);
    const int n = cJSON_IsArray(p) ? cJSON_GetArraySize(p) : 0;
    if (n < 1) {
        serve_error(r, 400, "invalid_request_error", NULL,
                    "'prompt' must be a string or a non-empty array of token ids");
        return false;
    }
    j->prompt = malloc((size_t)n * sizeof *j->prompt);
    if (!j->prompt) {
        serve_error(r, 500, "server_error", NULL, "out of memory");
        return false;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(p, i);
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= s->info.vocab_size) {
            serve_error(r, 400, "invalid_request_error", NULL,
                        "prompt token %d is not a token id (0 to %d)", i,
                        (int)s->info.vocab_size - 1);
            return false;
        }
        j->prompt[i] = (int32_t)t->valuedouble;
    }
    j->n_prompt = (size_t)n;
    return true;
}

/* Log-probabilities: chat's "logprobs": true with "top_logprobs" (0 to
 * 20), or the completions' "logprobs": N (0 to 5 alternatives). */
static bool read_logprobs(serve_job *j, const cJSON *req, serve_reply *r)
{
    j->logprobs = -1;
    long long top = 0;
    if (j->chat) {
        bool on = false;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(req, "top_logprobs");
        if (!get_bool(req, "logprobs", &on, r) ||
            !get_int(req, "top_logprobs", 0, BN_MAX_TOP_LOGPROBS, &top, r))
            return false;
        if (!on && t && !cJSON_IsNull(t)) {
            serve_error(r, 400, "invalid_request_error", NULL,
                        "'top_logprobs' needs 'logprobs': true");
            return false;
        }
        if (on)
            j->logprobs = (int)top;
    } else {
        top = -1;
        if (!get_int(req, "logprobs", 0, 5, &top, r))
            return false;
        j->logprobs = (int)top;
    }
    if (j->logprobs >= 0) {
        j->lp_pending = cJSON_CreateArray();
        j->params.on_logprobs = on_logprob;
        j->params.top_logprobs = j->logprobs;
    }
    return true;
}

/* The sampling and limits of the request into j->params. */
static bool read_sampling(server *s, serve_job *j, const cJSON *req, serve_reply *r)
{
    bn_generate_params *p = &j->params;
    bn_generate_params_default(p);
    /* OpenAI's defaults: sampling over the whole vocabulary at T = 1. */
    double temperature = 1.0, top_p = 1.0, min_p = 0.0, repeat_penalty = 1.0;
    long long top_k = 0, seed = -1, n = 1;
    const int64_t room = s->info.n_ctx - (int64_t)j->n_prompt;
    if (room < 1) {
        serve_error(r, 400, "invalid_request_error", "context_length_exceeded",
                    "the prompt has %zu tokens; the context holds %lld, with room for at least "
                    "one to generate",
                    j->n_prompt, (long long)s->info.n_ctx);
        return false;
    }
    long long max_tokens = room;
    double presence = 0.0, frequency = 0.0;
    bool ignore_eos = false;
    if (!get_number(req, "temperature", 0.0, 100.0, &temperature, r) ||
        !get_number(req, "top_p", 0.0, 1.0, &top_p, r) ||
        !get_number(req, "min_p", 0.0, 1.0, &min_p, r) ||
        !get_number(req, "repeat_penalty", 0.0, 100.0, &repeat_penalty, r) ||
        !get_int(req, "top_k", 0, 1 << 30, &top_k, r) ||
        !get_int(req, "seed", 0, 9.2e18, &seed, r) ||
        !get_int(req, "n", 1, 16, &n, r) ||
        !get_int(req, "max_tokens", 1, 1e15, &max_tokens, r) ||
        !get_int(req, "max_completion_tokens", 1, 1e15, &max_tokens, r) ||
        !get_number(req, "presence_penalty", 0.0, 0.0, &presence, r) ||
        !get_number(req, "frequency_penalty", 0.0, 0.0, &frequency, r) ||
        !get_bool(req, "stream", &j->stream, r) || !get_bool(req, "ignore_eos", &ignore_eos, r) ||
        !read_logprobs(j, req, r))
        return false;
    if (top_p <= 0.0) {
        serve_error(r, 400, "invalid_request_error", NULL, "'top_p' must be above 0");
        return false;
    }
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(req, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) {
            serve_error(r, 400, "invalid_request_error", NULL,
                        "'stream_options' must be an object");
            return false;
        }
        if (!get_bool(so, "include_usage", &j->include_usage, r))
            return false;
    }
    /* stop: a string or up to BN_MAX_STOP_STRINGS non-empty strings. */
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(req, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        const int ns = cJSON_IsArray(stop) ? cJSON_GetArraySize(stop) : 1;
        bool ok = (cJSON_IsString(stop) || cJSON_IsArray(stop)) && ns <= BN_MAX_STOP_STRINGS;
        for (int i = 0; ok && i < ns; i++) {
            const cJSON *e = cJSON_IsArray(stop) ? cJSON_GetArrayItem(stop, i) : stop;
            ok = cJSON_IsString(e) && e->valuestring[0] &&
                 (j->stops[i] = strdup(e->valuestring)) != NULL;
            p->stop[i] = j->stops[i];
        }
        if (!ok) {
            serve_error(r, 400, "invalid_request_error", NULL,
                        "'stop' must be a non-empty string or an array of up to %d of them",
                        BN_MAX_STOP_STRINGS);
            return false;
        }
    }
    j->n_choices = (int)n;
    j->seeded = seed >= 0;
    p->temperature = (float)temperature;
    p->top_p = (float)top_p;
    p->min_p = (float)min_p;
    p->top_k = (int)top_k;
    p->repeat_penalty = (float)repeat_penalty;
    p->ignore_eog = ignore_eos; /* llama-server's field: generate max_tokens (benchmarks) */
    p->seed = seed >= 0 ? (uint64_t)seed
                        : (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^
                              atomic_fetch_add(&s->next_id, 1);
    p->max_tokens = (int)(max_tokens < room ? max_tokens : room); /* capped by the context */
    p->prompt_tokens = j->prompt;
    p->n_prompt_tokens = j->n_prompt;
    return true;
}

/* Whether the request names this server's model (or none). */
static bool model_matches(server *s, const cJSON *req, serve_reply *r)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (!m || cJSON_IsNull(m))
        return true;
    if (!cJSON_IsString(m)) {
        serve_error(r, 400, "invalid_request_error", NULL, "'model' must be a string");
        return false;
    }
    if (strcmp(m->valuestring, s->model_id) != 0) {
        serve_error(r, 404, "invalid_request_error", "model_not_found",
                    "the model '%s' does not exist; this server has '%s'", m->valuestring,
                    s->model_id);
        return false;
    }
    return true;
}

static cJSON *whole_answer(serve_job *j)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", j->chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->s->model_id);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int k = 0; k < j->n_choices; k++) {
        serve_job *q = j->choices[k];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, c);
        cJSON_AddNumberToObject(c, "index", k);
        if (q->chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", q->text ? q->text : "");
        } else {
            cJSON_AddStringToObject(c, "text", q->text ? q->text : "");
        }
        if (q->logprobs >= 0)
            cJSON_AddItemToObject(c, "logprobs", take_logprobs(q));
        else
            cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", finish_reason(q));
    }
    cJSON_AddItemToObject(o, "usage", usage(j));
    return o;
}

/* Choice k > 0 of the request j: j's prompt and sampling, its own
 * session, seed + k where the request gave a seed (another random one
 * where not). NULL when there is no memory. */
static serve_job *make_choice(serve_job *j, int k)
{
    serve_job *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->s = j->s;
    c->chat = j->chat;
    c->stream = j->stream;
    c->index = k;
    c->carrier = j;
    c->created = j->created;
    c->logprobs = j->logprobs;
    memcpy(c->id, j->id, sizeof c->id);
    c->params = j->params;
    c->prompt = malloc((j->n_prompt ? j->n_prompt : 1) * sizeof *c->prompt);
    bool ok = c->prompt != NULL;
    if (ok)
        memcpy(c->prompt, j->prompt, j->n_prompt * sizeof *c->prompt);
    c->n_prompt = j->n_prompt;
    c->params.prompt_tokens = c->prompt;
    for (int i = 0; i < BN_MAX_STOP_STRINGS && ok; i++) {
        c->params.stop[i] = NULL;
        if (j->stops[i])
            ok = (c->stops[i] = strdup(j->stops[i])) != NULL;
        c->params.stop[i] = c->stops[i];
    }
    if (ok && c->logprobs >= 0)
        ok = (c->lp_pending = cJSON_CreateArray()) != NULL;
    c->params.seed = j->seeded ? j->params.seed + (uint64_t)k
                               : j->params.seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(k + 1));
    bn_error err;
    if (ok)
        ok = bn_session_create(j->s->model, &c->session, &err) == BN_OK;
    if (!ok) {
        job_free(c);
        return NULL;
    }
    return c;
}

static void *choice_thread(void *arg)
{
    job_run(arg);
    return NULL;
}

void serve_completions(server *s, const char *body, size_t len, bool chat, serve_reply *r)
{
    cJSON *req = parse_object(body, len, r);
    if (!req)
        return;
    serve_job *j = calloc(1, sizeof *j);
    if (!j) {
        cJSON_Delete(req);
        serve_error(r, 500, "server_error", NULL, "out of memory");
        return;
    }
    j->s = s;
    j->chat = chat;
    j->carrier = j;
    j->created = (int64_t)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%llu", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    atomic_fetch_add(&s->in_flight, 1);
    const bool ok = model_matches(s, req, r) &&
                    (chat ? chat_prompt(s, j, req, r) : completion_prompt(s, j, req, r)) &&
                    read_sampling(s, j, req, r);
    cJSON_Delete(req);
    bn_error err;
    if (ok && bn_session_create(s->model, &j->session, &err) != BN_OK)
        serve_error(r, 503, "server_error", NULL, "%s", err.message);
    /* The other choices, each counted as a request waiting or running. */
    const int n = ok && j->session ? j->n_choices : 0;
    j->choices = calloc((size_t)(n > 0 ? n : 1), sizeof *j->choices);
    j->n_choices = 0;
    if (j->choices && n > 0) {
        j->choices[j->n_choices++] = j;
        atomic_fetch_add(&s->in_flight, n - 1);
        for (int k = 1; k < n; k++) {
            serve_job *c = make_choice(j, k);
            if (!c) {
                atomic_fetch_sub(&s->in_flight, n - j->n_choices);
                serve_error(r, 503, "server_error", NULL, "no memory for %d choices", n);
                break;
            }
            j->choices[j->n_choices++] = c;
        }
    }
    if (!ok || !j->session || j->n_choices < n || !j->choices) {
        if (ok && j->session && !j->choices)
            serve_error(r, 500, "server_error", NULL, "out of memory");
        serve_job_release(j, NULL, NULL);
        return;
    }
    const double t0 = serve_now();
    pthread_mutex_lock(&s->lock);
    for (int k = 0; k < j->n_choices; k++) {
        serve_job *c = j->choices[k];
        c->t_start = t0;
        c->deadline = s->opt.timeout_s > 0.0 ? t0 + s->opt.timeout_s : 0.0;
        c->next = s->jobs;
        s->jobs = c;
    }
    pthread_mutex_unlock(&s->lock);
    if (j->stream) {
        pthread_mutex_init(&j->mu, NULL);
        pthread_cond_init(&j->cv, NULL);
        j->threaded = true;
        j->running = j->n_choices;
        int started = 0;
        for (int k = 0; k < j->n_choices; k++) {
            serve_job *c = j->choices[k];
            c->threaded = pthread_create(&c->thread, NULL, job_thread, c) == 0;
            started += c->threaded;
        }
        if (started < j->n_choices) { /* the started ones are cancelled and joined */
            pthread_mutex_lock(&j->mu);
            j->running -= j->n_choices - started;
            pthread_mutex_unlock(&j->mu);
            serve_job_release(j, NULL, NULL);
            serve_error(r, 503, "server_error", NULL, "could not start the request's threads");
            return;
        }
        r->status = 200;
        r->content_type = "text/event-stream";
        r->stream = j;
        return;
    }
    /* Whole answers: the other choices on threads of their own, so that
     * all of them are decoded together. */
    for (int k = 1; k < j->n_choices; k++) {
        serve_job *c = j->choices[k];
        c->threaded = pthread_create(&c->thread, NULL, choice_thread, c) == 0;
        if (!c->threaded)
            job_run(c);
    }
    job_run(j);
    for (int k = 1; k < j->n_choices; k++)
        if (j->choices[k]->threaded) {
            pthread_join(j->choices[k]->thread, NULL);
            j->choices[k]->threaded = false;
        }
    serve_job *failed = NULL, *late = NULL;
    for (int k = 0; k < j->n_choices; k++) {
        if (j->choices[k]->status != BN_OK && !failed)
            failed = j->choices[k];
        if (j->choices[k]->timed_out && !late)
            late = j->choices[k];
    }
    if (failed)
        serve_error(r, failed->status == BN_ERR_INVALID_ARGUMENT ? 400 : 500,
                    failed->status == BN_ERR_INVALID_ARGUMENT ? "invalid_request_error"
                                                              : "server_error",
                    NULL, "%s", failed->err.message);
    else if (late)
        serve_error(r, 504, "timeout", NULL, "the request took longer than the server's --timeout");
    else
        reply_json(r, 200, whole_answer(j));
    r->stream = NULL;
    serve_job_release(j, &r->tokens_in, &r->tokens_out);
}

/* ---- the other routes ----------------------------------------------------------------- */

void serve_models(server *s, const char *model, serve_reply *r)
{
    cJSON *card = cJSON_CreateObject();
    cJSON_AddStringToObject(card, "id", s->model_id);
    cJSON_AddStringToObject(card, "object", "model");
    cJSON_AddNumberToObject(card, "created", (double)s->started);
    cJSON_AddStringToObject(card, "owned_by", "bitnet");
    if (model) { /* GET /v1/models/{id} */
        if (strcmp(model, s->model_id) != 0) {
            cJSON_Delete(card);
            serve_error(r, 404, "invalid_request_error", "model_not_found",
                        "the model '%s' does not exist; this server has '%s'", model,
                        s->model_id);
            return;
        }
        reply_json(r, 200, card);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), card);
    reply_json(r, 200, o);
}

void serve_tokenize(server *s, const char *body, size_t len, serve_reply *r)
{
    cJSON *req = parse_object(body, len, r);
    if (!req)
        return;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(req, "content");
    bool add_special = false;
    if (!cJSON_IsString(content)) {
        serve_error(r, 400, "invalid_request_error", NULL, "'content' must be a string");
    } else if (get_bool(req, "add_special", &add_special, r)) {
        bn_error err;
        size_t n = 0;
        const size_t tlen = strlen(content->valuestring);
        int32_t *ids = NULL;
        bn_status st = bn_model_tokenize(s->model, content->valuestring, tlen, add_special, NULL,
                                         0, &n, &err);
        if (st == BN_OK && !(ids = malloc((n ? n : 1) * sizeof *ids)))
            st = BN_ERR_OUT_OF_MEMORY;
        if (st == BN_OK)
            st = bn_model_tokenize(s->model, content->valuestring, tlen, add_special, ids, n, &n,
                                   &err);
        if (st != BN_OK) {
            serve_error(r, 400, "invalid_request_error", NULL, "%s", err.message);
        } else {
            cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tokens");
            for (size_t i = 0; i < n; i++)
                cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
            reply_json(r, 200, o);
        }
        free(ids);
    }
    cJSON_Delete(req);
}

void serve_detokenize(server *s, const char *body, size_t len, serve_reply *r)
{
    cJSON *req = parse_object(body, len, r);
    if (!req)
        return;
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(req, "tokens");
    const int n = cJSON_IsArray(tokens) ? cJSON_GetArraySize(tokens) : -1;
    int32_t *ids = malloc(((size_t)(n > 0 ? n : 0) + 1) * sizeof *ids);
    bool ok = n >= 0 && ids;
    for (int i = 0; ok && i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(tokens, i);
        ok = cJSON_IsNumber(t) && t->valuedouble == floor(t->valuedouble) &&
             t->valuedouble >= 0 && t->valuedouble < s->info.vocab_size;
        if (ok)
            ids[i] = (int32_t)t->valuedouble;
    }
    if (!ok) {
        serve_error(r, 400, "invalid_request_error", NULL,
                    "'tokens' must be an array of token ids (0 to %d)",
                    (int)s->info.vocab_size - 1);
    } else {
        bn_error err;
        size_t tlen = 0;
        char *text = NULL;
        bn_status st = bn_model_detokenize(s->model, ids, (size_t)n, NULL, 0, &tlen, &err);
        if (st == BN_OK && !(text = malloc(tlen + 1)))
            st = BN_ERR_OUT_OF_MEMORY;
        if (st == BN_OK)
            st = bn_model_detokenize(s->model, ids, (size_t)n, text, tlen + 1, &tlen, &err);
        if (st != BN_OK) {
            serve_error(r, 400, "invalid_request_error", NULL, "could not detokenize");
        } else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "content", text);
            reply_json(r, 200, o);
        }
        free(text);
    }
    free(ids);
    cJSON_Delete(req);
}

void serve_health(server *s, serve_reply *r)
{
    cJSON *o = cJSON_CreateObject();
    const bool ready = atomic_load(&s->ready);
    cJSON_AddStringToObject(o, "status", ready ? "ok" : "loading");
    reply_json(r, ready ? 200 : 503, o);
}

void serve_metrics(server *s, serve_reply *r)
{
    char *out = NULL;
    size_t len = 0, cap = 0;
    char line[256];
#define LINE(...)                                                                        \
    do {                                                                                 \
        const int n_ = snprintf(line, sizeof line, __VA_ARGS__);                         \
        append(&out, &len, &cap, line, (size_t)n_ < sizeof line ? (size_t)n_ : 0);       \
    } while (0)
    LINE("# HELP bitnet_requests_total HTTP requests received.\n");
    LINE("# TYPE bitnet_requests_total counter\n");
    LINE("bitnet_requests_total %llu\n", (unsigned long long)atomic_load(&s->requests));
    LINE("# TYPE bitnet_responses_4xx_total counter\n");
    LINE("bitnet_responses_4xx_total %llu\n", (unsigned long long)atomic_load(&s->responses_4xx));
    LINE("# TYPE bitnet_responses_5xx_total counter\n");
    LINE("bitnet_responses_5xx_total %llu\n", (unsigned long long)atomic_load(&s->responses_5xx));
    LINE("# HELP bitnet_prompt_tokens_total Prompt tokens of finished generations.\n");
    LINE("# TYPE bitnet_prompt_tokens_total counter\n");
    LINE("bitnet_prompt_tokens_total %llu\n", (unsigned long long)atomic_load(&s->prompt_tokens));
    LINE("# TYPE bitnet_completion_tokens_total counter\n");
    LINE("bitnet_completion_tokens_total %llu\n",
         (unsigned long long)atomic_load(&s->completion_tokens));
    LINE("# HELP bitnet_client_disconnects_total Streams whose client left before the end.\n");
    LINE("# TYPE bitnet_client_disconnects_total counter\n");
    LINE("bitnet_client_disconnects_total %llu\n",
         (unsigned long long)atomic_load(&s->disconnects));
    const int in_flight = atomic_load(&s->in_flight), active = atomic_load(&s->active);
    LINE("# HELP bitnet_active_sequences Generations running now.\n");
    LINE("# TYPE bitnet_active_sequences gauge\n");
    LINE("bitnet_active_sequences %d\n", active);
    LINE("# HELP bitnet_queue_depth Generation requests admitted and not yet generating.\n");
    LINE("# TYPE bitnet_queue_depth gauge\n");
    LINE("bitnet_queue_depth %d\n", in_flight > active ? in_flight - active : 0);
    /* The paged cache's blocks, where the model batches: its statistics
     * wait for at most the forward pass running (without batching they
     * would wait for a whole generation). */
    bn_model_stats ms;
    bn_error err;
    if (s->opt.parallel > 1 && bn_model_get_stats(s->model, &ms, &err) == BN_OK &&
        ms.kv_blocks > 0) {
        LINE("# HELP bitnet_kv_blocks The paged KV cache's blocks: all, held by running "
             "sequences, kept for later prompts.\n");
        LINE("# TYPE bitnet_kv_blocks gauge\n");
        LINE("bitnet_kv_blocks{state=\"total\"} %d\n", (int)ms.kv_blocks);
        LINE("bitnet_kv_blocks{state=\"used\"} %d\n", (int)ms.kv_blocks_held);
        LINE("bitnet_kv_blocks{state=\"cached\"} %d\n", (int)ms.kv_blocks_cached);
        LINE("# HELP bitnet_scheduler_seconds_total The scheduler thread's time: in forward "
             "passes, and handing their tokens to the requests (the device waits then).\n");
        LINE("# TYPE bitnet_scheduler_seconds_total counter\n");
        LINE("bitnet_scheduler_seconds_total{part=\"forward\"} %.6f\n",
             ms.batch_forward_seconds);
        LINE("bitnet_scheduler_seconds_total{part=\"tokens\"} %.6f\n", ms.batch_token_seconds);
        LINE("# HELP bitnet_forward_passes_total Batched forward passes, and the rows they "
             "computed (tokens of prompts and generated tokens).\n");
        LINE("# TYPE bitnet_forward_passes_total counter\n");
        LINE("bitnet_forward_passes_total %llu\n", (unsigned long long)ms.batch_steps);
        LINE("# TYPE bitnet_forward_rows_total counter\n");
        LINE("bitnet_forward_rows_total %llu\n", (unsigned long long)ms.batch_rows);
    }
    pthread_mutex_lock(&s->lock);
    const double gen_seconds = s->gen_seconds, sum = s->ttft_sum;
    uint64_t counts[SERVE_TTFT_BUCKETS + 1];
    memcpy(counts, s->ttft_count, sizeof counts);
    pthread_mutex_unlock(&s->lock);
    LINE("# HELP bitnet_generation_tokens_per_second Generated tokens over generation time.\n");
    LINE("# TYPE bitnet_generation_tokens_per_second gauge\n");
    LINE("bitnet_generation_tokens_per_second %.3f\n",
         gen_seconds > 0.0 ? (double)atomic_load(&s->completion_tokens) / gen_seconds : 0.0);
    static const char *const le[SERVE_TTFT_BUCKETS] = {"0.01", "0.025", "0.05", "0.1", "0.25",
                                                       "0.5",  "1",     "2.5",  "5",   "10"};
    LINE("# HELP bitnet_time_to_first_token_seconds From a request's start to its first token.\n");
    LINE("# TYPE bitnet_time_to_first_token_seconds histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b <= SERVE_TTFT_BUCKETS; b++) {
        cum += counts[b];
        LINE("bitnet_time_to_first_token_seconds_bucket{le=\"%s\"} %llu\n",
             b < SERVE_TTFT_BUCKETS ? le[b] : "+Inf", (unsigned long long)cum);
    }
    LINE("bitnet_time_to_first_token_seconds_sum %.6f\n", sum);
    LINE("bitnet_time_to_first_token_seconds_count %llu\n", (unsigned long long)cum);
#undef LINE
    r->status = out ? 200 : 500;
    r->body = out;
    r->content_type = "text/plain; version=0.0.4";
}
