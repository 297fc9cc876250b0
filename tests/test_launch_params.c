/* Capability rules, device ranking and launch parameters on synthetic
 * device records with the published figures of real GPUs. */
#include "bitnet.h"
#include "test_util.h"

#define KIB 1024ull
#define GIB (1024ull * 1024 * 1024)

static bn_cuda_device make(const char *name, int major, int minor, int sms, int threads_per_sm,
                           uint64_t smem_optin, uint64_t smem_sm, uint64_t l2, uint64_t mem,
                           int clock_khz, int bus)
{
    bn_cuda_device d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "%s", name);
    d.cc_major = major;
    d.cc_minor = minor;
    d.sm_count = sms;
    d.max_threads_per_block = 1024;
    d.max_threads_per_sm = threads_per_sm;
    d.warp_size = 32;
    d.shared_mem_per_block = 48 * KIB;
    d.shared_mem_per_block_optin = smem_optin;
    d.shared_mem_per_sm = smem_sm;
    d.l2_cache_bytes = l2;
    d.total_memory_bytes = mem;
    d.free_memory_bytes = mem;
    d.memory_clock_khz = clock_khz;
    d.memory_bus_width_bits = bus;
    d.memory_bandwidth_gbs = bn_cuda_memory_bandwidth_gbs(clock_khz, bus);
    bn_cuda_device_derive_caps(&d);
    return d;
}

static bn_cuda_device h100, a100, t4, rtx3060;

static void make_devices(void)
{
    h100 = make("H100 SXM5 80GB", 9, 0, 132, 2048, 227 * KIB, 228 * KIB, 50 * 1024 * KIB, 80 * GIB,
                2619000, 5120);
    a100 = make("A100 SXM4 40GB", 8, 0, 108, 2048, 163 * KIB, 164 * KIB, 40 * 1024 * KIB, 40 * GIB,
                1215000, 5120);
    t4 = make("Tesla T4", 7, 5, 40, 1024, 64 * KIB, 64 * KIB, 4 * 1024 * KIB, 16 * GIB, 5001000, 256);
    rtx3060 = make("GeForce RTX 3060", 8, 6, 28, 1536, 99 * KIB, 100 * KIB, 3 * 1024 * KIB, 12 * GIB,
                   7501000, 192);
}

static void test_capabilities(void)
{
    CHECK(h100.fp16 && h100.bf16 && h100.int8_dot && h100.tensor_cores && h100.int8_tensor_cores &&
          h100.fp8);
    CHECK(a100.bf16 && a100.int8_tensor_cores && !a100.fp8);
    CHECK(t4.fp16 && t4.int8_dot && t4.tensor_cores && t4.int8_tensor_cores && !t4.bf16 && !t4.fp8);
    CHECK(rtx3060.bf16 && !rtx3060.fp8);

    bn_cuda_device d;
    memset(&d, 0, sizeof d);
    d.cc_major = 7, d.cc_minor = 0; /* V100: fp16 tensor cores only */
    bn_cuda_device_derive_caps(&d);
    CHECK(d.tensor_cores && !d.int8_tensor_cores && !d.bf16);
    d.cc_major = 6, d.cc_minor = 1;
    bn_cuda_device_derive_caps(&d);
    CHECK(d.fp16 && d.int8_dot && !d.tensor_cores);
    d.cc_major = 6, d.cc_minor = 0;
    bn_cuda_device_derive_caps(&d);
    CHECK(!d.fp16 && !d.int8_dot);
    d.cc_major = 8, d.cc_minor = 9;
    bn_cuda_device_derive_caps(&d);
    CHECK(d.fp8 && d.bf16);

    /* Published peaks: H100 SXM 3.35 TB/s, A100 40GB 1.555 TB/s, T4 320 GB/s,
     * RTX 3060 360 GB/s. */
    CHECK(fabs(h100.memory_bandwidth_gbs - 3352.3) < 1.0);
    CHECK(fabs(a100.memory_bandwidth_gbs - 1555.2) < 1.0);
    CHECK(fabs(t4.memory_bandwidth_gbs - 320.1) < 1.0);
    CHECK(fabs(rtx3060.memory_bandwidth_gbs - 360.0) < 1.0);
}

static void test_best_device(void)
{
    bn_cuda_device list[4] = {t4, a100, h100, rtx3060};
    CHECK(bn_cuda_best_device(list, 4) == 2);
    CHECK(bn_cuda_best_device(list, 2) == 1);
    CHECK(bn_cuda_best_device(list, 0) == -1);
    CHECK(bn_cuda_best_device(NULL, 3) == -1);
    /* Equal memory: more SMs wins. */
    bn_cuda_device tie[2] = {a100, a100};
    tie[1].sm_count = 120;
    CHECK(bn_cuda_best_device(tie, 2) == 1);
}

