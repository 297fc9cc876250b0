/* Small path helpers shared by the file readers. */
#ifndef BN_PATH_UTIL_H
#define BN_PATH_UTIL_H

#include <string.h>

/* The part of path after its last '/', for messages ("model.safetensors"). */
static inline const char *bn_path_base(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

#endif
