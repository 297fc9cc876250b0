#include "nccl_loader.h"

#include "dl_first.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static struct {
    pthread_once_t once;
    bn_nccl api;
    bool ok;
    char why[256];
} loaded = {PTHREAD_ONCE_INIT, {0}, false, ""};

static void load(void)
{
    static const char *const names[] = {"libnccl.so.2", "libnccl.so"};
    void *lib = bn_dl_first(names, sizeof names / sizeof names[0], loaded.api.library,
                            sizeof loaded.api.library, loaded.why, sizeof loaded.why);
    if (!lib)
        return;
    /* The symbol types are fixed by nccl.h; dlsym returns void *. */
    *(void **)&loaded.api.comm_init_all = dlsym(lib, "ncclCommInitAll");
    *(void **)&loaded.api.comm_destroy = dlsym(lib, "ncclCommDestroy");
    *(void **)&loaded.api.comm_abort = dlsym(lib, "ncclCommAbort");
    *(void **)&loaded.api.all_reduce = dlsym(lib, "ncclAllReduce");
    *(void **)&loaded.api.all_gather = dlsym(lib, "ncclAllGather");
    *(void **)&loaded.api.error_string = dlsym(lib, "ncclGetErrorString");
    if (!loaded.api.comm_init_all || !loaded.api.comm_destroy ||
        !loaded.api.comm_abort || !loaded.api.all_reduce || !loaded.api.all_gather ||
        !loaded.api.error_string) {
        snprintf(loaded.why, sizeof loaded.why, "%s lacks an expected entry point",
                 loaded.api.library);
        return;
    }
    loaded.ok = true;
}

bn_status bn_nccl_get(const bn_nccl **out, bn_error *err)
{
    pthread_once(&loaded.once, load);
    if (!loaded.ok)
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "install NCCL (libnccl2, or the nvidia-nccl Python package) or add "
                            "its folder to LD_LIBRARY_PATH",
                            "tensor parallelism needs NCCL, which is not available: %s",
                            loaded.why);
    *out = &loaded.api;
    return BN_OK;
}
