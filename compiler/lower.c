/*
 * lower.c: each node becomes zero or more dispatches of a shader family.
 *
 * A dispatch names its family (shaders/<family>.comp), the #defines that
 * specialize it (shapes, strides, attributes: everything is a compile-time
 * constant), its workgroup counts, and its arguments: the tensors whose
 * device addresses it receives in push constants, output first. Views
 * (reshape) produce no dispatch: the output aliases its input's bytes.
 *
 * Workgroup counts are capped at 65535 per dimension (the smallest limit
 * Vulkan allows); kernels loop over the rest, so any size runs. A tensor
 * with zero elements produces no dispatch.
 */
#include "kiln.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUPS 65535u

Dispatch *new_dispatch(Program *p, Node *n, const char *family) {
    Dispatch *d = xcalloc(1, sizeof *d);
    d->node = n;
    d->label = fused_label(n);
    d->family = family;
    d->wait_on = -1;
    d->groups[0] = d->groups[1] = d->groups[2] = 1;
    if (p->ndispatches == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 64;
        p->dispatches = xrealloc(p->dispatches, sizeof(Dispatch *) * (size_t)p->cap);
    }
    p->dispatches[p->ndispatches++] = d;
    return d;
}

void define_int(Dispatch *d, const char *name, int64_t v) {
    str_addf(&d->defines, "%s %lld\n", name, (long long)v);
}

/* An f32 value as a GLSL float literal (exact: %.9g round-trips). */
static char *glsl_float(double v) {
    if (!isfinite((float)v))
        return format("uintBitsToFloat(0x%08xu)",
                      isnan(v) ? 0x7fc00000u : v > 0 ? 0x7f800000u : 0xff800000u);
    char *s = format("%.9g", (double)(float)v);
    return strpbrk(s, ".eEn") ? s : format("%s.0", s);
}

void define_float(Dispatch *d, const char *name, double v) {
    str_addf(&d->defines, "%s %s\n", name, glsl_float(v));
}

void define_str(Dispatch *d, const char *name, const char *v) {
    str_addf(&d->defines, "%s %s\n", name, v);
}

void define_list(Dispatch *d, const char *name, int n, const int64_t *v) {
    str_addf(&d->defines, "%s ", name);
    for (int i = 0; i < n; i++)
        str_addf(&d->defines, "%s%lluu", i ? ", " : "", (unsigned long long)v[i]);
    str_add(&d->defines, "\n");
}

void dispatch_arg(Dispatch *d, Tensor *t, bool written) {
    if (d->nargs == MAX_ARGS)
        internal_error("dispatch for '%s' has more than %d arguments",
                       d->node->name, MAX_ARGS);
    if (written)
        d->writes |= 1u << d->nargs;
    d->arg_begin[d->nargs] = 0;
    d->arg_end[d->nargs] = tensor_bytes(t);
    d->args[d->nargs++] = t;
}

void dispatch_unused(Dispatch *d, Tensor *t) {
    dispatch_arg(d, t, false);
    d->arg_end[d->nargs - 1] = 0; /* an empty range: no bytes, no hazards */
}

uint64_t dispatch_bytes_read(const Dispatch *d) {
    uint64_t b = 0;
    for (int k = 0; k < d->nargs; k++)
        if (!((d->writes >> k) & 1u))
            b += d->arg_end[k] - d->arg_begin[k];
    return b;
}

uint64_t dispatch_bytes_written(const Dispatch *d) {
    uint64_t b = 0;
    for (int k = 0; k < d->nargs; k++)
        if ((d->writes >> k) & 1u)
            b += d->arg_end[k] - d->arg_begin[k];
    return b;
}

static uint32_t groups_for(int64_t items, int64_t per_group) {
    int64_t g = (items + per_group - 1) / per_group;
    return g > MAX_GROUPS ? MAX_GROUPS : (uint32_t)(g < 1 ? 1 : g);
}

/* t when its size follows the dynamic dimensions, else NULL. */
static const Tensor *dyn_of(const Tensor *t) { return t->dynamic ? t : NULL; }

/* The GLSL of `items`, a count over tensor dyn's shape at its largest: the
 * same count at the run's extent (items is a multiple of the dynamic axis's
 * size, since that axis is outermost), or the constant when dyn is NULL. */
static char *dyn_count(const Tensor *dyn, int64_t items) {
    if (!dyn)
        return format("%lld", (long long)items);
    return dim_expr_glsl(&dyn->extent, items / dyn->shape[dyn->dyn_axis]);
}

/* groups[axis] of d follows `items` (a count over dyn's shape, as in
 * dyn_count), per_group items a group, at run time. */
static void dyn_groups(Dispatch *d, int axis, const Tensor *dyn, int64_t items,
                       int64_t per_group) {
    if (!dyn)
        return;
    d->dynamic = true;
    d->dyn_axis = axis;
    d->work = dyn->extent;
    d->scale = items / dyn->shape[dyn->dyn_axis];
    d->per_group = per_group;
    d->work_min = 0;
    d->work_max = INT64_MAX;
}

static void contiguous_strides(int rank, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

/* ---- elementwise dispatches over strided operands ---- */

#define ITER_RANK (2 * MAX_RANK) /* tile iterates over twice the rank */
#define MAX_OPS 7                /* the output and up to 6 inputs */

/* A tensor as an elementwise kernel walks it: element strides over the
 * iteration shape (0: broadcast, negative: a reversed slice) and the element
 * where index 0 lands. */
typedef struct Operand {
    Tensor *t;
    int64_t strides[ITER_RANK];
    int64_t base;
    /* A base that follows the dynamic dimensions (a concatenation after a
     * dynamic piece): base_expr elements, base unused. */
    bool dyn_base;
    DimExpr base_expr;
} Operand;

static Operand whole(Tensor *t) {
    Operand o = {t, {0}, 0, false, {0, {0}}};
    contiguous_strides(t->rank, t->shape, o.strides);
    return o;
}

/* Tensor t read as if broadcast to `rank` dimensions of `shape`: a missing
 * or size-1 dimension that is broadcast has stride 0. */
static Operand broadcast(Tensor *t, int rank, const int64_t *shape) {
    Operand o = {t, {0}, 0, false, {0, {0}}};
    int64_t own[MAX_RANK];
    contiguous_strides(t->rank, t->shape, own);
    for (int i = 0; i < rank; i++) {
        int j = i - (rank - t->rank);
        o.strides[i] = (j < 0 || (t->shape[j] == 1 && shape[i] != 1)) ? 0 : own[j];
    }
    return o;
}

/* Drops size-1 dimensions and merges neighbours that every operand walks
 * linearly, so kernels index with as few divisions as possible. Returns the
 * new rank (at least 1). */
static int collapse(int rank, int64_t *shape, int nops, Operand *ops) {
    int r = 0;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 1)
            continue;
        shape[r] = shape[i];
        for (int k = 0; k < nops; k++)
            ops[k].strides[r] = ops[k].strides[i];
        r++;
    }
    int w = 0;
    for (int i = 0; i < r; i++) {
        bool merge = w > 0;
        for (int k = 0; merge && k < nops; k++)
            merge = ops[k].strides[w - 1] == ops[k].strides[i] * shape[i];
        if (merge) {
            shape[w - 1] *= shape[i];
            for (int k = 0; k < nops; k++)
                ops[k].strides[w - 1] = ops[k].strides[i];
            continue;
        }
        shape[w] = shape[i];
        for (int k = 0; k < nops; k++)
            ops[k].strides[w] = ops[k].strides[i];
        w++;
    }
    if (w == 0) {
        shape[0] = 1;
        for (int k = 0; k < nops; k++)
            ops[k].strides[0] = 0;
        w = 1;
    }
    return w;
}

/* GLSL names by dtype: the buffer type, and how a loaded element becomes a
 * value of the compute type CT (8-bit values convert through 32 bits). */
static const char *buffer_type(kiln_dtype dt, bool readonly) {
    static const char *const names[][2] = {
        {"F32", "F32R"}, {"F16", "F16R"}, {"I32", "I32R"}, {"I64", "I64R"},
        {"U8", "U8R"}, {"U8", "U8R"}, {"I8", "I8R"}};
    return names[dt][readonly];
}

/* `CT(...)` around an element reference, through 32 bits for small types. */
static char *load_conversion(kiln_dtype dt, const char *ref) {
    switch (dt) {
    case KILN_DTYPE_F16: return format("CT(float(%s))", ref);
    case KILN_DTYPE_BOOL:
    case KILN_DTYPE_U8: return format("CT(uint(%s))", ref);
    case KILN_DTYPE_I8: return format("CT(int(%s))", ref);
    default: return format("CT(%s)", ref);
    }
}

static const char *store_conversion(kiln_dtype dt) {
    switch (dt) {
    case KILN_DTYPE_F32: return "float(x)";
    case KILN_DTYPE_F16: return "float16_t(float(x))";
    case KILN_DTYPE_I32: return "int(x)";
    case KILN_DTYPE_I64: return "int64_t(x)";
    case KILN_DTYPE_BOOL: return "uint8_t(uint(x))"; /* a bool, or 0 and 1 */
    case KILN_DTYPE_U8: return "uint8_t(uint(x))";
    case KILN_DTYPE_I8: return "int8_t(int(x))";
    }
    return "x";
}

static const char *compute_type(kiln_dtype dt) {
    switch (dt) {
    case KILN_DTYPE_F32:
    case KILN_DTYPE_F16: return "float";
    case KILN_DTYPE_I64: return "int64_t";
    default: return "int";
    }
}

/* Records the NEED_* define and device feature a dtype requires. */
static void need_dtype(Program *p, bool *need, kiln_dtype dt) {
    if (dt == KILN_DTYPE_F16) {
        need[0] = true;
        p->features |= KILN_FEATURE_STORAGE16;
    } else if (dt == KILN_DTYPE_I64) {
        need[1] = true;
        p->features |= KILN_FEATURE_INT64;
    } else if (dt == KILN_DTYPE_BOOL || dt == KILN_DTYPE_U8 || dt == KILN_DTYPE_I8) {
        need[2] = true;
        p->features |= KILN_FEATURE_STORAGE8;
    }
}

static void define_needs(Dispatch *d, const bool *need) {
    define_int(d, "NEED_F16", need[0]);
    define_int(d, "NEED_I64", need[1]);
    define_int(d, "NEED_8BIT", need[2]);
}

/* Elements of op reached over the iteration shape: [lo, hi] (for every
 * value of a dynamic base). */
static void operand_extent(const Graph *g, const Operand *op, int rank,
                           const int64_t *shape, int64_t *lo, int64_t *hi) {
    *lo = *hi = op->base;
    if (op->dyn_base) {
        *lo = dim_expr_min(g, &op->base_expr);
        *hi = dim_expr_max(g, &op->base_expr);
    }
    for (int i = 0; i < rank; i++) {
        int64_t span = (shape[i] - 1) * op->strides[i];
        if (span < 0)
            *lo += span;
        else
            *hi += span;
    }
}

/* One elementwise dispatch: out[o(i)] = expr(a..f) for every element i of
 * the iteration shape. ct is the compute type ("float", "int", "int64_t").
 * dyn: the tensor whose dynamic extent the iteration follows (its dynamic
 * axis is the iteration's outermost), or NULL. */
