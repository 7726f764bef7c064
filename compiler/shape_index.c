/*
 * shape_index.c: shape rules of gather, gather_elements, scatter, one_hot,
 * trilu, pad, and gather's gradient.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* gather(data, indices, axis): data.shape[:axis] + indices.shape +
 * data.shape[axis+1:]. embedding(ids, table) is gather(table, ids, 0). */
void shape_gather(Node *n) {
    bool emb = n->op == OP_EMBEDDING;
    Tensor *x = n->inputs[emb ? 1 : 0], *idx = n->inputs[emb ? 0 : 1];
    require(n, emb ? 0 : 1, is_index(idx->dtype), "i32 or i64 index");
    if (x->rank < 1)
        node_error(n, "%s of a scalar", op_info[n->op].name);
    if (emb && x->rank != 2)
        node_error_at(n, n->input_locs[1], "the embedding table '%s' must be 2-D, not %s",
                      x->name, shape_str(x->rank, x->shape));
    int axis = emb ? 0 : norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
    check_const_indices(n, emb ? 0 : 1, x, axis);
    int rank = x->rank - 1 + idx->rank;
    if (rank > MAX_RANK)
        node_error(n, "the result would have rank %d", rank);
    int64_t shape[MAX_RANK];
    int r = 0;
    for (int i = 0; i < axis; i++)
        shape[r++] = x->shape[i];
    for (int i = 0; i < idx->rank; i++)
        shape[r++] = idx->shape[i];
    for (int i = axis + 1; i < x->rank; i++)
        shape[r++] = x->shape[i];
    set_output(n, x->dtype, rank, shape);
}

/* gather_nd(data, indices, batch_dims): ONNX GatherND. The last axis of
 * indices holds tuples of k indices into data's axes batch_dims to
 * batch_dims + k - 1 (the first batch_dims axes shared by both); y is
 * indices' shape without its last axis, then data's axes after the tuple's. */
void shape_gather_nd(Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1];
    require(n, 1, is_index(idx->dtype), "i32 or i64 index");
    int64_t b = attr_int(n, "batch_dims");
    if (x->rank < 1 || idx->rank < 1)
        node_error(n, "data and indices must have rank 1 or more");
    if (b < 0 || b >= idx->rank || b >= x->rank)
        node_error(n, "batch_dims %lld is out of range for indices of rank %d and data of "
                      "rank %d", (long long)b, idx->rank, x->rank);
    int64_t k = idx->shape[idx->rank - 1];
    if (k < 1 || b + k > x->rank)
        node_error_at(n, n->input_locs[1], "index tuples of %lld for data of rank %d with "
                      "%lld batch dimensions", (long long)k, x->rank, (long long)b);
    for (int d = 0; d < b; d++)
        if (idx->shape[d] != x->shape[d])
            node_error(n, "batch dimension %d is %lld in the indices and %lld in the data", d,
                       (long long)idx->shape[d], (long long)x->shape[d]);
    int rank = idx->rank - 1 + x->rank - (int)(b + k);
    if (rank > MAX_RANK)
        node_error(n, "the result would have rank %d", rank);
    int64_t shape[MAX_RANK];
    int r = 0;
    for (int i = 0; i < idx->rank - 1; i++)
        shape[r++] = idx->shape[i];
    for (int i = (int)(b + k); i < x->rank; i++)
        shape[r++] = x->shape[i];
    set_output(n, x->dtype, rank, shape);
}

/* gather_elements(data, indices, axis): indices has data's rank; y has its
 * shape. */
void shape_gather_elements(Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1];
    require(n, 1, is_index(idx->dtype), "i32 or i64 index");
    if (idx->rank != x->rank || x->rank < 1)
        node_error_at(n, n->input_locs[1], "indices '%s' %s must have the rank of the "
                      "data %s", idx->name, shape_str(idx->rank, idx->shape),
                      shape_str(x->rank, x->shape));
    check_index_extent(n, x, idx);
    check_const_indices(n, 1, x, norm_axis(n, "axis", attr_int(n, "axis"), x->rank));
    set_output(n, x->dtype, idx->rank, idx->shape);
}

void shape_scatter(Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1], *u = n->inputs[2];
    require(n, 0, x->dtype == KILN_DTYPE_F32, "f32");
    require(n, 1, is_index(idx->dtype), "i32 or i64 index");
    require(n, 2, u->dtype == KILN_DTYPE_F32, "f32");
    scatter_reduction(n);
    if (x->rank < 1 || idx->rank != x->rank || u->rank != idx->rank ||
        memcmp(u->shape, idx->shape, sizeof(int64_t) * (size_t)idx->rank))
        node_error(n, "indices %s and updates %s must have one shape, of "
                   "the data's rank (%s)", shape_str(idx->rank, idx->shape),
                   shape_str(u->rank, u->shape), shape_str(x->rank, x->shape));
    check_index_extent(n, x, idx);
    check_const_indices(n, 1, x, norm_axis(n, "axis", attr_int(n, "axis"), x->rank));
    set_output(n, x->dtype, x->rank, x->shape);
}

