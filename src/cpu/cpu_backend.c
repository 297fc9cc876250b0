/*
 * cpu_backend.c - the whole forward pass on the CPU (see cpu_backend.h for
 * the math). The W2A8 products go through the selected kernel provider;
 * everything else (norms, RoPE, attention, the FFN gate, the LM head) is
 * plain fp32 here.
 *
 * Buffers for one chunk of up to CHUNK_ROWS tokens (row-major, one row per
 * token):
 *
 *   x     [M][dim]      the residual stream
 *   q     [M][q_dim]    k, v [M][kv_dim]     projections (k, v then copied
 *                                            into the cache at their positions)
 *   att   [M][q_dim]    attention output     out [M][dim] o / down output
 *   gate  [M][ffn]      up [M][ffn]
 *
 * KV cache: k_cache and v_cache are [n_layer][kv_len][kv_dim] float32.
 *
 * Threads: the W2A8 products split output rows (w2a8.c). Attention and the
 * LM head use one slot per pool thread, each with its own scratch; which
 * thread computes an output never changes the order of its arithmetic, so
 * results do not depend on the thread count.
 *
 * Arithmetic order, fixed so that results are reproducible (and mirrored by
 * tests/test_cpu_forward.c's reference): RMSNorm sums squares in double and
 * scales in fp32 (bn_norm_quantize_row, rmsnorm); int8 codes of a normed
 * row come from exact ratios (bn_norm_quantize_row explains why); dot
 * products use eight interleaved fp32 lanes summed pairwise (dot_f32);
 * softmax multiplies by 1/sum; RoPE angles are (float)pos * inv_freq[j].
 */
#include "cpu_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "head_screen.h"
#include "kernel_manager.h"
#include "quant_rules.h"
#include "sampler.h"
#include "threadpool.h"
#include "w2a8.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Prefill chunk: large enough that each weight row is reused across many
 * tokens, small enough that scratch stays a few MB on the 2B shape. */
#define CHUNK_ROWS 128
/* Greedy rows of a batch whose logits the full head computes at once: the
 * head is read once for up to this many (~16 MiB of logits on the 2B-4T
 * shape's vocabulary). */
#define PICK_ROWS 32

struct bn_cpu_backend {
    const bn_checkpoint *model;
    bn_hparams hp;
    int64_t q_dim, kv_dim;
    const bn_kernel_provider *kernels;
    bn_threadpool *pool;
    int n_slots;             /* one per pool thread */

    bn_w2a8_weights *weights; /* [n_layer][BN_PROJ_COUNT] */
    int64_t kv_len, kv_filled;  /* positions of one sequence; computed by forward() */
    float *k_cache, *v_cache;   /* forward()'s: [n_layer][kv_len][kv_dim] */
    int64_t paged_rows;         /* forward_rows()'s cache, block by block (0: none) */
    float *pk_cache, *pv_cache; /* [n_layer][paged_rows][kv_dim] */
    int64_t *row_pos;           /* [CHUNK_ROWS] forward()'s rows as a batch */
    int32_t *row_seq;
    float *inv_freq;          /* [rope_dim / 2] */
    float *rope_cos, *rope_sin; /* [CHUNK_ROWS][rope_dim / 2]: the pass's rows' */

    float *x, *q, *k, *v, *att, *out, *gate, *up;
    bn_q8_rows q8;            /* CHUNK_ROWS rows of the widest input */
    float *scores;            /* [n_slots][group][kv_len] */
    float *head_rows;         /* [n_slots][dim] a dequantized LM head row */
    float *normed_out;        /* [CHUNK_ROWS][dim] output_norm(x) */
    bool f16c;                /* convert F16 LM head rows with F16C */
    bool avx;                 /* attention's dot products and sums with AVX */

    uint64_t weight_bytes, kv_bytes, scratch_bytes;
    /* Greedy picks through the screened head (head_screen.h). */
    bn_head_screen screen;
    bn_head_screen_x screen_x;  /* the hidden state's codes                */
    double *screen_lo, *screen_hi; /* [vocab] each row's bounds             */
    double *slot_max;           /* [n_slots] the largest lower bound seen  */
    double screen_cut;          /* the largest of all: T                   */
    float *pick_logits;         /* [PICK_ROWS][vocab]: one row's candidates'
                                 * logits (-inf else), or PICK_ROWS rows'  */
    bn_sampler *greedy;         /* the host's greedy rule over those       */
    bool screened;              /* the int8 copy exists (build_screen)     */
    bn_cpu_stage_times times; /* bn_cpu_backend_stage_times */
    int pass_kind;            /* times' index of the pass running: 0 one row */
};

/* Adds the time since t0 to stage s of the running pass; returns now, the
 * start of the next stage. */
static double lap(bn_cpu_backend *b, bn_cpu_stage s, double t0)
{
    const double now = bn_time_seconds();
    b->times.seconds[b->pass_kind][s] += now - t0;
    return now;
}

/* A pass of m rows starts. */
static void pass_begin(bn_cpu_backend *b, int64_t m)
{
    b->pass_kind = m == 1 ? 0 : 1;
    b->times.passes[b->pass_kind]++;
    b->times.rows[b->pass_kind] += (uint64_t)m;
}

/* ---- small fp32 building blocks ------------------------------------------- */

/* RMSNorm as transformers computes it: out = w * (x * rsqrt(mean(x^2) + eps)).
 * The sum of squares is accumulated in double, closer to torch's pairwise
 * sum than a running float sum. */
static void rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * (double)x[i];
    const float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = w[i] * (x[i] * inv);
}

/* Eight running sums, combined pairwise at the end: the compiler may keep
 * them in one vector register, and the result never depends on that. */
static float dot_f32(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++)
        acc[l] += a[i] * b[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

#if defined(__x86_64__)
/* dot_f32's sum (same lanes, same order, multiply then add) of one F16 row
 * a (F16C conversion is exact) with R rows of xs (n floats each), sum i
 * into out[i * stride]. The row is converted once for all R, and the R
 * sums are independent chains: one row at a time, each 8-lane step would
 * wait for the add before it. */
__attribute__((target("avx,f16c"), always_inline)) static inline void
dots_f16_block(const uint16_t *a, const float *xs, int64_t n, float *out, int64_t stride,
               const int R)
{
    __m256 acc[8];
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 av = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(av, _mm256_loadu_ps(xs + r * n + i)));
    }
    for (int r = 0; r < R; r++) {
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[r]);
        for (int64_t j = i, l = 0; j < n; j++, l++)
            lanes[l] += bn_fp16_to_fp32(a[j]) * xs[r * n + j];
        out[r * stride] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                          ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    }
}

__attribute__((target("avx,f16c"))) static void dots_f16_f32_f16c(const uint16_t *a,
                                                                  const float *xs, int64_t rows,
                                                                  int64_t n, float *out,
                                                                  int64_t stride)
{
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8)
        dots_f16_block(a, xs + r * n, n, out + r * stride, stride, 8);
    if (rows - r >= 4) {
        dots_f16_block(a, xs + r * n, n, out + r * stride, stride, 4);
        r += 4;
    }
    if (rows - r >= 2) {
        dots_f16_block(a, xs + r * n, n, out + r * stride, stride, 2);
        r += 2;
    }
    if (rows - r == 1)
        dots_f16_block(a, xs + r * n, n, out + r * stride, stride, 1);
}
#endif

