/*
 * precision.c: activations stored in f16 (kiln compile --precision f16).
 *
 * Runs after optimize and before quantize_weights, over fusion groups: a
 * node and every node fused into it (fused_into, followed to the end) run
 * as one dispatch, so they take one rule, the rule of the group's head (the
 * node that is not fused into another), from the table below:
 *
 *   ANY   elementwise ops (eltwise.comp converts each operand on load and
 *         the result on store), rope and batch normalization (elementwise
 *         dispatches; batch norm's statistics read f32), norms and
 *         softmax (their data, residual, result and sum in either dtype;
 *         scale and bias f32), attention (q, k, v, the mask and the result
 *         in either dtype, the scores f32), pooling and the reductions
 *         whose result stays in its input's range (mean, max, min; argmax
 *         and argmin, whose result is i64), resize: those operands as they are,
 *         every f32 result f16. Sums, products and norms of many elements
 *         stay f32 (their results can leave f16's range);
 *   SAME  layout and indexing ops (copies): the result takes the dtype of
 *         the data it moves; f16 data makes it f16 (a concat of f16 and
 *         f32 pieces too: each piece is converted as it is copied);
 *   MATMUL  matmul and gemm: both operands f16 (f32 activations cast, f32
 *         weights converted here, once each), the product accumulated in
 *         f32 and stored f16; an epilogue's bias (gemm's C) is read as
 *         f32. Under --weights another format, B stays for quantize.c to
 *         encode and only A is f16;
 *   CONV  convolutions (and their transposes): input, weights and a
 *         fused residual in either dtype (the kernels convert on load; f32
 *         weights converted here), the bias f32, arithmetic f32, the
 *         result f16; where the device has cooperative matrices the
 *         products take the matrix units with the input gathered as halves;
 *   SUM   the reductions whose result can leave f16's range (sum, product,
 *         L1, L2, sum of squares, log-sum-exp): the data read in either
 *         dtype (reduce.comp converts on load), the result f32 (but an f16
 *         model output, --io f16, which the kernel stores as f16);
 *   F32   everything else, and every group named by --keep-f32: f16
 *         operands are cast to f32 first, results stay f32 (those kernels
 *         compute and store f32).
 *
 * The model's inputs, outputs and state keep their declared dtypes: an
 * elementwise op or product that writes an output stores f32 directly, as
 * does a group whose result is only copied into such a tensor (a decoder's
 * keys and values appended to the f32 cache state, through views), and a
 * copy of f16 data into an output copies from an f32 cast. A cast is one
 * eltwise dispatch per tensor and dtype, shared by every reader, placed
 * before the first.
 *
 * --io f16: the model's f32 inputs and outputs (not its state, nor an
 * output that updates it) are f16 instead; the rules above then read and
 * write them as any f16 tensor, a copy into an f16 output casts f32 data to
 * f16 first, and a group of rule F32 that writes one writes an f32 tensor
 * that a cast after it stores in the output.
 */
#include "kiln.h"

#include <stdlib.h>
#include <string.h>

typedef enum Rule { R_F32, R_ANY, R_SAME, R_MATMUL, R_CONV, R_SUM } Rule;

/* The rule of an op run as a group's head. */
static Rule op_rule(OpKind op) {
    switch (op) {
    case OP_RESHAPE: case OP_SQUEEZE: case OP_UNSQUEEZE: case OP_FLATTEN:
    case OP_TRANSPOSE: case OP_SLICE: case OP_CONCAT: case OP_SPLIT: case OP_EXPAND:
    case OP_TILE: case OP_DEPTH_TO_SPACE: case OP_SPACE_TO_DEPTH: case OP_GATHER:
    case OP_EMBEDDING: case OP_PAD: case OP_TRILU: case OP_GATHER_ELEMENTS:
    case OP_GATHER_ND:
        return R_SAME;
    case OP_MATMUL: case OP_GEMM:
        return R_MATMUL;
    case OP_CONV: case OP_CONV_TRANSPOSE:
        return R_CONV;
    case OP_LAYER_NORM: case OP_RMS_NORM: case OP_RESIDUAL_LAYER_NORM:
    case OP_RESIDUAL_RMS_NORM: case OP_INSTANCE_NORM: case OP_GROUP_NORM:
    case OP_SOFTMAX: case OP_LOG_SOFTMAX:
    case OP_MAX_POOL: case OP_AVG_POOL: case OP_GLOBAL_AVG_POOL: case OP_GLOBAL_MAX_POOL:
    case OP_REDUCE_MEAN: case OP_REDUCE_MAX: case OP_REDUCE_MIN: case OP_ARGMAX:
    case OP_ARGMIN: case OP_ROPE: case OP_ATTENTION: case OP_BATCH_NORM: case OP_RESIZE:
        return R_ANY;
    case OP_REDUCE_SUM: case OP_REDUCE_PROD: case OP_REDUCE_L1: case OP_REDUCE_L2:
    case OP_REDUCE_SUM_SQUARE: case OP_REDUCE_LOG_SUM_EXP:
        return R_SUM;
    default:
        return op_info[op].expr ? R_ANY : R_F32;
    }
}

