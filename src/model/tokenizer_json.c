/*
 * tokenizer_json.c - a tokenizer from a Hugging Face tokenizer.json.
 *
 * Supported: model type "BPE" with a byte-level pre-tokenizer, which is
 * what LLaMA 3 (and GPT-2) use:
 *   - model.vocab {text: id}; model.merges as "A B" strings or as
 *     ["A", "B"] pairs (newer files); model.ignore_merges (default false);
 *   - pre_tokenizer: an optional Split with a Regex pattern and behaviour
 *     "Isolated" (LLaMA 3's regex lives there), and a ByteLevel without
 *     add_prefix_space; a ByteLevel with use_regex and no Split means
 *     GPT-2's regex;
 *   - added_tokens: special ones become CONTROL tokens (matched in the
 *     text only with parse_special), the others USER_DEFINED (always
 *     matched), as Hugging Face's added vocabulary treats them;
 *   - BOS: the special token that post_processor's TemplateProcessing puts
 *     in front of a single sequence (which also makes add_bos the
 *     default). EOS is <|end_of_text|>, </s> or <|endoftext|>, whichever
 *     exists; EOT <|eot_id|>.
 * A tokenizer_config.json beside the file, when there is one, overrides
 * bos_token, eos_token and add_bos_token.
 * Anything else (a normalizer, SentencePiece-style BPE, WordPiece, ...)
 * is refused with BN_ERR_UNSUPPORTED rather than tokenized differently.
 */
#include "tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char HINT[] = "check that the file is an unmodified Hugging Face tokenizer.json";

/* Files larger than this are not tokenizers (LLaMA 3's is 9 MB). */
#define MAX_JSON_BYTES (512u << 20)

static bn_status read_file(const char *path, char **data, size_t *size, bool optional,
                           bn_error *err)
{
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (optional && errno == ENOENT)
            return BN_OK;
        return bn_error_set(err, BN_ERR_IO, "check the path", "cannot open %s: %s", path,
                            strerror(errno));
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    bn_status st = BN_OK;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 1 << 16;
            char *p = cap <= MAX_JSON_BYTES ? realloc(buf, cap + 1) : NULL;
            if (!p) {
                st = cap > MAX_JSON_BYTES
                         ? bn_error_set(err, BN_ERR_FORMAT, HINT, "%s is too large", path)
                         : bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory reading %s", path);
                break;
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                st = bn_error_set(err, BN_ERR_IO, NULL, "cannot read %s", path);
            break;
        }
    }
    fclose(f);
    if (st != BN_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *data = buf;
    *size = n;
    return BN_OK;
}

static bool is_type(const cJSON *node, const char *type)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(node, "type");
    return cJSON_IsString(t) && strcmp(t->valuestring, type) == 0;
}

static bool flag(const cJSON *node, const char *key, bool def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* A non-negative integer id below 2^28, or -1. */
static int32_t json_id(const cJSON *v)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (1 << 28) ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return -1;
    return (int32_t)v->valuedouble;
}

/* Everything the builder is given; freed by release(). */
typedef struct json_arrays {
    bn_tok_str *tokens;
    int32_t *types;
    bn_tok_str *left, *right;
} json_arrays;

static void release(json_arrays *a)
{
    free(a->tokens);
    free(a->types);
    free(a->left);
    free(a->right);
}

/* Sets one token, refusing an id given two different texts. */
static bn_status put_token(json_arrays *a, int32_t id, const char *text, int type, bn_error *err)
{
    size_t len = strlen(text);
    bn_tok_str *slot = &a->tokens[id];
    if (slot->ptr && (slot->len != len || memcmp(slot->ptr, text, len) != 0))
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "token id %d is given two different texts",
                            id);
    *slot = (bn_tok_str){text, len};
    a->types[id] = type;
    return BN_OK;
}

