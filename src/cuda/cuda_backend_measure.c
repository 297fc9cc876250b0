/*
 * cuda_backend_measure.c - what bench measures on the CUDA backend: the
 * stages' names, stage profiles of a decode step or a prefill chunk (CUDA
 * events around each stage), the LM head rows kept, decode step timings
 * (host, chained, device, with stages disabled), the decode trace, the
 * device copy bandwidth and the bytes a decode step reads.
 */
#include <cuda_profiler_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_internal.h"

const char *bn_cuda_stage_name(bn_cuda_stage s)
{
    static const char *const names[BN_CUDA_STAGE_COUNT] = {
        "embedding", "residual + attn_norm + int8", "q|k|v GEMV",
        "scale + RoPE + KV store", "attention (f32: + RoPE, KV store)", "attn_sub_norm + int8",
        "Wo GEMV", "residual + ffn_norm + int8",
        "gate|up GEMV", "relu^2 * up + ffn_sub_norm + int8",
        "down GEMV",
        "residual + output_norm", "LM head", "argmax"};
    return (int)s >= 0 && s < BN_CUDA_STAGE_COUNT ? names[s] : "?";
}

/* One pass of a profile, queued with b->prof set; the profile waits for
 * the stream after it. */
typedef bn_status (*profiled_pass)(bn_cuda_backend *b, const void *arg, bn_error *err);

/* Starts or stops a profiler's collection: only a mark, so a failure
 * leaves the profile as it is (its error taken back, not left for the next
 * launch's check to find). */
static void profiler_mark(bool start)
{
    if ((start ? cudaProfilerStart() : cudaProfilerStop()) != cudaSuccess)
        (void)cudaGetLastError();
}

/* Runs a pass once untimed, then reps times with CUDA events around each
 * stage (cap of them at most), and averages the stages' times per pass
 * into out. The untimed pass pays what a pass of a new shape pays once
 * (kernels loaded on first use, cuBLAS's choices), which would otherwise
 * land in the first timed pass: the LM head of 64 batched rows read
 * 394.6 or 620.8 us in two runs of one call without it. The timed passes
 * run between cudaProfilerStart and cudaProfilerStop, so that a profiler
 * started with profiling off (ncu --profile-from-start off) takes exactly
 * their kernels; without a profiler both do nothing. */
