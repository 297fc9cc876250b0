/*
 * gguf.c - GGUF reader (mmap + full validation) and writer.
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
 *
 * The reader trusts nothing in the file: every count and length is checked
 * against the bytes that are left before it is used, so a corrupt or
 * truncated file gives an error naming the field and its byte offset, never
 * a read outside the mapping or a huge allocation.
 *
 * Where ggml and the written spec differ we follow ggml's reader, which is
 * what files in the wild are tested against: n_dims 0 is accepted (ne all 1),
 * nested arrays are refused. We are more lenient than ggml in one way: ggml
 * wants tensors stored back to back in info order; we accept any order and
 * gaps, as long as offsets are aligned and data ranges do not overlap. We
 * are stricter in one other: a BOOL byte other than 0 or 1 is refused, as
 * the spec says (ggml reads any non-zero byte as true).
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "qtype.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_HEADER_BYTES 24u
/* Smallest possible encodings, used to bound the header's counts by what
 * the file could hold before anything is allocated: a key/value is at least
 * a 1-byte key (8 + 1), its type (4) and a 1-byte value; a tensor info at
 * least an empty name (8), n_dims (4), type (4) and offset (8). */
#define MIN_KV_BYTES 14u
#define MIN_TENSOR_INFO_BYTES 24u
/* ggml has about 40 type ids; anything this large is corruption, not a
 * future type. (bitnet's own formats use ids >= 1000 and never appear in a
 * GGUF file.) */
#define GGML_TYPE_ID_LIMIT 256u

#define FORMAT_HINT "the file is corrupt or truncated: download or convert it again"

/* ------------------------------------------------------------------------ */
/* Value types                                                              */
/* ------------------------------------------------------------------------ */

static const char *const type_names[BN_GGUF_TYPE_COUNT] = {
    [BN_GGUF_UINT8] = "uint8",     [BN_GGUF_INT8] = "int8",     [BN_GGUF_UINT16] = "uint16",
    [BN_GGUF_INT16] = "int16",     [BN_GGUF_UINT32] = "uint32", [BN_GGUF_INT32] = "int32",
    [BN_GGUF_FLOAT32] = "float32", [BN_GGUF_BOOL] = "bool",     [BN_GGUF_STRING] = "string",
    [BN_GGUF_ARRAY] = "array",     [BN_GGUF_UINT64] = "uint64", [BN_GGUF_INT64] = "int64",
    [BN_GGUF_FLOAT64] = "float64",
};

/* Bytes of one value; 0 for STRING and ARRAY, whose size varies. */
static const uint8_t type_sizes[BN_GGUF_TYPE_COUNT] = {
    [BN_GGUF_UINT8] = 1,   [BN_GGUF_INT8] = 1,   [BN_GGUF_UINT16] = 2, [BN_GGUF_INT16] = 2,
    [BN_GGUF_UINT32] = 4,  [BN_GGUF_INT32] = 4,  [BN_GGUF_FLOAT32] = 4, [BN_GGUF_BOOL] = 1,
    [BN_GGUF_STRING] = 0,  [BN_GGUF_ARRAY] = 0,  [BN_GGUF_UINT64] = 8, [BN_GGUF_INT64] = 8,
    [BN_GGUF_FLOAT64] = 8,
};

const char *bn_gguf_type_name(bn_gguf_type t)
{
    if ((int)t < 0 || t >= BN_GGUF_TYPE_COUNT)
        return "unknown";
    return type_names[t];
}

static bool is_unsigned_int(bn_gguf_type t)
{
    return t == BN_GGUF_UINT8 || t == BN_GGUF_UINT16 || t == BN_GGUF_UINT32 ||
           t == BN_GGUF_UINT64;
}

static bool is_signed_int(bn_gguf_type t)
{
    return t == BN_GGUF_INT8 || t == BN_GGUF_INT16 || t == BN_GGUF_INT32 || t == BN_GGUF_INT64;
}

static bool is_float(bn_gguf_type t) { return t == BN_GGUF_FLOAT32 || t == BN_GGUF_FLOAT64; }

/* ------------------------------------------------------------------------ */
/* Little-endian loads (byte by byte: correct on any host, any alignment)   */
/* ------------------------------------------------------------------------ */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }

