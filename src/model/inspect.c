/*
 * inspect.c - what a model file holds, whether or not bitnet can run it
 * (bn_inspect; `bitnet inspect` prints it): GGUF metadata and tensor
 * table, a Hugging Face directory's config and tensors, a single
 * .safetensors file's tensors, then whether bitnet can run it (flavour
 * and hyper-parameters) or why not. As text for people or as one JSON
 * object.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bitnet.h"
#include "gguf.h"
#include "model.h"
#include "qtype.h"
#include "safetensors.h"
#include "tokenizer.h"

/* Arrays longer than this are summarised as "[N strings]". */
#define ARRAY_SHOWN 16
/* Strings longer than this are cut in the text report (chat templates). */
#define STRING_SHOWN 160

/* ---- values ------------------------------------------------------------------ */

static const char *type_name(uint32_t t, char *buf, size_t size)
{
    const bn_qtype_info *q = bn_qtype_get((bn_qtype)t);
    if (q)
        return q->name;
    snprintf(buf, size, "ggml type %u", t);
    return buf;
}

static void shape_text(const int64_t *dims, int n, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)dims[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

/* A string for a one-line report: escapes control characters, cut at max
 * bytes. */
static void print_escaped(FILE *out, const char *s, uint64_t len, uint64_t max)
{
    fputc('"', out);
    for (uint64_t i = 0; i < len && i < max; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", out);
        else if (c == '\t')
            fputs("\\t", out);
        else if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
    if (len > max)
        fprintf(out, "... (%llu bytes)", (unsigned long long)len);
}

static char *dup_str(bn_gguf_str s)
{
    char *p = malloc(s.len + 1);
    if (p) {
        memcpy(p, s.ptr, s.len);
        p[s.len] = '\0';
    }
    return p;
}

static bool is_signed(bn_gguf_type t)
{
    return t == BN_GGUF_INT8 || t == BN_GGUF_INT16 || t == BN_GGUF_INT32 || t == BN_GGUF_INT64;
}


/* Numeric array element i, read from the mapping as stored (little-endian,
 * the only byte order bitnet reads): the getters of gguf.h cover the common
 * cases but not u64 beyond INT64_MAX or bool. */
typedef struct num {
    enum { NUM_INT, NUM_UINT, NUM_FLOAT, NUM_BOOL } kind;
    int64_t i;
    uint64_t u;
    double f;
} num;

static size_t elem_size(bn_gguf_type t)
{
    switch (t) {
    case BN_GGUF_UINT8:
    case BN_GGUF_INT8:
    case BN_GGUF_BOOL: return 1;
    case BN_GGUF_UINT16:
    case BN_GGUF_INT16: return 2;
    case BN_GGUF_UINT32:
    case BN_GGUF_INT32:
    case BN_GGUF_FLOAT32: return 4;
    default: return 8;
    }
}

static num array_num(const bn_gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = kv->elems + i * elem_size(kv->elem_type);
    num n = {NUM_INT, 0, 0, 0.0};
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        uint64_t u64;
        int64_t i64;
        double f64;
    } v;
    memcpy(&v, p, elem_size(kv->elem_type));
    switch (kv->elem_type) {
    case BN_GGUF_UINT8: n.kind = NUM_UINT, n.u = v.u8; break;
    case BN_GGUF_INT8: n.i = v.i8; break;
    case BN_GGUF_UINT16: n.kind = NUM_UINT, n.u = v.u16; break;
    case BN_GGUF_INT16: n.i = v.i16; break;
    case BN_GGUF_UINT32: n.kind = NUM_UINT, n.u = v.u32; break;
    case BN_GGUF_INT32: n.i = v.i32; break;
    case BN_GGUF_UINT64: n.kind = NUM_UINT, n.u = v.u64; break;
    case BN_GGUF_INT64: n.i = v.i64; break;
    case BN_GGUF_FLOAT32: n.kind = NUM_FLOAT, n.f = v.f32; break;
    case BN_GGUF_FLOAT64: n.kind = NUM_FLOAT, n.f = v.f64; break;
    case BN_GGUF_BOOL: n.kind = NUM_BOOL, n.u = v.u8 != 0; break;
    default: break;
    }
    return n;
}

static void array_summary(const bn_gguf_kv *kv, char *buf, size_t size)
{
    snprintf(buf, size, "[%llu %s%s]", (unsigned long long)kv->count,
             kv->elem_type == BN_GGUF_STRING ? "string" : bn_gguf_type_name(kv->elem_type),
             kv->count == 1 ? "" : "s");
}

static void print_value_text(FILE *out, const bn_gguf_kv *kv)
{
    switch (kv->type) {
    case BN_GGUF_STRING: print_escaped(out, kv->v.str.ptr, kv->v.str.len, STRING_SHOWN); break;
    case BN_GGUF_BOOL: fputs(kv->v.u64 ? "true" : "false", out); break;
    case BN_GGUF_FLOAT32:
    case BN_GGUF_FLOAT64: fprintf(out, "%.9g", kv->v.f64); break;
    case BN_GGUF_ARRAY:
        if (kv->count > ARRAY_SHOWN) {
            char buf[64];
            array_summary(kv, buf, sizeof buf);
            fputs(buf, out);
            break;
        }
        fputc('[', out);
        for (uint64_t i = 0; i < kv->count; i++) {
            if (i)
                fputs(", ", out);
            if (kv->elem_type == BN_GGUF_STRING) {
                bn_gguf_str s;
                if (bn_gguf_array_str(kv, i, &s, NULL) == BN_OK)
                    print_escaped(out, s.ptr, s.len, STRING_SHOWN);
            } else {
                const num n = array_num(kv, i);
                switch (n.kind) {
                case NUM_INT: fprintf(out, "%lld", (long long)n.i); break;
                case NUM_UINT: fprintf(out, "%llu", (unsigned long long)n.u); break;
                case NUM_FLOAT: fprintf(out, "%.9g", n.f); break;
                case NUM_BOOL: fputs(n.u ? "true" : "false", out); break;
                }
            }
        }
        fputc(']', out);
        break;
    default:
        if (is_signed(kv->type))
            fprintf(out, "%lld", (long long)kv->v.i64);
        else
            fprintf(out, "%llu", (unsigned long long)kv->v.u64);
    }
}

static void json_value(bn_json *j, const bn_gguf_kv *kv)
{
    switch (kv->type) {
    case BN_GGUF_STRING: {
        char *s = dup_str(kv->v.str);
        bn_json_string(j, s ? s : "");
        free(s);
        break;
    }
    case BN_GGUF_BOOL: bn_json_bool(j, kv->v.u64 != 0); break;
    case BN_GGUF_FLOAT32:
    case BN_GGUF_FLOAT64: bn_json_double(j, kv->v.f64); break;
    case BN_GGUF_ARRAY:
        if (kv->count > ARRAY_SHOWN) {
            char buf[64];
            array_summary(kv, buf, sizeof buf);
            bn_json_string(j, buf);
            break;
        }
        bn_json_begin_array(j);
        for (uint64_t i = 0; i < kv->count; i++) {
            if (kv->elem_type == BN_GGUF_STRING) {
                bn_gguf_str s;
                char *p = bn_gguf_array_str(kv, i, &s, NULL) == BN_OK ? dup_str(s) : NULL;
                bn_json_string(j, p ? p : "");
                free(p);
            } else {
                const num n = array_num(kv, i);
                switch (n.kind) {
                case NUM_INT: bn_json_int(j, n.i); break;
                case NUM_UINT: bn_json_uint(j, n.u); break;
                case NUM_FLOAT: bn_json_double(j, n.f); break;
                case NUM_BOOL: bn_json_bool(j, n.u != 0); break;
                }
            }
        }
        bn_json_end_array(j);
        break;
    default:
        if (is_signed(kv->type))
            bn_json_int(j, kv->v.i64);
        else
            bn_json_uint(j, kv->v.u64);
    }
}

/* ---- can bitnet run it? -------------------------------------------------------- */

typedef struct verdict {
    bn_checkpoint *model; /* NULL when it cannot run */
    bn_error err;
} verdict;

static void judge(const char *path, verdict *v)
{
    bn_error_clear(&v->err);
    v->model = NULL;
    if (bn_checkpoint_load(path, &v->model, &v->err) != BN_OK)
        v->model = NULL;
}

static void print_verdict_text(FILE *out, const verdict *v)
{
    fprintf(out, "\nbitnet\n");
    if (!v->model) {
        fprintf(out, "  runnable      no: %s\n", v->err.message);
        if (v->err.hint[0])
            fprintf(out, "  hint          %s\n", v->err.hint);
        return;
    }
    const bn_hparams *hp = bn_checkpoint_hparams(v->model);
    const bn_qtype_info *q = bn_qtype_get(bn_checkpoint_projection_type(v->model, 0, BN_PROJ_Q));
    fprintf(out, "  runnable      yes\n  architecture  %s\n  flavour       %s\n", hp->arch,
            hp->flavour);
    fprintf(out, "  projections   %s\n", q ? q->name : "unknown");
    fprintf(out,
            "  shape         %d layers, dim %d, ffn %d, heads %d / %d kv, head_dim %d, vocab %d\n",
            hp->n_layer, hp->dim, hp->ffn, hp->n_head, hp->n_head_kv, hp->head_dim, hp->vocab);
    fprintf(out,
            "  context       %d (trained)\n  rope          theta %g over %d dims\n"
            "  rms eps       %g\n  embeddings    %s\n",
            hp->n_ctx_train, hp->rope_theta, hp->rope_dim, hp->rms_eps,
            hp->tied_embeddings ? "tied (the LM head is token_embd)" : "separate LM head");
    fprintf(out, "  weights       %.1f MiB\n",
            (double)bn_checkpoint_weight_bytes(v->model) / (1024.0 * 1024.0));
    const bn_tokenizer *t = bn_checkpoint_tokenizer(v->model);
    if (t)
        fprintf(out, "  tokenizer     %s, %d tokens, bos %d, eos %d, eot %d\n",
                bn_tokenizer_kind_of(t) == BN_TOKENIZER_BYTE_BPE ? "byte-level BPE"
                                                                  : "SentencePiece BPE",
                bn_tokenizer_vocab_size(t), bn_tokenizer_bos(t), bn_tokenizer_eos(t),
                bn_tokenizer_eot(t));
    else
        fprintf(out, "  tokenizer     none (runs from token ids only)\n");
}

static void json_verdict(bn_json *j, const verdict *v)
{
    bn_json_key(j, "bitnet");
    bn_json_begin_object(j);
    bn_json_kv_bool(j, "runnable", v->model != NULL);
    if (!v->model) {
        bn_json_kv_string(j, "reason", v->err.message);
        bn_json_kv_string(j, "hint", v->err.hint);
        bn_json_end_object(j);
        return;
    }
    const bn_hparams *hp = bn_checkpoint_hparams(v->model);
    const bn_qtype_info *q = bn_qtype_get(bn_checkpoint_projection_type(v->model, 0, BN_PROJ_Q));
    bn_json_kv_string(j, "architecture", hp->arch);
    bn_json_kv_string(j, "flavour", hp->flavour);
    bn_json_kv_string(j, "projection_type", q ? q->name : "unknown");
    bn_json_key(j, "hparams");
    bn_json_begin_object(j);
    bn_json_kv_int(j, "vocab", hp->vocab);
    bn_json_kv_int(j, "dim", hp->dim);
    bn_json_kv_int(j, "ffn", hp->ffn);
    bn_json_kv_int(j, "n_layer", hp->n_layer);
    bn_json_kv_int(j, "n_head", hp->n_head);
    bn_json_kv_int(j, "n_head_kv", hp->n_head_kv);
    bn_json_kv_int(j, "head_dim", hp->head_dim);
    bn_json_kv_int(j, "n_ctx_train", hp->n_ctx_train);
    bn_json_kv_int(j, "rope_dim", hp->rope_dim);
    bn_json_kv_double(j, "rms_eps", hp->rms_eps);
    bn_json_kv_double(j, "rope_theta", hp->rope_theta);
    bn_json_kv_bool(j, "tied_embeddings", hp->tied_embeddings);
    bn_json_end_object(j);
    bn_json_kv_uint(j, "weight_bytes", bn_checkpoint_weight_bytes(v->model));
    const bn_tokenizer *t = bn_checkpoint_tokenizer(v->model);
    bn_json_key(j, "tokenizer");
    if (t) {
        bn_json_begin_object(j);
        const bool byte_bpe = bn_tokenizer_kind_of(t) == BN_TOKENIZER_BYTE_BPE;
        bn_json_kv_string(j, "kind", byte_bpe ? "byte-bpe" : "spm-bpe");
        bn_json_kv_int(j, "vocab", bn_tokenizer_vocab_size(t));
        bn_json_kv_int(j, "bos", bn_tokenizer_bos(t));
        bn_json_kv_int(j, "eos", bn_tokenizer_eos(t));
        bn_json_kv_int(j, "eot", bn_tokenizer_eot(t));
        bn_json_end_object(j);
    } else {
        bn_json_null(j);
    }
    bn_json_end_object(j);
}

/* ---- GGUF -------------------------------------------------------------------- */

static void gguf_text(FILE *out, const char *path, const bn_gguf *g, const verdict *v)
{
    fprintf(out, "%s\n  format        GGUF version %u, alignment %u, %llu bytes\n", path,
            bn_gguf_version(g), bn_gguf_alignment(g), (unsigned long long)bn_gguf_file_size(g));
    const uint64_t n_kv = bn_gguf_kv_count(g);
    fprintf(out, "\nmetadata (%llu keys)\n", (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        const bn_gguf_kv *kv = bn_gguf_kv_at(g, i);
        fprintf(out, "  %-44.*s ", (int)kv->key.len, kv->key.ptr);
        print_value_text(out, kv);
        fputc('\n', out);
    }
    const uint64_t n_t = bn_gguf_tensor_count(g);
    fprintf(out, "\ntensors (%llu)\n  %-34s %-16s %-10s %12s %12s\n", (unsigned long long)n_t,
            "name", "shape", "type", "bytes", "offset");
    for (uint64_t i = 0; i < n_t; i++) {
        const bn_gguf_tensor *t = bn_gguf_tensor_at(g, i);
        char shape[96], tbuf[32];
        shape_text(t->ne, (int)t->n_dims, shape, sizeof shape);
        fprintf(out, "  %-34s %-16s %-10s %12llu %12llu\n", t->name, shape,
                type_name(t->type, tbuf, sizeof tbuf), (unsigned long long)t->bytes,
                (unsigned long long)t->offset);
    }
    print_verdict_text(out, v);
}

static void gguf_json(FILE *out, const char *path, const bn_gguf *g, const verdict *v)
{
    bn_json j;
    bn_json_init(&j, out);
    bn_json_begin_object(&j);
    bn_json_kv_string(&j, "path", path);
    bn_json_kv_string(&j, "format", "gguf");
    bn_json_kv_int(&j, "version", bn_gguf_version(g));
    bn_json_kv_int(&j, "alignment", bn_gguf_alignment(g));
    bn_json_kv_uint(&j, "file_bytes", bn_gguf_file_size(g));
    bn_json_key(&j, "metadata");
    bn_json_begin_object(&j);
    for (uint64_t i = 0; i < bn_gguf_kv_count(g); i++) {
        const bn_gguf_kv *kv = bn_gguf_kv_at(g, i);
        char *key = dup_str(kv->key);
        bn_json_key(&j, key ? key : "");
        free(key);
        json_value(&j, kv);
    }
    bn_json_end_object(&j);
    bn_json_key(&j, "tensors");
    bn_json_begin_array(&j);
    for (uint64_t i = 0; i < bn_gguf_tensor_count(g); i++) {
        const bn_gguf_tensor *t = bn_gguf_tensor_at(g, i);
        char tbuf[32];
        bn_json_begin_object(&j);
        bn_json_kv_string(&j, "name", t->name);
        bn_json_key(&j, "shape");
        bn_json_begin_array(&j);
        for (uint32_t d = 0; d < t->n_dims; d++)
            bn_json_int(&j, t->ne[d]);
        bn_json_end_array(&j);
        bn_json_kv_string(&j, "type", type_name(t->type, tbuf, sizeof tbuf));
        bn_json_kv_int(&j, "ggml_type", t->type);
        bn_json_kv_uint(&j, "bytes", t->bytes);
        bn_json_kv_uint(&j, "offset", t->offset);
        bn_json_end_object(&j);
    }
    bn_json_end_array(&j);
    json_verdict(&j, v);
    bn_json_end_object(&j);
    fputc('\n', out);
}

/* ---- safetensors (directory or single file) ------------------------------------ */

typedef const bn_st_tensor *(*st_at_fn)(const void *src, size_t i);

static const bn_st_tensor *dir_at(const void *d, size_t i) { return bn_hf_dir_tensor_at(d, i); }
static const bn_st_tensor *file_at(const void *f, size_t i) { return bn_safetensors_at(f, i); }

static void st_tensors_text(FILE *out, const void *src, size_t n, st_at_fn at)
{
    fprintf(out, "\ntensors (%zu)\n  %-52s %-16s %-6s %12s\n", n, "name", "shape", "dtype",
            "bytes");
    for (size_t i = 0; i < n; i++) {
        const bn_st_tensor *t = at(src, i);
        char shape[96];
        shape_text(t->shape, t->n_dims, shape, sizeof shape);
        fprintf(out, "  %-52s %-16s %-6s %12llu\n", t->name, shape, bn_st_dtype_name(t->dtype),
                (unsigned long long)t->bytes);
    }
}

static void st_tensors_json(bn_json *j, const void *src, size_t n, st_at_fn at)
{
    bn_json_key(j, "tensors");
    bn_json_begin_array(j);
    for (size_t i = 0; i < n; i++) {
        const bn_st_tensor *t = at(src, i);
        bn_json_begin_object(j);
        bn_json_kv_string(j, "name", t->name);
        bn_json_key(j, "shape");
        bn_json_begin_array(j);
        for (int d = 0; d < t->n_dims; d++)
            bn_json_int(j, t->shape[d]);
        bn_json_end_array(j);
        bn_json_kv_string(j, "dtype", bn_st_dtype_name(t->dtype));
        bn_json_kv_uint(j, "bytes", t->bytes);
        bn_json_end_object(j);
    }
    bn_json_end_array(j);
}

static void hf_config_text(FILE *out, const bn_hf_config *c)
{
    fprintf(out, "\nconfig.json\n");
    fprintf(out, "  architecture            %s (model_type %s)\n", c->architecture, c->model_type);
    fprintf(out,
            "  hidden_size             %d\n"
            "  intermediate_size       %d\n"
            "  num_hidden_layers       %d\n"
            "  num_attention_heads     %d\n"
            "  num_key_value_heads     %d\n"
            "  head_dim                %d\n"
            "  vocab_size              %d\n"
            "  max_position_embeddings %d\n"
            "  rms_norm_eps            %g\n"
            "  rope_theta              %g\n"
            "  tie_word_embeddings     %s\n"
            "  hidden_act              %s\n"
            "  bos_token_id            %d\n",
            c->hidden_size, c->intermediate_size, c->num_hidden_layers, c->num_attention_heads,
            c->num_key_value_heads, c->head_dim, c->vocab_size, c->max_position_embeddings,
            c->rms_norm_eps, c->rope_theta, c->tie_word_embeddings ? "true" : "false",
            c->hidden_act, c->bos_token_id);
    fprintf(out, "  eos_token_id            ");
    for (int i = 0; i < c->n_eos_token_ids; i++)
        fprintf(out, "%s%d", i ? ", " : "", c->eos_token_ids[i]);
    fprintf(out, "\n  quantization            ");
    if (c->quantized)
        fprintf(out, "%s, %s, %s\n", c->quant_method, c->linear_class, c->quantization_mode);
    else
        fprintf(out, "none (full-precision weights)\n");
}

static void hf_config_json(bn_json *j, const bn_hf_config *c)
{
    bn_json_key(j, "config");
    bn_json_begin_object(j);
    bn_json_kv_string(j, "architecture", c->architecture);
    bn_json_kv_string(j, "model_type", c->model_type);
    bn_json_kv_int(j, "hidden_size", c->hidden_size);
    bn_json_kv_int(j, "intermediate_size", c->intermediate_size);
    bn_json_kv_int(j, "num_hidden_layers", c->num_hidden_layers);
    bn_json_kv_int(j, "num_attention_heads", c->num_attention_heads);
    bn_json_kv_int(j, "num_key_value_heads", c->num_key_value_heads);
    bn_json_kv_int(j, "head_dim", c->head_dim);
    bn_json_kv_int(j, "vocab_size", c->vocab_size);
    bn_json_kv_int(j, "max_position_embeddings", c->max_position_embeddings);
    bn_json_kv_double(j, "rms_norm_eps", c->rms_norm_eps);
    bn_json_kv_double(j, "rope_theta", c->rope_theta);
    bn_json_kv_bool(j, "tie_word_embeddings", c->tie_word_embeddings);
    bn_json_kv_string(j, "hidden_act", c->hidden_act);
    bn_json_kv_int(j, "bos_token_id", c->bos_token_id);
    bn_json_key(j, "eos_token_id");
    bn_json_begin_array(j);
    for (int i = 0; i < c->n_eos_token_ids; i++)
        bn_json_int(j, c->eos_token_ids[i]);
    bn_json_end_array(j);
    bn_json_key(j, "quantization_config");
    if (c->quantized) {
        bn_json_begin_object(j);
        bn_json_kv_string(j, "quant_method", c->quant_method);
        bn_json_kv_string(j, "linear_class", c->linear_class);
        bn_json_kv_string(j, "quantization_mode", c->quantization_mode);
        bn_json_end_object(j);
    } else {
        bn_json_null(j);
    }
    bn_json_end_object(j);
}

static bn_status inspect_dir(FILE *out, const char *path, bool json, bn_error *err)
{
    bn_hf_dir *d = NULL;
    const bn_status st = bn_hf_dir_open(path, &d, err);
    if (st != BN_OK)
        return st;
    verdict v;
    judge(path, &v);
    const bn_hf_config *c = bn_hf_dir_config(d);
    const char *tok = bn_hf_dir_tokenizer_path(d);
    const size_t n = bn_hf_dir_tensor_count(d);
    if (json) {
        bn_json j;
        bn_json_init(&j, out);
        bn_json_begin_object(&j);
        bn_json_kv_string(&j, "path", path);
        bn_json_kv_string(&j, "format", "huggingface");
        hf_config_json(&j, c);
        bn_json_key(&j, "tokenizer_json");
        if (tok)
            bn_json_string(&j, tok);
        else
            bn_json_null(&j);
        st_tensors_json(&j, d, n, dir_at);
        json_verdict(&j, &v);
        bn_json_end_object(&j);
        fputc('\n', out);
    } else {
        fprintf(out, "%s\n  format        Hugging Face directory\n  tokenizer     %s\n", path,
                tok ? tok : "none (no tokenizer.json)");
        hf_config_text(out, c);
        st_tensors_text(out, d, n, dir_at);
        print_verdict_text(out, &v);
    }
    bn_checkpoint_free(v.model);
    bn_hf_dir_close(d);
    return BN_OK;
}

static bn_status inspect_safetensors(FILE *out, const char *path, bool json, bn_error *err)
{
    bn_safetensors *st = NULL;
    const bn_status status = bn_safetensors_open(path, &st, err);
    if (status != BN_OK)
        return status;
    const size_t n = bn_safetensors_count(st);
    const char *why = "a lone .safetensors file: bitnet runs the whole directory (config.json "
                      "and tokenizer.json beside it)";
    if (json) {
        bn_json j;
        bn_json_init(&j, out);
        bn_json_begin_object(&j);
        bn_json_kv_string(&j, "path", path);
        bn_json_kv_string(&j, "format", "safetensors");
        st_tensors_json(&j, st, n, file_at);
        bn_json_key(&j, "bitnet");
        bn_json_begin_object(&j);
        bn_json_kv_bool(&j, "runnable", false);
        bn_json_kv_string(&j, "reason", why);
        bn_json_end_object(&j);
        bn_json_end_object(&j);
        fputc('\n', out);
    } else {
        fprintf(out, "%s\n  format        safetensors\n", path);
        st_tensors_text(out, st, n, file_at);
        fprintf(out, "\nbitnet\n  runnable      no: %s\n", why);
    }
    bn_safetensors_close(st);
    return BN_OK;
}

static bool ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bn_status inspect_gguf(FILE *out, const char *path, bool json, bn_error *err)
{
    bn_gguf *g = NULL;
    const bn_status st = bn_gguf_open(path, &g, err);
    if (st != BN_OK)
        return st;
    verdict v;
    judge(path, &v);
    if (json)
        gguf_json(out, path, g, &v);
    else
        gguf_text(out, path, g, &v);
    bn_checkpoint_free(v.model);
    bn_gguf_close(g);
    return BN_OK;
}

bn_status bn_inspect(const char *path, const bn_inspect_options *opt, FILE *out, bn_error *err)
{
    if (!path || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "bn_inspect: NULL %s",
                            !path ? "path" : "out");
    const bool json = opt && opt->json;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return bn_error_set(err, BN_ERR_IO, NULL, "cannot open %s: %s", path,
                            errno == ENOENT ? "no such file or directory" : strerror(errno));
    bn_status st;
    if (S_ISDIR(sb.st_mode))
        st = inspect_dir(out, path, json, err);
    else if (ends_with(path, ".safetensors"))
        st = inspect_safetensors(out, path, json, err);
    else
        st = inspect_gguf(out, path, json, err);
    if (st == BN_OK && (fflush(out) != 0 || ferror(out)))
        st = bn_error_set(err, BN_ERR_IO,
                          "check where the report goes (a full disk, a closed pipe)",
                          "cannot write the report of %s", path);
    return st;
}
