/*
 * convert.c - Hugging Face BitNet directories to GGUF files that other
 * runtimes load (bn_convert_hf_to_gguf), in the conventions of the
 * converter each runtime uses.
 *
 *   i2_s    Microsoft bitnet.cpp (utils/convert-helper-bitnet.py: the HF
 *           checkpoint through convert-ms-to-gguf-bitnet.py, then
 *           llama-quantize I2_S with --token-embedding-type f16 as
 *           setup_env.py --quant-embd does):
 *             general.architecture "bitnet-25", general.file_type 40
 *             (LLAMA_FTYPE_MOSTLY_I2_S), projections I2_S (ggml type 36:
 *             codes, then the float32 scale, padded to n/4 + 32 bytes),
 *             token_embd F16, norms F32, tied models without output.weight;
 *             tokenizer "gpt2" without tokenizer.ggml.pre, token scores
 *             (0 for the BPE vocabulary, -1000 for added tokens),
 *             add_bos_token true.
 *   tq1_0   upstream llama.cpp (convert_hf_to_gguf.py, BitnetModel):
 *   tq2_0     general.architecture "bitnet", general.file_type 36 / 37 / 1
 *   f16       (MOSTLY_TQ1_0 / MOSTLY_TQ2_0 / MOSTLY_F16), rope.scaling.type
 *             "linear" and rope.scaling.factor 1.0; the weight_scale is
 *             folded into the weights (code * scale), so no ".scale"
 *             tensors; projections TQ1_0/TQ2_0 (block scale = the tensor
 *             scale as fp16) or F16, falling back to F16 for a tensor whose
 *             rows are not a multiple of 256 as the converter does;
 *             token_embd and output F16; 1-D tensors and norms F32;
 *             tokenizer "gpt2" with pre "llama-bpe".
 *
 * Both: metadata keys <arch>.vocab_size, context_length, embedding_length,
 * block_count, feed_forward_length, rope.dimension_count,
 * attention.head_count, attention.head_count_kv,
 * attention.layer_norm_rms_epsilon, rope.freq_base; tensor names
 * token_embd, output_norm, [output], blk.N.{attn_norm, attn_q, attn_k,
 * attn_v, attn_output, attn_sub_norm, ffn_norm, ffn_gate, ffn_up, ffn_down,
 * ffn_sub_norm}.weight, Q/K rows not permuted; tokenizer tokens (GPT-2
 * byte-to-unicode strings as in tokenizer.json), token_type (NORMAL 1,
 * CONTROL 3 for special added tokens, USER_DEFINED 4 for other added
 * tokens, UNUSED 5 for "[PADn]" fillers up to the model's vocab), merges,
 * bos/eos/eot ids.
 *
 * The projections come from bn_checkpoint_projection_codes (packed checkpoints
 * as stored, bf16 master weights quantized with absmean as the model was
 * trained), so the file computes exactly what the source does, up to the
 * fp16 rounding of the scale in TQ1_0/TQ2_0/F16.
 *
 * The model API gives every piece in canonical form (ternary codes + scale
 * per projection, float rows of the embedding, float norms), so this file
 * only chooses encodings, names and metadata. The tokenizer metadata comes
 * straight from tokenizer.json, because GGUF stores the BPE vocabulary in
 * the same GPT-2 byte-to-unicode spelling and the merges verbatim.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bitnet.h"
#include "fp16.h"
#include "gguf.h"
#include "model.h"
#include "qtype.h"
#include "safetensors.h"
#include "tokenizer.h"

/* ggml / llama.cpp constants written into the file. */
enum {
    FTYPE_MOSTLY_F16 = 1,
    FTYPE_MOSTLY_TQ1_0 = 36,
    FTYPE_MOSTLY_TQ2_0 = 37,
    FTYPE_MOSTLY_I2_S = 40, /* Microsoft's llama.cpp fork */
    GGML_QUANT_VERSION = 2,
    TOKEN_NORMAL = 1,
    TOKEN_CONTROL = 3,
    TOKEN_USER_DEFINED = 4,
    TOKEN_UNUSED = 5
};

/* Names in bn_convert_type order. */
static const char *const type_names[] = {"i2_s", "tq2_0", "tq1_0", "f16"};
enum { N_TYPES = sizeof type_names / sizeof type_names[0] };

