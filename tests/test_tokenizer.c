/*
 * test_tokenizer.c - the tokenizer against reference encodings.
 *
 * argv[1] is tests/data/tokenizer (scripts/gen_tokenizer_fixtures.py made
 * it): a byte-level BPE as tokenizer.json (two forms) and GGUF (two
 * forms), a SentencePiece BPE as GGUF, and what Hugging Face `tokenizers`
 * and `sentencepiece` encode a battery of strings to. Every adapter must
 * give the same ids, id for id.
 *
 * Optional, with the real LLaMA-3 vocabulary (not committed):
 *   BN_LLAMA3_TOKENIZER=/path/tokenizer.json  compared with llama3_refs.json
 *   BN_LLAMA3_GGUF=/path/vocab.gguf           the same, GGUF "llama-bpe"
 */
#include "test_util.h"

#include "gguf.h"
#include "tokenizer.h"
#include "tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <unistd.h>

static const char *data_dir;

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

static char *path_in(const char *dir, const char *name)
{
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

static cJSON *load_json(const char *name)
{
    FILE *f = fopen(path_in(data_dir, name), "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    fclose(f);
    s[got] = '\0';
    cJSON *j = cJSON_ParseWithLength(s, got);
    free(s);
    return j;
}

static bn_tokenizer *open_json(const char *path)
{
    bn_error err;
    bn_error_clear(&err);
    bn_tokenizer *t = NULL;
    bn_status st = bn_tokenizer_from_hf_json(path, &t, &err);
    CHECK_MSG(st == BN_OK, "%s: %s", path, err.message);
    return t;
}

static bn_tokenizer *open_gguf(const char *path)
{
    bn_error err;
    bn_error_clear(&err);
    bn_gguf *g = NULL;
    bn_tokenizer *t = NULL;
    bn_status st = bn_gguf_open(path, &g, &err);
    CHECK_MSG(st == BN_OK, "%s: %s", path, err.message);
    if (st != BN_OK)
        return NULL;
    st = bn_tokenizer_from_gguf(g, &t, &err);
    CHECK_MSG(st == BN_OK, "%s: %s", path, err.message);
    bn_gguf_close(g);
    return t;
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    fprintf(stderr, "    %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 64; i++)
        fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 64 ? " ..." : "");
}

/* Encodes and compares with a JSON array of ids. */
static void check_encoding(const bn_tokenizer *t, const char *what, const char *text,
                           const cJSON *want, bool add_bos, bool parse_special)
{
    int32_t *ids = NULL;
    size_t n = 0;
    bn_error err;
    bn_status st = bn_tokenize(t, text, strlen(text), add_bos, parse_special, &ids, &n, &err);
    CHECK_MSG(st == BN_OK, "%s: %s", what, err.message);
    size_t m = (size_t)cJSON_GetArraySize(want);
    bool same = st == BN_OK && n == m;
    for (size_t i = 0; same && i < n; i++)
        same = ids[i] == cJSON_GetArrayItem(want, (int)i)->valueint;
    CHECK_MSG(same, "%s: encoding of \"%s\" differs (bos %d, special %d)", what, text, add_bos,
              parse_special);
    if (!same) {
        print_ids("got ", ids, n);
        int32_t w[512];
        for (size_t i = 0; i < m && i < 512; i++)
            w[i] = cJSON_GetArrayItem(want, (int)i)->valueint;
        print_ids("want", w, m < 512 ? m : 512);
    }
    free(ids);
}

/* decode(encode(text)) == text. */
static void check_roundtrip(const bn_tokenizer *t, const char *what, const char *text, size_t len,
                            bool parse_special)
{
    int32_t *ids = NULL;
    size_t n = 0;
    char *back = NULL;
    bn_error err;
    bn_status st = bn_tokenize(t, text, len, false, parse_special, &ids, &n, &err);
    CHECK_MSG(st == BN_OK, "%s: %s", what, err.message);
    if (st == BN_OK)
        st = bn_detokenize(t, ids, n, &back, &err);
    CHECK_MSG(st == BN_OK, "%s: %s", what, err.message);
    CHECK_MSG(back && strlen(back) == strlen(text) && memcmp(back, text, len) == 0,
              "%s: round trip of \"%.60s\" gave \"%.60s\"", what, text, back ? back : "(null)");
    free(ids);
    free(back);
}

/* Decoding token by token through the stream gives the text back. */
static void check_stream(const bn_tokenizer *t, const char *what, const char *text)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (bn_tokenize(t, text, strlen(text), false, true, &ids, &n, NULL) != BN_OK) {
        CHECK(false);
        return;
    }
    size_t cap = strlen(text) + 64, used = 0;
    char *got = malloc(cap), buf[256];
    bn_detok_stream s;
    bn_detok_stream_init(&s, t);
    for (size_t i = 0; i < n; i++) {
        size_t k = bn_detok_stream_push(&s, ids[i], buf, sizeof buf);
        CHECK(k < sizeof buf && strlen(buf) == k);
        memcpy(got + used, buf, k);
        used += k;
    }
    size_t k = bn_detok_stream_flush(&s, buf, sizeof buf);
    memcpy(got + used, buf, k);
    used += k;
    got[used] = '\0';
    /* SPM streams keep the dummy-prefix space (generation continues a
     * prompt), so compare from the text's first byte after it. */
    const char *cmp = got;
    if (bn_tokenizer_kind_of(t) == BN_TOKENIZER_SPM_BPE && got[0] == ' ')
        cmp++;
    CHECK_MSG(strcmp(cmp, text) == 0, "%s: streamed \"%.60s\" as \"%.60s\"", what, text, got);
    free(got);
    free(ids);
}

/* Runs one reference list: {text, ids, ids_no_special, ids_bos}. */
static void check_refs(const bn_tokenizer *t, const char *what, const cJSON *refs, bool bpe)
{
    const cJSON *r;
    int count = 0;
    cJSON_ArrayForEach(r, refs) {
        const char *text = cJSON_GetObjectItem(r, "text")->valuestring;
        if (bpe) {
            check_encoding(t, what, text, cJSON_GetObjectItem(r, "ids"), false, true);
            check_encoding(t, what, text, cJSON_GetObjectItem(r, "ids_no_special"), false, false);
            check_encoding(t, what, text, cJSON_GetObjectItem(r, "ids_bos"), true, true);
            check_roundtrip(t, what, text, strlen(text), false);
        } else {
            /* SentencePiece parses no control token: parse_special off. */
            check_encoding(t, what, text, cJSON_GetObjectItem(r, "ids"), false, false);
        }
        check_roundtrip(t, what, text, strlen(text), true);
        check_stream(t, what, text);
        count++;
    }
    CHECK_MSG(count > 30, "%s: only %d references", what, count);
}

/* ------------------------------------------------------------------------ */
/* Byte-level BPE                                                            */
/* ------------------------------------------------------------------------ */

static int32_t encode_one(const bn_tokenizer *t, const char *text, bool special)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int32_t id = -1;
    if (bn_tokenize(t, text, strlen(text), false, special, &ids, &n, NULL) == BN_OK && n == 1)
        id = ids[0];
    free(ids);
    return id;
}

