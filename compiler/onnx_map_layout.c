/*
 * onnx_map_layout.c: ONNX layout and indexing ops: views (Reshape, Squeeze,
 * Flatten, ...), Slice, Split, Expand, Tile, Pad, Gather, OneHot, Trilu,
 * Scatter
 */
#include "onnx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reshape, Squeeze, Unsqueeze, Flatten, Identity, Dropout: views. A view of
 * a constant stays a constant: its node is checked but not kept. */
void map_view(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k;
    if (x->data) {
        k = xcalloc(1, sizeof *k);
        k->name = c->nname;
        k->op = op->kop;
        k->loc = c->loc;
        Tensor *t = xcalloc(1, sizeof *t);
        t->name = x->name;
        t->dtype = x->dtype;
        t->rank = x->rank;
        memcpy(t->shape, x->shape, sizeof t->shape);
        node_add_input(k, t);
        node_add_output(k, xcalloc(1, sizeof(Tensor)));
        k->outputs[0]->name = out_name(c, 0);
    } else {
        k = emit(c, op->kop, 1, &x, out_name(c, 0));
    }
    int64_t v[MAX_RANK + 1];
    DimExpr exprs[MAX_RANK];
    bool follows = false;
    int nshape = 0;
    const char *name = op->name;
    if (strcmp(name, "Reshape") == 0) {
        int n = nshape = shape_ints(c, 1, "the shape", v, exprs, &follows, MAX_RANK);
        for (int i = 0; i < n; i++)
            if (v[i] > 0 && dim_expr_const(&exprs[i]))
                k->fixed_axes |= 1u << i;
        if (oattr_int(c, "allowzero", 0))
            for (int i = 0; i < n; i++)
                if (v[i] == 0)
                    node_fail(c, "unsupported: allowzero with a zero dimension");
        node_set_ints(k, "shape", n, v);
    } else if (strcmp(name, "Squeeze") == 0 || strcmp(name, "Unsqueeze") == 0) {
        Onnx__AttributeProto *a = oattr_ints(c, "axes");
        if (a)
            node_set_ints(k, "axes", (int)a->n_ints, a->ints);
        else if (in_opt(c, 1))
            node_set_ints(k, "axes", const_ints(c, 1, "axes", v, MAX_RANK), v);
    } else if (strcmp(name, "Flatten") == 0) {
        /* an attribute, default 1, in every version (21 to 25 add types) */
        node_set_int(k, "axis", oattr_int(c, "axis", 1));
    } else {
        node_set_ints(k, "shape", x->rank, x->shape); /* Identity, Dropout */
        if (strcmp(name, "Dropout") == 0) {
            /* Training mode drops at random, unless its ratio is 0. */
            Value *train = in_opt(c, 2) ? in_const(c, 2, "training_mode") : NULL;
            if (oattr_int(c, "is_test", 1) == 0 || (train && vget(train, 0) != 0)) {
                Value *ratio = in_opt(c, 1) ? in_const(c, 1, "the ratio in training mode")
                                            : NULL;
                double r = ratio ? vget(ratio, 0) : oattr_float(c, "ratio", 0.5);
                if (r != 0)
                    node_fail(c, format("unsupported: training mode with ratio %g (random "
                                        "masks)", r));
            }
            if (nout(c) > 1 && *out_name(c, 1)) { /* inference: nothing dropped */
                Value *mask = new_value(out_name(c, 1), KILN_DTYPE_BOOL, x->rank, x->shape,
                                        true);
                memset(mask->data, 1, (size_t)vcount(mask));
                bind_value(c, out_name(c, 1), mask);
            }
        }
    }
    if (!x->data) {
        infer_node(k);
        if (follows) /* the shape's expressions first: the dynamic rule keeps them */
            follow_shape(c, k->outputs[0], nshape, exprs);
        infer_dynamic(c->g, k);
        bind_outputs(c, k);
        return;
    }
    infer_node(k);
    Tensor *t = k->outputs[0];
    Value *o = new_value(out_name(c, 0), x->dtype, t->rank, t->shape, false);
    o->data = x->data;
    bind_value(c, out_name(c, 0), o);
}

