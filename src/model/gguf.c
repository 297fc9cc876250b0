/*
 * gguf.c - GGUF reader: mmap, parsing and full validation, open and close.
 * Lookups and typed getters are in gguf_access.c, the writer in
 * gguf_write.c; the file layout and what the three share are in
 * gguf_internal.h.
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
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_internal.h"
#include "qtype.h"

/* Smallest possible encodings, used to bound the header's counts by what
 * the file could hold before anything is allocated: a key/value is at least
 * a 1-byte key (8 + 1), its type (4) and a 1-byte value; a tensor info at
 * least an empty name (8), n_dims (4), type (4) and offset (8). */
#define MIN_KV_BYTES 14u
#define MIN_TENSOR_INFO_BYTES 24u

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

const char *bn_gguf_type_name(bn_gguf_type t)
{
    if ((int)t < 0 || t >= BN_GGUF_TYPE_COUNT)
        return "unknown";
    return type_names[t];
}

/* ------------------------------------------------------------------------ */
/* The cursor and its errors                                                */
/* ------------------------------------------------------------------------ */

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
/* Indexes: sorted pointer arrays for the lookups (gguf_access.c)           */
/* ------------------------------------------------------------------------ */

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
