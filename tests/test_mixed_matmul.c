/* GPU test: the mixed-precision matmul. Conversion kernels against the CPU
 * conversions bit for bit (every fp16/bf16 value back to fp32; fp32 inputs
 * covering every sign/exponent/high-mantissa pattern with the low bits at
 * and around each rounding tie); then C = alpha A.B + beta C in FP32, FP16
 * and BF16, on cuBLASLt and cublasGemmEx, host and device matrices, against
 * a double-precision reference; AUTO's choice; metrics that add up; out of
 * memory with the hint and the matmul usable afterwards. Exits 77 without a
 * usable GPU. */
#include <cuda_runtime_api.h>

#include "cuda_context.h"
#include "fp16.h"
#include "mixed_matmul.h"
#include "perf_stats.h"
#include "precision_select.h"
#include "test_util.h"
#include "test_util_cuda.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- conversions ----------------------------------------------------------------- */

static void check_conversions(cudaStream_t stream)
{
    /* Low 16 bits: zero, one, around the fp16 tie of normal numbers (0x1000
     * of 13 dropped bits), the ties of subnormal shifts 14..16 (0x2000,
     * 0x4000, 0x8000) and around the bf16 tie (0x8000), all ones, and a
     * random pattern per run. With every high half, that reaches every
     * rounding position of both conversions, NaNs, infinities, subnormals. */
    const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000,
                             0x4000, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff,
                             (uint32_t)(test_rand_u64() & 0xffff),
                             (uint32_t)(test_rand_u64() & 0xffff)};
    const size_t n_low = sizeof lows / sizeof lows[0];
    const size_t n = 65536 * n_low;
    float *x = malloc(n * sizeof *x);
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (size_t j = 0; j < n_low; j++)
            x[hi * n_low + j] = float_of(hi << 16 | lows[j]);

    float *d_x;
    uint16_t *d_h, *h = malloc(n * sizeof *h);
    CUDA_OK(cudaMalloc((void **)&d_x, n * sizeof *d_x));
    CUDA_OK(cudaMalloc((void **)&d_h, n * sizeof *d_h));
    /* Everything on the context's stream: it is non-blocking, so plain
     * cudaMemcpy / cudaMemset (legacy default stream) would not be ordered
     * with it. */
    CUDA_OK(cudaMemcpyAsync(d_x, x, n * sizeof *x, cudaMemcpyHostToDevice, stream));

    for (int bf = 0; bf < 2; bf++) {
        memset(h, 0xa5, n * sizeof *h); /* poison */
        CUDA_OK(cudaMemsetAsync(d_h, 0xa5, n * sizeof *d_h, stream));
        CUDA_OK(bf ? bn_cuda_convert_f32_to_bf16(d_x, d_h, (int64_t)n, stream)
                   : bn_cuda_convert_f32_to_f16(d_x, d_h, (int64_t)n, stream));
        CUDA_OK(cudaMemcpyAsync(h, d_h, n * sizeof *h, cudaMemcpyDeviceToHost, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            const uint16_t want = bf ? bn_fp32_to_bf16(x[i]) : bn_fp32_to_fp16(x[i]);
            if (h[i] != want && bad++ < 5)
                fprintf(stderr, "  fp32 0x%08x -> %s: GPU 0x%04x, CPU 0x%04x\n", bits_of(x[i]),
                        bf ? "bf16" : "fp16", h[i], want);
        }
        CHECK_MSG(bad == 0, "%zu of %zu fp32 -> %s conversions differ from the CPU", bad, n,
                  bf ? "bf16" : "fp16");
    }

    /* Every 16-bit pattern back to fp32. */
    uint16_t all[65536];
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    CUDA_OK(cudaMemcpyAsync(d_h, all, sizeof all, cudaMemcpyHostToDevice, stream));
    for (int bf = 0; bf < 2; bf++) {
        CUDA_OK(cudaMemsetAsync(d_x, 0xa5, 65536 * sizeof *d_x, stream));
        CUDA_OK(bf ? bn_cuda_convert_bf16_to_f32(d_h, d_x, 65536, stream)
                   : bn_cuda_convert_f16_to_f32(d_h, d_x, 65536, stream));
        CUDA_OK(cudaMemcpyAsync(x, d_x, 65536 * sizeof *x, cudaMemcpyDeviceToHost, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        size_t bad = 0;
        for (uint32_t i = 0; i < 65536; i++) {
            const uint32_t want = bits_of(bf ? bn_bf16_to_fp32(all[i]) : bn_fp16_to_fp32(all[i]));
            if (bits_of(x[i]) != want && bad++ < 5)
                fprintf(stderr, "  %s 0x%04x -> fp32: GPU 0x%08x, CPU 0x%08x\n",
                        bf ? "bf16" : "fp16", all[i], bits_of(x[i]), want);
        }
        CHECK_MSG(bad == 0, "%zu of 65536 %s -> fp32 conversions differ from the CPU", bad,
                  bf ? "bf16" : "fp16");
    }

    /* n == 0 launches nothing and succeeds; bad arguments are refused. */
    CHECK(bn_cuda_convert_f32_to_f16(d_x, d_h, 0, stream) == cudaSuccess);
    CHECK(bn_cuda_convert_f32_to_f16(NULL, d_h, 4, stream) == cudaErrorInvalidValue);
    CHECK(bn_cuda_convert_f32_to_bf16(d_x, d_h, -1, stream) == cudaErrorInvalidValue);

    CUDA_OK(cudaFree(d_x));
    CUDA_OK(cudaFree(d_h));
    free(x);
    free(h);
}

/* ---- the matmul ------------------------------------------------------------------- */

typedef struct problem {
    int64_t m, n, k;
    float *a, *b, *c0;   /* inputs; c0 is the C that beta scales        */
    double *sum, *scale; /* exact A.B, and sum |a||b| per element      */
} problem;

static problem make_problem(int64_t m, int64_t n, int64_t k)
{
    problem p = {m, n, k, NULL, NULL, NULL, NULL, NULL};
    p.a = malloc(sizeof(float) * (size_t)(m * k));
    p.b = malloc(sizeof(float) * (size_t)(k * n));
    p.c0 = malloc(sizeof(float) * (size_t)(m * n));
    p.sum = malloc(sizeof(double) * (size_t)(m * n));
    p.scale = malloc(sizeof(double) * (size_t)(m * n));
    for (int64_t i = 0; i < m * k; i++)
        p.a[i] = test_rand_float(-1.0f, 1.0f);
    for (int64_t i = 0; i < k * n; i++)
        p.b[i] = test_rand_float(-1.0f, 1.0f);
    for (int64_t i = 0; i < m * n; i++)
        p.c0[i] = test_rand_float(-4.0f, 4.0f);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0, t = 0.0;
            for (int64_t l = 0; l < k; l++) {
                const double x = (double)p.a[i * k + l] * (double)p.b[l * n + j];
                s += x;
                t += fabs(x);
            }
            p.sum[i * n + j] = s;
            p.scale[i * n + j] = t;
        }
    }
    return p;
}

