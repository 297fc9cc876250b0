/*
 * memory_pool.h - a caching pool of device buffers, with statistics and
 * leak reports.
 *
 * The pool is bookkeeping only: it never calls CUDA itself. Buffers come
 * from an allocator vtable (bn_pool_allocator), which is cudaMalloc/cudaFree
 * in production (src/cuda/cuda_allocator.h) and a fake in the CPU tests, so
 * every rule below is tested without a GPU.
 *
 * Size classes. A request is rounded up to a class so that a freed buffer
 * can serve later requests of nearby sizes:
 *
 *     256, 384, 512, 768, 1 KiB, 1.5 KiB, ... 2 MiB, 3 MiB, 4 MiB   (2^k and 1.5 * 2^k)
 *     5 MiB, 6 MiB, 7 MiB, ...                                       (every 1 MiB)
 *
 * Waste bound: for a request of at least 256 bytes the unused tail is less
 * than 1/3 of the buffer (less than half of the request); above 4 MiB it is
 * also less than 1 MiB, i.e. under 1/5 of the buffer and shrinking with size.
 * Requests under 256 bytes get 256: cudaMalloc aligns every buffer to 256
 * bytes, so a smaller class would save nothing on the device.
 *
 * Budgets:
 *  - max_pool_bytes (BITNET_POOL_SIZE_GB, CUDA_MEMORY_POOL_SIZE; 2 GiB) is the
 *    caching budget: a freed buffer is kept for reuse only while the pool
 *    (bytes in use + bytes cached) stays within it. It does not refuse
 *    allocations: a model bigger than the budget still loads.
 *  - memory_limit_bytes (BITNET_MEMORY_LIMIT; 0 = none) is a hard cap: the
 *    pool never holds more than it (in use + cached). An allocation that
 *    would cross it first evicts cached buffers, then fails with
 *    BN_ERR_GPU_OUT_OF_MEMORY.
 *
 * Thread safety: every function may be called from any thread; one mutex
 * guards the pool, and the allocator is called with it held (so the budgets
 * are exact), which means an allocator must never call back into the pool.
 */
#ifndef BN_MEMORY_POOL_H
#define BN_MEMORY_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- allocator ------------------------------------------------------------ */

/* Where buffers come from. alloc returns BN_OK and a non-NULL *ptr, or a
 * status (BN_ERR_GPU_OUT_OF_MEMORY when the device is full: only then does
 * the pool evict its cache and retry) with details in err. free must accept
 * every pointer alloc returned, exactly once. */
typedef struct bn_pool_allocator {
    const char *name; /* "cuda", "fake", ... (shown in messages) */
    bn_status (*alloc)(void *ctx, uint64_t bytes, void **ptr, bn_error *err);
    void (*free)(void *ctx, void *ptr);
    void *ctx;
} bn_pool_allocator;

/* ---- configuration -------------------------------------------------------- */

typedef struct bn_memory_pool_config {
    uint64_t max_pool_bytes;       /* caching budget (default 2 GiB)             */
    uint64_t memory_limit_bytes;   /* hard cap on bytes held; 0 = none           */
    uint32_t max_cached_per_class; /* cached buffers kept per class (1000); 0 = no cache */
    bool tracking;                 /* record allocation times and (debug) stacks */
    uint32_t cleanup_interval_secs; /* cached buffers idle longer are freed (30); 0 = never */
    uint32_t leak_threshold_secs;  /* default age for check_leaks (300)          */
    int device_id;                 /* the device the buffers live on (0)         */
} bn_memory_pool_config;

/* 2 GiB, 1000 per class, tracking on, 30 s cleanup, 300 s leak threshold,
 * no hard limit, device 0. */
void bn_memory_pool_config_defaults(bn_memory_pool_config *cfg);

/* Applies, in order: the defaults; cfg's pool_size_gb (GiB),
 * cleanup_interval_secs and leak_threshold_secs; cuda_pool_size (the value
 * of CUDA_MEMORY_POOL_SIZE, e.g. "2GB"; NULL when unset), which replaces the
 * pool size; and cfg's memory_limit_bytes, which caps the pool size and
 * becomes the hard limit. A malformed cuda_pool_size is BN_ERR_INVALID_CONFIG
 * naming the variable. cfg may be NULL (the BITNET_* defaults). */
bn_status bn_memory_pool_config_apply(const bn_config *cfg, const char *cuda_pool_size,
                                      bn_memory_pool_config *out, bn_error *err);

/* The same from the environment: cfg NULL reads every BITNET_* variable
 * (bn_config_from_env); CUDA_MEMORY_POOL_SIZE is read here. */
bn_status bn_memory_pool_config_from_env(const bn_config *cfg, bn_memory_pool_config *out,
                                         bn_error *err);

/* The class a request of `bytes` is rounded up to (see the table above);
 * 0 for 0, and 0 when the class would not fit in 64 bits. */
uint64_t bn_memory_pool_class_size(uint64_t bytes);

/* ---- the pool -------------------------------------------------------------- */

typedef struct bn_memory_pool bn_memory_pool;

