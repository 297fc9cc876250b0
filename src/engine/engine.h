/*
 * engine.h - what the CLI (and later the server) drives: open a model on a
 * backend chosen from the request, generate text token by token, and
 * describe the run in a receipt.
 *
 * Backend selection (DESIGN.md, "Engine"). The request comes from the
 * caller's flag, else BITNET_DEVICE, else "auto":
 *
 *   cpu             the CPU backend
 *   auto            the CUDA backend (src/cuda/cuda_backend.h) on the best
 *                   device when a real CUDA GPU is usable and the build has
 *                   CUDA, else the CPU. When the CUDA backend cannot start
 *                   (out of memory, a kernel that does not run, ...) or a
 *                   CUDA step fails during generation, the engine logs the
 *                   reason (warn), records it in the receipt and continues
 *                   on the CPU (a failed step: the positions so far are
 *                   recomputed there). BITNET_STRICT_MODE=1 turns any such
 *                   fallback - also a usable GPU in a build without CUDA -
 *                   into an error.
 *   gpu, cuda[:N]   the CUDA backend on the best device / device N, never a
 *                   fallback: an unusable device or a failure is an error
 *                   (BN_ERR_NO_DEVICE / BN_ERR_DRIVER naming why, exit code 4;
 *                   BN_ERR_NO_DEVICE also in a build without CUDA and when
 *                   the CUDA backend cannot run this model).
 *
 * Fake GPUs (BITNET_GPU_FAKE) are never used to compute and never appear in
 * the "detected" list. The selection is summarised in one startup line,
 *
 *   requested=auto detected=[cuda,avx512,scalar] selected=cuda:0 (NVIDIA H200, graphs, kv f32,
 *   attention merge cluster 8 with q|k|v, gemv stage cluster 8 (gate|up cluster 16),
 *   greedy head screened)
 *   requested=auto detected=[avx512,scalar] selected=cpu (avx512, 2 threads)
 *
 * where detected lists the GPU backends that are really usable followed by
 * the CPU kernel providers this CPU can run, best first. The library never
 * prints it: callers print bn_engine_startup_line() where they want it.
 *
 * Generation: tokenize (optionally in the 2B-4T chat format), run the whole
 * prompt as one prefill batch, then one token per step with the sampler
 * until n_predict tokens or an end-of-generation token. Text is streamed
 * through a callback in whole UTF-8 characters. On the CUDA backend, greedy
 * decoding without a repetition penalty picks the token on the device (the
 * CPU sampler's argmax rule) and streams the previous token's text while
 * the GPU computes the next step.
 */
#ifndef BN_ENGINE_H
#define BN_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>

#include "bitnet.h"
#include "kv_blocks.h"
#include "model.h"
#include "sampler.h"

typedef struct bn_engine bn_engine;

