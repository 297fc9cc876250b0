/*
 * memory_pool.c - size-class caching pool over an allocator vtable.
 *
 * Every buffer the pool owns has a record (`block`) in a hash table keyed by
 * its address, live or cached: deallocate needs the size, and a pointer that
 * is not there (or is there but already cached) is a caller bug that must be
 * rejected rather than corrupt the accounting. Cached blocks are also on a
 * per-class stack, most recently given back first, so reuse touches the
 * warmest buffer and the idle ones sink to the bottom.
 *
 * All state is guarded by one mutex. The allocator is called with it held so
 * that "in use + cached <= limit" is exact even under concurrent allocations;
 * the price is that a slow cudaMalloc serialises other allocations, which is
 * what a cache exists to make rare.
 */
#include "memory_pool.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1ull << 20)
#define GIB (1ull << 30)

enum { MIN_CLASS = 256, INITIAL_BUCKETS = 64 };
#define GEOMETRIC_LIMIT (4 * MIB) /* 2^k and 1.5*2^k up to here, 1 MiB steps above */

static const char OOM_HINT[] = "reduce batch size or context length";

/* ---- configuration ---------------------------------------------------------- */

void bn_memory_pool_config_defaults(bn_memory_pool_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->max_pool_bytes = 2 * GIB;
    cfg->memory_limit_bytes = 0;
    cfg->max_cached_per_class = 1000;
    cfg->tracking = true;
    cfg->cleanup_interval_secs = 30;
    cfg->leak_threshold_secs = 300;
    cfg->device_id = 0;
}

bn_status bn_memory_pool_config_apply(const bn_config *cfg, const char *cuda_pool_size,
                                      bn_memory_pool_config *out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "memory pool config: NULL output");
    bn_memory_pool_config_defaults(out);
    if (cfg) {
        /* bn_config validated these when it read the environment; a config
         * built by hand gets the same limits here. */
        if (!(cfg->pool_size_gb > 0.0) || !(cfg->pool_size_gb <= 1024.0 * 1024.0))
            return bn_error_set(err, BN_ERR_INVALID_CONFIG, "fix or unset the variable",
                                "BITNET_POOL_SIZE_GB=%g is not valid: expected a number of "
                                "gigabytes above zero, at most 1048576",
                                cfg->pool_size_gb);
        if (cfg->cleanup_interval_secs < 0)
            return bn_error_set(err, BN_ERR_INVALID_CONFIG, "fix or unset the variable",
                                "BITNET_CLEANUP_INTERVAL_SECS=%d is not valid: expected 0 or more",
                                cfg->cleanup_interval_secs);
        if (cfg->leak_threshold_secs < 1)
            return bn_error_set(err, BN_ERR_INVALID_CONFIG, "fix or unset the variable",
                                "BITNET_LEAK_THRESHOLD_SECS=%d is not valid: expected 1 or more",
                                cfg->leak_threshold_secs);
        /* GB are binary here as everywhere in bitnet (bn_parse_memory_size). */
        out->max_pool_bytes = (uint64_t)llround(cfg->pool_size_gb * (double)GIB);
        if (out->max_pool_bytes == 0)
            out->max_pool_bytes = 1;
        out->cleanup_interval_secs = (uint32_t)cfg->cleanup_interval_secs;
        out->leak_threshold_secs = (uint32_t)cfg->leak_threshold_secs;
    }
    if (cuda_pool_size) {
        uint64_t bytes;
        if (!bn_parse_memory_size(cuda_pool_size, &bytes))
            return bn_error_set(err, BN_ERR_INVALID_CONFIG, "fix or unset the variable",
                                "CUDA_MEMORY_POOL_SIZE='%.100s' is not valid: expected a size above "
                                "zero such as 2GB, 512MB, 1.5GiB or a byte count (KB/MB/GB are "
                                "powers of 1024)",
                                cuda_pool_size);
        out->max_pool_bytes = bytes;
    }
    if (cfg && cfg->memory_limit_bytes > 0) {
        out->memory_limit_bytes = cfg->memory_limit_bytes;
        if (out->max_pool_bytes > cfg->memory_limit_bytes)
            out->max_pool_bytes = cfg->memory_limit_bytes;
    }
    return BN_OK;
}

