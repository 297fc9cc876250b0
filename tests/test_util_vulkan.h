/* test_util_vulkan.h - for the Vulkan tests: the first Vulkan device
 * opened, or exit 77 (skipped) with the reason; one W2A8 product recorded
 * or run alone. */
#ifndef BN_TEST_UTIL_VULKAN_H
#define BN_TEST_UTIL_VULKAN_H

#include "test_util.h"
#include "vk_context.h"
#include "vk_w2a8.h"

/* Opens device 0 and says which it is; *count gets the devices listed. */
static inline bn_vk *test_require_vulkan(int *count)
{
    bn_vulkan_device devs[8];
    char why[256] = "";
    const int n = bn_vk_devices(devs, 8, why, sizeof why);
    if (n < 0)
        TEST_SKIP("%s", why);
    if (n == 0)
        TEST_SKIP("no Vulkan device (Debian's mesa-vulkan-drivers has a CPU one, lavapipe)");
    bn_vk *vk = NULL;
    bn_error err;
    if (bn_vk_open(0, &vk, &err) != BN_OK)
        TEST_SKIP("Vulkan device 0 (%s) cannot be opened: %s", devs[0].name, err.message);
    printf("device 0: %s (%s), Vulkan %u.%u, fp64 %s\n", devs[0].name, devs[0].type,
           VK_API_VERSION_MAJOR(devs[0].api_version), VK_API_VERSION_MINOR(devs[0].api_version),
           devs[0].fp64 ? "yes" : "no");
    *count = n;
    return vk;
}

/* y[0 .. n) = W x for activation row act_row, stored as it is: recorded
 * into the open sequence, or (test_vk_w2a8_matvec) as a sequence of its
 * own, waited for. */
static inline bn_status test_vk_w2a8_record(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                            bn_vk_buffer *x, bn_vk_buffer *act_scales,
                                            int64_t act_row, bn_vk_buffer *y, int64_t n,
                                            int64_t k, float weight_scale, bn_error *err)
{
    return bn_vk_w2a8_record_rows(vk, kernel, w, x, act_scales, act_row, 1, y, n, k, weight_scale,
                                  BN_VK_W2A8_STORE, err);
}

static inline bn_status test_vk_w2a8_matvec(bn_vk *vk, bn_vk_kernel *kernel, bn_vk_buffer *w,
                                            bn_vk_buffer *x, bn_vk_buffer *act_scales,
                                            int64_t act_row, bn_vk_buffer *y, int64_t n,
                                            int64_t k, float weight_scale, bn_error *err)
{
    bn_status st = bn_vk_begin(vk, err);
    if (st != BN_OK)
        return st;
    st = test_vk_w2a8_record(vk, kernel, w, x, act_scales, act_row, y, n, k, weight_scale, err);
    bn_error closing;
    const bn_status end = bn_vk_submit(vk, st == BN_OK ? err : &closing);
    return st != BN_OK ? st : end;
}

/* tables[0 .. n) = 0 .. n - 1 shuffled: block tables whose blocks lie in
 * no order. */
static inline void test_shuffled_tables(int32_t *tables, int n)
{
    for (int i = 0; i < n; i++)
        tables[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)test_rand_range(0, i), t = tables[i];
        tables[i] = tables[j];
        tables[j] = t;
    }
}

#endif