/* Whether member m of h's group, run under rule r, reads its input k in
 * either dtype; every other input is read as f32. ANY: the norms' and
 * softmax's data and residual, every operand of an elementwise op (not a
 * norm's scale and bias); MATMUL: the product's A and B (a QKV sibling's
 * inputs are not read at all; the bias, gemm's C, is f32). */
static bool reads_f16(Rule r, const Node *h, const Node *m, int k) {
    if (r == R_MATMUL)
        return m == h ? k < 2 : m->op == OP_MATMUL;
    if (r == R_CONV)
        return m == h ? k < 2 : m == h->epi_res;
    if (r == R_SUM)
        return m == h && k == 0;
    if (r != R_ANY)
        return false;
    switch (m->op) {
    case OP_LAYER_NORM: case OP_RMS_NORM: case OP_INSTANCE_NORM: case OP_GROUP_NORM:
    case OP_SOFTMAX: case OP_LOG_SOFTMAX:
        return k == 0;
    case OP_RESIDUAL_LAYER_NORM: case OP_RESIDUAL_RMS_NORM:
        return k <= 1;
    default:
        return true;
    }
}

/* The inputs of a SAME op that hold the data it moves (the others are
 * indices or sizes). */
static bool data_input(const Node *n, int k) {
    switch (n->op) {
    case OP_CONCAT: return true;
    case OP_EMBEDDING: return k == 1;
    default: return k == 0;
    }
}

typedef struct Pass {
    Graph *g;
    const Options *opt;
    Vec order;           /* the new node order */
    bool *io;            /* by tensor id: made f16 by --io f16 */
    bool *declared16;    /* by tensor id: f16 before the pass (the model's) */
    int nio;             /* entries in io (the tensors before the pass) */
    Tensor **cast[2];    /* by tensor id: its f32 and f16 casts */
    Tensor **half;       /* by tensor id: a weight's f16 copy */
    int cap;             /* entries in those tables */
    int ncasts, nweights;
} Pass;

/* A tensor the model's user sees: its dtype stays as declared (or as
 * --io f16 made it). */
static bool pinned(const Tensor *t) {
    return t->is_output || t->kind == T_STATE || t->is_update || t->kind == T_INPUT;
}

/* One that stays f32: an f16 one (--io f16) is written as any f16 tensor. */
static bool pinned_f32(const Tensor *t) {
    return pinned(t) && t->dtype == KILN_DTYPE_F32;
}

/* The by-id tables as long as the graph's tensors (the pass adds some). */
static void grow(Pass *p) {
    int n = p->g->tensors.len + 1;
    if (n <= p->cap)
        return;
    n *= 2;
    for (int k = 0; k < 3; k++) {
        Tensor ***t = k < 2 ? &p->cast[k] : &p->half;
        *t = xrealloc(*t, sizeof(Tensor *) * (size_t)n);
        memset(*t + p->cap, 0, sizeof(Tensor *) * (size_t)(n - p->cap));
    }
    p->cap = n;
}

/* w's values (f32 or f16) as a new weight of dtype dt (f16 rounded to
 * nearest even), named NAME.f32 or NAME.f16. */