/* Copies cfg and allocator; allocator->alloc and ->free are required. */
bn_status bn_memory_pool_create(const bn_memory_pool_config *cfg,
                                const bn_pool_allocator *allocator, bn_memory_pool **out,
                                bn_error *err);

/* Frees every cached buffer and every buffer still in use (their lifetime
 * ends with the pool's); live ones are reported with a warning first. */
void bn_memory_pool_destroy(bn_memory_pool *pool);

/* The clock used for ages and cleanup, bn_time_ns unless replaced (tests
 * replace it with one they control). now NULL restores bn_time_ns. The
 * cleanup timer restarts from the new clock's present. */
typedef uint64_t (*bn_pool_clock_fn)(void *ctx);
void bn_memory_pool_set_clock(bn_memory_pool *pool, bn_pool_clock_fn now, void *ctx);

/* A buffer of at least `bytes` (its class size, in fact). Served from the
 * cache when a buffer of the class is free; otherwise from the allocator.
 * When the allocator is out of memory, every cached buffer is freed and the
 * allocation retried once; if that fails too (or the hard limit would be
 * crossed) the result is BN_ERR_GPU_OUT_OF_MEMORY with a hint. bytes 0 is
 * BN_ERR_INVALID_ARGUMENT. Also runs the expiry cleanup when the cleanup
 * interval has passed since the last one. */
bn_status bn_memory_pool_allocate(bn_memory_pool *pool, uint64_t bytes, void **ptr,
                                  bn_error *err);

/* Gives a buffer back: it is cached for reuse unless its class already holds
 * max_cached_per_class buffers or the pool is over max_pool_bytes, in which
 * case it is freed. A pointer that is not a live buffer of this pool (a
 * double free, a foreign pointer, NULL) is BN_ERR_INVALID_ARGUMENT and
 * changes nothing. */
bn_status bn_memory_pool_deallocate(bn_memory_pool *pool, void *ptr, bn_error *err);

typedef struct bn_memory_pool_stats {
    uint64_t bytes_in_use;          /* class bytes of live buffers             */
    uint64_t peak_bytes_in_use;     /* high-water mark of bytes_in_use         */
    uint64_t requested_bytes_in_use; /* what callers asked for (in_use - this = rounding) */
    uint64_t total_allocated_bytes; /* class bytes handed out, all time        */
    uint64_t allocation_count;      /* successful allocate calls               */
    uint64_t deallocation_count;    /* successful deallocate calls             */
    uint64_t cache_hits;            /* allocations served from the cache       */
    uint64_t cache_misses;          /* allocations that needed the allocator   */
    uint64_t failed_allocations;    /* allocate calls that returned an error   */
    uint64_t bytes_cached;          /* bytes of free buffers kept for reuse    */
    uint64_t buffers_cached;
    uint64_t buffers_in_use;
    uint64_t device_allocs;         /* successful allocator->alloc calls       */
    uint64_t device_frees;          /* allocator->free calls                   */
} bn_memory_pool_stats;

void bn_memory_pool_get_stats(bn_memory_pool *pool, bn_memory_pool_stats *out);

/* Zeroes the counters (totals, counts, hits, misses, failures, device calls)
 * and restarts the peak from the current bytes in use. The gauges (bytes in
 * use, bytes cached, buffer counts) describe the present and are kept. */
void bn_memory_pool_reset_stats(bn_memory_pool *pool);

int bn_memory_pool_device_id(const bn_memory_pool *pool);

/* Frees cached buffers that have been idle (unused since they were given
 * back) for longer than the cleanup interval; returns how many. Nothing
 * when the interval is 0. */
size_t bn_memory_pool_cleanup_expired(bn_memory_pool *pool);

/* Frees every cached buffer; returns how many. */
size_t bn_memory_pool_flush_cache(bn_memory_pool *pool);

/* ---- leak reports ----------------------------------------------------------- */

typedef struct bn_pool_leak {
    int device_id;
    void *address;
    uint64_t size;           /* class bytes                        */
    uint64_t requested;      /* bytes the caller asked for         */
    double age_seconds;
    bn_backtrace backtrace;  /* where it was allocated (debug builds) */
} bn_pool_leak;

/* Pass as threshold_secs to use the configured leak_threshold_secs. */
#define BN_POOL_LEAK_DEFAULT_THRESHOLD (-1.0)

/* Lists live buffers older than threshold_secs (strictly), oldest first:
 * up to `max` into leaks (which may be NULL when max is 0); *count gets how
 * many there are in all, even beyond max. Each one is also logged as a
 * warning. With tracking off the pool knows no ages: BN_ERR_UNSUPPORTED. */
bn_status bn_memory_pool_check_leaks(bn_memory_pool *pool, double threshold_secs,
                                     bn_pool_leak *leaks, size_t max, size_t *count,
                                     bn_error *err);

/* One line per leak ("device 0: 1048576 bytes at 0x... allocated 312.0 s
 * ago") followed, in debug builds, by its allocation backtrace. Always
 * NUL-terminated; truncated to fit. */
void bn_pool_leak_format(const bn_pool_leak *leak, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
