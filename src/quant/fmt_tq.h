/* llama.cpp's ternary block formats TQ1_0 (base-3, 1.6875 bits/weight) and
 * TQ2_0 (2 bits/weight), 256-element blocks with an fp16 scale each.
 * Layouts are documented in fmt_tq.c. */
#ifndef BN_FMT_TQ_H
#define BN_FMT_TQ_H

#include "qtype.h"

void bn_dequantize_row_tq1_0(const void *src, float *dst, int64_t n);
void bn_dequantize_row_tq2_0(const void *src, float *dst, int64_t n);
/* Byte-for-byte what ggml / gguf-py produce from arbitrary floats (block
 * absmax scale). */
void bn_quantize_row_tq1_0(const float *src, void *dst, int64_t n);
void bn_quantize_row_tq2_0(const float *src, void *dst, int64_t n);

/* Canonical codes + per-tensor scale. pack writes d = fp16(scale) in every
 * block that holds a non-zero code and d = 0 in all-zero blocks (what
 * quantize_row gives for the floats codes * scale); unpack requires every
 * non-zero block scale to be equal. */
bn_status bn_unpack_tq1_0(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                          int8_t *codes, float *scale, bn_error *err);
bn_status bn_pack_tq1_0(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                        bn_error *err);
bn_status bn_unpack_tq2_0(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                          int8_t *codes, float *scale, bn_error *err);
bn_status bn_pack_tq2_0(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                        bn_error *err);

#endif