bool bn_convert_type_parse(const char *name, bn_convert_type *out)
{
    for (int i = 0; name && out && i < N_TYPES; i++) {
        if (strcmp(name, type_names[i]) == 0) {
            *out = (bn_convert_type)i;
            return true;
        }
    }
    return false;
}

const char *bn_convert_type_name(bn_convert_type type)
{
    return (unsigned)type < N_TYPES ? type_names[type] : "unknown";
}

void bn_convert_options_default(bn_convert_options *opt)
{
    if (opt)
        memset(opt, 0, sizeof *opt);
}

void bn_convert_remove_temp_files(void)
{
    bn_gguf_writer_remove_temp_files();
}

/* GGUF tensor names of the projections and norms, in bn_proj / bn_norm
 * order. */
static const char *const proj_names[BN_PROJ_COUNT] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
static const char *const norm_names[BN_NORM_COUNT] = {"attn_norm", "attn_sub_norm", "ffn_norm",
                                                      "ffn_sub_norm"};

/* ---- state ----------------------------------------------------------------- */

typedef struct conv {
    bn_convert_type type;
    const char *arch;
    bn_gguf_writer *w;
    bn_checkpoint *model;
    bn_hf_dir *dir;
    /* Buffers handed to the writer, freed after it finishes. */
    void **bufs;
    size_t n_bufs, cap_bufs;
    bn_convert_report rep;
} conv;

static bool keep(conv *c, void *p)
{
    if (c->n_bufs == c->cap_bufs) {
        size_t cap = c->cap_bufs ? c->cap_bufs * 2 : 64;
        void **b = realloc(c->bufs, cap * sizeof *b);
        if (!b)
            return false;
        c->bufs = b;
        c->cap_bufs = cap;
    }
    c->bufs[c->n_bufs++] = p;
    return true;
}

static bn_status oom(bn_error *err, const char *what)
{
    return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "free some memory and try again",
                        "no memory for %s", what);
}

/* ---- metadata -------------------------------------------------------------- */

static bn_status set_arch_u32(conv *c, const char *key, uint32_t v, bn_error *err)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", c->arch, key);
    return bn_gguf_writer_set_u32(c->w, full, v, err);
}

static bn_status set_arch_f32(conv *c, const char *key, float v, bn_error *err)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", c->arch, key);
    return bn_gguf_writer_set_f32(c->w, full, v, err);
}

static const char *dir_basename(const char *path, char *buf, size_t size)
{
    snprintf(buf, size, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = '\0';
    const char *slash = strrchr(buf, '/');
    return slash ? slash + 1 : buf;
}

static bn_status write_hparams(conv *c, const char *hf_dir, bn_error *err)
{
    const bn_hparams *hp = bn_checkpoint_hparams(c->model);
    uint32_t ftype = 0;
    switch (c->type) {
    case BN_CONVERT_I2_S: ftype = FTYPE_MOSTLY_I2_S; break;
    case BN_CONVERT_TQ2_0: ftype = FTYPE_MOSTLY_TQ2_0; break;
    case BN_CONVERT_TQ1_0: ftype = FTYPE_MOSTLY_TQ1_0; break;
    case BN_CONVERT_F16: ftype = FTYPE_MOSTLY_F16; break;
    }
    char name_buf[512];
    bn_status st = bn_gguf_writer_set_str(c->w, "general.architecture", c->arch, err);
    if (st == BN_OK)
        st = bn_gguf_writer_set_str(c->w, "general.name",
                                    dir_basename(hf_dir, name_buf, sizeof name_buf), err);
    if (st == BN_OK)
        st = bn_gguf_writer_set_u32(c->w, "general.file_type", ftype, err);
    if (st == BN_OK)
        st = bn_gguf_writer_set_u32(c->w, "general.quantization_version", GGML_QUANT_VERSION, err);
    if (st == BN_OK)
        st = set_arch_u32(c, "vocab_size", (uint32_t)hp->vocab, err);
    if (st == BN_OK)
        st = set_arch_u32(c, "context_length", (uint32_t)hp->n_ctx_train, err);
    if (st == BN_OK)
        st = set_arch_u32(c, "embedding_length", (uint32_t)hp->dim, err);
    if (st == BN_OK)
        st = set_arch_u32(c, "block_count", (uint32_t)hp->n_layer, err);
    if (st == BN_OK)
        st = set_arch_u32(c, "feed_forward_length", (uint32_t)hp->ffn, err);
    if (st == BN_OK)
        st = set_arch_u32(c, "rope.dimension_count", (uint32_t)hp->rope_dim, err);
    if (st == BN_OK)
        st = set_arch_u32(c, "attention.head_count", (uint32_t)hp->n_head, err);
    if (st == BN_OK)
        st = set_arch_u32(c, "attention.head_count_kv", (uint32_t)hp->n_head_kv, err);
    /* Only when head_dim is not dim / n_head: the converters write these
     * keys just for configs that name head_dim. */
    if (st == BN_OK && hp->head_dim * hp->n_head != hp->dim) {
        st = set_arch_u32(c, "attention.key_length", (uint32_t)hp->head_dim, err);
        if (st == BN_OK)
            st = set_arch_u32(c, "attention.value_length", (uint32_t)hp->head_dim, err);
    }
    if (st == BN_OK)
        st = set_arch_f32(c, "attention.layer_norm_rms_epsilon", hp->rms_eps, err);
    if (st == BN_OK)
        st = set_arch_f32(c, "rope.freq_base", hp->rope_theta, err);
    if (st == BN_OK && strcmp(c->arch, "bitnet") == 0) {
        char key[128];
        snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch);
        st = bn_gguf_writer_set_str(c->w, key, "linear", err);
        if (st == BN_OK)
            st = set_arch_f32(c, "rope.scaling.factor", 1.0f, err);
    }
    return st;
}

