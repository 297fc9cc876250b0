/* GPU test: attention over the fp16 KV cache, decode (single range and
 * flash-decoding splits) and causal prefill (the tensor-core kernel at
 * head_dim 64 and 128, the FMA kernel at 256), against a double precision
 * CPU reference over the same fp16-rounded cache values, on random ragged
 * shapes including the 2B-4T heads (20 / 5, head_dim 128) and long kv
 * lengths; prefill against n decode steps; a captured graph replayed as
 * the cache grows. The test writes the cache from the host; unwritten
 * cache slots and outputs are poisoned with NaN. Exits 77 without a usable
 * GPU.
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
 * (~22 significant bits; K and V exact), so its extra error is ~2^-22
 * relative, inside the budget. Prefill vs decode
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

/* ---- the cache's layout (attention_cuda.h) ------------------------------------ */

/* Elements of one layer of one sequence. */
static int64_t layer_elems(const bn_attn_shape *s)
{
    return s->capacity * s->n_kv_heads * s->head_dim;
}

/* Element index of (seq, layer, pos, element of the row) in a cache of
 * n_layers. */
static int64_t kv_index(const bn_attn_shape *s, int n_layers, int64_t seq, int layer,
                        int64_t pos, int j)
{
    return ((seq * n_layers + layer) * s->capacity + pos) * s->n_kv_heads * s->head_dim + j;
}

/* ---- problem data ----------------------------------------------------------- */

/* One test cache: n_seq sequences x n_layers layers on the device, its
 * host image (the fp16 bits the device gets), and the rounded values of
 * every written row (for layer `layer`). */
