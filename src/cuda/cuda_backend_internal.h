/*
 * cuda_backend_internal.h - what the files of the CUDA backend share; not
 * part of its contract (cuda_backend.h). The backend is split by what it
 * does:
 *
 *   cuda_backend.c          creation (options, device, allocation, warm-up),
 *                           free and the queries
 *   cuda_backend_plan.c     the plan and the uploads: the shape check, the
 *                           projection groups, where the embedding and LM head
 *                           sit, scratch and the memory budget; weights, norms,
 *                           embedding and LM head onto the device
 *   cuda_backend_forward.c  the forward pass: one pass over M rows (prefill
 *                           chunks, the eager decode step), requests, cb_queue_pass
 *   cuda_backend_decode.c   the decode step: its inputs, the CUDA graphs
 *                           (capture, replay), the hand-off, submit / chained /
 *                           wait / drop_pending
 *   cuda_backend_sample.c   the choice of a step's token on the device
 *   cuda_backend_measure.c  stage profiles, timings, the decode trace and the
 *                           figures bench reads
 *
 * Functions one file calls in another are named cb_* and declared here;
 * everything else is static to its file.
 *
 * Device buffers, one prefill chunk of R rows (row-major, one row per token):
 *
 *   x    [R][dim]      residual stream          qkv [R][q_dim + 2 kv_dim]  raw q|k|v
 *   q    [R][q_dim]    roped, scaled queries    att [R][q_dim]             attention out
 *   out  [R][dim]      Wo / Wdown output        gu  [R][2 ffn]             raw gate|up
 *   xq   [R][ldq]      int8 activations (ldq: the widest padded input), with act_scale,
 *                      act_sum [R]
 *   normed [dim], logits [vocab]                the last row through output_norm, LM head
 *   K, V [n_layer][kv_len][kv_dim]              fp32 or fp16
 *   rope [kv_len][rope_dim / 2][2]              cos, sin of every position (bn_cb_rope_table)
 */
#ifndef BN_CUDA_BACKEND_INTERNAL_H
#define BN_CUDA_BACKEND_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "cuda_backend_kernels.h"
#include "cuda_context.h"
#include "cuda_decode_form.h"
#include "cuda_layout.h"
#include "ops_cuda.h"
#include "sample_cuda.h"
#include "w2a8_cuda.h"

#define MAX_ALLOCS 64
/* Entries cb_scratch_list may write (the batched pass uses 40). */
#define MAX_SCRATCH 44
#define MIB (1024.0 * 1024.0)

/* The four products of a layer; q|k|v and gate|up are fused. */
enum { G_QKV, G_O, G_GU, G_DOWN, G_COUNT };

typedef struct seg {
    int64_t n;         /* rows (outputs)                                */
    int64_t col;       /* first column in the group's output            */
    size_t off;        /* byte offset in the weight arena               */
    bn_cuda_layout l;
    float scale;
    int split;         /* GEMV split-K when launched alone              */
} seg;

typedef struct group {
    int n_seg;
    seg s[3];
    int64_t n, k;      /* the whole group                               */
    bn_cuda_layout fused;
    bool fused_ok;     /* one launch over all segments                  */
    int split;
} group;

/* Kernel families, for the receipt's list of what ran (their names:
 * kernel_names in cuda_backend.c, in this order). */
enum {
    K_EMBED, K_NORM_Q, K_ADD_NORM_Q, K_RELU2_Q, K_GEMV, K_GEMM, K_QKV_POST, K_ATTN_DEC_F32,
    K_ATTN_PRE_F32, K_ATTN_DEC_F16, K_ATTN_PRE_F16, K_OUT_NORM, K_HEAD, K_ARGMAX, K_GRAPH,
    K_ATTN_DEC_F32_CLUSTER, K_HEAD_SCREEN, K_ATTN_DEC_F32_QKV,
    K_GEMV_PAIR, K_SAMPLE, K_HANDOFF, K_EMBED_NORM_Q, K_ATTN_PAGED, K_HEAD_ROWS, K_SAMPLE_ROWS,
    K_ATTN_PRE_E4M3, K_ROWS_PICK, K_COUNT
};

