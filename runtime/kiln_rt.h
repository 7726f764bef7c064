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

/* The version of this header; kiln_rt_version() is that of the library
 * linked (they differ when a program built against one header runs with
 * another libkilnrt.so). The tables' own version is KILN_ABI_VERSION
 * (kiln_rt_tables.h). */
#define KILN_RT_VERSION "0.4.0"
#define KILN_RT_VERSION_NUMBER 400u /* major * 10000 + minor * 100 + patch */

/* The linked library's version: "0.4.0"; *number (when not NULL) gets
 * KILN_RT_VERSION_NUMBER's form of it. */
const char *kiln_rt_version(uint32_t *number);

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

/* The tables a generated model fills in (kiln_model_desc and its parts):
 * users read a model's inputs, outputs and dims through them. */
#include "kiln_rt_tables.h"

/* Bytes per element of a dtype (kiln_dtype: kiln_rt_tables.h). */
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

/* Zero-initialize options (= {0}), set size to sizeof the struct and the
 * fields you need: later versions add fields at the end only and read
 * those that size covers (size 0 stands for the fields of 0.2.0, index to
 * allocator). A size between 1 and those fields' bytes is an error. */
typedef struct kiln_device_options {
    uint32_t size; /* sizeof(kiln_device_options) */
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
 * outputs (up to 64 KiB) in the staging buffer itself, where nothing else
 * shares their bytes: no copies, and fewer barriers. */
#define KILN_MODEL_STAGED_IO 2u

/* As kiln_device_options: = {0}, then size = sizeof the struct (size 0:
 * the fields of 0.2.0, flags and weights_path). */
typedef struct kiln_model_options {
    uint32_t size;  /* sizeof(kiln_model_options) */
    uint32_t flags; /* KILN_MODEL_* */
    /* Where the weights sidecar file is, when not at the path the model was
     * compiled with (desc->weights_file); NULL: that path. */
    const char *weights_path;
    /* (0.3.0) The pipeline cache file: read before the pipelines are made
     * (when it is this device's and intact) and written after, so that later
     * starts skip the driver's shader compiles. NULL: the default,
     * $KILN_CACHE_DIR/pipelines/ (else $XDG_CACHE_HOME/kiln/pipelines/, else
     * ~/.cache/kiln/pipelines/; KILN_CACHE_DIR set empty turns it off);
     * "": no cache. It never fails a create. */
    const char *pipeline_cache;
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
 * overlap share time between them. A dispatch the run did not record (a
 * variant for devices with other features, or one its dims give no
 * workgroups, left out of the run's recording) takes 0. */
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
