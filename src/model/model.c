/*
 * model.c - hyper-parameters, the in-memory model, and the one place where
 * any stored projection becomes canonical ternary codes.
 *
 * File loaders live in model_gguf.c and model_hf.c; this file knows nothing
 * of file formats beyond the quant registry, so random models (tests,
 * benchmarks) need none of the file readers.
 */
#include "model.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "model_internal.h"
#include "quant_rules.h"

/* ---- names and hyper-parameters ----------------------------------------- */

const char *bn_proj_name(bn_proj p)
{
    static const char *const names[BN_PROJ_COUNT] = {"q", "k", "v", "o", "gate", "up", "down"};
    return (unsigned)p < BN_PROJ_COUNT ? names[p] : "?";
}

void bn_hparams_2b4t(bn_hparams *hp)
{
    memset(hp, 0, sizeof *hp);
    hp->vocab = 128256;
    hp->dim = 2560;
    hp->ffn = 6912;
    hp->n_layer = 30;
    hp->n_head = 20;
    hp->n_head_kv = 5;
    hp->head_dim = 128;
    hp->n_ctx_train = 4096;
    hp->rope_dim = 128;
    hp->rms_eps = 1e-5f;
    hp->rope_theta = 500000.0f;
    hp->tied_embeddings = true;
    snprintf(hp->arch, sizeof hp->arch, "bitnet-b1.58-2B-4T");
}

/* Generous limits that keep every size product far from overflow. */
#define MAX_DIM (1 << 16)
#define MAX_FFN (1 << 18)
#define MAX_VOCAB (1 << 22)
#define MAX_LAYERS 1024
#define MAX_CTX (1 << 22)

static bn_status bad_hparam(bn_error *err, const char *field, long long value, const char *rule)
{
    return bn_error_set(err, BN_ERR_FORMAT, "the model's metadata is inconsistent",
                        "hyper-parameter %s = %lld: %s", field, value, rule);
}

bn_status bn_hparams_validate(const bn_hparams *hp, bn_error *err)
{
    if (hp->vocab <= 0 || hp->vocab > MAX_VOCAB)
        return bad_hparam(err, "vocab", hp->vocab, "must be in 1..4194304");
    if (hp->dim <= 0 || hp->dim > MAX_DIM)
        return bad_hparam(err, "dim", hp->dim, "must be in 1..65536");
    if (hp->ffn <= 0 || hp->ffn > MAX_FFN)
        return bad_hparam(err, "ffn", hp->ffn, "must be in 1..262144");
    if (hp->n_layer <= 0 || hp->n_layer > MAX_LAYERS)
        return bad_hparam(err, "n_layer", hp->n_layer, "must be in 1..1024");
    if (hp->n_head <= 0 || hp->n_head > hp->dim)
        return bad_hparam(err, "n_head", hp->n_head, "must be in 1..dim");
    if (hp->n_head_kv <= 0 || hp->n_head_kv > hp->n_head)
        return bad_hparam(err, "n_head_kv", hp->n_head_kv, "must be in 1..n_head");
    if (hp->n_head % hp->n_head_kv != 0)
        return bad_hparam(err, "n_head_kv", hp->n_head_kv,
                          "must divide n_head (each kv head serves a whole group)");
    if (hp->head_dim <= 0 || hp->head_dim % 2 != 0 || hp->head_dim > MAX_DIM)
        return bad_hparam(err, "head_dim", hp->head_dim, "must be a positive even number");
    if ((int64_t)hp->n_head * hp->head_dim > MAX_DIM)
        return bad_hparam(err, "n_head * head_dim", (long long)hp->n_head * hp->head_dim,
                          "is too large");
    if (hp->rope_dim <= 0 || hp->rope_dim % 2 != 0 || hp->rope_dim > hp->head_dim)
        return bad_hparam(err, "rope_dim", hp->rope_dim, "must be even and in 2..head_dim");
    if (hp->n_ctx_train <= 0 || hp->n_ctx_train > MAX_CTX)
        return bad_hparam(err, "n_ctx_train", hp->n_ctx_train, "must be in 1..4194304");
    if (!(hp->rms_eps > 0.0f) || !isfinite(hp->rms_eps) || hp->rms_eps > 1.0f)
        return bn_error_set(err, BN_ERR_FORMAT, "the model's metadata is inconsistent",
                            "hyper-parameter rms_eps = %g must be in (0, 1]", (double)hp->rms_eps);
    if (!(hp->rope_theta > 0.0f) || !isfinite(hp->rope_theta))
        return bn_error_set(err, BN_ERR_FORMAT, "the model's metadata is inconsistent",
                            "hyper-parameter rope_theta = %g must be positive",
                            (double)hp->rope_theta);
    return BN_OK;
}

