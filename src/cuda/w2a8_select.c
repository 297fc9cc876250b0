/*
 * w2a8_select.c - which W2A8 kernel runs a product of M activation rows
 * with an N x K ternary matrix: a table in code, read top to bottom, the
 * first row whose rows, device and shape test match giving the kernel.
 *
 * The order follows measurements on an H200 and an H100 (docs/KERNELS.md,
 * docs/PERFORMANCE.md has the figures): one row is the GEMV; up to 64 rows
 * the GEMV's weight stream met by every row (dp4a for 2-3 rows on small
 * matrices, else mma fragments), except where the 192 x 64 wgmma tiles
 * fill half the SMs; from 65 rows 192 x 64 tiles whose k-tiles a cluster
 * of 2 or 4 blocks shares where that fits one wave and whole tiles would
 * leave most SMs idle; to 128 rows the mma-rows kernel again where 192 x 64
 * tiles would leave most SMs idle; beyond, with wgmma, the widest
 * warp-specialized tiles that fill most SMs in one wave, since per
 * multiply-add they move fewer activation bytes, and 192 x 64 where those
 * fit one wave; without wgmma the mma.sync kernels. A kernel's stream-K
 * form (its tiles' k-tiles shared evenly by the SMs) replaces it where the
 * caller gives a workspace and stream-K spares the busiest SM at least
 * kStreamkMinSaved k-tiles.
 */
#include <stdbool.h>
#include <stdio.h>

#include "cuda_layout.h"
#include "w2a8_cuda.h"

/* The product's shape: m activation rows, n weight rows of k values (k
 * padded to whole chunk-groups), on a device of sms SMs. */
typedef struct gemm_shape {
    int64_t m, n, k, sms;
} gemm_shape;

/* Output tiles of `rows` weight rows x `acts` activation rows. */
static int64_t tiles_of(const gemm_shape *s, int64_t rows, int64_t acts)
{
    return ((s->m + acts - 1) / acts) * ((s->n + rows - 1) / rows);
}

/* ---- the shape tests of the table ------------------------------------------- */

static bool always(const gemm_shape *s)
{
    (void)s;
    return true;
}

/* At most 40 Mi weights: the dp4a stream beats the mma one for 2-3 rows
 * (2560 x 2560 at M = 2: 3.2 us against 4.1). */
static bool small_matrix(const gemm_shape *s)
{
    return s->n * s->k <= (40ll << 20);
}

/* Rows of 4096, 8192, 16384 values or more. */
static bool k_4096(const gemm_shape *s)
{
    return s->k >= 4096;
}

static bool k_8192(const gemm_shape *s)
{
    return s->k >= 8192;
}

static bool k_16384(const gemm_shape *s)
{
    return s->k >= 16384;
}

/* Columns of two tiles (16 weight rows) number at least 8 an SM: four
 * tiles a warp read each activation fragment half as often and still
 * leave columns enough (55296 x 5120 at M = 16: 37.3 us against 38.8). */
static bool many_columns(const gemm_shape *s)
{
    return (s->n + 15) / 16 >= 8 * s->sms;
}

/* The 192 x 64 wgmma tiles number at least half the SMs (13824 x 2560 at
 * M = 48: 11.3 us against 19.7 for mma rows). */
static bool tiles_192x64_half(const gemm_shape *s)
{
    return tiles_of(s, 192, 64) * 2 >= s->sms;
}

/* ... at most the SMs: one wave of tiles three quarters of 128 x 128's
 * work, on more SMs (2560 x 2560 at M = 512: 10.5-11.0 us against 13.2). */
static bool tiles_192x64_one_wave(const gemm_shape *s)
{
    return tiles_of(s, 192, 64) <= s->sms;
}

/* The 192 x 64 tiles, each shared by a cluster of 2 blocks, still fit
 * one wave: whole tiles would leave most SMs idle (2560 x 6912 at M = 256,
 * 56 tiles: 15.2 us against 20.5; 2560 x 2560 9.9 against 10.8; 3840 x
 * 2560 at M = 128 9.2 against 10.0). */
static bool tiles_192x64_split2(const gemm_shape *s) { return tiles_of(s, 192, 64) * 2 <= s->sms; }

/* ... by 4 blocks, on rows long enough that a quarter of the k-tiles
 * outweighs two rounds of adding (2560 x 6912 at M = 128: 13.1 us against
 * 16.7 for mma rows; 2560 x 2560 at 128 stays with mma rows, 8.6 against
 * 10.5). */
