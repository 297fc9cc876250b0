/*
 * cuda_backend_ops.c - the CUDA backend (cuda_backend.h) behind the
 * engine's backend interface (src/engine/backend.h), with every optional
 * operation: tokens picked on the device, queued and chained decode steps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_backend.h"
#include "cuda_tp.h"
#include "engine.h"

extern const bn_backend_ops bn_cuda_backend_ops;
extern const bn_backend_ops bn_cuda_tp_backend_ops;

static bn_cuda_backend *cuda_of(const bn_backend *b)
{
    return b->impl;
}

static bn_cuda_sample_params sample_params(const bn_pick_params *p)
{
    if (!p)
        return (bn_cuda_sample_params){.temperature = 0.0f, .top_p = 1.0f};
    return (bn_cuda_sample_params){
        .temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p, .min_p = p->min_p};
}

/* The backend's cache type for the API's precision. */
static bn_cuda_kv_type cuda_kv_type(bn_kv_precision kv)
{
    return kv == BN_KV_FP8 ? BN_CUDA_KV_E4M3 : kv == BN_KV_F16 ? BN_CUDA_KV_F16 : BN_CUDA_KV_F32;
}

/* Its name in receipts and descriptions (the CLI's --kv values). */
static const char *kv_type_name(bn_cuda_kv_type kv)
{
    return kv == BN_CUDA_KV_E4M3 ? "fp8" : kv == BN_CUDA_KV_F16 ? "f16" : "f32";
}

static bn_status cuda_create(const bn_checkpoint *model, const bn_backend_params *p,
                             bn_backend **out, bn_error *err)
{
    *out = NULL;
    bn_cuda_backend_options o;
    bn_cuda_backend_options_default(&o);
    o.device = p->device;
    o.kv_len = p->kv_len;
    o.memory_limit = p->memory_limit;
    o.kv_type = cuda_kv_type(p->kv);
    o.threads = p->threads;
    o.paged_rows = p->paged_rows;
    o.paged_block = p->paged_block;
    o.paged_max_seqs = p->paged_max_seqs;
    const bn_engine_options *eo = p->engine;
    bn_backend *b = calloc(1, sizeof *b);
    if (!b)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the CUDA backend");
    bn_cuda_backend *cuda = NULL;
    bn_status st = bn_cuda_backend_create(model, &o, &cuda, err);
    if (st != BN_OK) {
        free(b);
        return st;
    }
    if (eo)
        bn_cuda_backend_fail_at(cuda, eo->test_cuda_fail_call);
    b->ops = &bn_cuda_backend_ops;
    b->impl = cuda;
    *out = b;
    return BN_OK;
}

static void cuda_free(bn_backend *b)
{
    if (!b)
        return;
    bn_cuda_backend_free(cuda_of(b));
    free(b);
}

static bn_status cuda_forward(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                              float *logits, bn_error *err)
{
    return bn_cuda_backend_forward(cuda_of(b), tokens, n, pos, logits, err);
}

static int64_t cuda_kv_len(const bn_backend *b) { return bn_cuda_backend_kv_len(cuda_of(b)); }
static int64_t cuda_kv_filled(const bn_backend *b)
{
    return bn_cuda_backend_kv_filled(cuda_of(b));
}
static void cuda_reset(bn_backend *b) { bn_cuda_backend_reset(cuda_of(b)); }

static void describe_backend(const bn_cuda_backend *c, bn_backend_desc *d)
{
    snprintf(d->selected, sizeof d->selected, "cuda:%d", bn_cuda_backend_device(c));
    d->batches = bn_cuda_backend_batches(c);
    snprintf(d->kernel, sizeof d->kernel, "cuda");
    d->threads = 0;
    /* The decode step's form (cuda_decode_form.h) in words. */
    const bn_cuda_kv_type kv = bn_cuda_backend_kv_type(c);
    bn_cuda_decode_form form;
    bn_cuda_backend_decode_form(c, &form);
    char decode[192];
    bn_cuda_decode_form_describe(&form, kv != BN_CUDA_KV_F32, decode, sizeof decode);
    snprintf(d->details, sizeof d->details, "%s, %s, kv %s, %s", bn_cuda_backend_device_name(c),
             bn_cuda_backend_graphs(c) ? "graphs" : "no graphs", kv_type_name(kv), decode);
}

static void cuda_describe(const bn_backend *b, bn_backend_desc *d)
{
    describe_backend(cuda_of(b), d);
}

