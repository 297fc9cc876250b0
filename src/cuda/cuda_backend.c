/*
 * cuda_backend.c - the CUDA backend: the whole forward pass on one GPU
 * (design and contracts in cuda_backend.h; the kernels it adds in
 * cuda_backend_kernels.h; how the backend is split into files in
 * cuda_backend_internal.h). This file creates the backend (options, device,
 * plan, allocation, uploads, warm-up, graph capture), frees it and answers
 * the queries.
 */
#include "cuda_backend.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_cuda.h"
#include "cuda_backend_internal.h"
#include "nccl_loader.h"

#define DEFAULT_CHUNK 512
/* Left free on the device for the CUDA context's own needs (graph,
 * module loading, fragmentation). */
#define DEVICE_RESERVE ((uint64_t)64 << 20)

/* ---- small helpers ---------------------------------------------------------- */

void bn_cuda_backend_options_default(bn_cuda_backend_options *o)
{
    memset(o, 0, sizeof *o);
    o->device = -1;
    o->kv_type = BN_CUDA_KV_F32;
}

static const char *head_type_name(int type)
{
    return type == BN_CB_HEAD_F32 ? "f32" : type == BN_CB_HEAD_F16 ? "f16" : "bf16";
}

/* A device buffer for `purpose` (named in out-of-memory errors and in the
 * pool's leak report). */
static bn_status dalloc(bn_cuda_backend *b, size_t bytes, void **out, const char *purpose,
                        bn_error *err)
{
    *out = NULL;
    if (b->n_allocs == MAX_ALLOCS)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "cuda backend: too many device buffers");
    if (bytes < 256)
        bytes = 256; /* never ask for 0; cudaMalloc rounds to 256 anyway */
    bn_status st = bn_cuda_context_alloc_for(b->ctx, bytes, purpose, out, err);
    if (st != BN_OK)
        return st;
    b->allocs[b->n_allocs].p = *out;
    b->allocs[b->n_allocs].bytes = bytes;
    b->n_allocs++;
    return BN_OK;
}

/* ---- creation: warm-up ---------------------------------------------------------- */

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
    if (st == BN_OK && b->form.pdl) {
        bn_error perr;
        bn_error_clear(&perr);
        if (bn_cuda_backend_forward_greedy(b, zeros, 1, 0, &next, &perr) != BN_OK) {
            bn_log(BN_LOG_WARN, "cuda backend: a decode step with programmatic dependent launch "
                                "failed (%s); decoding without it",
                   perr.message);
            b->form.pdl = false;
        }
    }
    if (st == BN_OK && !b->form.pdl)
        st = bn_cuda_backend_forward_greedy(b, zeros, 1, 0, &next, err);
    /* A sampled step: the sampler's first launch, before graph_sample's
     * capture. */
    const bn_cuda_sample_params one = {1.0f, 1, 1.0f, 0.0f};
    if (st == BN_OK && bn_cuda_backend_sample_supported(b, &one))
        st = bn_cuda_backend_forward_sample(b, zeros, 1, 0, &one, 0.5, &next, err);
    if (st == BN_OK && b->form.head_screen) { /* greedy steps screened; the full head once too */
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

/* ---- creation: the decode step's form ------------------------------------------ */

/* What the device and the model allow the decode step beyond the head's
 * facts and mapped pinned memory (found during the plan and allocation):
 * each kernel family's own answer for this device, build and shape. Every
 * layer has layer 0's shapes. The queries that set a kernel's attributes
 * (cluster sizes, shared memory) are made at the sizes the form uses. */
static void find_caps(bn_cuda_backend *b, bn_cuda_decode_caps *caps)
{
    const bn_hparams *hp = &b->hp;
    const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, b->kv_len};
    const group *qkv = &b->groups[G_QKV], *gu = &b->groups[G_GU];
    caps->pdl = bn_cb_pdl_supported(b->device) != 0;
    caps->gemv_clusters = bn_w2a8_cuda_gemv_cluster_usable() != 0;
    caps->attn_cluster = b->kv_f16 ? 0 : bn_cb_attn_decode_cluster(&as, 0);
    caps->attn_qkv = caps->attn_cluster > 0 && qkv->fused_ok &&
                     bn_cb_attn_decode_qkv_prepare(&as, caps->attn_cluster, qkv->k) ==
                         cudaSuccess;
    (void)cudaGetLastError();
    caps->gate_up_pairs =
        gu->fused_ok && gu->n_seg == 2 && gu->s[0].n == gu->s[1].n &&
        bn_w2a8_cuda_gemv_pair_fits(gu->fused.n, gu->fused.tiles, gu->fused.groups);
    if (caps->gate_up_pairs) {
        const bn_w2a8_cuda_args a = cb_pair_args(b, gu);
        caps->gate_up_cluster16 = bn_w2a8_cuda_gemv_pair_cluster16(&a, gu->split) != 0;
    }
    caps->embed_norm = cb_embed_norm_fits(b);
}

