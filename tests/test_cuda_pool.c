/* GPU test: the memory pool on a real device through the cudaMalloc
 * allocator: allocate, write, read back, free, reuse from the cache, an
 * impossible size that must fail cleanly, and the device still working
 * afterwards. Exits 77 (skipped) with the reason when no CUDA device is
 * usable. */
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <stdint.h>

#include "bitnet.h"
#include "cuda_allocator.h"
#include "memory_pool.h"
#include "test_util.h"

#define MIB (1ull << 20)

static bn_cuda_report report;

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

int main(void)
{
    bn_cuda_query(&report);
    if (!report.compiled)
        TEST_SKIP("this build has no CUDA support (configure with -DBITNET_CUDA=ON)");
    if (report.status != BN_OK || report.device_count == 0)
        TEST_SKIP("no usable CUDA device: %s", report.reason[0] ? report.reason : "none found");
    const int best = bn_cuda_best_device(report.devices, report.device_count);
    const bn_cuda_device *d = &report.devices[best];
    printf("device cuda:%d %s, %.0f MiB\n", d->id, d->name,
           (double)d->total_memory_bytes / (double)MIB);

    bn_error err;
    bn_pool_allocator a;
    CHECK(bn_cuda_allocator_init(report.device_count, &a, &err) == BN_ERR_NO_DEVICE);
    CHECK(bn_cuda_allocator_init(-1, &a, &err) == BN_ERR_NO_DEVICE);

    bn_memory_pool_config cfg;
    bn_memory_pool_config_defaults(&cfg);
    cfg.device_id = d->id;
    bn_memory_pool *pool = NULL;
    bn_status st = bn_cuda_memory_pool_create(&cfg, &pool, &err);
    CHECK_MSG(st == BN_OK && pool, "create: %s (%s)", err.message, err.hint);
    if (!pool)
        TEST_EXIT();
    CHECK(bn_memory_pool_device_id(pool) == d->id);

    /* Allocate, write, read back. */
    const size_t bytes = MIB + 123;
    void *p = NULL;
    st = bn_memory_pool_allocate(pool, bytes, &p, &err);
    CHECK_MSG(st == BN_OK && p, "allocate: %s", err.message);
    struct cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice && attr.device == d->id); /* never managed */
    CHECK(((uintptr_t)p % 256) == 0);
    CHECK(fill_and_check(p, bytes, 0xab));

    /* Free, reuse: the same buffer comes back from the cache, still usable. */
    CHECK(bn_memory_pool_deallocate(pool, p, &err) == BN_OK);
    void *q = NULL;
    CHECK(bn_memory_pool_allocate(pool, bytes - 100, &q, &err) == BN_OK); /* same class */
    CHECK(q == p);
    CHECK(fill_and_check(q, bytes - 100, 0x5c));
    bn_memory_pool_stats s;
    bn_memory_pool_get_stats(pool, &s);
    CHECK(s.cache_hits == 1 && s.cache_misses == 1 && s.device_allocs == 1);
    CHECK(s.bytes_in_use == bn_memory_pool_class_size(bytes));

    /* A double free is refused and changes nothing. */
    CHECK(bn_memory_pool_deallocate(pool, q, &err) == BN_OK);
    CHECK(bn_memory_pool_deallocate(pool, q, &err) == BN_ERR_INVALID_ARGUMENT);

    /* A big buffer, cached on free, then an impossible size: the pool must
     * free its cache, retry once, and report out-of-memory with a hint. */
    void *big = NULL;
    st = bn_memory_pool_allocate(pool, 256 * MIB, &big, &err);
    CHECK_MSG(st == BN_OK && big, "allocate 256 MiB: %s", err.message);
    if (big) {
        CHECK(fill_and_check(big, 256 * MIB, 0x11));
        CHECK(bn_memory_pool_deallocate(pool, big, &err) == BN_OK);
    }
    bn_memory_pool_get_stats(pool, &s);
    CHECK(s.bytes_cached >= 256 * MIB);

    void *huge = (void *)&huge;
    st = bn_memory_pool_allocate(pool, 1ull << 50, &huge, &err); /* 1 PiB */
    CHECK_MSG(st == BN_ERR_GPU_OUT_OF_MEMORY, "1 PiB gave %s: %s", bn_status_str(st),
              err.message);
    CHECK(huge == NULL);
    CHECK_STR_CONTAINS(err.hint, "reduce batch size or context length");
    printf("out of memory as expected: %s\n", err.message);
    bn_memory_pool_get_stats(pool, &s);
    CHECK(s.bytes_cached == 0 && s.buffers_cached == 0 && s.failed_allocations == 1);
    /* The flushed cache really went back to the device: the runtime no
     * longer knows the big buffer's address. (Free memory from
     * cudaMemGetInfo is device-wide, so other processes on the GPU, such as
     * tests run in parallel, would make a before/after comparison flaky.) */
    if (big) {
        struct cudaPointerAttributes gone;
        const cudaError_t e = cudaPointerGetAttributes(&gone, big);
        CHECK_MSG(e != cudaSuccess || gone.type == cudaMemoryTypeUnregistered,
                  "the flushed 256 MiB buffer is still a device allocation (type %d)",
                  (int)gone.type);
        (void)cudaGetLastError(); /* an older runtime reports the address as an error */
    }

    /* The process is still usable: no sticky error, new buffers work. */
    CHECK(cudaGetLastError() == cudaSuccess);
    void *r = NULL;
    CHECK(bn_memory_pool_allocate(pool, 4 * MIB, &r, &err) == BN_OK && r);
    if (r)
        CHECK(fill_and_check(r, 4 * MIB, 0x77));
    CHECK(cudaDeviceSynchronize() == cudaSuccess);

    /* The live buffer shows up in a leak report for this device. */
    bn_pool_leak leak;
    size_t n = 0;
    CHECK(bn_memory_pool_check_leaks(pool, 0, &leak, 1, &n, &err) == BN_OK);
    CHECK(n == 1 && leak.address == r && leak.device_id == d->id && leak.size == 4 * MIB);
    if (r)
        CHECK(bn_memory_pool_deallocate(pool, r, &err) == BN_OK);

    bn_memory_pool_get_stats(pool, &s);
    CHECK(s.bytes_in_use == 0 && s.allocation_count == s.deallocation_count);
    bn_memory_pool_destroy(pool);
    CHECK(cudaGetLastError() == cudaSuccess);
    TEST_EXIT();
}
