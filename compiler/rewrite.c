/*
 * rewrite.c: ops that exporters write out in pieces, put back together.
 *
 * torch.onnx.export (dynamo) decomposes RMSNorm, rotary embeddings and
 * scaled-dot-product attention into elementwise ops, reductions, slices,
 * transposes, matmuls and a softmax: a decoder layer becomes some fifty
 * dispatches, most of them over padded [heads, seq, keys] tensors. This
 * pass finds those subgraphs and computes them with kiln's own rms_norm,
 * rope and attention instead. Each rewrite checks every condition under
 * which the replacement computes the same values, and infers the nodes it
 * makes; when anything fails, the graph stays as it was. The nodes it
 * replaces are left in place for optimize's dead-node removal (a pattern
 * whose intermediates something else reads keeps them).
 *
 * - rms_norm: gamma * (x * reciprocal(sqrt(mean(x^2, last axis) + eps)))
 *   (rsqrt, or x / sqrt(...), as well).
 * - rope, rotate-half: x * C + concat(-x[..., h:], x[..., :h]) * S, where C
 *   and S are cos and sin of concat(f, f) along the last axis (the two
 *   halves provably equal) seen through views that add unit axes. kiln's
 *   rope reads cos(f) and sin(f) as [positions, h]; when x is a transpose of
 *   y (heads before positions, a dynamic inner axis), the rope runs on y
 *   and the transpose after it.
 * - attention: matmul(P, V), P = softmax(matmul(Q * a, K^T * b) [+ mask])
 *   over the keys, or P NaN-guarded (where(isnan(P), 0, P): a row that sees
 *   no key gives zeros, as the attention kernel does). Q, K^T and V are
 *   followed back through transposes, views and broadcasts (repeated
 *   key/value heads) and parts picked by a constant index, a slice or a
 *   split to the tensors they index, which must be contiguous [batch,
 *   heads, positions, width] or [batch, positions, heads, width], or rows
 *   [batch, positions, ...] holding the heads at an offset (one packed QKV
 *   product's output, [B, S, 3 * heads * width] as timm, GPT-2 and Phi-3
 *   compute q, k and v: attention's head_dim and offsets): attention reads
 *   them in place (a decoder's cache state directly; the packed product
 *   without its transposes or split) and never stores the scores. The
 *   mask, if any, is its additive input. A result that only transposes to
 *   [batch, positions, heads, width] read (the heads' merge before the
 *   output projection) is written in that layout by the kernel itself
 *   (out_layout bshd): the transposes cancel.
 *   (rewrite_attention.c.)
 * - transposes: a transpose of a transpose that permute nothing together
 *   is its readers reading the original; transposes between reshapes,
 *   each read by nothing else, one transpose of a view where their
 *   composed map is one permutation.
 * - batch_norm of constant parameters not after a convolution (which
 *   optimize.c folds): x * a + b, for the elementwise chain after it.
 * - gelu_tanh: 0.5 x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 pow(x, 3))))
 *   (GPT-2's and others' "new" GELU), each product and sum in either
 *   order: kiln's gelu_tanh, which a product before it then takes into its
 *   epilogue (optimize.c).
 * - silu: x * sigmoid(x), either order (the exporter's SiLU and Swish):
 *   kiln's silu, which a convolution or product before it takes into its
 *   epilogue (EfficientNet's every convolution) and which a decoder's
 *   gated MLP, silu(gate) * up, hands to its product (lower_matmul.c,
 *   glu_after_product).
 * - outer products: matmul(a, b) with a [..., M, 1] and b [..., 1, N] is
 *   a * b broadcast (one product an element, no sum: the same values), an
 *   elementwise dispatch in place of a product's (the rotary embedding's
 *   inv_freq @ position_ids in every transformers decoder; not yet fused
 *   with the cast before it or the transpose after it).
 */
#include "rewrite.h"

#include <math.h>
#include <string.h>

/* A two-input node's operands with the one satisfying pred first. */
static bool pick(const Node *n, bool (*pred)(const Tensor *), Tensor **yes, Tensor **no) {
    for (int i = 0; i < 2; i++)
        if (pred(n->inputs[i])) {
            *yes = n->inputs[i];
            *no = n->inputs[1 - i];
            return true;
        }
    return false;
}

