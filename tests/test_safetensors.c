/*
 * test_safetensors.c - the safetensors reader and Hugging Face model
 * directories, against the fixtures of scripts/gen_safetensors_fixtures.py.
 *
 *   test_safetensors DATA_DIR      (DATA_DIR = tests/data/hf)
 *
 * expect.txt lists every tensor of the tiny model with its dtype, shape,
 * size and an FNV-1a hash of its bytes as the safetensors package wrote
 * them; the malformed files and directories must each fail with the right
 * status and a message naming the problem, and every truncation of a file
 * must fail cleanly.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "test_util.h"

static const char *data_dir;

static const char *data_path(const char *rel)
{
    static char buf[4][1024]; /* a few live at once in one expression */
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", data_dir, rel);
    return p;
}

static uint64_t fnv1a64(const void *data, uint64_t n)
{
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static float bf16_at(const bn_st_tensor *t, size_t i)
{
    uint16_t bits;
    memcpy(&bits, (const uint8_t *)t->data + 2 * i, 2); /* the data may be unaligned */
    uint32_t f32 = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &f32, 4);
    return f;
}

static bool read_file(const char *path, uint8_t **data, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc(n > 0 ? (size_t)n : 1);
    *size = fread(*data, 1, (size_t)n, f);
    fclose(f);
    return *size == (size_t)n;
}

/* A temporary file the truncation and mutation tests rewrite in place. */
static int make_temp(char *path, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(path, size, "%s/bn_st_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkstemp(path);
}

/* ---- expectations ------------------------------------------------------------ */

typedef struct expect_tensor {
    char name[128];
    char dtype[16];
    int n_dims;
    int64_t shape[BN_ST_MAX_DIMS];
    uint64_t bytes;
    uint64_t hash;
} expect_tensor;

static int load_expectations(expect_tensor *out, int max)
{
    FILE *f = fopen(data_path("expect.txt"), "r");
    CHECK_MSG(f != NULL, "cannot open %s", data_path("expect.txt"));
    if (!f)
        return 0;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < max) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        expect_tensor *e = &out[n];
        int used = 0;
        if (sscanf(line, "%127s %15s %d%n", e->name, e->dtype, &e->n_dims, &used) != 3 ||
            e->n_dims < 0 || e->n_dims > BN_ST_MAX_DIMS) {
            CHECK_MSG(false, "bad expect.txt line: %s", line);
            continue;
        }
        char *p = line + used;
        for (int d = 0; d < e->n_dims; d++)
            e->shape[d] = strtoll(p, &p, 10);
        e->bytes = strtoull(p, &p, 10);
        e->hash = strtoull(p, &p, 16);
        n++;
    }
    fclose(f);
    return n;
}

static void check_tensor(const char *where, const expect_tensor *e, const bn_st_tensor *t)
{
    CHECK_MSG(t != NULL, "%s: tensor %s not found", where, e->name);
    if (!t)
        return;
    CHECK_MSG(strcmp(t->name, e->name) == 0, "%s: found '%s' for '%s'", where, t->name, e->name);
    CHECK_MSG(strcmp(bn_st_dtype_name(t->dtype), e->dtype) == 0, "%s: %s dtype %s, expected %s",
              where, e->name, bn_st_dtype_name(t->dtype), e->dtype);
    CHECK_MSG(t->n_dims == e->n_dims, "%s: %s has %d dims, expected %d", where, e->name,
              t->n_dims, e->n_dims);
    for (int d = 0; d < e->n_dims && d < t->n_dims; d++)
        CHECK_MSG(t->shape[d] == e->shape[d], "%s: %s dim %d is %lld, expected %lld", where,
                  e->name, d, (long long)t->shape[d], (long long)e->shape[d]);
    CHECK_MSG(t->bytes == e->bytes, "%s: %s has %llu bytes, expected %llu", where, e->name,
              (unsigned long long)t->bytes, (unsigned long long)e->bytes);
    if (t->bytes == e->bytes)
        CHECK_MSG(fnv1a64(t->data, t->bytes) == e->hash, "%s: %s bytes differ (hash %016llx)",
                  where, e->name, (unsigned long long)fnv1a64(t->data, t->bytes));
}

/* ---- the reader on good files ----------------------------------------------- */

