/*
 * vk_context.c - the Vulkan device of vk_context.h: the loader opened with
 * dlopen, entry points fetched through vkGetInstanceProcAddr /
 * vkGetDeviceProcAddr into one table, one compute queue, and work submitted
 * one command buffer at a time and waited for with a fence.
 */
#include "vk_context.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- entry points ------------------------------------------------------------ */

#define BN_VK_INSTANCE_FNS(X)                                                                  \
    X(vkDestroyInstance)                                                                       \
    X(vkEnumeratePhysicalDevices)                                                              \
    X(vkGetPhysicalDeviceProperties)                                                           \
    X(vkGetPhysicalDeviceProperties2)                                                          \
    X(vkGetPhysicalDeviceFeatures)                                                             \
    X(vkGetPhysicalDeviceFeatures2)                                                            \
    X(vkGetPhysicalDeviceMemoryProperties)                                                     \
    X(vkGetPhysicalDeviceQueueFamilyProperties)                                                \
    X(vkEnumerateDeviceExtensionProperties)                                                    \
    X(vkCreateDevice)                                                                          \
    X(vkGetDeviceProcAddr)

#define BN_VK_DEVICE_FNS(X)                                                                    \
    X(vkDestroyDevice)                                                                         \
    X(vkGetDeviceQueue)                                                                        \
    X(vkCreateBuffer)                                                                          \
    X(vkDestroyBuffer)                                                                         \
    X(vkGetBufferMemoryRequirements)                                                           \
    X(vkAllocateMemory)                                                                        \
    X(vkFreeMemory)                                                                            \
    X(vkBindBufferMemory)                                                                      \
    X(vkMapMemory)                                                                             \
    X(vkUnmapMemory)                                                                           \
    X(vkCreateShaderModule)                                                                    \
    X(vkDestroyShaderModule)                                                                   \
    X(vkCreateDescriptorSetLayout)                                                             \
    X(vkDestroyDescriptorSetLayout)                                                            \
    X(vkCreatePipelineLayout)                                                                  \
    X(vkDestroyPipelineLayout)                                                                 \
    X(vkCreateComputePipelines)                                                                \
    X(vkDestroyPipeline)                                                                       \
    X(vkCreateDescriptorPool)                                                                  \
    X(vkDestroyDescriptorPool)                                                                 \
    X(vkResetDescriptorPool)                                                                   \
    X(vkAllocateDescriptorSets)                                                                \
    X(vkUpdateDescriptorSets)                                                                  \
    X(vkCreateCommandPool)                                                                     \
    X(vkDestroyCommandPool)                                                                    \
    X(vkAllocateCommandBuffers)                                                                \
    X(vkFreeCommandBuffers)                                                                    \
    X(vkResetCommandBuffer)                                                                    \
    X(vkBeginCommandBuffer)                                                                    \
    X(vkEndCommandBuffer)                                                                      \
    X(vkCmdBindPipeline)                                                                       \
    X(vkCmdBindDescriptorSets)                                                                 \
    X(vkCmdPushConstants)                                                                      \
    X(vkCmdDispatch)                                                                           \
    X(vkCmdCopyBuffer)                                                                         \
    X(vkCmdPipelineBarrier)                                                                    \
    X(vkQueueSubmit)                                                                           \
    X(vkCreateFence)                                                                           \
    X(vkDestroyFence)                                                                          \
    X(vkWaitForFences)                                                                         \
    X(vkGetFenceStatus)                                                                        \
    X(vkResetFences)                                                                           \
    X(vkCreateQueryPool)                                                                       \
    X(vkDestroyQueryPool)                                                                      \
    X(vkCmdResetQueryPool)                                                                     \
    X(vkCmdWriteTimestamp)                                                                     \
    X(vkGetQueryPoolResults)

#define BN_VK_DECLARE(name) PFN_##name name;
typedef struct vk_fns {
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    PFN_vkCreateInstance vkCreateInstance;
    BN_VK_INSTANCE_FNS(BN_VK_DECLARE)
    BN_VK_DEVICE_FNS(BN_VK_DECLARE)
    /* Optional (NULL where the driver lacks VK_NV_cooperative_matrix). */
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV coopmat_properties;
} vk_fns;

/* An instance over the loader: what listing devices and opening one share. */
typedef struct vk_instance {
    void *lib;
    VkInstance instance;
    vk_fns fn;
} vk_instance;

/* Opens the loader and an instance; on failure why says what is missing,
 * and the caller still calls instance_close. */
static bool instance_open(vk_instance *vi, char *why, size_t why_size)
{
    memset(vi, 0, sizeof *vi);
    vi->lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!vi->lib)
        vi->lib = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
    if (!vi->lib) {
        snprintf(why, why_size, "no Vulkan loader (libvulkan.so.1: %s)", dlerror());
        return false;
    }
    vk_fns *f = &vi->fn;
    f->vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(vi->lib, "vkGetInstanceProcAddr");
    f->vkCreateInstance = f->vkGetInstanceProcAddr
                              ? (PFN_vkCreateInstance)f->vkGetInstanceProcAddr(
                                    NULL, "vkCreateInstance")
                              : NULL;
    if (!f->vkCreateInstance) {
        snprintf(why, why_size, "the Vulkan loader lacks vkGetInstanceProcAddr");
        return false;
    }
    const VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                                   .pApplicationName = "bitnet",
                                   .pEngineName = "bitnet",
                                   .apiVersion = VK_API_VERSION_1_1};
    const VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                     .pApplicationInfo = &app};
    const VkResult rc = f->vkCreateInstance(&ci, NULL, &vi->instance);
    if (rc != VK_SUCCESS) {
        snprintf(why, why_size, "no Vulkan 1.1 driver (vkCreateInstance returned %d)", (int)rc);
        vi->instance = VK_NULL_HANDLE;
        return false;
    }
