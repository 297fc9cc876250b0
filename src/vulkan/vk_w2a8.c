/* vk_w2a8.c - packing for and launching of shaders/w2a8_matvec.comp. */
#include "vk_w2a8.h"

#include "vk_norm.h"

#include <string.h>

#define BN_VK_W2A8_OUTPUTS 8 /* outputs a workgroup: shaders/w2a8_matvec.glsl */
#define ROWS_KERNEL "w2a8_matvec_dot_f64_rows"
#define ROWS_RB 8 /* activation rows a workgroup of it: its RB */

extern const unsigned char bn_vk_spv_w2a8_matvec[], bn_vk_spv_w2a8_matvec_f64[],
    bn_vk_spv_w2a8_matvec_dot[], bn_vk_spv_w2a8_matvec_dot_f64[],
    bn_vk_spv_w2a8_matvec_dot_f64_rows[], bn_vk_spv_w2a8_normed[];
extern const size_t bn_vk_spv_w2a8_matvec_len, bn_vk_spv_w2a8_matvec_f64_len,
    bn_vk_spv_w2a8_matvec_dot_len, bn_vk_spv_w2a8_matvec_dot_f64_len,
    bn_vk_spv_w2a8_matvec_dot_f64_rows_len, bn_vk_spv_w2a8_normed_len;

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

bn_status bn_vk_w2a8_rows_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err)
{
    if (!bn_vk_w2a8_rows_kernel_fits(vk))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s lacks fp64 or integer dot products for the W2A8 "
                            "product of many rows",
                            bn_vk_device(vk)->name);
    return bn_vk_kernel_create(vk, ROWS_KERNEL, bn_vk_spv_w2a8_matvec_dot_f64_rows,
                               bn_vk_spv_w2a8_matvec_dot_f64_rows_len, N_BUFFERS,
                               sizeof(matvec_params), out, err);
}

/* Workgroups of `kernel` for `per_row` workgroups an activation row. */
static uint64_t groups_for(const bn_vk_kernel *kernel, uint64_t per_row, int64_t rows)
{
    const uint64_t rb = strcmp(bn_vk_kernel_name(kernel), ROWS_KERNEL) == 0 ? ROWS_RB : 1;
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

/* ---- the products that norm their input (shaders/w2a8_normed.glsl) ---- */

/* A stage's push constants, in the shader's Stage order. */
typedef struct normed_stage_params {
    uint32_t n, k, words;
    float weight_scale;
    uint32_t mode;
    float up_scale;
    uint32_t groups, unused;
} normed_stage_params;

/* The shader's push constants, in its order. */
typedef struct normed_params {
    normed_stage_params st[BN_VK_NORMED_STAGES];
    float eps;
    uint32_t stages, link_at, spin_limit;
} normed_params;

#define NORMED_SLOTS 16 /* invocation groups a workgroup: the shader's SLOTS */
#define NORMED_BUFFERS 13
/* Workgroups at most of one stage alone: each norms the row once, so the
 * grid should fit the device at once (two of 512 invocations an SM of a
 * 132-SM H200); more groups are taken in turn. */
#define NORMED_MAX_GROUPS 256
/* Polls a grid barrier's wait makes before it gives up: a stage of the
 * chain takes microseconds, this some seconds; the probe's far fewer. */
#define SPIN_LIMIT (1u << 24)
#define PROBE_SPIN_LIMIT (1u << 14)

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
                               NORMED_BUFFERS, sizeof(normed_params), out, err);
}

/* Stage i's push constants and buffers; false (with *err) when its shape
 * does not fit them. */
static bool normed_stage(const bn_vk_normed_stage *s, int i, normed_stage_params *out,
                         bn_vk_buffer **buffers, bn_error *err)
{
    const size_t words = bn_vk_w2a8_words(s->k);
    const int64_t w_rows = s->gate_up ? 2 * s->n : s->n;
    if ((!s->gate_up && s->epilogue != BN_VK_W2A8_STORE && s->epilogue != BN_VK_W2A8_ADD) ||
        s->n < 1 || s->n > INT32_MAX || s->k < 1 || s->k > BN_VK_NORMED_MAX_K ||
        (uint64_t)w_rows * words > UINT32_MAX ||
        s->w->size < (VkDeviceSize)w_rows * words * 4 ||
        s->x->size < (VkDeviceSize)s->k * sizeof(float) ||
        s->norm_w->size < (VkDeviceSize)s->k * sizeof(float) ||
        s->y->size < (VkDeviceSize)s->n * sizeof(float)) {
        bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                     "Vulkan W2A8 normed: stage %d, %lld x %lld, does not fit its buffers (or "
                     "k is past %d, or no such epilogue)",
                     i, (long long)s->n, (long long)s->k, BN_VK_NORMED_MAX_K);
        return false;
    }
    const int64_t per = s->gate_up ? NORMED_SLOTS / 2 : NORMED_SLOTS;
    *out = (normed_stage_params){(uint32_t)s->n,
                                 (uint32_t)s->k,
                                 (uint32_t)words,
                                 s->weight_scale,
                                 s->gate_up ? 2u : (uint32_t)s->epilogue,
                                 s->up_scale,
                                 (uint32_t)((s->n + per - 1) / per),
                                 0};
    buffers[i] = s->w;
    buffers[3 + i] = s->x;
    buffers[6 + i] = s->y;
    buffers[9 + i] = s->norm_w;
    return true;
}