/* The decode step's form from every fact (bn_cuda_decode_form_choose), as
 * if the device offered no more than as_if says (tests). */
static void decide_form(bn_cuda_backend *b, bn_cuda_decode_caps *caps, const bn_cuda_as_if *as_if)
{
    find_caps(b, caps);
    bn_cuda_decode_caps_limit(caps, as_if);
    bn_cuda_decode_form_choose(caps, &b->form);
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

/* A rank of a tensor-parallel team: its rows of the LM head and NCCL. */
static bn_status tp_setup(bn_cuda_backend *b, bn_error *err)
{
    const bn_cuda_backend_options *o = &b->opt;
    if (o->tp_rank < 0 || o->tp_rank >= o->tp_size || !o->tp_comm || !o->tp_ready)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda backend: tensor-parallel rank %d of %d without its team",
                            o->tp_rank, o->tp_size);
    const int64_t vocab = b->hp.vocab;
    b->head_span = (vocab + o->tp_size - 1) / o->tp_size;
    b->head_row0 = b->head_span * o->tp_rank < vocab ? b->head_span * o->tp_rank : vocab;
    b->head_rows = vocab - b->head_row0 < b->head_span ? vocab - b->head_row0 : b->head_span;
    const bn_hparams *whole = bn_checkpoint_whole_hparams(b->model);
    b->whole_q_dim = (int64_t)whole->n_head * whole->head_dim;
    b->whole_ffn = whole->ffn;
    return bn_nccl_get(&b->nccl, err);
}

/* The head bytes the decode form's table weighs for screening: a rank's
 * share of them under tensor parallelism (it screens its rows). */
static uint64_t screen_head_bytes(const bn_cuda_backend *b)
{
    return cb_head_table_bytes(b) / (uint64_t)b->hp.vocab * (uint64_t)b->head_rows;
}



bn_status bn_cuda_backend_create(const bn_checkpoint *model, const bn_cuda_backend_options *opt,
                                 bn_cuda_backend **out, bn_error *err)
{
    return bn_cuda_backend_create_as(model, opt, NULL, out, err);
}