/* Slice bounds past what kiln's 32-bit extents hold, clamped (the same
 * slice: ONNX clamps them to the axis anyway). */
static void clamp_slice_bounds(Attr *a) {
    for (int i = 0; a && i < a->nitems; i++) {
        long long val = strtoll(a->items[i], NULL, 10);
        if (val > 4294967295LL)
            a->items[i] = xstrdup("4294967295");
        if (val < -4294967295LL)
            a->items[i] = xstrdup("-4294967296");
    }
}

/* A Slice's constant inputs as map_slice read them: starts (ns of them),
 * the n ends at their most with each one's expression, axes and steps (na
 * and nt of them, -1 where the input is absent). */
typedef struct SliceBounds {
    int64_t starts[MAX_RANK], ends[MAX_RANK], axes[MAX_RANK], steps[MAX_RANK];
    DimExpr exprs[MAX_RANK];
    int ns, n, na, nt;
} SliceBounds;

/* A Slice whose ends follow the dynamic dims (`position_ids[:, :seq]`, as
 * BERT's embeddings take a prefix of a constant table): each such end e,
 * with a constant start s at or after 0, step 1, on an axis of x that is
 * fixed and holds e at its most. The slice then computes its largest
 * shape (ends at their most: a run's elements are its prefix) and the
 * output's axis follows e - s. An end on an axis that is dynamic itself
 * (`torch.diff`'s x[..., :n - 1] of an x of n) goes to the node as its
 * expression (`end_dims`), for dynamic.c's rule. Other dynamic bounds are
 * refused by name. */
static void slice_dynamic_ends(Ctx *c, Node *k, Value *x, const SliceBounds *b, bool *follows,
                               DimExpr *ext) {
    if (b->ns != b->n)
        node_fail(c, "starts and ends differ in length");
    if ((b->na >= 0 && b->na != b->n) || (b->nt >= 0 && b->nt != b->n))
        node_fail(c, "axes or steps and ends differ in length");
    for (int i = 0; i < b->n; i++) {
        if (dim_expr_const(&b->exprs[i]))
            continue;
        int64_t axis = b->na < 0 ? i : b->axes[i], step = b->nt < 0 ? 1 : b->steps[i];
        int a = (int)(axis < 0 ? axis + x->rank : axis);
        if (a < 0 || a >= x->rank)
            node_fail(c, format("axis %lld is out of range for rank %d", (long long)axis,
                                x->rank));
        int64_t lo = dim_expr_min(c->g, &b->exprs[i]), s = b->starts[i];
        if (x->t && is_dyn(x->t, a)) { /* every end's expression, once */
            if (!node_attr(k, "end_dims")) {
                char **items = xcalloc((size_t)b->n + 1, sizeof *items);
                for (int j = 0; j < b->n; j++)
                    items[j] = dim_expr_str(c->g, &b->exprs[j]);
                node_set_strs(k, "end_dims", b->n, items);
            }
            continue;
        }
        if (step != 1 || s < 0 || lo <= s || b->ends[i] > x->shape[a])
            node_fail(c, format("unsupported: the end of axis %d follows the dynamic dims (%s, "
                                "%lld..%lld over %lld elements) with start %lld and step %lld; "
                                "kiln takes such an end with step 1, a constant start from 0 "
                                "below its least value, within the axis",
                                a, dim_expr_str(c->g, &b->exprs[i]), (long long)lo,
                                (long long)b->ends[i], (long long)x->shape[a], (long long)s,
                                (long long)step));
        follows[a] = true;
        DimExpr start = {0};
        start.c0 = -s;
        ext[a] = dim_expr_add(&b->exprs[i], &start);
    }
}

