/*
 * cuda_backend_kernels.h - the kernels the CUDA backend adds to the shared
 * ones (ops_cuda.h, attention_cuda.h, w2a8_cuda.h): the glue between the
 * W2A8 products, written so that the GPU forward pass makes the same int8
 * rounding decisions as the CPU backend (src/cpu/cpu_backend.c), an fp32
 * KV cache with its attention, and an LM head that keeps x in fp32. By
 * file:
 *
 *   norm_quantize.cu   RMSNorm + int8 of every row source, the output norm
 *   rope_qkv.cu        the RoPE table; scales + RoPE + KV store (rope.cuh)
 *   attn_decode.cu     the decode step's attention over the fp32 cache, its
 *                      q|k|v epilogue inside (attn_decode_block.cuh)
 *   attn_prefill.cu    prefill attention over the fp32 cache (with
 *                      attn_prefill_tiled.cu)
 *   lm_head.cu         the full LM head; head_screen.cu the screened one
 *   decode_handoff.cu  the decode step's last kernel: the token handed on
 *
 * All pointers are device pointers; launches are asynchronous on `stream`
 * and return the launch's error (cudaSuccess when queued), or
 * cudaErrorInvalidValue for arguments the kernels cannot honour. Strides
 * (ld*) count elements. Launchers with a `pdl` argument launch with
 * programmatic stream serialization when it is non-zero (src/cuda/pdl.cuh:
 * the kernel may start while the previous one runs and waits for it before
 * touching its results); only where bn_cb_pdl_supported() says so.
 *
 * Numerical contract against the CPU backend:
 *
 *   int8 codes        bit-identical: code_i = rint(127 * (w_i x_i) / max|w x|)
 *                     as evaluated in double, where every product of two
 *                     floats is exact and the maximum does not depend on
 *                     order, so the codes are what exact arithmetic gives -
 *                     the CPU's rule (bn_norm_quantize_row). An fp32 estimate
 *                     decides every code that is not within 2^-12 of a
 *                     rounding boundary (its error is below 3.1e-5, so it
 *                     cannot decide otherwise: the proof is at ExactCoder in
 *                     norm_quantize.cu); the others take the double division. Rows
 *                     whose normed maximum is below 1e-5 or not finite take
 *                     the plain fp32 rule, as on the CPU.
 *   scales            127 / max|w * (x * inv)| in fp32 with inv =
 *                     1 / sqrtf((float)(sum x^2 / n) + eps) and the sum of
 *                     squares in double. Each square is exact in double;
 *                     only the order of the additions differs from the CPU,
 *                     which moves the double sum by ~1e-12 relative and the
 *                     fp32 scale in perhaps one row in 10^5 by one ulp.
 *   residual, gate    bit-identical ((g * g) * u, x + r as single fp32 ops).
 *   RoPE              cos and sin of the fp32 angle (float)pos * inv_freq[j]
 *                     in double, rounded to float: equal to glibc's cosf/sinf
 *                     except where those are off by an ulp. Tabulated once
 *                     per position (bn_cb_rope_table) by the same code.
 *   attention (f32)   fp32 throughout, in a different summation order:
 *                     relative differences of a few 1e-7.
 *   LM head           fp32 x times F16/BF16/F32 rows, fp32 accumulation in
 *                     another order: relative differences of ~1e-6.
 */
#ifndef BN_CUDA_BACKEND_KERNELS_H
#define BN_CUDA_BACKEND_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the decode kernels can run with programmatic dependent launch on
 * this device: compute capability 9.0 or newer and the kernels (these and
 * the W2A8 GEMV) compiled with the instructions it needs (PTX 9.0+). The
 * files' own checks, one kernel standing for each file: */
int bn_cb_pdl_supported(int device);
int bn_cb_rope_pdl_compiled(void);
int bn_cb_attn_decode_pdl_compiled(void);

/* ---- RMSNorm + int8 quantization, three row sources --------------------------
 *
 * Every variant writes, per row r < m: q[r * ldq + i] for i < ldq (zeros from
 * k to ldq), scale[r] = the activation scale and sum[r] = sum of the codes.
 * One block per row: rows up to 8192 values are held in registers (up to
 * 1024 threads, one pass over memory), longer ones are streamed. */

/* v = x. */
cudaError_t bn_cb_norm_quantize(const float *x, int64_t ldx, int64_t m, int64_t k,
                                const float *w, float eps, int8_t *q, int64_t ldq, float *scale,
                                int32_t *sum, int pdl, cudaStream_t stream);

/* v = the rows of the batched pass's paged attention combined from their
 * shares (bn_cb_attn_paged_shares: part, of `splits` splits, n_heads heads
 * of head_dim, row r at position row_pos[r]), bit for bit as the attention
 * with its merge writes them; the attention output itself is not stored.
 * Rows of k = n_heads x head_dim values as the register-held kernel takes
 * them (m up to 256, k up to 8192, a multiple of 4); else
 * cudaErrorNotSupported, and the caller merges and norms apart. */
