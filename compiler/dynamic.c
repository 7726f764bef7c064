/*
 * dynamic.c: which axes follow the dynamic dimensions.
 *
 * A model may declare dynamic dimensions (`dims: {seq: 1..2048}`) and use
 * them in its inputs' shapes. Shapes are inferred at the largest values
 * (infer_shapes.c: memory is planned for them); this pass then marks, node
 * by node, the axis of each output whose size follows the dims, as an
 * affine expression of them (DimExpr: `seq`, `past + seq`, `4*seq`).
 *
 * Any axis may follow the dims, several per tensor ([1, heads, seq, past +
 * seq] scores). Every tensor is stored at its largest shape, so strides are
 * as compiled; a run's elements past its extents are don't-care. Ops that
 * compute each output element from the elements at the same position (all
 * elementwise ops, broadcasts, transposes, reshapes that keep the axis,
 * gathers, rows over fixed axes, matmul rows and columns) then need nothing
 * at run time: they compute the whole largest shape, and the don't-care
 * elements stay where nothing valid reads them. Ops that read across a
 * dynamic axis follow its extent at run time: softmax over it, a matmul
 * contracting it, a concat along it (the next piece's offset). Ops that
 * would mix a dynamic axis with a fixed size, reduce over it otherwise, or
 * merge it with an outer axis stop here with a located error.
 *
 * The common case stays fast: a tensor whose one dynamic axis is the
 * outermost larger than 1 (`dynamic`, the prefix layout) has a run's
 * elements as a prefix of its bytes, and kernels follow its extent (their
 * work shrinks with it). Elementwise dispatches, rope, attention, the norms,
 * softmax, cumsum and topk also follow one dynamic axis inside (its size
 * read at run time). A state has
 * one dynamic axis, along which it grows (in place in the prefix layout;
 * lower.c copies one dynamic inside from its update); inputs and
 * outputs may be dynamic along any axes, and kiln_model_run copies a run's
 * extent between the caller's contiguous buffers and the largest shape's
 * strides in staging.
 *
 * The dims themselves and their expressions (DimExpr): dynamic_dims.c.
 */
#include "dynamic.h"

#include <stdarg.h>
#include <string.h>

int unused_dim(const Graph *g) {
    for (int d = 0; d < declared_dims(g); d++) {
        bool used = false;
        for (int i = 0; i < g->tensors.len && !used; i++) {
            const Tensor *t = g->tensors.data[i];
            for (int a = 0; a < t->rank && !used; a++)
                used = is_dyn(t, a) && t->ext[a].c[d];
        }
        for (int i = 0; i < g->nodes.len && !used; i++) { /* a range's start or size */
            Node *n = g->nodes.data[i];
            const char *keys[2] = {"start", "size"};
            for (int k = 0; k < 2 && n->op == OP_RANGE && !used; k++) {
                Attr *a = node_attr(n, keys[k]);
                DimExpr e;
                used = a && !a->is_list && parse_dim_expr(g, a->scalar, &e) && e.c[d];
            }
        }
        if (!used)
            return d;
    }
    return -1;
}

bool dyn_inside(const Tensor *t) {
    return t->dyn_axes && !(t->dyn_axes & (t->dyn_axes - 1)) && !t->dynamic;
}

bool is_dyn(const Tensor *t, int axis) {
    return axis >= 0 && axis < t->rank && ((t->dyn_axes >> axis) & 1u);
}

void update_prefix(Tensor *t) {
    t->dynamic = false;
    t->dyn_axis = 0;
    memset(&t->extent, 0, sizeof t->extent);
    if (!t->dyn_axes)
        return;
    int a = 0;
    while (!is_dyn(t, a))
        a++;
    if (t->dyn_axes != 1u << a)
        return;
    for (int i = 0; i < a; i++)
        if (t->shape[i] != 1)
            return;
    t->dynamic = true;
    t->dyn_axis = a;
    t->extent = t->ext[a];
}

void set_dyn_axis(Tensor *t, int axis, const DimExpr *e) {
    t->dyn_axes |= 1u << axis;
    t->ext[axis] = *e;
    update_prefix(t);
}

void check_dynamic_state(Tensor *t) {
    if (!t->dyn_axes || t->dynamic)
        return;
    int a = 0, b;
    while (!is_dyn(t, a))
        a++;
    for (b = a + 1; b < t->rank && !is_dyn(t, b); b++)
        ;
    if (b < t->rank)
        error_at(t->loc, "unsupported: state '%s' %s has two dynamic axes (%d and %d); a "
                 "state has one", t->name, shape_str(t->rank, t->shape), a, b);
}

