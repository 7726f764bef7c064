/*
 * model.c: turning a compiled model's tables into Vulkan objects, and runs.
 *
 * create:
 *   1. check the tables' ABI version and the device's features and limits;
 *   2. make three buffers: the arena (every activation, inputs and outputs at
 *      the offsets the compiler chose), the weights (uploaded once through a
 *      temporary staging buffer) and a mapped staging buffer for inputs and
 *      outputs;
 *   3. one shader module and compute pipeline per kernel, all sharing one
 *      pipeline layout whose only state is 128 bytes of push constants: the
 *      64-bit device addresses of the tensors a dispatch touches;
 *   4. pick the direct inputs and outputs (choose_direct_io): those the
 *      dispatches reach in staging itself instead of through a copy;
 *   5. record the whole run into one command buffer, once:
 *        copy the other inputs (and the dynamic dims and indirect commands)
 *        staging -> arena; barrier (if anything was copied);
 *        every dispatch (a barrier before it where the compiler put one);
 *        barrier, copy the other outputs arena -> staging (if any);
 *        barrier to host.
 * A model compiled with --sync-check also gets a descriptor set per recorded
 * dispatch, binding [begin, end) of each of its bindings (create_sync_sets),
 * so that synchronization validation sees every access.
 *
 * run copies inputs into the staging buffer, submits that command buffer,
 * waits on one fence (polling it briefly before blocking) and copies outputs
 * out. It allocates nothing.
 *
 * Dynamic dimensions change no command: set_dims writes their values and
 * each dynamic dispatch's workgroup counts into staging, the recorded copy
 * takes them to the arena, kernels read the values there and
 * vkCmdDispatchIndirect the counts.
 */
#include "internal.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PUSH_BYTES (KILN_MAX_BINDINGS * 8u)
#ifdef KILN_FAULT_INJECTION
#define SPIN_POLLS 1 /* one poll per run: each call can be the failing one */
#else
#define SPIN_POLLS 20000 /* fence polls before a blocking wait (~1 ms) */
#endif

struct kiln_model {
    kiln_device *device;
    const kiln_allocator *host; /* the device's allocator (it outlives m) */
    int owns_device;
    const kiln_model_desc *desc;
    kiln__buffer arena, weights, io;
    VkPipelineLayout layout;
    VkPipelineCache cache;
    VkPipeline *pipelines; /* desc->kernel_count */
    VkCommandPool pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkQueryPool timestamps; /* dispatch_count + 1 queries, when profiling */
    /* Not KILN_OK once a run failed after its submit (the device was lost,
     * or the fence's state is unknown): every later run returns it. */
    kiln_status broken;
    int ran;  /* a run has completed (profiles and debug reads need one) */
    int64_t dims[KILN_MAX_DIMS]; /* the dynamic dimensions of the next run */
    const char *weights_path; /* the sidecar file, when desc->weights is NULL */
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

/* The largest input and output the dispatches reach in the staging buffer
 * (direct I/O). A kernel may read an input many times (a matmul's A once
 * per column tile), and on a discrete GPU every read of staging memory
 * crosses the bus, so inputs stay small; a kernel writes an output once, as
 * the copy would. */
#define DIRECT_INPUT_MAX (64u << 10)
#define DIRECT_OUTPUT_MAX (1u << 20)

static int64_t eval_extent(const kiln_extent *e, const int64_t *dims) {
    int64_t v = e->c0;
    for (int i = 0; i < KILN_MAX_DIMS; i++)
        v += e->c[i] * dims[i];
    return v;
}

/* The dynamic-dimension tables: counts, ranges and offsets that fit. */
static kiln_status check_dims(const kiln_model_desc *d) {
    if (d->dim_count > KILN_MAX_DIMS || (d->dim_count && !d->dims))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s has a malformed dims table",
                         d->name);
    for (uint32_t i = 0; i < d->dim_count; i++)
        if (d->dims[i].min < 0 || d->dims[i].max < d->dims[i].min ||
            d->dims[i].max > 0x7fffffff)
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: dim %u has the range "
                             "%lld..%lld", d->name, i, (long long)d->dims[i].min,
                             (long long)d->dims[i].max);
    uint32_t dynamic = 0;
    for (uint32_t i = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        if (x->dyn_axis > 3 || (x->dyn_axis < 3 && x->per_group == 0))
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "dispatch %u (%s) is malformed",
                             i, x->node ? x->node : "?");
        dynamic += x->dyn_axis < 3;
    }
    if ((d->state_count && !d->states) || (d->state_copy_count && !d->state_copies))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: malformed state tables",
                         d->name);
    for (uint32_t i = 0; i < d->state_count; i++)
        if (d->states[i].offset + d->states[i].bytes > d->arena_bytes)
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: state %u lies outside "
                             "the arena", d->name, i);
    for (uint32_t i = 0; i < d->state_copy_count; i++) {
        const kiln_state_copy *c = &d->state_copies[i];
        if (c->src + c->bytes > d->arena_bytes || c->dst + c->bytes > d->arena_bytes)
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: state copy %u lies "
                             "outside the arena", d->name, i);
    }
    if (dynamic != d->indirect_count ||
        (d->dim_count && (d->dims_offset + 4ull * KILN_MAX_DIMS > d->arena_bytes ||
                          d->dims_io_offset + 4ull * KILN_MAX_DIMS > d->io_bytes)) ||
        (dynamic && (d->indirect_offset + 12ull * dynamic > d->arena_bytes ||
                     d->indirect_io_offset + 12ull * dynamic > d->io_bytes)))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: malformed dynamic tables",
                         d->name);
    return KILN_OK;
}

/* Writes the dims and every dynamic dispatch's workgroup counts into
 * staging, where the next submit's copies pick them up. */
static void write_dims(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    if (!d->dim_count)
        return;
    int32_t v[KILN_MAX_DIMS];
    for (int i = 0; i < KILN_MAX_DIMS; i++)
        v[i] = (int32_t)m->dims[i];
    memcpy((char *)m->io.mapped + d->dims_io_offset, v, sizeof v);
    uint32_t *cmd = (uint32_t *)(void *)((char *)m->io.mapped + d->indirect_io_offset);
    for (uint32_t i = 0, k = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        if (x->dyn_axis >= 3)
            continue;
        uint32_t g[3] = {x->groups[0], x->groups[1], x->groups[2]};
        int64_t w = eval_extent(&x->work, m->dims) * (int64_t)x->scale;
        if (w < 0 || (uint64_t)w < x->work_min || (uint64_t)w > x->work_max) {
            g[x->dyn_axis] = 0;
        } else {
            uint64_t need = ((uint64_t)w + x->per_group - 1) / x->per_group;
            if (need < g[x->dyn_axis])
                g[x->dyn_axis] = (uint32_t)need;
        }
        memcpy(cmd + 3 * k++, g, sizeof g);
    }
}

/* Whether this device records dispatch x (kiln_dispatch.needs, .unless). */
static int dispatch_active(const kiln_device *dev, const kiln_dispatch *x) {
    return (x->needs & ~dev->features) == 0 &&
           (x->unless == 0 || (x->unless & ~dev->features) != 0);
}

