/*
 * cuda_backend.h - the Level-2 CUDA backend: a whole BitNet b1.58 forward
 * pass (FORMATS.md section 1) on one NVIDIA GPU, numerically the CPU
 * backend's (src/cpu/cpu_backend.h) up to fp32 summation order. Plain C:
 * callers need no CUDA headers. Built only with CUDA (BITNET_HAVE_CUDA).
 *
 * create() uploads everything once:
 *   - every projection, unpacked on the host (bn_checkpoint_projection_codes,
 *     one projection per host thread at a time) and packed into the tile
 *     layout of src/kernels/cuda_layout.h; q|k|v and gate|up of a layer
 *     sit back to back so that each pair or triple is one GEMV;
 *   - the token embedding in its file encoding (bn_cuda_embed_rows reads
 *     F32/F16/BF16/Q8_0/Q4_K/Q6_K/TQ2_0 rows), the LM head as F16/BF16/F32
 *     rows (the embedding buffer itself when tied and 16/32-bit; other
 *     encodings are converted: to F32 when that takes at most 256 MiB, which
 *     keeps the logits exact, else to F16), the RMSNorm weights;
 *   - the KV cache (fp32 by default, the CPU's; fp16 on request) and the
 *     scratch of one prefill chunk.
 *
 * forward() runs on the device with no host round trip inside a step:
 *
 *   embed -> per layer: rmsnorm+int8 -> q|k|v GEMV/GEMM -> scale+RoPE+KV
 *   store -> attention -> attn_sub_norm+int8 -> Wo -> residual+ffn_norm+int8
 *   -> gate|up -> relu^2*up+ffn_sub_norm+int8 -> down -> residual+next
 *   norm+int8 (last layer: residual+output_norm) -> LM head [-> argmax]
 *
 * Prefill runs chunks of up to `prefill_chunk` tokens through int8 tensor-
 * core GEMMs; decode (one token) is captured once as a CUDA graph at
 * create() and replayed every step: the token, its position, the attention
 * length and the sampling inputs live in device memory, uploaded (40 bytes)
 * before each replay, or, for a chained step (submit_chained), written by
 * the step before it on the device. With the fp32 cache the decode step's
 * scale + RoPE + KV store runs inside its attention kernel (9 kernels per
 * layer; 8 where its thread-block clusters compute the q|k|v product too),
 * and on compute capability 9.0+ its kernels use programmatic dependent
 * launch: each one starts loading what does not depend on its predecessor
 * (weights, norm vectors, old KV rows) while the predecessor still runs.
 * Which kernel each stage of the decode step runs (its form) is chosen at
 * create() from what the device and the model allow, by one table
 * (cuda_decode_form.h).
 *
 * Streams (the context's two): `compute` runs every step, including the
 * tiny H2D of the step's inputs and the D2H of logits, which must be
 * ordered with the kernels anyway (the chosen token is stored by the step's
 * last kernel into mapped pinned memory); `copy` carries the weight uploads
 * at create(), so that while one projection crosses PCIe the host threads
 * unpack and pack the next ones (two pinned staging buffers per thread, an
 * event per buffer). During generation the host's own work (detokenizing,
 * streaming text) overlaps the next steps through submit_greedy() /
 * submit_chained() / wait_greedy().
 *
 * Memory: every device buffer comes from the context's tracked allocations
 * (bn_cuda_context_alloc), one buffer per purpose, sized exactly once at
 * create(): nothing is freed and re-requested while the backend lives, so a
 * caching pool would only add its size-class rounding (up to 1 MiB per
 * weight buffer). The plan is computed before any allocation and checked
 * against the memory limit and the device's free memory; a request that
 * does not fit is BN_ERR_GPU_OUT_OF_MEMORY naming the parts and what to
 * reduce, and leaves the device as it found it.
 */
#ifndef BN_CUDA_BACKEND_H
#define BN_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch_rows.h"
#include "bitnet.h"
#include "cuda_decode_form.h"
#include "model.h"
#include "sample_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bn_cuda_backend bn_cuda_backend;

typedef enum bn_cuda_kv_type {
    BN_CUDA_KV_F32 = 0, /* the CPU's precision: greedy tokens equal the CPU's         */
    BN_CUDA_KV_F16 = 1, /* half the memory and bandwidth; logits within ~3e-2 x max  */
    BN_CUDA_KV_E4M3 = 2 /* the paged cache of many sequences in fp8 e4m3 (a quarter
                           of fp32's bytes); the one-sequence cache in fp16          */
} bn_cuda_kv_type;

