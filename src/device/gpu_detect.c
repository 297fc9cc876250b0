/*
 * gpu_detect.c - which GPU stacks this machine has, and whether bitnet can
 * compute on one.
 *
 * Fake GPUs exist for tests of the selection logic on machines without a
 * GPU: BITNET_GPU_FAKE="cuda,rocm" replaces detection with those backends,
 * marked fake ("none" or "" fakes none). Fakes are never used for compute.
 * BITNET_STRICT_MODE=1 ignores BITNET_GPU_FAKE and detects for real;
 * BITNET_STRICT_NO_FAKE_GPU=1 makes a configured fake an error.
 */
#include <stdio.h>
#include <string.h>

#include "bitnet.h"
#include "gpu_probe.h"

static void append(char *buf, size_t size, const char *fmt, const char *a, const char *b)
{
    size_t used = strlen(buf);
    if (used < size)
        snprintf(buf + used, size - used, fmt, a, b);
}

static void describe_fake_list(unsigned mask, char *out, size_t size)
{
    out[0] = '\0';
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++)
        if (mask & (1u << b))
            append(out, size, "%s%s", out[0] ? "," : "", bn_gpu_backend_name((bn_gpu_backend)b));
    if (!out[0])
        snprintf(out, size, "none");
}

static void apply_fake(const bn_config *cfg, bn_gpu_info *info)
{
    info->fake_override = true;
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++) {
        bn_gpu_backend_info *bi = &info->backends[b];
        if (cfg->gpu_fake_mask & (1u << b)) {
            bi->available = true;
            bi->fake = true;
            bi->device_count = 1;
            snprintf(bi->version, sizeof bi->version, "fake");
            snprintf(bi->detail, sizeof bi->detail,
                     "fake device from BITNET_GPU_FAKE (never used for compute)");
        } else {
            snprintf(bi->detail, sizeof bi->detail, "not detected: BITNET_GPU_FAKE replaces detection");
        }
    }
    char list[128];
    describe_fake_list(cfg->gpu_fake_mask, list, sizeof list);
    info->preflight_ok = false;
    snprintf(info->preflight, sizeof info->preflight,
             "BITNET_GPU_FAKE=%s replaces GPU detection; fake backends are never used for "
             "compute: unset BITNET_GPU_FAKE to use the real GPUs",
             list);
}

static void detect_cuda(bn_gpu_info *info)
{
    bn_cuda_report *r = &info->cuda;
    bn_gpu_backend_info *bi = &info->backends[BN_GPU_CUDA];
    bn_cuda_query(r);
    if (r->driver_version > 0)
        snprintf(bi->version, sizeof bi->version, "driver %d.%d", r->driver_version / 1000,
                 r->driver_version % 1000 / 10);
    if (r->runtime_version > 0) {
        size_t used = strlen(bi->version);
        snprintf(bi->version + used, sizeof bi->version - used, "%sruntime %d.%d",
                 used ? ", " : "", r->runtime_version / 1000, r->runtime_version % 1000 / 10);
    }
    if (info->nvcc_version[0]) {
        size_t used = strlen(bi->version);
        snprintf(bi->version + used, sizeof bi->version - used, "%snvcc %s", used ? ", " : "",
                 info->nvcc_version);
    }
    if (r->status != BN_OK) {
        snprintf(bi->detail, sizeof bi->detail, "%.300s", r->reason);
        return;
    }
    bi->available = true;
    bi->device_count = r->device_count;
    const bn_cuda_device *d = &r->devices[bn_cuda_best_device(r->devices, r->device_count)];
    snprintf(bi->detail, sizeof bi->detail, "%d device(s); best: cuda:%d %s, compute %d.%d, %.1f GiB",
             r->device_count, d->id, d->name, d->cc_major, d->cc_minor,
             (double)d->total_memory_bytes / (1024.0 * 1024.0 * 1024.0));
}

static void real_preflight(bn_gpu_info *info)
{
    const bn_cuda_report *r = &info->cuda;
    if (r->status == BN_OK) {
        const bn_cuda_device *d = &r->devices[bn_cuda_best_device(r->devices, r->device_count)];
        info->preflight_ok = true;
        snprintf(info->preflight, sizeof info->preflight,
                 "ready: cuda:%d %s (compute %d.%d, %.1f GiB free) will be used for compute",
                 d->id, d->name, d->cc_major, d->cc_minor,
                 (double)d->free_memory_bytes / (1024.0 * 1024.0 * 1024.0));
        return;
    }
    info->preflight_ok = false;
    const char *other = "";
    if (info->backends[BN_GPU_ROCM].available)
        other = " (an AMD GPU was found through ROCm, but bitnet computes on CUDA only)";
    snprintf(info->preflight, sizeof info->preflight, "no usable CUDA GPU: %.200s%s; %.150s; the "
             "CPU backend will be used",
             r->reason, other, r->hint);
}

