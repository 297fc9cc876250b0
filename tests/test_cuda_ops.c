/* GPU test: the ops_kernels.cu kernels the CUDA backend runs, against CPU
 * references, with NaN-poisoned outputs, and the read-only kernel of the
 * benchmark's floor.
 *
 *   embeddings         bit for bit with bn_dequantize_row_*; a NaN that
 *                      arithmetic produced only needs to be a NaN (x86 and
 *                      the GPU make different default NaNs); an id out of
 *                      range gives a row of quiet NaN
 *   RoPE frequencies   bn_rope_freqs_init's argument checks
 *   read_stream        every 16-byte chunk read exactly once
 *
 * Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>

#include "fmt_dense.h"
#include "fmt_tq.h"
#include "fp16.h"
#include "ops_cuda.h"
#include "read_stream.h"
#include "test_util.h"
#include "test_util_cuda.h"

#define POISON_BYTE 0xff /* every float becomes a NaN (0xffffffff) */

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

/* Equal bits, or both NaN (for values produced by arithmetic). */
static bool same_value(float a, float b) { return same_bits(a, b) || (isnan(a) && isnan(b)); }

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void *dev_upload(const void *host, size_t bytes)
{
    void *p = dev_alloc(bytes);
    CUDA_OK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void *dev_poisoned(size_t bytes, int byte)
{
    void *p = dev_alloc(bytes);
    CUDA_OK(cudaMemset(p, byte, bytes));
    return p;
}

static void *host_download(const void *dev, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(p, dev, bytes, cudaMemcpyDeviceToHost));
    return p;
}

/* A row of values of one random magnitude, signs mixed. */
static void random_row(float *x, int64_t n)
{
    const float range = test_rand_float(0.01f, 100.0f);
    for (int64_t i = 0; i < n; i++)
        x[i] = test_rand_float(-range, range);
}

/* Special fp32 values: infinities, NaNs (signalling, with payloads), zeros,
 * subnormals, and values at the fp16/bf16 rounding edges. */
static float special_value(void)
{
    static const uint32_t specials[] = {
        0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, /* inf, NaN          */
        0x7f800001u, 0x7fa00000u, 0xff801234u, 0x7fbfffffu, /* signalling NaNs   */
        0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, /* zeros, subnormal  */
        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477fffffu, /* 65504 .. 65536    */
        0x38800000u, 0x33800000u, 0x33000000u, 0x33000001u, /* half min/sub/tie  */
        0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x7f7fffffu, /* bf16 ties, max    */
    };
    return float_of(specials[test_rand_range(0, (int64_t)(sizeof specials / 4) - 1)]);
}

/* ---- embeddings ------------------------------------------------------------------- */

typedef struct embed_type {
    bn_qtype type;
    int block_elems, block_bytes;
    void (*dequantize_row)(const void *, float *, int64_t);
} embed_type;

static const embed_type embed_types[] = {
    {BN_QTYPE_F32, 1, 4, bn_dequantize_row_f32},
    {BN_QTYPE_F16, 1, 2, bn_dequantize_row_f16},
    {BN_QTYPE_BF16, 1, 2, bn_dequantize_row_bf16},
    {BN_QTYPE_Q8_0, 32, 34, bn_dequantize_row_q8_0},
    {BN_QTYPE_Q4_K, 256, 144, bn_dequantize_row_q4_k},
    {BN_QTYPE_Q6_K, 256, 210, bn_dequantize_row_q6_k},
    {BN_QTYPE_TQ2_0, 256, 66, bn_dequantize_row_tq2_0},
};

