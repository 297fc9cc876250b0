/*
 * kernel_manager.h - which kernel provider computes.
 *
 * Every provider compiled into the build is listed here, best first (the
 * CUDA provider, when built, ranks above the CPU ones). The selection
 * happens once per process: BITNET_KERNEL names a provider explicitly (for
 * tests and benchmarks; an unknown or unavailable name is an error),
 * otherwise the available CPU provider with the highest priority wins —
 * the CUDA provider copies activations in and out on every call, so it is
 * used only when named; the CUDA backend calls the GPU kernels directly.
 * The scalar provider is always available.
 */
#ifndef BN_KERNEL_MANAGER_H
#define BN_KERNEL_MANAGER_H

#include "kernel_provider.h"

/* Every compiled-in provider, highest priority first; returns the count. */
int bn_kernel_providers(const bn_kernel_provider *const **list);

/* By name ("avx2"); NULL when not compiled in. */
const bn_kernel_provider *bn_kernel_by_name(const char *name);

/* The provider to compute with (decided once; the same answer after). */
bn_status bn_kernel_select(const bn_kernel_provider **out, bn_error *err);

/* Comma-separated names of the compiled-in providers, e.g.
 * "avx512vnni,avx512,avx2,scalar". */
const char *bn_kernel_compiled_names(void);

#endif