static bool is_scalar(const Tensor *t) {
    double v;
    return rw_scalar_of(t, &v);
}

/* ---- new nodes ------------------------------------------------------------ */

/* n (a binary elementwise node of x and another operand) made the unary
 * op `op` of x, when x is f32 of n's shape; counted in *count when it
 * infers. */
static void become_unary(Rewriter *r, Node *n, OpKind op, Tensor *x, int *count) {
    if (!is_float(x->dtype) || !shape_equal(x, n->outputs[0]))
        return;
    Node saved;
    Tensor saved_out;
    rw_become(n, op, 1, &x, &saved, &saved_out);
    *count += rw_settle(r, NULL, 0, n, &saved, &saved_out);
}

/* ---- rms_norm ------------------------------------------------------------- */

/* a = mean(x^2 over the last axis) + eps: x, and eps. */
static Tensor *mean_square_eps(Tensor *a, double *eps) {
    Node *add = rw_made_by(a, OP_ADD);
    Tensor *eps_t, *mean_t;
    if (!add || !pick(add, is_scalar, &eps_t, &mean_t) || !rw_scalar_of(eps_t, eps))
        return NULL;
    Node *mean = rw_made_by(mean_t, OP_REDUCE_MEAN);
    if (!mean || attr_int(mean, "keep_dims") != 1)
        return NULL;
    int64_t axes[MAX_RANK];
    Tensor *p = mean->inputs[0];
    if (attr_ints(mean, "axes", axes, MAX_RANK) != 1 ||
        (axes[0] != -1 && axes[0] != p->rank - 1))
        return NULL;
    Node *pw = rw_made_by(p, OP_POW), *mul = rw_made_by(p, OP_MUL);
    double two;
    if (pw && rw_scalar_of(pw->inputs[1], &two) && two == 2.0)
        return pw->inputs[0];
    if (mul && mul->inputs[0] == mul->inputs[1])
        return mul->inputs[0];
    return NULL;
}

/* t = sqrt(a): mean_square_eps(a). */
static Tensor *root_mean_square(Tensor *t, double *eps) {
    Node *sq = rw_made_by(t, OP_SQRT);
    return sq ? mean_square_eps(sq->inputs[0], eps) : NULL;
}

/* t = x * reciprocal(rms), x * rsqrt(a) or x / rms: x, and eps. */
static Tensor *rms_normalized(Tensor *t, double *eps) {
    Node *m = rw_made_by(t, OP_MUL), *d = rw_made_by(t, OP_DIV);
    if (d)
        return root_mean_square(d->inputs[1], eps) == d->inputs[0] ? d->inputs[0] : NULL;
    for (int i = 0; m && i < 2; i++) {
        Tensor *x = m->inputs[i], *inv = m->inputs[1 - i];
        Node *rc = rw_made_by(inv, OP_RECIPROCAL), *rs = rw_made_by(inv, OP_RSQRT);
        Tensor *x2 = rc ? root_mean_square(rc->inputs[0], eps)
                        : rs ? mean_square_eps(rs->inputs[0], eps) : NULL;
        if (x2 == x)
            return x;
    }
    return NULL;
}

/* Whether n casts between f32 and f16 (an f16 model's cos.to(x.dtype)). */
static bool float_cast(const Node *n) {
    return n && n->op == OP_CAST && n->ninputs == 1 && is_float(n->inputs[0]->dtype) &&
           is_float(n->outputs[0]->dtype);
}

/* t = cast(x) from f16 up to f32 (from f32 down to f16 when down): x, or
 * NULL. */
static Tensor *cast_from(Tensor *t, bool down) {
    Node *c = t ? t->producer : NULL;
    if (!float_cast(c) || c->inputs[0]->dtype == c->outputs[0]->dtype)
        return NULL;
    return (c->inputs[0]->dtype == KILN_DTYPE_F16) != down ? c->inputs[0] : NULL;
}

/* gamma * y. In an f16 model, transformers' RMSNorm normalizes in f32 and
 * casts back before the scale: y = cast16(cast32(x) * rsqrt(...)); the
 * norm of x then reads x itself (kiln's rms_norm sums its squares in f32
 * whatever x's dtype, and rounds once, after the scale). */