static void test_launch_rules(void)
{
    bn_launch_params lp;
    bn_error e;

    /* Big problem: the preferred block as is. */
    CHECK(bn_launch_params_compute(&h100, 1u << 24, 256, 0, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 256 && lp.grid == 65536 && lp.shared_bytes == 0 && !lp.needs_optin);

    /* Default block is 256. */
    CHECK(bn_launch_params_compute(&t4, 100000, 0, 0, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 256 && lp.grid == 391);

    /* Few blocks per SM: halve until >= 4 per SM or 64 threads. H100: 528
     * blocks wanted; 10000 / 256 = 40, /128 = 79, /64 = 157 -> stops at 64. */
    CHECK(bn_launch_params_compute(&h100, 10000, 256, 0, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 64 && lp.grid == 157);
    /* RTX 3060: 112 wanted; 40000/256 = 157 already enough. */
    CHECK(bn_launch_params_compute(&rtx3060, 40000, 256, 0, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 256 && lp.grid == 157);
    /* A100 (432 wanted): 60000/256 = 235 -> 128 gives 469. */
    CHECK(bn_launch_params_compute(&a100, 60000, 256, 0, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 128 && lp.grid == 469);

    /* Tiny work: one warp, one block. */
    CHECK(bn_launch_params_compute(&h100, 10, 256, 0, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 32 && lp.grid == 1);

    /* Preferred block above the device limit is clamped. */
    CHECK(bn_launch_params_compute(&t4, 1u << 26, 2048, 0, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 1024);

    /* Shared memory per thread limits the block: A100 opt-in 163 KiB at
     * 1 KiB per thread -> 163 threads -> 160 after warp rounding. */
    CHECK(bn_launch_params_compute(&a100, 1u << 20, 256, 1024, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 160 && lp.shared_bytes == 160 * 1024 && lp.needs_optin);
    /* The same on a T4 (64 KiB): 64 threads. */
    CHECK(bn_launch_params_compute(&t4, 1u << 20, 256, 1024, 0, &lp, &e) == BN_OK);
    CHECK(lp.block == 64 && lp.shared_bytes == 64 * 1024);
    /* Fixed shared memory that fits the default limit needs no opt-in. */
    CHECK(bn_launch_params_compute(&h100, 1u << 20, 256, 0, 16 * 1024, &lp, &e) == BN_OK);
    CHECK(lp.shared_bytes == 16 * 1024 && !lp.needs_optin);

    /* Errors. */
    CHECK(bn_launch_params_compute(&t4, 1000, 256, 0, 70000, &lp, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "shared memory");
    CHECK(bn_launch_params_compute(&t4, 1000, 256, 4096, 0, &lp, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_launch_params_compute(&h100, 0, 256, 0, 0, &lp, &e) == BN_ERR_INVALID_ARGUMENT);
    bn_cuda_device empty;
    memset(&empty, 0, sizeof empty);
    CHECK(bn_launch_params_compute(&empty, 100, 256, 0, 0, &lp, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_launch_params_compute(NULL, 100, 256, 0, 0, &lp, &e) == BN_ERR_INVALID_ARGUMENT);
}

/* The invariants hold for any request that succeeds. */
static void test_launch_invariants(void)
{
    const bn_cuda_device *devs[] = {&h100, &a100, &t4, &rtx3060};
    unsigned seed = 12345;
    for (int iter = 0; iter < 20000; iter++) {
        seed = seed * 1103515245u + 12345u;
        const bn_cuda_device *d = devs[(seed >> 16) % 4];
        uint64_t n = 1 + (uint64_t)((seed >> 3) % 5000000u);
        unsigned pref = (unsigned)(32u << ((seed >> 8) % 6)); /* 32..1024 */
        uint64_t per_thread = ((seed >> 12) % 3 == 0) ? (seed >> 20) % 600 : 0;
        uint64_t fixed = ((seed >> 14) % 4 == 0) ? (seed >> 18) % 40000 : 0;
        bn_launch_params lp;
        if (bn_launch_params_compute(d, n, pref, per_thread, fixed, &lp, NULL) != BN_OK)
            continue;
        uint64_t limit = d->shared_mem_per_block_optin;
        bool ok = lp.block % 32 == 0 && lp.block >= 32 && lp.block <= 1024 &&
                  (uint64_t)lp.grid * lp.block >= n && (uint64_t)(lp.grid - 1) * lp.block < n &&
                  lp.shared_bytes <= limit && lp.shared_bytes == fixed + per_thread * lp.block;
        CHECK_MSG(ok, "%s n=%llu pref=%u smem=%llu+%llu -> block %u grid %u shared %llu", d->name,
                  (unsigned long long)n, pref, (unsigned long long)fixed,
                  (unsigned long long)per_thread, lp.block, lp.grid,
                  (unsigned long long)lp.shared_bytes);
        if (!ok)
            break;
    }
}

int main(void)
{
    make_devices();
    test_capabilities();
    test_best_device();
    test_launch_rules();
    test_launch_invariants();
    TEST_EXIT();
}