bn_status bn_vk_w2a8_record_chain(bn_vk *vk, bn_vk_kernel *kernel,
                                  const bn_vk_normed_stage *stages, int n_stages, float eps,
                                  bn_vk_buffer *link, uint32_t link_at, uint32_t workgroups,
                                  bn_error *err)
{
    if (n_stages < 1 || n_stages > BN_VK_NORMED_STAGES || workgroups < 1 ||
        (n_stages > 1 && (!link || link_at < 1 || link->size < ((VkDeviceSize)link_at + 1) * 4)))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan W2A8 normed: a chain of %d stages over %u workgroups (at "
                            "most %d stages; a counter past word 0 of the link buffer)",
                            n_stages, workgroups, BN_VK_NORMED_STAGES);
    normed_params pr = {.eps = eps,
                        .stages = (uint32_t)n_stages,
                        .link_at = link_at,
                        .spin_limit = SPIN_LIMIT};
    bn_vk_buffer *buffers[NORMED_BUFFERS];
    for (int i = 0; i < n_stages; i++)
        if (!normed_stage(&stages[i], i, &pr.st[i], buffers, err))
            return BN_ERR_INVALID_ARGUMENT;
    /* Stages not run bind the last one's buffers; one stage never touches
     * the link. */
    for (int i = n_stages; i < BN_VK_NORMED_STAGES; i++)
        for (int b = 0; b < 4; b++)
            buffers[3 * b + i] = buffers[3 * b + n_stages - 1];
    buffers[12] = link ? link : stages[0].y;
    return bn_vk_dispatch(vk, kernel, buffers, &pr, workgroups, 1, err);
}

bn_status bn_vk_w2a8_record_normed(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                   bn_vk_buffer *x, bn_vk_buffer *norm_w, float eps,
                                   bn_vk_buffer *y, int64_t n, int64_t k, float weight_scale,
                                   bn_vk_w2a8_epilogue epilogue, bn_error *err)
{
    const bn_vk_normed_stage s = {w, x, norm_w, y, n, k, weight_scale, 0.0f, epilogue, false};
    const int64_t groups = n > 0 ? (n + NORMED_SLOTS - 1) / NORMED_SLOTS : 1;
    return bn_vk_w2a8_record_chain(vk, kernel, &s, 1, eps, NULL, 0,
                                   (uint32_t)(groups < NORMED_MAX_GROUPS ? groups
                                                                         : NORMED_MAX_GROUPS),
                                   err);
}

/* Whether `groups` workgroups of the chain kernel met at its barrier. */
static bn_status probe(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *link, uint32_t groups,
                       bool *met, bn_error *err)
{
    const uint32_t zero[2] = {0, 0};
    bn_status st = bn_vk_write(vk, link, zero, sizeof zero, err);
    normed_params pr = {.stages = 0, .link_at = 1, .spin_limit = PROBE_SPIN_LIMIT};
    bn_vk_buffer *buffers[NORMED_BUFFERS];
    for (int b = 0; b < NORMED_BUFFERS; b++)
        buffers[b] = link;
    if (st == BN_OK)
        st = bn_vk_begin(vk, err);
    if (st == BN_OK) {
        bn_error closing;
        const bn_status rec = bn_vk_dispatch(vk, kernel, buffers, &pr, groups, 1, err);
        st = bn_vk_submit(vk, rec == BN_OK ? err : &closing);
        if (rec != BN_OK)
            st = rec;
    }
    uint32_t got[2] = {1, 0};
    if (st == BN_OK)
        st = bn_vk_read(vk, link, got, sizeof got, err);
    *met = st == BN_OK && got[0] == 0 && got[1] == groups;
    if (st == BN_OK)
        st = bn_vk_write(vk, link, zero, sizeof zero, err);
    return st;
}

