/*
 * rewrite_attention.c: scaled-dot-product attention put back together
 * (rewrite.c's list says what it matches), its operands followed back
 * through views (views.c) to the tensors the attention node reads in
 * place, constant additive terms summed into one mask.
 */
#include "rewrite.h"

#include <math.h>
#include <string.h>

/* ---- attention ------------------------------------------------------------ */

/* An operand of attention: a view [batch, heads, positions, width] of a
 * contiguous root in layout bshd or bhsd, heads in groups of `group`
 * sharing one of the root's `heads`. In bshd the root's rows (a position
 * of a batch) may be wider than the heads (`row` elements), the heads
 * `off` elements in: a packed QKV product's part (qkv[1] of [3, B, heads,
 * S, d] transposed from its [B, S, 3, heads, d]). */
typedef struct Operand4 {
    Tensor *root;
    int64_t B, H, S, W, group, heads, row, off;
} Operand4;

static bool as_operand(const View *v, Operand4 *o, int layout) {
    /* layout: 0 bhsd, 1 bshd */
    if (v->rank != 4)
        return false;
    o->root = v->root;
    o->B = v->size[0], o->H = v->size[1], o->S = v->size[2], o->W = v->size[3];
    o->group = v->size[1] > 1 ? v->div[1] : 1;
    if (o->group < 1 || o->H % o->group || (v->size[3] > 1 && v->stride[3] != 1) ||
        v->div[0] != 1 || v->div[2] != 1 || v->div[3] != 1)
        return false;
    o->heads = o->H / o->group;
    int64_t W = o->W, S = o->S, HK = o->heads;
    o->row = HK * W;
    o->off = v->base;
    if (layout == 1 && S > 1 && v->stride[2] > HK * W) /* wider rows: a packed product */
        o->row = v->stride[2];
    bool head_ok[2] = {v->size[1] == 1 || v->stride[1] == S * W,
                       v->size[1] == 1 || v->stride[1] == W};
    bool pos_ok[2] = {S == 1 || v->stride[2] == W, S == 1 || v->stride[2] == o->row};
    bool batch_ok = o->B == 1 || v->stride[0] == (layout ? S * o->row : HK * S * W);
    if (tensor_count(v->root) != o->B * S * o->row || !batch_ok ||
        (layout == 0 && o->off) || o->off < 0 || o->off + HK * W > o->row)
        return false;
    return head_ok[layout] && pos_ok[layout];
}

/* The root viewed in the layout's shape (itself when it has it): bhsd
 * [batch, heads, positions, width], bshd [batch, positions, heads * width]. */
static Tensor *operand_tensor(Rewriter *r, Node *at, const char *what, const Operand4 *o,
                              bool bshd, Node **fresh, int *nfresh) {
    int64_t shape[4] = {o->B, o->heads, o->S, o->W};
    if (bshd)
        shape[1] = o->S, shape[2] = o->row;
    int rank = bshd ? 3 : 4;
    if (o->root->rank == rank &&
        memcmp(o->root->shape, shape, sizeof(int64_t) * (size_t)rank) == 0)
        return o->root;
    Node *v = rw_new_view(r, at, what, o->root, rank, shape);
    fresh[(*nfresh)++] = v;
    return v->outputs[0];
}

/* An operand of a product inside attention, as a view [batch, heads, a,
 * b] (frame: batch and heads; a and b its last two extents; the axes
 * before the heads merged into the batch), products by constant scalars
 * folded into *scale (V passes NULL: V's scale is not the scores'). A
 * rank-3 operand [batch * heads, a, b] is traced from what its reshape
 * merged, which may be no single strided run at rank 3. */
