/*
 * model.h - a BitNet b1.58 model as loaded from a file, independent of any
 * backend.
 *
 * The model keeps the file mapped and hands out weights one piece at a
 * time, because the real checkpoint holds ~2.1 G ternary weights and a
 * backend repacks them into its own layout anyway:
 *
 *   - bn_checkpoint_projection_codes() unpacks ONE projection (q, k, v, o, gate,
 *     up or down of one layer) into canonical codes [n][k] in {-1, 0, +1}
 *     and one float scale, whatever the file's encoding (I2_S, TQ1_0,
 *     TQ2_0, TL1, TL2, the Hugging Face packed layout, or F32/F16/BF16
 *     weights quantized here with absmean);
 *   - bn_checkpoint_embedding_row() dequantizes one token's embedding;
 *   - bn_checkpoint_lm_head() describes the dense output matrix (a tensor in its
 *     file encoding, or the tied embedding);
 *   - the RMSNorm weights are small and converted to float at load.
 *
 * The math those weights feed is FORMATS.md section 1; backends implement it
 * (src/cpu/cpu_backend.h is the reference one).
 *
 * Sources: GGUF files of the three architectures in the wild (bitnet-25,
 * bitnet-b1.58, bitnet), Hugging Face directories (BitNetForCausalLM, packed
 * "offline" checkpoints or bf16 master weights), and random in-memory models
 * of any shape for tests and benchmarks.
 */
#ifndef BN_MODEL_H
#define BN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"
#include "qtype.h"

struct bn_tokenizer;

/* The seven BitLinear projections of a layer. n = outputs, k = inputs. */
typedef enum bn_proj {
    BN_PROJ_Q,    /* n = n_head * head_dim,    k = dim                  */
    BN_PROJ_K,    /* n = n_head_kv * head_dim, k = dim                  */
    BN_PROJ_V,    /* n = n_head_kv * head_dim, k = dim                  */
    BN_PROJ_O,    /* n = dim,                  k = n_head * head_dim    */
    BN_PROJ_GATE, /* n = ffn,                  k = dim                  */
    BN_PROJ_UP,   /* n = ffn,                  k = dim                  */
    BN_PROJ_DOWN, /* n = dim,                  k = ffn                  */
    BN_PROJ_COUNT
} bn_proj;

/* The four per-layer RMSNorm weights. */
typedef enum bn_norm {
    BN_NORM_ATTN,     /* before q/k/v, size dim                          */
    BN_NORM_ATTN_SUB, /* before o, size n_head * head_dim                */
    BN_NORM_FFN,      /* before gate/up, size dim                        */
    BN_NORM_FFN_SUB,  /* before down, size ffn                           */
    BN_NORM_COUNT
} bn_norm;

/* "q", "k", ..., "down" (for messages). */
const char *bn_proj_name(bn_proj p);

typedef struct bn_hparams {
    int32_t vocab;       /* rows of the embedding and the LM head           */
    int32_t dim;         /* hidden size                                     */
    int32_t ffn;         /* intermediate size                               */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_ctx_train; /* context length the model was trained for        */
    int32_t rope_dim;    /* leading dimensions of each head that RoPE turns */
    float rms_eps;
    float rope_theta;
    bool tied_embeddings; /* LM head is the token embedding                 */
    char arch[32];        /* "bitnet-25", "bitnet", "BitNetForCausalLM", ... */
    char flavour[256];    /* human description of the file flavour          */
} bn_hparams;

/* The BitNet b1.58 2B-4T shape (FORMATS.md section 1). */
void bn_hparams_2b4t(bn_hparams *hp);

/* Checks the shape rules every model must satisfy (positive sizes, dim and
 * heads consistent, even rope_dim <= head_dim, ...); the message names the
 * field and its value. */
bn_status bn_hparams_validate(const bn_hparams *hp, bn_error *err);

/* Rows and columns of a projection under hp. */
void bn_hparams_proj_shape(const bn_hparams *hp, bn_proj p, int64_t *n, int64_t *k);
/* Length of a norm vector under hp. */
int64_t bn_hparams_norm_size(const bn_hparams *hp, bn_norm which);
/* Ternary weights of the whole model (sum of n * k over projections). */
int64_t bn_hparams_ternary_count(const bn_hparams *hp);

/* A dense row-major matrix in its file encoding (F32, F16, BF16, Q8_0, Q4_K,
 * Q6_K): row r starts at data + r * row_bytes. */
