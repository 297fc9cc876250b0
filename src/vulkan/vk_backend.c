/*
 * vk_backend.c - the Vulkan backend: a model's forward pass on a Vulkan
 * device, behind the engine's backend interface (src/engine/backend.h).
 *
 * At creation everything the pass reads is uploaded once: each projection
 * in the W2A8 kernel's layout (vk_w2a8.h) with its scale, the norm
 * vectors, the LM head (F16 rows where the file has F16 and an even width,
 * else F32, in parts no larger than the device lets a kernel bind), and a
 * KV cache of kv_len positions a layer (fp32, one buffer a layer for the
 * same reason). A pass of M rows (at most VKB_CHUNK) uploads the rows'
 * embeddings, positions and RoPE tables, then records every layer into
 * one sequence of dispatches, as the CPU backend computes it
 * (cpu_backend.c: run_rows, attention_block, ffn_block):
 *
 *   xq = q(attn_norm(x))          norm + int8 (vk_norm.h)
 *   q, k, v = W xq                one W2A8 product (vk_w2a8.h): q and k
 *                                 turned by RoPE, k and v into the cache
 *   att = attention(q, cache)     vk_ops.h, as every kernel below
 *   x += Wo q(attn_sub_norm(att))   the add in the product's epilogue
 *   gate = relu(Wg xf)^2 (Wu xf),  xf = q(ffn_norm(x))   one product of both
 *   x += Wdown q(ffn_sub_norm(gate))
 *
 * and the pass that ends a request adds the output norm and the LM head of
 * its one row. A prompt's last row therefore runs as a pass of its own.
 * A greedy step (forward_pick) screens the head instead (vk_head_screen.h):
 * only its candidates' logits come back, and the host picks among them.
 *
 * With a paged cache (the engine's batching: params.paged_rows) rows of
 * many sequences share a pass (forward_rows): their K and V live in cache
 * rows found through the sequences' block tables, uploaded with the pass,
 * and the head runs over the chunk's rows, the wanted ones read back.
 *
 * On a device with fp64 every kernel but the attention's exp gives the
 * CPU's floats bit for bit (vk_ops.h, vk_norm.h, vk_w2a8.h), so greedy
 * tokens follow the CPU's. Without fp64 (or with BITNET_VULKAN_FP64=0) the
 * kernels' float variants compute the same steps with the device's own
 * division, square root and exp: logits within a small tolerance of the
 * CPU's (tests/test_vulkan_backend.c). There is no fp16 cache.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine.h"
#include "qtype.h"
#include "vk_backend.h"
#include "vk_context.h"
#include "vk_head_screen.h"
#include "vk_norm.h"
#include "vk_ops.h"
#include "vk_w2a8.h"

extern const bn_backend_ops bn_vulkan_backend_ops;

/* Rows a prompt pass takes: a longer prompt runs in chunks. H200 (bench e2e
 * --device vulkan, prompts of 128 / 1000 / 4000 tokens, one call): chunks
 * of 64 rows 7810 / 5706 / 2768 tok/s, 128 10550 / 8279 / 3596, 256 10094
 * / 8995 / 3954: longer chunks share each product's stages among more
 * rows. 128, not 256: the exact attention's scratch holds R x n_head x
 * kv_len floats in one buffer, which a device's largest (lavapipe: 128
 * MiB) must hold. */
#define VKB_CHUNK BN_VK_PROFILE_ROWS
/* Rows a pass of many sequences' rows takes (forward_rows), and so the
 * most rows the LM head runs over in one pass: fewer than a prompt's, since
 * the head runs over every row of a chunk that holds a wanted one, which
 * longer chunks make more of (H200, bench batch --seqs 64: output 1320.8
 * tok/s in chunks of 64 rows, 1147.8 in chunks of 128). A prompt's chunks
 * need no head; its last row runs alone. */
#define VKB_BATCH_CHUNK 64
#define ROWS_KERNEL_MIN 8
#define TILES_KERNEL_MIN 16
/* Decode steps at this position or past it take the attention split over
 * positions (vk_ops.h): the exact one, the CPU's bits, walks every position
 * in turn (H200, 2B-4T heads: 35 us a layer at context 384, 93 at 1000, 319
 * at 4000, against 22.6, 24.6 and 49 split); below, its cost is small and
 * greedy text stays the CPU's, which the split sums' roundings can part
 * from at a near tie of an int8 code. */
#define SPLIT_FROM 256

typedef struct vkb_proj {
    bn_vk_buffer w; /* packed codes (vk_w2a8.h) */
    float scale;
    int64_t n, k;
} vkb_proj;

/* Where a pass's rows keep their K and V: one sequence's flat cache (one
 * block of kv_len rows) or the paged cache through block tables. */
typedef struct vkb_cache {
    bn_vk_buffer *k, *v;  /* one a layer: [rows][kv_dim] */
    bn_vk_buffer *tables; /* [sequences][max_blocks] int32 */
    int block_size, max_blocks;
    int64_t rows;
} vkb_cache;

typedef struct vkb_head_part {
    bn_vk_buffer rows;
    int64_t first, n;
} vkb_head_part;

typedef struct vkb {
    bn_vk *vk;
    bn_vk_kernel *w2a8, *norm;
    /* The W2A8 product of eight rows a workgroup, for passes of at least
     * ROWS_KERNEL_MIN rows (NULL where the device lacks it). */
    bn_vk_kernel *w2a8_rows;
    /* The tiled W2A8 product, for passes of at least TILES_KERNEL_MIN rows:
     * on the subgroup matrix products where the device has them, else on
     * integer dot products; NULL where the device lacks both. */
    bn_vk_kernel *w2a8_tiles;
    /* The W2A8 product that norms its own input row, for decode steps
     * (NULL where the device lacks it). */
    bn_vk_kernel *w2a8_normed;
    bool normed_ran, tiles_ran; /* for the receipt */
    bn_vk_ops *ops;
    const bn_checkpoint *model;
    bn_hparams hp;
    int device;
    int64_t kv_len, kv_filled;
    int64_t q_dim, kv_dim;
    float *inv_freq; /* rope_dim / 2: the CPU backend's */

    vkb_proj *proj;         /* [n_layer][BN_PROJ_COUNT]             */
    bn_vk_buffer *norms;    /* [n_layer][BN_NORM_COUNT]             */
    bn_vk_buffer out_norm;
    vkb_head_part *head;
    int n_head_parts;
    bn_vk_head_type head_type;
    /* The screened head of greedy steps (NULL: they take the full head). */
    bn_vk_head_screen *screen;
    bn_vk_buffer *k_cache, *v_cache; /* one a layer: [kv_len][kv_dim] */
    vkb_cache flat;
    /* The paged cache (0 rows: none): one a layer, [paged_rows][kv_dim];
     * block tables of at most paged_seqs sequences. */
    int64_t paged_rows;
    int paged_block, paged_seqs, paged_max_blocks;
    bn_vk_buffer *pk_cache, *pv_cache, ptables;
    vkb_cache paged;
    int32_t *h_tables;

    /* A pass's rows (VKB_CHUNK of each). */
    bn_vk_buffer x, codes, scales, sums, q, att, gate, normed, logits;
    bn_vk_buffer scratch, info, tables, cs;
    bn_vk_buffer partials; /* a decode row's split attention (vk_ops.h) */
    bn_vk_buffer row_picks; /* forward_rows_pick's tokens, one a row */
    /* The pass's inputs and its logit rows in host-visible memory (io),
     * copied by the pass's own sequence: one submission a pass. h_x,
     * h_info, h_cs and h_logits_io point into it. */
    bn_vk_buffer io;
    void *io_map;
    size_t io_info, io_cs, io_pick, io_logits; /* byte offsets of the parts after x */
    float *h_x, *h_cs, *h_logits_io;
    int32_t *h_info;
    uint32_t *h_pick; /* the screen's result (vk_head_screen.h) */
    int64_t *h_pos;
    int32_t *h_seq;

    uint64_t weight_bytes, head_bytes, norm_bytes, kv_bytes, scratch_bytes;
    uint64_t dispatches, uploads, upload_bytes, downloads, download_bytes;
    /* The decode step (one row of the flat cache) as recorded once and run
     * again every token: the same dispatches over the same buffers, only
     * their contents change (bn_vk_submit_keep). One for each end (its
     * logits, or a greedy step's screened head) and attention (exact, or
     * split from SPLIT_FROM on); NULL until first needed, or where it does
     * not fit one sequence. */
    bn_vk_kept *decode_step[2][2]; /* [pick][split] */
    uint64_t replays;              /* decode steps run from them */
    uint64_t picks, full_picks;    /* greedy picks; of them, by the full head */
    uint64_t split_steps;          /* decode steps with the split attention */
    bool split_pass; /* the pass being recorded was submitted in parts */
    bool split_attention; /* it is a decode step whose attention is split */
} vkb;