static kiln_status check_desc(const kiln_device *dev, const kiln_model_desc *d) {
    if (d->abi_version != KILN_ABI_VERSION)
        return KILN_FAIL(KILN_ERROR_INCOMPATIBLE,
                         "model %s was generated for runtime ABI %u, this "
                         "runtime is ABI %u: recompile it with this kiln",
                         d->name ? d->name : "?", d->abi_version,
                         KILN_ABI_VERSION);
    uint32_t missing = d->features & ~dev->features;
    if (missing)
        return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                         "model %s needs%s%s%s%s, which %s lacks", d->name,
                         missing & KILN_FEATURE_FLOAT16 ? " shaderFloat16" : "",
                         missing & KILN_FEATURE_INT64 ? " shaderInt64" : "",
                         missing & KILN_FEATURE_STORAGE16
                             ? " storageBuffer16BitAccess" : "",
                         missing & KILN_FEATURE_STORAGE8
                             ? " storageBuffer8BitAccess" : "",
                         dev->props.deviceName);
    KILN_RETURN_IF_ERROR(check_dims(d));
    if (dev->props.limits.maxPushConstantsSize < PUSH_BYTES)
        return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                         "%s offers %u bytes of push constants, kiln needs %u",
                         dev->props.deviceName,
                         dev->props.limits.maxPushConstantsSize, PUSH_BYTES);
    for (uint32_t i = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        if (x->kernel >= d->kernel_count || x->binding_count > KILN_MAX_BINDINGS)
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                             "dispatch %u (%s) is malformed", i,
                             x->node ? x->node : "?");
        for (int k = 0; k < 3; k++)
            if (x->groups[k] > dev->props.limits.maxComputeWorkGroupCount[k])
                return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                                 "dispatch %u (%s) needs %u workgroups in "
                                 "dimension %d, %s allows %u",
                                 i, x->node, x->groups[k], k,
                                 dev->props.deviceName,
                                 dev->props.limits.maxComputeWorkGroupCount[k]);
    }
    return KILN_OK;
}

/* Allocates a primary command buffer from the model's pool and begins it;
 * on failure nothing is left allocated. */
static kiln_status begin_commands(kiln_model *m, VkCommandBufferUsageFlags flags,
                                  VkCommandBuffer *out) {
    VkCommandBufferAllocateInfo ai;
    memset(&ai, 0, sizeof ai);
    ai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    ai.commandPool = m->pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    KILN_VK_RETURN(vkAllocateCommandBuffers(m->device->device, &ai, out));
    VkCommandBufferBeginInfo bi;
    memset(&bi, 0, sizeof bi);
    bi.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    bi.flags = flags;
    VkResult r = vkBeginCommandBuffer(*out, &bi);
    if (r != VK_SUCCESS) {
        vkFreeCommandBuffers(m->device->device, m->pool, 1, out);
        *out = VK_NULL_HANDLE;
        return kiln__vk_fail(r, __FILE__, __LINE__, "vkBeginCommandBuffer");
    }
    return KILN_OK;
}

/* After a failed wait or reset on work that was submitted: waits for the
 * device to finish before what the work uses is freed, and leaves the fence
 * unsignaled for the next submit. Failures here change nothing: the caller
 * already reports the first one, and a lost device has nothing pending. */
static void settle(kiln_model *m, int needed) {
    if (!needed)
        return;
    if (vkQueueWaitIdle(m->device->queue) == VK_SUCCESS)
        (void)vkResetFences(m->device->device, 1, &m->fence);
}

/* Ends a command buffer from begin_commands, submits it, waits for it and
 * frees it: the one-time work of create (weights) and of reading a tensor.
 * After a failed wait or reset the device is drained first, since what the
 * work uses is freed next. */
static kiln_status submit_once(kiln_model *m, VkCommandBuffer cmd) {
    kiln_device *dev = m->device;
    VkSubmitInfo si;
    memset(&si, 0, sizeof si);
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    kiln_status s = KILN_OK;
    int submitted = 0;
    KILN_VK_GOTO(s, vkEndCommandBuffer(cmd), done);
    KILN_VK_GOTO(s, vkQueueSubmit(dev->queue, 1, &si, m->fence), done);
    submitted = 1;
    KILN_VK_GOTO(s, vkWaitForFences(dev->device, 1, &m->fence, VK_TRUE, UINT64_MAX), done);
    KILN_VK_GOTO(s, vkResetFences(dev->device, 1, &m->fence), done);
done:
    settle(m, submitted && s != KILN_OK);
    vkFreeCommandBuffers(dev->device, m->pool, 1, &cmd);
    return s;
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Reads a weights sidecar file (written by kiln compile --weights-file:
 * "KILNWTS1", u64 size, u64 FNV-1a 64 checksum, the bytes) into dst, after
 * checking that it is the one this model was compiled with, whole. */
static kiln_status read_weights_file(const char *path, const kiln_model_desc *d, void *dst) {
    if (!path)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "the model has neither weights nor a weights file");
    FILE *f = fopen(path, "rb");
    if (!f)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "cannot open the weights file %s: %s", path,
                         strerror(errno));
    unsigned char head[24];
    kiln_status s = KILN_OK;
    unsigned long long want = (unsigned long long)d->weight_bytes;
    if (fread(head, 1, sizeof head, f) != sizeof head || memcmp(head, "KILNWTS1", 8) != 0)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is not a kiln weights file", path);
    else if (get_u64(head + 8) != d->weight_bytes)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s holds %llu bytes of weights; model %s needs %llu "
                      "(a file from another compile?)", path,
                      (unsigned long long)get_u64(head + 8), d->name, want);
    else if (get_u64(head + 16) != d->weights_checksum)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is from another compile: its checksum is "
                      "%016llx, model %s expects %016llx", path,
                      (unsigned long long)get_u64(head + 16), d->name,
                      (unsigned long long)d->weights_checksum);
    else if (fread(dst, 1, (size_t)d->weight_bytes, f) != (size_t)d->weight_bytes)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is truncated: it has fewer than the %llu bytes "
                      "of weights its header announces", path, want);
    else if (fgetc(f) != EOF)
        s = KILN_FAIL(KILN_ERROR_WEIGHTS, "%s has bytes after its %llu bytes of weights", path,
                      want);
    fclose(f);
    if (s != KILN_OK)
        return s;
    uint64_t h = 1469598103934665603ull; /* FNV-1a 64, as the compiler computes it */
    const unsigned char *p = (const unsigned char *)dst;
    for (uint64_t i = 0; i < d->weight_bytes; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    if (h != d->weights_checksum)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is corrupt: its bytes do not match their "
                         "checksum (%016llx, expected %016llx)", path, (unsigned long long)h,
                         (unsigned long long)d->weights_checksum);
    return KILN_OK;
}

/* Copies `bytes` bytes of src (NULL: the weights sidecar file, read and
 * checked) into dst at offset, through a temporary staging buffer and one
 * submit: the weights at create, a state from the host. */
