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
#include <stdint.h>
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

/* A number attribute (default dflt) that must be positive: eps, rates. */
static double positive_float(Node *n, const char *key, double dflt) {
    double v = attr_float(n, key, dflt);
    if (!(v > 0))
        error_at(attr_loc(n, key), "node '%s': %s must be positive, got %g", n->name, key, v);
    return v;
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

static int attr_axes(Node *n, const char *key, int rank, int *axes);

/* ---- dtype classes ---- */

static bool is_float(kiln_dtype d) { return d == KILN_DTYPE_F32 || d == KILN_DTYPE_F16; }
static bool is_numeric(kiln_dtype d) { return d != KILN_DTYPE_BOOL; }

static void require(Node *n, int i, bool ok, const char *what) {
    Tensor *t = n->inputs[i];
    if (!ok)
        error_at(n->input_locs[i], "node '%s': %s needs %s inputs, '%s' is %s", n->name,
                 op_info[n->op].name, what, t->name, kiln_dtype_name(t->dtype));
}

static void same_dtype(Node *n, int first, int last) {
    for (int i = first + 1; i <= last && i < n->ninputs; i++)
        if (n->inputs[i]->dtype != n->inputs[first]->dtype)
            error_at(n->input_locs[i], "node '%s': '%s' is %s but '%s' is %s; %s needs "
                     "one dtype", n->name, n->inputs[first]->name,
                     kiln_dtype_name(n->inputs[first]->dtype), n->inputs[i]->name,
                     kiln_dtype_name(n->inputs[i]->dtype), op_info[n->op].name);
}

/* The broadcast shape of inputs [first, ninputs). */
static int broadcast_inputs(Node *n, int first, int64_t *shape) {
    Tensor *a = n->inputs[first];
    int rank = a->rank;
    memcpy(shape, a->shape, sizeof(int64_t) * (size_t)rank);
    for (int i = first + 1; i < n->ninputs; i++) {
        Tensor *b = n->inputs[i];
        int64_t out[MAX_RANK];
        if (!broadcast_shapes(rank, shape, b->rank, b->shape, &rank, out))
            error_at(n->loc, "node '%s': shapes %s and %s ('%s') do not broadcast",
                     n->name, shape_str(rank, shape), shape_str(b->rank, b->shape),
                     b->name);
        memcpy(shape, out, sizeof(int64_t) * (size_t)rank);
    }
    return rank;
}

/* ---- shape rules (named in ops.def) ---- */

static void shape_unary_float(Node *n) {
    Tensor *x = n->inputs[0];
    require(n, 0, is_float(x->dtype), "f32 or f16");
    set_output(n, x->dtype, x->rank, x->shape);
}

static void shape_float_predicate(Node *n) {
    Tensor *x = n->inputs[0];
    require(n, 0, is_float(x->dtype), "f32 or f16");
    set_output(n, KILN_DTYPE_BOOL, x->rank, x->shape);
}

static void shape_unary_numeric(Node *n) {
    Tensor *x = n->inputs[0];
    require(n, 0, is_numeric(x->dtype), "numeric (not bool)");
    set_output(n, x->dtype, x->rank, x->shape);
}

static void shape_arith(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, is_numeric(n->inputs[i]->dtype), "numeric (not bool)");
    same_dtype(n, 0, n->ninputs - 1);
    int64_t shape[MAX_RANK];
    int rank = broadcast_inputs(n, 0, shape);
    set_output(n, n->inputs[0]->dtype, rank, shape);
}

static void shape_arith_float(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, is_float(n->inputs[i]->dtype), "f32 or f16");
    shape_arith(n);
}

static void shape_compare(Node *n) {
    same_dtype(n, 0, n->ninputs - 1);
    int64_t shape[MAX_RANK];
    int rank = broadcast_inputs(n, 0, shape);
    set_output(n, KILN_DTYPE_BOOL, rank, shape);
}

static void shape_logical(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, n->inputs[i]->dtype == KILN_DTYPE_BOOL, "bool");
    int64_t shape[MAX_RANK];
    int rank = broadcast_inputs(n, 0, shape);
    set_output(n, KILN_DTYPE_BOOL, rank, shape);
}

/* where(cond, x, y) */
static void shape_where(Node *n) {
    if (n->inputs[0]->dtype != KILN_DTYPE_BOOL)
        error_at(n->input_locs[0], "node '%s': the condition '%s' of where must be bool, "
                 "not %s", n->name, n->inputs[0]->name,
                 kiln_dtype_name(n->inputs[0]->dtype));
    same_dtype(n, 1, 2);
    int64_t shape[MAX_RANK];
    int rank = broadcast_inputs(n, 0, shape);
    set_output(n, n->inputs[1]->dtype, rank, shape);
}

/* The dtype named by a string attribute. */
static kiln_dtype attr_dtype(Node *n, const char *key) {
    Attr *a = node_attr(n, key);
    if (!a)
        error_at(n->loc, "node '%s': %s needs a '%s' attribute", n->name,
                 op_info[n->op].name, key);
    for (int d = KILN_DTYPE_F32; d <= KILN_DTYPE_I8; d++)
        if (!a->is_list && strcmp(a->scalar, kiln_dtype_name((kiln_dtype)d)) == 0)
            return (kiln_dtype)d;
    error_at(a->loc, "node '%s': %s must be a dtype (f32 f16 i32 i64 bool u8 i8)",
             n->name, key);
}

static void shape_cast(Node *n) {
    Tensor *x = n->inputs[0];
    set_output(n, attr_dtype(n, "to"), x->rank, x->shape);
}

static void require_f32(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, n->inputs[i]->dtype == KILN_DTYPE_F32, "f32");
}

/* gemm(A, B, [C]): 2-D operands, op(A) [M, K] x op(B) [K, N], C broadcast
 * to [M, N]; activation one of none relu gelu gelu_tanh silu sigmoid tanh. */
static void shape_gemm(Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1];
    require_f32(n);
    if (a->rank != 2 || b->rank != 2)
        error_at(n->loc, "node '%s': gemm needs 2-D operands, got %s and %s", n->name,
                 shape_str(a->rank, a->shape), shape_str(b->rank, b->shape));
    bool ta = attr_int(n, "trans_a", 0) != 0, tb = attr_int(n, "trans_b", 0) != 0;
    int64_t M = ta ? a->shape[1] : a->shape[0], K = ta ? a->shape[0] : a->shape[1];
    int64_t Kb = tb ? b->shape[1] : b->shape[0], N = tb ? b->shape[0] : b->shape[1];
    if (K != Kb)
        error_at(n->loc, "node '%s': gemm of op(A) [%lld, %lld] and op(B) [%lld, %lld]: "
                 "inner dimensions differ", n->name, (long long)M, (long long)K,
                 (long long)Kb, (long long)N);
    int64_t shape[2] = {M, N};
    if (n->ninputs > 2) {
        Tensor *c = n->inputs[2];
        int r;
        int64_t out[MAX_RANK];
        if (c->rank > 2 || !broadcast_shapes(c->rank, c->shape, 2, shape, &r, out) ||
            out[0] != M || out[1] != N)
            error_at(n->input_locs[2], "node '%s': bias '%s' %s does not broadcast to "
                     "[%lld, %lld]", n->name, c->name, shape_str(c->rank, c->shape),
                     (long long)M, (long long)N);
    }
    Attr *act = node_attr(n, "activation");
    if (act) {
        static const char *const names[] = {"none", "relu", "gelu", "gelu_tanh", "silu",
                                            "sigmoid", "tanh"};
        bool ok = false;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            ok |= !act->is_list && strcmp(act->scalar, names[i]) == 0;
        if (!ok)
            error_at(act->loc, "node '%s': unknown activation (known: none relu gelu "
                     "gelu_tanh silu sigmoid tanh)", n->name);
    }
    set_output(n, a->dtype, 2, shape);
}

/* numpy matmul: [..., M, K] x [..., K, N] with broadcast batch dimensions;
 * a 1-D operand is a vector (its dimension dropped from the result). */
static void shape_matmul(Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1];
    /* f16 x f16 -> f16 (f32 accumulation), else f32 only */
    if (a->dtype == KILN_DTYPE_F16)
        require(n, 1, b->dtype == KILN_DTYPE_F16, "two f16 or two f32");
    else
        require_f32(n);
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

static bool is_index(kiln_dtype d);

/* grouped_matmul(x [..., K], w [E, K, N], expert [...], [bias [E, N]]): row r
 * of x times w[expert[r]] (+ bias[expert[r]]); expert has x's leading
 * shape. The result is [..., N]. */
