/*
 * quant_gpu_ops.c - the device quantizer's GPU table on CUDA.
 *
 * The table's contract is host memory in, host memory out, so every call
 * uploads its input, runs the kernels of quant_kernels.cu / ops_kernels.cu /
 * w2a8_kernels.cu, downloads the result and frees its device buffers before
 * returning. It runs on the calling thread's per-thread default stream, so
 * operations on several threads do not serialise on one stream or lock.
 *
 * Whatever the GPU cannot do returns BN_ERR_UNSUPPORTED (the quantizer then
 * runs the CPU path and counts a fallback); any CUDA failure becomes the
 * matching bn_status through bn_cuda_error. Inputs the CPU path would
 * reject are rejected here too (with an error that also causes a fallback,
 * so the caller sees the CPU's own message).
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "cuda_check.h"
#include "device_quantizer.h"
#include "fmt_tl.h"
#include "fp16.h"
#include "ops_cuda.h"
#include "quant_cuda.h"
#include "w2a8_cuda.h"

/* Turns a failed CUDA call into st and jumps to the cleanup at `done`. */
#define TRY(call)                                                                  \
    do {                                                                           \
        cudaError_t try_rc_ = (call);                                              \
        if (try_rc_ != cudaSuccess) {                                              \
            st = bn_cuda_error(err, try_rc_, #call, __FILE__, __LINE__);           \
            goto done;                                                             \
        }                                                                          \
    } while (0)

static bool packs_on_gpu(bn_qtype type)
{
    return type == BN_QTYPE_I2_S || type == BN_QTYPE_TQ2_0 || type == BN_QTYPE_TL1 ||
           type == BN_QTYPE_TL2;
}

static const char *type_name(bn_qtype type)
{
    const bn_qtype_info *info = bn_qtype_get(type);
    return info ? info->name : "this type";
}

static bn_status gpu_quantize_weights(void *ctx, bn_qtype type, const float *w, int64_t rows,
                                      int64_t cols, void *dst, float *scale, bn_error *err)
{
    (void)ctx;
    if (!packs_on_gpu(type))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "the GPU quantizer packs i2_s, tq2_0, tl1 and tl2, not %s",
                            type_name(type));
    size_t bytes;
    bn_status st = bn_qtype_tensor_size(type, rows, cols, &bytes, err);
    if (st != BN_OK)
        return st;
    bn_tl_tiling tiling;
    if (type == BN_QTYPE_TL1 || type == BN_QTYPE_TL2) {
        st = bn_tl_tiling_for_shape(type, rows, cols, &tiling, err);
        if (st != BN_OK)
            return st;
    }

    const int64_t n = rows * cols;
    const cudaStream_t s = cudaStreamPerThread;
    float *d_w = NULL, *d_q_scale = NULL;
    int8_t *d_codes = NULL;
    void *d_work = NULL;
    uint8_t *d_out = NULL;
    float q_scale[2];

    TRY(cudaMalloc((void **)&d_w, sizeof(float) * (size_t)n));
    TRY(cudaMalloc((void **)&d_codes, (size_t)n));
    TRY(cudaMalloc(&d_work, bn_cuda_absmean_workspace_bytes(n)));
    TRY(cudaMalloc((void **)&d_q_scale, sizeof q_scale));
    TRY(cudaMemcpyAsync(d_w, w, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice, s));
    TRY(bn_cuda_absmean(d_w, n, d_work, d_q_scale, s));
    TRY(bn_cuda_ternary_codes(d_w, n, d_q_scale, d_codes, s));
    TRY(cudaMemcpyAsync(q_scale, d_q_scale, sizeof q_scale, cudaMemcpyDeviceToHost, s));
    TRY(cudaStreamSynchronize(s));
    /* The floats are no longer needed: make room for the packed tensor. */
    TRY(cudaFree(d_w));
    d_w = NULL;

    if (type == BN_QTYPE_TQ2_0) {
        /* bn_pack_tq2_0's rule: the scale must survive as an fp16 d. */
        const uint16_t half = bn_fp32_to_fp16(q_scale[1]);
        if (!isfinite(q_scale[1]) || (half & 0x7c00u) == 0x7c00u) {
            st = bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                              "a ternary scale must be finite and at most 65504",
                              "tq2_0 pack: scale %g does not fit in an fp16 block scale",
                              (double)q_scale[1]);
            goto done;
        }
    }
    TRY(cudaMalloc((void **)&d_out, bytes));
    switch (type) {
    case BN_QTYPE_I2_S:
        TRY(bn_cuda_pack_i2s(d_codes, rows, cols, q_scale[1], d_out, s));
        break;
    case BN_QTYPE_TQ2_0:
        TRY(bn_cuda_pack_tq2_0(d_codes, rows, cols, q_scale[1], d_out, s));
        break;
    case BN_QTYPE_TL1:
        TRY(bn_cuda_pack_tl1(d_codes, rows, cols, &tiling, d_out, s));
        break;
    default:
        TRY(bn_cuda_pack_tl2(d_codes, rows, cols, &tiling, d_out, s));
        break;
    }
    TRY(cudaMemcpyAsync(dst, d_out, bytes, cudaMemcpyDeviceToHost, s));
    TRY(cudaStreamSynchronize(s));
    if (scale)
        *scale = q_scale[1];

