/* Host memory: this process's resident set and the system's totals, read
 * from /proc on Linux (sysconf as the fallback for the totals). */
#include "bitnet.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Reads "<key>: <n> kB" from a /proc file; false when absent. */
static bool read_kb_field(const char *path, const char *key, uint64_t *bytes)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char line[256];
    size_t key_len = strlen(key);
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (strncmp(line, key, key_len) == 0 && line[key_len] == ':' &&
            sscanf(line + key_len + 1, "%llu", &kb) == 1) {
            *bytes = (uint64_t)kb * 1024;
            found = true;
            break;
        }
    }
    fclose(f);
    return found;
}

bn_status bn_host_memory_query(bn_host_memory *out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "bn_host_memory_query: NULL output");
    memset(out, 0, sizeof *out);
    read_kb_field("/proc/self/status", "VmRSS", &out->process_resident_bytes);
    read_kb_field("/proc/self/status", "VmHWM", &out->process_peak_bytes);
    if (!read_kb_field("/proc/meminfo", "MemTotal", &out->system_total_bytes)) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0)
            out->system_total_bytes = (uint64_t)pages * (uint64_t)page;
    }
    if (!read_kb_field("/proc/meminfo", "MemAvailable", &out->system_available_bytes)) {
#ifdef _SC_AVPHYS_PAGES
        long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0)
            out->system_available_bytes = (uint64_t)pages * (uint64_t)page;
#endif
    }
    if (out->system_total_bytes == 0)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "cannot read system memory size on this platform");
    return BN_OK;
}