/* ---- tokenizer ------------------------------------------------------------- */

typedef struct vocab {
    char **tokens;
    int32_t *types;
    float *scores;
    int32_t n;
    char **merges;
    uint64_t n_merges;
} vocab;

static void vocab_free(vocab *v)
{
    for (int32_t i = 0; v->tokens && i < v->n; i++)
        free(v->tokens[i]);
    for (uint64_t i = 0; v->merges && i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->scores);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

static char *read_text_file(const char *path, bn_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        bn_error_set(err, BN_ERR_IO, NULL, "cannot open %s", path);
        return NULL;
    }
    char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    /* tokenizer.json of a 128K vocabulary is ~9 MB; refuse absurd sizes. */
    if (size < 0 || size > (1L << 30) || fseek(f, 0, SEEK_SET) != 0) {
        bn_error_set(err, BN_ERR_IO, NULL, "cannot read %s", path);
    } else if (!(buf = malloc((size_t)size + 1))) {
        oom(err, "tokenizer.json");
    } else if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        bn_error_set(err, BN_ERR_IO, NULL, "cannot read %s", path);
        free(buf);
        buf = NULL;
    } else {
        buf[size] = '\0';
    }
    fclose(f);
    return buf;
}

static bn_status bad_tok(bn_error *err, const char *path, const char *what)
{
    return bn_error_set(err, BN_ERR_FORMAT,
                        "the tokenizer.json is not a BPE tokenizer bitnet knows", "%s: %s", path,
                        what);
}

static bn_status set_token(vocab *v, int64_t id, const char *text, int32_t type, const char *path,
                           bn_error *err)
{
    if (id < 0 || id >= v->n)
        return bn_error_set(err, BN_ERR_FORMAT, "the tokenizer does not match the model",
                            "%s: token id %lld is outside the model's vocabulary of %d", path,
                            (long long)id, (int)v->n);
    free(v->tokens[id]);
    v->tokens[id] = strdup(text);
    v->types[id] = type;
    if (!v->tokens[id])
        return oom(err, "the vocabulary");
    return BN_OK;
}

/* Added tokens that the converters treat as control tokens even when
 * tokenizer.json does not mark them special: "<|...|>". */
static bool looks_special(const char *s)
{
    size_t n = strlen(s);
    return n >= 4 && strncmp(s, "<|", 2) == 0 && strcmp(s + n - 2, "|>") == 0;
}

