/*
 * safetensors.c - the safetensors file reader.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON, then the data
 * section. Every number in the header is untrusted: the length is bounded by
 * the file and by ST_HEADER_MAX before anything is allocated, and every
 * tensor's offsets are checked against the data section and against its
 * shape before a pointer into the mapping is handed out.
 *
 * The parsed cJSON tree is kept for the life of the object: tensor names and
 * metadata strings point into it, so nothing is copied twice.
 */
#include "safetensors.h"
#include "path_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Real headers are tens of kilobytes (about 60 KB for 2B-4T's 542 tensors);
 * anything near this cap is damage or an attack, not a model. */
#define ST_HEADER_MAX ((uint64_t)100 * 1024 * 1024)

/* Largest integer a JSON number (a double in cJSON) holds exactly. */
#define ST_JSON_INT_MAX 9007199254740992.0 /* 2^53 */

#define ST_HINT_DAMAGED "the file is damaged or truncated: download it again"

struct bn_safetensors {
    char *label;               /* file name used in messages */
    const uint8_t *map;
    size_t map_size;
    const uint8_t *data;       /* start of the data section */
    uint64_t data_size;
    cJSON *root;               /* owns the tensor names and metadata */
    const cJSON *metadata;     /* "__metadata__" object or NULL */
    bn_st_tensor *tensors;     /* sorted by name */
    size_t count;
};

/* ---- dtypes ---------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} dtype_table[BN_ST_DTYPE_COUNT] = {
    [BN_ST_BOOL] = {"BOOL", 1},       [BN_ST_U8] = {"U8", 1},
    [BN_ST_I8] = {"I8", 1},           [BN_ST_I16] = {"I16", 2},
    [BN_ST_U16] = {"U16", 2},         [BN_ST_F16] = {"F16", 2},
    [BN_ST_BF16] = {"BF16", 2},       [BN_ST_I32] = {"I32", 4},
    [BN_ST_U32] = {"U32", 4},         [BN_ST_F32] = {"F32", 4},
    [BN_ST_I64] = {"I64", 8},         [BN_ST_U64] = {"U64", 8},
    [BN_ST_F64] = {"F64", 8},         [BN_ST_F8_E4M3] = {"F8_E4M3", 1},
    [BN_ST_F8_E5M2] = {"F8_E5M2", 1},
};

/* dtypes the safetensors format defines that this reader does not map:
 * a file using them is valid, just unsupported, and says so. */
static const char *const dtype_unsupported[] = {"C64", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",
                                                NULL};

const char *bn_st_dtype_name(bn_st_dtype t)
{
    if ((int)t < 0 || t >= BN_ST_DTYPE_COUNT)
        return "?";
    return dtype_table[t].name;
}

size_t bn_st_dtype_size(bn_st_dtype t)
{
    if ((int)t < 0 || t >= BN_ST_DTYPE_COUNT)
        return 0;
    return dtype_table[t].size;
}

static bool dtype_from_name(const char *name, bn_st_dtype *out)
{
    for (int i = 0; i < BN_ST_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (bn_st_dtype)i;
            return true;
        }
    }
    return false;
}

static bool dtype_known_unsupported(const char *name)
{
    for (int i = 0; dtype_unsupported[i]; i++)
        if (strcmp(name, dtype_unsupported[i]) == 0)
            return true;
    return false;
}

/* ---- small helpers ----------------------------------------------------------- */


/* A JSON number that is a non-negative integer a double holds exactly. */
static bool json_to_u64(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item))
        return false;
    double v = item->valuedouble;
    if (!(v >= 0.0) || v > ST_JSON_INT_MAX)
        return false;
    uint64_t u = (uint64_t)v;
    if ((double)u != v)
        return false;
    *out = u;
    return true;
}

/* "[2560, 6912]" */
static void format_shape(char *buf, size_t size, const int64_t *shape, int n_dims)
{
    size_t used = 0;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n_dims && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, i ? ", " : "",
                                 shape[i]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

static bn_status tensor_error(bn_error *err, const bn_safetensors *st, const char *name,
                              const char *fmt_detail, const char *detail)
{
    return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED, "%s: tensor '%s': %s%s", st->label,
                        name, fmt_detail, detail ? detail : "");
}

