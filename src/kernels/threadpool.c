#include "threadpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct bn_threadpool {
    int size; /* threads including the caller */
    pthread_t *workers;
    pthread_mutex_t lock;
    pthread_cond_t work_ready;
    pthread_cond_t work_done;
    /* The current job; generation changes when a new one is posted. */
    uint64_t generation;
    int pending; /* workers still running the current job */
    bool stopping;
    int64_t n, grain;
    bn_parallel_fn fn;
    void *ctx;
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

static void *worker_main(void *p)
{
    worker_arg *arg = p;
    bn_threadpool *pool = arg->pool;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        while (!pool->stopping && pool->generation == seen)
            pthread_cond_wait(&pool->work_ready, &pool->lock);
        if (pool->stopping) {
            pthread_mutex_unlock(&pool->lock);
            break;
        }
        seen = pool->generation;
        int64_t n = pool->n, grain = pool->grain;
        bn_parallel_fn fn = pool->fn;
        void *ctx = pool->ctx;
        pthread_mutex_unlock(&pool->lock);

        int64_t begin, end;
        chunk_of(n, grain, pool->size, arg->index, &begin, &end);
        if (begin < end)
            fn(ctx, begin, end);

        pthread_mutex_lock(&pool->lock);
        if (--pool->pending == 0)
            pthread_cond_signal(&pool->work_done);
        pthread_mutex_unlock(&pool->lock);
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
    pthread_cond_init(&pool->work_done, NULL);
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
    pool->stopping = true;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->size && pool->workers; i++)
        pthread_join(pool->workers[i], NULL);
    pthread_cond_destroy(&pool->work_done);
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
    pthread_mutex_lock(&pool->lock);
    pool->n = n;
    pool->grain = grain;
    pool->fn = fn;
    pool->ctx = ctx;
    pool->pending = pool->size - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->lock);

    int64_t begin, end;
    chunk_of(n, grain, pool->size, 0, &begin, &end);
    if (begin < end)
        fn(ctx, begin, end);

    pthread_mutex_lock(&pool->lock);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->work_done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