typedef struct bn_engine_options {
    /* A GGUF file or Hugging Face directory; ignored when random_shape is
     * set. */
    const char *model_path;
    /* Instead of a file: a model of this shape with random ternary weights
     * (bn_checkpoint_create_random with random_seed), for benchmarks. It is
     * built after the backend is chosen, so a device error costs nothing. */
    const bn_hparams *random_shape;
    uint64_t random_seed;
    /* "auto", "cpu", "gpu", "cuda", "cuda:N"; NULL = cfg->device. */
    const char *device;
    /* CPU threads; 0 = BITNET_NUM_THREADS, else every core. */
    int n_threads;
    /* KV cache positions; 0 = the model's training context. */
    int64_t n_ctx;
    /* CUDA backend: the KV cache's precision. BN_KV_F16: fp16 instead of
     * fp32 (half the memory and attention bandwidth; logits within ~3e-2 x
     * max|logit| of the CPU's, so greedy tokens may differ where two are
     * that close); BN_KV_FP8: the paged cache of many sequences in fp8
     * e4m3, the one-sequence cache in fp16. */
    bn_kv_precision kv;
    /* Tests: the CUDA backend's forward call number N (1-based) fails, as a
     * failed kernel would; 0 = never. */
    int test_cuda_fail_call;
    /* Many sequences at once (bn_engine_generate_batch), where the backend
     * has forward_rows: at most max_seqs running together (0 or 1: none)
     * over a paged KV cache of kv_positions positions (or kv_bytes; 0: max_seqs times
     * the context) in blocks of kv_block positions (0: 32), cached prefix
     * blocks evicted by kv_evict, shared between sequences unless
     * no_prefix_sharing; a step takes one row per decoding sequence, then
     * prompt rows while it has fewer than token_budget rows in all (0: 512;
     * at most BN_BATCH_TOKENS_MAX). */
    int max_seqs;
    int kv_block;
    int64_t kv_positions;
    uint64_t kv_bytes;        /* instead of kv_positions: the paged cache's
                                 bytes (fp32 keys and values)              */
    bn_kv_evict kv_evict;
    bool no_prefix_sharing;
    int token_budget;
    /* CUDA GPUs that split the model between them (tensor parallelism
     * over NCCL, cuda_tp.h); 0 or 1: none. The device request names them
     * (cuda:N,M,..., exactly this many) or, for cuda / gpu / auto, the
     * first this many devices. One sequence at a time. */
    int tensor_parallel;
} bn_engine_options;

/* Chooses the backend, loads the model and builds the backend. cfg carries
 * BITNET_DEVICE, BITNET_NUM_THREADS, fake-GPU and strict settings (NULL =
 * read the environment). Device errors come before the model is read. */
bn_status bn_engine_open(const bn_config *cfg, const bn_engine_options *opt, bn_engine **out,
                         bn_error *err);
void bn_engine_free(bn_engine *e);

/* Whether generation with these sampling settings has the next token picked
 * by the backend (CUDA: greedy or a top-k of 1 to 64, on the device; the
 * CPU: greedy, through its screened LM head; never with a repetition
 * penalty, which needs the history on the host); otherwise the logits come
 * back every step and the host's sampler picks. */
bool bn_engine_picks_on_device(const bn_engine *e, const bn_sampler_params *p);

const bn_checkpoint *bn_engine_model(const bn_engine *e);
/* The handle of the backend computing when it is the one named `name`
 * ("cpu": a bn_cpu_backend, "cuda": a bn_cuda_backend), else NULL: for
 * that backend's own measurements (bitnet bench). */
void *bn_engine_backend_handle(bn_engine *e, const char *name);
/* The startup line (no newline). */
const char *bn_engine_startup_line(const bn_engine *e);
/* Positions of the KV cache. */
int64_t bn_engine_n_ctx(const bn_engine *e);
/* Positions the KV cache holds now, from 0 (the prompt and generated tokens
 * of the last request that computed them, the last token sampled not
 * included): what a request's n_cached may reuse. */
int64_t bn_engine_kv_filled(const bn_engine *e);

/* Receives each generated token (token >= 0) with the text it completes in
 * whole UTF-8 characters (not NUL-terminated; len 0 while a character is
 * incomplete), then once with token -1 for bytes left at the end, if any.
 * Returning false stops the generation after this token
 * (bn_generation.stopped_by_caller). */
typedef bool (*bn_engine_token_fn)(void *ctx, int32_t token, const char *text, size_t len);

