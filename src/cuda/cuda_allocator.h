/*
 * cuda_allocator.h - the memory pool's allocator on a real device: plain
 * cudaMalloc/cudaFree (never managed memory, whose page migration would hide
 * out-of-memory until a kernel faults), on the pool's device.
 *
 * Built only with CUDA (BITNET_HAVE_CUDA). The header is plain C.
 */
#ifndef BN_CUDA_ALLOCATOR_H
#define BN_CUDA_ALLOCATOR_H

#include "bitnet.h"
#include "memory_pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *out with the cudaMalloc allocator for device_id, after checking
 * that the device exists (BN_ERR_NO_DEVICE, BN_ERR_DRIVER ... otherwise).
 * The allocator holds no resources: nothing to destroy. */
bn_status bn_cuda_allocator_init(int device_id, bn_pool_allocator *out, bn_error *err);

/* A pool on device cfg->device_id backed by the allocator above. */
bn_status bn_cuda_memory_pool_create(const bn_memory_pool_config *cfg, bn_memory_pool **out,
                                     bn_error *err);

#ifdef __cplusplus
}
#endif

#endif