static bn_status parse_vocab(const char *path, int32_t model_vocab, vocab *v, bn_error *err)
{
    char *text = read_text_file(path, err);
    if (!text)
        return err ? err->status : BN_ERR_IO;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root)
        return bad_tok(err, path, "not valid JSON");

    bn_status st = BN_OK;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vmap = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0) {
        st = bad_tok(err, path, "model.type is not \"BPE\"");
        goto out;
    }
    if (!cJSON_IsObject(vmap) || !cJSON_IsArray(merges)) {
        st = bad_tok(err, path, "model.vocab or model.merges is missing");
        goto out;
    }

    v->n = model_vocab;
    v->tokens = calloc((size_t)v->n, sizeof *v->tokens);
    v->types = calloc((size_t)v->n, sizeof *v->types);
    v->scores = calloc((size_t)v->n, sizeof *v->scores);
    if (!v->tokens || !v->types || !v->scores) {
        st = oom(err, "the vocabulary");
        goto out;
    }
    for (const cJSON *it = vmap->child; it && st == BN_OK; it = it->next) {
        if (!cJSON_IsNumber(it) || !it->string) {
            st = bad_tok(err, path, "a model.vocab entry is not a token id");
            break;
        }
        st = set_token(v, (int64_t)it->valuedouble, it->string, TOKEN_NORMAL, path, err);
    }
    for (const cJSON *it = added ? added->child : NULL; it && st == BN_OK; it = it->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *special = cJSON_GetObjectItemCaseSensitive(it, "special");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(content)) {
            st = bad_tok(err, path, "an added_tokens entry lacks id or content");
            break;
        }
        const bool control = cJSON_IsTrue(special) || looks_special(content->valuestring);
        st = set_token(v, (int64_t)id->valuedouble, content->valuestring,
                       control ? TOKEN_CONTROL : TOKEN_USER_DEFINED, path, err);
        if (st == BN_OK)
            v->scores[(int64_t)id->valuedouble] = -1000.0f;
    }
    /* Ids the tokenizer never uses (the embedding is often padded). */
    for (int32_t i = 0; i < v->n && st == BN_OK; i++) {
        if (v->tokens[i])
            continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%d]", (int)i);
        st = set_token(v, i, pad, TOKEN_UNUSED, path, err);
    }
    if (st != BN_OK)
        goto out;

    v->n_merges = (uint64_t)cJSON_GetArraySize(merges);
    v->merges = calloc(v->n_merges ? v->n_merges : 1, sizeof *v->merges);
    if (!v->merges) {
        st = oom(err, "the merges");
        goto out;
    }
    uint64_t i = 0;
    for (const cJSON *it = merges->child; it; it = it->next, i++) {
        if (cJSON_IsString(it)) {
            v->merges[i] = strdup(it->valuestring);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(it->child) && cJSON_IsString(it->child->next)) {
            /* Newer tokenizers write a merge as ["a", "b"]; GGUF keeps "a b". */
            const char *a = it->child->valuestring, *b = it->child->next->valuestring;
            const size_t len = strlen(a) + strlen(b) + 2;
            v->merges[i] = malloc(len);
            if (v->merges[i])
                snprintf(v->merges[i], len, "%s %s", a, b);
        } else {
            st = bad_tok(err, path, "a model.merges entry is neither \"a b\" nor [\"a\", \"b\"]");
            break;
        }
        if (!v->merges[i]) {
            st = oom(err, "the merges");
            break;
        }
    }
out:
    cJSON_Delete(root);
    if (st != BN_OK)
        vocab_free(v);
    return st;
}

static int32_t find_token(const vocab *v, const char *text)
{
    for (int32_t i = 0; i < v->n; i++)
        if (strcmp(v->tokens[i], text) == 0)
            return i;
    return -1;
}

