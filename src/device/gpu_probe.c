/*
 * gpu_probe.c - ROCm, Metal, Vulkan and OpenCL detection.
 *
 * Vulkan and OpenCL are reached through their loaders (libvulkan.so.1,
 * libOpenCL.so.1) with dlopen; we declare the few entry points and structs
 * we call ourselves instead of needing their headers. A stack counts as
 * available only when it exposes a GPU: a CPU implementation (PoCL,
 * lavapipe) is reported but does not count.
 */
#include "gpu_probe.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *open_first(const char *const *names, char *why, size_t why_size)
{
    for (const char *const *n = names; *n; n++) {
        void *lib = dlopen(*n, RTLD_NOW | RTLD_LOCAL);
        if (lib)
            return lib;
    }
    snprintf(why, why_size, "%s not found", names[0]);
    return NULL;
}

/* ---- tools on PATH -------------------------------------------------------- */

static bool on_path(const char *tool)
{
    const char *path = getenv("PATH");
    if (!path)
        return false;
    char dir[4096];
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, ":");
        if (len > 0 && len + strlen(tool) + 2 < sizeof dir) {
            memcpy(dir, p, len);
            dir[len] = '/';
            strcpy(dir + len + 1, tool);
            if (access(dir, X_OK) == 0)
                return true;
        }
        p += len;
        if (*p == ':')
            p++;
    }
    return false;
}

bool bn_probe_tool_version(const char *tool, const char *args, const char *marker, char *out,
                           size_t out_size)
{
    out[0] = '\0';
    if (!on_path(tool))
        return false;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s %s 2>/dev/null", tool, args);
    FILE *f = popen(cmd, "r");
    if (!f)
        return false;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *m = strstr(line, marker);
        if (!m || out[0])
            continue; /* keep reading so the child never blocks on a pipe */
        m += strlen(marker);
        while (*m == ' ' || *m == ':')
            m++;
        size_t len = strcspn(m, ", \n");
        if (len >= out_size)
            len = out_size - 1;
        memcpy(out, m, len);
        out[len] = '\0';
    }
    pclose(f);
    return out[0] != '\0';
}

/* ---- ROCm ----------------------------------------------------------------- */

void bn_probe_rocm(bn_gpu_backend_info *info)
{
    FILE *vf = fopen("/opt/rocm/.info/version", "r");
    if (vf) {
        char v[64] = "";
        if (fgets(v, sizeof v, vf))
            v[strcspn(v, "\n")] = '\0';
        snprintf(info->version, sizeof info->version, "ROCm %s", v);
        fclose(vf);
    }
    if (access("/dev/kfd", F_OK) != 0) {
        snprintf(info->detail, sizeof info->detail, "no AMD GPU kernel driver (/dev/kfd missing)");
        return;
    }
    static const char *const names[] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5",
                                        NULL};
    char why[128];
    void *lib = open_first(names, why, sizeof why);
    if (!lib) {
        snprintf(info->detail, sizeof info->detail, "/dev/kfd present but the HIP runtime: %s",
                 why);
        return;
    }
    typedef int (*count_fn)(int *);
    count_fn count = (count_fn)dlsym(lib, "hipGetDeviceCount");
    int n = 0;
    if (count && count(&n) == 0 && n > 0) {
        info->available = true;
        info->device_count = n;
        snprintf(info->detail, sizeof info->detail, "%d HIP device(s)", n);
    } else {
        snprintf(info->detail, sizeof info->detail, "HIP runtime loaded but reports no device");
    }
    dlclose(lib);
}

/* ---- Metal ---------------------------------------------------------------- */

void bn_probe_metal(bn_gpu_backend_info *info)
{
#if defined(__APPLE__)
    snprintf(info->detail, sizeof info->detail, "macOS, but this build has no Metal backend");
#else
    snprintf(info->detail, sizeof info->detail, "Metal exists only on Apple platforms");
#endif
}

/* ---- Vulkan --------------------------------------------------------------- */

