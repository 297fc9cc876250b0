/* GPU test: what bn_cuda_query reports must match nvidia-smi for every GPU
 * (name, memory, compute capability), matched by PCI bus id. Exits 77
 * (skipped) with the reason when no GPU is usable here. */
#include <ctype.h>
#include <strings.h>

#include "bitnet.h"
#include "test_util.h"

typedef struct smi_gpu {
    char name[256], cc[16], bus[64];
    double memory_mib;
} smi_gpu;

static void trim(char *s)
{
    char *start = s;
    while (isspace((unsigned char)*start))
        start++;
    memmove(s, start, strlen(start) + 1);
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
}

static int read_nvidia_smi(smi_gpu *gpus, int max)
{
    FILE *f = popen("nvidia-smi --query-gpu=name,memory.total,compute_cap,pci.bus_id "
                    "--format=csv,noheader,nounits 2>/dev/null",
                    "r");
    if (!f)
        return -1;
    int n = 0;
    char line[512];
    while (n < max && fgets(line, sizeof line, f)) {
        char *fields[4];
        char *save = NULL;
        int k = 0;
        for (char *t = strtok_r(line, ",", &save); t && k < 4; t = strtok_r(NULL, ",", &save))
            fields[k++] = t;
        if (k != 4)
            continue;
        for (int i = 0; i < 4; i++)
            trim(fields[i]);
        snprintf(gpus[n].name, sizeof gpus[n].name, "%s", fields[0]);
        gpus[n].memory_mib = atof(fields[1]);
        snprintf(gpus[n].cc, sizeof gpus[n].cc, "%s", fields[2]);
        snprintf(gpus[n].bus, sizeof gpus[n].bus, "%s", fields[3]);
        n++;
    }
    int rc = pclose(f);
    return rc == 0 ? n : -1;
}

/* "00000000:18:00.0" and "0000:18:00.0" name the same device. */
static bool same_bus(const char *a, const char *b)
{
    const char *pa = strchr(a, ':'), *pb = strchr(b, ':');
    return pa && pb && strcasecmp(pa, pb) == 0;
}

static bn_cuda_report report;

int main(void)
{
    smi_gpu smi[BN_CUDA_MAX_DEVICES];
    int n_smi = read_nvidia_smi(smi, BN_CUDA_MAX_DEVICES);
    if (n_smi <= 0)
        TEST_SKIP("no usable GPU: nvidia-smi is missing, failed or lists no GPU");

    bn_cuda_query(&report);
    if (!report.compiled)
        TEST_SKIP("this build has no CUDA support (configure with -DBITNET_CUDA=ON)");
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (cvd && report.status == BN_ERR_NO_DEVICE)
        TEST_SKIP("CUDA_VISIBLE_DEVICES='%s' hides the GPUs that nvidia-smi lists", cvd);

    CHECK_MSG(report.status == BN_OK, "nvidia-smi lists %d GPU(s) but the query says: %s", n_smi,
              report.reason);
    CHECK(report.driver_version >= report.runtime_version && report.runtime_version > 0);
    if (!cvd)
        CHECK(report.device_count == n_smi);

    for (int i = 0; i < report.device_count; i++) {
        const bn_cuda_device *d = &report.devices[i];
        const smi_gpu *s = NULL;
        for (int k = 0; k < n_smi; k++)
            if (same_bus(d->pci_bus_id, smi[k].bus))
                s = &smi[k];
        CHECK_MSG(s != NULL, "cuda:%d (%s) not in nvidia-smi's list", d->id, d->pci_bus_id);
        if (!s)
            continue;
        char cc[16];
        snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
        CHECK_MSG(strcmp(d->name, s->name) == 0, "name '%s' vs nvidia-smi '%s'", d->name, s->name);
        CHECK_MSG(strcmp(cc, s->cc) == 0, "compute capability %s vs nvidia-smi %s", cc, s->cc);
        /* The runtime excludes a little memory the driver reserves. */
        double mib = (double)d->total_memory_bytes / (1024.0 * 1024.0);
        CHECK_MSG(mib <= s->memory_mib * 1.001 && mib >= s->memory_mib * 0.97,
                  "memory %.0f MiB vs nvidia-smi %.0f MiB", mib, s->memory_mib);
        CHECK(d->free_memory_bytes > 0 && d->free_memory_bytes <= d->total_memory_bytes);
        CHECK(d->sm_count > 0 && d->max_threads_per_block >= 512 && d->warp_size == 32);
        CHECK(d->shared_mem_per_block_optin >= d->shared_mem_per_block);
        CHECK(d->l2_cache_bytes > 0 && d->memory_bandwidth_gbs > 100.0);
        CHECK(d->bf16 == (d->cc_major >= 8));

        /* Launch parameters on the real record obey the limits. */
        bn_launch_params lp;
        CHECK(bn_launch_params_compute(d, 1u << 20, 256, 0, 0, &lp, NULL) == BN_OK);
        CHECK(lp.block <= (unsigned)d->max_threads_per_block && lp.grid > 0);

        printf("cuda:%d %s cc %s, %.0f MiB (nvidia-smi %.0f), %d SMs, L2 %llu KiB, %.0f GB/s\n",
               d->id, d->name, cc, mib, s->memory_mib, d->sm_count,
               (unsigned long long)d->l2_cache_bytes / 1024, d->memory_bandwidth_gbs);
    }
    TEST_EXIT();
}
