/*
 * model_gguf.c - BitNet b1.58 models from GGUF files.
 *
 * Three architectures carry this model in the wild (FORMATS.md section 2):
 *
 *   bitnet-25     Microsoft's official file (bitnet.cpp's converter): I2_S
 *                 projections, F16 token embedding, F32 norms, tied head
 *   bitnet-b1.58  the same from Microsoft's newer converter
 *   bitnet        upstream llama.cpp's converter: TQ1_0/TQ2_0 (or F16/F32
 *                 code * scale) projections, optional per-projection
 *                 "<name>.scale" tensors that multiply the output
 *
 * All share the key names <arch>.embedding_length etc. and the tensor names
 * token_embd, output_norm, [output], [rope_freqs], blk.N.{attn_norm, attn_q,
 * attn_k, attn_v, attn_output, attn_sub_norm, ffn_norm, ffn_gate, ffn_up,
 * ffn_down, ffn_sub_norm}. Neither converter permutes Q/K rows: RoPE is the
 * rotate-half form for all three (upstream lists LLM_ARCH_BITNET among the
 * NEOX rope models).
 *
 * bitnet.cpp's TL1/TL2 files store the scale as a separate F32 tensor
 * "<weight name>_scale" (e.g. blk.0.attn_q.weight_scale); it multiplies too.
 *
 * Upstream llama.cpp's graph for "bitnet" uses SiLU in the FFN, a known bug
 * (the model was trained with squared ReLU); we run the model as trained.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model_internal.h"
#include "tokenizer.h"

typedef struct arch_info {
    const char *name;
    const char *producer;
} arch_info;

static const arch_info known_archs[] = {
    {"bitnet-25", "Microsoft bitnet.cpp"},
    {"bitnet-b1.58", "Microsoft bitnet.cpp converter"},
    {"bitnet", "upstream llama.cpp"},
};

static void close_gguf(void *g) { bn_gguf_close(g); }
static void free_tokenizer(struct bn_tokenizer *t) { bn_tokenizer_free(t); }

/* "[ne0, ne1]" of a GGUF tensor. */
static const char *shape_str(const bn_gguf_tensor *t, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (uint32_t i = 0; i < t->n_dims && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)t->ne[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}

/* The tensor named `name`, checked to have exactly the GGUF shape
 * {ne0} (ne1 == 0) or {ne0, ne1}. */
static bn_status find_tensor(const bn_gguf *g, const char *name, int64_t ne0, int64_t ne1,
                             bool required, const bn_gguf_tensor **out, bn_error *err)
{
    *out = bn_gguf_tensor_by_name(g, name);
    if (!*out) {
        if (!required)
            return BN_OK;
        return bn_error_set(err, BN_ERR_FORMAT, "the file is incomplete or not a BitNet model",
                            "tensor %s is missing", name);
    }
    const bn_gguf_tensor *t = *out;
    const uint32_t want_dims = ne1 ? 2 : 1;
    const bool ok = t->n_dims == want_dims && t->ne[0] == ne0 && t->ne[1] == (ne1 ? ne1 : 1) &&
                    t->ne[2] == 1 && t->ne[3] == 1;
    if (!ok) {
        char have[96];
        char want[64];
        if (ne1)
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)ne0, (long long)ne1);
        else
            snprintf(want, sizeof want, "[%lld]", (long long)ne0);
        return bn_error_set(err, BN_ERR_FORMAT,
                            "the tensor does not match the model's hyper-parameters",
                            "tensor %s has shape %s but the hyper-parameters require %s", name,
                            shape_str(t, have, sizeof have), want);
    }
    return BN_OK;
}

/* An integer hyper-parameter <arch>.<key>; absent keys keep *out when
 * optional. */