static vkb *vkb_of(const bn_backend *b) { return b->impl; }

/* ---- building ----------------------------------------------------------------- */

/* A device buffer of `bytes`, counted under *counter. */
static bn_status buffer(vkb *v, uint64_t bytes, bn_vk_buffer *out, uint64_t *counter,
                        bn_error *err)
{
    const bn_status st = bn_vk_buffer_create(v->vk, bytes ? bytes : 4, out, err);
    if (st == BN_OK)
        *counter += bytes;
    return st;
}

static bn_status upload(vkb *v, bn_vk_buffer *dst, const void *src, size_t n, bn_error *err)
{
    v->uploads++;
    v->upload_bytes += n;
    return bn_vk_write(v->vk, dst, src, n, err);
}

static bn_status upload_projections(vkb *v, bn_error *err)
{
    const bn_hparams *hp = &v->hp;
    v->proj = calloc((size_t)hp->n_layer * BN_PROJ_COUNT, sizeof *v->proj);
    if (!v->proj)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the Vulkan weights");
    /* Projections read by one product share a buffer, one after another
     * in the order of bn_proj: q, k and v (bn_vk_w2a8_record_qkv); the
     * gate and the up (bn_vk_w2a8_record_gate_up). A group's first holds
     * the buffer; the others keep their scale and shape, no buffer. */
    static const bn_proj group_first[BN_PROJ_COUNT] = {
        [BN_PROJ_Q] = BN_PROJ_Q,       [BN_PROJ_K] = BN_PROJ_Q,     [BN_PROJ_V] = BN_PROJ_Q,
        [BN_PROJ_O] = BN_PROJ_O,       [BN_PROJ_GATE] = BN_PROJ_GATE, [BN_PROJ_UP] = BN_PROJ_GATE,
        [BN_PROJ_DOWN] = BN_PROJ_DOWN};
    static const bool group_last[BN_PROJ_COUNT] = {
        [BN_PROJ_V] = true, [BN_PROJ_O] = true, [BN_PROJ_UP] = true, [BN_PROJ_DOWN] = true};
    size_t most = 0, most_packed = 0, group = 0; /* codes; a group's packed bytes */
    for (int p = 0; p < BN_PROJ_COUNT; p++) {
        int64_t n, k;
        bn_hparams_proj_shape(hp, (bn_proj)p, &n, &k);
        most = (size_t)(n * k) > most ? (size_t)(n * k) : most;
        group += (size_t)n * bn_vk_w2a8_words(k) * 4;
        if (group_last[p]) {
            most_packed = group > most_packed ? group : most_packed;
            group = 0;
        }
    }
    int8_t *codes = malloc(most);
    uint32_t *packed = malloc(most_packed);
    bn_status st = codes && packed ? BN_OK
                                   : bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                                                  "no memory to pack the Vulkan weights");
    for (int l = 0; l < hp->n_layer && st == BN_OK; l++) {
        size_t at = 0; /* words of the group packed so far */
        for (int p = 0; p < BN_PROJ_COUNT && st == BN_OK; p++) {
            vkb_proj *w = &v->proj[l * BN_PROJ_COUNT + p];
            bn_hparams_proj_shape(hp, (bn_proj)p, &w->n, &w->k);
            st = bn_checkpoint_projection_codes(v->model, l, (bn_proj)p, codes, &w->scale, err);
            if (st != BN_OK)
                break;
            bn_vk_w2a8_pack(codes, w->n, w->k, packed + at);
            at += (size_t)w->n * bn_vk_w2a8_words(w->k);
            if (!group_last[p])
                continue;
            vkb_proj *const first = &v->proj[l * BN_PROJ_COUNT + group_first[p]];
            st = buffer(v, at * 4, &first->w, &v->weight_bytes, err);
            if (st == BN_OK)
                st = upload(v, &first->w, packed, at * 4, err);
            at = 0;
        }
    }
    free(codes);
    free(packed);
    return st;
}

static bn_status upload_norms(vkb *v, bn_error *err)
{
    const bn_hparams *hp = &v->hp;
    v->norms = calloc((size_t)hp->n_layer * BN_NORM_COUNT, sizeof *v->norms);
    if (!v->norms)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the Vulkan norms");
    bn_status st = BN_OK;
    for (int l = 0; l < hp->n_layer && st == BN_OK; l++)
        for (int w = 0; w < BN_NORM_COUNT && st == BN_OK; w++) {
            const size_t bytes = (size_t)bn_hparams_norm_size(hp, (bn_norm)w) * sizeof(float);
            bn_vk_buffer *b = &v->norms[l * BN_NORM_COUNT + w];
            st = buffer(v, bytes, b, &v->norm_bytes, err);
            if (st == BN_OK)
                st = upload(v, b, bn_checkpoint_norm(v->model, l, (bn_norm)w), bytes, err);
        }
    const size_t bytes = (size_t)hp->dim * sizeof(float);
    if (st == BN_OK)
        st = buffer(v, bytes, &v->out_norm, &v->norm_bytes, err);
    if (st == BN_OK)
        st = upload(v, &v->out_norm, bn_checkpoint_output_norm(v->model), bytes, err);
    return st;
}

/* The head in parts of at most the bytes a kernel may bind: F16 rows as
 * the file has them (two to a word), anything else as F32 rows decoded by
 * the format's own dequantizer, the values the CPU's dot products use. */
static bn_status upload_head(vkb *v, bn_error *err)
{
    const bn_dense_matrix *h = bn_checkpoint_lm_head(v->model);
    const int64_t dim = h->cols, vocab = h->rows;
    v->head_type = h->type == BN_QTYPE_F16 && dim % 2 == 0 ? BN_VK_HEAD_F16 : BN_VK_HEAD_F32;
    const size_t row_bytes = v->head_type == BN_VK_HEAD_F16 ? (size_t)dim * 2 : (size_t)dim * 4;
    uint64_t limit = bn_vk_device(v->vk)->max_storage_buffer_range;
    if (limit == 0 || limit > ((uint64_t)1 << 30))
        limit = (uint64_t)1 << 30;
    int64_t per_part = (int64_t)(limit / row_bytes);
    if (per_part < 1)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: a head row of %zu bytes is more than %s binds", row_bytes,
                            bn_vk_device(v->vk)->name);
    if (per_part > vocab)
        per_part = vocab;
    v->n_head_parts = (int)((vocab + per_part - 1) / per_part);
    v->head = calloc((size_t)v->n_head_parts, sizeof *v->head);
    unsigned char *host = malloc((size_t)per_part * row_bytes);
    bn_status st = v->head && host ? BN_OK
                                   : bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                                                  "no memory for the Vulkan LM head");
    const bn_qtype_info *t = bn_qtype_get(h->type);
    for (int p = 0; p < v->n_head_parts && st == BN_OK; p++) {
        vkb_head_part *part = &v->head[p];
        part->first = (int64_t)p * per_part;
        part->n = vocab - part->first < per_part ? vocab - part->first : per_part;
        for (int64_t r = 0; r < part->n; r++) {
            const unsigned char *src =
                (const unsigned char *)h->data + (size_t)(part->first + r) * h->row_bytes;
            unsigned char *dst = host + (size_t)r * row_bytes;
            if (v->head_type == BN_VK_HEAD_F16 || h->type == BN_QTYPE_F32)
                memcpy(dst, src, row_bytes);
            else
                t->dequantize_row(src, (float *)dst, dim);
        }
        const size_t bytes = (size_t)part->n * row_bytes;
        st = buffer(v, bytes, &part->rows, &v->head_bytes, err);
        if (st == BN_OK)
            st = upload(v, &part->rows, host, bytes, err);
    }
    free(host);
    return st;
}

