/* Precision selection for the mixed-precision matmul; see precision_select.h. */
#include "precision_select.h"

#include <math.h>
#include <strings.h>

static const char *const names[BN_PRECISION_COUNT] = {"auto", "fp32", "fp16", "bf16"};

const char *bn_precision_name(bn_precision p)
{
    return (unsigned)p < BN_PRECISION_COUNT ? names[p] : "?";
}

bool bn_precision_parse(const char *text, bn_precision *out)
{
    if (!text || !out)
        return false;
    for (int i = 0; i < BN_PRECISION_COUNT; i++) {
        if (strcasecmp(text, names[i]) == 0) {
            *out = (bn_precision)i;
            return true;
        }
    }
    return false;
}

static bn_status unsupported(bn_error *err, const bn_cuda_device *dev, bn_precision p,
                             const char *needs)
{
    return bn_error_set(err, BN_ERR_UNSUPPORTED,
                        "use precision auto (picks what the device has) or fp32",
                        "%s needs compute capability %s; device %d (%s) has %d.%d",
                        bn_precision_name(p), needs, dev->id, dev->name, dev->cc_major,
                        dev->cc_minor);
}

bn_status bn_precision_select(const bn_cuda_device *dev, bn_precision requested,
                              bn_precision *chosen, bn_error *err)
{
    if (!dev || !chosen)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "precision select: NULL device or output");
    switch (requested) {
    case BN_PRECISION_AUTO:
        *chosen = dev->bf16 ? BN_PRECISION_BF16
                : dev->fp16 ? BN_PRECISION_FP16
                            : BN_PRECISION_FP32;
        return BN_OK;
    case BN_PRECISION_FP32:
        *chosen = BN_PRECISION_FP32;
        return BN_OK;
    case BN_PRECISION_FP16:
        if (!dev->fp16)
            return unsupported(err, dev, requested, ">= 6.1");
        *chosen = BN_PRECISION_FP16;
        return BN_OK;
    case BN_PRECISION_BF16:
        if (!dev->bf16)
            return unsupported(err, dev, requested, ">= 8.0");
        *chosen = BN_PRECISION_BF16;
        return BN_OK;
    default:
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "use auto, fp32, fp16 or bf16",
                            "precision select: unknown precision %d", (int)requested);
    }
}

double bn_precision_unit_roundoff(bn_precision p)
{
    /* Half the distance between 1 and the next number: 2^-(mantissa bits + 1). */
    switch (p) {
    case BN_PRECISION_FP32:
        return ldexp(1.0, -24);
    case BN_PRECISION_FP16:
        return ldexp(1.0, -11);
    case BN_PRECISION_BF16:
        return ldexp(1.0, -8);
    default:
        return 0.0;
    }
}

double bn_precision_matmul_error_bound(bn_precision p, int64_t k)
{
    const double u = bn_precision_unit_roundoff(p);
    if (u == 0.0 || k < 0)
        return 0.0;
    return 2.0 * u + u * u + (double)k * ldexp(1.0, -24);
}
