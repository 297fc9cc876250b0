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
 * scales in fp32 (bn_cpu_norm_quantize_row, rmsnorm); int8 codes of a normed
 * row come from exact ratios (bn_cpu_norm_quantize_row explains why); dot
 * products use eight interleaved fp32 lanes summed pairwise (dot_f32);
 * softmax multiplies by 1/sum; RoPE angles are (float)pos * inv_freq[j].
 */
#include "cpu_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "kernel_manager.h"
#include "quant_rules.h"
#include "threadpool.h"
#include "w2a8.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Prefill chunk: large enough that each weight row is reused across many
 * tokens, small enough that scratch stays a few MB on the 2B shape. */
#define CHUNK_ROWS 128

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
    float *rope_cos, *rope_sin; /* [rope_dim / 2] for the current position */

    float *x, *q, *k, *v, *att, *out, *gate, *up;
    bn_q8_rows q8;            /* CHUNK_ROWS rows of the widest input */
    float *scores;            /* [n_slots][kv_len] */
    float *head_rows;         /* [n_slots][dim] a dequantized LM head row */
    float *normed_out;        /* [CHUNK_ROWS][dim] output_norm(x) */
    bool f16c;                /* convert F16 LM head rows with F16C */

    uint64_t weight_bytes, kv_bytes, scratch_bytes;
};

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
/* The same sum as dot_f32 (same lanes, same order, multiply then add) with
 * the F16 row converted on the fly; F16C conversion is exact. */
__attribute__((target("avx,f16c"))) static float dot_f16_f32_f16c(const uint16_t *a,
                                                                 const float *b, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 av = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(av, _mm256_loadu_ps(b + i)));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (int l = 0; i < n; i++, l++)
        lanes[l] += bn_fp16_to_fp32(a[i]) * b[i];
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
           ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}
#endif

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
    bn_threadpool_run(b->pool, b->n_slots, 1, run_slot, &job);
}

/* ---- creation ---------------------------------------------------------------- */

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
    b->scores = alloc_floats((int64_t)b->n_slots * b->kv_len, s);
    b->head_rows = alloc_floats((int64_t)b->n_slots * hp->dim, s);
    b->inv_freq = alloc_floats(hp->rope_dim / 2, s);
    b->rope_cos = alloc_floats(hp->rope_dim / 2, s);
    b->rope_sin = alloc_floats(hp->rope_dim / 2, s);

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
    if (st != BN_OK) {
        bn_cpu_backend_free(b);
        return st;
    }

    /* Inverse frequencies exactly as transformers computes them in fp32:
     * 1 / theta^(2j / rope_dim). */
    for (int j = 0; j < hp->rope_dim / 2; j++)
        b->inv_freq[j] = 1.0f / powf(hp->rope_theta, (float)(2 * j) / (float)hp->rope_dim);

#if defined(__x86_64__)
    const bn_cpu_features *cpu = bn_cpu_features_get();
    b->f16c = cpu->f16c && cpu->avx2;
#endif
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
    free(b);
}

int64_t bn_cpu_backend_kv_len(const bn_cpu_backend *b) { return b->kv_len; }
int64_t bn_cpu_backend_kv_filled(const bn_cpu_backend *b) { return b->kv_filled; }
void bn_cpu_backend_reset(bn_cpu_backend *b) { b->kv_filled = 0; }
const char *bn_cpu_backend_kernel_name(const bn_cpu_backend *b) { return b->kernels->name; }
int bn_cpu_backend_threads(const bn_cpu_backend *b) { return b->n_slots; }

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

/* RMSNorm followed by absmax int8 quantization of one row, as one step.
 *
 * Absmax quantization is scale-invariant, so RMSNorm's 1/rms factor cancels
 * from the codes: code_i = round(127 * u_i / max|u|) with u = w * x. The
 * codes are computed that way, in double (u_i is exact there), which gives
 * what exact arithmetic gives. That matters on the first layer: embeddings
 * and norm weights carry 8-11 significant bits, so an element that is
 * exactly half the largest one (code 63.5, a tie rounded to even) is
 * common, and fp32 rounding of the normed value would push it either way.
 * The scale is 127 / max|normed x| in fp32, as the reference computes it. */