static void check_bpe_specials(const bn_tokenizer *t, const char *what)
{
    int32_t bos = bn_tokenizer_find(t, "<|begin_of_text|>");
    int32_t eos = bn_tokenizer_find(t, "<|end_of_text|>");
    int32_t eot = bn_tokenizer_find(t, "<|eot_id|>");
    int32_t tool = bn_tokenizer_find(t, "<|tool|>");
    CHECK_MSG(bos >= 0 && eos >= 0 && eot >= 0 && tool >= 0, "%s: special tokens", what);
    CHECK_MSG(bn_tokenizer_bos(t) == bos, "%s: bos %d", what, bn_tokenizer_bos(t));
    CHECK_MSG(bn_tokenizer_eos(t) == eos, "%s: eos %d", what, bn_tokenizer_eos(t));
    CHECK_MSG(bn_tokenizer_eot(t) == eot, "%s: eot %d", what, bn_tokenizer_eot(t));
    CHECK(bn_tokenizer_add_bos_default(t));
    CHECK(bn_tokenizer_kind_of(t) == BN_TOKENIZER_BYTE_BPE);
    CHECK(bn_tokenizer_is_eog(t, eos) && bn_tokenizer_is_eog(t, eot));
    CHECK(!bn_tokenizer_is_eog(t, bos) && !bn_tokenizer_is_eog(t, tool));
    CHECK(!bn_tokenizer_is_eog(t, 0) && !bn_tokenizer_is_eog(t, -1));
    CHECK(!bn_tokenizer_is_eog(t, bn_tokenizer_vocab_size(t)));
    CHECK(bn_tokenizer_find(t, "no such token") == -1);
    /* Special parsing on and off; user-defined tokens are always matched. */
    CHECK(encode_one(t, "<|eot_id|>", true) == eot);
    CHECK(encode_one(t, "<|eot_id|>", false) == -1);
    CHECK(encode_one(t, "<|tool|>", false) == tool);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(bn_tokenize(t, "<|eot_id|>", 10, false, false, &ids, &n, NULL) == BN_OK);
    for (size_t i = 0; i < n; i++)
        CHECK(ids[i] != eot);
    free(ids);
    /* add_bos: BOS first, once; the empty text gives BOS alone. */
    CHECK(bn_tokenize(t, "", 0, true, true, &ids, &n, NULL) == BN_OK);
    CHECK(n == 1 && ids[0] == bos);
    free(ids);
    CHECK(bn_tokenize(t, "", 0, false, true, &ids, &n, NULL) == BN_OK);
    CHECK(n == 0 && ids != NULL);
    free(ids);
    /* Token bytes: special tokens as their text, invalid ids refused. */
    char buf[64];
    CHECK(bn_token_to_bytes(t, eot, buf, sizeof buf) == 10 && memcmp(buf, "<|eot_id|>", 10) == 0);
    CHECK(bn_token_to_bytes(t, -1, buf, sizeof buf) == -1);
    CHECK(bn_token_to_bytes(t, bn_tokenizer_vocab_size(t), buf, sizeof buf) == -1);
    CHECK(bn_token_to_bytes(t, eot, buf, 3) == 10); /* the full length, 3 copied */
    int32_t space = encode_one(t, " ", false);
    CHECK(space >= 0 && bn_token_to_bytes(t, space, buf, sizeof buf) == 1 && buf[0] == ' ');
    /* Bad ids in decoding. */
    bn_error err;
    char *text = NULL;
    int32_t bad[2] = {0, 1 << 30};
    CHECK(bn_detokenize(t, bad, 2, &text, &err) == BN_ERR_INVALID_ARGUMENT && !text);
    CHECK_STR_CONTAINS(err.message, "outside the vocabulary");
}