static kiln_status upload(kiln_model *m, VkBuffer dst, uint64_t offset, uint64_t bytes,
                          const void *src) {
    kiln_device *dev = m->device;
    if (bytes == 0)
        return KILN_OK;
    kiln__buffer staging;
    KILN_RETURN_IF_ERROR(kiln__buffer_create(dev, bytes, VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                             KILN__MEMORY_STAGING, &staging));
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    kiln_status s = KILN_OK;
    if (src)
        memcpy(staging.mapped, src, (size_t)bytes);
    else
        s = read_weights_file(m->weights_path, m->desc, staging.mapped);
    if (s == KILN_OK)
        s = begin_commands(m, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, &cmd);
    if (s == KILN_OK) {
        VkBufferCopy region = {0, offset, bytes};
        vkCmdCopyBuffer(cmd, staging.buffer, dst, 1, &region);
        s = submit_once(m, cmd);
    }
    kiln__buffer_destroy(dev, &staging);
    return s;
}

/* The arena or the weight buffer (KILN_BUFFER_*). */
static const kiln__buffer *buffer_of(const kiln_model *m, uint32_t which) {
    return which == KILN_BUFFER_WEIGHTS ? &m->weights : &m->arena;
}

/* The direct range holding bytes [begin, end) of buffer `which` (an empty
 * range: the byte at begin), or NULL. */
static const struct direct_range *direct_of(const kiln_model *m, uint32_t which,
                                            uint64_t begin, uint64_t end) {
    for (uint32_t i = 0; which == KILN_BUFFER_ARENA && i < m->direct_count; i++) {
        const struct direct_range *r = &m->direct[i];
        if (r->begin <= begin && begin < r->end && end <= r->end)
            return r;
    }
    return NULL;
}

/* Where bytes [begin, end) of buffer `which` live: the staging buffer for
 * a direct input's or output's, with *shift added to their offsets (0
 * otherwise). */
static const kiln__buffer *locate(const kiln_model *m, uint32_t which, uint64_t begin,
                                  uint64_t end, int64_t *shift) {
    const struct direct_range *r = direct_of(m, which, begin, end);
    *shift = r ? (int64_t)(r->io - r->begin) : 0;
    return r ? &m->io : buffer_of(m, which);
}

/* Input i, or output i - input_count for i past the inputs: the order in
 * which direct I/O walks them (kind 0 for an input, 1 an output). */
static const kiln_tensor_info *io_tensor(const kiln_model_desc *d, uint32_t i) {
    return i < d->input_count ? &d->inputs[i] : &d->outputs[i - d->input_count];
}

/* Whether the dispatches reach input or output t in staging itself. */
static int is_direct(const kiln_model *m, const kiln_tensor_info *t) {
    return direct_of(m, t->buffer, t->offset, t->offset + t->bytes) != NULL;
}

static int ranges_meet(uint64_t a, uint64_t a_end, uint64_t b, uint64_t b_end) {
    return a < b_end && b < a_end;
}

/* Whether io_tensor(d, which), at arena bytes [begin, end), can be
 * direct: no other input or output shares a byte with it (an output that is
 * an input, or the same output twice), every binding that touches it lies
 * inside it (none reaches across its edge into what stays in the arena), no
 * binding writes an input, and no copy of the run touches it (state
 * updates). */
static int can_be_direct(const kiln_model *m, uint32_t which, uint64_t begin,
                         uint64_t end) {
    const kiln_model_desc *d = m->desc;
    int input = which < d->input_count;
    for (uint32_t i = 0; i < d->input_count + d->output_count; i++) {
        const kiln_tensor_info *t = io_tensor(d, i);
        if (i != which && t->buffer == KILN_BUFFER_ARENA &&
            ranges_meet(begin, end, t->offset, t->offset + t->bytes))
            return 0;
    }
    for (uint32_t i = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        for (uint32_t b = 0; b < x->binding_count; b++) {
            const kiln_binding *bd = &d->bindings[x->first_binding + b];
            if (bd->buffer != KILN_BUFFER_ARENA || bd->begin == bd->end ||
                !ranges_meet(begin, end, bd->begin, bd->end))
                continue;
            if (bd->begin < begin || bd->end > end || (input && bd->writes))
                return 0;
        }
    }
    for (uint32_t i = 0; i < d->state_copy_count; i++) {
        const kiln_state_copy *c = &d->state_copies[i];
        if (ranges_meet(begin, end, c->src, c->src + c->bytes) ||
            ranges_meet(begin, end, c->dst, c->dst + c->bytes))
            return 0;
    }
    for (uint32_t i = 0; i < d->state_count; i++)
        if (ranges_meet(begin, end, d->states[i].offset,
                        d->states[i].offset + d->states[i].bytes))
            return 0;
    return 1;
}

