/*
 * model_dims.c: dynamic dimensions. A model compiled for the largest
 * extents runs at any values within their ranges without re-recording
 * (the dims derived from them, a product or quotient the shapes need,
 * follow the given values):
 * kiln__write_dims puts the values and each dynamic dispatch's workgroup
 * counts into staging, the recorded copy takes them to the arena, kernels
 * read the values there and vkCmdDispatchIndirect the counts.
 */
#include "internal.h"

#include <string.h>

int64_t kiln__eval_extent(const kiln_extent *e, const int64_t *dims) {
    int64_t v = e->c0;
    for (int i = 0; i < KILN_MAX_DIMS; i++)
        v += e->c[i] * dims[i];
    return v;
}

/* The dynamic-dimension tables: counts, ranges and offsets that fit. */
kiln_status kiln__check_dims(const kiln_model_desc *d) {
    if (d->dim_count > KILN_MAX_DIMS || (d->dim_count && !d->dims))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s has a malformed dims table",
                         d->name);
    for (uint32_t i = 0; i < d->dim_count; i++)
        if (d->dims[i].min < 0 || d->dims[i].max < d->dims[i].min ||
            d->dims[i].max > 0x7fffffff)
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: dim %u has the range "
                             "%lld..%lld", d->name, i, (long long)d->dims[i].min,
                             (long long)d->dims[i].max);
    if (d->derived_count > KILN_MAX_DIMS - d->dim_count || (d->derived_count && !d->derived))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s has a malformed table of "
                         "derived dims", d->name);
    for (uint32_t i = 0; i < d->derived_count; i++) { /* ops known, over the dims before */
        const kiln_derived_dim *x = &d->derived[i];
        int ok = x->op >= KILN_DIM_MUL && x->op <= KILN_DIM_MIN;
        for (uint32_t j = d->dim_count + i; j < KILN_MAX_DIMS; j++)
            ok = ok && !x->a.c[j] && !x->b.c[j];
        if (!ok)
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: derived dim %u is "
                             "malformed", d->name, i);
    }
    uint32_t dynamic = 0;
    for (uint32_t i = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        if (x->dyn_axis > KILN_AXIS_FIXED || (x->dyn_axis != KILN_AXIS_FIXED && x->per_group == 0))
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "dispatch %u (%s) is malformed",
                             i, x->node ? x->node : "?");
        dynamic += x->dyn_axis != KILN_AXIS_FIXED;
    }
    if ((d->state_count && !d->states) || (d->state_copy_count && !d->state_copies))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: malformed state tables",
                         d->name);
    for (uint32_t i = 0; i < d->state_count; i++)
        if (d->states[i].offset + d->states[i].bytes > d->arena_bytes)
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: state %u lies outside "
                             "the arena", d->name, i);
    for (uint32_t i = 0; i < d->state_copy_count; i++) {
        const kiln_state_copy *c = &d->state_copies[i];
        if (c->src + c->bytes > d->arena_bytes || c->dst + c->bytes > d->arena_bytes)
            return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: state copy %u lies "
                             "outside the arena", d->name, i);
    }
    if (dynamic != d->indirect_count ||
        (d->dim_count && (d->dims_offset + KILN__DIMS_BYTES > d->arena_bytes ||
                          d->dims_io_offset + KILN__DIMS_BYTES > d->io_bytes)) ||
        (dynamic && (d->indirect_offset + KILN__INDIRECT_BYTES * dynamic > d->arena_bytes ||
                     d->indirect_io_offset + KILN__INDIRECT_BYTES * dynamic > d->io_bytes)))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s: malformed dynamic tables",
                         d->name);
    return KILN_OK;
}

/* The derived dims from the given ones (and those derived before). */
static void derive_dims(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    for (uint32_t i = 0; i < d->derived_count; i++) {
        const kiln_derived_dim *x = &d->derived[i];
        int64_t a = kiln__eval_extent(&x->a, m->dims), b = kiln__eval_extent(&x->b, m->dims);
        int64_t v = x->op == KILN_DIM_MUL ? a * b
                    : x->op == KILN_DIM_DIV ? (b < 1 ? 0 : a >= 0 ? a / b : -((-a + b - 1) / b))
                    : x->op == KILN_DIM_MAX ? (a > b ? a : b)
                                            : (a < b ? a : b);
        m->dims[d->dim_count + i] = v;
    }
}