static void shape_grouped_matmul(Node *n) {
    Tensor *x = n->inputs[0], *w = n->inputs[1], *e = n->inputs[2];
    for (int i = 0; i < n->ninputs; i++)
        if (i != 2)
            require(n, i, n->inputs[i]->dtype == KILN_DTYPE_F32, "f32");
    require(n, 2, is_index(e->dtype), "an i32 or i64 expert index:");
    if (x->rank < 1)
        error_at(n->input_locs[0], "node '%s': x '%s' must be [..., K], not a scalar",
                 n->name, x->name);
    int64_t K = x->shape[x->rank - 1];
    if (w->rank != 3 || w->shape[1] != K)
        error_at(n->input_locs[1], "node '%s': the expert weights '%s' are %s; they must "
                 "be [experts, %lld, N] (K of x '%s' is %lld)", n->name, w->name,
                 shape_str(w->rank, w->shape), (long long)K, x->name, (long long)K);
    if (e->rank != x->rank - 1 ||
        memcmp(e->shape, x->shape, sizeof(int64_t) * (size_t)e->rank) != 0)
        error_at(n->input_locs[2], "node '%s': the expert index '%s' is %s; it must be "
                 "%s, one expert per row of '%s'", n->name, e->name,
                 shape_str(e->rank, e->shape), shape_str(x->rank - 1, x->shape), x->name);
    if (n->ninputs > 3) {
        Tensor *b = n->inputs[3];
        if (b->rank != 2 || b->shape[0] != w->shape[0] || b->shape[1] != w->shape[2])
            error_at(n->input_locs[3], "node '%s': the expert bias '%s' is %s; it must be "
                     "[%lld, %lld] (experts, N)", n->name, b->name,
                     shape_str(b->rank, b->shape), (long long)w->shape[0],
                     (long long)w->shape[2]);
    }
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = w->shape[2];
    set_output(n, KILN_DTYPE_F32, x->rank, shape);
}

/* softmax, log_softmax, cumsum: one axis of an f32 tensor. */
static void shape_axis_float(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    if (x->rank < 1)
        error_at(n->loc, "node '%s': %s needs an input of rank 1 or more", n->name,
                 op_info[n->op].name);
    norm_axis(n, "axis", attr_int(n, "axis", -1), x->rank);
    set_output(n, x->dtype, x->rank, x->shape);
}

/* layer_norm, rms_norm and their residual forms: normalize over the axes
 * from `axis` to the last; gamma and beta hold one value per normalized
 * element. Residual forms take (x, residual, [gamma, [beta]]) and may list
 * a second output, the sum x + residual. */
static void shape_norm(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    bool residual = n->op == OP_RESIDUAL_LAYER_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    if (x->rank < 1)
        error_at(n->loc, "node '%s': %s needs an input of rank 1 or more", n->name,
                 op_info[n->op].name);
    int axis = norm_axis(n, "axis", attr_int(n, "axis", -1), x->rank);
    positive_float(n, "eps", 1e-5);
    int first_param = 1;
    if (residual) {
        Tensor *r = n->inputs[1];
        if (r->rank != x->rank || memcmp(r->shape, x->shape, sizeof(int64_t) * (size_t)x->rank))
            error_at(n->input_locs[1], "node '%s': the residual '%s' %s must have the "
                     "shape of '%s' %s", n->name, r->name, shape_str(r->rank, r->shape),
                     x->name, shape_str(x->rank, x->shape));
        first_param = 2;
        if (n->noutputs > 2)
            error_at(n->loc, "node '%s': %s has one or two outputs (the norm, the sum)",
                     n->name, op_info[n->op].name);
    } else if (n->noutputs != 1) {
        set_output(n, x->dtype, x->rank, x->shape); /* reports the count */
    }
    int64_t cols = shape_count(x->rank - axis, x->shape + axis);
    for (int i = first_param; i < n->ninputs; i++) {
        Tensor *p = n->inputs[i];
        if (tensor_count(p) != cols || (p->rank && p->shape[p->rank - 1] != x->shape[x->rank - 1]))
            error_at(n->input_locs[i], "node '%s': %s '%s' has shape %s; it must have "
                     "the shape %s of the normalized axes", n->name,
                     i == first_param ? "gamma" : "beta", p->name,
                     shape_str(p->rank, p->shape), shape_str(x->rank - axis, x->shape + axis));
    }
    for (int i = 0; i < n->noutputs; i++) {
        n->outputs[i]->dtype = x->dtype;
        n->outputs[i]->rank = x->rank;
        memcpy(n->outputs[i]->shape, x->shape, sizeof x->shape);
    }
}

static void check_channel_param(Node *n, int i, int64_t c) {
    Tensor *p = n->inputs[i];
    if (p->rank != 1 || p->shape[0] != c)
        error_at(n->input_locs[i], "node '%s': '%s' has shape %s; it must be [%lld], one "
                 "value per channel", n->name, p->name, shape_str(p->rank, p->shape),
                 (long long)c);
}

/* instance_norm(x, scale, bias) and group_norm(x, scale, bias) over
 * x [N, C, ...]. */
static void shape_channel_norm(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    if (x->rank < 3)
        error_at(n->loc, "node '%s': %s needs [N, C, D1, ...], got %s", n->name,
                 op_info[n->op].name, shape_str(x->rank, x->shape));
    positive_float(n, "eps", 1e-5);
    if (n->op == OP_GROUP_NORM) {
        int64_t g = attr_int(n, "groups", 0);
        if (g < 1 || x->shape[1] % g)
            error_at(node_attr(n, "groups") ? attr_loc(n, "groups") : n->loc,
                     "node '%s': groups must be a positive divisor of the %lld channels",
                     n->name, (long long)x->shape[1]);
    }
    check_channel_param(n, 1, x->shape[1]);
    check_channel_param(n, 2, x->shape[1]);
    set_output(n, x->dtype, x->rank, x->shape);
}

/* batch_norm(x, scale, bias, mean, var), inference: per channel (axis 1). */
static void shape_batch_norm(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    if (x->rank < 2)
        error_at(n->loc, "node '%s': batch_norm needs [N, C, ...], got %s", n->name,
                 shape_str(x->rank, x->shape));
    positive_float(n, "eps", 1e-5);
    for (int i = 1; i < 5; i++)
        check_channel_param(n, i, x->shape[1]);
    set_output(n, x->dtype, x->rank, x->shape);
}

/* Marks the reduced axes; returns how many. axes absent or empty: all. */
int reduced_axes(Node *n, bool *reduced) {
    Tensor *x = n->inputs[0];
    int axes[MAX_RANK], k;
    memset(reduced, 0, sizeof(bool) * MAX_RANK);
    if (n->op == OP_GLOBAL_AVG_POOL || n->op == OP_GLOBAL_MAX_POOL) {
        for (k = 0; k + 2 < x->rank; k++)
            axes[k] = k + 2;
    } else if (n->op == OP_ARGMAX || n->op == OP_ARGMIN) {
        if (x->rank < 1)
            error_at(n->loc, "node '%s': %s of a scalar", n->name, op_info[n->op].name);
        axes[0] = norm_axis(n, "axis", attr_int(n, "axis", 0), x->rank);
        k = 1;
    } else {
        k = attr_axes(n, "axes", x->rank, axes);
        if (k <= 0)
            for (k = 0; k < x->rank; k++)
                axes[k] = k;
    }
    for (int i = 0; i < k; i++)
        reduced[axes[i]] = true;
    return k;
}

static void reduce_output(Node *n, kiln_dtype dt) {
    Tensor *x = n->inputs[0];
    bool reduced[MAX_RANK];
    reduced_axes(n, reduced);
    int64_t keep = attr_int(n, "keep_dims", 1);
    if (keep != 0 && keep != 1)
        error_at(attr_loc(n, "keep_dims"), "node '%s': keep_dims must be 0 or 1", n->name);
    int64_t shape[MAX_RANK];
    int rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (!reduced[i] || keep)
            shape[rank++] = reduced[i] ? 1 : x->shape[i];
    set_output(n, dt, rank, shape);
}

static void shape_reduce(Node *n) {
    require_f32(n);
    reduce_output(n, KILN_DTYPE_F32);
}