/* The streaming decoder on hand-made sequences of single-byte tokens. */
static void check_stream_bytes(const bn_tokenizer *t)
{
    /* GPT-2 characters of bytes 0xC3 0xA9 (é) and F0 9F 98 80 (😀). */
    int32_t c3 = bn_tokenizer_find(t, "\xC3\x83"), a9 = bn_tokenizer_find(t, "\xC2\xA9");
    int32_t f0 = bn_tokenizer_find(t, "\xC3\xB0"), x9f = bn_tokenizer_find(t, "\xC5\x81");
    int32_t x98 = bn_tokenizer_find(t, "\xC4\xBA"), x80 = bn_tokenizer_find(t, "\xC4\xA2");
    int32_t a = bn_tokenizer_find(t, "a");
    CHECK(c3 >= 0 && a9 >= 0 && f0 >= 0 && x9f >= 0 && x98 >= 0 && x80 >= 0 && a >= 0);
    char b[8];
    CHECK(bn_token_to_bytes(t, x9f, b, 8) == 1 && (unsigned char)b[0] == 0x9F);
    bn_detok_stream s;
    char out[64];
    bn_detok_stream_init(&s, t);
    CHECK(bn_detok_stream_push(&s, c3, out, sizeof out) == 0 && out[0] == '\0');
    CHECK(bn_detok_stream_push(&s, a9, out, sizeof out) == 2 && strcmp(out, "é") == 0);
    CHECK(bn_detok_stream_push(&s, f0, out, sizeof out) == 0);
    CHECK(bn_detok_stream_push(&s, x9f, out, sizeof out) == 0);
    CHECK(bn_detok_stream_push(&s, x98, out, sizeof out) == 0);
    CHECK(bn_detok_stream_push(&s, x80, out, sizeof out) == 4 && strcmp(out, "😀") == 0);
    CHECK(bn_detok_stream_flush(&s, out, sizeof out) == 0);
    /* A sequence broken by an ASCII byte: U+FFFD, then the byte. */
    CHECK(bn_detok_stream_push(&s, c3, out, sizeof out) == 0);
    CHECK(bn_detok_stream_push(&s, a, out, sizeof out) == 4 && strcmp(out, "\xEF\xBF\xBD" "a") == 0);
    /* A stray continuation byte. */
    CHECK(bn_detok_stream_push(&s, a9, out, sizeof out) == 3 && strcmp(out, "\xEF\xBF\xBD") == 0);
    /* Flush of an unfinished sequence. */
    CHECK(bn_detok_stream_push(&s, f0, out, sizeof out) == 0);
    CHECK(bn_detok_stream_push(&s, x9f, out, sizeof out) == 0);
    CHECK(bn_detok_stream_flush(&s, out, sizeof out) == 3 && strcmp(out, "\xEF\xBF\xBD") == 0);
    CHECK(bn_detok_stream_flush(&s, out, sizeof out) == 0);
    /* Too small a buffer consumes nothing: the call can be repeated. */
    int32_t eot = bn_tokenizer_find(t, "<|eot_id|>");
    CHECK(bn_detok_stream_push(&s, eot, out, 4) == 10);
    CHECK(bn_detok_stream_push(&s, eot, out, sizeof out) == 10 && strcmp(out, "<|eot_id|>") == 0);
    CHECK(bn_detok_stream_push(&s, -5, out, sizeof out) == 0);
    /* Whole-sequence decoding keeps bytes exactly. */
    int32_t ids[3] = {c3, a9, a};
    char *text = NULL;
    CHECK(bn_detokenize(t, ids, 3, &text, NULL) == BN_OK && text && strcmp(text, "éa") == 0);
    free(text);
}

/* Encoding must stay fast on long and degenerate inputs: these would take
 * seconds with quadratic merging (no time is asserted; ctest's timeout
 * and anyone watching notice). */
static void check_long_inputs(const bn_tokenizer *t, const char *what)
{
    size_t n = 20000;
    char *s = malloc(n + 1);
    const char *fills[] = {"!", " ", "a", "7", "é", "\n", "ab "};
    for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
        size_t k = strlen(fills[f]), i = 0;
        for (; i + k <= n; i += k)
            memcpy(s + i, fills[f], k);
        s[i] = '\0';
        check_roundtrip(t, what, s, i, true);
    }
    free(s);
    /* The training corpus: 60 kB of prose, code and several scripts. */
    FILE *f = fopen(path_in(data_dir, "corpus.txt"), "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    char *c = malloc(1 << 17);
    size_t len = fread(c, 1, (1 << 17) - 1, f);
    fclose(f);
    c[len] = '\0';
    check_roundtrip(t, what, c, len, true);
    free(c);
}

/* Random bytes, valid UTF-8 or not, survive a byte-level round trip. */
static void check_random_bytes(const bn_tokenizer *t)
{
    for (int iter = 0; iter < 200; iter++) {
        char s[128];
        size_t n = (size_t)test_rand_range(1, (int64_t)sizeof s - 1);
        for (size_t i = 0; i < n; i++) {
            static const char pool[] = " \n\t'sa1<|>é\xF0\x9F\x98\x80";
            int64_t r = test_rand_range(0, 3);
            s[i] = r == 0 ? (char)test_rand_range(1, 255) : pool[test_rand_range(0, sizeof pool - 2)];
        }
        s[n] = '\0';
        check_roundtrip(t, "random bytes", s, n, true);
    }
    /* An embedded NUL is ordinary text. */
    int32_t *ids = NULL;
    size_t n = 0;
    char *back = NULL;
    CHECK(bn_tokenize(t, "a\0b", 3, false, true, &ids, &n, NULL) == BN_OK && n >= 2);
    CHECK(bn_detokenize(t, ids, n, &back, NULL) == BN_OK && memcmp(back, "a\0b", 3) == 0);
    free(ids);
    free(back);
}

