/*
 * dynamic.c: which axes follow the dynamic dimensions.
 *
 * A model may declare dynamic dimensions (`dims: {seq: 1..2048}`) and use
 * them in its inputs' shapes. Shapes are inferred at the largest values
 * (infer_shapes.c: memory is planned for them); this pass then marks, node
 * by node, the axis of each output whose size follows the dims, as an
 * affine expression of them (DimExpr: `seq`, `past + seq`, `4*seq`).
 *
 * One rule keeps the kernels simple and the layouts unchanged: a dynamic
 * axis is the outermost axis of its tensor that is larger than 1. A smaller
 * extent is then a prefix of the tensor's bytes with every stride as
 * compiled, so kernels only need their total work (element count, rows,
 * matrix rows, query or key positions) at run time. Ops that would move the
 * dynamic axis inward, reduce over it, or mix it with a fixed size stop here
 * with a located error saying so.
 */
#include "kiln.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

bool parse_dim_range(const char *s, int64_t *lo, int64_t *hi) {
    char *end;
    errno = 0;
    long long a = strtoll(s, &end, 10);
    if (end == s || strncmp(end, "..", 2) != 0 || errno)
        return false;
    const char *b_s = end + 2;
    long long b = strtoll(b_s, &end, 10);
    if (end == b_s || *end || errno)
        return false;
    *lo = a;
    *hi = b;
    return true;
}

int declare_dim(Graph *g, const char *name, int64_t lo, int64_t hi, Loc loc) {
    for (int i = 0; i < g->ndims; i++)
        if (strcmp(g->dims[i].name, name) == 0)
            error_at(loc, "dimension '%s' is declared twice", name);
    if (g->ndims == MAX_DIMS)
        error_at(loc, "more than %d dynamic dimensions", MAX_DIMS);
    if (lo < 0 || hi <= lo || hi < 2 || hi > 0x7fffffff)
        error_at(loc, "dimension '%s': the range %lld..%lld must have 0 <= min < max, "
                 "2 <= max < 2^31 (a range of one value is a fixed size)", name,
                 (long long)lo, (long long)hi);
    DimSym *d = &g->dims[g->ndims];
    d->name = xstrdup(name);
    d->lo = lo;
    d->hi = hi;
    d->loc = loc;
    return g->ndims++;
}

int unused_dim(const Graph *g) {
    for (int d = 0; d < g->ndims; d++) {
        bool used = false;
        for (int i = 0; i < g->tensors.len && !used; i++) {
            const Tensor *t = g->tensors.data[i];
            used = t->dynamic && t->extent.c[d];
        }
        if (!used)
            return d;
    }
    return -1;
}

int find_dim(const Graph *g, const char *name) {
    for (int i = 0; i < g->ndims; i++)
        if (strcmp(g->dims[i].name, name) == 0)
            return i;
    return -1;
}

int64_t dim_expr_max(const Graph *g, const DimExpr *e) {
    int64_t v = e->c0;
    for (int i = 0; i < g->ndims; i++)
        v += e->c[i] * g->dims[i].hi;
    return v;
}

int64_t dim_expr_min(const Graph *g, const DimExpr *e) {
    int64_t v = e->c0;
    for (int i = 0; i < g->ndims; i++)
        v += e->c[i] * g->dims[i].lo;
    return v;
}

DimExpr dim_expr_scale(const DimExpr *e, int64_t k) {
    DimExpr r;
    r.c0 = e->c0 * k;
    for (int i = 0; i < MAX_DIMS; i++)
        r.c[i] = e->c[i] * k;
    return r;
}

DimExpr dim_expr_add(const DimExpr *a, const DimExpr *b) {
    DimExpr r;
    r.c0 = a->c0 + b->c0;
    for (int i = 0; i < MAX_DIMS; i++)
        r.c[i] = a->c[i] + b->c[i];
    return r;
}

