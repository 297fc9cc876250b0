/*
 * cuda_backend_forward.c - the CUDA backend's forward pass: the launches of
 * a projection group, one pass over M rows (cb_enqueue_rows: a prefill chunk,
 * or the decode step when it runs eagerly or is captured), the checks and
 * uploads of a request, cb_queue_pass (prefill chunks or the decode step) and
 * bn_cuda_backend_forward.
 *
 * Weight scales. q|k|v and gate|up run as one GEMV each with weight scale 1,
 * which yields acc / act_scale exactly (x * 1 is exact); the kernel after
 * multiplies each part by its own scale, which is the CPU epilogue's
 * ((float)acc / act_scale) * scale, bit for bit. Wo and Wdown carry their
 * scale in the GEMV itself.
 */
#include <string.h>

#include "attention_cuda.h"
#include "cuda_backend_internal.h"
#include "nccl_loader.h"

static int32_t *h_tokens(bn_cuda_backend *b) { return b->h_io; }
static int32_t *h_positions(bn_cuda_backend *b) { return b->h_io + b->kv_len; }

static const float *norm_ptr(const bn_cuda_backend *b, int layer, bn_norm which)
{
    return b->d_norms + (int64_t)layer * b->layer_norms + b->norm_off[which];
}

/* ---- the product groups' launches --------------------------------------------- */

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
    a.streamk = b->streamk ? b->ws_streamk : NULL;
    a.weight_scale = g->n_seg == 1 ? g->s[0].scale : 1.0f;
    a.cluster = b->form.gemv_cluster;
    /* Prefill's GEMMs: programmatic dependent launch lets the weight copies
     * of the warp-specialized kernels start while the kernel before runs
     * (they wait for it before anything else; not while profiling). */
    a.pdl = M > 1 && b->form.pdl && !b->prof;
    return a;
}

/* a's weights: those of segment s (a fused group's first), laid out as l. */
static void set_weights(bn_w2a8_cuda_args *a, const bn_cuda_backend *b, const seg *s,
                        const bn_cuda_layout *l)
{
    a->weights = b->d_w + s->off;
    a->n = l->n;
    a->tiles = l->tiles;
    a->groups = l->groups;
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
        set_weights(&a, b, s, g->fused_ok ? &g->fused : &s->l);
        a.y = y + s->col;
        const int split = g->fused_ok ? g->split : s->split;
        BN_CUDA_TRY(err, M == 1 ? bn_w2a8_cuda_gemv_pdl(&a, split, pdl, b->cs)
                                : bn_w2a8_cuda_gemm(&a, b->cs));
        (*launches)++;
    }
    return BN_OK;
}

/* The decode step's gate|up GEMV in pairs (b->form.gate_up_pair): h = relu(gate)^2 *
 * up of b->xq into b->gu (ffn values), the squared ReLU done in the GEMV's
 * epilogue with the segments' scales, so the norm kernel after it reads one
 * row instead of two. */
bn_w2a8_cuda_args cb_pair_args(const bn_cuda_backend *b, const group *g)
{
    bn_w2a8_cuda_args a = w2a8_args(b, g, 1);
    set_weights(&a, b, &g->s[0], &g->fused);
    a.y = b->gu;
    a.ldy = g->n / 2;
    a.relu2_pair = 1;
    a.relu2_sg = g->s[0].scale;
    a.relu2_su = g->s[1].scale;
    a.cluster = b->form.gate_up_cluster;
    return a;
}

