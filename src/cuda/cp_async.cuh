/* Asynchronous 16-byte copies from global to shared memory (cp.async,
 * compute capability 8.0 and up): issue, group, wait. */
#pragma once

#include <stdint.h>

/* 16 bytes global -> shared, bypassing L1 (.cg); with ok == false nothing
 * is read and the 16 bytes are zero-filled (src-size 0). dst: a shared
 * address (__cvta_generic_to_shared). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0)
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
