/* Asynchronous 16-byte copies from global to shared memory (cp.async,
 * compute capability 8.0 and up): issue, group, wait. */
#pragma once

#include <stdint.h>

/* BYTES (4, 8 or 16) global -> shared; with ok == false nothing is read and
 * they are zero-filled (src-size 0). 16 bytes bypass L1 (.cg); smaller
 * copies can only go through it (.ca). dst: a shared address
 * (__cvta_generic_to_shared). */
template <int BYTES>
__device__ __forceinline__ void cp_async(uint32_t dst, const void *src, bool ok)
{
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async sizes");
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "r"(ok ? 16 : 0)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                     "n"(BYTES), "r"(ok ? BYTES : 0)
                     : "memory");
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool ok)
{
    cp_async<16>(dst, src, ok);
}

/* 16 bytes global -> shared, or zeros where skip: cp.async's ignore-src
 * operand (the source is then not read, so it may be any address), which
 * spares the size register the form above computes. */
__device__ __forceinline__ void cp_async16_or_zero(uint32_t dst, const void *src, bool skip)
{
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t"
                 "cp.async.cg.shared.global [%0], [%1], 16, p;\n\t}\n" ::"r"(dst),
                 "l"(src), "r"((int)skip)
                 : "memory");
}

/* Closes the group of copies this thread issued since the last commit. */
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most N of this thread's committed groups are in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