/* For each of nq query heads (hd floats each, one after another): the
 * dot_f32 sum with key k times scale into out[g * stride]. */
static void dots_scalar(const float *q, int nq, const float *k, int hd, float scale, float *out,
                        int64_t stride)
{
    for (int g = 0; g < nq; g++)
        out[g * stride] = dot_f32(q + (int64_t)g * hd, k, hd) * scale;
}

/* out_g[i] += p[g] * v[i] for nq outputs (hd floats each, one after
 * another), multiply then add. */
static void add_scaled_scalar(float *out, const float *p, int nq, const float *v, int hd)
{
    for (int g = 0; g < nq; g++)
        for (int i = 0; i < hd; i++)
            out[(int64_t)g * hd + i] += p[g] * v[i];
}

#if defined(__x86_64__)
/* dots_scalar in AVX: each head's eight lanes in one register, summed
 * pairwise as dot_f32 does; the key is read once for every head. */
__attribute__((target("avx"))) static void dots_avx(const float *q, int nq, const float *k,
                                                    int hd, float scale, float *out,
                                                    int64_t stride)
{
    for (int g = 0; g < nq; g++) {
        const float *qg = q + (int64_t)g * hd;
        __m256 acc = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= hd; i += 8)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(qg + i), _mm256_loadu_ps(k + i)));
        float l[8];
        _mm256_storeu_ps(l, acc);
        for (int j = 0; i < hd; i++, j++)
            l[j] += qg[i] * k[i];
        out[g * stride] = ((((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])))) *
                          scale;
    }
}

/* dots_avx for four keys (k, k + ldk, ...) at once: four independent
 * sums a head, so the adds of one do not wait for the other's. */
__attribute__((target("avx"))) static void dots4_avx(const float *q, int nq, const float *k,
                                                     int64_t ldk, int hd, float scale,
                                                     float *out, int64_t stride)
{
    for (int g = 0; g < nq; g++) {
        const float *qg = q + (int64_t)g * hd;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps()};
        int i = 0;
        for (; i + 8 <= hd; i += 8) {
            const __m256 qv = _mm256_loadu_ps(qg + i);
            for (int t = 0; t < 4; t++)
                acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(qv, _mm256_loadu_ps(k + t * ldk + i)));
        }
        for (int t = 0; t < 4; t++) {
            float l[8];
            _mm256_storeu_ps(l, acc[t]);
            for (int ii = i, j = 0; ii < hd; ii++, j++)
                l[j] += qg[ii] * k[t * ldk + ii];
            out[g * stride + t] =
                (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))) * scale;
        }
    }
}

/* add_scaled_avx for four values (v, v + ldv, ...) with weights p[t * nq
 * + g], in that order: each output chunk is loaded and stored once for the
 * four, not once each. */
__attribute__((target("avx"))) static void add_scaled4_avx(float *out, const float *p, int nq,
                                                           const float *v, int64_t ldv, int hd)
{
    int i = 0;
    for (; i + 8 <= hd; i += 8) {
        const __m256 v0 = _mm256_loadu_ps(v + i), v1 = _mm256_loadu_ps(v + ldv + i);
        const __m256 v2 = _mm256_loadu_ps(v + 2 * ldv + i), v3 = _mm256_loadu_ps(v + 3 * ldv + i);
        for (int g = 0; g < nq; g++) {
            float *o = out + (int64_t)g * hd + i;
            __m256 acc = _mm256_loadu_ps(o);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(p[g]), v0));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(p[nq + g]), v1));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(p[2 * nq + g]), v2));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(p[3 * nq + g]), v3));
            _mm256_storeu_ps(o, acc);
        }
    }
    for (; i < hd; i++)
        for (int g = 0; g < nq; g++)
            for (int t = 0; t < 4; t++)
                out[(int64_t)g * hd + i] += p[t * nq + g] * v[t * ldv + i];
}

__attribute__((target("avx"))) static void add_scaled_avx(float *out, const float *p, int nq,
                                                          const float *v, int hd)
{
    int i = 0;
    for (; i + 8 <= hd; i += 8) {
        const __m256 vv = _mm256_loadu_ps(v + i);
        for (int g = 0; g < nq; g++) {
            float *o = out + (int64_t)g * hd + i;
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o),
                                              _mm256_mul_ps(_mm256_set1_ps(p[g]), vv)));
        }
    }
    for (; i < hd; i++)
        for (int g = 0; g < nq; g++)
            out[(int64_t)g * hd + i] += p[g] * v[i];
}
#endif

static void attn_dots(bool avx, const float *q, int nq, const float *k, int hd, float scale,
                      float *out, int64_t stride)
{
#if defined(__x86_64__)
    if (avx) {
        dots_avx(q, nq, k, hd, scale, out, stride);
        return;
    }
#endif
    (void)avx;
    dots_scalar(q, nq, k, hd, scale, out, stride);
}

/* attn_dots for the four keys k, k + ldk, k + 2 ldk, k + 3 ldk: out[g *
 * stride + t] for key t. */
static void attn_dots4(bool avx, const float *q, int nq, const float *k, int64_t ldk, int hd,
                       float scale, float *out, int64_t stride)
{
#if defined(__x86_64__)
    if (avx) {
        dots4_avx(q, nq, k, ldk, hd, scale, out, stride);
        return;
    }
#endif
    for (int t = 0; t < 4; t++)
        dots_scalar(q, nq, k + t * ldk, hd, scale, out + t, stride);
}

/* attn_add_scaled for the four values v, v + ldv, ... in turn, weights
 * p[t * nq + g]. */
static void attn_add_scaled4(bool avx, float *out, const float *p, int nq, const float *v,
                             int64_t ldv, int hd)
{
#if defined(__x86_64__)
    if (avx) {
        add_scaled4_avx(out, p, nq, v, ldv, hd);
        return;
    }
#endif
    for (int t = 0; t < 4; t++)
        add_scaled_scalar(out, p + t * nq, nq, v + t * ldv, hd);
}

static void attn_add_scaled(bool avx, float *out, const float *p, int nq, const float *v, int hd)
{
#if defined(__x86_64__)
    if (avx) {
        add_scaled_avx(out, p, nq, v, hd);
        return;
    }
#endif
    (void)avx;
    add_scaled_scalar(out, p, nq, v, hd);
}

/* Rotate-half ("NEOX") RoPE on the first rope_dim values of each head:
 * pairs (j, j + rope_dim/2) turn by pos * inv_freq[j]. */
static void rope_heads(float *v, int n_heads, int head_dim, int rope_dim, const float *cosv,
                       const float *sinv)
{
    const int half = rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *hv = v + (int64_t)h * head_dim;
        for (int j = 0; j < half; j++) {
            const float x0 = hv[j], x1 = hv[j + half];
            hv[j] = x0 * cosv[j] - x1 * sinv[j];
            hv[j + half] = x1 * cosv[j] + x0 * sinv[j];
        }
    }
}

/* ---- slots: one unit of parallel work per pool thread ---------------------- */

typedef void (*slot_fn)(void *ctx, int slot, int n_slots);

typedef struct slot_job {
    slot_fn fn;
    void *ctx;
    int n_slots;
} slot_job;

static void run_slot(void *ctx, int64_t begin, int64_t end)
{
    const slot_job *job = ctx;
    for (int64_t s = begin; s < end; s++)
        job->fn(job->ctx, (int)s, job->n_slots);
}

