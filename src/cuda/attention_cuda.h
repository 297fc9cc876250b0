/*
 * attention_cuda.h - attention over the fp16 KV cache on the GPU
 * (attention_kernels.cu); the backend's --kv f16.
 *
 * All pointers are device pointers; launches are asynchronous on `stream`
 * and return the launch error (cudaSuccess when queued).
 *
 * KV cache layout. K and V are two separate arrays with the same layout,
 * elements in fp16:
 *
 *     [seq][layer][pos][kv_head][head_dim]
 *
 * i.e. per sequence and layer a [capacity][n_kv_heads][head_dim] block, the
 * K (or V) row of one position for all kv heads contiguous. Launchers take
 * the base of ONE layer of sequence 0 (cache + layer * capacity *
 * n_kv_heads * head_dim); `seq_stride` is the distance between sequences
 * in elements (n_layers times that block, or anything else the caller
 * uses; 0 when there is one sequence). Bases must be 16-byte aligned
 * (cudaMalloc is). The backend writes the cache (its q|k|v kernel).
 *
 * Positions and lengths live in device memory, so a captured CUDA graph
 * can be replayed while the cache grows: update the device integers, replay.
 *
 * Scores: q.k * scale with scale = head_dim^-0.5 (bn_attn_shape.scale <= 0)
 * in fp32, softmax in fp32 with the running maximum subtracted; query head
 * h reads kv head h / (n_heads / n_kv_heads) (GQA).
 */
#ifndef BN_ATTENTION_CUDA_H
#define BN_ATTENTION_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The cache's element type: fp16, the one the kernels read. */
typedef enum bn_kv_type { BN_ATTN_KV_F16 = 0 } bn_kv_type;

typedef struct bn_attn_shape {
    int n_heads;        /* query heads                                      */
    int n_kv_heads;     /* kv heads; divides n_heads                        */
    int head_dim;       /* 64, 128 or 256                                   */
    int64_t capacity;   /* positions per sequence and layer in the cache    */
    bn_kv_type kv_type; /* BN_ATTN_KV_F16                                   */
    float scale;        /* score scale; <= 0: head_dim^-0.5                 */
} bn_attn_shape;

/* cudaErrorInvalidValue unless the shape is one the kernels handle. */
cudaError_t bn_attn_check_shape(const bn_attn_shape *s);

/* ---- decode: one query token per sequence ------------------------------------
 *
 * Sequence i attends to positions [0, kv_len[i]) of its cache (its own
 * token already in the cache at kv_len[i] - 1); kv_len is a device array,
 * clamped to [0, capacity]; a length of 0 gives an output of zeros.
 *
 * Flash-decoding: the length is cut into ranges of max(ceil(len /
 * splits), 32) positions (computed on the device from kv_len, so one
 * launch configuration serves every length; short lengths use only the
 * first ranges); each block handles one (sequence, kv head, range) and
 * all query heads of that kv head, keeping a running max, sum and
 * unnormalised output per head; a combine kernel merges the non-empty
 * ranges. With splits == 1 the first kernel writes the output directly
 * and no workspace is needed. */
typedef struct bn_attn_decode_args {
    const float *q;        /* n_seq rows of n_heads * head_dim, stride ldq */
    int64_t ldq;
    const void *k_cache;   /* layer base of sequence 0 (see above)        */
    const void *v_cache;
    int64_t seq_stride;    /* elements between sequences' caches          */
    const int32_t *kv_len; /* device: n_seq lengths                       */
    int n_seq;
    float *out;            /* n_seq rows of n_heads * head_dim, stride ldo */
    int64_t ldo;
    int splits;            /* >= 1, from bn_attn_decode_splits            */
    void *workspace;       /* bn_attn_decode_workspace_bytes, or NULL if splits == 1 */
} bn_attn_decode_args;

/* Ranges per (sequence, kv head) that fill a GPU of sm_count SMs (about
 * four blocks per SM) for lengths up to max_kv_len, capped at
 * max_kv_len / 32 and at 256. Fixed for a captured graph, whatever the
 * length at replay. */
int bn_attn_decode_splits(const bn_attn_shape *s, int n_seq, int64_t max_kv_len, int sm_count);
size_t bn_attn_decode_workspace_bytes(const bn_attn_shape *s, int n_seq, int splits);
cudaError_t bn_attn_decode(const bn_attn_shape *s, const bn_attn_decode_args *a,
                           cudaStream_t stream);

/* ---- prefill: n query tokens of one sequence --------------------------------
 *
 * Query row i sits at position *pos0 + i (pos0 a device scalar) and
 * attends, causally, to cache positions [0, *pos0 + i]; the k and v of all
 * n tokens must already be in the cache. Rows whose position would be
 * >= capacity are not written. Flash-attention tiling with an online
 * softmax, by head_dim:
 *
 *   64 and 128: tensor cores, mma.sync m16n8k16 in fp16 with fp32
 *     accumulation; a block computes 64 queries of one head against tiles
 *     of 64 keys. Q and the probabilities are split into hi + lo fp16
 *     parts, so the result stays within ~2e-5 * max|v| of a double
 *     reference (see the kernel). H200, 2B-4T heads, 512 queries: 31 us at
 *     pos0 0, 210 us at pos0 3584.
 *   256: fp32 FMA on CUDA cores (the tensor-core kernel's accumulators
 *     would not fit in registers); a block computes 16 queries of one head
 *     against tiles of 32 keys. */
cudaError_t bn_attn_prefill(const bn_attn_shape *s, const float *q, int64_t ldq, int n,
                            const int32_t *pos0, const void *k_cache, const void *v_cache,
                            float *out, int64_t ldo, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
