/*
 * onnx_map_generic.c: generic ONNX mappers: renames with the same inputs
 * (map_simple), variadic ops, unary ops with attributes, ops kiln only
 * folds; and the small emitters the other mappers share
 */
#include "onnx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One kiln node with the same inputs and (renamed) attributes. Binary ops
 * of opsets before 7 broadcast only on request (broadcast=1), aligning the
 * second operand at `axis`: that becomes a reshape to numpy's alignment. */
void map_simple(Ctx *c, const OnnxOp *op) {
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
void map_variadic(Ctx *c, const OnnxOp *op) {
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

void map_unary_attr(Ctx *c, const OnnxOp *op) {
    Value *x = in(c, 0);
    Node *k = emit(c, op->kop, 1, &x, out_name(c, 0));
    copy_attrs(c, k, op->renames);
    finish(c, k);
}

void map_folded_only(Ctx *c, const OnnxOp *op) {
    for (int i = 0; i < nin(c); i++)
        in_const(c, i, format("every input of %s", op->name));
    node_fail(c, format("unsupported: this %s", op->name));
}

/* v's axes in the order perm gives (an internal transpose). */
Value *transposed(Ctx *c, Value *v, int n, const int64_t *perm) {
    Node *k = emit_tmp(c, OP_TRANSPOSE, 1, &v);
    node_set_ints(k, "perm", n, perm);
    return finish(c, k);
}

/* y, computed in f32, as output 0 in dtype dt: bound as it is, or cast. */
void output_as(Ctx *c, Value *y, kiln_dtype dt) {
    if (dt == y->dtype) {
        bind_output(c, 0, y);
        return;
    }
    Node *back = emit(c, OP_CAST, 1, &y, out_name(c, 0));
    node_set_attr(back, "to", kiln_dtype_name(dt));
    finish(c, back);
}

/* The node's output i as v: a constant, a copy under its name; otherwise a
 * view. Nothing when the node leaves that output unnamed. */
void bind_output(Ctx *c, int i, Value *v) {
    if (i >= nout(c) || !*out_name(c, i))
        return;
    if (v->data) {
        Value *o = new_value(out_name(c, i), v->dtype, v->rank, v->shape, true);
        memcpy(o->data, v->data, (size_t)(vcount(v) * kiln_dtype_size(v->dtype)));
        bind_value(c, out_name(c, i), o);
        return;
    }
    Node *k = emit(c, OP_RESHAPE, 1, &v, out_name(c, i));
    node_set_ints(k, "shape", v->rank, v->shape);
    finish(c, k);
}

Value *const_scalar(Ctx *c, kiln_dtype dt, double v) {
    Value *k = new_value(format("%s/const%d", c->nname, ++c->tmp_count), dt, 0, NULL, true);
    vset(k, 0, v);
    return k;
}

Value *reshaped(Ctx *c, Value *v, int rank, const int64_t *shape) {
    if (rank == v->rank && memcmp(shape, v->shape, sizeof(int64_t) * (size_t)rank) == 0)
        return v;
    Node *k = emit_tmp(c, OP_RESHAPE, 1, &v);
    node_set_ints(k, "shape", rank, shape);
    return finish(c, k);
}

Value *sliced(Ctx *c, Value *v, int axis, int64_t start, int64_t end) {
    if (start == 0 && end == v->shape[axis])
        return v;
    Node *k = emit_tmp(c, OP_SLICE, 1, &v);
    int64_t ax = axis, one = 1;
    node_set_ints(k, "starts", 1, &start);
    node_set_ints(k, "ends", 1, &end);
    node_set_ints(k, "axes", 1, &ax);
    node_set_ints(k, "steps", 1, &one);
    return finish(c, k);
}

Value *joined(Ctx *c, int n, Value **parts, int64_t axis, const char *out) {
    if (n == 1 && !out)
        return parts[0];
    Node *k = out ? emit(c, OP_CONCAT, n, parts, out) : emit_tmp(c, OP_CONCAT, n, parts);
    node_set_int(k, "axis", axis);
    return finish(c, k);
}

Value *unary_tmp(Ctx *c, OpKind op, Value *x) { return finish(c, emit_tmp(c, op, 1, &x)); }

Value *binary_tmp(Ctx *c, OpKind op, Value *a, Value *b) {
    Value *ab[2] = {a, b};
    return finish(c, emit_tmp(c, op, 2, ab));
}
