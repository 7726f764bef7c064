/*
 * onnx_map_nd.c: ONNX GatherND and ScatterND with constant indices.
 *
 * Each index tuple (the last axis of `indices`, k long) names a row of the
 * data seen as [rows, rest]: the first batch_dims + k axes flattened, the
 * others the row. With the indices known at compile time, kiln computes
 * every tuple's row number:
 *
 *  - GatherND is a Gather along axis 0 of that view, with the row numbers
 *    shaped as indices without its last axis (indices known only at run
 *    time: kiln's gather_nd, which finds the rows in its kernel);
 *  - ScatterND is a ScatterElements along axis 0 of that view, each update
 *    row going to its row number (every element of the row), with the
 *    reduction ONNX names (none, add, mul, max, min).
 *
 * When the data (and updates) are constants too, both are computed here on
 * the CPU instead (exporters build masks this way from shapes alone: Swin's
 * shifted windows). ScatterND's indices computed at run time get their row
 * numbers on the GPU, in i64 elementwise ops (row_numbers_gpu); a tuple with
 * an index outside its dimension names no row (the gather gives zeros
 * there, the scatter skips it: ONNX leaves such indices undefined).
 */
#include "onnx.h"

#include <string.h>

/* Checks idx against data and gives the view's sizes: data seen as [rows,
 * rest], the first batch_dims + k axes (k: the tuples' length) the rows. */
static void nd_view(Ctx *c, const Value *data, const Value *idx, int batch_dims, int64_t *rows,
                    int64_t *rest) {
    if (idx->rank < 1 || data->rank < 1)
        node_fail(c, "data and indices must have rank 1 or more");
    if (batch_dims < 0 || batch_dims >= idx->rank || batch_dims >= data->rank)
        node_fail(c, format("batch_dims %d is out of range for indices of rank %d", batch_dims,
                            idx->rank));
    int64_t k = idx->shape[idx->rank - 1];
    if (k < 1 || batch_dims + k > data->rank)
        node_fail(c, format("index tuples of %lld for data of rank %d with %d batch "
                            "dimensions", (long long)k, data->rank, batch_dims));
    for (int d = 0; d < batch_dims; d++)
        if (idx->shape[d] != data->shape[d])
            node_fail(c, format("batch dimension %d is %lld in the indices and %lld in the data",
                                d, (long long)idx->shape[d], (long long)data->shape[d]));
    int lead = batch_dims + (int)k;
    *rows = shape_count(lead, data->shape);
    *rest = shape_count(data->rank - lead, data->shape + lead);
}

/* The first row of each tuple's batch, shaped as idx without its last axis
 * (zeros without batch dimensions). */
static Value *batch_rows(Ctx *c, const Value *data, const Value *idx, int batch_dims) {
    int64_t k = idx->shape[idx->rank - 1], tuples = vcount(idx) / k;
    int64_t per_batch = shape_count((int)k, data->shape + batch_dims);
    int64_t per_batch_tuples = tuples / (batch_dims ? shape_count(batch_dims, idx->shape) : 1);
    Value *b = new_value(format("%s/batch_rows%d", c->nname, ++c->tmp_count), KILN_DTYPE_I64,
                         idx->rank - 1, idx->shape, true);
    for (int64_t t = 0; t < tuples; t++)
        vseti(b, t, (t / per_batch_tuples) * per_batch);
    return b;
}

/* The row numbers of constant idx's tuples in data seen as [rows, rest]
 * (batch_dims leading axes shared), shaped as idx without its last axis;
 * *rows and *rest get the view's sizes. */
static Value *row_numbers(Ctx *c, const Value *data, const Value *idx, int batch_dims,
                          int64_t *rows, int64_t *rest) {
    nd_view(c, data, idx, batch_dims, rows, rest);
    int64_t k = idx->shape[idx->rank - 1];
    int64_t tuples = vcount(idx) / k;
    Value *base = batch_rows(c, data, idx, batch_dims);
    Value *r = new_value(format("%s/rows%d", c->nname, ++c->tmp_count), KILN_DTYPE_I64,
                         idx->rank - 1, idx->shape, true);
    for (int64_t t = 0; t < tuples; t++) {
        int64_t row = 0;
        for (int64_t j = 0; j < k; j++) {
            int64_t dim = data->shape[batch_dims + j], v = vgeti(idx, t * k + j);
            if (v < -dim || v >= dim)
                node_fail(c, format("index %lld is out of range for a dimension of %lld",
                                    (long long)v, (long long)dim));
            row = row * dim + (v < 0 ? v + dim : v);
        }
        vseti(r, t, vgeti(base, t) + row);
    }
    return r;
}