typedef struct bn_cuda_backend_options {
    int device;            /* CUDA ordinal; -1: the best device (most memory)         */
    int64_t kv_len;        /* KV positions; 0: the model's training context           */
    uint64_t memory_limit; /* device bytes the backend may use; 0: no limit           */
    bn_cuda_kv_type kv_type;
    int prefill_chunk;     /* tokens per prefill pass; 0: 512                         */
    int threads;           /* host threads unpacking weights; 0: BITNET_NUM_THREADS   */
    /* A paged fp32 cache of paged_rows rows for many sequences at once
     * (bn_cuda_backend_forward_rows), in blocks of paged_block positions, for
     * at most paged_max_seqs sequences; 0 rows: none (also with an fp16
     * cache or a head size the paged attention does not take). */
    int64_t paged_rows;
    int paged_block, paged_max_seqs;
    /* Tensor parallelism (cuda_tp.h): this backend is rank tp_rank of
     * tp_size >= 2 over a slice of the model (bn_checkpoint_slice), tp_comm
     * the rank's NCCL communicator. It adds the ranks' partial products of
     * Wo and down (an all-reduce), shares the sub-norms' statistics (an
     * all-gather) and computes its rows of the LM head (then gathered), so
     * every rank's every call must be made on all ranks at once. tp_ready,
     * called once the memory is in place and before the first collective,
     * says whether every rank got that far (false: creation stops). 0 or 1:
     * none. No paged cache. */
    int tp_size, tp_rank;
    void *tp_comm;
    /* The team's buffers for small exchanges through peer memory
     * (tp_exchange.cu), or NULL: every collective through NCCL. */
    const struct bn_cb_exchange *tp_exchange;
    bool (*tp_ready)(void *team, int rank, bool ok);
    void *tp_team;
} bn_cuda_backend_options;

void bn_cuda_backend_options_default(bn_cuda_backend_options *o);

/* Device memory the backend holds, in bytes. */
typedef struct bn_cuda_memory {
    uint64_t weights;      /* packed ternary projections                       */
    uint64_t embedding;    /* token embedding table                            */
    uint64_t lm_head;      /* a separate LM head (0 when it is the embedding)  */
    uint64_t lm_head_screen; /* its int8 copy for greedy steps (0: not screened) */
    uint64_t norms;
    uint64_t kv_cache;
    uint64_t scratch;      /* activations, workspaces, logits                  */
    uint64_t total;        /* the sum of the above                             */
    uint64_t peak;         /* the context's high-water mark (incl. transients) */
    uint64_t device_total; /* the GPU's memory, and what was free after create */
    uint64_t device_free;
    /* The memory pool every buffer comes from (memory_pool.h): bytes held
     * from the driver now and at most, the limit it enforces (0: none),
     * buffers handed out, allocations and refusals. */
    uint64_t pool_reserved, pool_peak_reserved, pool_limit;
    uint64_t pool_buffers, pool_allocations, pool_failures;
} bn_cuda_memory;

/* Opens the device and uploads the model (see the top of this file). The
 * model must outlive the backend. Failures: the device's (BN_ERR_NO_DEVICE,
 * BN_ERR_DRIVER, ...), BN_ERR_UNSUPPORTED for a shape the kernels do not
 * handle (head_dim, rope_dim), BN_ERR_GPU_OUT_OF_MEMORY when the plan does
 * not fit, BN_ERR_INVALID_ARGUMENT for kv_len beyond the training context. */
bn_status bn_cuda_backend_create(const bn_checkpoint *model, const bn_cuda_backend_options *opt,
                                 bn_cuda_backend **out, bn_error *err);
void bn_cuda_backend_free(bn_cuda_backend *b);

/* Runs n_tokens tokens at positions pos .. pos + n_tokens - 1 and writes the
 * last token's vocab logits to host memory. The same rules as the CPU
 * backend: positions before pos must have been computed (pos may go back),
 * pos + n_tokens must fit the KV cache, tokens must be in the vocabulary;
 * on failure the positions from pos on are forgotten. */
bn_status bn_cuda_backend_forward(bn_cuda_backend *b, const int32_t *tokens, int64_t n_tokens,
                                  int64_t pos, float *logits, bn_error *err);

