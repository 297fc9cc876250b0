/*
 * device_quantizer.h - quantization that runs on the GPU when one is asked
 * for and usable, falls back to the CPU otherwise, and keeps statistics of
 * what ran where.
 *
 * Operations: weights (float -> absmean ternary -> any ternary format with
 * a packer: i2_s, tq2_0, tq1_0, tl1, tl2, ...), activations (float rows ->
 * int8 rows with scales and sums), and dequantization of any format.
 *
 * The GPU path is a table of functions (bn_gpu_quant_ops) that the CUDA
 * backend provides; without one every operation runs on the CPU. When the
 * GPU was preferred and the CPU ran instead, that is a fallback: counted,
 * its reason kept, and an error instead under strict mode.
 */
#ifndef BN_DEVICE_QUANTIZER_H
#define BN_DEVICE_QUANTIZER_H

#include <pthread.h>

#include "kernel_provider.h"
#include "qtype.h"

typedef enum bn_quant_op {
    BN_QOP_QUANTIZE_WEIGHTS = 0,
    BN_QOP_QUANTIZE_ACTIVATIONS,
    BN_QOP_DEQUANTIZE,
    BN_QOP_COUNT
} bn_quant_op;

const char *bn_quant_op_name(bn_quant_op op);

/* DeviceStats: what ran, where, and how long it took. */
typedef struct bn_device_stats {
    uint64_t ops[BN_QOP_COUNT];      /* operations by kind (GPU and CPU)   */
    double seconds[BN_QOP_COUNT];    /* total wall time by kind            */
    uint64_t gpu_ops;                /* operations completed on the GPU    */
    uint64_t cpu_ops;                /* operations completed on the CPU    */
    uint64_t fallbacks;              /* GPU preferred, CPU ran             */
    uint64_t errors;                 /* operations that failed everywhere  */
    char last_gpu_error[BN_ERROR_MESSAGE_MAX]; /* why the GPU last failed ("")    */
    char last_error[BN_ERROR_MESSAGE_MAX];     /* last error returned to a caller */
    uint64_t host_memory_used;       /* process resident bytes, last op    */
    uint64_t host_memory_total;      /* system total bytes                 */
} bn_device_stats;

/* The GPU's implementations; each returns BN_OK or a status that makes the
 * quantizer fall back (or fail, in strict mode). */
typedef struct bn_gpu_quant_ops {
    const char *name;
    bn_status (*quantize_weights)(void *ctx, bn_qtype type, const float *w, int64_t rows,
                                  int64_t cols, void *dst, float *scale, bn_error *err);
    bn_status (*quantize_activations)(void *ctx, const float *x, int64_t m, int64_t k,
                                      int64_t ldx, bn_q8_rows *out, bn_error *err);
    bn_status (*dequantize)(void *ctx, bn_qtype type, const void *src, size_t src_bytes,
                            int64_t rows, int64_t cols, float *dst, bn_error *err);
    void *ctx;
} bn_gpu_quant_ops;

typedef struct bn_device_quantizer {
    bool prefer_gpu;                /* the request names a GPU, or auto with one   */
    bool strict;                    /* a fallback is an error                      */
    const bn_gpu_quant_ops *gpu;    /* NULL: CPU only                              */
    const bn_kernel_provider *cpu;  /* activation quantizer on the CPU             */
    bn_device_stats stats;
    pthread_mutex_t lock;           /* guards stats; operations may run in parallel */
} bn_device_quantizer;

/* cfg: device request and strict mode (NULL = environment). gpu may be NULL.
 * A request for a GPU (gpu, cuda, cuda:N) without GPU operations is an
 * error in strict mode and a logged CPU fallback otherwise. */
bn_status bn_device_quantizer_init(bn_device_quantizer *q, const bn_config *cfg,
                                   const bn_gpu_quant_ops *gpu, bn_error *err);
void bn_device_quantizer_destroy(bn_device_quantizer *q);

/* Absmean-quantizes rows x cols floats and packs them as `type` into dst
 * (bn_qtype_tensor_size bytes); *scale gets the per-tensor scale. */
bn_status bn_dq_quantize_weights(bn_device_quantizer *q, bn_qtype type, const float *w,
                                 int64_t rows, int64_t cols, void *dst, float *scale,
                                 bn_error *err);
/* m rows of k floats (stride ldx) into out (allocated by the caller). */
bn_status bn_dq_quantize_activations(bn_device_quantizer *q, const float *x, int64_t m,
                                     int64_t k, int64_t ldx, bn_q8_rows *out, bn_error *err);
bn_status bn_dq_dequantize(bn_device_quantizer *q, bn_qtype type, const void *src,
                           size_t src_bytes, int64_t rows, int64_t cols, float *dst,
                           bn_error *err);

/* A consistent copy of the statistics. */
bn_device_stats bn_dq_stats(bn_device_quantizer *q);
void bn_dq_reset_stats(bn_device_quantizer *q);

/* Mean seconds per operation of a kind (0 when none ran). */
double bn_device_stats_average_seconds(const bn_device_stats *s, bn_quant_op op);
/* Share of operations that ran on the GPU, 0..1 (0 when none ran). */
double bn_device_stats_gpu_share(const bn_device_stats *s);
/* The GPU is effective when more than 80 % of operations ran on it. */
bool bn_device_stats_gpu_effective(const bn_device_stats *s);
/* A few lines for people. */
void bn_device_stats_summary(const bn_device_stats *s, char *buf, size_t size);

#endif
