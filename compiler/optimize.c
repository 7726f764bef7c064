/*
 * optimize.c: graph rewrites before lowering.
 *
 * 1. Dead-node removal: nodes no output depends on emit nothing.
 * 2. Fusion, each pass behind an Options flag (--no-fuse=...). A fused node
 *    keeps its place in the graph but points (fused_into) at the node whose
 *    dispatch computes it; lowering expands it there. Only f32 nodes fuse,
 *    and only a tensor with a single reader that is not a model output
 *    disappears into its reader.
 *    - epilogue: matmul -> add(bias) -> activation becomes one matmul
 *      dispatch whose epilogue adds the bias (per column, or per element
 *      when unbatched) and applies the activation; conv -> batch_norm ->
 *      relu/silu becomes one conv whose weights and bias absorb the batch
 *      norm (computed here, when all of them are weights) and whose epilogue
 *      applies the activation (and a grouped conv's a transpose to
 *      channels last after it: its dispatch writes that layout);
 *    - norm: add -> layer_norm / rms_norm becomes one norm dispatch that
 *      also writes the sum when anything else reads it (the residual stream
 *      of a transformer); a norm over the last axis between transposes to
 *      channels last and back runs over the channels in place;
 *    - eltwise: chains of elementwise ops of one shape become one dispatch
 *      of at most six operands, the expression composed; a transpose read
 *      only by such a dispatch, of its shape, becomes permuted strides of
 *      its operand;
 *    - qkv: two or three plain matmuls of one input by weights with the
 *      same K (a transformer's query, key and value projections) become one
 *      product by the weights side by side, writing three outputs.
 * --debug-tensors turns fusion off, so every intermediate exists.
 */
#include "kiln.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void remove_dead_nodes(Graph *g, const Options *opt) {
    /* Nodes are in topological order: walk backwards, a node is live when
     * one of its outputs is a model output or feeds a live node. */
    bool *live = xcalloc((size_t)g->tensors.len + 1, sizeof(bool));
    for (int i = 0; i < g->outputs.len; i++)
        live[((Tensor *)g->outputs.data[i])->id] = true;
    for (int i = 0; i < g->states.len; i++) {
        Tensor *u = ((Tensor *)g->states.data[i])->update;
        if (u)
            live[u->id] = true;
    }
    for (int i = g->nodes.len - 1; i >= 0; i--) {
        Node *n = g->nodes.data[i];
        bool any = false;
        for (int k = 0; k < n->noutputs; k++)
            any |= live[n->outputs[k]->id];
        n->dead = !any;
        if (n->dead) {
            if (opt->verbose)
                fprintf(stderr, "kiln: node '%s' feeds no output; removed\n", n->name);
            continue;
        }
        for (int k = 0; k < n->ninputs; k++)
            live[n->inputs[k]->id] = true;
    }
}

static void count_uses(Graph *g) {
    for (int i = 0; i < g->tensors.len; i++)
        ((Tensor *)g->tensors.data[i])->uses = 0;
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        for (int k = 0; !n->dead && k < n->ninputs; k++)
            n->inputs[k]->uses++;
    }
}

/* The one live node reading t, when t has exactly one reader and is not a
 * model output; else NULL. */
static Node *sole_reader(Graph *g, Tensor *t) {
    if (t->is_output || t->is_update || t->uses != 1)
        return NULL;
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        for (int k = 0; !n->dead && k < n->ninputs; k++)
            if (n->inputs[k] == t)
                return n;
    }
    return NULL;
}

/* Whether every input and output of n is f32 or f16 (an f16 model's
 * tensors fuse as an f32 model's do: the fused kernels read and write
 * either, as they do after --precision f16). */
static bool all_float(const Node *n) {
    for (int k = 0; k < n->ninputs; k++)
        if (!is_float(n->inputs[k]->dtype))
            return false;
    for (int k = 0; k < n->noutputs; k++)
        if (!is_float(n->outputs[k]->dtype))
            return false;
    return true;
}