static void free_problem(problem *p)
{
    free(p->a);
    free(p->b);
    free(p->c0);
    free(p->sum);
    free(p->scale);
}

/* The largest error of c against alpha * A.B + beta * c0, relative to the
 * size of what was summed (so it is comparable across K and cancellation). */
static double max_error(const problem *p, const float *c, float alpha, float beta)
{
    double worst = 0.0;
    for (int64_t i = 0; i < p->m * p->n; i++) {
        const double want =
            (double)alpha * p->sum[i] + (beta != 0.0f ? (double)beta * p->c0[i] : 0.0);
        const double size =
            fabs((double)alpha) * p->scale[i] + fabs((double)beta) * fabs(p->c0[i]);
        const double e = isfinite(c[i]) ? fabs((double)c[i] - want) / (size > 0 ? size : 1.0)
                                        : INFINITY;
        if (e > worst)
            worst = e;
    }
    return worst;
}

/* What the test expects the metrics to say, tallied as it goes. */
typedef struct tally {
    uint64_t ops[BN_PRECISION_COUNT], flops[BN_PRECISION_COUNT];
    uint64_t h2d, h2d_bytes, d2h, d2h_bytes, launches, lt, gemm_ex;
} tally;

static void count(tally *t, const problem *p, const bn_matmul_run *run, bool host, float beta)
{
    t->ops[run->precision]++;
    t->flops[run->precision] += 2 * (uint64_t)(p->m * p->n * p->k);
    if (host) {
        t->h2d += beta != 0.0f ? 3 : 2;
        t->h2d_bytes += sizeof(float) * (uint64_t)(p->m * p->k + p->k * p->n +
                                                   (beta != 0.0f ? p->m * p->n : 0));
        t->d2h += 1;
        t->d2h_bytes += sizeof(float) * (uint64_t)(p->m * p->n);
    }
    t->launches += run->precision == BN_PRECISION_FP32 ? 1 : 3;
    if (run->engine == BN_MATMUL_ENGINE_CUBLASLT)
        t->lt++;
    else
        t->gemm_ex++;
}

