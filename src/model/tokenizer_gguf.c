/*
 * tokenizer_gguf.c - a tokenizer from GGUF tokenizer.ggml.* metadata.
 *
 * Keys read (llama.cpp's names):
 *   model            "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
 *   pre              byte-level pre-tokenizer: "llama-bpe", "llama3" or
 *                    "llama-v3" (LLaMA-3 regex, ignore_merges, BOS added by
 *                    default, as llama.cpp sets them). When the key is
 *                    absent, as in Microsoft's official BitNet 2B-4T file
 *                    (a 128256-token LLaMA-3 vocabulary), LLaMA-3 is
 *                    assumed: it is the only byte-level family this runtime
 *                    targets. llama.cpp would fall back to a generic GPT-2
 *                    style split and warn that quality degrades.
 *   tokens, token_type, scores, merges ("A B" strings)
 *   bos/eos/eot/eom/unknown_token_id, add_bos_token, add_space_prefix
 * Defaults where a key is absent: SPM BOS 1, EOS 2, UNK 0 (as llama.cpp);
 * byte-level BOS/EOS looked up as <|begin_of_text|> / <|end_of_text|>;
 * EOT/EOM as <|eot_id|> / <|eom_id|>.
 */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

static const char HINT[] = "the GGUF file's tokenizer metadata is malformed; re-convert the model";

/* An array key of the given element type, or NULL (absent). A present key
 * of another type is an error. */
static bn_status get_array(const bn_gguf *g, const char *key, bn_gguf_type elem, bool numeric,
                           const bn_gguf_kv **kv, bn_error *err)
{
    *kv = bn_gguf_find(g, key);
    if (!*kv)
        return BN_OK;
    bool ok = (*kv)->type == BN_GGUF_ARRAY &&
              (numeric ? (*kv)->elem_type != BN_GGUF_STRING && (*kv)->elem_type != BN_GGUF_ARRAY &&
                             (*kv)->elem_type != BN_GGUF_BOOL
                       : (*kv)->elem_type == elem);
    if (!ok)
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "%s has the wrong type (%s)", key,
                            (*kv)->type == BN_GGUF_ARRAY ? bn_gguf_type_name((*kv)->elem_type)
                                                         : bn_gguf_type_name((*kv)->type));
    return BN_OK;
}

/* An optional integer key: -1 when absent or negative. */
static bn_status get_id(const bn_gguf *g, const char *key, int32_t *id, bn_error *err)
{
    if (!bn_gguf_find(g, key))
        return BN_OK; /* absent: keep the default */
    int64_t v;
    bn_status st = bn_gguf_get_i64(g, key, &v, err);
    if (st != BN_OK)
        return st;
    if (v >= INT32_MAX)
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "%s = %lld is not a token id", key,
                            (long long)v);
    *id = v < 0 ? -1 : (int32_t)v;
    return BN_OK;
}

static bn_status get_flag(const bn_gguf *g, const char *key, bool *flag, bn_error *err)
{
    if (!bn_gguf_find(g, key))
        return BN_OK;
    bool v;
    bn_status st = bn_gguf_get_bool(g, key, &v, err);
    if (st == BN_OK)
        *flag = v;
    return st;
}

static bool str_is(bn_gguf_str s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

/* What one file gives the builder; freed by release(). */
typedef struct gguf_arrays {
    bn_tok_str *tokens;
    int32_t *types;
    float *scores;
    bn_tok_str *left, *right;
} gguf_arrays;

static void release(gguf_arrays *a)
{
    free(a->tokens);
    free(a->types);
    free(a->scores);
    free(a->left);
    free(a->right);
}

static bn_status read_kind(const bn_gguf *g, bn_tokenizer_spec *spec, bn_error *err)
{
    if (!bn_gguf_find(g, "tokenizer.ggml.model"))
        return bn_error_set(err, BN_ERR_FORMAT, "this GGUF file has no tokenizer; use a full model file",
                            "tokenizer.ggml.model is missing");
    bn_gguf_str model;
    bn_status st = bn_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (st != BN_OK)
        return st;
    if (str_is(model, "gpt2"))
        spec->kind = BN_TOKENIZER_BYTE_BPE;
    else if (str_is(model, "llama"))
        spec->kind = BN_TOKENIZER_SPM_BPE;
    else
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "supported: \"gpt2\" and \"llama\"",
                            "tokenizer model \"%.*s\" is not supported",
                            (int)(model.len > 64 ? 64 : model.len), model.ptr);
    return BN_OK;
}