static float f32_from_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static double f64_from_bits(uint64_t bits)
{
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* A scalar of type t at p, widened into the kv union's representation. */
static void load_scalar(bn_gguf_type t, const uint8_t *p, bn_gguf_kv *kv)
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

/* Parsing position plus what we are reading, so that every error can say
 * which field of which key or tensor was wrong and where. */
typedef struct cursor {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    const char *path;
    char who[160]; /* "key 'general.name'", "tensor #3", ... */
    bn_error *err;
} cursor;

/* Fills err with "<message> (GGUF file <path>)" and the given status. */
static bn_status fail_status(cursor *c, bn_status status, const char *hint, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static bn_status fail_status(cursor *c, bn_status status, const char *hint, const char *fmt, ...)
{
    char msg[BN_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return bn_error_set(c->err, status, hint, "%s (GGUF file %s)", msg, c->path);
}

#define fail(c, ...) fail_status((c), BN_ERR_FORMAT, FORMAT_HINT, __VA_ARGS__)

/* A string from the file, made safe to print: at most 80 bytes, anything
 * but printable ASCII shown as '?'. */
static void printable(char *dst, size_t cap, const uint8_t *s, uint64_t len)
{
    size_t n = 0;
    const uint64_t shown = len > 80 ? 80 : len;
    for (uint64_t i = 0; i < shown && n + 1 < cap; i++)
        dst[n++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    for (int i = 0; i < 3 && shown < len && n + 1 < cap; i++)
        dst[n++] = '.';
    dst[n] = '\0';
}

static uint64_t bytes_left(const cursor *c) { return c->size - c->pos; }

/* Takes n bytes at the cursor, or fails naming `what`. */
static bn_status take(cursor *c, uint64_t n, const char *what, const uint8_t **p)
{
    *p = NULL;
    if (n > bytes_left(c))
        return fail(c, "%s: %s (%" PRIu64 " bytes) at byte offset %" PRIu64
                       " runs past the end of the file (%" PRIu64 " bytes)",
                    c->who, what, n, c->pos, c->size);
    *p = c->base + c->pos;
    c->pos += n;
    return BN_OK;
}

static bn_status take_u32(cursor *c, const char *what, uint32_t *v)
{
    const uint8_t *p = NULL;
    bn_status st = take(c, 4, what, &p);
    if (st == BN_OK)
        *v = le32(p);
    return st;
}

static bn_status take_u64(cursor *c, const char *what, uint64_t *v)
{
    const uint8_t *p = NULL;
    bn_status st = take(c, 8, what, &p);
    if (st == BN_OK)
        *v = le64(p);
    return st;
}

/* A length-prefixed string; its bytes must lie inside the file. */
static bn_status take_string(cursor *c, const char *what, bn_gguf_str *s)
{
    const uint64_t at = c->pos;
    uint64_t len;
    char what_len[64];
    snprintf(what_len, sizeof what_len, "%s length", what);
    bn_status st = take_u64(c, what_len, &len);
    if (st != BN_OK)
        return st;
    if (len > bytes_left(c))
        return fail(c, "%s: %s length %" PRIu64 " at byte offset %" PRIu64
                       " exceeds the %" PRIu64 " bytes left in the file",
                    c->who, what, len, at, bytes_left(c));
    s->ptr = (const char *)(c->base + c->pos);
    s->len = len;
    c->pos += len;
    return BN_OK;
}

/* A value or element type field: must name one of the 13 GGUF types. */
static bn_status take_value_type(cursor *c, const char *what, bn_gguf_type *t)
{
    const uint64_t at = c->pos;
    uint32_t raw;
    bn_status st = take_u32(c, what, &raw);
    if (st != BN_OK)
        return st;
    if (raw >= BN_GGUF_TYPE_COUNT)
        return fail(c, "%s: %s %" PRIu32 " (as int32: %" PRId32 ") at byte offset %" PRIu64
                       " is not a GGUF value type (0..12)",
                    c->who, what, raw, (int32_t)raw, at);
    *t = (bn_gguf_type)raw;
    return BN_OK;
}

/* ------------------------------------------------------------------------ */
/* Key/values                                                               */
/* ------------------------------------------------------------------------ */

/* One scalar or string value of type t. */
static bn_status parse_scalar(cursor *c, bn_gguf_type t, bn_gguf_kv *kv)
{
    if (t == BN_GGUF_STRING)
        return take_string(c, "string value", &kv->v.str);
    const uint64_t at = c->pos;
    const uint8_t *p = NULL;
    bn_status st = take(c, type_sizes[t], "value", &p);
    if (st != BN_OK)
        return st;
    if (t == BN_GGUF_BOOL && p[0] > 1)
        return fail(c, "%s: bool value %u at byte offset %" PRIu64 " is neither 0 nor 1", c->who,
                    p[0], at);
    load_scalar(t, p, kv);
    return BN_OK;
}

/* Walks a string array element by element (each length is checked), and
 * records where each element starts so that lookups are O(1) later. */
static bn_status parse_string_array(cursor *c, bn_gguf_kv *kv, uint64_t **offsets)
{
    *offsets = NULL;
    if (kv->count == 0)
        return BN_OK;
    uint64_t *offs = malloc((size_t)kv->count * sizeof *offs);
    if (!offs)
        return fail_status(c, BN_ERR_OUT_OF_MEMORY, NULL,
                           "%s: no memory to index %" PRIu64 " strings", c->who, kv->count);
    /* Inline rather than take_string: vocabularies have 10^5 elements and
     * the error text is only built when something is wrong. */
    const uint64_t first = c->pos;
    for (uint64_t i = 0; i < kv->count; i++) {
        offs[i] = c->pos - first;
        bn_status st = BN_OK;
        if (bytes_left(c) < 8) {
            st = fail(c, "%s: element %" PRIu64 " length (8 bytes) at byte offset %" PRIu64
                         " runs past the end of the file (%" PRIu64 " bytes)",
                      c->who, i, c->pos, c->size);
        } else {
            const uint64_t len = le64(c->base + c->pos);
            if (len > bytes_left(c) - 8)
                st = fail(c, "%s: element %" PRIu64 " length %" PRIu64 " at byte offset %" PRIu64
                             " exceeds the %" PRIu64 " bytes left in the file",
                          c->who, i, len, c->pos, bytes_left(c) - 8);
            else
                c->pos += 8 + len;
        }
        if (st != BN_OK) {
            free(offs);
            return st;
        }
    }
    *offsets = offs;
    return BN_OK;
}

static bn_status parse_array(cursor *c, bn_gguf_kv *kv, uint64_t **str_offsets)
{
    const uint64_t type_at = c->pos;
    bn_status st = take_value_type(c, "array element type", &kv->elem_type);
    if (st != BN_OK)
        return st;
    if (kv->elem_type == BN_GGUF_ARRAY)
        return fail(c, "%s: nested array at byte offset %" PRIu64
                       " (arrays of arrays are not supported)",
                    c->who, type_at);
    const uint64_t count_at = c->pos;
    st = take_u64(c, "array length", &kv->count);
    if (st != BN_OK)
        return st;
    /* Bound the count before walking or allocating: every element takes at
     * least its fixed size (8 bytes of length for a string). */
    const uint64_t elem_min = kv->elem_type == BN_GGUF_STRING ? 8 : type_sizes[kv->elem_type];
    if (kv->count > bytes_left(c) / elem_min)
        return fail(c, "%s: array of %" PRIu64 " %s elements at byte offset %" PRIu64
                       " cannot fit in the %" PRIu64 " bytes left in the file",
                    c->who, kv->count, type_names[kv->elem_type], count_at, bytes_left(c));
    kv->elems = c->base + c->pos;
    if (kv->elem_type == BN_GGUF_STRING)
        return parse_string_array(c, kv, str_offsets);
    const uint8_t *p = NULL;
    st = take(c, kv->count * elem_min, "array data", &p);
    if (st != BN_OK)
        return st;
    if (kv->elem_type == BN_GGUF_BOOL)
        for (uint64_t i = 0; i < kv->count; i++)
            if (p[i] > 1)
                return fail(c, "%s: bool element %" PRIu64 " (%u) at byte offset %" PRIu64
                               " is neither 0 nor 1",
                            c->who, i, p[i], (uint64_t)(p + i - c->base));
    return BN_OK;
}

static bn_status parse_kv(cursor *c, uint64_t index, bn_gguf_kv *kv, uint64_t *key_pos)
{
    snprintf(c->who, sizeof c->who, "key/value #%" PRIu64, index);
    *key_pos = c->pos;
    bn_status st = take_string(c, "key", &kv->key);
    if (st != BN_OK)
        return st;
    if (kv->key.len == 0)
        return fail(c, "%s: empty key at byte offset %" PRIu64, c->who, *key_pos);
    char name[96];
    printable(name, sizeof name, (const uint8_t *)kv->key.ptr, kv->key.len);
    snprintf(c->who, sizeof c->who, "key '%s'", name);

    st = take_value_type(c, "value type", &kv->type);
    if (st != BN_OK)
        return st;
    if (kv->type != BN_GGUF_ARRAY)
        return parse_scalar(c, kv->type, kv);
    uint64_t *offsets = NULL;
    st = parse_array(c, kv, &offsets);
    kv->str_offsets = offsets; /* freed by bn_gguf_close, even on error */
    return st;
}

/* ------------------------------------------------------------------------ */
/* Lookups: sorted pointer arrays, binary search                            */
/* ------------------------------------------------------------------------ */

static int cmp_bytes(const char *a, uint64_t alen, const char *b, uint64_t blen)
{
    const uint64_t n = alen < blen ? alen : blen;
    int r = n ? memcmp(a, b, (size_t)n) : 0;
    if (r != 0)
        return r;
    return alen < blen ? -1 : alen > blen ? 1 : 0;
}

static int cmp_kv_key(const void *a, const void *b)
{
    const bn_gguf_kv *x = *(const bn_gguf_kv *const *)a;
    const bn_gguf_kv *y = *(const bn_gguf_kv *const *)b;
    return cmp_bytes(x->key.ptr, x->key.len, y->key.ptr, y->key.len);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const bn_gguf_tensor *x = *(const bn_gguf_tensor *const *)a;
    const bn_gguf_tensor *y = *(const bn_gguf_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* Data order: by offset; at equal offsets, empty tensors of known size
 * first (they can share an offset with the next tensor), then file order
 * so the result does not depend on qsort's stability. */
static int cmp_tensor_offset(const void *a, const void *b)
{
    const bn_gguf_tensor *x = *(const bn_gguf_tensor *const *)a;
    const bn_gguf_tensor *y = *(const bn_gguf_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    const bool xe = x->type_known && x->bytes == 0, ye = y->type_known && y->bytes == 0;
    if (xe != ye)
        return xe ? -1 : 1;
    return x < y ? -1 : x > y ? 1 : 0;
}

static bn_status index_keys(cursor *c, bn_gguf *g)
{
    if (g->n_kv == 0)
        return BN_OK;
    g->kv_sorted = malloc((size_t)g->n_kv * sizeof *g->kv_sorted);
    if (!g->kv_sorted)
        return fail_status(c, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to index %" PRIu64 " keys",
                           g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++)
        g->kv_sorted[i] = &g->kvs[i];
    qsort(g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, cmp_kv_key);
    for (uint64_t i = 1; i < g->n_kv; i++) {
        const bn_gguf_kv *a = g->kv_sorted[i - 1], *b = g->kv_sorted[i];
        if (cmp_kv_key(&a, &b) == 0) {
            uint64_t pa = g->kv_pos[a - g->kvs], pb = g->kv_pos[b - g->kvs];
            char name[96];
            printable(name, sizeof name, (const uint8_t *)a->key.ptr, a->key.len);
            return fail(c, "key '%s': duplicate key at byte offsets %" PRIu64 " and %" PRIu64, name,
                        pa < pb ? pa : pb, pa < pb ? pb : pa);
        }
    }
    return BN_OK;
}

static bn_status index_tensor_names(cursor *c, bn_gguf *g)
{
    if (g->n_tensors == 0)
        return BN_OK;
    g->by_name = malloc((size_t)g->n_tensors * sizeof *g->by_name);
    if (!g->by_name)
        return fail_status(c, BN_ERR_OUT_OF_MEMORY, NULL,
                           "no memory to index %" PRIu64 " tensors", g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        g->by_name[i] = &g->tensors[i];
    qsort(g->by_name, (size_t)g->n_tensors, sizeof *g->by_name, cmp_tensor_name);
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        const bn_gguf_tensor *a = g->by_name[i - 1], *b = g->by_name[i];
        if (strcmp(a->name, b->name) == 0) {
            uint64_t pa = g->info_pos[a - g->tensors], pb = g->info_pos[b - g->tensors];
            char name[96];
            printable(name, sizeof name, (const uint8_t *)a->name, strlen(a->name));
            return fail(c, "tensor '%s': duplicate tensor name at byte offsets %" PRIu64
                           " and %" PRIu64,
                        name, pa < pb ? pa : pb, pa < pb ? pb : pa);
        }
    }
    return BN_OK;
}

const bn_gguf_kv *bn_gguf_find(const bn_gguf *g, const char *key)
{
    if (!g || !key)
        return NULL;
    const uint64_t klen = strlen(key);
    uint64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2;
        const bn_gguf_kv *kv = g->kv_sorted[mid];
        const int r = cmp_bytes(kv->key.ptr, kv->key.len, key, klen);
        if (r == 0)
            return kv;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const bn_gguf_tensor *bn_gguf_tensor_by_name(const bn_gguf *g, const char *name)
{
    if (!g || !name)
        return NULL;
    uint64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2;
        const int r = strcmp(g->by_name[mid]->name, name);
        if (r == 0)
            return g->by_name[mid];
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Header and alignment                                                     */
/* ------------------------------------------------------------------------ */

static bn_status parse_version(cursor *c, uint32_t *version)
{
    snprintf(c->who, sizeof c->who, "header");
    bn_status st = take_u32(c, "version", version);
    if (st != BN_OK)
        return st;
    const uint32_t v = *version;
    if (v == 2 || v == 3)
        return BN_OK;
    if (v == 0)
        return fail(c, "header: version 0 at byte offset 4 is not a GGUF version");
    /* A big-endian file's version 3 reads as 0x03000000 here. */
    if ((v & 0xffffu) == 0)
        return fail_status(c, BN_ERR_UNSUPPORTED, "convert the model to a little-endian GGUF",
                           "header: version 0x%08" PRIx32 " at byte offset 4 looks byte-swapped: "
                           "big-endian GGUF files are not supported",
                           v);
    if (v == 1)
        return fail_status(c, BN_ERR_UNSUPPORTED,
                           "convert the model again with a current llama.cpp or gguf-py",
                           "header: version 1 at byte offset 4 is no longer supported "
                           "(only 2 and 3)");
    return fail_status(c, BN_ERR_UNSUPPORTED, "this file needs a newer bitnet",
                       "header: version %" PRIu32 " at byte offset 4 is newer than this reader "
                       "supports (2 and 3)",
                       v);
}

static bn_status parse_header(cursor *c, bn_gguf *g)
{
    snprintf(c->who, sizeof c->who, "header");
    const uint8_t *magic = NULL;
    bn_status st = take(c, 4, "magic", &magic);
    if (st != BN_OK)
        return st;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0) {
        char shown[8];
        printable(shown, sizeof shown, magic, 4);
        return fail(c, "header: magic '%s' at byte offset 0 is not 'GGUF': not a GGUF file",
                    shown);
    }
    if ((st = parse_version(c, &g->version)) != BN_OK)
        return st;
    if ((st = take_u64(c, "tensor count", &g->n_tensors)) != BN_OK ||
        (st = take_u64(c, "key/value count", &g->n_kv)) != BN_OK)
        return st;

    /* Bound the counts by the smallest encodings before allocating. */
    const uint64_t left = bytes_left(c);
    if (g->n_tensors > left / MIN_TENSOR_INFO_BYTES)
        return fail(c, "header: tensor count %" PRIu64 " at byte offset 8 cannot fit in the "
                       "%" PRIu64 " bytes after the header (at least %u bytes per tensor info)",
                    g->n_tensors, left, MIN_TENSOR_INFO_BYTES);
    if (g->n_kv > left / MIN_KV_BYTES)
        return fail(c, "header: key/value count %" PRIu64 " at byte offset 16 cannot fit in "
                       "the %" PRIu64 " bytes after the header (at least %u bytes per key/value)",
                    g->n_kv, left, MIN_KV_BYTES);
    if (g->n_tensors * MIN_TENSOR_INFO_BYTES + g->n_kv * MIN_KV_BYTES > left)
        return fail(c, "header: %" PRIu64 " tensors (byte offset 8) and %" PRIu64
                       " key/values (byte offset 16) cannot fit in the %" PRIu64
                       " bytes after the header",
                    g->n_tensors, g->n_kv, left);
    return BN_OK;
}

static bn_status parse_alignment(cursor *c, bn_gguf *g)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const bn_gguf_kv *kv = bn_gguf_find(g, "general.alignment");
    if (!kv)
        return BN_OK;
    const uint64_t at = g->kv_pos[kv - g->kvs];
    if (kv->type != BN_GGUF_UINT32)
        return fail(c, "key 'general.alignment' at byte offset %" PRIu64
                       " has type %s; it must be uint32",
                    at, bn_gguf_type_name(kv->type));
    const uint64_t a = kv->v.u64;
    if (a == 0 || (a & (a - 1)) != 0)
        return fail(c, "key 'general.alignment' at byte offset %" PRIu64
                       " is %" PRIu64 "; it must be a non-zero power of two",
                    at, a);
    g->alignment = (uint32_t)a;
    return BN_OK;
}

/* ------------------------------------------------------------------------ */
/* Tensor infos and data placement                                          */
/* ------------------------------------------------------------------------ */

static bn_status parse_tensor_name(cursor *c, uint64_t index, bn_gguf_tensor *t)
{
    snprintf(c->who, sizeof c->who, "tensor #%" PRIu64, index);
    const uint64_t at = c->pos;
    bn_gguf_str s;
    bn_status st = take_string(c, "name", &s);
    if (st != BN_OK)
        return st;
    /* ggml keeps names in char[GGML_MAX_NAME = 64] with the NUL. */
    if (s.len >= BN_GGUF_MAX_NAME) {
        char shown[96];
        printable(shown, sizeof shown, (const uint8_t *)s.ptr, s.len);
        return fail(c, "%s ('%s'): name length %" PRIu64 " at byte offset %" PRIu64
                       " is too long (ggml allows at most %d bytes)",
                    c->who, shown, s.len, at, BN_GGUF_MAX_NAME - 1);
    }
    if (s.len && memchr(s.ptr, '\0', (size_t)s.len))
        return fail(c, "%s: name at byte offset %" PRIu64 " contains a NUL byte", c->who, at);
    memcpy(t->name, s.ptr, (size_t)s.len);
    t->name[s.len] = '\0';
    char shown[96];
    printable(shown, sizeof shown, (const uint8_t *)t->name, s.len);
    snprintf(c->who, sizeof c->who, "tensor '%s'", shown);
    return BN_OK;
}

static bn_status parse_tensor_shape(cursor *c, bn_gguf_tensor *t)
{
    const uint64_t dims_at = c->pos;
    bn_status st = take_u32(c, "n_dims", &t->n_dims);
    if (st != BN_OK)
        return st;
    if (t->n_dims > BN_GGUF_MAX_DIMS)
        return fail(c, "%s: n_dims %" PRIu32 " at byte offset %" PRIu64 " is more than %d",
                    c->who, t->n_dims, dims_at, BN_GGUF_MAX_DIMS);
    /* The product of the non-zero dimensions must fit in int64: then no
     * partial product (rows = ne[1] * ne[2] * ne[3] and the like) can
     * overflow, even in an empty tensor. */
    int64_t product = 1;
    for (uint32_t j = 0; j < BN_GGUF_MAX_DIMS; j++) {
        t->ne[j] = 1;
        if (j >= t->n_dims)
            continue;
        const uint64_t at = c->pos;
        uint64_t raw;
        if ((st = take_u64(c, "dimension", &raw)) != BN_OK)
            return st;
        t->ne[j] = (int64_t)raw;
        if (t->ne[j] < 0)
            return fail(c, "%s: ne[%" PRIu32 "] = %" PRId64 " at byte offset %" PRIu64
                           " is negative",
                        c->who, j, t->ne[j], at);
        if (t->ne[j] == 0)
            continue;
        if (product > INT64_MAX / t->ne[j])
            return fail(c, "%s: shape at byte offset %" PRIu64 " has more than 2^63 elements",
                        c->who, dims_at);
        product *= t->ne[j];
    }
    return BN_OK;
}

/* Size of a known type from its shape; unknown types are sized later from
 * the offsets. */
static bn_status size_tensor(cursor *c, bn_gguf_tensor *t, uint64_t type_at)
{
    const bn_qtype_info *q = bn_qtype_get((bn_qtype)t->type);
    t->type_known = q != NULL;
    t->bytes = 0;
    if (!q)
        return BN_OK;
    const int64_t cols = t->ne[0];
    const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3]; /* no overflow: checked */
    if (cols % q->block_elems != 0)
        return fail(c, "%s: %s (type %" PRIu32 " at byte offset %" PRIu64 ") needs rows of a "
                       "multiple of %d elements; ne[0] is %" PRId64,
                    c->who, q->name, t->type, type_at, q->block_elems, cols);
    if (rows == 0 || cols == 0)
        return BN_OK; /* an empty tensor holds no data */
    bn_error qerr;
    bn_error_clear(&qerr);
    size_t bytes = 0;
    if (bn_qtype_tensor_size((bn_qtype)t->type, rows, cols, &bytes, &qerr) != BN_OK)
        return fail(c, "%s: shape %" PRId64 " x %" PRId64 " (type at byte offset %" PRIu64
                       ") is not valid: %s",
                    c->who, rows, cols, type_at, qerr.message);
    t->bytes = bytes;
    return BN_OK;
}

static bn_status parse_tensor_info(cursor *c, const bn_gguf *g, uint64_t index, bn_gguf_tensor *t)
{
    bn_status st = parse_tensor_name(c, index, t);
    if (st == BN_OK)
        st = parse_tensor_shape(c, t);
    if (st != BN_OK)
        return st;
    const uint64_t type_at = c->pos;
    if ((st = take_u32(c, "type", &t->type)) != BN_OK)
        return st;
    if (t->type >= GGML_TYPE_ID_LIMIT)
        return fail(c, "%s: type %" PRIu32 " (as int32: %" PRId32 ") at byte offset %" PRIu64
                       " is not a ggml type id",
                    c->who, t->type, (int32_t)t->type, type_at);
    const uint64_t offset_at = c->pos;
    if ((st = take_u64(c, "data offset", &t->offset)) != BN_OK)
        return st;
    if (t->offset % g->alignment != 0)
        return fail(c, "%s: data offset %" PRIu64 " at byte offset %" PRIu64
                       " is not a multiple of the alignment (%" PRIu32 ")",
                    c->who, t->offset, offset_at, g->alignment);
    return size_tensor(c, t, type_at);
}

/* Places every tensor's data: inside the file, sizes of unknown types from
 * the next offset, no overlaps. */
static bn_status place_tensors(cursor *c, bn_gguf *g)
{
    if (g->n_tensors == 0)
        return BN_OK;
    if (g->data_start > g->size)
        return fail(c, "tensor data section: starts at byte offset %" PRIu64
                       " (end of the tensor infos rounded up to %" PRIu32
                       "), past the end of the file (%" PRIu64 " bytes)",
                    g->data_start, g->alignment, g->size);
    const uint64_t data_len = g->size - g->data_start;

    const bn_gguf_tensor **order = malloc((size_t)g->n_tensors * sizeof *order);
    if (!order)
        return fail_status(c, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to place %" PRIu64 " tensors",
                           g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];

    bn_status st = BN_OK;
    char name[96];
    for (uint64_t i = 0; i < g->n_tensors && st == BN_OK; i++) {
        const bn_gguf_tensor *t = order[i];
        if (t->offset > data_len) {
            printable(name, sizeof name, (const uint8_t *)t->name, strlen(t->name));
            st = fail(c, "tensor '%s': data offset %" PRIu64 " (from the data section at byte "
                         "offset %" PRIu64 ") is past the end of the file (%" PRIu64 " bytes)",
                      name, t->offset, g->data_start, g->size);
        }
    }
    if (st == BN_OK)
        qsort(order, (size_t)g->n_tensors, sizeof *order, cmp_tensor_offset);

    for (uint64_t k = 0; k < g->n_tensors && st == BN_OK; k++) {
        bn_gguf_tensor *t = &g->tensors[order[k] - g->tensors];
        const uint64_t next = k + 1 < g->n_tensors ? order[k + 1]->offset : data_len;
        if (!t->type_known)
            t->bytes = next - t->offset; /* sorted, and offsets <= data_len */
        printable(name, sizeof name, (const uint8_t *)t->name, strlen(t->name));
        const uint64_t begin = g->data_start + t->offset;
        if (t->bytes > data_len - t->offset) {
            st = fail(c, "tensor '%s': data [%" PRIu64 ", %" PRIu64
                         ") extends past the end of the file (%" PRIu64 " bytes)",
                      name, begin, begin + t->bytes, g->size);
        } else if (k + 1 < g->n_tensors && t->offset + t->bytes > next) {
            char other[96];
            const bn_gguf_tensor *u = order[k + 1];
            printable(other, sizeof other, (const uint8_t *)u->name, strlen(u->name));
            st = fail(c, "tensor '%s': data [%" PRIu64 ", %" PRIu64
                         ") overlaps tensor '%s' starting at byte offset %" PRIu64,
                      name, begin, begin + t->bytes, other, g->data_start + u->offset);
        }
        t->data = g->base + begin;
    }
    free(order);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Open / close                                                             */
/* ------------------------------------------------------------------------ */

void bn_gguf_close(bn_gguf *g)
{
    if (!g)
        return;
    for (uint64_t i = 0; g->kvs && i < g->n_kv; i++)
        free((void *)g->kvs[i].str_offsets);
    free(g->kvs);
    free(g->kv_pos);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->info_pos);
    free(g->by_name);
    if (g->mapped && g->base)
        munmap((void *)g->base, (size_t)g->size);
    free(g);
}

static bn_status parse_all(cursor *c, bn_gguf *g)
{
    bn_status st = parse_header(c, g);
    if (st != BN_OK)
        return st;

    /* Counts are bounded by the file size, so these allocations are too. */
    g->kvs = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kvs);
    g->kv_pos = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kv_pos);
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    g->info_pos = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->info_pos);
    if (!g->kvs || !g->kv_pos || !g->tensors || !g->info_pos)
        return fail_status(c, BN_ERR_OUT_OF_MEMORY, NULL,
                           "no memory for %" PRIu64 " key/values and %" PRIu64 " tensors",
                           g->n_kv, g->n_tensors);

    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((st = parse_kv(c, i, &g->kvs[i], &g->kv_pos[i])) != BN_OK)
            return st;
    if ((st = index_keys(c, g)) != BN_OK || (st = parse_alignment(c, g)) != BN_OK)
        return st;

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        g->info_pos[i] = c->pos;
        if ((st = parse_tensor_info(c, g, i, &g->tensors[i])) != BN_OK)
            return st;
    }
    if ((st = index_tensor_names(c, g)) != BN_OK)
        return st;

    /* The data section starts at the end of the infos, rounded up. */
    g->data_start = (c->pos + g->alignment - 1) / g->alignment * g->alignment;
    return place_tensors(c, g);
}

/* Parses a GGUF image already in memory. Not in gguf.h: bn_gguf_open uses
 * it on the mapping, and tests use it on exact-size heap buffers so that
 * AddressSanitizer sees any read past the end (a mapping's last page hides
 * such reads). The buffer must outlive the bn_gguf. */
bn_status bn_gguf_open_memory(const void *data, uint64_t size, const char *name, bn_gguf **out,
                              bn_error *err);

bn_status bn_gguf_open_memory(const void *data, uint64_t size, const char *name, bn_gguf **out,
                              bn_error *err)
{
    if (!out || (!data && size))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "bn_gguf_open: NULL argument");
    *out = NULL;
    bn_gguf *g = calloc(1, sizeof *g);
    if (!g)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to open %s", name);
    g->base = data;
    g->size = size;
    cursor c = {.base = data, .size = size, .pos = 0, .path = name ? name : "(memory)", .err = err};
    bn_status st = parse_all(&c, g);
    if (st != BN_OK) {
        bn_gguf_close(g);
        return st;
    }
    *out = g;
    return BN_OK;
}

bn_status bn_gguf_open(const char *path, bn_gguf **out, bn_error *err)
{
    if (!path || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "bn_gguf_open: NULL argument");
    *out = NULL;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bn_error_set(err, BN_ERR_IO, "check the path and its permissions",
                            "cannot open GGUF file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        const int e = errno;
        close(fd);
        return bn_error_set(err, BN_ERR_IO, NULL, "cannot stat GGUF file %s: %s", path,
                            strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return bn_error_set(err, BN_ERR_IO, "pass the path of a .gguf file",
                            "GGUF file %s is not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return bn_error_set(err, BN_ERR_FORMAT, FORMAT_HINT,
                            "GGUF file %s is empty (0 bytes)", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "use a 64-bit build",
                            "GGUF file %s (%" PRIu64 " bytes) is too large to map", path,
                            (uint64_t)sb.st_size);
    }
    const uint64_t size = (uint64_t)sb.st_size;
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED)
        return bn_error_set(err, BN_ERR_IO, NULL, "cannot map GGUF file %s (%" PRIu64 " bytes): %s",
                            path, size, strerror(map_errno));

    bn_status st = bn_gguf_open_memory(map, size, path, out, err);
    if (st != BN_OK) {
        munmap(map, (size_t)size);
        return st;
    }
    (*out)->mapped = true;
    return BN_OK;
}

/* ------------------------------------------------------------------------ */
/* Accessors                                                                */
/* ------------------------------------------------------------------------ */

uint32_t bn_gguf_version(const bn_gguf *g) { return g ? g->version : 0; }
uint64_t bn_gguf_file_size(const bn_gguf *g) { return g ? g->size : 0; }
uint32_t bn_gguf_alignment(const bn_gguf *g) { return g ? g->alignment : 0; }
uint64_t bn_gguf_kv_count(const bn_gguf *g) { return g ? g->n_kv : 0; }
uint64_t bn_gguf_tensor_count(const bn_gguf *g) { return g ? g->n_tensors : 0; }

const bn_gguf_kv *bn_gguf_kv_at(const bn_gguf *g, uint64_t i)
{
    return g && i < g->n_kv ? &g->kvs[i] : NULL;
}

const bn_gguf_tensor *bn_gguf_tensor_at(const bn_gguf *g, uint64_t i)
{
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* ------------------------------------------------------------------------ */
/* Typed getters                                                            */
/* ------------------------------------------------------------------------ */

/* An integer value, kept unsigned or signed as stored so that range
 * checks see the full uint64 / int64 range. */
typedef struct int_value {
    bool is_unsigned;
    uint64_t u;
    int64_t i;
} int_value;

/* kv's value (of type t) as an integer; false when t is not an integer. */
static bool kv_int(bn_gguf_type t, const bn_gguf_kv *kv, int_value *v)
{
    if (is_unsigned_int(t)) {
        v->is_unsigned = true;
        v->u = kv->v.u64;
        return true;
    }
    if (is_signed_int(t)) {
        v->is_unsigned = false;
        v->i = kv->v.i64;
        return true;
    }
    return false;
}

static bn_status key_error(bn_error *err, const bn_gguf_kv *kv, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static bn_status key_error(bn_error *err, const bn_gguf_kv *kv, const char *fmt, ...)
{
    char name[96], msg[BN_ERROR_MESSAGE_MAX];
    printable(name, sizeof name, (const uint8_t *)kv->key.ptr, kv->key.len);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return bn_error_set(err, BN_ERR_FORMAT, "the model file's metadata is not what bitnet expects",
                        "key '%s': %s", name, msg);
}

/* Finds key for a getter: absent is BN_ERR_INVALID_ARGUMENT, no message. */
static const bn_gguf_kv *getter_find(const bn_gguf *g, const char *key, bn_error *err)
{
    const bn_gguf_kv *kv = bn_gguf_find(g, key);
    if (!kv)
        bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "%s", "");
    return kv;
}

bn_status bn_gguf_get_u32(const bn_gguf *g, const char *key, uint32_t *out, bn_error *err)
{
    const bn_gguf_kv *kv = getter_find(g, key, err);
    if (!kv)
        return BN_ERR_INVALID_ARGUMENT;
    int_value v;
    if (!kv_int(kv->type, kv, &v))
        return key_error(err, kv, "is %s, expected an integer", bn_gguf_type_name(kv->type));
    if (v.is_unsigned ? v.u > UINT32_MAX : (v.i < 0 || v.i > (int64_t)UINT32_MAX))
        return v.is_unsigned ? key_error(err, kv, "%" PRIu64 " does not fit in uint32", v.u)
                             : key_error(err, kv, "%" PRId64 " does not fit in uint32", v.i);
    *out = v.is_unsigned ? (uint32_t)v.u : (uint32_t)v.i;
    return BN_OK;
}

bn_status bn_gguf_get_i64(const bn_gguf *g, const char *key, int64_t *out, bn_error *err)
{
    const bn_gguf_kv *kv = getter_find(g, key, err);
    if (!kv)
        return BN_ERR_INVALID_ARGUMENT;
    int_value v;
    if (!kv_int(kv->type, kv, &v))
        return key_error(err, kv, "is %s, expected an integer", bn_gguf_type_name(kv->type));
    if (v.is_unsigned && v.u > (uint64_t)INT64_MAX)
        return key_error(err, kv, "%" PRIu64 " does not fit in int64", v.u);
    *out = v.is_unsigned ? (int64_t)v.u : v.i;
    return BN_OK;
}

/* A number as float: floats and integers convert; a finite value beyond
 * float's range is an error rather than a silent infinity. */
static bn_status number_to_f32(const bn_gguf_kv *kv, double d, float *out, bn_error *err)
{
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return key_error(err, kv, "%g does not fit in float32", d);
    *out = (float)d;
    return BN_OK;
}

bn_status bn_gguf_get_f32(const bn_gguf *g, const char *key, float *out, bn_error *err)
{
    const bn_gguf_kv *kv = getter_find(g, key, err);
    if (!kv)
        return BN_ERR_INVALID_ARGUMENT;
    int_value v;
    if (is_float(kv->type))
        return number_to_f32(kv, kv->v.f64, out, err);
    if (kv_int(kv->type, kv, &v))
        return number_to_f32(kv, v.is_unsigned ? (double)v.u : (double)v.i, out, err);
    return key_error(err, kv, "is %s, expected a number", bn_gguf_type_name(kv->type));
}

bn_status bn_gguf_get_bool(const bn_gguf *g, const char *key, bool *out, bn_error *err)
{
    const bn_gguf_kv *kv = getter_find(g, key, err);
    if (!kv)
        return BN_ERR_INVALID_ARGUMENT;
    if (kv->type == BN_GGUF_BOOL) {
        *out = kv->v.u64 != 0;
        return BN_OK;
    }
    /* Some writers store flags as integers: 0 and 1 are unambiguous. */
    int_value v;
    if (kv_int(kv->type, kv, &v)) {
        const bool zero = v.is_unsigned ? v.u == 0 : v.i == 0;
        const bool one = v.is_unsigned ? v.u == 1 : v.i == 1;
        if (zero || one) {
            *out = one;
            return BN_OK;
        }
        return key_error(err, kv, "integer value is neither 0 nor 1, expected a bool");
    }
    return key_error(err, kv, "is %s, expected a bool", bn_gguf_type_name(kv->type));
}

bn_status bn_gguf_get_str(const bn_gguf *g, const char *key, bn_gguf_str *out, bn_error *err)
{
    const bn_gguf_kv *kv = getter_find(g, key, err);
    if (!kv)
        return BN_ERR_INVALID_ARGUMENT;
    if (kv->type != BN_GGUF_STRING)
        return key_error(err, kv, "is %s, expected a string", bn_gguf_type_name(kv->type));
    *out = kv->v.str;
    return BN_OK;
}

/* ------------------------------------------------------------------------ */
/* Array elements                                                           */
/* ------------------------------------------------------------------------ */

static bn_status array_check(const bn_gguf_kv *kv, uint64_t i, bn_error *err)
{
    if (!kv)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "GGUF array: NULL key/value");
    if (kv->type != BN_GGUF_ARRAY)
        return key_error(err, kv, "is %s, expected an array", bn_gguf_type_name(kv->type));
    if (i >= kv->count) {
        char name[96];
        printable(name, sizeof name, (const uint8_t *)kv->key.ptr, kv->key.len);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "key '%s': index %" PRIu64 " is out of range (%" PRIu64 " elements)",
                            name, i, kv->count);
    }
    return BN_OK;
}