typedef struct bn_dense_matrix {
    bn_qtype type;
    int64_t rows, cols;
    const void *data;
    size_t row_bytes;
} bn_dense_matrix;

typedef struct bn_checkpoint bn_checkpoint;

/* Loads a GGUF file or a Hugging Face directory (decided by what `path`
 * is). */
bn_status bn_checkpoint_load(const char *path, bn_checkpoint **out, bn_error *err);
bn_status bn_checkpoint_load_gguf(const char *path, bn_checkpoint **out, bn_error *err);
bn_status bn_checkpoint_load_hf_dir(const char *dir, bn_checkpoint **out, bn_error *err);

/* A model of any valid shape with random weights held in memory: ternary
 * codes (uniform over -1, 0, +1) regenerated on demand from the seed, one
 * scale per projection, norms near 1 and an F16 embedding (tied unless
 * hp->tied_embeddings is false, then a separate F16 LM head). Scales are
 * about 1/sqrt(k) so activations keep a sane size through any depth. No
 * tokenizer. The same (hp, seed) always gives the same model. */
bn_status bn_checkpoint_create_random(const bn_hparams *hp, uint64_t seed, bn_checkpoint **out,
                                      bn_error *err);

void bn_checkpoint_free(bn_checkpoint *m);

/* Rank `rank` of `count` of a model for tensor parallelism (Megatron's
 * split): the kv heads (each with the q heads of its group) and the FFN
 * columns dealt out as evenly as they go, so ranks may hold unequal shares
 * (2B-4T's 5 kv heads over 2 ranks: 3 and 2). The slice is a model of its
 * heads and FFN columns: its q, k, v, gate and up are the rank's rows of
 * the parent's, its o and down the rank's columns (inputs), its attn_sub
 * and ffn_sub norms the rank's part. The embedding, the LM head and the
 * other norms are the parent's whole (a backend splits the head by rows
 * itself); a slice has no tokenizer. Codes are cut from the parent's on
 * each request, with the parent's scale, so a slice's products summed over
 * the ranks are the parent's. The parent must outlive the slice. A count
 * above the kv head count is BN_ERR_INVALID_ARGUMENT. */
bn_status bn_checkpoint_slice(const bn_checkpoint *parent, int rank, int count,
                              bn_checkpoint **out, bn_error *err);
/* The whole model's shape: a slice's parent's, else m's own. */
const bn_hparams *bn_checkpoint_whole_hparams(const bn_checkpoint *m);

const bn_hparams *bn_checkpoint_hparams(const bn_checkpoint *m);

/* Unpacks projection `which` of `layer` into codes (n * k bytes, row-major
 * [n][k], n and k from bn_hparams_proj_shape) and its scale: the product of
 * the format's scale and any separate scale tensors, so that
 * y = (codes . x) * scale. */
bn_status bn_checkpoint_projection_codes(const bn_checkpoint *m, int layer, bn_proj which,
                                         int8_t *codes, float *scale, bn_error *err);

/* Encoding of a projection as stored (for reports; random models say
 * TQ2_0, a 2-bit ternary encoding, though they store nothing). */
bn_qtype bn_checkpoint_projection_type(const bn_checkpoint *m, int layer, bn_proj which);

/* out[dim] = embedding of token (0 <= token < vocab). */
bn_status bn_checkpoint_embedding_row(const bn_checkpoint *m, int32_t token, float *out,
                                      bn_error *err);

/* The LM head: vocab rows of dim (the embedding itself when tied). */
const bn_dense_matrix *bn_checkpoint_lm_head(const bn_checkpoint *m);
const bn_dense_matrix *bn_checkpoint_embedding(const bn_checkpoint *m);

/* Norm weights as floats (bn_hparams_norm_size values). */
const float *bn_checkpoint_norm(const bn_checkpoint *m, int layer, bn_norm which);
const float *bn_checkpoint_output_norm(const bn_checkpoint *m);

/* The model's tokenizer, or NULL when the source has none (random models,
 * a GGUF without tokenizer metadata, an HF directory without
 * tokenizer.json). Owned by the model. */
const struct bn_tokenizer *bn_checkpoint_tokenizer(const bn_checkpoint *m);

/* Bytes of weights the model holds or maps (file tensors, or the random
 * model's in-memory embedding). */
uint64_t bn_checkpoint_weight_bytes(const bn_checkpoint *m);

#endif