bn_status bn_vk_w2a8_chain_room(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *link,
                                uint32_t max, uint32_t *out, bn_error *err)
{
    *out = 1;
    if (link->size < 8 || max < 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan: the chain's probe wants two words of link and a maximum");
    if (strcmp(bn_vk_device(vk)->type, "cpu") == 0)
        return BN_OK;
    /* The largest grid that meets: lo always does (one workgroup), hi
     * does not unless it is max and meets. */
    bool met = false;
    bn_status st = probe(vk, kernel, link, max, &met, err);
    if (st != BN_OK)
        return st;
    if (met) {
        *out = max;
        return BN_OK;
    }
    uint32_t lo = 1, hi = max;
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        st = probe(vk, kernel, link, mid, &met, err);
        if (st != BN_OK)
            return st;
        if (met)
            lo = mid;
        else
            hi = mid;
    }
    *out = lo;
    return BN_OK;
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

bn_status bn_vk_w2a8_record_qkv(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                bn_vk_buffer *x, bn_vk_buffer *act_scales, int64_t act_row,
                                int64_t rows, bn_vk_buffer *q, int64_t k, const bn_vk_qkv *s,
                                bn_error *err)
{
    const char *bad = NULL;
    if (s->n_head < 1 || s->n_kv < 1 || s->head_dim < 1 || s->n_head % s->n_kv != 0)
        bad = "n_head must be a positive multiple of n_kv, head_dim positive";
    else if (s->rope_dim < 0 || s->rope_dim % 2 != 0 || s->rope_dim > s->head_dim)
        bad = "rope_dim must be even, from 0 to head_dim";
    else if (s->block_size < 1 || s->max_blocks < 1 || s->cache_rows < 1 || s->layer_off < 0)
        bad = "the cache's block size, blocks a sequence, rows and offset must be positive";
    else if (k < 1 || act_row < 0 || rows < 1)
        bad = "k, the first activation row and the rows must be positive";
    const uint64_t hd = (uint64_t)s->head_dim, q_dim = (uint64_t)s->n_head * hd,
                   kv_dim = (uint64_t)s->n_kv * hd, n = q_dim + 2 * kv_dim,
                   words = bn_vk_w2a8_words(k), last = (uint64_t)act_row + (uint64_t)rows;
    if (!bad && (n * words > UINT32_MAX || q_dim * (uint64_t)rows > UINT32_MAX ||
                 (uint64_t)s->layer_off + (uint64_t)s->cache_rows * kv_dim > UINT32_MAX))
        bad = "the shape is past 32-bit indices";
    if (!bad && (!holds(w, n * words * 4) || !holds(x, last * words * 16) ||
                 !holds(act_scales, last * 4) || !holds(q, q_dim * (uint64_t)rows * 4)))
        bad = "the weights, activations, scales or q do not fit their buffers";
    if (!bad && (!holds(s->info, last * 8) ||
                 (s->rope_dim > 0 && !holds(s->cs, last * (uint64_t)s->rope_dim * 4))))
        bad = "the rows' positions or cos / sin tables do not fit their buffers";
    const uint64_t cache_floats = (uint64_t)s->layer_off + (uint64_t)s->cache_rows * kv_dim;
    if (!bad && (!holds(s->k_cache, cache_floats * 4) || !holds(s->v_cache, cache_floats * 4)))
        bad = "the layer's cache does not fit the cache buffers";
    const uint64_t n_seq = s->tables->size / (4 * (uint64_t)(s->max_blocks > 0 ? s->max_blocks : 1));
    if (!bad && (n_seq < 1 || n_seq > UINT32_MAX))
        bad = "the block tables must hold at least one sequence's";
    if (bad)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan W2A8 q, k, v (%d + %d heads of %d, %lld rows): %s",
                            s->n_head, s->n_kv, s->head_dim, (long long)rows, bad);
    const matvec_params p = {(uint32_t)n,
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
                             (uint32_t)n_seq,
                             (uint32_t)s->cache_rows,
                             (uint32_t)s->layer_off};
    bn_vk_buffer *const buffers[N_BUFFERS] = {w,         x,  q, act_scales, s->info,
                                              s->tables, s->cs, s->k_cache, s->v_cache};
    return bn_vk_dispatch_groups(vk, kernel, buffers, &p, groups_for(kernel, qkv_groups(s), rows),
                                 err);
}