bn_status bn_gguf_array_str(const bn_gguf_kv *kv, uint64_t i, bn_gguf_str *out, bn_error *err)
{
    bn_status st = array_check(kv, i, err);
    if (st != BN_OK)
        return st;
    if (kv->elem_type != BN_GGUF_STRING)
        return key_error(err, kv, "is an array of %s, expected strings",
                         bn_gguf_type_name(kv->elem_type));
    uint64_t off = 0;
    if (kv->str_offsets) {
        off = kv->str_offsets[i];
    } else {
        /* Not from the reader: walk (lengths were validated when it was). */
        for (uint64_t k = 0; k < i; k++)
            off += 8 + le64(kv->elems + off);
    }
    out->len = le64(kv->elems + off);
    out->ptr = (const char *)kv->elems + off + 8;
    return BN_OK;
}

/* Element i of a numeric array: integer types as int_value, floats as d. */
static bool array_number(const bn_gguf_kv *kv, uint64_t i, int_value *iv, double *d, bool *is_int)
{
    bn_gguf_kv tmp;
    const bn_gguf_type t = kv->elem_type;
    if (t >= BN_GGUF_TYPE_COUNT || type_sizes[t] == 0 || t == BN_GGUF_BOOL)
        return false;
    load_scalar(t, kv->elems + i * type_sizes[t], &tmp);
    *is_int = !is_float(t);
    if (*is_int)
        return kv_int(t, &tmp, iv);
    *d = tmp.v.f64;
    return true;
}

