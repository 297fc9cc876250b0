/* bitnet chat: an interactive conversation with a chat model, built on the
 * public API of bitnet.h alone (bn_model, bn_session, bn_model_apply_chat).
 *
 * Messages are read one per line from stdin; each answer is streamed to
 * stdout as it is generated and followed by a newline; notes and errors go
 * to stderr. On a terminal a "> " prompt is shown.
 *
 * The conversation is the list of messages (the system message, then
 * user and assistant turns). For each message the whole list is formatted
 * with bn_model_apply_chat (the model's chat format) and given as the
 * prompt of an empty session. The model reuses the positions its cache
 * holds for the tokens the text shares with the last one computed
 * (normally everything up to the end of the last answer), so only the new
 * turn is computed; where the text of an answer tokenizes differently from
 * the tokens generated, the rest is recomputed. The conversation the model
 * sees is always exactly the formatted text, the same tokens `bitnet run -p
 * TEXT` reads.
 *
 * Ctrl-C (SIGINT) is taken by a watcher thread with sigwait(), not by a
 * signal handler: SIGINT is blocked in every thread (it is blocked before
 * the model is loaded, so the library's threads inherit the mask) and the
 * watcher, an ordinary thread, may call anything. While an answer is being
 * generated it calls bn_session_cancel (callable from any thread at any
 * time, bitnet.h) and sets a flag that makes the token callback return
 * false, which also covers a Ctrl-C that comes before the generation has
 * started (a cancel is forgotten when nothing runs). At the prompt it
 * wakes the input reader through a pipe. While the model loads, Ctrl-C
 * ends the program as usual.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define CMD "chat"
#define DEFAULT_MAX_TOKENS 512
/* A message line longer than this is refused (a context holds far fewer
 * tokens); it bounds the memory /dev/zero or a runaway pipe can take. */
#define MAX_LINE_BYTES ((size_t)64 << 20)

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet chat [-m MODEL] [--system TEXT] [options]\n"
            "\n"
            "An interactive conversation with a chat model. Type a message and press Enter:\n"
            "the answer is written as it is generated; the whole conversation is the context\n"
            "of each answer. Messages are read one per line from stdin (a terminal shows a\n"
            "\"> \" prompt); each answer goes to stdout followed by a newline; notes and errors\n"
            "go to stderr. The model must have a chat format (BitNet b1.58 2B-4T's:\n"
            "<|begin_of_text|>System: ...<|eot_id|>User: ...<|eot_id|>Assistant: ...).\n"
            "\n"
            "  -m, --model MODEL      GGUF file or Hugging Face model directory (default:\n"
            "                         BITNET_MODEL, else the small model shipped with bitnet,\n"
            "                         bitnet-kjv-7m)\n"
            "      --system TEXT      system message, kept by /reset\n"
            "  -n, --max-tokens N     tokens per answer at most (default %d); an answer also\n"
            "                         stops at an end-of-generation token\n"
            "\n"
            "sampling (as bitnet run; order: repeat penalty, top-k, temperature, top-p, min-p):\n"
            "      --temp T           temperature (default 0.8); 0 = greedy\n"
            "      --top-k K          keep the K most likely tokens (default 40; 0 = off)\n"
            "      --top-p P          keep the smallest set with probability >= P (default 0.95;\n"
            "                         1 = off)\n"
            "      --min-p P          drop tokens below P x the top probability (default 0.05;\n"
            "                         0 = off)\n"
            "      --repeat-penalty R penalise tokens seen in the last --repeat-last-n tokens\n"
            "                         (default 1.0 = off)\n"
            "      --repeat-last-n N  tokens the penalty looks back (default 64; -1 = all)\n"
            "      --seed S           seed of a conversation's first answer; answer i uses S + i\n"
            "                         (default: BITNET_SEED, 0 under BITNET_DETERMINISTIC=1,\n"
            "                         else random)\n"
            "\n"
            "engine:\n"
            "      --device D         auto, cpu, gpu, cuda[:N], vulkan[:N] (default:\n"
            "                         BITNET_DEVICE, else auto)\n"
            "      --threads N        CPU threads (default: BITNET_NUM_THREADS, else every core)\n"
            "      --ctx N            positions the conversation may take (default: the model's\n"
            "                         training context)\n"
            "      --kv f32|f16|fp8   CUDA KV cache precision (default f32; a conversation\n"
            "                         is one sequence: fp8 runs it over f16)\n"
            "      --tensor-parallel N  split the model across N CUDA GPUs (NCCL): --device\n"
            "                         cuda:0,1 names them, cuda takes the first N; requests\n"
            "                         then run one at a time\n"
            "      --verbose          model details and each answer's timings on stderr\n"
            "      --help             show this help\n"
            "\n"
            "commands (a line that starts with /):\n"
            "  /reset         start a new conversation (the system message stays)\n"
            "  /help          list the commands\n"
            "  /exit, /quit   leave (as end of input, Ctrl-D on a terminal, does)\n"
            "  A message that starts with / is sent by doubling the /: //etc sends /etc.\n"
            "\n"
            "Ctrl-C stops the answer being written (the conversation keeps what was\n"
            "written) and returns to the prompt; at the prompt, Ctrl-C discards the line\n"
            "typed and a second Ctrl-C in a row leaves. When a message no longer fits the\n"
            "context with the conversation before it, it is refused with a note: /reset\n"
            "starts a new conversation.\n"
            "\n"
            "exit codes: 0 when the user leaves (/exit, end of input, Ctrl-C at the prompt),\n"
            "2 bad command line, 4 device unusable, 5 a model that cannot be read, is\n"
            "malformed or has no chat format, 6 out of memory, 1 another failure.\n",
            DEFAULT_MAX_TOKENS);
}

