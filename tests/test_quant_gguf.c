/*
 * test_quant_gguf.c - our dense and TQ formats against gguf-py, bit for bit.
 *
 *   test_quant_gguf VECTORS [SEED]
 *
 * VECTORS is tests/data/quant_vectors.bin, written by
 * scripts/gen_quant_vectors.py (its docstring describes the format). For
 * every record: our quantize_row must give exactly gguf-py's bytes and our
 * dequantize_row exactly its floats (any NaN matches any NaN: the sign of
 * 0 * inf differs between CPUs). Then unit tests of the fp16/bf16
 * conversions (exhaustive over the 65536 16-bit patterns, known boundary
 * cases, random floats against a double-precision oracle) and of TQ1_0 /
 * TQ2_0 pack/unpack (random round trips and every error path).
 *
 * Random data is fresh each run from a time-based seed, printed first;
 * pass it as SEED to repeat a run. Output buffers are poisoned before every
 * call (twice, with different patterns) so unwritten elements are caught,
 * and guard bytes after them catch writes past the end.
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bitnet.h"
#include "fmt_dense.h"
#include "fmt_tq.h"
#include "fp16.h"
#include "qtype.h"
#include "test_util.h"

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rng_next(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t rng_below(uint32_t n)
{
    return (uint32_t)(rng_next() % n);
}

static float rng_unit(void) /* [0, 1) */
{
    return (float)(rng_next() >> 40) * 0x1p-24f;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static bool same_float(float a, float b)
{
    return (isnan(a) && isnan(b)) || float_bits(a) == float_bits(b);
}

static void fill_floats(float *p, size_t n, uint32_t bits)
{
    for (size_t i = 0; i < n; i++)
        memcpy(&p[i], &bits, sizeof bits);
}

enum { GUARD = 64 };
static const uint8_t GUARD_BYTE = 0xC3;

static bool guard_intact(const uint8_t *p)
{
    for (int i = 0; i < GUARD; i++)
        if (p[i] != GUARD_BYTE)
            return false;
    return true;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

static uint32_t read_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static void read_floats(const uint8_t *p, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const uint32_t bits = read_u32(p + 4 * i);
        memcpy(&dst[i], &bits, sizeof bits);
    }
}

/* ---- reference vectors ------------------------------------------------------------ */

/* Runs quantize_row over [0, n) in two calls split at a block boundary, to
 * show that blocks do not depend on each other. */
static void quantize_split(const bn_qtype_info *q, const float *x, uint8_t *out, int64_t n)
{
    const int64_t blocks = n / q->block_elems;
    const int64_t first = blocks / 2;
    q->quantize_row(x, out, first * q->block_elems);
    q->quantize_row(x + first * q->block_elems, out + first * q->block_bytes,
                    (blocks - first) * q->block_elems);
}

static void check_record(const char *label, const bn_qtype_info *q, uint32_t flags,
                         int64_t n, const float *input, const uint8_t *bytes, size_t n_bytes,
                         const float *expected)
{
    if (flags & 1u) {
        CHECK_MSG(q->quantize_row != NULL, "%s: no quantize_row for %s", label, q->name);
        if (q->quantize_row) {
            uint8_t *out = xmalloc(n_bytes + GUARD);
            static const uint8_t poisons[2] = {0xAB, 0x54};
            for (int p = 0; p < 2; p++) {
                memset(out, poisons[p], n_bytes);
                memset(out + n_bytes, GUARD_BYTE, GUARD);
                if (p == 0)
                    q->quantize_row(input, out, n);
                else
                    quantize_split(q, input, out, n);
                size_t first_diff = n_bytes;
                for (size_t i = 0; i < n_bytes && first_diff == n_bytes; i++)
                    if (out[i] != bytes[i])
                        first_diff = i;
                CHECK_MSG(first_diff == n_bytes,
                          "%s: quantize_row byte %zu (block %zu) is 0x%02x, gguf-py 0x%02x", label,
                          first_diff, first_diff / (size_t)q->block_bytes,
                          first_diff < n_bytes ? out[first_diff] : 0,
                          first_diff < n_bytes ? bytes[first_diff] : 0);
                CHECK_MSG(guard_intact(out + n_bytes), "%s: quantize_row wrote past the end",
                          label);
            }
            free(out);
        }
    }

    float *y = xmalloc((size_t)n * sizeof(float) + GUARD);
    static const uint32_t poisons[2] = {0x7FBADBADu, 0x4B1D4B1Du}; /* a NaN, a number */
    for (int p = 0; p < 2; p++) {
        fill_floats(y, (size_t)n, poisons[p]);
        memset((uint8_t *)(y + n), GUARD_BYTE, GUARD);
        q->dequantize_row(bytes, y, n);
        int64_t first_diff = n;
        for (int64_t i = 0; i < n && first_diff == n; i++)
            if (!same_float(y[i], expected[i]))
                first_diff = i;
        CHECK_MSG(first_diff == n,
                  "%s: dequantize_row element %" PRId64 " is %.9g (0x%08x), gguf-py %.9g (0x%08x)",
                  label, first_diff, first_diff < n ? (double)y[first_diff] : 0.0,
                  first_diff < n ? float_bits(y[first_diff]) : 0u,
                  first_diff < n ? (double)expected[first_diff] : 0.0,
                  first_diff < n ? float_bits(expected[first_diff]) : 0u);
        CHECK_MSG(guard_intact((uint8_t *)(y + n)), "%s: dequantize_row wrote past the end",
                  label);
    }
    free(y);
}

static void test_vectors(const char *path)
{
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s (run scripts/gen_quant_vectors.py)", path);
    if (!f)
        return;
    size_t cap = 1 << 20, size = 0;
    uint8_t *data = xmalloc(cap);
    for (;;) {
        size_t got = fread(data + size, 1, cap - size, f);
        size += got;
        if (size < cap)
            break;
        cap *= 2;
        uint8_t *bigger = realloc(data, cap);
        if (!bigger) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
        data = bigger;
    }
    fclose(f);

    CHECK_MSG(size >= 12 && memcmp(data, "BNQV", 4) == 0, "%s is not a vector file", path);
    if (size < 12 || memcmp(data, "BNQV", 4) != 0) {
        free(data);
        return;
    }
    CHECK_MSG(read_u32(data + 4) == 1, "vector file version %u, expected 1", read_u32(data + 4));
    const uint32_t count = read_u32(data + 8);

    /* Every type must be covered, so a cut-down file cannot pass quietly. */
    static const bn_qtype wanted[] = {BN_QTYPE_F32,  BN_QTYPE_F16,  BN_QTYPE_BF16,
                                      BN_QTYPE_Q8_0, BN_QTYPE_Q4_K, BN_QTYPE_Q6_K,
                                      BN_QTYPE_TQ1_0, BN_QTYPE_TQ2_0};
    enum { N_WANTED = sizeof wanted / sizeof wanted[0] };
    int seen[N_WANTED] = {0};
    int seen_quantize[N_WANTED] = {0};

    size_t off = 12;
    uint32_t done = 0;
    for (; done < count; done++) {
        if (size - off < 40) {
            CHECK_MSG(false, "record %u: header runs past the end of the file", done);
            break;
        }
        char label[25];
        memcpy(label, data + off, 24);
        label[24] = '\0';
        const uint32_t type = read_u32(data + off + 24);
        const uint32_t flags = read_u32(data + off + 28);
        const uint32_t n_elems = read_u32(data + off + 32);
        const uint32_t n_bytes = read_u32(data + off + 36);
        off += 40;
        const size_t floats = (size_t)n_elems * 4;
        const size_t body = ((flags & 1u) ? floats : 0) + n_bytes + floats;
        if (size - off < body) {
            CHECK_MSG(false, "record %u (%s): body runs past the end of the file", done, label);
            break;
        }
        const bn_qtype_info *q = bn_qtype_get((bn_qtype)type);
        CHECK_MSG(q && q->dequantize_row, "record %s: type %u not registered", label, type);
        if (q && q->dequantize_row) {
            CHECK_MSG(n_elems % (uint32_t)q->block_elems == 0 &&
                          (size_t)n_bytes == (size_t)(n_elems / (uint32_t)q->block_elems) *
                                                 (size_t)q->block_bytes,
                      "record %s: %u elements in %u bytes does not fit %s", label, n_elems,
                      n_bytes, q->name);
            float *input = xmalloc(floats);
            float *expected = xmalloc(floats);
            const uint8_t *p = data + off;
            if (flags & 1u) {
                read_floats(p, input, n_elems);
                p += floats;
            }
            const uint8_t *bytes = p;
            read_floats(p + n_bytes, expected, n_elems);
            check_record(label, q, flags, n_elems, input, bytes, n_bytes, expected);
            free(input);
            free(expected);
            for (int w = 0; w < N_WANTED; w++)
                if (wanted[w] == (bn_qtype)type) {
                    seen[w]++;
                    seen_quantize[w] += (flags & 1u) != 0;
                }
        }
        off += body;
    }
    CHECK_MSG(off == size, "%zu unread bytes after %u records", size - off, done);
    for (int w = 0; w < N_WANTED; w++) {
        const bn_qtype_info *q = bn_qtype_get(wanted[w]);
        CHECK_MSG(seen[w] > 0, "no vectors for %s", q ? q->name : "?");
        if (q && q->quantize_row)
            CHECK_MSG(seen_quantize[w] > 0, "no quantize vectors for %s", q->name);
    }
    fprintf(stderr, "vectors: %u records from %s\n", done, path);
    free(data);
}

/* ---- fp16 / bf16 ----------------------------------------------------------------- */

/* The value of a half, computed independently in double. */
static uint32_t reference_half_to_float_bits(uint16_t h)
{
    const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    if (exponent == 0x1f)
        return sign | 0x7f800000u | ((uint32_t)mantissa << 13);
    const double magnitude = exponent == 0 ? ldexp(mantissa, -24)
                                           : ldexp(1024 + mantissa, exponent - 25);
    return sign | float_bits((float)magnitude);
}

/* Correctly rounded float -> half of a non-NaN float, via double. */
static uint16_t reference_float_to_half(float f)
{
    const uint16_t sign = signbit(f) ? 0x8000 : 0;
    const double a = fabs((double)f);
    if (a >= 65520.0)
        return sign | 0x7c00;
    int e;
    frexp(a, &e); /* a = m * 2^e, 0.5 <= m < 1 */
    const double ulp = a >= 0x1p-14 ? ldexp(1.0, e - 11) : 0x1p-24;
    const double r = nearbyint(a / ulp) * ulp; /* ties to even */
    if (r == 0.0)
        return sign;
    if (r < 0x1p-14)
        return sign | (uint16_t)(r / 0x1p-24);
    frexp(r, &e);
    const int mantissa = (int)((ldexp(r, 1 - e) - 1.0) * 1024.0);
    return (uint16_t)(sign | ((e - 1 + 15) << 10) | mantissa);
}

/* Round to nearest even of a non-NaN float to bf16, by comparing distances
 * to the two neighbours in double. */
static uint16_t reference_float_to_bf16(float f)
{
    const uint32_t bits = float_bits(f);
    const uint16_t toward_zero = (uint16_t)(bits >> 16);
    if ((bits & 0xffff) == 0)
        return toward_zero;
    const uint16_t away = (uint16_t)(toward_zero + 1);
    const double a = fabs((double)f);
    const double lo = fabs((double)bn_bf16_to_fp32(toward_zero));
    const double hi = (away & 0x7fff) == 0x7f80 ? 0x1p128 : fabs((double)bn_bf16_to_fp32(away));
    if (a - lo < hi - a)
        return toward_zero;
    if (hi - a < a - lo)
        return away;
    return (toward_zero & 1) ? away : toward_zero;
}

static void test_fp16(void)
{
    /* Every half: exact value, and back unchanged (NaN payloads included). */
    int value_errors = 0, round_trip_errors = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        const float f = bn_fp16_to_fp32((uint16_t)h);
        if (float_bits(f) != reference_half_to_float_bits((uint16_t)h) && value_errors++ < 5)
            fprintf(stderr, "half 0x%04x -> 0x%08x, expected 0x%08x\n", (unsigned)h,
                    float_bits(f), reference_half_to_float_bits((uint16_t)h));
        if (bn_fp32_to_fp16(f) != h && round_trip_errors++ < 5)
            fprintf(stderr, "half 0x%04x -> float -> 0x%04x\n", (unsigned)h,
                    bn_fp32_to_fp16(f));
    }
    CHECK_MSG(value_errors == 0, "%d halves convert to the wrong float", value_errors);
    CHECK_MSG(round_trip_errors == 0, "%d halves do not survive a round trip", round_trip_errors);

    /* Boundary cases; expected bits from numpy's astype(np.float16). */
    static const struct { uint32_t f; uint16_t h; } cases[] = {
        {0x477fe000u, 0x7bffu}, /* 65504, the largest half           */
        {0x477fefffu, 0x7bffu}, /* just below 65520                  */
        {0x477ff000u, 0x7c00u}, /* 65520: tie, rounds to inf         */
        {0xc77ff000u, 0xfc00u}, {0x47800000u, 0x7c00u}, {0x4e6e6b28u, 0x7c00u},
        {0x7f800000u, 0x7c00u}, {0xff800000u, 0xfc00u},
        {0x3f800000u, 0x3c00u}, /* 1                                  */
        {0x3f801000u, 0x3c00u}, /* 1 + 2^-11: tie, down to even       */
        {0x3f803000u, 0x3c02u}, /* 1 + 3*2^-11: tie, up to even       */
        {0x3f801001u, 0x3c01u}, {0x3f800fffu, 0x3c00u},
        {0x38800000u, 0x0400u}, /* 2^-14, smallest normal             */
        {0x33800000u, 0x0001u}, /* 2^-24, smallest subnormal          */
        {0x33000000u, 0x0000u}, /* 2^-25: tie, down to zero (even)    */
        {0x33000001u, 0x0001u}, {0x32ffffffu, 0x0000u},
        {0x33c00000u, 0x0002u}, /* 1.5 * 2^-24: tie, up to even       */
        {0x34200000u, 0x0002u}, /* 2.5 * 2^-24: tie, down to even     */
        {0x387fe000u, 0x0400u}, /* largest subnormal / normal tie     */
        {0x387fc000u, 0x03ffu}, /* largest subnormal                  */
        {0x80000000u, 0x8000u}, {0x00000001u, 0x0000u}, {0x80000001u, 0x8000u},
        {0x007fffffu, 0x0000u},
        {0x7fc00000u, 0x7e00u}, {0xffc00000u, 0xfe00u}, {0x7fc02000u, 0x7e01u},
        {0x7f800001u, 0x7c01u}, /* payload only in dropped bits: stays NaN */
        {0x7f802000u, 0x7c01u}, {0xff801fffu, 0xfc01u}, {0x7fffffffu, 0x7fffu},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint16_t got = bn_fp32_to_fp16(bits_float(cases[i].f));
        CHECK_MSG(got == cases[i].h, "float 0x%08x -> half 0x%04x, expected 0x%04x", cases[i].f,
                  got, cases[i].h);
    }

    /* Random floats: anywhere, and concentrated in and around the half range. */
    int random_errors = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t bits = (uint32_t)rng_next();
        if (i & 1) /* exponent 98 ... 145: subnormal halves to overflow */
            bits = (bits & 0x807fffffu) | ((98u + rng_below(48)) << 23);
        const float f = bits_float(bits);
        if (isnan(f))
            continue;
        const uint16_t got = bn_fp32_to_fp16(f), want = reference_float_to_half(f);
        if (got != want && random_errors++ < 5)
            fprintf(stderr, "float 0x%08x -> half 0x%04x, oracle 0x%04x\n", bits, got, want);
    }
    CHECK_MSG(random_errors == 0, "%d random floats convert to the wrong half", random_errors);
}

