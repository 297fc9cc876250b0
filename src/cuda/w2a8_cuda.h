/*
 * w2a8_cuda.h - C launchers for the CUDA W2A8 kernels (w2a8_kernels.cu).
 * All pointers are device pointers; launches are asynchronous on `stream`
 * and return the launch error (cudaSuccess when queued).
 */
#ifndef BN_W2A8_CUDA_H
#define BN_W2A8_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bn_w2a8_cuda_args {
    const void *weights;      /* cuda_layout.h packing                     */
    int64_t n;                /* weight rows (outputs)                     */
    int64_t tiles, groups;    /* from bn_cuda_layout                       */
    float weight_scale;
    const int8_t *x;          /* m rows of ldx bytes, zero from k to k_pad */
    int64_t m, ldx;
    const float *act_scale;   /* m scales (127 / absmax)                   */
    const int32_t *act_sum;   /* m sums of the int8 values                 */
    float *y;                 /* y[row * ldy + col]                        */
    int64_t ldy;
    int32_t *workspace;       /* m * n int32 for the skinny GEMM's split-K */
    int sm_count;             /* the device's SMs (sizes split-K)          */
    int cluster;              /* bn_w2a8_cuda_gemv_pdl: 2, 4, 8 or 16 stages
                                 the activations once per cluster of that
                                 many blocks (16, a non-portable size: where
                                 the device holds such clusters, e.g.
                                 bn_w2a8_cuda_gemv_pair_cluster16); 0 or 1
                                 in every block                            */
    int32_t *streamk;         /* bn_w2a8_cuda_gemm_streamk_bytes(sm_count),
                                 zeroed once at allocation (every call
                                 leaves it so); NULL: no stream-K GEMM     */
    int pdl;                  /* non-zero: the warp-specialized wgmma GEMMs
                                 (BN_W2A8_WGMMA_*_TMA*) are launched with
                                 programmatic stream serialization, their
                                 first weight copies issued before waiting
                                 for the kernel before (pdl.cuh); others
                                 ignore it                                 */
    int relu2_pair;           /* bn_w2a8_cuda_gemv_pdl only (M = 1): the
                                 matrix is [gate; up], f rows each with f a
                                 multiple of 8 (n = 2 f); y receives the f
                                 values relu(g_i relu2_sg)^2 (u_i relu2_su),
                                 g and u the products with weight scale 1
                                 (weight_scale unused), each step one fp32
                                 rounding as on the CPU; the activations must
                                 fit shared memory (k_pad <= 160 KiB)      */
    float relu2_sg, relu2_su;
} bn_w2a8_cuda_args;

/* Split-K factor (1, 2, 4 or 8) that fills a GPU of sm_count SMs. */
int bn_w2a8_cuda_gemv_split(int64_t tiles, int64_t groups, int sm_count);
/* M = 1. */
cudaError_t bn_w2a8_cuda_gemv(const bn_w2a8_cuda_args *a, int split, cudaStream_t stream);

/* The decode step's GEMV: as bn_w2a8_cuda_gemv (bit for bit), but each warp
 * loads its first weight entries before waiting for the kernel that wrote
 * the activations (src/cuda/pdl.cuh), and with pdl non-zero it is launched
 * with programmatic stream serialization, so the weight stream starts while
 * that kernel still runs. pdl needs compute capability 9.0 and
 * bn_w2a8_cuda_gemv_pdl_compiled(). */
cudaError_t bn_w2a8_cuda_gemv_pdl(const bn_w2a8_cuda_args *a, int split, int pdl,
                                  cudaStream_t stream);
/* Whether bn_w2a8_cuda_gemv_pdl takes a relu2_pair matrix of n rows in
 * `tiles` tiles of `groups` chunk-groups (w2a8_cuda_args' relu2_pair). */
int bn_w2a8_cuda_gemv_pair_fits(int64_t n, int64_t tiles, int64_t groups);
/* Whether the device can hold that relu2_pair GEMV (a's shape, this split)
 * in clusters of 16 blocks: cluster staging usable and at least one such
 * cluster resident at a time. */