static void report_backend(const bn_cuda_backend *c, bn_engine_info *info)
{
    bn_cuda_memory mem;
    bn_cuda_backend_memory(c, &mem);
    info->gpu = true;
    info->gpu_device = bn_cuda_backend_device(c);
    info->gpu_name = bn_cuda_backend_device_name(c);
    info->cuda_graphs = bn_cuda_backend_graphs(c);
    info->kv_type = kv_type_name(bn_cuda_backend_kv_type(c));
    info->gpu_weights_bytes = mem.weights;
    info->gpu_embedding_bytes = mem.embedding;
    info->gpu_lm_head_bytes = mem.lm_head;
    info->gpu_lm_head_screen_bytes = mem.lm_head_screen;
    info->gpu_norms_bytes = mem.norms;
    info->gpu_kv_bytes = mem.kv_cache;
    info->gpu_scratch_bytes = mem.scratch;
    info->gpu_total_bytes = mem.total;
    info->gpu_peak_bytes = mem.peak;
    info->gpu_device_total_bytes = mem.device_total;
    info->gpu_device_free_bytes = mem.device_free;
    info->gpu_pool_reserved_bytes = mem.pool_reserved;
    info->gpu_pool_peak_reserved_bytes = mem.pool_peak_reserved;
    info->gpu_pool_limit_bytes = mem.pool_limit;
    info->gpu_pool_buffers = mem.pool_buffers;
    info->gpu_pool_allocations = mem.pool_allocations;
    info->gpu_pool_failures = mem.pool_failures;
    bn_cuda_work work;
    bn_cuda_backend_work(c, &work);
    info->gpu_kernel_launches = work.kernel_launches;
    info->gpu_h2d_transfers = work.h2d_transfers;
    info->gpu_h2d_bytes = work.h2d_bytes;
    info->gpu_d2h_transfers = work.d2h_transfers;
    info->gpu_d2h_bytes = work.d2h_bytes;
    /* What the backend computes with: its weights are everything on the
     * device but the KV cache and the scratch. */
    info->backend_weight_bytes =
        mem.weights + mem.embedding + mem.lm_head + mem.lm_head_screen + mem.norms;
    info->backend_kv_bytes = mem.kv_cache;
    info->backend_scratch_bytes = mem.scratch;
    info->backend_total_bytes = mem.total;
    bn_cuda_backend_kernels(c, info->kernels, sizeof info->kernels);
}

static void cuda_report(const bn_backend *b, bn_engine_info *info)
{
    report_backend(cuda_of(b), info);
}

static bool cuda_pick_supported(const bn_backend *b, const bn_pick_params *p)
{
    const bn_cuda_sample_params cp = sample_params(p);
    return bn_cuda_backend_sample_supported(cuda_of(b), &cp);
}

static bn_status cuda_forward_pick(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                                   const bn_pick_params *p, double u, int32_t *next,
                                   bn_error *err)
{
    const bn_cuda_sample_params cp = sample_params(p);
    return bn_cuda_backend_forward_sample(cuda_of(b), tokens, n, pos, &cp, u, next, err);
}

static bn_status cuda_submit(bn_backend *b, int32_t token, int64_t pos, const bn_pick_params *p,
                             double u, bn_error *err)
{
    const bn_cuda_sample_params cp = sample_params(p);
    return bn_cuda_backend_submit_sample(cuda_of(b), token, pos, &cp, u, err);
}

static bn_status cuda_submit_chained(bn_backend *b, const bn_pick_params *p, double u,
                                     bn_error *err)
{
    const bn_cuda_sample_params cp = sample_params(p);
    return bn_cuda_backend_submit_chained(cuda_of(b), &cp, u, err);
}

static bn_status cuda_wait(bn_backend *b, int32_t *next, bn_error *err)
{
    return bn_cuda_backend_wait_greedy(cuda_of(b), next, err);
}

static int cuda_pending(const bn_backend *b) { return bn_cuda_backend_pending(cuda_of(b)); }

static void cuda_drop_pending(bn_backend *b)
{
    (void)bn_cuda_backend_drop_pending(cuda_of(b), NULL);
}

static bn_status cuda_forward_rows(bn_backend *b, const bn_batch_rows *rows, float *logits,
                                   bn_error *err)
{
    return bn_cuda_backend_forward_rows(cuda_of(b), rows, logits, err);
}

static bn_status cuda_forward_rows_pick(bn_backend *b, const bn_batch_rows *rows,
                                        const bn_pick_params *picks, const double *u,
                                        int32_t *next, bn_error *err)
{
    const int64_t n = rows ? rows->n_logits : 0;
    bn_cuda_sample_params *cp = malloc(((size_t)n + 1) * sizeof *cp);
    if (!cp)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a pass's picks");
    for (int64_t k = 0; k < n; k++)
        cp[k] = sample_params(&picks[k]);
    const bn_status st = bn_cuda_backend_forward_rows_pick(cuda_of(b), rows, cp, u, next, err);
    free(cp);
    return st;
}