static void shape_arg(Node *n) {
    require_f32(n);
    int64_t last = attr_int(n, "select_last_index", 0);
    if (last != 0 && last != 1)
        error_at(attr_loc(n, "select_last_index"), "node '%s': select_last_index must "
                 "be 0 or 1", n->name);
    reduce_output(n, KILN_DTYPE_I64);
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
            known = sat_mul(known, shape[i]);
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

/* Reads a list of axes of a tensor of `rank` into `axes` (normalized),
 * rejecting repeats; returns the count, or -1 when absent. */
static int attr_axes(Node *n, const char *key, int rank, int *axes) {
    int64_t v[MAX_RANK];
    int k = attr_ints(n, key, v, MAX_RANK);
    bool seen[MAX_RANK] = {0};
    for (int i = 0; i < k; i++) {
        axes[i] = norm_axis(n, key, v[i], rank);
        if (seen[axes[i]])
            error_at(attr_loc(n, key), "node '%s': %s names axis %d twice", n->name,
                     key, axes[i]);
        seen[axes[i]] = true;
    }
    return k;
}

/* squeeze: drop the listed size-1 axes (default: every size-1 axis). */
static void shape_squeeze(Node *n) {
    Tensor *x = n->inputs[0];
    int axes[MAX_RANK];
    int k = attr_axes(n, "axes", x->rank, axes);
    bool drop[MAX_RANK] = {0};
    for (int i = 0; i < x->rank; i++)
        drop[i] = k < 0 && x->shape[i] == 1;
    for (int i = 0; i < k; i++) {
        if (x->shape[axes[i]] != 1)
            error_at(attr_loc(n, "axes"), "node '%s': axis %d of %s has size %lld, not 1",
                     n->name, axes[i], shape_str(x->rank, x->shape),
                     (long long)x->shape[axes[i]]);
        drop[axes[i]] = true;
    }
    int64_t shape[MAX_RANK];
    int rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (!drop[i])
            shape[rank++] = x->shape[i];
    set_output(n, x->dtype, rank, shape);
}

/* unsqueeze: insert size-1 axes at the listed places of the output. */
static void shape_unsqueeze(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t v[MAX_RANK];
    int k = attr_ints(n, "axes", v, MAX_RANK);
    if (k < 0)
        error_at(n->loc, "node '%s': unsqueeze needs axes", n->name);
    int rank = x->rank + k;
    if (rank > MAX_RANK)
        error_at(attr_loc(n, "axes"), "node '%s': the result would have rank %d; "
                 "kiln supports up to %d", n->name, rank, MAX_RANK);
    int axes[MAX_RANK];
    k = attr_axes(n, "axes", rank, axes);
    bool ins[MAX_RANK] = {0};
    for (int i = 0; i < k; i++)
        ins[axes[i]] = true;
    int64_t shape[MAX_RANK];
    for (int i = 0, j = 0; i < rank; i++)
        shape[i] = ins[i] ? 1 : x->shape[j++];
    set_output(n, x->dtype, rank, shape);
}

/* flatten: [prod(shape[:axis]), prod(shape[axis:])]. */
static void shape_flatten(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t axis = attr_int(n, "axis", 1);
    if (axis < -x->rank || axis > x->rank)
        error_at(attr_loc(n, "axis"), "node '%s': axis %lld is out of range for rank %d",
                 n->name, (long long)axis, x->rank);
    if (axis < 0)
        axis += x->rank;
    int64_t shape[2] = {shape_count((int)axis, x->shape),
                        shape_count(x->rank - (int)axis, x->shape + axis)};
    set_output(n, x->dtype, 2, shape);
}

void slice_params(Node *n, int64_t *start, int64_t *step, int64_t *out_shape) {
    Tensor *x = n->inputs[0];
    int64_t starts[MAX_RANK], ends[MAX_RANK], steps[MAX_RANK];
    int axes[MAX_RANK];
    int ns = attr_ints(n, "starts", starts, MAX_RANK);
    int ne = attr_ints(n, "ends", ends, MAX_RANK);
    if (ns < 0 || ne < 0)
        error_at(n->loc, "node '%s': slice needs starts and ends", n->name);
    if (ns != ne)
        error_at(attr_loc(n, "ends"), "node '%s': %d starts but %d ends", n->name, ns, ne);
    int na = attr_axes(n, "axes", x->rank, axes);
    if (na < 0)
        for (na = 0; na < ns; na++)
            axes[na] = na;
    if (na != ns || ns > x->rank)
        error_at(attr_loc(n, na != ns ? "axes" : "starts"), "node '%s': %d starts for "
                 "%d axes of a rank-%d input", n->name, ns, na, x->rank);
    int nst = attr_ints(n, "steps", steps, MAX_RANK);
    if (nst < 0)
        for (nst = 0; nst < ns; nst++)
            steps[nst] = 1;
    if (nst != ns)
        error_at(attr_loc(n, "steps"), "node '%s': %d steps for %d starts", n->name, nst,
                 ns);
    for (int d = 0; d < x->rank; d++) {
        start[d] = 0;
        step[d] = 1;
        out_shape[d] = x->shape[d];
    }
    for (int i = 0; i < ns; i++) {
        int d = axes[i];
        int64_t dim = x->shape[d], s = starts[i], e = ends[i], st = steps[i];
        if (st == 0)
            error_at(attr_loc(n, "steps"), "node '%s': a step is 0", n->name);
        /* ONNX semantics: negative indices count from the end, then clamp. */
        if (s < 0)
            s += dim;
        if (e < 0)
            e += dim;
        if (st > 0) {
            s = s < 0 ? 0 : s > dim ? dim : s;
            e = e < 0 ? 0 : e > dim ? dim : e;
            out_shape[d] = e > s ? (e - s + st - 1) / st : 0;
        } else {
            s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
            e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
            out_shape[d] = s > e ? (s - e + (-st) - 1) / (-st) : 0;
        }
        start[d] = out_shape[d] ? s : 0;
        step[d] = st;
    }
}

static void shape_slice(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t start[MAX_RANK], step[MAX_RANK], shape[MAX_RANK];
    slice_params(n, start, step, shape);
    set_output(n, x->dtype, x->rank, shape);
}

static void shape_concat(Node *n) {
    Tensor *x = n->inputs[0];
    Attr *a = node_attr(n, "axis");
    if (!a)
        error_at(n->loc, "node '%s': concat needs an axis", n->name);
    if (x->rank < 1)
        error_at(n->loc, "node '%s': concat of a scalar", n->name);
    int axis = norm_axis(n, "axis", attr_int(n, "axis", 0), x->rank);
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof shape);
    same_dtype(n, 0, n->ninputs - 1);
    for (int i = 1; i < n->ninputs; i++) {
        Tensor *t = n->inputs[i];
        bool ok = t->rank == x->rank;
        for (int d = 0; ok && d < x->rank; d++)
            ok = d == axis || t->shape[d] == x->shape[d];
        if (!ok)
            error_at(n->input_locs[i], "node '%s': '%s' %s does not match %s outside "
                     "axis %d", n->name, t->name, shape_str(t->rank, t->shape),
                     shape_str(x->rank, x->shape), axis);
        shape[axis] += t->shape[axis];
    }
    set_output(n, x->dtype, x->rank, shape);
}

/* split: outputs along axis, sizes given or equal. */
void split_sizes(Node *n, int *axis_out, int64_t *sizes) {
    Tensor *x = n->inputs[0];
    if (x->rank < 1)
        error_at(n->loc, "node '%s': split of a scalar", n->name);
    int axis = norm_axis(n, "axis", attr_int(n, "axis", 0), x->rank);
    int64_t dim = x->shape[axis];
    int k = attr_ints(n, "sizes", sizes, 16);
    if (k < 0) {
        if (dim % n->noutputs)
            error_at(n->loc, "node '%s': axis %d of size %lld does not split into %d "
                     "equal parts; give sizes", n->name, axis, (long long)dim,
                     n->noutputs);
        for (int i = 0; i < n->noutputs; i++)
            sizes[i] = dim / n->noutputs;
    } else {
        int64_t sum = 0;
        if (k != n->noutputs)
            error_at(attr_loc(n, "sizes"), "node '%s': %d sizes for %d outputs", n->name,
                     k, n->noutputs);
        for (int i = 0; i < k; i++) {
            if (sizes[i] < 0)
                error_at(attr_loc(n, "sizes"), "node '%s': a negative size", n->name);
            sum += sizes[i];
        }
        if (sum != dim)
            error_at(attr_loc(n, "sizes"), "node '%s': sizes add up to %lld, axis %d has "
                     "%lld", n->name, (long long)sum, axis, (long long)dim);
    }
    *axis_out = axis;
}

static void shape_split(Node *n) {
    Tensor *x = n->inputs[0];
    int axis;
    int64_t sizes[16];
    if (n->noutputs > 16)
        error_at(n->loc, "node '%s': split into more than 16 outputs", n->name);
    split_sizes(n, &axis, sizes);
    for (int i = 0; i < n->noutputs; i++) {
        Tensor *t = n->outputs[i];
        t->dtype = x->dtype;
        t->rank = x->rank;
        memcpy(t->shape, x->shape, sizeof t->shape);
        t->shape[axis] = sizes[i];
    }
}

static void shape_expand(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t target[MAX_RANK], shape[MAX_RANK];
    int k = attr_ints(n, "shape", target, MAX_RANK);
    if (k < 0)
        error_at(n->loc, "node '%s': expand needs a shape", n->name);
    int rank;
    if (!broadcast_shapes(x->rank, x->shape, k, target, &rank, shape))
        error_at(attr_loc(n, "shape"), "node '%s': %s does not broadcast to %s", n->name,
                 shape_str(x->rank, x->shape), shape_str(k, target));
    set_output(n, x->dtype, rank, shape);
}

static void shape_tile(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t reps[MAX_RANK], shape[MAX_RANK];
    int k = attr_ints(n, "repeats", reps, MAX_RANK);
    if (k != x->rank)
        error_at(k < 0 ? n->loc : attr_loc(n, "repeats"), "node '%s': tile needs %d "
                 "repeats, one per axis", n->name, x->rank);
    for (int i = 0; i < k; i++) {
        if (reps[i] < 0)
            error_at(attr_loc(n, "repeats"), "node '%s': a negative repeat", n->name);
        shape[i] = sat_mul(x->shape[i], reps[i]);
    }
    set_output(n, x->dtype, x->rank, shape);
}

static int64_t block_of(Node *n, Tensor *x) {
    if (x->rank != 4)
        error_at(n->loc, "node '%s': %s needs an [N, C, H, W] input, got %s", n->name,
                 op_info[n->op].name, shape_str(x->rank, x->shape));
    int64_t b = attr_int(n, "block", 0);
    if (b < 1)
        error_at(node_attr(n, "block") ? attr_loc(n, "block") : n->loc,
                 "node '%s': block must be a positive integer", n->name);
    return b;
}

bool depth_to_space_crd(Node *n) {
    Attr *a = node_attr(n, "mode");
    if (!a)
        return false;
    if (!a->is_list && strcmp(a->scalar, "CRD") == 0)
        return true;
    if (!a->is_list && strcmp(a->scalar, "DCR") == 0)
        return false;
    error_at(a->loc, "node '%s': mode must be DCR or CRD", n->name);
}