void bn_hparams_proj_shape(const bn_hparams *hp, bn_proj p, int64_t *n, int64_t *k)
{
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    switch (p) {
    case BN_PROJ_Q: *n = q_dim; *k = hp->dim; break;
    case BN_PROJ_K:
    case BN_PROJ_V: *n = kv_dim; *k = hp->dim; break;
    case BN_PROJ_O: *n = hp->dim; *k = q_dim; break;
    case BN_PROJ_GATE:
    case BN_PROJ_UP: *n = hp->ffn; *k = hp->dim; break;
    case BN_PROJ_DOWN: *n = hp->dim; *k = hp->ffn; break;
    default: *n = *k = 0; break;
    }
}

int64_t bn_hparams_norm_size(const bn_hparams *hp, bn_norm which)
{
    switch (which) {
    case BN_NORM_ATTN:
    case BN_NORM_FFN: return hp->dim;
    /* transformers sizes it hidden_size; the o projection's input is
     * n_head * head_dim, equal in every released checkpoint. */
    case BN_NORM_ATTN_SUB: return (int64_t)hp->n_head * hp->head_dim;
    case BN_NORM_FFN_SUB: return hp->ffn;
    default: return 0;
    }
}

int64_t bn_hparams_ternary_count(const bn_hparams *hp)
{
    int64_t total = 0;
    for (int p = 0; p < BN_PROJ_COUNT; p++) {
        int64_t n, k;
        bn_hparams_proj_shape(hp, (bn_proj)p, &n, &k);
        total += n * k;
    }
    return total * hp->n_layer;
}

/* ---- the model object ---------------------------------------------------- */

static int64_t norms_per_layer(const bn_hparams *hp)
{
    int64_t total = 0;
    for (int i = 0; i < BN_NORM_COUNT; i++)
        total += bn_hparams_norm_size(hp, (bn_norm)i);
    return total;
}

bn_status bn_checkpoint_check_fits(const bn_hparams *hp, uint64_t source_bytes, const char *source,
                                   bn_error *err)
{
    bn_status st = bn_hparams_validate(hp, err);
    if (st != BN_OK)
        return st;
    /* The smallest encodings a file can use: 1.6875 bits per ternary weight
     * (TQ1_0) and 2 bytes per norm weight (F16/BF16). A file smaller than
     * that cannot hold the model its metadata describes; saying so here
     * keeps a tiny malformed file from making the loader allocate and fill
     * tables sized by its claims. */
    const double ternary = (double)bn_hparams_ternary_count(hp) * 54.0 / 256.0;
    const double norms = 2.0 * (double)(norms_per_layer(hp) * hp->n_layer + hp->dim);
    if ((double)source_bytes < ternary + norms)
        return bn_error_set(err, BN_ERR_FORMAT, "the file is truncated or its metadata is wrong",
                            "%s holds %llu bytes, but the model it describes (%d layers, dim %d, "
                            "ffn %d) needs at least %.0f",
                            source, (unsigned long long)source_bytes, hp->n_layer, hp->dim,
                            hp->ffn, ternary + norms);
    return BN_OK;
}

