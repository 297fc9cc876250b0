/* bn_vulkan_query for builds without the Vulkan compute layer: says so. */
#include "bitnet.h"

#include <stdio.h>
#include <string.h>

void bn_vulkan_query(bn_vulkan_report *report)
{
    if (!report)
        return;
    memset(report, 0, sizeof *report);
    snprintf(report->reason, sizeof report->reason,
             "this build of bitnet has no Vulkan support (it needs the Vulkan headers and "
             "glslc: scripts/install-deps.sh, then -DBITNET_VULKAN=ON)");
}