static void test_bf16(void)
{
    int errors = 0;
    for (uint32_t b = 0; b < 0x10000; b++) {
        const float f = bn_bf16_to_fp32((uint16_t)b);
        if (float_bits(f) != b << 16 && errors++ < 5)
            fprintf(stderr, "bf16 0x%04x -> 0x%08x\n", (unsigned)b, float_bits(f));
        /* Back unchanged, except that a NaN comes back quiet. */
        const uint16_t want = isnan(f) ? (uint16_t)(b | 0x40) : (uint16_t)b;
        if (bn_fp32_to_bf16(f) != want && errors++ < 5)
            fprintf(stderr, "bf16 0x%04x -> float -> 0x%04x\n", (unsigned)b, bn_fp32_to_bf16(f));
    }
    CHECK_MSG(errors == 0, "%d bf16 values convert wrongly", errors);

    /* Boundary cases; expected bits from gguf-py's BF16 quantizer. */
    static const struct { uint32_t f; uint16_t b; } cases[] = {
        {0x3f808000u, 0x3f80u}, /* tie, down to even */
        {0x3f818000u, 0x3f82u}, /* tie, up to even   */
        {0x3f808001u, 0x3f81u}, {0x3f807fffu, 0x3f80u},
        {0x7f7fffffu, 0x7f80u}, /* overflow to inf   */
        {0x7f7f8000u, 0x7f80u}, {0x7f7f7fffu, 0x7f7fu},
        {0x00008000u, 0x0000u}, /* subnormals round, not flushed */
        {0x00018000u, 0x0002u}, {0x00000001u, 0x0000u}, {0x807fffffu, 0x8080u},
        {0x80000000u, 0x8000u}, {0x7f800000u, 0x7f80u}, {0xff800000u, 0xff80u},
        {0x7fc00000u, 0x7fc0u}, {0xffc00000u, 0xffc0u},
        {0x7f800001u, 0x7fc0u}, /* signalling NaN becomes quiet */
        {0xff810000u, 0xffc1u}, {0x7fbfffffu, 0x7fffu}, {0x7fc0ffffu, 0x7fc0u},
        {0x3f800000u, 0x3f80u}, {0x4049fdb0u, 0x404au},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint16_t got = bn_fp32_to_bf16(bits_float(cases[i].f));
        CHECK_MSG(got == cases[i].b, "float 0x%08x -> bf16 0x%04x, expected 0x%04x", cases[i].f,
                  got, cases[i].b);
    }

    int random_errors = 0;
    for (int i = 0; i < 1000000; i++) {
        const float f = bits_float((uint32_t)rng_next());
        if (isnan(f))
            continue;
        const uint16_t got = bn_fp32_to_bf16(f), want = reference_float_to_bf16(f);
        if (got != want && random_errors++ < 5)
            fprintf(stderr, "float 0x%08x -> bf16 0x%04x, oracle 0x%04x\n", float_bits(f), got,
                    want);
    }
    CHECK_MSG(random_errors == 0, "%d random floats convert to the wrong bf16", random_errors);
}