static void put_half(uint8_t *p, float v)
{
    const uint16_t h = bn_fp32_to_fp16(v);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* A random table: real encodings of random floats where the format has a
 * quantizer, random bytes with realistic fp16 scales where it has none
 * (every bit pattern of the quants is a valid block), plus special values. */
static uint8_t *random_table(const embed_type *t, int64_t n_rows, int64_t dim, int64_t row_bytes)
{
    uint8_t *table = malloc((size_t)(n_rows * row_bytes));
    float *row = malloc(sizeof(float) * (size_t)dim);
    for (int64_t r = 0; r < n_rows; r++) {
        uint8_t *dst = table + r * row_bytes;
        random_row(row, dim);
        switch (t->type) {
        case BN_QTYPE_F32: bn_quantize_row_f32(row, dst, dim); break;
        case BN_QTYPE_F16: bn_quantize_row_f16(row, dst, dim); break;
        case BN_QTYPE_BF16: bn_quantize_row_bf16(row, dst, dim); break;
        case BN_QTYPE_Q8_0: bn_quantize_row_q8_0(row, dst, dim); break;
        default:
            for (int64_t i = 0; i < row_bytes; i++)
                dst[i] = (uint8_t)test_rand_u64();
            for (int64_t b = 0; b < dim / t->block_elems; b++) {
                uint8_t *blk = dst + b * t->block_bytes;
                const float d = test_rand_float(1e-4f, 0.05f);
                if (t->type == BN_QTYPE_Q4_K) {
                    put_half(blk, d);
                    put_half(blk + 2, test_rand_float(1e-4f, 0.05f));
                } else {
                    put_half(blk + t->block_bytes - 2, d);
                }
            }
            break;
        }
        /* Specials: raw NaN/inf/subnormal elements in the plain formats. */
        if (t->block_elems == 1 && test_rand_range(0, 1)) {
            const int64_t e = test_rand_range(0, dim - 1);
            if (t->type == BN_QTYPE_F32) {
                const float v = special_value();
                memcpy(dst + 4 * e, &v, 4);
            } else {
                static const uint16_t halves[] = {0x7c00, 0xfc00, 0x7c01, 0xfe00, 0x0001,
                                                  0x83ff, 0x7fff, 0x8000, 0x7d55};
                const uint16_t h = halves[test_rand_range(0, 8)];
                dst[2 * e] = (uint8_t)(h & 0xff);
                dst[2 * e + 1] = (uint8_t)(h >> 8);
            }
        }
    }
    free(row);
    return table;
}

static void check_embed(const embed_type *t)
{
    const int64_t dim = t->block_elems == 1 ? test_rand_range(1, 700)
                                            : t->block_elems * test_rand_range(1, 12);
    const int64_t n_rows = test_rand_range(1, 300);
    const int64_t row_bytes = dim / t->block_elems * t->block_bytes;
    const int64_t n = test_rand_range(1, 50), ldy = dim + test_rand_range(0, 4);
    uint8_t *table = random_table(t, n_rows, dim, row_bytes);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)test_rand_range(0, n_rows - 1);
    const int64_t bad_at = n > 2 ? test_rand_range(0, n - 1) : -1;
    if (bad_at >= 0)
        ids[bad_at] = test_rand_range(0, 1) ? -1 : (int32_t)n_rows;

    uint8_t *d_table = dev_upload(table, (size_t)(n_rows * row_bytes));
    int32_t *d_ids = dev_upload(ids, sizeof(int32_t) * (size_t)n);
    float *d_y = dev_poisoned(sizeof(float) * (size_t)(n * ldy), POISON_BYTE);
    float *d_all = dev_poisoned(sizeof(float) * (size_t)(n_rows * dim), POISON_BYTE);
    CUDA_OK(bn_cuda_embed_rows(d_table, t->type, n_rows, dim, d_ids, n, d_y, ldy, 0));
    CUDA_OK(bn_cuda_embed_rows(d_table, t->type, n_rows, dim, NULL, n_rows, d_all, dim, 0));
    float *y = host_download(d_y, sizeof(float) * (size_t)(n * ldy));
    float *all = host_download(d_all, sizeof(float) * (size_t)(n_rows * dim));

    /* Plain conversions keep NaN payloads; arithmetic NaNs only match as NaN. */
    const bool exact_nan = t->block_elems == 1;
    float *ref = malloc(sizeof(float) * (size_t)dim);
    int64_t differ = 0, gap_written = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *yr = y + i * ldy;
        if (i == bad_at) {
            for (int64_t e = 0; e < dim; e++)
                differ += bits_of(yr[e]) != 0x7fc00000u;
        } else {
            t->dequantize_row(table + ids[i] * row_bytes, ref, dim);
            for (int64_t e = 0; e < dim; e++)
                differ += exact_nan ? !same_bits(yr[e], ref[e]) : !same_value(yr[e], ref[e]);
        }
        for (int64_t e = dim; e < ldy; e++)
            gap_written += bits_of(yr[e]) != 0xffffffffu;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        t->dequantize_row(table + r * row_bytes, ref, dim);
        for (int64_t e = 0; e < dim; e++) {
            const float g = all[r * dim + e];
            differ += exact_nan ? !same_bits(g, ref[e]) : !same_value(g, ref[e]);
        }
    }
    CHECK_MSG(differ == 0 && gap_written == 0,
              "embed type %d dim=%lld rows=%lld: %lld values differ, %lld gap values written",
              (int)t->type, (long long)dim, (long long)n_rows, (long long)differ,
              (long long)gap_written);
    CUDA_OK(cudaFree(d_table));
    CUDA_OK(cudaFree(d_ids));
    CUDA_OK(cudaFree(d_y));
    CUDA_OK(cudaFree(d_all));
    free(table);
    free(ids);
    free(y);
    free(all);
    free(ref);
}

