/*
 * shape_rows.c: shape rules of the ops over rows: softmax-like ops, the
 * norms, batch_norm, reductions, arg, topk, sample, the selective scan and
 * the norms' gradients.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* softmax, log_softmax: one axis of an f32 or f16 tensor; cumsum: of an
 * f32 one (or of an i32 or i64 one: integer sums, exact, wrapping as the
 * integers do; RoBERTa counts its positions so). */
void shape_axis_float(Node *n) {
    Tensor *x = n->inputs[0];
    if (n->op == OP_SOFTMAX || n->op == OP_LOG_SOFTMAX)
        require_float(n);
    else if (n->op != OP_CUMSUM || (x->dtype != KILN_DTYPE_I32 && x->dtype != KILN_DTYPE_I64))
        require_f32(n);
    if (x->rank < 1)
        node_error(n, "%s needs an input of rank 1 or more",
                   op_info[n->op].name);
    norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
    set_output(n, x->dtype, x->rank, x->shape);
}

/* layer_norm, rms_norm and their residual forms: normalize over the axes
 * from `axis` to the last; gamma and beta hold one value per normalized
 * element. Residual forms take (x, residual, [gamma, [beta]]) and may list
 * a second output, the sum x + residual. */
void shape_norm(Node *n) {
    Tensor *x = n->inputs[0];
    require_float(n);
    bool residual = n->op == OP_RESIDUAL_LAYER_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    if (x->rank < 1)
        node_error(n, "%s needs an input of rank 1 or more",
                   op_info[n->op].name);
    int axis = norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
    positive_float(n, "eps");
    int first_param = 1;
    if (residual) {
        Tensor *r = n->inputs[1];
        if (r->rank != x->rank || memcmp(r->shape, x->shape, sizeof(int64_t) * (size_t)x->rank))
            node_error_at(n, n->input_locs[1], "the residual '%s' %s must have the "
                          "shape of '%s' %s", r->name, shape_str(r->rank, r->shape),
                          x->name, shape_str(x->rank, x->shape));
        first_param = 2;
        if (n->noutputs > 2)
            node_error(n, "%s has one or two outputs (the norm, the sum)", op_info[n->op].name);
    } else if (n->noutputs != 1) {
        set_output(n, x->dtype, x->rank, x->shape); /* reports the count */
    }
    int64_t cols = shape_count(x->rank - axis, x->shape + axis);
    for (int i = first_param; i < n->ninputs; i++) {
        Tensor *p = n->inputs[i];
        if (tensor_count(p) != cols || (p->rank && p->shape[p->rank - 1] != x->shape[x->rank - 1]))
            node_error_at(n, n->input_locs[i], "%s '%s' has shape %s; it must have "
                          "the shape %s of the normalized axes",
                          i == first_param ? "gamma" : "beta", p->name,
                          shape_str(p->rank, p->shape), shape_str(x->rank - axis, x->shape + axis));
    }
    for (int i = 0; i < n->noutputs; i++) {
        n->outputs[i]->dtype = x->dtype;
        n->outputs[i]->rank = x->rank;
        memcpy(n->outputs[i]->shape, x->shape, sizeof x->shape);
    }
}

/* instance_norm(x, scale, bias) and group_norm(x, scale, bias) over
 * x [N, C, ...]. */
void shape_channel_norm(Node *n) {
    Tensor *x = n->inputs[0];
    require_float(n);
    if (x->rank < 3)
        node_error(n, "%s needs [N, C, D1, ...], got %s",
                   op_info[n->op].name, shape_str(x->rank, x->shape));
    positive_float(n, "eps");
    if (n->op == OP_GROUP_NORM) {
        int64_t g = attr_int(n, "groups");
        if (g < 1 || x->shape[1] % g)
            node_error_at(n, node_attr(n, "groups") ? attr_loc(n, "groups") : n->loc,
                          "groups must be a positive divisor of the %lld channels",
                          (long long)x->shape[1]);
    }
    check_channel_param(n, 1, x->shape[1]);
    check_channel_param(n, 2, x->shape[1]);
    set_output(n, x->dtype, x->rank, x->shape);
}

/* batch_norm(x, scale, bias, mean, var), inference: per channel (axis 1). */
void shape_batch_norm(Node *n) {
    Tensor *x = n->inputs[0];
    require_float(n);
    if (x->rank < 2)
        node_error(n, "batch_norm needs [N, C, ...], got %s",
                   shape_str(x->rank, x->shape));
    positive_float(n, "eps");
    for (int i = 1; i < 5; i++)
        check_channel_param(n, i, x->shape[1]);
    set_output(n, x->dtype, x->rank, x->shape);
}