bn_status bn_gguf_array_i64(const bn_gguf_kv *kv, uint64_t i, int64_t *out, bn_error *err)
{
    bn_status st = array_check(kv, i, err);
    if (st != BN_OK)
        return st;
    int_value v;
    double d;
    bool is_int;
    if (!array_number(kv, i, &v, &d, &is_int) || !is_int)
        return key_error(err, kv, "is an array of %s, expected integers",
                         bn_gguf_type_name(kv->elem_type));
    if (v.is_unsigned && v.u > (uint64_t)INT64_MAX)
        return key_error(err, kv, "element %" PRIu64 " (%" PRIu64 ") does not fit in int64", i,
                         v.u);
    *out = v.is_unsigned ? (int64_t)v.u : v.i;
    return BN_OK;
}

bn_status bn_gguf_array_f32(const bn_gguf_kv *kv, uint64_t i, float *out, bn_error *err)
{
    bn_status st = array_check(kv, i, err);
    if (st != BN_OK)
        return st;
    int_value v;
    double d = 0.0;
    bool is_int;
    if (!array_number(kv, i, &v, &d, &is_int))
        return key_error(err, kv, "is an array of %s, expected numbers",
                         bn_gguf_type_name(kv->elem_type));
    if (is_int)
        d = v.is_unsigned ? (double)v.u : (double)v.i;
    return number_to_f32(kv, d, out, err);
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct w_kv {
    char *key;
    bn_gguf_type type;      /* BN_GGUF_ARRAY for arrays */
    bn_gguf_type elem_type; /* arrays */
    uint64_t count;         /* arrays */
    uint32_t bits;          /* UINT32, INT32, FLOAT32 (as bits), BOOL */
    char *str;              /* STRING */
    char **strs;            /* STRING arrays */
    uint32_t *nums;         /* INT32 / FLOAT32 arrays, as bits */
} w_kv;

typedef struct w_tensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[BN_GGUF_MAX_DIMS];
    const void *data;
    uint64_t bytes;
    uint64_t offset; /* assigned by finish */
} w_tensor;

