/*
 * gguf.h - reading and writing GGUF files (ggml's container: metadata
 * key/values, tensor infos, aligned tensor data). Format: docs/FORMATS.md
 * and ggml's docs/gguf.md.
 *
 * The reader maps the file (mmap, read-only) and validates everything
 * before returning: magic, version (2 or 3; 0, 1 and above 3 are refused),
 * every count, string length, value type, array length, tensor dimension,
 * type, offset and size, against the file's size, with an error naming the
 * field and its byte offset. Tensor data pointers point into the mapping
 * and stay valid until bn_gguf_close.
 *
 * The writer collects key/values and tensors (the caller keeps tensor data
 * alive until bn_gguf_writer_finish), then writes the file in one pass to
 * a temporary file of its own (created exclusively, under a random name in
 * the output's directory), syncs it and renames it over the output, so a
 * failed or interrupted write never leaves a truncated file behind and
 * concurrent writers of one output never mix their bytes.
 */
#ifndef BN_GGUF_H
#define BN_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

typedef enum bn_gguf_type {
    BN_GGUF_UINT8 = 0,
    BN_GGUF_INT8 = 1,
    BN_GGUF_UINT16 = 2,
    BN_GGUF_INT16 = 3,
    BN_GGUF_UINT32 = 4,
    BN_GGUF_INT32 = 5,
    BN_GGUF_FLOAT32 = 6,
    BN_GGUF_BOOL = 7,
    BN_GGUF_STRING = 8,
    BN_GGUF_ARRAY = 9,
    BN_GGUF_UINT64 = 10,
    BN_GGUF_INT64 = 11,
    BN_GGUF_FLOAT64 = 12,
    BN_GGUF_TYPE_COUNT
} bn_gguf_type;

const char *bn_gguf_type_name(bn_gguf_type t);

/* A string inside the mapping: not NUL-terminated. */
typedef struct bn_gguf_str {
    const char *ptr;
    uint64_t len;
} bn_gguf_str;

typedef struct bn_gguf_kv {
    bn_gguf_str key;
    bn_gguf_type type;
    /* Scalars (valid for the scalar types). */
    union {
        uint64_t u64; /* UINT8..UINT64, BOOL (0/1) */
        int64_t i64;  /* INT8..INT64 */
        double f64;   /* FLOAT32, FLOAT64 */
        bn_gguf_str str;
    } v;
    /* Arrays (type == BN_GGUF_ARRAY). */
    bn_gguf_type elem_type;
    uint64_t count;
    const uint8_t *elems; /* first element in the mapping */
    /* STRING arrays from the reader: where element i starts, relative to
     * elems (owned by the bn_gguf), so bn_gguf_array_str is O(1) instead
     * of walking i strings; NULL otherwise (array_str then walks). */
    const uint64_t *str_offsets;
} bn_gguf_kv;

#define BN_GGUF_MAX_DIMS 4
#define BN_GGUF_MAX_NAME 64

typedef struct bn_gguf_tensor {
    char name[BN_GGUF_MAX_NAME + 1]; /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t ne[BN_GGUF_MAX_DIMS];    /* ne[0] contiguous; unused dims are 1 */
    uint32_t type;                    /* ggml type id (bn_qtype values) */
    bool type_known;                  /* bitnet knows the type's size */
    uint64_t offset;                  /* relative to the data section */
    const void *data;                 /* in the mapping */
    uint64_t bytes;                   /* size (known types: from the shape) */
} bn_gguf_tensor;

typedef struct bn_gguf bn_gguf;

bn_status bn_gguf_open(const char *path, bn_gguf **out, bn_error *err);
void bn_gguf_close(bn_gguf *g);

uint32_t bn_gguf_version(const bn_gguf *g);
uint64_t bn_gguf_file_size(const bn_gguf *g);
uint32_t bn_gguf_alignment(const bn_gguf *g);

uint64_t bn_gguf_kv_count(const bn_gguf *g);
const bn_gguf_kv *bn_gguf_kv_at(const bn_gguf *g, uint64_t i);
/* NULL when absent. */
const bn_gguf_kv *bn_gguf_find(const bn_gguf *g, const char *key);

/* Typed getters: BN_OK, or BN_ERR_FORMAT naming the key when it is
 * present with an incompatible type or out of range; BN_ERR_INVALID_ARGUMENT
 * (no message) when absent, so callers can apply defaults. Integer getters
 * accept any integer type whose value fits. */
