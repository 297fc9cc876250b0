/* Run-time kernel loading through the driver API; see ptx_loader.h. */
#include "ptx_loader.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cuda_context.h"
#include "nvrtc_loader.h"

/* ------------------------------------------------------------------------ */
/* libcuda through dlopen                                                    */
/* ------------------------------------------------------------------------ */

typedef struct cu_api {
    CUresult (*init)(unsigned flags);
    CUresult (*driver_get_version)(int *version);
    CUresult (*device_get)(CUdevice *device, int ordinal);
    CUresult (*primary_ctx_retain)(CUcontext *ctx, CUdevice device);
    CUresult (*primary_ctx_release)(CUdevice device);
    CUresult (*ctx_set_current)(CUcontext ctx);
    CUresult (*module_load_data_ex)(CUmodule *module, const void *image, unsigned n_options,
                                    CUjit_option *options, void **values);
    CUresult (*module_unload)(CUmodule module);
    CUresult (*module_get_function)(CUfunction *f, CUmodule module, const char *name);
    CUresult (*launch_kernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, unsigned shared, CUstream stream,
                              void **params, void **extra);
    CUresult (*get_error_name)(CUresult code, const char **name);
    CUresult (*get_error_string)(CUresult code, const char **text);
} cu_api;

static struct {
    pthread_once_t once;
    cu_api api;
    bool ok;
    char why[256];
} driver = {PTHREAD_ONCE_INIT, {0}, false, ""};

static bool bind(void *lib, void *slot, const char *symbol)
{
    /* Through void ** as POSIX intends (no object-to-function cast in ISO C). */
    *(void **)slot = dlsym(lib, symbol);
    if (*(void **)slot)
        return true;
    snprintf(driver.why, sizeof driver.why, "libcuda.so.1 lacks %s (driver too old?)", symbol);
    return false;
}

static void load_driver(void)
{
    /* The runtime (linked statically) opens the same file, so this only
     * takes another reference to the library already in the process. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(driver.why, sizeof driver.why, "%s", e ? e : "libcuda.so.1 not found");
        return;
    }
    cu_api *a = &driver.api;
    /* cuda.h maps some names to versioned symbols (cuDevicePrimaryCtxRelease
     * -> _v2); dlsym needs the real symbol names. */
    driver.ok = bind(lib, &a->init, "cuInit") &&
                bind(lib, &a->driver_get_version, "cuDriverGetVersion") &&
                bind(lib, &a->device_get, "cuDeviceGet") &&
                bind(lib, &a->primary_ctx_retain, "cuDevicePrimaryCtxRetain") &&
                bind(lib, &a->primary_ctx_release, "cuDevicePrimaryCtxRelease_v2") &&
                bind(lib, &a->ctx_set_current, "cuCtxSetCurrent") &&
                bind(lib, &a->module_load_data_ex, "cuModuleLoadDataEx") &&
                bind(lib, &a->module_unload, "cuModuleUnload") &&
                bind(lib, &a->module_get_function, "cuModuleGetFunction") &&
                bind(lib, &a->launch_kernel, "cuLaunchKernel") &&
                bind(lib, &a->get_error_name, "cuGetErrorName") &&
                bind(lib, &a->get_error_string, "cuGetErrorString");
}

