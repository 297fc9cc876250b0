/* serve.h - `bitnet serve`: an OpenAI-compatible HTTP server on the public
 * API (docs/SERVER.md). cmd_serve.c holds the options and the server's
 * lifetime (start, signals, draining); serve_http.c the HTTP side
 * (libmicrohttpd: requests, routes, authentication, streaming, the log);
 * serve_openai.c the OpenAI wire format (requests into generations, their
 * results into JSON). */
#ifndef BITNET_SERVE_H
#define BITNET_SERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli.h"

typedef struct serve_opts {
    const char *host;      /* address to bind (default 127.0.0.1)              */
    int port;              /* 0: any free port (printed)                        */
    int parallel;          /* sequences generated at once                       */
    int batch_tokens;      /* rows a shared pass takes at most; 0: the default  */
    int max_queue;         /* requests waiting beyond those                     */
    double timeout_s;      /* a request's limit, seconds; 0: none               */
    double grace_s;        /* SIGINT / SIGTERM: running requests may finish     */
    size_t max_body;       /* request body cap, bytes                           */
    const char *api_key;   /* NULL: /v1 routes open                             */
    const char *model;     /* NULL: BITNET_MODEL, else the shipped model         */
    cli_gen_opts gen;      /* device, threads, context, KV precision            */
} serve_opts;

/* Time to first token histogram buckets, seconds (and +Inf). */
#define SERVE_TTFT_BUCKETS 10

typedef struct serve_job serve_job;

/* Wakes the threads that send streams for the generation thread
 * (serve_wake.c says why). */
typedef struct serve_waker {
    pthread_t thread;
    bool running, sleeping, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* work, or stop                              */
    pthread_cond_t done;      /* a list signalled                           */
    serve_job **todo, **doing; /* posted; being signalled (no lock held)   */
    size_t n_todo, n_doing, cap;
} serve_waker;

/* Starts the thread; lists of `capacity` jobs (more at once are signalled
 * by their poster). false: no thread, every post returns false. */
bool serve_waker_start(serve_waker *w, size_t capacity);
void serve_waker_stop(serve_waker *w);
/* Queues j to be woken (serve_job_wake); false: the caller must wake it. */
bool serve_waker_post(serve_waker *w, serve_job *j);
/* Takes j off the lists, waiting while it is being woken: call before j's
 * mutex goes, once nothing posts j any more. */
void serve_waker_forget(serve_waker *w, serve_job *j);
/* Wakes j's reader (serve_openai.c): what the waker does to a job. */
void serve_job_wake(serve_job *j);

typedef struct server {
    serve_opts opt;
    bn_model *model;
    bn_model_info info;
    char model_id[128];       /* the name /v1/models gives                 */
    int64_t started;          /* unix seconds                               */
    atomic_bool ready;        /* the model is loaded                        */
    atomic_bool draining;     /* shutting down: no new generations          */
    atomic_int in_flight;     /* generation requests admitted, not ended    */
    atomic_int active;        /* of those, generating (not waiting a slot)  */
    atomic_ullong next_id;
    /* Metrics (GET /metrics). */
    atomic_ullong requests, responses_4xx, responses_5xx, prompt_tokens, completion_tokens,
        disconnects;
    pthread_mutex_t lock;     /* the running jobs and the histogram below   */
    serve_job *jobs;          /* running generations (cancelled on shutdown) */
    uint64_t ttft_count[SERVE_TTFT_BUCKETS + 1];
    double ttft_sum;
    double gen_seconds;       /* summed over finished generations           */
    serve_waker waker;        /* wakes stream readers for the scheduler     */
} server;

/* The chat page served at / (serve_page.html, embedded at build time). */
extern const unsigned char serve_page[];
extern const size_t serve_page_len;

/* Monotonic seconds (serve_openai.c): request times, deadlines, the log. */
double serve_now(void);

/* The HTTP server (serve_http.c). */
typedef struct serve_http serve_http;
/* Listens on opt.host:opt.port; *port receives the port bound. */
serve_http *serve_http_start(server *s, int *port, char *why, size_t why_size);
/* Stops accepting connections (the running ones go on). */
void serve_http_quiesce(serve_http *h);
void serve_http_stop(serve_http *h);

/* ---- the OpenAI wire format (serve_openai.c) ---------------------------------------------- */

/* A route's answer: an HTTP status and a JSON (or text) body, or a job
 * whose tokens stream as server-sent events. */
typedef struct serve_reply {
    int status;
    char *body;              /* malloc'd                                  */
    const char *content_type;
    int retry_after;         /* > 0: a Retry-After header                  */
    serve_job *stream;       /* stream: the body comes from the job        */
    size_t tokens_in, tokens_out; /* a generation's, for the log line       */
} serve_reply;

/* Route handlers: body[0, len) is the request's body (JSON). */
void serve_completions(server *s, const char *body, size_t len, bool chat, serve_reply *r);
void serve_models(server *s, const char *model, serve_reply *r);
void serve_tokenize(server *s, const char *body, size_t len, serve_reply *r);
void serve_detokenize(server *s, const char *body, size_t len, serve_reply *r);
void serve_health(server *s, serve_reply *r);
void serve_metrics(server *s, serve_reply *r);
/* An OpenAI error object: {"error": {"message", "type", "param", "code"}}. */
void serve_error(serve_reply *r, int status, const char *type, const char *code,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A streaming job: the next bytes of its events (blocking until some come,
 * at most about a second: then a keep-alive comment), 0 at the end. */
size_t serve_job_read(serve_job *j, char *buf, size_t max);
/* The client is gone or the response is done: stops the generation, waits
 * for it and frees the job; *in and *out (may be NULL) receive its tokens
 * in and out, for the log line. */
void serve_job_release(serve_job *j, size_t *in, size_t *out);
/* Cancels every running job (shutdown after the grace period). */
void serve_cancel_all(server *s);
/* Cancels the jobs past their --timeout (checked every second, so a
 * request waiting for a slot or computing a long prompt, which calls no
 * token callback, is stopped too). */
void serve_cancel_late(server *s);

#endif
