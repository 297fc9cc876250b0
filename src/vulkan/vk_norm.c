/* vk_norm.c - launching shaders/norm_quantize*.comp: the fp64 variants, the
 * CPU's codes bit for bit, where the device has fp64 (with subgroups where
 * it can); else the float one. */
#include "vk_norm.h"

#include "vk_w2a8.h"

extern const unsigned char bn_vk_spv_norm_quantize[], bn_vk_spv_norm_quantize_f64[],
    bn_vk_spv_norm_quantize_f64_sg[];
extern const size_t bn_vk_spv_norm_quantize_len, bn_vk_spv_norm_quantize_f64_len,
    bn_vk_spv_norm_quantize_f64_sg_len;

/* The shader's push constants, in its order. */
typedef struct norm_params {
    uint32_t rows, n, words;
    float eps;
} norm_params;

bool bn_vk_norm_subgroups(const bn_vk *vk)
{
    const bn_vulkan_device *d = bn_vk_device(vk);
    return d->fp64 && d->subgroup_arithmetic && d->subgroup_size >= 4 &&
           d->max_workgroup_invocations >= 512;
}

bn_status bn_vk_norm_kernel(bn_vk *vk, bool subgroups, bn_vk_kernel **out, bn_error *err)
{
    if (subgroups && !bn_vk_norm_subgroups(vk))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s cannot run the norm's subgroup variant (it needs fp64, "
                            "subgroup arithmetic and workgroups of 512)",
                            bn_vk_device(vk)->name);
    const bool fp64 = bn_vk_device(vk)->fp64;
    const unsigned char *spirv = subgroups ? bn_vk_spv_norm_quantize_f64_sg
                                 : fp64    ? bn_vk_spv_norm_quantize_f64
                                           : bn_vk_spv_norm_quantize;
    const size_t len = subgroups ? bn_vk_spv_norm_quantize_f64_sg_len
                       : fp64    ? bn_vk_spv_norm_quantize_f64_len
                                 : bn_vk_spv_norm_quantize_len;
    return bn_vk_kernel_create(vk, "norm_quantize", spirv, len, 5, sizeof(norm_params), out,
                               err);
}

bn_status bn_vk_norm_record(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *x, bn_vk_buffer *w,
                            bn_vk_buffer *codes, bn_vk_buffer *scales, bn_vk_buffer *sums,
                            int64_t rows, int64_t n, float eps, bn_error *err)
{
    const uint64_t words = 4 * (uint64_t)bn_vk_w2a8_words(n);
    if (rows < 1 || n < 1 || (uint64_t)rows * (uint64_t)n > UINT32_MAX ||
        x->size < (VkDeviceSize)(rows * n) * sizeof(float) ||
        w->size < (VkDeviceSize)n * sizeof(float) || codes->size < rows * words * 4 ||
        scales->size < (VkDeviceSize)rows * sizeof(float) ||
        sums->size < (VkDeviceSize)rows * sizeof(int32_t))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan norm: %lld rows of %lld do not fit their buffers",
                            (long long)rows, (long long)n);
    const norm_params p = {(uint32_t)rows, (uint32_t)n, (uint32_t)words, eps};
    bn_vk_buffer *const buffers[5] = {x, w, codes, scales, sums};
    return bn_vk_dispatch_groups(vk, kernel, buffers, &p, (uint64_t)rows, err);
}