/* ---- mapping and header -------------------------------------------------------- */

static bn_status map_file(bn_safetensors *st, const char *path, bn_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bn_error_set(err, BN_ERR_IO, "check the path and the file's permissions",
                            "cannot open %s: %s", path, strerror(errno));

    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return bn_error_set(err, BN_ERR_IO, NULL, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return bn_error_set(err, BN_ERR_IO, "pass the path of a .safetensors file",
                            "%s is not a regular file", path);
    }
    /* 8 bytes of length plus at least "{}" */
    if (sb.st_size < 10) {
        close(fd);
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: the file is %lld bytes, too short for a safetensors header",
                            st->label, (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "use a 64-bit build",
                            "%s is too large to map on this system", path);
    }

    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED)
        return bn_error_set(err, BN_ERR_IO, NULL, "cannot map %s: %s", path, strerror(e));
    st->map = map;
    st->map_size = (size_t)sb.st_size;
    return BN_OK;
}

static uint64_t read_u64_le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static bn_status parse_header(bn_safetensors *st, bn_error *err)
{
    uint64_t n = read_u64_le(st->map);
    uint64_t rest = (uint64_t)st->map_size - 8;
    if (n > rest)
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: header length %" PRIu64 " is larger than the %" PRIu64
                            " bytes after it: the file is truncated or not a safetensors file",
                            st->label, n, rest);
    if (n > ST_HEADER_MAX)
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: header length %" PRIu64 " exceeds the %" PRIu64
                            "-byte limit for a safetensors header",
                            st->label, n, ST_HEADER_MAX);
    if (n < 2)
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: header length %" PRIu64 " is too short for a JSON object",
                            st->label, n);

    const char *text = (const char *)st->map + 8;
    /* cJSON needs a terminated string, and a NUL inside the header would
     * silently cut it short. */
    if (memchr(text, '\0', (size_t)n))
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: the JSON header contains a NUL byte", st->label);
    char *copy = malloc((size_t)n + 1);
    if (!copy)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "%s: cannot allocate %" PRIu64 " bytes for the header", st->label, n);
    memcpy(copy, text, (size_t)n);
    copy[n] = '\0';

    const char *end = NULL;
    st->root = cJSON_ParseWithOpts(copy, &end, 1);
    size_t at = end ? (size_t)(end - copy) : 0;
    free(copy);
    if (!st->root)
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: the header is not valid JSON (error near byte %zu of %" PRIu64
                            ")",
                            st->label, at, n);
    if (!cJSON_IsObject(st->root))
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: the header is not a JSON object", st->label);

    st->data = st->map + 8 + n;
    st->data_size = rest - n;
    return BN_OK;
}

/* ---- tensors ------------------------------------------------------------------- */

static bn_status parse_metadata(bn_safetensors *st, const cJSON *item, bn_error *err)
{
    if (st->metadata)
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: \"__metadata__\" appears twice", st->label);
    if (!cJSON_IsObject(item))
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: \"__metadata__\" is not an object of strings", st->label);
    for (const cJSON *kv = item->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv))
            return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                                "%s: \"__metadata__\" value '%s' is not a string", st->label,
                                kv->string);
    }
    st->metadata = item;
    return BN_OK;
}

static bn_status parse_dtype(const bn_safetensors *st, const cJSON *entry, bn_st_tensor *t,
                             bn_error *err)
{
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    if (!dtype)
        return tensor_error(err, st, t->name, "field 'dtype' is missing", NULL);
    if (!cJSON_IsString(dtype))
        return tensor_error(err, st, t->name, "field 'dtype' is not a string", NULL);
    if (dtype_from_name(dtype->valuestring, &t->dtype))
        return BN_OK;
    if (dtype_known_unsupported(dtype->valuestring))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "convert the tensor to F32, F16 or BF16",
                            "%s: tensor '%s': dtype '%s' is not supported", st->label, t->name,
                            dtype->valuestring);
    return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                        "%s: tensor '%s': unknown dtype '%.32s'", st->label, t->name,
                        dtype->valuestring);
}