static bn_status gate_up_pair(bn_cuda_backend *b, const group *g, int pdl, bn_error *err)
{
    const bn_w2a8_cuda_args a = cb_pair_args(b, g);
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

bool cb_embed_norm_fits(const bn_cuda_backend *b)
{
    return bn_cb_embed_norm_fits(b->embed_type, b->hp.dim, b->x, norm_ptr(b, 0, BN_NORM_ATTN),
                                 b->xq, codes_ld(b, b->hp.dim, 1)) != 0;
}

/* The end of a stage of the pass that launched `launches` kernels: counted
 * (while capturing: logged for the stage map) and, while profiling, timed
 * by an event. */
bn_status cb_mark(bn_cuda_backend *b, bn_cuda_stage stage, int launches, bn_error *err)
{
    if (b->capture_stages) {
        b->capture_launches += launches;
        if (b->n_capture + 2 <= b->cap_capture) {
            b->capture_stages[b->n_capture++] = (int)stage;
            b->capture_stages[b->n_capture++] = launches;
        }
    } else {
        cb_count_launches(b, launches);
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

/* ---- one pass over M rows ---------------------------------------------------- */

/* What every stage of a pass reads: the backend, the rows (device arrays of
 * their tokens and positions) and whether this is the decode step. */
typedef struct pass {
    bn_cuda_backend *b;
    int64_t M;              /* rows: a prefill chunk's, or 1 for the decode step      */
    const int32_t *tok, *pos;
    const int32_t *kvlen;   /* decode: the attention length (a device int); NULL:
                               a prefill chunk                                         */
    int64_t visible;        /* prefill: the positions its last row sees               */
    bool decode;
    int pdl;                /* launch with programmatic dependent launch              */
    bn_error *err;
    /* Rows of many sequences over the paged cache (cb_enqueue_paged_rows):
     * each row's cache row for its k and v, and its sequence; NULL for one
     * sequence's pass. */
    const paged_rows *paged;
} pass;

/* A stage of the pass: returns from the caller when it fails. */
#define STAGE(call)                                                                        \
    do {                                                                                   \
        const bn_status stage_st_ = (call);                                                \
        if (stage_st_ != BN_OK)                                                            \
            return stage_st_;                                                              \
    } while (0)

/* The end of a stage that launched `launches` kernels of family `kernel`
 * (-1: none to note). */
static bn_status stage_done(const pass *p, bn_cuda_stage stage, int launches, int kernel)
{
    if (kernel >= 0)
        p->b->ran |= 1u << kernel;
    return cb_mark(p->b, stage, launches, p->err);
}

/* The layer's cache of K or V (which: b->d_k or b->d_v), and the next
 * layer's (NULL after the last), which the decode attention prefetches. */
static void *layer_cache(const bn_cuda_backend *b, void *which, int l)
{
    const size_t layer_bytes = (size_t)b->kv_len * (size_t)b->kv_dim * b->kv_elem;
    return l < b->hp.n_layer ? (char *)which + (size_t)l * layer_bytes : NULL;
}

/* x = the rows of the tokens' embedding; xq = q(attn_norm(x)) for layer 0.
 * The decode step reads its row from the table inside the norm kernel
 * where it can (b->form.embed_norm: one kernel fewer, the same x and codes). As
 * the step's first kernel it is launched plainly, so the step's inputs are
 * in place before any kernel with programmatic dependent launch starts. */
static bn_status embed_and_first_norm(const pass *p)
{
    bn_cuda_backend *b = p->b;
    const int64_t dim = b->hp.dim;
    const float *w = norm_ptr(b, 0, BN_NORM_ATTN);
    if (p->decode && b->form.embed_norm) {
        BN_CUDA_TRY(p->err, bn_cb_embed_norm_quantize(b->d_embed, b->embed_type, p->tok, b->x,
                                                      dim, w, b->hp.rms_eps, b->xq,
                                                      codes_ld(b, dim, 1), b->act_scale,
                                                      b->act_sum, 0, b->cs));
        STAGE(stage_done(p, BN_CUDA_STAGE_EMBED, 0, -1));
        return stage_done(p, BN_CUDA_STAGE_ATTN_NORM, 1, K_EMBED_NORM_Q);
    }
    BN_CUDA_TRY(p->err, bn_cuda_embed_rows(b->d_embed, b->embed_type, b->hp.vocab, dim, p->tok,
                                           p->M, b->x, dim, b->cs));
    STAGE(stage_done(p, BN_CUDA_STAGE_EMBED, 1, K_EMBED));
    BN_CUDA_TRY(p->err, bn_cb_norm_quantize(b->x, dim, p->M, dim, w, b->hp.rms_eps, b->xq,
                                            codes_ld(b, dim, p->M), b->act_scale, b->act_sum,
                                            p->pdl, b->cs));
    return stage_done(p, BN_CUDA_STAGE_ATTN_NORM, 1, K_NORM_Q);
}

/* out = W xq for the layer's group `which` (Wo, Wdown; q|k|v, gate|up
 * raw, at weight scale 1). */
static bn_status product(const pass *p, int l, int which, float *y, bn_cuda_stage stage)
{
    int n = 0;
    const bn_status st = matmul(p->b, &p->b->groups[l * G_COUNT + which], p->M, y, p->pdl, &n,
                                p->err);
    return st != BN_OK ? st : stage_done(p, stage, n, -1);
}

/* A layer's part of the paged cache (K or V: which is b->d_pk or b->d_pv). */
static void *layer_paged(const bn_cuda_backend *b, void *which, int l)
{
    return (char *)which + (size_t)l * (size_t)b->paged_rows * (size_t)b->kv_dim * b->paged_elem;
}

/* The arguments of rows of many sequences' q|k|v product with its
 * epilogue (bn_w2a8_cuda_gemm_qkv: scale, RoPE, k and v into their paged
 * rows, in the GEMM's own kernel), or false where it cannot be asked for
 * (one launch a segment, tensor parallelism). */
static bool qkv_epilogue_args(const pass *p, int l, bn_w2a8_cuda_args *a, bn_w2a8_qkv_out *o)
{
    const bn_cuda_backend *b = p->b;
    const group *g = &b->groups[l * G_COUNT + G_QKV];
    if (!p->paged || !g->fused_ok || b->opt.tp_size > 1)
        return false;
    const bn_hparams *hp = &b->hp;
    *a = w2a8_args(b, g, p->M);
    set_weights(a, b, &g->s[0], &g->fused);
    a->y = NULL;
    const bn_w2a8_qkv_out out = {hp->n_head,
                                 hp->n_head_kv,
                                 hp->head_dim,
                                 hp->rope_dim,
                                 g->s[0].scale,
                                 g->s[1].scale,
                                 g->s[2].scale,
                                 hp->rope_dim > 0 ? b->rope : NULL,
                                 b->kv_len,
                                 p->pos,
                                 p->paged->d_slot,
                                 b->q,
                                 b->q_dim,
                                 layer_paged(b, b->d_pk, l),
                                 layer_paged(b, b->d_pv, l),
                                 b->paged_rows,
                                 b->paged_kv};
    *o = out;
    return true;
}

/* qkv = Wqkv xq, the raw q|k|v. Where the decode attention computes the
 * product itself (b->form.attn_qkv) this stage launches nothing. Rows of
 * many sequences take the product with its epilogue where the kernel
 * table allows (*in_place: q, k and v are in place, no rope_kv_store). */
static bn_status qkv(const pass *p, int l, bool *in_place)
{
    *in_place = false;
    if (p->decode && p->b->form.attn_qkv)
        return stage_done(p, BN_CUDA_STAGE_QKV, 0, -1);
    bn_w2a8_cuda_args a;
    bn_w2a8_qkv_out o;
    if (qkv_epilogue_args(p, l, &a, &o)) {
        const cudaError_t rc = bn_w2a8_cuda_gemm_qkv(&a, &o, p->b->cs);
        if (rc != cudaErrorNotSupported) { /* else nothing launched: the two stages */
            if (rc != cudaSuccess)
                return bn_cuda_fail(p->err, rc, "bn_w2a8_cuda_gemm_qkv", __FILE__, __LINE__);
            p->b->ran |= 1u << K_GEMM;
            *in_place = true;
            return stage_done(p, BN_CUDA_STAGE_QKV, 1, -1);
        }
    }
    return product(p, l, G_QKV, p->b->qkv, BN_CUDA_STAGE_QKV);
}

/* q = rope(qkv_q * sq), k = rope(qkv_k * sk), v = qkv_v * sv; k and v into
 * the layer's cache at the rows' positions. The fp32 cache's decode step
 * does this inside its attention kernel: no stage here. */
static bn_status rope_kv_store(const pass *p, int l)
{
    bn_cuda_backend *b = p->b;
    if (p->decode && !b->kv_f16)
        return BN_OK;
    const bn_hparams *hp = &b->hp;
    const seg *s = b->groups[l * G_COUNT + G_QKV].s;
    if (p->paged) { /* rows of many sequences: k and v into their paged rows */
        const bn_cb_qkv_shape ps = {hp->n_head, hp->n_head_kv, hp->head_dim, b->paged_rows,
                                    s[0].scale, s[1].scale, s[2].scale};
        const float *prope = hp->rope_dim > 0 ? b->rope : NULL;
        BN_CUDA_TRY(p->err, bn_cb_qkv_post_slots(b->qkv, b->qkv_n, p->M, &ps, &b->freqs, prope,
                                                 prope ? b->kv_len : 0, p->pos, p->paged->d_slot,
                                                 b->q, b->q_dim, layer_paged(b, b->d_pk, l),
                                                 layer_paged(b, b->d_pv, l), b->paged_kv, b->cs));
        return stage_done(p, BN_CUDA_STAGE_ROPE_KV, 1, K_QKV_POST);
    }
    const bn_cb_qkv_shape qs = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len,
                                s[0].scale, s[1].scale, s[2].scale};
    const float *rope = hp->rope_dim > 0 ? b->rope : NULL;
    BN_CUDA_TRY(p->err, bn_cb_qkv_post(b->qkv, b->qkv_n, p->M, &qs, &b->freqs, rope,
                                       rope ? b->kv_len : 0, p->pos, b->q, b->q_dim,
                                       layer_cache(b, b->d_k, l), layer_cache(b, b->d_v, l),
                                       b->kv_f16, p->pdl, b->cs));
    return stage_done(p, BN_CUDA_STAGE_ROPE_KV, 1, K_QKV_POST);
}

/* The fp32 cache's decode attention: the token's scale + RoPE + KV store,
 * then its q against the cache, merged in clusters of b->form.attn_cluster
 * blocks (0: by the ticket), the q|k|v product inside where b->form.attn_qkv. */
static bn_status attention_decode_f32(const pass *p, int l)
{
    bn_cuda_backend *b = p->b;
    const bn_hparams *hp = &b->hp;
    const group *g = &b->groups[l * G_COUNT + G_QKV];
    const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len};
    bn_cb_attn_decode_args da = {b->qkv, g->s[0].scale, g->s[1].scale, g->s[2].scale,
                                 hp->rope_dim > 0 ? b->rope : NULL, hp->rope_dim, p->pos,
                                 layer_cache(b, b->d_k, l), layer_cache(b, b->d_v, l),
                                 b->attn_splits, b->ws_attn, b->attn_counters, b->att,
                                 b->form.attn_cluster, layer_cache(b, b->d_k, l + 1),
                                 layer_cache(b, b->d_v, l + 1), NULL, 0, NULL, NULL, NULL};
    if (b->form.attn_qkv) {
        da.w_qkv = b->d_w + g->s[0].off;
        da.w_k = g->k;
        da.xq = b->xq;
        da.act_scale = b->act_scale;
        da.act_sum = b->act_sum;
    }
    BN_CUDA_TRY(p->err, bn_cb_attn_decode(&as, &da, p->pdl, b->cs));
    const int kernel = b->form.attn_qkv       ? K_ATTN_DEC_F32_QKV
                       : b->form.attn_cluster ? K_ATTN_DEC_F32_CLUSTER
                                         : K_ATTN_DEC_F32;
    return stage_done(p, BN_CUDA_STAGE_ATTENTION, 1, kernel);
}

/* The ranges of the paged attention's decode rows. */
static int paged_splits(const pass *p)
{
    const bn_cuda_backend *b = p->b;
    const paged_rows *r = p->paged;
    return bn_cb_attn_paged_splits(r->n_dec, r->max_pos, b->hp.n_head_kv, b->paged_resident,
                                   b->paged_kv);
}

static bool tp_on(const bn_cuda_backend *b);

/* Whether layer l's attn_sub_norm combines the paged attention's shares
 * itself (so no merge writes an output for it to read back): every row of
 * the pass decodes, its positions are split, and the norm's register-held
 * kernel takes the rows. */
static bool sub_norm_merges(const pass *p, int l)
{
    const bn_cuda_backend *b = p->b;
    const paged_rows *r = p->paged;
    return r && r->n_dec == p->M && !r->dec_rows && r->n_blocks == 0 && !tp_on(b) &&
           paged_splits(p) > 1 &&
           bn_cb_merge_norm_fits(b->ws_paged, b->hp.n_head, b->hp.head_dim, p->M,
                                 norm_ptr(b, l, BN_NORM_ATTN_SUB), b->xq,
                                 codes_ld(b, b->q_dim, p->M));
}

/* att = softmax(q K^T / sqrt(head_dim)) V over each row's positions. */
/* Rows of many sequences over the paged cache: the decode rows in one
 * launch, the runs of prompts' rows in one of the tiled kernel. */
static bn_status attention_paged(const pass *p, int l)
{
    bn_cuda_backend *b = p->b;
    const bn_hparams *hp = &b->hp;
    const paged_rows *r = p->paged;
    void *kl = layer_paged(b, b->d_pk, l), *vl = layer_paged(b, b->d_pv, l);
    const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len};
    int launches = 0;
    if (r->n_dec > 0 && sub_norm_merges(p, l)) {
        BN_CUDA_TRY(p->err,
                    bn_cb_attn_paged_shares(&as, b->q, b->q_dim, r->n_dec, r->d_seq, p->pos,
                                            b->d_tables, b->paged_max_blocks, b->paged_block, kl,
                                            vl, b->paged_kv, paged_splits(p), b->ws_paged, b->cs));
        launches++;
        b->ran |= 1u << K_ATTN_PAGED;
    } else if (r->n_dec > 0) {
        const int splits = paged_splits(p);
        BN_CUDA_TRY(p->err,
                    bn_cb_attn_paged(&as, b->q, b->q_dim, r->n_dec, r->d_seq, p->pos, b->d_tables,
                                     b->paged_max_blocks, b->paged_block, kl, vl, b->paged_kv,
                                     splits, r->dec_rows, b->att, b->q_dim, b->ws_paged, b->cs));
        launches += splits > 1 ? 2 : 1;
        b->ran |= 1u << K_ATTN_PAGED;
    }
    if (r->n_blocks > 0) {
        /* The parts' workspace is the gate|up output, unused until the FFN. */
        const size_t ws_bytes = (size_t)b->chunk * (size_t)b->gu_n * sizeof(float);
        const int parts = bn_cb_attn_prefill_parts(&as, (int)p->M, r->runs_max_pos + 1, b->sm,
                                                   ws_bytes);
        BN_CUDA_TRY(p->err, bn_cb_attn_prefill_runs(
                                &as, b->q, b->q_dim, (int)p->M, p->pos, r->d_blocks, r->n_blocks,
                                b->d_tables, b->paged_max_blocks, b->paged_block, kl, vl,
                                b->paged_kv, b->att, b->q_dim, parts, b->gu, ws_bytes, b->cs));
        launches += parts > 1 ? 2 : 1;
        b->ran |= 1u << (b->paged_kv == BN_CB_KV_F32    ? K_ATTN_PRE_F32
                         : b->paged_kv == BN_CB_KV_E4M3 ? K_ATTN_PRE_E4M3
                                                        : K_ATTN_PRE_F16);
    }
    return stage_done(p, BN_CUDA_STAGE_ATTENTION, launches, -1);
}