void bn_cpu_norm_quantize_row(const float *x, const float *w, int64_t n, float eps, int8_t *q,
                              float *scale, int32_t *sum)
{
    double ss = 0.0, umax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        ss += (double)x[i] * (double)x[i];
        const double u = fabs((double)w[i] * (double)x[i]);
        umax = u > umax ? u : umax;
    }
    const float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float a = fabsf(w[i] * (x[i] * inv));
        amax = a > amax ? a : amax;
    }
    int32_t total = 0;
    if (amax >= BN_QUANT_EPS && umax > 0.0 && isfinite(umax)) {
        for (int64_t i = 0; i < n; i++) {
            /* A NaN value's code is 0 (converting NaN to int is undefined). */
            const double r = rint(127.0 * (((double)w[i] * (double)x[i]) / umax));
            const int v = r == r ? (int)r : 0;
            q[i] = (int8_t)v;
            total += v;
        }
        *scale = 127.0f / amax;
    } else {
        /* Tiny or non-finite rows: the plain rule on the normed values. */
        const float s = 127.0f / (amax >= BN_QUANT_EPS ? amax : BN_QUANT_EPS);
        for (int64_t i = 0; i < n; i++) {
            const int v = bn_round_clamp(w[i] * (x[i] * inv) * s, -128, 127);
            q[i] = (int8_t)v;
            total += v;
        }
        *scale = s;
    }
    *sum = total;
}

/* The int8 view (in b->q8) of m rows of n values, each RMS-normed with w. */
static bn_q8_rows norm_quantize(bn_cpu_backend *b, const float *rows, int64_t m, int64_t n,
                                const float *w)
{
    bn_q8_rows view = b->q8;
    view.m = m;
    view.k = n;
    for (int64_t i = 0; i < m; i++)
        bn_cpu_norm_quantize_row(rows + i * n, w, n, b->hp.rms_eps, view.q + i * view.lda,
                          &view.scale[i], &view.sum[i]);
    return view;
}

static bn_status project(bn_cpu_backend *b, int layer, bn_proj p, const bn_q8_rows *x, float *y,
                         bn_error *err)
{
    const bn_w2a8_weights *w = weights_at(b, layer, p);
    return bn_w2a8_matmul(w, x, y, w->n, b->pool, err);
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
} attention_job;

/* Causal attention for (row, head) items; slot s takes items s, s + n, ...
 * so long and short rows of a pass spread over every thread. */
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
    float *scores = b->scores + (int64_t)slot * b->kv_len;

    for (int64_t item = slot; item < job->rows * hp->n_head; item += n_slots) {
        const int64_t row = item / hp->n_head;
        const int h = (int)(item % hp->n_head);
        const int64_t kv_off = (int64_t)(h / group) * hd;
        const float *qh = b->q + row * b->q_dim + (int64_t)h * hd;
        const int32_t seq = job->map->seq[row];
        const int64_t n_pos = job->map->pos[row] + 1; /* causal: up to itself */

        float max = -INFINITY;
        for (int64_t t = 0; t < n_pos; t++) {
            const int64_t r = cache_row(job->map, seq, t);
            scores[t] = dot_f32(qh, kc + r * b->kv_dim + kv_off, hd) * scale;
            if (scores[t] > max)
                max = scores[t];
        }
        float sum = 0.0f;
        for (int64_t t = 0; t < n_pos; t++) {
            scores[t] = expf(scores[t] - max);
            sum += scores[t];
        }
        const float inv_sum = 1.0f / sum;
        float *out = b->att + row * b->q_dim + (int64_t)h * hd;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int64_t t = 0; t < n_pos; t++) {
            const float p = scores[t] * inv_sum;
            const float *vt = vc + cache_row(job->map, seq, t) * b->kv_dim + kv_off;
            for (int d = 0; d < hd; d++)
                out[d] += p * vt[d];
        }
    }
}