static Tensor *converted_weight(Pass *p, Tensor *w, kiln_dtype dt) {
    Tensor *c = graph_tensor(p->g, format("%s.%s", w->name, kiln_dtype_name(dt)), T_WEIGHT,
                             w->loc);
    c->dtype = dt;
    c->rank = w->rank;
    memcpy(c->shape, w->shape, sizeof c->shape);
    int64_t count = tensor_count(w);
    c->data = xcalloc((size_t)count + 1, (size_t)kiln_dtype_size(dt));
    c->owns_data = true; /* freed once encoded (quantize.c) */
    for (int64_t i = 0; i < count; i++) {
        float f = weight_float(w, i);
        if (dt == KILN_DTYPE_F16) {
            uint16_t h = float_to_half(f);
            memcpy(c->data + 2 * i, &h, 2);
        } else {
            memcpy(c->data + 4 * i, &f, 4);
        }
    }
    p->nweights++;
    return c;
}

/* t as dtype dt (f32 or f16): a cast node appended to the order (an f16
 * weight's f32 copy instead, made here), made once. */
static Tensor *cast_to(Pass *p, Tensor *t, kiln_dtype dt) {
    grow(p);
    int which = dt == KILN_DTYPE_F16;
    if (p->cast[which][t->id])
        return p->cast[which][t->id];
    /* an f16 weight that a kernel reads as f32 (a norm's scale, a bias) */
    if (t->kind == T_WEIGHT && t->data && t->dtype == KILN_DTYPE_F16 && !which)
        return p->cast[which][t->id] = converted_weight(p, t, KILN_DTYPE_F32);
    Graph *g = p->g;
    const char *suffix = which ? "f16" : "f32";
    /* graph_node appends it to g->nodes, which apply_precision replaces */
    Node *c = graph_node(g, OP_CAST, format("%s/to_%s", t->name, suffix), t->loc);
    node_add_input(c, t);
    node_set_attr(c, "to", kiln_dtype_name(dt));
    Tensor *y = graph_tensor(g, format("%s.%s", t->name, suffix), T_VALUE, t->loc);
    node_add_output(c, y);
    y->producer = c;
    infer_node(c);
    infer_dynamic(g, c);
    vec_push(&p->order, c);
    p->cast[which][t->id] = y;
    p->ncasts++;
    return y;
}

/* An f32 weight's f16 copy, made once. */
static Tensor *half_weight(Pass *p, Tensor *w) {
    grow(p);
    if (!p->half[w->id])
        p->half[w->id] = converted_weight(p, w, KILN_DTYPE_F16);
    return p->half[w->id];
}

/* release_weight's readers to spare: none. */
static bool no_reader(Node *m, int k, void *ctx) {
    (void)m, (void)k, (void)ctx;
    return false;
}

/* Replaces input k of member m by `by`, keeping the readers' counts; a
 * weight replaced by its converted copy loses its bytes once nothing reads
 * it (a model's weights are not held in both dtypes while the pass goes
 * on). */
static void replace_input(Node *m, int k, Tensor *by) {
    Tensor *old = m->inputs[k];
    old->uses--;
    m->inputs[k] = by;
    by->uses++;
    release_weight(m->graph, old, no_reader, NULL);
}

/* Whether t is made by a member of the group headed by h. */
static bool made_inside(const Tensor *t, Node *h) {
    return t->producer && fused_head(t->producer) == h;
}

/* Whether the group of h is listed by --keep-f32. */
static bool kept(const Pass *p, Node **members, int nm) {
    for (int i = 0; i < p->opt->nkeep_f32; i++)
        for (int j = 0; j < nm; j++)
            if (strcmp(members[j]->name, p->opt->keep_f32[i]) == 0)
                return true;
    return false;
}

/* Whether t is read, and every reader's kernel reads it as f32 (gemm's C,
 * an op of rule F32), directly or through copies and views that keep its
 * dtype, or copies it into the model's own f32 tensors (a concat too, into
 * an output): an f16 t would only be cast back to f32 for them (an LSTM's
 * input projection, sliced a step at a time into the recurrence's gemm as
 * C). */