static bn_status attention(const pass *p, int l)
{
    bn_cuda_backend *b = p->b;
    const bn_hparams *hp = &b->hp;
    const int M = (int)p->M;
    void *kl = layer_cache(b, b->d_k, l), *vl = layer_cache(b, b->d_v, l);
    if (p->paged)
        return attention_paged(p, l);
    if (!b->kv_f16 && p->decode)
        return attention_decode_f32(p, l);
    if (!b->kv_f16) {
        /* The parts' workspace is the gate|up output, unused until the FFN. */
        const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len};
        const size_t ws_bytes = (size_t)b->chunk * (size_t)b->gu_n * sizeof(float);
        const int parts = bn_cb_attn_prefill_parts(&as, M, p->visible, b->sm, ws_bytes);
        BN_CUDA_TRY(p->err, bn_cb_attn_prefill(&as, b->q, b->q_dim, M, p->pos, kl, vl, b->att,
                                               b->q_dim, parts, b->gu, ws_bytes, b->cs));
        return stage_done(p, BN_CUDA_STAGE_ATTENTION, 1, K_ATTN_PRE_F32);
    }
    const bn_attn_shape fs = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len,
                              BN_ATTN_KV_F16, 0.0f};
    if (p->decode) {
        /* Its ranges merge in a second kernel when it splits the length. */
        const bn_attn_decode_args da = {b->q, b->q_dim, kl, vl, 0, p->kvlen, 1,
                                        b->att, b->q_dim, b->attn_splits, b->ws_attn};
        BN_CUDA_TRY(p->err, bn_attn_decode(&fs, &da, b->cs));
        return stage_done(p, BN_CUDA_STAGE_ATTENTION, b->attn_splits > 1 ? 2 : 1,
                          K_ATTN_DEC_F16);
    }
    /* Positions are consecutive: the chunk's first is pos0. */
    BN_CUDA_TRY(p->err, bn_attn_prefill(&fs, b->q, b->q_dim, M, p->pos, kl, vl, b->att,
                                        b->q_dim, b->cs));
    return stage_done(p, BN_CUDA_STAGE_ATTENTION, 1, K_ATTN_PRE_F16);
}

