/*
 * onnx_map_math.c: ONNX arithmetic, rows, normalization, losses, resampling
 * and signal ops: Clip, Cast, Pow, PRelu, Softmax, reductions, ArgMax,
 * Gemm, the norms, TopK, CumSum, the losses, Resize, windows, DFT
 */
#include "onnx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void map_clip(Ctx *c, const OnnxOp *op) {
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

void map_cast(Ctx *c, const OnnxOp *op) {
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

/* Pow: the exponent may have another dtype; integers compute in f32. */
void map_pow(Ctx *c, const OnnxOp *op) {
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

/* PRelu: where(x < 0, x * slope, x), the slope broadcast. */
void map_prelu(Ctx *c, const OnnxOp *op) {
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

/* Softmax, LogSoftmax, Hardmax. Before opset 13 they act on the input
 * flattened to 2-D at axis (default 1); from 13 on one axis (default -1).
 * f16 inputs (a model exported in halves) are read as they are: the
 * kernels compute in f32 and store f16. */
void map_softmax(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    bool old = c->opset < 13;
    int64_t axis = oattr_int(c, "axis", old ? 1 : -1);
    if (axis < -x->rank || axis >= (x->rank ? x->rank : 1))
        node_fail(c, format("axis %lld is out of range", (long long)axis));
    if (axis < 0)
        axis += x->rank;
    Value *src = x;
    bool reshaped = old && axis != x->rank - 1;
    if (reshaped) {
        Node *r = emit_tmp(c, OP_RESHAPE, 1, &src);
        int64_t shape[2] = {shape_count((int)axis, x->shape),
                            shape_count(x->rank - (int)axis, x->shape + axis)};
        node_set_ints(r, "shape", 2, shape);
        src = finish(c, r);
        axis = 1;
    }
    /* Hardmax's one_hot writes f32: of f16 values, cast back last */
    bool cast = strcmp(op->name, "Hardmax") == 0 && x->dtype != KILN_DTYPE_F32;
    bool tmp = reshaped || cast; /* the ONNX output comes after this node */
    Value *y;
    if (strcmp(op->name, "Hardmax") == 0) {
        Node *am = emit_tmp(c, OP_ARGMAX, 1, &src);
        node_set_int(am, "axis", axis);
        node_set_int(am, "keep_dims", 0);
        Value *idx = finish(c, am);
        Node *oh = tmp ? emit_tmp(c, OP_ONE_HOT, 1, &idx)
                       : emit(c, OP_ONE_HOT, 1, &idx, out_name(c, 0));
        node_set_int(oh, "depth", src->shape[axis]);
        node_set_int(oh, "axis", axis);
        y = finish(c, oh);
    } else {
        Node *k = tmp ? emit_tmp(c, op->kop, 1, &src) : emit(c, op->kop, 1, &src, out_name(c, 0));
        node_set_int(k, "axis", axis);
        y = finish(c, k);
    }
    if (reshaped) {
        Node *r = cast ? emit_tmp(c, OP_RESHAPE, 1, &y) : emit(c, OP_RESHAPE, 1, &y, out_name(c, 0));
        node_set_ints(r, "shape", x->rank, x->shape);
        y = finish(c, r);
    }
    if (cast)
        output_as(c, y, x->dtype);
}

/* ReduceX: axes from the attribute, or (ReduceSum from 13, the rest from 18)
 * from the second input; noop_with_empty_axes keeps the input. */
void map_reduce(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    int64_t axes[MAX_RANK];
    int n = -1;
    Onnx__AttributeProto *a = oattr_ints(c, "axes");
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
    /* ReduceMax and ReduceMin of bools (20): any and all, over 0 and 1 in
     * f32; an empty set's -inf (max) and +inf (min) become false and true,
     * as ONNX defines them */
    bool logical = x->dtype == KILN_DTYPE_BOOL &&
                   (op->kop == OP_REDUCE_MAX || op->kop == OP_REDUCE_MIN);
    if (logical && onnx_op_version(op->name, c->opset) < 20)
        node_fail(c, format("%s %lld reduces numbers, not bools (bools from version 20)",
                            op->name, (long long)onnx_op_version(op->name, c->opset)));
    Value *src = logical ? cast_to(c, x, KILN_DTYPE_F32) : x;
    Node *k = logical ? emit_tmp(c, op->kop, 1, &src) : emit(c, op->kop, 1, &src, out_name(c, 0));
    if (n > 0)
        node_set_ints(k, "axes", n, axes);
    node_set_int(k, "keep_dims", oattr_int(c, "keepdims", 1));
    Value *r = finish(c, k);
    if (logical) {
        Value *ins[2] = {r, const_scalar(c, KILN_DTYPE_F32, 0.5)};
        finish(c, emit(c, OP_GT, 2, ins, out_name(c, 0)));
    }
}

void map_arg(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    node_set_int(k, "axis", oattr_int(c, "axis", 0));
    node_set_int(k, "keep_dims", oattr_int(c, "keepdims", 1));
    node_set_int(k, "select_last_index", oattr_int(c, "select_last_index", 0));
    finish(c, k);
}

void map_gemm(Ctx *c, const OnnxOp *op) {
    Value *ins[3] = {in(c, 0), in(c, 1), in_opt(c, 2)};
    Node *k = emit(c, op->kop, ins[2] ? 3 : 2, ins, out_name(c, 0));
    copy_attrs(c, k, "transA:trans_a transB:trans_b broadcast:-");
    finish(c, k);
}

void map_norm(Ctx *c, const OnnxOp *op) {
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

void map_topk(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit_outputs(c, op->kop, x, 2);
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

/* NonMaxSuppression: kiln's nms, its thresholds and maximum constants.
 * How many rows it selects is known only at run time: the output has room
 * for the most (batches * classes * min(max_output_boxes_per_class,
 * boxes)), rows past the selection are -1, and kiln adds an output after
 * the graph's own, '<output>.count' (i64 [1]), the number selected. */
void map_nms(Ctx *c, const OnnxOp *op) {
    Value *ins[2] = {in(c, 0), in(c, 1)};
    int64_t most = 0;
    if (in_opt(c, 2) && vcount(in_const(c, 2, "max_output_boxes_per_class")) > 0)
        const_ints(c, 2, "max_output_boxes_per_class", &most, 1);
    if (most < 1)
        node_fail(c, format("unsupported: max_output_boxes_per_class %lld selects no box",
                            (long long)most));
    Node *k = emit(c, op->kop, 2, ins, out_name(c, 0));
    node_set_int(k, "max_per_class", most);
    const char *names[2] = {"iou_threshold", "score_threshold"};
    for (int i = 0; i < 2; i++) {
        Value *v = in_opt(c, 3 + i);
        if (!v || vcount(in_const(c, 3 + i, names[i])) == 0)
            continue;
        if (vcount(v) != 1)
            node_fail(c, format("%s must hold one value, it has %lld", names[i],
                                (long long)vcount(v)));
        node_set_float(k, names[i], vget(v, 0));
    }
    node_set_int(k, "center_point_box", oattr_int(c, "center_point_box", 0));
    Tensor *count = graph_tensor(c->g, format("%s.count", out_name(c, 0)), T_VALUE, c->loc);
    node_add_output(k, count);
    vec_push(&c->extra_outputs, count);
    finish(c, k);
}

void map_cumsum(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    int64_t axis;
    const_ints(c, 1, "axis", &axis, 1);
    node_set_int(k, "axis", axis);
    node_set_int(k, "exclusive", oattr_int(c, "exclusive", 0));
    node_set_int(k, "reverse", oattr_int(c, "reverse", 0));
    finish(c, k);
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

void map_nll(Ctx *c, const OnnxOp *op) {
    (void)op;
    nll(c, in(c, 0), in(c, 1), in_opt(c, 2), out_name(c, 0));
}

/* SoftmaxCrossEntropyLoss: log_softmax over the classes (axis 1), then the
 * negative log-likelihood; the log-probabilities are the second output. */
void map_sce(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0);
    Node *ls = *out_name(c, 1) ? emit(c, OP_LOG_SOFTMAX, 1, &x, out_name(c, 1))
                               : emit_tmp(c, OP_LOG_SOFTMAX, 1, &x);
    node_set_int(ls, "axis", 1);
    nll(c, finish(c, ls), in(c, 1), in_opt(c, 2), out_name(c, 0));
}

/* ReduceLogSum: log of the sum. */
void map_reduce_log_sum(Ctx *c, const OnnxOp *op) {
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

/* ONNX's ints attribute `name` (n values, one per spatial axis), or dflt
 * for each when absent. */
static void spatial_ints(Ctx *c, const char *name, int n, int64_t dflt, int64_t *out) {
    Onnx__AttributeProto *a = oattr_ints(c, name);
    if (a && (int)a->n_ints != n)
        node_fail(c, format("%s has %zu values for %d spatial axes", name, a->n_ints, n));
    for (int i = 0; i < n; i++)
        out[i] = a ? a->ints[i] : dflt;
}

/* ConvTranspose with output_shape: the pads that give that shape, as ONNX's
 * reference computes them (the total split in half, the odd one at the end,
 * or at the beginning with SAME_UPPER); a negative end pad, more output
 * than the convolution covers, becomes output_padding. */
static void conv_transpose_to_shape(Ctx *c, const OnnxOp *op, Value **ins) {
    Value *x = ins[0], *w = ins[1];
    int nsp = x->rank - 2;
    if (nsp < 1 || !w || w->rank != x->rank)
        node_fail(c, "ConvTranspose needs an input and weights of the same rank, 3 or more");
    Onnx__AttributeProto *os = oattr_ints(c, "output_shape");
    int skip = (int)os->n_ints == x->rank ? 2 : 0; /* the whole shape, or its spatial part */
    if ((int)os->n_ints != nsp + skip)
        node_fail(c, format("output_shape has %zu values for %d spatial axes", os->n_ints,
                            nsp));
    int64_t stride[MAX_RANK], dil[MAX_RANK], outpad[MAX_RANK], kernel[MAX_RANK];
    int64_t pads[2 * MAX_RANK];
    spatial_ints(c, "strides", nsp, 1, stride);
    spatial_ints(c, "dilations", nsp, 1, dil);
    spatial_ints(c, "output_padding", nsp, 0, outpad);
    spatial_ints(c, "kernel_shape", nsp, 0, kernel);
    bool upper = strcmp(oattr_str(c, "auto_pad", "NOTSET"), "SAME_UPPER") == 0;
    for (int i = 0; i < nsp; i++) {
        int64_t k = kernel[i] ? kernel[i] : w->shape[2 + i];
        int64_t total = stride[i] * (x->shape[2 + i] - 1) + outpad[i] + (k - 1) * dil[i] + 1 -
                        os->ints[skip + i];
        int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2); /* floor */
        pads[i] = upper ? half : total - half;
        pads[nsp + i] = total - pads[i];
        if (pads[i] < 0)
            node_fail(c, format("unsupported: output_shape %lld on spatial axis %d needs output "
                                "before the first input position", (long long)os->ints[skip + i],
                                i));
        if (pads[nsp + i] < 0) {
            outpad[i] -= pads[nsp + i];
            pads[nsp + i] = 0;
        }
    }
    Node *k = emit(c, op->kop, ins[2] ? 3 : 2, ins, out_name(c, 0));
    copy_attrs(c, k, "kernel_shape:- output_shape:- auto_pad:- pads:- output_padding:-");
    node_set_ints(k, "pads", 2 * nsp, pads);
    node_set_ints(k, "output_padding", nsp, outpad);
    finish(c, k);
}

/* Conv, ConvTranspose, MaxPool, AveragePool: attributes renamed. */
void map_window(Ctx *c, const OnnxOp *op) {
    Value *ins[3] = {in(c, 0), in_opt(c, 1), in_opt(c, 2)};
    if (op->kop == OP_MAX_POOL && nout(c) > 1 && *out_name(c, 1)) {
        /* with its indices: kiln's max_pool of two outputs, f32 */
        if (ins[0]->dtype != KILN_DTYPE_F32)
            node_fail(c, format("unsupported: the indices output of MaxPool of %s (f32 only)",
                                kiln_dtype_name(ins[0]->dtype)));
        Node *k = emit_outputs(c, op->kop, ins[0], 2);
        copy_attrs(c, k, op->renames);
        finish(c, k);
        return;
    }
    if (op->kop == OP_CONV_TRANSPOSE && oattr(c, "output_shape")) {
        conv_transpose_to_shape(c, op, ins);
        return;
    }
    int n = op->kop == OP_CONV || op->kop == OP_CONV_TRANSPOSE ? (ins[2] ? 3 : 2) : 1;
    kiln_dtype dt = ins[0]->dtype;
    if (op->kop == OP_MAX_POOL && dt != KILN_DTYPE_F32 && dt != KILN_DTYPE_F16 &&
        dt != KILN_DTYPE_I64) {
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

/* LpPool: (the sum of |x|^p over each window)^(1/p), the padding adding
 * nothing: a depthwise convolution of |x|^p with a kernel of ones takes the
 * window's pads, strides, dilations and auto_pad as they are. Version 1's p
 * is a float (a whole number here); 2 and later an int. */
void map_lp_pool(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = cast_to(c, in(c, 0), KILN_DTYPE_F32);
    int64_t p = 2;
    if (onnx_op_version("LpPool", c->opset) >= 2) {
        p = oattr_int(c, "p", 2);
    } else {
        double pf = oattr_float(c, "p", 2.0);
        if (pf != floor(pf) || pf < 1 || pf > 64)
            node_fail(c, format("unsupported: LpPool 1's p %g (kiln takes whole numbers from 1)",
                                pf));
        p = (int64_t)pf;
    }
    if (p < 1)
        node_fail(c, format("LpPool's p must be at least 1, not %lld", (long long)p));
    if (oattr_int(c, "ceil_mode", 0))
        node_fail(c, "unsupported: ceil_mode (LpPool 18)");
    Onnx__AttributeProto *ks = oattr_ints(c, "kernel_shape");
    int nsp = x->rank - 2;
    if (nsp < 1 || !ks || (int)ks->n_ints != nsp)
        node_fail(c, format("LpPool needs kernel_shape of %d values for an input %s", nsp,
                            shape_str(x->rank, x->shape)));
    int64_t wshape[MAX_RANK] = {x->shape[1], 1};
    for (int i = 0; i < nsp; i++)
        wshape[2 + i] = ks->ints[i];
    Value *ones = new_value(format("%s/ones", c->nname), KILN_DTYPE_F32, x->rank, wshape, true);
    for (int64_t i = 0; i < vcount(ones); i++)
        vset(ones, i, 1.0);
    Value *ins[2] = {p == 2 ? binary_tmp(c, OP_MUL, x, x) : unary_tmp(c, OP_ABS, x), ones};
    if (p > 2)
        ins[0] = binary_tmp(c, OP_POW, ins[0], const_scalar(c, KILN_DTYPE_F32, (double)p));
    Node *k = emit_tmp(c, OP_CONV, 2, ins);
    copy_attrs(c, k, "kernel_shape:- p:- ceil_mode:-");
    node_set_int(k, "group", x->shape[1]);
    Value *s = finish(c, k);
    Value *y = p == 1 ? s : p == 2 ? unary_tmp(c, OP_SQRT, s)
                                   : binary_tmp(c, OP_POW, s,
                                                const_scalar(c, KILN_DTYPE_F32, 1.0 / (double)p));
    output_as(c, y, in(c, 0)->dtype);
}

void map_resize(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    const char *mode = oattr_str(c, "mode", "nearest");
    if (strcmp(mode, "nearest") != 0 && strcmp(mode, "linear") != 0 &&
        strcmp(mode, "cubic") != 0)
        node_fail(c, format("unsupported: mode %s", mode));
    node_set_attr(k, "mode", mode);
    node_set_float(k, "cubic_coeff_a", oattr_float(c, "cubic_coeff_a", -0.75));
    node_set_int(k, "exclude_outside", oattr_int(c, "exclude_outside", 0) != 0);
    int scales_at = c->opset < 11 || strcmp(op->name, "Upsample") == 0 ? 1 : 2;
    Value *sizes = scales_at == 2 ? in_opt(c, 3) : NULL;
    Value *scales = in_opt(c, scales_at);
    if (scales && vcount(scales) == 0)
        scales = NULL;
    /* axes (18): the axes that roi, scales and sizes list; the others keep
     * their size */
    int64_t axes[MAX_RANK];
    int naxes = x->rank;
    Onnx__AttributeProto *ax = oattr_ints(c, "axes");
    if (ax && (int)ax->n_ints > x->rank)
        node_fail(c, format("%zu axes for an input of rank %d", ax->n_ints, x->rank));
    if (ax)
        naxes = (int)ax->n_ints;
    for (int i = 0; i < naxes; i++) {
        axes[i] = ax ? ax->ints[i] : i;
        if (axes[i] < -x->rank || axes[i] >= x->rank)
            node_fail(c, format("axis %lld is out of range for rank %d", (long long)axes[i],
                                x->rank));
        axes[i] = axes[i] < 0 ? axes[i] + x->rank : axes[i];
        for (int j = 0; j < i; j++)
            if (axes[j] == axes[i])
                node_fail(c, format("axis %lld appears twice in axes", (long long)axes[i]));
    }
    double f[MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        f[i] = 1.0;
    if (sizes && vcount(sizes) > 0) {
        int64_t v[MAX_RANK], out[MAX_RANK];
        if (const_ints(c, 3, "sizes", v, MAX_RANK) != naxes)
            node_fail(c, format("sizes has %lld values for %d axes", (long long)vcount(sizes),
                                naxes));
        memcpy(out, x->shape, sizeof(int64_t) * (size_t)x->rank);
        for (int i = 0; i < naxes; i++)
            out[axes[i]] = v[i];
        /* keep_aspect_ratio_policy (18): one scale for every listed axis, the
         * smallest (not_larger) or largest (not_smaller) of sizes / input;
         * each size that scale times the input rounded half up, and the
         * coordinates mapped by the scale itself (both given to resize) */
        const char *policy = oattr_str(c, "keep_aspect_ratio_policy", "stretch");
        bool larger = strcmp(policy, "not_smaller") == 0;
        if (larger || strcmp(policy, "not_larger") == 0) {
            double scale = 0;
            for (int i = 0; i < naxes; i++) {
                double s = (double)v[i] / (double)x->shape[axes[i]];
                scale = i == 0 || (larger ? s > scale : s < scale) ? s : scale;
            }
            for (int i = 0; i < naxes; i++) {
                f[axes[i]] = scale;
                out[axes[i]] = (int64_t)(scale * (double)x->shape[axes[i]] + 0.5);
            }
            node_set_floats(k, "scales", x->rank, f);
        } else if (strcmp(policy, "stretch") != 0) {
            node_fail(c, format("keep_aspect_ratio_policy must be stretch, not_larger or "
                                "not_smaller, not '%s'", policy));
        }
        node_set_ints(k, "sizes", x->rank, out);
    } else if (scales) {
        in_const(c, scales_at, "scales");
        if (vcount(scales) != naxes)
            node_fail(c, format("scales has %lld values for %d axes", (long long)vcount(scales),
                                naxes));
        for (int i = 0; i < naxes; i++)
            f[axes[i]] = vget(scales, i);
        node_set_floats(k, "scales", x->rank, f);
    } else {
        node_fail(c, "Resize needs scales or sizes");
    }
    const char *coord = oattr_str(c, "coordinate_transformation_mode",
                                  c->opset < 11 ? "asymmetric" : "half_pixel");
    if (strcmp(coord, "tf_crop_and_resize") == 0) { /* roi: a constant input */
        Value *roi = in_opt(c, 1);
        if (!roi || vcount(in_const(c, 1, "roi")) != 2 * naxes)
            node_fail(c, format("tf_crop_and_resize needs roi of %d values", 2 * naxes));
        double r[2 * MAX_RANK];
        for (int i = 0; i < x->rank; i++) {
            r[i] = 0.0;
            r[x->rank + i] = 1.0;
        }
        for (int i = 0; i < naxes; i++) {
            r[axes[i]] = vget(roi, i);
            r[x->rank + axes[i]] = vget(roi, naxes + i);
        }
        node_set_floats(k, "roi", 2 * x->rank, r);
        node_set_float(k, "extrapolation_value", oattr_float(c, "extrapolation_value", 0));
    }
    node_set_attr(k, "coordinate_transformation_mode", coord);
    node_set_attr(k, "nearest_mode", oattr_str(c, "nearest_mode", c->opset < 11 ? "floor"
                                                                               : "round_prefer_floor"));
    if (oattr_int(c, "antialias", 0))
        node_fail(c, "unsupported: antialias");
    finish(c, k);
}

/* GridSample: version 16 names its modes bilinear, nearest, bicubic (for
 * [N, C, H, W] only); 20 and later linear, nearest, cubic, for 1 to 3
 * spatial axes in kiln. */
void map_grid_sample(Ctx *c, const OnnxOp *op) {
    Value *ins[2] = {in(c, 0), in(c, 1)};
    bool v16 = onnx_op_version("GridSample", c->opset) < 20;
    const char *mode = oattr_str(c, "mode", v16 ? "bilinear" : "linear");
    const char *const names16[] = {"nearest", "bilinear", "bicubic"};
    const char *const *names = v16 ? names16 : resize_modes;
    int m = 0;
    while (m < 3 && strcmp(mode, names[m]) != 0)
        m++;
    if (m == 3)
        node_fail(c, format("unsupported: mode %s (GridSample %d takes %s, %s or %s)", mode,
                            (int)onnx_op_version("GridSample", c->opset), names[0], names[1], names[2]));
    if (v16 && ins[0]->rank != 4)
        node_fail(c, format("GridSample version 16 needs X of rank 4, got %s",
                            shape_str(ins[0]->rank, ins[0]->shape)));
    Node *k = emit(c, op->kop, 2, ins, out_name(c, 0));
    node_set_attr(k, "mode", resize_modes[m]);
    node_set_attr(k, "padding_mode", oattr_str(c, "padding_mode", "zeros"));
    node_set_int(k, "align_corners", oattr_int(c, "align_corners", 0) != 0);
    finish(c, k);
}

/* BitShift: direction LEFT or RIGHT; unsigned integers (u8 in kiln), and
 * from version 28 signed ones (i8, i32, i64: kiln's shifts define every
 * amount as 28 does). */
void map_bit_shift(Ctx *c, const OnnxOp *op) {
    (void)op;
    const char *dir = oattr_str(c, "direction", "");
    bool left = strcmp(dir, "LEFT") == 0;
    if (!left && strcmp(dir, "RIGHT") != 0)
        node_fail(c, format("BitShift's direction must be LEFT or RIGHT, not '%s'", dir));
    Value *ins[2] = {in(c, 0), in(c, 1)};
    if (onnx_op_version("BitShift", c->opset) < 28 && ins[0]->dtype != KILN_DTYPE_U8)
        node_fail(c, format("BitShift %lld shifts unsigned integers, not %s (signed ones "
                            "from version 28)", (long long)onnx_op_version("BitShift", c->opset),
                            kiln_dtype_name(ins[0]->dtype)));
    finish(c, emit(c, left ? OP_SHIFT_LEFT : OP_SHIFT_RIGHT, 2, ins, out_name(c, 0)));
}

/* RoiAlign: version 10 has no coordinate_transformation_mode and reads
 * regions as output_half_pixel does; 16 adds it, half_pixel by default. */
void map_roi_align(Ctx *c, const OnnxOp *op) {
    Value *ins[3] = {in(c, 0), in(c, 1), in(c, 2)};
    Node *k = emit(c, op->kop, 3, ins, out_name(c, 0));
    copy_attrs(c, k, op->renames);
    if (onnx_op_version("RoiAlign", c->opset) < 16)
        node_set_attr(k, "coordinate_transformation_mode", "output_half_pixel");
    finish(c, k);
}

/* AffineGrid (20): theta [N, 2, 3] or [N, 3, 4] and a constant size [N, C,
 * H, W] or [N, C, D, H, W] give the grid [N, H, W, 2] or [N, D, H, W, 3]
 * that GridSample reads: a constant table of each output position's
 * normalized coordinates (x, y[, z], 1) times theta transposed, one
 * batched matmul. */
void map_affine_grid(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *theta = in(c, 0);
    int64_t size[5];
    int n = const_ints(c, 1, "size", size, 5);
    int r = n - 2;
    if (r != 2 && r != 3)
        node_fail(c, format("AffineGrid's size must have 4 or 5 values, got %d", n));
    if (theta->dtype != KILN_DTYPE_F32 || theta->rank != 3 || theta->shape[0] != size[0] ||
        theta->shape[1] != r || theta->shape[2] != r + 1)
        node_fail(c, format("AffineGrid's theta must be f32 [%lld, %d, %d] for size of %d "
                            "values, got %s %s", (long long)size[0], r, r + 1, n,
                            kiln_dtype_name(theta->dtype), shape_str(theta->rank, theta->shape)));
    bool align = oattr_int(c, "align_corners", 0) != 0;
    int64_t points = 1;
    for (int i = 2; i < n; i++) {
        if (size[i] < 1)
            node_fail(c, format("AffineGrid's size %lld is not positive", (long long)size[i]));
        points *= size[i];
    }
    if (points > MAX_CONST_FOLD)
        node_fail(c, format("unsupported: AffineGrid of %lld positions (at most %d)",
                            (long long)points, MAX_CONST_FOLD));
    int64_t bshape[2] = {points, r + 1};
    Value *base = new_value(format("%s/base", c->nname), KILN_DTYPE_F32, 2, bshape, true);
    for (int64_t p = 0; p < points; p++) {
        int64_t rest = p;
        for (int i = n - 1; i >= 2; i--) { /* the last axis is x, the first coordinate */
            int64_t len = size[i], at = rest % len;
            rest /= len;
            double v = align ? (len > 1 ? -1.0 + 2.0 * (double)at / (double)(len - 1) : -1.0)
                             : (2.0 * (double)at + 1.0) / (double)len - 1.0;
            vset(base, p * (r + 1) + (n - 1 - i), (float)v);
        }
        vset(base, p * (r + 1) + r, 1.0);
    }
    Value *ins[2] = {base, transposed(c, theta, 3, (int64_t[]){0, 2, 1})};
    Value *prod = finish(c, emit_tmp(c, OP_MATMUL, 2, ins));
    int64_t shape[5] = {size[0]};
    for (int i = 2; i < n; i++)
        shape[i - 1] = size[i];
    shape[n - 1] = r;
    Node *k = emit(c, OP_RESHAPE, 1, &prod, out_name(c, 0));
    node_set_ints(k, "shape", n, shape);
    finish(c, k);
}

/* DFT (opset 17: axis an attribute, default 1; dft_length an optional
 * constant input) and STFT (frame_step and frame_length constant inputs). */
void map_dft(Ctx *c, const OnnxOp *op) {
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
        /* DFT 20: the axis is an input (a constant here), -2 by default */
        int64_t axis = 1;
        if (onnx_op_version("DFT", c->opset) >= 20) {
            axis = -2;
            if (in_opt(c, 2))
                const_ints(c, 2, "axis", &axis, 1);
        } else {
            axis = oattr_int(c, "axis", 1);
        }
        node_set_int(k, "axis", axis);
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

/* Gelu-20: approximate "none" (erf) or "tanh". */
void map_gelu(Ctx *c, const OnnxOp *op) {
    (void)op;
    const char *a = oattr_str(c, "approximate", "none");
    OpKind kop = strcmp(a, "none") == 0 ? OP_GELU : strcmp(a, "tanh") == 0 ? OP_GELU_TANH
                                                                          : OP_COUNT;
    if (kop == OP_COUNT)
        node_fail(c, format("unsupported: approximate '%s' (ONNX defines none and tanh)", a));
    Value *x = in(c, 0);
    finish(c, emit(c, kop, 1, &x, out_name(c, 0)));
}

/* Mish (x * tanh(softplus(x))) and Swish (x * sigmoid(alpha * x)): their
 * elementwise parts, which the fusion pass joins into one kernel. */
void map_mish_swish(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0), *gate = NULL;
    bool glu = strcmp(op->name, "SwiGLU") == 0;
    if (strcmp(op->name, "Mish") == 0) {
        gate = unary_tmp(c, OP_TANH, unary_tmp(c, OP_SOFTPLUS, x));
    } else {
        double alpha = oattr_float(c, "alpha", 1.0);
        if (alpha != 1.0)
            gate = unary_tmp(c, OP_SIGMOID, binary_tmp(c, OP_MUL, x, const_scalar(c, x->dtype,
                                                                                    alpha)));
    }
    if (!glu) {
        Value *ins[2] = {x, gate};
        finish(c, emit(c, gate ? OP_MUL : OP_SILU, gate ? 2 : 1, ins, out_name(c, 0)));
        return;
    }
    /* SwiGLU (28): Swish(A) * B, A and B of one shape (no broadcasting) */
    Value *b = in(c, 1);
    if (b->rank != x->rank || shape_count(x->rank, x->shape) != shape_count(b->rank, b->shape) ||
        memcmp(x->shape, b->shape, sizeof(int64_t) * (size_t)x->rank) != 0)
        node_fail(c, format("SwiGLU's A %s and B %s must have one shape",
                            shape_str(x->rank, x->shape), shape_str(b->rank, b->shape)));
    Value *ins[2] = {gate ? binary_tmp(c, OP_MUL, x, gate) : unary_tmp(c, OP_SILU, x), b};
    finish(c, emit(c, OP_MUL, 2, ins, out_name(c, 0)));
}

/* LpNormalization: x / ||x||_p along one axis (p 1 or 2); where the norm
 * is zero (x too), 0, as ONNX's reference gives. */
void map_lp_norm(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0);
    int64_t axis = oattr_int(c, "axis", -1), p = oattr_int(c, "p", 2);
    if (p != 1 && p != 2)
        node_fail(c, format("LpNormalization's p must be 1 or 2, not %lld", (long long)p));
    if (axis < -x->rank || axis >= x->rank)
        node_fail(c, format("axis %lld is out of range for rank %d", (long long)axis, x->rank));
    Node *r = emit_tmp(c, p == 1 ? OP_REDUCE_L1 : OP_REDUCE_L2, 1, &x);
    node_set_ints(r, "axes", 1, &axis);
    Value *norm = finish(c, r);
    Value *zero = binary_tmp(c, OP_EQ, norm, const_scalar(c, norm->dtype, 0.0));
    Value *pick[3] = {zero, const_scalar(c, norm->dtype, 1.0), norm};
    Value *pair[2] = {x, finish(c, emit_tmp(c, OP_WHERE, 3, pick))};
    finish(c, emit(c, OP_DIV, 2, pair, out_name(c, 0)));
}

/* GroupNormalization: version 21 scales and shifts per channel (kiln's
 * group_norm); version 18 per group, its scale and bias constants that are
 * repeated here for each channel of the group. */
void map_group_norm(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0);
    if (oattr_int(c, "stash_type", 1) != 1)
        node_fail(c, "unsupported: stash_type other than float");
    int64_t groups = oattr_int(c, "num_groups", 0);
    if (x->rank < 3 || groups < 1 || x->shape[1] % groups)
        node_fail(c, format("num_groups %lld must divide the channels of an [N, C, ...] input, "
                            "here %s", (long long)groups, shape_str(x->rank, x->shape)));
    Value *ins[3] = {x, in(c, 1), in(c, 2)};
    if (onnx_op_version("GroupNormalization", c->opset) < 21) {
        int64_t C = x->shape[1], per = C / groups;
        for (int i = 1; i < 3; i++) {
            Value *g = in_const(c, i, "scale and bias of GroupNormalization-18");
            if (vcount(g) != groups)
                node_fail(c, format("input %d holds %lld values, not one per group (%lld)", i,
                                    (long long)vcount(g), (long long)groups));
            Value *ch = new_value(format("%s/per_channel%d", c->nname, i), g->dtype, 1, &C, true);
            for (int64_t k = 0; k < C; k++)
                vset(ch, k, vget(g, k / per));
            ins[i] = ch;
        }
    }
    Node *k = emit(c, OP_GROUP_NORM, 3, ins, out_name(c, 0));
    node_set_int(k, "groups", groups);
    node_set_float(k, "eps", oattr_float(c, "epsilon", 1e-5));
    finish(c, k);
}

/* RMSNormalization-23: over the axes from `axis` on, times scale (which
 * broadcasts to those axes: expanded when it is smaller). */
void map_rms_norm(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0), *scale = in(c, 1);
    if (oattr_int(c, "stash_type", 1) != 1)
        node_fail(c, "unsupported: stash_type other than float");
    int64_t axis = oattr_int(c, "axis", -1);
    if (axis < -x->rank || axis >= x->rank)
        node_fail(c, format("axis %lld is out of range for rank %d", (long long)axis, x->rank));
    if (axis < 0)
        axis += x->rank;
    int nrank = x->rank - (int)axis;
    const int64_t *nshape = x->shape + axis;
    if (scale->rank != nrank || memcmp(scale->shape, nshape, sizeof(int64_t) * (size_t)nrank)) {
        Node *e = emit_tmp(c, OP_EXPAND, 1, &scale);
        node_set_ints(e, "shape", nrank, nshape);
        scale = finish(c, e);
    }
    Value *ins[2] = {x, scale};
    Node *k = emit(c, OP_RMS_NORM, 2, ins, out_name(c, 0));
    node_set_int(k, "axis", axis);
    node_set_float(k, "eps", oattr_float(c, "epsilon", 1e-5));
    finish(c, k);
}

/* MeanVarianceNormalization, as ONNX's function body writes it:
 * (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9), the means over `axes`. */
void map_mvn(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0);
    int64_t axes[MAX_RANK] = {0, 2, 3};
    int n = 3;
    Onnx__AttributeProto *a = oattr_ints(c, "axes");
    if (a) {
        if (a->n_ints > MAX_RANK)
            node_fail(c, format("%zu axes", a->n_ints));
        n = (int)a->n_ints;
        for (int i = 0; i < n; i++)
            axes[i] = a->ints[i];
    }
    for (int i = 0; i < n; i++)
        if (axes[i] < -x->rank || axes[i] >= x->rank)
            node_fail(c, format("axis %lld is out of range for rank %d", (long long)axes[i],
                                x->rank));
    Value *means[2];
    for (int k = 0; k < 2; k++) {
        Value *v = k ? binary_tmp(c, OP_MUL, x, x) : x;
        Node *r = emit_tmp(c, OP_REDUCE_MEAN, 1, &v);
        node_set_ints(r, "axes", n, axes);
        means[k] = finish(c, r);
    }
    Value *var = binary_tmp(c, OP_SUB, means[1], binary_tmp(c, OP_MUL, means[0], means[0]));
    Value *den = binary_tmp(c, OP_ADD, unary_tmp(c, OP_SQRT, var),
                            const_scalar(c, KILN_DTYPE_F32, 1e-9));
    Value *pair[2] = {binary_tmp(c, OP_SUB, x, means[0]), den};
    finish(c, emit(c, OP_DIV, 2, pair, out_name(c, 0)));
}

/* LRN: x / (bias + alpha / size * sum of x^2 over the `size` channels
 * around)^beta. The sum is an average pool over the channels (x^2 seen
 * as [N, 1, C, spatial], zero padding counted) times size. */
void map_lrn(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0);
    int64_t size = oattr_int(c, "size", 0);
    if (!oattr(c, "size") || size < 1)
        node_fail(c, "size must be given and positive");
    if (x->rank < 3 || x->dtype != KILN_DTYPE_F32)
        node_fail(c, format("unsupported: an input of %s %s (f32 [N, C, ...])",
                            kiln_dtype_name(x->dtype), shape_str(x->rank, x->shape)));
    double alpha = oattr_float(c, "alpha", 1e-4), beta = oattr_float(c, "beta", 0.75);
    double bias = oattr_float(c, "bias", 1);
    int64_t view[4] = {x->shape[0], 1, x->shape[1], shape_count(x->rank - 2, x->shape + 2)};
    Value *sq = reshaped(c, binary_tmp(c, OP_MUL, x, x), 4, view);
    Node *k = emit_tmp(c, OP_AVG_POOL, 1, &sq);
    int64_t kernel[2] = {size, 1}, pads[4] = {(size - 1) / 2, 0, size / 2, 0};
    node_set_ints(k, "kernel", 2, kernel);
    node_set_ints(k, "pads", 4, pads);
    node_set_int(k, "count_include_pad", 1);
    Value *mean = reshaped(c, finish(c, k), x->rank, x->shape);
    Value *den = binary_tmp(c, OP_ADD, binary_tmp(c, OP_MUL, mean,
                                                  const_scalar(c, KILN_DTYPE_F32, alpha)),
                            const_scalar(c, KILN_DTYPE_F32, bias));
    den = binary_tmp(c, OP_POW, den, const_scalar(c, KILN_DTYPE_F32, beta));
    Value *pair[2] = {x, den};
    finish(c, emit(c, OP_DIV, 2, pair, out_name(c, 0)));
}
