/*
 * cuda_backend_sample.c - the choice of a step's token on the device: greedy
 * (the screened head's key or the device argmax) or sampled (top-k / top-p
 * over the screened head's candidates or the logits), the checks of a
 * sampling request, and bn_cuda_backend_forward_sample.
 */
#include "cuda_backend_internal.h"

/* The sampler's uniform number and parameters in the decode inputs the step
 * being queued reads (cb_dec_dev). */
static double *d_uniform(bn_cuda_backend *b)
{
    return (double *)(void *)(cb_dec_dev(b) + DEC_UNIFORM);
}
static bn_cuda_sample_params *d_params(bn_cuda_backend *b)
{
    return (bn_cuda_sample_params *)(void *)(cb_dec_dev(b) + DEC_PARAMS);
}

/* The candidate list a sampler reads (sample_cuda.h): the one a screened
 * head's exact pass wrote, with the floor its top k reach, where sampled
 * passes screen (cb_pass_screens); else none: the sampler reads the
 * logits. */
typedef struct cand_list {
    const uint64_t *keys;
    const unsigned *n;
    const float *floor;
} cand_list;
static cand_list sampler_list(const bn_cuda_backend *b)
{
    const cand_list none = {NULL, NULL, NULL};
    const cand_list listed = {b->d_cand, b->d_cand_n, b->d_cand_floor};
    return cb_pass_screens(b, 1, true) ? listed : none;
}

bool cb_pass_screens(const bn_cuda_backend *b, int top_k, bool sampled)
{
    if (!b->form.head_screen || top_k <= 0)
        return false;
    return b->opt.tp_size <= 1 || (top_k == 1 && !sampled);
}

/* Whether a choice is the greedy one (NULL: greedy). */
bool cb_choice_greedy(const bn_cuda_sample_params *p) { return !p || !(p->temperature > 0.0f); }

/* The token of the pass just queued, chosen by p (NULL: greedy) with the
 * uniform number cb_queue_pass uploaded, handed off and on its way to the
 * host; cb_chosen_token reads it once the stream has reached it. Greedy: with
 * the screened head (every greedy pass when b->form.head_screen) the key its
 * kernels computed, else the device argmax over the logits. Nothing is
 * launched when the pass's graph ended with the choice. */
bn_status cb_queue_choice(bn_cuda_backend *b, const bn_cuda_sample_params *p, bn_error *err)
{
    const bool key = cb_choice_greedy(p) && b->form.head_screen;
    if (!b->choice_in_pass) {
        if (cb_choice_greedy(p) && !b->form.head_screen) {
            BN_CUDA_TRY(err, bn_cuda_sample_greedy(b->logits, b->hp.vocab, b->ws_sample,
                                                   b->d_next, NULL, b->cs));
            b->ran |= 1u << K_ARGMAX;
            cb_count_launches(b, 2); /* sample_kernels.cu: a partial pass and a final one */
        } else if (!cb_choice_greedy(p)) {
            const cand_list l = sampler_list(b);
            BN_CUDA_TRY(err, bn_cuda_sample_cand(b->logits, b->hp.vocab, l.keys, l.n,
                                                 BN_CUDA_SAMPLE_MAX_CAND, l.floor, p, d_uniform(b),
                                                 b->ws_sample, b->d_next, NULL, b->cs));
            b->ran |= 1u << K_SAMPLE;
            cb_count_launches(b, 1); /* sample_kernels.cu: one top-k launch */
        }
        const bn_status st = cb_queue_handoff(b, key, err);
        if (st != BN_OK)
            return st;
    }
    return cb_publish_token(b, key, err);
}

/* The sampler as graph_sample's kernel before the hand-off (captured:
 * capture_graph_once): its parameters and uniform number read from d_dec
 * when it runs, the token left in d_next. */
bn_status cb_queue_sampler(bn_cuda_backend *b, bn_error *err)
{
    const cand_list l = sampler_list(b);
    BN_CUDA_TRY(err, bn_cuda_sample_cand_dev(b->logits, b->hp.vocab, l.keys, l.n,
                                             BN_CUDA_SAMPLE_MAX_CAND, l.floor, d_params(b),
                                             d_uniform(b), b->ws_sample, b->d_next, b->cs));
    b->ran |= 1u << K_SAMPLE;
    b->capture_launches += 1;
    return BN_OK;
}