static void shape_depth_to_space(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t b = block_of(n, x);
    depth_to_space_crd(n);
    if (x->shape[1] % (b * b))
        error_at(n->loc, "node '%s': %lld channels do not divide by block^2 = %lld",
                 n->name, (long long)x->shape[1], (long long)(b * b));
    int64_t shape[4] = {x->shape[0], x->shape[1] / (b * b), x->shape[2] * b,
                        x->shape[3] * b};
    set_output(n, x->dtype, 4, shape);
}

static void shape_space_to_depth(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t b = block_of(n, x);
    if (x->shape[2] % b || x->shape[3] % b)
        error_at(n->loc, "node '%s': height and width %lld x %lld do not divide by "
                 "block %lld", n->name, (long long)x->shape[2], (long long)x->shape[3],
                 (long long)b);
    int64_t shape[4] = {x->shape[0], x->shape[1] * b * b, x->shape[2] / b,
                        x->shape[3] / b};
    set_output(n, x->dtype, 4, shape);
}

static bool is_index(kiln_dtype d) { return d == KILN_DTYPE_I32 || d == KILN_DTYPE_I64; }

/* gather(data, indices, axis): data.shape[:axis] + indices.shape +
 * data.shape[axis+1:]. embedding(ids, table) is gather(table, ids, 0). */
static void shape_gather(Node *n) {
    bool emb = n->op == OP_EMBEDDING;
    Tensor *x = n->inputs[emb ? 1 : 0], *idx = n->inputs[emb ? 0 : 1];
    require(n, emb ? 0 : 1, is_index(idx->dtype), "i32 or i64 index");
    if (x->rank < 1)
        error_at(n->loc, "node '%s': %s of a scalar", n->name, op_info[n->op].name);
    if (emb && x->rank != 2)
        error_at(n->input_locs[1], "node '%s': the embedding table '%s' must be 2-D, not %s",
                 n->name, x->name, shape_str(x->rank, x->shape));
    int axis = emb ? 0 : norm_axis(n, "axis", attr_int(n, "axis", 0), x->rank);
    int rank = x->rank - 1 + idx->rank;
    if (rank > MAX_RANK)
        error_at(n->loc, "node '%s': the result would have rank %d", n->name, rank);
    int64_t shape[MAX_RANK];
    int r = 0;
    for (int i = 0; i < axis; i++)
        shape[r++] = x->shape[i];
    for (int i = 0; i < idx->rank; i++)
        shape[r++] = idx->shape[i];
    for (int i = axis + 1; i < x->rank; i++)
        shape[r++] = x->shape[i];
    set_output(n, x->dtype, rank, shape);
}

/* gather_elements and scatter_elements: off the 'axis' attribute, indices
 * may not be longer than the data on any axis. */
static void check_index_extent(Node *n, const Tensor *x, const Tensor *idx) {
    int axis = norm_axis(n, "axis", attr_int(n, "axis", 0), x->rank);
    for (int d = 0; d < x->rank; d++)
        if (d != axis && idx->shape[d] > x->shape[d])
            error_at(n->input_locs[1], "node '%s': indices %s exceed the data %s on axis %d",
                     n->name, shape_str(idx->rank, idx->shape), shape_str(x->rank, x->shape),
                     d);
}

/* gather_elements(data, indices, axis): indices has data's rank; y has its
 * shape. */
static void shape_gather_elements(Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1];
    require(n, 1, is_index(idx->dtype), "i32 or i64 index");
    if (idx->rank != x->rank || x->rank < 1)
        error_at(n->input_locs[1], "node '%s': indices '%s' %s must have the rank of the "
                 "data %s", n->name, idx->name, shape_str(idx->rank, idx->shape),
                 shape_str(x->rank, x->shape));
    check_index_extent(n, x, idx);
    set_output(n, x->dtype, idx->rank, idx->shape);
}

/* scatter_elements(data, indices, updates): f32 data; indices and updates of
 * one shape and data's rank; reduction none, add, mul, max, min. */
int scatter_reduction(Node *n) {
    if (n->op == OP_SCATTER_ADD)
        return 1;
    Attr *a = node_attr(n, "reduction");
    if (!a)
        return 0;
    static const char *const names[] = {"none", "add", "mul", "max", "min"};
    for (int i = 0; i < 5; i++)
        if (!a->is_list && strcmp(a->scalar, names[i]) == 0)
            return i;
    error_at(a->loc, "node '%s': reduction must be none, add, mul, max or min", n->name);
}

static void shape_scatter(Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1], *u = n->inputs[2];
    require(n, 0, x->dtype == KILN_DTYPE_F32, "f32");
    require(n, 1, is_index(idx->dtype), "i32 or i64 index");
    require(n, 2, u->dtype == KILN_DTYPE_F32, "f32");
    scatter_reduction(n);
    if (x->rank < 1 || idx->rank != x->rank || u->rank != idx->rank ||
        memcmp(u->shape, idx->shape, sizeof(int64_t) * (size_t)idx->rank))
        error_at(n->loc, "node '%s': indices %s and updates %s must have one shape, of "
                 "the data's rank (%s)", n->name, shape_str(idx->rank, idx->shape),
                 shape_str(u->rank, u->shape), shape_str(x->rank, x->shape));
    check_index_extent(n, x, idx);
    set_output(n, x->dtype, x->rank, x->shape);
}

/* one_hot(indices): f32 with a new axis of size depth. */
static void shape_one_hot(Node *n) {
    Tensor *idx = n->inputs[0];
    require(n, 0, is_index(idx->dtype), "i32 or i64 index");
    int64_t depth = attr_int(n, "depth", 0);
    if (depth < 1)
        error_at(node_attr(n, "depth") ? attr_loc(n, "depth") : n->loc,
                 "node '%s': one_hot needs a positive depth", n->name);
    int rank = idx->rank + 1;
    if (rank > MAX_RANK)
        error_at(n->loc, "node '%s': the result would have rank %d", n->name, rank);
    int axis = norm_axis(n, "axis", attr_int(n, "axis", -1), rank);
    int64_t shape[MAX_RANK];
    for (int i = 0, j = 0; i < rank; i++)
        shape[i] = i == axis ? depth : idx->shape[j++];
    set_output(n, KILN_DTYPE_F32, rank, shape);
}

static void shape_trilu(Node *n) {
    Tensor *x = n->inputs[0];
    if (x->rank < 2)
        error_at(n->loc, "node '%s': trilu needs a matrix or a batch of them, got %s",
                 n->name, shape_str(x->rank, x->shape));
    set_output(n, x->dtype, x->rank, x->shape);
}

/* pad: pads [b0, b1, ..., e0, e1, ...] (negative crops); mode constant,
 * reflect or edge. */
int pad_mode(Node *n) {
    Attr *a = node_attr(n, "mode");
    if (!a)
        return 0;
    static const char *const names[] = {"constant", "reflect", "edge"};
    for (int i = 0; i < 3; i++)
        if (!a->is_list && strcmp(a->scalar, names[i]) == 0)
            return i;
    error_at(a->loc, "node '%s': mode must be constant, reflect or edge", n->name);
}

static void shape_pad(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t pads[2 * MAX_RANK], shape[MAX_RANK];
    int k = attr_ints(n, "pads", pads, 2 * MAX_RANK);
    if (k != 2 * x->rank)
        error_at(k < 0 ? n->loc : attr_loc(n, "pads"), "node '%s': pads needs %d values "
                 "(the beginnings, then the ends, of each axis)", n->name, 2 * x->rank);
    int mode = pad_mode(n);
    for (int i = 0; i < x->rank; i++) {
        shape[i] = x->shape[i] + pads[i] + pads[i + x->rank];
        if (shape[i] < 0)
            error_at(attr_loc(n, "pads"), "node '%s': axis %d would have size %lld", n->name,
                     i, (long long)shape[i]);
        if (mode != 0 && x->shape[i] == 0 && shape[i] > 0)
            error_at(attr_loc(n, "pads"), "node '%s': %s padding of an empty axis", n->name,
                     mode == 1 ? "reflect" : "edge");
    }
    set_output(n, x->dtype, x->rank, shape);
}

/* attention(q, k, v, [mask]). layout bhsd: q [B, H, Sq, D], k [B, KVH, Sk, D],
 * v [B, KVH, Sk, DV]. layout bshd: q [B, Sq, H*D], k [B, Sk, KVH*D],
 * v [B, Sk, KVH*DV] with heads (and kv_heads) given. H divides by KVH. The
 * mask is additive f32, broadcast to [B, H, Sq, Sk]. */
