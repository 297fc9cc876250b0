/*
 * cuda_check.h - the one way CUDA runtime errors become bn_status.
 *
 *     BN_CUDA_TRY(err, cudaMalloc(&p, n));          returns from the enclosing
 *                                                   function on failure
 *     st = BN_CUDA_STATUS(err, cudaEventRecord(ev, s));   the same as a value,
 *                                                   where resources must be
 *                                                   released first
 *
 * Either fills err with the failing call, file, line, CUDA's message and an
 * actionable hint (bn_cuda_fail).
 */
#ifndef BN_CUDA_CHECK_H
#define BN_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The mapping alone: a CUDA error to a bn_status and a hint (out of memory
 * -> reduce the batch or the context; invalid configuration -> the launch
 * parameters; no kernel image -> CUDA_ARCH; no driver, no device). */
bn_status bn_cuda_error(bn_error *err, cudaError_t code, const char *call, const char *file,
                        int line);

/* A failed CUDA runtime call as a bn_status: bn_cuda_error's mapping and
 * hint, plus:
 *   - driver/runtime mismatches (insufficient driver, newer driver needed,
 *     kernel module vs libcuda mismatch, unsupported PTX version) name the
 *     versions found: "driver supports CUDA 12.4, runtime is 13.0";
 *   - the thread's "last error" is cleared, so the next launch check
 *     (cudaGetLastError) does not report this failure again for a kernel that
 *     did nothing wrong. Sticky errors (a kernel fault) cannot be cleared and
 *     keep failing every later call, as they must. */
bn_status bn_cuda_fail(bn_error *err, cudaError_t code, const char *call, const char *file,
                       int line);

/* "driver supports CUDA 12.4, runtime is 13.0" (or "no NVIDIA driver found,
 * runtime is 13.0"). */
void bn_cuda_versions_describe(char *buf, size_t size);

/* Appends " [extra]" to err->message, keeping it NUL-terminated. */
void bn_cuda_append_detail(bn_error *err, const char *extra);

static inline bn_status bn_cuda_status_of(bn_error *err, cudaError_t code, const char *call,
                                          const char *file, int line)
{
    return code == cudaSuccess ? BN_OK : bn_cuda_fail(err, code, call, file, line);
}

#ifdef __cplusplus
}
#endif

#define BN_CUDA_TRY(err, call)                                                         \
    do {                                                                               \
        cudaError_t bn_try_rc_ = (call);                                               \
        if (bn_try_rc_ != cudaSuccess)                                                 \
            return bn_cuda_fail((err), bn_try_rc_, #call, __FILE__, __LINE__);         \
    } while (0)

#define BN_CUDA_STATUS(err, call) bn_cuda_status_of((err), (call), #call, __FILE__, __LINE__)

#endif