static bn_status profile_passes(bn_cuda_backend *b, int cap, profiled_pass run, const void *arg,
                                int reps, bn_cuda_stage_times *out, bn_error *err)
{
    bn_status st = BN_OK;
    prof p;
    memset(&p, 0, sizeof p);
    p.cap = cap;
    p.ev = calloc((size_t)p.cap, sizeof *p.ev);
    p.stage = calloc((size_t)p.cap, sizeof *p.stage);
    if (!p.ev || !p.stage)
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for profiling events");
    int created = 0;
    for (; st == BN_OK && created < p.cap; created++)
        st = BN_CUDA_STATUS(err, cudaEventCreate(&p.ev[created]));
    if (st == BN_OK)
        st = run(b, arg, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
    profiler_mark(true);
    for (int r = 0; r < reps && st == BN_OK; r++) {
        p.n = 0;
        memset(p.launches, 0, sizeof p.launches);
        b->prof = &p;
        st = BN_CUDA_STATUS(err, cudaEventRecord(p.ev[p.n], b->cs));
        if (st == BN_OK)
            p.stage[p.n++] = -1; /* the start */
        if (st == BN_OK)
            st = run(b, arg, err);
        b->prof = NULL;
        if (st == BN_OK)
            st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
        for (int k = 1; k < p.n && st == BN_OK; k++) {
            float ms = 0.0f;
            st = BN_CUDA_STATUS(err, cudaEventElapsedTime(&ms, p.ev[k - 1], p.ev[k]));
            out->ms[p.stage[k]] += ms / reps;
        }
        float total = 0.0f;
        if (st == BN_OK && p.n > 1)
            st = BN_CUDA_STATUS(err, cudaEventElapsedTime(&total, p.ev[0], p.ev[p.n - 1]));
        out->total_ms += total / reps;
    }
    b->prof = NULL;
    profiler_mark(false);
    memcpy(out->launches, p.launches, sizeof out->launches);
    for (int i = 0; i < created; i++)
        cudaEventDestroy(p.ev[i]);
    free(p.ev);
    free(p.stage);
    return st;
}

/* One sequence's pass of M rows (as cb_enqueue_rows; the inputs already
 * on the device). argmax: the pass runs as a greedy one (the screened
 * head where greedy passes use it, then the device argmax or the screen's
 * token key). */
typedef struct seq_pass {
    int64_t M;
    const int32_t *d_tok, *d_pos, *d_kvlen;
    int64_t visible;
    bool argmax;
} seq_pass;

static bn_status run_seq_pass(bn_cuda_backend *b, const void *arg, bn_error *err)
{
    const seq_pass *a = arg;
    bn_status st = cb_enqueue_rows(b, a->M, a->d_tok, a->d_pos, a->d_kvlen, a->visible,
                                   a->argmax && b->form.head_screen, err);
    b->choice_in_pass = false;
    if (st == BN_OK && a->argmax)
        st = cb_queue_choice(b, NULL, err); /* the argmax (unless screened) and hand-off */
    if (st == BN_OK && a->argmax)
        st = cb_mark(b, BN_CUDA_STAGE_ARGMAX, b->form.head_screen ? 1 : 3, err);
    return st;
}

static bn_status profile_rows(bn_cuda_backend *b, int64_t M, const int32_t *d_tok,
                              const int32_t *d_pos, const int32_t *d_kvlen, int64_t visible,
                              bool argmax, int reps, bn_cuda_stage_times *out, bn_error *err)
{
    const seq_pass a = {M, d_tok, d_pos, d_kvlen, visible, argmax};
    return profile_passes(b, 8 + b->hp.n_layer * 16, run_seq_pass, &a, reps, out, err);
}

/* A batched pass, every row greedy, its tokens into next. */
typedef struct batched_pass {
    const bn_batch_rows *rows;
    int32_t *next;
} batched_pass;

static bn_status run_batched_pass(bn_cuda_backend *b, const void *arg, bn_error *err)
{
    const batched_pass *a = arg;
    const rows_out o = {NULL, NULL, NULL, a->next};
    return cb_forward_rows(b, a->rows, &o, err);
}

bn_status bn_cuda_backend_profile_rows(bn_cuda_backend *b, const bn_batch_rows *rows, int reps,
                                       bn_cuda_stage_times *out, bn_error *err)
{
    if (!b || !rows || !out || reps < 1 || rows->n_rows < 1 || rows->n_logits < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "profile: bad arguments");
    memset(out, 0, sizeof *out);
    int32_t *next = malloc(((size_t)rows->n_logits + 1) * sizeof *next);
    if (!next)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a profile");
    const int64_t chunks = (rows->n_rows + b->chunk - 1) / b->chunk;
    const int64_t flushes = b->rows_head > 0 ? rows->n_logits / b->rows_head + 1 : 1;
    const int cap = (int)(chunks * (8 + b->hp.n_layer * 16) + 4 * (rows->n_logits + flushes) + 8);
    const batched_pass a = {rows, next};
    const bn_status st = profile_passes(b, cap, run_batched_pass, &a, reps, out, err);
    free(next);
    return st;
}

bn_status bn_cuda_backend_profile_decode(bn_cuda_backend *b, int32_t token, int64_t pos,
                                         int reps, bn_cuda_stage_times *out, bn_error *err)
{
    if (!b || !out || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "profile: bad arguments");
    memset(out, 0, sizeof *out);
    bn_status st = cb_check_request(b, &token, 1, pos, err);
    if (st == BN_OK)
        st = bn_cuda_context_use(b->ctx, err);
    if (st != BN_OK)
        return st;
    st = cb_upload_dec(b, token, pos, 1, 0.0, NULL, false, err);
    if (st == BN_OK)
        st = profile_rows(b, 1, cb_dec_dev(b), cb_dec_dev(b) + 1, cb_dec_dev(b) + 2, 0, true, reps,
                          out, err);
    if (st != BN_OK)
        return cb_fail_pass(b, pos, st);
    b->kv_filled = pos + 1;
    return BN_OK;
}

bn_status bn_cuda_backend_profile_prefill(bn_cuda_backend *b, const int32_t *tokens, int64_t n,
                                          int64_t pos, int reps, bn_cuda_stage_times *out,
                                          bn_error *err)
{
    if (!b || !out || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "profile: bad arguments");
    memset(out, 0, sizeof *out);
    if (n < 2 || n > b->chunk)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "profile one prefill chunk",
                            "profile: %lld tokens, where a prefill chunk is 2 to %lld",
                            (long long)n, (long long)b->chunk);
    bn_status st = cb_check_request(b, tokens, n, pos, err);
    if (st == BN_OK)
        st = bn_cuda_context_use(b->ctx, err);
    if (st != BN_OK)
        return st;
    st = cb_upload_rows(b, tokens, n, pos, err);
    if (st == BN_OK)
        st = profile_rows(b, n, b->d_tokens, b->d_pos, NULL, pos + n, true, reps, out, err);
    if (st != BN_OK)
        return cb_fail_pass(b, pos, st);
    b->kv_filled = pos + n;
    return BN_OK;
}

