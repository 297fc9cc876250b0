/*
 * vk_w2a8.h - the W2A8 product on a Vulkan device: ternary weights in the
 * Vulkan kernels' layout times int8 activations.
 *
 * Layout: row r of k codes takes bn_vk_w2a8_words(k) 32-bit words; word j
 * holds the codes (weight + 1: 0, 1, 2) of elements 16j .. 16j + 15, element
 * 16j + i at bits 2i..2i+1; past k a row holds code 1 (weight 0).
 * Activations: rows of int8, four to a word, each zero-padded to 16 * words
 * values, with their scales in a buffer of their own.
 *
 * Exactness: the sum of code * x is exact in int32, as on the CPU, and
 * y = ((float)sum / act_scale) * weight_scale is the CPU's expression.
 * Vulkan lets a division be off by up to 2.5 ulp where C's is correctly
 * rounded. On a device with fp64 the kernel divides in double and rounds
 * to float, which gives the correctly rounded quotient (the exact quotient
 * of two floats is never within 2^-49 of halfway between two floats, and
 * the double quotient is off by less than 2^-50): y is the CPU's, bit for
 * bit. Without fp64 y may differ by an ulp or two where the driver divides
 * inexactly; the integer sum never differs (tests/test_vulkan_w2a8.c).
 */
#ifndef BN_VK_W2A8_H
#define BN_VK_W2A8_H

#include "vk_context.h"

size_t bn_vk_w2a8_words(int64_t k);

/* codes [n][k] (values -1, 0, +1) into out, n * bn_vk_w2a8_words(k) words. */
void bn_vk_w2a8_pack(const int8_t *codes, int64_t n, int64_t k, uint32_t *out);

/* The kernel, built once for a device: with exact_division the variant
 * that divides in double (BN_ERR_UNSUPPORTED on a device without fp64);
 * with dot_product the one whose sums take the device's integer dot
 * products and meet in subgroup adds (BN_ERR_UNSUPPORTED where
 * bn_vk_w2a8_dot_fits says no: VK_KHR_shader_integer_dot_product and its
 * feature, and subgroup arithmetic). The four give the same outputs where
 * the division does. */
bool bn_vk_w2a8_dot_fits(const bn_vk *vk);
bn_status bn_vk_w2a8_kernel(bn_vk *vk, bool exact_division, bool dot_product,
                            bn_vk_kernel **out, bn_error *err);

/* The same product taking eight activation rows a workgroup, each weight
 * word loaded once for all of them (the same outputs bit for bit; for a
 * pass of many rows): where the device has fp64 and integer dot products
 * (bn_vk_w2a8_rows_kernel_fits), the exact dot-product variant. Every
 * record function below takes either kernel. */
bool bn_vk_w2a8_rows_kernel_fits(const bn_vk *vk);
bn_status bn_vk_w2a8_rows_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err);

/* The same product as a tiled matrix product (shaders/w2a8_tiles.comp: a
 * workgroup 32 activation rows times 64 outputs through shared memory),
 * for passes of many rows; the same outputs bit for bit, on the devices
 * bn_vk_w2a8_rows_kernel_fits names. */
bn_status bn_vk_w2a8_tiles_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err);

/* The same tiles on the device's int8 subgroup matrix products
 * (shaders/w2a8_matrix.comp, VK_NV_cooperative_matrix): the same outputs
 * bit for bit, where bn_vk_w2a8_matrix_fits: the rows kernel's needs and
 * 16 x 16 x 32 products (bn_vulkan_device's int8_matrix). */
bool bn_vk_w2a8_matrix_fits(const bn_vk *vk);
bn_status bn_vk_w2a8_matrix_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err);

/* What a product does with its output v at y[i] (the CPU's operations,
 * each rounded once): stores it, or adds it (the residual add, y += v). */
typedef enum bn_vk_w2a8_epilogue {
    BN_VK_W2A8_STORE = 0,
    BN_VK_W2A8_ADD = 1,
} bn_vk_w2a8_epilogue;

/* y = W x for weights w (n rows of k, packed) and activation rows act_row
 * .. act_row + rows - 1 of x (rows of 4 * bn_vk_w2a8_words(k) words,
 * packed as above) with their scales act_scales[act_row ..]: what the
 * norm + int8 kernel writes (vk_norm.h). Row a's outputs go to y[a * n ..
 * (a + 1) * n) through the epilogue. Recorded into the open sequence
 * (bn_vk_begin). */