void attention_dims(Node *n, AttentionDims *a) {
    Tensor *q = n->inputs[0], *k = n->inputs[1], *v = n->inputs[2];
    Attr *lay = node_attr(n, "layout");
    const char *layout = lay && !lay->is_list ? lay->scalar : "bhsd";
    a->bshd = strcmp(layout, "bshd") == 0;
    if (!a->bshd && strcmp(layout, "bhsd") != 0)
        error_at(lay->loc, "node '%s': layout must be bhsd or bshd", n->name);
    int want = a->bshd ? 3 : 4;
    for (int i = 0; i < 3; i++)
        if (n->inputs[i]->rank != want)
            error_at(n->input_locs[i], "node '%s': with layout %s, '%s' must have rank %d, "
                     "not %s", n->name, layout, n->inputs[i]->name, want,
                     shape_str(n->inputs[i]->rank, n->inputs[i]->shape));
    a->B = q->shape[0];
    if (a->bshd) {
        a->H = attr_int(n, "heads", 0);
        if (a->H < 1 || q->shape[2] % a->H)
            error_at(node_attr(n, "heads") ? attr_loc(n, "heads") : n->loc,
                     "node '%s': layout bshd needs heads, a positive divisor of %lld",
                     n->name, (long long)q->shape[2]);
        a->KVH = attr_int(n, "kv_heads", a->H);
        if (a->KVH < 1 || k->shape[2] % a->KVH || v->shape[2] % a->KVH)
            error_at(node_attr(n, "kv_heads") ? attr_loc(n, "kv_heads") : n->loc,
                     "node '%s': kv_heads must divide the key and value widths", n->name);
        a->Sq = q->shape[1];
        a->Sk = k->shape[1];
        a->D = q->shape[2] / a->H;
        a->DV = v->shape[2] / a->KVH;
        if (k->shape[2] / a->KVH != a->D || v->shape[1] != a->Sk || k->shape[0] != a->B ||
            v->shape[0] != a->B)
            error_at(n->loc, "node '%s': q %s, k %s and v %s do not agree", n->name,
                     shape_str(3, q->shape), shape_str(3, k->shape), shape_str(3, v->shape));
    } else {
        a->H = q->shape[1];
        a->KVH = k->shape[1];
        a->Sq = q->shape[2];
        a->Sk = k->shape[2];
        a->D = q->shape[3];
        a->DV = v->shape[3];
        if (k->shape[0] != a->B || v->shape[0] != a->B || v->shape[1] != a->KVH ||
            v->shape[2] != a->Sk || k->shape[3] != a->D)
            error_at(n->loc, "node '%s': q %s, k %s and v %s do not agree", n->name,
                     shape_str(4, q->shape), shape_str(4, k->shape), shape_str(4, v->shape));
    }
    if (a->KVH < 1 || a->H % a->KVH)
        error_at(n->loc, "node '%s': %lld query heads do not divide into %lld key/value "
                 "heads", n->name, (long long)a->H, (long long)a->KVH);
    if (a->D > 1024)
        error_at(n->loc, "node '%s': head size %lld exceeds 1024", n->name, (long long)a->D);
}

/* The shape of attention's output: q's, with the value width per head. */
static void attention_output_shape(const Tensor *q, const AttentionDims *a, int64_t *shape) {
    memcpy(shape, q->shape, sizeof(int64_t) * (size_t)q->rank);
    shape[q->rank - 1] = a->bshd ? a->H * a->DV : a->DV;
}

static void shape_attention(Node *n) {
    require_f32(n);
    AttentionDims a;
    attention_dims(n, &a);
    Tensor *q = n->inputs[0];
    if (n->ninputs > 3) {
        Tensor *m = n->inputs[3];
        int64_t full[4] = {a.B, a.H, a.Sq, a.Sk}, out[MAX_RANK];
        int r;
        if (m->rank > 4 || !broadcast_shapes(m->rank, m->shape, 4, full, &r, out) ||
            memcmp(out, full, sizeof full))
            error_at(n->input_locs[3], "node '%s': mask '%s' %s does not broadcast to "
                     "[B, H, Sq, Sk] = %s", n->name, m->name, shape_str(m->rank, m->shape),
                     shape_str(4, full));
    }
    if (attr_float(n, "softcap", 0) < 0)
        error_at(attr_loc(n, "softcap"), "node '%s': softcap must not be negative", n->name);
    if (attr_int(n, "window", 0) < 0)
        error_at(attr_loc(n, "window"), "node '%s': window must not be negative", n->name);
    int64_t shape[4];
    attention_output_shape(q, &a, shape);
    set_output(n, q->dtype, q->rank, shape);
}

/* rope(x, cos, sin): x [..., S, ..., D] with positions along seq_axis;
 * cos and sin [S, R/2], R = n_rot (default D, even, <= D). */
static void shape_rope(Node *n) {
    Tensor *x = n->inputs[0], *c = n->inputs[1], *s = n->inputs[2];
    require_f32(n);
    if (x->rank < 2)
        error_at(n->loc, "node '%s': rope needs [..., S, ..., D], got %s", n->name,
                 shape_str(x->rank, x->shape));
    int axis = norm_axis(n, "seq_axis", attr_int(n, "seq_axis", -2), x->rank);
    int64_t D = x->shape[x->rank - 1];
    if (axis == x->rank - 1)
        error_at(attr_loc(n, "seq_axis"), "node '%s': seq_axis is the head dimension",
                 n->name);
    int64_t R = attr_int(n, "n_rot", D);
    if (R < 2 || R > D || R % 2)
        error_at(node_attr(n, "n_rot") ? attr_loc(n, "n_rot") : n->loc,
                 "node '%s': n_rot must be even, from 2 to the head size %lld", n->name,
                 (long long)D);
    for (int i = 1; i < 3; i++) {
        Tensor *t = i == 1 ? c : s;
        if (t->rank != 2 || t->shape[0] != x->shape[axis] || t->shape[1] != R / 2)
            error_at(n->input_locs[i], "node '%s': '%s' is %s; it must be [%lld, %lld] "
                     "(positions, n_rot / 2)", n->name, t->name, shape_str(t->rank, t->shape),
                     (long long)x->shape[axis], (long long)(R / 2));
    }
    set_output(n, x->dtype, x->rank, x->shape);
}

/* Reads an attribute of `n` spatial values (default dflt each). */
static void spatial_attr(Node *n, const char *key, int nsp, int64_t dflt, int64_t *out) {
    int k = attr_ints(n, key, out, 2 * MAX_RANK);
    if (k < 0)
        for (k = 0; k < nsp; k++)
            out[k] = dflt;
    if (k != nsp)
        error_at(attr_loc(n, key), "node '%s': %s needs %d values, one per spatial axis",
                 n->name, key, nsp);
}

/* Window geometry shared by convolutions and pools: the output size of each
 * spatial axis and the padding at both ends, ONNX rules (auto_pad notset,
 * same_upper, same_lower, valid; ceil_mode for pools). */
void window_geometry(Node *n, const int64_t *in, const int64_t *k, int nsp, Window *w) {
    bool transposed = n->op == OP_CONV_TRANSPOSE;
    w->nsp = nsp;
    spatial_attr(n, "strides", nsp, 1, w->stride);
    if (op_attr_default(n->op, "dilations"))
        spatial_attr(n, "dilations", nsp, 1, w->dil);
    else
        for (int i = 0; i < nsp; i++)
            w->dil[i] = 1;
    int64_t pads[2 * MAX_RANK];
    int np = attr_ints(n, "pads", pads, 2 * MAX_RANK);
    if (np < 0)
        for (np = 0; np < 2 * nsp; np++)
            pads[np] = 0;
    if (np != 2 * nsp)
        error_at(attr_loc(n, "pads"), "node '%s': pads needs %d values (the beginnings, then "
                 "the ends)", n->name, 2 * nsp);
    Attr *ap = node_attr(n, "auto_pad");
    int mode = 0; /* notset */
    if (ap) {
        static const char *const names[][2] = {{"notset", "NOTSET"}, {"same_upper", "SAME_UPPER"},
                                               {"same_lower", "SAME_LOWER"}, {"valid", "VALID"}};
        mode = -1;
        for (int i = 0; i < 4; i++)
            if (!ap->is_list && (strcmp(ap->scalar, names[i][0]) == 0 ||
                                 strcmp(ap->scalar, names[i][1]) == 0))
                mode = i;
        if (mode < 0)
            error_at(ap->loc, "node '%s': auto_pad must be notset, same_upper, same_lower "
                     "or valid", n->name);
    }
    int64_t outpad[MAX_RANK] = {0};
    if (transposed)
        spatial_attr(n, "output_padding", nsp, 0, outpad);
    bool ceil_mode = op_attr_default(n->op, "ceil_mode") && attr_int(n, "ceil_mode", 0);
    for (int i = 0; i < nsp; i++) {
        if (w->stride[i] < 1 || w->dil[i] < 1)
            error_at(n->loc, "node '%s': strides and dilations must be positive", n->name);
        if (pads[i] < 0 || pads[i + nsp] < 0)
            error_at(attr_loc(n, "pads"), "node '%s': negative pads", n->name);
        int64_t span = (k[i] - 1) * w->dil[i] + 1;
        w->pad_begin[i] = pads[i];
        w->pad_end[i] = pads[i + nsp];
        if (mode == 3) {
            w->pad_begin[i] = w->pad_end[i] = 0;
        } else if (mode == 1 || mode == 2) {
            int64_t out = transposed ? in[i] * w->stride[i]
                                     : (in[i] + w->stride[i] - 1) / w->stride[i];
            int64_t total = transposed ? (in[i] - 1) * w->stride[i] + outpad[i] + span - out
                                       : (out - 1) * w->stride[i] + span - in[i];
            if (total < 0)
                total = 0;
            int64_t small = total / 2;
            w->pad_begin[i] = mode == 1 ? small : total - small;
            w->pad_end[i] = total - w->pad_begin[i];
        }
        if (transposed) {
            w->out[i] = w->stride[i] * (in[i] - 1) + outpad[i] + span - w->pad_begin[i] -
                        w->pad_end[i];
        } else {
            int64_t room = in[i] + w->pad_begin[i] + w->pad_end[i] - span;
            if (room < 0)
                error_at(n->loc, "node '%s': the window (%lld) is larger than the padded "
                         "input (%lld) on spatial axis %d", n->name, (long long)span,
                         (long long)(in[i] + w->pad_begin[i] + w->pad_end[i]), i);
            w->out[i] = (ceil_mode ? (room + w->stride[i] - 1) / w->stride[i]
                                   : room / w->stride[i]) + 1;
            /* The last window must start inside the input or its left padding. */
            if (ceil_mode && (w->out[i] - 1) * w->stride[i] >= in[i] + w->pad_begin[i])
                w->out[i]--;
        }
        if (w->out[i] < 1)
            error_at(n->loc, "node '%s': spatial axis %d would have size %lld", n->name, i,
                     (long long)w->out[i]);
    }
}

