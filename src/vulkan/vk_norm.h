/*
 * vk_norm.h - RMSNorm then int8 quantization of rows on a Vulkan device,
 * bit for bit the CPU's rule (bn_norm_quantize_row): shaders/
 * norm_quantize.comp says how each division and square root is made
 * correctly rounded. Needs a device with fp64.
 *
 * Output: each row's codes four to a 32-bit word, zero-padded to
 * 4 * bn_vk_w2a8_words(n) words (the W2A8 kernel's activation layout), its
 * scale (127 / max |normed x|) and the sum of its codes.
 */
#ifndef BN_VK_NORM_H
#define BN_VK_NORM_H

#include "vk_context.h"

/* The kernel; BN_ERR_UNSUPPORTED on a device without fp64. */
bn_status bn_vk_norm_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err);

/* rows rows of n floats in x (one after another), normed with w (n
 * floats) and eps, into codes / scales / sums, recorded into the open
 * sequence (bn_vk_begin). */
bn_status bn_vk_norm_record(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *x, bn_vk_buffer *w,
                            bn_vk_buffer *codes, bn_vk_buffer *scales, bn_vk_buffer *sums,
                            int64_t rows, int64_t n, float eps, bn_error *err);

#endif
