/*
 * memory_pool.c - device buffers with a purpose, a limit and a record; see
 * memory_pool.h.
 *
 * Every buffer the pool holds has a record in a hash table keyed by its
 * address, in use or kept: free needs the size, and a pointer that is not
 * there (or is there but already given back) is a caller bug that must be
 * rejected rather than corrupt the accounting. Kept buffers are also on a
 * stack per size (a "bin"), most recently given back first, so reuse takes
 * the warmest buffer.
 *
 * All state is guarded by one mutex. The allocator is called with it held
 * so that "reserved <= limit" is exact under concurrent allocations; the
 * price is that a slow cudaMalloc serialises other allocations, which
 * reuse exists to make rare.
 */
#include "memory_pool.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { INITIAL_BUCKETS = 64, PURPOSE_MAX = 48 };

typedef struct record {
    void *ptr;
    uint64_t bytes;
    uint64_t seq; /* allocation order, for the leak report */
    bool in_use;
    struct record *hash_next;
    struct record *kept_next; /* kept buffers only */
    char purpose[PURPOSE_MAX];
    bn_backtrace bt; /* where it was allocated (debug builds) */
} record;

typedef struct bin {
    uint64_t bytes;
    record *kept; /* most recently given back first */
} bin;

struct bn_memory_pool {
    pthread_mutex_t lock;
    char name[64];
    bn_pool_allocator alloc;

    record **buckets; /* n_buckets is a power of two */
    size_t n_buckets, n_records;

    bin *bins; /* sorted by size; grown on demand, never shrunk */
    size_t n_bins, cap_bins;

    uint64_t next_seq;
    bn_memory_pool_stats st;
};

/* "1.5 GiB", "812.3 MiB", "4.0 KiB", "255 bytes". */
static const char *fmt_bytes(char *buf, size_t size, uint64_t b)
{
    if (b >= (1ull << 30))
        snprintf(buf, size, "%.2f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(buf, size, "%.1f MiB", (double)b / (double)(1ull << 20));
    else if (b >= (1ull << 10))
        snprintf(buf, size, "%.1f KiB", (double)b / (double)(1ull << 10));
    else
        snprintf(buf, size, "%" PRIu64 " bytes", b);
    return buf;
}

/* A request's size, exact: "2.0 MiB (2097152 bytes)", "100 bytes". */
static const char *fmt_size(char *buf, size_t size, uint64_t b)
{
    char short_form[32];
    if (b < (1ull << 10))
        snprintf(buf, size, "%" PRIu64 " bytes", b);
    else
        snprintf(buf, size, "%s (%" PRIu64 " bytes)", fmt_bytes(short_form, sizeof short_form, b),
                 b);
    return buf;
}

/* ---- the record table ------------------------------------------------------------ */

static size_t bucket_of(const bn_memory_pool *p, const void *ptr)
{
    /* Device addresses are 256-aligned: drop the low bits, then mix. */
    uint64_t h = ((uint64_t)(uintptr_t)ptr >> 8) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (p->n_buckets - 1);
}

static record *hash_find(const bn_memory_pool *p, const void *ptr)
{
    for (record *r = p->buckets[bucket_of(p, ptr)]; r; r = r->hash_next)
        if (r->ptr == ptr)
            return r;
    return NULL;
}

static void hash_insert(bn_memory_pool *p, record *r)
{
    size_t i = bucket_of(p, r->ptr);
    r->hash_next = p->buckets[i];
    p->buckets[i] = r;
    p->n_records++;
}

static void hash_remove(bn_memory_pool *p, record *r)
{
    for (record **link = &p->buckets[bucket_of(p, r->ptr)]; *link; link = &(*link)->hash_next) {
        if (*link == r) {
            *link = r->hash_next;
            p->n_records--;
            return;
        }
    }
}

/* Doubling keeps chains short; if the host is out of memory the table just
 * keeps its size and gets slower, which is better than failing the caller. */
static void hash_maybe_grow(bn_memory_pool *p)
{
    if (p->n_records < p->n_buckets)
        return;
    size_t n = p->n_buckets * 2;
    record **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;
    record **old = p->buckets;
    size_t old_n = p->n_buckets;
    p->buckets = nb;
    p->n_buckets = n;
    for (size_t i = 0; i < old_n; i++) {
        record *r = old[i];
        while (r) {
            record *next = r->hash_next;
            size_t j = bucket_of(p, r->ptr);
            r->hash_next = nb[j];
            nb[j] = r;
            r = next;
        }
    }
    free(old);
}

/* ---- bins of kept buffers ------------------------------------------------------------- */

/* Index of the bin of exactly `bytes`, or where it would be inserted. */
static size_t bin_search(const bn_memory_pool *p, uint64_t bytes, bool *found)
{
    size_t lo = 0, hi = p->n_bins;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->bins[mid].bytes < bytes)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < p->n_bins && p->bins[lo].bytes == bytes;
    return lo;
}