static bool is_eltwise(const Node *n) { return op_info[n->op].expr && n->op != OP_CAST; }

static bool is_activation(OpKind op) { return op_info[op].flags & ACTIVATION; }

static bool free_node(const Node *n) { return n && !n->dead && !n->fused_into; }

/* Whether t is ready when n's dispatch runs: a model input or weight, or
 * made by a node before n (dispatches follow the order of g->nodes; an
 * epilogue computes its nodes at the root's place, not at their own). */
static bool ready_before(Graph *g, const Tensor *t, const Node *n) {
    if (!t->producer)
        return true;
    for (int i = 0; i < g->nodes.len; i++) {
        if (g->nodes.data[i] == n)
            return false;
        if (g->nodes.data[i] == t->producer)
            return true;
    }
    return false;
}

/* out -> view (a reshape) -> activation, each the only reader of the
 * last: the activation moved before the view (out -> activation -> view,
 * the view then making the tensor the activation made), so that the
 * product that makes out can take it into its epilogue (GPT-2's gemm,
 * reshaped, then its GELU). */
static void activation_before_view(Graph *g, Tensor *out) {
    Node *view = sole_reader(g, out);
    if (!free_node(view) || !is_view_op(view->op) || view->inputs[0] != out)
        return;
    Node *act = sole_reader(g, view->outputs[0]);
    if (!free_node(act) || !is_activation(act->op) || !all_float(act) || out->dyn_axes ||
        view->outputs[0]->dyn_axes)
        return;
    Tensor *v = view->outputs[0], *y = act->outputs[0];
    Tensor *ya = graph_tensor(g, format("%s.%s", out->name, act->name), T_VALUE, y->loc);
    ya->dtype = y->dtype;
    ya->rank = out->rank;
    memcpy(ya->shape, out->shape, sizeof ya->shape);
    act->inputs[0] = out;
    act->outputs[0] = ya;
    ya->producer = act;
    ya->uses = 1;
    view->inputs[0] = ya;
    view->outputs[0] = y;
    y->producer = view;
    v->producer = NULL;
    v->uses = 0;
}

/* Whether matmul m, silu act after it, is a gated MLP's gate: silu(x @
 * wg) * (x @ wu). Its SiLU stays out of its epilogue, so that the QKV
 * grouping makes the two products one (a dispatch fewer), whose one-row
 * variant at a decoding step computes the SiLU and the product too
 * (lower_matmul.c, glu_after_product). */
static bool gated_gate(Graph *g, const Node *m, const Node *act) {
    Node *mul = act->op == OP_SILU ? sole_reader(g, act->outputs[0]) : NULL;
    if (!free_node(mul) || mul->op != OP_MUL || mul->inputs[0] == mul->inputs[1])
        return false;
    const Node *up = other_input(mul, act->outputs[0])->producer;
    return up && up != m && up->op == OP_MATMUL && up->ninputs == 2 && m->ninputs == 2 &&
           up->inputs[0] == m->inputs[0] && shape_equal(up->outputs[0], m->outputs[0]);
}

/* A matmul's epilogue: the add of a bias after it (per column, or per
 * element of an unbatched product) and an activation after that; a gemm's
 * (whose bias is its own C): an activation after it, or after a reshape
 * of its result (activation_before_view). With the QKV grouping on
 * (gated), a gated MLP's gate keeps its SiLU out (gated_gate). */
