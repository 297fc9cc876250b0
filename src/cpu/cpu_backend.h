/*
 * cpu_backend.h - the Level-2 CPU backend: a whole BitNet b1.58 forward pass
 * (FORMATS.md section 1) on the CPU, through the Level-1 kernel provider the
 * kernel manager selects.
 *
 * create() unpacks every projection of the model once, repacks it for the
 * provider (the codes are freed right after), allocates the float32 KV cache
 * and the scratch buffers. forward() then runs tokens at positions
 * pos, pos+1, ... and writes logits:
 *
 *   x = embedding(token)
 *   per layer:  n1 = attn_norm(x)        -> int8 once, shared by q, k, v
 *                                           (absmax per token, exact codes)
 *               q, k, v = W2A8 products; RoPE (rotate-half) on q and k
 *               a = causal GQA attention over the KV cache (fp32 softmax)
 *               x += Wo(int8(attn_sub_norm(a)))
 *               n2 = ffn_norm(x)         -> int8 once, shared by gate, up
 *               h = relu(gate)^2 * up    (fp32)
 *               x += Wdown(int8(ffn_sub_norm(h)))
 *   logits = lm_head(output_norm(x))
 *
 * Prefill runs whole chunks of tokens through each matmul (M = tokens in the
 * chunk); decode is M = 1. Every output element is computed by one thread in
 * a fixed order, so logits are bit-identical for any thread count, and a
 * prefill of n tokens equals n single-token steps bit for bit.
 */
#ifndef BN_CPU_BACKEND_H
#define BN_CPU_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch_rows.h"
#include "bitnet.h"
#include "model.h"

typedef struct bn_cpu_backend bn_cpu_backend;

/* Which logits forward() writes. */
typedef enum bn_logits_mode {
    BN_LOGITS_LAST, /* vocab floats: the last token's                     */
    BN_LOGITS_ALL   /* n_tokens * vocab floats: every token's, in order   */
} bn_logits_mode;

/* Memory the backend owns, in bytes. */
typedef struct bn_cpu_memory {
    uint64_t weights;   /* projections in the provider's layout           */
    uint64_t kv_cache;  /* keys and values, float32                        */
    uint64_t scratch;   /* activations for one chunk, per-thread buffers   */
    uint64_t total;
    uint64_t model_mapped; /* the model's own tensors (mapped or owned),  */
                           /* read in place: embeddings and LM head       */
} bn_cpu_memory;

/* kv_len: positions the KV cache holds (0 = the model's training context;
 * more than that is BN_ERR_INVALID_ARGUMENT). n_threads: 0 = BITNET_NUM_THREADS
 * or all cores. The model must outlive the backend (embeddings, the LM head
 * and norms are read from it). */
bn_status bn_cpu_backend_create(const bn_checkpoint *model, int64_t kv_len, int n_threads,
                                bn_cpu_backend **out, bn_error *err);
/* The same with a second, paged cache of paged_rows rows (0: none) for
 * many sequences at once, which forward_rows addresses block by block
 * through block tables; forward() keeps its own cache of kv_len rows, so
 * the two never touch each other's positions. kv_len stays the most
 * positions one sequence holds. */
bn_status bn_cpu_backend_create_paged(const bn_checkpoint *model, int64_t kv_len,
                                      int64_t paged_rows, int n_threads, bn_cpu_backend **out,
                                      bn_error *err);
void bn_cpu_backend_free(bn_cpu_backend *b);

/* Runs n_tokens tokens at positions pos .. pos + n_tokens - 1 and writes
 * logits per `mode`. Positions before pos must have been computed (pos may
 * go back to rewind); pos + n_tokens beyond kv_len is BN_ERR_INVALID_ARGUMENT
 * with nothing computed. */
bn_status bn_cpu_backend_forward(bn_cpu_backend *b, const int32_t *tokens, int64_t n_tokens,
                                 int64_t pos, bn_logits_mode mode, float *logits, bn_error *err);

