/* Capability rules and device ranking: plain functions of a device record,
 * compiled in every build so they are tested without a GPU. */
#include "bitnet.h"

/* (major, minor) compared in order, so no sum of them can overflow. */
static bool cc_at_least(const bn_cuda_device *dev, int major, int minor)
{
    return dev->cc_major > major || (dev->cc_major == major && dev->cc_minor >= minor);
}

void bn_cuda_device_derive_caps(bn_cuda_device *dev)
{
    if (!dev)
        return;
    dev->fp16 = cc_at_least(dev, 6, 1);
    dev->int8_dot = cc_at_least(dev, 6, 1);          /* dp4a arrived with sm_61 */
    dev->tensor_cores = cc_at_least(dev, 7, 0);
    dev->int8_tensor_cores = cc_at_least(dev, 7, 2); /* Volta's tensor cores are fp16 only */
    dev->bf16 = cc_at_least(dev, 8, 0);
    dev->fp8 = cc_at_least(dev, 8, 9);
}

int bn_cuda_best_device(const bn_cuda_device *devs, int n)
{
    if (!devs || n <= 0)
        return -1;
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (devs[i].total_memory_bytes > devs[best].total_memory_bytes ||
            (devs[i].total_memory_bytes == devs[best].total_memory_bytes &&
             devs[i].sm_count > devs[best].sm_count))
            best = i;
    }
    return best;
}

double bn_cuda_memory_bandwidth_gbs(int memory_clock_khz, int bus_width_bits)
{
    if (memory_clock_khz <= 0 || bus_width_bits <= 0)
        return 0.0;
    return 2.0 * (double)memory_clock_khz * 1e3 * (double)(bus_width_bits / 8) / 1e9;
}
