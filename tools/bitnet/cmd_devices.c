/* bitnet devices [--json]: what this machine offers bitnet. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

static void print_usage(FILE *out)
{
    fprintf(out, "usage: bitnet devices [--json]\n"
                 "\n"
                 "Shows the GPU backends found (CUDA, ROCm, Metal, Vulkan, OpenCL) with versions,\n"
                 "every CUDA device with its properties, the Vulkan devices with their limits,\n"
                 "the preflight verdict (whether a GPU will be used and, if not, what to do),\n"
                 "CPU features, kernel providers and memory.\n"
                 "\n"
                 "  --json    print the same report as one JSON object\n"
                 "  --help    show this help\n"
                 "\n"
                 "BITNET_GPU_FAKE, BITNET_STRICT_MODE and BITNET_STRICT_NO_FAKE_GPU change what is\n"
                 "reported; see 'bitnet --help'.\n");
}

typedef struct report {
    bn_gpu_info gpu;
    bn_host_memory host;
    bool host_ok;
    const bn_cpu_features *cpu;
    bn_kernel_report kernels;
    const char *const *cuda_kernels; /* NULL-terminated, empty without CUDA */
    bn_vulkan_report vulkan;
} report;

/* Which devices reach which by peer access (P2P), one line a device. */
static void print_peers(const bn_cuda_report *c)
{
    if (c->device_count < 2) {
        printf("  peer access (P2P): one device\n");
        return;
    }
    printf("  peer access (P2P):\n");
    for (int i = 0; i < c->device_count; i++) {
        const bn_cuda_device *d = &c->devices[i];
        printf("    cuda:%d ->", d->id);
        for (int k = 0; k < c->device_count; k++) {
            const int j = c->devices[k].id;
            if (j != d->id)
                printf(" cuda:%d %s", j, (d->peer_mask >> j) & 1 ? "yes" : "no");
        }
        printf("\n");
    }
}

static void cuda_caps_text(const bn_cuda_device *d, char *buf, size_t size)
{
    static const char *const names[] = {"fp16", "bf16", "int8-dot", "tensor-cores",
                                        "int8-tensor-cores", "fp8"};
    const bool flags[] = {d->fp16, d->bf16, d->int8_dot, d->tensor_cores, d->int8_tensor_cores,
                          d->fp8};
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (!flags[i])
            continue;
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%s%s", used ? " " : "", names[i]);
    }
    if (!buf[0])
        snprintf(buf, size, "(none)");
}

static void cpu_features_text(const bn_cpu_features *f, char *buf, size_t size)
{
    static const char *const names[] = {"avx2",     "fma",        "f16c",    "avx512f", "avx512bw",
                                        "avx512vl", "avx512vnni", "avxvnni", "neon",    "dotprod"};
    const bool flags[] = {f->avx2,     f->fma,        f->f16c,    f->avx512f, f->avx512bw,
                          f->avx512vl, f->avx512vnni, f->avxvnni, f->neon,    f->dotprod};
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (!flags[i])
            continue;
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%s%s", used ? " " : "", names[i]);
    }
    if (!buf[0])
        snprintf(buf, size, "(no SIMD extensions used by bitnet)");
}

