#include "dl_first.h"

#include <dlfcn.h>
#include <stdio.h>

void *bn_dl_first(const char *const *names, size_t n, char *chosen, size_t chosen_size,
                  char *why, size_t why_size)
{
    for (size_t i = 0; i < n; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            snprintf(chosen, chosen_size, "%s", names[i]);
            return lib;
        }
    }
    const char *e = dlerror();
    if (e)
        snprintf(why, why_size, "%s", e);
    else
        snprintf(why, why_size, "%s not found", n > 0 ? names[0] : "the library");
    return NULL;
}
