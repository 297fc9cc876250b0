/*
 * test_cpu_forward.c - the CPU backend's forward pass against a slow,
 * obviously-correct reference written here, on random in-memory models of
 * ragged shapes.
 *
 * The reference recomputes the whole sequence from scratch for every
 * position (no KV cache, no chunks, no threads) with direct loops. It
 * shares nothing with the backend except the model's weights, but it does
 * the fp32 arithmetic in the order the backend documents (RMSNorm with a
 * double sum of squares; dot products in 8 interleaved fp32 lanes summed
 * pairwise; softmax normalised by multiplying with 1/sum; RoPE angles as
 * (float)pos * inv_freq). That is deliberate: every int8 activation code
 * is a rounding decision, and a last-bit difference that moves a value
 * across a .5 boundary changes a code and then the logits by ~1e-2 on
 * these tiny models. With the same arithmetic the codes agree exactly, so
 * the logits can be compared tightly (TOL relative to the largest logit;
 * only the LM head, in double here, differs in the last bits), and any
 * structural mistake (positions, heads, GQA mapping, mask, KV cache,
 * chunking, norm order) shows as an O(1) difference.
 *
 * The quantization rules are written out again: codes round(127 * u /
 * max|u|) with u = norm_weight * x, which is absmax quantization of the
 * RMS-normed row in exact arithmetic (the 1/rms factor cancels); scale
 * 127 / max|normed|; exact integer dot products; one divide by the
 * activation scale and one multiply by the weight scale.
 *
 * Also checked exactly: prefill of n tokens == n decode steps (bit for bit),
 * any thread count gives the same bits, and KV cache misuse is refused.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "model.h"
#include "quant_rules.h"
#include "test_util.h"

#define TOL 1e-5

/* ---- the reference --------------------------------------------------------- */

typedef struct ref_proj {
    int8_t *codes;
    float scale;
    int64_t n, k;
} ref_proj;

/* 1 / rms in fp32 from a double sum of squares. */
static float ref_inv_rms(const float *x, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    return 1.0f / sqrtf((float)(ss / (double)n) + eps);
}

static float ref_dot(const float *a, const float *b, int64_t n)
{
    float lane[8] = {0};
    for (int64_t i = 0; i < n; i++)
        lane[i % 8] += a[i] * b[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* RMSNorm then absmax int8 quantization of one row; its sum of squares in
 * eight lanes summed pairwise (bn_norm_lanes_sum). */
static void ref_norm_quantize(const float *x, const float *w, int64_t n, float eps, int8_t *q,
                              float *scale)
{
    double lane[8] = {0};
    for (int64_t i = 0; i < n; i++)
        lane[i % 8] += (double)x[i] * x[i];
    const double ss =
        ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    const float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    double umax = 0.0;
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        umax = fmax(umax, fabs((double)w[i] * x[i]));
        amax = fmaxf(amax, fabsf(w[i] * (x[i] * inv)));
    }
    if (amax < BN_QUANT_EPS || umax == 0.0) {
        /* A row of (near) zeros, e.g. relu^2 of an all-negative gate on
         * these tiny shapes: the backend's plain rule with the scale
         * floored at 127 / BN_QUANT_EPS. */
        const float s = 127.0f / (amax >= BN_QUANT_EPS ? amax : BN_QUANT_EPS);
        for (int64_t i = 0; i < n; i++)
            q[i] = (int8_t)fmax(-128.0, fmin(127.0, rint(w[i] * (x[i] * inv) * s)));
        *scale = s;
        return;
    }
    for (int64_t i = 0; i < n; i++)
        q[i] = (int8_t)rint(127.0 * ((double)w[i] * x[i]) / umax);
    *scale = 127.0f / amax;
}

/* y = W x under BitNet rules: exact integer dot products, then one divide
 * by the activation scale and one multiply by the weight scale. */
static void ref_bitlinear(const ref_proj *p, const int8_t *xq, float s, float *y)
{
    for (int64_t r = 0; r < p->n; r++) {
        int32_t acc = 0;
        for (int64_t i = 0; i < p->k; i++)
            acc += p->codes[r * p->k + i] * xq[i];
        y[r] = ((float)acc / s) * p->scale;
    }
}

/* Rotate-half RoPE: pair (j, j + rope_dim/2) of each head turns by
 * pos * theta^(-2j / rope_dim). */
static void ref_rope(float *v, int n_heads, const bn_hparams *hp, int64_t pos)
{
    const int half = hp->rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *hv = v + (int64_t)h * hp->head_dim;
        for (int j = 0; j < half; j++) {
            const float freq = 1.0f / powf(hp->rope_theta, (float)(2 * j) / (float)hp->rope_dim);
            const float c = cosf((float)pos * freq), s = sinf((float)pos * freq);
            const float x0 = hv[j], x1 = hv[j + half];
            hv[j] = x0 * c - x1 * s;
            hv[j + half] = x1 * c + x0 * s;
        }
    }
}