static bn_status write_tokenizer(conv *c, bn_error *err)
{
    const char *path = bn_hf_dir_tokenizer_path(c->dir);
    if (!path) {
        bn_log(BN_LOG_WARN, "no tokenizer.json: the GGUF file will have no tokenizer and can "
                            "only run from token ids");
        return BN_OK;
    }
    /* tokenizer.ggml.pre names the regex that splits text before the
     * merges, and a GGUF reader takes the regex from that name alone. So
     * the name is written only where it stands for exactly the directory's
     * regex; a directory whose regex no name bitnet reads stands for
     * (GPT-2's, a custom Split) is refused, since its GGUF file would
     * tokenize differently. i2_s files get the name too, although
     * Microsoft's converter leaves it out: bitnet.cpp's llama.cpp reads
     * llama-bpe as LLaMA-3, and without the key falls back to its generic
     * "default" split and warns that generation quality degrades. */
    const bn_tokenizer *src_tok = bn_checkpoint_tokenizer(c->model);
    const char *pre = src_tok ? bn_tokenizer_pre_name(src_tok) : NULL;
    if (!pre) {
        const char *re = src_tok ? bn_tokenizer_pre_regex(src_tok) : NULL;
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "GGUF names only LLaMA-3's pre-tokenizer regex (tokenizer.ggml.pre "
                            "llama-bpe); run the directory itself instead",
                            "%s: the pre-tokenizer regex \"%.120s\" has no GGUF "
                            "tokenizer.ggml.pre name, so a GGUF file would split text "
                            "differently",
                            path, re ? re : "?");
    }
    if (!bn_tokenizer_ignore_merges(src_tok))
        bn_log(BN_LOG_WARN, "%s has ignore_merges off, which GGUF's %s turns on (as llama.cpp "
                            "does): a word that is itself a token becomes that token even where "
                            "the merges would spell it otherwise",
               path, pre);
    vocab v = {0};
    bn_status st = parse_vocab(path, bn_checkpoint_hparams(c->model)->vocab, &v, err);
    if (st != BN_OK)
        return st;

    const bn_hf_config *cfg = bn_hf_dir_config(c->dir);
    int32_t bos = cfg->bos_token_id >= 0 ? cfg->bos_token_id : find_token(&v, "<|begin_of_text|>");
    int32_t eos = cfg->n_eos_token_ids > 0 ? cfg->eos_token_ids[0]
                                           : find_token(&v, "<|end_of_text|>");
    const int32_t eot = find_token(&v, "<|eot_id|>");

    const bool microsoft = c->type == BN_CONVERT_I2_S;
    st = bn_gguf_writer_set_str(c->w, "tokenizer.ggml.model", "gpt2", err);
    if (st == BN_OK)
        st = bn_gguf_writer_set_str(c->w, "tokenizer.ggml.pre", pre, err);
    if (st == BN_OK)
        st = bn_gguf_writer_set_arr_str(c->w, "tokenizer.ggml.tokens",
                                        (const char *const *)v.tokens, (uint64_t)v.n, err);
    if (st == BN_OK && microsoft)
        st = bn_gguf_writer_set_arr_f32(c->w, "tokenizer.ggml.scores", v.scores, (uint64_t)v.n,
                                        err);
    if (st == BN_OK)
        st = bn_gguf_writer_set_arr_i32(c->w, "tokenizer.ggml.token_type", v.types,
                                        (uint64_t)v.n, err);
    if (st == BN_OK)
        st = bn_gguf_writer_set_arr_str(c->w, "tokenizer.ggml.merges",
                                        (const char *const *)v.merges, v.n_merges, err);
    if (st == BN_OK && bos >= 0 && bos < v.n)
        st = bn_gguf_writer_set_u32(c->w, "tokenizer.ggml.bos_token_id", (uint32_t)bos, err);
    if (st == BN_OK && eos >= 0 && eos < v.n)
        st = bn_gguf_writer_set_u32(c->w, "tokenizer.ggml.eos_token_id", (uint32_t)eos, err);
    if (st == BN_OK && eot >= 0)
        st = bn_gguf_writer_set_u32(c->w, "tokenizer.ggml.eot_token_id", (uint32_t)eot, err);
    /* Whether a prompt starts with BOS, as the source tokenizer decides it
     * (LLaMA-3's tokenizer.json adds it in its post-processor), so the file
     * tokenizes exactly as the directory does. Upstream reads the same
     * setting; Microsoft's converter writes true, which is what the real
     * checkpoint's tokenizer says too. */
    if (st == BN_OK)
        st = bn_gguf_writer_set_bool(c->w, "tokenizer.ggml.add_bos_token",
                                     src_tok ? bn_tokenizer_add_bos_default(src_tok) : true, err);
    vocab_free(&v);
    return st;
}

/* ---- tensors --------------------------------------------------------------- */

