/* cuBLASLt and extra cuBLAS entry points through dlopen; see cublaslt_loader.h. */
#include "cublaslt_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "cublas_loader.h"

/* dlsym returns void *; storing it through a void ** is the POSIX-blessed
 * way to fill a function pointer without a cast between object and
 * function pointers, which ISO C leaves undefined. */
static bool bind(void *lib, void *slot, const char *symbol, char *why, size_t why_size,
                 const char *library)
{
    *(void **)slot = dlsym(lib, symbol);
    if (*(void **)slot)
        return true;
    snprintf(why, why_size, "%s lacks %s (too old?)", library, symbol);
    return false;
}

static struct {
    pthread_once_t once;
    bn_cublaslt api;
    bool ok;
    char why[256];
} lt = {PTHREAD_ONCE_INIT, {0}, false, ""};

static void load_lt(void)
{
    /* The newest first: the soname carries the major version, and a
     * cuBLASLt from another major version than the runtime may still work
     * with the driver, which is what decides. */
    static const char *const candidates[] = {"libcublasLt.so.13", "libcublasLt.so.12",
                                             "libcublasLt.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !lib; i++) {
        lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (lib)
            snprintf(lt.api.library, sizeof lt.api.library, "%s", candidates[i]);
    }
    if (!lib) {
        const char *e = dlerror();
        snprintf(lt.why, sizeof lt.why, "%s", e ? e : "libcublasLt.so not found");
        return;
    }
    const char *name = lt.api.library;
    bn_cublaslt *a = &lt.api;
    lt.ok = bind(lib, &a->create, "cublasLtCreate", lt.why, sizeof lt.why, name) &&
            bind(lib, &a->destroy, "cublasLtDestroy", lt.why, sizeof lt.why, name) &&
            bind(lib, &a->get_version, "cublasLtGetVersion", lt.why, sizeof lt.why, name) &&
            bind(lib, &a->matmul_desc_create, "cublasLtMatmulDescCreate", lt.why,
                 sizeof lt.why, name) &&
            bind(lib, &a->matmul_desc_destroy, "cublasLtMatmulDescDestroy", lt.why,
                 sizeof lt.why, name) &&
            bind(lib, &a->matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute", lt.why,
                 sizeof lt.why, name) &&
            bind(lib, &a->matrix_layout_create, "cublasLtMatrixLayoutCreate", lt.why,
                 sizeof lt.why, name) &&
            bind(lib, &a->matrix_layout_destroy, "cublasLtMatrixLayoutDestroy", lt.why,
                 sizeof lt.why, name) &&
            bind(lib, &a->preference_create, "cublasLtMatmulPreferenceCreate", lt.why,
                 sizeof lt.why, name) &&
            bind(lib, &a->preference_destroy, "cublasLtMatmulPreferenceDestroy", lt.why,
                 sizeof lt.why, name) &&
            bind(lib, &a->preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute",
                 lt.why, sizeof lt.why, name) &&
            bind(lib, &a->algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic", lt.why,
                 sizeof lt.why, name) &&
            bind(lib, &a->matmul, "cublasLtMatmul", lt.why, sizeof lt.why, name);
}

bn_status bn_cublaslt_get(const bn_cublaslt **out, bn_error *err)
{
    pthread_once(&lt.once, load_lt);
    if (!lt.ok)
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "install the CUDA toolkit's cuBLASLt (libcublasLt.so) or add its "
                            "directory to LD_LIBRARY_PATH",
                            "cuBLASLt (libcublasLt) is not available: %s", lt.why);
    *out = &lt.api;
    return BN_OK;
}

static struct {
    pthread_once_t once;
    bn_cublas_extra api;
    bn_status status;
    char why[BN_ERROR_MESSAGE_MAX];
} extra = {PTHREAD_ONCE_INIT, {0}, BN_ERR_INTERNAL, ""};

static void load_extra(void)
{
    const bn_cublas *cublas = NULL;
    bn_error e;
    if (bn_cublas_get(&cublas, &e) != BN_OK) {
        extra.status = e.status;
        snprintf(extra.why, sizeof extra.why, "%s", e.message);
        return;
    }
    void *lib = dlopen(cublas->library, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *msg = dlerror();
        extra.status = BN_ERR_UNSUPPORTED;
        snprintf(extra.why, sizeof extra.why, "%s", msg ? msg : cublas->library);
        return;
    }
    if (bind(lib, &extra.api.set_math_mode, "cublasSetMathMode", extra.why, sizeof extra.why,
             cublas->library) &&
        bind(lib, &extra.api.get_version, "cublasGetVersion_v2", extra.why, sizeof extra.why,
             cublas->library))
        extra.status = BN_OK;
    else
        extra.status = BN_ERR_UNSUPPORTED;
}

bn_status bn_cublas_extra_get(const bn_cublas_extra **out, bn_error *err)
{
    pthread_once(&extra.once, load_extra);
    if (extra.status != BN_OK)
        return bn_error_set(err, extra.status,
                            "install the CUDA toolkit's cuBLAS (libcublas.so) or add its "
                            "directory to LD_LIBRARY_PATH",
                            "cuBLAS (libcublas) is not usable: %s", extra.why);
    *out = &extra.api;
    return BN_OK;
}