/* Logits [T][vocab] for the whole sequence, recomputed from scratch. */
static void reference_forward(const bn_checkpoint *m, const int32_t *tokens, int64_t T,
                              float *logits)
{
    const bn_hparams *hp = bn_checkpoint_hparams(m);
    const int64_t dim = hp->dim, ffn = hp->ffn;
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const int group = hp->n_head / hp->n_head_kv;

    float *x = calloc((size_t)(T * dim), sizeof(float));
    float *xn = calloc((size_t)dim, sizeof(float));
    const int64_t widest = dim > q_dim ? (dim > ffn ? dim : ffn) : (q_dim > ffn ? q_dim : ffn);
    int8_t *xq = calloc((size_t)widest, 1);
    float xs;
    float *q = calloc((size_t)(T * q_dim), sizeof(float));
    float *k = calloc((size_t)(T * kv_dim), sizeof(float));
    float *v = calloc((size_t)(T * kv_dim), sizeof(float));
    float *att = calloc((size_t)(T * q_dim), sizeof(float));
    float *o = calloc((size_t)dim, sizeof(float));
    float *g = calloc((size_t)ffn, sizeof(float));
    float *u = calloc((size_t)ffn, sizeof(float));
    float *w = calloc((size_t)T, sizeof(float));

    for (int64_t t = 0; t < T; t++)
        bn_checkpoint_embedding_row(m, tokens[t], x + t * dim, NULL);

    for (int l = 0; l < hp->n_layer; l++) {
        ref_proj P[BN_PROJ_COUNT];
        for (int p = 0; p < BN_PROJ_COUNT; p++) {
            bn_hparams_proj_shape(hp, (bn_proj)p, &P[p].n, &P[p].k);
            P[p].codes = malloc((size_t)(P[p].n * P[p].k));
            CHECK(bn_checkpoint_projection_codes(m, l, (bn_proj)p, P[p].codes, &P[p].scale, NULL) ==
                  BN_OK);
        }
        /* attention */
        for (int64_t t = 0; t < T; t++) {
            ref_norm_quantize(x + t * dim, bn_checkpoint_norm(m, l, BN_NORM_ATTN), dim, hp->rms_eps,
                              xq, &xs);
            ref_bitlinear(&P[BN_PROJ_Q], xq, xs, q + t * q_dim);
            ref_bitlinear(&P[BN_PROJ_K], xq, xs, k + t * kv_dim);
            ref_bitlinear(&P[BN_PROJ_V], xq, xs, v + t * kv_dim);
            ref_rope(q + t * q_dim, hp->n_head, hp, t);
            ref_rope(k + t * kv_dim, hp->n_head_kv, hp, t);
        }
        for (int64_t t = 0; t < T; t++) {
            for (int h = 0; h < hp->n_head; h++) {
                const float *qh = q + t * q_dim + (int64_t)h * hp->head_dim;
                const int64_t kvo = (int64_t)(h / group) * hp->head_dim;
                const float scale = (float)(1.0 / sqrt((double)hp->head_dim));
                float max = -INFINITY, sum = 0.0f;
                for (int64_t s = 0; s <= t; s++) {
                    w[s] = ref_dot(qh, k + s * kv_dim + kvo, hp->head_dim) * scale;
                    max = fmaxf(max, w[s]);
                }
                for (int64_t s = 0; s <= t; s++)
                    sum += (w[s] = expf(w[s] - max));
                const float inv_sum = 1.0f / sum;
                for (int e = 0; e < hp->head_dim; e++) {
                    float acc = 0.0f;
                    for (int64_t s = 0; s <= t; s++)
                        acc += (w[s] * inv_sum) * v[s * kv_dim + kvo + e];
                    att[t * q_dim + (int64_t)h * hp->head_dim + e] = acc;
                }
            }
        }
        for (int64_t t = 0; t < T; t++) {
            ref_norm_quantize(att + t * q_dim, bn_checkpoint_norm(m, l, BN_NORM_ATTN_SUB), q_dim,
                              hp->rms_eps, xq, &xs);
            ref_bitlinear(&P[BN_PROJ_O], xq, xs, o);
            for (int64_t i = 0; i < dim; i++)
                x[t * dim + i] += o[i];
        }
        /* feed-forward */
        for (int64_t t = 0; t < T; t++) {
            ref_norm_quantize(x + t * dim, bn_checkpoint_norm(m, l, BN_NORM_FFN), dim, hp->rms_eps,
                              xq, &xs);
            ref_bitlinear(&P[BN_PROJ_GATE], xq, xs, g);
            ref_bitlinear(&P[BN_PROJ_UP], xq, xs, u);
            for (int64_t i = 0; i < ffn; i++) {
                const float r = g[i] > 0.0f ? g[i] : 0.0f;
                g[i] = (r * r) * u[i];
            }
            ref_norm_quantize(g, bn_checkpoint_norm(m, l, BN_NORM_FFN_SUB), ffn, hp->rms_eps, xq,
                              &xs);
            ref_bitlinear(&P[BN_PROJ_DOWN], xq, xs, o);
            for (int64_t i = 0; i < dim; i++)
                x[t * dim + i] += o[i];
        }
        for (int p = 0; p < BN_PROJ_COUNT; p++)
            free(P[p].codes);
    }

    const bn_dense_matrix *head = bn_checkpoint_lm_head(m);
    float *row = malloc((size_t)dim * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        const float inv = ref_inv_rms(x + t * dim, dim, hp->rms_eps);
        for (int64_t i = 0; i < dim; i++)
            xn[i] = bn_checkpoint_output_norm(m)[i] * (x[t * dim + i] * inv);
        for (int64_t r = 0; r < hp->vocab; r++) {
            bn_qtype_get(head->type)->dequantize_row(
                (const uint8_t *)head->data + (size_t)r * head->row_bytes, row, dim);
            double acc = 0.0;
            for (int64_t i = 0; i < dim; i++)
                acc += (double)row[i] * xn[i];
            logits[t * hp->vocab + r] = (float)acc;
        }
    }
    free(row);
    free(xq);
    free(x), free(xn), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(w);
}

