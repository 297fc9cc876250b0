/* vk_w2a8.c - packing for and launching of shaders/w2a8_matvec.comp. */
#include "vk_w2a8.h"

#include <string.h>

#define BN_VK_W2A8_OUTPUTS 8 /* outputs a workgroup: shaders/w2a8_matvec.glsl */

extern const unsigned char bn_vk_spv_w2a8_matvec[], bn_vk_spv_w2a8_matvec_f64[],
    bn_vk_spv_w2a8_matvec_dot[], bn_vk_spv_w2a8_matvec_dot_f64[];
extern const size_t bn_vk_spv_w2a8_matvec_len, bn_vk_spv_w2a8_matvec_f64_len,
    bn_vk_spv_w2a8_matvec_dot_len, bn_vk_spv_w2a8_matvec_dot_f64_len;

/* The shader's push constants, in its order. */
typedef struct matvec_params {
    uint32_t n, words, act_row;
    float weight_scale;
    uint32_t rows, mode;
    float up_scale;
} matvec_params;

#define MODE_GATE_UP 2 /* the shader's third epilogue: bn_vk_w2a8_record_gate_up */

size_t bn_vk_w2a8_words(int64_t k) { return (size_t)((k + 15) / 16); }

void bn_vk_w2a8_pack(const int8_t *codes, int64_t n, int64_t k, uint32_t *out)
{
    const size_t words = bn_vk_w2a8_words(k);
    for (int64_t r = 0; r < n; r++)
        for (size_t j = 0; j < words; j++) {
            uint32_t word = 0;
            for (int i = 0; i < 16; i++) {
                const int64_t c = (int64_t)j * 16 + i;
                const uint32_t code = c < k ? (uint32_t)(codes[r * k + c] + 1) : 1u;
                word |= code << (2 * i);
            }
            out[(size_t)r * words + j] = word;
        }
}

bn_status bn_vk_w2a8_kernel(bn_vk *vk, bool exact_division, bool dot_product,
                            bn_vk_kernel **out, bn_error *err)
{
    const bn_vulkan_device *d = bn_vk_device(vk);
    if (exact_division && !d->fp64)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s has no fp64 for the exact division", d->name);
    if (dot_product && !d->integer_dot_product)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s has no integer dot products", d->name);
    /* The four variants: {portable, dot} x {device division, exact}. */
    static const struct {
        const char *name;
        const unsigned char *spirv;
        const size_t *len;
    } variants[2][2] = {
        {{"w2a8_matvec", bn_vk_spv_w2a8_matvec, &bn_vk_spv_w2a8_matvec_len},
         {"w2a8_matvec_f64", bn_vk_spv_w2a8_matvec_f64, &bn_vk_spv_w2a8_matvec_f64_len}},
        {{"w2a8_matvec_dot", bn_vk_spv_w2a8_matvec_dot, &bn_vk_spv_w2a8_matvec_dot_len},
         {"w2a8_matvec_dot_f64", bn_vk_spv_w2a8_matvec_dot_f64,
          &bn_vk_spv_w2a8_matvec_dot_f64_len}},
    };
    const int v = dot_product ? 1 : 0, e = exact_division ? 1 : 0;
    return bn_vk_kernel_create(vk, variants[v][e].name, variants[v][e].spirv, *variants[v][e].len,
                               4, sizeof(matvec_params), out, err);
}

/* A product of n outputs a row read from w_rows rows (n, or 2n for the
 * gate and up), outputs a workgroup per_group. */
static bn_status record(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w, bn_vk_buffer *x,
                        bn_vk_buffer *act_scales, int64_t act_row, int64_t rows, bn_vk_buffer *y,
                        int64_t n, int64_t w_rows, int64_t k, float weight_scale, float up_scale,
                        int mode, int per_group, bn_error *err)
{
    const size_t words = bn_vk_w2a8_words(k);
    if (n < 1 || k < 1 || act_row < 0 || rows < 1 || (uint64_t)w_rows * words > UINT32_MAX ||
        (uint64_t)n * (uint64_t)rows > UINT32_MAX || w->size < (VkDeviceSize)w_rows * words * 4 ||
        x->size < (VkDeviceSize)(act_row + rows) * words * 16 ||
        act_scales->size < (VkDeviceSize)(act_row + rows) * sizeof(float) ||
        y->size < (VkDeviceSize)(n * rows) * sizeof(float))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan W2A8: %lld x %lld (activation rows %lld..%lld) does not fit "
                            "its buffers",
                            (long long)w_rows, (long long)k, (long long)act_row,
                            (long long)(act_row + rows - 1));
    const matvec_params p = {(uint32_t)n,    (uint32_t)words, (uint32_t)act_row, weight_scale,
                             (uint32_t)rows, (uint32_t)mode,  up_scale};
    bn_vk_buffer *const buffers[4] = {w, x, y, act_scales};
    return bn_vk_dispatch_groups(vk, kernel, buffers, &p,
                                 (uint64_t)((n + per_group - 1) / per_group) * (uint64_t)rows,
                                 err);
}

bn_status bn_vk_w2a8_record_rows(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                 bn_vk_buffer *x, bn_vk_buffer *act_scales, int64_t act_row,
                                 int64_t rows, bn_vk_buffer *y, int64_t n, int64_t k,
                                 float weight_scale, bn_vk_w2a8_epilogue epilogue,
                                 bn_error *err)
{
    if (epilogue != BN_VK_W2A8_STORE && epilogue != BN_VK_W2A8_ADD)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan W2A8: no epilogue %d", (int)epilogue);
    return record(vk, kernel, w, x, act_scales, act_row, rows, y, n, n, k, weight_scale, 0.0f,
                  (int)epilogue, BN_VK_W2A8_OUTPUTS, err);
}

bn_status bn_vk_w2a8_record_gate_up(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                    bn_vk_buffer *x, bn_vk_buffer *act_scales, int64_t act_row,
                                    int64_t rows, bn_vk_buffer *y, int64_t n, int64_t k,
                                    float gate_scale, float up_scale, bn_error *err)
{
    if (n > INT64_MAX / 2)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan W2A8: a gate of %lld rows", (long long)n);
    return record(vk, kernel, w, x, act_scales, act_row, rows, y, n, 2 * n, k, gate_scale,
                  up_scale, MODE_GATE_UP, BN_VK_W2A8_OUTPUTS / 2, err);
}
