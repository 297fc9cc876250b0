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

/* The decode step's gate|up GEMV in pairs (b->gu_pair): h = relu(gate)^2 *
 * up of b->xq into b->gu (ffn values), the squared ReLU done in the GEMV's
 * epilogue with the segments' scales, so the norm kernel after it reads one
 * row instead of two. */
bn_w2a8_cuda_args cb_pair_args(const bn_cuda_backend *b, const group *g)
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

/* Queues the forward pass of M rows (tokens d_tok at positions d_pos, both
 * device arrays) on the compute stream, ending with the last row's logits
 * in b->logits. d_kvlen (a device int) selects the decode path (M == 1,
 * attention over [0, *d_kvlen) = [0, *d_pos]); NULL is a prefill chunk,
 * whose last row sees `visible` positions (the host's count, which sizes
 * the attention's split; 0 on the decode path).
 * screen: the LM head is screened (b->head_screen): logits hold -inf for
 * rows that cannot be among the top d_dec[3] (cb_queue_pass), so only a step
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
bn_status cb_enqueue_rows(bn_cuda_backend *b, int64_t M, const int32_t *d_tok,
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
    /* Decode runs 9 kernels per layer (fp32 cache), 8 when the attention
     * computes q|k|v itself (b->attn_qkv). docs/CUDA.md. */
    bn_status st;
    int n;

    /* A decode step's first norm reads its row from the embedding table
     * itself where it can (F32 / F16 / BF16 rows of the lean kernel's
     * widths): one kernel fewer, the same x and codes. It is the step's
     * first kernel, launched plainly. */
    const bool embed_norm = decode &&
                            bn_cb_embed_norm_fits(b->embed_type, dim, b->x,
                                                  norm_ptr(b, 0, BN_NORM_ATTN), b->xq,
                                                  codes_ld(b, dim, M));
    if (embed_norm) {
        BN_CUDA_TRY(err, bn_cb_embed_norm_quantize(b->d_embed, b->embed_type, d_tok, b->x, dim,
                                                   norm_ptr(b, 0, BN_NORM_ATTN), eps, b->xq,
                                                   codes_ld(b, dim, M), b->act_scale, b->act_sum,
                                                   0, s));
        b->ran |= 1u << K_EMBED_NORM_Q;
        if ((st = cb_mark(b, BN_CUDA_STAGE_EMBED, 0, err)) != BN_OK ||
            (st = cb_mark(b, BN_CUDA_STAGE_ATTN_NORM, 1, err)) != BN_OK)
            return st;
    } else {
        BN_CUDA_TRY(err, bn_cuda_embed_rows(b->d_embed, b->embed_type, hp->vocab, dim, d_tok, M,
                                            b->x, dim, s));
        b->ran |= 1u << K_EMBED;
        if ((st = cb_mark(b, BN_CUDA_STAGE_EMBED, 1, err)) != BN_OK)
            return st;
    }
    if (!embed_norm) {
        BN_CUDA_TRY(err, bn_cb_norm_quantize(b->x, dim, M, dim, norm_ptr(b, 0, BN_NORM_ATTN),
                                             eps, b->xq, codes_ld(b, dim, M), b->act_scale,
                                             b->act_sum, pdl, s));
        b->ran |= 1u << K_NORM_Q;
        if ((st = cb_mark(b, BN_CUDA_STAGE_ATTN_NORM, 1, err)) != BN_OK)
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
        } else if ((st = matmul(b, &g[G_QKV], M, b->qkv, pdl, &n, err)) != BN_OK) {
            return st;
        }
        if ((st = cb_mark(b, BN_CUDA_STAGE_QKV, n, err)) != BN_OK)
            return st;
        if (!fused) {
            const bn_cb_qkv_shape qs = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len,
                                        sq, sk, sv};
            BN_CUDA_TRY(err, bn_cb_qkv_post(b->qkv, b->qkv_n, M, &qs, &b->freqs, rope,
                                            rope ? b->kv_len : 0, d_pos, b->q, q_dim, kl, vl,
                                            b->kv_f16, pdl, s));
            b->ran |= 1u << K_QKV_POST;
            if ((st = cb_mark(b, BN_CUDA_STAGE_ROPE_KV, 1, err)) != BN_OK)
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
        if ((st = cb_mark(b, BN_CUDA_STAGE_ATTENTION, attn_launches, err)) != BN_OK)
            return st;

        BN_CUDA_TRY(err, bn_cb_norm_quantize(b->att, q_dim, M, q_dim,
                                             norm_ptr(b, l, BN_NORM_ATTN_SUB), eps, b->xq,
                                             codes_ld(b, q_dim, M), b->act_scale,
                                             b->act_sum, pdl, s));
        if ((st = cb_mark(b, BN_CUDA_STAGE_SUB_NORM, 1, err)) != BN_OK)
            return st;
        if ((st = matmul(b, &g[G_O], M, b->out, pdl, &n, err)) != BN_OK ||
            (st = cb_mark(b, BN_CUDA_STAGE_O, n, err)) != BN_OK)
            return st;
        BN_CUDA_TRY(err, bn_cb_add_norm_quantize(b->x, dim, b->out, dim, M, dim,
                                                 norm_ptr(b, l, BN_NORM_FFN), eps, b->xq,
                                                 codes_ld(b, dim, M), b->act_scale,
                                                 b->act_sum, pdl, s));
        b->ran |= 1u << K_ADD_NORM_Q;
        if ((st = cb_mark(b, BN_CUDA_STAGE_FFN_NORM, 1, err)) != BN_OK)
            return st;
        if (decode && b->gu_pair)
            n = 1, st = gate_up_pair(b, &g[G_GU], pdl, err);
        else
            st = matmul(b, &g[G_GU], M, b->gu, pdl, &n, err);
        if (st != BN_OK || (st = cb_mark(b, BN_CUDA_STAGE_GATE_UP, n, err)) != BN_OK)
            return st;
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
        if ((st = cb_mark(b, BN_CUDA_STAGE_RELU2, 1, err)) != BN_OK)
            return st;
        if ((st = matmul(b, &g[G_DOWN], M, b->out, pdl, &n, err)) != BN_OK ||
            (st = cb_mark(b, BN_CUDA_STAGE_DOWN, n, err)) != BN_OK)
            return st;

        if (l + 1 < hp->n_layer) {
            /* The residual add fused with the next layer's attn_norm. */
            BN_CUDA_TRY(err, bn_cb_add_norm_quantize(b->x, dim, b->out, dim, M, dim,
                                                     norm_ptr(b, l + 1, BN_NORM_ATTN), eps, b->xq,
                                                     codes_ld(b, dim, M), b->act_scale,
                                                     b->act_sum, pdl, s));
            if ((st = cb_mark(b, BN_CUDA_STAGE_ATTN_NORM, 1, err)) != BN_OK)
                return st;
        }
    }

    /* Only the last row's logits are wanted: its residual and output norm (with PDL in decode, as the screened
     * head's kernel after it: that one's blocks start streaming the head's
     * first rows into L2 while the norm runs). */
    const int64_t last = (M - 1) * dim;
    BN_CUDA_TRY(err, bn_cb_add_rmsnorm(b->x + last, dim, b->out + last, dim, 1, dim,
                                       b->d_norms + b->out_norm_off, eps, b->normed, dim, pdl,
                                       s));
    b->ran |= 1u << K_OUT_NORM;
    if ((st = cb_mark(b, BN_CUDA_STAGE_OUT_NORM, 1, err)) != BN_OK)
        return st;
    if (screen) {
        /* The greedy token comes out of the two as a key (d_best); the
         * exact pass computes every row that can be among the top
         * d_dec[3] (cb_queue_pass). */
        BN_CUDA_TRY(err, bn_cb_head_screen(b->d_head_q, b->d_head_se, hp->vocab, dim, b->normed,
                                           b->head_upper, b->head_part, b->d_best, b->d_cand_n,
                                           b->sm, pdl, s));
        BN_CUDA_TRY(err, bn_cb_head_exact(b->d_head, b->head_type, hp->vocab, dim, b->normed,
                                          b->head_upper, b->head_part, b->head_parts,
                                          cb_dec_dev(b) + 3, b->logits, b->d_best, b->d_cand,
                                          b->d_cand_n, BN_CUDA_SAMPLE_MAX_CAND,
                                          b->d_cand_floor, b->sm, pdl, s));
        b->ran |= 1u << K_HEAD_SCREEN;
        return cb_mark(b, BN_CUDA_STAGE_LM_HEAD, 2, err);
    }
    BN_CUDA_TRY(err, bn_cb_head_gemv(b->d_head, b->head_type, hp->vocab, dim, b->normed,
                                     b->logits, b->sm, s));
    b->ran |= 1u << K_HEAD;
    return cb_mark(b, BN_CUDA_STAGE_LM_HEAD, 1, err);
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
    cb_count_h2d(b, bytes);
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
 * uniform number and the parameters of cb_queue_choice's draw (sample NULL:
 * greedy, or logits). A greedy step with a screened head replays `graph`,
 * and a sampled one graph_sample, each ending with the choice and its
 * hand-off (b->choice_in_pass). chained: a decode step whose token is the
 * one the step queued before it picks (tokens unused). */
bn_status cb_queue_pass(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                        int top_k, double u, const bn_cuda_sample_params *sample,
                        bool chained, bn_error *err)
{
    const bool screen = top_k > 0 && b->head_screen;
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
    const bool staged = staged_for(b, tokens, n, pos);
    const int32_t *d_tok = staged ? b->d_stage : b->d_tokens;
    const int32_t *d_pos = staged ? b->d_stage + n : b->d_pos;
    const bn_status rows = staged ? BN_CUDA_STATUS(err, cudaStreamWaitEvent(b->cs,
                                                                            b->stage_copied, 0))
                                  : cb_upload_rows(b, tokens, n, pos, err);
    if (rows != BN_OK)
        return rows;
    for (int64_t c = 0; c < n; c += b->chunk) {
        const int64_t M = n - c < b->chunk ? n - c : b->chunk;
        bn_status st = cb_enqueue_rows(b, M, d_tok + c, d_pos + c, NULL, pos + c + M, screen, err);
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
