/* GPU test: the per-device CUDA context - create/destroy twice, both streams,
 * the event pool and the timing helper, copy helpers and their statistics,
 * tracked memory, an impossible allocation (out of memory with the hint,
 * context still usable), lazy cuBLAS/cuBLASLt handles. The error mapping
 * is checked first, without a GPU; the rest exits 77 when no GPU is usable. */
#include <cuda_runtime_api.h>

#include "cuda_context.h"
#include "perf_stats.h"
#include "test_util.h"

/* ---- the checking path (no GPU needed) ------------------------------------ */

static void check_error_mapping(void)
{
    bn_error e;

    CHECK(bn_cuda_fail(&e, cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "f.c", 12) ==
          BN_ERR_GPU_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(e.message, "cudaMalloc(&p, n)");
    CHECK_STR_CONTAINS(e.message, "f.c:12");
    CHECK_STR_CONTAINS(e.hint, "reduce the batch size or the context length");

    CHECK(bn_cuda_fail(&e, cudaErrorInvalidConfiguration, "kernel<<<>>>", "f.c", 1) ==
          BN_ERR_GPU);
    CHECK_STR_CONTAINS(e.hint, "launch parameters");

    /* Driver/runtime mismatches name the versions found. */
    CHECK(bn_cuda_fail(&e, cudaErrorInsufficientDriver, "cudaFree(0)", "f.c", 1) ==
          BN_ERR_DRIVER);
    CHECK_STR_CONTAINS(e.message, "runtime is ");
    CHECK_STR_CONTAINS(e.hint, "driver");
    bn_cuda_fail(&e, cudaErrorSystemDriverMismatch, "cudaFree(0)", "f.c", 1);
    CHECK_STR_CONTAINS(e.message, "runtime is");
    CHECK_STR_CONTAINS(e.hint, "kernel module");
    bn_cuda_fail(&e, cudaErrorUnsupportedPtxVersion, "cudaLaunchKernel", "f.c", 1);
    CHECK(e.status == BN_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(e.message, "runtime is");

    char versions[128];
    bn_cuda_versions_describe(versions, sizeof versions);
    CHECK_STR_CONTAINS(versions, "runtime is");

    /* cuBLAS statuses. */
    CHECK(bn_cublas_fail(&e, CUBLAS_STATUS_ALLOC_FAILED, "cublasCreate", "f.c", 3) ==
          BN_ERR_GPU_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(e.hint, "reduce the batch size");
    CHECK_STR_CONTAINS(e.message, "CUBLAS_STATUS_ALLOC_FAILED");
    CHECK(bn_cublas_fail(&e, CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate", "f.c", 3) ==
          BN_ERR_GPU);
    CHECK_STR_CONTAINS(e.message, "runtime is");
    CHECK_STR_CONTAINS(e.hint, "driver");
    CHECK(bn_cublas_fail(&e, CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul", "f.c", 3) ==
          BN_ERR_UNSUPPORTED);
    CHECK(bn_cublas_fail(&e, CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx", "f.c", 3) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cublas_fail(NULL, CUBLAS_STATUS_EXECUTION_FAILED, "x", "f.c", 3) == BN_ERR_GPU);

    /* The value forms pass success through untouched. */
    bn_error_clear(&e);
    CHECK(BN_CUDA_STATUS(&e, cudaSuccess) == BN_OK);
    CHECK(BN_CUBLAS_STATUS(&e, CUBLAS_STATUS_SUCCESS) == BN_OK);
    CHECK(e.status == BN_OK && e.message[0] == '\0');
}

/* ---- on the GPU ---------------------------------------------------------------- */

typedef struct fill_job {
    void *ptr;
    size_t bytes;
    int rounds;
} fill_job;

static bn_status fill(void *user, cudaStream_t stream, bn_error *err)
{
    const fill_job *job = user;
    for (int i = 0; i < job->rounds; i++)
        BN_CUDA_TRY(err, cudaMemsetAsync(job->ptr, i & 0xff, job->bytes, stream));
    return BN_OK;
}

typedef struct counted_job {
    bn_cuda_context *ctx;
    fill_job fill;
} counted_job;

/* Two "kernels" that record their own launches, as launchers do. */
static bn_status fill_counted(void *user, cudaStream_t stream, bn_error *err)
{
    counted_job *job = user;
    for (int i = 0; i < 2; i++) {
        const bn_status st = fill(&job->fill, stream, err);
        if (st != BN_OK)
            return st;
        bn_cuda_context_record_launch(job->ctx, 123456789); /* time ignored in a region */
    }
    return BN_OK;
}

static bn_status failing(void *user, cudaStream_t stream, bn_error *err)
{
    (void)user;
    (void)stream;
    return bn_error_set(err, BN_ERR_INTERNAL, NULL, "enqueue failed on purpose");
}

static void exercise(bn_cuda_context *ctx, int round)
{
    bn_error err;
    const bn_cuda_device *dev = bn_cuda_context_device(ctx);
    CHECK(dev->name[0] != '\0');
    CHECK(dev->cc_major >= 3);
    CHECK(bn_cuda_context_device_id(ctx) == 0);
    int driver = 0, runtime = 0;
    bn_cuda_context_versions(ctx, &driver, &runtime);
    CHECK(driver >= runtime && runtime > 0);
    cudaStream_t compute = bn_cuda_context_compute_stream(ctx);
    cudaStream_t copy = bn_cuda_context_copy_stream(ctx);
    CHECK(compute && copy && compute != copy);
    unsigned flags = 0;
    CHECK(cudaStreamGetFlags(compute, &flags) == cudaSuccess && flags == cudaStreamNonBlocking);
    CHECK(cudaStreamGetFlags(copy, &flags) == cudaSuccess && flags == cudaStreamNonBlocking);

    bn_perf_stats *stats = bn_cuda_context_stats(ctx);
    CHECK(stats != NULL);
    bn_perf_snapshot snap;
    bn_perf_stats_snapshot(stats, &snap);
    CHECK(snap.kernel_launches == 0 && snap.h2d_transfers == 0 && snap.d2h_transfers == 0);

    /* Tracked memory. */
    const size_t bytes = (size_t)1 << 20;
    void *d = NULL, *d2 = NULL;
    CHECK(bn_cuda_context_alloc(ctx, bytes, &d, &err) == BN_OK && d);
    CHECK(bn_cuda_context_alloc(ctx, 3 * bytes, &d2, &err) == BN_OK && d2);
    uint64_t cur = 0, peak = 0;
    bn_cuda_context_memory(ctx, &cur, &peak);
    CHECK(cur == 4 * bytes && peak == 4 * bytes);
    bn_cuda_context_free(ctx, d2, 3 * bytes);
    bn_cuda_context_memory(ctx, &cur, &peak);
    CHECK(cur == bytes && peak == 4 * bytes);

    /* Copy helpers: a round trip through the device, counted. */
    unsigned char *host = malloc(bytes), *back = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        host[i] = (unsigned char)test_rand_u64();
    memset(back, 0xee, bytes);
    CHECK(bn_cuda_context_upload(ctx, d, host, bytes, &err) == BN_OK);
    CHECK(bn_cuda_context_download(ctx, back, d, bytes, &err) == BN_OK);
    CHECK(memcmp(host, back, bytes) == 0);
    bn_perf_stats_snapshot(stats, &snap);
    CHECK(snap.h2d_transfers == 1 && snap.h2d_bytes == bytes);
    CHECK(snap.d2h_transfers == 1 && snap.d2h_bytes == bytes);
    CHECK(bn_cuda_context_upload(ctx, d, host, 0, &err) == BN_OK); /* nothing to count */
    CHECK(bn_cuda_context_upload(ctx, NULL, host, 8, &err) == BN_ERR_INVALID_ARGUMENT);

    /* Streams: memset on compute, then the copy stream waits for it and
     * downloads (async form), then the compute stream is used for an
     * async upload. */
    CHECK(cudaMemsetAsync(d, 0x5a, bytes, compute) == cudaSuccess);
    CHECK(bn_cuda_context_stream_wait(ctx, copy, compute, &err) == BN_OK);
    CHECK(bn_cuda_context_download_async(ctx, back, d, bytes, copy, &err) == BN_OK);
    CHECK(cudaStreamSynchronize(copy) == cudaSuccess);
    bool all = true;
    for (size_t i = 0; i < bytes; i++)
        all = all && back[i] == 0x5a;
    CHECK_MSG(all, "the copy stream did not see the compute stream's memset");
    CHECK(bn_cuda_context_upload_async(ctx, d, host, bytes / 2, compute, &err) == BN_OK);
    CHECK(bn_cuda_context_synchronize(ctx, &err) == BN_OK);
    bn_perf_stats_snapshot(stats, &snap);
    CHECK(snap.h2d_transfers == 2 && snap.h2d_bytes == bytes + bytes / 2);
    CHECK(snap.d2h_transfers == 2 && snap.d2h_bytes == 2 * bytes);

    /* Event pool: more than the first pool size, then reuse. */
    cudaEvent_t events[20];
    for (int i = 0; i < 20; i++)
        CHECK(bn_cuda_context_event_acquire(ctx, &events[i], &err) == BN_OK);
    for (int i = 0; i < 20; i++)
        bn_cuda_context_event_release(ctx, events[i]);
    cudaEvent_t again;
    CHECK(bn_cuda_context_event_acquire(ctx, &again, &err) == BN_OK);
    bool reused = false;
    for (int i = 0; i < 20; i++)
        reused = reused || events[i] == again;
    CHECK_MSG(reused, "the event pool did not hand back a released event");
    bn_cuda_context_event_release(ctx, again);

    /* Timing: a few hundred MiB of memset takes well over a microsecond. */
    const size_t big = (size_t)64 << 20;
    void *dbig = NULL;
    CHECK(bn_cuda_context_alloc(ctx, big, &dbig, &err) == BN_OK);
    fill_job job = {dbig, big, 4};
    double ms = -1.0;
    CHECK(bn_cuda_context_time(ctx, NULL, fill, &job, &ms, &err) == BN_OK);
    CHECK_MSG(ms > 0.0, "timed %f ms", ms);
    printf("round %d: 4 x 64 MiB memset took %.3f ms\n", round, ms);
    bn_perf_stats_snapshot(stats, &snap);
    CHECK(snap.kernel_launches == 1 && snap.kernel_time_ns > 0);
    CHECK(bn_cuda_context_time(ctx, copy, fill, &job, &ms, &err) == BN_OK);
    /* A failing enqueue returns its error, and nothing is counted. */
    CHECK(bn_cuda_context_time(ctx, NULL, failing, NULL, &ms, &err) == BN_ERR_INTERNAL);
    bn_perf_stats_snapshot(stats, &snap);
    CHECK(snap.kernel_launches == 2);
    /* Launches recorded inside a timed region count, their time does not
     * (the region's does, once). */
    const uint64_t time_before = snap.kernel_time_ns;
    counted_job cj = {ctx, {dbig, big, 1}};
    CHECK(bn_cuda_context_time(ctx, NULL, fill_counted, &cj, &ms, &err) == BN_OK);
    bn_perf_stats_snapshot(stats, &snap);
    CHECK(snap.kernel_launches == 4);
    CHECK(snap.kernel_time_ns - time_before < 123456789);
    /* Outside a region the time counts. */
    bn_cuda_context_record_launch(ctx, 1000);
    bn_perf_stats_snapshot(stats, &snap);
    CHECK(snap.kernel_launches == 5);
    char line[256];
    bn_perf_snapshot_format(&snap, line, sizeof line);
    printf("round %d: %s\n", round, line);
    bn_cuda_context_free(ctx, dbig, big);

    /* An impossible allocation: out of memory with the hint and the sizes,
     * and afterwards the context works and no stale error is left behind. */
    void *huge = (void *)&huge;
    bn_error_clear(&err);
    const bn_status st = bn_cuda_context_alloc(ctx, (size_t)1 << 50, &huge, &err);
    CHECK_MSG(st == BN_ERR_GPU_OUT_OF_MEMORY, "got %s: %s", bn_status_str(st), err.message);
    CHECK(huge == NULL);
    CHECK_STR_CONTAINS(err.hint, "reduce the batch size or the context length");
    CHECK_STR_CONTAINS(err.message, "asked for");
    CHECK_STR_CONTAINS(err.message, "MiB free");
    printf("round %d: impossible allocation: %s (hint: %s)\n", round, err.message, err.hint);
    CHECK(cudaGetLastError() == cudaSuccess);
    bn_cuda_context_memory(ctx, &cur, &peak);
    CHECK(cur == bytes);
    memset(back, 0, bytes);
    CHECK(bn_cuda_context_upload(ctx, d, host, bytes, &err) == BN_OK);
    CHECK(bn_cuda_context_download(ctx, back, d, bytes, &err) == BN_OK);
    CHECK(memcmp(host, back, bytes) == 0);
    CHECK(cudaMemsetAsync(d, 0, bytes, compute) == cudaSuccess);
    CHECK(bn_cuda_context_synchronize(ctx, &err) == BN_OK);

    /* Lazy library handles: the same handle every time. */
    const bn_cublas *cublas = NULL;
    cublasHandle_t h1 = NULL, h2 = NULL;
    bn_status cst = bn_cuda_context_cublas(ctx, &cublas, &h1, &err);
    if (cst == BN_ERR_UNSUPPORTED) {
        printf("cuBLAS not installed: %s\n", err.message);
        CHECK_STR_CONTAINS(err.message, "libcublas");
    } else {
        CHECK_MSG(cst == BN_OK, "%s", err.message);
        CHECK(bn_cuda_context_cublas(ctx, &cublas, &h2, &err) == BN_OK && h1 == h2 && h1);
    }
    const bn_cublaslt *lt = NULL;
    cublasLtHandle_t l1 = NULL, l2 = NULL;
    cst = bn_cuda_context_cublaslt(ctx, &lt, &l1, &err);
    if (cst == BN_ERR_UNSUPPORTED) {
        printf("cuBLASLt not installed: %s\n", err.message);
        CHECK_STR_CONTAINS(err.message, "libcublasLt");
    } else {
        CHECK_MSG(cst == BN_OK, "%s", err.message);
        CHECK(bn_cuda_context_cublaslt(ctx, &lt, &l2, &err) == BN_OK && l1 == l2 && l1);
        CHECK(lt->get_version() > 0);
    }

    bn_cuda_context_free(ctx, d, bytes);
    bn_cuda_context_memory(ctx, &cur, &peak);
    CHECK(cur == 0 && peak == bytes + big);
    free(host);
    free(back);
}

int main(void)
{
    check_error_mapping();

    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        if (test_failures)
            TEST_EXIT();
        TEST_SKIP("no usable CUDA device (see 'bitnet devices'); the error mapping passed "
                  "(%d checks)",
                  test_checks);
    }
    test_seed_init();

    bn_error err;
    bn_cuda_context *ctx = NULL;
    CHECK(bn_cuda_context_create(count, &ctx, &err) == BN_ERR_NO_DEVICE && ctx == NULL);
    CHECK_STR_CONTAINS(err.hint, "bitnet devices");
    CHECK(bn_cuda_context_create(-1, &ctx, &err) == BN_ERR_NO_DEVICE);
    CHECK(bn_cuda_context_create(0, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    bn_cuda_context_destroy(NULL);

    /* Twice: everything a context makes must go away with it. */
    for (int round = 0; round < 2; round++) {
        bn_status st = bn_cuda_context_create(0, &ctx, &err);
        CHECK_MSG(st == BN_OK, "create: %s (%s)", err.message, err.hint);
        if (st != BN_OK)
            break;
        if (round == 0)
            printf("device 0: %s, cc %d.%d\n", bn_cuda_context_device(ctx)->name,
                   bn_cuda_context_device(ctx)->cc_major, bn_cuda_context_device(ctx)->cc_minor);
        exercise(ctx, round);
        bn_cuda_context_destroy(ctx);
        ctx = NULL;
    }

    /* Two contexts on one device at once share the primary context. */
    bn_cuda_context *a = NULL, *b = NULL;
    CHECK(bn_cuda_context_create(0, &a, &err) == BN_OK);
    CHECK(bn_cuda_context_create(0, &b, &err) == BN_OK);
    if (a && b)
        CHECK(bn_cuda_context_compute_stream(a) != bn_cuda_context_compute_stream(b));
    bn_cuda_context_destroy(a);
    bn_cuda_context_destroy(b);
    TEST_EXIT();
}