bn_status bn_memory_pool_config_from_env(const bn_config *cfg, bn_memory_pool_config *out,
                                         bn_error *err)
{
    bn_config env_cfg;
    if (!cfg) {
        bn_status st = bn_config_from_env(&env_cfg, err);
        if (st != BN_OK)
            return st;
        cfg = &env_cfg;
    }
    return bn_memory_pool_config_apply(cfg, getenv("CUDA_MEMORY_POOL_SIZE"), out, err);
}

uint64_t bn_memory_pool_class_size(uint64_t bytes)
{
    if (bytes == 0)
        return 0;
    if (bytes <= MIN_CLASS)
        return MIN_CLASS;
    if (bytes <= GEOMETRIC_LIMIT) {
        /* 2^k < bytes <= 2^(k+1): the class is 1.5*2^k if that fits, else 2^(k+1). */
        uint64_t upper = MIN_CLASS;
        while (upper < bytes)
            upper <<= 1;
        uint64_t mid = (upper >> 1) + (upper >> 2);
        return bytes <= mid ? mid : upper;
    }
    if (bytes > UINT64_MAX - (MIB - 1))
        return 0;
    return (bytes + MIB - 1) / MIB * MIB;
}

/* ---- pool state --------------------------------------------------------------- */

typedef enum block_state { BLOCK_LIVE, BLOCK_CACHED } block_state;

typedef struct block {
    void *ptr;
    uint64_t size;      /* class bytes: what the allocator gave us */
    uint64_t requested; /* what the caller asked for (live blocks) */
    uint64_t stamp_ns;  /* live: allocated at; cached: given back at */
    block_state state;
    struct block *hash_next;
    struct block *class_next; /* cached blocks only */
    bn_backtrace bt;
} block;

typedef struct size_class {
    uint64_t size;
    uint32_t count;
    block *head; /* most recently given back first */
} size_class;

struct bn_memory_pool {
    pthread_mutex_t lock;
    bn_memory_pool_config cfg;
    bn_pool_allocator alloc;
    bn_pool_clock_fn now;
    void *now_ctx;
    uint64_t last_cleanup_ns;

    block **buckets; /* n_buckets is a power of two */
    size_t n_buckets;
    size_t n_blocks;

    size_class *classes; /* sorted by size; grown on demand, never shrunk */
    size_t n_classes, cap_classes;

    bn_memory_pool_stats st;
};

static uint64_t default_clock(void *ctx)
{
    (void)ctx;
    return bn_time_ns();
}

static uint64_t pool_now(const bn_memory_pool *p) { return p->now(p->now_ctx); }

static size_t bucket_of(const bn_memory_pool *p, const void *ptr)
{
    /* Device addresses are 256-aligned: drop the low bits, then mix. */
    uint64_t h = ((uint64_t)(uintptr_t)ptr >> 8) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (p->n_buckets - 1);
}

static block *hash_find(const bn_memory_pool *p, const void *ptr)
{
    for (block *b = p->buckets[bucket_of(p, ptr)]; b; b = b->hash_next)
        if (b->ptr == ptr)
            return b;
    return NULL;
}

static void hash_insert(bn_memory_pool *p, block *b)
{
    size_t i = bucket_of(p, b->ptr);
    b->hash_next = p->buckets[i];
    p->buckets[i] = b;
    p->n_blocks++;
}

static void hash_remove(bn_memory_pool *p, block *b)
{
    for (block **link = &p->buckets[bucket_of(p, b->ptr)]; *link; link = &(*link)->hash_next) {
        if (*link == b) {
            *link = b->hash_next;
            p->n_blocks--;
            return;
        }
    }
}