static bool only_read_f32(const Pass *p, const Tensor *t, int depth) {
    const Graph *g = p->g;
    bool read = false;
    for (int i = 0; i < g->nodes.len; i++) {
        Node *m = g->nodes.data[i];
        for (int k = 0; k < m->ninputs && !m->dead; k++) {
            Node *h = fused_head(m);
            if (m->inputs[k] != t || (t->producer && fused_head(t->producer) == h))
                continue; /* not read, or read inside the group that makes it */
            read = true;
            Rule r = kept(p, (Node *[]){h, m}, 2) ? R_F32 : op_rule(h->op);
            if (r == R_SAME && m == h && data_input(m, k)) {
                /* a concat's other pieces may be f16: followed only into
                 * the model's own tensors */
                if (pinned(m->outputs[0]) ? !pinned_f32(m->outputs[0])
                    : m->op == OP_CONCAT || depth >= 8 ||
                          !only_read_f32(p, m->outputs[0], depth + 1))
                    return false;
                continue;
            }
            if (r == R_SAME || reads_f16(r, h, m, k))
                return false;
        }
    }
    return read;
}

/* A result stored f32: the model's own tensors, and those only read as
 * f32 (copied into them, among others). */
static bool keeps_f32(const Pass *p, const Tensor *t) {
    return pinned_f32(t) || only_read_f32(p, t, 0);
}

/* Every float result of the group f16, but those that keep f32. */
static void store_f16(const Pass *p, Node **members, int nm) {
    for (int j = 0; j < nm; j++)
        for (int k = 0; k < members[j]->noutputs; k++) {
            Tensor *t = members[j]->outputs[k];
            if (t->dtype == KILN_DTYPE_F32 && !keeps_f32(p, t))
                t->dtype = KILN_DTYPE_F16;
        }
}

/* A product's A and B as f16: f32 weights converted, f32 activations
 * cast; under --weights another format (or 8-bit codes) B stays f32, for
 * quantize.c to encode, as does a decoder's (decode_weight: quantize.c
 * stores it f16 K-major for the decode step's matvec_k.comp). */
static void product_operands(Pass *p, Node *h) {
    for (int k = 0; k < 2; k++) {
        Tensor *t = h->inputs[k];
        if (t->dtype != KILN_DTYPE_F32)
            continue;
        if (t->kind == T_WEIGHT && t->data) {
            bool encoded = k == 1 && t->rank == 2 &&
                           (p->opt->weights_format != WF_F32 || t->quant.codes ||
                            decode_weight(p->g, t));
            if (!encoded)
                replace_input(h, k, half_weight(p, t));
        } else {
            replace_input(h, k, cast_to(p, t, KILN_DTYPE_F16));
        }
    }
}

/* A convolution's f32 weights as f16 (its input is read as it is). */
static void conv_weights(Pass *p, Node *h) {
    Tensor *w = h->inputs[1];
    if (w->dtype == KILN_DTYPE_F32 && w->kind == T_WEIGHT && w->data)
        replace_input(h, 1, half_weight(p, w));
}

/* A copy's group: f16 data stays f16 unless the copy writes an f32 model
 * tensor: then the f16 data is cast (a view converts nothing). A copy
 * into an f16 model tensor (--io f16) casts f32 data to f16. A concat
 * converts each piece as it copies it, and casts nothing. */
static void copy_group(Pass *p, Node *h) {
    bool f16 = false, f32 = false, out = false, out16 = false;
    for (int k = 0; k < h->ninputs; k++)
        if (data_input(h, k)) {
            f16 |= h->inputs[k]->dtype == KILN_DTYPE_F16;
            f32 |= h->inputs[k]->dtype == KILN_DTYPE_F32;
        }
    for (int k = 0; k < h->noutputs; k++) {
        out |= pinned_f32(h->outputs[k]);
        out16 |= pinned(h->outputs[k]) && h->outputs[k]->dtype == KILN_DTYPE_F16;
    }
    /* A concat copies each piece with its own conversion (eltwise.comp
     * loads either dtype and stores the result's; a piece appended in
     * place is one of the result's dtype): mixed pieces need no cast. Its
     * result is f16 where a piece is, unless it is an f32 model tensor. */
    if (h->op == OP_CONCAT && !h->fused_into) {
        if (f16 && !out)
            h->outputs[0]->dtype = KILN_DTYPE_F16;
        return;
    }
    if (out16 && !out && f32) {
        for (int k = 0; k < h->ninputs; k++)
            if (data_input(h, k) && h->inputs[k]->dtype == KILN_DTYPE_F32)
                replace_input(h, k, cast_to(p, h->inputs[k], KILN_DTYPE_F16));
        f16 = true;
        f32 = false;
    }
    if (!f16)
        return;
    if (f32 || out) {
        for (int k = 0; k < h->ninputs; k++)
            if (data_input(h, k) && h->inputs[k]->dtype == KILN_DTYPE_F16)
                replace_input(h, k, cast_to(p, h->inputs[k], KILN_DTYPE_F32));
        return;
    }
    for (int k = 0; k < h->noutputs; k++)
        if (h->outputs[k]->dtype == KILN_DTYPE_F32)
            h->outputs[k]->dtype = KILN_DTYPE_F16;
}

