/*
 * test_gguf.c - the GGUF reader and writer (src/model/gguf.c).
 *
 *   - round trip: our writer -> our reader, for every value type the
 *     writer offers (and empty arrays), tensors of several types (F32 1-D
 *     to 4-D, F16, Q8_0, TQ2_0, I2_S, an empty tensor, a type bitnet does
 *     not size), alignment 32 and 64, progress reports, no temp file left;
 *     writer argument errors;
 *   - files written by gguf-py (tests/data/gguf, scripts/gen_gguf_fixtures.py):
 *     every value type and array element type, read value by value;
 *   - malformed files, built here byte by byte so that each field's offset
 *     is known: truncation at every length, every header field overwritten
 *     (version, counts, lengths, types, dims, offsets, alignment,
 *     duplicates), each with the status expected and the field named in
 *     the message; then random byte corruption, which must never crash.
 *
 * Truncated and corrupted images are parsed from exact-size heap buffers
 * (bn_gguf_open_memory), so that AddressSanitizer or valgrind catch any
 * read past the end, which a file mapping's last page would hide.
 *
 * Usage: test_gguf DATA_DIR (holding gguf/fixture.gguf). BN_TEST_SEED=N
 * repeats the random corruption; BN_TEST_VERBOSE=1 prints every malformed
 * case's message.
 */
#include "gguf.h"
#include "qtype.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

/* In gguf.c, not in gguf.h: parses an image in memory. */
bn_status bn_gguf_open_memory(const void *data, uint64_t size, const char *name, bn_gguf **out,
                              bn_error *err);

static char tmp_dir[256];

static void tmp_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmp_dir, name);
}

static bool file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static bool write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static bool str_eq(bn_gguf_str s, const char *want)
{
    return s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}

/* ------------------------------------------------------------------------ */
/* Round trip through our writer                                            */
/* ------------------------------------------------------------------------ */

typedef struct progress_log {
    int calls;
    uint64_t last_done, total;
    bool monotonic;
} progress_log;

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
    progress_log *p = ctx;
    if (done < p->last_done || (p->calls && total != p->total))
        p->monotonic = false;
    p->calls++;
    p->last_done = done;
    p->total = total;
}

static void fill_bytes(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131 + seed * 17 + 7);
}

static size_t qsize(bn_qtype t, int64_t rows, int64_t cols)
{
    size_t n = 0;
    bn_error e;
    if (bn_qtype_tensor_size(t, rows, cols, &n, &e) != BN_OK) {
        fprintf(stderr, "qtype size: %s\n", e.message);
        exit(1);
    }
    return n;
}

typedef struct rt_tensor {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];
    uint64_t bytes;
    uint8_t *data;
} rt_tensor;

