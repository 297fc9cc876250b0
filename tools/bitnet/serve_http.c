/* serve_http.c - the HTTP side of `bitnet serve` (serve.h), on
 * libmicrohttpd: a thread per connection, so a handler may block for a
 * whole generation and a stream's reader may wait for the next token.
 * Each request's body is gathered (up to --max-body), then routed; /v1
 * routes need the API key when one is set; generations beyond --parallel
 * + --max-queue are refused with 429. Every request ends with one log line
 * on stderr: method, path, status, tokens in + out, milliseconds. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve.h"

struct serve_http {
    struct MHD_Daemon *daemon;
};

/* One request: its route's inputs, its body as it arrives, what it
 * answered (for the log). */
typedef struct request {
    char method[8];
    char path[160];
    char *body;
    size_t len, cap;
    bool too_large;
    double t0;
    int status;
    size_t tokens_in, tokens_out;
    serve_job *stream;
} request;

/* Whether the Authorization header carries the API key: "Bearer KEY",
 * compared in time that depends on the lengths only. */
static bool authorized(const server *s, struct MHD_Connection *c)
{
    if (!s->opt.api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return false;
    const char *given = h + 7, *key = s->opt.api_key;
    const size_t gl = strlen(given), kl = strlen(key);
    unsigned char diff = (unsigned char)(gl != kl);
    for (size_t i = 0; i < kl; i++)
        diff |= (unsigned char)(key[i] ^ (i < gl ? given[i] : 0));
    return diff == 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    const size_t n = serve_job_read(cls, buf, max);
    return n ? (ssize_t)n : MHD_CONTENT_READER_END_OF_STREAM;
}

static enum MHD_Result send_reply(struct MHD_Connection *c, request *q, serve_reply *r)
{
    struct MHD_Response *resp;
    if (r->stream) {
        /* No free callback: the job is released when the request
         * completes (on_completed). */
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, r->stream,
                                                 NULL);
        q->stream = r->stream;
        if (resp) {
            MHD_add_response_header(resp, "Cache-Control", "no-cache");
            MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        }
    } else {
        const char *body = r->body ? r->body : "";
        resp = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                               MHD_RESPMEM_MUST_COPY);
    }
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type",
                            r->content_type ? r->content_type : "application/json");
    if (r->retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", r->retry_after);
        MHD_add_response_header(resp, "Retry-After", v);
    }
    if (r->status == 401)
        MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    q->status = r->status;
    q->tokens_in = r->tokens_in;
    q->tokens_out = r->tokens_out;
    const enum MHD_Result ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    free(r->body);
    return ret;
}