bn_status bn_checkpoint_alloc(const bn_hparams *hp, bn_checkpoint **out, bn_error *err)
{
    *out = NULL;
    bn_status st = bn_hparams_validate(hp, err);
    if (st != BN_OK)
        return st;
    bn_checkpoint *m = calloc(1, sizeof *m);
    if (!m)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a model");
    m->hp = *hp;
    m->proj = calloc((size_t)hp->n_layer * BN_PROJ_COUNT, sizeof *m->proj);
    const int64_t n_norm = norms_per_layer(hp) * hp->n_layer + hp->dim;
    m->norms = malloc((size_t)n_norm * sizeof(float));
    if (!m->proj || !m->norms) {
        bn_checkpoint_free(m);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a model's tables");
    }
    for (int64_t i = 0; i < n_norm; i++)
        m->norms[i] = 1.0f;
    *out = m;
    return BN_OK;
}

void bn_checkpoint_free(bn_checkpoint *m)
{
    if (!m)
        return;
    if (m->tokenizer && m->free_tokenizer)
        m->free_tokenizer(m->tokenizer);
    if (m->source && m->close_source)
        m->close_source(m->source);
    free(m->owned);
    free(m->norms);
    free(m->proj);
    free(m);
}

bn_proj_tensor *bn_checkpoint_proj_slot(bn_checkpoint *m, int layer, bn_proj which)
{
    return &m->proj[(size_t)layer * BN_PROJ_COUNT + (size_t)which];
}

static int64_t norm_offset(const bn_hparams *hp, int layer, bn_norm which)
{
    int64_t off = (int64_t)layer * norms_per_layer(hp);
    for (int i = 0; i < (int)which; i++)
        off += bn_hparams_norm_size(hp, (bn_norm)i);
    return off;
}

float *bn_checkpoint_norm_slot(bn_checkpoint *m, int layer, bn_norm which)
{
    return m->norms + norm_offset(&m->hp, layer, which);
}

float *bn_checkpoint_output_norm_slot(bn_checkpoint *m)
{
    return m->norms + norms_per_layer(&m->hp) * m->hp.n_layer;
}

const bn_hparams *bn_checkpoint_hparams(const bn_checkpoint *m)
{
    return &m->hp;
}

const float *bn_checkpoint_norm(const bn_checkpoint *m, int layer, bn_norm which)
{
    if (layer < 0 || layer >= m->hp.n_layer || (unsigned)which >= BN_NORM_COUNT)
        return NULL;
    return m->norms + norm_offset(&m->hp, layer, which);
}

const float *bn_checkpoint_output_norm(const bn_checkpoint *m)
{
    return m->norms + norms_per_layer(&m->hp) * m->hp.n_layer;
}

const bn_dense_matrix *bn_checkpoint_lm_head(const bn_checkpoint *m)
{
    return &m->lm_head;
}
const bn_dense_matrix *bn_checkpoint_embedding(const bn_checkpoint *m)
{
    return &m->embedding;
}
const struct bn_tokenizer *bn_checkpoint_tokenizer(const bn_checkpoint *m)
{
    return m->tokenizer;
}
uint64_t bn_checkpoint_weight_bytes(const bn_checkpoint *m)
{
    return m->weight_bytes;
}

bn_qtype bn_checkpoint_projection_type(const bn_checkpoint *m, int layer, bn_proj which)
{
    return m->proj[(size_t)layer * BN_PROJ_COUNT + (size_t)which].type;
}

/* ---- helpers for the loaders --------------------------------------------- */

const char *bn_checkpoint_qtype_label(bn_qtype type, char *buf, size_t size)
{
    const bn_qtype_info *q = bn_qtype_get(type);
    const char *name = q ? q->name : "unknown";
    size_t i = 0;
    for (; name[i] && i + 1 < size; i++)
        buf[i] = (char)toupper((unsigned char)name[i]);
    if (size)
        buf[i] = '\0';
    if (type == BN_QTYPE_HF_PACKED)
        snprintf(buf, size, "packed uint8");
    return buf;
}

