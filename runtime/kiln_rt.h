/*
 * kiln_rt.h: the kiln runtime, the only library a kiln-generated model needs.
 *
 * A model compiled by `kiln compile model.yaml -o model.c` is a set of
 * constant tables (kernels as SPIR-V, a dispatch schedule, tensor offsets,
 * weights) plus five small functions that hand those tables to this runtime.
 * Using one looks like this:
 *
 *     #include "model.h"
 *
 *     kiln_device *dev = NULL;
 *     kiln_model *m = NULL;
 *     kiln_status s = kiln_device_create(NULL, &dev);   // best device present
 *     if (s == KILN_OK) s = model_create(dev, &m);      // pipelines, arena,
 *                                                       // weights, one
 *                                                       // recorded command
 *                                                       // buffer
 *     const void *in[] = {x};                           // host pointers, in
 *     void *out[] = {y};                                // the order of
 *     if (s == KILN_OK) s = model_run(m, in, out);      // model_inputs[]
 *     if (s != KILN_OK)
 *         fprintf(stderr, "%s: %s\n", kiln_status_string(s), kiln_last_error());
 *     model_destroy(m);
 *     kiln_device_destroy(dev);
 *
 * Rules:
 * - Every fallible call returns a kiln_status; KILN_OK is 0. Nothing here
 *   aborts or asserts. kiln_last_error() describes the last failure on the
 *   calling thread, with the runtime file and line where it happened.
 * - create functions set *out to NULL first and return an owned object;
 *   destroy functions accept NULL.
 * - kiln_model_run allocates nothing and records nothing: it copies inputs
 *   into mapped staging memory, submits the command buffer recorded at
 *   create, waits on one fence and copies outputs back.
 * - Thread safety: a kiln_model may be used from one thread at a time.
 *   Models that share a kiln_device share its queue, which Vulkan requires
 *   to be externally synchronized: run, create, read and destroy them from
 *   one thread, or under one lock. A device made from your own Vulkan
 *   objects (kiln_rt_vulkan.h) shares your queue: hold the lock you use for
 *   that queue around every kiln call on the device and its models.
 *   Different kiln_devices are independent. kiln_last_error() is per thread.
 * - Host memory: all of it comes from the device's kiln_allocator when one
 *   is given (kiln_device_options.allocator), including what the Vulkan
 *   driver allocates for the objects kiln creates; malloc otherwise. It is
 *   all allocated in create and freed in destroy. Exceptions: stdio's FILE
 *   when create reads a weights sidecar, and on Mesa's lavapipe the
 *   instance, VkDevice and command pools (its 22.3 release frees a stack
 *   pointer through their allocator while recording barriers).
 *
 * Environment:
 *   KILN_DEVICE=N or KILN_DEVICE=substring  pick a device by index or name
 *   KILN_VALIDATION=1   enable the Khronos validation layer; every message
 *                       it prints is counted (kiln_device_validation_count)
 */
#ifndef KILN_RT_H
#define KILN_RT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_RT_VERSION "0.1.0"
/* Version of the tables below; the generated code records the one it was
 * written for and create refuses a mismatch. */
#define KILN_ABI_VERSION 7u

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERROR_INVALID_ARGUMENT = 1,
    KILN_ERROR_OUT_OF_HOST_MEMORY = 2,
    KILN_ERROR_OUT_OF_DEVICE_MEMORY = 3,
    KILN_ERROR_NO_DEVICE = 4,         /* no Vulkan device, or none matched */
    KILN_ERROR_FEATURE_MISSING = 5,   /* the device lacks what the model needs */
    KILN_ERROR_DEVICE_LOST = 6,
    KILN_ERROR_VULKAN = 7,            /* any other Vulkan failure */
    KILN_ERROR_INCOMPATIBLE = 8,      /* tables from another kiln version */
    KILN_ERROR_OUT_OF_BOUNDS = 9,     /* a kernel wrote into a guard band (--guard) */
    KILN_ERROR_WEIGHTS = 10,          /* weights file missing, truncated or corrupt */
    KILN_ERROR_OUT_OF_RANGE = 11      /* a dynamic dimension outside its range */
} kiln_status;

/* A short constant name for a status ("KILN_ERROR_DEVICE_LOST"). */
const char *kiln_status_string(kiln_status status);
/* What went wrong in the last failing call on this thread, with the runtime
 * source location; "" when nothing failed yet. */
