/*
 * vk_backend.h - what the Vulkan backend (vk_backend.c) offers beside the
 * engine's interface: the time each kernel takes in one decode pass or one
 * prompt chunk, by the device's timestamps (bitnet bench e2e --device
 * vulkan).
 */
#ifndef BN_VK_BACKEND_H
#define BN_VK_BACKEND_H

#include <stdint.h>

#include "bitnet.h"

#define BN_VK_PROFILE_KERNELS 16

typedef struct bn_vk_pass_profile {
    int n;                                     /* kernels that ran       */
    char names[BN_VK_PROFILE_KERNELS][32];     /* in order of first run  */
    double us[BN_VK_PROFILE_KERNELS];          /* each one's total       */
    int dispatches[BN_VK_PROFILE_KERNELS];
    double total_us;                           /* the pass's dispatches  */
    /* The second layer's dispatches one by one, in order (0 when the pass
     * has fewer than two layers). */
    int layer_n;
    char layer_names[BN_VK_PROFILE_KERNELS][32];
    double layer_us[BN_VK_PROFILE_KERNELS];
} bn_vk_pass_profile;

/* One pass of tokens[0 .. n) at positions pos .. pos + n - 1 (pos at most
 * the positions filled, which it then fills to pos + n), timed: n = 1 a
 * decode step with the head, n up to BN_VK_PROFILE_ROWS a prompt chunk
 * without it. backend is the engine's handle (bn_engine_backend_handle(e,
 * "vulkan")). BN_ERR_UNSUPPORTED where the device's queue has no
 * timestamps. */
#define BN_VK_PROFILE_ROWS 128 /* the rows a prompt pass takes at most */
bn_status bn_vk_backend_profile_pass(void *backend, const int32_t *tokens, int64_t n, int64_t pos,
                                     bn_vk_pass_profile *out, bn_error *err);

#endif
