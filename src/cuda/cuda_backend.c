/*
 * cuda_backend.c - the whole forward pass on one GPU (design and contracts
 * in cuda_backend.h; the kernels it adds in cuda_backend_kernels.h).
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
 *
 * Weight scales. q|k|v and gate|up run as one GEMV each with weight scale 1,
 * which yields acc / act_scale exactly (x * 1 is exact); the kernel after
 * multiplies each part by its own scale, which is the CPU epilogue's
 * ((float)acc / act_scale) * scale, bit for bit. Wo and Wdown carry their
 * scale in the GEMV itself.
 */
#include "cuda_backend.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_cuda.h"
#include "cuda_backend_kernels.h"
#include "cuda_context.h"
#include "cuda_layout.h"
#include "fp16.h"
#include "ops_cuda.h"
#include "qtype.h"
#include "sample_cuda.h"
#include "threadpool.h"
#include "w2a8_cuda.h"

#define DEFAULT_CHUNK 512
/* Cluster size of the decode GEMVs' activation staging by default (where
 * the device has clusters; else every block stages its own from L2).
 * Clusters of 8 measured ~20 us shorter for the 2B-4T step on an H200
 * (~1060 against ~1080 us, alternated runs); 2 and 4 gained nothing
 * (docs/PERFORMANCE.md). */
#define DEFAULT_GEMV_CLUSTER 8
/* A converted LM head is stored as F32 (exact, like the CPU) up to this
 * size, as F16 above it. */
#define HEAD_F32_MAX ((uint64_t)256 << 20)
/* Greedy steps screen the LM head through its int8 copy by default from
 * this size of head up (below it the two extra kernels cost about what
 * they save). */
#define HEAD_SCREEN_MIN ((uint64_t)64 << 20)
/* Left free on the device for the CUDA context's own needs (graph,
 * module loading, fragmentation). */
#define DEVICE_RESERVE ((uint64_t)64 << 20)
#define MAX_ALLOCS 40
#define MAX_UPLOAD_SLOTS 8
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

/* Kernel families, for the receipt's list of what ran. */
enum {
    K_EMBED, K_NORM_Q, K_ADD_NORM_Q, K_RELU2_Q, K_GEMV, K_GEMM, K_QKV_POST, K_ATTN_DEC_F32,
    K_ATTN_PRE_F32, K_ATTN_DEC_F16, K_ATTN_PRE_F16, K_OUT_NORM, K_HEAD, K_ARGMAX, K_GRAPH,
    K_NORM_GEMV, K_GEMV_RES, K_ATTN_DEC_F32_CLUSTER, K_HEAD_SCREEN, K_ATTN_DEC_F32_QKV,
    K_GEMV_PAIR, K_SAMPLE, K_HANDOFF, K_EMBED_NORM_Q, K_COUNT
};
static const char *const kernel_names[K_COUNT] = {
    "embed_rows", "norm_quantize", "residual_norm_quantize", "relu2_norm_quantize",
    "w2a8_gemv", "w2a8_gemm", "qkv_rope_kv_store", "attention_decode_f32",
    "attention_prefill_f32", "attention_decode_f16", "attention_prefill_f16",
    "residual_output_norm", "lm_head_gemv", "argmax", "cuda_graph_replay",
    "norm_quantize_w2a8_gemv", "w2a8_gemv_residual", "attention_decode_f32_cluster",
    "lm_head_screen_int8", "attention_decode_f32_cluster_qkv", "w2a8_gemv_gate_up_relu2",
    "sample_top_k_top_p", "decode_handoff", "embed_norm_quantize"};

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
 * step (upload_dec): four ints (token, position, KV length after it, the
 * top k the screened head computes exactly), the sampler's uniform number
 * (a double, at int 4) and its parameters (at int 6). Two images, DEC_STRIDE
 * ints apart: a step reads one (its parity) and its last kernel writes the
 * token, position and length of the step after it into the other, so that
 * a chained step (bn_cuda_backend_submit_chained) needs no upload of them. */
enum { DEC_UNIFORM = 4, DEC_PARAMS = 6, DEC_INTS = DEC_PARAMS + 4, DEC_STRIDE = 16 };
_Static_assert(sizeof(bn_cuda_sample_params) == 4 * sizeof(int32_t),
               "the sampling parameters take four ints of d_dec");

struct bn_cuda_backend {
    const bn_checkpoint *model;
    bn_hparams hp;
    bn_cuda_backend_options opt;
    int64_t q_dim, kv_dim, qkv_n, gu_n, ldq, kv_len, kv_filled, chunk;
    bool kv_f16;
    size_t kv_elem;

    bn_cuda_context *ctx;
    cudaStream_t cs, copy;
    int device, sm;
    char name[256];

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
    /* Greedy steps' screened head (head_screen.cu): the int8 copy, its
     * per-row (scale, bound factor), the rows' upper ends and the blocks'
     * largest lower ends. */
    bool head_screen;
    int8_t *d_head_q;
    float *d_head_se, *head_upper, *head_part;
    int head_parts;
    uint64_t head_screen_bytes;
    void *d_k, *d_v;
    uint64_t kv_bytes;

    float *x, *qkv, *q, *att, *out, *gu, *normed, *logits, *act_scale, *rope;
    int8_t *xq;
    int32_t *act_sum, *ws_streamk, *d_tokens, *d_pos, *d_next;
    int32_t *d_dec; /* the decode step's inputs (upload_dec), two images DEC_STRIDE
                       ints apart (dec_dev): four ints, at + 4 (8-byte aligned) the
                       sampler's uniform number, at + 6 its parameters */
    bool streamk; /* some prefill GEMM takes stream-K: ws_streamk is its workspace */
    void *ws_attn, *ws_sample;
    unsigned int *attn_counters; /* fp32 decode attention: one per head, kept at 0 */
    unsigned long long *d_best;  /* the screened head's greedy token key */
    uint64_t *d_cand;            /* the screened head's candidate keys ...   */
    unsigned *d_cand_n;          /* ... and their count (sample_cuda.h)       */
    float *d_cand_floor;         /* ... and the logit the top k all reach      */
    int attn_splits;
    int attn_cluster; /* fp32 decode attention's cluster size (0: ranges merged by a ticket) */
    int gemv_cluster; /* decode GEMVs: activations staged per cluster of this many (0: none) */
    bool attn_qkv;    /* the decode attention computes the q|k|v product (no GEMV) */
    bool gu_pair;     /* the decode gate|up GEMV writes relu(gate)^2 * up */
    int gu_cluster;   /* the gate|up GEMV: staged per cluster of this many (0: none) */
    uint64_t scratch_bytes;

    int32_t *h_io;             /* pinned: tokens[kv_len], pos[kv_len], then per parity
                                  (H_TAIL ints each) d_dec's image (DEC_INTS ints:
                                  upload_dec), next, a spare int and the screened
                                  head's token key (8-byte aligned) */
    char *h_io_dev;            /* h_io as the device addresses it (pinned memory is
                                  mapped), where the step's kernels store the token
                                  for the host (publish); NULL: copied instead     */
    float *h_logits;           /* pinned: vocab */
    bn_rope_freqs freqs;

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
    bool pdl;                  /* decode kernels use programmatic dependent launch */
    bn_cuda_fusion fusion;     /* how the decode step's norms meet the GEMVs (never
                                  AUTO once created)                                */
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
    /* A coming request's prompt, uploaded ahead on the copy stream while
     * the compute stream runs the current request (stage_prompt): pinned
     * h_stage and device d_stage hold its tokens, then its positions
     * 0 .. stage_n - 1 (2 * kv_len ints each). stage_n 0: none staged. */
    int32_t *h_stage, *d_stage;
    int64_t stage_n;
    cudaEvent_t stage_copied;  /* copy stream: the staged copy is done       */
    cudaEvent_t stage_read;    /* compute stream: the last prefill that read
                                  d_stage is done                            */
    uint64_t staged_uploads, staged_prefills;
    unsigned ran;              /* bit K_* set when the family was launched */
    int64_t calls, fail_at;
    prof *prof;

    dev_alloc allocs[MAX_ALLOCS];
    int n_allocs;
    uint64_t device_total, device_free;
};

/* ---- small helpers ---------------------------------------------------------- */

const char *bn_cuda_fusion_name(bn_cuda_fusion f)
{
    switch (f) {
    case BN_CUDA_FUSION_AUTO: return "auto";
    case BN_CUDA_FUSION_SEPARATE: return "separate";
    case BN_CUDA_FUSION_NORMS: return "norms";
    case BN_CUDA_FUSION_ALL: return "all";
    default: return "?";
    }
}

void bn_cuda_backend_options_default(bn_cuda_backend_options *o)
{
    memset(o, 0, sizeof *o);
    o->device = -1;
    o->kv_type = BN_CUDA_KV_F32;
}

static int32_t *h_tokens(bn_cuda_backend *b) { return b->h_io; }
static int32_t *h_positions(bn_cuda_backend *b) { return b->h_io + b->kv_len; }
/* The pinned buffer's tail after the tokens and positions, one per parity
 * (the d_dec image a step reads): d_dec's image, the token fetched (next),
 * a spare int and the head's key. A step's results go to its parity's
 * tail, so the host can read one step's token while the step chained after
 * it stores its own. */
enum { H_NEXT = DEC_INTS, H_KEY = DEC_INTS + 2, H_TAIL = H_KEY + 2 };
static int32_t *h_tail(bn_cuda_backend *b, int par)
{
    return b->h_io + 2 * b->kv_len + par * H_TAIL;
}
static int32_t *h_dec(bn_cuda_backend *b) { return h_tail(b, b->par); }
static double *h_uniform(bn_cuda_backend *b) { return (double *)(void *)(h_dec(b) + DEC_UNIFORM); }
static bn_cuda_sample_params *h_params(bn_cuda_backend *b)
{
    return (bn_cuda_sample_params *)(void *)(h_dec(b) + DEC_PARAMS);
}
static int32_t *h_next_at(bn_cuda_backend *b, int par) { return h_tail(b, par) + H_NEXT; }
static unsigned long long *h_key_at(bn_cuda_backend *b, int par)
{
    return (unsigned long long *)(void *)(h_tail(b, par) + H_KEY);
}
/* Where a kernel stores a result for the host: `host` (inside h_io) as the
 * device addresses it, or NULL where pinned memory is not mapped (the
 * result is then copied: publish_token). */
static void *dev_alias(bn_cuda_backend *b, void *host)
{
    return b->h_io_dev ? b->h_io_dev + ((char *)host - (char *)b->h_io) : NULL;
}

/* The decode inputs the step being queued reads (its parity's image), and
 * the sampler's uniform number and parameters in them. */
static int32_t *dec_dev(bn_cuda_backend *b) { return b->d_dec + b->par * DEC_STRIDE; }
static double *d_uniform(bn_cuda_backend *b) { return (double *)(void *)(dec_dev(b) + DEC_UNIFORM); }
static bn_cuda_sample_params *d_params(bn_cuda_backend *b)
{
    return (bn_cuda_sample_params *)(void *)(dec_dev(b) + DEC_PARAMS);
}

static const float *norm_ptr(const bn_cuda_backend *b, int layer, bn_norm which)
{
    return b->d_norms + (int64_t)layer * b->layer_norms + b->norm_off[which];
}

static size_t head_elem_bytes(int type) { return type == BN_CB_HEAD_F32 ? 4 : 2; }

/* The LM head's rows on the device (also when they are the embedding's). */
static uint64_t head_table_bytes(const bn_cuda_backend *b)
{
    return (uint64_t)b->hp.vocab * (uint64_t)b->hp.dim * head_elem_bytes(b->head_type);
}

static const char *head_type_name(int type)
{
    return type == BN_CB_HEAD_F32 ? "f32" : type == BN_CB_HEAD_F16 ? "f16" : "bf16";
}

static bn_status dalloc(bn_cuda_backend *b, size_t bytes, void **out, bn_error *err)
{
    *out = NULL;
    if (b->n_allocs == MAX_ALLOCS)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "cuda backend: too many device buffers");
    if (bytes < 256)
        bytes = 256; /* never ask for 0; cudaMalloc rounds to 256 anyway */
    bn_status st = bn_cuda_context_alloc(b->ctx, bytes, out, err);
    if (st != BN_OK)
        return st;
    b->allocs[b->n_allocs].p = *out;
    b->allocs[b->n_allocs].bytes = bytes;
    b->n_allocs++;
    return BN_OK;
}

/* The context's statistics (cuda_context.h), fed by every pass: kernel
 * launches (eager ones as mark() counts them, a graph replay as the kernels
 * its capture counted) and host-device copies with their bytes. */
static void count_launches(bn_cuda_backend *b, int n)
{
    bn_perf_record_kernels(bn_cuda_context_stats(b->ctx), (uint64_t)n);
}
static void count_h2d(bn_cuda_backend *b, uint64_t bytes)
{
    bn_perf_record_h2d(bn_cuda_context_stats(b->ctx), bytes);
}
static void count_d2h(bn_cuda_backend *b, uint64_t bytes)
{
    bn_perf_record_d2h(bn_cuda_context_stats(b->ctx), bytes);
}

static bn_status mark(bn_cuda_backend *b, bn_cuda_stage stage, int launches, bn_error *err)
{
    if (b->capture_stages) {
        b->capture_launches += launches;
        if (b->n_capture + 2 <= b->cap_capture) {
            b->capture_stages[b->n_capture++] = (int)stage;
            b->capture_stages[b->n_capture++] = launches;
        }
    } else {
        count_launches(b, launches);
    }
    prof *p = b->prof;
    if (!p)
        return BN_OK;
    if (p->n >= p->cap)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "cuda backend: profile event overflow");
    BN_CUDA_TRY(err, cudaEventRecord(p->ev[p->n], b->cs));
    p->stage[p->n++] = (int)stage;
    p->launches[stage] += launches;
    return BN_OK;
}

/* ---- the product groups ------------------------------------------------------ */

static void setup_groups(bn_cuda_backend *b)
{
    const bn_hparams *hp = &b->hp;
    static const bn_proj members[G_COUNT][3] = {
        {BN_PROJ_Q, BN_PROJ_K, BN_PROJ_V},
        {BN_PROJ_O, BN_PROJ_COUNT, BN_PROJ_COUNT},
        {BN_PROJ_GATE, BN_PROJ_UP, BN_PROJ_COUNT},
        {BN_PROJ_DOWN, BN_PROJ_COUNT, BN_PROJ_COUNT}};
    size_t off = 0;
    b->ldq = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        for (int gi = 0; gi < G_COUNT; gi++) {
            group *g = &b->groups[l * G_COUNT + gi];
            memset(g, 0, sizeof *g);
            for (int i = 0; i < 3 && members[gi][i] != BN_PROJ_COUNT; i++) {
                seg *s = &g->s[g->n_seg++];
                int64_t n, k;
                bn_hparams_proj_shape(hp, members[gi][i], &n, &k);
                s->n = n;
                s->col = g->n;
                s->off = off;
                bn_cuda_layout_init(&s->l, n, k);
                s->split = bn_w2a8_cuda_gemv_split(s->l.tiles, s->l.groups, b->sm);
                s->scale = 1.0f;
                off += s->l.bytes;
                g->n += n;
                g->k = k;
            }
            /* Segments packed one after the other form the packing of the
             * stacked matrix exactly when every segment but the last fills
             * whole 8-row tiles. */
            g->fused_ok = true;
            for (int i = 0; i + 1 < g->n_seg; i++)
                if (g->s[i].n % BN_CUDA_TILE_ROWS != 0)
                    g->fused_ok = false;
            bn_cuda_layout_init(&g->fused, g->n, g->k);
            g->split = bn_w2a8_cuda_gemv_split(g->fused.tiles, g->fused.groups, b->sm);
            if (g->fused.k_padded > b->ldq)
                b->ldq = g->fused.k_padded;
        }
    }
    b->w_bytes = off;
}

static seg *seg_of(bn_cuda_backend *b, int layer, bn_proj p)
{
    group *g = &b->groups[layer * G_COUNT];
    switch (p) {
    case BN_PROJ_Q: return &g[G_QKV].s[0];
    case BN_PROJ_K: return &g[G_QKV].s[1];
    case BN_PROJ_V: return &g[G_QKV].s[2];
    case BN_PROJ_O: return &g[G_O].s[0];
    case BN_PROJ_GATE: return &g[G_GU].s[0];
    case BN_PROJ_UP: return &g[G_GU].s[1];
    default: return &g[G_DOWN].s[0];
    }
}

/* The W2A8 arguments of a product of group g over M rows of b->xq, but
 * for the weights and the output (matmul sets those per segment). */
static bn_w2a8_cuda_args w2a8_args(const bn_cuda_backend *b, const group *g, int64_t M)
{
    bn_w2a8_cuda_args a;
    memset(&a, 0, sizeof a);
    a.x = b->xq;
    a.m = M;
    a.ldx = b->ldq;
    a.act_scale = b->act_scale;
    a.act_sum = b->act_sum;
    a.ldy = g->n;
    a.sm_count = b->sm;
    /* No split-K workspace: the default GEMMs need none (w2a8_cuda.h). */
    a.workspace = NULL;
    a.streamk = b->streamk ? b->ws_streamk : NULL;
    a.weight_scale = g->n_seg == 1 ? g->s[0].scale : 1.0f;
    a.cluster = b->gemv_cluster;
    /* Prefill's GEMMs: programmatic dependent launch lets the weight copies
     * of the warp-specialized kernels start while the kernel before runs
     * (they wait for it before anything else; not while profiling). */
    a.pdl = M > 1 && b->pdl && !b->prof;
    return a;
}