int bn_cb_merge_norm_fits(const float *part, int n_heads, int head_dim, int64_t m, const float *w,
                          const int8_t *q, int64_t ldq);
cudaError_t bn_cb_merge_norm_quantize(const float *part, int splits, int n_heads, int head_dim,
                                      const int32_t *row_pos, int64_t m, const float *w, float eps,
                                      int8_t *q, int64_t ldq, float *scale, int32_t *sum,
                                      cudaStream_t stream);

/* The decode step's first kernel: v = row *token (device memory) of the
 * embedding table (F32, F16 or BF16 rows of k values, bn_qtype `type`),
 * converted exactly as bn_cuda_embed_rows converts it and stored to x (the
 * residual stream), then normed and coded as bn_cb_norm_quantize codes one
 * row (the same kernel: the same codes, scale and sum): the embedding
 * without a kernel of its own. The table 16-byte aligned; what
 * bn_cb_embed_norm_fits accepts (those types, k % 4 == 0 up to 8192, the
 * lean kernel's alignment of x, w, q and ldq). */
int bn_cb_embed_norm_fits(int type, int64_t k, const float *x, const float *w, const int8_t *q,
                          int64_t ldq);
cudaError_t bn_cb_embed_norm_quantize(const void *table, int type, const int32_t *token,
                                      float *x, int64_t k, const float *w, float eps, int8_t *q,
                                      int64_t ldq, float *scale, int32_t *sum, int pdl,
                                      cudaStream_t stream);

/* x += r first (written back to x), then v = x: the residual add fused with
 * the next norm. */
cudaError_t bn_cb_add_norm_quantize(float *x, int64_t ldx, const float *r, int64_t ldr,
                                    int64_t m, int64_t k, const float *w, float eps, int8_t *q,
                                    int64_t ldq, float *scale, int32_t *sum, int pdl,
                                    cudaStream_t stream);

/* As bn_cb_add_norm_quantize with r the W2A8 product whose int32 sums
 * bn_w2a8_cuda_gemm_add_sums added into sums (row-major, ld_sums apart):
 * r = ((float)(sums - sum[row]) / scale[row]) * sums_w_scale over the codes
 * that product read, the very scale and sum arrays this call then
 * overwrites with the new codes' (each row's block reads its row's before
 * writing them), so x, q, scale and sum are bit for bit those of the GEMM
 * followed by bn_cb_add_norm_quantize; the sums are zeroed. Rows of the
 * lean kernel only (_fits: cudaErrorNotSupported otherwise). */
int bn_cb_add_sums_norm_fits(const float *x, int64_t ldx, const int32_t *sums, int64_t ld_sums,
                             int64_t m, int64_t k, const float *w, const int8_t *q, int64_t ldq);
cudaError_t bn_cb_add_sums_norm_quantize(float *x, int64_t ldx, int32_t *sums, int64_t ld_sums,
                                         float sums_w_scale, int64_t m, int64_t k, const float *w,
                                         float eps, int8_t *q, int64_t ldq, float *scale,
                                         int32_t *sum, int pdl, cudaStream_t stream);

/* v = relu(g * sg)^2 * (u * su): the raw gate and up products (computed with
 * weight scale 1, i.e. acc / act_scale) scaled here, as the CPU's epilogue
 * would have, then the squared-ReLU gate, the ffn_sub_norm and the
 * quantization. g and u rows are ldgu apart. */
cudaError_t bn_cb_relu2_norm_quantize(const float *g, const float *u, int64_t ldgu, float sg,
                                      float su, int64_t m, int64_t k, const float *w, float eps,
                                      int8_t *q, int64_t ldq, float *scale, int32_t *sum, int pdl,
                                      cudaStream_t stream);

/* ---- a norm over rows split across ranks (tensor parallelism) ---------------------
 *
 * The rows' source: x (ldx apart) when x is set, else relu(g * sg)^2 * (u * su)
 * as bn_cb_relu2_norm_quantize reads them. */
typedef struct bn_cb_norm_source {
    const float *x;
    int64_t ldx;
    const float *g, *u;
    int64_t ldgu;
    float sg, su;
} bn_cb_norm_source;

/* This rank's part of each of m rows' statistics over its k columns:
 * stats[2 r] = sum of squares, stats[2 r + 1] = max|w v| (doubles). */
cudaError_t bn_cb_norm_part_stats(const bn_cb_norm_source *src, int64_t m, int64_t k,
                                  const float *w, double *stats, cudaStream_t stream);