static void test_dtypes(void)
{
    static const struct {
        bn_st_dtype t;
        const char *name;
        size_t size;
    } want[] = {
        {BN_ST_BOOL, "BOOL", 1}, {BN_ST_U8, "U8", 1},     {BN_ST_I8, "I8", 1},
        {BN_ST_I16, "I16", 2},   {BN_ST_U16, "U16", 2},   {BN_ST_F16, "F16", 2},
        {BN_ST_BF16, "BF16", 2}, {BN_ST_I32, "I32", 4},   {BN_ST_U32, "U32", 4},
        {BN_ST_F32, "F32", 4},   {BN_ST_I64, "I64", 8},   {BN_ST_U64, "U64", 8},
        {BN_ST_F64, "F64", 8},   {BN_ST_F8_E4M3, "F8_E4M3", 1},
        {BN_ST_F8_E5M2, "F8_E5M2", 1},
    };
    CHECK(sizeof want / sizeof want[0] == BN_ST_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK_MSG(strcmp(bn_st_dtype_name(want[i].t), want[i].name) == 0, "%s",
                  bn_st_dtype_name(want[i].t));
        CHECK(bn_st_dtype_size(want[i].t) == want[i].size);
    }
    CHECK(strcmp(bn_st_dtype_name(BN_ST_DTYPE_COUNT), "?") == 0);
    CHECK(bn_st_dtype_size(BN_ST_DTYPE_COUNT) == 0);
}

static void test_small(void)
{
    bn_safetensors *st = NULL;
    bn_error err;
    bn_status s = bn_safetensors_open(data_path("small.safetensors"), &st, &err);
    CHECK_MSG(s == BN_OK, "%s", err.message);
    if (s != BN_OK)
        return;

    CHECK(bn_safetensors_count(st) == 4);
    const char *order[] = {"a.f32", "b.u8", "c.scalar", "d.empty"};
    for (size_t i = 0; i < 4; i++) {
        const bn_st_tensor *t = bn_safetensors_at(st, i);
        CHECK_MSG(t && strcmp(t->name, order[i]) == 0, "at(%zu) = %s", i, t ? t->name : "NULL");
        CHECK(bn_safetensors_find(st, order[i]) == t);
    }
    CHECK(bn_safetensors_at(st, 4) == NULL);
    CHECK(bn_safetensors_find(st, "nope") == NULL);
    CHECK(bn_safetensors_find(st, "") == NULL);

    const bn_st_tensor *a = bn_safetensors_find(st, "a.f32");
    if (a) {
        CHECK(a->dtype == BN_ST_F32 && a->n_dims == 2 && a->shape[0] == 2 && a->shape[1] == 3);
        CHECK(a->bytes == 24);
        for (int i = 0; i < 6; i++) {
            float v;
            memcpy(&v, (const uint8_t *)a->data + 4 * i, 4);
            CHECK_MSG(v == (float)i, "a.f32[%d] = %g", i, v);
        }
    }
    const bn_st_tensor *b = bn_safetensors_find(st, "b.u8");
    if (b) {
        CHECK(b->dtype == BN_ST_U8 && b->n_dims == 1 && b->shape[0] == 4 && b->bytes == 4);
        CHECK(memcmp(b->data, "\x01\x02\x03\xfa", 4) == 0);
    }
    const bn_st_tensor *c = bn_safetensors_find(st, "c.scalar");
    if (c) {
        CHECK(c->dtype == BN_ST_I64 && c->n_dims == 0 && c->bytes == 8);
        int64_t v;
        memcpy(&v, c->data, 8);
        CHECK(v == 7);
    }
    const bn_st_tensor *d = bn_safetensors_find(st, "d.empty");
    if (d)
        CHECK(d->n_dims == 2 && d->shape[0] == 0 && d->shape[1] == 3 && d->bytes == 0);

    const char *fmt = bn_safetensors_metadata(st, "format");
    CHECK(fmt && strcmp(fmt, "pt") == 0);
    CHECK(bn_safetensors_metadata(st, "missing") == NULL);
    bn_safetensors_close(st);
}

static void test_tiny_file(const expect_tensor *ex, int n_ex)
{
    bn_safetensors *st = NULL;
    bn_error err;
    bn_status s = bn_safetensors_open(data_path("tiny/model.safetensors"), &st, &err);
    CHECK_MSG(s == BN_OK, "%s", err.message);
    if (s != BN_OK)
        return;
    CHECK_MSG(bn_safetensors_count(st) == (size_t)n_ex, "%zu tensors, expected %d",
              bn_safetensors_count(st), n_ex);
    for (int i = 0; i < n_ex; i++)
        check_tensor("tiny/model.safetensors", &ex[i], bn_safetensors_find(st, ex[i].name));
    /* name order, as documented */
    for (size_t i = 1; i < bn_safetensors_count(st); i++)
        CHECK(strcmp(bn_safetensors_at(st, i - 1)->name, bn_safetensors_at(st, i)->name) < 0);
    bn_safetensors_close(st);
}

