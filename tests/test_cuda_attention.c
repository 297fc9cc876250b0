/* GPU test: KV cache append, decode attention (single range and
 * flash-decoding splits) and causal prefill attention (both the FMA and
 * the tensor-core kernel), against a double
 * precision CPU reference over the same fp16 / bf16-rounded cache values,
 * on random ragged shapes including the 2B-4T heads (20 / 5, head_dim 128)
 * and long kv lengths; prefill against n decode steps; a captured graph
 * replayed as the cache grows. Unwritten cache slots and outputs are
 * poisoned with NaN. Exits 77 without a usable GPU.
 *
 * Tolerance (attention outputs): |gpu - ref| <= 2e-4 * max|v| + 1e-6.
 * Why: the output is a convex combination of value rows, so an error in a
 * weight moves it by at most (weight error) * max|v|. Both sides read the
 * same rounded K/V, so the only differences are fp32 arithmetic: a score
 * is a 64..256-term fp32 dot (relative error <= ~1e-5 of sum|q k|, far
 * less in practice), exp2f is within 2 ulp, and the running-max rescaling
 * adds a few roundings more: typically ~1e-6 relative to the score
 * magnitudes (tens at most here), so weight errors of ~1e-5 and output
 * errors well under 2e-4 * max|v|. Both prefill kernels are held to the
 * same bound: the tensor-core one multiplies hi + lo splits of Q and P
 * (~16 significant bits for bf16, ~22 for fp16; K and V exact), so its
 * extra error is ~2^-16 relative, inside the budget. Prefill vs decode
 * compare two such results: same bound. The test prints the worst error
 * seen per kernel, relative to max|v| (on an H200: decode 1.0e-6, prefill
 * FMA 5.4e-6, prefill MMA 2.3e-5). */
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>

#include "attention_cuda.h"
#include "fp16.h"
#include "test_util.h"
#include "test_util_cuda.h"

static int sm_count;

/* ---- fp16 / bf16 on the host ---------------------------------------------- */

static uint16_t to_kv(float f, bn_kv_type t)
{
    return t == BN_ATTN_KV_F16 ? bn_fp32_to_fp16(f) : bn_fp32_to_bf16(f);
}
static float from_kv(uint16_t b, bn_kv_type t)
{
    return t == BN_ATTN_KV_F16 ? bn_fp16_to_fp32(b) : bn_bf16_to_fp32(b);
}

/* ---- problem data ----------------------------------------------------------- */

/* One test cache: n_seq sequences x n_layers layers on the device, the
 * rounded values of every written row on the host (for layer `layer`). */
typedef struct cache {
    bn_attn_shape s;
    int n_layers, layer, n_seq;
    int row;                /* n_kv_heads * head_dim */
    uint16_t *dk, *dv;      /* device, all layers */
    float *hk, *hv;         /* host [seq][pos][row], rounded; NaN = unwritten */
    float vmax;
} cache;

static void cache_init(cache *c, const bn_attn_shape *s, int n_seq, int n_layers)
{
    memset(c, 0, sizeof *c);
    c->s = *s;
    c->n_seq = n_seq;
    c->n_layers = n_layers;
    c->layer = n_layers - 1; /* a layer offset that is not 0 */
    c->row = s->n_kv_heads * s->head_dim;
    const size_t elems = (size_t)n_seq * (size_t)n_layers * (size_t)bn_attn_layer_elems(s);
    CUDA_OK(cudaMalloc((void **)&c->dk, elems * 2));
    CUDA_OK(cudaMalloc((void **)&c->dv, elems * 2));
    /* 0xffff is NaN in fp16 and bf16: reading an unwritten slot shows. */
    CUDA_OK(cudaMemset(c->dk, 0xff, elems * 2));
    CUDA_OK(cudaMemset(c->dv, 0xff, elems * 2));
    /* The memsets run on the legacy stream, which check_graph's non-blocking
     * stream does not wait for: without this the poison can land after the
     * first appends (seen on a busy H200: every step after the first NaN). */
    CUDA_OK(cudaDeviceSynchronize());
    const size_t host = (size_t)n_seq * (size_t)s->capacity * (size_t)c->row;
    c->hk = malloc(host * sizeof(float));
    c->hv = malloc(host * sizeof(float));
    for (size_t i = 0; i < host; i++)
        c->hk[i] = c->hv[i] = NAN;
}

