#include "cuda_check.h"

#include <stdio.h>
#include <string.h>

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

static void version_text(int v, char *buf, size_t size)
{
    snprintf(buf, size, "%d.%d", v / 1000, v % 1000 / 10);
}

void bn_cuda_versions_describe(char *buf, size_t size)
{
    int driver = 0, runtime = 0;
    /* Both answer without a GPU; the driver version is 0 without a driver. */
    if (cudaDriverGetVersion(&driver) != cudaSuccess)
        driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess)
        runtime = 0;
    char d[16], r[16];
    version_text(driver, d, sizeof d);
    version_text(runtime, r, sizeof r);
    if (driver == 0)
        snprintf(buf, size, "no NVIDIA driver found, runtime is %s", r);
    else
        snprintf(buf, size, "driver supports CUDA %s, runtime is %s", d, r);
}

void bn_cuda_append_detail(bn_error *err, const char *extra)
{
    if (!err)
        return;
    const size_t used = strlen(err->message);
    snprintf(err->message + used, sizeof err->message - used, " [%s]", extra);
}

bn_status bn_cuda_fail(bn_error *err, cudaError_t code, const char *call, const char *file,
                       int line)
{
    (void)cudaGetLastError();
    const bn_status st = bn_cuda_error(err, code, call, file, line);
    const char *hint = NULL;
    switch (code) {
    case cudaErrorInsufficientDriver:
        break; /* bn_cuda_error's hint says what to do */
    case cudaErrorCallRequiresNewerDriver:
        hint = "this call needs a newer NVIDIA driver than the one installed: update the driver";
        break;
    case cudaErrorSystemDriverMismatch:
        hint = "the loaded NVIDIA kernel module and libcuda.so differ in version: reboot after "
               "a driver update, or reinstall the driver";
        break;
    case cudaErrorCompatNotSupportedOnDevice:
        hint = "CUDA forward compatibility is not supported on this GPU: install a driver that "
               "supports this CUDA version natively";
        break;
    case cudaErrorUnsupportedPtxVersion:
        hint = "the PTX is newer than the driver's JIT compiler: update the driver or rebuild "
               "for this GPU's architecture (CUDA_ARCH)";
        break;
    default:
        return st;
    }
    if (err) {
        char versions[128];
        bn_cuda_versions_describe(versions, sizeof versions);
        bn_cuda_append_detail(err, versions);
        if (hint)
            snprintf(err->hint, sizeof err->hint, "%s", hint);
    }
    return st;
}