const bn_backend_ops bn_cuda_backend_ops = {
    .name = "cuda",
    .create = cuda_create,
    .free = cuda_free,
    .forward = cuda_forward,
    .forward_all = NULL, /* the last row's logits only: one pass per token */
    .kv_len = cuda_kv_len,
    .kv_filled = cuda_kv_filled,
    .reset = cuda_reset,
    .describe = cuda_describe,
    .report = cuda_report,
    .pick_supported = cuda_pick_supported,
    .forward_pick = cuda_forward_pick,
    .submit = cuda_submit,
    .submit_chained = cuda_submit_chained,
    .wait = cuda_wait,
    .pending = cuda_pending,
    .drop_pending = cuda_drop_pending,
    .forward_rows = cuda_forward_rows,
    .forward_rows_pick = cuda_forward_rows_pick,
};

/* ---- tensor parallelism (cuda_tp.h) -------------------------------------------- *
 *
 * The team behind the same interface: every operation runs on all ranks at
 * once (bn_cuda_tp_run), and what comes back is rank 0's (every rank
 * computes the same logits and tokens). No paged cache: sequences run one
 * at a time. */

static bn_cuda_tp *team_of(const bn_backend *b) { return b->impl; }

static bn_status tp_create(const bn_checkpoint *model, const bn_backend_params *p,
                           bn_backend **out, bn_error *err)
{
    *out = NULL;
    bn_cuda_backend_options o;
    bn_cuda_backend_options_default(&o);
    o.kv_len = p->kv_len;
    o.memory_limit = p->memory_limit;
    o.kv_type = cuda_kv_type(p->kv);
    o.threads = p->threads;
    bn_backend *b = calloc(1, sizeof *b);
    if (!b)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the CUDA backend");
    bn_cuda_tp *t = NULL;
    const bn_status st = bn_cuda_tp_create(model, p->tp_devices, p->tp_size, &o, &t, err);
    if (st != BN_OK) {
        free(b);
        return st;
    }
    const bn_engine_options *eo = p->engine;
    for (int r = 0; eo && r < bn_cuda_tp_size(t); r++) /* every rank fails alike */
        bn_cuda_backend_fail_at(bn_cuda_tp_rank(t, r), eo->test_cuda_fail_call);
    b->ops = &bn_cuda_tp_backend_ops;
    b->impl = t;
    *out = b;
    return BN_OK;
}

static void tp_free(bn_backend *b)
{
    if (!b)
        return;
    bn_cuda_tp_free(team_of(b));
    free(b);
}

/* Every rank's arguments and rank 0's results. */
typedef struct tp_call {
    const int32_t *tokens;
    int64_t n, pos;
    int32_t token;
    float *logits;
    bn_cuda_sample_params sample;
    double u;
    int32_t next[BN_CUDA_TP_MAX];
    bn_cuda_tp *team;
} tp_call;

static bn_status tp_forward_rank(bn_cuda_backend *c, int rank, void *arg, bn_error *err)
{
    tp_call *a = arg;
    float *logits = rank == 0 ? a->logits : bn_cuda_tp_scratch_logits(a->team, rank);
    return bn_cuda_backend_forward(c, a->tokens, a->n, a->pos, logits, err);
}

static bn_status tp_forward(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                            float *logits, bn_error *err)
{
    tp_call a = {.tokens = tokens, .n = n, .pos = pos, .logits = logits, .team = team_of(b)};
    return bn_cuda_tp_run(team_of(b), tp_forward_rank, &a, err);
}

static int64_t tp_kv_len(const bn_backend *b)
{
    return bn_cuda_backend_kv_len(bn_cuda_tp_rank(team_of(b), 0));
}

static int64_t tp_kv_filled(const bn_backend *b)
{
    return bn_cuda_backend_kv_filled(bn_cuda_tp_rank(team_of(b), 0));
}

static void tp_reset(bn_backend *b)
{
    for (int r = 0; r < bn_cuda_tp_size(team_of(b)); r++)
        bn_cuda_backend_reset(bn_cuda_tp_rank(team_of(b), r));
}

