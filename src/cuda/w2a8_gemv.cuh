/* Device helpers of the W2A8 GEMV (cuda_layout.h's tile layout), shared by
 * w2a8_kernels.cu, the decode GEMVs of cuda_backend_kernels.cu and (the
 * streaming load) the LM head. */
#ifndef BN_W2A8_GEMV_CUH
#define BN_W2A8_GEMV_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* Weights are read exactly once: load them without allocating in L1, which
 * then keeps the activations every warp re-reads. */
__device__ __forceinline__ uint4 gemv_load_stream(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* dot of one 16-byte entry (64 codes) with 64 activations. */
__device__ __forceinline__ int gemv_entry_dot(uint4 w, const int8_t *x, int acc)
{
    const int4 *xv = reinterpret_cast<const int4 *>(x);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int4 a = xv[i]; /* activations 16i .. 16i + 15 */
        const uint32_t wd = words[i];
        acc = __dp4a((int)(wd & 0x03030303u), a.x, acc);
        acc = __dp4a((int)((wd >> 2) & 0x03030303u), a.y, acc);
        acc = __dp4a((int)((wd >> 4) & 0x03030303u), a.z, acc);
        acc = __dp4a((int)((wd >> 6) & 0x03030303u), a.w, acc);
    }
    return acc;
}

#endif
