/* cm2_probe.c: an experiment, not part of kiln. Lists what the device
 * offers of VK_NV_cooperative_matrix2 (and VK_KHR_cooperative_matrix's
 * shapes), then times C = A x B (f16 [M, K] x [K, N], C f16) with each
 * SPIR-V kernel named on the command line (gemm_cm2.comp's builds: push
 * constants M, N, K; bindings A, B, C; workgroups N / BN x M / BM),
 * median GPU time of --runs dispatches, each product checked at 4096
 * sampled elements against a double-precision sum (kernels whose name
 * holds "ceil" are not checked: they do not compute the product).
 *
 *   cm2_probe M K N runs kernel.spv:BM:BN:NT ...
 *
 * CM2_STATS=1: also the driver's statistics of each pipeline (registers,
 * shared memory), through VK_KHR_pipeline_executable_properties.
 *
 * Debian 12's Vulkan headers (1.3.239) predate both extensions: their
 * structures are declared here from the registry. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>

#define CHECK(x)                                                                              \
    do {                                                                                      \
        VkResult r_ = (x);                                                                    \
        if (r_ != VK_SUCCESS) {                                                               \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, r_);                 \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

typedef struct {
    VkStructureType sType;
    void *pNext;
    VkBool32 workgroupScope, flexibleDimensions, reductions, conversions, perElement,
        tensorAddressing, blockLoads;
} Cm2Features; /* VkPhysicalDeviceCooperativeMatrix2FeaturesNV */
typedef struct {
    VkStructureType sType;
    void *pNext;
    uint32_t wgMaxSize, flexMaxDim, wgReservedShared;
} Cm2Props; /* VkPhysicalDeviceCooperativeMatrix2PropertiesNV */
typedef struct {
    VkStructureType sType;
    void *pNext;
    uint32_t mGran, nGran, kGran;
    uint32_t aType, bType, cType, resultType;
    VkBool32 saturating;
    uint32_t scope, invocations;
} FlexProps; /* VkCooperativeMatrixFlexibleDimensionsPropertiesNV */
typedef struct {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix, robust;
} KhrFeatures; /* VkPhysicalDeviceCooperativeMatrixFeaturesKHR */
typedef struct {
    VkStructureType sType;
    void *pNext;
    uint32_t m, n, k, aType, bType, cType, resultType;
    VkBool32 saturating;
    uint32_t scope;
} KhrProps; /* VkCooperativeMatrixPropertiesKHR */
#define ST_CM2_FEATURES ((VkStructureType)1000593000)
#define ST_FLEX_PROPS ((VkStructureType)1000593001)
#define ST_CM2_PROPS ((VkStructureType)1000593002)
#define ST_KHR_FEATURES ((VkStructureType)1000506000)
#define ST_KHR_PROPS ((VkStructureType)1000506001)
typedef VkResult(VKAPI_PTR *PFN_flex)(VkPhysicalDevice, uint32_t *, FlexProps *);
typedef VkResult(VKAPI_PTR *PFN_khr)(VkPhysicalDevice, uint32_t *, KhrProps *);