static _Noreturn void unsupported(Node *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static _Noreturn void unsupported(Node *n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    error_at(n->loc, "node '%s' (%s): %s", n->name, op_info[n->op].name, buf);
}

/* Marks axis of n's output t dynamic with extent e; an axis that two rules
 * reach must get the same extent. */
static void mark(Node *n, Tensor *t, int axis, const DimExpr *e) {
    if (is_dyn(t, axis) && !dim_expr_eq(&t->ext[axis], e))
        unsupported(n, "axis %d of '%s' would follow two different extents", axis, t->name);
    t->dyn_axes |= 1u << axis;
    t->ext[axis] = *e;
}

static bool any_dynamic(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        if (n->inputs[i]->dyn_axes)
            return true;
    return false;
}

/* Outputs dynamic where x is (aligned at the last axis). */
static void same_as(Node *n, Tensor *x) {
    for (int k = 0; k < n->noutputs; k++) {
        Tensor *o = n->outputs[k];
        for (int a = 0; a < x->rank; a++)
            if (is_dyn(x, a) && a + o->rank - x->rank >= 0)
                mark(n, o, a + o->rank - x->rank, &x->ext[a]);
    }
}

/* Numpy broadcasting of inputs first..last: at each output axis the dynamic
 * inputs have the same extent, and a fixed input has size 1 (or lacks it). */
static void broadcast_dynamic(Node *n, int first, int last) {
    Tensor *out = n->outputs[0];
    for (int j = 0; j < out->rank; j++) {
        Tensor *ref = NULL;
        int ra = 0;
        for (int i = first; i <= last && i < n->ninputs; i++) {
            Tensor *t = n->inputs[i];
            int a = j - (out->rank - t->rank);
            if (!is_dyn(t, a))
                continue;
            if (ref && !dim_expr_eq(&t->ext[a], &ref->ext[ra]))
                unsupported(n, "'%s' and '%s' have different dynamic extents at axis %d; "
                            "kiln cannot prove they are equal", ref->name, t->name, j);
            ref = t;
            ra = a;
        }
        if (!ref)
            continue;
        for (int i = first; i <= last && i < n->ninputs; i++) {
            Tensor *t = n->inputs[i];
            int a = j - (out->rank - t->rank);
            if (a >= 0 && !is_dyn(t, a) && t->shape[a] != 1)
                unsupported(n, "'%s' %s has the fixed size %lld where '%s' is dynamic; use a "
                            "slice or gather of the fixed tensor instead", t->name,
                            shape_str(t->rank, t->shape), (long long)t->shape[a], ref->name);
        }
        for (int k = 0; k < n->noutputs; k++)
            mark(n, n->outputs[k], j, &ref->ext[ra]);
    }
}

/* A view or copy of x as out (row-major order kept): each dynamic axis of x
 * becomes the output axis with the same elements outside it, merged with
 * fixed axes inside it (its extent scaled), or split into itself and fixed
 * axes inside it where its extent divides (attention's [batch * heads, ..]
 * viewed as [batch, heads, ..]: in the largest layout either is a view);
 * merging it with an outer axis larger than 1, or splitting off an outer
 * part, would scatter a run's elements. */
static void reshape_dynamic(Node *n, Tensor *x, Tensor *out) {
    for (int a = 0; a < x->rank; a++) {
        if (!is_dyn(x, a))
            continue;
        int64_t outer = shape_count(a, x->shape);
        int64_t inner = shape_count(x->rank - a - 1, x->shape + a + 1);
        int b = -1;
        DimExpr split;
        for (int j = 0; j < out->rank && b < 0; j++) {
            if ((n->fixed_axes >> j) & 1u)
                continue; /* the shape gave it as a constant */
            int64_t o_outer = shape_count(j, out->shape);
            int64_t o_inner = shape_count(out->rank - j - 1, out->shape + j + 1);
            if (o_outer == outer && o_inner && inner % o_inner == 0 &&
                out->shape[j] * o_inner == x->shape[a] * inner)
                b = j;
            else if (o_outer == outer && inner && o_inner > inner && o_inner % inner == 0 &&
                     out->shape[j] * (o_inner / inner) == x->shape[a] &&
                     div_exact(&x->ext[a], o_inner / inner, &split) &&
                     (!is_dyn(out, j) || dim_expr_eq(&out->ext[j], &split))) {
                mark(n, out, j, &split);
                b = -2; /* marked */
            }
        }
        if (b == -2)
            continue;
        int outer_dyn = -1; /* a dynamic axis outside a, larger than 1 */
        for (int i = 0; i < a; i++)
            if (is_dyn(x, i) && x->shape[i] > 1)
                outer_dyn = i;
        if (b < 0 && outer_dyn >= 0)
            unsupported(n, "reshaping '%s' %s to %s would merge its dynamic axes %d (%s) and "
                        "%d (%s), whose run's elements are not contiguous in the largest "
                        "shape kiln stores; not supported yet", x->name,
                        shape_str(x->rank, x->shape), shape_str(out->rank, out->shape),
                        outer_dyn, dim_expr_str(n->graph, &x->ext[outer_dyn]), a,
                        dim_expr_str(n->graph, &x->ext[a]));
        if (b < 0)
            unsupported(n, "reshaping '%s' %s to %s would split its dynamic axis %d or merge "
                        "it with an outer axis", x->name, shape_str(x->rank, x->shape),
                        shape_str(out->rank, out->shape), a);
        int64_t o_inner = shape_count(out->rank - b - 1, out->shape + b + 1);
        DimExpr e = dim_expr_scale(&x->ext[a], inner / o_inner);
        if (is_dyn(out, b) && !dim_expr_eq(&out->ext[b], &e))
            unsupported(n, "reshaping '%s' %s to %s would merge two dynamic axes", x->name,
                        shape_str(x->rank, x->shape), shape_str(out->rank, out->shape));
        mark(n, out, b, &e);
    }
}

/* Ops that reduce over the axes marked in reduced: none of them dynamic. */
static void not_over(Node *n, Tensor *x, const bool *reduced) {
    for (int a = 0; a < x->rank; a++)
        if (reduced[a] && is_dyn(x, a))
            unsupported(n, "it reduces over the dynamic axis %d of '%s'; kiln reduces only "
                        "over fixed axes (softmax excepted)", a, x->name);
}

static void fixed_params(Node *n, int first) {
    for (int i = first; i < n->ninputs; i++)
        if (n->inputs[i]->dyn_axes)
            unsupported(n, "its parameter '%s' is dynamic", n->inputs[i]->name);
}

/* Each op's dynamic rule (named in its ops.def row): called when one of the
 * node's inputs is dynamic; marks the outputs' dynamic axes or refuses. */

static void dynamic_none(Node *n) {
    const char *name = "one";
    for (int i = 0; i < n->ninputs; i++)
        if (n->inputs[i]->dyn_axes) {
            name = n->inputs[i]->name;
            break;
        }
    unsupported(n, "this op does not take a dynamic extent yet (its input '%s' is "
                "dynamic); ops that do are listed in docs/yaml.md", name);
}

/* elementwise, numpy broadcasting */
static void dynamic_broadcast(Node *n) { broadcast_dynamic(n, 0, n->ninputs - 1); }

static void dynamic_expand(Node *n) { broadcast_dynamic(n, 0, 0); }

/* The one dynamic axis of t, or -1 where it has none or several. */
static int one_dyn_axis(const Tensor *t) {
    if (!t->dyn_axes || (t->dyn_axes & (t->dyn_axes - 1)))
        return -1;
    int a = 0;
    while (!is_dyn(t, a))
        a++;
    return a;
}

/* Whether out is x with axes a and a + 1 of x as one (merged) or axis a of
 * x as two (split), the axes before the same and those after regrouped
 * freely (the same elements inside each position of the pair: GPT-2's
 * [2, seq, heads, d] viewed as [2 * seq, heads * d] rows at once). */
static bool merges_at(const Tensor *x, const Tensor *out, int a, bool merged) {
    const Tensor *two = merged ? x : out, *one = merged ? out : x;
    if (a + 1 >= two->rank || a >= one->rank ||
        one->shape[a] != two->shape[a] * two->shape[a + 1])
        return false;
    for (int i = 0; i < a; i++)
        if (one->shape[i] != two->shape[i])
            return false;
    for (int i = a + 1; i < one->rank; i++)
        if (is_dyn(one, i))
            return false;
    for (int i = a + 2; i < two->rank; i++)
        if (is_dyn(two, i))
            return false;
    return shape_count(one->rank - a - 1, one->shape + a + 1) ==
           shape_count(two->rank - a - 2, two->shape + a + 2);
}

/* n (a reshape or flatten) as the repack of axis a (pack or unpack), its
 * output's shape spelled out (the repack's shape rule is the reshape's). */
static void become_repack(Node *n, const Tensor *out, int a, bool pack) {
    n->nattrs = 0;
    node_set_ints(n, "shape", out->rank, out->shape);
    node_set_int(n, "axis", a);
    node_set_int(n, "pack", pack);
    n->op = OP_REPACK;
}

/* A reshape whose run's elements move (the node becomes a repack, its
 * dispatch repack.comp): x [.., S1, S2, ..] dynamic along the adjacent
 * axes a and a + 1 into one axis (a dynamic batch and sequence viewed as
 * rows: x.view(-1, n)), which follows the derived dim of their product, the
 * elements packed as its prefix; and back, an axis that follows such a
 * product split into two (sizes the largest of each factor). The same
 * with S1 fixed (a fixed batch of more than one and a dynamic sequence):
 * the merged axis follows S1 times S2's extent, and splits back where a
 * fixed S1 divides it. In the
 * largest layout neither is a view: [b, seq] elements leave holes that
 * [b*seq] rows do not (a flatten of the two merges them too). False where
 * the reshape is neither. */
static bool repack_reshape(Node *n, Tensor *x, Tensor *out) {
    Graph *g = n->graph;
    int a = 0;
    while (a < x->rank && !is_dyn(x, a))
        a++;
    DimExpr e;
    if ((n->op == OP_RESHAPE || n->op == OP_FLATTEN) && x->dyn_axes == 3u << a &&
        !((n->fixed_axes >> a) & 1u) &&
        x->shape[a] > 1 && x->shape[a + 1] > 1 && merges_at(x, out, a, true) &&
        derive_dim(g, DIM_MUL, &x->ext[a], &x->ext[a + 1], &e)) {
        mark(n, out, a, &e);
        become_repack(n, out, a, true);
        return true;
    }
    /* a fixed axis (B > 1) and the one dynamic axis after it merged: B *
     * seq rows, a multiple of a dim (a fixed batch and a dynamic sequence
     * viewed as rows) */
    a = one_dyn_axis(x);
    if ((n->op == OP_RESHAPE || n->op == OP_FLATTEN) && a >= 1 && x->shape[a - 1] > 1 &&
        !((n->fixed_axes >> (a - 1)) & 1u) && x->shape[a] > 1 && merges_at(x, out, a - 1, true)) {
        if (scale_small(&x->ext[a], x->shape[a - 1], &e) &&
            (!is_dyn(out, a - 1) || dim_expr_eq(&out->ext[a - 1], &e))) {
            mark(n, out, a - 1, &e);
            become_repack(n, out, a - 1, true);
            return true;
        }
    }
    if (n->op != OP_RESHAPE || a < 0 || !merges_at(x, out, a, false))
        return false;
    /* and back: rows k * (an extent) split into [k, the extent], k fixed */
    int64_t k = out->shape[a];
    DimExpr q;
    if (k > 1 && !is_dyn(out, a) && !((n->fixed_axes >> (a + 1)) & 1u) &&
        div_exact(&x->ext[a], k, &q) && !dim_expr_const(&q) &&
        dim_expr_max(g, &q) == out->shape[a + 1] &&
        (!is_dyn(out, a + 1) || dim_expr_eq(&out->ext[a + 1], &q))) {
        mark(n, out, a + 1, &q);
        become_repack(n, out, a, false);
        return true;
    }
    int d = -1; /* x's extent along a: a derived product */
    for (int i = declared_dims(g); i < g->ndims; i++) {
        DimExpr one = {0, {0}};
        one.c[i] = 1;
        if (g->dims[i].op == DIM_MUL && dim_expr_eq(&x->ext[a], &one))
            d = i;
    }
    if (d < 0)
        return false;
    DimExpr f[2] = {g->dims[d].a, g->dims[d].b};
    if (is_dyn(out, a) && is_dyn(out, a + 1)) { /* the shape input's, where it gave them */
        f[0] = out->ext[a];
        f[1] = out->ext[a + 1];
    } else if (out->shape[a] != dim_expr_max(g, &f[0]) ||
               out->shape[a + 1] != dim_expr_max(g, &f[1])) {
        DimExpr t = f[0];
        f[0] = f[1];
        f[1] = t;
    }
    if (!derive_dim(g, DIM_MUL, &f[0], &f[1], &e) || !dim_expr_eq(&e, &x->ext[a]) ||
        out->shape[a] != dim_expr_max(g, &f[0]) || out->shape[a + 1] != dim_expr_max(g, &f[1]))
        return false;
    mark(n, out, a, &f[0]);
    mark(n, out, a + 1, &f[1]);
    become_repack(n, out, a, false);
    return true;
}

static void dynamic_reshape(Node *n) {
    if (!repack_reshape(n, n->inputs[0], n->outputs[0]))
        reshape_dynamic(n, n->inputs[0], n->outputs[0]);
}

static void dynamic_transpose(Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    int64_t perm[MAX_RANK];
    int np = attr_ints(n, "perm", perm, MAX_RANK);
    for (int i = 0; i < out->rank; i++) {
        int64_t p = np < 0 ? x->rank - 1 - i : perm[i] < 0 ? perm[i] + x->rank : perm[i];
        if (is_dyn(x, (int)p))
            mark(n, out, i, &x->ext[p]);
    }
}

/* A slice of a dynamic axis, with a start and an end as the node gives
 * them (ONNX counts negative ones from the end: of the run's extent, which
 * kiln does not know until run time), or the end as an expression of the
 * dims (end_dims). Taken, with step 1 and a start s at or after 0: an end
 * that is the axis's extent or a constant less (a constant end at or past
 * the axis's largest size is its extent; `torch.diff`'s x[..., :n - 1]),
 * whose output follows end - s while that leaves elements; or a constant
 * end e within the axis's least extent (the fixed elements s..e - 1). */
static void slice_dynamic_axis(Node *n, Tensor *x, int a, int64_t s, int64_t e, int64_t st,
                               const DimExpr *end, Tensor *out) {
    const Graph *g = n->graph;
    int64_t lo = dim_expr_min(g, &x->ext[a]), hi = x->shape[a];
    const char *ext = dim_expr_str(g, &x->ext[a]);
    bool follows = end && !dim_expr_const(end);
    if (st != 1 || s < 0 || (!follows && e < 0))
        unsupported(n, "it slices the dynamic axis %d of '%s' (%s, %lld..%lld) with start "
                    "%lld, end %s, step %lld; kiln slices a dynamic axis with step 1 from a "
                    "start at or after 0 (a negative start or end counts from the run's "
                    "extent, known only at run time)", a, x->name, ext, (long long)lo,
                    (long long)hi, (long long)s,
                    follows ? dim_expr_str(g, end) : format("%lld", (long long)e),
                    (long long)st);
    if (!follows && e < hi && e > lo)
        unsupported(n, "it slices the dynamic axis %d of '%s' (%s, %lld..%lld) up to %lld, "
                    "inside its range: kiln slices a dynamic axis to its end, or to an end "
                    "within its least extent", a, x->name, ext, (long long)lo, (long long)hi,
                    (long long)e);
    if (!follows && e < hi)
        return; /* fixed elements: the output's axis is fixed */
    const DimExpr *stop = follows ? end : &x->ext[a];
    DimExpr minus = dim_expr_scale(&x->ext[a], -1), start = {-s, {0}};
    DimExpr past = dim_expr_add(stop, &minus), rest = dim_expr_add(stop, &start);
    const char *es = dim_expr_str(g, stop);
    if (!dim_expr_const(&past) || past.c0 > 0)
        unsupported(n, "it slices the dynamic axis %d of '%s' (%s) from %lld to %s; kiln "
                    "takes an end that follows the dims on a dynamic axis with step 1, a "
                    "start at or after 0, and the end the axis's extent or a constant less",
                    a, x->name, ext, (long long)s, es);
    if (dim_expr_min(g, &rest) < 1)
        unsupported(n, "it slices the dynamic axis %d of '%s' from %lld to %s, which leaves "
                    "no elements when %s <= %lld; declare the dims' least value above %lld",
                    a, x->name, (long long)s, es, es, (long long)s, (long long)s);
    mark(n, out, a, &rest);
}

static void dynamic_slice(Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    int64_t starts[MAX_RANK], ends[MAX_RANK], axes[MAX_RANK], steps[MAX_RANK];
    int ns = attr_ints(n, "starts", starts, MAX_RANK);
    int na = attr_ints(n, "axes", axes, MAX_RANK);
    int nt = attr_ints(n, "steps", steps, MAX_RANK);
    attr_ints(n, "ends", ends, MAX_RANK); /* as many as starts: slice_params checked */
    Attr *ed = node_attr(n, "end_dims"); /* the ends' expressions, where they follow dims */
    bool sliced[MAX_RANK] = {false};
    for (int i = 0; i < ns; i++) {
        int64_t a = na < 0 ? i : axes[i] < 0 ? axes[i] + x->rank : axes[i];
        sliced[a] = true;
        DimExpr end;
        if (ed && (!ed->is_list || i >= ed->nitems || !parse_dim_expr(n->graph, ed->items[i],
                                                                        &end)))
            node_error(n, "end_dims must list an expression of the dims for every end");
        if (is_dyn(x, (int)a))
            slice_dynamic_axis(n, x, (int)a, starts[i], ends[i], nt < 0 ? 1 : steps[i],
                               ed ? &end : NULL, out);
    }
    for (int a = 0; a < x->rank; a++)
        if (is_dyn(x, a) && !sliced[a])
            mark(n, out, a, &x->ext[a]);
}

/* Along a dynamic axis the extents add up (each piece lands after the
 * previous one's run extent); the other axes agree as for broadcasting,
 * without size-1 pieces. */
static void dynamic_concat(Node *n) {
    Tensor *out = n->outputs[0];
    int64_t axis = attr_int(n, "axis");
    if (axis < 0)
        axis += out->rank;
    DimExpr sum = {0};
    bool along = false;
    for (int i = 0; i < n->ninputs; i++) {
        Tensor *t = n->inputs[i];
        if (is_dyn(t, (int)axis)) {
            sum = dim_expr_add(&sum, &t->ext[axis]);
            along = true;
        } else {
            sum.c0 += t->shape[axis];
        }
    }
    for (int j = 0; j < out->rank; j++) {
        if (j == axis)
            continue;
        Tensor *ref = NULL;
        for (int i = 0; i < n->ninputs; i++)
            if (is_dyn(n->inputs[i], j))
                ref = n->inputs[i];
        if (!ref)
            continue;
        for (int i = 0; i < n->ninputs; i++) {
            Tensor *t = n->inputs[i];
            if (!is_dyn(t, j) || !dim_expr_eq(&t->ext[j], &ref->ext[j]))
                unsupported(n, "'%s' and '%s' differ along axis %d, which is dynamic",
                            t->name, ref->name, j);
        }
        mark(n, out, j, &ref->ext[j]);
    }
    if (along)
        mark(n, out, (int)axis, &sum);
}

static void dynamic_split(Node *n) {
    Tensor *x = n->inputs[0];
    int axis;
    split_sizes(n, &axis);
    if (is_dyn(x, axis))
        unsupported(n, "it splits the dynamic axis of '%s'", x->name);
    same_as(n, x);
}

/* [..., M, K] x [..., K, N]: batch axes broadcast, M from A, N from B; K
 * may be dynamic when both operands have it with the same extent (the
 * product then follows it: lower_matmul.c). */
static void dynamic_matmul(Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1], *out = n->outputs[0];
    if (a->rank < 2 || b->rank < 2) {
        if (a->dyn_axes & (a->rank < 2 ? ~0u : 0u))
            unsupported(n, "its operand '%s' is a dynamic vector", a->name);
        if (b->dyn_axes & (b->rank < 2 ? ~0u : 0u))
            unsupported(n, "its operand '%s' is a dynamic vector", b->name);
    }
    int ka = a->rank - 1, kb = b->rank >= 2 ? b->rank - 2 : 0;
    if (is_dyn(a, ka) || is_dyn(b, kb)) {
        if (!is_dyn(a, ka) || !is_dyn(b, kb) || !dim_expr_eq(&a->ext[ka], &b->ext[kb]))
            unsupported(n, "'%s' and '%s' must both be dynamic along the contracted axis, "
                        "with the same extent", a->name, b->name);
    }
    int br = out->rank - (a->rank >= 2) - (b->rank >= 2);
    for (int j = 0; j < br; j++) {
        Tensor *ref = NULL;
        int ra = 0;
        Tensor *ops[2] = {a, b};
        for (int k = 0; k < 2; k++) {
            int ax = j - (br - (ops[k]->rank - 2));
            if (ops[k]->rank < 2 || ax < 0)
                continue;
            if (is_dyn(ops[k], ax)) {
                if (ref && !dim_expr_eq(&ref->ext[ra], &ops[k]->ext[ax]))
                    unsupported(n, "'%s' and '%s' have different dynamic batch extents",
                                a->name, b->name);
                ref = ops[k];
                ra = ax;
            } else if (ops[k]->shape[ax] != 1 && ref) {
                unsupported(n, "'%s' has a fixed batch size where the other operand is "
                            "dynamic", ops[k]->name);
            }
        }
        if (ref)
            mark(n, out, j, &ref->ext[ra]);
    }
    if (a->rank >= 2 && is_dyn(a, a->rank - 2))
        mark(n, out, br, &a->ext[a->rank - 2]);
    if (b->rank >= 2 && is_dyn(b, b->rank - 1))
        mark(n, out, out->rank - 1, &b->ext[b->rank - 1]);
}