#define BN_VK_LOAD_INSTANCE(name)                                                              \
    f->name = (PFN_##name)f->vkGetInstanceProcAddr(vi->instance, #name);                        \
    if (!f->name) {                                                                            \
        snprintf(why, why_size, "the Vulkan driver lacks %s", #name);                          \
        return false;                                                                          \
    }
    BN_VK_INSTANCE_FNS(BN_VK_LOAD_INSTANCE)
    f->coopmat_properties =
        (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)f->vkGetInstanceProcAddr(
            vi->instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
    return true;
}

static void instance_close(vk_instance *vi)
{
    if (vi->instance && vi->fn.vkDestroyInstance)
        vi->fn.vkDestroyInstance(vi->instance, NULL);
    if (vi->lib)
        dlclose(vi->lib);
    memset(vi, 0, sizeof *vi);
}

/* ---- devices ----------------------------------------------------------------- */

static bool has_extension(const vk_fns *f, VkPhysicalDevice pd, const char *name)
{
    uint32_t n = 0;
    if (f->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkExtensionProperties *ext = calloc(n, sizeof *ext);
    bool found = false;
    if (ext && f->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, ext) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(ext[i].extensionName, name) == 0;
    free(ext);
    return found;
}

/* The extensions the W2A8 matrix kernel (shaders/w2a8_matrix.comp) needs
 * enabled at vkCreateDevice: subgroup matrix products, the memory model
 * their scopes are written in, and 8-bit integers in shaders. */
static const char *const kMatrixExtensions[] = {
    "VK_NV_cooperative_matrix", "VK_KHR_vulkan_memory_model", "VK_KHR_shader_float16_int8"};
#define N_MATRIX_EXTENSIONS 3

/* The int8 x int8 -> int32 subgroup product the matrix kernel is built
 * for: M, N, K. */
static const uint32_t kMatrixShape[3] = {16, 16, 32};

/* d->int8_matrix: kMatrixShape where the device offers it for int8
 * operands and int32 sums over a subgroup of 32, with every extension and
 * feature the kernel needs; zeros otherwise. */
static void int8_matrix_shape(const vk_fns *f, VkPhysicalDevice pd, bn_vulkan_device *d)
{
    memset(d->int8_matrix, 0, sizeof d->int8_matrix);
    if (!f->coopmat_properties || d->subgroup_size != 32)
        return;
    for (int i = 0; i < N_MATRIX_EXTENSIONS; i++)
        if (!has_extension(f, pd, kMatrixExtensions[i]))
            return;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
    VkPhysicalDeviceVulkanMemoryModelFeatures mm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, .pNext = &cm};
    VkPhysicalDeviceShaderFloat16Int8Features i8 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, .pNext = &mm};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &i8};
    f->vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (!cm.cooperativeMatrix || !mm.vulkanMemoryModel || !i8.shaderInt8)
        return;
    uint32_t n = 0;
    if (f->coopmat_properties(pd, &n, NULL) != VK_SUCCESS || n == 0)
        return;
    VkCooperativeMatrixPropertiesNV *props = calloc(n, sizeof *props);
    if (!props)
        return;
    for (uint32_t j = 0; j < n; j++)
        props[j].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
    if (f->coopmat_properties(pd, &n, props) == VK_SUCCESS)
        for (uint32_t j = 0; j < n; j++) {
            const VkCooperativeMatrixPropertiesNV *c = &props[j];
            if (c->MSize == kMatrixShape[0] && c->NSize == kMatrixShape[1] &&
                c->KSize == kMatrixShape[2] && c->AType == VK_COMPONENT_TYPE_SINT8_NV &&
                c->BType == VK_COMPONENT_TYPE_SINT8_NV && c->CType == VK_COMPONENT_TYPE_SINT32_NV &&
                c->DType == VK_COMPONENT_TYPE_SINT32_NV && c->scope == VK_SCOPE_SUBGROUP_NV)
                memcpy(d->int8_matrix, kMatrixShape, sizeof d->int8_matrix);
        }
    free(props);
}

static void describe(const vk_fns *f, VkPhysicalDevice pd, bn_vulkan_device *d)
{
    VkPhysicalDeviceSubgroupProperties sub = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                      .pNext = &sub};
    f->vkGetPhysicalDeviceProperties2(pd, &p2);
    const VkPhysicalDeviceProperties *p = &p2.properties;
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", p->deviceName);
    snprintf(d->type, sizeof d->type, "%s",
             p->deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU     ? "discrete"
             : p->deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? "integrated"
             : p->deviceType == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU    ? "virtual"
             : p->deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU            ? "cpu"
                                                                       : "other");
    d->api_version = p->apiVersion;
    d->max_workgroup_invocations = p->limits.maxComputeWorkGroupInvocations;
    d->max_shared_bytes = p->limits.maxComputeSharedMemorySize;
    d->max_storage_buffer_range = p->limits.maxStorageBufferRange;
    d->subgroup_size = sub.subgroupSize;
    d->subgroup_arithmetic = (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                             (sub.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) &&
                             (sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
    VkPhysicalDeviceMemoryProperties mp;
    f->vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
        if ((mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) &&
            mp.memoryHeaps[h].size > d->device_local_bytes)
            d->device_local_bytes = mp.memoryHeaps[h].size;
    VkPhysicalDeviceFeatures feat;
    f->vkGetPhysicalDeviceFeatures(pd, &feat);
    d->fp64 = feat.shaderFloat64 == VK_TRUE;
    /* Integer dot products: the extension and its feature (the W2A8
     * kernels' dot variants need both enabled at vkCreateDevice). */
    if (has_extension(f, pd, "VK_KHR_shader_integer_dot_product")) {
        VkPhysicalDeviceShaderIntegerDotProductFeatures dot = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
        VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                        .pNext = &dot};
        f->vkGetPhysicalDeviceFeatures2(pd, &f2);
        d->integer_dot_product = dot.shaderIntegerDotProduct == VK_TRUE;
    }
    int8_matrix_shape(f, pd, d);
}

/* The physical devices, at most max of them. */
static int physical_devices(const vk_instance *vi, VkPhysicalDevice *pds, int max)
{
    uint32_t n = 0;
    if (vi->fn.vkEnumeratePhysicalDevices(vi->instance, &n, NULL) != VK_SUCCESS)
        return 0;
    if (n > (uint32_t)max)
        n = (uint32_t)max;
    const VkResult rc = vi->fn.vkEnumeratePhysicalDevices(vi->instance, &n, pds);
    return rc == VK_SUCCESS || rc == VK_INCOMPLETE ? (int)n : 0;
}