static void cache_free(cache *c)
{
    cudaFree(c->dk);
    cudaFree(c->dv);
    free(c->hk);
    free(c->hv);
}

static int64_t seq_stride(const cache *c) { return (int64_t)c->n_layers * bn_attn_layer_elems(&c->s); }

static uint16_t *layer_base(const cache *c, uint16_t *base)
{
    return base + (int64_t)c->layer * bn_attn_layer_elems(&c->s);
}

/* Appends n rows (random k in [-1, 1], v in [-vr, vr]) at pos[i] of seq[i]
 * through the kernel, one device call, recording the rounded values; rows
 * with an out-of-range position must be skipped by the kernel. */
static void cache_append(cache *c, int n, const int32_t *pos, const int32_t *seq, float vr)
{
    const int row = c->row;
    const int64_t ld = row + 3; /* a row stride that is not the row length */
    float *k = malloc(sizeof(float) * (size_t)(n * ld));
    float *v = malloc(sizeof(float) * (size_t)(n * ld));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < row; j++) {
            k[i * ld + j] = test_rand_float(-1.0f, 1.0f);
            v[i * ld + j] = test_rand_float(-vr, vr);
            if (pos[i] >= 0 && pos[i] < c->s.capacity) {
                const size_t h = ((size_t)seq[i] * (size_t)c->s.capacity + (size_t)pos[i]) * row + j;
                c->hk[h] = from_kv(to_kv(k[i * ld + j], c->s.kv_type), c->s.kv_type);
                c->hv[h] = from_kv(to_kv(v[i * ld + j], c->s.kv_type), c->s.kv_type);
                if (fabsf(c->hv[h]) > c->vmax)
                    c->vmax = fabsf(c->hv[h]);
            }
        }
    float *dk, *dv;
    int32_t *dpos, *dseq;
    CUDA_OK(cudaMalloc((void **)&dk, sizeof(float) * (size_t)(n * ld)));
    CUDA_OK(cudaMalloc((void **)&dv, sizeof(float) * (size_t)(n * ld)));
    CUDA_OK(cudaMalloc((void **)&dpos, sizeof(int32_t) * (size_t)n));
    CUDA_OK(cudaMalloc((void **)&dseq, sizeof(int32_t) * (size_t)n));
    CUDA_OK(cudaMemcpy(dk, k, sizeof(float) * (size_t)(n * ld), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, v, sizeof(float) * (size_t)(n * ld), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dpos, pos, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dseq, seq, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    /* seq NULL when every row is sequence 0: exercises that path too. */
    bool all0 = true;
    for (int i = 0; i < n; i++)
        all0 = all0 && seq[i] == 0;
    CUDA_OK(bn_attn_kv_append(&c->s, dk, dv, ld, n, dpos, all0 ? NULL : dseq,
                              layer_base(c, c->dk), layer_base(c, c->dv), seq_stride(c), 0));
    CUDA_OK(cudaDeviceSynchronize());
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dpos);
    cudaFree(dseq);
    free(k);
    free(v);
}

/* The whole device cache against the host record: written rows of layer
 * `layer` bit-equal to the host rounding, everything else still poison. */