/* y = W x for M rows of b->xq: one launch for a fused group, one per
 * segment otherwise (each writing its columns of the same output). Groups
 * of one segment apply their scale in the GEMV; fused groups use scale 1
 * (see the top of the file). Returns the number of launches. */
static bn_status matmul(bn_cuda_backend *b, const group *g, int64_t M, float *y, int pdl,
                        int *launches, bn_error *err)
{
    bn_w2a8_cuda_args a = w2a8_args(b, g, M);
    b->ran |= 1u << (M == 1 ? K_GEMV : K_GEMM);
    *launches = 0;
    const int parts = g->fused_ok ? 1 : g->n_seg;
    for (int i = 0; i < parts; i++) {
        const seg *s = &g->s[i];
        const bn_cuda_layout *l = g->fused_ok ? &g->fused : &s->l;
        a.weights = b->d_w + s->off;
        a.n = l->n;
        a.tiles = l->tiles;
        a.groups = l->groups;
        a.y = y + s->col;
        const int split = g->fused_ok ? g->split : s->split;
        BN_CUDA_TRY(err, M == 1 ? bn_w2a8_cuda_gemv_pdl(&a, split, pdl, b->cs)
                                : bn_w2a8_cuda_gemm(&a, b->cs));
        (*launches)++;
    }
    return BN_OK;
}

/* The decode step's y = W q(v) [+ res] for one row through
 * bn_cb_decode_gemv (one launch over the whole group): na carries the
 * source (src and its fields); res NULL or the residual (b->x, with y =
 * b->x: the residual stream updated in place). */
static bn_status decode_matmul(bn_cuda_backend *b, const group *g, bn_cb_decode_gemv_args *na,
                               const float *res, float *y, int pdl, bn_error *err)
{
    na->weights = b->d_w + g->s[0].off;
    na->n = g->fused.n;
    na->tiles = g->fused.tiles;
    na->groups = g->fused.groups;
    na->k = g->k;
    na->weight_scale = g->n_seg == 1 ? g->s[0].scale : 1.0f;
    na->sm_count = b->sm;
    na->eps = b->hp.rms_eps;
    na->res = res;
    na->y = y;
    b->ran |= 1u << (na->src == BN_CB_SRC_CODES ? K_GEMV_RES : K_NORM_GEMV);
    BN_CUDA_TRY(err, bn_cb_decode_gemv(na, pdl, b->cs));
    return BN_OK;
}

/* The decode step's gate|up GEMV in pairs (b->gu_pair): h = relu(gate)^2 *
 * up of b->xq into b->gu (ffn values), the squared ReLU done in the GEMV's
 * epilogue with the segments' scales, so the norm kernel after it reads one
 * row instead of two. */
static bn_w2a8_cuda_args pair_args(const bn_cuda_backend *b, const group *g)
{
    bn_w2a8_cuda_args a = w2a8_args(b, g, 1);
    a.weights = b->d_w + g->s[0].off;
    a.n = g->fused.n;
    a.tiles = g->fused.tiles;
    a.groups = g->fused.groups;
    a.y = b->gu;
    a.ldy = g->n / 2;
    a.relu2_pair = 1;
    a.relu2_sg = g->s[0].scale;
    a.relu2_su = g->s[1].scale;
    a.cluster = b->gu_cluster;
    return a;
}

static bn_status gate_up_pair(bn_cuda_backend *b, const group *g, int pdl, bn_error *err)
{
    const bn_w2a8_cuda_args a = pair_args(b, g);
    BN_CUDA_TRY(err, bn_w2a8_cuda_gemv_pdl(&a, g->split, pdl, b->cs));
    b->ran |= 1u << K_GEMV_PAIR;
    return BN_OK;
}

/* Where a norm kernel's codes of width k end (the stride of b->xq it
 * writes): one row is read by a GEMV only up to k rounded up to whole
 * chunk-groups, so that is all the norm zero-fills (a 2560-wide row used
 * to be padded with zeros to the widest GEMV input, 6912, on the decode
 * step's critical path); more rows keep the GEMM's stride. */
static int64_t codes_ld(const bn_cuda_backend *b, int64_t k, int64_t M)
{
    return M == 1 ? (k + BN_CUDA_GROUP - 1) / BN_CUDA_GROUP * BN_CUDA_GROUP : b->ldq;
}

/* A decode GEMV's source: the norm (weights w) of the row x. */
static bn_cb_decode_gemv_args norm_source(const float *x, const float *w)
{
    bn_cb_decode_gemv_args a;
    memset(&a, 0, sizeof a);
    a.src = BN_CB_SRC_NORM;
    a.x = x;
    a.w = w;
    return a;
}

/* ---- one pass over M rows ---------------------------------------------------- */

/* Queues the forward pass of M rows (tokens d_tok at positions d_pos, both
 * device arrays) on the compute stream, ending with the last row's logits
 * in b->logits. d_kvlen (a device int) selects the decode path (M == 1,
 * attention over [0, *d_kvlen) = [0, *d_pos]); NULL is a prefill chunk,
 * whose last row sees `visible` positions (the host's count, which sizes
 * the attention's split; 0 on the decode path).
 * screen: the LM head is screened (b->head_screen): logits hold -inf for
 * rows that cannot be among the top d_dec[3] (queue_pass), so only a step
 * that reads no more than those (greedy, or a top-k sampler) may ask for it.
 * Nothing here synchronises or touches host memory, so it can be captured
 * in a graph.
 *
 * The decode path launches the kernels between the embedding and the output
 * norm with programmatic dependent launch when b->pdl (not while profiling:
 * the events between stages would time overlapping kernels). Before their
 * wait those kernels read only weights, norm vectors, the RoPE table, the
 * step's position and cache rows of earlier steps; the embedding kernel
 * before them is launched plainly, so all of that (and the upload of the
 * step's inputs) is complete when the first of them starts. */
static bn_status enqueue_rows(bn_cuda_backend *b, int64_t M, const int32_t *d_tok,
                              const int32_t *d_pos, const int32_t *d_kvlen, int64_t visible,
                              bool screen, bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    const cudaStream_t s = b->cs;
    const int64_t dim = hp->dim, ffn = hp->ffn, q_dim = b->q_dim;
    const float eps = hp->rms_eps;
    const bool decode = d_kvlen != NULL;
    const int pdl = decode && b->pdl && !b->prof;
    /* fp32-cache decode: scales, RoPE and the KV store run inside the
     * attention kernel, which takes the raw q|k|v row. */
    const bool fused = decode && !b->kv_f16;
    const size_t layer_kv_bytes = (size_t)b->kv_len * (size_t)b->kv_dim * b->kv_elem;
    const float *rope = hp->rope_dim > 0 ? b->rope : NULL;
    /* Decode runs 9 kernels per layer (fp32 cache) with separate norm
     * kernels (the default), 8 when the attention computes q|k|v itself
     * (b->attn_qkv); with b->fusion NORMS each norm + int8 runs
     * inside the GEMV that consumes it and the residual adds inside the Wo
     * and down GEMVs (6 kernels), with ALL relu^2 * up + ffn_sub_norm runs
     * inside the down GEMV too (5). docs/CUDA.md. */
    const bool fold = decode && b->fusion != BN_CUDA_FUSION_SEPARATE;
    const bool fold_relu2 = decode && b->fusion == BN_CUDA_FUSION_ALL;
    bn_status st;
    int n;

    /* A decode step's first norm reads its row from the embedding table
     * itself where it can (F32 / F16 / BF16 rows of the lean kernel's
     * widths): one kernel fewer, the same x and codes. It is the step's
     * first kernel, launched plainly. */
    const bool embed_norm = decode && !fold &&
                            bn_cb_embed_norm_fits(b->embed_type, dim, b->x,
                                                  norm_ptr(b, 0, BN_NORM_ATTN), b->xq,
                                                  codes_ld(b, dim, M));
    if (embed_norm) {
        BN_CUDA_TRY(err, bn_cb_embed_norm_quantize(b->d_embed, b->embed_type, d_tok, b->x, dim,
                                                   norm_ptr(b, 0, BN_NORM_ATTN), eps, b->xq,
                                                   codes_ld(b, dim, M), b->act_scale, b->act_sum,
                                                   0, s));
        b->ran |= 1u << K_EMBED_NORM_Q;
        if ((st = mark(b, BN_CUDA_STAGE_EMBED, 0, err)) != BN_OK ||
            (st = mark(b, BN_CUDA_STAGE_ATTN_NORM, 1, err)) != BN_OK)
            return st;
    } else {
        BN_CUDA_TRY(err, bn_cuda_embed_rows(b->d_embed, b->embed_type, hp->vocab, dim, d_tok, M,
                                            b->x, dim, s));
        b->ran |= 1u << K_EMBED;
        if ((st = mark(b, BN_CUDA_STAGE_EMBED, 1, err)) != BN_OK)
            return st;
    }
    if (!fold && !embed_norm) {
        BN_CUDA_TRY(err, bn_cb_norm_quantize(b->x, dim, M, dim, norm_ptr(b, 0, BN_NORM_ATTN),
                                             eps, b->xq, codes_ld(b, dim, M), b->act_scale,
                                             b->act_sum, pdl, s));
        b->ran |= 1u << K_NORM_Q;
        if ((st = mark(b, BN_CUDA_STAGE_ATTN_NORM, 1, err)) != BN_OK)
            return st;
    }

    for (int l = 0; l < hp->n_layer; l++) {
        const group *g = &b->groups[l * G_COUNT];
        void *kl = (char *)b->d_k + (size_t)l * layer_kv_bytes;
        void *vl = (char *)b->d_v + (size_t)l * layer_kv_bytes;
        /* The next layer's cache, which the decode attention prefetches. */
        const float *next_k = l + 1 < hp->n_layer ? (const float *)((char *)kl + layer_kv_bytes)
                                                  : NULL;
        const float *next_v = next_k ? (const float *)((char *)vl + layer_kv_bytes) : NULL;
        const float sq = g[G_QKV].s[0].scale, sk = g[G_QKV].s[1].scale,
                    sv = g[G_QKV].s[2].scale;

        /* With b->attn_qkv the decode attention computes q|k|v itself. */
        const bool qkv_inside = decode && b->attn_qkv;
        if (qkv_inside) {
            n = 0;
        } else if (fold) {
            bn_cb_decode_gemv_args na = norm_source(b->x, norm_ptr(b, l, BN_NORM_ATTN));
            if ((st = decode_matmul(b, &g[G_QKV], &na, NULL, b->qkv, pdl, err)) != BN_OK)
                return st;
            n = 1;
        } else if ((st = matmul(b, &g[G_QKV], M, b->qkv, pdl, &n, err)) != BN_OK) {
            return st;
        }
        if ((st = mark(b, BN_CUDA_STAGE_QKV, n, err)) != BN_OK)
            return st;
        if (!fused) {
            const bn_cb_qkv_shape qs = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len,
                                        sq, sk, sv};
            BN_CUDA_TRY(err, bn_cb_qkv_post(b->qkv, b->qkv_n, M, &qs, &b->freqs, rope,
                                            rope ? b->kv_len : 0, d_pos, b->q, q_dim, kl, vl,
                                            b->kv_f16, pdl, s));
            b->ran |= 1u << K_QKV_POST;
            if ((st = mark(b, BN_CUDA_STAGE_ROPE_KV, 1, err)) != BN_OK)
                return st;
        }

        if (!b->kv_f16) {
            const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len};
            if (decode) {
                bn_cb_attn_decode_args da = {b->qkv, sq, sk, sv, rope, hp->rope_dim,
                                             d_pos, kl, vl, b->attn_splits, b->ws_attn,
                                             b->attn_counters, b->att, b->attn_cluster,
                                             next_k, next_v, NULL, 0, NULL, NULL, NULL};
                if (qkv_inside) {
                    da.w_qkv = b->d_w + g[G_QKV].s[0].off;
                    da.w_k = g[G_QKV].k;
                    da.xq = b->xq;
                    da.act_scale = b->act_scale;
                    da.act_sum = b->act_sum;
                }
                BN_CUDA_TRY(err, bn_cb_attn_decode(&as, &da, pdl, s));
                b->ran |= 1u << (qkv_inside         ? K_ATTN_DEC_F32_QKV
                                 : b->attn_cluster ? K_ATTN_DEC_F32_CLUSTER
                                                   : K_ATTN_DEC_F32);
            } else {
                /* The parts' workspace is the gate|up output, unused until
                 * the FFN. */
                const size_t ws_bytes = (size_t)b->chunk * (size_t)b->gu_n * sizeof(float);
                const int parts = bn_cb_attn_prefill_parts(&as, (int)M, visible, b->sm, ws_bytes);
                BN_CUDA_TRY(err, bn_cb_attn_prefill(&as, b->q, q_dim, (int)M, d_pos, kl, vl,
                                                    b->att, q_dim, parts, b->gu, ws_bytes, s));
                b->ran |= 1u << K_ATTN_PRE_F32;
            }
        } else {
            const bn_attn_shape fs = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len,
                                      BN_ATTN_KV_F16, 0.0f};
            if (decode) {
                const bn_attn_decode_args da = {b->q, q_dim, kl, vl, 0, d_kvlen, 1,
                                                b->att, q_dim, b->attn_splits, b->ws_attn};
                BN_CUDA_TRY(err, bn_attn_decode(&fs, &da, s));
                b->ran |= 1u << K_ATTN_DEC_F16;
            } else {
                /* Positions are consecutive: the chunk's first is pos0. */
                BN_CUDA_TRY(err, bn_attn_prefill(&fs, b->q, q_dim, (int)M, d_pos, kl, vl, b->att,
                                                 q_dim, s));
                b->ran |= 1u << K_ATTN_PRE_F16;
            }
        }
        /* fp32 decode is one kernel (its ranges merged by the last block of
         * each block column); the f16 one merges in a second kernel when it splits. */
        const int attn_launches = decode && b->kv_f16 && b->attn_splits > 1 ? 2 : 1;
        if ((st = mark(b, BN_CUDA_STAGE_ATTENTION, attn_launches, err)) != BN_OK)
            return st;

        if (fold) {
            /* x += Wo q(attn_sub_norm(att)), then gate|up of ffn_norm(x). */
            bn_cb_decode_gemv_args na = norm_source(b->att, norm_ptr(b, l, BN_NORM_ATTN_SUB));
            if ((st = decode_matmul(b, &g[G_O], &na, b->x, b->x, pdl, err)) != BN_OK ||
                (st = mark(b, BN_CUDA_STAGE_O, 1, err)) != BN_OK)
                return st;
            na = norm_source(b->x, norm_ptr(b, l, BN_NORM_FFN));
            if ((st = decode_matmul(b, &g[G_GU], &na, NULL, b->gu, pdl, err)) != BN_OK ||
                (st = mark(b, BN_CUDA_STAGE_GATE_UP, 1, err)) != BN_OK)
                return st;
        } else {
            BN_CUDA_TRY(err, bn_cb_norm_quantize(b->att, q_dim, M, q_dim,
                                                 norm_ptr(b, l, BN_NORM_ATTN_SUB), eps, b->xq,
                                                 codes_ld(b, q_dim, M), b->act_scale,
                                                 b->act_sum, pdl, s));
            if ((st = mark(b, BN_CUDA_STAGE_SUB_NORM, 1, err)) != BN_OK)
                return st;
            if ((st = matmul(b, &g[G_O], M, b->out, pdl, &n, err)) != BN_OK ||
                (st = mark(b, BN_CUDA_STAGE_O, n, err)) != BN_OK)
                return st;
            BN_CUDA_TRY(err, bn_cb_add_norm_quantize(b->x, dim, b->out, dim, M, dim,
                                                     norm_ptr(b, l, BN_NORM_FFN), eps, b->xq,
                                                     codes_ld(b, dim, M), b->act_scale,
                                                     b->act_sum, pdl, s));
            b->ran |= 1u << K_ADD_NORM_Q;
            if ((st = mark(b, BN_CUDA_STAGE_FFN_NORM, 1, err)) != BN_OK)
                return st;
            if (decode && b->gu_pair)
                n = 1, st = gate_up_pair(b, &g[G_GU], pdl, err);
            else
                st = matmul(b, &g[G_GU], M, b->gu, pdl, &n, err);
            if (st != BN_OK || (st = mark(b, BN_CUDA_STAGE_GATE_UP, n, err)) != BN_OK)
                return st;
        }

        if (fold_relu2) {
            /* x += down q(ffn_sub_norm(relu^2(gate) * up)). */
            bn_cb_decode_gemv_args na = norm_source(NULL, norm_ptr(b, l, BN_NORM_FFN_SUB));
            na.src = BN_CB_SRC_RELU2;
            na.g = b->gu;
            na.u = b->gu + ffn;
            na.sg = g[G_GU].s[0].scale;
            na.su = g[G_GU].s[1].scale;
            if ((st = decode_matmul(b, &g[G_DOWN], &na, b->x, b->x, pdl, err)) != BN_OK ||
                (st = mark(b, BN_CUDA_STAGE_DOWN, 1, err)) != BN_OK)
                return st;
            continue;
        }
        if (decode && b->gu_pair) {
            /* relu^2 * up is already in b->gu: the norm + int8 of that row. */
            BN_CUDA_TRY(err, bn_cb_norm_quantize(b->gu, ffn, M, ffn,
                                                 norm_ptr(b, l, BN_NORM_FFN_SUB), eps, b->xq,
                                                 codes_ld(b, ffn, M), b->act_scale, b->act_sum,
                                                 pdl, s));
            b->ran |= 1u << K_NORM_Q;
        } else {
            BN_CUDA_TRY(err, bn_cb_relu2_norm_quantize(b->gu, b->gu + ffn, b->gu_n,
                                                       g[G_GU].s[0].scale, g[G_GU].s[1].scale, M,
                                                       ffn, norm_ptr(b, l, BN_NORM_FFN_SUB), eps,
                                                       b->xq, codes_ld(b, ffn, M), b->act_scale,
                                                       b->act_sum, pdl, s));
            b->ran |= 1u << K_RELU2_Q;
        }
        if ((st = mark(b, BN_CUDA_STAGE_RELU2, 1, err)) != BN_OK)
            return st;
        if (fold) {
            /* x += down q, the codes from the kernel above. */
            bn_cb_decode_gemv_args na;
            memset(&na, 0, sizeof na);
            na.src = BN_CB_SRC_CODES;
            na.xq = b->xq;
            na.act_scale = b->act_scale;
            na.act_sum = b->act_sum;
            if ((st = decode_matmul(b, &g[G_DOWN], &na, b->x, b->x, pdl, err)) != BN_OK ||
                (st = mark(b, BN_CUDA_STAGE_DOWN, 1, err)) != BN_OK)
                return st;
            continue;
        }
        if ((st = matmul(b, &g[G_DOWN], M, b->out, pdl, &n, err)) != BN_OK ||
            (st = mark(b, BN_CUDA_STAGE_DOWN, n, err)) != BN_OK)
            return st;

        if (l + 1 < hp->n_layer) {
            /* The residual add fused with the next layer's attn_norm. */
            BN_CUDA_TRY(err, bn_cb_add_norm_quantize(b->x, dim, b->out, dim, M, dim,
                                                     norm_ptr(b, l + 1, BN_NORM_ATTN), eps, b->xq,
                                                     codes_ld(b, dim, M), b->act_scale,
                                                     b->act_sum, pdl, s));
            if ((st = mark(b, BN_CUDA_STAGE_ATTN_NORM, 1, err)) != BN_OK)
                return st;
        }
    }

    /* Only the last row's logits are wanted: its residual (unless the down
     * GEMV added it) and output norm (with PDL in decode, as the screened
     * head's kernel after it: that one's blocks start streaming the head's
     * first rows into L2 while the norm runs). */
    const int64_t last = (M - 1) * dim;
    BN_CUDA_TRY(err, bn_cb_add_rmsnorm(b->x + last, dim, fold ? NULL : b->out + last, dim, 1, dim,
                                       b->d_norms + b->out_norm_off, eps, b->normed, dim, pdl,
                                       s));
    b->ran |= 1u << K_OUT_NORM;
    if ((st = mark(b, BN_CUDA_STAGE_OUT_NORM, 1, err)) != BN_OK)
        return st;
    if (screen) {
        /* The greedy token comes out of the two as a key (d_best); the
         * exact pass computes every row that can be among the top
         * d_dec[3] (queue_pass). */
        BN_CUDA_TRY(err, bn_cb_head_screen(b->d_head_q, b->d_head_se, hp->vocab, dim, b->normed,
                                           b->head_upper, b->head_part, b->d_best, b->d_cand_n,
                                           b->sm, pdl, s));
        BN_CUDA_TRY(err, bn_cb_head_exact(b->d_head, b->head_type, hp->vocab, dim, b->normed,
                                          b->head_upper, b->head_part, b->head_parts,
                                          dec_dev(b) + 3, b->logits, b->d_best, b->d_cand,
                                          b->d_cand_n, BN_CUDA_SAMPLE_MAX_CAND,
                                          b->d_cand_floor, b->sm, pdl, s));
        b->ran |= 1u << K_HEAD_SCREEN;
        return mark(b, BN_CUDA_STAGE_LM_HEAD, 2, err);
    }
    BN_CUDA_TRY(err, bn_cb_head_gemv(b->d_head, b->head_type, hp->vocab, dim, b->normed,
                                     b->logits, b->sm, s));
    b->ran |= 1u << K_HEAD;
    return mark(b, BN_CUDA_STAGE_LM_HEAD, 1, err);
}

