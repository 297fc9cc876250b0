/* Ternary layouts with a per-tensor scale or no block structure of llama.cpp:
 * Microsoft's I2_S, the Hugging Face packed uint8 checkpoint layout, and
 * BitNet.rs's BitNet32-F16 blocks. Layouts are documented in fmt_bitnet.c. */
#ifndef BN_FMT_BITNET_H
#define BN_FMT_BITNET_H

#include "qtype.h"

size_t bn_i2s_tensor_bytes(int64_t rows, int64_t cols);
bool bn_i2s_shape_ok(int64_t rows, int64_t cols, bn_error *err);
bn_status bn_unpack_i2s(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                        int8_t *codes, float *scale, bn_error *err);
bn_status bn_pack_i2s(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                      bn_error *err);

/* The HF tensor holds no scale (weight_scale is a separate tensor): unpack
 * returns scale 1 and pack ignores it. */
bool bn_hf_packed_shape_ok(int64_t rows, int64_t cols, bn_error *err);
size_t bn_hf_packed_tensor_bytes(int64_t rows, int64_t cols); /* rows/4 x cols */
bn_status bn_unpack_hf_packed(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                              int8_t *codes, float *scale, bn_error *err);
bn_status bn_pack_hf_packed(const int8_t *codes, float scale, int64_t rows, int64_t cols,
                            void *dst, bn_error *err);

void bn_dequantize_row_bitnet32(const void *src, float *dst, int64_t n);
void bn_quantize_row_bitnet32(const float *src, void *dst, int64_t n);
bn_status bn_unpack_bitnet32(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                             int8_t *codes, float *scale, bn_error *err);
bn_status bn_pack_bitnet32(const int8_t *codes, float scale, int64_t rows, int64_t cols,
                           void *dst, bn_error *err);

#endif