static bn_status add_tensor(conv *c, const char *name, uint32_t type, uint32_t n_dims,
                            const int64_t *ne, const void *data, uint64_t bytes, bn_error *err)
{
    c->rep.n_tensors++;
    return bn_gguf_writer_add_tensor(c->w, name, type, n_dims, ne, data, bytes, err);
}

/* F16 holds magnitudes up to 65504 (values from 65520 up round to
 * infinity); the reader refuses non-finite elements, so a value F16 cannot
 * hold is an error here rather than a file that does not load. */
static bn_status f16_range_error(bn_error *err, const char *name, const char *what, float v)
{
    if (!isfinite(v))
        return bn_error_set(err, BN_ERR_FORMAT, "the source checkpoint is corrupt",
                            "%s: %s is not a finite number", name, what);
    return bn_error_set(err, BN_ERR_FORMAT,
                        "F16 holds magnitudes up to 65504; this checkpoint cannot be stored in "
                        "this encoding (run it from its directory instead)",
                        "%s: %s is %g, outside the F16 range", name, what, (double)v);
}

static bool f16_is_finite(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }

/* rows x cols floats from a row source, as F16. */
typedef bn_status (*row_fn)(const void *src, int64_t row, float *out, bn_error *err);

static bn_status add_f16_matrix(conv *c, const char *name, int64_t rows, int64_t cols, row_fn fn,
                                const void *src, bn_error *err)
{
    const size_t count = (size_t)rows * (size_t)cols;
    uint16_t *h = malloc(count * sizeof *h);
    float *row = malloc((size_t)cols * sizeof *row);
    if (!h || !row || !keep(c, h)) {
        free(h);
        free(row);
        return oom(err, name);
    }
    bn_status st = BN_OK;
    for (int64_t r = 0; r < rows && st == BN_OK; r++) {
        st = fn(src, r, row, err);
        for (int64_t k = 0; k < cols && st == BN_OK; k++) {
            const uint16_t v = bn_fp32_to_fp16(row[k]);
            if (!f16_is_finite(v)) {
                char what[96];
                snprintf(what, sizeof what, "the value at row %lld, column %lld", (long long)r,
                         (long long)k);
                st = f16_range_error(err, name, what, row[k]);
            }
            h[(size_t)r * (size_t)cols + (size_t)k] = v;
        }
    }
    free(row);
    if (st != BN_OK)
        return st;
    const int64_t ne[2] = {cols, rows};
    return add_tensor(c, name, BN_QTYPE_F16, 2, ne, h, count * sizeof *h, err);
}

static bn_status embedding_row(const void *src, int64_t row, float *out, bn_error *err)
{
    return bn_checkpoint_embedding_row(src, (int32_t)row, out, err);
}

static bn_status lm_head_row(const void *src, int64_t row, float *out, bn_error *err)
{
    (void)err;
    const bn_dense_matrix *m = src;
    bn_qtype_get(m->type)->dequantize_row((const uint8_t *)m->data + (size_t)row * m->row_bytes,
                                          out, m->cols);
    return BN_OK;
}

static bn_status add_norm(conv *c, const char *name, const float *w, int64_t n, bn_error *err)
{
    /* The model keeps its norms as floats for its whole life, and it
     * outlives the writer, so the tensor can point at them directly. */
    const int64_t ne[1] = {n};
    return add_tensor(c, name, BN_QTYPE_F32, 1, ne, w, (uint64_t)n * sizeof(float), err);
}

static bn_qtype ternary_qtype(bn_convert_type t)
{
    switch (t) {
    case BN_CONVERT_I2_S: return BN_QTYPE_I2_S;
    case BN_CONVERT_TQ2_0: return BN_QTYPE_TQ2_0;
    case BN_CONVERT_TQ1_0: return BN_QTYPE_TQ1_0;
    case BN_CONVERT_F16: break;
    }
    return BN_QTYPE_F16;
}