#define BN_VK_MAX_DEVICES 16

int bn_vk_devices(bn_vulkan_device *out, int max, char *why, size_t why_size)
{
    vk_instance vi;
    if (!instance_open(&vi, why, why_size)) {
        instance_close(&vi);
        return -1;
    }
    VkPhysicalDevice pds[BN_VK_MAX_DEVICES];
    const int n = physical_devices(&vi, pds, BN_VK_MAX_DEVICES);
    for (int i = 0; i < n && i < max; i++)
        describe(&vi.fn, pds[i], &out[i]);
    instance_close(&vi);
    return n;
}

void bn_vulkan_query(bn_vulkan_report *report)
{
    if (!report)
        return;
    memset(report, 0, sizeof *report);
    report->compiled = true;
    const int n = bn_vk_devices(report->devices, BN_VULKAN_MAX_DEVICES, report->reason,
                                sizeof report->reason);
    report->device_count = n < 0 ? 0 : n > BN_VULKAN_MAX_DEVICES ? BN_VULKAN_MAX_DEVICES : n;
    if (n == 0)
        snprintf(report->reason, sizeof report->reason, "the Vulkan loader found no device");
}

/* ---- one opened device ------------------------------------------------------- */

struct bn_vk {
    vk_instance vi;
    bn_vulkan_device info;
    VkPhysicalDevice pd;
    VkPhysicalDeviceMemoryProperties mem;
    VkDevice device;
    VkQueue queue;
    uint32_t queue_family;
    VkCommandPool pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkDescriptorPool descriptors; /* reset when a sequence begins */
    bool recording;               /* a sequence is open (bn_vk_begin)  */
    int dispatches;               /* recorded in it so far             */
    bool independent;             /* the next dispatch needs no barrier */
    bool after_copy;              /* a copy was recorded since the last dispatch */
    /* Timing (bn_vk_profile): a timestamp before a sequence's first
     * dispatch and after each; the kernels' names in order. */
    VkQueryPool timer;
    bool timing;
    /* The host-visible buffer copies go through, kept and grown as needed
     * up to 64 MiB (making one for each copy of a pass's rows cost more
     * than the copy). */
    bn_vk_buffer stage;
    void *stage_map;
    bool timestamps;              /* the queue family has timestamps   */
    bool poll;                    /* a GPU: its fences are polled (run_wait) */
    double ns_per_tick;
    const char *timed[BN_VK_MAX_DISPATCHES];
};

struct bn_vk_kernel {
    char name[32];
    int n_buffers;
    uint32_t push_bytes;
    VkShaderModule module;
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout layout;
    VkPipeline pipeline;
};

const char *bn_vk_kernel_name(const bn_vk_kernel *k) { return k->name; }

static bn_status vk_fail(bn_error *err, bn_status st, VkResult rc, const char *what)
{
    return bn_error_set(err, st, NULL, "Vulkan: %s failed (VkResult %d)", what, (int)rc);
}

#define VK_TRY(err, call, what)                                                                \
    do {                                                                                       \
        const VkResult rc_ = (call);                                                           \
        if (rc_ != VK_SUCCESS)                                                                 \
            return vk_fail(err,                                                                \
                           rc_ == VK_ERROR_OUT_OF_DEVICE_MEMORY ? BN_ERR_GPU_OUT_OF_MEMORY     \
                                                                : BN_ERR_GPU,                  \
                           rc_, what);                                                         \
    } while (0)

/* A command buffer from the device's pool and a descriptor pool with room
 * for one sequence's dispatches (BN_VK_MAX_DISPATCHES of up to 8 buffers). */
static VkResult new_recording(bn_vk *vk, VkCommandBuffer *cmd, VkDescriptorPool *descriptors)
{
    const vk_fns *f = &vk->vi.fn;
    const VkCommandBufferAllocateInfo cai = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = vk->pool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1};
    VkResult rc = f->vkAllocateCommandBuffers(vk->device, &cai, cmd);
    if (rc != VK_SUCCESS)
        return rc;
    const VkDescriptorPoolSize size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       BN_VK_MAX_BUFFERS * BN_VK_MAX_DISPATCHES};
    const VkDescriptorPoolCreateInfo dpci = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
        .maxSets = BN_VK_MAX_DISPATCHES,
        .poolSizeCount = 1,
        .pPoolSizes = &size};
    rc = f->vkCreateDescriptorPool(vk->device, &dpci, NULL, descriptors);
    if (rc != VK_SUCCESS) {
        f->vkFreeCommandBuffers(vk->device, vk->pool, 1, cmd);
        *cmd = VK_NULL_HANDLE;
    }
    return rc;
}

