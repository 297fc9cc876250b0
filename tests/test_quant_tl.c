/*
 * test_quant_tl.c - bitnet.cpp's TL1 / TL2 weight encodings (fmt_tl.c).
 *
 *   - round trips (random codes -> pack -> unpack) on every shape class:
 *     the BitNet-b1.58-2B-4T shapes at full size, shapes with a bitnet.cpp
 *     kernel config, and small explicit tilings (TL1 bm 32/64, BM not a
 *     power of two, TL2 BK 96/192 with 0/32/64-column tails);
 *   - agreement with tests/data/tl_vectors.bin, made by
 *     scripts/gen_tl_vectors.py (a numpy re-implementation of bitnet.cpp's
 *     converter): pack must give the same bytes, unpack the same codes;
 *   - errors: truncated data, unsupported shapes and tilings, corrupt
 *     indices, bad codes, kernel_config.ini parsing.
 *
 * Usage: test_quant_tl <dir holding tl_vectors.bin>. Random data is fresh
 * each run; the seed is printed and TEST_SEED=<n> repeats a run.
 */
#include "fmt_tl.h"
#include "qtype.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

#define POISON 0xA5
#define GUARD 64 /* poisoned bytes after every output, to catch overruns */

/* ---- random codes ------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t next_random(void)
{
    /* xorshift64*: good enough to fill tensors, and seedable */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * UINT64_C(2685821657736338717);
}

static void random_codes(int8_t *codes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        codes[i] = (int8_t)((int)(next_random() >> 33) % 3 - 1);
}

static bool guard_intact(const void *buf, size_t used)
{
    const uint8_t *p = (const uint8_t *)buf + used;
    for (size_t i = 0; i < GUARD; i++)
        if (p[i] != POISON)
            return false;
    return true;
}

static size_t tensor_bytes(bn_qtype type, int64_t rows, int64_t cols)
{
    return type == BN_QTYPE_TL1 ? bn_tl1_tensor_bytes(rows, cols)
                                : bn_tl2_tensor_bytes(rows, cols);
}

static bn_status pack_tiled(bn_qtype type, const int8_t *codes, int64_t rows, int64_t cols,
                            const bn_tl_tiling *t, void *dst, bn_error *err)
{
    return type == BN_QTYPE_TL1 ? bn_pack_tl1_tiled(codes, rows, cols, t, dst, err)
                                : bn_pack_tl2_tiled(codes, rows, cols, t, dst, err);
}

static bn_status unpack_tiled(bn_qtype type, const void *src, size_t n, int64_t rows,
                              int64_t cols, const bn_tl_tiling *t, int8_t *codes, bn_error *err)
{
    return type == BN_QTYPE_TL1 ? bn_unpack_tl1_tiled(src, n, rows, cols, t, codes, err)
                                : bn_unpack_tl2_tiled(src, n, rows, cols, t, codes, err);
}

static const char *name_of(bn_qtype type) { return type == BN_QTYPE_TL1 ? "TL1" : "TL2"; }

/* ---- round trips -------------------------------------------------------- */

/* Random codes -> pack -> unpack, with the given tiling or (t == NULL) through
 * the registry's functions and the default tiling. */