/* ---- TQ1_0 / TQ2_0 pack and unpack -------------------------------------------------- */

typedef struct tq_api {
    const char *name;
    bn_qtype type;
    int block_bytes;
    int scale_offset;
    bn_status (*pack)(const int8_t *, float, int64_t, int64_t, void *, bn_error *);
    bn_status (*unpack)(const void *, size_t, int64_t, int64_t, int8_t *, float *, bn_error *);
    void (*quantize_row)(const float *, void *, int64_t);
    void (*dequantize_row)(const void *, float *, int64_t);
} tq_api;

static const tq_api tq_apis[2] = {
    {"tq1_0", BN_QTYPE_TQ1_0, 54, 52, bn_pack_tq1_0, bn_unpack_tq1_0, bn_quantize_row_tq1_0,
     bn_dequantize_row_tq1_0},
    {"tq2_0", BN_QTYPE_TQ2_0, 66, 64, bn_pack_tq2_0, bn_unpack_tq2_0, bn_quantize_row_tq2_0,
     bn_dequantize_row_tq2_0},
};

static size_t tq_bytes(const tq_api *t, int64_t rows, int64_t cols)
{
    return (size_t)(rows * (cols / 256)) * (size_t)t->block_bytes;
}

static void store_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/* pack, check it against quantize_row of codes * scale, unpack, compare. */
static void tq_round_trip(const tq_api *t, const int8_t *codes, float scale, int64_t rows,
                          int64_t cols, const char *what)
{
    const size_t n = (size_t)rows * (size_t)cols, bytes = tq_bytes(t, rows, cols);
    uint8_t *packed = xmalloc(bytes + GUARD);
    memset(packed, 0xAB, bytes);
    memset(packed + bytes, GUARD_BYTE, GUARD);
    bn_error err;
    bn_error_clear(&err);
    bn_status st = t->pack(codes, scale, rows, cols, packed, &err);
    CHECK_MSG(st == BN_OK, "%s %s pack %lldx%lld: %s", t->name, what, (long long)rows,
              (long long)cols, err.message);
    CHECK_MSG(guard_intact(packed + bytes), "%s %s: pack wrote past the end", t->name, what);

    /* pack == quantize_row(codes * scale) for scale >= 0. */
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)codes[i] * scale;
    uint8_t *quantized = xmalloc(bytes);
    memset(quantized, 0x54, bytes);
    const size_t row_bytes = bytes / (size_t)rows;
    for (int64_t r = 0; r < rows; r++)
        t->quantize_row(x + r * cols, quantized + (size_t)r * row_bytes, cols);
    CHECK_MSG(memcmp(packed, quantized, bytes) == 0,
              "%s %s: pack differs from quantize_row of codes * scale", t->name, what);

    /* unpack gives the codes back, and the scale rounded to fp16. */
    int8_t *back = xmalloc(n);
    memset(back, 0x55, n);
    float got_scale = bits_float(0x7fbadbadu);
    bn_error_clear(&err);
    st = t->unpack(packed, bytes, rows, cols, back, &got_scale, &err);
    CHECK_MSG(st == BN_OK, "%s %s unpack: %s", t->name, what, err.message);
    CHECK_MSG(memcmp(back, codes, n) == 0, "%s %s: unpack gives different codes", t->name, what);
    bool any_nonzero = false;
    for (size_t i = 0; i < n; i++)
        any_nonzero |= codes[i] != 0;
    const float want_scale = any_nonzero ? bn_fp16_to_fp32(bn_fp32_to_fp16(scale)) : 0.0f;
    CHECK_MSG(float_bits(got_scale) == float_bits(want_scale),
              "%s %s: unpack scale %.9g, expected %.9g", t->name, what, (double)got_scale,
              (double)want_scale);

    /* dequantize_row of the packed tensor is codes * that scale, exactly. */
    float *y = xmalloc(n * sizeof(float));
    fill_floats(y, n, 0x7fbadbadu);
    for (int64_t r = 0; r < rows; r++)
        t->dequantize_row(packed + (size_t)r * row_bytes, y + r * cols, cols);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += !same_float(y[i], (float)codes[i] * want_scale);
    CHECK_MSG(bad == 0, "%s %s: %zu dequantized values differ from codes * scale", t->name,
              what, bad);

    free(packed);
    free(x);
    free(quantized);
    free(back);
    free(y);
}

