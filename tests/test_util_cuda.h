/* test_util_cuda.h - for GPU tests: CUDA_OK fails the test (exit 1) on any
 * CUDA error, naming the call and where. */
#ifndef BN_TEST_UTIL_CUDA_H
#define BN_TEST_UTIL_CUDA_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_OK(call)                                                                        \
    do {                                                                                     \
        cudaError_t rc_ = (call);                                                            \
        if (rc_ != cudaSuccess) {                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(rc_));                                                \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#endif