static void round_trip(bn_qtype type, int64_t rows, int64_t cols, const bn_tl_tiling *t)
{
    const size_t n = (size_t)rows * (size_t)cols;
    const size_t bytes = tensor_bytes(type, rows, cols);
    int8_t *codes = malloc(n);
    int8_t *back = malloc(n + GUARD);
    uint8_t *packed = malloc(bytes + GUARD);
    CHECK(codes && back && packed && bytes > 0);
    if (!codes || !back || !packed || bytes == 0)
        goto done;
    random_codes(codes, n);
    memset(packed, POISON, bytes + GUARD);
    memset(back, POISON, n + GUARD);

    bn_error err;
    bn_status st;
    float scale = -7.0f;
    if (t) {
        st = pack_tiled(type, codes, rows, cols, t, packed, &err);
    } else {
        const bn_qtype_info *q = bn_qtype_get(type);
        st = q->pack(codes, 0.25f, rows, cols, packed, &err);
    }
    CHECK_MSG(st == BN_OK, "%s pack %lld x %lld: %s", name_of(type), (long long)rows,
              (long long)cols, err.message);
    CHECK_MSG(guard_intact(packed, bytes), "%s pack %lld x %lld wrote past %zu bytes",
              name_of(type), (long long)rows, (long long)cols, bytes);
    if (t) {
        st = unpack_tiled(type, packed, bytes, rows, cols, t, back, &err);
    } else {
        const bn_qtype_info *q = bn_qtype_get(type);
        st = q->unpack(packed, bytes, rows, cols, back, &scale, &err);
        CHECK_MSG(scale == 1.0f, "%s unpack returned scale %g, want 1 (scale is a separate tensor)",
                  name_of(type), (double)scale);
    }
    CHECK_MSG(st == BN_OK, "%s unpack %lld x %lld: %s", name_of(type), (long long)rows,
              (long long)cols, err.message);
    size_t first_bad = n;
    for (size_t i = 0; i < n && first_bad == n; i++)
        if (back[i] != codes[i])
            first_bad = i;
    CHECK_MSG(first_bad == n, "%s %lld x %lld (BM %d BK %d bm %d): code %zu differs (%d vs %d)",
              name_of(type), (long long)rows, (long long)cols, t ? t->block_rows : 0,
              t ? t->block_cols : 0, t ? t->compute_rows : 0, first_bad,
              first_bad < n ? back[first_bad] : 0, first_bad < n ? codes[first_bad] : 0);
    CHECK_MSG(guard_intact(back, n), "%s unpack %lld x %lld wrote past the codes", name_of(type),
              (long long)rows, (long long)cols);
done:
    free(codes);
    free(back);
    free(packed);
}

static void test_round_trips(void)
{
    /* BitNet-b1.58-2B-4T projections (N x K), full size, default tiling. */
    static const int64_t model_2b4t[][2] = {{2560, 2560}, {640, 2560}, {6912, 2560}, {2560, 6912}};
    for (size_t i = 0; i < 4; i++) {
        round_trip(BN_QTYPE_TL1, model_2b4t[i][0], model_2b4t[i][1], NULL);
        round_trip(BN_QTYPE_TL2, model_2b4t[i][0], model_2b4t[i][1], NULL);
    }
    /* Shapes bitnet.cpp has kernel configs for (registry path uses them). */
    round_trip(BN_QTYPE_TL1, 1536, 1536, NULL); /* bm 64 */
    round_trip(BN_QTYPE_TL1, 3200, 8640, NULL); /* BM 160, BK 64 */
    round_trip(BN_QTYPE_TL2, 1536, 1536, NULL); /* BK 192 */
    round_trip(BN_QTYPE_TL2, 3200, 3200, NULL); /* 32-column tail */
    round_trip(BN_QTYPE_TL2, 1536, 4096, NULL); /* 64-column tail */

    /* Small explicit tilings: every rule of the layout, several blocks. */
    static const struct {
        bn_qtype type;
        int64_t rows, cols;
        bn_tl_tiling t;
    } small[] = {
        {BN_QTYPE_TL1, 32, 64, {32, 64, 32}},     {BN_QTYPE_TL1, 64, 128, {64, 64, 64}},
        {BN_QTYPE_TL1, 320, 192, {160, 64, 32}},  {BN_QTYPE_TL1, 128, 256, {64, 128, 32}},
        {BN_QTYPE_TL1, 192, 96, {192, 32, 64}},   {BN_QTYPE_TL2, 32, 288, {32, 96, 32}},
        {BN_QTYPE_TL2, 64, 352, {32, 96, 32}},    {BN_QTYPE_TL2, 96, 320, {96, 96, 32}},
        {BN_QTYPE_TL2, 32, 384, {32, 192, 32}},   {BN_QTYPE_TL2, 320, 256, {160, 96, 32}},
        {BN_QTYPE_TL2, 64, 264, {32, 24, 32}},    {BN_QTYPE_TL2, 64, 512, {64, 240, 32}},
    };
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        round_trip(small[i].type, small[i].rows, small[i].cols, &small[i].t);
}