bn_status bn_cuda_backend_create_as(const bn_checkpoint *model,
                                    const bn_cuda_backend_options *opt_in,
                                    const bn_cuda_as_if *as_if, bn_cuda_backend **out,
                                    bn_error *err)
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
    if (opt.kv_type != BN_CUDA_KV_F32 && opt.kv_type != BN_CUDA_KV_F16 &&
        opt.kv_type != BN_CUDA_KV_E4M3)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "unknown KV cache type %d",
                            (int)opt.kv_type);
    if (opt.prefill_chunk < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "negative prefill chunk");

    bn_cuda_backend *b = calloc(1, sizeof *b);
    if (!b)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a CUDA backend");
    b->model = model;
    b->hp = *hp;
    b->opt = opt;
    b->kv_len = kv_len;
    b->kv_f16 = opt.kv_type != BN_CUDA_KV_F32;
    b->kv_elem = b->kv_f16 ? 2 : 4;
    b->paged_kv = opt.kv_type == BN_CUDA_KV_E4M3 ? BN_CB_KV_E4M3
                  : b->kv_f16                    ? BN_CB_KV_F16
                                                 : BN_CB_KV_F32;
    b->paged_elem = bn_cb_kv_bytes(b->paged_kv);
    b->q_dim = (int64_t)hp->n_head * hp->head_dim;
    b->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    b->qkv_n = b->q_dim + 2 * b->kv_dim;
    b->gu_n = 2 * (int64_t)hp->ffn;
    b->chunk = opt.prefill_chunk > 0 ? opt.prefill_chunk : DEFAULT_CHUNK;
    if (b->chunk > kv_len)
        b->chunk = kv_len;
    b->use_graphs = true;
    b->head_rows = b->head_span = hp->vocab;
    if (opt.tp_size > 1) {
        bn_status tst = tp_setup(b, err);
        if (tst != BN_OK) {
            bn_cuda_backend_free(b);
            return tst;
        }
    }
    /* The paged cache of many sequences (of the single cache's precision,
     * or e4m3), for head sizes the paged attention takes. */
    if (opt.tp_size <= 1 && opt.paged_rows > 0 && opt.paged_block > 0 && opt.paged_max_seqs > 0 &&
        bn_cb_attn_paged_supports(hp->head_dim) && opt.paged_rows % opt.paged_block == 0) {
        b->paged_rows = opt.paged_rows;
        b->paged_block = opt.paged_block;
        b->paged_max_seqs = opt.paged_max_seqs;
        b->paged_max_blocks = (int)((kv_len + opt.paged_block - 1) / opt.paged_block);
        b->paged_bytes = 2 * (uint64_t)hp->n_layer * (uint64_t)b->paged_rows * (uint64_t)b->kv_dim *
                         b->paged_elem;
        /* Every sequence of a pass wants at most one row's logits. */
        b->rows_head = opt.paged_max_seqs < ROWS_HEAD_MAX ? opt.paged_max_seqs : ROWS_HEAD_MAX;
    }

    bn_status st = cb_check_shape(b, err);
    if (st == BN_OK)
        st = pick_device(opt.device, &b->device, err);
    if (st == BN_OK)
        st = bn_cuda_context_create(b->device, &b->ctx, err);
    if (st == BN_OK) /* the pool enforces it too, for whatever is allocated later */
        bn_cuda_context_set_memory_limit(b->ctx, opt.memory_limit);
    if (st != BN_OK) {
        bn_cuda_backend_free(b);
        return st;
    }
    const bn_cuda_device *dev = bn_cuda_context_device(b->ctx);
    b->sm = dev->sm_count > 0 ? dev->sm_count : 1;
    snprintf(b->name, sizeof b->name, "%s", dev->name);
    b->cs = bn_cuda_context_compute_stream(b->ctx);
    b->copy = bn_cuda_context_copy_stream(b->ctx);
    if (b->paged_rows > 0) { /* the device's answer, on its context */
        const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, kv_len};
        b->paged_resident = bn_cb_attn_paged_resident(&as, b->paged_kv, b->sm);
    }

    /* The plan: every size before any allocation. */
    b->groups = calloc((size_t)hp->n_layer * G_COUNT, sizeof *b->groups);
    if (!b->groups) {
        bn_cuda_backend_free(b);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for weight tables");
    }
    cb_setup_groups(b);
    int64_t off = 0;
    for (int w = 0; w < BN_NORM_COUNT; w++) {
        b->norm_off[w] = off;
        off += bn_hparams_norm_size(hp, (bn_norm)w);
    }
    b->layer_norms = off;
    b->out_norm_off = off * hp->n_layer;
    b->norms_bytes = (uint64_t)(b->out_norm_off + hp->dim) * sizeof(float);
    b->kv_bytes = 2 * (uint64_t)hp->n_layer * (uint64_t)kv_len * (uint64_t)b->kv_dim * b->kv_elem;
    st = cb_plan_tables(b, err);
    if (st != BN_OK) {
        bn_cuda_backend_free(b);
        return st;
    }
    /* The screened head's int8 copy and per-row data, when it has room. */
    scratch_spec screen[HEAD_SCREEN_BUFFERS];
    cb_head_screen_list(b, screen);
    uint64_t screen_bytes = 0;
    for (int i = 0; i < HEAD_SCREEN_BUFFERS; i++)
        screen_bytes += cb_round_alloc(screen[i].bytes);
    scratch_spec scratch[MAX_SCRATCH];
    const int n_scratch = cb_scratch_list(b, scratch);
    if (n_scratch > MAX_SCRATCH) {
        bn_cuda_backend_free(b);
        return bn_error_set(err, BN_ERR_INTERNAL, NULL,
                            "cuda backend: %d scratch buffers, room for %d", n_scratch,
                            MAX_SCRATCH);
    }
    /* scratch_bytes is what is allocated (dalloc's 256-byte minimum); the
     * budget also counts cudaMalloc's rounding to 256 bytes. */
    b->scratch_bytes = 0;
    const size_t paged_index_bytes =
        (3 * (size_t)b->chunk + ((size_t)b->paged_max_seqs + 1) * (size_t)b->paged_max_blocks) *
        sizeof(int32_t);
    uint64_t total = cb_round_alloc(b->w_bytes) + cb_round_alloc(b->embed_bytes) +
                     (b->head_shared ? 0 : cb_round_alloc(b->head_bytes)) +
                     cb_round_alloc(b->norms_bytes) + 2 * cb_round_alloc(b->kv_bytes / 2);
    if (b->paged_rows > 0)
        total += 2 * cb_round_alloc(b->paged_bytes / 2) + cb_round_alloc(paged_index_bytes);
    for (int i = 0; i < n_scratch; i++) {
        b->scratch_bytes += scratch[i].bytes < 256 ? 256 : scratch[i].bytes;
        total += cb_round_alloc(scratch[i].bytes);
    }

    size_t free_bytes = 0, total_bytes = 0;
    st = BN_CUDA_STATUS(err, cudaMemGetInfo(&free_bytes, &total_bytes));
    const uint64_t usable = free_bytes > DEVICE_RESERVE ? free_bytes - DEVICE_RESERVE : 0;
    /* The decode step's form takes the screened head where the head is
     * large and its copy fits the plan: the table decides from the head's
     * facts here, for the plan, and again with every fact after the
     * uploads (decide_form), the same way. */
    bn_cuda_decode_caps caps;
    memset(&caps, 0, sizeof caps);
    caps.kv_f16 = b->kv_f16;
    caps.head_bytes = screen_head_bytes(b);
    const uint64_t budget =
        opt.memory_limit > 0 && opt.memory_limit < usable ? opt.memory_limit : usable;
    caps.head_copy_fits = total + screen_bytes <= budget;
    bn_cuda_decode_caps_limit(&caps, as_if);
    bn_cuda_decode_form_choose(&caps, &b->form);
    if (b->form.head_screen) {
        b->head_screen_bytes = screen_bytes;
        total += screen_bytes;
    } else if (caps.head_bytes >= BN_CUDA_HEAD_SCREEN_MIN && total <= budget) {
        bn_log(BN_LOG_INFO, "cuda backend: no room for the LM head's int8 copy (%.1f MiB): "
                            "greedy steps read the whole head",
               (double)screen_bytes / MIB);
    }
    if (st == BN_OK && opt.memory_limit > 0)
        st = cb_check_budget(b, total, opt.memory_limit, "the memory limit (BITNET_MEMORY_LIMIT)",
                             err);
    if (st == BN_OK) {
        char what[320];
        snprintf(what, sizeof what, "the free memory of cuda:%d (%s)", b->device, b->name);
        st = cb_check_budget(b, total, usable, what, err);
    }

    /* Allocation, then the uploads. */
    if (st == BN_OK)
        st = dalloc(b, b->w_bytes, (void **)&b->d_w, "ternary weights", err);
    if (st == BN_OK)
        st = dalloc(b, b->embed_bytes, &b->d_embed, "token embedding", err);
    if (st == BN_OK) {
        if (b->head_shared)
            b->d_head = b->d_embed;
        else
            st = dalloc(b, b->head_bytes, &b->d_head, "LM head", err);
    }
    for (int i = 0; i < HEAD_SCREEN_BUFFERS && st == BN_OK && b->form.head_screen; i++)
        st = dalloc(b, screen[i].bytes, screen[i].ptr, "screened LM head", err);
    if (st == BN_OK)
        st = dalloc(b, b->norms_bytes, (void **)&b->d_norms, "norm weights", err);
    if (st == BN_OK)
        st = dalloc(b, b->kv_bytes / 2, &b->d_k, "KV cache (keys)", err);
    if (st == BN_OK)
        st = dalloc(b, b->kv_bytes / 2, &b->d_v, "KV cache (values)", err);
    for (int i = 0; i < n_scratch && st == BN_OK; i++)
        st = dalloc(b, scratch[i].bytes, scratch[i].ptr, "activations and workspaces", err);
    if (st == BN_OK && b->paged_rows > 0) {
        st = dalloc(b, b->paged_bytes / 2, &b->d_pk, "paged KV cache (keys)", err);
        if (st == BN_OK)
            st = dalloc(b, b->paged_bytes / 2, &b->d_pv, "paged KV cache (values)",
                        err);
        int32_t *index = NULL;
        if (st == BN_OK)
            st = dalloc(b, paged_index_bytes, (void **)&index, "paged rows and block tables",
                        err);
        if (st == BN_OK) {
            b->d_slot = index;
            b->d_rseq = index + b->chunk;
            b->d_dlist = index + 2 * b->chunk;
            b->d_tables = index + 3 * b->chunk;
        }
    }
    void *pinned = NULL;
    if (st == BN_OK &&
        (st = BN_CUDA_STATUS(err, cudaMallocHost(&pinned, (size_t)(2 * kv_len + 2 * H_TAIL) *
                                                              sizeof(int32_t)))) == BN_OK)
        b->h_io = pinned;
    /* Pinned memory is mapped wherever the device has unified addressing
     * (every 64-bit platform CUDA supports): the step's last kernel can
     * store the token there (h_io_dev, once the form says so). */
    void *alias = NULL;
    caps.mapped_pinned =
        b->h_io && cudaHostGetDevicePointer(&alias, b->h_io, 0) == cudaSuccess && alias;
    (void)cudaGetLastError();
    pinned = NULL;
    if (st == BN_OK &&
        (st = BN_CUDA_STATUS(err, cudaMallocHost(&pinned, (size_t)hp->vocab * sizeof(float)))) ==
            BN_OK)
        b->h_logits = pinned;
    for (int i = 0; i < 2 && st == BN_OK; i++)
        st = BN_CUDA_STATUS(err, cudaEventCreateWithFlags(&b->step_done[i],
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
    /* The batched down product's sums start at 0; the norm that reads them
     * leaves them there. */
    if (st == BN_OK && b->d_sums)
        st = BN_CUDA_STATUS(
            err,
            cudaMemsetAsync(b->d_sums, 0, (size_t)BN_W2A8_SUMS_MAX_ROWS * hp->dim * sizeof(int32_t),
                            b->copy));
    if (st == BN_OK && b->ws_rows)
        st = BN_CUDA_STATUS(err, cudaMemsetAsync(b->ws_rows, 0,
                                                 (size_t)b->rows_head *
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
        st = cb_upload_norms(b, err);
    if (st == BN_OK)
        st = cb_upload_tables(b, err);
    if (st == BN_OK)
        st = cb_upload_weights(b, err);
    const double t1 = bn_time_seconds();
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->copy));
    if (st == BN_OK && !b->kv_f16)
        st = BN_CUDA_STATUS(err, bn_cb_attn_prefill_prepare(hp->head_dim));
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, bn_cb_head_prepare(b->head_type, hp->dim));
    if (st == BN_OK && b->d_hwmax) { /* the batched pass's greedy picks */
        st = BN_CUDA_STATUS(err, bn_cb_rows_pick_prepare(b->head_type, hp->dim));
        if (st == BN_OK)
            st = BN_CUDA_STATUS(err, bn_cb_head_row_max(b->d_head, b->head_type, hp->vocab, hp->dim,
                                                        b->d_hwmax, b->cs));
        if (st == BN_OK)
            st = BN_CUDA_STATUS(
                err, bn_cb_rows_pick_reset(b->d_rbest, b->d_rcount, b->rows_head, b->cs));
        b->rows_pick = st == BN_OK;
    }
    if (st == BN_OK) {
        decide_form(b, &caps, as_if);
        b->h_io_dev = b->form.copy_token ? NULL : alias;
    }
    if (st == BN_OK && b->form.head_screen) {
        st = BN_CUDA_STATUS(err, bn_cb_head_screen_prepare(b->head_type, hp->dim));
        if (st == BN_OK)
            st = BN_CUDA_STATUS(err, bn_cb_head_quantize((const char *)b->d_head +
                                                             (size_t)b->head_row0 *
                                                                 cb_head_row_bytes(b),
                                                         b->head_type, b->head_rows, hp->dim,
                                                         b->d_head_q, b->d_head_se, b->cs));
    }
    /* A team's ranks run the warm-up's collectives together: only if every
     * rank got this far. */
    if (opt.tp_size > 1 && !opt.tp_ready(opt.tp_team, opt.tp_rank, st == BN_OK) && st == BN_OK)
        st = bn_error_set(err, BN_ERR_GPU, NULL,
                          "cuda:%d stopped: another rank of its tensor-parallel team failed",
                          b->device);
    if (st == BN_OK)
        st = warm_up(b, err);
    if (st == BN_OK && b->use_graphs)
        cb_capture_graph(b);
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
           "(%lld-token prefill), decode graph %s, programmatic dependent launch %s",
           b->device, b->name, b->sm, (double)b->w_bytes / MIB, t1 - t0,
           (double)b->embed_bytes / MIB, head_type_name(b->head_type),
           (double)cb_head_table_bytes(b) / MIB,
           b->head_shared ? " (the embedding)" : "",
           b->form.head_screen ? " + its int8 copy (greedy steps screen the head)" : "",
           b->kv_f16 ? "f16" : "f32",
           (double)b->kv_bytes / MIB, (long long)kv_len, (double)b->scratch_bytes / MIB,
           (long long)b->chunk, b->graph.exec ? "captured" : "off", b->form.pdl ? "on" : "off");
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
        step_graph *graphs[] = {&b->graph, &b->graph_logits, &b->graph_sample, &b->graph1,
                                &b->graph_sample1};
        for (size_t i = 0; i < sizeof graphs / sizeof graphs[0]; i++)
            if (graphs[i]->exec)
                cudaGraphExecDestroy(graphs[i]->exec);
        for (int i = 0; i < 2; i++)
            if (b->step_done[i])
                cudaEventDestroy(b->step_done[i]);
        cb_free_stage_map(b);
        cb_rows_release(b);
        for (int i = 0; i < b->n_allocs; i++)
            bn_cuda_context_free(b->ctx, b->allocs[i].p, b->allocs[i].bytes);
        if (b->h_io)
            cudaFreeHost(b->h_io);
        if (b->h_logits)
            cudaFreeHost(b->h_logits);
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
        (void)cb_fail_pass(b, 0, BN_OK);
    b->kv_filled = 0;
}
int bn_cuda_backend_device(const bn_cuda_backend *b) { return b->device; }
const char *bn_cuda_backend_device_name(const bn_cuda_backend *b) { return b->name; }
bn_cuda_kv_type bn_cuda_backend_kv_type(const bn_cuda_backend *b)
{
    /* e4m3 is the paged cache's: without one, every cache is fp16. */
    if (b->opt.kv_type == BN_CUDA_KV_E4M3 && b->paged_rows == 0)
        return BN_CUDA_KV_F16;
    return b->opt.kv_type;
}
void bn_cuda_backend_decode_form(const bn_cuda_backend *b, bn_cuda_decode_form *out)
{
    *out = b->form;
}