/* The same pass, then the argmax of the logits on the device (lowest index
 * on ties, NaN never chosen: the CPU sampler's greedy rule); only the token
 * comes back. */
bn_status bn_cuda_backend_forward_greedy(bn_cuda_backend *b, const int32_t *tokens,
                                         int64_t n_tokens, int64_t pos, int32_t *next,
                                         bn_error *err);

/* The same pass, then the next token chosen on the device by the sampler
 * of sample_cuda.h: greedy when p is NULL or p->temperature <= 0 (as
 * forward_greedy), else top-k, temperature, top-p and min-p with the
 * uniform number u in [0, 1), which the caller draws from its own stream
 * (bn_sampler_next_uniform: the token is then the CPU sampler's on the same
 * logits). Only the token comes back: no logits cross to the host. A
 * sampling request the device cannot serve (bn_cuda_backend_sample_supported)
 * is BN_ERR_INVALID_ARGUMENT. */
bn_status bn_cuda_backend_forward_sample(bn_cuda_backend *b, const int32_t *tokens,
                                         int64_t n_tokens, int64_t pos,
                                         const bn_cuda_sample_params *p, double u, int32_t *next,
                                         bn_error *err);
/* Whether the device can choose tokens by p: greedy always; sampling with a
 * top-k of 1 to BN_CUDA_SAMPLE_MAX_K, or any top-k for a vocabulary that
 * small. (The repetition penalty is the caller's: it changes the logits.) */
bool bn_cuda_backend_sample_supported(const bn_cuda_backend *b, const bn_cuda_sample_params *p);

/* One decode step in two halves, so the caller can work while the GPU
 * computes: submit queues the step for `token` at `pos` and returns; wait
 * blocks until the oldest submitted step's token is known (greedy, or
 * chosen by p with u as in forward_sample) and takes it. Exactly one wait
 * per submitted step, in order. */
bn_status bn_cuda_backend_submit_greedy(bn_cuda_backend *b, int32_t token, int64_t pos,
                                        bn_error *err);
bn_status bn_cuda_backend_submit_sample(bn_cuda_backend *b, int32_t token, int64_t pos,
                                        const bn_cuda_sample_params *p, double u, bn_error *err);
/* A chained step: queues the decode step after the one submitted step not
 * yet waited for (exactly one), at the next position, whose token is the
 * one that step picks, read on the device: the host need not know it, so
 * the GPU goes from one step to the next without waiting for the host
 * (that step's last kernel writes the token, position and length this one
 * reads). p and u choose this step's token, as for submit_sample. The
 * caller waits for the older step first, then for this one; when the older
 * token ends the generation, drop_pending discards this step. Errors: a
 * request the device cannot serve (BN_ERR_INVALID_ARGUMENT, no pending step
 * or two, a position past the cache, p or u refused) leaves the pending
 * step as it was; a device failure drains both steps and forgets the older
 * one's position on (nothing is left pending), as a failed step does. */
bn_status bn_cuda_backend_submit_chained(bn_cuda_backend *b, const bn_cuda_sample_params *p,
                                         double u, bn_error *err);
bn_status bn_cuda_backend_wait_greedy(bn_cuda_backend *b, int32_t *next, bn_error *err);
/* Submitted steps not yet waited for (0 to 2). */
int bn_cuda_backend_pending(const bn_cuda_backend *b);
/* Lets every submitted step finish and discards them: their positions are
 * forgotten (kv_filled goes back to the oldest one's position at most),
 * their tokens never read. An error a step met is returned (the steps are
 * discarded either way). */
bn_status bn_cuda_backend_drop_pending(bn_cuda_backend *b, bn_error *err);

int64_t bn_cuda_backend_kv_len(const bn_cuda_backend *b);
int64_t bn_cuda_backend_kv_filled(const bn_cuda_backend *b);
/* The most rows one prefill pass takes (longer prompts run in chunks). */
int64_t bn_cuda_backend_prefill_chunk(const bn_cuda_backend *b);
void bn_cuda_backend_reset(bn_cuda_backend *b);

void bn_cuda_backend_memory(const bn_cuda_backend *b, bn_cuda_memory *out);

/* Rows of many sequences in one pass over the paged cache (batch_rows.h
 * says what the rows hold; block_size must be the backend's paged_block);
 * the logits of the logit rows go to logits, vocab floats each.
 * BN_ERR_UNSUPPORTED without a paged cache. Rows of one sequence give what
 * that sequence's own passes give, up to fp32 summation order. */
