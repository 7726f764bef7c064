/*
 * model_weights.c: the weights' upload at create, from the generated C or
 * from the sidecar file (kiln compile --weights-file), checked.
 *
 * The bytes travel through a ring of RING_SLOTS staging slots of at most
 * RING_CHUNK bytes: while the device copies one slot into the weights
 * buffer, the host reads the next chunk of the file into another and adds
 * it to the checksum. So create needs no staging buffer the size of the
 * weights (434 MB for BERT-base, which took longer to allocate than to
 * fill). A sidecar whose size is what its header says is mapped (on Linux
 * with its page tables made in one call): its chunks are copied and hashed
 * straight from the page cache. Otherwise fread reads it, and finds the
 * truncation or the extra bytes.
 *
 * The sidecar is "KILNWTS2" (or "KILNWTS1"), the byte count, a checksum
 * (little-endian u64s), then the bytes; format 2's checksum is kiln__hash,
 * format 1's (kiln 0.3.0 and before) FNV-1a 64. The header must match what
 * the generated C recorded, the file must hold exactly the count, and the
 * bytes their checksum; else create fails with KILN_ERROR_WEIGHTS, naming
 * the file and what is wrong. A sidecar that an earlier create checked
 * whole, unchanged since (model_pipeline_cache.c keeps that record), is not
 * hashed again: its bytes go straight into the staging memory.
 */
#define _POSIX_C_SOURCE 200809L /* fileno, mmap */
#define _DEFAULT_SOURCE /* glibc: MAP_POPULATE */
#include "internal.h"
#include "kiln_hash.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#ifndef MAP_POPULATE
#define MAP_POPULATE 0 /* Linux's: the page tables made in one call */
#endif

#define RING_CHUNK (4u << 20)
#define RING_SLOTS 4u

/* Where the weight bytes come from. */
typedef struct Source {
    const unsigned char *mem; /* the generated C's array, or NULL: */
    FILE *file;               /* the sidecar, read past its header */
    const char *path;
    int format;               /* the sidecar's: 1 or 2 */
    kiln__hash hash;          /* format 2's checksum so far */
    uint64_t fnv;             /* format 1's */
    const unsigned char *map; /* the file mapped (its size checked), or
                               * NULL: read with fread */
    size_t map_bytes;
    uint64_t at;              /* weight bytes taken so far */
    int trusted;              /* checked whole by an earlier create */
    unsigned char *bounce;    /* where file bytes are checked when the
                               * staging memory is not cached (reading it
                               * back would crawl), else NULL */
} Source;

/* Opens the sidecar and checks its header against the model. */
static kiln_status open_sidecar(const char *path, const kiln_model_desc *d, Source *src) {
    if (!path)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "the model has neither weights nor a weights file");
    src->path = path;
    src->file = fopen(path, "rb");
    if (!src->file)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "cannot open the weights file %s: %s", path,
                         strerror(errno));
    unsigned char head[24];
    unsigned long long want = (unsigned long long)d->weight_bytes;
    if (fread(head, 1, sizeof head, src->file) != sizeof head ||
        (memcmp(head, "KILNWTS2", 8) != 0 && memcmp(head, "KILNWTS1", 8) != 0))
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is not a kiln weights file", path);
    src->format = head[7] - '0';
    if (kiln__get_u64(head + 8) != d->weight_bytes)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "%s holds %llu bytes of weights; model %s needs "
                         "%llu (a file from another compile?)", path,
                         (unsigned long long)kiln__get_u64(head + 8), d->name, want);
    if (kiln__get_u64(head + 16) != d->weights_checksum)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is from another compile: its checksum is "
                         "%016llx, model %s expects %016llx", path,
                         (unsigned long long)kiln__get_u64(head + 16), d->name,
                         (unsigned long long)d->weights_checksum);
    kiln__hash_init(&src->hash);
    src->fnv = KILN__FNV_SEED;
    /* Mapped when it has exactly the bytes announced (else fread finds out
     * what is wrong): copied and hashed from the page cache directly. */
    struct stat st;
    if (fstat(fileno(src->file), &st) == 0 && (uint64_t)st.st_size == 24 + d->weight_bytes &&
        st.st_size <= (off_t)(SIZE_MAX / 2)) {
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED | MAP_POPULATE,
                         fileno(src->file), 0);
        if (map != MAP_FAILED) {
            src->map = (const unsigned char *)map;
            src->map_bytes = (size_t)st.st_size;
        }
    }
    return KILN_OK;
}