static void try_rms_norm(Rewriter *r, Node *n) {
    if (n->op != OP_MUL)
        return;
    for (int i = 0; i < 2; i++) {
        Tensor *gamma = n->inputs[i], *y = n->inputs[1 - i], *y32 = cast_from(y, true);
        double eps;
        Tensor *x = rms_normalized(y32 ? y32 : y, &eps);
        if (x && y32)
            x = cast_from(x, false);
        if (!x || gamma->kind != T_WEIGHT || gamma->rank != 1 || x->rank < 1 ||
            gamma->shape[0] != x->shape[x->rank - 1] || !is_float(x->dtype) ||
            !is_float(gamma->dtype))
            continue;
        Node saved;
        Tensor saved_out;
        rw_become(n, OP_RMS_NORM, 2, (Tensor *[]){x, gamma}, &saved, &saved_out);
        node_set_int(n, "axis", -1);
        node_set_float(n, "eps", eps);
        r->rms += rw_settle(r, NULL, 0, n, &saved, &saved_out);
        return;
    }
}

/* ---- gelu_tanh ------------------------------------------------------------ */

/* Whether t is a one-element f32 or f16 weight of value c (within its
 * dtype's rounding: half an f16 ulp is 2^-11 of the value). */
static bool constant_is(const Tensor *t, double c) {
    double v;
    double tol = t && t->dtype == KILN_DTYPE_F16 ? 1.0 / 2048 : 1e-6;
    return rw_scalar_of(t, &v) && fabs(v - c) <= tol * fabs(c);
}

/* t = c * m or m * c for the constant c: m. */
static Tensor *scaled_by(Tensor *t, double c) {
    Node *mul = rw_made_by(t, OP_MUL);
    Tensor *k, *m;
    return mul && pick(mul, is_scalar, &k, &m) && constant_is(k, c) ? m : NULL;
}

/* t = x + 0.044715 pow(x, 3): x. */
static Tensor *cubic_sum(Tensor *t) {
    Node *a = rw_made_by(t, OP_ADD);
    for (int i = 0; a && i < 2; i++) {
        Tensor *cube = scaled_by(a->inputs[1 - i], 0.044715);
        Node *pw = cube ? rw_made_by(cube, OP_POW) : NULL;
        if (pw && pw->inputs[0] == a->inputs[i] && constant_is(pw->inputs[1], 3.0))
            return a->inputs[i];
    }
    return NULL;
}

/* t = 1 + tanh(sqrt(2 / pi) * cubic_sum(x)): x. */
static Tensor *one_plus_tanh(Tensor *t) {
    Node *a = rw_made_by(t, OP_ADD), *th;
    Tensor *one, *u, *s;
    if (!a || !pick(a, is_scalar, &one, &u) || !constant_is(one, 1.0) ||
        !(th = rw_made_by(u, OP_TANH)) || !(s = scaled_by(th->inputs[0], 0.7978845608028654)))
        return NULL;
    return cubic_sum(s);
}

/* n = (0.5 x) * one_plus_tanh(x), of x's shape: gelu_tanh(x). */
static void try_gelu_tanh(Rewriter *r, Node *n) {
    if (n->op != OP_MUL)
        return;
    for (int i = 0; i < 2; i++) {
        Tensor *x = scaled_by(n->inputs[i], 0.5);
        if (x && one_plus_tanh(n->inputs[1 - i]) == x) {
            become_unary(r, n, OP_GELU_TANH, x, &r->gelu);
            return;
        }
    }
}

/* ---- silu ----------------------------------------------------------------- */

/* n = x * sigmoid(x) (either order), of x's shape: silu(x). */
static void try_silu(Rewriter *r, Node *n) {
    if (n->op != OP_MUL)
        return;
    for (int i = 0; i < 2; i++) {
        Tensor *x = n->inputs[i];
        Node *sg = rw_made_by(n->inputs[1 - i], OP_SIGMOID);
        if (sg && sg->inputs[0] == x) {
            become_unary(r, n, OP_SILU, x, &r->silu);
            return;
        }
    }
}

/* ---- outer products -------------------------------------------------------- */

/* Whether axis `axis` (from the end: 1 the last) of t is a fixed 1. */
static bool unit_axis(const Tensor *t, int axis) {
    int i = t->rank - axis;
    return t->shape[i] == 1 && !(t->dyn_axes >> i & 1u);
}