/* ---- helpers --------------------------------------------------------------- */

static bn_hparams random_shape(void)
{
    bn_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_head_kv = (int)test_rand_range(1, 3);
    hp.n_head = hp.n_head_kv * (int)test_rand_range(1, 3);
    hp.head_dim = 2 * (int)test_rand_range(2, 12);
    /* dim need not equal n_head * head_dim: GGUF allows it, so test it. */
    hp.dim = test_rand_range(0, 1) ? hp.n_head * hp.head_dim : (int)test_rand_range(17, 90);
    hp.ffn = (int)test_rand_range(9, 150);
    hp.vocab = (int)test_rand_range(40, 260);
    hp.n_layer = (int)test_rand_range(1, 3);
    hp.n_ctx_train = 160;
    hp.rope_dim = test_rand_range(0, 2) ? hp.head_dim : 2 * (int)test_rand_range(1, hp.head_dim / 2);
    hp.rms_eps = test_rand_range(0, 1) ? 1e-5f : 1e-6f;
    hp.rope_theta = test_rand_range(0, 1) ? 500000.0f : 10000.0f;
    hp.tied_embeddings = test_rand_range(0, 3) != 0;
    return hp;
}

static void random_tokens(int32_t *tokens, int64_t n, int32_t vocab)
{
    for (int64_t i = 0; i < n; i++)
        tokens[i] = (int32_t)test_rand_range(0, vocab - 1);
}

