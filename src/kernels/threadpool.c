#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* How long a worker spins for the next job before it sleeps. A decode
 * step hands the pool a job every few tens of microseconds (a projection,
 * attention, the head); waking a sleeping thread costs 10-30 us of system
 * call and interrupt on each job, which on many threads was more than the
 * work of the small projections. Spinning that long after the last job
 * costs at most this much CPU when the work stops. */
#define SPIN_SECONDS 0.002

struct bn_threadpool {
    int size; /* threads including the caller */
    pthread_t *workers;
    /* The current job, written by the caller before it bumps generation
     * (release) and read by the workers after they see the bump
     * (acquire). */
    int64_t n, grain;
    bn_parallel_fn fn;
    void *ctx;
    _Atomic uint64_t generation;
    _Atomic int pending;  /* workers still running the current job        */
    _Atomic int sleepers; /* workers waiting on work_ready                 */
    atomic_bool stopping;
    /* Only for sleeping: a worker that spun SPIN_SECONDS in vain. */
    pthread_mutex_t lock;
    pthread_cond_t work_ready;
};

typedef struct worker_arg {
    bn_threadpool *pool;
    int index; /* 1..size-1; the caller is 0 */
} worker_arg;

/* Thread `index` of `size` gets [begin, end): equal shares rounded to grain. */
static void chunk_of(int64_t n, int64_t grain, int size, int index, int64_t *begin, int64_t *end)
{
    int64_t units = (n + grain - 1) / grain;
    int64_t per = units / size, extra = units % size;
    int64_t first = index * per + (index < extra ? index : extra);
    int64_t count = per + (index < extra ? 1 : 0);
    *begin = first * grain < n ? first * grain : n;
    int64_t e = (first + count) * grain;
    *end = e < n ? e : n;
}

/* The next generation after `seen`: spins, then sleeps on work_ready.
 * sleepers and generation are sequentially consistent on both sides, so
 * either the caller sees this worker among the sleepers (and broadcasts
 * under the lock) or this worker sees the new generation before it waits. */
static uint64_t wait_for_job(bn_threadpool *pool, uint64_t seen)
{
    uint64_t g;
    double start = 0.0;
    for (unsigned spins = 0;; spins++) {
        if ((g = atomic_load(&pool->generation)) != seen || atomic_load(&pool->stopping))
            return g;
        cpu_relax();
        if ((spins & 1023) != 1023)
            continue;
        const double t = bn_time_seconds();
        if (start == 0.0)
            start = t;
        else if (t - start > SPIN_SECONDS)
            break;
    }
    pthread_mutex_lock(&pool->lock);
    atomic_fetch_add(&pool->sleepers, 1);
    while ((g = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stopping))
        pthread_cond_wait(&pool->work_ready, &pool->lock);
    atomic_fetch_sub(&pool->sleepers, 1);
    pthread_mutex_unlock(&pool->lock);
    return g;
}

static void *worker_main(void *p)
{
    worker_arg *arg = p;
    bn_threadpool *pool = arg->pool;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stopping))
            break;
        int64_t begin, end;
        chunk_of(pool->n, pool->grain, pool->size, arg->index, &begin, &end);
        if (begin < end)
            pool->fn(pool->ctx, begin, end);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
    free(arg);
    return NULL;
}

int bn_default_thread_count(void)
{
    bn_config cfg;
    if (bn_config_from_env(&cfg, NULL) == BN_OK && cfg.num_threads > 0)
        return cfg.num_threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

bn_status bn_threadpool_create(int n_threads, bn_threadpool **out, bn_error *err)
{
    if (n_threads < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "thread count %d is negative",
                            n_threads);
    if (n_threads == 0)
        n_threads = bn_default_thread_count();
    bn_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a thread pool");
    pool->size = n_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->work_ready, NULL);
    pool->workers = calloc((size_t)n_threads, sizeof *pool->workers);
    if (!pool->workers) {
        bn_threadpool_destroy(pool);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg) {
            arg->pool = pool;
            arg->index = i;
        }
        if (!arg || pthread_create(&pool->workers[i], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->size = i; /* only workers 1..i-1 exist */
            bn_threadpool_destroy(pool);
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "lower BITNET_NUM_THREADS",
                                "could not start worker thread %d of %d", i, n_threads);
        }
    }
    *out = pool;
    return BN_OK;
}

void bn_threadpool_destroy(bn_threadpool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->stopping, true);
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->size && pool->workers; i++)
        pthread_join(pool->workers[i], NULL);
    pthread_cond_destroy(&pool->work_ready);
    pthread_mutex_destroy(&pool->lock);
    free(pool->workers);
    free(pool);
}

int bn_threadpool_size(const bn_threadpool *pool) { return pool ? pool->size : 1; }

void bn_threadpool_run(bn_threadpool *pool, int64_t n, int64_t grain, bn_parallel_fn fn,
                       void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    if (!pool || pool->size == 1 || n <= grain) {
        fn(ctx, 0, n);
        return;
    }
    pool->n = n;
    pool->grain = grain;
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->size - 1, memory_order_relaxed);
    atomic_fetch_add(&pool->generation, 1); /* publishes the job */
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->work_ready);
        pthread_mutex_unlock(&pool->lock);
    }

    int64_t begin, end;
    chunk_of(n, grain, pool->size, 0, &begin, &end);
    if (begin < end)
        fn(ctx, begin, end);

    /* The workers' shares take about as long as this thread's: spin, and
     * give the core away now and then in case a worker waits for it. */
    for (unsigned spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0;
         spins++) {
        cpu_relax();
        if ((spins & 4095) == 4095)
            sched_yield();
    }
}
