/*
 * kiln_rt_vulkan.h: running kiln models on Vulkan objects you created.
 *
 * An application that already drives the GPU (a renderer, a video
 * pipeline) makes a kiln_device from its own VkInstance, VkPhysicalDevice,
 * VkDevice and queue, so models run on the same device and queue as the
 * rest of its work and can share memory with it:
 *
 *     kiln_vulkan_handles h = {0};
 *     h.instance = instance;          // created with apiVersion >= 1.2
 *     h.physical_device = gpu;
 *     h.device = device;              // bufferDeviceAddress enabled
 *     h.queue = queue;                // from a family with compute
 *     h.queue_family = family;
 *     h.features = KILN_FEATURE_STORAGE16;  // what you enabled, see below
 *     kiln_device *kd = NULL;
 *     kiln_status s = kiln_device_create_vulkan(&h, NULL, &kd);
 *     ... model_create(kd, &m); model_run(m, in, out); ...
 *     model_destroy(m);
 *     kiln_device_destroy(kd);        // leaves your objects alone
 *
 * Requirements, checked where Vulkan lets kiln check them:
 * - the physical device reports Vulkan 1.2 or later and supports
 *   bufferDeviceAddress; the queue family has VK_QUEUE_COMPUTE_BIT;
 * - the VkDevice was created with VkPhysicalDeviceVulkan12Features::
 *   bufferDeviceAddress (or the VkPhysicalDeviceBufferDeviceAddressFeatures
 *   equivalent) enabled. Vulkan has no query for enabled features, so kiln
 *   trusts this; without it the validation layer reports every kernel;
 * - features: the KILN_FEATURE_* bits whose Vulkan features you enabled
 *   (shaderFloat16, shaderInt64, storageBuffer16BitAccess,
 *   storageBuffer8BitAccess). A model whose kernels need one you did not
 *   declare fails create with KILN_ERROR_FEATURE_MISSING, naming it.
 *   KILN_FEATURE_COOPMAT declares VK_NV_cooperative_matrix enabled with its
 *   cooperativeMatrix feature, vulkanMemoryModel and
 *   vulkanMemoryModelDeviceScope (and shaderFloat16 and
 *   storageBuffer16BitAccess); without it f16 matmuls take the f32-arithmetic
 *   kernels instead. KILN_FEATURE_COOPMAT_WG (with KILN_FEATURE_COOPMAT)
 *   declares VK_KHR_cooperative_matrix enabled with cooperativeMatrix and
 *   VK_NV_cooperative_matrix2 with cooperativeMatrixWorkgroupScope and
 *   cooperativeMatrixFlexibleDimensions. KILN_FEATURE_INTDOT declares
 *   VK_KHR_shader_integer_dot_product enabled with shaderIntegerDotProduct;
 *   without it `--activations int8` kernels do the same integer arithmetic
 *   in more instructions. kiln_vulkan_features() says which ones the
 *   physical device has.
 *
 * Synchronization: kiln submits to your queue (a run is one vkQueueSubmit
 * and a wait on kiln's own fence) and, in create and destroy, waits for
 * that queue to be idle. Vulkan requires a queue to be externally
 * synchronized: make every kiln call on this device, and every use of the
 * queue of yours, under one lock or from one thread. Work you submit and
 * kiln's runs are ordered by submission order only; if your work writes
 * memory a model reads (or the reverse), finish it (or wait) first: kiln
 * copies inputs in on the host and waits for each run before returning.
 *
 * Destroying the kiln_device (and its models) destroys only what kiln
 * created; your instance, device and queue stay valid and idle of kiln work.
 */
#ifndef KILN_RT_VULKAN_H
#define KILN_RT_VULKAN_H

#include <vulkan/vulkan.h>

#include "kiln_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_vulkan_handles {
    VkInstance instance;
    VkPhysicalDevice physical_device;
    VkDevice device;
    VkQueue queue;
    uint32_t queue_family; /* the family queue was taken from */
    uint32_t features;     /* KILN_FEATURE_* enabled on device */
} kiln_vulkan_handles;

/* A kiln_device on your objects. allocator may be NULL; when given, kiln's
 * host allocations and the objects it creates on your device use it. */
kiln_status kiln_device_create_vulkan(const kiln_vulkan_handles *handles,
                                      const kiln_allocator *allocator,
                                      kiln_device **out_device);

/* The Vulkan objects of any kiln_device, including one kiln created (for
 * example to submit your own work to the device a model runs on). */
kiln_status kiln_device_get_vulkan(const kiln_device *device,
                                   kiln_vulkan_handles *out_handles);

/* The KILN_FEATURE_* bits physical_device supports: enable their Vulkan
 * features when you create the VkDevice, then declare them in
 * kiln_vulkan_handles.features. */
uint32_t kiln_vulkan_features(VkPhysicalDevice physical_device);

#ifdef __cplusplus
}
#endif

#endif /* KILN_RT_VULKAN_H */
