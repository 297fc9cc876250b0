/*
 * default_model.c - where the model shipped with bitnet (models/README.md)
 * is found when no model is named (bn_default_model_path in bitnet.h).
 *
 * The places, in order: BITNET_MODEL; beside the running program and beside
 * this library, each as the top of a build tree (DIR/models/...) or an
 * install prefix (DIR/share/bitnet/models/...), DIR being the parent of the
 * folder that holds the program or the library (build/bitnet and
 * PREFIX/bin/bitnet, PREFIX/lib/libbitnet.so); the source tree the library
 * was built from.
 */
#include <dlfcn.h> /* dladdr (_GNU_SOURCE: the build defines it) */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bitnet.h"

#define DEFAULT_MODEL_DIR "bitnet-kjv-7m"
#define DEFAULT_MODEL_FILE "bitnet-kjv-7m-i2_s.gguf"
#define REL_PATH DEFAULT_MODEL_DIR "/" DEFAULT_MODEL_FILE
#define MAX_PLACES 5

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* path without its last two components ("" when it has fewer). */
static void grandparent(const char *path, char *buf, size_t size)
{
    char p[PATH_MAX];
    buf[0] = '\0';
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
        return;
    for (int i = 0; i < 2; i++) {
        char *slash = strrchr(p, '/');
        if (!slash)
            return;
        *slash = '\0';
    }
    snprintf(buf, size, "%s", p[0] ? p : "/");
}

/* The build-tree and install-prefix places under dir, once each. */
static void add_places(const char *dir, char places[][PATH_MAX + 64], int *n)
{
    if (!dir[0])
        return;
    char a[PATH_MAX + 64], b[PATH_MAX + 64];
    snprintf(a, sizeof a, "%s/models/%s", dir, REL_PATH);
    snprintf(b, sizeof b, "%s/share/bitnet/models/%s", dir, REL_PATH);
    const char *both[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        bool seen = false;
        for (int i = 0; i < *n; i++)
            seen |= strcmp(places[i], both[k]) == 0;
        if (!seen && *n < MAX_PLACES)
            snprintf(places[(*n)++], PATH_MAX + 64, "%s", both[k]);
    }
}

bn_status bn_default_model_path(char *buf, size_t size, bn_error *err)
{
    if (!buf || size == 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "bn_default_model_path: NULL or empty buffer");
    buf[0] = '\0';
    bn_config cfg;
    bn_status st = bn_config_from_env(&cfg, err);
    if (st != BN_OK)
        return st;
    if (cfg.model[0]) {
        if ((size_t)snprintf(buf, size, "%s", cfg.model) >= size)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "BITNET_MODEL does not fit a buffer of %zu bytes", size);
        return BN_OK;
    }
    char places[MAX_PLACES][PATH_MAX + 64];
    int n = 0;
    char exe[PATH_MAX], dir[PATH_MAX];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        grandparent(exe, dir, sizeof dir);
        add_places(dir, places, &n);
    }
    Dl_info info;
    char lib[PATH_MAX];
    if (dladdr((const void *)&bn_default_model_path, &info) && info.dli_fname &&
        realpath(info.dli_fname, lib)) {
        grandparent(lib, dir, sizeof dir);
        add_places(dir, places, &n);
    }
#ifdef BITNET_SOURCE_DIR
    if (n < MAX_PLACES)
        snprintf(places[n++], sizeof places[0], "%s/models/%s", BITNET_SOURCE_DIR, REL_PATH);
#endif
    for (int i = 0; i < n; i++) {
        if (is_file(places[i])) {
            if ((size_t)snprintf(buf, size, "%s", places[i]) >= size)
                return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                    "the default model's path does not fit a buffer of %zu bytes",
                                    size);
            return BN_OK;
        }
    }
    char looked[BN_ERROR_MESSAGE_MAX - 96] = "";
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof looked; i++)
        used += (size_t)snprintf(looked + used, sizeof looked - used, "%s%s", i ? ", " : "",
                                 places[i]);
    return bn_error_set(err, BN_ERR_IO, "name a model, or set BITNET_MODEL",
                        "the default model (%s) is not installed; looked at %s",
                        DEFAULT_MODEL_FILE, n ? looked : "no place (unknown program path)");
}
