/*
 * model_hf.c - BitNet b1.58 models from Hugging Face directories
 * (BitNetForCausalLM, transformers' models/bitnet/modeling_bitnet.py).
 *
 * Tensor names (safetensors shapes are outermost first):
 *
 *   model.embed_tokens.weight                       [vocab, dim]
 *   model.layers.N.input_layernorm.weight           [dim]       attn_norm
 *   model.layers.N.self_attn.{q,k,v,o}_proj.weight  projections
 *   model.layers.N.self_attn.attn_sub_norm.weight   [dim]
 *   model.layers.N.post_attention_layernorm.weight  [dim]       ffn_norm
 *   model.layers.N.mlp.{gate,up,down}_proj.weight   projections
 *   model.layers.N.mlp.ffn_sub_norm.weight          [ffn]
 *   model.norm.weight                               [dim]
 *   lm_head.weight                                  [vocab, dim] unless tied
 *
 * A projection is either
 *   - packed ("offline" checkpoints such as microsoft/bitnet-b1.58-2B-4T):
 *     uint8 [n/4, k] (fmt_bitnet.c) plus "<name>_scale" = weight_scale [1].
 *     transformers' AutoBitLinear multiplies the output by weight_scale
 *     (integrations/bitnet.py: output * self.weight_scale); the older
 *     BitLinear class, the default when quantization_config names no
 *     linear_class, divides (y / (input_scale * weight_scale));
 *   - float master weights [n, k] (BF16/F16/F32, "online" checkpoints such as
 *     microsoft/bitnet-b1.58-2B-4T-bf16), which transformers quantizes on
 *     every forward with absmean (WeightQuant); we do it once at load. A
 *     BitNet checkpoint without a quantization_config would run as plain
 *     float linears in transformers; the model was trained ternary, so we
 *     quantize those too and say so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "safetensors.h"
#include "tokenizer.h"

static void close_dir(void *d) { bn_hf_dir_close(d); }
static void free_tokenizer(struct bn_tokenizer *t) { bn_tokenizer_free(t); }

static bn_qtype float_qtype(bn_st_dtype d)
{
    switch (d) {
    case BN_ST_F32: return BN_QTYPE_F32;
    case BN_ST_F16: return BN_QTYPE_F16;
    case BN_ST_BF16: return BN_QTYPE_BF16;
    default: return (bn_qtype)-1;
    }
}

static const char *shape_str(const bn_st_tensor *t, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < t->n_dims && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)t->shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

static bool has_shape(const bn_st_tensor *t, int64_t d0, int64_t d1)
{
    if (d1 == 0)
        return t->n_dims == 1 && t->shape[0] == d0;
    return t->n_dims == 2 && t->shape[0] == d0 && t->shape[1] == d1;
}

static bn_status shape_error(const bn_st_tensor *t, const char *name, const char *want,
                             bn_error *err)
{
    char have[96];
    return bn_error_set(err, BN_ERR_FORMAT, "the tensor does not match config.json",
                        "tensor %s has shape %s but config.json requires %s", name,
                        shape_str(t, have, sizeof have), want);
}

static bn_status find(const bn_hf_dir *d, const char *name, const bn_st_tensor **out,
                      bn_error *err)
{
    *out = bn_hf_dir_find(d, name);
    if (!*out)
        return bn_error_set(err, BN_ERR_FORMAT, "the checkpoint is incomplete",
                            "tensor %s is missing", name);
    return BN_OK;
}

/* A float vector of n values (a norm weight). */
static bn_status load_vector(const bn_hf_dir *d, const char *name, int64_t n, float *dst,
                             bn_error *err)
{
    const bn_st_tensor *t;
    bn_status st = find(d, name, &t, err);
    if (st != BN_OK)
        return st;
    if (!has_shape(t, n, 0)) {
        char want[32];
        snprintf(want, sizeof want, "[%lld]", (long long)n);
        return shape_error(t, name, want, err);
    }
    return bn_checkpoint_floats_from(float_qtype(t->dtype), t->data, t->bytes, n, dst, name, err);
}