bn_status bn_cuda_backend_forward_rows(bn_cuda_backend *b, const bn_batch_rows *rows,
                                       float *logits, bn_error *err);
/* The same with each logit row's token picked on the device instead of its
 * logits coming back: row k of rows->logit_rows by p[k] (NULL: every row
 * greedy) with the uniform number u[k] (may be NULL when every row is
 * greedy), its token into next[k] (-1 when no token can be chosen: every
 * logit NaN or -inf). Each p[k] must pass bn_cuda_backend_sample_supported. */
bn_status bn_cuda_backend_forward_rows_pick(bn_cuda_backend *b, const bn_batch_rows *rows,
                                            const bn_cuda_sample_params *p, const double *u,
                                            int32_t *next, bn_error *err);
/* Whether the backend has a paged cache (forward_rows). */
bool bn_cuda_backend_batches(const bn_cuda_backend *b);
/* "cuda:0" and the device's name ("NVIDIA H200"). */
int bn_cuda_backend_device(const bn_cuda_backend *b);
const char *bn_cuda_backend_device_name(const bn_cuda_backend *b);
bn_cuda_kv_type bn_cuda_backend_kv_type(const bn_cuda_backend *b);

/* Whether decode steps replay the captured graph (false when capture failed
 * or was turned off); set_graphs(false) switches to eager launches, true
 * back to the graph when one was captured. */
bool bn_cuda_backend_graphs(const bn_cuda_backend *b);
/* Whether sampled decode steps (forward_sample / submit_sample of one token
 * with a temperature) replay a graph whose last kernel draws the token:
 * the sampler's parameters ride in the step's upload, so no launch follows
 * the replay. Otherwise the sampler is launched after the step. */
bool bn_cuda_backend_sample_graph(const bn_cuda_backend *b);
/* The decode step's form (cuda_decode_form.h), chosen at creation for this
 * device and model. */
void bn_cuda_backend_decode_form(const bn_cuda_backend *b, bn_cuda_decode_form *out);
/* The stages (bit mask, 1 << bn_cuda_stage) of the decode graph whose kernels
 * run in thread-block clusters of more than 8 blocks, which the driver
 * refuses to disable (time_decode_without). */
unsigned bn_cuda_backend_fixed_stages(const bn_cuda_backend *b);
void bn_cuda_backend_set_graphs(bn_cuda_backend *b, bool on);

/* The kernels that have run so far, comma-separated ("embed_rows,
 * norm_quantize,w2a8_gemv,..."), into buf. */
void bn_cuda_backend_kernels(const bn_cuda_backend *b, char *buf, size_t size);

/* What the backend has asked of the GPU since it was created (its context's
 * statistics, cuda_context.h): kernel launches (a graph replay counts the
 * kernels it runs) and host-device copies with their bytes, the uploads at
 * creation included. */
typedef struct bn_cuda_work {
    uint64_t kernel_launches;
    uint64_t h2d_transfers, h2d_bytes;
    uint64_t d2h_transfers, d2h_bytes;
} bn_cuda_work;
void bn_cuda_backend_work(const bn_cuda_backend *b, bn_cuda_work *out);

/* Tests: forward call number `call` (1-based, counting every forward,
 * forward_greedy / forward_sample and submit_greedy / submit_sample) fails
 * with BN_ERR_GPU before doing anything, as a failed kernel would. 0 turns
 * it off. */
void bn_cuda_backend_fail_at(bn_cuda_backend *b, int64_t call);
/* Tests: create() on a device and model that offer less than these
 * (cuda_decode_form.h, bn_cuda_as_if): the decode step takes the form the
 * table gives for that, the one such a device or model runs. */
bn_status bn_cuda_backend_create_as(const bn_checkpoint *model, const bn_cuda_backend_options *opt,
                                    const bn_cuda_as_if *as_if, bn_cuda_backend **out,
                                    bn_error *err);

/* ---- measurement (bitnet bench e2e) -------------------------------------------- */

/* How many rows of the LM head the last greedy step computed in full: with
 * a screened head, the rows that could be the argmax (their logits are
 * the ones left above -inf); else every row. */
bn_status bn_cuda_backend_head_kept(bn_cuda_backend *b, int64_t *kept, bn_error *err);