static void test_bpe(void)
{
    cJSON *refs = load_json("bpe_refs.json");
    CHECK_MSG(refs != NULL, "cannot read bpe_refs.json in %s", data_dir);
    if (!refs)
        return;
    const cJSON *ignore = cJSON_GetObjectItem(refs, "ignore_merges");
    const cJSON *legacy = cJSON_GetObjectItem(refs, "legacy");
    struct {
        const char *file;
        bool gguf;
        const cJSON *refs;
    } cases[] = {
        {"bpe.json", false, ignore},
        {"bpe_legacy.json", false, legacy},
        {"bpe.gguf", true, ignore},
        {"bpe_nopre.gguf", true, ignore}, /* no pre, no eot: LLaMA-3 defaults */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = path_in(data_dir, cases[i].file);
        bn_tokenizer *t = cases[i].gguf ? open_gguf(p) : open_json(p);
        if (!t)
            continue;
        check_refs(t, cases[i].file, cases[i].refs, true);
        check_bpe_specials(t, cases[i].file);
        if (i == 0) {
            check_stream_bytes(t);
            check_long_inputs(t, cases[i].file);
            check_random_bytes(t);
        }
        bn_tokenizer_free(t);
    }
    cJSON_Delete(refs);
}

/* ------------------------------------------------------------------------ */
/* SentencePiece BPE                                                         */
/* ------------------------------------------------------------------------ */

static void test_spm(void)
{
    cJSON *refs = load_json("spm_refs.json");
    CHECK_MSG(refs != NULL, "cannot read spm_refs.json");
    bn_tokenizer *t = open_gguf(path_in(data_dir, "spm.gguf"));
    if (!refs || !t) {
        cJSON_Delete(refs);
        bn_tokenizer_free(t);
        return;
    }
    check_refs(t, "spm.gguf", refs, false);
    CHECK(bn_tokenizer_kind_of(t) == BN_TOKENIZER_SPM_BPE);
    CHECK(bn_tokenizer_bos(t) == 1 && bn_tokenizer_eos(t) == 2 && bn_tokenizer_eot(t) == -1);
    CHECK(bn_tokenizer_add_bos_default(t));
    CHECK(bn_tokenizer_is_eog(t, 2) && !bn_tokenizer_is_eog(t, 1));
    /* Byte fallback tokens decode to their byte. */
    int32_t nl = bn_tokenizer_find(t, "<0x0A>");
    char b[8];
    CHECK(nl >= 0 && bn_token_to_bytes(t, nl, b, sizeof b) == 1 && b[0] == '\n');
    /* "▁" decodes to a space. */
    int32_t sp = bn_tokenizer_find(t, "\xE2\x96\x81");
    CHECK(sp >= 0 && bn_token_to_bytes(t, sp, b, sizeof b) == 1 && b[0] == ' ');
    /* A control token parsed from the text starts a new text: the same ids
     * as BOS followed by the text on its own. */
    int32_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    CHECK(bn_tokenize(t, "<s>Hello world", 14, false, true, &x, &nx, NULL) == BN_OK);
    CHECK(bn_tokenize(t, "Hello world", 11, true, true, &y, &ny, NULL) == BN_OK);
    CHECK(nx == ny && nx > 1 && memcmp(x, y, nx * sizeof *x) == 0 && x[0] == 1);
    char *text = NULL;
    CHECK(bn_detokenize(t, x, nx, &text, NULL) == BN_OK && strcmp(text, "<s>Hello world") == 0);
    free(text);
    free(x);
    free(y);
    /* Without parse_special, "<s>" is text. */
    CHECK(bn_tokenize(t, "<s>", 3, false, false, &x, &nx, NULL) == BN_OK);
    for (size_t i = 0; i < nx; i++)
        CHECK(x[i] != 1);
    free(x);
    /* Random valid UTF-8 round trips (byte fallback covers any character). */
    for (int iter = 0; iter < 200; iter++) {
        char s[200];
        size_t n = 0, want = (size_t)test_rand_range(1, 40);
        for (size_t i = 0; i < want; i++) {
            static const uint32_t cps[] = {' ', ' ', 'a', 'e', 't', '\n', 0xE9, 0x4E2D, 0x1F600,
                                           'X', '1', 0x0416};
            uint32_t cp = cps[test_rand_range(0, sizeof cps / sizeof cps[0] - 1)];
            if (test_rand_range(0, 5) == 0)
                cp = (uint32_t)test_rand_range(0x20, 0x2FFF);
            /* U+2581 in the input decodes as a space: SPM can't tell them apart. */
            if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == 0x2581)
                cp = 'z';
            n += bn_utf8_put(cp, s + n);
        }
        s[n] = '\0';
        check_roundtrip(t, "spm random", s, n, true);
    }
    check_long_inputs(t, "spm.gguf");
    bn_tokenizer_free(t);
    cJSON_Delete(refs);
}

/* ------------------------------------------------------------------------ */
/* Chat prompt                                                               */
/* ------------------------------------------------------------------------ */

static void test_chat(void)
{
    /* Message contents are trimmed as the Hugging Face template's `trim`
     * does (Python's str.strip: Unicode whitespace too). */
    static const struct {
        const char *in, *want;
    } cases[] = {{"Hi!", "Hi!"},
                 {"  Be brief.\n", "Be brief."},
                 {"\t Why?\xE3\x80\x80 \n", "Why?"},
                 {"\xc2\xa0hello\xc2\xa0\x0b", "hello"},
                 {"a \xE2\x80\x83 b", "a \xE2\x80\x83 b"},
                 {" \n\t", ""},
                 {"", ""}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = 99;
        const char *t = bn_chat_trim(cases[i].in, &len);
        CHECK_MSG(len == strlen(cases[i].want) && strncmp(t, cases[i].want, len) == 0,
                  "trim case %zu", i);
    }
    /* A chat text tokenizes with its special tokens (parse_special). */
    bn_tokenizer *t = open_json(path_in(data_dir, "bpe.json"));
    if (!t)
        return;
    const char *p = "<|begin_of_text|>System: sys<|eot_id|>User: user text<|eot_id|>Assistant: ";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(bn_tokenize(t, p, strlen(p), false, true, &ids, &n, NULL) == BN_OK);
    int32_t eot = bn_tokenizer_eot(t);
    size_t eots = 0;
    for (size_t i = 0; i < n; i++)
        eots += ids[i] == eot;
    CHECK(n > 4 && ids[0] == bn_tokenizer_bos(t) && eots == 2);
    free(ids);
    bn_tokenizer_free(t);
}

