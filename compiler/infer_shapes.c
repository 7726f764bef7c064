/*
 * infer_shapes.c: order the graph, check every op's rules, compute shapes.
 *
 * Nodes may be listed in any order; they are sorted topologically, keeping
 * file order among independent nodes so the output is deterministic. A cycle
 * is reported at a node on it. Then each node's shape rule (named in
 * ops.def) checks its inputs and attributes and sets its outputs' dtype and
 * shape; every failure is an error at the node (or at the attribute) naming
 * it. After this pass nothing later meets an invalid graph.
 */
#include "kiln.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- attributes ---- */

Attr *node_attr(Node *n, const char *key) {
    for (int i = 0; i < n->nattrs; i++)
        if (strcmp(n->attrs[i].key, key) == 0)
            return &n->attrs[i];
    return NULL;
}

static int64_t parse_int_at(Node *n, const char *key, const char *s, Loc loc) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno == ERANGE)
        error_at(loc, "node '%s': %s must be an integer, not '%s'", n->name, key, s);
    return v;
}

int64_t attr_int(Node *n, const char *key, int64_t dflt) {
    Attr *a = node_attr(n, key);
    if (!a)
        return dflt;
    if (a->is_list)
        error_at(a->loc, "node '%s': %s must be an integer, not a list", n->name, key);
    return parse_int_at(n, key, a->scalar, a->loc);
}

double attr_float(Node *n, const char *key, double dflt) {
    Attr *a = node_attr(n, key);
    if (!a)
        return dflt;
    if (a->is_list)
        error_at(a->loc, "node '%s': %s must be a number, not a list", n->name, key);
    char *end;
    errno = 0;
    double v = strtod(a->scalar, &end);
    if (!*a->scalar || *end || errno == ERANGE || !isfinite(v))
        error_at(a->loc, "node '%s': %s must be a finite number, not '%s'", n->name,
                 key, a->scalar);
    return v;
}

int attr_ints(Node *n, const char *key, int64_t *out, int max) {
    Attr *a = node_attr(n, key);
    if (!a)
        return -1;
    if (!a->is_list)
        error_at(a->loc, "node '%s': %s must be a list of integers", n->name, key);
    if (a->nitems > max)
        error_at(a->loc, "node '%s': %s has %d items, at most %d allowed", n->name,
                 key, a->nitems, max);
    for (int i = 0; i < a->nitems; i++)
        out[i] = parse_int_at(n, key, a->items[i], a->item_locs[i]);
    return a->nitems;
}

/* ---- helpers for shape rules ---- */

static Loc attr_loc(Node *n, const char *key) {
    Attr *a = node_attr(n, key);
    return a ? a->loc : n->loc;
}

static void set_output(Node *n, kiln_dtype dt, int rank, const int64_t *shape) {
    if (n->noutputs != 1)
        error_at(n->loc, "node '%s': %s has one output, %d are listed", n->name,
                 op_info[n->op].name, n->noutputs);
    Tensor *t = n->outputs[0];
    double count = 1;
    for (int i = 0; i < rank; i++)
        count *= (double)shape[i];
    if (count > 4294967295.0)
        error_at(n->loc, "node '%s': output %s has more than 2^32 - 1 elements",
                 n->name, shape_str(rank, shape));
    t->dtype = dt;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
}

static void require_dtype(Node *n, int i, kiln_dtype dt) {
    Tensor *t = n->inputs[i];
    if (t->dtype != dt)
        error_at(n->input_locs[i], "node '%s': %s needs %s input, '%s' is %s",
                 n->name, op_info[n->op].name, kiln_dtype_name(dt), t->name,
                 kiln_dtype_name(t->dtype));
}

/* Normalizes a possibly negative axis against rank; errors when outside. */
static int norm_axis(Node *n, const char *key, int64_t axis, int rank) {
    if (axis < -rank || axis >= rank)
        error_at(attr_loc(n, key), "node '%s': %s %lld is out of range for rank %d",
                 n->name, key, (long long)axis, rank);
    return (int)(axis < 0 ? axis + rank : axis);
}

