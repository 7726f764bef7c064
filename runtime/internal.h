/*
 * internal.h: what the runtime's files share and users do not see.
 *
 * Sections are named after the file that defines them. Every function that
 * can fail returns kiln_status and, on failure, has recorded a message with
 * its source location through kiln__fail (status.c).
 */
#ifndef KILN_INTERNAL_H
#define KILN_INTERNAL_H

#include "kiln_hash.h"
#include "kiln_rt.h"

#include <vulkan/vulkan.h>

#include <stddef.h>
#include <stdio.h>

/* ---- status.c ---------------------------------------------------------- */

/* Records "file:line: message" as this thread's last error, returns status. */
kiln_status kiln__fail(kiln_status status, const char *file, int line,
                       const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* Maps a VkResult to a status and records which call failed. */
kiln_status kiln__vk_fail(VkResult result, const char *file, int line,
                          const char *what);
const char *kiln__vk_result_name(VkResult result);

#define KILN_FAIL(status, ...) kiln__fail((status), __FILE__, __LINE__, __VA_ARGS__)

/* Evaluates a Vulkan call; on failure records it and returns the status. */
#define KILN_VK_RETURN(call)                                                 \
    do {                                                                     \
        VkResult kiln_vr_ = (call);                                          \
        if (kiln_vr_ != VK_SUCCESS)                                          \
            return kiln__vk_fail(kiln_vr_, __FILE__, __LINE__, #call);       \
    } while (0)

/* As above, but stores the status in `st` and jumps to `label`. */
#define KILN_VK_GOTO(st, call, label)                                        \
    do {                                                                     \
        VkResult kiln_vr_ = (call);                                          \
        if (kiln_vr_ != VK_SUCCESS) {                                        \
            (st) = kiln__vk_fail(kiln_vr_, __FILE__, __LINE__, #call);       \
            goto label;                                                      \
        }                                                                    \
    } while (0)

#define KILN_RETURN_IF_ERROR(expr)                                           \
    do {                                                                     \
        kiln_status kiln_st_ = (expr);                                       \
        if (kiln_st_ != KILN_OK)                                             \
            return kiln_st_;                                                 \
    } while (0)

/* The bytes of an options struct's fields as of 0.2.0 (the first version
 * with a size field): they end with its last field of then. A field added
 * later is read only when the caller's size covers it (offsetof + sizeof
 * <= size); size 0 means the fields of 0.2.0. */
#define KILN__DEVICE_OPTIONS_0_2 \
    (offsetof(kiln_device_options, allocator) + sizeof(const kiln_allocator *))
#define KILN__MODEL_OPTIONS_0_2 \
    (offsetof(kiln_model_options, weights_path) + sizeof(const char *))
/* Whether an options struct of the caller's size holds field (added after
 * 0.2.0): size 0 means the fields of 0.2.0 only. */
#define KILN__HAS_FIELD(opts, type, field) \
    ((opts) && (opts)->size >= offsetof(type, field) + sizeof((opts)->field))
/* KILN_OK, or an error naming the struct when size is nonzero and smaller
 * than its fields of 0.2.0. */
kiln_status kiln__check_options_size(const char *type, uint32_t size, size_t size_0_2);

/* ---- alloc.c ----------------------------------------------------------- */

/* calloc and free for everything the runtime allocates on the host: through
 * allocator when it is not NULL and has alloc set, else the C library. */
void *kiln__calloc(const kiln_allocator *allocator, size_t n, size_t size);
void kiln__free(const kiln_allocator *allocator, void *p);
/* Vulkan allocation callbacks that call allocator (which must outlive
 * them); pUserData is allocator. */
void kiln__vk_callbacks(kiln_allocator *allocator, VkAllocationCallbacks *out);

#ifdef KILN_FAULT_INJECTION
/* Fault-injection builds only (make fault-test): the Nth host allocation
 * (alloc_n) and the Nth Vulkan call that returns a VkResult (vk_n) fail, the
 * latter with vk_result; 0 means never. Resets the counts. */
typedef struct kiln_fault_counts {
    uint64_t allocs, frees, vk_calls;
} kiln_fault_counts;
void kiln_fault_set(uint64_t alloc_n, uint64_t vk_n, int vk_result);
kiln_fault_counts kiln_fault_get(void);
/* 1 when this Vulkan call is the one to fail (with kiln__fault_result). */
int kiln__fault_vk(void);
extern VkResult kiln__fault_result;

/* Each call site below either fails with the injected result, without
 * calling Vulkan, or makes the real call (a macro does not expand inside
 * its own expansion, so the inner name is the Vulkan function). */
#define KILN__FAULTY(call) (kiln__fault_vk() ? kiln__fault_result : (call))
#define vkCreateInstance(...) KILN__FAULTY(vkCreateInstance(__VA_ARGS__))
#define vkEnumeratePhysicalDevices(...) KILN__FAULTY(vkEnumeratePhysicalDevices(__VA_ARGS__))
#define vkEnumerateInstanceLayerProperties(...) \
    KILN__FAULTY(vkEnumerateInstanceLayerProperties(__VA_ARGS__))
#define vkCreateDevice(...) KILN__FAULTY(vkCreateDevice(__VA_ARGS__))
#define vkCreateBuffer(...) KILN__FAULTY(vkCreateBuffer(__VA_ARGS__))
#define vkAllocateMemory(...) KILN__FAULTY(vkAllocateMemory(__VA_ARGS__))
#define vkBindBufferMemory(...) KILN__FAULTY(vkBindBufferMemory(__VA_ARGS__))
#define vkMapMemory(...) KILN__FAULTY(vkMapMemory(__VA_ARGS__))
#define vkCreateCommandPool(...) KILN__FAULTY(vkCreateCommandPool(__VA_ARGS__))
#define vkAllocateCommandBuffers(...) KILN__FAULTY(vkAllocateCommandBuffers(__VA_ARGS__))
#define vkBeginCommandBuffer(...) KILN__FAULTY(vkBeginCommandBuffer(__VA_ARGS__))
#define vkEndCommandBuffer(...) KILN__FAULTY(vkEndCommandBuffer(__VA_ARGS__))
#define vkCreateFence(...) KILN__FAULTY(vkCreateFence(__VA_ARGS__))
#define vkResetFences(...) KILN__FAULTY(vkResetFences(__VA_ARGS__))
#define vkQueueSubmit(...) KILN__FAULTY(vkQueueSubmit(__VA_ARGS__))
#define vkWaitForFences(...) KILN__FAULTY(vkWaitForFences(__VA_ARGS__))
#define vkGetFenceStatus(...) KILN__FAULTY(vkGetFenceStatus(__VA_ARGS__))
#define vkCreatePipelineLayout(...) KILN__FAULTY(vkCreatePipelineLayout(__VA_ARGS__))
#define vkCreatePipelineCache(...) KILN__FAULTY(vkCreatePipelineCache(__VA_ARGS__))
#define vkCreateShaderModule(...) KILN__FAULTY(vkCreateShaderModule(__VA_ARGS__))
#define vkCreateComputePipelines(...) KILN__FAULTY(vkCreateComputePipelines(__VA_ARGS__))
#define vkCreateQueryPool(...) KILN__FAULTY(vkCreateQueryPool(__VA_ARGS__))
#define vkGetQueryPoolResults(...) KILN__FAULTY(vkGetQueryPoolResults(__VA_ARGS__))
#define vkCreateDescriptorSetLayout(...) KILN__FAULTY(vkCreateDescriptorSetLayout(__VA_ARGS__))
#define vkCreateDescriptorPool(...) KILN__FAULTY(vkCreateDescriptorPool(__VA_ARGS__))
#define vkAllocateDescriptorSets(...) KILN__FAULTY(vkAllocateDescriptorSets(__VA_ARGS__))
#endif

/* ---- device.c ---------------------------------------------------------- */

struct kiln_device {
    VkInstance instance;
    VkPhysicalDevice physical;
    VkDevice device;
    VkQueue queue;
    uint32_t queue_family;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memory;
    uint32_t features;        /* KILN_FEATURE_* the device has and enabled */
    uint32_t subgroup_size;   /* queried, never assumed */
    uint32_t timestamp_bits;  /* of the queue family; 0: no timestamps */
    VkDebugUtilsMessengerEXT messenger;
    uint32_t validation_count;
    int external;             /* instance, device and queue are the caller's */
    kiln_allocator allocator; /* alloc NULL: the C library */
    VkAllocationCallbacks vk_callbacks;
    const VkAllocationCallbacks *vk_alloc; /* &vk_callbacks, or NULL */
    /* For the objects whose allocator a driver's command recording inherits
     * (the instance and VkDevice kiln creates, command pools): vk_alloc, or
     * NULL on a driver that misuses it (device.c, driver_callbacks_safe). */
    const VkAllocationCallbacks *vk_alloc_driver;
};

/* ---- buffer.c ---------------------------------------------------------- */

typedef struct kiln__buffer {
    VkBuffer buffer;
    VkDeviceMemory memory;
    VkDeviceSize size;      /* bytes */
    VkDeviceAddress address; /* 0 unless created with device-address usage */
    void *mapped;           /* host pointer when host-visible, else NULL */
    int host_cached;        /* mapped memory is HOST_CACHED: fast to read */
} kiln__buffer;

typedef enum kiln__memory_kind {
    KILN__MEMORY_DEVICE,  /* device-local preferred */
    KILN__MEMORY_STAGING  /* host-visible and coherent required */
} kiln__memory_kind;

/* Creates a buffer of max(size, 16) bytes with the given usage; adds device
 * address usage when VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT is in usage. */
kiln_status kiln__buffer_create(kiln_device *dev, VkDeviceSize size,
                                VkBufferUsageFlags usage,
                                kiln__memory_kind kind, kiln__buffer *out);
void kiln__buffer_destroy(kiln_device *dev, kiln__buffer *buf);

/* ---- model.c and model_*.c: a model's objects and runs ---------------- */

/* Push constants: one 64-bit device address per binding. */
#define KILN__PUSH_BYTES (KILN_MAX_BINDINGS * 8u)
/* A dynamic dispatch's indirect command in the arena and in staging. */
#define KILN__INDIRECT_BYTES ((uint64_t)sizeof(VkDispatchIndirectCommand))
/* The dynamic dims' values as the kernels read them: KILN_MAX_DIMS int32. */
#define KILN__DIMS_BYTES (4u * KILN_MAX_DIMS)

/* Recordings of a dynamic model (its idle dispatches left out, its I/O
 * copies cut to the run's elements), at most. */
#define KILN__RECORDINGS 8

struct kiln_model {
    kiln_device *device;
    const kiln_allocator *host; /* the device's allocator (it outlives m) */
    int owns_device;
    const kiln_model_desc *desc;
    kiln__buffer arena, weights, io;
    VkPipelineLayout layout;
    VkPipelineCache cache;
    /* model_pipeline_cache.c: the file (NULL: off) and what was read from it */
    char *pipeline_cache_path;
    void *pipeline_cache_data;
    size_t pipeline_cache_bytes;
    VkPipeline *pipelines; /* desc->kernel_count */
    VkCommandPool pool;
    VkCommandBuffer cmd; /* every dispatch this device runs, recorded at create */
    /* model_record.c: recordings that leave out the dispatches a run's dims
     * give no workgroups (a product's variant for other row counts), one
     * per set of them, made the first time a run's dims give that set; idle
     * flags the current dims' set (dispatch_count flags, idle_count of them
     * set: kiln__write_dims), for a model with dynamic dispatches. */
    struct kiln__recording {
        VkCommandBuffer cmd;
        uint8_t *idle;   /* NULL where the model has no dynamic dispatches */
        uint64_t *spans; /* the bytes it copies of each input, then output */
        uint64_t used;   /* m->uses when last chosen: the least recent is
                          * recorded over once all KILN__RECORDINGS are made */
    } recordings[KILN__RECORDINGS];
    uint32_t recording_count;
    uint64_t uses;
    uint8_t *idle;
    uint32_t idle_count;
    /* model_dims.c: the bytes of each input, then output, that a run at the
     * current dims copies between staging and the arena (the run's elements
     * at the largest shape's strides, rounded up: kiln__write_dims), and
     * whether any is short of the whole tensor; NULL without dims */
    uint64_t *spans;
    int spans_short;
    /* the idle flags of the recording the last run submitted (NULL: the
     * full one), for kiln_model_profile */
    const uint8_t *ran_idle;
    VkFence fence;
    VkQueryPool timestamps; /* dispatch_count + 1 queries, when profiling */
    /* Not KILN_OK once a run failed after its submit (the device was lost,
     * or the fence's state is unknown): every later run returns it. */
    kiln_status broken;
    int ran;  /* a run has completed (profiles and debug reads need one) */
    int64_t dims[KILN_MAX_DIMS]; /* the dynamic dimensions of the next run */
    const char *weights_path; /* the sidecar file, when desc->weights is NULL */
    const char *pipeline_cache_option; /* kiln_model_options.pipeline_cache */
    /* desc->sync_check: a descriptor set per dispatch (VK_NULL_HANDLE for
     * dispatches this device skips), and a buffer behind the bindings that
     * touch no bytes (each gets its own slice). */
    VkDescriptorSetLayout set_layout;
    VkDescriptorPool descriptor_pool;
    VkDescriptorSet *sets;
    kiln__buffer sink;
    /* Direct I/O (choose_direct_io): the inputs and outputs the dispatches
     * reach in the staging buffer itself, so that a run copies none of them
     * on the device. Arena bytes [begin, end) are staging bytes from io on. */
    struct direct_range {
        uint64_t begin, end, io;
    } *direct;
    uint32_t direct_count;
    /* A guarded model with direct I/O: the bytes of staging no input,
     * output, guard band copy, dims or indirect commands own (the bands the
     * compiler left around each input and output), filled with
     * KILN_GUARD_PATTERN before each run and checked after; after names the
     * input or output just before each ("" for the start of staging). */
    struct staging_gap {
        uint64_t begin, end;
        const char *after;
    } *gaps;
    uint32_t gap_count;
};

/* model_dims.c */
int64_t kiln__eval_extent(const kiln_extent *e, const int64_t *dims);
/* Copies tensor t from src to dst, between its packed layout (contiguous
 * at the current dims' extents: what kiln_model_run's caller passes) and
 * its stored one (the largest shape's strides: staging); to_stored: dst is
 * the stored one. */
void kiln__copy_extent(const kiln_model *m, const kiln_tensor_info *t, void *dst,
                       const void *src, int to_stored);
/* The dynamic-dimension and state tables: counts, ranges and offsets that fit. */
kiln_status kiln__check_dims(const kiln_model_desc *d);
/* The dims and every dynamic dispatch's workgroup counts into staging; the
 * dispatches they leave idle flagged (m->idle). */
void kiln__write_dims(kiln_model *m);

/* model_pipeline_cache.c: option is kiln_model_options.pipeline_cache
 * (NULL: the default path). load fills ci's initial data when the file is
 * this device's and intact; save writes the cache after the pipelines are
 * made, when it changed; free releases both. None of them fails. */
void kiln__pipeline_cache_load(kiln_model *m, VkPipelineCacheCreateInfo *ci);
/* Sets m->pipeline_cache_path (NULL: off) from the option, once. */
void kiln__pipeline_cache_locate(kiln_model *m);
/* The weights sidecar's record beside the pipeline cache: whether f's
 * stat and checksum match the one saved after the last full check. */
int kiln__weights_stamp_matches(kiln_model *m, FILE *f, uint64_t checksum);
void kiln__weights_stamp_save(kiln_model *m, FILE *f, uint64_t checksum);
void kiln__pipeline_cache_save(kiln_model *m);
void kiln__pipeline_cache_free(kiln_model *m);

/* model_weights.c: the weights into m->weights at create, from the C or
 * the sidecar file (m->weights_path), checked. */
kiln_status kiln__upload_weights(kiln_model *m);

/* model_transfer.c */
kiln_status kiln__begin_commands(kiln_model *m, VkCommandBufferUsageFlags flags,
                                 VkCommandBuffer *out);
kiln_status kiln__submit_once(kiln_model *m, VkCommandBuffer cmd);
kiln_status kiln__upload(kiln_model *m, VkBuffer dst, uint64_t offset, uint64_t bytes,
                         const void *src);
void kiln__memory_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src_stage,
                          VkAccessFlags src, VkPipelineStageFlags dst_stage,
                          VkAccessFlags dst);

/* model_io.c */
const kiln__buffer *kiln__buffer_of(const kiln_model *m, uint32_t which);
const kiln__buffer *kiln__locate(const kiln_model *m, uint32_t which, uint64_t begin,
                                 uint64_t end, int64_t *shift);
const kiln_tensor_info *kiln__io_tensor(const kiln_model_desc *d, uint32_t i);
int kiln__is_direct(const kiln_model *m, const kiln_tensor_info *t);
kiln_status kiln__choose_direct_io(kiln_model *m, int staged);

/* model_check.c */
kiln_status kiln__find_staging_gaps(kiln_model *m);
kiln_status kiln__create_sync_sets(kiln_model *m);
kiln_status kiln__check_guards(const kiln_model *m);
void kiln__fill_staging_gaps(kiln_model *m);

/* model_record.c */
/* The command buffer for a run at the current dims: a recording without
 * the dispatches they leave idle and with I/O copies of m->spans bytes
 * (made here the first time, over the least recently used once
 * KILN__RECORDINGS are made; cmd when none is idle and no copy is short,
 * or when recording fails: cmd is always right, its idle dispatches run no
 * workgroups and it copies whole tensors). */
VkCommandBuffer kiln__recording(kiln_model *m);
/* Whether this device records dispatch x (kiln_dispatch.needs, .unless). */
int kiln__dispatch_active(const kiln_device *dev, const kiln_dispatch *x);
kiln_status kiln__record(kiln_model *m);

#endif /* KILN_INTERNAL_H */
