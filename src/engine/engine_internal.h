/*
 * engine_internal.h - what engine.c (selection, loading, fallback) and
 * engine_generate.c (generation) share: the engine's state and the CPU's
 * taking over after a failed device step.
 */
#ifndef BN_ENGINE_INTERNAL_H
#define BN_ENGINE_INTERNAL_H

#include "backend.h"
#include "engine.h"
#include "kv_blocks.h"
#include "tokenizer.h"

/* A request's sampling as the backend's device pick takes it. */
static inline bn_pick_params engine_pick_params(const bn_sampler_params *sp)
{
    return (bn_pick_params){.temperature = sp->temperature,
                            .top_k = sp->top_k,
                            .top_p = sp->top_p,
                            .min_p = sp->min_p};
}

struct bn_engine {
    bn_checkpoint *model;
    bn_backend *backend;      /* the backend computing (backend.h)       */
    bn_backend_params params; /* what it was built with                  */
    float *logits;            /* vocab floats, reused every step */
    char model_path[1024];
    char requested[96];
    const char *requested_from;
    char detected[256];
    char selected[64];        /* "cuda:0"; with replicas "cuda:0,1" */
    char kernel[32];
    char fallback[BN_ERROR_MESSAGE_MAX + 64];
    char startup[1024];
    char earlier_kernels[512]; /* what ran on the device before a fallback */
    int threads;
    int64_t n_ctx;            /* KV positions of the backend computing */
    double load_seconds;
    /* Selection. */
    const bn_backend_entry *gpu_entry; /* the GPU backend to try, or NULL  */
    int gpu_index;            /* -1: the best device                       */
    /* cuda:N,M,... / cuda:all: the devices, one replica each (the first is
     * gpu_index, this engine); n_devices 0 or 1 for one device. */
    int devices[BN_DEVICE_LIST_MAX];
    int n_devices;
    int gpu_count;            /* CUDA devices detection found              */
    /* Tensor parallelism: the model split across this many CUDA GPUs
     * (params.tp_devices) by one backend; 0: none. */
    int tensor_parallel;
    /* The replicas on devices[1 ..]: engines of the same model (borrowed,
     * not owned: model_borrowed) with their own backend and paged cache,
     * opened only where this engine batches; the batcher spreads the
     * sequences over this engine and them (scheduler.c). */
    struct bn_engine **replicas;
    int n_replicas;
    bool model_borrowed;
    bool auto_request;        /* requested auto (a fallback is possible)    */
    bool strict;              /* BITNET_STRICT_MODE: a fallback is an error */
    /* Many sequences at once (scheduler.c): NULL when the backend does
     * not batch. */
    bn_kv_blocks *kv;
    bn_kv_blocks_config kv_cfg;
    int token_budget;
    uint64_t batch_steps, batch_rows, preemptions;
    uint64_t decode_passes, decode_rows; /* passes of decode rows only */
    double decode_seconds;
    /* Every pass's forward, and the handing out of its tokens after it
     * (sampling on the host, the streams' callbacks). */
    double forward_seconds, token_seconds;
};

/* A growing byte buffer for the generated text (NUL-terminated). */
typedef struct engine_text {
    char *data;
    size_t len, cap;
} engine_text;
bool engine_text_append(engine_text *b, const char *s, size_t n);

/* Streams a sequence's tokens as text in whole UTF-8 characters to
 * on_token and into text. */
typedef struct engine_streamer {
    bn_detok_stream ds;
    char *buf;              /* malloc'ed, cap bytes */
    size_t cap;
    bn_engine_token_fn on_token;
    void *ctx;
    engine_text *text;
    bool stop;              /* on_token returned false */
} engine_streamer;
/* Token id's text (flush: the bytes left at the end, id ignored). */
bn_status engine_stream_token(engine_streamer *s, int32_t id, bool flush, bn_error *err);

/* Reports a generated token's log-probability and its position's n_top
 * most likely tokens to cb (logprobs.c), from raw: the position's logits
 * as the model gave them (a copy taken before the sampler ran). */
void engine_logprobs_report(const float *raw, int32_t vocab, int32_t chosen, int n_top,
                            bn_logprob_callback cb, void *ctx);

/* A device step failed at a point where positions [0, n_positions) of
 * history were being computed: when the CPU may take over (auto, not
 * strict), builds it and recomputes those positions there, leaving the
 * logits of the last one in e->logits; otherwise the error. */
bn_status engine_step_failed(bn_engine *e, const bn_error *cerr, const int32_t *history,
                             int64_t n_positions, bn_error *err);

#endif