static bn_status get_driver(const cu_api **out, bn_error *err)
{
    pthread_once(&driver.once, load_driver);
    if (!driver.ok)
        return bn_error_set(err, BN_ERR_DRIVER,
                            "install the NVIDIA driver; 'nvidia-smi' should then list the GPU",
                            "the CUDA driver API (libcuda.so.1) is not available: %s",
                            driver.why);
    *out = &driver.api;
    return BN_OK;
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

bn_status bn_cu_fail(bn_error *err, CUresult code, const char *call, const char *log,
                     const char *file, int line)
{
    const char *name = "CUDA_ERROR_?", *text = "unknown driver error";
    if (driver.ok) {
        if (driver.api.get_error_name(code, &name) != CUDA_SUCCESS || !name)
            name = "CUDA_ERROR_?";
        if (driver.api.get_error_string(code, &text) != CUDA_SUCCESS || !text)
            text = "unknown driver error";
    }
    bn_status st = BN_ERR_GPU;
    const char *hint = NULL;
    bool versions = false;
    switch (code) {
    case CUDA_ERROR_OUT_OF_MEMORY:
        st = BN_ERR_GPU_OUT_OF_MEMORY;
        hint = "reduce the batch size or the context length, or set BITNET_MEMORY_LIMIT";
        break;
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_INVALID_SOURCE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
        st = BN_ERR_FORMAT;
        hint = "the module does not compile for this GPU: the JIT log in the message says where";
        break;
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
        st = BN_ERR_DRIVER;
        hint = "the PTX's .version is newer than this driver's JIT compiler: update the driver, "
               "or generate PTX with an older toolkit";
        versions = true;
        break;
    case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
        st = BN_ERR_DRIVER;
        hint = "the driver's PTX JIT compiler (libnvidia-ptxjitcompiler) is missing: install "
               "the full NVIDIA driver";
        break;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
        st = BN_ERR_DRIVER;
        hint = "the NVIDIA driver and the CUDA libraries do not match: update the driver, or "
               "reboot after a driver update";
        versions = true;
        break;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
        st = BN_ERR_NO_DEVICE;
        hint = "check nvidia-smi and CUDA_VISIBLE_DEVICES";
        break;
    case CUDA_ERROR_NOT_FOUND:
        st = BN_ERR_INVALID_ARGUMENT;
        hint = "check the name; kernels compiled as C++ need extern \"C\" to keep it";
        break;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
        st = code == CUDA_ERROR_INVALID_VALUE ? BN_ERR_INVALID_ARGUMENT : BN_ERR_GPU;
        hint = "the launch parameters exceed the device's limits (threads, registers or shared "
               "memory per block) or an argument is invalid";
        break;
    default:
        break;
    }
    bn_error_set(err, st, hint, "%s failed at %s:%d: %s (%s)", call, file, line, text, name);
    if (err) {
        size_t used = strlen(err->message);
        if (versions) {
            char v[128];
            bn_cuda_versions_describe(v, sizeof v);
            snprintf(err->message + used, sizeof err->message - used, " [%s]", v);
            used = strlen(err->message);
        }
        if (log && log[0])
            snprintf(err->message + used, sizeof err->message - used, ": %s", log);
    }
    return st;
}

/* Calls go through the table, so the message names the driver function
 * rather than the table expression. */
#define CU_TRY(err, name, call)                                                        \
    do {                                                                               \
        CUresult bn_cu_rc_ = (call);                                                   \
        if (bn_cu_rc_ != CUDA_SUCCESS)                                                 \
            return bn_cu_fail((err), bn_cu_rc_, name, NULL, __FILE__, __LINE__);       \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Modules                                                                   */
/* ------------------------------------------------------------------------ */

#define JIT_LOG_BYTES 8192

struct bn_ptx_module {
    bn_cuda_context *ctx;
    const cu_api *cu;
    CUdevice device;
    CUcontext primary;
    CUmodule module;
    char info_log[JIT_LOG_BYTES];
};

/* Retains the device's primary context and makes it current on this thread
 * (what cudaSetDevice does for the runtime). */
static bn_status enter_primary(bn_ptx_module *mod, bn_error *err)
{
    const cu_api *cu = mod->cu;
    CU_TRY(err, "cuInit", cu->init(0));
    CU_TRY(err, "cuDeviceGet", cu->device_get(&mod->device, bn_cuda_context_device_id(mod->ctx)));
    CU_TRY(err, "cuDevicePrimaryCtxRetain", cu->primary_ctx_retain(&mod->primary, mod->device));
    const CUresult rc = cu->ctx_set_current(mod->primary);
    if (rc != CUDA_SUCCESS) {
        cu->primary_ctx_release(mod->device);
        mod->primary = NULL;
        return bn_cu_fail(err, rc, "cuCtxSetCurrent", NULL, __FILE__, __LINE__);
    }
    return BN_OK;
}

bn_status bn_ptx_module_load(bn_cuda_context *ctx, const char *ptx, bn_ptx_module **out,
                             bn_error *err)
{
    if (!ctx || !ptx || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "PTX load: NULL argument");
    *out = NULL;
    if (!ptx[0])
        return bn_error_set(err, BN_ERR_FORMAT, NULL, "PTX load: the PTX text is empty");
    bn_ptx_module *mod = calloc(1, sizeof *mod);
    if (!mod)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "PTX load: out of host memory");
    mod->ctx = ctx;
    bn_status st = get_driver(&mod->cu, err);
    if (st == BN_OK)
        st = enter_primary(mod, err);
    if (st != BN_OK) {
        free(mod);
        return st;
    }

    /* The JIT writes its diagnostics into our buffers; sizes travel as
     * pointer-sized integers, as the driver API defines for these options. */
    char *error_log = calloc(JIT_LOG_BYTES, 1);
    if (!error_log) {
        mod->cu->primary_ctx_release(mod->device);
        free(mod);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "PTX load: out of host memory");
    }
    CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                              CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                              CU_JIT_LOG_VERBOSE};
    void *values[] = {error_log, (void *)(uintptr_t)JIT_LOG_BYTES, mod->info_log,
                      (void *)(uintptr_t)JIT_LOG_BYTES, (void *)(uintptr_t)1};
    const CUresult rc = mod->cu->module_load_data_ex(
        &mod->module, ptx, (unsigned)(sizeof options / sizeof options[0]), options, values);
    if (rc != CUDA_SUCCESS) {
        error_log[JIT_LOG_BYTES - 1] = '\0';
        if (error_log[0])
            bn_log(BN_LOG_DEBUG, "PTX JIT error log:\n%s", error_log);
        st = bn_cu_fail(err, rc, "cuModuleLoadDataEx", error_log, __FILE__, __LINE__);
        free(error_log);
        mod->cu->primary_ctx_release(mod->device);
        free(mod);
        return st;
    }
    free(error_log);
    mod->info_log[JIT_LOG_BYTES - 1] = '\0';
    if (mod->info_log[0])
        bn_log(BN_LOG_DEBUG, "PTX JIT info log:\n%s", mod->info_log);
    *out = mod;
    return BN_OK;
}