static void describe(const bn_hparams *hp)
{
    printf("  shape: vocab %d dim %d ffn %d layers %d heads %d/%d head_dim %d rope_dim %d "
           "theta %g %s\n",
           hp->vocab, hp->dim, hp->ffn, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim,
           hp->rope_dim, (double)hp->rope_theta, hp->tied_embeddings ? "tied" : "untied");
}

/* ---- tests ------------------------------------------------------------------ */

static double worst_relative = 0.0;

static void test_against_reference(int round)
{
    bn_hparams hp = random_shape();
    describe(&hp);
    bn_checkpoint *m = NULL;
    bn_error err;
    CHECK(bn_checkpoint_create_random(&hp, test_rand_u64(), &m, &err) == BN_OK);
    if (!m)
        return;
    const int64_t T = test_rand_range(1, 40);
    int32_t tokens[40];
    random_tokens(tokens, T, hp.vocab);

    float *want = malloc((size_t)(T * hp.vocab) * sizeof(float));
    float *got = malloc((size_t)(T * hp.vocab) * sizeof(float));
    reference_forward(m, tokens, T, want);

    bn_cpu_backend *b = NULL;
    CHECK_MSG(bn_cpu_backend_create(m, 0, (int)test_rand_range(1, 4), &b, &err) == BN_OK, "%s",
              err.message);
    if (b) {
        CHECK(bn_cpu_backend_forward(b, tokens, T, 0, BN_LOGITS_ALL, got, &err) == BN_OK);
        double max_ref = 0.0, max_diff = 0.0;
        for (int64_t i = 0; i < T * hp.vocab; i++) {
            max_ref = fmax(max_ref, fabs(want[i]));
            max_diff = fmax(max_diff, fabs((double)want[i] - got[i]));
        }
        const double rel = max_diff / fmax(max_ref, 1.0);
        worst_relative = fmax(worst_relative, rel);
        CHECK_MSG(rel <= TOL, "round %d: max |logit diff| %.3g of max |logit| %.3g", round,
                  max_diff, max_ref);
        bn_cpu_backend_free(b);
    }
    free(want);
    free(got);
    bn_checkpoint_free(m);
}

static float *run_backend(const bn_checkpoint *m, int threads, const int32_t *tokens, int64_t T,
                          int64_t split, bool step_by_step)
{
    const int32_t vocab = bn_checkpoint_hparams(m)->vocab;
    float *logits = malloc((size_t)(T * vocab) * sizeof(float));
    bn_cpu_backend *b = NULL;
    bn_error err;
    CHECK_MSG(bn_cpu_backend_create(m, 0, threads, &b, &err) == BN_OK, "%s", err.message);
    if (!b)
        return logits;
    if (step_by_step) {
        for (int64_t t = 0; t < T; t++)
            CHECK(bn_cpu_backend_forward(b, tokens + t, 1, t, BN_LOGITS_LAST,
                                         logits + t * vocab, &err) == BN_OK);
    } else {
        CHECK(bn_cpu_backend_forward(b, tokens, split, 0, BN_LOGITS_ALL, logits, &err) == BN_OK);
        if (split < T)
            CHECK(bn_cpu_backend_forward(b, tokens + split, T - split, split, BN_LOGITS_ALL,
                                         logits + split * vocab, &err) == BN_OK);
    }
    CHECK(bn_cpu_backend_kv_filled(b) == T);
    bn_cpu_backend_free(b);
    return logits;
}

