/*
 * provider_cuda.c - the CUDA kernels behind the kernel-provider table.
 *
 * Weights are packed on the host in the tile layout (cuda_layout.h) and
 * uploaded once; w->data is then a device pointer, released by
 * cuda_free_weights. matvec/matmul keep the provider contract (host
 * activations in, host outputs out), so every call copies the activations
 * up and the requested output rows back: this path exists for tests and
 * for the generic W2A8 API; the CUDA backend launches the kernels directly
 * on device buffers.
 *
 * Calls are serialised by a mutex (one scratch set, one stream). A CUDA
 * failure inside matvec/matmul cannot be returned through the provider
 * table, so it is logged and the outputs are set to NaN, which every
 * caller's checks see.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_layout.h"
#include "kernel_provider.h"
#include "quant_rules.h"
#include "w2a8_cuda.h"

static struct {
    pthread_once_t once;
    bool available;
    int sm_count;
    pthread_mutex_t lock;
    cudaStream_t stream;
    /* Scratch, grown on demand. */
    int8_t *d_x;
    float *d_scale, *d_y;
    int32_t *d_sum;
    size_t x_bytes, y_bytes, m_cap;
} cuda = {PTHREAD_ONCE_INIT, false, 0, PTHREAD_MUTEX_INITIALIZER, NULL, NULL, NULL, NULL, NULL,
          0, 0, 0};

static void probe(void)
{
    int count = 0, device = 0;
    struct cudaDeviceProp p;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 ||
        cudaGetDevice(&device) != cudaSuccess ||
        cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return;
    }
    /* The GEMM uses int8 mma.sync, which needs compute capability 8.0. */
    if (p.major < 8)
        return;
    if (cudaStreamCreateWithFlags(&cuda.stream, cudaStreamNonBlocking) != cudaSuccess)
        return;
    cuda.sm_count = p.multiProcessorCount;
    cuda.available = true;
}

static bool cuda_available(void)
{
    pthread_once(&cuda.once, probe);
    return cuda.available;
}

static bn_status cuda_pack(const int8_t *codes, int64_t n, int64_t k, float scale,
                           bn_w2a8_weights *w, bn_error *err)
{
    if (!cuda_available())
        return bn_error_set(err, BN_ERR_NO_DEVICE, "run 'bitnet devices' to see why",
                            "no CUDA device of compute capability 8.0 or newer is usable");
    bn_cuda_layout l;
    bn_cuda_layout_init(&l, n, k);
    uint8_t *host = malloc(l.bytes);
    if (!host)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no host memory to pack %zu bytes",
                            l.bytes);
    bn_cuda_layout_pack(&l, codes, host);
    void *dev = NULL;
    cudaError_t rc = cudaMalloc(&dev, l.bytes);
    if (rc == cudaSuccess)
        rc = cudaMemcpy(dev, host, l.bytes, cudaMemcpyHostToDevice);
    /* From pageable memory cudaMemcpy may return before the data reaches the
     * device, and the kernels run on a non-blocking stream, which does not
     * wait for the legacy stream. */
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(cudaStreamLegacy);
    free(host);
    if (rc != cudaSuccess) {
        cudaFree(dev);
        return bn_cuda_error(err, rc, "upload of packed weights", __FILE__, __LINE__);
    }
    w->provider = &bn_provider_cuda;
    w->n = n;
    w->k = k;
    w->scale = scale;
    w->data = dev;
    w->bytes = l.bytes;
    w->row_stride = 0; /* tiles, not rows: see cuda_layout.h */
    return BN_OK;
}

static void cuda_free_weights(bn_w2a8_weights *w) { cudaFree(w->data); }

/* Grows the scratch buffers to m rows of k_padded bytes and n outputs. */
static cudaError_t reserve(int64_t m, int64_t k_padded, int64_t n)
{
    const size_t x_bytes = (size_t)(m * k_padded), y_bytes = (size_t)(m * n) * sizeof(float);
    cudaError_t rc = cudaSuccess;
    if (x_bytes > cuda.x_bytes) {
        cudaFree(cuda.d_x);
        cuda.d_x = NULL;
        cuda.x_bytes = 0;
        if ((rc = cudaMalloc((void **)&cuda.d_x, x_bytes)) != cudaSuccess)
            return rc;
        cuda.x_bytes = x_bytes;
    }
    if (y_bytes > cuda.y_bytes) {
        cudaFree(cuda.d_y);
        cuda.d_y = NULL;
        cuda.y_bytes = 0;
        if ((rc = cudaMalloc((void **)&cuda.d_y, y_bytes)) != cudaSuccess)
            return rc;
        cuda.y_bytes = y_bytes;
    }
    if ((size_t)m > cuda.m_cap) {
        cudaFree(cuda.d_scale);
        cudaFree(cuda.d_sum);
        cuda.d_scale = NULL;
        cuda.d_sum = NULL;
        cuda.m_cap = 0;
        if ((rc = cudaMalloc((void **)&cuda.d_scale, (size_t)m * sizeof(float))) != cudaSuccess ||
            (rc = cudaMalloc((void **)&cuda.d_sum, (size_t)m * sizeof(int32_t))) != cudaSuccess)
            return rc;
        cuda.m_cap = (size_t)m;
    }
    return rc;
}