/* The same row numbers for indices known only at run time, on the GPU: each
 * tuple element (a Gather of its column) made non-negative, times its
 * stride, summed, plus the batch's first row; a tuple with an element
 * outside its dimension gets `rows` (no row). */
static Value *row_numbers_gpu(Ctx *c, const Value *data, Value *idx, int batch_dims,
                              int64_t *rows, int64_t *rest) {
    nd_view(c, data, idx, batch_dims, rows, rest);
    int64_t k = idx->shape[idx->rank - 1], stride = 1;
    Value *ix = cast_to(c, idx, KILN_DTYPE_I64), *sum = NULL, *bad = NULL;
    for (int64_t j = k - 1; j >= 0; j--) {
        int64_t dim = data->shape[batch_dims + j];
        Value *gi[2] = {ix, const_scalar(c, KILN_DTYPE_I64, (double)j)};
        Node *g = emit_tmp(c, OP_GATHER, 2, gi);
        node_set_int(g, "axis", idx->rank - 1);
        Value *v = finish(c, g);
        Value *neg = binary_tmp(c, OP_LT, v, const_scalar(c, KILN_DTYPE_I64, 0));
        Value *w[3] = {neg, binary_tmp(c, OP_ADD, v, const_scalar(c, KILN_DTYPE_I64,
                                                                  (double)dim)), v};
        v = finish(c, emit_tmp(c, OP_WHERE, 3, w));
        Value *out = binary_tmp(c, OP_OR, binary_tmp(c, OP_LT, v, const_scalar(c, KILN_DTYPE_I64,
                                                                                0)),
                                binary_tmp(c, OP_GE, v, const_scalar(c, KILN_DTYPE_I64,
                                                                     (double)dim)));
        bad = bad ? binary_tmp(c, OP_OR, bad, out) : out;
        if (stride != 1)
            v = binary_tmp(c, OP_MUL, v, const_scalar(c, KILN_DTYPE_I64, (double)stride));
        sum = sum ? binary_tmp(c, OP_ADD, sum, v) : v;
        stride *= dim;
    }
    if (batch_dims)
        sum = binary_tmp(c, OP_ADD, sum, batch_rows(c, data, idx, batch_dims));
    Value *pick[3] = {bad, const_scalar(c, KILN_DTYPE_I64, (double)*rows), sum};
    return finish(c, emit_tmp(c, OP_WHERE, 3, pick));
}

void map_gather_nd(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *data = in(c, 0), *idx = in(c, 1);
    int64_t rows, rest;
    int batch_dims = (int)oattr_int(c, "batch_dims", 0);
    if (!idx->data) { /* indices at run time: kiln's gather_nd, one kernel (its
                        * shape rule checks them against the data) */
        Value *gi[2] = {data, idx};
        Node *g = emit(c, OP_GATHER_ND, 2, gi, out_name(c, 0));
        node_set_int(g, "batch_dims", batch_dims);
        finish(c, g);
        return;
    }
    Value *r = row_numbers(c, data, idx, batch_dims, &rows, &rest);
    int first_kept = batch_dims + (int)idx->shape[idx->rank - 1];
    int64_t shape[MAX_RANK];
    int n = 0;
    for (int d = 0; d < r->rank; d++)
        shape[n++] = r->shape[d];
    for (int d = first_kept; d < data->rank && n < MAX_RANK + 1; d++)
        shape[n++] = data->shape[d];
    if (n > MAX_RANK)
        node_fail(c, format("unsupported: a result of rank %d", n));
    if (data->data && r->data) { /* all constants: gathered here */
        Value *o = new_value(out_name(c, 0), data->dtype, n, shape, true);
        for (int64_t t = 0; t < vcount(r); t++)
            for (int64_t e = 0; e < rest; e++)
                vcopy(o, t * rest + e, data, vgeti(r, t) * rest + e);
        bind_value(c, out_name(c, 0), o);
        return;
    }
    Value *flat = reshaped(c, data, 2, (int64_t[]){rows, rest});
    Value *gi[2] = {flat, r};
    Node *g = emit_tmp(c, OP_GATHER, 2, gi);
    node_set_int(g, "axis", 0);
    Value *picked = finish(c, g);
    Node *k2 = emit(c, OP_RESHAPE, 1, &picked, out_name(c, 0));
    node_set_ints(k2, "shape", n, shape);
    finish(c, k2);
}