/* [N, channels, *window outputs] for a window op over input 0. */
static void set_window_output(Node *n, int64_t channels, const Window *win) {
    Tensor *x = n->inputs[0];
    int64_t shape[MAX_RANK] = {x->shape[0], channels};
    for (int i = 0; i < win->nsp; i++)
        shape[2 + i] = win->out[i];
    set_output(n, x->dtype, x->rank, shape);
}

/* conv(x, w, [bias]): x [N, C, *spatial] (1 to 3 spatial axes), w [OC, C/group,
 * *kernel]; conv_transpose: w [C, OC/group, *kernel]. */
static void shape_conv(Node *n) {
    Tensor *x = n->inputs[0], *w = n->inputs[1];
    bool tr = n->op == OP_CONV_TRANSPOSE;
    require_f32(n);
    int nsp = x->rank - 2;
    if (nsp < 1 || nsp > 3)
        error_at(n->loc, "node '%s': %s needs [N, C, D1 (, D2 (, D3))], got %s", n->name,
                 op_info[n->op].name, shape_str(x->rank, x->shape));
    if (w->rank != x->rank)
        error_at(n->input_locs[1], "node '%s': weights %s must have the input's rank %d",
                 n->name, shape_str(w->rank, w->shape), x->rank);
    int64_t g = attr_int(n, "group", 1);
    if (g < 1 || x->shape[1] % g || (!tr && w->shape[0] % g))
        error_at(node_attr(n, "group") ? attr_loc(n, "group") : n->loc,
                 "node '%s': group %lld must divide the channels", n->name, (long long)g);
    int64_t oc = tr ? w->shape[1] * g : w->shape[0];
    if ((tr ? w->shape[0] : w->shape[1] * g) != x->shape[1])
        error_at(n->input_locs[1], "node '%s': weights %s do not match %lld input channels "
                 "in %lld groups", n->name, shape_str(w->rank, w->shape),
                 (long long)x->shape[1], (long long)g);
    if (n->ninputs > 2) {
        Tensor *b = n->inputs[2];
        if (b->rank != 1 || b->shape[0] != oc)
            error_at(n->input_locs[2], "node '%s': bias %s must be [%lld]", n->name,
                     shape_str(b->rank, b->shape), (long long)oc);
    }
    Attr *act = node_attr(n, "activation");
    if (act && !(strcmp(act->scalar ? act->scalar : "", "none") == 0 ||
                 strcmp(act->scalar ? act->scalar : "", "relu") == 0 ||
                 strcmp(act->scalar ? act->scalar : "", "silu") == 0))
        error_at(act->loc, "node '%s': conv activation must be none, relu or silu", n->name);
    Window win;
    window_geometry(n, x->shape + 2, w->shape + 2, nsp, &win);
    set_window_output(n, oc, &win);
}

static void shape_pool(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    int nsp = x->rank - 2;
    if (nsp < 1 || nsp > 3)
        error_at(n->loc, "node '%s': %s needs [N, C, D1 (, D2 (, D3))], got %s", n->name,
                 op_info[n->op].name, shape_str(x->rank, x->shape));
    int64_t k[MAX_RANK];
    if (attr_ints(n, "kernel", k, MAX_RANK) != nsp)
        error_at(node_attr(n, "kernel") ? attr_loc(n, "kernel") : n->loc,
                 "node '%s': kernel needs %d sizes", n->name, nsp);
    for (int i = 0; i < nsp; i++)
        if (k[i] < 1)
            error_at(attr_loc(n, "kernel"), "node '%s': kernel sizes must be positive",
                     n->name);
    Window win;
    window_geometry(n, x->shape + 2, k, nsp, &win);
    for (int i = 0; i < nsp; i++)
        if (win.pad_begin[i] >= k[i] || win.pad_end[i] >= k[i])
            error_at(n->loc, "node '%s': padding must be smaller than the kernel", n->name);
    set_window_output(n, x->shape[1], &win);
}

static void shape_global_pool(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    if (x->rank < 3)
        error_at(n->loc, "node '%s': %s needs [N, C, D1, ...], got %s", n->name,
                 op_info[n->op].name, shape_str(x->rank, x->shape));
    int64_t shape[MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        shape[i] = i < 2 ? x->shape[i] : 1;
    set_output(n, x->dtype, x->rank, shape);
}

/* resize: scales (floats) or sizes (ints), one per axis. */
void resize_geometry(Node *n, double *scales, int64_t *out) {
    Tensor *x = n->inputs[0];
    Attr *sc = node_attr(n, "scales"), *sz = node_attr(n, "sizes");
    if (!!sc == !!sz)
        error_at(n->loc, "node '%s': resize needs scales or sizes (one of them)", n->name);
    if (sz) {
        if (attr_ints(n, "sizes", out, MAX_RANK) != x->rank)
            error_at(sz->loc, "node '%s': sizes needs %d values", n->name, x->rank);
        for (int i = 0; i < x->rank; i++) {
            if (out[i] < 1 || x->shape[i] < 1)
                error_at(sz->loc, "node '%s': sizes must be positive", n->name);
            scales[i] = (double)out[i] / (double)x->shape[i];
        }
    } else {
        if (!sc->is_list || sc->nitems != x->rank)
            error_at(sc->loc, "node '%s': scales needs %d values", n->name, x->rank);
        for (int i = 0; i < x->rank; i++) {
            char *end;
            scales[i] = strtod(sc->items[i], &end);
            if (*end || !(scales[i] > 0) || !isfinite(scales[i]))
                error_at(sc->item_locs[i], "node '%s': scales must be positive numbers",
                         n->name);
            out[i] = (int64_t)floor((double)x->shape[i] * scales[i]);
            if (out[i] < 1)
                error_at(sc->item_locs[i], "node '%s': axis %d would have size %lld",
                         n->name, i, (long long)out[i]);
        }
    }
}

int attr_choice(Node *n, const char *key, const char *const *names, int count) {
    Attr *a = node_attr(n, key);
    const char *v = a && !a->is_list ? a->scalar : op_attr_default(n->op, key);
    for (int i = 0; i < count; i++)
        if (strcmp(v, names[i]) == 0)
            return i;
    Str list = {0};
    for (int i = 0; i < count; i++)
        str_addf(&list, "%s%s", i ? ", " : "", names[i]);
    error_at(a ? a->loc : n->loc, "node '%s': %s must be one of %s", n->name, key, list.buf);
}

const char *const resize_modes[] = {"nearest", "linear"};
const char *const resize_coords[] = {"half_pixel", "asymmetric", "align_corners",
                                     "pytorch_half_pixel"};
const char *const resize_nearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                      "ceil"};

static void shape_resize(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    if (x->rank < 1)
        error_at(n->loc, "node '%s': resize of a scalar", n->name);
    double scales[MAX_RANK];
    int64_t out[MAX_RANK];
    resize_geometry(n, scales, out);
    attr_choice(n, "mode", resize_modes, 2);
    attr_choice(n, "coordinate_transformation_mode", resize_coords, 4);
    attr_choice(n, "nearest_mode", resize_nearest, 4);
    set_output(n, x->dtype, x->rank, out);
}

/* topk(x) -> values, indices (i64): k along axis. */
static void shape_topk(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    if (n->noutputs != 2)
        error_at(n->loc, "node '%s': topk has two outputs (values, indices); list them "
                 "with outputs: [v, i]", n->name);
    if (x->rank < 1)
        error_at(n->loc, "node '%s': topk of a scalar", n->name);
    int axis = norm_axis(n, "axis", attr_int(n, "axis", -1), x->rank);
    int64_t k = attr_int(n, "k", -1);
    if (k < 0 || k > x->shape[axis])
        error_at(node_attr(n, "k") ? attr_loc(n, "k") : n->loc, "node '%s': k must be "
                 "from 0 to the axis size %lld", n->name, (long long)x->shape[axis]);
    for (int i = 0; i < 2; i++) {
        Tensor *t = n->outputs[i];
        t->dtype = i ? KILN_DTYPE_I64 : x->dtype;
        t->rank = x->rank;
        memcpy(t->shape, x->shape, sizeof t->shape);
        t->shape[axis] = k;
    }
}

/* sample(logits [..., V], seed) -> i64 [...]. */
static void shape_sample(Node *n) {
    Tensor *x = n->inputs[0], *seed = n->inputs[1];
    require(n, 0, x->dtype == KILN_DTYPE_F32, "f32");
    require(n, 1, is_index(seed->dtype), "an i32 or i64 seed:");
    if (tensor_count(seed) != 1)
        error_at(n->input_locs[1], "node '%s': the seed '%s' must hold one element, not %s",
                 n->name, seed->name, shape_str(seed->rank, seed->shape));
    if (x->rank < 1 || x->shape[x->rank - 1] < 1)
        error_at(n->loc, "node '%s': sample needs logits [..., V] with V > 0", n->name);
    if (attr_int(n, "top_k", 0) < 0)
        error_at(attr_loc(n, "top_k"), "node '%s': top_k must not be negative", n->name);
    double p = attr_float(n, "top_p", 1), t = attr_float(n, "temperature", 1);
    if (!(p > 0 && p <= 1))
        error_at(attr_loc(n, "top_p"), "node '%s': top_p must be in (0, 1]", n->name);
    if (t < 0)
        error_at(attr_loc(n, "temperature"), "node '%s': temperature must not be negative",
                 n->name);
    set_output(n, KILN_DTYPE_I64, x->rank - 1, x->shape);
}

