/*
 * cuda_check.h - the one way CUDA errors become bn_status.
 *
 *     BN_CUDA_CHECK(err, cudaMalloc(&p, n));
 *
 * returns from the enclosing function with a bn_status and fills err with
 * the failing call, file, line, CUDA's message and a hint.
 */
#ifndef BN_CUDA_CHECK_H
#define BN_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Maps a CUDA error to a bn_status with an actionable hint. */
bn_status bn_cuda_error(bn_error *err, cudaError_t code, const char *call, const char *file,
                        int line);

#ifdef __cplusplus
}
#endif

#define BN_CUDA_CHECK(err, call)                                                   \
    do {                                                                           \
        cudaError_t bn_cuda_rc_ = (call);                                          \
        if (bn_cuda_rc_ != cudaSuccess)                                            \
            return bn_cuda_error((err), bn_cuda_rc_, #call, __FILE__, __LINE__);   \
    } while (0)

#endif
