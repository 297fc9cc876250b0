/* The model `run` and `perplexity` use when no -m is given: BITNET_MODEL
 * when set, else the small model shipped in models/ (models/README.md),
 * found next to the executable (build/bitnet in a source tree), under its
 * install prefix (bin/bitnet -> share/bitnet/models), or in the source tree
 * the binary was built from. */
#define _DEFAULT_SOURCE /* readlink */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define DEFAULT_MODEL_DIR "bitnet-kjv-7m"
#define DEFAULT_MODEL_FILE "bitnet-kjv-7m-i2_s.gguf"
#define REL_PATH DEFAULT_MODEL_DIR "/" DEFAULT_MODEL_FILE

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The parent of the folder holding the running executable ("" if unknown):
 * the build tree's top for build/bitnet, the prefix for PREFIX/bin/bitnet.
 * /proc/self/exe is already a resolved path, so stripping two components
 * gives a clean one. */
static void exe_parent(char *buf, size_t size)
{
    buf[0] = '\0';
    char path[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0)
        return;
    path[n] = '\0';
    for (int i = 0; i < 2; i++) {
        char *slash = strrchr(path, '/');
        if (!slash)
            return;
        *slash = '\0';
    }
    snprintf(buf, size, "%s", path[0] ? path : "/");
}

const char *cli_default_model(const bn_config *cfg, char *buf, size_t size, const char *cmd)
{
    if (cfg && cfg->model[0]) {
        snprintf(buf, size, "%s", cfg->model);
        return buf;
    }
    char parent[PATH_MAX];
    exe_parent(parent, sizeof parent);
    char tried[3][PATH_MAX + 64];
    int n = 0;
    if (parent[0]) {
        snprintf(tried[n++], sizeof tried[0], "%s/models/%s", parent, REL_PATH);
        snprintf(tried[n++], sizeof tried[0], "%s/share/bitnet/models/%s", parent, REL_PATH);
    }
#ifdef BITNET_SOURCE_DIR
    snprintf(tried[n++], sizeof tried[0], "%s/models/%s", BITNET_SOURCE_DIR, REL_PATH);
#endif
    for (int i = 0; i < n; i++) {
        if (is_file(tried[i])) {
            snprintf(buf, size, "%s", tried[i]);
            return buf;
        }
    }
    fprintf(stderr, "bitnet %s: error: no model given and the default model (%s) is not "
                    "installed; looked at:\n", cmd, DEFAULT_MODEL_FILE);
    for (int i = 0; i < n; i++)
        fprintf(stderr, "  %s\n", tried[i]);
    fprintf(stderr, "bitnet: hint: give -m MODEL or set BITNET_MODEL\n");
    return NULL;
}
