/*
 * device.c: choosing and opening a Vulkan device.
 *
 * A usable device has Vulkan 1.2 or later, the bufferDeviceAddress feature
 * (kernels address tensors through 64-bit pointers passed in push constants)
 * and a queue with compute. Among usable devices the choice is: discrete GPU,
 * integrated GPU, virtual GPU, CPU (Mesa's lavapipe), in enumeration order
 * within a type. KILN_DEVICE (an index or a name substring) and the options
 * override the choice; a device picked by name or index that is not usable is
 * an error naming what it lacks, never a silent fallback.
 *
 * Optional features (f16 arithmetic, 16- and 8-bit storage, int64,
 * cooperative matrices) are enabled when present and recorded in
 * kiln_device.features, so a model can check the ones its kernels need and
 * pick the kernels a device has (kiln_dispatch.needs).
 */
#include "internal.h"
#include "kiln_rt_vulkan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static VKAPI_ATTR VkBool32 VKAPI_CALL
on_validation(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
              VkDebugUtilsMessageTypeFlagsEXT types,
              const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    kiln_device *dev = (kiln_device *)user;
    (void)types;
    if (severity & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                    VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)) {
        dev->validation_count++;
        fprintf(stderr, "kiln: validation: %s\n",
                data && data->pMessage ? data->pMessage : "(no message)");
    }
    return VK_FALSE;
}

static int type_rank(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;
    default: return 0;
    }
}

const char *kiln_device_type_name(const kiln_device *dev) {
    if (!dev)
        return "none";
    switch (dev->props.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
    }
}

/* Features2 -> Vulkan12 -> Vulkan11, zeroed and chained. */
typedef struct FeatureChain {
    VkPhysicalDeviceFeatures2 f;
    VkPhysicalDeviceVulkan12Features v12;
    VkPhysicalDeviceVulkan11Features v11;
} FeatureChain;

static void feature_chain(FeatureChain *c) {
    memset(c, 0, sizeof *c);
    c->f.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    c->f.pNext = &c->v12;
    c->v12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    c->v12.pNext = &c->v11;
    c->v11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES;
}

/* vkGetPhysicalDeviceProperties2 filling the property structures chained
 * from next (each zeroed, with its sType set). */
static void properties_chain(VkPhysicalDevice pd, void *next) {
    VkPhysicalDeviceProperties2 p2;
    memset(&p2, 0, sizeof p2);
    p2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
    p2.pNext = next;
    vkGetPhysicalDeviceProperties2(pd, &p2);
}

/* vkGetPhysicalDeviceFeatures2 filling the feature structure next (zeroed,
 * with its sType set). */
static void features_chain(VkPhysicalDevice pd, void *next) {
    VkPhysicalDeviceFeatures2 f2;
    memset(&f2, 0, sizeof f2);
    f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    f2.pNext = next;
    vkGetPhysicalDeviceFeatures2(pd, &f2);
}

/* pd's queue families, *n of them (kiln__free them). NULL when it has none
 * (*n = 0) or when the allocation fails (*n > 0). */
static VkQueueFamilyProperties *queue_families(const kiln_allocator *allocator,
                                               VkPhysicalDevice pd, uint32_t *n) {
    *n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, n, NULL);
    VkQueueFamilyProperties *fams =
        *n ? (VkQueueFamilyProperties *)kiln__calloc(allocator, *n, sizeof *fams) : NULL;
    if (fams)
        vkGetPhysicalDeviceQueueFamilyProperties(pd, n, fams);
    return fams;
}

/* 1 when pd is usable (its first compute queue family in *queue_family),
 * 0 when not (*why says what it lacks), -1 when out of host memory. */
