/*
 * model_transfer.c: one-time transfers outside the recorded run, each a
 * command buffer of its own submitted and waited for: the weights at
 * create, a tensor read back for debugging, states reset, read and written
 * from the host; and the command-buffer and barrier helpers that the
 * recorded run (model_record.c) shares.
 */
#include "internal.h"

#include <string.h>

/* One global memory barrier (used here and by model_record.c). */
void kiln__memory_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src_stage,
                           VkAccessFlags src, VkPipelineStageFlags dst_stage,
                           VkAccessFlags dst) {
    VkMemoryBarrier b;
    memset(&b, 0, sizeof b);
    b.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    b.srcAccessMask = src;
    b.dstAccessMask = dst;
    vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, &b, 0, NULL, 0, NULL);
}

/* Allocates a primary command buffer from the model's pool and begins it;
 * on failure nothing is left allocated. */
kiln_status kiln__begin_commands(kiln_model *m, VkCommandBufferUsageFlags flags,
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
kiln_status kiln__submit_once(kiln_model *m, VkCommandBuffer cmd) {
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

/* Copies `bytes` bytes of src into dst at offset, through a temporary
 * staging buffer and one submit: a state or tensor from the host. */
kiln_status kiln__upload(kiln_model *m, VkBuffer dst, uint64_t offset, uint64_t bytes,
                          const void *src) {
    kiln_device *dev = m->device;
    if (bytes == 0)
        return KILN_OK;
    kiln__buffer staging;
    KILN_RETURN_IF_ERROR(kiln__buffer_create(dev, bytes, VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                             KILN__MEMORY_STAGING, &staging));
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    kiln_status s = KILN_OK;
    memcpy(staging.mapped, src, (size_t)bytes);
    if (s == KILN_OK)
        s = kiln__begin_commands(m, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, &cmd);
    if (s == KILN_OK) {
        VkBufferCopy region = {0, offset, bytes};
        vkCmdCopyBuffer(cmd, staging.buffer, dst, 1, &region);
        s = kiln__submit_once(m, cmd);
    }
    kiln__buffer_destroy(dev, &staging);
    return s;
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
    kiln_status s = kiln__begin_commands(m, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, &cmd);
    if (s == KILN_OK) {
        int64_t shift;
        const kiln__buffer *from = kiln__locate(m, tensor->buffer, tensor->offset,
                                          tensor->offset + tensor->bytes, &shift);
        VkBufferCopy c = {tensor->offset + (uint64_t)shift, 0, tensor->bytes};
        vkCmdCopyBuffer(cmd, from->buffer, staging.buffer, 1, &c);
        kiln__memory_barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                       VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        s = kiln__submit_once(m, cmd);
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
    KILN_RETURN_IF_ERROR(kiln__begin_commands(m, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, &cmd));
    for (uint32_t i = 0; i < d->state_count; i++)
        if (d->states[i].bytes)
            vkCmdFillBuffer(cmd, m->arena.buffer, d->states[i].offset,
                            (d->states[i].bytes + 3) / 4 * 4, 0);
    return kiln__submit_once(m, cmd);
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
    return kiln__upload(m, m->arena.buffer, t->offset, t->bytes, src);
}
