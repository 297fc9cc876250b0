/*
 * vk_ops.h - the rest of the forward pass on a Vulkan device, each kernel
 * in the CPU backend's arithmetic (cpu_backend.c): causal attention over a
 * paged cache, RMSNorm (the final norm) and the LM head's logits. (RoPE
 * with the KV cache store, the residual adds and the squared-ReLU gate are
 * the W2A8 products' epilogues: vk_w2a8.h.)
 *
 * Exactness: rmsnorm and head give the CPU's
 * floats bit for bit (every expression precise, so nothing is fused into
 * a multiply-add; divisions and square roots correctly rounded through
 * double, shaders/exact_math.glsl). Attention does too except for exp,
 * which is exp in double rounded to float (shaders/exact_math.glsl) where
 * the CPU calls libm's expf; the two agree except where expf is not
 * correctly rounded, so an output may differ by an ulp or so there.
 * The kernels need fp64 (BN_ERR_UNSUPPORTED without).
 *
 * Every *_record function records its dispatches into the sequence opened
 * by bn_vk_begin (at most BN_VK_MAX_DISPATCHES in one) after checking the
 * sizes against its buffers' sizes (BN_ERR_INVALID_ARGUMENT, saying what
 * does not fit); a count of 0 (n, rows, n_rows) records nothing. Indices
 * inside the shaders are 32-bit: an extent past 2^32 floats is refused.
 * Input and output buffers must be distinct unless said otherwise.
 */
#ifndef BN_VK_OPS_H
#define BN_VK_OPS_H

#include "vk_context.h"

typedef struct bn_vk_ops bn_vk_ops; /* the kernels below, built once for a device */

/* BN_ERR_UNSUPPORTED on a device without fp64. */
bn_status bn_vk_ops_create(bn_vk *vk, bn_vk_ops **out, bn_error *err);
/* The same, the split attention's fp64 variant reducing by shared-memory
 * trees even where the device has subgroup arithmetic, as it does where
 * the device has none (tests compare the two). */
bn_status bn_vk_ops_create_trees(bn_vk *vk, bn_vk_ops **out, bn_error *err);
void bn_vk_ops_free(bn_vk *vk, bn_vk_ops *ops);

/* The rows' positions and cache rows. rows_info: int32 [rows][2] =
 * (sequence, position). tables: int32 [n_seq][max_blocks]: position t of
 * sequence s lives at cache row tables[s * max_blocks + t / block_size] *
 * block_size + t % block_size. (One sequence in a flat cache is n_seq 1,
 * block_size = the cache's length, tables = {0}.) n_seq is taken as the
 * tables buffer's size / (4 max_blocks). The kernels check each row's
 * sequence, position and blocks against the tables and the cache, since
 * the host cannot: attention writes NaN for a row that falls outside. */
typedef struct bn_vk_rows {
    bn_vk_buffer *info, *tables;
    int64_t rows;
    int block_size, max_blocks;
} bn_vk_rows;

typedef struct bn_vk_attn_shape {
    int n_head, n_kv, head_dim;
    int64_t cache_rows; /* rows of one layer's K (and V) cache, kv_dim = n_kv * head_dim
                           floats each */
} bn_vk_attn_shape;

/* att[row][h*head_dim ..] = causal attention of q row `row`, head h, over
 * its sequence's positions 0 .. pos (GQA: head h reads kv head h / (n_head
 * / n_kv)), as attention_slot computes it: scores = dot_f32(q, k) * scale
 * with scale = (float)(1.0 / sqrt((double)head_dim)); max over the scores;
 * e_t = exp(score_t - max) summed in position order; inv = 1 / sum; out[i]
 * = sum over t in order of (e_t * inv) * v_t[i]. scratch: at least rows *
 * n_head * scratch_stride floats, scratch_stride >= pos + 1 of every row
 * (the backend passes its cache length); a row with pos >= scratch_stride
 * gets NaN. head_dim at most 512. One dispatch (a workgroup a row and
 * head). */