/* Prefill == decode steps, any thread count, any split, bit for bit; the
 * 150-token sequence crosses the backend's prefill chunk boundary. */
static void test_exactness(void)
{
    bn_hparams hp = random_shape();
    describe(&hp);
    bn_checkpoint *m = NULL;
    CHECK(bn_checkpoint_create_random(&hp, test_rand_u64(), &m, NULL) == BN_OK);
    if (!m)
        return;
    const int64_t T = 150;
    int32_t tokens[150];
    random_tokens(tokens, T, hp.vocab);
    const size_t bytes = (size_t)(T * hp.vocab) * sizeof(float);

    float *base = run_backend(m, 1, tokens, T, T, false);
    float *steps = run_backend(m, 2, tokens, T, 0, true);
    CHECK_MSG(memcmp(base, steps, bytes) == 0, "prefill differs from decode steps");
    const int threads[] = {2, 3, 5, 8};
    for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
        const int64_t split = test_rand_range(1, T);
        float *other = run_backend(m, threads[i], tokens, T, split, false);
        CHECK_MSG(memcmp(base, other, bytes) == 0, "%d threads, split at %lld: logits differ",
                  threads[i], (long long)split);
        free(other);
    }

    /* LAST is the last row of ALL. */
    bn_cpu_backend *b = NULL;
    float *last = malloc((size_t)hp.vocab * sizeof(float));
    CHECK(bn_cpu_backend_create(m, 0, 3, &b, NULL) == BN_OK);
    if (b) {
        CHECK(bn_cpu_backend_forward(b, tokens, T, 0, BN_LOGITS_LAST, last, NULL) == BN_OK);
        CHECK(memcmp(last, base + (T - 1) * hp.vocab, (size_t)hp.vocab * sizeof(float)) == 0);
        /* Rewinding and recomputing the tail gives the same answer. */
        CHECK(bn_cpu_backend_forward(b, tokens + 100, T - 100, 100, BN_LOGITS_LAST, last,
                                     NULL) == BN_OK);
        CHECK(memcmp(last, base + (T - 1) * hp.vocab, (size_t)hp.vocab * sizeof(float)) == 0);
        bn_cpu_backend_free(b);
    }
    free(last);
    free(base);
    free(steps);
    bn_checkpoint_free(m);
}

/* Many sequences in one pass over a paged cache (forward_rows): three
 * sequences whose blocks are scattered over the cache, prefilled in
 * interleaved chunks of rows (some crossing the 128-row pass), then
 * decoded together one row each per pass, give each sequence's logits
 * bit for bit as forward() does for it alone. */
