/* The memory pool's bookkeeping on the CPU: a fake allocator stands in for
 * cudaMalloc (it can fail on demand, model a full device, counts its calls
 * and catches double frees) and a clock the test moves stands in for time. */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>

#include "bitnet.h"
#include "memory_pool.h"
#include "test_util.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define SEC 1000000000ull

/* ---- fake allocator ---------------------------------------------------------- */

typedef struct live_buf {
    void *p;
    uint64_t size;
} live_buf;

typedef struct fake_allocator {
    pthread_mutex_t lock;
    uint64_t capacity;      /* the "device": OOM beyond this many live bytes */
    int fail_next;          /* fail this many coming calls with fail_status */
    bn_status fail_status;
    bool null_next;         /* return BN_OK with NULL once (an allocator bug) */
    uint64_t alloc_calls, alloc_ok, free_calls, bad_frees;
    uint64_t live_bytes, peak_live_bytes;
    live_buf *live;
    size_t n_live, cap_live;
} fake_allocator;

static bn_status fake_alloc(void *ctx, uint64_t bytes, void **ptr, bn_error *err)
{
    fake_allocator *f = ctx;
    bn_status st = BN_OK;
    *ptr = NULL;
    pthread_mutex_lock(&f->lock);
    f->alloc_calls++;
    if (f->fail_next > 0) {
        f->fail_next--;
        st = bn_error_set(err, f->fail_status, NULL, "fake allocator: failing on request");
    } else if (f->null_next) {
        f->null_next = false; /* BN_OK with *ptr NULL */
    } else if (f->live_bytes + bytes > f->capacity) {
        st = bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY, NULL, "fake allocator: device full");
    } else {
        if (f->n_live == f->cap_live) {
            size_t cap = f->cap_live ? f->cap_live * 2 : 64;
            live_buf *nl = realloc(f->live, cap * sizeof *nl);
            if (nl) {
                f->live = nl;
                f->cap_live = cap;
            }
        }
        /* Real host memory, so tests can stamp buffers they hold. */
        void *p = f->n_live < f->cap_live ? malloc((size_t)bytes) : NULL;
        if (!p) {
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "fake allocator: host OOM");
        } else {
            f->live[f->n_live++] = (live_buf){p, bytes};
            f->live_bytes += bytes;
            if (f->live_bytes > f->peak_live_bytes)
                f->peak_live_bytes = f->live_bytes;
            f->alloc_ok++;
            *ptr = p;
        }
    }
    pthread_mutex_unlock(&f->lock);
    return st;
}

static void fake_free(void *ctx, void *ptr)
{
    fake_allocator *f = ctx;
    pthread_mutex_lock(&f->lock);
    f->free_calls++;
    size_t i = 0;
    while (i < f->n_live && f->live[i].p != ptr)
        i++;
    if (i == f->n_live) {
        f->bad_frees++; /* double free or a pointer we never gave out */
    } else {
        f->live_bytes -= f->live[i].size;
        free(f->live[i].p);
        f->live[i] = f->live[--f->n_live];
    }
    pthread_mutex_unlock(&f->lock);
}

static void fake_init(fake_allocator *f, uint64_t capacity)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->lock, NULL);
    f->capacity = capacity;
    f->fail_status = BN_ERR_GPU_OUT_OF_MEMORY;
}

static void fake_done(fake_allocator *f)
{
    for (size_t i = 0; i < f->n_live; i++)
        free(f->live[i].p);
    free(f->live);
    pthread_mutex_destroy(&f->lock);
}

static bn_pool_allocator fake_vtable(fake_allocator *f)
{
    return (bn_pool_allocator){.name = "fake", .alloc = fake_alloc, .free = fake_free, .ctx = f};
}

/* ---- a clock the test moves ---------------------------------------------------- */

static uint64_t test_clock(void *ctx) { return *(const uint64_t *)ctx; }

/* ---- helpers ---------------------------------------------------------------------- */

static bn_memory_pool *make_pool(const bn_memory_pool_config *cfg, fake_allocator *f)
{
    bn_pool_allocator a = fake_vtable(f);
    bn_memory_pool *pool = NULL;
    bn_error err;
    bn_status st = bn_memory_pool_create(cfg, &a, &pool, &err);
    CHECK_MSG(st == BN_OK && pool, "create: %s", err.message);
    return pool;
}

static void *must_alloc(bn_memory_pool *pool, uint64_t bytes)
{
    void *p = NULL;
    bn_error err;
    bn_status st = bn_memory_pool_allocate(pool, bytes, &p, &err);
    CHECK_MSG(st == BN_OK && p, "allocate %" PRIu64 ": %s", bytes, err.message);
    return p;
}

static void must_free(bn_memory_pool *pool, void *p)
{
    bn_error err;
    bn_status st = bn_memory_pool_deallocate(pool, p, &err);
    CHECK_MSG(st == BN_OK, "deallocate %p: %s", p, err.message);
}

