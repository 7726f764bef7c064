/*
 * shape_common.c: what the shape rules share: setting a node's output,
 * dtype requirements, broadcasting the inputs, parameters per channel.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void set_output(Node *n, kiln_dtype dt, int rank, const int64_t *shape) {
    if (n->noutputs != 1)
        node_error(n, "%s has one output, %d are listed",
                   op_info[n->op].name, n->noutputs);
    Tensor *t = n->outputs[0];
    double count = 1;
    for (int i = 0; i < rank; i++)
        count *= (double)shape[i];
    if (count > 4294967295.0)
        node_error(n, "output %s has more than 2^32 - 1 elements", shape_str(rank, shape));
    t->dtype = dt;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
}

void require(Node *n, int i, bool ok, const char *what) {
    Tensor *t = n->inputs[i];
    if (!ok)
        node_error_at(n, n->input_locs[i], "unsupported: %s needs %s inputs, '%s' is %s",
                      op_info[n->op].name, what, t->name, kiln_dtype_name(t->dtype));
}

void same_dtype(Node *n, int first, int last) {
    for (int i = first + 1; i <= last && i < n->ninputs; i++)
        if (n->inputs[i]->dtype != n->inputs[first]->dtype)
            node_error_at(n, n->input_locs[i], "'%s' is %s but '%s' is %s; %s needs "
                          "one dtype", n->inputs[first]->name,
                          kiln_dtype_name(n->inputs[first]->dtype), n->inputs[i]->name,
                          kiln_dtype_name(n->inputs[i]->dtype), op_info[n->op].name);
}

/* The broadcast shape of inputs [first, ninputs). */
int broadcast_inputs(Node *n, int first, int64_t *shape) {
    Tensor *a = n->inputs[first];
    int rank = a->rank;
    memcpy(shape, a->shape, sizeof(int64_t) * (size_t)rank);
    for (int i = first + 1; i < n->ninputs; i++) {
        Tensor *b = n->inputs[i];
        int64_t out[MAX_RANK];
        if (!broadcast_shapes(rank, shape, b->rank, b->shape, &rank, out))
            node_error(n, "shapes %s and %s ('%s') do not broadcast", shape_str(rank, shape),
                       shape_str(b->rank, b->shape),
                       b->name);
        memcpy(shape, out, sizeof(int64_t) * (size_t)rank);
    }
    return rank;
}

/* The dtype named by a string attribute. */
kiln_dtype attr_dtype(Node *n, const char *key) {
    Attr *a = node_attr(n, key);
    if (!a)
        node_error(n, "%s needs a '%s' attribute",
                   op_info[n->op].name, key);
    for (int d = KILN_DTYPE_F32; d <= KILN_DTYPE_I8; d++)
        if (!a->is_list && strcmp(a->scalar, kiln_dtype_name((kiln_dtype)d)) == 0)
            return (kiln_dtype)d;
    node_error_at(n, a->loc, "%s must be a dtype (f32 f16 i32 i64 bool u8 i8)", key);
}

void require_f32(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, n->inputs[i]->dtype == KILN_DTYPE_F32, "f32");
}

void require_float(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, is_float(n->inputs[i]->dtype), "f32 or f16");
}

void check_channel_param(Node *n, int i, int64_t c) {
    Tensor *p = n->inputs[i];
    if (p->rank != 1 || p->shape[0] != c)
        node_error_at(n, n->input_locs[i], "'%s' has shape %s; it must be [%lld], one "
                      "value per channel", p->name, shape_str(p->rank, p->shape),
                      (long long)c);
}

/* gather_elements and scatter_elements: off the 'axis' attribute, indices
 * may not be longer than the data on any axis. */
void check_index_extent(Node *n, const Tensor *x, const Tensor *idx) {
    int axis = norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
    for (int d = 0; d < x->rank; d++)
        if (d != axis && idx->shape[d] > x->shape[d])
            node_error_at(n, n->input_locs[1], "indices %s exceed the data %s on axis %d",
                          shape_str(idx->rank, idx->shape), shape_str(x->rank, x->shape),
                          d);
}

/* A constant index (input k of n, a weight) outside [-len, len), len the
 * size of data x's axis `axis`: refused by name and position. ONNX calls
 * such an index an error; the kernels would read zeros or skip it. */
void check_const_indices(Node *n, int k, const Tensor *x, int axis) {
    const Tensor *idx = n->inputs[k];
    if (idx->kind != T_WEIGHT || !idx->data || idx->dyn_axes || idx->dynamic)
        return;
    int64_t len = x->shape[axis], count = tensor_count(idx);
    for (int64_t i = 0; i < count; i++) {
        int64_t v = index_value(idx, i);
        if (v < -len || v >= len)
            node_error_at(n, n->input_locs[k], "index %lld (element %lld of '%s') is outside "
                          "axis %d of '%s', of size %lld (indices %lld to %lld)", (long long)v,
                          (long long)i, idx->name, axis, x->name, (long long)len,
                          (long long)-len, (long long)(len - 1));
    }
}

void same_shape(Node *n, int i, const Tensor *like, const char *what) {
    Tensor *t = n->inputs[i];
    if (t->rank != like->rank ||
        memcmp(t->shape, like->shape, sizeof(int64_t) * (size_t)like->rank) != 0)
        node_error_at(n, n->input_locs[i], "%s '%s' is %s; it must be %s like '%s'", what,
                      t->name, shape_str(t->rank, t->shape),
                      shape_str(like->rank, like->shape), like->name);
}

void set_output_i(Node *n, int i, const Tensor *like, int rank, const int64_t *shape) {
    Tensor *t = n->outputs[i];
    t->dtype = like->dtype;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
}

void check_activation(Node *n) {
    Attr *act = node_attr(n, "activation");
    if (act && (act->is_list || activation_lookup(act->scalar) < 0))
        node_error_at(n, act->loc, "unknown activation (known: %s)", activation_names());
}