void map_slice(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    bool follows[MAX_RANK] = {false}, dynamic = false;
    DimExpr ext[MAX_RANK];
    if (c->opset < 10) {
        copy_attrs(c, k, NULL);
    } else {
        SliceBounds b;
        b.ns = const_ints(c, 1, "starts", b.starts, MAX_RANK);
        b.n = shape_ints(c, 2, "ends", b.ends, b.exprs, &dynamic, MAX_RANK);
        b.na = in_opt(c, 3) ? const_ints(c, 3, "axes", b.axes, MAX_RANK) : -1;
        b.nt = in_opt(c, 4) ? const_ints(c, 4, "steps", b.steps, MAX_RANK) : -1;
        if (dynamic)
            slice_dynamic_ends(c, k, x, &b, follows, ext);
        node_set_ints(k, "starts", b.ns, b.starts);
        node_set_ints(k, "ends", b.n, b.ends);
        if (b.na >= 0)
            node_set_ints(k, "axes", b.na, b.axes);
        if (b.nt >= 0)
            node_set_ints(k, "steps", b.nt, b.steps);
    }
    /* INT64_MAX ends (the ONNX idiom for "to the end") fit after clamping. */
    clamp_slice_bounds(node_attr(k, "ends"));
    clamp_slice_bounds(node_attr(k, "starts"));
    finish(c, k);
    Tensor *t = k->outputs[0];
    for (int a = 0; dynamic && a < t->rank; a++)
        if (follows[a]) {
            t->dyn_axes |= 1u << a;
            t->ext[a] = ext[a];
        }
    if (dynamic)
        update_prefix(t);
}

void map_split(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit_outputs(c, op->kop, x, nout(c));
    node_set_int(k, "axis", oattr_int(c, "axis", 0));
    Onnx__AttributeProto *a = oattr_ints(c, "split");
    if (a) {
        node_set_ints(k, "sizes", (int)a->n_ints, a->ints);
    } else if (in_opt(c, 1)) {
        int64_t count = vcount(in_const(c, 1, "split"));
        int64_t *v = xcalloc((size_t)count + 1, sizeof(int64_t));
        node_set_ints(k, "sizes", const_ints(c, 1, "split", v, (int)count), v);
    } else if (oattr(c, "num_outputs")) {
        /* Opset 18: num_outputs parts of ceil(dim / num_outputs), the last
         * one smaller when they do not divide. */
        int64_t parts = oattr_int(c, "num_outputs", 0), axis = oattr_int(c, "axis", 0);
        if (parts != nout(c))
            node_fail(c, format("num_outputs is %lld but the node has %d outputs",
                                (long long)parts, nout(c)));
        if (axis < -x->rank || axis >= x->rank)
            node_fail(c, format("axis %lld is out of range for rank %d", (long long)axis,
                                x->rank));
        int64_t dim = x->shape[axis < 0 ? axis + x->rank : axis];
        int64_t chunk = (dim + parts - 1) / parts;
        int64_t *v = xcalloc((size_t)parts + 1, sizeof(int64_t));
        for (int64_t i = 0; i < parts; i++)
            v[i] = dim - i * chunk < chunk ? (dim - i * chunk > 0 ? dim - i * chunk : 0) : chunk;
        node_set_ints(k, "sizes", (int)parts, v);
    }
    finish(c, k);
}

void map_expand_tile(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    int64_t v[MAX_RANK];
    DimExpr exprs[MAX_RANK];
    bool follows = false;
    int n = op->kop == OP_EXPAND ? shape_ints(c, 1, "the shape", v, exprs, &follows, MAX_RANK)
                                 : const_ints(c, 1, "repeats", v, MAX_RANK);
    node_set_ints(k, op->kop == OP_EXPAND ? "shape" : "repeats", n, v);
    finish(c, k);
    if (follows) /* the output's axes where the shape follows the dims */
        follow_shape(c, k->outputs[0], n, exprs);
}