static int by_begin(const void *a, const void *b) {
    const struct staging_gap *x = (const struct staging_gap *)a,
                             *y = (const struct staging_gap *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The gaps of a guarded model's staging (kiln_model.gaps), each from a
 * 4-byte boundary. */
static kiln_status find_staging_gaps(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    uint32_t n = d->input_count + d->output_count + d->guard_count + 2;
    struct staging_gap *own =
        (struct staging_gap *)kiln__calloc(m->host, n, sizeof *own);
    m->gaps = (struct staging_gap *)kiln__calloc(m->host, n + 1, sizeof *m->gaps);
    if (!own || !m->gaps) {
        kiln__free(m->host, own);
        return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating the staging gaps");
    }
    for (uint32_t i = 0; i < d->input_count + d->output_count; i++) {
        const kiln_tensor_info *t = io_tensor(d, i);
        own[i].begin = t->io_offset;
        own[i].end = t->io_offset + t->bytes;
        own[i].after = t->name;
    }
    n = d->input_count + d->output_count;
    for (uint32_t i = 0; i < d->guard_count; i++, n++) {
        own[n].begin = d->guards[i].io_offset;
        own[n].end = d->guards[i].io_offset + d->guards[i].bytes;
        own[n].after = "a guard band's copy";
    }
    own[n].begin = d->dims_io_offset;
    own[n].end = d->dims_io_offset + (d->dim_count ? 4u * KILN_MAX_DIMS : 0);
    own[n++].after = "the dims";
    own[n].begin = d->indirect_io_offset;
    own[n].end = d->indirect_io_offset + 12ull * d->indirect_count;
    own[n++].after = "the indirect commands";
    qsort(own, n, sizeof *own, by_begin);
    uint64_t cursor = 0;
    const char *after = "";
    for (uint32_t i = 0; i <= n; i++) {
        uint64_t begin = (cursor + 3) / 4 * 4, end = i < n ? own[i].begin : m->io.size;
        end = end < m->io.size ? end : m->io.size;
        if (end >= begin + 4) {
            struct staging_gap *g = &m->gaps[m->gap_count++];
            g->begin = begin;
            g->end = begin + (end - begin) / 4 * 4;
            g->after = after;
        }
        if (i < n && own[i].end > cursor && own[i].end > own[i].begin) {
            cursor = own[i].end;
            after = own[i].after;
        }
    }
    kiln__free(m->host, own);
    return KILN_OK;
}

/* Picks the direct inputs and outputs (none with KILN_MODEL_STAGED_IO or
 * KILN_STAGED_IO=1, or a staging buffer kernels cannot address): those
 * within the size limits whose arena offset keeps the 16-byte alignment the
 * compiler planned with. A guarded model also gets the gaps of its staging
 * checked. */
static kiln_status choose_direct_io(kiln_model *m, int staged) {
    const kiln_model_desc *d = m->desc;
    if (staged || !m->io.address)
        return KILN_OK;
    uint32_t n = d->input_count + d->output_count;
    if (n == 0)
        return KILN_OK;
    m->direct = (struct direct_range *)kiln__calloc(m->host, n, sizeof *m->direct);
    if (!m->direct)
        return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating the direct ranges");
    for (uint32_t i = 0; i < n; i++) {
        const kiln_tensor_info *t = io_tensor(d, i);
        uint64_t begin = t->offset, end = t->offset + t->bytes;
        if (t->buffer != KILN_BUFFER_ARENA || t->bytes == 0 ||
            t->bytes > (i < d->input_count ? DIRECT_INPUT_MAX : DIRECT_OUTPUT_MAX) ||
            begin % 16 ||
            t->io_offset % 16 || end > m->arena.size ||
            t->io_offset + t->bytes > m->io.size ||
            !can_be_direct(m, i, begin, end))
            continue;
        struct direct_range *r = &m->direct[m->direct_count++];
        r->begin = begin;
        r->end = end;
        r->io = t->io_offset;
    }
    return m->direct_count && d->guard_count ? find_staging_gaps(m) : KILN_OK;
}

/* The read-only copy of a written binding covers [alias_begin, alias_end):
 * its whole alignment units only. A neighbouring write of the same tensor
 * (the next part of a concat) is bound from its begin rounded down, which
 * may reach back into this binding's last unit; the copy must not reach
 * there, or synchronization validation sees a write after read that is not
 * one. An empty copy is bound to the sink instead. */
static uint64_t alias_begin(const kiln_binding *bd, uint64_t align) {
    return bd->begin == bd->end ? bd->end : (bd->begin + align - 1) / align * align;
}

static uint64_t alias_end(const kiln_binding *bd, uint64_t align) {
    uint64_t end = bd->end / align * align;
    return end < alias_begin(bd, align) ? alias_begin(bd, align) : end;
}

/* A descriptor over [begin, end) of buf, from begin rounded down to the
 * alignment (at most maxStorageBufferRange bytes: checked in part); an
 * empty range gets the sink's next slice instead. */
static void describe(kiln_model *m, const kiln__buffer *buf, uint64_t begin, uint64_t end,
                     uint64_t align, uint32_t *sunk, VkDescriptorBufferInfo *info) {
    if (begin >= end) {
        buf = &m->sink;
        begin = align * (*sunk)++;
        end = begin + align;
    }
    info->buffer = buf->buffer;
    info->offset = begin - begin % align;
    info->range = end - info->offset;
    if (info->range > m->device->props.limits.maxStorageBufferRange)
        info->range = m->device->props.limits.maxStorageBufferRange;
}

/* --sync-check: the descriptor set of each recorded dispatch. Binding b is
 * the dispatch's b-th kiln_binding over [begin, end); each written one is
 * bound again, read-only, after them (bindings binding_count, ... in order:
 * the kernels declare them so, compile_spirv.c), since the validation layer
 * does not report write-after-write hazards between descriptor writes.
 * Offsets are rounded down to the device's storage-buffer alignment (a view
 * that starts mid-way is bound from a little before); a binding that touches
 * no bytes gets a slice of the sink buffer of its own. */
static kiln_status create_sync_sets(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    kiln_device *dev = m->device;
    VkDevice vd = dev->device;
    uint64_t align = dev->props.limits.minStorageBufferOffsetAlignment;
    uint32_t sets = 0, descriptors = 0, empty = 0, most = 1;
    for (uint32_t i = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        if (!dispatch_active(dev, x))
            continue;
        uint32_t n = x->binding_count;
        for (uint32_t b = 0; b < x->binding_count; b++) {
            const kiln_binding *bd = &d->bindings[x->first_binding + b];
            const kiln__buffer *buf = buffer_of(m, bd->buffer);
            if (bd->begin > bd->end || bd->end > buf->size)
                return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                                 "dispatch %u (%s): binding %u touches bytes "
                                 "[%llu, %llu) of a %llu-byte buffer", i, x->node, b,
                                 (unsigned long long)bd->begin,
                                 (unsigned long long)bd->end,
                                 (unsigned long long)buf->size);
            n += bd->writes != 0;
            empty += bd->begin == bd->end;
            empty += bd->writes && alias_begin(bd, align) >= alias_end(bd, align);
        }
        sets++;
        descriptors += n;
        most = n > most ? n : most;
    }
    if (most > dev->props.limits.maxPerStageDescriptorStorageBuffers)
        return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                         "--sync-check: a dispatch binds %u storage buffers, %s "
                         "allows %u", most, dev->props.deviceName,
                         dev->props.limits.maxPerStageDescriptorStorageBuffers);
    VkDescriptorSetLayoutBinding slots[2 * KILN_MAX_BINDINGS];
    memset(slots, 0, sizeof slots);
    for (uint32_t b = 0; b < most; b++) {
        slots[b].binding = b;
        slots[b].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        slots[b].descriptorCount = 1;
        slots[b].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo li;
    memset(&li, 0, sizeof li);
    li.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    li.bindingCount = most;
    li.pBindings = slots;
    KILN_VK_RETURN(vkCreateDescriptorSetLayout(vd, &li, dev->vk_alloc, &m->set_layout));
    if (sets == 0)
        return KILN_OK;
    if (empty)
        KILN_RETURN_IF_ERROR(kiln__buffer_create(dev, empty * align,
                                                 VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                                 KILN__MEMORY_DEVICE, &m->sink));
    VkDescriptorPoolSize size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptors};
    VkDescriptorPoolCreateInfo pi;
    memset(&pi, 0, sizeof pi);
    pi.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
    pi.maxSets = sets;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &size;
    KILN_VK_RETURN(vkCreateDescriptorPool(vd, &pi, dev->vk_alloc, &m->descriptor_pool));
    m->sets = (VkDescriptorSet *)kiln__calloc(m->host, d->dispatch_count, sizeof *m->sets);
    if (!m->sets)
        return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating descriptor sets");

    uint32_t sunk = 0;
    for (uint32_t i = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        if (!dispatch_active(dev, x))
            continue;
        VkDescriptorSetAllocateInfo ai;
        memset(&ai, 0, sizeof ai);
        ai.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
        ai.descriptorPool = m->descriptor_pool;
        ai.descriptorSetCount = 1;
        ai.pSetLayouts = &m->set_layout;
        KILN_VK_RETURN(vkAllocateDescriptorSets(vd, &ai, &m->sets[i]));
        VkDescriptorBufferInfo info[2 * KILN_MAX_BINDINGS];
        uint32_t n = x->binding_count;
        for (uint32_t b = 0; b < x->binding_count; b++) {
            const kiln_binding *bd = &d->bindings[x->first_binding + b];
            int64_t shift;
            const kiln__buffer *buf = locate(m, bd->buffer, bd->begin, bd->end, &shift);
            describe(m, buf, bd->begin + shift, bd->end + shift, align, &sunk, &info[b]);
            if (bd->writes) /* its read-only copy */
                describe(m, buf, alias_begin(bd, align) + shift, alias_end(bd, align) + shift,
                         align, &sunk, &info[n++]);
        }
        VkWriteDescriptorSet w[2 * KILN_MAX_BINDINGS];
        memset(w, 0, sizeof w);
        for (uint32_t j = 0; j < n; j++) {
            w[j].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
            w[j].dstSet = m->sets[i];
            w[j].dstBinding = j;
            w[j].descriptorCount = 1;
            w[j].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            w[j].pBufferInfo = &info[j];
        }
        vkUpdateDescriptorSets(vd, n, w, 0, NULL);
    }
    return KILN_OK;
}

