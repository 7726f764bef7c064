/*
 * test_vulkan.c: models on the caller's own Vulkan objects and host allocator.
 *
 * Built by tests/test_models.py with samples/mlp.yaml compiled as `mlp` and
 * a small f16 model as `half`. Plays the part of an application that owns
 * the GPU: it creates its own instance (with the validation layer and
 * synchronization validation when KILN_VALIDATION is set, counting the
 * messages itself), device and queue, and a counting host allocator; makes
 * a kiln_device from them; runs the model between submits of its own work
 * on the same queue; and checks that
 * - the runs give the bytes a kiln-created device gives;
 * - its own work on the shared queue still runs, also after kiln is gone;
 * - every host allocation went through its allocator, including the
 *   driver's for kiln's objects, none on the run path, and all of them are
 *   freed by destroy; an allocator that fails at the Nth call gives a
 *   status at every N and leaks nothing;
 * - bad handles, a queue family without compute, a half-given allocator
 *   and a model needing an undeclared feature are clear errors.
 * Prints "ok ..." / "FAIL ..." lines; exits 1 on any failure.
 */
#define _POSIX_C_SOURCE 200809L
#include "half.h"
#include "kiln_rt_vulkan.h"
#include "mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expect.h"

/* Zeroes a Vulkan struct and sets its sType. */
#define STRUCT(var, stype)            \
    do {                              \
        memset(&(var), 0, sizeof(var)); \
        (var).sType = (stype);        \
    } while (0)

/* ---- a counting allocator that can fail at the Nth call ---------------- */

typedef struct counter {
    long calls, live, fail_at, biggest_alignment;
} counter;

static void *count_alloc(void *user, size_t size, size_t alignment) {
    counter *c = (counter *)user;
    if (++c->calls == c->fail_at)
        return NULL;
    if ((long)alignment > c->biggest_alignment)
        c->biggest_alignment = (long)alignment;
    void *p = NULL;
    if (posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, size))
        return NULL;
    c->live++;
    return p;
}

static void count_free(void *user, void *p) {
    counter *c = (counter *)user;
    c->live--;
    free(p);
}

/* ---- the application's own Vulkan objects ------------------------------ */

static unsigned validation_messages;

static VKAPI_ATTR VkBool32 VKAPI_CALL on_message(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT types,
    const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)types;
    (void)user;
    if (severity & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)) {
        validation_messages++;
        fprintf(stderr, "validation: %s\n", data->pMessage);
    }
    return VK_FALSE;
}

typedef struct app {
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice gpu;
    VkDevice device;
    VkQueue queue;
    uint32_t family;
    uint32_t features;
    VkBuffer buffer; /* the application's own work: a fill of this buffer */
    VkDeviceMemory memory;
    VkCommandPool pool;
    VkFence fence;
} app;