/* Fills t->n_dims and t->shape; *bytes receives the size the shape needs. */
static bn_status parse_shape(const bn_safetensors *st, const cJSON *entry, bn_st_tensor *t,
                             uint64_t *bytes, bn_error *err)
{
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    if (!shape)
        return tensor_error(err, st, t->name, "field 'shape' is missing", NULL);
    if (!cJSON_IsArray(shape))
        return tensor_error(err, st, t->name, "field 'shape' is not an array", NULL);
    int n = cJSON_GetArraySize(shape);
    if (n > BN_ST_MAX_DIMS)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "%s: tensor '%s': shape has %d dimensions, at most %d are supported",
                            st->label, t->name, n, BN_ST_MAX_DIMS);

    uint64_t total = dtype_table[t->dtype].size;
    int i = 0;
    for (const cJSON *dim = shape->child; dim; dim = dim->next, i++) {
        uint64_t d;
        if (!json_to_u64(dim, &d)) {
            char detail[64];
            snprintf(detail, sizeof detail, "%d is not a non-negative integer", i);
            return tensor_error(err, st, t->name, "shape dimension ", detail);
        }
        t->shape[i] = (int64_t)d;
        /* Multiply with an overflow check: a hostile shape must not wrap
         * around to a small size that happens to match its offsets. */
        if (d != 0 && total > UINT64_MAX / d) {
            char dims[160];
            format_shape(dims, sizeof dims, t->shape, i + 1);
            return tensor_error(err, st, t->name, "shape overflows 64 bits: ", dims);
        }
        total *= d;
    }
    t->n_dims = n;
    *bytes = total;
    return BN_OK;
}

static bn_status parse_offsets(const bn_safetensors *st, const cJSON *entry, bn_st_tensor *t,
                               uint64_t need, bn_error *err)
{
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!offs)
        return tensor_error(err, st, t->name, "field 'data_offsets' is missing", NULL);
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_to_u64(cJSON_GetArrayItem(offs, 0), &begin) ||
        !json_to_u64(cJSON_GetArrayItem(offs, 1), &end))
        return tensor_error(err, st, t->name,
                            "field 'data_offsets' is not [begin, end] with non-negative integers",
                            NULL);
    if (begin > end)
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            ") begin after end",
                            st->label, t->name, begin, end);
    if (end > st->data_size)
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            ") run past the end of the %" PRIu64
                            "-byte data section: the file is truncated",
                            st->label, t->name, begin, end, st->data_size);
    if (end - begin != need) {
        char dims[160];
        format_shape(dims, sizeof dims, t->shape, t->n_dims);
        return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                            "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            ") but shape %s in %s needs %" PRIu64 " bytes",
                            st->label, t->name, begin, end, dims, dtype_table[t->dtype].name,
                            need);
    }
    t->data = st->data + begin;
    t->bytes = need;
    return BN_OK;
}

static bn_status parse_tensor(const bn_safetensors *st, const cJSON *entry, bn_st_tensor *t,
                              bn_error *err)
{
    memset(t, 0, sizeof *t);
    t->name = entry->string;
    if (!cJSON_IsObject(entry))
        return tensor_error(err, st, t->name,
                            "entry is not an object with dtype, shape and data_offsets", NULL);
    uint64_t need = 0;
    bn_status s = parse_dtype(st, entry, t, err);
    if (s == BN_OK)
        s = parse_shape(st, entry, t, &need, err);
    if (s == BN_OK)
        s = parse_offsets(st, entry, t, need, err);
    return s;
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp(((const bn_st_tensor *)a)->name, ((const bn_st_tensor *)b)->name);
}

/* Orders pointers to tensors by where their bytes start, then end. */
static int cmp_by_offset(const void *a, const void *b)
{
    const bn_st_tensor *x = *(const bn_st_tensor *const *)a;
    const bn_st_tensor *y = *(const bn_st_tensor *const *)b;
    const uint8_t *xp = x->data, *yp = y->data;
    if (xp != yp)
        return xp < yp ? -1 : 1;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? -1 : 1;
    return 0;
}

static bn_status check_duplicates(const bn_safetensors *st, bn_error *err)
{
    for (size_t i = 1; i < st->count; i++) {
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
            return bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                                "%s: tensor '%s' appears twice in the header", st->label,
                                st->tensors[i].name);
    }
    return BN_OK;
}

