/*
 * infer_shapes.c: order the graph, check every op's rules, compute shapes.
 *
 * Nodes may be listed in any order; they are sorted topologically, keeping
 * file order among independent nodes so the output is deterministic. A cycle
 * is reported at a node on it. Then each node's shape rule (named in
 * ops.def) checks its inputs and attributes and sets its outputs' dtype and
 * shape; every failure is an error at the node (or at the attribute) naming
 * it. After this pass nothing later meets an invalid graph.
 *
 * The rules live in shape_<family>.c, one file per op family (named as in
 * shaders/), and read what nodes mean through op_params.c; shape.h
 * declares what they share.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*ShapeFn)(Node *n);
static const ShapeFn shape_rules[OP_COUNT] = {
#define OP(id, name, mn, mx, flags, attrs, shape, lower, dyn, expr) [OP_##id] = shape,
#include "ops.def"
#undef OP
};

/* Depth-first from each node in file order; a node on the current path seen
 * again is a cycle. Iterative, so deep graphs cannot overflow the stack. */
static void topo_sort(Graph *g) {
    int n = g->nodes.len;
    int *state = xcalloc((size_t)n + 1, sizeof(int)); /* 0 new, 1 open, 2 done */
    Node **order = xcalloc((size_t)n + 1, sizeof(Node *));
    int *stack = xcalloc((size_t)n + 1, sizeof(int));
    int *next_in = xcalloc((size_t)n + 1, sizeof(int));
    int count = 0;
    for (int root = 0; root < n; root++) {
        if (state[root])
            continue;
        int sp = 0;
        stack[sp++] = root;
        state[root] = 1;
        while (sp) {
            int id = stack[sp - 1];
            Node *nd = g->nodes.data[id];
            if (next_in[id] < nd->ninputs) {
                Tensor *t = nd->inputs[next_in[id]++];
                if (!t->producer)
                    continue;
                int p = t->producer->id;
                if (state[p] == 1)
                    error_at(nd->loc, "node '%s' is on a cycle: it depends on '%s', "
                             "which depends on it", nd->name, t->name);
                if (state[p] == 0) {
                    state[p] = 1;
                    stack[sp++] = p;
                }
            } else {
                state[id] = 2;
                order[count++] = nd;
                sp--;
            }
        }
    }
    for (int i = 0; i < n; i++)
        g->nodes.data[i] = order[i];
}

void infer_node(Node *n) {
    /* The YAML loader checks arity; ONNX nodes map onto kiln nodes with the
     * inputs they come with, so it is checked again here for every node. */
    const char *arity = op_arity_error(n->op, n->ninputs);
    if (arity)
        node_error(n, "%s", arity);
    if (n->noutputs < 1)
        node_error(n, "no outputs");
    /* Rows decided at run time (nms's) are -1 past the count: a node
     * computing with them would read those too. */
    for (int i = 0; i < n->ninputs; i++)
        if (n->inputs[i]->row_count)
            node_error_at(n, n->input_locs[i], "unsupported: it computes with '%s', whose "
                          "number of rows is known only at run time (the rows past its count "
                          "are -1): only a graph output may take it", n->inputs[i]->name);
    shape_rules[n->op](n);
    n->inferred = true;
}

/* A state and its update: the same dtype and shape, but for the state's
 * dynamic axis, where the update may be longer (a cache that grows); the
 * state's storage holds the larger. */
static void check_state(Tensor *s) {
    Tensor *u = s->update;
    s->storage = tensor_bytes(s);
    if (!u)
        return;
    bool ok = u->dtype == s->dtype && u->rank == s->rank;
    for (int i = 0; ok && i < s->rank; i++)
        ok = u->shape[i] == s->shape[i] || is_dyn(s, i);
    if (ok && u->dyn_axes && u->dyn_axes != s->dyn_axes)
        ok = false;
    if (!ok)
        error_at(s->update_loc, "state '%s' is %s %s; its update '%s' is %s %s: they must "
                 "agree but for the state's dynamic axis%s", s->name,
                 kiln_dtype_name(s->dtype), shape_str(s->rank, s->shape), u->name,
                 kiln_dtype_name(u->dtype), shape_str(u->rank, u->shape),
                 u->dyn_axes ? ", along which the update may also be dynamic" : "");
    if (tensor_bytes(u) > s->storage && !dyn_inside(s))
        s->storage = tensor_bytes(u); /* appended in place (an inner axis: copied) */
}

void infer_shapes(Graph *g) {
    topo_sort(g);
    for (int i = 0; i < g->states.len; i++)
        check_dynamic_state(g->states.data[i]);
    /* One pass per node: the ONNX loader infers each node as it maps it
     * (folding and mapping read the shapes), YAML nodes are inferred here. */
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if (n->inferred)
            continue;
        infer_node(n);
        infer_dynamic(g, n);
    }
    for (int i = 0; i < g->states.len; i++)
        check_state(g->states.data[i]);
}
