/* GPU test: the CUDA backend's causal prefill attention over an fp32 cache
 * (bn_cb_attn_prefill in the parts bn_cb_attn_prefill_parts picks, which
 * takes the warp-per-row kernel where the register-tiled one does not
 * apply, and the register-tiled kernel in 1, 2, 3 and 8 parts, their
 * partial softmaxes merged) against a double-precision CPU reference:
 *
 *   - the tiled kernel's workspace size and its refusal of bad part counts
 *     and workspaces (missing, short, misaligned);
 *   - the workspace is poisoned with NaN before every run, so a merge that
 *     read a slot no part wrote would show;
 *   - random q, k, v (q scaled small, 1 and large: flat and peaked
 *     softmax); every row attends to cache positions [0, pos[i]];
 *   - the output is poisoned with NaN first; a row with a position inside
 *     the cache must come within tol of the reference, where tol bounds
 *     the fp32 error: the output is a convex combination of value rows, so
 *     weights off by w move it by at most 2 w max|v|, and a score's fp32
 *     dot product is off by at most hd 2^-24 sum|q_i k_i| (plus the
 *     exponentials' and rescalings' few ulps, 1e-5 relative); the test
 *     prints the worst error seen as a share of tol;
 *   - a row whose position is negative or outside the cache is not written
 *     (stays NaN), and neither are the columns between rows (ld > width);
 *   - positions: consecutive from 0 (a first chunk) and from mid-cache (a
 *     later chunk), tile edges (n = 1, 63, 64, 65, 127), the cache full to
 *     its last slot, rows past the end, and random positions in any order;
 *   - shapes: the 2B-4T heads (20 / 5 x 128), groups of 2 and 1, head_dim
 *     64 (the tiled kernel), 36 and 256 (the warp-per-row kernel: the
 *     tiled one answers cudaErrorNotSupported and bn_cb_attn_prefill takes
 *     the other).
 *
 * Also prints the kernels' times at the 2B-4T heads for a first 512-token
 * chunk, a later one and a short later one (information, not a check).
 * Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_kernels.h"
#include "test_util.h"
#include "test_util_cuda.h"

typedef enum { POS_RUN, POS_PAST_END, POS_RANDOM } pos_mode;

typedef struct pcase {
    int n_heads, n_kv, hd;
    int64_t capacity;
    int n, pos0;  /* rows; the first row's position (POS_RUN, POS_PAST_END) */
    int ld_extra; /* floats between rows beyond n_heads * hd (a multiple of 4) */
    float q_scale;
    pos_mode mode;
} pcase;

/* What one run launches: bn_cb_attn_prefill (in the parts that
 * bn_cb_attn_prefill_parts picks for the case), or the tiled kernel in
 * `parts` parts. */
typedef enum { K_DISPATCH, K_TILED } which_kernel;
typedef struct run_spec {
    which_kernel kernel;
    int parts; /* K_TILED */
} run_spec;
static const run_spec runs[] = {
    {K_DISPATCH, 0}, {K_TILED, 1}, {K_TILED, 2}, {K_TILED, 3}, {K_TILED, 8}};

static const char *run_name(const run_spec *r, char *buf, size_t size)
{
    switch (r->kernel) {
    case K_DISPATCH:
        snprintf(buf, size, "bn_cb_attn_prefill in %d part%s", r->parts, r->parts > 1 ? "s" : "");
        return buf;
    default: snprintf(buf, size, "tiled in %d part%s", r->parts, r->parts > 1 ? "s" : ""); return buf;
    }
}

static double worst_share = 0.0; /* largest |error| / tol seen */

/* The reference output of one row (out: n_heads * hd values); returns the
 * fp32 error bound of the row (see the header). */
