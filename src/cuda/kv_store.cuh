/*
 * kv_store.cuh - the KV cache's elements (BN_CB_KV_* in
 * cuda_backend_kernels.h): values stored into a cache of any element (fp32
 * as computed, fp16 rounded to nearest even, e4m3 rounded to nearest even
 * and saturated to +-448, so no byte of the cache is ever a NaN pattern),
 * as the q|k|v epilogues do (rope_qkv.cu, the mma-rows GEMM's); and a
 * launcher's choice of the element type for a BN_CB_KV_* value.
 */
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"

/* One value at element index i. */
static __device__ __forceinline__ void kv_store1(void *cache, int kv, int64_t i, float v)
{
    if (kv == BN_CB_KV_E4M3)
        static_cast<__nv_fp8_storage_t *>(cache)[i] =
            __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    else if (kv == BN_CB_KV_F16)
        static_cast<__half *>(cache)[i] = __float2half_rn(v);
    else
        static_cast<float *>(cache)[i] = v;
}

/* Four values at element index i (a multiple of 4; the cache 16-byte
 * aligned). */
static __device__ __forceinline__ void kv_store4(void *cache, int kv, int64_t i, float4 v)
{
    if (kv == BN_CB_KV_E4M3) {
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x, v.y), __NV_SATFINITE,
                                                     __NV_E4M3);
        const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z, v.w), __NV_SATFINITE,
                                                     __NV_E4M3);
        reinterpret_cast<uint32_t *>(static_cast<uint8_t *>(cache) + i)[0] = lo | hi << 16;
    } else if (kv == BN_CB_KV_F16) {
        __half2 *h = reinterpret_cast<__half2 *>(static_cast<__half *>(cache) + i);
        h[0] = __floats2half2_rn(v.x, v.y);
        h[1] = __floats2half2_rn(v.z, v.w);
    } else {
        *reinterpret_cast<float4 *>(static_cast<float *>(cache) + i) = v;
    }
}

/* f((T *)nullptr) with T the element of cache type kv (float, __half or
 * __nv_fp8_e4m3); cudaErrorInvalidValue for another kv. */
template <class F> static cudaError_t with_kv_element(int kv, F &&f)
{
    switch (kv) {
    case BN_CB_KV_F32: return f((float *)nullptr);
    case BN_CB_KV_F16: return f((__half *)nullptr);
    case BN_CB_KV_E4M3: return f((__nv_fp8_e4m3 *)nullptr);
    default: return cudaErrorInvalidValue;
    }
}