static bin *bin_find(bn_memory_pool *p, uint64_t bytes)
{
    bool found;
    size_t i = bin_search(p, bytes, &found);
    return found ? &p->bins[i] : NULL;
}

/* NULL only when the host is out of memory. */
static bin *bin_get(bn_memory_pool *p, uint64_t bytes)
{
    bool found;
    size_t i = bin_search(p, bytes, &found);
    if (found)
        return &p->bins[i];
    if (p->n_bins == p->cap_bins) {
        size_t cap = p->cap_bins ? p->cap_bins * 2 : 16;
        bin *nb = realloc(p->bins, cap * sizeof *nb);
        if (!nb)
            return NULL;
        p->bins = nb;
        p->cap_bins = cap;
    }
    memmove(&p->bins[i + 1], &p->bins[i], (p->n_bins - i) * sizeof *p->bins);
    p->bins[i] = (bin){.bytes = bytes, .kept = NULL};
    p->n_bins++;
    return &p->bins[i];
}

/* Hands a buffer back to the allocator and forgets its record. A kept one
 * has already been taken off its bin's stack and out of buffers_kept. */
static void release(bn_memory_pool *p, record *r)
{
    p->st.bytes_reserved -= r->bytes;
    hash_remove(p, r);
    p->alloc.free(p->alloc.ctx, r->ptr);
    free(r);
}

static bool fits_limit(const bn_memory_pool *p, uint64_t extra)
{
    const uint64_t limit = p->st.memory_limit;
    return limit == 0 || (p->st.bytes_reserved <= limit && extra <= limit - p->st.bytes_reserved);
}

/* Releases kept buffers, largest first (the fewest to make room), until
 * `extra` more bytes fit the limit; all of them for extra UINT64_MAX.
 * Returns how many were released. */
static size_t release_kept(bn_memory_pool *p, uint64_t extra)
{
    size_t released = 0;
    for (size_t i = p->n_bins; i-- > 0;) {
        bin *b = &p->bins[i];
        while (b->kept) {
            if (extra != UINT64_MAX && fits_limit(p, extra))
                return released;
            record *r = b->kept;
            b->kept = r->kept_next;
            p->st.buffers_kept--;
            release(p, r);
            released++;
        }
    }
    return released;
}

/* ---- creation and destruction ------------------------------------------------------------ */

bn_status bn_memory_pool_create(const char *name, const bn_pool_allocator *allocator,
                                uint64_t memory_limit, bn_memory_pool **out, bn_error *err)
{
    if (out)
        *out = NULL;
    if (!allocator || !out || !allocator->alloc || !allocator->free)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "memory pool: NULL allocator, allocator function or output");
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
    snprintf(p->name, sizeof p->name, "%s", name ? name : "memory pool");
    p->alloc = *allocator;
    p->st.memory_limit = memory_limit;
    *out = p;
    return BN_OK;
}

static int allocated_first(const void *a, const void *b)
{
    const record *x = *(const record *const *)a, *y = *(const record *const *)b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Logs a record's allocation stack, one frame a line (debug builds). */
static void log_backtrace(const bn_backtrace *bt)
{
    if (bt->depth == 0)
        return;
    char text[4096];
    bn_backtrace_format(bt, text, sizeof text);
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        if (end)
            *end = '\0';
        bn_log(BN_LOG_WARN, "    %s", line);
        if (!end)
            break;
        line = end + 1;
    }
}