typedef struct bn_generate_request {
    /* The prompt's token ids, used as they are (the public API tokenizes
     * text and applies the chat format before). */
    const int32_t *prompt_tokens;
    size_t n_prompt_tokens;
    bool chat;             /* the prompt is a chat (recorded in the receipt) */
    int n_predict;         /* tokens to generate at most (>= 1)            */
    /* The first n_cached prompt tokens are the ones the KV cache holds
     * from the requests before (at most bn_engine_kv_filled, fewer than the
     * prompt's tokens): the prefill starts after them, nothing is reset.
     * 0: the cache is reset and the whole prompt runs. */
    size_t n_cached;
    /* Run the prompt only (prompt_logits filled), generate nothing;
     * n_predict is then ignored. */
    bool prompt_only;
    /* When not NULL and nonzero (set by another thread), the generation
     * stops before its next token (bn_generation.cancelled). */
    const _Atomic int *cancel;
    bool ignore_eog;       /* keep going past end-of-generation (benchmarks) */
    bn_sampler_params sampling;
    bn_engine_token_fn on_token; /* may be NULL */
    void *ctx;
    /* When not NULL: vocab floats, the logits after the prompt (before any
     * sampling changes them). */
    float *prompt_logits;
    /* When not NULL: each generated token's log-probability and the
     * top_logprobs most likely tokens (engine_logprobs), with logprobs_ctx;
     * the tokens are then picked on the host. */
    bn_logprob_callback on_logprobs;
    int top_logprobs;
    void *logprobs_ctx;
} bn_generate_request;

typedef struct bn_generation {
    int32_t *prompt_tokens;  /* malloc'ed                                   */
    size_t n_prompt;
    int32_t *tokens;         /* generated ids (malloc'ed), EOG not included */
    size_t n_tokens;
    char *text;              /* generated text, NUL-terminated (malloc'ed)  */
    size_t text_len;
    bool stopped_at_eog;     /* else stopped at n_predict, or:              */
    bool stopped_by_caller;  /* on_token returned false                     */
    bool cancelled;          /* req->cancel was set                         */
    int32_t eog_token;       /* the EOG token when stopped_at_eog, else -1  */
    double prompt_seconds;   /* prefill forward pass                        */
    double gen_seconds;      /* from the end of prefill to the last token   */
    int64_t decode_steps;    /* single-token forward passes run             */
    double decode_seconds;   /* time inside those forward passes            */
} bn_generation;

/* Runs one request from position 0 (the KV cache is reset first). On
 * failure *g is left empty. A request whose prompt plus n_predict does not
 * fit the context is BN_ERR_INVALID_ARGUMENT before any forward pass. */
bn_status bn_engine_generate(bn_engine *e, const bn_generate_request *req, bn_generation *g,
                             bn_error *err);
void bn_generation_free(bn_generation *g);

/* The logits of positions pos .. pos + n - 1 (n * vocab floats, in order),
 * running history[pos .. pos + n) there; history holds the tokens of every
 * position from 0 (positions before pos must have been computed by the
 * previous call, or pos is 0). The CPU backend runs the tokens as one
 * batch; the CUDA backend, which returns the last row's logits only, runs
 * them one decode step each. */
bn_status bn_engine_forward_logits(bn_engine *e, const int32_t *history, int64_t pos, int64_t n,
                                   float *logits, bn_error *err);

/* ---- many sequences at once (scheduler.c) --------------------------------- */

typedef struct bn_batch_request {
    const int32_t *prompt;    /* token ids, used as they are                 */
    size_t n_prompt;
    int n_predict;            /* tokens to generate at most (>= 1)           */
    bool ignore_eog;
    bn_sampler_params sampling; /* each request its own sampler and seed     */
    bn_engine_token_fn on_token; /* may be NULL; called from this thread     */
    void *ctx;
    const _Atomic int *cancel;  /* may be NULL                               */
    float *prompt_logits;       /* may be NULL: the logits after the prompt  */
    bn_logprob_callback on_logprobs; /* as bn_generate_request's              */
    int top_logprobs;
    void *logprobs_ctx;
} bn_batch_request;

typedef struct bn_batch_result {
    bn_status status;           /* this request's own outcome                */
    bn_error error;
    bn_generation gen;          /* as bn_engine_generate's (free it)         */
    int64_t reused;             /* prompt positions the prefix cache held    */
    int preemptions;            /* times its blocks were taken back          */
    double first_token_seconds; /* from its submission to its first token    */
    atomic_bool done;           /* set once it ended (bn_batcher_step)       */
} bn_batch_result;