static bn_memory_pool_stats stats_of(bn_memory_pool *pool)
{
    bn_memory_pool_stats s;
    bn_memory_pool_get_stats(pool, &s);
    return s;
}

/* ---- size classes ------------------------------------------------------------------ */

static void test_classes(void)
{
    static const struct {
        uint64_t bytes, cls;
    } table[] = {
        {0, 0},
        {1, 256},
        {255, 256},
        {256, 256},
        {257, 384},
        {384, 384},
        {385, 512},
        {512, 512},
        {513, 768},
        {1000, 1024},
        {1025, 1536},
        {1536, 1536},
        {1537, 2048},
        {3 * MIB - 1, 3 * MIB},
        {3 * MIB, 3 * MIB},
        {3 * MIB + 1, 4 * MIB},
        {4 * MIB, 4 * MIB},
        {4 * MIB + 1, 5 * MIB},
        {5 * MIB, 5 * MIB},
        {100 * MIB + 1, 101 * MIB},
        {3 * GIB + 7, 3 * GIB + MIB},
        {UINT64_MAX - MIB + 1, UINT64_MAX - MIB + 1},
        {UINT64_MAX - MIB + 2, 0},
        {UINT64_MAX, 0},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        uint64_t got = bn_memory_pool_class_size(table[i].bytes);
        CHECK_MSG(got == table[i].cls, "class(%" PRIu64 ") = %" PRIu64 ", want %" PRIu64,
                  table[i].bytes, got, table[i].cls);
    }

    /* The documented waste bound, on random sizes from 256 B to 64 GiB. */
    uint64_t prev_bytes = 0, prev_cls = 0;
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        const int shift = (int)test_rand_range(8, 36);
        const uint64_t bytes = (uint64_t)test_rand_range(1ll << (shift - 1), 1ll << shift) | 256;
        const uint64_t cls = bn_memory_pool_class_size(bytes);
        bool ok = cls >= bytes && (cls - bytes) * 3 < cls &&
                  bn_memory_pool_class_size(cls) == cls &&
                  (bytes <= 4 * MIB || (cls - bytes < MIB && cls % MIB == 0));
        /* Monotonic: a bigger request never gets a smaller class. */
        if (prev_bytes && ((bytes >= prev_bytes && cls < prev_cls) ||
                           (bytes <= prev_bytes && cls > prev_cls)))
            ok = false;
        if (!ok && bad++ < 5)
            CHECK_MSG(ok, "class(%" PRIu64 ") = %" PRIu64 " breaks the bound", bytes, cls);
        prev_bytes = bytes;
        prev_cls = cls;
    }
    CHECK(bad == 0);
}

/* ---- every statistic after a scripted sequence ---------------------------------------- */

