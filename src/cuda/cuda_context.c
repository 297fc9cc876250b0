/* Per-device CUDA context: streams, events, lazy cuBLAS/cuBLASLt handles,
 * tracked memory, statistics; see cuda_context.h. */
#include "cuda_context.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* The checking path                                                         */
/* ------------------------------------------------------------------------ */

static const char *cublas_status_name(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
    }
}

bn_status bn_cublas_fail(bn_error *err, cublasStatus_t status, const char *call, const char *file,
                         int line)
{
    /* cuBLAS may have failed on a CUDA call of its own; do not let that
     * error surface later from an unrelated launch check. */
    (void)cudaGetLastError();
    bn_status st = BN_ERR_GPU;
    const char *hint = NULL;
    bool versions = false;
    switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
        st = BN_ERR_GPU_OUT_OF_MEMORY;
        hint = "reduce the batch size or the context length, or set BITNET_MEMORY_LIMIT";
        break;
    case CUBLAS_STATUS_NOT_INITIALIZED:
        hint = "cuBLAS could not start: usually the NVIDIA driver is older than the cuBLAS "
               "library (update the driver) or the GPU is out of memory";
        versions = true;
        break;
    case CUBLAS_STATUS_INVALID_VALUE:
        st = BN_ERR_INVALID_ARGUMENT;
        hint = "a matrix size, leading dimension or pointer is invalid: check the shapes";
        break;
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
        st = BN_ERR_UNSUPPORTED;
        hint = "this GPU or this cuBLAS version does not support the requested types or "
               "layout: try precision fp32, or a newer CUDA toolkit";
        versions = true;
        break;
    case CUBLAS_STATUS_EXECUTION_FAILED:
    case CUBLAS_STATUS_MAPPING_ERROR:
        hint = "a cuBLAS kernel failed on the GPU: check dmesg for Xid errors and run the "
               "failing command under compute-sanitizer";
        break;
    default:
        break;
    }
    bn_error_set(err, st, hint, "%s failed at %s:%d: %s (%d)", call, file, line,
                 cublas_status_name(status), (int)status);
    if (versions && err) {
        char text[128];
        bn_cuda_versions_describe(text, sizeof text);
        bn_cuda_append_detail(err, text);
    }
    return st;
}

/* ------------------------------------------------------------------------ */
/* The context                                                               */
/* ------------------------------------------------------------------------ */

struct bn_cuda_context {
    int device_id;
    bn_cuda_device device;
    int driver_version, runtime_version;
    cudaStream_t compute, copy;
    bn_perf_stats *stats;