/* Runs the requests together: up to max_seqs at once in shared forward
 * passes, the others waiting their turn (first come, first served), each
 * joining as soon as a running one ends. Each request's tokens are what it
 * gives alone (on the CPU bit for bit: a row's numbers do not depend on the
 * others in its pass). A request that cannot run (too long for the
 * context or the whole cache, bad tokens) fails alone in its result;
 * the call's own status is an error only when a pass fails, and then
 * every request not finished fails with it. Without a backend that batches
 * (forward_rows) the requests run one after another. */
bn_status bn_engine_generate_batch(bn_engine *e, const bn_batch_request *reqs, size_t n,
                                   bn_batch_result *out, bn_error *err);

/* The same scheduler driven step by step, for requests that come while
 * others run (a server, several threads): bn_batcher_add queues a request
 * (the request struct is copied; its prompt is copied, and its callback,
 * cancel flag and prompt_logits must live until it ends; out->done must be
 * false, atomic_init'ed by the caller, who may read it meanwhile), and each
 * bn_batcher_step admits what fits, runs one pass and ends what finished:
 * their results' done set, *active the requests not yet ended. A failed
 * pass fails every request not ended, with its error. The engine must
 * batch (bn_batch_stats.enabled); one thread at a time. */
typedef struct bn_batcher bn_batcher;
bn_status bn_batcher_create(bn_engine *e, bn_batcher **out, bn_error *err);
bn_status bn_batcher_add(bn_batcher *bt, const bn_batch_request *req, bn_batch_result *out,
                         bn_error *err);
bn_status bn_batcher_step(bn_batcher *bt, size_t *active, bn_error *err);
/* Ends every request not ended (BN_ERR_INVALID_ARGUMENT) and frees it. */
void bn_batcher_free(bn_batcher *bt);

/* The scheduler's state: the paged cache's blocks and counters. */
typedef struct bn_batch_stats {
    bool enabled;               /* the backend batches, max_seqs > 1         */
    int max_seqs, block_size;
    bn_kv_blocks_stats blocks;
    uint64_t steps, rows, preemptions;
    /* Passes whose rows all decode (one row a sequence, no prompt): their
     * rows and wall time, the aggregate decode rate. */
    uint64_t decode_passes, decode_rows;
    double decode_seconds;
    /* Time in every pass's forward, and in handing out the tokens of the
     * passes (host sampling, the token callbacks): what the scheduler's
     * thread spends outside the device. */
    double forward_seconds, token_seconds;
} bn_batch_stats;
void bn_engine_batch_stats(const bn_engine *e, bn_batch_stats *out);
/* Starts blocks.peak_held again from the blocks held now. */
void bn_engine_batch_reset_peak(bn_engine *e);
/* Replicas (device cuda:N,M,... with sequences at once): the engines
 * computing, 1 + the replicas (0 for NULL); the counters above are their
 * sums, and bn_engine_replica_batch_stats gives engine i's alone (0: the
 * first device's). */
int bn_engine_replica_count(const bn_engine *e);
void bn_engine_replica_batch_stats(const bn_engine *e, int i, bn_batch_stats *out);

/* Perplexity of a text (bitnet perplexity). The text is tokenized as a
 * whole (no BOS) and cut into consecutive pieces of ctx - 1 tokens (the
 * last may be shorter); each piece runs from position 0 as [BOS] + piece
 * and every token of it is predicted. A vocabulary without BOS uses pieces
 * of ctx tokens whose first token is context only. perplexity =
 * exp(mean negative log-likelihood), the log-softmax taken in double. */