static bn_status load_matrix(const bn_hf_dir *d, const char *name, int64_t rows, int64_t cols,
                             bn_dense_matrix *out, bn_error *err)
{
    const bn_st_tensor *t;
    bn_status st = find(d, name, &t, err);
    if (st != BN_OK)
        return st;
    if (!has_shape(t, rows, cols)) {
        char want[64];
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
        return shape_error(t, name, want, err);
    }
    *out = (bn_dense_matrix){float_qtype(t->dtype), rows, cols, t->data, 0};
    return bn_checkpoint_dense_check(out, t->bytes, name, err);
}

typedef struct hf_quant {
    bool divide_by_scale; /* BitLinear class: y / weight_scale */
    int packed, master;   /* projections of each kind, for the description */
} hf_quant;

static bn_status load_projection(const bn_hf_dir *d, bn_checkpoint *m, int layer, bn_proj p,
                                 const char *name, hf_quant *q, bn_error *err)
{
    int64_t n, k;
    bn_hparams_proj_shape(&m->hp, p, &n, &k);
    const bn_st_tensor *t;
    bn_status st = find(d, name, &t, err);
    if (st != BN_OK)
        return st;
    bn_proj_tensor *slot = bn_checkpoint_proj_slot(m, layer, p);
    char want[64];
    if (t->dtype == BN_ST_U8) {
        if (n % 4 != 0 || !has_shape(t, n / 4, k)) {
            snprintf(want, sizeof want, "[%lld, %lld] (uint8, four rows per byte)",
                     (long long)(n / 4), (long long)k);
            return shape_error(t, name, want, err);
        }
        st = bn_checkpoint_proj_set(slot, name, BN_QTYPE_HF_PACKED, t->data, t->bytes, n, k, false,
                                    err);
        if (st != BN_OK)
            return st;
        /* weight_scale sits beside the weight: "<...>.weight_scale". */
        char scale_name[176];
        snprintf(scale_name, sizeof scale_name, "%s_scale", name);
        const bn_st_tensor *s;
        st = find(d, scale_name, &s, err);
        if (st != BN_OK)
            return bn_error_set(err, BN_ERR_FORMAT, "packed checkpoints carry a weight_scale per projection",
                                "tensor %s is missing (needed by the packed %s)", scale_name, name);
        const int64_t count = s->n_dims == 0 ? 1 : s->shape[0];
        if (s->n_dims > 1 || count < 1)
            return shape_error(s, scale_name, "[1]", err);
        float v;
        st = bn_checkpoint_floats_from(float_qtype(s->dtype), s->data, s->bytes, 1, &v, scale_name,
                                       err);
        if (st != BN_OK)
            return st;
        if (v == 0.0f)
            return bn_error_set(err, BN_ERR_FORMAT, "the checkpoint is corrupt",
                                "%s is zero", scale_name);
        slot->extra_scale = q->divide_by_scale ? 1.0f / v : v;
        q->packed++;
    } else {
        if ((int)float_qtype(t->dtype) < 0)
            return bn_error_set(err, BN_ERR_UNSUPPORTED,
                                "projections are uint8 (packed) or BF16/F16/F32 master weights",
                                "tensor %s has dtype %s", name, bn_st_dtype_name(t->dtype));
        if (!has_shape(t, n, k)) {
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)n, (long long)k);
            return shape_error(t, name, want, err);
        }
        st = bn_checkpoint_proj_set(slot, name, float_qtype(t->dtype), t->data, t->bytes, n, k,
                                    true, err);
        q->master++;
    }
    m->weight_bytes += t->bytes;
    return st;
}

static const char *const proj_names[BN_PROJ_COUNT] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
static const char *const norm_names[BN_NORM_COUNT] = {
    "input_layernorm", "self_attn.attn_sub_norm", "post_attention_layernorm", "mlp.ffn_sub_norm"};

