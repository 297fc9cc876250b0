/*
 * gguf_internal.h - what the GGUF source files share: the reader (gguf.c),
 * its lookups and getters (gguf_access.c) and the writer (gguf_write.c).
 * Not installed and not part of gguf.h's contract.
 *
 * File layout (little-endian; ggml docs/gguf.md, ggml/src/gguf.cpp):
 *
 *   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x      { string key | u32 type | value }
 *   n_tensors x { string name | u32 n_dims | i64 ne[n_dims] | u32 type | u64 offset }
 *   zero padding up to the alignment (general.alignment, default 32)
 *   tensor data; each tensor at data_start + offset, offsets aligned
 *
 *   string = u64 length + bytes (no NUL); array = u32 elem_type + u64 count
 *   + elements.
 */
#ifndef BN_GGUF_INTERNAL_H
#define BN_GGUF_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gguf.h"

/* Reader and writer. */
#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32u
/* ggml has about 40 type ids; anything this large is corruption, not a
 * future type. (bitnet's own formats use ids >= 1000 and never appear in a
 * GGUF file.) */
#define GGML_TYPE_ID_LIMIT 256u

/* ------------------------------------------------------------------------ */
/* Value types (reader and getters)                                         */
/* ------------------------------------------------------------------------ */

/* Bytes of one value; 0 for STRING and ARRAY, whose size varies. */
static const uint8_t type_sizes[BN_GGUF_TYPE_COUNT] = {
    [BN_GGUF_UINT8] = 1,   [BN_GGUF_INT8] = 1,   [BN_GGUF_UINT16] = 2, [BN_GGUF_INT16] = 2,
    [BN_GGUF_UINT32] = 4,  [BN_GGUF_INT32] = 4,  [BN_GGUF_FLOAT32] = 4, [BN_GGUF_BOOL] = 1,
    [BN_GGUF_STRING] = 0,  [BN_GGUF_ARRAY] = 0,  [BN_GGUF_UINT64] = 8, [BN_GGUF_INT64] = 8,
    [BN_GGUF_FLOAT64] = 8,
};

/* ------------------------------------------------------------------------ */
/* Little-endian loads (byte by byte: correct on any host, any alignment)   */
/* ------------------------------------------------------------------------ */

static inline uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static inline uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32);
}

static inline float f32_from_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline double f64_from_bits(uint64_t bits)
{
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* A scalar of type t at p, widened into the kv union's representation. */
static inline void load_scalar(bn_gguf_type t, const uint8_t *p, bn_gguf_kv *kv)
{
    switch (t) {
    case BN_GGUF_UINT8: kv->v.u64 = p[0]; break;
    case BN_GGUF_BOOL: kv->v.u64 = p[0] != 0; break;
    case BN_GGUF_INT8: kv->v.i64 = (int8_t)p[0]; break;
    case BN_GGUF_UINT16: kv->v.u64 = le16(p); break;
    case BN_GGUF_INT16: kv->v.i64 = (int16_t)le16(p); break;
    case BN_GGUF_UINT32: kv->v.u64 = le32(p); break;
    case BN_GGUF_INT32: kv->v.i64 = (int32_t)le32(p); break;
    case BN_GGUF_UINT64: kv->v.u64 = le64(p); break;
    case BN_GGUF_INT64: kv->v.i64 = (int64_t)le64(p); break;
    case BN_GGUF_FLOAT32: kv->v.f64 = f32_from_bits(le32(p)); break;
    case BN_GGUF_FLOAT64: kv->v.f64 = f64_from_bits(le64(p)); break;
    default: break;
    }
}

/* ------------------------------------------------------------------------ */
/* The reader's state                                                       */
/* ------------------------------------------------------------------------ */

struct bn_gguf {
    const uint8_t *base; /* the mapping (or the caller's buffer) */
    uint64_t size;
    bool mapped;         /* munmap on close */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_start; /* file offset of the tensor data section */

    uint64_t n_kv;
    bn_gguf_kv *kvs;              /* file order */
    uint64_t *kv_pos;             /* file offset of each key, for messages */
    const bn_gguf_kv **kv_sorted; /* by key, for lookups */

    uint64_t n_tensors;
    bn_gguf_tensor *tensors;         /* file order */
    uint64_t *info_pos;              /* file offset of each tensor info */
    const bn_gguf_tensor **by_name;  /* by name, for lookups */
};

/* ------------------------------------------------------------------------ */
/* Helpers of the reader and the getters                                    */
/* ------------------------------------------------------------------------ */

/* A string from the file, made safe to print: at most 80 bytes, anything
 * but printable ASCII shown as '?'. */
static inline void printable(char *dst, size_t cap, const uint8_t *s, uint64_t len)
{
    size_t n = 0;
    const uint64_t shown = len > 80 ? 80 : len;
    for (uint64_t i = 0; i < shown && n + 1 < cap; i++)
        dst[n++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    for (int i = 0; i < 3 && shown < len && n + 1 < cap; i++)
        dst[n++] = '.';
    dst[n] = '\0';
}

/* Orders byte strings as memcmp, a prefix first: the order of the sorted
 * key index that bn_gguf_find searches. */
static inline int cmp_bytes(const char *a, uint64_t alen, const char *b, uint64_t blen)
{
    const uint64_t n = alen < blen ? alen : blen;
    int r = n ? memcmp(a, b, (size_t)n) : 0;
    if (r != 0)
        return r;
    return alen < blen ? -1 : alen > blen ? 1 : 0;
}

#endif
