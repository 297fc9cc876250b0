/*
 * attn_f32.cuh - what the attention kernels over the fp32 KV cache share
 * (attn_decode.cu, attn_prefill.cu): the widest head they take, float4
 * arithmetic, the reductions' operators and the shape check.
 */
#ifndef BN_ATTN_F32_CUH
#define BN_ATTN_F32_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"

constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxChunks = 2; /* float4 chunks per lane: head_dim <= 256 */

struct MaxF {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumF {
    __device__ float operator()(float a, float b) const { return a + b; }
};

__device__ __forceinline__ float4 f4_scale(float4 a, float c)
{
    return make_float4(a.x * c, a.y * c, a.z * c, a.w * c);
}

__device__ __forceinline__ float4 f4_axpy(float p, float4 v, float4 acc)
{
    return make_float4(fmaf(p, v.x, acc.x), fmaf(p, v.y, acc.y), fmaf(p, v.z, acc.z),
                       fmaf(p, v.w, acc.w));
}

__device__ __forceinline__ float f4_dot(float4 a, float4 b, float acc)
{
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

__device__ __forceinline__ float4 f4_div(float4 a, float d)
{
    return make_float4(a.x / d, a.y / d, a.z / d, a.w / d);
}

/* A shape the kernels take: whole groups of query heads per kv head,
 * head_dim a multiple of 4 up to 256, a capacity that fits an int. */
static inline bool attn_shape_ok(const bn_cb_attn_shape *s)
{
    return s && s->n_heads > 0 && s->n_kv_heads > 0 && s->n_heads % s->n_kv_heads == 0 &&
           s->head_dim > 0 && s->head_dim % 4 == 0 && s->head_dim <= 32 * 4 * kMaxChunks &&
           s->capacity > 0 && s->capacity <= INT32_MAX;
}

#endif