/* Doubling keeps chains short; if the host is out of memory the table just
 * keeps its size and gets slower, which is better than failing the caller. */
static void hash_maybe_grow(bn_memory_pool *p)
{
    if (p->n_blocks < p->n_buckets)
        return;
    size_t n = p->n_buckets * 2;
    block **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;
    block **old = p->buckets;
    size_t old_n = p->n_buckets;
    p->buckets = nb;
    p->n_buckets = n;
    for (size_t i = 0; i < old_n; i++) {
        block *b = old[i];
        while (b) {
            block *next = b->hash_next;
            size_t j = bucket_of(p, b->ptr);
            b->hash_next = nb[j];
            nb[j] = b;
            b = next;
        }
    }
    free(old);
}

/* Index of the class of exactly `size`, or where it would be inserted. */
static size_t class_search(const bn_memory_pool *p, uint64_t size, bool *found)
{
    size_t lo = 0, hi = p->n_classes;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->classes[mid].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < p->n_classes && p->classes[lo].size == size;
    return lo;
}

static size_class *class_find(bn_memory_pool *p, uint64_t size)
{
    bool found;
    size_t i = class_search(p, size, &found);
    return found ? &p->classes[i] : NULL;
}

/* NULL only when the host is out of memory. */
static size_class *class_get(bn_memory_pool *p, uint64_t size)
{
    bool found;
    size_t i = class_search(p, size, &found);
    if (found)
        return &p->classes[i];
    if (p->n_classes == p->cap_classes) {
        size_t cap = p->cap_classes ? p->cap_classes * 2 : 32;
        size_class *nc = realloc(p->classes, cap * sizeof *nc);
        if (!nc)
            return NULL;
        p->classes = nc;
        p->cap_classes = cap;
    }
    memmove(&p->classes[i + 1], &p->classes[i], (p->n_classes - i) * sizeof *p->classes);
    p->classes[i] = (size_class){.size = size, .count = 0, .head = NULL};
    p->n_classes++;
    return &p->classes[i];
}

/* Hands a block's buffer back to the allocator and forgets the block. The
 * caller has already unlinked it from its class stack if it was cached. */
static void release_block(bn_memory_pool *p, block *b)
{
    if (b->state == BLOCK_CACHED) {
        p->st.bytes_cached -= b->size;
        p->st.buffers_cached--;
    }
    hash_remove(p, b);
    p->alloc.free(p->alloc.ctx, b->ptr);
    p->st.device_frees++;
    free(b);
}

/* Frees cached buffers, largest classes first (fewest frees to make room),
 * until `enough` says to stop. Returns how many were freed. */
static size_t evict_until(bn_memory_pool *p, bool (*enough)(const bn_memory_pool *, uint64_t),
                          uint64_t arg)
{
    size_t freed = 0;
    for (size_t i = p->n_classes; i-- > 0;) {
        size_class *c = &p->classes[i];
        while (c->head) {
            if (enough && enough(p, arg))
                return freed;
            block *b = c->head;
            c->head = b->class_next;
            c->count--;
            release_block(p, b);
            freed++;
        }
    }
    return freed;
}

static bool fits_limit(const bn_memory_pool *p, uint64_t extra)
{
    return p->st.bytes_in_use + p->st.bytes_cached + extra <= p->cfg.memory_limit_bytes;
}

static size_t cleanup_locked(bn_memory_pool *p, uint64_t now)
{
    p->last_cleanup_ns = now;
    if (p->cfg.cleanup_interval_secs == 0)
        return 0;
    const uint64_t idle_max = (uint64_t)p->cfg.cleanup_interval_secs * 1000000000ull;
    size_t freed = 0;
    for (size_t i = 0; i < p->n_classes; i++) {
        size_class *c = &p->classes[i];
        block **link = &c->head;
        while (*link) {
            block *b = *link;
            if (now > b->stamp_ns && now - b->stamp_ns > idle_max) {
                *link = b->class_next;
                c->count--;
                release_block(p, b);
                freed++;
            } else {
                link = &b->class_next;
            }
        }
    }
    return freed;
}

