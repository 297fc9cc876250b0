/*
 * cuda_backend_plan.c - the CUDA backend's plan and uploads, which
 * bn_cuda_backend_create (cuda_backend.c) runs: the model's shape checked
 * against the kernels, the projection groups (q|k|v and gate|up packed back
 * to back), where the embedding and the LM head sit, the scratch buffers and
 * the memory budget, then the norms, the tables and the ternary weights
 * copied to the device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_cuda.h"
#include "cuda_backend_internal.h"
#include "fp16.h"
#include "qtype.h"
#include "threadpool.h"

/* A converted LM head is stored as F32 (exact, like the CPU) up to this
 * size, as F16 above it. */
#define HEAD_F32_MAX ((uint64_t)256 << 20)
#define MAX_UPLOAD_SLOTS 8

/* ---- the product groups ------------------------------------------------------ */

void cb_setup_groups(bn_cuda_backend *b)
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

/* ---- creation: planning ------------------------------------------------------- */

bn_status cb_check_shape(const bn_cuda_backend *b, bn_error *err)
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
bn_status cb_plan_tables(bn_cuda_backend *b, bn_error *err)
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
    if (ht >= 0 && head->row_bytes == (size_t)hp->dim * cb_head_elem_bytes(ht)) {
        b->head_type = ht;
    } else {
        if (!bn_qtype_get(head->type) || !bn_qtype_get(head->type)->dequantize_row)
            return bn_error_set(err, BN_ERR_UNSUPPORTED, "use --device cpu",
                                "the LM head's encoding cannot be read row by row");
        b->head_type = (uint64_t)hp->vocab * (uint64_t)hp->dim * 4 <= HEAD_F32_MAX
                           ? BN_CB_HEAD_F32
                           : BN_CB_HEAD_F16;
    }
    b->head_bytes = cb_head_table_bytes(b);
    return BN_OK;
}

/* Whether a prefill chunk's GEMM of some projection group runs a stream-K
 * kernel (the W2A8 table's pick), so the backend needs its workspace.
 * Every layer has the first layer's shapes. */
static bool prefill_needs_streamk(const bn_cuda_backend *b)
{
    for (int gi = 0; gi < G_COUNT; gi++) {
        const group *g = &b->groups[gi];
        for (int i = 0; i < (g->fused_ok ? 1 : g->n_seg); i++) {
            const bn_cuda_layout *l = g->fused_ok ? &g->fused : &g->s[i].l;
            if (bn_w2a8_cuda_gemm_needs_streamk(b->chunk, l->n, l->k_padded, b->sm))
                return true;
        }
    }
    return false;
}

