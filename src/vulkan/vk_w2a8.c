/* vk_w2a8.c - packing for and launching of shaders/w2a8_matvec.comp. */
#include "vk_w2a8.h"

#include "vk_norm.h"

#include <string.h>

#define BN_VK_W2A8_OUTPUTS 8 /* outputs a workgroup: shaders/w2a8_matvec.glsl */
#define ROWS_KERNEL "w2a8_matvec_dot_f64_rows"
#define ROWS_RB 8 /* activation rows a workgroup of it: its RB */
#define TILES_KERNEL "w2a8_tiles"
#define MATRIX_KERNEL "w2a8_matrix"
#define TILE_ROWS 32  /* activation rows a workgroup of either: their TM */
#define TILE_GROUPS 8 /* the plain kernel's workgroups (groups of outputs) a tile */

extern const unsigned char bn_vk_spv_w2a8_matvec[], bn_vk_spv_w2a8_matvec_f64[],
    bn_vk_spv_w2a8_matvec_dot[], bn_vk_spv_w2a8_matvec_dot_f64[],
    bn_vk_spv_w2a8_matvec_dot_f64_rows[], bn_vk_spv_w2a8_normed[], bn_vk_spv_w2a8_tiles[],
    bn_vk_spv_w2a8_matrix[];
extern const size_t bn_vk_spv_w2a8_matvec_len, bn_vk_spv_w2a8_matvec_f64_len,
    bn_vk_spv_w2a8_matvec_dot_len, bn_vk_spv_w2a8_matvec_dot_f64_len,
    bn_vk_spv_w2a8_matvec_dot_f64_rows_len, bn_vk_spv_w2a8_normed_len, bn_vk_spv_w2a8_tiles_len,
    bn_vk_spv_w2a8_matrix_len;

/* The shader's push constants, in its order. */
typedef struct matvec_params {
    uint32_t n, words, act_row;
    float weight_scale;
    uint32_t rows, mode;
    float up_scale, v_scale;
    uint32_t n_head, n_kv, head_dim, rope_dim, block_size, max_blocks, n_seq, cache_rows,
        layer_off;
} matvec_params;

#define MODE_GATE_UP 2 /* the shader's epilogues: bn_vk_w2a8_record_gate_up */
#define MODE_QKV 3     /* bn_vk_w2a8_record_qkv */
#define N_BUFFERS 9    /* the shader's bindings; modes 0 to 2 use the first four */

size_t bn_vk_w2a8_words(int64_t k) { return (size_t)((k + 15) / 16); }

void bn_vk_w2a8_pack(const int8_t *codes, int64_t n, int64_t k, uint32_t *out)
{
    const size_t words = bn_vk_w2a8_words(k);
    for (int64_t r = 0; r < n; r++)
        for (size_t j = 0; j < words; j++) {
            uint32_t word = 0;
            for (int i = 0; i < 16; i++) {
                const int64_t c = (int64_t)j * 16 + i;
                const uint32_t code = c < k ? (uint32_t)(codes[r * k + c] + 1) : 1u;
                word |= code << (2 * i);
            }
            out[(size_t)r * words + j] = word;
        }
}

bool bn_vk_w2a8_dot_fits(const bn_vk *vk)
{
    const bn_vulkan_device *d = bn_vk_device(vk);
    return d->integer_dot_product && d->subgroup_arithmetic;
}