static bool lt_present;

static void check_problem(bn_mixed_matmul *mm, const bn_cuda_device *dev, const problem *p,
                          tally *t)
{
    const bn_precision precisions[] = {BN_PRECISION_FP32, BN_PRECISION_FP16, BN_PRECISION_BF16};
    const bn_matmul_engine engines[] = {BN_MATMUL_ENGINE_AUTO, BN_MATMUL_ENGINE_CUBLASLT,
                                        BN_MATMUL_ENGINE_GEMM_EX};
    const bool aligned = p->m % 16 == 0 && p->n % 16 == 0 && p->k % 16 == 0;
    float *c = malloc(sizeof(float) * (size_t)(p->m * p->n));
    bn_error err;

    for (size_t pi = 0; pi < 3; pi++) {
        const bn_precision prec = precisions[pi];
        if ((prec == BN_PRECISION_FP16 && !dev->fp16) || (prec == BN_PRECISION_BF16 && !dev->bf16))
            continue;
        const double bound = bn_precision_matmul_error_bound(prec, p->k + 2);
        for (size_t ei = 0; ei < 3; ei++) {
            bn_mixed_matmul_set_engine(mm, engines[ei]);
            for (int with_beta = 0; with_beta < 2; with_beta++) {
                const float alpha = with_beta ? 0.75f : 1.0f, beta = with_beta ? -1.5f : 0.0f;
                if (with_beta)
                    memcpy(c, p->c0, sizeof(float) * (size_t)(p->m * p->n));
                else
                    for (int64_t i = 0; i < p->m * p->n; i++)
                        c[i] = NAN; /* beta == 0: C must not be read */
                bn_matmul_run run = {BN_PRECISION_AUTO, BN_MATMUL_ENGINE_AUTO, -1, -1};
                const bn_status st = bn_mixed_matmul_run(mm, prec, p->m, p->n, p->k, alpha, p->a,
                                                         p->b, beta, c, &run, &err);
                if (st == BN_ERR_UNSUPPORTED && engines[ei] == BN_MATMUL_ENGINE_CUBLASLT &&
                    (!lt_present || !aligned)) {
                    printf("  %lldx%lldx%lld %s: cuBLASLt declined: %s\n", (long long)p->m,
                           (long long)p->n, (long long)p->k, bn_precision_name(prec),
                           err.message);
                    continue;
                }
                CHECK_MSG(st == BN_OK, "%lldx%lldx%lld %s %s: %s (%s)", (long long)p->m,
                          (long long)p->n, (long long)p->k, bn_precision_name(prec),
                          bn_matmul_engine_name(engines[ei]), err.message, err.hint);
                if (st != BN_OK)
                    continue;
                CHECK(run.precision == prec);
                if (engines[ei] != BN_MATMUL_ENGINE_AUTO)
                    CHECK(run.engine == engines[ei]);
                else if (lt_present && aligned)
                    CHECK_MSG(run.engine == BN_MATMUL_ENGINE_CUBLASLT,
                              "auto ran %s on an aligned shape", bn_matmul_engine_name(run.engine));
                CHECK(run.compute_ms >= 0 && run.total_ms > 0);
                count(t, p, &run, true, beta);

                const double e = max_error(p, c, alpha, beta);
                CHECK_MSG(e <= bound, "%lldx%lldx%lld %s %s beta %g: error %.3g > bound %.3g",
                          (long long)p->m, (long long)p->n, (long long)p->k,
                          bn_precision_name(prec), bn_matmul_engine_name(run.engine), beta, e,
                          bound);
                if (prec == BN_PRECISION_FP32)
                    CHECK_MSG(e <= 1e-5, "FP32 %lldx%lldx%lld error %.3g (TF32 on?)",
                              (long long)p->m, (long long)p->n, (long long)p->k, e);
                else if (p->m * p->n >= 64)
                    /* Inputs really were rounded: an fp32 product would be
                     * orders of magnitude closer. */
                    CHECK_MSG(e > bn_precision_unit_roundoff(prec) / 64,
                              "%s error %.3g is too small for its precision",
                              bn_precision_name(prec), e);
                if (ei == 0 && !with_beta)
                    printf("  %5lld x %5lld x %5lld  %s  %-8s  max rel error %.2e (bound %.2e)  "
                           "%.3f ms\n",
                           (long long)p->m, (long long)p->n, (long long)p->k,
                           bn_precision_name(prec), bn_matmul_engine_name(run.engine), e, bound,
                           run.compute_ms);
            }
        }
    }
    bn_mixed_matmul_set_engine(mm, BN_MATMUL_ENGINE_AUTO);
    free(c);
}

