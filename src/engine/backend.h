/*
 * backend.h - the Level-2 backend interface: what the engine asks of a
 * backend that runs whole forward passes of a model (the CPU's in src/cpu,
 * CUDA's in src/cuda). The engine calls nothing else; a new backend is one
 * folder that fills in a bn_backend_ops and one line in backend_registry.c.
 *
 * Every backend implements the required operations: create, free, forward
 * (logits of the last token), the KV cache's length, fill and reset, and
 * reports. The optional ones (NULL where a backend has none) let a device
 * keep the host out of the decode loop:
 *
 *   - pick_supported / forward_pick: the next token chosen on the device,
 *     with the CPU sampler's rules given its uniform number, so only the
 *     token crosses to the host;
 *   - submit / submit_chained / wait / pending / drop_pending: a decode step
 *     queued while the host streams the previous token's text, and the step
 *     after it chained on the device (it reads the token its predecessor
 *     picked), so the device runs from step to step;
 *   - forward_rows: rows of many sequences in one pass over a paged KV
 *     cache of params.paged_rows rows (the batching scheduler,
 *     scheduler.h).
 *
 * Thread safety: one backend is used by one thread at a time (the engine's).
 */
#ifndef BN_BACKEND_H
#define BN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch_rows.h"
#include "bitnet.h"
#include "model.h"

struct bn_engine_info;
struct bn_engine_options;

typedef struct bn_backend bn_backend;
typedef struct bn_backend_ops bn_backend_ops;

/* What every backend is created with. */
typedef struct bn_backend_params {
    int device;            /* device ordinal; -1: the best device (GPU backends) */
    int64_t kv_len;        /* KV positions; 0: the model's training context      */
    int threads;           /* host threads; 0: BITNET_NUM_THREADS or every core  */
    uint64_t memory_limit; /* device bytes the backend may hold; 0: no limit     */
    bn_kv_precision kv;    /* the KV cache's, where the backend has it (f32 else) */
    /* Rows of a paged cache for many sequences at once (forward_rows); 0:
     * none. A backend without forward_rows ignores it. */
    int64_t paged_rows;
    int paged_block, paged_max_seqs; /* its block size and sequences at once   */
    /* Tensor parallelism (the CUDA team's create): tp_size GPUs, tp_devices. */
    int tp_size;
    int tp_devices[BN_DEVICE_LIST_MAX];
    /* The engine's options, for settings only one backend reads. */
    const struct bn_engine_options *engine;
} bn_backend_params;

/* A token picked on the device: the CPU sampler's parameters minus the
 * repetition penalty (which needs the history on the host). */
typedef struct bn_pick_params {
    float temperature; /* <= 0: greedy (argmax, lowest index on ties)     */
    int top_k;
    float top_p;       /* >= 1: off                                       */
    float min_p;       /* <= 0: off                                       */
} bn_pick_params;

/* How a backend names itself. */
typedef struct bn_backend_desc {
    char selected[32];  /* "cpu", "cuda:0"                                  */
    char kernel[32];    /* the CPU kernel provider ("avx512"), or "cuda"    */
    int threads;        /* host threads computing; 0 on a device            */
    char details[384];  /* the startup line's parenthesis: "avx512, 2
                           threads", "NVIDIA H200, graphs, kv f32, ..."     */
    bool batches;       /* it has a paged cache: forward_rows runs          */
} bn_backend_desc;

struct bn_backend_ops {
    const char *name; /* "cpu", "cuda", "vulkan": the device request's name */

    /* Optional (NULL: the family's detection decides): the device `auto`
     * would take, or -1 when there is none worth taking (a Vulkan driver
     * that computes on the CPU is slower than the CPU backend). */
    int (*auto_device)(void);

    /* Builds the backend for `model` (which outlives it). */
    bn_status (*create)(const bn_checkpoint *model, const bn_backend_params *p, bn_backend **out,
                        bn_error *err);
    void (*free)(bn_backend *b);

