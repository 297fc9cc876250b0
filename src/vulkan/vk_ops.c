/* vk_ops.c - launching the forward pass's other kernels
 * (shaders/attention*.comp, rmsnorm*.comp, head_matvec*.comp): sizes
 * checked against the buffers, the workgroups laid out by
 * bn_vk_dispatch_groups. The attention and the RMSNorm
 * take their fp64 variants (the CPU's arithmetic bit for bit) where the
 * device has fp64, else their float ones; the split attention's fp64
 * variant its workgroup reductions by subgroup operations where the
 * device has subgroup arithmetic (H200: decode 394.4-402.2 tok/s against
 * 391.3-395.3 by shared-memory trees at 128-1000-token prompts, 324.2
 * against 311.7 at 4000). */
#include "vk_ops.h"

#include <math.h>
#include <stdlib.h>

extern const unsigned char bn_vk_spv_attention[], bn_vk_spv_attention_split[],
    bn_vk_spv_attention_split_f64[], bn_vk_spv_attention_split_f64_sg[], bn_vk_spv_attention_f64[],
    bn_vk_spv_rmsnorm[], bn_vk_spv_rmsnorm_f64[], bn_vk_spv_head_matvec[],
    bn_vk_spv_head_matvec_rows[], bn_vk_spv_head_matvec_rows16[], bn_vk_spv_head_matvec_row1[],
    bn_vk_spv_argmax_rows[], bn_vk_spv_attention_rows[], bn_vk_spv_attention_f64_rows[],
    bn_vk_spv_attention_group[], bn_vk_spv_attention_group_f64[];
extern const size_t bn_vk_spv_attention_len, bn_vk_spv_attention_split_len,
    bn_vk_spv_attention_split_f64_len, bn_vk_spv_attention_split_f64_sg_len,
    bn_vk_spv_attention_f64_len, bn_vk_spv_rmsnorm_len, bn_vk_spv_rmsnorm_f64_len,
    bn_vk_spv_head_matvec_len, bn_vk_spv_head_matvec_rows_len, bn_vk_spv_head_matvec_rows16_len,
    bn_vk_spv_head_matvec_row1_len, bn_vk_spv_argmax_rows_len, bn_vk_spv_attention_rows_len,
    bn_vk_spv_attention_f64_rows_len, bn_vk_spv_attention_group_len,
    bn_vk_spv_attention_group_f64_len;

struct bn_vk_ops {
    /* For passes of at least ATTN_ROWS_MIN rows, the same attention a
     * workgroup a row and KV head (attention_group: groups of at most
     * ATTN_GROUP_MAX query heads of ATTN_GROUP_VALUES values together), or
     * in workgroups of ATTN_ROWS_INVOCATIONS (attention_rows: others). */
    bn_vk_kernel *attention, *attention_rows, *attention_group, *split, *rmsnorm, *head, *head_rows,
        *head_rows16, *head_row1, *argmax;
};

/* The shaders' push constants, in their order. Both attentions take
 * attn_params: `extent` is attention.glsl's scratch stride or
 * attention_split.glsl's blocks. */
typedef struct attn_params {
    uint32_t rows, n_head, head_dim, group, kv_dim, block_size, max_blocks, n_seq, cache_rows,
        layer_off, extent;
    float scale;
} attn_params;

typedef struct rmsnorm_params {
    uint32_t rows, n;
    float eps;
} rmsnorm_params;

typedef struct argmax_params {
    uint32_t rows, vocab, first;
} argmax_params;

typedef struct head_params {
    uint32_t n_rows, dim, rows, ld, first, f16;
} head_params;

/* attention.comp keeps a head's query in shared memory (MAX_HD). */
#define ATTN_MAX_HEAD_DIM 512
#define ATTN_INVOCATIONS 512 /* a workgroup's: shaders/attention.glsl */
/* attention_rows.comp's; from ATTN_ROWS_MIN rows a pass has workgroups
 * enough to fill a GPU with them. */
#define ATTN_ROWS_INVOCATIONS 128
#define ATTN_ROWS_MIN 8
#define ATTN_GROUP_MAX 4      /* attention_group.glsl's MAX_G */
#define ATTN_GROUP_VALUES 512 /* its MAX_GHD */
/* Shader indices are 32-bit: a * b and a + b as extents, or BIG once past
 * 2^32 - 1. */
#define BIG UINT64_MAX

static uint64_t prod(uint64_t a, uint64_t b)
{
    if (a == 0 || b == 0)
        return 0;
    return a > UINT32_MAX || b > UINT32_MAX || a * b > UINT32_MAX ? BIG : a * b;
}

