/* Per-device CUDA context: streams, tracked memory, statistics; see
 * cuda_context.h. */
#include "cuda_context.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The context                                                               */
/* ------------------------------------------------------------------------ */

struct bn_cuda_context {
    int device_id;
    bn_cuda_device device;
    cudaStream_t compute, copy;
    bn_perf_stats *stats;

    pthread_mutex_t lock;        /* the counters below                     */
    uint64_t memory_current, memory_peak;
};

static bn_status use_device(const bn_cuda_context *ctx, bn_error *err)
{
    BN_CUDA_TRY(err, cudaSetDevice(ctx->device_id));
    return BN_OK;
}

bn_status bn_cuda_context_create(int device, bn_cuda_context **out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "CUDA context: NULL output");
    *out = NULL;

    /* The report is large (one record per possible device): heap, not stack. */
    bn_cuda_report *report = malloc(sizeof *report);
    if (!report)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "CUDA context: out of host memory");
    bn_cuda_query(report);
    if (report->status != BN_OK) {
        const bn_status st = bn_error_set(err, report->status, report->hint,
                                          "CUDA is not usable: %s", report->reason);
        free(report);
        return st;
    }
    const bn_cuda_device *found = NULL;
    for (int i = 0; i < report->device_count; i++)
        if (report->devices[i].id == device)
            found = &report->devices[i];
    if (!found) {
        const bn_status st = bn_error_set(
            err, BN_ERR_NO_DEVICE, "'bitnet devices' lists the usable devices",
            "CUDA device %d does not exist or could not be queried (%d usable device%s)", device,
            report->device_count, report->device_count == 1 ? "" : "s");
        free(report);
        return st;
    }

    bn_cuda_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        free(report);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "CUDA context: out of host memory");
    }
    ctx->device_id = device;
    ctx->device = *found;
    free(report);
    if (pthread_mutex_init(&ctx->lock, NULL) != 0) {
        free(ctx);
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "CUDA context: pthread_mutex_init failed");
    }

    bn_status st = bn_perf_stats_create(&ctx->stats, err);
    if (st == BN_OK)
        st = use_device(ctx, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamCreateWithFlags(&ctx->compute, cudaStreamNonBlocking));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamCreateWithFlags(&ctx->copy, cudaStreamNonBlocking));
    if (st != BN_OK) {
        bn_cuda_context_destroy(ctx);
        return st;
    }
    bn_log(BN_LOG_DEBUG, "CUDA context on device %d (%s, cc %d.%d)", device, ctx->device.name,
           ctx->device.cc_major, ctx->device.cc_minor);
    *out = ctx;
    return BN_OK;
}

/* Logs a failed call during teardown, where there is no caller to tell. */
static void warn_failed(cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess) {
        bn_log(BN_LOG_WARN, "CUDA context teardown: %s: %s", what, cudaGetErrorString(rc));
        (void)cudaGetLastError();
    }
}

void bn_cuda_context_destroy(bn_cuda_context *ctx)
{
    if (!ctx)
        return;
    warn_failed(cudaSetDevice(ctx->device_id), "cudaSetDevice");
    if (ctx->compute)
        warn_failed(cudaStreamSynchronize(ctx->compute), "compute stream");
    if (ctx->copy)
        warn_failed(cudaStreamSynchronize(ctx->copy), "copy stream");
    if (ctx->memory_current > 0)
        bn_log(BN_LOG_WARN, "CUDA context destroyed with %llu bytes of device memory not freed",
               (unsigned long long)ctx->memory_current);
    if (ctx->copy)
        warn_failed(cudaStreamDestroy(ctx->copy), "cudaStreamDestroy");
    if (ctx->compute)
        warn_failed(cudaStreamDestroy(ctx->compute), "cudaStreamDestroy");
    bn_perf_stats_destroy(ctx->stats);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

const bn_cuda_device *bn_cuda_context_device(const bn_cuda_context *ctx)
{
    return &ctx->device;
}

cudaStream_t bn_cuda_context_compute_stream(const bn_cuda_context *ctx) { return ctx->compute; }
cudaStream_t bn_cuda_context_copy_stream(const bn_cuda_context *ctx) { return ctx->copy; }
bn_perf_stats *bn_cuda_context_stats(bn_cuda_context *ctx) { return ctx->stats; }

bn_status bn_cuda_context_use(bn_cuda_context *ctx, bn_error *err)
{
    if (!ctx)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "CUDA context: NULL context");
    return use_device(ctx, err);
}

/* ---- device memory ---------------------------------------------------------------- */

bn_status bn_cuda_context_alloc(bn_cuda_context *ctx, size_t bytes, void **out, bn_error *err)
{
    if (!ctx || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "CUDA alloc: NULL argument");
    *out = NULL;
    BN_CUDA_TRY(err, cudaSetDevice(ctx->device_id));
    const cudaError_t rc = cudaMalloc(out, bytes ? bytes : 1);
    if (rc != cudaSuccess) {
        *out = NULL;
        const bn_status st = bn_cuda_fail(err, rc, "cudaMalloc", __FILE__, __LINE__);
        if (err) {
            size_t free_b = 0, total_b = 0;
            char detail[160];
            if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
                snprintf(detail, sizeof detail,
                         "asked for %.1f MiB on device %d; %.1f of %.1f MiB free",
                         (double)bytes / 1048576.0, ctx->device_id, (double)free_b / 1048576.0,
                         (double)total_b / 1048576.0);
            else
                snprintf(detail, sizeof detail, "asked for %.1f MiB on device %d",
                         (double)bytes / 1048576.0, ctx->device_id);
            (void)cudaGetLastError();
            bn_cuda_append_detail(err, detail);
        }
        return st;
    }
    pthread_mutex_lock(&ctx->lock);
    ctx->memory_current += bytes;
    if (ctx->memory_current > ctx->memory_peak)
        ctx->memory_peak = ctx->memory_current;
    pthread_mutex_unlock(&ctx->lock);
    return BN_OK;
}

void bn_cuda_context_free(bn_cuda_context *ctx, void *ptr, size_t bytes)
{
    if (!ctx || !ptr)
        return;
    warn_failed(cudaSetDevice(ctx->device_id), "cudaSetDevice");
    warn_failed(cudaFree(ptr), "cudaFree");
    pthread_mutex_lock(&ctx->lock);
    ctx->memory_current -= bytes <= ctx->memory_current ? bytes : ctx->memory_current;
    pthread_mutex_unlock(&ctx->lock);
}

void bn_cuda_context_memory(bn_cuda_context *ctx, uint64_t *current_bytes, uint64_t *peak_bytes)
{
    pthread_mutex_lock(&ctx->lock);
    if (current_bytes)
        *current_bytes = ctx->memory_current;
    if (peak_bytes)
        *peak_bytes = ctx->memory_peak;
    pthread_mutex_unlock(&ctx->lock);
}
