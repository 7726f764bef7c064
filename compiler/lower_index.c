/*
 * lower_index.c: gather, gather_nd, gather_elements, one_hot, trilu, pad (index.comp)
 * and scatter (scatter.comp), and gather's gradient.
 */
#include "lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* --guard: a dispatch that reads indices computed at run time reports the
 * first it finds outside its axis (INDEX_CHECK in index.comp and
 * scatter.comp) into 16 bytes of its own, which the planner makes a guard
 * entry and the runtime turns into an error naming the node. Constant
 * indices were checked at compile time (check_const_indices). */
static void index_report(Program *p, Node *n, Dispatch *d, const Tensor *idx, int axis,
                         const Tensor *x, const Tensor *y) { /* axis -1: gather_nd's tuples */
    /* A dispatch that runs the largest shape of dynamic indices reads the
     * don't-care elements past a run's extent too (dynamic.c): no report.
     * One whose count follows its prefix-layout output (y; NULL: a fixed
     * count) reads only the run's. */
    bool past_extent = idx->dyn_axes && !(y && y->dynamic && idx->dynamic);
    if (!p->guard || idx->kind == T_WEIGHT || past_extent)
        return;
    Tensor *r = scratch(p, n, "index_report", 1, (int64_t[]){4});
    r->dtype = KILN_DTYPE_I32;
    r->index_report = axis < 0 ? format("node '%s' (%s): '%s' into '%s'", n->name,
                                        op_info[n->op].name, idx->name, x->name)
                               : format("node '%s' (%s): '%s' into axis %d of '%s'", n->name,
                                        op_info[n->op].name, idx->name, axis, x->name);
    define_int(d, "INDEX_CHECK", 1);
    dispatch_arg(d, r, true);
}

/* A dispatch of index.comp writing y from x (and idx, when not NULL). */
Dispatch *index_dispatch(Program *p, Node *n, const char *mode, Tensor *y,
                         Tensor *x, Tensor *idx) {
    int64_t count = tensor_count(y);
    if (count == 0)
        return NULL;
    Dispatch *d = new_dispatch(p, n, "index");
    bool need[3] = {false, false, false};
    need_dtype(p, need, y->dtype);
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    define_str(d, "COUNT", dyn_count(dyn_of(y), count));
    define_str(d, "MODE", mode);
    define_str(d, "TDATA", buffer_type(y->dtype, false));
    define_str(d, "TDATA_R", buffer_type(x->dtype, true));
    define_str(d, "CONV(x)", store_conversion(y->dtype));
    if (idx) {
        need_dtype(p, need, idx->dtype);
        define_str(d, "TIDX", buffer_type(idx->dtype, true));
    }
    define_needs(d, need);
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    if (idx)
        dispatch_arg(d, idx, false);
    else
        dispatch_unused(d, x);
    d->groups[0] = groups_for(count, d->local_size);
    dyn_groups(d, 0, dyn_of(y), count, d->local_size);
    return d;
}

/* A gather of one constant index along an axis that only axes of 1
 * precede takes a contiguous block of x: a view at its offset, no dispatch
 * (timm's and torchvision's attention take q, k and v so, qkv[0], qkv[1],
 * qkv[2] of [3, B, heads, S, d]); block_view's conditions. */
static bool gather_view(Node *n, Tensor *x, Tensor *idx, int axis) {
    Tensor *y = n->outputs[0];
    if (n->op != OP_GATHER || idx->kind != T_WEIGHT || !idx->data || tensor_count(idx) != 1 ||
        shape_count(axis, x->shape) != 1)
        return false;
    int64_t v = index_value(idx, 0);
    if (v < 0)
        v += x->shape[axis];
    if (v < 0 || v >= x->shape[axis]) /* refused by the shape rule; never here */
        return false;
    /* y's axes are x's with `axis` (before it only 1s) replaced by idx's */
    Operand in = {x, {0}, v * shape_count(x->rank - axis - 1, x->shape + axis + 1), false,
                  {0, {0}}};
    contiguous_strides(y->rank, y->shape, in.strides);
    return block_view(x, y, &in);
}

