/*
 * onnx_map.c: every supported ONNX op mapped to kiln nodes. The table at
 * the end lists them all: adding an ONNX op is a row there (and a mapper
 * function when it is not a plain rename).
 */
#include "onnx.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- op mappers ---- */

static Value *cast_to(Ctx *c, Value *v, kiln_dtype dt);

typedef void (*MapFn)(Ctx *c, const OnnxOp *op);
struct OnnxOp {
    const char *name;
    MapFn fn;
    OpKind kop;
    const char *renames; /* for copy_attrs */
};

/* One kiln node with the same inputs and (renamed) attributes. Binary ops
 * of opsets before 7 broadcast only on request (broadcast=1), aligning the
 * second operand at `axis`: that becomes a reshape to numpy's alignment. */
static void map_simple(Ctx *c, const OnnxOp *op) {
    Value **ins = xcalloc((size_t)nin(c) + 1, sizeof(Value *));
    int n = 0;
    for (int i = 0; i < nin(c); i++) {
        Value *v = in_opt(c, i);
        if (v)
            ins[n++] = v;
    }
    if (oattr(c, "broadcast") && n == 2) {
        Value *a = ins[0], *b = ins[1];
        int64_t axis = oattr_int(c, "axis", a->rank - b->rank);
        if (axis < 0)
            axis += a->rank;
        if (oattr_int(c, "broadcast", 0) && b->rank && axis + b->rank < a->rank) {
            int64_t shape[MAX_RANK];
            int r = 0;
            for (int i = 0; i < b->rank; i++)
                shape[r++] = b->shape[i];
            while (r < a->rank - axis && r < MAX_RANK)
                shape[r++] = 1;
            Node *k = emit_tmp(c, OP_RESHAPE, 1, &b);
            node_set_ints(k, "shape", r, shape);
            ins[1] = finish(c, k);
        }
    }
    Node *k = emit(c, op->kop, n, ins, out_name(c, 0));
    for (int i = 1; i < nout(c); i++)
        if (*out_name(c, i))
            node_fail(c, format("unsupported: output %d", i));
    copy_attrs(c, k, oattr(c, "broadcast") ? "broadcast:- axis:-" : op->renames);
    finish(c, k);
}

/* Variadic Sum, Mean, Max, Min: a chain of binary nodes. */
static void map_variadic(Ctx *c, const OnnxOp *op) {
    Value *acc = in(c, 0);
    bool mean = strcmp(op->name, "Mean") == 0;
    if (nin(c) == 1 && !mean) {
        Node *k = emit(c, OP_RESHAPE, 1, &acc, out_name(c, 0));
        node_set_ints(k, "shape", acc->rank, acc->shape);
        finish(c, k);
        return;
    }
    for (int i = 1; i < nin(c); i++) {
        Value *pair[2] = {acc, in(c, i)};
        bool last = i == nin(c) - 1 && !mean;
        Node *k = last ? emit(c, op->kop, 2, pair, out_name(c, 0))
                       : emit_tmp(c, op->kop, 2, pair);
        acc = finish(c, k);
    }
    if (mean) {
        Value *n = new_value(format("%s/count", c->nname), acc->dtype, 0, NULL, true);
        vset(n, 0, nin(c));
        Value *pair[2] = {acc, n};
        finish(c, emit(c, OP_DIV, 2, pair, out_name(c, 0)));
    }
}

/* Reshape, Squeeze, Unsqueeze, Flatten, Identity, Dropout: views. A view of
 * a constant stays a constant: its node is checked but not kept. */
static void map_view(Ctx *c, const OnnxOp *op) {
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
    const char *name = op->name;
    if (strcmp(name, "Reshape") == 0) {
        int n = const_ints(c, 1, "the shape", v, MAX_RANK);
        if (oattr_int(c, "allowzero", 0))
            for (int i = 0; i < n; i++)
                if (v[i] == 0)
                    node_fail(c, "unsupported: allowzero with a zero dimension");
        node_set_ints(k, "shape", n, v);
    } else if (strcmp(name, "Squeeze") == 0 || strcmp(name, "Unsqueeze") == 0) {
        Onnx__AttributeProto *a = oattr(c, "axes");
        if (a)
            node_set_ints(k, "axes", (int)a->n_ints, a->ints);
        else if (in_opt(c, 1))
            node_set_ints(k, "axes", const_ints(c, 1, "axes", v, MAX_RANK), v);
    } else if (strcmp(name, "Flatten") == 0) {
        int64_t axis = oattr_int(c, "axis", 1);
        if (in_opt(c, 2)) /* opset 20: an input, default -2 */
            const_ints(c, 2, "axis", &axis, 1);
        else if (c->opset >= 20)
            axis = -2;
        node_set_int(k, "axis", axis);
    } else {
        node_set_ints(k, "shape", x->rank, x->shape); /* Identity, Dropout */
        if (strcmp(name, "Dropout") == 0) {
            Value *train = in_opt(c, 2);
            if (oattr_int(c, "is_test", 1) == 0 ||
                (train && (!train->data || vget(train, 0) != 0)))
                node_fail(c, "unsupported: training mode (random masks)");
            if (nout(c) > 1 && *out_name(c, 1)) { /* inference: nothing dropped */
                Value *mask = new_value(out_name(c, 1), KILN_DTYPE_BOOL, x->rank, x->shape,
                                        true);
                memset(mask->data, 1, (size_t)vcount(mask));
                bind_value(c, out_name(c, 1), mask);
            }
        }
    }
    if (!x->data) {
        finish(c, k);
        return;
    }
    infer_node(k);
    Tensor *t = k->outputs[0];
    Value *o = new_value(out_name(c, 0), x->dtype, t->rank, t->shape, false);
    o->data = x->data;
    bind_value(c, out_name(c, 0), o);
}