bn_status bn_vk_w2a8_kernel(bn_vk *vk, bool exact_division, bool dot_product,
                            bn_vk_kernel **out, bn_error *err)
{
    const bn_vulkan_device *d = bn_vk_device(vk);
    if (exact_division && !d->fp64)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s has no fp64 for the exact division", d->name);
    if (dot_product && !bn_vk_w2a8_dot_fits(vk))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s has no integer dot products or no subgroup arithmetic",
                            d->name);
    /* The four variants: {portable, dot} x {device division, exact}. */
    static const struct {
        const char *name;
        const unsigned char *spirv;
        const size_t *len;
    } variants[2][2] = {
        {{"w2a8_matvec", bn_vk_spv_w2a8_matvec, &bn_vk_spv_w2a8_matvec_len},
         {"w2a8_matvec_f64", bn_vk_spv_w2a8_matvec_f64, &bn_vk_spv_w2a8_matvec_f64_len}},
        {{"w2a8_matvec_dot", bn_vk_spv_w2a8_matvec_dot, &bn_vk_spv_w2a8_matvec_dot_len},
         {"w2a8_matvec_dot_f64", bn_vk_spv_w2a8_matvec_dot_f64,
          &bn_vk_spv_w2a8_matvec_dot_f64_len}},
    };
    const int v = dot_product ? 1 : 0, e = exact_division ? 1 : 0;
    return bn_vk_kernel_create(vk, variants[v][e].name, variants[v][e].spirv, *variants[v][e].len,
                               N_BUFFERS, sizeof(matvec_params), out, err);
}

bool bn_vk_w2a8_rows_kernel_fits(const bn_vk *vk)
{
    const bn_vulkan_device *d = bn_vk_device(vk);
    return d->fp64 && bn_vk_w2a8_dot_fits(vk);
}

/* A kernel of many rows (exact division, integer dot products) named
 * name, for `what`. */
static bn_status many_rows_kernel(bn_vk *vk, const char *name, const unsigned char *spirv,
                                  size_t len, const char *what, bn_vk_kernel **out, bn_error *err)
{
    if (!bn_vk_w2a8_rows_kernel_fits(vk))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s lacks fp64 or integer dot products for %s",
                            bn_vk_device(vk)->name, what);
    return bn_vk_kernel_create(vk, name, spirv, len, N_BUFFERS, sizeof(matvec_params), out, err);
}

bn_status bn_vk_w2a8_rows_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err)
{
    return many_rows_kernel(vk, ROWS_KERNEL, bn_vk_spv_w2a8_matvec_dot_f64_rows,
                            bn_vk_spv_w2a8_matvec_dot_f64_rows_len,
                            "the W2A8 product of many rows", out, err);
}

bn_status bn_vk_w2a8_tiles_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err)
{
    return many_rows_kernel(vk, TILES_KERNEL, bn_vk_spv_w2a8_tiles, bn_vk_spv_w2a8_tiles_len,
                            "the tiled W2A8 product", out, err);
}

/* The matrix kernel's workgroup (shaders/w2a8_matrix.comp): 256
 * invocations; shared memory for a stage of its TILE_ROWS activation rows
 * and 64 weight rows (9 x 16 bytes a row) and its TILE_ROWS x 64 int sums:
 * 21.5 KiB. */
#define MATRIX_INVOCATIONS 256
#define MATRIX_SHARED_BYTES ((TILE_ROWS + 64) * 9 * 16 + TILE_ROWS * 64 * 4)

bool bn_vk_w2a8_matrix_fits(const bn_vk *vk)
{
    const bn_vulkan_device *d = bn_vk_device(vk);
    return bn_vk_w2a8_rows_kernel_fits(vk) && d->int8_matrix[0] != 0 &&
           d->max_workgroup_invocations >= MATRIX_INVOCATIONS &&
           d->max_shared_bytes >= MATRIX_SHARED_BYTES;
}

bn_status bn_vk_w2a8_matrix_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err)
{
    if (!bn_vk_w2a8_matrix_fits(vk))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s has no 16 x 16 x 32 int8 subgroup matrix products for "
                            "the W2A8 matrix kernel (or lacks fp64, integer dot products or "
                            "workgroups of 256 invocations with 21.5 KiB of shared memory)",
                            bn_vk_device(vk)->name);
    return bn_vk_kernel_create(vk, MATRIX_KERNEL, bn_vk_spv_w2a8_matrix, bn_vk_spv_w2a8_matrix_len,
                               N_BUFFERS, sizeof(matvec_params), out, err);
}