/* The next n bytes of the weights into dst (a staging slot), hashed. */
static kiln_status fill(Source *src, const kiln_model_desc *d, unsigned char *dst, size_t n) {
    const unsigned char *from; /* where the bytes are hashed */
    if (src->mem) {
        memcpy(dst, src->mem + src->at, n);
        src->at += n;
        return KILN_OK;
    }
    if (src->map) {
        from = src->map + 24 + src->at;
        memcpy(dst, from, n);
    } else {
        unsigned char *to = src->bounce ? src->bounce : dst;
        if (fread(to, 1, n, src->file) != n)
            return KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is truncated: it has fewer than the %llu "
                             "bytes of weights its header announces", src->path,
                             (unsigned long long)d->weight_bytes);
        if (src->bounce)
            memcpy(dst, to, n);
        from = to;
    }
    src->at += n;
    if (src->trusted)
        return KILN_OK;
    if (src->format == 1)
        src->fnv = kiln__fnv1a64(from, n, src->fnv);
    else
        kiln__hash_update(&src->hash, from, n);
    return KILN_OK;
}

/* After the last byte: nothing may follow, and the checksum must hold. */
static kiln_status finish(kiln_model *m, Source *src) {
    const kiln_model_desc *d = m->desc;
    if (!src->file)
        return KILN_OK;
    if (!src->map && fgetc(src->file) != EOF)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "%s has bytes after its %llu bytes of weights",
                         src->path, (unsigned long long)d->weight_bytes);
    if (src->trusted)
        return KILN_OK;
    uint64_t h = src->format == 1 ? src->fnv : kiln__hash_final(&src->hash);
    if (h != d->weights_checksum)
        return KILN_FAIL(KILN_ERROR_WEIGHTS, "%s is corrupt: its bytes do not match their "
                         "checksum (%016llx, expected %016llx)", src->path,
                         (unsigned long long)h, (unsigned long long)d->weights_checksum);
    kiln__weights_stamp_save(m, src->file, d->weights_checksum);
    return KILN_OK;
}

/* The ring: a staging buffer of nslots slots, and each slot's copy in
 * flight (its command buffer and fence). */
typedef struct Ring {
    kiln__buffer staging;
    uint64_t slot_bytes;
    uint32_t nslots;
    VkCommandBuffer cmd[RING_SLOTS];
    VkFence fence[RING_SLOTS];
} Ring;

/* Waits for slot i's copy, if one is in flight, and frees its commands. */
static kiln_status drain_slot(kiln_model *m, Ring *r, uint32_t i) {
    VkDevice vd = m->device->device;
    if (!r->cmd[i])
        return KILN_OK;
    VkResult res = vkWaitForFences(vd, 1, &r->fence[i], VK_TRUE, UINT64_MAX);
    if (res == VK_SUCCESS)
        res = vkResetFences(vd, 1, &r->fence[i]);
    if (res != VK_SUCCESS) { /* the staging is freed next: nothing may read it */
        (void)vkQueueWaitIdle(m->device->queue);
        return kiln__vk_fail(res, __FILE__, __LINE__, "waiting for a weights copy");
    }
    vkFreeCommandBuffers(vd, m->pool, 1, &r->cmd[i]);
    r->cmd[i] = VK_NULL_HANDLE;
    return KILN_OK;
}

