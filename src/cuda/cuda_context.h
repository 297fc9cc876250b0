/*
 * cuda_context.h - what the CUDA backend needs of one device, in one
 * object: the device record, two streams, the device memory pool
 * (memory_pool.h) and performance statistics (perf_stats.h).
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
 * Device memory: every buffer comes from the context's pool, which gets it
 * from cudaMalloc (never managed memory, whose page migration would hide
 * out-of-memory until a kernel faults). The pool counts it, labels it with
 * its purpose, enforces the memory limit and reports what is left
 * allocated when the context goes. Allocation belongs to set-up: nothing
 * here runs per decode step.
 *
 * The context binds its device to the calling thread (cudaSetDevice) in every
 * call that allocates or creates something; the device's primary context is
 * shared with the rest of the process, and destroying a bn_cuda_context never
 * resets the device.
 *
 * Threads: the pool is locked, so any thread may allocate and free through
 * one context.
 */
#ifndef BN_CUDA_CONTEXT_H
#define BN_CUDA_CONTEXT_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"
#include "cuda_check.h"
#include "memory_pool.h"
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
 * NULL is allowed. Buffers callers did not free are listed (warn: purpose,
 * size, address) and freed; the pool's statistics are logged (debug). */
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

/* A device buffer of `bytes` (at least 1) for `purpose` ("kv cache", "lm
 * head": named in the leak report and in errors; NULL = "unnamed"), from
 * the context's pool: a buffer of exactly that size given back earlier, or
 * cudaMalloc. Out of memory is BN_ERR_GPU_OUT_OF_MEMORY, the message naming
 * the request, its purpose and the bytes in use, and then either the
 * memory limit or what cudaMalloc said with the device's free memory; the
 * context stays usable. */
bn_status bn_cuda_context_alloc_for(bn_cuda_context *ctx, size_t bytes, const char *purpose,
                                    void **out, bn_error *err);
/* The same, for an unnamed purpose. */
bn_status bn_cuda_context_alloc(bn_cuda_context *ctx, size_t bytes, void **out, bn_error *err);
/* Gives a buffer back to the pool, which keeps it for the next request of
 * its size: every stream must be done with it (cudaFree would wait for the
 * device; this does not). bytes is what was allocated; the pool knows it
 * too, and a mismatch, like a pointer the pool does not hold, is logged as
 * the caller's bug. NULL is allowed. */
void bn_cuda_context_free(bn_cuda_context *ctx, void *ptr, size_t bytes);
/* Bytes in use now and at most so far. */
void bn_cuda_context_memory(bn_cuda_context *ctx, uint64_t *current_bytes, uint64_t *peak_bytes);

/* The most device memory the context may reserve (BITNET_MEMORY_LIMIT, the
 * backend's memory_limit option); 0 = no limit, the default. The pool
 * refuses an allocation that would cross it with BN_ERR_GPU_OUT_OF_MEMORY. */
void bn_cuda_context_set_memory_limit(bn_cuda_context *ctx, uint64_t bytes);

/* The pool's statistics (memory_pool.h): bytes in use and reserved, their
 * peaks, the limit, allocations, reuses, frees and failures. For --verbose
 * and the receipt; bn_memory_pool_stats_format writes them as one line. */
void bn_cuda_context_pool_stats(bn_cuda_context *ctx, bn_memory_pool_stats *out);

#ifdef __cplusplus
}
#endif

#endif
