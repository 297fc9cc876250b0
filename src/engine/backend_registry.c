/*
 * backend_registry.c - the backends this build has. Adding a backend: its
 * folder defines a bn_backend_ops, and one line below lists it.
 */
#include "backend.h"

#include <stddef.h>

extern const bn_backend_ops bn_cpu_backend_ops;
#if defined(BITNET_HAVE_CUDA)
extern const bn_backend_ops bn_cuda_backend_ops;
extern const bn_backend_ops bn_cuda_tp_backend_ops;
#endif
#if defined(BITNET_HAVE_VULKAN)
extern const bn_backend_ops bn_vulkan_backend_ops;
#endif

/* The order auto tries them: CUDA, then Vulkan, the CPU last (it always
 * runs). */
static const bn_backend_entry registry[] = {
#if defined(BITNET_HAVE_CUDA)
    {&bn_cuda_backend_ops, BN_GPU_CUDA},
#endif
#if defined(BITNET_HAVE_VULKAN)
    {&bn_vulkan_backend_ops, BN_GPU_VULKAN},
#endif
    {&bn_cpu_backend_ops, -1},
};

int bn_backend_registry(const bn_backend_entry **entries)
{
    *entries = registry;
    return (int)(sizeof registry / sizeof registry[0]);
}

const bn_backend_entry *bn_backend_for_gpu(int gpu_kind)
{
    for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++)
        if (gpu_kind >= 0 && registry[i].gpu_kind == gpu_kind)
            return &registry[i];
    return NULL;
}

const bn_backend_ops *bn_backend_cpu_ops(void)
{
    return &bn_cpu_backend_ops;
}

const bn_backend_ops *bn_backend_tensor_parallel_ops(void)
{
#if defined(BITNET_HAVE_CUDA)
    return &bn_cuda_tp_backend_ops;
#else
    return NULL;
#endif
}