/* Calls fn(ctx, slot, n) once for every slot, in parallel. */
static void run_slots(bn_cpu_backend *b, slot_fn fn, void *ctx)
{
    slot_job job = {fn, ctx, b->n_slots};
    b->times.dispatches[b->pass_kind]++;
    bn_threadpool_run(b->pool, b->n_slots, 1, run_slot, &job);
}

/* ---- creation ---------------------------------------------------------------- */

static bn_status build_screen(bn_cpu_backend *b, bn_error *err); /* the LM head's section */

static bn_w2a8_weights *weights_at(bn_cpu_backend *b, int layer, bn_proj p)
{
    return &b->weights[(size_t)layer * BN_PROJ_COUNT + (size_t)p];
}

/* Packing runs in parallel over projections: slot s unpacks and packs
 * projections s, s + n, ... with its own codes buffer. Unpacking the 2B
 * model is seconds of work per core. */
typedef struct pack_job {
    bn_cpu_backend *b;
    int8_t **codes;      /* [n_slots] buffers of the largest projection */
    bn_status *status;   /* [n_layer * BN_PROJ_COUNT] */
    bn_error *errors;    /* [n_slots]: the first failure each slot saw */
} pack_job;

static void pack_slot(void *ctx, int slot, int n_slots)
{
    pack_job *job = ctx;
    bn_cpu_backend *b = job->b;
    const int64_t count = (int64_t)b->hp.n_layer * BN_PROJ_COUNT;
    for (int64_t i = slot; i < count; i += n_slots) {
        const int layer = (int)(i / BN_PROJ_COUNT);
        const bn_proj p = (bn_proj)(i % BN_PROJ_COUNT);
        int64_t n, k;
        float scale;
        bn_hparams_proj_shape(&b->hp, p, &n, &k);
        bn_error *err = &job->errors[slot];
        bn_status st =
            bn_checkpoint_projection_codes(b->model, layer, p, job->codes[slot], &scale, err);
        if (st == BN_OK)
            st = bn_w2a8_pack(b->kernels, job->codes[slot], n, k, scale, weights_at(b, layer, p),
                              err);
        job->status[i] = st;
        if (st != BN_OK)
            return; /* this slot's error record now describes projection i */
    }
}

static bn_status pack_all_weights(bn_cpu_backend *b, bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    int64_t max_elems = 0;
    for (int p = 0; p < BN_PROJ_COUNT; p++) {
        int64_t n, k;
        bn_hparams_proj_shape(hp, (bn_proj)p, &n, &k);
        if (n * k > max_elems)
            max_elems = n * k;
    }
    const int64_t count = (int64_t)hp->n_layer * BN_PROJ_COUNT;
    pack_job job = {b, calloc((size_t)b->n_slots, sizeof(int8_t *)),
                    calloc((size_t)count, sizeof(bn_status)),
                    calloc((size_t)b->n_slots, sizeof(bn_error))};
    bn_status st = BN_OK;
    if (!job.codes || !job.status || !job.errors)
        st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory to pack weights");
    for (int s = 0; s < b->n_slots && st == BN_OK; s++)
        if (!(job.codes[s] = malloc((size_t)max_elems)))
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "use fewer threads",
                              "no memory to unpack projections (%d x %lld bytes)", b->n_slots,
                              (long long)max_elems);
    if (st == BN_OK) {
        for (int64_t i = 0; i < count; i++)
            job.status[i] = BN_ERR_INTERNAL; /* not reached: an earlier failure stopped it */
        run_slots(b, pack_slot, &job);
        /* Report the first projection that failed, whatever the thread count. */
        for (int64_t i = 0; i < count && st == BN_OK; i++) {
            if (job.status[i] == BN_OK) {
                b->weight_bytes += b->weights[i].bytes;
            } else {
                const int slot = (int)(i % b->n_slots);
                st = job.status[i];
                if (err)
                    *err = job.errors[slot];
            }
        }
    }
    for (int s = 0; job.codes && s < b->n_slots; s++)
        free(job.codes[s]);
    free(job.codes);
    free(job.status);
    free(job.errors);
    return st;
}

static float *alloc_floats(int64_t n, uint64_t *counter)
{
    *counter += (uint64_t)n * sizeof(float);
    return bn_aligned_alloc(64, (size_t)n * sizeof(float));
}

static bn_status alloc_buffers(bn_cpu_backend *b, bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    const int64_t M = CHUNK_ROWS;
    const int64_t wide = hp->dim > b->q_dim ? hp->dim : b->q_dim;
    uint64_t *s = &b->scratch_bytes;
    b->x = alloc_floats(M * hp->dim, s);
    b->q = alloc_floats(M * b->q_dim, s);
    b->k = alloc_floats(M * b->kv_dim, s);
    b->v = alloc_floats(M * b->kv_dim, s);
    b->att = alloc_floats(M * b->q_dim, s);
    b->out = alloc_floats(M * hp->dim, s);
    b->gate = alloc_floats(M * hp->ffn, s);
    b->up = alloc_floats(M * hp->ffn, s);
    b->normed_out = alloc_floats(M * hp->dim, s);
    b->scores = alloc_floats((int64_t)b->n_slots * (b->hp.n_head / b->hp.n_head_kv) * b->kv_len, s);
    b->head_rows = alloc_floats((int64_t)b->n_slots * hp->dim, s);
    b->inv_freq = alloc_floats(hp->rope_dim / 2, s);
    b->rope_cos = alloc_floats(M * (hp->rope_dim / 2), s);
    b->rope_sin = alloc_floats(M * (hp->rope_dim / 2), s);

    const int64_t widest = wide > hp->ffn ? wide : hp->ffn;
    bn_status st = bn_q8_rows_alloc(&b->q8, M, widest, err);
    if (st != BN_OK)
        return st;
    b->scratch_bytes += (uint64_t)(M * b->q8.lda + 2 * M * 4);

    b->row_pos = calloc(M, sizeof *b->row_pos);
    b->row_seq = calloc(M, sizeof *b->row_seq);
    const int64_t kv_elems = (int64_t)hp->n_layer * b->kv_len * b->kv_dim;
    b->kv_bytes = 0;
    b->k_cache = alloc_floats(kv_elems, &b->kv_bytes);
    b->v_cache = alloc_floats(kv_elems, &b->kv_bytes);
    bool paged_ok = true;
    if (b->paged_rows > 0) {
        const int64_t paged_elems = (int64_t)hp->n_layer * b->paged_rows * b->kv_dim;
        b->pk_cache = alloc_floats(paged_elems, &b->kv_bytes);
        b->pv_cache = alloc_floats(paged_elems, &b->kv_bytes);
        paged_ok = b->pk_cache && b->pv_cache;
    }

    if (!b->x || !b->q || !b->k || !b->v || !b->att || !b->out || !b->gate || !b->up ||
        !b->normed_out || !b->scores || !b->head_rows || !b->inv_freq ||
        !b->rope_cos || !b->rope_sin || !b->row_pos || !b->row_seq)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "no memory for the CPU backend's scratch buffers");
    if (!b->k_cache || !b->v_cache || !paged_ok)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "use a shorter context or a smaller cache",
                            "no memory for a KV cache of %lld + %lld positions (%.1f MiB)",
                            (long long)b->kv_len, (long long)b->paged_rows,
                            (double)(2 * (int64_t)hp->n_layer * (b->kv_len + b->paged_rows) *
                                     b->kv_dim * (int64_t)sizeof(float)) /
                                1048576.0);
    return BN_OK;
}