/* ---- the read-only kernel of the benchmark's floor --------------------------------- */

/* Every 32-bit word of the buffer is folded into the sink by XOR, so the
 * XOR of the sink's words is the XOR of the buffer's: a check that each
 * 16-byte chunk was read exactly once (a chunk read twice or skipped
 * changes it unless its words XOR to zero; random data makes that
 * unlikely). */
static void check_read_stream(size_t bytes, int blocks, int pdl)
{
    uint32_t *host = malloc(bytes);
    uint32_t want = 0;
    for (size_t i = 0; i < bytes / 4; i++) {
        host[i] = (uint32_t)test_rand_range(0, 0x7fffffff) * 2654435761u + (uint32_t)i;
        want ^= host[i];
    }
    void *d_buf = dev_upload(host, bytes);
    uint32_t *d_sink = dev_alloc(BN_READ_STREAM_SINK_WORDS * sizeof(uint32_t));
    CUDA_OK(cudaMemset(d_sink, 0, BN_READ_STREAM_SINK_WORDS * sizeof(uint32_t)));
    CUDA_OK(bn_cuda_read_stream(d_buf, bytes, blocks, pdl, d_sink, 0));
    uint32_t *sink = host_download(d_sink, BN_READ_STREAM_SINK_WORDS * sizeof(uint32_t));
    uint32_t got = 0;
    for (int i = 0; i < BN_READ_STREAM_SINK_WORDS; i++)
        got ^= sink[i];
    CHECK_MSG(got == want, "read_stream %zu bytes, %d blocks, pdl %d: fold %08x, want %08x",
              bytes, blocks, pdl, got, want);
    CUDA_OK(cudaFree(d_buf));
    CUDA_OK(cudaFree(d_sink));
    free(host);
    free(sink);
}

/* ---- argument checks ------------------------------------------------------------ */

static void check_invalid_arguments(void)
{
    bn_rope_freqs f;
    CHECK(bn_rope_freqs_init(&f, 10000.0f, 7) == cudaErrorInvalidValue);
    CHECK(bn_rope_freqs_init(&f, 10000.0f, BN_ROPE_MAX_DIM + 2) == cudaErrorInvalidValue);
    CHECK(bn_rope_freqs_init(&f, 0.0f, 64) == cudaErrorInvalidValue);
    CHECK(bn_rope_freqs_init(&f, 10000.0f, 128) == cudaSuccess);
    float *d = dev_alloc(4096);
    CHECK(bn_cuda_embed_rows(d, BN_QTYPE_Q8_0, 1, 33, NULL, 1, d, 33, 0) ==
          cudaErrorInvalidValue);
    CHECK(bn_cuda_embed_rows(d, BN_QTYPE_I2_S, 1, 128, NULL, 1, d, 128, 0) ==
          cudaErrorInvalidValue);
    CHECK(bn_cuda_read_stream(d, 4008, 1, 0, (uint32_t *)d, 0) == cudaErrorInvalidValue);
    CHECK(bn_cuda_read_stream(d, 4096, 0, 0, (uint32_t *)d, 0) == cudaErrorInvalidValue);
    /* Nothing to do is not an error. */
    CHECK(bn_cuda_embed_rows(d, BN_QTYPE_F32, 1, 4, NULL, 0, d, 4, 0) == cudaSuccess);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(d));
}

int main(void)
{
    const int major = test_require_cuda(8, "this build's kernels").major;

    check_invalid_arguments();
    {
        /* Sizes around the 4-load groups of a grid's stride, one to many
         * blocks, and PDL where this build and device have it. */
        const int pdl = bn_cuda_read_stream_pdl_compiled() && major >= 9;
        for (int iter = 0; iter < 12; iter++)
            check_read_stream(16 * (size_t)test_rand_range(1, 200000), test_rand_range(1, 300),
                              iter % 2 ? pdl : 0);
        check_read_stream(16, 1, 0);
        check_read_stream((size_t)16 * 512 * 4 * 3, 3, pdl); /* exactly whole groups */
    }
    for (int iter = 0; iter < 6; iter++)
        for (size_t t = 0; t < sizeof embed_types / sizeof embed_types[0]; t++)
            check_embed(&embed_types[t]);
    TEST_EXIT();
}