bn_status bn_cuda_backend_head_kept(bn_cuda_backend *b, int64_t *kept, bn_error *err)
{
    if (!b || !kept)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "head_kept: bad arguments");
    *kept = b->hp.vocab;
    if (!b->form.head_screen)
        return BN_OK;
    bn_status st = bn_cuda_context_use(b->ctx, err);
    if (st == BN_OK)
        st = cb_download_logits(b, err);
    if (st != BN_OK)
        return st;
    int64_t n = 0;
    for (int64_t r = 0; r < b->hp.vocab; r++)
        n += b->h_logits[r] != -INFINITY;
    *kept = n;
    return BN_OK;
}

bn_status bn_cuda_backend_time_decode_sample(bn_cuda_backend *b, int32_t token, int64_t pos,
                                             int reps, const bn_cuda_sample_params *p, double u,
                                             double *us_per_step, bn_error *err)
{
    if (!b || !us_per_step || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "time_decode: bad arguments");
    int32_t next;
    bn_status st = BN_OK;
    double t0 = 0.0;
    for (int r = -2; r < reps && st == BN_OK; r++) { /* two warm-up steps */
        if (r == 0)
            t0 = bn_time_seconds();
        st = bn_cuda_backend_submit_sample(b, token, pos, p, u, err);
        if (st == BN_OK)
            st = bn_cuda_backend_wait_greedy(b, &next, err);
    }
    *us_per_step = st == BN_OK ? (bn_time_seconds() - t0) * 1e6 / reps : 0.0;
    return st;
}

bn_status bn_cuda_backend_time_decode_chained(bn_cuda_backend *b, int32_t token, int64_t pos,
                                              int reps, const bn_cuda_sample_params *p,
                                              double u, double *us_per_step, bn_error *err)
{
    if (!b || !us_per_step || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "time_decode_chained: bad arguments");
    *us_per_step = 0.0;
    if (pos < 0 || pos + reps + 3 > b->kv_len)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "time fewer steps or an earlier position",
                            "time_decode_chained: positions %lld..%lld do not fit a KV cache of "
                            "%lld positions",
                            (long long)pos, (long long)(pos + reps + 2), (long long)b->kv_len);
    int32_t next;
    bn_status st = bn_cuda_backend_submit_sample(b, token, pos, p, u, err);
    double t0 = 0.0;
    for (int r = -2; r < reps && st == BN_OK; r++) { /* two warm-up steps */
        if (r == 0)
            t0 = bn_time_seconds();
        st = bn_cuda_backend_submit_chained(b, p, u, err);
        if (st == BN_OK)
            st = bn_cuda_backend_wait_greedy(b, &next, err);
    }
    if (st == BN_OK)
        *us_per_step = (bn_time_seconds() - t0) * 1e6 / reps;
    /* The last chained step's token is not taken. */
    const bn_status drop = bn_cuda_backend_drop_pending(b, st == BN_OK ? err : NULL);
    return st == BN_OK ? drop : st;
}

bn_status bn_cuda_backend_time_decode(bn_cuda_backend *b, int32_t token, int64_t pos, int reps,
                                      double *us_per_step, bn_error *err)
{
    return bn_cuda_backend_time_decode_sample(b, token, pos, reps, NULL, 0.0, us_per_step, err);
}

