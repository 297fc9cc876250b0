/*
 * vk_context.h - a Vulkan compute device for the Vulkan backend: the
 * loader opened at run time, one device with a compute queue, storage
 * buffers, compute pipelines built from the embedded SPIR-V, and
 * dispatches run to completion.
 *
 * The library links no Vulkan library: vk_context.c opens libvulkan.so.1
 * and fetches every entry point it uses, so a build with Vulkan still
 * starts where there is no loader, and says why Vulkan is unavailable.
 *
 * Thread safety: one bn_vk is used by one thread at a time.
 */
#ifndef BN_VK_CONTEXT_H
#define BN_VK_CONTEXT_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

/* Up to max devices into out (bitnet.h's description of a device); the
 * number found, or -1 with the reason in why when Vulkan cannot be reached
 * (no loader, no driver). */
int bn_vk_devices(bn_vulkan_device *out, int max, char *why, size_t why_size);

typedef struct bn_vk bn_vk;

/* Opens device `index` (of bn_vk_devices' list): BN_ERR_DRIVER without a
 * loader or driver, BN_ERR_NO_DEVICE when there is no such device or it
 * has no compute queue, BN_ERR_GPU when setting it up fails. */
bn_status bn_vk_open(int index, bn_vk **out, bn_error *err);
void bn_vk_close(bn_vk *vk);
const bn_vulkan_device *bn_vk_device(const bn_vk *vk);

/* A storage buffer in device memory (device-local where the device has
 * it), written and read through a staging copy. */
typedef struct bn_vk_buffer {
    VkBuffer buffer;
    VkDeviceMemory memory;
    VkDeviceSize size;
} bn_vk_buffer;

/* BN_ERR_GPU_OUT_OF_MEMORY when the device cannot hold size bytes. */
bn_status bn_vk_buffer_create(bn_vk *vk, VkDeviceSize size, bn_vk_buffer *out, bn_error *err);
void bn_vk_buffer_free(bn_vk *vk, bn_vk_buffer *b);
bn_status bn_vk_write(bn_vk *vk, bn_vk_buffer *dst, const void *src, size_t n, bn_error *err);
bn_status bn_vk_read(bn_vk *vk, const bn_vk_buffer *src, void *dst, size_t n, bn_error *err);
/* n bytes from byte `offset` of src. */
bn_status bn_vk_read_at(bn_vk *vk, const bn_vk_buffer *src, size_t offset, void *dst, size_t n,
                        bn_error *err);

/* A buffer in host-visible, coherent memory, mapped at *map while it
 * lives (bn_vk_buffer_free unmaps it): the host writes a pass's inputs
 * there and reads its outputs, and the pass's own sequence copies them
 * (bn_vk_copy_record), so a pass is one submission. */
bn_status bn_vk_host_buffer_create(bn_vk *vk, VkDeviceSize size, bn_vk_buffer *out, void **map,
                                   bn_error *err);

/* A compute pipeline: SPIR-V (len bytes, as embedded) whose bindings 0 ..
 * n_buffers - 1 (at most BN_VK_MAX_BUFFERS) of set 0 are storage buffers,
 * with push_bytes of push constants; BN_ERR_UNSUPPORTED where the device
 * lets a kernel bind fewer storage buffers. */
#define BN_VK_MAX_BUFFERS 12
typedef struct bn_vk_kernel bn_vk_kernel;
bn_status bn_vk_kernel_create(bn_vk *vk, const char *name, const unsigned char *spirv,
                              size_t len, int n_buffers, uint32_t push_bytes,
                              bn_vk_kernel **out, bn_error *err);
void bn_vk_kernel_free(bn_vk *vk, bn_vk_kernel *k);
/* The name it was created with. */
const char *bn_vk_kernel_name(const bn_vk_kernel *k);

/* A sequence of dispatches recorded into one command buffer and run at
 * once, each after the ones before it have finished writing: begin,
 * dispatch (k over groups_x x groups_y workgroups with its n_buffers
 * buffers and push constants) up to BN_VK_MAX_DISPATCHES times, submit
 * (runs and waits). No copy (bn_vk_write / bn_vk_read) while one is open;
 * copies inside it: bn_vk_copy_record. */
#define BN_VK_MAX_DISPATCHES 1024
bn_status bn_vk_begin(bn_vk *vk, bn_error *err);
bn_status bn_vk_dispatch(bn_vk *vk, bn_vk_kernel *k, bn_vk_buffer *const *buffers,
                         const void *push, uint32_t groups_x, uint32_t groups_y, bn_error *err);
/* groups workgroups laid out as a grid of at most 65535 columns, which
 * the shaders number gl_WorkGroupID.x + gl_WorkGroupID.y *
 * gl_NumWorkGroups.x (BN_ERR_INVALID_ARGUMENT past 65535 x 65535; 0
 * records nothing); otherwise as bn_vk_dispatch. */
bn_status bn_vk_dispatch_groups(bn_vk *vk, bn_vk_kernel *k, bn_vk_buffer *const *buffers,
                                const void *push, uint64_t groups, bn_error *err);
bn_status bn_vk_submit(bn_vk *vk, bn_error *err);
/* A sequence kept to run again (a decode step is the same dispatches every
 * token; only its buffers' contents change): bn_vk_submit_keep ends and
 * runs the open sequence as bn_vk_submit does, then keeps its command
 * buffer and descriptor sets (*out NULL, nothing kept, while timing is on);
 * bn_vk_replay runs it again and waits. The buffers it names must outlive
 * it; free it before the device. */
typedef struct bn_vk_kept bn_vk_kept;
bn_status bn_vk_submit_keep(bn_vk *vk, bn_vk_kept **out, bn_error *err);
bn_status bn_vk_replay(bn_vk *vk, bn_vk_kept *kept, bn_error *err);
void bn_vk_kept_free(bn_vk *vk, bn_vk_kept *kept);

/* n bytes of src from byte src_at into dst at dst_at, recorded into the
 * open sequence: after everything recorded before it has written, and
 * before anything recorded after it reads; the host may read a host
 * buffer (bn_vk_host_buffer_create) it copied into once the sequence has
 * been submitted (or replayed). */
bn_status bn_vk_copy_record(bn_vk *vk, const bn_vk_buffer *src, VkDeviceSize src_at,
                            const bn_vk_buffer *dst, VkDeviceSize dst_at, size_t n,
                            bn_error *err);

/* The next dispatch reads nothing the dispatches since the last barrier
 * wrote, and writes nothing they use: it is recorded without a barrier
 * before it, so the device may run it beside them (dev/vulkan's labs time
 * chains of dispatches so). */
void bn_vk_next_independent(bn_vk *vk);
/* The dispatches recorded into the open sequence (or the last one). */
int bn_vk_recorded(const bn_vk *vk);

/* Timing by the device's timestamps: with `on`, each sequence begun after
 * this records the time each dispatch took (from the end of the one
 * before, barrier included); bn_vk_profile_read gives the last submitted
 * sequence's, up to max, with the kernels' names (valid while the kernels
 * live). BN_ERR_UNSUPPORTED where the queue has no timestamps. Timing
 * slows nothing but adds a write after each dispatch. */
bn_status bn_vk_profile(bn_vk *vk, bool on, bn_error *err);
/* Whether timing is on (bn_vk_profile). */
bool bn_vk_profiling(const bn_vk *vk);
int bn_vk_profile_read(bn_vk *vk, const char **names, double *us, int max, bn_error *err);

#endif