/* n = matmul(a, b), a [..., M, 1] and b [..., 1, N] (both of rank 2 or
 * more, float, no transposes): mul(a, b), broadcast along the same axes. */
static void try_outer_product(Rewriter *r, Node *n) {
    if (n->op != OP_MATMUL || n->ninputs != 2 || n->nattrs)
        return;
    Tensor *a = n->inputs[0], *b = n->inputs[1];
    if (a->rank < 2 || b->rank < 2 || !unit_axis(a, 1) || !unit_axis(b, 2) ||
        a->dtype != b->dtype || !is_float(a->dtype))
        return;
    Node saved;
    Tensor saved_out;
    Tensor *in[2] = {a, b};
    rw_become(n, OP_MUL, 2, in, &saved, &saved_out);
    r->outer += rw_settle(r, NULL, 0, n, &saved, &saved_out);
}

/* ---- rope ----------------------------------------------------------------- */

/* The sizes other than 1, in order; returns their count. */
static int big_dims(const Tensor *t, int64_t *out) {
    int n = 0;
    for (int a = 0; a < t->rank; a++)
        if (t->shape[a] != 1)
            out[n++] = t->shape[a];
    return n;
}

/* t = x[..., :h] when first, else x[..., h:] (h = half the last axis, every
 * other axis whole): x. */
static Tensor *half_of(Tensor *t, bool first) {
    Node *s = rw_made_by(t, OP_SLICE);
    if (!s)
        return NULL;
    Tensor *x = s->inputs[0];
    int r = x->rank;
    int64_t D = r ? x->shape[r - 1] : 0, start[MAX_RANK], step[MAX_RANK], out[MAX_RANK];
    if (r < 2 || D % 2)
        return NULL;
    slice_params(s, start, step, out);
    for (int a = 0; a < r; a++) {
        int64_t want_start = a < r - 1 ? 0 : first ? 0 : D / 2;
        int64_t want_len = a < r - 1 ? x->shape[a] : D / 2;
        if (start[a] != want_start || step[a] != 1 || out[a] != want_len)
            return NULL;
    }
    return x;
}

/* t = concat(-x[..., h:], x[..., :h]) along the last axis: x. */
static Tensor *rotated_half(Tensor *t) {
    Node *c = rw_made_by(t, OP_CONCAT);
    if (!c || c->ninputs != 2 || rw_last_axis(c, "axis", t->rank) != t->rank - 1)
        return NULL;
    Node *neg = rw_made_by(c->inputs[0], OP_NEG);
    Tensor *x = neg ? half_of(neg->inputs[0], false) : NULL;
    return x && half_of(c->inputs[1], true) == x ? x : NULL;
}

/* t = op(concat(f, f) along the last axis) seen through views that only
 * add or drop unit axes, and casts between f32 and f16 (rope then
 * computes the table in f32): f. */
static Tensor *doubled_table(Tensor *t, OpKind op) {
    Tensor *v = t;
    while (is_view(v->producer) || float_cast(v->producer))
        v = v->producer->inputs[0];
    Node *trig = rw_made_by(v, op);
    Node *c = trig ? rw_made_by(trig->inputs[0], OP_CONCAT) : NULL;
    if (!c || c->ninputs != 2 || c->inputs[0] != c->inputs[1] ||
        rw_last_axis(c, "axis", v->rank) != v->rank - 1)
        return NULL;
    int64_t a[MAX_RANK], b[MAX_RANK];
    int na = big_dims(t, a), nb = big_dims(v, b);
    if (na != nb || memcmp(a, b, sizeof(int64_t) * (size_t)na) != 0)
        return NULL;
    return c->inputs[0];
}

/* cos(f) or sin(f) as [S, h], made once per table. */
static Tensor *rope_table(Rewriter *r, const Node *at, OpKind op, Tensor *f, int64_t S) {
    const char *key = format("%s(%s)[%lld]", op == OP_COS ? "cos" : "sin", f->name,
                             (long long)S);
    Tensor *t = map_get(&r->tables, key);
    if (t)
        return t;
    int64_t h = f->shape[f->rank - 1];
    Node *trig = rw_new_node(r, op, at, key, 1, &f);
    Node *view = rw_new_view(r, at, format("%s.2d", key), trig->outputs[0], 2,
                             (int64_t[]){S, h});
    if (!rw_settle(r, (Node *[]){trig, view}, 2, NULL, NULL, NULL))
        return NULL;
    map_put(&r->tables, key, view->outputs[0]);
    return view->outputs[0];
}

