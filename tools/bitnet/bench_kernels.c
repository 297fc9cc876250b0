/*
 * bench_kernels.c - `bitnet bench kernels`: W2A8 CPU kernel throughput on
 * the 2B-4T projection shapes, for every provider and thread count, with
 * this machine's ceilings measured in the same run:
 *   - streaming-read bandwidth (sum of a buffer far larger than the caches);
 *   - a plain F32 matvec of the same shape (the cost without ternary).
 *
 * Weights are rotated through enough copies to exceed the last-level cache,
 * so M = 1 figures are memory figures, not cache figures. Times are the
 * median of repeated calls. Nothing here passes or fails: it prints a table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kernel_manager.h"
#include "threadpool.h"
#include "w2a8.h"

#define MAX_LIST 16

typedef struct bench_opts {
    int64_t shapes[MAX_LIST][2]; /* N, K */
    int n_shapes;
    int64_t ms[MAX_LIST];
    int n_ms;
    int threads[MAX_LIST]; /* 0 = all cores */
    int n_threads;
    const char *providers; /* NULL = every available one */
    double min_seconds;
    double rotate_mib;
    int64_t scalar_max_m;
} bench_opts;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet bench kernels [options]\n"
            "\n"
            "Times the W2A8 kernels (ternary weights x int8 activations) of every CPU provider.\n"
            "\n"
            "  --shapes NxK,...     weight shapes (default 2560x2560,640x2560,6912x2560,2560x6912)\n"
            "  --m LIST             activation rows (default 1,8,64,512)\n"
            "  --threads LIST       thread counts; 'all' = every core (default 1,all)\n"
            "  --providers LIST     providers to time (default: every available one)\n"
            "  --min-time SECONDS   time spent per measurement (default 0.3)\n"
            "  --rotate-mib MIB     weight copies rotated per measurement (default 512)\n"
            "  --scalar-max-m M     skip the scalar reference above this M (default 8)\n"
            "  --device cpu|cuda[:N] cuda: the GPU kernels (device N, default 0) against copy\n"
            "                       bandwidth and cuBLAS BF16\n"
            "                       (options there: --shapes, --m, --rotate-mib, --kernel\n"
            "                       NAME|all: for M > 1 that kernel of the table (e.g.\n"
            "                       wgmma-192x64) or every one instead of the table's pick,\n"
            "                       --split 1|2|4|8: the GEMV's K split)\n"
            "  --help\n");
}

static bool parse_list(const char *text, int64_t *out, int *count, bool allow_all)
{
    char buf[256];
    if (strlen(text) >= sizeof buf)
        return false;
    strcpy(buf, text);
    *count = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*count == MAX_LIST)
            return false;
        if (allow_all && strcmp(t, "all") == 0) {
            out[(*count)++] = 0;
            continue;
        }
        char *end;
        long long v = strtoll(t, &end, 10);
        if (*end || v <= 0 || v > (1 << 20))
            return false;
        out[(*count)++] = v;
    }
    return *count > 0;
}

static bool parse_shapes(const char *text, bench_opts *o)
{
    char buf[256];
    if (strlen(text) >= sizeof buf)
        return false;
    strcpy(buf, text);
    o->n_shapes = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        long long n, k;
        char tail;
        if (o->n_shapes == MAX_LIST || sscanf(t, "%lldx%lld%c", &n, &k, &tail) != 2 || n <= 0 ||
            k <= 0 || n > (1 << 20) || k > (1 << 22))
            return false;
        o->shapes[o->n_shapes][0] = n;
        o->shapes[o->n_shapes][1] = k;
        o->n_shapes++;
    }
    return o->n_shapes > 0;
}

/* ---- ceilings -------------------------------------------------------------- */

typedef struct read_job {
    const uint64_t *buf;
    uint64_t sums[256];
} read_job;