    pthread_mutex_t lock;        /* everything below                       */
    cudaEvent_t *pool;           /* idle events                            */
    int pool_count, pool_capacity;
    int events_out;              /* acquired and not yet released          */
    const bn_cublas *cublas;
    cublasHandle_t cublas_handle;
    const bn_cublaslt *cublaslt;
    cublasLtHandle_t cublaslt_handle;
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
    ctx->driver_version = report->driver_version;
    ctx->runtime_version = report->runtime_version;
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
    if (ctx->cublas_handle) {
        const cublasStatus_t s = ctx->cublas->destroy(ctx->cublas_handle);
        if (s != CUBLAS_STATUS_SUCCESS)
            bn_log(BN_LOG_WARN, "cublasDestroy: %s", cublas_status_name(s));
    }
    if (ctx->cublaslt_handle) {
        const cublasStatus_t s = ctx->cublaslt->destroy(ctx->cublaslt_handle);
        if (s != CUBLAS_STATUS_SUCCESS)
            bn_log(BN_LOG_WARN, "cublasLtDestroy: %s", cublas_status_name(s));
    }
    for (int i = 0; i < ctx->pool_count; i++)
        warn_failed(cudaEventDestroy(ctx->pool[i]), "cudaEventDestroy");
    free(ctx->pool);
    if (ctx->events_out > 0)
        bn_log(BN_LOG_WARN, "CUDA context destroyed with %d event(s) not released",
               ctx->events_out);
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

int bn_cuda_context_device_id(const bn_cuda_context *ctx) { return ctx->device_id; }

void bn_cuda_context_versions(const bn_cuda_context *ctx, int *driver, int *runtime)
{
    if (driver)
        *driver = ctx->driver_version;
    if (runtime)
        *runtime = ctx->runtime_version;
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

bn_status bn_cuda_context_synchronize(bn_cuda_context *ctx, bn_error *err)
{
    if (!ctx)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "CUDA context: NULL context");
    BN_CUDA_TRY(err, cudaStreamSynchronize(ctx->compute));
    BN_CUDA_TRY(err, cudaStreamSynchronize(ctx->copy));
    return BN_OK;
}

/* ---- events ------------------------------------------------------------------ */

bn_status bn_cuda_context_event_acquire(bn_cuda_context *ctx, cudaEvent_t *out, bn_error *err)
{
    if (!ctx || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "CUDA event: NULL argument");
    pthread_mutex_lock(&ctx->lock);
    if (ctx->pool_count > 0) {
        *out = ctx->pool[--ctx->pool_count];
        ctx->events_out++;
        pthread_mutex_unlock(&ctx->lock);
        return BN_OK;
    }
    pthread_mutex_unlock(&ctx->lock);

    /* Created outside the lock: it may take a while and needs no pool state. */
    BN_CUDA_TRY(err, cudaSetDevice(ctx->device_id));
    BN_CUDA_TRY(err, cudaEventCreate(out));
    pthread_mutex_lock(&ctx->lock);
    ctx->events_out++;
    pthread_mutex_unlock(&ctx->lock);
    return BN_OK;
}

void bn_cuda_context_event_release(bn_cuda_context *ctx, cudaEvent_t event)
{
    if (!ctx || !event)
        return;
    pthread_mutex_lock(&ctx->lock);
    ctx->events_out--;
    if (ctx->pool_count == ctx->pool_capacity) {
        const int capacity = ctx->pool_capacity ? 2 * ctx->pool_capacity : 8;
        cudaEvent_t *grown = realloc(ctx->pool, sizeof *grown * (size_t)capacity);
        if (!grown) {
            /* Keeping it is not possible; destroying it is always correct. */
            pthread_mutex_unlock(&ctx->lock);
            warn_failed(cudaEventDestroy(event), "cudaEventDestroy");
            return;
        }
        ctx->pool = grown;
        ctx->pool_capacity = capacity;
    }
    ctx->pool[ctx->pool_count++] = event;
    pthread_mutex_unlock(&ctx->lock);
}

bn_status bn_cuda_context_stream_wait(bn_cuda_context *ctx, cudaStream_t waiter,
                                      cudaStream_t producer, bn_error *err)
{
    if (!ctx)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "CUDA context: NULL context");
    waiter = waiter ? waiter : ctx->compute;
    producer = producer ? producer : ctx->compute;
    if (waiter == producer)
        return BN_OK;
    cudaEvent_t ev;
    bn_status st = bn_cuda_context_event_acquire(ctx, &ev, err);
    if (st != BN_OK)
        return st;
    st = BN_CUDA_STATUS(err, cudaEventRecord(ev, producer));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamWaitEvent(waiter, ev, 0));
    /* The wait captured the event's current state: recording it again for
     * another user later does not affect it, so it may go back at once. */
    bn_cuda_context_event_release(ctx, ev);
    return st;
}

/* ---- libraries ----------------------------------------------------------------- */

/* Called with the lock held. */
static bn_status create_cublas(bn_cuda_context *ctx, bn_error *err)
{
    const bn_cublas *api = NULL;
    const bn_cublas_extra *extra = NULL;
    bn_status st = bn_cublas_get(&api, err);
    if (st == BN_OK)
        st = bn_cublas_extra_get(&extra, err);
    if (st == BN_OK)
        st = use_device(ctx, err);
    if (st != BN_OK)
        return st;
    cublasHandle_t h = NULL;
    BN_CUBLAS_TRY(err, api->create(&h));
    st = BN_CUBLAS_STATUS(err, api->set_stream(h, ctx->compute));
    /* CUBLAS_DEFAULT_MATH: FP16/BF16 inputs still use tensor cores, but FP32
     * inputs are multiplied in FP32, never rounded to TF32. */
    if (st == BN_OK)
        st = BN_CUBLAS_STATUS(err, extra->set_math_mode(h, CUBLAS_DEFAULT_MATH));
    if (st != BN_OK) {
        api->destroy(h);
        return st;
    }
    int version = 0;
    if (extra->get_version(h, &version) == CUBLAS_STATUS_SUCCESS)
        bn_log(BN_LOG_DEBUG, "cuBLAS %d (%s) on device %d", version, api->library,
               ctx->device_id);
    ctx->cublas = api;
    ctx->cublas_handle = h;
    return BN_OK;
}

