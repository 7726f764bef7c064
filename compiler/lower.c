/*
 * lower.c: each node becomes zero or more dispatches of a shader family.
 *
 * A dispatch names its family (shaders/<family>.comp), the #defines that
 * specialize it (shapes, strides, attributes: everything is a compile-time
 * constant), its workgroup counts, and its arguments: the tensors whose
 * device addresses it receives in push constants, output first. Views
 * (reshape) produce no dispatch: the output aliases its input's bytes.
 *
 * Workgroup counts are capped at 65535 per dimension (the smallest limit
 * Vulkan allows); kernels loop over the rest, so any size runs. A tensor
 * with zero elements produces no dispatch.
 *
 * This file is the driver: the table of lowerings (ops.def names one per
 * op, in lower_<family>.c), the dims and indirect commands of dynamic
 * models, and states. Dispatches are built in lower_dispatch.c; lower.h
 * declares what the lowering files share.
 */
#include "lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef void (*LowerFn)(Program *p, Node *n);
static const LowerFn lowerings[OP_COUNT] = {
#define OP(id, name, mn, mx, flags, attrs, shape, lower, dyn, expr) [OP_##id] = lower,
#include "ops.def"
#undef OP
};

/* Dispatches whose defines read the run's dims get DYN and the address of
 * the dims in push-constant slot DIMS_SLOT (shaders/common.glsl); each
 * dispatch with dynamic groups gets a slot among the indirect commands. */
bool dispatch_reads_dims(const Dispatch *d) {
    return d->defines.buf && strstr(d->defines.buf, "KILN_DIM(");
}

static void bind_dims(Graph *g, Program *p) {
    Loc none = {NULL, 0, 0};
    if (g->ndims) { /* the runtime writes them whether a kernel reads them or not */
        p->dims = graph_tensor(g, "kiln.dims", T_VALUE, none);
        p->dims->dtype = KILN_DTYPE_I32;
        p->dims->rank = 1;
        p->dims->shape[0] = MAX_DIMS;
    }
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        if (!dispatch_reads_dims(d))
            continue;
        if (!p->dims)
            internal_error("dispatch %d reads dims the model does not declare", i);
        define_int(d, "DYN", 1);
        while (d->nargs < DIMS_SLOT)
            dispatch_unused(d, p->dims);
        dispatch_arg(d, p->dims, false);
    }
    for (int i = 0; i < p->ndispatches; i++)
        p->nindirect += p->dispatches[i]->dynamic;
    if (p->nindirect) {
        p->indirect = graph_tensor(g, "kiln.indirect", T_VALUE, none);
        p->indirect->dtype = KILN_DTYPE_I32;
        p->indirect->rank = 1;
        p->indirect->shape[0] = 3 * p->nindirect;
    }
}

/* A state whose update appends to it (update = concat(state, new) along
 * the state's dynamic axis, the outermost larger than 1) is updated in
 * place: the update's bytes are the state's, the state's own piece is not
 * copied, and only the new piece is written, past the state's extent where
 * nothing reads. Other states are copied from their update after the
 * dispatches: by the runtime as bytes, or, dynamic along an inner axis
 * (whose strides differ between the state and a longer update), by a
 * strided copy dispatch after all others (copy_inner_states). */
static void plan_states(Graph *g, Program *p) {
    for (int i = 0; i < g->states.len; i++) {
        Tensor *s = g->states.data[i], *u = s->update;
        if (!u || dyn_inside(s)) /* a cache in the heads' layout, [2, heads, past, d] */
            continue;
        Node *c = u->producer;
        int64_t axis = c && c->op == OP_CONCAT ? attr_int(c, "axis") : -1;
        if (axis < 0 && c && c->op == OP_CONCAT)
            axis += u->rank;
        if (c && c->op == OP_CONCAT && !c->dead && c->inputs[0] == s && s->dynamic &&
            axis == s->dyn_axis && u->dynamic && !u->alias) {
            u->alias = s;
            continue;
        }
        p->state_copies = xrealloc(p->state_copies,
                                   sizeof(Tensor *) * (size_t)(p->nstate_copies + 1));
        p->state_copies[p->nstate_copies++] = s;
    }
}

/* Each state dynamic along an inner axis gets its update's first positions
 * (as many as the state holds at its largest) copied into it by the last
 * dispatch: positions past a run's extent are don't-care in both, and a
 * run's extent past the state's largest is never a next run's (the dims
 * refuse it). */
static void copy_inner_states(Graph *g, Program *p) {
    for (int i = 0; i < g->states.len; i++) {
        Tensor *s = g->states.data[i], *u = s->update;
        if (!u || !dyn_inside(s) || (!u->producer && !g->nodes.len))
            continue;
        Node *n = u->producer ? u->producer : g->nodes.data[g->nodes.len - 1];
        copy(p, n, s->rank, s->shape, whole(s), whole(u), NULL);
    }
}

Program *lower(Graph *g, bool guard) {
    Program *p = xcalloc(1, sizeof *p);
    p->graph = g;
    p->guard = guard; /* index reports (lower_index.c), then the planner's bands */
    plan_states(g, p);
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if (n->dead || n->fused_into)
            continue;
        lowerings[n->op](p, n);
    }
    copy_inner_states(g, p);
    add_prefetches(p);
    bind_dims(g, p);
    return p;
}