static int device_usable(const kiln_allocator *allocator, VkPhysicalDevice pd,
                         uint32_t *queue_family, char *why, size_t why_size) {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(pd, &props);
    if (props.apiVersion < VK_API_VERSION_1_2) {
        snprintf(why, why_size, "Vulkan 1.2 (it has %u.%u)",
                 VK_API_VERSION_MAJOR(props.apiVersion),
                 VK_API_VERSION_MINOR(props.apiVersion));
        return 0;
    }
    FeatureChain c;
    feature_chain(&c);
    vkGetPhysicalDeviceFeatures2(pd, &c.f);
    if (!c.v12.bufferDeviceAddress) {
        snprintf(why, why_size, "the bufferDeviceAddress feature");
        return 0;
    }
    uint32_t n;
    VkQueueFamilyProperties *fams = queue_families(allocator, pd, &n);
    if (!fams && n)
        return -1;
    int found = 0;
    for (uint32_t i = 0; fams && i < n && !found; i++) {
        if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *queue_family = i;
            found = 1;
        }
    }
    kiln__free(allocator, fams);
    if (!found)
        snprintf(why, why_size, "a compute queue");
    return found;
}

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static int layer_present(const kiln_device *dev, const char *name) {
    uint32_t n = 0;
    if (vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0)
        return 0;
    VkLayerProperties *layers =
        (VkLayerProperties *)kiln__calloc(&dev->allocator, n, sizeof *layers);
    if (!layers)
        return 0;
    int found = 0;
    if (vkEnumerateInstanceLayerProperties(&n, layers) == VK_SUCCESS)
        for (uint32_t i = 0; i < n; i++)
            if (strcmp(layers[i].layerName, name) == 0)
                found = 1;
    kiln__free(&dev->allocator, layers);
    return found;
}

static kiln_status create_instance(kiln_device *dev, int validation) {
    VkApplicationInfo app;
    memset(&app, 0, sizeof app);
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "kiln";
    app.pEngineName = "kiln";
    app.apiVersion = VK_API_VERSION_1_2;

    const char *layer = "VK_LAYER_KHRONOS_validation";
    const char *exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME,
                          VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME};
    /* Synchronization validation checks every hazard between dispatches:
     * it is what proves the compiler's barrier placement right. */
    VkValidationFeatureEnableEXT enables[] = {
        VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
    VkValidationFeaturesEXT features;
    memset(&features, 0, sizeof features);
    features.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT;
    features.enabledValidationFeatureCount = 1;
    features.pEnabledValidationFeatures = enables;
    VkInstanceCreateInfo ci;
    memset(&ci, 0, sizeof ci);
    ci.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ci.pApplicationInfo = &app;
    if (validation) {
        ci.pNext = &features;
        if (!layer_present(dev, layer))
            return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                             "validation requested but %s is not installed "
                             "(Debian: apt-get install vulkan-validationlayers)",
                             layer);
        ci.enabledLayerCount = 1;
        ci.ppEnabledLayerNames = &layer;
        ci.enabledExtensionCount = 2;
        ci.ppEnabledExtensionNames = exts;
    }
    VkResult r = vkCreateInstance(&ci, dev->vk_alloc_driver, &dev->instance);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
        return KILN_FAIL(KILN_ERROR_NO_DEVICE,
                         "no Vulkan driver found (vkCreateInstance returned "
                         "VK_ERROR_INCOMPATIBLE_DRIVER); on a machine without "
                         "a GPU install Mesa's lavapipe: apt-get install "
                         "mesa-vulkan-drivers");
    if (r != VK_SUCCESS)
        return kiln__vk_fail(r, __FILE__, __LINE__, "vkCreateInstance");

    if (validation) {
        PFN_vkCreateDebugUtilsMessengerEXT create =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
                dev->instance, "vkCreateDebugUtilsMessengerEXT");
        if (!create)
            return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                             "vkCreateDebugUtilsMessengerEXT is missing");
        VkDebugUtilsMessengerCreateInfoEXT mi;
        memset(&mi, 0, sizeof mi);
        mi.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
        mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                             VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
        mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
        mi.pfnUserCallback = on_validation;
        mi.pUserData = dev;
        KILN_VK_RETURN(create(dev->instance, &mi, dev->vk_alloc_driver, &dev->messenger));
    }
    return KILN_OK;
}

#define NO_MEMORY_FOR(what) KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating %s", what)

