/*
 * precision_select.h - which floating-point precision a matrix product runs
 * in, decided from a device record alone.
 *
 * Pure C and compiled in every build (with or without CUDA), so the rules
 * are tested on machines without a GPU against synthetic device records.
 * The CUDA mixed-precision matmul (src/cuda/mixed_matmul.h) asks this module
 * before it touches the GPU.
 *
 * Rules:
 *   AUTO -> BF16 when the device has bf16 (cc >= 8.0): same exponent range
 *           as fp32, so nothing overflows that fp32 would not;
 *        -> else FP16 when the device has fast fp16 (cc >= 6.1);
 *        -> else FP32.
 *   An explicit FP16 or BF16 on a device without it is BN_ERR_UNSUPPORTED
 *   (never silently widened: a caller who asked for a precision measures it).
 *   FP32 runs everywhere.
 * The capability flags come from bn_cuda_device_derive_caps, the one place
 * where compute capabilities turn into features.
 */
#ifndef BN_PRECISION_SELECT_H
#define BN_PRECISION_SELECT_H

#include <stdbool.h>
#include <stdint.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum bn_precision {
    BN_PRECISION_AUTO = 0,
    BN_PRECISION_FP32,
    BN_PRECISION_FP16,
    BN_PRECISION_BF16,
    BN_PRECISION_COUNT
} bn_precision;

/* "auto", "fp32", "fp16", "bf16"; "?" for anything else. */
const char *bn_precision_name(bn_precision p);

/* Parses the names above (case-insensitive); false on anything else. */
bool bn_precision_parse(const char *text, bn_precision *out);

/* Resolves `requested` for `dev` into a concrete precision (never AUTO).
 * BN_ERR_UNSUPPORTED names the device, its compute capability and the
 * capability the precision needs; BN_ERR_INVALID_ARGUMENT for a NULL
 * device or an out-of-range precision. */
bn_status bn_precision_select(const bn_cuda_device *dev, bn_precision requested,
                              bn_precision *chosen, bn_error *err);

/* Unit roundoff of the precision the inputs are rounded to: 2^-24 (fp32),
 * 2^-11 (fp16), 2^-8 (bf16); 0 for AUTO or an invalid value. */
double bn_precision_unit_roundoff(bn_precision p);

/* A worst-case bound on the error of one element of C = A.B computed with
 * inputs rounded to precision p, products formed exactly and summed in fp32
 * over k terms, relative to sum_k |a_ik| |b_kj|:
 *     2u + u^2 (rounding of both inputs)  +  k * 2^-24 (fp32 accumulation)
 * Tests compare measured errors against it; typical errors are far below. */
double bn_precision_matmul_error_bound(bn_precision p, int64_t k);

#ifdef __cplusplus
}
#endif

#endif