static void cache_verify(const cache *c)
{
    const int64_t layer_elems = bn_attn_layer_elems(&c->s);
    const size_t elems = (size_t)c->n_seq * (size_t)c->n_layers * (size_t)layer_elems;
    uint16_t *k = malloc(elems * 2), *v = malloc(elems * 2);
    CUDA_OK(cudaMemcpy(k, c->dk, elems * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(v, c->dv, elems * 2, cudaMemcpyDeviceToHost));
    int64_t bad = 0, stray = 0;
    for (int sq = 0; sq < c->n_seq; sq++)
        for (int l = 0; l < c->n_layers; l++)
            for (int64_t p = 0; p < c->s.capacity; p++)
                for (int j = 0; j < c->row; j++) {
                    const size_t d = (size_t)bn_attn_kv_index(&c->s, c->n_layers, sq, l, p, 0, j);
                    const size_t h = ((size_t)sq * (size_t)c->s.capacity + (size_t)p) * c->row + j;
                    const bool written = l == c->layer && !isnan(c->hk[h]);
                    if (!written) {
                        stray += k[d] != 0xffffu || v[d] != 0xffffu;
                        continue;
                    }
                    bad += from_kv(k[d], c->s.kv_type) != c->hk[h] ||
                           from_kv(v[d], c->s.kv_type) != c->hv[h];
                }
    CHECK_MSG(bad == 0 && stray == 0,
              "kv append (%s, %d/%d heads x %d): %lld rows' values wrong, %lld slots written "
              "that should not be",
              c->s.kv_type == BN_ATTN_KV_F16 ? "f16" : "bf16", c->s.n_heads, c->s.n_kv_heads,
              c->s.head_dim, (long long)bad, (long long)stray);
    free(k);
    free(v);
}

/* Double-precision attention of one query row (n_heads x head_dim) over
 * positions [0, len) of sequence sq. */
static void ref_attention(const cache *c, int sq, const float *q, int len, double *out)
{
    const bn_attn_shape *s = &c->s;
    const int hd = s->head_dim, group = s->n_heads / s->n_kv_heads;
    const double scale = 1.0 / sqrt((double)hd);
    double *w = malloc(sizeof(double) * (size_t)(len > 0 ? len : 1));
    for (int h = 0; h < s->n_heads; h++) {
        const int kvh = h / group;
        double mx = -INFINITY;
        for (int t = 0; t < len; t++) {
            const float *kr = c->hk + ((size_t)sq * s->capacity + t) * c->row + (size_t)kvh * hd;
            double d = 0.0;
            for (int e = 0; e < hd; e++)
                d += (double)q[h * hd + e] * kr[e];
            w[t] = d * scale;
            mx = w[t] > mx ? w[t] : mx;
        }
        double z = 0.0;
        for (int t = 0; t < len; t++) {
            w[t] = exp(w[t] - mx);
            z += w[t];
        }
        for (int e = 0; e < hd; e++) {
            double a = 0.0;
            for (int t = 0; t < len; t++)
                a += w[t] * c->hv[((size_t)sq * s->capacity + t) * c->row + (size_t)kvh * hd + e];
            out[h * hd + e] = len > 0 ? a / z : 0.0;
        }
    }
    free(w);
}

static double tolerance(const cache *c) { return 2e-4 * c->vmax + 1e-6; }

static void random_q(float *q, int64_t n, float range)
{
    for (int64_t i = 0; i < n; i++)
        q[i] = test_rand_float(-range, range);
}

/* ---- decode ------------------------------------------------------------------ */

/* Runs decode for all sequences with the given split count and returns
 * the output (n_seq rows of stride ldo; the padding is checked to stay
 * poisoned). */
static float *run_decode(const cache *c, const float *q, const int32_t *lens, int splits)
{
    const bn_attn_shape *s = &c->s;
    const int qrow = s->n_heads * s->head_dim;
    const int64_t ldq = qrow + 5, ldo = qrow + 7;
    float *dq, *dout;
    int32_t *dlen;
    void *ws = NULL;
    CUDA_OK(cudaMalloc((void **)&dq, sizeof(float) * (size_t)(c->n_seq * ldq)));
    CUDA_OK(cudaMemcpy2D(dq, sizeof(float) * (size_t)ldq, q, sizeof(float) * (size_t)qrow,
                         sizeof(float) * (size_t)qrow, (size_t)c->n_seq, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)(c->n_seq * ldo)));
    CUDA_OK(cudaMemset(dout, 0xff, sizeof(float) * (size_t)(c->n_seq * ldo)));
    CUDA_OK(cudaMalloc((void **)&dlen, sizeof(int32_t) * (size_t)c->n_seq));
    CUDA_OK(cudaMemcpy(dlen, lens, sizeof(int32_t) * (size_t)c->n_seq, cudaMemcpyHostToDevice));
    const size_t wsb = bn_attn_decode_workspace_bytes(s, c->n_seq, splits);
    if (wsb) {
        CUDA_OK(cudaMalloc(&ws, wsb));
        CUDA_OK(cudaMemset(ws, 0xff, wsb));
    }
    const bn_attn_decode_args a = {dq, ldq, layer_base(c, c->dk), layer_base(c, c->dv),
                                   seq_stride(c), dlen, c->n_seq, dout, ldo, splits, ws};
    CUDA_OK(bn_attn_decode(s, &a, 0));
    CUDA_OK(cudaDeviceSynchronize());
    float *out = malloc(sizeof(float) * (size_t)(c->n_seq * ldo));
    CUDA_OK(cudaMemcpy(out, dout, sizeof(float) * (size_t)(c->n_seq * ldo),
                       cudaMemcpyDeviceToHost));
    int64_t touched = 0;
    for (int sq = 0; sq < c->n_seq; sq++)
        for (int64_t i = qrow; i < ldo; i++) {
            uint32_t b;
            memcpy(&b, &out[sq * ldo + i], 4);
            touched += b != 0xffffffffu;
        }
    CHECK_MSG(touched == 0, "decode wrote %lld padding floats", (long long)touched);
    /* Compact to n_seq rows of qrow. */
    for (int sq = 0; sq < c->n_seq; sq++)
        memmove(out + (size_t)sq * qrow, out + (size_t)sq * ldo, sizeof(float) * (size_t)qrow);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dlen);
    cudaFree(ws);
    return out;
}

