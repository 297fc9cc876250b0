/*
 * cuda_context.h - everything one CUDA device needs for work, in one
 * object: the device record, two streams, a pool of events, cuBLAS and
 * cuBLASLt handles made on first use, tracked device memory, performance
 * statistics (perf_stats.h), copy and timing helpers, and the checking path
 * every CUDA and cuBLAS call in the context's users goes through.
 *
 * Streams (both created non-blocking, so they never wait for the legacy
 * default stream, and work on them never waits for unrelated default-stream
 * work elsewhere in the process):
 *
 *     compute  kernels, conversions, cuBLAS/cuBLASLt products
 *     copy     host <-> device transfers, so uploads of the next inputs can
 *              overlap the compute of the current ones
 *
 *   copy:     [upload A,B]--ev--.                       .--[download C]
 *   compute:                    `--wait--[convert][gemm]--ev--'
 *
 * Work on the two streams is ordered only by events: bn_cuda_context_stream_wait
 * makes one stream wait for what was queued on the other so far.
 *
 * The context binds its device to the calling thread (cudaSetDevice) in every
 * call that allocates or creates something; the device's primary context is
 * shared with the rest of the process (runtime and driver API alike), and
 * destroying a bn_cuda_context never resets the device.
 *
 * Threads: the event pool, the lazy handles and the memory counters are
 * locked, so any thread may use one context; a cuBLAS or cuBLASLt handle must
 * still not run two products at once (cuBLAS's rule), which callers sharing a
 * context across threads must serialise.
 */
#ifndef BN_CUDA_CONTEXT_H
#define BN_CUDA_CONTEXT_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"
#include "cublas_loader.h"
#include "cublaslt_loader.h"
#include "cuda_check.h"
#include "perf_stats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* The checking path                                                         */
/* ------------------------------------------------------------------------ */

/* A failed cuBLAS or cuBLASLt call (both return cublasStatus_t) as a
 * bn_status with a hint: allocation failure -> BN_ERR_GPU_OUT_OF_MEMORY
 * (reduce batch or context); not initialised -> the versions found (usually a
 * driver older than cuBLAS); arch mismatch / not supported ->
 * BN_ERR_UNSUPPORTED; invalid value -> the shapes; execution failure ->
 * BN_ERR_GPU. */
bn_status bn_cublas_fail(bn_error *err, cublasStatus_t status, const char *call, const char *file,
                         int line);


static inline bn_status bn_cublas_status_of(bn_error *err, cublasStatus_t status,
                                            const char *call, const char *file, int line)
{
    return status == CUBLAS_STATUS_SUCCESS ? BN_OK
                                           : bn_cublas_fail(err, status, call, file, line);
}

