/* Aligned host allocation (SIMD loads, DMA-friendly buffers). */
#include "bitnet.h"

#include <stdint.h>
#include <stdlib.h>

void *bn_aligned_alloc(size_t alignment, size_t size)
{
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0)
        return NULL;
    /* An allocator adds up to alignment bytes to the size; where that sum
     * wraps, some (AddressSanitizer's) abort instead of returning NULL. */
    if (alignment > SIZE_MAX / 2 || size > SIZE_MAX - alignment)
        return NULL;
    void *p = NULL;
    /* posix_memalign, unlike C11 aligned_alloc, needs no size multiple. */
    if (posix_memalign(&p, alignment, size ? size : 1) != 0)
        return NULL;
    return p;
}

void bn_aligned_free(void *ptr) { free(ptr); }
