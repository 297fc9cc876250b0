/*
 * hf_dir.c - Hugging Face model directories: config.json, the safetensors
 * weights (one file, or shards listed by model.safetensors.index.json),
 * tokenizer.json and generation_config.json.
 *
 * Field names and defaults follow transformers' BitNetConfig
 * (models/bitnet/configuration_bitnet.py) and BitNetQuantConfig
 * (utils/quantization_config.py), except where safetensors.h documents a
 * runtime choice (bos_token_id -1 and no eos ids when absent). Both layouts
 * of the RoPE base are read: transformers 4 writes a top-level rope_theta,
 * transformers 5 writes rope_parameters {rope_theta, rope_type} instead (and
 * reads a legacy rope_scaling object as rope_parameters). Settings that
 * would change the computation in ways bitnet does not implement are
 * refused rather than ignored; keys bitnet does not read are named in a
 * warning, except bookkeeping that cannot change the output.
 */
#include "safetensors.h"
#include "path_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* config.json is about 1 KB and an index about 50 KB; a file far larger
 * than this is not what its name says. */
#define HF_JSON_MAX ((long)64 * 1024 * 1024)

#define HF_MAX_EOS ((int)(sizeof(((bn_hf_config *)0)->eos_token_ids) / sizeof(int)))

#define HF_HINT_DIR                                                                        \
    "pass a Hugging Face model directory (config.json plus model.safetensors), e.g. one " \
    "made by `huggingface-cli download microsoft/bitnet-b1.58-2B-4T --local-dir DIR`"

typedef struct dir_entry {
    const bn_st_tensor *tensor;
    size_t shard;              /* index into bn_hf_dir.shards */
} dir_entry;

struct bn_hf_dir {
    bn_hf_config config;
    char *tokenizer_path;
    bool has_gen_eos;
    int gen_eos[HF_MAX_EOS];
    int n_gen_eos;
    char **shard_names;        /* file names, sorted */
    bn_safetensors **shards;
    size_t n_shards;
    dir_entry *entries;        /* every shard's tensors, sorted by name */
    size_t n_entries;
};

/* ---- small helpers ----------------------------------------------------------- */


static const char *json_type_name(const cJSON *item)
{
    if (cJSON_IsString(item))
        return "a string";
    if (cJSON_IsNumber(item))
        return "a number";
    if (cJSON_IsBool(item))
        return "a boolean";
    if (cJSON_IsNull(item))
        return "null";
    if (cJSON_IsArray(item))
        return "an array";
    if (cJSON_IsObject(item))
        return "an object";
    return "an unknown value";
}

static bool is_regular_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bn_status join_path(char *buf, size_t size, const char *dir, const char *name,
                           bn_error *err)
{
    int n = snprintf(buf, size, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= size)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "use a shorter path",
                            "path %s/%s is too long", dir, name);
    return BN_OK;
}

/* Reads and parses a whole JSON file; the root is returned to the caller. */
static bn_status read_json_file(const char *path, cJSON **out, bn_error *err)
{
    *out = NULL;
    const char *label = bn_path_base(path);
    struct stat sb;
    /* fopen succeeds on a directory, and its "size" is then meaningless */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return bn_error_set(err, BN_ERR_IO, "pass the path of a JSON file",
                            "%s is not a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return bn_error_set(err, BN_ERR_IO, "check the path and the file's permissions",
                            "cannot open %s: %s", path, strerror(errno));
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return bn_error_set(err, BN_ERR_IO, NULL, "cannot read %s", path);
    }
    if (size > HF_JSON_MAX) {
        fclose(f);
        return bn_error_set(err, BN_ERR_FORMAT, "the file is not what its name says",
                            "%s is %ld bytes, larger than any real %s", label, size, label);
    }
    char *text = malloc((size_t)size + 1);
    if (!text) {
        fclose(f);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "cannot allocate %ld bytes for %s",
                            size, label);
    }
    size_t got = fread(text, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(text);
        return bn_error_set(err, BN_ERR_IO, NULL, "cannot read %s", path);
    }
    text[size] = '\0';
    if (memchr(text, '\0', (size_t)size)) {
        free(text);
        return bn_error_set(err, BN_ERR_FORMAT, "the file is damaged: download it again",
                            "%s contains a NUL byte, so it is not JSON", label);
    }

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        /* A line number helps people who edit config files by hand. */
        int line = 1;
        for (const char *p = text; end && p < end; p++)
            line += *p == '\n';
        free(text);
        return bn_error_set(err, BN_ERR_FORMAT, "fix the JSON syntax or download the file again",
                            "%s is not valid JSON (error at line %d)", label, line);
    }
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return bn_error_set(err, BN_ERR_FORMAT, "the file is damaged: download it again",
                            "%s is not a JSON object", label);
    }
    *out = root;
    return BN_OK;
}

