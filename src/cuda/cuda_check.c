#include "cuda_check.h"

#include <stdio.h>

bn_status bn_cuda_error(bn_error *err, cudaError_t code, const char *call, const char *file,
                        int line)
{
    bn_status status = BN_ERR_GPU;
    const char *hint = "";
    switch (code) {
    case cudaErrorMemoryAllocation:
        status = BN_ERR_GPU_OUT_OF_MEMORY;
        hint = "reduce the batch size or the context length, or set BITNET_MEMORY_LIMIT";
        break;
    case cudaErrorInsufficientDriver:
        status = BN_ERR_DRIVER;
        hint = "the NVIDIA driver is missing or older than this build's CUDA runtime: install or "
               "update the driver (nvidia-smi shows its version)";
        break;
    case cudaErrorNoDevice:
        status = BN_ERR_NO_DEVICE;
        hint = "no CUDA device is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES";
        break;
    case cudaErrorInvalidDevice:
        status = BN_ERR_NO_DEVICE;
        hint = "the device index is out of range: 'bitnet devices' lists the valid ones";
        break;
    case cudaErrorInvalidConfiguration:
    case cudaErrorLaunchOutOfResources:
        hint = "the kernel's launch parameters exceed the device's limits (threads, registers or "
               "shared memory per block)";
        break;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        status = BN_ERR_UNSUPPORTED;
        hint = "this binary has no code for this GPU: rebuild with CUDA_ARCH set to the GPU's "
               "compute capability (e.g. CUDA_ARCH=sm_90)";
        break;
    default:
        break;
    }
    return bn_error_set(err, status, hint, "%s failed at %s:%d: %s (%s)", call, file, line,
                        cudaGetErrorString(code), cudaGetErrorName(code));
}
