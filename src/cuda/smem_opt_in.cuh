/* Dynamic shared memory beyond the default limit.
 *
 * Without opting in, a kernel may use 48 KiB of shared memory in all, and
 * its static __shared__ arrays count against that. So "the dynamic bytes
 * exceed 48 KiB" is the wrong test for needing
 * cudaFuncAttributeMaxDynamicSharedMemorySize: a kernel with 2.4 KB of
 * static arrays fails to launch with 47 KB of dynamic memory ("invalid
 * argument"). allow_dynamic_smem sets the attribute to the bytes of every
 * launch that takes dynamic shared memory instead: a host-side call with no
 * work on the device, also made during stream capture. A launch whose
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
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}
