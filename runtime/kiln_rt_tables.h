/*
 * kiln_rt_tables.h: the tables a kiln-generated model hands to the runtime.
 *
 * The compiler writes them as constant data (the generated C file's
 * kiln_model_desc and everything it points to); the runtime reads them at create. Users read
 * them too, through kiln_model_get_desc(): a model's inputs, outputs,
 * dynamic dims and states. kiln_rt.h includes it.
 *
 * KILN_ABI_VERSION is the version of these tables: the generated code
 * records the one it was written for and create refuses a mismatch.
 */
#ifndef KILN_RT_TABLES_H
#define KILN_RT_TABLES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ABI_VERSION 10u

typedef enum kiln_dtype {
    KILN_DTYPE_F32 = 0,
    KILN_DTYPE_F16 = 1,
    KILN_DTYPE_I32 = 2,
    KILN_DTYPE_I64 = 3,
    KILN_DTYPE_BOOL = 4, /* one byte per element, 0 or 1 */
    KILN_DTYPE_U8 = 5,
    KILN_DTYPE_I8 = 6
} kiln_dtype;

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
/* VK_KHR_shader_integer_dot_product's shaderIntegerDotProduct: dot
 * products of four packed 8-bit integers in one instruction (SPIR-V
 * OpSDot). Like COOPMAT never a model's required feature: the kernels of
 * `--activations int8` use it in their subgroup build (alt_needs) and make
 * the same integer sums without it otherwise, a byte at a time.
 * KILN_INTDOT=0 in the environment turns it off on devices kiln creates. */
#define KILN_FEATURE_INTDOT 128u
/* Cooperative matrices of workgroup scope (VK_KHR_cooperative_matrix with
 * its cooperativeMatrix feature, VK_NV_cooperative_matrix2 with
 * cooperativeMatrixWorkgroupScope and cooperativeMatrixFlexibleDimensions,
 * and f16 x f16 + f32 matrices of workgroup scope for 128 invocations in
 * granularities that divide 128 x 64 x 32, with 32 KiB of shared memory
 * beside the driver's reservation for them), on top of KILN_FEATURE_COOPMAT,
 * which a device with this bit always has too. Like COOPMAT only a
 * dispatch with a fallback needs it (coopmat_wg.comp's f16 products, which
 * coopmat.comp computes elsewhere). KILN_COOPMAT_WG=0 (or KILN_COOPMAT=0)
 * in the environment turns it off on devices kiln creates. */
#define KILN_FEATURE_COOPMAT_WG 256u

#define KILN_MAX_DIMS 8 /* dynamic dimensions per model */
#define KILN_AXIS_FIXED 3u /* kiln_dispatch.dyn_axis of a dispatch that is not dynamic */

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

/* A dimension the compiler derived from the dims where a model's shapes
 * need more than their sums: dims[dim_count + i] is derived[i].op of the
 * extents a and b (over the dims before it), which kiln_model_set_dims
 * evaluates after the given values. DIV: a / b rounded down (b >= 1). */
enum { KILN_DIM_MUL = 1, KILN_DIM_DIV = 2, KILN_DIM_MAX = 3, KILN_DIM_MIN = 4 };
typedef struct kiln_derived_dim {
    const char *name; /* "b*seq", "(seq + 1)/2", "max(seq, 4)" */
    uint32_t op;      /* KILN_DIM_* */
    kiln_extent a, b;
} kiln_derived_dim;

typedef struct kiln_tensor_info {
    const char *name;
    kiln_dtype dtype;
    uint32_t rank;
    int64_t shape[KILN_MAX_RANK]; /* at the largest dynamic dimensions */
    uint64_t bytes;        /* total size, at that shape */
    uint32_t buffer;       /* KILN_BUFFER_* */
    uint64_t offset;       /* bytes from the start of that buffer */
    uint64_t io_offset;    /* bytes from the start of the staging buffer */
    /* The axes whose sizes follow the dynamic dimensions: bit a set when
     * axis a does, its size at a run then extents[a] (kiln_model_tensor_shape
     * evaluates them; fixed axes are constants there). 0 and NULL when every
     * axis is fixed. The tensor is stored at its largest shape: a run's
     * elements keep those strides in the arena and in staging (a prefix of
     * the bytes when the one dynamic axis is the outermost larger than 1),
     * and are contiguous in the buffers kiln_model_run takes. */
    uint32_t dyn_axes;
    const kiln_extent *extents; /* rank entries */
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

/* kiln_dispatch.barrier of a dispatch that only reads weights and writes
 * nothing (a prefetch of a product's weights into the cache): recorded
 * where it stands, with no barrier; a barrier that skipped dispatches
 * before it left pending goes to the next dispatch recorded, so that it
 * runs beside the work before it. */
#define KILN_BARRIER_PREFETCH 2u

typedef struct kiln_dispatch {
    uint32_t kernel;        /* index into kernels */
    uint32_t groups[3];     /* workgroup counts (at the largest dims) */
    uint32_t first_binding; /* index into bindings */
    uint32_t binding_count;
    uint32_t barrier;       /* 1: compute->compute memory barrier before it;
                               KILN_BARRIER_PREFETCH: see there */
    const char *node;       /* source node, for messages and profiles */
    uint64_t bytes;         /* bytes read and written (compiler's count) */
    uint64_t flops;         /* arithmetic operations (compiler's estimate) */
    /* Dispatches whose work follows the dynamic dimensions run indirect:
     * with w = work * scale for a run's dims, groups[dyn_axis] becomes
     * min(groups[dyn_axis], ceil(w / per_group)), or 0 (the dispatch does
     * nothing) when w is outside [work_min, work_max]. dyn_axis
     * KILN_AXIS_FIXED (3): a fixed dispatch, recorded with its groups. */
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
 * write, filled with KILN_GUARD_PATTERN before every run and checked after.
 * With index_node set, the band is instead the 16 bytes where one dispatch
 * that reads indices at run time (a gather or scatter) reports the first it
 * found outside its axis: word 0 becomes KILN_GUARD_INDEX, then the index
 * (its low 32 bits), the axis' size, and the index's position among the
 * indices; index_node says which node and tensors ("node 'g' (gather):
 * 'idx' into axis 0 of 'x'"). */
typedef struct kiln_guard {
    uint64_t offset;    /* bytes into the arena; a multiple of 4 */
    uint64_t bytes;     /* a multiple of 4 */
    uint64_t io_offset; /* where the run copies it in the staging buffer */
    const char *after;  /* the tensor just before it ("" for the first band) */
    const char *index_node; /* NULL: a band; else an index report (above) */
} kiln_guard;

#define KILN_GUARD_PATTERN 0xA5C3E1F7u
#define KILN_GUARD_INDEX 1u

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
    uint64_t weights_checksum; /* of the weight bytes: the sidecar's */
    /* Dynamic dimensions: their values live as KILN_MAX_DIMS int32 at
     * dims_offset in the arena, and each dynamic dispatch's
     * VkDispatchIndirectCommand at indirect_offset + 12 * (its rank among
     * the dynamic dispatches); each run copies both there from the same
     * offsets in staging (dims_io_offset, indirect_io_offset). */
    uint32_t dim_count;
    const kiln_dim *dims;
    uint32_t derived_count; /* dims[dim_count ...]: derived from the given ones */
    const kiln_derived_dim *derived;
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

#ifdef __cplusplus
}
#endif

#endif /* KILN_RT_TABLES_H */