/* ---- public API ------------------------------------------------------------------ */

bn_status bn_memory_pool_create(const bn_memory_pool_config *cfg,
                                const bn_pool_allocator *allocator, bn_memory_pool **out,
                                bn_error *err)
{
    if (out)
        *out = NULL;
    if (!cfg || !allocator || !out || !allocator->alloc || !allocator->free)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "memory pool: NULL config, allocator, allocator function or output");
    bn_memory_pool *p = calloc(1, sizeof *p);
    if (!p)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "memory pool: out of host memory");
    p->buckets = calloc(INITIAL_BUCKETS, sizeof *p->buckets);
    if (!p->buckets) {
        free(p);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "memory pool: out of host memory");
    }
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p->buckets);
        free(p);
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "memory pool: cannot create its mutex");
    }
    p->n_buckets = INITIAL_BUCKETS;
    p->cfg = *cfg;
    p->alloc = *allocator;
    if (!p->alloc.name)
        p->alloc.name = "allocator";
    p->now = default_clock;
    p->last_cleanup_ns = pool_now(p);
    *out = p;
    return BN_OK;
}

void bn_memory_pool_destroy(bn_memory_pool *p)
{
    if (!p)
        return;
    if (p->st.buffers_in_use > 0)
        bn_log(BN_LOG_WARN,
               "memory pool on device %d destroyed with %" PRIu64 " buffers (%" PRIu64
               " bytes) still in use; freeing them",
               p->cfg.device_id, p->st.buffers_in_use, p->st.bytes_in_use);
    for (size_t i = 0; i < p->n_buckets; i++) {
        block *b = p->buckets[i];
        while (b) {
            block *next = b->hash_next;
            p->alloc.free(p->alloc.ctx, b->ptr);
            free(b);
            b = next;
        }
    }
    free(p->buckets);
    free(p->classes);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void bn_memory_pool_set_clock(bn_memory_pool *p, bn_pool_clock_fn now, void *ctx)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->now = now ? now : default_clock;
    p->now_ctx = now ? ctx : NULL;
    p->last_cleanup_ns = pool_now(p);
    pthread_mutex_unlock(&p->lock);
}

int bn_memory_pool_device_id(const bn_memory_pool *p) { return p ? p->cfg.device_id : -1; }

/* Accounting shared by both ways a buffer goes out. */
static void hand_out(bn_memory_pool *p, block *b, uint64_t requested, uint64_t now,
                     const bn_backtrace *bt)
{
    b->state = BLOCK_LIVE;
    b->requested = requested;
    b->stamp_ns = now;
    b->class_next = NULL;
    if (bt)
        b->bt = *bt;
    else
        b->bt.depth = 0;
    p->st.bytes_in_use += b->size;
    if (p->st.bytes_in_use > p->st.peak_bytes_in_use)
        p->st.peak_bytes_in_use = p->st.bytes_in_use;
    p->st.requested_bytes_in_use += requested;
    p->st.buffers_in_use++;
    p->st.total_allocated_bytes += b->size;
    p->st.allocation_count++;
}