const char *kiln_last_error(void);

typedef enum kiln_dtype {
    KILN_DTYPE_F32 = 0,
    KILN_DTYPE_F16 = 1,
    KILN_DTYPE_I32 = 2,
    KILN_DTYPE_I64 = 3,
    KILN_DTYPE_BOOL = 4, /* one byte per element, 0 or 1 */
    KILN_DTYPE_U8 = 5,
    KILN_DTYPE_I8 = 6
} kiln_dtype;

/* Bytes per element of a dtype. */
uint32_t kiln_dtype_size(kiln_dtype dtype);
/* "f32", "f16", ... */
const char *kiln_dtype_name(kiln_dtype dtype);

/* ---- devices ---------------------------------------------------------- */

typedef struct kiln_device kiln_device;

#define KILN_DEVICE_VALIDATION 1u /* enable VK_LAYER_KHRONOS_validation */

/* A host allocator: every host allocation of a device and its models, the
 * runtime's own and those the Vulkan driver makes for the objects kiln
 * creates (passed to Vulkan as VkAllocationCallbacks). alloc returns size
 * bytes aligned to alignment (a power of two) or NULL; free takes what alloc
 * returned. Both may be called from any thread that calls kiln on the
 * device; user is passed back unchanged and must outlive the device. */
typedef struct kiln_allocator {
    void *(*alloc)(void *user, size_t size, size_t alignment);
    void (*free)(void *user, void *ptr);
    void *user;
} kiln_allocator;

/* Zero-initialize options (= {0}) and set what you need: fields may be
 * added at the end. */
typedef struct kiln_device_options {
    /* Index into vkEnumeratePhysicalDevices, or -1 to choose: discrete GPUs
     * first, then integrated, then virtual, then CPU implementations. */
    int32_t index;
    /* When not NULL, the first device whose name contains this string. */
    const char *name_contains;
    uint32_t flags; /* KILN_DEVICE_* */
    /* NULL: malloc and the driver's own allocator. Copied at create. */
    const kiln_allocator *allocator;
} kiln_device_options;

/* options may be NULL: automatic choice, overridable by KILN_DEVICE and
 * KILN_VALIDATION in the environment. To run on a VkDevice of your own (to
 * share the GPU with a renderer), see kiln_rt_vulkan.h. */
kiln_status kiln_device_create(const kiln_device_options *options,
                               kiln_device **out_device);
void kiln_device_destroy(kiln_device *device);
const char *kiln_device_name(const kiln_device *device);
/* "discrete GPU", "integrated GPU", "virtual GPU", "CPU", "other" */
const char *kiln_device_type_name(const kiln_device *device);
/* Number of validation-layer messages (warnings and errors) seen so far. */
uint32_t kiln_device_validation_count(const kiln_device *device);
/* The KILN_FEATURE_* bits the device offers kiln (0 for NULL): a dispatch
 * or kernel build that needs one runs only where it is set. */
uint32_t kiln_device_features(const kiln_device *device);

/* ---- model tables (written by the compiler, read by the runtime) ------- */

#define KILN_MAX_RANK 8
#define KILN_MAX_BINDINGS 16 /* 8-byte addresses in 128 bytes of push constants */

enum { KILN_BUFFER_ARENA = 0, KILN_BUFFER_WEIGHTS = 1 };

/* Optional device features a model's kernels may need (bit mask). */
#define KILN_FEATURE_FLOAT16 1u   /* shaderFloat16 */
#define KILN_FEATURE_INT64 2u     /* shaderInt64 */
#define KILN_FEATURE_STORAGE16 4u /* storageBuffer16BitAccess */
#define KILN_FEATURE_STORAGE8 8u  /* storageBuffer8BitAccess */
/* VK_NV_cooperative_matrix with 16x16x16 f16 x f16 + f32 fragments on
 * subgroups of 32, vulkanMemoryModel (with device scope), shaderFloat16 and
 * 16-bit storage:
 * matmuls of f16 tensors run on the matrix units. Never a model's required
 * feature: a dispatch that needs it has a fallback for devices without it
 * (kiln_dispatch.needs and .unless). KILN_COOPMAT=0 in the environment
 * turns it off on devices kiln creates. */