bn_status bn_cuda_backend_time_decode_device_sample(bn_cuda_backend *b, int32_t token,
                                                    int64_t pos, int reps,
                                                    const bn_cuda_sample_params *p, double u,
                                                    bn_cuda_time_part part, double *us_per_step,
                                                    bn_error *err)
{
    if (!b || !us_per_step || reps < 1 ||
        (part != BN_CUDA_TIME_STEP && part != BN_CUDA_TIME_PASS && part != BN_CUDA_TIME_CHOICE))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "time_decode_device: bad arguments");
    *us_per_step = 0.0;
    if (!b->graph.exec || !b->use_graphs || b->prof)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL, "time_decode_device: no decode graph");
    bn_status st = cb_check_request(b, &token, 1, pos, err);
    if (st == BN_OK)
        st = cb_check_choice(b, p, u, err);
    if (st == BN_OK)
        st = bn_cuda_context_use(b->ctx, err);
    if (st != BN_OK)
        return st;
    cudaEvent_t ev[2] = {NULL, NULL};
    st = BN_CUDA_STATUS(err, cudaEventCreate(&ev[0]));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventCreate(&ev[1]));
    /* A warm-up step, which also uploads the inputs every replay reads. */
    if (st == BN_OK)
        st = cb_queue_step(b, &token, 1, pos, p, u, false, err);
    /* The step as cb_queue_step runs it (a sampled one in graph_sample, when
     * captured); the pass is `graph` (screened for the top k) without the
     * sampler, and the choice the sampler launched by itself. */
    const bool in_graph = b->choice_in_pass;
    const cudaGraphExec_t step =
        in_graph && !cb_choice_greedy(p) ? b->graph_sample.exec : b->graph.exec;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(ev[0], b->cs));
    for (int r = 0; r < reps && st == BN_OK; r++) {
        if (part != BN_CUDA_TIME_CHOICE)
            st = BN_CUDA_STATUS(
                err, cudaGraphLaunch(part == BN_CUDA_TIME_STEP ? step : b->graph.exec, b->cs));
        b->choice_in_pass = part == BN_CUDA_TIME_STEP && in_graph;
        if (st == BN_OK && part != BN_CUDA_TIME_PASS)
            st = cb_queue_choice(b, p, err);
    }
    b->choice_in_pass = false;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(ev[1], b->cs));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventSynchronize(ev[1]));
    float ms = 0.0f;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventElapsedTime(&ms, ev[0], ev[1]));
    /* As wait_greedy: the cache now holds `token` at pos, so later
     * positions (computed from what was there) are forgotten. */
    if (st != BN_OK)
        (void)cb_fail_pass(b, pos, st);
    else
        b->kv_filled = pos + 1;
    for (int i = 0; i < 2; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    *us_per_step = st == BN_OK ? (double)ms * 1000.0 / reps : 0.0;
    return st;
}

bn_status bn_cuda_backend_time_decode_device(bn_cuda_backend *b, int32_t token, int64_t pos,
                                             int reps, double *us_per_step, bn_error *err)
{
    return bn_cuda_backend_time_decode_device_sample(b, token, pos, reps, NULL, 0.0,
                                                     BN_CUDA_TIME_STEP, us_per_step, err);
}