static void map_slice(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    int64_t v[MAX_RANK];
    if (c->opset < 10) {
        copy_attrs(c, k, NULL);
    } else {
        node_set_ints(k, "starts", const_ints(c, 1, "starts", v, MAX_RANK), v);
        node_set_ints(k, "ends", const_ints(c, 2, "ends", v, MAX_RANK), v);
        if (in_opt(c, 3))
            node_set_ints(k, "axes", const_ints(c, 3, "axes", v, MAX_RANK), v);
        if (in_opt(c, 4))
            node_set_ints(k, "steps", const_ints(c, 4, "steps", v, MAX_RANK), v);
    }
    /* INT64_MAX ends (the ONNX idiom for "to the end") fit after clamping. */
    Attr *e = node_attr(k, "ends");
    for (int i = 0; e && i < e->nitems; i++) {
        long long val = strtoll(e->items[i], NULL, 10);
        if (val > 4294967295LL)
            e->items[i] = xstrdup("4294967295");
        if (val < -4294967295LL)
            e->items[i] = xstrdup("-4294967296");
    }
    Attr *s = node_attr(k, "starts");
    for (int i = 0; s && i < s->nitems; i++) {
        long long val = strtoll(s->items[i], NULL, 10);
        if (val > 4294967295LL)
            s->items[i] = xstrdup("4294967295");
        if (val < -4294967295LL)
            s->items[i] = xstrdup("-4294967296");
    }
    finish(c, k);
}

