/*
 * decode_handoff.cu - the decode step's last kernel (bn_cb_decode_handoff in
 * cuda_backend_kernels.h): one thread that hands the step's chosen token to
 * the host and to the step after it.
 *
 * Why a kernel and not copies: a device-to-host cudaMemcpyAsync after a
 * decode graph costs ~10 us of the stream's time on an H200, a one-thread
 * kernel ~1 us; and the next step's inputs written here let the host queue
 * that step before this one has finished (a chained step), instead of
 * uploading them once the token is known.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"
#include "pdl.cuh"
#include "sample_key.cuh"

namespace {

__global__ void handoff_kernel(const unsigned long long *__restrict__ key,
                               const int32_t *__restrict__ token, int32_t vocab, void *host,
                               const int32_t *__restrict__ step, int32_t *feed)
{
    pdl_wait(); /* with PDL: everything it reads is the kernels' before it (through L2) */
    const unsigned long long k = key ? __ldcg(key) : 0ull;
    const int32_t t = key ? key_id(k) : __ldcg(token);
    if (host) {
        if (key)
            *static_cast<unsigned long long *>(host) = k;
        else
            *static_cast<int32_t *>(host) = t;
    }
    if (feed) {
        /* A token outside the vocabulary (-1: a refused draw, or no token
         * because every logit is NaN or -inf) is reported
         * to the host as it is; the step fed by it reads row 0 instead, so
         * that it stays in bounds until the host discards it. */
        feed[0] = t >= 0 && t < vocab ? t : 0;
        feed[1] = __ldcg(step + 1) + 1;
        feed[2] = __ldcg(step + 2) + 1;
    }
}

/* A key of row id of a part of the vocabulary that starts at row `first`:
 * the same logit, token first + id (the id is stored as 0xffffffff - id). */
__global__ void key_shift_kernel(unsigned long long *key, uint32_t first)
{
    const unsigned long long k = *key;
    const uint32_t low = (uint32_t)k - first;
    *key = (k & 0xffffffff00000000ull) | low;
}

} // namespace

extern "C" cudaError_t bn_cb_key_shift_rows(unsigned long long *key, int64_t first,
                                            cudaStream_t stream)
{
    if (!key || first < 0 || first > INT32_MAX)
        return cudaErrorInvalidValue;
    key_shift_kernel<<<1, 1, 0, stream>>>(key, (uint32_t)first);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_decode_handoff(const unsigned long long *key, const int32_t *token,
                                            int32_t vocab, void *host, const int32_t *step,
                                            int32_t *feed, int pdl, cudaStream_t stream)
{
    if ((!key) == (!token) || vocab < 1 || (feed && !step) ||
        (host && (uintptr_t)host % (key ? 8 : 4)))
        return cudaErrorInvalidValue;
    return pdl_launch(handoff_kernel, dim3(1), dim3(1), 0, stream, pdl, key, token, vocab, host,
                      step, feed);
}