static bn_status check_config(const bn_hf_config *c, const char *dir, bn_error *err)
{
    if (strcmp(c->architecture, "BitNetForCausalLM") != 0)
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "bitnet runs BitNetForCausalLM checkpoints (microsoft/bitnet-b1.58-*)",
                            "%s: architecture '%s' is not supported", dir, c->architecture);
    if (c->hidden_act[0] && strcmp(c->hidden_act, "relu2") != 0)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "BitNet b1.58 uses hidden_act relu2",
                            "%s: hidden_act '%s' is not supported", dir, c->hidden_act);
    if (c->quantized && c->quant_method[0] && strcmp(c->quant_method, "bitnet") != 0)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "%s: quantization method '%s' is not BitNet's", dir, c->quant_method);
    if (c->num_attention_heads > 0 && c->num_key_value_heads > 0 &&
        c->num_attention_heads % c->num_key_value_heads != 0)
        return bn_error_set(err, BN_ERR_FORMAT, "the model's config.json is inconsistent",
                            "%s: num_attention_heads = %d is not a multiple of "
                            "num_key_value_heads = %d",
                            dir, c->num_attention_heads, c->num_key_value_heads);
    if ((int64_t)c->num_attention_heads * c->head_dim != c->hidden_size)
        return bn_error_set(err, BN_ERR_FORMAT, "the model's config.json is inconsistent",
                            "%s: num_attention_heads * head_dim = %d * %d differs from "
                            "hidden_size = %d (transformers sizes attn_sub_norm by hidden_size)",
                            dir, c->num_attention_heads, c->head_dim, c->hidden_size);
    return BN_OK;
}

