/* With CUDA_VISIBLE_DEVICES empty, the CUDA query must report no device and
 * say why (the variable, when a driver exists; the driver, when none does),
 * on any machine. Runs in its own process: the variable must be set before
 * the CUDA runtime starts. */
#include <stdlib.h>

#include "bitnet.h"
#include "test_util.h"

static bn_cuda_report report;

int main(void)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    bn_cuda_query(&report);
    CHECK(report.status != BN_OK);
    CHECK(report.device_count == 0);
    CHECK(report.reason[0] != '\0');
    CHECK(report.hint[0] != '\0');
    if (report.status == BN_ERR_NO_DEVICE) {
        CHECK_STR_CONTAINS(report.reason, "CUDA_VISIBLE_DEVICES");
    } else {
        /* No driver here, or a build without CUDA. */
        CHECK(report.status == BN_ERR_DRIVER || report.status == BN_ERR_UNSUPPORTED);
    }
    printf("status=%s reason=%s\nhint=%s\n", bn_status_str(report.status), report.reason,
           report.hint);

    bn_config c;
    bn_config_defaults(&c);
    static bn_gpu_info info;
    CHECK(bn_gpu_detect(&c, &info, NULL) == BN_OK);
    CHECK(!info.preflight_ok);
    if (report.status == BN_ERR_NO_DEVICE)
        CHECK_STR_CONTAINS(info.preflight, "CUDA_VISIBLE_DEVICES");
    TEST_EXIT();
}