static void fuse_epilogues(Graph *g, bool gated) {
    for (int i = 0; i < g->nodes.len; i++) {
        Node *m = g->nodes.data[i];
        /* a gemm (its bias its own C) without an activation of its own */
        Attr *own = m->op == OP_GEMM ? node_attr(m, "activation") : NULL;
        bool gemm = m->op == OP_GEMM && (!own || strcmp(own->scalar, "none") == 0);
        if ((m->op != OP_MATMUL && !gemm) || !free_node(m) || !all_float(m) ||
            m->inputs[0]->rank < 2)
            continue;
        if (gemm)
            activation_before_view(g, m->outputs[0]);
        Tensor *out = m->outputs[0];
        Node *next = sole_reader(g, out);
        if (!gemm && free_node(next) && next->op == OP_ADD && all_float(next) &&
            next->inputs[0] != next->inputs[1] && shape_equal(next->outputs[0], out) &&
            ready_before(g, other_input(next, out), m)) {
            Tensor *bias = other_input(next, out);
            /* Per column (any batch), or per element of an unbatched product. */
            bool per_column = true;
            for (int d = 0; d + 1 < bias->rank; d++)
                per_column &= bias->shape[d] == 1;
            if (per_column || (out->rank == 2 && bias->rank <= 2)) {
                m->epi_bias = next;
                next->fused_into = m;
                out = next->outputs[0];
                next = sole_reader(g, out);
            }
        }
        if (free_node(next) && is_activation(next->op) && all_float(next) &&
            !(gated && !m->epi_bias && gated_gate(g, m, next))) {
            m->epi_act = next;
            next->fused_into = m;
        }
    }
}

/* A new weight named name, shape like t's (f32). */
static Tensor *new_weight(Graph *g, const char *name, const Tensor *like) {
    Tensor *w = graph_tensor(g, name, T_WEIGHT, like->loc);
    w->dtype = KILN_DTYPE_F32;
    w->rank = like->rank;
    memcpy(w->shape, like->shape, sizeof w->shape);
    w->data = xcalloc((size_t)tensor_bytes(w) + 1, 1);
    w->src.from = W_VALUES;
    return w;
}

/* Whether transpose t moves axis 1 last, [N, C, D...] -> [N, D..., C]
 * (to_last), or the last axis to 1, its inverse. */
static bool channels_perm(Node *t, bool to_last) {
    int r = t->inputs[0]->rank;
    int64_t perm[MAX_RANK];
    if (r < 3 || attr_ints(t, "perm", perm, MAX_RANK) != r || perm[0] != 0)
        return false;
    for (int i = 1; i < r; i++)
        if (perm[i] != (to_last ? (i == r - 1 ? 1 : i + 1) : (i == 1 ? r - 1 : i - 1)))
            return false;
    return true;
}

/* conv(x, w, [b]) -> batch_norm(scale, bias, mean, var):
 *   w'[o, ...] = w[o, ...] * k[o],  b'[o] = (b[o] - mean[o]) * k[o] + bias[o],
 *   k = scale / sqrt(var + eps). */