typedef struct cache {
    bn_attn_shape s;
    int n_layers, layer, n_seq;
    int row;                /* n_kv_heads * head_dim */
    uint16_t *dk, *dv;      /* device, all layers */
    uint16_t *ik, *iv;      /* host image of dk, dv */
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
    const size_t elems = (size_t)n_seq * (size_t)n_layers * (size_t)layer_elems(s);
    CUDA_OK(cudaMalloc((void **)&c->dk, elems * 2));
    CUDA_OK(cudaMalloc((void **)&c->dv, elems * 2));
    /* 0xffff is NaN in fp16: reading an unwritten slot shows. */
    c->ik = malloc(elems * 2);
    c->iv = malloc(elems * 2);
    memset(c->ik, 0xff, elems * 2);
    memset(c->iv, 0xff, elems * 2);
    CUDA_OK(cudaMemcpy(c->dk, c->ik, elems * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(c->dv, c->iv, elems * 2, cudaMemcpyHostToDevice));
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
    free(c->ik);
    free(c->iv);
    free(c->hk);
    free(c->hv);
}

static int64_t seq_stride(const cache *c) { return (int64_t)c->n_layers * layer_elems(&c->s); }

static uint16_t *layer_base(const cache *c, uint16_t *base)
{
    return base + (int64_t)c->layer * layer_elems(&c->s);
}

/* Writes n rows (random k in [-1, 1], v in [-vr, vr]) at pos[i] of
 * seq[i] of layer `layer`, as fp16, into the host image and the device
 * cache, recording the rounded values; rows at a position outside the
 * cache are left out. */
static void cache_write(cache *c, int n, const int32_t *pos, const int32_t *seq, float vr)
{
    const int row = c->row;
    for (int i = 0; i < n; i++) {
        if (pos[i] < 0 || pos[i] >= c->s.capacity)
            continue;
        const size_t d = (size_t)kv_index(&c->s, c->n_layers, seq[i], c->layer, pos[i], 0);
        const size_t h = ((size_t)seq[i] * (size_t)c->s.capacity + (size_t)pos[i]) * row;
        for (int j = 0; j < row; j++) {
            c->ik[d + j] = bn_fp32_to_fp16(test_rand_float(-1.0f, 1.0f));
            c->iv[d + j] = bn_fp32_to_fp16(test_rand_float(-vr, vr));
            c->hk[h + j] = bn_fp16_to_fp32(c->ik[d + j]);
            c->hv[h + j] = bn_fp16_to_fp32(c->iv[d + j]);
            if (fabsf(c->hv[h + j]) > c->vmax)
                c->vmax = fabsf(c->hv[h + j]);
        }
    }
    const size_t elems = (size_t)c->n_seq * (size_t)c->n_layers * (size_t)layer_elems(&c->s);
    CUDA_OK(cudaMemcpy(c->dk, c->ik, elems * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(c->dv, c->iv, elems * 2, cudaMemcpyHostToDevice));
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
              "%s (heads %d/%d, head_dim %d): %lld of %lld beyond %.3g, worst %.3g at %lld "
              "(%g vs %g)",
              what, c->s.n_heads, c->s.n_kv_heads,
              c->s.head_dim, (long long)bad, (long long)n, tol, worst, (long long)at,
              at >= 0 ? (double)got[at] : 0.0, at >= 0 ? ref[at] : 0.0);
}

/* n_seq sequences with lengths lens[] (at most capacity), written in a
 * shuffled order, decoded with every split mode. */
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
    pos[t] = -1, seq[t++] = 0; /* two rows outside the cache, left out */
    pos[t] = (int32_t)s->capacity, seq[t++] = n_seq - 1;
    for (int i = total - 1; i > 0; i--) {
        const int j = (int)test_rand_range(0, i);
        const int32_t tp = pos[i], ts = seq[i];
        pos[i] = pos[j], seq[i] = seq[j];
        pos[j] = tp, seq[j] = ts;
    }
    cache_write(&c, total, pos, seq, test_rand_float(0.5f, 4.0f));

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

/* Prefill of n queries (row stride not the row length) at pos0; the
 * padding is checked to stay poisoned. Returns n rows of n_heads *
 * head_dim. */
static float *run_prefill(const cache *c, const float *q, int n, int pos0)
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
    CUDA_OK(bn_attn_prefill(s, dq, ldq, n, dpos0, layer_base(c, c->dk), layer_base(c, c->dv),
                            dout, ldo, 0));
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
    CHECK_MSG(touched == 0, "prefill wrote %lld padding floats", (long long)touched);
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
    cache_write(&c, total, pos, seq, vr);

    const int qrow = s->n_heads * s->head_dim;
    float *q = malloc(sizeof(float) * (size_t)(n * qrow));
    random_q(q, (int64_t)n * qrow, qrange);
    float *out = run_prefill(&c, q, n, pos0);
    const char *kernel = s->head_dim <= 128 ? "mma" : "fma";

    /* Reference, row by row (causal: row i sees positions <= pos0 + i). */
    double *ref = malloc(sizeof(double) * (size_t)(n * qrow));
    for (int i = 0; i < n; i++)
        ref_attention(&c, 0, q + (size_t)i * qrow, pos0 + i + 1, ref + (size_t)i * qrow);
    char what[96];
    snprintf(what, sizeof what, "prefill %s pos0=%d n=%d", kernel, pos0, n);
    compare(what, &c, out, ref, (int64_t)n * qrow, tolerance(&c));

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
    snprintf(what, sizeof what, "prefill %s vs %d decode steps (pos0=%d)", kernel, n, pos0);
    compare(what, &c, out, dec, (int64_t)n * qrow, tolerance(&c));
    free(out);

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
    float *dq, *dout;
    int32_t *dlen;
    CUDA_OK(cudaMalloc((void **)&dq, sizeof(float) * (size_t)qrow));
    CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)qrow));
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
    const bn_attn_decode_args a = {dq, qrow, c.dk, c.dv, 0, dlen, 1, dout, qrow, splits, ws};
    CUDA_OK(bn_attn_decode(s, &a, st));
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    float *q = malloc(sizeof(float) * (size_t)qrow), *out = malloc(sizeof(float) * (size_t)qrow);
    double *ref = malloc(sizeof(double) * (size_t)qrow);
    double worst = 0.0;
    int bad = 0;
    for (int t = 0; t < steps; t++) {
        /* The step's k and v row at position t, then the replay over len t + 1. */
        for (int j = 0; j < row; j++) {
            c.ik[(size_t)t * row + j] = bn_fp32_to_fp16(test_rand_float(-1.0f, 1.0f));
            c.iv[(size_t)t * row + j] = bn_fp32_to_fp16(test_rand_float(-2.0f, 2.0f));
            c.hk[(size_t)t * row + j] = bn_fp16_to_fp32(c.ik[(size_t)t * row + j]);
            c.hv[(size_t)t * row + j] = bn_fp16_to_fp32(c.iv[(size_t)t * row + j]);
            if (fabsf(c.hv[(size_t)t * row + j]) > c.vmax)
                c.vmax = fabsf(c.hv[(size_t)t * row + j]);
        }
        random_q(q, qrow, 2.0f);
        const int32_t len = t + 1;
        CUDA_OK(cudaMemcpyAsync(c.dk + (size_t)t * row, c.ik + (size_t)t * row, 2 * (size_t)row,
                                cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemcpyAsync(c.dv + (size_t)t * row, c.iv + (size_t)t * row, 2 * (size_t)row,
                                cudaMemcpyHostToDevice, st));
        CUDA_OK(cudaMemcpyAsync(dq, q, sizeof(float) * (size_t)qrow, cudaMemcpyHostToDevice, st));
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
    free(q);
    free(out);
    free(ref);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dlen);
    cudaFree(ws);
    cache_free(&c);
}

