/* test_util_vulkan.h - for the Vulkan tests: the first Vulkan device
 * opened, or exit 77 (skipped) with the reason. */
#ifndef BN_TEST_UTIL_VULKAN_H
#define BN_TEST_UTIL_VULKAN_H

#include "test_util.h"
#include "vk_context.h"

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

#endif