/* Layouts fixed by the Vulkan ABI (vulkan_core.h). */
typedef struct {
    uint32_t sType; /* VK_STRUCTURE_TYPE_APPLICATION_INFO = 0 */
    const void *pNext;
    const char *pApplicationName;
    uint32_t applicationVersion;
    const char *pEngineName;
    uint32_t engineVersion;
    uint32_t apiVersion;
} vk_application_info;

typedef struct {
    uint32_t sType; /* VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1 */
    const void *pNext;
    uint32_t flags;
    const vk_application_info *pApplicationInfo;
    uint32_t enabledLayerCount;
    const char *const *ppEnabledLayerNames;
    uint32_t enabledExtensionCount;
    const char *const *ppEnabledExtensionNames;
} vk_instance_create_info;

/* VkPhysicalDeviceProperties begins apiVersion, driverVersion, vendorID,
 * deviceID, deviceType, deviceName[256]; we read those at fixed offsets
 * from a buffer larger than the whole struct (about 824 bytes). */
enum { VK_PROPS_BUFFER = 4096, VK_OFF_API = 0, VK_OFF_TYPE = 16, VK_OFF_NAME = 20 };
enum { VK_TYPE_INTEGRATED = 1, VK_TYPE_DISCRETE = 2, VK_TYPE_VIRTUAL = 3, VK_TYPE_CPU = 4 };

#define VK_VERSION_TEXT(v) (unsigned)(((v) >> 22) & 0x7f), (unsigned)(((v) >> 12) & 0x3ff), \
                           (unsigned)((v) & 0xfff)

void bn_probe_vulkan(bn_gpu_backend_info *info)
{
    static const char *const names[] = {"libvulkan.so.1", "libvulkan.so", NULL};
    char why[128];
    void *lib = open_first(names, why, sizeof why);
    if (!lib) {
        snprintf(info->detail, sizeof info->detail, "loader %s", why);
        return;
    }
    typedef int32_t (*enum_version_fn)(uint32_t *);
    typedef int32_t (*create_fn)(const vk_instance_create_info *, const void *, void **);
    typedef void (*destroy_fn)(void *, const void *);
    typedef int32_t (*enum_devices_fn)(void *, uint32_t *, void **);
    typedef void (*props_fn)(void *, void *);
    enum_version_fn enum_version = (enum_version_fn)dlsym(lib, "vkEnumerateInstanceVersion");
    create_fn create = (create_fn)dlsym(lib, "vkCreateInstance");
    destroy_fn destroy = (destroy_fn)dlsym(lib, "vkDestroyInstance");
    enum_devices_fn enum_devices = (enum_devices_fn)dlsym(lib, "vkEnumeratePhysicalDevices");
    props_fn props = (props_fn)dlsym(lib, "vkGetPhysicalDeviceProperties");

    uint32_t loader_version = 0;
    if (enum_version && enum_version(&loader_version) == 0)
        snprintf(info->version, sizeof info->version, "loader %u.%u.%u",
                 VK_VERSION_TEXT(loader_version));
    if (!create || !destroy || !enum_devices || !props) {
        snprintf(info->detail, sizeof info->detail, "loader lacks core entry points");
        dlclose(lib);
        return;
    }

    vk_application_info app = {0, NULL, "bitnet", 1, "bitnet", 1, (1u << 22) | (1u << 12)};
    vk_instance_create_info ci = {1, NULL, 0, &app, 0, NULL, 0, NULL};
    void *instance = NULL;
    int32_t rc = create(&ci, NULL, &instance);
    if (rc != 0 || !instance) {
        snprintf(info->detail, sizeof info->detail,
                 "no Vulkan driver (vkCreateInstance returned %d)", (int)rc);
        dlclose(lib);
        return;
    }
    uint32_t n = 0;
    void *devices[16];
    if (enum_devices(instance, &n, NULL) == 0 && n > 16)
        n = 16;
    int gpus = 0, cpus = 0;
    char first_gpu[256] = "";
    if (n > 0 && enum_devices(instance, &n, devices) >= 0) {
        for (uint32_t i = 0; i < n; i++) {
            _Alignas(16) unsigned char buf[VK_PROPS_BUFFER];
            memset(buf, 0, sizeof buf);
            props(devices[i], buf);
            uint32_t type;
            memcpy(&type, buf + VK_OFF_TYPE, sizeof type);
            if (type == VK_TYPE_DISCRETE || type == VK_TYPE_INTEGRATED ||
                type == VK_TYPE_VIRTUAL) {
                if (gpus++ == 0) {
                    uint32_t api;
                    memcpy(&api, buf + VK_OFF_API, sizeof api);
                    snprintf(first_gpu, sizeof first_gpu, "%.200s, Vulkan %u.%u.%u",
                             (const char *)buf + VK_OFF_NAME, VK_VERSION_TEXT(api));
                }
            } else if (type == VK_TYPE_CPU) {
                cpus++;
            }
        }
    }
    destroy(instance, NULL);
    dlclose(lib);
    info->device_count = gpus;
    info->available = gpus > 0;
    if (gpus > 0)
        snprintf(info->detail, sizeof info->detail, "%d GPU device(s): %s%s", gpus, first_gpu,
                 gpus > 1 ? ", ..." : "");
    else
        snprintf(info->detail, sizeof info->detail, "no GPU device (%d CPU device(s))", cpus);
}

