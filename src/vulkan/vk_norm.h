/*
 * vk_norm.h - RMSNorm then int8 quantization of rows on a Vulkan device,
 * bit for bit the CPU's rule (bn_norm_quantize_row) on a device with fp64:
 * shaders/norm_quantize.glsl says how each division and square root is
 * made correctly rounded.
 *
 * Output: each row's codes four to a 32-bit word, zero-padded to
 * 4 * bn_vk_w2a8_words(n) words (the W2A8 kernel's activation layout), its
 * scale (127 / max |normed x|) and the sum of its codes.
 */
#ifndef BN_VK_NORM_H
#define BN_VK_NORM_H

#include "vk_context.h"

/* The kernel: on a device with fp64 the CPU's codes bit for bit, else
 * the float variant (shaders/norm_quantize.glsl says how they differ);
 * with subgroups the fp64 variant of 512 invocations a row reducing by
 * subgroup operations (BN_ERR_UNSUPPORTED where bn_vk_norm_subgroups says
 * the device cannot run it), else 256 invocations and trees. Both fp64
 * variants give the same codes. */
bn_status bn_vk_norm_kernel(bn_vk *vk, bool subgroups, bn_vk_kernel **out, bn_error *err);
/* Whether the device runs the subgroup variant: fp64, subgroup arithmetic
 * in compute shaders, subgroups of at least 4 and workgroups of 512. */
bool bn_vk_norm_subgroups(const bn_vk *vk);

/* rows rows of n floats in x (one after another), normed with w (n
 * floats) and eps, into codes / scales / sums, recorded into the open
 * sequence (bn_vk_begin). */
bn_status bn_vk_norm_record(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *x, bn_vk_buffer *w,
                            bn_vk_buffer *codes, bn_vk_buffer *scales, bn_vk_buffer *sums,
                            int64_t rows, int64_t n, float eps, bn_error *err);

#endif
