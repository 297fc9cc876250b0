/*
 * memory_layout.h - how a kernel's accesses and buffers should be laid out
 * for coalesced GPU memory access. Pure arithmetic, tested on the CPU.
 *
 * Access patterns. A list of element indices, in the order a warp's threads
 * (or a loop) touch them, is classified by the differences between
 * neighbours, d[i] = idx[i+1] - idx[i]:
 *
 *     every d[i] == 1                   SEQUENTIAL  (stride 1)
 *     every d[i] == s, s != 1           STRIDED     (stride s: may be 0 or negative)
 *     anything else                     RANDOM      (stride 0)
 *
 * So a stride is a constant difference, nothing looser: [0, 2, 4, 7] is
 * random. Stride 0 (every access the same element, a broadcast) and negative
 * strides ([9, 8, 7]: stride -1) are reported as STRIDED with their stride so
 * the caller can decide; note that |stride| == 1 still touches contiguous
 * memory. Lists of 0 or 1 index have no difference to measure and are
 * SEQUENTIAL with stride 1 (nothing about them defeats coalescing). Two
 * indices always have a constant difference, so they are SEQUENTIAL or
 * STRIDED. A difference that does not fit in int64 is RANDOM.
 *
 * Alignment. Buffers are padded to at least 128 bytes: a warp of 32 threads
 * reading consecutive 4-byte words touches exactly one 128-byte line when
 * the start is aligned, and two when it is not.
 */
#ifndef BN_MEMORY_LAYOUT_H
#define BN_MEMORY_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum bn_access_pattern {
    BN_ACCESS_SEQUENTIAL = 0,
    BN_ACCESS_STRIDED,
    BN_ACCESS_RANDOM
} bn_access_pattern;

typedef struct bn_access_analysis {
    bn_access_pattern pattern;
    int64_t stride;     /* 1 when sequential, the constant difference when strided, 0 when random */
    size_t count;       /* number of indices                          */
    int64_t min_index;  /* smallest and largest index (0 when count 0) */
    int64_t max_index;
} bn_access_analysis;

/* "sequential", "strided", "random". */
const char *bn_access_pattern_name(bn_access_pattern pattern);

/* Classifies indices[0..count) as described above. indices may be NULL only
 * when count is 0. */
bn_status bn_layout_analyze_access(const int64_t *indices, size_t count, bn_access_analysis *out,
                                   bn_error *err);

#define BN_LAYOUT_MIN_ALIGNMENT 128u
#define BN_LAYOUT_MAX_RECOMMENDED_ALIGNMENT 4096u

/* True for 1, 2, 4, ...; false for 0. */
bool bn_layout_is_power_of_two(uint64_t x);

/* value rounded up to a multiple of alignment. False (and *out untouched)
 * when alignment is not a power of two or the result does not fit. */
bool bn_layout_align_up(uint64_t value, uint64_t alignment, uint64_t *out);

/* bytes padded for coalescing: to `alignment`, raised to at least 128 (0
 * means 128). A non-power-of-two alignment or a result that overflows is
 * BN_ERR_INVALID_ARGUMENT. 0 bytes stay 0. */
bn_status bn_layout_aligned_size(uint64_t bytes, uint64_t alignment, uint64_t *out,
                                 bn_error *err);

/* The alignment for an array of `count` elements of `elem_size` bytes: the
 * bytes one warp touches reading one element per thread (min(count, 32) *
 * elem_size), rounded up to a power of two and clamped to [128, 4096]; so
 * 1-, 2- and 4-byte elements get 128, 8-byte 256, 16-byte (float4) 512, and
 * every warp-wide access starts on a boundary of its own size. 0 for either
 * argument gives 128. */
uint64_t bn_layout_recommended_alignment(uint64_t elem_size, uint64_t count);

/* elem_size * count bytes padded to the recommended alignment; overflow is
 * BN_ERR_INVALID_ARGUMENT. *alignment (may be NULL) gets the alignment. */
bn_status bn_layout_array_bytes(uint64_t elem_size, uint64_t count, uint64_t *bytes,
                                uint64_t *alignment, bn_error *err);

#ifdef __cplusplus
}
#endif

#endif