bn_status bn_cuda_backend_time_decode_without(bn_cuda_backend *b, unsigned stages, int32_t token,
                                              int64_t pos, int reps, double *us_per_step,
                                              int *disabled, bn_error *err)
{
    if (!b || !us_per_step || !disabled || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "time_decode_without: bad arguments");
    *disabled = 0;
    *us_per_step = 0.0;
    if (!b->graph.exec || !b->use_graphs || b->n_graph_nodes == 0)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "time_decode_without: no decode graph with a stage map (%s)",
                            !b->graph.exec || !b->use_graphs ? "no graph"
                            : b->stage_map_why          ? b->stage_map_why
                                                        : "not mapped");
    bn_status st = bn_cuda_context_use(b->ctx, err);
    for (int i = 0; i < b->n_graph_nodes && st == BN_OK; i++)
        if (stages >> b->graph_node_stage[i] & 1u) {
            const cudaError_t rc = cudaGraphNodeSetEnabled(b->graph.exec, b->graph_nodes[i], 0);
            const bool attn = b->graph_node_stage[i] == BN_CUDA_STAGE_ATTENTION;
            if (rc == cudaErrorInvalidClusterSize) /* non-portable cluster sizes: refused */
                st = bn_error_set(err, BN_ERR_UNSUPPORTED,
                                  "leave this stage out of the mask; the others can be timed",
                                  "the driver cannot disable the %s's graph nodes "
                                  "(thread-block clusters of %d blocks: %s)",
                                  attn ? "attention" : "gate|up GEMV",
                                  attn ? b->form.attn_cluster : b->form.gate_up_cluster,
                                  cudaGetErrorString(rc));
            else
                st = BN_CUDA_STATUS(err, rc);
            *disabled += st == BN_OK;
        }
    if (st == BN_OK)
        st = bn_cuda_backend_time_decode(b, token, pos, reps, us_per_step, err);
    /* Every node back on, whatever happened above. */
    for (int i = 0; i < b->n_graph_nodes; i++)
        if (stages >> b->graph_node_stage[i] & 1u)
            (void)cudaGraphNodeSetEnabled(b->graph.exec, b->graph_nodes[i], 1);
    (void)cudaGetLastError();
    return st;
}

#ifdef BN_DECODE_TRACE
/* Each .cu file of the decode kernels points its own trace buffer
 * (pdl.cuh, BN_TRACE_ATTACH). */
typedef cudaError_t (*trace_attach_fn)(void *recs, unsigned *count, unsigned cap);
cudaError_t bn_cb_norm_trace_attach(void *recs, unsigned *count, unsigned cap);
cudaError_t bn_cb_rope_trace_attach(void *recs, unsigned *count, unsigned cap);
cudaError_t bn_cb_attn_trace_attach(void *recs, unsigned *count, unsigned cap);
cudaError_t bn_w2a8_trace_attach(void *recs, unsigned *count, unsigned cap);
static const trace_attach_fn trace_attach[] = {bn_cb_norm_trace_attach, bn_cb_rope_trace_attach,
                                               bn_cb_attn_trace_attach, bn_w2a8_trace_attach};
enum { TRACE_FILES = sizeof trace_attach / sizeof trace_attach[0] };
#endif

bn_status bn_cuda_backend_trace_decode(bn_cuda_backend *b, int32_t token, int64_t pos,
                                       const char *path, int *records, bn_error *err)
{
    if (!b || !path || !records)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "trace_decode: bad arguments");
    *records = 0;
#ifndef BN_DECODE_TRACE
    (void)token;
    (void)pos;
    return bn_error_set(err, BN_ERR_UNSUPPORTED, "configure with -DBITNET_DECODE_TRACE=ON",
                        "this build does not trace the decode kernels");