/* ---- tensor parallelism (opt.tp_size >= 2; cuda_tp.h) ------------------------- */

static bool tp_on(const bn_cuda_backend *b) { return b->opt.tp_size > 1; }

static bn_status nccl_status(const pass *p, int rc, const char *what)
{
    if (rc == 0)
        return BN_OK;
    return bn_error_set(p->err, BN_ERR_GPU, NULL, "cuda:%d: NCCL %s failed: %s", p->b->device,
                        what, p->b->nccl->error_string(rc));
}

/* Whether an exchange of `bytes` goes through peer memory (the team's small
 * exchanges: a decode step's) rather than NCCL. Every rank decides alike. */
static bool exchanges(const bn_cuda_backend *b, size_t bytes)
{
    return b->opt.tp_exchange && bytes <= b->opt.tp_exchange->slot_bytes;
}

/* out = the sum over the ranks of their partial products (M rows of dim):
 * one all-reduce after Wo and one after down. */
static bn_status tp_sum(const pass *p, float *out, bn_cuda_stage stage)
{
    bn_cuda_backend *b = p->b;
    const int64_t n = p->M * b->hp.dim;
    if (exchanges(b, (size_t)n * sizeof(float))) {
        BN_CUDA_TRY(p->err, bn_cb_exchange_sum(b->opt.tp_exchange, out, n, b->cs));
    } else {
        const int rc = b->nccl->all_reduce(out, out, (size_t)n, BN_NCCL_FLOAT32, BN_NCCL_SUM,
                                           (bn_nccl_comm)b->opt.tp_comm, b->cs);
        STAGE(nccl_status(p, rc, "all-reduce"));
    }
    return stage_done(p, stage, 1, -1);
}