static bn_status attention_block(bn_cpu_backend *b, int layer, int64_t M, const row_map *map,
                                 bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    /* One quantization of the normed input serves q, k and v. */
    bn_q8_rows xq =
        norm_quantize(b, b->x, M, hp->dim, bn_checkpoint_norm(b->model, layer, BN_NORM_ATTN));
    bn_status st = project(b, layer, BN_PROJ_Q, &xq, b->q, err);
    if (st == BN_OK)
        st = project(b, layer, BN_PROJ_K, &xq, b->k, err);
    if (st == BN_OK)
        st = project(b, layer, BN_PROJ_V, &xq, b->v, err);
    if (st != BN_OK)
        return st;

    float *cosv = b->rope_cos, *sinv = b->rope_sin;
    const int half = hp->rope_dim / 2;
    float *kc = map->k_cache + (int64_t)layer * map->rows * b->kv_dim;
    float *vc = map->v_cache + (int64_t)layer * map->rows * b->kv_dim;
    for (int64_t i = 0; i < M; i++) {
        const int64_t pos = map->pos[i];
        for (int j = 0; j < half; j++) {
            const float angle = (float)pos * b->inv_freq[j];
            cosv[j] = cosf(angle);
            sinv[j] = sinf(angle);
        }
        rope_heads(b->q + i * b->q_dim, hp->n_head, hp->head_dim, hp->rope_dim, cosv, sinv);
        rope_heads(b->k + i * b->kv_dim, hp->n_head_kv, hp->head_dim, hp->rope_dim, cosv, sinv);
        const int64_t r = cache_row(map, map->seq[i], pos);
        memcpy(kc + r * b->kv_dim, b->k + i * b->kv_dim, (size_t)b->kv_dim * sizeof(float));
        memcpy(vc + r * b->kv_dim, b->v + i * b->kv_dim, (size_t)b->kv_dim * sizeof(float));
    }

    attention_job job = {b, layer, M, map};
    run_slots(b, attention_slot, &job);

    bn_q8_rows aq = norm_quantize(b, b->att, M, b->q_dim,
                                  bn_checkpoint_norm(b->model, layer, BN_NORM_ATTN_SUB));
    st = project(b, layer, BN_PROJ_O, &aq, b->out, err);
    if (st != BN_OK)
        return st;
    for (int64_t i = 0; i < M * hp->dim; i++)
        b->x[i] += b->out[i];
    return BN_OK;
}

static bn_status ffn_block(bn_cpu_backend *b, int layer, int64_t M, bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    bn_q8_rows xq =
        norm_quantize(b, b->x, M, hp->dim, bn_checkpoint_norm(b->model, layer, BN_NORM_FFN));
    bn_status st = project(b, layer, BN_PROJ_GATE, &xq, b->gate, err);
    if (st == BN_OK)
        st = project(b, layer, BN_PROJ_UP, &xq, b->up, err);
    if (st != BN_OK)
        return st;
    /* Squared ReLU gate in fp32 (it overflows fp16). */
    for (int64_t i = 0; i < M * hp->ffn; i++) {
        const float g = b->gate[i] > 0.0f ? b->gate[i] : 0.0f;
        b->gate[i] = (g * g) * b->up[i];
    }
    bn_q8_rows hq =
        norm_quantize(b, b->gate, M, hp->ffn, bn_checkpoint_norm(b->model, layer, BN_NORM_FFN_SUB));
    st = project(b, layer, BN_PROJ_DOWN, &hq, b->out, err);
    if (st != BN_OK)
        return st;
    for (int64_t i = 0; i < M * hp->dim; i++)
        b->x[i] += b->out[i];
    return BN_OK;
}

/* ---- the LM head ---------------------------------------------------------- */

typedef struct head_job {
    bn_cpu_backend *b;
    const float *xs;   /* n_rows normed rows of dim */
    int64_t n_rows;
    float *logits;     /* [n_rows][vocab] */
} head_job;

/* Vocabulary rows in contiguous shares, one per slot; each head row is
 * decoded once and dotted with every requested token row. */
static void head_slot(void *ctx, int slot, int n_slots)
{
    const head_job *job = ctx;
    bn_cpu_backend *b = job->b;
    const bn_dense_matrix *head = bn_checkpoint_lm_head(b->model);
    const int64_t vocab = head->rows, dim = head->cols;
    const int64_t begin = vocab * slot / n_slots, end = vocab * (slot + 1) / n_slots;
    const bn_qtype_info *q = bn_qtype_get(head->type);
    float *row = b->head_rows + (int64_t)slot * dim;

    for (int64_t r = begin; r < end; r++) {
        const uint8_t *src = (const uint8_t *)head->data + (size_t)r * head->row_bytes;
#if defined(__x86_64__)
        if (head->type == BN_QTYPE_F16 && b->f16c) {
            for (int64_t i = 0; i < job->n_rows; i++)
                job->logits[i * vocab + r] =
                    dot_f16_f32_f16c((const uint16_t *)src, job->xs + i * dim, dim);
            continue;
        }
#endif
        const float *w = row;
        if (head->type == BN_QTYPE_F32)
            w = (const float *)src;
        else
            q->dequantize_row(src, row, dim);
        for (int64_t i = 0; i < job->n_rows; i++)
            job->logits[i * vocab + r] = dot_f32(w, job->xs + i * dim, dim);
    }
}

