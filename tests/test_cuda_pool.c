/* GPU test: the CUDA context's memory pool on a real device, through the
 * calls the backend makes (bn_cuda_context_alloc_for / _free): device (not
 * managed) memory that works, blocks of one size reused without cudaMalloc,
 * the statistics, the memory limit refusing with a clear error, out of
 * memory from cudaMalloc (kept buffers released, the error naming the
 * request and the device's free memory, the process still usable), and the
 * leak report when the context goes. Exits 77 (skipped) with the reason
 * when no CUDA device is usable. */
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <stdint.h>
#include <unistd.h>

#include "bitnet.h"
#include "cuda_context.h"
#include "test_util.h"

#define MIB (1ull << 20)

/* cudaMemset the buffer to `byte`, copy it back and check every byte. */
static bool fill_and_check(void *dev, size_t bytes, unsigned char byte)
{
    unsigned char *host = malloc(bytes);
    if (!host)
        return false;
    memset(host, (unsigned char)~byte, bytes); /* poisoned: a copy that did nothing fails */
    bool ok = cudaMemset(dev, byte, bytes) == cudaSuccess &&
              cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (size_t i = 0; ok && i < bytes; i++)
        ok = host[i] == byte;
    free(host);
    return ok;
}

static bn_memory_pool_stats stats_of(bn_cuda_context *ctx)
{
    bn_memory_pool_stats s;
    bn_cuda_context_pool_stats(ctx, &s);
    return s;
}

/* Is this address a live device allocation of the runtime? */
static bool is_device_memory(const void *p)
{
    struct cudaPointerAttributes attr;
    const cudaError_t e = cudaPointerGetAttributes(&attr, p);
    (void)cudaGetLastError(); /* an older runtime reports an unknown address as an error */
    return e == cudaSuccess && attr.type == cudaMemoryTypeDevice;
}

static void test_blocks(bn_cuda_context *ctx, int device)
{
    bn_error err;
    const size_t bytes = MIB + 123;
    void *p = NULL;
    bn_status st = bn_cuda_context_alloc_for(ctx, bytes, "test buffer", &p, &err);
    CHECK_MSG(st == BN_OK && p, "allocate: %s", err.message);
    if (!p)
        return;
    struct cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice && attr.device == device); /* never managed */
    CHECK(((uintptr_t)p % 256) == 0);
    CHECK(fill_and_check(p, bytes, 0xab));
    bn_memory_pool_stats s = stats_of(ctx);
    CHECK(s.bytes_in_use == bytes && s.bytes_reserved == bytes && s.allocations == 1);

    /* Given back, it serves the next request of its size, still usable. */
    bn_cuda_context_free(ctx, p, bytes);
    void *q = NULL;
    CHECK(bn_cuda_context_alloc_for(ctx, bytes, "again", &q, &err) == BN_OK && q == p);
    CHECK(fill_and_check(q, bytes, 0x5c));
    s = stats_of(ctx);
    CHECK(s.reuses == 1 && s.allocations == 2 && s.frees == 1 && s.bytes_in_use == bytes);
    bn_cuda_context_free(ctx, q, bytes);

    /* Fixed-size blocks handed out and returned many times: after the first
     * round no cudaMalloc, so the reserved bytes never grow. */
    enum { BLOCKS = 64 };
    const size_t block = 16 * 2 * 5 * 128 * 2; /* 16 positions of K and V, 5 heads, f16 */
    void *held[BLOCKS] = {0};
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < BLOCKS; i++)
            CHECK(bn_cuda_context_alloc_for(ctx, block, "kv block", &held[i], &err) == BN_OK);
        if (round == 0)
            for (int i = 0; i < BLOCKS; i++)
                CHECK(held[i] && fill_and_check(held[i], block, (unsigned char)i));
        for (int i = BLOCKS; i-- > 0;)
            bn_cuda_context_free(ctx, held[i], block);
    }
    s = stats_of(ctx);
    CHECK(s.bytes_in_use == 0 && s.bytes_reserved == bytes + BLOCKS * block);
    CHECK(s.reuses == 1 + 49 * BLOCKS && s.failures == 0);
    CHECK(cudaGetLastError() == cudaSuccess);
}

static void test_limit(bn_cuda_context *ctx)
{
    bn_error err;
    const bn_memory_pool_stats before = stats_of(ctx);
    bn_cuda_context_set_memory_limit(ctx, 64 * MIB);
    bn_memory_pool_stats s = stats_of(ctx);
    CHECK(s.memory_limit == 64 * MIB && s.bytes_reserved <= 64 * MIB);

    void *a = NULL, *b = (void *)&b;
    CHECK(bn_cuda_context_alloc_for(ctx, 48 * MIB, "weights", &a, &err) == BN_OK && a);
    bn_status st = bn_cuda_context_alloc_for(ctx, 32 * MIB, "kv cache", &b, &err);
    CHECK(st == BN_ERR_GPU_OUT_OF_MEMORY && b == NULL);
    CHECK_STR_CONTAINS(err.message, "cannot allocate 32.0 MiB (33554432 bytes) for kv cache");
    CHECK_STR_CONTAINS(err.message, "48.0 MiB in use and the memory limit is 64.0 MiB");
    CHECK_STR_CONTAINS(err.hint, "BITNET_MEMORY_LIMIT");
    printf("over the limit: %s (hint: %s)\n", err.message, err.hint);
    CHECK(cudaGetLastError() == cudaSuccess);
    s = stats_of(ctx);
    CHECK(s.failures == before.failures + 1 && s.bytes_in_use == 48 * MIB);
    if (a)
        bn_cuda_context_free(ctx, a, 48 * MIB);
    bn_cuda_context_set_memory_limit(ctx, 0);
    CHECK(stats_of(ctx).memory_limit == 0);
}

