/*
 * engine_internal.h - what engine.c (selection, loading, fallback) and
 * engine_generate.c (generation) share: the engine's state and the CPU's
 * taking over after a failed CUDA step.
 */
#ifndef BN_ENGINE_INTERNAL_H
#define BN_ENGINE_INTERNAL_H

#include "cpu_backend.h"
#include "engine.h"
#if defined(BITNET_HAVE_CUDA)
#include "cuda_backend.h"
#endif

struct bn_engine {
    bn_checkpoint *model;
    bn_cpu_backend *cpu;      /* exactly one of cpu and cuda computes */
#if defined(BITNET_HAVE_CUDA)
    bn_cuda_backend *cuda;
#endif
    float *logits;            /* vocab floats, reused every step */
    char model_path[1024];
    char requested[32];
    const char *requested_from;
    char detected[256];
    char selected[32];
    char kernel[32];
    char fallback[BN_ERROR_MESSAGE_MAX + 64];
    char startup[512];
    char cuda_kernels[512];   /* what ran on the GPU before a fallback */
    int threads;
    int threads_req;          /* for a CPU backend built after a fallback */
    int64_t n_ctx;            /* KV positions of the backend computing */
    double load_seconds;
    /* Selection. */
    bool want_cuda;           /* try the CUDA backend                      */
    int cuda_index;           /* -1: the best device                       */
    bool auto_request;        /* requested auto (a fallback is possible)    */
    bool strict;              /* BITNET_STRICT_MODE: a fallback is an error */
    bool host_picks;          /* bn_engine_options host_picks */
    bool no_chain;            /* bn_engine_options no_chain */
};

#if defined(BITNET_HAVE_CUDA)
/* A CUDA step failed at a point where positions [0, n_positions) of
 * history were being computed: when the CPU may take over (auto, not
 * strict), builds it and recomputes those positions there, leaving the
 * logits of the last one in e->logits; otherwise the error. */
bn_status engine_cuda_step_failed(bn_engine *e, const bn_error *cerr, const int32_t *history,
                                  int64_t n_positions, bn_error *err);
#endif

#endif