/* xq = q(norm(v)) of this rank's k columns of rows split across the ranks:
 * its statistics, every rank's (an all-gather), then its codes. */
static bn_status tp_norm_codes(const pass *p, const bn_cb_norm_source *src, int64_t k, int l,
                               bn_norm which, bn_cuda_stage stage)
{
    const int64_t whole = which == BN_NORM_ATTN_SUB ? p->b->whole_q_dim : p->b->whole_ffn;
    bn_cuda_backend *b = p->b;
    const int ranks = b->opt.tp_size;
    const size_t part = (size_t)p->M * 2;
    double *mine = b->tp_stats + part * (size_t)b->opt.tp_rank;
    const float *w = norm_ptr(b, l, which);
    BN_CUDA_TRY(p->err, bn_cb_norm_part_stats(src, p->M, k, w, mine, b->cs));
    if (exchanges(b, part * sizeof(double))) {
        BN_CUDA_TRY(p->err, bn_cb_exchange_gather(b->opt.tp_exchange, mine, b->tp_stats,
                                                  (int64_t)part, b->cs));
    } else {
        const int rc = b->nccl->all_gather(mine, b->tp_stats, part, BN_NCCL_FLOAT64,
                                           (bn_nccl_comm)b->opt.tp_comm, b->cs);
        STAGE(nccl_status(p, rc, "all-gather"));
    }
    BN_CUDA_TRY(p->err, bn_cb_norm_part_quantize(src, p->M, k, whole, w, b->hp.rms_eps,
                                                 b->tp_stats, ranks, b->xq,
                                                 codes_ld(b, k, p->M), b->act_scale,
                                                 b->act_sum, b->cs));
    return stage_done(p, stage, 3, K_NORM_Q);
}

static bn_status tp_plain_norm_codes(const pass *p, const float *v, int64_t k, int l,
                                     bn_norm which, bn_cuda_stage stage)
{
    const bn_cb_norm_source src = {v, k, NULL, NULL, 0, 0.0f, 0.0f};
    return tp_norm_codes(p, &src, k, l, which, stage);
}

/* xq = q(norm(v)) of k-wide rows v (ld apart) with the layer's norm `which`. */
static bn_status norm_codes(const pass *p, const float *v, int64_t k, int64_t ld, int l,
                            bn_norm which, bn_cuda_stage stage)
{
    bn_cuda_backend *b = p->b;
    BN_CUDA_TRY(p->err, bn_cb_norm_quantize(v, ld, p->M, k, norm_ptr(b, l, which),
                                            b->hp.rms_eps, b->xq, codes_ld(b, k, p->M),
                                            b->act_scale, b->act_sum, p->pdl, b->cs));
    return stage_done(p, stage, 1, K_NORM_Q);
}

/* x += out (the residual stream), then xq = q(norm(x)) with layer l's norm
 * `which`: ffn_norm inside a layer, the next layer's attn_norm at its end. */
static bn_status residual_norm(const pass *p, int l, bn_norm which, bn_cuda_stage stage)
{
    bn_cuda_backend *b = p->b;
    const int64_t dim = b->hp.dim;
    BN_CUDA_TRY(p->err, bn_cb_add_norm_quantize(b->x, dim, b->out, dim, p->M, dim,
                                                norm_ptr(b, l, which), b->hp.rms_eps, b->xq,
                                                codes_ld(b, dim, p->M), b->act_scale,
                                                b->act_sum, p->pdl, b->cs));
    return stage_done(p, stage, 1, K_ADD_NORM_Q);
}

/* Whether layer l's down product of this pass goes to b->d_sums as int32
 * sums whose epilogue and residual add the next layer's attn_norm kernel
 * applies (bn_w2a8_cuda_gemm_add_sums, bn_cb_add_sums_norm_quantize): rows
 * of many sequences, 49-64 of them, one GPU, not the last layer (the
 * head's norm reads its product from b->out). At 64 rows of 2B-4T the
 * product and norm take ~3 us less a layer than the mma-rows GEMM and
 * bn_cb_add_norm_quantize (dev/cuda/w2a8_gemm_staged.cu); the values are
 * the same bits. */
static bool down_as_sums(const pass *p, int l)
{
    const bn_cuda_backend *b = p->b;
    const group *g = &b->groups[l * G_COUNT + G_DOWN];
    const int64_t dim = b->hp.dim;
    return p->paged && b->d_sums && !tp_on(b) && l + 1 < b->hp.n_layer && g->n_seg == 1 &&
           g->s[0].l.n == dim &&
           bn_w2a8_cuda_gemm_add_sums_fits(p->M, g->s[0].l.n, g->s[0].l.groups, b->sm) &&
           bn_cb_add_sums_norm_fits(b->x, dim, b->d_sums, dim, p->M, dim,
                                    norm_ptr(b, l + 1, BN_NORM_ATTN), b->xq,
                                    codes_ld(b, dim, p->M));
}

/* b->d_sums += the int32 sums of layer l's down product (down_as_sums). */
static bn_status down_sums(const pass *p, int l)
{
    bn_cuda_backend *b = p->b;
    const group *g = &b->groups[l * G_COUNT + G_DOWN];
    bn_w2a8_cuda_args a = w2a8_args(b, g, p->M);
    set_weights(&a, b, &g->s[0], &g->s[0].l);
    b->ran |= 1u << K_GEMM;
    BN_CUDA_TRY(p->err, bn_w2a8_cuda_gemm_add_sums(&a, b->d_sums, b->hp.dim, b->cs));
    return stage_done(p, BN_CUDA_STAGE_DOWN, 1, -1);
}

/* x += the down product from b->d_sums, then the next layer's xq =
 * q(attn_norm(x)), as residual_norm (down_as_sums). */