bn_status bn_ptx_module_load_file(bn_cuda_context *ctx, const char *path, bn_ptx_module **out,
                                  bn_error *err)
{
    if (!ctx || !path || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "PTX load: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return bn_error_set(err, BN_ERR_IO, "check the path and its permissions",
                            "cannot open PTX file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return bn_error_set(err, BN_ERR_IO, NULL, "%s is not a regular file", path);
    }
    if (sb.st_size <= 0 || (uint64_t)sb.st_size > BN_PTX_FILE_MAX) {
        fclose(f);
        return bn_error_set(err, BN_ERR_FORMAT, NULL,
                            "PTX file %s has %lld bytes (expected 1 ... %zu)", path,
                            (long long)sb.st_size, BN_PTX_FILE_MAX);
    }
    const size_t size = (size_t)sb.st_size;
    char *text = malloc(size + 1);
    if (!text) {
        fclose(f);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "PTX load: out of host memory");
    }
    const size_t got = fread(text, 1, size, f);
    fclose(f);
    if (got != size) {
        free(text);
        return bn_error_set(err, BN_ERR_IO, NULL, "short read of PTX file %s (%zu of %zu bytes)",
                            path, got, size);
    }
    text[size] = '\0'; /* the driver reads PTX up to the first NUL */
    const bn_status st = bn_ptx_module_load(ctx, text, out, err);
    free(text);
    if (st != BN_OK && err) {
        /* Say which file it was: "path: " in front, the message (and its
         * JIT log) after it, cut at the end if it no longer fits. */
        const size_t prefix = strlen(path) + 2;
        if (prefix < sizeof err->message) {
            size_t kept = strlen(err->message);
            if (prefix + kept >= sizeof err->message)
                kept = sizeof err->message - prefix - 1;
            memmove(err->message + prefix, err->message, kept);
            memcpy(err->message, path, prefix - 2);
            memcpy(err->message + prefix - 2, ": ", 2);
            err->message[prefix + kept] = '\0';
        }
    }
    return st;
}