void bn_checkpoint_proj_types_label(const bn_checkpoint *m, char *buf, size_t size)
{
    /* Distinct types in order of first appearance. */
    bn_qtype seen[8];
    int n_seen = 0;
    for (int64_t i = 0; i < (int64_t)m->hp.n_layer * BN_PROJ_COUNT; i++) {
        bn_qtype t = m->proj[i].type;
        bool known = false;
        for (int j = 0; j < n_seen; j++)
            known = known || seen[j] == t;
        if (!known && n_seen < 8)
            seen[n_seen++] = t;
    }
    size_t used = 0;
    buf[0] = '\0';
    if (n_seen > 1)
        used += (size_t)snprintf(buf, size, "mixed ");
    for (int j = 0; j < n_seen && used < size; j++) {
        char label[32];
        used += (size_t)snprintf(buf + used, size - used, "%s%s", j ? "/" : "",
                                 bn_checkpoint_qtype_label(seen[j], label, sizeof label));
    }
}

bn_status bn_checkpoint_floats_from(bn_qtype type, const void *src, size_t src_bytes, int64_t n,
                                    float *dst, const char *what, bn_error *err)
{
    size_t elem = type == BN_QTYPE_F32 ? 4 : (type == BN_QTYPE_F16 || type == BN_QTYPE_BF16) ? 2 : 0;
    if (!elem) {
        char label[32];
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "norm weights must be F32, F16 or BF16",
                            "%s is stored as %s", what,
                            bn_checkpoint_qtype_label(type, label, sizeof label));
    }
    if (src_bytes < (size_t)n * elem)
        return bn_error_set(err, BN_ERR_FORMAT, "the file is truncated or the shape is wrong",
                            "%s needs %zu bytes, has %zu", what, (size_t)n * elem, src_bytes);
    bn_qtype_get(type)->dequantize_row(src, dst, n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return bn_error_set(err, BN_ERR_FORMAT, "the file is corrupt",
                                "%s element %lld is not a finite number", what, (long long)i);
    return BN_OK;
}

bn_status bn_checkpoint_dense_check(bn_dense_matrix *d, size_t bytes_available, const char *what,
                                    bn_error *err)
{
    const bn_qtype_info *q = bn_qtype_get(d->type);
    if (!q || q->ternary || !q->dequantize_row)
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "embeddings and LM heads may be F32, F16, BF16, Q8_0, Q4_K or Q6_K",
                            "%s has type %s, which bitnet cannot use for a dense matrix", what,
                            q ? q->name : "unknown");
    size_t need;
    bn_error sub;
    if (bn_qtype_tensor_size(d->type, d->rows, d->cols, &need, &sub) != BN_OK)
        return bn_error_set(err, BN_ERR_FORMAT, sub.hint, "%s: %s", what, sub.message);
    if (bytes_available < need)
        return bn_error_set(err, BN_ERR_FORMAT, "the file is truncated or the shape is wrong",
                            "%s (%s, %lld x %lld) needs %zu bytes, has %zu", what, q->name,
                            (long long)d->rows, (long long)d->cols, need, bytes_available);
    d->row_bytes = need / (size_t)d->rows;
    return BN_OK;
}