/* selective_scan(u, delta, A, B, C, [D, [z]]): u, delta, z [batch, L, dim];
 * A [dim, N]; B, C [batch, L, N]; D [dim]; N at most 256. */
static void shape_selective_scan(Node *n) {
    require_f32(n);
    Tensor *u = n->inputs[0];
    if (u->rank != 3)
        error_at(n->input_locs[0], "node '%s': u must be [batch, L, dim], not %s", n->name,
                 shape_str(u->rank, u->shape));
    int64_t bt = u->shape[0], L = u->shape[1], dim = u->shape[2];
    int64_t N = n->inputs[2]->rank == 2 ? n->inputs[2]->shape[1] : -1;
    int64_t want[7][3] = {{bt, L, dim}, {bt, L, dim}, {dim, N, 0}, {bt, L, N},
                          {bt, L, N},   {dim, 0, 0},  {bt, L, dim}};
    int ranks[7] = {3, 3, 2, 3, 3, 1, 3};
    static const char *const names[7] = {"u", "delta", "A", "B", "C", "D", "z"};
    for (int i = 0; i < n->ninputs; i++) {
        Tensor *t = n->inputs[i];
        if (t->rank != ranks[i] || memcmp(t->shape, want[i], sizeof(int64_t) * (size_t)ranks[i]))
            error_at(n->input_locs[i], "node '%s': %s '%s' is %s; it must be %s", n->name,
                     names[i], t->name, shape_str(t->rank, t->shape),
                     shape_str(ranks[i], want[i]));
    }
    if (N < 1 || N > 256)
        error_at(n->input_locs[2], "node '%s': the state size %lld must be from 1 to 256",
                 n->name, (long long)N);
    set_output(n, u->dtype, 3, u->shape);
}

/* ---- backward ops ---- */

static int64_t positive_attr(Node *n, const char *key, int64_t dflt, int64_t most);

static void same_shape(Node *n, int i, const Tensor *like, const char *what) {
    Tensor *t = n->inputs[i];
    if (t->rank != like->rank ||
        memcmp(t->shape, like->shape, sizeof(int64_t) * (size_t)like->rank) != 0)
        error_at(n->input_locs[i], "node '%s': %s '%s' is %s; it must be %s like '%s'",
                 n->name, what, t->name, shape_str(t->rank, t->shape),
                 shape_str(like->rank, like->shape), like->name);
}

static void set_output_i(Node *n, int i, const Tensor *like, int rank, const int64_t *shape) {
    Tensor *t = n->outputs[i];
    t->dtype = like->dtype;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
}

/* layer_norm_grad(dy, x, [gamma]) -> dx, [dgamma, [dbeta]]; rms_norm_grad
 * has no dbeta. */
static void shape_norm_grad(Node *n) {
    Tensor *x = n->inputs[1];
    require_f32(n);
    bool rms = n->op == OP_RMS_NORM_GRAD;
    int most = rms ? 2 : 3;
    if (n->noutputs > most)
        error_at(n->loc, "node '%s': %s has at most %d outputs (dx, dgamma%s)", n->name,
                 op_info[n->op].name, most, rms ? "" : ", dbeta");
    if (x->rank < 1)
        error_at(n->input_locs[1], "node '%s': x must have rank 1 or more", n->name);
    same_shape(n, 0, x, "the gradient");
    int axis = norm_axis(n, "axis", attr_int(n, "axis", -1), x->rank);
    positive_float(n, "eps", 1e-5);
    int prank = x->rank - axis;
    const int64_t *pshape = x->shape + axis;
    if (n->ninputs > 2) {
        Tensor *g = n->inputs[2];
        if (tensor_count(g) != shape_count(prank, pshape))
            error_at(n->input_locs[2], "node '%s': gamma '%s' is %s; it must have the shape "
                     "%s of the normalized axes", n->name, g->name,
                     shape_str(g->rank, g->shape), shape_str(prank, pshape));
        prank = g->rank;
        pshape = g->shape;
    }
    set_output_i(n, 0, x, x->rank, x->shape);
    for (int i = 1; i < n->noutputs; i++)
        set_output_i(n, i, x, prank, pshape);
}

/* gather_grad(dy, indices): the gradient of gather(data, indices, axis)
 * for data with `size` along axis: dy's axes [axis, axis + indices.rank)
 * are indices' shape and become one of length size. */
static void shape_gather_grad(Node *n) {
    Tensor *dy = n->inputs[0], *idx = n->inputs[1];
    require(n, 0, dy->dtype == KILN_DTYPE_F32, "f32");
    require(n, 1, is_index(idx->dtype), "i32 or i64 index");
    int rank = dy->rank - idx->rank + 1;
    if (rank < 1)
        error_at(n->input_locs[1], "node '%s': indices '%s' %s have more axes than the "
                 "gradient '%s' %s", n->name, idx->name, shape_str(idx->rank, idx->shape),
                 dy->name, shape_str(dy->rank, dy->shape));
    int axis = norm_axis(n, "axis", attr_int(n, "axis", 0), rank);
    if (memcmp(dy->shape + axis, idx->shape, sizeof(int64_t) * (size_t)idx->rank) != 0)
        error_at(n->input_locs[1], "node '%s': the gradient '%s' %s does not hold the "
                 "indices' shape %s at axis %d", n->name, dy->name,
                 shape_str(dy->rank, dy->shape), shape_str(idx->rank, idx->shape), axis);
    int64_t size = positive_attr(n, "size", 0, INT32_MAX);
    int64_t shape[MAX_RANK];
    int r = 0;
    for (int i = 0; i < axis; i++)
        shape[r++] = dy->shape[i];
    shape[r++] = size;
    for (int i = axis + idx->rank; i < dy->rank; i++)
        shape[r++] = dy->shape[i];
    set_output(n, KILN_DTYPE_F32, r, shape);
}

/* attention_grad(q, k, v, dy) -> dq, dk, dv. */
static void shape_attention_grad(Node *n) {
    require_f32(n);
    AttentionDims a;
    attention_dims(n, &a);
    if (n->noutputs != 3)
        error_at(n->loc, "node '%s': attention_grad has three outputs; list them with "
                 "outputs: [dq, dk, dv]", n->name);
    Tensor *q = n->inputs[0], *dy = n->inputs[3];
    int64_t want[4];
    attention_output_shape(q, &a, want);
    if (dy->rank != q->rank || memcmp(dy->shape, want, sizeof(int64_t) * (size_t)q->rank))
        error_at(n->input_locs[3], "node '%s': the gradient '%s' is %s; it must be %s, the "
                 "attention's output", n->name, dy->name, shape_str(dy->rank, dy->shape),
                 shape_str(q->rank, want));
    for (int i = 0; i < 3; i++)
        set_output_i(n, i, n->inputs[i], n->inputs[i]->rank, n->inputs[i]->shape);
}

/* ---- signal ops ---- */

static int64_t positive_attr(Node *n, const char *key, int64_t dflt, int64_t most) {
    int64_t v = attr_int(n, key, dflt);
    if (v < 1 || v > most)
        error_at(node_attr(n, key) ? attr_loc(n, key) : n->loc, "node '%s': %s must be from 1 "
                 "to %lld%s", n->name, key, (long long)most,
                 node_attr(n, key) || dflt >= 1 ? "" : " (it has no default)");
    return v;
}

static void flag_attr(Node *n, const char *key) {
    int64_t v = attr_int(n, key, 0);
    if (v != 0 && v != 1)
        error_at(attr_loc(n, key), "node '%s': %s must be 0 or 1", n->name, key);
}

/* Transforms longer than this are refused: past 2048 points the sum is
 * direct, O(L^2), and an invocation of it loops L times (lavapipe stops at
 * 65535 iterations). */
#define SPECTRAL_MAX_L (1 << 14)

/* Frames of length L, step apart, over time samples: at least one. */
static int64_t frame_count(Node *n, int64_t time, int64_t L, int64_t step, const char *what) {
    if (L > time)
        error_at(n->loc, "node '%s': the %s (%lld) is longer than the signal (%lld samples)",
                 n->name, what, (long long)L, (long long)time);
    return (time - L) / step + 1;
}