static kiln_status create_pipelines(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    const kiln_device *dev = m->device;
    VkDevice vd = dev->device;

    VkPushConstantRange range = {VK_SHADER_STAGE_COMPUTE_BIT, 0, PUSH_BYTES};
    VkPipelineLayoutCreateInfo li;
    memset(&li, 0, sizeof li);
    li.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    li.pushConstantRangeCount = 1;
    li.pPushConstantRanges = &range;
    if (m->set_layout) {
        li.setLayoutCount = 1;
        li.pSetLayouts = &m->set_layout;
    }
    KILN_VK_RETURN(vkCreatePipelineLayout(vd, &li, dev->vk_alloc, &m->layout));

    VkPipelineCacheCreateInfo ci;
    memset(&ci, 0, sizeof ci);
    ci.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO;
    KILN_VK_RETURN(vkCreatePipelineCache(vd, &ci, dev->vk_alloc, &m->cache));

    m->pipelines = (VkPipeline *)kiln__calloc(m->host, d->kernel_count ? d->kernel_count : 1,
                                              sizeof *m->pipelines);
    if (!m->pipelines)
        return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating pipelines");
    for (uint32_t i = 0; i < d->kernel_count; i++) {
        int used = 0; /* by a dispatch this device records */
        for (uint32_t j = 0; j < d->dispatch_count && !used; j++)
            used = d->dispatches[j].kernel == i && dispatch_active(dev, &d->dispatches[j]);
        if (!used)
            continue;
        const kiln_kernel *k = &d->kernels[i];
        const int alt = k->alt_words && (k->alt_needs & ~dev->features) == 0;
        VkShaderModuleCreateInfo si;
        memset(&si, 0, sizeof si);
        si.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
        si.codeSize = (size_t)(alt ? k->alt_words : k->words) * 4u;
        si.pCode = alt ? k->alt_spirv : k->spirv;
        VkShaderModule module;
        KILN_VK_RETURN(vkCreateShaderModule(vd, &si, dev->vk_alloc, &module));

        VkComputePipelineCreateInfo pi;
        memset(&pi, 0, sizeof pi);
        pi.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
        pi.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
        pi.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
        pi.stage.module = module;
        pi.stage.pName = "main";
        pi.layout = m->layout;
        VkResult r = vkCreateComputePipelines(vd, m->cache, 1, &pi, dev->vk_alloc,
                                              &m->pipelines[i]);
        vkDestroyShaderModule(vd, module, dev->vk_alloc);
        if (r != VK_SUCCESS) {
            kiln_status st = kiln__vk_fail(r, __FILE__, __LINE__, "");
            return kiln__fail(st, __FILE__, __LINE__,
                              "vkCreateComputePipelines for kernel %u (%s) "
                              "returned %s", i, d->kernels[i].family,
                              kiln__vk_result_name(r));
        }
    }
    return KILN_OK;
}

static void memory_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src_stage,
                           VkAccessFlags src, VkPipelineStageFlags dst_stage,
                           VkAccessFlags dst) {
    VkMemoryBarrier b;
    memset(&b, 0, sizeof b);
    b.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    b.srcAccessMask = src;
    b.dstAccessMask = dst;
    vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, &b, 0, NULL, 0, NULL);
}

/* Records a copy of `bytes` bytes (none when 0). */
static void copy_bytes(VkCommandBuffer cmd, VkBuffer src, uint64_t from, VkBuffer dst,
                       uint64_t to, uint64_t bytes) {
    if (bytes == 0)
        return;
    VkBufferCopy c = {from, to, bytes};
    vkCmdCopyBuffer(cmd, src, dst, 1, &c);
}

static kiln_status record(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    KILN_RETURN_IF_ERROR(begin_commands(m, 0, &m->cmd));
    VkCommandBuffer cmd = m->cmd;
    if (m->timestamps)
        vkCmdResetQueryPool(cmd, m->timestamps, 0, d->dispatch_count + 1);

    VkBuffer io = m->io.buffer, arena = m->arena.buffer;
    /* Transfers before the dispatches: copies of the inputs that are not
     * direct, the dims and indirect commands, the guard bands. The barrier
     * after them also orders the last run's state copies before this run's
     * dispatches. Without any of those the queue submit alone makes the
     * host's writes of direct inputs visible to the dispatches. */
    uint32_t before = d->dim_count + d->indirect_count + d->guard_count +
                      d->state_copy_count;
    for (uint32_t i = 0; i < d->input_count; i++) {
        const kiln_tensor_info *t = &d->inputs[i];
        if (t->bytes && !is_direct(m, t)) {
            copy_bytes(cmd, io, t->io_offset, arena, t->offset, t->bytes);
            before++;
        }
    }
    copy_bytes(cmd, io, d->dims_io_offset, arena, d->dims_offset,
               d->dim_count ? 4u * KILN_MAX_DIMS : 0);
    copy_bytes(cmd, io, d->indirect_io_offset, arena, d->indirect_offset,
               12ull * d->indirect_count);
    for (uint32_t i = 0; i < d->guard_count; i++)
        vkCmdFillBuffer(cmd, arena, d->guards[i].offset, d->guards[i].bytes,
                        KILN_GUARD_PATTERN);
    if (before)
        memory_barrier(cmd, VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_ACCESS_HOST_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                           VK_PIPELINE_STAGE_TRANSFER_BIT |
                           VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT,
                       VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                           VK_ACCESS_TRANSFER_READ_BIT |
                           VK_ACCESS_INDIRECT_COMMAND_READ_BIT);

    uint32_t bound = UINT32_MAX, indirect = 0;
    if (m->timestamps)
        vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, m->timestamps, 0);
    uint32_t pending_barrier = 0; /* of dispatches this device skips */
    for (uint32_t i = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        if (!dispatch_active(m->device, x)) {
            pending_barrier |= x->barrier;
            indirect += x->dyn_axis < 3;
            if (m->timestamps) /* its time is 0 */
                vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                    m->timestamps, i + 1);
            continue;
        }
        if (x->barrier || pending_barrier)
            memory_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                           VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT,
                           VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                           VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
        pending_barrier = 0;
        if (x->kernel != bound) {
            vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE,
                              m->pipelines[x->kernel]);
            bound = x->kernel;
        }
        uint64_t push[KILN_MAX_BINDINGS];
        memset(push, 0, sizeof push);
        for (uint32_t b = 0; b < x->binding_count; b++) {
            const kiln_binding *bd = &d->bindings[x->first_binding + b];
            int64_t shift;
            const kiln__buffer *buf = locate(m, bd->buffer, bd->begin, bd->end, &shift);
            push[b] = buf->address + bd->offset + (uint64_t)shift;
        }
        vkCmdPushConstants(cmd, m->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                           PUSH_BYTES, push);
        if (m->sets)
            vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, m->layout, 0, 1,
                                    &m->sets[i], 0, NULL);
        if (x->dyn_axis < 3)
            vkCmdDispatchIndirect(cmd, arena,
                                  d->indirect_offset + 12ull * indirect++);
        else
            vkCmdDispatch(cmd, x->groups[0], x->groups[1], x->groups[2]);
        if (m->timestamps)
            vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, m->timestamps,
                                i + 1);
    }

    /* Transfers after the dispatches: state updates into their states
     * (never an output: the copies below read other bytes; the next run's
     * first barrier orders them before its dispatches), the outputs that are
     * not direct, the guard bands. */
    uint32_t after = d->state_copy_count + d->guard_count;
    for (uint32_t i = 0; i < d->output_count; i++)
        after += !is_direct(m, &d->outputs[i]);
    if (after)
        memory_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                                VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                       VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
    for (uint32_t i = 0; i < d->state_copy_count; i++)
        copy_bytes(cmd, arena, d->state_copies[i].src, arena, d->state_copies[i].dst,
                   d->state_copies[i].bytes);
    for (uint32_t i = 0; i < d->output_count; i++) {
        const kiln_tensor_info *t = &d->outputs[i];
        if (!is_direct(m, t))
            copy_bytes(cmd, buffer_of(m, t->buffer)->buffer, t->offset, io, t->io_offset,
                       t->bytes);
    }
    for (uint32_t i = 0; i < d->guard_count; i++)
        copy_bytes(cmd, arena, d->guards[i].offset, io, d->guards[i].io_offset,
                   d->guards[i].bytes);
    /* Direct outputs are the dispatches' writes, the others the copies'. */
    memory_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                   VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    KILN_VK_RETURN(vkEndCommandBuffer(cmd));
    return KILN_OK;
}