static Dispatch *eltwise_dispatch(Program *p, Node *n, int rank, const int64_t *shape_in,
                                  Operand out, int nin, const Operand *in,
                                  const char *ct, const char *expr, const Tensor *dyn) {
    int64_t count = shape_count(rank, shape_in);
    if (count == 0)
        return NULL;
    if (nin > MAX_OPS - 1)
        internal_error("node '%s': %d elementwise inputs", n->name, nin);
    Operand ops[MAX_OPS];
    int64_t shape[ITER_RANK];
    ops[0] = out;
    for (int k = 0; k < nin; k++)
        ops[k + 1] = in[k];
    memcpy(shape, shape_in, sizeof(int64_t) * (size_t)rank);
    rank = collapse(rank, shape, nin + 1, ops);
    int64_t cs[ITER_RANK];
    contiguous_strides(rank, shape, cs);

    Dispatch *d = new_dispatch(p, n, "eltwise");
    bool need[3] = {false, false, false};
    if (strcmp(ct, "int64_t") == 0)
        need_dtype(p, need, KILN_DTYPE_I64);
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    define_str(d, "COUNT", dyn_count(dyn, count));
    define_int(d, "RANK", rank);
    define_list(d, "SHAPE", rank, shape);
    define_int(d, "NOPS", nin + 1);
    /* All operands contiguous f32 (and a multiple of 4 elements at every
     * extent): vec4s. */
    bool vec4 = count % 4 == 0 && strcmp(ct, "float") == 0 &&
                (!dyn || (count / dyn->shape[dyn->dyn_axis]) % 4 == 0);
    for (int k = 0; k <= nin; k++) {
        bool same = ops[k].base == 0 && !ops[k].dyn_base;
        for (int i = 0; i < rank; i++)
            same &= ops[k].strides[i] == cs[i];
        vec4 &= same && ops[k].t->dtype == KILN_DTYPE_F32;
    }
    Str strides = {0}, bases = {0};
    bool strided = false;
    for (int k = 0; k <= nin; k++) {
        Operand *o = &ops[k];
        bool same = o->base == 0 && !o->dyn_base, scalar = !o->dyn_base;
        for (int i = 0; i < rank; i++) {
            same &= o->strides[i] == cs[i];
            scalar &= o->strides[i] == 0;
            str_addf(&strides, "%s%uu", k || i ? ", " : "", (uint32_t)o->strides[i]);
        }
        char *index = same     ? xstrdup("i")
                      : scalar ? format("%lldu", (long long)o->base)
                               : format("off[%d]", k);
        strided |= !same && !scalar;
        need_dtype(p, need, o->t->dtype);
        int64_t lo, hi;
        operand_extent(p->graph, o, rank, shape, &lo, &hi);
        uint32_t es = kiln_dtype_size(o->t->dtype);
        dispatch_arg(d, o->t, k == 0);
        d->arg_begin[k] = (uint64_t)lo * es;
        d->arg_end[k] = (uint64_t)(hi + 1) * es;
        if (k == 0) {
            define_str(d, "TOUT", vec4 ? "V4" : buffer_type(o->t->dtype, false));
            define_str(d, "OUT_IDX", index);
            define_str(d, "STORE(x)", store_conversion(o->t->dtype));
        } else {
            define_str(d, format("T%d", k - 1), vec4 ? "V4R" : buffer_type(o->t->dtype, true));
            char *ref = format("args.in%d.v[%s]", k - 1, index);
            define_str(d, format("%c", 'A' + k - 1),
                       load_conversion(o->t->dtype, ref));
        }
        if (o->dyn_base)
            str_addf(&bases, "%suint%s", k ? ", " : "", dim_expr_glsl(&o->base_expr, 1));
        else
            str_addf(&bases, "%s%uu", k ? ", " : "", (uint32_t)o->base);
    }
    for (int k = nin; k < MAX_OPS - 1; k++)
        define_str(d, format("%c", 'A' + k), "CT(0)");
    if (vec4) {
        d->groups[0] = groups_for(count / 4, 256);
        dyn_groups(d, 0, dyn, count, 1024);
    }
    define_int(d, "VEC4", vec4);
    define_int(d, "STRIDED", strided);
    define_str(d, "STRIDES", strides.buf);
    define_str(d, "BASES", bases.buf);
    define_str(d, "CT", ct);
    define_needs(d, need);
    define_str(d, "EXPR", format("(%s)", expr));
    if (!vec4) {
        d->groups[0] = groups_for(count, d->local_size);
        dyn_groups(d, 0, dyn, count, d->local_size);
    }
    /* A copy computes nothing; otherwise about one operation per operand. */
    d->flops = strcmp(expr, "a") == 0 ? 0 : (uint64_t)count * (uint64_t)(nin > 1 ? nin - 1 : 1);
    return d;
}

/* ---- lowering functions (named in ops.def) ---- */

/* The expression for a node: the op's (its integer variant after '#' when
 * the compute type is an integer), or a cast's. */
static const char *node_expr(Node *n, const char *ct) {
    const char *e = op_info[n->op].expr;
    if (n->op == OP_CAST && n->outputs[0]->dtype == KILN_DTYPE_BOOL)
        return "a != CT(0)";
    const char *bar = strchr(e, '#');
    if (!bar)
        return e;
    if (strcmp(ct, "float") == 0)
        return format("%.*s", (int)(bar - e), e);
    return bar + 1;
}

/* The literal of a numeric attribute named `ident` (upper case) of n, or
 * NULL when n has no such attribute. Integer compute types get integers
 * clamped to 32 bits. */
static char *attribute_literal(Node *n, const char *ident, const char *ct) {
    for (const char *p = op_info[n->op].attrs; *p;) {
        while (*p == ' ')
            p++;
        const char *e = p;
        while (*e && *e != ' ' && *e != '=')
            e++;
        char *key = format("%.*s", (int)(e - p), p);
        while (*e && *e != ' ')
            e++;
        p = e;
        char *upper = xstrdup(key);
        for (char *c = upper; *c; c++)
            *c = (char)toupper((unsigned char)*c);
        if (strcmp(upper, ident) != 0)
            continue;
        const char *dflt = op_attr_default(n->op, key);
        char *end;
        double v = strtod(dflt, &end);
        if (!*dflt || *end)
            return NULL;
        v = attr_float(n, key, v);
        if (strcmp(ct, "float") == 0)
            return glsl_float(v);
        double lo = -2147483648.0, hi = 2147483647.0;
        return format("%lld", (long long)(v < lo ? lo : v > hi ? hi : v));
    }
    return NULL;
}

static int leaf_index(Tensor **leaves, int *nleaves, int max, Tensor *t) {
    for (int i = 0; i < *nleaves; i++)
        if (leaves[i] == t)
            return i;
    if (*nleaves == max)
        return -1;
    leaves[*nleaves] = t;
    return (*nleaves)++;
}

char *fused_expr(Node *n, const char *ct, Tensor **leaves, int *nleaves, int max) {
    char *sub[MAX_ARGS];
    for (int k = 0; k < n->ninputs && k < MAX_ARGS; k++) {
        Tensor *in = n->inputs[k];
        if (in->producer && in->producer->fused_into == n) {
            char *inner = fused_expr(in->producer, ct, leaves, nleaves, max);
            if (!inner)
                return NULL;
            sub[k] = format("(%s)", inner);
        } else {
            int i = leaf_index(leaves, nleaves, max, in);
            if (i < 0)
                return NULL;
            sub[k] = format("%c", 'a' + i);
        }
    }
    /* Rewrite identifiers: operands a..f become their expressions,
     * attribute names their values; everything else stays. */
    const char *e = node_expr(n, ct);
    Str out = {0};
    str_add(&out, "");
    while (*e) {
        if (isalpha((unsigned char)*e) || *e == '_') {
            const char *s0 = e;
            while (isalnum((unsigned char)*e) || *e == '_')
                e++;
            char *ident = format("%.*s", (int)(e - s0), s0);
            char *lit;
            if (e - s0 == 1 && *s0 >= 'a' && *s0 < 'a' + n->ninputs)
                str_add(&out, sub[*s0 - 'a']);
            else if ((lit = attribute_literal(n, ident, ct)))
                str_add(&out, lit);
            else
                str_add(&out, ident);
        } else {
            str_addn(&out, e++, 1);
        }
    }
    return out.buf;
}

char *fused_label(Node *n) {
    Str s = {0};
    str_add(&s, "");
    for (int k = 0; k < n->ninputs; k++) {
        Node *p = n->inputs[k]->producer;
        if (p && p->fused_into == n)
            str_addf(&s, "%s + ", fused_label(p));
    }
    str_add(&s, n->name);
    Node *epi[3] = {n->epi_bias, n->epi_res, n->epi_act};
    for (int k = 0; k < 3; k++)
        if (epi[k])
            str_addf(&s, " + %s", epi[k]->name);
    for (int k = 0; k < n->nsiblings; k++)
        str_addf(&s, " + %s", n->siblings[k]->name);
    return s.buf;
}

/* An elementwise node and every node fused into it: one dispatch. */
static void lower_eltwise(Program *p, Node *n) {
    Tensor *out = n->outputs[0];
    Tensor *leaves[MAX_OPS];
    int nleaves = 0;
    int ref = n->op == OP_WHERE ? 1 : 0;
    const char *ct = compute_type(n->inputs[ref]->dtype);
    char *expr = fused_expr(n, ct, leaves, &nleaves, MAX_OPS - 1);
    if (!expr)
        internal_error("node '%s': a fused group with more than %d operands", n->name,
                       MAX_OPS - 1);
    Operand in[MAX_OPS];
    for (int k = 0; k < nleaves; k++)
        in[k] = broadcast(leaves[k], out->rank, out->shape);
    eltwise_dispatch(p, n, out->rank, out->shape, whole(out), nleaves, in, ct, expr,
                     dyn_of(out));
}

/* out = x viewed with shape `view` (contiguous) and its axes permuted. */
static void permuted_copy(Program *p, Node *n, Tensor *x, int rank, const int64_t *view,
                          const int64_t *perm) {
    int64_t own[MAX_RANK], shape[MAX_RANK];
    contiguous_strides(rank, view, own);
    Operand in = {x, {0}, 0, false, {0, {0}}};
    for (int i = 0; i < rank; i++) {
        shape[i] = view[perm[i]];
        in.strides[i] = own[perm[i]];
    }
    Operand out = {n->outputs[0], {0}, 0, false, {0, {0}}};
    contiguous_strides(rank, shape, out.strides);
    eltwise_dispatch(p, n, rank, shape, out, 1, &in, compute_type(x->dtype), "a",
                     dyn_of(out.t));
}

static void lower_transpose(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int64_t perm[MAX_RANK];
    int np = attr_ints(n, "perm", perm, MAX_RANK);
    for (int i = 0; i < x->rank; i++)
        perm[i] = np < 0 ? x->rank - 1 - i : perm[i] < 0 ? perm[i] + x->rank : perm[i];
    permuted_copy(p, n, x, x->rank, x->shape, perm);
}

static void lower_view(Program *p, Node *n) {
    (void)p;
    n->outputs[0]->alias = n->inputs[0];
}

static void copy(Program *p, Node *n, int rank, const int64_t *shape, Operand out,
                 Operand in, const Tensor *dyn) {
    eltwise_dispatch(p, n, rank, shape, out, 1, &in, compute_type(in.t->dtype), "a", dyn);
}

static void lower_slice(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    int64_t start[MAX_RANK], step[MAX_RANK], shape[MAX_RANK];
    slice_params(n, start, step, shape);
    Operand in = whole(x);
    for (int i = 0; i < x->rank; i++) {
        in.base += start[i] * in.strides[i];
        in.strides[i] *= step[i];
    }
    copy(p, n, out->rank, out->shape, whole(out), in, dyn_of(out));
}

/* Each input (or output) a region of the concatenation along axis. */
static void lower_concat(Program *p, Node *n) {
    Tensor *out = n->outputs[0];
    int axis = (int)attr_int(n, "axis", 0);
    if (axis < 0)
        axis += out->rank;
    /* Where the next piece starts along axis; it follows the dynamic
     * dimensions after a dynamic piece along a dynamic axis. */
    DimExpr at = {0, {0}};
    bool dyn_at = false;
    for (int k = 0; k < n->ninputs; k++) {
        Tensor *x = n->inputs[k];
        Operand o = whole(out);
        o.base = at.c0 * o.strides[axis];
        bool in_place = k == 0 && tensor_root(x) == tensor_root(out); /* a state's append */
        if (dyn_at) {
            o.dyn_base = true;
            o.base_expr = dim_expr_scale(&at, o.strides[axis]);
        }
        if (!in_place)
            copy(p, n, x->rank, x->shape, o, whole(x), dyn_of(x));
        if (x->dynamic && x->dyn_axis == axis) {
            at = dim_expr_add(&at, &x->extent);
            dyn_at = true;
        } else {
            at.c0 += x->shape[axis];
        }
    }
}

static void lower_split(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int axis;
    int64_t sizes[16];
    split_sizes(n, &axis, sizes);
    int64_t at = 0;
    for (int k = 0; k < n->noutputs; k++) {
        Tensor *t = n->outputs[k];
        Operand in = whole(x);
        in.base = at * in.strides[axis];
        copy(p, n, t->rank, t->shape, whole(t), in, dyn_of(t));
        at += sizes[k];
    }
}

static void lower_expand(Program *p, Node *n) {
    Tensor *out = n->outputs[0];
    copy(p, n, out->rank, out->shape, whole(out),
         broadcast(n->inputs[0], out->rank, out->shape), dyn_of(out));
}

/* tile: iterate over [rep0, d0, rep1, d1, ...]; the input repeats with
 * stride 0 over the rep dimensions, the output is contiguous over them. */
static void lower_tile(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    int64_t shape[ITER_RANK], own[MAX_RANK], reps[MAX_RANK];
    attr_ints(n, "repeats", reps, MAX_RANK);
    contiguous_strides(x->rank, x->shape, own);
    Operand in = {x, {0}, 0, false, {0, {0}}}, o = {out, {0}, 0, false, {0, {0}}};
    for (int i = 0; i < x->rank; i++) {
        shape[2 * i] = reps[i];
        shape[2 * i + 1] = x->shape[i];
        in.strides[2 * i] = 0;
        in.strides[2 * i + 1] = own[i];
    }
    contiguous_strides(2 * x->rank, shape, o.strides);
    copy(p, n, 2 * x->rank, shape, o, in, NULL);
}

/* depth_to_space: [N, C, H, W] viewed as 6-D, permuted, viewed as 4-D. */
static void lower_depth_to_space(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int64_t b = attr_int(n, "block", 1), c = x->shape[1] / (b * b);
    int64_t H = x->shape[2], W = x->shape[3];
    if (depth_to_space_crd(n)) {
        int64_t view[6] = {x->shape[0], c, b, b, H, W}, perm[6] = {0, 1, 4, 2, 5, 3};
        permuted_copy(p, n, x, 6, view, perm);
    } else {
        int64_t view[6] = {x->shape[0], b, b, c, H, W}, perm[6] = {0, 3, 4, 1, 5, 2};
        permuted_copy(p, n, x, 6, view, perm);
    }
}

