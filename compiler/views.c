/*
 * views.c: a tensor seen as an index map into the elements of the tensor it
 * was made from by views, transposes, broadcasts and parts picked out of
 * it (views.h). The attention rewrite (rewrite.c) reads q, k and v through
 * these maps instead of copying them.
 */
#include "views.h"

#include <string.h>

bool is_view(const Node *n) { return n && is_view_op(n->op); }

/* Merges the axes [a, b) of v into one (size, stride, div); false when
 * their elements are not one strided run. */
static bool merge_axes(const View *v, int a, int b, int64_t *stride, int64_t *div) {
    int64_t n = 0, s = 0, d = 1; /* the merged inner axes so far (n 0: none) */
    for (int i = b - 1; i >= a; i--) {
        if (v->size[i] == 1)
            continue;
        if (n == 0) {
            n = v->size[i], s = v->stride[i], d = v->div[i];
        } else if (s == 0) { /* inner axes repeat the outer one's elements */
            s = v->stride[i];
            d = n * v->div[i];
            n *= v->size[i];
        } else if (d == 1 && v->div[i] == 1 && v->stride[i] == s * n) {
            n *= v->size[i];
        } else {
            return false;
        }
    }
    *stride = n ? s : 0;
    *div = n ? d : 1;
    return true;
}

bool reshape_view(View *v, int rank, const int64_t *shape) {
    View o = {v->root, rank, {0}, {0}, {0}, v->base};
    int i = 0, j = 0;
    while (i < v->rank || j < rank) {
        if (j < rank && shape[j] == 1) {
            o.size[j] = 1, o.stride[j] = 0, o.div[j++] = 1;
            continue;
        }
        if (i < v->rank && v->size[i] == 1) {
            i++;
            continue;
        }
        if (i >= v->rank || j >= rank)
            return false;
        int i0 = i, j0 = j, big = 0;
        int64_t ps = v->size[i++], pt = shape[j++];
        while (ps != pt) {
            if (ps < pt && i < v->rank)
                ps *= v->size[i++];
            else if (pt < ps && j < rank)
                pt *= shape[j++];
            else
                return false;
        }
        int64_t stride, div, inner = 1;
        if (!merge_axes(v, i0, i, &stride, &div))
            return false;
        for (int k = j0; k < j; k++)
            big += shape[k] != 1;
        if (div != 1 && big > 1)
            return false;
        for (int k = j - 1; k >= j0; k--) {
            o.size[k] = shape[k];
            o.stride[k] = stride * inner;
            o.div[k] = div;
            inner *= shape[k];
        }
    }
    *v = o;
    return true;
}

/* Transposes v's axes: axis a of the result is axis perm[a] of v. */
static void permute_view(View *v, const int64_t *perm) {
    View o = *v;
    for (int a = 0; a < v->rank; a++) {
        o.size[a] = v->size[perm[a]];
        o.stride[a] = v->stride[perm[a]];
        o.div[a] = v->div[perm[a]];
    }
    *v = o;
}

/* Whether views r1 and r2 around transpose tr (r1 -> tr -> r2) merge the
 * first m axes of r1's input into one, transpose the rest, and split the
 * merged axis back ([b, h, s, d] -> [b * h, s, d] -> [b * h, d, s] -> [b,
 * h, d, s], as exporters transpose a batch of heads' keys): then perm (of
 * r1's input's rank) is the one transpose they make. A merged axis of a
 * batch and heads has no single stride, which the view of each step
 * would need. */
static bool merged_transpose(Node *r1, Node *tr, Node *r2, int64_t *perm) {
    const Tensor *x = r1->inputs[0], *y = r1->outputs[0], *z = r2->outputs[0];
    int m = x->rank - y->rank + 1;
    int64_t tp[MAX_RANK], lead = 1;
    if (!is_view(r1) || tr->op != OP_TRANSPOSE || !is_view(r2) || m < 2 ||
        z->rank != x->rank || attr_ints(tr, "perm", tp, MAX_RANK) != y->rank || tp[0] != 0)
        return false;
    for (int a = 0; a < m; a++) {
        lead *= x->shape[a];
        if (z->shape[a] != x->shape[a])
            return false;
    }
    if (y->shape[0] != lead)
        return false;
    for (int a = 1; a < y->rank; a++)
        if (y->shape[a] != x->shape[m - 1 + a] ||
            z->shape[m - 1 + a] != tr->outputs[0]->shape[a])
            return false;
    for (int a = 0; a < x->rank; a++)
        perm[a] = a < m ? a : m - 1 + tp[a - m + 1];
    return true;
}

/* The index of a gather of one constant index (a scalar: the axis goes),
 * normalized; -1 where p is no such gather. */
static int64_t one_index(Node *p) {
    const Tensor *i = p->ninputs == 2 ? p->inputs[1] : NULL;
    if (p->op != OP_GATHER || !i || i->kind != T_WEIGHT || !i->data || i->rank != 0 ||
        (i->dtype != KILN_DTYPE_I64 && i->dtype != KILN_DTYPE_I32))
        return -1;
    const Tensor *x = p->inputs[0];
    int64_t a = attr_int(p, "axis"), at = index_value(i, 0);
    a = a < 0 ? a + x->rank : a;
    at = at < 0 ? at + x->shape[a] : at;
    return a >= 0 && a < x->rank && at >= 0 && at < x->shape[a] ? at : -1;
}

/* Whether p moves no element but picks a part: a gather of one constant
 * index, a split's part, or a slice with unit steps; dynamic axes (a run's
 * extent) whole. */
