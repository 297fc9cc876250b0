/*
 * safetensors.h - Hugging Face safetensors files and model directories.
 *
 * A safetensors file is an 8-byte little-endian header length, a JSON header
 * ({"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
 * ..., "__metadata__": {...}}) and the tensor bytes. The reader maps the file
 * and checks every tensor: known dtype, offsets inside the data section,
 * end - begin equal to the shape's size, no overlaps; the JSON is parsed
 * with cJSON and the header length is bounded by the file.
 *
 * A model directory holds config.json, model.safetensors or
 * model.safetensors.index.json with shards, tokenizer.json and optionally
 * generation_config.json; bn_hf_dir opens all of it and finds tensors by
 * name across shards.
 */
#ifndef BN_SAFETENSORS_H
#define BN_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

typedef enum bn_st_dtype {
    BN_ST_BOOL,
    BN_ST_U8,
    BN_ST_I8,
    BN_ST_I16,
    BN_ST_U16,
    BN_ST_F16,
    BN_ST_BF16,
    BN_ST_I32,
    BN_ST_U32,
    BN_ST_F32,
    BN_ST_I64,
    BN_ST_U64,
    BN_ST_F64,
    BN_ST_F8_E4M3,
    BN_ST_F8_E5M2,
    BN_ST_DTYPE_COUNT
} bn_st_dtype;

const char *bn_st_dtype_name(bn_st_dtype t); /* "BF16" ... */
size_t bn_st_dtype_size(bn_st_dtype t);

#define BN_ST_MAX_DIMS 8

typedef struct bn_st_tensor {
    const char *name;      /* NUL-terminated, owned by the file object */
    bn_st_dtype dtype;
    int n_dims;            /* 0 for a scalar */
    int64_t shape[BN_ST_MAX_DIMS]; /* outermost first, as in PyTorch */
    const void *data;      /* in the mapping */
    uint64_t bytes;
} bn_st_tensor;

typedef struct bn_safetensors bn_safetensors;

bn_status bn_safetensors_open(const char *path, bn_safetensors **out, bn_error *err);
void bn_safetensors_close(bn_safetensors *st);
size_t bn_safetensors_count(const bn_safetensors *st);
/* Tensors in name order. Data pointers need not be aligned for their dtype
 * (the format does not promise it): read through memcpy or check first. */
const bn_st_tensor *bn_safetensors_at(const bn_safetensors *st, size_t i);
const bn_st_tensor *bn_safetensors_find(const bn_safetensors *st, const char *name);
/* A "__metadata__" string value, or NULL. */
const char *bn_safetensors_metadata(const bn_safetensors *st, const char *key);

/* ---- Hugging Face model directories ------------------------------------- */

/* The config.json fields the runtime uses; absent optional fields keep the
 * defaults noted. */
typedef struct bn_hf_config {
    char architecture[64];     /* architectures[0], e.g. "BitNetForCausalLM" */
    char model_type[32];       /* "bitnet" */
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;   /* default: num_attention_heads */
    int head_dim;              /* default: hidden_size / num_attention_heads */
    int vocab_size;
    int max_position_embeddings; /* default 2048 (BitNetConfig) */
    float rms_norm_eps;        /* default 1e-5 */
    float rope_theta;          /* rope_theta at the top level (transformers 4)
                                  or in rope_parameters (5); default 500000
                                  for model_type "bitnet" (BitNetConfig),
                                  else 10000 */
    bool rope_theta_default;   /* config.json names no RoPE base */
    bool tie_word_embeddings;  /* default false, as BitNetConfig */
    char hidden_act[16];       /* "relu2" */
    int bos_token_id;          /* -1 when absent */
    int eos_token_ids[8];      /* int or list in config.json */
    int n_eos_token_ids;
    /* quantization_config */
    bool quantized;            /* quantization_config present */
    char quant_method[16];     /* "bitnet" */
    char linear_class[32];     /* "autobitlinear" (multiplies) | "bitlinear"
                                  (divides; the default when absent) */
    char quantization_mode[16];/* "offline" (packed; default) | "online" */
    /* Keys present but not read, comma-separated (cut with "..." when
     * long); bn_hf_config_load logs them as a warning. "" when none. */
    char unused_keys[256];
} bn_hf_config;

/* Parses a config.json file; errors name the field. RoPE scaling and other
 * settings bitnet cannot apply (rope_scaling or rope_parameters of a type
 * other than "default", partial_rotary_factor != 1, attention_bias,
 * quantization_config.use_rms_norm) are BN_ERR_UNSUPPORTED. */
bn_status bn_hf_config_load(const char *path, bn_hf_config *cfg, bn_error *err);

typedef struct bn_hf_dir bn_hf_dir;

bn_status bn_hf_dir_open(const char *dir, bn_hf_dir **out, bn_error *err);
void bn_hf_dir_close(bn_hf_dir *d);
const bn_hf_config *bn_hf_dir_config(const bn_hf_dir *d);
/* Path of tokenizer.json inside the directory, or NULL when absent. */
const char *bn_hf_dir_tokenizer_path(const bn_hf_dir *d);
/* generation_config.json's eos_token_id when present (else false): copies
 * up to max ids and sets *n to the number copied. */
bool bn_hf_dir_generation_eos(const bn_hf_dir *d, int *ids, int max, int *n);
/* Tensor by name across all shards; NULL when absent. _at is in name order. */
const bn_st_tensor *bn_hf_dir_find(const bn_hf_dir *d, const char *name);
size_t bn_hf_dir_tensor_count(const bn_hf_dir *d);
const bn_st_tensor *bn_hf_dir_tensor_at(const bn_hf_dir *d, size_t i);

#endif
