/*
 * logprobs.c - the log-probabilities a generation reports
 * (bn_generate_params.on_logprobs): the log-softmax of a position's logits
 * as the model gave them, before the sampler's settings change anything.
 * NaN logits count as -inf; where some logits are +inf, those tokens share
 * the probability (as the sampler has it) and the others have none.
 */
#include <math.h>

#include "engine_internal.h"

/* Whether a (logit, id) ranks before b: higher logit, then lower id. */
static bool ranks_before(float la, int32_t a, float lb, int32_t b)
{
    return la > lb || (la == lb && a < b);
}

void engine_logprobs_report(const float *raw, int32_t vocab, int32_t chosen, int n_top,
                            bn_logprob_callback cb, void *ctx)
{
    if (n_top < 0)
        n_top = 0;
    if (n_top > BN_MAX_TOP_LOGPROBS)
        n_top = BN_MAX_TOP_LOGPROBS;
    if (n_top > vocab)
        n_top = vocab;
    float mx = -INFINITY;
    int32_t n_pinf = 0;
    for (int32_t i = 0; i < vocab; i++) {
        if (raw[i] > mx)
            mx = raw[i];
        n_pinf += raw[i] == INFINITY;
    }
    double lse = -INFINITY;
    if (n_pinf > 0) {
        lse = INFINITY;
    } else if (mx > -INFINITY) {
        double sum = 0.0;
        for (int32_t i = 0; i < vocab; i++)
            if (raw[i] > -INFINITY)
                sum += exp((double)raw[i] - (double)mx);
        lse = (double)mx + log(sum);
    }
    /* log p of a logit under that normaliser. */
#define LOGPROB(x)                                                                           \
    (n_pinf > 0 ? ((x) == INFINITY ? (float)-log((double)n_pinf) : -INFINITY)                 \
                : (isnan(x) || lse == -INFINITY ? -INFINITY : (float)((double)(x) - lse)))
    /* The n_top best, by insertion: n_top is at most 20. */
    bn_token_logprob top[BN_MAX_TOP_LOGPROBS];
    float top_logit[BN_MAX_TOP_LOGPROBS];
    int n = 0;
    for (int32_t i = 0; i < vocab && n_top > 0; i++) {
        const float x = isnan(raw[i]) ? -INFINITY : raw[i];
        if (n == n_top && !ranks_before(x, i, top_logit[n - 1], top[n - 1].token))
            continue;
        int at = n < n_top ? n++ : n - 1;
        while (at > 0 && ranks_before(x, i, top_logit[at - 1], top[at - 1].token)) {
            top[at] = top[at - 1];
            top_logit[at] = top_logit[at - 1];
            at--;
        }
        top[at].token = i;
        top_logit[at] = x;
    }
    for (int k = 0; k < n; k++)
        top[k].logprob = LOGPROB(top_logit[k]);
    const float c = chosen >= 0 && chosen < vocab ? raw[chosen] : NAN;
    cb(ctx, chosen, LOGPROB(c), top, n);
#undef LOGPROB
}