/* ---- sizes and default tilings ------------------------------------------ */

static void expect_tiling(bn_qtype type, int64_t rows, int64_t cols, int BM, int BK, int bm)
{
    bn_tl_tiling t = {-1, -1, -1};
    bn_error err;
    bn_status st = bn_tl_tiling_for_shape(type, rows, cols, &t, &err);
    CHECK_MSG(st == BN_OK && t.block_rows == BM && t.block_cols == BK && t.compute_rows == bm,
              "%s %lld x %lld: tiling %d/%d/%d (%s), want %d/%d/%d", name_of(type),
              (long long)rows, (long long)cols, t.block_rows, t.block_cols, t.compute_rows,
              st == BN_OK ? "ok" : err.message, BM, BK, bm);
}

static void test_sizes_and_tilings(void)
{
    /* TL2 sizes: the converter's np.pad target, computed with Python. */
    CHECK(bn_tl2_tensor_bytes(640, 2560) == 348160);
    CHECK(bn_tl2_tensor_bytes(2560, 6912) == 3713706);
    CHECK(bn_tl2_tensor_bytes(1536, 1536) == 507904);
    CHECK(bn_tl2_tensor_bytes(3200, 3200) == 2167466);
    CHECK(bn_tl2_tensor_bytes(32, 255) == 0);
    CHECK(bn_tl1_tensor_bytes(6912, 2560) == (size_t)6912 * 2560 / 4);

    size_t bytes = 0;
    bn_error err;
    CHECK(bn_qtype_tensor_size(BN_QTYPE_TL1, 2560, 6912, &bytes, &err) == BN_OK &&
          bytes == (size_t)2560 * 6912 / 4);
    CHECK(bn_qtype_tensor_size(BN_QTYPE_TL2, 640, 2560, &bytes, &err) == BN_OK &&
          bytes == 348160);

    /* 2B-4T: bitnet.cpp ships no config; our documented rule. */
    expect_tiling(BN_QTYPE_TL1, 2560, 2560, 256, 128, 32);
    expect_tiling(BN_QTYPE_TL1, 640, 2560, 128, 128, 32);
    expect_tiling(BN_QTYPE_TL1, 6912, 2560, 256, 128, 32);
    expect_tiling(BN_QTYPE_TL1, 2560, 6912, 256, 128, 32);
    expect_tiling(BN_QTYPE_TL2, 2560, 2560, 256, 96, 32);
    expect_tiling(BN_QTYPE_TL2, 640, 2560, 128, 96, 32);
    expect_tiling(BN_QTYPE_TL2, 6912, 2560, 256, 96, 32);
    expect_tiling(BN_QTYPE_TL2, 2560, 6912, 256, 96, 32);
    /* bitnet.cpp's setup_env.py settings win over the rule. */
    expect_tiling(BN_QTYPE_TL1, 1536, 4096, 256, 128, 32);
    expect_tiling(BN_QTYPE_TL1, 1536, 1536, 128, 64, 64);
    expect_tiling(BN_QTYPE_TL1, 4096, 14336, 128, 64, 64);
    expect_tiling(BN_QTYPE_TL1, 3200, 8640, 160, 64, 32);
    expect_tiling(BN_QTYPE_TL1, 3200, 3200, 320, 128, 64);
    expect_tiling(BN_QTYPE_TL1, 8640, 3200, 320, 64, 32);
    expect_tiling(BN_QTYPE_TL2, 1536, 1536, 128, 192, 32);
    expect_tiling(BN_QTYPE_TL2, 4096, 14336, 128, 96, 32);
    expect_tiling(BN_QTYPE_TL2, 3200, 8640, 160, 96, 32);
    expect_tiling(BN_QTYPE_TL2, 8640, 3200, 320, 96, 32);
    /* Small shapes fall back to smaller blocks. */
    expect_tiling(BN_QTYPE_TL1, 96, 192, 32, 64, 32);
    expect_tiling(BN_QTYPE_TL2, 32, 256, 32, 96, 32);
}