#else
    /* One record per block: 64 bytes (pdl.cuh's bn_trace_rec). */
    enum { kRecBytes = 64 };
    const unsigned cap = 1u << 18;
    void *recs = NULL;
    unsigned *count = NULL;
    bn_status st = bn_cuda_context_use(b->ctx, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMalloc(&recs, (size_t)cap * kRecBytes));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMalloc((void **)&count, sizeof *count));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemset(count, 0, sizeof *count));
    for (int i = 0; i < TRACE_FILES && st == BN_OK; i++)
        st = BN_CUDA_STATUS(err, trace_attach[i](recs, count, cap));
    /* The memset and the attach copies ran on the legacy stream, which the
     * compute stream (non-blocking) does not wait for. */
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(cudaStreamLegacy));
    int32_t next;
    if (st == BN_OK)
        st = bn_cuda_backend_submit_greedy(b, token, pos, err);
    if (st == BN_OK)
        st = bn_cuda_backend_wait_greedy(b, &next, err);
    unsigned n = 0;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemcpy(&n, count, sizeof n, cudaMemcpyDeviceToHost));
    n = n < cap ? n : cap;
    unsigned char *host = st == BN_OK ? malloc((size_t)n * kRecBytes + 1) : NULL;
    if (st == BN_OK && !host)
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the trace");
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemcpy(host, recs, (size_t)n * kRecBytes,
                                            cudaMemcpyDeviceToHost));
    for (int i = 0; i < TRACE_FILES; i++)
        (void)trace_attach[i](NULL, NULL, 0);
    cudaFree(recs);
    cudaFree(count);
    FILE *f = st == BN_OK ? fopen(path, "w") : NULL;
    if (st == BN_OK && !f)
        st = bn_error_set(err, BN_ERR_IO, NULL, "cannot write %s", path);
    if (f) {
        fprintf(f, "t_run_ns,t_ready_ns,grid,threads,block,sm,m0,m1,m2,m3\n");
        for (unsigned i = 0; i < n; i++) {
            unsigned long long t[2], mk[4];
            unsigned u[4];
            memcpy(t, host + (size_t)i * kRecBytes, sizeof t);
            memcpy(u, host + (size_t)i * kRecBytes + sizeof t, sizeof u);
            memcpy(mk, host + (size_t)i * kRecBytes + sizeof t + sizeof u, sizeof mk);
            fprintf(f, "%llu,%llu,%u,%u,%u,%u,%llu,%llu,%llu,%llu\n", t[0], t[1], u[0], u[1],
                    u[2], u[3], mk[0], mk[1], mk[2], mk[3]);
        }
        if (fclose(f) != 0)
            st = bn_error_set(err, BN_ERR_IO, NULL, "cannot write %s", path);
    }
    free(host);
    *records = (int)n;
    return st;
#endif
}

bn_status bn_cuda_backend_copy_bandwidth(bn_cuda_backend *b, uint64_t bytes, double *gbs,
                                         bn_error *err)
{
    if (!b || !gbs)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "copy_bandwidth: bad arguments");
    *gbs = 0.0;
    bn_status st = bn_cuda_context_use(b->ctx, err);
    if (st != BN_OK)
        return st;
    void *src = NULL, *dst = NULL;
    for (; bytes >= ((uint64_t)16 << 20); bytes /= 2) {
        if (bn_cuda_context_alloc_for(b->ctx, bytes, "copy-bandwidth source", &src, NULL) !=
            BN_OK) {
            src = NULL;
            continue;
        }
        if (bn_cuda_context_alloc_for(b->ctx, bytes, "copy-bandwidth destination", &dst, NULL) ==
            BN_OK)
            break;
        bn_cuda_context_free(b->ctx, src, bytes);
        src = dst = NULL;
    }
    if (!src || !dst)
        return bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY, NULL,
                            "no room for the copy-bandwidth buffers");
    cudaEvent_t e0 = NULL, e1 = NULL;
    const int reps = 10;
    st = BN_CUDA_STATUS(err, cudaEventCreate(&e0));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventCreate(&e1));
    if (st == BN_OK) /* warm-up */
        st = BN_CUDA_STATUS(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->cs));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(e0, b->cs));
    for (int r = 0; r < reps && st == BN_OK; r++)
        st = BN_CUDA_STATUS(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->cs));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(e1, b->cs));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventSynchronize(e1));
    float ms = 0.0f;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventElapsedTime(&ms, e0, e1));
    if (st == BN_OK && ms > 0.0f)
        *gbs = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    (void)cudaStreamSynchronize(b->cs);
    bn_cuda_context_free(b->ctx, src, bytes);
    bn_cuda_context_free(b->ctx, dst, bytes);
    return st;
}

uint64_t bn_cuda_backend_bytes_per_token(const bn_cuda_backend *b, int64_t positions)
{
    const bn_hparams *hp = &b->hp;
    /* A screened head reads its int8 copy and (scale, bound) per row, and
     * writes and reads back each row's upper end; the full rows of the few
     * rows it keeps are not counted. */
    const uint64_t head = b->form.head_screen
                              ? (uint64_t)hp->vocab * ((uint64_t)hp->dim + 2 * sizeof(float) +
                                                       2 * sizeof(float))
                              : cb_head_table_bytes(b);
    const uint64_t kv = 2 * (uint64_t)hp->n_layer * (uint64_t)positions * (uint64_t)b->kv_dim *
                        b->kv_elem;
    return b->w_bytes + head + b->embed_row_bytes + b->norms_bytes + kv;
}
