/*
 * nvrtc_loader.h - NVRTC (CUDA C++ -> PTX at run time) opened with dlopen,
 * so only programs that compile kernels at run time need libnvrtc; without
 * it they get BN_ERR_UNSUPPORTED naming the library and may load prebuilt
 * PTX instead (ptx_loader.h). Compiling needs no GPU.
 */
#ifndef BN_NVRTC_LOADER_H
#define BN_NVRTC_LOADER_H

#include <nvrtc.h>
#include <stddef.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bn_nvrtc {
    const char *(*get_error_string)(nvrtcResult result);
    nvrtcResult (*version)(int *major, int *minor);
    nvrtcResult (*get_num_supported_archs)(int *count);
    nvrtcResult (*get_supported_archs)(int *archs);
    nvrtcResult (*create_program)(nvrtcProgram *prog, const char *src, const char *name,
                                  int num_headers, const char *const *headers,
                                  const char *const *include_names);
    nvrtcResult (*destroy_program)(nvrtcProgram *prog);
    nvrtcResult (*compile_program)(nvrtcProgram prog, int num_options,
                                   const char *const *options);
    nvrtcResult (*get_ptx_size)(nvrtcProgram prog, size_t *size);
    nvrtcResult (*get_ptx)(nvrtcProgram prog, char *ptx);
    nvrtcResult (*get_program_log_size)(nvrtcProgram prog, size_t *size);
    nvrtcResult (*get_program_log)(nvrtcProgram prog, char *log);
    int major, minor;  /* nvrtcVersion                */
    char library[64];  /* the file that was opened    */
} bn_nvrtc;

/* Loads libnvrtc once per process; BN_ERR_UNSUPPORTED naming the library
 * when it is missing or incomplete. */
bn_status bn_nvrtc_get(const bn_nvrtc **out, bn_error *err);

/* The virtual architecture NVRTC should target for a device of compute
 * capability cc_major.cc_minor: the newest one NVRTC supports that is not
 * newer than the device (PTX is JIT-compiled forward, never backward), as
 * major * 10 + minor, e.g. 90. BN_ERR_UNSUPPORTED when NVRTC supports
 * nothing that old. */
bn_status bn_nvrtc_pick_arch(int cc_major, int cc_minor, int *arch, bn_error *err);

/* Compiles CUDA C++ `source` (name: shown in diagnostics, e.g. "add_one.cu")
 * to PTX for compute capability cc_major.cc_minor, with extra NVRTC options
 * (may be NULL when n_options is 0). Kernels meant to be found by name must
 * be declared extern "C" (else their names are C++-mangled).
 *
 * On success *ptx is a NUL-terminated malloc'ed string (free it). log, when
 * not NULL, receives a malloc'ed copy of NVRTC's log (possibly empty; free
 * it) on success and failure alike. A compile error is BN_ERR_FORMAT with
 * the start of the log in the message. */
bn_status bn_nvrtc_compile(const char *source, const char *name, int cc_major, int cc_minor,
                           const char *const *options, int n_options, char **ptx, char **log,
                           bn_error *err);

#ifdef __cplusplus
}
#endif

#endif