/* ---- vectors from scripts/gen_tl_vectors.py ----------------------------- */

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static uint8_t *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint8_t *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n)) != NULL &&
            fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
        *size = n > 0 ? (size_t)n : 0;
    }
    fclose(f);
    return buf;
}

static void check_vector_case(bn_qtype type, int64_t rows, int64_t cols, const bn_tl_tiling *t,
                              const int8_t *codes, const uint8_t *expect, size_t nbytes)
{
    const size_t n = (size_t)rows * (size_t)cols;
    bn_error err;
    CHECK_MSG(nbytes == tensor_bytes(type, rows, cols), "%s %lld x %lld: vector has %zu bytes",
              name_of(type), (long long)rows, (long long)cols, nbytes);
    uint8_t *packed = malloc(nbytes + GUARD);
    int8_t *back = malloc(n + GUARD);
    CHECK(packed && back);
    if (packed && back) {
        memset(packed, POISON, nbytes + GUARD);
        bn_status st = pack_tiled(type, codes, rows, cols, t, packed, &err);
        CHECK_MSG(st == BN_OK, "%s vector pack: %s", name_of(type), err.message);
        size_t bad = nbytes;
        for (size_t i = 0; i < nbytes && bad == nbytes; i++)
            if (packed[i] != expect[i])
                bad = i;
        CHECK_MSG(bad == nbytes,
                  "%s %lld x %lld (BM %d BK %d bm %d): packed byte %zu is 0x%02x, converter "
                  "wrote 0x%02x",
                  name_of(type), (long long)rows, (long long)cols, t->block_rows, t->block_cols,
                  t->compute_rows, bad, bad < nbytes ? packed[bad] : 0,
                  bad < nbytes ? expect[bad] : 0);
        CHECK(guard_intact(packed, nbytes));

        memset(back, POISON, n + GUARD);
        st = unpack_tiled(type, expect, nbytes, rows, cols, t, back, &err);
        CHECK_MSG(st == BN_OK && memcmp(back, codes, n) == 0,
                  "%s %lld x %lld: unpacking the converter's bytes does not give its codes (%s)",
                  name_of(type), (long long)rows, (long long)cols, st == BN_OK ? "" : err.message);
        CHECK(guard_intact(back, n));

        /* When the vector's tiling is our default, the registry path agrees. */
        bn_tl_tiling def;
        if (bn_tl_tiling_for_shape(type, rows, cols, &def, NULL) == BN_OK &&
            def.block_rows == t->block_rows && def.block_cols == t->block_cols &&
            def.compute_rows == t->compute_rows) {
            const bn_qtype_info *q = bn_qtype_get(type);
            float scale = 0.0f;
            memset(back, POISON, n + GUARD);
            st = q->unpack(expect, nbytes, rows, cols, back, &scale, &err);
            CHECK(st == BN_OK && scale == 1.0f && memcmp(back, codes, n) == 0);
            memset(packed, POISON, nbytes + GUARD);
            st = q->pack(codes, 1.0f, rows, cols, packed, &err);
            CHECK(st == BN_OK && memcmp(packed, expect, nbytes) == 0);
        }
    }
    free(packed);
    free(back);
}