/* ------------------------------------------------------------------------ */
/* Malformed inputs                                                          */
/* ------------------------------------------------------------------------ */

static char tmp_dir[256];

static const char *write_tmp(const char *name, const char *content)
{
    const char *p = path_in(tmp_dir, name);
    FILE *f = fopen(p, "wb");
    fputs(content, f);
    fclose(f);
    return p;
}

static void expect_json_error(const char *content, bn_status want, const char *needle)
{
    const char *p = write_tmp("tokenizer.json", content);
    bn_tokenizer *t = NULL;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_tokenizer_from_hf_json(p, &t, &err);
    CHECK_MSG(st == want, "status %s for %.80s", bn_status_str(st), content);
    CHECK(t == NULL);
    CHECK_STR_CONTAINS(err.message, needle);
    bn_tokenizer_free(t);
}

#define BL "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"

static void test_malformed_json(void)
{
    bn_tokenizer *t = NULL;
    bn_error err;
    CHECK(bn_tokenizer_from_hf_json(path_in(tmp_dir, "missing.json"), &t, &err) == BN_ERR_IO);
    CHECK(bn_tokenizer_from_hf_json(NULL, &t, &err) == BN_ERR_INVALID_ARGUMENT);
    expect_json_error("{\"model\": ", BN_ERR_FORMAT, "not a valid JSON");
    expect_json_error("{}", BN_ERR_FORMAT, "no \"model\"");
    expect_json_error("{" BL "\"model\":{\"type\":\"BPE\",\"merges\":[]}}", BN_ERR_FORMAT,
                      "vocab is missing");
    expect_json_error("{" BL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}", BN_ERR_FORMAT,
                      "merges is missing");
    expect_json_error("{" BL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
                      "\"merges\":[\"a c\"]}}",
                      BN_ERR_FORMAT, "unknown token");
    expect_json_error("{" BL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},"
                      "\"merges\":[\"a b\"]}}",
                      BN_ERR_FORMAT, "merged");
    expect_json_error("{" BL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}",
                      BN_ERR_FORMAT, "neither");
    expect_json_error("{" BL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3},\"merges\":[]}}",
                      BN_ERR_FORMAT, "not a token id");
    expect_json_error("{" BL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":9000000},\"merges\":[]}}",
                      BN_ERR_FORMAT, "ids go up to");
    expect_json_error("{" BL "\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}",
                      BN_ERR_UNSUPPORTED, "model type");
    expect_json_error("{\"normalizer\":{\"type\":\"NFC\"}," BL
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                      BN_ERR_UNSUPPORTED, "normalizer");
    expect_json_error("{\"pre_tokenizer\":{\"type\":\"Metaspace\"},"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                      BN_ERR_UNSUPPORTED, "Metaspace");
    expect_json_error("{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
                      "\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},"
                      "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                      BN_ERR_FORMAT, "regex");
    expect_json_error("{" BL "\"added_tokens\":[{\"id\":0,\"content\":\"x\",\"special\":true}],"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                      BN_ERR_FORMAT, "two different texts");
    /* A tiny valid one: ids with a hole, which decodes to nothing. */
    const char *p = write_tmp("tokenizer.json",
                              "{" BL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,"
                              "\"ab\":3},\"merges\":[[\"a\",\"b\"]]}}");
    bn_error_clear(&err);
    CHECK_MSG(bn_tokenizer_from_hf_json(p, &t, &err) == BN_OK, "%s", err.message);
    if (t) {
        CHECK(bn_tokenizer_vocab_size(t) == 4 && encode_one(t, "ab", true) == 3);
        char b[4];
        CHECK(bn_token_to_bytes(t, 2, b, sizeof b) == 0);
        CHECK(bn_tokenizer_bos(t) == -1 && !bn_tokenizer_add_bos_default(t));
        bn_tokenizer_free(t);
    }
    /* A tokenizer_config.json beside it names BOS and EOS. */
    write_tmp("tokenizer_config.json", "{\"bos_token\":\"a\",\"eos_token\":{\"content\":\"b\"},"
                                       "\"add_bos_token\":true}");
    t = NULL;
    CHECK(bn_tokenizer_from_hf_json(p, &t, &err) == BN_OK);
    if (t) {
        CHECK(bn_tokenizer_bos(t) == 0 && bn_tokenizer_eos(t) == 1);
        CHECK(bn_tokenizer_add_bos_default(t) && bn_tokenizer_is_eog(t, 1));
        bn_tokenizer_free(t);
    }
    unlink(path_in(tmp_dir, "tokenizer_config.json"));
}

static void expect_spec_error(bn_tokenizer_spec *spec, bn_status want, const char *needle)
{
    bn_tokenizer *t = NULL;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_tokenizer_build(spec, &t, &err);
    CHECK_MSG(st == want, "status %s, expected %s (%s)", bn_status_str(st), bn_status_str(want),
              err.message);
    CHECK(t == NULL);
    CHECK_STR_CONTAINS(err.message, needle);
}

