/* GPU test: the per-device CUDA context - create/destroy twice, both streams,
 * the statistics, memory through the context's pool, an impossible
 * allocation (out of memory with the hint, context still usable); the pool
 * itself has test_cuda_pool. The error mapping is checked first,
 * without a GPU; the rest exits 77 when no GPU is usable. */
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

    /* The value form passes success through untouched. */
    bn_error_clear(&e);
    CHECK(BN_CUDA_STATUS(&e, cudaSuccess) == BN_OK);
    CHECK(e.status == BN_OK && e.message[0] == '\0');
}

/* ---- on the GPU ---------------------------------------------------------------- */

static void exercise(bn_cuda_context *ctx, int round)
{
    bn_error err;
    const bn_cuda_device *dev = bn_cuda_context_device(ctx);
    CHECK(dev->name[0] != '\0');
    CHECK(dev->cc_major >= 3);
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

    /* The memory works: a round trip through the device. */
    unsigned char *host = malloc(bytes), *back = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        host[i] = (unsigned char)test_rand_u64();
    memset(back, 0xee, bytes);
    CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(back, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(host, back, bytes) == 0);

    /* The streams are the context's: the copy stream sees the compute
     * stream's memset once an event orders them. */
    CHECK(cudaMemsetAsync(d, 0x5a, bytes, compute) == cudaSuccess);
    cudaEvent_t ev = NULL;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventRecord(ev, compute) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(copy, ev, 0) == cudaSuccess);
    CHECK(cudaMemcpyAsync(back, d, bytes, cudaMemcpyDeviceToHost, copy) == cudaSuccess);
    CHECK(cudaStreamSynchronize(copy) == cudaSuccess);
    CHECK(cudaEventDestroy(ev) == cudaSuccess);
    bool all = true;
    for (size_t i = 0; i < bytes; i++)
        all = all && back[i] == 0x5a;
    CHECK_MSG(all, "the copy stream did not see the compute stream's memset");

    /* The statistics count what their user records. */
    bn_perf_record_kernels(stats, 2);
    bn_perf_record_h2d(stats, bytes);
    bn_perf_record_d2h(stats, bytes / 2);
    bn_perf_stats_snapshot(stats, &snap);
    CHECK(snap.kernel_launches == 2 && snap.h2d_transfers == 1 && snap.h2d_bytes == bytes);
    CHECK(snap.d2h_transfers == 1 && snap.d2h_bytes == bytes / 2);

    /* An impossible allocation: out of memory with the hint and the sizes,
     * and afterwards the context works and no stale error is left behind. */
    void *huge = (void *)&huge;
    bn_error_clear(&err);
    const bn_status st = bn_cuda_context_alloc(ctx, (size_t)1 << 50, &huge, &err);
    CHECK_MSG(st == BN_ERR_GPU_OUT_OF_MEMORY, "got %s: %s", bn_status_str(st), err.message);
    CHECK(huge == NULL);
    CHECK_STR_CONTAINS(err.hint, "reduce the batch size or the context length");
    CHECK_STR_CONTAINS(err.message, "cannot allocate 1048576.00 GiB (1125899906842624 bytes) for "
                                    "unnamed");
    CHECK_STR_CONTAINS(err.message, "MiB free on the device");
    printf("round %d: impossible allocation: %s (hint: %s)\n", round, err.message, err.hint);
    CHECK(cudaGetLastError() == cudaSuccess);
    bn_cuda_context_memory(ctx, &cur, &peak);
    CHECK(cur == bytes);
    memset(back, 0, bytes);
    CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(back, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(host, back, bytes) == 0);
    CHECK(cudaMemsetAsync(d, 0, bytes, compute) == cudaSuccess);
    CHECK(cudaStreamSynchronize(compute) == cudaSuccess);

    bn_cuda_context_free(ctx, d, bytes);
    bn_cuda_context_memory(ctx, &cur, &peak);
    CHECK(cur == 0 && peak == 4 * bytes);
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