static void lower_space_to_depth(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int64_t b = attr_int(n, "block", 1);
    int64_t view[6] = {x->shape[0], x->shape[1], x->shape[2] / b, b, x->shape[3] / b, b};
    int64_t perm[6] = {0, 3, 5, 1, 2, 4};
    permuted_copy(p, n, x, 6, view, perm);
}

/* Matmul tile sizes by the extent of M or N: (tile, per-thread). Each
 * workgroup has (BM/TM) * (BN/TN) = 256 invocations. */
static void pick_tile(int64_t extent, int64_t *tile, int64_t *per_thread) {
    if (extent >= 64) {
        *tile = 64;
        *per_thread = 4;
    } else if (extent >= 32) {
        *tile = 32;
        *per_thread = 2;
    } else {
        *tile = 16;
        *per_thread = 1;
    }
}

/* One matrix product per batch: element (m, k) of A at a_sm*m + a_sk*k,
 * (k, n) of B at b_sk*k + b_sn*n, batches over bshape with per-operand
 * strides ops[0] (C), ops[1] (A), ops[2] (B). */
typedef struct MatmulShape {
    int64_t M, N, K, a_sm, a_sk, b_sk, b_sn, batch;
    int brank;
    int64_t bshape[ITER_RANK];
    Operand ops[3];
    const Tensor *dyn; /* A, when its rows follow the dynamic dimensions */
} MatmulShape;

/* Few rows: matvec.comp's column-parallel kernel; else matmul.comp's tiles. */
#define MATVEC_MAX_M 16
#define MATVEC_THREADS 256 /* NCOL x KSPLIT */
#define MATVEC_PART_FLOATS 3072 /* shared memory for partial sums: 12 KiB */

static bool all_multiples(int n, const int64_t *v, int64_t of) {
    for (int i = 0; i < n; i++)
        if (v[i] % of)
            return false;
    return true;
}

typedef struct MatvecShape {
    int64_t ncol, ksplit, vec, avec, mc;
} MatvecShape;

/* matvec.comp's layout for s: vec4 columns when B is f32 with 16-byte
 * aligned rows, vec4 rows of A likewise. Column lanes per workgroup (4 to
 * 32): as few as leave 256 workgroups over the columns and batches (128
 * from 9 rows up, where each workgroup's reads of A cost more), so that a
 * large GPU has a workgroup or two per multiprocessor, each reading B with
 * at least 64 contiguous bytes a row. Splits of K fill the rest of 256
 * invocations, as many as K has steps. Measured on an H200 (bench/).
 * KILN_MATVEC_NCOL (a power of two from 1 to 256) overrides the lanes, for
 * tuning. */
static MatvecShape matvec_shape(const Node *n, const MatmulShape *s, int64_t rows) {
    MatvecShape v = {0};
    bool b_vec4 = n->wformat == WF_F32 && s->ops[2].t->dtype == KILN_DTYPE_F32 &&
                  s->b_sn == 1 && s->N % 4 == 0 && s->b_sk % 4 == 0 &&
                  all_multiples(s->brank, s->ops[2].strides, 4);
    v.vec = b_vec4 ? 4 : 1;
    v.avec = s->ops[1].t->dtype == KILN_DTYPE_F32 && s->a_sk == 1 && s->K % 4 == 0 &&
             s->a_sm % 4 == 0 && all_multiples(s->brank, s->ops[1].strides, 4);
    int64_t want_groups = rows > 8 ? 128 : 256;
    v.ncol = 4;
    while (v.ncol < 32 && groups_for(s->N, v.ncol * 2 * v.vec) * s->batch >= want_groups)
        v.ncol *= 2;
    const char *tune = getenv("KILN_MATVEC_NCOL");
    if (tune) {
        long t = strtol(tune, NULL, 10);
        if (t >= 1 && t <= MATVEC_THREADS && (t & (t - 1)) == 0)
            v.ncol = t;
    }
    int64_t steps = s->K / (v.avec ? 4 : 1);
    v.ksplit = MATVEC_THREADS / v.ncol;
    while (v.ksplit > 1 && v.ksplit > steps)
        v.ksplit /= 2;
    v.mc = MATVEC_PART_FLOATS / (v.ksplit * v.ncol * v.vec);
    if (v.mc > rows)
        v.mc = rows;
    return v;
}

/* The defines of a product that every matmul kernel shares but M: N, K,
 * the operands' strides and the batches. */
static void define_product(Dispatch *d, const MatmulShape *s) {
    define_int(d, "N", s->N);
    define_int(d, "K", s->K);
    define_int(d, "A_SM", s->a_sm);
    define_int(d, "A_SK", s->a_sk);
    define_int(d, "B_SK", s->b_sk);
    define_int(d, "B_SN", s->b_sn);
    define_int(d, "BATCH", s->batch);
    define_int(d, "BRANK", s->brank);
    define_list(d, "BSHAPE", s->brank, s->bshape);
    define_list(d, "C_BSTRIDES", s->brank, s->ops[0].strides);
    define_list(d, "A_BSTRIDES", s->brank, s->ops[1].strides);
    define_list(d, "B_BSTRIDES", s->brank, s->ops[2].strides);
}

/* coopmat.comp for s, when it applies: f16 operands (B as given, not
 * re-encoded), more rows than matvec takes, fixed shapes, and every vector
 * of eight halves it moves whole and 16-byte aligned (rows of A and B
 * contiguous; K, N and all row and batch strides multiples of 8). The
 * dispatch needs KILN_FEATURE_COOPMAT; NULL when it does not apply. Tiles
 * (measured on an H200, bench/): 128 x 256 of 8 subgroups (64 x 64 each)
 * when they leave 128 workgroups, else 128 x 128 of 4 when those leave 64,
 * else 64 x 64 of 4. */
static Dispatch *coopmat_kernel(Program *p, Node *n, MatmulShape *s) {
    const Tensor *c = s->ops[0].t, *a = s->ops[1].t, *b = s->ops[2].t;
    if (a->dtype != KILN_DTYPE_F16 || b->dtype != KILN_DTYPE_F16 || n->wq || s->dyn ||
        s->M <= MATVEC_MAX_M || s->a_sk != 1 || s->a_sm % 8 || s->K % 8 || s->N % 8 ||
        s->b_sn != 1 || s->b_sk % 8 ||
        !all_multiples(s->brank, s->ops[0].strides, 8) ||
        !all_multiples(s->brank, s->ops[1].strides, 8) ||
        !all_multiples(s->brank, s->ops[2].strides, 8))
        return NULL;
    int64_t bm = 128, bn = 256, wm = 2, wn = 4, bk = 32;
    if (groups_for(s->M, 128) * groups_for(s->N, 256) * s->batch < 128) {
        bn = 128;
        wn = 2;
        if (groups_for(s->M, 128) * groups_for(s->N, 128) * s->batch < 64)
            bm = bn = 64;
    }
    /* KILN_COOPMAT_TILE=BM,BN,WM,WN,BK overrides the tiles, for tuning
     * (each subgroup's block a multiple of 16, BK 16, 32 or 64) */
    const char *tune = getenv("KILN_COOPMAT_TILE");
    long t[5];
    if (tune && sscanf(tune, "%ld,%ld,%ld,%ld,%ld", &t[0], &t[1], &t[2], &t[3], &t[4]) == 5 &&
        t[2] > 0 && t[3] > 0 && t[2] * t[3] <= 32 && t[0] % (16 * t[2]) == 0 &&
        t[1] % (16 * t[3]) == 0 && (t[4] == 16 || t[4] == 32 || t[4] == 64)) {
        bm = t[0], bn = t[1], wm = t[2], wn = t[3], bk = t[4];
    }
    Dispatch *d = new_dispatch(p, n, "coopmat");
    d->needs = KILN_FEATURE_COOPMAT;
    d->local_size = (uint32_t)(32 * wm * wn);
    define_int(d, "M", s->M);
    define_product(d, s);
    bool need[3] = {false, false, false};
    need_dtype(p, need, c->dtype);
    define_needs(d, need);
    define_int(d, "C_F16", c->dtype == KILN_DTYPE_F16);
    define_int(d, "BM", bm);
    define_int(d, "BN", bn);
    define_int(d, "WM", wm);
    define_int(d, "WN", wn);
    define_int(d, "BK", bk);
    dispatch_arg(d, s->ops[0].t, true);
    dispatch_arg(d, s->ops[1].t, false);
    dispatch_arg(d, s->ops[2].t, false);
    d->flops = 2ull * (uint64_t)(s->M * s->N) * (uint64_t)s->K * (uint64_t)s->batch;
    d->groups[0] = groups_for(s->N, bn);
    d->groups[1] = groups_for(s->M, bm);
    d->groups[2] = groups_for(s->batch, 1);
    return d;
}

/* Whether matmul.comp's vec4 path can read s: f32 operands (B as given)
 * whose rows are contiguous and 16-byte aligned. */
static bool matmul_vec4_shape(const Node *n, const MatmulShape *s) {
    return n->wformat == WF_F32 && s->ops[1].t->dtype == KILN_DTYPE_F32 &&
           s->ops[2].t->dtype == KILN_DTYPE_F32 && s->a_sk == 1 && s->b_sn == 1 &&
           s->K % 4 == 0 && s->N % 4 == 0 && s->a_sm % 4 == 0 && s->b_sk % 4 == 0 &&
           all_multiples(s->brank, s->ops[1].strides, 4) &&
           all_multiples(s->brank, s->ops[2].strides, 4);
}

/* One matmul kernel for s: the matrix-vector one (rows up to mrows, its
 * array size) or the tiled one. */
static Dispatch *matmul_kernel(Program *p, Node *n, MatmulShape *s, bool matvec,
                               int64_t mrows, bool wide) {
    int64_t bm, tm, bn, tn, bk = 16;
    bool shape4 = !matvec && matmul_vec4_shape(n, s);
    pick_tile(s->M, &bm, &tm);
    pick_tile(s->N, &bn, &tn);
    /* vec4 operands: 64 x 128 tiles (4 x 8 per invocation) where they still
     * leave 128 workgroups, a large GPU's multiprocessors (H200: 1024^3 in
     * 73.5 against 83 us on 64 x 64; of the ten tiles swept there, 8 x 8
     * blocks, 32-wide tiles and K steps of 32 were slower) */
    if (shape4 && groups_for(s->M, 64) * groups_for(s->N, 128) * s->batch >= 128) {
        bm = 64, bn = 128, tm = 4, tn = 8;
    }
    /* 128 x 128 tiles (8 x 8 per invocation) reuse more of what they load,
     * when they still leave enough workgroups (256) to fill a large GPU; K
     * steps of 8 measured faster there (H200: 4.2 against 4.8 ms at 4096). */
    if ((s->M + 127) / 128 * ((s->N + 127) / 128) * s->batch >= 256) {
        bm = bn = 128;
        tm = tn = 8;
        bk = shape4 ? 8 : 16;
    }
    /* wide: 128 x 256 tiles, 512 invocations of 8 x 8, two stages of K 16:
     * 48 KiB of shared memory (matmul_dispatch). */
    if (wide) {
        bm = 128, bn = 256, tm = tn = 8, bk = 16;
    }
    /* KILN_MATMUL_TILE=BM,BN,TM,TN[,BK] overrides them, for tuning and
     * tests: (BM/TM) * (BN/TN) invocations, at most 1024. */
    const char *tune = getenv("KILN_MATMUL_TILE");
    long t[5] = {0, 0, 0, 0, 16};
    if (!matvec && tune &&
        sscanf(tune, "%ld,%ld,%ld,%ld,%ld", &t[0], &t[1], &t[2], &t[3], &t[4]) >= 4 &&
        t[2] > 0 && t[3] > 0 && t[4] > 0 && t[4] % 4 == 0 && t[0] % t[2] == 0 &&
        t[1] % t[3] == 0 && (t[0] / t[2]) * (t[1] / t[3]) <= 1024) {
        bm = t[0], bn = t[1], tm = t[2], tn = t[3], bk = t[4];
    }
    /* The vec4 path: f32 operands whose rows are contiguous and 16-byte
     * aligned, 4 x 4 blocks per invocation, whole vec4s per invocation in
     * each K step's loads. */
    int64_t nt = (bm / tm) * (bn / tn);
    bool vec4 = shape4 && tm % 4 == 0 && tn % 4 == 0 &&
                bm * bk / 4 % nt == 0 && bn * bk / 4 % nt == 0 &&
                2 * bk * (bm + bn) * 4 <= 49152; /* two stages of shared memory */
    MatvecShape mv = {0};
    if (matvec)
        mv = matvec_shape(n, s, mrows);
    Dispatch *d = new_dispatch(p, n, matvec ? "matvec" : "matmul");
    d->local_size = (uint32_t)(matvec ? mv.ncol * mv.ksplit : nt);
    if (s->dyn && s->batch != 1)
        internal_error("node '%s': a dynamic matmul with %lld batches", n->name,
                       (long long)s->batch);
    /* Dynamic rows: matvec keeps M (the most) for its arrays and loops to
     * MROWS; the tiled kernel's M is the run's. */
    if (matvec) {
        define_int(d, "M", mrows);
        define_str(d, "MROWS", dyn_count(s->dyn, s->M));
    } else {
        define_str(d, "M", dyn_count(s->dyn, s->M));
    }
    define_product(d, s);
    /* f16 operands: A and C through 16-bit storage, B as packed halves
     * (weights.glsl's f16 format) */
    bool need[3] = {false, false, false};
    need_dtype(p, need, s->ops[0].t->dtype);
    need_dtype(p, need, s->ops[1].t->dtype);
    define_needs(d, need);
    define_int(d, "A_F16", s->ops[1].t->dtype == KILN_DTYPE_F16);
    define_int(d, "C_F16", s->ops[0].t->dtype == KILN_DTYPE_F16);
    if (matvec) {
        define_int(d, "NCOL", mv.ncol);
        define_int(d, "KSPLIT", mv.ksplit);
        define_int(d, "VEC", mv.vec);
        define_int(d, "AVEC", mv.avec);
        define_int(d, "MC", mv.mc);
    } else {
        define_int(d, "BM", bm);
        define_int(d, "BN", bn);
        define_int(d, "BK", bk);
        define_int(d, "TM", tm);
        define_int(d, "TN", tn);
        define_int(d, "VEC4", vec4);
    }
    dispatch_arg(d, s->ops[0].t, true);
    dispatch_arg(d, s->ops[1].t, false);
    dispatch_arg(d, n->wq ? n->wq : s->ops[2].t, false);
    if (s->ops[2].t->dtype == KILN_DTYPE_F16) {
        define_int(d, "W_FORMAT", WF_F16);
    } else if (n->wformat != WF_F32) {
        define_int(d, "W_FORMAT", n->wformat);
        define_int(d, "QBLOCK", QUANT_BLOCK);
    }
    d->flops = 2ull * (uint64_t)((matvec ? mrows : s->M) * s->N) * (uint64_t)s->K *
               (uint64_t)s->batch;
    d->groups[0] = groups_for(s->N, matvec ? mv.ncol * mv.vec : bn);
    d->groups[1] = matvec ? 1 : groups_for(s->M, bm);
    d->groups[2] = groups_for(s->batch, 1);
    if (!matvec)
        dyn_groups(d, 1, s->dyn, s->M, bm);
    /* The vec4 path without loops over tiles and batches where each has
     * its own workgroup, leaving registers to the inner loop. (Loads
     * without bounds checks where the tiles divide the product measured no
     * faster on the H200 once the loops were gone; in coopmat.comp neither
     * change measured faster.) */
    if (vec4)
        define_int(d, "ONE_TILE", !s->dyn && d->groups[0] * bn >= s->N &&
                                      d->groups[1] * bm >= s->M && d->groups[2] >= s->batch);
    return d;
}