void spectral_params(Node *n, Spectral *sp) {
    Tensor *x = n->inputs[0];
    memset(sp, 0, sizeof *sp);
    sp->window = WINDOW_RECT;
    if (n->op == OP_DFT) {
        if (x->rank < 2 || (x->shape[x->rank - 1] != 1 && x->shape[x->rank - 1] != 2))
            error_at(n->input_locs[0], "node '%s': dft needs [..., N, ..., 1 or 2] (real, or "
                     "real and imaginary last), not %s", n->name, shape_str(x->rank, x->shape));
        int axis = norm_axis(n, "axis", attr_int(n, "axis", -2), x->rank);
        if (axis == x->rank - 1)
            error_at(attr_loc(n, "axis"), "node '%s': axis %d holds the real and imaginary "
                     "parts, not the signal", n->name, axis);
        flag_attr(n, "inverse");
        flag_attr(n, "onesided");
        sp->inverse = attr_int(n, "inverse", 0) != 0;
        if (sp->inverse && attr_int(n, "onesided", 0))
            error_at(attr_loc(n, "onesided"), "node '%s': an inverse transform cannot be "
                     "one-sided", n->name);
        int64_t N = x->shape[axis];
        sp->C = x->shape[x->rank - 1];
        sp->L = node_attr(n, "length") ? positive_attr(n, "length", 0, SPECTRAL_MAX_L) : N;
        if (sp->L < 1)
            error_at(n->input_locs[0], "node '%s': an empty signal axis", n->name);
        sp->nin = N < sp->L ? N : sp->L;
        sp->outer = shape_count(axis, x->shape);
        sp->inner = shape_count(x->rank - 1 - axis - 1, x->shape + axis + 1);
        sp->in_so = N * sp->inner * sp->C;
        sp->in_si = sp->C;
        sp->in_sj = sp->inner * sp->C;
        sp->nout = attr_int(n, "onesided", 0) ? sp->L / 2 + 1 : sp->L;
        return;
    }
    if (n->op == OP_STFT) {
        bool complex_ = x->rank == 3 && x->shape[2] == 2;
        if (!(x->rank == 2 || (x->rank == 3 && (x->shape[2] == 1 || x->shape[2] == 2))))
            error_at(n->input_locs[0], "node '%s': stft needs a signal [batch, time] or "
                     "[batch, time, 1 or 2], not %s", n->name, shape_str(x->rank, x->shape));
        int64_t T = x->shape[1];
        Tensor *w = n->ninputs > 1 ? n->inputs[1] : NULL;
        if (w && w->rank != 1)
            error_at(n->input_locs[1], "node '%s': the window '%s' must be 1-D, not %s",
                     n->name, w->name, shape_str(w->rank, w->shape));
        if (!w && !node_attr(n, "frame_length"))
            error_at(n->loc, "node '%s': stft needs a window input or a frame_length",
                     n->name);
        sp->L = w ? w->shape[0] : positive_attr(n, "frame_length", 0, SPECTRAL_MAX_L);
        if (w && node_attr(n, "frame_length") && attr_int(n, "frame_length", 0) != sp->L)
            error_at(attr_loc(n, "frame_length"), "node '%s': frame_length %lld differs from "
                     "the window's %lld", n->name, (long long)attr_int(n, "frame_length", 0),
                     (long long)sp->L);
        if (sp->L < 1 || sp->L > SPECTRAL_MAX_L)
            error_at(n->input_locs[1], "node '%s': a window of %lld samples", n->name,
                     (long long)sp->L);
        flag_attr(n, "onesided");
        sp->step = positive_attr(n, "frame_step", 0, T);
        sp->C = complex_ ? 2 : 1;
        sp->outer = x->shape[0];
        sp->inner = frame_count(n, T, sp->L, sp->step, "frame");
        sp->nin = sp->L;
        sp->in_so = T * sp->C;
        sp->in_si = sp->step * sp->C;
        sp->in_sj = sp->C;
        sp->nout = attr_int(n, "onesided", 1) ? sp->L / 2 + 1 : sp->L;
        return;
    }
    /* log_mel, welch: real [..., time], framed along the last axis. */
    if (x->rank < 1)
        error_at(n->input_locs[0], "node '%s': %s needs a signal [..., time], not a scalar",
                 n->name, op_info[n->op].name);
    int64_t T = x->shape[x->rank - 1];
    sp->window = attr_choice(n, "window", window_names, WINDOW_COUNT);
    if (n->op == OP_LOG_MEL) {
        sp->L = positive_attr(n, "n_fft", 0, SPECTRAL_MAX_L);
        sp->step = positive_attr(n, "hop", sp->L / 4 > 0 ? sp->L / 4 : 1, T);
    } else {
        sp->L = positive_attr(n, "segment", 256, SPECTRAL_MAX_L);
        int64_t overlap = attr_int(n, "overlap", sp->L / 2);
        if (overlap < 0 || overlap >= sp->L)
            error_at(attr_loc(n, "overlap"), "node '%s': overlap must be from 0 to segment - 1 "
                     "(%lld)", n->name, (long long)(sp->L - 1));
        sp->step = sp->L - overlap;
    }
    sp->C = 1;
    sp->outer = shape_count(x->rank - 1, x->shape);
    sp->inner = frame_count(n, T, sp->L, sp->step, n->op == OP_LOG_MEL ? "n_fft" : "segment");
    sp->nin = sp->L;
    sp->in_so = T;
    sp->in_si = sp->step;
    sp->in_sj = 1;
    sp->nout = sp->L / 2 + 1;
}

/* dft(x [..., N, ..., 1|2]) -> [..., L or L/2+1, ..., 2]. */
static void shape_dft(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    Spectral sp;
    spectral_params(n, &sp);
    int axis = norm_axis(n, "axis", attr_int(n, "axis", -2), x->rank);
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[axis] = sp.nout;
    shape[x->rank - 1] = 2;
    set_output(n, KILN_DTYPE_F32, x->rank, shape);
}

/* stft(signal [B, T(, 1|2)], [window [L]]) -> [B, frames, bins, 2]. */
static void shape_stft(Node *n) {
    require_f32(n);
    Spectral sp;
    spectral_params(n, &sp);
    set_output(n, KILN_DTYPE_F32, 4, (int64_t[]){sp.outer, sp.inner, sp.nout, 2});
}

/* log_mel(x [..., T], [mel [n_fft/2+1, n_mels]]) -> [..., frames, n_mels];
 * welch(x [..., T]) -> [..., segment/2+1]. */
static void shape_log_mel(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    Spectral sp;
    spectral_params(n, &sp);
    double rate = positive_float(n, "sample_rate", 16000);
    int64_t mels;
    if (n->ninputs > 1) {
        Tensor *m = n->inputs[1];
        if (m->rank != 2 || m->shape[0] != sp.nout)
            error_at(n->input_locs[1], "node '%s': the mel matrix '%s' is %s; it must be "
                     "[%lld, n_mels] (n_fft / 2 + 1 bins)", n->name, m->name,
                     shape_str(m->rank, m->shape), (long long)sp.nout);
        mels = m->shape[1];
    } else {
        mels = positive_attr(n, "n_mels", 80, 1 << 16);
        double fmax = attr_float(n, "fmax", 0), fmin = attr_float(n, "fmin", 0);
        if (fmax == 0)
            fmax = rate / 2;
        if (!(fmin >= 0 && fmin < fmax && fmax <= rate / 2))
            error_at(node_attr(n, "fmax") ? attr_loc(n, "fmax") : n->loc, "node '%s': need "
                     "0 <= fmin < fmax <= sample_rate / 2 (%g), got fmin %g, fmax %g",
                     n->name, rate / 2, fmin, fmax);
    }
    positive_float(n, "eps", 1e-10);
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = sp.inner;
    if (x->rank + 1 > MAX_RANK)
        error_at(n->loc, "node '%s': the result would have rank %d", n->name, x->rank + 1);
    shape[x->rank] = mels;
    set_output(n, KILN_DTYPE_F32, x->rank + 1, shape);
}

static void shape_welch(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    Spectral sp;
    spectral_params(n, &sp);
    positive_float(n, "fs", 1);
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = sp.nout;
    set_output(n, KILN_DTYPE_F32, x->rank, shape);
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

void infer_node(Node *n) {
    /* The YAML loader checks arity; ONNX nodes map onto kiln nodes with the
     * inputs they come with, so it is checked again here for every node. */
    const OpInfo *op = &op_info[n->op];
    if (n->ninputs < op->min_inputs || n->ninputs > op->max_inputs)
        error_at(n->loc, "node '%s': %s takes %d to %d inputs, %d given", n->name, op->name,
                 op->min_inputs, op->max_inputs, n->ninputs);
    if (n->noutputs < 1)
        error_at(n->loc, "node '%s': no outputs", n->name);
    shape_rules[n->op](n);
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
        ok = u->shape[i] == s->shape[i] || (s->dynamic && i == s->dyn_axis);
    if (ok && u->dynamic && (!s->dynamic || u->dyn_axis != s->dyn_axis))
        ok = false;
    if (!ok)
        error_at(s->update_loc, "state '%s' is %s %s; its update '%s' is %s %s: they must "
                 "agree but for the state's dynamic axis%s", s->name,
                 kiln_dtype_name(s->dtype), shape_str(s->rank, s->shape), u->name,
                 kiln_dtype_name(u->dtype), shape_str(u->rank, u->shape),
                 u->dynamic ? ", along which the update may also be dynamic" : "");
    if (tensor_bytes(u) > s->storage)
        s->storage = tensor_bytes(u);
}

void infer_shapes(Graph *g) {
    topo_sort(g);
    for (int k = 0; k < 2; k++) {
        Vec *v = k ? &g->states : &g->inputs;
        for (int i = 0; i < v->len; i++) {
            Tensor *t = v->data[i];
            if (t->dynamic)
                check_dynamic_input(t);
        }
    }
    for (int i = 0; i < g->nodes.len; i++) {
        infer_node(g->nodes.data[i]);
        infer_dynamic(g, g->nodes.data[i]);
    }
    for (int i = 0; i < g->states.len; i++)
        check_state(g->states.data[i]);
}