/* Events of an instrumented step (profile_decode). */
typedef struct prof {
    cudaEvent_t *ev;
    int *stage;
    int n, cap;
    int launches[BN_CUDA_STAGE_COUNT];
} prof;

typedef struct dev_alloc {
    void *p;
    size_t bytes;
} dev_alloc;

/* A captured decode step: what it replays, the kernel families it launches
 * (bits K_*) and how many kernels. */
typedef struct step_graph {
    cudaGraphExec_t exec; /* NULL: not captured */
    unsigned kernels;
    int launches;
} step_graph;

/* The decode step's inputs in device memory (d_dec), uploaded before every
 * step (cb_upload_dec): four ints (token, position, KV length after it, the
 * top k the screened head computes exactly), the sampler's uniform number
 * (a double, at int 4) and its parameters (at int 6). Two images, DEC_STRIDE
 * ints apart: a step reads one (its parity) and its last kernel writes the
 * token, position and length of the step after it into the other, so that
 * a chained step (bn_cuda_backend_submit_chained) needs no upload of them. */
enum { DEC_UNIFORM = 4, DEC_PARAMS = 6, DEC_INTS = DEC_PARAMS + 4, DEC_STRIDE = 16 };
_Static_assert(sizeof(bn_cuda_sample_params) == 4 * sizeof(int32_t),
               "the sampling parameters take four ints of d_dec");

struct bn_cuda_backend {
    /* The model, the options it was created with and the shapes they give
     * (kv_filled: the cache positions computed so far). */
    const bn_checkpoint *model;
    bn_hparams hp;
    bn_cuda_backend_options opt;
    int64_t q_dim, kv_dim, qkv_n, gu_n, ldq, kv_len, kv_filled, chunk;
    bool kv_f16; /* the one-sequence cache (d_k, d_v) in fp16, else fp32 */
    size_t kv_elem;
    int paged_kv; /* the paged cache's element, BN_CB_KV_* */
    size_t paged_elem;
    /* The decode step's form for this device and model (cuda_decode_form.h;
     * form.pdl goes off if the driver refuses it in a step or a capture). */
    bn_cuda_decode_form form;

    /* The device: its context, compute stream (cs) and copy stream, its SM
     * count and name. */
    bn_cuda_context *ctx;
    cudaStream_t cs, copy;
    int device, sm;
    char name[256];