/* A constant table C (the exporter's folded cos or sin, [..., P, D] with
 * unit axes) whose two halves are equal in every row: its first halves
 * as a new [P, h] weight, made once; else NULL. */
static Tensor *constant_table(Rewriter *r, const Tensor *C, int64_t P) {
    int64_t D = C->rank ? C->shape[C->rank - 1] : 0, h = D / 2;
    if (C->kind != T_WEIGHT || !C->data || !is_float(C->dtype) || D % 2 ||
        tensor_count(C) != P * D)
        return NULL;
    const char *key = format("half(%s)", C->name);
    Tensor *t = map_get(&r->tables, key);
    if (t)
        return t;
    size_t es = (size_t)kiln_dtype_size(C->dtype);
    for (int64_t p = 0; p < P; p++)
        if (memcmp(C->data + es * (size_t)(p * D), C->data + es * (size_t)(p * D + h),
                   es * (size_t)h) != 0)
            return NULL;
    t = graph_tensor(r->g, format("kiln.rope.%s", C->name), T_WEIGHT, C->loc);
    t->dtype = KILN_DTYPE_F32;
    t->rank = 2;
    t->shape[0] = P;
    t->shape[1] = h;
    t->data = xcalloc((size_t)(P * h) + 1, sizeof(float));
    t->src.from = W_VALUES;
    for (int64_t p = 0; p < P; p++)
        for (int64_t j = 0; j < h; j++) {
            float f = weight_float(C, p * D + j);
            memcpy(t->data + 4 * (p * h + j), &f, 4);
        }
    map_put(&r->tables, key, t);
    return t;
}

/* rope's [P, h] cos and sin tables for the broadcast C and S: computed
 * from the source of a doubled table, or the halves of constant ones. */
static bool rope_tables(Rewriter *r, const Node *at, Tensor *C, Tensor *S, int64_t P,
                        Tensor **cos_t, Tensor **sin_t) {
    int64_t h = C->shape[C->rank - 1] / 2;
    Tensor *f = doubled_table(C, OP_COS);
    if (f && doubled_table(S, OP_SIN) == f && f->shape[f->rank - 1] == h &&
        tensor_count(f) == P * h) {
        *cos_t = rope_table(r, at, OP_COS, f, P);
        *sin_t = *cos_t ? rope_table(r, at, OP_SIN, f, P) : NULL;
        return *sin_t != NULL;
    }
    *cos_t = constant_table(r, C, P);
    *sin_t = *cos_t ? constant_table(r, S, P) : NULL;
    return *sin_t != NULL;
}

/* The positions axis of x that the broadcast table C ([..., D], its other
 * axes 1) follows, or -1. */
static int positions_axis(const Tensor *x, const Tensor *C) {
    int r = x->rank, off = r - C->rank, axis = -1;
    if (off < 0 || C->shape[C->rank - 1] != x->shape[r - 1])
        return -1;
    for (int a = 0; a + 1 < C->rank; a++)
        if (C->shape[a] != 1) {
            if (axis >= 0 || C->shape[a] != x->shape[a + off])
                return -1;
            axis = a + off;
        }
    for (int a = r - 2; axis < 0 && a >= 0; a--)
        if (x->shape[a] == 1)
            axis = a;
    return axis;
}

/* x = transpose(y) keeping the last axis (heads before positions): n
 * becomes the transpose of a rope on y, which attention may then read
 * through (no copy of the heads' layout; a dynamic inner axis of x is then
 * y's outermost, whose kernels run for its extent).
 * n_rot and interleaved come from `like` (a rope node) when given. -1 when
 * x is no such transpose, else whether the rewrite settled. */