void map_pad(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    int64_t pads[2 * MAX_RANK];
    if (c->opset < 11) {
        Onnx__AttributeProto *a = oattr_ints(c, "pads");
        if (!a)
            node_fail(c, "Pad needs pads");
        node_set_ints(k, "pads", (int)a->n_ints, a->ints);
        node_set_float(k, "value", oattr_float(c, "value", 0));
    } else {
        int n = const_ints(c, 1, "pads", pads, 2 * MAX_RANK);
        if (in_opt(c, 3)) { /* axes (opset 18): expand to every axis */
            int64_t axes[MAX_RANK], full[2 * MAX_RANK] = {0};
            int na = const_ints(c, 3, "axes", axes, MAX_RANK);
            for (int i = 0; i < na; i++) {
                int ax = (int)(axes[i] < 0 ? axes[i] + x->rank : axes[i]);
                full[ax] = pads[i];
                full[ax + x->rank] = pads[i + na];
            }
            memcpy(pads, full, sizeof full);
            n = 2 * x->rank;
        }
        node_set_ints(k, "pads", n, pads);
        if (in_opt(c, 2))
            node_set_float(k, "value", vget(in_const(c, 2, "the constant value"), 0));
    }
    const char *mode = oattr_str(c, "mode", "constant");
    if (strcmp(mode, "wrap") == 0) /* Pad 19 */
        node_fail(c, "unsupported: Pad's mode wrap");
    node_set_attr(k, "mode", mode);
    finish(c, k);
}

void map_gather(Ctx *c, const OnnxOp *op) {
    Value *ins[3] = {in(c, 0), in(c, 1), in_opt(c, 2)};
    Node *k = emit(c, op->kop, ins[2] ? 3 : 2, ins, out_name(c, 0));
    copy_attrs(c, k, NULL);
    finish(c, k);
}

/* Compress with a constant condition: a Gather of the positions where it
 * holds (along axis, or of the flattened input without one). Compress
 * exists for data-dependent sizes; a condition computed at run time is
 * refused by name (in_const). */
void map_compress(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0), *cond = in_const(c, 1, "Compress's condition");
    Onnx__AttributeProto *a = oattr_typed(c, "axis", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    int64_t axis = a ? a->i : 0, len = vcount(x);
    if (a) {
        if (axis < -x->rank || axis >= x->rank)
            node_fail(c, format("axis %lld is out of range for rank %d", (long long)axis,
                                x->rank));
        axis += axis < 0 ? x->rank : 0;
        len = x->shape[axis];
    } else { /* the flattened input */
        Node *k = emit_tmp(c, OP_RESHAPE, 1, &x);
        node_set_ints(k, "shape", 1, &len);
        x = finish(c, k);
    }
    if (cond->rank != 1 || vcount(cond) > len)
        node_fail(c, format("a condition of shape %s for %lld positions",
                            shape_str(cond->rank, cond->shape), (long long)len));
    int64_t n = 0;
    for (int64_t i = 0; i < vcount(cond); i++)
        n += vget(cond, i) != 0;
    Value *idx = new_value(format("%s/kept%d", c->nname, ++c->tmp_count), KILN_DTYPE_I64, 1,
                           &n, true);
    for (int64_t i = 0, j = 0; i < vcount(cond); i++)
        if (vget(cond, i) != 0)
            vseti(idx, j++, i);
    Value *ins[2] = {x, idx};
    Node *k = emit(c, OP_GATHER, 2, ins, out_name(c, 0));
    node_set_int(k, "axis", axis);
    finish(c, k);
}