/* Workgroups of `kernel` for `per_row` of the plain kernel's workgroups an
 * activation row: the rows kernel takes ROWS_RB rows of them, the tiled
 * and matrix ones TILE_GROUPS of them times TILE_ROWS rows. */
static uint64_t groups_for(const bn_vk_kernel *kernel, uint64_t per_row, int64_t rows)
{
    const char *name = bn_vk_kernel_name(kernel);
    if (strcmp(name, TILES_KERNEL) == 0 || strcmp(name, MATRIX_KERNEL) == 0)
        return (per_row + TILE_GROUPS - 1) / TILE_GROUPS *
               (((uint64_t)rows + TILE_ROWS - 1) / TILE_ROWS);
    const uint64_t rb = strcmp(name, ROWS_KERNEL) == 0 ? ROWS_RB : 1;
    return per_row * (((uint64_t)rows + rb - 1) / rb);
}

/* A product of n outputs a row read from w_rows rows (n, or 2n for the
 * gate and up), outputs a workgroup per_group. */
static bn_status record(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w, bn_vk_buffer *x,
                        bn_vk_buffer *act_scales, int64_t act_row, int64_t rows, bn_vk_buffer *y,
                        int64_t n, int64_t w_rows, int64_t k, float weight_scale, float up_scale,
                        int mode, int per_group, bn_error *err)
{
    const size_t words = bn_vk_w2a8_words(k);
    if (n < 1 || k < 1 || act_row < 0 || rows < 1 || (uint64_t)w_rows * words > UINT32_MAX ||
        (uint64_t)n * (uint64_t)rows > UINT32_MAX || w->size < (VkDeviceSize)w_rows * words * 4 ||
        x->size < (VkDeviceSize)(act_row + rows) * words * 16 ||
        act_scales->size < (VkDeviceSize)(act_row + rows) * sizeof(float) ||
        y->size < (VkDeviceSize)(n * rows) * sizeof(float))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan W2A8: %lld x %lld (activation rows %lld..%lld) does not fit "
                            "its buffers",
                            (long long)w_rows, (long long)k, (long long)act_row,
                            (long long)(act_row + rows - 1));
    const matvec_params p = {.n = (uint32_t)n,
                             .words = (uint32_t)words,
                             .act_row = (uint32_t)act_row,
                             .weight_scale = weight_scale,
                             .rows = (uint32_t)rows,
                             .mode = (uint32_t)mode,
                             .up_scale = up_scale};
    /* Modes 0 to 2 bind y where mode 3's buffers go; they never touch them. */
    bn_vk_buffer *const buffers[N_BUFFERS] = {w, x, y, act_scales, y, y, y, y, y};
    const uint64_t per_row = (uint64_t)((n + per_group - 1) / per_group);
    return bn_vk_dispatch_groups(vk, kernel, buffers, &p, groups_for(kernel, per_row, rows), err);
}

bn_status bn_vk_w2a8_record_rows(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                 bn_vk_buffer *x, bn_vk_buffer *act_scales, int64_t act_row,
                                 int64_t rows, bn_vk_buffer *y, int64_t n, int64_t k,
                                 float weight_scale, bn_vk_w2a8_epilogue epilogue,
                                 bn_error *err)
{
    if (epilogue != BN_VK_W2A8_STORE && epilogue != BN_VK_W2A8_ADD)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan W2A8: no epilogue %d", (int)epilogue);
    return record(vk, kernel, w, x, act_scales, act_row, rows, y, n, n, k, weight_scale, 0.0f,
                  (int)epilogue, BN_VK_W2A8_OUTPUTS, err);
}