/* ---- requests ---------------------------------------------------------------- */

/* Every token inside the vocabulary. */
static bn_status check_tokens(const bn_cuda_backend *b, const int32_t *tokens, int64_t n,
                              bn_error *err)
{
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= b->hp.vocab)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                "token ids must come from this model's vocabulary",
                                "token %lld is %d, outside the vocabulary (0..%d)", (long long)i,
                                (int)tokens[i], (int)b->hp.vocab - 1);
    return BN_OK;
}

static bn_status check_request(const bn_cuda_backend *b, const int32_t *tokens, int64_t n,
                               int64_t pos, bn_error *err)
{
    if (!tokens || n <= 0 || pos < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda forward: need tokens, n_tokens > 0 and pos >= 0");
    if (b->n_pending)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "call bn_cuda_backend_wait_greedy (or drop_pending) first",
                            "cuda forward: a submitted step has not been waited for");
    if (n > b->kv_len - pos)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "start a new context or create the backend with a longer kv_len",
                            "positions %lld..%lld do not fit a KV cache of %lld positions",
                            (long long)pos, (long long)(pos + n - 1), (long long)b->kv_len);
    if (pos > b->kv_filled)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "run the earlier positions first",
                            "position %lld would skip positions: only %lld are computed",
                            (long long)pos, (long long)b->kv_filled);
    return check_tokens(b, tokens, n, err);
}

/* Counts the call, applies the test failure hook and binds the device to
 * this thread. */
static bn_status begin_call(bn_cuda_backend *b, bn_error *err)
{
    b->calls++;
    if (b->fail_at > 0 && b->calls == b->fail_at)
        return bn_error_set(err, BN_ERR_GPU, "this failure was injected by a test",
                            "CUDA forward failed (injected failure at call %lld)",
                            (long long)b->calls);
    return bn_cuda_context_use(b->ctx, err);
}

/* Copies n prompt tokens and their positions pos, pos + 1, ... through the
 * pinned host buffers to b->d_tokens and b->d_pos, on the compute stream. */
static bn_status upload_rows(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                             bn_error *err)
{
    int32_t *ht = h_tokens(b), *hpos = h_positions(b);
    for (int64_t i = 0; i < n; i++) {
        ht[i] = tokens[i];
        hpos[i] = (int32_t)(pos + i);
    }
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_tokens, ht, (size_t)n * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, b->cs));
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_pos, hpos, (size_t)n * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, b->cs));
    count_h2d(b, (uint64_t)n * sizeof(int32_t));
    count_h2d(b, (uint64_t)n * sizeof(int32_t));
    return BN_OK;
}

/* The decode step's inputs (its parity's d_dec image, which its graphs
 * read): the token, its position, the KV length after it, the top k that
 * the screened LM head must compute exactly (bn_cb_head_exact's *d_k), then
 * the uniform number and the parameters a sampled step's sampler draws
 * with (zeros when p is NULL), so that a step needs one upload. A chained
 * step's token, position and length are on the device already (the step
 * before wrote them: queue_handoff), and the rest is uploaded only when it
 * differs from what that image holds (a greedy chain uploads nothing). */
enum { DEC_BYTES = DEC_INTS * sizeof(int32_t) };
static bn_status upload_dec(bn_cuda_backend *b, int32_t token, int64_t pos, int top_k, double u,
                            const bn_cuda_sample_params *p, bool chained, bn_error *err)
{
    int32_t *dec = h_dec(b);
    dec[0] = token;
    dec[1] = (int32_t)pos;
    dec[2] = (int32_t)(pos + 1);
    dec[3] = top_k;
    *h_uniform(b) = u;
    if (p)
        *h_params(b) = *p;
    else
        memset(h_params(b), 0, sizeof *h_params(b));
    const int first = chained ? 3 : 0;
    const size_t rest = (size_t)(DEC_INTS - 3) * sizeof(int32_t);
    int32_t *sent = b->dec_sent[b->par];
    if (chained && b->dec_valid[b->par] && memcmp(sent + 3, dec + 3, rest) == 0)
        return BN_OK;
    const size_t bytes = (size_t)(DEC_INTS - first) * sizeof(int32_t);
    BN_CUDA_TRY(err, cudaMemcpyAsync(dec_dev(b) + first, dec + first, bytes,
                                     cudaMemcpyHostToDevice, b->cs));
    count_h2d(b, bytes);
    memcpy(sent, dec, DEC_BYTES);
    b->dec_valid[b->par] = true;
    return BN_OK;
}

/* Queues a captured step (the inputs uploaded). */
static bn_status replay(bn_cuda_backend *b, const step_graph *g, bn_error *err)
{
    BN_CUDA_TRY(err, cudaGraphLaunch(g->exec, b->cs));
    count_launches(b, g->launches);
    b->ran |= g->kernels | 1u << K_GRAPH;
    return BN_OK;
}

/* The captured decode step that serves a pass: with a screened head, steps
 * that return logits (top_k 0) have a graph of their own, and so do sampled
 * steps; the greedy and sampled ones come in two copies, one per d_dec
 * image (steps that return logits are never chained: parity 0). */
static const step_graph *pass_graph(const bn_cuda_backend *b, bool screen,
                                    const bn_cuda_sample_params *sample)
{
    const bool odd = b->par == 1;
    if (sample && b->graph_sample.exec)
        return odd ? &b->graph_sample1 : &b->graph_sample;
    if (b->head_screen && !screen)
        return &b->graph_logits;
    return odd ? &b->graph1 : &b->graph;
}

/* Whether a prompt pass of n tokens at pos can read the staged copy of
 * them (stage_prompt): a prompt from position 0, exactly the staged tokens. */
static bool staged_for(const bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos)
{
    return pos == 0 && n > 1 && b->stage_n == n && !b->prof &&
           memcmp(b->h_stage, tokens, (size_t)n * sizeof(int32_t)) == 0;
}

bn_status bn_cuda_backend_stage_prompt(bn_cuda_backend *b, const int32_t *tokens, int64_t n,
                                       bn_error *err)
{
    if (!b || !tokens || n < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda stage_prompt: need a backend and at least one token");
    if (n > b->kv_len)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda stage_prompt: %lld tokens do not fit a KV cache of %lld "
                            "positions", (long long)n, (long long)b->kv_len);
    bn_status st = check_tokens(b, tokens, n, err);
    if (st == BN_OK)
        st = bn_cuda_context_use(b->ctx, err);
    if (st != BN_OK)
        return st;
    b->stage_n = 0;
    /* The pinned buffer may still be the source of the previous copy, and
     * d_stage still read by a prefill queued on the compute stream. (Before
     * the first copy and the first such prefill, the events were never
     * recorded: waiting for them returns at once.) */
    BN_CUDA_TRY(err, cudaEventSynchronize(b->stage_copied));
    for (int64_t i = 0; i < n; i++) {
        b->h_stage[i] = tokens[i];
        b->h_stage[n + i] = (int32_t)i;
    }
    BN_CUDA_TRY(err, cudaStreamWaitEvent(b->copy, b->stage_read, 0));
    const size_t bytes = 2 * (size_t)n * sizeof(int32_t);
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_stage, b->h_stage, bytes, cudaMemcpyHostToDevice,
                                     b->copy));
    count_h2d(b, bytes);
    BN_CUDA_TRY(err, cudaEventRecord(b->stage_copied, b->copy));
    b->stage_n = n;
    b->staged_uploads++;
    return BN_OK;
}

int64_t bn_cuda_backend_staged(const bn_cuda_backend *b) { return b ? b->stage_n : 0; }

/* Uploads the inputs and queues the pass: the decode step (graph or eager)
 * for one token, prefill chunks otherwise. top_k > 0: only the top_k
 * largest logits will be read (1: the argmax), so a screened head computes
 * only the rows that can be among them; 0: every logit. u and sample: the
 * uniform number and the parameters of queue_choice's draw (sample NULL:
 * greedy, or logits). A greedy step with a screened head replays `graph`,
 * and a sampled one graph_sample, each ending with the choice and its
 * hand-off (b->choice_in_pass). chained: a decode step whose token is the
 * one the step queued before it picks (tokens unused). */
static bn_status queue_pass(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                            int top_k, double u, const bn_cuda_sample_params *sample,
                            bool chained, bn_error *err)
{
    const bool screen = top_k > 0 && b->head_screen;
    b->choice_in_pass = false;
    const bn_status up = upload_dec(b, chained ? -1 : tokens[n - 1], pos + n - 1,
                                    top_k > 0 ? top_k : 1, u, sample, chained, err);
    if (up != BN_OK)
        return up;
    if (n == 1) {
        const step_graph *g = pass_graph(b, screen, sample);
        if (g->exec && b->use_graphs && !b->prof) {
            const bool sampled = g == &b->graph_sample || g == &b->graph_sample1;
            const bool greedy = g == &b->graph || g == &b->graph1;
            b->choice_in_pass = sampled || (greedy && screen && !sample);
            return replay(b, g, err);
        }
        int32_t *dec = dec_dev(b);
        return enqueue_rows(b, 1, dec, dec + 1, dec + 2, 0, screen, err);
    }
    const bool staged = staged_for(b, tokens, n, pos);
    const int32_t *d_tok = staged ? b->d_stage : b->d_tokens;
    const int32_t *d_pos = staged ? b->d_stage + n : b->d_pos;
    const bn_status rows = staged ? BN_CUDA_STATUS(err, cudaStreamWaitEvent(b->cs,
                                                                            b->stage_copied, 0))
                                  : upload_rows(b, tokens, n, pos, err);
    if (rows != BN_OK)
        return rows;
    for (int64_t c = 0; c < n; c += b->chunk) {
        const int64_t M = n - c < b->chunk ? n - c : b->chunk;
        bn_status st = enqueue_rows(b, M, d_tok + c, d_pos + c, NULL, pos + c + M, screen, err);
        if (st != BN_OK)
            return st;
    }
    if (staged) { /* used once; the next stage_prompt's copy waits for this read */
        b->stage_n = 0;
        b->staged_prefills++;
        BN_CUDA_TRY(err, cudaEventRecord(b->stage_read, b->cs));
    }
    return BN_OK;
}

/* The step's chosen token, in d_best as a key (key) or in d_next, handed
 * on by the step's last kernel: stored for the host in its parity's pinned
 * tail where pinned memory is mapped (publish_token copies it otherwise),
 * and as the token, position and length of a step chained after it in the
 * other d_dec image. Launched eagerly, or captured as a graph's last node. */
static bn_status queue_handoff(bn_cuda_backend *b, bool key, bn_error *err)
{
    void *host = key ? (void *)h_key_at(b, b->par) : (void *)h_next_at(b, b->par);
    int32_t *feed = b->d_dec + (b->par ^ 1) * DEC_STRIDE;
    BN_CUDA_TRY(err, bn_cb_decode_handoff(key ? b->d_best : NULL, key ? NULL : b->d_next,
                                          b->hp.vocab, dev_alias(b, host), dec_dev(b), feed,
                                          b->pdl && !b->prof, b->cs));
    b->ran |= 1u << K_HANDOFF;
    if (b->capture_stages)
        return mark(b, BN_CUDA_STAGE_ARGMAX, 1, err);
    count_launches(b, 1);
    return BN_OK;
}

/* The token the step just queued handed off (the key in d_best, key) on its
 * way to the host: stored there already where pinned memory is mapped,
 * else copied. Either way one transfer of its bytes for the statistics. */
static bn_status publish_token(bn_cuda_backend *b, bool key, bn_error *err)
{
    const size_t bytes = key ? sizeof *b->d_best : sizeof(int32_t);
    if (!b->h_io_dev)
        BN_CUDA_TRY(err, cudaMemcpyAsync(key ? (void *)h_key_at(b, b->par)
                                             : (void *)h_next_at(b, b->par),
                                         key ? (const void *)b->d_best : (const void *)b->d_next,
                                         bytes, cudaMemcpyDeviceToHost, b->cs));
    count_d2h(b, bytes);
    return BN_OK;
}

/* The candidate list a sampler reads (sample_cuda.h): the one a screened
 * head's exact pass wrote, with the floor its top k reach (every sampled
 * pass screens where the backend does: queue_pass); none (the sampler
 * reads the logits) without a screened head. */
typedef struct cand_list {
    const uint64_t *keys;
    const unsigned *n;
    const float *floor;
} cand_list;
static cand_list sampler_list(const bn_cuda_backend *b)
{
    const cand_list none = {NULL, NULL, NULL};
    const cand_list listed = {b->d_cand, b->d_cand_n, b->d_cand_floor};
    return b->head_screen ? listed : none;
}

/* Whether a choice is the greedy one (NULL: greedy). */
static bool choice_greedy(const bn_cuda_sample_params *p) { return !p || !(p->temperature > 0.0f); }

/* The token of the pass just queued, chosen by p (NULL: greedy) with the
 * uniform number queue_pass uploaded, handed off and on its way to the
 * host; chosen_token reads it once the stream has reached it. Greedy: with
 * the screened head (every greedy pass when b->head_screen) the key its
 * kernels computed, else the device argmax over the logits. Nothing is
 * launched when the pass's graph ended with the choice. */