bn_status bn_vk_open(int index, bn_vk **out, bn_error *err)
{
    *out = NULL;
    bn_vk *vk = calloc(1, sizeof *vk);
    if (!vk)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "Vulkan: no memory for a device");
    char why[256];
    if (!instance_open(&vk->vi, why, sizeof why)) {
        instance_close(&vk->vi);
        free(vk);
        return bn_error_set(err, BN_ERR_DRIVER, "install a Vulkan driver (Debian: "
                                                "mesa-vulkan-drivers) and its loader (libvulkan1)",
                            "Vulkan: %s", why);
    }
    const vk_fns *f = &vk->vi.fn;
    VkPhysicalDevice pds[BN_VK_MAX_DEVICES];
    const int n = physical_devices(&vk->vi, pds, BN_VK_MAX_DEVICES);
    if (index < 0 || index >= n) {
        bn_vk_close(vk);
        return bn_error_set(err, BN_ERR_NO_DEVICE, "bitnet devices lists the Vulkan devices",
                            "Vulkan: no device %d (%d found)", index, n);
    }
    vk->pd = pds[index];
    describe(f, vk->pd, &vk->info);
    /* BITNET_VULKAN_FP64=0: the kernels without fp64, as on a device that
     * has none (the engine has already refused a malformed value). */
    bn_config cfg;
    if (bn_config_from_env(&cfg, NULL) == BN_OK) {
        if (cfg.vulkan_no_fp64)
            vk->info.fp64 = false;
        if (cfg.vulkan_no_dot) /* BITNET_VULKAN_DOT=0 likewise: the portable W2A8 sums */
            vk->info.integer_dot_product = false;
        if (cfg.vulkan_no_matrix) /* BITNET_VULKAN_MATRIX=0: no subgroup matrix products */
            memset(vk->info.int8_matrix, 0, sizeof vk->info.int8_matrix);
    }
    VkPhysicalDeviceProperties props;
    f->vkGetPhysicalDeviceProperties(vk->pd, &props);
    vk->ns_per_tick = props.limits.timestampPeriod;
    vk->poll = props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;
    f->vkGetPhysicalDeviceMemoryProperties(vk->pd, &vk->mem);

    uint32_t nq = 0;
    f->vkGetPhysicalDeviceQueueFamilyProperties(vk->pd, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    nq = nq > 16 ? 16 : nq;
    f->vkGetPhysicalDeviceQueueFamilyProperties(vk->pd, &nq, qf);
    int family = -1;
    for (uint32_t i = 0; i < nq && family < 0; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            family = (int)i;
    if (family < 0) {
        bn_vk_close(vk);
        return bn_error_set(err, BN_ERR_NO_DEVICE, NULL, "Vulkan: %s has no compute queue",
                            vk->info.name);
    }
    vk->queue_family = (uint32_t)family;
    vk->timestamps = qf[family].timestampValidBits > 0;
    const float priority = 1.0f;
    const VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                         .queueFamilyIndex = vk->queue_family,
                                         .queueCount = 1,
                                         .pQueuePriorities = &priority};
    /* fp64 where the device has it: the kernels' exact divisions use it;
     * integer dot products likewise: the W2A8 kernels' dot variants. */
    const VkPhysicalDeviceFeatures features = {.shaderFloat64 = vk->info.fp64 ? VK_TRUE
                                                                              : VK_FALSE};
    /* The subgroup matrix products likewise: the W2A8 matrix kernel. */
    const char *extensions[1 + N_MATRIX_EXTENSIONS];
    uint32_t n_ext = 0;
    void *chain = NULL;
    VkPhysicalDeviceShaderIntegerDotProductFeatures dot = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES,
        .shaderIntegerDotProduct = VK_TRUE};
    if (vk->info.integer_dot_product) {
        extensions[n_ext++] = "VK_KHR_shader_integer_dot_product";
        chain = &dot;
    }
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
        .cooperativeMatrix = VK_TRUE};
    VkPhysicalDeviceVulkanMemoryModelFeatures mm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES,
        .vulkanMemoryModel = VK_TRUE};
    VkPhysicalDeviceShaderFloat16Int8Features i8 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
        .shaderInt8 = VK_TRUE};
    if (vk->info.int8_matrix[0]) {
        for (int i = 0; i < N_MATRIX_EXTENSIONS; i++)
            extensions[n_ext++] = kMatrixExtensions[i];
        cm.pNext = chain;
        mm.pNext = &cm;
        i8.pNext = &mm;
        chain = &i8;
    }
    const VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                                    .pNext = chain,
                                    .queueCreateInfoCount = 1,
                                    .pQueueCreateInfos = &qci,
                                    .enabledExtensionCount = n_ext,
                                    .ppEnabledExtensionNames = n_ext ? extensions : NULL,
                                    .pEnabledFeatures = &features};
    bn_status st = BN_OK;
    VkResult rc = f->vkCreateDevice(vk->pd, &dci, NULL, &vk->device);
    if (rc != VK_SUCCESS) {
        bn_vk_close(vk);
        return vk_fail(err, BN_ERR_GPU, rc, "vkCreateDevice");
    }
    vk_fns *fw = &vk->vi.fn;
#define BN_VK_LOAD_DEVICE(name)                                                                \
    if (st == BN_OK) {                                                                         \
        fw->name = (PFN_##name)fw->vkGetDeviceProcAddr(vk->device, #name);                     \
        if (!fw->name)                                                                         \
            st = bn_error_set(err, BN_ERR_DRIVER, NULL, "Vulkan: the driver lacks %s", #name); \
    }
    BN_VK_DEVICE_FNS(BN_VK_LOAD_DEVICE)
    if (st != BN_OK) {
        bn_vk_close(vk);
        return st;
    }
    f->vkGetDeviceQueue(vk->device, vk->queue_family, 0, &vk->queue);
    const VkCommandPoolCreateInfo pci = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
        .queueFamilyIndex = vk->queue_family};
    const VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    rc = f->vkCreateCommandPool(vk->device, &pci, NULL, &vk->pool);
    if (rc == VK_SUCCESS)
        rc = new_recording(vk, &vk->cmd, &vk->descriptors);
    if (rc == VK_SUCCESS)
        rc = f->vkCreateFence(vk->device, &fci, NULL, &vk->fence);
    if (rc != VK_SUCCESS) {
        bn_vk_close(vk);
        return vk_fail(err, BN_ERR_GPU, rc, "setting up the device's queue");
    }
    *out = vk;
    return BN_OK;
}

void bn_vk_close(bn_vk *vk)
{
    if (!vk)
        return;
    const vk_fns *f = &vk->vi.fn;
    if (vk->device) {
        if (vk->stage_map)
            f->vkUnmapMemory(vk->device, vk->stage.memory);
        bn_vk_buffer_free(vk, &vk->stage);
        if (vk->timer)
            f->vkDestroyQueryPool(vk->device, vk->timer, NULL);
        if (vk->descriptors)
            f->vkDestroyDescriptorPool(vk->device, vk->descriptors, NULL);
        if (vk->fence)
            f->vkDestroyFence(vk->device, vk->fence, NULL);
        if (vk->pool)
            f->vkDestroyCommandPool(vk->device, vk->pool, NULL);
        f->vkDestroyDevice(vk->device, NULL);
    }
    instance_close(&vk->vi);
    free(vk);
}

