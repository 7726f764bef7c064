/*
 * graph.c: building graphs in code, for loaders other than YAML.
 *
 * Attributes are stored as the YAML loader stores them (text), so every
 * shape rule and lowering reads them the same way whatever the source.
 */
#include "kiln.h"

#include <string.h>

Tensor *graph_tensor(Graph *g, const char *name, TensorKind kind, Loc loc) {
    Tensor *t = xcalloc(1, sizeof *t);
    t->name = xstrdup(name);
    t->kind = kind;
    t->loc = loc;
    t->id = g->tensors.len;
    vec_push(&g->tensors, t);
    if (kind == T_INPUT)
        vec_push(&g->inputs, t);
    if (kind == T_WEIGHT)
        vec_push(&g->weights, t);
    return t;
}

Node *graph_node(Graph *g, OpKind op, const char *name, Loc loc) {
    Node *n = xcalloc(1, sizeof *n);
    n->name = xstrdup(name);
    n->op = op;
    n->loc = loc;
    n->graph = g;
    n->id = g->nodes.len;
    vec_push(&g->nodes, n);
    return n;
}

Node *fused_head(Node *n) {
    while (n->fused_into)
        n = n->fused_into;
    return n;
}

void node_add_input(Node *n, Tensor *t) {
    n->inputs = xrealloc(n->inputs, sizeof(Tensor *) * (size_t)(n->ninputs + 1));
    n->input_locs = xrealloc(n->input_locs, sizeof(Loc) * (size_t)(n->ninputs + 1));
    n->input_locs[n->ninputs] = n->loc;
    n->inputs[n->ninputs++] = t;
}

Tensor *other_input(const Node *n, const Tensor *t) {
    return n->inputs[n->inputs[0] == t ? 1 : 0];
}

void node_add_output(Node *n, Tensor *t) {
    n->outputs = xrealloc(n->outputs, sizeof(Tensor *) * (size_t)(n->noutputs + 1));
    n->outputs[n->noutputs++] = t;
    t->producer = n;
}

void release_weight(Graph *g, Tensor *b, bool (*spare)(Node *m, int k, void *ctx),
                    void *ctx) {
    if (!(b->owns_data || b->file_bytes) || !b->data || b->is_output)
        return;
    for (int i = 0; i < g->nodes.len; i++) {
        Node *m = g->nodes.data[i];
        for (int k = 0; !m->dead && k < m->ninputs; k++)
            if (m->inputs[k] == b && !spare(m, k, ctx))
                return;
    }
    for (int i = 0; i < g->tensors.len; i++) {
        const Tensor *t = g->tensors.data[i];
        if (t != b && t->data == b->data)
            return;
    }
    if (b->owns_data)
        xfree(b->data);
    else
        drop_pages(b->data, tensor_bytes(b));
    b->data = NULL;
    b->owns_data = b->file_bytes = false;
}

static Attr *new_attr(Node *n, const char *key) {
    for (int i = 0; i < n->nattrs; i++)
        if (strcmp(n->attrs[i].key, key) == 0) {
            memset(&n->attrs[i], 0, sizeof n->attrs[i]);
            n->attrs[i].key = xstrdup(key);
            n->attrs[i].loc = n->loc;
            return &n->attrs[i];
        }
    n->attrs = xrealloc(n->attrs, sizeof(Attr) * (size_t)(n->nattrs + 1));
    Attr *a = &n->attrs[n->nattrs++];
    memset(a, 0, sizeof *a);
    a->key = xstrdup(key);
    a->loc = n->loc;
    return a;
}

void node_set_attr(Node *n, const char *key, const char *scalar) {
    new_attr(n, key)->scalar = xstrdup(scalar);
}

void node_set_int(Node *n, const char *key, int64_t v) {
    node_set_attr(n, key, format("%lld", (long long)v));
}

void node_set_float(Node *n, const char *key, double v) {
    node_set_attr(n, key, format("%.17g", v));
}

static void set_list(Node *n, const char *key, int count, char **items) {
    Attr *a = new_attr(n, key);
    a->is_list = true;
    a->nitems = count;
    a->items = xcalloc((size_t)count + 1, sizeof(char *));
    a->item_locs = xcalloc((size_t)count + 1, sizeof(Loc));
    for (int i = 0; i < count; i++) {
        a->items[i] = items[i];
        a->item_locs[i] = n->loc;
    }
}

void node_set_ints(Node *n, const char *key, int count, const int64_t *v) {
    char **items = xcalloc((size_t)count + 1, sizeof(char *));
    for (int i = 0; i < count; i++)
        items[i] = format("%lld", (long long)v[i]);
    set_list(n, key, count, items);
}

void node_set_strs(Node *n, const char *key, int count, char **items) {
    set_list(n, key, count, items);
}

void node_set_floats(Node *n, const char *key, int count, const double *v) {
    char **items = xcalloc((size_t)count + 1, sizeof(char *));
    for (int i = 0; i < count; i++)
        items[i] = format("%.17g", v[i]);
    set_list(n, key, count, items);
}

int declared_dims(const Graph *g) {
    int n = 0;
    while (n < g->ndims && g->dims[n].op == DIM_DECLARED)
        n++;
    return n;
}