bn_status bn_cpu_backend_create(const bn_checkpoint *model, int64_t kv_len, int n_threads,
                                bn_cpu_backend **out, bn_error *err)
{
    return bn_cpu_backend_create_paged(model, kv_len, 0, n_threads, out, err);
}

bn_status bn_cpu_backend_create_paged(const bn_checkpoint *model, int64_t kv_len,
                                      int64_t paged_rows, int n_threads, bn_cpu_backend **out,
                                      bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cpu backend: NULL output");
    *out = NULL;
    if (!model)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cpu backend: NULL model");
    const bn_hparams *hp = bn_checkpoint_hparams(model);
    if (kv_len == 0)
        kv_len = hp->n_ctx_train;
    if (kv_len < 0 || kv_len > hp->n_ctx_train)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "ask for at most the model's training context",
                            "KV cache of %lld positions requested; the model's context is %d",
                            (long long)kv_len, (int)hp->n_ctx_train);
    if (paged_rows < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "a paged cache of %lld rows", (long long)paged_rows);

    bn_cpu_backend *b = calloc(1, sizeof *b);
    if (!b)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a CPU backend");
    b->model = model;
    b->hp = *hp;
    b->q_dim = (int64_t)hp->n_head * hp->head_dim;
    b->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    b->kv_len = kv_len;
    b->paged_rows = paged_rows;

    bn_status st = bn_kernel_select(&b->kernels, err);
    if (st == BN_OK)
        st = bn_threadpool_create(n_threads, &b->pool, err);
    if (st == BN_OK) {
        b->n_slots = bn_threadpool_size(b->pool);
        b->weights = calloc((size_t)hp->n_layer * BN_PROJ_COUNT, sizeof *b->weights);
        if (!b->weights)
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for weight tables");
    }
    if (st == BN_OK)
        st = alloc_buffers(b, err);
    if (st == BN_OK)
        st = pack_all_weights(b, err);
#if defined(__x86_64__)
    const bn_cpu_features *cpu = bn_cpu_features_get();
    b->f16c = cpu->f16c && cpu->avx2;
    /* Attention's AVX helpers go with a vector kernel provider, so that
     * BITNET_KERNEL=scalar runs (and tests) the portable path too. */
    b->avx = cpu->avx2 && strcmp(b->kernels->name, "scalar") != 0;
#endif
    if (st == BN_OK)
        st = build_screen(b, err);
    if (st != BN_OK) {
        bn_cpu_backend_free(b);
        return st;
    }

    /* Inverse frequencies exactly as transformers computes them in fp32:
     * 1 / theta^(2j / rope_dim). */
    for (int j = 0; j < hp->rope_dim / 2; j++)
        b->inv_freq[j] = 1.0f / powf(hp->rope_theta, (float)(2 * j) / (float)hp->rope_dim);

    bn_log(BN_LOG_INFO,
           "cpu backend: kernels %s, %d threads, weights %.1f MiB, KV cache %.1f MiB "
           "(%lld positions, %lld paged), scratch %.1f MiB",
           b->kernels->name, b->n_slots, (double)b->weight_bytes / 1048576.0,
           (double)b->kv_bytes / 1048576.0, (long long)b->kv_len, (long long)b->paged_rows,
           (double)b->scratch_bytes / 1048576.0);
    *out = b;
    return BN_OK;
}

void bn_cpu_backend_free(bn_cpu_backend *b)
{
    if (!b)
        return;
    if (b->weights)
        for (int64_t i = 0; i < (int64_t)b->hp.n_layer * BN_PROJ_COUNT; i++)
            bn_w2a8_weights_free(&b->weights[i]);
    free(b->weights);
    bn_threadpool_destroy(b->pool);
    bn_q8_rows_free(&b->q8);
    float *buffers[] = {b->x,                     b->q,          b->k,        b->v,
                        b->att,    b->out,        b->gate,       b->up,       b->normed_out,
                        b->scores, b->head_rows,  b->inv_freq,   b->k_cache,  b->v_cache,
                        b->rope_cos, b->rope_sin, b->pk_cache, b->pv_cache};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        bn_aligned_free(buffers[i]);
    free(b->row_pos);
    free(b->row_seq);
    bn_head_screen_free(&b->screen);
    bn_aligned_free(b->screen_x.y);
    bn_aligned_free(b->screen_x.y_u8);
    free(b->screen_lo);
    free(b->screen_hi);
    free(b->slot_max);
    free(b->pick_logits);
    bn_sampler_free(b->greedy);
    free(b);
}

int64_t bn_cpu_backend_kv_len(const bn_cpu_backend *b) { return b->kv_len; }
int64_t bn_cpu_backend_kv_filled(const bn_cpu_backend *b) { return b->kv_filled; }
void bn_cpu_backend_reset(bn_cpu_backend *b) { b->kv_filled = 0; }
const char *bn_cpu_backend_kernel_name(const bn_cpu_backend *b) { return b->kernels->name; }
int bn_cpu_backend_threads(const bn_cpu_backend *b) { return b->n_slots; }

void bn_cpu_backend_stage_times(const bn_cpu_backend *b, bn_cpu_stage_times *out)
{
    *out = b->times;
}

void bn_cpu_backend_reset_stage_times(bn_cpu_backend *b)
{
    memset(&b->times, 0, sizeof b->times);
}

const char *bn_cpu_stage_name(bn_cpu_stage s)
{
    static const char *const names[BN_CPU_STAGE_COUNT] = {
        "embedding",       "norm + int8 (4 a layer)", "q, k, v",    "RoPE + KV store",
        "attention",       "o",                       "gate, up",   "relu^2 * up",
        "down",            "residual adds",           "output norm", "LM head"};
    return s >= 0 && s < BN_CPU_STAGE_COUNT ? names[s] : "?";
}

static void empty_slot(void *ctx, int slot, int n_slots)
{
    (void)ctx, (void)slot, (void)n_slots;
}

double bn_cpu_backend_dispatch_seconds(bn_cpu_backend *b, int reps)
{
    reps = reps > 0 ? reps : 1;
    const int kind = b->pass_kind;
    const uint64_t before = b->times.dispatches[kind];
    const double t0 = bn_time_seconds();
    for (int i = 0; i < reps; i++)
        run_slots(b, empty_slot, NULL);
    const double dt = bn_time_seconds() - t0;
    b->times.dispatches[kind] = before; /* not a pass's */
    return dt / reps;
}

void bn_cpu_backend_memory(const bn_cpu_backend *b, bn_cpu_memory *out)
{
    memset(out, 0, sizeof *out);
    out->weights = b->weight_bytes;
    out->kv_cache = b->kv_bytes;
    out->scratch = b->scratch_bytes;
    out->total = b->weight_bytes + b->kv_bytes + b->scratch_bytes;
    out->model_mapped = bn_checkpoint_weight_bytes(b->model);
}

/* ---- one chunk through one layer ------------------------------------------- */

typedef struct norm_job {
    const bn_cpu_backend *b;
    const float *rows, *w;
    int64_t n;
    float eps;
    bn_q8_rows *view;
} norm_job;

