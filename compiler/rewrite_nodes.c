/*
 * rewrite_nodes.c: the helpers rewrite.c's passes and rewrite_attention.c
 * share (rewrite.h): a node's producer and constants read, new nodes made,
 * a rewrite settled or undone under an error trap.
 */
#include "rewrite.h"

#include <setjmp.h>
#include <string.h>

/* t's producer when it is an op node, else NULL. */
Node *rw_made_by(const Tensor *t, OpKind op) {
    Node *n = t ? t->producer : NULL;
    return n && n->op == op ? n : NULL;
}

/* The value of a one-element f32 or f16 weight. */
bool rw_scalar_of(const Tensor *t, double *v) {
    if (!t || t->kind != T_WEIGHT || !t->data || !is_float(t->dtype) || tensor_count(t) != 1)
        return false;
    *v = weight_float(t, 0);
    return true;
}

int rw_last_axis(Node *n, const char *key, int rank) {
    int64_t a = attr_int(n, key);
    return (int)(a < 0 ? a + rank : a);
}

Node *rw_new_node(Rewriter *r, OpKind op, const Node *at, const char *what, int nin,
                  Tensor *const *in) {
    const char *name = format("%s/%s", at->name, what);
    Node *n = graph_node(r->g, op, name, at->loc);
    for (int i = 0; i < nin; i++)
        node_add_input(n, in[i]);
    node_add_output(n, graph_tensor(r->g, name, T_VALUE, at->loc));
    return n;
}

Node *rw_new_view(Rewriter *r, const Node *at, const char *what, Tensor *x, int rank,
                  const int64_t *shape) {
    Node *v = rw_new_node(r, OP_RESHAPE, at, what, 1, &x);
    node_set_ints(v, "shape", rank, shape);
    return v;
}

static void clear_dynamic(Tensor *t) {
    t->dyn_axes = 0;
    t->dynamic = false;
    memset(t->ext, 0, sizeof t->ext);
}

/* Infers the fresh nodes, then anchor (already changed; saved holds it and
 * its output as they were). On an error nothing is kept: the anchor and
 * its output are put back, the fresh nodes stay out of the order. */
bool rw_settle(Rewriter *r, Node **fresh, int nfresh, Node *anchor, const Node *saved,
               const Tensor *saved_out) {
    jmp_buf trap, *outer = kiln_error_trap;
    bool quiet = kiln_quiet;
    volatile bool ok = false;
    kiln_error_trap = &trap;
    kiln_quiet = true;
    if (setjmp(trap) == 0) {
        for (int i = 0; i < nfresh; i++) {
            infer_node(fresh[i]);
            infer_dynamic(r->g, fresh[i]);
        }
        if (anchor) {
            clear_dynamic(anchor->outputs[0]);
            infer_node(anchor);
            infer_dynamic(r->g, anchor);
        }
        ok = true;
    }
    kiln_error_trap = outer;
    kiln_quiet = quiet;
    if (!ok) {
        if (anchor) {
            *anchor = *saved;
            *anchor->outputs[0] = *saved_out;
        }
        return false;
    }
    for (int i = 0; i < nfresh; i++)
        vec_push(&r->order, fresh[i]);
    return true;
}

/* Makes anchor the op `op` of inputs in (its attributes dropped; the caller
 * sets the new ones), keeping its output. Returns what it was, for settle. */
void rw_become(Node *anchor, OpKind op, int nin, Tensor *const *in, Node *saved,
               Tensor *saved_out) {
    *saved = *anchor;
    *saved_out = *anchor->outputs[0];
    anchor->op = op;
    anchor->inputs = NULL;
    anchor->input_locs = NULL;
    anchor->ninputs = 0;
    anchor->attrs = NULL;
    anchor->nattrs = 0;
    for (int i = 0; i < nin; i++)
        node_add_input(anchor, in[i]);
}
