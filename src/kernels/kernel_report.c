/* kernel_report.c - the kernels of this build as the public API reports
 * them (bn_kernel_query, bn_cuda_kernel_families): what `bitnet devices`
 * lists. The providers and their selection live in kernel_manager.c, the
 * CUDA kernels' lines in cuda/cuda_kernels_list.h beside the kernels. */
#include <stdio.h>
#include <string.h>

#include "bitnet.h"
#include "kernel_manager.h"
#ifdef BITNET_HAVE_CUDA
#include "cuda_kernels_list.h"
#endif

void bn_kernel_query(bn_kernel_report *report)
{
    if (!report)
        return;
    memset(report, 0, sizeof *report);
    const bn_kernel_provider *chosen = NULL;
    bn_error err;
    bn_error_clear(&err);
    report->selection_status = bn_kernel_select(&chosen, &err);
    if (report->selection_status != BN_OK)
        snprintf(report->selection_error, sizeof report->selection_error, "%s",
                 err.message[0] ? err.message : bn_status_str(report->selection_status));

    const bn_kernel_provider *const *list;
    const int n = bn_kernel_providers(&list);
    report->n_providers = n < BN_KERNEL_PROVIDERS_MAX ? n : BN_KERNEL_PROVIDERS_MAX;
    for (int i = 0; i < report->n_providers; i++) {
        bn_kernel_provider_info *p = &report->providers[i];
        snprintf(p->name, sizeof p->name, "%s", list[i]->name);
        p->priority = list[i]->priority;
        p->available = list[i]->is_available();
        p->device = list[i]->runs_on_device;
        p->selected = list[i] == chosen;
    }
}

#ifndef BITNET_HAVE_CUDA
static const char *const bn_cuda_kernel_list[] = {NULL};
#endif

const char *const *bn_cuda_kernel_families(void)
{
    return bn_cuda_kernel_list;
}