/* The same product with every matrix already on the device: no transfers. */
static void check_device_resident(bn_mixed_matmul *mm, const problem *p, tally *t)
{
    const size_t sa = sizeof(float) * (size_t)(p->m * p->k);
    const size_t sb = sizeof(float) * (size_t)(p->k * p->n);
    const size_t sc = sizeof(float) * (size_t)(p->m * p->n);
    float *da, *db, *dc, *c = malloc(sc);
    CUDA_OK(cudaMalloc((void **)&da, sa));
    CUDA_OK(cudaMalloc((void **)&db, sb));
    CUDA_OK(cudaMalloc((void **)&dc, sc));
    CUDA_OK(cudaMemcpy(da, p->a, sa, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, p->b, sb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dc, p->c0, sc, cudaMemcpyHostToDevice));
    /* The matmul's streams are non-blocking: make sure the copies (on the
     * legacy default stream) have landed. */
    CUDA_OK(cudaDeviceSynchronize());
    bn_mixed_matmul_metrics before, after;
    bn_mixed_matmul_get_metrics(mm, &before);
    bn_matmul_run run;
    bn_error err;
    const bn_status st =
        bn_mixed_matmul_run(mm, BN_PRECISION_AUTO, p->m, p->n, p->k, 0.5f, da, db, 2.0f, dc, &run,
                            &err);
    CHECK_MSG(st == BN_OK, "device-resident: %s", err.message);
    if (st == BN_OK) {
        count(t, p, &run, false, 2.0f);
        CUDA_OK(cudaMemcpy(c, dc, sc, cudaMemcpyDeviceToHost));
        const double e = max_error(p, c, 0.5f, 2.0f);
        CHECK_MSG(e <= bn_precision_matmul_error_bound(run.precision, p->k + 2),
                  "device-resident %s error %.3g", bn_precision_name(run.precision), e);
        bn_mixed_matmul_get_metrics(mm, &after);
        CHECK(after.h2d_transfers == before.h2d_transfers);
        CHECK(after.d2h_transfers == before.d2h_transfers);
        CHECK(after.operations == before.operations + 1);
    }
    CUDA_OK(cudaFree(da));
    CUDA_OK(cudaFree(db));
    CUDA_OK(cudaFree(dc));
    free(c);
}

