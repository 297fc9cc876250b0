/*
 * model_slice.c - one rank's part of a model for tensor parallelism
 * (bn_checkpoint_slice in model.h).
 *
 * The split is Megatron-LM's: a layer's attention heads and FFN columns
 * are divided into equal runs, one per rank. A rank computes its heads'
 * q, k, v (rows of Wq, Wk, Wv), their attention and its part of Wo's
 * product (Wo's columns for those heads); likewise its FFN columns of
 * gate and up and its part of down. The partial products of Wo and down
 * summed over the ranks are the whole model's (an all-reduce), and the
 * attn_sub / ffn_sub norms, whose inputs are now split, need only their
 * rows' sum of squares and largest magnitude from every rank.
 *
 * A grouped-query model keeps whole groups together: the kv heads are
 * dealt out as evenly as they go (2B-4T's 5 over 2 ranks: 3 and 2), each
 * with the q heads that read it, so every slice is a model of uniform
 * groups; the FFN columns likewise. Ranks may hold unequal shares.
 */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

/* Rank r's run of `total` things split `count` ways as evenly as can be:
 * [total r / count, total (r + 1) / count). */
static void share(int64_t total, int rank, int count, int64_t *first, int64_t *n)
{
    *first = total * rank / count;
    *n = total * (rank + 1) / count - *first;
}

/* The rank's run of rows (or, for o and down, columns) of projection
 * `which`: [first, first + count) of the parent's n (or k). */
typedef struct slice_cut {
    bool columns;
    int64_t first, count;
} slice_cut;

static slice_cut cut_of(const bn_hparams *parent, bn_proj which, int rank, int ranks)
{
    const int64_t group = parent->n_head / parent->n_head_kv, hd = parent->head_dim;
    int64_t kv0, n_kv, f0, n_f;
    share(parent->n_head_kv, rank, ranks, &kv0, &n_kv);
    share(parent->ffn, rank, ranks, &f0, &n_f);
    slice_cut c = {false, 0, 0};
    switch (which) {
    case BN_PROJ_Q: c = (slice_cut){false, kv0 * group * hd, n_kv * group * hd}; break;
    case BN_PROJ_K:
    case BN_PROJ_V: c = (slice_cut){false, kv0 * hd, n_kv * hd}; break;
    case BN_PROJ_O: c = (slice_cut){true, kv0 * group * hd, n_kv * group * hd}; break;
    case BN_PROJ_GATE:
    case BN_PROJ_UP: c = (slice_cut){false, f0, n_f}; break;
    case BN_PROJ_DOWN: c = (slice_cut){true, f0, n_f}; break;
    default: break;
    }
    return c;
}

bn_status bn_checkpoint_slice_codes(const bn_checkpoint *m, int layer, bn_proj which,
                                    int8_t *codes, float *scale, bn_error *err)
{
    const bn_checkpoint *parent = m->parent;
    int64_t n, k;
    bn_hparams_proj_shape(&parent->hp, which, &n, &k);
    const slice_cut c = cut_of(&parent->hp, which, m->slice_rank, m->slice_count);
    int8_t *whole = malloc((size_t)(n * k));
    if (!whole)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "no host memory to unpack a %lld x %lld projection", (long long)n,
                            (long long)k);
    bn_status st = bn_checkpoint_projection_codes(parent, layer, which, whole, scale, err);
    if (st == BN_OK && c.columns) {
        for (int64_t r = 0; r < n; r++)
            memcpy(codes + r * c.count, whole + r * k + c.first, (size_t)c.count);
    } else if (st == BN_OK) {
        memcpy(codes, whole + c.first * k, (size_t)(c.count * k));
    }
    free(whole);
    return st;
}

/* Copies the rank's part of a split norm (the columns of o or down it
 * feeds), or the whole of another. */
static void copy_norm(bn_checkpoint *m, const bn_checkpoint *parent, int layer, bn_norm which)
{
    const int64_t size = bn_hparams_norm_size(&m->hp, which);
    const float *src = bn_checkpoint_norm(parent, layer, which);
    int64_t first = 0;
    if (which == BN_NORM_ATTN_SUB || which == BN_NORM_FFN_SUB)
        first = cut_of(&parent->hp, which == BN_NORM_ATTN_SUB ? BN_PROJ_O : BN_PROJ_DOWN,
                       m->slice_rank, m->slice_count)
                    .first;
    memcpy(bn_checkpoint_norm_slot(m, layer, which), src + first, (size_t)size * sizeof(float));
}

bn_status bn_checkpoint_slice(const bn_checkpoint *parent, int rank, int count,
                              bn_checkpoint **out, bn_error *err)
{
    *out = NULL;
    if (!parent || count < 1 || rank < 0 || rank >= count)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "a slice needs a model and 0 <= rank < count (rank %d of %d)", rank,
                            count);
    const bn_hparams *ph = &parent->hp;
    if (ph->n_head_kv < count || ph->ffn < count)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "choose a tensor-parallel size of at most the kv head count",
                            "this model (%d heads over %d kv heads, ffn %d) cannot be split %d "
                            "ways: each rank needs a kv head of its own",
                            (int)ph->n_head, (int)ph->n_head_kv, (int)ph->ffn, count);
    bn_hparams hp = *ph;
    const slice_cut k = cut_of(ph, BN_PROJ_K, rank, count);
    const slice_cut f = cut_of(ph, BN_PROJ_GATE, rank, count);
    hp.n_head_kv = (int32_t)(k.count / ph->head_dim);
    hp.n_head = hp.n_head_kv * (ph->n_head / ph->n_head_kv);
    hp.ffn = (int32_t)f.count;
    bn_checkpoint *m;
    bn_status st = bn_checkpoint_alloc(&hp, &m, err);
    if (st != BN_OK)
        return st;
    m->parent = parent;
    m->slice_rank = rank;
    m->slice_count = count;
    m->embedding = parent->embedding;
    m->lm_head = parent->lm_head;
    m->seed = parent->seed;
    m->weight_bytes = parent->weight_bytes / (uint64_t)count;
    for (int l = 0; l < hp.n_layer; l++) {
        for (int p = 0; p < BN_PROJ_COUNT; p++) {
            const bn_proj_tensor *src = &parent->proj[(size_t)l * BN_PROJ_COUNT + (size_t)p];
            bn_proj_tensor *t = bn_checkpoint_proj_slot(m, l, (bn_proj)p);
            *t = *src;
            t->source = BN_PROJ_SRC_SLICE;
            t->extra_scale = 1.0f; /* the parent's codes come with its whole scale */
            bn_hparams_proj_shape(&hp, (bn_proj)p, &t->n, &t->k);
        }
        for (int w = 0; w < BN_NORM_COUNT; w++)
            copy_norm(m, parent, l, (bn_norm)w);
    }
    memcpy(bn_checkpoint_output_norm_slot(m), bn_checkpoint_output_norm(parent),
           (size_t)hp.dim * sizeof(float));
    *out = m;
    return BN_OK;
}

const bn_hparams *bn_checkpoint_whole_hparams(const bn_checkpoint *m)
{
    return m->parent ? &m->parent->hp : &m->hp;
}