static void test_vectors(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tl_vectors.bin", dir);
    size_t size = 0;
    uint8_t *file = read_file(path, &size);
    CHECK_MSG(file != NULL, "cannot read %s (regenerate: python3 scripts/gen_tl_vectors.py)",
              path);
    if (!file)
        return;
    CHECK_MSG(size >= 12 && memcmp(file, "BNTLVEC1", 8) == 0, "%s: bad magic", path);
    const uint32_t count = size >= 12 ? get_u32(file + 8) : 0;
    size_t off = 12;
    int n_tl1 = 0, n_tl2 = 0, n_ragged = 0;
    for (uint32_t c = 0; c < count; c++) {
        if (off + 32 > size)
            break;
        const bn_qtype type = (bn_qtype)get_u32(file + off);
        const int64_t rows = get_u32(file + off + 4), cols = get_u32(file + off + 8);
        const bn_tl_tiling t = {(int)get_u32(file + off + 12), (int)get_u32(file + off + 16),
                                (int)get_u32(file + off + 20)};
        const uint64_t nbytes = get_u64(file + off + 24);
        off += 32;
        const size_t n = (size_t)rows * (size_t)cols;
        if ((type != BN_QTYPE_TL1 && type != BN_QTYPE_TL2) || n % 4 != 0 ||
            off + n / 4 + nbytes > size) {
            CHECK_MSG(false, "%s: case %u is malformed", path, c);
            break;
        }
        int8_t *codes = malloc(n);
        CHECK(codes != NULL);
        if (!codes)
            break;
        for (size_t i = 0; i < n; i++) /* four 2-bit codes per byte, value + 1 */
            codes[i] = (int8_t)(((file[off + i / 4] >> (2 * (i % 4))) & 3) - 1);
        off += n / 4;
        check_vector_case(type, rows, cols, &t, codes, file + off, (size_t)nbytes);
        off += nbytes;
        free(codes);
        n_tl1 += type == BN_QTYPE_TL1;
        n_tl2 += type == BN_QTYPE_TL2;
        n_ragged += type == BN_QTYPE_TL2 && cols % t.block_cols != 0;
    }
    CHECK_MSG(off == size, "%s: %zu trailing bytes", path, size - off);
    CHECK_MSG(n_tl1 >= 3 && n_tl2 >= 3 && n_ragged >= 2,
              "%s has %d TL1, %d TL2 (%d with a tail) cases", path, n_tl1, n_tl2, n_ragged);
    fprintf(stderr, "vectors: %d TL1, %d TL2 cases (%d with a two-weight tail)\n", n_tl1, n_tl2,
            n_ragged);
    free(file);
}

/* ---- errors ------------------------------------------------------------- */

static void expect_error(bn_status got, bn_status want, const bn_error *err, const char *needle,
                         const char *what)
{
    CHECK_MSG(got == want, "%s: status %s, want %s (%s)", what, bn_status_str(got),
              bn_status_str(want), err->message);
    if (needle)
        CHECK_MSG(strstr(err->message, needle) != NULL, "%s: message '%s' lacks '%s'", what,
                  err->message, needle);
}