static void fuse_conv_epilogues(Graph *g) {
    for (int i = 0; i < g->nodes.len; i++) {
        Node *c = g->nodes.data[i];
        if (c->op != OP_CONV || !free_node(c) || !all_float(c))
            continue;
        Attr *own = node_attr(c, "activation");
        if (own && strcmp(own->scalar, "none") != 0)
            continue;
        Node *next = sole_reader(g, c->outputs[0]);
        bool consts = c->inputs[1]->kind == T_WEIGHT && c->inputs[1]->data &&
                      (c->ninputs < 3 || (c->inputs[2]->kind == T_WEIGHT && c->inputs[2]->data));
        if (free_node(next) && next->op == OP_BATCH_NORM && all_float(next) && consts &&
            next->inputs[0] == c->outputs[0]) {
            bool bn_consts = true;
            for (int k = 1; k < 5; k++)
                bn_consts &= next->inputs[k]->kind == T_WEIGHT && next->inputs[k]->data;
            if (bn_consts) {
                Tensor *w = c->inputs[1], *b = c->ninputs > 2 ? c->inputs[2] : NULL;
                Tensor *scale = next->inputs[1], *beta = next->inputs[2];
                Tensor *mean = next->inputs[3], *var = next->inputs[4];
                double eps = attr_float(next, "eps");
                int64_t oc = w->shape[0], per = tensor_count(w) / (oc ? oc : 1);
                Tensor *nw = new_weight(g, format("%s/w+%s", c->name, next->name), w);
                Tensor *nb = new_weight(g, format("%s/b+%s", c->name, next->name), scale);
                for (int64_t o = 0; o < oc; o++) {
                    double k = weight_float(scale, o) / sqrt((double)weight_float(var, o) + eps);
                    for (int64_t j = 0; j < per; j++) {
                        float f = (float)(weight_float(w, o * per + j) * k);
                        memcpy(nw->data + 4 * (o * per + j), &f, 4);
                    }
                    float f = (float)(((b ? weight_float(b, o) : 0.0) - weight_float(mean, o)) * k +
                                      weight_float(beta, o));
                    memcpy(nb->data + 4 * o, &f, 4);
                }
                c->inputs[1] = nw;
                if (c->ninputs > 2)
                    c->inputs[2] = nb;
                else
                    node_add_input(c, nb);
                c->epi_bias = next;
                next->fused_into = c;
                next = sole_reader(g, next->outputs[0]);
            }
        }
        /* A residual: + r, r of the output's shape (a skip connection). */
        Tensor *out = c->epi_bias ? c->epi_bias->outputs[0] : c->outputs[0];
        if (free_node(next) && next->op == OP_ADD && all_float(next) &&
            next->inputs[0] != next->inputs[1] && shape_equal(next->inputs[0], out) &&
            shape_equal(next->inputs[1], out) &&
            ready_before(g, other_input(next, out), c)) {
            c->epi_res = next;
            next->fused_into = c;
            next = sole_reader(g, next->outputs[0]);
        }
        if (free_node(next) && is_activation(next->op) && all_float(next)) {
            c->epi_act = next;
            next->fused_into = c;
        }
        /* A grouped convolution (conv.comp's, never a product) then a
         * transpose to channels last (ConvNeXt's depthwise convolution
         * before its layer norm): the dispatch writes that layout. */
        Node *last = c->epi_act ? c->epi_act : c->epi_res ? c->epi_res
                     : c->epi_bias ? c->epi_bias : c;
        next = sole_reader(g, last->outputs[0]);
        if (c->op == OP_CONV && attr_int(c, "group") > 1 && free_node(next) &&
            next->op == OP_TRANSPOSE && all_float(next) && channels_perm(next, true) &&
            !c->inputs[0]->dyn_axes && !last->outputs[0]->dyn_axes) {
            c->epi_perm = next;
            next->fused_into = c;
        }
    }
}

/* The per-column constant bias of m's epilogue ([N], or [1, ..., N]: f32
 * values), or NULL. */
static Tensor *column_bias(const Node *m) {
    if (!m->epi_bias)
        return NULL;
    Tensor *b = other_input(m->epi_bias, m->outputs[0]);
    int64_t N = m->outputs[0]->shape[m->outputs[0]->rank - 1];
    if (b->kind != T_WEIGHT || !b->data || !is_float(b->dtype) || b->rank < 1 ||
        tensor_count(b) != N || b->shape[b->rank - 1] != N)
        return NULL;
    return b;
}

/* Whether m can share its dispatch with other products of its A: an f32
 * matmul by a 2-D weight with its values, with no epilogue or a
 * per-column constant bias only (the group's members all with one or all
 * without: fuse_qkv). */
static bool qkv_candidate(const Node *m) {
    const Tensor *b = m->op == OP_MATMUL && m->ninputs == 2 ? m->inputs[1] : NULL;
    return b && free_node(m) && all_float(m) && (!m->epi_bias || column_bias(m)) &&
           !m->epi_act && m->nsiblings == 0 && b->kind == T_WEIGHT && b->rank == 2 &&
           b->data && m->inputs[0]->rank >= 1 && m->inputs[0] != b;
}

/* Whether input k of m is a part's B of the QKV group ctx (Node *[3]). */
static bool qkv_part(Node *m, int k, void *ctx) {
    Node **group = ctx;
    for (int j = 0; j < 3; j++)
        if (m == group[j])
            return k == 1;
    return false;
}