static void print_text(const report *r)
{
    const bn_gpu_info *g = &r->gpu;
    printf("bitnet %s\n\nGPU backends\n", bn_version());
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++) {
        const bn_gpu_backend_info *bi = &g->backends[b];
        const char *state = bi->fake ? "fake" : bi->available ? "available" : "unavailable";
        printf("  %-7s %-12s %s%s%s\n", bn_gpu_backend_name((bn_gpu_backend)b), state,
               bi->version, bi->version[0] ? " | " : "", bi->detail);
    }
    if (g->fake_ignored)
        printf("  (BITNET_GPU_FAKE ignored: BITNET_STRICT_MODE=1)\n");

    printf("\nCUDA devices\n");
    const bn_cuda_report *c = &g->cuda;
    if (g->fake_override) {
        printf("  not queried: BITNET_GPU_FAKE replaces detection\n");
    } else if (c->status != BN_OK) {
        printf("  none: %s\n", c->reason);
    } else {
        for (int i = 0; i < c->device_count; i++) {
            const bn_cuda_device *d = &c->devices[i];
            char caps[128];
            cuda_caps_text(d, caps, sizeof caps);
            printf("  cuda:%d  %s", d->id, d->name);
            printf(d->pci_bus_id[0] ? "  [%s]\n" : "%s\n", d->pci_bus_id);
            printf("          compute capability   %d.%d\n", d->cc_major, d->cc_minor);
            printf("          memory               %.1f GiB total, %.1f GiB free\n",
                   (double)d->total_memory_bytes / GIB, (double)d->free_memory_bytes / GIB);
            printf("          multiprocessors      %d (max %d threads each)\n", d->sm_count,
                   d->max_threads_per_sm);
            printf("          threads per block    %d (warp %d)\n", d->max_threads_per_block,
                   d->warp_size);
            printf("          shared memory/block  %llu KiB (opt-in %llu KiB; %llu KiB per SM)\n",
                   (unsigned long long)d->shared_mem_per_block / 1024,
                   (unsigned long long)d->shared_mem_per_block_optin / 1024,
                   (unsigned long long)d->shared_mem_per_sm / 1024);
            printf("          L2 cache             %.1f MiB\n", (double)d->l2_cache_bytes / MIB);
            printf("          memory bandwidth     %.0f GB/s theoretical (%d MHz, %d-bit bus)\n",
                   d->memory_bandwidth_gbs, d->memory_clock_khz / 1000, d->memory_bus_width_bits);
            printf("          capabilities         %s\n", caps);
        }
        printf("  best device: cuda:%d (most memory, then most SMs)\n",
               c->devices[bn_cuda_best_device(c->devices, c->device_count)].id);
        print_peers(c);
    }

    printf("\nVulkan devices\n");
    const bn_vulkan_report *v = &r->vulkan;
    if (v->device_count == 0)
        printf("  none: %s\n", v->reason);
    for (int i = 0; i < v->device_count; i++) {
        const bn_vulkan_device *d = &v->devices[i];
        printf("  vulkan:%d  %s (%s)\n", i, d->name, d->type);
        printf("          Vulkan               %u.%u.%u\n", (d->api_version >> 22) & 0x7fu,
               (d->api_version >> 12) & 0x3ffu, d->api_version & 0xfffu);
        printf("          device-local memory  %.1f GiB\n", (double)d->device_local_bytes / GIB);
        printf("          workgroup            %u invocations, %u KiB shared, subgroup %u\n",
               d->max_workgroup_invocations, d->max_shared_bytes / 1024, d->subgroup_size);
        printf("          storage buffer       %.0f MiB at most\n",
               (double)d->max_storage_buffer_range / MIB);
        printf("          integer dot product  %s; fp64 %s; subgroup arithmetic %s\n",
               d->integer_dot_product ? "yes" : "no", d->fp64 ? "yes" : "no",
               d->subgroup_arithmetic ? "yes" : "no");
        if (d->int8_matrix[0])
            printf("          int8 matrices        %u x %u x %u a subgroup\n", d->int8_matrix[0],
                   d->int8_matrix[1], d->int8_matrix[2]);
        else
            printf("          int8 matrices        no\n");
    }

    printf("\nPreflight\n  %s\n", g->preflight);

    char feats[256];
    cpu_features_text(r->cpu, feats, sizeof feats);
    printf("\nCPU\n  %s%s%s, %d logical cores\n  features: %s\n", r->cpu->arch,
           r->cpu->model[0] ? ", " : "", r->cpu->model, r->cpu->logical_cores, feats);

    printf("\nKernel providers (compiled in, best first)\n");
    const bn_kernel_report *k = &r->kernels;
    for (int i = 0; i < k->n_providers; i++) {
        const bn_kernel_provider_info *p = &k->providers[i];
        const char *state = p->available ? "available"
                            : p->device  ? "no usable GPU"
                                         : "not supported by this CPU";
        printf("  %-11s %s%s%s\n", p->name, state, p->selected ? " (selected)" : "",
               p->device ? " (device provider: used when BITNET_KERNEL names it)" : "");
    }
    if (k->selection_status != BN_OK)
        printf("  selection failed: %s\n", k->selection_error);
    /* Only builds with CUDA have any. */
    if (r->cuda_kernels[0]) {
        printf("\nCUDA kernels (compiled in)\n");
        for (const char *const *line = r->cuda_kernels; *line; line++)
            printf("  %s\n", *line);
    }

    printf("\nHost memory\n");
    if (r->host_ok)
        printf("  system %.1f GiB total, %.1f GiB available; this process %.1f MiB resident\n",
               (double)r->host.system_total_bytes / GIB,
               (double)r->host.system_available_bytes / GIB,
               (double)r->host.process_resident_bytes / MIB);
    else
        printf("  unknown on this platform\n");

    printf("\nSummary\n  %s\n", g->summary);
}