static void norm_rows(void *ctx, int64_t begin, int64_t end)
{
    const norm_job *job = ctx;
    for (int64_t i = begin; i < end; i++)
        job->b->kernels->norm_quantize_row(job->rows + i * job->n, job->w, job->n, job->eps,
                                           job->view->q + i * job->view->lda,
                                           &job->view->scale[i], &job->view->sum[i]);
}

/* The int8 view (in b->q8) of m rows of n values, each RMS-normed with w;
 * several rows spread over the threads (each row's arithmetic is its own). */
static bn_q8_rows norm_quantize(bn_cpu_backend *b, const float *rows, int64_t m, int64_t n,
                                const float *w)
{
    bn_q8_rows view = b->q8;
    view.m = m;
    view.k = n;
    norm_job job = {b, rows, w, n, b->hp.rms_eps, &view};
    if (m > 1)
        b->times.dispatches[b->pass_kind]++;
    bn_threadpool_run(m > 1 ? b->pool : NULL, m, 1, norm_rows, &job);
    return view;
}

typedef struct relu2_job {
    float *gate;
    const float *up;
} relu2_job;

/* Squared ReLU gate in fp32 (it overflows fp16): gate = relu(gate)^2 * up.
 * The gate's signs are random, so a compare and branch (what compilers
 * make of the scalar form) mispredicts half the time: on x86 maxps gives
 * the same value (NaN and -0 become +0) without a branch. */
static void relu2_span(void *ctx, int64_t begin, int64_t end)
{
    const relu2_job *job = ctx;
    int64_t i = begin;
#if defined(__x86_64__)
    const __m128 zero = _mm_setzero_ps();
    for (; i + 4 <= end; i += 4) {
        const __m128 g = _mm_max_ps(_mm_loadu_ps(job->gate + i), zero);
        _mm_storeu_ps(job->gate + i, _mm_mul_ps(_mm_mul_ps(g, g), _mm_loadu_ps(job->up + i)));
    }
#endif
    for (; i < end; i++) {
        const float g = job->gate[i] > 0.0f ? job->gate[i] : 0.0f;
        job->gate[i] = (g * g) * job->up[i];
    }
}

/* y[i] = W[proj[i]] x for count projections of one input, in one job. */
static bn_status project(bn_cpu_backend *b, int layer, const bn_proj *proj, int count,
                         const bn_q8_rows *x, float *const *y, bn_error *err)
{
    const bn_w2a8_weights *w[BN_W2A8_GROUP_MAX];
    int64_t ldy[BN_W2A8_GROUP_MAX];
    for (int i = 0; i < count; i++) {
        w[i] = weights_at(b, layer, proj[i]);
        ldy[i] = w[i]->n;
    }
    b->times.dispatches[b->pass_kind]++;
    return bn_w2a8_matmul_group(w, count, x, y, ldy, b->pool, err);
}

/* Where each row of a pass sits: row i is position pos[i] of sequence
 * seq[i], whose position t lives in cache row
 * tables[seq][t / block_size] * block_size + t % block_size of the cache
 * the map names. forward()'s single sequence is one block of kv_len
 * positions in its own cache: row t is t. */
typedef struct row_map {
    const int64_t *pos;
    const int32_t *seq;
    const int32_t *const *tables;
    int64_t block_size;
    float *k_cache, *v_cache; /* [n_layer][rows][kv_dim] */
    int64_t rows;
} row_map;

static int64_t cache_row(const row_map *m, int32_t seq, int64_t t)
{
    return (int64_t)m->tables[seq][t / m->block_size] * m->block_size + t % m->block_size;
}

typedef struct attention_job {
    bn_cpu_backend *b;
    int layer;
    int64_t rows;
    const row_map *map;
    int heads_per_item;   /* query heads of one KV head an item computes */
} attention_job;

/* The most query heads one KV head serves that attention takes at once. */
#define BN_MAX_GQA_GROUP 64

/* Causal attention. An item is a row and heads_per_item query heads that
 * share one KV head (GQA): each cached key and value is read once for
 * them. Slot s takes items s, s + n, ... so long and short rows of a pass
 * spread over the threads. The cache is walked block by block (a block's
 * positions are consecutive rows). Every head's arithmetic is the same
 * whichever item and thread computes it. */
static void attention_slot(void *ctx, int slot, int n_slots)
{
    const attention_job *job = ctx;
    bn_cpu_backend *b = job->b;
    const bn_hparams *hp = &b->hp;
    const int hd = hp->head_dim;
    const int group = hp->n_head / hp->n_head_kv;
    const float scale = (float)(1.0 / sqrt((double)hd));
    const row_map *map = job->map;
    const float *kc = map->k_cache + (int64_t)job->layer * map->rows * b->kv_dim;
    const float *vc = map->v_cache + (int64_t)job->layer * map->rows * b->kv_dim;
    const int64_t ld = b->kv_len; /* one head's scores */
    float *scores = b->scores + (int64_t)slot * group * ld;
    const int nq = job->heads_per_item;
    const int64_t items_per_row = hp->n_head / nq;

    for (int64_t item = slot; item < job->rows * items_per_row; item += n_slots) {
        const int64_t row = item / items_per_row;
        const int h0 = (int)(item % items_per_row) * nq;
        const int64_t kv_off = (int64_t)(h0 / group) * hd;
        const float *q0 = b->q + row * b->q_dim + (int64_t)h0 * hd;
        float *out = b->att + row * b->q_dim + (int64_t)h0 * hd;
        const int32_t *table = map->tables[map->seq[row]];
        const int64_t n_pos = map->pos[row] + 1; /* causal: up to itself */

        /* Scores, block by block of the cache (a block's positions are
         * consecutive rows). */
        for (int64_t t0 = 0; t0 < n_pos; t0 += map->block_size) {
            const int64_t n = n_pos - t0 < map->block_size ? n_pos - t0 : map->block_size;
            const float *kb = kc + (int64_t)table[t0 / map->block_size] * map->block_size * b->kv_dim;
            int64_t j = 0;
            for (; j + 4 <= n; j += 4)
                attn_dots4(b->avx, q0, nq, kb + j * b->kv_dim + kv_off, b->kv_dim, hd, scale,
                           scores + t0 + j, ld);
            for (; j < n; j++)
                attn_dots(b->avx, q0, nq, kb + j * b->kv_dim + kv_off, hd, scale, scores + t0 + j,
                          ld);
        }
        float p[4 * BN_MAX_GQA_GROUP], inv_sum[BN_MAX_GQA_GROUP];
        for (int g = 0; g < nq; g++) {
            float *sg = scores + g * ld, max = -INFINITY, sum = 0.0f;
            for (int64_t t = 0; t < n_pos; t++)
                max = sg[t] > max ? sg[t] : max;
            for (int64_t t = 0; t < n_pos; t++) {
                sg[t] = expf(sg[t] - max);
                sum += sg[t];
            }
            inv_sum[g] = 1.0f / sum;
        }
        memset(out, 0, (size_t)nq * hd * sizeof(float));
        for (int64_t t0 = 0; t0 < n_pos; t0 += map->block_size) {
            const int64_t n = n_pos - t0 < map->block_size ? n_pos - t0 : map->block_size;
            const float *vb = vc + (int64_t)table[t0 / map->block_size] * map->block_size * b->kv_dim;
            int64_t j = 0;
            for (; j + 4 <= n; j += 4) {
                for (int t = 0; t < 4; t++)
                    for (int g = 0; g < nq; g++)
                        p[t * nq + g] = scores[g * ld + t0 + j + t] * inv_sum[g];
                attn_add_scaled4(b->avx, out, p, nq, vb + j * b->kv_dim + kv_off, b->kv_dim, hd);
            }
            for (; j < n; j++) {
                for (int g = 0; g < nq; g++)
                    p[g] = scores[g * ld + t0 + j] * inv_sum[g];
                attn_add_scaled(b->avx, out, p, nq, vb + j * b->kv_dim + kv_off, hd);
            }
        }
    }
}