static void test_errors(void)
{
    bn_error err;
    int8_t codes[64 * 384];
    uint8_t buf[64 * 384];
    bn_tl_tiling t;

    /* Truncated data names both byte counts. */
    random_codes(codes, 32 * 128);
    CHECK(bn_pack_tl1(codes, 1.0f, 32, 128, buf, &err) == BN_OK);
    memset(codes, POISON, sizeof codes);
    float scale;
    expect_error(bn_unpack_tl1(buf, 1023, 32, 128, codes, &scale, &err), BN_ERR_FORMAT,
                 &err, "needs 1024 bytes, have 1023", "TL1 truncated");
    random_codes(codes, 32 * 352);
    CHECK(bn_pack_tl2(codes, 1.0f, 32, 352, buf, &err) == BN_OK);
    expect_error(bn_unpack_tl2(buf, bn_tl2_tensor_bytes(32, 352) - 1, 32, 352, codes, &scale, &err),
                 BN_ERR_FORMAT, &err, "have 2687", "TL2 truncated");

    /* Shapes no tiling can describe name the shape and the rule. */
    expect_error(bn_tl_tiling_for_shape(BN_QTYPE_TL1, 100, 128, &t, &err), BN_ERR_UNSUPPORTED,
                 &err, "100 x 128", "TL1 rows not a multiple of 32");
    expect_error(bn_tl_tiling_for_shape(BN_QTYPE_TL1, 64, 100, &t, &err), BN_ERR_UNSUPPORTED,
                 &err, "64 x 100", "TL1 columns not a multiple of 64");
    expect_error(bn_tl_tiling_for_shape(BN_QTYPE_TL2, 64, 128, &t, &err), BN_ERR_UNSUPPORTED,
                 &err, "at least 256 columns", "TL2 narrow");
    expect_error(bn_tl_tiling_for_shape(BN_QTYPE_TL2, 64, 2576, &t, &err), BN_ERR_UNSUPPORTED,
                 &err, "64 x 2576", "TL2 tail not a multiple of 32");
    expect_error(bn_qtype_tensor_size(BN_QTYPE_TL1, 100, 128, &(size_t){0}, &err),
                 BN_ERR_UNSUPPORTED, &err, "100 x 128", "registry size of a bad TL1 shape");
    CHECK(!bn_tl2_shape_ok(64, 2576, &err) && err.status == BN_ERR_UNSUPPORTED);
    expect_error(bn_unpack_tl1(buf, sizeof buf, 100, 128, codes, &scale, &err),
                 BN_ERR_UNSUPPORTED, &err, "100 x 128", "TL1 unpack of a bad shape");
    expect_error(bn_tl_tiling_for_shape(BN_QTYPE_TL1, 0, 128, &t, &err),
                 BN_ERR_INVALID_ARGUMENT, &err, "empty", "empty shape");
    expect_error(bn_tl_tiling_for_shape(BN_QTYPE_I2_S, 64, 128, &t, &err),
                 BN_ERR_INVALID_ARGUMENT, &err, "not TL1", "wrong type");

    /* Explicit tilings the converter cannot use. */
    static const struct {
        bn_qtype type;
        int64_t rows, cols;
        bn_tl_tiling t;
        bn_status want;
        const char *needle;
    } bad[] = {
        {BN_QTYPE_TL1, 64, 128, {64, 64, 48}, BN_ERR_INVALID_ARGUMENT, "32 or 64"},
        {BN_QTYPE_TL1, 64, 128, {64, 36, 32}, BN_ERR_INVALID_ARGUMENT, "8-column compute tile"},
        {BN_QTYPE_TL1, 96, 128, {64, 64, 32}, BN_ERR_INVALID_ARGUMENT, "multiple of BM=64"},
        {BN_QTYPE_TL1, 64, 96, {64, 64, 32}, BN_ERR_INVALID_ARGUMENT, "multiple of BK=64"},
        {BN_QTYPE_TL1, 96, 128, {48, 64, 32}, BN_ERR_INVALID_ARGUMENT, "BM=48"},
        {BN_QTYPE_TL2, 64, 288, {64, 96, 64}, BN_ERR_INVALID_ARGUMENT, "must be 32"},
        {BN_QTYPE_TL2, 64, 300, {64, 100, 32}, BN_ERR_INVALID_ARGUMENT, "multiple of 24"},
        {BN_QTYPE_TL2, 64, 304, {64, 96, 32}, BN_ERR_INVALID_ARGUMENT, "leaves 16"},
        {BN_QTYPE_TL2, 64, 768, {64, 480, 32}, BN_ERR_UNSUPPORTED, "288-column tail"},
        {BN_QTYPE_TL2, 64, 288, {0, 96, 32}, BN_ERR_INVALID_ARGUMENT, "positive"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "bad tiling %zu", i);
        expect_error(bn_tl_tiling_check(bad[i].type, bad[i].rows, bad[i].cols, &bad[i].t, &err),
                     bad[i].want, &err, bad[i].needle, what);
        expect_error(unpack_tiled(bad[i].type, buf, sizeof buf, bad[i].rows, bad[i].cols,
                                  &bad[i].t, codes, &err),
                     bad[i].want, &err, bad[i].needle, what);
    }

    /* Corrupt indices are format errors, not silent garbage. */
    const bn_tl_tiling tl1_t = {32, 128, 32};
    memset(buf, 0x44, 1024); /* all-zero weights */
    buf[100] = 0x49;
    expect_error(bn_unpack_tl1_tiled(buf, 1024, 32, 128, &tl1_t, codes, &err), BN_ERR_FORMAT,
                 &err, "pair index 9 at byte 100", "TL1 index 9");
    const bn_tl_tiling tl2_t = {32, 96, 32};
    const size_t tl2_bytes = bn_tl2_tensor_bytes(32, 352);
    memset(codes, 0, 32 * 352);
    CHECK(bn_pack_tl2_tiled(codes, 32, 352, &tl2_t, buf, &err) == BN_OK);
    buf[5] = 0xE0;
    expect_error(bn_unpack_tl2_tiled(buf, tl2_bytes, 32, 352, &tl2_t, codes, &err), BN_ERR_FORMAT,
                 &err, "triple magnitude 14 at byte 5", "TL2 magnitude 14");
    buf[5] = 0x00;
    const size_t tail_offset = 32 * 288 / 6 + 32 * 288 / 24;
    buf[tail_offset + 3] = 0x4F;
    expect_error(bn_unpack_tl2_tiled(buf, tl2_bytes, 32, 352, &tl2_t, codes, &err), BN_ERR_FORMAT,
                 &err, "tail pair index 15", "TL2 tail index 15");
    buf[tail_offset + 3] = 0x44;
    /* A sign bit on a zero triple decodes as zero, as in bitnet.cpp's kernel. */
    memset(buf + 32 * 288 / 6, 0xFF, 32 * 288 / 24);
    memset(codes, POISON, 32 * 352);
    CHECK(bn_unpack_tl2_tiled(buf, tl2_bytes, 32, 352, &tl2_t, codes, &err) == BN_OK);
    bool all_zero = true;
    for (size_t i = 0; i < 32 * 352; i++)
        all_zero = all_zero && codes[i] == 0;
    CHECK(all_zero);

    /* Bad codes and NULL buffers. */
    memset(codes, 0, 32 * 128);
    codes[77] = 2;
    expect_error(bn_pack_tl1(codes, 1.0f, 32, 128, buf, &err), BN_ERR_INVALID_ARGUMENT, &err,
                 "row 0, column 77", "TL1 code 2");
    expect_error(bn_pack_tl2(NULL, 1.0f, 32, 256, buf, &err), BN_ERR_INVALID_ARGUMENT, &err,
                 "NULL", "TL2 pack NULL");
    expect_error(bn_unpack_tl2(NULL, 4096, 32, 256, codes, &scale, &err),
                 BN_ERR_INVALID_ARGUMENT, &err, "NULL", "TL2 unpack NULL");
    expect_error(bn_unpack_tl1_tiled(buf, 1024, 32, 128, NULL, codes, &err),
                 BN_ERR_INVALID_ARGUMENT, &err, "NULL", "NULL tiling");
}