/* Head row r's values as the head's kernels compute with them (upload_head's
 * conversion: F16 exactly, other types by their dequantizer). */
static void head_row_values(void *model, int64_t r, float *out)
{
    const bn_dense_matrix *h = bn_checkpoint_lm_head(model);
    const unsigned char *src = (const unsigned char *)h->data + (size_t)r * h->row_bytes;
    if (h->type == BN_QTYPE_F32)
        memcpy(out, src, (size_t)h->cols * sizeof(float));
    else
        bn_qtype_get(h->type)->dequantize_row(src, out, h->cols);
}

/* The screened head for greedy steps, where the device and the head allow
 * it and BITNET_VULKAN_SCREEN is not 0. A device too small for the int8
 * copy, or one that cannot run its kernels (ten storage buffers a kernel),
 * leaves greedy steps to the full head. */
static bn_status make_screen(vkb *v, int threads, bn_error *err)
{
    bn_config cfg;
    if (bn_config_from_env(&cfg, NULL) == BN_OK && cfg.vulkan_no_screen)
        return BN_OK;
    const bn_dense_matrix *h = bn_checkpoint_lm_head(v->model);
    if (v->n_head_parts != 1 || !bn_vk_head_screen_fits(v->vk, h->cols))
        return BN_OK;
    const bn_status st = bn_vk_head_screen_create(v->vk, h->rows, h->cols, head_row_values,
                                                  (void *)v->model, threads, &v->screen, err);
    if (st == BN_ERR_GPU_OUT_OF_MEMORY || st == BN_ERR_UNSUPPORTED) {
        bn_error_clear(err);
        return BN_OK;
    }
    if (st == BN_OK)
        v->head_bytes += bn_vk_head_screen_bytes(v->screen);
    return st;
}

/* bytes rounded up to a multiple of 256. */
static size_t on_256(uint64_t bytes) { return (size_t)((bytes + 255) / 256 * 256); }

/* The pass's buffers, the KV cache and the attention's scratch. */
static bn_status make_buffers(vkb *v, bn_error *err)
{
    const bn_hparams *hp = &v->hp;
    const uint64_t R = VKB_CHUNK, f = sizeof(float);
    const int64_t widest = hp->ffn > hp->dim ? (hp->ffn > v->q_dim ? hp->ffn : v->q_dim)
                                             : (hp->dim > v->q_dim ? hp->dim : v->q_dim);
    const bn_vk_attn_shape shape = {hp->n_head, hp->n_head_kv, hp->head_dim, v->kv_len};
    const struct {
        bn_vk_buffer *b;
        uint64_t bytes;
    } list[] = {
        {&v->x, R * hp->dim * f},
        {&v->codes, R * bn_vk_w2a8_words(widest) * 16},
        {&v->scales, R * f},
        {&v->sums, R * sizeof(int32_t)},
        {&v->q, R * v->q_dim * f},
        {&v->att, R * v->q_dim * f},
        {&v->gate, R * hp->ffn * f},
        {&v->normed, R * hp->dim * f},
        {&v->logits, VKB_BATCH_CHUNK * hp->vocab * f}, /* the head's rows at most */
        {&v->scratch, R * hp->n_head * (uint64_t)v->kv_len * f},
        {&v->info, R * 2 * sizeof(int32_t)},
        {&v->tables, sizeof(int32_t)},
        {&v->cs, R * (hp->rope_dim > 0 ? hp->rope_dim : 1) * f},
        {&v->partials, bn_vk_attention_split_floats(&shape, 1, v->kv_len) * f},
        {&v->row_picks, R * sizeof(int32_t)},
    };
    bn_status st = BN_OK;
    for (size_t i = 0; i < sizeof list / sizeof list[0] && st == BN_OK; i++)
        st = buffer(v, list[i].bytes, list[i].b, &v->scratch_bytes, err);
    const int32_t block0 = 0; /* one sequence in one block of the whole cache */
    if (st == BN_OK)
        st = upload(v, &v->tables, &block0, sizeof block0, err);
    /* The split attention's counters (a decode row's heads) start at zero
     * (vk_ops.h); each dispatch leaves them so. */
    uint32_t *zero = calloc((size_t)hp->n_head, sizeof *zero);
    if (st == BN_OK)
        st = zero ? upload(v, &v->partials, zero, (size_t)hp->n_head * sizeof *zero, err)
                  : bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the Vulkan pass");
    free(zero);
    v->k_cache = calloc((size_t)hp->n_layer, sizeof *v->k_cache);
    v->v_cache = calloc((size_t)hp->n_layer, sizeof *v->v_cache);
    if (st == BN_OK && (!v->k_cache || !v->v_cache))
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the Vulkan cache");
    const uint64_t layer_bytes = (uint64_t)v->kv_len * (uint64_t)v->kv_dim * f;
    for (int l = 0; l < hp->n_layer && st == BN_OK; l++) {
        st = buffer(v, layer_bytes, &v->k_cache[l], &v->kv_bytes, err);
        if (st == BN_OK)
            st = buffer(v, layer_bytes, &v->v_cache[l], &v->kv_bytes, err);
    }
    v->flat = (vkb_cache){v->k_cache, v->v_cache, &v->tables, (int)v->kv_len, 1, v->kv_len};
    if (st == BN_OK && v->paged_rows > 0) {
        v->paged_max_blocks = (int)((v->kv_len + v->paged_block - 1) / v->paged_block);
        v->pk_cache = calloc((size_t)hp->n_layer, sizeof *v->pk_cache);
        v->pv_cache = calloc((size_t)hp->n_layer, sizeof *v->pv_cache);
        v->h_tables = malloc((size_t)v->paged_seqs * (size_t)v->paged_max_blocks * sizeof(int32_t));
        if (!v->pk_cache || !v->pv_cache || !v->h_tables)
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the paged cache");
        const uint64_t paged_bytes = (uint64_t)v->paged_rows * (uint64_t)v->kv_dim * f;
        for (int l = 0; l < hp->n_layer && st == BN_OK; l++) {
            st = buffer(v, paged_bytes, &v->pk_cache[l], &v->kv_bytes, err);
            if (st == BN_OK)
                st = buffer(v, paged_bytes, &v->pv_cache[l], &v->kv_bytes, err);
        }
        if (st == BN_OK)
            st = buffer(v, (uint64_t)v->paged_seqs * (uint64_t)v->paged_max_blocks * 4,
                        &v->ptables, &v->scratch_bytes, err);
        v->paged = (vkb_cache){v->pk_cache, v->pv_cache, &v->ptables, v->paged_block,
                               v->paged_max_blocks, v->paged_rows};
    }
    v->h_pos = malloc(R * sizeof(int64_t));
    v->h_seq = malloc(R * sizeof(int32_t));
    /* io: x, info, cs, logits, each part on 256 bytes. */
    v->io_info = on_256(R * hp->dim * f);
    v->io_cs = v->io_info + on_256(R * 2 * sizeof(int32_t));
    v->io_pick = v->io_cs + on_256(R * (hp->rope_dim > 0 ? hp->rope_dim : 1) * f);
    v->io_logits = v->io_pick + on_256(BN_VK_SCREEN_RESULT_BYTES);
    if (st == BN_OK)
        st = bn_vk_host_buffer_create(v->vk, v->io_logits + R * hp->vocab * f, &v->io,
                                      &v->io_map, err);
    if (st == BN_OK) {
        v->h_x = (float *)v->io_map;
        v->h_info = (int32_t *)((char *)v->io_map + v->io_info);
        v->h_cs = (float *)((char *)v->io_map + v->io_cs);
        v->h_logits_io = (float *)((char *)v->io_map + v->io_logits);
        v->h_pick = (uint32_t *)(void *)((char *)v->io_map + v->io_pick);
    }
    v->inv_freq = malloc((size_t)(hp->rope_dim / 2 + 1) * f);
    if (st == BN_OK && (!v->inv_freq || !v->h_pos || !v->h_seq))
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the Vulkan pass");
    if (st == BN_OK) /* as the CPU backend: 1 / theta^(2j / rope_dim) in fp32 */
        for (int j = 0; j < hp->rope_dim / 2; j++)
            v->inv_freq[j] = 1.0f / powf(hp->rope_theta, (float)(2 * j) / (float)hp->rope_dim);
    return st;
}

