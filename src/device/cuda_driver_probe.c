#include "cuda_driver_probe.h"

#include <dlfcn.h>
#include <stdio.h>

bool bn_cuda_driver_probe(int *version, char *why, size_t why_size)
{
    *version = 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *msg = dlerror();
        snprintf(why, why_size, "%s", msg ? msg : "libcuda.so.1 not found");
        return false;
    }
    typedef int (*get_version_fn)(int *);
    get_version_fn get_version = (get_version_fn)dlsym(lib, "cuDriverGetVersion");
    if (!get_version || get_version(version) != 0) {
        snprintf(why, why_size, "libcuda.so.1 has no usable cuDriverGetVersion");
        *version = 0;
        dlclose(lib);
        return false;
    }
    /* Keep the library loaded: the CUDA runtime would load it again anyway. */
    return true;
}