/* Every f16 input from outside the group that its kernel reads as f32
 * (reads_f16) cast to f32; under rule F32 not one the model declares f16
 * (its kernel reads it as it would without --precision: a gather of f16
 * data writes f16). */
static void cast_inputs(Pass *p, Rule r, Node *h, Node **members, int nm) {
    for (int j = 0; j < nm; j++)
        for (int k = 0; k < members[j]->ninputs; k++) {
            Tensor *t = members[j]->inputs[k];
            bool declared = t->id < p->nio && p->declared16[t->id];
            if (t->dtype == KILN_DTYPE_F16 && !made_inside(t, h) &&
                !reads_f16(r, h, members[j], k) && !(r == R_F32 && declared))
                replace_input(members[j], k, cast_to(p, t, KILN_DTYPE_F32));
        }
}

/* --io f16: an f16 model output that a member of a group of rule F32
 * writes: the member writes an f32 tensor instead, and a cast node (pushed
 * to the order, after the group's head) stores it in the output. */
static void cast_outputs(Pass *p, Node **members, int nm) {
    for (int j = 0; j < nm; j++)
        for (int k = 0; k < members[j]->noutputs; k++) {
            Tensor *t = members[j]->outputs[k];
            if (!t->is_output || t->id >= p->nio || !p->io[t->id])
                continue;
            Tensor *w = graph_tensor(p->g, format("%s.f32", t->name), T_VALUE, t->loc);
            w->dtype = KILN_DTYPE_F32;
            w->rank = t->rank;
            memcpy(w->shape, t->shape, sizeof w->shape);
            w->dyn_axes = t->dyn_axes;
            memcpy(w->ext, t->ext, sizeof w->ext);
            w->dynamic = t->dynamic;
            w->dyn_axis = t->dyn_axis;
            w->extent = t->extent;
            w->producer = members[j];
            w->uses = 1;
            members[j]->outputs[k] = w;
            Node *c = graph_node(p->g, OP_CAST, format("%s/to_f16", t->name), t->loc);
            node_add_input(c, w);
            node_set_attr(c, "to", kiln_dtype_name(KILN_DTYPE_F16));
            node_add_output(c, t);
            vec_push(&p->order, c);
            p->ncasts++;
        }
}

/* Whether a result of the group keeps f32: a product's results share one
 * dtype (a QKV split writes three, a gemm its Split's parts), f32 when one
 * of them is. */
static bool any_f32(const Pass *p, Node **members, int nm) {
    for (int j = 0; j < nm; j++)
        for (int k = 0; k < members[j]->noutputs; k++)
            if (keeps_f32(p, members[j]->outputs[k]))
                return true;
    return false;
}

/* Whether the graph holds f16 tensors of its own (an f16 model's). */
static bool has_f16(const Graph *g) {
    for (int i = 0; i < g->tensors.len; i++)
        if (((const Tensor *)g->tensors.data[i])->dtype == KILN_DTYPE_F16)
            return true;
    return false;
}

