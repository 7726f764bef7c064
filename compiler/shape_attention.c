/*
 * shape_attention.c: shape rules of attention, rope and attention's
 * gradient.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The shape of attention's output in its layout (out_bshd): [B, Sq, H *
 * DV] or [B, H, Sq, DV]; returns its rank. */
static int attention_output_shape(const AttentionDims *a, int64_t *shape) {
    if (a->out_bshd) {
        int64_t s[3] = {a->B, a->Sq, a->H * a->DV};
        memcpy(shape, s, sizeof s);
        return 3;
    }
    int64_t s[4] = {a->B, a->H, a->Sq, a->DV};
    memcpy(shape, s, sizeof s);
    return 4;
}

void shape_attention(Node *n) {
    require_float(n);
    AttentionDims a;
    attention_dims(n, &a);
    Tensor *q = n->inputs[0];
    if (n->ninputs > 3) {
        Tensor *m = n->inputs[3];
        int64_t full[4] = {a.B, a.H, a.Sq, a.Sk}, out[MAX_RANK];
        int r;
        if (m->rank > 4 || !broadcast_shapes(m->rank, m->shape, 4, full, &r, out) ||
            memcmp(out, full, sizeof full))
            node_error_at(n, n->input_locs[3], "mask '%s' %s does not broadcast to "
                          "[B, H, Sq, Sk] = %s", m->name, shape_str(m->rank, m->shape),
                          shape_str(4, full));
    }
    if (attr_float(n, "softcap") < 0)
        node_error_at(n, attr_loc(n, "softcap"), "softcap must not be negative");
    if (attr_int(n, "window") < 0)
        node_error_at(n, attr_loc(n, "window"), "window must not be negative");
    int64_t shape[4];
    int rank = attention_output_shape(&a, shape);
    set_output(n, q->dtype, rank, shape);
}

/* rope(x, cos, sin): x [..., S, ..., D] with positions along seq_axis;
 * cos and sin [S, R/2], R = n_rot (default D, even, <= D). */
void shape_rope(Node *n) {
    Tensor *x = n->inputs[0], *c = n->inputs[1], *s = n->inputs[2];
    require_float(n); /* an elementwise dispatch */
    if (x->rank < 2)
        node_error(n, "rope needs [..., S, ..., D], got %s",
                   shape_str(x->rank, x->shape));
    int axis = norm_axis(n, "seq_axis", attr_int(n, "seq_axis"), x->rank);
    int64_t D = x->shape[x->rank - 1];
    if (axis == x->rank - 1)
        node_error_at(n, attr_loc(n, "seq_axis"), "seq_axis is the head dimension");
    int64_t R = attr_int_or(n, "n_rot", D);
    if (R < 2 || R > D || R % 2)
        node_error_at(n, node_attr(n, "n_rot") ? attr_loc(n, "n_rot") : n->loc,
                      "n_rot must be even, from 2 to the head size %lld",
                      (long long)D);
    for (int i = 1; i < 3; i++) {
        Tensor *t = i == 1 ? c : s;
        if (t->rank != 2 || t->shape[0] != x->shape[axis] || t->shape[1] != R / 2)
            node_error_at(n, n->input_locs[i], "'%s' is %s; it must be [%lld, %lld] "
                          "(positions, n_rot / 2)", t->name, shape_str(t->rank, t->shape),
                          (long long)x->shape[axis], (long long)(R / 2));
    }
    set_output(n, x->dtype, x->rank, x->shape);
}

/* attention_grad(q, k, v, dy) -> dq, dk, dv. */
void shape_attention_grad(Node *n) {
    require_f32(n);
    AttentionDims a;
    attention_dims(n, &a);
    if (n->noutputs != 3)
        node_error(n, "attention_grad has three outputs; list them with "
                   "outputs: [dq, dk, dv]");
    Tensor *dy = n->inputs[3];
    int64_t want[4];
    int rank = attention_output_shape(&a, want);
    if (dy->rank != rank || memcmp(dy->shape, want, sizeof(int64_t) * (size_t)rank))
        node_error_at(n, n->input_locs[3], "the gradient '%s' is %s; it must be %s, the "
                      "attention's output", dy->name, shape_str(dy->rank, dy->shape),
                      shape_str(rank, want));
    for (int i = 0; i < 3; i++)
        set_output_i(n, i, n->inputs[i], n->inputs[i]->rank, n->inputs[i]->shape);
}