/* The kernel by the rows: matrix-vector up to MATVEC_MAX_M, else tiled.
 * Dynamic rows that can be either get both, recorded one after the other:
 * each run gives one of them its groups and the other none (work_min and
 * work_max over the run's rows), and no barrier separates them. Returns the
 * first; d->variant is the second. */
static Dispatch *matmul_dispatch(Program *p, Node *n, MatmulShape *s) {
    if (s->M * s->N * s->batch == 0)
        return NULL;
    Dispatch *cm = coopmat_kernel(p, n, s);
    if (cm) { /* devices without cooperative matrices run the tiled kernel */
        cm->variant = matmul_kernel(p, n, s, false, 0, false);
        cm->variant->unless = KILN_FEATURE_COOPMAT;
        return cm;
    }
    if (s->M <= MATVEC_MAX_M)
        return matmul_kernel(p, n, s, true, s->M, false);
    /* Fixed f32 products with at least 128 tiles of 128 x 256 run on those
     * where the device has 48 KiB of shared memory (H200: 3.5 against 4.2
     * ms at 4096), on 128 x 128 (or smaller) tiles elsewhere. */
    if (!s->dyn && matmul_vec4_shape(n, s) &&
        (s->M + 127) / 128 * ((s->N + 255) / 256) * s->batch >= 128 &&
        !getenv("KILN_MATMUL_TILE")) {
        Dispatch *w = matmul_kernel(p, n, s, false, 0, true);
        w->needs = KILN_FEATURE_SHARED48K;
        w->variant = matmul_kernel(p, n, s, false, 0, false);
        w->variant->unless = KILN_FEATURE_SHARED48K;
        return w;
    }
    int64_t per = s->dyn ? s->M / s->dyn->shape[s->dyn->dyn_axis] : 0; /* rows per unit */
    if (!s->dyn || per > MATVEC_MAX_M)
        return matmul_kernel(p, n, s, false, 0, false);
    int64_t small = MATVEC_MAX_M / per * per; /* the most rows the matvec one takes */
    Dispatch *v = matmul_kernel(p, n, s, true, small, false);
    uint32_t cols = v->groups[0];
    v->dynamic = true; /* all its column groups, while the rows are 1..small */
    v->dyn_axis = 0;
    v->work = s->dyn->extent;
    v->scale = per * cols;
    v->per_group = 1;
    v->work_min = cols;
    v->work_max = small * cols;
    Dispatch *t = matmul_kernel(p, n, s, false, 0, false);
    t->work_min = small + 1;
    v->variant = t;
    return v;
}

static const char *activation_expr(const char *name);

/* The bias slot of a matmul kernel: bias read at BIAS_SM * m + BIAS_SN * n
 * (strides of bo) and added times beta, or, without one, a slot the kernel
 * does not touch (a's address). */
static void bind_bias(Dispatch *d, Tensor *bias, Operand bo, double beta, Tensor *a) {
    if (!bias) {
        dispatch_unused(d, a);
        return;
    }
    define_int(d, "HAS_BIAS", 1);
    define_float(d, "BETA", beta);
    define_int(d, "BIAS_SM", bo.strides[0]);
    define_int(d, "BIAS_SN", bo.strides[1]);
    dispatch_arg(d, bias, false);
}

/* After the bias slot: the scales and zero points of a quantized B. */
static void bind_weight_scales(Dispatch *d, Node *n) {
    if (!n->wscale)
        return;
    dispatch_arg(d, n->wscale, false);
    if (n->wzero)
        dispatch_arg(d, n->wzero, false);
}

/* QKV split (optimize.c): the product's columns [0, N0) are n's output,
 * the next N1 its first sibling's, the rest its second's; each a row-major
 * [M, width] tensor (B is one 2-D weight, so the batch folded into M). The
 * kernels take the siblings' outputs after the scale and zero-point slots
 * (bound unused when B is not quantized). */
static void bind_split(Dispatch *d, Node *n, const MatmulShape *s) {
    if (s->batch != 1)
        internal_error("node '%s': a split product with %lld batches", n->name,
                       (long long)s->batch);
    Tensor *a = n->inputs[0];
    if (!n->wscale)
        dispatch_unused(d, a);
    if (!n->wzero)
        dispatch_unused(d, a);
    int64_t n0 = n->outputs[0]->shape[n->outputs[0]->rank - 1];
    int64_t n1 = n->siblings[0]->outputs[0]->shape[n->siblings[0]->outputs[0]->rank - 1];
    define_int(d, "SPLIT_N0", n0);
    define_int(d, "SPLIT_N1", n->nsiblings > 1 ? n1 : s->N - n0);
    dispatch_arg(d, n->siblings[0]->outputs[0], true);
    if (n->nsiblings > 1)
        dispatch_arg(d, n->siblings[1]->outputs[0], true);
    else
        dispatch_unused(d, a);
}

static void lower_matmul(Program *p, Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1], *out = n->outputs[0];
    MatmulShape s = {0};
    s.K = a->shape[a->rank - 1];
    s.M = a->rank >= 2 ? a->shape[a->rank - 2] : 1;
    s.N = b->rank >= 2 ? b->shape[b->rank - 1] : 1;
    s.a_sm = s.K;
    s.a_sk = 1;
    s.b_sk = b->rank >= 2 ? s.N : 1;
    s.b_sn = 1;
    /* Batch dimensions of the output and each operand's strides over them
     * (stride 0 where broadcast). */
    s.brank = out->rank - (a->rank >= 2) - (b->rank >= 2);
    s.ops[0] = (Operand){out, {0}, 0, false, {0, {0}}};
    s.ops[1] = (Operand){a, {0}, 0, false, {0, {0}}};
    s.ops[2] = (Operand){b, {0}, 0, false, {0, {0}}};
    memcpy(s.bshape, out->shape, sizeof(int64_t) * (size_t)s.brank);
    int64_t sa = s.M * s.K, sb = s.K * s.N, so = s.M * s.N;
    for (int i = s.brank - 1; i >= 0; i--) {
        int ja = i - (s.brank - (a->rank - 2)), jb = i - (s.brank - (b->rank - 2));
        s.ops[0].strides[i] = so;
        so *= s.bshape[i];
        if (a->rank > 2 && ja >= 0 && a->shape[ja] == s.bshape[i]) {
            s.ops[1].strides[i] = sa;
            sa *= s.bshape[i];
        }
        if (b->rank > 2 && jb >= 0 && b->shape[jb] == s.bshape[i]) {
            s.ops[2].strides[i] = sb;
            sb *= s.bshape[i];
        }
    }
    s.batch = shape_count(s.brank, s.bshape);
    s.brank = collapse(s.brank, s.bshape, 3, s.ops);
    /* A shared B and an unbroadcast A: fold the batch into M. */
    if (s.brank == 1 && s.ops[2].strides[0] == 0 && s.ops[1].strides[0] == s.M * s.K &&
        a->rank >= 2) {
        s.M *= s.bshape[0];
        s.batch = 1;
        s.bshape[0] = 1;
        s.ops[0].strides[0] = s.ops[1].strides[0] = 0;
    }
    /* A fused epilogue (optimize.c): the dispatch writes the last tensor of
     * the group, adding a per-column (or, unbatched, per-element) bias and
     * applying the activation. */
    Node *last = n->epi_act ? n->epi_act : n->epi_bias;
    if (last)
        s.ops[0].t = last->outputs[0];
    s.dyn = dyn_of(a);
    for (Dispatch *d = matmul_dispatch(p, n, &s); d; d = d->variant) {
        if (n->epi_act)
            define_str(d, "ACT(x)", activation_expr(op_info[n->epi_act->op].name));
        Tensor *bias = NULL;
        Operand bo = whole(a);
        if (n->epi_bias) {
            bias = other_input(n->epi_bias, out);
            bo = broadcast(bias, 2, (int64_t[]){s.M, s.N});
            if (bias->rank >= 2 && bias->shape[bias->rank - 2] != 1)
                bo = broadcast(bias, 2, (int64_t[]){out->shape[out->rank - 2], s.N});
        }
        bind_bias(d, bias, bo, 1.0, a);
        bind_weight_scales(d, n);
        if (n->nsiblings)
            bind_split(d, n, &s);
    }
}

/* Activation expressions for fused epilogues, over x. */
static const char *activation_expr(const char *name) {
    static const char *const table[][2] = {
        {"none", "(x)"},           {"relu", "max(x, 0.0)"},
        {"gelu", "kiln_gelu(x)"},  {"gelu_tanh", "kiln_gelu_tanh(x)"},
        {"silu", "(x) * kiln_sigmoid(x)"}, {"sigmoid", "kiln_sigmoid(x)"},
        {"tanh", "kiln_tanh(x)"}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i][0], name) == 0)
            return table[i][1];
    return NULL;
}

/* One product C [M, N] = op(A) op(B) of whole 2-D tensors, op a transpose
 * when ta / tb; A's rows dynamic when A is. */
static MatmulShape matrix_product(Tensor *c, Tensor *a, Tensor *b, int64_t M, int64_t N,
                                  int64_t K, bool ta, bool tb) {
    MatmulShape s = {0};
    s.M = M;
    s.N = N;
    s.K = K;
    s.a_sm = ta ? 1 : K;
    s.a_sk = ta ? M : 1;
    s.b_sk = tb ? 1 : N;
    s.b_sn = tb ? K : 1;
    s.batch = 1;
    s.brank = 1;
    s.bshape[0] = 1;
    s.ops[0] = (Operand){c, {0}, 0, false, {0, {0}}};
    s.ops[1] = (Operand){a, {0}, 0, false, {0, {0}}};
    s.ops[2] = (Operand){b, {0}, 0, false, {0, {0}}};
    s.dyn = dyn_of(a);
    return s;
}

/* gemm: Y = act(alpha * op(A) op(B) + beta * C), op a transpose when asked;
 * the transposes are strides, bias and activation the matmul's epilogue. */
static void lower_gemm(Program *p, Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1], *out = n->outputs[0];
    bool ta = attr_int(n, "trans_a", 0) != 0, tb = attr_int(n, "trans_b", 0) != 0;
    MatmulShape s = matrix_product(out, a, b, out->shape[0], out->shape[1],
                                   ta ? a->shape[0] : a->shape[1], ta, tb);
    for (Dispatch *d = matmul_dispatch(p, n, &s); d; d = d->variant) {
        define_float(d, "ALPHA", attr_float(n, "alpha", 1.0));
        Attr *act = node_attr(n, "activation");
        define_str(d, "ACT(x)", activation_expr(act ? act->scalar : "none"));
        Tensor *c = n->ninputs > 2 ? n->inputs[2] : NULL;
        bind_bias(d, c, c ? broadcast(c, 2, out->shape) : whole(a),
                  attr_float(n, "beta", 1.0), a);
        bind_weight_scales(d, n);
    }
}

