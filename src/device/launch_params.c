/* Launch-parameter rules for CUDA kernels; see bn_launch_params_compute in
 * bitnet.h for the rules. Pure arithmetic on a device record, so it is
 * tested on synthetic devices without a GPU. */
#include "bitnet.h"

enum { DEFAULT_BLOCK = 256, MIN_SPLIT_BLOCK = 64, BLOCKS_PER_SM_TARGET = 4 };

/* The grid.x limit of every CUDA device since compute capability 3.0. */
#define GRID_MAX 0x7fffffffull

/* ceil(a / b) for b > 0, without the a + b - 1 that wraps near 2^64. */
static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

bn_status bn_launch_params_compute(const bn_cuda_device *dev, uint64_t n_work,
                                   unsigned preferred_block, uint64_t shared_per_thread,
                                   uint64_t shared_fixed, bn_launch_params *out, bn_error *err)
{
    if (!dev || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "launch params: NULL argument");
    if (n_work == 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "launch params: no work to launch");
    if (dev->max_threads_per_block <= 0 || dev->warp_size <= 0 || dev->sm_count <= 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "launch params: device record has no thread limits");
    if (dev->max_threads_per_block < dev->warp_size)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "launch params: device record allows %d threads per block, less than "
                            "its warp of %d",
                            dev->max_threads_per_block, dev->warp_size);

    const uint64_t warp = (uint64_t)dev->warp_size;
    uint64_t block = preferred_block ? preferred_block : DEFAULT_BLOCK;
    if (block > (uint64_t)dev->max_threads_per_block)
        block = (uint64_t)dev->max_threads_per_block;

    uint64_t shared_limit = dev->shared_mem_per_block_optin > dev->shared_mem_per_block
                                ? dev->shared_mem_per_block_optin
                                : dev->shared_mem_per_block;
    /* Does shared_fixed + shared_per_thread * warp fit? Asked without
     * computing it, which could wrap. */
    if (shared_fixed > shared_limit || shared_per_thread > (shared_limit - shared_fixed) / warp) {
        if (shared_per_thread <= (UINT64_MAX - shared_fixed) / warp)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                "use a smaller tile or fewer bytes of shared memory per thread",
                                "launch params: one warp needs %llu bytes of shared memory, the "
                                "device allows %llu per block",
                                (unsigned long long)(shared_fixed + shared_per_thread * warp),
                                (unsigned long long)shared_limit);
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "use a smaller tile or fewer bytes of shared memory per thread",
                            "launch params: one warp needs 2^64 bytes of shared memory or more "
                            "(%llu fixed, %llu a thread), the device allows %llu per block",
                            (unsigned long long)shared_fixed,
                            (unsigned long long)shared_per_thread,
                            (unsigned long long)shared_limit);
    }
    if (shared_per_thread > 0) {
        uint64_t fit = (shared_limit - shared_fixed) / shared_per_thread;
        if (block > fit)
            block = fit;
    }
    block -= block % warp;
    if (block == 0)
        block = warp;

    /* Never launch more threads than there is work, rounded up to a warp
     * (counted in warps: n_work rounded up could pass 2^64). */
    uint64_t work_warps = ceil_div(n_work, warp);
    if (work_warps < block / warp)
        block = work_warps * warp;

    uint64_t grid = ceil_div(n_work, block);
    const uint64_t target = (uint64_t)dev->sm_count * BLOCKS_PER_SM_TARGET;
    while (grid < target && block / 2 >= MIN_SPLIT_BLOCK && (block / 2) % warp == 0) {
        block /= 2;
        grid = ceil_div(n_work, block);
    }
    if (grid > GRID_MAX)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "split the work into several launches",
                            "launch params: %llu blocks exceed the grid limit of %llu",
                            (unsigned long long)grid, GRID_MAX);

    out->block = (unsigned)block;
    out->grid = (unsigned)grid;
    out->shared_bytes = shared_fixed + shared_per_thread * block;
    out->needs_optin = out->shared_bytes > dev->shared_mem_per_block;
    return BN_OK;
}
