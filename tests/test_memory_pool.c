/* The memory pool's rules on the CPU: a fake allocator stands in for
 * cudaMalloc (it can fail on demand, model a full device, counts its calls
 * and catches double frees), so reuse, statistics, the memory limit, out of
 * memory and the leak report are checked without a GPU. */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "bitnet.h"
#include "memory_pool.h"
#include "test_util.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define GIB (1ull << 30)

/* ---- fake allocator ---------------------------------------------------------- */

typedef struct live_buf {
    void *p;
    uint64_t size;
} live_buf;

typedef struct fake_allocator {
    pthread_mutex_t lock;
    uint64_t capacity;      /* the "device": out of memory beyond this many live bytes */
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
        st = bn_error_set(err, f->fail_status, "the fake's hint", "fake allocator: failing on request");
    } else if (f->null_next) {
        f->null_next = false; /* BN_OK with *ptr NULL */
    } else if (bytes > f->capacity - f->live_bytes) {
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

/* ---- helpers ---------------------------------------------------------------------- */

static bn_memory_pool *make_pool(fake_allocator *f, uint64_t limit)
{
    const bn_pool_allocator a = {fake_alloc, fake_free, f};
    bn_memory_pool *pool = NULL;
    bn_error err;
    bn_status st = bn_memory_pool_create("fake device", &a, limit, &pool, &err);
    CHECK_MSG(st == BN_OK && pool, "create: %s", err.message);
    return pool;
}

static void *must_alloc(bn_memory_pool *pool, uint64_t bytes, const char *purpose)
{
    void *p = NULL;
    bn_error err;
    bn_status st = bn_memory_pool_allocate(pool, bytes, purpose, &p, &err);
    CHECK_MSG(st == BN_OK && p, "allocate %" PRIu64 ": %s", bytes, err.message);
    return p;
}

static void must_free(bn_memory_pool *pool, void *p, uint64_t expect_bytes)
{
    bn_error err;
    uint64_t bytes = 0;
    bn_status st = bn_memory_pool_free(pool, p, &bytes, &err);
    CHECK_MSG(st == BN_OK && bytes == expect_bytes, "free %p: %s (%" PRIu64 " bytes)", p,
              err.message, bytes);
}

static bn_memory_pool_stats stats_of(bn_memory_pool *pool)
{
    bn_memory_pool_stats s;
    bn_memory_pool_get_stats(pool, &s);
    return s;
}

/* What the library writes on stderr between capture_start and capture_end. */
static int saved_stderr = -1;
static FILE *captured;

static void capture_start(void)
{
    fflush(stderr);
    captured = tmpfile();
    saved_stderr = dup(2);
    CHECK(captured && saved_stderr >= 0);
    if (captured)
        dup2(fileno(captured), 2);
}

static char *capture_end(void)
{
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    char *text = calloc(1, 65536);
    if (captured && text) {
        rewind(captured);
        size_t n = fread(text, 1, 65535, captured);
        text[n] = '\0';
    }
    if (captured)
        fclose(captured);
    return text;
}

/* ---- every statistic after a scripted sequence ---------------------------------------- */

static void test_stats_and_reuse(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool *pool = make_pool(&f, 0);

    bn_memory_pool_stats s = stats_of(pool);
    CHECK(s.bytes_in_use == 0 && s.bytes_reserved == 0 && s.allocations == 0 &&
          s.memory_limit == 0 && s.buffers_kept == 0);

    void *a = must_alloc(pool, 1000, "a"); /* counted as asked for: no rounding */
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 1000 && s.bytes_reserved == 1000 && s.peak_bytes_in_use == 1000);
    CHECK(s.allocations == 1 && s.reuses == 0 && s.buffers_in_use == 1 && f.alloc_calls == 1);

    void *b = must_alloc(pool, 3000, "b");
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 4000 && s.peak_bytes_in_use == 4000 && s.peak_bytes_reserved == 4000);

    must_free(pool, a, 1000);
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 3000 && s.bytes_reserved == 4000 && s.buffers_kept == 1);
    CHECK(s.frees == 1 && f.free_calls == 0); /* kept, not given to the device */
    CHECK(s.peak_bytes_in_use == 4000);

    /* Another size is not served by the kept buffer... */
    void *c = must_alloc(pool, 999, "c");
    CHECK(c != a && f.alloc_calls == 3);
    /* ...the same size is, without a device call. */
    void *d = must_alloc(pool, 1000, "d");
    CHECK(d == a && f.alloc_calls == 3);
    s = stats_of(pool);
    CHECK(s.reuses == 1 && s.allocations == 4 && s.buffers_kept == 0);
    CHECK(s.bytes_in_use == 4999 && s.bytes_reserved == 4999 && s.peak_bytes_in_use == 4999);

    must_free(pool, b, 3000);
    must_free(pool, c, 999);
    must_free(pool, d, 1000);
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 0 && s.buffers_in_use == 0 && s.bytes_reserved == 4999);
    CHECK(s.buffers_kept == 3 && s.frees == 4 && s.failures == 0);
    CHECK(s.peak_bytes_in_use == 4999 && s.peak_bytes_reserved == 4999);

    char line[256];
    bn_memory_pool_stats_format(&s, line, sizeof line);
    CHECK_STR_CONTAINS(line, "0 bytes in use (peak 4.9 KiB)");
    CHECK_STR_CONTAINS(line, "4.9 KiB reserved (peak 4.9 KiB)");
    CHECK_STR_CONTAINS(line, "limit none; 4 allocations, 1 reused, 0 failed");
    s.memory_limit = 3 * GIB / 2;
    s.bytes_in_use = 812 * MIB + 300 * KIB;
    bn_memory_pool_stats_format(&s, line, sizeof line);
    CHECK_STR_CONTAINS(line, "812.3 MiB in use");
    CHECK_STR_CONTAINS(line, "limit 1.50 GiB");
    char tiny[8];
    bn_memory_pool_stats_format(&s, tiny, sizeof tiny);
    CHECK(strlen(tiny) == 7);

    /* Destroying returns every kept buffer; nothing is reported as a leak. */
    capture_start();
    bn_memory_pool_destroy(pool);
    char *log = capture_end();
    CHECK_MSG(log && log[0] == '\0', "unexpected output: %s", log ? log : "");
    free(log);
    CHECK(f.alloc_ok == f.free_calls && f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

/* ---- fixed-size blocks, handed out and returned many times ------------------------------ */

static void test_block_churn(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool *pool = make_pool(&f, 0);
    enum { BLOCKS = 256, ROUNDS = 200000 };
    const uint64_t block = 16 * 128 * 2 * 20 * 2; /* a KV block: 16 positions of a layer */
    void *held[BLOCKS] = {0};
    int n_held = 0;
    uint64_t allocs = 0, frees = 0;
    for (int i = 0; i < ROUNDS; i++) {
        const bool take = n_held == 0 || (n_held < BLOCKS && test_rand_u64() % 2);
        if (take) {
            held[n_held++] = must_alloc(pool, block, "kv block");
            allocs++;
        } else {
            const int k = (int)(test_rand_u64() % (uint64_t)n_held);
            must_free(pool, held[k], block);
            held[k] = held[--n_held];
            frees++;
        }
    }
    const bn_memory_pool_stats s = stats_of(pool);
    /* The device was asked at most once per block ever held at one time. */
    CHECK_MSG(f.alloc_calls <= BLOCKS && f.free_calls == 0, "%" PRIu64 " device allocations",
              f.alloc_calls);
    CHECK(s.allocations == allocs && s.frees == frees);
    CHECK(s.reuses == allocs - f.alloc_calls);
    CHECK(s.buffers_in_use == (uint64_t)n_held && s.bytes_in_use == (uint64_t)n_held * block);
    CHECK(s.bytes_reserved == f.live_bytes && s.buffers_in_use + s.buffers_kept == f.n_live);
    /* Distinct blocks: a buffer is never handed out twice at once. */
    for (int i = 0; i < n_held; i++)
        for (int j = i + 1; j < n_held; j++)
            CHECK(held[i] != held[j]);
    for (int i = 0; i < n_held; i++)
        must_free(pool, held[i], block);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

/* ---- the memory limit ---------------------------------------------------------------------- */

static void test_memory_limit(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool *pool = make_pool(&f, 8192);
    bn_error err;
    CHECK(stats_of(pool).memory_limit == 8192);

    void *a = must_alloc(pool, 4096, "weights");
    void *b = must_alloc(pool, 4096, "kv cache");
    void *c = NULL;
    const uint64_t calls = f.alloc_calls;
    bn_status st = bn_memory_pool_allocate(pool, 1, "scratch", &c, &err);
    CHECK(st == BN_ERR_GPU_OUT_OF_MEMORY && c == NULL);
    /* The message names the request, its purpose, what is in use and the limit. */
    CHECK_STR_CONTAINS(err.message, "fake device: cannot allocate 1 bytes for scratch");
    CHECK_STR_CONTAINS(err.message, "8.0 KiB in use and the memory limit is 8.0 KiB");
    CHECK_STR_CONTAINS(err.hint, "BITNET_MEMORY_LIMIT");
    CHECK(f.alloc_calls == calls); /* refused before asking the device */
    CHECK(stats_of(pool).failures == 1);

    must_free(pool, a, 4096); /* kept: the pool still reserves 8192 */
    bn_memory_pool_stats s = stats_of(pool);
    CHECK(s.bytes_reserved == 8192 && s.bytes_in_use == 4096);
    /* Another size releases the kept buffer to stay within the limit. */
    c = must_alloc(pool, 3000, "scratch");
    s = stats_of(pool);
    CHECK(s.buffers_kept == 0 && s.bytes_reserved == 7096 && f.free_calls == 1);
    CHECK(f.peak_live_bytes <= 8192);

    /* A request bigger than the limit itself fails however empty the pool is. */
    must_free(pool, b, 4096);
    must_free(pool, c, 3000);
    void *d = NULL;
    CHECK(bn_memory_pool_allocate(pool, 8193, "lm head", &d, &err) == BN_ERR_GPU_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(err.message, "8.0 KiB (8193 bytes) for lm head: 0 bytes in use");
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 0 && s.bytes_reserved == 0 && s.failures == 2);
    CHECK(f.peak_live_bytes <= 8192 && f.n_live == 0);

    /* Lowering the limit releases kept buffers above it, never ones in use. */
    bn_memory_pool_set_limit(pool, 0);
    void *e = must_alloc(pool, 6000, "e"), *g = must_alloc(pool, 6000, "g");
    void *h = must_alloc(pool, 100, "h");
    must_free(pool, e, 6000);
    must_free(pool, h, 100);
    bn_memory_pool_set_limit(pool, 6100);
    s = stats_of(pool);
    CHECK(s.memory_limit == 6100 && s.bytes_in_use == 6000 && s.buffers_kept == 1);
    CHECK(s.bytes_reserved == 6100); /* the 6000 went first, the 100 fits */
    bn_memory_pool_set_limit(pool, 1000);
    s = stats_of(pool);
    CHECK(s.bytes_in_use == 6000 && s.buffers_kept == 0 && s.bytes_reserved == 6000);
    CHECK(bn_memory_pool_allocate(pool, 1, "x", &d, &err) == BN_ERR_GPU_OUT_OF_MEMORY);
    must_free(pool, g, 6000);
    bn_memory_pool_set_limit(pool, 0);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

/* ---- out of memory from the allocator ------------------------------------------------------ */

static void test_allocator_failure(void)
{
    fake_allocator f;
    fake_init(&f, 8192); /* a tiny device */
    bn_memory_pool *pool = make_pool(&f, 0);
    bn_error err;

    void *a = must_alloc(pool, 4096, "a");
    void *b = must_alloc(pool, 4096, "b");
    must_free(pool, a, 4096);
    must_free(pool, b, 4096);
    /* The device is full of kept buffers: the pool releases them and retries. */
    void *c = must_alloc(pool, 6000, "c");
    bn_memory_pool_stats s = stats_of(pool);
    CHECK(c && s.buffers_kept == 0 && s.bytes_reserved == 6000 && f.free_calls == 2);
    CHECK(s.failures == 0);

    /* Full with buffers in use: out of memory, the allocator's reason kept. */
    void *d = (void *)&d;
    bn_status st = bn_memory_pool_allocate(pool, 4096, "kv cache", &d, &err);
    CHECK(st == BN_ERR_GPU_OUT_OF_MEMORY && d == NULL);
    CHECK_STR_CONTAINS(err.message, "fake device: cannot allocate 4.0 KiB (4096 bytes) for kv "
                                    "cache with 5.9 KiB in use (5.9 KiB reserved)");
    CHECK_STR_CONTAINS(err.message, "fake allocator: device full");
    CHECK_STR_CONTAINS(err.hint, "reduce the context length");
    s = stats_of(pool);
    CHECK(s.failures == 1 && s.bytes_in_use == 6000 && s.buffers_in_use == 1);

    /* The allocator's hint is passed on; a failure with nothing kept is
     * not retried. */
    f.fail_next = 1;
    const uint64_t calls = f.alloc_calls;
    CHECK(bn_memory_pool_allocate(pool, 16, "x", &d, &err) == BN_ERR_GPU_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(err.hint, "the fake's hint");
    CHECK(f.alloc_calls == calls + 1);

    /* Other errors keep their status and are not retried. */
    f.fail_next = 1;
    f.fail_status = BN_ERR_DRIVER;
    CHECK(bn_memory_pool_allocate(pool, 16, "x", &d, &err) == BN_ERR_DRIVER);
    CHECK_STR_CONTAINS(err.message, "fake device: allocating 16 bytes for x: fake allocator");
    CHECK(f.alloc_calls == calls + 2);

    /* An allocator that says OK but returns NULL is an internal error. */
    f.null_next = true;
    CHECK(bn_memory_pool_allocate(pool, 16, "x", &d, &err) == BN_ERR_INTERNAL);
    s = stats_of(pool);
    CHECK(s.failures == 4 && s.bytes_in_use == 6000 && s.bytes_reserved == 6000);

    /* The pool still works. */
    must_free(pool, c, 6000);
    void *e = must_alloc(pool, 6000, "e");
    CHECK(e == c);
    must_free(pool, e, 6000);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

/* ---- the leak report ---------------------------------------------------------------------- */

static void test_leak_report(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool *pool = make_pool(&f, 0);
    void *kv = must_alloc(pool, 2 * MIB, "kv cache");
    void *kept = must_alloc(pool, 512, "given back");
    void *head = must_alloc(pool, 3 * KIB, "a purpose whose name is longer than forty-seven "
                                           "characters");
    void *anon = must_alloc(pool, 100, NULL);
    must_free(pool, kept, 512);
    (void)head;
    (void)anon;

    const bn_log_level level = bn_log_get_level();
    bn_log_set_level(BN_LOG_WARN);
    capture_start();
    bn_memory_pool_destroy(pool);
    char *log = capture_end();
    bn_log_set_level(level);
    CHECK(log != NULL);
    if (log) {
        printf("leak report:\n%s", log);
        CHECK_STR_CONTAINS(log, "bitnet: warn: fake device: 3 buffers (2.0 MiB) still allocated "
                                "at destruction; freeing them");
        char want[128];
        snprintf(want, sizeof want, "  kv cache: 2.0 MiB (2097152 bytes) at %p", kv);
        CHECK_STR_CONTAINS(log, want);
        CHECK_STR_CONTAINS(log, "  a purpose whose name is longer than forty-seven: 3.0 KiB (3072 bytes)");
        CHECK_STR_CONTAINS(log, "  unnamed: 100 bytes at");
        CHECK(strstr(log, "given back") == NULL);
        /* In allocation order. */
        const char *p1 = strstr(log, "kv cache"), *p2 = strstr(log, "a purpose"),
                   *p3 = strstr(log, "unnamed");
        CHECK(p1 && p2 && p3 && p1 < p2 && p2 < p3);
    }
    free(log);
    /* Leaked or kept, every buffer went back to the device. */
    CHECK(f.n_live == 0 && f.bad_frees == 0 && f.free_calls == f.alloc_ok);
    fake_done(&f);
}

/* ---- misuse ---------------------------------------------------------------------------------- */

static void test_misuse(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_error err;
    const bn_pool_allocator good = {fake_alloc, fake_free, &f}, no_free = {fake_alloc, NULL, &f};
    bn_memory_pool *pool = (bn_memory_pool *)&f;
    CHECK(bn_memory_pool_create("x", NULL, 0, &pool, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(pool == NULL);
    CHECK(bn_memory_pool_create("x", &no_free, 0, &pool, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_memory_pool_create("x", &good, 0, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_memory_pool_create(NULL, &good, 0, &pool, &err) == BN_OK);

    void *p = (void *)&p;
    CHECK(bn_memory_pool_allocate(pool, 0, "zero", &p, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(err.message, "memory pool: a buffer of 0 bytes for zero");
    CHECK(bn_memory_pool_allocate(NULL, 1, "x", &p, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_memory_pool_allocate(pool, 1, "x", NULL, &err) == BN_ERR_INVALID_ARGUMENT);

    void *a = must_alloc(pool, 64, "a");
    int local = 0;
    uint64_t bytes = 99;
    CHECK(bn_memory_pool_free(pool, NULL, &bytes, &err) == BN_ERR_INVALID_ARGUMENT && bytes == 0);
    CHECK(bn_memory_pool_free(NULL, a, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_memory_pool_free(pool, &local, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "foreign pointer");
    must_free(pool, a, 64);
    CHECK(bn_memory_pool_free(pool, a, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "double free");
    bn_memory_pool_stats s = stats_of(pool);
    CHECK(s.frees == 1 && s.buffers_kept == 1 && s.bytes_in_use == 0 && s.failures == 0);

    bn_memory_pool_get_stats(NULL, &s);
    CHECK(s.allocations == 0 && s.bytes_reserved == 0);
    bn_memory_pool_get_stats(pool, NULL);
    bn_memory_pool_set_limit(NULL, 1);
    CHECK(bn_memory_pool_stats_format(NULL, NULL, 0) == 0);
    bn_memory_pool_destroy(pool);
    bn_memory_pool_destroy(NULL);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

/* ---- threads ----------------------------------------------------------------------------- */

typedef struct worker {
    bn_memory_pool *pool;
    uint64_t seed;
    int failures;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    enum { HELD = 16 };
    void *held[HELD] = {0};
    uint64_t sizes[HELD] = {0};
    uint64_t x = w->seed;
    for (int i = 0; i < 20000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int k = (int)((x >> 33) % HELD);
        bn_error err;
        if (held[k]) {
            uint64_t bytes = 0;
            if (bn_memory_pool_free(w->pool, held[k], &bytes, &err) != BN_OK || bytes != sizes[k])
                w->failures++;
            held[k] = NULL;
        } else {
            sizes[k] = 256u << ((x >> 40) % 4); /* four block sizes */
            if (bn_memory_pool_allocate(w->pool, sizes[k], "thread", &held[k], &err) != BN_OK)
                w->failures++;
            else
                memset(held[k], (int)(x >> 56), 8); /* the buffer is ours alone */
        }
    }
    for (int k = 0; k < HELD; k++)
        if (held[k] && bn_memory_pool_free(w->pool, held[k], NULL, NULL) != BN_OK)
            w->failures++;
    return NULL;
}

static void test_threads(void)
{
    fake_allocator f;
    fake_init(&f, GIB);
    bn_memory_pool *pool = make_pool(&f, 0);
    enum { THREADS = 8 };
    pthread_t t[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){pool, test_rand_u64(), 0};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        failures += w[i].failures;
    }
    CHECK(failures == 0);
    const bn_memory_pool_stats s = stats_of(pool);
    CHECK(s.bytes_in_use == 0 && s.buffers_in_use == 0 && s.allocations == s.frees);
    CHECK(s.bytes_reserved == f.live_bytes && s.buffers_kept == f.n_live);
    CHECK(s.allocations - s.reuses == f.alloc_calls && s.failures == 0);
    bn_memory_pool_destroy(pool);
    CHECK(f.n_live == 0 && f.bad_frees == 0);
    fake_done(&f);
}

int main(void)
{
    test_seed_init();
    test_stats_and_reuse();
    test_block_churn();
    test_memory_limit();
    test_allocator_failure();
    test_leak_report();
    test_misuse();
    test_threads();
    TEST_EXIT();
}