/* ---- config fields ------------------------------------------------------------ */

/* Shared by the field readers: which file, for messages. */
typedef struct field_ctx {
    const char *label;         /* file name */
    const char *prefix;        /* "" or "quantization_config." */
    bn_error *err;
} field_ctx;

#define HF_HINT_CONFIG "fix config.json or download the model again"

static bn_status field_error(const field_ctx *c, const char *key, const char *what,
                             const cJSON *item)
{
    if (item)
        return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                            "%s: field '%s%s' must be %s, got %s", c->label, c->prefix, key, what,
                            json_type_name(item));
    return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                        "%s: required field '%s%s' (%s) is missing", c->label, c->prefix, key, what);
}

/* Absent and null both mean "use the default", as in transformers. */
static const cJSON *field_get(const cJSON *obj, const char *key)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(item) ? NULL : item;
}

static bool json_to_int(const cJSON *item, int *out)
{
    if (!cJSON_IsNumber(item))
        return false;
    double v = item->valuedouble;
    if (!(v >= INT_MIN && v <= INT_MAX) || v != floor(v))
        return false;
    *out = (int)v;
    return true;
}

static bn_status read_int(const field_ctx *c, const cJSON *obj, const char *key, bool required,
                          int def, int min, int *out)
{
    const cJSON *item = field_get(obj, key);
    if (!item) {
        if (required)
            return field_error(c, key, "an integer", NULL);
        *out = def;
        return BN_OK;
    }
    int v;
    if (!json_to_int(item, &v)) {
        if (cJSON_IsNumber(item))
            return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                                "%s: field '%s%s' must be an integer, got %g", c->label, c->prefix, key,
                                item->valuedouble);
        return field_error(c, key, "an integer", item);
    }
    if (v < min)
        return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                            "%s: field '%s%s' must be at least %d, got %d", c->label, c->prefix, key,
                            min, v);
    *out = v;
    return BN_OK;
}

static bn_status read_positive_float(const field_ctx *c, const cJSON *obj, const char *key,
                                     float def, float *out)
{
    const cJSON *item = field_get(obj, key);
    if (!item) {
        *out = def;
        return BN_OK;
    }
    if (!cJSON_IsNumber(item))
        return field_error(c, key, "a number", item);
    double v = item->valuedouble;
    if (!(v > 0.0) || !isfinite((float)v))
        return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                            "%s: field '%s%s' must be a positive number, got %g", c->label, c->prefix,
                            key, v);
    *out = (float)v;
    return BN_OK;
}

static bn_status read_bool(const field_ctx *c, const cJSON *obj, const char *key, bool def,
                           bool *out)
{
    const cJSON *item = field_get(obj, key);
    if (!item) {
        *out = def;
        return BN_OK;
    }
    if (!cJSON_IsBool(item))
        return field_error(c, key, "true or false", item);
    *out = cJSON_IsTrue(item);
    return BN_OK;
}

static bn_status copy_string(const field_ctx *c, const char *key, const cJSON *item, char *buf,
                             size_t size)
{
    if (!cJSON_IsString(item))
        return field_error(c, key, "a string", item);
    size_t n = strlen(item->valuestring);
    if (n >= size)
        return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                            "%s: field '%s%s' is %zu characters long, at most %zu are expected",
                            c->label, c->prefix, key, n, size - 1);
    memcpy(buf, item->valuestring, n + 1);
    return BN_OK;
}

static bn_status read_string(const field_ctx *c, const cJSON *obj, const char *key,
                             const char *def, char *buf, size_t size)
{
    const cJSON *item = field_get(obj, key);
    if (!item) {
        snprintf(buf, size, "%s", def);
        return BN_OK;
    }
    return copy_string(c, key, item, buf, size);
}

/* eos_token_id is an int or a list of ints in both config.json and
 * generation_config.json (Llama 3 style models list several). */