static void test_stats_sequence(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool_config cfg;
    bn_memory_pool_config_defaults(&cfg);
    cfg.device_id = 2;
    bn_memory_pool *pool = make_pool(&cfg, &f);
    CHECK(bn_memory_pool_device_id(pool) == 2);

    bn_memory_pool_stats s = stats_of(pool);
    CHECK(s.bytes_in_use == 0 && s.peak_bytes_in_use == 0 && s.allocation_count == 0 &&
          s.bytes_cached == 0 && s.cache_hits == 0 && s.cache_misses == 0);

    void *a = must_alloc(pool, 1000); /* class 1024 */
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 1024 && s.requested_bytes_in_use == 1000);
    CHECK(s.peak_bytes_in_use == 1024 && s.total_allocated_bytes == 1024);
    CHECK(s.allocation_count == 1 && s.cache_misses == 1 && s.cache_hits == 0);
    CHECK(s.device_allocs == 1 && f.alloc_calls == 1 && s.buffers_in_use == 1);

    void *b = must_alloc(pool, 3000); /* class 3072 */
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 4096 && s.peak_bytes_in_use == 4096);
    CHECK(s.total_allocated_bytes == 4096 && s.allocation_count == 2 && s.cache_misses == 2);

    must_free(pool, a);
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 3072 && s.requested_bytes_in_use == 3000);
    CHECK(s.bytes_cached == 1024 && s.buffers_cached == 1 && s.deallocation_count == 1);
    CHECK(s.device_frees == 0 && f.free_calls == 0);
    CHECK(s.peak_bytes_in_use == 4096);

    void *c = must_alloc(pool, 900); /* class 1024 again: served from the cache */
    CHECK(c == a);
    s = stats_of(pool);
    CHECK(s.cache_hits == 1 && s.cache_misses == 2 && s.device_allocs == 2 && f.alloc_calls == 2);
    CHECK(s.bytes_in_use == 4096 && s.requested_bytes_in_use == 3900 && s.bytes_cached == 0);
    CHECK(s.total_allocated_bytes == 5120 && s.allocation_count == 3);

    void *d = must_alloc(pool, 5000); /* class 6144: a miss, new peak */
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 10240 && s.peak_bytes_in_use == 10240 && s.cache_misses == 3);

    must_free(pool, b);
    must_free(pool, c);
    must_free(pool, d);
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 0 && s.requested_bytes_in_use == 0 && s.buffers_in_use == 0);
    CHECK(s.bytes_cached == 1024 + 3072 + 6144 && s.buffers_cached == 3);
    CHECK(s.peak_bytes_in_use == 10240 && s.total_allocated_bytes == 11264);
    CHECK(s.allocation_count == 4 && s.deallocation_count == 4);
    CHECK(s.failed_allocations == 0 && s.device_frees == 0);

    bn_memory_pool_reset_stats(pool);
    s = stats_of(pool);
    CHECK(s.allocation_count == 0 && s.deallocation_count == 0 && s.cache_hits == 0 &&
          s.cache_misses == 0 && s.total_allocated_bytes == 0 && s.device_allocs == 0);
    CHECK(s.peak_bytes_in_use == 0); /* restarted from bytes in use */
    CHECK(s.bytes_cached == 10240 && s.buffers_cached == 3); /* the present is kept */

    void *e = must_alloc(pool, 2500); /* 3072: a hit after the reset */
    s = stats_of(pool);
    CHECK(e == b && s.cache_hits == 1 && s.peak_bytes_in_use == 3072);
    must_free(pool, e);

    CHECK(bn_memory_pool_flush_cache(pool) == 3);
    s = stats_of(pool);
    CHECK(s.bytes_cached == 0 && s.buffers_cached == 0 && s.device_frees == 3);
    CHECK(f.n_live == 0 && f.bad_frees == 0);

    bn_memory_pool_destroy(pool);
    CHECK(f.alloc_ok == f.free_calls && f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

/* ---- caching limits ------------------------------------------------------------------------ */

static void test_max_cached_per_class(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool_config cfg;
    bn_memory_pool_config_defaults(&cfg);
    cfg.max_cached_per_class = 2;
    bn_memory_pool *pool = make_pool(&cfg, &f);

    void *p[3], *q = NULL;
    for (int i = 0; i < 3; i++)
        p[i] = must_alloc(pool, 700); /* class 768 */
    q = must_alloc(pool, 100);        /* class 256: its own class, own limit */
    for (int i = 0; i < 3; i++)
        must_free(pool, p[i]);
    must_free(pool, q);
    bn_memory_pool_stats s = stats_of(pool);
    CHECK(s.buffers_cached == 3 && s.bytes_cached == 2 * 768 + 256);
    CHECK(s.device_frees == 1 && f.n_live == 3);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);

    /* 0 turns the cache off: every free goes to the allocator. */
    cfg.max_cached_per_class = 0;
    pool = make_pool(&cfg, &f);
    void *a = must_alloc(pool, 5000);
    must_free(pool, a);
    s = stats_of(pool);
    CHECK(s.buffers_cached == 0 && s.device_frees == 1 && f.n_live == 0);
    a = must_alloc(pool, 5000);
    s = stats_of(pool);
    CHECK(s.cache_hits == 0 && s.cache_misses == 2);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

static void test_pool_max(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool_config cfg;
    bn_memory_pool_config_defaults(&cfg);
    cfg.max_pool_bytes = 4096;
    bn_memory_pool *pool = make_pool(&cfg, &f);

    void *p[3];
    for (int i = 0; i < 3; i++)
        p[i] = must_alloc(pool, 2048);
    /* In use 6144 > 4096: the first one freed cannot be kept. */
    must_free(pool, p[0]);
    bn_memory_pool_stats s = stats_of(pool);
    CHECK(s.bytes_cached == 0 && s.device_frees == 1);
    /* Now the pool holds 4096: caching keeps it at 4096, within the budget. */
    must_free(pool, p[1]);
    must_free(pool, p[2]);
    s = stats_of(pool);
    CHECK(s.bytes_cached == 4096 && s.buffers_cached == 2 && s.device_frees == 1);

    /* The budget limits caching, never allocation: a bigger buffer is fine. */
    void *big = must_alloc(pool, MIB);
    s = stats_of(pool);
    CHECK(big && s.bytes_in_use == MIB);
    must_free(pool, big);
    s = stats_of(pool);
    CHECK(s.bytes_cached == 4096 && s.device_frees == 2);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

static void test_memory_limit(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_config bcfg;
    bn_config_defaults(&bcfg);
    bcfg.memory_limit_bytes = 8192;
    bn_memory_pool_config cfg;
    bn_error err;
    CHECK(bn_memory_pool_config_apply(&bcfg, NULL, &cfg, &err) == BN_OK);
    CHECK(cfg.memory_limit_bytes == 8192 && cfg.max_pool_bytes == 8192);
    bn_memory_pool *pool = make_pool(&cfg, &f);

    void *a = must_alloc(pool, 4096);
    void *b = must_alloc(pool, 4096);
    void *c = NULL;
    const uint64_t calls = f.alloc_calls;
    bn_status st = bn_memory_pool_allocate(pool, 1, &c, &err);
    CHECK(st == BN_ERR_GPU_OUT_OF_MEMORY && c == NULL);
    CHECK_STR_CONTAINS(err.message, "BITNET_MEMORY_LIMIT");
    CHECK_STR_CONTAINS(err.hint, "reduce batch size or context length");
    CHECK(f.alloc_calls == calls); /* refused before asking the device */

    must_free(pool, a); /* cached: the pool still holds 8192 */
    bn_memory_pool_stats s = stats_of(pool);
    CHECK(s.bytes_cached == 4096 && s.bytes_in_use == 4096);
    /* A different class must evict the cached buffer to stay under the cap. */
    c = must_alloc(pool, 3000);
    s = stats_of(pool);
    CHECK(s.bytes_cached == 0 && s.bytes_in_use == 4096 + 3072 && s.device_frees == 1);
    CHECK(f.peak_live_bytes <= 8192);
    /* A request bigger than the cap itself fails however empty the pool is. */
    must_free(pool, b);
    must_free(pool, c);
    void *d = NULL;
    CHECK(bn_memory_pool_allocate(pool, 8193, &d, &err) == BN_ERR_GPU_OUT_OF_MEMORY);
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 0 && s.bytes_cached == 0 && s.failed_allocations == 2);
    CHECK(f.peak_live_bytes <= 8192 && f.n_live == 0);
    bn_memory_pool_destroy(pool);
    fake_done(&f);
}

/* ---- allocator failures ------------------------------------------------------------------------ */

static void test_allocator_failure(void)
{
    fake_allocator f;
    fake_init(&f, 8192); /* a tiny device */
    bn_memory_pool_config cfg;
    bn_memory_pool_config_defaults(&cfg);
    bn_memory_pool *pool = make_pool(&cfg, &f);
    bn_error err;

    void *a = must_alloc(pool, 4096);
    void *b = must_alloc(pool, 4096);
    must_free(pool, a);
    must_free(pool, b); /* the device is full of cached buffers */
    uint64_t calls = f.alloc_calls;
    void *c = must_alloc(pool, 2048); /* fails, the cache is flushed, the retry works */
    bn_memory_pool_stats s = stats_of(pool);
    CHECK(c != NULL && f.alloc_calls == calls + 2);
    CHECK(s.bytes_cached == 0 && s.buffers_cached == 0 && s.device_frees == 2);
    CHECK(s.failed_allocations == 0 && s.bytes_in_use == 2048);

    /* Nothing cached to free: no pointless retry, and an error with a hint. */
    calls = f.alloc_calls;
    void *d = (void *)&d;
    bn_status st = bn_memory_pool_allocate(pool, 8192, &d, &err);
    CHECK(st == BN_ERR_GPU_OUT_OF_MEMORY && d == NULL);
    CHECK(f.alloc_calls == calls + 1);
    CHECK_STR_CONTAINS(err.hint, "reduce batch size or context length");
    CHECK_STR_CONTAINS(err.message, "8192");
    CHECK_STR_CONTAINS(err.message, "device full");

    /* Something cached, still not enough: one retry, then the error. */
    must_free(pool, c);
    calls = f.alloc_calls;
    st = bn_memory_pool_allocate(pool, 16384, &d, &err);
    s = stats_of(pool);
    CHECK(st == BN_ERR_GPU_OUT_OF_MEMORY && f.alloc_calls == calls + 2);
    CHECK(s.bytes_cached == 0 && s.failed_allocations == 2 && s.bytes_in_use == 0);

    /* Failing on demand: the first call fails, the retry after the flush works. */
    a = must_alloc(pool, 1000);
    must_free(pool, a);
    f.fail_next = 1;
    calls = f.alloc_calls;
    b = must_alloc(pool, 3000);
    CHECK(f.alloc_calls == calls + 2);
    must_free(pool, b);

    /* Other errors are not out-of-memory: passed through, cache untouched. */
    s = stats_of(pool);
    const uint64_t cached = s.bytes_cached;
    f.fail_next = 1;
    f.fail_status = BN_ERR_GPU;
    st = bn_memory_pool_allocate(pool, 100000, &d, &err);
    CHECK(st == BN_ERR_GPU && d == NULL);
    CHECK_STR_CONTAINS(err.message, "failing on request");
    s = stats_of(pool);
    CHECK(s.bytes_cached == cached && cached > 0);
    f.fail_status = BN_ERR_GPU_OUT_OF_MEMORY;

    /* An allocator that says OK but gives NULL is a bug, not a buffer. */
    f.null_next = true;
    st = bn_memory_pool_allocate(pool, 100000, &d, &err);
    CHECK(st == BN_ERR_INTERNAL && d == NULL);

    /* A size no device can hold never reaches the allocator. */
    calls = f.alloc_calls;
    st = bn_memory_pool_allocate(pool, UINT64_MAX, &d, &err);
    CHECK(st == BN_ERR_GPU_OUT_OF_MEMORY && f.alloc_calls == calls);
    CHECK_STR_CONTAINS(err.hint, "reduce batch size or context length");

    /* And the pool is still usable. */
    a = must_alloc(pool, 500);
    must_free(pool, a);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0 && f.alloc_ok == f.free_calls);
    fake_done(&f);
}