done:
    cudaFree(d_w);
    cudaFree(d_codes);
    cudaFree(d_work);
    cudaFree(d_q_scale);
    cudaFree(d_out);
    return st;
}

static bn_status gpu_quantize_activations(void *ctx, const float *x, int64_t m, int64_t k,
                                          int64_t ldx, bn_q8_rows *out, bn_error *err)
{
    (void)ctx;
    /* The CPU path's checks, with its message. */
    if (out->m < m || out->k != k)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "activation buffer holds %lld x %lld, need %lld x %lld",
                            (long long)out->m, (long long)out->k, (long long)m, (long long)k);
    if (m <= 0)
        return BN_OK;
    if (ldx < k || out->lda < k)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "activation strides %lld (input) and %lld (output) are shorter than "
                            "the rows (%lld)",
                            (long long)ldx, (long long)out->lda, (long long)k);

    const cudaStream_t s = cudaStreamPerThread;
    bn_status st = BN_OK;
    float *d_x = NULL, *d_scale = NULL;
    int8_t *d_q = NULL;
    int32_t *d_sum = NULL;
    const size_t row_floats = sizeof(float) * (size_t)k;

    TRY(cudaMalloc((void **)&d_x, row_floats * (size_t)m));
    TRY(cudaMalloc((void **)&d_q, (size_t)(m * k)));
    TRY(cudaMalloc((void **)&d_scale, sizeof(float) * (size_t)m));
    TRY(cudaMalloc((void **)&d_sum, sizeof(int32_t) * (size_t)m));
    TRY(cudaMemcpy2DAsync(d_x, row_floats, x, sizeof(float) * (size_t)ldx, row_floats, (size_t)m,
                          cudaMemcpyHostToDevice, s));
    TRY(bn_cuda_quantize_rows(d_x, m, k, k, d_q, k, d_scale, d_sum, s));
    /* Only the k values of each row: the CPU path leaves the padding from k
     * to lda as it was, and so does this one. */
    TRY(cudaMemcpy2DAsync(out->q, (size_t)out->lda, d_q, (size_t)k, (size_t)k, (size_t)m,
                          cudaMemcpyDeviceToHost, s));
    TRY(cudaMemcpyAsync(out->scale, d_scale, sizeof(float) * (size_t)m, cudaMemcpyDeviceToHost,
                        s));
    TRY(cudaMemcpyAsync(out->sum, d_sum, sizeof(int32_t) * (size_t)m, cudaMemcpyDeviceToHost, s));
    TRY(cudaStreamSynchronize(s));

done:
    cudaFree(d_x);
    cudaFree(d_q);
    cudaFree(d_scale);
    cudaFree(d_sum);
    return st;
}

