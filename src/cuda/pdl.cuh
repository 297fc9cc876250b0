/*
 * pdl.cuh - Programmatic Dependent Launch (compute capability 9.0+) for the
 * kernels of the decode step, shared by the .cu files that launch them.
 *
 * A kernel launched with programmatic stream serialization may start while
 * the kernel before it in the stream is still running. Such a kernel does
 * what needs nothing from earlier kernels first (loading weights, norm
 * vectors, RoPE tables, old KV-cache rows), then calls pdl_wait(), which
 * returns once every earlier kernel has completed and its memory is
 * visible. The rules every kernel launched that way follows:
 *
 *   - no global write, and no read of anything an earlier kernel of the
 *     step may write, before pdl_wait();
 *   - every thread calls pdl_wait() on every path (also threads with
 *     nothing to do): the grid then cannot complete before its
 *     predecessor, so waiting on it covers everything before it too;
 *   - pdl_trigger() (at the start) lets the next kernel be scheduled as
 *     soon as every block of this one is running; where it sits never
 *     affects correctness, only how early the next kernel starts.
 *
 * Compiled for an architecture below 9.0 both are no-ops, so the host must
 * ask for the launch attribute only where the kernels were compiled with
 * them (cudaFuncAttributes::ptxVersion >= 90) and the device runs them.
 * Without the attribute both are no-ops at run time as well.
 */
#ifndef BN_PDL_CUH
#define BN_PDL_CUH

#include <cuda_runtime.h>

#include <utility>

__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Launches kernel<<<grid, block, smem, stream>>>(args...), with
 * programmatic stream serialization when pdl is non-zero. Returns the
 * launch's error. */
template <typename... KArgs, typename... Args>
static inline cudaError_t pdl_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t stream, int pdl, Args &&...args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = pdl ? attr : nullptr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

/* Whether `kernel` was compiled with the PDL instructions. */
template <typename... KArgs> static inline bool pdl_compiled(void (*kernel)(KArgs...))
{
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, (const void *)kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return fa.ptxVersion >= 90;
}

#endif
