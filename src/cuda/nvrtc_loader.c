/* NVRTC through dlopen, and compiling source to PTX; see nvrtc_loader.h. */
#include "nvrtc_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    pthread_once_t once;
    bn_nvrtc api;
    bool ok;
    char why[256];
} loaded = {PTHREAD_ONCE_INIT, {0}, false, ""};

static bool bind(void *lib, void *slot, const char *symbol)
{
    /* Through void ** as POSIX intends: ISO C has no object-to-function
     * pointer cast. */
    *(void **)slot = dlsym(lib, symbol);
    if (*(void **)slot)
        return true;
    snprintf(loaded.why, sizeof loaded.why, "%s lacks %s (too old?)", loaded.api.library,
             symbol);
    return false;
}

static void load(void)
{
    static const char *const candidates[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !lib; i++) {
        lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (lib)
            snprintf(loaded.api.library, sizeof loaded.api.library, "%s", candidates[i]);
    }
    if (!lib) {
        const char *e = dlerror();
        snprintf(loaded.why, sizeof loaded.why, "%s", e ? e : "libnvrtc.so not found");
        return;
    }
    bn_nvrtc *a = &loaded.api;
    if (!bind(lib, &a->get_error_string, "nvrtcGetErrorString") ||
        !bind(lib, &a->version, "nvrtcVersion") ||
        !bind(lib, &a->get_num_supported_archs, "nvrtcGetNumSupportedArchs") ||
        !bind(lib, &a->get_supported_archs, "nvrtcGetSupportedArchs") ||
        !bind(lib, &a->create_program, "nvrtcCreateProgram") ||
        !bind(lib, &a->destroy_program, "nvrtcDestroyProgram") ||
        !bind(lib, &a->compile_program, "nvrtcCompileProgram") ||
        !bind(lib, &a->get_ptx_size, "nvrtcGetPTXSize") || !bind(lib, &a->get_ptx, "nvrtcGetPTX") ||
        !bind(lib, &a->get_program_log_size, "nvrtcGetProgramLogSize") ||
        !bind(lib, &a->get_program_log, "nvrtcGetProgramLog"))
        return;
    if (a->version(&a->major, &a->minor) != NVRTC_SUCCESS) {
        snprintf(loaded.why, sizeof loaded.why, "%s: nvrtcVersion failed", a->library);
        return;
    }
    loaded.ok = true;
}

bn_status bn_nvrtc_get(const bn_nvrtc **out, bn_error *err)
{
    pthread_once(&loaded.once, load);
    if (!loaded.ok)
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "install the CUDA toolkit's NVRTC (libnvrtc.so and "
                            "libnvrtc-builtins.so) or add its directory to LD_LIBRARY_PATH; "
                            "prebuilt PTX loads without it",
                            "NVRTC (libnvrtc) is not available: %s", loaded.why);
    *out = &loaded.api;
    return BN_OK;
}

static bn_status nvrtc_failed(bn_error *err, const bn_nvrtc *api, nvrtcResult rc,
                              const char *call)
{
    const bn_status st = rc == NVRTC_ERROR_OUT_OF_MEMORY ? BN_ERR_OUT_OF_MEMORY : BN_ERR_INTERNAL;
    return bn_error_set(err, st, NULL, "%s failed: %s (NVRTC %d.%d)", call,
                        api->get_error_string(rc), api->major, api->minor);
}

bn_status bn_nvrtc_pick_arch(int cc_major, int cc_minor, int *arch, bn_error *err)
{
    const bn_nvrtc *api;
    bn_status st = bn_nvrtc_get(&api, err);
    if (st != BN_OK)
        return st;
    int count = 0;
    nvrtcResult rc = api->get_num_supported_archs(&count);
    if (rc != NVRTC_SUCCESS)
        return nvrtc_failed(err, api, rc, "nvrtcGetNumSupportedArchs");
    if (count <= 0 || count > 4096)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL,
                            "NVRTC %d.%d reports %d supported architectures", api->major,
                            api->minor, count);
    int *archs = malloc(sizeof(int) * (size_t)count);
    if (!archs)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "NVRTC: out of host memory");
    rc = api->get_supported_archs(archs);
    if (rc != NVRTC_SUCCESS) {
        free(archs);
        return nvrtc_failed(err, api, rc, "nvrtcGetSupportedArchs");
    }
    const int want = cc_major * 10 + cc_minor;
    int best = -1, oldest = archs[0];
    for (int i = 0; i < count; i++) {
        if (archs[i] <= want && archs[i] > best)
            best = archs[i];
        if (archs[i] < oldest)
            oldest = archs[i];
    }
    free(archs);
    if (best < 0)
        return bn_error_set(err, BN_ERR_UNSUPPORTED,
                            "use an NVRTC from an older CUDA toolkit, or load prebuilt PTX",
                            "NVRTC %d.%d targets compute capability %d.%d and newer; the device "
                            "has %d.%d",
                            api->major, api->minor, oldest / 10, oldest % 10, cc_major, cc_minor);
    *arch = best;
    return BN_OK;
}