/* ---- timing (printed, not checked) ------------------------------------------ */

static void time_2b4t(void)
{
    const bn_attn_shape s = {20, 5, 128, 4096, BN_ATTN_KV_F16, 0.0f};
    cache c;
    cache_init(&c, &s, 1, 1);
    CUDA_OK(cudaMemset(c.dk, 0, (size_t)layer_elems(&s) * 2));
    CUDA_OK(cudaMemset(c.dv, 0, (size_t)layer_elems(&s) * 2));
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
        printf("time: decode f16 20/5x128 kv_len %d (splits %d): %.2f us/layer\n", lens[i],
               splits, ms * 1000.0f / 50);
    }
    const int pos0s[] = {0, 3584};
    for (int i = 0; i < 2; i++) {
        CUDA_OK(cudaMemcpy(dpos0, &pos0s[i], sizeof(int32_t), cudaMemcpyHostToDevice));
        CUDA_OK(bn_attn_prefill(&s, dq, qrow, n, dpos0, c.dk, c.dv, dout, qrow, 0));
        CUDA_OK(cudaEventRecord(e0, 0));
        for (int r = 0; r < 5; r++)
            CUDA_OK(bn_attn_prefill(&s, dq, qrow, n, dpos0, c.dk, c.dv, dout, qrow, 0));
        CUDA_OK(cudaEventRecord(e1, 0));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        printf("time: prefill mma f16 20/5x128 n %d at pos0 %d: %.1f us/layer\n", n, pos0s[i],
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
        bad.kv_type = (bn_kv_type)1; /* fp16 is the one element type */
        CHECK(bn_attn_check_shape(&bad) == cudaErrorInvalidValue);
        bad.kv_type = BN_ATTN_KV_F16;
        CHECK(bn_attn_decode_splits(&bad, 1, 64, 132) == 1);
        CHECK(bn_attn_decode_splits(&bad, 1, 4096, 132) > 1);
    }

    /* (heads, kv heads, head_dim): the 2B-4T heads, MHA, each templated
     * group size (2, 4, 8) and a group of 3 (the per-head fallback). */
    const int shapes[][3] = {{20, 5, 128}, {8, 8, 64}, {4, 2, 256}, {16, 2, 64}, {6, 2, 128},
                             {24, 3, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t cap = test_rand_range(40, 700);
        const bn_attn_shape s = {shapes[i][0], shapes[i][1], shapes[i][2],
                                 cap,          BN_ATTN_KV_F16, 0.0f};
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
    const bn_attn_shape big = {20, 5, 128, 4096, BN_ATTN_KV_F16, 0.0f};
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
    printf("worst |error| / max|v|: decode %.2e, prefill fma %.2e, prefill mma %.2e "
           "(bound 2e-4)\n",
           worst_seen[SEEN_DECODE], worst_seen[SEEN_FMA], worst_seen[SEEN_MMA]);
    if (!quick)
        time_2b4t();
    TEST_EXIT();
}