static bn_status read_token_ids(const field_ctx *c, const cJSON *obj, const char *key, int *ids,
                                int max, int *n)
{
    *n = 0;
    const cJSON *item = field_get(obj, key);
    if (!item)
        return BN_OK;
    if (cJSON_IsNumber(item)) {
        if (!json_to_int(item, &ids[0]) || ids[0] < 0)
            return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                                "%s: field '%s%s' must be a token id (an integer >= 0), got %g",
                                c->label, c->prefix, key, item->valuedouble);
        *n = 1;
        return BN_OK;
    }
    if (!cJSON_IsArray(item))
        return field_error(c, key, "an integer or a list of integers", item);
    int count = cJSON_GetArraySize(item);
    if (count > max)
        return bn_error_set(c->err, BN_ERR_UNSUPPORTED, NULL,
                            "%s: field '%s%s' lists %d token ids, at most %d are supported",
                            c->label, c->prefix, key, count, max);
    int i = 0;
    for (const cJSON *e = item->child; e; e = e->next, i++) {
        if (!json_to_int(e, &ids[i]) || ids[i] < 0)
            return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                                "%s: field '%s%s' element %d must be a token id (an integer >= 0), "
                                "got %s",
                                c->label, c->prefix, key, i, json_type_name(e));
    }
    *n = count;
    return BN_OK;
}

static bn_status read_architecture(const field_ctx *c, const cJSON *root, bn_hf_config *cfg)
{
    const cJSON *arch = field_get(root, "architectures");
    cfg->architecture[0] = '\0';
    if (!arch)
        return BN_OK;
    if (!cJSON_IsArray(arch))
        return field_error(c, "architectures", "a list of class names", arch);
    if (!arch->child)
        return BN_OK;
    return copy_string(c, "architectures", arch->child, cfg->architecture,
                       sizeof cfg->architecture);
}

/* ---- keys read and keys ignored ------------------------------------------------ */

/* Top-level keys read (or checked) by read_config. */
static const char *const hf_read_keys[] = {
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling",
    "partial_rotary_factor", "tie_word_embeddings", "hidden_act", "bos_token_id",
    "eos_token_id", "attention_bias", "quantization_config", NULL};

/* Keys that cannot change what the model computes: bookkeeping, training
 * settings and PreTrainedConfig's generic fields. Keys starting with '_'
 * (_name_or_path, ...) are bookkeeping too. Anything else unread (say a
 * sampling temperature) is named in a warning. */
static const char *const hf_quiet_keys[] = {
    "transformers_version", "torch_dtype", "dtype", "auto_map", "use_cache",
    "initializer_range", "attention_dropout", "pad_token_id", "id2label", "label2id",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "tie_encoder_decoder", "problem_type", "finetuning_task", "tokenizer_class", NULL};

/* BitNetQuantConfig's fields (rms_norm_eps only matters with use_rms_norm,
 * which is refused). */
static const char *const hf_quant_keys[] = {"quant_method",     "linear_class",
                                            "quantization_mode", "use_rms_norm",
                                            "rms_norm_eps",     "modules_to_not_convert", NULL};

static bool in_list(const char *const *list, const char *key)
{
    for (; *list; list++)
        if (strcmp(*list, key) == 0)
            return true;
    return false;
}

/* Appends prefix+key to cfg->unused_keys; a list too long ends in "...". */
static void note_unused(bn_hf_config *cfg, const char *prefix, const char *key)
{
    char *buf = cfg->unused_keys;
    const size_t size = sizeof cfg->unused_keys;
    size_t used = strlen(buf);
    if (used >= 3 && strcmp(buf + used - 3, "...") == 0)
        return;
    const char *sep = used ? ", " : "";
    /* room for this key and a later ", ..." */
    if (used + strlen(sep) + strlen(prefix) + strlen(key) + 5 < size)
        snprintf(buf + used, size - used, "%s%s%s", sep, prefix, key);
    else
        snprintf(buf + used, size - used, "%s...", sep);
}