void lower_gather(Program *p, Node *n) {
    bool emb = n->op == OP_EMBEDDING;
    Tensor *x = n->inputs[emb ? 1 : 0], *idx = n->inputs[emb ? 0 : 1];
    int axis = emb ? 0 : (int)attr_int(n, "axis");
    if (axis < 0)
        axis += x->rank;
    if (gather_view(n, x, idx, axis))
        return;
    Dispatch *d = index_dispatch(p, n, "MODE_GATHER", n->outputs[0], x, idx);
    if (!d)
        return;
    index_report(p, n, d, idx, axis, x, n->outputs[0]);
    define_int(d, "OUTER", shape_count(axis, x->shape));
    define_int(d, "NIDX", tensor_count(idx));
    define_int(d, "AXIS_LEN", x->shape[axis]);
    define_int(d, "INNER", shape_count(x->rank - axis - 1, x->shape + axis + 1));
}

/* gather_nd: y[t, e] = x[row(t), e], x seen as [rows, REST] (its first
 * batch_dims + k axes the rows), row(t) the batch's first row plus tuple
 * t's indices times the rows' strides (index.comp, MODE_GATHER_ND). */
void lower_gather_nd(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1];
    int64_t b = attr_int(n, "batch_dims"), k = idx->shape[idx->rank - 1];
    Dispatch *d = index_dispatch(p, n, "MODE_GATHER_ND", n->outputs[0], x, idx);
    if (!d)
        return;
    index_report(p, n, d, idx, -1, x, n->outputs[0]); /* a tuple's axes */
    int64_t tuples = tensor_count(idx) / k;
    int64_t batches = shape_count((int)b, x->shape);
    define_int(d, "TUPLE", k);
    define_list(d, "TDIMS", (int)k, x->shape + b);
    define_int(d, "REST", shape_count(x->rank - (int)(b + k), x->shape + b + k));
    define_int(d, "BATCH_ROWS", shape_count((int)k, x->shape + b));
    define_int(d, "BATCH_TUPLES", batches ? tuples / batches : 1);
}

int attr_axis(Node *n, int rank) {
    int64_t axis = attr_int(n, "axis");
    return (int)(axis < 0 ? axis + rank : axis);
}

void lower_gather_elements(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1];
    Dispatch *d = index_dispatch(p, n, "MODE_GATHER_ELEMENTS", n->outputs[0], x, idx);
    if (!d)
        return;
    int64_t xs[MAX_RANK];
    contiguous_strides(x->rank, x->shape, xs);
    int axis = attr_axis(n, x->rank);
    index_report(p, n, d, idx, axis, x, n->outputs[0]);
    define_int(d, "RANK", x->rank);
    define_list(d, "SHAPE", idx->rank, idx->shape);
    define_list(d, "XSTRIDES", x->rank, xs);
    define_int(d, "AXIS", axis);
    define_int(d, "AXIS_LEN", x->shape[axis]);
}

void lower_one_hot(Program *p, Node *n) {
    Tensor *y = n->outputs[0], *idx = n->inputs[0];
    int axis = attr_axis(n, y->rank);
    Dispatch *d = index_dispatch(p, n, "MODE_ONE_HOT", y, idx, idx);
    if (!d)
        return;
    define_int(d, "DEPTH", y->shape[axis]);
    define_int(d, "INNER", shape_count(y->rank - axis - 1, y->shape + axis + 1));
    define_float(d, "ON", attr_float(n, "on_value"));
    define_float(d, "OFF", attr_float(n, "off_value"));
}

/* range: out[i] = start + i * delta, integers (start may follow the dims),
 * stored as the output's dtype; its size follows the dims where it does. */
void lower_range(Program *p, Node *n) {
    Tensor *out = n->outputs[0];
    DimExpr start = attr_dims(n, "start");
    bool wide = out->dtype == KILN_DTYPE_I64;
    const char *ct = wide ? "int64_t" : "int";
    char *expr = format("%s(%s) + %s(i) * %s(%lld)", ct, dim_expr_glsl(&start, 1), ct, ct,
                        (long long)attr_int(n, "delta"));
    eltwise_dispatch(p, n, 1, out->shape, whole(out), 0, NULL, ct, expr, dyn_of(out));
}

void lower_trilu(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    Dispatch *d = index_dispatch(p, n, "MODE_TRILU", n->outputs[0], x, NULL);
    if (!d)
        return;
    define_int(d, "ROWS_", x->shape[x->rank - 2]);
    define_int(d, "COLS_", x->shape[x->rank - 1]);
    define_int(d, "UPPER", attr_int(n, "upper") != 0);
    define_int(d, "K", attr_int(n, "k"));
}