static kiln_status create_objects(kiln_model *m, int staged) {
    const kiln_model_desc *d = m->desc;
    kiln_device *dev = m->device;
    KILN_RETURN_IF_ERROR(check_desc(dev, d));

    VkBufferUsageFlags storage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                 VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
                                 VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                 VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    KILN_RETURN_IF_ERROR(kiln__buffer_create(
        dev, d->arena_bytes,
        storage | (d->indirect_count ? VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT : 0),
        KILN__MEMORY_DEVICE, &m->arena));
    KILN_RETURN_IF_ERROR(kiln__buffer_create(dev, d->weight_bytes, storage,
                                             KILN__MEMORY_DEVICE, &m->weights));
    /* Staging the dispatches can address (direct I/O), where the device
     * allows storage buffers in host-visible memory; else copies only. */
    VkBufferUsageFlags transfer = VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                  VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    if (kiln__buffer_create(dev, d->io_bytes, storage, KILN__MEMORY_STAGING, &m->io) !=
        KILN_OK)
        KILN_RETURN_IF_ERROR(kiln__buffer_create(dev, d->io_bytes, transfer,
                                                 KILN__MEMORY_STAGING, &m->io));
    for (uint32_t i = 0; i < d->dim_count; i++)
        m->dims[i] = d->dims[i].max;
    write_dims(m);

    VkCommandPoolCreateInfo pi;
    memset(&pi, 0, sizeof pi);
    pi.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pi.queueFamilyIndex = dev->queue_family;
    KILN_VK_RETURN(vkCreateCommandPool(dev->device, &pi, dev->vk_alloc_driver, &m->pool));
    VkFenceCreateInfo fi;
    memset(&fi, 0, sizeof fi);
    fi.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    KILN_VK_RETURN(vkCreateFence(dev->device, &fi, dev->vk_alloc, &m->fence));

    KILN_RETURN_IF_ERROR(upload(m, m->weights.buffer, 0, d->weight_bytes, d->weights));
    KILN_RETURN_IF_ERROR(choose_direct_io(m, staged));
    if (d->sync_check)
        KILN_RETURN_IF_ERROR(create_sync_sets(m));
    KILN_RETURN_IF_ERROR(create_pipelines(m));
    KILN_RETURN_IF_ERROR(kiln_model_reset_state(m));
    return record(m);
}

static kiln_status create_timestamps(kiln_model *m) {
    kiln_device *dev = m->device;
    if (dev->timestamp_bits == 0 || dev->props.limits.timestampPeriod <= 0)
        return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                         "profiling needs timestamps, which the queue of %s lacks",
                         dev->props.deviceName);
    VkQueryPoolCreateInfo qi;
    memset(&qi, 0, sizeof qi);
    qi.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = m->desc->dispatch_count + 1;
    KILN_VK_RETURN(vkCreateQueryPool(dev->device, &qi, dev->vk_alloc, &m->timestamps));
    return KILN_OK;
}

kiln_status kiln_model_create(kiln_device *device, const kiln_model_desc *desc,
                              kiln_model **out_model) {
    return kiln_model_create_ex(device, desc, NULL, out_model);
}

kiln_status kiln_model_create_ex(kiln_device *device, const kiln_model_desc *desc,
                                 const kiln_model_options *options,
                                 kiln_model **out_model) {
    if (!out_model)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "out_model is NULL");
    *out_model = NULL;
    if (!desc)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "desc is NULL");
    const kiln_allocator *host = device ? &device->allocator : NULL;
    kiln_model *m = (kiln_model *)kiln__calloc(host, 1, sizeof *m);
    if (!m)
        return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating a model");
    m->host = host;
    m->desc = desc;
    m->device = device;
    m->weights_path = options && options->weights_path ? options->weights_path
                                                       : desc->weights_file;
    kiln_status s = KILN_OK;
    if (!device) {
        s = kiln_device_create(NULL, &m->device);
        m->owns_device = 1;
    }
    const char *env = getenv("KILN_PROFILE");
    bool profile = (options && (options->flags & KILN_MODEL_PROFILE)) ||
                   (env && *env && strcmp(env, "0") != 0);
    env = getenv("KILN_STAGED_IO");
    bool staged = (options && (options->flags & KILN_MODEL_STAGED_IO)) ||
                  (env && *env && strcmp(env, "0") != 0);
    if (s == KILN_OK && profile)
        s = create_timestamps(m);
    if (s == KILN_OK)
        s = create_objects(m, staged);
    if (s != KILN_OK) {
        kiln_model_destroy(m);
        return s;
    }
    *out_model = m;
    return KILN_OK;
}

/* The first byte of the `bytes` bytes at p (a multiple of 4) that does not
 * hold KILN_GUARD_PATTERN, or bytes; *word gets its word. */
static uint64_t band_broken(const unsigned char *p, uint64_t bytes, uint32_t *word) {
    for (uint64_t k = 0; k < bytes; k += 4) {
        memcpy(word, p + k, 4);
        if (*word != KILN_GUARD_PATTERN)
            return k;
    }
    return bytes;
}

/* --guard: every band must still hold the pattern the run wrote into it:
 * the arena's (copied to staging) and, with direct I/O, staging's gaps. */