void apply_precision(Graph *g, const Options *opt) {
    for (int i = 0; i < opt->nkeep_f32; i++) {
        bool found = false;
        for (int j = 0; j < g->nodes.len && !found; j++)
            found = strcmp(((Node *)g->nodes.data[j])->name, opt->keep_f32[i]) == 0;
        if (!found)
            fatal("--keep-f32: the model has no node named '%s'", opt->keep_f32[i]);
    }
    /* Without --precision f16 the pass runs where the model has f16 tensors
     * of its own: each kernel then gets its operands in a dtype it reads
     * (cast_inputs), and every tensor keeps its dtype. */
    bool half = opt->precision == KILN_DTYPE_F16;
    if (!half && !has_f16(g))
        return;
    Pass p = {g, opt, {0}, NULL, NULL, 0, {NULL, NULL}, NULL, 0, 0, 0};
    /* --io f16: the f32 inputs and outputs that the user reads and writes
     * as f16 (not the state, nor the outputs that update it) */
    p.nio = g->tensors.len;
    p.io = xcalloc((size_t)p.nio + 1, sizeof *p.io);
    p.declared16 = xcalloc((size_t)p.nio + 1, sizeof *p.declared16);
    for (int i = 0; i < g->tensors.len; i++)
        p.declared16[i] = ((Tensor *)g->tensors.data[i])->dtype == KILN_DTYPE_F16;
    for (int i = 0; i < g->tensors.len && opt->io_f16; i++) {
        Tensor *t = g->tensors.data[i];
        if ((t->kind == T_INPUT || t->is_output) && t->dtype == KILN_DTYPE_F32 &&
            t->kind != T_STATE && !t->is_update) {
            t->dtype = KILN_DTYPE_F16;
            p.io[t->id] = true;
        }
    }
    int nnodes = g->nodes.len;
    Node **nodes = xcalloc((size_t)nnodes + 1, sizeof *nodes);
    if (nnodes) /* a graph folded whole has none (and no array) */
        memcpy(nodes, g->nodes.data, sizeof *nodes * (size_t)nnodes);
    Node **members = xcalloc((size_t)nnodes + 1, sizeof *members);
    for (int i = 0; i < nnodes; i++) {
        Node *n = nodes[i];
        int nm = 0;
        bool f32_head = false; /* its outputs' casts follow it (cast_outputs) */
        if (!n->dead && !n->fused_into) {
            for (int j = 0; j < nnodes; j++)
                if (!nodes[j]->dead && fused_head(nodes[j]) == n)
                    members[nm++] = nodes[j];
            /* casts go before the head, whose dispatch reads them */
            Rule r = kept(&p, members, nm) ? R_F32 : op_rule(n->op);
            if (!half) {
                if (r != R_SAME)
                    cast_inputs(&p, r, n, members, nm);
            } else if (r == R_SAME) {
                /* slices fused into a concat (optimize.c) write nothing:
                 * each piece is its source's elements, in its dtype */
                for (int j = 0; j < nm; j++)
                    if (members[j] != n && members[j]->op == OP_SLICE)
                        members[j]->outputs[0]->dtype = members[j]->inputs[0]->dtype;
                copy_group(&p, n);
            } else {
                if (r == R_MATMUL)
                    product_operands(&p, n);
                if (r == R_CONV)
                    conv_weights(&p, n);
                cast_inputs(&p, r, n, members, nm);
            }
            if (half && (r == R_ANY ||
                         ((r == R_MATMUL || r == R_CONV) && !any_f32(&p, members, nm))))
                store_f16(&p, members, nm);
            f32_head = half && r == R_F32; /* a sum writes an f16 output itself */
        }
        vec_push(&p.order, n);
        if (f32_head)
            cast_outputs(&p, members, nm);
    }
    g->nodes = p.order;
    for (int i = 0; i < g->nodes.len; i++)
        ((Node *)g->nodes.data[i])->id = i;
    /* and the weights no live node read before the pass either */
    for (int i = 0; i < g->tensors.len; i++) {
        Tensor *t = g->tensors.data[i];
        if (t->kind == T_WEIGHT)
            release_weight(g, t, no_reader, NULL);
    }
    if (opt->verbose)
        fprintf(stderr, half ? "kiln: --precision f16: %d casts, %d weights converted to f16\n"
                             : "kiln: f16 tensors: %d casts, %d weights converted to f32\n",
                p.ncasts, p.nweights);
    xfree(nodes);
    xfree(members);
    xfree(p.io);
    xfree(p.declared16);
}
