#include "cublas_loader.h"

#include "dl_first.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static struct {
    pthread_once_t once;
    bn_cublas api;
    bool ok;
    char why[256];
} loaded = {PTHREAD_ONCE_INIT, {0}, false, ""};

static void load(void)
{
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    void *lib = bn_dl_first(names, sizeof names / sizeof names[0], loaded.api.library,
                            sizeof loaded.api.library, loaded.why, sizeof loaded.why);
    if (!lib)
        return;
    /* The symbol types are fixed by cublas_api.h; dlsym returns void *. */
    *(void **)&loaded.api.create = dlsym(lib, "cublasCreate_v2");
    *(void **)&loaded.api.destroy = dlsym(lib, "cublasDestroy_v2");
    *(void **)&loaded.api.set_stream = dlsym(lib, "cublasSetStream_v2");
    *(void **)&loaded.api.gemm_ex = dlsym(lib, "cublasGemmEx");
    *(void **)&loaded.api.set_workspace = dlsym(lib, "cublasSetWorkspace_v2");
    if (!loaded.api.create || !loaded.api.destroy || !loaded.api.set_stream ||
        !loaded.api.gemm_ex || !loaded.api.set_workspace) {
        snprintf(loaded.why, sizeof loaded.why, "%s lacks an expected entry point",
                 loaded.api.library);
        return;
    }
    loaded.ok = true;
}

bn_status bn_cublas_get(const bn_cublas **out, bn_error *err)
{
    pthread_once(&loaded.once, load);
    if (!loaded.ok)
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "install the CUDA toolkit's cuBLAS (libcublas) or add it to "
                            "LD_LIBRARY_PATH",
                            "cuBLAS is not available: %s", loaded.why);
    *out = &loaded.api;
    return BN_OK;
}