/* Codes of this rank's k columns of m rows (of k_total in all) with the
 * statistics of every rank (stats: [ranks][m][2], combined in rank order),
 * as bn_cb_norm_quantize writes them (q zero-filled to ldq, scale, and the
 * sum of this part's codes); the scale's normed maximum is max|w v| times
 * the inverse RMS (within an ulp or two of the whole-row kernels'). */
cudaError_t bn_cb_norm_part_quantize(const bn_cb_norm_source *src, int64_t m, int64_t k,
                                     int64_t k_total, const float *w, float eps,
                                     const double *stats, int ranks, int8_t *q, int64_t ldq,
                                     float *scale, int32_t *sum, cudaStream_t stream);

/* ---- a team's small collectives through peer memory (tp_exchange.cu) ---------------
 *
 * One rank's view of the team's exchange buffers: every rank's two slots of
 * slot_bytes (slots[q], in rank q's memory) and flag words (flags[q]: one
 * per rank, in rank q's memory), all reachable from this rank's GPU (peer
 * access), and this rank's count of exchanges (its own memory). Slots,
 * flags and counts start at zero; every rank must run the same exchanges in
 * the same order. */
#define BN_CB_EXCHANGE_MAX 16
typedef struct bn_cb_exchange {
    int rank, ranks;
    void *slots[BN_CB_EXCHANGE_MAX];
    unsigned long long *flags[BN_CB_EXCHANGE_MAX];
    unsigned long long *count;
    size_t slot_bytes;
} bn_cb_exchange;

/* data[0 .. n) = the sum over the ranks of theirs, added in rank order (the
 * same bits on every rank); n floats must fit a slot. */
cudaError_t bn_cb_exchange_sum(const bn_cb_exchange *x, float *data, int64_t n,
                               cudaStream_t stream);
/* all[q * n + i] = rank q's mine[i] for every rank q; n doubles must fit a
 * slot. mine may be all + rank * n. */
cudaError_t bn_cb_exchange_gather(const bn_cb_exchange *x, const double *mine, double *all,
                                  int64_t n, cudaStream_t stream);

/* x += r (r may be NULL: no add), then y = w * (x * inv) with the CPU's
 * rmsnorm arithmetic (double sum of squares). m rows. */
cudaError_t bn_cb_add_rmsnorm(float *x, int64_t ldx, const float *r, int64_t ldr, int64_t m,
                              int64_t k, const float *w, float eps, float *y, int64_t ldy, int pdl,
                              cudaStream_t stream);

/* ---- RoPE table --------------------------------------------------------------------
 *
 * table[p][j] = (cos, sin) of the angle (float)p * inv_freq[j] for p < n_pos,
 * j < rope_dim / 2, as interleaved floats ([n_pos][rope_dim / 2][2]): what the
 * q|k|v kernels below would compute for position p, bit for bit (the same
 * device code), computed once at load instead of in every layer. */
cudaError_t bn_cb_rope_table(const bn_rope_freqs *freqs, int64_t n_pos, float *table,
                             cudaStream_t stream);

/* The element of a KV cache (the `kv` argument of the functions below that
 * read or write one): fp32 (the CPU's), IEEE half rounded to nearest even,
 * or fp8 e4m3 rounded to nearest even and saturated to +-448 (a byte a
 * value; no NaN is ever stored). The e4m3 cache is the paged cache's only
 * (bn_cb_qkv_post_slots, the paged attention, the tiled prefill over
 * pages). */
enum { BN_CB_KV_F32 = 0, BN_CB_KV_F16 = 1, BN_CB_KV_E4M3 = 2 };

/* Bytes a value of cache element kv. */
static inline size_t bn_cb_kv_bytes(int kv)
{
    return kv == BN_CB_KV_E4M3 ? 1 : kv == BN_CB_KV_F16 ? 2 : 4;
}

/* ---- q, k, v: scale, RoPE, KV cache ---------------------------------------------
 *
 * raw holds m rows of the fused q|k|v product computed with weight scale 1
 * ([n_heads*hd | n_kv*hd | n_kv*hd], ldraw apart). Per row t at position
 * pos[t]: q = raw_q * sq and k = raw_k * sk turned by rotate-half RoPE (the
 * first rope_dim values of each head), v = raw_v * sv. q goes to
 * q_out[t * ldq ...]; k and v to position pos[t] of the layer's cache
 * ([capacity][n_kv*hd] of element kv, BN_CB_KV_F32 or _F16), skipped when
 * the position is outside [0, capacity). cos and
 * sin come from `table` (bn_cb_rope_table, table_len positions; may be NULL
 * with table_len 0) and are computed the same way for positions outside it. */
typedef struct bn_cb_qkv_shape {
    int n_heads, n_kv_heads, head_dim;
    int64_t capacity;
    float scale_q, scale_k, scale_v;
} bn_cb_qkv_shape;