static double reference_row(const pcase *c, const float *q, int64_t ldq, int row, int pos,
                            const float *k, const float *v, double vmax, double *out)
{
    const int group = c->n_heads / c->n_kv, hd = c->hd;
    const int64_t kv_dim = (int64_t)c->n_kv * hd;
    const double scale = 1.0 / sqrt((double)hd);
    double terms = 0.0; /* the largest sum |q_i k_i| / sqrt(hd) of the row */
    double *s = malloc(sizeof(double) * (size_t)(pos + 1));
    for (int h = 0; h < c->n_heads; h++) {
        const float *qr = q + (int64_t)row * ldq + (int64_t)h * hd;
        const int64_t off = (int64_t)(h / group) * hd;
        double mx = -INFINITY;
        for (int t = 0; t <= pos; t++) {
            double d = 0.0, a = 0.0;
            for (int i = 0; i < hd; i++) {
                const double p = (double)qr[i] * k[t * kv_dim + off + i];
                d += p;
                a += fabs(p);
            }
            s[t] = d * scale;
            mx = fmax(mx, s[t]);
            terms = fmax(terms, a * scale);
        }
        double sum = 0.0;
        for (int t = 0; t <= pos; t++) {
            s[t] = exp(s[t] - mx);
            sum += s[t];
        }
        for (int i = 0; i < hd; i++) {
            double o = 0.0;
            for (int t = 0; t <= pos; t++)
                o += s[t] * v[t * kv_dim + off + i];
            out[(int64_t)h * hd + i] = o / sum;
        }
    }
    free(s);
    const double score_err = (hd + 2) * ldexp(1.0, -24) * terms;
    return vmax * (1e-5 + 4.0 * score_err) + 1e-6;
}

/* Frees the device buffers of a case (NULL entries are skipped). */
static void free_device(void *const *bufs, size_t count)
{
    for (size_t i = 0; i < count; i++)
        cudaFree(bufs[i]);
}

static cudaError_t run_kernel(const run_spec *r, const bn_cb_attn_shape *s, const float *dq,
                              int64_t ld, int n, const int32_t *dpos, const float *dk,
                              const float *dv, float *dout, void *ws, size_t ws_bytes)
{
    switch (r->kernel) {
    case K_TILED:
        return bn_cb_attn_prefill_tiled(s, dq, ld, n, dpos, dk, dv,
                                        (float)(1.0 / sqrt((double)s->head_dim)), dout, ld,
                                        r->parts, ws, ws_bytes, 0);
    default:
        return bn_cb_attn_prefill(s, dq, ld, n, dpos, dk, dv, dout, ld, r->parts, ws, ws_bytes, 0);
    }
}

/* A workspace for every part count the runs use. */
static size_t workspace_for(const bn_cb_attn_shape *s, int n)
{
    size_t bytes = 0;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const size_t b = bn_cb_attn_prefill_workspace_bytes(s, n, runs[i].parts);
        if (b > bytes)
            bytes = b;
    }
    return bytes;
}

