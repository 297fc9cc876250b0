/*
 * attention_cuda.h - KV cache and attention on the GPU (attention_kernels.cu).
 *
 * All pointers are device pointers; launches are asynchronous on `stream`
 * and return the launch error (cudaSuccess when queued).
 *
 * KV cache layout. K and V are two separate arrays with the same layout,
 * elements in fp16 or bf16 (bn_kv_type, chosen at launch):
 *
 *     [seq][layer][pos][kv_head][head_dim]
 *
 * i.e. per sequence and layer a [capacity][n_kv_heads][head_dim] block, the
 * K (or V) row of one position for all kv heads contiguous. Launchers take
 * the base of ONE layer of sequence 0 (cache + layer * layer_stride, see
 * bn_attn_kv_index); `seq_stride` is the distance between sequences in
 * elements (n_layers * bn_attn_layer_elems, or anything else the caller
 * uses; 0 when there is one sequence). Bases must be 16-byte aligned
 * (cudaMalloc is).
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

typedef enum bn_kv_type { BN_ATTN_KV_F16 = 0, BN_ATTN_KV_BF16 = 1 } bn_kv_type;

typedef struct bn_attn_shape {
    int n_heads;        /* query heads                                      */
    int n_kv_heads;     /* kv heads; divides n_heads                        */
    int head_dim;       /* 64, 128 or 256                                   */
    int64_t capacity;   /* positions per sequence and layer in the cache    */
    bn_kv_type kv_type; /* element type of the cache                        */
    float scale;        /* score scale; <= 0: head_dim^-0.5                 */
} bn_attn_shape;

/* Elements of one layer of one sequence: capacity * n_kv_heads * head_dim. */
static inline int64_t bn_attn_layer_elems(const bn_attn_shape *s)
{
    return s->capacity * s->n_kv_heads * s->head_dim;
}

/* Element index of (seq, layer, pos, kv_head, dim) in a cache of n_layers. */
static inline int64_t bn_attn_kv_index(const bn_attn_shape *s, int n_layers, int64_t seq,
                                       int layer, int64_t pos, int kv_head, int dim)
{
    return ((seq * n_layers + layer) * s->capacity + pos) * s->n_kv_heads * s->head_dim +
           (int64_t)kv_head * s->head_dim + dim;
}

/* cudaErrorInvalidValue unless the shape is one the kernels handle. */
cudaError_t bn_attn_check_shape(const bn_attn_shape *s);

/* Writes n_tokens rows of k and v (fp32, row t at k + t * ldkv, holding
 * n_kv_heads * head_dim values) into the cache, converted to kv_type
 * (round to nearest even), row t at position pos[t] of sequence seq[t]
 * (seq NULL: sequence 0). pos and seq are device arrays; a row whose
 * position is outside [0, capacity) is skipped, never written out of
 * bounds. */
cudaError_t bn_attn_kv_append(const bn_attn_shape *s, const float *k, const float *v,
                              int64_t ldkv, int n_tokens, const int32_t *pos,
                              const int32_t *seq, void *k_cache, void *v_cache,
                              int64_t seq_stride, cudaStream_t stream);

/* ---- decode: one query token per sequence ------------------------------------
 *
 * Sequence i attends to positions [0, kv_len[i]) of its cache (its own
 * token already appended at kv_len[i] - 1); kv_len is a device array,
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
 * n tokens must already be appended. Rows whose position would be
 * >= capacity are not written. Flash-attention tiling with an online
 * softmax, in one of two implementations:
 *
 *   BN_ATTN_PREFILL_MMA (default for head_dim 64 and 128): tensor cores,
 *     mma.sync m16n8k16 in the cache's type with fp32 accumulation; a
 *     block computes 64 queries of one head against tiles of 64 keys. Q
 *     and the probabilities are split into hi + lo parts of the cache's
 *     type, so the result stays within ~2e-5 * max|v| of a double
 *     reference (see the kernel). H200, 2B-4T heads, 512 queries: 31 us at
 *     pos0 0, 210 us at pos0 3584 (the FMA kernel: 201 us, 1.9 ms).
 *   BN_ATTN_PREFILL_FMA (head_dim 256, and a reference for tests): fp32
 *     FMA on CUDA cores; a block computes 16 queries of one head against
 *     tiles of 32 keys. */
#define BN_ATTN_PREFILL_FMA 0
#define BN_ATTN_PREFILL_MMA 1

cudaError_t bn_attn_prefill(const bn_attn_shape *s, const float *q, int64_t ldq, int n,
                            const int32_t *pos0, const void *k_cache, const void *v_cache,
                            float *out, int64_t ldo, cudaStream_t stream);
/* One implementation explicitly (MMA: head_dim <= 128 only). */
cudaError_t bn_attn_prefill_variant(const bn_attn_shape *s, const float *q, int64_t ldq, int n,
                                    const int32_t *pos0, const void *k_cache,
                                    const void *v_cache, float *out, int64_t ldo, int variant,
                                    cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