    /* The plan and the uploaded model (cuda_backend_plan.c): the projection
     * groups and their packed weights, the norm weights, the embedding, the
     * LM head (and the screened head's int8 copy), the KV cache; their sizes. */
    group *groups;             /* [n_layer][G_COUNT] */
    uint8_t *d_w;
    uint64_t w_bytes;
    float *d_norms;            /* per layer: attn, attn_sub, ffn, ffn_sub; then output */
    int64_t norm_off[BN_NORM_COUNT], layer_norms, out_norm_off;
    uint64_t norms_bytes;
    void *d_embed;
    bn_qtype embed_type;
    size_t embed_row_bytes;
    uint64_t embed_bytes;
    void *d_head;
    int head_type;             /* BN_CB_HEAD_* */
    bool head_shared;          /* d_head is d_embed */
    uint64_t head_bytes;
    /* The screened head (form.head_screen, head_screen.cu): the int8 copy,
     * its per-row (scale, bound factor), the rows' upper ends and the
     * blocks' largest lower ends. */
    int8_t *d_head_q;
    float *d_head_se, *head_upper, *head_part;
    int head_parts;
    uint64_t head_screen_bytes;
    void *d_k, *d_v;
    uint64_t kv_bytes;
    /* The paged cache of many sequences at once (forward_rows; 0 rows: none),
     * fp32 [n_layer][paged_rows][kv_dim], and a pass's per-row cache rows
     * and sequences (prefill-chunk many) and block tables (paged_max_seqs x
     * paged_max_blocks). */
    int64_t paged_rows;
    int paged_block, paged_max_seqs, paged_max_blocks;
    int paged_resident;     /* the paged attention's blocks resident at once */
    void *d_pk, *d_pv;      /* elements of paged_kv */
    float *ws_paged;        /* the paged attention's split shares */
    int32_t *d_sums;        /* the batched down product's int32 sums,
                               [BN_W2A8_SUMS_MAX_ROWS][dim], zero between
                               passes (down_as_sums)                       */
    int32_t *d_slot, *d_rseq, *d_dlist, *d_tables, *d_rblocks;
    uint64_t paged_bytes;
    /* The batched pass's LM head (cuda_backend_rows.c): up to rows_head
     * wanted rows at once, their input parts (rows_head.cu; form
     * BN_CB_ROWS_HEAD_*) and scale-back factors, logits [rows_head][vocab],
     * chunk-local row numbers, sampling parameters, uniform numbers and
     * tokens, and one sampler workspace per row. cuBLAS (blas, a
     * cublasHandle_t) runs the GEMMs; without it each row takes the head
     * GEMV. */
#define ROWS_HEAD_MAX 256
    int rows_head, rows_form;
    void *d_hin;
    float *d_hscale, *d_rlogits;
    int32_t *d_lrow, *d_rtok;
    bn_cuda_sample_params *d_rparams;
    double *d_ru;
    void *ws_rows;
    /* Greedy passes of a 16-bit head (rows_pick): the GEMM of each row's
     * first part, then bn_cb_rows_pick over it: the rows as fp32 and their
     * bound factors (bn_cb_rows_head_in), each vocabulary row's largest
     * |w|, the rows' keys and tickets. */
    bool rows_pick;
    float *d_hy, *d_hfactor, *d_hwmax;
    unsigned long long *d_rbest;
    unsigned *d_rcount;
    const struct bn_cublas *blas_api;
    void *blas;
    void *ws_blas;          /* cuBLAS's workspace (graph capture needs one given) */
    bool blas_tried;
    /* Decode-only batched passes as CUDA graphs, one per bucket of 2^i
     * rows, captured at a bucket's second pass (the first runs eagerly),
     * their tokens into pinned h_rtok; a bucket whose capture failed runs
     * eagerly from then on. */
#define ROWS_GRAPHS 10
    cudaGraphExec_t rows_graph[2][ROWS_GRAPHS];     /* [1]: every row greedy (rows_pick) */
    unsigned char rows_graph_state[2][ROWS_GRAPHS]; /* 0 unused, 1 ran eagerly, 2 failed */
    int32_t *h_rtok;

    /* Scratch of one prefill chunk (cb_scratch_list; the layout at the top
     * of this file) and the decode step's inputs. */
    float *x, *qkv, *q, *att, *out, *gu, *normed, *logits, *act_scale, *rope;
    /* Tensor parallelism (opt.tp_size >= 2): NCCL, the sub-norms'
     * statistics of every rank ([tp_size][chunk][2] doubles) and this
     * rank's rows of the LM head [head_row0, head_row0 + head_rows), of
     * head_span rows a rank (logits hold tp_size * head_span floats). */
    const struct bn_nccl *nccl;
    double *tp_stats;
    int64_t head_row0, head_rows, head_span;
    int64_t whole_q_dim, whole_ffn; /* the split sub-norms' whole rows */
    int8_t *xq;
    int32_t *act_sum, *ws_streamk, *d_tokens, *d_pos, *d_next;
    int32_t *d_dec; /* the decode step's inputs (cb_upload_dec), two images DEC_STRIDE
                       ints apart (cb_dec_dev): four ints, at + 4 (8-byte aligned) the
                       sampler's uniform number, at + 6 its parameters */
    bool streamk; /* some prefill GEMM takes stream-K: ws_streamk is its workspace */
    void *ws_attn, *ws_sample;
    unsigned int *attn_counters; /* fp32 decode attention: one per head, kept at 0 */
    unsigned long long *d_best;  /* the screened head's greedy token key */
    uint64_t *d_cand;            /* the screened head's candidate keys ...   */
    unsigned *d_cand_n;          /* ... and their count (sample_cuda.h)       */
    float *d_cand_floor;         /* ... and the logit the top k all reach      */
    int attn_splits;
    uint64_t scratch_bytes;

