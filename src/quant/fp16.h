/* IEEE half and bfloat16 conversions, exact and portable (no F16C needed).
 * fp32 -> fp16/bf16 rounds to nearest, ties to even, as numpy and ggml do;
 * NaN stays NaN and overflow becomes infinity. */
#ifndef BN_FP16_H
#define BN_FP16_H

#include <stdint.h>

float bn_fp16_to_fp32(uint16_t h);
uint16_t bn_fp32_to_fp16(float f);
float bn_bf16_to_fp32(uint16_t b);
uint16_t bn_fp32_to_bf16(float f);

#endif
