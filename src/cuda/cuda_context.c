/* Per-device CUDA context: streams, the memory pool, statistics; see
 * cuda_context.h. */
#include "cuda_context.h"

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
    bn_memory_pool *pool;
};

static bn_status use_device(const bn_cuda_context *ctx, bn_error *err)
{
    BN_CUDA_TRY(err, cudaSetDevice(ctx->device_id));
    return BN_OK;
}

/* ---- the pool's allocator: cudaMalloc / cudaFree ------------------------------------ */

/* The device id travels in the allocator's ctx pointer. cudaSetDevice comes
 * before every call because the current device is per host thread: the
 * thread that frees a buffer need not be the one that allocated it. */
static int device_of(void *actx) { return (int)(intptr_t)actx; }

static bn_status cuda_alloc(void *actx, uint64_t bytes, void **ptr, bn_error *err)
{
    *ptr = NULL;
    const int device = device_of(actx);
    BN_CUDA_TRY(err, cudaSetDevice(device));
    if (bytes > (uint64_t)SIZE_MAX)
        return bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY, NULL,
                            "%llu bytes do not fit in this host's size_t",
                            (unsigned long long)bytes);
    const cudaError_t rc = cudaMalloc(ptr, (size_t)bytes);
    if (rc == cudaSuccess)
        return BN_OK;
    *ptr = NULL;
    /* bn_cuda_fail also clears the thread's last error, so a later launch
     * check does not report this, already handled, failure. */
    const bn_status st = bn_cuda_fail(err, rc, "cudaMalloc", __FILE__, __LINE__);
    size_t free_b = 0, total_b = 0;
    if (err && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        char detail[96];
        snprintf(detail, sizeof detail, "%.1f of %.1f MiB free on the device",
                 (double)free_b / 1048576.0, (double)total_b / 1048576.0);
        bn_cuda_append_detail(err, detail);
    }
    (void)cudaGetLastError();
    return st;
}

/* Logs a failed call where there is no caller to tell. */
static void warn_failed(cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess) {
        bn_log(BN_LOG_WARN, "CUDA context: %s: %s", what, cudaGetErrorString(rc));
        (void)cudaGetLastError();
    }
}

static void cuda_free(void *actx, void *ptr)
{
    const cudaError_t rc = cudaSetDevice(device_of(actx));
    warn_failed(rc, "cudaSetDevice");
    if (rc == cudaSuccess)
        warn_failed(cudaFree(ptr), "cudaFree");
}

/* ---- the context -------------------------------------------------------------------- */

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

    char pool_name[32];
    snprintf(pool_name, sizeof pool_name, "CUDA device %d", device);
    const bn_pool_allocator allocator = {cuda_alloc, cuda_free, (void *)(intptr_t)device};
    bn_status st = bn_memory_pool_create(pool_name, &allocator, 0, &ctx->pool, err);
    if (st == BN_OK)
        st = bn_perf_stats_create(&ctx->stats, err);
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

void bn_cuda_context_destroy(bn_cuda_context *ctx)
{
    if (!ctx)
        return;
    warn_failed(cudaSetDevice(ctx->device_id), "cudaSetDevice");
    if (ctx->compute)
        warn_failed(cudaStreamSynchronize(ctx->compute), "compute stream");
    if (ctx->copy)
        warn_failed(cudaStreamSynchronize(ctx->copy), "copy stream");
    if (ctx->pool) {
        bn_memory_pool_stats stats;
        bn_memory_pool_get_stats(ctx->pool, &stats);
        char line[256];
        bn_memory_pool_stats_format(&stats, line, sizeof line);
        bn_log(BN_LOG_DEBUG, "CUDA device %d memory: %s", ctx->device_id, line);
        bn_memory_pool_destroy(ctx->pool); /* the leak report, then every buffer freed */
    }
    if (ctx->copy)
        warn_failed(cudaStreamDestroy(ctx->copy), "cudaStreamDestroy");
    if (ctx->compute)
        warn_failed(cudaStreamDestroy(ctx->compute), "cudaStreamDestroy");
    bn_perf_stats_destroy(ctx->stats);
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

bn_status bn_cuda_context_alloc_for(bn_cuda_context *ctx, size_t bytes, const char *purpose,
                                    void **out, bn_error *err)
{
    if (out)
        *out = NULL;
    if (!ctx || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "CUDA alloc: NULL argument");
    return bn_memory_pool_allocate(ctx->pool, bytes, purpose, out, err);
}

bn_status bn_cuda_context_alloc(bn_cuda_context *ctx, size_t bytes, void **out, bn_error *err)
{
    return bn_cuda_context_alloc_for(ctx, bytes, NULL, out, err);
}

void bn_cuda_context_free(bn_cuda_context *ctx, void *ptr, size_t bytes)
{
    if (!ctx || !ptr)
        return;
    bn_error err;
    uint64_t held = 0;
    if (bn_memory_pool_free(ctx->pool, ptr, &held, &err) != BN_OK)
        bn_log(BN_LOG_WARN, "CUDA context: %s", err.message);
    else if (held != bytes)
        bn_log(BN_LOG_WARN, "CUDA context: %p freed as %zu bytes, allocated as %llu", ptr, bytes,
               (unsigned long long)held);
}

void bn_cuda_context_memory(bn_cuda_context *ctx, uint64_t *current_bytes, uint64_t *peak_bytes)
{
    bn_memory_pool_stats s;
    bn_memory_pool_get_stats(ctx ? ctx->pool : NULL, &s);
    if (current_bytes)
        *current_bytes = s.bytes_in_use;
    if (peak_bytes)
        *peak_bytes = s.peak_bytes_in_use;
}

void bn_cuda_context_set_memory_limit(bn_cuda_context *ctx, uint64_t bytes)
{
    if (ctx)
        bn_memory_pool_set_limit(ctx->pool, bytes);
}

void bn_cuda_context_pool_stats(bn_cuda_context *ctx, bn_memory_pool_stats *out)
{
    bn_memory_pool_get_stats(ctx ? ctx->pool : NULL, out);
}
