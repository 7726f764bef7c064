/*
 * model.c: turning a compiled model's tables into Vulkan objects, and runs.
 *
 * create:
 *   1. check the tables' ABI version and the device's features and limits;
 *   2. make three buffers: the arena (every activation, inputs and outputs at
 *      the offsets the compiler chose), the weights (uploaded once through a
 *      temporary staging buffer, model_transfer.c, or read from a sidecar
 *      file, model_weights.c) and a mapped staging buffer for inputs and
 *      outputs;
 *   3. one shader module and compute pipeline per kernel, all sharing one
 *      pipeline layout whose only state is 128 bytes of push constants: the
 *      64-bit device addresses of the tensors a dispatch touches;
 *   4. pick the direct inputs and outputs (model_io.c): those the
 *      dispatches reach in staging itself instead of through a copy;
 *   5. record the whole run into one command buffer, once (model_record.c).
 * A model compiled with --sync-check also gets a descriptor set per recorded
 * dispatch, and one compiled with --guard has its guard bands checked after
 * every run (model_check.c).
 *
 * run copies inputs into the staging buffer, submits that command buffer,
 * waits on one fence (polling it briefly before blocking) and copies outputs
 * out. It allocates nothing.
 *
 * Dynamic dimensions change no command (model_dims.c).
 */
#include "internal.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#ifdef KILN_FAULT_INJECTION
#define SPIN_POLLS 1 /* one poll per run: each call can be the failing one */
#else
#define SPIN_POLLS 20000 /* fence polls before a blocking wait (~1 ms) */
#endif

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
    KILN_RETURN_IF_ERROR(kiln__check_dims(d));
    if (dev->props.limits.maxPushConstantsSize < KILN__PUSH_BYTES)
        return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                         "%s offers %u bytes of push constants, kiln needs %u",
                         dev->props.deviceName,
                         dev->props.limits.maxPushConstantsSize, KILN__PUSH_BYTES);
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

static kiln_status create_pipelines(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    const kiln_device *dev = m->device;
    VkDevice vd = dev->device;

    VkPushConstantRange range = {VK_SHADER_STAGE_COMPUTE_BIT, 0, KILN__PUSH_BYTES};
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
    kiln__pipeline_cache_load(m, &ci);
    VkResult cr = vkCreatePipelineCache(vd, &ci, dev->vk_alloc, &m->cache);
    if (cr != VK_SUCCESS && ci.initialDataSize) { /* data the driver refuses: none */
        ci.initialDataSize = 0;
        ci.pInitialData = NULL;
        m->pipeline_cache_bytes = 0;
        cr = vkCreatePipelineCache(vd, &ci, dev->vk_alloc, &m->cache);
    }
    KILN_VK_RETURN(cr);

    m->pipelines = (VkPipeline *)kiln__calloc(m->host, d->kernel_count ? d->kernel_count : 1,
                                              sizeof *m->pipelines);
    if (!m->pipelines)
        return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating pipelines");
    for (uint32_t i = 0; i < d->kernel_count; i++) {
        int used = 0; /* by a dispatch this device records */
        for (uint32_t j = 0; j < d->dispatch_count && !used; j++)
            used = d->dispatches[j].kernel == i &&
                   kiln__dispatch_active(dev, &d->dispatches[j]);
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
    kiln__pipeline_cache_save(m);
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
    if (d->indirect_count) { /* kiln__write_dims marks the idle ones */
        m->idle = kiln__calloc(m->host, d->dispatch_count, 1);
        if (!m->idle)
            return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "model %s: no memory for %u flags",
                             d->name, d->dispatch_count);
    }
    uint32_t nio = d->input_count + d->output_count;
    if (d->dim_count && nio) { /* kiln__write_dims sets each one's copy */
        m->spans = kiln__calloc(m->host, nio, sizeof *m->spans);
        if (!m->spans)
            return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "model %s: no memory for %u "
                             "sizes", d->name, nio);
    }
    for (uint32_t i = 0; i < d->dim_count; i++)
        m->dims[i] = d->dims[i].max;
    kiln__write_dims(m);

    VkCommandPoolCreateInfo pi;
    memset(&pi, 0, sizeof pi);
    pi.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pi.queueFamilyIndex = dev->queue_family;
    KILN_VK_RETURN(vkCreateCommandPool(dev->device, &pi, dev->vk_alloc_driver, &m->pool));
    VkFenceCreateInfo fi;
    memset(&fi, 0, sizeof fi);
    fi.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    KILN_VK_RETURN(vkCreateFence(dev->device, &fi, dev->vk_alloc, &m->fence));

    KILN_RETURN_IF_ERROR(kiln__upload_weights(m));
    KILN_RETURN_IF_ERROR(kiln__choose_direct_io(m, staged));
    if (m->direct_count && d->guard_count) /* direct I/O's staging gaps checked too */
        KILN_RETURN_IF_ERROR(kiln__find_staging_gaps(m));
    if (d->sync_check)
        KILN_RETURN_IF_ERROR(kiln__create_sync_sets(m));
    KILN_RETURN_IF_ERROR(create_pipelines(m));
    KILN_RETURN_IF_ERROR(kiln_model_reset_state(m));
    return kiln__record(m);
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
    if (options)
        KILN_RETURN_IF_ERROR(kiln__check_options_size(
            "kiln_model_options", options->size, KILN__MODEL_OPTIONS_0_2));
    const kiln_allocator *host = device ? &device->allocator : NULL;
    kiln_model *m = (kiln_model *)kiln__calloc(host, 1, sizeof *m);
    if (!m)
        return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating a model");
    m->host = host;
    m->desc = desc;
    m->device = device;
    m->weights_path = options && options->weights_path ? options->weights_path
                                                       : desc->weights_file;
    m->pipeline_cache_option = KILN__HAS_FIELD(options, kiln_model_options, pipeline_cache)
                                   ? options->pipeline_cache
                                   : NULL;
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