#define KILN_FEATURE_COOPMAT 16u
/* A limit rather than a feature: at least 48 KiB of shared memory per
 * workgroup (maxComputeSharedMemorySize; Vulkan guarantees 16, lavapipe
 * has 32). kiln sets it from the device's limits, also for devices made
 * with kiln_device_create_vulkan; like COOPMAT, only a dispatch with a
 * fallback needs it (f32 matmuls on 128 x 256 tiles). */
#define KILN_FEATURE_SHARED48K 32u
/* Also a property: subgroup arithmetic operations in compute shaders
 * (VK_SUBGROUP_FEATURE_ARITHMETIC_BIT). Kernels that reduce a row across a
 * workgroup come in a second build that reduces within subgroups first,
 * which devices with it run instead (kiln_kernel.alt_spirv).
 * KILN_SUBGROUP=0 in the environment turns it off. */
#define KILN_FEATURE_SUBGROUP 64u

#define KILN_MAX_DIMS 8 /* dynamic dimensions per model */

/* A dynamic dimension (YAML `dims: {seq: 1..2048}`, or --shape for ONNX):
 * the model is compiled for max; each run takes a value in [min, max]. */
typedef struct kiln_dim {
    const char *name;
    int64_t min, max;
} kiln_dim;

/* An extent that follows the dynamic dimensions of a run:
 * c0 + c[0] * dims[0] + ... + c[KILN_MAX_DIMS - 1] * dims[KILN_MAX_DIMS - 1]. */
typedef struct kiln_extent {
    int64_t c0;
    int64_t c[KILN_MAX_DIMS];
} kiln_extent;

typedef struct kiln_tensor_info {
    const char *name;
    kiln_dtype dtype;
    uint32_t rank;
    int64_t shape[KILN_MAX_RANK]; /* at the largest dynamic dimensions */
    uint64_t bytes;        /* total size, at that shape */
    uint32_t buffer;       /* KILN_BUFFER_* */
    uint64_t offset;       /* bytes from the start of that buffer */
    uint64_t io_offset;    /* bytes from the start of the staging buffer */
    /* The axis whose size follows the dynamic dimensions (always the
     * outermost axis larger than 1, so a smaller extent is a prefix of the
     * bytes), or -1 when every axis is fixed; its size is `extent`. */
    int32_t dyn_axis;
    kiln_extent extent;
} kiln_tensor_info;

typedef struct kiln_kernel {
    const uint32_t *spirv;
    uint32_t words;
    const char *family; /* shader family, for messages */
    /* A second build of the kernel (same bindings, workgroup size and work)
     * that devices with every feature in alt_needs run instead; alt_words
     * 0: none. */
    const uint32_t *alt_spirv;
    uint32_t alt_words;
    uint32_t alt_needs;
} kiln_kernel;

typedef struct kiln_binding {
    uint32_t buffer; /* KILN_BUFFER_* */
    uint64_t offset; /* bytes: the address the kernel receives */
    /* The bytes [begin, end) of that buffer the kernel touches through it,
     * and whether it writes them (1) or only reads them (0): the ranges the
     * compiler's barrier analysis used. A model compiled with --sync-check
     * binds them as descriptors, so that synchronization validation sees
     * each dispatch's accesses. */
    uint64_t begin, end;
    uint32_t writes;
} kiln_binding;

typedef struct kiln_dispatch {
    uint32_t kernel;        /* index into kernels */
    uint32_t groups[3];     /* workgroup counts (at the largest dims) */
    uint32_t first_binding; /* index into bindings */
    uint32_t binding_count;
    uint32_t barrier;       /* 1: compute->compute memory barrier before it */
    const char *node;       /* source node, for messages and profiles */
    uint64_t bytes;         /* bytes read and written (compiler's count) */
    uint64_t flops;         /* arithmetic operations (compiler's estimate) */
    /* Dispatches whose work follows the dynamic dimensions run indirect:
     * with w = work * scale for a run's dims, groups[dyn_axis] becomes
     * min(groups[dyn_axis], ceil(w / per_group)), or 0 (the dispatch does
     * nothing) when w is outside [work_min, work_max]. dyn_axis 3: fixed. */
    uint32_t dyn_axis;
    kiln_extent work;
    uint64_t scale;
    uint64_t per_group;
    uint64_t work_min, work_max;
    /* Kernels for some devices only: the dispatch is recorded when the
     * device has every feature in needs and lacks one in unless (unless 0:
     * never skipped). A dispatch that needs a feature is followed by its
     * fallback, which has it in unless; a barrier of a skipped dispatch
     * moves to the next one recorded. Pipelines are made only for kernels
     * some recorded dispatch uses. */
    uint32_t needs, unless;
} kiln_dispatch;

