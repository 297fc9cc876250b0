#include "device_quantizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_manager.h"
#include "quant_rules.h"
#include "w2a8.h"

const char *bn_quant_op_name(bn_quant_op op)
{
    static const char *const names[BN_QOP_COUNT] = {"quantize_weights", "quantize_activations",
                                                    "dequantize"};
    return (int)op >= 0 && op < BN_QOP_COUNT ? names[op] : "unknown";
}

bn_status bn_device_quantizer_init(bn_device_quantizer *q, const bn_config *cfg_in,
                                   const bn_gpu_quant_ops *gpu, bn_error *err)
{
    memset(q, 0, sizeof *q);
    bn_config env;
    const bn_config *cfg = cfg_in;
    if (!cfg) {
        bn_status st = bn_config_from_env(&env, err);
        if (st != BN_OK)
            return st;
        cfg = &env;
    }
    bn_status st = bn_kernel_select(&q->cpu, err);
    if (st != BN_OK)
        return st;
    const bool gpu_requested = cfg->device.kind == BN_DEVICE_GPU || cfg->device.kind == BN_DEVICE_CUDA;
    if (gpu_requested && !gpu) {
        if (cfg->strict_mode)
            return bn_error_set(err, BN_ERR_NO_DEVICE,
                                "use --device cpu, or run where 'bitnet devices' shows a GPU",
                                "a GPU was requested for quantization but none is usable "
                                "(BITNET_STRICT_MODE=1 forbids the CPU fallback)");
        bn_log(BN_LOG_WARN, "a GPU was requested for quantization but none is usable: the CPU "
                            "will quantize");
    }
    q->prefer_gpu = gpu_requested || (cfg->device.kind == BN_DEVICE_AUTO && gpu != NULL);
    q->strict = cfg->strict_mode;
    q->gpu = gpu;
    pthread_mutex_init(&q->lock, NULL);
    return BN_OK;
}

void bn_device_quantizer_destroy(bn_device_quantizer *q)
{
    if (q)
        pthread_mutex_destroy(&q->lock);
}

/* Books one finished operation. */
static void record(bn_device_quantizer *q, bn_quant_op op, double seconds, bool on_gpu,
                   bool fell_back, const bn_error *gpu_error, const bn_error *final_error)
{
    bn_host_memory mem;
    bool have_mem = bn_host_memory_query(&mem, NULL) == BN_OK;
    pthread_mutex_lock(&q->lock);
    bn_device_stats *s = &q->stats;
    s->ops[op]++;
    s->seconds[op] += seconds;
    if (final_error) {
        s->errors++;
        snprintf(s->last_error, sizeof s->last_error, "%s", final_error->message);
    } else if (on_gpu) {
        s->gpu_ops++;
    } else {
        s->cpu_ops++;
    }
    if (fell_back)
        s->fallbacks++;
    if (gpu_error)
        snprintf(s->last_gpu_error, sizeof s->last_gpu_error, "%s", gpu_error->message);
    if (have_mem) {
        s->host_memory_used = mem.process_resident_bytes;
        s->host_memory_total = mem.system_total_bytes;
    }
    pthread_mutex_unlock(&q->lock);
}

/* The arguments of any of the three operations, so one driver runs them. */
typedef struct op_args {
    bn_quant_op op;
    bn_qtype type;
    const float *in;
    const void *src;
    size_t src_bytes;
    int64_t rows, cols, ldx;
    void *dst;
    float *scale;
    bn_q8_rows *q8;
    float *out;
} op_args;

static bn_status run_gpu(const bn_gpu_quant_ops *g, const op_args *a, bn_error *err)
{
    switch (a->op) {
    case BN_QOP_QUANTIZE_WEIGHTS:
        if (g->quantize_weights)
            return g->quantize_weights(g->ctx, a->type, a->in, a->rows, a->cols, a->dst, a->scale,
                                       err);
        break;
    case BN_QOP_QUANTIZE_ACTIVATIONS:
        if (g->quantize_activations)
            return g->quantize_activations(g->ctx, a->in, a->rows, a->cols, a->ldx, a->q8, err);
        break;
    case BN_QOP_DEQUANTIZE:
        if (g->dequantize)
            return g->dequantize(g->ctx, a->type, a->src, a->src_bytes, a->rows, a->cols, a->out,
                                 err);
        break;
    default:
        break;
    }
    return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL, "the GPU has no %s operation",
                        bn_quant_op_name(a->op));
}

static bn_status cpu_quantize_weights(const op_args *a, bn_error *err)
{
    const bn_qtype_info *info = bn_qtype_get(a->type);
    if (!info || !info->ternary || !info->pack)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "use i2_s, tq2_0, tq1_0, tl1 or tl2",
                            "cannot quantize weights into %s", info ? info->name : "this type");
    size_t bytes;
    bn_status st = bn_qtype_tensor_size(a->type, a->rows, a->cols, &bytes, err);
    if (st != BN_OK)
        return st;
    const size_t n = (size_t)(a->rows * a->cols);
    int8_t *codes = malloc(n);
    if (!codes)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "no memory to quantize a %lld x %lld tensor", (long long)a->rows,
                            (long long)a->cols);
    float scale;
    bn_quantize_weights_absmean(a->in, n, codes, &scale);
    st = info->pack(codes, scale, a->rows, a->cols, a->dst, err);
    free(codes);
    if (st == BN_OK && a->scale)
        *a->scale = scale;
    return st;
}