/* One submit of the recorded command buffer and its wait; the staging
 * memory holds the inputs before and the outputs after. */
static kiln_status submit_and_wait(kiln_model *m) {
    if (m->broken != KILN_OK)
        return KILN_FAIL(m->broken, m->broken == KILN_ERROR_DEVICE_LOST
                                        ? "the device was lost in an earlier run"
                                        : "an earlier run failed after its submit; "
                                          "destroy the model and create it again");
    VkDevice vd = m->device->device;
    kiln__fill_staging_gaps(m);
    VkSubmitInfo si;
    memset(&si, 0, sizeof si);
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    VkCommandBuffer cmd = kiln__recording(m);
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
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
    return kiln__check_guards(m);
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
    /* With dynamic dims the caller's tensors are contiguous at this run's
     * extents; staging keeps the largest shape's strides. */
    for (uint32_t i = 0; i < d->input_count; i++)
        kiln__copy_extent(m, &d->inputs[i], (char *)m->io.mapped + d->inputs[i].io_offset,
                          inputs[i], 1);
    KILN_RETURN_IF_ERROR(submit_and_wait(m));
    for (uint32_t i = 0; i < d->output_count; i++)
        kiln__copy_extent(m, &d->outputs[i], outputs[i],
                          (const char *)m->io.mapped + d->outputs[i].io_offset, 0);
    return KILN_OK;
}

kiln_status kiln_model_run_mapped(kiln_model *m) {
    if (!m)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model is NULL");
    return submit_and_wait(m);
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
        kiln__pipeline_cache_free(m);
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
    kiln__free(m->host, m->idle);
    kiln__free(m->host, m->spans);
    for (uint32_t k = 0; k < m->recording_count; k++) {
        kiln__free(m->host, m->recordings[k].idle);
        kiln__free(m->host, m->recordings[k].spans);
    }
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
    /* a dispatch this device does not record, or that the run's recording
     * left out (idle at its dims), has its timestamp written right after the
     * one before: about a microsecond of nothing */
    for (uint32_t i = 0; i < n; i++)
        us[i] = kiln__dispatch_active(m->device, &m->desc->dispatches[i]) &&
                        !(m->ran_idle && m->ran_idle[i])
                    ? (double)((t[i + 1] - t[i]) & mask) * period / 1000.0 : 0.0;
    kiln__free(m->host, t);
    return KILN_OK;
}

kiln_device *kiln_model_device(const kiln_model *m) { return m ? m->device : NULL; }

const kiln_model_desc *kiln_model_get_desc(const kiln_model *m) {
    return m ? m->desc : NULL;
}
