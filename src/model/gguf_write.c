/*
 * gguf_write.c - GGUF writer: key/values and tensors collected in memory,
 * then written in one pass (layout: gguf_internal.h) to an exclusive
 * temporary file that is synced and renamed over the output. The reader
 * is gguf.c.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gguf_internal.h"
#include "qtype.h"

#define GGUF_HEADER_BYTES 24u

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