static void test_out_of_memory(bn_cuda_context *ctx)
{
    bn_error err;
    /* A buffer kept after its free, then an impossible size: the pool
     * releases what it keeps, retries once, and reports out of memory. */
    void *big = NULL;
    CHECK(bn_cuda_context_alloc_for(ctx, 256 * MIB, "big", &big, &err) == BN_OK && big);
    if (big) {
        CHECK(fill_and_check(big, 256 * MIB, 0x11));
        bn_cuda_context_free(ctx, big, 256 * MIB);
    }
    CHECK(stats_of(ctx).buffers_kept > 0);

    void *huge = (void *)&huge;
    const bn_status st = bn_cuda_context_alloc_for(ctx, (size_t)1 << 50, "huge", &huge, &err);
    CHECK_MSG(st == BN_ERR_GPU_OUT_OF_MEMORY, "1 PiB gave %s: %s", bn_status_str(st),
              err.message);
    CHECK(huge == NULL);
    CHECK_STR_CONTAINS(err.message, "cannot allocate 1048576.00 GiB (1125899906842624 bytes) "
                                    "for huge with 0 bytes in use");
    CHECK_STR_CONTAINS(err.message, "cudaMalloc");
    CHECK_STR_CONTAINS(err.message, "MiB free on the device");
    CHECK_STR_CONTAINS(err.hint, "reduce the batch size or the context length");
    printf("out of memory as expected: %s (hint: %s)\n", err.message, err.hint);
    const bn_memory_pool_stats s = stats_of(ctx);
    CHECK(s.buffers_kept == 0 && s.bytes_reserved == 0);
    /* The released buffer really went back to the device. */
    if (big)
        CHECK_MSG(!is_device_memory(big), "the released 256 MiB buffer is still allocated");

    /* No sticky error; new buffers work. */
    CHECK(cudaGetLastError() == cudaSuccess);
    void *r = NULL;
    CHECK(bn_cuda_context_alloc_for(ctx, 4 * MIB, "after", &r, &err) == BN_OK && r);
    if (r) {
        CHECK(fill_and_check(r, 4 * MIB, 0x77));
        bn_cuda_context_free(ctx, r, 4 * MIB);
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

/* A buffer left allocated is named when the context goes, and freed. */
static void test_leak_report(int device)
{
    bn_error err;
    bn_cuda_context *ctx = NULL;
    CHECK(bn_cuda_context_create(device, &ctx, &err) == BN_OK);
    if (!ctx)
        return;
    void *leaked = NULL;
    CHECK(bn_cuda_context_alloc_for(ctx, 3 * MIB, "forgotten scratch", &leaked, &err) == BN_OK);

    fflush(stderr);
    FILE *tmp = tmpfile();
    const int saved = dup(2);
    if (tmp)
        dup2(fileno(tmp), 2);
    bn_cuda_context_destroy(ctx);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char text[4096] = {0};
    if (tmp) {
        rewind(tmp);
        size_t n = fread(text, 1, sizeof text - 1, tmp);
        text[n] = '\0';
        fclose(tmp);
    }
    printf("leak report:\n%s", text);
    char want[128];
    snprintf(want, sizeof want, "CUDA device %d: 1 buffer (3.0 MiB) still allocated", device);
    CHECK_STR_CONTAINS(text, want);
    snprintf(want, sizeof want, "forgotten scratch: 3.0 MiB (3145728 bytes) at %p", leaked);
    CHECK_STR_CONTAINS(text, want);
    if (leaked)
        CHECK_MSG(!is_device_memory(leaked), "the leaked buffer was not freed");
}

int main(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        TEST_SKIP("no usable CUDA device (see 'bitnet devices')");
    }
    bn_error err;
    bn_cuda_context *ctx = NULL;
    bn_status st = bn_cuda_context_create(0, &ctx, &err);
    CHECK_MSG(st == BN_OK, "create: %s (%s)", err.message, err.hint);
    if (st != BN_OK)
        TEST_EXIT();
    const bn_cuda_device *d = bn_cuda_context_device(ctx);
    printf("device cuda:0 %s, %.0f MiB\n", d->name, (double)d->total_memory_bytes / (double)MIB);

    test_blocks(ctx, 0);
    test_limit(ctx);
    test_out_of_memory(ctx);

    bn_memory_pool_stats s = stats_of(ctx);
    char line[256];
    bn_memory_pool_stats_format(&s, line, sizeof line);
    printf("pool: %s\n", line);
    CHECK(s.bytes_in_use == 0 && s.allocations == s.frees);
    bn_cuda_context_destroy(ctx);
    CHECK(cudaGetLastError() == cudaSuccess);

    test_leak_report(0);
    TEST_EXIT();
}