static void reduce_output(Node *n, kiln_dtype dt) {
    Tensor *x = n->inputs[0];
    bool reduced[MAX_RANK];
    reduced_axes(n, reduced);
    int64_t keep = attr_int(n, "keep_dims");
    if (keep != 0 && keep != 1)
        node_error_at(n, attr_loc(n, "keep_dims"), "keep_dims must be 0 or 1");
    int64_t shape[MAX_RANK];
    int rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (!reduced[i] || keep)
            shape[rank++] = reduced[i] ? 1 : x->shape[i];
    set_output(n, dt, rank, shape);
}

/* The reductions of f32 or f16 data, the result in the data's dtype (a sum
 * computed in f32). */
void shape_reduce(Node *n) {
    require_float(n);
    reduce_output(n, n->inputs[0]->dtype);
}

/* argmax, argmin: of f32 or f16, or of i32 and i64 (compared as integers:
 * GPT-2's classifier finds each row's last token so) */
void shape_arg(Node *n) {
    kiln_dtype dt = n->inputs[0]->dtype;
    if (dt != KILN_DTYPE_I32 && dt != KILN_DTYPE_I64)
        require_float(n);
    int64_t last = attr_int(n, "select_last_index");
    if (last != 0 && last != 1)
        node_error_at(n, attr_loc(n, "select_last_index"), "select_last_index must "
                      "be 0 or 1");
    reduce_output(n, KILN_DTYPE_I64);
}

/* topk(x) -> values, indices (i64): k along axis. */
void shape_topk(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    if (n->noutputs != 2)
        node_error(n, "topk has two outputs (values, indices); list them "
                   "with outputs: [v, i]");
    if (x->rank < 1)
        node_error(n, "topk of a scalar");
    int axis = norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
    int64_t k = attr_int(n, "k");
    if (k < 0 || k > x->shape[axis])
        node_error_at(n, node_attr(n, "k") ? attr_loc(n, "k") : n->loc, "k must be "
                      "from 0 to the axis size %lld", (long long)x->shape[axis]);
    for (int i = 0; i < 2; i++) {
        Tensor *t = n->outputs[i];
        t->dtype = i ? KILN_DTYPE_I64 : x->dtype;
        t->rank = x->rank;
        memcpy(t->shape, x->shape, sizeof t->shape);
        t->shape[axis] = k;
    }
}

/* nms(boxes [B, N, 4], scores [B, C, N]) -> selected i64 [B * C * K, 3]
 * (batch, class, box) rows, K = min(max_per_class, N), and optionally the
 * count of valid rows, i64 [1]: how many rows are selected is known only
 * at run time, so the output has room for the most, -1 in the rest. */
void shape_nms(Node *n) {
    Tensor *boxes = n->inputs[0], *scores = n->inputs[1];
    require_f32(n);
    if (boxes->rank != 3 || boxes->shape[2] != 4 || scores->rank != 3 ||
        scores->shape[0] != boxes->shape[0] || scores->shape[2] != boxes->shape[1])
        node_error(n, "nms needs boxes [B, N, 4] and scores [B, C, N], got %s and %s",
                   shape_str(boxes->rank, boxes->shape), shape_str(scores->rank, scores->shape));
    if (n->noutputs > 2)
        node_error(n, "nms has one or two outputs (selected, count), %d are listed",
                   n->noutputs);
    if (boxes->shape[1] > (1 << 24))
        node_error(n, "nms of more than 2^24 boxes");
    int64_t k = positive_attr(n, "max_per_class", INT32_MAX);
    int64_t cpb = attr_int(n, "center_point_box");
    if (cpb != 0 && cpb != 1)
        node_error_at(n, attr_loc(n, "center_point_box"), "center_point_box must be 0 or 1");
    if (k > boxes->shape[1])
        k = boxes->shape[1];
    int64_t shape[2] = {boxes->shape[0] * scores->shape[1] * k, 3}, one = 1;
    set_output_i(n, 0, boxes, 2, shape);
    n->outputs[0]->dtype = KILN_DTYPE_I64;
    if (n->noutputs == 2) {
        set_output_i(n, 1, boxes, 1, &one);
        n->outputs[1]->dtype = KILN_DTYPE_I64;
        n->outputs[0]->row_count = n->outputs[1];
    }
}