static bn_status read_vocab(const cJSON *model, const cJSON *added, bn_tokenizer_spec *spec,
                            json_arrays *a, bn_error *err)
{
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab) || !vocab->child)
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "model.vocab is missing or empty");
    int32_t n = 0, entries = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = json_id(it);
        entries++;
        if (id < 0)
            return bn_error_set(err, BN_ERR_FORMAT, HINT, "model.vocab[\"%.40s\"] is not a token id",
                                it->string);
        n = id + 1 > n ? id + 1 : n;
    }
    cJSON_ArrayForEach(it, added) {
        int32_t id = json_id(cJSON_GetObjectItemCaseSensitive(it, "id"));
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (id < 0 || !cJSON_IsString(content))
            return bn_error_set(err, BN_ERR_FORMAT, HINT, "an added_tokens entry has no id or content");
        n = id + 1 > n ? id + 1 : n;
        entries++;
    }
    /* A few unused ids are fine; a vocabulary that is mostly holes is not
     * (and would make us allocate for ids nobody uses). */
    if (n > 4 * entries + 65536)
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "token ids go up to %d for %d tokens", n - 1,
                            entries);
    a->tokens = calloc((size_t)n, sizeof *a->tokens);
    a->types = malloc((size_t)n * sizeof *a->types);
    if (!a->tokens || !a->types)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the vocabulary");
    for (int32_t i = 0; i < n; i++)
        a->types[i] = BN_TOKEN_UNUSED; /* ids nobody names stay empty */
    bn_status st = BN_OK;
    cJSON_ArrayForEach(it, vocab) {
        if ((st = put_token(a, json_id(it), it->string, BN_TOKEN_NORMAL, err)) != BN_OK)
            return st;
    }
    cJSON_ArrayForEach(it, added) {
        int type = flag(it, "special", false) ? BN_TOKEN_CONTROL : BN_TOKEN_USER_DEFINED;
        int32_t id = json_id(cJSON_GetObjectItemCaseSensitive(it, "id"));
        const char *text = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        if ((st = put_token(a, id, text, type, err)) != BN_OK)
            return st;
    }
    spec->n_vocab = n;
    spec->tokens = a->tokens;
    spec->types = a->types;
    return BN_OK;
}

static bn_status read_merges(const cJSON *model, bn_tokenizer_spec *spec, json_arrays *a,
                             bn_error *err)
{
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges))
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "model.merges is missing");
    int n = cJSON_GetArraySize(merges);
    a->left = malloc(((size_t)n + 1) * sizeof *a->left);
    a->right = malloc(((size_t)n + 1) * sizeof *a->right);
    if (!a->left || !a->right)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the merges");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        bool ok = false;
        if (cJSON_IsString(m)) {
            ok = bn_tok_split_merge(m->valuestring, strlen(m->valuestring), &a->left[i], &a->right[i]);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
            const cJSON *l = cJSON_GetArrayItem(m, 0), *r = cJSON_GetArrayItem(m, 1);
            ok = cJSON_IsString(l) && cJSON_IsString(r);
            if (ok) {
                a->left[i] = (bn_tok_str){l->valuestring, strlen(l->valuestring)};
                a->right[i] = (bn_tok_str){r->valuestring, strlen(r->valuestring)};
            }
        }
        if (!ok)
            return bn_error_set(err, BN_ERR_FORMAT, HINT,
                                "model.merges[%d] is neither \"A B\" nor [\"A\", \"B\"]", i);
        i++;
    }
    spec->n_merges = n;
    spec->merge_left = a->left;
    spec->merge_right = a->right;
    return BN_OK;
}

static bn_status unsupported(bn_error *err, const char *what)
{
    return bn_error_set(err, BN_ERR_UNSUPPORTED,
                        "only byte-level BPE tokenizer.json files (LLaMA 3, GPT-2) are supported",
                        "tokenizer.json: %s is not supported", what);
}

/* One pre-tokenizer step: a Split gives the regex, a ByteLevel the byte
 * mapping (and GPT-2's regex when it splits by itself). */
static bn_status read_pre_step(const cJSON *p, const char **regex, bool *byte_level, bn_error *err)
{
    if (is_type(p, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        if (!cJSON_IsString(re))
            return unsupported(err, "a Split on a plain string");
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0 ||
            flag(p, "invert", false))
            return unsupported(err, "a Split whose behaviour is not Isolated");
        if (*regex || *byte_level)
            return unsupported(err, "more than one splitting pre-tokenizer");
        *regex = re->valuestring;
        return BN_OK;
    }
    if (is_type(p, "ByteLevel")) {
        if (flag(p, "add_prefix_space", true))
            return unsupported(err, "ByteLevel with add_prefix_space");
        if (flag(p, "use_regex", true)) {
            if (*regex)
                return unsupported(err, "more than one splitting pre-tokenizer");
            *regex = bn_tok_gpt2_regex;
        }
        *byte_level = true;
        return BN_OK;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type");
    char what[96];
    snprintf(what, sizeof what, "pre-tokenizer %.60s", cJSON_IsString(t) ? t->valuestring : "?");
    return unsupported(err, what);
}

static bn_status read_pre(const cJSON *root, bn_tokenizer_spec *spec, bn_error *err)
{
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm))
        return unsupported(err, "a normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const char *regex = NULL;
    bool byte_level = false;
    bn_status st = BN_OK;
    if (is_type(pre, "Sequence")) {
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers")) {
            if ((st = read_pre_step(p, &regex, &byte_level, err)) != BN_OK)
                return st;
        }
    } else if (cJSON_IsObject(pre)) {
        st = read_pre_step(pre, &regex, &byte_level, err);
    }
    if (st == BN_OK && !byte_level)
        st = unsupported(err, "a BPE without a ByteLevel pre-tokenizer");
    spec->pre_regex = regex ? regex : bn_tok_llama3_regex;
    return st;
}