static void dynamic_gemm(Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    if (n->inputs[1]->dyn_axes || attr_int(n, "trans_a") || is_dyn(x, 1))
        unsupported(n, "kiln takes a dynamic extent only in the rows of A "
                    "(trans_a 0)");
    if (n->ninputs > 2 && n->inputs[2]->dyn_axes)
        broadcast_dynamic(n, 0, 2);
    else if (is_dyn(x, 0))
        mark(n, out, 0, &x->ext[0]);
    if (n->ninputs > 2 && !n->inputs[2]->dyn_axes && n->inputs[2]->rank == 2 &&
        n->inputs[2]->shape[0] != 1 && is_dyn(x, 0))
        unsupported(n, "its bias '%s' has fixed rows where A's are dynamic",
                    n->inputs[2]->name);
}

static void dynamic_norm(Node *n) {
    Tensor *x = n->inputs[0];
    bool residual = n->op == OP_RESIDUAL_LAYER_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    int64_t axis = attr_int(n, "axis");
    if (axis < 0)
        axis += x->rank;
    bool reduced[MAX_RANK] = {false};
    for (int i = (int)axis; i < x->rank; i++)
        reduced[i] = true;
    not_over(n, x, reduced);
    fixed_params(n, residual ? 2 : 1);
    broadcast_dynamic(n, 0, residual ? 1 : 0);
}