static bool dim_expr_eq(const DimExpr *a, const DimExpr *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

char *dim_expr_glsl(const DimExpr *e, int64_t scale) {
    Str s = {0};
    str_addf(&s, "((%lld", (long long)e->c0);
    for (int i = 0; i < MAX_DIMS; i++)
        if (e->c[i])
            str_addf(&s, " + %lld * KILN_DIM(%d)", (long long)e->c[i], i);
    str_addf(&s, ") * %lld)", (long long)scale);
    return s.buf;
}

char *dim_expr_str(const Graph *g, const DimExpr *e) {
    Str s = {0};
    str_add(&s, "");
    for (int i = 0; i < g->ndims; i++) {
        if (!e->c[i])
            continue;
        if (s.len)
            str_add(&s, " + ");
        if (e->c[i] != 1)
            str_addf(&s, "%lld*", (long long)e->c[i]);
        str_add(&s, g->dims[i].name);
    }
    if (e->c0 || !s.len)
        str_addf(&s, "%s%lld", s.len ? " + " : "", (long long)e->c0);
    return s.buf;
}

int64_t dyn_inner(const Tensor *t) {
    return shape_count(t->rank - t->dyn_axis - 1, t->shape + t->dyn_axis + 1);
}

static _Noreturn void unsupported(Node *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static _Noreturn void unsupported(Node *n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    Str s = {0};
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    str_add(&s, buf);
    error_at(n->loc, "node '%s' (%s): %s", n->name, op_info[n->op].name, s.buf);
}

/* Marks t dynamic along axis with extent e, checking the outermost rule. */
static void set_dynamic(Node *n, Tensor *t, int axis, const DimExpr *e) {
    for (int i = 0; i < axis; i++)
        if (t->shape[i] != 1)
            unsupported(n, "its output '%s' %s would have the dynamic axis %d inside axis "
                        "%d of size %lld; a dynamic axis must be the outermost one larger "
                        "than 1", t->name, shape_str(t->rank, t->shape), axis, i,
                        (long long)t->shape[i]);
    t->dynamic = true;
    t->dyn_axis = axis;
    t->extent = *e;
}

void check_dynamic_input(Tensor *t) {
    for (int i = 0; i < t->dyn_axis; i++)
        if (t->shape[i] != 1)
            error_at(t->loc, "'%s' %s: a dynamic dimension must be the outermost axis "
                     "larger than 1 (axis %d has size %lld)", t->name,
                     shape_str(t->rank, t->shape), i, (long long)t->shape[i]);
}

static int ndynamic(Node *n) {
    int k = 0;
    for (int i = 0; i < n->ninputs; i++)
        k += n->inputs[i]->dynamic;
    return k;
}

/* Outputs the same as input x (dynamic along the same axis). */
static void same_as(Node *n, Tensor *x) {
    for (int k = 0; k < n->noutputs; k++)
        set_dynamic(n, n->outputs[k], x->dyn_axis + n->outputs[k]->rank - x->rank,
                    &x->extent);
}

/* Numpy broadcasting: every dynamic input meets the same extent at the same
 * output axis; a fixed input has size 1 there (or lacks the axis). */
static void broadcast_dynamic(Node *n, int first, int last) {
    Tensor *out = n->outputs[0], *ref = NULL;
    int axis = -1;
    for (int i = first; i <= last && i < n->ninputs; i++) {
        Tensor *t = n->inputs[i];
        if (!t->dynamic)
            continue;
        int a = t->dyn_axis + out->rank - t->rank;
        if (ref && (a != axis || !dim_expr_eq(&t->extent, &ref->extent)))
            unsupported(n, "'%s' and '%s' have different dynamic extents; kiln cannot "
                        "prove they are equal", ref->name, t->name);
        ref = t;
        axis = a;
    }
    if (!ref)
        return;
    for (int i = first; i <= last && i < n->ninputs; i++) {
        Tensor *t = n->inputs[i];
        int j = axis - (out->rank - t->rank);
        if (!t->dynamic && j >= 0 && t->shape[j] != 1)
            unsupported(n, "'%s' %s has the fixed size %lld where '%s' is dynamic; use a "
                        "slice or gather of the fixed tensor instead", t->name,
                        shape_str(t->rank, t->shape), (long long)t->shape[j], ref->name);
    }
    for (int k = 0; k < n->noutputs; k++)
        set_dynamic(n, n->outputs[k], axis, &ref->extent);
}

/* A view or copy of x as out: the prefix rule makes it a reshape of the
 * dynamic axis into the outermost output axis larger than 1, scaled. */
static void reshape_dynamic(Node *n, Tensor *x, Tensor *out) {
    int64_t inner_in = dyn_inner(x);
    int b = 0;
    while (b < out->rank - 1 && out->shape[b] == 1)
        b++;
    int64_t inner_out = shape_count(out->rank - b - 1, out->shape + b + 1);
    if (out->rank == 0 || inner_out == 0 || inner_in % inner_out ||
        out->shape[b] != x->shape[x->dyn_axis] * (inner_in / inner_out))
        unsupported(n, "reshaping '%s' %s (dynamic axis %d) to %s would split its "
                    "dynamic axis; keep the dynamic axis outermost and whole",
                    x->name, shape_str(x->rank, x->shape), x->dyn_axis,
                    shape_str(out->rank, out->shape));
    DimExpr e = dim_expr_scale(&x->extent, inner_in / inner_out);
    set_dynamic(n, out, b, &e);
}

/* Row ops over `axis`..: the reduced axes must not be the dynamic one. */
static void not_over(Node *n, Tensor *x, const bool *reduced) {
    if (reduced[x->dyn_axis])
        unsupported(n, "it reduces over the dynamic axis %d of '%s'; kiln reduces only "
                    "over fixed axes", x->dyn_axis, x->name);
}

/* Each op's dynamic rule (named in its ops.def row): called when one of the
 * node's inputs is dynamic; marks the outputs' dynamic axes or refuses. */

static void dynamic_none(Node *n) {
    unsupported(n, "this op does not take a dynamic extent yet (its input '%s' is "
                "dynamic); ops that do are listed in docs/yaml.md",
                n->inputs[0]->dynamic ? n->inputs[0]->name : "one");
}

/* elementwise, numpy broadcasting */
static void dynamic_broadcast(Node *n) { broadcast_dynamic(n, 0, n->ninputs - 1); }

static void dynamic_expand(Node *n) { broadcast_dynamic(n, 0, 0); }

static void dynamic_reshape(Node *n) { reshape_dynamic(n, n->inputs[0], n->outputs[0]); }

static void dynamic_transpose(Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    int64_t perm[MAX_RANK];
    int np = attr_ints(n, "perm", perm, MAX_RANK);
    for (int i = 0; i < out->rank; i++) {
        int64_t p = np < 0 ? x->rank - 1 - i : perm[i] < 0 ? perm[i] + x->rank : perm[i];
        if (p == x->dyn_axis)
            set_dynamic(n, out, i, &x->extent);
    }
}

static void dynamic_slice(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t start[MAX_RANK], step[MAX_RANK], shape[MAX_RANK];
    slice_params(n, start, step, shape);
    int a = x->dyn_axis;
    if (start[a] != 0 || step[a] != 1 || shape[a] != x->shape[a])
        unsupported(n, "it slices the dynamic axis %d of '%s'; kiln slices only fixed "
                    "axes of a dynamic tensor", a, x->name);
    same_as(n, x);
}

static void dynamic_concat(Node *n) {
    Tensor *out = n->outputs[0];
    int64_t axis = attr_int(n, "axis");
    if (axis < 0)
        axis += out->rank;
    Tensor *ref = NULL;
    for (int i = 0; i < n->ninputs; i++)
        if (n->inputs[i]->dynamic)
            ref = n->inputs[i];
    if (ref->dyn_axis != axis) { /* along a fixed axis: all alike */
        for (int i = 0; i < n->ninputs; i++)
            if (!n->inputs[i]->dynamic)
                unsupported(n, "'%s' is fixed where '%s' is dynamic", n->inputs[i]->name,
                            ref->name);
        broadcast_dynamic(n, 0, n->ninputs - 1);
        return;
    }
    DimExpr sum = {0};
    for (int i = 0; i < n->ninputs; i++) {
        Tensor *t = n->inputs[i];
        if (t->dynamic && t->dyn_axis != axis)
            unsupported(n, "'%s' is dynamic along axis %d, not the concatenation axis",
                        t->name, t->dyn_axis);
        if (t->dynamic) {
            sum = dim_expr_add(&sum, &t->extent);
        } else {
            for (int k = 0; k < axis; k++)
                if (t->shape[k] != 1)
                    unsupported(n, "'%s' has size %lld before the dynamic axis",
                                t->name, (long long)t->shape[k]);
            sum.c0 += t->shape[axis];
        }
    }
    set_dynamic(n, out, (int)axis, &sum);
}

static void dynamic_split(Node *n) {
    Tensor *x = n->inputs[0];
    int axis;
    split_sizes(n, &axis);
    if (axis == x->dyn_axis)
        unsupported(n, "it splits the dynamic axis of '%s'", x->name);
    same_as(n, x);
}

static void dynamic_matmul(Node *n) {
    Tensor *x = n->inputs[0], *b = n->inputs[1], *out = n->outputs[0];
    if (b->dynamic)
        unsupported(n, "its second operand '%s' is dynamic; kiln takes a dynamic "
                    "extent only in the rows of the first", b->name);
    if (x->rank < 2 || x->dyn_axis == x->rank - 1)
        unsupported(n, "'%s' is dynamic along the contracted axis", x->name);
    if (b->rank > 2)
        unsupported(n, "a dynamic first operand needs a shared (rank-2) second "
                    "operand; '%s' is %s", b->name, shape_str(b->rank, b->shape));
    set_dynamic(n, out, x->dyn_axis + out->rank - x->rank, &x->extent);
}

static void dynamic_gemm(Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    if (n->inputs[1]->dynamic || attr_int(n, "trans_a"))
        unsupported(n, "kiln takes a dynamic extent only in the rows of A "
                    "(trans_a 0)");
    if (n->ninputs > 2 && n->inputs[2]->dynamic)
        broadcast_dynamic(n, 0, 2);
    else
        set_dynamic(n, out, 0, &x->extent);
    if (n->ninputs > 2 && !n->inputs[2]->dynamic && n->inputs[2]->rank == 2 &&
        n->inputs[2]->shape[0] != 1)
        unsupported(n, "its bias '%s' has fixed rows where A's are dynamic",
                    n->inputs[2]->name);
}

static void dynamic_norm(Node *n) {
    Tensor *x = n->inputs[0];
    bool residual = n->op == OP_RESIDUAL_LAYER_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    int64_t axis = attr_int(n, "axis");
    if (axis < 0)
        axis += x->rank;
    bool reduced[MAX_RANK] = {false};
    for (int i = (int)axis; i < x->rank; i++)
        reduced[i] = true;
    if (x->dynamic)
        not_over(n, x, reduced);
    for (int i = residual ? 2 : 1; i < n->ninputs; i++)
        if (n->inputs[i]->dynamic)
            unsupported(n, "its parameter '%s' is dynamic", n->inputs[i]->name);
    broadcast_dynamic(n, 0, residual ? 1 : 0);
}

static void dynamic_batch_norm(Node *n) {
    for (int i = 1; i < n->ninputs; i++)
        if (n->inputs[i]->dynamic)
            unsupported(n, "its parameter '%s' is dynamic", n->inputs[i]->name);
    same_as(n, n->inputs[0]);
}

/* softmax, log_softmax, cumsum, topk: along one axis, not the dynamic one */
static void dynamic_axis(Node *n) {
    Tensor *x = n->inputs[0];
    bool reduced[MAX_RANK] = {false};
    int64_t axis = attr_int(n, "axis");
    reduced[axis < 0 ? axis + x->rank : axis] = true;
    not_over(n, x, reduced);
    same_as(n, x);
}

/* [..., V] -> [...]: the dynamic axis keeps its place */
static void dynamic_sample(Node *n) {
    Tensor *x = n->inputs[0];
    bool reduced[MAX_RANK] = {false};
    if (n->inputs[1]->dynamic)
        unsupported(n, "its seed is dynamic");
    reduced[x->rank - 1] = true;
    not_over(n, x, reduced);
    set_dynamic(n, n->outputs[0], x->dyn_axis, &x->extent);
}

static void dynamic_reduce(Node *n) {
    Tensor *x = n->inputs[0];
    bool reduced[MAX_RANK] = {false};
    reduced_axes(n, reduced);
    not_over(n, x, reduced);
    int a = x->dyn_axis;
    if (!attr_int(n, "keep_dims"))
        for (int i = 0; i < x->dyn_axis; i++)
            a -= reduced[i];
    set_dynamic(n, n->outputs[0], a, &x->extent);
}

static void dynamic_gather(Node *n) {
    bool emb = n->op == OP_EMBEDDING;
    Tensor *data = n->inputs[emb ? 1 : 0], *idx = n->inputs[emb ? 0 : 1];
    if (data->dynamic)
        unsupported(n, "it gathers from the dynamic tensor '%s'; kiln gathers "
                    "dynamic indices from fixed tensors", data->name);
    int64_t axis = emb ? 0 : attr_int(n, "axis");
    if (axis < 0)
        axis += data->rank;
    set_dynamic(n, n->outputs[0], (int)axis + idx->dyn_axis, &idx->extent);
}

static void dynamic_attention(Node *n) {
    Tensor *x = n->inputs[0];
    if (n->ninputs > 3 && (n->inputs[3]->dynamic || ndynamic(n)))
        unsupported(n, "a mask with dynamic queries or keys; use causal or window, "
                    "which follow the extents");
    AttentionDims a;
    attention_dims(n, &a);
    int seq = a.bshd ? 1 : 2;
    for (int i = 0; i < 3; i++) {
        Tensor *t = n->inputs[i];
        if (t->dynamic && t->dyn_axis != seq)
            unsupported(n, "'%s' is dynamic along axis %d; attention takes dynamic "
                        "positions (axis %d of layout %s) only", t->name, t->dyn_axis,
                        seq, a.bshd ? "bshd" : "bhsd");
    }
    Tensor *k = n->inputs[1], *v = n->inputs[2];
    if (k->dynamic != v->dynamic ||
        (k->dynamic && !dim_expr_eq(&k->extent, &v->extent)))
        unsupported(n, "keys '%s' and values '%s' must have the same dynamic extent",
                    k->name, v->name);
    if (x->dynamic)
        set_dynamic(n, n->outputs[0], seq, &x->extent);
}

static void dynamic_rope(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t axis = attr_int(n, "seq_axis");
    if (axis < 0)
        axis += x->rank;
    Tensor *c = n->inputs[1], *s = n->inputs[2];
    if (c->dynamic != s->dynamic ||
        (c->dynamic && !dim_expr_eq(&c->extent, &s->extent)))
        unsupported(n, "cos '%s' and sin '%s' must have the same dynamic extent",
                    c->name, s->name);
    if (c->dynamic && (!x->dynamic || x->dyn_axis != axis ||
                       !dim_expr_eq(&c->extent, &x->extent)))
        unsupported(n, "cos and sin are dynamic, so '%s' must be dynamic along "
                    "seq_axis %lld with the same extent", x->name, (long long)axis);
    if (x->dynamic && x->dyn_axis == axis && !c->dynamic)
        unsupported(n, "'%s' is dynamic along seq_axis, so cos and sin must be too "
                    "(gather them by position)", x->name);
    same_as(n, x);
}

typedef void (*DynamicFn)(Node *n);
static const DynamicFn dynamic_rules[OP_COUNT] = {
#define OP(id, name, mn, mx, flags, attrs, shape, lower, dyn, expr) [OP_##id] = dyn,
#include "ops.def"
#undef OP
};

void infer_dynamic(Graph *g, Node *n) {
    (void)g;
    if (ndynamic(n))
        dynamic_rules[n->op](n);
}
