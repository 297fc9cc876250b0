/* bn_cuda_query for builds without CUDA: says so, and still reports the
 * driver when one is installed, so the user knows a rebuild would help. */
#include "bitnet.h"
#include "cuda_driver_probe.h"

#include <stdio.h>
#include <string.h>

void bn_cuda_query(bn_cuda_report *report)
{
    if (!report)
        return;
    memset(report, 0, sizeof *report);
    char why[256];
    bool driver = bn_cuda_driver_probe(&report->driver_version, why, sizeof why);
    report->status = BN_ERR_UNSUPPORTED;
    snprintf(report->reason, sizeof report->reason, "this build of bitnet has no CUDA support%s",
             driver ? " (an NVIDIA driver is installed)" : "");
    snprintf(report->hint, sizeof report->hint,
             "rebuild with -DBITNET_CUDA=ON on a machine with the CUDA toolkit (nvcc)");
}