/* QKV split: up to three matmuls of one A by weights of the same K become
 * one product by the weights side by side ([K, N0 + N1 + N2], a new
 * weight), whose dispatch writes each product's columns to its own output. */
static void fuse_qkv(Graph *g) {
    for (int i = 0; i < g->nodes.len; i++) {
        Node *m = g->nodes.data[i];
        if (!qkv_candidate(m))
            continue;
        Node *group[3] = {m, NULL, NULL};
        int n = 1;
        for (int j = i + 1; j < g->nodes.len && n < 3; j++) {
            Node *o = g->nodes.data[j];
            if (qkv_candidate(o) && o->inputs[0] == m->inputs[0] &&
                o->inputs[1]->shape[0] == m->inputs[1]->shape[0] &&
                o->inputs[1]->dtype == m->inputs[1]->dtype &&
                !o->epi_bias == !m->epi_bias)
                group[n++] = o;
        }
        if (n < 2)
            continue;
        int64_t K = m->inputs[1]->shape[0], N = 0;
        for (int k = 0; k < n; k++)
            N += group[k]->inputs[1]->shape[1];
        Tensor *w = graph_tensor(g, format("kiln.qkv.%s", m->name), T_WEIGHT, m->loc);
        w->dtype = m->inputs[1]->dtype; /* f32, or an f16 model's f16 */
        w->rank = 2;
        w->shape[0] = K;
        w->shape[1] = N;
        w->data = xcalloc((size_t)tensor_bytes(w) + 4, 1);
        size_t es = (size_t)kiln_dtype_size(w->dtype);
        for (int64_t r = 0, col = 0; r < K; r++, col = 0)
            for (int k = 0; k < n; k++) {
                const Tensor *b = group[k]->inputs[1];
                int64_t bn = b->shape[1];
                memcpy(w->data + (size_t)(r * N + col) * es, b->data + (size_t)(r * bn) * es,
                       (size_t)bn * es);
                col += bn;
            }
        w->owns_data = true;
        /* the parts' own bytes are freed once copied (a 3B decoder's QKV and
         * gate/up weights are 3.7 GB): the siblings' B is never bound */
        for (int k = 0; k < n; k++)
            release_weight(g, group[k]->inputs[1], qkv_part, group);
        m->inputs[1] = w;
        if (m->epi_bias) { /* the biases side by side too */
            Tensor *bias = graph_tensor(g, format("kiln.qkv_bias.%s", m->name), T_WEIGHT,
                                        m->loc);
            bias->dtype = KILN_DTYPE_F32;
            bias->rank = 1;
            bias->shape[0] = N;
            bias->data = xcalloc((size_t)N * 4 + 4, 1);
            for (int k = 0, col = 0; k < n; k++) {
                const Tensor *b = column_bias(group[k]);
                for (int64_t e = 0; e < tensor_count(b); e++) {
                    float f = weight_float(b, e);
                    memcpy(bias->data + (size_t)(col + e) * 4, &f, 4);
                }
                col += (int)tensor_count(b);
            }
            m->qkv_bias = bias;
        }
        for (int k = 1; k < n; k++) {
            m->siblings[m->nsiblings++] = group[k];
            group[k]->fused_into = m;
        }
    }
}

/* Whether a live node before the i-th reads t (nodes are in topological
 * order, so only nodes after t's producer can). */
static bool read_before(Graph *g, const Tensor *t, int i) {
    for (int j = 0; j < i; j++) {
        Node *m = g->nodes.data[j];
        if (m->dead)
            continue;
        for (int k = 0; k < m->ninputs; k++)
            if (m->inputs[k] == t)
                return true;
    }
    return false;
}

/* The sum is written by the norm's dispatch, at the norm's place: another
 * reader of it placed before the norm would read it unwritten. */