bn_status bn_checkpoint_proj_set(bn_proj_tensor *p, const char *name, bn_qtype type,
                                 const void *data, size_t bytes_available, int64_t n, int64_t k,
                                 bool dense_is_master, bn_error *err)
{
    const bn_qtype_info *q = bn_qtype_get(type);
    const bool dense_float = type == BN_QTYPE_F32 || type == BN_QTYPE_F16 || type == BN_QTYPE_BF16;
    if (!q || (!q->ternary && !dense_float) || (q->ternary && !q->unpack))
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "projections may be I2_S, TQ1_0, TQ2_0, TL1, TL2, HF packed, or "
                            "F32/F16/BF16",
                            "projection %s has type %s, which bitnet cannot read as ternary", name,
                            q ? q->name : "unknown");
    size_t need;
    bn_error sub;
    bn_status st = bn_qtype_tensor_size(type, n, k, &need, &sub);
    if (st != BN_OK)
        return bn_error_set(err, st == BN_ERR_UNSUPPORTED ? st : BN_ERR_FORMAT, sub.hint,
                            "projection %s: %s", name, sub.message);
    if (bytes_available < need)
        return bn_error_set(err, BN_ERR_FORMAT, "the file is truncated or the shape is wrong",
                            "projection %s (%s, %lld x %lld) needs %zu bytes, has %zu", name,
                            q->name, (long long)n, (long long)k, need, bytes_available);
    memset(p, 0, sizeof *p);
    p->source = q->ternary ? BN_PROJ_SRC_TERNARY
                           : dense_is_master ? BN_PROJ_SRC_DENSE_ABSMEAN : BN_PROJ_SRC_DENSE_VALUES;
    p->type = type;
    p->data = data;
    p->bytes = bytes_available;
    p->n = n;
    p->k = k;
    p->extra_scale = 1.0f;
    snprintf(p->name, sizeof p->name, "%s", name);
    return BN_OK;
}

/* ---- random models -------------------------------------------------------- */

/* splitmix64: tiny, good enough, and identical on every machine. */
static uint64_t mix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *state, float lo, float hi)
{
    return lo + (hi - lo) * (float)((mix64(state) >> 40) * (1.0 / 16777216.0));
}

/* Every random stream of a model starts from (seed, purpose, layer, which). */
static uint64_t stream_seed(uint64_t seed, uint64_t purpose, int layer, int which)
{
    uint64_t s = seed ^ (purpose * 0x5851f42d4c957f2dull);
    s ^= ((uint64_t)(uint32_t)layer << 20) ^ ((uint64_t)(uint32_t)which << 8);
    (void)mix64(&s);
    return s;
}

enum { STREAM_CODES = 1, STREAM_SCALE, STREAM_NORM, STREAM_EMBED, STREAM_HEAD };

static void random_codes(uint64_t seed, int layer, bn_proj which, int8_t *codes, int64_t count)
{
    uint64_t s = stream_seed(seed, STREAM_CODES, layer, (int)which);
    for (int64_t i = 0; i < count;) {
        uint64_t r = mix64(&s);
        /* eight codes per draw: (byte * 3) >> 8 maps 0..255 onto 0, 1, 2 */
        for (int b = 0; b < 8 && i < count; b++, i++)
            codes[i] = (int8_t)((int)((((r >> (8 * b)) & 0xff) * 3) >> 8) - 1);
    }
}

static float random_scale(uint64_t seed, int layer, bn_proj which, int64_t k)
{
    uint64_t s = stream_seed(seed, STREAM_SCALE, layer, (int)which);
    return uniform(&s, 0.5f, 1.5f) / sqrtf((float)k);
}

/* Random F16 values built directly as bit patterns (a float -> half
 * conversion per element would dominate creating the 2B shape): random sign
 * and mantissa, exponent 11..14, so magnitudes lie in [1/16, 1). */
static void random_f16_matrix(uint64_t seed, int purpose, int64_t rows, int64_t cols,
                              uint16_t *dst)
{
    uint64_t s = stream_seed(seed, (uint64_t)purpose, 0, 0);
    const int64_t count = rows * cols;
    for (int64_t i = 0; i < count;) {
        uint64_t r = mix64(&s);
        for (int b = 0; b < 4 && i < count; b++, i++) {
            const uint16_t bits = (uint16_t)(r >> (16 * b));
            const uint16_t exponent = (uint16_t)(11 + ((bits >> 10) & 3));
            dst[i] = (uint16_t)((bits & 0x83ffu) | (exponent << 10));
        }
    }
}

