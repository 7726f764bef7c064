/*
 * model_record.c: the command buffer a run submits, recorded once at
 * create:
 *   copy the inputs that are not direct (and the dynamic dims and indirect
 *   commands) staging -> arena; barrier (if anything was copied);
 *   every dispatch (a barrier before it where the compiler put one);
 *   barrier, state updates, copy the outputs that are not direct
 *   arena -> staging (if any); barrier to host.
 * A model with dynamic dims runs dispatches whose work follows them through
 * indirect counts, 0 when a run leaves one nothing to do (a product's
 * variant for other row counts: a decode step's tiled products). Those
 * still cost the GPU a few microseconds each, so a run whose dims leave
 * some idle submits a recording without them. Its copies of the inputs and
 * outputs take the bytes that hold the run's elements (m->spans), not the
 * tensors at their largest shapes: a decoding step's logits at one token
 * are 1/128 of those of a 128-token prompt, and copying the whole of them
 * to host memory took a 1.1B decoder's step 300 of its 1550 us on an H200.
 * A recording is made the first time its set of idle dispatches and spans
 * comes up (kiln__recording), up to KILN__RECORDINGS of them, then the
 * least recently used is recorded over.
 */
#include "internal.h"

#include <stdint.h>
#include <string.h>

/* Whether this device records dispatch x (kiln_dispatch.needs, .unless). */
int kiln__dispatch_active(const kiln_device *dev, const kiln_dispatch *x) {
    return (x->needs & ~dev->features) == 0 &&
           (x->unless == 0 || (x->unless & ~dev->features) != 0);
}

/* Records a copy of `bytes` bytes (none when 0). */
static void copy_bytes(VkCommandBuffer cmd, VkBuffer src, uint64_t from, VkBuffer dst,
                       uint64_t to, uint64_t bytes) {
    if (bytes == 0)
        return;
    VkBufferCopy c = {from, to, bytes};
    vkCmdCopyBuffer(cmd, src, dst, 1, &c);
}

/* Records the run into *out, without the dispatches idle flags (NULL: all
 * of them), copying spans[i] bytes of I/O tensor i (NULL: all of each). */
static kiln_status record(kiln_model *m, const uint8_t *idle, const uint64_t *spans,
                          VkCommandBuffer *out) {
    const kiln_model_desc *d = m->desc;
    KILN_RETURN_IF_ERROR(kiln__begin_commands(m, 0, out));
    VkCommandBuffer cmd = *out;
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
        if (t->bytes && !kiln__is_direct(m, t)) {
            copy_bytes(cmd, io, t->io_offset, arena, t->offset, spans ? spans[i] : t->bytes);
            before++;
        }
    }
    copy_bytes(cmd, io, d->dims_io_offset, arena, d->dims_offset,
               d->dim_count ? KILN__DIMS_BYTES : 0);
    copy_bytes(cmd, io, d->indirect_io_offset, arena, d->indirect_offset,
               KILN__INDIRECT_BYTES * d->indirect_count);
    for (uint32_t i = 0; i < d->guard_count; i++)
        vkCmdFillBuffer(cmd, arena, d->guards[i].offset, d->guards[i].bytes,
                        KILN_GUARD_PATTERN);
    if (before)
        kiln__memory_barrier(cmd, VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
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
        if (!kiln__dispatch_active(m->device, x) || (idle && idle[i])) {
            pending_barrier |= x->barrier & 1u;
            indirect += x->dyn_axis != KILN_AXIS_FIXED;
            if (m->timestamps) /* its time is 0 */
                vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                    m->timestamps, i + 1);
            continue;
        }
        if (x->barrier & KILN_BARRIER_PREFETCH) {
            /* no barrier: it runs beside the work before it */
        } else if (x->barrier || pending_barrier) {
            kiln__memory_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                           VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT,
                           VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                           VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
            pending_barrier = 0;
        }
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
            const kiln__buffer *buf = kiln__locate(m, bd->buffer, bd->begin, bd->end, &shift);
            push[b] = buf->address + bd->offset + (uint64_t)shift;
        }
        vkCmdPushConstants(cmd, m->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0,
                           KILN__PUSH_BYTES, push);
        if (m->sets)
            vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, m->layout, 0, 1,
                                    &m->sets[i], 0, NULL);
        if (x->dyn_axis != KILN_AXIS_FIXED)
            vkCmdDispatchIndirect(cmd, arena,
                                  d->indirect_offset + KILN__INDIRECT_BYTES * indirect++);
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
        after += !kiln__is_direct(m, &d->outputs[i]);
    if (after)
        kiln__memory_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT |
                                VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                       VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
    for (uint32_t i = 0; i < d->state_copy_count; i++)
        copy_bytes(cmd, arena, d->state_copies[i].src, arena, d->state_copies[i].dst,
                   d->state_copies[i].bytes);
    for (uint32_t i = 0; i < d->output_count; i++) {
        const kiln_tensor_info *t = &d->outputs[i];
        if (!kiln__is_direct(m, t))
            copy_bytes(cmd, kiln__buffer_of(m, t->buffer)->buffer, t->offset, io, t->io_offset,
                       spans ? spans[d->input_count + i] : t->bytes);
    }
    for (uint32_t i = 0; i < d->guard_count; i++)
        copy_bytes(cmd, arena, d->guards[i].offset, io, d->guards[i].io_offset,
                   d->guards[i].bytes);
    /* Direct outputs are the dispatches' writes, the others the copies'. */
    kiln__memory_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                   VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    KILN_VK_RETURN(vkEndCommandBuffer(cmd));
    return KILN_OK;
}