static void vkb_release(vkb *v)
{
    if (!v)
        return;
    const int layers = v->hp.n_layer;
    if (v->proj)
        for (int i = 0; i < layers * BN_PROJ_COUNT; i++)
            bn_vk_buffer_free(v->vk, &v->proj[i].w);
    if (v->norms)
        for (int i = 0; i < layers * BN_NORM_COUNT; i++)
            bn_vk_buffer_free(v->vk, &v->norms[i]);
    if (v->head)
        for (int p = 0; p < v->n_head_parts; p++)
            bn_vk_buffer_free(v->vk, &v->head[p].rows);
    for (int l = 0; l < layers; l++) {
        if (v->k_cache)
            bn_vk_buffer_free(v->vk, &v->k_cache[l]);
        if (v->v_cache)
            bn_vk_buffer_free(v->vk, &v->v_cache[l]);
        if (v->pk_cache)
            bn_vk_buffer_free(v->vk, &v->pk_cache[l]);
        if (v->pv_cache)
            bn_vk_buffer_free(v->vk, &v->pv_cache[l]);
    }
    bn_vk_buffer_free(v->vk, &v->ptables);
    for (int i = 0; i < 4; i++)
        bn_vk_kept_free(v->vk, v->decode_step[i / 2][i % 2]);
    bn_vk_head_screen_free(v->vk, v->screen);
    bn_vk_buffer *const pass[] = {&v->x,        &v->codes,    &v->scales, &v->sums,     &v->q,
                                  &v->att,      &v->gate,     &v->normed, &v->logits,   &v->scratch,
                                  &v->info,     &v->tables,   &v->cs,     &v->out_norm, &v->io,
                                  &v->partials, &v->row_picks};
    for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++)
        bn_vk_buffer_free(v->vk, pass[i]);
    if (v->ops)
        bn_vk_ops_free(v->vk, v->ops);
    if (v->w2a8)
        bn_vk_kernel_free(v->vk, v->w2a8);
    if (v->w2a8_rows)
        bn_vk_kernel_free(v->vk, v->w2a8_rows);
    if (v->w2a8_tiles)
        bn_vk_kernel_free(v->vk, v->w2a8_tiles);
    if (v->w2a8_normed)
        bn_vk_kernel_free(v->vk, v->w2a8_normed);
    if (v->norm)
        bn_vk_kernel_free(v->vk, v->norm);
    bn_vk_close(v->vk);
    free(v->proj);
    free(v->norms);
    free(v->head);
    free(v->k_cache);
    free(v->v_cache);
    free(v->pk_cache);
    free(v->pv_cache);
    free(v->h_tables);
    free(v->h_pos);
    free(v->h_seq);
    free(v->inv_freq);
    free(v);
}

/* The device auto and "vulkan" take: the first GPU (discrete first, then
 * integrated or virtual); -1 when there is none (a CPU driver such as
 * lavapipe runs slower than the CPU backend, so auto never takes it). */
static int vk_auto_device(void)
{
    bn_vulkan_device devs[BN_VULKAN_MAX_DEVICES];
    char why[256];
    const int n = bn_vk_devices(devs, BN_VULKAN_MAX_DEVICES, why, sizeof why);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            const bool discrete = strcmp(devs[i].type, "discrete") == 0;
            const bool gpu = discrete || strcmp(devs[i].type, "integrated") == 0 ||
                             strcmp(devs[i].type, "virtual") == 0;
            if (pass == 0 ? discrete : gpu)
                return i;
        }
    return -1;
}

static bn_status vk_create(const bn_checkpoint *model, const bn_backend_params *p,
                           bn_backend **out, bn_error *err)
{
    *out = NULL;
    const bn_hparams *hp = bn_checkpoint_hparams(model);
    int device = p->device;
    if (device < 0) {
        device = vk_auto_device();
        if (device < 0)
            device = 0; /* "vulkan" asked for explicitly: any device, lavapipe included */
    }
    if (p->kv != BN_KV_F32)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "use --kv f32 with --device vulkan",
                            "the Vulkan backend has an fp32 KV cache only");
    if (hp->n_head % hp->n_head_kv != 0 || hp->head_dim > 512)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: heads %d / %d of %d values are not supported", hp->n_head,
                            hp->n_head_kv, hp->head_dim);
    vkb *v = calloc(1, sizeof *v);
    bn_backend *b = calloc(1, sizeof *b);
    if (!v || !b) {
        free(v);
        free(b);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the Vulkan backend");
    }
    v->model = model;
    v->hp = *hp;
    v->device = device;
    v->kv_len = p->kv_len > 0 ? p->kv_len : hp->n_ctx_train;
    if (p->paged_rows > 0 && p->paged_block > 0 && p->paged_max_seqs > 0 &&
        p->paged_rows % p->paged_block == 0) {
        v->paged_rows = p->paged_rows;
        v->paged_block = p->paged_block;
        v->paged_seqs = p->paged_max_seqs;
    }
    v->q_dim = (int64_t)hp->n_head * hp->head_dim;
    v->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    bn_status st = bn_vk_open(device, &v->vk, err);
    if (st == BN_OK)
        /* the exact division where the device has fp64, integer dot
         * products where it has those and subgroup arithmetic
         * (BITNET_VULKAN_DOT=0: not) */
        st = bn_vk_w2a8_kernel(v->vk, bn_vk_device(v->vk)->fp64, bn_vk_w2a8_dot_fits(v->vk),
                               &v->w2a8, err);
    if (st == BN_OK && bn_vk_w2a8_rows_kernel_fits(v->vk)) { /* the products of many rows */
        st = bn_vk_w2a8_rows_kernel(v->vk, &v->w2a8_rows, err);
        if (st == BN_OK) /* the matrix kernel unless BITNET_VULKAN_MATRIX=0 */
            st = bn_vk_w2a8_matrix_fits(v->vk)
                     ? bn_vk_w2a8_matrix_kernel(v->vk, &v->w2a8_tiles, err)
                     : bn_vk_w2a8_tiles_kernel(v->vk, &v->w2a8_tiles, err);
    }
    /* The products that norm their own input on GPUs: a CPU device (lavapipe)
     * runs a few workgroups at a time, and every one of them norming the
     * row is only more work there (test_vulkan_norm checks the kernel on
     * any device). */
    if (st == BN_OK && bn_vk_w2a8_normed_fits(v->vk) &&
        strcmp(bn_vk_device(v->vk)->type, "cpu") != 0)
        st = bn_vk_w2a8_normed_kernel(v->vk, &v->w2a8_normed, err);
    if (st == BN_OK)
        st = bn_vk_norm_kernel(v->vk, bn_vk_norm_subgroups(v->vk), &v->norm, err);
    if (st == BN_OK)
        st = bn_vk_ops_create(v->vk, &v->ops, err);
    if (st == BN_OK)
        st = make_buffers(v, err);
    if (st == BN_OK)
        st = upload_projections(v, err);
    if (st == BN_OK)
        st = upload_norms(v, err);
    if (st == BN_OK)
        st = upload_head(v, err);
    if (st == BN_OK)
        st = make_screen(v, p->threads, err);
    if (st != BN_OK) {
        vkb_release(v);
        free(b);
        return st;
    }
    b->ops = &bn_vulkan_backend_ops;
    b->impl = v;
    *out = b;
    return BN_OK;
}