static bn_status gpu_dequantize(void *ctx, bn_qtype type, const void *src, size_t src_bytes,
                                int64_t rows, int64_t cols, float *dst, bn_error *err)
{
    (void)ctx;
    if (type != BN_QTYPE_I2_S && !bn_cuda_embed_supports(type))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL, "the GPU does not dequantize %s",
                            type_name(type));
    size_t need;
    bn_status st = bn_qtype_tensor_size(type, rows, cols, &need, err);
    if (st != BN_OK)
        return st;
    if (src_bytes < need)
        return bn_error_set(err, BN_ERR_FORMAT, "the file is truncated or the shape is wrong",
                            "%s tensor %lld x %lld needs %zu bytes, have %zu", type_name(type),
                            (long long)rows, (long long)cols, need, src_bytes);
    if (rows > INT32_MAX)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "the GPU dequantizes at most 2^31 - 1 rows at once");

    const int64_t n = rows * cols;
    size_t upload = need;
    float i2s_scale = 0.0f;
    if (type == BN_QTYPE_I2_S) {
        /* bn_unpack_i2s needs the codes and the float after them; the
         * trailing padding may be absent. */
        if (src_bytes < (size_t)(n / 4) + sizeof(float))
            return bn_error_set(err, BN_ERR_FORMAT,
                                "the file is truncated or the tensor shape is wrong",
                                "i2_s tensor needs %zu bytes, only %zu available",
                                (size_t)(n / 4) + sizeof(float), src_bytes);
        memcpy(&i2s_scale, (const uint8_t *)src + n / 4, sizeof i2s_scale);
        if (!isfinite(i2s_scale))
            return bn_error_set(err, BN_ERR_FORMAT, "the tensor data is corrupt",
                                "i2_s tensor scale is not a finite number");
        upload = (size_t)(n / 4);
    }

    const cudaStream_t s = cudaStreamPerThread;
    void *d_src = NULL;
    float *d_y = NULL;
    int *d_bad = NULL;
    int bad = 0;
    TRY(cudaMalloc(&d_src, upload));
    TRY(cudaMalloc((void **)&d_y, sizeof(float) * (size_t)n));
    TRY(cudaMemcpyAsync(d_src, src, upload, cudaMemcpyHostToDevice, s));
    if (type == BN_QTYPE_I2_S) {
        TRY(cudaMalloc((void **)&d_bad, sizeof(int)));
        TRY(cudaMemsetAsync(d_bad, 0, sizeof(int), s));
        TRY(bn_cuda_dequantize_i2s(d_src, rows, cols, i2s_scale, d_y, d_bad, s));
        TRY(cudaMemcpyAsync(&bad, d_bad, sizeof(int), cudaMemcpyDeviceToHost, s));
    } else {
        TRY(bn_cuda_embed_rows(d_src, type, rows, cols, NULL, rows, d_y, cols, s));
    }
    TRY(cudaStreamSynchronize(s));
    if (bad) {
        st = bn_error_set(err, BN_ERR_FORMAT, "the tensor data is corrupt or not ternary",
                          "i2_s tensor holds the code 3, which is not a ternary value");
        goto done;
    }
    TRY(cudaMemcpyAsync(dst, d_y, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost, s));
    TRY(cudaStreamSynchronize(s));

done:
    cudaFree(d_src);
    cudaFree(d_y);
    cudaFree(d_bad);
    return st;
}

static const bn_gpu_quant_ops cuda_quant_ops = {
    .name = "cuda",
    .quantize_weights = gpu_quantize_weights,
    .quantize_activations = gpu_quantize_activations,
    .dequantize = gpu_dequantize,
    .ctx = NULL,
};

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static bool usable;

static void probe(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 ||
        bn_cuda_quant_probe() != cudaSuccess) {
        cudaGetLastError(); /* clear the error the failed call left behind */
        return;
    }
    usable = true;
}

const bn_gpu_quant_ops *bn_cuda_quant_ops(void)
{
    pthread_once(&probe_once, probe);
    return usable ? &cuda_quant_ops : NULL;
}