/* A guard band of a model compiled with --guard: arena bytes no kernel may
 * write, filled with KILN_GUARD_PATTERN before every run and checked after. */
typedef struct kiln_guard {
    uint64_t offset;    /* bytes into the arena; a multiple of 4 */
    uint64_t bytes;     /* a multiple of 4 */
    uint64_t io_offset; /* where the run copies it in the staging buffer */
    const char *after;  /* the tensor just before it ("" for the first band) */
} kiln_guard;

#define KILN_GUARD_PATTERN 0xA5C3E1F7u

/* After the dispatches: bytes from src to dst in the arena (a state update). */
typedef struct kiln_state_copy {
    uint64_t src, dst, bytes;
} kiln_state_copy;

typedef struct kiln_model_desc {
    uint32_t abi_version;     /* KILN_ABI_VERSION */
    const char *name;
    uint64_t arena_bytes;
    uint64_t alignment;       /* offsets in the arena are multiples of it */
    uint64_t io_bytes;        /* staging: all inputs then all outputs */
    uint32_t features;        /* KILN_FEATURE_* the kernels need */
    const uint32_t *weights;  /* weight buffer contents, little-endian */
    uint64_t weight_bytes;
    uint32_t kernel_count;
    const kiln_kernel *kernels;
    uint32_t dispatch_count;
    const kiln_dispatch *dispatches;
    const kiln_binding *bindings;
    uint32_t input_count;
    const kiln_tensor_info *inputs;
    uint32_t output_count;
    const kiln_tensor_info *outputs;
    /* Compiled with --debug-tensors: every intermediate tensor, kept for the
     * whole run so kiln_model_read_tensor can copy it out afterwards. */
    uint32_t debug_count;
    const kiln_tensor_info *debug_tensors;
    uint32_t guard_count;
    const kiln_guard *guards;
    /* Compiled with --weights-file (or weights over the embedding limit):
     * weights is NULL and create reads this file (kiln_model_options can
     * name another path), checking its size and checksum. */
    const char *weights_file;
    uint64_t weights_checksum; /* FNV-1a 64 of the weight bytes */
    /* Dynamic dimensions: their values live as KILN_MAX_DIMS int32 at
     * dims_offset in the arena, and each dynamic dispatch's
     * VkDispatchIndirectCommand at indirect_offset + 12 * (its rank among
     * the dynamic dispatches); each run copies both there from the same
     * offsets in staging (dims_io_offset, indirect_io_offset). */
    uint32_t dim_count;
    const kiln_dim *dims;
    uint64_t dims_offset, dims_io_offset;
    uint64_t indirect_offset, indirect_io_offset;
    uint32_t indirect_count;
    /* State (YAML `state:`): tensors that stay in the arena between runs
     * (bytes: their whole storage, shape: the storage's shape), zero after
     * create and kiln_model_reset_state. After the dispatches each run
     * copies every state_copies entry (arena offsets) from the update the
     * model computed into its state; an update that appends to its state
     * is computed in place and needs no copy. */
    uint32_t state_count;
    const kiln_tensor_info *states;
    uint32_t state_copy_count;
    const kiln_state_copy *state_copies;
    /* Compiled with --sync-check (a test mode): every kernel also declares
     * its bindings as storage buffers (set 0, binding i: the dispatch's i-th
     * kiln_binding, over [begin, end)) and touches them in a branch that
     * never runs, so that the validation layer's synchronization validation,
     * blind to device addresses, sees what each dispatch reads and writes;
     * create then makes and binds a descriptor set per dispatch. */
    uint32_t sync_check;
} kiln_model_desc;

/* ---- models ------------------------------------------------------------ */

typedef struct kiln_model kiln_model;

/* device may be NULL: the model then creates the default device, owns it
 * and destroys it with itself. KILN_PROFILE=1 in the environment turns on
 * KILN_MODEL_PROFILE. */
kiln_status kiln_model_create(kiln_device *device, const kiln_model_desc *desc,
                              kiln_model **out_model);