    /* Pinned host memory (the tokens and positions of a pass, the decode
     * inputs and the tokens fetched; the logits) and the RoPE frequencies. */
    int32_t *h_io;             /* pinned: tokens[kv_len], pos[kv_len], then per parity
                                  (H_TAIL ints each) d_dec's image (DEC_INTS ints:
                                  cb_upload_dec), next, a spare int and the screened
                                  head's token key (8-byte aligned) */
    char *h_io_dev;            /* h_io as the device addresses it (pinned memory is
                                  mapped), where the step's kernels store the token
                                  for the host (publish); NULL: copied instead     */
    float *h_logits;           /* pinned: vocab */
    bn_rope_freqs freqs;

    /* The decode step's CUDA graphs and the greedy graph's stage map
     * (cuda_backend_decode.c), and how the decode kernels launch. */
    step_graph graph;              /* the decode step as greedy steps run it   */
    step_graph graph_logits;       /* with head_screen: the step with the full
                                      head, for forward() (else `graph`)       */
    step_graph graph_sample;       /* the step of a sampled token: `graph` (its
                                      head screened for the top k) and the
                                      sampler, its parameters read from d_dec  */
    step_graph graph1, graph_sample1; /* `graph` and `graph_sample` reading the
                                      second image of d_dec (parity 1), for
                                      chained steps                            */
    bool choice_in_pass;           /* the pass just queued replayed a graph that
                                      ends with the choice and its hand-off    */
    cudaGraph_t graph_src;         /* what `graph` was instantiated from        */
    cudaGraphNode_t *graph_nodes;  /* its kernel nodes in launch order          */
    unsigned char *graph_node_stage; /* the bn_cuda_stage of each               */
    int n_graph_nodes;             /* 0: no stage map (then no skip timing)     */
    const char *stage_map_why;     /* why there is none                         */
    int *capture_stages;           /* while capturing: stage, launches, ...     */
    int capture_launches;          /* while capturing: the kernels captured     */
    int n_capture, cap_capture;
    bool use_graphs;
    /* Submitted decode steps and the two images of d_dec (cuda_backend_decode.c). */
    int par;                   /* the d_dec image (0, 1) the step being queued reads */
    /* Submitted steps not yet waited for, oldest first: a step and at most
     * one chained after it. */
    struct pending_step {
        int64_t pos;
        bool greedy;           /* its token is the greedy one */
        int par;
    } pend[2];
    int n_pending;
    cudaEvent_t step_done[2];  /* per parity: recorded after a submitted step */
    int32_t dec_sent[2][DEC_INTS]; /* per image: what was last uploaded to it ...  */
    bool dec_valid[2];             /* ... when known (ints 3.. are what matter)     */
    /* The receipt (the kernel families launched: bn_cuda_backend_kernels),
     * the test failure hook and the profile being taken (cuda_backend_measure.c). */
    unsigned ran;              /* bit K_* set when the family was launched */
    int64_t calls, fail_at;
    prof *prof;

    /* Every device buffer (freed together) and the device's memory once
     * created. */
    dev_alloc allocs[MAX_ALLOCS];
    int n_allocs;
    uint64_t device_total, device_free;
};

/* ---- the pinned buffer and the decode inputs ------------------------------- */

/* The pinned buffer's tail after the tokens and positions, one per parity
 * (the d_dec image a step reads): d_dec's image, the token fetched (next),
 * a spare int and the head's key. A step's results go to its parity's
 * tail, so the host can read one step's token while the step chained after
 * it stores its own. */
enum { H_NEXT = DEC_INTS, H_KEY = DEC_INTS + 2, H_TAIL = H_KEY + 2 };
static inline int32_t *cb_h_tail(bn_cuda_backend *b, int par)
{
    return b->h_io + 2 * b->kv_len + par * H_TAIL;
}
static inline int32_t *cb_h_next_at(bn_cuda_backend *b, int par)
{
    return cb_h_tail(b, par) + H_NEXT;
}
static inline unsigned long long *cb_h_key_at(bn_cuda_backend *b, int par)
{
    return (unsigned long long *)(void *)(cb_h_tail(b, par) + H_KEY);
}