/* quantization_config, with BitNetQuantConfig's defaults. */
static bn_status read_quantization(const field_ctx *c, const cJSON *root, bn_hf_config *cfg)
{
    const cJSON *q = field_get(root, "quantization_config");
    cfg->quantized = false;
    cfg->quant_method[0] = cfg->linear_class[0] = cfg->quantization_mode[0] = '\0';
    if (!q)
        return BN_OK;
    if (!cJSON_IsObject(q))
        return field_error(c, "quantization_config", "an object", q);
    cfg->quantized = true;

    const field_ctx qc = {c->label, "quantization_config.", c->err};
    const cJSON *method = field_get(q, "quant_method");
    if (!method)
        return field_error(&qc, "quant_method", "a string", NULL);
    bn_status s = copy_string(&qc, "quant_method", method, cfg->quant_method,
                              sizeof cfg->quant_method);
    if (s == BN_OK)
        s = read_string(&qc, q, "linear_class", "bitlinear", cfg->linear_class,
                        sizeof cfg->linear_class);
    if (s == BN_OK)
        s = read_string(&qc, q, "quantization_mode", "offline", cfg->quantization_mode,
                        sizeof cfg->quantization_mode);
    if (s != BN_OK || strcmp(cfg->quant_method, "bitnet") != 0)
        return s;

    for (const cJSON *e = q->child; e; e = e->next)
        if (!in_list(hf_quant_keys, e->string))
            note_unused(cfg, "quantization_config.", e->string);
    /* AutoBitLinear would add an RMSNorm before each projection. */
    bool rms_norm = false;
    if ((s = read_bool(&qc, q, "use_rms_norm", false, &rms_norm)) != BN_OK)
        return s;
    if (rms_norm)
        return bn_error_set(c->err, BN_ERR_UNSUPPORTED, NULL,
                            "%s: 'quantization_config.use_rms_norm' is true: projections with "
                            "their own RMSNorm are not supported",
                            c->label);
    /* Modules listed stay float linears in transformers; bitnet quantizes
     * every projection (the LM head never). */
    const cJSON *keep = field_get(q, "modules_to_not_convert");
    bool keeps_other = keep && !cJSON_IsArray(keep);
    for (const cJSON *e = keep && cJSON_IsArray(keep) ? keep->child : NULL; e; e = e->next)
        keeps_other |= !cJSON_IsString(e) || strcmp(e->valuestring, "lm_head") != 0;
    if (keeps_other)
        note_unused(cfg, "quantization_config.", "modules_to_not_convert");

    /* transformers rejects anything else, and the two classes scale the
     * output in opposite directions, so a guess would be silently wrong. */
    if (strcmp(cfg->linear_class, "bitlinear") != 0 &&
        strcmp(cfg->linear_class, "autobitlinear") != 0)
        return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                            "%s: field 'quantization_config.linear_class' is '%s', expected "
                            "'bitlinear' or 'autobitlinear'",
                            c->label, cfg->linear_class);
    if (strcmp(cfg->quantization_mode, "offline") != 0 &&
        strcmp(cfg->quantization_mode, "online") != 0)
        return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                            "%s: field 'quantization_config.quantization_mode' is '%s', "
                            "expected 'offline' or 'online'",
                            c->label, cfg->quantization_mode);
    return BN_OK;
}

static bn_status read_dimensions(const field_ctx *c, const cJSON *root, bn_hf_config *cfg)
{
    bn_status s = read_int(c, root, "hidden_size", true, 0, 1, &cfg->hidden_size);
    if (s == BN_OK)
        s = read_int(c, root, "intermediate_size", true, 0, 1, &cfg->intermediate_size);
    if (s == BN_OK)
        s = read_int(c, root, "num_hidden_layers", true, 0, 1, &cfg->num_hidden_layers);
    if (s == BN_OK)
        s = read_int(c, root, "num_attention_heads", true, 0, 1, &cfg->num_attention_heads);
    if (s == BN_OK)
        s = read_int(c, root, "vocab_size", true, 0, 1, &cfg->vocab_size);
    if (s == BN_OK)
        s = read_int(c, root, "num_key_value_heads", false, cfg->num_attention_heads, 1,
                     &cfg->num_key_value_heads);
    if (s == BN_OK)
        s = read_int(c, root, "max_position_embeddings", false, 2048, 1,
                     &cfg->max_position_embeddings);
    if (s != BN_OK)
        return s;

    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0)
        return bn_error_set(c->err, BN_ERR_FORMAT, HF_HINT_CONFIG,
                            "%s: num_attention_heads %d is not a multiple of "
                            "num_key_value_heads %d",
                            c->label, cfg->num_attention_heads, cfg->num_key_value_heads);
    if (field_get(root, "head_dim"))
        return read_int(c, root, "head_dim", false, 0, 1, &cfg->head_dim);
    if (cfg->hidden_size % cfg->num_attention_heads != 0)
        return bn_error_set(c->err, BN_ERR_FORMAT, "set head_dim in config.json",
                            "%s: hidden_size %d is not a multiple of num_attention_heads %d",
                            c->label, cfg->hidden_size, cfg->num_attention_heads);
    cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    return BN_OK;
}

/* ---- RoPE ------------------------------------------------------------------------ */

/* Where the RoPE base was found, for the disagreement check. */
typedef struct rope_base {
    double value;
    char from[48];             /* "rope_theta", "rope_parameters.rope_theta", ... */
    bool found;
} rope_base;

static bn_status note_theta(const field_ctx *c, rope_base *base, const char *from, double v)
{
    if (!base->found) {
        base->value = v;
        snprintf(base->from, sizeof base->from, "%s", from);
        base->found = true;
        return BN_OK;
    }
    if (v == base->value)
        return BN_OK;
    return bn_error_set(c->err, BN_ERR_FORMAT,
                        "keep one RoPE base (transformers 4 reads the top-level rope_theta, "
                        "transformers 5 rope_parameters.rope_theta)",
                        "%s: the RoPE base is given twice with different values: '%s' is %g "
                        "but '%s' is %g",
                        c->label, base->from, base->value, from, v);
}