static void dynamic_batch_norm(Node *n) {
    fixed_params(n, 1);
    same_as(n, n->inputs[0]);
}

/* softmax and log_softmax (over a dynamic axis too: the kernel follows the
 * run's extent), cumsum, topk (along a fixed axis) */
static void dynamic_axis(Node *n) {
    Tensor *x = n->inputs[0];
    bool reduced[MAX_RANK] = {false};
    int64_t axis = attr_int(n, "axis");
    int a = (int)(axis < 0 ? axis + x->rank : axis);
    reduced[a] = true;
    /* a forward cumsum along a dynamic axis runs over the largest row: each
     * of the run's positions sums only those before it (RoBERTa's position
     * ids over the sequence); a reverse one would start past the run */
    if (n->op == OP_CUMSUM && is_dyn(x, a) && attr_int(n, "reverse"))
        unsupported(n, "a reverse cumsum along the dynamic axis %d of '%s' would start past "
                    "the run's extent; kiln sums along a dynamic axis forward only", a, x->name);
    if (n->op != OP_SOFTMAX && n->op != OP_LOG_SOFTMAX && n->op != OP_CUMSUM)
        not_over(n, x, reduced);
    same_as(n, x);
}

/* [..., V] -> [...]: the other axes keep their places */
static void dynamic_sample(Node *n) {
    Tensor *x = n->inputs[0];
    bool reduced[MAX_RANK] = {false};
    if (n->inputs[1]->dyn_axes)
        unsupported(n, "its seed is dynamic");
    reduced[x->rank - 1] = true;
    not_over(n, x, reduced);
    for (int a = 0; a < x->rank - 1; a++)
        if (is_dyn(x, a))
            mark(n, n->outputs[0], a, &x->ext[a]);
}