static bn_status get_int(const bn_gguf *g, const char *arch, const char *key, bool required,
                         int32_t *out, bn_error *err)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int64_t v;
    bn_error sub;
    bn_error_clear(&sub);
    bn_status st = bn_gguf_get_i64(g, full, &v, &sub);
    if (st == BN_ERR_INVALID_ARGUMENT && sub.message[0] == '\0') {
        if (!required)
            return BN_OK;
        return bn_error_set(err, BN_ERR_FORMAT, "the file lacks the model's hyper-parameters",
                            "metadata key %s is missing", full);
    }
    if (st != BN_OK)
        return bn_error_set(err, st, sub.hint, "%s", sub.message);
    if (v <= 0 || v > INT32_MAX)
        return bn_error_set(err, BN_ERR_FORMAT, "the file's metadata is corrupt",
                            "metadata key %s = %lld is out of range", full, (long long)v);
    *out = (int32_t)v;
    return BN_OK;
}

static bn_status get_float(const bn_gguf *g, const char *arch, const char *key, bool required,
                           float *out, bn_error *err)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    bn_error sub;
    bn_error_clear(&sub);
    bn_status st = bn_gguf_get_f32(g, full, out, &sub);
    if (st == BN_ERR_INVALID_ARGUMENT && sub.message[0] == '\0') {
        if (!required)
            return BN_OK;
        return bn_error_set(err, BN_ERR_FORMAT, "the file lacks the model's hyper-parameters",
                            "metadata key %s is missing", full);
    }
    if (st != BN_OK)
        return bn_error_set(err, st, sub.hint, "%s", sub.message);
    return BN_OK;
}

static bn_status read_hparams(const bn_gguf *g, const char *arch, bn_hparams *hp, bn_error *err)
{
    memset(hp, 0, sizeof hp[0]);
    snprintf(hp->arch, sizeof hp->arch, "%s", arch);
    bn_status st = get_int(g, arch, "embedding_length", true, &hp->dim, err);
    if (st == BN_OK)
        st = get_int(g, arch, "block_count", true, &hp->n_layer, err);
    if (st == BN_OK)
        st = get_int(g, arch, "feed_forward_length", true, &hp->ffn, err);
    if (st == BN_OK)
        st = get_int(g, arch, "attention.head_count", true, &hp->n_head, err);
    if (st == BN_OK)
        st = get_int(g, arch, "context_length", true, &hp->n_ctx_train, err);
    if (st != BN_OK)
        return st;
    hp->n_head_kv = hp->n_head;
    hp->rms_eps = 1e-5f;
    hp->rope_theta = 10000.0f; /* llama.cpp's default when the key is absent */
    if (hp->dim % hp->n_head != 0)
        return bn_error_set(err, BN_ERR_FORMAT, "the model's metadata is inconsistent",
                            "%s.embedding_length = %d is not a multiple of "
                            "%s.attention.head_count = %d",
                            arch, hp->dim, arch, hp->n_head);
    hp->head_dim = hp->dim / hp->n_head;
    st = get_int(g, arch, "attention.head_count_kv", false, &hp->n_head_kv, err);
    if (st == BN_OK)
        st = get_int(g, arch, "attention.key_length", false, &hp->head_dim, err);
    hp->rope_dim = hp->head_dim;
    if (st == BN_OK)
        st = get_int(g, arch, "rope.dimension_count", false, &hp->rope_dim, err);
    if (st == BN_OK)
        st = get_float(g, arch, "attention.layer_norm_rms_epsilon", true, &hp->rms_eps, err);
    if (st == BN_OK)
        st = get_float(g, arch, "rope.freq_base", false, &hp->rope_theta, err);
    if (st != BN_OK)
        return st;
    if (hp->n_head % hp->n_head_kv != 0)
        return bn_error_set(err, BN_ERR_FORMAT, "the model's metadata is inconsistent",
                            "%s.attention.head_count = %d is not a multiple of "
                            "%s.attention.head_count_kv = %d",
                            arch, hp->n_head, arch, hp->n_head_kv);
    return BN_OK;
}

/* Separate scale tensors multiply a projection's output: upstream's
 * "<blk.N.name>.scale" and bitnet.cpp TL1/TL2's "<blk.N.name>.weight_scale". */