static bool picks_part(Node *p) {
    const Tensor *x = p->inputs[0];
    if (p->op == OP_GATHER)
        return !x->dyn_axes && one_index(p) >= 0;
    if (p->op == OP_SPLIT) {
        int axis;
        split_sizes(p, &axis);
        return !is_dyn(x, axis);
    }
    if (p->op != OP_SLICE)
        return false;
    int64_t start[MAX_RANK], step[MAX_RANK], shape[MAX_RANK];
    slice_params(p, start, step, shape);
    for (int a = 0; a < x->rank; a++)
        if (step[a] != 1 || (is_dyn(x, a) && (start[a] || shape[a] != x->shape[a])))
            return false;
    return true;
}

/* Which input of p (a two-input mul) is not a one-element constant (f32,
 * or f16 times f16) when the other is: its value in *c; -1 where neither is. */
static int scaled_input(const Node *p, double *c) {
    for (int i = 0; p->op == OP_MUL && p->ninputs == 2 && i < 2; i++) {
        const Tensor *k = p->inputs[i];
        if (k->kind == T_WEIGHT && k->data && k->dtype == p->inputs[1 - i]->dtype &&
            is_float(k->dtype) && tensor_count(k) == 1 &&
            shape_equal(p->inputs[1 - i], p->outputs[0])) {
            *c = weight_float(k, 0);
            return 1 - i;
        }
    }
    return -1;
}

bool trace_view(Tensor *t, View *v) { return trace_view_until(t, v, NULL, NULL); }

bool trace_view_scaled(Tensor *t, View *v, double *scale) {
    return trace_view_until(t, v, scale, NULL);
}

/* t followed back through transposes, views, broadcasts and parts picked
 * (picks_part), and with scale through products by constant scalars, to
 * the tensor whose elements it indexes, or to stop where the way back
 * meets it. */
bool trace_view_until(Tensor *t, View *v, double *scale, const Tensor *stop) {
    if (tensor_count(t) == 0)
        return false;
    Node *chain[32];
    int part[32]; /* which of a split's outputs */
    int n = 0;
    Tensor *root = t;
    for (Node *p = root->producer; p && n < 32 && root != stop; p = root->producer) {
        double c;
        int x = scale ? scaled_input(p, &c) : -1;
        if (x >= 0) { /* a product by a constant commutes with the views */
            *scale *= c;
            root = p->inputs[x];
            continue;
        }
        if (!is_view(p) && p->op != OP_TRANSPOSE && p->op != OP_EXPAND && !picks_part(p))
            break;
        part[n] = 0;
        while (part[n] < p->noutputs && p->outputs[part[n]] != root)
            part[n]++;
        chain[n++] = p;
        root = p->inputs[0];
    }
    v->root = root;
    v->rank = root->rank;
    v->base = 0;
    for (int a = root->rank - 1, s = 1; a >= 0; s *= (int)root->shape[a--]) {
        v->size[a] = root->shape[a];
        v->stride[a] = s;
        v->div[a] = 1;
    }
    while (n--) {
        Node *p = chain[n];
        Tensor *out = p->outputs[0];
        int64_t perm[MAX_RANK];
        if (n >= 2 && p->inputs[0]->rank == v->rank &&
            merged_transpose(p, chain[n - 1], chain[n - 2], perm)) {
            permute_view(v, perm);
            n -= 2;
        } else if (p->op == OP_GATHER) { /* one index: its axis goes */
            int64_t a = attr_int(p, "axis");
            a = a < 0 ? a + v->rank : a;
            if (v->div[a] != 1 || v->rank != p->inputs[0]->rank)
                return false;
            v->base += one_index(p) * v->stride[a];
            for (int b = (int)a; b + 1 < v->rank; b++) {
                v->size[b] = v->size[b + 1];
                v->stride[b] = v->stride[b + 1];
                v->div[b] = v->div[b + 1];
            }
            v->rank--;
        } else if (p->op == OP_SPLIT) { /* part k: after the parts before it */
            int axis;
            int64_t *sizes = split_sizes(p, &axis), at = 0;
            if (v->rank != p->inputs[0]->rank || v->div[axis] != 1)
                return false;
            for (int k = 0; k < part[n]; k++)
                at += sizes[k];
            v->base += at * v->stride[axis];
            v->size[axis] = sizes[part[n]];
        } else if (p->op == OP_SLICE) {
            int64_t start[MAX_RANK], step[MAX_RANK], shape[MAX_RANK];
            slice_params(p, start, step, shape);
            if (v->rank != p->inputs[0]->rank)
                return false;
            for (int a = 0; a < v->rank; a++) {
                if (start[a] && v->div[a] != 1)
                    return false;
                v->base += start[a] * v->stride[a];
                v->size[a] = shape[a];
            }
        } else if (is_view(p)) {
            if (!reshape_view(v, out->rank, out->shape))
                return false;
        } else if (p->op == OP_TRANSPOSE) {
            if (attr_ints(p, "perm", perm, MAX_RANK) != v->rank)
                return false;
            permute_view(v, perm);
        } else { /* expand: aligned at the last axis, unit axes broadcast */
            View o = {v->root, out->rank, {0}, {0}, {0}, v->base};
            int off = out->rank - v->rank;
            if (off < 0)
                return false;
            for (int a = 0; a < out->rank; a++) {
                int src = a - off;
                bool bc = src < 0 || v->size[src] == 1;
                o.size[a] = out->shape[a];
                o.stride[a] = bc ? 0 : v->stride[src];
                o.div[a] = bc ? 1 : v->div[src];
                if (!bc && v->size[src] != out->shape[a])
                    return false;
            }
            *v = o;
        }
    }
    return v->rank == t->rank;
}