/* The stages of a pass, as profiles and the stage-cost timing name them. A
 * stage whose work runs inside another's kernel launches nothing (the fp32
 * cache's scale + RoPE + KV store inside the attention; the q|k|v product
 * inside it where the attention computes it; the embedding inside the first
 * norm where that reads the table itself). */
typedef enum bn_cuda_stage {
    BN_CUDA_STAGE_EMBED,
    BN_CUDA_STAGE_ATTN_NORM, /* residual + attn_norm + int8 (layer 0: norm + int8)  */
    BN_CUDA_STAGE_QKV,       /* q|k|v GEMV                                         */
    BN_CUDA_STAGE_ROPE_KV,   /* scales, RoPE, KV store (fp16 cache; with the fp32
                                cache they run inside the attention kernel)        */
    BN_CUDA_STAGE_ATTENTION, /* attention (fp32 cache: with scales, RoPE, KV store) */
    BN_CUDA_STAGE_SUB_NORM,  /* attn_sub_norm + int8                               */
    BN_CUDA_STAGE_O,         /* Wo GEMV                                            */
    BN_CUDA_STAGE_FFN_NORM,  /* residual + ffn_norm + int8                         */
    BN_CUDA_STAGE_GATE_UP,   /* gate|up GEMV (in pairs: with relu^2 * up)          */
    BN_CUDA_STAGE_RELU2,     /* relu^2 * up + ffn_sub_norm + int8                  */
    BN_CUDA_STAGE_DOWN,      /* down GEMV                                          */
    BN_CUDA_STAGE_OUT_NORM,  /* residual + output_norm                             */
    BN_CUDA_STAGE_LM_HEAD,
    BN_CUDA_STAGE_ARGMAX,
    BN_CUDA_STAGE_COUNT
} bn_cuda_stage;

const char *bn_cuda_stage_name(bn_cuda_stage s);

typedef struct bn_cuda_stage_times {
    double ms[BN_CUDA_STAGE_COUNT]; /* per step, summed over layers           */
    int launches[BN_CUDA_STAGE_COUNT]; /* kernel launches per step            */
    double total_ms;                /* the instrumented step, first to last   */
} bn_cuda_stage_times;

/* Times `reps` eager decode steps of `token` at `pos` (pos <= kv_filled,
 * pos < kv_len; it writes the KV cache at pos) with CUDA events around each
 * stage, averaged per step. Events add small gaps, so total_ms is a little
 * above a graph replay's time; the split is what it is for. */
bn_status bn_cuda_backend_profile_decode(bn_cuda_backend *b, int32_t token, int64_t pos,
                                         int reps, bn_cuda_stage_times *out, bn_error *err);

/* The same for one prefill chunk: n tokens (2 to the backend's chunk) at
 * positions pos.. (pos <= the positions computed; it writes the KV cache
 * there and forgets the positions after), eagerly, reps times, as a greedy
 * pass (the screened head where greedy steps use it, and the argmax); out
 * holds the stages' times per chunk (the GEMMs under the GEMV stages'
 * names). */
bn_status bn_cuda_backend_profile_prefill(bn_cuda_backend *b, const int32_t *tokens, int64_t n,
                                          int64_t pos, int reps, bn_cuda_stage_times *out,
                                          bn_error *err);
/* Stage times of one batched pass (bn_cuda_backend_forward_rows_pick,
 * every row greedy) with CUDA events around each stage, averaged over reps
 * passes; the same rows are computed each time. */
bn_status bn_cuda_backend_profile_rows(bn_cuda_backend *b, const bn_batch_rows *rows, int reps,
                                       bn_cuda_stage_times *out, bn_error *err);

/* Wall time per greedy decode step (the way generation runs it: upload,
 * graph replay or eager launches, argmax, token download, wait), averaged
 * over reps steps of `token` at `pos`. */
bn_status bn_cuda_backend_time_decode(bn_cuda_backend *b, int32_t token, int64_t pos, int reps,
                                      double *us_per_step, bn_error *err);
/* The same with the token chosen by p and u (forward_sample's rules): a
 * sampled step as generation runs it. */
bn_status bn_cuda_backend_time_decode_sample(bn_cuda_backend *b, int32_t token, int64_t pos,
                                             int reps, const bn_cuda_sample_params *p, double u,
                                             double *us_per_step, bn_error *err);