static bn_status attention_block(bn_cpu_backend *b, int layer, int64_t M, const row_map *map,
                                 bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    double t = bn_time_seconds();
    /* One quantization of the normed input serves q, k and v. */
    bn_q8_rows xq =
        norm_quantize(b, b->x, M, hp->dim, bn_checkpoint_norm(b->model, layer, BN_NORM_ATTN));
    t = lap(b, BN_CPU_STAGE_NORM_QUANT, t);
    static const bn_proj qkv[3] = {BN_PROJ_Q, BN_PROJ_K, BN_PROJ_V};
    bn_status st = project(b, layer, qkv, 3, &xq, (float *const[]){b->q, b->k, b->v}, err);
    if (st != BN_OK)
        return st;
    t = lap(b, BN_CPU_STAGE_QKV, t);

    const int half = hp->rope_dim / 2;
    float *kc = map->k_cache + (int64_t)layer * map->rows * b->kv_dim;
    float *vc = map->v_cache + (int64_t)layer * map->rows * b->kv_dim;
    for (int64_t i = 0; i < M; i++) {
        const int64_t pos = map->pos[i];
        const float *cosv = b->rope_cos + i * half, *sinv = b->rope_sin + i * half;
        rope_heads(b->q + i * b->q_dim, hp->n_head, hp->head_dim, hp->rope_dim, cosv, sinv);
        rope_heads(b->k + i * b->kv_dim, hp->n_head_kv, hp->head_dim, hp->rope_dim, cosv, sinv);
        const int64_t r = cache_row(map, map->seq[i], pos);
        memcpy(kc + r * b->kv_dim, b->k + i * b->kv_dim, (size_t)b->kv_dim * sizeof(float));
        memcpy(vc + r * b->kv_dim, b->v + i * b->kv_dim, (size_t)b->kv_dim * sizeof(float));
    }

    t = lap(b, BN_CPU_STAGE_ROPE_KV, t);
    /* Whole GQA groups an item (each key read once for the group; on the
     * 2B-4T shape 1.4x faster prompt attention and 6 % faster decode
     * attention than a head an item), halved while that would leave a
     * thread with fewer than two items (a decode step on many threads). */
    int per_item = hp->n_head / hp->n_head_kv;
    if (per_item > BN_MAX_GQA_GROUP)
        per_item = 1;
    while (per_item % 2 == 0 && M * (hp->n_head / per_item) < 2 * (int64_t)b->n_slots)
        per_item /= 2;
    attention_job job = {b, layer, M, map, per_item};
    run_slots(b, attention_slot, &job);
    t = lap(b, BN_CPU_STAGE_ATTENTION, t);

    bn_q8_rows aq = norm_quantize(b, b->att, M, b->q_dim,
                                  bn_checkpoint_norm(b->model, layer, BN_NORM_ATTN_SUB));
    t = lap(b, BN_CPU_STAGE_NORM_QUANT, t);
    static const bn_proj o = BN_PROJ_O;
    st = project(b, layer, &o, 1, &aq, &b->out, err);
    if (st != BN_OK)
        return st;
    t = lap(b, BN_CPU_STAGE_O, t);
    for (int64_t i = 0; i < M * hp->dim; i++)
        b->x[i] += b->out[i];
    lap(b, BN_CPU_STAGE_RESIDUAL, t);
    return BN_OK;
}

static bn_status ffn_block(bn_cpu_backend *b, int layer, int64_t M, bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    double t = bn_time_seconds();
    bn_q8_rows xq =
        norm_quantize(b, b->x, M, hp->dim, bn_checkpoint_norm(b->model, layer, BN_NORM_FFN));
    t = lap(b, BN_CPU_STAGE_NORM_QUANT, t);
    static const bn_proj gate_up[2] = {BN_PROJ_GATE, BN_PROJ_UP};
    bn_status st = project(b, layer, gate_up, 2, &xq, (float *const[]){b->gate, b->up}, err);
    if (st != BN_OK)
        return st;
    t = lap(b, BN_CPU_STAGE_GATE_UP, t);
    relu2_job rj = {b->gate, b->up};
    b->times.dispatches[b->pass_kind]++;
    bn_threadpool_run(b->pool, M * hp->ffn, 1024, relu2_span, &rj);
    t = lap(b, BN_CPU_STAGE_RELU2, t);
    bn_q8_rows hq =
        norm_quantize(b, b->gate, M, hp->ffn, bn_checkpoint_norm(b->model, layer, BN_NORM_FFN_SUB));
    t = lap(b, BN_CPU_STAGE_NORM_QUANT, t);
    static const bn_proj down = BN_PROJ_DOWN;
    st = project(b, layer, &down, 1, &hq, &b->out, err);
    if (st != BN_OK)
        return st;
    t = lap(b, BN_CPU_STAGE_DOWN, t);
    for (int64_t i = 0; i < M * hp->dim; i++)
        b->x[i] += b->out[i];
    lap(b, BN_CPU_STAGE_RESIDUAL, t);
    return BN_OK;
}

/* ---- the LM head ---------------------------------------------------------- */

typedef struct head_job {
    bn_cpu_backend *b;
    const float *xs;   /* n_rows normed rows of dim */
    int64_t n_rows;
    float *logits;     /* [n_rows][vocab] */
} head_job;

/* Head row r against n rows of xs (each dim floats), logits at out[i *
 * stride]: the row is decoded once (into row, dim floats) for all of
 * them. This is the head's exact arithmetic, which the screen bounds. */
static void head_row_logits(const bn_cpu_backend *b, int64_t r, const float *xs, int64_t n,
                            float *out, int64_t stride, float *row)
{
    const bn_dense_matrix *head = bn_checkpoint_lm_head(b->model);
    const int64_t dim = head->cols;
    const uint8_t *src = (const uint8_t *)head->data + (size_t)r * head->row_bytes;
#if defined(__x86_64__)
    if (head->type == BN_QTYPE_F16 && b->f16c) {
        dots_f16_f32_f16c((const uint16_t *)src, xs, n, dim, out, stride);
        return;
    }
#endif
    const float *w = row;
    if (head->type == BN_QTYPE_F32)
        w = (const float *)src;
    else
        bn_qtype_get(head->type)->dequantize_row(src, row, dim);
    for (int64_t i = 0; i < n; i++)
        out[i * stride] = dot_f32(w, xs + i * dim, dim);
}

/* Head row r's weights as head_row_logits computes with them (the F16C
 * conversion is exact, as bn_fp16_to_fp32 is). */
static void head_row_weights(void *ctx, int64_t r, float *out)
{
    const bn_cpu_backend *b = ctx;
    const bn_dense_matrix *head = bn_checkpoint_lm_head(b->model);
    const uint8_t *src = (const uint8_t *)head->data + (size_t)r * head->row_bytes;
    if (head->type == BN_QTYPE_F32)
        memcpy(out, src, (size_t)head->cols * sizeof(float));
    else
        bn_qtype_get(head->type)->dequantize_row(src, out, head->cols);
}