static const char help_text[] =
    "/reset         start a new conversation (the system message stays)\n"
    "/help          this list\n"
    "/exit, /quit   leave (also end of input: Ctrl-D on a terminal)\n"
    "//text         send a message that starts with /: /text\n"
    "Ctrl-C stops an answer; at the prompt, two Ctrl-C in a row leave.\n";

typedef struct chat_opts {
    const char *model, *system;
    long long max_tokens;
    bool verbose;
    cli_gen_opts gen;      /* sampling and engine options shared with run */
    bn_generate_params gp; /* gen's sampling, as bn_session_generate takes it */
} chat_opts;

/* 0 = parsed, -1 = --help printed, otherwise the exit code to return. */
static int parse(int argc, char **argv, chat_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_tokens = DEFAULT_MAX_TOKENS;
    cli_gen_defaults(&o->gen); /* bitnet run's sampling defaults */

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        const int shared = cli_gen_option(argc, argv, &i, CMD, &o->gen);
        if (shared < 0)
            return BN_EXIT_USAGE;
        if (shared > 0)
            continue;
#define VALUE()                                                                                    \
    do {                                                                                           \
        if (!(v = cli_value(argc, argv, &i, CMD)))                                                 \
            return BN_EXIT_USAGE;                                                                  \
    } while (0)
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        } else if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) {
            VALUE();
            o->model = v;
        } else if (strcmp(a, "--system") == 0) {
            VALUE();
            o->system = v;
        } else if (strcmp(a, "-n") == 0 || strcmp(a, "--max-tokens") == 0) {
            VALUE();
            if (!cli_parse_i64(CMD, a, v, 1, 1 << 24, &o->max_tokens))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
            o->verbose = true;
        } else {
            fprintf(stderr, "bitnet chat: error: unknown option '%s'\n", a);
            usage(stderr);
            return BN_EXIT_USAGE;
        }
#undef VALUE
    }
    cli_gen_params(&o->gen, &o->gp);
    return 0;
}