/* The bytes of t, from its start, that hold a run's elements at the
 * current dims in the largest shape's layout (row-major strides of
 * t->shape), rounded up to a power of two from KILN__SPAN_MIN, the whole
 * tensor at most: a run copies those between staging and the arena, not
 * the whole tensor (a decoder's logits at one token, not at the longest
 * prompt). The rounding keeps the recordings few (kiln__recording) where a
 * span follows a dim that changes every run (a growing attention mask). */
#define KILN__SPAN_MIN 65536u
static uint64_t run_span(const kiln_model *m, const kiln_tensor_info *t) {
    uint32_t rank = t->rank < KILN_MAX_RANK ? t->rank : KILN_MAX_RANK;
    int64_t run[KILN_MAX_RANK], count = 1, last = 0, stride = 1;
    for (uint32_t i = 0; i < rank; i++)
        count *= t->shape[i];
    if (!t->dyn_axes || count <= 0)
        return t->bytes;
    kiln_model_tensor_shape(m, t, run);
    for (uint32_t i = rank; i-- > 0;) { /* the last element's index */
        if (run[i] <= 0)
            return 0;
        last += (run[i] - 1) * stride;
        stride *= t->shape[i];
    }
    uint64_t bytes = t->bytes / (uint64_t)count * (uint64_t)(last + 1), span = KILN__SPAN_MIN;
    while (span < bytes)
        span *= 2;
    return span < t->bytes ? span : t->bytes;
}

/* Writes the dims and every dynamic dispatch's workgroup counts into
 * staging, where the next submit's copies pick them up, marks the
 * dispatches they leave idle (m->idle, m->idle_count) and sets the I/O
 * copies' sizes (m->spans). */
void kiln__write_dims(kiln_model *m) {
    const kiln_model_desc *d = m->desc;
    if (!d->dim_count)
        return;
    derive_dims(m);
    int32_t v[KILN_MAX_DIMS];
    for (int i = 0; i < KILN_MAX_DIMS; i++)
        v[i] = (int32_t)m->dims[i];
    memcpy((char *)m->io.mapped + d->dims_io_offset, v, sizeof v);
    m->spans_short = 0;
    for (uint32_t i = 0; m->spans && i < d->input_count + d->output_count; i++) {
        const kiln_tensor_info *t = kiln__io_tensor(d, i);
        m->spans[i] = run_span(m, t);
        m->spans_short |= m->spans[i] < t->bytes;
    }
    uint32_t *cmd = (uint32_t *)(void *)((char *)m->io.mapped + d->indirect_io_offset);
    m->idle_count = 0;
    for (uint32_t i = 0, k = 0; i < d->dispatch_count; i++) {
        const kiln_dispatch *x = &d->dispatches[i];
        if (x->dyn_axis == KILN_AXIS_FIXED)
            continue;
        uint32_t g[3] = {x->groups[0], x->groups[1], x->groups[2]};
        int64_t w = kiln__eval_extent(&x->work, m->dims) * (int64_t)x->scale;
        if (w < 0 || (uint64_t)w < x->work_min || (uint64_t)w > x->work_max) {
            g[x->dyn_axis] = 0;
        } else {
            uint64_t need = ((uint64_t)w + x->per_group - 1) / x->per_group;
            if (need < g[x->dyn_axis])
                g[x->dyn_axis] = (uint32_t)need;
        }
        memcpy(cmd + 3 * k++, g, sizeof g);
        if (m->idle) {
            m->idle[i] = g[x->dyn_axis] == 0;
            m->idle_count += m->idle[i];
        }
    }
}