static bool operand_view(Tensor *t, const int64_t *frame, View *v, double *scale) {
    int64_t shape[4] = {frame[0], frame[1], t->shape[t->rank - 2], t->shape[t->rank - 1]};
    if (t->rank == 3 && t->producer && is_view_op(t->producer->op) &&
        t->producer->inputs[0]->rank > 3)
        t = t->producer->inputs[0];
    bool ok = scale ? trace_view_scaled(t, v, scale) : trace_view(t, v);
    return ok && reshape_view(v, 4, shape);
}

static bool traced_attention(Rewriter *r, Node *n, const View *qv, const View *kv,
                             const View *vv, Tensor *mask, double scale, Node *like);

/* Whether t is a constant f32 or f16 tensor of finite values (a mask that
 * hides no row's every key: softmax over it never meets a row of -inf
 * only). */
static bool finite_constant(const Tensor *t) {
    if (t->kind != T_WEIGHT || !t->data || !is_float(t->dtype))
        return false;
    for (int64_t i = 0; i < tensor_count(t); i++)
        if (!isfinite(weight_float(t, i)))
            return false;
    return true;
}

/* Term t (a constant) broadcast to `shape` (numpy's rule), added into
 * sum's count elements in row-major order; false where it does not
 * broadcast. */
static bool add_broadcast(float *sum, const Tensor *t, int rank, const int64_t *shape) {
    int64_t st[MAX_RANK], count = 1;
    for (int i = rank - 1, it = t->rank - 1, e = 1; i >= 0; i--, it--) {
        int64_t d = it >= 0 ? t->shape[it] : 1;
        if (d != shape[i] && d != 1)
            return false;
        st[i] = d == 1 ? 0 : e;
        e *= d;
        count *= shape[i];
    }
    if (t->rank > rank)
        return false;
    for (int64_t e = 0; e < count; e++) {
        int64_t rem = e, at = 0;
        for (int i = rank - 1; i >= 0; i--) {
            at += rem % shape[i] * st[i];
            rem /= shape[i];
        }
        sum[e] += weight_float(t, at);
    }
    return true;
}

/* A constant mask m (f32, rank 4) made as small as it broadcasts: each
 * axis along which its values repeat cut to one (a bias shared by every
 * window: [1, heads, N, N], read by each window, not copied per window). */
static void shrink_broadcast(Tensor *m) {
    float *d = (float *)m->data;
    for (int a = 0; a < m->rank; a++) {
        int64_t outer = 1, inner = 1, n = m->shape[a];
        for (int i = 0; i < a; i++)
            outer *= m->shape[i];
        for (int i = a + 1; i < m->rank; i++)
            inner *= m->shape[i];
        bool same = n > 1;
        for (int64_t o = 0; o < outer && same; o++)
            for (int64_t k = 1; k < n && same; k++)
                same = memcmp(d + (o * n + k) * inner, d + o * n * inner,
                              sizeof(float) * (size_t)inner) == 0;
        if (!same)
            continue;
        for (int64_t o = 0; o < outer; o++) /* keep index 0 of axis a */
            memmove(d + o * inner, d + o * n * inner, sizeof(float) * (size_t)inner);
        m->shape[a] = 1;
    }
}