/* ---- kernel_config.ini -------------------------------------------------- */

static void test_ini(void)
{
    /* As bitnet.cpp's codegen writes it (ConfigParser lower-cases keys). */
    static const char ini_3b_tl1[] = "[Kernels_0]\nm = 3200\nk = 8640\nbm = 160\nbk = 64\n"
                                     "bmm = 32\n\n[Kernels_1]\nm = 3200\nk = 3200\nbm = 320\n"
                                     "bk = 128\nbmm = 64\n\n[Kernels_2]\nm = 8640\nk = 3200\n"
                                     "bm = 320\nbk = 64\nbmm = 32\n\n";
    bn_error err;
    bn_tl_tiling t = {0, 0, 0};
    CHECK(bn_tl_tiling_from_ini(BN_QTYPE_TL1, ini_3b_tl1, 3200, 3200, &t, &err) == BN_OK &&
          t.block_rows == 320 && t.block_cols == 128 && t.compute_rows == 64);
    CHECK(bn_tl_tiling_from_ini(BN_QTYPE_TL1, ini_3b_tl1, 8640, 3200, &t, &err) == BN_OK &&
          t.block_rows == 320 && t.block_cols == 64 && t.compute_rows == 32);
    expect_error(bn_tl_tiling_from_ini(BN_QTYPE_TL1, ini_3b_tl1, 2560, 2560, &t, &err),
                 BN_ERR_UNSUPPORTED, &err, "m = 2560, k = 2560", "ini without the shape");

    /* A hand-written 2B-4T config: comments, CRLF, ':' and upper-case keys;
     * the first matching section wins, as in the converter. */
    static const char ini_2b[] = "# my 2B-4T kernels\r\n[Kernels_0]\r\nM: 640\r\nK = 2560\r\n"
                                 "BM = 160\r\nbk = 96\r\nbmm = 32\r\n; again\r\n[Kernels_1]\r\n"
                                 "m = 640\r\nk = 2560\r\nbm = 320\r\nbk = 96\r\nbmm = 32\r\n";
    CHECK(bn_tl_tiling_from_ini(BN_QTYPE_TL2, ini_2b, 640, 2560, &t, &err) == BN_OK &&
          t.block_rows == 160 && t.block_cols == 96 && t.compute_rows == 32);
    /* ...and that tiling round-trips through the explicit-tiling API. */
    round_trip(BN_QTYPE_TL2, 640, 2560, &t);

    expect_error(bn_tl_tiling_from_ini(BN_QTYPE_TL1, "[a]\nm = 64\nk = 128\nbm = 64\nbk = 64\n",
                                       64, 128, &t, &err),
                 BN_ERR_FORMAT, &err, "lacks", "section without bmm");
    expect_error(bn_tl_tiling_from_ini(BN_QTYPE_TL1, "[a]\nm = 64x\n", 64, 128, &t, &err),
                 BN_ERR_FORMAT, &err, "line 2", "non-numeric m");
    expect_error(bn_tl_tiling_from_ini(BN_QTYPE_TL1, "m = 64\n", 64, 128, &t, &err),
                 BN_ERR_FORMAT, &err, "line 1", "key outside a section");
    expect_error(bn_tl_tiling_from_ini(BN_QTYPE_TL1,
                                       "[a]\nm = 64\nk = 128\nbm = 64\nbk = 64\nbmm = 48\n", 64,
                                       128, &t, &err),
                 BN_ERR_INVALID_ARGUMENT, &err, "32 or 64", "ini with an unusable tiling");
}

