/*
 * model_check.c: the runtime side of kiln's test modes. --guard: bands
 * around every tensor (and, with direct I/O, the gaps of staging) filled
 * with a pattern before each run and checked after. --sync-check: a
 * descriptor set per dispatch over the bytes it touches, so that
 * synchronization validation sees every access.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static int by_begin(const void *a, const void *b) {
    const struct staging_gap *x = (const struct staging_gap *)a,
                             *y = (const struct staging_gap *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The gaps of a guarded model's staging (kiln_model.gaps), each from a
 * 4-byte boundary. */
kiln_status kiln__find_staging_gaps(kiln_model *m) {
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
        const kiln_tensor_info *t = kiln__io_tensor(d, i);
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
    own[n].end = d->dims_io_offset + (d->dim_count ? KILN__DIMS_BYTES : 0);
    own[n++].after = "the dims";
    own[n].begin = d->indirect_io_offset;
    own[n].end = d->indirect_io_offset + KILN__INDIRECT_BYTES * d->indirect_count;
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
kiln_status kiln__create_sync_sets(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    kiln_device *dev = m->device;
    VkDevice vd = dev->device;
    uint64_t align = dev->props.limits.minStorageBufferOffsetAlignment;
    uint32_t sets = 0, descriptors = 0, empty = 0, most = 1;
    for (uint32_t i = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        if (!kiln__dispatch_active(dev, x))
            continue;
        uint32_t n = x->binding_count;
        for (uint32_t b = 0; b < x->binding_count; b++) {
            const kiln_binding *bd = &d->bindings[x->first_binding + b];
            const kiln__buffer *buf = kiln__buffer_of(m, bd->buffer);
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
        if (!kiln__dispatch_active(dev, x))
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
            const kiln__buffer *buf = kiln__locate(m, bd->buffer, bd->begin, bd->end, &shift);
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
kiln_status kiln__check_guards(const kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    const unsigned char *io = (const unsigned char *)m->io.mapped;
    uint32_t w;
    for (uint32_t i = 0; i < d->guard_count; i++) {
        const kiln_guard *g = &d->guards[i];
        uint64_t k = band_broken(io + g->io_offset, g->bytes, &w);
        uint32_t r[4];
        if (k < g->bytes && g->index_node && g->bytes >= sizeof r) {
            memcpy(r, io + g->io_offset, sizeof r);
            if (r[0] == KILN_GUARD_INDEX)
                return KILN_FAIL(KILN_ERROR_OUT_OF_BOUNDS,
                                 "%s: index %d (element %u of the indices) is outside the "
                                 "axis, of size %u (a run-time index out of range; --guard "
                                 "checks them)", g->index_node, (int)r[1], (unsigned)r[3],
                                 (unsigned)r[2]);
        }
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
void kiln__fill_staging_gaps(kiln_model *m) {
    uint32_t w = KILN_GUARD_PATTERN;
    for (uint32_t i = 0; i < m->gap_count; i++)
        for (uint64_t k = m->gaps[i].begin; k < m->gaps[i].end; k += 4)
            memcpy((unsigned char *)m->io.mapped + k, &w, 4);
}
