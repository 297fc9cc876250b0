/*
 * sampler.h - choosing the next token from logits.
 *
 * Order of operations: repetition penalty over the last repeat_last_n
 * tokens (positive logits divided by the penalty, negative ones
 * multiplied, each distinct token once), then greedy when temperature <= 0;
 * otherwise top-k, temperature, softmax, top-p, min-p, and a draw from the
 * sampler's own PRNG (seeded; identical sequences for identical seeds on
 * any machine and thread count). This is Hugging Face transformers' order;
 * llama.cpp's default chain differs in one place: it applies temperature
 * last, so its top-p and min-p see the temperature-1 distribution.
 * NaN logits are never chosen; when every logit is -inf or NaN there is
 * no result (BN_SAMPLER_NO_TOKEN).
 */
#ifndef BN_SAMPLER_H
#define BN_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

typedef struct bn_sampler_params {
    float temperature;   /* <= 0: greedy (default 0.8 in the CLI) */
    int top_k;           /* <= 0: off */
    float top_p;         /* >= 1: off */
    float min_p;         /* <= 0: off */
    float repeat_penalty;/* 1: off */
    int repeat_last_n;   /* tokens of history the penalty looks at; 0: off, < 0: all */
    uint64_t seed;
} bn_sampler_params;

void bn_sampler_params_default(bn_sampler_params *p); /* greedy, penalties off */

typedef struct bn_sampler bn_sampler;

/* bn_sampler_sample's answer when every logit is NaN or -inf (the GPU's
 * samplers answer the same, sample_cuda.h). */
#define BN_SAMPLER_NO_TOKEN (-1)

bn_status bn_sampler_create(const bn_sampler_params *p, int32_t vocab_size, bn_sampler **out,
                            bn_error *err);
void bn_sampler_free(bn_sampler *s);
/* Picks a token. logits (vocab_size floats) may be modified. history holds
 * the tokens so far (prompt and generated), oldest first. NaN logits are
 * never chosen. Returns BN_SAMPLER_NO_TOKEN when no token can be chosen
 * (every logit NaN or -inf after the penalty: the model's numbers broke
 * down, and any pick would be garbage; the caller reports it), and the
 * same when s or logits is NULL. */
int32_t bn_sampler_sample(bn_sampler *s, float *logits, const int32_t *history, size_t n_history);
/* Re-seeds (for a new request). */
void bn_sampler_reset(bn_sampler *s, uint64_t seed);
/* For a device that samples itself (cuda_backend.h, forward_sample): the
 * uniform number in [0, 1) the next sampled pick would draw, leaving the
 * stream as it is; bn_sampler_skip then uses it up, as that pick would. A
 * sampled pick (temperature > 0) draws exactly one number; a greedy pick
 * draws none. */
double bn_sampler_next_uniform(const bn_sampler *s);
/* The number `ahead` draws after that one (0: bn_sampler_next_uniform), for
 * a pick queued before the ones before it are used up; the stream is left
 * as it is. */
double bn_sampler_uniform_ahead(const bn_sampler *s, int ahead);
void bn_sampler_skip(bn_sampler *s);

#endif
