/* The model `run` uses when no -m is given: BITNET_MODEL when set, else the
 * small model shipped in models/ (models/README.md), found where the
 * library's bn_default_model_path looks (beside the executable and the
 * library, under an install prefix, in the source tree). */
#include <stdio.h>

#include "cli.h"

const char *cli_default_model(const bn_config *cfg, char *buf, size_t size, const char *cmd)
{
    if (cfg && cfg->model[0]) {
        snprintf(buf, size, "%s", cfg->model);
        return buf;
    }
    bn_error err;
    if (bn_default_model_path(buf, size, &err) == BN_OK)
        return buf;
    fprintf(stderr, "bitnet %s: error: no model given and %s\n", cmd, err.message);
    fprintf(stderr, "bitnet: hint: give -m MODEL or set BITNET_MODEL\n");
    return NULL;
}