bn_status bn_vk_w2a8_record_gate_up(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                    bn_vk_buffer *x, bn_vk_buffer *act_scales, int64_t act_row,
                                    int64_t rows, bn_vk_buffer *y, int64_t n, int64_t k,
                                    float gate_scale, float up_scale, bn_error *err)
{
    if (n > INT64_MAX / 2)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan W2A8: a gate of %lld rows", (long long)n);
    return record(vk, kernel, w, x, act_scales, act_row, rows, y, n, 2 * n, k, gate_scale,
                  up_scale, MODE_GATE_UP, BN_VK_W2A8_OUTPUTS / 2, err);
}

/* ---- the product that norms its input (shaders/w2a8_normed.glsl) ---- */

/* Its push constants, in its order. */
typedef struct normed_params {
    uint32_t n, k, words;
    float weight_scale;
    uint32_t mode;
    float up_scale, eps;
    uint32_t groups;
    float v_scale;
    uint32_t n_head, n_kv, head_dim, rope_dim, block_size, max_blocks, n_seq, cache_rows, layer_off;
} normed_params;

#define NORMED_SLOTS 16 /* outputs a group: the shader's SLOTS */
/* Workgroups at most: each norms the row once, so the grid should fit the
 * device at once (two of 512 invocations an SM of a 132-SM H200); more
 * groups are taken in turn. */
#define NORMED_MAX_GROUPS 256

bool bn_vk_w2a8_normed_fits(const bn_vk *vk)
{
    return bn_vk_w2a8_dot_fits(vk) && bn_vk_norm_subgroups(vk);
}

bn_status bn_vk_w2a8_normed_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err)
{
    if (!bn_vk_w2a8_normed_fits(vk))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s lacks integer dot products or the norm's subgroup "
                            "variant for the W2A8 product that norms its input",
                            bn_vk_device(vk)->name);
    return bn_vk_kernel_create(vk, "w2a8_normed", bn_vk_spv_w2a8_normed, bn_vk_spv_w2a8_normed_len,
                               N_BUFFERS, sizeof(normed_params), out, err);
}

bn_status bn_vk_w2a8_record_normed(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                   bn_vk_buffer *x, bn_vk_buffer *norm_w, float eps,
                                   bn_vk_buffer *y, int64_t n, int64_t k, float weight_scale,
                                   bn_vk_w2a8_epilogue epilogue, bn_error *err)
{
    const size_t words = bn_vk_w2a8_words(k);
    if (epilogue != BN_VK_W2A8_STORE && epilogue != BN_VK_W2A8_ADD)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "Vulkan W2A8: no epilogue %d",
                            (int)epilogue);
    if (n < 1 || k < 1 || k > BN_VK_NORMED_MAX_K || (uint64_t)n * words > UINT32_MAX ||
        w->size < (VkDeviceSize)n * words * 4 || x->size < (VkDeviceSize)k * sizeof(float) ||
        norm_w->size < (VkDeviceSize)k * sizeof(float) || y->size < (VkDeviceSize)n * sizeof(float))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan W2A8 normed: %lld x %lld does not fit its buffers (or k is "
                            "past %d)",
                            (long long)n, (long long)k, BN_VK_NORMED_MAX_K);
    const uint64_t groups = (uint64_t)((n + NORMED_SLOTS - 1) / NORMED_SLOTS);
    const normed_params pr = {.n = (uint32_t)n,
                              .k = (uint32_t)k,
                              .words = (uint32_t)words,
                              .weight_scale = weight_scale,
                              .mode = (uint32_t)epilogue,
                              .eps = eps,
                              .groups = (uint32_t)groups};
    /* Modes 0 and 1 bind y where mode 3's buffers go; they never touch them. */
    bn_vk_buffer *const buffers[N_BUFFERS] = {w, x, y, norm_w, y, y, y, y, y};
    return bn_vk_dispatch_groups(vk, kernel, buffers, &pr,
                                 groups < NORMED_MAX_GROUPS ? groups : NORMED_MAX_GROUPS, err);
}

/* Mode 3's workgroups a row (shaders/w2a8_matvec.glsl: qkv_geometry):
 * q's and k's pairs four a workgroup and their values past rope_dim eight,
 * v's values eight. */