static void test_malformed_spec(void)
{
    bn_tok_str toks[4] = {{"a", 1}, {"b", 1}, {"ab", 2}, {"<0x41>", 6}};
    int32_t types[4] = {1, 1, 1, 6};
    bn_tok_str left[1] = {{"a", 1}}, right[1] = {{"b", 1}};
    bn_tokenizer_spec base = {.kind = BN_TOKENIZER_BYTE_BPE, .n_vocab = 4, .tokens = toks,
                              .types = types, .n_merges = 1, .merge_left = left,
                              .merge_right = right, .bos = -1, .eos = -1, .eot = -1,
                              .eom = -1, .unk = -1};
    bn_tokenizer_spec s = base;
    s.n_vocab = 0;
    expect_spec_error(&s, BN_ERR_FORMAT, "vocabulary is empty");
    s = base;
    s.bos = 4;
    expect_spec_error(&s, BN_ERR_FORMAT, "BOS token id 4");
    s = base;
    s.eot = -7;
    expect_spec_error(&s, BN_ERR_FORMAT, "EOT token id -7");
    s = base;
    int32_t bad_types[4] = {1, 1, 9, 6};
    s.types = bad_types;
    expect_spec_error(&s, BN_ERR_FORMAT, "type 9");
    s = base;
    bn_tok_str bad_byte[4] = {{"a", 1}, {"b", 1}, {"ab", 2}, {"<0xZZ>", 6}};
    s.tokens = bad_byte;
    expect_spec_error(&s, BN_ERR_FORMAT, "not <0xXX>");
    s = base;
    bn_tok_str dup[4] = {{"a", 1}, {"b", 1}, {"a", 1}, {"<0x41>", 6}};
    s.tokens = dup;
    expect_spec_error(&s, BN_ERR_FORMAT, "duplicate token text 'a'");
    s = base;
    s.pre_regex = "[a-";
    expect_spec_error(&s, BN_ERR_FORMAT, "regex");
    CHECK(bn_tokenizer_build(NULL, NULL, NULL) == BN_ERR_INVALID_ARGUMENT);
    /* The same spec is fine as it is. */
    bn_tokenizer *t = NULL;
    CHECK(bn_tokenizer_build(&base, &t, NULL) == BN_OK);
    bn_tokenizer_free(t);
    /* bn_tokenize argument checks. */
    int32_t *ids;
    size_t n;
    CHECK(bn_tokenize(NULL, "x", 1, false, false, &ids, &n, NULL) == BN_ERR_INVALID_ARGUMENT);
    bn_tokenizer_free(NULL);
}

/* Writes a GGUF with the tokenizer keys that the callback sets. */
typedef void (*gguf_fill)(bn_gguf_writer *w);

static bn_status gguf_tokenizer_keep(gguf_fill fill, bn_tokenizer **keep, bn_error *err)
{
    const char *p = path_in(tmp_dir, "tok.gguf");
    bn_gguf_writer *w = NULL;
    CHECK(bn_gguf_writer_create(&w, NULL) == BN_OK);
    bn_gguf_writer_set_str(w, "general.architecture", "llama", NULL);
    fill(w);
    CHECK(bn_gguf_writer_finish(w, p, NULL, NULL, NULL) == BN_OK);
    bn_gguf_writer_free(w);
    bn_gguf *g = NULL;
    bn_tokenizer *t = NULL;
    bn_status st = bn_gguf_open(p, &g, err);
    CHECK_MSG(st == BN_OK, "%s", err->message);
    if (st == BN_OK)
        st = bn_tokenizer_from_gguf(g, &t, err);
    if (keep)
        *keep = t;
    else
        bn_tokenizer_free(t);
    bn_gguf_close(g);
    return st;
}

static bn_status gguf_tokenizer(gguf_fill fill, bn_error *err)
{
    return gguf_tokenizer_keep(fill, NULL, err);
}

static const char *const g_tokens[] = {"a", "b", "ab", "<|eot_id|>"};
static const int32_t g_types[] = {1, 1, 1, 3};

static void fill_base(bn_gguf_writer *w)
{
    bn_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", NULL);
    bn_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", g_tokens, 4, NULL);
    bn_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", g_types, 4, NULL);
}
static void fill_ok(bn_gguf_writer *w)
{
    static const char *const merges[] = {"a b"};
    fill_base(w);
    bn_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1, NULL);
}
static void fill_no_types(bn_gguf_writer *w)
{
    static const char *const merges[] = {"a b"};
    bn_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", NULL);
    bn_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", g_tokens, 4, NULL);
    bn_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1, NULL);
    bn_gguf_writer_set_i32(w, "tokenizer.ggml.eos_token_id", -1, NULL);
}
static void fill_no_tokenizer(bn_gguf_writer *w) { (void)w; }
static void fill_no_tokens(bn_gguf_writer *w)
{
    bn_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", NULL);
}
static void fill_bad_model(bn_gguf_writer *w)
{
    bn_gguf_writer_set_str(w, "tokenizer.ggml.model", "bert", NULL);
}
static void fill_bad_pre(bn_gguf_writer *w)
{
    fill_ok(w);
    bn_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2", NULL);
}
static void fill_no_merges(bn_gguf_writer *w) { fill_base(w); }
static void fill_bad_merge(bn_gguf_writer *w)
{
    static const char *const merges[] = {"a q"};
    fill_base(w);
    bn_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1, NULL);
}
static void fill_bad_bos(bn_gguf_writer *w)
{
    fill_ok(w);
    bn_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 4, NULL);
}
static void fill_short_types(bn_gguf_writer *w)
{
    static const char *const merges[] = {"a b"};
    bn_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", NULL);
    bn_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", g_tokens, 4, NULL);
    bn_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", g_types, 2, NULL);
    bn_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1, NULL);
}
static void fill_tokens_wrong_type(bn_gguf_writer *w)
{
    bn_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", NULL);
    bn_gguf_writer_set_arr_i32(w, "tokenizer.ggml.tokens", g_types, 4, NULL);
}