static void fuse_residual_norms(Graph *g) {
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if ((n->op != OP_LAYER_NORM && n->op != OP_RMS_NORM) || !free_node(n) || !all_float(n))
            continue;
        Node *add = n->inputs[0]->producer;
        if (free_node(add) && add->op == OP_ADD && all_float(add) &&
            shape_equal(add->inputs[0], add->outputs[0]) &&
            shape_equal(add->inputs[1], add->outputs[0]) &&
            !read_before(g, add->outputs[0], i))
            add->fused_into = n;
    }
}

/* transpose to channels last -> layer_norm or rms_norm over the last axis
 * -> transpose back (ConvNeXt's LayerNorm2d, torchvision's stem,
 * downsampling layers and head): one norm dispatch over the channels of
 * the untransposed tensor, its rows the positions, each row's elements
 * spread by the positions' count (reduce.glsl's INNER; lower_norm), read
 * and written in place of both copies. Fixed shapes, one reader each. */
static void fuse_channels_first_norms(Graph *g) {
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if ((n->op != OP_LAYER_NORM && n->op != OP_RMS_NORM) || !free_node(n) ||
            !all_float(n) || n->noutputs != 1)
            continue;
        Tensor *x = n->inputs[0];
        int64_t axis = attr_int(n, "axis");
        Node *t1 = x->producer, *t2 = sole_reader(g, n->outputs[0]);
        if ((axis < 0 ? axis + x->rank : axis) != x->rank - 1 || !free_node(t1) ||
            t1->op != OP_TRANSPOSE || !all_float(t1) || !channels_perm(t1, true) ||
            sole_reader(g, x) != n || !free_node(t2) || t2->op != OP_TRANSPOSE ||
            !all_float(t2) || !channels_perm(t2, false) || t1->inputs[0]->dyn_axes || x->dyn_axes ||
            t2->outputs[0]->dyn_axes)
            continue;
        bool params = true; /* gamma and beta one value a channel */
        for (int k = 1; k < n->ninputs; k++)
            params &= tensor_count(n->inputs[k]) == x->shape[x->rank - 1];
        if (!params)
            continue;
        t1->fused_into = n;
        t2->fused_into = n;
        n->epi_perm = t2;
    }
}

/* Whether the elementwise group root's dispatch computes reads at most six
 * operands (the kernel's bound). */
static bool group_fits(Node *root) {
    Tensor *leaves[MAX_ARGS];
    int n = 0;
    return fused_expr(root, "float", leaves, &n, 6) != NULL;
}

static void fuse_eltwise_chains(Graph *g) {
    for (int i = 0; i < g->nodes.len; i++) {
        Node *a = g->nodes.data[i];
        if (!free_node(a) || !is_eltwise(a) || !all_float(a))
            continue;
        Node *b = sole_reader(g, a->outputs[0]);
        if (!free_node(b) || !is_eltwise(b) || !all_float(b) ||
            !shape_equal(a->outputs[0], b->outputs[0]))
            continue;
        a->fused_into = b;
        if (!group_fits(b))
            a->fused_into = NULL; /* more than six operands */
    }
}

/* transpose -> elementwise: the elementwise group's dispatch reads the
 * transpose's input through permuted strides (lower_eltwise), where the
 * transposed tensor has the group's shape and no other reader (fixed
 * shapes): no copy, no barrier. ConvNeXt's blocks permute back to channels
 * first before their layer scale and residual add. */
static void fuse_transpose_reads(Graph *g) {
    for (int i = 0; i < g->nodes.len; i++) {
        Node *t = g->nodes.data[i];
        if (t->op != OP_TRANSPOSE || !free_node(t) || !all_float(t) || t->inputs[0]->dyn_axes ||
            t->outputs[0]->dyn_axes)
            continue;
        Node *r = sole_reader(g, t->outputs[0]);
        if (!r || !is_eltwise(r) || !all_float(r))
            continue;
        Node *root = fused_head(r);
        if (!is_eltwise(root) || !shape_equal(t->outputs[0], root->outputs[0]))
            continue;
        t->fused_into = r;
        if (!group_fits(root))
            t->fused_into = NULL; /* more than six operands */
    }
}