bn_status bn_checkpoint_create_random(const bn_hparams *hp_in, uint64_t seed, bn_checkpoint **out,
                                      bn_error *err)
{
    *out = NULL;
    bn_hparams hp = *hp_in;
    if (!hp.arch[0])
        snprintf(hp.arch, sizeof hp.arch, "random");
    snprintf(hp.flavour, sizeof hp.flavour,
             "random in-memory model (seed %llu), ternary projections, F16 embeddings, %s",
             (unsigned long long)seed, hp.tied_embeddings ? "tied LM head" : "F16 LM head");
    bn_checkpoint *m;
    bn_status st = bn_checkpoint_alloc(&hp, &m, err);
    if (st != BN_OK)
        return st;
    m->seed = seed;

    const int64_t emb_elems = (int64_t)hp.vocab * hp.dim;
    const int64_t total = emb_elems * (hp.tied_embeddings ? 1 : 2);
    m->owned = malloc((size_t)total * sizeof(uint16_t));
    if (!m->owned) {
        bn_checkpoint_free(m);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "choose a smaller vocabulary or dim",
                            "no memory for a random %lld x %d embedding", (long long)hp.vocab,
                            hp.dim);
    }
    uint16_t *emb = m->owned;
    random_f16_matrix(seed, STREAM_EMBED, hp.vocab, hp.dim, emb);
    m->embedding = (bn_dense_matrix){BN_QTYPE_F16, hp.vocab, hp.dim, emb,
                                     (size_t)hp.dim * sizeof(uint16_t)};
    m->lm_head = m->embedding;
    if (!hp.tied_embeddings) {
        uint16_t *head = emb + emb_elems;
        random_f16_matrix(seed, STREAM_HEAD, hp.vocab, hp.dim, head);
        m->lm_head.data = head;
    }
    m->weight_bytes = (uint64_t)total * sizeof(uint16_t);

    for (int l = 0; l < hp.n_layer; l++) {
        for (int p = 0; p < BN_PROJ_COUNT; p++) {
            bn_proj_tensor *t = bn_checkpoint_proj_slot(m, l, (bn_proj)p);
            t->source = BN_PROJ_SRC_RANDOM;
            t->type = BN_QTYPE_TQ2_0; /* nominal: codes carry 2 bits */
            bn_hparams_proj_shape(&hp, (bn_proj)p, &t->n, &t->k);
            t->extra_scale = 1.0f;
            snprintf(t->name, sizeof t->name, "random.%d.%s", l, bn_proj_name((bn_proj)p));
        }
        for (int w = 0; w < BN_NORM_COUNT; w++) {
            uint64_t s = stream_seed(seed, STREAM_NORM, l, w);
            float *v = bn_checkpoint_norm_slot(m, l, (bn_norm)w);
            for (int64_t i = 0; i < bn_hparams_norm_size(&hp, (bn_norm)w); i++)
                v[i] = uniform(&s, 0.8f, 1.2f);
        }
    }
    uint64_t s = stream_seed(seed, STREAM_NORM, -1, 0);
    float *v = bn_checkpoint_output_norm_slot(m);
    for (int i = 0; i < hp.dim; i++)
        v[i] = uniform(&s, 0.8f, 1.2f);
    *out = m;
    return BN_OK;
}

/* ---- projections to codes ------------------------------------------------- */

/* A float tensor written by a converter as code * scale: every non-zero
 * value has the same magnitude. Returns false (codes untouched) otherwise. */
static bool read_ternary_values(const float *w, int64_t count, int8_t *codes, float *scale)
{
    float mag = 0.0f;
    for (int64_t i = 0; i < count; i++) {
        float a = fabsf(w[i]);
        if (a == 0.0f)
            continue;
        if (mag == 0.0f)
            mag = a;
        else if (a != mag)
            return false;
    }
    for (int64_t i = 0; i < count; i++)
        codes[i] = (int8_t)(w[i] > 0.0f ? 1 : w[i] < 0.0f ? -1 : 0);
    *scale = mag;
    return true;
}

