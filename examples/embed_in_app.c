/*
 * embed_in_app: libbitnet inside an application, with the public API only.
 *
 *     embed_in_app [MODEL]
 *
 * The model is opened once (MODEL, else BITNET_MODEL, else the model
 * shipped with bitnet) and shared by two sessions, as an app serving two
 * conversations would. The program shows
 *   - what the model is (bn_model_get_info),
 *   - text to tokens and back (bn_model_tokenize / bn_model_detokenize),
 *   - the logits after a prompt (bn_session_eval) and their most likely
 *     token, which greedy generation then picks as well,
 *   - sampled generation with a seed and a stop string, repeated in the
 *     other session to show that the same seed gives the same text.
 * It prints one "name: value" line per result and exits 1 if a call fails
 * or a result is not what the API promises.
 *
 * Build against an installed libbitnet:
 *     cc embed_in_app.c -o embed_in_app $(pkg-config --cflags --libs bitnet)
 */
#include <bitnet.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ends the program on an error from the library. */
#define CHECK(call)                                                                            \
    do {                                                                                       \
        if ((call) != BN_OK) {                                                                 \
            fprintf(stderr, "embed_in_app: error: %s\n", err.message);                        \
            if (err.hint[0])                                                                   \
                fprintf(stderr, "embed_in_app: hint: %s\n", err.hint);                         \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static int failures;

static void expect(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "embed_in_app: unexpected: %s\n", what);
        failures++;
    }
}

/* Collects a generation's text and its first token. */
typedef struct collected {
    char text[4096];
    size_t len;
    int32_t first_token;
    int n_calls;
} collected;

static bool collect(void *user, int32_t token, const char *text, size_t len)
{
    collected *c = user;
    if (c->n_calls++ == 0)
        c->first_token = token;
    if (len > sizeof c->text - 1 - c->len)
        len = sizeof c->text - 1 - c->len;
    memcpy(c->text + c->len, text, len);
    c->len += len;
    c->text[c->len] = '\0';
    return true;
}

static const char *stop_name(bn_stop_reason r)
{
    switch (r) {
    case BN_STOP_MAX_TOKENS: return "max-tokens";
    case BN_STOP_EOG: return "end-of-generation";
    case BN_STOP_STRING: return "stop-string";
    case BN_STOP_CALLBACK: return "callback";
    case BN_STOP_CANCELLED: return "cancelled";
    }
    return "?";
}