/* The same for rows of many sequences (no PDL): row t's k and v go to
 * cache row slot[t] (a device array; the paged cache, any element kv), its
 * RoPE turns by pos[t]. */
cudaError_t bn_cb_qkv_post_slots(const float *raw, int64_t ldraw, int64_t m,
                                 const bn_cb_qkv_shape *s, const bn_rope_freqs *freqs,
                                 const float *table, int64_t table_len, const int32_t *pos,
                                 const int32_t *slot, float *q_out, int64_t ldq, void *k_cache,
                                 void *v_cache, int kv, cudaStream_t stream);
cudaError_t bn_cb_qkv_post(const float *raw, int64_t ldraw, int64_t m, const bn_cb_qkv_shape *s,
                           const bn_rope_freqs *freqs, const float *table, int64_t table_len,
                           const int32_t *pos, float *q_out, int64_t ldq, void *k_cache,
                           void *v_cache, int kv, int pdl, cudaStream_t stream);

/* ---- attention over an fp32 cache --------------------------------------------
 *
 * Cache layout: one layer is [capacity][n_kv_heads][head_dim] fp32 (the CPU
 * backend's layout); query head h reads kv head h / (n_heads / n_kv_heads).
 * Scores are (q . k) * scale, scale = head_dim^-0.5, softmax in fp32 with
 * the running maximum subtracted. head_dim must be a multiple of 4, at most
 * 256. */
typedef struct bn_cb_attn_shape {
    int n_heads, n_kv_heads, head_dim;
    int64_t capacity;
} bn_cb_attn_shape;

/* Attention of rows of many sequences over the paged cache (attn_paged.cu;
 * element kv: fp32, fp16 or e4m3): row r (sequence row_seq[r], position
 * row_pos[r]) attends to its positions 0..row_pos[r],
 * position t at cache row
 * tables[seq * max_blocks + t / block_size] * block_size + t % block_size
 * (device arrays); out row r gets its heads. With `rows` (a device array,
 * NULL: 0 .. n_rows) only the listed rows are computed. The positions are
 * split into
 * up to `splits` ranges (bn_cb_attn_paged_splits; a row takes those its
 * length needs, about 128 positions each) worked on by blocks of their
 * own, whose shares ws holds (bn_cb_attn_paged_workspace_bytes; NULL with
 * one split). capacity is unused. Head sizes 64 and 128
 * (bn_cb_attn_paged_supports; else cudaErrorNotSupported), at most 32 q
 * heads a kv head.
 *
 * bn_cb_attn_paged_splits: the ranges of a launch of n_rows rows up to
 * max_pos over a cache of element kv; one when the rows' n_rows x
 * n_kv_heads blocks alone reach `resident`, the blocks the device holds at
 * once (bn_cb_attn_paged_resident; 0: no such limit), since more ranges
 * then only add blocks and the merge; over e4m3 no more than keep every
 * block resident at once. */
#define BN_CB_ATTN_PAGED_SHARES 4096 /* rows x splits the workspace holds */
int bn_cb_attn_paged_splits(int n_rows, int max_pos, int n_kv_heads, int resident, int kv);
int bn_cb_attn_paged_resident(const bn_cb_attn_shape *s, int kv, int sm_count);
size_t bn_cb_attn_paged_workspace_bytes(int n_heads, int head_dim);
cudaError_t bn_cb_attn_paged(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n_rows,
                             const int32_t *row_seq, const int32_t *row_pos, const int32_t *tables,
                             int max_blocks, int block_size, const void *k_cache,
                             const void *v_cache, int kv, int splits, const int32_t *rows,
                             float *out, int64_t ldo, float *ws, cudaStream_t stream);
int bn_cb_attn_paged_supports(int head_dim);
/* The same with every row listed (rows NULL) and at least two splits,
 * leaving the shares in ws for bn_cb_merge_norm_quantize instead of
 * merging them into an output. */
cudaError_t bn_cb_attn_paged_shares(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                    int n_rows, const int32_t *row_seq, const int32_t *row_pos,
                                    const int32_t *tables, int max_blocks, int block_size,
                                    const void *k_cache, const void *v_cache, int kv, int splits,
                                    float *ws, cudaStream_t stream);

/* Ranges for a cache of `capacity` positions (one 40-position tile each at
 * the full length, at most 64), and the workspace they need. */
int bn_cb_attn_decode_splits(int64_t capacity);
size_t bn_cb_attn_decode_workspace_bytes(const bn_cb_attn_shape *s, int splits);