/* choose_device's rules over the n devices pds. */
static kiln_status choose_among(kiln_device *dev, VkPhysicalDevice *pds, uint32_t n,
                                int32_t index, const char *name) {
    char why[128];
    if (index >= 0 || name) {
        for (uint32_t i = 0; i < n; i++) {
            VkPhysicalDeviceProperties p;
            vkGetPhysicalDeviceProperties(pds[i], &p);
            if (index >= 0 ? (uint32_t)index != i
                           : strstr(p.deviceName, name) == NULL)
                continue;
            int usable = device_usable(&dev->allocator, pds[i], &dev->queue_family, why,
                                       sizeof why);
            if (usable < 0)
                return NO_MEMORY_FOR("the queue families");
            if (!usable)
                return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                                 "device %u (%s) lacks %s", i, p.deviceName, why);
            dev->physical = pds[i];
            return KILN_OK;
        }
        if (index >= 0)
            return KILN_FAIL(KILN_ERROR_NO_DEVICE,
                             "device index %d requested, %u present", index, n);
        return KILN_FAIL(KILN_ERROR_NO_DEVICE,
                         "no device name contains \"%s\"", name);
    }

    int best = -1, best_rank = -1;
    why[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        uint32_t qf = 0;
        vkGetPhysicalDeviceProperties(pds[i], &p);
        int usable = device_usable(&dev->allocator, pds[i], &qf, why, sizeof why);
        if (usable < 0)
            return NO_MEMORY_FOR("the queue families");
        if (!usable)
            continue;
        if (type_rank(p.deviceType) > best_rank) {
            best = (int)i;
            best_rank = type_rank(p.deviceType);
            dev->queue_family = qf;
        }
    }
    if (best < 0)
        return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                         "no usable Vulkan device: the last one lacks %s", why);
    dev->physical = pds[best];
    return KILN_OK;
}

/* Picks dev->physical and dev->queue_family following the rules above,
 * among every device the instance lists. */
static kiln_status choose_device(kiln_device *dev, int32_t index,
                                 const char *name) {
    uint32_t n = 0;
    KILN_VK_RETURN(vkEnumeratePhysicalDevices(dev->instance, &n, NULL));
    if (n == 0)
        return KILN_FAIL(KILN_ERROR_NO_DEVICE,
                         "no Vulkan device found; on a machine without a GPU "
                         "install Mesa's lavapipe: apt-get install "
                         "mesa-vulkan-drivers");
    VkPhysicalDevice *pds = (VkPhysicalDevice *)kiln__calloc(&dev->allocator, n, sizeof *pds);
    if (!pds)
        return NO_MEMORY_FOR("the device list");
    VkResult r = vkEnumeratePhysicalDevices(dev->instance, &n, pds);
    kiln_status st = r == VK_SUCCESS || r == VK_INCOMPLETE
                         ? choose_among(dev, pds, n, index, name)
                         : kiln__vk_fail(r, __FILE__, __LINE__, "vkEnumeratePhysicalDevices");
    kiln__free(&dev->allocator, pds);
    return st;
}

/* Whether the environment variable `name` is "0" (a feature turned off). */
static int env_off(const char *name) {
    const char *v = getenv(name);
    return v && strcmp(v, "0") == 0;
}

/* n zeroed structures of `size` bytes each, their sType set: the list a
 * Vulkan query fills (kiln__free it); NULL when out of memory. */
static void *structure_list(const kiln_allocator *allocator, uint32_t n, size_t size,
                            VkStructureType type) {
    unsigned char *p = (unsigned char *)kiln__calloc(allocator, n, size);
    for (uint32_t i = 0; p && i < n; i++)
        ((VkBaseOutStructure *)(void *)(p + (size_t)i * size))->sType = type;
    return p;
}

/* 1 when pd has the device extension named ext. */
static int has_extension(VkPhysicalDevice pd, const char *ext, const kiln_allocator *allocator) {
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0)
        return 0;
    VkExtensionProperties *all =
        (VkExtensionProperties *)kiln__calloc(allocator, n, sizeof *all);
    int has = 0;
    if (all && vkEnumerateDeviceExtensionProperties(pd, NULL, &n, all) >= 0)
        for (uint32_t i = 0; i < n; i++)
            has |= strcmp(all[i].extensionName, ext) == 0;
    kiln__free(allocator, all);
    return has;
}

/* 1 when pd has VK_KHR_shader_integer_dot_product with its feature on
 * (KILN_FEATURE_INTDOT). */
static int intdot_usable(VkPhysicalDevice pd, const kiln_allocator *allocator) {
    if (!has_extension(pd, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME, allocator))
        return 0;
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dot;
    memset(&dot, 0, sizeof dot);
    dot.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR;
    features_chain(pd, &dot);
    return dot.shaderIntegerDotProduct == VK_TRUE;
}

/* 1 when pd has VK_NV_cooperative_matrix as coopmat.comp and flash_cm.comp
 * use it: the extension and its feature, subgroups of 32 with shuffles,
 * and (given an instance to
 * query it through) 16 x 16 x 16 fragments of f16 x f16 + f32 at subgroup
 * scope; c holds pd's features (f16 arithmetic, 16-bit storage and the
 * Vulkan memory model with device scope are needed too: its SPIR-V declares
 * the Vulkan memory model, and once that feature is on, kiln's other
 * kernels' device-scope atomics need vulkanMemoryModelDeviceScope). */