/* The route of a request whose body is complete. */
static void route(server *s, struct MHD_Connection *c, request *q, serve_reply *r)
{
    const bool get = strcmp(q->method, "GET") == 0, post = strcmp(q->method, "POST") == 0;
    const char *p = q->path;
    if (strcmp(p, "/health") == 0 && get) {
        serve_health(s, r);
        return;
    }
    if (strcmp(p, "/") == 0 && get) { /* the chat page */
        r->status = (r->body = strdup((const char *)serve_page)) ? 200 : 500;
        r->content_type = "text/html; charset=utf-8";
        return;
    }
    if (!atomic_load(&s->ready)) {
        serve_error(r, 503, "server_error", "loading", "the model is loading");
        r->retry_after = 1;
        return;
    }
    if (strcmp(p, "/metrics") == 0 && get) {
        serve_metrics(s, r);
        return;
    }
    const bool v1 = strncmp(p, "/v1/", 4) == 0;
    if (v1 && !authorized(s, c)) {
        serve_error(r, 401, "invalid_request_error", "invalid_api_key",
                    "a valid API key is needed: 'Authorization: Bearer KEY'");
        return;
    }
    if (q->too_large) {
        serve_error(r, 413, "invalid_request_error", NULL,
                    "the request body is larger than the server's limit of %zu bytes",
                    s->opt.max_body);
        return;
    }
    const bool completions = strcmp(p, "/v1/completions") == 0,
               chat = strcmp(p, "/v1/chat/completions") == 0;
    if ((completions || chat) && post) {
        if (atomic_load(&s->draining)) {
            serve_error(r, 503, "server_error", NULL, "the server is shutting down");
            return;
        }
        if (atomic_load(&s->in_flight) >= s->opt.parallel + s->opt.max_queue) {
            serve_error(r, 429, "rate_limit_error", NULL,
                        "%d requests are running or waiting, the server's limit; try again",
                        s->opt.parallel + s->opt.max_queue);
            r->retry_after = 1;
            return;
        }
        serve_completions(s, q->body, q->len, chat, r);
    } else if (strcmp(p, "/v1/models") == 0 && get) {
        serve_models(s, NULL, r);
    } else if (strncmp(p, "/v1/models/", 11) == 0 && get) {
        serve_models(s, p + 11, r);
    } else if (strcmp(p, "/tokenize") == 0 && post) {
        serve_tokenize(s, q->body, q->len, r);
    } else if (strcmp(p, "/detokenize") == 0 && post) {
        serve_detokenize(s, q->body, q->len, r);
    } else if (completions || chat || strcmp(p, "/v1/models") == 0 ||
               strcmp(p, "/tokenize") == 0 || strcmp(p, "/detokenize") == 0 ||
               strcmp(p, "/metrics") == 0) {
        serve_error(r, 405, "invalid_request_error", NULL, "%s does not take %s", p, q->method);
    } else {
        serve_error(r, 404, "invalid_request_error", NULL, "no route %s %s", q->method, p);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls)
{
    server *s = cls;
    (void)version;
    request *q = *con_cls;
    if (!q) { /* the headers: the request begins */
        q = calloc(1, sizeof *q);
        if (!q)
            return MHD_NO;
        snprintf(q->method, sizeof q->method, "%s", method);
        snprintf(q->path, sizeof q->path, "%s", url);
        q->t0 = serve_now();
        *con_cls = q;
        atomic_fetch_add(&s->requests, 1);
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        if (q->len + *upload_size > s->opt.max_body) {
            q->too_large = true;
        } else if (!q->too_large) {
            if (q->len + *upload_size + 1 > q->cap) {
                size_t cap = q->cap ? q->cap : 4096;
                while (cap < q->len + *upload_size + 1)
                    cap *= 2;
                char *b = realloc(q->body, cap);
                if (!b)
                    return MHD_NO;
                q->body = b;
                q->cap = cap;
            }
            memcpy(q->body + q->len, upload_data, *upload_size);
            q->len += *upload_size;
            q->body[q->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    serve_reply r;
    memset(&r, 0, sizeof r);
    route(s, c, q, &r);
    return send_reply(c, q, &r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    server *s = cls;
    (void)c;
    request *q = *con_cls;
    if (!q)
        return;
    if (q->stream) /* a client that left cancels its generation there */
        serve_job_release(q->stream, &q->tokens_in, &q->tokens_out);
    if (q->status >= 500)
        atomic_fetch_add(&s->responses_5xx, 1);
    else if (q->status >= 400)
        atomic_fetch_add(&s->responses_4xx, 1);
    fprintf(stderr, "%s %s %d %zu+%zu tokens %.0f ms%s\n", q->method, q->path, q->status,
            q->tokens_in, q->tokens_out, (serve_now() - q->t0) * 1e3,
            why == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection ended early)");
    free(q->body);
    free(q);
    *con_cls = NULL;
}

serve_http *serve_http_start(server *s, int *port, char *why, size_t why_size)
{
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
    memset(&v4, 0, sizeof v4);
    memset(&v6, 0, sizeof v6);
    const struct sockaddr *addr;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ITC;
    if (inet_pton(AF_INET, s->opt.host, &v4.sin_addr) == 1) {
        v4.sin_family = AF_INET;
        v4.sin_port = htons((uint16_t)s->opt.port);
        addr = (const struct sockaddr *)&v4;
    } else if (inet_pton(AF_INET6, s->opt.host, &v6.sin6_addr) == 1) {
        v6.sin6_family = AF_INET6;
        v6.sin6_port = htons((uint16_t)s->opt.port);
        addr = (const struct sockaddr *)&v6;
        flags |= MHD_USE_IPv6;
    } else {
        snprintf(why, why_size, "'%s' is not an IPv4 or IPv6 address", s->opt.host);
        return NULL;
    }
    serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    /* Connections: every running and waiting generation, and as many
     * again for the other routes. Idle connections close after a minute
     * (a handler that computes is not idle). */
    const unsigned limit = 2u * (unsigned)(s->opt.parallel + s->opt.max_queue) + 16u;
    h->daemon = MHD_start_daemon(flags, (uint16_t)s->opt.port, NULL, NULL, on_request, s,
                                 MHD_OPTION_SOCK_ADDR, addr, MHD_OPTION_NOTIFY_COMPLETED,
                                 on_completed, s, MHD_OPTION_CONNECTION_LIMIT, limit,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60, MHD_OPTION_END);
    if (!h->daemon) {
        snprintf(why, why_size, "could not listen on %s port %d (in use, or not allowed)",
                 s->opt.host, s->opt.port);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? (int)info->port : s->opt.port;
    return h;
}

void serve_http_quiesce(serve_http *h)
{
    if (h && h->daemon) {
        const MHD_socket fd = MHD_quiesce_daemon(h->daemon);
        if (fd != MHD_INVALID_SOCKET)
            close(fd);
    }
}

void serve_http_stop(serve_http *h)
{
    if (!h)
        return;
    if (h->daemon)
        MHD_stop_daemon(h->daemon);
    free(h);
}