static kiln_status check_guards(const kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    const unsigned char *io = (const unsigned char *)m->io.mapped;
    uint32_t w;
    for (uint32_t i = 0; i < d->guard_count; i++) {
        const kiln_guard *g = &d->guards[i];
        uint64_t k = band_broken(io + g->io_offset, g->bytes, &w);
        if (k < g->bytes)
            return KILN_FAIL(KILN_ERROR_OUT_OF_BOUNDS,
                             "a kernel wrote past %s%s%s: the guard band at arena "
                             "offset %llu holds 0x%08x at byte %llu of %llu",
                             *g->after ? "tensor '" : "the start of the arena",
                             g->after, *g->after ? "'" : "",
                             (unsigned long long)g->offset, (unsigned)w,
                             (unsigned long long)k, (unsigned long long)g->bytes);
    }
    for (uint32_t i = 0; i < m->gap_count; i++) {
        const struct staging_gap *g = &m->gaps[i];
        uint64_t k = band_broken(io + g->begin, g->end - g->begin, &w);
        if (k < g->end - g->begin)
            return KILN_FAIL(KILN_ERROR_OUT_OF_BOUNDS,
                             "a kernel wrote past %s%s%s in staging (direct I/O): "
                             "byte %llu of staging holds 0x%08x",
                             *g->after ? "'" : "the start", g->after,
                             *g->after ? "'" : "", (unsigned long long)(g->begin + k),
                             (unsigned)w);
    }
    return KILN_OK;
}

/* Fills staging's gaps (a guarded model with direct I/O) with the pattern
 * check_guards looks for. */
static void fill_staging_gaps(kiln_model *m) {
    uint32_t w = KILN_GUARD_PATTERN;
    for (uint32_t i = 0; i < m->gap_count; i++)
        for (uint64_t k = m->gaps[i].begin; k < m->gaps[i].end; k += 4)
            memcpy((unsigned char *)m->io.mapped + k, &w, 4);
}

/* One submit of the recorded command buffer and its wait; the staging
 * memory holds the inputs before and the outputs after. */
static kiln_status submit_and_wait(kiln_model *m) {
    if (m->broken != KILN_OK)
        return KILN_FAIL(m->broken, m->broken == KILN_ERROR_DEVICE_LOST
                                        ? "the device was lost in an earlier run"
                                        : "an earlier run failed after its submit; "
                                          "destroy the model and create it again");
    VkDevice vd = m->device->device;
    fill_staging_gaps(m);
    VkSubmitInfo si;
    memset(&si, 0, sizeof si);
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &m->cmd;
    VkResult r = vkQueueSubmit(m->device->queue, 1, &si, m->fence);
    VkResult submitted = r;
    /* Small models finish in microseconds, and a blocking wait can cost tens
     * of them in wake-up latency: poll the fence for a while first. */
    for (int spin = 0; r == VK_SUCCESS && spin < SPIN_POLLS; spin++) {
        r = vkGetFenceStatus(vd, m->fence);
        if (r == VK_NOT_READY)
            r = VK_SUCCESS;
        else
            break;
    }
    if (r == VK_SUCCESS)
        r = vkWaitForFences(vd, 1, &m->fence, VK_TRUE, UINT64_MAX);
    if (r == VK_SUCCESS)
        r = vkResetFences(vd, 1, &m->fence);
    if (r != VK_SUCCESS) {
        kiln_status st = kiln__vk_fail(r, __FILE__, __LINE__, "submit, wait and reset");
        /* A failed submit changed nothing; after that, the fence may be
         * pending or signaled and the outputs are unknown. */
        if (submitted == VK_SUCCESS || r == VK_ERROR_DEVICE_LOST)
            m->broken = r == VK_ERROR_DEVICE_LOST ? KILN_ERROR_DEVICE_LOST : st;
        return st;
    }
    m->ran = 1;
    return check_guards(m);
}

kiln_status kiln_model_run(kiln_model *m, const void *const *inputs,
                           void *const *outputs) {
    if (!m)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model is NULL");
    const kiln_model_desc *d = m->desc;
    if ((d->input_count && !inputs) || (d->output_count && !outputs))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                         "inputs or outputs is NULL");
    for (uint32_t i = 0; i < d->input_count; i++)
        if (d->inputs[i].bytes && !inputs[i])
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "input %u (%s) is NULL",
                             i, d->inputs[i].name);
    for (uint32_t i = 0; i < d->output_count; i++)
        if (d->outputs[i].bytes && !outputs[i])
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "output %u (%s) is NULL",
                             i, d->outputs[i].name);
    /* With dynamic dims a tensor's bytes at this run's extent are a prefix
     * of its bytes at the largest (the dynamic axis is outermost). */
    for (uint32_t i = 0; i < d->input_count; i++)
        memcpy((char *)m->io.mapped + d->inputs[i].io_offset, inputs[i],
               (size_t)kiln_model_tensor_bytes(m, &d->inputs[i]));
    KILN_RETURN_IF_ERROR(submit_and_wait(m));
    for (uint32_t i = 0; i < d->output_count; i++)
        memcpy(outputs[i], (const char *)m->io.mapped + d->outputs[i].io_offset,
               (size_t)kiln_model_tensor_bytes(m, &d->outputs[i]));
    return KILN_OK;
}

kiln_status kiln_model_set_dims(kiln_model *m, const int64_t *values, uint32_t count) {
    if (!m || (count && !values))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model or values is NULL");
    const kiln_model_desc *d = m->desc;
    if (count != d->dim_count)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s has %u dynamic dimensions, "
                         "not %u", d->name, d->dim_count, count);
    for (uint32_t i = 0; i < count; i++)
        if (values[i] < d->dims[i].min || values[i] > d->dims[i].max)
            return KILN_FAIL(KILN_ERROR_OUT_OF_RANGE, "model %s: %s = %lld is outside its "
                             "range %lld..%lld", d->name, d->dims[i].name,
                             (long long)values[i], (long long)d->dims[i].min,
                             (long long)d->dims[i].max);
    for (uint32_t i = 0; i < count; i++)
        m->dims[i] = values[i];
    write_dims(m);
    return KILN_OK;
}

kiln_status kiln_model_set_dim(kiln_model *m, const char *name, int64_t value) {
    if (!m || !name)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model or name is NULL");
    const kiln_model_desc *d = m->desc;
    int64_t v[KILN_MAX_DIMS];
    memcpy(v, m->dims, sizeof v);
    for (uint32_t i = 0; i < d->dim_count; i++) {
        if (strcmp(d->dims[i].name, name) == 0) {
            v[i] = value;
            return kiln_model_set_dims(m, v, d->dim_count);
        }
    }
    return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s has no dynamic dimension '%s'",
                     d->name, name);
}

void kiln_model_tensor_shape(const kiln_model *m, const kiln_tensor_info *t,
                             int64_t *shape) {
    if (!t || !shape)
        return;
    for (uint32_t i = 0; i < t->rank && i < KILN_MAX_RANK; i++)
        shape[i] = t->shape[i];
    if (m && t->dyn_axis >= 0 && (uint32_t)t->dyn_axis < t->rank)
        shape[t->dyn_axis] = eval_extent(&t->extent, m->dims);
}