/* ---- directories ---------------------------------------------------------------- */

static void check_tiny_config(const bn_hf_config *c)
{
    CHECK(strcmp(c->architecture, "BitNetForCausalLM") == 0);
    CHECK(strcmp(c->model_type, "bitnet") == 0);
    CHECK(c->hidden_size == 64 && c->intermediate_size == 128 && c->num_hidden_layers == 2);
    CHECK(c->num_attention_heads == 4 && c->num_key_value_heads == 2 && c->head_dim == 16);
    CHECK(c->vocab_size == 300 && c->max_position_embeddings == 128);
    CHECK(fabsf(c->rms_norm_eps - 1e-5f) < 1e-12f);
    CHECK(c->rope_theta == 500000.0f);
    CHECK(c->tie_word_embeddings);
    CHECK(strcmp(c->hidden_act, "relu2") == 0);
    CHECK(c->bos_token_id == 256);
    CHECK(c->n_eos_token_ids == 1 && c->eos_token_ids[0] == 257);
    CHECK(c->quantized);
    CHECK(strcmp(c->quant_method, "bitnet") == 0);
    CHECK(strcmp(c->linear_class, "autobitlinear") == 0);
    CHECK(strcmp(c->quantization_mode, "offline") == 0);
}

/* The tensor names and packed shapes of the real checkpoint, at tiny size. */
static void check_bitnet_layout(const bn_hf_dir *d)
{
    static const struct {
        const char *proj;
        int64_t out, in;
    } proj[] = {
        {"self_attn.q_proj", 64, 64}, {"self_attn.k_proj", 32, 64}, {"self_attn.v_proj", 32, 64},
        {"self_attn.o_proj", 64, 64}, {"mlp.gate_proj", 128, 64},   {"mlp.up_proj", 128, 64},
        {"mlp.down_proj", 64, 128},
    };
    char name[128];
    for (int layer = 0; layer < 2; layer++) {
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", layer, proj[k].proj);
            const bn_st_tensor *w = bn_hf_dir_find(d, name);
            CHECK_MSG(w && w->dtype == BN_ST_U8 && w->n_dims == 2 &&
                          w->shape[0] == proj[k].out / 4 && w->shape[1] == proj[k].in,
                      "%s", name);
            snprintf(name, sizeof name, "model.layers.%d.%s.weight_scale", layer, proj[k].proj);
            const bn_st_tensor *sc = bn_hf_dir_find(d, name);
            CHECK_MSG(sc && sc->dtype == BN_ST_BF16 && sc->n_dims == 1 && sc->shape[0] == 1,
                      "%s", name);
            /* the script writes 1.5 + 0.25 k + 2 layer, exact in bf16 */
            if (sc)
                CHECK_MSG(bf16_at(sc, 0) == 1.5f + 0.25f * (float)k + 2.0f * (float)layer,
                          "%s = %g", name, bf16_at(sc, 0));
        }
        static const char *const norms[] = {"input_layernorm", "post_attention_layernorm",
                                            "self_attn.attn_sub_norm", "mlp.ffn_sub_norm"};
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", layer, norms[k]);
            const bn_st_tensor *t = bn_hf_dir_find(d, name);
            CHECK_MSG(t && t->dtype == BN_ST_BF16 && t->n_dims == 1 &&
                          t->shape[0] == (k == 3 ? 128 : 64),
                      "%s", name);
            if (t) /* norms are drawn around 1 */
                CHECK_MSG(bf16_at(t, 0) > 0.5f && bf16_at(t, 0) < 1.5f, "%s[0] = %g", name,
                          bf16_at(t, 0));
        }
    }
    const bn_st_tensor *emb = bn_hf_dir_find(d, "model.embed_tokens.weight");
    CHECK(emb && emb->dtype == BN_ST_BF16 && emb->shape[0] == 300 && emb->shape[1] == 64);
    CHECK(bn_hf_dir_find(d, "model.norm.weight") != NULL);
    CHECK(bn_hf_dir_find(d, "lm_head.weight") == NULL); /* tied, as in 2B-4T */
}

static void check_dir_tensors(const char *where, const bn_hf_dir *d, const expect_tensor *ex,
                              int n_ex)
{
    CHECK_MSG(bn_hf_dir_tensor_count(d) == (size_t)n_ex, "%s: %zu tensors, expected %d", where,
              bn_hf_dir_tensor_count(d), n_ex);
    for (int i = 0; i < n_ex; i++)
        check_tensor(where, &ex[i], bn_hf_dir_find(d, ex[i].name));
    for (size_t i = 0; i < bn_hf_dir_tensor_count(d); i++)
        CHECK(bn_hf_dir_tensor_at(d, i) != NULL);
    for (size_t i = 1; i < bn_hf_dir_tensor_count(d); i++)
        CHECK(strcmp(bn_hf_dir_tensor_at(d, i - 1)->name, bn_hf_dir_tensor_at(d, i)->name) < 0);
    CHECK(bn_hf_dir_tensor_at(d, bn_hf_dir_tensor_count(d)) == NULL);
    CHECK(bn_hf_dir_find(d, "model.layers.2.input_layernorm.weight") == NULL);
}