static void vk_free(bn_backend *b)
{
    if (!b)
        return;
    vkb_release(vkb_of(b));
    free(b);
}

/* ---- the pass ----------------------------------------------------------------- */

static bn_status record_norm(vkb *v, bn_vk_buffer *x, bn_vk_buffer *w, int64_t M, int64_t n,
                             bn_error *err)
{
    return bn_vk_norm_record(v->vk, v->norm, x, w, &v->codes, &v->scales, &v->sums, M, n,
                             v->hp.rms_eps, err);
}

/* The W2A8 kernel for a pass of M rows. */
static bn_vk_kernel *w2a8_for(vkb *v, int64_t M)
{
    if (v->w2a8_tiles && M >= TILES_KERNEL_MIN) {
        v->tiles_ran = true;
        return v->w2a8_tiles;
    }
    return v->w2a8_rows && M >= ROWS_KERNEL_MIN ? v->w2a8_rows : v->w2a8;
}

static bn_status record_proj(vkb *v, int layer, bn_proj p, bn_vk_buffer *y,
                             bn_vk_w2a8_epilogue epilogue, int64_t M, bn_error *err)
{
    vkb_proj *w = &v->proj[layer * BN_PROJ_COUNT + p];
    return bn_vk_w2a8_record_rows(v->vk, w2a8_for(v, M), &w->w, &v->codes, &v->scales, 0, M, y,
                                  w->n, w->k, w->scale, epilogue, err);
}

#define TRY(call)                                                                          \
    do {                                                                                   \
        const bn_status try_st_ = (call);                                                  \
        if (try_st_ != BN_OK)                                                              \
            return try_st_;                                                                \
    } while (0)

/* Whether a pass of M rows runs q|k|v, Wo and down as products that norm
 * their own input (vk_w2a8.h, bn_vk_w2a8_record_normed and _qkv_normed)
 * instead of a norm dispatch before each: a pass of one row (a decode
 * step) whose rows fit the kernel, on a GPU (vk_create). (The gate and up
 * pair normed so took longer than the two dispatches: its 6912 x 2 outputs
 * are too many for one wave of workgroups that each norm the row;
 * docs/VULKAN.md, "Speed".) */
static bool normed_for(const vkb *v, int64_t M)
{
    return v->w2a8_normed && M == 1 && v->hp.dim <= BN_VK_NORMED_MAX_K &&
           v->q_dim <= BN_VK_NORMED_MAX_K && v->hp.ffn <= BN_VK_NORMED_MAX_K;
}

/* Projection p of the layer over the one row in, normed with w first (the
 * normed kernel), through the epilogue into y. */
static bn_status record_normed(vkb *v, int layer, bn_proj p, bn_vk_buffer *in, bn_vk_buffer *w,
                               bn_vk_buffer *y, bn_vk_w2a8_epilogue epilogue, bn_error *err)
{
    vkb_proj *pw = &v->proj[layer * BN_PROJ_COUNT + p];
    return bn_vk_w2a8_record_normed(v->vk, v->w2a8_normed, &pw->w, in, w, v->hp.rms_eps, y, pw->n,
                                    pw->k, pw->scale, epilogue, err);
}

/* One layer over the pass's M rows (cpu_backend.c: attention_block, ffn_block).
 * With normed products (normed_for) q|k|v, Wo and down norm their own
 * input: six dispatches a layer instead of nine. */
static bn_status record_layer(vkb *v, const vkb_cache *c, int l, int64_t M, bn_error *err)
{
    const bn_hparams *hp = &v->hp;
    bn_vk_buffer *norms = &v->norms[l * BN_NORM_COUNT];
    const bn_vk_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, c->rows};
    const bn_vk_rows rows = {&v->info, c->tables, M, c->block_size, c->max_blocks};
    const bool normed = normed_for(v, M);
    v->normed_ran |= normed;
    /* q, k and v in one product: q turned by RoPE into v->q, k (turned)
     * and v into the cache. */
    vkb_proj *qp = &v->proj[l * BN_PROJ_COUNT + BN_PROJ_Q];
    const bn_vk_qkv qkv = {hp->n_head,   hp->n_head_kv, hp->head_dim,   hp->rope_dim,
                           qp->scale,    qp[BN_PROJ_K - BN_PROJ_Q].scale,
                           qp[BN_PROJ_V - BN_PROJ_Q].scale,
                           &v->info,     c->tables,     &v->cs,         &c->k[l],
                           &c->v[l],     c->block_size, c->max_blocks,  c->rows,
                           0};
    if (normed) {
        TRY(bn_vk_w2a8_record_qkv_normed(v->vk, v->w2a8_normed, &qp->w, &v->x, &norms[BN_NORM_ATTN],
                                         hp->rms_eps, &v->q, qp->k, &qkv, err));
    } else {
        TRY(record_norm(v, &v->x, &norms[BN_NORM_ATTN], M, hp->dim, err));
        TRY(bn_vk_w2a8_record_qkv(v->vk, w2a8_for(v, M), &qp->w, &v->codes, &v->scales, 0, M, &v->q,
                                  qp->k, &qkv, err));
    }
    if (v->split_attention) /* one row: its positions over many workgroups */
        TRY(bn_vk_attention_split_record(v->vk, v->ops, &as, &rows, &v->q, &c->k[l], &c->v[l], 0,
                                         &v->partials, v->kv_len, &v->att, err));
    else
        TRY(bn_vk_attention_record(v->vk, v->ops, &as, &rows, &v->q, &c->k[l], &c->v[l], 0,
                                   &v->scratch, v->kv_len, &v->att, err));
    /* x += Wo a and, below, x += Wdown h: the residual adds in the
     * products' epilogues; h = relu2(gate) up from one product of both. */
    if (normed) {
        TRY(record_normed(v, l, BN_PROJ_O, &v->att, &norms[BN_NORM_ATTN_SUB], &v->x, BN_VK_W2A8_ADD,
                          err));
    } else {
        TRY(record_norm(v, &v->att, &norms[BN_NORM_ATTN_SUB], M, v->q_dim, err));
        TRY(record_proj(v, l, BN_PROJ_O, &v->x, BN_VK_W2A8_ADD, M, err));
    }
    TRY(record_norm(v, &v->x, &norms[BN_NORM_FFN], M, hp->dim, err));
    vkb_proj *gate = &v->proj[l * BN_PROJ_COUNT + BN_PROJ_GATE];
    TRY(bn_vk_w2a8_record_gate_up(v->vk, w2a8_for(v, M), &gate->w, &v->codes, &v->scales, 0, M,
                                  &v->gate, gate->n, gate->k, gate->scale,
                                  gate[BN_PROJ_UP - BN_PROJ_GATE].scale, err));
    if (normed)
        return record_normed(v, l, BN_PROJ_DOWN, &v->gate, &norms[BN_NORM_FFN_SUB], &v->x,
                             BN_VK_W2A8_ADD, err);
    TRY(record_norm(v, &v->gate, &norms[BN_NORM_FFN_SUB], M, hp->ffn, err));
    return record_proj(v, l, BN_PROJ_DOWN, &v->x, BN_VK_W2A8_ADD, M, err);
}

/* Dispatches a layer records (record_layer): nine; with normed products
 * three fewer. */
#define LAYER_DISPATCHES 9
static int layer_dispatches(const vkb *v, int64_t M) { return 9 - (normed_for(v, M) ? 3 : 0); }