static bn_status read_pre(const bn_gguf *g, bn_tokenizer_spec *spec, bn_error *err)
{
    if (spec->kind != BN_TOKENIZER_BYTE_BPE)
        return BN_OK;
    spec->pre_regex = bn_tok_llama3_regex;
    spec->ignore_merges = true;
    spec->add_bos = true;
    if (!bn_gguf_find(g, "tokenizer.ggml.pre"))
        return BN_OK; /* Microsoft's 2B-4T file: LLaMA-3 (see the top) */
    bn_gguf_str pre;
    bn_status st = bn_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
    if (st != BN_OK)
        return st;
    if (str_is(pre, "llama-bpe") || str_is(pre, "llama3") || str_is(pre, "llama-v3"))
        return BN_OK;
    return bn_error_set(err, BN_ERR_UNSUPPORTED,
                        "supported pre-tokenizers: llama-bpe, llama3 (or none)",
                        "pre-tokenizer \"%.*s\" is not supported",
                        (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
}

static bn_status read_tokens(const bn_gguf *g, bn_tokenizer_spec *spec, gguf_arrays *a,
                             bn_error *err)
{
    const bn_gguf_kv *kv;
    bn_status st = get_array(g, "tokenizer.ggml.tokens", BN_GGUF_STRING, false, &kv, err);
    if (st != BN_OK)
        return st;
    if (!kv || kv->count == 0)
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "tokenizer.ggml.tokens is %s",
                            kv ? "empty" : "missing");
    if (kv->count >= INT32_MAX)
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "tokenizer.ggml.tokens has %llu entries",
                            (unsigned long long)kv->count);
    spec->n_vocab = (int32_t)kv->count;
    a->tokens = malloc((size_t)kv->count * sizeof *a->tokens);
    if (!a->tokens)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the vocabulary");
    for (uint64_t i = 0; i < kv->count; i++) {
        bn_gguf_str s;
        if ((st = bn_gguf_array_str(kv, i, &s, err)) != BN_OK)
            return st;
        a->tokens[i] = (bn_tok_str){s.ptr, (size_t)s.len};
    }
    spec->tokens = a->tokens;
    return BN_OK;
}

/* token_type and scores: optional, one entry per token. */
static bn_status read_per_token(const bn_gguf *g, bn_tokenizer_spec *spec, gguf_arrays *a,
                                bn_error *err)
{
    const bn_gguf_kv *types, *scores;
    bn_status st = get_array(g, "tokenizer.ggml.token_type", BN_GGUF_INT32, true, &types, err);
    if (st == BN_OK)
        st = get_array(g, "tokenizer.ggml.scores", BN_GGUF_FLOAT32, true, &scores, err);
    if (st != BN_OK)
        return st;
    size_t n = (size_t)spec->n_vocab;
    if ((types && types->count < n) || (scores && scores->count < n))
        return bn_error_set(err, BN_ERR_FORMAT, HINT,
                            "tokenizer.ggml.%s has fewer entries than tokenizer.ggml.tokens (%zu)",
                            types && types->count < n ? "token_type" : "scores", n);
    if (types) {
        if (!(a->types = malloc(n * sizeof *a->types)))
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory");
        for (size_t i = 0; i < n; i++) {
            int64_t v;
            if ((st = bn_gguf_array_i64(types, i, &v, err)) != BN_OK)
                return st;
            a->types[i] = v < 0 || v > 255 ? 0 : (int32_t)v; /* the builder rejects 0 */
        }
        spec->types = a->types;
    }
    if (scores) {
        if (!(a->scores = malloc(n * sizeof *a->scores)))
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory");
        for (size_t i = 0; i < n; i++)
            if ((st = bn_gguf_array_f32(scores, i, &a->scores[i], err)) != BN_OK)
                return st;
        spec->scores = a->scores;
    }
    return BN_OK;
}