/* ---- Ctrl-C ------------------------------------------------------------------
 * See the comment at the top: a watcher thread takes SIGINT with sigwait();
 * `phase` says what a Ctrl-C means now. The lock orders the watcher's
 * reading of phase and session against the main thread's changes, so a
 * Ctrl-C is acted on for the answer (or prompt) it came during. */

enum { PHASE_LOADING, PHASE_IDLE, PHASE_ANSWERING, PHASE_DONE };

static struct {
    pthread_mutex_t lock;
    int phase;
    bn_session *session;   /* the session answering (PHASE_ANSWERING)        */
    int wake_fd;           /* write end of the pipe the prompt waits on      */
    atomic_bool stop;      /* stop the current answer (read by the callback) */
    sigset_t sigint;       /* {SIGINT}                                       */
} g_int = {.lock = PTHREAD_MUTEX_INITIALIZER, .phase = PHASE_LOADING, .wake_fd = -1};

static void set_phase(int phase, bn_session *s)
{
    pthread_mutex_lock(&g_int.lock);
    g_int.phase = phase;
    g_int.session = s;
    if (phase == PHASE_ANSWERING)
        atomic_store(&g_int.stop, false);
    pthread_mutex_unlock(&g_int.lock);
}

/* Ends the program as an unhandled Ctrl-C does (killed by SIGINT). */
static void die_by_sigint(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    pthread_sigmask(SIG_UNBLOCK, &g_int.sigint, NULL);
    raise(SIGINT);
    _exit(130);
}

static void *sigint_watcher(void *arg)
{
    (void)arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&g_int.sigint, &sig) != 0)
            continue;
        pthread_mutex_lock(&g_int.lock);
        const int phase = g_int.phase;
        if (phase == PHASE_ANSWERING) {
            atomic_store(&g_int.stop, true);
            bn_session_cancel(g_int.session);
        } else if (phase == PHASE_IDLE && g_int.wake_fd >= 0) {
            /* Non-blocking: when the pipe is full a wake-up is pending anyway. */
            ssize_t w = write(g_int.wake_fd, "i", 1);
            (void)w;
        }
        pthread_mutex_unlock(&g_int.lock);
        if (phase == PHASE_LOADING)
            die_by_sigint();
        if (phase == PHASE_DONE)
            return NULL;
    }
}

typedef struct interrupts {
    bool watching;  /* the watcher thread runs */
    pthread_t thread;
    int pipe_fd[2]; /* [0]: the prompt polls it; [1]: the watcher writes */
} interrupts;

/* Blocks SIGINT in this thread (and so in every thread created after) and
 * starts the watcher. Without a thread or a pipe, Ctrl-C keeps its default
 * action (it ends the program) and everything else works. */
static void interrupts_start(interrupts *in)
{
    in->watching = false;
    in->pipe_fd[0] = in->pipe_fd[1] = -1;
    sigemptyset(&g_int.sigint);
    sigaddset(&g_int.sigint, SIGINT);
    if (pipe(in->pipe_fd) != 0) {
        in->pipe_fd[0] = in->pipe_fd[1] = -1;
        bn_log(BN_LOG_WARN, "no pipe for Ctrl-C (%s): Ctrl-C ends the program", strerror(errno));
        return;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(in->pipe_fd[i], F_SETFL, fcntl(in->pipe_fd[i], F_GETFL) | O_NONBLOCK);
        fcntl(in->pipe_fd[i], F_SETFD, FD_CLOEXEC);
    }
    g_int.wake_fd = in->pipe_fd[1];
    pthread_sigmask(SIG_BLOCK, &g_int.sigint, NULL);
    const int rc = pthread_create(&in->thread, NULL, sigint_watcher, NULL);
    if (rc != 0) {
        pthread_sigmask(SIG_UNBLOCK, &g_int.sigint, NULL);
        bn_log(BN_LOG_WARN, "no thread for Ctrl-C (%s): Ctrl-C ends the program", strerror(rc));
        return;
    }
    in->watching = true;
}