bn_status bn_vk_w2a8_record_rows(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                 bn_vk_buffer *x, bn_vk_buffer *act_scales, int64_t act_row,
                                 int64_t rows, bn_vk_buffer *y, int64_t n, int64_t k,
                                 float weight_scale, bn_vk_w2a8_epilogue epilogue,
                                 bn_error *err);

/* The feed-forward's gate and up products in one dispatch: w holds 2n rows
 * of k, the gate's n and then the up's n, and y[a * n + i] = (g g) u for
 * the gate's output g (weight scale gate_scale) and the up's u (up_scale)
 * of row i, g = max(g, 0) with NaN and -0 giving +0: the CPU's relu2_span
 * over the two products' outputs, each operation rounded once. A
 * workgroup takes four rows of each. Otherwise as bn_vk_w2a8_record_rows. */
bn_status bn_vk_w2a8_record_gate_up(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                    bn_vk_buffer *x, bn_vk_buffer *act_scales, int64_t act_row,
                                    int64_t rows, bn_vk_buffer *y, int64_t n, int64_t k,
                                    float gate_scale, float up_scale, bn_error *err);

/* A product that norms its input (shaders/w2a8_normed.glsl): y = W
 * q(norm(x)) for one row x of k floats, normed with weights norm_w (k
 * floats) and eps by the norm + int8 kernel's arithmetic (vk_norm.h: the
 * CPU's codes and scale bit for bit) inside the product's dispatch, then
 * stored or added (the residual add): every output what bn_vk_norm_record
 * followed by bn_vk_w2a8_record_rows gives, one dispatch instead of two.
 * Rows of up to BN_VK_NORMED_MAX_K values; where bn_vk_w2a8_normed_fits:
 * fp64, integer dot products and the norm's subgroup variant
 * (bn_vk_norm_subgroups). */
#define BN_VK_NORMED_MAX_K 8192
bool bn_vk_w2a8_normed_fits(const bn_vk *vk);
bn_status bn_vk_w2a8_normed_kernel(bn_vk *vk, bn_vk_kernel **out, bn_error *err);
bn_status bn_vk_w2a8_record_normed(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                   bn_vk_buffer *x, bn_vk_buffer *norm_w, float eps,
                                   bn_vk_buffer *y, int64_t n, int64_t k, float weight_scale,
                                   bn_vk_w2a8_epilogue epilogue, bn_error *err);

/* The attention's q, k and v products in one dispatch (replacing three
 * products and the RoPE + store kernel): w holds q's n_head * head_dim
 * rows, then k's and v's n_kv * head_dim each; activation row a's q goes
 * to q[a][n_head * head_dim] turned by RoPE as rope_heads does (rotate-half
 * pairs (j, j + half) of each head's first rope_dim values, with row
 * act_row + a's cos and sin at cs[(act_row + a) * rope_dim ..]: cos[0 ..
 * half) then sin[0 .. half)), its k (turned alike) and v to the cache row
 * that row act_row + a's sequence and position name through the block
 * tables (info [rows][2]: seq, pos; tables [n_seq][max_blocks], n_seq =
 * the tables buffer's size / (4 max_blocks)), in the layer's cache that
 * starts at float layer_off and holds cache_rows rows. A row that falls
 * outside the tables or the cache is not stored. Every value the CPU's,
 * as the products and rope_heads give them. */
typedef struct bn_vk_qkv {
    int n_head, n_kv, head_dim, rope_dim; /* rope_dim even, <= head_dim */
    float q_scale, k_scale, v_scale;
    bn_vk_buffer *info, *tables, *cs, *k_cache, *v_cache;
    int block_size, max_blocks;
    int64_t cache_rows, layer_off;
} bn_vk_qkv;
bn_status bn_vk_w2a8_record_qkv(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                bn_vk_buffer *x, bn_vk_buffer *act_scales, int64_t act_row,
                                int64_t rows, bn_vk_buffer *q, int64_t k, const bn_vk_qkv *s,
                                bn_error *err);

/* The same for one row x of k floats (a decode step's) normed with weights
 * norm_w and eps by the normed kernel (bn_vk_w2a8_normed_kernel) in the
 * product's dispatch, as bn_vk_w2a8_record_normed does: every value what
 * bn_vk_norm_record followed by bn_vk_w2a8_record_qkv gives; info, cs and
 * q as for activation row 0. */
bn_status bn_vk_w2a8_record_qkv_normed(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                       bn_vk_buffer *x, bn_vk_buffer *norm_w, float eps,
                                       bn_vk_buffer *q, int64_t k, const bn_vk_qkv *s,
                                       bn_error *err);

#endif