static bn_status queue_choice(bn_cuda_backend *b, const bn_cuda_sample_params *p, bn_error *err)
{
    const bool key = choice_greedy(p) && b->head_screen;
    if (!b->choice_in_pass) {
        if (choice_greedy(p) && !b->head_screen) {
            BN_CUDA_TRY(err, bn_cuda_sample_greedy(b->logits, b->hp.vocab, b->ws_sample,
                                                   b->d_next, NULL, b->cs));
            b->ran |= 1u << K_ARGMAX;
            count_launches(b, 2); /* sample_kernels.cu: a partial pass and a final one */
        } else if (!choice_greedy(p)) {
            const cand_list l = sampler_list(b);
            BN_CUDA_TRY(err, bn_cuda_sample_cand(b->logits, b->hp.vocab, l.keys, l.n,
                                                 BN_CUDA_SAMPLE_MAX_CAND, l.floor, p, d_uniform(b),
                                                 b->ws_sample, b->d_next, NULL, b->cs));
            b->ran |= 1u << K_SAMPLE;
            count_launches(b, 1); /* sample_kernels.cu: one top-k launch */
        }
        const bn_status st = queue_handoff(b, key, err);
        if (st != BN_OK)
            return st;
    }
    return publish_token(b, key, err);
}

/* The sampler as graph_sample's kernel before the hand-off (captured:
 * capture_graph_once): its parameters and uniform number read from d_dec
 * when it runs, the token left in d_next. */
static bn_status queue_sampler(bn_cuda_backend *b, bn_error *err)
{
    const cand_list l = sampler_list(b);
    BN_CUDA_TRY(err, bn_cuda_sample_cand_dev(b->logits, b->hp.vocab, l.keys, l.n,
                                             BN_CUDA_SAMPLE_MAX_CAND, l.floor, d_params(b),
                                             d_uniform(b), b->ws_sample, b->d_next, b->cs));
    b->ran |= 1u << K_SAMPLE;
    b->capture_launches += 1;
    return BN_OK;
}

/* The logits a choice reads (queue_pass's top_k): greedy the largest; the
 * sampler its top-k (every token when top-k is off, which the device
 * allows only for a vocabulary of at most BN_CUDA_SAMPLE_MAX_K). */
static int choice_top_k(const bn_cuda_backend *b, const bn_cuda_sample_params *p)
{
    if (choice_greedy(p))
        return 1;
    return p->top_k >= 1 && p->top_k < b->hp.vocab ? p->top_k : (int)b->hp.vocab;
}

/* The token a step of parity par chose, once the stream is past it; -1
 * when no token could be chosen (every logit NaN or -inf: the engine
 * reports it). */
static int32_t chosen_token(bn_cuda_backend *b, bool greedy, int par)
{
    return greedy && b->head_screen ? bn_cuda_key_token(*h_key_at(b, par)) : *h_next_at(b, par);
}

/* The pass and the choice of its token by p (NULL: greedy) and u. */
static bn_status queue_step(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                            const bn_cuda_sample_params *p, double u, bool chained,
                            bn_error *err)
{
    const bn_status st = queue_pass(b, tokens, n, pos, choice_top_k(b, p), u,
                                    choice_greedy(p) ? NULL : p, chained, err);
    return st == BN_OK ? queue_choice(b, p, err) : st;
}

bool bn_cuda_backend_sample_supported(const bn_cuda_backend *b, const bn_cuda_sample_params *p)
{
    if (!b || choice_greedy(p))
        return b != NULL;
    /* sample_cuda.h: top-k of at most BN_CUDA_SAMPLE_MAX_K tokens, or off
     * only for a vocabulary that small. */
    const int32_t V = b->hp.vocab;
    return (p->top_k >= 1 && p->top_k <= BN_CUDA_SAMPLE_MAX_K) || V <= BN_CUDA_SAMPLE_MAX_K;
}

/* A sampling request the device can serve, with u in [0, 1). */
_Static_assert(BN_CUDA_SAMPLE_MAX_K == 64, "check_choice's hint names the limit");
static bn_status check_choice(const bn_cuda_backend *b, const bn_cuda_sample_params *p, double u,
                              bn_error *err)
{
    if (choice_greedy(p))
        return BN_OK;
    if (!bn_cuda_backend_sample_supported(b, p))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "use a top-k of 1 to 64, or sample on the host",
                            "the device sampler needs a top-k of 1 to %d for a vocabulary of %d "
                            "(top-k %d asked)",
                            BN_CUDA_SAMPLE_MAX_K, (int)b->hp.vocab, p->top_k);
    if (!(u >= 0.0 && u < 1.0))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "the sampler's uniform number must be in [0, 1) (got %g)", u);
    return BN_OK;
}

/* After a failure: let queued work drain and forget the positions it may
 * have half written (the CPU backend's rule), submitted steps included. */
static bn_status fail_pass(bn_cuda_backend *b, int64_t pos, bn_status st)
{
    (void)cudaStreamSynchronize(b->cs);
    (void)cudaGetLastError();
    if (b->kv_filled > pos)
        b->kv_filled = pos;
    b->n_pending = 0;
    b->par = 0;
    return st;
}

/* The last pass's logits into the pinned host buffer (and the stream
 * drained). */
static bn_status download_logits(bn_cuda_backend *b, bn_error *err)
{
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->h_logits, b->logits, (size_t)b->hp.vocab * sizeof(float),
                                     cudaMemcpyDeviceToHost, b->cs));
    count_d2h(b, (uint64_t)b->hp.vocab * sizeof(float));
    return BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
}

bn_status bn_cuda_backend_forward(bn_cuda_backend *b, const int32_t *tokens, int64_t n_tokens,
                                  int64_t pos, float *logits, bn_error *err)
{
    if (!b || !logits)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda forward: NULL argument");
    bn_status st = check_request(b, tokens, n_tokens, pos, err);
    if (st == BN_OK)
        st = begin_call(b, err);
    if (st != BN_OK)
        return st;
    st = queue_pass(b, tokens, n_tokens, pos, 0, 0.0, NULL, false, err);
    if (st == BN_OK)
        st = download_logits(b, err);
    if (st != BN_OK)
        return fail_pass(b, pos, st);
    memcpy(logits, b->h_logits, (size_t)b->hp.vocab * sizeof(float));
    b->kv_filled = pos + n_tokens;
    return BN_OK;
}

bn_status bn_cuda_backend_forward_sample(bn_cuda_backend *b, const int32_t *tokens,
                                         int64_t n_tokens, int64_t pos,
                                         const bn_cuda_sample_params *p, double u, int32_t *next,
                                         bn_error *err)
{
    if (!b || !next)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda forward: NULL argument");
    const bool greedy = choice_greedy(p);
    bn_status st = check_request(b, tokens, n_tokens, pos, err);
    if (st == BN_OK)
        st = check_choice(b, p, u, err);
    if (st == BN_OK)
        st = begin_call(b, err);
    if (st != BN_OK)
        return st;
    st = queue_step(b, tokens, n_tokens, pos, p, u, false, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
    if (st != BN_OK)
        return fail_pass(b, pos, st);
    *next = chosen_token(b, greedy, 0);
    b->kv_filled = pos + n_tokens;
    return BN_OK;
}

bn_status bn_cuda_backend_forward_greedy(bn_cuda_backend *b, const int32_t *tokens,
                                         int64_t n_tokens, int64_t pos, int32_t *next,
                                         bn_error *err)
{
    return bn_cuda_backend_forward_sample(b, tokens, n_tokens, pos, NULL, 0.0, next, err);
}

/* Queues one decode step at pos (reading d_dec image b->par; chained: its
 * token is the one the pending step picks) and notes it as pending. */
static bn_status submit_step(bn_cuda_backend *b, int32_t token, int64_t pos,
                             const bn_cuda_sample_params *p, double u, bool chained,
                             bn_error *err)
{
    const int par = b->par;
    bn_status st = queue_step(b, &token, 1, pos, p, u, chained, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(b->step_done[par], b->cs));
    b->par = 0;
    if (st != BN_OK)
        return fail_pass(b, b->n_pending ? b->pend[0].pos : pos, st);
    b->pend[b->n_pending++] = (struct pending_step){pos, choice_greedy(p), par};
    return BN_OK;
}

bn_status bn_cuda_backend_submit_sample(bn_cuda_backend *b, int32_t token, int64_t pos,
                                        const bn_cuda_sample_params *p, double u, bn_error *err)
{
    if (!b)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda submit: NULL backend");
    bn_status st = check_request(b, &token, 1, pos, err);
    if (st == BN_OK)
        st = check_choice(b, p, u, err);
    if (st == BN_OK)
        st = begin_call(b, err);
    if (st != BN_OK)
        return st;
    b->par = 0;
    return submit_step(b, token, pos, p, u, false, err);
}

bn_status bn_cuda_backend_submit_greedy(bn_cuda_backend *b, int32_t token, int64_t pos,
                                        bn_error *err)
{
    return bn_cuda_backend_submit_sample(b, token, pos, NULL, 0.0, err);
}

bn_status bn_cuda_backend_submit_chained(bn_cuda_backend *b, const bn_cuda_sample_params *p,
                                         double u, bn_error *err)
{
    if (!b)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda submit: NULL backend");
    if (b->n_pending != 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            b->n_pending ? "wait for the older step first"
                                         : "submit a step with its token first",
                            "cuda submit_chained: needs exactly one submitted step not yet "
                            "waited for (there are %d)",
                            b->n_pending);
    const int64_t pos = b->pend[0].pos + 1;
    if (pos >= b->kv_len)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "start a new context or create the backend with a longer kv_len",
                            "position %lld does not fit a KV cache of %lld positions",
                            (long long)pos, (long long)b->kv_len);
    bn_status st = check_choice(b, p, u, err);
    if (st != BN_OK)
        return st; /* the request: the pending step is left as it is */
    st = begin_call(b, err);
    if (st != BN_OK) /* the device: nothing is left pending, as for a failed step */
        return fail_pass(b, b->pend[0].pos, st);
    b->par = b->pend[0].par ^ 1;
    return submit_step(b, -1, pos, p, u, true, err);
}

bn_status bn_cuda_backend_wait_greedy(bn_cuda_backend *b, int32_t *next, bn_error *err)
{
    if (!b || !next || !b->n_pending)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda wait: no submitted step to wait for");
    const struct pending_step step = b->pend[0];
    bn_status st = BN_CUDA_STATUS(err, cudaEventSynchronize(b->step_done[step.par]));
    if (st != BN_OK)
        return fail_pass(b, step.pos, st);
    b->pend[0] = b->pend[1];
    b->n_pending--;
    *next = chosen_token(b, step.greedy, step.par);
    b->kv_filled = step.pos + 1;
    return BN_OK;
}

int bn_cuda_backend_pending(const bn_cuda_backend *b) { return b ? b->n_pending : 0; }

bn_status bn_cuda_backend_drop_pending(bn_cuda_backend *b, bn_error *err)
{
    if (!b)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda drop: NULL backend");
    if (!b->n_pending)
        return BN_OK;
    const int64_t pos = b->pend[0].pos;
    const bn_status st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
    /* The steps ran (or failed) but their tokens were never taken: their
     * positions are forgotten either way. */
    (void)fail_pass(b, pos, st);
    return st;
}

/* ---- creation: planning ------------------------------------------------------- */

static bn_status check_shape(const bn_cuda_backend *b, bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    const char *hint = "use --device cpu for this model";
    if (b->kv_f16) {
        const bn_attn_shape fs = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len, BN_ATTN_KV_F16,
                                  0.0f};
        if (bn_attn_check_shape(&fs) != cudaSuccess)
            return bn_error_set(err, BN_ERR_UNSUPPORTED, "use the fp32 KV cache or --device cpu",
                                "the fp16 KV cache attention kernels need head_dim 64, 128 or 256 "
                                "(this model: %d)",
                                hp->head_dim);
    } else if (hp->head_dim % 4 != 0 || hp->head_dim > 256) {
        return bn_error_set(err, BN_ERR_UNSUPPORTED, hint,
                            "the CUDA attention kernels need head_dim a multiple of 4 up to 256 "
                            "(this model: %d)",
                            hp->head_dim);
    }
    if (hp->n_head > 65535 || hp->n_head % hp->n_head_kv != 0)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, hint, "%d query heads over %d kv heads",
                            hp->n_head, hp->n_head_kv);
    if (hp->rope_dim != 0 && (hp->rope_dim < 2 || hp->rope_dim % 2 != 0 ||
                              hp->rope_dim > BN_ROPE_MAX_DIM || hp->rope_dim > hp->head_dim))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, hint,
                            "RoPE over %d dimensions (the CUDA kernels take an even count up to "
                            "%d and head_dim)",
                            hp->rope_dim, BN_ROPE_MAX_DIM);
    if (hp->vocab > BN_CUDA_SAMPLE_MAX_VOCAB || hp->dim > BN_CB_HEAD_MAX_DIM)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, hint,
                            "vocabulary %d / dim %d beyond the CUDA kernels' limits", hp->vocab,
                            hp->dim);
    if (b->kv_len > INT32_MAX / 2)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "use a shorter context",
                            "a KV cache of %lld positions", (long long)b->kv_len);
    return BN_OK;
}

/* How the embedding and the LM head will sit on the device. */
static bn_status plan_tables(bn_cuda_backend *b, bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    const bn_dense_matrix *emb = bn_checkpoint_embedding(b->model);
    const bn_dense_matrix *head = bn_checkpoint_lm_head(b->model);
    const bn_qtype_info *ei = bn_qtype_get(emb->type);
    if (!ei)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL, "unknown embedding type %d",
                            (int)emb->type);
    const bool native = bn_cuda_embed_supports(emb->type) && hp->dim % ei->block_elems == 0 &&
                        emb->row_bytes ==
                            (size_t)(hp->dim / ei->block_elems) * (size_t)ei->block_bytes;
    if (native) {
        b->embed_type = emb->type;
        b->embed_row_bytes = emb->row_bytes;
    } else {
        /* Not readable on the device as stored: dequantized rows, exact in
         * F32 when that is affordable. */
        const bool f32 = (uint64_t)hp->vocab * (uint64_t)hp->dim * 4 <= HEAD_F32_MAX;
        b->embed_type = f32 ? BN_QTYPE_F32 : BN_QTYPE_F16;
        b->embed_row_bytes = (size_t)hp->dim * (f32 ? 4 : 2);
    }
    b->embed_bytes = (uint64_t)hp->vocab * b->embed_row_bytes;

    int ht = -1;
    switch (head->type) {
    case BN_QTYPE_F32: ht = BN_CB_HEAD_F32; break;
    case BN_QTYPE_F16: ht = BN_CB_HEAD_F16; break;
    case BN_QTYPE_BF16: ht = BN_CB_HEAD_BF16; break;
    default: break;
    }
    const bool tied = head->data == emb->data && head->type == emb->type;
    if (ht >= 0 && tied && native) {
        b->head_type = ht;
        b->head_shared = true;
        b->head_bytes = 0;
        return BN_OK;
    }
    b->head_shared = false;
    if (ht >= 0 && head->row_bytes == (size_t)hp->dim * head_elem_bytes(ht)) {
        b->head_type = ht;
    } else {
        if (!bn_qtype_get(head->type) || !bn_qtype_get(head->type)->dequantize_row)
            return bn_error_set(err, BN_ERR_UNSUPPORTED, "use --device cpu",
                                "the LM head's encoding cannot be read row by row");
        b->head_type = (uint64_t)hp->vocab * (uint64_t)hp->dim * 4 <= HEAD_F32_MAX
                           ? BN_CB_HEAD_F32
                           : BN_CB_HEAD_F16;
    }
    b->head_bytes = head_table_bytes(b);
    return BN_OK;
}

typedef struct scratch_spec {
    void **ptr;
    size_t bytes;
} scratch_spec;

/* Whether a prefill chunk's GEMM of some projection group would run the
 * stream-K kernel (bn_w2a8_cuda_gemm_default_variant), so the backend needs
 * its workspace. Every layer has the first layer's shapes. */
static bool prefill_needs_streamk(const bn_cuda_backend *b)
{
    const int wgmma = bn_w2a8_cuda_gemm_wgmma_usable();
    for (int gi = 0; gi < G_COUNT; gi++) {
        const group *g = &b->groups[gi];
        for (int i = 0; i < (g->fused_ok ? 1 : g->n_seg); i++) {
            const bn_cuda_layout *l = g->fused_ok ? &g->fused : &g->s[i].l;
            const int v = bn_w2a8_cuda_gemm_default_variant(b->chunk, l->n, l->k_padded, wgmma,
                                                            b->sm);
            if (bn_w2a8_cuda_gemm_variant_streamk(v))
                return true;
        }
    }
    return false;
}