static bn_status residual_sums_norm(const pass *p, int l)
{
    bn_cuda_backend *b = p->b;
    const int64_t dim = b->hp.dim;
    const group *g = &b->groups[(l - 1) * G_COUNT + G_DOWN];
    BN_CUDA_TRY(p->err, bn_cb_add_sums_norm_quantize(b->x, dim, b->d_sums, dim, g->s[0].scale, p->M,
                                                     dim, norm_ptr(b, l, BN_NORM_ATTN),
                                                     b->hp.rms_eps, b->xq, codes_ld(b, dim, p->M),
                                                     b->act_scale, b->act_sum, p->pdl, b->cs));
    return stage_done(p, BN_CUDA_STAGE_ATTN_NORM, 1, K_ADD_NORM_Q);
}

/* gu = Wgu xq: gate and up raw, or, where the decode step takes them in
 * pairs (b->form.gate_up_pair), h = relu(gate)^2 * up already. */
static bn_status gate_up(const pass *p, int l)
{
    bn_cuda_backend *b = p->b;
    if (!(p->decode && b->form.gate_up_pair))
        return product(p, l, G_GU, b->gu, BN_CUDA_STAGE_GATE_UP);
    const bn_status st = gate_up_pair(b, &b->groups[l * G_COUNT + G_GU], p->pdl, p->err);
    return st != BN_OK ? st : stage_done(p, BN_CUDA_STAGE_GATE_UP, 1, -1);
}

/* xq = q(ffn_sub_norm(h)), h = relu(gate)^2 * up: computed here from the
 * raw gate and up, or read as the pair GEMV wrote it. */
static bn_status ffn_sub_norm(const pass *p, int l)
{
    bn_cuda_backend *b = p->b;
    const int64_t ffn = b->hp.ffn;
    const bool paired = p->decode && b->form.gate_up_pair;
    if (paired && tp_on(b))
        return tp_plain_norm_codes(p, b->gu, ffn, l, BN_NORM_FFN_SUB, BN_CUDA_STAGE_RELU2);
    if (paired)
        return norm_codes(p, b->gu, ffn, ffn, l, BN_NORM_FFN_SUB, BN_CUDA_STAGE_RELU2);
    const seg *s = b->groups[l * G_COUNT + G_GU].s;
    if (tp_on(b)) {
        const bn_cb_norm_source src = {NULL, 0, b->gu, b->gu + ffn, b->gu_n, s[0].scale,
                                       s[1].scale};
        return tp_norm_codes(p, &src, ffn, l, BN_NORM_FFN_SUB, BN_CUDA_STAGE_RELU2);
    }
    BN_CUDA_TRY(p->err, bn_cb_relu2_norm_quantize(b->gu, b->gu + ffn, b->gu_n, s[0].scale,
                                                  s[1].scale, p->M, ffn,
                                                  norm_ptr(b, l, BN_NORM_FFN_SUB),
                                                  b->hp.rms_eps, b->xq, codes_ld(b, ffn, p->M),
                                                  b->act_scale, b->act_sum, p->pdl, b->cs));
    return stage_done(p, BN_CUDA_STAGE_RELU2, 1, K_RELU2_Q);
}

/* xq = q(attn_sub_norm(att)); att combined here from the paged
 * attention's shares where sub_norm_merges. */
static bn_status attn_sub_norm(const pass *p, int l)
{
    const bn_cuda_backend *b = p->b;
    if (sub_norm_merges(p, l)) {
        const bn_hparams *hp = &b->hp;
        BN_CUDA_TRY(p->err, bn_cb_merge_norm_quantize(
                                b->ws_paged, paged_splits(p), hp->n_head, hp->head_dim, p->pos,
                                p->M, norm_ptr(b, l, BN_NORM_ATTN_SUB), hp->rms_eps, b->xq,
                                codes_ld(b, b->q_dim, p->M), b->act_scale, b->act_sum, b->cs));
        return stage_done(p, BN_CUDA_STAGE_SUB_NORM, 1, K_NORM_Q);
    }
    if (tp_on(b))
        return tp_plain_norm_codes(p, b->att, b->q_dim, l, BN_NORM_ATTN_SUB,
                                   BN_CUDA_STAGE_SUB_NORM);
    return norm_codes(p, b->att, b->q_dim, b->q_dim, l, BN_NORM_ATTN_SUB, BN_CUDA_STAGE_SUB_NORM);
}

/* One layer, in the order of FORMATS.md section 1 (as llama2.c's forward()
 * reads): attention, then the feed-forward network, each between its two
 * norms. xq holds the int8 codes each product reads. */
static bn_status layer(const pass *p, int l)
{
    bn_cuda_backend *b = p->b;
    /* attention: qkv = Wqkv xq; q and k turned, k and v cached;
     * att = softmax(q K^T) V; xq = q(attn_sub_norm(att)); out = Wo xq */
    bool in_place;
    STAGE(qkv(p, l, &in_place));
    if (!in_place)
        STAGE(rope_kv_store(p, l));
    STAGE(attention(p, l));
    STAGE(attn_sub_norm(p, l));
    STAGE(product(p, l, G_O, b->out, BN_CUDA_STAGE_O));
    if (tp_on(b)) /* out = the sum of the ranks' parts */
        STAGE(tp_sum(p, b->out, BN_CUDA_STAGE_O));
    /* feed-forward: x += out, xq = q(ffn_norm(x)); gate, up = Wgu xq;
     * xq = q(ffn_sub_norm(relu(gate)^2 * up)); out = Wdown xq */
    STAGE(residual_norm(p, l, BN_NORM_FFN, BN_CUDA_STAGE_FFN_NORM));
    STAGE(gate_up(p, l));
    STAGE(ffn_sub_norm(p, l));
    if (down_as_sums(p, l)) { /* out as int32 sums, finished by the next norm */
        STAGE(down_sums(p, l));
        return residual_sums_norm(p, l + 1);
    }
    STAGE(product(p, l, G_DOWN, b->out, BN_CUDA_STAGE_DOWN));
    if (tp_on(b))
        STAGE(tp_sum(p, b->out, BN_CUDA_STAGE_DOWN));
    /* x += out, with the next layer's xq = q(attn_norm(x)) */
    if (l + 1 < b->hp.n_layer)
        STAGE(residual_norm(p, l + 1, BN_NORM_ATTN, BN_CUDA_STAGE_ATTN_NORM));
    return BN_OK;
}