/* grouped_matmul: grouped.comp, NCOL columns of GROUPED_RB rows a workgroup
 * (NCOL x KSPLIT invocations), each row reading its own expert's matrix. */
#define GROUPED_RB 4
#define GROUPED_NCOL 32
#define GROUPED_KSPLIT 8

static void lower_grouped_matmul(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *w = n->inputs[1], *idx = n->inputs[2], *y = n->outputs[0];
    int64_t K = w->shape[1], N = w->shape[2], M = tensor_count(idx);
    if (M * N == 0)
        return;
    Dispatch *d = new_dispatch(p, n, "grouped");
    bool need[3] = {false, false, false};
    need_dtype(p, need, idx->dtype);
    define_needs(d, need);
    d->local_size = GROUPED_NCOL * GROUPED_KSPLIT;
    define_int(d, "M", M);
    define_int(d, "N", N);
    define_int(d, "K", K);
    define_int(d, "E", w->shape[0]);
    define_int(d, "RB", GROUPED_RB);
    define_int(d, "NCOL", GROUPED_NCOL);
    define_int(d, "KSPLIT", GROUPED_KSPLIT);
    define_str(d, "TIDX", buffer_type(idx->dtype, true));
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, w, false);
    dispatch_arg(d, idx, false);
    if (n->ninputs > 3) {
        define_int(d, "HAS_BIAS", 1);
        dispatch_arg(d, n->inputs[3], false);
    } else {
        dispatch_unused(d, x);
    }
    d->flops = 2ull * (uint64_t)(M * N) * (uint64_t)K;
    d->groups[0] = groups_for(N, GROUPED_NCOL);
    d->groups[1] = groups_for(M, GROUPED_RB);
}

/* Row kernels (reduce.glsl): ROWS rows of LEN elements, element j of row r
 * at (r / INNER) * LEN * INNER + r % INNER + j * INNER. One workgroup per row
 * (looping when rows exceed the cap), its invocations striding over the row
 * and reducing in shared memory. */
static uint32_t row_workgroup(int64_t len) {
    uint32_t wg = 32;
    while (wg < 256 && wg < len)
        wg *= 2;
    return wg;
}

/* dyn: the tensor whose dynamic extent the rows follow, or NULL. */
static Dispatch *row_dispatch(Program *p, Node *n, const char *family, int64_t rows,
                              int64_t len, int64_t inner, const Tensor *dyn) {
    if (rows == 0 || len == 0)
        return NULL;
    Dispatch *d = new_dispatch(p, n, family);
    d->local_size = row_workgroup(len);
    define_int(d, "WG", d->local_size);
    define_str(d, "ROWS", dyn_count(dyn, rows));
    define_int(d, "LEN", len);
    define_int(d, "INNER", inner);
    d->groups[0] = groups_for(rows, 1);
    dyn_groups(d, 0, dyn, rows, 1);
    d->flops = 5ull * (uint64_t)(rows * len); /* a few passes over each row */
    return d;
}

/* Rows along one axis of x. */
static Dispatch *axis_dispatch(Program *p, Node *n, const char *family, int axis) {
    Tensor *x = n->inputs[0];
    int64_t len = x->shape[axis];
    int64_t inner = shape_count(x->rank - axis - 1, x->shape + axis + 1);
    int64_t rows = len ? tensor_count(x) / len : 0;
    Dispatch *d = row_dispatch(p, n, family, rows, len, inner, dyn_of(x));
    if (d) {
        dispatch_arg(d, n->outputs[0], true);
        dispatch_arg(d, x, false);
    }
    return d;
}

static int node_axis(Node *n) {
    int64_t axis = attr_int(n, "axis", -1);
    return (int)(axis < 0 ? axis + n->inputs[0]->rank : axis);
}

static void lower_softmax(Program *p, Node *n) {
    Dispatch *d = axis_dispatch(p, n, "softmax", node_axis(n));
    if (d)
        define_int(d, "LOG", n->op == OP_LOG_SOFTMAX);
}

static void lower_cumsum(Program *p, Node *n) {
    Dispatch *d = axis_dispatch(p, n, "cumsum", node_axis(n));
    if (d) {
        define_int(d, "EXCLUSIVE", attr_int(n, "exclusive", 0) != 0);
        /* cumsum_grad: the transpose of a cumulative sum runs the other way */
        define_int(d, "REVERSE", (attr_int(n, "reverse", 0) != 0) != (n->op == OP_CUMSUM_GRAD));
    }
}

/* norm.comp for every normalization but batch_norm. Arguments in order:
 * y, x, gamma, beta, residual, sum; absent ones are filled with x (read,
 * never touched) so each keeps its push-constant slot. */
static void lower_norm(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    bool residual = n->op == OP_RESIDUAL_LAYER_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    /* A residual add fused into this norm (optimize.c): one kernel adds,
     * writes the sum where anything else reads it, and normalizes. */
    Node *add = x->producer && x->producer->fused_into == n ? x->producer : NULL;
    bool rms = n->op == OP_RMS_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    int first_param = residual ? 2 : 1, nparams = n->ninputs - first_param;
    int64_t rows, len, pr = 1, pj = 0, pd = 1;
    int64_t spatial = x->rank >= 2 ? shape_count(x->rank - 2, x->shape + 2) : 1;
    if (n->op == OP_INSTANCE_NORM) {
        rows = x->shape[0] * x->shape[1];
        len = spatial;
        pr = x->shape[1];
        pj = 1;
        pd = len;
    } else if (n->op == OP_GROUP_NORM) {
        int64_t g = attr_int(n, "groups", 1);
        rows = x->shape[0] * g;
        len = x->shape[1] / g * spatial;
        pr = g;
        pj = x->shape[1] / g;
        pd = spatial;
    } else {
        int axis = node_axis(n);
        len = shape_count(x->rank - axis, x->shape + axis);
        rows = len ? tensor_count(x) / len : 0;
    }
    Dispatch *d = row_dispatch(p, n, "norm", rows, len, 1, dyn_of(x));
    if (!d)
        return;
    define_float(d, "EPS", attr_float(n, "eps", 1e-5));
    define_int(d, "RMS", rms);
    define_int(d, "HAS_GAMMA", nparams > 0);
    define_int(d, "HAS_BETA", nparams > 1);
    bool write_sum = n->noutputs > 1 ||
                     (add && (add->outputs[0]->is_output || add->outputs[0]->uses > 1));
    define_int(d, "HAS_RES", residual || add);
    define_int(d, "HAS_SUM", write_sum);
    define_int(d, "PR", pr);
    define_int(d, "PJ", pj);
    define_int(d, "PD", pd);
    if (add)
        x = add->inputs[0];
    dispatch_arg(d, n->outputs[0], true);
    dispatch_arg(d, x, false);
    if (nparams > 0)
        dispatch_arg(d, n->inputs[first_param], false);
    else
        dispatch_unused(d, x);
    if (nparams > 1)
        dispatch_arg(d, n->inputs[first_param + 1], false);
    else
        dispatch_unused(d, x);
    if (residual || add)
        dispatch_arg(d, add ? add->inputs[1] : n->inputs[1], false);
    else
        dispatch_unused(d, x);
    if (write_sum)
        dispatch_arg(d, add ? add->outputs[0] : n->outputs[1], true);
}

/* batch_norm is elementwise: (x - mean) / sqrt(var + eps) * scale + bias,
 * each parameter read per channel (axis 1). */
static void lower_batch_norm(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    Operand in[5];
    in[0] = whole(x);
    for (int k = 1; k < 5; k++) {
        Operand o = {n->inputs[k], {0}, 0, false, {0, {0}}};
        o.strides[1] = 1;
        in[k] = o;
    }
    Dispatch *d = eltwise_dispatch(p, n, x->rank, x->shape, whole(n->outputs[0]), 5, in,
                                   "float", "(a - d) * inversesqrt(e + EPS) * b + c",
                                   dyn_of(x));
    if (d)
        define_float(d, "EPS", attr_float(n, "eps", 1e-5));
}

/* Merges neighbouring dimensions of one group that are contiguous. */
static int merge_dims(int rank, int64_t *shape, int64_t *strides) {
    int w = 0;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 1)
            continue;
        if (w > 0 && strides[w - 1] == strides[i] * shape[i]) {
            shape[w - 1] *= shape[i];
            strides[w - 1] = strides[i];
            continue;
        }
        shape[w] = shape[i];
        strides[w++] = strides[i];
    }
    if (w == 0) {
        shape[0] = 1;
        strides[0] = 0;
        w = 1;
    }
    return w;
}

static const char *const reduce_kinds[] = {
    [OP_REDUCE_SUM] = "K_SUM", [OP_REDUCE_MEAN] = "K_MEAN", [OP_REDUCE_MAX] = "K_MAX",
    [OP_REDUCE_MIN] = "K_MIN", [OP_REDUCE_PROD] = "K_PROD", [OP_REDUCE_L1] = "K_L1",
    [OP_REDUCE_L2] = "K_L2", [OP_REDUCE_SUM_SQUARE] = "K_SUM_SQUARE",
    [OP_REDUCE_LOG_SUM_EXP] = "K_LOG_SUM_EXP", [OP_ARGMAX] = "K_ARGMAX",
    [OP_ARGMIN] = "K_ARGMIN", [OP_GLOBAL_AVG_POOL] = "K_MEAN",
    [OP_GLOBAL_MAX_POOL] = "K_MAX"};

static void lower_reduce(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    bool reduced[MAX_RANK];
    reduced_axes(n, reduced);
    int64_t own[MAX_RANK], kshape[MAX_RANK], kstr[MAX_RANK], rshape[MAX_RANK],
        rstr[MAX_RANK];
    contiguous_strides(x->rank, x->shape, own);
    int kr = 0, rr = 0;
    for (int i = 0; i < x->rank; i++) {
        if (reduced[i]) {
            rshape[rr] = x->shape[i];
            rstr[rr++] = own[i];
        } else {
            kshape[kr] = x->shape[i];
            kstr[kr++] = own[i];
        }
    }
    int64_t rows = tensor_count(out), len = shape_count(rr, rshape);
    kr = merge_dims(kr, kshape, kstr);
    rr = merge_dims(rr, rshape, rstr);
    if (rows == 0)
        return;
    bool arg = n->op == OP_ARGMAX || n->op == OP_ARGMIN;
    Dispatch *d = new_dispatch(p, n, "reduce");
    d->local_size = row_workgroup(len);
    define_int(d, "WG", d->local_size);
    define_str(d, "ROWS", dyn_count(dyn_of(out), rows));
    define_int(d, "LEN", len);
    define_int(d, "KRANK", kr);
    define_list(d, "KSHAPE", kr, kshape);
    define_list(d, "KSTRIDES", kr, kstr);
    define_int(d, "RRANK", rr);
    define_list(d, "RSHAPE", rr, rshape);
    define_list(d, "RSTRIDES", rr, rstr);
    define_str(d, "KIND", reduce_kinds[n->op]);
    define_int(d, "ARG", arg);
    define_int(d, "LAST_INDEX", arg && attr_int(n, "select_last_index", 0));
    if (arg) {
        define_int(d, "NEED_I64", 1);
        p->features |= KILN_FEATURE_INT64;
    }
    dispatch_arg(d, out, true);
    dispatch_arg(d, x, false);
    d->groups[0] = groups_for(rows, 1);
    dyn_groups(d, 0, dyn_of(out), rows, 1);
    d->flops = (uint64_t)(rows * len) * (n->op == OP_REDUCE_LOG_SUM_EXP ? 3u : 1u);
}

/* ---- index.comp and scatter.comp ---- */

/* A dispatch of index.comp writing y from x (and idx, when not NULL). */
static Dispatch *index_dispatch(Program *p, Node *n, const char *mode, Tensor *y,
                                Tensor *x, Tensor *idx) {
    int64_t count = tensor_count(y);
    if (count == 0)
        return NULL;
    Dispatch *d = new_dispatch(p, n, "index");
    bool need[3] = {false, false, false};
    need_dtype(p, need, y->dtype);
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    define_str(d, "COUNT", dyn_count(dyn_of(y), count));
    define_str(d, "MODE", mode);
    define_str(d, "TDATA", buffer_type(y->dtype, false));
    define_str(d, "TDATA_R", buffer_type(x->dtype, true));
    define_str(d, "CONV(x)", store_conversion(y->dtype));
    if (idx) {
        need_dtype(p, need, idx->dtype);
        define_str(d, "TIDX", buffer_type(idx->dtype, true));
    }
    define_needs(d, need);
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    if (idx)
        dispatch_arg(d, idx, false);
    else
        dispatch_unused(d, x);
    d->groups[0] = groups_for(count, d->local_size);
    dyn_groups(d, 0, dyn_of(y), count, d->local_size);
    return d;
}