struct bn_gguf_writer {
    w_kv *kvs;
    size_t n_kv, cap_kv;
    w_tensor *tensors;
    size_t n_tensors, cap_tensors;
    uint32_t alignment;
};

static char *dup_str(const char *s)
{
    const size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* Grows an array of elem-sized items so that one more fits. */
static bool grow(void **items, size_t *cap, size_t used, size_t elem)
{
    if (used < *cap)
        return true;
    const size_t ncap = *cap ? *cap * 2 : 16;
    void *p = realloc(*items, ncap * elem);
    if (!p)
        return false;
    *items = p;
    *cap = ncap;
    return true;
}

bn_status bn_gguf_writer_create(bn_gguf_writer **out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "bn_gguf_writer_create: NULL out");
    *out = calloc(1, sizeof **out);
    if (!*out)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a GGUF writer");
    (*out)->alignment = GGUF_DEFAULT_ALIGNMENT;
    return BN_OK;
}

static void free_kv(w_kv *kv)
{
    free(kv->key);
    free(kv->str);
    for (uint64_t i = 0; kv->strs && i < kv->count; i++)
        free(kv->strs[i]);
    free(kv->strs);
    free(kv->nums);
}

void bn_gguf_writer_free(bn_gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++)
        free_kv(&w->kvs[i]);
    free(w->kvs);
    for (size_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->tensors);
    free(w);
}

