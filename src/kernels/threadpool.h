/*
 * threadpool.h - a small fixed pool of worker threads for parallel loops.
 *
 * bn_threadpool_run splits [0, n) into one contiguous chunk per thread
 * (chunk boundaries multiples of `grain`), runs them, and returns when all
 * are done. The caller's thread takes part, so a pool of 1 runs inline.
 * Chunks are a pure function of (n, grain, threads): results never depend
 * on scheduling.
 */
#ifndef BN_THREADPOOL_H
#define BN_THREADPOOL_H

#include <stdint.h>

#include "bitnet.h"

typedef struct bn_threadpool bn_threadpool;
typedef void (*bn_parallel_fn)(void *ctx, int64_t begin, int64_t end);

/* n_threads counts the caller; 0 means BITNET_NUM_THREADS, else all cores. */
bn_status bn_threadpool_create(int n_threads, bn_threadpool **out, bn_error *err);
void bn_threadpool_destroy(bn_threadpool *pool);
int bn_threadpool_size(const bn_threadpool *pool);

/* pool may be NULL: runs fn(ctx, 0, n) on the caller. */
void bn_threadpool_run(bn_threadpool *pool, int64_t n, int64_t grain, bn_parallel_fn fn,
                       void *ctx);

/* The thread count BITNET_NUM_THREADS asks for, or the number of cores. */
int bn_default_thread_count(void);

#endif