int main(void)
{
    int count_dev = 0;
    if (cudaGetDeviceCount(&count_dev) != cudaSuccess || count_dev == 0)
        TEST_SKIP("no usable CUDA device (see 'bitnet devices')");
    test_seed_init();

    bn_error err;
    bn_cuda_context *ctx = NULL;
    if (bn_cuda_context_create(0, &ctx, &err) != BN_OK) {
        fprintf(stderr, "FAIL: context: %s (%s)\n", err.message, err.hint);
        return 1;
    }
    const bn_cuda_device *dev = bn_cuda_context_device(ctx);
    printf("device: %s, cc %d.%d (fp16 %d, bf16 %d)\n", dev->name, dev->cc_major, dev->cc_minor,
           dev->fp16, dev->bf16);

    check_conversions(bn_cuda_context_compute_stream(ctx));

    const bn_cublaslt *lt;
    cublasLtHandle_t lth;
    lt_present = bn_cuda_context_cublaslt(ctx, &lt, &lth, &err) == BN_OK;
    if (!lt_present)
        printf("cuBLASLt unavailable, cublasGemmEx only: %s\n", err.message);

    bn_mixed_matmul *mm = NULL;
    CHECK(bn_mixed_matmul_create(ctx, &mm, &err) == BN_OK);
    bn_mixed_matmul_metrics met;
    bn_mixed_matmul_get_metrics(mm, &met);
    CHECK(met.operations == 0 && met.device_bytes_current == 0 && met.device_bytes_peak == 0);
    bn_perf_stats_reset(bn_cuda_context_stats(ctx));

    /* AUTO's pick on this device. */
    {
        float a = 1.5f, b = -2.0f, c = NAN;
        bn_matmul_run run;
        CHECK(bn_mixed_matmul_run(mm, BN_PRECISION_AUTO, 1, 1, 1, 1.0f, &a, &b, 0.0f, &c, &run,
                                  &err) == BN_OK);
        const bn_precision want = dev->bf16 ? BN_PRECISION_BF16
                                : dev->fp16 ? BN_PRECISION_FP16
                                            : BN_PRECISION_FP32;
        CHECK_MSG(run.precision == want, "auto picked %s", bn_precision_name(run.precision));
        if (dev->cc_major == 9)
            CHECK_MSG(run.precision == BN_PRECISION_BF16, "auto on an H100/H200 picked %s",
                      bn_precision_name(run.precision));
        CHECK(c == -3.0f); /* exact in every precision */
        printf("auto -> %s on %s\n", bn_precision_name(run.precision),
               bn_matmul_engine_name(run.engine));
    }
    bn_mixed_matmul_reset_metrics(mm);
    bn_perf_stats_reset(bn_cuda_context_stats(ctx));

    tally t;
    memset(&t, 0, sizeof t);
    const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 7},       {16, 16, 16},   {8, 1, 64},
                                 {65, 33, 129}, {128, 96, 512},  {1, 4096, 1024},
                                 {256, 256, 1024}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        problem p = make_problem(shapes[s][0], shapes[s][1], shapes[s][2]);
        check_problem(mm, dev, &p, &t);
        if (s == 4)
            check_device_resident(mm, &p, &t);
        free_problem(&p);
    }

    /* Metrics add up: against the tally, and against the context's counters
     * (the matmul is the only user of this context). */
    bn_mixed_matmul_get_metrics(mm, &met);
    uint64_t ops = 0;
    for (int i = 0; i < BN_PRECISION_COUNT; i++) {
        CHECK_MSG(met.operations_by_precision[i] == t.ops[i], "%s: %llu operations, expected %llu",
                  bn_precision_name((bn_precision)i),
                  (unsigned long long)met.operations_by_precision[i], (unsigned long long)t.ops[i]);
        CHECK(met.flops_by_precision[i] == t.flops[i]);
        ops += met.operations_by_precision[i];
        if (t.ops[i] > 0)
            CHECK(met.compute_ms_by_precision[i] > 0 &&
                  met.total_ms_by_precision[i] >= met.compute_ms_by_precision[i] * 0.5);
    }
    CHECK(met.operations_by_precision[BN_PRECISION_AUTO] == 0);
    CHECK(met.operations == ops);
    CHECK(met.cublaslt_runs == t.lt && met.gemm_ex_runs == t.gemm_ex);
    CHECK(met.cublaslt_runs + met.gemm_ex_runs == met.operations);
    CHECK(met.h2d_transfers == t.h2d && met.h2d_bytes == t.h2d_bytes);
    CHECK(met.d2h_transfers == t.d2h && met.d2h_bytes == t.d2h_bytes);
    bn_perf_snapshot snap;
    bn_perf_stats_snapshot(bn_cuda_context_stats(ctx), &snap);
    CHECK(snap.h2d_transfers == met.h2d_transfers && snap.h2d_bytes == met.h2d_bytes);
    CHECK(snap.d2h_transfers == met.d2h_transfers && snap.d2h_bytes == met.d2h_bytes);
    CHECK_MSG(snap.kernel_launches == t.launches, "%llu launches recorded, expected %llu",
              (unsigned long long)snap.kernel_launches, (unsigned long long)t.launches);
    uint64_t ctx_cur = 0, ctx_peak = 0;
    bn_cuda_context_memory(ctx, &ctx_cur, &ctx_peak);
    CHECK(met.device_bytes_current > 0 && met.device_bytes_peak >= met.device_bytes_current);
    CHECK(ctx_cur == met.device_bytes_current);
    printf("metrics: %llu operations (fp32 %llu, fp16 %llu, bf16 %llu; cuBLASLt %llu, GemmEx "
           "%llu), h2d %llu / %llu bytes, d2h %llu / %llu bytes, device memory %llu now, %llu "
           "peak\n",
           (unsigned long long)met.operations,
           (unsigned long long)met.operations_by_precision[BN_PRECISION_FP32],
           (unsigned long long)met.operations_by_precision[BN_PRECISION_FP16],
           (unsigned long long)met.operations_by_precision[BN_PRECISION_BF16],
           (unsigned long long)met.cublaslt_runs, (unsigned long long)met.gemm_ex_runs,
           (unsigned long long)met.h2d_transfers, (unsigned long long)met.h2d_bytes,
           (unsigned long long)met.d2h_transfers, (unsigned long long)met.d2h_bytes,
           (unsigned long long)met.device_bytes_current, (unsigned long long)met.device_bytes_peak);
    for (int i = 1; i < BN_PRECISION_COUNT; i++)
        if (met.operations_by_precision[i])
            printf("  %s: %.3f ms compute, %.3f ms total, %.1f GFLOP/s on the GPU\n",
                   bn_precision_name((bn_precision)i), met.compute_ms_by_precision[i],
                   met.total_ms_by_precision[i],
                   (double)met.flops_by_precision[i] / (met.compute_ms_by_precision[i] * 1e6));

    /* Trim gives every buffer back; the peak stays. */
    const uint64_t peak = met.device_bytes_peak;
    bn_mixed_matmul_trim(mm);
    bn_mixed_matmul_get_metrics(mm, &met);
    CHECK(met.device_bytes_current == 0 && met.device_bytes_peak == peak);
    bn_cuda_context_memory(ctx, &ctx_cur, &ctx_peak);
    CHECK(ctx_cur == 0);

    /* Bad arguments and unsupported precisions run nothing. */
    float one = 1.0f, out = 0.0f;
    CHECK(bn_mixed_matmul_run(mm, BN_PRECISION_FP32, 0, 1, 1, 1.0f, &one, &one, 0.0f, &out, NULL,
                              &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_mixed_matmul_run(mm, BN_PRECISION_FP32, 1, 1, (int64_t)1 << 32, 1.0f, &one, &one, 0.0f,
                              &out, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_mixed_matmul_run(mm, (bn_precision)42, 1, 1, 1, 1.0f, &one, &one, 0.0f, &out, NULL,
                              &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_mixed_matmul_run(mm, BN_PRECISION_FP32, 1, 1, 1, 1.0f, NULL, &one, 0.0f, &out, NULL,
                              &err) == BN_ERR_INVALID_ARGUMENT);
    if (!dev->bf16) {
        CHECK(bn_mixed_matmul_run(mm, BN_PRECISION_BF16, 1, 1, 1, 1.0f, &one, &one, 0.0f, &out,
                                  NULL, &err) == BN_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(err.message, "8.0");
    }

    /* Out of device memory: a 2^20 cube needs terabytes of buffers. The
     * first upload buffer fails before any host memory is read, so small
     * host arrays stand in. Afterwards the matmul and context still work. */
    bn_mixed_matmul_get_metrics(mm, &met);
    const uint64_t ops_before = met.operations;
    bn_error_clear(&err);
    const int64_t huge = (int64_t)1 << 20;
    const bn_status st = bn_mixed_matmul_run(mm, BN_PRECISION_AUTO, huge, huge, huge, 1.0f, &one,
                                             &one, 0.0f, &out, NULL, &err);
    CHECK_MSG(st == BN_ERR_GPU_OUT_OF_MEMORY, "huge matmul: %s: %s", bn_status_str(st),
              err.message);
    CHECK_STR_CONTAINS(err.hint, "reduce the batch size or the context length");
    printf("huge matmul: %s (hint: %s)\n", err.message, err.hint);
    CHECK(cudaGetLastError() == cudaSuccess);
    bn_mixed_matmul_get_metrics(mm, &met);
    CHECK(met.operations == ops_before);
    {
        problem p = make_problem(32, 48, 64);
        float *c = malloc(sizeof(float) * 32 * 48);
        bn_matmul_run run;
        CHECK(bn_mixed_matmul_run(mm, BN_PRECISION_FP32, 32, 48, 64, 1.0f, p.a, p.b, 0.0f, c,
                                  &run, &err) == BN_OK);
        CHECK(max_error(&p, c, 1.0f, 0.0f) <= 1e-5);
        free(c);
        free_problem(&p);
    }

    bn_mixed_matmul_destroy(mm);
    bn_cuda_context_memory(ctx, &ctx_cur, &ctx_peak);
    CHECK(ctx_cur == 0);
    bn_cuda_context_destroy(ctx);
    TEST_EXIT();
}
