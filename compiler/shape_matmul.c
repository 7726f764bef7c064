/*
 * shape_matmul.c: shape rules of gemm, matmul and grouped_matmul.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* gemm(A, B, [C]): 2-D operands, op(A) [M, K] x op(B) [K, N], C broadcast
 * to [M, N]; activation none or an ACTIVATION row of ops.def. */
void shape_gemm(Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1];
    require_float(n);
    same_dtype(n, 0, 1); /* the bias (C) is read as f32 in either case */
    if (a->rank != 2 || b->rank != 2)
        node_error(n, "gemm needs 2-D operands, got %s and %s",
                   shape_str(a->rank, a->shape), shape_str(b->rank, b->shape));
    bool ta = attr_int(n, "trans_a") != 0, tb = attr_int(n, "trans_b") != 0;
    int64_t M = ta ? a->shape[1] : a->shape[0], K = ta ? a->shape[0] : a->shape[1];
    int64_t Kb = tb ? b->shape[1] : b->shape[0], N = tb ? b->shape[0] : b->shape[1];
    if (K != Kb)
        node_error(n, "gemm of op(A) [%lld, %lld] and op(B) [%lld, %lld]: "
                   "inner dimensions differ", (long long)M, (long long)K,
                   (long long)Kb, (long long)N);
    if (K == 0)
        node_error(n, "unsupported: a product over an empty inner dimension (K = 0)");
    int64_t shape[2] = {M, N};
    if (n->ninputs > 2) {
        Tensor *c = n->inputs[2];
        int r;
        int64_t out[MAX_RANK];
        if (c->rank > 2 || !broadcast_shapes(c->rank, c->shape, 2, shape, &r, out) ||
            out[0] != M || out[1] != N)
            node_error_at(n, n->input_locs[2], "bias '%s' %s does not broadcast to "
                          "[%lld, %lld]", c->name, shape_str(c->rank, c->shape),
                          (long long)M, (long long)N);
    }
    check_activation(n);
    set_output(n, a->dtype, 2, shape);
}

/* numpy matmul: [..., M, K] x [..., K, N] with broadcast batch dimensions;
 * a 1-D operand is a vector (its dimension dropped from the result). */
void shape_matmul(Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1];
    /* f16 x f16 -> f16 (f32 accumulation), else f32 only */
    if (a->dtype == KILN_DTYPE_F16)
        require(n, 1, b->dtype == KILN_DTYPE_F16, "two f16 or two f32");
    else
        require_f32(n);
    if (a->rank < 1 || b->rank < 1)
        node_error(n, "matmul needs operands of rank 1 or more, "
                   "got %s and %s", shape_str(a->rank, a->shape),
                   shape_str(b->rank, b->shape));
    int64_t k_a = a->shape[a->rank - 1];
    int64_t k_b = b->rank == 1 ? b->shape[0] : b->shape[b->rank - 2];
    if (k_a != k_b)
        node_error(n, "matmul of %s ('%s') and %s ('%s'): inner "
                   "dimensions %lld and %lld differ",
                   shape_str(a->rank, a->shape), a->name, shape_str(b->rank, b->shape),
                   b->name, (long long)k_a, (long long)k_b);
    if (k_a == 0)
        node_error(n, "unsupported: a product over an empty inner dimension (K = 0)");
    int ba = a->rank > 2 ? a->rank - 2 : 0, bb = b->rank > 2 ? b->rank - 2 : 0;
    int rank;
    int64_t shape[MAX_RANK];
    if (!broadcast_shapes(ba, a->shape, bb, b->shape, &rank, shape))
        node_error(n, "matmul batch dimensions of %s and %s do not "
                   "broadcast", shape_str(a->rank, a->shape),
                   shape_str(b->rank, b->shape));
    if (a->rank >= 2)
        shape[rank++] = a->shape[a->rank - 2];
    if (b->rank >= 2)
        shape[rank++] = b->shape[b->rank - 1];
    set_output(n, a->dtype, rank, shape);
}

/* grouped_matmul(x [..., K], w [E, K, N], expert [...], [bias [E, N]]): row r
 * of x times w[expert[r]] (+ bias[expert[r]]); expert has x's leading
 * shape. The result is [..., N]. */
void shape_grouped_matmul(Node *n) {
    Tensor *x = n->inputs[0], *w = n->inputs[1], *e = n->inputs[2];
    for (int i = 0; i < n->ninputs; i++)
        if (i != 2)
            require(n, i, n->inputs[i]->dtype == KILN_DTYPE_F32, "f32");
    require(n, 2, is_index(e->dtype), "an i32 or i64 expert index:");
    if (x->rank < 1)
        node_error_at(n, n->input_locs[0], "x '%s' must be [..., K], not a scalar", x->name);
    int64_t K = x->shape[x->rank - 1];
    if (w->rank != 3 || w->shape[1] != K)
        node_error_at(n, n->input_locs[1], "the expert weights '%s' are %s; they must "
                      "be [experts, %lld, N] (K of x '%s' is %lld)", w->name,
                      shape_str(w->rank, w->shape), (long long)K, x->name, (long long)K);
    if (e->rank != x->rank - 1 ||
        memcmp(e->shape, x->shape, sizeof(int64_t) * (size_t)e->rank) != 0)
        node_error_at(n, n->input_locs[2], "the expert index '%s' is %s; it must be "
                      "%s, one expert per row of '%s'", e->name,
                      shape_str(e->rank, e->shape), shape_str(x->rank - 1, x->shape), x->name);
    if (n->ninputs > 3) {
        Tensor *b = n->inputs[3];
        if (b->rank != 2 || b->shape[0] != w->shape[0] || b->shape[1] != w->shape[2])
            node_error_at(n, n->input_locs[3], "the expert bias '%s' is %s; it must be "
                          "[%lld, %lld] (experts, N)", b->name,
                          shape_str(b->rank, b->shape), (long long)w->shape[0],
                          (long long)w->shape[2]);
    }
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = w->shape[2];
    set_output(n, KILN_DTYPE_F32, x->rank, shape);
}

/* det(x [..., M, M]) -> [...]: each matrix's determinant. */
void shape_det(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    if (x->rank < 2 || x->shape[x->rank - 1] != x->shape[x->rank - 2] || x->shape[x->rank - 1] < 1)
        node_error(n, "det needs square matrices [..., M, M], got %s",
                   shape_str(x->rank, x->shape));
    set_output(n, x->dtype, x->rank - 2, x->shape);
}