static bn_status run_cpu(bn_device_quantizer *q, const op_args *a, bn_error *err)
{
    switch (a->op) {
    case BN_QOP_QUANTIZE_WEIGHTS:
        return cpu_quantize_weights(a, err);
    case BN_QOP_QUANTIZE_ACTIVATIONS:
        if (a->q8->m < a->rows || a->q8->k != a->cols)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "activation buffer holds %lld x %lld, need %lld x %lld",
                                (long long)a->q8->m, (long long)a->q8->k, (long long)a->rows,
                                (long long)a->cols);
        bn_w2a8_quantize(q->cpu, a->in, a->rows, a->ldx, a->q8);
        return BN_OK;
    case BN_QOP_DEQUANTIZE:
        return bn_dequantize_tensor(a->type, a->src, a->src_bytes, a->rows, a->cols, a->out, err);
    default:
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "unknown quantizer operation");
    }
}

static bn_status run_op(bn_device_quantizer *q, const op_args *a, bn_error *err)
{
    const uint64_t start = bn_time_ns();
    bn_error gpu_err, cpu_err;
    bn_error_clear(&gpu_err);
    bn_error_clear(&cpu_err);
    bool gpu_failed = false;

    if (q->prefer_gpu && q->gpu) {
        if (run_gpu(q->gpu, a, &gpu_err) == BN_OK) {
            record(q, a->op, (double)(bn_time_ns() - start) * 1e-9, true, false, NULL, NULL);
            return BN_OK;
        }
        gpu_failed = true;
        if (q->strict) {
            if (err)
                *err = gpu_err;
            record(q, a->op, (double)(bn_time_ns() - start) * 1e-9, false, false, &gpu_err,
                   &gpu_err);
            return gpu_err.status;
        }
        bn_log(BN_LOG_WARN, "GPU %s failed (%s); falling back to the CPU", bn_quant_op_name(a->op),
               gpu_err.message);
    }
    const bool fell_back = q->prefer_gpu;
    bn_status st = run_cpu(q, a, &cpu_err);
    record(q, a->op, (double)(bn_time_ns() - start) * 1e-9, false, fell_back,
           gpu_failed ? &gpu_err : NULL, st == BN_OK ? NULL : &cpu_err);
    if (st != BN_OK && err)
        *err = cpu_err;
    return st;
}

bn_status bn_dq_quantize_weights(bn_device_quantizer *q, bn_qtype type, const float *w,
                                 int64_t rows, int64_t cols, void *dst, float *scale,
                                 bn_error *err)
{
    op_args a = {.op = BN_QOP_QUANTIZE_WEIGHTS, .type = type, .in = w, .rows = rows,
                 .cols = cols, .dst = dst, .scale = scale};
    return run_op(q, &a, err);
}

bn_status bn_dq_quantize_activations(bn_device_quantizer *q, const float *x, int64_t m,
                                     int64_t k, int64_t ldx, bn_q8_rows *out, bn_error *err)
{
    op_args a = {.op = BN_QOP_QUANTIZE_ACTIVATIONS, .in = x, .rows = m, .cols = k, .ldx = ldx,
                 .q8 = out};
    return run_op(q, &a, err);
}

bn_status bn_dq_dequantize(bn_device_quantizer *q, bn_qtype type, const void *src,
                           size_t src_bytes, int64_t rows, int64_t cols, float *dst,
                           bn_error *err)
{
    op_args a = {.op = BN_QOP_DEQUANTIZE, .type = type, .src = src, .src_bytes = src_bytes,
                 .rows = rows, .cols = cols, .out = dst};
    return run_op(q, &a, err);
}

bn_device_stats bn_dq_stats(bn_device_quantizer *q)
{
    pthread_mutex_lock(&q->lock);
    bn_device_stats copy = q->stats;
    pthread_mutex_unlock(&q->lock);
    return copy;
}

void bn_dq_reset_stats(bn_device_quantizer *q)
{
    pthread_mutex_lock(&q->lock);
    memset(&q->stats, 0, sizeof q->stats);
    pthread_mutex_unlock(&q->lock);
}

double bn_device_stats_average_seconds(const bn_device_stats *s, bn_quant_op op)
{
    return s->ops[op] ? s->seconds[op] / (double)s->ops[op] : 0.0;
}

double bn_device_stats_gpu_share(const bn_device_stats *s)
{
    const uint64_t done = s->gpu_ops + s->cpu_ops;
    return done ? (double)s->gpu_ops / (double)done : 0.0;
}

bool bn_device_stats_gpu_effective(const bn_device_stats *s)
{
    return bn_device_stats_gpu_share(s) > 0.8;
}

void bn_device_stats_summary(const bn_device_stats *s, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size,
                                   "quantizer: %llu GPU ops, %llu CPU ops, %llu fallbacks, %llu "
                                   "errors; GPU share %.0f%% (%s)\n",
                                   (unsigned long long)s->gpu_ops, (unsigned long long)s->cpu_ops,
                                   (unsigned long long)s->fallbacks, (unsigned long long)s->errors,
                                   100.0 * bn_device_stats_gpu_share(s),
                                   bn_device_stats_gpu_effective(s) ? "effective" : "not effective");
    for (int op = 0; op < BN_QOP_COUNT && used < size; op++)
        used += (size_t)snprintf(buf + used, size - used, "  %-21s %6llu ops, %.3f ms average\n",
                                 bn_quant_op_name((bn_quant_op)op),
                                 (unsigned long long)s->ops[op],
                                 1e3 * bn_device_stats_average_seconds(s, (bn_quant_op)op));
    if (used < size)
        used += (size_t)snprintf(buf + used, size - used,
                                 "  host memory %.1f MiB used of %.1f GiB%s%s%s%s\n",
                                 (double)s->host_memory_used / (1024.0 * 1024.0),
                                 (double)s->host_memory_total / (1024.0 * 1024.0 * 1024.0),
                                 s->last_gpu_error[0] ? "; last GPU error: " : "",
                                 s->last_gpu_error, s->last_error[0] ? "; last error: " : "",
                                 s->last_error);
}