static void interrupts_stop(interrupts *in)
{
    set_phase(PHASE_DONE, NULL);
    if (in->watching) {
        pthread_kill(in->thread, SIGINT); /* taken by its sigwait: it returns */
        pthread_join(in->thread, NULL);
        in->watching = false;
    }
    pthread_mutex_lock(&g_int.lock);
    g_int.wake_fd = -1;
    pthread_mutex_unlock(&g_int.lock);
    for (int i = 0; i < 2; i++)
        if (in->pipe_fd[i] >= 0)
            close(in->pipe_fd[i]);
}

/* ---- reading lines ------------------------------------------------------------ */

enum { READ_LINE, READ_EOF, READ_INTERRUPT, READ_TOO_LONG, READ_ERROR };

typedef struct line_reader {
    int fd;
    char *buf;
    size_t len, cap;  /* bytes in buf */
    size_t consumed;  /* of them, the line returned last and its newline */
    bool eof, skipping; /* skipping: the rest of a line over MAX_LINE_BYTES */
} line_reader;

/* The next line from r->fd, without its newline (and a '\r' before it),
 * NUL-terminated in *line (valid until the next call), its length in *n.
 * A Ctrl-C (a byte on wake_fd) while waiting discards what was typed and
 * returns READ_INTERRUPT; a last line without a newline is still a line. */
static int read_line(line_reader *r, int wake_fd, char **line, size_t *n)
{
    if (r->consumed) {
        memmove(r->buf, r->buf + r->consumed, r->len - r->consumed);
        r->len -= r->consumed;
        r->consumed = 0;
    }
    size_t scanned = 0;
    for (;;) {
        char *nl = r->len > scanned ? memchr(r->buf + scanned, '\n', r->len - scanned) : NULL;
        if (r->skipping && (nl || r->eof)) {
            r->consumed = nl ? (size_t)(nl - r->buf) + 1 : r->len;
            r->skipping = false;
            return READ_TOO_LONG;
        }
        if (!r->skipping && (nl || (r->eof && r->len > 0))) {
            size_t end = nl ? (size_t)(nl - r->buf) : r->len;
            r->consumed = nl ? end + 1 : r->len;
            if (end > 0 && r->buf[end - 1] == '\r')
                end--;
            r->buf[end] = '\0'; /* in the buffer: cap > len always */
            *line = r->buf;
            *n = end;
            return READ_LINE;
        }
        if (r->eof)
            return READ_EOF;
        if (r->len >= MAX_LINE_BYTES) {
            r->skipping = true; /* keep reading to the newline, storing nothing */
            r->len = 0;
        }
        scanned = r->len;

        struct pollfd p[2] = {{.fd = r->fd, .events = POLLIN}, {.fd = wake_fd, .events = POLLIN}};
        const int k = poll(p, wake_fd >= 0 ? 2 : 1, -1);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return READ_ERROR;
        }
        if (wake_fd >= 0 && (p[1].revents & POLLIN)) {
            char drain[64];
            while (read(wake_fd, drain, sizeof drain) > 0) {
            }
            r->len = 0; /* as the terminal discards the line typed */
            r->skipping = false;
            return READ_INTERRUPT;
        }
        if (p[0].revents & POLLNVAL) {
            r->eof = true; /* no stdin at all */
            continue;
        }
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        if (r->cap - r->len < 4096 + 1) {
            const size_t cap = r->cap ? r->cap * 2 : 65536;
            char *b = realloc(r->buf, cap);
            if (!b)
                return READ_ERROR;
            r->buf = b;
            r->cap = cap;
        }
        const ssize_t got = read(r->fd, r->buf + r->len, r->cap - r->len - 1);
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return READ_ERROR;
        }
        if (got == 0)
            r->eof = true;
        else
            r->len += (size_t)got;
    }
}