bn_status bn_checkpoint_load_hf_dir(const char *dir, bn_checkpoint **out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "model load: NULL output");
    *out = NULL;
    bn_hf_dir *d = NULL;
    bn_status st = bn_hf_dir_open(dir, &d, err);
    if (st != BN_OK)
        return st;
    const bn_hf_config *c = bn_hf_dir_config(d);
    st = check_config(c, dir, err);
    if (st != BN_OK) {
        bn_hf_dir_close(d);
        return st;
    }
    bn_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.vocab = c->vocab_size;
    hp.dim = c->hidden_size;
    hp.ffn = c->intermediate_size;
    hp.n_layer = c->num_hidden_layers;
    hp.n_head = c->num_attention_heads;
    hp.n_head_kv = c->num_key_value_heads;
    hp.head_dim = c->head_dim;
    hp.rope_dim = c->head_dim;
    hp.n_ctx_train = c->max_position_embeddings;
    hp.rms_eps = c->rms_norm_eps;
    hp.rope_theta = c->rope_theta;
    hp.tied_embeddings = c->tie_word_embeddings;
    snprintf(hp.arch, sizeof hp.arch, "%.31s", c->architecture);

    uint64_t tensor_bytes = 0;
    for (size_t i = 0; i < bn_hf_dir_tensor_count(d); i++)
        tensor_bytes += bn_hf_dir_tensor_at(d, i)->bytes;
    bn_checkpoint *m = NULL;
    st = bn_checkpoint_check_fits(&hp, tensor_bytes, "the directory's safetensors", err);
    if (st == BN_OK)
        st = bn_checkpoint_alloc(&hp, &m, err);
    if (st != BN_OK) {
        bn_hf_dir_close(d);
        return st;
    }
    m->source = d;
    m->close_source = close_dir;

    /* transformers' AutoBitLinear adds a per-linear RMSNorm when
     * use_rms_norm is set; no released checkpoint does, and we do not. */
    if (bn_hf_dir_find(d, "model.layers.0.self_attn.q_proj.rms_norm.weight"))
        st = bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                          "%s: projections with their own RMSNorm (use_rms_norm) are not "
                          "supported",
                          dir);
    if (st == BN_OK)
        st = load_matrix(d, "model.embed_tokens.weight", hp.vocab, hp.dim, &m->embedding, err);
    if (st == BN_OK) {
        m->lm_head = m->embedding;
        m->weight_bytes += (uint64_t)m->embedding.row_bytes * (uint64_t)hp.vocab;
        /* transformers would start such a model from a random LM head. */
        if (!hp.tied_embeddings && !bn_hf_dir_find(d, "lm_head.weight")) {
            st = bn_error_set(err, BN_ERR_FORMAT,
                              "if the LM head is the embedding matrix, set "
                              "\"tie_word_embeddings\": true in config.json",
                              "%s: tensor lm_head.weight is missing and config.json does not set "
                              "tie_word_embeddings to true (absent means false, as in "
                              "transformers' BitNetConfig)",
                              dir);
        } else if (!hp.tied_embeddings) {
            st = load_matrix(d, "lm_head.weight", hp.vocab, hp.dim, &m->lm_head, err);
            m->weight_bytes += (uint64_t)m->lm_head.row_bytes * (uint64_t)hp.vocab;
        }
    }
    if (st == BN_OK)
        st = load_vector(d, "model.norm.weight", hp.dim, bn_checkpoint_output_norm_slot(m), err);

    hf_quant q = {false, 0, 0};
    /* BitNetQuantConfig's default class is "bitlinear", which divides. */
    q.divide_by_scale = c->quantized && strcmp(c->linear_class, "autobitlinear") != 0;
    char name[160];
    for (int l = 0; l < hp.n_layer && st == BN_OK; l++) {
        for (int w = 0; w < BN_NORM_COUNT && st == BN_OK; w++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, norm_names[w]);
            st = load_vector(d, name, bn_hparams_norm_size(&hp, (bn_norm)w),
                             bn_checkpoint_norm_slot(m, l, (bn_norm)w), err);
        }
        for (int p = 0; p < BN_PROJ_COUNT && st == BN_OK; p++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, proj_names[p]);
            st = load_projection(d, m, l, (bn_proj)p, name, &q, err);
        }
    }
    if (st == BN_OK && q.master && !c->quantized)
        bn_log(BN_LOG_WARN,
               "%s has no quantization_config: transformers would run its float weights "
               "unquantized; bitnet quantizes them with absmean as BitNet was trained",
               dir);

    const char *tok_path = bn_hf_dir_tokenizer_path(d);
    if (st == BN_OK && tok_path) {
        st = bn_tokenizer_from_hf_json(tok_path, &m->tokenizer, err);
        if (st == BN_OK)
            m->free_tokenizer = free_tokenizer;
    } else if (st == BN_OK) {
        bn_log(BN_LOG_WARN, "%s has no tokenizer.json; token ids only", dir);
    }
    if (st != BN_OK) {
        bn_checkpoint_free(m);
        return st;
    }

    char emb[16], head[16], projs[128];
    bn_checkpoint_qtype_label(m->lm_head.type, head, sizeof head);
    const char *cls = !c->quantized ? "no quantization_config"
                      : q.divide_by_scale ? "bitlinear, weight_scale divides"
                                          : "autobitlinear, weight_scale multiplies";
    if (q.master == 0)
        snprintf(projs, sizeof projs, "packed uint8 projections (%.15s, %.40s)",
                 c->quantization_mode[0] ? c->quantization_mode : "offline", cls);
    else if (q.packed == 0)
        snprintf(projs, sizeof projs, "%.15s master weights quantized at load (absmean; %.40s)",
                 bn_checkpoint_qtype_label(m->proj[0].type, emb, sizeof emb), cls);
    else
        snprintf(projs, sizeof projs, "mixed packed and master-weight projections");
    bn_checkpoint_qtype_label(m->embedding.type, emb, sizeof emb);
    snprintf(m->hp.flavour, sizeof m->hp.flavour, "Hugging Face %.31s, %.127s, %.15s embeddings, %.15s%s",
             c->architecture, projs, emb, hp.tied_embeddings ? "tied" : head, " LM head");
    *out = m;
    return BN_OK;
}