static bool tiles_192x64_split4(const gemm_shape *s)
{
    return tiles_of(s, 192, 64) * 4 <= s->sms && s->k >= 4096;
}

/* The 256 x 128 tiles fill three quarters of the SMs: one wave of the
 * widest tiles beats two of narrower ones (13824 x 2560 at M = 256, 108
 * tiles on 132 SMs: 18.4 us against 26.6 for 192 x 128 and 24.9 for
 * 128 x 128). */
static bool tiles_256x128_most(const gemm_shape *s)
{
    return tiles_of(s, 256, 128) * 4 >= s->sms * 3;
}

static bool tiles_192x128_fill(const gemm_shape *s)
{
    return tiles_of(s, 192, 128) >= s->sms;
}

static bool tiles_128x128_64(const gemm_shape *s)
{
    return tiles_of(s, 128, 128) >= 64;
}

/* The 192 x 64 tiles number at most a quarter of the SMs: the mma-rows
 * kernel's many small blocks use the device better over 65-128 rows
 * (2560 x 2560 at M = 128: 8.6 us against 10.8; 2560 x 6912: 16.7
 * against 20.4; at 40 tiles, 3840 x 2560, 11.6 against 9.7). */
static bool tiles_192x64_quarter(const gemm_shape *s)
{
    return tiles_of(s, 192, 64) * 4 <= s->sms;
}

/* The 256 x 64 pipelined tiles number about two an SM or more. */
static bool tiles_256x64_256(const gemm_shape *s)
{
    return tiles_of(s, 256, 64) >= 256;
}

/* ---- the table ------------------------------------------------------------------ */

enum { ANY_DEVICE = 0, WGMMA = 1 };
#define MAX_ROWS INT64_MAX

typedef struct gemm_rule {
    int64_t min_m, max_m;              /* activation rows    */
    int device;                        /* ANY_DEVICE, WGMMA  */
    bool (*when)(const gemm_shape *s); /* the shape test     */
    bn_w2a8_kernel kernel;
} gemm_rule;

static const gemm_rule kRules[] = {
    /* rows         device      shape                   kernel */
    {1, 1,          ANY_DEVICE, always,                 BN_W2A8_GEMV},
    {2, 3,          ANY_DEVICE, small_matrix,           BN_W2A8_ROWS},
    {17, 64,        WGMMA,      tiles_192x64_half,      BN_W2A8_WGMMA_192X64},
    {33, 64,        ANY_DEVICE, k_16384,                BN_W2A8_MMA_ROWS_X4},
    {2, 64,         ANY_DEVICE, many_columns,           BN_W2A8_MMA_ROWS_X4},
    {2, 64,         ANY_DEVICE, always,                 BN_W2A8_MMA_ROWS_X2},
    {65, MAX_ROWS,  WGMMA,      tiles_192x64_split4,    BN_W2A8_WGMMA_192X64_SPLIT4},
    {65, 128,       WGMMA,      tiles_192x64_quarter,   BN_W2A8_MMA_ROWS_X4},
    {65, MAX_ROWS,  WGMMA,      tiles_256x128_most,     BN_W2A8_WGMMA_256X128},
    {65, MAX_ROWS,  WGMMA,      tiles_192x128_fill,     BN_W2A8_WGMMA_192X128},
    {65, MAX_ROWS,  WGMMA,      k_16384,                BN_W2A8_WGMMA_192X128},
    {65, MAX_ROWS,  WGMMA,      tiles_192x64_split2,    BN_W2A8_WGMMA_192X64_SPLIT2},
    {65, MAX_ROWS,  WGMMA,      tiles_192x64_one_wave,  BN_W2A8_WGMMA_192X64},
    {65, MAX_ROWS,  WGMMA,      tiles_128x128_64,       BN_W2A8_WGMMA_128X128},
    {65, MAX_ROWS,  WGMMA,      k_4096,                 BN_W2A8_WGMMA_128X128},
    {65, MAX_ROWS,  ANY_DEVICE, tiles_256x64_256,       BN_W2A8_PIPE},
    {65, MAX_ROWS,  ANY_DEVICE, k_8192,                 BN_W2A8_PIPE_SPLITK},
    {65, MAX_ROWS,  ANY_DEVICE, always,                 BN_W2A8_TILED},
};