static void random_codes(int8_t *codes, int64_t rows, int64_t cols)
{
    for (int64_t first = 0; first < rows * cols; first += 256) {
        const bool zero_block = rng_below(4) == 0;
        const uint32_t zero_odds = 1 + rng_below(4); /* vary the density */
        for (int i = 0; i < 256; i++)
            codes[first + i] =
                zero_block || rng_below(zero_odds + 2) < zero_odds ? 0
                                                                   : (rng_below(2) ? 1 : -1);
    }
}

static void test_tq_round_trips(const tq_api *t)
{
    for (int trial = 0; trial < 40; trial++) {
        const int64_t rows = 1 + rng_below(7), cols = 256 * (1 + (int64_t)rng_below(4));
        int8_t *codes = xmalloc((size_t)(rows * cols));
        random_codes(codes, rows, cols);
        /* Positive scales from 1e-4 to 1e3, some exactly representable. */
        float scale = powf(10.0f, -4.0f + 7.0f * rng_unit());
        if (trial % 4 == 0)
            scale = bn_fp16_to_fp32(bn_fp32_to_fp16(scale));
        tq_round_trip(t, codes, scale, rows, cols, "random");
        free(codes);
    }

    /* All zero: d = 0 everywhere, scale 0. */
    int8_t zeros[2 * 512] = {0};
    tq_round_trip(t, zeros, 0.25f, 2, 512, "all-zero");

    /* Every digit combination of every byte position (TQ1_0 packs five base-3
     * digits per byte: 243 combinations; rows cycle through them). */
    const int64_t rows = 243, cols = 256;
    int8_t *codes = xmalloc((size_t)(rows * cols));
    memset(codes, 0, (size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++) {
        int8_t *row = codes + r * cols;
        for (int m = 0; m < 32; m++) {
            int v = (int)((r + m) % 243);
            for (int k = 4; k >= 0; k--, v /= 3)
                row[32 * k + m] = (int8_t)(v % 3 - 1);
        }
        for (int m = 0; m < 16; m++) {
            int v = (int)((r + 7 * m) % 243);
            for (int k = 4; k >= 0; k--, v /= 3)
                row[160 + 16 * k + m] = (int8_t)(v % 3 - 1);
        }
        for (int m = 0; m < 4; m++) {
            int v = (int)((r + 11 * m) % 81);
            for (int k = 3; k >= 0; k--, v /= 3)
                row[240 + 4 * k + m] = (int8_t)(v % 3 - 1);
        }
    }
    tq_round_trip(t, codes, 1.5f, rows, cols, "every digit pattern");
    free(codes);
}

static void test_tq_errors(const tq_api *t)
{
    bn_error err;
    const int64_t rows = 2, cols = 512; /* four blocks */
    const size_t n = (size_t)(rows * cols), bytes = tq_bytes(t, rows, cols);
    int8_t *codes = xmalloc(n), *back = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        codes[i] = (int8_t)(i % 3) - 1; /* every block non-zero */
    uint8_t *packed = xmalloc(bytes);
    float scale = 0.0f;
    const float s = 0.0625f;
    CHECK(t->pack(codes, s, rows, cols, packed, NULL) == BN_OK);
    const uint16_t s_half = bn_fp32_to_fp16(s);

    /* Truncated data. */
    bn_error_clear(&err);
    CHECK(t->unpack(packed, bytes - 1, rows, cols, back, &scale, &err) == BN_ERR_FORMAT);
    CHECK(err.status == BN_ERR_FORMAT && err.message[0] != '\0');
    CHECK(t->unpack(packed, 0, rows, cols, back, &scale, NULL) == BN_ERR_FORMAT);
    CHECK(t->unpack(packed, bytes, rows, cols, back, &scale, NULL) == BN_OK);
    CHECK(t->unpack(packed, bytes + 100, rows, cols, back, &scale, NULL) == BN_OK);

    /* Bad shapes, both directions. */
    static const int64_t bad_shapes[][2] = {{2, 255}, {2, 300}, {2, 128}, {2, 0},
                                            {2, -256}, {0, 256}, {-1, 256}, {1, 257}};
    for (size_t i = 0; i < sizeof bad_shapes / sizeof bad_shapes[0]; i++) {
        const int64_t r = bad_shapes[i][0], c = bad_shapes[i][1];
        bn_error_clear(&err);
        bn_status st = t->unpack(packed, bytes, r, c, back, &scale, &err);
        CHECK_MSG(st == BN_ERR_INVALID_ARGUMENT && err.message[0],
                  "%s unpack %lldx%lld: status %d", t->name, (long long)r, (long long)c, st);
        bn_error_clear(&err);
        st = t->pack(codes, s, r, c, packed, &err);
        CHECK_MSG(st == BN_ERR_INVALID_ARGUMENT && err.message[0],
                  "%s pack %lldx%lld: status %d", t->name, (long long)r, (long long)c, st);
    }
    CHECK(t->pack(codes, s, rows, cols, packed, NULL) == BN_OK); /* restore */

    /* NULL pointers. */
    CHECK(t->unpack(NULL, bytes, rows, cols, back, &scale, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK(t->unpack(packed, bytes, rows, cols, NULL, &scale, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK(t->unpack(packed, bytes, rows, cols, back, NULL, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK(t->pack(NULL, s, rows, cols, packed, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK(t->pack(codes, s, rows, cols, NULL, NULL) == BN_ERR_INVALID_ARGUMENT);

    /* Blocks with different scales: a per-block tensor, not a ternary one. */
    uint8_t *changed = xmalloc(bytes);
    memcpy(changed, packed, bytes);
    store_le16(changed + 2 * t->block_bytes + t->scale_offset, bn_fp32_to_fp16(2 * s));
    bn_error_clear(&err);
    CHECK(t->unpack(changed, bytes, rows, cols, back, &scale, &err) == BN_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "differ");
    /* The negative of the scale is a different scale too. */
    memcpy(changed, packed, bytes);
    store_le16(changed + 3 * t->block_bytes + t->scale_offset, (uint16_t)(s_half | 0x8000u));
    CHECK(t->unpack(changed, bytes, rows, cols, back, &scale, NULL) == BN_ERR_UNSUPPORTED);

    /* A block with scale 0 holds zeros whatever its codes: accepted, and its
     * codes come back as 0. */
    memcpy(changed, packed, bytes);
    store_le16(changed + 1 * t->block_bytes + t->scale_offset, 0x8000u); /* -0 */
    memset(back, 0x55, n);
    scale = -1.0f;
    CHECK(t->unpack(changed, bytes, rows, cols, back, &scale, NULL) == BN_OK);
    CHECK(scale == s);
    bool zeroed = true, kept = true;
    for (size_t i = 0; i < n; i++) {
        if (i >= 256 && i < 512)
            zeroed &= back[i] == 0;
        else
            kept &= back[i] == codes[i];
    }
    CHECK(zeroed && kept);

    /* A non-finite block scale is a corrupt file. */
    memcpy(changed, packed, bytes);
    store_le16(changed + t->scale_offset, 0x7c00u);
    CHECK(t->unpack(changed, bytes, rows, cols, back, &scale, NULL) == BN_ERR_FORMAT);
    store_le16(changed + t->scale_offset, 0xfe00u);
    CHECK(t->unpack(changed, bytes, rows, cols, back, &scale, NULL) == BN_ERR_FORMAT);

    /* TQ2_0's unused code 3 means +2 * d: not ternary. */
    if (t->type == BN_QTYPE_TQ2_0) {
        memcpy(changed, packed, bytes);
        changed[5] |= 0x03;
        bn_error_clear(&err);
        CHECK(t->unpack(changed, bytes, rows, cols, back, &scale, &err) == BN_ERR_UNSUPPORTED);
        CHECK(err.message[0] != '\0');
    }

    /* pack rejects codes outside {-1, 0, 1} and leaves dst alone. */
    codes[300] = 2;
    memset(changed, 0xAB, bytes);
    bn_error_clear(&err);
    CHECK(t->pack(codes, s, rows, cols, changed, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "row 0, column 300");
    bool untouched = true;
    for (size_t i = 0; i < bytes; i++)
        untouched &= changed[i] == 0xAB;
    CHECK(untouched);
    codes[300] = -2;
    CHECK(t->pack(codes, s, rows, cols, changed, NULL) == BN_ERR_INVALID_ARGUMENT);
    codes[300] = 0;

    /* pack rejects scales that do not fit an fp16 block scale. */
    CHECK(t->pack(codes, INFINITY, rows, cols, changed, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK(t->pack(codes, NAN, rows, cols, changed, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK(t->pack(codes, 65520.0f, rows, cols, changed, NULL) == BN_ERR_INVALID_ARGUMENT);
    CHECK(t->pack(codes, 65504.0f, rows, cols, changed, NULL) == BN_OK);

    free(codes);
    free(back);
    free(packed);
    free(changed);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s quant_vectors.bin [seed]\n", argv[0]);
        return 2;
    }
    const uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0)
                                   : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    fprintf(stderr, "test_quant_gguf: seed %" PRIu64 " (pass it as the second argument to repeat)\n",
            seed);
    rng_state = seed;

    test_vectors(argv[1]);
    test_fp16();
    test_bf16();
    for (int i = 0; i < 2; i++) {
        test_tq_round_trips(&tq_apis[i]);
        test_tq_errors(&tq_apis[i]);
    }
    TEST_EXIT();
}