/* Two tensors sharing bytes would let a write through one (after a copy to
 * the GPU, say) alias the other; the format forbids it. Empty tensors own
 * no bytes and never overlap. */
static bn_status check_overlaps(const bn_safetensors *st, bn_error *err)
{
    if (st->count < 2)
        return BN_OK;
    const bn_st_tensor **order = malloc(st->count * sizeof *order);
    if (!order)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "%s: out of memory", st->label);
    for (size_t i = 0; i < st->count; i++)
        order[i] = &st->tensors[i];
    qsort(order, st->count, sizeof *order, cmp_by_offset);

    bn_status s = BN_OK;
    const bn_st_tensor *prev = NULL; /* the non-empty tensor reaching furthest */
    for (size_t i = 0; i < st->count && s == BN_OK; i++) {
        const bn_st_tensor *t = order[i];
        if (t->bytes == 0)
            continue;
        const uint8_t *t_begin = t->data;
        if (prev && t_begin < (const uint8_t *)prev->data + prev->bytes) {
            uint64_t pb = (uint64_t)((const uint8_t *)prev->data - st->data);
            uint64_t tb = (uint64_t)(t_begin - st->data);
            s = bn_error_set(err, BN_ERR_FORMAT, ST_HINT_DAMAGED,
                             "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64
                             ", %" PRIu64 ") overlap in data_offsets",
                             st->label, prev->name, pb, pb + prev->bytes, t->name, tb,
                             tb + t->bytes);
        }
        if (!prev || t_begin + t->bytes > (const uint8_t *)prev->data + prev->bytes)
            prev = t;
    }
    free(order);
    return s;
}

static bn_status parse_tensors(bn_safetensors *st, bn_error *err)
{
    size_t n = 0;
    for (const cJSON *e = st->root->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__") != 0)
            n++;
    st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
    if (!st->tensors)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "%s: cannot allocate %zu tensors",
                            st->label, n);

    for (const cJSON *e = st->root->child; e; e = e->next) {
        bn_status s = strcmp(e->string, "__metadata__") == 0
                          ? parse_metadata(st, e, err)
                          : parse_tensor(st, e, &st->tensors[st->count++], err);
        if (s != BN_OK)
            return s;
    }

    qsort(st->tensors, st->count, sizeof *st->tensors, cmp_by_name);
    bn_status s = check_duplicates(st, err);
    if (s == BN_OK)
        s = check_overlaps(st, err);
    return s;
}

/* ---- public API ------------------------------------------------------------------ */

bn_status bn_safetensors_open(const char *path, bn_safetensors **out, bn_error *err)
{
    if (out)
        *out = NULL;
    if (!path || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_safetensors_open: path and out must not be NULL");

    bn_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->label = strdup(bn_path_base(path)))) {
        free(st);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "out of memory opening %s", path);
    }

    bn_status s = map_file(st, path, err);
    if (s == BN_OK)
        s = parse_header(st, err);
    if (s == BN_OK)
        s = parse_tensors(st, err);
    if (s != BN_OK) {
        bn_safetensors_close(st);
        return s;
    }
    *out = st;
    return BN_OK;
}

void bn_safetensors_close(bn_safetensors *st)
{
    if (!st)
        return;
    if (st->map)
        munmap((void *)st->map, st->map_size);
    cJSON_Delete(st->root);
    free(st->tensors);
    free(st->label);
    free(st);
}

size_t bn_safetensors_count(const bn_safetensors *st) { return st ? st->count : 0; }

const bn_st_tensor *bn_safetensors_at(const bn_safetensors *st, size_t i)
{
    if (!st || i >= st->count)
        return NULL;
    return &st->tensors[i];
}

const bn_st_tensor *bn_safetensors_find(const bn_safetensors *st, const char *name)
{
    if (!st || !name || st->count == 0)
        return NULL;
    bn_st_tensor key = {.name = name};
    return bsearch(&key, st->tensors, st->count, sizeof *st->tensors, cmp_by_name);
}

const char *bn_safetensors_metadata(const bn_safetensors *st, const char *key)
{
    if (!st || !st->metadata || !key)
        return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(st->metadata, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
