/* vk_head_screen.c - the screened LM head on a Vulkan device
 * (vk_head_screen.h): the int8 copy built on the host and uploaded, the
 * stages of shaders/head_screen.glsl recorded, and the greedy rule over
 * their candidates. */
#include "vk_head_screen.h"

#include <math.h>
#include <stdlib.h>

#include "sampler.h"
#include "threadpool.h"

extern const unsigned char bn_vk_spv_head_screen_quantize[], bn_vk_spv_head_screen_bounds[],
    bn_vk_spv_head_screen_bounds_dot[], bn_vk_spv_head_screen_select[],
    bn_vk_spv_head_screen_logits[];
extern const size_t bn_vk_spv_head_screen_quantize_len, bn_vk_spv_head_screen_bounds_len,
    bn_vk_spv_head_screen_bounds_dot_len, bn_vk_spv_head_screen_select_len,
    bn_vk_spv_head_screen_logits_len;

#define BOUNDS_ROWS 32   /* rows a bounds workgroup: head_screen.glsl's ROWS */
#define SELECT_GROUPS 64 /* workgroups of the select stage, at most          */
#define LOGITS_GROUPS 64 /* workgroups of the logits stage (a row each in turn) */
#define MAX_DIM 65536    /* the integer sums stay within int32 (dim 127^2)  */
#define STAGE_BUFFERS 10

struct bn_vk_head_screen {
    int64_t vocab, dim, lda;
    uint32_t n_slots;
    bn_vk_buffer codes, scale, err, y, stat, hi, slots, result;
    bn_vk_kernel *quantize, *bounds, *select, *logits;
    uint64_t bytes;
};

/* The stages' push constants (head_screen.glsl). */
typedef struct screen_params {
    uint32_t vocab, dim, lda, n_slots, f16;
} screen_params;

bool bn_vk_head_screen_fits(const bn_vk *vk, int64_t dim)
{
    return bn_vk_device(vk)->fp64 && dim > 0 && dim % 8 == 0 && dim <= MAX_DIM;
}

/* ---- the int8 copy, on the host's threads ---------------------------------- */

typedef struct fill_job {
    bn_head_screen *copy;
    bn_head_row_fn row;
    void *ctx;
    bool failed;
} fill_job;

static void fill_rows(void *ctx, int64_t begin, int64_t end)
{
    fill_job *job = ctx;
    float *scratch = malloc((size_t)job->copy->dim * sizeof *scratch);
    if (!scratch) {
        job->failed = true; /* the caller tells: one flag, only ever set */
        return;
    }
    bn_head_screen_fill(job->copy, begin, end, job->row, job->ctx, scratch);
    free(scratch);
}

static bn_status build_copy(bn_head_screen *copy, int64_t vocab, int64_t dim, bn_head_row_fn row,
                            void *ctx, int threads, bn_error *err)
{
    bn_status st = bn_head_screen_alloc(copy, vocab, dim, err);
    if (st != BN_OK)
        return st;
    bn_threadpool *pool = NULL;
    st = bn_threadpool_create(threads, &pool, err);
    if (st != BN_OK)
        return st;
    fill_job job = {copy, row, ctx, false};
    bn_threadpool_run(pool, vocab, 256, fill_rows, &job);
    bn_threadpool_destroy(pool);
    if (job.failed)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "no memory to build the LM head's int8 copy");
    return BN_OK;
}

/* ---- on the device ------------------------------------------------------------ */

static bn_status make_buffer(bn_vk_head_screen *s, bn_vk *vk, uint64_t bytes, bn_vk_buffer *b,
                             bn_error *err)
{
    const bn_status st = bn_vk_buffer_create(vk, bytes, b, err);
    if (st == BN_OK)
        s->bytes += bytes;
    return st;
}

