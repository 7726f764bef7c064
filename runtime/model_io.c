/*
 * model_io.c: where inputs and outputs live. Each has bytes in the arena
 * (where the compiler planned it) and in the mapped staging buffer; direct
 * I/O (kiln__choose_direct_io) lets the dispatches reach small ones in
 * staging itself, so that a run copies none of them on the device.
 */
#include "internal.h"

/* The largest input and output the dispatches reach in the staging buffer
 * (direct I/O). A kernel may read an input many times (a matmul's A once
 * per column tile), and on a discrete GPU every read of staging memory
 * crosses the bus, so inputs stay small. Outputs too: a kernel's stores
 * cross the bus slower than the copy would, and a product's tiles (each
 * invocation's 4 x 4 blocks, narrow strided stores) far slower. On an
 * H100 (2026-12-07) an f16 softmax [2364, 197] writing its 931 KB output
 * in staging took 21.5 us of GPU time against 6.1 into the arena, a run
 * 89.5 us against 62.4 with the copy; a batch of [192, 49, 49] x [49, 32]
 * f16 products 566 us against 9.1. At 64 KiB the copy's fixed cost (a
 * command and its barriers, 3-5 us) and the stores' are about even. */
#define DIRECT_INPUT_MAX (64u << 10)
#define DIRECT_OUTPUT_MAX (64u << 10)

/* The arena or the weight buffer (KILN_BUFFER_*). */
const kiln__buffer *kiln__buffer_of(const kiln_model *m, uint32_t which) {
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
const kiln__buffer *kiln__locate(const kiln_model *m, uint32_t which, uint64_t begin,
                                  uint64_t end, int64_t *shift) {
    const struct direct_range *r = direct_of(m, which, begin, end);
    *shift = r ? (int64_t)(r->io - r->begin) : 0;
    return r ? &m->io : kiln__buffer_of(m, which);
}

/* Input i, or output i - input_count for i past the inputs: the order in
 * which direct I/O walks them (kind 0 for an input, 1 an output). */
const kiln_tensor_info *kiln__io_tensor(const kiln_model_desc *d, uint32_t i) {
    return i < d->input_count ? &d->inputs[i] : &d->outputs[i - d->input_count];
}

/* Whether the dispatches reach input or output t in staging itself. */
int kiln__is_direct(const kiln_model *m, const kiln_tensor_info *t) {
    return direct_of(m, t->buffer, t->offset, t->offset + t->bytes) != NULL;
}

static int ranges_meet(uint64_t a, uint64_t a_end, uint64_t b, uint64_t b_end) {
    return a < b_end && b < a_end;
}

/* Whether kiln__io_tensor(d, which), at arena bytes [begin, end), can be
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
        const kiln_tensor_info *t = kiln__io_tensor(d, i);
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

/* Picks the direct inputs and outputs (none with KILN_MODEL_STAGED_IO or
 * KILN_STAGED_IO=1, or a staging buffer kernels cannot address): those
 * within the size limits whose arena offset keeps the 16-byte alignment the
 * compiler planned with. (A guarded model's staging gaps, which then hold
 * no tensor, are found by model.c: kiln__find_staging_gaps.) */
kiln_status kiln__choose_direct_io(kiln_model *m, int staged) {
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
        const kiln_tensor_info *t = kiln__io_tensor(d, i);
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
    return KILN_OK;
}

void *kiln_model_input_memory(kiln_model *m, uint32_t i) {
    if (!m || i >= m->desc->input_count)
        return NULL;
    return (char *)m->io.mapped + m->desc->inputs[i].io_offset;
}

const void *kiln_model_output_memory(const kiln_model *m, uint32_t i) {
    if (!m || i >= m->desc->output_count)
        return NULL;
    return (const char *)m->io.mapped + m->desc->outputs[i].io_offset;
}

int kiln_model_io_direct(const kiln_model *m, int output, uint32_t i) {
    if (!m || i >= (output ? m->desc->output_count : m->desc->input_count))
        return 0;
    const kiln_tensor_info *t = output ? &m->desc->outputs[i] : &m->desc->inputs[i];
    return t->bytes && kiln__is_direct(m, t); /* chosen ones have bytes */
}