void lower_pad(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *y = n->outputs[0];
    int64_t pads[2 * MAX_RANK], xs[MAX_RANK];
    attr_ints(n, "pads", pads, 2 * MAX_RANK);
    /* no padding (Swin pads its feature maps to whole windows, which at
     * 224 x 224 they already are): y is x's bytes, no copy */
    bool none = true;
    for (int i = 0; i < 2 * x->rank; i++)
        none &= pads[i] == 0;
    Operand all = whole(x);
    if (none && block_view(x, y, &all))
        return;
    Dispatch *d = index_dispatch(p, n, "MODE_PAD", y, x, NULL);
    if (!d)
        return;
    contiguous_strides(x->rank, x->shape, xs);
    Str begin = {0};
    for (int i = 0; i < x->rank; i++)
        str_addf(&begin, "%s%lld", i ? ", " : "", (long long)pads[i]);
    define_int(d, "RANK", x->rank ? x->rank : 1);
    define_list(d, "SHAPE", y->rank ? y->rank : 1, y->rank ? y->shape : (int64_t[]){1});
    define_list(d, "XSHAPE", x->rank ? x->rank : 1, x->rank ? x->shape : (int64_t[]){1});
    define_list(d, "XSTRIDES", x->rank ? x->rank : 1, x->rank ? xs : (int64_t[]){0});
    define_str(d, "BEGIN", begin.buf ? begin.buf : "0");
    define_int(d, "PAD_MODE", pad_mode(n));
    define_float(d, "VALUE", attr_float(n, "value"));
}

/* scatter: a copy of the data into y, then (after a barrier the scheduler
 * places) every update combined into its place. */
/* scatter.comp: y (filled before) combined with each element of upd (of
 * `shape`, `rank` axes) at its coordinates with axis `axis` replaced by its
 * index; y's element strides ys. Returns the dispatch for more defines. */
Dispatch *scatter_dispatch(Program *p, Node *n, Tensor *y, Tensor *idx, Tensor *upd,
                           int rank, const int64_t *shape, const int64_t *ys,
                           int axis, int64_t axis_len, int reduce) {
    int64_t count = shape_count(rank, shape);
    Dispatch *d = new_dispatch(p, n, "scatter");
    bool need[3] = {false, false, false};
    need_dtype(p, need, idx->dtype);
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    define_int(d, "COUNT", count);
    define_int(d, "RANK", rank);
    define_list(d, "SHAPE", rank, shape);
    define_list(d, "YSTRIDES", rank, ys);
    define_int(d, "AXIS", axis);
    define_int(d, "AXIS_LEN", axis_len);
    define_int(d, "REDUCE", reduce);
    define_str(d, "TIDX", buffer_type(idx->dtype, true));
    define_needs(d, need);
    dispatch_arg(d, y, true);
    dispatch_arg(d, idx, false);
    dispatch_arg(d, upd, false);
    index_report(p, n, d, idx, axis, y, NULL);
    d->groups[0] = groups_for(count, d->local_size);
    return d;
}

void lower_scatter(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1], *u = n->inputs[2], *y = n->outputs[0];
    copy(p, n, x->rank, x->shape, whole(y), whole(x), NULL);
    int64_t count = tensor_count(u);
    if (count == 0)
        return;
    int64_t ys[MAX_RANK];
    contiguous_strides(y->rank, y->shape, ys);
    int axis = attr_axis(n, x->rank);
    scatter_dispatch(p, n, y, idx, u, u->rank, u->shape, ys, axis, x->shape[axis],
                     scatter_reduction(n));
}


/* gather_grad: zeros, then each element of dy added (atomically) into the
 * row its index names: scatter.comp over dy viewed as [outer, nidx, inner]. */
void lower_gather_grad(Program *p, Node *n) {
    Tensor *dy = n->inputs[0], *idx = n->inputs[1], *y = n->outputs[0];
    int axis = (int)attr_int(n, "axis");
    if (axis < 0)
        axis += y->rank;
    Operand zero = whole(dy);
    memset(zero.strides, 0, sizeof zero.strides);
    eltwise_dispatch(p, n, y->rank, y->shape, whole(y), 1, &zero, "float", "0.0", NULL);
    int64_t count = tensor_count(dy);
    if (count == 0)
        return;
    int64_t outer = shape_count(axis, y->shape), nidx = tensor_count(idx);
    int64_t inner = shape_count(y->rank - axis - 1, y->shape + axis + 1), size = y->shape[axis];
    Dispatch *d = scatter_dispatch(p, n, y, idx, dy, 3, (int64_t[]){outer, nidx, inner},
                                   (int64_t[]){size * inner, inner, 1}, 1, size, 1);
    define_str(d, "IDX_AT(o)", format("(((o) / %lldu) %% %lldu)", (long long)inner,
                                      (long long)nidx));
    d->flops = (uint64_t)count;
}