/* Submits the open sequence when `need` more dispatches would not fit it. */
static bn_status make_room(vkb *v, int need, bn_error *err)
{
    const int recorded = bn_vk_recorded(v->vk);
    if (recorded + need <= BN_VK_MAX_DISPATCHES)
        return BN_OK;
    v->split_pass = true;
    v->dispatches += (uint64_t)recorded;
    TRY(bn_vk_submit(v->vk, err));
    return bn_vk_begin(v->vk, err);
}

/* The pass's inputs, written into io by the host, to the device buffers
 * (recorded first in its sequence). */
static bn_status record_inputs(vkb *v, int64_t M, bn_error *err)
{
    const bn_hparams *hp = &v->hp;
    const size_t x = (size_t)(M * hp->dim) * sizeof(float), info = (size_t)M * 2 * sizeof(int32_t),
                 cs = (size_t)(M * hp->rope_dim) * sizeof(float);
    TRY(bn_vk_copy_record(v->vk, &v->io, 0, &v->x, 0, x, err));
    TRY(bn_vk_copy_record(v->vk, &v->io, v->io_info, &v->info, 0, info, err));
    return bn_vk_copy_record(v->vk, &v->io, v->io_cs, &v->cs, 0, cs, err);
}

/* What a pass ends with: nothing (rows before a request's last), the
 * logits, a greedy step's screened head (vk_head_screen.h), or the greedy
 * tokens of logit rows (forward_rows_pick). */
typedef enum { PASS_NO_HEAD, PASS_LOGITS, PASS_PICK, PASS_ROWS_PICK } pass_end;

/* The copies a pass of M rows makes (record_inputs, and what `end` copies
 * back of its ln logit rows), in the report's transfer counts, recorded or
 * replayed. */
static void count_transfers(vkb *v, int64_t M, pass_end end, int64_t ln)
{
    const bn_hparams *hp = &v->hp;
    v->uploads += hp->rope_dim > 0 ? 3 : 2;
    v->upload_bytes += (uint64_t)M * ((uint64_t)(hp->dim + hp->rope_dim) * sizeof(float) +
                                      2 * sizeof(int32_t));
    const uint64_t down = end == PASS_LOGITS ? (uint64_t)ln * (uint64_t)hp->vocab * sizeof(float)
                          : end == PASS_PICK ? BN_VK_SCREEN_RESULT_BYTES
                          : end == PASS_ROWS_PICK ? (uint64_t)ln * sizeof(int32_t)
                                                  : 0;
    if (down > 0) {
        v->downloads++;
        v->download_bytes += down;
    }
}

/* Records the output norm of the pass's M rows and what `end` asks for:
 * the head's logits of every row into v->logits and rows lfirst .. lfirst
 * + ln - 1 of those (or their greedy tokens) copied into io, or the
 * screen's result copied there. */
static bn_status record_head(vkb *v, int64_t M, pass_end end, int64_t lfirst, int64_t ln,
                             bn_error *err)
{
    const bn_hparams *hp = &v->hp;
    TRY(make_room(v, 3 + (end == PASS_PICK ? BN_VK_SCREEN_DISPATCHES : v->n_head_parts), err));
    TRY(bn_vk_rmsnorm_record(v->vk, v->ops, &v->x, &v->out_norm, &v->normed, M, hp->dim,
                             hp->rms_eps, err));
    if (end == PASS_PICK)
        return bn_vk_head_screen_record(v->vk, v->screen, &v->head[0].rows, v->head_type,
                                        &v->normed, &v->io, v->io_pick, err);
    for (int p = 0; p < v->n_head_parts; p++)
        TRY(bn_vk_head_record(v->vk, v->ops, &v->head[p].rows, v->head_type, v->head[p].first,
                              v->head[p].n, hp->dim, &v->normed, M, &v->logits, hp->vocab, err));
    if (end == PASS_ROWS_PICK) {
        TRY(bn_vk_argmax_record(v->vk, v->ops, &v->logits, lfirst, ln, hp->vocab, &v->row_picks,
                                err));
        return bn_vk_copy_record(v->vk, &v->row_picks, 0, &v->io, v->io_pick,
                                 (size_t)ln * sizeof(int32_t), err);
    }
    const size_t row = (size_t)hp->vocab * sizeof(float);
    if (ln > 0)
        TRY(bn_vk_copy_record(v->vk, &v->logits, (size_t)lfirst * row, &v->io, v->io_logits,
                              (size_t)ln * row, err));
    return BN_OK;
}

/* Rows tokens[0 .. M) of sequences seq[] at positions pos[] through cache
 * c, ending as `end` says (record_head). One submission: the inputs go
 * through io too. A decode step (decode: one row of the flat cache with
 * its logits or its pick) runs as a kept v->decode_step once there is one
 * for its end and attention: the dispatches and copies never change, only
 * io's inputs. */
static bn_status run_pass(vkb *v, const vkb_cache *c, const int32_t *tokens, const int64_t *pos,
                          const int32_t *seq, int64_t M, pass_end end, int64_t lfirst, int64_t ln,
                          bool decode, bn_error *err)
{
    const bn_hparams *hp = &v->hp;
    const int half = hp->rope_dim / 2;
    for (int64_t i = 0; i < M; i++) {
        TRY(bn_checkpoint_embedding_row(v->model, tokens[i], v->h_x + i * hp->dim, err));
        v->h_info[2 * i] = seq[i];
        v->h_info[2 * i + 1] = (int32_t)pos[i];
        for (int j = 0; j < half; j++) { /* as run_rows: (float)pos * inv_freq */
            const float angle = (float)pos[i] * v->inv_freq[j];
            v->h_cs[i * hp->rope_dim + j] = cosf(angle);
            v->h_cs[i * hp->rope_dim + half + j] = sinf(angle);
        }
    }
    const bool keep = decode && !bn_vk_profiling(v->vk); /* timed steps are recorded */
    const bool split = decode && pos[0] >= SPLIT_FROM;
    bn_vk_kept **kept = &v->decode_step[end == PASS_PICK][split];
    v->split_steps += split;
    count_transfers(v, M, end, ln);
    if (keep && *kept) {
        TRY(bn_vk_replay(v->vk, *kept, err));
        v->replays++;
        v->dispatches += (uint64_t)bn_vk_recorded(v->vk);
        return BN_OK;
    }
    TRY(bn_vk_begin(v->vk, err));
    v->split_pass = false;
    v->split_attention = split;
    bn_status st = record_inputs(v, M, err);
    for (int l = 0; l < hp->n_layer && st == BN_OK; l++) {
        st = make_room(v, LAYER_DISPATCHES, err);
        if (st == BN_OK)
            st = record_layer(v, c, l, M, err);
    }
    if (st == BN_OK && end != PASS_NO_HEAD)
        st = record_head(v, M, end, lfirst, ln, err);
    /* The sequence is closed whatever happened, so the device is usable. */
    bn_error closing;
    const int recorded = bn_vk_recorded(v->vk);
    const bn_status ran = st == BN_OK && keep && !v->split_pass
                              ? bn_vk_submit_keep(v->vk, kept, err)
                              : bn_vk_submit(v->vk, st == BN_OK ? err : &closing);
    v->dispatches += (uint64_t)recorded;
    return st != BN_OK ? st : ran;
}

/* Rows first .. first + n of the logit rows the last pass copied into io
 * (run_pass's lfirst .. lfirst + ln - 1) into out. */
static void read_logits(vkb *v, int64_t first, int64_t n, float *out)
{
    memcpy(out, v->h_logits_io + first * v->hp.vocab, (size_t)(n * v->hp.vocab) * sizeof(float));
}

/* The greedy token of the row the last pass normed (v->normed's first),
 * from the full head: one more submission, when the screen listed more
 * candidates than it holds. */