bn_status bn_vk_attention_record(bn_vk *vk, bn_vk_ops *ops, const bn_vk_attn_shape *s,
                                 const bn_vk_rows *r, bn_vk_buffer *q, bn_vk_buffer *k_cache,
                                 bn_vk_buffer *v_cache, int64_t layer_off, bn_vk_buffer *scratch,
                                 int64_t scratch_stride, bn_vk_buffer *att, bn_error *err);

/* The same attention with each row's positions split over workgroups of
 * BN_VK_SPLIT_BLOCK (shaders/attention_split.glsl: a block's scores, their
 * maximum, exp sums and weighted sums; the blocks then merged by the last
 * of a row and head's workgroups to finish), for decode rows, whose one
 * workgroup a row and head above walks every position in turn: the scores
 * are the CPU's bits, the sums grouped by block, so the outputs are the
 * CPU's within roundings. partials: at least
 * bn_vk_attention_split_floats(s, rows, positions) floats, its first rows *
 * n_head 32-bit words (the merge's counters) zero, as each dispatch leaves
 * them; positions more than any row's position (a row past gets NaN). One
 * dispatch. */
#define BN_VK_SPLIT_BLOCK 64
uint64_t bn_vk_attention_split_floats(const bn_vk_attn_shape *s, int64_t rows, int64_t positions);
bn_status bn_vk_attention_split_record(bn_vk *vk, bn_vk_ops *ops, const bn_vk_attn_shape *s,
                                       const bn_vk_rows *r, bn_vk_buffer *q, bn_vk_buffer *k_cache,
                                       bn_vk_buffer *v_cache, int64_t layer_off,
                                       bn_vk_buffer *partials, int64_t positions, bn_vk_buffer *att,
                                       bn_error *err);

/* out[r][i] = w[i] * (x[r][i] * inv) for rows rows of n, inv = 1 /
 * sqrtf((float)(ss / n) + eps), ss the double sum of squares in order i =
 * 0 .. n-1 (the CPU's rmsnorm, bit for bit). out must not be x. */
bn_status bn_vk_rmsnorm_record(bn_vk *vk, bn_vk_ops *ops, bn_vk_buffer *x, bn_vk_buffer *w,
                               bn_vk_buffer *out, int64_t rows, int64_t n, float eps,
                               bn_error *err);

/* logits[r * ld + first + j] = dot_f32(head row first + j, x row r) for j
 * < n_rows, r < rows: head rows of dim values, F32 (one float each) or F16
 * (two halves to a 32-bit word, little end first; dim even), the part of
 * the head in `head` starting at its row `first` being its row 0 (the
 * backend binds a large head in parts, since a buffer may be capped at
 * 128 MiB on some devices); the sum is dot_f32's with the F16 value
 * converted exactly. ld >= first + n_rows. */
typedef enum { BN_VK_HEAD_F32 = 0, BN_VK_HEAD_F16 = 1 } bn_vk_head_type;
bn_status bn_vk_head_record(bn_vk *vk, bn_vk_ops *ops, bn_vk_buffer *head, bn_vk_head_type type,
                            int64_t first, int64_t n_rows, int64_t dim, bn_vk_buffer *x,
                            int64_t rows, bn_vk_buffer *logits, int64_t ld, bn_error *err);

/* picks[i] = the greedy token of logit row first + i (vocab floats a row),
 * i < rows: the largest finite logit, the lowest token among equal ones;
 * a +infinity wins (the lowest such token); NaN and -infinity never; -1
 * where none is left (bn_vk_greedy_pick's rule, the sampler's). One
 * dispatch, a workgroup a row. */
bn_status bn_vk_argmax_record(bn_vk *vk, bn_vk_ops *ops, bn_vk_buffer *logits, int64_t first,
                              int64_t rows, int64_t vocab, bn_vk_buffer *picks, bn_error *err);

#endif