/* Every scratch buffer and its size (R = chunk rows); returns the count. */
static int scratch_list(bn_cuda_backend *b, scratch_spec *list)
{
    const bn_hparams *hp = &b->hp;
    const size_t R = (size_t)b->chunk, f = sizeof(float);
    int n = 0;
#define ADD(p_, size_) (list[n].ptr = (void **)(p_), list[n].bytes = (size_t)(size_), n++)
    ADD(&b->x, R * (size_t)hp->dim * f);
    ADD(&b->qkv, R * (size_t)b->qkv_n * f);
    ADD(&b->q, R * (size_t)b->q_dim * f);
    ADD(&b->att, R * (size_t)b->q_dim * f);
    ADD(&b->out, R * (size_t)hp->dim * f);
    ADD(&b->gu, R * (size_t)b->gu_n * f);
    ADD(&b->xq, R * (size_t)b->ldq);
    ADD(&b->act_scale, R * f);
    ADD(&b->act_sum, R * sizeof(int32_t));
    b->streamk = prefill_needs_streamk(b);
    ADD(&b->ws_streamk, b->streamk ? bn_w2a8_cuda_gemm_streamk_bytes(b->sm) : 0);
    size_t ws_attn;
    if (b->kv_f16) {
        const bn_attn_shape fs = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len, BN_ATTN_KV_F16,
                                  0.0f};
        b->attn_splits = bn_attn_decode_splits(&fs, 1, b->kv_len, b->sm);
        ws_attn = bn_attn_decode_workspace_bytes(&fs, 1, b->attn_splits);
    } else {
        const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len};
        b->attn_splits = bn_cb_attn_decode_splits(b->kv_len);
        ws_attn = bn_cb_attn_decode_workspace_bytes(&as, b->attn_splits);
    }
    ADD(&b->ws_attn, ws_attn);
    ADD(&b->attn_counters, (size_t)hp->n_head * sizeof(unsigned int));
    ADD(&b->d_best, sizeof(unsigned long long));
    /* cos and sin of every position the cache holds (none without RoPE). */
    ADD(&b->rope, (size_t)b->kv_len * (size_t)(hp->rope_dim / 2) * 2 * f);
    ADD(&b->normed, (size_t)hp->dim * f);
    ADD(&b->logits, (size_t)hp->vocab * f);
    ADD(&b->ws_sample, bn_cuda_sample_workspace_bytes(hp->vocab));
    ADD(&b->d_next, sizeof(int32_t));
    ADD(&b->d_cand, BN_CUDA_SAMPLE_MAX_CAND * sizeof(uint64_t));
    ADD(&b->d_cand_n, sizeof(unsigned));
    ADD(&b->d_cand_floor, sizeof(float));
    ADD(&b->d_tokens, (size_t)b->kv_len * sizeof(int32_t));
    ADD(&b->d_pos, (size_t)b->kv_len * sizeof(int32_t));
    ADD(&b->d_dec, 2 * DEC_STRIDE * sizeof(int32_t));
    ADD(&b->d_stage, 2 * (size_t)b->kv_len * sizeof(int32_t));
#undef ADD
    return n;
}

/* The screened head's buffers: the int8 copy [vocab][dim], (scale, bound
 * factor) per row, the rows' upper ends and the screen blocks' largest
 * lower ends. Sets b->head_parts. */
enum { HEAD_SCREEN_BUFFERS = 4 };
static void head_screen_list(bn_cuda_backend *b, scratch_spec *list)
{
    const size_t rows = (size_t)b->hp.vocab;
    b->head_parts = bn_cb_head_screen_blocks(b->hp.vocab, b->sm);
    list[0] = (scratch_spec){(void **)&b->d_head_q, rows * (size_t)b->hp.dim};
    list[1] = (scratch_spec){(void **)&b->d_head_se, rows * 2 * sizeof(float)};
    list[2] = (scratch_spec){(void **)&b->head_upper, rows * sizeof(float)};
    list[3] = (scratch_spec){(void **)&b->head_part, (size_t)b->head_parts * sizeof(float)};
}

static uint64_t round_alloc(size_t bytes)
{
    return bytes < 256 ? 256 : ((uint64_t)bytes + 255) / 256 * 256;
}

/* Fails with BN_ERR_GPU_OUT_OF_MEMORY when `total` exceeds `budget`, saying
 * what takes the memory and what to reduce. */
static bn_status check_budget(const bn_cuda_backend *b, uint64_t total, uint64_t budget,
                              const char *budget_name, bn_error *err)
{
    if (total <= budget)
        return BN_OK;
    const uint64_t fixed = total - b->kv_bytes;
    const double per_1k = (double)b->kv_bytes / (double)b->kv_len * 1024.0 / MIB;
    char hint[BN_ERROR_HINT_MAX];
    if (fixed >= budget) {
        snprintf(hint, sizeof hint,
                 "the model alone needs %.1f MiB: use a GPU with more memory, raise or unset "
                 "BITNET_MEMORY_LIMIT, or use --device cpu",
                 (double)fixed / MIB);
    } else {
        const long long fit = (long long)((budget - fixed) / (b->kv_bytes / (uint64_t)b->kv_len));
        snprintf(hint, sizeof hint,
                 "reduce the context: --ctx %lld or less fits (the KV cache takes %.2f MiB per "
                 "1024 positions); or raise BITNET_MEMORY_LIMIT",
                 fit, per_1k);
    }
    char copy[64] = "";
    if (b->head_screen_bytes)
        snprintf(copy, sizeof copy, " + %.1f for its int8 copy",
                 (double)b->head_screen_bytes / MIB);
    return bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY, hint,
                        "the model needs %.1f MiB of GPU memory (ternary weights %.1f, embedding "
                        "%.1f, LM head %.1f%s, KV cache %.1f for %lld positions, scratch %.1f for "
                        "%lld-token prefill batches), more than %s (%.1f MiB)",
                        (double)total / MIB, (double)b->w_bytes / MIB,
                        (double)b->embed_bytes / MIB, (double)b->head_bytes / MIB, copy,
                        (double)b->kv_bytes / MIB, (long long)b->kv_len,
                        (double)b->scratch_bytes / MIB, (long long)b->chunk, budget_name,
                        (double)budget / MIB);
}

/* ---- creation: uploads -------------------------------------------------------- */

typedef struct upload_job {
    bn_cuda_backend *b;
    int n_slots;
    int8_t *codes[MAX_UPLOAD_SLOTS];
    uint8_t *stage[MAX_UPLOAD_SLOTS][2];
    cudaEvent_t ev[MAX_UPLOAD_SLOTS][2];
    bool ev_live[MAX_UPLOAD_SLOTS][2];
    bn_status status[MAX_UPLOAD_SLOTS];
    bn_error errors[MAX_UPLOAD_SLOTS];
} upload_job;

/* Slot s unpacks projections s, s + n_slots, ... into its codes buffer,
 * packs each into one of its two pinned staging buffers and queues the
 * copy on the copy stream; before reusing a staging buffer it waits for the
 * copy that last read it, so packing overlaps the transfer. */
static void upload_one_slot(upload_job *job, int slot)
{
    bn_cuda_backend *b = job->b;
    bn_error *err = &job->errors[slot];
    bn_status st = bn_cuda_context_use(b->ctx, err);
    const int64_t count = (int64_t)b->hp.n_layer * BN_PROJ_COUNT;
    int buf = 0;
    for (int64_t i = slot; i < count && st == BN_OK; i += job->n_slots) {
        const int layer = (int)(i / BN_PROJ_COUNT);
        const bn_proj p = (bn_proj)(i % BN_PROJ_COUNT);
        seg *s = seg_of(b, layer, p);
        st = bn_checkpoint_projection_codes(b->model, layer, p, job->codes[slot], &s->scale, err);
        if (st == BN_OK && job->ev_live[slot][buf])
            st = BN_CUDA_STATUS(err, cudaEventSynchronize(job->ev[slot][buf]));
        if (st != BN_OK)
            break;
        bn_cuda_layout_pack(&s->l, job->codes[slot], job->stage[slot][buf]);
        st = BN_CUDA_STATUS(err, cudaMemcpyAsync(b->d_w + s->off, job->stage[slot][buf],
                                                 s->l.bytes, cudaMemcpyHostToDevice, b->copy));
        if (st == BN_OK)
            count_h2d(b, s->l.bytes);
        if (st == BN_OK)
            st = BN_CUDA_STATUS(err, cudaEventRecord(job->ev[slot][buf], b->copy));
        job->ev_live[slot][buf] = st == BN_OK;
        buf ^= 1;
    }
    job->status[slot] = st;
}

static void upload_slots(void *ctx, int64_t begin, int64_t end)
{
    for (int64_t s = begin; s < end; s++)
        upload_one_slot(ctx, (int)s);
}

static bn_status upload_weights(bn_cuda_backend *b, bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    int64_t max_codes = 0;
    size_t max_bytes = 0;
    for (int p = 0; p < BN_PROJ_COUNT; p++) {
        int64_t n, k;
        bn_hparams_proj_shape(hp, (bn_proj)p, &n, &k);
        max_codes = n * k > max_codes ? n * k : max_codes;
        const seg *s = seg_of(b, 0, (bn_proj)p);
        max_bytes = s->l.bytes > max_bytes ? s->l.bytes : max_bytes;
    }
    const int64_t count = (int64_t)hp->n_layer * BN_PROJ_COUNT;
    int slots = b->opt.threads > 0 ? b->opt.threads : bn_default_thread_count();
    slots = slots > MAX_UPLOAD_SLOTS ? MAX_UPLOAD_SLOTS : slots < 1 ? 1 : slots;
    slots = slots > count ? (int)count : slots;

    upload_job *job = calloc(1, sizeof *job);
    if (!job)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to upload weights");
    job->b = b;
    job->n_slots = slots;
    bn_status st = BN_OK;
    for (int s = 0; s < slots && st == BN_OK; s++) {
        if (!(job->codes[s] = malloc((size_t)max_codes)))
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "use fewer threads (BITNET_NUM_THREADS)",
                              "no memory to unpack projections (%d x %lld bytes)", slots,
                              (long long)max_codes);
        for (int k = 0; k < 2 && st == BN_OK; k++) {
            void *stage = NULL;
            st = BN_CUDA_STATUS(err, cudaMallocHost(&stage, max_bytes));
            if (st == BN_OK) {
                job->stage[s][k] = stage;
                st = BN_CUDA_STATUS(err, cudaEventCreateWithFlags(&job->ev[s][k],
                                                                  cudaEventDisableTiming));
            }
        }
    }
    bn_threadpool *pool = NULL;
    if (st == BN_OK)
        st = bn_threadpool_create(slots, &pool, err);
    if (st == BN_OK) {
        for (int s = 0; s < slots; s++)
            job->status[s] = BN_ERR_INTERNAL;
        bn_threadpool_run(pool, slots, 1, upload_slots, job);
        for (int s = 0; s < slots && st == BN_OK; s++)
            if (job->status[s] != BN_OK) {
                st = job->status[s];
                if (err)
                    *err = job->errors[s];
            }
    }
    bn_threadpool_destroy(pool);
    /* Whatever happened, no copy may still read the staging buffers. */
    bn_status sync = BN_CUDA_STATUS(st == BN_OK ? err : NULL, cudaStreamSynchronize(b->copy));
    if (st == BN_OK)
        st = sync;
    for (int s = 0; s < slots; s++) {
        free(job->codes[s]);
        for (int k = 0; k < 2; k++) {
            if (job->stage[s][k])
                cudaFreeHost(job->stage[s][k]);
            if (job->ev[s][k])
                cudaEventDestroy(job->ev[s][k]);
        }
    }
    free(job);
    return st;
}

/* A dense table as rows of `type` (F32 or F16) on the host, from the
 * model's rows of any encoding. */
static void *convert_rows(const bn_dense_matrix *m, bn_qtype type, bn_error *err)
{
    const size_t esz = type == BN_QTYPE_F32 ? 4 : 2;
    uint8_t *out = malloc((size_t)m->rows * (size_t)m->cols * esz);
    float *row = malloc((size_t)m->cols * sizeof(float));
    const bn_qtype_info *info = bn_qtype_get(m->type);
    if (!out || !row || !info || !info->dequantize_row) {
        free(out);
        free(row);
        bn_error_set(err, out && row ? BN_ERR_UNSUPPORTED : BN_ERR_OUT_OF_MEMORY, NULL,
                     "cannot convert a %lld x %lld table for the GPU", (long long)m->rows,
                     (long long)m->cols);
        return NULL;
    }
    for (int64_t r = 0; r < m->rows; r++) {
        info->dequantize_row((const uint8_t *)m->data + (size_t)r * m->row_bytes, row, m->cols);
        uint8_t *dst = out + (size_t)r * (size_t)m->cols * esz;
        if (type == BN_QTYPE_F32) {
            memcpy(dst, row, (size_t)m->cols * sizeof(float));
        } else {
            uint16_t *h = (uint16_t *)dst;
            for (int64_t i = 0; i < m->cols; i++)
                h[i] = bn_fp32_to_fp16(row[i]);
        }
    }
    free(row);
    return out;
}

/* Copies the host table into dst on the copy stream and waits (the source
 * may be a file mapping or a buffer freed right after). */
static bn_status upload_table(bn_cuda_backend *b, void *dst, const void *src, uint64_t bytes,
                              bn_error *err)
{
    BN_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, b->copy));
    count_h2d(b, bytes);
    BN_CUDA_TRY(err, cudaStreamSynchronize(b->copy));
    return BN_OK;
}

static bn_status upload_tables(bn_cuda_backend *b, bn_error *err)
{
    const bn_dense_matrix *emb = bn_checkpoint_embedding(b->model);
    const bn_dense_matrix *head = bn_checkpoint_lm_head(b->model);
    bn_status st;
    if (b->embed_type == emb->type) {
        st = upload_table(b, b->d_embed, emb->data, b->embed_bytes, err);
    } else {
        void *rows = convert_rows(emb, b->embed_type, err);
        if (!rows)
            return err ? err->status : BN_ERR_OUT_OF_MEMORY;
        st = upload_table(b, b->d_embed, rows, b->embed_bytes, err);
        free(rows);
    }
    if (st != BN_OK || b->head_shared)
        return st;
    const bn_qtype want = b->head_type == BN_CB_HEAD_F32   ? BN_QTYPE_F32
                          : b->head_type == BN_CB_HEAD_F16 ? BN_QTYPE_F16
                                                           : BN_QTYPE_BF16;
    if (head->type == want)
        return upload_table(b, b->d_head, head->data, b->head_bytes, err);
    void *rows = convert_rows(head, want, err);
    if (!rows)
        return err ? err->status : BN_ERR_OUT_OF_MEMORY;
    st = upload_table(b, b->d_head, rows, b->head_bytes, err);
    free(rows);
    return st;
}

static bn_status upload_norms(bn_cuda_backend *b, bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    const size_t count = b->norms_bytes / sizeof(float);
    float *host = malloc(b->norms_bytes);
    if (!host)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the norm weights");
    for (int l = 0; l < hp->n_layer; l++)
        for (int w = 0; w < BN_NORM_COUNT; w++)
            memcpy(host + (int64_t)l * b->layer_norms + b->norm_off[w],
                   bn_checkpoint_norm(b->model, l, (bn_norm)w),
                   (size_t)bn_hparams_norm_size(hp, (bn_norm)w) * sizeof(float));
    memcpy(host + b->out_norm_off, bn_checkpoint_output_norm(b->model),
           (size_t)hp->dim * sizeof(float));
    bn_status st = upload_table(b, b->d_norms, host, count * sizeof(float), err);
    free(host);
    return st;
}

/* ---- creation: graph ------------------------------------------------------------ */

/* Records the decode step once. A failure is not fatal: decode then
 * launches eagerly, which computes the same thing. A capture with
 * programmatic dependent launch that fails (a driver that cannot put it in
 * a graph) is retried without it. */
typedef enum { STEP_GREEDY, STEP_LOGITS, STEP_SAMPLED } step_kind;
static bool capture_graph_once(bn_cuda_backend *b, bool log_failure, step_kind kind, int par);

static void free_stage_map(bn_cuda_backend *b)
{
    free(b->graph_nodes);
    free(b->graph_node_stage);
    b->graph_nodes = NULL;
    b->graph_node_stage = NULL;
    b->n_graph_nodes = 0;
    if (b->graph_src)
        cudaGraphDestroy(b->graph_src);
    b->graph_src = NULL;
}

/* Names the stage of every kernel node of the captured decode graph: the
 * capture is one chain, so walking it from its root meets the kernels in
 * launch order, and mark() logged how many each stage launched. False (no
 * map, nothing kept) when the graph is not such a chain or the counts
 * disagree: only the skip timing needs the map. */
static bool map_graph_stages(bn_cuda_backend *b, cudaGraph_t graph)
{
    free_stage_map(b);
    int total = 0;
    for (int i = 1; i < b->n_capture; i += 2)
        total += b->capture_stages[i];
    if (!b->capture_stages || total <= 0)
        return false;
    b->graph_nodes = calloc((size_t)total, sizeof *b->graph_nodes);
    b->graph_node_stage = calloc((size_t)total, 1);
    if (!b->graph_nodes || !b->graph_node_stage) {
        free_stage_map(b);
        return false;
    }
    cudaGraphNode_t node = NULL;
    size_t n = 1;
    bool ok = cudaGraphGetRootNodes(graph, &node, &n) == cudaSuccess && n == 1;
    int found = 0, entry = 0, left = b->n_capture > 1 ? b->capture_stages[1] : 0;
    while (ok && node) {
        enum cudaGraphNodeType type;
        ok = cudaGraphNodeGetType(node, &type) == cudaSuccess;
        if (ok && type == cudaGraphNodeTypeKernel) {
            while (left == 0 && entry + 3 < b->n_capture) {
                entry += 2;
                left = b->capture_stages[entry + 1];
            }
            ok = found < total && left > 0;
            if (ok) {
                b->graph_nodes[found] = node;
                b->graph_node_stage[found++] = (unsigned char)b->capture_stages[entry];
                left--;
            }
        }
        /* With edge data: programmatic (PDL) edges carry some, and a query
         * without it fails as lossy. */
        cudaGraphNode_t next[2];
        cudaGraphEdgeData edges[2];
        n = 2;
        ok = ok && cudaGraphNodeGetDependentNodes(node, next, edges, &n) == cudaSuccess && n <= 1;
        node = ok && n == 1 ? next[0] : NULL;
    }
    (void)cudaGetLastError();
    b->stage_map_why = !ok ? "the decode graph is not one chain of kernels in launch order"
                           : "the decode graph's kernels and the stages' launches differ in number";
    if (!ok || found != total) {
        free_stage_map(b);
        return false;
    }
    b->n_graph_nodes = found;
    return true;
}

/* The greedy step's graph (with the stage map), then, when the head is
 * screened, the graph of a step that returns logits, and the sampled
 * step's; the greedy and sampled ones again reading the second d_dec image
 * (chained steps alternate between the two). */