static bn_status full_head_pick(vkb *v, int32_t *next, bn_error *err)
{
    const bn_hparams *hp = &v->hp;
    TRY(bn_vk_begin(v->vk, err));
    bn_status st = BN_OK;
    for (int p = 0; p < v->n_head_parts && st == BN_OK; p++)
        st = bn_vk_head_record(v->vk, v->ops, &v->head[p].rows, v->head_type, v->head[p].first,
                               v->head[p].n, hp->dim, &v->normed, 1, &v->logits, hp->vocab, err);
    if (st == BN_OK)
        st = bn_vk_copy_record(v->vk, &v->logits, 0, &v->io, v->io_logits,
                               (size_t)hp->vocab * sizeof(float), err);
    bn_error closing;
    v->dispatches += (uint64_t)bn_vk_recorded(v->vk);
    const bn_status ran = bn_vk_submit(v->vk, st == BN_OK ? err : &closing);
    if (st != BN_OK || ran != BN_OK)
        return st != BN_OK ? st : ran;
    count_transfers(v, 0, PASS_LOGITS, 1);
    v->full_picks++;
    *next = bn_vk_greedy_pick(v->h_logits_io, NULL, hp->vocab);
    return BN_OK;
}

/* One sequence's rows tokens[0 .. M) at positions pos .. pos + M - 1 in the
 * flat cache, ending as `end` says (M must be 1 unless PASS_NO_HEAD): the
 * row's logits into logits (PASS_LOGITS) or its greedy token into *next
 * (PASS_PICK). */
static bn_status run_flat(vkb *v, const int32_t *tokens, int64_t M, int64_t pos, pass_end end,
                          float *logits, int32_t *next, bn_error *err)
{
    for (int64_t i = 0; i < M; i++) {
        v->h_pos[i] = pos + i;
        v->h_seq[i] = 0;
    }
    const bool head = end != PASS_NO_HEAD;
    TRY(run_pass(v, &v->flat, tokens, v->h_pos, v->h_seq, M, end, M - 1, head ? 1 : 0,
                 M == 1 && head, err));
    if (end == PASS_LOGITS)
        read_logits(v, 0, 1, logits);
    if (end != PASS_PICK)
        return BN_OK;
    v->picks++;
    if (bn_vk_head_screen_pick(v->h_pick, next))
        return BN_OK;
    return full_head_pick(v, next, err);
}

static bn_status check_tokens(const vkb *v, const int32_t *tokens, int64_t n, bn_error *err)
{
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= v->hp.vocab)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                "token ids must come from this model's vocabulary",
                                "token %lld is %d, outside the vocabulary (0..%d)", (long long)i,
                                (int)tokens[i], (int)v->hp.vocab - 1);
    return BN_OK;
}

/* tokens[0 .. n) at positions pos .. pos + n - 1 of the flat cache, the
 * last row ending as `end` says (run_flat). */
static bn_status forward_flat(vkb *v, const int32_t *tokens, int64_t n, int64_t pos, pass_end end,
                              float *logits, int32_t *next, bn_error *err)
{
    if (n > v->kv_len - pos)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "start a new context or open the model with a longer context",
                            "positions %lld..%lld do not fit a KV cache of %lld positions",
                            (long long)pos, (long long)(pos + n - 1), (long long)v->kv_len);
    if (pos > v->kv_filled)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "run the earlier positions first",
                            "position %lld would skip positions: only %lld are computed",
                            (long long)pos, (long long)v->kv_filled);
    bn_status st = check_tokens(v, tokens, n, err);
    if (st != BN_OK)
        return st;
    v->kv_filled = pos;
    /* Chunks of the rows before the last; the last row alone, with the head. */
    for (int64_t c = 0; c < n - 1 && st == BN_OK; c += VKB_CHUNK) {
        const int64_t M = n - 1 - c < VKB_CHUNK ? n - 1 - c : VKB_CHUNK;
        st = run_flat(v, tokens + c, M, pos + c, PASS_NO_HEAD, NULL, NULL, err);
        if (st == BN_OK)
            v->kv_filled = pos + c + M;
    }
    if (st == BN_OK)
        st = run_flat(v, tokens + n - 1, 1, pos + n - 1, end, logits, next, err);
    if (st == BN_OK)
        v->kv_filled = pos + n;
    return st;
}

static bn_status vk_forward(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                            float *logits, bn_error *err)
{
    if (!tokens || !logits || n <= 0 || pos < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "vulkan forward: need tokens, logits, n > 0 and pos >= 0");
    return forward_flat(vkb_of(b), tokens, n, pos, PASS_LOGITS, logits, NULL, err);
}

/* Greedy picks through the screened head; sampled ones need every logit,
 * on the host. */
static bool vk_pick_supported(const bn_backend *b, const bn_pick_params *p)
{
    return vkb_of(b)->screen && !(p->temperature > 0.0f);
}

static bn_status vk_forward_pick(bn_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                                 const bn_pick_params *p, double u, int32_t *next, bn_error *err)
{
    (void)u;
    if (!tokens || !next || !p || n <= 0 || pos < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "vulkan forward_pick: need tokens, parameters, n > 0 and pos >= 0");
    if (!vk_pick_supported(b, p))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "the Vulkan backend picks greedy tokens only (temperature <= 0), "
                            "through its screened head");
    return forward_flat(vkb_of(b), tokens, n, pos, PASS_PICK, NULL, next, err);
}

/* Rows of many sequences over the paged cache (batch_rows.h), in chunks of
 * VKB_BATCH_CHUNK rows; the logit rows' logits into logits, vocab floats each,
 * or (logits NULL) their greedy tokens into picks. */
static bn_status run_rows(vkb *v, const bn_batch_rows *r, float *logits, int32_t *picks,
                          bn_error *err)
{
    const bn_hparams *hp = &v->hp;
    if (!r || r->n_rows <= 0 || !r->tokens || !r->pos || !r->seq || !r->tables || !r->table_len ||
        r->block_size != v->paged_block || v->paged_rows == 0 || r->n_logits < 0 ||
        (r->n_logits > 0 && (!r->logit_rows || (!logits && !picks))))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "vulkan forward_rows: rows, positions, sequences, block tables of "
                            "blocks of %d and a paged cache are needed",
                            v->paged_block);
    bn_status st = check_tokens(v, r->tokens, r->n_rows, err);
    if (st == BN_OK)
        st = bn_batch_rows_check(r, v->kv_len, v->paged_rows / v->paged_block, v->paged_seqs,
                                 v->paged_max_blocks, "vulkan", err);
    if (st != BN_OK)
        return st;
    /* The block tables of the sequences the rows name (-1: no block). */
    const int mb = v->paged_max_blocks;
    for (int64_t i = 0; i < (int64_t)v->paged_seqs * mb; i++)
        v->h_tables[i] = -1;
    for (int64_t i = 0; i < r->n_rows; i++) {
        const int32_t sq = r->seq[i];
        const int32_t n = r->table_len[sq] < mb ? r->table_len[sq] : mb;
        memcpy(v->h_tables + (int64_t)sq * mb, r->tables[sq], (size_t)n * sizeof(int32_t));
    }
    st = upload(v, &v->ptables, v->h_tables,
                          (size_t)v->paged_seqs * (size_t)mb * sizeof(int32_t), err);
    const pass_end end = logits ? PASS_LOGITS : PASS_ROWS_PICK;
    int64_t next = 0;
    for (int64_t c = 0; c < r->n_rows && st == BN_OK; c += VKB_BATCH_CHUNK) {
        const int64_t M = r->n_rows - c < VKB_BATCH_CHUNK ? r->n_rows - c : VKB_BATCH_CHUNK;
        const bool wanted = next < r->n_logits && r->logit_rows[next] < c + M;
        /* The chunk's logit rows: the span from the first to the last read
         * back at once, the wanted ones copied out. */
        int64_t last = next;
        while (wanted && last + 1 < r->n_logits && r->logit_rows[last + 1] < c + M)
            last++;
        const int64_t r0 = wanted ? r->logit_rows[next] - c : 0,
                      r1 = wanted ? r->logit_rows[last] - c : -1;
        st = run_pass(v, &v->paged, r->tokens + c, r->pos + c, r->seq + c, M,
                      wanted ? end : PASS_NO_HEAD, r0, r1 - r0 + 1, false, err);
        for (; st == BN_OK && wanted && next <= last; next++) {
            const int64_t at = r->logit_rows[next] - c - r0;
            if (logits)
                read_logits(v, at, 1, logits + next * hp->vocab);
            else
                picks[next] = (int32_t)v->h_pick[at];
        }
    }
    return st;
}