void try_attention(Rewriter *r, Node *n) {
    int rank = n->outputs[0]->rank;
    if (n->op != OP_MATMUL || rank < 3)
        return;
    Tensor *p = n->inputs[0], *mask = NULL;
    /* [..., heads, queries, keys]: the heads the axis before the last two,
     * the batch all those before them (Einsum's [B, G, H, I, J] over
     * MaxViT's windows G), through a reshape (Einsum's, of the same
     * shape; rank 3: [batch * heads, queries, keys], of the softmax's
     * probabilities at rank 4 or more) */
    if (p->producer && is_view_op(p->producer->op) && p->producer->inputs[0]->rank > 3 &&
        p->producer->inputs[0]->shape[p->producer->inputs[0]->rank - 1] == p->shape[rank - 1])
        p = p->producer->inputs[0];
    if (p->rank < 4)
        return;
    int64_t frame[2] = {tensor_count(p) / (p->shape[p->rank - 3] * p->shape[p->rank - 2] *
                                           p->shape[p->rank - 1]),
                        p->shape[p->rank - 3]};
    Node *guard = rw_made_by(p, OP_WHERE);
    double zero;
    if (guard) { /* where(isnan(P), 0, P) */
        Node *nan = rw_made_by(guard->inputs[0], OP_ISNAN);
        if (!nan || nan->inputs[0] != guard->inputs[2] || !rw_scalar_of(guard->inputs[1], &zero) ||
            zero != 0.0)
            return;
        p = guard->inputs[2];
    }
    Node *sm = rw_made_by(p, OP_SOFTMAX);
    if (!sm || rw_last_axis(sm, "axis", p->rank) != p->rank - 1)
        return;
    /* the scores plus up to two additive terms, each add of its input's
     * shape, through reshapes that keep the keys' axis (Swin: the
     * relative-position bias, then the shifted windows' mask added to the
     * scores viewed as [1, windows, heads, N, N]) */
    Tensor *scores = sm->inputs[0], *terms[2], *frames[2];
    int nterms = 0;
    bool reshaped = false;
    int64_t keys = scores->shape[scores->rank - 1];
    Node *add, *qk;
    for (;;) {
        Node *v = scores->producer;
        if ((add = rw_made_by(scores, OP_ADD))) {
            Tensor *inner = NULL;
            for (int i = 0; i < 2 && !inner; i++) {
                Node *m = add->inputs[i]->producer;
                if (m && (m->op == OP_MATMUL || m->op == OP_ADD || is_view_op(m->op))) {
                    inner = add->inputs[i];
                    terms[nterms] = add->inputs[1 - i];
                    frames[nterms] = add->outputs[0];
                }
            }
            if (!inner || nterms == 2 || !shape_equal(inner, add->outputs[0]))
                return;
            nterms++;
            scores = inner;
        } else if (v && is_view_op(v->op) && v->op != OP_TRANSPOSE && v->ninputs >= 1 &&
                   tensor_count(v->inputs[0]) == tensor_count(scores) &&
                   v->inputs[0]->shape[v->inputs[0]->rank - 1] == keys) {
            reshaped = true;
            scores = v->inputs[0];
        } else {
            break;
        }
    }
    if (!(qk = rw_made_by(scores, OP_MATMUL)) || scores->rank != rank)
        return;
    int64_t shape4[4] = {frame[0], frame[1], scores->shape[rank - 2], scores->shape[rank - 1]};
    if (nterms == 1 && !reshaped && rank == 4) {
        mask = terms[0];
        /* a masked row that sees no key must give zeros: the NaN guard, or
         * a mask that hides no row (finite constants) */
        if (!is_float(mask->dtype) || mask->rank > 4 ||
            (!guard && !finite_constant(mask)))
            return;
    } else if (nterms) { /* constants: their sum at the scores' shape, once */
        float *sum = xcalloc((size_t)tensor_count(scores) + 1, sizeof(float));
        for (int i = 0; i < nterms; i++)
            if (!finite_constant(terms[i]) ||
                !add_broadcast(sum, terms[i], frames[i]->rank, frames[i]->shape)) {
                xfree(sum);
                return;
            }
        mask = graph_tensor(r->g, format("kiln.mask.%s", n->name), T_WEIGHT, n->loc);
        mask->dtype = KILN_DTYPE_F32;
        mask->rank = 4;
        memcpy(mask->shape, shape4, sizeof shape4);
        mask->data = (uint8_t *)sum;
        mask->src.from = W_VALUES;
        shrink_broadcast(mask);
    }
    double scale = 1.0;
    View qv, kv, vv;
    if (!operand_view(qk->inputs[0], frame, &qv, &scale) ||
        !operand_view(qk->inputs[1], frame, &kv, &scale) ||
        !operand_view(n->inputs[1], frame, &vv, NULL))
        return;
    /* K^T [b, h, d, s] as K [b, h, s, d] */
    int64_t sz = kv.size[2], st = kv.stride[2], dv = kv.div[2];
    kv.size[2] = kv.size[3], kv.stride[2] = kv.stride[3], kv.div[2] = kv.div[3];
    kv.size[3] = sz, kv.stride[3] = st, kv.div[3] = dv;
    r->attention += traced_attention(r, n, &qv, &kv, &vv, mask, scale, NULL);
}