/* Stream-K is taken where it spares the busiest SM at least this many
 * k-tiles of 128 (on short tiles it costs 2-4 us: 2560 x 2560 17.8 ->
 * 21.5 us). */
enum { kStreamkMinSaved = 20 };

typedef struct kernel_info {
    const char *name;
    bool wgmma, streamk;
    bn_w2a8_kernel streamk_form; /* the same tiles by stream-K (else itself) */
    int rows, acts;              /* output tile: weight x activation rows    */
} kernel_info;

#define K(name) BN_W2A8_##name
static const kernel_info kKernels[BN_W2A8_KERNELS] = {
    [K(GEMV)] = {"gemv", false, false, K(GEMV), 0, 0},
    [K(ROWS)] = {"gemv rows", false, false, K(ROWS), 0, 0},
    [K(MMA_ROWS_X2)] = {"mma rows x2", false, false, K(MMA_ROWS_X2), 0, 0},
    [K(MMA_ROWS_X4)] = {"mma rows x4", false, false, K(MMA_ROWS_X4), 0, 0},
    [K(TILED)] = {"tiled 64x64", false, false, K(TILED), 64, 64},
    [K(PIPE)] = {"pipe 256x64", false, false, K(PIPE), 256, 64},
    [K(PIPE_SPLITK)] = {"pipe 256x64 split-k", false, false, K(PIPE_SPLITK), 256, 64},
    [K(WGMMA_128X128)] = {"wgmma 128x128", true, false, K(WGMMA_128X128_STREAMK), 128, 128},
    [K(WGMMA_128X128_STREAMK)] = {"wgmma 128x128 stream-k", true, true,
                                  K(WGMMA_128X128_STREAMK), 128, 128},
    [K(WGMMA_192X128)] = {"wgmma 192x128", true, false, K(WGMMA_192X128_STREAMK), 192, 128},
    [K(WGMMA_192X128_STREAMK)] = {"wgmma 192x128 stream-k", true, true,
                                  K(WGMMA_192X128_STREAMK), 192, 128},
    [K(WGMMA_256X128)] = {"wgmma 256x128", true, false, K(WGMMA_256X128), 256, 128},
    [K(WGMMA_192X64)] = {"wgmma 192x64", true, false, K(WGMMA_192X64), 192, 64},
    [K(WGMMA_192X64_SPLIT2)] = {"wgmma 192x64 split 2", true, false,
                                K(WGMMA_192X64_SPLIT2), 192, 64},
    [K(WGMMA_192X64_SPLIT4)] = {"wgmma 192x64 split 4", true, false,
                                K(WGMMA_192X64_SPLIT4), 192, 64},
};
#undef K

/* Whether stream-K over the kernel's tiles saves the busiest SM at least
 * kStreamkMinSaved k-tiles: whole tiles put ceil(tiles / SMs) tiles on it,
 * stream-K an even share of all k-tiles. */
static bool streamk_pays(const gemm_shape *s, bn_w2a8_kernel kernel)
{
    const kernel_info *info = &kKernels[kernel];
    const int64_t tiles = tiles_of(s, info->rows, info->acts);
    const int64_t n_kt = (s->k + 127) / 128, total = tiles * n_kt;
    if (s->sms <= 1 || total <= 0)
        return false;
    const int64_t whole = (tiles + s->sms - 1) / s->sms * n_kt;
    const int64_t even = (total + s->sms - 1) / s->sms;
    return whole - even >= kStreamkMinSaved;
}

bn_w2a8_kernel bn_w2a8_cuda_gemm_pick(int64_t m, int64_t n, int64_t k, int wgmma, int sm_count,
                                      int streamk)
{
    const gemm_shape s = {m < 1 ? 1 : m, n, k, sm_count > 0 ? sm_count : 132};
    for (size_t i = 0; i < sizeof kRules / sizeof kRules[0]; i++) {
        const gemm_rule *r = &kRules[i];
        if (s.m < r->min_m || s.m > r->max_m || (r->device == WGMMA && !wgmma) || !r->when(&s))
            continue;
        const bn_w2a8_kernel form = kKernels[r->kernel].streamk_form;
        return streamk && form != r->kernel && streamk_pays(&s, r->kernel) ? form : r->kernel;
    }
    return BN_W2A8_TILED; /* not reached: the last row takes any shape */
}