static void run_case(const pcase *c)
{
    const int hd = c->hd, width = c->n_heads * hd;
    const int64_t ld = width + c->ld_extra, kv_dim = (int64_t)c->n_kv * hd;
    const int n = c->n;
    float *q = malloc(sizeof(float) * (size_t)(n * ld));
    float *k = malloc(sizeof(float) * (size_t)(c->capacity * kv_dim));
    float *v = malloc(sizeof(float) * (size_t)(c->capacity * kv_dim));
    float *got = malloc(sizeof(float) * (size_t)(n * ld));
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    double *ref = malloc(sizeof(double) * (size_t)(n * width));
    double *tol = malloc(sizeof(double) * (size_t)n); /* < 0: the row is not checked */
    for (int64_t i = 0; i < n * ld; i++)
        q[i] = c->q_scale * test_rand_float(-1.0f, 1.0f);
    double vmax = 0.0;
    for (int64_t i = 0; i < c->capacity * kv_dim; i++) {
        k[i] = test_rand_float(-1.0f, 1.0f);
        v[i] = test_rand_float(-1.0f, 1.0f);
        vmax = fmax(vmax, fabs(v[i]));
    }
    for (int i = 0; i < n; i++) {
        if (c->mode == POS_RANDOM)
            pos[i] = (int32_t)test_rand_range(-2, c->capacity + 2);
        else
            pos[i] = c->pos0 + i;
    }
    if (c->mode == POS_PAST_END && n > 2)
        pos[n / 2] = -1; /* a negative position, too */

    bn_cb_attn_shape s = {c->n_heads, c->n_kv, hd, c->capacity};
    float *dq, *dk, *dv, *dout;
    int32_t *dpos;
    CUDA_OK(cudaMalloc((void **)&dq, sizeof(float) * (size_t)(n * ld)));
    CUDA_OK(cudaMalloc((void **)&dk, sizeof(float) * (size_t)(c->capacity * kv_dim)));
    CUDA_OK(cudaMalloc((void **)&dv, sizeof(float) * (size_t)(c->capacity * kv_dim)));
    CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)(n * ld)));
    CUDA_OK(cudaMalloc((void **)&dpos, sizeof(int32_t) * (size_t)n));
    CUDA_OK(cudaMemcpy(dq, q, sizeof(float) * (size_t)(n * ld), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, k, sizeof(float) * (size_t)(c->capacity * kv_dim),
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, v, sizeof(float) * (size_t)(c->capacity * kv_dim),
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dpos, pos, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));

    const size_t ws_bytes = workspace_for(&s, n);
    void *ws = NULL;
    if (ws_bytes)
        CUDA_OK(cudaMalloc(&ws, ws_bytes));

    /* The reference of every row is costly at n = 512: every row of small
     * cases, a sample of the large ones (the first and last rows always). */
    for (int i = 0; i < n; i++) {
        tol[i] = -1.0;
        if (pos[i] < 0 || pos[i] >= c->capacity)
            continue;
        if (n > 96 && i > 2 && i < n - 3 && test_rand_range(0, 7) != 0)
            continue;
        tol[i] = reference_row(c, q, ld, i, pos[i], k, v, vmax, ref + (int64_t)i * width);
    }

    /* The parts the backend would take: the last row sees every position up
     * to the largest (the cache's size at most). */
    int sm = 0, visible = 0;
    CUDA_OK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
    for (int i = 0; i < n; i++)
        if (pos[i] + 1 > visible)
            visible = pos[i] + 1;
    if (visible > c->capacity)
        visible = (int)c->capacity;
    const int dispatch_parts = bn_cb_attn_prefill_parts(&s, n, visible, sm, ws_bytes);
    const bool tiled_ok = bn_cb_attn_prefill_tiled_supports(&s, dq, ld, dk, dv, dout, ld);
    CHECK_MSG(tiled_ok == (hd == 64 || hd == 128), "tiled kernel support for head_dim %d: %d", hd,
              tiled_ok);
    for (size_t w = 0; w < sizeof runs / sizeof runs[0]; w++) {
        run_spec run = runs[w];
        if (run.kernel == K_DISPATCH)
            run.parts = dispatch_parts;
        char name_buf[64];
        const char *name = run_name(&run, name_buf, sizeof name_buf);
        CUDA_OK(cudaMemset(dout, 0xff, sizeof(float) * (size_t)(n * ld))); /* NaN */
        if (ws)
            CUDA_OK(cudaMemset(ws, 0xff, ws_bytes)); /* a slot read unwritten gives NaN */
        const cudaError_t rc =
            run_kernel(&run, &s, dq, ld, n, dpos, dk, dv, dout, ws, ws_bytes);
        if (runs[w].kernel == K_TILED && !tiled_ok) {
            CHECK_MSG(rc == cudaErrorNotSupported, "tiled kernel on head_dim %d: %s", hd,
                      cudaGetErrorString(rc));
            (void)cudaGetLastError();
            continue;
        }
        CUDA_OK(rc);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got, dout, sizeof(float) * (size_t)(n * ld), cudaMemcpyDeviceToHost));
        int bad = 0, unwritten_bad = 0;
        double worst = 0.0;
        for (int i = 0; i < n; i++) {
            const float *row = got + (int64_t)i * ld;
            for (int64_t j = width; j < ld; j++)
                unwritten_bad += !isnan(row[j]);
            if (pos[i] < 0 || pos[i] >= c->capacity) {
                for (int j = 0; j < width; j++)
                    unwritten_bad += !isnan(row[j]);
                continue;
            }
            if (tol[i] < 0)
                continue;
            const double *rr = ref + (int64_t)i * width;
            for (int j = 0; j < width; j++) {
                const double e = fabs((double)row[j] - rr[j]);
                if (!(e <= tol[i])) {
                    if (bad++ < 3)
                        fprintf(stderr, "  %s: row %d (pos %d) col %d: %.9g, ref %.9g, tol %.3g\n",
                                name, i, pos[i], j, row[j], rr[j], tol[i]);
                }
                if (e / tol[i] > worst)
                    worst = e / tol[i];
            }
        }
        CHECK_MSG(bad == 0,
                  "%s: %d values off, heads %d/%d hd %d capacity %lld n %d pos0 %d mode %d "
                  "q scale %g",
                  name, bad, c->n_heads, c->n_kv, hd, (long long)c->capacity, n,
                  c->pos0, (int)c->mode, c->q_scale);
        CHECK_MSG(unwritten_bad == 0, "%s: %d values written that must not be", name,
                  unwritten_bad);
        if (worst > worst_share)
            worst_share = worst;
    }
    void *const bufs[] = {ws, dq, dk, dv, dout, dpos};
    free_device(bufs, sizeof bufs / sizeof bufs[0]);
    free(tol);
    free(q);
    free(k);
    free(v);
    free(got);
    free(pos);
    free(ref);
}