static bn_status make_kernels(bn_vk *vk, bn_vk_head_screen *s, bn_error *err)
{
    const bool dot = bn_vk_device(vk)->integer_dot_product;
    bn_status st = bn_vk_kernel_create(vk, "head_screen_quantize", bn_vk_spv_head_screen_quantize,
                                       bn_vk_spv_head_screen_quantize_len, STAGE_BUFFERS,
                                       sizeof(screen_params), &s->quantize, err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(
            vk, "head_screen_bounds",
            dot ? bn_vk_spv_head_screen_bounds_dot : bn_vk_spv_head_screen_bounds,
            dot ? bn_vk_spv_head_screen_bounds_dot_len : bn_vk_spv_head_screen_bounds_len,
            STAGE_BUFFERS, sizeof(screen_params), &s->bounds, err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(vk, "head_screen_select", bn_vk_spv_head_screen_select,
                                 bn_vk_spv_head_screen_select_len, STAGE_BUFFERS,
                                 sizeof(screen_params), &s->select, err);
    if (st == BN_OK)
        st = bn_vk_kernel_create(vk, "head_screen_logits", bn_vk_spv_head_screen_logits,
                                 bn_vk_spv_head_screen_logits_len, STAGE_BUFFERS,
                                 sizeof(screen_params), &s->logits, err);
    return st;
}

bn_status bn_vk_head_screen_create(bn_vk *vk, int64_t vocab, int64_t dim, bn_head_row_fn row,
                                   void *ctx, int threads, bn_vk_head_screen **out, bn_error *err)
{
    *out = NULL;
    if (!bn_vk_head_screen_fits(vk, dim) || vocab < 1 || vocab > INT32_MAX)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: a head of %lld x %lld cannot be screened on %s (fp64, a "
                            "width that is a multiple of 8 up to %d)",
                            (long long)vocab, (long long)dim, bn_vk_device(vk)->name, MAX_DIM);
    bn_vk_head_screen *s = calloc(1, sizeof *s);
    if (!s)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the screened head");
    bn_head_screen copy;
    bn_status st = build_copy(&copy, vocab, dim, row, ctx, threads, err);
    s->vocab = vocab;
    s->dim = dim;
    s->lda = copy.lda;
    s->n_slots = (uint32_t)((vocab + BOUNDS_ROWS - 1) / BOUNDS_ROWS);
    const uint64_t V = (uint64_t)vocab;
    const struct {
        bn_vk_buffer *b;
        uint64_t bytes;
        const void *data; /* uploaded, or NULL */
    } list[] = {
        {&s->codes, V * (uint64_t)copy.lda, copy.codes},
        {&s->scale, V * sizeof(float), copy.scale},
        {&s->err, V * sizeof(double), copy.err},
        {&s->y, 2 * (uint64_t)copy.lda, NULL},
        {&s->stat, 4 * sizeof(double), NULL},
        {&s->hi, V * sizeof(double), NULL},
        {&s->slots, (uint64_t)s->n_slots * sizeof(double), NULL},
        {&s->result, BN_VK_SCREEN_RESULT_BYTES, NULL},
    };
    for (size_t i = 0; i < sizeof list / sizeof list[0] && st == BN_OK; i++) {
        st = make_buffer(s, vk, list[i].bytes, list[i].b, err);
        if (st == BN_OK && list[i].data)
            st = bn_vk_write(vk, list[i].b, list[i].data, (size_t)list[i].bytes, err);
    }
    bn_head_screen_free(&copy);
    if (st == BN_OK)
        st = make_kernels(vk, s, err);
    if (st != BN_OK) {
        bn_vk_head_screen_free(vk, s);
        return st;
    }
    *out = s;
    return BN_OK;
}

void bn_vk_head_screen_free(bn_vk *vk, bn_vk_head_screen *s)
{
    if (!s)
        return;
    bn_vk_buffer *const buffers[] = {&s->codes, &s->scale, &s->err,   &s->y,
                                     &s->stat,  &s->hi,    &s->slots, &s->result};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        bn_vk_buffer_free(vk, buffers[i]);
    bn_vk_kernel *const kernels[] = {s->quantize, s->bounds, s->select, s->logits};
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (kernels[i])
            bn_vk_kernel_free(vk, kernels[i]);
    free(s);
}

uint64_t bn_vk_head_screen_bytes(const bn_vk_head_screen *s) { return s ? s->bytes : 0; }

bn_status bn_vk_head_screen_record(bn_vk *vk, bn_vk_head_screen *s, bn_vk_buffer *head,
                                   bn_vk_head_type type, bn_vk_buffer *x, bn_vk_buffer *dst,
                                   size_t dst_at, bn_error *err)
{
    const uint64_t head_words =
        (uint64_t)s->vocab * (uint64_t)s->dim / (type == BN_VK_HEAD_F16 ? 2 : 1);
    if ((type != BN_VK_HEAD_F16 && type != BN_VK_HEAD_F32) || head->size / 4 < head_words ||
        x->size < (VkDeviceSize)s->dim * sizeof(float) ||
        dst->size < dst_at + BN_VK_SCREEN_RESULT_BYTES)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan screened head: the head (%lld x %lld), x or the result's "
                            "destination does not fit its buffer",
                            (long long)s->vocab, (long long)s->dim);
    const screen_params p = {(uint32_t)s->vocab, (uint32_t)s->dim, (uint32_t)s->lda, s->n_slots,
                             type == BN_VK_HEAD_F16};
    bn_vk_buffer *const stages[STAGE_BUFFERS] = {x,       &s->y,  &s->stat,  &s->codes,  &s->scale,
                                                 &s->err, &s->hi, &s->slots, &s->result, head};
    const uint64_t select = ((uint64_t)s->vocab + 255) / 256;
    bn_status st = bn_vk_dispatch(vk, s->quantize, stages, &p, 1, 1, err);
    if (st == BN_OK)
        st = bn_vk_dispatch_groups(vk, s->bounds, stages, &p, s->n_slots, err);
    if (st == BN_OK)
        st = bn_vk_dispatch_groups(vk, s->select, stages, &p,
                                   select < SELECT_GROUPS ? select : SELECT_GROUPS, err);
    if (st == BN_OK)
        st = bn_vk_dispatch_groups(vk, s->logits, stages, &p, LOGITS_GROUPS, err);
    if (st == BN_OK)
        st = bn_vk_copy_record(vk, &s->result, 0, dst, dst_at, BN_VK_SCREEN_RESULT_BYTES, err);
    return st;
}

/* ---- the pick ------------------------------------------------------------------ */

int32_t bn_vk_greedy_pick(const float *logits, const uint32_t *rows, int64_t n)
{
    int64_t best = -1, inf_at = -1;
    for (int64_t k = 0; k < n; k++) {
        const float v = logits[k];
        const int64_t tok = rows ? (int64_t)rows[k] : k;
        if (isnan(v))
            continue;
        if (v == INFINITY) {
            if (inf_at < 0 || tok < (rows ? (int64_t)rows[inf_at] : inf_at))
                inf_at = k;
            continue;
        }
        if (v == -INFINITY)
            continue;
        const int64_t best_tok = best < 0 ? -1 : rows ? (int64_t)rows[best] : best;
        if (best < 0 || v > logits[best] || (v == logits[best] && tok < best_tok))
            best = k;
    }
    const int64_t k = inf_at >= 0 ? inf_at : best;
    if (k < 0)
        return BN_SAMPLER_NO_TOKEN;
    return (int32_t)(rows ? rows[k] : k);
}

bool bn_vk_head_screen_pick(const uint32_t *result, int32_t *token)
{
    const uint32_t n = result[0];
    if (n > BN_VK_SCREEN_CAP)
        return false;
    const uint32_t *rows = result + 1;
    /* The logits' bits, as the shader stored them. */
    const float *logits = (const float *)(const void *)(result + 1 + BN_VK_SCREEN_CAP);
    *token = bn_vk_greedy_pick(logits, rows, n);
    return true;
}