/* The permutation of rank r that swaps the heads' axis and the queries'
 * (r - 3 and r - 2), into perm. */
static void heads_swap(int r, int64_t *perm) {
    for (int a = 0; a < r; a++)
        perm[a] = a;
    perm[r - 3] = r - 2;
    perm[r - 2] = r - 3;
}

/* Whether every reader of t [..., H, S, D] (one at least) is a transpose
 * to [..., S, H, D], and t is no model output. */
static bool heads_merged(Graph *g, const Tensor *t) {
    int readers = 0;
    if (t->is_output || t->is_update || t->rank < 4)
        return false;
    int64_t want[MAX_RANK];
    heads_swap(t->rank, want);
    for (int i = 0; i < g->nodes.len; i++) {
        Node *m = g->nodes.data[i];
        for (int k = 0; k < m->ninputs; k++) {
            if (m->inputs[k] != t)
                continue;
            int64_t perm[MAX_RANK];
            if (m->op != OP_TRANSPOSE || attr_ints(m, "perm", perm, MAX_RANK) != t->rank ||
                memcmp(perm, want, sizeof(int64_t) * (size_t)t->rank) != 0)
                return false;
            readers++;
        }
    }
    return readers > 0;
}

/* n's value [B, H, Sq, DV] computed by one attention of Q, K and V read in
 * place through their views; causal, softcap and window from `like` (an
 * attention node) when given. Whether the rewrite settled. */