static void check_round_trip_kvs(const bn_gguf *g, const char *const *strs, uint64_t n_strs)
{
    bn_error e;
    uint32_t u32 = 0;
    int64_t i64 = 0;
    float f32 = 0;
    bool b = false;
    bn_gguf_str s;

    CHECK(bn_gguf_get_u32(g, "rt.u32", &u32, &e) == BN_OK && u32 == 4000000000u);
    CHECK(bn_gguf_get_i64(g, "rt.u32", &i64, &e) == BN_OK && i64 == 4000000000);
    CHECK(bn_gguf_get_i64(g, "rt.i32", &i64, &e) == BN_OK && i64 == -123456);
    CHECK(bn_gguf_get_f32(g, "rt.f32", &f32, &e) == BN_OK && f32 == -2.75f);
    CHECK(bn_gguf_get_f32(g, "rt.i32", &f32, &e) == BN_OK && f32 == -123456.0f);
    CHECK(bn_gguf_get_bool(g, "rt.true", &b, &e) == BN_OK && b);
    CHECK(bn_gguf_get_bool(g, "rt.false", &b, &e) == BN_OK && !b);
    CHECK(bn_gguf_get_str(g, "rt.str", &s, &e) == BN_OK && str_eq(s, "h\xc3\xa9llo"));
    CHECK(bn_gguf_get_str(g, "rt.empty_str", &s, &e) == BN_OK && s.len == 0);

    /* Type and range errors name the key; absent keys are quiet. */
    CHECK(bn_gguf_get_u32(g, "rt.i32", &u32, &e) == BN_ERR_FORMAT);
    CHECK_STR_CONTAINS(e.message, "rt.i32");
    CHECK(bn_gguf_get_str(g, "rt.u32", &s, &e) == BN_ERR_FORMAT);
    CHECK_STR_CONTAINS(e.message, "rt.u32");
    CHECK(bn_gguf_get_bool(g, "rt.str", &b, &e) == BN_ERR_FORMAT);
    CHECK(bn_gguf_get_f32(g, "rt.str", &f32, &e) == BN_ERR_FORMAT);
    CHECK(bn_gguf_get_u32(g, "no.such.key", &u32, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_get_i64(g, "no.such.key", &i64, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_find(g, "no.such.key") == NULL);
    CHECK(bn_gguf_find(g, "rt") == NULL);       /* prefix of keys */
    CHECK(bn_gguf_find(g, "rt.u32x") == NULL);  /* extension of a key */

    const bn_gguf_kv *kv = bn_gguf_find(g, "rt.strs");
    CHECK(kv && kv->type == BN_GGUF_ARRAY && kv->elem_type == BN_GGUF_STRING &&
          kv->count == n_strs);
    for (uint64_t i = 0; kv && i < n_strs; i++) {
        CHECK_MSG(bn_gguf_array_str(kv, i, &s, &e) == BN_OK && str_eq(s, strs[i]),
                  "rt.strs[%" PRIu64 "]", i);
    }
    if (kv) {
        /* The walking path (no index) agrees with the indexed one. */
        bn_gguf_kv copy = *kv;
        copy.str_offsets = NULL;
        CHECK(bn_gguf_array_str(&copy, n_strs - 1, &s, &e) == BN_OK &&
              str_eq(s, strs[n_strs - 1]));
        CHECK(bn_gguf_array_str(kv, n_strs, &s, &e) == BN_ERR_INVALID_ARGUMENT);
        CHECK(bn_gguf_array_i64(kv, 0, &i64, &e) == BN_ERR_FORMAT);
        CHECK_STR_CONTAINS(e.message, "rt.strs");
    }

    kv = bn_gguf_find(g, "rt.ints");
    const int32_t ints[] = {0, -1, INT32_MAX, INT32_MIN, 42};
    CHECK(kv && kv->elem_type == BN_GGUF_INT32 && kv->count == 5);
    for (uint64_t i = 0; kv && i < 5; i++)
        CHECK(bn_gguf_array_i64(kv, i, &i64, &e) == BN_OK && i64 == ints[i]);
    if (kv) {
        CHECK(bn_gguf_array_f32(kv, 4, &f32, &e) == BN_OK && f32 == 42.0f);
        CHECK(bn_gguf_array_str(kv, 0, &s, &e) == BN_ERR_FORMAT);
        CHECK(bn_gguf_array_i64(kv, 5, &i64, &e) == BN_ERR_INVALID_ARGUMENT);
    }

    kv = bn_gguf_find(g, "rt.floats");
    const float floats[] = {0.5f, -0.0f, 1e30f, -3.25f};
    CHECK(kv && kv->elem_type == BN_GGUF_FLOAT32 && kv->count == 4);
    for (uint64_t i = 0; kv && i < 4; i++)
        CHECK(bn_gguf_array_f32(kv, i, &f32, &e) == BN_OK &&
              memcmp(&f32, &floats[i], 4) == 0);
    if (kv)
        CHECK(bn_gguf_array_i64(kv, 0, &i64, &e) == BN_ERR_FORMAT);

    kv = bn_gguf_find(g, "rt.empty_strs");
    CHECK(kv && kv->type == BN_GGUF_ARRAY && kv->elem_type == BN_GGUF_STRING && kv->count == 0);
    if (kv)
        CHECK(bn_gguf_array_str(kv, 0, &s, &e) == BN_ERR_INVALID_ARGUMENT);
    kv = bn_gguf_find(g, "rt.empty_ints");
    CHECK(kv && kv->elem_type == BN_GGUF_INT32 && kv->count == 0);

    /* A scalar is not an array. */
    CHECK(bn_gguf_array_i64(bn_gguf_find(g, "rt.u32"), 0, &i64, &e) == BN_ERR_FORMAT);
}

static void check_round_trip_tensors(const bn_gguf *g, const rt_tensor *ts, size_t n,
                                     uint32_t alignment)
{
    CHECK(bn_gguf_tensor_count(g) == n);
    for (size_t i = 0; i < n; i++) {
        const rt_tensor *w = &ts[i];
        const bn_gguf_tensor *t = bn_gguf_tensor_by_name(g, w->name);
        CHECK_MSG(t != NULL, "tensor %s missing", w->name);
        if (!t)
            continue;
        CHECK(t == bn_gguf_tensor_at(g, i)); /* file order = order added */
        CHECK(t->n_dims == w->n_dims && t->type == w->type);
        for (uint32_t j = 0; j < 4; j++)
            CHECK_MSG(t->ne[j] == (j < w->n_dims ? w->ne[j] : 1), "%s ne[%u]", w->name, j);
        const bool known = bn_qtype_get((bn_qtype)w->type) != NULL;
        CHECK(t->type_known == known);
        /* Unknown types are sized up to the next tensor: the padded size. */
        const uint64_t padded = (w->bytes + alignment - 1) / alignment * alignment;
        const uint64_t want_bytes = known ? w->bytes : padded;
        CHECK_MSG(t->bytes == want_bytes, "%s: %" PRIu64 " bytes, want %" PRIu64, w->name,
                  t->bytes, want_bytes);
        CHECK(t->offset % alignment == 0);
        /* The mapping starts on a page, so the data is aligned in memory. */
        CHECK(((uintptr_t)t->data) % alignment == 0);
        CHECK_MSG(w->bytes == 0 || memcmp(t->data, w->data, w->bytes) == 0, "%s data", w->name);
    }
    CHECK(bn_gguf_tensor_by_name(g, "nope") == NULL);
    CHECK(bn_gguf_tensor_at(g, n) == NULL);
}

static void test_round_trip(uint32_t alignment)
{
    bn_error e;
    bn_gguf_writer *w = NULL;
    CHECK(bn_gguf_writer_create(&w, &e) == BN_OK);
    if (!w)
        return;

    if (alignment != 32)
        CHECK(bn_gguf_writer_set_u32(w, "general.alignment", alignment, &e) == BN_OK);
    CHECK(bn_gguf_writer_set_str(w, "general.architecture", "bitnet-test", &e) == BN_OK);
    CHECK(bn_gguf_writer_set_u32(w, "rt.u32", 4000000000u, &e) == BN_OK);
    CHECK(bn_gguf_writer_set_i32(w, "rt.i32", -123456, &e) == BN_OK);
    CHECK(bn_gguf_writer_set_f32(w, "rt.f32", -2.75f, &e) == BN_OK);
    CHECK(bn_gguf_writer_set_bool(w, "rt.true", true, &e) == BN_OK);
    CHECK(bn_gguf_writer_set_bool(w, "rt.false", false, &e) == BN_OK);
    CHECK(bn_gguf_writer_set_str(w, "rt.str", "h\xc3\xa9llo", &e) == BN_OK);
    CHECK(bn_gguf_writer_set_str(w, "rt.empty_str", "", &e) == BN_OK);

    /* A vocabulary-sized string array: also exercises the O(1) index. */
    enum { N_STRS = 5000 };
    static char storage[N_STRS][16];
    static const char *strs[N_STRS];
    for (int i = 0; i < N_STRS; i++) {
        if (i % 7 == 3)
            storage[i][0] = '\0'; /* empty strings in between */
        else
            snprintf(storage[i], sizeof storage[i], "tok%d", i);
        strs[i] = storage[i];
    }
    CHECK(bn_gguf_writer_set_arr_str(w, "rt.strs", strs, N_STRS, &e) == BN_OK);
    const int32_t ints[] = {0, -1, INT32_MAX, INT32_MIN, 42};
    CHECK(bn_gguf_writer_set_arr_i32(w, "rt.ints", ints, 5, &e) == BN_OK);
    const float floats[] = {0.5f, -0.0f, 1e30f, -3.25f};
    CHECK(bn_gguf_writer_set_arr_f32(w, "rt.floats", floats, 4, &e) == BN_OK);
    CHECK(bn_gguf_writer_set_arr_str(w, "rt.empty_strs", NULL, 0, &e) == BN_OK);
    CHECK(bn_gguf_writer_set_arr_i32(w, "rt.empty_ints", NULL, 0, &e) == BN_OK);

    rt_tensor ts[] = {
        {"f32.vec", BN_QTYPE_F32, 1, {5}, 20, NULL},
        {"f32.4d", BN_QTYPE_F32, 4, {2, 3, 2, 2}, 4 * 24, NULL},
        {"f16.mat", BN_QTYPE_F16, 2, {8, 3}, 2 * 24, NULL},
        {"q8_0.mat", BN_QTYPE_Q8_0, 2, {64, 3}, qsize(BN_QTYPE_Q8_0, 3, 64), NULL},
        {"unknown.q4_0", 2 /* Q4_0: not in bitnet's registry */, 2, {32, 1}, 18, NULL},
        {"tq2_0.mat", BN_QTYPE_TQ2_0, 2, {256, 3}, qsize(BN_QTYPE_TQ2_0, 3, 256), NULL},
        {"empty", BN_QTYPE_F32, 2, {0, 4}, 0, NULL},
        {"i2_s.3d", BN_QTYPE_I2_S, 3, {128, 2, 2}, qsize(BN_QTYPE_I2_S, 4, 128), NULL},
        {"blk.0.attn_q.weight", BN_QTYPE_F32, 2, {3, 1}, 12, NULL},
    };
    const size_t n_ts = sizeof ts / sizeof ts[0];
    for (size_t i = 0; i < n_ts; i++) {
        ts[i].data = malloc(ts[i].bytes ? ts[i].bytes : 1);
        fill_bytes(ts[i].data, ts[i].bytes, (unsigned)i);
        CHECK_MSG(bn_gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne,
                                            ts[i].data, ts[i].bytes, &e) == BN_OK,
                  "add %s: %s", ts[i].name, e.message);
    }

    char path[512], tmp[520];
    tmp_path(path, sizeof path, alignment == 32 ? "rt32.gguf" : "rt64.gguf");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    progress_log pl = {0, 0, 0, true};
    CHECK(bn_gguf_writer_finish(w, path, on_progress, &pl, &e) == BN_OK);
    CHECK(!file_exists(tmp));
    bn_gguf_writer_free(w);

    bn_gguf *g = NULL;
    CHECK_MSG(bn_gguf_open(path, &g, &e) == BN_OK, "%s", e.message);
    if (g) {
        CHECK(bn_gguf_version(g) == 3);
        CHECK(bn_gguf_alignment(g) == alignment);
        CHECK(bn_gguf_kv_count(g) == (alignment != 32 ? 14u : 13u));
        CHECK(pl.calls >= 2 && pl.monotonic && pl.last_done == pl.total &&
              pl.total == bn_gguf_file_size(g));
        CHECK(bn_gguf_file_size(g) % alignment == 0);
        /* Key order is the order set. */
        const bn_gguf_kv *first = bn_gguf_kv_at(g, alignment != 32 ? 1 : 0);
        CHECK(first && str_eq(first->key, "general.architecture"));
        CHECK(bn_gguf_kv_at(g, bn_gguf_kv_count(g)) == NULL);
        check_round_trip_kvs(g, strs, N_STRS);
        check_round_trip_tensors(g, ts, n_ts, alignment);
        bn_gguf_close(g);
    }
    for (size_t i = 0; i < n_ts; i++)
        free(ts[i].data);
}

/* Many tensors: lookups by name all hit (the index is sorted once). */
static void test_many_tensors(void)
{
    enum { N = 700 };
    bn_error e;
    bn_gguf_writer *w = NULL;
    CHECK(bn_gguf_writer_create(&w, &e) == BN_OK);
    if (!w)
        return;
    static float vals[N];
    char name[64];
    const int64_t ne[1] = {1};
    for (int i = 0; i < N; i++) {
        vals[i] = (float)i;
        /* Reverse order, so file order and name order differ. */
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", N - 1 - i);
        CHECK(bn_gguf_writer_add_tensor(w, name, BN_QTYPE_F32, 1, ne, &vals[i], 4, &e) == BN_OK);
    }
    char path[512];
    tmp_path(path, sizeof path, "many.gguf");
    CHECK(bn_gguf_writer_finish(w, path, NULL, NULL, &e) == BN_OK);
    bn_gguf_writer_free(w);
    bn_gguf *g = NULL;
    CHECK(bn_gguf_open(path, &g, &e) == BN_OK);
    int hits = 0;
    for (int i = 0; g && i < N; i++) {
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", i);
        const bn_gguf_tensor *t = bn_gguf_tensor_by_name(g, name);
        float v = -1;
        if (t)
            memcpy(&v, t->data, 4);
        hits += t && v == (float)(N - 1 - i);
    }
    CHECK(hits == N);
    bn_gguf_close(g);
}

static void test_writer_errors(void)
{
    bn_error e;
    bn_gguf_writer *w = NULL;
    CHECK(bn_gguf_writer_create(&w, &e) == BN_OK);
    if (!w)
        return;
    CHECK(bn_gguf_writer_set_u32(w, "a", 1, &e) == BN_OK);
    CHECK(bn_gguf_writer_set_i32(w, "a", 2, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "'a'");
    CHECK(bn_gguf_writer_set_str(w, "", "x", &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_writer_set_u32(w, "general.alignment", 3, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_writer_set_u32(w, "general.alignment", 0, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_writer_set_i32(w, "general.alignment", 64, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "general.alignment");

    float data[64] = {0};
    const int64_t ne2[2] = {4, 2}, ne1[1] = {32}, ne5[5] = {1, 1, 1, 1, 1}, neg[1] = {-1};
    CHECK(bn_gguf_writer_add_tensor(w, "t", BN_QTYPE_F32, 2, ne2, data, 32, &e) == BN_OK);
    CHECK(bn_gguf_writer_add_tensor(w, "t", BN_QTYPE_F32, 2, ne2, data, 32, &e) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "'t'");
    /* Size must match a known type's shape. */
    CHECK(bn_gguf_writer_add_tensor(w, "u", BN_QTYPE_F32, 2, ne2, data, 28, &e) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "'u'");
    /* Q8_0 rows must be whole blocks. */
    const int64_t ne_bad[1] = {33};
    CHECK(bn_gguf_writer_add_tensor(w, "v", BN_QTYPE_Q8_0, 1, ne_bad, data, 34, &e) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_writer_add_tensor(w, "w", BN_QTYPE_Q8_0, 1, ne1, data, 34, &e) == BN_OK);
    CHECK(bn_gguf_writer_add_tensor(w, "x", BN_QTYPE_F32, 5, ne5, data, 4, &e) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_writer_add_tensor(w, "x", BN_QTYPE_F32, 0, ne5, data, 4, &e) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_writer_add_tensor(w, "x", BN_QTYPE_F32, 1, neg, data, 4, &e) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_writer_add_tensor(w, "x", 1000, 1, ne1, data, 4, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_writer_add_tensor(w, "x", BN_QTYPE_F32, 1, ne1, NULL, 128, &e) ==
          BN_ERR_INVALID_ARGUMENT);
    char long_name[80];
    memset(long_name, 'n', 64);
    long_name[64] = '\0';
    CHECK(bn_gguf_writer_add_tensor(w, long_name, BN_QTYPE_F32, 1, ne1, data, 128, &e) ==
          BN_ERR_INVALID_ARGUMENT);
    long_name[63] = '\0'; /* 63 bytes is ggml's maximum */
    CHECK(bn_gguf_writer_add_tensor(w, long_name, BN_QTYPE_F32, 1, ne1, data, 128, &e) == BN_OK);

    /* A directory that does not exist: IO error, nothing left behind. */
    char path[512], tmp[520];
    tmp_path(path, sizeof path, "no/such/dir/out.gguf");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(bn_gguf_writer_finish(w, path, NULL, NULL, &e) == BN_ERR_IO);
    CHECK_STR_CONTAINS(e.message, "out.gguf");
    CHECK(!file_exists(tmp) && !file_exists(path));
    /* A failed rename (target is a non-empty directory): temp removed. */
    tmp_path(path, sizeof path, "a_dir");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    char inner[600];
    snprintf(inner, sizeof inner, "%s/x", path);
    CHECK(mkdir(path, 0700) == 0 && write_file(inner, "x", 1));
    CHECK(bn_gguf_writer_finish(w, path, NULL, NULL, &e) == BN_ERR_IO);
    CHECK(!file_exists(tmp));
    remove(inner);
    rmdir(path);
    bn_gguf_writer_free(w);
}

/* ------------------------------------------------------------------------ */
/* gguf-py fixtures                                                         */
/* ------------------------------------------------------------------------ */

static bool tensor_bytes_match(const bn_gguf_tensor *t, unsigned mul, unsigned add, size_t n)
{
    const uint8_t *p = t->data;
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(i * mul + add))
            return false;
    return true;
}

static void check_fixture_kvs(const bn_gguf *g)
{
    bn_error e;
    const bn_gguf_kv *kv;
    bn_gguf_str s;
    int64_t i64;
    uint32_t u32;
    float f32;
    bool b;

    CHECK(bn_gguf_kv_count(g) == 23);
    CHECK(bn_gguf_get_str(g, "general.architecture", &s, &e) == BN_OK && str_eq(s, "testarch"));
#define SCALAR(key_, type_, field_, value_)                                                   \
    kv = bn_gguf_find(g, key_);                                                              \
    CHECK_MSG(kv && kv->type == (type_) && kv->v.field_ == (value_), "%s", key_)
    SCALAR("t.u8", BN_GGUF_UINT8, u64, 200u);
    SCALAR("t.i8", BN_GGUF_INT8, i64, -100);
    SCALAR("t.u16", BN_GGUF_UINT16, u64, 60000u);
    SCALAR("t.i16", BN_GGUF_INT16, i64, -30000);
    SCALAR("t.u32", BN_GGUF_UINT32, u64, 4000000000u);
    SCALAR("t.i32", BN_GGUF_INT32, i64, -2000000000);
    SCALAR("t.f32", BN_GGUF_FLOAT32, f64, 1.5);
    SCALAR("t.bool_true", BN_GGUF_BOOL, u64, 1u);
    SCALAR("t.bool_false", BN_GGUF_BOOL, u64, 0u);
    SCALAR("t.u64", BN_GGUF_UINT64, u64, UINT64_C(18000000000000000000));
    SCALAR("t.i64", BN_GGUF_INT64, i64, INT64_C(-9000000000000000000));
    SCALAR("t.f64", BN_GGUF_FLOAT64, f64, 0.1);
#undef SCALAR
    CHECK(bn_gguf_get_str(g, "t.str", &s, &e) == BN_OK && str_eq(s, "h\xc3\xa9llo w\xc3\xb6rld"));

    /* Getter conversions and ranges on real types. */
    CHECK(bn_gguf_get_u32(g, "t.u8", &u32, &e) == BN_OK && u32 == 200);
    CHECK(bn_gguf_get_u32(g, "t.u16", &u32, &e) == BN_OK && u32 == 60000);
    CHECK(bn_gguf_get_u32(g, "t.u64", &u32, &e) == BN_ERR_FORMAT);
    CHECK_STR_CONTAINS(e.message, "t.u64");
    CHECK(bn_gguf_get_u32(g, "t.i8", &u32, &e) == BN_ERR_FORMAT);
    CHECK(bn_gguf_get_i64(g, "t.i64", &i64, &e) == BN_OK && i64 == INT64_C(-9000000000000000000));
    CHECK(bn_gguf_get_i64(g, "t.u64", &i64, &e) == BN_ERR_FORMAT);
    CHECK(bn_gguf_get_i64(g, "t.i16", &i64, &e) == BN_OK && i64 == -30000);
    CHECK(bn_gguf_get_f32(g, "t.f64", &f32, &e) == BN_OK && f32 == 0.1f);
    CHECK(bn_gguf_get_f32(g, "t.u16", &f32, &e) == BN_OK && f32 == 60000.0f);
    CHECK(bn_gguf_get_bool(g, "t.bool_true", &b, &e) == BN_OK && b);
    CHECK(bn_gguf_get_bool(g, "t.bool_false", &b, &e) == BN_OK && !b);
    CHECK(bn_gguf_get_bool(g, "t.u8", &b, &e) == BN_ERR_FORMAT); /* 200 is not a flag */
    CHECK(bn_gguf_get_u32(g, "t.u32_small", &u32, &e) == BN_OK && u32 == 7);
    CHECK(bn_gguf_get_bool(g, "t.f32", &b, &e) == BN_ERR_FORMAT);

    const char *strs[] = {"a", "", "\xc3\xbc" "ber", "last one"};
    kv = bn_gguf_find(g, "t.arr_str");
    CHECK(kv && kv->elem_type == BN_GGUF_STRING && kv->count == 4);
    for (uint64_t i = 0; kv && i < 4; i++)
        CHECK(bn_gguf_array_str(kv, i, &s, &e) == BN_OK && str_eq(s, strs[i]));

    const int64_t i32s[] = {1, -2, 2147483647, -2147483648LL};
    kv = bn_gguf_find(g, "t.arr_i32");
    CHECK(kv && kv->elem_type == BN_GGUF_INT32 && kv->count == 4);
    for (uint64_t i = 0; kv && i < 4; i++)
        CHECK(bn_gguf_array_i64(kv, i, &i64, &e) == BN_OK && i64 == i32s[i]);

    const float f32s[] = {0.25f, -1.0f, 3.5f};
    kv = bn_gguf_find(g, "t.arr_f32");
    CHECK(kv && kv->elem_type == BN_GGUF_FLOAT32 && kv->count == 3);
    for (uint64_t i = 0; kv && i < 3; i++)
        CHECK(bn_gguf_array_f32(kv, i, &f32, &e) == BN_OK && f32 == f32s[i]);

    const int64_t u8s[] = {0, 255, 17};
    kv = bn_gguf_find(g, "t.arr_u8");
    CHECK(kv && kv->elem_type == BN_GGUF_UINT8 && kv->count == 3);
    for (uint64_t i = 0; kv && i < 3; i++)
        CHECK(bn_gguf_array_i64(kv, i, &i64, &e) == BN_OK && i64 == u8s[i]);

    kv = bn_gguf_find(g, "t.arr_i64");
    CHECK(kv && kv->elem_type == BN_GGUF_INT64 && kv->count == 2);
    if (kv) {
        CHECK(bn_gguf_array_i64(kv, 0, &i64, &e) == BN_OK && i64 == -5);
        CHECK(bn_gguf_array_i64(kv, 1, &i64, &e) == BN_OK && i64 == INT64_C(6000000000));
    }
    kv = bn_gguf_find(g, "t.arr_u64");
    CHECK(kv && kv->elem_type == BN_GGUF_UINT64 && kv->count == 2);
    if (kv) {
        CHECK(bn_gguf_array_i64(kv, 0, &i64, &e) == BN_OK && i64 == 1);
        CHECK(bn_gguf_array_i64(kv, 1, &i64, &e) == BN_ERR_FORMAT); /* > INT64_MAX */
        CHECK(bn_gguf_array_f32(kv, 1, &f32, &e) == BN_OK && fabsf(f32 / 1.8e19f - 1.0f) < 1e-6f);
    }
    kv = bn_gguf_find(g, "t.arr_bool");
    CHECK(kv && kv->elem_type == BN_GGUF_BOOL && kv->count == 3);
    if (kv)
        CHECK(kv->elems[0] == 1 && kv->elems[1] == 0 && kv->elems[2] == 1);
    kv = bn_gguf_find(g, "t.arr_f64");
    CHECK(kv && kv->elem_type == BN_GGUF_FLOAT64 && kv->count == 2);
    if (kv) {
        CHECK(bn_gguf_array_f32(kv, 0, &f32, &e) == BN_OK && f32 == 2.5f);
        CHECK(bn_gguf_array_f32(kv, 1, &f32, &e) == BN_OK && f32 == -0.125f);
    }
}

static void check_fixture_tensors(const bn_gguf *g)
{
    CHECK(bn_gguf_tensor_count(g) == 8);
    CHECK(bn_gguf_alignment(g) == 32);
    const bn_gguf_tensor *t;

    t = bn_gguf_tensor_by_name(g, "f32.vec");
    CHECK(t && t->n_dims == 1 && t->ne[0] == 5 && t->ne[1] == 1 && t->type == BN_QTYPE_F32 &&
          t->type_known && t->bytes == 20 && t->offset == 0);
    if (t) {
        float v[5];
        memcpy(v, t->data, sizeof v);
        CHECK(v[0] == -1.0f && v[4] == 1.0f);
    }
    t = bn_gguf_tensor_by_name(g, "f32.cube");
    CHECK(t && t->n_dims == 3 && t->ne[0] == 4 && t->ne[1] == 3 && t->ne[2] == 2 &&
          t->ne[3] == 1 && t->bytes == 96);
    if (t) {
        float v[24];
        memcpy(v, t->data, sizeof v);
        CHECK(v[23] == 23.0f && v[5] == 5.0f);
    }
    t = bn_gguf_tensor_by_name(g, "f32.4d");
    CHECK(t && t->n_dims == 4 && t->ne[0] == 2 && t->ne[3] == 2 && t->bytes == 64);
    t = bn_gguf_tensor_by_name(g, "f16.mat");
    CHECK(t && t->type == BN_QTYPE_F16 && t->ne[0] == 3 && t->ne[1] == 2 && t->bytes == 12);
    if (t) {
        const uint8_t *p = t->data; /* -2.0 as half is 0xc000 */
        CHECK(p[0] == 0x00 && p[1] == 0xc0);
    }
    t = bn_gguf_tensor_by_name(g, "bf16.raw");
    CHECK(t && t->type == BN_QTYPE_BF16 && t->ne[0] == 8 && t->ne[1] == 2 && t->bytes == 32 &&
          tensor_bytes_match(t, 3, 1, 32));
    t = bn_gguf_tensor_by_name(g, "q8_0.mat");
    CHECK(t && t->type == BN_QTYPE_Q8_0 && t->ne[0] == 32 && t->ne[1] == 2 && t->bytes == 68 &&
          tensor_bytes_match(t, 7, 3, 68));
    /* Q4_0: bitnet does not size it, so it runs to the next tensor. */
    t = bn_gguf_tensor_by_name(g, "q4_0.unknown");
    CHECK(t && t->type == 2 && !t->type_known && t->ne[0] == 32 && t->bytes == 32 &&
          tensor_bytes_match(t, 5, 9, 18));
    t = bn_gguf_tensor_by_name(g, "tq2_0.mat");
    CHECK(t && t->type == BN_QTYPE_TQ2_0 && t->ne[0] == 256 && t->ne[1] == 2 &&
          t->bytes == 132 && tensor_bytes_match(t, 11, 5, 132));
    if (t)
        CHECK(t->offset + 132 <= bn_gguf_file_size(g));
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(len > 0 ? (size_t)len : 1);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return p;
}

static void test_fixtures(const char *data_dir)
{
    char path[1024];
    bn_error e;
    bn_gguf *g = NULL;
    snprintf(path, sizeof path, "%s/gguf/fixture.gguf", data_dir);
    CHECK_MSG(bn_gguf_open(path, &g, &e) == BN_OK, "%s", e.message);
    if (g) {
        CHECK(bn_gguf_version(g) == 3);
        check_fixture_kvs(g);
        check_fixture_tensors(g);
        bn_gguf_close(g);
    }

    /* Version 2 has the same layout: accepted. */
    size_t n = 0;
    uint8_t *img = read_all(path, &n);
    CHECK(img != NULL);
    if (img) {
        img[4] = 2;
        CHECK(bn_gguf_open_memory(img, n, "v2", &g, &e) == BN_OK);
        if (g) {
            CHECK(bn_gguf_version(g) == 2);
            check_fixture_kvs(g);
            bn_gguf_close(g);
        }
        free(img);
    }

    snprintf(path, sizeof path, "%s/gguf/align64.gguf", data_dir);
    CHECK_MSG(bn_gguf_open(path, &g, &e) == BN_OK, "%s", e.message);
    if (g) {
        CHECK(bn_gguf_alignment(g) == 64);
        const bn_gguf_tensor *a = bn_gguf_tensor_by_name(g, "a");
        const bn_gguf_tensor *b = bn_gguf_tensor_by_name(g, "b");
        CHECK(a && a->offset == 0 && a->bytes == 12);
        CHECK(b && b->offset == 64 && b->bytes == 80 && ((uintptr_t)b->data) % 64 == 0);
        if (b) {
            float v;
            memcpy(&v, (const uint8_t *)b->data + 19 * 4, 4);
            CHECK(v == 19.0f);
        }
        bn_gguf_close(g);
    }
}

/* ------------------------------------------------------------------------ */
/* Hand-built images for the malformed-file battery                         */
/* ------------------------------------------------------------------------ */

typedef struct image {
    uint8_t p[4096];
    size_t n;
} image;

static size_t put(image *im, const void *d, size_t n)
{
    const size_t at = im->n;
    memcpy(im->p + im->n, d, n);
    im->n += n;
    return at;
}

static size_t put32(image *im, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return put(im, b, 4);
}

static size_t put64(image *im, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return put(im, b, 8);
}

/* Returns the offset of the length field. */
static size_t put_gstr(image *im, const char *s)
{
    const size_t at = put64(im, strlen(s));
    put(im, s, strlen(s));
    return at;
}

static void patch32(uint8_t *p, size_t at, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[at + i] = (uint8_t)(v >> (8 * i));
}

static void patch64(uint8_t *p, size_t at, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[at + i] = (uint8_t)(v >> (8 * i));
}

/* Where each interesting field of the base image lies. */
typedef struct layout {
    size_t version, n_tensors, n_kv;
    size_t align_type, align_value;
    size_t kaa_key, kab_key, kab_value;
    size_t strs_count, strs_elem1_len;
    size_t ints_elem_type, ints_count;
    size_t name_len[3], n_dims[3], ne[3], type[3], offset[3];
    size_t data_start, data_end; /* data_end: end of the last tensor's bytes */
} layout;

/* general.architecture (string), general.alignment = 32, k.aa (u32),
 * k.ab (bool), k.strs (3 strings), k.ints (3 int32); tensors t0 F32 {8}
 * at 0, t1 Q8_0 {32, 2} at 32, t2 F32 {3} at 128, each padded to 32. */
static void build_base(image *im, layout *L)
{
    memset(im, 0, sizeof *im);
    put(im, "GGUF", 4);
    L->version = put32(im, 3);
    L->n_tensors = put64(im, 3);
    L->n_kv = put64(im, 6);

    put_gstr(im, "general.architecture");
    put32(im, BN_GGUF_STRING);
    put_gstr(im, "bitnet");

    put_gstr(im, "general.alignment");
    L->align_type = put32(im, BN_GGUF_UINT32);
    L->align_value = put32(im, 32);

    L->kaa_key = put_gstr(im, "k.aa");
    put32(im, BN_GGUF_UINT32);
    put32(im, 7);

    L->kab_key = put_gstr(im, "k.ab");
    put32(im, BN_GGUF_BOOL);
    const uint8_t one = 1;
    L->kab_value = put(im, &one, 1);

    put_gstr(im, "k.strs");
    put32(im, BN_GGUF_ARRAY);
    put32(im, BN_GGUF_STRING);
    L->strs_count = put64(im, 3);
    put_gstr(im, "x");
    L->strs_elem1_len = put_gstr(im, "yy");
    put_gstr(im, "zzz");

    put_gstr(im, "k.ints");
    put32(im, BN_GGUF_ARRAY);
    L->ints_elem_type = put32(im, BN_GGUF_INT32);
    L->ints_count = put64(im, 3);
    put32(im, 1);
    put32(im, 2);
    put32(im, 3);

    static const char *const names[3] = {"t0", "t1", "t2"};
    static const uint32_t types[3] = {BN_QTYPE_F32, BN_QTYPE_Q8_0, BN_QTYPE_F32};
    static const uint32_t dims[3] = {1, 2, 1};
    static const int64_t nes[3][2] = {{8, 1}, {32, 2}, {3, 1}};
    static const uint64_t offsets[3] = {0, 32, 128};
    for (int t = 0; t < 3; t++) {
        L->name_len[t] = put_gstr(im, names[t]);
        L->n_dims[t] = put32(im, dims[t]);
        L->ne[t] = im->n;
        for (uint32_t j = 0; j < dims[t]; j++)
            put64(im, (uint64_t)nes[t][j]);
        L->type[t] = put32(im, types[t]);
        L->offset[t] = put64(im, offsets[t]);
    }
    L->data_start = (im->n + 31) / 32 * 32;
    im->n = L->data_start;
    for (size_t i = 0; i < 160; i++)
        im->p[im->n + i] = (uint8_t)(i * 3 + 1);
    im->n += 160;
    L->data_end = L->data_start + 128 + 12;
}

/* Parses a copy of p[0..n) in an exact-size heap buffer. */
static bn_status open_copy(const uint8_t *p, size_t n, bn_gguf **g, bn_error *e)
{
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, p, n);
    bn_status st = bn_gguf_open_memory(copy, n, "test.gguf", g, e);
    if (st == BN_OK) {
        /* Touch every tensor byte: must all lie inside the buffer. */
        unsigned sum = 0;
        for (uint64_t i = 0; i < bn_gguf_tensor_count(*g); i++) {
            const bn_gguf_tensor *t = bn_gguf_tensor_at(*g, i);
            const uint8_t *d = t->data;
            CHECK(d >= copy && t->bytes <= n && d - copy <= (ptrdiff_t)(n - t->bytes));
            for (uint64_t k = 0; k < t->bytes; k++)
                sum += d[k];
        }
        for (uint64_t i = 0; i < bn_gguf_kv_count(*g); i++) {
            const bn_gguf_kv *kv = bn_gguf_kv_at(*g, i);
            bn_gguf_str s;
            for (uint64_t k = 0; kv->type == BN_GGUF_ARRAY && kv->elem_type == BN_GGUF_STRING &&
                                 k < kv->count;
                 k++)
                if (bn_gguf_array_str(kv, k, &s, e) == BN_OK && s.len)
                    sum += (unsigned char)s.ptr[s.len - 1];
        }
        (void)sum;
        bn_gguf_close(*g);
        *g = NULL;
    }
    free(copy);
    return st;
}

/* One malformed image: expected status and words the message must hold. */
static void expect(const uint8_t *p, size_t n, bn_status want, const char *what,
                   const char *needle1, const char *needle2)
{
    bn_gguf *g = NULL;
    bn_error e;
    bn_error_clear(&e);
    const bn_status st = open_copy(p, n, &g, &e);
    CHECK_MSG(st == want, "%s: status %s, want %s (%s)", what, bn_status_str(st),
              bn_status_str(want), e.message);
    if (getenv("BN_TEST_VERBOSE"))
        printf("%-24s %-12s %s\n", what, bn_status_str(st), e.message);
    if (want == BN_OK)
        return;
    if (needle1)
        CHECK_MSG(strstr(e.message, needle1) != NULL, "%s: '%s' lacks '%s'", what, e.message,
                  needle1);
    if (needle2)
        CHECK_MSG(strstr(e.message, needle2) != NULL, "%s: '%s' lacks '%s'", what, e.message,
                  needle2);
}

static void test_truncation(void)
{
    image base;
    layout L;
    build_base(&base, &L);
    expect(base.p, base.n, BN_OK, "base image", NULL, NULL);

    int ok = 0, failed = 0;
    for (size_t len = 0; len < base.n; len++) {
        bn_gguf *g = NULL;
        bn_error e;
        bn_error_clear(&e);
        const bn_status st = open_copy(base.p, len, &g, &e);
        /* Only the last tensor's trailing padding may go. */
        const bn_status want = len >= L.data_end ? BN_OK : BN_ERR_FORMAT;
        if (st == want && (st == BN_OK || strstr(e.message, "byte")))
            ok++;
        else if (failed++ < 5)
            CHECK_MSG(false, "truncated to %zu of %zu: %s, want %s (%s)", len, base.n,
                      bn_status_str(st), bn_status_str(want), e.message);
    }
    CHECK_MSG(failed == 0, "%d of %zu truncations wrong", failed, base.n);
    printf("truncation: %d lengths checked\n", ok);

    /* The same through real files for a sample, and an empty file. */
    char path[512];
    tmp_path(path, sizeof path, "trunc.gguf");
    for (size_t len = 0; len < base.n; len += 37) {
        bn_gguf *g = NULL;
        bn_error e;
        CHECK(write_file(path, base.p, len));
        const bn_status st = bn_gguf_open(path, &g, &e);
        CHECK_MSG(st == (len >= L.data_end ? BN_OK : BN_ERR_FORMAT), "file of %zu bytes: %s", len,
                  e.message);
        if (len == 0)
            CHECK_STR_CONTAINS(e.message, "empty");
        bn_gguf_close(g);
    }
    /* Extra bytes after the data are allowed. */
    image longer = base;
    memset(longer.p + longer.n, 0xEE, 100);
    expect(longer.p, longer.n + 100, BN_OK, "trailing bytes", NULL, NULL);
    remove(path);
}

static void test_header_fields(void)
{
    image b;
    layout L;
    build_base(&b, &L);
    image m;

#define MUTATE(stmt, want, label, n1, n2)                                                      \
    do {                                                                                       \
        m = b;                                                                                 \
        stmt;                                                                                  \
        expect(m.p, m.n, want, label, n1, n2);                                                 \
    } while (0)

    MUTATE(m.p[0] = 'X', BN_ERR_FORMAT, "magic", "magic", "byte offset 0");
    MUTATE(patch32(m.p, L.version, 0), BN_ERR_FORMAT, "version 0", "version 0", "byte offset 4");
    MUTATE(patch32(m.p, L.version, 1), BN_ERR_UNSUPPORTED, "version 1", "version 1",
           "byte offset 4");
    MUTATE(patch32(m.p, L.version, 4), BN_ERR_UNSUPPORTED, "version 4", "version 4",
           "byte offset 4");
    MUTATE(patch32(m.p, L.version, 0x03000000), BN_ERR_UNSUPPORTED, "big-endian", "big-endian",
           "byte offset 4");
    MUTATE(patch32(m.p, L.version, 2), BN_OK, "version 2", NULL, NULL);

    /* Counts: impossible ones fail before any allocation; plausible but
     * wrong ones fail where the data runs out or stops making sense. */
    MUTATE(patch64(m.p, L.n_tensors, UINT64_C(1) << 62), BN_ERR_FORMAT, "n_tensors huge",
           "tensor count", "byte offset 8");
    MUTATE(patch64(m.p, L.n_tensors, UINT64_MAX), BN_ERR_FORMAT, "n_tensors max", "tensor count",
           NULL);
    MUTATE(patch64(m.p, L.n_kv, UINT64_C(1) << 62), BN_ERR_FORMAT, "n_kv huge", "key/value count",
           "byte offset 16");
    MUTATE(patch64(m.p, L.n_kv, 7), BN_ERR_FORMAT, "n_kv + 1", NULL, "byte offset");
    MUTATE(patch64(m.p, L.n_tensors, 4), BN_ERR_FORMAT, "n_tensors + 1", "tensor", "byte offset");
    /* One tensor fewer: the last info becomes part of the data section,
     * which nothing can tell from a valid file. */
    MUTATE(patch64(m.p, L.n_tensors, 2), BN_OK, "n_tensors - 1", NULL, NULL);
    MUTATE(patch64(m.p, L.n_kv, 0), BN_ERR_FORMAT, "n_kv 0", NULL, "byte offset");

    /* String lengths. */
    MUTATE(patch64(m.p, L.kaa_key, UINT64_MAX), BN_ERR_FORMAT, "key length max",
           "key length 18446744073709551615", "byte offset");
    MUTATE(patch64(m.p, L.kaa_key, 1u << 20), BN_ERR_FORMAT, "key length big", "key length",
           "bytes left");
    MUTATE(patch64(m.p, L.kaa_key, 0), BN_ERR_FORMAT, "empty key", "empty key", "byte offset");
    MUTATE(patch64(m.p, L.strs_elem1_len, UINT64_C(1) << 63), BN_ERR_FORMAT, "string elem length",
           "key 'k.strs'", "element 1");
    MUTATE(patch64(m.p, L.name_len[1], UINT64_MAX - 3), BN_ERR_FORMAT, "name length max",
           "tensor #1", "name length");
    MUTATE(patch64(m.p, L.name_len[1], 64), BN_ERR_FORMAT, "name length 64", "tensor #1",
           "too long");

    /* Value and element types. */
    MUTATE(patch32(m.p, L.align_type, 13), BN_ERR_FORMAT, "value type 13",
           "key 'general.alignment'", "value type 13");
    MUTATE(patch32(m.p, L.align_type, UINT32_MAX), BN_ERR_FORMAT, "value type -1",
           "key 'general.alignment'", "-1");
    MUTATE(patch32(m.p, L.ints_elem_type, BN_GGUF_ARRAY), BN_ERR_FORMAT, "nested array",
           "key 'k.ints'", "nested");
    MUTATE(patch32(m.p, L.ints_elem_type, 77), BN_ERR_FORMAT, "element type 77", "key 'k.ints'",
           "element type 77");
    MUTATE(patch32(m.p, L.ints_elem_type, BN_GGUF_INT64), BN_ERR_FORMAT, "int array retyped",
           NULL, "byte offset"); /* now 24 bytes of elements: misparses later */
    MUTATE(patch64(m.p, L.ints_count, UINT64_MAX / 2), BN_ERR_FORMAT, "array count huge",
           "key 'k.ints'", "cannot fit");
    MUTATE(patch64(m.p, L.strs_count, UINT64_C(1) << 40), BN_ERR_FORMAT, "string array count",
           "key 'k.strs'", "cannot fit");
    MUTATE(m.p[L.kab_value] = 2, BN_ERR_FORMAT, "bool 2", "key 'k.ab'", "neither 0 nor 1");

    /* Duplicates. */
    MUTATE(m.p[L.kab_key + 8 + 3] = 'a', BN_ERR_FORMAT, "duplicate key", "key 'k.aa'",
           "duplicate");
    MUTATE(m.p[L.name_len[1] + 8 + 1] = '0', BN_ERR_FORMAT, "duplicate tensor", "tensor 't0'",
           "duplicate");

    /* Alignment. */
    MUTATE(patch32(m.p, L.align_value, 0), BN_ERR_FORMAT, "alignment 0", "general.alignment",
           "power of two");
    MUTATE(patch32(m.p, L.align_value, 3), BN_ERR_FORMAT, "alignment 3", "general.alignment",
           "is 3");
    MUTATE(patch32(m.p, L.align_type, BN_GGUF_INT32), BN_ERR_FORMAT, "alignment int32",
           "general.alignment", "uint32");
    MUTATE(patch32(m.p, L.align_value, 64), BN_ERR_FORMAT, "alignment 64", "tensor 't1'",
           "multiple of the alignment");
    MUTATE(patch32(m.p, L.align_value, 16), BN_OK, "alignment 16", NULL, NULL);

    /* Tensor infos. */
    MUTATE(patch32(m.p, L.n_dims[0], 5), BN_ERR_FORMAT, "n_dims 5", "tensor 't0'", "n_dims 5");
    MUTATE(patch32(m.p, L.n_dims[0], UINT32_MAX), BN_ERR_FORMAT, "n_dims max", "tensor 't0'",
           "n_dims");
    MUTATE(patch64(m.p, L.ne[0], (uint64_t)-8), BN_ERR_FORMAT, "ne negative", "tensor 't0'",
           "ne[0] = -8");
    MUTATE((patch64(m.p, L.ne[1], UINT64_C(1) << 40), patch64(m.p, L.ne[1] + 8, UINT64_C(1) << 40)),
           BN_ERR_FORMAT, "ne overflow", "tensor 't1'", "2^63");
    /* An empty tensor whose other dimensions multiply past 2^63. */
    MUTATE((patch64(m.p, L.ne[1], 0), patch64(m.p, L.ne[1] + 8, UINT64_C(1) << 62),
            patch32(m.p, L.n_dims[1], 2)),
           BN_OK, "empty, huge rows", NULL, NULL);
    MUTATE((patch64(m.p, L.ne[1], 0), patch64(m.p, L.ne[1] + 8, INT64_MAX)), BN_OK,
           "empty, rows max", NULL, NULL);
    MUTATE(patch64(m.p, L.ne[1] + 8, INT64_MAX), BN_ERR_FORMAT, "rows max", "tensor 't1'",
           "2^63");
    MUTATE(patch64(m.p, L.ne[1], 33), BN_ERR_FORMAT, "q8_0 row of 33", "tensor 't1'", "32");
    MUTATE(patch64(m.p, L.ne[0], 9), BN_ERR_FORMAT, "t0 grows into t1", "tensor 't0'",
           "overlaps tensor 't1'");
    MUTATE(patch64(m.p, L.ne[2], 1000), BN_ERR_FORMAT, "t2 past the end", "tensor 't2'",
           "extends past the end of the file");
    MUTATE(patch32(m.p, L.type[1], 1000), BN_ERR_FORMAT, "type 1000", "tensor 't1'", "type 1000");
    MUTATE(patch32(m.p, L.type[1], UINT32_MAX), BN_ERR_FORMAT, "type -1", "tensor 't1'", "-1");
    MUTATE(patch64(m.p, L.offset[1], 36), BN_ERR_FORMAT, "misaligned offset", "tensor 't1'",
           "multiple of the alignment");
    MUTATE(patch64(m.p, L.offset[1], 0), BN_ERR_FORMAT, "overlap at 0", "tensor 't0'",
           "overlaps tensor 't1'");
    MUTATE(patch64(m.p, L.offset[2], 96), BN_ERR_FORMAT, "overlap tail", "tensor 't1'",
           "overlaps tensor 't2'");
    MUTATE(patch64(m.p, L.offset[2], UINT64_MAX - 31), BN_ERR_FORMAT, "offset huge",
           "tensor 't2'", "past the end");
    MUTATE(patch64(m.p, L.offset[2], 160), BN_ERR_FORMAT, "offset at end", "tensor 't2'",
           "extends past the end");

    /* Tensors in any order, with gaps, are fine; so is an unknown type,
     * sized to the next tensor or the end of the file. */
    MUTATE((patch64(m.p, L.offset[0], 128), patch64(m.p, L.offset[2], 0)), BN_OK, "swapped",
           NULL, NULL);
    MUTATE(patch32(m.p, L.type[2], 2 /* Q4_0 */), BN_OK, "unknown last", NULL, NULL);
    {
        m = b;
        patch32(m.p, L.type[0], 3 /* Q4_1 */);
        bn_gguf *g = NULL;
        bn_error e;
        CHECK(bn_gguf_open_memory(m.p, m.n, "unknown", &g, &e) == BN_OK);
        const bn_gguf_tensor *t0 = bn_gguf_tensor_by_name(g, "t0");
        CHECK(t0 && !t0->type_known && t0->bytes == 32);
        bn_gguf_close(g);
        patch32(m.p, L.type[2], 3);
        CHECK(bn_gguf_open_memory(m.p, m.n, "unknown", &g, &e) == BN_OK);
        const bn_gguf_tensor *t2 = bn_gguf_tensor_by_name(g, "t2");
        CHECK(t2 && !t2->type_known && t2->bytes == 32); /* to the end of the file */
        bn_gguf_close(g);
    }
    /* n_dims 0 (a scalar) is accepted, as ggml does: ne all 1. */
    {
        image s;
        memset(&s, 0, sizeof s);
        put(&s, "GGUF", 4);
        put32(&s, 3);
        put64(&s, 1);
        put64(&s, 0);
        put_gstr(&s, "scalar");
        put32(&s, 0);
        put32(&s, BN_QTYPE_F32);
        put64(&s, 0);
        s.n = (s.n + 31) / 32 * 32 + 4;
        bn_gguf *g = NULL;
        bn_error e;
        CHECK(bn_gguf_open_memory(s.p, s.n, "scalar", &g, &e) == BN_OK);
        const bn_gguf_tensor *t = g ? bn_gguf_tensor_at(g, 0) : NULL;
        CHECK(t && t->n_dims == 0 && t->ne[0] == 1 && t->ne[3] == 1 && t->bytes == 4);
        bn_gguf_close(g);
    }
    /* Empty 4-D tensors: the non-zero dimensions must still multiply to
     * less than 2^63 (rows = ne[1] * ne[2] * ne[3] must not overflow). */
    for (int big = 0; big < 2; big++) {
        image s;
        memset(&s, 0, sizeof s);
        put(&s, "GGUF", 4);
        put32(&s, 3);
        put64(&s, 1);
        put64(&s, 0);
        put_gstr(&s, "empty4d");
        put32(&s, 4);
        put64(&s, 0);
        for (int j = 0; j < 3; j++)
            put64(&s, big ? UINT64_C(1) << 31 : UINT64_C(1) << 20);
        put32(&s, BN_QTYPE_F32);
        put64(&s, 0);
        s.n = (s.n + 31) / 32 * 32;
        if (big)
            expect(s.p, s.n, BN_ERR_FORMAT, "empty 4-D, 2^93", "tensor 'empty4d'", "2^63");
        else
            expect(s.p, s.n, BN_OK, "empty 4-D, 2^60", NULL, NULL);
    }
    /* No tensors and no padding at the end: fine. */
    {
        image s;
        memset(&s, 0, sizeof s);
        put(&s, "GGUF", 4);
        put32(&s, 3);
        put64(&s, 0);
        put64(&s, 1);
        put_gstr(&s, "k");
        put32(&s, BN_GGUF_UINT32);
        put32(&s, 9);
        expect(s.p, s.n, BN_OK, "no tensors", NULL, NULL);
        expect(s.p, s.n - 1, BN_ERR_FORMAT, "no tensors, truncated", "key 'k'", "value");
    }
    /* A tensor name with a NUL inside. */
    MUTATE(m.p[L.name_len[1] + 8 + 1] = '\0', BN_ERR_FORMAT, "NUL in name", "tensor #1", "NUL");
#undef MUTATE
}

static void test_open_errors(void)
{
    bn_gguf *g = (bn_gguf *)1;
    bn_error e;
    char path[512];
    tmp_path(path, sizeof path, "does-not-exist.gguf");
    CHECK(bn_gguf_open(path, &g, &e) == BN_ERR_IO && g == NULL);
    CHECK_STR_CONTAINS(e.message, "does-not-exist.gguf");
    CHECK(bn_gguf_open(tmp_dir, &g, &e) == BN_ERR_IO);
    CHECK_STR_CONTAINS(e.message, "not a regular file");
    tmp_path(path, sizeof path, "empty.gguf");
    CHECK(write_file(path, "", 0));
    CHECK(bn_gguf_open(path, &g, &e) == BN_ERR_FORMAT);
    CHECK_STR_CONTAINS(e.message, "empty");
    remove(path);
    CHECK(bn_gguf_open(NULL, &g, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_gguf_find(NULL, "x") == NULL && bn_gguf_tensor_count(NULL) == 0);
    bn_gguf_close(NULL);
    bn_gguf_writer_free(NULL);
    CHECK(strcmp(bn_gguf_type_name(BN_GGUF_FLOAT64), "float64") == 0);
    CHECK(strcmp(bn_gguf_type_name((bn_gguf_type)99), "unknown") == 0);
}

/* Random corruption of the base image: any result but a crash or a read
 * outside the buffer (open_copy checks what an accepted file claims). */
static void test_random_corruption(void)
{
    image b;
    layout L;
    build_base(&b, &L);
    int accepted = 0;
    const int rounds = 20000;
    for (int r = 0; r < rounds; r++) {
        image m = b;
        const int flips = 1 + (int)(test_rand_u64() % 4);
        for (int f = 0; f < flips; f++) {
            /* Mostly the metadata, where the structure is. */
            const size_t at = (size_t)(test_rand_u64() % (L.data_start + 8));
            const uint64_t kind = test_rand_u64() % 4;
            if (kind == 0)
                m.p[at] ^= (uint8_t)(1u << (test_rand_u64() % 8));
            else if (kind == 1)
                m.p[at] = (uint8_t)test_rand_u64();
            else if (kind == 2)
                m.p[at] = 0xFF;
            else
                m.p[at] = 0;
        }
        size_t n = m.n;
        if (test_rand_u64() % 8 == 0)
            n = (size_t)(test_rand_u64() % (m.n + 1));
        bn_gguf *g = NULL;
        bn_error e;
        bn_error_clear(&e);
        const bn_status st = open_copy(m.p, n, &g, &e);
        if (st == BN_OK)
            accepted++;
        else
            CHECK_MSG(e.message[0] != '\0' && (st == BN_ERR_FORMAT || st == BN_ERR_UNSUPPORTED),
                      "corruption round %d: %s '%s'", r, bn_status_str(st), e.message);
    }
    printf("random corruption: %d rounds, %d still valid\n", rounds, accepted);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_gguf DATA_DIR\n");
        return 2;
    }
    test_seed_init();
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/test_gguf.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "mkdtemp %s: %s\n", tmp_dir, strerror(errno));
        return 1;
    }

    test_round_trip(32);
    test_round_trip(64);
    test_many_tensors();
    test_writer_errors();
    test_fixtures(argv[1]);
    test_open_errors();
    test_truncation();
    test_header_fields();
    test_random_corruption();

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp_dir);
    TEST_EXIT();
}
