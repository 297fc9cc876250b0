/*
 * chat: an interactive conversation with a chat model, with libbitnet's
 * public API only.
 *
 *     chat [-m MODEL] [-s SYSTEM] [-n N] [--temp T] [--seed S]
 *
 * Reads the user's messages from stdin, one per line, and streams each
 * answer to stdout followed by a newline. The whole conversation is the
 * context of every answer: it lives in one bn_session. "/reset" forgets it
 * (the system message stays); end of input ends the program. On a terminal
 * a "> " prompt is shown; otherwise stdout holds only the answers, so a
 * script can feed the program and read them.
 *
 * How the conversation reaches the model: the program keeps the message
 * list and, for each turn, asks bn_model_apply_chat for the text of the
 * whole conversation (ending with the opening of the assistant's turn).
 * The session already holds the conversation up to the previous answer,
 * whose text is the previous turn's prompt text plus the answer generated.
 * When the new text starts with that (it does for the formats bitnet
 * knows: each turn's text follows the earlier ones'), only the rest is
 * appended, e.g. "<|eot_id|>User: ...<|eot_id|>Assistant: " in the
 * BitNet b1.58 2B-4T format: the end of the previous answer, the user's
 * message, the opening of the answer. The answer's tokens stay as they
 * were generated. Otherwise the session is reset and given the whole
 * text; the model then reuses the cached positions of the tokens the new
 * prompt shares with what it computed last, so this costs little more.
 *
 * Build against an installed libbitnet:
 *     cc chat.c -o chat $(pkg-config --cflags --libs bitnet)
 */
#define _POSIX_C_SOURCE 200809L

#include <bitnet.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out, "usage: chat [-m MODEL] [-s SYSTEM] [-n N] [--temp T] [--seed S]\n"
                 "  -m MODEL   GGUF file or Hugging Face directory with a chat format\n"
                 "             (default: BITNET_MODEL, else the model shipped with bitnet)\n"
                 "  -s SYSTEM  system message\n"
                 "  -n N       tokens per answer at most (default 256)\n"
                 "  --temp T   sampling temperature (default 0: greedy)\n"
                 "  --seed S   sampling seed (default 0)\n"
                 "One message per line on stdin; /reset forgets the conversation; end of\n"
                 "input ends it. The device is BITNET_DEVICE's (default auto).\n");
}

static void print_error(const bn_error *err)
{
    fprintf(stderr, "chat: error: %s\n", err->message);
    if (err->hint[0])
        fprintf(stderr, "chat: hint: %s\n", err->hint);
}

/* A growing byte string. */
typedef struct text {
    char *p;
    size_t len, cap;
} text;

/* Room for n bytes in all; -1 when out of memory. */
static int text_reserve(text *t, size_t n)
{
    if (n <= t->cap)
        return 0;
    size_t cap = t->cap ? t->cap : 256;
    while (cap < n)
        cap *= 2;
    char *p = realloc(t->p, cap);
    if (!p)
        return -1;
    t->p = p;
    t->cap = cap;
    return 0;
}

static int text_append(text *t, const char *s, size_t n)
{
    if (text_reserve(t, t->len + n + 1) != 0)
        return -1;
    if (n > 0)
        memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
    return 0;
}

/* The conversation's text in the model's chat format, ending with the
 * opening of the assistant's turn, into t (replacing what it held): the
 * length first, then the text. */
static bn_status apply_chat(const bn_model *m, const bn_chat_message *msgs, size_t n, text *t,
                            bn_error *err)
{
    size_t len = 0;
    bn_status st = bn_model_apply_chat(m, msgs, n, true, NULL, 0, &len, err);
    if (st != BN_OK)
        return st;
    if (text_reserve(t, len + 1) != 0)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory");
    st = bn_model_apply_chat(m, msgs, n, true, t->p, t->cap, &len, err);
    t->len = len;
    return st;
}

/* Streams the answer to stdout and keeps it (the history needs it). */
static bool on_token(void *user, int32_t token, const char *s, size_t len)
{
    (void)token;
    fwrite(s, 1, len, stdout);
    fflush(stdout);
    return text_append(user, s, len) == 0;
}

typedef struct history {
    bn_chat_message *msgs; /* contents malloc'ed; msgs[0] the system message if any */
    size_t n, cap, n_fixed; /* n_fixed: the system message, kept by /reset */
} history;

static int history_add(history *h, const char *role, const char *content)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        bn_chat_message *m = realloc(h->msgs, cap * sizeof *m);
        if (!m)
            return -1;
        h->msgs = m;
        h->cap = cap;
    }
    char *c = strdup(content);
    if (!c)
        return -1;
    h->msgs[h->n].role = role;
    h->msgs[h->n].content = c;
    h->n++;
    return 0;
}