static void lower_gather(Program *p, Node *n) {
    bool emb = n->op == OP_EMBEDDING;
    Tensor *x = n->inputs[emb ? 1 : 0], *idx = n->inputs[emb ? 0 : 1];
    int axis = emb ? 0 : (int)attr_int(n, "axis", 0);
    if (axis < 0)
        axis += x->rank;
    Dispatch *d = index_dispatch(p, n, "MODE_GATHER", n->outputs[0], x, idx);
    if (!d)
        return;
    define_int(d, "OUTER", shape_count(axis, x->shape));
    define_int(d, "NIDX", tensor_count(idx));
    define_int(d, "AXIS_LEN", x->shape[axis]);
    define_int(d, "INNER", shape_count(x->rank - axis - 1, x->shape + axis + 1));
}

static int attr_axis(Node *n, int rank, int64_t dflt) {
    int64_t axis = attr_int(n, "axis", dflt);
    return (int)(axis < 0 ? axis + rank : axis);
}

static void lower_gather_elements(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1];
    Dispatch *d = index_dispatch(p, n, "MODE_GATHER_ELEMENTS", n->outputs[0], x, idx);
    if (!d)
        return;
    int64_t xs[MAX_RANK];
    contiguous_strides(x->rank, x->shape, xs);
    int axis = attr_axis(n, x->rank, 0);
    define_int(d, "RANK", x->rank);
    define_list(d, "SHAPE", idx->rank, idx->shape);
    define_list(d, "XSTRIDES", x->rank, xs);
    define_int(d, "AXIS", axis);
    define_int(d, "AXIS_LEN", x->shape[axis]);
}

static void lower_one_hot(Program *p, Node *n) {
    Tensor *y = n->outputs[0], *idx = n->inputs[0];
    int axis = attr_axis(n, y->rank, -1);
    Dispatch *d = index_dispatch(p, n, "MODE_ONE_HOT", y, idx, idx);
    if (!d)
        return;
    define_int(d, "DEPTH", y->shape[axis]);
    define_int(d, "INNER", shape_count(y->rank - axis - 1, y->shape + axis + 1));
    define_float(d, "ON", attr_float(n, "on_value", 1));
    define_float(d, "OFF", attr_float(n, "off_value", 0));
}

static void lower_trilu(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    Dispatch *d = index_dispatch(p, n, "MODE_TRILU", n->outputs[0], x, NULL);
    if (!d)
        return;
    define_int(d, "ROWS_", x->shape[x->rank - 2]);
    define_int(d, "COLS_", x->shape[x->rank - 1]);
    define_int(d, "UPPER", attr_int(n, "upper", 1) != 0);
    define_int(d, "K", attr_int(n, "k", 0));
}

static void lower_pad(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *y = n->outputs[0];
    Dispatch *d = index_dispatch(p, n, "MODE_PAD", y, x, NULL);
    if (!d)
        return;
    int64_t pads[2 * MAX_RANK], xs[MAX_RANK];
    attr_ints(n, "pads", pads, 2 * MAX_RANK);
    contiguous_strides(x->rank, x->shape, xs);
    Str begin = {0};
    for (int i = 0; i < x->rank; i++)
        str_addf(&begin, "%s%lld", i ? ", " : "", (long long)pads[i]);
    define_int(d, "RANK", x->rank ? x->rank : 1);
    define_list(d, "SHAPE", y->rank ? y->rank : 1, y->rank ? y->shape : (int64_t[]){1});
    define_list(d, "XSHAPE", x->rank ? x->rank : 1, x->rank ? x->shape : (int64_t[]){1});
    define_list(d, "XSTRIDES", x->rank ? x->rank : 1, x->rank ? xs : (int64_t[]){0});
    define_str(d, "BEGIN", begin.buf ? begin.buf : "0");
    define_int(d, "PAD_MODE", pad_mode(n));
    define_float(d, "VALUE", attr_float(n, "value", 0));
}

/* scatter: a copy of the data into y, then (after a barrier the scheduler
 * places) every update combined into its place. */
/* scatter.comp: y (filled before) combined with each element of upd (of
 * `shape`, `rank` axes) at its coordinates with axis `axis` replaced by its
 * index; y's element strides ys. Returns the dispatch for more defines. */
static Dispatch *scatter_dispatch(Program *p, Node *n, Tensor *y, Tensor *idx, Tensor *upd,
                                  int rank, const int64_t *shape, const int64_t *ys,
                                  int axis, int64_t axis_len, int reduce) {
    int64_t count = shape_count(rank, shape);
    Dispatch *d = new_dispatch(p, n, "scatter");
    bool need[3] = {false, false, false};
    need_dtype(p, need, idx->dtype);
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    define_int(d, "COUNT", count);
    define_int(d, "RANK", rank);
    define_list(d, "SHAPE", rank, shape);
    define_list(d, "YSTRIDES", rank, ys);
    define_int(d, "AXIS", axis);
    define_int(d, "AXIS_LEN", axis_len);
    define_int(d, "REDUCE", reduce);
    define_str(d, "TIDX", buffer_type(idx->dtype, true));
    define_needs(d, need);
    dispatch_arg(d, y, true);
    dispatch_arg(d, idx, false);
    dispatch_arg(d, upd, false);
    d->groups[0] = groups_for(count, d->local_size);
    return d;
}

static void lower_scatter(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *idx = n->inputs[1], *u = n->inputs[2], *y = n->outputs[0];
    copy(p, n, x->rank, x->shape, whole(y), whole(x), NULL);
    int64_t count = tensor_count(u);
    if (count == 0)
        return;
    int64_t ys[MAX_RANK];
    contiguous_strides(y->rank, y->shape, ys);
    int axis = attr_axis(n, x->rank, 0);
    scatter_dispatch(p, n, y, idx, u, u->rank, u->shape, ys, axis, x->shape[axis],
                     scatter_reduction(n));
}

/* ---- attention and rope ---- */

/* Element strides of (batch, head, position) of q, k, v and the output in
 * either layout: QS_B, QS_H, QS_S, KS_*, VS_*, OS_*. */
static void attention_strides(Dispatch *d, const AttentionDims *a) {
    const char *names[4] = {"QS", "KS", "VS", "OS"};
    int64_t heads[4] = {a->H, a->KVH, a->KVH, a->H}, seq[4] = {a->Sq, a->Sk, a->Sk, a->Sq};
    int64_t width[4] = {a->D, a->D, a->DV, a->DV};
    for (int t = 0; t < 4; t++) {
        int64_t sb = heads[t] * seq[t] * width[t];
        int64_t sh = a->bshd ? width[t] : seq[t] * width[t];
        int64_t ss = a->bshd ? heads[t] * width[t] : width[t];
        define_int(d, format("%s_B", names[t]), sb);
        define_int(d, format("%s_H", names[t]), sh);
        define_int(d, format("%s_S", names[t]), ss);
    }
}

static void lower_attention(Program *p, Node *n) {
    AttentionDims a;
    attention_dims(n, &a);
    if (a.B * a.H * a.Sq * a.DV == 0)
        return;
    Dispatch *d = new_dispatch(p, n, "attention");
    d->local_size = a.Sk >= 128 ? 128 : 64;
    define_int(d, "WG", d->local_size);
    define_int(d, "B", a.B);
    define_int(d, "H", a.H);
    define_int(d, "KVH", a.KVH);
    define_str(d, "SQ", dyn_count(dyn_of(n->inputs[0]), a.Sq));
    define_str(d, "SK", dyn_count(dyn_of(n->inputs[1]), a.Sk));
    define_int(d, "D", a.D);
    define_int(d, "DV", a.DV);
    attention_strides(d, &a);
    double scale = attr_float(n, "scale", 1.0 / sqrt((double)a.D));
    double cap = attr_float(n, "softcap", 0);
    define_float(d, "SCALE", scale);
    define_int(d, "SOFTCAP_ON", cap > 0);
    define_float(d, "SOFTCAP", cap > 0 ? cap : 1.0);
    define_int(d, "CAUSAL", attr_int(n, "causal", 0) != 0);
    define_int(d, "WINDOW", attr_int(n, "window", 0));
    dispatch_arg(d, n->outputs[0], true);
    for (int i = 0; i < 3; i++)
        dispatch_arg(d, n->inputs[i], false);
    if (n->ninputs > 3) {
        int64_t full[4] = {a.B, a.H, a.Sq, a.Sk};
        Operand m = broadcast(n->inputs[3], 4, full);
        define_int(d, "HAS_MASK", 1);
        define_int(d, "MS_B", m.strides[0]);
        define_int(d, "MS_H", m.strides[1]);
        define_int(d, "MS_I", m.strides[2]);
        define_int(d, "MS_J", m.strides[3]);
        dispatch_arg(d, n->inputs[3], false);
    } else {
        define_int(d, "HAS_MASK", 0);
        define_int(d, "MS_B", 0);
        define_int(d, "MS_H", 0);
        define_int(d, "MS_I", 0);
        define_int(d, "MS_J", 0);
        dispatch_unused(d, n->inputs[0]); /* the mask slot */
    }
    d->groups[0] = groups_for(a.B * a.H * a.Sq, 1);
    dyn_groups(d, 0, dyn_of(n->inputs[0]), a.B * a.H * a.Sq, 1);
    d->flops = (uint64_t)(a.B * a.H * a.Sq * a.Sk) * (uint64_t)(2 * a.D + 2 * a.DV + 5);
}

/* rope: for each rotated pair (x1, x2) at position s and frequency j,
 *   y1 = x1 cos[s, j] - x2 sin[s, j],   y2 = x2 cos[s, j] + x1 sin[s, j];
 * pairs are (j, j + R/2) (rotate-half) or (2j, 2j + 1) (interleaved). One
 * elementwise dispatch over the rotated part seen as [..., 2, R/2] (p, j;
 * interleaved: [..., R/2, 2]): y[p] = x[p] cos + sign[p] x[1 - p] sin, the
 * partner read at a negative stride and sign a table (-1, 1); and a copy of
 * the unrotated tail when n_rot < D. (Two dispatches, one per half, would
 * write interleaved bytes of one tensor: a barrier between them.) */
static Tensor *table_weight(Program *p, Node *n, const char *name, int rank,
                            const int64_t *shape, const float *values);

static void lower_rope(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    int rank = x->rank;
    int64_t D = x->shape[rank - 1], R = attr_int(n, "n_rot", D), half = R / 2;
    int axis = (int)attr_int(n, "seq_axis", -2);
    if (axis < 0)
        axis += rank;
    bool inter = attr_int(n, "interleaved", 0) != 0;
    /* rope_grad: the rotation's transpose, by -angle */
    bool back = n->op == OP_ROPE_GRAD;
    static const float forward_sign[2] = {-1, 1}, back_sign[2] = {1, -1};
    Tensor *sign = table_weight(p, n, back ? "kiln.rope_sign_back" : "kiln.rope_sign", 1,
                                (int64_t[]){2}, back ? back_sign : forward_sign);
    int64_t shape[MAX_RANK + 1];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)rank);
    Operand self = whole(x), partner, y, c = {n->inputs[1], {0}, 0, false, {0, {0}}};
    Operand sg = {sign, {0}, 0, false, {0, {0}}};
    c.strides[axis] = half;
    /* The last axis becomes two: the pair member p (stride ps in x) and
     * the frequency j (stride js), in the order that walks x forward. */
    int pa = inter ? rank : rank - 1, ja = inter ? rank - 1 : rank;
    int64_t ps = inter ? 1 : half, js = inter ? 2 : 1;
    shape[pa] = 2;
    shape[ja] = half;
    self.strides[pa] = ps;
    self.strides[ja] = js;
    partner = self;
    partner.strides[pa] = -ps;
    partner.base = ps;
    y = self;
    y.t = out;
    c.strides[pa] = 0;
    c.strides[ja] = 1;
    Operand s = c;
    s.t = n->inputs[2];
    sg.strides[pa] = 1;
    Operand in[5] = {self, partner, c, s, sg};
    eltwise_dispatch(p, n, rank + 1, shape, y, 5, in, "float", "a * c + e * b * d",
                     dyn_of(x));
    if (R < D) {
        Operand tail_in = whole(x), tail_out = whole(out);
        tail_in.base = tail_out.base = R;
        memcpy(shape, x->shape, sizeof(int64_t) * (size_t)rank);
        shape[rank - 1] = D - R;
        copy(p, n, rank, shape, tail_out, tail_in, dyn_of(x));
    }
}

/* ---- convolution, pooling, resize ---- */

/* Spatial lists padded to 3 axes (1 for sizes, 0 for pads, ...). */
static void define_spatial(Dispatch *d, const char *name, int nsp, const int64_t *v,
                           int64_t fill) {
    int64_t pad3[3] = {fill, fill, fill};
    for (int i = 0; i < nsp; i++)
        pad3[3 - nsp + i] = v[i];
    Str s = {0};
    for (int i = 0; i < 3; i++)
        str_addf(&s, "%s%lld", i ? ", " : "", (long long)pad3[i]);
    define_str(d, name, s.buf);
}

/* Invocations a convolution's channel split aims at (lower_conv). */
#define CONV_SPLIT_TARGET 65536