/* ---- unpack through the registry, as the model loader does ---------------- */

static void test_registry_unpack(void)
{
    enum { ROWS = 32, COLS = 352 };
    static int8_t codes[ROWS * COLS], back[ROWS * COLS];
    static uint8_t packed[ROWS * COLS];
    bn_error err;
    random_codes(codes, ROWS * COLS);
    CHECK(bn_pack_tl2(codes, 3.0f, ROWS, COLS, packed, &err) == BN_OK);
    memset(back, POISON, sizeof back);
    float scale = 0.0f;
    CHECK(bn_qtype_get(BN_QTYPE_TL2)->unpack(packed, bn_tl2_tensor_bytes(ROWS, COLS), ROWS, COLS,
                                             back, &scale, &err) == BN_OK);
    CHECK(memcmp(back, codes, sizeof codes) == 0);
    CHECK(scale == 1.0f); /* the real one is the tensor "_scale" beside it */
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "tests/data";
    const char *seed_env = getenv("TEST_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10)
                             : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    if (seed == 0)
        seed = 1;
    rng_state = seed;
    fprintf(stderr, "test_quant_tl: seed %llu (repeat with TEST_SEED=%llu)\n",
            (unsigned long long)seed, (unsigned long long)seed);

    test_sizes_and_tilings();
    test_vectors(dir);
    test_round_trips();
    test_errors();
    test_ini();
    test_registry_unpack();
    TEST_EXIT();
}