/* Decode: one token, its q|k|v epilogue fused with its attention. */
typedef struct bn_cb_attn_decode_args {
    const float *qkv;        /* the raw q|k|v row (weight scale 1), as bn_cb_qkv_post's  */
    float scale_q, scale_k, scale_v;
    const float *rope;       /* bn_cb_rope_table of >= capacity positions; NULL when
                                rope_dim == 0                                             */
    int rope_dim;
    const int32_t *pos;      /* device int: the token's position p                        */
    float *k_cache, *v_cache;
    int splits;              /* from bn_cb_attn_decode_splits                             */
    float *workspace;        /* bn_cb_attn_decode_workspace_bytes                         */
    unsigned int *counters;  /* n_heads, zero before the first launch; left zero after   */
    float *out;              /* n_heads * head_dim                                        */
    int cluster;             /* 0: ranges merged through workspace and counters; 2, 4, 8
                                or 16: clusters of that many blocks (see below; splits,
                                workspace and counters unused)                            */
    const float *next_k_cache, *next_v_cache; /* NULL, or the next layer's cache: its
                                rows before p are prefetched into L2 (sm_90), so that
                                the next layer's attention finds them there           */
    /* Optional, clusters only (after bn_cb_attn_decode_qkv_prepare succeeded for
     * this shape, cluster size and w_k): the q|k|v product inside the kernel.
     * w_qkv: the q, k and v weights stacked in cuda_layout.h's tile layout
     * (rows n_heads hd + 2 n_kv_heads hd, w_k columns); xq, act_scale, act_sum:
     * the normed row's int8 codes (w_k padded to 256, zeros past w_k), scale and
     * code sum. The raw values are what the W2A8 GEMV with weight scale 1
     * writes, bit for bit; qkv is then unused. */
    const uint8_t *w_qkv;
    int64_t w_k;
    const int8_t *xq;
    const float *act_scale;
    const int32_t *act_sum;
} bn_cb_attn_decode_args;

/* The token at position p (0 <= p < capacity; otherwise out is zeros and
 * nothing is stored): q, k and v from its raw product exactly as
 * bn_cb_qkv_post computes them; k and v stored at position p of the cache;
 * q against positions [0, p] (p's own k and v taken from registers) into
 * out. Positions before p must hold earlier tokens' k and v: they may be
 * read before the previous kernel completes (with pdl), so nothing in the
 * same step may write them. The length is cut into `splits` ranges of
 * max(ceil((p + 1) / splits), 32) positions, so one launch configuration
 * serves every position (CUDA graphs); a block takes up to 4 query heads
 * of one kv head over one range (each cache row read once for them). A
 * length of one range is written directly; otherwise the block that
 * finishes a column's ranges last merges them (in an order fixed by the
 * length: the result does not depend on which block that is). With
 * a->cluster set, the ranges are a cluster's tiles instead (below). */
cudaError_t bn_cb_attn_decode(const bn_cb_attn_shape *s, const bn_cb_attn_decode_args *a,
                              int pdl, cudaStream_t stream);

/* The cluster size for bn_cb_attn_decode on the current device: the largest
 * of 16, 8, 4, 2, no larger than cap where cap > 0, at which every block
 * column's cluster can be resident at once, or 0 where the device or the
 * build has no thread-block clusters (compute capability 9.0 and sm_90
 * code). Host only; call outside graph capture (it sets the kernel's
 * non-portable cluster attribute).
 *
 * With a cluster size C the C blocks of a column form one cluster: block r
 * takes the 40-position tiles r, r + C, ... of the length and the blocks
 * merge through distributed shared memory after a cluster barrier, in an
 * order fixed by C (no workspace, no counters, no last block). */
int bn_cb_attn_decode_cluster(const bn_cb_attn_shape *s, int cap);

/* Whether the cluster kernel can compute the q|k|v product itself for this
 * shape, cluster size and w_k (head_dim % 8 == 0, its shared memory: the
 * block's weight tiles, 40 KB for the 2B-4T shape in clusters of 8, and
 * every column's cluster resident at once): cudaSuccess, else
 * cudaErrorNotSupported (or the error of a query). Sets the kernel's
 * shared-memory attribute: host only, outside graph capture. */
cudaError_t bn_cb_attn_decode_qkv_prepare(const bn_cb_attn_shape *s, int cluster, int64_t w_k);

/* The tiled kernel (below) can split each row block's cache positions into
 * up to BN_CB_PREFILL_MAX_PARTS ranges, one block each, whose partial
 * softmaxes a second kernel merges, so that the row blocks that see the
 * most positions (the last ones of a first chunk, every one of a short
 * chunk after a long context) do not set the time alone. The workspace that
 * takes: 16-byte aligned, this many bytes (0 for one part). */
#define BN_CB_PREFILL_MAX_PARTS 8
size_t bn_cb_attn_prefill_workspace_bytes(const bn_cb_attn_shape *s, int n, int parts);

/* The parts bn_cb_attn_prefill should use for n rows whose last row sees
 * `visible` cache positions, on a GPU of sm_count SMs, with ws_bytes of
 * workspace at hand: 1, 2, 4 or 8 (1 where the tiled kernel does not take
 * the head size). Host only. */