int bn_w2a8_cuda_gemv_pair_cluster16(const bn_w2a8_cuda_args *a, int split);
/* Whether that kernel was compiled with the instructions pdl needs. */
int bn_w2a8_cuda_gemv_pdl_compiled(void);
/* As bn_w2a8_cuda_gemv_pdl (bit for bit), with one tile of 8 rows per
 * block and split warps over its K: the tile's packed weights and the
 * activation row reach shared memory as two bulk copies by the tensor
 * memory accelerator (the weights' before the PDL wait). Needs compute
 * capability 9.0, code built for it and rows of at most
 * BN_W2A8_GEMV_BULK_MAX_SMEM / 3 values (a block holds 3 bytes a column:
 * 8 rows of 2-bit codes and the activation byte; 32768 values);
 * otherwise returns cudaErrorNotSupported and launches nothing.
 * bn_w2a8_cuda_gemv_bulk_usable says which, for the device of the first
 * call (asked once per process) and a's row length. */
#define BN_W2A8_GEMV_BULK_MAX_SMEM (96 * 1024)
cudaError_t bn_w2a8_cuda_gemv_bulk(const bn_w2a8_cuda_args *a, int split, int pdl,
                                   cudaStream_t stream);
int bn_w2a8_cuda_gemv_bulk_usable(const bn_w2a8_cuda_args *a);
/* As bn_w2a8_cuda_gemv_bulk (bit for bit), with several consecutive tiles
 * a block: the grid is about blocks_per_sm blocks per SM (a->sm_count),
 * each copying its tiles by bulk copies (one a tile) before the PDL wait
 * and the activation row once after it. Needs what the bulk GEMV needs and
 * a block's share (at most 32 tiles, their packed bytes plus the row) in
 * BN_W2A8_GEMV_BULK_TILES_MAX_SMEM bytes; otherwise returns
 * cudaErrorNotSupported and launches nothing.
 * bn_w2a8_cuda_gemv_bulk_tiles_per_block gives the tiles a block would
 * take, 0 where it cannot run. */
#define BN_W2A8_GEMV_BULK_TILES_MAX_SMEM (220 * 1024)
cudaError_t bn_w2a8_cuda_gemv_bulk_tiles(const bn_w2a8_cuda_args *a, int blocks_per_sm, int pdl,
                                         cudaStream_t stream);
int bn_w2a8_cuda_gemv_bulk_tiles_per_block(const bn_w2a8_cuda_args *a, int blocks_per_sm);
/* Whether its cluster staging (args.cluster > 1) can run here: a device
 * that launches clusters and the kernel compiled for sm_90. Where it
 * cannot, bn_w2a8_cuda_gemv_pdl stages in every block. Per device of the
 * first call. */
int bn_w2a8_cuda_gemv_cluster_usable(void);

/* GEMV implementation variants, for tests and the benchmark:
 *   0: 2 chunk-groups in flight per warp, activations through L1
 *   1: 4 in flight, activations through L1
 *   2: 4 in flight, activations staged in shared memory
 *   3: 8 in flight, activations through L1
 *   4: as 2, with 2-bit fields masked in place (one logic op per field)
 *   5: bn_w2a8_cuda_gemv_pdl without pdl: as 2, each warp's first 8 (split
 *      8: 4) weight entries loaded before the activations are staged
 *   6, 7, 8: 5 with the activations staged once per cluster of 2, 4, 8
 *      blocks (args.cluster; where clusters are not usable, as 5)
 *   9: bn_w2a8_cuda_gemv_bulk without pdl (where it cannot run, as 5)
 *  10: bn_w2a8_cuda_gemv_bulk_tiles without pdl, `split` blocks an SM
 *      (where it cannot run, as 5) */
#define BN_W2A8_GEMV_VARIANTS 11
#define BN_W2A8_GEMV_DEFAULT_VARIANT 2
cudaError_t bn_w2a8_cuda_gemv_variant(const bn_w2a8_cuda_args *a, int split, int variant,
                                      cudaStream_t stream);
/* M >= 1 on int8 tensor cores (requires compute capability 8.0). */
cudaError_t bn_w2a8_cuda_gemm(const bn_w2a8_cuda_args *a, cudaStream_t stream);