kiln_status kiln__record(kiln_model *m) { return record(m, NULL, NULL, &m->cmd); }

/* Whether recording r is the one for the current dims. */
static int recording_fits(const kiln_model *m, const struct kiln__recording *r) {
    const kiln_model_desc *d = m->desc;
    return (!m->idle || memcmp(r->idle, m->idle, d->dispatch_count) == 0) &&
           (!m->spans || memcmp(r->spans, m->spans,
                                sizeof *m->spans * (d->input_count + d->output_count)) == 0);
}

VkCommandBuffer kiln__recording(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    m->ran_idle = NULL;
    if (!m->idle_count && !m->spans_short)
        return m->cmd;
    m->uses++;
    struct kiln__recording *r = NULL;
    for (uint32_t k = 0; k < m->recording_count; k++) {
        r = &m->recordings[k];
        if (recording_fits(m, r)) {
            r->used = m->uses;
            m->ran_idle = r->idle;
            return r->cmd;
        }
    }
    uint32_t nio = d->input_count + d->output_count;
    if (m->recording_count < KILN__RECORDINGS) {
        r = &m->recordings[m->recording_count];
        if (m->idle && !(r->idle = kiln__calloc(m->host, d->dispatch_count, 1)))
            return m->cmd;
        if (!(r->spans = kiln__calloc(m->host, nio ? nio : 1, sizeof *r->spans))) {
            kiln__free(m->host, r->idle);
            r->idle = NULL;
            return m->cmd;
        }
        m->recording_count++;
    } else { /* recorded over: the least recently used (no run is pending) */
        r = &m->recordings[0];
        for (uint32_t k = 1; k < m->recording_count; k++)
            if (m->recordings[k].used < r->used)
                r = &m->recordings[k];
        vkFreeCommandBuffers(m->device->device, m->pool, 1, &r->cmd);
    }
    r->cmd = VK_NULL_HANDLE;
    if (m->idle)
        memcpy(r->idle, m->idle, d->dispatch_count);
    if (m->spans)
        memcpy(r->spans, m->spans, sizeof *r->spans * nio);
    if (record(m, r->idle, m->spans ? r->spans : NULL, &r->cmd) != KILN_OK) {
        /* the pool frees what it made; this slot is never chosen again */
        memset(r->spans, 0xff, sizeof *r->spans * (nio ? nio : 1));
        if (!m->spans && r->idle) /* nor its idle flags */
            memset(r->idle, 0xff, d->dispatch_count);
        r->used = 0;
        return m->cmd;
    }
    r->used = m->uses;
    m->ran_idle = r->idle;
    return r->cmd;
}