static bn_status allocate_locked(bn_memory_pool *p, uint64_t bytes, uint64_t cls, void **ptr,
                                 const bn_backtrace *bt, bn_error *err)
{
    const uint64_t now = pool_now(p);
    if (p->cfg.cleanup_interval_secs > 0 && now >= p->last_cleanup_ns &&
        now - p->last_cleanup_ns >= (uint64_t)p->cfg.cleanup_interval_secs * 1000000000ull)
        cleanup_locked(p, now);

    size_class *c = class_find(p, cls);
    if (c && c->head) {
        block *b = c->head;
        c->head = b->class_next;
        c->count--;
        p->st.bytes_cached -= b->size;
        p->st.buffers_cached--;
        p->st.cache_hits++;
        hand_out(p, b, bytes, now, bt);
        *ptr = b->ptr;
        return BN_OK;
    }
    p->st.cache_misses++;

    const uint64_t limit = p->cfg.memory_limit_bytes;
    if (limit > 0) {
        if (!fits_limit(p, cls))
            evict_until(p, fits_limit, cls);
        if (!fits_limit(p, cls))
            return bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY,
                                "reduce batch size or context length, or raise BITNET_MEMORY_LIMIT",
                                "device %d: allocating %" PRIu64 " bytes (class %" PRIu64
                                ") would exceed BITNET_MEMORY_LIMIT=%" PRIu64 " bytes with %" PRIu64
                                " bytes in use",
                                p->cfg.device_id, bytes, cls, limit, p->st.bytes_in_use);
    }

    block *b = calloc(1, sizeof *b);
    if (!b)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "memory pool: out of host memory for a buffer record");
    hash_maybe_grow(p);

    bn_error inner;
    bn_error_clear(&inner);
    void *got = NULL;
    bn_status st = p->alloc.alloc(p->alloc.ctx, cls, &got, &inner);
    if (st == BN_ERR_GPU_OUT_OF_MEMORY) {
        /* Cached buffers may be what fills the device (or fragments it):
         * give them all back and try once more. */
        size_t freed = evict_until(p, NULL, 0);
        if (freed > 0) {
            bn_log(BN_LOG_INFO, "memory pool: device %d out of memory, freed %zu cached buffers "
                                "and retrying",
                   p->cfg.device_id, freed);
            bn_error_clear(&inner);
            got = NULL;
            st = p->alloc.alloc(p->alloc.ctx, cls, &got, &inner);
        }
    }
    if (st == BN_OK && !got)
        st = bn_error_set(&inner, BN_ERR_INTERNAL, NULL, "%s allocator returned NULL",
                          p->alloc.name);
    if (st == BN_OK && hash_find(p, got)) {
        /* Never hand out one address twice; leave the mystery buffer alone. */
        st = bn_error_set(&inner, BN_ERR_INTERNAL, NULL,
                          "%s allocator returned %p, which the pool already owns", p->alloc.name,
                          got);
    }
    if (st != BN_OK) {
        free(b);
        if (st == BN_ERR_GPU_OUT_OF_MEMORY)
            return bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY, OOM_HINT,
                                "device %d: cannot allocate %" PRIu64 " bytes (class %" PRIu64
                                "; %" PRIu64 " bytes in use by the pool): %s",
                                p->cfg.device_id, bytes, cls, p->st.bytes_in_use,
                                inner.message[0] ? inner.message : "out of memory");
        if (err)
            *err = inner;
        return st;
    }
    p->st.device_allocs++;
    b->ptr = got;
    b->size = cls;
    hash_insert(p, b);
    hand_out(p, b, bytes, now, bt);
    *ptr = got;
    return BN_OK;
}

bn_status bn_memory_pool_allocate(bn_memory_pool *p, uint64_t bytes, void **ptr, bn_error *err)
{
    if (ptr)
        *ptr = NULL;
    if (!p || !ptr)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "memory pool allocate: NULL pool or output");
    if (bytes == 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "memory pool allocate: a buffer of 0 bytes");
    const uint64_t cls = bn_memory_pool_class_size(bytes);
    /* The stack is captured outside the lock: in debug builds it is slow. */
    bn_backtrace bt;
    bt.depth = 0;
    if (p->cfg.tracking)
        bn_backtrace_capture(&bt, 1);

    pthread_mutex_lock(&p->lock);
    bn_status st;
    if (cls == 0) {
        p->st.failed_allocations++;
        st = bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY, OOM_HINT,
                          "device %d: %" PRIu64 " bytes is more than any device can hold",
                          p->cfg.device_id, bytes);
    } else {
        st = allocate_locked(p, bytes, cls, ptr, p->cfg.tracking ? &bt : NULL, err);
        if (st != BN_OK)
            p->st.failed_allocations++;
    }
    pthread_mutex_unlock(&p->lock);
    return st;
}