/* one_hot(indices): f32 with a new axis of size depth. */
void shape_one_hot(Node *n) {
    Tensor *idx = n->inputs[0];
    require(n, 0, is_index(idx->dtype), "i32 or i64 index");
    int64_t depth = attr_int(n, "depth");
    if (depth < 1)
        node_error_at(n, node_attr(n, "depth") ? attr_loc(n, "depth") : n->loc,
                      "one_hot needs a positive depth");
    int rank = idx->rank + 1;
    if (rank > MAX_RANK)
        node_error(n, "the result would have rank %d", rank);
    int axis = norm_axis(n, "axis", attr_int(n, "axis"), rank);
    int64_t shape[MAX_RANK];
    for (int i = 0, j = 0; i < rank; i++)
        shape[i] = i == axis ? depth : idx->shape[j++];
    set_output(n, KILN_DTYPE_F32, rank, shape);
}

void shape_trilu(Node *n) {
    Tensor *x = n->inputs[0];
    if (x->rank < 2)
        node_error(n, "trilu needs a matrix or a batch of them, got %s", shape_str(x->rank,
                   x->shape));
    set_output(n, x->dtype, x->rank, x->shape);
}

void shape_range(Node *n) {
    DimExpr size = attr_dims(n, "size");
    attr_dims(n, "start");
    if (attr_int(n, "delta") == 0)
        node_error(n, "delta must not be 0");
    int64_t lo = dim_expr_min(n->graph, &size), hi = dim_expr_max(n->graph, &size);
    if (lo < 0)
        node_error(n, "size %s is %lld at the dims' smallest; it must not be negative",
                   dim_expr_str(n->graph, &size), (long long)lo);
    kiln_dtype dt = attr_dtype(n, "dtype");
    if (dt != KILN_DTYPE_I64 && dt != KILN_DTYPE_I32 && dt != KILN_DTYPE_F32)
        node_error(n, "dtype must be i64, i32 or f32");
    set_output(n, dt, 1, &hi);
}

void shape_pad(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t pads[2 * MAX_RANK], shape[MAX_RANK];
    int k = attr_ints(n, "pads", pads, 2 * MAX_RANK);
    if (k != 2 * x->rank)
        node_error_at(n, k < 0 ? n->loc : attr_loc(n, "pads"), "pads needs %d values "
                      "(the beginnings, then the ends, of each axis)", 2 * x->rank);
    int mode = pad_mode(n);
    for (int i = 0; i < x->rank; i++) {
        /* the sum and its first step within int64 (checked in double, with
         * room for its rounding) before it is taken */
        double first = (double)x->shape[i] + (double)pads[i];
        double sum = first + (double)pads[i + x->rank];
        if (first > 9e18 || first < -9e18 || sum > 9e18 || sum < -9e18)
            node_error_at(n, attr_loc(n, "pads"), "pads %lld and %lld of axis %d (size %lld) "
                          "are out of range", (long long)pads[i], (long long)pads[i + x->rank],
                          i, (long long)x->shape[i]);
        shape[i] = x->shape[i] + pads[i] + pads[i + x->rank];
        if (shape[i] < 0)
            node_error_at(n, attr_loc(n, "pads"), "axis %d would have size %lld",
                          i, (long long)shape[i]);
        if (mode != 0 && x->shape[i] == 0 && shape[i] > 0)
            node_error_at(n, attr_loc(n, "pads"), "%s padding of an empty axis",
                          mode == 1 ? "reflect" : "edge");
    }
    set_output(n, x->dtype, x->rank, shape);
}

/* gather_grad(dy, indices): the gradient of gather(data, indices, axis)
 * for data with `size` along axis: dy's axes [axis, axis + indices.rank)
 * are indices' shape and become one of length size. */
void shape_gather_grad(Node *n) {
    Tensor *dy = n->inputs[0], *idx = n->inputs[1];
    require(n, 0, dy->dtype == KILN_DTYPE_F32, "f32");
    require(n, 1, is_index(idx->dtype), "i32 or i64 index");
    int rank = dy->rank - idx->rank + 1;
    if (rank < 1)
        node_error_at(n, n->input_locs[1], "indices '%s' %s have more axes than the "
                      "gradient '%s' %s", idx->name, shape_str(idx->rank, idx->shape),
                      dy->name, shape_str(dy->rank, dy->shape));
    int axis = norm_axis(n, "axis", attr_int(n, "axis"), rank);
    if (memcmp(dy->shape + axis, idx->shape, sizeof(int64_t) * (size_t)idx->rank) != 0)
        node_error_at(n, n->input_locs[1], "the gradient '%s' %s does not hold the "
                      "indices' shape %s at axis %d", dy->name,
                      shape_str(dy->rank, dy->shape), shape_str(idx->rank, idx->shape), axis);
    int64_t size = positive_attr(n, "size", INT32_MAX);
    int64_t shape[MAX_RANK];
    int r = 0;
    for (int i = 0; i < axis; i++)
        shape[r++] = dy->shape[i];
    shape[r++] = size;
    for (int i = axis + idx->rank; i < dy->rank; i++)
        shape[r++] = dy->shape[i];
    set_output(n, KILN_DTYPE_F32, r, shape);
}