/* The reduction of ScatterND (and its kiln name), checked against the
 * version: add and mul from 16, max and min from 18. */
static const char *nd_reduction(Ctx *c) {
    const char *red = oattr_str(c, "reduction", "none");
    int64_t v = onnx_op_version("ScatterND", c->opset);
    bool known = strcmp(red, "none") == 0 ||
                 (v >= 16 && (strcmp(red, "add") == 0 || strcmp(red, "mul") == 0)) ||
                 (v >= 18 && (strcmp(red, "max") == 0 || strcmp(red, "min") == 0));
    if (!known)
        node_fail(c, format("unsupported: reduction '%s' (ScatterND version %lld)", red,
                            (long long)v));
    return red;
}

/* Element `at` of o combined with element `from` of u by the reduction. */
static void reduce_into(Value *o, int64_t at, const Value *u, int64_t from, const char *red) {
    if (strcmp(red, "none") == 0) {
        vcopy(o, at, u, from);
    } else if (is_integral(o->dtype)) { /* exactly, past 2^53 too */
        int64_t a = vgeti(o, at), b = vgeti(u, from);
        vseti(o, at, strcmp(red, "add") == 0   ? (int64_t)((uint64_t)a + (uint64_t)b)
                     : strcmp(red, "mul") == 0 ? (int64_t)((uint64_t)a * (uint64_t)b)
                     : strcmp(red, "max") == 0 ? (a > b ? a : b)
                                               : (a < b ? a : b));
    } else {
        double a = vget(o, at), b = vget(u, from);
        vset(o, at, strcmp(red, "add") == 0   ? a + b
                    : strcmp(red, "mul") == 0 ? a * b
                    : strcmp(red, "max") == 0 ? (a > b ? a : b)
                                              : (a < b ? a : b));
    }
}

void map_scatter_nd(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *data = in(c, 0), *idx = in(c, 1), *upd = in(c, 2);
    const char *red = nd_reduction(c);
    int64_t rows, rest;
    Value *r = idx->data ? row_numbers(c, data, idx, 0, &rows, &rest)
                         : row_numbers_gpu(c, data, idx, 0, &rows, &rest);
    int64_t tuples = vcount(r);
    if (vcount(upd) != tuples * rest || upd->dtype != data->dtype)
        node_fail(c, format("updates %s %s do not fit %lld index tuples of rows of %lld",
                            kiln_dtype_name(upd->dtype), shape_str(upd->rank, upd->shape),
                            (long long)tuples, (long long)rest));
    if (data->data && upd->data && r->data) { /* all constants: scattered here */
        Value *o = new_value(out_name(c, 0), data->dtype, data->rank, data->shape, true);
        memcpy(o->data, data->data, (size_t)(vcount(data) * kiln_dtype_size(data->dtype)));
        for (int64_t t = 0; t < tuples; t++)
            for (int64_t e = 0; e < rest; e++)
                reduce_into(o, vgeti(r, t) * rest + e, upd, t * rest + e, red);
        bind_value(c, out_name(c, 0), o);
        return;
    }
    /* each update element's row: the tuple's row number along the row */
    Value *e;
    if (r->data) {
        e = new_value(format("%s/elements%d", c->nname, ++c->tmp_count), KILN_DTYPE_I64, 2,
                      (int64_t[]){tuples, rest}, true);
        for (int64_t t = 0; t < tuples; t++)
            for (int64_t j = 0; j < rest; j++)
                vseti(e, t * rest + j, vgeti(r, t));
    } else {
        Value *col = reshaped(c, r, 2, (int64_t[]){tuples, 1});
        Node *x = emit_tmp(c, OP_EXPAND, 1, &col);
        node_set_ints(x, "shape", 2, (int64_t[]){tuples, rest});
        e = finish(c, x);
    }
    Value *ins[3] = {reshaped(c, data, 2, (int64_t[]){rows, rest}), e,
                     reshaped(c, upd, 2, (int64_t[]){tuples, rest})};
    Node *k = emit_tmp(c, OP_SCATTER_ELEMENTS, 3, ins);
    node_set_int(k, "axis", 0);
    node_set_attr(k, "reduction", red);
    Value *flat = finish(c, k);
    Node *back = emit(c, OP_RESHAPE, 1, &flat, out_name(c, 0));
    node_set_ints(back, "shape", data->rank, data->shape);
    finish(c, back);
}