/* Starts a new key/value: checks the key, copies it, and returns the slot
 * (not yet counted; the caller commits it with w->n_kv++). */
static bn_status new_kv(bn_gguf_writer *w, const char *key, bn_gguf_type type, w_kv **slot,
                        bn_error *err)
{
    if (!w || !key || !*key)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "GGUF writer: empty or NULL key");
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, key) == 0)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "GGUF writer: key '%s' is already set", key);
    if (strcmp(key, "general.alignment") == 0 && type != BN_GGUF_UINT32)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: key 'general.alignment' must be a uint32");
    if (!grow((void **)&w->kvs, &w->cap_kv, w->n_kv, sizeof *w->kvs))
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for key '%s'", key);
    w_kv *kv = &w->kvs[w->n_kv];
    memset(kv, 0, sizeof *kv);
    kv->type = type;
    kv->key = dup_str(key);
    if (!kv->key)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for key '%s'", key);
    *slot = kv;
    return BN_OK;
}

static bn_status set_bits(bn_gguf_writer *w, const char *key, bn_gguf_type type, uint32_t bits,
                          bn_error *err)
{
    w_kv *kv;
    bn_status st = new_kv(w, key, type, &kv, err);
    if (st != BN_OK)
        return st;
    kv->bits = bits;
    w->n_kv++;
    return BN_OK;
}

bn_status bn_gguf_writer_set_u32(bn_gguf_writer *w, const char *key, uint32_t v, bn_error *err)
{
    /* The alignment key changes the file layout: check it here, where the
     * caller can still react, and use it. */
    const bool is_alignment = key && strcmp(key, "general.alignment") == 0;
    if (is_alignment && (v == 0 || (v & (v - 1)) != 0))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: general.alignment %" PRIu32
                            " is not a non-zero power of two",
                            v);
    bn_status st = set_bits(w, key, BN_GGUF_UINT32, v, err);
    if (st == BN_OK && is_alignment)
        w->alignment = v;
    return st;
}

bn_status bn_gguf_writer_set_i32(bn_gguf_writer *w, const char *key, int32_t v, bn_error *err)
{
    return set_bits(w, key, BN_GGUF_INT32, (uint32_t)v, err);
}

bn_status bn_gguf_writer_set_f32(bn_gguf_writer *w, const char *key, float v, bn_error *err)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return set_bits(w, key, BN_GGUF_FLOAT32, bits, err);
}

bn_status bn_gguf_writer_set_bool(bn_gguf_writer *w, const char *key, bool v, bn_error *err)
{
    return set_bits(w, key, BN_GGUF_BOOL, v ? 1u : 0u, err);
}

bn_status bn_gguf_writer_set_str(bn_gguf_writer *w, const char *key, const char *v, bn_error *err)
{
    if (!v)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: NULL string for key '%s'", key ? key : "(null)");
    w_kv *kv;
    bn_status st = new_kv(w, key, BN_GGUF_STRING, &kv, err);
    if (st != BN_OK)
        return st;
    kv->str = dup_str(v);
    if (!kv->str) {
        free_kv(kv);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for key '%s'", key);
    }
    w->n_kv++;
    return BN_OK;
}

bn_status bn_gguf_writer_set_arr_str(bn_gguf_writer *w, const char *key, const char *const *v,
                                     uint64_t n, bn_error *err)
{
    if (n && !v)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: NULL array for key '%s'", key ? key : "(null)");
    for (uint64_t i = 0; i < n; i++)
        if (!v[i])
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "GGUF writer: key '%s': string %" PRIu64 " is NULL",
                                key ? key : "(null)", i);
    if (n > SIZE_MAX / sizeof(char *))
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "array too large for key '%s'", key);
    w_kv *kv;
    bn_status st = new_kv(w, key, BN_GGUF_ARRAY, &kv, err);
    if (st != BN_OK)
        return st;
    kv->elem_type = BN_GGUF_STRING;
    kv->strs = calloc(n ? (size_t)n : 1, sizeof *kv->strs);
    bool ok = kv->strs != NULL;
    if (ok)
        kv->count = n; /* free_kv frees however many were copied */
    for (uint64_t i = 0; ok && i < n; i++)
        ok = (kv->strs[i] = dup_str(v[i])) != NULL;
    if (!ok) {
        free_kv(kv);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for key '%s'", key);
    }
    w->n_kv++;
    return BN_OK;
}