static void lower_conv(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *w = n->inputs[1], *y = n->outputs[0];
    /* A fused batch norm (already in w and the bias), residual add and
     * activation: the dispatch writes the last tensor of the group. */
    Node *last = n->epi_act ? n->epi_act : n->epi_res ? n->epi_res : n->epi_bias;
    if (last)
        y = last->outputs[0];
    int64_t count = tensor_count(y);
    if (count == 0)
        return;
    int nsp = x->rank - 2;
    Window win;
    window_geometry(n, x->shape + 2, w->shape + 2, nsp, &win);
    Dispatch *d = new_dispatch(p, n, "conv");
    d->local_size = 64;
    define_int(d, "WG", d->local_size);
    define_int(d, "N", x->shape[0]);
    define_int(d, "C", x->shape[1]);
    define_int(d, "OC", y->shape[1]);
    define_int(d, "G", attr_int(n, "group", 1));
    define_int(d, "TRANSPOSED", n->op == OP_CONV_TRANSPOSE);
    define_spatial(d, "IN_SP", nsp, x->shape + 2, 1);
    define_spatial(d, "OUT_SP", nsp, y->shape + 2, 1);
    define_spatial(d, "K_SP", nsp, w->shape + 2, 1);
    define_spatial(d, "STRIDE", nsp, win.stride, 1);
    define_spatial(d, "PAD", nsp, win.pad_begin, 0);
    define_spatial(d, "DIL", nsp, win.dil, 1);
    define_int(d, "HAS_BIAS", n->ninputs > 2);
    Attr *act = node_attr(n, "activation");
    define_str(d, "ACT(x)", activation_expr(n->epi_act ? op_info[n->epi_act->op].name
                                            : act ? act->scalar : "none"));
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, w, false);
    if (n->ninputs > 2)
        dispatch_arg(d, n->inputs[2], false);
    else
        dispatch_unused(d, x);
    if (n->epi_res) {
        define_int(d, "HAS_RES", 1);
        dispatch_arg(d, other_input(n->epi_res, n->epi_bias ? n->epi_bias->outputs[0]
                                                             : n->outputs[0]), false);
    }
    /* products per output: the input channels of its group by the kernel */
    int64_t cg = x->shape[1] / attr_int(n, "group", 1);
    int64_t per_out = cg * shape_count(nsp, w->shape + 2);
    /* Split the channels of an output over up to 32 invocations while the
     * whole takes fewer than CONV_SPLIT_TARGET (small convolutions: one
     * invocation per output would be a long chain on a mostly idle GPU). */
    int64_t split = 1;
    while (split < 32 && split < cg && count * split < CONV_SPLIT_TARGET)
        split *= 2;
    define_int(d, "SPLIT", split);
    d->groups[0] = groups_for(count * split, d->local_size);
    d->flops = 2ull * (uint64_t)count * (uint64_t)per_out;
}

static void lower_pool(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *y = n->outputs[0];
    int64_t count = tensor_count(y);
    if (count == 0)
        return;
    int nsp = x->rank - 2;
    int64_t k[MAX_RANK];
    attr_ints(n, "kernel", k, MAX_RANK);
    Window win;
    window_geometry(n, x->shape + 2, k, nsp, &win);
    Dispatch *d = new_dispatch(p, n, "pool");
    d->local_size = 64;
    define_int(d, "WG", d->local_size);
    define_int(d, "NC", x->shape[0] * x->shape[1]);
    define_spatial(d, "IN_SP", nsp, x->shape + 2, 1);
    define_spatial(d, "OUT_SP", nsp, y->shape + 2, 1);
    define_spatial(d, "K_SP", nsp, k, 1);
    define_spatial(d, "STRIDE", nsp, win.stride, 1);
    define_spatial(d, "PAD", nsp, win.pad_begin, 0);
    define_spatial(d, "PAD_END", nsp, win.pad_end, 0);
    define_spatial(d, "DIL", nsp, win.dil, 1);
    define_int(d, "MAX", n->op == OP_MAX_POOL);
    define_int(d, "INCLUDE_PAD", n->op == OP_AVG_POOL && attr_int(n, "count_include_pad", 0));
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    d->groups[0] = groups_for(count, d->local_size);
    d->flops = (uint64_t)count * (uint64_t)shape_count(nsp, k);
}

static void lower_resize(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *y = n->outputs[0];
    int64_t count = tensor_count(y);
    if (count == 0 || tensor_count(x) == 0)
        return;
    double scales[MAX_RANK];
    int64_t out[MAX_RANK];
    resize_geometry(n, scales, out);
    Dispatch *d = new_dispatch(p, n, "resize");
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    define_int(d, "COUNT", count);
    define_int(d, "RANK", x->rank);
    define_list(d, "XSHAPE", x->rank, x->shape);
    define_list(d, "YSHAPE", y->rank, y->shape);
    Str sc = {0};
    for (int i = 0; i < x->rank; i++) {
        char *f = format("%.9g", (double)(float)scales[i]);
        str_addf(&sc, "%s%s%s", i ? ", " : "", f, strpbrk(f, ".eE") ? "" : ".0");
    }
    define_str(d, "SCALE", sc.buf);
    Str ol = {0};
    bool by_scales = node_attr(n, "scales") != NULL;
    for (int i = 0; i < x->rank; i++) {
        double len = by_scales ? (double)(float)((double)x->shape[i] * (float)scales[i])
                               : (double)out[i];
        char *f = format("%.9g", len);
        str_addf(&ol, "%s%s%s", i ? ", " : "", f, strpbrk(f, ".eE") ? "" : ".0");
    }
    define_str(d, "OUT_LEN", ol.buf);
    define_int(d, "LINEAR", attr_choice(n, "mode", resize_modes, 2));
    define_int(d, "COORD", attr_choice(n, "coordinate_transformation_mode", resize_coords, 4));
    define_int(d, "NEAREST", attr_choice(n, "nearest_mode", resize_nearest, 4));
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    d->groups[0] = groups_for(count, d->local_size);
    d->flops = (uint64_t)count * (2ull << x->rank);
}

/* ---- selection and scans ---- */

static void lower_topk(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int axis = attr_axis(n, x->rank, -1);
    int64_t k = attr_int(n, "k", 0);
    if (k == 0)
        return;
    Dispatch *d = axis_dispatch(p, n, "topk", axis);
    if (!d)
        return;
    define_int(d, "K", k);
    d->flops *= (uint64_t)k;
    define_int(d, "LARGEST", attr_int(n, "largest", 1) != 0);
    define_int(d, "NEED_I64", 1);
    p->features |= KILN_FEATURE_INT64;
    dispatch_arg(d, n->outputs[1], true);
}

static void lower_sample(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *seed = n->inputs[1];
    int64_t V = x->shape[x->rank - 1], rows = tensor_count(x) / V;
    Dispatch *d = row_dispatch(p, n, "sample", rows, V, 1, dyn_of(x));
    if (!d)
        return;
    int64_t top_k = attr_int(n, "top_k", 0);
    double temp = attr_float(n, "temperature", 1);
    define_int(d, "GREEDY", temp == 0 || top_k == 1);
    define_int(d, "TOP_K", top_k == 0 || top_k > V ? V : top_k);
    define_float(d, "TOP_P", attr_float(n, "top_p", 1));
    define_float(d, "TEMPERATURE", temp == 0 ? 1 : temp);
    define_int(d, "MAX_CAND", 1024);
    define_str(d, "TSEED", buffer_type(seed->dtype, true));
    define_int(d, "NEED_I64", 1);
    p->features |= KILN_FEATURE_INT64;
    dispatch_arg(d, n->outputs[0], true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, seed, false);
}

static void lower_selective_scan(Program *p, Node *n) {
    Tensor *u = n->inputs[0];
    int64_t N = n->inputs[2]->shape[1];
    if (tensor_count(u) == 0)
        return;
    Dispatch *d = new_dispatch(p, n, "scan");
    d->local_size = row_workgroup(N);
    define_int(d, "WG", d->local_size);
    define_int(d, "BATCH", u->shape[0]);
    define_int(d, "L", u->shape[1]);
    define_int(d, "DIM", u->shape[2]);
    define_int(d, "NS", N);
    define_int(d, "SOFTPLUS", attr_int(n, "delta_softplus", 0) != 0);
    define_int(d, "HAS_D", n->ninputs > 5);
    define_int(d, "HAS_Z", n->ninputs > 6);
    dispatch_arg(d, n->outputs[0], true);
    for (int i = 0; i < 7; i++) {
        if (i < n->ninputs)
            dispatch_arg(d, n->inputs[i], false);
        else
            dispatch_unused(d, u);
    }
    d->groups[0] = groups_for(u->shape[0] * u->shape[2], 1);
    d->flops = 8ull * (uint64_t)tensor_count(u) * (uint64_t)N;
}

/* ---- fft.comp: dft, stft, log_mel, welch ---- */

/* Transforms up to this length keep the signal in shared memory (16 KB, the
 * least a Vulkan device offers); powers of two from 2 to it take the radix-2
 * path, the rest the direct sum. */
#define FFT_SMEM_MAX 2048

/* A constant table the compiler computes (shared by name between nodes). */
static Tensor *table_weight(Program *p, Node *n, const char *name, int rank,
                            const int64_t *shape, const float *values) {
    Graph *g = p->graph;
    for (int i = 0; i < g->weights.len; i++) {
        Tensor *t = g->weights.data[i];
        if (strcmp(t->name, name) == 0)
            return t;
    }
    Tensor *t = graph_tensor(g, name, T_WEIGHT, n->loc);
    t->dtype = KILN_DTYPE_F32;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    t->data = xcalloc((size_t)tensor_bytes(t) + 4, 1);
    memcpy(t->data, values, (size_t)tensor_bytes(t));
    return t;
}

static Tensor *twiddle_table(Program *p, Node *n, int64_t L) {
    float *v = xcalloc((size_t)(2 * L), sizeof *v);
    twiddle_values(L, v);
    return table_weight(p, n, format("kiln.twiddles.%lld", (long long)L), 2,
                        (int64_t[]){L, 2}, v);
}

/* A periodic window of L samples (NULL for the rectangle); *sumsq gets the
 * sum of its squares. */
static Tensor *window_table(Program *p, Node *n, int kind, int64_t L, double *sumsq) {
    double *w = xcalloc((size_t)L, sizeof *w);
    float *f = xcalloc((size_t)L, sizeof *f);
    window_values((WindowKind)kind, L, true, w);
    *sumsq = 0;
    for (int64_t i = 0; i < L; i++) {
        f[i] = (float)w[i];
        *sumsq += (double)f[i] * f[i];
    }
    if (kind == WINDOW_RECT)
        return NULL;
    return table_weight(p, n, format("kiln.%s.%lld", window_names[kind], (long long)L), 1,
                        (int64_t[]){L}, f);
}

/* The transforms of sp from x into y, whose bin k of signal (o, i) is at
 * o * out_so + i * out_si + k * out_sj (|X|^2 when power, else two floats). */
static Dispatch *fft_dispatch(Program *p, Node *n, const Spectral *sp, Tensor *x, Tensor *y,
                              Tensor *window, bool power, bool detrend,
                              const int64_t *out_strides) {
    if (sp->outer * sp->inner * sp->nout == 0)
        return NULL;
    Dispatch *d = new_dispatch(p, n, "fft");
    int64_t L = sp->L, wg = 1;
    while (wg * 2 <= L && wg < 256)
        wg *= 2;
    bool smem = L <= FFT_SMEM_MAX, radix2 = smem && L >= 2 && (L & (L - 1)) == 0;
    int log2l = 0;
    while (((int64_t)1 << log2l) < L)
        log2l++;
    d->local_size = (uint32_t)wg;
    define_int(d, "WG", wg);
    define_int(d, "L", L);
    define_int(d, "LOG2L", log2l);
    define_int(d, "NIN", sp->nin);
    define_int(d, "NOUT", sp->nout);
    define_int(d, "C_IN", sp->C);
    define_int(d, "OUTER", sp->outer);
    define_int(d, "INNER", sp->inner);
    define_int(d, "IN_SO", sp->in_so);
    define_int(d, "IN_SI", sp->in_si);
    define_int(d, "IN_SJ", sp->in_sj);
    define_int(d, "OUT_SO", out_strides[0]);
    define_int(d, "OUT_SI", out_strides[1]);
    define_int(d, "OUT_SJ", out_strides[2]);
    define_int(d, "INVERSE", sp->inverse);
    define_int(d, "POWER", power);
    define_int(d, "DETREND", detrend);
    define_int(d, "SMEM", smem);
    define_int(d, "RADIX2", radix2);
    define_int(d, "HAS_WINDOW", window != NULL);
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, twiddle_table(p, n, L), false);
    if (window)
        dispatch_arg(d, window, false);
    else
        dispatch_unused(d, x);
    d->groups[0] = groups_for(sp->outer * sp->inner, 1);
    if (!radix2) /* the bins spread over workgroups (fft.comp) */
        d->groups[1] = groups_for(sp->nout, wg);
    uint64_t per = radix2 ? (uint64_t)(5 * L * log2l) : (uint64_t)(8 * sp->nin * sp->nout);
    d->flops = per * (uint64_t)(sp->outer * sp->inner);
    return d;
}