/* partial_rotary_factor (top level or in a RoPE object): only 1.0, the
 * whole head rotated, is implemented. */
static bn_status check_partial_rotary(const field_ctx *c, const cJSON *obj)
{
    const cJSON *f = field_get(obj, "partial_rotary_factor");
    if (!f)
        return BN_OK;
    if (!cJSON_IsNumber(f))
        return field_error(c, "partial_rotary_factor", "a number", f);
    if (f->valuedouble != 1.0)
        return bn_error_set(c->err, BN_ERR_UNSUPPORTED,
                            "bitnet rotates the whole head (partial_rotary_factor 1.0)",
                            "%s: '%spartial_rotary_factor' is %g: partial RoPE is not supported",
                            c->label, c->prefix, f->valuedouble);
    return BN_OK;
}

/* rope_parameters (transformers 5) or rope_scaling (older; transformers 5
 * reads it as rope_parameters): the type must be "default" (absent or null
 * means "default"; older files say "type"), and a rope_theta inside must
 * agree with any other. */
static bn_status read_rope_object(const field_ctx *c, const cJSON *root, const char *key,
                                  bn_hf_config *cfg, rope_base *base)
{
    const cJSON *obj = field_get(root, key);
    if (!obj)
        return BN_OK;
    if (!cJSON_IsObject(obj))
        return field_error(c, key, "an object", obj);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", key);
    const field_ctx oc = {c->label, prefix, c->err};

    const char *type_key = field_get(obj, "rope_type") ? "rope_type" : "type";
    const cJSON *type = field_get(obj, type_key);
    if (type && !cJSON_IsString(type))
        return field_error(&oc, type_key, "a string", type);
    if (type && strcmp(type->valuestring, "default") != 0)
        return bn_error_set(c->err, BN_ERR_UNSUPPORTED,
                            "bitnet implements plain RoPE only (rope_type \"default\"); use a "
                            "model without RoPE scaling",
                            "%s: '%s%s' is '%.40s': this RoPE scaling is not supported",
                            c->label, prefix, type_key, type->valuestring);
    bn_status s = check_partial_rotary(&oc, obj);
    if (s != BN_OK)
        return s;
    for (const cJSON *e = obj->child; e; e = e->next) {
        if (!strcmp(e->string, "rope_type") || !strcmp(e->string, "type") ||
            !strcmp(e->string, "partial_rotary_factor"))
            continue;
        if (strcmp(e->string, "rope_theta") != 0) {
            note_unused(cfg, prefix, e->string);
            continue;
        }
        if (cJSON_IsNull(e))
            continue;
        float v;
        if ((s = read_positive_float(&oc, obj, "rope_theta", 0.0f, &v)) != BN_OK)
            return s;
        char from[48];
        snprintf(from, sizeof from, "%srope_theta", prefix);
        if ((s = note_theta(c, base, from, v)) != BN_OK)
            return s;
    }
    return BN_OK;
}

static bn_status read_rope(const field_ctx *c, const cJSON *root, bn_hf_config *cfg)
{
    rope_base base = {0};
    const cJSON *top = field_get(root, "rope_theta");
    bn_status s = BN_OK;
    if (top) {
        float v;
        s = read_positive_float(c, root, "rope_theta", 0.0f, &v);
        if (s == BN_OK)
            s = note_theta(c, &base, "rope_theta", v);
    }
    if (s == BN_OK)
        s = read_rope_object(c, root, "rope_parameters", cfg, &base);
    if (s == BN_OK)
        s = read_rope_object(c, root, "rope_scaling", cfg, &base);
    if (s == BN_OK)
        s = check_partial_rotary(c, root);
    if (s != BN_OK)
        return s;
    /* BitNetConfig's default is 500000; other (Llama-style) configs use 10000. */
    cfg->rope_theta_default = !base.found;
    cfg->rope_theta = base.found ? (float)base.value
                      : strcmp(cfg->model_type, "bitnet") == 0 ? 500000.0f
                                                               : 10000.0f;
    return BN_OK;
}