    /* Runs n tokens at positions pos .. pos + n - 1 and writes the last
     * token's vocab logits. Positions before pos must have been computed
     * (pos may go back to rewind); on failure the positions from pos on are
     * forgotten. A request error (a token outside the vocabulary, positions
     * past the cache) is BN_ERR_INVALID_ARGUMENT; any other error is the
     * device's, after which the engine may move to the CPU. */
    bn_status (*forward)(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                         float *logits, bn_error *err);
    /* Every token's logits (n * vocab floats); NULL: the engine runs one
     * forward per token. */
    bn_status (*forward_all)(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                             float *logits, bn_error *err);

    int64_t (*kv_len)(const bn_backend *b);
    int64_t (*kv_filled)(const bn_backend *b);
    void (*reset)(bn_backend *b);

    /* What the engine names it by: the startup line and the receipt. */
    void (*describe)(const bn_backend *b, bn_backend_desc *d);
    /* Fills the backend's part of the engine's report: memory, the kernels
     * that ran, and for a GPU the device, its memory and work. */
    void (*report)(const bn_backend *b, struct bn_engine_info *info);

    /* ---- optional: tokens picked on the device ---- */
    bool (*pick_supported)(const bn_backend *b, const bn_pick_params *p);
    /* forward, then the next token picked by p with the uniform number u
     * (greedy: u unused); only the token comes back. */
    bn_status (*forward_pick)(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                              const bn_pick_params *p, double u, int32_t *next, bn_error *err);
    /* One decode step queued for `token` at pos, its token picked as by
     * forward_pick; wait takes the oldest queued step's token (one wait per
     * step, in order). */
    bn_status (*submit)(bn_backend *b, int32_t token, int64_t pos, const bn_pick_params *p,
                        double u, bn_error *err);
    /* The step after the one queued and not yet waited for, reading the
     * token that one picks on the device. A device failure drains both and
     * leaves nothing queued. */
    bn_status (*submit_chained)(bn_backend *b, const bn_pick_params *p, double u, bn_error *err);
    bn_status (*wait)(bn_backend *b, int32_t *next, bn_error *err);
    int (*pending)(const bn_backend *b);
    /* Lets the queued steps finish and forgets their positions. */
    void (*drop_pending)(bn_backend *b);

    /* ---- optional: many sequences per pass (the paged cache) ---- */
    bn_status (*forward_rows)(bn_backend *b, const bn_batch_rows *rows, float *logits,
                              bn_error *err);
    /* forward_rows with the logit rows' tokens picked on the device: row k
     * by picks[k] (each one pick_supported takes) with the uniform number
     * u[k] (greedy: unused); next[k] gets the token, -1 when none can be
     * chosen (every logit NaN or -inf). Only the tokens come back. */
    bn_status (*forward_rows_pick)(bn_backend *b, const bn_batch_rows *rows,
                                   const bn_pick_params *picks, const double *u, int32_t *next,
                                   bn_error *err);
};

/* The common head of every backend's state: the engine reaches the
 * operations through it. */
struct bn_backend {
    const bn_backend_ops *ops;
    void *impl; /* the backend's own handle (bn_cpu_backend, bn_cuda_backend),
                   for its measurement tools (bitnet bench)                 */
};

/* ---- the registry (backend_registry.c) ---------------------------------------- */

/* A backend the build has, in the order auto tries them (GPUs first, the
 * CPU last). gpu_kind: which GPU family's detection says whether it can
 * run (bn_gpu_detect), or -1 for the CPU, which always can. */
typedef struct bn_backend_entry {
    const bn_backend_ops *ops;
    int gpu_kind; /* a bn_gpu_backend, or -1 */
} bn_backend_entry;

/* The registered backends (the CPU's is always the last). */
int bn_backend_registry(const bn_backend_entry **entries);
/* The registered backend of GPU family `gpu_kind`, or NULL. */
const bn_backend_entry *bn_backend_for_gpu(int gpu_kind);
/* The CPU backend's operations. */
const bn_backend_ops *bn_backend_cpu_ops(void);
/* The CUDA team that splits a model across GPUs (cuda_tp.h), or NULL in a
 * build without CUDA. */
const bn_backend_ops *bn_backend_tensor_parallel_ops(void);

#endif