static void capture_graph(bn_cuda_backend *b)
{
    if (!capture_graph_once(b, !b->pdl, STEP_GREEDY, 0) && b->pdl) {
        bn_log(BN_LOG_WARN, "cuda backend: capturing the decode step with programmatic dependent "
                            "launch failed; capturing it without");
        b->pdl = false;
        (void)capture_graph_once(b, true, STEP_GREEDY, 0);
    }
    if (b->graph.exec && b->head_screen)
        (void)capture_graph_once(b, true, STEP_LOGITS, 0);
    if (b->graph.exec)
        (void)capture_graph_once(b, true, STEP_SAMPLED, 0);
    if (b->graph.exec)
        (void)capture_graph_once(b, true, STEP_GREEDY, 1);
    if (b->graph_sample.exec)
        (void)capture_graph_once(b, true, STEP_SAMPLED, 1);
}

/* The step of `kind` into its graph: the greedy step (screened head when
 * b->head_screen, then the hand-off of its key) into b->graph, with the
 * stage map; the step with the full LM head into b->graph_logits; the
 * greedy step's kernels, then the sampler, which reads its parameters and
 * uniform number from d_dec, and the hand-off of its token into
 * b->graph_sample. par 1: the same reading the second d_dec image, into
 * graph1 / graph_sample1. */
static bool capture_graph_once(bn_cuda_backend *b, bool log_failure, step_kind kind, int par)
{
    const bool logits = kind == STEP_LOGITS;
    step_graph *g = kind == STEP_GREEDY ? (par ? &b->graph1 : &b->graph)
                    : logits            ? &b->graph_logits
                                        : (par ? &b->graph_sample1 : &b->graph_sample);
    cudaGraphExec_t *exec = &g->exec;
    bn_error cerr;
    bn_error_clear(&cerr);
    cudaGraph_t graph = NULL;
    cudaError_t rc = cudaStreamBeginCapture(b->cs, cudaStreamCaptureModeRelaxed);
    bn_status st = BN_ERR_GPU;
    const unsigned before = b->ran;
    /* The stages in launch order, for bn_cuda_backend_time_decode_without. */
    b->cap_capture = 4 * (b->hp.n_layer * 16 + 8);
    b->capture_stages = calloc((size_t)b->cap_capture, sizeof *b->capture_stages);
    b->n_capture = 0;
    b->capture_launches = 0;
    if (rc == cudaSuccess) {
        b->ran = 0;
        b->par = par;
        int32_t *dec = dec_dev(b);
        st = enqueue_rows(b, 1, dec, dec + 1, dec + 2, 0, b->head_screen && !logits, &cerr);
        if (st == BN_OK && kind == STEP_SAMPLED)
            st = queue_sampler(b, &cerr);
        /* The choice's hand-off, where the graph makes the choice. */
        if (st == BN_OK && (kind == STEP_SAMPLED || (kind == STEP_GREEDY && b->head_screen)))
            st = queue_handoff(b, kind == STEP_GREEDY, &cerr);
        b->par = 0;
        g->kernels = b->ran;
        g->launches = b->capture_launches;
        b->ran = before;
        const cudaError_t end = cudaStreamEndCapture(b->cs, &graph);
        if (end != cudaSuccess && st == BN_OK) {
            st = BN_ERR_GPU;
            rc = end;
        }
    }
    if (st == BN_OK && graph) {
        rc = cudaGraphInstantiate(exec, graph, 0);
        if (rc != cudaSuccess) {
            *exec = NULL;
            st = BN_ERR_GPU;
        }
    }
    if (st == BN_OK && kind == STEP_GREEDY && par == 0 && map_graph_stages(b, graph)) {
        b->graph_src = graph; /* kept: its nodes name the exec graph's nodes */
        graph = NULL;
    }
    free(b->capture_stages);
    b->capture_stages = NULL;
    if (graph)
        cudaGraphDestroy(graph);
    if (st != BN_OK || !*exec) {
        *exec = NULL;
        (void)cudaGetLastError();
        static const char *const what[] = {"decode", "the full-head decode",
                                           "the sampled decode"};
        static const char *const steps[] = {"decode steps", "decode steps that return logits",
                                            "sampled decode steps"};
        if (log_failure)
            bn_log(BN_LOG_WARN, "cuda backend: %s graph%s capture failed (%s); %s%s launch "
                                "their kernels one by one",
                   what[kind], par ? " (second input image)" : "",
                   cerr.message[0] ? cerr.message : cudaGetErrorString(rc), steps[kind],
                   par ? " chained onto that image" : "");
        return false;
    }
    return true;
}

/* Runs prefills of a whole chunk (the GEMMs the backend takes for its
 * largest prefill batches, the prefill attention in parts and its merge),
 * of 40 tokens (the mma-rows GEMM, or the 192 x 64 wgmma GEMM on Hopper
 * for matrices of many rows) and 40 more after them (the attention in
 * parts whatever the chunk), of 2 tokens (the GEMV over rows) and one
 * decode step, all of token 0 from position 0 on, so that the kernels are
 * loaded and known to run on this device before the engine commits to the
 * GPU, before graph capture (which must not be a kernel's first launch) and
 * before anything is timed (a kernel's first launch loads it: without the
 * whole chunk, the first long prompt paid that). The cache positions
 * written are forgotten. A decode step that fails with programmatic
 * dependent launch (a driver that rejects the launch attribute) is retried
 * without. */
static bn_status warm_up(bn_cuda_backend *b, bn_error *err)
{
    const int64_t whole = b->chunk < b->kv_len ? b->chunk : b->kv_len;
    int32_t *zeros = calloc((size_t)(whole > 40 ? whole : 40), sizeof *zeros);
    if (!zeros)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "no host memory for the CUDA backend's warm-up");
    const int64_t n = b->kv_len < 40 ? b->kv_len : 40;
    const bool graphs = b->use_graphs;
    b->use_graphs = false;
    int32_t next;
    bn_status st = BN_OK;
    if (whole > 40)
        st = bn_cuda_backend_forward_greedy(b, zeros, whole, 0, &next, err);
    if (st == BN_OK && n >= 2)
        st = bn_cuda_backend_forward_greedy(b, zeros, n, 0, &next, err);
    if (st == BN_OK && n == 40 && b->kv_len >= 80) /* 80 positions: two tiles */
        st = bn_cuda_backend_forward_greedy(b, zeros, n, n, &next, err);
    if (st == BN_OK && n >= 2) /* two rows: the GEMV over rows */
        st = bn_cuda_backend_forward_greedy(b, zeros, 2, 0, &next, err);
    if (st == BN_OK && b->pdl) {
        bn_error perr;
        bn_error_clear(&perr);
        if (bn_cuda_backend_forward_greedy(b, zeros, 1, 0, &next, &perr) != BN_OK) {
            bn_log(BN_LOG_WARN, "cuda backend: a decode step with programmatic dependent launch "
                                "failed (%s); decoding without it",
                   perr.message);
            b->pdl = false;
        }
    }
    if (st == BN_OK && !b->pdl)
        st = bn_cuda_backend_forward_greedy(b, zeros, 1, 0, &next, err);
    /* A sampled step: the sampler's first launch, before graph_sample's
     * capture. */
    const bn_cuda_sample_params one = {1.0f, 1, 1.0f, 0.0f};
    if (st == BN_OK && bn_cuda_backend_sample_supported(b, &one))
        st = bn_cuda_backend_forward_sample(b, zeros, 1, 0, &one, 0.5, &next, err);
    if (st == BN_OK && b->head_screen) { /* greedy steps screened; the full head once too */
        st = BN_CUDA_STATUS(err, bn_cb_head_gemv(b->d_head, b->head_type, b->hp.vocab, b->hp.dim,
                                                 b->normed, b->logits, b->sm, b->cs));
        if (st == BN_OK)
            st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
    }
    free(zeros);
    b->use_graphs = graphs;
    b->kv_filled = 0;
    b->calls = 0;
    return st;
}

/* ---- create / free ------------------------------------------------------------------ */

static bn_status pick_device(int requested, int *device, bn_error *err)
{
    if (requested >= 0) {
        *device = requested;
        return BN_OK;
    }
    bn_cuda_report *r = calloc(1, sizeof *r);
    if (!r)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to query CUDA devices");
    bn_cuda_query(r);
    bn_status st = r->status;
    if (st != BN_OK)
        bn_error_set(err, st, r->hint[0] ? r->hint : NULL, "%s", r->reason);
    else
        *device = r->devices[bn_cuda_best_device(r->devices, r->device_count)].id;
    free(r);
    return st;
}

bn_status bn_cuda_backend_create(const bn_checkpoint *model, const bn_cuda_backend_options *opt_in,
                                 bn_cuda_backend **out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda backend: NULL output");
    *out = NULL;
    if (!model)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda backend: NULL model");
    bn_cuda_backend_options opt;
    if (opt_in)
        opt = *opt_in;
    else
        bn_cuda_backend_options_default(&opt);
    const bn_hparams *hp = bn_checkpoint_hparams(model);
    int64_t kv_len = opt.kv_len == 0 ? hp->n_ctx_train : opt.kv_len;
    if (kv_len < 1 || kv_len > hp->n_ctx_train)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "ask for at most the model's training context",
                            "KV cache of %lld positions requested; the model's context is %d",
                            (long long)kv_len, (int)hp->n_ctx_train);
    if (opt.kv_type != BN_CUDA_KV_F32 && opt.kv_type != BN_CUDA_KV_F16)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "unknown KV cache type %d",
                            (int)opt.kv_type);
    if ((int)opt.fusion < BN_CUDA_FUSION_AUTO || (int)opt.fusion > BN_CUDA_FUSION_ALL)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda backend: fusion must be auto, separate, norms or all (got %d)",
                            (int)opt.fusion);
    if (opt.prefill_chunk < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "negative prefill chunk");
    if (opt.attn_qkv < -1 || opt.attn_qkv > 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda backend: attn_qkv must be -1 or 0 (got %d)", opt.attn_qkv);
    if (opt.gate_up_pair < -1 || opt.gate_up_pair > 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda backend: gate_up_pair must be -1 or 0 (got %d)",
                            opt.gate_up_pair);
    if (opt.head_screen < -1 || opt.head_screen > 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda backend: head_screen must be -1, 0 or 1 (got %d)",
                            opt.head_screen);
    if (opt.gate_up_cluster != -1 && opt.gate_up_cluster != 0 && opt.gate_up_cluster != 16)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda backend: gate_up_cluster must be -1, 0 or 16 (got %d)",
                            opt.gate_up_cluster);
    if (opt.gemv_cluster != -1 && opt.gemv_cluster != 0 && opt.gemv_cluster != 2 &&
        opt.gemv_cluster != 4 && opt.gemv_cluster != 8)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda backend: gemv_cluster must be -1, 0, 2, 4 or 8 (got %d)",
                            opt.gemv_cluster);

    bn_cuda_backend *b = calloc(1, sizeof *b);
    if (!b)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a CUDA backend");
    b->model = model;
    b->hp = *hp;
    b->opt = opt;
    b->kv_len = kv_len;
    b->kv_f16 = opt.kv_type == BN_CUDA_KV_F16;
    b->kv_elem = b->kv_f16 ? 2 : 4;
    b->q_dim = (int64_t)hp->n_head * hp->head_dim;
    b->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    b->qkv_n = b->q_dim + 2 * b->kv_dim;
    b->gu_n = 2 * (int64_t)hp->ffn;
    b->chunk = opt.prefill_chunk > 0 ? opt.prefill_chunk : DEFAULT_CHUNK;
    if (b->chunk > kv_len)
        b->chunk = kv_len;
    b->use_graphs = !opt.no_graphs;

    bn_status st = check_shape(b, err);
    if (st == BN_OK)
        st = pick_device(opt.device, &b->device, err);
    if (st == BN_OK)
        st = bn_cuda_context_create(b->device, &b->ctx, err);
    if (st != BN_OK) {
        bn_cuda_backend_free(b);
        return st;
    }
    const bn_cuda_device *dev = bn_cuda_context_device(b->ctx);
    b->sm = dev->sm_count > 0 ? dev->sm_count : 1;
    snprintf(b->name, sizeof b->name, "%s", dev->name);
    b->cs = bn_cuda_context_compute_stream(b->ctx);
    b->copy = bn_cuda_context_copy_stream(b->ctx);

    /* The plan: every size before any allocation. */
    b->groups = calloc((size_t)hp->n_layer * G_COUNT, sizeof *b->groups);
    if (!b->groups) {
        bn_cuda_backend_free(b);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for weight tables");
    }
    setup_groups(b);
    int64_t off = 0;
    for (int w = 0; w < BN_NORM_COUNT; w++) {
        b->norm_off[w] = off;
        off += bn_hparams_norm_size(hp, (bn_norm)w);
    }
    b->layer_norms = off;
    b->out_norm_off = off * hp->n_layer;
    b->norms_bytes = (uint64_t)(b->out_norm_off + hp->dim) * sizeof(float);
    b->kv_bytes = 2 * (uint64_t)hp->n_layer * (uint64_t)kv_len * (uint64_t)b->kv_dim * b->kv_elem;
    st = plan_tables(b, err);
    if (st != BN_OK) {
        bn_cuda_backend_free(b);
        return st;
    }
    /* The screened head of greedy steps: its int8 copy and per-row data. */
    const bool screen_auto = opt.head_screen == 0;
    b->head_screen =
        opt.head_screen > 0 || (screen_auto && head_table_bytes(b) >= HEAD_SCREEN_MIN);
    scratch_spec screen[HEAD_SCREEN_BUFFERS];
    head_screen_list(b, screen);
    uint64_t screen_bytes = 0;
    for (int i = 0; i < HEAD_SCREEN_BUFFERS; i++)
        screen_bytes += round_alloc(screen[i].bytes);
    scratch_spec scratch[32];
    const int n_scratch = scratch_list(b, scratch);
    /* scratch_bytes is what is allocated (dalloc's 256-byte minimum); the
     * budget also counts cudaMalloc's rounding to 256 bytes. */
    b->scratch_bytes = 0;
    uint64_t total = round_alloc(b->w_bytes) + round_alloc(b->embed_bytes) +
                     (b->head_shared ? 0 : round_alloc(b->head_bytes)) +
                     round_alloc(b->norms_bytes) + 2 * round_alloc(b->kv_bytes / 2);
    for (int i = 0; i < n_scratch; i++) {
        b->scratch_bytes += scratch[i].bytes < 256 ? 256 : scratch[i].bytes;
        total += round_alloc(scratch[i].bytes);
    }

    size_t free_bytes = 0, total_bytes = 0;
    st = BN_CUDA_STATUS(err, cudaMemGetInfo(&free_bytes, &total_bytes));
    const uint64_t usable = free_bytes > DEVICE_RESERVE ? free_bytes - DEVICE_RESERVE : 0;
    if (st == BN_OK && b->head_screen) {
        const uint64_t budget =
            opt.memory_limit > 0 && opt.memory_limit < usable ? opt.memory_limit : usable;
        if (screen_auto && total + screen_bytes > budget) {
            /* Without room the copy is left out (and a plan that does not fit
             * anyway is reported without it). */
            if (total <= budget)
                bn_log(BN_LOG_INFO, "cuda backend: no room for the LM head's int8 copy (%.1f "
                                    "MiB): greedy steps read the whole head",
                       (double)screen_bytes / MIB);
            b->head_screen = false;
        } else {
            b->head_screen_bytes = screen_bytes;
            total += screen_bytes;
        }
    }
    if (st == BN_OK && opt.memory_limit > 0)
        st = check_budget(b, total, opt.memory_limit, "the memory limit (BITNET_MEMORY_LIMIT)",
                          err);
    if (st == BN_OK) {
        char what[320];
        snprintf(what, sizeof what, "the free memory of cuda:%d (%s)", b->device, b->name);
        st = check_budget(b, total, usable, what, err);
    }

    /* Allocation, then the uploads. */
    if (st == BN_OK)
        st = dalloc(b, b->w_bytes, (void **)&b->d_w, err);
    if (st == BN_OK)
        st = dalloc(b, b->embed_bytes, &b->d_embed, err);
    if (st == BN_OK) {
        if (b->head_shared)
            b->d_head = b->d_embed;
        else
            st = dalloc(b, b->head_bytes, &b->d_head, err);
    }
    for (int i = 0; i < HEAD_SCREEN_BUFFERS && st == BN_OK && b->head_screen; i++)
        st = dalloc(b, screen[i].bytes, screen[i].ptr, err);
    if (st == BN_OK)
        st = dalloc(b, b->norms_bytes, (void **)&b->d_norms, err);
    if (st == BN_OK)
        st = dalloc(b, b->kv_bytes / 2, &b->d_k, err);
    if (st == BN_OK)
        st = dalloc(b, b->kv_bytes / 2, &b->d_v, err);
    for (int i = 0; i < n_scratch && st == BN_OK; i++)
        st = dalloc(b, scratch[i].bytes, scratch[i].ptr, err);
    void *pinned = NULL;
    if (st == BN_OK &&
        (st = BN_CUDA_STATUS(err, cudaMallocHost(&pinned, (size_t)(2 * kv_len + 2 * H_TAIL) *
                                                              sizeof(int32_t)))) == BN_OK)
        b->h_io = pinned;
    /* Pinned memory is mapped wherever the device has unified addressing
     * (every 64-bit platform CUDA supports); without, tokens are copied. */
    void *alias = NULL;
    if (b->h_io && !opt.copy_tokens && cudaHostGetDevicePointer(&alias, b->h_io, 0) == cudaSuccess)
        b->h_io_dev = alias;
    (void)cudaGetLastError();
    pinned = NULL;
    if (st == BN_OK &&
        (st = BN_CUDA_STATUS(err, cudaMallocHost(&pinned, (size_t)hp->vocab * sizeof(float)))) ==
            BN_OK)
        b->h_logits = pinned;
    pinned = NULL;
    if (st == BN_OK && (st = BN_CUDA_STATUS(err, cudaMallocHost(&pinned, 2 * (size_t)kv_len *
                                                                             sizeof(int32_t)))) ==
                           BN_OK)
        b->h_stage = pinned;
    for (int i = 0; i < 2 && st == BN_OK; i++)
        st = BN_CUDA_STATUS(err, cudaEventCreateWithFlags(&b->step_done[i],
                                                          cudaEventDisableTiming));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventCreateWithFlags(&b->stage_copied,
                                                          cudaEventDisableTiming));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventCreateWithFlags(&b->stage_read,
                                                          cudaEventDisableTiming));
    /* Never-written cache positions are never read; zeros keep a stray read
     * (a bug) visible as zeros rather than garbage. */
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemsetAsync(b->d_k, 0, b->kv_bytes / 2, b->copy));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemsetAsync(b->d_v, 0, b->kv_bytes / 2, b->copy));
    /* The stream-K GEMM's counters start at 0 and every call leaves them there. */
    if (st == BN_OK && b->streamk)
        st = BN_CUDA_STATUS(err, cudaMemsetAsync(b->ws_streamk, 0,
                                                 bn_w2a8_cuda_gemm_streamk_bytes(b->sm), b->copy));
    /* The decode attention's counters start at 0 and every launch leaves
     * them there. */
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemsetAsync(b->attn_counters, 0,
                                                 (size_t)hp->n_head * sizeof(unsigned int),
                                                 b->copy));
    /* So is the sampler's ticket, the workspace's last word (sample_cuda.h). */
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemsetAsync(b->ws_sample, 0,
                                                 bn_cuda_sample_workspace_bytes(hp->vocab),
                                                 b->copy));
    if (st == BN_OK) {
        if (hp->rope_dim > 0) {
            if (bn_rope_freqs_init(&b->freqs, hp->rope_theta, hp->rope_dim) != cudaSuccess)
                st = bn_error_set(err, BN_ERR_UNSUPPORTED, NULL, "RoPE theta %g, dim %d",
                                  (double)hp->rope_theta, hp->rope_dim);
            else /* on the copy stream, which is drained before the first pass */
                st = BN_CUDA_STATUS(err, bn_cb_rope_table(&b->freqs, b->kv_len, b->rope,
                                                          b->copy));
        } else {
            memset(&b->freqs, 0, sizeof b->freqs);
        }
    }
    const double t0 = bn_time_seconds();
    if (st == BN_OK)
        st = upload_norms(b, err);
    if (st == BN_OK)
        st = upload_tables(b, err);
    if (st == BN_OK)
        st = upload_weights(b, err);
    const double t1 = bn_time_seconds();
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->copy));
    if (st == BN_OK && !b->kv_f16) {
        st = BN_CUDA_STATUS(err, bn_cb_attn_prefill_prepare(hp->head_dim));
        const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len};
        b->attn_cluster =
            opt.attn_cluster < 0 ? 0 : bn_cb_attn_decode_cluster(&as, opt.attn_cluster);
    }
    if (st == BN_OK) {
        /* The decode GEMVs' activation staging, where the device and the
         * build have clusters (else every block stages its own). */
        const int want = opt.gemv_cluster == 0 ? DEFAULT_GEMV_CLUSTER : opt.gemv_cluster;
        b->gemv_cluster = want > 1 && bn_w2a8_cuda_gemv_cluster_usable() ? want : 0;
    }
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, bn_cb_head_prepare(b->head_type, hp->dim));
    if (st == BN_OK && b->head_screen) {
        st = BN_CUDA_STATUS(err, bn_cb_head_screen_prepare(b->head_type, hp->dim));
        if (st == BN_OK)
            st = BN_CUDA_STATUS(err, bn_cb_head_quantize(b->d_head, b->head_type, hp->vocab,
                                                         hp->dim, b->d_head_q, b->d_head_se,
                                                         b->cs));
    }
    if (st == BN_OK)
        b->pdl = !opt.no_pdl && bn_cb_pdl_supported(b->device);
    if (st == BN_OK) {
        /* Folding needs every group in one launch and every source row
         * within the decode GEMV's limits; otherwise separate kernels. */
        b->fusion = opt.fusion == BN_CUDA_FUSION_AUTO ? BN_CUDA_FUSION_SEPARATE : opt.fusion;
        for (int i = 0; i < hp->n_layer * G_COUNT && b->fusion != BN_CUDA_FUSION_SEPARATE;
             i++) {
            const group *g = &b->groups[i];
            const int src = i % G_COUNT != G_DOWN                 ? BN_CB_SRC_NORM
                            : b->fusion == BN_CUDA_FUSION_ALL ? BN_CB_SRC_RELU2
                                                              : BN_CB_SRC_CODES;
            if (!g->fused_ok || !bn_cb_decode_gemv_fits(src, g->k, g->fused.groups)) {
                bn_log(BN_LOG_INFO, "cuda backend: fusion %s not possible (a %lld-wide row "
                                    "does not fit the decode GEMV): separate norm kernels",
                       bn_cuda_fusion_name(b->fusion), (long long)g->k);
                b->fusion = BN_CUDA_FUSION_SEPARATE;
            }
        }
    }
    if (st == BN_OK && opt.gate_up_pair == 0 && b->fusion == BN_CUDA_FUSION_SEPARATE) {
        /* The pair GEMV needs gate and up in one launch, each of whole
         * tiles (every layer has layer 0's shapes). */
        const group *g = &b->groups[G_GU];
        b->gu_pair = g->fused_ok && g->n_seg == 2 && g->s[0].n == g->s[1].n &&
                     bn_w2a8_cuda_gemv_pair_fits(g->fused.n, g->fused.tiles, g->fused.groups);
    }
    if (st == BN_OK) {
        /* The pair GEMV's staging: clusters of 16 halve the clusters asking
         * L2 for the same row (docs/CUDA.md), where the device holds them. */
        const bool want16 = opt.gate_up_cluster == 16 ||
                            (opt.gate_up_cluster == 0 && b->gemv_cluster > 1);
        const bn_w2a8_cuda_args a = pair_args(b, &b->groups[G_GU]);
        b->gu_cluster = b->gu_pair && want16 &&
                                bn_w2a8_cuda_gemv_pair_cluster16(&a, b->groups[G_GU].split)
                            ? 16
                            : b->gemv_cluster;
    }
    if (st == BN_OK && opt.attn_qkv == 0 && !b->kv_f16 && b->attn_cluster > 0 &&
        b->fusion == BN_CUDA_FUSION_SEPARATE) {
        /* The decode attention computes q|k|v itself where its clusters can
         * hold their share of the weights (every layer has layer 0's shapes). */
        const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len};
        b->attn_qkv = b->groups[G_QKV].fused_ok &&
                      bn_cb_attn_decode_qkv_prepare(&as, b->attn_cluster,
                                                    b->groups[G_QKV].k) == cudaSuccess;
        (void)cudaGetLastError();
    }
    if (st == BN_OK)
        st = warm_up(b, err);
    if (st == BN_OK && b->use_graphs)
        capture_graph(b);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemGetInfo(&free_bytes, &total_bytes));
    if (st != BN_OK) {
        bn_cuda_backend_free(b);
        return st;
    }
    b->device_total = total_bytes;
    b->device_free = free_bytes;
    b->ran = 0; /* the warm-up does not count as running */
    bn_log(BN_LOG_INFO,
           "cuda backend: cuda:%d %s, %d SMs; weights %.1f MiB packed in %.2f s, embedding %.1f "
           "MiB, LM head %s %.1f MiB%s%s, KV cache %s %.1f MiB (%lld positions), scratch %.1f MiB "
           "(%lld-token prefill), decode graph %s, programmatic dependent launch %s, fusion %s",
           b->device, b->name, b->sm, (double)b->w_bytes / MIB, t1 - t0,
           (double)b->embed_bytes / MIB, head_type_name(b->head_type),
           (double)head_table_bytes(b) / MIB,
           b->head_shared ? " (the embedding)" : "",
           b->head_screen ? " + its int8 copy (greedy steps screen the head)" : "",
           b->kv_f16 ? "f16" : "f32",
           (double)b->kv_bytes / MIB, (long long)kv_len, (double)b->scratch_bytes / MIB,
           (long long)b->chunk, b->graph.exec ? "captured" : "off", b->pdl ? "on" : "off",
           bn_cuda_fusion_name(b->fusion));
    *out = b;
    return BN_OK;
}