static bn_status vk_forward_rows(bn_backend *b, const bn_batch_rows *r, float *logits,
                                 bn_error *err)
{
    return run_rows(vkb_of(b), r, logits, NULL, err);
}

/* Greedy tokens of the logit rows, picked on the device from the full
 * head's logits (bn_vk_argmax_record): only the tokens come back. */
static bn_status vk_forward_rows_pick(bn_backend *b, const bn_batch_rows *r,
                                      const bn_pick_params *picks, const double *u, int32_t *next,
                                      bn_error *err)
{
    (void)u;
    if (!r || (r->n_logits > 0 && (!picks || !next)))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "vulkan forward_rows_pick: rows, their pick parameters and room for "
                            "the tokens are needed");
    for (int64_t k = 0; k < r->n_logits; k++)
        if (!vk_pick_supported(b, &picks[k]))
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "the Vulkan backend picks greedy tokens only (temperature <= 0)");
    return run_rows(vkb_of(b), r, NULL, next, err);
}

static int64_t vk_kv_len(const bn_backend *b) { return vkb_of(b)->kv_len; }
static int64_t vk_kv_filled(const bn_backend *b) { return vkb_of(b)->kv_filled; }
static void vk_reset(bn_backend *b) { vkb_of(b)->kv_filled = 0; }

static void vk_describe(const bn_backend *b, bn_backend_desc *d)
{
    const vkb *v = vkb_of(b);
    const bn_vulkan_device *dev = bn_vk_device(v->vk);
    snprintf(d->selected, sizeof d->selected, "vulkan:%d", v->device);
    snprintf(d->kernel, sizeof d->kernel, "vulkan");
    d->threads = 0;
    d->batches = v->paged_rows > 0;
    snprintf(d->details, sizeof d->details, "%s (%s), kv f32, head %s%s, %s kernels", dev->name,
             dev->type, v->head_type == BN_VK_HEAD_F16 ? "f16" : "f32",
             v->screen ? " (greedy steps screened)" : "",
             dev->fp64 ? "exact (fp64)" : "float (no fp64)");
}

static void vk_report(const bn_backend *b, bn_engine_info *info)
{
    const vkb *v = vkb_of(b);
    const bn_vulkan_device *dev = bn_vk_device(v->vk);
    info->gpu = true;
    info->gpu_device = v->device;
    info->gpu_name = dev->name;
    info->cuda_graphs = false;
    info->kv_type = "f32";
    info->gpu_weights_bytes = v->weight_bytes;
    info->gpu_lm_head_bytes = v->head_bytes;
    info->gpu_norms_bytes = v->norm_bytes;
    info->gpu_kv_bytes = v->kv_bytes;
    info->gpu_scratch_bytes = v->scratch_bytes;
    info->gpu_total_bytes =
        v->weight_bytes + v->head_bytes + v->norm_bytes + v->kv_bytes + v->scratch_bytes;
    info->gpu_peak_bytes = info->gpu_total_bytes;
    info->gpu_device_total_bytes = dev->device_local_bytes;
    info->gpu_kernel_launches = v->dispatches;
    info->gpu_h2d_transfers = v->uploads;
    info->gpu_h2d_bytes = v->upload_bytes;
    info->gpu_d2h_transfers = v->downloads;
    info->gpu_d2h_bytes = v->download_bytes;
    info->backend_weight_bytes = v->weight_bytes + v->head_bytes + v->norm_bytes;
    info->backend_kv_bytes = v->kv_bytes;
    info->backend_scratch_bytes = v->scratch_bytes;
    info->backend_total_bytes = info->gpu_total_bytes;
    snprintf(
        info->kernels, sizeof info->kernels,
        "vulkan_w2a8%s,vulkan_w2a8_qkv_rope,vulkan_norm_quantize,vulkan_attention,"
        "vulkan_rmsnorm,vulkan_head_%s%s%s%s%s%s%s",
        bn_vk_w2a8_dot_fits(v->vk) ? "_dot" : "", v->head_type == BN_VK_HEAD_F16 ? "f16" : "f32",
        v->picks > v->full_picks ? ",vulkan_head_screen" : "",
        v->split_steps > 0 ? ",vulkan_attention_split" : "",
        v->replays > 0 ? ",vulkan_decode_replay" : "", v->normed_ran ? ",vulkan_w2a8_normed" : "",
        /* the tiled kernel by its name: w2a8_tiles or w2a8_matrix */
        v->tiles_ran ? ",vulkan_" : "", v->tiles_ran ? bn_vk_kernel_name(v->w2a8_tiles) : "");
}

const bn_backend_ops bn_vulkan_backend_ops = {
    .name = "vulkan",
    .auto_device = vk_auto_device,
    .create = vk_create,
    .free = vk_free,
    .forward = vk_forward,
    .forward_all = NULL,
    .kv_len = vk_kv_len,
    .forward_rows = vk_forward_rows,
    .forward_rows_pick = vk_forward_rows_pick,
    .kv_filled = vk_kv_filled,
    .reset = vk_reset,
    .describe = vk_describe,
    .report = vk_report,
    .pick_supported = vk_pick_supported,
    .forward_pick = vk_forward_pick,
};

bn_status bn_vk_backend_profile_pass(void *backend, const int32_t *tokens, int64_t n, int64_t pos,
                                     bn_vk_pass_profile *out, bn_error *err)
{
    vkb *v = backend;
    memset(out, 0, sizeof *out);
    if (!v || !tokens || n < 1 || n > VKB_CHUNK || pos < 0 || pos > v->kv_filled ||
        n > v->kv_len - pos)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "vulkan profile: %lld rows at position %lld are not one pass",
                            (long long)n, (long long)pos);
    bn_status st = check_tokens(v, tokens, n, err);
    if (st != BN_OK)
        return st;
    float *logits = malloc((size_t)v->hp.vocab * sizeof *logits);
    if (!logits)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the logits");
    st = bn_vk_profile(v->vk, true, err);
    int32_t next; /* a greedy step's, as bench e2e decodes, where the head is screened */
    const pass_end end = n > 1 ? PASS_NO_HEAD : v->screen ? PASS_PICK : PASS_LOGITS;
    if (st == BN_OK)
        st = run_flat(v, tokens, n, pos, end, logits, &next, err);
    const char *names[BN_VK_MAX_DISPATCHES];
    double us[BN_VK_MAX_DISPATCHES];
    const int ran =
        st == BN_OK ? bn_vk_profile_read(v->vk, names, us, BN_VK_MAX_DISPATCHES, err) : -1;
    if (st == BN_OK && ran < 0)
        st = err->status;
    const int per_layer = layer_dispatches(v, n); /* the pass's, as recorded */
    if (ran >= 2 * per_layer && per_layer <= BN_VK_PROFILE_KERNELS)
        for (int i = 0; i < per_layer; i++) {
            snprintf(out->layer_names[i], sizeof out->layer_names[0], "%s", names[per_layer + i]);
            out->layer_us[i] = us[per_layer + i];
            out->layer_n++;
        }
    for (int i = 0; i < ran; i++) { /* totals by kernel, in order of first run */
        int k = 0;
        while (k < out->n && strcmp(out->names[k], names[i]) != 0)
            k++;
        if (k == out->n && out->n < BN_VK_PROFILE_KERNELS)
            snprintf(out->names[out->n++], sizeof out->names[0], "%s", names[i]);
        if (k < out->n) {
            out->us[k] += us[i];
            out->dispatches[k]++;
        }
        out->total_us += us[i];
    }
    bn_error off;
    (void)bn_vk_profile(v->vk, false, &off);
    if (st == BN_OK)
        v->kv_filled = pos + n;
    free(logits);
    return st;
}