static uint64_t sum(uint64_t a, uint64_t b)
{
    return a > UINT32_MAX || b > UINT32_MAX || a + b > UINT32_MAX ? BIG : a + b;
}

/* b holds floats 32-bit values (all of them within reach of an index). */
static bool holds(const bn_vk_buffer *b, uint64_t floats)
{
    return floats <= UINT32_MAX && b->size / 4 >= floats;
}

static bn_status create(bn_vk *vk, bool split_subgroups, bn_vk_ops **out, bn_error *err)
{
    *out = NULL;
    const bn_vulkan_device *d = bn_vk_device(vk);
    const bool fp64 = d->fp64;
    if (d->max_workgroup_invocations < ATTN_INVOCATIONS)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s runs workgroups of at most %u invocations; the attention "
                            "needs %d",
                            d->name, d->max_workgroup_invocations, ATTN_INVOCATIONS);
    bn_vk_ops *ops = calloc(1, sizeof *ops);
    if (!ops)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "Vulkan: no memory for the kernels");
    bn_status st = bn_vk_kernel_create(
        vk, "attention", fp64 ? bn_vk_spv_attention_f64 : bn_vk_spv_attention,
        fp64 ? bn_vk_spv_attention_f64_len : bn_vk_spv_attention_len, 7, sizeof(attn_params),
        &ops->attention, err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(
            vk, "attention_rows", fp64 ? bn_vk_spv_attention_f64_rows : bn_vk_spv_attention_rows,
            fp64 ? bn_vk_spv_attention_f64_rows_len : bn_vk_spv_attention_rows_len, 7,
            sizeof(attn_params), &ops->attention_rows, err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(
            vk, "attention_group", fp64 ? bn_vk_spv_attention_group_f64 : bn_vk_spv_attention_group,
            fp64 ? bn_vk_spv_attention_group_f64_len : bn_vk_spv_attention_group_len, 7,
            sizeof(attn_params), &ops->attention_group, err);
    const bool split_sg = fp64 && d->subgroup_arithmetic && split_subgroups;
    if (st == BN_OK)
        st = bn_vk_kernel_create(vk, "attention_split",
                                 split_sg ? bn_vk_spv_attention_split_f64_sg
                                 : fp64   ? bn_vk_spv_attention_split_f64
                                          : bn_vk_spv_attention_split,
                                 split_sg ? bn_vk_spv_attention_split_f64_sg_len
                                 : fp64   ? bn_vk_spv_attention_split_f64_len
                                          : bn_vk_spv_attention_split_len,
                                 7, sizeof(attn_params), &ops->split, err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(vk, "rmsnorm", fp64 ? bn_vk_spv_rmsnorm_f64 : bn_vk_spv_rmsnorm,
                                 fp64 ? bn_vk_spv_rmsnorm_f64_len : bn_vk_spv_rmsnorm_len, 3,
                                 sizeof(rmsnorm_params), &ops->rmsnorm, err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(vk, "head_matvec", bn_vk_spv_head_matvec,
                                 bn_vk_spv_head_matvec_len, 3, sizeof(head_params), &ops->head,
                                 err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(vk, "head_matvec_rows", bn_vk_spv_head_matvec_rows,
                                 bn_vk_spv_head_matvec_rows_len, 3, sizeof(head_params),
                                 &ops->head_rows, err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(vk, "head_matvec_rows16", bn_vk_spv_head_matvec_rows16,
                                 bn_vk_spv_head_matvec_rows16_len, 3, sizeof(head_params),
                                 &ops->head_rows16, err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(vk, "head_matvec_row1", bn_vk_spv_head_matvec_row1,
                                 bn_vk_spv_head_matvec_row1_len, 3, sizeof(head_params),
                                 &ops->head_row1, err);
    if (st == BN_OK)
        st =
            bn_vk_kernel_create(vk, "argmax_rows", bn_vk_spv_argmax_rows, bn_vk_spv_argmax_rows_len,
                                2, sizeof(argmax_params), &ops->argmax, err);
    if (st != BN_OK) {
        bn_vk_ops_free(vk, ops);
        return st;
    }
    *out = ops;
    return BN_OK;
}

bn_status bn_vk_ops_create(bn_vk *vk, bn_vk_ops **out, bn_error *err)
{
    return create(vk, true, out, err);
}

bn_status bn_vk_ops_create_trees(bn_vk *vk, bn_vk_ops **out, bn_error *err)
{
    return create(vk, false, out, err);
}

void bn_vk_ops_free(bn_vk *vk, bn_vk_ops *ops)
{
    if (!ops)
        return;
    bn_vk_kernel_free(vk, ops->attention);
    bn_vk_kernel_free(vk, ops->attention_rows);
    bn_vk_kernel_free(vk, ops->attention_group);
    bn_vk_kernel_free(vk, ops->split);
    bn_vk_kernel_free(vk, ops->rmsnorm);
    bn_vk_kernel_free(vk, ops->head);
    bn_vk_kernel_free(vk, ops->head_rows);
    bn_vk_kernel_free(vk, ops->head_rows16);
    bn_vk_kernel_free(vk, ops->head_row1);
    bn_vk_kernel_free(vk, ops->argmax);
    free(ops);
}

/* ---- attention ----------------------------------------------------------------- */

/* The attention's shape, the rows' tables and one layer of the caches;
 * *n_seq gets the sequences the tables buffer holds. NULL when they fit,
 * else what is wrong. */
static const char *check_attn(const bn_vk_attn_shape *s, const bn_vk_rows *r,
                              const bn_vk_buffer *k_cache, const bn_vk_buffer *v_cache,
                              int64_t layer_off, uint32_t *n_seq)
{
    if (s->n_head < 1 || s->n_kv < 1 || s->n_head % s->n_kv != 0 || s->head_dim < 1)
        return "n_head must be a positive multiple of n_kv, head_dim positive";
    if (r->rows < 0 || r->block_size < 1 || r->max_blocks < 1)
        return "rows must be >= 0, block_size and max_blocks >= 1";
    if (!holds(r->info, prod((uint64_t)r->rows, 2)))
        return "the rows' info buffer must hold int32 [rows][2]";
    const uint64_t tables = r->tables->size / 4 / (uint64_t)r->max_blocks;
    if (tables < 1 || prod(tables, (uint64_t)r->max_blocks) == BIG)
        return "the block tables' buffer must hold int32 [n_seq >= 1][max_blocks]";
    *n_seq = (uint32_t)tables;
    const uint64_t kv_dim = prod((uint64_t)s->n_kv, (uint64_t)s->head_dim);
    if (s->cache_rows < 1 || layer_off < 0 ||
        sum((uint64_t)s->cache_rows, (uint64_t)r->block_size) == BIG)
        return "cache_rows must be >= 1 and layer_off >= 0";
    const uint64_t end = sum((uint64_t)layer_off, prod((uint64_t)s->cache_rows, kv_dim));
    if (!holds(k_cache, end) || !holds(v_cache, end))
        return "the K and V caches must hold layer_off + cache_rows * n_kv * head_dim floats";
    return NULL;
}

/* check_attn, and q and att for the rows' items, head_dim at most 512. */
static const char *check_attn_io(const bn_vk_attn_shape *s, const bn_vk_rows *r,
                                 const bn_vk_buffer *q, const bn_vk_buffer *k_cache,
                                 const bn_vk_buffer *v_cache, int64_t layer_off,
                                 const bn_vk_buffer *att, uint32_t *n_seq)
{
    const char *bad = check_attn(s, r, k_cache, v_cache, layer_off, n_seq);
    const uint64_t items =
        prod((uint64_t)(r->rows > 0 ? r->rows : 0), (uint64_t)(s->n_head > 0 ? s->n_head : 0));
    if (!bad && s->head_dim > ATTN_MAX_HEAD_DIM)
        bad = "head_dim must be at most 512";
    if (!bad && (!holds(q, prod(items, (uint64_t)s->head_dim)) ||
                 !holds(att, prod(items, (uint64_t)s->head_dim))))
        bad = "q and att must hold [rows][n_head * head_dim] floats";
    return bad;
}

static attn_params attn_params_of(const bn_vk_attn_shape *s, const bn_vk_rows *r,
                                  uint32_t n_seq, int64_t layer_off, uint64_t extent)
{
    return (attn_params){(uint32_t)r->rows,
                         (uint32_t)s->n_head,
                         (uint32_t)s->head_dim,
                         (uint32_t)(s->n_head / s->n_kv),
                         (uint32_t)(s->n_kv * s->head_dim),
                         (uint32_t)r->block_size,
                         (uint32_t)r->max_blocks,
                         n_seq,
                         (uint32_t)s->cache_rows,
                         (uint32_t)layer_off,
                         (uint32_t)extent,
                         (float)(1.0 / sqrt((double)s->head_dim))};
}

bn_status bn_vk_attention_record(bn_vk *vk, bn_vk_ops *ops, const bn_vk_attn_shape *s,
                                 const bn_vk_rows *r, bn_vk_buffer *q, bn_vk_buffer *k_cache,
                                 bn_vk_buffer *v_cache, int64_t layer_off, bn_vk_buffer *scratch,
                                 int64_t scratch_stride, bn_vk_buffer *att, bn_error *err)
{
    uint32_t n_seq = 0;
    const uint64_t rows = (uint64_t)r->rows;
    const uint64_t items = prod(rows, (uint64_t)(s->n_head > 0 ? s->n_head : 0));
    const char *bad = check_attn_io(s, r, q, k_cache, v_cache, layer_off, att, &n_seq);
    if (!bad && (scratch_stride < 1 || !holds(scratch, prod(items, (uint64_t)scratch_stride))))
        bad = "the scratch must hold [rows][n_head][scratch_stride >= 1] floats";
    if (bad)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan attention (%lld rows, %d heads of %d, %d KV heads): %s",
                            (long long)r->rows, s->n_head, s->head_dim, s->n_kv, bad);
    if (rows == 0)
        return BN_OK;
    const attn_params p = attn_params_of(s, r, n_seq, layer_off, (uint64_t)scratch_stride);
    bn_vk_buffer *const buffers[7] = {r->info, r->tables, q, k_cache, v_cache, scratch, att};
    if (rows < ATTN_ROWS_MIN)
        return bn_vk_dispatch_groups(vk, ops->attention, buffers, &p, items, err);
    const int group = s->n_head / s->n_kv;
    if (group <= ATTN_GROUP_MAX && (int64_t)group * s->head_dim <= ATTN_GROUP_VALUES)
        return bn_vk_dispatch_groups(vk, ops->attention_group, buffers, &p,
                                     prod(rows, (uint64_t)s->n_kv), err);
    return bn_vk_dispatch_groups(vk, ops->attention_rows, buffers, &p, items, err);
}

static uint64_t split_blocks(int64_t positions)
{
    return ((uint64_t)positions + BN_VK_SPLIT_BLOCK - 1) / BN_VK_SPLIT_BLOCK;
}

uint64_t bn_vk_attention_split_floats(const bn_vk_attn_shape *s, int64_t rows, int64_t positions)
{
    if (rows < 0 || positions < 0 || s->n_head < 0 || s->head_dim < 0)
        return BIG;
    const uint64_t items = prod((uint64_t)rows, (uint64_t)s->n_head); /* a counter each */
    return sum(items, prod(prod(items, split_blocks(positions)), sum(2, (uint64_t)s->head_dim)));
}

bn_status bn_vk_attention_split_record(bn_vk *vk, bn_vk_ops *ops, const bn_vk_attn_shape *s,
                                       const bn_vk_rows *r, bn_vk_buffer *q, bn_vk_buffer *k_cache,
                                       bn_vk_buffer *v_cache, int64_t layer_off,
                                       bn_vk_buffer *partials, int64_t positions, bn_vk_buffer *att,
                                       bn_error *err)
{
    uint32_t n_seq = 0;
    const uint64_t rows = (uint64_t)r->rows;
    const uint64_t items = prod(rows, (uint64_t)(s->n_head > 0 ? s->n_head : 0));
    const char *bad = check_attn_io(s, r, q, k_cache, v_cache, layer_off, att, &n_seq);
    if (!bad &&
        (positions < 1 || !holds(partials, bn_vk_attention_split_floats(s, r->rows, positions))))
        bad = "the partials must hold [rows][n_head] counters, then [rows][n_head][blocks of the "
              "positions][2 + head_dim] floats";
    if (bad)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan split attention (%lld rows, %d heads of %d, %d KV heads): %s",
                            (long long)r->rows, s->n_head, s->head_dim, s->n_kv, bad);
    if (rows == 0)
        return BN_OK;
    const attn_params p = attn_params_of(s, r, n_seq, layer_off, split_blocks(positions));
    bn_vk_buffer *const buffers[7] = {r->info, r->tables, q, k_cache, v_cache, partials, att};
    return bn_vk_dispatch_groups(vk, ops->split, buffers, &p, prod(items, split_blocks(positions)),
                                 err);
}

/* ---- the final norm and the LM head ----------------------------------------------- */

bn_status bn_vk_rmsnorm_record(bn_vk *vk, bn_vk_ops *ops, bn_vk_buffer *x, bn_vk_buffer *w,
                               bn_vk_buffer *out, int64_t rows, int64_t n, float eps,
                               bn_error *err)
{
    const uint64_t floats = prod((uint64_t)rows, (uint64_t)n);
    if (rows < 0 || n < 1 || !holds(x, floats) || !holds(out, floats) ||
        !holds(w, (uint64_t)n))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan rmsnorm: %lld rows of %lld do not fit their buffers",
                            (long long)rows, (long long)n);
    if (rows == 0)
        return BN_OK;
    const rmsnorm_params p = {(uint32_t)rows, (uint32_t)n, eps};
    bn_vk_buffer *const buffers[3] = {x, w, out};
    return bn_vk_dispatch_groups(vk, ops->rmsnorm, buffers, &p, (uint64_t)rows, err);
}

bn_status bn_vk_head_record(bn_vk *vk, bn_vk_ops *ops, bn_vk_buffer *head, bn_vk_head_type type,
                            int64_t first, int64_t n_rows, int64_t dim, bn_vk_buffer *x,
                            int64_t rows, bn_vk_buffer *logits, int64_t ld, bn_error *err)
{
    const char *bad = NULL;
    if (type != BN_VK_HEAD_F32 && type != BN_VK_HEAD_F16)
        bad = "the head's type must be F32 or F16";
    else if (dim < 1 || (type == BN_VK_HEAD_F16 && dim % 2 != 0))
        bad = "dim must be positive, and even for F16";
    else if (first < 0 || n_rows < 0 || rows < 0 || ld < first + n_rows)
        bad = "first, n_rows and rows must be >= 0, ld >= first + n_rows";
    const uint64_t words = type == BN_VK_HEAD_F16 ? (uint64_t)dim / 2 : (uint64_t)dim;
    if (!bad && !holds(head, prod((uint64_t)n_rows, words)))
        bad = "the head part must hold n_rows rows of dim values";
    if (!bad && !holds(x, prod((uint64_t)rows, (uint64_t)dim)))
        bad = "x must hold [rows][dim] floats";
    if (!bad && rows > 0 &&
        !holds(logits, sum(prod((uint64_t)rows - 1, (uint64_t)ld),
                           sum((uint64_t)first, (uint64_t)n_rows))))
        bad = "the logits must hold (rows - 1) * ld + first + n_rows floats";
    if (bad)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan head (rows %lld .. %lld of %lld values, %lld x rows): %s",
                            (long long)first, (long long)(first + n_rows), (long long)dim,
                            (long long)rows, bad);
    if (n_rows == 0 || rows == 0)
        return BN_OK;
    const head_params p = {(uint32_t)n_rows, (uint32_t)dim,   (uint32_t)rows,
                           (uint32_t)ld,     (uint32_t)first, type == BN_VK_HEAD_F16};
    bn_vk_buffer *const buffers[3] = {head, x, logits};
    /* dim a multiple of 8: for one x row a head row an invocation, 64 a
     * workgroup (head_matvec_row1.comp); for up to 15, four x rows an
     * invocation (head_matvec_rows.comp); for more, four invocations a
     * head row, so 16 a workgroup, reading it together for 16 x rows
     * (head_matvec_rows16.comp); else eight head rows a workgroup. */
    if (dim % 8 == 0 && rows >= 16)
        return bn_vk_dispatch_groups(vk, ops->head_rows16, buffers, &p,
                                     ((uint64_t)n_rows + 15) / 16, err);
    if (dim % 8 == 0)
        return bn_vk_dispatch_groups(vk, rows == 1 ? ops->head_row1 : ops->head_rows,
                                     buffers, &p, ((uint64_t)n_rows + 63) / 64, err);
    return bn_vk_dispatch_groups(vk, ops->head, buffers, &p, ((uint64_t)n_rows + 7) / 8, err);
}

/* ---- greedy picks ---------------------------------------------------------------- */

bn_status bn_vk_argmax_record(bn_vk *vk, bn_vk_ops *ops, bn_vk_buffer *logits, int64_t first,
                              int64_t rows, int64_t vocab, bn_vk_buffer *picks, bn_error *err)
{
    if (first < 0 || rows < 0 || vocab < 1 ||
        !holds(logits, prod(sum((uint64_t)first, (uint64_t)rows), (uint64_t)vocab)) ||
        picks->size < (VkDeviceSize)rows * sizeof(int32_t))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan argmax: rows %lld .. %lld of %lld logits do not fit their "
                            "buffers",
                            (long long)first, (long long)(first + rows), (long long)vocab);
    if (rows == 0)
        return BN_OK;
    const argmax_params p = {(uint32_t)rows, (uint32_t)vocab, (uint32_t)first};
    bn_vk_buffer *const buffers[2] = {logits, picks};
    return bn_vk_dispatch_groups(vk, ops->argmax, buffers, &p, (uint64_t)rows, err);
}