/* Worst |error| / max|v| seen, per kind of comparison (printed at the end). */
enum { SEEN_DECODE, SEEN_FMA, SEEN_MMA, SEEN_KINDS };
static double worst_seen[SEEN_KINDS];

static void compare(const char *what, const cache *c, const float *got, const double *ref,
                    int64_t n, double tol)
{
    const int kind = strstr(what, "mma") ? SEEN_MMA : strstr(what, "fma") ? SEEN_FMA : SEEN_DECODE;
    double worst = 0.0;
    int64_t at = -1, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        if (!(e <= tol))
            bad++;
        if (!(e <= worst)) { /* NaN counts as worst */
            worst = e;
            at = i;
        }
    }
    if (c->vmax > 0.0f && !(worst / c->vmax <= worst_seen[kind]))
        worst_seen[kind] = worst / c->vmax;
    CHECK_MSG(bad == 0,
              "%s (%s, heads %d/%d, head_dim %d): %lld of %lld beyond %.3g, worst %.3g at %lld "
              "(%g vs %g)",
              what, c->s.kv_type == BN_ATTN_KV_F16 ? "f16" : "bf16", c->s.n_heads, c->s.n_kv_heads,
              c->s.head_dim, (long long)bad, (long long)n, tol, worst, (long long)at,
              at >= 0 ? (double)got[at] : 0.0, at >= 0 ? ref[at] : 0.0);
}

/* n_seq sequences with lengths lens[] (at most capacity), appended in one
 * shuffled call (plus two out-of-range rows), decoded with every split
 * mode. */
static void check_decode(const bn_attn_shape *s, int n_seq, const int32_t *lens, float qrange)
{
    cache c;
    cache_init(&c, s, n_seq, 2);
    int total = 2;
    for (int i = 0; i < n_seq; i++)
        total += lens[i];
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)total);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)total);
    int t = 0;
    for (int i = 0; i < n_seq; i++)
        for (int p = 0; p < lens[i]; p++, t++) {
            pos[t] = p;
            seq[t] = i;
        }
    pos[t] = -1, seq[t++] = 0;
    pos[t] = (int32_t)s->capacity, seq[t++] = n_seq - 1;
    for (int i = total - 1; i > 0; i--) { /* order must not matter */
        const int j = (int)test_rand_range(0, i);
        const int32_t tp = pos[i], ts = seq[i];
        pos[i] = pos[j], seq[i] = seq[j];
        pos[j] = tp, seq[j] = ts;
    }
    cache_append(&c, total, pos, seq, test_rand_float(0.5f, 4.0f));
    cache_verify(&c);

    const int qrow = s->n_heads * s->head_dim;
    float *q = malloc(sizeof(float) * (size_t)(n_seq * qrow));
    random_q(q, (int64_t)n_seq * qrow, qrange);
    double *ref = malloc(sizeof(double) * (size_t)(n_seq * qrow));
    int32_t max_len = 1;
    for (int i = 0; i < n_seq; i++) {
        /* The kernels clamp a length to the capacity (attention_cuda.h), and
         * so must the reference: lens[1] (2..70) exceeds a capacity below 70
         * now and then, and positions >= capacity of sequence i are not in
         * the cache - the host record's rows there belong to sequence i + 1
         * (or lie past the array for the last sequence). */
        const int len = lens[i] > s->capacity ? (int)s->capacity : lens[i];
        ref_attention(&c, i, q + (size_t)i * qrow, len, ref + (size_t)i * qrow);
        max_len = lens[i] > max_len ? lens[i] : max_len;
    }
    const int auto_splits = bn_attn_decode_splits(s, n_seq, s->capacity, sm_count);
    const int modes[] = {1, auto_splits, 3, 256};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        float *out = run_decode(&c, q, lens, modes[m]);
        char what[160];
        int used = snprintf(what, sizeof what, "decode splits=%d n_seq=%d max_len=%d cap=%lld lens",
                            modes[m], n_seq, (int)max_len, (long long)s->capacity);
        for (int i = 0; i < n_seq && used > 0 && used < (int)sizeof what - 12; i++)
            used += snprintf(what + used, sizeof what - (size_t)used, " %d", (int)lens[i]);
        compare(what, &c, out, ref, (int64_t)n_seq * qrow, tolerance(&c));
        free(out);
    }
    free(q);
    free(ref);
    free(pos);
    free(seq);
    cache_free(&c);
}

