/* Status codes and the error record every fallible function fills. */
#include "bitnet.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[BN_STATUS_COUNT] = {
    [BN_OK] = "ok",
    [BN_ERR_INVALID_ARGUMENT] = "invalid-argument",
    [BN_ERR_INVALID_CONFIG] = "invalid-config",
    [BN_ERR_OUT_OF_MEMORY] = "out-of-memory",
    [BN_ERR_GPU_OUT_OF_MEMORY] = "gpu-out-of-memory",
    [BN_ERR_IO] = "io-error",
    [BN_ERR_FORMAT] = "format-error",
    [BN_ERR_UNSUPPORTED] = "unsupported",
    [BN_ERR_NO_DEVICE] = "no-device",
    [BN_ERR_DRIVER] = "driver-error",
    [BN_ERR_GPU] = "gpu-error",
    [BN_ERR_FAKE_GPU] = "fake-gpu",
    [BN_ERR_INTERNAL] = "internal-error",
};

const char *bn_status_str(bn_status status)
{
    if ((int)status < 0 || status >= BN_STATUS_COUNT || !status_names[status])
        return "unknown-status";
    return status_names[status];
}

void bn_error_clear(bn_error *err)
{
    if (!err)
        return;
    err->status = BN_OK;
    err->message[0] = '\0';
    err->hint[0] = '\0';
}

bn_status bn_error_set(bn_error *err, bn_status status, const char *hint, const char *fmt, ...)
{
    if (!err)
        return status;
    err->status = status;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    } else {
        snprintf(err->message, sizeof err->message, "%s", bn_status_str(status));
    }
    snprintf(err->hint, sizeof err->hint, "%s", hint ? hint : "");
    return status;
}

const char *bn_version(void) { return BITNET_VERSION_STRING; }