int main(int argc, char **argv)
{
    bn_error err;
    bn_error_clear(&err);

    /* ---- open once -------------------------------------------------------- */
    bn_model_options opt;
    bn_model_options_default(&opt);
    opt.path = argc > 1 ? argv[1] : NULL;
    bn_model *m = NULL;
    CHECK(bn_model_open(&opt, &m, &err));

    bn_model_info info;
    CHECK(bn_model_get_info(m, &info, &err));
    printf("model: %s\n", info.path);
    printf("architecture: %s, %d layers, dim %d, vocab %d, %llu parameters\n",
           info.architecture, info.n_layer, info.dim, (int)info.vocab_size,
           (unsigned long long)info.n_params);
    printf("device: %s (%s)\n", info.device, info.device_name);
    printf("context: %lld positions (trained for %lld)\n", (long long)info.n_ctx,
           (long long)info.n_ctx_train);
    printf("chat format: %s\n", info.chat_template[0] ? info.chat_template : "(none)");
    if (!info.has_tokenizer) {
        fprintf(stderr, "embed_in_app: error: the model has no tokenizer; this example "
                        "works with text\n");
        bn_model_close(m);
        return 1;
    }

    /* ---- two sessions, one model ----------------------------------------- */
    bn_session *a = NULL, *b = NULL;
    CHECK(bn_session_create(m, &a, &err));
    CHECK(bn_session_create(m, &b, &err));

    /* ---- tokens: count, then write; and back to text ---------------------- */
    const char *text = "In the beginning God created the heaven and the earth.";
    size_t n_tok = 0;
    CHECK(bn_model_tokenize(m, text, strlen(text), false, NULL, 0, &n_tok, &err));
    int32_t *tok = malloc((n_tok ? n_tok : 1) * sizeof *tok);
    if (!tok)
        return 1;
    CHECK(bn_model_tokenize(m, text, strlen(text), false, tok, n_tok, &n_tok, &err));
    char back[512];
    size_t back_len = 0;
    CHECK(bn_model_detokenize(m, tok, n_tok, back, sizeof back, &back_len, &err));
    printf("tokens: %zu for %zu bytes: [", n_tok, strlen(text));
    for (size_t i = 0; i < n_tok; i++)
        printf("%s%d", i ? ", " : "", (int)tok[i]);
    printf("]\n");
    const bool round_trip = back_len == strlen(text) && memcmp(back, text, back_len) == 0;
    printf("round trip: %s\n", round_trip ? "same text" : "DIFFERENT");
    expect(round_trip, "detokenize(tokenize(text)) is not the text");
    free(tok);

    /* ---- logits after a prompt, in session a ------------------------------ */
    const char *prompt = "And God said";
    CHECK(bn_model_tokenize(m, prompt, strlen(prompt), true, NULL, 0, &n_tok, &err));
    tok = malloc((n_tok ? n_tok : 1) * sizeof *tok);
    float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
    if (!tok || !logits)
        return 1;
    CHECK(bn_model_tokenize(m, prompt, strlen(prompt), true, tok, n_tok, &n_tok, &err));
    /* Special tokens give their text ("<|begin_of_text|>"), so that the
     * text tokenizes back to the same tokens: the prompt comes back after
     * BOS's text. */
    CHECK(bn_model_detokenize(m, tok, n_tok, back, sizeof back, &back_len, &err));
    char bos_text[64] = "";
    size_t bos_len = 0;
    if (n_tok && tok[0] == info.bos)
        CHECK(bn_model_detokenize(m, tok, 1, bos_text, sizeof bos_text, &bos_len, &err));
    const bool bos_round_trip = back_len == bos_len + strlen(prompt) &&
                                memcmp(back, bos_text, bos_len) == 0 &&
                                memcmp(back + bos_len, prompt, strlen(prompt)) == 0;
    printf("round trip with BOS (%s): %s\n", n_tok && tok[0] == info.bos ? "added" : "none",
           bos_round_trip ? "same text" : "DIFFERENT");
    if (!bos_round_trip)
        printf("  detokenized: '%.*s'\n", (int)back_len, back);
    expect(bos_round_trip, "detokenize(tokenize(prompt, add_bos)) is not the prompt");
    CHECK(bn_session_eval(a, tok, n_tok, logits, &err));
    int32_t best = 0;
    for (int32_t i = 1; i < info.vocab_size; i++)
        if (logits[i] > logits[best])
            best = i;
    char piece[256];
    size_t piece_len = 0;
    CHECK(bn_model_detokenize(m, &best, 1, piece, sizeof piece, &piece_len, &err));
    printf("eval: %zu prompt tokens; most likely next token %d '%s' (logit %.4f)\n", n_tok,
           (int)best, piece, (double)logits[best]);

    /* Greedy generation continuing session a (no prompt: from what it
     * holds) picks that token first, unless it ends the generation. */
    bn_generate_params p;
    bn_generate_params_default(&p);
    p.max_tokens = 1;
    collected c = {.first_token = -1};
    bn_generate_result r;
    CHECK(bn_session_generate(a, &p, collect, &c, &r, &err));
    if (bn_model_token_is_eog(m, best))
        expect(r.stop == BN_STOP_EOG && r.n_tokens == 0, "greedy did not stop at the EOG argmax");
    else
        expect(c.first_token == best, "greedy's first token is not the logits' argmax");
    printf("greedy next: token %d, %zu of %zu positions cached\n", (int)c.first_token,
           r.n_cached, n_tok);
    size_t held = 0;
    CHECK(bn_session_tokens(a, NULL, 0, &held, &err));
    printf("session a holds %zu tokens\n", held);
    expect(held == n_tok + r.n_tokens, "session a does not hold the prompt and the token");
    const size_t held_a = held;

    /* ---- sampling with a seed and a stop string, in session b -------------- */
    bn_generate_params_default(&p);
    p.prompt = "And God said";
    p.max_tokens = 48;
    p.temperature = 0.8f;
    p.seed = 1234;
    p.stop[0] = ".";
    p.stop[1] = ":";
    collected first = {.first_token = -1};
    CHECK(bn_session_generate(b, &p, collect, &first, &r, &err));
    printf("sampled (seed %llu): '%s' (%zu tokens, stopped: %s)\n",
           (unsigned long long)p.seed, first.text, r.n_tokens, stop_name(r.stop));
    expect(!strstr(first.text, ".") && !strstr(first.text, ":"),
           "the text holds a stop string");

    /* The same seed, prompt and settings in a fresh conversation: the same
     * text (session b starts over; session a is untouched). */
    bn_session_reset(b);
    collected again = {.first_token = -1};
    CHECK(bn_session_generate(b, &p, collect, &again, &r, &err));
    const bool same = first.len == again.len && memcmp(first.text, again.text, first.len) == 0;
    printf("same seed again: %s (%zu of the prompt's positions cached)\n",
           same ? "same text" : "DIFFERENT", r.n_cached);
    expect(same, "the same seed gave a different text");

    CHECK(bn_session_tokens(a, NULL, 0, &held, &err));
    expect(held == held_a, "session a changed while session b generated");

    free(tok);
    free(logits);
    bn_session_free(a);
    bn_session_free(b);
    bn_model_close(m);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