/* int32 and float arrays: both 4-byte values, copied as bits. */
static bn_status set_arr_u32(bn_gguf_writer *w, const char *key, bn_gguf_type elem,
                             const void *v, uint64_t n, bn_error *err)
{
    if (n && !v)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: NULL array for key '%s'", key ? key : "(null)");
    if (n > SIZE_MAX / 4)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "array too large for key '%s'", key);
    w_kv *kv;
    bn_status st = new_kv(w, key, BN_GGUF_ARRAY, &kv, err);
    if (st != BN_OK)
        return st;
    kv->elem_type = elem;
    kv->count = n;
    kv->nums = malloc(n ? (size_t)n * 4 : 1);
    if (!kv->nums) {
        free_kv(kv);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for key '%s'", key);
    }
    if (n)
        memcpy(kv->nums, v, (size_t)n * 4);
    w->n_kv++;
    return BN_OK;
}

bn_status bn_gguf_writer_set_arr_i32(bn_gguf_writer *w, const char *key, const int32_t *v,
                                     uint64_t n, bn_error *err)
{
    return set_arr_u32(w, key, BN_GGUF_INT32, v, n, err);
}

bn_status bn_gguf_writer_set_arr_f32(bn_gguf_writer *w, const char *key, const float *v,
                                     uint64_t n, bn_error *err)
{
    return set_arr_u32(w, key, BN_GGUF_FLOAT32, v, n, err);
}

/* Checks a tensor the way the reader will: name, shape, type, size. */
static bn_status check_new_tensor(const bn_gguf_writer *w, const char *name, uint32_t type,
                                  uint32_t n_dims, const int64_t *ne, const void *data,
                                  uint64_t bytes, bn_error *err)
{
    if (!name || !*name || strlen(name) >= BN_GGUF_MAX_NAME)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: tensor name '%s' must be 1..%d bytes", name ? name : "",
                            BN_GGUF_MAX_NAME - 1);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "GGUF writer: tensor '%s' is already added", name);
    if (n_dims < 1 || n_dims > BN_GGUF_MAX_DIMS || !ne)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: tensor '%s': n_dims %" PRIu32 " is not in 1..%d", name,
                            n_dims, BN_GGUF_MAX_DIMS);
    /* As the reader: the product of the non-zero dimensions must fit. */
    int64_t product = 1, elements = 1;
    for (uint32_t j = 0; j < n_dims; j++) {
        if (ne[j] < 0 || (ne[j] && product > INT64_MAX / ne[j]))
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "GGUF writer: tensor '%s': bad shape (ne[%" PRIu32 "] = %" PRId64
                                ")",
                                name, j, ne[j]);
        product *= ne[j] ? ne[j] : 1;
        elements *= ne[j];
    }
    if (type >= GGML_TYPE_ID_LIMIT)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: tensor '%s': type %" PRIu32 " is not a ggml type id",
                            name, type);
    if (bytes && !data)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: tensor '%s': NULL data", name);
    if (!bn_qtype_get((bn_qtype)type))
        return BN_OK; /* unknown type: the caller knows its size */
    size_t expect = 0;
    if (elements > 0) {
        const int64_t rows = elements / ne[0];
        bn_error qerr;
        bn_error_clear(&qerr);
        if (bn_qtype_tensor_size((bn_qtype)type, rows, ne[0], &expect, &qerr) != BN_OK)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "GGUF writer: tensor '%s': %s", name, qerr.message);
    } else if (ne[0] % bn_qtype_get((bn_qtype)type)->block_elems != 0) {
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: tensor '%s': ne[0] %" PRId64
                            " is not a multiple of the type's block",
                            name, ne[0]);
    }
    if (bytes != expect)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "GGUF writer: tensor '%s': %" PRIu64 " bytes given, its %s shape "
                            "needs %zu",
                            name, bytes, bn_qtype_get((bn_qtype)type)->name, expect);
    return BN_OK;
}

bn_status bn_gguf_writer_add_tensor(bn_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    uint64_t bytes, bn_error *err)
{
    if (!w)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "GGUF writer: NULL writer");
    bn_status st = check_new_tensor(w, name, type, n_dims, ne, data, bytes, err);
    if (st != BN_OK)
        return st;
    if (!grow((void **)&w->tensors, &w->cap_tensors, w->n_tensors, sizeof *w->tensors))
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for tensor '%s'", name);
    w_tensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = dup_str(name);
    if (!t->name)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for tensor '%s'", name);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t j = 0; j < BN_GGUF_MAX_DIMS; j++)
        t->ne[j] = j < n_dims ? ne[j] : 1;
    t->data = data;
    t->bytes = bytes;
    w->n_tensors++;
    return BN_OK;
}

/* Buffered output that remembers the first error and counts bytes. */
typedef struct out_file {
    FILE *f;
    uint64_t written;
    int error; /* errno of the first failure, 0 if none */
} out_file;

static void put(out_file *o, const void *p, size_t n)
{
    if (o->error || n == 0)
        return;
    if (fwrite(p, 1, n, o->f) != n)
        o->error = errno ? errno : EIO;
    else
        o->written += n;
}

static void put_u32(out_file *o, uint32_t v)
{
    const uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(o, b, 4);
}

static void put_u64(out_file *o, uint64_t v)
{
    put_u32(o, (uint32_t)v);
    put_u32(o, (uint32_t)(v >> 32));
}

static void put_str(out_file *o, const char *s)
{
    const size_t n = strlen(s);
    put_u64(o, n);
    put(o, s, n);
}

static void put_zeros(out_file *o, uint64_t n)
{
    static const uint8_t zeros[256];
    while (n > 0) {
        const size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
        put(o, zeros, k);
        n -= k;
    }
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static void put_kv(out_file *o, const w_kv *kv)
{
    put_str(o, kv->key);
    put_u32(o, (uint32_t)kv->type);
    switch (kv->type) {
    case BN_GGUF_BOOL: {
        const uint8_t b = (uint8_t)kv->bits;
        put(o, &b, 1);
        break;
    }
    case BN_GGUF_STRING: put_str(o, kv->str); break;
    case BN_GGUF_ARRAY:
        put_u32(o, (uint32_t)kv->elem_type);
        put_u64(o, kv->count);
        for (uint64_t i = 0; i < kv->count; i++) {
            if (kv->elem_type == BN_GGUF_STRING)
                put_str(o, kv->strs[i]);
            else
                put_u32(o, kv->nums[i]);
        }
        break;
    default: put_u32(o, kv->bits); break; /* UINT32, INT32, FLOAT32 */
    }
}

static void put_tensor_info(out_file *o, const w_tensor *t)
{
    put_str(o, t->name);
    put_u32(o, t->n_dims);
    for (uint32_t j = 0; j < t->n_dims; j++)
        put_u64(o, (uint64_t)t->ne[j]);
    put_u32(o, t->type);
    put_u64(o, t->offset);
}

/* Writes the whole file to o; the layout was computed by the caller. */
static void write_file(const bn_gguf_writer *w, out_file *o, uint64_t total,
                       bn_gguf_progress_fn progress, void *ctx)
{
    put(o, GGUF_MAGIC, 4);
    put_u32(o, 3);
    put_u64(o, w->n_tensors);
    put_u64(o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++)
        put_kv(o, &w->kvs[i]);
    for (size_t i = 0; i < w->n_tensors; i++)
        put_tensor_info(o, &w->tensors[i]);
    put_zeros(o, align_up(o->written, w->alignment) - o->written);
    if (progress && !o->error)
        progress(ctx, o->written, total);

    /* Data in chunks, so that progress moves during large tensors. */
    const uint64_t chunk = UINT64_C(64) << 20;
    for (size_t i = 0; i < w->n_tensors && !o->error; i++) {
        const w_tensor *t = &w->tensors[i];
        for (uint64_t done = 0; done < t->bytes && !o->error;) {
            const uint64_t n = t->bytes - done < chunk ? t->bytes - done : chunk;
            put(o, (const uint8_t *)t->data + done, (size_t)n);
            done += n;
            if (progress && !o->error)
                progress(ctx, o->written, total);
        }
        put_zeros(o, align_up(t->bytes, w->alignment) - t->bytes);
    }
    if (progress && !o->error)
        progress(ctx, o->written, total);
}

/* Bytes of the metadata part (header, key/values, tensor infos). */
static uint64_t metadata_bytes(const bn_gguf_writer *w)
{
    uint64_t n = GGUF_HEADER_BYTES;
    for (size_t i = 0; i < w->n_kv; i++) {
        const w_kv *kv = &w->kvs[i];
        n += 8 + strlen(kv->key) + 4;
        if (kv->type == BN_GGUF_STRING)
            n += 8 + strlen(kv->str);
        else if (kv->type == BN_GGUF_BOOL)
            n += 1;
        else if (kv->type != BN_GGUF_ARRAY)
            n += 4;
        else if (kv->elem_type == BN_GGUF_STRING)
            for (uint64_t k = 0; k < kv->count; k++)
                n += 8 + strlen(kv->strs[k]);
        else
            n += 4 * kv->count;
        if (kv->type == BN_GGUF_ARRAY)
            n += 4 + 8;
    }
    for (size_t i = 0; i < w->n_tensors; i++)
        n += 8 + strlen(w->tensors[i].name) + 4 + 8 * w->tensors[i].n_dims + 4 + 8;
    return n;
}

/* ---- the output file --------------------------------------------------------
 *
 * finish writes a temporary file created exclusively (O_CREAT | O_EXCL, so
 * nothing already at that name, a symbolic link included, is ever opened)
 * under a random name in the output's directory, syncs it, renames it over
 * the output and syncs the directory. Writers never share a temporary file,
 * so concurrent writers of one output each rename a complete file and the
 * output is always one of them whole.
 *
 * The temporary files being written are listed in a fixed table that
 * bn_gguf_writer_remove_temp_files reads from a signal handler: a slot is
 * FREE, CLAIMED (its path being filled in) or ARMED (the path is complete
 * and the file may exist). Slots are lock-free atomics, so claiming one is
 * safe from any thread and reading them from a handler is
 * async-signal-safe. A slot is armed before the file is created, so a
 * signal delivered on return from open still finds it. */
enum { TEMP_FREE, TEMP_CLAIMED, TEMP_ARMED, TEMP_SLOTS = 16, TEMP_PATH_MAX = 4096 };
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "temp-file slots must be lock-free for signal handlers");
static atomic_int temp_state[TEMP_SLOTS];
static char temp_paths[TEMP_SLOTS][TEMP_PATH_MAX];

