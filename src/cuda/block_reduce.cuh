/*
 * block_reduce.cuh - reductions over a warp and over a block, every thread
 * getting the result, for any type and operation (the operation object's
 * operator() combines two values: a rounding mode, a maximum, ...), and
 * maxima of non-negative values by redux.sync. Shared by the CUDA
 * backend's kernels (norm_quantize.cu, the attention files) and
 * head_screen.cu.
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

/* The maximum over a warp of non-negative, non-NaN values by redux.sync
 * (sm_80 and later), one instruction instead of a five-step butterfly,
 * every lane getting it. Such floats and doubles order as their bit
 * patterns do, so the unsigned maximum is the floating one, bit for bit
 * fmaxf's / fmax's; a double takes the largest high word, then the largest
 * low word among the lanes holding it. */
__device__ __forceinline__ float warp_max_nonneg(float v)
{
    return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(v)));
}

__device__ __forceinline__ double warp_max_nonneg(double v)
{
    const unsigned long long b = (unsigned long long)__double_as_longlong(v);
    const unsigned hi = __reduce_max_sync(0xffffffffu, (unsigned)(b >> 32));
    const unsigned lo =
        __reduce_max_sync(0xffffffffu, (unsigned)(b >> 32) == hi ? (unsigned)b : 0u);
    return __longlong_as_double((long long)(((unsigned long long)hi << 32) | lo));
}

#endif