kiln_status kiln_model_set_dims(kiln_model *m, const int64_t *values, uint32_t count) {
    if (!m || (count && !values))
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model or values is NULL");
    const kiln_model_desc *d = m->desc;
    if (count != d->dim_count)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s has %u dynamic dimensions, "
                         "not %u", d->name, d->dim_count, count);
    for (uint32_t i = 0; i < count; i++)
        if (values[i] < d->dims[i].min || values[i] > d->dims[i].max)
            return KILN_FAIL(KILN_ERROR_OUT_OF_RANGE, "model %s: %s = %lld is outside its "
                             "range %lld..%lld", d->name, d->dims[i].name,
                             (long long)values[i], (long long)d->dims[i].min,
                             (long long)d->dims[i].max);
    for (uint32_t i = 0; i < count; i++)
        m->dims[i] = values[i];
    kiln__write_dims(m);
    return KILN_OK;
}

kiln_status kiln_model_set_dim(kiln_model *m, const char *name, int64_t value) {
    if (!m || !name)
        return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model or name is NULL");
    const kiln_model_desc *d = m->desc;
    int64_t v[KILN_MAX_DIMS];
    memcpy(v, m->dims, sizeof v);
    for (uint32_t i = 0; i < d->dim_count; i++) {
        if (strcmp(d->dims[i].name, name) == 0) {
            v[i] = value;
            return kiln_model_set_dims(m, v, d->dim_count);
        }
    }
    return KILN_FAIL(KILN_ERROR_INVALID_ARGUMENT, "model %s has no dynamic dimension '%s'",
                     d->name, name);
}

void kiln_model_tensor_shape(const kiln_model *m, const kiln_tensor_info *t,
                             int64_t *shape) {
    if (!t || !shape)
        return;
    for (uint32_t i = 0; i < t->rank && i < KILN_MAX_RANK; i++) {
        shape[i] = t->shape[i];
        if (m && t->extents && (t->dyn_axes >> i) & 1u) {
            int64_t e = kiln__eval_extent(&t->extents[i], m->dims);
            if (e >= 0 && e <= t->shape[i]) /* always, within the dims' ranges */
                shape[i] = e;
        }
    }
}

uint64_t kiln_model_tensor_bytes(const kiln_model *m, const kiln_tensor_info *t) {
    if (!t)
        return 0;
    int64_t shape[KILN_MAX_RANK], largest = 1, now = 1;
    kiln_model_tensor_shape(m, t, shape);
    for (uint32_t i = 0; i < t->rank && i < KILN_MAX_RANK; i++) {
        largest *= t->shape[i];
        now *= shape[i];
    }
    return largest > 0 ? t->bytes / (uint64_t)largest * (uint64_t)now : t->bytes;
}

void kiln__copy_extent(const kiln_model *m, const kiln_tensor_info *t, void *dst,
                       const void *src, int to_stored) {
    int64_t run[KILN_MAX_RANK], count = 1;
    uint32_t rank = t->rank < KILN_MAX_RANK ? t->rank : KILN_MAX_RANK;
    kiln_model_tensor_shape(m, t, run);
    for (uint32_t i = 0; i < rank; i++)
        count *= t->shape[i];
    /* Axis a, the innermost whose run size is short of the largest: below
     * it a run's elements are one block in both layouts. */
    int a = (int)rank - 1;
    while (a >= 0 && run[a] == t->shape[a])
        a--;
    if (a < 0 || count <= 0) {
        memcpy(dst, src, (size_t)kiln_model_tensor_bytes(m, t));
        return;
    }
    uint64_t stride = t->bytes / (uint64_t)count; /* bytes of one step along axis a */
    for (uint32_t i = (uint32_t)a + 1; i < rank; i++)
        stride *= (uint64_t)t->shape[i];
    uint64_t block = stride * (uint64_t)run[a];
    int64_t idx[KILN_MAX_RANK] = {0}, outer = 1;
    for (int i = 0; i < a; i++)
        outer *= run[i];
    for (int64_t k = 0; k < outer && block; k++) {
        uint64_t at = 0; /* the block's place in the largest layout, in slabs */
        for (int i = 0; i < a; i++)
            at = at * (uint64_t)t->shape[i] + (uint64_t)idx[i];
        uint64_t stored = at * (uint64_t)t->shape[a] * stride, packed = (uint64_t)k * block;
        memcpy((char *)dst + (to_stored ? stored : packed),
               (const char *)src + (to_stored ? packed : stored), (size_t)block);
        for (int i = a - 1; i >= 0 && ++idx[i] == run[i]; i--)
            idx[i] = 0;
    }
}