/* The decode inputs the step being queued reads (its parity's image of
 * d_dec). */
static inline int32_t *cb_dec_dev(bn_cuda_backend *b) { return b->d_dec + b->par * DEC_STRIDE; }

/* ---- the LM head's rows ---------------------------------------------------- */

static inline size_t cb_head_elem_bytes(int type) { return type == BN_CB_HEAD_F32 ? 4 : 2; }

/* The LM head's rows on the device (also when they are the embedding's). */
static inline uint64_t cb_head_table_bytes(const bn_cuda_backend *b)
{
    return (uint64_t)b->hp.vocab * (uint64_t)b->hp.dim * cb_head_elem_bytes(b->head_type);
}

/* ---- statistics ------------------------------------------------------------ */

/* The context's statistics (cuda_context.h), fed by every pass: kernel
 * launches (eager ones as cb_mark() counts them, a graph replay as the kernels
 * its capture counted) and host-device copies with their bytes. */
static inline void cb_count_launches(bn_cuda_backend *b, int n)
{
    bn_perf_record_kernels(bn_cuda_context_stats(b->ctx), (uint64_t)n);
}
static inline void cb_count_h2d(bn_cuda_backend *b, uint64_t bytes)
{
    bn_perf_record_h2d(bn_cuda_context_stats(b->ctx), bytes);
}
static inline void cb_count_d2h(bn_cuda_backend *b, uint64_t bytes)
{
    bn_perf_record_d2h(bn_cuda_context_stats(b->ctx), bytes);
}

/* ---- cuda_backend_plan.c: the plan and the uploads ------------------------- */

/* A buffer to allocate: where its address goes and its size. */
typedef struct scratch_spec {
    void **ptr;
    size_t bytes;
} scratch_spec;

/* The screened head's buffers (cb_head_screen_list). */
enum { HEAD_SCREEN_BUFFERS = 4 };

bn_status cb_check_shape(const bn_cuda_backend *b, bn_error *err);
void cb_setup_groups(bn_cuda_backend *b);
bn_status cb_plan_tables(bn_cuda_backend *b, bn_error *err);
int cb_scratch_list(bn_cuda_backend *b, scratch_spec *list);
void cb_head_screen_list(bn_cuda_backend *b, scratch_spec *list);
/* Bytes of one row of the LM head as the device holds it (head_type). */
size_t cb_head_row_bytes(const bn_cuda_backend *b);
uint64_t cb_round_alloc(size_t bytes);
bn_status cb_check_budget(const bn_cuda_backend *b, uint64_t total, uint64_t budget,
                          const char *budget_name, bn_error *err);
bn_status cb_upload_norms(bn_cuda_backend *b, bn_error *err);
bn_status cb_upload_tables(bn_cuda_backend *b, bn_error *err);
bn_status cb_upload_weights(bn_cuda_backend *b, bn_error *err);

/* ---- cuda_backend_forward.c: the forward pass ------------------------------ */

bn_w2a8_cuda_args cb_pair_args(const bn_cuda_backend *b, const group *g);
/* Whether the decode step's first norm can read its row from the embedding
 * table (bn_cb_embed_norm_fits for this model's table and buffers). */
bool cb_embed_norm_fits(const bn_cuda_backend *b);
bn_status cb_mark(bn_cuda_backend *b, bn_cuda_stage stage, int launches, bn_error *err);
bn_status cb_enqueue_rows(bn_cuda_backend *b, int64_t M, const int32_t *d_tok,
                          const int32_t *d_pos, const int32_t *d_kvlen, int64_t visible,
                          bool screen, bn_error *err);
/* A batched pass's rows, as its attention takes them: runs of at least
 * PAGED_RUN_MIN consecutive positions of one sequence (a prompt's chunk)
 * go to the tiled prefill kernel in blocks of up to 64 rows (d_blocks,
 * n_blocks of them: bn_cb_attn_prefill_runs), which reads each cache tile
 * once for a block's rows; the other rows (dec_rows, n_dec of them, NULL:
 * all) to the paged decode kernel. */