static bn_status apply_scale_tensor(const bn_gguf *g, const char *name, bn_proj_tensor *p,
                                    bn_error *err)
{
    const bn_gguf_tensor *t = bn_gguf_tensor_by_name(g, name);
    if (!t)
        return BN_OK;
    const int64_t count = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float v;
    if (count < 1 || !t->type_known)
        return bn_error_set(err, BN_ERR_FORMAT, "the file is corrupt",
                            "scale tensor %s is empty or of an unknown type", name);
    bn_status st =
        bn_checkpoint_floats_from((bn_qtype)t->type, t->data, t->bytes, 1, &v, name, err);
    if (st != BN_OK)
        return st;
    if (v == 0.0f)
        return bn_error_set(err, BN_ERR_FORMAT, "the file is corrupt", "scale tensor %s is zero",
                            name);
    p->extra_scale *= v;
    return BN_OK;
}

static const char *const proj_names[BN_PROJ_COUNT] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
static const char *const norm_names[BN_NORM_COUNT] = {"attn_norm", "attn_sub_norm", "ffn_norm",
                                                      "ffn_sub_norm"};

static bn_status load_layer(const bn_gguf *g, bn_checkpoint *m, int l, bn_error *err)
{
    const bn_hparams *hp = &m->hp;
    char name[96];
    for (int w = 0; w < BN_NORM_COUNT; w++) {
        const bn_gguf_tensor *t;
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, norm_names[w]);
        const int64_t n = bn_hparams_norm_size(hp, (bn_norm)w);
        bn_status st = find_tensor(g, name, n, 0, true, &t, err);
        if (st == BN_OK)
            st = bn_checkpoint_floats_from((bn_qtype)t->type, t->data, t->bytes, n,
                                           bn_checkpoint_norm_slot(m, l, (bn_norm)w), name, err);
        if (st != BN_OK)
            return st;
    }
    for (int p = 0; p < BN_PROJ_COUNT; p++) {
        int64_t n, k;
        bn_hparams_proj_shape(hp, (bn_proj)p, &n, &k);
        const bn_gguf_tensor *t;
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, proj_names[p]);
        bn_status st = find_tensor(g, name, k, n, true, &t, err);
        if (st != BN_OK)
            return st;
        bn_proj_tensor *slot = bn_checkpoint_proj_slot(m, l, (bn_proj)p);
        st = bn_checkpoint_proj_set(slot, name, (bn_qtype)t->type, t->data, t->bytes, n, k, false,
                                    err);
        if (st != BN_OK)
            return st;
        m->weight_bytes += t->bytes;
        snprintf(name, sizeof name, "blk.%d.%s.scale", l, proj_names[p]);
        st = apply_scale_tensor(g, name, slot, err);
        if (st == BN_OK) {
            snprintf(name, sizeof name, "blk.%d.%s.weight_scale", l, proj_names[p]);
            st = apply_scale_tensor(g, name, slot, err);
        }
        if (st != BN_OK)
            return st;
    }
    return BN_OK;
}

static void describe(bn_checkpoint *m, const char *producer)
{
    char projs[64], emb[16], head[16];
    bn_checkpoint_proj_types_label(m, projs, sizeof projs);
    bn_checkpoint_qtype_label(m->embedding.type, emb, sizeof emb);
    bn_checkpoint_qtype_label(m->lm_head.type, head, sizeof head);
    snprintf(m->hp.flavour, sizeof m->hp.flavour,
             "GGUF %.31s (%.40s), %.63s projections, %.15s embeddings, %.15s%s", m->hp.arch,
             producer, projs, emb, m->hp.tied_embeddings ? "tied" : head, " LM head");
}

