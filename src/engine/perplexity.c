/* Perplexity of a text under the engine's model (engine.h describes the
 * chunking rule). The logits of each chunk come from the backend in
 * batches of positions, so memory stays bounded whatever the context. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "tokenizer.h"

/* Logits held at once: up to this many floats (64 MiB), and at least 16
 * positions' worth. Larger batches mean fewer, more efficient passes. */
#define PPL_LOGIT_FLOATS ((int64_t)16 << 20)
#define PPL_MIN_BATCH 16

/* -log softmax(logits)[target], in double. Non-finite logits make it NaN. */
static double token_nll(const float *logits, int64_t vocab, int32_t target)
{
    double max = -INFINITY;
    for (int64_t i = 0; i < vocab; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - max);
    return max + log(sum) - (double)logits[target];
}

bn_status bn_engine_perplexity(bn_engine *e, const char *text, size_t len, int64_t ctx,
                               bn_perplexity_progress_fn progress, void *progress_ctx,
                               bn_perplexity_result *out, bn_error *err)
{
    memset(out, 0, sizeof *out);
    const bn_checkpoint *model = bn_engine_model(e);
    const bn_tokenizer *tok = bn_checkpoint_tokenizer(model);
    if (!tok)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "use a GGUF file with tokenizer metadata or a directory with "
                            "tokenizer.json",
                            "this model has no tokenizer, so it cannot read a text");
    if (ctx < 2 || ctx > bn_engine_n_ctx(e))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "the context must be from 2 to %lld positions (the engine's), not "
                            "%lld",
                            (long long)bn_engine_n_ctx(e), (long long)ctx);

    int32_t *ids = NULL;
    size_t n_ids = 0;
    bn_status st = bn_tokenize(tok, text, len, false, false, &ids, &n_ids, err);
    if (st != BN_OK)
        return st;
    const int32_t bos = bn_tokenizer_bos(tok);
    /* With BOS every token of the text is predicted; without, each chunk's
     * first token is context only, so a text needs two tokens. */
    if (n_ids < (bos >= 0 ? 1u : 2u)) {
        free(ids);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "give a longer text",
                            "the text has %zu tokens: too few to score", n_ids);
    }

    const int64_t vocab = bn_checkpoint_hparams(model)->vocab;
    const int64_t piece = bos >= 0 ? ctx - 1 : ctx;
    const int64_t n_chunks = ((int64_t)n_ids + piece - 1) / piece;
    int64_t batch = PPL_LOGIT_FLOATS / vocab;
    batch = batch < PPL_MIN_BATCH ? PPL_MIN_BATCH : batch > ctx ? ctx : batch;
    int32_t *chunk = malloc((size_t)ctx * sizeof *chunk);
    float *logits = malloc((size_t)batch * (size_t)vocab * sizeof *logits);
    if (!chunk || !logits) {
        free(ids);
        free(chunk);
        free(logits);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "use a smaller context",
                            "no memory for %lld x %lld logits", (long long)batch,
                            (long long)vocab);
    }

    const double t0 = bn_time_seconds();
    double nll_sum = 0.0;
    out->ctx = ctx;
    out->n_text_tokens = (int64_t)n_ids;
    for (int64_t c = 0; c < n_chunks && st == BN_OK; c++) {
        const int64_t first = c * piece;
        const int64_t take = (int64_t)n_ids - first < piece ? (int64_t)n_ids - first : piece;
        int64_t n = 0;
        if (bos >= 0)
            chunk[n++] = bos;
        memcpy(chunk + n, ids + first, (size_t)take * sizeof *chunk);
        n += take;
        /* Position p's logits predict chunk[p + 1]; the last position
         * predicts nothing and is not run. */
        for (int64_t pos = 0; pos < n - 1 && st == BN_OK; pos += batch) {
            const int64_t m = n - 1 - pos < batch ? n - 1 - pos : batch;
            st = bn_engine_forward_logits(e, chunk, pos, m, logits, err);
            for (int64_t r = 0; r < m && st == BN_OK; r++) {
                const double nll = token_nll(logits + r * vocab, vocab, chunk[pos + r + 1]);
                if (!isfinite(nll))
                    st = bn_error_set(err, BN_ERR_FORMAT,
                                      "the model's weights may hold NaN or infinite values",
                                      "the model's logits are not finite at position %lld of "
                                      "chunk %lld",
                                      (long long)(pos + r), (long long)c + 1);
                nll_sum += nll;
                out->n_predicted++;
            }
        }
        if (st != BN_OK)
            break;
        out->n_chunks = c + 1;
        out->mean_nll = nll_sum / (double)out->n_predicted;
        out->perplexity = exp(out->mean_nll);
        out->seconds = bn_time_seconds() - t0;
        if (progress)
            progress(progress_ctx, c + 1, n_chunks, out);
    }
    free(ids);
    free(chunk);
    free(logits);
    return st;
}