void map_onehot(Ctx *c, const OnnxOp *op) {
    Value *idx = in(c, 0), *vals = in_const(c, 2, "values");
    if (!is_integral(idx->dtype) || idx->dtype == KILN_DTYPE_BOOL) {
        Node *cast = emit_tmp(c, OP_CAST, 1, &idx); /* ONNX truncates them */
        node_set_attr(cast, "to", "i64");
        idx = finish(c, cast);
    }
    int64_t depth;
    const_ints(c, 1, "depth", &depth, 1);
    bool float_out = vals->dtype == KILN_DTYPE_F32;
    Node *k = float_out ? emit(c, op->kop, 1, &idx, out_name(c, 0)) : emit_tmp(c, op->kop, 1, &idx);
    node_set_int(k, "depth", depth);
    node_set_int(k, "axis", oattr_int(c, "axis", -1));
    node_set_float(k, "off_value", vget(vals, 0));
    node_set_float(k, "on_value", vget(vals, 1));
    Value *y = finish(c, k);
    if (!float_out) {
        Node *cast = emit(c, OP_CAST, 1, &y, out_name(c, 0));
        node_set_attr(cast, "to", kiln_dtype_name(vals->dtype));
        finish(c, cast);
    }
}

void map_trilu(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    node_set_int(k, "upper", oattr_int(c, "upper", 1));
    if (in_opt(c, 1)) {
        int64_t kk;
        const_ints(c, 1, "k", &kk, 1);
        node_set_int(k, "k", kk);
    }
    finish(c, k);
}

void map_scatter(Ctx *c, const OnnxOp *op) {
    Value *ins[3] = {in(c, 0), in(c, 1), in(c, 2)};
    Node *k = emit(c, op->kop, 3, ins, out_name(c, 0));
    node_set_int(k, "axis", oattr_int(c, "axis", 0));
    node_set_attr(k, "reduction", oattr_str(c, "reduction", "none"));
    finish(c, k);
}

/* EyeLike: a constant of the input's (2-D) shape, ones on diagonal k. */
void map_eye_like(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0);
    if (x->rank != 2)
        node_fail(c, format("the input has shape %s, expected 2-D", shape_str(x->rank, x->shape)));
    kiln_dtype dt = x->dtype;
    if (oattr(c, "dtype")) {
        int32_t t = (int32_t)oattr_int(c, "dtype", 0);
        int d = kiln_dtype_of(t);
        if (d < 0)
            node_fail(c, format("unsupported: dtype %s", onnx_type_name(t)));
        dt = (kiln_dtype)d;
    }
    int64_t k = oattr_int(c, "k", 0);
    /* a constant: at most 2^26 elements (256 MiB of f32; a dynamic input's
     * largest shape can claim billions) */
    if ((double)shape_count(2, x->shape) > (double)(1 << 26))
        node_fail(c, format("unsupported: an EyeLike of shape %s (kiln makes it a constant, "
                            "of at most %d elements)", shape_str(2, x->shape), 1 << 26));
    Value *y = new_value(out_name(c, 0), dt, 2, x->shape, true);
    for (int64_t i = 0; i < x->shape[0]; i++)
        if (i + k >= 0 && i + k < x->shape[1])
            vset(y, i * x->shape[1] + i + k, 1);
    bind_value(c, out_name(c, 0), y);
}

/* Row numbers, shaped [T, B] (time_major) or [B, T], into data seen as
 * [T * B, rest] in that same order: sequence b's first lens[b] positions
 * reversed, the others kept, clamped to the time axis (a length past it
 * is undefined in ONNX; the rows stay in range). Computed here when lens
 * is a constant (each length checked), else by elementwise ops. */