static uint64_t qkv_groups(const bn_vk_qkv *s)
{
    const uint64_t half = (uint64_t)s->rope_dim / 2, rest = (uint64_t)s->head_dim - 2 * half;
    uint64_t g = 0;
    for (int part = 0; part < 2; part++) {
        const uint64_t heads = (uint64_t)(part == 0 ? s->n_head : s->n_kv);
        g += (heads * half + 3) / 4 + (heads * rest + 7) / 8;
    }
    return g + ((uint64_t)s->n_kv * (uint64_t)s->head_dim + 7) / 8;
}

static bool holds(const bn_vk_buffer *b, uint64_t bytes) { return b->size >= bytes; }

/* What is wrong with the q, k, v shape s over weights w (rows of k) for
 * activation rows act_row .. act_row + rows - 1 into q, or NULL; *n_seq
 * the tables' sequences. */
static const char *qkv_check(const bn_vk_qkv *s, const bn_vk_buffer *w, int64_t k, int64_t act_row,
                             int64_t rows, const bn_vk_buffer *q, uint32_t *n_seq)
{
    if (s->n_head < 1 || s->n_kv < 1 || s->head_dim < 1 || s->n_head % s->n_kv != 0)
        return "n_head must be a positive multiple of n_kv, head_dim positive";
    if (s->rope_dim < 0 || s->rope_dim % 2 != 0 || s->rope_dim > s->head_dim)
        return "rope_dim must be even, from 0 to head_dim";
    if (s->block_size < 1 || s->max_blocks < 1 || s->cache_rows < 1 || s->layer_off < 0)
        return "the cache's block size, blocks a sequence, rows and offset must be positive";
    if (k < 1 || act_row < 0 || rows < 1)
        return "k, the first activation row and the rows must be positive";
    const uint64_t hd = (uint64_t)s->head_dim, q_dim = (uint64_t)s->n_head * hd,
                   kv_dim = (uint64_t)s->n_kv * hd, n = q_dim + 2 * kv_dim,
                   words = bn_vk_w2a8_words(k), last = (uint64_t)act_row + (uint64_t)rows;
    if (n * words > UINT32_MAX || q_dim * (uint64_t)rows > UINT32_MAX ||
        (uint64_t)s->layer_off + (uint64_t)s->cache_rows * kv_dim > UINT32_MAX)
        return "the shape is past 32-bit indices";
    if (!holds(w, n * words * 4) || !holds(q, q_dim * (uint64_t)rows * 4))
        return "the weights or q do not fit their buffers";
    if (!holds(s->info, last * 8) ||
        (s->rope_dim > 0 && !holds(s->cs, last * (uint64_t)s->rope_dim * 4)))
        return "the rows' positions or cos / sin tables do not fit their buffers";
    const uint64_t cache_floats = (uint64_t)s->layer_off + (uint64_t)s->cache_rows * kv_dim;
    if (!holds(s->k_cache, cache_floats * 4) || !holds(s->v_cache, cache_floats * 4))
        return "the layer's cache does not fit the cache buffers";
    const uint64_t seqs = s->tables->size / (4 * (uint64_t)s->max_blocks);
    if (seqs < 1 || seqs > UINT32_MAX)
        return "the block tables must hold at least one sequence's";
    *n_seq = (uint32_t)seqs;
    return NULL;
}

static bn_status qkv_refused(const bn_vk_qkv *s, int64_t rows, const char *bad, bn_error *err)
{
    return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                        "Vulkan W2A8 q, k, v (%d + %d heads of %d, %lld rows): %s", s->n_head,
                        s->n_kv, s->head_dim, (long long)rows, bad);
}

