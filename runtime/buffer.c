/*
 * buffer.c: one VkBuffer with its own VkDeviceMemory.
 *
 * A model has few buffers (arena, weights, staging), so each gets a dedicated
 * allocation; there is no sub-allocator. Device buffers prefer DEVICE_LOCAL
 * memory and take any allowed type when none is; staging buffers require
 * HOST_VISIBLE | HOST_COHERENT and stay mapped for their whole life.
 */
#include "internal.h"

#include <string.h>

static int find_memory_type(const kiln_device *dev, uint32_t allowed,
                            VkMemoryPropertyFlags want) {
    for (uint32_t i = 0; i < dev->memory.memoryTypeCount; i++)
        if ((allowed & (1u << i)) &&
            (dev->memory.memoryTypes[i].propertyFlags & want) == want)
            return (int)i;
    return -1;
}

kiln_status kiln__buffer_create(kiln_device *dev, VkDeviceSize size,
                                VkBufferUsageFlags usage,
                                kiln__memory_kind kind, kiln__buffer *out) {
    memset(out, 0, sizeof *out);
    if (size < 16)
        size = 16; /* Vulkan forbids empty buffers */
    out->size = size;

    VkBufferCreateInfo bi;
    memset(&bi, 0, sizeof bi);
    bi.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bi.size = size;
    bi.usage = usage;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    KILN_VK_RETURN(vkCreateBuffer(dev->device, &bi, dev->vk_alloc, &out->buffer));

    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev->device, out->buffer, &req);
    int type;
    if (kind == KILN__MEMORY_STAGING) {
        type = find_memory_type(dev, req.memoryTypeBits,
                                VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                    VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                    VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
        if (type < 0)
            type = find_memory_type(dev, req.memoryTypeBits,
                                    VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                        VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    } else {
        type = find_memory_type(dev, req.memoryTypeBits,
                                VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
        if (type < 0)
            type = find_memory_type(dev, req.memoryTypeBits, 0);
    }
    if (type < 0) {
        kiln__buffer_destroy(dev, out);
        return KILN_FAIL(KILN_ERROR_FEATURE_MISSING,
                         "no memory type for a %s buffer of %llu bytes",
                         kind == KILN__MEMORY_STAGING ? "host-visible coherent"
                                                      : "device",
                         (unsigned long long)size);
    }

    VkMemoryAllocateFlagsInfo flags;
    memset(&flags, 0, sizeof flags);
    flags.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO;
    flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
    VkMemoryAllocateInfo ai;
    memset(&ai, 0, sizeof ai);
    ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    if (usage & VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT)
        ai.pNext = &flags;
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = (uint32_t)type;
    out->host_cached = (dev->memory.memoryTypes[type].propertyFlags &
                        VK_MEMORY_PROPERTY_HOST_CACHED_BIT) != 0;
    kiln_status s = KILN_OK;
    KILN_VK_GOTO(s, vkAllocateMemory(dev->device, &ai, dev->vk_alloc, &out->memory), fail);
    KILN_VK_GOTO(s, vkBindBufferMemory(dev->device, out->buffer, out->memory, 0),
                 fail);
    if (kind == KILN__MEMORY_STAGING)
        KILN_VK_GOTO(s, vkMapMemory(dev->device, out->memory, 0, VK_WHOLE_SIZE, 0,
                                    &out->mapped),
                     fail);
    if (usage & VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT) {
        VkBufferDeviceAddressInfo info;
        memset(&info, 0, sizeof info);
        info.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO;
        info.buffer = out->buffer;
        out->address = vkGetBufferDeviceAddress(dev->device, &info);
    }
    return KILN_OK;
fail:
    kiln__buffer_destroy(dev, out);
    return s;
}

void kiln__buffer_destroy(kiln_device *dev, kiln__buffer *buf) {
    if (!dev || !buf)
        return;
    if (buf->mapped)
        vkUnmapMemory(dev->device, buf->memory);
    if (buf->buffer)
        vkDestroyBuffer(dev->device, buf->buffer, dev->vk_alloc);
    if (buf->memory)
        vkFreeMemory(dev->device, buf->memory, dev->vk_alloc);
    memset(buf, 0, sizeof *buf);
}