static int rope_on_source(Rewriter *r, Node *n, Tensor *x, Tensor *cos_t, Tensor *sin_t,
                          int axis, Node *like) {
    Node *tr = rw_made_by(x, OP_TRANSPOSE);
    int64_t perm[MAX_RANK];
    if (!tr || attr_ints(tr, "perm", perm, MAX_RANK) != x->rank ||
        perm[x->rank - 1] != x->rank - 1)
        return -1;
    Node *fresh = rw_new_node(r, OP_ROPE, n, "rope", 3, (Tensor *[]){tr->inputs[0], cos_t, sin_t});
    node_set_int(fresh, "seq_axis", perm[axis]);
    if (like) {
        node_set_int(fresh, "interleaved", attr_int(like, "interleaved"));
        if (node_attr(like, "n_rot"))
            node_set_int(fresh, "n_rot", attr_int(like, "n_rot"));
    }
    Node saved;
    Tensor saved_out;
    rw_become(n, OP_TRANSPOSE, 1, &fresh->outputs[0], &saved, &saved_out);
    node_set_ints(n, "perm", x->rank, perm);
    return rw_settle(r, &fresh, 1, n, &saved, &saved_out);
}

/* A rope node (ONNX RotaryEmbedding 23) of a transpose whose positions are
 * dynamic along an inner axis: on the transpose's source instead (attention
 * then reads it in place). */
static void try_rope_source(Rewriter *r, Node *n) {
    if (n->op != OP_ROPE)
        return;
    Tensor *x = n->inputs[0];
    int axis = rw_last_axis(n, "seq_axis", x->rank);
    if (x->dyn_axes && !x->dynamic &&
        rope_on_source(r, n, x, n->inputs[1], n->inputs[2], axis, n) > 0)
        r->rope++;
}

static void try_rope(Rewriter *r, Node *n) {
    if (n->op != OP_ADD)
        return;
    for (int i = 0; i < 2; i++) {
        Node *rot = rw_made_by(n->inputs[i], OP_MUL), *lin = rw_made_by(n->inputs[1 - i], OP_MUL);
        for (int j = 0; rot && lin && j < 2; j++) {
            Tensor *x = rotated_half(rot->inputs[j]), *S = rot->inputs[1 - j];
            if (!x || (lin->inputs[0] != x && lin->inputs[1] != x))
                continue;
            Tensor *C = other_input(lin, x), *cos_t, *sin_t;
            int axis = positions_axis(x, C);
            if (axis < 0 || !shape_equal(C, S) || !is_float(x->dtype) ||
                n->outputs[0]->rank != x->rank ||
                !rope_tables(r, n, C, S, x->shape[axis], &cos_t, &sin_t))
                continue;
            int on_source = rope_on_source(r, n, x, cos_t, sin_t, axis, NULL);
            if (on_source < 0) {
                Node saved;
                Tensor saved_out;
                rw_become(n, OP_ROPE, 3, (Tensor *[]){x, cos_t, sin_t}, &saved, &saved_out);
                node_set_int(n, "seq_axis", axis);
                on_source = rw_settle(r, NULL, 0, n, &saved, &saved_out);
            }
            r->rope += on_source;
            return;
        }
    }
}

/* ---- batch_norm ----------------------------------------------------------- */

/* A per-channel constant [C, 1, ...] (rank - 1 axes, C first) of values v
 * (taken over), in dtype dt (f32 or f16), named after n. */
static Tensor *channel_constant(Rewriter *r, const Node *n, const char *what, float *v,
                                int64_t C, int rank, kiln_dtype dt) {
    Tensor *t = graph_tensor(r->g, format("kiln.%s.%s", what, n->name), T_WEIGHT, n->loc);
    t->dtype = dt;
    t->rank = rank - 1;
    t->shape[0] = C;
    for (int a = 1; a < rank - 1; a++)
        t->shape[a] = 1;
    if (dt == KILN_DTYPE_F16) {
        uint16_t *h = xcalloc((size_t)C + 1, sizeof *h);
        for (int64_t c = 0; c < C; c++)
            h[c] = float_to_half(v[c]);
        xfree(v);
        v = (float *)(void *)h;
    }
    t->data = (uint8_t *)v;
    t->src.from = W_VALUES;
    return t;
}

/* A batch norm of constant parameters that no convolution makes the
 * input of (optimize.c folds those into the filter): x * A + B, A and B
 * per channel computed here (A = scale / sqrt(var + eps), B = bias - mean
 * A), two elementwise nodes that the elementwise chain after them joins
 * in one dispatch (DenseNet's norm and ReLU before each convolution). */