bn_status bn_memory_pool_deallocate(bn_memory_pool *p, void *ptr, bn_error *err)
{
    if (!p)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "memory pool deallocate: NULL pool");
    if (!ptr)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "memory pool deallocate: NULL pointer");
    pthread_mutex_lock(&p->lock);
    block *b = hash_find(p, ptr);
    if (!b || b->state != BLOCK_LIVE) {
        const bool cached = b != NULL;
        const int dev = p->cfg.device_id;
        pthread_mutex_unlock(&p->lock);
        if (cached)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "a buffer must be freed exactly once",
                                "memory pool deallocate: %p on device %d was already freed "
                                "(double free)",
                                ptr, dev);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "free a buffer through the pool that allocated it, exactly once",
                            "memory pool deallocate: %p is not a live buffer of the pool on "
                            "device %d (double free or foreign pointer)",
                            ptr, dev);
    }
    p->st.bytes_in_use -= b->size;
    p->st.requested_bytes_in_use -= b->requested;
    p->st.buffers_in_use--;
    p->st.deallocation_count++;

    /* Keep it only within the caching budget: what the pool holds does not
     * change by caching, so the test is simply whether it is within max. */
    size_class *c = NULL;
    if (p->cfg.max_cached_per_class > 0 &&
        p->st.bytes_in_use + p->st.bytes_cached + b->size <= p->cfg.max_pool_bytes)
        c = class_get(p, b->size);
    if (c && c->count < p->cfg.max_cached_per_class) {
        b->state = BLOCK_CACHED;
        b->stamp_ns = pool_now(p);
        b->requested = 0;
        b->class_next = c->head;
        c->head = b;
        c->count++;
        p->st.bytes_cached += b->size;
        p->st.buffers_cached++;
    } else {
        release_block(p, b);
    }
    pthread_mutex_unlock(&p->lock);
    return BN_OK;
}

void bn_memory_pool_get_stats(bn_memory_pool *p, bn_memory_pool_stats *out)
{
    if (!out)
        return;
    if (!p) {
        memset(out, 0, sizeof *out);
        return;
    }
    pthread_mutex_lock(&p->lock);
    *out = p->st;
    pthread_mutex_unlock(&p->lock);
}

void bn_memory_pool_reset_stats(bn_memory_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    bn_memory_pool_stats kept = {0};
    kept.bytes_in_use = p->st.bytes_in_use;
    kept.peak_bytes_in_use = p->st.bytes_in_use;
    kept.requested_bytes_in_use = p->st.requested_bytes_in_use;
    kept.bytes_cached = p->st.bytes_cached;
    kept.buffers_cached = p->st.buffers_cached;
    kept.buffers_in_use = p->st.buffers_in_use;
    p->st = kept;
    pthread_mutex_unlock(&p->lock);
}

size_t bn_memory_pool_cleanup_expired(bn_memory_pool *p)
{
    if (!p)
        return 0;
    pthread_mutex_lock(&p->lock);
    size_t n = cleanup_locked(p, pool_now(p));
    pthread_mutex_unlock(&p->lock);
    return n;
}

size_t bn_memory_pool_flush_cache(bn_memory_pool *p)
{
    if (!p)
        return 0;
    pthread_mutex_lock(&p->lock);
    size_t n = evict_until(p, NULL, 0);
    pthread_mutex_unlock(&p->lock);
    return n;
}

/* ---- leak reports ------------------------------------------------------------------ */

static int older_first(const void *a, const void *b)
{
    const block *x = *(const block *const *)a, *y = *(const block *const *)b;
    return (x->stamp_ns > y->stamp_ns) - (x->stamp_ns < y->stamp_ns);
}

