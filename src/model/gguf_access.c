/*
 * gguf_access.c - what a parsed GGUF file offers: lookups by key and by
 * tensor name (binary search in the sorted arrays the reader, gguf.c,
 * builds), accessors, typed getters and array elements.
 */
#include "gguf.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gguf_internal.h"

/* ------------------------------------------------------------------------ */
/* Lookups: binary search                                                   */
/* ------------------------------------------------------------------------ */

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