int bn_cb_attn_prefill_parts(const bn_cb_attn_shape *s, int n, int64_t visible, int sm_count,
                             size_t ws_bytes);

/* n query rows (q rows ldq apart, row i at position pos[i], a device array)
 * against cache positions [0, pos[i]] (causal; the k and v of the rows
 * themselves already appended). out rows ldo apart; rows whose position is
 * negative or outside the cache are not written. Runs the register-tiled
 * kernel (attn_prefill_tiled.cu) in `parts` parts (with ws, ws_bytes as for
 * bn_cb_attn_prefill_tiled) where it supports the shape, else the
 * warp-per-row kernel (which ignores parts and ws). */
cudaError_t bn_cb_attn_prefill(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n,
                               const int32_t *pos, const float *k_cache, const float *v_cache,
                               float *out, int64_t ldo, int parts, void *ws, size_t ws_bytes,
                               cudaStream_t stream);

/* bn_cb_attn_prefill runs the warp-per-row kernel (any head_dim % 4 == 0
 * up to 256) unless the register-tiled one takes the shape (head_dim 64
 * or 128, every pointer 16-byte aligned,
 * ldq and ldo multiples of 4: bn_cb_attn_prefill_tiled_supports; else
 * cudaErrorNotSupported) in `parts` parts (1 to BN_CB_PREFILL_MAX_PARTS;
 * above 1 with a workspace of bn_cb_attn_prefill_workspace_bytes, else
 * cudaErrorInvalidValue). scale: the scores' factor, 1 / sqrt(head_dim) in
 * the model. */
int bn_cb_attn_prefill_tiled_supports(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                      const void *k_cache, const void *v_cache, const float *out,
                                      int64_t ldo);
cudaError_t bn_cb_attn_prefill_tiled(const bn_cb_attn_shape *s, const float *q, int64_t ldq,
                                     int n, const int32_t *pos, const float *k_cache,
                                     const float *v_cache, float scale, float *out, int64_t ldo,
                                     int parts, void *ws, size_t ws_bytes, cudaStream_t stream);

/* The tiled kernel over a paged cache (element kv), for
 * runs of several sequences' consecutive rows in one launch (the batched
 * pass's prompt chunks): row_blocks (a device array, 16-byte aligned) lists n_row_blocks
 * blocks of at most 64 rows of one sequence as (first row, rows, sequence,
 * unused), best heaviest first (the highest positions); position t of a
 * sequence at cache row table[t / block_size] * block_size + t %
 * block_size, its table at tables + seq * max_blocks; capacity bounds the
 * positions. Rows in no block are neither read nor written. n: the rows of
 * q / pos / out the blocks index (the parts' workspace holds n rows).
 * Scale 1 / sqrt(head_dim); otherwise as bn_cb_attn_prefill_tiled. */
cudaError_t bn_cb_attn_prefill_runs(const bn_cb_attn_shape *s, const float *q, int64_t ldq, int n,
                                    const int32_t *pos, const int32_t *row_blocks, int n_row_blocks,
                                    const int32_t *tables, int max_blocks, int block_size,
                                    const void *k_cache, const void *v_cache, int kv, float *out,
                                    int64_t ldo, int parts, void *ws, size_t ws_bytes,
                                    cudaStream_t stream);

/* Allows the dynamic shared memory the prefill kernel needs for head_dim
 * (above 48 KiB for head_dim 256). Call once, outside graph capture. */
cudaError_t bn_cb_attn_prefill_prepare(int head_dim);

/* ---- LM head ---------------------------------------------------------------------
 *
 * logits[r] = sum_i W[r][i] x[i] for r < rows, W row-major [rows][dim] of
 * `type` (BN_CB_HEAD_F32, _F16 or _BF16), x fp32 in device memory; fp32
 * products and sums. */
#define BN_CB_HEAD_F32 0
#define BN_CB_HEAD_F16 1
#define BN_CB_HEAD_BF16 2
/* Widest row: x is kept in shared memory. */
#define BN_CB_HEAD_MAX_DIM (56 * 1024)

/* Allows the dynamic shared memory (dim floats) the head kernel needs;
 * call once, outside graph capture. */
cudaError_t bn_cb_head_prepare(int type, int64_t dim);
cudaError_t bn_cb_head_gemv(const void *w, int type, int64_t rows, int64_t dim, const float *x,
                            float *logits, int sm_count, cudaStream_t stream);