/* cuBLAS's counterparts of cuda_check.h's BN_CUDA_TRY and BN_CUDA_STATUS: */
#define BN_CUBLAS_TRY(err, call)                                                       \
    do {                                                                               \
        cublasStatus_t bn_try_st_ = (call);                                            \
        if (bn_try_st_ != CUBLAS_STATUS_SUCCESS)                                       \
            return bn_cublas_fail((err), bn_try_st_, #call, __FILE__, __LINE__);       \
    } while (0)

#define BN_CUBLAS_STATUS(err, call) \
    bn_cublas_status_of((err), (call), #call, __FILE__, __LINE__)

/* ------------------------------------------------------------------------ */
/* The context                                                               */
/* ------------------------------------------------------------------------ */

typedef struct bn_cuda_context bn_cuda_context;

/* Opens device `device` (a CUDA runtime ordinal, as 'bitnet devices' lists
 * them): queries it through bn_cuda_query, binds it to the calling thread
 * and creates the two streams and the statistics. The reasons CUDA is not
 * usable (no driver, driver older than the runtime with both versions, no
 * device, hidden devices) come back as bn_cuda_query reports them;
 * BN_ERR_NO_DEVICE for an index out of range. */
bn_status bn_cuda_context_create(int device, bn_cuda_context **out, bn_error *err);

/* Waits for both streams, then releases everything the context created.
 * NULL is allowed. Event or memory leaks by callers are logged (warn). */
void bn_cuda_context_destroy(bn_cuda_context *ctx);

const bn_cuda_device *bn_cuda_context_device(const bn_cuda_context *ctx);
int bn_cuda_context_device_id(const bn_cuda_context *ctx);
/* As cudaDriverGetVersion / cudaRuntimeGetVersion, e.g. 13000. */
void bn_cuda_context_versions(const bn_cuda_context *ctx, int *driver, int *runtime);

cudaStream_t bn_cuda_context_compute_stream(const bn_cuda_context *ctx);
cudaStream_t bn_cuda_context_copy_stream(const bn_cuda_context *ctx);

/* The context's counters: every helper below records into them; callers
 * launching their own kernels record with bn_perf_record_kernel or use
 * bn_cuda_context_time. */
bn_perf_stats *bn_cuda_context_stats(bn_cuda_context *ctx);

/* Makes the context's device current on the calling thread (cudaSetDevice),
 * for callers about to use the runtime API directly from a new thread. */
bn_status bn_cuda_context_use(bn_cuda_context *ctx, bn_error *err);

/* Waits until both streams are idle. */
bn_status bn_cuda_context_synchronize(bn_cuda_context *ctx, bn_error *err);

/* ---- events -------------------------------------------------------------- */

/* An event (timing enabled) from the pool, or a new one when the pool is
 * empty; give it back with bn_cuda_context_event_release. Pooling matters
 * because cudaEventCreate/Destroy cost microseconds each and the matmul and
 * timing helpers need several per call. */
bn_status bn_cuda_context_event_acquire(bn_cuda_context *ctx, cudaEvent_t *out, bn_error *err);
void bn_cuda_context_event_release(bn_cuda_context *ctx, cudaEvent_t event);

/* Makes `waiter` wait (on the GPU, not the host) for all work queued on
 * `producer` so far. NULL streams mean the context's compute stream. */
bn_status bn_cuda_context_stream_wait(bn_cuda_context *ctx, cudaStream_t waiter,
                                      cudaStream_t producer, bn_error *err);

/* ---- libraries, created on first use -------------------------------------- */

/* The context's cuBLAS handle (bound to the compute stream, math mode
 * CUBLAS_DEFAULT_MATH: FP32 products never run on TF32 tensor cores) and its
 * function table. The first call loads libcublas and creates the handle;
 * a missing library is BN_ERR_UNSUPPORTED naming it. */
bn_status bn_cuda_context_cublas(bn_cuda_context *ctx, const bn_cublas **api,
                                 cublasHandle_t *handle, bn_error *err);

/* Likewise cuBLASLt (its streams are given per call). */
bn_status bn_cuda_context_cublaslt(bn_cuda_context *ctx, const bn_cublaslt **api,
                                   cublasLtHandle_t *handle, bn_error *err);

/* ---- device memory ---------------------------------------------------------- */

/* cudaMalloc on the context's device, counted in the context's current and
 * peak bytes. Out of memory is BN_ERR_GPU_OUT_OF_MEMORY with the hint to
 * reduce the batch size or the context length, and the message says how
 * much was asked for and how much is free; the context stays usable. */
bn_status bn_cuda_context_alloc(bn_cuda_context *ctx, size_t bytes, void **out, bn_error *err);
/* bytes must be what was allocated (device memory has no room for a size
 * header). NULL is allowed. */
void bn_cuda_context_free(bn_cuda_context *ctx, void *ptr, size_t bytes);
void bn_cuda_context_memory(bn_cuda_context *ctx, uint64_t *current_bytes, uint64_t *peak_bytes);

/* ---- copies (recorded in the statistics) ------------------------------------ */

/* Queued on `stream` (NULL: the copy stream); the host buffer must stay
 * valid until the stream reaches the copy. Pinned host memory copies
 * asynchronously; pageable memory is staged by the driver. */
bn_status bn_cuda_context_upload_async(bn_cuda_context *ctx, void *dst_device,
                                       const void *src_host, size_t bytes, cudaStream_t stream,
                                       bn_error *err);
bn_status bn_cuda_context_download_async(bn_cuda_context *ctx, void *dst_host,
                                         const void *src_device, size_t bytes,
                                         cudaStream_t stream, bn_error *err);
/* On the copy stream, returning when the copy is complete. The copy stream
 * does not wait for the compute stream: download results with
 * bn_cuda_context_stream_wait(ctx, copy, compute) first, or use the async
 * form on the compute stream. */
bn_status bn_cuda_context_upload(bn_cuda_context *ctx, void *dst_device, const void *src_host,
                                 size_t bytes, bn_error *err);
bn_status bn_cuda_context_download(bn_cuda_context *ctx, void *dst_host, const void *src_device,
                                   size_t bytes, bn_error *err);

/* ---- timing ------------------------------------------------------------------ */

/* Counts one kernel launch of `elapsed_ns` (0 when not measured) in the
 * context's statistics. Inside a bn_cuda_context_time callback on this
 * thread the launch is counted but its time is not: the timed region's
 * time covers it, and counting both would count the time twice. Launchers
 * (PTX launches, the matmul) record through this rather than through
 * bn_perf_record_kernel directly. */
void bn_cuda_context_record_launch(bn_cuda_context *ctx, uint64_t elapsed_ns);

/* Queues work on the stream it is given; returns the launch status. */
typedef bn_status (*bn_cuda_enqueue_fn)(void *user, cudaStream_t stream, bn_error *err);

/* Times what `enqueue` queues on `stream` (NULL: compute stream) between two
 * events, waits for it and returns the time in milliseconds (event
 * resolution is about half a microsecond). The statistics get the launches
 * the callback recorded with bn_cuda_context_record_launch (at least one:
 * a callback that records none, e.g. one queuing a memset, counts as one)
 * and the measured time once. For measurement, not for hot paths: it
 * blocks the host until the work is done. */
bn_status bn_cuda_context_time(bn_cuda_context *ctx, cudaStream_t stream,
                               bn_cuda_enqueue_fn enqueue, void *user, double *ms,
                               bn_error *err);

#ifdef __cplusplus
}
#endif

#endif