const bn_vulkan_device *bn_vk_device(const bn_vk *vk) { return &vk->info; }

/* ---- buffers ----------------------------------------------------------------- */

/* A memory type for `bits` with `want`, or -1. */
static int memory_type(const bn_vk *vk, uint32_t bits, VkMemoryPropertyFlags want)
{
    for (uint32_t i = 0; i < vk->mem.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (vk->mem.memoryTypes[i].propertyFlags & want) == want)
            return (int)i;
    return -1;
}

/* A buffer with memory of the first of the property sets that fits. */
static bn_status buffer_make(bn_vk *vk, VkDeviceSize size, VkBufferUsageFlags usage,
                             const VkMemoryPropertyFlags *wants, int n_wants, bn_vk_buffer *out,
                             bn_error *err)
{
    const vk_fns *f = &vk->vi.fn;
    memset(out, 0, sizeof *out);
    const VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                    .size = size ? size : 4,
                                    .usage = usage,
                                    .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult rc = f->vkCreateBuffer(vk->device, &bci, NULL, &out->buffer);
    VkMemoryRequirements req;
    int type = -1;
    if (rc == VK_SUCCESS) {
        f->vkGetBufferMemoryRequirements(vk->device, out->buffer, &req);
        for (int i = 0; i < n_wants && type < 0; i++)
            type = memory_type(vk, req.memoryTypeBits, wants[i]);
        rc = VK_ERROR_OUT_OF_DEVICE_MEMORY;
    }
    if (type >= 0) {
        const VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                          .allocationSize = req.size,
                                          .memoryTypeIndex = (uint32_t)type};
        rc = f->vkAllocateMemory(vk->device, &mai, NULL, &out->memory);
    }
    if (rc == VK_SUCCESS)
        rc = f->vkBindBufferMemory(vk->device, out->buffer, out->memory, 0);
    if (rc != VK_SUCCESS) {
        bn_vk_buffer_free(vk, out);
        if (rc == VK_ERROR_OUT_OF_DEVICE_MEMORY || rc == VK_ERROR_OUT_OF_HOST_MEMORY)
            return bn_error_set(err, BN_ERR_GPU_OUT_OF_MEMORY,
                                "a smaller model or context needs less device memory",
                                "Vulkan: %s cannot hold %.1f MiB more", vk->info.name,
                                (double)size / 1048576.0);
        return vk_fail(err, BN_ERR_GPU, rc, "allocating device memory");
    }
    out->size = size;
    return BN_OK;
}

bn_status bn_vk_buffer_create(bn_vk *vk, VkDeviceSize size, bn_vk_buffer *out, bn_error *err)
{
    static const VkMemoryPropertyFlags wants[] = {VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0};
    return buffer_make(vk, size,
                       VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                           VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                       wants, 2, out, err);
}

void bn_vk_buffer_free(bn_vk *vk, bn_vk_buffer *b)
{
    if (!vk || !b)
        return;
    const vk_fns *f = &vk->vi.fn;
    if (b->buffer)
        f->vkDestroyBuffer(vk->device, b->buffer, NULL);
    if (b->memory)
        f->vkFreeMemory(vk->device, b->memory, NULL);
    memset(b, 0, sizeof *b);
}

#define POLL_SECONDS 0.2

/* Submits a recorded command buffer and waits for it. */
static bn_status run_wait(bn_vk *vk, VkCommandBuffer cmd, bn_error *err)
{
    const vk_fns *f = &vk->vi.fn;
    const VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                             .commandBufferCount = 1,
                             .pCommandBuffers = &cmd};
    VK_TRY(err, f->vkResetFences(vk->device, 1, &vk->fence), "vkResetFences");
    VK_TRY(err, f->vkQueueSubmit(vk->queue, 1, &si, vk->fence), "vkQueueSubmit");
    /* A GPU's fence is polled for up to POLL_SECONDS before the driver's
     * blocking wait: a pass is a few ms, and the blocking wait's wake-up
     * added up to ~1 ms to some of them on NVIDIA's driver (the H200's
     * decode steps 3.2 ms apart in one run, 4.1 in the next, the same on
     * the device). A CPU device (lavapipe) needs the cores polling would
     * take. */
    if (vk->poll) {
        const double until = bn_time_seconds() + POLL_SECONDS;
        VkResult rc = VK_NOT_READY;
        for (unsigned i = 1; rc == VK_NOT_READY; i++) {
            rc = f->vkGetFenceStatus(vk->device, vk->fence);
            if (rc == VK_NOT_READY && i % 1024 == 0 && bn_time_seconds() > until)
                break;
        }
        if (rc == VK_SUCCESS)
            return BN_OK;
        if (rc != VK_NOT_READY)
            return vk_fail(err, BN_ERR_GPU, rc, "vkGetFenceStatus");
    }
    VK_TRY(err, f->vkWaitForFences(vk->device, 1, &vk->fence, VK_TRUE, UINT64_MAX),
           "vkWaitForFences");
    return BN_OK;
}

/* Ends the command buffer, submits it and waits for it. */
static bn_status submit_wait(bn_vk *vk, bn_error *err)
{
    VK_TRY(err, vk->vi.fn.vkEndCommandBuffer(vk->cmd), "vkEndCommandBuffer");
    return run_wait(vk, vk->cmd, err);
}

static bn_status begin(bn_vk *vk, bn_error *err)
{
    const vk_fns *f = &vk->vi.fn;
    VK_TRY(err, f->vkResetCommandBuffer(vk->cmd, 0), "vkResetCommandBuffer");
    /* Not one-time: a sequence may be kept and run again (bn_vk_submit_keep). */
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    VK_TRY(err, f->vkBeginCommandBuffer(vk->cmd, &bi), "vkBeginCommandBuffer");
    return BN_OK;
}

/* A host-visible staging buffer of n bytes, mapped at *map. */
/* A host-visible buffer of n bytes, mapped at *map; with `cached`, in
 * memory the host's reads go through its caches where the device has such
 * (a pass's logits are read back there: 513 KB a token for the 2B-4T
 * vocabulary). */
