/*
 * head_row.cuh - one row of the LM head: the dot product of an fp32 x
 * (staged in shared memory) with one F32, F16 or BF16 weight row, computed
 * by one warp. The head kernel (lm_head.cu) runs it over every row; the
 * screened head's exact pass (head_screen.cu) over the rows it keeps. Both calling this one function is what makes a kept row's logit
 * the head kernel's bit for bit: the same lanes take the same elements,
 * accumulate them in the same order and reduce with the same butterfly.
 */
#ifndef BN_HEAD_ROW_CUH
#define BN_HEAD_ROW_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda_backend_kernels.h"

/* 16-byte loads per lane in flight: a 2560-wide fp16 / bf16 row is 320 of
 * them, so a warp issues its whole row at once (one memory round trip per
 * row). H200, 2B-4T head (656 MB): 182 us with 4 in flight, 147 us (4.5 TB/s)
 * with 10. */
constexpr int kHeadUnroll = 10;

template <int kType> struct HeadElem;
template <> struct HeadElem<BN_CB_HEAD_F32> {
    static constexpr int kPer16 = 4;
    static constexpr int kBytes = 4;
    __device__ static float at(const void *row, int64_t i)
    {
        return static_cast<const float *>(row)[i];
    }
    __device__ static float dot16(uint4 w, const float *x, float acc)
    {
        acc = fmaf(__uint_as_float(w.x), x[0], acc);
        acc = fmaf(__uint_as_float(w.y), x[1], acc);
        acc = fmaf(__uint_as_float(w.z), x[2], acc);
        return fmaf(__uint_as_float(w.w), x[3], acc);
    }
};
template <> struct HeadElem<BN_CB_HEAD_F16> {
    static constexpr int kPer16 = 8;
    static constexpr int kBytes = 2;
    __device__ static float at(const void *row, int64_t i)
    {
        return __half2float(static_cast<const __half *>(row)[i]);
    }
    __device__ static float dot16(uint4 w, const float *x, float acc)
    {
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&words[i]));
            acc = fmaf(f.x, x[2 * i], acc);
            acc = fmaf(f.y, x[2 * i + 1], acc);
        }
        return acc;
    }
};
template <> struct HeadElem<BN_CB_HEAD_BF16> {
    static constexpr int kPer16 = 8;
    static constexpr int kBytes = 2;
    __device__ static float at(const void *row, int64_t i)
    {
        return __uint_as_float((uint32_t)static_cast<const uint16_t *>(row)[i] << 16);
    }
    __device__ static float dot16(uint4 w, const float *x, float acc)
    {
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc = fmaf(__uint_as_float(words[i] << 16), x[2 * i], acc);
            acc = fmaf(__uint_as_float(words[i] & 0xffff0000u), x[2 * i + 1], acc);
        }
        return acc;
    }
};

/* Whether head_row_dot's vector path takes rows of dim elements (a whole
 * number of 16-byte chunks). Every caller decides by this, so the head
 * kernel and the screened head's exact pass compute a row alike. */
template <int kType> __host__ __device__ constexpr bool head_row_vec(int64_t dim)
{
    return dim % HeadElem<kType>::kPer16 == 0;
}

/* sum_i row[i] xs[i], returned to every lane of the calling warp (all 32
 * lanes must call it). kVec: 16 bytes per lane, kHeadUnroll loads in flight,
 * with the streaming cache hint (every row is read once per token); it
 * needs dim a multiple of 16 bytes' worth of elements. Otherwise one element
 * per lane at a time. Each lane accumulates its elements in order with
 * fmaf, then an xor butterfly adds the 32 partial sums. */
template <int kType, bool kVec>
__device__ __forceinline__ float head_row_dot(const uint8_t *row, const float *xs, int64_t dim,
                                              int lane)
{
    using E = HeadElem<kType>;
    float acc = 0.0f;
    if (kVec) {
        const uint4 *v = reinterpret_cast<const uint4 *>(row);
        const int64_t chunks = dim / E::kPer16;
        for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kHeadUnroll) {
            uint4 buf[kHeadUnroll];
#pragma unroll
            for (int u = 0; u < kHeadUnroll; u++) {
                const int64_t c = c0 + 32 * u;
                buf[u] = c < chunks ? __ldcs(v + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < kHeadUnroll; u++) {
                const int64_t c = c0 + 32 * u;
                if (c < chunks)
                    acc = E::dot16(buf[u], xs + c * E::kPer16, acc);
            }
        }
    } else {
        for (int64_t i = lane; i < dim; i += 32)
            acc = fmaf(E::at(row, i), xs[i], acc);
    }
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

#endif