bn_status bn_ptx_module_compile(bn_cuda_context *ctx, const char *source, const char *name,
                                const char *const *options, int n_options, bn_ptx_module **out,
                                bn_error *err)
{
    if (!ctx || !source || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "PTX compile: NULL argument");
    *out = NULL;
    const bn_cuda_device *dev = bn_cuda_context_device(ctx);
    char *ptx = NULL, *log = NULL;
    bn_status st = bn_nvrtc_compile(source, name, dev->cc_major, dev->cc_minor, options,
                                    n_options, &ptx, &log, err);
    if (log && log[0])
        bn_log(BN_LOG_DEBUG, "NVRTC log for %s:\n%s", name ? name : "source", log);
    free(log);
    if (st == BN_OK)
        st = bn_ptx_module_load(ctx, ptx, out, err);
    free(ptx);
    return st;
}

void bn_ptx_module_destroy(bn_ptx_module *mod)
{
    if (!mod)
        return;
    /* Unloading needs the module's context current on this thread. */
    CUresult rc = mod->cu->ctx_set_current(mod->primary);
    if (rc == CUDA_SUCCESS)
        rc = mod->cu->module_unload(mod->module);
    if (rc != CUDA_SUCCESS)
        bn_log(BN_LOG_WARN, "PTX module unload failed (driver error %d)", (int)rc);
    rc = mod->cu->primary_ctx_release(mod->device);
    if (rc != CUDA_SUCCESS)
        bn_log(BN_LOG_WARN, "cuDevicePrimaryCtxRelease failed (driver error %d)", (int)rc);
    free(mod);
}

const char *bn_ptx_module_info_log(const bn_ptx_module *mod)
{
    return mod ? mod->info_log : "";
}

bn_status bn_ptx_get_function(bn_ptx_module *mod, const char *name, CUfunction *out,
                              bn_error *err)
{
    if (!mod || !name || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "PTX function: NULL argument");
    CU_TRY(err, "cuCtxSetCurrent", mod->cu->ctx_set_current(mod->primary));
    const CUresult rc = mod->cu->module_get_function(out, mod->module, name);
    if (rc == CUDA_ERROR_NOT_FOUND)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "check the .entry names in the PTX; kernels compiled as C++ need "
                            "extern \"C\" to keep their names",
                            "the module has no kernel named '%s'", name);
    if (rc != CUDA_SUCCESS)
        return bn_cu_fail(err, rc, "cuModuleGetFunction", NULL, __FILE__, __LINE__);
    return BN_OK;
}

bn_status bn_ptx_launch(bn_ptx_module *mod, CUfunction f, const bn_ptx_launch_config *cfg,
                        void **args, bn_error *err)
{
    if (!mod || !f || !cfg)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "PTX launch: NULL argument");
    if (cfg->grid[0] == 0 || cfg->block[0] == 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "launch at least one block of one thread",
                            "PTX launch: grid.x %u, block.x %u", cfg->grid[0], cfg->block[0]);
    const unsigned gy = cfg->grid[1] ? cfg->grid[1] : 1, gz = cfg->grid[2] ? cfg->grid[2] : 1;
    const unsigned by = cfg->block[1] ? cfg->block[1] : 1, bz = cfg->block[2] ? cfg->block[2] : 1;
    /* cudaStream_t and CUstream are the same type: the runtime's streams
     * work here as they are. */
    const cudaStream_t stream =
        cfg->stream ? cfg->stream : bn_cuda_context_compute_stream(mod->ctx);
    CU_TRY(err, "cuCtxSetCurrent", mod->cu->ctx_set_current(mod->primary));
    const CUresult rc = mod->cu->launch_kernel(f, cfg->grid[0], gy, gz, cfg->block[0], by, bz,
                                               cfg->shared_bytes, stream, args, NULL);
    if (rc != CUDA_SUCCESS) {
        char call[128];
        snprintf(call, sizeof call, "cuLaunchKernel(grid %ux%ux%u, block %ux%ux%u, shared %u)",
                 cfg->grid[0], gy, gz, cfg->block[0], by, bz, cfg->shared_bytes);
        return bn_cu_fail(err, rc, call, NULL, __FILE__, __LINE__);
    }
    bn_cuda_context_record_launch(mod->ctx, 0);
    return BN_OK;
}