static bn_status dense_codes(const bn_proj_tensor *t, int8_t *codes, float *scale, bn_error *err)
{
    const int64_t count = t->n * t->k;
    float *w = malloc((size_t)count * sizeof(float));
    if (!w)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "no memory to quantize projection %s (%lld x %lld floats)", t->name,
                            (long long)t->n, (long long)t->k);
    bn_qtype_get(t->type)->dequantize_row(t->data, w, count);
    bn_status st = BN_OK;
    for (int64_t i = 0; i < count; i++) {
        if (!isfinite(w[i])) {
            st = bn_error_set(err, BN_ERR_FORMAT, "the file is corrupt",
                              "projection %s element %lld is not a finite number", t->name,
                              (long long)i);
            break;
        }
    }
    if (st == BN_OK) {
        if (t->source == BN_PROJ_SRC_DENSE_ABSMEAN) {
            bn_quantize_weights_absmean(w, (size_t)count, codes, scale);
        } else if (!read_ternary_values(w, count, codes, scale)) {
            /* Not code * scale: the nearest ternary tensor is absmean's. */
            bn_log(BN_LOG_WARN,
                   "projection %s holds non-ternary values; quantizing it with absmean",
                   t->name);
            bn_quantize_weights_absmean(w, (size_t)count, codes, scale);
        }
    }
    free(w);
    return st;
}

bn_status bn_checkpoint_projection_codes(const bn_checkpoint *m, int layer, bn_proj which,
                                         int8_t *codes, float *scale, bn_error *err)
{
    if (!m || !codes || !scale || layer < 0 || layer >= m->hp.n_layer ||
        (unsigned)which >= BN_PROJ_COUNT)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "projection %d of layer %d does not exist", (int)which, layer);
    const bn_proj_tensor *t = &m->proj[(size_t)layer * BN_PROJ_COUNT + (size_t)which];
    float s = 1.0f;
    bn_status st = BN_OK;
    switch (t->source) {
    case BN_PROJ_SRC_TERNARY: {
        const bn_qtype_info *q = bn_qtype_get(t->type);
        bn_error sub;
        st = q->unpack(t->data, t->bytes, t->n, t->k, codes, &s, &sub);
        if (st != BN_OK)
            return bn_error_set(err, st, sub.hint, "projection %s: %s", t->name, sub.message);
        break;
    }
    case BN_PROJ_SRC_DENSE_ABSMEAN:
    case BN_PROJ_SRC_DENSE_VALUES:
        st = dense_codes(t, codes, &s, err);
        break;
    case BN_PROJ_SRC_RANDOM:
        random_codes(m->seed, layer, which, codes, t->n * t->k);
        s = random_scale(m->seed, layer, which, t->k);
        break;
    case BN_PROJ_SRC_SLICE:
        st = bn_checkpoint_slice_codes(m, layer, which, codes, &s, err);
        break;
    }
    if (st != BN_OK)
        return st;
    *scale = s * t->extra_scale;
    if (!isfinite(*scale))
        return bn_error_set(err, BN_ERR_FORMAT, "the file is corrupt",
                            "projection %s has a scale that is not a finite number", t->name);
    return BN_OK;
}

bn_status bn_checkpoint_embedding_row(const bn_checkpoint *m, int32_t token, float *out,
                                      bn_error *err)
{
    if (token < 0 || token >= m->hp.vocab)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "token ids must come from this model's vocabulary",
                            "token id %d is outside the vocabulary (0..%d)", (int)token,
                            (int)m->hp.vocab - 1);
    const bn_dense_matrix *e = &m->embedding;
    bn_qtype_get(e->type)->dequantize_row((const uint8_t *)e->data + (size_t)token * e->row_bytes,
                                          out, e->cols);
    return BN_OK;
}