/* Buffers still in use when the pool goes: each one, in allocation order. */
static void report_leaks(bn_memory_pool *p)
{
    const size_t n = (size_t)p->st.buffers_in_use;
    char b1[32], b2[64];
    bn_log(BN_LOG_WARN, "%s: %zu buffer%s (%s) still allocated at destruction; freeing %s", p->name,
           n, n == 1 ? "" : "s", fmt_bytes(b1, sizeof b1, p->st.bytes_in_use),
           n == 1 ? "it" : "them");
    record **live = malloc(n * sizeof *live);
    size_t k = 0;
    for (size_t i = 0; live && i < p->n_buckets; i++)
        for (record *r = p->buckets[i]; r; r = r->hash_next)
            if (r->in_use && k < n)
                live[k++] = r;
    if (!live)
        return; /* no room to list them: the count above must do */
    qsort(live, k, sizeof *live, allocated_first);
    for (size_t i = 0; i < k; i++) {
        bn_log(BN_LOG_WARN, "  %s: %s at %p", live[i]->purpose,
               fmt_size(b2, sizeof b2, live[i]->bytes), live[i]->ptr);
        log_backtrace(&live[i]->bt);
    }
    free(live);
}

void bn_memory_pool_destroy(bn_memory_pool *p)
{
    if (!p)
        return;
    if (p->st.buffers_in_use > 0)
        report_leaks(p);
    for (size_t i = 0; i < p->n_buckets; i++) {
        record *r = p->buckets[i];
        while (r) {
            record *next = r->hash_next;
            p->alloc.free(p->alloc.ctx, r->ptr);
            free(r);
            r = next;
        }
    }
    free(p->buckets);
    free(p->bins);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void bn_memory_pool_set_limit(bn_memory_pool *p, uint64_t memory_limit)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->st.memory_limit = memory_limit;
    release_kept(p, 0);
    pthread_mutex_unlock(&p->lock);
}

/* ---- allocate and free ------------------------------------------------------------------ */

static void hand_out(bn_memory_pool *p, record *r, const char *purpose, const bn_backtrace *bt)
{
    r->in_use = true;
    r->kept_next = NULL;
    r->seq = p->next_seq++;
    snprintf(r->purpose, sizeof r->purpose, "%s", purpose);
    r->bt = *bt;
    p->st.bytes_in_use += r->bytes;
    if (p->st.bytes_in_use > p->st.peak_bytes_in_use)
        p->st.peak_bytes_in_use = p->st.bytes_in_use;
    p->st.buffers_in_use++;
    p->st.allocations++;
}

static bn_status allocate_locked(bn_memory_pool *p, uint64_t bytes, const char *purpose,
                                 void **ptr, const bn_backtrace *bt, bn_error *err)
{
    char want[64], used[32], held[32], limit[32];
    bin *b = bin_find(p, bytes);
    if (b && b->kept) {
        record *r = b->kept;
        b->kept = r->kept_next;
        p->st.buffers_kept--;
        p->st.reuses++;
        hand_out(p, r, purpose, bt);
        *ptr = r->ptr;
        return BN_OK;
    }

    if (!fits_limit(p, bytes))
        release_kept(p, bytes);
    if (!fits_limit(p, bytes))
        return bn_error_set(
            err, BN_ERR_GPU_OUT_OF_MEMORY,
            "raise the memory limit (BITNET_MEMORY_LIMIT) or reduce the context length",
            "%s: cannot allocate %s for %s: %s in use and the memory limit is %s", p->name,
            fmt_size(want, sizeof want, bytes), purpose,
            fmt_bytes(used, sizeof used, p->st.bytes_in_use),
            fmt_bytes(limit, sizeof limit, p->st.memory_limit));

    record *r = calloc(1, sizeof *r);
    if (!r)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "%s: out of host memory for a buffer record", p->name);
    hash_maybe_grow(p);

    bn_error inner;
    bn_error_clear(&inner);
    void *got = NULL;
    bn_status st = p->alloc.alloc(p->alloc.ctx, bytes, &got, &inner);
    if (st == BN_ERR_GPU_OUT_OF_MEMORY) {
        /* Kept buffers may be what fills the device (or fragments it):
         * release them all and try once more. */
        const size_t released = release_kept(p, UINT64_MAX);
        if (released > 0) {
            bn_log(BN_LOG_INFO, "%s: out of memory, released %zu kept buffers and retrying",
                   p->name, released);
            bn_error_clear(&inner);
            got = NULL;
            st = p->alloc.alloc(p->alloc.ctx, bytes, &got, &inner);
        }
    }
    if (st == BN_OK && !got)
        st = bn_error_set(&inner, BN_ERR_INTERNAL, NULL, "the allocator returned NULL");
    if (st == BN_OK && hash_find(p, got)) {
        /* Never hand out one address twice; leave the mystery buffer alone. */
        st = bn_error_set(&inner, BN_ERR_INTERNAL, NULL,
                          "the allocator returned %p, which the pool already holds", got);
    }
    if (st != BN_OK) {
        free(r);
        if (st == BN_ERR_GPU_OUT_OF_MEMORY)
            return bn_error_set(
                err, st, inner.hint[0] ? inner.hint : "reduce the context length",
                "%s: cannot allocate %s for %s with %s in use (%s reserved): %s", p->name,
                fmt_size(want, sizeof want, bytes), purpose,
                fmt_bytes(used, sizeof used, p->st.bytes_in_use),
                fmt_bytes(held, sizeof held, p->st.bytes_reserved),
                inner.message[0] ? inner.message : "out of memory");
        return bn_error_set(err, st, inner.hint[0] ? inner.hint : NULL,
                            "%s: allocating %" PRIu64 " bytes for %s: %s", p->name, bytes,
                            purpose, inner.message);
    }
    r->ptr = got;
    r->bytes = bytes;
    hash_insert(p, r);
    p->st.bytes_reserved += bytes;
    if (p->st.bytes_reserved > p->st.peak_bytes_reserved)
        p->st.peak_bytes_reserved = p->st.bytes_reserved;
    hand_out(p, r, purpose, bt);
    *ptr = got;
    return BN_OK;
}