/* GEMM variants: 0 tiled 64 x 64 with weights expanded in shared memory;
 * 1 "skinny": weights straight into tensor-core fragments, activations in
 * 16- or 32-row slices, K split over blocks when a workspace is given;
 * 2 pipelined 64 x 256 (w2a8_gemm_pipelined.cu), split-K chosen for the
 * shape; 3 the same without split-K; 4 pipelined 128 x 256, split-K chosen;
 * 5, 6, 7 wgmma (w2a8_gemm_wgmma.cu; weight rows x activation rows)
 * 256 x 128, 128 x 128 with one warpgroup, 128 x 128 with two; 8 as 7
 * with split-K over a thread-block cluster chosen for the shape
 * (bn_w2a8_cuda_gemm_wgmma_split_factor); 9 as 7 with both wgmma operands
 * in shared memory (weights expanded to int8 there, 1 block per SM); 10
 * warp-specialized and persistent, tensor-memory-accelerator copies
 * (BN_W2A8_WGMMA_128X128_TMA); 11 as 10 with stream-K (needs a->streamk,
 * else cudaErrorInvalidValue); 12 and 13 as 10 and 11 with the weights
 * expanded by the consumers straight into wgmma's A registers
 * (BN_W2A8_WGMMA_128X128_TMA_RS); 14 and 15 as 12 and 13 with 192 weight
 * rows a block; 16 as 12 with 256; 17 as 14 with 64 activation rows a block:
 * 5-17 need compute capability 9.0 and an sm_90a build, else
 * cudaErrorNotSupported. 18 the GEMV's weight stream with each entry
 * dotted with up to 8 activation rows (dp4a; any M, 8 rows a grid row).
 * 19 and 20 the GEMV's weight stream into mma m16n8k32 fragments, 16
 * activation rows a block (any M), 2 (19) or 4 (20) tiles a warp.
 * bn_w2a8_cuda_gemm uses 18 up to BN_W2A8_ROWS_MAX_M rows for matrices of
 * at most BN_W2A8_ROWS_SMALL_WEIGHTS weights; up to BN_W2A8_NARROW_MAX_M
 * rows 19, or 20 where columns of two tiles number at least 8 an SM, except
 * above BN_W2A8_MMA_ROWS_MAX_M rows where wgmma is usable and its 192 x 64
 * tiles number at least half the SMs: there 17; 20 again above
 * BN_W2A8_MMA_ROWS_WIDE_M rows when the rows hold at least
 * BN_W2A8_MMA_ROWS_LONG_K weights and 17 did not apply; beyond, where wgmma is
 * usable, 16 when its 256 x 128 tiles number at least the SMs, else 14
 * when its 192 x 128 tiles do or the rows hold at least
 * BN_W2A8_WGMMA_LONG_K values, else 17 when its 192 x 64 tiles number at
 * most the SMs, else 12 when its 128 x 128 tiles number at least
 * BN_W2A8_WGMMA_WS_MIN_TILES or the rows hold at least
 * BN_W2A8_WGMMA_SHORT_K values; 15 and 13 instead of 14 and 12 when
 * a->streamk is given and stream-K spares the busiest SM at least
 * BN_W2A8_STREAMK_MIN_SAVED k-tiles of 128 (12-17 fall back to 7 where they
 * cannot run); otherwise 3 when the 64 x 256 tiles number at least
 * BN_W2A8_PIPE_MIN_TILES, else 2 for rows of at least
 * BN_W2A8_PIPE_SPLIT_MIN_K, else 0 (bn_w2a8_cuda_gemm_default_variant;
 * measured on an H200 and an H100). No default uses the skinny kernel (1)
 * or a->workspace. */
#define BN_W2A8_GEMM_VARIANTS 21
#define BN_W2A8_ROWS_MAX_M 3
#define BN_W2A8_MMA_ROWS_MAX_M 16
#define BN_W2A8_ROWS_SMALL_WEIGHTS (40ll << 20)
#define BN_W2A8_NARROW_MAX_M 64
#define BN_W2A8_MMA_ROWS_WIDE_M 32
#define BN_W2A8_MMA_ROWS_LONG_K 16384
#define BN_W2A8_WGMMA_SHORT_K 4096
#define BN_W2A8_WGMMA_LONG_K 16384
#define BN_W2A8_WGMMA_WS_MIN_TILES 64
#define BN_W2A8_STREAMK_MIN_SAVED 20
#define BN_W2A8_PIPE_MIN_TILES 256
#define BN_W2A8_PIPE_SPLIT_MIN_K 8192
cudaError_t bn_w2a8_cuda_gemm_variant(const bn_w2a8_cuda_args *a, int variant,
                                      cudaStream_t stream);