void bn_gguf_writer_remove_temp_files(void)
{
    for (int i = 0; i < TEMP_SLOTS; i++)
        if (atomic_load(&temp_state[i]) == TEMP_ARMED)
            unlink(temp_paths[i]);
}

/* Arms a slot for path; -1 when all are taken or the path is too long (the
 * file is then written without signal cleanup). */
static int temp_arm(const char *path)
{
    const size_t n = strlen(path);
    if (n >= TEMP_PATH_MAX)
        return -1;
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int expected = TEMP_FREE;
        if (atomic_compare_exchange_strong(&temp_state[i], &expected, TEMP_CLAIMED)) {
            memcpy(temp_paths[i], path, n + 1);
            atomic_store(&temp_state[i], TEMP_ARMED); /* publishes the path */
            return i;
        }
    }
    return -1;
}

static void temp_disarm(int slot)
{
    if (slot >= 0)
        atomic_store(&temp_state[slot], TEMP_FREE);
}

static const char *file_kind(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISLNK(m))
        return "a symbolic link";
    if (S_ISSOCK(m))
        return "a socket";
    return "not a regular file";
}

bn_status bn_gguf_check_output_path(const char *path, bn_error *err)
{
    if (!path || !*path)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "no output path given");
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT)
            return BN_OK;
        const int e = errno;
        return bn_error_set(err, BN_ERR_IO, "check the path and its permissions",
                            "cannot check the output %s: %s", path, strerror(e));
    }
    if (S_ISREG(sb.st_mode))
        return BN_OK;
    /* Replacing it would turn a device, FIFO or link into a regular file;
     * writing through it would write somewhere else. */
    return bn_error_set(err, BN_ERR_IO, "give the path of a regular file, or a new name",
                        "refusing to replace %s: it is %s, not a regular file", path,
                        file_kind(sb.st_mode));
}

/* Twelve characters from [a-z0-9_-]: time, pid, address and a counter,
 * mixed (splitmix64). Only uniqueness matters: O_EXCL catches a clash. */
static void temp_suffix(char out[13])
{
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                 ((uint64_t)getpid() << 42) ^ (uint64_t)(uintptr_t)out ^
                 (atomic_fetch_add(&counter, 1) * UINT64_C(0x9e3779b97f4a7c15));
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    static const char digits[] = "abcdefghijklmnopqrstuvwxyz0123456789_-";
    for (int i = 0; i < 12; i++, x /= 38)
        out[i] = digits[x % 38];
    out[12] = '\0';
}

/* Creates DIR/.NAME.tmp.XXXXXXXXXXXX beside path with mode 0666 less the
 * umask, as fopen would create the output itself (mkstemp's 0600 would need
 * a umask read that is not thread-safe). Returns the descriptor, with the
 * name in tmp and its slot in *slot, or -1 with errno set. */
static int create_temp(const char *path, char *tmp, size_t size, int *slot)
{
    const char *slash = strrchr(path, '/');
    const int dir_len = slash ? (int)(slash - path + 1) : 0;
    const char *base = slash ? slash + 1 : path;
    for (int attempt = 0; attempt < 100; attempt++) {
        char suffix[13];
        temp_suffix(suffix);
        /* Keep the name within NAME_MAX (255) whatever the output's. */
        const int n = snprintf(tmp, size, "%.*s.%.200s.tmp.%s", dir_len, path, base, suffix);
        if (n < 0 || (size_t)n >= size) {
            errno = ENAMETOOLONG;
            return -1;
        }
        *slot = temp_arm(tmp);
        const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0)
            return fd;
        const int e = errno;
        temp_disarm(*slot); /* the name is someone else's, or nothing was made */
        *slot = -1;
        if (e != EEXIST) {
            errno = e;
            return -1;
        }
    }
    errno = EEXIST;
    return -1;
}

/* Syncs the directory holding path, so the rename survives a crash. A
 * directory that cannot be opened (write and search permission only) is
 * skipped, as are file systems that cannot sync directories. */
static int sync_dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[TEMP_PATH_MAX];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) < sizeof dir)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        return 0;
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int e = 0;
    if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)
        e = errno;
    close(fd);
    return e;
}

bn_status bn_gguf_writer_finish(bn_gguf_writer *w, const char *path, bn_gguf_progress_fn progress,
                                void *ctx, bn_error *err)
{
    if (!w || !path || !*path)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_gguf_writer_finish: NULL writer or path");
    bn_status st = bn_gguf_check_output_path(path, err);
    if (st != BN_OK)
        return st;
    /* Layout: tensors back to back in the order added, each padded. */
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = offset;
        offset += align_up(w->tensors[i].bytes, w->alignment);
    }
    const uint64_t total = align_up(metadata_bytes(w), w->alignment) + offset;

    const size_t size = strlen(path) + 32;
    char *tmp = malloc(size);
    if (!tmp)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to write %s", path);
    int slot = -1;
    const int fd = create_temp(path, tmp, size, &slot);
    out_file o = {.f = fd >= 0 ? fdopen(fd, "wb") : NULL, .written = 0, .error = 0};
    if (!o.f) {
        const int e = errno;
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        temp_disarm(slot);
        st = bn_error_set(err, BN_ERR_IO, "check that the directory exists and is writable",
                          "cannot create a temporary file beside %s: %s", path, strerror(e));
        free(tmp);
        return st;
    }
    write_file(w, &o, total, progress, ctx);
    if (!o.error && fflush(o.f) != 0)
        o.error = errno ? errno : EIO;
    if (!o.error && fsync(fileno(o.f)) != 0 && errno != EINVAL && errno != ENOTSUP)
        o.error = errno;
    if (fclose(o.f) != 0 && !o.error)
        o.error = errno ? errno : EIO;
    if (!o.error && o.written != total)
        o.error = EIO; /* our own size arithmetic disagrees: never rename */
    /* Checked again: the output may have changed while this one was written. */
    bn_error kind_err;
    if (!o.error && bn_gguf_check_output_path(path, &kind_err) != BN_OK) {
        unlink(tmp);
        temp_disarm(slot);
        free(tmp);
        return bn_error_set(err, kind_err.status, kind_err.hint, "%s", kind_err.message);
    }
    if (!o.error && rename(tmp, path) != 0)
        o.error = errno ? errno : EIO;
    if (o.error) {
        unlink(tmp);
        st = bn_error_set(err, BN_ERR_IO, "check free disk space and permissions",
                          "cannot write GGUF file %s: %s", path, strerror(o.error));
    } else {
        const int e = sync_dir_of(path);
        if (e)
            st = bn_error_set(err, BN_ERR_IO, "the file is complete but may not survive a crash",
                              "wrote %s but cannot sync its directory: %s", path, strerror(e));
    }
    temp_disarm(slot);
    free(tmp);
    return st;
}