/* ---- prefill ------------------------------------------------------------------ */

/* Prefill of n queries (row stride not the row length) at pos0 with one
 * implementation; the padding is checked to stay poisoned. Returns n rows
 * of n_heads * head_dim. */
static float *run_prefill(const cache *c, const float *q, int n, int pos0, int variant)
{
    const bn_attn_shape *s = &c->s;
    const int qrow = s->n_heads * s->head_dim;
    const int64_t ldq = qrow + 1, ldo = qrow + 9;
    float *dq, *dout;
    int32_t *dpos0;
    CUDA_OK(cudaMalloc((void **)&dq, sizeof(float) * (size_t)(n * ldq)));
    CUDA_OK(cudaMemcpy2D(dq, sizeof(float) * (size_t)ldq, q, sizeof(float) * (size_t)qrow,
                         sizeof(float) * (size_t)qrow, (size_t)n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)(n * ldo)));
    CUDA_OK(cudaMemset(dout, 0xff, sizeof(float) * (size_t)(n * ldo)));
    CUDA_OK(cudaMalloc((void **)&dpos0, sizeof(int32_t)));
    CUDA_OK(cudaMemcpy(dpos0, &pos0, sizeof(int32_t), cudaMemcpyHostToDevice));
    CUDA_OK(bn_attn_prefill_variant(s, dq, ldq, n, dpos0, layer_base(c, c->dk),
                                    layer_base(c, c->dv), dout, ldo, variant, 0));
    CUDA_OK(cudaDeviceSynchronize());
    float *out = malloc(sizeof(float) * (size_t)(n * ldo));
    CUDA_OK(cudaMemcpy(out, dout, sizeof(float) * (size_t)(n * ldo), cudaMemcpyDeviceToHost));
    int64_t touched = 0;
    for (int i = 0; i < n; i++)
        for (int64_t j = qrow; j < ldo; j++) {
            uint32_t b;
            memcpy(&b, &out[i * ldo + j], 4);
            touched += b != 0xffffffffu;
        }
    CHECK_MSG(touched == 0, "prefill variant %d wrote %lld padding floats", variant,
              (long long)touched);
    for (int i = 0; i < n; i++)
        memmove(out + (size_t)i * qrow, out + (size_t)i * ldo, sizeof(float) * (size_t)qrow);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dpos0);
    return out;
}

/* A prefix of pos0 tokens, then n new ones; prefill of the n against the
 * reference and against n decode steps (kv_len = pos0 + i + 1). */