/* Runs y = W x for m host rows; copies back rows [row_begin, row_end) of
 * each output row. */
static cudaError_t run(const bn_w2a8_weights *w, const int8_t *xq, int64_t lda, const float *scale,
                       const int32_t *sum, int64_t m, int64_t row_begin, int64_t row_end,
                       float *y, int64_t ldy)
{
    bn_cuda_layout l;
    bn_cuda_layout_init(&l, w->n, w->k);
    cudaError_t rc = reserve(m, l.k_padded, w->n);
    if (rc != cudaSuccess)
        return rc;
    const size_t x_bytes = (size_t)(m * l.k_padded);
    if ((rc = cudaMemsetAsync(cuda.d_x, 0, x_bytes, cuda.stream)) != cudaSuccess ||
        (rc = cudaMemcpy2DAsync(cuda.d_x, (size_t)l.k_padded, xq, (size_t)lda, (size_t)w->k,
                                (size_t)m, cudaMemcpyHostToDevice, cuda.stream)) != cudaSuccess ||
        (rc = cudaMemcpyAsync(cuda.d_scale, scale, (size_t)m * sizeof(float),
                              cudaMemcpyHostToDevice, cuda.stream)) != cudaSuccess ||
        (rc = cudaMemcpyAsync(cuda.d_sum, sum, (size_t)m * sizeof(int32_t),
                              cudaMemcpyHostToDevice, cuda.stream)) != cudaSuccess)
        return rc;
    bn_w2a8_cuda_args a = {.weights = w->data,
                           .n = w->n,
                           .tiles = l.tiles,
                           .groups = l.groups,
                           .weight_scale = w->scale,
                           .x = cuda.d_x,
                           .m = m,
                           .ldx = l.k_padded,
                           .act_scale = cuda.d_scale,
                           .act_sum = cuda.d_sum,
                           .y = cuda.d_y,
                           .ldy = w->n,
                           .sm_count = cuda.sm_count};
    rc = m == 1 ? bn_w2a8_cuda_gemv(&a, bn_w2a8_cuda_gemv_split(l.tiles, l.groups, cuda.sm_count),
                                    cuda.stream)
                : bn_w2a8_cuda_gemm(&a, cuda.stream);
    if (rc != cudaSuccess)
        return rc;
    const int64_t cols = row_end - row_begin;
    rc = cudaMemcpy2DAsync(y + row_begin, (size_t)ldy * sizeof(float), cuda.d_y + row_begin,
                           (size_t)w->n * sizeof(float), (size_t)cols * sizeof(float), (size_t)m,
                           cudaMemcpyDeviceToHost, cuda.stream);
    if (rc != cudaSuccess)
        return rc;
    return cudaStreamSynchronize(cuda.stream);
}

static void fail_outputs(cudaError_t rc, int64_t m, int64_t row_begin, int64_t row_end, float *y,
                         int64_t ldy)
{
    bn_log(BN_LOG_ERROR, "CUDA W2A8 kernel failed: %s", cudaGetErrorString(rc));
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = row_begin; r < row_end; r++)
            y[i * ldy + r] = NAN;
}

static void cuda_matmul(const bn_w2a8_weights *w, const bn_q8_rows *x, int64_t row_begin,
                        int64_t row_end, float *y, int64_t ldy)
{
    pthread_mutex_lock(&cuda.lock);
    cudaError_t rc =
        run(w, x->q, x->lda, x->scale, x->sum, x->m, row_begin, row_end, y, ldy);
    pthread_mutex_unlock(&cuda.lock);
    if (rc != cudaSuccess)
        fail_outputs(rc, x->m, row_begin, row_end, y, ldy);
}

static void cuda_matvec(const bn_w2a8_weights *w, const int8_t *xq, float act_scale,
                        int32_t act_sum, int64_t row_begin, int64_t row_end, float *y)
{
    pthread_mutex_lock(&cuda.lock);
    cudaError_t rc = run(w, xq, w->k, &act_scale, &act_sum, 1, row_begin, row_end, y, w->n);
    pthread_mutex_unlock(&cuda.lock);
    if (rc != cudaSuccess)
        fail_outputs(rc, 1, row_begin, row_end, y, w->n);
}

const bn_kernel_provider bn_provider_cuda = {
    .name = "cuda",
    .priority = 100,
    .is_available = cuda_available,
    .pack_weights = cuda_pack,
    .matmul = cuda_matmul,
    .matvec = cuda_matvec,
    /* Host activations: the CPU rule (the device has its own kernel,
     * bn_cuda_quantize_rows, for device buffers). */
    .quantize_activations = bn_quantize_activations_row,
    .norm_quantize_row = bn_norm_quantize_row,
    .free_weights = cuda_free_weights,
    .runs_on_device = true,
};