bn_status bn_gguf_get_u32(const bn_gguf *g, const char *key, uint32_t *out, bn_error *err);
bn_status bn_gguf_get_i64(const bn_gguf *g, const char *key, int64_t *out, bn_error *err);
bn_status bn_gguf_get_f32(const bn_gguf *g, const char *key, float *out, bn_error *err);
bn_status bn_gguf_get_bool(const bn_gguf *g, const char *key, bool *out, bn_error *err);
bn_status bn_gguf_get_str(const bn_gguf *g, const char *key, bn_gguf_str *out, bn_error *err);

/* Array elements (kv->type == BN_GGUF_ARRAY); i < kv->count is checked. */
bn_status bn_gguf_array_str(const bn_gguf_kv *kv, uint64_t i, bn_gguf_str *out, bn_error *err);
bn_status bn_gguf_array_i64(const bn_gguf_kv *kv, uint64_t i, int64_t *out, bn_error *err);
bn_status bn_gguf_array_f32(const bn_gguf_kv *kv, uint64_t i, float *out, bn_error *err);

uint64_t bn_gguf_tensor_count(const bn_gguf *g);
const bn_gguf_tensor *bn_gguf_tensor_at(const bn_gguf *g, uint64_t i);
const bn_gguf_tensor *bn_gguf_tensor_by_name(const bn_gguf *g, const char *name);

/* ---- writer ---------------------------------------------------------------- */

typedef struct bn_gguf_writer bn_gguf_writer;

bn_status bn_gguf_writer_create(bn_gguf_writer **out, bn_error *err);
void bn_gguf_writer_free(bn_gguf_writer *w);
/* Keys and strings are copied. A duplicate key or tensor name is an error. */
bn_status bn_gguf_writer_set_u32(bn_gguf_writer *w, const char *key, uint32_t v, bn_error *err);
bn_status bn_gguf_writer_set_i32(bn_gguf_writer *w, const char *key, int32_t v, bn_error *err);
bn_status bn_gguf_writer_set_f32(bn_gguf_writer *w, const char *key, float v, bn_error *err);
bn_status bn_gguf_writer_set_bool(bn_gguf_writer *w, const char *key, bool v, bn_error *err);
bn_status bn_gguf_writer_set_str(bn_gguf_writer *w, const char *key, const char *v, bn_error *err);
bn_status bn_gguf_writer_set_arr_str(bn_gguf_writer *w, const char *key, const char *const *v,
                                     uint64_t n, bn_error *err);
bn_status bn_gguf_writer_set_arr_i32(bn_gguf_writer *w, const char *key, const int32_t *v,
                                     uint64_t n, bn_error *err);
bn_status bn_gguf_writer_set_arr_f32(bn_gguf_writer *w, const char *key, const float *v,
                                     uint64_t n, bn_error *err);
/* data must stay valid until finish; bytes must equal the type's size for
 * the shape (checked for known types). */
bn_status bn_gguf_writer_add_tensor(bn_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const int64_t *ne, const void *data,
                                    uint64_t bytes, bn_error *err);
/* Progress callback (may be NULL): bytes written so far of total. */
typedef void (*bn_gguf_progress_fn)(void *ctx, uint64_t done, uint64_t total);
/* Writes path: a temporary file beside it (mode 0666 less the umask), synced,
 * renamed over path, then the directory synced. The temporary file is
 * removed on every failure. BN_ERR_IO when path exists and is not a regular
 * file (device, FIFO, directory, symbolic link: never replaced or written
 * through), or when creating, writing, syncing or renaming fails. */
bn_status bn_gguf_writer_finish(bn_gguf_writer *w, const char *path, bn_gguf_progress_fn progress,
                                void *ctx, bn_error *err);
/* BN_OK when path does not exist or is a regular file; else the
 * BN_ERR_IO refusal of bn_gguf_writer_finish, so a caller can refuse an
 * output before spending time on its contents. */
bn_status bn_gguf_check_output_path(const char *path, bn_error *err);
/* Removes the temporary files that writers in this process are writing
 * now. Async-signal-safe (lock-free atomics and unlink only): for a
 * SIGINT/SIGTERM handler the program installs itself, which should then
 * re-raise the signal with its default action. The library installs no
 * signal handlers. */
void bn_gguf_writer_remove_temp_files(void);

#endif