static void check_prefill(const bn_attn_shape *s, int pos0, int n, float qrange)
{
    cache c;
    cache_init(&c, s, 1, 2);
    const int total = pos0 + n;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)total);
    int32_t *seq = calloc((size_t)total, sizeof(int32_t));
    for (int i = 0; i < total; i++)
        pos[i] = i;
    const float vr = test_rand_float(0.5f, 4.0f);
    if (pos0 > 0)
        cache_append(&c, pos0, pos, seq, vr);
    cache_append(&c, n, pos + pos0, seq, vr);

    const int qrow = s->n_heads * s->head_dim;
    float *q = malloc(sizeof(float) * (size_t)(n * qrow));
    random_q(q, (int64_t)n * qrow, qrange);
    const int variants = s->head_dim <= 128 ? 2 : 1;
    float *outs[2] = {NULL, NULL};
    for (int var = 0; var < variants; var++)
        outs[var] = run_prefill(&c, q, n, pos0, var);

    /* Reference, row by row (causal: row i sees positions <= pos0 + i). */
    double *ref = malloc(sizeof(double) * (size_t)(n * qrow));
    for (int i = 0; i < n; i++)
        ref_attention(&c, 0, q + (size_t)i * qrow, pos0 + i + 1, ref + (size_t)i * qrow);
    char what[96];
    for (int var = 0; var < variants; var++) {
        snprintf(what, sizeof what, "prefill %s pos0=%d n=%d", var ? "mma" : "fma", pos0, n);
        compare(what, &c, outs[var], ref, (int64_t)n * qrow, tolerance(&c));
    }

    /* n decode steps with the same queries: the consistency the runtime
     * relies on (prefill a prompt, or feed it token by token). */
    int32_t len;
    double *dec = malloc(sizeof(double) * (size_t)(n * qrow));
    const int splits = bn_attn_decode_splits(s, 1, s->capacity, sm_count);
    for (int i = 0; i < n; i++) {
        len = pos0 + i + 1;
        float *o = run_decode(&c, q + (size_t)i * qrow, &len, splits);
        for (int j = 0; j < qrow; j++)
            dec[(size_t)i * qrow + j] = o[j];
        free(o);
    }
    for (int var = 0; var < variants; var++) {
        snprintf(what, sizeof what, "prefill %s vs %d decode steps (pos0=%d)", var ? "mma" : "fma",
                 n, pos0);
        compare(what, &c, outs[var], dec, (int64_t)n * qrow, tolerance(&c));
        free(outs[var]);
    }

    free(dec);
    free(ref);
    free(q);
    free(pos);
    free(seq);
    cache_free(&c);
}

/* ---- a captured graph replayed as the cache grows --------------------------- */