/* Vocabulary rows in contiguous shares, one per slot. */
static void head_slot(void *ctx, int slot, int n_slots)
{
    const head_job *job = ctx;
    bn_cpu_backend *b = job->b;
    const int64_t vocab = b->hp.vocab, dim = b->hp.dim;
    const int64_t begin = vocab * slot / n_slots, end = vocab * (slot + 1) / n_slots;
    for (int64_t r = begin; r < end; r++)
        head_row_logits(b, r, job->xs, job->n_rows, job->logits + r, vocab,
                        b->head_rows + (int64_t)slot * dim);
}

/* ---- the screened head ------------------------------------------------------- */

static void screen_fill_slot(void *ctx, int slot, int n_slots)
{
    bn_cpu_backend *b = ctx;
    const int64_t vocab = b->hp.vocab;
    bn_head_screen_fill(&b->screen, vocab * slot / n_slots, vocab * (slot + 1) / n_slots,
                        head_row_weights, b, b->head_rows + (int64_t)slot * b->hp.dim);
}

/* The greedy picks' state, and the int8 copy where this CPU has a vector
 * kernel for it: one element at a time, the screen would read half the
 * bytes but cost more than the full head's vector code. BITNET_KERNEL=
 * scalar leaves it out too (the portable path, tested as such). */
static bn_status build_screen(bn_cpu_backend *b, bn_error *err)
{
    const int64_t vocab = b->hp.vocab, dim = b->hp.dim;
    bn_sampler_params greedy;
    bn_sampler_params_default(&greedy);
    b->pick_logits = malloc((size_t)(PICK_ROWS * vocab) * sizeof(float));
    if (!b->pick_logits)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for greedy picks");
    b->scratch_bytes += (uint64_t)(PICK_ROWS * vocab) * sizeof(float);
    bn_status st = bn_sampler_create(&greedy, (int32_t)vocab, &b->greedy, err);
    if (st != BN_OK || !bn_head_screen_has_vector_kernel() ||
        strcmp(b->kernels->name, "scalar") == 0)
        return st;
    st = bn_head_screen_alloc(&b->screen, vocab, dim, err);
    if (st != BN_OK)
        return st;
    b->screen_x.y = bn_aligned_alloc(64, (size_t)b->screen.lda);
    b->screen_x.y_u8 = bn_aligned_alloc(64, (size_t)b->screen.lda);
    b->screen_lo = malloc((size_t)vocab * sizeof(double));
    b->screen_hi = malloc((size_t)vocab * sizeof(double));
    b->slot_max = malloc((size_t)b->n_slots * sizeof(double));
    if (!b->screen_x.y || !b->screen_x.y_u8 || !b->screen_lo || !b->screen_hi || !b->slot_max)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the screened head");
    run_slots(b, screen_fill_slot, b);
    b->weight_bytes += bn_head_screen_bytes(&b->screen);
    b->screened = true;
    return BN_OK;
}

static void lm_head(bn_cpu_backend *b, const float *x_rows, int64_t n_rows, float *logits);

/* Each slot's share of the rows: their bounds, and the largest lower one. */
static void screen_bounds_slot(void *ctx, int slot, int n_slots)
{
    bn_cpu_backend *b = ctx;
    const int64_t vocab = b->hp.vocab;
    const int64_t begin = vocab * slot / n_slots, end = vocab * (slot + 1) / n_slots;
    bn_head_screen_bounds(&b->screen, &b->screen_x, begin, end, b->screen_lo, b->screen_hi);
    double best = -INFINITY;
    for (int64_t r = begin; r < end; r++)
        best = b->screen_lo[r] > best ? b->screen_lo[r] : best;
    b->slot_max[slot] = best;
}

/* The exact logit of every row that may be the argmax; -inf for the rest.
 * !(hi < T) keeps a row whose bound is NaN too. */
static void screen_exact_slot(void *ctx, int slot, int n_slots)
{
    bn_cpu_backend *b = ctx;
    const int64_t vocab = b->hp.vocab;
    const int64_t begin = vocab * slot / n_slots, end = vocab * (slot + 1) / n_slots;
    for (int64_t r = begin; r < end; r++) {
        if (b->screen_hi[r] < b->screen_cut)
            b->pick_logits[r] = -INFINITY;
        else
            head_row_logits(b, r, b->normed_out, 1, b->pick_logits + r, 1,
                            b->head_rows + (int64_t)slot * b->hp.dim);
    }
}

/* The greedy token of hidden state x (dim floats, before the output norm):
 * the host's greedy rule over the full head's logits, from the screen. */
static int32_t screened_pick(bn_cpu_backend *b, const float *x)
{
    const bn_hparams *hp = &b->hp;
    if (!b->screened) {
        lm_head(b, x, 1, b->pick_logits);
        return bn_sampler_sample(b->greedy, b->pick_logits, NULL, 0);
    }
    double t = bn_time_seconds();
    rmsnorm(b->normed_out, x, bn_checkpoint_output_norm(b->model), hp->dim, hp->rms_eps);
    t = lap(b, BN_CPU_STAGE_HEAD_NORM, t);
    bn_head_screen_quantize(&b->screen, b->normed_out, &b->screen_x);
    run_slots(b, screen_bounds_slot, b);
    b->screen_cut = -INFINITY;
    for (int s = 0; s < b->n_slots; s++)
        b->screen_cut = b->slot_max[s] > b->screen_cut ? b->slot_max[s] : b->screen_cut;
    run_slots(b, screen_exact_slot, b);
    const int32_t token = bn_sampler_sample(b->greedy, b->pick_logits, NULL, 0);
    lap(b, BN_CPU_STAGE_HEAD, t);
    return token;
}

static void lm_head(bn_cpu_backend *b, const float *x_rows, int64_t n_rows, float *logits)
{
    const bn_hparams *hp = &b->hp;
    double t = bn_time_seconds();
    for (int64_t i = 0; i < n_rows; i++)
        rmsnorm(b->normed_out + i * hp->dim, x_rows + i * hp->dim,
                bn_checkpoint_output_norm(b->model), hp->dim, hp->rms_eps);
    t = lap(b, BN_CPU_STAGE_HEAD_NORM, t);
    head_job job = {b, b->normed_out, n_rows, logits};
    run_slots(b, head_slot, &job);
    lap(b, BN_CPU_STAGE_HEAD, t);
}

/* ---- forward ----------------------------------------------------------------- */

/* Embeds M rows (at most CHUNK_ROWS) and runs every layer over them; the
 * last hidden states are left in b->x. */
static bn_status run_rows(bn_cpu_backend *b, const int32_t *tokens, int64_t M, const row_map *map,
                          bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    bn_status st = BN_OK;
    pass_begin(b, M);
    double t = bn_time_seconds();
    for (int64_t i = 0; i < M && st == BN_OK; i++)
        st = bn_checkpoint_embedding_row(b->model, tokens[i], b->x + i * hp->dim, err);
    t = lap(b, BN_CPU_STAGE_EMBED, t);
    /* The rows' RoPE angles, once for every layer: (float)pos * inv_freq. */
    const int half = hp->rope_dim / 2;
    for (int64_t i = 0; i < M; i++)
        for (int j = 0; j < half; j++) {
            const float angle = (float)map->pos[i] * b->inv_freq[j];
            b->rope_cos[i * half + j] = cosf(angle);
            b->rope_sin[i * half + j] = sinf(angle);
        }
    lap(b, BN_CPU_STAGE_ROPE_KV, t);
    for (int l = 0; l < hp->n_layer && st == BN_OK; l++) {
        st = attention_block(b, l, M, map, err);
        if (st == BN_OK)
            st = ffn_block(b, l, M, err);
    }
    return st;
}