bool broadcast_shapes(int ra, const int64_t *a, int rb, const int64_t *b,
                      int *rout, int64_t *out) {
    int r = ra > rb ? ra : rb;
    for (int i = 0; i < r; i++) {
        int64_t da = i < r - ra ? 1 : a[i - (r - ra)];
        int64_t db = i < r - rb ? 1 : b[i - (r - rb)];
        if (da != db && da != 1 && db != 1)
            return false;
        out[i] = da == 1 ? db : da;
    }
    *rout = r;
    return true;
}

/* ---- shape rules (named in ops.def) ---- */

static void shape_unary(Node *n) {
    Tensor *x = n->inputs[0];
    require_dtype(n, 0, KILN_DTYPE_F32);
    set_output(n, x->dtype, x->rank, x->shape);
}

static void shape_broadcast(Node *n) {
    int rank = 0;
    int64_t shape[MAX_RANK];
    Tensor *a = n->inputs[0];
    rank = a->rank;
    memcpy(shape, a->shape, sizeof shape);
    for (int i = 0; i < n->ninputs; i++)
        require_dtype(n, i, KILN_DTYPE_F32);
    for (int i = 1; i < n->ninputs; i++) {
        Tensor *b = n->inputs[i];
        int64_t out[MAX_RANK];
        if (!broadcast_shapes(rank, shape, b->rank, b->shape, &rank, out))
            error_at(n->loc, "node '%s': shapes %s ('%s') and %s ('%s') do not "
                     "broadcast", n->name, shape_str(a->rank, a->shape), a->name,
                     shape_str(b->rank, b->shape), b->name);
        memcpy(shape, out, sizeof shape);
    }
    set_output(n, a->dtype, rank, shape);
}

/* numpy matmul: [..., M, K] x [..., K, N] with broadcast batch dimensions;
 * a 1-D operand is a vector (its dimension dropped from the result). */
static void shape_matmul(Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1];
    require_dtype(n, 0, KILN_DTYPE_F32);
    require_dtype(n, 1, KILN_DTYPE_F32);
    if (a->rank < 1 || b->rank < 1)
        error_at(n->loc, "node '%s': matmul needs operands of rank 1 or more, "
                 "got %s and %s", n->name, shape_str(a->rank, a->shape),
                 shape_str(b->rank, b->shape));
    int64_t k_a = a->shape[a->rank - 1];
    int64_t k_b = b->rank == 1 ? b->shape[0] : b->shape[b->rank - 2];
    if (k_a != k_b)
        error_at(n->loc, "node '%s': matmul of %s ('%s') and %s ('%s'): inner "
                 "dimensions %lld and %lld differ", n->name,
                 shape_str(a->rank, a->shape), a->name, shape_str(b->rank, b->shape),
                 b->name, (long long)k_a, (long long)k_b);
    int ba = a->rank > 2 ? a->rank - 2 : 0, bb = b->rank > 2 ? b->rank - 2 : 0;
    int rank;
    int64_t shape[MAX_RANK];
    if (!broadcast_shapes(ba, a->shape, bb, b->shape, &rank, shape))
        error_at(n->loc, "node '%s': matmul batch dimensions of %s and %s do not "
                 "broadcast", n->name, shape_str(a->rank, a->shape),
                 shape_str(b->rank, b->shape));
    if (a->rank >= 2)
        shape[rank++] = a->shape[a->rank - 2];
    if (b->rank >= 2)
        shape[rank++] = b->shape[b->rank - 1];
    set_output(n, a->dtype, rank, shape);
}

static void check_last_axis(Node *n, int rank) {
    int64_t axis = attr_int(n, "axis", -1);
    if (rank < 1)
        error_at(n->loc, "node '%s': %s needs an input of rank 1 or more", n->name,
                 op_info[n->op].name);
    if (norm_axis(n, "axis", axis, rank) != rank - 1)
        error_at(attr_loc(n, "axis"), "node '%s': %s supports only the last axis "
                 "(-1 or %d) for now, got %lld", n->name, op_info[n->op].name,
                 rank - 1, (long long)axis);
}

static void shape_last_axis(Node *n) {
    Tensor *x = n->inputs[0];
    require_dtype(n, 0, KILN_DTYPE_F32);
    check_last_axis(n, x->rank);
    set_output(n, x->dtype, x->rank, x->shape);
}