/* Ops over images, NC[D]HW (convolutions, pooling, resize, instance and
 * group norms): a dynamic batch (axis 0) only, each image computed on its
 * own; the outputs follow it (their batch axis is the input's:
 * shape_resize keeps its scale 1). The kernels run the run's images
 * (lower_conv.c; the norms' rows, lower_rows.c). Weights, biases and the
 * other parameters stay fixed. */
static void dynamic_images(Node *n) {
    Tensor *x = n->inputs[0];
    if (x->dyn_axes & ~1u) {
        int a = 1;
        while (!is_dyn(x, a))
            a++;
        unsupported(n, "'%s' %s is dynamic along axis %d; kiln takes a dynamic extent for "
                    "this op along the batch axis 0 only", x->name,
                    shape_str(x->rank, x->shape), a);
    }
    fixed_params(n, 1);
    for (int k = 0; k < n->noutputs; k++) {
        Tensor *out = n->outputs[k];
        if (out->rank < 1 || out->shape[0] != x->shape[0])
            unsupported(n, "its output '%s' %s does not keep the dynamic batch of '%s'",
                        out->name, shape_str(out->rank, out->shape), x->name);
        mark(n, out, 0, &x->ext[0]);
    }
}

/* pad: as dynamic_images (index.comp's copy follows the run's prefix of
 * the outermost axis), that axis not padded. */