typedef struct bn_perplexity_result {
    double perplexity;
    double mean_nll;       /* nats per predicted token                       */
    int64_t n_predicted;   /* tokens scored                                  */
    int64_t n_text_tokens; /* tokens of the whole text                       */
    int64_t n_chunks;
    int64_t ctx;
    double seconds;        /* forward passes and scoring                     */
} bn_perplexity_result;
/* Called after each chunk with the running result (tokens so far). */
typedef void (*bn_perplexity_progress_fn)(void *ctx, int64_t chunk, int64_t n_chunks,
                                          const bn_perplexity_result *so_far);
bn_status bn_engine_perplexity(bn_engine *e, const char *text, size_t len, int64_t ctx,
                               bn_perplexity_progress_fn progress, void *progress_ctx,
                               bn_perplexity_result *out, bn_error *err);

/* What the receipt records about a run beyond the engine's own state. */
typedef struct bn_receipt_info {
    const char *command;           /* e.g. "run"                          */
    const bn_generate_request *req;
    const bn_generation *gen;
    bool seed_fixed;
} bn_receipt_info;

/* Writes the JSON receipt of a run (fields: docs/CLI.md). */
bn_status bn_engine_write_receipt(const bn_engine *e, const bn_receipt_info *info, FILE *out,
                                  bn_error *err);

/* ---- what the receipt and reports read ------------------------------------ */

typedef struct bn_engine_info {
    const char *model_path;     /* "" for in-memory models                 */
    const char *requested;      /* "auto", "cuda:1", ...                    */
    const char *requested_from; /* "flag", "BITNET_DEVICE" or "default"    */
    const char *detected;       /* "cuda,avx512,scalar"                     */
    const char *selected;       /* "cpu", "cuda:0"                          */
    const char *kernel;         /* CPU kernel provider ("avx512"), or "cuda" */
    const char *fallback;       /* why auto did not take a GPU; "" if none  */
    int threads;
    int64_t n_ctx;
    double load_seconds;        /* model load + backend build              */
    uint64_t model_weight_bytes;
    uint64_t backend_weight_bytes, backend_kv_bytes, backend_scratch_bytes, backend_total_bytes;
    /* The kernels that ran, comma-separated (CUDA: kernel families; CPU:
     * the provider; after a fallback both). */
    char kernels[512];
    /* On a GPU (gpu true): the device and its memory. */
    bool gpu;
    int gpu_device;
    const char *gpu_name;
    bool cuda_graphs;           /* decode steps replay a CUDA graph        */
    const char *kv_type;        /* "f32", "f16" or "fp8"                   */
    uint64_t gpu_weights_bytes, gpu_embedding_bytes, gpu_lm_head_bytes, gpu_norms_bytes,
        gpu_kv_bytes, gpu_scratch_bytes, gpu_total_bytes, gpu_peak_bytes;
    /* The LM head's int8 copy that greedy steps screen (0: not screened). */
    uint64_t gpu_lm_head_screen_bytes;
    uint64_t gpu_device_total_bytes, gpu_device_free_bytes;
    /* The device memory pool (bn_cuda_memory's pool_*). */
    uint64_t gpu_pool_reserved_bytes, gpu_pool_peak_reserved_bytes, gpu_pool_limit_bytes,
        gpu_pool_buffers, gpu_pool_allocations, gpu_pool_failures;
    /* What the GPU was asked to do since loading (bn_cuda_backend_work):
     * kernel launches and host-device copies, the uploads included. */
    uint64_t gpu_kernel_launches, gpu_h2d_transfers, gpu_h2d_bytes, gpu_d2h_transfers,
        gpu_d2h_bytes;
    /* GPUs the model is split across (tensor parallelism); 0: none. The
     * device, memory and work above are the first GPU's (every rank holds
     * its own slice alike). */
    int tensor_parallel;
} bn_engine_info;

void bn_engine_get_info(const bn_engine *e, bn_engine_info *info);
/* Engine i's report (0: this engine's; 1 ..: its replicas', each with its
 * device, memory and work). */
void bn_engine_replica_info(const bn_engine *e, int i, bn_engine_info *info);

#endif
