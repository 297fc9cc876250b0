#include "kernel_manager.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Sorted by priority, best first. */
static const bn_kernel_provider *const providers[] = {
#if defined(BITNET_HAVE_CUDA)
    &bn_provider_cuda,
#endif
#if defined(__x86_64__)
    &bn_provider_avx512vnni,
    &bn_provider_avx512,
    &bn_provider_avx2,
#endif
#if defined(__aarch64__)
    &bn_provider_neondot,
    &bn_provider_neon,
#endif
    &bn_provider_scalar,
};
#define N_PROVIDERS ((int)(sizeof providers / sizeof providers[0]))

int bn_kernel_providers(const bn_kernel_provider *const **list)
{
    *list = providers;
    return N_PROVIDERS;
}

const bn_kernel_provider *bn_kernel_by_name(const char *name)
{
    for (int i = 0; name && i < N_PROVIDERS; i++)
        if (strcmp(providers[i]->name, name) == 0)
            return providers[i];
    return NULL;
}

static char compiled_names[128];
static pthread_once_t compiled_names_once = PTHREAD_ONCE_INIT;

static void fill_compiled_names(void)
{
    size_t used = 0;
    for (int i = 0; i < N_PROVIDERS && used < sizeof compiled_names; i++)
        used += (size_t)snprintf(compiled_names + used, sizeof compiled_names - used, "%s%s",
                                 i ? "," : "", providers[i]->name);
}

const char *bn_kernel_compiled_names(void)
{
    pthread_once(&compiled_names_once, fill_compiled_names);
    return compiled_names;
}

static struct {
    pthread_once_t once;
    const bn_kernel_provider *chosen;
    bn_error error;
} selection = {PTHREAD_ONCE_INIT, NULL, {BN_OK, "", ""}};

static void select_once(void)
{
    bn_config cfg;
    if (bn_config_from_env(&cfg, &selection.error) != BN_OK)
        return;
    if (cfg.kernel[0]) {
        const bn_kernel_provider *p = bn_kernel_by_name(cfg.kernel);
        if (!p) {
            bn_error_set(&selection.error, BN_ERR_UNSUPPORTED, "unset BITNET_KERNEL",
                         "BITNET_KERNEL=%s: this build has no such kernel provider (it has %s)",
                         cfg.kernel, bn_kernel_compiled_names());
            return;
        }
        if (!p->is_available()) {
            bn_error_set(&selection.error, BN_ERR_NO_DEVICE,
                         "pick a provider this CPU supports ('bitnet devices' lists them)",
                         "BITNET_KERNEL=%s: this CPU lacks the instructions it needs", cfg.kernel);
            return;
        }
        selection.chosen = p;
        return;
    }
    /* Automatic selection serves the CPU backend: device providers are
     * used only when asked for by name. */
    for (int i = 0; i < N_PROVIDERS; i++) {
        if (!providers[i]->runs_on_device && providers[i]->is_available()) {
            selection.chosen = providers[i];
            return;
        }
    }
}

bn_status bn_kernel_select(const bn_kernel_provider **out, bn_error *err)
{
    pthread_once(&selection.once, select_once);
    if (!selection.chosen) {
        if (err)
            *err = selection.error;
        return selection.error.status != BN_OK ? selection.error.status : BN_ERR_INTERNAL;
    }
    *out = selection.chosen;
    return BN_OK;
}