bn_status bn_checkpoint_load_gguf(const char *path, bn_checkpoint **out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "model load: NULL output");
    *out = NULL;
    bn_gguf *g = NULL;
    bn_status st = bn_gguf_open(path, &g, err);
    if (st != BN_OK)
        return st;

    bn_gguf_str arch_str;
    bn_error sub;
    bn_error_clear(&sub);
    st = bn_gguf_get_str(g, "general.architecture", &arch_str, &sub);
    if (st != BN_OK) {
        bn_gguf_close(g);
        return sub.message[0] ? bn_error_set(err, st, sub.hint, "%s", sub.message)
                              : bn_error_set(err, BN_ERR_FORMAT, "is this a model file?",
                                             "%s has no general.architecture key", path);
    }
    char arch[32];
    const arch_info *info = NULL;
    snprintf(arch, sizeof arch, "%.*s", (int)(arch_str.len < 31 ? arch_str.len : 31),
             arch_str.ptr);
    for (size_t i = 0; i < sizeof known_archs / sizeof known_archs[0]; i++)
        if (arch_str.len == strlen(known_archs[i].name) &&
            memcmp(arch_str.ptr, known_archs[i].name, arch_str.len) == 0)
            info = &known_archs[i];
    if (!info) {
        bn_gguf_close(g);
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "bitnet runs BitNet b1.58 models (bitnet-25, bitnet-b1.58, bitnet)",
                            "%s: architecture '%s' is not a BitNet b1.58 model", path, arch);
    }

    bn_hparams hp;
    st = read_hparams(g, arch, &hp, err);
    const bn_gguf_tensor *embd = NULL, *output = NULL;
    if (st == BN_OK) {
        /* The vocabulary size comes from the embedding when the key is absent. */
        embd = bn_gguf_tensor_by_name(g, "token_embd.weight");
        hp.vocab = embd && embd->n_dims == 2 ? (int32_t)embd->ne[1] : 0;
        st = get_int(g, arch, "vocab_size", false, &hp.vocab, err);
    }
    if (st == BN_OK)
        st = find_tensor(g, "token_embd.weight", hp.dim, hp.vocab, true, &embd, err);
    if (st == BN_OK)
        st = find_tensor(g, "output.weight", hp.dim, hp.vocab, false, &output, err);
    hp.tied_embeddings = output == NULL;
    bn_checkpoint *m = NULL;
    if (st == BN_OK)
        st = bn_checkpoint_check_fits(&hp, bn_gguf_file_size(g), "the GGUF file", err);
    if (st == BN_OK)
        st = bn_checkpoint_alloc(&hp, &m, err);
    if (st != BN_OK) {
        bn_gguf_close(g);
        return st;
    }
    m->source = g;
    m->close_source = close_gguf;

    m->embedding = (bn_dense_matrix){(bn_qtype)embd->type, hp.vocab, hp.dim, embd->data, 0};
    st = bn_checkpoint_dense_check(&m->embedding, embd->bytes, "token_embd.weight", err);
    m->lm_head = m->embedding;
    m->weight_bytes += embd->bytes;
    if (st == BN_OK && output) {
        m->lm_head = (bn_dense_matrix){(bn_qtype)output->type, hp.vocab, hp.dim, output->data, 0};
        st = bn_checkpoint_dense_check(&m->lm_head, output->bytes, "output.weight", err);
        m->weight_bytes += output->bytes;
    }
    const bn_gguf_tensor *t = NULL;
    if (st == BN_OK)
        st = find_tensor(g, "output_norm.weight", hp.dim, 0, true, &t, err);
    if (st == BN_OK)
        st =
            bn_checkpoint_floats_from((bn_qtype)t->type, t->data, t->bytes, hp.dim,
                                      bn_checkpoint_output_norm_slot(m), "output_norm.weight", err);
    for (int l = 0; l < hp.n_layer && st == BN_OK; l++)
        st = load_layer(g, m, l, err);
    if (st == BN_OK && bn_gguf_tensor_by_name(g, "rope_freqs.weight"))
        bn_log(BN_LOG_INFO, "%s: rope_freqs.weight ignored (BitNet uses plain RoPE frequencies)",
               path);

    if (st == BN_OK && bn_gguf_find(g, "tokenizer.ggml.model")) {
        st = bn_tokenizer_from_gguf(g, &m->tokenizer, err);
        if (st == BN_OK) {
            m->free_tokenizer = free_tokenizer;
            if (bn_tokenizer_vocab_size(m->tokenizer) > hp.vocab)
                st = bn_error_set(err, BN_ERR_FORMAT, "the tokenizer does not belong to this model",
                                  "the tokenizer has %d tokens but the model only %d rows",
                                  (int)bn_tokenizer_vocab_size(m->tokenizer), (int)hp.vocab);
        }
    } else if (st == BN_OK) {
        bn_log(BN_LOG_WARN, "%s has no tokenizer metadata; token ids only", path);
    }
    if (st != BN_OK) {
        bn_checkpoint_free(m);
        return st;
    }
    describe(m, info->producer);
    *out = m;
    return BN_OK;
}