static void map_split(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = knode(c, op->kop, "");
    node_add_input(k, tens(c, x));
    for (int i = 0; i < nout(c); i++)
        node_add_output(k, graph_tensor(c->g, *out_name(c, i) ? out_name(c, i)
                                                                : format("%s/%d", c->nname, i),
                                        T_VALUE, c->loc));
    node_set_int(k, "axis", oattr_int(c, "axis", 0));
    Onnx__AttributeProto *a = oattr(c, "split");
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

static void map_expand_tile(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    int64_t v[MAX_RANK];
    int n = const_ints(c, 1, op->kop == OP_EXPAND ? "the shape" : "repeats", v, MAX_RANK);
    node_set_ints(k, op->kop == OP_EXPAND ? "shape" : "repeats", n, v);
    finish(c, k);
}

static void map_pad(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    int64_t pads[2 * MAX_RANK];
    if (c->opset < 11) {
        Onnx__AttributeProto *a = oattr(c, "pads");
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
    node_set_attr(k, "mode", oattr_str(c, "mode", "constant"));
    finish(c, k);
}

static void map_clip(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    if (c->opset < 11) {
        if (oattr(c, "min"))
            node_set_float(k, "min", oattr_float(c, "min", 0));
        if (oattr(c, "max"))
            node_set_float(k, "max", oattr_float(c, "max", 0));
    } else {
        if (in_opt(c, 1))
            node_set_float(k, "min", vget(in_const(c, 1, "min"), 0));
        if (in_opt(c, 2))
            node_set_float(k, "max", vget(in_const(c, 2, "max"), 0));
    }
    finish(c, k);
}

static void map_cast(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    int dt;
    if (strcmp(op->name, "CastLike") == 0) {
        dt = in(c, 1)->dtype;
    } else {
        int32_t to = (int32_t)oattr_int(c, "to", 0);
        dt = kiln_dtype_of(to);
        if (dt < 0)
            node_fail(c, format("unsupported: cast to %s", onnx_type_name(to)));
    }
    Node *k = emit(c, OP_CAST, 1, &x, out_name(c, 0));
    node_set_attr(k, "to", kiln_dtype_name((kiln_dtype)dt));
    finish(c, k);
}

/* Softmax, LogSoftmax, Hardmax. Before opset 13 they act on the input
 * flattened to 2-D at axis (default 1); from 13 on one axis (default -1). */
static void map_softmax(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    bool old = c->opset < 13;
    int64_t axis = oattr_int(c, "axis", old ? 1 : -1);
    if (axis < -x->rank || axis >= (x->rank ? x->rank : 1))
        node_fail(c, format("axis %lld is out of range", (long long)axis));
    if (axis < 0)
        axis += x->rank;
    Value *src = x;
    if (old && axis != x->rank - 1) {
        Node *r = emit_tmp(c, OP_RESHAPE, 1, &x);
        int64_t shape[2] = {shape_count((int)axis, x->shape),
                            shape_count(x->rank - (int)axis, x->shape + axis)};
        node_set_ints(r, "shape", 2, shape);
        src = finish(c, r);
        axis = 1;
    }
    bool reshaped = src != x;
    Value *y;
    if (strcmp(op->name, "Hardmax") == 0) {
        Node *am = emit_tmp(c, OP_ARGMAX, 1, &src);
        node_set_int(am, "axis", axis);
        node_set_int(am, "keep_dims", 0);
        Value *idx = finish(c, am);
        Node *oh = reshaped ? emit_tmp(c, OP_ONE_HOT, 1, &idx)
                            : emit(c, OP_ONE_HOT, 1, &idx, out_name(c, 0));
        node_set_int(oh, "depth", src->shape[axis]);
        node_set_int(oh, "axis", axis);
        y = finish(c, oh);
    } else {
        Node *k = reshaped ? emit_tmp(c, op->kop, 1, &src)
                           : emit(c, op->kop, 1, &src, out_name(c, 0));
        node_set_int(k, "axis", axis);
        y = finish(c, k);
    }
    if (reshaped) {
        Node *r = emit(c, OP_RESHAPE, 1, &y, out_name(c, 0));
        node_set_ints(r, "shape", x->rank, x->shape);
        finish(c, r);
    }
}

/* ReduceX: axes from the attribute, or (ReduceSum from 13, the rest from 18)
 * from the second input; noop_with_empty_axes keeps the input. */
static void map_reduce(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    int64_t axes[MAX_RANK];
    int n = -1;
    Onnx__AttributeProto *a = oattr(c, "axes");
    if (a) {
        n = (int)a->n_ints;
        if (n > MAX_RANK)
            node_fail(c, format("axes has %d values, at most %d", n, MAX_RANK));
        if (n > 0)
            memcpy(axes, a->ints, sizeof(int64_t) * (size_t)n);
    } else if (in_opt(c, 1)) {
        n = const_ints(c, 1, "axes", axes, MAX_RANK);
    }
    if (n <= 0 && oattr_int(c, "noop_with_empty_axes", 0)) {
        Node *k = emit(c, OP_RESHAPE, 1, &x, out_name(c, 0));
        node_set_ints(k, "shape", x->rank, x->shape);
        finish(c, k);
        return;
    }
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    if (n > 0)
        node_set_ints(k, "axes", n, axes);
    node_set_int(k, "keep_dims", oattr_int(c, "keepdims", 1));
    finish(c, k);
}

static void map_arg(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    node_set_int(k, "axis", oattr_int(c, "axis", 0));
    node_set_int(k, "keep_dims", oattr_int(c, "keepdims", 1));
    node_set_int(k, "select_last_index", oattr_int(c, "select_last_index", 0));
    finish(c, k);
}

static void map_gemm(Ctx *c, const OnnxOp *op) {
    Value *ins[3] = {in(c, 0), in(c, 1), in_opt(c, 2)};
    Node *k = emit(c, op->kop, ins[2] ? 3 : 2, ins, out_name(c, 0));
    copy_attrs(c, k, "transA:trans_a transB:trans_b broadcast:-");
    finish(c, k);
}

static void map_norm(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    if (op->kop == OP_BATCH_NORM) {
        if (oattr_int(c, "spatial", 1) == 0)
            node_fail(c, "unsupported: spatial 0");
        if (oattr_int(c, "training_mode", 0) || (nout(c) > 1 && *out_name(c, 1)))
            node_fail(c, "unsupported: training mode");
        Value *ins[5] = {x, in(c, 1), in(c, 2), in(c, 3), in(c, 4)};
        Node *k = emit(c, op->kop, 5, ins, out_name(c, 0));
        node_set_float(k, "eps", oattr_float(c, "epsilon", 1e-5));
        finish(c, k);
        return;
    }
    if (op->kop == OP_LAYER_NORM) {
        if (oattr_int(c, "stash_type", 1) != 1)
            node_fail(c, "unsupported: stash_type other than float");
        if (nout(c) > 1) {
            /* Mean and 1 / sqrt(var + eps) over the normalized axes, kept as
             * dimensions of size 1, for whichever of them is asked for. */
            int64_t axis = oattr_int(c, "axis", -1), axes[MAX_RANK];
            if (axis < 0)
                axis += x->rank;
            if (axis < 0 || axis >= x->rank)
                node_fail(c, format("axis %lld is out of range for rank %d",
                                    (long long)oattr_int(c, "axis", -1), x->rank));
            int na = 0;
            for (int64_t d = axis; d < x->rank; d++)
                axes[na++] = d;
            Node *m = *out_name(c, 1) ? emit(c, OP_REDUCE_MEAN, 1, &x, out_name(c, 1))
                                      : emit_tmp(c, OP_REDUCE_MEAN, 1, &x);
            node_set_ints(m, "axes", na, axes);
            Value *mean = finish(c, m);
            if (nout(c) > 2 && *out_name(c, 2)) {
                Value *dv[2] = {x, mean};
                Value *dev = finish(c, emit_tmp(c, OP_SUB, 2, dv));
                Value *sq[2] = {dev, dev};
                Value *sqr = finish(c, emit_tmp(c, OP_MUL, 2, sq));
                Node *vm = emit_tmp(c, OP_REDUCE_MEAN, 1, &sqr);
                node_set_ints(vm, "axes", na, axes);
                Value *var = finish(c, vm);
                Value *eps = new_value(format("%s/eps", c->nname), KILN_DTYPE_F32, 0, NULL, true);
                vset(eps, 0, oattr_float(c, "epsilon", 1e-5));
                Value *ve[2] = {var, eps};
                Value *sum = finish(c, emit_tmp(c, OP_ADD, 2, ve));
                finish(c, emit(c, OP_RSQRT, 1, &sum, out_name(c, 2)));
            }
        }
    }
    Value *ins[3] = {x, in_opt(c, 1), in_opt(c, 2)};
    int n = ins[1] ? (ins[2] ? 3 : 2) : 1;
    if (!ins[1] && ins[2])
        node_fail(c, "unsupported: a bias without a scale");
    Node *k = emit(c, op->kop, n, ins, out_name(c, 0));
    node_set_float(k, "eps", oattr_float(c, "epsilon", 1e-5));
    if (op->kop == OP_LAYER_NORM)
        node_set_int(k, "axis", oattr_int(c, "axis", -1));
    finish(c, k);
}

/* Conv, ConvTranspose, MaxPool, AveragePool: attributes renamed. */
static void map_window(Ctx *c, const OnnxOp *op) {
    if (op->kop == OP_MAX_POOL && nout(c) > 1 && *out_name(c, 1))
        node_fail(c, "unsupported: the indices output of MaxPool");
    if (op->kop == OP_MAX_POOL && oattr_int(c, "storage_order", 0))
        node_fail(c, "unsupported: storage_order 1");
    if (op->kop == OP_CONV_TRANSPOSE && oattr(c, "output_shape"))
        node_fail(c, "unsupported: output_shape (give pads)");
    Value *ins[3] = {in(c, 0), in_opt(c, 1), in_opt(c, 2)};
    int n = op->kop == OP_CONV || op->kop == OP_CONV_TRANSPOSE ? (ins[2] ? 3 : 2) : 1;
    kiln_dtype dt = ins[0]->dtype;
    if (op->kop == OP_MAX_POOL && dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_I64) {
        /* Small integers are exact in f32: pool there and convert back. */
        ins[0] = cast_to(c, ins[0], KILN_DTYPE_F32);
        Node *k = emit_tmp(c, op->kop, 1, ins);
        copy_attrs(c, k, op->renames);
        Value *y = finish(c, k);
        Node *back = emit(c, OP_CAST, 1, &y, out_name(c, 0));
        node_set_attr(back, "to", kiln_dtype_name(dt));
        finish(c, back);
        return;
    }
    Node *k = emit(c, op->kop, n, ins, out_name(c, 0));
    copy_attrs(c, k, op->renames);
    finish(c, k);
}

static void map_resize(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    const char *mode = oattr_str(c, "mode", "nearest");
    if (strcmp(mode, "nearest") != 0 && strcmp(mode, "linear") != 0)
        node_fail(c, format("unsupported: mode %s", mode));
    node_set_attr(k, "mode", mode);
    int scales_at = c->opset < 11 || strcmp(op->name, "Upsample") == 0 ? 1 : 2;
    Value *sizes = scales_at == 2 ? in_opt(c, 3) : NULL;
    Value *scales = in_opt(c, scales_at);
    if (scales && vcount(scales) == 0)
        scales = NULL;
    if (sizes && vcount(sizes) > 0) {
        int64_t v[MAX_RANK];
        node_set_ints(k, "sizes", const_ints(c, 3, "sizes", v, MAX_RANK), v);
    } else if (scales) {
        in_const(c, scales_at, "scales");
        double f[MAX_RANK];
        int64_t n = vcount(scales);
        if (n > MAX_RANK)
            node_fail(c, format("scales has %lld values, at most %d", (long long)n, MAX_RANK));
        for (int64_t i = 0; i < n; i++)
            f[i] = vget(scales, i);
        node_set_floats(k, "scales", (int)n, f);
    } else {
        node_fail(c, "Resize needs scales or sizes");
    }
    if (oattr(c, "axes"))
        node_fail(c, "unsupported: axes");
    const char *coord = oattr_str(c, "coordinate_transformation_mode",
                                  c->opset < 11 ? "asymmetric" : "half_pixel");
    if (strcmp(coord, "tf_crop_and_resize") == 0 || strcmp(coord, "tf_half_pixel_for_nn") == 0 ||
        strcmp(coord, "half_pixel_symmetric") == 0)
        node_fail(c, format("unsupported: coordinate_transformation_mode %s", coord));
    node_set_attr(k, "coordinate_transformation_mode", coord);
    node_set_attr(k, "nearest_mode", oattr_str(c, "nearest_mode", c->opset < 11 ? "floor"
                                                                               : "round_prefer_floor"));
    if (oattr_int(c, "antialias", 0) || strcmp(oattr_str(c, "keep_aspect_ratio_policy",
                                                         "stretch"), "stretch") != 0)
        node_fail(c, "unsupported: antialias or keep_aspect_ratio_policy");
    finish(c, k);
}

static void map_topk(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = knode(c, op->kop, "");
    node_add_input(k, tens(c, x));
    for (int i = 0; i < 2; i++)
        node_add_output(k, graph_tensor(c->g, *out_name(c, i) ? out_name(c, i)
                                                                : format("%s/%d", c->nname, i),
                                        T_VALUE, c->loc));
    int64_t kk;
    if (c->opset < 10)
        kk = oattr_int(c, "k", 0);
    else
        const_ints(c, 1, "K", &kk, 1);
    node_set_int(k, "k", kk);
    node_set_int(k, "axis", oattr_int(c, "axis", -1));
    node_set_int(k, "largest", oattr_int(c, "largest", 1));
    finish(c, k);
}

static void map_gather(Ctx *c, const OnnxOp *op) {
    Value *ins[3] = {in(c, 0), in(c, 1), in_opt(c, 2)};
    Node *k = emit(c, op->kop, ins[2] ? 3 : 2, ins, out_name(c, 0));
    copy_attrs(c, k, NULL);
    finish(c, k);
}

static void map_onehot(Ctx *c, const OnnxOp *op) {
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

static void map_trilu(Ctx *c, const OnnxOp *op) {
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

static void map_cumsum(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    int64_t axis;
    const_ints(c, 1, "axis", &axis, 1);
    node_set_int(k, "axis", axis);
    node_set_int(k, "exclusive", oattr_int(c, "exclusive", 0));
    node_set_int(k, "reverse", oattr_int(c, "reverse", 0));
    finish(c, k);
}

/* A cast node (internal) unless v already has dtype dt. */
static Value *cast_to(Ctx *c, Value *v, kiln_dtype dt) {
    if (v->dtype == dt)
        return v;
    Node *k = emit_tmp(c, OP_CAST, 1, &v);
    node_set_attr(k, "to", kiln_dtype_name(dt));
    return finish(c, k);
}

/* Pow: the exponent may have another dtype; integers compute in f32. */
static void map_pow(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0), *y = in(c, 1);
    kiln_dtype out = x->dtype;
    kiln_dtype ct = is_integral(out) ? KILN_DTYPE_F32 : out;
    Value *ins[2] = {cast_to(c, x, ct), cast_to(c, y, ct)};
    if (ct == out) {
        finish(c, emit(c, op->kop, 2, ins, out_name(c, 0)));
        return;
    }
    Value *p = finish(c, emit_tmp(c, op->kop, 2, ins));
    Node *k = emit(c, OP_CAST, 1, &p, out_name(c, 0));
    node_set_attr(k, "to", kiln_dtype_name(out));
    finish(c, k);
}

static Value *const_scalar(Ctx *c, kiln_dtype dt, double v) {
    Value *k = new_value(format("%s/const%d", c->nname, ++c->tmp_count), dt, 0, NULL, true);
    vset(k, 0, v);
    return k;
}

static Value *unary_tmp(Ctx *c, OpKind op, Value *x) { return finish(c, emit_tmp(c, op, 1, &x)); }

static Value *binary_tmp(Ctx *c, OpKind op, Value *a, Value *b) {
    Value *ab[2] = {a, b};
    return finish(c, emit_tmp(c, op, 2, ab));
}

/* Negative log-likelihood of x [N, C, d...] (log-probabilities) at the
 * classes t [N, d...]: -x[n, t[n, ...], ...] times the class weight, 0 where
 * t is ignore_index; reduced by none, sum or mean (over the weights). */
static void nll(Ctx *c, Value *x, Value *t, Value *weight, const char *out) {
    const char *reduction = oattr_str(c, "reduction", "mean");
    int red = strcmp(reduction, "none") == 0 ? 0 : strcmp(reduction, "sum") == 0 ? 1
              : strcmp(reduction, "mean") == 0 ? 2 : -1;
    if (red < 0)
        node_fail(c, format("reduction must be none, sum or mean, not %s", reduction));
    Value *valid = NULL, *tz = t;
    if (oattr(c, "ignore_index")) {
        Value *ign = const_scalar(c, t->dtype, (double)oattr_int(c, "ignore_index", 0));
        valid = binary_tmp(c, OP_NE, t, ign);
        Value *w3[3] = {valid, t, const_scalar(c, t->dtype, 0)};
        tz = finish(c, emit_tmp(c, OP_WHERE, 3, w3));
    }
    int64_t one = 1;
    Node *u = emit_tmp(c, OP_UNSQUEEZE, 1, &tz);
    node_set_ints(u, "axes", 1, &one);
    Value *tu = finish(c, u);
    Value *pair[2] = {x, tu};
    Node *ge = emit_tmp(c, OP_GATHER_ELEMENTS, 2, pair);
    node_set_int(ge, "axis", 1);
    Value *picked = finish(c, ge);
    Node *sq = emit_tmp(c, OP_SQUEEZE, 1, &picked);
    node_set_ints(sq, "axes", 1, &one);
    Value *loss = unary_tmp(c, OP_NEG, finish(c, sq));
    Value *w = NULL;
    if (weight) {
        Value *wt[2] = {weight, tz};
        w = finish(c, emit_tmp(c, OP_GATHER, 2, wt));
    }
    if (valid) {
        Value *zero = const_scalar(c, x->dtype, 0);
        if (!w)
            w = const_scalar(c, x->dtype, 1);
        Value *w3[3] = {valid, w, zero};
        w = finish(c, emit_tmp(c, OP_WHERE, 3, w3));
    }
    if (w) {
        Value *lw[2] = {loss, w};
        loss = finish(c, red ? emit_tmp(c, OP_MUL, 2, lw) : emit(c, OP_MUL, 2, lw, out));
    } else if (!red) {
        Node *k = emit(c, OP_RESHAPE, 1, &loss, out);
        node_set_ints(k, "shape", loss->rank, loss->shape);
        finish(c, k);
    }
    if (!red)
        return;
    if (red == 2 && w) {
        Node *ls = emit_tmp(c, OP_REDUCE_SUM, 1, &loss);
        node_set_int(ls, "keep_dims", 0);
        Node *ws = emit_tmp(c, OP_REDUCE_SUM, 1, &w);
        node_set_int(ws, "keep_dims", 0);
        Value *ratio[2] = {finish(c, ls), finish(c, ws)};
        finish(c, emit(c, OP_DIV, 2, ratio, out));
        return;
    }
    Node *r = emit(c, red == 1 ? OP_REDUCE_SUM : OP_REDUCE_MEAN, 1, &loss, out);
    node_set_int(r, "keep_dims", 0);
    finish(c, r);
}

static void map_nll(Ctx *c, const OnnxOp *op) {
    (void)op;
    nll(c, in(c, 0), in(c, 1), in_opt(c, 2), out_name(c, 0));
}

/* SoftmaxCrossEntropyLoss: log_softmax over the classes (axis 1), then the
 * negative log-likelihood; the log-probabilities are the second output. */
static void map_sce(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0);
    Node *ls = *out_name(c, 1) ? emit(c, OP_LOG_SOFTMAX, 1, &x, out_name(c, 1))
                               : emit_tmp(c, OP_LOG_SOFTMAX, 1, &x);
    node_set_int(ls, "axis", 1);
    nll(c, finish(c, ls), in(c, 1), in_opt(c, 2), out_name(c, 0));
}

/* ReduceLogSum: log of the sum. */
static void map_reduce_log_sum(Ctx *c, const OnnxOp *op) {
    (void)op;
    const char *out = out_name(c, 0);
    /* map_reduce names its node after output 0: give it a temporary. */
    Onnx__NodeProto saved = *c->node;
    char *tmp = format("%s/sum", c->nname);
    char **outs = xcalloc(2, sizeof(char *));
    outs[0] = tmp;
    c->node->output = outs;
    OnnxOp sum = {"ReduceSum", NULL, OP_REDUCE_SUM, NULL};
    map_reduce(c, &sum);
    *c->node = saved;
    Value *s = map_get(&c->values, tmp);
    finish(c, emit(c, OP_LOG, 1, &s, out));
}

/* PRelu: where(x < 0, x * slope, x), the slope broadcast. */
static void map_prelu(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *ins[2] = {in(c, 0), in(c, 1)};
    /* Before opset 7 a slope of [C] applies per channel (axis 1). */
    Value *x = ins[0], *s = ins[1];
    if (c->opset < 7 && s->rank == 1 && x->rank > 2 && s->shape[0] == x->shape[1] &&
        s->shape[0] != x->shape[x->rank - 1]) {
        int64_t shape[MAX_RANK];
        shape[0] = s->shape[0];
        for (int i = 1; i < x->rank - 1; i++)
            shape[i] = 1;
        Node *k = emit_tmp(c, OP_RESHAPE, 1, &s);
        node_set_ints(k, "shape", x->rank - 1, shape);
        ins[1] = finish(c, k);
    }
    finish(c, emit(c, OP_PRELU, 2, ins, out_name(c, 0)));
}

static void map_unary_attr(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    copy_attrs(c, k, op->renames);
    finish(c, k);
}

static void map_scatter(Ctx *c, const OnnxOp *op) {
    Value *ins[3] = {in(c, 0), in(c, 1), in(c, 2)};
    Node *k = emit(c, op->kop, 3, ins, out_name(c, 0));
    node_set_int(k, "axis", oattr_int(c, "axis", 0));
    node_set_attr(k, "reduction", oattr_str(c, "reduction", "none"));
    finish(c, k);
}

/* DFT (opset 17: axis an attribute, default 1; dft_length an optional
 * constant input) and STFT (frame_step and frame_length constant inputs). */
static void map_dft(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    bool stft = op->kop == OP_STFT;
    Value *ins[2] = {x, stft ? in_opt(c, 2) : NULL};
    Node *k = emit(c, op->kop, ins[1] ? 2 : 1, ins, out_name(c, 0));
    if (stft) {
        int64_t step;
        const_ints(c, 1, "frame_step", &step, 1);
        node_set_int(k, "frame_step", step);
        if (in_opt(c, 3)) {
            int64_t len;
            const_ints(c, 3, "frame_length", &len, 1);
            node_set_int(k, "frame_length", len);
        }
        node_set_int(k, "onesided", oattr_int(c, "onesided", 1));
    } else {
        node_set_int(k, "axis", oattr_int(c, "axis", 1));
        node_set_int(k, "inverse", oattr_int(c, "inverse", 0));
        node_set_int(k, "onesided", oattr_int(c, "onesided", 0));
        if (in_opt(c, 1)) {
            int64_t len;
            const_ints(c, 1, "dft_length", &len, 1);
            node_set_int(k, "length", len);
        }
    }
    finish(c, k);
}

static void map_folded_only(Ctx *c, const OnnxOp *op) {
    for (int i = 0; i < nin(c); i++)
        in_const(c, i, format("every input of %s", op->name));
    node_fail(c, format("unsupported: this %s", op->name));
}

static const OnnxOp onnx_ops[] = {
    {"Abs", map_simple, OP_ABS, NULL},
    {"Acos", map_simple, OP_ACOS, NULL},
    {"Acosh", map_simple, OP_ACOSH, NULL},
    {"Add", map_simple, OP_ADD, NULL},
    {"And", map_simple, OP_AND, NULL},
    {"ArgMax", map_arg, OP_ARGMAX, NULL},
    {"ArgMin", map_arg, OP_ARGMIN, NULL},
    {"Asin", map_simple, OP_ASIN, NULL},
    {"Asinh", map_simple, OP_ASINH, NULL},
    {"Atan", map_simple, OP_ATAN, NULL},
    {"Atanh", map_simple, OP_ATANH, NULL},
    {"AveragePool", map_window, OP_AVG_POOL, "kernel_shape:kernel"},
    {"BatchNormalization", map_norm, OP_BATCH_NORM, NULL},
    {"BlackmanWindow", map_folded_only, OP_COUNT, NULL},
    {"Cast", map_cast, OP_CAST, NULL},
    {"CastLike", map_cast, OP_CAST, NULL},
    {"Ceil", map_simple, OP_CEIL, NULL},
    {"Celu", map_unary_attr, OP_CELU, NULL},
    {"Clip", map_clip, OP_CLIP, NULL},
    {"Concat", map_simple, OP_CONCAT, NULL},
    {"Constant", map_folded_only, OP_COUNT, NULL},
    {"ConstantOfShape", map_folded_only, OP_COUNT, NULL},
    {"Conv", map_window, OP_CONV, "kernel_shape:-"},
    {"ConvTranspose", map_window, OP_CONV_TRANSPOSE, "kernel_shape:-"},
    {"Cos", map_simple, OP_COS, NULL},
    {"Cosh", map_simple, OP_COSH, NULL},
    {"CumSum", map_cumsum, OP_CUMSUM, NULL},
    {"DFT", map_dft, OP_DFT, NULL},
    {"DepthToSpace", map_unary_attr, OP_DEPTH_TO_SPACE, "blocksize:block"},
    {"Div", map_simple, OP_DIV, NULL},
    {"Dropout", map_view, OP_RESHAPE, NULL},
    {"Elu", map_unary_attr, OP_ELU, NULL},
    {"Equal", map_simple, OP_EQ, NULL},
    {"Erf", map_simple, OP_ERF, NULL},
    {"Exp", map_simple, OP_EXP, NULL},
    {"Expand", map_expand_tile, OP_EXPAND, NULL},
    {"Flatten", map_view, OP_FLATTEN, NULL},
    {"Floor", map_simple, OP_FLOOR, NULL},
    {"Gather", map_gather, OP_GATHER, NULL},
    {"GatherElements", map_gather, OP_GATHER_ELEMENTS, NULL},
    {"Gemm", map_gemm, OP_GEMM, NULL},
    {"GlobalAveragePool", map_simple, OP_GLOBAL_AVG_POOL, NULL},
    {"GlobalMaxPool", map_simple, OP_GLOBAL_MAX_POOL, NULL},
    {"Greater", map_simple, OP_GT, NULL},
    {"GreaterOrEqual", map_simple, OP_GE, NULL},
    {"Hardmax", map_softmax, OP_ARGMAX, NULL},
    {"HammingWindow", map_folded_only, OP_COUNT, NULL},
    {"HannWindow", map_folded_only, OP_COUNT, NULL},
    {"HardSigmoid", map_unary_attr, OP_HARD_SIGMOID, NULL},
    {"HardSwish", map_simple, OP_HARD_SWISH, NULL},
    {"Identity", map_view, OP_RESHAPE, NULL},
    {"InstanceNormalization", map_norm, OP_INSTANCE_NORM, NULL},
    {"IsInf", map_unary_attr, OP_ISINF, NULL},
    {"IsNaN", map_simple, OP_ISNAN, NULL},
    {"LayerNormalization", map_norm, OP_LAYER_NORM, NULL},
    {"LeakyRelu", map_unary_attr, OP_LEAKY_RELU, NULL},
    {"Less", map_simple, OP_LT, NULL},
    {"LessOrEqual", map_simple, OP_LE, NULL},
    {"Log", map_simple, OP_LOG, NULL},
    {"LogSoftmax", map_softmax, OP_LOG_SOFTMAX, NULL},
    {"MatMul", map_simple, OP_MATMUL, NULL},
    {"Max", map_variadic, OP_MAX, NULL},
    {"MaxPool", map_window, OP_MAX_POOL, "kernel_shape:kernel storage_order:-"},
    {"Mean", map_variadic, OP_ADD, NULL},
    {"MelWeightMatrix", map_folded_only, OP_COUNT, NULL},
    {"Min", map_variadic, OP_MIN, NULL},
    {"Mod", map_simple, OP_MOD, NULL},
    {"Mul", map_simple, OP_MUL, NULL},
    {"Neg", map_simple, OP_NEG, NULL},
    {"NegativeLogLikelihoodLoss", map_nll, OP_NEG, NULL},
    {"Not", map_simple, OP_NOT, NULL},
    {"OneHot", map_onehot, OP_ONE_HOT, NULL},
    {"Or", map_simple, OP_OR, NULL},
    {"PRelu", map_prelu, OP_PRELU, NULL},
    {"Pad", map_pad, OP_PAD, NULL},
    {"Pow", map_pow, OP_POW, NULL},
    {"Range", map_folded_only, OP_COUNT, NULL},
    {"Reciprocal", map_simple, OP_RECIPROCAL, NULL},
    {"ReduceL1", map_reduce, OP_REDUCE_L1, NULL},
    {"ReduceL2", map_reduce, OP_REDUCE_L2, NULL},
    {"ReduceLogSumExp", map_reduce, OP_REDUCE_LOG_SUM_EXP, NULL},
    {"ReduceLogSum", map_reduce_log_sum, OP_LOG, NULL},
    {"ReduceMax", map_reduce, OP_REDUCE_MAX, NULL},
    {"ReduceMean", map_reduce, OP_REDUCE_MEAN, NULL},
    {"ReduceMin", map_reduce, OP_REDUCE_MIN, NULL},
    {"ReduceProd", map_reduce, OP_REDUCE_PROD, NULL},
    {"ReduceSum", map_reduce, OP_REDUCE_SUM, NULL},
    {"ReduceSumSquare", map_reduce, OP_REDUCE_SUM_SQUARE, NULL},
    {"Relu", map_simple, OP_RELU, NULL},
    {"Reshape", map_view, OP_RESHAPE, NULL},
    {"Resize", map_resize, OP_RESIZE, NULL},
    {"Round", map_simple, OP_ROUND, NULL},
    {"Scatter", map_scatter, OP_SCATTER_ELEMENTS, NULL},
    {"ScatterElements", map_scatter, OP_SCATTER_ELEMENTS, NULL},
    {"Selu", map_unary_attr, OP_SELU, NULL},
    {"Shape", map_folded_only, OP_COUNT, NULL},
    {"Shrink", map_unary_attr, OP_SHRINK, NULL},
    {"Sigmoid", map_simple, OP_SIGMOID, NULL},
    {"Sign", map_simple, OP_SIGN, NULL},
    {"Sin", map_simple, OP_SIN, NULL},
    {"Sinh", map_simple, OP_SINH, NULL},
    {"Size", map_folded_only, OP_COUNT, NULL},
    {"Slice", map_slice, OP_SLICE, NULL},
    {"Softmax", map_softmax, OP_SOFTMAX, NULL},
    {"SoftmaxCrossEntropyLoss", map_sce, OP_LOG_SOFTMAX, NULL},
    {"Softplus", map_simple, OP_SOFTPLUS, NULL},
    {"Softsign", map_simple, OP_SOFTSIGN, NULL},
    {"SpaceToDepth", map_unary_attr, OP_SPACE_TO_DEPTH, "blocksize:block"},
    {"Split", map_split, OP_SPLIT, NULL},
    {"Sqrt", map_simple, OP_SQRT, NULL},
    {"Squeeze", map_view, OP_SQUEEZE, NULL},
    {"STFT", map_dft, OP_STFT, NULL},
    {"Sub", map_simple, OP_SUB, NULL},
    {"Sum", map_variadic, OP_ADD, NULL},
    {"Tan", map_simple, OP_TAN, NULL},
    {"Tanh", map_simple, OP_TANH, NULL},
    {"ThresholdedRelu", map_unary_attr, OP_THRESHOLDED_RELU, NULL},
    {"Tile", map_expand_tile, OP_TILE, NULL},
    {"TopK", map_topk, OP_TOPK, NULL},
    {"Transpose", map_simple, OP_TRANSPOSE, NULL},
    {"Trilu", map_trilu, OP_TRILU, NULL},
    {"Unsqueeze", map_view, OP_UNSQUEEZE, NULL},
    {"Upsample", map_resize, OP_RESIZE, NULL},
    {"Where", map_simple, OP_WHERE, NULL},
    {"Xor", map_simple, OP_XOR, NULL},
};

const OnnxOp *find_mapper(const char *name) {
    for (size_t i = 0; i < sizeof onnx_ops / sizeof onnx_ops[0]; i++)
        if (strcmp(onnx_ops[i].name, name) == 0)
            return &onnx_ops[i];
    return NULL;
}

void map_node(Ctx *c) {
    check_op_version(c);
    if (fold(c))
        return;
    const OnnxOp *op = find_mapper(c->node->op_type);
    op->fn(c, op);
}