static void dynamic_pad(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t pads[2 * MAX_RANK] = {0};
    attr_ints(n, "pads", pads, 2 * MAX_RANK);
    if (is_dyn(x, 0) && (pads[0] || pads[x->rank]))
        unsupported(n, "it pads the dynamic axis 0 of '%s' (by %lld and %lld)", x->name,
                    (long long)pads[0], (long long)pads[x->rank]);
    dynamic_images(n);
}

/* The reductions: over fixed axes and at most one dynamic axis, whose
 * run's extent reduce.comp reads (RDYN_EXT: a sentence embedding's mean
 * over the tokens); the kept axes keep their places. */
static void dynamic_reduce(Node *n) {
    Tensor *x = n->inputs[0];
    bool reduced[MAX_RANK] = {false};
    reduced_axes(n, reduced);
    int over = 0;
    for (int a = 0; a < x->rank; a++)
        over += reduced[a] && is_dyn(x, a);
    if (over > 1)
        unsupported(n, "it reduces over %d dynamic axes of '%s'; kiln reduces over one at "
                    "most", over, x->name);
    bool keep = attr_int(n, "keep_dims");
    for (int a = 0, o = 0; a < x->rank; a++) {
        if (is_dyn(x, a) && !reduced[a])
            mark(n, n->outputs[0], o, &x->ext[a]);
        o += keep || !reduced[a];
    }
}