bn_status bn_cuda_context_cublas(bn_cuda_context *ctx, const bn_cublas **api,
                                 cublasHandle_t *handle, bn_error *err)
{
    if (!ctx || !api || !handle)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuBLAS handle: NULL argument");
    pthread_mutex_lock(&ctx->lock);
    const bn_status st = ctx->cublas_handle ? BN_OK : create_cublas(ctx, err);
    if (st == BN_OK) {
        *api = ctx->cublas;
        *handle = ctx->cublas_handle;
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

/* Called with the lock held. */
static bn_status create_cublaslt(bn_cuda_context *ctx, bn_error *err)
{
    const bn_cublaslt *api = NULL;
    bn_status st = bn_cublaslt_get(&api, err);
    if (st == BN_OK)
        st = use_device(ctx, err);
    if (st != BN_OK)
        return st;
    cublasLtHandle_t h = NULL;
    BN_CUBLAS_TRY(err, api->create(&h));
    bn_log(BN_LOG_DEBUG, "cuBLASLt %zu (%s) on device %d", api->get_version(), api->library,
           ctx->device_id);
    ctx->cublaslt = api;
    ctx->cublaslt_handle = h;
    return BN_OK;
}

bn_status bn_cuda_context_cublaslt(bn_cuda_context *ctx, const bn_cublaslt **api,
                                   cublasLtHandle_t *handle, bn_error *err)
{
    if (!ctx || !api || !handle)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuBLASLt handle: NULL argument");
    pthread_mutex_lock(&ctx->lock);
    const bn_status st = ctx->cublaslt_handle ? BN_OK : create_cublaslt(ctx, err);
    if (st == BN_OK) {
        *api = ctx->cublaslt;
        *handle = ctx->cublaslt_handle;
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
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

/* ---- copies ------------------------------------------------------------------------- */

static bn_status copy_async(bn_cuda_context *ctx, void *dst, const void *src, size_t bytes,
                            cudaStream_t stream, enum cudaMemcpyKind kind, bn_error *err)
{
    if (!ctx || (bytes > 0 && (!dst || !src)))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "CUDA copy: NULL argument");
    if (bytes == 0)
        return BN_OK;
    BN_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, kind, stream ? stream : ctx->copy));
    if (kind == cudaMemcpyHostToDevice)
        bn_perf_record_h2d(ctx->stats, bytes);
    else
        bn_perf_record_d2h(ctx->stats, bytes);
    return BN_OK;
}

bn_status bn_cuda_context_upload_async(bn_cuda_context *ctx, void *dst_device,
                                       const void *src_host, size_t bytes, cudaStream_t stream,
                                       bn_error *err)
{
    return copy_async(ctx, dst_device, src_host, bytes, stream, cudaMemcpyHostToDevice, err);
}

bn_status bn_cuda_context_download_async(bn_cuda_context *ctx, void *dst_host,
                                         const void *src_device, size_t bytes,
                                         cudaStream_t stream, bn_error *err)
{
    return copy_async(ctx, dst_host, src_device, bytes, stream, cudaMemcpyDeviceToHost, err);
}

bn_status bn_cuda_context_upload(bn_cuda_context *ctx, void *dst_device, const void *src_host,
                                 size_t bytes, bn_error *err)
{
    bn_status st = copy_async(ctx, dst_device, src_host, bytes, NULL, cudaMemcpyHostToDevice, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(ctx->copy));
    return st;
}

bn_status bn_cuda_context_download(bn_cuda_context *ctx, void *dst_host, const void *src_device,
                                   size_t bytes, bn_error *err)
{
    bn_status st = copy_async(ctx, dst_host, src_device, bytes, NULL, cudaMemcpyDeviceToHost, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(ctx->copy));
    return st;
}

/* ---- timing --------------------------------------------------------------------------- */

/* The timed region this thread is inside, if any: launches recorded for its
 * context are held back and counted when the region's time is known. A
 * callback may time a nested region; each keeps its own count. */
static _Thread_local struct timed_region {
    const bn_cuda_context *ctx;
    uint64_t launches;
} region;

void bn_cuda_context_record_launch(bn_cuda_context *ctx, uint64_t elapsed_ns)
{
    if (!ctx)
        return;
    if (region.ctx == ctx) {
        region.launches++;
        return;
    }
    bn_perf_record_kernel(ctx->stats, elapsed_ns);
}

bn_status bn_cuda_context_time(bn_cuda_context *ctx, cudaStream_t stream,
                               bn_cuda_enqueue_fn enqueue, void *user, double *ms,
                               bn_error *err)
{
    if (!ctx || !enqueue)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "CUDA time: NULL argument");
    stream = stream ? stream : ctx->compute;
    const struct timed_region outer = region;
    cudaEvent_t start = NULL, stop = NULL;
    bn_status st = bn_cuda_context_event_acquire(ctx, &start, err);
    if (st == BN_OK)
        st = bn_cuda_context_event_acquire(ctx, &stop, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(start, stream));
    uint64_t launches = 0;
    if (st == BN_OK) {
        region.ctx = ctx;
        region.launches = 0;
        st = enqueue(user, stream, err);
        launches = region.launches;
        region = outer;
    }
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(stop, stream));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventSynchronize(stop));
    float elapsed = 0.0f;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventElapsedTime(&elapsed, start, stop));
    bn_cuda_context_event_release(ctx, start);
    bn_cuda_context_event_release(ctx, stop);
    if (st != BN_OK)
        return st;
    bn_cuda_context_record_launch(ctx, (uint64_t)((double)elapsed * 1e6));
    for (uint64_t i = 1; i < launches; i++)
        bn_cuda_context_record_launch(ctx, 0);
    if (ms)
        *ms = elapsed;
    return BN_OK;
}
