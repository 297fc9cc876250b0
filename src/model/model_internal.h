/*
 * model_internal.h - what the model loaders (model_gguf.c, model_hf.c) and
 * model.c share. Not part of the library's interface.
 *
 * The loaders fill a bn_checkpoint through these helpers; model.c knows nothing
 * about GGUF, safetensors or tokenizers (the loader that opened a file hands
 * over a function that closes it), so backends and tests that only need
 * random models link without the file readers.
 */
#ifndef BN_MODEL_INTERNAL_H
#define BN_MODEL_INTERNAL_H

#include "model.h"

/* Where a projection's codes come from. */
typedef enum bn_proj_source {
    BN_PROJ_SRC_TERNARY,       /* a ternary encoding of the registry: unpack   */
    BN_PROJ_SRC_DENSE_ABSMEAN, /* float master weights: absmean-quantize       */
                               /* (Hugging Face bf16 checkpoints, as           */
                               /* transformers does on every forward)          */
    BN_PROJ_SRC_DENSE_VALUES,  /* a float tensor holding code * scale values   */
                               /* (GGUF F32/F16 from the converters): read the */
                               /* codes and the one magnitude back             */
    BN_PROJ_SRC_RANDOM,        /* regenerated from the model's seed            */
    BN_PROJ_SRC_SLICE          /* a rank's part of the parent model's codes    */
                               /* (model_slice.c)                              */
} bn_proj_source;

typedef struct bn_proj_tensor {
    bn_proj_source source;
    bn_qtype type;      /* encoding of data                              */
    const void *data;   /* in the mapping                                */
    size_t bytes;       /* bytes available at data                       */
    int64_t n, k;       /* canonical shape [n][k]                        */
    float extra_scale;  /* product of separate scale tensors (1 if none) */
    char name[96];      /* tensor name in the file, for messages         */
} bn_proj_tensor;

struct bn_checkpoint {
    bn_hparams hp;
    bn_proj_tensor *proj;    /* [n_layer][BN_PROJ_COUNT]                  */
    float *norms;            /* every norm vector, see norm_slot()        */
    bn_dense_matrix embedding;
    bn_dense_matrix lm_head; /* == embedding when tied                    */
    struct bn_tokenizer *tokenizer;
    void (*free_tokenizer)(struct bn_tokenizer *t);
    void *source;            /* the open file(s)                          */
    void (*close_source)(void *source);
    void *owned;             /* memory the model allocated for weights    */
    uint64_t seed;           /* random models                             */
    uint64_t weight_bytes;
    /* A tensor-parallel slice (model_slice.c): rank slice_rank of
     * slice_count of `parent`, which outlives it. */
    const bn_checkpoint *parent;
    int slice_rank, slice_count;
};

/* The codes of a slice's projection (model_slice.c). */
bn_status bn_checkpoint_slice_codes(const bn_checkpoint *m, int layer, bn_proj which,
                                    int8_t *codes, float *scale, bn_error *err);

/* Allocates a model for hp (validated) with empty projections and norms. */
bn_status bn_checkpoint_alloc(const bn_hparams *hp, bn_checkpoint **out, bn_error *err);
/* Refuses a source too small for the model its metadata describes (before
 * any table sized by that metadata is allocated). */
bn_status bn_checkpoint_check_fits(const bn_hparams *hp, uint64_t source_bytes, const char *source,
                                   bn_error *err);

bn_proj_tensor *bn_checkpoint_proj_slot(bn_checkpoint *m, int layer, bn_proj which);
float *bn_checkpoint_norm_slot(bn_checkpoint *m, int layer, bn_norm which);
float *bn_checkpoint_output_norm_slot(bn_checkpoint *m);

/* Converts n floats stored as F32, F16 or BF16 into dst; other types are
 * BN_ERR_UNSUPPORTED naming `what`. */
bn_status bn_checkpoint_floats_from(bn_qtype type, const void *src, size_t src_bytes, int64_t n,
                                    float *dst, const char *what, bn_error *err);

/* Checks a dense matrix (embedding or LM head): a row type the registry
 * can dequantize, cols a multiple of its block, enough bytes. Fills
 * out->row_bytes. */
bn_status bn_checkpoint_dense_check(bn_dense_matrix *out, size_t bytes_available, const char *what,
                                    bn_error *err);

/* Checks that a ternary or float projection tensor of `type` holds n x k
 * weights in bytes_available, and sets its source. */
bn_status bn_checkpoint_proj_set(bn_proj_tensor *p, const char *name, bn_qtype type,
                                 const void *data, size_t bytes_available, int64_t n, int64_t k,
                                 bool dense_is_master, bn_error *err);

/* "I2_S", "F16", ... (upper-case registry name) into buf. */
const char *bn_checkpoint_qtype_label(bn_qtype type, char *buf, size_t size);

/* Describes the projections' encodings in words: "I2_S" when all share one,
 * else "mixed I2_S/F16". */
void bn_checkpoint_proj_types_label(const bn_checkpoint *m, char *buf, size_t size);

#endif