static void test_malformed_gguf(void)
{
    struct {
        gguf_fill fill;
        bn_status want;
        const char *needle;
    } cases[] = {
        {fill_ok, BN_OK, ""},
        {fill_no_tokenizer, BN_ERR_FORMAT, "tokenizer.ggml.model is missing"},
        {fill_no_tokens, BN_ERR_FORMAT, "tokenizer.ggml.tokens is missing"},
        {fill_bad_model, BN_ERR_UNSUPPORTED, "\"bert\""},
        {fill_bad_pre, BN_ERR_UNSUPPORTED, "\"qwen2\""},
        {fill_no_merges, BN_ERR_FORMAT, "merges is missing"},
        {fill_bad_merge, BN_ERR_FORMAT, "unknown token"},
        {fill_bad_bos, BN_ERR_FORMAT, "BOS token id 4"},
        {fill_short_types, BN_ERR_FORMAT, "fewer entries"},
        {fill_tokens_wrong_type, BN_ERR_FORMAT, "wrong type"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bn_error err;
        bn_error_clear(&err);
        bn_status st = gguf_tokenizer(cases[i].fill, &err);
        CHECK_MSG(st == cases[i].want, "case %zu: %s (%s)", i, bn_status_str(st), err.message);
        CHECK_STR_CONTAINS(err.message, cases[i].needle);
    }
    /* Without token types, an end-of-turn text still acts as a special
     * token (llama.cpp promotes it to CONTROL); a negative id is "none". */
    bn_tokenizer *t = NULL;
    bn_error err;
    CHECK(gguf_tokenizer_keep(fill_no_types, &t, &err) == BN_OK);
    if (t) {
        CHECK(encode_one(t, "<|eot_id|>", true) == 3 && encode_one(t, "<|eot_id|>", false) == -1);
        CHECK(encode_one(t, "ab", true) == 2 && bn_tokenizer_eot(t) == 3);
        CHECK(bn_tokenizer_eos(t) == -1 && bn_tokenizer_is_eog(t, 3));
        CHECK(!bn_tokenizer_add_bos_default(t) || bn_tokenizer_bos(t) == -1);
        bn_tokenizer_free(t);
    }
    unlink(path_in(tmp_dir, "tok.gguf"));
    t = NULL;
    CHECK(bn_tokenizer_from_gguf(NULL, &t, NULL) == BN_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------------------ */
/* The pre-tokenizer: its GGUF name, and the cost of its regex               */
/* ------------------------------------------------------------------------ */

/* The shipped model's test text (~200 KB of prose), found from data_dir
 * (tests/data/tokenizer) or given as argv[2]. */
static char long_text_path[1024];

/* A Split with the regex re (JSON-escaped), then a ByteLevel, over a tiny
 * vocabulary. */
#define SPLIT(re)                                                                          \
    "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","      \
    "\"pattern\":{\"Regex\":\"" re "\"},\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\","   \
    "\"add_prefix_space\":false,\"use_regex\":false}]},\"model\":{\"type\":\"BPE\","           \
    "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}"

static bn_tokenizer *json_tokenizer(const char *content)
{
    const char *p = write_tmp("tokenizer.json", content);
    bn_tokenizer *t = NULL;
    bn_error err;
    bn_error_clear(&err);
    CHECK_MSG(bn_tokenizer_from_hf_json(p, &t, &err) == BN_OK, "%s: %s", content, err.message);
    return t;
}

/* bn_tokenizer_pre_name gives the GGUF tokenizer.ggml.pre that splits as
 * the tokenizer does (what convert writes), NULL when none does. */
static void check_pre(bn_tokenizer *t, const char *what, const char *name, const char *regex)
{
    if (!t)
        return;
    const char *got = bn_tokenizer_pre_name(t), *re = bn_tokenizer_pre_regex(t);
    CHECK_MSG(name ? got && strcmp(got, name) == 0 : got == NULL, "%s: pre name %s, want %s",
              what, got ? got : "NULL", name ? name : "NULL");
    CHECK_MSG(regex ? re && strcmp(re, regex) == 0 : re == NULL, "%s: pre regex %.60s", what,
              re ? re : "NULL");
    bn_tokenizer_free(t);
}

static void test_pre_name(void)
{
    check_pre(open_json(path_in(data_dir, "bpe.json")), "bpe.json", "llama-bpe",
              bn_tok_llama3_regex);
    bn_tokenizer *t = open_json(path_in(data_dir, "bpe_legacy.json"));
    CHECK(t && !bn_tokenizer_ignore_merges(t));
    check_pre(t, "bpe_legacy.json", "llama-bpe", bn_tok_llama3_regex);
    t = open_gguf(path_in(data_dir, "bpe.gguf"));
    CHECK(t && bn_tokenizer_ignore_merges(t));
    check_pre(t, "bpe.gguf", "llama-bpe", bn_tok_llama3_regex);
    check_pre(open_gguf(path_in(data_dir, "bpe_nopre.gguf")), "bpe_nopre.gguf", "llama-bpe",
              bn_tok_llama3_regex);
    check_pre(open_gguf(path_in(data_dir, "spm.gguf")), "spm.gguf", NULL, NULL);
    /* Regexes no GGUF name stands for: a custom Split, GPT-2's ByteLevel. */
    check_pre(json_tokenizer(SPLIT("\\\\X")), "Split \\X", NULL, "\\X");
    check_pre(json_tokenizer("{" BL "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
                             "\"merges\":[]}}"),
              "ByteLevel with its regex", NULL, bn_tok_gpt2_regex);
}

/* Encodes text and expects success (the regex stays within its budget). */
static void check_affordable(const bn_tokenizer *t, const char *what, const char *text,
                             size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_tokenize(t, text, len, false, true, &ids, &n, &err);
    CHECK_MSG(st == BN_OK, "%s: %zu bytes: %s", what, len, err.message);
    free(ids);
}

static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *s = malloc(1 << 20);
    *len = s ? fread(s, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    return s;
}

/* A pre-tokenizer regex that backtracks catastrophically must be refused
 * as a malformed file, and quickly: (?:.?){21} tries 2^21 ways to take up
 * to 21 characters before it fails at U+10FFFF, at every position (about
 * 4 s for 1000 bytes with PCRE2's JIT, a minute with its interpreter, when
 * only each call's match limit bounds it). Known and merely custom regexes
 * on long ordinary and degenerate texts stay well within the budget. */
static void test_costly_regex(void)
{
    bn_tokenizer *t = json_tokenizer(SPLIT("(?:.?){21}\\\\x{10FFFF}|."));
    char text[1001];
    memset(text, 'a', 1000);
    text[1000] = '\0';
    if (t) {
        int32_t *ids = NULL;
        size_t n = 0;
        bn_error err;
        bn_error_clear(&err);
        bn_status st = bn_tokenize(t, text, 1000, false, true, &ids, &n, &err);
        CHECK_MSG(st == BN_ERR_FORMAT, "costly regex: status %s", bn_status_str(st));
        CHECK_STR_CONTAINS(err.message, "too costly");
        CHECK_STR_CONTAINS(err.message, "(?:.?){21}");
        CHECK(ids == NULL);
        bn_tokenizer_free(t);
    }
    bn_tokenizer *ts[3] = {open_json(path_in(data_dir, "bpe.json")),
                           json_tokenizer("{" BL "\"model\":{\"type\":\"BPE\",\"vocab\":"
                                          "{\"a\":0},\"merges\":[]}}"),
                           json_tokenizer(SPLIT("\\\\X"))};
    static const char *const names[3] = {"LLaMA-3 regex", "GPT-2 regex", "custom \\X"};
    const char *paths[2] = {path_in(data_dir, "corpus.txt"), long_text_path};
    for (int k = 0; k < 3; k++) {
        if (!ts[k])
            continue;
        for (int i = 0; i < 2; i++) {
            size_t len = 0;
            char *s = read_text(paths[i], &len);
            CHECK_MSG(s != NULL, "cannot read %s", paths[i]);
            if (s)
                check_affordable(ts[k], names[k], s, len);
            free(s);
        }
        static const char *const fills[] = {" ", "\n", " \n", "a", "7", "!", "ab ", "1a", "\xff"};
        char *s = malloc(200001);
        for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
            size_t m = strlen(fills[f]), i = 0;
            for (; i + m <= 200000; i += m)
                memcpy(s + i, fills[f], m);
            check_affordable(ts[k], names[k], s, i);
        }
        free(s);
        bn_tokenizer_free(ts[k]);
    }
}

/* ------------------------------------------------------------------------ */
/* The real LLaMA-3 vocabulary, when the environment points at it            */
/* ------------------------------------------------------------------------ */

static void test_llama3(void)
{
    const char *json = getenv("BN_LLAMA3_TOKENIZER"), *gguf = getenv("BN_LLAMA3_GGUF");
    if (!json && !gguf) {
        printf("note: BN_LLAMA3_TOKENIZER / BN_LLAMA3_GGUF unset, real LLaMA-3 check skipped\n");
        return;
    }
    cJSON *refs = load_json("llama3_refs.json");
    CHECK(refs != NULL);
    if (json) {
        bn_tokenizer *t = open_json(json);
        if (t) {
            check_refs(t, "llama3 json", cJSON_GetObjectItem(refs, "file"), true);
            CHECK(bn_tokenizer_vocab_size(t) >= 128256 && bn_tokenizer_bos(t) == 128000);
            CHECK(bn_tokenizer_is_eog(t, 128001) && bn_tokenizer_is_eog(t, 128009));
            CHECK(bn_tokenizer_is_eog(t, 128008)); /* <|eom_id|> */
            check_long_inputs(t, "llama3 json");
            bn_tokenizer_free(t);
        }
    }
    if (gguf) {
        bn_tokenizer *t = open_gguf(gguf);
        if (t) {
            check_refs(t, "llama3 gguf", cJSON_GetObjectItem(refs, "ignore_merges"), true);
            bn_tokenizer_free(t);
        }
    }
    cJSON_Delete(refs);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s tests/data/tokenizer [long-text-file]\n", argv[0]);
        return 2;
    }
    data_dir = argv[1];
    snprintf(long_text_path, sizeof long_text_path, "%s",
             argc > 2 ? argv[2] : path_in(data_dir, "../../../models/bitnet-kjv-7m/test.txt"));
    test_seed_init();
    const char *tmp = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/bn_tok_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "cannot create a temporary directory\n");
        return 1;
    }
    test_bpe();
    test_spm();
    test_chat();
    test_malformed_json();
    test_malformed_spec();
    test_malformed_gguf();
    test_pre_name();
    test_costly_regex();
    test_llama3();
    unlink(path_in(tmp_dir, "tokenizer.json"));
    rmdir(tmp_dir);
    TEST_EXIT();
}