static bn_status check_tokens(const bn_cpu_backend *b, const int32_t *tokens, int64_t n,
                              bn_error *err)
{
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= b->hp.vocab)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                "token ids must come from this model's vocabulary",
                                "token %lld is %d, outside the vocabulary (0..%d)", (long long)i,
                                (int)tokens[i], (int)b->hp.vocab - 1);
    return BN_OK;
}

/* forward(), or with next the greedy token of the last position instead
 * of its logits. */
static bn_status forward_tokens(bn_cpu_backend *b, const int32_t *tokens, int64_t n_tokens,
                                int64_t pos, bn_logits_mode mode, float *logits, int32_t *next,
                                bn_error *err)
{
    if (!b || !tokens || (!logits && !next) || n_tokens <= 0 || pos < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cpu forward: need a backend, tokens, logits, n_tokens > 0, pos >= 0");
    if (mode != BN_LOGITS_LAST && mode != BN_LOGITS_ALL)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cpu forward: unknown logits mode");
    if (n_tokens > b->kv_len - pos)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "start a new context or create the backend with a longer kv_len",
                            "positions %lld..%lld do not fit a KV cache of %lld positions",
                            (long long)pos, (long long)(pos + n_tokens - 1),
                            (long long)b->kv_len);
    if (pos > b->kv_filled)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "run the earlier positions first",
                            "position %lld would skip positions: only %lld are computed",
                            (long long)pos, (long long)b->kv_filled);
    bn_status st = check_tokens(b, tokens, n_tokens, err);
    if (st != BN_OK)
        return st;
    const bn_hparams *hp = &b->hp;
    /* One sequence in one block of the whole cache: row t is position t. */
    const int32_t block0 = 0;
    const int32_t *const table[1] = {&block0};
    const row_map map = {b->row_pos, b->row_seq, table, b->kv_len,
                         b->k_cache, b->v_cache, b->kv_len};
    for (int64_t c = 0; c < n_tokens && st == BN_OK; c += CHUNK_ROWS) {
        const int64_t M = n_tokens - c < CHUNK_ROWS ? n_tokens - c : CHUNK_ROWS;
        for (int64_t i = 0; i < M; i++) {
            b->row_pos[i] = pos + c + i;
            b->row_seq[i] = 0;
        }
        st = run_rows(b, tokens + c, M, &map, err);
        if (st != BN_OK)
            break;
        b->kv_filled = pos + c + M;
        if (next) {
            if (c + M == n_tokens)
                *next = screened_pick(b, b->x + (M - 1) * hp->dim);
        } else if (mode == BN_LOGITS_ALL) {
            lm_head(b, b->x, M, logits + c * hp->vocab);
        } else if (c + M == n_tokens) {
            lm_head(b, b->x + (M - 1) * hp->dim, 1, logits);
        }
    }
    if (st != BN_OK)
        b->kv_filled = pos; /* the cache past pos is now inconsistent */
    return st;
}

bn_status bn_cpu_backend_forward(bn_cpu_backend *b, const int32_t *tokens, int64_t n_tokens,
                                 int64_t pos, bn_logits_mode mode, float *logits, bn_error *err)
{
    return forward_tokens(b, tokens, n_tokens, pos, mode, logits, NULL, err);
}

bn_status bn_cpu_backend_forward_greedy(bn_cpu_backend *b, const int32_t *tokens,
                                        int64_t n_tokens, int64_t pos, int32_t *next,
                                        bn_error *err)
{
    return forward_tokens(b, tokens, n_tokens, pos, BN_LOGITS_LAST, NULL, next, err);
}

int64_t bn_cpu_backend_paged_rows(const bn_cpu_backend *b) { return b->paged_rows; }

/* forward_rows(), or with next the greedy token of each logit row instead
 * of its logits. */
static bn_status forward_batch(bn_cpu_backend *b, const bn_batch_rows *r, float *logits,
                               int32_t *next, bn_error *err)
{
    if (!b || !r || r->n_rows <= 0 || !r->tokens || !r->pos || !r->seq || !r->tables ||
        !r->table_len || r->block_size < 1 || b->paged_rows % r->block_size != 0 ||
        b->paged_rows == 0 ||
        (r->n_logits > 0 && (!r->logit_rows || (!logits && !next))) || r->n_logits < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cpu forward_rows: rows, positions, sequences, block tables and a "
                            "block size dividing the paged cache's %lld rows are needed",
                            b ? (long long)b->paged_rows : 0LL);
    bn_status st = check_tokens(b, r->tokens, r->n_rows, err);
    if (st != BN_OK)
        return st;
    st = bn_batch_rows_check(r, b->kv_len, b->paged_rows / r->block_size, 0, 0, "cpu", err);
    if (st != BN_OK)
        return st;
    const bn_hparams *hp = &b->hp;
    int64_t next_logit = 0;
    for (int64_t c = 0; c < r->n_rows && st == BN_OK; c += CHUNK_ROWS) {
        const int64_t M = r->n_rows - c < CHUNK_ROWS ? r->n_rows - c : CHUNK_ROWS;
        const row_map map = {r->pos + c,  r->seq + c,  r->tables,   r->block_size,
                             b->pk_cache, b->pv_cache, b->paged_rows};
        st = run_rows(b, r->tokens + c, M, &map, err);
        if (st != BN_OK)
            break;
        /* The rows of this chunk whose logits are wanted, gathered into
         * b->out, so the head is read once for all of them. */
        const int64_t first = next_logit;
        for (; next_logit < r->n_logits && r->logit_rows[next_logit] < c + M; next_logit++)
            memcpy(b->out + (next_logit - first) * hp->dim,
                   b->x + (r->logit_rows[next_logit] - c) * hp->dim,
                   (size_t)hp->dim * sizeof(float));
        const int64_t n = next_logit - first;
        if (n == 0)
            continue;
        if (!next) {
            lm_head(b, b->out, n, logits + first * hp->vocab);
        } else if (n == 1) {
            next[first] = screened_pick(b, b->out);
        } else {
            /* Several rows: the full head, read once for PICK_ROWS of them,
             * costs less than screening each. */
            for (int64_t i = 0; i < n; i += PICK_ROWS) {
                const int64_t g = n - i < PICK_ROWS ? n - i : PICK_ROWS;
                lm_head(b, b->out + i * hp->dim, g, b->pick_logits);
                for (int64_t j = 0; j < g; j++)
                    next[first + i + j] =
                        bn_sampler_sample(b->greedy, b->pick_logits + j * hp->vocab, NULL, 0);
            }
        }
    }
    return st;
}

bn_status bn_cpu_backend_forward_rows(bn_cpu_backend *b, const bn_batch_rows *r, float *logits,
                                      bn_error *err)
{
    return forward_batch(b, r, logits, NULL, err);
}

bn_status bn_cpu_backend_forward_rows_greedy(bn_cpu_backend *b, const bn_batch_rows *r,
                                             int32_t *next, bn_error *err)
{
    return forward_batch(b, r, NULL, next, err);
}
