/* Dense encodings for embeddings and LM heads: F32, F16, BF16 and the ggml
 * block formats Q8_0, Q4_K and Q6_K. Layouts are documented in fmt_dense.c.
 * n is a multiple of the block size (32 for Q8_0, 256 for Q4_K/Q6_K). */
#ifndef BN_FMT_DENSE_H
#define BN_FMT_DENSE_H

#include <stdint.h>

void bn_dequantize_row_f32(const void *src, float *dst, int64_t n);
void bn_dequantize_row_f16(const void *src, float *dst, int64_t n);
void bn_dequantize_row_bf16(const void *src, float *dst, int64_t n);
void bn_dequantize_row_q8_0(const void *src, float *dst, int64_t n);
void bn_dequantize_row_q4_k(const void *src, float *dst, int64_t n);
void bn_dequantize_row_q6_k(const void *src, float *dst, int64_t n);

void bn_quantize_row_f32(const float *src, void *dst, int64_t n);
void bn_quantize_row_f16(const float *src, void *dst, int64_t n);
void bn_quantize_row_bf16(const float *src, void *dst, int64_t n);
void bn_quantize_row_q8_0(const float *src, void *dst, int64_t n);

#endif