static void tp_describe(const bn_backend *b, bn_backend_desc *d)
{
    const bn_cuda_tp *t = team_of(b);
    describe_backend(bn_cuda_tp_rank(t, 0), d);
    int used = snprintf(d->selected, sizeof d->selected, "cuda:%d", bn_cuda_tp_device(t, 0));
    for (int r = 1; r < bn_cuda_tp_size(t) && used < (int)sizeof d->selected; r++)
        used += snprintf(d->selected + used, sizeof d->selected - (size_t)used, ",%d",
                         bn_cuda_tp_device(t, r));
    char rank0[sizeof d->details];
    snprintf(rank0, sizeof rank0, "%s", d->details);
    snprintf(d->details, sizeof d->details, "tensor parallel over %d GPUs (%s), each %.280s",
             bn_cuda_tp_size(t), bn_cuda_tp_peer_exchange(t) ? "peer memory" : "NCCL", rank0);
    d->batches = false;
}

/* Rank 0's report, with the team's size and every rank's memory. */
static void tp_report(const bn_backend *b, bn_engine_info *info)
{
    const bn_cuda_tp *t = team_of(b);
    report_backend(bn_cuda_tp_rank(t, 0), info);
    info->tensor_parallel = bn_cuda_tp_size(t);
}

static bool tp_pick_supported(const bn_backend *b, const bn_pick_params *p)
{
    const bn_cuda_sample_params cp = sample_params(p);
    return bn_cuda_backend_sample_supported(bn_cuda_tp_rank(team_of(b), 0), &cp);
}

static bn_status tp_pick_rank(bn_cuda_backend *c, int rank, void *arg, bn_error *err)
{
    tp_call *a = arg;
    return bn_cuda_backend_forward_sample(c, a->tokens, a->n, a->pos, &a->sample, a->u,
                                          &a->next[rank], err);
}

static bn_status tp_forward_pick(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                                 const bn_pick_params *p, double u, int32_t *next,
                                 bn_error *err)
{
    tp_call a = {.tokens = tokens, .n = n, .pos = pos, .sample = sample_params(p), .u = u};
    const bn_status st = bn_cuda_tp_run(team_of(b), tp_pick_rank, &a, err);
    if (st == BN_OK)
        *next = a.next[0];
    return st;
}

static bn_status tp_submit_rank(bn_cuda_backend *c, int rank, void *arg, bn_error *err)
{
    (void)rank;
    tp_call *a = arg;
    return bn_cuda_backend_submit_sample(c, a->token, a->pos, &a->sample, a->u, err);
}

static bn_status tp_submit(bn_backend *b, int32_t token, int64_t pos, const bn_pick_params *p,
                           double u, bn_error *err)
{
    tp_call a = {.token = token, .pos = pos, .sample = sample_params(p), .u = u};
    return bn_cuda_tp_run(team_of(b), tp_submit_rank, &a, err);
}

static bn_status tp_chained_rank(bn_cuda_backend *c, int rank, void *arg, bn_error *err)
{
    (void)rank;
    tp_call *a = arg;
    return bn_cuda_backend_submit_chained(c, &a->sample, a->u, err);
}

static bn_status tp_submit_chained(bn_backend *b, const bn_pick_params *p, double u,
                                   bn_error *err)
{
    tp_call a = {.sample = sample_params(p), .u = u};
    return bn_cuda_tp_run(team_of(b), tp_chained_rank, &a, err);
}

static bn_status tp_wait_rank(bn_cuda_backend *c, int rank, void *arg, bn_error *err)
{
    tp_call *a = arg;
    return bn_cuda_backend_wait_greedy(c, &a->next[rank], err);
}

static bn_status tp_wait(bn_backend *b, int32_t *next, bn_error *err)
{
    tp_call a = {.n = 0};
    const bn_status st = bn_cuda_tp_run(team_of(b), tp_wait_rank, &a, err);
    if (st == BN_OK)
        *next = a.next[0];
    return st;
}

static int tp_pending(const bn_backend *b)
{
    return bn_cuda_backend_pending(bn_cuda_tp_rank(team_of(b), 0));
}

static bn_status tp_drop_rank(bn_cuda_backend *c, int rank, void *arg, bn_error *err)
{
    (void)rank;
    (void)arg;
    return bn_cuda_backend_drop_pending(c, err);
}

static void tp_drop_pending(bn_backend *b)
{
    (void)bn_cuda_tp_run(team_of(b), tp_drop_rank, NULL, NULL);
}

const bn_backend_ops bn_cuda_tp_backend_ops = {
    .name = "cuda",
    .create = tp_create,
    .free = tp_free,
    .forward = tp_forward,
    .kv_len = tp_kv_len,
    .kv_filled = tp_kv_filled,
    .reset = tp_reset,
    .describe = tp_describe,
    .report = tp_report,
    .pick_supported = tp_pick_supported,
    .forward_pick = tp_forward_pick,
    .submit = tp_submit,
    .submit_chained = tp_submit_chained,
    .wait = tp_wait,
    .pending = tp_pending,
    .drop_pending = tp_drop_pending,
};
