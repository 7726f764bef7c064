/*
 * alloc.c: the runtime's host allocations, and fault injection.
 *
 * Every host allocation of the runtime goes through kiln__calloc and
 * kiln__free. A build with -DKILN_FAULT_INJECTION (make fault-test) also
 * counts them and every Vulkan call that returns a VkResult (internal.h
 * wraps those calls), and can make the Nth of either fail: that is how the
 * tests prove that each failure path returns a status, leaks nothing and
 * leaves destroy working.
 */
#include "internal.h"

#include <stdlib.h>

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

void *kiln__calloc(size_t n, size_t size) {
    if (++counts.allocs == fail_alloc_at) {
        counts.allocs--; /* nothing to free */
        return NULL;
    }
    return calloc(n ? n : 1, size ? size : 1);
}

void kiln__free(void *p) {
    if (p)
        counts.frees++;
    free(p);
}

#else

void *kiln__calloc(size_t n, size_t size) { return calloc(n ? n : 1, size ? size : 1); }

void kiln__free(void *p) { free(p); }

#endif
