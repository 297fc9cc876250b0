/*
 * ptx_loader.h - kernels loaded at run time: PTX text (a string or a file),
 * or CUDA C++ source compiled to PTX by NVRTC (nvrtc_loader.h), loaded
 * through the CUDA driver API and launched on a context's streams.
 *
 * The driver API comes from libcuda.so.1 opened with dlopen (never linked),
 * like cuBLAS. Modules live in the device's primary context - the same one
 * the runtime API uses - so device pointers from cudaMalloc and streams from
 * the bn_cuda_context work unchanged with these kernels, and both APIs can
 * be mixed freely in one program.
 *
 *     bn_ptx_module *mod;
 *     bn_ptx_module_load(ctx, ptx_text, &mod, &err);       (or _load_file,
 *     CUfunction f;                                          or _compile)
 *     bn_ptx_get_function(mod, "add_one", &f, &err);
 *     void *args[] = {&d_ptr, &n};
 *     bn_ptx_launch_config cfg = {{blocks, 1, 1}, {256, 1, 1}, 0, NULL};
 *     bn_ptx_launch(mod, f, &cfg, args, &err);
 *     bn_ptx_module_destroy(mod);
 *
 * A PTX that does not JIT-compile, a missing function or an NVRTC compile
 * error comes back as BN_ERR_FORMAT / BN_ERR_INVALID_ARGUMENT with the JIT or
 * compiler log in the message (as much as fits; the full log goes to the
 * debug log).
 */
#ifndef BN_PTX_LOADER_H
#define BN_PTX_LOADER_H

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bn_cuda_context bn_cuda_context;
typedef struct bn_ptx_module bn_ptx_module;

/* The largest PTX file bn_ptx_module_load_file reads (files are untrusted
 * input). */
#define BN_PTX_FILE_MAX ((size_t)64 << 20)

/* Loads NUL-terminated PTX text into the primary context of ctx's device
 * (JIT-compiled by the driver for that device). The context must outlive
 * the module. libcuda missing is BN_ERR_DRIVER; PTX the JIT rejects is
 * BN_ERR_FORMAT with the JIT error log; PTX newer than the driver is
 * BN_ERR_DRIVER naming the versions. */
bn_status bn_ptx_module_load(bn_cuda_context *ctx, const char *ptx, bn_ptx_module **out,
                             bn_error *err);

/* As bn_ptx_module_load, with the PTX read from a file (BN_ERR_IO when it
 * cannot be read, BN_ERR_FORMAT when empty or larger than BN_PTX_FILE_MAX). */
bn_status bn_ptx_module_load_file(bn_cuda_context *ctx, const char *path, bn_ptx_module **out,
                                  bn_error *err);

/* Compiles CUDA C++ source with NVRTC for ctx's device (bn_nvrtc_compile;
 * name and options as there) and loads the PTX. BN_ERR_UNSUPPORTED when
 * libnvrtc is missing; a compile error is BN_ERR_FORMAT with the compiler
 * log. Kernels looked up by name must be declared extern "C". */
bn_status bn_ptx_module_compile(bn_cuda_context *ctx, const char *source, const char *name,
                                const char *const *options, int n_options, bn_ptx_module **out,
                                bn_error *err);

/* Unloads the module and releases its hold on the primary context. NULL is
 * allowed. */
void bn_ptx_module_destroy(bn_ptx_module *mod);

/* The JIT's information log of the load (register use, spills, ...; may be
 * empty). Valid while the module lives. */
const char *bn_ptx_module_info_log(const bn_ptx_module *mod);

/* The kernel `name` (the PTX .entry name). BN_ERR_INVALID_ARGUMENT naming it
 * when the module has none. The handle lives as long as the module. */
bn_status bn_ptx_get_function(bn_ptx_module *mod, const char *name, CUfunction *out,
                              bn_error *err);

typedef struct bn_ptx_launch_config {
    unsigned grid[3];      /* blocks in x, y, z (y, z: 0 means 1)        */
    unsigned block[3];     /* threads in x, y, z (y, z: 0 means 1)       */
    unsigned shared_bytes; /* dynamic shared memory per block            */
    cudaStream_t stream;   /* NULL: the context's compute stream         */
} bn_ptx_launch_config;

/* Queues f with `args` (an array of pointers to each parameter's value, as
 * cuLaunchKernel takes them) and counts the launch in the context's
 * statistics. Asynchronous: errors inside the kernel show up at the next
 * synchronisation. To time a launch, call this from a
 * bn_cuda_context_time callback. */
bn_status bn_ptx_launch(bn_ptx_module *mod, CUfunction f, const bn_ptx_launch_config *cfg,
                        void **args, bn_error *err);

/* A failed driver API call as a bn_status, with `log` (may be NULL), as a
 * JIT log, appended to the message: out of memory -> reduce batch or
 * context; invalid PTX/image -> BN_ERR_FORMAT; PTX newer than the driver,
 * a missing JIT compiler or a driver mismatch -> BN_ERR_DRIVER with the
 * versions found; bad launch parameters -> the device limits. */
bn_status bn_cu_fail(bn_error *err, CUresult code, const char *call, const char *log,
                     const char *file, int line);

#ifdef __cplusplus
}
#endif

#endif
