/*
 * tp_exchange.cu - the small collectives of a tensor-parallel team through
 * peer memory (cuda_tp.h): one kernel of one block per rank, instead of
 * NCCL's, for the few kilobytes a decode step exchanges. Contracts:
 * cuda_backend_kernels.h (bn_cb_exchange_*).
 *
 * Each rank owns two slots in its device memory and one flag word per rank;
 * every GPU of the team can read and write the others' memory (peer
 * access). Exchange number e (a count each rank keeps in its own memory,
 * the same on every rank because every rank runs the same exchanges in the
 * same order):
 *
 *   1. the rank copies its part into its slot e % 2;
 *   2. it raises its flag in every peer's flag words to e (a release store
 *      over the system scope, after the block's copies);
 *   3. it waits until every peer's flag in its own flag words reads e
 *      (acquire loads): every part is in place;
 *   4. it reads every rank's slot e % 2, in rank order: the sum (all-reduce)
 *      or the parts side by side (all-gather). Every rank adds in the same
 *      order, so every rank gets the same bits.
 *
 * Two slots suffice: a rank overwrites slot e % 2 at exchange e + 2 only
 * after it has seen every peer's flag of exchange e + 1, which a peer
 * raises only after it has read every slot of exchange e (its kernels run
 * in order). Peers' slots are read with loads that bypass L1 (__ldcv), whose
 * lines could hold an exchange two back. A peer that never arrives (its
 * process died, its GPU failed) would leave the kernel spinning: after
 * about ten seconds it traps, which fails the step instead of hanging it.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"

namespace {

constexpr int kThreads = 1024;
constexpr long long kPatienceCycles = 20000000000ll; /* ~10 s at 2 GHz */

__device__ __forceinline__ void store_release_sys(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long load_acquire_sys(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* Steps 1-3 above; returns the exchange's slot index. */
template <typename T>
__device__ int publish_and_wait(const bn_cb_exchange &x, const T *src, int64_t n)
{
    __shared__ unsigned long long e_shared;
    if (threadIdx.x == 0)
        e_shared = *x.count + 1;
    __syncthreads();
    const unsigned long long e = e_shared;
    const int slot = (int)(e & 1);
    T *mine = reinterpret_cast<T *>(static_cast<char *>(x.slots[x.rank]) + slot * x.slot_bytes);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        mine[i] = __ldcg(src + i);
    __syncthreads();
    const int peer = (int)threadIdx.x;
    if (peer < x.ranks && peer != x.rank) {
        store_release_sys(x.flags[peer] + x.rank, e);
        const long long start = clock64();
        while (load_acquire_sys(x.flags[x.rank] + peer) < e)
            if (clock64() - start > kPatienceCycles)
                __trap();
    }
    __syncthreads();
    if (threadIdx.x == 0)
        *x.count = e;
    return slot;
}

__global__ void __launch_bounds__(kThreads) sum_kernel(bn_cb_exchange x, float *data, int64_t n)
{
    const int slot = publish_and_wait(x, data, n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float s = 0.0f;
        for (int q = 0; q < x.ranks; q++) {
            const float *part = reinterpret_cast<const float *>(
                static_cast<const char *>(x.slots[q]) + slot * x.slot_bytes);
            s = __fadd_rn(s, __ldcv(part + i));
        }
        data[i] = s;
    }
}

__global__ void __launch_bounds__(kThreads)
    gather_kernel(bn_cb_exchange x, const double *mine, double *all, int64_t n)
{
    const int slot = publish_and_wait(x, mine, n);
    for (int q = 0; q < x.ranks; q++) {
        const double *part = reinterpret_cast<const double *>(
            static_cast<const char *>(x.slots[q]) + slot * x.slot_bytes);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            all[q * n + i] = __ldcv(part + i);
    }
}

bool exchange_ok(const bn_cb_exchange *x, size_t bytes)
{
    return x && x->ranks >= 2 && x->ranks <= BN_CB_EXCHANGE_MAX && x->rank >= 0 &&
           x->rank < x->ranks && x->count && bytes <= x->slot_bytes;
}

} // namespace

extern "C" cudaError_t bn_cb_exchange_sum(const bn_cb_exchange *x, float *data, int64_t n,
                                          cudaStream_t stream)
{
    if (!data || n < 0 || !exchange_ok(x, (size_t)n * sizeof(float)))
        return cudaErrorInvalidValue;
    sum_kernel<<<1, kThreads, 0, stream>>>(*x, data, n);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_exchange_gather(const bn_cb_exchange *x, const double *mine,
                                             double *all, int64_t n, cudaStream_t stream)
{
    if (!mine || !all || n < 0 || !exchange_ok(x, (size_t)n * sizeof(double)))
        return cudaErrorInvalidValue;
    gather_kernel<<<1, kThreads, 0, stream>>>(*x, mine, all, n);
    return cudaGetLastError();
}