/* ---- leaks and cleanup ---------------------------------------------------------------------------- */

static void test_leaks(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool_config cfg;
    bn_memory_pool_config_defaults(&cfg);
    cfg.device_id = 3;
    cfg.cleanup_interval_secs = 0;
    bn_memory_pool *pool = make_pool(&cfg, &f);
    uint64_t now = 1000 * SEC;
    bn_memory_pool_set_clock(pool, test_clock, &now);
    bn_error err;

    void *a = must_alloc(pool, MIB);
    now += 100 * SEC;
    void *b = must_alloc(pool, 5000);
    void *c = must_alloc(pool, 100);
    must_free(pool, c); /* given back: never a leak */
    now += 250 * SEC;    /* a is 350 s old, b 250 s */

    bn_pool_leak leaks[4];
    size_t n = 99;
    CHECK(bn_memory_pool_check_leaks(pool, BN_POOL_LEAK_DEFAULT_THRESHOLD, leaks, 4, &n, &err) ==
          BN_OK);
    CHECK(n == 1);
    CHECK(leaks[0].address == a && leaks[0].size == MIB && leaks[0].requested == MIB);
    CHECK(leaks[0].device_id == 3 && fabs(leaks[0].age_seconds - 350.0) < 1e-9);
#ifdef BITNET_DEBUG
    CHECK(leaks[0].backtrace.depth > 0);
#endif
    char line[4096];
    bn_pool_leak_format(&leaks[0], line, sizeof line);
    CHECK_STR_CONTAINS(line, "device 3");
    CHECK_STR_CONTAINS(line, "1048576 bytes");
    CHECK_STR_CONTAINS(line, "350.0 s ago");
    char addr[32];
    snprintf(addr, sizeof addr, "%p", a);
    CHECK_STR_CONTAINS(line, addr);

    /* Oldest first; "older than" is strict; count goes beyond max. */
    CHECK(bn_memory_pool_check_leaks(pool, 200, leaks, 4, &n, &err) == BN_OK);
    CHECK(n == 2 && leaks[0].address == a && leaks[1].address == b);
    CHECK(leaks[1].size == 6144 && leaks[1].requested == 5000);
    CHECK(bn_memory_pool_check_leaks(pool, 250, leaks, 4, &n, &err) == BN_OK && n == 1);
    CHECK(bn_memory_pool_check_leaks(pool, 400, leaks, 4, &n, &err) == BN_OK && n == 0);
    memset(leaks, 0, sizeof leaks);
    CHECK(bn_memory_pool_check_leaks(pool, 0, leaks, 1, &n, &err) == BN_OK);
    CHECK(n == 2 && leaks[0].address == a && leaks[1].address == NULL);
    CHECK(bn_memory_pool_check_leaks(pool, 0, NULL, 0, &n, &err) == BN_OK && n == 2);
    CHECK(bn_memory_pool_check_leaks(pool, NAN, leaks, 4, &n, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_memory_pool_check_leaks(pool, 0, NULL, 4, &n, &err) == BN_ERR_INVALID_ARGUMENT);

    /* A buffer reused from the cache is as young as its reuse. */
    must_free(pool, a);
    now += 10 * SEC;
    void *a2 = must_alloc(pool, MIB);
    CHECK(a2 == a);
    now += 5 * SEC;
    CHECK(bn_memory_pool_check_leaks(pool, 0, leaks, 4, &n, &err) == BN_OK && n == 2);
    CHECK(leaks[0].address == b && fabs(leaks[1].age_seconds - 5.0) < 1e-9);
    must_free(pool, a2);
    must_free(pool, b);
    CHECK(bn_memory_pool_check_leaks(pool, 0, leaks, 4, &n, &err) == BN_OK && n == 0);
    bn_memory_pool_destroy(pool);

    /* Without tracking the pool knows no ages. */
    cfg.tracking = false;
    pool = make_pool(&cfg, &f);
    a = must_alloc(pool, 100);
    CHECK(bn_memory_pool_check_leaks(pool, 0, leaks, 4, &n, &err) == BN_ERR_UNSUPPORTED);
    CHECK(n == 0);
    /* Destroying with a live buffer frees it too. */
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

static void test_cleanup(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool_config cfg;
    bn_memory_pool_config_defaults(&cfg);
    cfg.cleanup_interval_secs = 30;
    bn_memory_pool *pool = make_pool(&cfg, &f);
    uint64_t now = 0;
    bn_memory_pool_set_clock(pool, test_clock, &now);

    void *a = must_alloc(pool, 1000);
    void *b = must_alloc(pool, 1000);
    now = 10 * SEC;
    must_free(pool, a);
    now = 25 * SEC;
    must_free(pool, b);
    now = 40 * SEC; /* a idle 30 s: not yet longer than the interval */
    CHECK(bn_memory_pool_cleanup_expired(pool) == 0);
    now = 41 * SEC;
    CHECK(bn_memory_pool_cleanup_expired(pool) == 1);
    bn_memory_pool_stats s = stats_of(pool);
    CHECK(s.buffers_cached == 1 && s.bytes_cached == 1024 && s.device_frees == 1);
    CHECK(f.n_live == 1);
    now = 55 * SEC;
    CHECK(bn_memory_pool_cleanup_expired(pool) == 0);
    now = 56 * SEC;
    CHECK(bn_memory_pool_cleanup_expired(pool) == 1);
    CHECK(f.n_live == 0 && stats_of(pool).bytes_cached == 0);

    /* Opportunistic: an allocation cleans up first once the interval has
     * passed since the last cleanup, and only then. */
    now = 100 * SEC;
    void *c = must_alloc(pool, 20000); /* class 24576; a cleanup runs (last was 56 s) */
    now = 110 * SEC;
    must_free(pool, c);
    now = 130 * SEC;
    void *d = must_alloc(pool, 100); /* 30 s since the last cleanup: runs; c idle 20 s */
    s = stats_of(pool);
    CHECK(s.buffers_cached == 1 && s.bytes_cached == 24576);
    now = 145 * SEC; /* c idle 35 s, but the last cleanup was 15 s ago */
    must_free(pool, d);
    void *e = must_alloc(pool, 100);
    CHECK(e == d);
    s = stats_of(pool);
    CHECK(s.buffers_cached == 1 && s.bytes_cached == 24576);
    now = 160 * SEC; /* 30 s since the cleanup at 130 s: it runs, c goes */
    void *g = must_alloc(pool, 50000);
    s = stats_of(pool);
    CHECK(s.buffers_cached == 0 && s.bytes_cached == 0);
    must_free(pool, e);
    must_free(pool, g);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);

    /* Interval 0: never. */
    cfg.cleanup_interval_secs = 0;
    pool = make_pool(&cfg, &f);
    bn_memory_pool_set_clock(pool, test_clock, &now);
    a = must_alloc(pool, 1000);
    must_free(pool, a);
    now += 1000000 * SEC;
    b = must_alloc(pool, 9999);
    CHECK(bn_memory_pool_cleanup_expired(pool) == 0);
    CHECK(stats_of(pool).buffers_cached == 1);
    must_free(pool, b);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

/* ---- misuse ------------------------------------------------------------------------------------------ */

static void test_misuse(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool_config cfg;
    bn_memory_pool_config_defaults(&cfg);
    bn_memory_pool *pool = make_pool(&cfg, &f);
    bn_error err;

    void *a = must_alloc(pool, 1000);
    must_free(pool, a);
    bn_memory_pool_stats before = stats_of(pool), after;
    /* Double free of a buffer sitting in the cache. */
    CHECK(bn_memory_pool_deallocate(pool, a, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "double free");
    after = stats_of(pool);
    CHECK(memcmp(&before, &after, sizeof before) == 0);

    /* A pointer the pool never gave out. */
    int local;
    CHECK(bn_memory_pool_deallocate(pool, &local, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "not a live buffer");
    CHECK(bn_memory_pool_deallocate(pool, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_memory_pool_deallocate(NULL, a, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_memory_pool_deallocate(pool, &local, NULL) == BN_ERR_INVALID_ARGUMENT);
    after = stats_of(pool);
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    bn_memory_pool_destroy(pool);

    /* Double free after the buffer really went back to the allocator. */
    cfg.max_cached_per_class = 0;
    pool = make_pool(&cfg, &f);
    a = must_alloc(pool, 1000);
    must_free(pool, a);
    CHECK(bn_memory_pool_deallocate(pool, a, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(f.bad_frees == 0 && f.free_calls == f.alloc_ok);

    void *p = (void *)&p;
    CHECK(bn_memory_pool_allocate(pool, 0, &p, &err) == BN_ERR_INVALID_ARGUMENT && p == NULL);
    CHECK(bn_memory_pool_allocate(pool, 10, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_memory_pool_allocate(NULL, 10, &p, &err) == BN_ERR_INVALID_ARGUMENT);
    bn_memory_pool_destroy(pool);

    /* Creation needs a whole allocator. */
    bn_pool_allocator broken = fake_vtable(&f);
    broken.free = NULL;
    bn_memory_pool *q = (bn_memory_pool *)&q;
    CHECK(bn_memory_pool_create(&cfg, &broken, &q, &err) == BN_ERR_INVALID_ARGUMENT && q == NULL);
    CHECK(bn_memory_pool_create(NULL, &broken, &q, &err) == BN_ERR_INVALID_ARGUMENT);
    bn_memory_pool_destroy(NULL);
    CHECK(bn_memory_pool_device_id(NULL) == -1);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

/* ---- threads --------------------------------------------------------------------------------------------- */

enum { THREADS = 8, ITERS = 20000, HELD = 16 };

typedef struct worker {
    bn_memory_pool *pool;
    int id;
    uint64_t seed;
    uint64_t allocs, frees, errors;
} worker;

static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Each buffer is stamped with its owner and a serial on allocation and
 * checked before it is freed: two threads ever holding one buffer at once
 * would overwrite each other's stamp. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    void *held[HELD] = {0};
    uint64_t stamp[HELD] = {0};
    for (uint64_t i = 0; i < ITERS; i++) {
        const int slot = (int)(next_rand(&w->seed) % HELD);
        if (held[slot]) {
            if (((uint64_t *)held[slot])[0] != stamp[slot])
                w->errors++;
            if (bn_memory_pool_deallocate(w->pool, held[slot], NULL) != BN_OK)
                w->errors++;
            held[slot] = NULL;
            w->frees++;
        } else {
            const uint64_t bytes = 8 + next_rand(&w->seed) % (64 * KIB);
            void *p = NULL;
            if (bn_memory_pool_allocate(w->pool, bytes, &p, NULL) != BN_OK || !p) {
                w->errors++;
                continue;
            }
            stamp[slot] = ((uint64_t)w->id << 48) | i;
            ((uint64_t *)p)[0] = stamp[slot];
            held[slot] = p;
            w->allocs++;
        }
        if (i % 4096 == 0) {
            bn_memory_pool_stats s;
            bn_memory_pool_get_stats(w->pool, &s); /* readers race with writers too */
            if (w->id == 0)
                bn_memory_pool_cleanup_expired(w->pool);
        }
    }
    for (int slot = 0; slot < HELD; slot++) {
        if (!held[slot])
            continue;
        if (((uint64_t *)held[slot])[0] != stamp[slot])
            w->errors++;
        if (bn_memory_pool_deallocate(w->pool, held[slot], NULL) != BN_OK)
            w->errors++;
        w->frees++;
    }
    return NULL;
}

static void test_threads(void)
{
    fake_allocator f;
    fake_init(&f, 4 * GIB);
    bn_memory_pool_config cfg;
    bn_memory_pool_config_defaults(&cfg);
    cfg.max_cached_per_class = 8; /* small, so frees also reach the allocator */
    bn_memory_pool *pool = make_pool(&cfg, &f);

    pthread_t th[THREADS];
    worker w[THREADS];
    for (int t = 0; t < THREADS; t++) {
        w[t] = (worker){.pool = pool, .id = t + 1, .seed = test_rand_u64()};
        CHECK(pthread_create(&th[t], NULL, worker_main, &w[t]) == 0);
    }
    uint64_t allocs = 0, frees = 0, errors = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        allocs += w[t].allocs;
        frees += w[t].frees;
        errors += w[t].errors;
    }
    bn_memory_pool_stats s = stats_of(pool);
    CHECK_MSG(errors == 0, "%" PRIu64 " errors", errors);
    CHECK(allocs == frees && allocs > 0);
    CHECK(s.allocation_count == allocs && s.deallocation_count == frees);
    CHECK(s.cache_hits + s.cache_misses == allocs && s.cache_hits > 0);
    CHECK(s.bytes_in_use == 0 && s.buffers_in_use == 0 && s.requested_bytes_in_use == 0);
    CHECK(s.device_allocs == f.alloc_ok && s.device_frees == f.free_calls);
    CHECK(s.device_allocs - s.device_frees == s.buffers_cached && s.buffers_cached == f.n_live);
    CHECK(s.bytes_cached == f.live_bytes);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    printf("threads: %" PRIu64 " allocations, %" PRIu64 " hits, %" PRIu64 " device allocations\n",
           s.allocation_count, s.cache_hits, s.device_allocs);
    fake_done(&f);
}

/* ---- configuration from the environment --------------------------------------------------------------------- */

static void clear_env(void)
{
    unsetenv("CUDA_MEMORY_POOL_SIZE");
    unsetenv("BITNET_POOL_SIZE_GB");
    unsetenv("BITNET_CLEANUP_INTERVAL_SECS");
    unsetenv("BITNET_LEAK_THRESHOLD_SECS");
    unsetenv("BITNET_MEMORY_LIMIT");
}

static void test_config_env(void)
{
    bn_memory_pool_config cfg;
    bn_error err;
    clear_env();
    CHECK(bn_memory_pool_config_from_env(NULL, &cfg, &err) == BN_OK);
    CHECK(cfg.max_pool_bytes == 2 * GIB && cfg.max_cached_per_class == 1000 && cfg.tracking);
    CHECK(cfg.cleanup_interval_secs == 30 && cfg.leak_threshold_secs == 300);
    CHECK(cfg.memory_limit_bytes == 0 && cfg.device_id == 0);

    setenv("BITNET_POOL_SIZE_GB", "0.5", 1);
    setenv("BITNET_CLEANUP_INTERVAL_SECS", "5", 1);
    setenv("BITNET_LEAK_THRESHOLD_SECS", "60", 1);
    CHECK(bn_memory_pool_config_from_env(NULL, &cfg, &err) == BN_OK);
    CHECK(cfg.max_pool_bytes == 512 * MIB && cfg.cleanup_interval_secs == 5 &&
          cfg.leak_threshold_secs == 60);

    /* CUDA_MEMORY_POOL_SIZE replaces the pool size. */
    setenv("CUDA_MEMORY_POOL_SIZE", "3GB", 1);
    CHECK(bn_memory_pool_config_from_env(NULL, &cfg, &err) == BN_OK);
    CHECK(cfg.max_pool_bytes == 3 * GIB && cfg.memory_limit_bytes == 0);
    setenv("CUDA_MEMORY_POOL_SIZE", "1.5GiB", 1);
    CHECK(bn_memory_pool_config_from_env(NULL, &cfg, &err) == BN_OK);
    CHECK(cfg.max_pool_bytes == 3 * GIB / 2);

    /* BITNET_MEMORY_LIMIT caps it and becomes the hard limit. */
    setenv("BITNET_MEMORY_LIMIT", "1GB", 1);
    CHECK(bn_memory_pool_config_from_env(NULL, &cfg, &err) == BN_OK);
    CHECK(cfg.max_pool_bytes == GIB && cfg.memory_limit_bytes == GIB);
    setenv("BITNET_MEMORY_LIMIT", "8GB", 1); /* a limit above the pool size leaves it */
    CHECK(bn_memory_pool_config_from_env(NULL, &cfg, &err) == BN_OK);
    CHECK(cfg.max_pool_bytes == 3 * GIB / 2 && cfg.memory_limit_bytes == 8 * GIB);

    static const char *const bad[] = {"lots", "", "0", "2XB", "-1GB", "1.2.3GB", " 2GB", "2GB ",
                                      "99999999999999999999GB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("CUDA_MEMORY_POOL_SIZE", bad[i], 1);
        bn_error_clear(&err);
        bn_status st = bn_memory_pool_config_from_env(NULL, &cfg, &err);
        CHECK_MSG(st == BN_ERR_INVALID_CONFIG, "CUDA_MEMORY_POOL_SIZE='%s' accepted", bad[i]);
        CHECK_STR_CONTAINS(err.message, "CUDA_MEMORY_POOL_SIZE");
        CHECK(err.hint[0] != '\0');
    }
    setenv("CUDA_MEMORY_POOL_SIZE", "lots", 1);
    bn_memory_pool_config_from_env(NULL, &cfg, &err);
    CHECK_STR_CONTAINS(err.message, "'lots'");
    unsetenv("CUDA_MEMORY_POOL_SIZE");

    /* A malformed BITNET_* variable is bn_config's error, passed through. */
    setenv("BITNET_POOL_SIZE_GB", "abc", 1);
    CHECK(bn_memory_pool_config_from_env(NULL, &cfg, &err) == BN_ERR_INVALID_CONFIG);
    CHECK_STR_CONTAINS(err.message, "BITNET_POOL_SIZE_GB");
    clear_env();

    /* An explicit bn_config wins over the environment; the pure form too. */
    bn_config bc;
    bn_config_defaults(&bc);
    bc.pool_size_gb = 0.25;
    bc.cleanup_interval_secs = 0;
    setenv("BITNET_POOL_SIZE_GB", "7", 1);
    CHECK(bn_memory_pool_config_from_env(&bc, &cfg, &err) == BN_OK);
    CHECK(cfg.max_pool_bytes == 256 * MIB && cfg.cleanup_interval_secs == 0);
    clear_env();
    CHECK(bn_memory_pool_config_apply(NULL, "64MB", &cfg, &err) == BN_OK);
    CHECK(cfg.max_pool_bytes == 64 * MIB && cfg.cleanup_interval_secs == 30);
    bc.pool_size_gb = -1;
    CHECK(bn_memory_pool_config_apply(&bc, NULL, &cfg, &err) == BN_ERR_INVALID_CONFIG);
    CHECK_STR_CONTAINS(err.message, "BITNET_POOL_SIZE_GB");
    CHECK(bn_memory_pool_config_apply(NULL, NULL, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    /* The pool warns about leaks and live buffers at destroy on purpose here. */
    bn_log_set_level(BN_LOG_ERROR);
    test_seed_init();
    test_classes();
    test_stats_sequence();
    test_max_cached_per_class();
    test_pool_max();
    test_memory_limit();
    test_allocator_failure();
    test_leaks();
    test_cleanup();
    test_misuse();
    test_threads();
    test_config_env();
    TEST_EXIT();
}