static int coopmat_usable(VkInstance instance, VkPhysicalDevice pd, const FeatureChain *c,
                          const kiln_allocator *allocator) {
    if (!c->v12.shaderFloat16 || !c->v11.storageBuffer16BitAccess ||
        !c->v12.vulkanMemoryModel || !c->v12.vulkanMemoryModelDeviceScope)
        return 0;
    if (!has_extension(pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME, allocator))
        return 0;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cm;
    memset(&cm, 0, sizeof cm);
    cm.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV;
    features_chain(pd, &cm);
    VkPhysicalDeviceSubgroupProperties sub;
    memset(&sub, 0, sizeof sub);
    sub.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
    properties_chain(pd, &sub);
    /* flash_cm.comp pairs a subgroup's invocations by shuffles */
    if (!cm.cooperativeMatrix || sub.subgroupSize != 32 ||
        !(sub.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT))
        return 0;
    if (!instance)
        return 1;
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV props =
        (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)vkGetInstanceProcAddr(
            instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
    uint32_t np = 0;
    if (!props || props(pd, &np, NULL) < 0 || np == 0)
        return 0;
    VkCooperativeMatrixPropertiesNV *p = (VkCooperativeMatrixPropertiesNV *)structure_list(
        allocator, np, sizeof *p, VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV);
    if (!p) /* the model then runs without cooperative matrices */
        return 0;
    int found = 0;
    if (props(pd, &np, p) >= 0)
        for (uint32_t i = 0; i < np && !found; i++)
            found = p[i].MSize == 16 && p[i].NSize == 16 && p[i].KSize == 16 &&
                    p[i].AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                    p[i].BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                    p[i].CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                    p[i].DType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                    p[i].scope == VK_SCOPE_SUBGROUP_NV;
    kiln__free(allocator, p);
    return found;
}

/* VK_KHR_cooperative_matrix and VK_NV_cooperative_matrix2 postdate the
 * Vulkan headers kiln builds with (Debian 12's 1.3.239): their structures
 * and values, from the Vulkan registry, under kiln's own names. */
#define KILN_KHR_COOPMAT_EXTENSION "VK_KHR_cooperative_matrix"
#define KILN_NV_COOPMAT2_EXTENSION "VK_NV_cooperative_matrix2"
#define KILN_ST_KHR_COOPMAT_FEATURES ((VkStructureType)1000506000)
#define KILN_ST_COOPMAT2_FEATURES ((VkStructureType)1000593000)
#define KILN_ST_COOPMAT_FLEXIBLE ((VkStructureType)1000593001)
#define KILN_ST_COOPMAT2_PROPERTIES ((VkStructureType)1000593002)
typedef struct KilnKhrCoopmatFeatures { /* VkPhysicalDeviceCooperativeMatrixFeaturesKHR */
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix, cooperativeMatrixRobustBufferAccess;
} KilnKhrCoopmatFeatures;
typedef struct KilnCoopmat2Features { /* VkPhysicalDeviceCooperativeMatrix2FeaturesNV */
    VkStructureType sType;
    void *pNext;
    VkBool32 workgroupScope, flexibleDimensions, reductions, conversions,
        perElementOperations, tensorAddressing, blockLoads;
} KilnCoopmat2Features;
typedef struct KilnCoopmat2Properties { /* VkPhysicalDeviceCooperativeMatrix2PropertiesNV */
    VkStructureType sType;
    void *pNext;
    uint32_t workgroupScopeMaxWorkgroupSize, flexibleDimensionsMaxDimension,
        workgroupScopeReservedSharedMemory;
} KilnCoopmat2Properties;
typedef struct KilnCoopmatFlexible { /* VkCooperativeMatrixFlexibleDimensionsPropertiesNV */
    VkStructureType sType;
    void *pNext;
    uint32_t MGranularity, NGranularity, KGranularity;
    uint32_t AType, BType, CType, ResultType; /* VkComponentTypeKHR: f16 0, f32 1 */
    VkBool32 saturatingAccumulation;
    uint32_t scope; /* VkScopeKHR: workgroup 2 */
    uint32_t workgroupInvocations;
} KilnCoopmatFlexible;
typedef VkResult(VKAPI_PTR *KilnFlexibleQuery)(VkPhysicalDevice, uint32_t *,
                                               KilnCoopmatFlexible *);

/* 1 when pd has cooperative matrices of workgroup scope as coopmat_wg.comp
 * uses them (KILN_FEATURE_COOPMAT_WG; coopmat: whether coopmat_usable said
 * yes, which this needs too): both extensions and their features, and
 * (given an instance to query it through) f16 x f16 + f32 matrices of
 * workgroup scope for 128 invocations whose granularities divide its
 * 128 x 64 x 32 tiles; workgroups of 128, matrices of 128 rows, and 32 KiB
 * of shared memory (its largest use, the epilogue's accumulator) beside
 * what the driver reserves for them. */
static int coopmat_wg_usable(VkInstance instance, VkPhysicalDevice pd, int coopmat,
                             const kiln_allocator *allocator) {
    if (!coopmat || !has_extension(pd, KILN_KHR_COOPMAT_EXTENSION, allocator) ||
        !has_extension(pd, KILN_NV_COOPMAT2_EXTENSION, allocator))
        return 0;
    KilnCoopmat2Features c2;
    memset(&c2, 0, sizeof c2);
    c2.sType = KILN_ST_COOPMAT2_FEATURES;
    KilnKhrCoopmatFeatures khr;
    memset(&khr, 0, sizeof khr);
    khr.sType = KILN_ST_KHR_COOPMAT_FEATURES;
    khr.pNext = &c2;
    features_chain(pd, &khr);
    if (!khr.cooperativeMatrix || !c2.workgroupScope || !c2.flexibleDimensions)
        return 0;
    KilnCoopmat2Properties props;
    memset(&props, 0, sizeof props);
    props.sType = KILN_ST_COOPMAT2_PROPERTIES;
    properties_chain(pd, &props);
    VkPhysicalDeviceProperties limits;
    vkGetPhysicalDeviceProperties(pd, &limits);
    if (props.workgroupScopeMaxWorkgroupSize < 128 || props.flexibleDimensionsMaxDimension < 128 ||
        (uint64_t)props.workgroupScopeReservedSharedMemory + 32768 >
            limits.limits.maxComputeSharedMemorySize)
        return 0;
    if (!instance)
        return 1;
    KilnFlexibleQuery query = (KilnFlexibleQuery)vkGetInstanceProcAddr(
        instance, "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV");
    uint32_t np = 0;
    if (!query || query(pd, &np, NULL) < 0 || np == 0)
        return 0;
    KilnCoopmatFlexible *p = (KilnCoopmatFlexible *)structure_list(
        allocator, np, sizeof *p, KILN_ST_COOPMAT_FLEXIBLE);
    if (!p) /* the model then runs on coopmat.comp */
        return 0;
    int found = 0;
    if (query(pd, &np, p) >= 0)
        for (uint32_t i = 0; i < np && !found; i++)
            found = p[i].AType == 0 && p[i].BType == 0 && p[i].CType == 1 &&
                    p[i].ResultType == 1 && p[i].scope == 2 &&
                    p[i].workgroupInvocations == 128 && p[i].MGranularity &&
                    128 % p[i].MGranularity == 0 && p[i].NGranularity &&
                    64 % p[i].NGranularity == 0 && p[i].KGranularity &&
                    32 % p[i].KGranularity == 0;
    kiln__free(allocator, p);
    return found;
}

/* The KILN_FEATURE_* bits of a chain filled by vkGetPhysicalDeviceFeatures2;
 * coopmat: whether coopmat_usable said yes. */
static uint32_t feature_bits(const FeatureChain *c, int coopmat) {
    return (c->v12.shaderFloat16 ? KILN_FEATURE_FLOAT16 : 0u) |
           (c->f.features.shaderInt64 ? KILN_FEATURE_INT64 : 0u) |
           (c->v11.storageBuffer16BitAccess ? KILN_FEATURE_STORAGE16 : 0u) |
           (c->v12.storageBuffer8BitAccess ? KILN_FEATURE_STORAGE8 : 0u) |
           (coopmat ? KILN_FEATURE_COOPMAT : 0u);
}

/* The KILN_FEATURE_* bits that a device's properties give rather than its
 * features (nothing to enable): SHARED48K from its limits, SUBGROUP from
 * its subgroup operations. *subgroup_size: its subgroup size. */
static uint32_t property_bits(VkPhysicalDevice pd, const VkPhysicalDeviceLimits *limits,
                              uint32_t *subgroup_size) {
    VkPhysicalDeviceSubgroupProperties sub;
    memset(&sub, 0, sizeof sub);
    sub.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
    properties_chain(pd, &sub);
    if (subgroup_size)
        *subgroup_size = sub.subgroupSize;
    return (limits->maxComputeSharedMemorySize >= 49152 ? KILN_FEATURE_SHARED48K : 0u) |
           ((sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                    (sub.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT)
                ? KILN_FEATURE_SUBGROUP
                : 0u);
}

/* The KILN_FEATURE_* bits pd has; instance (may be VK_NULL_HANDLE) lets
 * coopmat_usable check the fragment sizes too. */
static uint32_t physical_features(VkInstance instance, VkPhysicalDevice pd,
                                  const kiln_allocator *allocator) {
    FeatureChain c;
    feature_chain(&c);
    vkGetPhysicalDeviceFeatures2(pd, &c.f);
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(pd, &p);
    int coopmat = coopmat_usable(instance, pd, &c, allocator);
    return feature_bits(&c, coopmat) |
           (coopmat_wg_usable(instance, pd, coopmat, allocator) ? KILN_FEATURE_COOPMAT_WG
                                                                : 0u) |
           (intdot_usable(pd, allocator) ? KILN_FEATURE_INTDOT : 0u) |
           property_bits(pd, &p.limits, NULL);
}

uint32_t kiln_vulkan_features(VkPhysicalDevice physical_device) {
    return physical_device ? physical_features(VK_NULL_HANDLE, physical_device, NULL) : 0;
}

/* Mesa's lavapipe 22.3 (Debian 12) frees a pointer to the caller's stack
 * through the command pool's allocation callbacks inside
 * vkCmdPipelineBarrier: with the C library's allocator nothing happens, with
 * any other the program aborts. Its command pools, and the VkDevice and
 * VkInstance whose allocators they inherit, get the driver's own allocator;
 * every other object kiln creates still uses the caller's. */
static int driver_callbacks_safe(VkPhysicalDevice pd) {
    VkPhysicalDeviceDriverProperties driver;
    memset(&driver, 0, sizeof driver);
    driver.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES;
    properties_chain(pd, &driver);
    return driver.driverID != VK_DRIVER_ID_MESA_LLVMPIPE;
}

/* Properties kiln reads from the physical device and queue family. */
static void query_device(kiln_device *dev) {
    vkGetPhysicalDeviceProperties(dev->physical, &dev->props);
    /* added to a device's own features or the caller's */
    dev->features |= property_bits(dev->physical, &dev->props.limits, &dev->subgroup_size);
    if (env_off("KILN_SUBGROUP"))
        dev->features &= ~KILN_FEATURE_SUBGROUP;
    vkGetPhysicalDeviceMemoryProperties(dev->physical, &dev->memory);
    uint32_t nfam;
    VkQueueFamilyProperties *fams = queue_families(&dev->allocator, dev->physical, &nfam);
    /* out of memory here: no timestamps (profiling reports it unsupported) */
    dev->timestamp_bits =
        fams && dev->queue_family < nfam ? fams[dev->queue_family].timestampValidBits : 0;
    kiln__free(&dev->allocator, fams);
}

static kiln_status open_device(kiln_device *dev) {
    FeatureChain have_c, want_c;
    feature_chain(&have_c);
    feature_chain(&want_c);
    vkGetPhysicalDeviceFeatures2(dev->physical, &have_c.f);
    int coopmat = !env_off("KILN_COOPMAT") &&
                  coopmat_usable(dev->instance, dev->physical, &have_c, &dev->allocator);
    int intdot = !env_off("KILN_INTDOT") && intdot_usable(dev->physical, &dev->allocator);
    int wg = !env_off("KILN_COOPMAT_WG") &&
             coopmat_wg_usable(dev->instance, dev->physical, coopmat, &dev->allocator);
    dev->features = feature_bits(&have_c, coopmat) | (intdot ? KILN_FEATURE_INTDOT : 0u) |
                    (wg ? KILN_FEATURE_COOPMAT_WG : 0u);
    want_c.v12.bufferDeviceAddress = VK_TRUE;
    want_c.v12.shaderFloat16 = have_c.v12.shaderFloat16;
    want_c.f.features.shaderInt64 = have_c.f.features.shaderInt64;
    want_c.v11.storageBuffer16BitAccess = have_c.v11.storageBuffer16BitAccess;
    want_c.v12.storageBuffer8BitAccess = have_c.v12.storageBuffer8BitAccess;

    float priority = 1.0f;
    VkDeviceQueueCreateInfo qi;
    memset(&qi, 0, sizeof qi);
    qi.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qi.queueFamilyIndex = dev->queue_family;
    qi.queueCount = 1;
    qi.pQueuePriorities = &priority;

    VkDeviceCreateInfo ci;
    memset(&ci, 0, sizeof ci);
    ci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    ci.pNext = &want_c.f;
    ci.queueCreateInfoCount = 1;
    ci.pQueueCreateInfos = &qi;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cm;
    memset(&cm, 0, sizeof cm);
    cm.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV;
    const char *exts[4];
    uint32_t next = 0;
    if (coopmat) {
        cm.cooperativeMatrix = VK_TRUE;
        cm.pNext = want_c.f.pNext;
        want_c.f.pNext = &cm;
        want_c.v12.vulkanMemoryModel = VK_TRUE;
        want_c.v12.vulkanMemoryModelDeviceScope = VK_TRUE;
        exts[next++] = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
    }
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dot;
    memset(&dot, 0, sizeof dot);
    dot.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR;
    if (intdot) {
        dot.shaderIntegerDotProduct = VK_TRUE;
        dot.pNext = want_c.f.pNext;
        want_c.f.pNext = &dot;
        exts[next++] = VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME;
    }
    KilnKhrCoopmatFeatures khr;
    memset(&khr, 0, sizeof khr);
    khr.sType = KILN_ST_KHR_COOPMAT_FEATURES;
    KilnCoopmat2Features c2;
    memset(&c2, 0, sizeof c2);
    c2.sType = KILN_ST_COOPMAT2_FEATURES;
    if (wg) {
        khr.cooperativeMatrix = VK_TRUE;
        c2.workgroupScope = VK_TRUE;
        c2.flexibleDimensions = VK_TRUE;
        khr.pNext = &c2;
        c2.pNext = want_c.f.pNext;
        want_c.f.pNext = &khr;
        exts[next++] = KILN_KHR_COOPMAT_EXTENSION;
        exts[next++] = KILN_NV_COOPMAT2_EXTENSION;
    }
    ci.enabledExtensionCount = next;
    ci.ppEnabledExtensionNames = next ? exts : NULL;
    KILN_VK_RETURN(vkCreateDevice(dev->physical, &ci, dev->vk_alloc_driver, &dev->device));
    vkGetDeviceQueue(dev->device, dev->queue_family, 0, &dev->queue);
    return KILN_OK;
}

/* An allocator (may be NULL) kiln can use: both functions or neither. */
static kiln_status check_allocator(const kiln_allocator *allocator) {
    if (allocator && (allocator->alloc == NULL) != (allocator->free == NULL))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                         "kiln_allocator needs both alloc and free (or neither)");
    return KILN_OK;
}

/* A zeroed device whose host memory comes from allocator (may be NULL). */
static kiln_status new_device(const kiln_allocator *allocator, kiln_device **out) {
    KILN_RETURN_IF_ERROR(check_allocator(allocator));
    *out = (kiln_device *)kiln__calloc(allocator, 1, sizeof **out);
    if (!*out)
        return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating a device");
    if (allocator && allocator->alloc) {
        (*out)->allocator = *allocator;
        kiln__vk_callbacks(&(*out)->allocator, &(*out)->vk_callbacks);
        (*out)->vk_alloc = (*out)->vk_alloc_driver = &(*out)->vk_callbacks;
    }
    return KILN_OK;
}

/* Destroys what kiln created of dev's instance: messenger, instance. */
static void destroy_instance(kiln_device *dev) {
    if (dev->messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT destroy =
            (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
                dev->instance, "vkDestroyDebugUtilsMessengerEXT");
        if (destroy)
            destroy(dev->instance, dev->messenger, dev->vk_alloc_driver);
        dev->messenger = VK_NULL_HANDLE;
    }
    if (dev->instance)
        vkDestroyInstance(dev->instance, dev->vk_alloc_driver);
    dev->instance = VK_NULL_HANDLE;
}

kiln_status kiln_device_create(const kiln_device_options *options,
                               kiln_device **out_device) {
    if (!out_device)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "out_device is NULL");
    *out_device = NULL;
    if (options)
        KILN_RETURN_IF_ERROR(kiln__check_options_size(
            "kiln_device_options", options->size, KILN__DEVICE_OPTIONS_0_2));

    int32_t index = options ? options->index : -1;
    const char *name = options ? options->name_contains : NULL;
    int validation = (options && (options->flags & KILN_DEVICE_VALIDATION)) ||
                     env_flag("KILN_VALIDATION");
    const char *env = getenv("KILN_DEVICE");
    if (!options && env && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (end && *end == 0 && v >= 0 && v < 1024)
            index = (int32_t)v;
        else
            name = env;
    }

    kiln_device *dev = NULL;
    KILN_RETURN_IF_ERROR(new_device(options ? options->allocator : NULL, &dev));
    kiln_status s = create_instance(dev, validation);
    if (s == KILN_OK)
        s = choose_device(dev, index, name);
    if (s == KILN_OK && dev->vk_alloc_driver && !driver_callbacks_safe(dev->physical)) {
        /* The instance's allocator reaches this driver's command pools:
         * start again on the driver's own. */
        destroy_instance(dev);
        dev->vk_alloc_driver = NULL;
        s = create_instance(dev, validation);
        if (s == KILN_OK)
            s = choose_device(dev, index, name);
    }
    if (s == KILN_OK)
        s = open_device(dev);
    if (s == KILN_OK)
        query_device(dev);
    if (s != KILN_OK) {
        kiln_device_destroy(dev);
        return s;
    }
    *out_device = dev;
    return KILN_OK;
}