static void try_batch_norm(Rewriter *r, Node *n) {
    if (n->op != OP_BATCH_NORM || n->ninputs != 5)
        return;
    Tensor *x = n->inputs[0];
    Node *made = x->producer;
    if ((made && (made->op == OP_CONV || made->op == OP_CONV_TRANSPOSE)) ||
        !is_float(x->dtype) || x->rank < 2 || is_dyn(x, 1))
        return;
    int64_t C = x->shape[1];
    const Tensor *p[4];
    for (int k = 1; k < 5; k++) {
        const Tensor *t = n->inputs[k];
        if (t->kind != T_WEIGHT || !t->data || !is_float(t->dtype) || tensor_count(t) != C)
            return;
        p[k - 1] = t;
    }
    double eps = attr_float(n, "eps");
    float *a = xcalloc((size_t)C + 1, sizeof(float)), *b = xcalloc((size_t)C + 1, sizeof(float));
    for (int64_t c = 0; c < C; c++) {
        double s = (double)weight_float(p[0], c) / sqrt((double)weight_float(p[3], c) + eps);
        a[c] = (float)s;
        b[c] = (float)((double)weight_float(p[1], c) - (double)weight_float(p[2], c) * s);
    }
    /* in x's dtype: the elementwise ops take one dtype (an f16 model's A
     * and B rounded to f16, as its own arithmetic would be) */
    Tensor *in[2] = {x, channel_constant(r, n, "bn_scale", a, C, x->rank, x->dtype)};
    Node *m = rw_new_node(r, OP_MUL, n, "scale", 2, in);
    Tensor *sum[2] = {m->outputs[0],
                      channel_constant(r, n, "bn_shift", b, C, x->rank, x->dtype)};
    Node saved;
    Tensor saved_out;
    rw_become(n, OP_ADD, 2, sum, &saved, &saved_out);
    r->batch_norms += rw_settle(r, &m, 1, n, &saved, &saved_out);
}

/* ---- transposes ----------------------------------------------------------- */

static void try_transposes(Rewriter *r, Node *n) {
    Tensor *y = n->outputs[0], *in = n->op == OP_TRANSPOSE ? n->inputs[0] : NULL;
    Node *same = rw_made_by(in, OP_RESHAPE); /* a reshape to its own shape (Einsum's output) */
    if (same && shape_equal(same->inputs[0], in))
        in = same->inputs[0];
    Node *first = in ? rw_made_by(in, OP_TRANSPOSE) : NULL;
    int64_t p1[MAX_RANK], p2[MAX_RANK];
    if (!first || y->is_output || y->is_update ||
        attr_ints(first, "perm", p1, MAX_RANK) != y->rank ||
        attr_ints(n, "perm", p2, MAX_RANK) != y->rank)
        return;
    for (int a = 0; a < y->rank; a++)
        if (p1[p2[a]] != a)
            return;
    Tensor *x = first->inputs[0];
    for (int i = 0; i < r->g->nodes.len; i++) {
        Node *m = r->g->nodes.data[i];
        for (int k = 0; k < m->ninputs; k++)
            if (m->inputs[k] == y)
                m->inputs[k] = x;
    }
    r->transposes++;
}

/* How many inputs of the graph's nodes are t. */
static int readers_of(const Graph *g, const Tensor *t) {
    int n = 0;
    for (int i = 0; i < g->nodes.len; i++) {
        const Node *m = g->nodes.data[i];
        for (int k = 0; k < m->ninputs; k++)
            n += m->inputs[k] == t;
    }
    return n;
}

/* A transpose whose input comes, through views and at least one more
 * transpose, each read by nothing else, from one tensor x: one transpose
 * of a view of x (MaxViT's window partition undone and its grid
 * partition made: three transposes between reshapes, one copy). Where the
 * composed map is x's elements in their own order (a transpose undone),
 * a view. */