/* ---- OpenCL --------------------------------------------------------------- */

enum {
    CL_PLATFORM_VERSION_ID = 0x0901,
    CL_PLATFORM_NAME_ID = 0x0902,
};
#define CL_TYPE_GPU (1ull << 2)
#define CL_TYPE_ALL 0xFFFFFFFFull

void bn_probe_opencl(bn_gpu_backend_info *info)
{
    static const char *const names[] = {"libOpenCL.so.1", "libOpenCL.so", NULL};
    char why[128];
    void *lib = open_first(names, why, sizeof why);
    if (!lib) {
        snprintf(info->detail, sizeof info->detail, "ICD loader %s", why);
        return;
    }
    typedef int32_t (*platforms_fn)(uint32_t, void **, uint32_t *);
    typedef int32_t (*platform_info_fn)(void *, uint32_t, size_t, void *, size_t *);
    typedef int32_t (*devices_fn)(void *, uint64_t, uint32_t, void **, uint32_t *);
    platforms_fn get_platforms = (platforms_fn)dlsym(lib, "clGetPlatformIDs");
    platform_info_fn get_info = (platform_info_fn)dlsym(lib, "clGetPlatformInfo");
    devices_fn get_devices = (devices_fn)dlsym(lib, "clGetDeviceIDs");
    if (!get_platforms || !get_info || !get_devices) {
        snprintf(info->detail, sizeof info->detail, "ICD loader lacks core entry points");
        dlclose(lib);
        return;
    }
    void *platforms[8];
    uint32_t np = 0;
    int32_t rc = get_platforms(8, platforms, &np);
    if (rc != 0 || np == 0) {
        snprintf(info->detail, sizeof info->detail, "no OpenCL platform (clGetPlatformIDs: %d)",
                 (int)rc);
        dlclose(lib);
        return;
    }
    if (np > 8)
        np = 8;
    int gpus = 0, others = 0;
    char names_text[256] = "";
    for (uint32_t i = 0; i < np; i++) {
        char name[256] = "", version[256] = "";
        get_info(platforms[i], CL_PLATFORM_NAME_ID, sizeof name - 1, name, NULL);
        get_info(platforms[i], CL_PLATFORM_VERSION_ID, sizeof version - 1, version, NULL);
        uint32_t ng = 0, na = 0;
        if (get_devices(platforms[i], CL_TYPE_GPU, 0, NULL, &ng) != 0)
            ng = 0;
        if (get_devices(platforms[i], CL_TYPE_ALL, 0, NULL, &na) != 0)
            na = 0;
        gpus += (int)ng;
        others += (int)(na - ng);
        size_t used = strlen(names_text);
        snprintf(names_text + used, sizeof names_text - used, "%s%.60s", used ? "; " : "", name);
        if (i == 0)
            snprintf(info->version, sizeof info->version, "%.60s", version);
    }
    dlclose(lib);
    info->device_count = gpus;
    info->available = gpus > 0;
    snprintf(info->detail, sizeof info->detail, "%u platform(s) [%s]: %d GPU, %d other device(s)",
             np, names_text, gpus, others);
}