bn_status bn_memory_pool_allocate(bn_memory_pool *p, uint64_t bytes, const char *purpose,
                                  void **ptr, bn_error *err)
{
    if (ptr)
        *ptr = NULL;
    if (!p || !ptr)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "memory pool allocate: NULL pool or output");
    if (!purpose)
        purpose = "unnamed";
    if (bytes == 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "%s: a buffer of 0 bytes for %s", p->name, purpose);
    /* The stack is captured outside the lock: in debug builds it is slow;
     * in release builds it records nothing. */
    bn_backtrace bt;
    bn_backtrace_capture(&bt, 1);

    pthread_mutex_lock(&p->lock);
    const bn_status st = allocate_locked(p, bytes, purpose, ptr, &bt, err);
    if (st != BN_OK)
        p->st.failures++;
    pthread_mutex_unlock(&p->lock);
    return st;
}

bn_status bn_memory_pool_free(bn_memory_pool *p, void *ptr, uint64_t *bytes, bn_error *err)
{
    if (bytes)
        *bytes = 0;
    if (!p)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "memory pool free: NULL pool");
    if (!ptr)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "%s: free of a NULL pointer",
                            p->name);
    pthread_mutex_lock(&p->lock);
    record *r = hash_find(p, ptr);
    if (!r || !r->in_use) {
        const bool kept = r != NULL;
        pthread_mutex_unlock(&p->lock);
        if (kept)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "a buffer must be freed exactly once",
                                "%s: %p was already freed (double free)", p->name, ptr);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "free a buffer through the pool that allocated it, exactly once",
                            "%s: %p is not a buffer of this pool in use (double free or "
                            "foreign pointer)",
                            p->name, ptr);
    }
    if (bytes)
        *bytes = r->bytes;
    p->st.bytes_in_use -= r->bytes;
    p->st.buffers_in_use--;
    p->st.frees++;
    r->in_use = false;
    bin *b = bin_get(p, r->bytes);
    if (b) {
        r->kept_next = b->kept;
        b->kept = r;
        p->st.buffers_kept++;
    } else {
        release(p, r); /* no host memory for a new bin: give it back instead */
    }
    pthread_mutex_unlock(&p->lock);
    return BN_OK;
}

/* ---- statistics ---------------------------------------------------------------------- */

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

int bn_memory_pool_stats_format(const bn_memory_pool_stats *s, char *buf, size_t size)
{
    if (!buf || size == 0)
        return 0;
    if (!s) {
        buf[0] = '\0';
        return 0;
    }
    char used[32], used_peak[32], held[32], held_peak[32], limit[32];
    return snprintf(buf, size,
                    "%s in use (peak %s), %s reserved (peak %s), limit %s; %" PRIu64
                    " allocations, %" PRIu64 " reused, %" PRIu64 " failed",
                    fmt_bytes(used, sizeof used, s->bytes_in_use),
                    fmt_bytes(used_peak, sizeof used_peak, s->peak_bytes_in_use),
                    fmt_bytes(held, sizeof held, s->bytes_reserved),
                    fmt_bytes(held_peak, sizeof held_peak, s->peak_bytes_reserved),
                    s->memory_limit ? fmt_bytes(limit, sizeof limit, s->memory_limit) : "none",
                    s->allocations, s->reuses, s->failures);
}
