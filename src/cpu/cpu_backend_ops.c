/*
 * cpu_backend_ops.c - the CPU backend (cpu_backend.h) behind the engine's
 * backend interface (src/engine/backend.h). The host's sampler picks
 * sampled token; greedy ones the backend picks itself, through its
 * screened LM head (pick_supported, forward_pick, forward_rows_pick). Of
 * the other optional operations the CPU has forward_rows, many sequences
 * per pass over its paged cache.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_backend.h"
#include "engine.h"

extern const bn_backend_ops bn_cpu_backend_ops;

static bn_cpu_backend *cpu_of(const bn_backend *b)
{
    return b->impl;
}

static bn_status cpu_create(const bn_checkpoint *model, const bn_backend_params *p,
                            bn_backend **out, bn_error *err)
{
    *out = NULL;
    bn_backend *b = calloc(1, sizeof *b);
    if (!b)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the CPU backend");
    bn_cpu_backend *cpu = NULL;
    bn_status st = bn_cpu_backend_create_paged(model, p->kv_len, p->paged_rows, p->threads, &cpu,
                                               err);
    if (st != BN_OK) {
        free(b);
        return st;
    }
    b->ops = &bn_cpu_backend_ops;
    b->impl = cpu;
    *out = b;
    return BN_OK;
}

static void cpu_free(bn_backend *b)
{
    if (!b)
        return;
    bn_cpu_backend_free(cpu_of(b));
    free(b);
}

static bn_status cpu_forward(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                             float *logits, bn_error *err)
{
    return bn_cpu_backend_forward(cpu_of(b), tokens, n, pos, BN_LOGITS_LAST, logits, err);
}

static bn_status cpu_forward_all(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                                 float *logits, bn_error *err)
{
    return bn_cpu_backend_forward(cpu_of(b), tokens, n, pos, BN_LOGITS_ALL, logits, err);
}

static bn_status cpu_forward_rows(bn_backend *b, const bn_batch_rows *rows, float *logits,
                                  bn_error *err)
{
    return bn_cpu_backend_forward_rows(cpu_of(b), rows, logits, err);
}

/* Greedy picks only: a sampled pick needs every logit, on the host. */
static bool cpu_pick_supported(const bn_backend *b, const bn_pick_params *p)
{
    (void)b;
    return !(p->temperature > 0.0f);
}

static bn_status not_greedy(bn_error *err)
{
    return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                        "the CPU backend picks greedy tokens only (temperature <= 0)");
}

static bn_status cpu_forward_pick(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                                  const bn_pick_params *p, double u, int32_t *next,
                                  bn_error *err)
{
    (void)u;
    if (!cpu_pick_supported(b, p))
        return not_greedy(err);
    return bn_cpu_backend_forward_greedy(cpu_of(b), tokens, n, pos, next, err);
}

static bn_status cpu_forward_rows_pick(bn_backend *b, const bn_batch_rows *rows,
                                       const bn_pick_params *picks, const double *u,
                                       int32_t *next, bn_error *err)
{
    (void)u;
    for (int64_t k = 0; k < rows->n_logits; k++)
        if (!cpu_pick_supported(b, &picks[k]))
            return not_greedy(err);
    return bn_cpu_backend_forward_rows_greedy(cpu_of(b), rows, next, err);
}

static int64_t cpu_kv_len(const bn_backend *b) { return bn_cpu_backend_kv_len(cpu_of(b)); }
static int64_t cpu_kv_filled(const bn_backend *b) { return bn_cpu_backend_kv_filled(cpu_of(b)); }
static void cpu_reset(bn_backend *b) { bn_cpu_backend_reset(cpu_of(b)); }

static void cpu_describe(const bn_backend *b, bn_backend_desc *d)
{
    const bn_cpu_backend *c = cpu_of(b);
    const int threads = bn_cpu_backend_threads(c);
    snprintf(d->selected, sizeof d->selected, "cpu");
    snprintf(d->kernel, sizeof d->kernel, "%s", bn_cpu_backend_kernel_name(c));
    d->threads = threads;
    snprintf(d->details, sizeof d->details, "%s, %d %s", d->kernel, threads,
             threads == 1 ? "thread" : "threads");
    d->batches = bn_cpu_backend_paged_rows(c) > 0;
}

static void cpu_report(const bn_backend *b, bn_engine_info *info)
{
    bn_cpu_memory mem;
    bn_cpu_backend_memory(cpu_of(b), &mem);
    info->backend_weight_bytes = mem.weights;
    info->backend_kv_bytes = mem.kv_cache;
    info->backend_scratch_bytes = mem.scratch;
    info->backend_total_bytes = mem.total;
    snprintf(info->kernels, sizeof info->kernels, "w2a8_%s",
             bn_cpu_backend_kernel_name(cpu_of(b)));
}

const bn_backend_ops bn_cpu_backend_ops = {
    .name = "cpu",
    .create = cpu_create,
    .free = cpu_free,
    .forward = cpu_forward,
    .forward_all = cpu_forward_all,
    .kv_len = cpu_kv_len,
    .kv_filled = cpu_kv_filled,
    .reset = cpu_reset,
    .describe = cpu_describe,
    .report = cpu_report,
    .pick_supported = cpu_pick_supported,
    .forward_pick = cpu_forward_pick,
    .forward_rows = cpu_forward_rows,
    .forward_rows_pick = cpu_forward_rows_pick,
};