static bn_status add_projection(conv *c, int layer, bn_proj p, int8_t *codes, bn_error *err)
{
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", layer, proj_names[p]);
    const bn_hparams *hp = bn_checkpoint_hparams(c->model);
    int64_t n, k;
    bn_hparams_proj_shape(hp, p, &n, &k);
    float scale;
    bn_status st = bn_checkpoint_projection_codes(c->model, layer, p, codes, &scale, err);
    if (st != BN_OK)
        return st;
    const int64_t ne[2] = {k, n};
    /* Every encoding but I2_S (float32) stores the scale as F16: TQ1_0 and
     * TQ2_0 as the block scale, F16 (and the fallback) as code x scale. */
    if (c->type != BN_CONVERT_I2_S && !f16_is_finite(bn_fp32_to_fp16(scale)))
        return f16_range_error(err, name, "the scale (absmean or weight_scale)", scale);

    const bn_qtype qt = ternary_qtype(c->type);
    if (qt != BN_QTYPE_F16) {
        size_t bytes;
        bn_error shape_err;
        if (bn_qtype_tensor_size(qt, n, k, &bytes, &shape_err) == BN_OK) {
            void *dst = malloc(bytes);
            if (!dst || !keep(c, dst)) {
                free(dst);
                return oom(err, name);
            }
            /* Trailing padding (I2_S) must not carry stale heap bytes. */
            memset(dst, 0, bytes);
            st = bn_qtype_get(qt)->pack(codes, scale, n, k, dst, err);
            if (st != BN_OK)
                return st;
            c->rep.n_ternary++;
            return add_tensor(c, name, qt, 2, ne, dst, bytes, err);
        }
        /* llama.cpp's converter does the same when a row does not fit the
         * block size. */
        bn_log(BN_LOG_INFO, "%s: %s; writing it as F16", name, shape_err.message);
        c->rep.n_f16_fallback++;
    } else {
        c->rep.n_ternary++;
    }

    /* code * scale in F16: what upstream's --outtype f16 writes. */
    const size_t count = (size_t)n * (size_t)k;
    uint16_t *h = malloc(count * sizeof *h);
    if (!h || !keep(c, h)) {
        free(h);
        return oom(err, name);
    }
    const uint16_t plus = bn_fp32_to_fp16(scale);
    if (!f16_is_finite(plus)) /* an I2_S fallback */
        return f16_range_error(err, name, "the scale (absmean or weight_scale)", scale);
    const uint16_t minus = (uint16_t)(plus ^ 0x8000u);
    for (size_t i = 0; i < count; i++)
        h[i] = codes[i] > 0 ? plus : codes[i] < 0 ? minus : 0;
    return add_tensor(c, name, BN_QTYPE_F16, 2, ne, h, count * sizeof *h, err);
}

static bn_status write_tensors(conv *c, bn_convert_progress progress, void *ctx, bn_error *err)
{
    const bn_hparams *hp = bn_checkpoint_hparams(c->model);
    const uint64_t total = 1 + (uint64_t)hp->n_layer * (BN_PROJ_COUNT + BN_NORM_COUNT) + 1 +
                           (hp->tied_embeddings ? 0 : 1);
    uint64_t done = 0;

    bn_status st = add_f16_matrix(c, "token_embd.weight", hp->vocab, hp->dim, embedding_row,
                                  c->model, err);
    if (progress)
        progress(ctx, "packing", ++done, total);

    size_t max_codes = 0;
    for (int p = 0; p < BN_PROJ_COUNT; p++) {
        int64_t n, k;
        bn_hparams_proj_shape(hp, (bn_proj)p, &n, &k);
        if ((size_t)(n * k) > max_codes)
            max_codes = (size_t)(n * k);
    }
    int8_t *codes = st == BN_OK ? malloc(max_codes) : NULL;
    if (st == BN_OK && !codes)
        st = oom(err, "the ternary codes");

    /* Per layer in the order of the block: attention, then feed-forward. */
    static const struct {
        bool is_norm;
        int which;
    } order[] = {{true, BN_NORM_ATTN},     {false, BN_PROJ_Q},    {false, BN_PROJ_K},
                 {false, BN_PROJ_V},       {false, BN_PROJ_O},    {true, BN_NORM_ATTN_SUB},
                 {true, BN_NORM_FFN},      {false, BN_PROJ_GATE}, {false, BN_PROJ_UP},
                 {false, BN_PROJ_DOWN},    {true, BN_NORM_FFN_SUB}};
    for (int l = 0; l < hp->n_layer && st == BN_OK; l++) {
        for (size_t i = 0; i < sizeof order / sizeof order[0] && st == BN_OK; i++) {
            if (order[i].is_norm) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, norm_names[order[i].which]);
                st = add_norm(c, name, bn_checkpoint_norm(c->model, l, (bn_norm)order[i].which),
                              bn_hparams_norm_size(hp, (bn_norm)order[i].which), err);
            } else {
                st = add_projection(c, l, (bn_proj)order[i].which, codes, err);
            }
            if (progress)
                progress(ctx, "packing", ++done, total);
        }
    }
    free(codes);
    if (st == BN_OK)
        st = add_norm(c, "output_norm.weight", bn_checkpoint_output_norm(c->model), hp->dim, err);
    if (progress && st == BN_OK)
        progress(ctx, "packing", ++done, total);
    if (st == BN_OK && !hp->tied_embeddings) {
        const bn_dense_matrix *head = bn_checkpoint_lm_head(c->model);
        st = add_f16_matrix(c, "output.weight", head->rows, head->cols, lm_head_row, head, err);
        if (progress && st == BN_OK)
            progress(ctx, "packing", ++done, total);
    }
    return st;
}