/* sample(logits [..., V], seed) -> i64 [...]. */
void shape_sample(Node *n) {
    Tensor *x = n->inputs[0], *seed = n->inputs[1];
    require(n, 0, x->dtype == KILN_DTYPE_F32, "f32");
    require(n, 1, is_index(seed->dtype), "an i32 or i64 seed:");
    if (tensor_count(seed) != 1)
        node_error_at(n, n->input_locs[1], "the seed '%s' must hold one element, not %s",
                      seed->name, shape_str(seed->rank, seed->shape));
    if (x->rank < 1 || x->shape[x->rank - 1] < 1)
        node_error(n, "sample needs logits [..., V] with V > 0");
    if (attr_int(n, "top_k") < 0)
        node_error_at(n, attr_loc(n, "top_k"), "top_k must not be negative");
    double p = attr_float(n, "top_p"), t = attr_float(n, "temperature");
    if (!(p > 0 && p <= 1))
        node_error_at(n, attr_loc(n, "top_p"), "top_p must be in (0, 1]");
    if (t < 0)
        node_error_at(n, attr_loc(n, "temperature"), "temperature must not be negative");
    set_output(n, KILN_DTYPE_I64, x->rank - 1, x->shape);
}

/* selective_scan(u, delta, A, B, C, [D, [z]]): u, delta, z [batch, L, dim];
 * A [dim, N]; B, C [batch, L, N]; D [dim]; N at most 256. */
void shape_selective_scan(Node *n) {
    require_f32(n);
    Tensor *u = n->inputs[0];
    if (u->rank != 3)
        node_error_at(n, n->input_locs[0], "u must be [batch, L, dim], not %s",
                      shape_str(u->rank, u->shape));
    int64_t bt = u->shape[0], L = u->shape[1], dim = u->shape[2];
    int64_t N = n->inputs[2]->rank == 2 ? n->inputs[2]->shape[1] : -1;
    int64_t want[7][3] = {{bt, L, dim}, {bt, L, dim}, {dim, N, 0}, {bt, L, N},
                          {bt, L, N},   {dim, 0, 0},  {bt, L, dim}};
    int ranks[7] = {3, 3, 2, 3, 3, 1, 3};
    static const char *const names[7] = {"u", "delta", "A", "B", "C", "D", "z"};
    for (int i = 0; i < n->ninputs; i++) {
        Tensor *t = n->inputs[i];
        if (t->rank != ranks[i] || memcmp(t->shape, want[i], sizeof(int64_t) * (size_t)ranks[i]))
            node_error_at(n, n->input_locs[i], "%s '%s' is %s; it must be %s",
                          names[i], t->name, shape_str(t->rank, t->shape),
                          shape_str(ranks[i], want[i]));
    }
    if (N < 1 || N > 256)
        node_error_at(n, n->input_locs[2], "the state size %lld must be from 1 to 256",
                      (long long)N);
    set_output(n, u->dtype, 3, u->shape);
}

/* layer_norm_grad(dy, x, [gamma]) -> dx, [dgamma, [dbeta]]; rms_norm_grad
 * has no dbeta. */
void shape_norm_grad(Node *n) {
    Tensor *x = n->inputs[1];
    require_f32(n);
    bool rms = n->op == OP_RMS_NORM_GRAD;
    int most = rms ? 2 : 3;
    if (n->noutputs > most)
        node_error(n, "%s has at most %d outputs (dx, dgamma%s)",
                   op_info[n->op].name, most, rms ? "" : ", dbeta");
    if (x->rank < 1)
        node_error_at(n, n->input_locs[1], "x must have rank 1 or more");
    same_shape(n, 0, x, "the gradient");
    int axis = norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
    positive_float(n, "eps");
    int prank = x->rank - axis;
    const int64_t *pshape = x->shape + axis;
    if (n->ninputs > 2) {
        Tensor *g = n->inputs[2];
        if (tensor_count(g) != shape_count(prank, pshape))
            node_error_at(n, n->input_locs[2], "gamma '%s' is %s; it must have the shape "
                          "%s of the normalized axes", g->name,
                          shape_str(g->rank, g->shape), shape_str(prank, pshape));
        prank = g->rank;
        pshape = g->shape;
    }
    set_output_i(n, 0, x, x->rank, x->shape);
    for (int i = 1; i < n->noutputs; i++)
        set_output_i(n, i, x, prank, pshape);
}
