/*
 * prefetch.c: a prefetch of a matrix-vector product's weights into the
 * GPU's last-level cache, run beside the work before the product
 * (KILN_PREFETCH=MiB, off unless set; for measurement, bench/experiments/
 * prefetch.py).
 *
 * A decoding step is a chain of products each of which reads its weights
 * once, with a barrier between every two: each starts with the memory
 * idle (its workgroups launching, the first loads in flight) and ends
 * with it idle again (the last workgroups' sums, a norm's last workgroup),
 * and attention between them reads a few kilobytes for microseconds. A
 * one-row product of 8 MiB of f16 weights (a 1.1B Llama's output
 * projection) took 8.2 us on an H100 where the copy kernel would move its
 * bytes in 2.8 (bench/experiments/prefetch-h100.txt). The prefetch
 * (shaders/prefetch.comp) reads the first KILN_PREFETCH MiB of the
 * product's weights and writes nothing; placed before the product's first
 * dispatch with no barrier (Dispatch.prefetch, KILN_BARRIER_PREFETCH), it
 * runs between the same barriers as the dispatches before it, so the
 * product then finds those bytes in the cache.
 *
 * Which products: those on matvec_k.comp whose B is a weight, at a fixed
 * shape or the variant for runs of one row (a decoding step's); the
 * prefetch then runs exactly when that variant does (the same dynamic
 * work and range, at most as many workgroups).
 */
#include "kiln.h"

#include <stdlib.h>
#include <string.h>

/* The prefetch of p's weights b (at most cap bytes) for product d. */
static Dispatch *prefetch_of(Program *p, const Dispatch *d, Tensor *b, uint64_t off,
                             uint64_t cap) {
    uint64_t bytes = tensor_bytes(b) - off;
    bytes = (bytes < cap ? bytes : cap) / 16 * 16;
    if (bytes < 16 * 256)
        return NULL;
    Dispatch *f = new_dispatch(p, d->node, "prefetch");
    f->label = format("%s (prefetch)", d->label);
    f->local_size = 256;
    define_int(f, "BYTES", (int64_t)bytes);
    dispatch_arg(f, b, false);
    f->arg_offset[0] = off;
    f->arg_begin[0] = off;
    f->arg_end[0] = off + bytes;
    /* four loads an invocation, at most as many workgroups as the product */
    uint64_t groups = (bytes / 16 + 4 * 256 - 1) / (4 * 256);
    f->groups[0] = (uint32_t)(groups < d->groups[0] ? groups : d->groups[0]);
    f->prefetch = true;
    if (d->dynamic) {
        f->dynamic = true;
        f->dyn_axis = 0;
        f->work = d->work;
        f->scale = d->scale;
        f->per_group = d->per_group;
        f->work_min = d->work_min;
        f->work_max = d->work_max;
    }
    return f;
}

/* The cap in bytes from KILN_PREFETCH (MiB), 0 when unset or 0. */
static uint64_t prefetch_cap(void) {
    const char *v = getenv("KILN_PREFETCH");
    if (!v || !*v)
        return 0;
    char *end;
    double mib = strtod(v, &end);
    if (*end || !(mib >= 0) || mib > 65536)
        fatal("KILN_PREFETCH=%s: expected MiB of weights to prefetch, 0 to 65536", v);
    return (uint64_t)(mib * 1048576.0);
}

void add_prefetches(Program *p) {
    uint64_t cap = prefetch_cap();
    if (!cap)
        return;
    int n = p->ndispatches;
    Dispatch **old = xcalloc((size_t)n + 1, sizeof *old);
    memcpy(old, p->dispatches, sizeof *old * (size_t)n);
    Dispatch **made = xcalloc((size_t)n + 1, sizeof *made);
    for (int i = 0; i < n; i++) {
        Dispatch *d = old[i];
        if (strcmp(d->family, "matvec_k") != 0 || (d->dynamic && !d->one_row) ||
            d->nargs < 3 || tensor_root(d->args[2])->kind != T_WEIGHT)
            continue;
        made[i] = prefetch_of(p, d, d->args[2], d->arg_offset[2], cap);
    }
    /* each before the first dispatch of its product's node */
    Dispatch **order = xcalloc((size_t)p->ndispatches, sizeof *order);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (i == 0 || old[i - 1]->node != old[i]->node)
            for (int j = i; j < n && old[j]->node == old[i]->node; j++)
                if (made[j])
                    order[k++] = made[j];
        order[k++] = old[i];
    }
    memcpy(p->dispatches, order, sizeof *order * (size_t)k);
    p->ndispatches = k;
    xfree(order);
    xfree(made);
    xfree(old);
}