static void lm_head(bn_cpu_backend *b, const float *x_rows, int64_t n_rows, float *logits)
{
    const bn_hparams *hp = &b->hp;
    for (int64_t i = 0; i < n_rows; i++)
        rmsnorm(b->normed_out + i * hp->dim, x_rows + i * hp->dim,
                bn_checkpoint_output_norm(b->model), hp->dim, hp->rms_eps);
    head_job job = {b, b->normed_out, n_rows, logits};
    run_slots(b, head_slot, &job);
}

/* ---- forward ----------------------------------------------------------------- */

/* Embeds M rows (at most CHUNK_ROWS) and runs every layer over them; the
 * last hidden states are left in b->x. */
static bn_status run_rows(bn_cpu_backend *b, const int32_t *tokens, int64_t M, const row_map *map,
                          bn_error *err)
{
    const bn_hparams *hp = &b->hp;
    bn_status st = BN_OK;
    for (int64_t i = 0; i < M && st == BN_OK; i++)
        st = bn_checkpoint_embedding_row(b->model, tokens[i], b->x + i * hp->dim, err);
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

bn_status bn_cpu_backend_forward(bn_cpu_backend *b, const int32_t *tokens, int64_t n_tokens,
                                 int64_t pos, bn_logits_mode mode, float *logits, bn_error *err)
{
    if (!b || !tokens || !logits || n_tokens <= 0 || pos < 0)
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
        if (mode == BN_LOGITS_ALL)
            lm_head(b, b->x, M, logits + c * hp->vocab);
        else if (c + M == n_tokens)
            lm_head(b, b->x + (M - 1) * hp->dim, 1, logits);
    }
    if (st != BN_OK)
        b->kv_filled = pos; /* the cache past pos is now inconsistent */
    return st;
}

int64_t bn_cpu_backend_paged_rows(const bn_cpu_backend *b) { return b->paged_rows; }

bn_status bn_cpu_backend_forward_rows(bn_cpu_backend *b, const bn_batch_rows *r, float *logits,
                                      bn_error *err)
{
    if (!b || !r || r->n_rows <= 0 || !r->tokens || !r->pos || !r->seq || !r->tables ||
        !r->table_len || r->block_size < 1 || b->paged_rows % r->block_size != 0 ||
        b->paged_rows == 0 ||
        (r->n_logits > 0 && (!r->logit_rows || !logits)) || r->n_logits < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cpu forward_rows: rows, positions, sequences, block tables and a "
                            "block size dividing the paged cache's %lld rows are needed",
                            b ? (long long)b->paged_rows : 0LL);
    bn_status st = check_tokens(b, r->tokens, r->n_rows, err);
    if (st != BN_OK)
        return st;
    const int64_t n_blocks = b->paged_rows / r->block_size;
    for (int64_t i = 0; i < r->n_rows; i++) {
        const int64_t p = r->pos[i], blk = p / r->block_size;
        const int32_t s = r->seq[i];
        if (p < 0 || p >= b->kv_len || s < 0 || blk >= r->table_len[s] ||
            r->tables[s][blk] < 0 || r->tables[s][blk] >= n_blocks)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "cpu forward_rows: row %lld (sequence %d, position %lld) has no "
                                "block in the cache",
                                (long long)i, (int)s, (long long)p);
    }
    for (int64_t k = 0; k < r->n_logits; k++)
        if (r->logit_rows[k] < 0 || r->logit_rows[k] >= r->n_rows ||
            (k > 0 && r->logit_rows[k] <= r->logit_rows[k - 1]))
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "cpu forward_rows: logit rows must be rows, in increasing order");
    const bn_hparams *hp = &b->hp;
    int64_t next_logit = 0;
    for (int64_t c = 0; c < r->n_rows && st == BN_OK; c += CHUNK_ROWS) {
        const int64_t M = r->n_rows - c < CHUNK_ROWS ? r->n_rows - c : CHUNK_ROWS;
        const row_map map = {r->pos + c,  r->seq + c,  r->tables,   r->block_size,
                             b->pk_cache, b->pv_cache, b->paged_rows};
        st = run_rows(b, r->tokens + c, M, &map, err);
        /* The rows of this pass whose logits are wanted. */
        for (; st == BN_OK && next_logit < r->n_logits && r->logit_rows[next_logit] < c + M;
             next_logit++)
            lm_head(b, b->x + (r->logit_rows[next_logit] - c) * hp->dim, 1,
                    logits + next_logit * hp->vocab);
    }
    return st;
}