/* Rows of many sequences in one pass (continuous batching) over the paged
 * cache (batch_rows.h says what the rows hold; block_size divides
 * paged_rows, positions are below kv_len). Each row gives the same numbers
 * it would alone (every output element has one fixed order of arithmetic),
 * so a batch equals its sequences run one by one, bit for bit. */
bn_status bn_cpu_backend_forward_rows(bn_cpu_backend *b, const bn_batch_rows *rows,
                                      float *logits, bn_error *err);

/* forward() and forward_rows() for greedy picks: instead of logits, the
 * token the host's greedy rule (bn_sampler_sample, temperature 0) would
 * take from them, BN_SAMPLER_NO_TOKEN when every logit is NaN or -inf.
 * One row at a time goes through the screened head (head_screen.h), which
 * reads half the head's bytes and picks exactly the same token. */
bn_status bn_cpu_backend_forward_greedy(bn_cpu_backend *b, const int32_t *tokens,
                                        int64_t n_tokens, int64_t pos, int32_t *next,
                                        bn_error *err);
bn_status bn_cpu_backend_forward_rows_greedy(bn_cpu_backend *b, const bn_batch_rows *rows,
                                             int32_t *next, bn_error *err);
int64_t bn_cpu_backend_paged_rows(const bn_cpu_backend *b);

/* Positions the KV cache holds, and how many are filled. */
int64_t bn_cpu_backend_kv_len(const bn_cpu_backend *b);
int64_t bn_cpu_backend_kv_filled(const bn_cpu_backend *b);
/* Forget the cached positions (a new conversation). */
void bn_cpu_backend_reset(bn_cpu_backend *b);

void bn_cpu_backend_memory(const bn_cpu_backend *b, bn_cpu_memory *out);
/* Name of the kernel provider computing ("avx2", ...). */
const char *bn_cpu_backend_kernel_name(const bn_cpu_backend *b);
int bn_cpu_backend_threads(const bn_cpu_backend *b);

/* Where the forward passes' time goes, stage by stage (wall time on the
 * calling thread, the pool's threads working inside the stage), summed
 * since the backend was made or the last reset. Passes of one row (a
 * decode step) and of more rows (prompt chunks, batches) apart. */
typedef enum bn_cpu_stage {
    BN_CPU_STAGE_EMBED,      /* embedding rows                              */
    BN_CPU_STAGE_NORM_QUANT, /* the four RMSNorm + int8 quantizations a layer */
    BN_CPU_STAGE_QKV,        /* q, k, v projections                          */
    BN_CPU_STAGE_ROPE_KV,    /* RoPE and the KV cache store                  */
    BN_CPU_STAGE_ATTENTION,  /* scores, softmax, values                     */
    BN_CPU_STAGE_O,          /* output projection                           */
    BN_CPU_STAGE_GATE_UP,    /* gate and up projections                     */
    BN_CPU_STAGE_RELU2,      /* relu(gate)^2 * up                           */
    BN_CPU_STAGE_DOWN,       /* down projection                             */
    BN_CPU_STAGE_RESIDUAL,   /* the two residual adds a layer               */
    BN_CPU_STAGE_HEAD_NORM,  /* the output norm                             */
    BN_CPU_STAGE_HEAD,       /* the LM head's products                      */
    BN_CPU_STAGE_COUNT
} bn_cpu_stage;

typedef struct bn_cpu_stage_times {
    double seconds[2][BN_CPU_STAGE_COUNT]; /* [0]: one-row passes, [1]: the others */
    uint64_t passes[2], rows[2];
    uint64_t dispatches[2];                /* jobs handed to the thread pool */
} bn_cpu_stage_times;

void bn_cpu_backend_stage_times(const bn_cpu_backend *b, bn_cpu_stage_times *out);
void bn_cpu_backend_reset_stage_times(bn_cpu_backend *b);
const char *bn_cpu_stage_name(bn_cpu_stage s);
/* Seconds one empty job takes through the thread pool (the cost of a
 * dispatch: waking the threads and waiting for them), the mean of reps. */
double bn_cpu_backend_dispatch_seconds(bn_cpu_backend *b, int reps);

#endif