/* ---- the conversation ------------------------------------------------------------ */

typedef struct chat {
    const chat_opts *o;
    bn_model *model;
    bn_session *session;
    bn_model_info info;
    bn_chat_message *msgs; /* contents malloc'ed; the system message first when given */
    size_t n_msgs, cap_msgs, n_fixed;
    int answers;           /* answers in this conversation: the seed's offset */
    uint64_t seed;
    /* the answer being streamed */
    char *text;
    size_t len, cap;
    bool text_oom;
} chat;

static bool push_message(chat *c, const char *role, const char *content, size_t len)
{
    if (c->n_msgs == c->cap_msgs) {
        const size_t cap = c->cap_msgs ? c->cap_msgs * 2 : 16;
        bn_chat_message *m = realloc(c->msgs, cap * sizeof *m);
        if (!m)
            return false;
        c->msgs = m;
        c->cap_msgs = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return false;
    memcpy(copy, content, len);
    copy[len] = '\0';
    c->msgs[c->n_msgs++] = (bn_chat_message){.role = role, .content = copy};
    return true;
}

static void pop_message(chat *c)
{
    if (c->n_msgs > c->n_fixed)
        free((char *)c->msgs[--c->n_msgs].content);
}

/* A new conversation: the system message only, an empty session. */
static void reset_conversation(chat *c)
{
    while (c->n_msgs > c->n_fixed)
        pop_message(c);
    bn_session_reset(c->session);
    c->answers = 0;
}

/* Streams each piece of the answer to stdout and keeps it for the
 * conversation; false (stop) after a Ctrl-C. */
static bool on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)token;
    chat *c = user;
    if (len > 0) {
        fwrite(text, 1, len, stdout);
        fflush(stdout); /* stream: the reader sees each word as it comes */
        if (c->len + len + 1 > c->cap) {
            size_t cap = c->cap ? c->cap : 4096;
            while (cap < c->len + len + 1)
                cap *= 2;
            char *t = realloc(c->text, cap);
            if (!t) {
                c->text_oom = true;
                return false;
            }
            c->text = t;
            c->cap = cap;
        }
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = '\0';
    }
    return !atomic_load(&g_int.stop);
}

/* The conversation's text in the chat format, ending with the opening of
 * the assistant's turn (malloc'ed, NUL-terminated). */
static char *format_conversation(chat *c, size_t *len, bn_error *err)
{
    if (bn_model_apply_chat(c->model, c->msgs, c->n_msgs, true, NULL, 0, len, err) != BN_OK)
        return NULL;
    char *text = malloc(*len + 1);
    if (!text) {
        bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the conversation's text");
        return NULL;
    }
    if (bn_model_apply_chat(c->model, c->msgs, c->n_msgs, true, text, *len + 1, len, err) !=
        BN_OK) {
        free(text);
        return NULL;
    }
    return text;
}

/* An error during the conversation: printed; a refused request
 * (BN_ERR_INVALID_ARGUMENT) leaves the conversation as it was and the chat
 * goes on (0), anything else ends it with its exit code. */
static int conversation_error(const bn_error *err)
{
    const int code = cli_fail(err);
    return err->status == BN_ERR_INVALID_ARGUMENT ? 0 : code;
}

/* One user message: formats, generates and streams the answer. 0 to go
 * on, else the exit code to end with. Runs in PHASE_ANSWERING (answer()). */
