/*
 * shape_layout.c: shape rules of reshape, transpose, squeeze, unsqueeze,
 * flatten, slice, concat, split, expand, tile, depth_to_space and
 * space_to_depth.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* reshape: `shape` may hold one -1 (inferred) and 0 (copy that dimension). */
void shape_reshape(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t shape[MAX_RANK];
    int rank = attr_ints(n, "shape", shape, MAX_RANK);
    if (rank < 0)
        node_error(n, "reshape needs a shape attribute");
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 0) {
            if (i >= x->rank)
                node_error_at(n, attr_loc(n, "shape"), "shape[%d] is 0 (copy) "
                              "but the input has rank %d", i, x->rank);
            shape[i] = x->shape[i];
        }
        if (shape[i] == -1) {
            if (infer >= 0)
                node_error_at(n, attr_loc(n, "shape"), "shape has more than one -1");
            infer = i;
        } else if (shape[i] < 0) {
            node_error_at(n, attr_loc(n, "shape"), "shape[%d] is %lld",
                          i, (long long)shape[i]);
        } else {
            known = sat_mul(known, shape[i]);
        }
    }
    int64_t count = tensor_count(x);
    if (infer >= 0) {
        if (known == 0 || count % known != 0)
            node_error_at(n, attr_loc(n, "shape"), "cannot reshape %s (%lld "
                          "elements) to %s", shape_str(x->rank, x->shape),
                          (long long)count, shape_str(rank, shape));
        shape[infer] = count / known;
        known = count;
    }
    if (known != count)
        node_error_at(n, attr_loc(n, "shape"), "cannot reshape %s (%lld elements) "
                      "to %s (%lld elements)", shape_str(x->rank, x->shape),
                      (long long)count, shape_str(rank, shape), (long long)known);
    set_output(n, x->dtype, rank, shape);
}

/* transpose: `perm` is a permutation of the axes; default reverses them. */
void shape_transpose(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t perm[MAX_RANK];
    int np = attr_ints(n, "perm", perm, MAX_RANK);
    if (np < 0) {
        np = x->rank;
        for (int i = 0; i < np; i++)
            perm[i] = np - 1 - i;
    }
    if (np != x->rank)
        node_error_at(n, attr_loc(n, "perm"), "perm has %d axes, the input %s "
                      "has %d", np, shape_str(x->rank, x->shape), x->rank);
    bool seen[MAX_RANK] = {0};
    int64_t shape[MAX_RANK];
    for (int i = 0; i < np; i++) {
        int a = norm_axis(n, "perm", perm[i], x->rank);
        if (seen[a])
            node_error_at(n, attr_loc(n, "perm"), "perm names axis %d twice", a);
        seen[a] = true;
        shape[i] = x->shape[a];
    }
    set_output(n, x->dtype, x->rank, shape);
}

/* squeeze: drop the listed size-1 axes (default: every size-1 axis). */
void shape_squeeze(Node *n) {
    Tensor *x = n->inputs[0];
    int axes[MAX_RANK];
    int k = attr_axes(n, "axes", x->rank, axes);
    bool drop[MAX_RANK] = {0};
    for (int i = 0; i < x->rank; i++)
        drop[i] = k < 0 && x->shape[i] == 1;
    for (int i = 0; i < k; i++) {
        if (x->shape[axes[i]] != 1)
            node_error_at(n, attr_loc(n, "axes"), "axis %d of %s has size %lld, not 1", axes[i],
                          shape_str(x->rank, x->shape),
                          (long long)x->shape[axes[i]]);
        drop[axes[i]] = true;
    }
    int64_t shape[MAX_RANK];
    int rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (!drop[i])
            shape[rank++] = x->shape[i];
    set_output(n, x->dtype, rank, shape);
}

/* unsqueeze: insert size-1 axes at the listed places of the output. */
void shape_unsqueeze(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t v[MAX_RANK];
    int k = attr_ints(n, "axes", v, MAX_RANK);
    if (k < 0)
        node_error(n, "unsqueeze needs axes");
    int rank = x->rank + k;
    if (rank > MAX_RANK)
        node_error_at(n, attr_loc(n, "axes"), "the result would have rank %d; "
                      "kiln supports up to %d", rank, MAX_RANK);
    int axes[MAX_RANK];
    k = attr_axes(n, "axes", rank, axes);
    bool ins[MAX_RANK] = {0};
    for (int i = 0; i < k; i++)
        ins[axes[i]] = true;
    int64_t shape[MAX_RANK];
    for (int i = 0, j = 0; i < rank; i++)
        shape[i] = ins[i] ? 1 : x->shape[j++];
    set_output(n, x->dtype, rank, shape);
}