/* Copies slot i's first n bytes to offset `to` of the weights buffer. */
static kiln_status send_slot(kiln_model *m, Ring *r, uint32_t i, uint64_t to, uint64_t n) {
    KILN_RETURN_IF_ERROR(kiln__begin_commands(m, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
                                              &r->cmd[i]));
    VkBufferCopy region = {i * r->slot_bytes, to, n};
    vkCmdCopyBuffer(r->cmd[i], r->staging.buffer, m->weights.buffer, 1, &region);
    VkSubmitInfo si;
    memset(&si, 0, sizeof si);
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &r->cmd[i];
    VkResult res = vkEndCommandBuffer(r->cmd[i]);
    if (res == VK_SUCCESS)
        res = vkQueueSubmit(m->device->queue, 1, &si, r->fence[i]);
    if (res != VK_SUCCESS) { /* not in flight: free it now */
        vkFreeCommandBuffers(m->device->device, m->pool, 1, &r->cmd[i]);
        r->cmd[i] = VK_NULL_HANDLE;
        return kiln__vk_fail(res, __FILE__, __LINE__, "submitting a weights copy");
    }
    return KILN_OK;
}

static kiln_status upload(kiln_model *m, Source *src, Ring *r) {
    const kiln_model_desc *d = m->desc;
    kiln_device *dev = m->device;
    r->slot_bytes = d->weight_bytes < RING_CHUNK ? d->weight_bytes : RING_CHUNK;
    uint64_t chunks = (d->weight_bytes + r->slot_bytes - 1) / r->slot_bytes;
    r->nslots = chunks < RING_SLOTS ? (uint32_t)chunks : RING_SLOTS;
    KILN_RETURN_IF_ERROR(kiln__buffer_create(dev, r->slot_bytes * r->nslots,
                                             VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                             KILN__MEMORY_STAGING, &r->staging));
    if (src->file && !src->map && !src->trusted && !r->staging.host_cached) {
        src->bounce = (unsigned char *)kiln__calloc(m->host, 1, (size_t)r->slot_bytes);
        if (!src->bounce)
            return KILN_FAIL(KILN_ERROR_OUT_OF_HOST_MEMORY, "allocating %llu bytes",
                             (unsigned long long)r->slot_bytes);
    }
    VkFenceCreateInfo fi;
    memset(&fi, 0, sizeof fi);
    fi.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    for (uint32_t i = 0; i < r->nslots; i++)
        KILN_VK_RETURN(vkCreateFence(dev->device, &fi, dev->vk_alloc, &r->fence[i]));
    for (uint64_t c = 0; c < chunks; c++) {
        uint32_t i = (uint32_t)(c % r->nslots);
        uint64_t at = c * r->slot_bytes;
        uint64_t n = d->weight_bytes - at < r->slot_bytes ? d->weight_bytes - at
                                                          : r->slot_bytes;
        KILN_RETURN_IF_ERROR(drain_slot(m, r, i));
        KILN_RETURN_IF_ERROR(fill(src, d, (unsigned char *)r->staging.mapped +
                                              i * r->slot_bytes, (size_t)n));
        KILN_RETURN_IF_ERROR(send_slot(m, r, i, at, n));
    }
    return finish(m, src);
}

kiln_status kiln__upload_weights(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    if (d->weight_bytes == 0)
        return KILN_OK;
    Source src;
    memset(&src, 0, sizeof src);
    src.mem = (const unsigned char *)d->weights;
    kiln_status s = src.mem ? KILN_OK : open_sidecar(m->weights_path, d, &src);
    if (s == KILN_OK && src.file)
        src.trusted = kiln__weights_stamp_matches(m, src.file, d->weights_checksum);
    Ring r;
    memset(&r, 0, sizeof r);
    if (s == KILN_OK)
        s = upload(m, &src, &r);
    for (uint32_t i = 0; i < r.nslots; i++) { /* every copy done before the staging goes */
        kiln_status w = drain_slot(m, &r, i);
        if (s == KILN_OK)
            s = w;
        if (r.fence[i])
            vkDestroyFence(m->device->device, r.fence[i], m->device->vk_alloc);
    }
    kiln__buffer_destroy(m->device, &r.staging);
    kiln__free(m->host, src.bounce);
    if (src.map)
        munmap((void *)(uintptr_t)src.map, src.map_bytes);
    if (src.file)
        fclose(src.file);
    return s;
}