/* The kernels' time at the 2B-4T heads: a 512-token first chunk (the
 * bench's), a 512-token chunk after 1536 positions, 32 tokens after 1000. */
static void time_2b4t(void)
{
    const struct {
        int n, pos0;
        int64_t cap;
        const char *what;
    } shapes[] = {{512, 0, 640, "512 tokens from position 0"},
                  {512, 1536, 2048, "512 tokens from position 1536"},
                  {32, 1000, 1100, "32 tokens from position 1000"}};
    const int hd = 128, heads = 20, kv = 5;
    const int64_t ld = heads * hd, kv_dim = kv * hd;
    const run_spec timed[] = {{K_TILED, 1}, {K_TILED, 2}, {K_TILED, 4}, {K_TILED, 8}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int n = shapes[si].n;
        const int64_t cap = shapes[si].cap;
        bn_cb_attn_shape s = {heads, kv, hd, cap};
        float *dq, *dk, *dv, *dout;
        int32_t *dpos;
        void *ws;
        const size_t ws_bytes = bn_cb_attn_prefill_workspace_bytes(&s, n, 8);
        CUDA_OK(cudaMalloc((void **)&dq, sizeof(float) * (size_t)(n * ld)));
        CUDA_OK(cudaMalloc((void **)&dk, sizeof(float) * (size_t)(cap * kv_dim)));
        CUDA_OK(cudaMalloc((void **)&dv, sizeof(float) * (size_t)(cap * kv_dim)));
        CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)(n * ld)));
        CUDA_OK(cudaMalloc((void **)&dpos, sizeof(int32_t) * (size_t)n));
        CUDA_OK(cudaMalloc(&ws, ws_bytes));
        CUDA_OK(cudaMemset(dq, 0, sizeof(float) * (size_t)(n * ld)));
        CUDA_OK(cudaMemset(dk, 0, sizeof(float) * (size_t)(cap * kv_dim)));
        CUDA_OK(cudaMemset(dv, 0, sizeof(float) * (size_t)(cap * kv_dim)));
        int32_t pos[512];
        for (int i = 0; i < n; i++)
            pos[i] = shapes[si].pos0 + i;
        CUDA_OK(cudaMemcpy(dpos, pos, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
        cudaEvent_t a, b;
        CUDA_OK(cudaEventCreate(&a));
        CUDA_OK(cudaEventCreate(&b));
        printf("2B-4T heads, %s, us a layer:", shapes[si].what);
        for (size_t w = 0; w < sizeof timed / sizeof timed[0]; w++) {
            const int reps = 20;
            char buf[64];
            CUDA_OK(run_kernel(&timed[w], &s, dq, ld, n, dpos, dk, dv, dout, ws, ws_bytes));
            CUDA_OK(cudaEventRecord(a, 0));
            for (int r = 0; r < reps; r++)
                CUDA_OK(run_kernel(&timed[w], &s, dq, ld, n, dpos, dk, dv, dout, ws, ws_bytes));
            CUDA_OK(cudaEventRecord(b, 0));
            CUDA_OK(cudaEventSynchronize(b));
            float ms = 0.0f;
            CUDA_OK(cudaEventElapsedTime(&ms, a, b));
            printf(" %s%s %.1f", w ? ";" : "", run_name(&timed[w], buf, sizeof buf),
                   1000.0 * ms / reps);
        }
        printf("\n");
        cudaEventDestroy(a);
        cudaEventDestroy(b);
        void *const bufs[] = {ws, dq, dk, dv, dout, dpos};
        free_device(bufs, sizeof bufs / sizeof bufs[0]);
    }
}

/* The tiled kernel's workspace size and its refusals of bad part counts
 * and workspaces. */
