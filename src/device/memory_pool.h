/*
 * memory_pool.h - device memory with a purpose, a limit and a record. Every
 * buffer of the CUDA backend comes from here, through its context
 * (cuda_context.h: bn_cuda_context_alloc -> the pool -> cudaMalloc).
 *
 * What the pool adds to a plain allocator:
 *
 *  - Statistics: bytes in use and reserved (in use plus buffers kept for
 *    reuse), their peaks, allocations, reuses, frees and failures.
 *  - A memory limit (BITNET_MEMORY_LIMIT): the pool never reserves more. A
 *    request that would cross it first releases kept buffers, then fails
 *    with BN_ERR_GPU_OUT_OF_MEMORY naming the request, its purpose, the
 *    bytes in use and the limit.
 *  - Reuse: a buffer given back is kept, by its exact size, and the next
 *    request of that size gets it without a device call. Fixed-size blocks
 *    (a paged KV cache's) therefore come and go at host speed: a lock, a
 *    hash-table lookup and a stack push or pop.
 *  - Out of memory from the device: the kept buffers are released and the
 *    allocation tried once more before it fails.
 *  - A leak report: destroying the pool with buffers still out logs each
 *    one (purpose, size, address; in debug builds the stack that allocated
 *    it) at warning level, then frees it.
 *
 * Sizes are counted as asked for, with no rounding, so the pool's figures
 * and a caller's own plan of its buffers agree to the byte.
 *
 * The pool is bookkeeping only: it never calls CUDA itself. Buffers come
 * from an allocator vtable (bn_pool_allocator): cudaMalloc/cudaFree in the
 * CUDA context, a fake in the CPU tests, so every rule here is tested
 * without a GPU.
 *
 * Reuse and streams: cudaFree waits for the device; giving a buffer back to
 * the pool does not, and the buffer may be handed out again at once. Its
 * user must have finished with it on every stream first (a synchronise, or
 * an event the next user waits for).
 *
 * Thread safety: every function may be called from any thread; one mutex
 * guards the pool, and the allocator is called with it held (so the limit
 * is exact), which means an allocator must never call back into the pool.
 */
#ifndef BN_MEMORY_POOL_H
#define BN_MEMORY_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where buffers come from. alloc returns BN_OK and a non-NULL *ptr, or a
 * status (BN_ERR_GPU_OUT_OF_MEMORY when the device is full: only then does
 * the pool release its kept buffers and retry) with details in err. free
 * must accept every pointer alloc returned, exactly once. */
typedef struct bn_pool_allocator {
    bn_status (*alloc)(void *ctx, uint64_t bytes, void **ptr, bn_error *err);
    void (*free)(void *ctx, void *ptr);
    void *ctx;
} bn_pool_allocator;

typedef struct bn_memory_pool bn_memory_pool;

/* name says whose memory it is, in messages and reports ("CUDA device 0";
 * copied, NULL = "memory pool"). memory_limit: the most bytes the pool may
 * reserve; 0 = no limit. allocator->alloc and ->free are required. */
bn_status bn_memory_pool_create(const char *name, const bn_pool_allocator *allocator,
                                uint64_t memory_limit, bn_memory_pool **out, bn_error *err);

/* Frees every buffer, kept or in use; the ones in use are listed first, at
 * warning level, as leaks. NULL is allowed. */
void bn_memory_pool_destroy(bn_memory_pool *pool);

/* A new limit (0 = none). Kept buffers above it are released at once.
 * Buffers in use are never taken back: a limit below them makes every
 * allocation that needs the device fail until enough is given back. */
void bn_memory_pool_set_limit(bn_memory_pool *pool, uint64_t memory_limit);

/* A buffer of `bytes` (at least 1) for `purpose` ("kv cache"; copied into
 * its record, cut to 47 characters; NULL = "unnamed"). Served by a kept
 * buffer of exactly that size when there is one, else by the allocator.
 * Beyond the limit, or when the device is full even after the kept buffers
 * are released: BN_ERR_GPU_OUT_OF_MEMORY, the message naming the request,
 * the purpose, the bytes in use and the limit or the allocator's reason. */
bn_status bn_memory_pool_allocate(bn_memory_pool *pool, uint64_t bytes, const char *purpose,
                                  void **ptr, bn_error *err);

/* Gives a buffer back; it is kept for the next request of its size. *bytes
 * (bytes may be NULL) gets its size. A pointer that is not a buffer in use
 * of this pool (a double free, a foreign pointer, NULL) is
 * BN_ERR_INVALID_ARGUMENT and changes nothing. */
bn_status bn_memory_pool_free(bn_memory_pool *pool, void *ptr, uint64_t *bytes, bn_error *err);

typedef struct bn_memory_pool_stats {
    uint64_t bytes_in_use;        /* buffers handed out and not given back     */
    uint64_t peak_bytes_in_use;
    uint64_t bytes_reserved;      /* held from the allocator: in use + kept    */
    uint64_t peak_bytes_reserved;
    uint64_t memory_limit;        /* 0: none                                   */
    uint64_t buffers_in_use;
    uint64_t buffers_kept;        /* given back, kept for reuse                */
    uint64_t allocations;         /* successful allocate calls                 */
    uint64_t reuses;              /* ... of which a kept buffer served         */
    uint64_t frees;               /* successful free calls                     */
    uint64_t failures;            /* allocate calls that failed                */
} bn_memory_pool_stats;

/* A consistent snapshot. Zeroes for a NULL pool. */
void bn_memory_pool_get_stats(bn_memory_pool *pool, bn_memory_pool_stats *out);

/* One line, e.g.
 *   "812.3 MiB in use (peak 830.1 MiB), 812.3 MiB reserved (peak 830.1 MiB),
 *    limit none; 31 allocations, 0 reused, 0 failed"
 * Always NUL-terminated; returns what snprintf returns. */
int bn_memory_pool_stats_format(const bn_memory_pool_stats *stats, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
