/* Probes for GPU stacks other than CUDA. Each loads its library with dlopen
 * so none is a build or load-time dependency, and each fills one
 * bn_gpu_backend_info (available, device count, version, detail). */
#ifndef BN_GPU_PROBE_H
#define BN_GPU_PROBE_H

#include "bitnet.h"

void bn_probe_rocm(bn_gpu_backend_info *info);
void bn_probe_metal(bn_gpu_backend_info *info);
void bn_probe_vulkan(bn_gpu_backend_info *info);
void bn_probe_opencl(bn_gpu_backend_info *info);

/* Runs `tool args` when tool is on PATH and copies the first match of the
 * text after `marker` (up to a delimiter in ", \n") into out. Returns false
 * (out = "") when the tool is missing or prints no marker. */
bool bn_probe_tool_version(const char *tool, const char *args, const char *marker, char *out,
                           size_t out_size);

#endif