void bn_cuda_backend_free(bn_cuda_backend *b)
{
    if (!b)
        return;
    if (b->ctx) {
        (void)bn_cuda_context_use(b->ctx, NULL);
        (void)cudaStreamSynchronize(b->cs);
        (void)cudaStreamSynchronize(b->copy); /* a staged prompt's copy */
        step_graph *graphs[] = {&b->graph, &b->graph_logits, &b->graph_sample, &b->graph1,
                                &b->graph_sample1};
        for (size_t i = 0; i < sizeof graphs / sizeof graphs[0]; i++)
            if (graphs[i]->exec)
                cudaGraphExecDestroy(graphs[i]->exec);
        for (int i = 0; i < 2; i++)
            if (b->step_done[i])
                cudaEventDestroy(b->step_done[i]);
        if (b->stage_copied)
            cudaEventDestroy(b->stage_copied);
        if (b->stage_read)
            cudaEventDestroy(b->stage_read);
        free_stage_map(b);
        for (int i = 0; i < b->n_allocs; i++)
            bn_cuda_context_free(b->ctx, b->allocs[i].p, b->allocs[i].bytes);
        if (b->h_io)
            cudaFreeHost(b->h_io);
        if (b->h_logits)
            cudaFreeHost(b->h_logits);
        if (b->h_stage)
            cudaFreeHost(b->h_stage);
        (void)cudaGetLastError();
        bn_cuda_context_destroy(b->ctx);
    }
    free(b->groups);
    free(b);
}

/* ---- queries ------------------------------------------------------------------------ */

int64_t bn_cuda_backend_kv_len(const bn_cuda_backend *b) { return b->kv_len; }
int64_t bn_cuda_backend_kv_filled(const bn_cuda_backend *b) { return b->kv_filled; }
int64_t bn_cuda_backend_prefill_chunk(const bn_cuda_backend *b) { return b->chunk; }
void bn_cuda_backend_reset(bn_cuda_backend *b)
{
    if (b->n_pending) /* submitted steps nobody waited for */
        (void)fail_pass(b, 0, BN_OK);
    b->kv_filled = 0;
}
int bn_cuda_backend_device(const bn_cuda_backend *b) { return b->device; }
const char *bn_cuda_backend_device_name(const bn_cuda_backend *b) { return b->name; }
bn_cuda_kv_type bn_cuda_backend_kv_type(const bn_cuda_backend *b)
{
    return b->kv_f16 ? BN_CUDA_KV_F16 : BN_CUDA_KV_F32;
}
bn_cuda_fusion bn_cuda_backend_fusion(const bn_cuda_backend *b) { return b->fusion; }
int bn_cuda_backend_attn_cluster(const bn_cuda_backend *b) { return b->attn_cluster; }
int bn_cuda_backend_gemv_cluster(const bn_cuda_backend *b) { return b->gemv_cluster; }
int bn_cuda_backend_gate_up_cluster(const bn_cuda_backend *b) { return b->gu_cluster; }

unsigned bn_cuda_backend_fixed_stages(const bn_cuda_backend *b)
{
    unsigned m = 0;
    if (!b->kv_f16 && b->attn_cluster > 8)
        m |= 1u << BN_CUDA_STAGE_ATTENTION;
    if (b->gu_cluster > 8) /* (only the pair GEMV of the separate layout takes 16) */
        m |= 1u << BN_CUDA_STAGE_GATE_UP;
    return m;
}
bool bn_cuda_backend_head_screen(const bn_cuda_backend *b) { return b->head_screen; }
bool bn_cuda_backend_attn_qkv(const bn_cuda_backend *b) { return b->attn_qkv; }
bool bn_cuda_backend_gate_up_pair(const bn_cuda_backend *b) { return b->gu_pair; }

bool bn_cuda_backend_graphs(const bn_cuda_backend *b) { return b->graph.exec && b->use_graphs; }

bool bn_cuda_backend_sample_graph(const bn_cuda_backend *b)
{
    return b->graph_sample.exec && b->use_graphs;
}
void bn_cuda_backend_set_graphs(bn_cuda_backend *b, bool on) { b->use_graphs = on; }
void bn_cuda_backend_fail_at(bn_cuda_backend *b, int64_t call) { b->fail_at = call; }

void bn_cuda_backend_memory(const bn_cuda_backend *b, bn_cuda_memory *out)
{
    memset(out, 0, sizeof *out);
    out->weights = b->w_bytes;
    out->embedding = b->embed_bytes;
    out->lm_head = b->head_shared ? 0 : b->head_bytes;
    out->lm_head_screen = b->head_screen_bytes;
    out->norms = b->norms_bytes;
    out->kv_cache = b->kv_bytes;
    out->scratch = b->scratch_bytes;
    out->total = out->weights + out->embedding + out->lm_head + out->lm_head_screen + out->norms +
                 out->kv_cache + out->scratch;
    uint64_t current = 0, peak = 0;
    bn_cuda_context_memory(b->ctx, &current, &peak);
    out->peak = peak;
    out->device_total = b->device_total;
    out->device_free = b->device_free;
}

void bn_cuda_backend_work(const bn_cuda_backend *b, bn_cuda_work *out)
{
    memset(out, 0, sizeof *out);
    if (!b)
        return;
    bn_perf_snapshot snap;
    bn_perf_stats_snapshot(bn_cuda_context_stats(b->ctx), &snap);
    out->kernel_launches = snap.kernel_launches;
    out->h2d_transfers = snap.h2d_transfers;
    out->h2d_bytes = snap.h2d_bytes;
    out->d2h_transfers = snap.d2h_transfers;
    out->d2h_bytes = snap.d2h_bytes;
    out->staged_uploads = b->staged_uploads;
    out->staged_prefills = b->staged_prefills;
}

void bn_cuda_backend_kernels(const bn_cuda_backend *b, char *buf, size_t size)
{
    if (!size)
        return;
    buf[0] = '\0';
    for (int k = 0; k < K_COUNT; k++) {
        if (!(b->ran & (1u << k)))
            continue;
        const size_t used = strlen(buf);
        if (k == K_HEAD || k == K_HEAD_SCREEN)
            snprintf(buf + used, size - used, "%s%s_%s", used ? "," : "",
                     k == K_HEAD ? "lm_head_gemv" : "lm_head_screen_int8",
                     head_type_name(b->head_type));
        else
            snprintf(buf + used, size - used, "%s%s", used ? "," : "", kernel_names[k]);
    }
}

/* ---- measurement -------------------------------------------------------------------- */

/* With the norms folded into the GEMVs (b->fusion) their work is timed
 * inside the GEMV stages that do it, and the norm stages run no kernel. */
const char *bn_cuda_stage_name(bn_cuda_stage s)
{
    static const char *const names[BN_CUDA_STAGE_COUNT] = {
        "embedding", "residual + attn_norm + int8", "q|k|v GEMV",
        "scale + RoPE + KV store", "attention (f32: + RoPE, KV store)", "attn_sub_norm + int8",
        "Wo GEMV", "residual + ffn_norm + int8",
        "gate|up GEMV", "relu^2 * up + ffn_sub_norm + int8",
        "down GEMV",
        "residual + output_norm", "LM head", "argmax"};
    return (int)s >= 0 && s < BN_CUDA_STAGE_COUNT ? names[s] : "?";
}

/* Queues one pass of M rows (as enqueue_rows; the inputs already on the
 * device) reps times with CUDA events around each stage and averages the
 * stages' times per pass into out. argmax: the pass runs as a greedy one
 * (the screened head where greedy passes use it, then the device argmax or
 * the screen's token key). */
static bn_status profile_rows(bn_cuda_backend *b, int64_t M, const int32_t *d_tok,
                              const int32_t *d_pos, const int32_t *d_kvlen, int64_t visible,
                              bool argmax, int reps, bn_cuda_stage_times *out, bn_error *err)
{
    bn_status st = BN_OK;
    prof p;
    memset(&p, 0, sizeof p);
    p.cap = 8 + b->hp.n_layer * 16;
    p.ev = calloc((size_t)p.cap, sizeof *p.ev);
    p.stage = calloc((size_t)p.cap, sizeof *p.stage);
    if (!p.ev || !p.stage)
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for profiling events");
    int created = 0;
    for (; st == BN_OK && created < p.cap; created++)
        st = BN_CUDA_STATUS(err, cudaEventCreate(&p.ev[created]));
    for (int r = 0; r < reps && st == BN_OK; r++) {
        p.n = 0;
        memset(p.launches, 0, sizeof p.launches);
        b->prof = &p;
        st = BN_CUDA_STATUS(err, cudaEventRecord(p.ev[p.n], b->cs));
        if (st == BN_OK)
            p.stage[p.n++] = -1; /* the start */
        if (st == BN_OK)
            st = enqueue_rows(b, M, d_tok, d_pos, d_kvlen, visible, argmax && b->head_screen,
                              err);
        b->choice_in_pass = false;
        if (st == BN_OK && argmax)
            st = queue_choice(b, NULL, err); /* the argmax (unless screened) and hand-off */
        if (st == BN_OK && argmax)
            st = mark(b, BN_CUDA_STAGE_ARGMAX, b->head_screen ? 1 : 3, err);
        b->prof = NULL;
        if (st == BN_OK)
            st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
        for (int k = 1; k < p.n && st == BN_OK; k++) {
            float ms = 0.0f;
            st = BN_CUDA_STATUS(err, cudaEventElapsedTime(&ms, p.ev[k - 1], p.ev[k]));
            out->ms[p.stage[k]] += ms / reps;
        }
        float total = 0.0f;
        if (st == BN_OK && p.n > 1)
            st = BN_CUDA_STATUS(err, cudaEventElapsedTime(&total, p.ev[0], p.ev[p.n - 1]));
        out->total_ms += total / reps;
    }
    b->prof = NULL;
    memcpy(out->launches, p.launches, sizeof out->launches);
    for (int i = 0; i < created; i++)
        cudaEventDestroy(p.ev[i]);
    free(p.ev);
    free(p.stage);
    return st;
}

