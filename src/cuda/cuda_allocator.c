/*
 * cuda_allocator.c - cudaMalloc/cudaFree behind the memory pool's allocator
 * vtable. The device id travels in the ctx pointer itself, so the allocator
 * owns nothing and can be copied freely.
 *
 * cudaSetDevice is called before every call because the current device is
 * per host thread: the thread that frees a buffer need not be the one that
 * allocated it, nor have the pool's device current.
 */
#include "cuda_allocator.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "cuda_check.h"

static int device_of(void *ctx) { return (int)(intptr_t)ctx; }

static bn_status cuda_alloc(void *ctx, uint64_t bytes, void **ptr, bn_error *err)
{
    *ptr = NULL;
    BN_CUDA_TRY(err, cudaSetDevice(device_of(ctx)));
    if (bytes > (uint64_t)SIZE_MAX)
        return bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY, "reduce batch size or context length",
                            "cannot allocate %llu bytes on device %d",
                            (unsigned long long)bytes, device_of(ctx));
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, (size_t)bytes);
    if (rc != cudaSuccess) {
        /* A failed cudaMalloc also sets the thread's last error; clear it so
         * that a later cudaGetLastError after a kernel launch does not
         * report this, already handled, failure. */
        (void)cudaGetLastError();
        return bn_cuda_error(err, rc, "cudaMalloc", __FILE__, __LINE__);
    }
    *ptr = p;
    return BN_OK;
}

static void cuda_free(void *ctx, void *ptr)
{
    bn_error err;
    bn_error_clear(&err);
    cudaError_t rc = cudaSetDevice(device_of(ctx));
    if (rc == cudaSuccess)
        rc = cudaFree(ptr);
    if (rc != cudaSuccess) {
        /* The vtable's free cannot fail; say why the memory may be lost. */
        (void)cudaGetLastError();
        bn_cuda_error(&err, rc, "cudaFree", __FILE__, __LINE__);
        bn_log(BN_LOG_WARN, "memory pool: %s", err.message);
    }
}

bn_status bn_cuda_allocator_init(int device_id, bn_pool_allocator *out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda allocator: NULL output");
    int count = 0;
    BN_CUDA_TRY(err, cudaGetDeviceCount(&count));
    if (device_id < 0 || device_id >= count)
        return bn_error_set(err, BN_ERR_NO_DEVICE,
                            "the device index is out of range: 'bitnet devices' lists the valid ones",
                            "cuda allocator: device %d does not exist (%d visible)", device_id,
                            count);
    BN_CUDA_TRY(err, cudaSetDevice(device_id));
    *out = (bn_pool_allocator){
        .name = "cuda",
        .alloc = cuda_alloc,
        .free = cuda_free,
        .ctx = (void *)(intptr_t)device_id,
    };
    return BN_OK;
}

bn_status bn_cuda_memory_pool_create(const bn_memory_pool_config *cfg, bn_memory_pool **out,
                                     bn_error *err)
{
    if (out)
        *out = NULL;
    if (!cfg || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda memory pool: NULL config or output");
    bn_pool_allocator a;
    bn_status st = bn_cuda_allocator_init(cfg->device_id, &a, err);
    if (st != BN_OK)
        return st;
    return bn_memory_pool_create(cfg, &a, out, err);
}
