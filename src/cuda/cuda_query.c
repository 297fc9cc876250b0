/*
 * cuda_query.c - device properties through the CUDA runtime.
 *
 * The runtime is linked statically and loads the driver (libcuda.so.1) on
 * first use, so on a machine without a driver the first call fails with
 * cudaErrorInsufficientDriver instead of the binary failing to start. We
 * probe the driver ourselves first to tell "no driver" from "driver too old".
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitnet.h"
#include "cuda_check.h"
#include "cuda_driver_probe.h"

static void set_reason(bn_cuda_report *r, bn_status status, const char *hint, const char *fmt,
                       const char *arg)
{
    r->status = status;
    snprintf(r->reason, sizeof r->reason, fmt, arg);
    snprintf(r->hint, sizeof r->hint, "%s", hint);
}

static bool visible_devices_hidden(void)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    return v && (v[0] == '\0' || strcmp(v, "-1") == 0 || strcmp(v, "NoDevFiles") == 0);
}

static bn_status query_one(int id, bn_cuda_device *d, bn_error *err)
{
    struct cudaDeviceProp p;
    BN_CUDA_TRY(err, cudaGetDeviceProperties(&p, id));
    memset(d, 0, sizeof *d);
    d->id = id;
    snprintf(d->name, sizeof d->name, "%s", p.name);
    d->cc_major = p.major;
    d->cc_minor = p.minor;
    d->sm_count = p.multiProcessorCount;
    d->max_threads_per_block = p.maxThreadsPerBlock;
    d->max_threads_per_sm = p.maxThreadsPerMultiProcessor;
    d->warp_size = p.warpSize;
    d->shared_mem_per_block = p.sharedMemPerBlock;
    d->shared_mem_per_block_optin = p.sharedMemPerBlockOptin;
    d->shared_mem_per_sm = p.sharedMemPerMultiprocessor;
    d->l2_cache_bytes = (uint64_t)p.l2CacheSize;
    d->memory_bus_width_bits = p.memoryBusWidth;
    d->total_memory_bytes = p.totalGlobalMem;

    /* cudaDeviceProp lost memoryClockRate in CUDA 13; the attribute stays. */
    int clock_khz = 0;
    BN_CUDA_TRY(err, cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, id));
    d->memory_clock_khz = clock_khz;
    d->memory_bandwidth_gbs = bn_cuda_memory_bandwidth_gbs(clock_khz, p.memoryBusWidth);

    char bus[sizeof d->pci_bus_id];
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, id) == cudaSuccess)
        snprintf(d->pci_bus_id, sizeof d->pci_bus_id, "%s", bus);

    /* Free memory needs a context on the device; the primary context is
     * kept, since the backend would create it again moments later. */
    size_t free_b = 0, total_b = 0;
    BN_CUDA_TRY(err, cudaSetDevice(id));
    BN_CUDA_TRY(err, cudaMemGetInfo(&free_b, &total_b));
    d->free_memory_bytes = free_b;
    d->total_memory_bytes = total_b;
    bn_cuda_device_derive_caps(d);
    return BN_OK;
}

void bn_cuda_query(bn_cuda_report *report)
{
    if (!report)
        return;
    memset(report, 0, sizeof *report);
    report->compiled = true;
    cudaRuntimeGetVersion(&report->runtime_version);

    char why[256];
    if (!bn_cuda_driver_probe(&report->driver_version, why, sizeof why)) {
        set_reason(report, BN_ERR_DRIVER,
                   "install the NVIDIA driver; 'nvidia-smi' should then list the GPU",
                   "NVIDIA driver not found (%s)", why);
        return;
    }
    if (report->driver_version < report->runtime_version) {
        char text[128];
        snprintf(text, sizeof text, "%d.%d but this build needs %d.%d",
                 report->driver_version / 1000, report->driver_version % 1000 / 10,
                 report->runtime_version / 1000, report->runtime_version % 1000 / 10);
        set_reason(report, BN_ERR_DRIVER,
                   "update the NVIDIA driver, or rebuild bitnet with an older CUDA toolkit",
                   "the NVIDIA driver supports CUDA %s", text);
        return;
    }

    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc == cudaErrorNoDevice || (rc == cudaSuccess && count == 0)) {
        if (visible_devices_hidden())
            set_reason(report, BN_ERR_NO_DEVICE,
                       "unset CUDA_VISIBLE_DEVICES or set it to the device ids to use (e.g. 0)",
                       "CUDA_VISIBLE_DEVICES='%s' hides every GPU",
                       getenv("CUDA_VISIBLE_DEVICES"));
        else
            set_reason(report, BN_ERR_NO_DEVICE,
                       "check that 'nvidia-smi' lists a GPU and that /dev/nvidia* is accessible",
                       "%s", "the NVIDIA driver is installed but reports no CUDA device");
        return;
    }
    if (rc != cudaSuccess) {
        bn_error e;
        bn_cuda_error(&e, rc, "cudaGetDeviceCount", __FILE__, __LINE__);
        set_reason(report, e.status, e.hint, "%s", e.message);
        return;
    }

    if (count > BN_CUDA_MAX_DEVICES)
        count = BN_CUDA_MAX_DEVICES;
    for (int i = 0; i < count; i++) {
        bn_error e;
        if (query_one(i, &report->devices[report->device_count], &e) != BN_OK) {
            bn_log(BN_LOG_WARN, "skipping CUDA device %d: %s", i, e.message);
            if (report->device_count == 0 && i == count - 1) {
                set_reason(report, e.status, e.hint, "%s", e.message);
                return;
            }
            continue;
        }
        report->device_count++;
    }
    /* Which devices reach which directly: what replicas and tensor
     * parallelism would move between them. */
    for (int i = 0; i < report->device_count; i++) {
        bn_cuda_device *d = &report->devices[i];
        for (int k = 0; k < report->device_count; k++) {
            const int j = report->devices[k].id;
            int can = 0;
            if (j != d->id && cudaDeviceCanAccessPeer(&can, d->id, j) == cudaSuccess && can)
                d->peer_mask |= 1ull << j;
        }
        (void)cudaGetLastError();
    }
    report->status = BN_OK;
}