/* ---- driver ---------------------------------------------------------------- */

typedef struct write_progress {
    bn_convert_progress fn;
    void *ctx;
} write_progress;

static void on_write(void *ctx, uint64_t done, uint64_t total)
{
    const write_progress *wp = ctx;
    wp->fn(wp->ctx, "writing", done, total);
}

bn_status bn_convert_hf_to_gguf(const char *hf_dir, const char *out_path,
                                const bn_convert_options *opt, bn_convert_report *report,
                                bn_error *err)
{
    if (report)
        memset(report, 0, sizeof *report);
    bn_convert_options defaults;
    bn_convert_options_default(&defaults);
    if (!opt)
        opt = &defaults;
    const bn_convert_type type = opt->type;
    const bn_convert_progress progress = opt->progress;
    void *const ctx = opt->user;
    if (!hf_dir || !out_path)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_convert_hf_to_gguf: NULL %s", !hf_dir ? "hf_dir" : "out_path");
    if ((unsigned)type >= N_TYPES)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "use i2_s, tq2_0, tq1_0 or f16",
                            "unknown output type %d", (int)type);
    struct stat sb;
    if (stat(hf_dir, &sb) != 0)
        return bn_error_set(err, BN_ERR_IO, "check the path", "cannot open %s", hf_dir);
    if (!S_ISDIR(sb.st_mode))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "convert reads a Hugging Face model directory (config.json, "
                            "*.safetensors, tokenizer.json)",
                            "%s is not a directory", hf_dir);

    /* Refused before the work, and again by the writer at the end. */
    bn_status st = bn_gguf_check_output_path(out_path, err);
    if (st != BN_OK)
        return st;

    conv c = {.type = type, .arch = type == BN_CONVERT_I2_S ? "bitnet-25" : "bitnet"};
    st = bn_checkpoint_load_hf_dir(hf_dir, &c.model, err);
    if (st == BN_OK)
        st = bn_hf_dir_open(hf_dir, &c.dir, err);
    if (st == BN_OK)
        st = bn_gguf_writer_create(&c.w, err);
    if (st == BN_OK)
        st = write_hparams(&c, hf_dir, err);
    if (st == BN_OK)
        st = write_tokenizer(&c, err);
    if (st == BN_OK)
        st = write_tensors(&c, progress, ctx, err);
    if (st == BN_OK) {
        write_progress wp = {progress, ctx};
        st = bn_gguf_writer_finish(c.w, out_path, progress ? on_write : NULL, &wp, err);
    }
    if (st == BN_OK) {
        snprintf(c.rep.architecture, sizeof c.rep.architecture, "%s", c.arch);
        if (stat(out_path, &sb) == 0)
            c.rep.file_bytes = (uint64_t)sb.st_size;
        if (report)
            *report = c.rep;
    }
    bn_gguf_writer_free(c.w);
    for (size_t i = 0; i < c.n_bufs; i++)
        free(c.bufs[i]);
    free(c.bufs);
    bn_hf_dir_close(c.dir);
    bn_checkpoint_free(c.model);
    return st;
}