/* slice -> concat (a roll: two slices of one tensor joined in the other
 * order; Swin's patch merging: four strided slices joined): the concat's
 * dispatches copy each such piece from the slice's input through the
 * slice's offset and strides (lower_concat), so the slice writes nothing.
 * Slices of slices fold the same way. Fixed shapes; a slice whose one
 * reader is the concat (or such a slice), of its dtype, not a model
 * output. */
static void fuse_concat_slices(Graph *g) {
    for (int i = g->nodes.len - 1; i >= 0; i--) {
        Node *s = g->nodes.data[i];
        Tensor *y = s->outputs[0];
        if (s->op != OP_SLICE || !free_node(s) || s->inputs[0]->dyn_axes || y->dyn_axes ||
            y->is_output || y->is_update)
            continue;
        /* every reader: the concat, or a slice already folded into it */
        Node *c = NULL;
        bool ok = true;
        for (int j = i + 1; j < g->nodes.len && ok; j++) {
            Node *r = g->nodes.data[j];
            for (int k = 0; k < r->ninputs && !r->dead && ok; k++) {
                if (r->inputs[k] != y)
                    continue;
                Node *to = r->op == OP_SLICE ? r->fused_into : r;
                ok = to && (!c || to == c) && (r == to || r->op == OP_SLICE);
                c = to;
            }
        }
        if (ok && c && c->op == OP_CONCAT && free_node(c) && !c->outputs[0]->dyn_axes &&
            c->outputs[0]->dtype == y->dtype)
            s->fused_into = c;
    }
}

/* gemm -> [reshape] -> Split along the last axis into two or three parts
 * (GPT-2's attention projection cut into q, k, v), each the only reader of
 * the last: the gemm's dispatch writes the parts as a QKV split writes its
 * products (its columns [0, N0) to the first, ...), no copies. */
static void fuse_gemm_split(Graph *g) {
    for (int i = 0; i < g->nodes.len; i++) {
        Node *m = g->nodes.data[i];
        /* fixed rows, or rows that follow the dims (a prefix of the bytes) */
        if (m->op != OP_GEMM || !free_node(m) || !all_float(m) || m->epi_act ||
            (m->outputs[0]->dyn_axes && !m->outputs[0]->dynamic))
            continue;
        Tensor *out = m->outputs[0];
        Node *view = sole_reader(g, out), *split = view;
        if (free_node(view) && is_view_op(view->op))
            split = sole_reader(g, view->outputs[0]);
        else
            view = NULL;
        if (!free_node(split) || split->op != OP_SPLIT || split->noutputs < 2 ||
            split->noutputs > 3 || !all_float(split))
            continue;
        Tensor *x = split->inputs[0];
        int axis;
        split_sizes(split, &axis);
        bool ok = axis == x->rank - 1 && x->shape[axis] == out->shape[1] &&
                  (!x->dyn_axes || x->dynamic) && x->dyn_axis != axis;
        for (int k = 0; k < split->noutputs; k++)
            ok &= !split->outputs[k]->is_output && !split->outputs[k]->is_update;
        if (!ok)
            continue;
        m->split_out = split;
        split->fused_into = m;
        if (view)
            view->fused_into = m;
    }
}

void optimize(Graph *g, const Options *opt) {
    remove_dead_nodes(g, opt);
    count_uses(g);
    if (opt->debug_tensors)
        return;
    if (!opt->no_fuse_epilogue) {
        fuse_epilogues(g, !opt->no_fuse_qkv);
        fuse_conv_epilogues(g);
    }
    if (!opt->no_fuse_qkv) {
        fuse_qkv(g);
        fuse_gemm_split(g);
    }
    if (!opt->no_fuse_norm) {
        fuse_residual_norms(g);
        fuse_channels_first_norms(g);
    }
    if (!opt->no_fuse_eltwise) {
        fuse_eltwise_chains(g);
        fuse_transpose_reads(g);
        fuse_concat_slices(g);
    }
}
