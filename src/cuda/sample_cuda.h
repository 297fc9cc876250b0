/*
 * sample_cuda.h - choosing the next token on the GPU (sample_kernels.cu),
 * for one row of vocab logits, with the CPU sampler's semantics
 * (src/model/sampler.h) minus the repetition penalty:
 *
 *   - NaN logits are never chosen; if any logit is +inf, the +inf tokens
 *     share all the probability equally; when every logit is -inf or NaN
 *     no token can be chosen: the token is -1;
 *   - temperature <= 0: argmax, lowest index on ties;
 *   - otherwise top-k (best first: higher logit, then lower index),
 *     w = exp((logit - max) / T) rounded to float, z = sum of w (double),
 *     min-p (keep w >= min(min_p, 1), w > 0), top-p (shortest best-first
 *     prefix whose weight reaches top_p * z), then the inverse-CDF draw:
 *     the first kept token, in that order, whose cumulative weight
 *     (double) exceeds u * total.
 *
 * Given the same logits, parameters and uniform number u, the token equals
 * bn_sampler_sample's (the CPU sampler draws u itself; here the caller
 * supplies it). The one source of difference is exp: the GPU rounds a
 * double-precision exp to float, the CPU calls libm's expf; both are
 * within about half an ulp of exact, so a draw can differ only when u
 * lands within ~1e-7 (relative) of a boundary between two tokens.
 *
 * The top-k set is limited to BN_CUDA_SAMPLE_MAX_K tokens. Top-k "off"
 * (top_k <= 0 or >= vocab) is accepted only for vocabularies of at most
 * BN_CUDA_SAMPLE_MAX_K tokens; otherwise the launcher returns
 * cudaErrorInvalidValue and the caller samples on the CPU.
 *
 * Everything the kernels read or write is device memory (logits, u,
 * workspace, token), so the launches can be captured in a CUDA graph; the
 * optional host copy (h_token, which should be pinned) is an async copy on
 * the same stream. Launches are asynchronous and return the launch error.
 */
#ifndef BN_SAMPLE_CUDA_H
#define BN_SAMPLE_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BN_CUDA_SAMPLE_MAX_K 64
/* The longest candidate list bn_cuda_sample_cand reads. */
#define BN_CUDA_SAMPLE_MAX_CAND 4096
/* Largest vocabulary the selection handles. */
#define BN_CUDA_SAMPLE_MAX_VOCAB (1 << 20)

typedef struct bn_cuda_sample_params {
    float temperature; /* <= 0: greedy                               */
    int top_k;         /* 1 .. BN_CUDA_SAMPLE_MAX_K (see above)       */
    float top_p;       /* >= 1: off                                   */
    float min_p;       /* <= 0: off                                   */
} bn_cuda_sample_params;

/* Device workspace for any of the launchers below, for any vocabulary up
 * to `vocab` (32 KiB). Zero it once (cudaMemset) before its first use: its
 * last word is a counter the top-k launch's blocks count themselves on,
 * which the launch leaves at zero again. One launch at a time may use a
 * workspace. */
size_t bn_cuda_sample_workspace_bytes(int32_t vocab);

/* Greedy: *d_token = argmax (lowest index on ties, NaN never chosen, -1
 * when every logit is -inf or NaN); also copied to h_token when not NULL. */
cudaError_t bn_cuda_sample_greedy(const float *logits, int32_t vocab, void *workspace,
                                  int32_t *d_token, int32_t *h_token, cudaStream_t stream);

/* The full sampler (greedy when p->temperature <= 0). d_uniform: one
 * double in [0, 1) in device memory (a float value converts exactly).
 *
 * Candidate list: cand_n (device memory) keys of sample_key.cuh in cand
 * that hold every token that can be among the top-k (the others' logits
 * are below all of them, e.g. -inf from the screened LM head, whose exact
 * pass writes the list: cuda_backend_kernels.h). When *cand_n <= cand_cap
 * (at most BN_CUDA_SAMPLE_MAX_CAND) the sampler's top-k reads only the
 * list, one block over a few hundred keys instead of a pass over the
 * vocabulary; else (the list overflowed) it reads the logits. The token is
 * the same either way. cand_n NULL: no list, the logits are read.
 * cand_floor (device memory, may be NULL): a value that the top-k's logits
 * all reach (the exact pass's threshold), so that only listed keys at or
 * above it are ranked. */
cudaError_t bn_cuda_sample_cand(const float *logits, int32_t vocab, const uint64_t *cand,
                                const unsigned *cand_n, int cand_cap, const float *cand_floor,
                                const bn_cuda_sample_params *p, const double *d_uniform,
                                void *workspace, int32_t *d_token, int32_t *h_token,
                                cudaStream_t stream);

/* bn_cuda_sample_cand with the parameters read on the device, from d_p
 * (device memory) when the kernel runs, so that one captured launch serves
 * every request: a graph replays it with whatever the caller wrote there
 * last. The caller checks them as bn_cuda_sample_cand would: temperature
 * > 0 and finite, top_p and min_p not NaN, top-k within the limits above.
 * Parameters outside them give *d_token = -1 (temperature <= 0 included:
 * greedy is bn_cuda_sample_greedy's). No host copy: the caller copies
 * d_token. */
cudaError_t bn_cuda_sample_cand_dev(const float *logits, int32_t vocab, const uint64_t *cand,
                                    const unsigned *cand_n, int cand_cap,
                                    const float *cand_floor, const bn_cuda_sample_params *d_p,
                                    const double *d_uniform, void *workspace, int32_t *d_token,
                                    cudaStream_t stream);

/* The token of each of n_rows rows (row k: logits + k * ld), every row by
 * its own parameters d_p[k] and uniform number d_u[k] (device memory), as
 * bn_cuda_sample_cand would pick it without a candidate list: greedy rows
 * (temperature <= 0) by the argmax, the others by top-k and the draw;
 * parameters bn_cuda_sample_cand refuses give -1. workspace: n_rows times
 * bn_cuda_sample_workspace_bytes(vocab), zeroed once before its first use
 * (as for the one-row launchers). any_sampled: whether some row may be
 * sampled (0: only the argmax kernel is launched). */
cudaError_t bn_cuda_sample_rows(const float *logits, int64_t ld, int32_t vocab, int n_rows,
                                const bn_cuda_sample_params *d_p, const double *d_u,
                                void *workspace, int any_sampled, int32_t *d_tokens,
                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