uint64_t kiln_model_tensor_bytes(const kiln_model *m, const kiln_tensor_info *t) {
    if (!t)
        return 0;
    if (!m || t->dyn_axis < 0 || (uint32_t)t->dyn_axis >= t->rank ||
        t->shape[t->dyn_axis] <= 0)
        return t->bytes;
    int64_t e = eval_extent(&t->extent, m->dims);
    if (e < 0 || e > t->shape[t->dyn_axis])
        return t->bytes; /* cannot happen within the dims' ranges */
    return t->bytes / (uint64_t)t->shape[t->dyn_axis] * (uint64_t)e;
}

kiln_status kiln_model_run_mapped(kiln_model *m) {
    if (!m)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model is NULL");
    return submit_and_wait(m);
}

void *kiln_model_input_memory(kiln_model *m, uint32_t i) {
    if (!m || i >= m->desc->input_count)
        return NULL;
    return (char *)m->io.mapped + m->desc->inputs[i].io_offset;
}

int kiln_model_io_direct(const kiln_model *m, int output, uint32_t i) {
    if (!m || i >= (output ? m->desc->output_count : m->desc->input_count))
        return 0;
    const kiln_tensor_info *t = output ? &m->desc->outputs[i] : &m->desc->inputs[i];
    return t->bytes && is_direct(m, t); /* chosen ones have bytes */
}

const void *kiln_model_output_memory(const kiln_model *m, uint32_t i) {
    if (!m || i >= m->desc->output_count)
        return NULL;
    return (const char *)m->io.mapped + m->desc->outputs[i].io_offset;
}

void kiln_model_destroy(kiln_model *m) {
    if (!m)
        return;
    kiln_device *dev = m->device;
    if (dev && dev->device) {
        /* After a device loss this may fail; destroy goes on regardless.
         * The queue, not the device: a device of the caller's
         * (kiln_rt_vulkan.h) may have other queues busy with its work. */
        vkQueueWaitIdle(dev->queue);
        if (m->pipelines) {
            for (uint32_t i = 0; i < m->desc->kernel_count; i++)
                if (m->pipelines[i])
                    vkDestroyPipeline(dev->device, m->pipelines[i], dev->vk_alloc);
        }
        if (m->cache)
            vkDestroyPipelineCache(dev->device, m->cache, dev->vk_alloc);
        if (m->layout)
            vkDestroyPipelineLayout(dev->device, m->layout, dev->vk_alloc);
        if (m->descriptor_pool) /* frees the sets */
            vkDestroyDescriptorPool(dev->device, m->descriptor_pool, dev->vk_alloc);
        if (m->set_layout)
            vkDestroyDescriptorSetLayout(dev->device, m->set_layout, dev->vk_alloc);
        kiln__buffer_destroy(dev, &m->sink);
        if (m->pool)
            vkDestroyCommandPool(dev->device, m->pool, dev->vk_alloc_driver);
        if (m->fence)
            vkDestroyFence(dev->device, m->fence, dev->vk_alloc);
        if (m->timestamps)
            vkDestroyQueryPool(dev->device, m->timestamps, dev->vk_alloc);
        kiln__buffer_destroy(dev, &m->arena);
        kiln__buffer_destroy(dev, &m->weights);
        kiln__buffer_destroy(dev, &m->io);
    }
    kiln__free(m->host, m->pipelines);
    kiln__free(m->host, m->sets);
    kiln__free(m->host, m->direct);
    kiln__free(m->host, m->gaps);
    if (m->owns_device)
        kiln_device_destroy(dev);
    kiln__free(m->host, m);
}

kiln_status kiln_model_profile(kiln_model *m, double *us, uint32_t count) {
    if (!m || !us)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model or us is NULL");
    uint32_t n = m->desc->dispatch_count;
    if (!m->timestamps)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                         "the model was created without KILN_MODEL_PROFILE");
    if (!m->ran)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "the model has not run yet");
    if (count < n)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "room for %u times, %u dispatches",
                         count, n);
    if (n == 0)
        return KILN_OK;
    uint64_t *t = (uint64_t *)kiln__calloc(m->host, n + 1, sizeof *t);
    if (!t)
        return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating timestamps");
    VkResult r = vkGetQueryPoolResults(m->device->device, m->timestamps, 0, n + 1,
                                       sizeof(uint64_t) * (n + 1), t, sizeof(uint64_t),
                                       VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    if (r != VK_SUCCESS) {
        kiln__free(m->host, t);
        return kiln__vk_fail(r, __FILE__, __LINE__, "vkGetQueryPoolResults");
    }
    uint32_t bits = m->device->timestamp_bits;
    uint64_t mask = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
    double period = m->device->props.limits.timestampPeriod; /* ns per tick */
    for (uint32_t i = 0; i < n; i++)
        us[i] = (double)((t[i + 1] - t[i]) & mask) * period / 1000.0;
    kiln__free(m->host, t);
    return KILN_OK;
}

kiln_status kiln_model_read_tensor(kiln_model *m, const kiln_tensor_info *tensor, void *dst) {
    if (!m || !tensor || !dst)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model, tensor or dst is NULL");
    if (tensor->bytes == 0)
        return KILN_OK;
    kiln_device *dev = m->device;
    kiln__buffer staging;
    KILN_RETURN_IF_ERROR(kiln__buffer_create(dev, tensor->bytes,
                                             VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                             KILN__MEMORY_STAGING, &staging));
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    kiln_status s = begin_commands(m, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, &cmd);
    if (s == KILN_OK) {
        int64_t shift;
        const kiln__buffer *from = locate(m, tensor->buffer, tensor->offset,
                                          tensor->offset + tensor->bytes, &shift);
        VkBufferCopy c = {tensor->offset + (uint64_t)shift, 0, tensor->bytes};
        vkCmdCopyBuffer(cmd, from->buffer, staging.buffer, 1, &c);
        memory_barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                       VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        s = submit_once(m, cmd);
    }
    if (s == KILN_OK)
        memcpy(dst, staging.mapped, (size_t)tensor->bytes);
    kiln__buffer_destroy(dev, &staging);
    return s;
}

kiln_status kiln_model_reset_state(kiln_model *m) {
    if (!m)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model is NULL");
    const kiln_model_desc *d = m->desc;
    if (d->state_count == 0)
        return KILN_OK;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    KILN_RETURN_IF_ERROR(begin_commands(m, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, &cmd));
    for (uint32_t i = 0; i < d->state_count; i++)
        if (d->states[i].bytes)
            vkCmdFillBuffer(cmd, m->arena.buffer, d->states[i].offset,
                            (d->states[i].bytes + 3) / 4 * 4, 0);
    return submit_once(m, cmd);
}

kiln_status kiln_model_read_state(kiln_model *m, uint32_t i, void *dst) {
    if (!m || i >= m->desc->state_count)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model is NULL or has no state %u", i);
    return kiln_model_read_tensor(m, &m->desc->states[i], dst);
}

kiln_status kiln_model_write_state(kiln_model *m, uint32_t i, const void *src) {
    if (!m || !src || i >= m->desc->state_count)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT,
                         "model or src is NULL, or the model has no state %u", i);
    const kiln_tensor_info *t = &m->desc->states[i];
    return upload(m, m->arena.buffer, t->offset, t->bytes, src);
}

kiln_device *kiln_model_device(const kiln_model *m) { return m ? m->device : NULL; }

const kiln_model_desc *kiln_model_get_desc(const kiln_model *m) {
    return m ? m->desc : NULL;
}