__attribute__((optimize("O3"))) static void read_chunk(void *ctx, int64_t begin, int64_t end)
{
    read_job *j = ctx;
    uint64_t acc[8] = {0};
    for (int64_t i = begin; i + 8 <= end; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += j->buf[i + l];
    uint64_t s = 0;
    for (int l = 0; l < 8; l++)
        s += acc[l];
    j->sums[(begin / 4096) % 256] += s; /* keep the reads observable */
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of fn over at least 3 calls and min_seconds. */
typedef void (*timed_fn)(void *ctx, int call);
static double time_median(timed_fn fn, void *ctx, double min_seconds)
{
    enum { MAX_RUNS = 2000 };
    static double runs[MAX_RUNS];
    fn(ctx, 0); /* warm up */
    int n = 0;
    const double start = bn_time_seconds();
    while (n < MAX_RUNS && (n < 3 || bn_time_seconds() - start < min_seconds)) {
        const double t0 = bn_time_seconds();
        fn(ctx, n + 1);
        runs[n++] = bn_time_seconds() - t0;
    }
    qsort(runs, (size_t)n, sizeof runs[0], cmp_double);
    return runs[n / 2];
}

typedef struct read_ctx {
    bn_threadpool *pool;
    read_job job;
    int64_t words;
} read_ctx;

static void run_read(void *p, int call)
{
    (void)call;
    read_ctx *c = p;
    bn_threadpool_run(c->pool, c->words, 4096, read_chunk, &c->job);
}

static double stream_read_gbs(bn_threadpool *pool, double min_seconds)
{
    const int64_t bytes = 1ll << 30;
    uint64_t *buf = bn_aligned_alloc(64, (size_t)bytes);
    if (!buf)
        return 0.0;
    for (int64_t i = 0; i < bytes / 8; i++)
        buf[i] = (uint64_t)i * 2654435761u;
    read_ctx c = {pool, {buf, {0}}, bytes / 8};
    double t = time_median(run_read, &c, min_seconds);
    bn_aligned_free(buf);
    return (double)bytes / t / 1e9;
}

typedef struct f32_ctx {
    bn_threadpool *pool;
    const float *w;
    const float *x;
    float *y;
    int64_t n, k;
} f32_ctx;

/* Sixteen independent partial sums: the compiler may vectorize this without
 * reassociating, which keeps it a fair "plain C" F32 matvec. */
__attribute__((optimize("O3"))) static void f32_rows(void *p, int64_t begin, int64_t end)
{
    f32_ctx *c = p;
    for (int64_t r = begin; r < end; r++) {
        const float *w = c->w + r * c->k;
        float acc[16] = {0};
        int64_t i = 0;
        for (; i + 16 <= c->k; i += 16)
            for (int l = 0; l < 16; l++)
                acc[l] += w[i + l] * c->x[i + l];
        float s = 0;
        for (; i < c->k; i++)
            s += w[i] * c->x[i];
        for (int l = 0; l < 16; l++)
            s += acc[l];
        c->y[r] = s;
    }
}

static void run_f32(void *p, int call)
{
    (void)call;
    f32_ctx *c = p;
    bn_threadpool_run(c->pool, c->n, 16, f32_rows, c);
}

static double f32_matvec_seconds(bn_threadpool *pool, int64_t n, int64_t k, double min_seconds)
{
    float *w = bn_aligned_alloc(64, (size_t)(n * k) * sizeof(float));
    float *x = bn_aligned_alloc(64, (size_t)k * sizeof(float));
    float *y = bn_aligned_alloc(64, (size_t)n * sizeof(float));
    if (!w || !x || !y) {
        bn_aligned_free(w);
        bn_aligned_free(x);
        bn_aligned_free(y);
        return 0.0;
    }
    for (int64_t i = 0; i < n * k; i++)
        w[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (int64_t i = 0; i < k; i++)
        x[i] = (float)(i % 13) * 0.1f;
    f32_ctx c = {pool, w, x, y, n, k};
    double t = time_median(run_f32, &c, min_seconds);
    bn_aligned_free(w);
    bn_aligned_free(x);
    bn_aligned_free(y);
    return t;
}

/* ---- W2A8 ------------------------------------------------------------------ */

typedef struct w2a8_ctx {
    bn_threadpool *pool;
    bn_w2a8_weights *copies;
    int n_copies;
    bn_q8_rows *x;
    float *y;
} w2a8_ctx;

static void run_w2a8(void *p, int call)
{
    w2a8_ctx *c = p;
    bn_w2a8_matmul(&c->copies[call % c->n_copies], c->x, c->y, c->copies[0].n, c->pool, NULL);
}

/* Packs one random matrix for p and clones it until the copies exceed
 * rotate_bytes (at least one). */
static int make_copies(const bn_kernel_provider *p, int64_t n, int64_t k, double rotate_bytes,
                       bn_w2a8_weights **out)
{
    int8_t *codes = malloc((size_t)(n * k));
    if (!codes)
        return 0;
    uint64_t state = 88172645463325252ull;
    for (int64_t i = 0; i < n * k; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        codes[i] = (int8_t)(state % 3) - 1;
    }
    bn_w2a8_weights first;
    bn_status st = bn_w2a8_pack(p, codes, n, k, 0.02f, &first, NULL);
    free(codes);
    if (st != BN_OK)
        return 0;
    int count = (int)(rotate_bytes / (double)first.bytes) + 1;
    if (count > 4096)
        count = 4096;
    bn_w2a8_weights *copies = calloc((size_t)count, sizeof *copies);
    if (!copies) {
        bn_w2a8_weights_free(&first);
        return 0;
    }
    copies[0] = first;
    int made = 1;
    for (; made < count; made++) {
        copies[made] = first;
        copies[made].data = bn_aligned_alloc(64, first.bytes);
        if (!copies[made].data)
            break;
        memcpy(copies[made].data, first.data, first.bytes);
    }
    *out = copies;
    return made;
}

static void free_copies(bn_w2a8_weights *copies, int n)
{
    for (int i = 0; i < n; i++)
        bn_w2a8_weights_free(&copies[i]);
    free(copies);
}

static bool wanted(const bench_opts *o, const char *name)
{
    if (!o->providers)
        return true;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", o->providers);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (strcmp(t, name) == 0)
            return true;
    return false;
}

/* --providers names only providers this build has and this CPU runs:
 * a typo or a provider the CPU lacks would otherwise time nothing. */
static int check_provider_names(const char *list)
{
    char buf[128];
    if (strlen(list) >= sizeof buf || !list[0]) {
        fprintf(stderr, "bitnet bench kernels: error: --providers takes a comma-separated list "
                        "of provider names\n");
        return BN_EXIT_USAGE;
    }
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        const bn_kernel_provider *p = bn_kernel_by_name(t);
        if (!p) {
            fprintf(stderr, "bitnet bench kernels: error: no kernel provider '%s' (this build has "
                            "%s)\n", t, bn_kernel_compiled_names());
            return BN_EXIT_USAGE;
        }
        if (!p->is_available()) {
            fprintf(stderr, "bitnet bench kernels: error: kernel provider '%s' is not usable "
                            "here\nbitnet: hint: 'bitnet devices' says why\n", t);
            return BN_EXIT_DEVICE;
        }
    }
    return BN_EXIT_OK;
}

int bench_kernels_cuda(int argc, char **argv, int device);
int bench_kernels(int argc, char **argv)
{
    /* --device cuda runs the GPU benchmark (bench_cuda.c) instead. */
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--device") != 0)
            continue;
        bn_device_request req;
        if (bn_parse_device_request(argv[i + 1], &req) && req.kind == BN_DEVICE_CUDA) {
#ifdef BITNET_HAVE_CUDA
            return bench_kernels_cuda(argc, argv, req.index < 0 ? 0 : req.index);
#else
            fprintf(stderr, "bitnet bench kernels: error: this build has no CUDA support\n"
                            "bitnet: hint: rebuild with -DBITNET_CUDA=ON\n");
            return BN_EXIT_DEVICE;
#endif
        }
        if (strcmp(argv[i + 1], "cpu") != 0) {
            fprintf(stderr, "bitnet bench kernels: error: --device must be cpu, cuda or cuda:N\n");
            return BN_EXIT_USAGE;
        }
    }
    bench_opts o = {.n_shapes = 4,
                    .shapes = {{2560, 2560}, {640, 2560}, {6912, 2560}, {2560, 6912}},
                    .n_ms = 4,
                    .ms = {1, 8, 64, 512},
                    .n_threads = 2,
                    .threads = {1, 0},
                    .min_seconds = 0.3,
                    .rotate_mib = 512,
                    .scalar_max_m = 8};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t list[MAX_LIST];
        int count;
        bool ok = true;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return BN_EXIT_OK;
        } else if (!v) {
            ok = false;
        } else if (strcmp(a, "--shapes") == 0) {
            ok = parse_shapes(v, &o);
        } else if (strcmp(a, "--m") == 0) {
            ok = parse_list(v, o.ms, &o.n_ms, false);
        } else if (strcmp(a, "--threads") == 0) {
            ok = parse_list(v, list, &count, true);
            for (int t = 0; ok && t < count; t++)
                o.threads[t] = (int)list[t];
            o.n_threads = count;
        } else if (strcmp(a, "--device") == 0) {
            /* cpu: this benchmark (cuda was dispatched above) */
        } else if (strcmp(a, "--providers") == 0) {
            o.providers = v;
        } else if (strcmp(a, "--min-time") == 0) {
            o.min_seconds = atof(v);
            ok = o.min_seconds > 0 && o.min_seconds <= 60;
        } else if (strcmp(a, "--rotate-mib") == 0) {
            o.rotate_mib = atof(v);
            ok = o.rotate_mib >= 0 && o.rotate_mib <= 65536;
        } else if (strcmp(a, "--scalar-max-m") == 0) {
            ok = parse_list(v, list, &count, false) && count == 1;
            o.scalar_max_m = list[0];
        } else {
            fprintf(stderr, "bitnet bench kernels: error: unknown option '%s'\n", a);
            usage(stderr);
            return BN_EXIT_USAGE;
        }
        if (!ok) {
            fprintf(stderr, "bitnet bench kernels: error: bad or missing value for %s\n", a);
            return BN_EXIT_USAGE;
        }
        i++;
    }

    if (o.providers) {
        const int rc = check_provider_names(o.providers);
        if (rc != BN_EXIT_OK)
            return rc;
    }

    const bn_cpu_features *cpu = bn_cpu_features_get();
    printf("# bitnet bench kernels\n\nCPU: %s (%s), %d logical cores; providers compiled: %s\n\n",
           cpu->model[0] ? cpu->model : "unknown", cpu->arch, cpu->logical_cores,
           bn_kernel_compiled_names());

    const bn_kernel_provider *const *providers;
    const int n_providers = bn_kernel_providers(&providers);
    for (int ti = 0; ti < o.n_threads; ti++) {
        bn_threadpool *pool = NULL;
        bn_error err;
        if (bn_threadpool_create(o.threads[ti], &pool, &err) != BN_OK)
            return cli_fail(&err);
        const int threads = bn_threadpool_size(pool);
        const double read_gbs = stream_read_gbs(pool, o.min_seconds);
        printf("## %d thread%s\n\nstreaming read: %.1f GB/s\n\n", threads, threads > 1 ? "s" : "",
               read_gbs);
        printf("| provider | N x K | M | time (us) | GB/s (weights) | %% of read | GOPS | vs F32 "
               "matvec |\n|---|---|---|---|---|---|---|---|\n");
        for (int si = 0; si < o.n_shapes; si++) {
            const int64_t n = o.shapes[si][0], k = o.shapes[si][1];
            const double f32_s = f32_matvec_seconds(pool, n, k, o.min_seconds);
            printf("| f32 matvec | %lldx%lld | 1 | %.1f | %.1f | %.0f%% | %.1f | 1.00x |\n",
                   (long long)n, (long long)k, f32_s * 1e6, (double)(n * k * 4) / f32_s / 1e9,
                   100.0 * (double)(n * k * 4) / f32_s / 1e9 / read_gbs,
                   2.0 * (double)(n * k) / f32_s / 1e9);
            for (int pi = 0; pi < n_providers; pi++) {
                const bn_kernel_provider *p = providers[pi];
                if (!p->is_available() || !wanted(&o, p->name))
                    continue;
                bn_w2a8_weights *copies = NULL;
                const int n_copies = make_copies(p, n, k, o.rotate_mib * 1048576.0, &copies);
                if (n_copies == 0) {
                    printf("| %s | %lldx%lld | - | out of memory | | | | |\n", p->name,
                           (long long)n, (long long)k);
                    continue;
                }
                for (int mi = 0; mi < o.n_ms; mi++) {
                    const int64_t m = o.ms[mi];
                    if (p == &bn_provider_scalar && m > o.scalar_max_m) {
                        printf("| %s | %lldx%lld | %lld | skipped (--scalar-max-m) | | | | |\n",
                               p->name, (long long)n, (long long)k, (long long)m);
                        continue;
                    }
                    bn_q8_rows x;
                    float *y = malloc((size_t)(m * n) * sizeof *y);
                    if (!y || bn_q8_rows_alloc(&x, m, k, NULL) != BN_OK) {
                        free(y);
                        printf("| %s | %lldx%lld | %lld | out of memory | | | | |\n", p->name,
                               (long long)n, (long long)k, (long long)m);
                        continue;
                    }
                    for (int64_t i = 0; i < m * x.lda; i++)
                        x.q[i] = (int8_t)((i * 37) % 255 - 127);
                    for (int64_t i = 0; i < m; i++) {
                        x.scale[i] = 10.0f;
                        x.sum[i] = 0;
                    }
                    w2a8_ctx c = {pool, copies, n_copies, &x, y};
                    const double s = time_median(run_w2a8, &c, o.min_seconds);
                    const double gbs = (double)(n * k) / 4.0 / s / 1e9;
                    printf("| %s | %lldx%lld | %lld | %.1f | %.1f | %.0f%% | %.1f | %.2fx |\n",
                           p->name, (long long)n, (long long)k, (long long)m, s * 1e6, gbs,
                           100.0 * gbs / read_gbs, 2.0 * (double)(m * n * k) / s / 1e9,
                           f32_s * (double)m / s);
                    bn_q8_rows_free(&x);
                    free(y);
                }
                free_copies(copies, n_copies);
            }
        }
        printf("\n");
        bn_threadpool_destroy(pool);
    }
    printf("GB/s counts the packed ternary weights (N*K/4 bytes) once per call; GOPS counts\n"
           "2*M*N*K; 'vs F32 matvec' is M F32 matvec times over this time.\n");
    return BN_EXIT_OK;
}