/* normed = output_norm(x + out) of the last row only: only its logits are
 * wanted. In the decode step with programmatic dependent launch, as the
 * screened head's kernel after it: that one's blocks start streaming the
 * head's first rows into L2 while the norm runs. */
static bn_status output_norm(const pass *p)
{
    bn_cuda_backend *b = p->b;
    const int64_t dim = b->hp.dim, last = (p->M - 1) * dim;
    BN_CUDA_TRY(p->err, bn_cb_add_rmsnorm(b->x + last, dim, b->out + last, dim, 1, dim,
                                          b->d_norms + b->out_norm_off, b->hp.rms_eps,
                                          b->normed, dim, p->pdl, b->cs));
    return stage_done(p, BN_CUDA_STAGE_OUT_NORM, 1, K_OUT_NORM);
}

/* Tensor parallelism: this rank's rows of the head. Screened (greedy
 * steps only, cb_pass_screens): its rows through its int8 copy, its best key
 * made the whole vocabulary's and the largest key of every rank's taken (an
 * all-reduce): the greedy token, the logits left partial (nothing reads
 * them). Else its rows' logits, then every rank's (an all-gather). */
static bn_status tp_lm_head(const pass *p, bool screen)
{
    bn_cuda_backend *b = p->b;
    const int64_t dim = b->hp.dim;
    const void *rows = (const char *)b->d_head + (size_t)b->head_row0 * cb_head_row_bytes(b);
    float *logits = b->logits + b->head_row0;
    const bn_nccl_comm comm = (bn_nccl_comm)b->opt.tp_comm;
    if (screen) {
        BN_CUDA_TRY(p->err, bn_cb_head_screen(b->d_head_q, b->d_head_se, b->head_rows, dim,
                                              b->normed, b->head_upper, b->head_part, b->d_best,
                                              b->d_cand_n, b->sm, p->pdl, b->cs));
        BN_CUDA_TRY(p->err, bn_cb_head_exact(rows, b->head_type, b->head_rows, dim, b->normed,
                                             b->head_upper, b->head_part, b->head_parts,
                                             cb_dec_dev(b) + 3, logits, b->d_best, b->d_cand,
                                             b->d_cand_n, BN_CUDA_SAMPLE_MAX_CAND,
                                             b->d_cand_floor, b->sm, p->pdl, b->cs));
        BN_CUDA_TRY(p->err, bn_cb_key_shift_rows(b->d_best, b->head_row0, b->cs));
        const int rc = b->nccl->all_reduce(b->d_best, b->d_best, 1, BN_NCCL_UINT64, BN_NCCL_MAX,
                                           comm, b->cs);
        STAGE(nccl_status(p, rc, "all-reduce"));
        return stage_done(p, BN_CUDA_STAGE_LM_HEAD, 4, K_HEAD_SCREEN);
    }
    if (b->head_rows > 0)
        BN_CUDA_TRY(p->err, bn_cb_head_gemv(rows, b->head_type, b->head_rows, dim, b->normed,
                                            logits, b->sm, b->cs));
    const int rc = b->nccl->all_gather(b->logits + b->head_span * b->opt.tp_rank, b->logits,
                                       (size_t)b->head_span, BN_NCCL_FLOAT32, comm, b->cs);
    STAGE(nccl_status(p, rc, "all-gather"));
    return stage_done(p, BN_CUDA_STAGE_LM_HEAD, 2, K_HEAD);
}

/* logits = Whead normed. screen: through the int8 copy, the greedy token
 * coming out of the two kernels as a key (d_best) and every row that can
 * be among the top d_dec[3] computed exactly (cb_queue_pass). */
static bn_status lm_head(const pass *p, bool screen)
{
    bn_cuda_backend *b = p->b;
    const int64_t vocab = b->hp.vocab, dim = b->hp.dim;
    if (tp_on(b))
        return tp_lm_head(p, screen);
    if (!screen) {
        BN_CUDA_TRY(p->err, bn_cb_head_gemv(b->d_head, b->head_type, vocab, dim, b->normed,
                                            b->logits, b->sm, b->cs));
        return stage_done(p, BN_CUDA_STAGE_LM_HEAD, 1, K_HEAD);
    }
    BN_CUDA_TRY(p->err, bn_cb_head_screen(b->d_head_q, b->d_head_se, vocab, dim, b->normed,
                                          b->head_upper, b->head_part, b->d_best, b->d_cand_n,
                                          b->sm, p->pdl, b->cs));
    BN_CUDA_TRY(p->err, bn_cb_head_exact(b->d_head, b->head_type, vocab, dim, b->normed,
                                         b->head_upper, b->head_part, b->head_parts,
                                         cb_dec_dev(b) + 3, b->logits, b->d_best, b->d_cand,
                                         b->d_cand_n, BN_CUDA_SAMPLE_MAX_CAND, b->d_cand_floor,
                                         b->sm, p->pdl, b->cs));
    return stage_done(p, BN_CUDA_STAGE_LM_HEAD, 2, K_HEAD_SCREEN);
}

/* Queues the layers of M rows of many sequences (at most the prefill
 * chunk; paged_rows in cuda_backend_internal.h): their tokens at their
 * positions, k and v stored at their paged cache rows, attention through
 * b->d_tables (all device arrays). The rows' hidden states are left in x + out (the last
 * layer's residual not yet added) for the head (cuda_backend_rows.c). */
bn_status cb_enqueue_paged_rows(bn_cuda_backend *b, int64_t M, const paged_rows *rows,
                                bn_error *err)
{
    const pass p = {b, M, rows->d_tok, rows->d_pos, NULL, 0, false, 0, err, rows};
    STAGE(embed_and_first_norm(&p));
    for (int l = 0; l < b->hp.n_layer; l++)
        STAGE(layer(&p, l));
    return BN_OK;
}