/* Whether a GEMM variant is a stream-K one (needs a->streamk; 11, 13, 15).
 * Each runs as the variant before it without the workspace. */
int bn_w2a8_cuda_gemm_variant_streamk(int variant);
/* Whether a GEMM variant honours a->pdl (the warp-specialized ones, 10-17). */
int bn_w2a8_cuda_gemm_variant_pdl(int variant);
/* The variant bn_w2a8_cuda_gemm runs for m rows on a device of sm_count
 * SMs (13 and 15 only with a stream-K workspace), and a short name of a variant
 * with the split-K factor it would use for a (for the benchmark). */
int bn_w2a8_cuda_gemm_default_variant(int64_t m, int64_t n, int64_t k, int wgmma, int sm_count);
/* Whether the wgmma variants (5-17) can run on the current device. */
int bn_w2a8_cuda_gemm_wgmma_usable(void);
void bn_w2a8_cuda_gemm_describe(const bn_w2a8_cuda_args *a, int variant, char *buf, size_t size);

/* The pipelined GEMM (w2a8_gemm_pipelined.cu): tile configuration and
 * split-K factor. split 0 = chosen for the shape and the device; otherwise
 * clamped to 1..BN_W2A8_PIPE_MAX_SPLIT and to the k-tiles (128 each) there
 * are. Split-K runs as a thread-block cluster (compute capability 9.0 and
 * code built for it); elsewhere the split is 1. Needs no workspace. */
enum { BN_W2A8_PIPE_64X256 = 0, BN_W2A8_PIPE_128X256 = 1, BN_W2A8_PIPE_CONFIGS = 2 };
#define BN_W2A8_PIPE_MAX_SPLIT 8
cudaError_t bn_w2a8_cuda_gemm_pipelined(const bn_w2a8_cuda_args *a, int config, int split,
                                        cudaStream_t stream);
/* The split the call above would use. */
int bn_w2a8_cuda_gemm_pipelined_split(const bn_w2a8_cuda_args *a, int config, int split);

/* The wgmma GEMM (w2a8_gemm_wgmma.cu): Hopper warpgroup tensor cores,
 * weights expanded from 2 bits straight into the A registers, activations
 * as the shared-memory B operand. Configurations name weight rows x
 * activation rows per block. Needs compute capability 9.0 and this file
 * built for sm_90a (bn_w2a8_cuda_gemm_wgmma_compiled()); otherwise it
 * returns cudaErrorNotSupported and launches nothing. Needs no workspace
 * but for stream-K (a->streamk). */
