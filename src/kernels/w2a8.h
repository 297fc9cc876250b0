/*
 * w2a8.h - the W2A8 operations the rest of the library calls: quantize
 * activation rows, and multiply them by packed ternary weights, spread over
 * a thread pool by output rows.
 *
 * Results are identical for any thread count: each output is computed by
 * exactly one thread with the same exact integer sum and float epilogue.
 */
#ifndef BN_W2A8_H
#define BN_W2A8_H

#include "kernel_provider.h"
#include "threadpool.h"

/* Allocates m rows of k (row stride rounded up to 64 bytes). */
bn_status bn_q8_rows_alloc(bn_q8_rows *x, int64_t m, int64_t k, bn_error *err);
void bn_q8_rows_free(bn_q8_rows *x);

/* Quantizes m float rows (stride ldx) into x with provider p. */
void bn_w2a8_quantize(const bn_kernel_provider *p, const float *src, int64_t m, int64_t ldx,
                      bn_q8_rows *x);

/* y[m][n] (row stride ldy) = W (n x k) times each activation row. Uses
 * matvec when x->m == 1. pool may be NULL (single thread). */
bn_status bn_w2a8_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, float *y, int64_t ldy,
                         bn_threadpool *pool, bn_error *err);
/* Several products of the same activations in one job of the pool (q, k
 * and v; gate and up): y[i] = W[i] x, the output rows of all of them
 * spread over the threads together, one hand-off instead of count. */
#define BN_W2A8_GROUP_MAX 4
bn_status bn_w2a8_matmul_group(const bn_w2a8_weights *const *w, int count, const bn_q8_rows *x,
                               float *const *y, const int64_t *ldy, bn_threadpool *pool,
                               bn_error *err);

/* Packs codes for provider p (checks shapes and codes). */
bn_status bn_w2a8_pack(const bn_kernel_provider *p, const int8_t *codes, int64_t n, int64_t k,
                       float scale, bn_w2a8_weights *w, bn_error *err);

#endif