bn_status bn_memory_pool_check_leaks(bn_memory_pool *p, double threshold_secs,
                                     bn_pool_leak *leaks, size_t max, size_t *count,
                                     bn_error *err)
{
    if (count)
        *count = 0;
    if (!p || !count || (max > 0 && !leaks) || isnan(threshold_secs))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "memory pool check_leaks: NULL pool, count or output, or NaN threshold");
    if (!p->cfg.tracking)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "create the pool with tracking on",
                            "memory pool check_leaks: tracking is off, so buffer ages are unknown");
    if (threshold_secs < 0)
        threshold_secs = (double)p->cfg.leak_threshold_secs;

    /* Compared in whole nanoseconds: in floating point a 250 s old buffer
     * can come out as 250.00000000000003 s, "older" than 250. */
    const uint64_t threshold_ns = threshold_secs >= 1.8e10
                                      ? UINT64_MAX
                                      : (uint64_t)llround(threshold_secs * 1e9);

    pthread_mutex_lock(&p->lock);
    const uint64_t now = pool_now(p);
    const size_t live = (size_t)p->st.buffers_in_use;
    block **found = malloc((live ? live : 1) * sizeof *found);
    if (!found) {
        pthread_mutex_unlock(&p->lock);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "memory pool check_leaks: out of host memory");
    }
    size_t n = 0;
    uint64_t leaked_bytes = 0;
    for (size_t i = 0; i < p->n_buckets; i++) {
        for (block *b = p->buckets[i]; b; b = b->hash_next) {
            if (b->state != BLOCK_LIVE || n == live)
                continue;
            const uint64_t age_ns = now > b->stamp_ns ? now - b->stamp_ns : 0;
            if (age_ns > threshold_ns) {
                found[n++] = b;
                leaked_bytes += b->size;
            }
        }
    }
    qsort(found, n, sizeof *found, older_first);
    const size_t shown = n < max ? n : max;
    for (size_t i = 0; i < shown; i++) {
        const block *b = found[i];
        leaks[i] = (bn_pool_leak){
            .device_id = p->cfg.device_id,
            .address = b->ptr,
            .size = b->size,
            .requested = b->requested,
            .age_seconds = (double)(now > b->stamp_ns ? now - b->stamp_ns : 0) * 1e-9,
            .backtrace = b->bt,
        };
    }
    const int dev = p->cfg.device_id;
    pthread_mutex_unlock(&p->lock);
    free(found);

    *count = n;
    if (n > 0) {
        bn_log(BN_LOG_WARN,
               "memory pool: %zu buffers (%" PRIu64 " bytes) on device %d live for more than "
               "%.1f s: possible leaks",
               n, leaked_bytes, dev, threshold_secs);
        char line[2048];
        for (size_t i = 0; i < shown; i++) {
            bn_pool_leak_format(&leaks[i], line, sizeof line);
            bn_log(BN_LOG_WARN, "%s", line);
        }
    }
    return BN_OK;
}

void bn_pool_leak_format(const bn_pool_leak *leak, char *buf, size_t size)
{
    if (!buf || size == 0)
        return;
    buf[0] = '\0';
    if (!leak)
        return;
    int w = snprintf(buf, size,
                     "device %d: %" PRIu64 " bytes (%" PRIu64 " requested) at %p allocated %.1f s "
                     "ago",
                     leak->device_id, leak->size, leak->requested, leak->address,
                     leak->age_seconds);
    if (w < 0 || (size_t)w >= size - 1 || leak->backtrace.depth == 0)
        return;
    buf[w] = '\n';
    buf[w + 1] = '\0';
    bn_backtrace_format(&leak->backtrace, buf + w + 1, size - (size_t)w - 1);
    /* bn_backtrace_format ends every frame with a newline; drop the last so
     * the record fits a log line like the others. */
    size_t len = strlen(buf);
    if (len > 0 && buf[len - 1] == '\n')
        buf[len - 1] = '\0';
}
