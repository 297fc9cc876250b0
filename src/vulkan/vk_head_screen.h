/*
 * vk_head_screen.h - a greedy step's token from the LM head on a Vulkan
 * device, reading half the head's bytes: the CPU's screened head
 * (src/kernels/head_screen.h has the design and the bound) with its int8
 * copy made on the host at load (bn_head_screen_fill, on the host's
 * threads) and uploaded, then, every step, four dispatches over the normed
 * hidden state (shaders/head_screen.glsl): quantize it (two int8 codes a value, as the CUDA path's screen, where the
 * CPU's has one), bound every row's logit, list the rows whose upper bound
 * reaches the largest lower one (the candidates), and compute the
 * candidates' exact logits, the LM head's own arithmetic
 * (bn_vk_head_record). The host then takes the greedy rule over them, the
 * other logits -inf: the token the full head's logits give, ties and NaN
 * included. More than BN_VK_SCREEN_CAP candidates (a head or hidden state
 * the bound cannot narrow) leave the pick to the full head.
 *
 * Needs fp64 (the bounds are doubles), the head in one buffer, and a width
 * that is a multiple of 8 and at most 65536 (bn_vk_head_screen_fits).
 */
#ifndef BN_VK_HEAD_SCREEN_H
#define BN_VK_HEAD_SCREEN_H

#include "head_screen.h"
#include "vk_context.h"
#include "vk_ops.h"

#define BN_VK_SCREEN_CAP 4096 /* candidates listed: shaders/head_screen.glsl's CAP */
#define BN_VK_SCREEN_DISPATCHES 4 /* a screen records (bn_vk_head_screen_record) */

/* The result the dispatches leave (uint32 words): the candidate count, the
 * candidates' rows (the first BN_VK_SCREEN_CAP), their logits' bits. */
#define BN_VK_SCREEN_RESULT_BYTES ((size_t)(1 + 2 * BN_VK_SCREEN_CAP) * 4)

typedef struct bn_vk_head_screen bn_vk_head_screen;

/* Whether a head of dim values a row can be screened on this device. */
bool bn_vk_head_screen_fits(const bn_vk *vk, int64_t dim);

/* The int8 copy of a vocab x dim head whose rows, as the head's kernel
 * computes with them, row(ctx, r, out) gives (called from several
 * threads at once), built on `threads` host threads (0: all) and uploaded. */
bn_status bn_vk_head_screen_create(bn_vk *vk, int64_t vocab, int64_t dim, bn_head_row_fn row,
                                   void *ctx, int threads, bn_vk_head_screen **out, bn_error *err);
void bn_vk_head_screen_free(bn_vk *vk, bn_vk_head_screen *s);
/* The device memory it holds. */
uint64_t bn_vk_head_screen_bytes(const bn_vk_head_screen *s);

/* Records the screen of x (dim floats, the normed hidden state) against the
 * head (all vocab rows in one buffer, `type` as bn_vk_head_record takes
 * it) into the open sequence, then the result copied into dst at dst_at
 * (BN_VK_SCREEN_RESULT_BYTES). */
bn_status bn_vk_head_screen_record(bn_vk *vk, bn_vk_head_screen *s, bn_vk_buffer *head,
                                   bn_vk_head_type type, bn_vk_buffer *x, bn_vk_buffer *dst,
                                   size_t dst_at, bn_error *err);

/* The greedy rule (the CPU sampler's: NaN never chosen; the lowest-index
 * +inf if any; else the largest, lowest index on ties; BN_SAMPLER_NO_TOKEN
 * when every logit is -inf or NaN) over n logits, logits[k] being token
 * rows[k]'s (rows NULL: token k's), every other token's -inf. */
int32_t bn_vk_greedy_pick(const float *logits, const uint32_t *rows, int64_t n);

/* The token of a result (as recorded above), or false when it lists more
 * candidates than it holds (the full head must decide). */
bool bn_vk_head_screen_pick(const uint32_t *result, int32_t *token);

#endif