static void check_parts(void)
{
    const bn_cb_attn_shape s2b = {20, 5, 128, 640}, odd = {4, 2, 36, 640};
    CHECK(bn_cb_attn_prefill_workspace_bytes(&s2b, 512, 1) == 0);
    CHECK(bn_cb_attn_prefill_workspace_bytes(&s2b, 512, 4) == 4ull * 512 * 20 * (128 * 4 + 8));

    float *buf;
    const size_t bytes = bn_cb_attn_prefill_workspace_bytes(&s2b, 64, 2);
    CUDA_OK(cudaMalloc((void **)&buf, bytes + 64 * 2560 * sizeof(float) * 2 + 4096));
    float *q = buf, *out = buf + 64 * 2560, *kv = buf; /* not launched on: refused first */
    void *ws = out + 64 * 2560;
    const int32_t *pos = (const int32_t *)buf;
    const float sc = 0.0883883f;
    CHECK(bn_cb_attn_prefill_tiled(&s2b, q, 2560, 64, pos, kv, kv, sc, out, 2560, 0, NULL, 0, 0) ==
          cudaErrorInvalidValue);
    CHECK(bn_cb_attn_prefill_tiled(&s2b, q, 2560, 64, pos, kv, kv, sc, out, 2560, 9, ws, bytes,
                                   0) == cudaErrorInvalidValue);
    CHECK(bn_cb_attn_prefill_tiled(&s2b, q, 2560, 64, pos, kv, kv, sc, out, 2560, 2, NULL, bytes,
                                   0) == cudaErrorInvalidValue);
    CHECK(bn_cb_attn_prefill_tiled(&s2b, q, 2560, 64, pos, kv, kv, sc, out, 2560, 2, ws,
                                   bytes - 1, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_attn_prefill_tiled(&s2b, q, 2560, 64, pos, kv, kv, sc, out, 2560, 2,
                                   (char *)ws + 8, bytes, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_attn_prefill_tiled(&odd, q, 2560, 64, pos, kv, kv, sc, out, 2560, 1, NULL, 0, 0) ==
          cudaErrorNotSupported);
    CUDA_OK(cudaGetLastError());
    cudaFree(buf);
}

int main(void)
{
    test_require_cuda(8, "the prefill attention's asynchronous copies");
    CUDA_OK(bn_cb_attn_prefill_prepare(256)); /* the warp-per-row kernel at head_dim 256 */
    check_parts();
    const pcase cases[] = {
        {20, 5, 128, 640, 512, 0, 0, 1.0f, POS_RUN},     /* the 2B-4T bench's prefill */
        {20, 5, 128, 300, 77, 100, 12, 1.0f, POS_RUN},   /* a later chunk, padded rows */
        {8, 8, 64, 200, 130, 0, 0, 1.0f, POS_RUN},       /* no grouping, head_dim 64 */
        {4, 2, 128, 200, 1, 63, 0, 1.0f, POS_RUN},       /* one row at a tile's end */
        {4, 2, 128, 200, 63, 0, 4, 1.0f, POS_RUN},       /* tile edges */
        {4, 2, 128, 200, 64, 0, 0, 8.0f, POS_RUN},       /* peaked softmax */
        {4, 2, 128, 200, 65, 0, 0, 0.01f, POS_RUN},      /* flat softmax */
        {4, 2, 64, 200, 127, 1, 0, 4.0f, POS_RUN},
        {4, 1, 64, 128, 64, 64, 0, 1.0f, POS_RUN},       /* the cache full to its last slot */
        {4, 2, 128, 50, 40, 30, 0, 1.0f, POS_PAST_END},  /* rows past the cache's end */
        {6, 3, 128, 150, 100, 0, 8, 1.0f, POS_RANDOM},   /* positions in any order */
        {2, 2, 64, 90, 70, 0, 0, 2.0f, POS_RANDOM},
        {4, 2, 36, 100, 70, 10, 0, 1.0f, POS_RUN},       /* the warp-per-row kernel only */
        {4, 2, 256, 100, 40, 20, 0, 1.0f, POS_PAST_END}, /* two chunks a lane */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (test_in_part((int)i))
            run_case(&cases[i]);
    printf("worst error: %.3f of the tolerance\n", worst_share);
    if (!getenv("BN_TEST_QUICK"))
        time_2b4t();
    TEST_EXIT();
}