static bn_status read_config(const field_ctx *c, const cJSON *root, bn_hf_config *cfg)
{
    bn_status s = read_architecture(c, root, cfg);
    if (s == BN_OK)
        s = read_string(c, root, "model_type", "", cfg->model_type, sizeof cfg->model_type);
    if (s == BN_OK)
        s = read_dimensions(c, root, cfg);
    if (s == BN_OK)
        s = read_positive_float(c, root, "rms_norm_eps", 1e-5f, &cfg->rms_norm_eps);
    if (s == BN_OK)
        s = read_rope(c, root, cfg);
    /* BitNetConfig's default: a separate lm_head.weight. */
    if (s == BN_OK)
        s = read_bool(c, root, "tie_word_embeddings", false, &cfg->tie_word_embeddings);
    bool attention_bias = false;
    if (s == BN_OK)
        s = read_bool(c, root, "attention_bias", false, &attention_bias);
    if (s == BN_OK && attention_bias)
        s = bn_error_set(c->err, BN_ERR_UNSUPPORTED, NULL,
                         "%s: 'attention_bias' is true: attention projections with biases are "
                         "not supported",
                         c->label);
    if (s == BN_OK)
        s = read_string(c, root, "hidden_act", "relu2", cfg->hidden_act, sizeof cfg->hidden_act);
    if (s == BN_OK)
        s = read_int(c, root, "bos_token_id", false, -1, 0, &cfg->bos_token_id);
    if (s == BN_OK)
        s = read_token_ids(c, root, "eos_token_id", cfg->eos_token_ids, HF_MAX_EOS,
                           &cfg->n_eos_token_ids);
    if (s == BN_OK)
        s = read_quantization(c, root, cfg);
    for (const cJSON *e = root->child; s == BN_OK && e; e = e->next)
        if (e->string[0] != '_' && !in_list(hf_read_keys, e->string) &&
            !in_list(hf_quiet_keys, e->string))
            note_unused(cfg, "", e->string);
    return s;
}

bn_status bn_hf_config_load(const char *path, bn_hf_config *cfg, bn_error *err)
{
    if (!path || !cfg)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_hf_config_load: path and cfg must not be NULL");
    memset(cfg, 0, sizeof *cfg);
    cJSON *root;
    bn_status s = read_json_file(path, &root, err);
    if (s != BN_OK)
        return s;
    const field_ctx c = {bn_path_base(path), "", err};
    s = read_config(&c, root, cfg);
    cJSON_Delete(root);
    if (s != BN_OK)
        return s;
    if (cfg->rope_theta_default)
        bn_log(BN_LOG_WARN,
               "%s gives no RoPE base (neither rope_theta nor rope_parameters.rope_theta): "
               "using %g, %s",
               path, (double)cfg->rope_theta,
               strcmp(cfg->model_type, "bitnet") == 0
                   ? "the default of transformers' BitNetConfig"
                   : "the default of Llama-style configs (model_type is not 'bitnet')");
    if (cfg->unused_keys[0])
        bn_log(BN_LOG_WARN, "%s: bitnet does not use these keys: %s", path, cfg->unused_keys);
    return BN_OK;
}

/* ---- shards and the tensor table --------------------------------------------- */

static int cmp_string_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const dir_entry *)a)->tensor->name, ((const dir_entry *)b)->tensor->name);
}

static ptrdiff_t shard_index(const bn_hf_dir *d, const char *name)
{
    const char *key = name;
    char **hit = bsearch(&key, d->shard_names, d->n_shards, sizeof *d->shard_names,
                         cmp_string_ptr);
    return hit ? hit - d->shard_names : -1;
}

/* Shard names come from a downloaded file: keep them inside the directory. */
static bool shard_name_ok(const char *name)
{
    return name[0] != '\0' && !strchr(name, '/') && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0;
}

static bn_status add_shard_names(bn_hf_dir *d, const char **names, size_t n, bn_error *err)
{
    qsort(names, n, sizeof *names, cmp_string_ptr);
    d->shard_names = calloc(n ? n : 1, sizeof *d->shard_names);
    d->shards = calloc(n ? n : 1, sizeof *d->shards);
    if (!d->shard_names || !d->shards)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory listing shards");
    for (size_t i = 0; i < n; i++) {
        if (d->n_shards && strcmp(d->shard_names[d->n_shards - 1], names[i]) == 0)
            continue; /* each shard is opened once however many tensors it holds */
        if (!(d->shard_names[d->n_shards] = strdup(names[i])))
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory listing shards");
        d->n_shards++;
    }
    return BN_OK;
}