bn_status bn_vk_w2a8_record_qkv(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w, bn_vk_buffer *x,
                                bn_vk_buffer *act_scales, int64_t act_row, int64_t rows,
                                bn_vk_buffer *q, int64_t k, const bn_vk_qkv *s, bn_error *err)
{
    uint32_t n_seq = 0;
    const char *bad = qkv_check(s, w, k, act_row, rows, q, &n_seq);
    const uint64_t words = bn_vk_w2a8_words(k), last = (uint64_t)act_row + (uint64_t)rows;
    if (!bad && (!holds(x, last * words * 16) || !holds(act_scales, last * 4)))
        bad = "the activations or scales do not fit their buffers";
    if (bad)
        return qkv_refused(s, rows, bad, err);
    const uint64_t hd = (uint64_t)s->head_dim;
    const matvec_params p = {(uint32_t)(hd * (uint64_t)(s->n_head + 2 * s->n_kv)),
                             (uint32_t)words,
                             (uint32_t)act_row,
                             s->q_scale,
                             (uint32_t)rows,
                             MODE_QKV,
                             s->k_scale,
                             s->v_scale,
                             (uint32_t)s->n_head,
                             (uint32_t)s->n_kv,
                             (uint32_t)s->head_dim,
                             (uint32_t)s->rope_dim,
                             (uint32_t)s->block_size,
                             (uint32_t)s->max_blocks,
                             n_seq,
                             (uint32_t)s->cache_rows,
                             (uint32_t)s->layer_off};
    bn_vk_buffer *const buffers[N_BUFFERS] = {w,         x,  q, act_scales, s->info,
                                              s->tables, s->cs, s->k_cache, s->v_cache};
    return bn_vk_dispatch_groups(vk, kernel, buffers, &p, groups_for(kernel, qkv_groups(s), rows),
                                 err);
}

bn_status bn_vk_w2a8_record_qkv_normed(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                       bn_vk_buffer *x, bn_vk_buffer *norm_w, float eps,
                                       bn_vk_buffer *q, int64_t k, const bn_vk_qkv *s,
                                       bn_error *err)
{
    uint32_t n_seq = 0;
    const char *bad = qkv_check(s, w, k, 0, 1, q, &n_seq);
    if (!bad && k > BN_VK_NORMED_MAX_K)
        bad = "k is past BN_VK_NORMED_MAX_K";
    if (!bad && (!holds(x, (uint64_t)k * 4) || !holds(norm_w, (uint64_t)k * 4)))
        bad = "the row or its norm weights do not fit their buffers";
    if (bad)
        return qkv_refused(s, 1, bad, err);
    /* Two of the plain kernel's workgroups a group (the shader's mode 3). */
    const uint64_t groups = (qkv_groups(s) + 1) / 2;
    const normed_params pr = {
        .n = (uint32_t)((uint64_t)s->head_dim * (uint64_t)(s->n_head + 2 * s->n_kv)),
        .k = (uint32_t)k,
        .words = (uint32_t)bn_vk_w2a8_words(k),
        .weight_scale = s->q_scale,
        .mode = MODE_QKV,
        .up_scale = s->k_scale,
        .eps = eps,
        .groups = (uint32_t)groups,
        .v_scale = s->v_scale,
        .n_head = (uint32_t)s->n_head,
        .n_kv = (uint32_t)s->n_kv,
        .head_dim = (uint32_t)s->head_dim,
        .rope_dim = (uint32_t)s->rope_dim,
        .block_size = (uint32_t)s->block_size,
        .max_blocks = (uint32_t)s->max_blocks,
        .n_seq = n_seq,
        .cache_rows = (uint32_t)s->cache_rows,
        .layer_off = (uint32_t)s->layer_off};
    bn_vk_buffer *const buffers[N_BUFFERS] = {w,         x,     q,          norm_w,    s->info,
                                              s->tables, s->cs, s->k_cache, s->v_cache};
    return bn_vk_dispatch_groups(vk, kernel, buffers, &pr,
                                 groups < NORMED_MAX_GROUPS ? groups : NORMED_MAX_GROUPS, err);
}
