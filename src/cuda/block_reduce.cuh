/*
 * block_reduce.cuh - reductions over a warp and over a block, every thread
 * getting the result, for any type and operation (the operation object's
 * operator() combines two values: a rounding mode, a maximum, ...). Shared
 * by cuda_backend_kernels.cu and head_screen.cu.
 */
#ifndef BN_BLOCK_REDUCE_CUH
#define BN_BLOCK_REDUCE_CUH

#include <cuda_runtime.h>

/* An xor butterfly: every lane ends with the same value (each step combines
 * the same two operands in both partners). */
template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T v, Op op)
{
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* red: 32 shared slots. The warps' results are combined in warp order by
 * every thread; the trailing barrier lets the caller reuse the slots. All
 * threads of the block must call it. */
template <typename T, typename Op> __device__ __forceinline__ T block_reduce(T v, Op op, T *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_reduce(v, op);
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    T r = red[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++)
        r = op(r, red[i]);
    __syncthreads();
    return r;
}

#endif