static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t s = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
    int ee = (int)e - 127 + 15;
    if (ee <= 0) return (uint16_t)s;
    if (ee >= 31) return (uint16_t)(s | 0x7c00);
    uint32_t h = s | ((uint32_t)ee << 10) | (m >> 13);
    if ((m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}
static float from_half(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) return (s ? -1.f : 1.f) * ldexpf((float)m, -24);
    if (e == 31) return s ? -INFINITY : INFINITY;
    uint32_t x = s | ((e - 15 + 127) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static VkDevice dev;
static VkPhysicalDevice phys;
static uint32_t mem_type(uint32_t bits, VkMemoryPropertyFlags want) {
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(phys, &mp);
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++)
        if ((bits >> i & 1) && (mp.memoryTypes[i].propertyFlags & want) == want) return i;
    fprintf(stderr, "no memory type\n");
    exit(1);
}
typedef struct { VkBuffer b; VkDeviceMemory m; void *map; } Buf;
static Buf buffer(VkDeviceSize size, int host) {
    Buf r = {0};
    VkBufferCreateInfo bi = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = size;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
               VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    CHECK(vkCreateBuffer(dev, &bi, NULL, &r.b));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, r.b, &req);
    VkMemoryAllocateInfo ai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = mem_type(req.memoryTypeBits,
                                  host ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                             VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                       : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    CHECK(vkAllocateMemory(dev, &ai, NULL, &r.m));
    CHECK(vkBindBufferMemory(dev, r.b, r.m, 0));
    if (host) CHECK(vkMapMemory(dev, r.m, 0, size, 0, &r.map));
    return r;
}
/* The driver's statistics of a pipeline (VK_KHR_pipeline_executable_properties:
 * registers, shared memory, ...), one line. */
static void print_stats(VkPipeline pipe) {
    PFN_vkGetPipelineExecutableStatisticsKHR gs = (PFN_vkGetPipelineExecutableStatisticsKHR)
        vkGetDeviceProcAddr(dev, "vkGetPipelineExecutableStatisticsKHR");
    if (!gs) return;
    VkPipelineExecutableInfoKHR ei = {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, NULL, pipe, 0};
    VkPipelineExecutableStatisticKHR st[32];
    uint32_t ns = 32;
    for (uint32_t j = 0; j < ns; j++) {
        memset(&st[j], 0, sizeof st[j]);
        st[j].sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR;
    }
    if (gs(dev, &ei, &ns, st) < 0) return;
    printf("    stats:");
    for (uint32_t j = 0; j < ns; j++) {
        if (st[j].format == VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR)
            printf(" %s %llu;", st[j].name, (unsigned long long)st[j].value.u64);
        else if (st[j].format == VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR)
            printf(" %s %lld;", st[j].name, (long long)st[j].value.i64);
        else if (st[j].format == VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR)
            printf(" %s %u;", st[j].name, st[j].value.b32);
        else
            printf(" %s %g;", st[j].name, st[j].value.f64);
    }
    printf("\n");
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: cm2_probe M K N runs kernel.spv:BM:BN:NT ...\n");
        return 2;
    }
    const uint32_t M = (uint32_t)atoi(argv[1]), K = (uint32_t)atoi(argv[2]),
                   N = (uint32_t)atoi(argv[3]);
    const int runs = atoi(argv[4]);
    VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.apiVersion = VK_API_VERSION_1_3;
    VkInstanceCreateInfo ici = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ici.pApplicationInfo = &app;
    VkInstance inst;
    CHECK(vkCreateInstance(&ici, NULL, &inst));
    uint32_t np = 1;
    CHECK(vkEnumeratePhysicalDevices(inst, &np, &phys));
    VkPhysicalDeviceProperties pp;
    vkGetPhysicalDeviceProperties(phys, &pp);
    printf("device %s, driver %u.%u, maxComputeSharedMemorySize %u\n", pp.deviceName,
           pp.driverVersion >> 22, (pp.driverVersion >> 14) & 0xff,
           pp.limits.maxComputeSharedMemorySize);

    Cm2Features cf = {ST_CM2_FEATURES};
    KhrFeatures kf = {ST_KHR_FEATURES, &cf};
    VkPhysicalDeviceVulkan12Features v12 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, &kf};
    VkPhysicalDeviceVulkan11Features v11 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, &v12};
    VkPhysicalDeviceFeatures2 f2 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &v11};
    vkGetPhysicalDeviceFeatures2(phys, &f2);
    printf("KHR coopmat %u; cm2: workgroup scope %u, flexible %u, reductions %u, conversions %u, "
           "per-element %u, tensor addressing %u, block loads %u\n",
           kf.cooperativeMatrix, cf.workgroupScope, cf.flexibleDimensions, cf.reductions,
           cf.conversions, cf.perElement, cf.tensorAddressing, cf.blockLoads);
    Cm2Props cp = {ST_CM2_PROPS};
    VkPhysicalDeviceProperties2 p2 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &cp};
    vkGetPhysicalDeviceProperties2(phys, &p2);
    printf("cm2: workgroup max size %u, flexible max dimension %u, reserved shared %u\n",
           cp.wgMaxSize, cp.flexMaxDim, cp.wgReservedShared);
    PFN_flex flex = (PFN_flex)vkGetInstanceProcAddr(
        inst, "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV");
    if (flex) {
        uint32_t nf = 0;
        flex(phys, &nf, NULL);
        FlexProps *fp = calloc(nf, sizeof *fp);
        for (uint32_t i = 0; i < nf; i++) fp[i].sType = ST_FLEX_PROPS;
        flex(phys, &nf, fp);
        for (uint32_t i = 0; i < nf; i++)
            printf("  flexible: granularity %u x %u x %u, types A %u B %u C %u R %u, scope %u, "
                   "invocations %u\n", fp[i].mGran, fp[i].nGran, fp[i].kGran, fp[i].aType,
                   fp[i].bType, fp[i].cType, fp[i].resultType, fp[i].scope, fp[i].invocations);
    }
    PFN_khr khr = (PFN_khr)vkGetInstanceProcAddr(
        inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
    if (khr) {
        uint32_t nk = 0;
        khr(phys, &nk, NULL);
        KhrProps *kp = calloc(nk, sizeof *kp);
        for (uint32_t i = 0; i < nk; i++) kp[i].sType = ST_KHR_PROPS;
        khr(phys, &nk, kp);
        for (uint32_t i = 0; i < nk; i++)
            if (kp[i].aType == 0 /* f16 */)
                printf("  KHR: %u x %u x %u, types A %u B %u C %u R %u, scope %u\n", kp[i].m,
                       kp[i].n, kp[i].k, kp[i].aType, kp[i].bType, kp[i].cType,
                       kp[i].resultType, kp[i].scope);
    }
    if (!cf.workgroupScope || !cf.tensorAddressing || !cf.flexibleDimensions) {
        printf("no workgroup-scope tensor-addressed cooperative matrices: nothing to time\n");
        return 0;
    }

    float prio = 1;
    VkDeviceQueueCreateInfo qi = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qi.queueCount = 1;
    qi.pQueuePriorities = &prio; /* family 0: NVIDIA's graphics+compute */
    const char *exts[] = {"VK_KHR_cooperative_matrix", "VK_NV_cooperative_matrix2",
                          "VK_KHR_pipeline_executable_properties"};
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR pef = {
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR, NULL, 1};
    const int stats = getenv("CM2_STATS") != NULL; /* the driver's statistics of each kernel */
    Cm2Features wcf = {ST_CM2_FEATURES, stats ? &pef : NULL, 1, 1, 0, 0, 0, 1, 0};
    KhrFeatures wkf = {ST_KHR_FEATURES, &wcf, 1, 0};
    VkPhysicalDeviceVulkan12Features w12 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, &wkf};
    w12.shaderFloat16 = 1;
    w12.vulkanMemoryModel = 1;
    w12.vulkanMemoryModelDeviceScope = 1;
    VkPhysicalDeviceVulkan11Features w11 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, &w12};
    w11.storageBuffer16BitAccess = 1;
    VkPhysicalDeviceFeatures2 wf2 = {VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &w11};
    VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &wf2};
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qi;
    dci.enabledExtensionCount = stats ? 3 : 2;
    dci.ppEnabledExtensionNames = exts;
    CHECK(vkCreateDevice(phys, &dci, NULL, &dev));
    VkQueue q;
    vkGetDeviceQueue(dev, 0, 0, &q);

    const VkDeviceSize sa = (VkDeviceSize)M * K * 2, sb = (VkDeviceSize)K * N * 2,
                       sc = (VkDeviceSize)M * N * 2;
    Buf ha = buffer(sa, 1), hb = buffer(sb, 1), hc = buffer(sc, 1);
    Buf da = buffer(sa, 0), db = buffer(sb, 0), dc = buffer(sc, 0);
    uint16_t *A = ha.map, *B = hb.map;
    srand(5);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = to_half(((float)rand() / RAND_MAX - 0.5f));
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = to_half(((float)rand() / RAND_MAX - 0.5f));

    VkCommandPoolCreateInfo pci = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    VkCommandPool pool;
    CHECK(vkCreateCommandPool(dev, &pci, NULL, &pool));
    VkCommandBufferAllocateInfo cai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = pool;
    cai.commandBufferCount = 1;
    VkCommandBuffer cb;
    CHECK(vkAllocateCommandBuffers(dev, &cai, &cb));
    VkFenceCreateInfo fci = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence;
    CHECK(vkCreateFence(dev, &fci, NULL, &fence));
    VkCommandBufferBeginInfo cbi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
