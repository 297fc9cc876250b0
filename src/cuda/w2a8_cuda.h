/*
 * w2a8_cuda.h - the CUDA W2A8 kernels: ternary weights in the tile layout of
 * cuda_layout.h times int8 activation rows, bit-identical to the CPU
 * reference (every kernel sums code * x exactly in int32 and applies
 * bn_w2a8_epilogue's float steps).
 *
 * bn_w2a8_cuda_gemm runs M rows through the kernel that the table of
 * w2a8_select.c picks for the rows, the shape and the device. The decode
 * step calls the M = 1 GEMV itself (bn_w2a8_cuda_gemv_pdl) for its launch
 * options. Pointers are device pointers; launches are asynchronous on
 * `stream` and return the launch error (cudaSuccess when queued). Forms
 * the library does not ship are labs in dev/cuda/.
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
    int sm_count;             /* the device's SMs (sizes grids and splits) */
    int cluster;              /* bn_w2a8_cuda_gemv_pdl: 2, 4, 8 or 16 stages
                                 the activations once per cluster of that
                                 many blocks (16, a non-portable size: where
                                 the device holds such clusters, e.g.
                                 bn_w2a8_cuda_gemv_pair_cluster16); 0 or 1
                                 in every block                            */
    int32_t *streamk;         /* bn_w2a8_cuda_gemm_streamk_bytes(sm_count),
                                 zeroed once at allocation (every call
                                 leaves it so); NULL: no stream-K GEMM     */
    int pdl;                  /* non-zero: the wgmma and mma-rows GEMMs are
                                 launched with programmatic stream
                                 serialization, their first weight loads
                                 issued before waiting for the kernel
                                 before (pdl.cuh); the other GEMMs ignore
                                 it                                        */
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

/* ---- M = 1: the GEMV (w2a8_gemv.cu) ----------------------------------------
 *
 * A warp streams a tile's 512-byte chunk-groups (8 rows x 256 weights, 16
 * bytes a lane); a tile's K is split over `split` warps (1, 2, 4 or 8). */

/* Split-K factor (1, 2, 4 or 8) that fills a GPU of sm_count SMs. */
int bn_w2a8_cuda_gemv_split(int64_t tiles, int64_t groups, int sm_count);
/* y = W x for one row, the row staged in shared memory (read through L1
 * where it is longer than 160 KiB). */
cudaError_t bn_w2a8_cuda_gemv(const bn_w2a8_cuda_args *a, int split, cudaStream_t stream);

/* The decode step's GEMV: as bn_w2a8_cuda_gemv (bit for bit), but each warp
 * loads its first weight entries before waiting for the kernel that wrote
 * the activations (src/cuda/pdl.cuh), and with pdl non-zero it is launched
 * with programmatic stream serialization, so the weight stream starts while
 * that kernel still runs. pdl needs compute capability 9.0 and
 * bn_w2a8_cuda_gemv_pdl_compiled(). a->cluster and a->relu2_pair choose
 * its staging and its epilogue (bn_w2a8_cuda_args). */
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
/* Whether its cluster staging (args.cluster > 1) can run here: a device
 * that launches clusters and the kernel compiled for sm_90. Where it
 * cannot, bn_w2a8_cuda_gemv_pdl stages in every block. Per device of the
 * first call. */
int bn_w2a8_cuda_gemv_cluster_usable(void);

/* ---- Any M: the kernel table (w2a8_select.c) -------------------------------
 *
 * The kernels bn_w2a8_cuda_gemm may run (weight rows x activation rows for
 * the tiled ones). The table in w2a8_select.c picks one from the rows M,
 * the shape N x K and the device (wgmma needs compute capability 9.0 and
 * sm_90a code, bn_w2a8_cuda_gemm_wgmma_usable; every other kernel runs from
 * compute capability 8.0). */