#define PAGED_RUN_MIN 16
#define PAGED_RUN_BLOCKS(chunk) ((chunk) / PAGED_RUN_MIN + (chunk) / 64 + 1)
typedef struct paged_rows {
    const int32_t *d_tok, *d_pos, *d_slot, *d_seq;
    const int32_t *dec_rows;
    int n_dec, max_pos;      /* max_pos: the largest of the decode rows' positions */
    const int32_t *d_blocks; /* (first row, rows, sequence, 0) each          */
    int n_blocks, runs_max_pos;
} paged_rows;
bn_status cb_enqueue_paged_rows(bn_cuda_backend *b, int64_t M, const paged_rows *rows,
                                bn_error *err);
/* Where a batched pass's answers go (cuda_backend_rows.c): the logit
 * rows' tokens picked on the device (next: p[k] and u[k] per row, p NULL
 * for all greedy), or else their logits (vocab floats each). */
typedef struct rows_out {
    float *logits;
    const bn_cuda_sample_params *p;
    const double *u;
    int32_t *next;
} rows_out;
bn_status cb_forward_rows(bn_cuda_backend *b, const bn_batch_rows *r, const rows_out *o,
                          bn_error *err);
/* The batched pass's cuBLAS handle, released. */
void cb_rows_release(bn_cuda_backend *b);
bn_status cb_check_request(const bn_cuda_backend *b, const int32_t *tokens, int64_t n,
                           int64_t pos, bn_error *err);
bn_status cb_begin_call(bn_cuda_backend *b, bn_error *err);
bn_status cb_upload_rows(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                         bn_error *err);
bn_status cb_queue_pass(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                        int top_k, double u, const bn_cuda_sample_params *sample, bool chained,
                        bn_error *err);
bn_status cb_fail_pass(bn_cuda_backend *b, int64_t pos, bn_status st);
bn_status cb_download_logits(bn_cuda_backend *b, bn_error *err);

/* ---- cuda_backend_decode.c: the decode step and its graphs ----------------- */

bn_status cb_upload_dec(bn_cuda_backend *b, int32_t token, int64_t pos, int top_k, double u,
                        const bn_cuda_sample_params *p, bool chained, bn_error *err);
bn_status cb_replay(bn_cuda_backend *b, const step_graph *g, bn_error *err);
const step_graph *cb_pass_graph(const bn_cuda_backend *b, bool screen,
                                const bn_cuda_sample_params *sample);
bn_status cb_queue_handoff(bn_cuda_backend *b, bool key, bn_error *err);
bn_status cb_publish_token(bn_cuda_backend *b, bool key, bn_error *err);
void cb_free_stage_map(bn_cuda_backend *b);
void cb_capture_graph(bn_cuda_backend *b);

/* ---- cuda_backend_sample.c: the choice of a token -------------------------- */

bool cb_choice_greedy(const bn_cuda_sample_params *p);
/* Whether a pass whose choice reads at most its top_k largest logits (0:
 * every logit), by a sampler or not, runs the screened head: where the
 * form has one and top_k > 0; in a tensor-parallel team only for greedy
 * steps, since a screen leaves a team's logits partial and ungathered and
 * its candidates with the rank that found them. */
bool cb_pass_screens(const bn_cuda_backend *b, int top_k, bool sampled);
bn_status cb_queue_choice(bn_cuda_backend *b, const bn_cuda_sample_params *p, bn_error *err);
bn_status cb_queue_sampler(bn_cuda_backend *b, bn_error *err);
int32_t cb_chosen_token(bn_cuda_backend *b, bool greedy, int par);
bn_status cb_queue_step(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                        const bn_cuda_sample_params *p, double u, bool chained, bn_error *err);
bn_status cb_check_choice(const bn_cuda_backend *b, const bn_cuda_sample_params *p, double u,
                          bn_error *err);

#endif