unsigned bn_cuda_backend_fixed_stages(const bn_cuda_backend *b)
{
    unsigned m = 0;
    if (!b->kv_f16 && b->form.attn_cluster > 8)
        m |= 1u << BN_CUDA_STAGE_ATTENTION;
    if (b->form.gate_up_cluster > 8) /* the gate|up GEMV in pairs, in clusters of 16 */
        m |= 1u << BN_CUDA_STAGE_GATE_UP;
    return m;
}

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
    out->kv_cache = b->kv_bytes + b->paged_bytes;
    out->scratch = b->scratch_bytes;
    out->total = out->weights + out->embedding + out->lm_head + out->lm_head_screen + out->norms +
                 out->kv_cache + out->scratch;
    uint64_t current = 0, peak = 0;
    bn_cuda_context_memory(b->ctx, &current, &peak);
    out->peak = peak;
    out->device_total = b->device_total;
    out->device_free = b->device_free;
    bn_memory_pool_stats pool;
    bn_cuda_context_pool_stats(b->ctx, &pool);
    out->pool_reserved = pool.bytes_reserved;
    out->pool_peak_reserved = pool.peak_bytes_reserved;
    out->pool_limit = pool.memory_limit;
    out->pool_buffers = pool.buffers_in_use;
    out->pool_allocations = pool.allocations;
    out->pool_failures = pool.failures;
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
}

/* The kernel families' names, in the order of K_* (cuda_backend_internal.h). */
static const char *const kernel_names[K_COUNT] = {
    "embed_rows", "norm_quantize", "residual_norm_quantize", "relu2_norm_quantize",
    "w2a8_gemv", "w2a8_gemm", "qkv_rope_kv_store", "attention_decode_f32",
    "attention_prefill_f32", "attention_decode_f16", "attention_prefill_f16",
    "residual_output_norm", "lm_head_gemv", "argmax", "cuda_graph_replay",
    "attention_decode_f32_cluster",
    "lm_head_screen_int8", "attention_decode_f32_cluster_qkv", "w2a8_gemv_gate_up_relu2",
    "sample_top_k_top_p", "decode_handoff", "embed_norm_quantize", "attention_paged",
    "lm_head_rows_gemm", "sample_rows", "attention_prefill_e4m3", "lm_head_rows_pick"};

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