static bn_status host_buffer(bn_vk *vk, size_t n, bool cached, bn_vk_buffer *s, void **map,
                             bn_error *err)
{
    static const VkMemoryPropertyFlags coherent =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    const VkMemoryPropertyFlags wants[] = {
        cached ? coherent | VK_MEMORY_PROPERTY_HOST_CACHED_BIT : coherent, coherent};
    bn_status st = buffer_make(vk, n,
                               VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                               wants, 2, s, err);
    if (st != BN_OK)
        return st;
    const VkResult rc = vk->vi.fn.vkMapMemory(vk->device, s->memory, 0, VK_WHOLE_SIZE, 0, map);
    if (rc != VK_SUCCESS) {
        bn_vk_buffer_free(vk, s);
        return vk_fail(err, BN_ERR_GPU, rc, "vkMapMemory");
    }
    return BN_OK;
}

bn_status bn_vk_host_buffer_create(bn_vk *vk, VkDeviceSize size, bn_vk_buffer *out, void **map,
                                   bn_error *err)
{
    *map = NULL;
    return host_buffer(vk, (size_t)size, true, out, map, err);
}

/* Copies n bytes from offset `from_at` of one buffer to offset `to_at` of
 * another (one of them the staging buffer), and waits. */
static bn_status copy(bn_vk *vk, VkBuffer from, VkDeviceSize from_at, VkBuffer to,
                      VkDeviceSize to_at, size_t n, bn_error *err)
{
    bn_status st = begin(vk, err);
    if (st != BN_OK)
        return st;
    const VkBufferCopy region = {from_at, to_at, n};
    vk->vi.fn.vkCmdCopyBuffer(vk->cmd, from, to, 1, &region);
    return submit_wait(vk, err);
}

/* n bytes between host memory and b from byte `at`, through the staging
 * buffer. */
static bn_status transfer(bn_vk *vk, const bn_vk_buffer *b, VkDeviceSize at, void *host, size_t n,
                          bool to_device, bn_error *err)
{
    if (vk->recording)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL,
                            "Vulkan: a copy while a sequence is being recorded");
    if (at > b->size || n > b->size - at)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan: %zu bytes at %llu %s a buffer of %llu", n,
                            (unsigned long long)at, to_device ? "into" : "from",
                            (unsigned long long)b->size);
    if (n == 0)
        return BN_OK;
    if (vk->stage.size < n) { /* grown to the largest copy so far */
        if (vk->stage_map)
            vk->vi.fn.vkUnmapMemory(vk->device, vk->stage.memory);
        bn_vk_buffer_free(vk, &vk->stage);
        vk->stage_map = NULL;
        const bn_status st = host_buffer(vk, n, false, &vk->stage, &vk->stage_map, err);
        if (st != BN_OK)
            return st;
    }
    if (to_device)
        memcpy(vk->stage_map, host, n);
    const bn_status st = to_device ? copy(vk, vk->stage.buffer, 0, b->buffer, at, n, err)
                                   : copy(vk, b->buffer, at, vk->stage.buffer, 0, n, err);
    if (st == BN_OK && !to_device)
        memcpy(host, vk->stage_map, n);
    if (vk->stage.size > ((VkDeviceSize)64 << 20)) { /* a weight upload's: not kept */
        vk->vi.fn.vkUnmapMemory(vk->device, vk->stage.memory);
        bn_vk_buffer_free(vk, &vk->stage);
        vk->stage_map = NULL;
    }
    return st;
}

bn_status bn_vk_write(bn_vk *vk, bn_vk_buffer *dst, const void *src, size_t n, bn_error *err)
{
    return transfer(vk, dst, 0, (void *)src, n, true, err);
}

bn_status bn_vk_read(bn_vk *vk, const bn_vk_buffer *src, void *dst, size_t n, bn_error *err)
{
    return transfer(vk, src, 0, dst, n, false, err);
}

bn_status bn_vk_read_at(bn_vk *vk, const bn_vk_buffer *src, size_t offset, void *dst, size_t n,
                        bn_error *err)
{
    return transfer(vk, src, offset, dst, n, false, err);
}

/* ---- kernels ------------------------------------------------------------------ */

bn_status bn_vk_kernel_create(bn_vk *vk, const char *name, const unsigned char *spirv,
                              size_t len, int n_buffers, uint32_t push_bytes,
                              bn_vk_kernel **out, bn_error *err)
{
    *out = NULL;
    if (len == 0 || len % 4 != 0 || n_buffers < 1 || n_buffers > BN_VK_MAX_BUFFERS)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "Vulkan: kernel %s: bad SPIR-V or layout",
                            name);
    VkPhysicalDeviceProperties props;
    vk->vi.fn.vkGetPhysicalDeviceProperties(vk->pd, &props);
    if ((uint32_t)n_buffers > props.limits.maxPerStageDescriptorStorageBuffers)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: kernel %s binds %d storage buffers; %s allows %u", name,
                            n_buffers, vk->info.name,
                            props.limits.maxPerStageDescriptorStorageBuffers);
    bn_vk_kernel *k = calloc(1, sizeof *k);
    uint32_t *code = malloc(len); /* vkCreateShaderModule wants 4-byte aligned words */
    if (!k || !code) {
        free(k);
        free(code);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "Vulkan: no memory for a kernel");
    }
    memcpy(code, spirv, len);
    snprintf(k->name, sizeof k->name, "%s", name);
    k->n_buffers = n_buffers;
    k->push_bytes = push_bytes;
    const vk_fns *f = &vk->vi.fn;
    const VkShaderModuleCreateInfo smci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                           .codeSize = len,
                                           .pCode = code};
    VkResult rc = f->vkCreateShaderModule(vk->device, &smci, NULL, &k->module);
    free(code);
    VkDescriptorSetLayoutBinding bindings[BN_VK_MAX_BUFFERS];
    for (int i = 0; i < n_buffers; i++)
        bindings[i] = (VkDescriptorSetLayoutBinding){
            .binding = (uint32_t)i,
            .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            .descriptorCount = 1,
            .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    const VkDescriptorSetLayoutCreateInfo dslci = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
        .bindingCount = (uint32_t)n_buffers,
        .pBindings = bindings};
    if (rc == VK_SUCCESS)
        rc = f->vkCreateDescriptorSetLayout(vk->device, &dslci, NULL, &k->set_layout);
    const VkPushConstantRange range = {VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
    const VkPipelineLayoutCreateInfo plci = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
        .setLayoutCount = 1,
        .pSetLayouts = &k->set_layout,
        .pushConstantRangeCount = push_bytes ? 1u : 0u,
        .pPushConstantRanges = &range};
    if (rc == VK_SUCCESS)
        rc = f->vkCreatePipelineLayout(vk->device, &plci, NULL, &k->layout);
    const VkComputePipelineCreateInfo cpci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = k->module,
                  .pName = "main"},
        .layout = k->layout};
    if (rc == VK_SUCCESS)
        rc = f->vkCreateComputePipelines(vk->device, VK_NULL_HANDLE, 1, &cpci, NULL,
                                         &k->pipeline);
    if (rc != VK_SUCCESS) {
        bn_vk_kernel_free(vk, k);
        return bn_error_set(err, BN_ERR_GPU, NULL,
                            "Vulkan: kernel %s could not be built on %s (VkResult %d)", name,
                            vk->info.name, (int)rc);
    }
    *out = k;
    return BN_OK;
}