/* A scratch tensor of the arena that a lowering uses between its kernels. */
static Tensor *scratch(Program *p, Node *n, const char *suffix, int rank,
                       const int64_t *shape) {
    Tensor *t = graph_tensor(p->graph, format("%s.%s", n->name, suffix), T_VALUE, n->loc);
    t->dtype = KILN_DTYPE_F32;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    t->producer = n;
    return t;
}

/* dft and stft: complex bins, two floats each. */
static void lower_dft(Program *p, Node *n) {
    Spectral sp;
    spectral_params(n, &sp);
    Tensor *window = n->op == OP_STFT && n->ninputs > 1 ? n->inputs[1] : NULL;
    int64_t strides[3];
    if (n->op == OP_DFT) { /* [outer, nout, inner, 2] */
        strides[0] = sp.nout * sp.inner * 2;
        strides[1] = 2;
        strides[2] = sp.inner * 2;
    } else { /* [batch, frames, nout, 2] */
        strides[0] = sp.inner * sp.nout * 2;
        strides[1] = sp.nout * 2;
        strides[2] = 2;
    }
    fft_dispatch(p, n, &sp, n->inputs[0], n->outputs[0], window, false, false, strides);
}

/* log_mel: the power spectrogram of every frame (scratch), then one matmul
 * by the mel filter bank with log(max(x, eps)) in its epilogue. */
static void lower_log_mel(Program *p, Node *n) {
    Spectral sp;
    spectral_params(n, &sp);
    Tensor *y = n->outputs[0];
    int64_t frames = sp.outer * sp.inner, mels = y->shape[y->rank - 1];
    double sumsq;
    Tensor *window = window_table(p, n, sp.window, sp.L, &sumsq);
    Tensor *spec = scratch(p, n, "power", 2, (int64_t[]){frames, sp.nout});
    int64_t strides[3] = {sp.inner * sp.nout, sp.nout, 1};
    if (!fft_dispatch(p, n, &sp, n->inputs[0], spec, window, true, false, strides))
        return;
    Tensor *mel = n->ninputs > 1 ? n->inputs[1] : NULL;
    if (!mel) {
        double rate = attr_float(n, "sample_rate", 16000), fmax = attr_float(n, "fmax", 0);
        double *m = xcalloc((size_t)(sp.nout * mels), sizeof *m);
        float *f = xcalloc((size_t)(sp.nout * mels), sizeof *f);
        if (!mel_weight_values(mels, sp.L, rate, attr_float(n, "fmin", 0),
                               fmax > 0 ? fmax : rate / 2, m))
            error_at(n->loc, "node '%s': the mel filters reach past the last DFT bin",
                     n->name);
        for (int64_t i = 0; i < sp.nout * mels; i++)
            f[i] = (float)m[i];
        mel = table_weight(p, n, format("%s.mel", n->name), 2, (int64_t[]){sp.nout, mels}, f);
    }
    MatmulShape s = matrix_product(y, spec, mel, frames, mels, sp.nout, false, false);
    for (Dispatch *d = matmul_dispatch(p, n, &s); d; d = d->variant) {
        define_float(d, "EPS", attr_float(n, "eps", 1e-10));
        define_str(d, "ACT(x)", "log(max(x, EPS))");
        bind_bias(d, NULL, whole(spec), 1.0, spec);
    }
}

/* welch: the power spectrum of every detrended, windowed segment
 * (scratch), then their mean, scaled to a one-sided density. */
static void lower_welch(Program *p, Node *n) {
    Spectral sp;
    spectral_params(n, &sp);
    double sumsq;
    Tensor *window = window_table(p, n, sp.window, sp.L, &sumsq);
    Tensor *spec = scratch(p, n, "power", 3, (int64_t[]){sp.outer, sp.inner, sp.nout});
    int64_t strides[3] = {sp.inner * sp.nout, sp.nout, 1};
    if (!fft_dispatch(p, n, &sp, n->inputs[0], spec, window, true, true, strides))
        return;
    Dispatch *d = new_dispatch(p, n, "fft");
    d->local_size = 256;
    define_int(d, "WG", 256);
    define_int(d, "MODE_AVERAGE", 1);
    define_int(d, "OUTER", sp.outer);
    define_int(d, "NOUT", sp.nout);
    define_int(d, "FRAMES", sp.inner);
    define_int(d, "SEGMENT", sp.L);
    define_float(d, "SCALE", 1.0 / (attr_float(n, "fs", 1) * sumsq * (double)sp.inner));
    dispatch_arg(d, n->outputs[0], true);
    dispatch_arg(d, spec, false);
    dispatch_unused(d, spec);
    dispatch_unused(d, spec);
    d->groups[0] = groups_for(sp.outer * sp.nout, 256);
    d->flops = (uint64_t)(sp.outer * sp.inner * sp.nout);
}

/* ---- grad.comp and scatter.comp: backward ops ---- */

/* layer_norm_grad, rms_norm_grad: dx a workgroup per row (keeping each
 * row's mean and rstd in a scratch), then dgamma and dbeta per column. */
static void lower_norm_grad(Program *p, Node *n) {
    Tensor *dy = n->inputs[0], *x = n->inputs[1];
    int axis = (int)attr_int(n, "axis", -1);
    if (axis < 0)
        axis += x->rank;
    int64_t cols = shape_count(x->rank - axis, x->shape + axis), count = tensor_count(x);
    if (count == 0)
        return;
    int64_t rows = count / cols;
    bool rms = n->op == OP_RMS_NORM_GRAD;
    Tensor *stats = scratch(p, n, "stats", 2, (int64_t[]){rows, 2});
    Dispatch *d = new_dispatch(p, n, "grad");
    d->local_size = row_workgroup(cols);
    define_int(d, "WG", d->local_size);
    define_int(d, "MODE", 0);
    define_int(d, "ROWS", rows);
    define_int(d, "COLS", cols);
    define_float(d, "EPS", attr_float(n, "eps", 1e-5));
    define_int(d, "RMS", rms);
    define_int(d, "HAS_GAMMA", n->ninputs > 2);
    dispatch_arg(d, n->outputs[0], true);
    dispatch_arg(d, stats, true);
    dispatch_arg(d, dy, false);
    dispatch_arg(d, x, false);
    if (n->ninputs > 2)
        dispatch_arg(d, n->inputs[2], false);
    d->groups[0] = groups_for(rows, 1);
    d->flops = 12ull * (uint64_t)count;
    if (n->noutputs < 2)
        return;
    d = new_dispatch(p, n, "grad");
    d->local_size = 256;
    define_int(d, "WG", 256);
    define_int(d, "MODE", 1);
    define_int(d, "ROWS", rows);
    define_int(d, "COLS", cols);
    define_int(d, "HAS_DBETA", n->noutputs > 2);
    dispatch_arg(d, n->outputs[1], true);
    if (n->noutputs > 2)
        dispatch_arg(d, n->outputs[2], true);
    else
        dispatch_unused(d, stats);
    dispatch_arg(d, dy, false);
    dispatch_arg(d, x, false);
    dispatch_arg(d, stats, false);
    d->groups[0] = groups_for(cols, 32);
    d->flops = 4ull * (uint64_t)count;
}

/* gather_grad: zeros, then each element of dy added (atomically) into the
 * row its index names: scatter.comp over dy viewed as [outer, nidx, inner]. */
static void lower_gather_grad(Program *p, Node *n) {
    Tensor *dy = n->inputs[0], *idx = n->inputs[1], *y = n->outputs[0];
    int axis = (int)attr_int(n, "axis", 0);
    if (axis < 0)
        axis += y->rank;
    Operand zero = whole(dy);
    memset(zero.strides, 0, sizeof zero.strides);
    eltwise_dispatch(p, n, y->rank, y->shape, whole(y), 1, &zero, "float", "0.0", NULL);
    int64_t count = tensor_count(dy);
    if (count == 0)
        return;
    int64_t outer = shape_count(axis, y->shape), nidx = tensor_count(idx);
    int64_t inner = shape_count(y->rank - axis - 1, y->shape + axis + 1), size = y->shape[axis];
    Dispatch *d = scatter_dispatch(p, n, y, idx, dy, 3, (int64_t[]){outer, nidx, inner},
                                   (int64_t[]){size * inner, inner, 1}, 1, size, 1);
    define_str(d, "IDX_AT(o)", format("(((o) / %lldu) %% %lldu)", (long long)inner,
                                      (long long)nidx));
    d->flops = (uint64_t)count;
}

/* attention_grad: an invocation per query row (dq, and each row's
 * log-sum-exp and dy . o in a scratch), then one per key row (dk, dv). */
static void lower_attention_grad(Program *p, Node *n) {
    AttentionDims a;
    attention_dims(n, &a);
    if (a.B * a.H * a.Sq * a.Sk == 0)
        return;
    Tensor *stats = scratch(p, n, "stats", 2, (int64_t[]){a.B * a.H * a.Sq, 2});
    double scale = attr_float(n, "scale", 1.0 / sqrt((double)a.D));
    for (int pass = 0; pass < 2; pass++) {
        Dispatch *d = new_dispatch(p, n, "grad");
        d->local_size = 64;
        define_int(d, "WG", 64);
        define_int(d, "MODE", 2 + pass);
        define_int(d, "B", a.B);
        define_int(d, "H", a.H);
        define_int(d, "KVH", a.KVH);
        define_int(d, "SQ", a.Sq);
        define_int(d, "SK", a.Sk);
        define_int(d, "D", a.D);
        define_int(d, "DV", a.DV);
        attention_strides(d, &a);
        define_float(d, "SCALE", scale);
        define_int(d, "CAUSAL", attr_int(n, "causal", 0) != 0);
        dispatch_arg(d, n->outputs[pass ? 1 : 0], true);
        dispatch_arg(d, pass ? n->outputs[2] : stats, true);
        dispatch_arg(d, n->inputs[3], false);
        for (int i = 0; i < 3; i++)
            dispatch_arg(d, n->inputs[i], false);
        if (pass)
            dispatch_arg(d, stats, false);
        d->groups[0] = groups_for(pass ? a.B * a.KVH * a.Sk : a.B * a.H * a.Sq, 64);
        d->flops = (uint64_t)(a.B * a.H * a.Sq * a.Sk) * (uint64_t)(4 * a.D + 4 * a.DV);
    }
}

typedef void (*LowerFn)(Program *p, Node *n);
static const LowerFn lowerings[OP_COUNT] = {
#define OP(id, name, mn, mx, attrs, shape, lower, expr) [OP_##id] = lower,
#include "ops.def"
#undef OP
};

/* Dispatches whose defines read the run's dims get DYN and the address of
 * the dims in push-constant slot DIMS_SLOT (shaders/common.glsl); each
 * dispatch with dynamic groups gets a slot among the indirect commands. */
static void bind_dims(Graph *g, Program *p) {
    Loc none = {NULL, 0, 0};
    if (g->ndims) { /* the runtime writes them whether a kernel reads them or not */
        p->dims = graph_tensor(g, "kiln.dims", T_VALUE, none);
        p->dims->dtype = KILN_DTYPE_I32;
        p->dims->rank = 1;
        p->dims->shape[0] = MAX_DIMS;
    }
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        if (!strstr(d->defines.buf ? d->defines.buf : "", "KILN_DIM("))
            continue;
        if (!p->dims)
            internal_error("dispatch %d reads dims the model does not declare", i);
        define_int(d, "DYN", 1);
        while (d->nargs < DIMS_SLOT)
            dispatch_unused(d, p->dims);
        dispatch_arg(d, p->dims, false);
    }
    for (int i = 0; i < p->ndispatches; i++)
        p->nindirect += p->dispatches[i]->dynamic;
    if (p->nindirect) {
        p->indirect = graph_tensor(g, "kiln.indirect", T_VALUE, none);
        p->indirect->dtype = KILN_DTYPE_I32;
        p->indirect->rank = 1;
        p->indirect->shape[0] = 3 * p->nindirect;
    }
}

/* A state whose update appends to it (update = concat(state, new) along
 * the state's dynamic axis) is updated in place: the update's bytes are the
 * state's, the state's own piece is not copied, and only the new piece is
 * written, past the state's extent where nothing reads. Other states are
 * copied from their update after the dispatches. */
static void plan_states(Graph *g, Program *p) {
    for (int i = 0; i < g->states.len; i++) {
        Tensor *s = g->states.data[i], *u = s->update;
        if (!u)
            continue;
        Node *c = u->producer;
        int64_t axis = c && c->op == OP_CONCAT ? attr_int(c, "axis", 0) : -1;
        if (axis < 0 && c && c->op == OP_CONCAT)
            axis += u->rank;
        if (c && c->op == OP_CONCAT && !c->dead && c->inputs[0] == s && s->dynamic &&
            axis == s->dyn_axis && !u->alias) {
            u->alias = s;
            continue;
        }
        p->state_copies = xrealloc(p->state_copies,
                                   sizeof(Tensor *) * (size_t)(p->nstate_copies + 1));
        p->state_copies[p->nstate_copies++] = s;
    }
}

Program *lower(Graph *g) {
    Program *p = xcalloc(1, sizeof *p);
    p->graph = g;
    plan_states(g, p);
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if (!n->dead && !n->fused_into)
            lowerings[n->op](p, n);
    }
    bind_dims(g, p);
    return p;
}