bn_status bn_cuda_backend_profile_decode(bn_cuda_backend *b, int32_t token, int64_t pos,
                                         int reps, bn_cuda_stage_times *out, bn_error *err)
{
    if (!b || !out || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "profile: bad arguments");
    memset(out, 0, sizeof *out);
    bn_status st = check_request(b, &token, 1, pos, err);
    if (st == BN_OK)
        st = bn_cuda_context_use(b->ctx, err);
    if (st != BN_OK)
        return st;
    st = upload_dec(b, token, pos, 1, 0.0, NULL, false, err);
    if (st == BN_OK)
        st = profile_rows(b, 1, dec_dev(b), dec_dev(b) + 1, dec_dev(b) + 2, 0, true, reps, out,
                          err);
    if (st != BN_OK)
        return fail_pass(b, pos, st);
    b->kv_filled = pos + 1;
    return BN_OK;
}

bn_status bn_cuda_backend_profile_prefill(bn_cuda_backend *b, const int32_t *tokens, int64_t n,
                                          int64_t pos, int reps, bn_cuda_stage_times *out,
                                          bn_error *err)
{
    if (!b || !out || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "profile: bad arguments");
    memset(out, 0, sizeof *out);
    if (n < 2 || n > b->chunk)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "profile one prefill chunk",
                            "profile: %lld tokens, where a prefill chunk is 2 to %lld",
                            (long long)n, (long long)b->chunk);
    bn_status st = check_request(b, tokens, n, pos, err);
    if (st == BN_OK)
        st = bn_cuda_context_use(b->ctx, err);
    if (st != BN_OK)
        return st;
    st = upload_rows(b, tokens, n, pos, err);
    if (st == BN_OK)
        st = profile_rows(b, n, b->d_tokens, b->d_pos, NULL, pos + n, true, reps, out, err);
    if (st != BN_OK)
        return fail_pass(b, pos, st);
    b->kv_filled = pos + n;
    return BN_OK;
}

bn_status bn_cuda_backend_head_kept(bn_cuda_backend *b, int64_t *kept, bn_error *err)
{
    if (!b || !kept)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "head_kept: bad arguments");
    *kept = b->hp.vocab;
    if (!b->head_screen)
        return BN_OK;
    bn_status st = bn_cuda_context_use(b->ctx, err);
    if (st == BN_OK)
        st = download_logits(b, err);
    if (st != BN_OK)
        return st;
    int64_t n = 0;
    for (int64_t r = 0; r < b->hp.vocab; r++)
        n += b->h_logits[r] != -INFINITY;
    *kept = n;
    return BN_OK;
}

bn_status bn_cuda_backend_time_decode_sample(bn_cuda_backend *b, int32_t token, int64_t pos,
                                             int reps, const bn_cuda_sample_params *p, double u,
                                             double *us_per_step, bn_error *err)
{
    if (!b || !us_per_step || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "time_decode: bad arguments");
    int32_t next;
    bn_status st = BN_OK;
    double t0 = 0.0;
    for (int r = -2; r < reps && st == BN_OK; r++) { /* two warm-up steps */
        if (r == 0)
            t0 = bn_time_seconds();
        st = bn_cuda_backend_submit_sample(b, token, pos, p, u, err);
        if (st == BN_OK)
            st = bn_cuda_backend_wait_greedy(b, &next, err);
    }
    *us_per_step = st == BN_OK ? (bn_time_seconds() - t0) * 1e6 / reps : 0.0;
    return st;
}

bn_status bn_cuda_backend_time_decode_chained(bn_cuda_backend *b, int32_t token, int64_t pos,
                                              int reps, const bn_cuda_sample_params *p,
                                              double u, double *us_per_step, bn_error *err)
{
    if (!b || !us_per_step || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "time_decode_chained: bad arguments");
    *us_per_step = 0.0;
    if (pos < 0 || pos + reps + 3 > b->kv_len)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "time fewer steps or an earlier position",
                            "time_decode_chained: positions %lld..%lld do not fit a KV cache of "
                            "%lld positions",
                            (long long)pos, (long long)(pos + reps + 2), (long long)b->kv_len);
    int32_t next;
    bn_status st = bn_cuda_backend_submit_sample(b, token, pos, p, u, err);
    double t0 = 0.0;
    for (int r = -2; r < reps && st == BN_OK; r++) { /* two warm-up steps */
        if (r == 0)
            t0 = bn_time_seconds();
        st = bn_cuda_backend_submit_chained(b, p, u, err);
        if (st == BN_OK)
            st = bn_cuda_backend_wait_greedy(b, &next, err);
    }
    if (st == BN_OK)
        *us_per_step = (bn_time_seconds() - t0) * 1e6 / reps;
    /* The last chained step's token is not taken. */
    const bn_status drop = bn_cuda_backend_drop_pending(b, st == BN_OK ? err : NULL);
    return st == BN_OK ? drop : st;
}

bn_status bn_cuda_backend_time_decode(bn_cuda_backend *b, int32_t token, int64_t pos, int reps,
                                      double *us_per_step, bn_error *err)
{
    return bn_cuda_backend_time_decode_sample(b, token, pos, reps, NULL, 0.0, us_per_step, err);
}

bn_status bn_cuda_backend_time_decode_device_sample(bn_cuda_backend *b, int32_t token,
                                                    int64_t pos, int reps,
                                                    const bn_cuda_sample_params *p, double u,
                                                    bn_cuda_time_part part, double *us_per_step,
                                                    bn_error *err)
{
    if (!b || !us_per_step || reps < 1 ||
        (part != BN_CUDA_TIME_STEP && part != BN_CUDA_TIME_PASS && part != BN_CUDA_TIME_CHOICE))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "time_decode_device: bad arguments");
    *us_per_step = 0.0;
    if (!b->graph.exec || !b->use_graphs || b->prof)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL, "time_decode_device: no decode graph");
    bn_status st = check_request(b, &token, 1, pos, err);
    if (st == BN_OK)
        st = check_choice(b, p, u, err);
    if (st == BN_OK)
        st = bn_cuda_context_use(b->ctx, err);
    if (st != BN_OK)
        return st;
    cudaEvent_t ev[2] = {NULL, NULL};
    st = BN_CUDA_STATUS(err, cudaEventCreate(&ev[0]));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventCreate(&ev[1]));
    /* A warm-up step, which also uploads the inputs every replay reads. */
    if (st == BN_OK)
        st = queue_step(b, &token, 1, pos, p, u, false, err);
    /* The step as queue_step runs it (a sampled one in graph_sample, when
     * captured); the pass is `graph` (screened for the top k) without the
     * sampler, and the choice the sampler launched by itself. */
    const bool in_graph = b->choice_in_pass;
    const cudaGraphExec_t step =
        in_graph && !choice_greedy(p) ? b->graph_sample.exec : b->graph.exec;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(ev[0], b->cs));
    for (int r = 0; r < reps && st == BN_OK; r++) {
        if (part != BN_CUDA_TIME_CHOICE)
            st = BN_CUDA_STATUS(
                err, cudaGraphLaunch(part == BN_CUDA_TIME_STEP ? step : b->graph.exec, b->cs));
        b->choice_in_pass = part == BN_CUDA_TIME_STEP && in_graph;
        if (st == BN_OK && part != BN_CUDA_TIME_PASS)
            st = queue_choice(b, p, err);
    }
    b->choice_in_pass = false;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(ev[1], b->cs));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventSynchronize(ev[1]));
    float ms = 0.0f;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventElapsedTime(&ms, ev[0], ev[1]));
    /* As wait_greedy: the cache now holds `token` at pos, so later
     * positions (computed from what was there) are forgotten. */
    if (st != BN_OK)
        (void)fail_pass(b, pos, st);
    else
        b->kv_filled = pos + 1;
    for (int i = 0; i < 2; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    *us_per_step = st == BN_OK ? (double)ms * 1000.0 / reps : 0.0;
    return st;
}

bn_status bn_cuda_backend_time_decode_device(bn_cuda_backend *b, int32_t token, int64_t pos,
                                             int reps, double *us_per_step, bn_error *err)
{
    return bn_cuda_backend_time_decode_device_sample(b, token, pos, reps, NULL, 0.0,
                                                     BN_CUDA_TIME_STEP, us_per_step, err);
}

bn_status bn_cuda_backend_time_decode_without(bn_cuda_backend *b, unsigned stages, int32_t token,
                                              int64_t pos, int reps, double *us_per_step,
                                              int *disabled, bn_error *err)
{
    if (!b || !us_per_step || !disabled || reps < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "time_decode_without: bad arguments");
    *disabled = 0;
    *us_per_step = 0.0;
    if (!b->graph.exec || !b->use_graphs || b->n_graph_nodes == 0)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "time_decode_without: no decode graph with a stage map (%s)",
                            !b->graph.exec || !b->use_graphs ? "no graph"
                            : b->stage_map_why          ? b->stage_map_why
                                                        : "not mapped");
    bn_status st = bn_cuda_context_use(b->ctx, err);
    for (int i = 0; i < b->n_graph_nodes && st == BN_OK; i++)
        if (stages >> b->graph_node_stage[i] & 1u) {
            const cudaError_t rc = cudaGraphNodeSetEnabled(b->graph.exec, b->graph_nodes[i], 0);
            const bool attn = b->graph_node_stage[i] == BN_CUDA_STAGE_ATTENTION;
            if (rc == cudaErrorInvalidClusterSize) /* non-portable cluster sizes: refused */
                st = bn_error_set(err, BN_ERR_UNSUPPORTED,
                                  attn ? "bench e2e --attn-merge cluster8 times the attention "
                                         "with clusters the driver can disable"
                                       : "bench e2e --gate-up-stage gemv times the gate|up GEMV "
                                         "with clusters the driver can disable",
                                  "the driver cannot disable the %s's graph nodes "
                                  "(thread-block clusters of %d blocks: %s)",
                                  attn ? "attention" : "gate|up GEMV",
                                  attn ? b->attn_cluster : b->gu_cluster,
                                  cudaGetErrorString(rc));
            else
                st = BN_CUDA_STATUS(err, rc);
            *disabled += st == BN_OK;
        }
    if (st == BN_OK)
        st = bn_cuda_backend_time_decode(b, token, pos, reps, us_per_step, err);
    /* Every node back on, whatever happened above. */
    for (int i = 0; i < b->n_graph_nodes; i++)
        if (stages >> b->graph_node_stage[i] & 1u)
            (void)cudaGraphNodeSetEnabled(b->graph.exec, b->graph_nodes[i], 1);
    (void)cudaGetLastError();
    return st;
}

#ifdef BN_DECODE_TRACE
cudaError_t bn_cb_trace_attach(void *recs, unsigned *count, unsigned cap);
cudaError_t bn_w2a8_trace_attach(void *recs, unsigned *count, unsigned cap);
#endif

bn_status bn_cuda_backend_trace_decode(bn_cuda_backend *b, int32_t token, int64_t pos,
                                       const char *path, int *records, bn_error *err)
{
    if (!b || !path || !records)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "trace_decode: bad arguments");
    *records = 0;
#ifndef BN_DECODE_TRACE
    (void)token;
    (void)pos;
    return bn_error_set(err, BN_ERR_UNSUPPORTED, "configure with -DBITNET_DECODE_TRACE=ON",
                        "this build does not trace the decode kernels");
#else
    /* One record per block: 64 bytes (pdl.cuh's bn_trace_rec). */
    enum { kRecBytes = 64 };
    const unsigned cap = 1u << 18;
    void *recs = NULL;
    unsigned *count = NULL;
    bn_status st = bn_cuda_context_use(b->ctx, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMalloc(&recs, (size_t)cap * kRecBytes));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMalloc((void **)&count, sizeof *count));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemset(count, 0, sizeof *count));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, bn_cb_trace_attach(recs, count, cap));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, bn_w2a8_trace_attach(recs, count, cap));
    /* The memset and the attach copies ran on the legacy stream, which the
     * compute stream (non-blocking) does not wait for. */
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(cudaStreamLegacy));
    int32_t next;
    if (st == BN_OK)
        st = bn_cuda_backend_submit_greedy(b, token, pos, err);
    if (st == BN_OK)
        st = bn_cuda_backend_wait_greedy(b, &next, err);
    unsigned n = 0;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemcpy(&n, count, sizeof n, cudaMemcpyDeviceToHost));
    n = n < cap ? n : cap;
    unsigned char *host = st == BN_OK ? malloc((size_t)n * kRecBytes + 1) : NULL;
    if (st == BN_OK && !host)
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the trace");
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaMemcpy(host, recs, (size_t)n * kRecBytes,
                                            cudaMemcpyDeviceToHost));
    (void)bn_cb_trace_attach(NULL, NULL, 0);
    (void)bn_w2a8_trace_attach(NULL, NULL, 0);
    cudaFree(recs);
    cudaFree(count);
    FILE *f = st == BN_OK ? fopen(path, "w") : NULL;
    if (st == BN_OK && !f)
        st = bn_error_set(err, BN_ERR_IO, NULL, "cannot write %s", path);
    if (f) {
        fprintf(f, "t_run_ns,t_ready_ns,grid,threads,block,sm,m0,m1,m2,m3\n");
        for (unsigned i = 0; i < n; i++) {
            unsigned long long t[2], mk[4];
            unsigned u[4];
            memcpy(t, host + (size_t)i * kRecBytes, sizeof t);
            memcpy(u, host + (size_t)i * kRecBytes + sizeof t, sizeof u);
            memcpy(mk, host + (size_t)i * kRecBytes + sizeof t + sizeof u, sizeof mk);
            fprintf(f, "%llu,%llu,%u,%u,%u,%u,%llu,%llu,%llu,%llu\n", t[0], t[1], u[0], u[1],
                    u[2], u[3], mk[0], mk[1], mk[2], mk[3]);
        }
        if (fclose(f) != 0)
            st = bn_error_set(err, BN_ERR_IO, NULL, "cannot write %s", path);
    }
    free(host);
    *records = (int)n;
    return st;
#endif
}

bn_status bn_cuda_backend_copy_bandwidth(bn_cuda_backend *b, uint64_t bytes, double *gbs,
                                         bn_error *err)
{
    if (!b || !gbs)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "copy_bandwidth: bad arguments");
    *gbs = 0.0;
    bn_status st = bn_cuda_context_use(b->ctx, err);
    if (st != BN_OK)
        return st;
    void *src = NULL, *dst = NULL;
    for (; bytes >= ((uint64_t)16 << 20); bytes /= 2) {
        if (bn_cuda_context_alloc(b->ctx, bytes, &src, NULL) != BN_OK) {
            src = NULL;
            continue;
        }
        if (bn_cuda_context_alloc(b->ctx, bytes, &dst, NULL) == BN_OK)
            break;
        bn_cuda_context_free(b->ctx, src, bytes);
        src = dst = NULL;
    }
    if (!src || !dst)
        return bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY, NULL,
                            "no room for the copy-bandwidth buffers");
    cudaEvent_t e0 = NULL, e1 = NULL;
    const int reps = 10;
    st = BN_CUDA_STATUS(err, cudaEventCreate(&e0));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventCreate(&e1));
    if (st == BN_OK) /* warm-up */
        st = BN_CUDA_STATUS(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->cs));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(e0, b->cs));
    for (int r = 0; r < reps && st == BN_OK; r++)
        st = BN_CUDA_STATUS(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->cs));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(e1, b->cs));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventSynchronize(e1));
    float ms = 0.0f;
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventElapsedTime(&ms, e0, e1));
    if (st == BN_OK && ms > 0.0f)
        *gbs = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9;
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    (void)cudaStreamSynchronize(b->cs);
    bn_cuda_context_free(b->ctx, src, bytes);
    bn_cuda_context_free(b->ctx, dst, bytes);
    return st;
}

uint64_t bn_cuda_backend_bytes_per_token(const bn_cuda_backend *b, int64_t positions)
{
    const bn_hparams *hp = &b->hp;
    /* A screened head reads its int8 copy and (scale, bound) per row, and
     * writes and reads back each row's upper end; the full rows of the few
     * rows it keeps are not counted. */
    const uint64_t head = b->head_screen
                              ? (uint64_t)hp->vocab * ((uint64_t)hp->dim + 2 * sizeof(float) +
                                                       2 * sizeof(float))
                              : head_table_bytes(b);
    const uint64_t kv = 2 * (uint64_t)hp->n_layer * (uint64_t)positions * (uint64_t)b->kv_dim *
                        b->kv_elem;
    return b->w_bytes + head + b->embed_row_bytes + b->norms_bytes + kv;
}