static void check_graph(const bn_attn_shape *s, int steps)
{
    cache c;
    cache_init(&c, s, 1, 1);
    const int qrow = s->n_heads * s->head_dim, row = c.row;
    float *dq, *dout, *dk, *dv;
    int32_t *dpos, *dlen;
    CUDA_OK(cudaMalloc((void **)&dq, sizeof(float) * (size_t)qrow));
    CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)qrow));
    CUDA_OK(cudaMalloc((void **)&dk, sizeof(float) * (size_t)row));
    CUDA_OK(cudaMalloc((void **)&dv, sizeof(float) * (size_t)row));
    CUDA_OK(cudaMalloc((void **)&dpos, sizeof(int32_t)));
    CUDA_OK(cudaMalloc((void **)&dlen, sizeof(int32_t)));
    const int splits = bn_attn_decode_splits(s, 1, s->capacity, sm_count);
    void *ws = NULL;
    const size_t wsb = bn_attn_decode_workspace_bytes(s, 1, splits);
    if (wsb)
        CUDA_OK(cudaMalloc(&ws, wsb));

    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(bn_attn_kv_append(s, dk, dv, row, 1, dpos, NULL, c.dk, c.dv, 0, st));
    const bn_attn_decode_args a = {dq, qrow, c.dk, c.dv, 0, dlen, 1, dout, qrow, splits, ws};
    CUDA_OK(bn_attn_decode(s, &a, st));
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    float *k = malloc(sizeof(float) * (size_t)row), *v = malloc(sizeof(float) * (size_t)row);
    float *q = malloc(sizeof(float) * (size_t)qrow), *out = malloc(sizeof(float) * (size_t)qrow);
    double *ref = malloc(sizeof(double) * (size_t)qrow);
    double worst = 0.0;
    int bad = 0;
    for (int t = 0; t < steps; t++) {
        for (int j = 0; j < row; j++) {
            k[j] = test_rand_float(-1.0f, 1.0f);
            v[j] = test_rand_float(-2.0f, 2.0f);
            c.hk[(size_t)t * row + j] = from_kv(to_kv(k[j], s->kv_type), s->kv_type);
            c.hv[(size_t)t * row + j] = from_kv(to_kv(v[j], s->kv_type), s->kv_type);
            if (fabsf(c.hv[(size_t)t * row + j]) > c.vmax)
                c.vmax = fabsf(c.hv[(size_t)t * row + j]);
        }
        random_q(q, qrow, 2.0f);
        const int32_t pos = t, len = t + 1;
        CUDA_OK(cudaMemcpyAsync(dk, k, sizeof(float) * (size_t)row, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemcpyAsync(dv, v, sizeof(float) * (size_t)row, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemcpyAsync(dq, q, sizeof(float) * (size_t)qrow, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemcpyAsync(dpos, &pos, sizeof pos, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemcpyAsync(dlen, &len, sizeof len, cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaGraphLaunch(exec, st));
        CUDA_OK(cudaMemcpyAsync(out, dout, sizeof(float) * (size_t)qrow, cudaMemcpyDeviceToHost,
                                st));
        CUDA_OK(cudaStreamSynchronize(st));
        ref_attention(&c, 0, q, len, ref);
        for (int j = 0; j < qrow; j++) {
            const double e = fabs((double)out[j] - ref[j]);
            bad += !(e <= tolerance(&c));
            worst = e > worst || e != e ? e : worst;
        }
    }
    CHECK_MSG(bad == 0, "graph replay over %d steps (splits %d): %d outputs off, worst %.3g",
              steps, splits, bad, worst);
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(st));
    free(k);
    free(v);
    free(q);
    free(out);
    free(ref);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dpos);
    cudaFree(dlen);
    cudaFree(ws);
    cache_free(&c);
}

/* ---- timing (printed, not checked) ------------------------------------------ */

static void time_2b4t(bn_kv_type type)
{
    const bn_attn_shape s = {20, 5, 128, 4096, type, 0.0f};
    cache c;
    cache_init(&c, &s, 1, 1);
    CUDA_OK(cudaMemset(c.dk, 0, (size_t)bn_attn_layer_elems(&s) * 2));
    CUDA_OK(cudaMemset(c.dv, 0, (size_t)bn_attn_layer_elems(&s) * 2));
    const int qrow = 20 * 128, n = 512;
    float *dq, *dout;
    int32_t *dlen, *dpos0;
    CUDA_OK(cudaMalloc((void **)&dq, sizeof(float) * (size_t)(n * qrow)));
    CUDA_OK(cudaMemset(dq, 0, sizeof(float) * (size_t)(n * qrow)));
    CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)(n * qrow)));
    CUDA_OK(cudaMalloc((void **)&dlen, sizeof(int32_t)));
    CUDA_OK(cudaMalloc((void **)&dpos0, sizeof(int32_t)));
    const int splits = bn_attn_decode_splits(&s, 1, s.capacity, sm_count);
    void *ws;
    CUDA_OK(cudaMalloc(&ws, bn_attn_decode_workspace_bytes(&s, 1, splits) + 1));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    /* A one-token append: about the cost of any launch, for reference. */
    {
        int32_t zero = 0;
        CUDA_OK(cudaMemcpy(dlen, &zero, sizeof zero, cudaMemcpyHostToDevice));
        CUDA_OK(cudaEventRecord(e0, 0));
        for (int r = 0; r < 50; r++)
            CUDA_OK(bn_attn_kv_append(&s, dq, dq, 640, 1, dlen, NULL, c.dk, c.dv, 0, 0));
        CUDA_OK(cudaEventRecord(e1, 0));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        printf("time: kv append of one token (launch floor): %.2f us\n", ms * 1000.0f / 50);
    }
    const int lens[] = {128, 1024, 4096};
    for (int i = 0; i < 3; i++) {
        CUDA_OK(cudaMemcpy(dlen, &lens[i], sizeof(int32_t), cudaMemcpyHostToDevice));
        const bn_attn_decode_args a = {dq, qrow, c.dk, c.dv, 0, dlen, 1, dout, qrow, splits, ws};
        for (int r = 0; r < 5; r++)
            CUDA_OK(bn_attn_decode(&s, &a, 0));
        CUDA_OK(cudaEventRecord(e0, 0));
        for (int r = 0; r < 50; r++)
            CUDA_OK(bn_attn_decode(&s, &a, 0));
        CUDA_OK(cudaEventRecord(e1, 0));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        printf("time: decode %s 20/5x128 kv_len %d (splits %d): %.2f us/layer\n",
               type == BN_ATTN_KV_F16 ? "f16" : "bf16", lens[i], splits, ms * 1000.0f / 50);
    }
    const int pos0s[] = {0, 3584};
    for (int i = 0; i < 4; i++) {
        const int var = i / 2;
        CUDA_OK(cudaMemcpy(dpos0, &pos0s[i % 2], sizeof(int32_t), cudaMemcpyHostToDevice));
        CUDA_OK(bn_attn_prefill_variant(&s, dq, qrow, n, dpos0, c.dk, c.dv, dout, qrow, var, 0));
        CUDA_OK(cudaEventRecord(e0, 0));
        for (int r = 0; r < 5; r++)
            CUDA_OK(
                bn_attn_prefill_variant(&s, dq, qrow, n, dpos0, c.dk, c.dv, dout, qrow, var, 0));
        CUDA_OK(cudaEventRecord(e1, 0));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        printf("time: prefill %s %s 20/5x128 n %d at pos0 %d: %.1f us/layer\n",
               var ? "mma" : "fma", type == BN_ATTN_KV_F16 ? "f16" : "bf16", n, pos0s[i % 2],
               ms * 1000.0f / 5);
    }
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dlen);
    cudaFree(dpos0);
    cudaFree(ws);
    cache_free(&c);
}