/* NVRTC's log for prog, malloc'ed (never NULL unless out of memory). */
static char *program_log(const bn_nvrtc *api, nvrtcProgram prog)
{
    size_t size = 0;
    if (api->get_program_log_size(prog, &size) != NVRTC_SUCCESS || size == 0)
        size = 1;
    char *log = calloc(size, 1);
    if (log && size > 1 && api->get_program_log(prog, log) != NVRTC_SUCCESS)
        log[0] = '\0';
    return log;
}

bn_status bn_nvrtc_compile(const char *source, const char *name, int cc_major, int cc_minor,
                           const char *const *options, int n_options, char **ptx, char **log,
                           bn_error *err)
{
    if (log)
        *log = NULL;
    if (!source || !ptx || n_options < 0 || (n_options > 0 && !options))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "NVRTC compile: NULL source or output, or bad options");
    *ptx = NULL;
    const bn_nvrtc *api;
    bn_status st = bn_nvrtc_get(&api, err);
    if (st != BN_OK)
        return st;
    int arch = 0;
    st = bn_nvrtc_pick_arch(cc_major, cc_minor, &arch, err);
    if (st != BN_OK)
        return st;

    /* Our architecture option first, the caller's after it. */
    const char **argv = malloc(sizeof(char *) * (size_t)(n_options + 1));
    if (!argv)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "NVRTC: out of host memory");
    char arch_option[48];
    snprintf(arch_option, sizeof arch_option, "--gpu-architecture=compute_%d", arch);
    argv[0] = arch_option;
    for (int i = 0; i < n_options; i++)
        argv[i + 1] = options[i];

    const char *display = name ? name : "source.cu";
    nvrtcProgram prog = NULL;
    nvrtcResult rc = api->create_program(&prog, source, display, 0, NULL, NULL);
    if (rc != NVRTC_SUCCESS) {
        free(argv);
        return nvrtc_failed(err, api, rc, "nvrtcCreateProgram");
    }
    rc = api->compile_program(prog, n_options + 1, argv);
    free(argv);
    char *text = program_log(api, prog);
    if (rc != NVRTC_SUCCESS) {
        if (rc == NVRTC_ERROR_COMPILATION || rc == NVRTC_ERROR_INVALID_OPTION)
            st = bn_error_set(err, BN_ERR_FORMAT,
                              "fix the source at the line the log names; kernels looked "
                              "up by name must be extern \"C\"",
                              "NVRTC %d.%d could not compile %s for compute_%d: %s: %s",
                              api->major, api->minor, display, arch, api->get_error_string(rc),
                              text ? text : "(no log)");
        else
            st = nvrtc_failed(err, api, rc, "nvrtcCompileProgram");
    } else {
        size_t size = 0;
        rc = api->get_ptx_size(prog, &size);
        if (rc != NVRTC_SUCCESS) {
            st = nvrtc_failed(err, api, rc, "nvrtcGetPTXSize");
        } else if (!(*ptx = calloc(size + 1, 1))) {
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "NVRTC: out of host memory");
        } else if ((rc = api->get_ptx(prog, *ptx)) != NVRTC_SUCCESS) {
            free(*ptx);
            *ptx = NULL;
            st = nvrtc_failed(err, api, rc, "nvrtcGetPTX");
        }
    }
    api->destroy_program(&prog);
    if (log)
        *log = text;
    else
        free(text);
    return st;
}