/* ---- the LM head of many rows (rows_head.cu) --------------------------------------
 *
 * The batched pass's head is a 16-bit tensor-core GEMM over every wanted
 * row; its fp32 input rows go in as 16-bit parts whose sum is the row (2
 * for an f16 head, 3 for bf16; an fp32 head takes the rows as they are),
 * each row scaled by a power of two first and its logits scaled back
 * after (bn_cb_rows_combine).
 *
 * bn_cb_rows_head_in: for k < n_rows, v = output_norm(x[lrow[k]] +
 * r[lrow[k]]) (rows of ld floats; w the norm's weights; as
 * bn_cb_add_rmsnorm computes it, x left as it is) into row k's parts: part
 * p of row k at parts + (k * P + p) * dim elements of the form's type (P =
 * bn_cb_rows_head_parts(form)), so that one GEMM over n_rows * P columns
 * gives every part's logits; unscale[k] the row's factor back. With y and
 * factor (both or neither; 16-bit forms only) also y row k = v itself
 * (dim floats, what bn_cb_head_gemv would meet) and factor[k] the bound
 * factor of bn_cb_rows_pick. */
#define BN_CB_ROWS_HEAD_F32 0
#define BN_CB_ROWS_HEAD_F16 1
#define BN_CB_ROWS_HEAD_BF16 2
int bn_cb_rows_head_parts(int form);
cudaError_t bn_cb_rows_head_in(const float *x, const float *r, int64_t ld, int64_t dim,
                               const int32_t *lrow, int64_t n_rows, const float *w, float eps,
                               int form, void *parts, float *unscale, float *y, float *factor,
                               cudaStream_t stream);
/* In place: logits holds n_rows * parts rows of vocab floats (row k * parts
 * + p: part p of row k); afterwards its rows 0 .. n_rows hold
 * (part 0 + part 1 + ..., added in that order) * unscale[k]. */
cudaError_t bn_cb_rows_combine(float *logits, int64_t vocab, int64_t n_rows, int parts,
                               const float *unscale, cudaStream_t stream);

/* ---- greedy tokens of many rows from their first parts (rows_head_pick.cu) -------
 *
 * For the rows' greedy tokens the head GEMM need only take each row's
 * first part: est [n_rows][vocab] = that GEMM (column k: row k's part 0,
 * before scaling back), back = bn_cb_rows_head_in's unscale, y and factor
 * its rows and factors, wmax = bn_cb_head_row_max of the head w ([vocab]
 * rows of dim, F16 or BF16). tokens[k] = the token bn_cuda_sample_greedy
 * would choose over bn_cb_head_gemv(w, y row k)'s logits, ties, NaN and
 * inf included: every vocabulary row that the estimate and its bound
 * cannot rule out is computed with the GEMV's own code. best and count
 * (n_rows each) are the rows' keys and tickets: bn_cb_rows_pick_reset
 * once, and every call leaves them as it found them (so a captured graph
 * can replay the call). slices: the grid's vocabulary slices a row, at
 * most 65535 (bn_cb_rows_pick_slices); n_rows at most 65535. */
int bn_cb_rows_pick_slices(int64_t n_rows, int64_t vocab, int sm_count);
/* The dynamic shared memory (dim floats) of the kernel; once, outside
 * graph capture. */
cudaError_t bn_cb_rows_pick_prepare(int type, int64_t dim);
/* m[r] = max |w[r][i]| (+inf when row r has a weight that is not finite). */
cudaError_t bn_cb_head_row_max(const void *w, int type, int64_t rows, int64_t dim, float *m,
                               cudaStream_t stream);
cudaError_t bn_cb_rows_pick_reset(unsigned long long *best, unsigned *count, int64_t n,
                                  cudaStream_t stream);
cudaError_t bn_cb_rows_pick(const void *w, int type, int64_t vocab, int64_t dim, const float *est,
                            const float *back, const float *factor, const float *wmax,
                            const float *y, int64_t n_rows, int slices, unsigned long long *best,
                            unsigned *count, int32_t *tokens, cudaStream_t stream);