Value *reversal_rows(Ctx *c, Value *lens, int64_t T, int64_t B, bool time_major) {
    int64_t grid[2] = {time_major ? T : B, time_major ? B : T};
    if (lens->data) {
        Value *rows = new_value(format("%s/rows%d", c->nname, ++c->tmp_count), KILN_DTYPE_I64,
                                2, grid, true);
        for (int64_t t = 0; t < T; t++)
            for (int64_t b = 0; b < B; b++) {
                int64_t len = vgeti(lens, b);
                if (len < 0 || len > T)
                    node_fail(c, format("sequence_lens[%lld] is %lld, for a time axis of %lld",
                                        (long long)b, (long long)len, (long long)T));
                int64_t src = t < len ? len - 1 - t : t;
                vseti(rows, time_major ? t * B + b : b * T + t,
                      time_major ? src * B + b : b * T + src);
            }
        return rows;
    }
    /* time positions t and batch positions b as constants in the grid */
    int64_t tshape[2] = {time_major ? T : 1, time_major ? 1 : T};
    Value *tpos = new_value(format("%s/t%d", c->nname, ++c->tmp_count), KILN_DTYPE_I32, 2,
                            tshape, true);
    for (int64_t t = 0; t < T; t++)
        vseti(tpos, t, t);
    int64_t bshape[2] = {time_major ? 1 : B, time_major ? B : 1};
    Value *bpos = new_value(format("%s/b%d", c->nname, ++c->tmp_count), KILN_DTYPE_I32, 2,
                            bshape, true);
    for (int64_t b = 0; b < B; b++)
        vseti(bpos, b, b);
    Value *len = reshaped(c, cast_to(c, lens, KILN_DTYPE_I32), 2, bshape);
    Value *rev = binary_tmp(c, OP_SUB, binary_tmp(c, OP_SUB, len,
                                                  const_scalar(c, KILN_DTYPE_I32, 1)), tpos);
    Value *ins[3] = {binary_tmp(c, OP_LT, tpos, len), rev, tpos};
    Value *src = finish(c, emit_tmp(c, OP_WHERE, 3, ins));
    Node *k = emit_tmp(c, OP_CLIP, 1, &src);
    node_set_float(k, "min", 0);
    node_set_float(k, "max", (double)(T - 1));
    src = finish(c, k);
    return time_major
               ? binary_tmp(c, OP_ADD, binary_tmp(c, OP_MUL, src,
                                                  const_scalar(c, KILN_DTYPE_I32, (double)B)),
                            bpos)
               : binary_tmp(c, OP_ADD, binary_tmp(c, OP_MUL, bpos,
                                                  const_scalar(c, KILN_DTYPE_I32, (double)T)),
                            src);
}

/* ReverseSequence: along time_axis, the first sequence_lens[b] positions
 * of each batch entry b reversed, the rest kept: a Gather of
 * reversal_rows of x seen as [time * batch (in x's order), rest]. */
void map_reverse_sequence(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0), *lens = in(c, 1);
    int64_t ta = oattr_int(c, "time_axis", 0), ba = oattr_int(c, "batch_axis", 1);
    if (x->rank < 2 || !((ta == 0 && ba == 1) || (ta == 1 && ba == 0)))
        node_fail(c, format("time_axis %lld and batch_axis %lld for an input of rank %d "
                            "(0 and 1, or 1 and 0)", (long long)ta, (long long)ba, x->rank));
    int64_t T = x->shape[ta], B = x->shape[ba];
    if (lens->rank != 1 || lens->shape[0] != B)
        node_fail(c, format("sequence_lens has shape %s for a batch of %lld",
                            shape_str(lens->rank, lens->shape), (long long)B));
    int64_t flat[2] = {T * B, shape_count(x->rank - 2, x->shape + 2)};
    Value *ins[2] = {reshaped(c, x, 2, flat), reversal_rows(c, lens, T, B, ta == 0)};
    Node *k = emit_tmp(c, OP_GATHER, 2, ins);
    node_set_int(k, "axis", 0);
    Value *y = finish(c, k); /* [time, batch, rest] or [batch, time, rest] */
    Node *v = emit(c, OP_RESHAPE, 1, &y, out_name(c, 0));
    node_set_ints(v, "shape", x->rank, x->shape);
    finish(c, v);
}
