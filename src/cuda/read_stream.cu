/*
 * read_stream.cu - a kernel that does nothing but read a buffer once.
 *
 * A W2A8 GEMV is memory-bound, and its bandwidth is quoted against a large
 * device-to-device copy. One kernel reading a few MB cannot reach that: it
 * pays its launch, its first loads' latency and a last partial wave. This
 * kernel measures what is left for a given size when there is no work at
 * all, so the benchmark can say how far a GEMV is from what any kernel
 * moving its bytes could do.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "pdl.cuh"
#include "read_stream.h"
#include "w2a8_gemv.cuh" /* gemv_load_stream: the GEMV's own weight load */

namespace {

constexpr int kThreads = 512;
constexpr int kLoads = 4; /* 16-byte loads in flight per thread */

__global__ void __launch_bounds__(kThreads)
    read_stream_kernel(const uint4 *__restrict__ buf, size_t n16, uint32_t *sink)
{
    pdl_trigger();
    const size_t stride = (size_t)gridDim.x * kThreads;
    size_t i = (size_t)blockIdx.x * kThreads + threadIdx.x;
    uint32_t acc = 0;
    for (; i + (kLoads - 1) * stride < n16; i += kLoads * stride) {
        uint4 v[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; u++)
            v[u] = gemv_load_stream(buf + i + u * stride);
#pragma unroll
        for (int u = 0; u < kLoads; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = gemv_load_stream(buf + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    for (int o = 16; o > 0; o >>= 1)
        acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    pdl_wait(); /* the sink is written by the kernel before, too */
    if ((threadIdx.x & 31) == 0)
        atomicXor(sink + blockIdx.x % BN_READ_STREAM_SINK_WORDS, acc);
}

} /* namespace */

extern "C" cudaError_t bn_cuda_read_stream(const void *buf, size_t bytes, int blocks, int pdl,
                                           uint32_t *sink, cudaStream_t stream)
{
    if (!buf || !sink || bytes % 16 != 0 || blocks <= 0)
        return cudaErrorInvalidValue;
    return pdl_launch(read_stream_kernel, dim3((unsigned)blocks), dim3(kThreads), 0, stream, pdl,
                      static_cast<const uint4 *>(buf), bytes / 16, sink);
}

extern "C" int bn_cuda_read_stream_pdl_compiled(void)
{
    return pdl_compiled(read_stream_kernel);
}