/* Indices may be dynamic (the output follows them); so may the data: a
 * gathered axis's run extent bounds the valid indices (an index past it is
 * out of range, which ONNX leaves undefined; the kernel stays inside the
 * largest shape). */
static void dynamic_gather(Node *n) {
    bool emb = n->op == OP_EMBEDDING;
    Tensor *data = n->inputs[emb ? 1 : 0], *idx = n->inputs[emb ? 0 : 1], *out = n->outputs[0];
    int64_t axis = emb ? 0 : attr_int(n, "axis");
    if (axis < 0)
        axis += data->rank;
    for (int a = 0; a < data->rank; a++) {
        if (!is_dyn(data, a) || a == axis)
            continue;
        mark(n, out, a < axis ? a : a + idx->rank - 1, &data->ext[a]);
    }
    for (int a = 0; a < idx->rank; a++)
        if (is_dyn(idx, a))
            mark(n, out, (int)axis + a, &idx->ext[a]);
}

/* gather_elements: each output element from the index at its position
 * (index.comp reads the data at its largest shape's strides; an index
 * outside the data's axis gives 0): the output follows the indices'
 * dynamic axes; the data's axes but the gathered one may follow only the
 * same extents as the indices'. */
static void dynamic_gather_elements(Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1], *out = n->outputs[0];
    int64_t axis = attr_int(n, "axis");
    if (axis < 0)
        axis += x->rank;
    for (int a = 0; a < x->rank; a++)
        if (a != axis && is_dyn(x, a) &&
            (!is_dyn(idx, a) || !dim_expr_eq(&x->ext[a], &idx->ext[a])))
            unsupported(n, "its data '%s' follows the dims along axis %d, where its indices "
                        "'%s' do not with the same extent", x->name, a, idx->name);
    for (int a = 0; a < idx->rank; a++)
        if (is_dyn(idx, a))
            mark(n, out, a, &idx->ext[a]);
}

/* gather_nd: the output follows the indices' axes but their last (the
 * tuples' length). The data's rows are found at its largest shape's
 * strides, which its bytes keep (an indexed axis may follow the dims; an
 * index past the run's extent reads what is there, one past the largest
 * gives zeros); its axes after the tuple's, the rows' own, may not. */
static void dynamic_gather_nd(Node *n) {
    Tensor *data = n->inputs[0], *idx = n->inputs[1], *out = n->outputs[0];
    int64_t lead = attr_int(n, "batch_dims") + idx->shape[idx->rank - 1];
    for (int a = (int)lead; a < data->rank; a++)
        if (is_dyn(data, a))
            unsupported(n, "data '%s' whose axis %d, after the index tuples' axes, follows "
                        "the dims", data->name, a);
    if (is_dyn(idx, idx->rank - 1))
        unsupported(n, "index tuples whose length follows the dims");
    for (int a = 0; a < idx->rank - 1; a++)
        if (is_dyn(idx, a))
            mark(n, out, a, &idx->ext[a]);
}

/* An additive mask is read at its largest shape's strides: its query and
 * key axes may follow q's and k's extents (a decoder's causal and padding
 * mask over [seq, past + seq]). */