/* The logits a choice reads (cb_queue_pass's top_k): greedy the largest; the
 * sampler its top-k (every token when top-k is off, which the device
 * allows only for a vocabulary of at most BN_CUDA_SAMPLE_MAX_K). */
static int choice_top_k(const bn_cuda_backend *b, const bn_cuda_sample_params *p)
{
    if (cb_choice_greedy(p))
        return 1;
    return p->top_k >= 1 && p->top_k < b->hp.vocab ? p->top_k : (int)b->hp.vocab;
}

/* The token a step of parity par chose, once the stream is past it; -1
 * when no token could be chosen (every logit NaN or -inf: the engine
 * reports it). */
int32_t cb_chosen_token(bn_cuda_backend *b, bool greedy, int par)
{
    return greedy && b->form.head_screen ? bn_cuda_key_token(*cb_h_key_at(b, par))
                                    : *cb_h_next_at(b, par);
}

/* The pass and the choice of its token by p (NULL: greedy) and u. */
bn_status cb_queue_step(bn_cuda_backend *b, const int32_t *tokens, int64_t n, int64_t pos,
                        const bn_cuda_sample_params *p, double u, bool chained,
                        bn_error *err)
{
    const bn_status st = cb_queue_pass(b, tokens, n, pos, choice_top_k(b, p), u,
                                       cb_choice_greedy(p) ? NULL : p, chained, err);
    return st == BN_OK ? cb_queue_choice(b, p, err) : st;
}

bool bn_cuda_backend_sample_supported(const bn_cuda_backend *b, const bn_cuda_sample_params *p)
{
    if (!b || cb_choice_greedy(p))
        return b != NULL;
    /* sample_cuda.h: top-k of at most BN_CUDA_SAMPLE_MAX_K tokens, or off
     * only for a vocabulary that small. */
    const int32_t V = b->hp.vocab;
    return (p->top_k >= 1 && p->top_k <= BN_CUDA_SAMPLE_MAX_K) || V <= BN_CUDA_SAMPLE_MAX_K;
}

/* A sampling request the device can serve, with u in [0, 1). */
_Static_assert(BN_CUDA_SAMPLE_MAX_K == 64, "cb_check_choice's hint names the limit");
bn_status cb_check_choice(const bn_cuda_backend *b, const bn_cuda_sample_params *p, double u,
                          bn_error *err)
{
    if (cb_choice_greedy(p))
        return BN_OK;
    if (!bn_cuda_backend_sample_supported(b, p))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "use a top-k of 1 to 64, or sample on the host",
                            "the device sampler needs a top-k of 1 to %d for a vocabulary of %d "
                            "(top-k %d asked)",
                            BN_CUDA_SAMPLE_MAX_K, (int)b->hp.vocab, p->top_k);
    if (!(u >= 0.0 && u < 1.0))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "the sampler's uniform number must be in [0, 1) (got %g)", u);
    return BN_OK;
}

bn_status bn_cuda_backend_forward_sample(bn_cuda_backend *b, const int32_t *tokens,
                                         int64_t n_tokens, int64_t pos,
                                         const bn_cuda_sample_params *p, double u, int32_t *next,
                                         bn_error *err)
{
    if (!b || !next)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda forward: NULL argument");
    const bool greedy = cb_choice_greedy(p);
    bn_status st = cb_check_request(b, tokens, n_tokens, pos, err);
    if (st == BN_OK)
        st = cb_check_choice(b, p, u, err);
    if (st == BN_OK)
        st = cb_begin_call(b, err);
    if (st != BN_OK)
        return st;
    st = cb_queue_step(b, tokens, n_tokens, pos, p, u, false, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
    if (st != BN_OK)
        return cb_fail_pass(b, pos, st);
    *next = cb_chosen_token(b, greedy, 0);
    b->kv_filled = pos + n_tokens;
    return BN_OK;
}

bn_status bn_cuda_backend_forward_greedy(bn_cuda_backend *b, const int32_t *tokens,
                                         int64_t n_tokens, int64_t pos, int32_t *next,
                                         bn_error *err)
{
    return bn_cuda_backend_forward_sample(b, tokens, n_tokens, pos, NULL, 0.0, next, err);
}