kiln_status kiln_device_create_vulkan(const kiln_vulkan_handles *h,
                                      const kiln_allocator *allocator,
                                      kiln_device **out_device) {
    if (!out_device)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "out_device is NULL");
    *out_device = NULL;
    if (!h || !h->instance || !h->physical_device || !h->device || !h->queue)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                         "kiln_vulkan_handles needs instance, physical_device, "
                         "device and queue");
    KILN_RETURN_IF_ERROR(check_allocator(allocator)); /* before it allocates */
    char why[128];
    uint32_t compute_family = 0;
    int usable = device_usable(allocator, h->physical_device, &compute_family, why, sizeof why);
    if (usable < 0)
        return NO_MEMORY_FOR("the queue families");
    if (!usable)
        return KILN_FAIL(KILN_ERROR_FEATURE_MISSING, "the physical device lacks %s", why);
    uint32_t nfam;
    VkQueueFamilyProperties *fams = queue_families(allocator, h->physical_device, &nfam);
    if (!fams)
        return NO_MEMORY_FOR("the queue families"); /* device_usable found one */
    int compute = h->queue_family < nfam &&
                  (fams[h->queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT);
    kiln__free(allocator, fams);
    if (!compute)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                         "queue family %u %s", h->queue_family,
                         h->queue_family >= nfam ? "does not exist" : "has no compute");
    if ((h->features & KILN_FEATURE_COOPMAT_WG) && !(h->features & KILN_FEATURE_COOPMAT))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                         "features declares KILN_FEATURE_COOPMAT_WG without "
                         "KILN_FEATURE_COOPMAT");
    uint32_t unsupported =
        h->features & ~physical_features(h->instance, h->physical_device, allocator);
    if (unsupported)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                         "features declares bits 0x%x the physical device does not "
                         "support", unsupported);

    kiln_device *dev = NULL;
    KILN_RETURN_IF_ERROR(new_device(allocator, &dev));
    dev->external = 1;
    dev->instance = h->instance;
    dev->physical = h->physical_device;
    dev->device = h->device;
    dev->queue = h->queue;
    dev->queue_family = h->queue_family;
    dev->features = h->features;
    if (!driver_callbacks_safe(dev->physical))
        dev->vk_alloc_driver = NULL;
    query_device(dev);
    *out_device = dev;
    return KILN_OK;
}

kiln_status kiln_device_get_vulkan(const kiln_device *dev, kiln_vulkan_handles *out) {
    if (!dev || !out)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "device or out_handles is NULL");
    out->instance = dev->instance;
    out->physical_device = dev->physical;
    out->device = dev->device;
    out->queue = dev->queue;
    out->queue_family = dev->queue_family;
    out->features = dev->features;
    return KILN_OK;
}

void kiln_device_destroy(kiln_device *dev) {
    if (!dev)
        return;
    kiln_allocator allocator = dev->allocator; /* dev itself came from it */
    if (!dev->external) {
        if (dev->device)
            vkDestroyDevice(dev->device, dev->vk_alloc_driver);
        destroy_instance(dev);
    }
    kiln__free(&allocator, dev);
}

const char *kiln_device_name(const kiln_device *dev) {
    return dev ? dev->props.deviceName : "(none)";
}

uint32_t kiln_device_validation_count(const kiln_device *dev) {
    return dev ? dev->validation_count : 0;
}

uint32_t kiln_device_features(const kiln_device *dev) {
    return dev ? dev->features : 0;
}