/* Wall time per step of chained decode steps (submit_chained), as
 * generation runs them: the step for `token` at pos submitted, then each
 * later step chained onto the one before while the host waits for that
 * one's token, reps steps timed after two more. The tokens are the ones the
 * steps pick (chosen by p and u; NULL p: greedy), at positions pos,
 * pos + 1, ...: pos + reps + 3 must fit the KV cache. The positions are
 * left computed up to the last step waited for. */
bn_status bn_cuda_backend_time_decode_chained(bn_cuda_backend *b, int32_t token, int64_t pos,
                                              int reps, const bn_cuda_sample_params *p,
                                              double u, double *us_per_step, bn_error *err);

/* Device time per greedy decode step: the decode graph and its argmax
 * queued reps times back to back (the inputs of `token` at `pos` uploaded
 * once) between two CUDA events, so no host round trip falls between the
 * steps. time_decode's wall time minus this is what a step spends outside
 * the GPU's queue (the wait, the token's copies, the next launch).
 * BN_ERR_UNSUPPORTED without a captured graph in use. */
bn_status bn_cuda_backend_time_decode_device(bn_cuda_backend *b, int32_t token, int64_t pos,
                                             int reps, double *us_per_step, bn_error *err);
/* Which part of a step time_decode_device_sample queues each time. */
typedef enum {
    BN_CUDA_TIME_STEP,  /* the step as decoding runs it (a sampled one in its
                           own graph, bn_cuda_backend_sample_graph), token copy
                           included */
    BN_CUDA_TIME_PASS,  /* the greedy step's graph alone (its head screened
                           for the top k)                                  */
    BN_CUDA_TIME_CHOICE /* the choice alone, over the last pass's output (a
                           sampled one launched by itself)                 */
} bn_cuda_time_part;
/* time_decode_device with the token chosen by p and u (NULL p: greedy),
 * or only one part of that step: the split of a sampled step's device
 * time. */
bn_status bn_cuda_backend_time_decode_device_sample(bn_cuda_backend *b, int32_t token,
                                                    int64_t pos, int reps,
                                                    const bn_cuda_sample_params *p, double u,
                                                    bn_cuda_time_part part, double *us_per_step,
                                                    bn_error *err);

/* What each stage costs the graph-replayed step: the same timing as
 * time_decode with the decode graph's kernels of the stages in the bit mask
 * `stages` (1 << bn_cuda_stage) disabled (empty nodes; the rest of the
 * chain unchanged). The step's results are meaningless while they are off,
 * and the KV cache at `pos` is left with them: run a normal step at `pos`
 * afterwards. *disabled: the kernel nodes turned off. BN_ERR_UNSUPPORTED
 * without a captured graph whose kernels could be matched to stages, and
 * where the driver refuses to disable a node launched in thread-block
 * clusters of more than 8 blocks (cudaErrorInvalidClusterSize: the fp32
 * decode attention or the gate|up GEMV in clusters of 16, the stages of
 * bn_cuda_backend_fixed_stages; every node is left enabled). */
bn_status bn_cuda_backend_time_decode_without(bn_cuda_backend *b, unsigned stages, int32_t token,
                                              int64_t pos, int reps, double *us_per_step,
                                              int *disabled, bn_error *err);

/* One greedy decode step of `token` at `pos` (graph replay when in use)
 * with every traced kernel's blocks noting when they ran and when their
 * inputs were ready (pdl.cuh), written to `path` as CSV; *records: the
 * blocks noted. BN_ERR_UNSUPPORTED unless built with
 * -DBITNET_DECODE_TRACE=ON. scripts/decode_trace.py reads the file. */
bn_status bn_cuda_backend_trace_decode(bn_cuda_backend *b, int32_t token, int64_t pos,
                                       const char *path, int *records, bn_error *err);

/* Device-to-device copy bandwidth in GB/s (bytes read + bytes written per
 * second), measured with a `bytes` copy (halved until it fits). */
bn_status bn_cuda_backend_copy_bandwidth(bn_cuda_backend *b, uint64_t bytes, double *gbs,
                                         bn_error *err);

/* Bytes one greedy decode step must move at a context of `positions`: every
 * packed projection, the LM head (a screened head: its int8 copy, 8 bytes a
 * row of scale and bound, the rows' upper ends written and read back), one
 * embedding row, the norms and the KV cache read by attention. */
uint64_t bn_cuda_backend_bytes_per_token(const bn_cuda_backend *b, int64_t positions);

#ifdef __cplusplus
}
#endif

#endif
