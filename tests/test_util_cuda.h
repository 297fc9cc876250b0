/* test_util_cuda.h - for GPU tests: CUDA_OK fails the test (exit 1) on any
 * CUDA error, naming the call and where. */
#ifndef BN_TEST_UTIL_CUDA_H
#define BN_TEST_UTIL_CUDA_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_util.h"

#define CUDA_OK(call)                                                                        \
    do {                                                                                     \
        cudaError_t rc_ = (call);                                                            \
        if (rc_ != cudaSuccess) {                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(rc_));                                                \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* Device 0's properties, or exit 77 (skipped) with the reason when there
 * is no usable CUDA device or it is older than min_major.0 (why_major says
 * what needs it). Seeds the test's randomness and prints the device. */
static inline struct cudaDeviceProp test_require_cuda(int min_major, const char *why_major)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        TEST_SKIP("no usable CUDA device (see 'bitnet devices')");
    struct cudaDeviceProp p;
    CUDA_OK(cudaGetDeviceProperties(&p, 0));
    if (p.major < min_major)
        TEST_SKIP("%s needs compute capability %d.0; this GPU is %d.%d", why_major, min_major,
                  p.major, p.minor);
    test_seed_init();
    printf("device: %s, %d SMs\n", p.name, p.multiProcessorCount);
    return p;
}

#endif