static void try_transpose_chain(Rewriter *r, Node *n) {
    Tensor *y = n->outputs[0];
    if (n->op != OP_TRANSPOSE || y->dyn_axes)
        return;
    /* the inputs of the transposes before it, nearest first: the chain
     * traced back to the farthest that composes into one view */
    Tensor *starts[32];
    int earlier = 0;
    for (Tensor *t = n->inputs[0];
         t->producer && (is_view_op(t->producer->op) || t->producer->op == OP_TRANSPOSE) &&
         earlier < 32;
         t = t->producer->inputs[0]) {
        if (t->is_output || t->is_update || t->dyn_axes || readers_of(r->g, t) != 1)
            break;
        if (t->producer->op == OP_TRANSPOSE)
            starts[earlier++] = t->producer->inputs[0];
    }
    View v;
    bool traced = false;
    while (earlier > 0 && !traced) {
        traced = trace_view_until(y, &v, NULL, starts[--earlier]) &&
                 v.root == starts[earlier];
        traced = traced && !v.base && !v.root->dyn_axes &&
                 tensor_count(v.root) == tensor_count(y);
    }
    if (!traced)
        return;
    /* the axes of more than one element, by stride, outermost first: they
     * must tile x exactly (a reshape of x, then one permutation) */
    int ax[MAX_RANK], q = 0;
    for (int a = 0; a < v.rank; a++) {
        if (v.size[a] == 1)
            continue;
        if (v.div[a] != 1 || v.stride[a] <= 0)
            return;
        int at = q++;
        while (at > 0 && v.stride[ax[at - 1]] < v.stride[a]) {
            ax[at] = ax[at - 1];
            at--;
        }
        ax[at] = a;
    }
    if (q == 0)
        return;
    int64_t flat[MAX_RANK], perm[MAX_RANK], e = 1;
    for (int k = q - 1; k >= 0; k--) {
        if (v.stride[ax[k]] != e)
            return;
        flat[k] = v.size[ax[k]];
        e *= flat[k];
    }
    bool identity = true;
    for (int a = 0, j = 0; a < v.rank; a++) {
        if (v.size[a] == 1)
            continue;
        for (int k = 0; k < q; k++)
            if (ax[k] == a)
                perm[j] = k;
        identity &= perm[j] == j;
        j++;
    }
    Node *fresh[2];
    int nfresh = 0;
    Node *f = rw_new_view(r, n, "flat", v.root, q, flat);
    fresh[nfresh++] = f;
    Tensor *src = f->outputs[0];
    Node saved;
    Tensor saved_out;
    if (!identity && q != y->rank) { /* unit axes: the permutation, then y's shape */
        Node *t = rw_new_node(r, OP_TRANSPOSE, n, "chain", 1, &src);
        node_set_ints(t, "perm", q, perm);
        fresh[nfresh++] = t;
        src = t->outputs[0];
    }
    if (identity || q != y->rank) {
        rw_become(n, OP_RESHAPE, 1, &src, &saved, &saved_out);
        node_set_ints(n, "shape", y->rank, y->shape);
    } else {
        rw_become(n, OP_TRANSPOSE, 1, &src, &saved, &saved_out);
        node_set_ints(n, "perm", q, perm);
    }
    r->transposes += rw_settle(r, fresh, nfresh, n, &saved, &saved_out);
}

void rewrite_patterns(Graph *g, const Options *opt) {
    Rewriter r = {g, {0}, {0}, 0, 0, 0, 0, 0, 0, 0, 0};
    int count = g->nodes.len;
    for (int i = 0; i < count; i++) {
        Node *n = g->nodes.data[i];
        try_rms_norm(&r, n);
        try_rope(&r, n);
        try_rope_source(&r, n);
        try_attention(&r, n);
        try_attention_operands(&r, n);
        try_transpose_chain(&r, n);
        try_transposes(&r, n);
        try_gelu_tanh(&r, n);
        try_silu(&r, n);
        try_outer_product(&r, n);
        try_batch_norm(&r, n);
        vec_push(&r.order, n);
    }
    g->nodes = r.order;
    for (int i = 0; i < g->nodes.len; i++)
        ((Node *)g->nodes.data[i])->id = i;
    if (opt->verbose && r.rms + r.rope + r.attention + r.transposes + r.gelu + r.silu + r.outer +
                            r.batch_norms)
        fprintf(stderr, "kiln: recognised %d rms_norm, %d rope, %d attention, %d gelu_tanh, "
                "%d silu, %d outer products; %d transposes composed or cancelled; "
                "%d batch norms as x * a + b\n", r.rms, r.rope, r.attention, r.gelu, r.silu,
                r.outer, r.transposes, r.batch_norms);
}