int main(void)
{
    sm_count = test_require_cuda(8, "the attention kernels").multiProcessorCount;
    const bool quick = getenv("BN_TEST_QUICK") != NULL;

    /* Shape checks. */
    {
        bn_attn_shape bad = {20, 6, 128, 64, BN_ATTN_KV_F16, 0.0f};
        CHECK(bn_attn_check_shape(&bad) == cudaErrorInvalidValue); /* 20 % 6 */
        bad.n_kv_heads = 5;
        bad.head_dim = 96;
        CHECK(bn_attn_check_shape(&bad) == cudaErrorInvalidValue);
        bad.head_dim = 128;
        CHECK(bn_attn_check_shape(&bad) == cudaSuccess);
        CHECK(bn_attn_decode_splits(&bad, 1, 64, 132) == 1);
        CHECK(bn_attn_decode_splits(&bad, 1, 4096, 132) > 1);
    }

    /* (heads, kv heads, head_dim): the 2B-4T heads, MHA, each templated
     * group size (2, 4, 8) and a group of 3 (the per-head fallback). */
    const int shapes[][3] = {{20, 5, 128}, {8, 8, 64}, {4, 2, 256}, {16, 2, 64}, {6, 2, 128},
                             {24, 3, 128}};
    for (int t = 0; t < 2; t++) {
        const bn_kv_type type = t ? BN_ATTN_KV_BF16 : BN_ATTN_KV_F16;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const int64_t cap = test_rand_range(40, 700);
            const bn_attn_shape s = {shapes[i][0], shapes[i][1], shapes[i][2], cap, type, 0.0f};
            /* Ragged lengths: 1, short, around a range boundary, the whole
             * cache; 0 (an empty sequence gives zeros). */
            int32_t lens[4] = {1, (int32_t)test_rand_range(2, 70), (int32_t)cap,
                               (int32_t)test_rand_range(0, cap)};
            check_decode(&s, 4, lens, 2.0f);
            const int32_t zero = 0;
            check_decode(&s, 1, &zero, 1.0f);
            check_prefill(&s, 0, (int)test_rand_range(1, cap / 2), 2.0f);
            check_prefill(&s, (int)test_rand_range(1, cap / 2), (int)test_rand_range(1, cap / 2),
                          2.0f);
        }
        /* 2B-4T, context 4096: long lengths through the split path, peaky
         * softmax (large queries: scores with a spread of tens, whose
         * exponentials overflow fp32 without the max subtraction),
         * a prompt after a long prefix, and the graph. */
        const bn_attn_shape big = {20, 5, 128, 4096, type, 0.0f};
        int32_t lens[2] = {4096, (int32_t)test_rand_range(1000, 4095)};
        check_decode(&big, 2, lens, 2.0f);
        int32_t one = (int32_t)test_rand_range(2000, 4096);
        check_decode(&big, 1, &one, 32.0f);
        if (!quick) {
            check_prefill(&big, 0, 200, 2.0f);
            /* Peaky too: large scores stress the hi + lo split of Q. */
            check_prefill(&big, (int)test_rand_range(1000, 3500), (int)test_rand_range(20, 150),
                          16.0f);
        } else {
            check_prefill(&big, 300, 40, 2.0f);
        }
        check_graph(&big, quick ? 70 : 300);
    }
    printf("worst |error| / max|v|: decode %.2e, prefill fma %.2e, prefill mma %.2e "
           "(bound 2e-4)\n",
           worst_seen[SEEN_DECODE], worst_seen[SEEN_FMA], worst_seen[SEEN_MMA]);
    if (!quick) {
        time_2b4t(BN_ATTN_KV_F16);
        time_2b4t(BN_ATTN_KV_BF16);
    }
    TEST_EXIT();
}