static int app_create(app *a, int validation) {
    memset(a, 0, sizeof *a);
    VkApplicationInfo ai = {VK_STRUCTURE_TYPE_APPLICATION_INFO, NULL, "app", 0, NULL, 0,
                            VK_API_VERSION_1_2};
    const char *layer = "VK_LAYER_KHRONOS_validation";
    const char *ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkValidationFeatureEnableEXT sync = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
    VkValidationFeaturesEXT vf = {VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT, NULL, 1, &sync, 0,
                                  NULL};
    VkInstanceCreateInfo ci;
    STRUCT(ci, VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
    ci.pApplicationInfo = &ai;
    if (validation) {
        ci.pNext = &vf;
        ci.enabledLayerCount = 1;
        ci.ppEnabledLayerNames = &layer;
        ci.enabledExtensionCount = 1;
        ci.ppEnabledExtensionNames = &ext;
    }
    if (vkCreateInstance(&ci, NULL, &a->instance) != VK_SUCCESS)
        return 0;
    if (validation) {
        PFN_vkCreateDebugUtilsMessengerEXT create = (PFN_vkCreateDebugUtilsMessengerEXT)
            vkGetInstanceProcAddr(a->instance, "vkCreateDebugUtilsMessengerEXT");
        VkDebugUtilsMessengerCreateInfoEXT mi;
        STRUCT(mi, VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
        mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                             VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
        mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT;
        mi.pfnUserCallback = on_message;
        if (!create || create(a->instance, &mi, NULL, &a->messenger) != VK_SUCCESS)
            return 0;
    }
    uint32_t n = 1;
    VkResult r = vkEnumeratePhysicalDevices(a->instance, &n, &a->gpu);
    if ((r != VK_SUCCESS && r != VK_INCOMPLETE) || n == 0)
        return 0;
    VkQueueFamilyProperties fams[16];
    n = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(a->gpu, &n, fams);
    a->family = n;
    for (uint32_t i = 0; i < n && a->family == n; i++)
        if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            a->family = i;
    if (a->family == n)
        return 0;

    /* What kiln needs (bufferDeviceAddress) and the storage features the
     * models here use: exactly what an application would enable. */
    a->features = kiln_vulkan_features(a->gpu) & (KILN_FEATURE_STORAGE16 | KILN_FEATURE_FLOAT16);
    VkPhysicalDeviceVulkan11Features f11;
    STRUCT(f11, VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
    VkPhysicalDeviceVulkan12Features f12;
    STRUCT(f12, VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
    f12.pNext = &f11;
    f12.bufferDeviceAddress = VK_TRUE;
    f12.shaderFloat16 = (a->features & KILN_FEATURE_FLOAT16) != 0;
    f11.storageBuffer16BitAccess = (a->features & KILN_FEATURE_STORAGE16) != 0;
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qi;
    STRUCT(qi, VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
    qi.queueFamilyIndex = a->family;
    qi.queueCount = 1;
    qi.pQueuePriorities = &priority;
    VkDeviceCreateInfo di;
    STRUCT(di, VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
    di.pNext = &f12;
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    if (vkCreateDevice(a->gpu, &di, NULL, &a->device) != VK_SUCCESS)
        return 0;
    vkGetDeviceQueue(a->device, a->family, 0, &a->queue);

    VkBufferCreateInfo bi;

    STRUCT(bi, VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
    bi.size = 4096;
    bi.usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    if (vkCreateBuffer(a->device, &bi, NULL, &a->buffer) != VK_SUCCESS)
        return 0;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(a->device, a->buffer, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(a->gpu, &mp);
    VkFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    VkMemoryAllocateInfo mi;
    STRUCT(mi, VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
    mi.allocationSize = req.size;
    mi.memoryTypeIndex = mp.memoryTypeCount;
    for (uint32_t i = 0; i < mp.memoryTypeCount && mi.memoryTypeIndex == mp.memoryTypeCount; i++)
        if ((req.memoryTypeBits & (1u << i)) &&
            (mp.memoryTypes[i].propertyFlags & want) == want)
            mi.memoryTypeIndex = i;
    if (mi.memoryTypeIndex == mp.memoryTypeCount ||
        vkAllocateMemory(a->device, &mi, NULL, &a->memory) != VK_SUCCESS ||
        vkBindBufferMemory(a->device, a->buffer, a->memory, 0) != VK_SUCCESS)
        return 0;
    VkCommandPoolCreateInfo pi;
    STRUCT(pi, VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    pi.queueFamilyIndex = a->family;
    VkFenceCreateInfo fi;
    STRUCT(fi, VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    return vkCreateCommandPool(a->device, &pi, NULL, &a->pool) == VK_SUCCESS &&
           vkCreateFence(a->device, &fi, NULL, &a->fence) == VK_SUCCESS;
}

/* The application's own work on the shared queue: fills its buffer with
 * value on the GPU and checks every word. */
static int app_work(app *a, uint32_t value) {
    VkCommandBufferAllocateInfo ai;
    STRUCT(ai, VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    ai.commandPool = a->pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cmd;
    if (vkAllocateCommandBuffers(a->device, &ai, &cmd) != VK_SUCCESS)
        return 0;
    VkCommandBufferBeginInfo bi;
    STRUCT(bi, VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vkBeginCommandBuffer(cmd, &bi);
    vkCmdFillBuffer(cmd, a->buffer, 0, VK_WHOLE_SIZE, value);
    VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER, NULL, VK_ACCESS_TRANSFER_WRITE_BIT,
                          VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0,
                         1, &mb, 0, NULL, 0, NULL);
    vkEndCommandBuffer(cmd);
    VkSubmitInfo si;
    STRUCT(si, VK_STRUCTURE_TYPE_SUBMIT_INFO);
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    int ok = vkQueueSubmit(a->queue, 1, &si, a->fence) == VK_SUCCESS &&
             vkWaitForFences(a->device, 1, &a->fence, VK_TRUE, UINT64_MAX) == VK_SUCCESS &&
             vkResetFences(a->device, 1, &a->fence) == VK_SUCCESS;
    vkFreeCommandBuffers(a->device, a->pool, 1, &cmd);
    uint32_t *words = NULL;
    if (!ok || vkMapMemory(a->device, a->memory, 0, 4096, 0, (void **)&words) != VK_SUCCESS)
        return 0;
    for (int i = 0; i < 1024; i++)
        ok &= words[i] == value;
    vkUnmapMemory(a->device, a->memory);
    return ok;
}

static void app_destroy(app *a) {
    if (a->device) {
        vkDestroyFence(a->device, a->fence, NULL);
        vkDestroyCommandPool(a->device, a->pool, NULL);
        vkDestroyBuffer(a->device, a->buffer, NULL);
        vkFreeMemory(a->device, a->memory, NULL);
        vkDestroyDevice(a->device, NULL);
    }
    if (a->messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT destroy = (PFN_vkDestroyDebugUtilsMessengerEXT)
            vkGetInstanceProcAddr(a->instance, "vkDestroyDebugUtilsMessengerEXT");
        destroy(a->instance, a->messenger, NULL);
    }
    if (a->instance)
        vkDestroyInstance(a->instance, NULL);
}

static float in[MLP_INPUT0_BYTES / 4], want[MLP_OUTPUT0_BYTES / 4], got[MLP_OUTPUT0_BYTES / 4];

/* Creates mlp on dev, runs it `runs` times into got; 1 when every run
 * succeeded. *run_calls: allocator calls made during the runs. */
static int run_mlp(kiln_device *dev, counter *c, int runs, long *run_calls) {
    kiln_model *m = NULL;
    const void *ins[1] = {in};
    void *outs[1] = {got};
    kiln_status s = mlp_create(dev, &m);
    long before = c ? c->calls : 0;
    for (int r = 0; r < runs && s == KILN_OK; r++)
        s = mlp_run(m, ins, outs);
    if (run_calls)
        *run_calls = c ? c->calls - before : 0;
    mlp_destroy(m);
    return s == KILN_OK;
}

int main(void) {
    const char *v = getenv("KILN_VALIDATION");
    int validation = v && *v && strcmp(v, "0") != 0;
    for (size_t i = 0; i < sizeof in / 4; i++)
        in[i] = (float)((int)(i * 7 % 17) - 8) / 5.0f;

    /* The reference: the same model on a device kiln creates. */
    kiln_device *own = NULL;
    kiln_status s = kiln_device_create(NULL, &own);
    int ref_ok = s == KILN_OK && run_mlp(own, NULL, 1, NULL);
    memcpy(want, got, sizeof want);
    int nonzero = 0;
    for (size_t i = 0; i < sizeof want / 4; i++)
        nonzero += want[i] != 0.0f;
    EXPECT("reference run on a kiln-created device", ref_ok && nonzero > 0);
    kiln_vulkan_handles oh;
    EXPECT("kiln_device_get_vulkan gives a kiln-created device's objects",
           kiln_device_get_vulkan(own, &oh) == KILN_OK && oh.device && oh.queue &&
               oh.instance && oh.physical_device);
    kiln_device_destroy(own);

    app a;
    if (!app_create(&a, validation)) {
        printf("FAIL the application's own Vulkan objects could not be created\n");
        app_destroy(&a);
        return 1;
    }
    kiln_vulkan_handles h = {a.instance, a.gpu, a.device, a.queue, a.family, a.features};
    counter c = {0, 0, 0, 0};
    kiln_allocator alloc = {count_alloc, count_free, &c};

    kiln_device *dev = NULL;
    s = kiln_device_create_vulkan(&h, &alloc, &dev);
    EXPECT("kiln_device_create_vulkan on the application's objects", s == KILN_OK);
    kiln_vulkan_handles back;
    EXPECT("kiln_device_get_vulkan returns them",
           kiln_device_get_vulkan(dev, &back) == KILN_OK && back.device == a.device &&
               back.queue == a.queue && back.instance == a.instance);

    /* Runs interleaved with the application's own submits on its queue. */
    kiln_model *m = NULL;
    s = mlp_create(dev, &m);
    long after_create = c.calls;
    const void *ins[1] = {in};
    void *outs[1] = {got};
    int same = s == KILN_OK, shared = 1;
    for (int r = 0; r < 20 && same; r++) {
        memset(got, 0, sizeof got);
        same = mlp_run(m, ins, outs) == KILN_OK && memcmp(got, want, sizeof got) == 0;
        shared &= app_work(&a, 0x01010101u * (uint32_t)(r + 1));
    }
    long run_calls = c.calls - after_create;
    EXPECT("20 runs on the application's queue give the reference bytes", same);
    EXPECT("the application's own submits run in between on the same queue", shared);
    EXPECT("create allocated through the caller's allocator (kiln and driver)",
           after_create >= 3);
    EXPECT("no allocation through the allocator on the run path", run_calls == 0);
    printf("   create: %ld allocator calls, largest alignment %ld; runs: %ld\n",
           after_create, c.biggest_alignment, run_calls);

    /* A model whose kernels need a feature the caller did not declare. */
    kiln_vulkan_handles bare = h;
    bare.features = 0;
    kiln_device *bare_dev = NULL;
    kiln_model *hm = NULL;
    s = kiln_device_create_vulkan(&bare, &alloc, &bare_dev);
    EXPECT("an f16 model on a device declared without 16-bit storage: FEATURE_MISSING",
           s == KILN_OK && half_create(bare_dev, &hm) == KILN_ERROR_FEATURE_MISSING &&
               hm == NULL && strstr(kiln_last_error(), "storageBuffer16BitAccess"));
    kiln_device_destroy(bare_dev);

    mlp_destroy(m);
    kiln_device_destroy(dev);
    EXPECT("destroy freed every allocation it made", c.live == 0);
    EXPECT("the application's queue works after kiln is destroyed", app_work(&a, 0xdeadbeefu));

    /* Errors in what the caller hands over. */
    kiln_vulkan_handles bad = h;
    bad.queue_family = 99;
    EXPECT("a queue family that does not exist: INVALID_ARGUMENT",
           kiln_device_create_vulkan(&bad, NULL, &dev) == KILN_ERROR_INVALID_ARGUMENT &&
               dev == NULL && strstr(kiln_last_error(), "queue family 99"));
    bad = h;
    bad.features |= KILN_FEATURE_COOPMAT_WG;
    bad.features &= ~KILN_FEATURE_COOPMAT;
    EXPECT("workgroup cooperative matrices declared without KILN_FEATURE_COOPMAT: "
           "INVALID_ARGUMENT",
           kiln_device_create_vulkan(&bad, NULL, &dev) == KILN_ERROR_INVALID_ARGUMENT &&
               dev == NULL && strstr(kiln_last_error(), "KILN_FEATURE_COOPMAT_WG without"));
    bad = h;
    bad.features |= KILN_FEATURE_COOPMAT_WG | KILN_FEATURE_COOPMAT;
    EXPECT("cooperative matrices the GPU lacks (lavapipe) declared: INVALID_ARGUMENT",
           (kiln_vulkan_features(h.physical_device) & KILN_FEATURE_COOPMAT) ||
               (kiln_device_create_vulkan(&bad, NULL, &dev) == KILN_ERROR_INVALID_ARGUMENT &&
                dev == NULL && strstr(kiln_last_error(), "does not support")));
    bad = h;
    bad.device = VK_NULL_HANDLE;
    EXPECT("a missing VkDevice: INVALID_ARGUMENT",
           kiln_device_create_vulkan(&bad, NULL, &dev) == KILN_ERROR_INVALID_ARGUMENT);
    EXPECT("NULL handles: INVALID_ARGUMENT",
           kiln_device_create_vulkan(NULL, NULL, &dev) == KILN_ERROR_INVALID_ARGUMENT);
    kiln_allocator half_given = {count_alloc, NULL, &c};
    kiln_device_options opts = {sizeof opts, -1, NULL, 0, &half_given};
    EXPECT("an allocator without free: INVALID_ARGUMENT",
           kiln_device_create(&opts, &dev) == KILN_ERROR_INVALID_ARGUMENT && dev == NULL &&
               kiln_device_create_vulkan(&h, &half_given, &dev) == KILN_ERROR_INVALID_ARGUMENT);

    /* A device kiln creates, its instance and device included, on the
     * caller's allocator; then that allocator failing at every call in turn
     * (kiln's own allocations and the driver's for kiln's objects). */
    c.calls = c.live = 0;
    opts.allocator = &alloc;
    opts.flags = validation ? KILN_DEVICE_VALIDATION : 0;
    s = kiln_device_create(&opts, &dev);
    long runs_calls = 0;
    int ok = s == KILN_OK && run_mlp(dev, &c, 5, &runs_calls) && memcmp(got, want, sizeof got) == 0;
    kiln_device_destroy(dev);
    long total = c.calls;
    EXPECT("a kiln-created device on the caller's allocator runs the model", ok);
    EXPECT("... everything it allocated is freed", c.live == 0);
    printf("   %ld allocator calls in all, %ld in 5 runs\n", total, runs_calls);
    /* The allocator failing at each call in turn, on the application's
     * device: kiln's own allocations and the driver's for kiln's objects.
     * (On a device kiln creates, the failures would reach the instance and
     * the loader's layers, which Mesa's device-select layer does not
     * survive: a driver matter, so that case is left out.) */
    unsigned messages = validation_messages; /* the layer reports failed calls */
    c.calls = c.live = c.fail_at = 0;
    s = kiln_device_create_vulkan(&h, &alloc, &dev);
    ok = s == KILN_OK && run_mlp(dev, &c, 1, NULL);
    kiln_device_destroy(dev);
    total = c.calls;
    int statuses = ok, leaks = 0;
    long failed_ok = 0;
    for (long n = 1; n <= total; n++) {
        c.calls = c.live = 0;
        c.fail_at = n;
        dev = NULL;
        s = kiln_device_create_vulkan(&h, &alloc, &dev);
        if (s == KILN_OK && !run_mlp(dev, &c, 1, NULL))
            s = KILN_ERROR_OUT_OF_HOST_MEMORY;
        kiln_device_destroy(dev);
        /* A driver may absorb a failed allocation it can do without. */
        failed_ok += s == KILN_ERROR_OUT_OF_HOST_MEMORY;
        statuses &= s == KILN_OK || s == KILN_ERROR_OUT_OF_HOST_MEMORY;
        leaks += c.live != 0;
        if (c.live != 0)
            printf("   failing allocation %ld leaked %ld blocks\n", n, c.live);
    }
    printf("   failed each of %ld allocator calls in turn: %ld gave "
           "KILN_ERROR_OUT_OF_HOST_MEMORY\n", total, failed_ok);
    EXPECT("an allocator failing at each call gives OUT_OF_HOST_MEMORY or absorbs it",
           statuses && failed_ok > 0);
    EXPECT("... and nothing leaks", leaks == 0);
    c.fail_at = 0;

    app_destroy(&a);
    EXPECT("the validation layer was silent (before the failing allocator)", messages == 0);
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