static bn_status open_shards(bn_hf_dir *d, const char *dir, const char *index_label,
                             bn_error *err)
{
    char path[PATH_MAX];
    for (size_t i = 0; i < d->n_shards; i++) {
        bn_status s = join_path(path, sizeof path, dir, d->shard_names[i], err);
        if (s != BN_OK)
            return s;
        if (!is_regular_file(path))
            return bn_error_set(err, BN_ERR_IO,
                                "the download is incomplete: fetch the missing shard again",
                                "%s names shard '%s', which does not exist in %s", index_label,
                                d->shard_names[i], dir);
        s = bn_safetensors_open(path, &d->shards[i], err);
        if (s != BN_OK)
            return s;
    }
    return BN_OK;
}

/* Every tensor the index lists must be in the shard it names. */
static bn_status check_weight_map(const bn_hf_dir *d, const cJSON *map, const char *index_label,
                                  bn_error *err)
{
    for (const cJSON *e = map->child; e; e = e->next) {
        ptrdiff_t i = shard_index(d, e->valuestring);
        if (i < 0 || !bn_safetensors_find(d->shards[i], e->string))
            return bn_error_set(err, BN_ERR_FORMAT,
                                "the shard does not match the index: download both again",
                                "%s maps tensor '%s' to %s, which does not contain it",
                                index_label, e->string, e->valuestring);
    }
    return BN_OK;
}

static bn_status open_index(bn_hf_dir *d, const char *dir, const char *index_path, bn_error *err)
{
    const char *label = bn_path_base(index_path);
    cJSON *root;
    bn_status s = read_json_file(index_path, &root, err);
    if (s != BN_OK)
        return s;

    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int n = cJSON_IsObject(map) ? cJSON_GetArraySize(map) : 0;
    const char **names = calloc(n ? (size_t)n : 1, sizeof *names);
    if (!cJSON_IsObject(map) || n == 0) {
        s = bn_error_set(err, BN_ERR_FORMAT, "download the model again",
                         "%s: 'weight_map' is missing, empty or not an object", label);
    } else if (!names) {
        s = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory reading %s", label);
    } else {
        int i = 0;
        for (const cJSON *e = map->child; e && s == BN_OK; e = e->next, i++) {
            if (!cJSON_IsString(e) || !shard_name_ok(e->valuestring))
                s = bn_error_set(err, BN_ERR_FORMAT, "download the model again",
                                 "%s: weight_map entry for '%s' is not a shard file name",
                                 label, e->string);
            else
                names[i] = e->valuestring;
        }
    }
    if (s == BN_OK)
        s = add_shard_names(d, names, (size_t)n, err);
    free(names);
    if (s == BN_OK)
        s = open_shards(d, dir, label, err);
    if (s == BN_OK)
        s = check_weight_map(d, map, label, err);
    cJSON_Delete(root);
    return s;
}

static bn_status open_single(bn_hf_dir *d, const char *dir, bn_error *err)
{
    const char *name = "model.safetensors";
    bn_status s = add_shard_names(d, &name, 1, err);
    if (s == BN_OK)
        s = open_shards(d, dir, name, err);
    return s;
}

/* One table over all shards, sorted by name; a name in two shards is an
 * error because which copy wins would be arbitrary. */
static bn_status build_table(bn_hf_dir *d, bn_error *err)
{
    size_t total = 0;
    for (size_t i = 0; i < d->n_shards; i++)
        total += bn_safetensors_count(d->shards[i]);
    d->entries = calloc(total ? total : 1, sizeof *d->entries);
    if (!d->entries)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory indexing %zu tensors",
                            total);
    for (size_t i = 0; i < d->n_shards; i++) {
        for (size_t j = 0; j < bn_safetensors_count(d->shards[i]); j++) {
            d->entries[d->n_entries].tensor = bn_safetensors_at(d->shards[i], j);
            d->entries[d->n_entries].shard = i;
            d->n_entries++;
        }
    }
    qsort(d->entries, d->n_entries, sizeof *d->entries, cmp_entry);
    for (size_t i = 1; i < d->n_entries; i++) {
        const dir_entry *a = &d->entries[i - 1], *b = &d->entries[i];
        if (strcmp(a->tensor->name, b->tensor->name) == 0)
            return bn_error_set(err, BN_ERR_FORMAT, "remove the stray shard or download again",
                                "tensor '%s' is in both %s and %s", b->tensor->name,
                                d->shard_names[a->shard], d->shard_names[b->shard]);
    }
    return BN_OK;
}

/* ---- the directory ---------------------------------------------------------------- */

static bn_status read_generation_config(bn_hf_dir *d, const char *path, bn_error *err)
{
    if (!is_regular_file(path))
        return BN_OK; /* optional */
    cJSON *root;
    bn_status s = read_json_file(path, &root, err);
    if (s != BN_OK)
        return s;
    const field_ctx c = {bn_path_base(path), "", err};
    s = read_token_ids(&c, root, "eos_token_id", d->gen_eos, HF_MAX_EOS, &d->n_gen_eos);
    d->has_gen_eos = s == BN_OK && d->n_gen_eos > 0;
    cJSON_Delete(root);
    return s;
}