#define KILN_MODEL_PROFILE 1u /* a GPU timestamp after every dispatch */
/* Every input and output copied between the staging buffer and the arena
 * on the device (KILN_STAGED_IO=1 in the environment does the same). By
 * default the dispatches read small inputs (up to 64 KiB) and write
 * outputs (up to 1 MiB) in the staging buffer itself, where nothing else
 * shares their bytes: no copies, and fewer barriers. */
#define KILN_MODEL_STAGED_IO 2u

typedef struct kiln_model_options {
    uint32_t flags; /* KILN_MODEL_* */
    /* Where the weights sidecar file is, when not at the path the model was
     * compiled with (desc->weights_file); NULL: that path. */
    const char *weights_path;
} kiln_model_options;

/* kiln_model_create with options (NULL: none). */
kiln_status kiln_model_create_ex(kiln_device *device, const kiln_model_desc *desc,
                                 const kiln_model_options *options,
                                 kiln_model **out_model);

/* After a run of a model created with KILN_MODEL_PROFILE: each dispatch's
 * GPU time in microseconds (us[i] for desc->dispatches[i]; count at least
 * desc->dispatch_count). A dispatch's time runs from the end of the one
 * before it (or the start of the schedule) to its own end, measured with
 * the device's timestamp period and valid bits. Dispatches the schedule lets
 * overlap share time between them. */
kiln_status kiln_model_profile(kiln_model *model, double *us, uint32_t count);

/* Copies a tensor of desc->debug_tensors (or desc->outputs) out of the
 * arena after a run; dst receives tensor->bytes bytes. Allocates a staging
 * buffer and submits: a debugging aid, not for the run path. */
kiln_status kiln_model_read_tensor(kiln_model *model, const kiln_tensor_info *tensor,
                                   void *dst);
/* inputs[i] points to desc->inputs[i].bytes bytes; outputs[i] receives
 * desc->outputs[i].bytes bytes. With dynamic dimensions: the bytes of the
 * tensor at the dims last set (kiln_model_tensor_bytes), contiguous. */
kiln_status kiln_model_run(kiln_model *model, const void *const *inputs,
                           void *const *outputs);

/* Dynamic dimensions (desc->dims): sets the value of each of the model's
 * count dims for the runs that follow (they start at each dim's max).
 * KILN_ERROR_OUT_OF_RANGE, changing nothing, when one is outside [min, max]. */
kiln_status kiln_model_set_dims(kiln_model *model, const int64_t *values, uint32_t count);
/* The same for one dim by name. */
kiln_status kiln_model_set_dim(kiln_model *model, const char *name, int64_t value);
/* A tensor's shape (rank entries) and bytes at the current dims. */
void kiln_model_tensor_shape(const kiln_model *model, const kiln_tensor_info *tensor,
                             int64_t *shape);
uint64_t kiln_model_tensor_bytes(const kiln_model *model, const kiln_tensor_info *tensor);

/* Zero-copy use: the mapped staging memory of input i and output i (host
 * visible and coherent, laid out as desc->inputs[i] and desc->outputs[i]
 * describe; NULL for an index out of range). Write the inputs there, call
 * kiln_model_run_mapped, read the outputs there: no copies on the host. The
 * pointers stay valid until destroy; an output's bytes are those of the
 * last run. With dynamic dimensions a tensor at the current extent is the
 * first kiln_model_tensor_bytes bytes there. */
void *kiln_model_input_memory(kiln_model *model, uint32_t i);
const void *kiln_model_output_memory(const kiln_model *model, uint32_t i);
kiln_status kiln_model_run_mapped(kiln_model *model);
/* Whether the dispatches reach input i (output != 0: output i) in the
 * staging memory itself (KILN_MODEL_STAGED_IO) rather than through a copy;
 * 0 for an index out of range. */
int kiln_model_io_direct(const kiln_model *model, int output, uint32_t i);

/* State (desc->states): every state back to zeros (as after create); state
 * i's desc->states[i].bytes copied out or in. Each submits and waits: not
 * for the run path, where an update feeds its state on the device. */
kiln_status kiln_model_reset_state(kiln_model *model);
kiln_status kiln_model_read_state(kiln_model *model, uint32_t i, void *dst);
kiln_status kiln_model_write_state(kiln_model *model, uint32_t i, const void *src);

void kiln_model_destroy(kiln_model *model);
kiln_device *kiln_model_device(const kiln_model *model);
const kiln_model_desc *kiln_model_get_desc(const kiln_model *model);

#ifdef __cplusplus
}
#endif

#endif /* KILN_RT_H */