/* ---- screened LM head (greedy decoding; head_screen.cu, docs/CUDA.md) -------------
 *
 * The token that argmax over bn_cb_head_gemv's logits would choose, reading
 * an int8 copy of the head (one scale per row) and the full rows of only
 * those few tokens that could be the argmax:
 *
 *   bn_cb_head_quantize   once, at load: q [rows][dim] int8 codes and
 *                         se [rows][2] (scale, bound factor) from the head
 *                         rows w of `type`;
 *   bn_cb_head_screen     per step: for every row an estimate and a bound
 *                         that certainly holds the head kernel's logit;
 *                         upper [rows] the upper ends, partial
 *                         [bn_cb_head_screen_blocks(rows, sm_count)] the
 *                         largest lower end of each block;
 *   bn_cb_head_exact      per step: logits[r] = -inf where the upper end is
 *                         below T, else exactly what bn_cb_head_gemv
 *                         writes (the same code). T is the k-th largest
 *                         of the blocks' largest lower ends, k = *d_k in
 *                         device memory (1 when d_k is NULL or *d_k < 1;
 *                         read when the kernel runs, so a captured graph
 *                         serves every k): k rows, one from each of k
 *                         blocks, are at least T, so a row below T is
 *                         below k logits, neither in the top k nor tied
 *                         with its last (-inf when fewer than k blocks
 *                         have a trusted row: every row is computed).
 *
 * So bn_cuda_sample_greedy over these logits returns bn_cuda_sample_greedy's
 * token over the full ones, ties, NaN and inf included, and with k >= the
 * sampler's top-k (1 to BN_CUDA_SAMPLE_MAX_K) the sampler keeps the same
 * top-k tokens with the same logits, so it picks what it would over the
 * full logits; samplers without a top-k need the full logits. With `best` (one 64-bit word, the same in both calls)
 * the two also compute that token themselves: the screen sets *best to
 * (-inf, token 0) and the exact pass raises it to the largest key
 * (sample_key.cuh) of the rows it computes, so bn_cuda_key_token(*best) is
 * the greedy token without a sampler pass over the logits; NULL: logits
 * only. With cand_n (one counter, the same in both calls) the screen empties
 * a candidate list and the exact pass appends the key of every row it
 * computes to cand (at most cand_cap keys; the count goes on past it), which
 * bn_cuda_sample_cand reads instead of the vocabulary's logits; with
 * cand_floor (one float) the exact pass also stores T there, which the top
 * k's logits all reach (k rows have logits >= T), so the sampler ranks only
 * the listed keys at or above it. dim as bn_cb_head_gemv; the vector paths
 * need dim % 16 == 0 (screen) and the head kernel's condition (exact). Rows whose bound
 * cannot be trusted (non-finite values, tiny or huge magnitudes) are always
 * computed exactly. The screen with pdl starts during the kernel before
 * (which writes x): it initialises best and cand_n and asks L2 for its
 * blocks' first rows of q before it waits for x. The exact pass with pdl,
 * launched right after the screen (with pdl or not), reads x and *d_k
 * before it waits for the screen. */
int bn_cb_head_screen_blocks(int64_t rows, int sm_count);
/* The dynamic shared memory (dim floats) of the screen and exact kernels;
 * call once, outside graph capture. */
cudaError_t bn_cb_head_screen_prepare(int type, int64_t dim);
cudaError_t bn_cb_head_quantize(const void *w, int type, int64_t rows, int64_t dim, int8_t *q,
                                float *se, cudaStream_t stream);
cudaError_t bn_cb_head_screen(const int8_t *q, const float *se, int64_t rows, int64_t dim,
                              const float *x, float *upper, float *partial,
                              unsigned long long *best, unsigned *cand_n, int sm_count,
                              int pdl, cudaStream_t stream);
cudaError_t bn_cb_head_exact(const void *w, int type, int64_t rows, int64_t dim, const float *x,
                             const float *upper, const float *partial, int n_partial,
                             const int32_t *d_k, float *logits, unsigned long long *best,
                             uint64_t *cand, unsigned *cand_n, int cand_cap, float *cand_floor,
                             int sm_count, int pdl, cudaStream_t stream);

/* The screened head's key of a part of the vocabulary starting at row
 * `first` (tensor parallelism: a rank's rows), made the key of the whole
 * vocabulary's row: the same logit, the token counted from row 0. One
 * thread. */
cudaError_t bn_cb_key_shift_rows(unsigned long long *key, int64_t first, cudaStream_t stream);

/* The decode step's last kernel (one thread): its chosen token, read from
 * *key (a key of sample_key.cuh: the screened head's) or else from *token
 * (exactly one of the two), stored for the host at `host` (may be NULL;
 * pinned memory the device maps, or device memory): the key itself (8 bytes,
 * 8-byte aligned) when read from one, else the token; and, with `feed`, as
 * the inputs of the step after it (the decode inputs' layout: token,
 * position, KV length): feed[0] = the token (0 when outside [0, vocab),
 * e.g. a refused draw's -1, so that the step fed by it reads a row of the
 * embedding), feed[1] = step[1] + 1, feed[2] = step[2] + 1, where `step`
 * holds this step's inputs. */
cudaError_t bn_cb_decode_handoff(const unsigned long long *key, const int32_t *token,
                                 int32_t vocab, void *host, const int32_t *step, int32_t *feed,
                                 int pdl, cudaStream_t stream);

/* The token of a key of sample_key.cuh (ordered(logit) << 32 | 0xffffffff - id),
 * or -1 when its logit is -inf or NaN (ordered(-inf) is 0x007fffff): the
 * best key says every logit is, and no token can be chosen. */
static inline int32_t bn_cuda_key_token(unsigned long long key)
{
    if ((uint32_t)(key >> 32) <= 0x007fffffu)
        return -1;
    return (int32_t)(0xffffffffu - (uint32_t)key);
}

#ifdef __cplusplus
}
#endif

#endif