static void print_json(const report *r)
{
    const bn_gpu_info *g = &r->gpu;
    bn_json j;
    bn_json_init(&j, stdout);
    bn_json_begin_object(&j);
    bn_json_kv_string(&j, "version", bn_version());

    bn_json_key(&j, "backends");
    bn_json_begin_array(&j);
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++) {
        const bn_gpu_backend_info *bi = &g->backends[b];
        bn_json_begin_object(&j);
        bn_json_kv_string(&j, "name", bn_gpu_backend_name((bn_gpu_backend)b));
        bn_json_kv_bool(&j, "available", bi->available);
        bn_json_kv_bool(&j, "fake", bi->fake);
        bn_json_kv_int(&j, "device_count", bi->device_count);
        bn_json_kv_string(&j, "version", bi->version);
        bn_json_kv_string(&j, "detail", bi->detail);
        bn_json_end_object(&j);
    }
    bn_json_end_array(&j);
    bn_json_kv_bool(&j, "fake_override", g->fake_override);
    bn_json_kv_bool(&j, "fake_ignored", g->fake_ignored);

    const bn_cuda_report *c = &g->cuda;
    bn_json_key(&j, "cuda");
    bn_json_begin_object(&j);
    bn_json_kv_bool(&j, "compiled", c->compiled);
    bn_json_kv_int(&j, "driver_version", c->driver_version);
    bn_json_kv_int(&j, "runtime_version", c->runtime_version);
    bn_json_kv_string(&j, "nvcc_version", g->nvcc_version);
    bn_json_kv_string(&j, "status", bn_status_str(c->status));
    bn_json_kv_string(&j, "reason", c->reason);
    bn_json_key(&j, "devices");
    bn_json_begin_array(&j);
    for (int i = 0; i < c->device_count; i++) {
        const bn_cuda_device *d = &c->devices[i];
        bn_json_begin_object(&j);
        bn_json_kv_int(&j, "id", d->id);
        bn_json_kv_string(&j, "name", d->name);
        bn_json_kv_string(&j, "pci_bus_id", d->pci_bus_id);
        char cc[16];
        snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
        bn_json_kv_string(&j, "compute_capability", cc);
        bn_json_kv_uint(&j, "total_memory_bytes", d->total_memory_bytes);
        bn_json_kv_uint(&j, "free_memory_bytes", d->free_memory_bytes);
        bn_json_kv_int(&j, "sm_count", d->sm_count);
        bn_json_kv_int(&j, "max_threads_per_block", d->max_threads_per_block);
        bn_json_kv_int(&j, "max_threads_per_sm", d->max_threads_per_sm);
        bn_json_kv_int(&j, "warp_size", d->warp_size);
        bn_json_kv_uint(&j, "shared_mem_per_block", d->shared_mem_per_block);
        bn_json_kv_uint(&j, "shared_mem_per_block_optin", d->shared_mem_per_block_optin);
        bn_json_kv_uint(&j, "shared_mem_per_sm", d->shared_mem_per_sm);
        bn_json_kv_uint(&j, "l2_cache_bytes", d->l2_cache_bytes);
        bn_json_kv_int(&j, "memory_clock_khz", d->memory_clock_khz);
        bn_json_kv_int(&j, "memory_bus_width_bits", d->memory_bus_width_bits);
        bn_json_kv_double(&j, "memory_bandwidth_gbs", d->memory_bandwidth_gbs);
        bn_json_key(&j, "capabilities");
        bn_json_begin_object(&j);
        bn_json_kv_bool(&j, "fp16", d->fp16);
        bn_json_kv_bool(&j, "bf16", d->bf16);
        bn_json_kv_bool(&j, "int8_dot", d->int8_dot);
        bn_json_kv_bool(&j, "tensor_cores", d->tensor_cores);
        bn_json_kv_bool(&j, "int8_tensor_cores", d->int8_tensor_cores);
        bn_json_kv_bool(&j, "fp8", d->fp8);
        bn_json_end_object(&j);
        /* The devices this one reaches by peer access (P2P). */
        bn_json_key(&j, "peers");
        bn_json_begin_array(&j);
        for (int k = 0; k < BN_CUDA_MAX_DEVICES; k++)
            if ((d->peer_mask >> k) & 1)
                bn_json_int(&j, k);
        bn_json_end_array(&j);
        bn_json_end_object(&j);
    }
    bn_json_end_array(&j);
    if (c->device_count > 0)
        bn_json_kv_int(&j, "best_device",
                       c->devices[bn_cuda_best_device(c->devices, c->device_count)].id);
    bn_json_end_object(&j);

    const bn_vulkan_report *v = &r->vulkan;
    bn_json_key(&j, "vulkan");
    bn_json_begin_object(&j);
    bn_json_kv_bool(&j, "compiled", v->compiled);
    bn_json_kv_string(&j, "reason", v->device_count ? "" : v->reason);
    bn_json_key(&j, "devices");
    bn_json_begin_array(&j);
    for (int i = 0; i < v->device_count; i++) {
        const bn_vulkan_device *d = &v->devices[i];
        char api[32];
        snprintf(api, sizeof api, "%u.%u.%u", (d->api_version >> 22) & 0x7fu,
                 (d->api_version >> 12) & 0x3ffu, d->api_version & 0xfffu);
        bn_json_begin_object(&j);
        bn_json_kv_int(&j, "id", i);
        bn_json_kv_string(&j, "name", d->name);
        bn_json_kv_string(&j, "type", d->type);
        bn_json_kv_string(&j, "api_version", api);
        bn_json_kv_uint(&j, "device_local_bytes", d->device_local_bytes);
        bn_json_kv_int(&j, "max_workgroup_invocations", d->max_workgroup_invocations);
        bn_json_kv_int(&j, "max_shared_bytes", d->max_shared_bytes);
        bn_json_kv_int(&j, "subgroup_size", d->subgroup_size);
        bn_json_kv_uint(&j, "max_storage_buffer_range", d->max_storage_buffer_range);
        bn_json_kv_bool(&j, "integer_dot_product", d->integer_dot_product);
        bn_json_kv_bool(&j, "fp64", d->fp64);
        bn_json_key(&j, "int8_matrix");
        bn_json_begin_array(&j);
        for (int m = 0; m < 3 && d->int8_matrix[0]; m++)
            bn_json_int(&j, d->int8_matrix[m]);
        bn_json_end_array(&j);
        bn_json_end_object(&j);
    }
    bn_json_end_array(&j);
    bn_json_end_object(&j);

    bn_json_key(&j, "preflight");
    bn_json_begin_object(&j);
    bn_json_kv_bool(&j, "ok", g->preflight_ok);
    bn_json_kv_string(&j, "message", g->preflight);
    bn_json_end_object(&j);

    const bn_cpu_features *f = r->cpu;
    bn_json_key(&j, "cpu");
    bn_json_begin_object(&j);
    bn_json_kv_string(&j, "arch", f->arch);
    bn_json_kv_string(&j, "model", f->model);
    bn_json_kv_int(&j, "logical_cores", f->logical_cores);
    bn_json_key(&j, "features");
    bn_json_begin_object(&j);
    bn_json_kv_bool(&j, "avx2", f->avx2);
    bn_json_kv_bool(&j, "fma", f->fma);
    bn_json_kv_bool(&j, "f16c", f->f16c);
    bn_json_kv_bool(&j, "avx512f", f->avx512f);
    bn_json_kv_bool(&j, "avx512bw", f->avx512bw);
    bn_json_kv_bool(&j, "avx512vl", f->avx512vl);
    bn_json_kv_bool(&j, "avx512vnni", f->avx512vnni);
    bn_json_kv_bool(&j, "avxvnni", f->avxvnni);
    bn_json_kv_bool(&j, "neon", f->neon);
    bn_json_kv_bool(&j, "dotprod", f->dotprod);
    bn_json_end_object(&j);
    bn_json_end_object(&j);

    bn_json_key(&j, "kernel_providers");
    bn_json_begin_array(&j);
    for (int i = 0; i < r->kernels.n_providers; i++) {
        const bn_kernel_provider_info *p = &r->kernels.providers[i];
        bn_json_begin_object(&j);
        bn_json_kv_string(&j, "name", p->name);
        bn_json_kv_int(&j, "priority", p->priority);
        bn_json_kv_bool(&j, "available", p->available);
        bn_json_kv_bool(&j, "selected", p->selected);
        bn_json_end_object(&j);
    }
    bn_json_end_array(&j);
    bn_json_key(&j, "cuda_kernels");
    bn_json_begin_array(&j);
    for (const char *const *line = r->cuda_kernels; *line; line++)
        bn_json_string(&j, *line);
    bn_json_end_array(&j);

    bn_json_key(&j, "host_memory");
    bn_json_begin_object(&j);
    bn_json_kv_uint(&j, "system_total_bytes", r->host.system_total_bytes);
    bn_json_kv_uint(&j, "system_available_bytes", r->host.system_available_bytes);
    bn_json_kv_uint(&j, "process_resident_bytes", r->host.process_resident_bytes);
    bn_json_kv_uint(&j, "process_peak_bytes", r->host.process_peak_bytes);
    bn_json_end_object(&j);

    bn_json_kv_string(&j, "summary", g->summary);
    bn_json_end_object(&j);
}

int cmd_devices(int argc, char **argv, const bn_config *cfg)
{
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_usage(stdout);
            return BN_EXIT_OK;
        } else {
            fprintf(stderr, "bitnet devices: error: unknown option '%s'\n", argv[i]);
            print_usage(stderr);
            return BN_EXIT_USAGE;
        }
    }

    report *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "bitnet: error: out of memory\n");
        return BN_EXIT_OUT_OF_MEMORY;
    }
    bn_error err;
    bn_error_clear(&err);
    if (bn_gpu_detect(cfg, &r->gpu, &err) != BN_OK) {
        free(r);
        return cli_fail(&err);
    }
    r->host_ok = bn_host_memory_query(&r->host, NULL) == BN_OK;
    r->cpu = bn_cpu_features_get();
    bn_kernel_query(&r->kernels);
    r->cuda_kernels = bn_cuda_kernel_families();
    bn_vulkan_query(&r->vulkan);
    if (json)
        print_json(r);
    else
        print_text(r);
    free(r);
    return BN_EXIT_OK;
}