static bn_status check_directory(const char *dir, bn_error *err)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return bn_error_set(err, BN_ERR_IO, HF_HINT_DIR, "cannot open model directory %s: %s",
                            dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return bn_error_set(err, BN_ERR_IO, HF_HINT_DIR, "%s is not a directory", dir);
    return BN_OK;
}

static bn_status open_dir(bn_hf_dir *d, const char *dir, bn_error *err)
{
    char path[PATH_MAX];
    bn_status s = check_directory(dir, err);
    if (s == BN_OK)
        s = join_path(path, sizeof path, dir, "config.json", err);
    if (s != BN_OK)
        return s;
    if (!is_regular_file(path))
        return bn_error_set(err, BN_ERR_IO, HF_HINT_DIR,
                            "%s is not a model directory: it has no config.json", dir);
    s = bn_hf_config_load(path, &d->config, err);
    if (s != BN_OK)
        return s;

    if ((s = join_path(path, sizeof path, dir, "model.safetensors.index.json", err)) != BN_OK)
        return s;
    if (is_regular_file(path)) {
        s = open_index(d, dir, path, err);
    } else {
        if ((s = join_path(path, sizeof path, dir, "model.safetensors", err)) != BN_OK)
            return s;
        if (!is_regular_file(path))
            return bn_error_set(err, BN_ERR_IO,
                                "download the weights too (this runtime reads safetensors, or "
                                "a .gguf file passed directly)",
                                "%s has config.json but neither model.safetensors nor "
                                "model.safetensors.index.json",
                                dir);
        s = open_single(d, dir, err);
    }
    if (s == BN_OK)
        s = build_table(d, err);

    if (s == BN_OK)
        s = join_path(path, sizeof path, dir, "tokenizer.json", err);
    if (s == BN_OK && is_regular_file(path) && !(d->tokenizer_path = strdup(path)))
        s = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory");

    if (s == BN_OK)
        s = join_path(path, sizeof path, dir, "generation_config.json", err);
    if (s == BN_OK)
        s = read_generation_config(d, path, err);
    return s;
}

bn_status bn_hf_dir_open(const char *dir, bn_hf_dir **out, bn_error *err)
{
    if (out)
        *out = NULL;
    if (!dir || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_hf_dir_open: dir and out must not be NULL");
    bn_hf_dir *d = calloc(1, sizeof *d);
    if (!d)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory opening %s", dir);
    bn_status s = open_dir(d, dir, err);
    if (s != BN_OK) {
        bn_hf_dir_close(d);
        return s;
    }
    *out = d;
    return BN_OK;
}

void bn_hf_dir_close(bn_hf_dir *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n_shards; i++) {
        bn_safetensors_close(d->shards[i]);
        free(d->shard_names[i]);
    }
    free(d->shards);
    free(d->shard_names);
    free(d->entries);
    free(d->tokenizer_path);
    free(d);
}

const bn_hf_config *bn_hf_dir_config(const bn_hf_dir *d) { return d ? &d->config : NULL; }

const char *bn_hf_dir_tokenizer_path(const bn_hf_dir *d) { return d ? d->tokenizer_path : NULL; }

bool bn_hf_dir_generation_eos(const bn_hf_dir *d, int *ids, int max, int *n)
{
    if (n)
        *n = 0;
    if (!d || !d->has_gen_eos)
        return false;
    int count = d->n_gen_eos < max ? d->n_gen_eos : max;
    if (!ids || count < 0)
        count = 0;
    for (int i = 0; i < count; i++)
        ids[i] = d->gen_eos[i];
    if (n)
        *n = count;
    return true;
}

const bn_st_tensor *bn_hf_dir_find(const bn_hf_dir *d, const char *name)
{
    if (!d || !name || d->n_entries == 0)
        return NULL;
    bn_st_tensor key_tensor = {.name = name};
    dir_entry key = {.tensor = &key_tensor};
    const dir_entry *hit = bsearch(&key, d->entries, d->n_entries, sizeof *d->entries, cmp_entry);
    return hit ? hit->tensor : NULL;
}

size_t bn_hf_dir_tensor_count(const bn_hf_dir *d) { return d ? d->n_entries : 0; }

const bn_st_tensor *bn_hf_dir_tensor_at(const bn_hf_dir *d, size_t i)
{
    if (!d || i >= d->n_entries)
        return NULL;
    return d->entries[i].tensor;
}