static void test_tiny_dir(const expect_tensor *ex, int n_ex)
{
    bn_hf_dir *d = NULL;
    bn_error err;
    bn_status s = bn_hf_dir_open(data_path("tiny"), &d, &err);
    CHECK_MSG(s == BN_OK, "%s", err.message);
    if (s != BN_OK)
        return;
    check_tiny_config(bn_hf_dir_config(d));
    check_dir_tensors("tiny", d, ex, n_ex);
    check_bitnet_layout(d);

    const char *tok = bn_hf_dir_tokenizer_path(d);
    CHECK(tok && strlen(tok) > 15 && strcmp(tok + strlen(tok) - 15, "/tokenizer.json") == 0);

    int ids[8] = {0}, n = -1;
    CHECK(bn_hf_dir_generation_eos(d, ids, 8, &n));
    CHECK(n == 2 && ids[0] == 257 && ids[1] == 259);
    CHECK(bn_hf_dir_generation_eos(d, ids, 1, &n) && n == 1 && ids[0] == 257);
    bn_hf_dir_close(d);
}

static void test_sharded_dir(const expect_tensor *ex, int n_ex)
{
    bn_hf_dir *d = NULL, *tiny = NULL;
    bn_error err;
    bn_status s = bn_hf_dir_open(data_path("sharded"), &d, &err);
    CHECK_MSG(s == BN_OK, "%s", err.message);
    if (s != BN_OK)
        return;
    check_tiny_config(bn_hf_dir_config(d));
    check_dir_tensors("sharded", d, ex, n_ex);
    check_bitnet_layout(d);
    CHECK(bn_hf_dir_tokenizer_path(d) == NULL);
    int ids[8], n = -1;
    CHECK(!bn_hf_dir_generation_eos(d, ids, 8, &n) && n == 0);

    /* the same bytes as the single-file model, tensor by tensor */
    if (bn_hf_dir_open(data_path("tiny"), &tiny, &err) == BN_OK) {
        for (size_t i = 0; i < bn_hf_dir_tensor_count(d); i++) {
            const bn_st_tensor *a = bn_hf_dir_tensor_at(d, i);
            const bn_st_tensor *b = bn_hf_dir_find(tiny, a->name);
            CHECK_MSG(b && a->bytes == b->bytes && memcmp(a->data, b->data, a->bytes) == 0,
                      "%s differs between sharded and tiny", a->name);
        }
        bn_hf_dir_close(tiny);
    }
    bn_hf_dir_close(d);
}

/* ---- config.json ----------------------------------------------------------------- */

static void test_real_configs(void)
{
    bn_hf_config c;
    bn_error err;
    const char *files[] = {"configs/bitnet-b1.58-2B-4T.json",
                           "configs/bitnet-b1.58-2B-4T-bf16.json"};
    for (int i = 0; i < 2; i++) {
        bn_status s = bn_hf_config_load(data_path(files[i]), &c, &err);
        CHECK_MSG(s == BN_OK, "%s: %s", files[i], err.message);
        if (s != BN_OK)
            continue;
        CHECK(strcmp(c.architecture, "BitNetForCausalLM") == 0);
        CHECK(c.hidden_size == 2560 && c.intermediate_size == 6912 && c.num_hidden_layers == 30);
        CHECK(c.num_attention_heads == 20 && c.num_key_value_heads == 5 && c.head_dim == 128);
        CHECK(c.vocab_size == 128256 && c.max_position_embeddings == 4096);
        CHECK(c.rope_theta == 500000.0f && !c.rope_theta_default && c.tie_word_embeddings);
        CHECK_MSG(c.unused_keys[0] == '\0', "%s: unused keys '%s'", files[i], c.unused_keys);
        CHECK(strcmp(c.hidden_act, "relu2") == 0);
        CHECK(c.bos_token_id == 128000 && c.n_eos_token_ids == 1 && c.eos_token_ids[0] == 128001);
        CHECK(c.quantized && strcmp(c.linear_class, "autobitlinear") == 0);
        CHECK(strcmp(c.quantization_mode, i == 0 ? "offline" : "online") == 0);
    }
}

