/* Access-pattern analysis and alignment arithmetic; see memory_layout.h for
 * the definitions. Every size computation checks for overflow because the
 * inputs come from model files. */
#include "memory_layout.h"

#include <inttypes.h>

const char *bn_access_pattern_name(bn_access_pattern pattern)
{
    switch (pattern) {
    case BN_ACCESS_SEQUENTIAL:
        return "sequential";
    case BN_ACCESS_STRIDED:
        return "strided";
    case BN_ACCESS_RANDOM:
        return "random";
    }
    return "unknown";
}

/* b - a, false when it does not fit in int64. */
static bool difference(int64_t a, int64_t b, int64_t *d)
{
    return !__builtin_sub_overflow(b, a, d);
}

bn_status bn_layout_analyze_access(const int64_t *indices, size_t count, bn_access_analysis *out,
                                   bn_error *err)
{
    if (!out || (count > 0 && !indices))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "access analysis: NULL output, or NULL indices with a count");
    *out = (bn_access_analysis){.pattern = BN_ACCESS_SEQUENTIAL, .stride = 1, .count = count};
    if (count == 0)
        return BN_OK;
    out->min_index = out->max_index = indices[0];
    for (size_t i = 1; i < count; i++) {
        if (indices[i] < out->min_index)
            out->min_index = indices[i];
        if (indices[i] > out->max_index)
            out->max_index = indices[i];
    }
    if (count == 1)
        return BN_OK;

    int64_t stride;
    bool constant = difference(indices[0], indices[1], &stride);
    for (size_t i = 2; constant && i < count; i++) {
        int64_t d;
        constant = difference(indices[i - 1], indices[i], &d) && d == stride;
    }
    if (!constant) {
        out->pattern = BN_ACCESS_RANDOM;
        out->stride = 0;
    } else {
        out->pattern = stride == 1 ? BN_ACCESS_SEQUENTIAL : BN_ACCESS_STRIDED;
        out->stride = stride;
    }
    return BN_OK;
}

bool bn_layout_is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

bool bn_layout_align_up(uint64_t value, uint64_t alignment, uint64_t *out)
{
    if (!out || !bn_layout_is_power_of_two(alignment))
        return false;
    const uint64_t mask = alignment - 1;
    if (value > UINT64_MAX - mask)
        return false;
    *out = (value + mask) & ~mask;
    return true;
}

bn_status bn_layout_aligned_size(uint64_t bytes, uint64_t alignment, uint64_t *out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "aligned size: NULL output");
    if (alignment != 0 && !bn_layout_is_power_of_two(alignment))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "use a power of two such as 128 or 256",
                            "aligned size: alignment %" PRIu64 " is not a power of two",
                            alignment);
    if (alignment < BN_LAYOUT_MIN_ALIGNMENT)
        alignment = BN_LAYOUT_MIN_ALIGNMENT;
    if (!bn_layout_align_up(bytes, alignment, out))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "aligned size: %" PRIu64 " bytes padded to %" PRIu64
                            " does not fit in 64 bits",
                            bytes, alignment);
    return BN_OK;
}

uint64_t bn_layout_recommended_alignment(uint64_t elem_size, uint64_t count)
{
    if (elem_size == 0 || count == 0)
        return BN_LAYOUT_MIN_ALIGNMENT;
    if (elem_size >= BN_LAYOUT_MAX_RECOMMENDED_ALIGNMENT)
        return BN_LAYOUT_MAX_RECOMMENDED_ALIGNMENT;
    const uint64_t warp = 32;
    const uint64_t footprint = elem_size * (count < warp ? count : warp); /* < 2^17 */
    uint64_t a = BN_LAYOUT_MIN_ALIGNMENT;
    while (a < footprint && a < BN_LAYOUT_MAX_RECOMMENDED_ALIGNMENT)
        a <<= 1;
    return a;
}

bn_status bn_layout_array_bytes(uint64_t elem_size, uint64_t count, uint64_t *bytes,
                                uint64_t *alignment, bn_error *err)
{
    if (!bytes)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "array bytes: NULL output");
    uint64_t raw;
    if (__builtin_mul_overflow(elem_size, count, &raw))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "array bytes: %" PRIu64 " elements of %" PRIu64
                            " bytes do not fit in 64 bits",
                            count, elem_size);
    const uint64_t a = bn_layout_recommended_alignment(elem_size, count);
    bn_status st = bn_layout_aligned_size(raw, a, bytes, err);
    if (st == BN_OK && alignment)
        *alignment = a;
    return st;
}
