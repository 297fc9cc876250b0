/*
 * cuda_context.h - what the CUDA backend needs of one device, in one
 * object: the device record, two streams, tracked device memory and
 * performance statistics (perf_stats.h).
 *
 * Streams (both created non-blocking, so they never wait for the legacy
 * default stream, and work on them never waits for unrelated default-stream
 * work elsewhere in the process):
 *
 *     compute  kernels, and small copies that must be ordered with them
 *     copy     uploads that may overlap the compute stream's work
 *
 * Work on the two streams is ordered only by events, which their user
 * records and waits for.
 *
 * The context binds its device to the calling thread (cudaSetDevice) in every
 * call that allocates or creates something; the device's primary context is
 * shared with the rest of the process, and destroying a bn_cuda_context never
 * resets the device.
 *
 * Threads: the memory counters are locked, so any thread may allocate and
 * free through one context.
 */
#ifndef BN_CUDA_CONTEXT_H
#define BN_CUDA_CONTEXT_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"
#include "cuda_check.h"
#include "perf_stats.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * NULL is allowed. Memory callers did not free is logged (warn). */
void bn_cuda_context_destroy(bn_cuda_context *ctx);

const bn_cuda_device *bn_cuda_context_device(const bn_cuda_context *ctx);

cudaStream_t bn_cuda_context_compute_stream(const bn_cuda_context *ctx);
cudaStream_t bn_cuda_context_copy_stream(const bn_cuda_context *ctx);

/* The context's counters, which its user feeds with its launches and
 * copies (bn_perf_record_kernels, bn_perf_record_h2d / _d2h). */
bn_perf_stats *bn_cuda_context_stats(bn_cuda_context *ctx);

/* Makes the context's device current on the calling thread (cudaSetDevice),
 * for callers about to use the runtime API directly from a new thread. */
bn_status bn_cuda_context_use(bn_cuda_context *ctx, bn_error *err);

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

#ifdef __cplusplus
}
#endif

#endif