typedef enum bn_w2a8_kernel {
    BN_W2A8_GEMV = 0,             /* M = 1: bn_w2a8_cuda_gemv                */
    BN_W2A8_ROWS,                 /* the GEMV's weight stream, each entry
                                     dotted (dp4a) with up to 8 rows         */
    BN_W2A8_MMA_ROWS_X2,          /* the weight stream into mma.m16n8k32
                                     fragments, 16 rows a block, 2 tiles a
                                     warp (w2a8_gemm_rows.cu)                */
    BN_W2A8_MMA_ROWS_X4,          /* as X2, 4 tiles a warp                   */
    BN_W2A8_TILED,                /* 64 x 64 tiles, mma.sync, no pipeline    */
    BN_W2A8_PIPE,                 /* 256 x 64, cp.async pipeline, mma.sync
                                     (w2a8_gemm_pipelined.cu)                */
    BN_W2A8_PIPE_SPLITK,          /* as PIPE, K split over a cluster as the
                                     shape and the device allow              */
    BN_W2A8_WGMMA_128X128,        /* warp-specialized persistent wgmma
                                     (w2a8_gemm_wgmma.cu)                    */
    BN_W2A8_WGMMA_128X128_STREAMK, /* as 128X128, stream-K (a->streamk)      */
    BN_W2A8_WGMMA_192X128,        /* three consumer warpgroups               */
    BN_W2A8_WGMMA_192X128_STREAMK, /* as 192X128, stream-K (a->streamk)      */
    BN_W2A8_WGMMA_256X128,        /* two consumers of two 64-row slices      */
    BN_W2A8_WGMMA_192X64,         /* three consumers, 64 activation rows     */
    BN_W2A8_WGMMA_192X64_SPLIT2,  /* as 192X64, each tile's k-tiles shared
                                     by a cluster of 2 blocks                */
    BN_W2A8_WGMMA_192X64_SPLIT4,  /* ... by a cluster of 4                   */
    BN_W2A8_KERNELS
} bn_w2a8_kernel;

/* y = W x for a->m rows through the table's kernel: a stream-K one only
 * with a->streamk; where a wgmma kernel cannot run (cudaErrorNotSupported:
 * no tensor-map encoder in the driver), the kernel the table picks without
 * wgmma. */
cudaError_t bn_w2a8_cuda_gemm(const bn_w2a8_cuda_args *a, cudaStream_t stream);
/* The table's kernel for m rows of an n x k matrix (k padded) on a device
 * of sm_count SMs (0: 132), with wgmma usable or not and a stream-K
 * workspace available or not. */
bn_w2a8_kernel bn_w2a8_cuda_gemm_pick(int64_t m, int64_t n, int64_t k, int wgmma, int sm_count,
                                      int streamk);
/* Runs that kernel explicitly (tests, the benchmark): cudaErrorNotSupported
 * where it cannot run here (wgmma), cudaErrorInvalidValue for the GEMV with
 * m != 1 and for stream-K without a->streamk. */
cudaError_t bn_w2a8_cuda_gemm_run(const bn_w2a8_cuda_args *a, bn_w2a8_kernel kernel,
                                  cudaStream_t stream);
/* Whether the prefill of m-row chunks over an n x k matrix runs a stream-K
 * kernel on the current device, so needs a->streamk. */
int bn_w2a8_cuda_gemm_needs_streamk(int64_t m, int64_t n, int64_t k, int sm_count);
/* Properties of a kernel: its name (e.g. "wgmma 192x64"); whether it needs
 * wgmma; whether it is a stream-K one; the name with the split-K factor it
 * takes for a (for the benchmark's table). */
const char *bn_w2a8_cuda_kernel_name(bn_w2a8_kernel kernel);
int bn_w2a8_cuda_kernel_wgmma(bn_w2a8_kernel kernel);
int bn_w2a8_cuda_kernel_streamk(bn_w2a8_kernel kernel);
void bn_w2a8_cuda_gemm_describe(const bn_w2a8_cuda_args *a, bn_w2a8_kernel kernel, char *buf,
                                size_t size);
/* Whether the wgmma kernels can run on the current device: sm_90a code and
 * a compute capability 9.0 device. */
int bn_w2a8_cuda_gemm_wgmma_usable(void);

/* ---- The kernels the table runs ----------------------------------------- */

/* w2a8_gemm_rows.cu: BN_W2A8_ROWS (at the GEMV's K split) and
 * BN_W2A8_MMA_ROWS_X2 / X4 (tiles_per_warp 2 or 4; the K split the largest
 * whose grid runs in one wave). Any M; 16-byte aligned activation rows. */
cudaError_t bn_w2a8_cuda_gemm_rows(const bn_w2a8_cuda_args *a, cudaStream_t stream);
cudaError_t bn_w2a8_cuda_gemm_mma_rows(const bn_w2a8_cuda_args *a, int tiles_per_warp,
                                       cudaStream_t stream);

/* w2a8_gemm_sums.cu: the product of 49-64 rows as exact int32 sums
 * (sum code * x, before the epilogue) added into sums[row * ld_sums + col]
 * (col < n), which must hold zeros or earlier sums; whoever reads them
 * applies the epilogue and zeroes them (bn_cb_add_sums_norm_quantize). K is
 * split over blocks that meet in those adds. sm_90 code only; _fits says
 * whether it takes the shape (n a multiple of 4, at most 8 chunk-groups a
 * split) on this build, else the call returns cudaErrorNotSupported and
 * launches nothing. sums 16-byte aligned, ld_sums a multiple of 4. */
#define BN_W2A8_SUMS_MAX_ROWS 64 /* rows an accumulator of sums holds */
int bn_w2a8_cuda_gemm_add_sums_fits(int64_t m, int64_t n, int64_t groups, int sm_count);
cudaError_t bn_w2a8_cuda_gemm_add_sums(const bn_w2a8_cuda_args *a, int32_t *sums, int64_t ld_sums,
                                       cudaStream_t stream);