static int answer_message(chat *c, const char *message, size_t len)
{
    const chat_opts *o = c->o;
    bn_error err;
    bn_error_clear(&err);
    if (!push_message(c, "user", message, len)) {
        fprintf(stderr, "bitnet: error: out of memory for the message\n");
        return BN_EXIT_OUT_OF_MEMORY;
    }
    /* The whole conversation is the prompt of an empty session: the model
     * reuses the positions its cache holds for the turns before (the
     * common prefix), so only the new turn is computed, and the model
     * sees exactly the formatted text. Its token count (BOS as the
     * session adds it) decides whether it fits. */
    size_t text_len = 0, n_tokens = 0;
    char *text = format_conversation(c, &text_len, &err);
    if (!text ||
        bn_model_tokenize(c->model, text, text_len, true, NULL, 0, &n_tokens, &err) != BN_OK) {
        free(text);
        pop_message(c);
        return conversation_error(&err);
    }

    const int64_t n_ctx = c->info.n_ctx;
    if ((int64_t)n_tokens >= n_ctx) {
        /* One position at least must stay for the answer. */
        const bool first = c->n_msgs == c->n_fixed + 1;
        if (first)
            fprintf(stderr,
                    "bitnet chat: this message does not fit the context: formatted, it takes "
                    "%zu tokens, and the context holds %lld positions, one of them at least "
                    "for the answer\n"
                    "bitnet chat: hint: send a shorter message, or start bitnet chat with a "
                    "larger --ctx (the model was trained for %lld)\n",
                    n_tokens, (long long)n_ctx, (long long)c->info.n_ctx_train);
        else
            fprintf(stderr,
                    "bitnet chat: the conversation no longer fits the context: with this "
                    "message it takes %zu tokens, and the context holds %lld positions, one of "
                    "them at least for the answer; the message was not sent\n"
                    "bitnet chat: hint: /reset starts a new conversation (or a shorter message "
                    "may still fit)\n",
                    n_tokens, (long long)n_ctx);
        free(text);
        pop_message(c);
        return 0;
    }

    const long long room = (long long)(n_ctx - (int64_t)n_tokens);
    const bool context_bound = room < o->max_tokens;
    bn_generate_params p = o->gp;
    p.prompt = text;
    p.prompt_tokens = NULL;
    p.n_prompt_tokens = 0;
    p.max_tokens = (int)(context_bound ? room : o->max_tokens);
    p.seed = c->seed + (uint64_t)c->answers;

    if (atomic_load(&g_int.stop)) { /* Ctrl-C while the message was prepared */
        free(text);
        pop_message(c);
        fprintf(stderr, "[answer stopped]\n");
        return 0;
    }
    c->len = 0;
    c->text_oom = false;
    bn_generate_result res;
    bn_session_reset(c->session);
    bn_status st = bn_session_generate(c->session, &p, on_token, c, &res, &err);
    free(text);
    /* Each answer ends its line, so answers stay apart in a file or pipe. */
    fputc('\n', stdout);
    fflush(stdout);
    if (st == BN_OK && c->text_oom)
        st = bn_error_set(&err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the answer");
    if (st != BN_OK) {
        pop_message(c); /* no answer: the next message is formatted without this one */
        return conversation_error(&err);
    }
    if (!push_message(c, "assistant", c->len ? c->text : "", c->len)) {
        fprintf(stderr, "bitnet: error: out of memory for the answer\n");
        return BN_EXIT_OUT_OF_MEMORY;
    }
    c->answers++;

    if (o->verbose)
        fprintf(stderr,
                "[prompt %zu tokens (%zu of the conversation's %zu positions cached) in %.3f s; "
                "answer %zu tokens in %.3f s (%.1f tok/s)]\n",
                res.n_prompt_tokens - res.n_cached, res.n_cached, res.n_prompt_tokens,
                res.prompt_seconds, res.n_tokens,
                res.generate_seconds,
                res.generate_seconds > 0 ? (double)res.n_tokens / res.generate_seconds : 0.0);
    if (res.stop == BN_STOP_CANCELLED || res.stop == BN_STOP_CALLBACK)
        fprintf(stderr, "[answer stopped]\n");
    else if (res.stop == BN_STOP_MAX_TOKENS && context_bound)
        fprintf(stderr,
                "[the context is full (%lld positions): the answer was cut there; /reset starts "
                "a new conversation]\n",
                (long long)n_ctx);
    else if (res.stop == BN_STOP_MAX_TOKENS)
        fprintf(stderr, "[answer cut at %lld tokens: -n sets the limit]\n", o->max_tokens);
    return 0;
}

/* A Ctrl-C from the moment the message is read stops its answer. */
static int answer(chat *c, const char *message, size_t len)
{
    set_phase(PHASE_ANSWERING, c->session);
    const int rc = answer_message(c, message, len);
    set_phase(PHASE_IDLE, NULL);
    return rc;
}

/* What the model lacks for chatting: BN_ERR_UNSUPPORTED from
 * bn_model_apply_chat for a model without a chat format. */
static int no_chat_format(chat *c)
{
    bn_error err;
    bn_error_clear(&err);
    size_t len = 0;
    if (bn_model_apply_chat(c->model, NULL, 0, true, NULL, 0, &len, &err) == BN_OK)
        bn_error_set(&err, BN_ERR_UNSUPPORTED, NULL, "this model has no chat format");
    bn_error e2;
    bn_error_set(&e2, err.status,
                 "bitnet chat needs a model with a chat format; bitnet run -p TEXT generates "
                 "from plain text with this one",
                 "%s: %s", c->info.path, err.message);
    return cli_fail(&e2);
}

static void print_banner(const chat *c, bool interactive, bool seed_fixed)
{
    const bn_model_info *i = &c->info;
    fprintf(stderr, "bitnet chat: %s on %s (%s), chat format %s, context %lld positions\n",
            i->path, i->device, i->device_name, i->chat_template, (long long)i->n_ctx);
    if (c->o->verbose)
        fprintf(stderr,
                "model: %s, %d layers, dim %d, ffn %d, heads %d/%d, vocab %d, %llu parameters, "
                "trained context %lld; seed %llu%s\n",
                i->architecture, i->n_layer, i->dim, i->ffn_dim, i->n_head, i->n_head_kv,
                (int)i->vocab_size, (unsigned long long)i->n_params, (long long)i->n_ctx_train,
                (unsigned long long)c->seed, seed_fixed ? "" : " (random)");
    if (interactive)
        fprintf(stderr, "Type a message and press Enter. /help lists the commands; Ctrl-C stops "
                        "an answer; /exit or Ctrl-D leaves.\n");
}

/* The line is a command (starts with one '/'): runs it. 1 = go on, 0 =
 * leave. */
static int run_command(chat *c, const char *line)
{
    const char *cmd = line + 1;
    size_t k = strcspn(cmd, " \t");
    const char *rest = cmd + k + strspn(cmd + k, " \t");
    if (*rest) {
        fprintf(stderr, "bitnet chat: /%.*s takes no argument; /help lists the commands\n",
                (int)k, cmd);
        return 1;
    }
    if ((k == 4 && strncmp(cmd, "exit", 4) == 0) || (k == 4 && strncmp(cmd, "quit", 4) == 0))
        return 0;
    if (k == 5 && strncmp(cmd, "reset", 5) == 0) {
        reset_conversation(c);
        fprintf(stderr, "[new conversation]\n");
    } else if (k == 4 && strncmp(cmd, "help", 4) == 0) {
        fputs(help_text, stdout);
        fflush(stdout);
    } else {
        fprintf(stderr, "bitnet chat: unknown command '/%.*s'; /help lists the commands (//%.*s "
                        "sends '/%.*s' as a message)\n",
                (int)k, cmd, (int)k, cmd, (int)k, cmd);
    }
    return 1;
}

static int chat_loop(chat *c, int wake_fd)
{
    const bool interactive = isatty(STDIN_FILENO);
    /* The prompt goes where the person typing sees it. */
    FILE *marker = !interactive                ? NULL
                   : isatty(STDOUT_FILENO)     ? stdout
                   : isatty(STDERR_FILENO)     ? stderr
                                               : NULL;
    line_reader r = {.fd = STDIN_FILENO};
    int interrupts_in_a_row = 0;
    int rc = BN_EXIT_OK;
    for (;;) {
        if (marker) {
            fputs("> ", marker);
            fflush(marker);
        }
        char *line = NULL;
        size_t len = 0;
        const int got = read_line(&r, wake_fd, &line, &len);
        if (got == READ_EOF) {
            if (marker)
                fputc('\n', marker); /* the shell's prompt on a line of its own */
            break;
        }
        if (got == READ_INTERRUPT) {
            if (marker)
                fputc('\n', marker);
            if (++interrupts_in_a_row >= 2)
                break;
            fprintf(stderr, "[Ctrl-C again, /exit or Ctrl-D leaves]\n");
            continue;
        }
        interrupts_in_a_row = 0;
        if (got == READ_ERROR) {
            fprintf(stderr, "bitnet: error: cannot read the input: %s\n", strerror(errno));
            rc = BN_EXIT_FAILURE;
            break;
        }
        if (got == READ_TOO_LONG) {
            fprintf(stderr, "bitnet chat: a message of more than %zu MiB was not sent\n",
                    MAX_LINE_BYTES >> 20);
            continue;
        }
        if (memchr(line, '\0', len)) {
            fprintf(stderr, "bitnet chat: a message holding a NUL byte was not sent; messages "
                            "are text\n");
            continue;
        }
        if (len == 0)
            continue;
        if (line[0] == '/' && line[1] != '/') {
            if (!run_command(c, line))
                break;
            continue;
        }
        if (line[0] == '/') { /* "//text" sends "/text" */
            line++;
            len--;
        }
        if ((rc = answer(c, line, len)) != 0)
            break;
    }
    free(r.buf);
    return rc;
}

int cmd_chat(int argc, char **argv, const bn_config *cfg)
{
    chat_opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? BN_EXIT_OK : rc;
    if (o.verbose && bn_log_get_level() < BN_LOG_INFO)
        bn_log_set_level(BN_LOG_INFO);

    interrupts in;
    interrupts_start(&in); /* before loading: the library's threads inherit the mask */

    chat c;
    memset(&c, 0, sizeof c);
    c.o = &o;
    bool seed_fixed = false;
    c.seed = cli_choose_seed(cfg, &o.gen, &seed_fixed);
    bn_error err;
    bn_error_clear(&err);
    bn_model_options mo;
    cli_gen_model_options(&o.gen, o.model, &mo);
    if (bn_model_open(&mo, &c.model, &err) != BN_OK) {
        interrupts_stop(&in);
        return cli_fail(&err);
    }
    if (bn_model_get_info(c.model, &c.info, &err) != BN_OK)
        rc = cli_fail(&err);
    else if (!c.info.chat_template[0])
        rc = no_chat_format(&c);
    else if (bn_session_create(c.model, &c.session, &err) != BN_OK)
        rc = cli_fail(&err);
    if (rc != 0) {
        bn_model_close(c.model);
        interrupts_stop(&in);
        return rc;
    }
    if (o.system && !push_message(&c, "system", o.system, strlen(o.system))) {
        fprintf(stderr, "bitnet: error: out of memory\n");
        rc = BN_EXIT_OUT_OF_MEMORY;
    } else {
        c.n_fixed = c.n_msgs;
        print_banner(&c, isatty(STDIN_FILENO), seed_fixed);
        set_phase(PHASE_IDLE, NULL);
        rc = chat_loop(&c, in.watching ? in.pipe_fd[0] : -1);
    }

    interrupts_stop(&in);
    while (c.n_msgs > 0)
        free((char *)c.msgs[--c.n_msgs].content);
    free(c.msgs);
    free(c.text);
    bn_session_free(c.session);
    bn_model_close(c.model);
    return rc;
}