static void write_summary(bn_gpu_info *info)
{
    char *s = info->summary;
    size_t size = sizeof info->summary;
    s[0] = '\0';
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++) {
        const bn_gpu_backend_info *bi = &info->backends[b];
        static const char *const titles[BN_GPU_BACKEND_COUNT] = {"CUDA", "ROCm", "Metal", "Vulkan",
                                                                 "OpenCL"};
        const char *state = bi->fake ? "fake" : bi->available ? "available" : "unavailable";
        char line[600];
        snprintf(line, sizeof line, "%s%s %s", b ? " " : "", titles[b], state);
        size_t used = strlen(s);
        snprintf(s + used, size - used, "%s (%s%s%s).", line, bi->version,
                 bi->version[0] ? "; " : "", bi->detail);
    }
    size_t used = strlen(s);
    snprintf(s + used, size - used, " %s%s",
             info->preflight_ok ? "GPU compute: " : "GPU compute unavailable: ",
             info->preflight);
}

bn_status bn_gpu_detect(const bn_config *cfg_in, bn_gpu_info *info, bn_error *err)
{
    if (!info)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "bn_gpu_detect: NULL info");
    memset(info, 0, sizeof *info);
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++)
        info->backends[b].backend = (bn_gpu_backend)b;

    bn_config env_cfg;
    const bn_config *cfg = cfg_in;
    if (!cfg) {
        bn_status st = bn_config_from_env(&env_cfg, err);
        if (st != BN_OK)
            return st;
        cfg = &env_cfg;
    }

    if (cfg->gpu_fake_set && cfg->gpu_fake_mask && cfg->strict_no_fake_gpu) {
        char list[128];
        describe_fake_list(cfg->gpu_fake_mask, list, sizeof list);
        return bn_error_set(err, BN_ERR_FAKE_GPU, "unset BITNET_GPU_FAKE or BITNET_STRICT_NO_FAKE_GPU",
                            "BITNET_GPU_FAKE=%s configures fake GPUs, which "
                            "BITNET_STRICT_NO_FAKE_GPU=1 forbids",
                            list);
    }
    if (cfg->gpu_fake_set && !cfg->strict_mode) {
        apply_fake(cfg, info);
        write_summary(info);
        return BN_OK;
    }
    if (cfg->gpu_fake_set) {
        info->fake_ignored = true;
        bn_log(BN_LOG_INFO, "BITNET_STRICT_MODE=1: ignoring BITNET_GPU_FAKE, detecting real GPUs");
    }

    bn_probe_tool_version("nvcc", "--version", "release", info->nvcc_version,
                          sizeof info->nvcc_version);
    bn_probe_tool_version("rocm-smi", "--version", "ROCM-SMI version", info->rocm_smi_version,
                          sizeof info->rocm_smi_version);
    detect_cuda(info);
    bn_probe_rocm(&info->backends[BN_GPU_ROCM]);
    if (info->rocm_smi_version[0] && !info->backends[BN_GPU_ROCM].version[0])
        snprintf(info->backends[BN_GPU_ROCM].version, sizeof info->backends[BN_GPU_ROCM].version,
                 "rocm-smi %s", info->rocm_smi_version);
    bn_probe_metal(&info->backends[BN_GPU_METAL]);
    bn_probe_vulkan(&info->backends[BN_GPU_VULKAN]);
    bn_probe_opencl(&info->backends[BN_GPU_OPENCL]);
    real_preflight(info);
    write_summary(info);
    return BN_OK;
}

bool bn_gpu_info_available(const bn_gpu_info *info)
{
    if (!info)
        return false;
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++)
        if (info->backends[b].available)
            return true;
    return false;
}

bool bn_gpu_available(void)
{
    bn_gpu_info local;
    if (bn_gpu_detect(NULL, &local, NULL) != BN_OK)
        return false;
    return bn_gpu_info_available(&local);
}
