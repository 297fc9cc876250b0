/* Aligned host allocation (SIMD loads, DMA-friendly buffers). */
#include "bitnet.h"

#include <stdint.h>
#include <stdlib.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

/* Buffers of at least this size (the KV caches, the LM head's int8 copy)
 * start on a 2 MiB boundary and ask for transparent huge pages: their
 * rows are read with large strides (a KV head's slice of every cached
 * position), and with 4 KiB pages nearly every row costs a TLB miss. */
#define HUGE_BUFFER_BYTES ((size_t)32 << 20)
#define HUGE_PAGE_BYTES ((size_t)2 << 20)

void *bn_aligned_alloc(size_t alignment, size_t size)
{
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0)
        return NULL;
    /* An allocator adds up to alignment bytes to the size; where that sum
     * wraps, some (AddressSanitizer's) abort instead of returning NULL. */
    if (alignment > SIZE_MAX / 2 || size > SIZE_MAX - alignment)
        return NULL;
    const bool huge = size >= HUGE_BUFFER_BYTES && alignment < HUGE_PAGE_BYTES;
    if (huge)
        alignment = HUGE_PAGE_BYTES;
    void *p = NULL;
    /* posix_memalign, unlike C11 aligned_alloc, needs no size multiple. */
    if (posix_memalign(&p, alignment, size ? size : 1) != 0)
        return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (huge)
        (void)madvise(p, size / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES, MADV_HUGEPAGE); /* a hint */
#endif
    return p;
}

void bn_aligned_free(void *ptr) { free(ptr); }