static void dynamic_attention_mask(Node *n, const AttentionDims *a) {
    Tensor *m = n->inputs[3];
    int seq = a->bshd ? 1 : 2;
    for (int ax = 0; ax < m->rank; ax++) {
        if (!is_dyn(m, ax))
            continue;
        int full = ax + 4 - m->rank; /* of [B, H, Sq, Sk] */
        Tensor *ref = full == 2 || full == 0 ? n->inputs[0] : full == 3 ? n->inputs[1] : NULL;
        int at = full == 0 ? 0 : seq;
        if (!ref || !is_dyn(ref, at) || !dim_expr_eq(&m->ext[ax], &ref->ext[at]))
            unsupported(n, "the mask '%s' is dynamic along axis %d, which is not the "
                        "batch or the queries' or keys' dynamic positions with their extent",
                        m->name, ax);
    }
}

/* Attention's q, k and v may follow the dims along their positions (axis
 * 1 of bshd, 2 of bhsd) and their batch (axis 0, the same extent in all
 * three): the kernels read them at their largest shape's strides and walk
 * the run's extents (SQ, SK, B). */
static void dynamic_attention(Node *n) {
    AttentionDims a;
    attention_dims(n, &a);
    int seq = a.bshd ? 1 : 2;
    Tensor *q = n->inputs[0], *k = n->inputs[1], *v = n->inputs[2];
    for (int i = 0; i < 3; i++) {
        Tensor *t = n->inputs[i];
        for (int ax = 0; ax < t->rank; ax++)
            if (is_dyn(t, ax) && ax != seq && ax != 0)
                unsupported(n, "'%s' is dynamic along axis %d; attention takes a dynamic "
                            "batch (axis 0) and dynamic positions (axis %d of layout %s) "
                            "only", t->name, ax, seq, a.bshd ? "bshd" : "bhsd");
        if (is_dyn(t, 0) != is_dyn(q, 0) ||
            (is_dyn(t, 0) && !dim_expr_eq(&t->ext[0], &q->ext[0])))
            unsupported(n, "'%s' and the queries '%s' must have the same dynamic batch",
                        t->name, q->name);
    }
    if (n->ninputs > 3 && n->inputs[3]->dyn_axes)
        dynamic_attention_mask(n, &a);
    if (is_dyn(k, seq) != is_dyn(v, seq) ||
        (is_dyn(k, seq) && !dim_expr_eq(&k->ext[seq], &v->ext[seq])))
        unsupported(n, "keys '%s' and values '%s' must have the same dynamic extent",
                    k->name, v->name);
    if (is_dyn(q, seq)) /* the output's positions: axis 1 of bshd, 2 of bhsd */
        mark(n, n->outputs[0], a.out_bshd ? 1 : 2, &q->ext[seq]);
    if (is_dyn(q, 0))
        mark(n, n->outputs[0], 0, &q->ext[0]);
}

/* rope: the output follows x. cos and sin ([positions, R / 2]) follow the
 * dims together, along their positions, exactly where x follows them along
 * seq_axis (a table of fixed positions would rotate a run's positions as
 * if they started at 0: a decoder gathers its tables by position). */
static void dynamic_rope(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t axis = attr_int(n, "seq_axis");
    if (axis < 0)
        axis += x->rank;
    Tensor *c = n->inputs[1], *s = n->inputs[2];
    if (c->dynamic != s->dynamic ||
        (c->dynamic && !dim_expr_eq(&c->extent, &s->extent)))
        unsupported(n, "cos '%s' and sin '%s' must have the same dynamic extent",
                    c->name, s->name);
    if ((c->dyn_axes && !c->dynamic) || (s->dyn_axes && !s->dynamic))
        unsupported(n, "cos and sin may follow the dims along their positions only");
    if (c->dynamic && (!is_dyn(x, (int)axis) || !dim_expr_eq(&c->extent, &x->ext[axis])))
        unsupported(n, "cos and sin are dynamic, so '%s' must be dynamic along "
                    "seq_axis %lld with the same extent", x->name, (long long)axis);
    if (is_dyn(x, (int)axis) && !c->dynamic)
        unsupported(n, "'%s' is dynamic along seq_axis, so cos and sin must be too "
                    "(gather them by position)", x->name);
    same_as(n, x);
}

typedef void (*DynamicFn)(Node *n);
static const DynamicFn dynamic_rules[OP_COUNT] = {
#define OP(id, name, mn, mx, flags, attrs, shape, lower, dyn, expr) [OP_##id] = dyn,
#include "ops.def"
#undef OP
};

/* range: its size may follow the dims (shape_range parses it). */
static void dynamic_range(Node *n) {
    DimExpr e = attr_dims(n, "size");
    if (!dim_expr_const(&e))
        mark(n, n->outputs[0], 0, &e);
}

void infer_dynamic(Graph *g, Node *n) {
    (void)g;
    if (n->op == OP_RANGE)
        dynamic_range(n);
    else if (!any_dynamic(n))
        return;
    else
        dynamic_rules[n->op](n);
    for (int k = 0; k < n->noutputs; k++)
        update_prefix(n->outputs[k]);
}