/* The q|k|v product of rows of many sequences with its epilogue (the
 * batched pass's bn_cb_qkv_post_slots, w2a8_gemm_rows.cu): the mma-rows x2
 * GEMM whose warps hold the two halves of a head's rotation pairs (tiles t
 * and t + head_dim / 16 of a head), so each output goes straight to its
 * place: q (fp32, its scale and RoPE), k (scale, RoPE) and v (scale) into
 * the cache row slot[r] (none where it is negative or past capacity). The
 * values are those of the GEMM followed by bn_cb_qkv_post_slots bit for
 * bit. Positions must lie inside the RoPE table (rows whose position does
 * not: q NaN, k and v not stored). */
typedef struct bn_w2a8_qkv_out {
    int n_heads, n_kv_heads, head_dim;
    int rope_dim;            /* head_dim, or 0: no rotation                */
    float scale_q, scale_k, scale_v;
    const float *rope_table; /* [table_len][rope_dim / 2] (cos, sin) pairs */
    int64_t table_len;
    const int32_t *pos;      /* m positions                                */
    const int32_t *slot;     /* m cache rows                               */
    float *q;                /* m rows of n_heads x head_dim, ldq apart    */
    int64_t ldq;
    void *k_cache, *v_cache; /* [capacity][n_kv_heads x head_dim]          */
    int64_t capacity;
    int kv;                  /* the caches' element, BN_CB_KV_*            */
} bn_w2a8_qkv_out;

/* y is not written (a->y unused). It takes a where the table's kernel for
 * it is mma rows x2 (with or without a stream-K workspace), n = (n_heads +
 * 2 n_kv_heads) head_dim, head_dim a multiple of 16 and rope_dim 0 or
 * head_dim; elsewhere cudaErrorNotSupported, nothing launched (the caller
 * then runs the GEMM and bn_cb_qkv_post_slots). */
cudaError_t bn_w2a8_cuda_gemm_qkv(const bn_w2a8_cuda_args *a, const bn_w2a8_qkv_out *o,
                                  cudaStream_t stream);

/* w2a8_gemm_pipelined.cu: BN_W2A8_TILED; BN_W2A8_PIPE (split 1) and
 * BN_W2A8_PIPE_SPLITK (split 0: chosen for the shape and the device).
 * Otherwise split is clamped to 1..BN_W2A8_PIPE_MAX_SPLIT and to the
 * k-tiles (128 each); split-K runs as a thread-block cluster (compute
 * capability 9.0 and code built for it), elsewhere the split is 1. */
#define BN_W2A8_PIPE_MAX_SPLIT 8
cudaError_t bn_w2a8_cuda_gemm_tiled(const bn_w2a8_cuda_args *a, cudaStream_t stream);
cudaError_t bn_w2a8_cuda_gemm_pipelined(const bn_w2a8_cuda_args *a, int split,
                                        cudaStream_t stream);
/* The split the call above would use. */
int bn_w2a8_cuda_gemm_pipelined_split(const bn_w2a8_cuda_args *a, int split);

/* w2a8_gemm_wgmma.cu: the BN_W2A8_WGMMA_* kernels. Need compute capability
 * 9.0 and this file built for sm_90a (bn_w2a8_cuda_gemm_wgmma_compiled())
 * and the driver's tensor-map encoder; otherwise cudaErrorNotSupported,
 * nothing launched. The stream-K ones need a->streamk, else
 * cudaErrorInvalidValue. */
cudaError_t bn_w2a8_cuda_gemm_wgmma(const bn_w2a8_cuda_args *a, bn_w2a8_kernel kernel,
                                    cudaStream_t stream);
int bn_w2a8_cuda_gemm_wgmma_compiled(void);
/* Bytes of the stream-K workspace (a->streamk) for up to sm_count SMs
 * (a->sm_count; 0: 132). */
size_t bn_w2a8_cuda_gemm_streamk_bytes(int sm_count);
/* Walks the stream-K plan of n_tiles output tiles of n_kt k-tiles over
 * grid blocks with the kernel's own partition code and checks what its
 * fixup relies on: every k-tile run once, each block's segments
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

/* ---- Activations (w2a8_quantize.cu) ------------------------------------- */

/* Per-row absmax int8 quantization of m rows of k floats (stride ldx)
 * into q (stride ldq >= k, zero-filled from k to ldq), with scales and
 * sums; bit-identical to bn_quantize_activations_row. */
cudaError_t bn_cuda_quantize_rows(const float *x, int64_t m, int64_t k, int64_t ldx, int8_t *q,
                                  int64_t ldq, float *scale, int32_t *sum, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
