/*
 * kernel_provider.h - Level-1 kernels behind one table of function pointers.
 *
 * A provider implements the W2A8 product (ternary weights x int8
 * activations -> float) and activation quantization for one instruction set
 * (scalar, AVX2, AVX-512, NEON, CUDA). Providers register with a priority;
 * the kernel manager (kernel_manager.h) picks the best available one once.
 *
 * Weights are repacked at load into the provider's own layout
 * (bn_w2a8_weights.data); each provider documents its layout in its .c file.
 * Every provider computes, for each activation row m and weight row r,
 *
 *     acc = sum_k code[r][k] * xq[m][k]          (exact, int32)
 *     y[m][r] = bn_w2a8_epilogue(acc, act_scale[m], weight_scale)
 *
 * so all providers agree bit for bit: integer sums do not depend on order,
 * and the float epilogue is the same function everywhere.
 */
#ifndef BN_KERNEL_PROVIDER_H
#define BN_KERNEL_PROVIDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

struct bn_kernel_provider;

/* A ternary weight matrix of n rows (outputs) by k columns (inputs), packed
 * by one provider. */
typedef struct bn_w2a8_weights {
    const struct bn_kernel_provider *provider;
    int64_t n, k;
    float scale;        /* per-tensor weight scale                     */
    uint8_t *data;      /* provider layout, 64-byte aligned            */
    size_t bytes;       /* size of data                                */
    int64_t row_stride; /* bytes from one packed row to the next       */
} bn_w2a8_weights;

/* m rows of quantized activations, each k long (row stride lda >= k). */
typedef struct bn_q8_rows {
    int64_t m, k, lda;
    int8_t *q;       /* m * lda values                    */
    float *scale;    /* m activation scales (127/absmax)  */
    int32_t *sum;    /* m sums of the int8 values         */
} bn_q8_rows;

typedef struct bn_kernel_provider {
    const char *name;  /* "scalar", "avx2", "avx512", "avx512vnni", "neon" */
    int priority;      /* higher is preferred                               */
    bool (*is_available)(void);

    /* Repacks canonical codes [n][k] (values -1, 0, +1) into w->data.
     * Allocates with bn_aligned_alloc; bn_w2a8_weights_free releases. */
    bn_status (*pack_weights)(const int8_t *codes, int64_t n, int64_t k, float scale,
                              bn_w2a8_weights *w, bn_error *err);

    /* y[m * ldy + r] for rows r in [row_begin, row_end) and every
     * activation row; x->k == w->k. Must not read past k in any row. */
    void (*matmul)(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t row_begin,
                   int64_t row_end, float *y, int64_t ldy);

    /* The same for a single activation row (decode). */
    void (*matvec)(const bn_w2a8_weights *w, const int8_t *xq, float act_scale, int32_t act_sum,
                   int64_t row_begin, int64_t row_end, float *y);

    /* One activation row, identical in result to
     * bn_quantize_activations_row. */
    void (*quantize_activations)(const float *x, int64_t k, int8_t *xq, float *scale,
                                 int32_t *sum);

    /* RMSNorm then int8 quantization of one row, identical in result to
     * bn_norm_quantize_row (quant_rules.h): every layer's input to its
     * projections. */
    void (*norm_quantize_row)(const float *x, const float *w, int64_t n, float eps, int8_t *q,
                              float *scale, int32_t *sum);

    /* Releases w->data; NULL means bn_aligned_free (host memory). */
    void (*free_weights)(bn_w2a8_weights *w);

    /* The provider computes on a device: callers give it whole matrices
     * (no splitting of rows over CPU threads); matvec/matmul still take and
     * return host memory, copying in and out. */
    bool runs_on_device;
} bn_kernel_provider;

void bn_w2a8_weights_free(bn_w2a8_weights *w);

/* The providers compiled into this build (defined in their own files). */
extern const bn_kernel_provider bn_provider_scalar;
#if defined(__x86_64__)
extern const bn_kernel_provider bn_provider_avx2;
extern const bn_kernel_provider bn_provider_avx512;
extern const bn_kernel_provider bn_provider_avx512vnni;
#endif
#if defined(BITNET_HAVE_CUDA)
extern const bn_kernel_provider bn_provider_cuda;
#endif
#if defined(__aarch64__)
extern const bn_kernel_provider bn_provider_neondot;
extern const bn_kernel_provider bn_provider_neon;
#endif

#endif