static bn_status read_merges(const bn_gguf *g, bn_tokenizer_spec *spec, gguf_arrays *a,
                             bn_error *err)
{
    if (spec->kind != BN_TOKENIZER_BYTE_BPE)
        return BN_OK;
    const bn_gguf_kv *kv;
    bn_status st = get_array(g, "tokenizer.ggml.merges", BN_GGUF_STRING, false, &kv, err);
    if (st != BN_OK)
        return st;
    if (!kv)
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "tokenizer.ggml.merges is missing");
    if (kv->count >= INT32_MAX)
        return bn_error_set(err, BN_ERR_FORMAT, HINT, "too many merges");
    size_t n = (size_t)kv->count;
    a->left = malloc((n + 1) * sizeof *a->left);
    a->right = malloc((n + 1) * sizeof *a->right);
    if (!a->left || !a->right)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory for the merges");
    for (size_t i = 0; i < n; i++) {
        bn_gguf_str s;
        if ((st = bn_gguf_array_str(kv, i, &s, err)) != BN_OK)
            return st;
        if (!bn_tok_split_merge(s.ptr, (size_t)s.len, &a->left[i], &a->right[i]))
            return bn_error_set(err, BN_ERR_FORMAT, HINT,
                                "merge %zu (\"%.*s\") is not two tokens separated by a space", i,
                                (int)(s.len > 40 ? 40 : s.len), s.ptr);
    }
    spec->n_merges = (int32_t)n;
    spec->merge_left = a->left;
    spec->merge_right = a->right;
    return BN_OK;
}

static int32_t find_text(const bn_tokenizer_spec *spec, const char *text)
{
    size_t n = strlen(text);
    for (int32_t i = spec->n_vocab - 1; i >= 0; i--)
        if (spec->tokens[i].len == n && memcmp(spec->tokens[i].ptr, text, n) == 0)
            return i;
    return -1;
}

static bn_status read_special(const bn_gguf *g, bn_tokenizer_spec *spec, bn_error *err)
{
    if (spec->kind == BN_TOKENIZER_SPM_BPE) {
        spec->bos = spec->n_vocab > 1 ? 1 : -1;
        spec->eos = spec->n_vocab > 2 ? 2 : -1;
        spec->unk = 0;
        spec->add_bos = true;
        spec->add_space_prefix = true;
    } else {
        /* Found by text only when the keys are absent (a linear scan). */
        if (!bn_gguf_find(g, "tokenizer.ggml.bos_token_id"))
            spec->bos = find_text(spec, "<|begin_of_text|>");
        if (!bn_gguf_find(g, "tokenizer.ggml.eos_token_id"))
            spec->eos = find_text(spec, "<|end_of_text|>");
    }
    bn_status st = BN_OK;
    if (st == BN_OK) st = get_id(g, "tokenizer.ggml.bos_token_id", &spec->bos, err);
    if (st == BN_OK) st = get_id(g, "tokenizer.ggml.eos_token_id", &spec->eos, err);
    if (st == BN_OK) st = get_id(g, "tokenizer.ggml.eot_token_id", &spec->eot, err);
    if (st == BN_OK) st = get_id(g, "tokenizer.ggml.eom_token_id", &spec->eom, err);
    if (st == BN_OK) st = get_id(g, "tokenizer.ggml.unknown_token_id", &spec->unk, err);
    if (st == BN_OK) st = get_flag(g, "tokenizer.ggml.add_bos_token", &spec->add_bos, err);
    if (st == BN_OK) st = get_flag(g, "tokenizer.ggml.add_space_prefix", &spec->add_space_prefix, err);
    return st;
}

bn_status bn_tokenizer_from_gguf(const bn_gguf *g, bn_tokenizer **out, bn_error *err)
{
    if (!g || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_tokenizer_from_gguf needs a file and an output pointer");
    *out = NULL;
    bn_tokenizer_spec spec = {.bos = -1, .eos = -1, .eot = -1, .eom = -1, .unk = -1};
    gguf_arrays a = {0};
    bn_status st = read_kind(g, &spec, err);
    if (st == BN_OK) st = read_pre(g, &spec, err);
    if (st == BN_OK) st = read_tokens(g, &spec, &a, err);
    if (st == BN_OK) st = read_per_token(g, &spec, &a, err);
    if (st == BN_OK) st = read_merges(g, &spec, &a, err);
    if (st == BN_OK) st = read_special(g, &spec, err);
    if (st == BN_OK) st = bn_tokenizer_build(&spec, out, err);
    release(&a);
    return st;
}