#define SUBMIT()                                                                              \
    do {                                                                                      \
        CHECK(vkEndCommandBuffer(cb));                                                        \
        VkSubmitInfo si_ = {VK_STRUCTURE_TYPE_SUBMIT_INFO};                                   \
        si_.commandBufferCount = 1;                                                           \
        si_.pCommandBuffers = &cb;                                                            \
        CHECK(vkQueueSubmit(q, 1, &si_, fence));                                              \
        CHECK(vkWaitForFences(dev, 1, &fence, 1, UINT64_MAX));                                \
        CHECK(vkResetFences(dev, 1, &fence));                                                 \
    } while (0)
    CHECK(vkBeginCommandBuffer(cb, &cbi));
    VkBufferCopy ca = {0, 0, sa}, cbc = {0, 0, sb};
    vkCmdCopyBuffer(cb, ha.b, da.b, 1, &ca);
    vkCmdCopyBuffer(cb, hb.b, db.b, 1, &cbc);
    SUBMIT();

    VkDescriptorSetLayoutBinding bind[3];
    for (int i = 0; i < 3; i++)
        bind[i] = (VkDescriptorSetLayoutBinding){(uint32_t)i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                                 VK_SHADER_STAGE_COMPUTE_BIT, NULL};
    VkDescriptorSetLayoutCreateInfo dli = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    dli.bindingCount = 3;
    dli.pBindings = bind;
    VkDescriptorSetLayout dsl;
    CHECK(vkCreateDescriptorSetLayout(dev, &dli, NULL, &dsl));
    VkPushConstantRange pr = {VK_SHADER_STAGE_COMPUTE_BIT, 0, 12};
    VkPipelineLayoutCreateInfo pli = {VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    pli.setLayoutCount = 1;
    pli.pSetLayouts = &dsl;
    pli.pushConstantRangeCount = 1;
    pli.pPushConstantRanges = &pr;
    VkPipelineLayout pl;
    CHECK(vkCreatePipelineLayout(dev, &pli, NULL, &pl));
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 3};
    VkDescriptorPoolCreateInfo dpi = {VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    dpi.maxSets = 1;
    dpi.poolSizeCount = 1;
    dpi.pPoolSizes = &ps;
    VkDescriptorPool dp;
    CHECK(vkCreateDescriptorPool(dev, &dpi, NULL, &dp));
    VkDescriptorSetAllocateInfo dsai = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    dsai.descriptorPool = dp;
    dsai.descriptorSetCount = 1;
    dsai.pSetLayouts = &dsl;
    VkDescriptorSet ds;
    CHECK(vkAllocateDescriptorSets(dev, &dsai, &ds));
    VkDescriptorBufferInfo dbi[3] = {{da.b, 0, sa}, {db.b, 0, sb}, {dc.b, 0, sc}};
    VkWriteDescriptorSet w[3];
    for (int i = 0; i < 3; i++) {
        w[i] = (VkWriteDescriptorSet){VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
        w[i].dstSet = ds;
        w[i].dstBinding = (uint32_t)i;
        w[i].descriptorCount = 1;
        w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w[i].pBufferInfo = &dbi[i];
    }
    vkUpdateDescriptorSets(dev, 3, w, 0, NULL);
    VkQueryPoolCreateInfo qpi = {VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qpi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qpi.queryCount = 2;
    VkQueryPool qp;
    CHECK(vkCreateQueryPool(dev, &qpi, NULL, &qp));
    const double tick_ns = pp.limits.timestampPeriod;

    for (int ki = 5; ki < argc; ki++) {
        char path[512];
        unsigned bm, bn, nt;
        const char *colon = strchr(argv[ki], ':');
        if (!colon || sscanf(colon, ":%u:%u:%u", &bm, &bn, &nt) != 3) {
            fprintf(stderr, "bad kernel %s\n", argv[ki]);
            return 2;
        }
        snprintf(path, sizeof path, "%.*s", (int)(colon - argv[ki]), argv[ki]);
        FILE *f = fopen(path, "rb");
        if (!f) { perror(path); return 1; }
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint32_t *code = malloc((size_t)len);
        if (fread(code, 1, (size_t)len, f) != (size_t)len) return 1;
        fclose(f);
        VkShaderModuleCreateInfo smi = {VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
        smi.codeSize = (size_t)len;
        smi.pCode = code;
        VkShaderModule sm;
        CHECK(vkCreateShaderModule(dev, &smi, NULL, &sm));
        VkComputePipelineCreateInfo cpi = {VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
        cpi.stage = (VkPipelineShaderStageCreateInfo){VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
        cpi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
        cpi.stage.module = sm;
        cpi.stage.pName = "main";
        cpi.layout = pl;
        if (stats)
            cpi.flags = VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
        VkPipeline pipe;
        VkResult pr_ = vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &cpi, NULL, &pipe);
        if (pr_ != VK_SUCCESS) {
            printf("%-40s pipeline creation failed: %d\n", path, pr_);
            continue;
        }
        uint32_t pc[3] = {M, N, K};
        double *us = malloc(sizeof(double) * (size_t)runs);
        for (int r = -20; r < runs; r++) { /* 20 warm-up dispatches */
            CHECK(vkBeginCommandBuffer(cb, &cbi));
            vkCmdResetQueryPool(cb, qp, 0, 2);
            vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
            vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl, 0, 1, &ds, 0, NULL);
            vkCmdPushConstants(cb, pl, VK_SHADER_STAGE_COMPUTE_BIT, 0, 12, pc);
            vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
            vkCmdDispatch(cb, N / bn, M / bm, 1);
            vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
            SUBMIT();
            uint64_t ts[2];
            CHECK(vkGetQueryPoolResults(dev, qp, 0, 2, sizeof ts, ts, 8,
                                        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT));
            if (r >= 0) us[r] = (double)(ts[1] - ts[0]) * tick_ns / 1e3;
        }
        qsort(us, (size_t)runs, sizeof *us, cmp_d);
        double med = us[runs / 2];
        /* the product, checked at sampled elements */
        CHECK(vkBeginCommandBuffer(cb, &cbi));
        VkBufferCopy cc = {0, 0, sc};
        vkCmdCopyBuffer(cb, dc.b, hc.b, 1, &cc);
        SUBMIT();
        const uint16_t *C = hc.map;
        double worst = 0, big = 0;
        /* a kernel named *-bt* reads B as [N, K] (K contiguous) */
        const int bt = strstr(path, "-bt") != NULL;
        if (!strstr(path, "ceil")) {
            srand(7);
            for (int s = 0; s < 4096; s++) {
                uint32_t i = (uint32_t)rand() % M, j = (uint32_t)rand() % N;
                double want = 0;
                for (uint32_t k = 0; k < K; k++)
                    want += (double)from_half(A[(size_t)i * K + k]) *
                            from_half(bt ? B[(size_t)j * K + k] : B[(size_t)k * N + j]);
                double got = from_half(C[(size_t)i * N + j]);
                if (fabs(got - want) > worst || got != got) worst = got != got ? INFINITY : fabs(got - want);
                if (fabs(want) > big) big = fabs(want);
            }
        }
        printf("%-40s %ux%ux%u: %9.1f us %6.1f TFLOP/s  (min %.1f)  %s %.1e\n", path, M, K, N,
               med, 2.0 * M * N * K / med / 1e6, us[0],
               strstr(path, "ceil") ? "not checked" : "max |err| / max |C|", big ? worst / big : 0);
        if (stats)
            print_stats(pipe);
        fflush(stdout);
        free(us);
        vkDestroyPipeline(dev, pipe, NULL);
        vkDestroyShaderModule(dev, sm, NULL);
        free(code);
    }
    return 0;
}