/* Every scratch buffer and its size (R = chunk rows); returns the count. */
int cb_scratch_list(bn_cuda_backend *b, scratch_spec *list)
{
    const bn_hparams *hp = &b->hp;
    const size_t R = (size_t)b->chunk, f = sizeof(float);
    int n = 0;
    /* Entries past MAX_SCRATCH are counted, not written: the caller fails. */
#define ADD(p_, size_)                                                                             \
    (n < MAX_SCRATCH ? (list[n].ptr = (void **)(p_), list[n].bytes = (size_t)(size_)) : 0, n++)
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
    ADD(&b->logits, (size_t)(b->opt.tp_size > 1 ? b->opt.tp_size * b->head_span : hp->vocab) * f);
    if (b->opt.tp_size > 1)
        ADD(&b->tp_stats, (size_t)b->opt.tp_size * (size_t)b->chunk * 2 * sizeof(double));
    ADD(&b->ws_sample, bn_cuda_sample_workspace_bytes(hp->vocab));
    ADD(&b->d_next, sizeof(int32_t));
    ADD(&b->d_cand, BN_CUDA_SAMPLE_MAX_CAND * sizeof(uint64_t));
    ADD(&b->d_cand_n, sizeof(unsigned));
    ADD(&b->d_cand_floor, sizeof(float));
    ADD(&b->d_tokens, (size_t)b->kv_len * sizeof(int32_t));
    ADD(&b->d_pos, (size_t)b->kv_len * sizeof(int32_t));
    ADD(&b->d_dec, 2 * DEC_STRIDE * sizeof(int32_t));
    if (b->paged_rows > 0) { /* the batched pass's head (cuda_backend_internal.h) */
        b->rows_form = b->head_type == BN_CB_HEAD_F16    ? BN_CB_ROWS_HEAD_F16
                       : b->head_type == BN_CB_HEAD_BF16 ? BN_CB_ROWS_HEAD_BF16
                                                         : BN_CB_ROWS_HEAD_F32;
        const size_t H = (size_t)b->rows_head, dim = (size_t)hp->dim;
        const int parts = bn_cb_rows_head_parts(b->rows_form);
        /* fp32 rows for the GEMV without cuBLAS, else the 16-bit parts */
        const size_t in_bytes = parts * 2 > 4 ? (size_t)parts * 2 : 4;
        ADD(&b->d_hin, H * dim * in_bytes);
        ADD(&b->d_hscale, H * f);
        /* the head GEMM's output: each row's parts' logits, combined in place */
        ADD(&b->d_rlogits, H * (size_t)parts * (size_t)hp->vocab * f);
        ADD(&b->d_lrow, H * sizeof(int32_t));
        ADD(&b->d_rtok, H * sizeof(int32_t));
        ADD(&b->d_rparams, H * sizeof(bn_cuda_sample_params));
        ADD(&b->d_ru, H * sizeof(double));
        ADD(&b->ws_rows, H * bn_cuda_sample_workspace_bytes(hp->vocab));
        if (b->rows_form != BN_CB_ROWS_HEAD_F32) {
            ADD(&b->d_hy, H * dim * f);
            ADD(&b->d_hfactor, H * f);
            ADD(&b->d_hwmax, (size_t)hp->vocab * f);
            ADD(&b->d_rbest, H * sizeof(unsigned long long));
            ADD(&b->d_rcount, H * sizeof(unsigned));
        }
        ADD(&b->ws_paged, bn_cb_attn_paged_workspace_bytes(hp->n_head, hp->head_dim));
        ADD(&b->d_sums, (size_t)BN_W2A8_SUMS_MAX_ROWS * dim * sizeof(int32_t));
        ADD(&b->ws_blas, (size_t)32 << 20); /* cuBLAS's advice for Hopper */
        ADD(&b->d_rblocks, 4 * sizeof(int32_t) * (size_t)PAGED_RUN_BLOCKS(b->chunk));
    }
#undef ADD
    return n;
}

/* The screened head's buffers: the int8 copy [vocab][dim], (scale, bound
 * factor) per row, the rows' upper ends and the screen blocks' largest
 * lower ends. Sets b->head_parts. */
void cb_head_screen_list(bn_cuda_backend *b, scratch_spec *list)
{
    const size_t rows = (size_t)b->head_rows; /* the vocabulary, or a rank's rows of it */
    b->head_parts = bn_cb_head_screen_blocks(b->head_rows, b->sm);
    list[0] = (scratch_spec){(void **)&b->d_head_q, rows * (size_t)b->hp.dim};
    list[1] = (scratch_spec){(void **)&b->d_head_se, rows * 2 * sizeof(float)};
    list[2] = (scratch_spec){(void **)&b->head_upper, rows * sizeof(float)};
    list[3] = (scratch_spec){(void **)&b->head_part, (size_t)b->head_parts * sizeof(float)};
}

size_t cb_head_row_bytes(const bn_cuda_backend *b)
{
    return (size_t)b->hp.dim * (b->head_type == BN_CB_HEAD_F32 ? 4 : 2);
}

uint64_t cb_round_alloc(size_t bytes)
{
    return bytes < 256 ? 256 : ((uint64_t)bytes + 255) / 256 * 256;
}

/* Fails with BN_ERR_GPU_OUT_OF_MEMORY when `total` exceeds `budget`, saying
 * what takes the memory and what to reduce. */
bn_status cb_check_budget(const bn_cuda_backend *b, uint64_t total, uint64_t budget,
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
            cb_count_h2d(b, s->l.bytes);
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

bn_status cb_upload_weights(bn_cuda_backend *b, bn_error *err)
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
    cb_count_h2d(b, bytes);
    BN_CUDA_TRY(err, cudaStreamSynchronize(b->copy));
    return BN_OK;
}

bn_status cb_upload_tables(bn_cuda_backend *b, bn_error *err)
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

bn_status cb_upload_norms(bn_cuda_backend *b, bn_error *err)
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
