/* Launch-parameter rules for CUDA kernels; see bn_launch_params_compute in
 * bitnet.h for the rules. Pure arithmetic on a device record, so it is
 * tested on synthetic devices without a GPU. */
#include "bitnet.h"

enum { DEFAULT_BLOCK = 256, MIN_SPLIT_BLOCK = 64, BLOCKS_PER_SM_TARGET = 4 };

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

    const uint64_t warp = (uint64_t)dev->warp_size;
    uint64_t block = preferred_block ? preferred_block : DEFAULT_BLOCK;
    if (block > (uint64_t)dev->max_threads_per_block)
        block = (uint64_t)dev->max_threads_per_block;

    uint64_t shared_limit = dev->shared_mem_per_block_optin > dev->shared_mem_per_block
                                ? dev->shared_mem_per_block_optin
                                : dev->shared_mem_per_block;
    if (shared_fixed + shared_per_thread * warp > shared_limit)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "use a smaller tile or fewer bytes of shared memory per thread",
                            "launch params: one warp needs %llu bytes of shared memory, the device "
                            "allows %llu per block",
                            (unsigned long long)(shared_fixed + shared_per_thread * warp),
                            (unsigned long long)shared_limit);
    if (shared_per_thread > 0) {
        uint64_t fit = (shared_limit - shared_fixed) / shared_per_thread;
        if (block > fit)
            block = fit;
    }
    block -= block % warp;
    if (block == 0)
        block = warp;

    /* Never launch more threads than there is work, rounded up to a warp. */
    uint64_t work_rounded = (n_work + warp - 1) / warp * warp;
    if (block > work_rounded)
        block = work_rounded;

    uint64_t grid = (n_work + block - 1) / block;
    const uint64_t target = (uint64_t)dev->sm_count * BLOCKS_PER_SM_TARGET;
    while (grid < target && block / 2 >= MIN_SPLIT_BLOCK && (block / 2) % warp == 0) {
        block /= 2;
        grid = (n_work + block - 1) / block;
    }
    if (grid > 0x7fffffffull)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "split the work into several launches",
                            "launch params: %llu blocks exceed the grid limit",
                            (unsigned long long)grid);

    out->block = (unsigned)block;
    out->grid = (unsigned)grid;
    out->shared_bytes = shared_fixed + shared_per_thread * block;
    out->needs_optin = out->shared_bytes > dev->shared_mem_per_block;
    return BN_OK;
}