enum {
    BN_W2A8_WGMMA_256X128 = 0,     /* 2 warpgroups, 1 block per SM  */
    BN_W2A8_WGMMA_128X128_1WG = 1, /* 1 warpgroup, 2 blocks per SM  */
    BN_W2A8_WGMMA_128X128 = 2,     /* 2 warpgroups, 2 blocks per SM */
    /* As 128X128, with K split over the blocks of a thread-block cluster
     * (partials summed through distributed shared memory; no workspace). */
    BN_W2A8_WGMMA_128X128_SPLITK = 3,
    /* 128 x 128, 2 warpgroups, 1 block per SM, both operands in shared
     * memory: the weights expanded into a swizzled int8 tile there, one
     * wgmma group kept in flight while the next k-tile is expanded. */
    BN_W2A8_WGMMA_128X128_SS = 4,
    /* Warp-specialized and persistent, 128 x 128 tiles: one warp issues
     * tensor-memory-accelerator copies (a tensor map of each operand), two
     * warpgroups expand the weights, two issue wgmma, all through a ring of
     * shared-memory stages (mbarriers between them); 1 block per SM looping
     * over the output tiles. cudaErrorNotSupported as well when the driver
     * cannot encode tensor maps. */
    BN_W2A8_WGMMA_128X128_TMA = 5,
    /* As 128X128_TMA, with the k-tiles of all output tiles shared evenly by
     * one block per SM (stream-K): a tile cut between blocks is summed
     * through a->streamk (int32 partials and a counter per tile; the block
     * completing the count stores it). cudaErrorInvalidValue without it. */
    BN_W2A8_WGMMA_128X128_TMA_STREAMK = 6,
    /* As 128X128_TMA and 128X128_TMA_STREAMK without the expanders: each
     * consumer warpgroup expands its packed weights straight into wgmma's
     * A registers (8 stages of 20 KB, 288 threads). */
    BN_W2A8_WGMMA_128X128_TMA_RS = 7,
    BN_W2A8_WGMMA_128X128_TMA_RS_STREAMK = 8,
    /* As 128X128_TMA_RS and its stream-K with three consumer warpgroups
     * (192 weight rows a block). */
    BN_W2A8_WGMMA_192X128_TMA_RS = 9,
    BN_W2A8_WGMMA_192X128_TMA_RS_STREAMK = 10,
    /* As 128X128_TMA_RS with two 64-row slices per consumer warpgroup (256
     * weight rows a block; whole tiles only). */
    BN_W2A8_WGMMA_256X128_TMA_RS = 11,
    /* As 192X128_TMA_RS with 64 activation rows a block (wgmma n = 64):
     * more, smaller tiles for the shapes whose 128 x 128 tiles leave SMs
     * idle. Whole tiles only. */
    BN_W2A8_WGMMA_192X64_TMA_RS = 12,
    BN_W2A8_WGMMA_CONFIGS = 13
};
#define BN_W2A8_WGMMA_MAX_SPLIT 8
/* Split 0 (or the call without split): chosen for the shape and
 * a->sm_count; otherwise clamped to 1..BN_W2A8_WGMMA_MAX_SPLIT and to the
 * k-tiles (128 each), every slice non-empty. Configurations other than
 * 128X128_SPLITK ignore split. */
cudaError_t bn_w2a8_cuda_gemm_wgmma(const bn_w2a8_cuda_args *a, int config, cudaStream_t stream);
cudaError_t bn_w2a8_cuda_gemm_wgmma_split(const bn_w2a8_cuda_args *a, int config, int split,
                                          cudaStream_t stream);
/* Bytes of the stream-K workspace (a->streamk) for up to sm_count SMs
 * (a->sm_count; 0: 132). */
size_t bn_w2a8_cuda_gemm_streamk_bytes(int sm_count);
/* Walks the stream-K plan (variant 11) of n_tiles output tiles of n_kt
 * k-tiles over grid blocks with the kernel's own partition code and checks
 * what its fixup relies on: every k-tile run once, each block's segments
 * contiguous, every tile counted to n_kt, partial tiles' counters and slots
 * distinct. Host-only; returns 1, or 0 with the reason in why. */
int bn_w2a8_cuda_streamk_plan_check(int64_t n_tiles, int64_t n_kt, int64_t grid, char *why,
                                    size_t size);
/* Checks the wgmma GEMMs' epilogue division (a row's reciprocal computed
 * once, three instructions a value) against __fdiv_rn on `pairs` random
 * (integer, scale) pairs drawn from seed: adds the pairs that differ to
 * *mismatches (device memory). cudaErrorNotSupported without sm_90a code. */
cudaError_t bn_w2a8_cuda_division_check(int64_t pairs, uint64_t seed,
                                        unsigned long long *mismatches, cudaStream_t stream);
/* The split the call above would use (1 for the configurations without). */
int bn_w2a8_cuda_gemm_wgmma_split_factor(const bn_w2a8_cuda_args *a, int config, int split);
int bn_w2a8_cuda_gemm_wgmma_compiled(void);

/* Per-row absmax int8 quantization of m rows of k floats (stride ldx)
 * into q (stride ldq >= k, zero-filled from k to ldq), with scales and
 * sums; bit-identical to bn_quantize_activations_row. */
cudaError_t bn_cuda_quantize_rows(const float *x, int64_t m, int64_t k, int64_t ldx, int8_t *q,
                                  int64_t ldq, float *scale, int32_t *sum, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
