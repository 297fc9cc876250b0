#include "grouped_layout.h"

#include <string.h>

bn_status bn_pack_grouped(const bn_kernel_provider *owner, int64_t group, const int8_t *codes,
                          int64_t n, int64_t k, float scale, bn_w2a8_weights *w, bn_error *err)
{
    const int64_t group_bytes = group / 4;
    const int64_t stride = (k + group - 1) / group * group_bytes;
    uint8_t *data = bn_aligned_alloc(64, (size_t)(n * stride));
    if (!data)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "no memory to pack %lld x %lld weights", (long long)n, (long long)k);
    /* 0x55 = code 1 in every field: padding reads as weight 0. */
    memset(data, 0x55, (size_t)(n * stride));
    for (int64_t r = 0; r < n; r++) {
        uint8_t *row = data + r * stride;
        for (int64_t c = 0; c < k; c++) {
            const int64_t e = c % group;
            const int field = (int)(e / group_bytes);
            uint8_t *byte = row + c / group * group_bytes + e % group_bytes;
            *byte = (uint8_t)((*byte & ~(3 << (2 * field))) |
                              ((codes[r * k + c] + 1) << (2 * field)));
        }
    }
    w->provider = owner;
    w->n = n;
    w->k = k;
    w->scale = scale;
    w->data = data;
    w->bytes = (size_t)(n * stride);
    w->row_stride = stride;
    return BN_OK;
}
