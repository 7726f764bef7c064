/*
 * alloc.c: the runtime's host allocations, and fault injection.
 *
 * Every host allocation of the runtime goes through kiln__calloc and
 * kiln__free, which use the device's kiln_allocator when the caller gave
 * one. kiln__vk_callbacks turns that allocator into VkAllocationCallbacks,
 * so the driver's allocations for kiln's objects come from it too.
 *
 * A build with -DKILN_FAULT_INJECTION (make fault-test) also counts the
 * runtime's own allocations and every Vulkan call that returns a VkResult
 * (internal.h wraps those calls), and can make the Nth of either fail: that
 * is how the tests prove that each failure path returns a status, leaks
 * nothing and leaves destroy working.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* n zeroed elements of size bytes, never failed on purpose. */
static void *raw_alloc(const kiln_allocator *a, size_t n, size_t size) {
    if (size && n > (size_t)-1 / size)
        return NULL;
    size_t bytes = n * size;
    if (bytes == 0)
        bytes = 1;
    if (a && a->alloc) {
        void *p = a->alloc(a->user, bytes, 16);
        if (p)
            memset(p, 0, bytes);
        return p;
    }
    return calloc(1, bytes);
}

static void raw_free(const kiln_allocator *a, void *p) {
    if (!p)
        return;
    if (a && a->alloc)
        a->free(a->user, p);
    else
        free(p);
}

#ifdef KILN_FAULT_INJECTION

static kiln_fault_counts counts;
static uint64_t fail_alloc_at, fail_vk_at;
VkResult kiln__fault_result;

void kiln_fault_set(uint64_t alloc_n, uint64_t vk_n, int vk_result) {
    counts.allocs = counts.frees = counts.vk_calls = 0;
    fail_alloc_at = alloc_n;
    fail_vk_at = vk_n;
    kiln__fault_result = (VkResult)vk_result;
}

kiln_fault_counts kiln_fault_get(void) { return counts; }

int kiln__fault_vk(void) { return ++counts.vk_calls == fail_vk_at; }

void *kiln__calloc(const kiln_allocator *a, size_t n, size_t size) {
    if (++counts.allocs == fail_alloc_at) {
        counts.allocs--; /* nothing to free */
        return NULL;
    }
    return raw_alloc(a, n, size);
}

void kiln__free(const kiln_allocator *a, void *p) {
    if (p)
        counts.frees++;
    raw_free(a, p);
}

#else

void *kiln__calloc(const kiln_allocator *a, size_t n, size_t size) {
    return raw_alloc(a, n, size);
}

void kiln__free(const kiln_allocator *a, void *p) { raw_free(a, p); }

#endif

/* Vulkan reallocates and gives alignments up to any power of two, while a
 * kiln_allocator has no realloc and no size query: each block therefore
 * carries a header just before the pointer handed out, holding the size
 * asked for and the distance back to what alloc returned. */
typedef struct block_header {
    size_t size;
    size_t offset;
} block_header;

static void *VKAPI_CALL vk_alloc(void *user, size_t size, size_t alignment,
                                 VkSystemAllocationScope scope) {
    const kiln_allocator *a = (const kiln_allocator *)user;
    (void)scope;
    if (alignment < sizeof(block_header))
        alignment = sizeof(block_header);
    if (size == 0 || size > (size_t)-1 - alignment)
        return NULL;
    char *base = (char *)a->alloc(a->user, size + alignment, alignment);
    if (!base)
        return NULL;
    char *p = base + alignment;
    block_header h = {size, alignment};
    memcpy(p - sizeof h, &h, sizeof h);
    return p;
}

static void VKAPI_CALL vk_free(void *user, void *p) {
    const kiln_allocator *a = (const kiln_allocator *)user;
    if (!p)
        return;
    block_header h;
    memcpy(&h, (char *)p - sizeof h, sizeof h);
    a->free(a->user, (char *)p - h.offset);
}

static void *VKAPI_CALL vk_realloc(void *user, void *old, size_t size,
                                   size_t alignment, VkSystemAllocationScope scope) {
    if (!old)
        return vk_alloc(user, size, alignment, scope);
    if (size == 0) {
        vk_free(user, old);
        return NULL;
    }
    void *p = vk_alloc(user, size, alignment, scope);
    if (!p)
        return NULL; /* the old block stays valid, as Vulkan requires */
    block_header h;
    memcpy(&h, (char *)old - sizeof h, sizeof h);
    memcpy(p, old, h.size < size ? h.size : size);
    vk_free(user, old);
    return p;
}

void kiln__vk_callbacks(kiln_allocator *a, VkAllocationCallbacks *out) {
    memset(out, 0, sizeof *out);
    out->pUserData = a;
    out->pfnAllocation = vk_alloc;
    out->pfnReallocation = vk_realloc;
    out->pfnFree = vk_free;
}