/* layer_norm(x, [gamma, [beta]]): gamma and beta have the last axis' size. */
static void shape_layer_norm(Node *n) {
    Tensor *x = n->inputs[0];
    require_dtype(n, 0, KILN_DTYPE_F32);
    check_last_axis(n, x->rank);
    double eps = attr_float(n, "eps", 1e-5);
    if (!(eps > 0))
        error_at(attr_loc(n, "eps"), "node '%s': eps must be positive, got %g",
                 n->name, eps);
    int64_t cols = x->shape[x->rank - 1];
    for (int i = 1; i < n->ninputs; i++) {
        Tensor *p = n->inputs[i];
        require_dtype(n, i, KILN_DTYPE_F32);
        if (tensor_count(p) != cols || p->rank < 1 || p->shape[p->rank - 1] != cols)
            error_at(n->input_locs[i], "node '%s': %s '%s' has shape %s; it must "
                     "have %lld elements along the normalized axis", n->name,
                     i == 1 ? "gamma" : "beta", p->name, shape_str(p->rank, p->shape),
                     (long long)cols);
    }
    set_output(n, x->dtype, x->rank, x->shape);
}

/* reshape: `shape` may hold one -1 (inferred) and 0 (copy that dimension). */
static void shape_reshape(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t shape[MAX_RANK];
    int rank = attr_ints(n, "shape", shape, MAX_RANK);
    if (rank < 0)
        error_at(n->loc, "node '%s': reshape needs a shape attribute", n->name);
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 0) {
            if (i >= x->rank)
                error_at(attr_loc(n, "shape"), "node '%s': shape[%d] is 0 (copy) "
                         "but the input has rank %d", n->name, i, x->rank);
            shape[i] = x->shape[i];
        }
        if (shape[i] == -1) {
            if (infer >= 0)
                error_at(attr_loc(n, "shape"), "node '%s': shape has more than one -1",
                         n->name);
            infer = i;
        } else if (shape[i] < 0) {
            error_at(attr_loc(n, "shape"), "node '%s': shape[%d] is %lld", n->name,
                     i, (long long)shape[i]);
        } else {
            known *= shape[i];
        }
    }
    int64_t count = tensor_count(x);
    if (infer >= 0) {
        if (known == 0 || count % known != 0)
            error_at(attr_loc(n, "shape"), "node '%s': cannot reshape %s (%lld "
                     "elements) to %s", n->name, shape_str(x->rank, x->shape),
                     (long long)count, shape_str(rank, shape));
        shape[infer] = count / known;
        known = count;
    }
    if (known != count)
        error_at(attr_loc(n, "shape"), "node '%s': cannot reshape %s (%lld elements) "
                 "to %s (%lld elements)", n->name, shape_str(x->rank, x->shape),
                 (long long)count, shape_str(rank, shape), (long long)known);
    set_output(n, x->dtype, rank, shape);
}

/* transpose: `perm` is a permutation of the axes; default reverses them. */
static void shape_transpose(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t perm[MAX_RANK];
    int np = attr_ints(n, "perm", perm, MAX_RANK);
    if (np < 0) {
        np = x->rank;
        for (int i = 0; i < np; i++)
            perm[i] = np - 1 - i;
    }
    if (np != x->rank)
        error_at(attr_loc(n, "perm"), "node '%s': perm has %d axes, the input %s "
                 "has %d", n->name, np, shape_str(x->rank, x->shape), x->rank);
    bool seen[MAX_RANK] = {0};
    int64_t shape[MAX_RANK];
    for (int i = 0; i < np; i++) {
        int a = norm_axis(n, "perm", perm[i], x->rank);
        if (seen[a])
            error_at(attr_loc(n, "perm"), "node '%s': perm names axis %d twice",
                     n->name, a);
        seen[a] = true;
        shape[i] = x->shape[a];
    }
    set_output(n, x->dtype, x->rank, shape);
}

typedef void (*ShapeFn)(Node *n);
static const ShapeFn shape_rules[OP_COUNT] = {
#define OP(id, name, mn, mx, attrs, shape, lower, expr) [OP_##id] = shape,
#include "ops.def"
#undef OP
};

/* ---- topological order ---- */

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

void infer_shapes(Graph *g) {
    topo_sort(g);
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        shape_rules[n->op](n);
    }
}
