/* Looks for the NVIDIA driver library without linking against it, so every
 * build (with or without CUDA) can say whether a driver is installed. */
#ifndef BN_CUDA_DRIVER_PROBE_H
#define BN_CUDA_DRIVER_PROBE_H

#include <stdbool.h>
#include <stddef.h>

/* True when libcuda.so.1 loads; *version gets cuDriverGetVersion's value
 * (e.g. 13000). On failure why gets the loader's message. */
bool bn_cuda_driver_probe(int *version, char *why, size_t why_size);

#endif
