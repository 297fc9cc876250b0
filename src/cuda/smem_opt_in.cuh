/* Dynamic shared memory beyond the default limit.
 *
 * Without opting in, a kernel may use 48 KiB of shared memory in all, and
 * its static __shared__ arrays count against that. So "the dynamic bytes
 * exceed 48 KiB" is the wrong test for needing
 * cudaFuncAttributeMaxDynamicSharedMemorySize: a kernel with 2.4 KB of
 * static arrays fails to launch with 47 KB of dynamic memory ("invalid
 * argument"). allow_dynamic_smem therefore opts in for every launch that
 * takes dynamic shared memory: a host-side call with no work on the
 * device, also made during stream capture.
 *
 * It raises the kernel's limit to the most this device allows it (the
 * opt-in maximum less its static arrays), never to the bytes of one
 * launch: the attribute belongs to the kernel, not to the launch, so with
 * per-launch values a host thread launching the kernel with more bytes
 * than another thread just set fails ("invalid argument"), as the replicas'
 * threads did (docs/CUDA.md). The largest value is the same for every
 * caller, and a launch that already fits skips the call. A launch whose
 * static and dynamic memory together do not fit a block of this device
 * still fails, with the error returned here. */
#pragma once

#include <cuda_runtime.h>
#include <limits.h>
#include <stddef.h>

template <typename... Args>
static inline cudaError_t allow_dynamic_smem(void (*kernel)(Args...), size_t bytes)
{
    if (bytes == 0)
        return cudaSuccess;
    if (bytes > (size_t)INT_MAX)
        return cudaErrorInvalidValue;
    cudaFuncAttributes fa;
    cudaError_t rc = cudaFuncGetAttributes(&fa, kernel);
    if (rc != cudaSuccess)
        return rc;
    if ((size_t)fa.maxDynamicSharedSizeBytes >= bytes)
        return cudaSuccess;
    int dev = 0, optin = 0;
    rc = cudaGetDevice(&dev);
    if (rc == cudaSuccess)
        rc = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (rc != cudaSuccess)
        return rc;
    const size_t most = (size_t)optin > fa.sharedSizeBytes ? (size_t)optin - fa.sharedSizeBytes : 0;
    if (bytes > most)
        return cudaErrorInvalidValue;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most);
}