/* flatten: [prod(shape[:axis]), prod(shape[axis:])]. */
void shape_flatten(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t axis = attr_int(n, "axis");
    if (axis < -x->rank || axis > x->rank)
        node_error_at(n, attr_loc(n, "axis"), "axis %lld is out of range for rank %d",
                      (long long)axis, x->rank);
    if (axis < 0)
        axis += x->rank;
    int64_t shape[2] = {shape_count((int)axis, x->shape),
                        shape_count(x->rank - (int)axis, x->shape + axis)};
    set_output(n, x->dtype, 2, shape);
}

void shape_slice(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t start[MAX_RANK], step[MAX_RANK], shape[MAX_RANK];
    slice_params(n, start, step, shape);
    set_output(n, x->dtype, x->rank, shape);
}

void shape_concat(Node *n) {
    Tensor *x = n->inputs[0];
    Attr *a = node_attr(n, "axis");
    if (!a)
        node_error(n, "concat needs an axis");
    if (x->rank < 1)
        node_error(n, "concat of a scalar");
    int axis = norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof shape);
    same_dtype(n, 0, n->ninputs - 1);
    for (int i = 1; i < n->ninputs; i++) {
        Tensor *t = n->inputs[i];
        bool ok = t->rank == x->rank;
        for (int d = 0; ok && d < x->rank; d++)
            ok = d == axis || t->shape[d] == x->shape[d];
        if (!ok)
            node_error_at(n, n->input_locs[i], "'%s' %s does not match %s outside "
                          "axis %d", t->name, shape_str(t->rank, t->shape),
                          shape_str(x->rank, x->shape), axis);
        shape[axis] += t->shape[axis];
    }
    set_output(n, x->dtype, x->rank, shape);
}

void shape_split(Node *n) {
    Tensor *x = n->inputs[0];
    int axis;
    int64_t *sizes = split_sizes(n, &axis);
    for (int i = 0; i < n->noutputs; i++) {
        Tensor *t = n->outputs[i];
        t->dtype = x->dtype;
        t->rank = x->rank;
        memcpy(t->shape, x->shape, sizeof t->shape);
        t->shape[axis] = sizes[i];
    }
}

void shape_expand(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t target[MAX_RANK], shape[MAX_RANK];
    int k = attr_ints(n, "shape", target, MAX_RANK);
    if (k < 0)
        node_error(n, "expand needs a shape");
    int rank;
    if (!broadcast_shapes(x->rank, x->shape, k, target, &rank, shape))
        node_error_at(n, attr_loc(n, "shape"), "%s does not broadcast to %s",
                      shape_str(x->rank, x->shape), shape_str(k, target));
    set_output(n, x->dtype, rank, shape);
}

void shape_tile(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t reps[MAX_RANK], shape[MAX_RANK];
    int k = attr_ints(n, "repeats", reps, MAX_RANK);
    if (k != x->rank)
        node_error_at(n, k < 0 ? n->loc : attr_loc(n, "repeats"), "tile needs %d "
                      "repeats, one per axis", x->rank);
    for (int i = 0; i < k; i++) {
        if (reps[i] < 0)
            node_error_at(n, attr_loc(n, "repeats"), "a negative repeat");
        shape[i] = sat_mul(x->shape[i], reps[i]);
    }
    set_output(n, x->dtype, x->rank, shape);
}

void shape_depth_to_space(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t b = block_of(n, x);
    depth_to_space_crd(n);
    if (x->shape[1] % (b * b))
        node_error(n, "%lld channels do not divide by block^2 = %lld", (long long)x->shape[1],
                   (long long)(b * b));
    int64_t shape[4] = {x->shape[0], x->shape[1] / (b * b), x->shape[2] * b,
                        x->shape[3] * b};
    set_output(n, x->dtype, 4, shape);
}

void shape_space_to_depth(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t b = block_of(n, x);
    depth_to_space_crd(n);
    if (x->shape[2] % b || x->shape[3] % b)
        node_error(n, "height and width %lld x %lld do not divide by "
                   "block %lld", (long long)x->shape[2], (long long)x->shape[3],
                   (long long)b);
    int64_t shape[4] = {x->shape[0], x->shape[1] * b * b, x->shape[2] / b,
                        x->shape[3] / b};
    set_output(n, x->dtype, 4, shape);
}