static int32_t find_text(const bn_tokenizer_spec *spec, const char *text)
{
    size_t n = strlen(text);
    for (int32_t i = spec->n_vocab - 1; i >= 0; i--)
        if (spec->tokens[i].ptr && spec->tokens[i].len == n &&
            memcmp(spec->tokens[i].ptr, text, n) == 0)
            return i;
    return -1;
}

/* The special token that TemplateProcessing puts first, or NULL. */
static const char *template_bos(const cJSON *proc)
{
    if (is_type(proc, "Sequence")) {
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(proc, "processors")) {
            const char *bos = template_bos(p);
            if (bos)
                return bos;
        }
        return NULL;
    }
    if (!is_type(proc, "TemplateProcessing"))
        return NULL;
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(proc, "single"), 0);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id");
    return cJSON_IsString(id) ? id->valuestring : NULL;
}

/* A token named in tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(const cJSON *config, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bn_status read_config(const char *path, bn_tokenizer_spec *spec, bn_error *err)
{
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    char *cfg_path = malloc(dir + sizeof "tokenizer_config.json");
    if (!cfg_path)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory");
    memcpy(cfg_path, path, dir);
    strcpy(cfg_path + dir, "tokenizer_config.json");
    char *data;
    size_t size;
    bn_status st = read_file(cfg_path, &data, &size, true, err);
    cJSON *config = st == BN_OK && data ? cJSON_ParseWithLength(data, size) : NULL;
    if (st == BN_OK && data && !cJSON_IsObject(config))
        st = bn_error_set(err, BN_ERR_FORMAT, "fix or remove it", "%s is not valid JSON", cfg_path);
    if (st == BN_OK && config) {
        const char *bos = config_token(config, "bos_token");
        const char *eos = config_token(config, "eos_token");
        if (bos)
            spec->bos = find_text(spec, bos);
        if (eos)
            spec->eos = find_text(spec, eos);
        spec->add_bos = flag(config, "add_bos_token", spec->add_bos);
    }
    cJSON_Delete(config);
    free(data);
    free(cfg_path);
    return st;
}

static void read_special(const cJSON *root, bn_tokenizer_spec *spec)
{
    const char *bos = template_bos(cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    spec->bos = bos ? find_text(spec, bos) : find_text(spec, "<|begin_of_text|>");
    spec->add_bos = bos && spec->bos >= 0;
    static const char *const eos_texts[] = {"<|end_of_text|>", "</s>", "<|endoftext|>"};
    for (int i = 0; i < 3 && spec->eos < 0; i++)
        spec->eos = find_text(spec, eos_texts[i]);
}

static bn_status from_json(const cJSON *root, const char *path, bn_tokenizer **out,
                           bn_error *err)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model))
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "%s has no \"model\" object", path);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !is_type(model, "BPE"))
        return unsupported(err, "a model type other than BPE");
    if (flag(model, "byte_fallback", false))
        return unsupported(err, "BPE with byte_fallback (SentencePiece style)");
    bn_tokenizer_spec spec = {.kind = BN_TOKENIZER_BYTE_BPE, .bos = -1, .eos = -1, .eot = -1,
                              .eom = -1, .unk = -1};
    spec.ignore_merges = flag(model, "ignore_merges", false);
    json_arrays a = {0};
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    bn_status st = read_pre(root, &spec, err);
    if (st == BN_OK) st = read_vocab(model, added, &spec, &a, err);
    if (st == BN_OK) st = read_merges(model, &spec, &a, err);
    if (st == BN_OK) {
        read_special(root, &spec);
        st = read_config(path, &spec, err);
    }
    if (st == BN_OK)
        st = bn_tokenizer_build(&spec, out, err);
    release(&a);
    return st;
}

bn_status bn_tokenizer_from_hf_json(const char *path, bn_tokenizer **out, bn_error *err)
{
    if (!path || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_tokenizer_from_hf_json needs a path and an output pointer");
    *out = NULL;
    char *data;
    size_t size;
    bn_status st = read_file(path, &data, &size, false, err);
    if (st != BN_OK)
        return st;
    cJSON *root = cJSON_ParseWithLength(data, size);
    if (!cJSON_IsObject(root))
        st = bn_error_set(err, BN_ERR_FORMAT, HINT, "%s is not a valid JSON object", path);
    else
        st = from_json(root, path, out, err);
    cJSON_Delete(root);
    free(data);
    return st;
}
