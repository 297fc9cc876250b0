/* w2a8_epilogue.cuh - the pieces every W2A8 product kernel (the GEMV, the
 * rows and pipelined GEMMs, the wgmma GEMM) and the dev/cuda labs share:
 * the float epilogue the CPU computes, and the int8 tensor-core product. */
#ifndef BN_W2A8_EPILOGUE_CUH
#define BN_W2A8_EPILOGUE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* y = ((float)acc / act_scale) * w_scale, written exactly as
 * bn_w2a8_epilogue: IEEE division and multiply, never contracted, so the
 * result is the CPU's bit for bit. */
__device__ __forceinline__ float w2a8_epilogue(int32_t acc, float act_scale, float w_scale)
{
    return __fmul_rn(__fdiv_rn((float)acc, act_scale), w_scale);
}

/* c += a . b on the tensor cores: mma m16n8k32, int8 in, int32 sums. */
__device__ __forceinline__ void w2a8_mma_s8(int32_t c[4], const uint32_t a[4], const uint32_t b[2])
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#endif