static void test_config_defaults(void)
{
    bn_hf_config c;
    bn_error err;
    bn_status s = bn_hf_config_load(data_path("configs/minimal.json"), &c, &err);
    CHECK_MSG(s == BN_OK, "%s", err.message);
    if (s == BN_OK) {
        CHECK(c.architecture[0] == '\0');
        CHECK(c.num_key_value_heads == 4 && c.head_dim == 16);
        CHECK(c.max_position_embeddings == 2048);
        CHECK(fabsf(c.rms_norm_eps - 1e-5f) < 1e-12f);
        CHECK(c.rope_theta == 500000.0f); /* model_type bitnet */
        CHECK(c.rope_theta_default);
        CHECK(!c.tie_word_embeddings);    /* BitNetConfig's default */
        CHECK(strcmp(c.hidden_act, "relu2") == 0);
        CHECK(c.bos_token_id == -1 && c.n_eos_token_ids == 0);
        CHECK(!c.quantized && c.quant_method[0] == '\0' && c.linear_class[0] == '\0');
    }

    s = bn_hf_config_load(data_path("configs/llama_defaults.json"), &c, &err);
    CHECK_MSG(s == BN_OK, "%s", err.message);
    if (s == BN_OK) {
        CHECK(c.rope_theta == 10000.0f);          /* not a bitnet model_type */
        CHECK(c.num_key_value_heads == 4);        /* null means the default */
        CHECK(c.head_dim == 32);                  /* explicit, not hidden / heads */
        CHECK(c.n_eos_token_ids == 3 && c.eos_token_ids[0] == 128001 &&
              c.eos_token_ids[2] == 128009);
        /* BitNetQuantConfig's defaults: the dividing class, packed weights */
        CHECK(c.quantized && strcmp(c.linear_class, "bitlinear") == 0);
        CHECK(strcmp(c.quantization_mode, "offline") == 0);
    }
}

static void test_bad_configs(void)
{
    static const struct {
        const char *file;
        bn_status status;
        const char *needle[2];
    } cases[] = {
        {"bad_missing_hidden_size", BN_ERR_FORMAT, {"'hidden_size'", "missing"}},
        {"bad_hidden_size_string", BN_ERR_FORMAT, {"'hidden_size'", "got a string"}},
        {"bad_layers_fraction", BN_ERR_FORMAT, {"'num_hidden_layers'", "2.5"}},
        {"bad_heads_zero", BN_ERR_FORMAT, {"'num_attention_heads'", "at least 1"}},
        {"bad_kv_heads", BN_ERR_FORMAT, {"num_key_value_heads 3", "multiple"}},
        {"bad_rope_theta", BN_ERR_FORMAT, {"'rope_theta'", "a number"}},
        {"bad_rms_eps_negative", BN_ERR_FORMAT, {"'rms_norm_eps'", "positive"}},
        {"bad_tie_string", BN_ERR_FORMAT, {"'tie_word_embeddings'", "true or false"}},
        {"bad_eos_list", BN_ERR_FORMAT, {"'eos_token_id' element 1", "a string"}},
        {"bad_eos_too_many", BN_ERR_UNSUPPORTED, {"'eos_token_id'", "9 token ids"}},
        {"bad_architectures", BN_ERR_FORMAT, {"'architectures'", "got a string"}},
        {"bad_hidden_act_long", BN_ERR_FORMAT, {"'hidden_act'", "characters"}},
        {"bad_quant_not_object", BN_ERR_FORMAT, {"'quantization_config'", "an object"}},
        {"bad_linear_class", BN_ERR_FORMAT,
         {"'quantization_config.linear_class'", "bitlinear2"}},
        {"bad_quant_method_missing", BN_ERR_FORMAT,
         {"'quantization_config.quant_method'", "missing"}},
        {"bad_syntax", BN_ERR_FORMAT, {"bad_syntax.json is not valid JSON", "line 4"}},
        {"bad_not_object", BN_ERR_FORMAT, {"not a JSON object", NULL}},
        {"does_not_exist", BN_ERR_IO, {"cannot open", "does_not_exist.json"}},
    };
    bn_hf_config dummy;
    bn_error dir_err;
    CHECK(bn_hf_config_load(data_dir, &dummy, &dir_err) == BN_ERR_IO);
    CHECK_STR_CONTAINS(dir_err.message, "not a regular file");
    CHECK(bn_hf_config_load(NULL, &dummy, &dir_err) == BN_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "configs/%s.json", cases[i].file);
        bn_hf_config c;
        bn_error err;
        bn_error_clear(&err);
        bn_status s = bn_hf_config_load(data_path(rel), &c, &err);
        CHECK_MSG(s == cases[i].status, "%s: status %s, expected %s (%s)", cases[i].file,
                  bn_status_str(s), bn_status_str(cases[i].status), err.message);
        CHECK(err.status == s);
        for (int k = 0; k < 2; k++)
            if (cases[i].needle[k])
                CHECK_STR_CONTAINS(err.message, cases[i].needle[k]);
        if (s != BN_OK && cases[i].status == BN_ERR_FORMAT)
            CHECK_MSG(err.hint[0] != '\0', "%s: no hint", cases[i].file);
    }
}