void bn_vk_kernel_free(bn_vk *vk, bn_vk_kernel *k)
{
    if (!vk || !k)
        return;
    const vk_fns *f = &vk->vi.fn;
    if (k->pipeline)
        f->vkDestroyPipeline(vk->device, k->pipeline, NULL);
    if (k->layout)
        f->vkDestroyPipelineLayout(vk->device, k->layout, NULL);
    if (k->set_layout)
        f->vkDestroyDescriptorSetLayout(vk->device, k->set_layout, NULL);
    if (k->module)
        f->vkDestroyShaderModule(vk->device, k->module, NULL);
    free(k);
}

bn_status bn_vk_begin(bn_vk *vk, bn_error *err)
{
    if (vk->recording)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "Vulkan: a sequence is already open");
    VK_TRY(err, vk->vi.fn.vkResetDescriptorPool(vk->device, vk->descriptors, 0),
           "vkResetDescriptorPool");
    bn_status st = begin(vk, err);
    if (st == BN_OK) {
        vk->recording = true;
        vk->dispatches = 0;
        vk->independent = false;
        vk->after_copy = false;
        if (vk->timing) {
            vk->vi.fn.vkCmdResetQueryPool(vk->cmd, vk->timer, 0, BN_VK_MAX_DISPATCHES + 1);
            vk->vi.fn.vkCmdWriteTimestamp(vk->cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, vk->timer,
                                          0);
        }
    }
    return st;
}

bn_status bn_vk_profile(bn_vk *vk, bool on, bn_error *err)
{
    if (vk->recording)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL,
                            "Vulkan: timing switched while a sequence is open");
    if (on && !vk->timestamps)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "Vulkan: %s's compute queue has no timestamps", vk->info.name);
    if (on && !vk->timer) {
        const VkQueryPoolCreateInfo qpci = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                            .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                            .queryCount = BN_VK_MAX_DISPATCHES + 1};
        VK_TRY(err, vk->vi.fn.vkCreateQueryPool(vk->device, &qpci, NULL, &vk->timer),
               "vkCreateQueryPool");
    }
    vk->timing = on;
    return BN_OK;
}

int bn_vk_profile_read(bn_vk *vk, const char **names, double *us, int max, bn_error *err)
{
    if (!vk->timing || vk->recording) {
        bn_error_set(err, BN_ERR_INTERNAL, NULL, "Vulkan: no timed sequence to read");
        return -1;
    }
    const int n = vk->dispatches < max ? vk->dispatches : max;
    uint64_t ticks[BN_VK_MAX_DISPATCHES + 1];
    const VkResult rc = vk->vi.fn.vkGetQueryPoolResults(
        vk->device, vk->timer, 0, (uint32_t)n + 1, sizeof ticks, ticks, sizeof ticks[0],
        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    if (rc != VK_SUCCESS) {
        vk_fail(err, BN_ERR_GPU, rc, "vkGetQueryPoolResults");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        names[i] = vk->timed[i];
        us[i] = (double)(ticks[i + 1] - ticks[i]) * vk->ns_per_tick / 1000.0;
    }
    return n;
}

bn_status bn_vk_dispatch(bn_vk *vk, bn_vk_kernel *k, bn_vk_buffer *const *buffers,
                         const void *push, uint32_t groups_x, uint32_t groups_y, bn_error *err)
{
    if (!vk->recording)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "Vulkan: a dispatch outside a sequence");
    const vk_fns *f = &vk->vi.fn;
    VkDescriptorSet set;
    const VkDescriptorSetAllocateInfo dsai = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
        .descriptorPool = vk->descriptors,
        .descriptorSetCount = 1,
        .pSetLayouts = &k->set_layout};
    const VkResult rc = f->vkAllocateDescriptorSets(vk->device, &dsai, &set);
    if (rc != VK_SUCCESS)
        return bn_error_set(err, BN_ERR_GPU, NULL,
                            "Vulkan: no descriptor set left for dispatch %d of a sequence "
                            "(at most %d; VkResult %d)",
                            vk->dispatches + 1, BN_VK_MAX_DISPATCHES, (int)rc);
    VkDescriptorBufferInfo infos[BN_VK_MAX_BUFFERS];
    VkWriteDescriptorSet writes[BN_VK_MAX_BUFFERS];
    for (int i = 0; i < k->n_buffers; i++) {
        infos[i] = (VkDescriptorBufferInfo){buffers[i]->buffer, 0, VK_WHOLE_SIZE};
        writes[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                           .dstSet = set,
                                           .dstBinding = (uint32_t)i,
                                           .descriptorCount = 1,
                                           .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                           .pBufferInfo = &infos[i]};
    }
    f->vkUpdateDescriptorSets(vk->device, (uint32_t)k->n_buffers, writes, 0, NULL);
    if (vk->after_copy || (vk->dispatches > 0 && !vk->independent)) {
        /* What the dispatches (and copies) before wrote is what this one
         * may read. */
        const VkMemoryBarrier barrier = {
            .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT |
                             (vk->after_copy ? VK_ACCESS_TRANSFER_WRITE_BIT : 0),
            .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
        f->vkCmdPipelineBarrier(vk->cmd,
                                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                                    (vk->after_copy ? VK_PIPELINE_STAGE_TRANSFER_BIT : 0),
                                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &barrier, 0, NULL, 0,
                                NULL);
    }
    vk->after_copy = false;
    f->vkCmdBindPipeline(vk->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, k->pipeline);
    f->vkCmdBindDescriptorSets(vk->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, k->layout, 0, 1, &set, 0,
                               NULL);
    if (k->push_bytes)
        f->vkCmdPushConstants(vk->cmd, k->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, k->push_bytes,
                              push);
    f->vkCmdDispatch(vk->cmd, groups_x, groups_y, 1);
    vk->independent = false;
    if (vk->timing) {
        f->vkCmdWriteTimestamp(vk->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk->timer,
                               (uint32_t)vk->dispatches + 1);
        vk->timed[vk->dispatches] = k->name;
    }
    vk->dispatches++;
    return BN_OK;
}