/* Queues the forward pass of M rows (tokens d_tok at positions d_pos, both
 * device arrays) on the compute stream, ending with the last row's logits
 * in b->logits. d_kvlen (a device int) selects the decode step (M == 1,
 * attention over [0, *d_kvlen) = [0, *d_pos]); NULL is a prefill chunk,
 * whose last row sees `visible` positions (the host's count, which sizes
 * the attention's split; 0 on the decode path).
 * screen: the LM head is screened (b->form.head_screen): logits hold -inf for
 * rows that cannot be among the top d_dec[3] (cb_queue_pass), so only a step
 * that reads no more than those (greedy, or a top-k sampler) may ask for it.
 * Nothing here synchronises or touches host memory, so it can be captured
 * in a graph.
 *
 * The decode step launches the kernels after its first with programmatic
 * dependent launch when b->form.pdl (not while profiling: the events between
 * stages would time overlapping kernels). Before their wait those kernels
 * read only weights, norm vectors, the RoPE table, the step's position and
 * cache rows of earlier steps. docs/CUDA.md, "The decode step", lists the
 * kernels. */
bn_status cb_enqueue_rows(bn_cuda_backend *b, int64_t M, const int32_t *d_tok,
                          const int32_t *d_pos, const int32_t *d_kvlen, int64_t visible,
                          bool screen, bn_error *err)
{
    const bool decode = d_kvlen != NULL;
    const pass p = {b,      M,      d_tok, d_pos, d_kvlen, visible,
                    decode, decode && b->form.pdl && !b->prof, err, NULL};
    STAGE(embed_and_first_norm(&p)); /* x = embedding; xq = q(attn_norm(x)) */
    for (int l = 0; l < b->hp.n_layer; l++)
        STAGE(layer(&p, l));
    STAGE(output_norm(&p));          /* normed = output_norm(x + out)       */
    return lm_head(&p, screen);      /* logits = Whead normed               */
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

bn_status cb_check_request(const bn_cuda_backend *b, const int32_t *tokens, int64_t n,
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
bn_status cb_begin_call(bn_cuda_backend *b, bn_error *err)
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
bn_status cb_upload_rows(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
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
    cb_count_h2d(b, (uint64_t)n * sizeof(int32_t));
    cb_count_h2d(b, (uint64_t)n * sizeof(int32_t));
    return BN_OK;
}

/* Uploads the inputs and queues the pass: the decode step (graph or eager)
 * for one token, prefill chunks otherwise. top_k > 0: only the top_k
 * largest logits will be read (1: the argmax), so a screened head computes
 * only the rows that can be among them; 0: every logit. u and sample: the
 * uniform number and the parameters of cb_queue_choice's draw (sample NULL:
 * greedy, or logits). A greedy step with a screened head replays `graph`,
 * and a sampled one graph_sample, each ending with the choice and its
 * hand-off (b->choice_in_pass). chained: a decode step whose token is the
 * one the step queued before it picks (tokens unused). */
bn_status cb_queue_pass(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                        int top_k, double u, const bn_cuda_sample_params *sample,
                        bool chained, bn_error *err)
{
    const bool screen = cb_pass_screens(b, top_k, sample != NULL);
    b->choice_in_pass = false;
    const bn_status up = cb_upload_dec(b, chained ? -1 : tokens[n - 1], pos + n - 1,
                                       top_k > 0 ? top_k : 1, u, sample, chained, err);
    if (up != BN_OK)
        return up;
    if (n == 1) {
        const step_graph *g = cb_pass_graph(b, screen, sample);
        if (g->exec && b->use_graphs && !b->prof) {
            const bool sampled = g == &b->graph_sample || g == &b->graph_sample1;
            const bool greedy = g == &b->graph || g == &b->graph1;
            b->choice_in_pass = sampled || (greedy && screen && !sample);
            return cb_replay(b, g, err);
        }
        int32_t *dec = cb_dec_dev(b);
        return cb_enqueue_rows(b, 1, dec, dec + 1, dec + 2, 0, screen, err);
    }
    bn_status st = cb_upload_rows(b, tokens, n, pos, err);
    for (int64_t c = 0; c < n && st == BN_OK; c += b->chunk) {
        const int64_t M = n - c < b->chunk ? n - c : b->chunk;
        st = cb_enqueue_rows(b, M, b->d_tokens + c, b->d_pos + c, NULL, pos + c + M, screen, err);
    }
    return st;
}

/* After a failure: let queued work drain and forget the positions it may
 * have half written (the CPU backend's rule), submitted steps included. */
bn_status cb_fail_pass(bn_cuda_backend *b, int64_t pos, bn_status st)
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
bn_status cb_download_logits(bn_cuda_backend *b, bn_error *err)
{
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->h_logits, b->logits, (size_t)b->hp.vocab * sizeof(float),
                                     cudaMemcpyDeviceToHost, b->cs));
    cb_count_d2h(b, (uint64_t)b->hp.vocab * sizeof(float));
    return BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
}

bn_status bn_cuda_backend_forward(bn_cuda_backend *b, const int32_t *tokens, int64_t n_tokens,
                                  int64_t pos, float *logits, bn_error *err)
{
    if (!b || !logits)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda forward: NULL argument");
    bn_status st = cb_check_request(b, tokens, n_tokens, pos, err);
    if (st == BN_OK)
        st = cb_begin_call(b, err);
    if (st != BN_OK)
        return st;
    st = cb_queue_pass(b, tokens, n_tokens, pos, 0, 0.0, NULL, false, err);
    if (st == BN_OK)
        st = cb_download_logits(b, err);
    if (st != BN_OK)
        return cb_fail_pass(b, pos, st);
    memcpy(logits, b->h_logits, (size_t)b->hp.vocab * sizeof(float));
    b->kv_filled = pos + n_tokens;
    return BN_OK;
}