cudaError_t bn_w2a8_cuda_gemm_run(const bn_w2a8_cuda_args *a, bn_w2a8_kernel kernel,
                                  cudaStream_t stream)
{
    switch (kernel) {
    case BN_W2A8_GEMV:
        if (a->m != 1)
            return cudaErrorInvalidValue;
        return bn_w2a8_cuda_gemv(a, bn_w2a8_cuda_gemv_split(a->tiles, a->groups, a->sm_count),
                                 stream);
    case BN_W2A8_ROWS: return bn_w2a8_cuda_gemm_rows(a, stream);
    case BN_W2A8_MMA_ROWS_X2: return bn_w2a8_cuda_gemm_mma_rows(a, 2, stream);
    case BN_W2A8_MMA_ROWS_X4: return bn_w2a8_cuda_gemm_mma_rows(a, 4, stream);
    case BN_W2A8_TILED: return bn_w2a8_cuda_gemm_tiled(a, stream);
    case BN_W2A8_PIPE: return bn_w2a8_cuda_gemm_pipelined(a, 1, stream);
    case BN_W2A8_PIPE_SPLITK: return bn_w2a8_cuda_gemm_pipelined(a, 0, stream);
    case BN_W2A8_WGMMA_128X128:
    case BN_W2A8_WGMMA_128X128_STREAMK:
    case BN_W2A8_WGMMA_192X128:
    case BN_W2A8_WGMMA_192X128_STREAMK:
    case BN_W2A8_WGMMA_256X128:
    case BN_W2A8_WGMMA_192X64:
    case BN_W2A8_WGMMA_192X64_SPLIT2:
    case BN_W2A8_WGMMA_192X64_SPLIT4:
        return bn_w2a8_cuda_gemm_wgmma(a, kernel, stream);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t bn_w2a8_cuda_gemm(const bn_w2a8_cuda_args *a, cudaStream_t stream)
{
    if (a->m <= 0 || a->n <= 0)
        return cudaSuccess;
    const int64_t k = a->groups * BN_CUDA_GROUP; /* the padded row length */
    const bn_w2a8_kernel kernel = bn_w2a8_cuda_gemm_pick(
        a->m, a->n, k, bn_w2a8_cuda_gemm_wgmma_usable(), a->sm_count, a->streamk != NULL);
    const cudaError_t rc = bn_w2a8_cuda_gemm_run(a, kernel, stream);
    /* The wgmma kernels also need the driver's tensor-map encoder; without
     * it (nothing was launched) the table's kernel for a device without
     * wgmma. */
    if (rc == cudaErrorNotSupported && kKernels[kernel].wgmma)
        return bn_w2a8_cuda_gemm_run(a, bn_w2a8_cuda_gemm_pick(a->m, a->n, k, 0, a->sm_count, 0),
                                     stream);
    return rc;
}

int bn_w2a8_cuda_gemm_wgmma_usable(void)
{
    if (!bn_w2a8_cuda_gemm_wgmma_compiled())
        return 0;
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return 0;
    return major == 9 && minor == 0;
}

int bn_w2a8_cuda_gemm_needs_streamk(int64_t m, int64_t n, int64_t k, int sm_count)
{
    return kKernels[bn_w2a8_cuda_gemm_pick(m, n, k, bn_w2a8_cuda_gemm_wgmma_usable(), sm_count,
                                           1)]
        .streamk;
}

static bool known(bn_w2a8_kernel kernel)
{
    return (unsigned)kernel < (unsigned)BN_W2A8_KERNELS;
}

const char *bn_w2a8_cuda_kernel_name(bn_w2a8_kernel kernel)
{
    return known(kernel) ? kKernels[kernel].name : "?";
}

int bn_w2a8_cuda_kernel_wgmma(bn_w2a8_kernel kernel)
{
    return known(kernel) && kKernels[kernel].wgmma;
}

int bn_w2a8_cuda_kernel_streamk(bn_w2a8_kernel kernel)
{
    return known(kernel) && kKernels[kernel].streamk;
}

void bn_w2a8_cuda_gemm_describe(const bn_w2a8_cuda_args *a, bn_w2a8_kernel kernel, char *buf,
                                size_t size)
{
    const int split = kernel == BN_W2A8_PIPE_SPLITK ? bn_w2a8_cuda_gemm_pipelined_split(a, 0) : 1;
    if (split > 1)
        snprintf(buf, size, "%s, k/%d", bn_w2a8_cuda_kernel_name(kernel), split);
    else
        snprintf(buf, size, "%s", bn_w2a8_cuda_kernel_name(kernel));
}