static void test_paged_rows(void)
{
    bn_hparams hp = random_shape();
    describe(&hp);
    bn_checkpoint *m = NULL;
    CHECK(bn_checkpoint_create_random(&hp, test_rand_u64(), &m, NULL) == BN_OK);
    if (!m)
        return;
    enum { SEQS = 3, BS = 8, BLOCKS = 64, DECODE = 6 };
    const int64_t prompt_len[SEQS] = {test_rand_range(1, 30), test_rand_range(1, 140),
                                      test_rand_range(1, 60)};
    int32_t tokens[SEQS][160];
    for (int s = 0; s < SEQS; s++)
        random_tokens(tokens[s], prompt_len[s] + DECODE, hp.vocab);
    const size_t row_bytes = (size_t)hp.vocab * sizeof(float);

    /* Each sequence alone: the last prompt row's logits, then each decode
     * step's. */
    float *want[SEQS];
    for (int s = 0; s < SEQS; s++) {
        const int64_t T = prompt_len[s] + DECODE;
        float *all = run_backend(m, 2, tokens[s], T, T, false);
        want[s] = malloc((DECODE + 1) * row_bytes);
        for (int k = 0; k <= DECODE; k++)
            memcpy(want[s] + k * hp.vocab, all + (prompt_len[s] - 1 + k) * hp.vocab, row_bytes);
        free(all);
    }

    /* Blocks handed out in a shuffled order, so no sequence's are adjacent. */
    int32_t order[BLOCKS];
    for (int i = 0; i < BLOCKS; i++)
        order[i] = i;
    for (int i = BLOCKS - 1; i > 0; i--) {
        const int j = (int)test_rand_range(0, i);
        const int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int32_t table[SEQS][BLOCKS], table_len[SEQS] = {0};
    int next_block = 0;
    for (int s = 0; s < SEQS; s++)
        for (int64_t p = 0; p < prompt_len[s] + DECODE; p += BS)
            table[s][table_len[s]++] = order[next_block++];
    const int32_t *tables[SEQS] = {table[0], table[1], table[2]};

    bn_cpu_backend *b = NULL;
    bn_error err;
    CHECK_MSG(bn_cpu_backend_create_paged(m, 0, (int64_t)BLOCKS * BS, 3, &b, &err) == BN_OK, "%s",
              err.message);
    float *got = malloc(SEQS * row_bytes);
    int32_t rt[512], rs[512];
    int64_t rp[512], lr[SEQS];
    /* Prefill: passes taking up to 7 rows of each unfinished sequence in
     * turn, until every prompt is in; a sequence's logits come with the
     * pass that holds its last prompt row. */
    int64_t done[SEQS] = {0};
    int finished = 0;
    while (b && finished < SEQS) {
        int64_t n = 0, nl = 0;
        int logit_seq[SEQS];
        for (int s = 0; s < SEQS; s++) {
            const int64_t take = prompt_len[s] - done[s] < 7 ? prompt_len[s] - done[s] : 7;
            for (int64_t i = 0; i < take; i++, n++) {
                rt[n] = tokens[s][done[s] + i];
                rp[n] = done[s] + i;
                rs[n] = s;
            }
            done[s] += take;
            if (take > 0 && done[s] == prompt_len[s]) {
                lr[nl] = n - 1;
                logit_seq[nl++] = s;
                finished++;
            }
        }
        const bn_batch_rows rows = {n, rt, rp, rs, tables, table_len, BS, lr, nl};
        CHECK_MSG(bn_cpu_backend_forward_rows(b, &rows, got, &err) == BN_OK, "%s", err.message);
        for (int64_t k = 0; k < nl; k++)
            CHECK_MSG(memcmp(got + k * hp.vocab, want[logit_seq[k]], row_bytes) == 0,
                      "sequence %d: the prompt's logits differ from its own run", logit_seq[k]);
    }
    /* Decode: every sequence's next token in one pass of three rows. */
    for (int step = 0; b && step < DECODE; step++) {
        for (int s = 0; s < SEQS; s++) {
            rt[s] = tokens[s][prompt_len[s] + step];
            rp[s] = prompt_len[s] + step;
            rs[s] = s;
            lr[s] = s;
        }
        const bn_batch_rows rows = {SEQS, rt, rp, rs, tables, table_len, BS, lr, SEQS};
        CHECK(bn_cpu_backend_forward_rows(b, &rows, got, &err) == BN_OK);
        for (int s = 0; s < SEQS; s++)
            CHECK_MSG(memcmp(got + s * hp.vocab, want[s] + (step + 1) * hp.vocab, row_bytes) == 0,
                      "decode step %d, sequence %d: logits differ from its own run", step, s);
    }
    /* Bad rows: a position without a block, a block outside the cache. */
    if (b) {
        const int64_t far = (int64_t)table_len[0] * BS;
        const bn_batch_rows bad = {1, rt, &far, rs, tables, table_len, BS, lr, 1};
        CHECK(bn_cpu_backend_forward_rows(b, &bad, got, &err) == BN_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(err.message, "no block");
        const bn_batch_rows odd = {1, rt, rp, rs, tables, table_len, 7, lr, 1};
        CHECK(bn_cpu_backend_forward_rows(b, &odd, got, &err) == BN_ERR_INVALID_ARGUMENT);
    }
    bn_cpu_backend_free(b);
    for (int s = 0; s < SEQS; s++)
        free(want[s]);
    free(got);
    bn_checkpoint_free(m);
}

static void test_errors(void)
{
    bn_hparams hp = random_shape();
    bn_checkpoint *m = NULL;
    bn_error err;
    CHECK(bn_checkpoint_create_random(&hp, 7, &m, NULL) == BN_OK);
    if (!m)
        return;
    bn_cpu_backend *b = NULL;
    CHECK(bn_cpu_backend_create(m, hp.n_ctx_train + 1, 1, &b, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(b == NULL);
    CHECK(bn_cpu_backend_create(m, -1, 1, &b, &err) == BN_ERR_INVALID_ARGUMENT);

    CHECK(bn_cpu_backend_create(m, 8, 2, &b, &err) == BN_OK);
    if (!b) {
        bn_checkpoint_free(m);
        return;
    }
    CHECK(bn_cpu_backend_kv_len(b) == 8);
    float *logits = malloc((size_t)(9 * hp.vocab) * sizeof(float));
    int32_t tokens[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    for (int i = 0; i < 9; i++)
        tokens[i] %= hp.vocab;
    CHECK(bn_cpu_backend_forward(b, tokens, 9, 0, BN_LOGITS_LAST, logits, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "KV cache of 8 positions");
    CHECK(bn_cpu_backend_kv_filled(b) == 0);
    CHECK(bn_cpu_backend_forward(b, tokens, 6, 0, BN_LOGITS_LAST, logits, &err) == BN_OK);
    CHECK(bn_cpu_backend_forward(b, tokens, 3, 6, BN_LOGITS_LAST, logits, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cpu_backend_kv_filled(b) == 6);
    CHECK(bn_cpu_backend_forward(b, tokens, 2, 6, BN_LOGITS_LAST, logits, &err) == BN_OK);
    CHECK(bn_cpu_backend_forward(b, tokens, 1, 8, BN_LOGITS_LAST, logits, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    /* Skipping positions, bad tokens, bad arguments. */
    bn_cpu_backend_reset(b);
    CHECK(bn_cpu_backend_forward(b, tokens, 1, 3, BN_LOGITS_LAST, logits, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "skip");
    int32_t bad = hp.vocab;
    CHECK(bn_cpu_backend_forward(b, &bad, 1, 0, BN_LOGITS_LAST, logits, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "outside the vocabulary");
    bad = -1;
    CHECK(bn_cpu_backend_forward(b, &bad, 1, 0, BN_LOGITS_LAST, logits, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cpu_backend_forward(b, tokens, 0, 0, BN_LOGITS_LAST, logits, &err) ==
          BN_ERR_INVALID_ARGUMENT);

    bn_cpu_memory mem;
    bn_cpu_backend_memory(b, &mem);
    const uint64_t kv_dim = (uint64_t)hp.n_head_kv * (uint64_t)hp.head_dim;
    CHECK(mem.kv_cache == 2ull * (uint64_t)hp.n_layer * 8ull * kv_dim * sizeof(float));
    CHECK(mem.weights > 0 && mem.scratch > 0);
    CHECK(mem.total == mem.weights + mem.kv_cache + mem.scratch);
    CHECK(mem.model_mapped >= (uint64_t)hp.vocab * (uint64_t)hp.dim * 2);
    printf("  memory: weights %llu, kv %llu, scratch %llu bytes; kernels %s\n",
           (unsigned long long)mem.weights, (unsigned long long)mem.kv_cache,
           (unsigned long long)mem.scratch, bn_cpu_backend_kernel_name(b));
    free(logits);
    bn_cpu_backend_free(b);
    bn_checkpoint_free(m);
}

/* The random model API itself: deterministic, ternary, validated. */
static void test_random_model(void)
{
    bn_hparams hp = random_shape();
    bn_checkpoint *a = NULL, *c = NULL;
    CHECK(bn_checkpoint_create_random(&hp, 42, &a, NULL) == BN_OK);
    CHECK(bn_checkpoint_create_random(&hp, 42, &c, NULL) == BN_OK);
    if (!a || !c)
        return;
    int64_t n, k;
    bn_hparams_proj_shape(&hp, BN_PROJ_DOWN, &n, &k);
    int8_t *x = malloc((size_t)(n * k)), *y = malloc((size_t)(n * k));
    float sx, sy;
    CHECK(bn_checkpoint_projection_codes(a, hp.n_layer - 1, BN_PROJ_DOWN, x, &sx, NULL) == BN_OK);
    CHECK(bn_checkpoint_projection_codes(c, hp.n_layer - 1, BN_PROJ_DOWN, y, &sy, NULL) == BN_OK);
    CHECK(memcmp(x, y, (size_t)(n * k)) == 0 && sx == sy && sx > 0.0f);
    int counts[3] = {0, 0, 0};
    bool ternary = true;
    for (int64_t i = 0; i < n * k; i++) {
        ternary = ternary && x[i] >= -1 && x[i] <= 1;
        if (x[i] >= -1 && x[i] <= 1)
            counts[x[i] + 1]++;
    }
    CHECK(ternary);
    CHECK(n * k < 300 || (counts[0] > 0 && counts[1] > 0 && counts[2] > 0));
    CHECK(strstr(bn_checkpoint_hparams(a)->flavour, "random") != NULL);
    CHECK(bn_checkpoint_tokenizer(a) == NULL);
    bn_error err;
    CHECK(bn_checkpoint_projection_codes(a, hp.n_layer, BN_PROJ_Q, x, &sx, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    float *row = malloc((size_t)hp.dim * sizeof(float));
    CHECK(bn_checkpoint_embedding_row(a, hp.vocab, row, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_checkpoint_embedding_row(a, hp.vocab - 1, row, &err) == BN_OK);
    free(row);
    free(x);
    free(y);
    bn_checkpoint_free(a);
    bn_checkpoint_free(c);

    /* Shapes that cannot work are refused with the field named. */
    bn_checkpoint *bad = NULL;
    bn_hparams h2 = hp;
    h2.n_head = 3;
    h2.n_head_kv = 2;
    CHECK(bn_checkpoint_create_random(&h2, 1, &bad, &err) == BN_ERR_FORMAT && !bad);
    CHECK_STR_CONTAINS(err.message, "n_head_kv");
    h2 = hp;
    h2.rope_dim = hp.head_dim + 2;
    CHECK(bn_checkpoint_create_random(&h2, 1, &bad, &err) == BN_ERR_FORMAT);
    CHECK_STR_CONTAINS(err.message, "rope_dim");
    h2 = hp;
    h2.dim = 0;
    CHECK(bn_checkpoint_create_random(&h2, 1, &bad, &err) == BN_ERR_FORMAT);
    CHECK_STR_CONTAINS(err.message, "dim");

    bn_hparams big;
    bn_hparams_2b4t(&big);
    CHECK(bn_hparams_validate(&big, NULL) == BN_OK);
    CHECK(bn_hparams_ternary_count(&big) > 2000000000LL);
}

int main(void)
{
    test_seed_init();
    test_random_model();
    for (int round = 0; round < 12; round++)
        test_against_reference(round);
    printf("worst max|diff| / max|logit| against the reference: %.3g\n", worst_relative);
    test_exactness();
    for (int round = 0; round < 4; round++)
        test_paged_rows();
    test_errors();
    TEST_EXIT();
}