static bool traced_attention(Rewriter *r, Node *n, const View *qv, const View *kv,
                             const View *vv, Tensor *mask, double scale, Node *like) {
    Operand4 Q, K, V;
    int layout = -1;
    for (int l = 0; l < 2 && layout < 0; l++)
        if (as_operand(qv, &Q, l) && as_operand(kv, &K, l) && as_operand(vv, &V, l))
            layout = l;
    if (layout < 0 || Q.group != 1 || K.heads != V.heads || K.group != V.group ||
        Q.H != K.H || Q.H != V.H || K.S != V.S || Q.W != K.W || Q.B != K.B || Q.B != V.B ||
        !is_float(Q.root->dtype) ||
        K.root->dtype != Q.root->dtype || V.root->dtype != Q.root->dtype)
        return false;
    bool bshd = layout == 1;
    /* rows wider than the heads, or heads not at their start: the packed
     * form (head_dim, offsets), one width for all three */
    bool packed = bshd && (Q.row != Q.heads * Q.W || K.row != K.heads * K.W ||
                           V.row != V.heads * V.W || Q.off || K.off || V.off);
    if (packed && Q.W != V.W)
        return false;
    Node *fresh[7];
    int nfresh = 0;
    Tensor *in[4] = {operand_tensor(r, n, "q", &Q, bshd, fresh, &nfresh),
                     operand_tensor(r, n, "k", &K, bshd, fresh, &nfresh),
                     operand_tensor(r, n, "v", &V, bshd, fresh, &nfresh), mask};
    Node *att = rw_new_node(r, OP_ATTENTION, n, "attention", mask ? 4 : 3, in);
    node_set_attr(att, "layout", bshd ? "bshd" : "bhsd");
    if (bshd) {
        node_set_int(att, "heads", Q.H);
        node_set_int(att, "kv_heads", K.heads);
    }
    if (packed) {
        node_set_int(att, "head_dim", Q.W);
        node_set_int(att, "q_offset", Q.off);
        node_set_int(att, "k_offset", K.off);
        node_set_int(att, "v_offset", V.off);
    }
    node_set_float(att, "scale", scale);
    for (int i = 0; like && i < like->nattrs; i++) {
        const Attr *a = &like->attrs[i];
        if (!a->is_list && (strcmp(a->key, "causal") == 0 || strcmp(a->key, "softcap") == 0 ||
                            strcmp(a->key, "window") == 0))
            node_set_attr(att, a->key, a->scalar);
    }
    /* bhsd operands whose result only a transpose to [B, Sq, H, DV] reads
     * (the heads' merge before the output projection): the kernel writes
     * that layout itself, and the transpose below cancels against it */
    bool out_bshd = bshd || heads_merged(r->g, n->outputs[0]);
    if (out_bshd && !bshd)
        node_set_attr(att, "out_layout", "bshd");
    fresh[nfresh++] = att;
    Node saved;
    Tensor saved_out;
    Tensor *out = n->outputs[0]; /* [..., H, Sq, DV] (or [B * H, Sq, DV]) */
    int rank = out->rank;
    if (out_bshd) {
        /* [B, Sq, H * DV] as [..., Sq, H, DV], then transposed (rank 3:
         * [B, Sq, H, DV] transposed, then viewed as [B * H, Sq, DV]) */
        int64_t shape[MAX_RANK], perm[MAX_RANK];
        int vr = rank < 4 ? 4 : rank;
        memcpy(shape, rank < 4 ? (int64_t[]){Q.B, Q.H, Q.S, V.W} : out->shape,
               sizeof(int64_t) * (size_t)vr);
        int64_t h = shape[vr - 3];
        shape[vr - 3] = shape[vr - 2];
        shape[vr - 2] = h;
        heads_swap(vr, perm);
        Node *v = rw_new_view(r, n, "heads", att->outputs[0], vr, shape);
        fresh[nfresh++] = v;
        if (rank < 4) {
            Node *t = rw_new_node(r, OP_TRANSPOSE, n, "merged", 1, &v->outputs[0]);
            node_set_ints(t, "perm", vr, perm);
            fresh[nfresh++] = t;
            rw_become(n, OP_RESHAPE, 1, &t->outputs[0], &saved, &saved_out);
            node_set_ints(n, "shape", rank, out->shape);
        } else {
            rw_become(n, OP_TRANSPOSE, 1, &v->outputs[0], &saved, &saved_out);
            node_set_ints(n, "perm", rank, perm);
        }
    } else {
        rw_become(n, OP_RESHAPE, 1, &att->outputs[0], &saved, &saved_out);
        node_set_ints(n, "shape", rank, out->shape);
    }
    return rw_settle(r, fresh, nfresh, n, &saved, &saved_out);
}

/* An attention node (ONNX Attention 23) of [B, H, S, D] operands that are
 * views of other tensors (the heads' transposes, repeated key/value heads
 * of the cache): read those in place, saving the copies. */
void try_attention_operands(Rewriter *r, Node *n) {
    if (n->op != OP_ATTENTION || n->outputs[0]->rank != 4 ||
        attr_choice(n, "layout", (const char *const[]){"bhsd", "bshd"}, 2) != 0)
        return;
    View qv, kv, vv;
    bool moved = false;
    Tensor *in[3] = {n->inputs[0], n->inputs[1], n->inputs[2]};
    View *views[3] = {&qv, &kv, &vv};
    for (int i = 0; i < 3; i++) {
        if (!trace_view(in[i], views[i]))
            return;
        moved |= views[i]->root != in[i];
    }
    double scale = attr_float_or(n, "scale", 1.0 / sqrt((double)in[0]->shape[3]));
    if (moved && traced_attention(r, n, &qv, &kv, &vv, n->ninputs > 3 ? n->inputs[3] : NULL,
                                  scale, n))
        r->attention++;
}