/* MaxUnpool: zeros of the unpooled shape ((in - 1) * stride + kernel -
 * pads) with X's values scattered to the flat positions that MaxPool's
 * indices name. With output_shape (a constant), as ONNX's reference: the
 * pads are ignored, and that result is placed at the start of each axis of
 * the larger output, zeros after it. */
void map_max_unpool(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0), *idx = in(c, 1);
    int nsp = x->rank - 2;
    if (nsp < 1 || x->dtype != KILN_DTYPE_F32 || idx->dtype != KILN_DTYPE_I64 ||
        idx->rank != x->rank || memcmp(idx->shape, x->shape, sizeof(int64_t) * (size_t)x->rank))
        node_fail(c, format("MaxUnpool needs f32 X [N, C, D1, ...] and i64 indices of its "
                            "shape, got %s %s and %s %s", kiln_dtype_name(x->dtype),
                            shape_str(x->rank, x->shape), kiln_dtype_name(idx->dtype),
                            shape_str(idx->rank, idx->shape)));
    int64_t shape[MAX_RANK] = {x->shape[0], x->shape[1]}, out[MAX_RANK];
    bool given = in_opt(c, 2) != NULL;
    if (given && const_ints(c, 2, "output_shape", out, MAX_RANK) != x->rank)
        node_fail(c, format("output_shape must have %d values", x->rank));
    Onnx__AttributeProto *k = oattr_ints(c, "kernel_shape"), *s = oattr_ints(c, "strides"),
                         *p = given ? NULL : oattr_ints(c, "pads");
    if (!k || (int)k->n_ints != nsp || (s && (int)s->n_ints != nsp) ||
        (p && (int)p->n_ints != 2 * nsp))
        node_fail(c, format("MaxUnpool needs kernel_shape (and strides, pads) for %d "
                            "spatial axes", nsp));
    for (int i = 0; i < nsp; i++)
        shape[2 + i] = (x->shape[2 + i] - 1) * (s ? s->ints[i] : 1) + k->ints[i] -
                       (p ? p->ints[i] + p->ints[nsp + i] : 0);
    int64_t total = shape_count(x->rank, shape), count = vcount(x);
    for (int i = 0; i < x->rank; i++)
        if (shape[i] < 1 || (given && out[i] < shape[i]))
            node_fail(c, format("the unpooled shape %s is empty or larger than output_shape",
                                shape_str(x->rank, shape)));
    Value *zero = const_scalar(c, x->dtype, 0);
    Node *z = emit_tmp(c, OP_EXPAND, 1, &zero);
    node_set_ints(z, "shape", 1, &total);
    Value *ins[3] = {finish(c, z), reshaped(c, idx, 1, &count), reshaped(c, x, 1, &count)};
    Node *sc = emit_tmp(c, OP_SCATTER_ELEMENTS, 3, ins);
    node_set_int(sc, "axis", 0);
    Value *flat = finish(c, sc);
    if (!given || memcmp(out, shape, sizeof(int64_t) * (size_t)x->rank) == 0) {
        Node *back = emit(c, OP_RESHAPE, 1, &flat, out_name(c, 0));
        node_set_ints(back, "shape", x->rank, shape);
        finish(c, back);
        return;
    }
    Value *y = reshaped(c, flat, x->rank, shape);
    Node *pad = emit(c, OP_PAD, 1, &y, out_name(c, 0));
    int64_t pads[2 * MAX_RANK] = {0};
    for (int i = 0; i < x->rank; i++)
        pads[x->rank + i] = out[i] - shape[i];
    node_set_ints(pad, "pads", 2 * x->rank, pads);
    finish(c, pad);
}