bn_status bn_vk_dispatch_groups(bn_vk *vk, bn_vk_kernel *k, bn_vk_buffer *const *buffers,
                                const void *push, uint64_t groups, bn_error *err)
{
    if (groups == 0)
        return BN_OK; /* nothing to run */
    const uint32_t gx = groups < 65535 ? (uint32_t)groups : 65535u;
    const uint64_t gy = (groups + gx - 1) / gx;
    if (gy > 65535)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan %s: %llu workgroups are more than a grid holds", k->name,
                            (unsigned long long)groups);
    return bn_vk_dispatch(vk, k, buffers, push, gx, (uint32_t)gy, err);
}

bn_status bn_vk_copy_record(bn_vk *vk, const bn_vk_buffer *src, VkDeviceSize src_at,
                            const bn_vk_buffer *dst, VkDeviceSize dst_at, size_t n,
                            bn_error *err)
{
    if (!vk->recording)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL,
                            "Vulkan: a copy recorded outside a sequence");
    if (src_at > src->size || n > src->size - src_at || dst_at > dst->size ||
        n > dst->size - dst_at)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "Vulkan: a copy of %zu bytes from %llu (of %llu) to %llu (of %llu)",
                            n, (unsigned long long)src_at, (unsigned long long)src->size,
                            (unsigned long long)dst_at, (unsigned long long)dst->size);
    if (n == 0)
        return BN_OK;
    const vk_fns *f = &vk->vi.fn;
    /* After what the dispatches and copies before wrote or read; the host
     * reads the destination after the sequence's fence. */
    const VkMemoryBarrier before = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
        .dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    f->vkCmdPipelineBarrier(vk->cmd,
                            VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                            VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &before, 0, NULL, 0, NULL);
    const VkBufferCopy region = {src_at, dst_at, n};
    f->vkCmdCopyBuffer(vk->cmd, src->buffer, dst->buffer, 1, &region);
    const VkMemoryBarrier to_host = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                     .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                                     .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    f->vkCmdPipelineBarrier(vk->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0,
                            1, &to_host, 0, NULL, 0, NULL);
    vk->after_copy = true;
    return BN_OK;
}

int bn_vk_recorded(const bn_vk *vk) { return vk->dispatches; }

bool bn_vk_profiling(const bn_vk *vk) { return vk->timing; }

void bn_vk_next_independent(bn_vk *vk) { vk->independent = true; }

bn_status bn_vk_submit(bn_vk *vk, bn_error *err)
{
    if (!vk->recording)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL, "Vulkan: no sequence to submit");
    vk->recording = false;
    return submit_wait(vk, err);
}

struct bn_vk_kept {
    VkCommandBuffer cmd;
    VkDescriptorPool descriptors; /* its dispatches' sets */
    int dispatches;
};

bn_status bn_vk_submit_keep(bn_vk *vk, bn_vk_kept **out, bn_error *err)
{
    *out = NULL;
    const bool keep = !vk->timing;
    const int dispatches = vk->dispatches;
    bn_status st = bn_vk_submit(vk, err);
    if (st != BN_OK || !keep)
        return st;
    /* The kept sequence takes the recorded command buffer and its sets; the
     * device gets new ones for the sequences and copies after it. */
    bn_vk_kept *k = calloc(1, sizeof *k);
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkDescriptorPool descriptors = VK_NULL_HANDLE;
    if (!k || new_recording(vk, &cmd, &descriptors) != VK_SUCCESS) {
        free(k);
        return BN_OK; /* nothing kept: the sequence ran, it will be recorded again */
    }
    k->cmd = vk->cmd;
    k->descriptors = vk->descriptors;
    k->dispatches = dispatches;
    vk->cmd = cmd;
    vk->descriptors = descriptors;
    *out = k;
    return BN_OK;
}

bn_status bn_vk_replay(bn_vk *vk, bn_vk_kept *kept, bn_error *err)
{
    if (vk->recording || !kept)
        return bn_error_set(err, BN_ERR_INTERNAL, NULL,
                            "Vulkan: a kept sequence replayed inside a sequence, or none");
    const bn_status st = run_wait(vk, kept->cmd, err);
    if (st != BN_OK)
        return st;
    vk->dispatches = kept->dispatches; /* what bn_vk_recorded reports for it */
    return BN_OK;
}

void bn_vk_kept_free(bn_vk *vk, bn_vk_kept *kept)
{
    if (!vk || !kept)
        return;
    const vk_fns *f = &vk->vi.fn;
    f->vkFreeCommandBuffers(vk->device, vk->pool, 1, &kept->cmd);
    f->vkDestroyDescriptorPool(vk->device, kept->descriptors, NULL);
    free(kept);
}