/* ---- malformed files and directories ------------------------------------------ */

static void test_bad_files(void)
{
    static const struct {
        const char *file;
        bn_status status;
        const char *needle[3];
    } cases[] = {
        {"short", BN_ERR_FORMAT, {"short.safetensors:", "3 bytes", "too short"}},
        {"header_past_end", BN_ERR_FORMAT, {"header length 1000", "truncated", NULL}},
        {"header_huge", BN_ERR_FORMAT, {"header length 9223372036854775813", NULL, NULL}},
        {"header_zero", BN_ERR_FORMAT, {"header length 0", NULL, NULL}},
        {"not_json", BN_ERR_FORMAT, {"not valid JSON", "near byte", NULL}},
        {"not_object", BN_ERR_FORMAT, {"not a JSON object", NULL, NULL}},
        {"nul_in_header", BN_ERR_FORMAT, {"NUL byte", NULL, NULL}},
        {"entry_not_object", BN_ERR_FORMAT, {"tensor 'w'", "not an object", NULL}},
        {"dtype_unknown", BN_ERR_FORMAT, {"tensor 'w'", "unknown dtype 'Q4_K'", NULL}},
        {"dtype_unsupported", BN_ERR_UNSUPPORTED, {"tensor 'w'", "dtype 'C64'", "not supported"}},
        {"dtype_missing", BN_ERR_FORMAT, {"tensor 'w'", "'dtype' is missing", NULL}},
        {"dtype_not_string", BN_ERR_FORMAT, {"tensor 'w'", "'dtype' is not a string", NULL}},
        {"shape_missing", BN_ERR_FORMAT, {"tensor 'w'", "'shape' is missing", NULL}},
        {"shape_not_array", BN_ERR_FORMAT, {"tensor 'w'", "'shape' is not an array", NULL}},
        {"shape_negative", BN_ERR_FORMAT, {"tensor 'w'", "shape dimension 0", "non-negative"}},
        {"shape_fraction", BN_ERR_FORMAT, {"tensor 'w'", "shape dimension 0", NULL}},
        {"shape_string", BN_ERR_FORMAT, {"tensor 'w'", "shape dimension 0", NULL}},
        {"shape_too_many_dims", BN_ERR_UNSUPPORTED, {"tensor 'w'", "9 dimensions", NULL}},
        {"shape_overflow", BN_ERR_FORMAT, {"tensor 'w'", "overflows 64 bits", NULL}},
        {"offsets_missing", BN_ERR_FORMAT, {"tensor 'w'", "'data_offsets' is missing", NULL}},
        {"offsets_one_value", BN_ERR_FORMAT, {"tensor 'w'", "[begin, end]", NULL}},
        {"offsets_negative", BN_ERR_FORMAT, {"tensor 'w'", "'data_offsets'", NULL}},
        {"offsets_reversed", BN_ERR_FORMAT, {"tensor 'w'", "[8, 4)", "begin after end"}},
        {"offsets_past_end", BN_ERR_FORMAT, {"tensor 'w'", "[0, 64)", "16-byte data section"}},
        {"offsets_mismatch",
         BN_ERR_FORMAT,
         {"offsets_mismatch.safetensors: tensor 'model.layers.0.mlp.down_proj.weight': "
          "data_offsets [0, 100) but shape [2560, 6912] in BF16 needs 35389440 bytes",
          NULL, NULL}},
        {"overlap", BN_ERR_FORMAT, {"'a' [0, 8)", "'b' [4, 12)", "overlap"}},
        {"duplicate_name", BN_ERR_FORMAT, {"tensor 'w'", "appears twice", NULL}},
        {"metadata_not_string", BN_ERR_FORMAT, {"__metadata__", "'format'", "not a string"}},
        {"metadata_not_object", BN_ERR_FORMAT, {"__metadata__", "not an object", NULL}},
        {"does_not_exist", BN_ERR_IO, {"cannot open", "does_not_exist.safetensors", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "bad/%s.safetensors", cases[i].file);
        bn_safetensors *st = (bn_safetensors *)&st; /* must be reset to NULL */
        bn_error err;
        bn_error_clear(&err);
        bn_status s = bn_safetensors_open(data_path(rel), &st, &err);
        CHECK_MSG(s == cases[i].status, "%s: status %s, expected %s (%s)", cases[i].file,
                  bn_status_str(s), bn_status_str(cases[i].status), err.message);
        CHECK(st == NULL);
        CHECK(err.status == s);
        for (int k = 0; k < 3; k++)
            if (cases[i].needle[k])
                CHECK_STR_CONTAINS(err.message, cases[i].needle[k]);
        if (s == BN_OK)
            bn_safetensors_close(st);
    }

    /* a directory is not a file */
    bn_safetensors *st = NULL;
    bn_error err;
    CHECK(bn_safetensors_open(data_dir, &st, &err) == BN_ERR_IO);
    CHECK_STR_CONTAINS(err.message, "not a regular file");
    CHECK(bn_safetensors_open(NULL, &st, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_safetensors_open("x", NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_safetensors_open(data_path("bad/short.safetensors"), &st, NULL) == BN_ERR_FORMAT);
}

static void test_bad_dirs(void)
{
    static const struct {
        const char *dir;
        bn_status status;
        const char *needle[2];
    } cases[] = {
        {"bad/dir_missing_shard", BN_ERR_IO,
         {"names shard 'model-00002-of-00002.safetensors'", "does not exist"}},
        {"bad/dir_index_missing_tensor", BN_ERR_FORMAT,
         {"tensor 'lm_head.weight'", "model-00001-of-00002.safetensors, which does not contain"}},
        {"bad/dir_duplicate_tensor", BN_ERR_FORMAT,
         {"tensor 'model.norm.weight' is in both", "model-00002-of-00002.safetensors"}},
        {"bad/dir_shard_escape", BN_ERR_FORMAT, {"'model.norm.weight'", "not a shard file name"}},
        {"bad/dir_no_weights", BN_ERR_IO, {"neither model.safetensors", NULL}},
        {"bad/not_a_model", BN_ERR_IO, {"not a model directory", "no config.json"}},
        {"bad/dir_bad_config", BN_ERR_FORMAT, {"config.json", "'num_hidden_layers'"}},
        {"bad/does_not_exist", BN_ERR_IO, {"cannot open model directory", NULL}},
        {"small.safetensors", BN_ERR_IO, {"is not a directory", NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bn_hf_dir *d = (bn_hf_dir *)&d; /* must be reset to NULL */
        bn_error err;
        bn_error_clear(&err);
        bn_status s = bn_hf_dir_open(data_path(cases[i].dir), &d, &err);
        CHECK_MSG(s == cases[i].status, "%s: status %s, expected %s (%s)", cases[i].dir,
                  bn_status_str(s), bn_status_str(cases[i].status), err.message);
        CHECK(d == NULL);
        for (int k = 0; k < 2; k++)
            if (cases[i].needle[k])
                CHECK_STR_CONTAINS(err.message, cases[i].needle[k]);
        if (s == BN_ERR_IO)
            CHECK_MSG(err.hint[0] != '\0', "%s: no hint", cases[i].dir);
        if (s == BN_OK)
            bn_hf_dir_close(d);
    }
    bn_hf_dir *d = NULL;
    CHECK(bn_hf_dir_open(NULL, &d, NULL) == BN_ERR_INVALID_ARGUMENT);
    bn_hf_dir_close(NULL);
    bn_safetensors_close(NULL);
    CHECK(bn_hf_dir_find(NULL, "x") == NULL && bn_hf_dir_tensor_count(NULL) == 0);
    CHECK(bn_safetensors_count(NULL) == 0 && bn_safetensors_find(NULL, "x") == NULL);
}

/* ---- robustness -------------------------------------------------------------------- */

/* Every prefix of a valid file must fail with a format error: safetensors
 * files have no slack, so losing any byte loses part of a tensor. */
static void truncation_battery(const char *rel, size_t full_every)
{
    uint8_t *data = NULL;
    size_t size = 0;
    CHECK_MSG(read_file(data_path(rel), &data, &size), "cannot read %s", rel);
    char path[512];
    int fd = make_temp(path, sizeof path);
    CHECK_MSG(fd >= 0, "cannot create a temporary file");
    if (fd < 0 || size < 8 || write(fd, data, size) != (ssize_t)size) {
        free(data);
        return;
    }
    uint64_t header = 0;
    for (int i = 7; i >= 0; i--)
        header = (header << 8) | data[i];
    size_t header_end = (size_t)(8 + header);

    int tried = 0, clean = 0;
    for (size_t len = size; len-- > 0;) {
        /* every length through the header and the first data bytes, then a
         * stride through the rest (the data section fails the same way) */
        if (len > header_end + 64 && len < size - 16 && len % full_every != 0)
            continue;
        if (ftruncate(fd, (off_t)len) != 0)
            break;
        bn_safetensors *st = NULL;
        bn_error err;
        bn_error_clear(&err);
        bn_status s = bn_safetensors_open(path, &st, &err);
        tried++;
        clean += s == BN_ERR_FORMAT && err.message[0] != '\0' && st == NULL;
        if (s != BN_ERR_FORMAT)
            CHECK_MSG(false, "%s cut to %zu bytes: status %s (%s)", rel, len, bn_status_str(s),
                      err.message);
        if (s == BN_OK)
            bn_safetensors_close(st);
    }
    CHECK_MSG(clean == tried && tried > 0, "%s: %d of %d truncations failed cleanly", rel, clean,
              tried);
    printf("truncation %s: %d lengths, all rejected\n", rel, tried);
    close(fd);
    unlink(path);
    free(data);
}

/* Random damage to the header: any status is fine as long as it is a clean
 * one, and a file that still opens must describe itself consistently. */
static void mutation_battery(void)
{
    uint8_t *data = NULL;
    size_t size = 0;
    CHECK(read_file(data_path("small.safetensors"), &data, &size));
    char path[512];
    int fd = make_temp(path, sizeof path);
    CHECK(fd >= 0);
    if (fd < 0 || size < 16) {
        free(data);
        return;
    }
    uint8_t *copy = malloc(size);
    int opened = 0, rejected = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(copy, data, size);
        int flips = (int)test_rand_range(1, 4);
        for (int f = 0; f < flips; f++) {
            size_t at = (size_t)test_rand_range(0, (int64_t)size - 1);
            /* mostly the header, where the structure lives */
            if (test_rand_range(0, 3) != 0)
                at = (size_t)test_rand_range(0, 8 + 160);
            copy[at] = (uint8_t)test_rand_range(0, 255);
        }
        if (pwrite(fd, copy, size, 0) != (ssize_t)size)
            break;
        bn_safetensors *st = NULL;
        bn_error err;
        bn_status s = bn_safetensors_open(path, &st, &err);
        if (s == BN_OK) {
            opened++;
            for (size_t i = 0; i < bn_safetensors_count(st); i++) {
                const bn_st_tensor *t = bn_safetensors_at(st, i);
                uint64_t n = bn_st_dtype_size(t->dtype);
                for (int d = 0; d < t->n_dims; d++)
                    n *= (uint64_t)t->shape[d];
                CHECK(n == t->bytes);
                fnv1a64(t->data, t->bytes); /* touch every byte (ASan, valgrind) */
            }
            bn_safetensors_close(st);
        } else {
            rejected++;
            CHECK_MSG((s == BN_ERR_FORMAT || s == BN_ERR_UNSUPPORTED) && err.message[0],
                      "mutation %d: status %s", iter, bn_status_str(s));
        }
    }
    printf("mutation: %d opened, %d rejected\n", opened, rejected);
    free(copy);
    free(data);
    close(fd);
    unlink(path);
}

/* A header length within the file but past the 100 MB cap (a sparse file,
 * so nothing is written). */
static void test_header_cap(void)
{
    char path[512];
    int fd = make_temp(path, sizeof path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    uint64_t n = 100ull * 1024 * 1024 + 1;
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    if (write(fd, len, 8) == 8 && write(fd, "{", 1) == 1 && ftruncate(fd, (off_t)(n + 64)) == 0) {
        bn_safetensors *st = NULL;
        bn_error err;
        CHECK(bn_safetensors_open(path, &st, &err) == BN_ERR_FORMAT);
        CHECK_STR_CONTAINS(err.message, "limit");
    }
    close(fd);
    unlink(path);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR (tests/data/hf)\n", argv[0]);
        return 2;
    }
    data_dir = argv[1];
    test_seed_init();

    static expect_tensor ex[64];
    int n_ex = load_expectations(ex, 64);
    CHECK_MSG(n_ex == 2 + 2 * 18, "expect.txt lists %d tensors", n_ex);

    test_dtypes();
    test_small();
    test_tiny_file(ex, n_ex);
    test_tiny_dir(ex, n_ex);
    test_sharded_dir(ex, n_ex);
    test_real_configs();
    test_config_defaults();
    test_bad_configs();
    test_bad_files();
    test_bad_dirs();
    truncation_battery("small.safetensors", 1);
    truncation_battery("tiny/model.safetensors", 97);
    mutation_battery();
    test_header_cap();
    TEST_EXIT();
}