static void history_truncate(history *h, size_t n)
{
    while (h->n > n)
        free((char *)h->msgs[--h->n].content);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *system = NULL;
    long n_answer = 256;
    float temp = 0.0f;
    unsigned long long seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "chat: error: unknown argument or missing value: '%s'\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        char *end = NULL;
        if (strcmp(a, "-m") == 0) {
            model = v;
        } else if (strcmp(a, "-s") == 0) {
            system = v;
        } else if (strcmp(a, "-n") == 0) {
            n_answer = strtol(v, &end, 10);
            if (*end != '\0' || end == v || n_answer < 1 || n_answer > 1000000) {
                fprintf(stderr, "chat: error: -n must be from 1 to 1000000, not '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "--temp") == 0) {
            temp = strtof(v, &end);
            if (*end != '\0' || end == v || !(temp >= 0.0f && temp <= 100.0f)) {
                fprintf(stderr, "chat: error: --temp must be from 0 to 100, not '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "--seed") == 0) {
            seed = strtoull(v, &end, 10);
            if (*end != '\0' || end == v || v[0] == '-') {
                fprintf(stderr, "chat: error: --seed must be a number, not '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "chat: error: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }

    bn_error err;
    bn_error_clear(&err);
    bn_model_options opt;
    bn_model_options_default(&opt);
    opt.path = model;
    bn_model *m = NULL;
    if (bn_model_open(&opt, &m, &err) != BN_OK) {
        print_error(&err);
        return 1;
    }

    history h = {0};
    text prompt = {0}, held = {0}, answer = {0};
    bn_session *s = NULL;
    int rc = 1;
    if (system && system[0] && history_add(&h, "system", system) != 0)
        goto oom;
    h.n_fixed = h.n;

    /* A model without a chat format is refused here, before any input is
     * read, with the library's message. */
    {
        const bn_chat_message probe = {"user", ""};
        size_t len;
        if (bn_model_apply_chat(m, &probe, 1, true, NULL, 0, &len, &err) != BN_OK) {
            print_error(&err);
            goto out;
        }
    }
    if (bn_session_create(m, &s, &err) != BN_OK) {
        print_error(&err);
        goto out;
    }
    bn_model_info info;
    if (bn_model_get_info(m, &info, &err) != BN_OK) {
        print_error(&err);
        goto out;
    }
    const int64_t n_ctx = info.n_ctx;

    const bool interactive = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t line_cap = 0;
    for (;;) {
        if (interactive) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0)
            break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = '\0';
        if (got == 0)
            continue;
        if (strcmp(line, "/reset") == 0) {
            history_truncate(&h, h.n_fixed);
            bn_session_reset(s);
            held.len = 0;
            fprintf(stderr, "(conversation cleared)\n");
            continue;
        }

        if (history_add(&h, "user", line) != 0)
            goto oom_line;
        if (apply_chat(m, h.msgs, h.n, &prompt, &err) != BN_OK) {
            print_error(&err);
            history_truncate(&h, h.n - 1);
            continue;
        }
        /* Append only what the session does not hold yet (see the top). */
        const char *new_text = prompt.p;
        if (held.len > 0 && prompt.len > held.len && memcmp(prompt.p, held.p, held.len) == 0) {
            new_text = prompt.p + held.len;
        } else {
            bn_session_reset(s);
        }

        /* The prompt and the answer must fit the context with what the
         * session holds: the answer gets the room left, at most -n. (The
         * count may be one more than the session will take: a BOS the
         * chat text already writes.) */
        size_t n_held = 0, n_new = 0;
        if (bn_session_tokens(s, NULL, 0, &n_held, &err) != BN_OK ||
            bn_model_tokenize(m, new_text, strlen(new_text), n_held == 0, NULL, 0, &n_new,
                              &err) != BN_OK) {
            print_error(&err);
            history_truncate(&h, h.n - 1);
            continue;
        }
        const int64_t room = n_ctx - (int64_t)n_held - (int64_t)n_new;
        if (room < 1) {
            fprintf(stderr, "chat: error: the conversation fills the model's context (%lld "
                            "positions)\nchat: hint: /reset starts a new one\n",
                    (long long)n_ctx);
            history_truncate(&h, h.n - 1);
            if (new_text == prompt.p)
                held.len = 0; /* the session was reset above */
            continue;
        }

        bn_generate_params p;
        bn_generate_params_default(&p);
        p.prompt = new_text;
        p.max_tokens = (int)(room < n_answer ? room : n_answer);
        p.temperature = temp;
        p.seed = seed;
        answer.len = 0;
        if (text_append(&answer, "", 0) != 0)
            goto oom_line;
        bn_generate_result r;
        if (bn_session_generate(s, &p, on_token, &answer, &r, &err) != BN_OK) {
            /* The session is as before the call: drop the message and go
             * on (a conversation longer than the context needs /reset). */
            if (answer.len > 0)
                fputc('\n', stdout);
            fflush(stdout);
            print_error(&err);
            history_truncate(&h, h.n - 1);
            if (new_text == prompt.p)
                held.len = 0; /* the session was reset above */
            continue;
        }
        fputc('\n', stdout);
        fflush(stdout);
        if (r.stop == BN_STOP_CALLBACK)
            goto oom_line; /* on_token could not keep the answer */
        /* The session now holds the prompt's text and the answer. */
        if (history_add(&h, "assistant", answer.p) != 0)
            goto oom_line;
        held.len = 0;
        if (text_append(&held, prompt.p, prompt.len) != 0 ||
            text_append(&held, answer.p, answer.len) != 0)
            goto oom_line;
    }
    if (interactive)
        fputc('\n', stdout);
    rc = 0;
    free(line);
    goto out;

oom_line:
    free(line);
oom:
    fprintf(stderr, "chat: error: out of memory\n");
out:
    history_truncate(&h, 0);
    free(h.msgs);
    free(prompt.p);
    free(held.p);
    free(answer.p);
    bn_session_free(s);
    bn_model_close(m);
    return rc;
}
