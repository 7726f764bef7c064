/*
 * lower_dispatch.c: the builders every op family's lowering uses: a new
 * dispatch, its defines and arguments, workgroup counts (static and
 * following the dynamic dimensions), operands
 * (a tensor as a kernel walks it), elementwise dispatches over strided
 * operands (eltwise.comp: also every copy, slice and transpose), row
 * dispatches (reduce.glsl's kernels), and the tables and scratch tensors a
 * lowering adds to the graph.
 */
#include "lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

char *fused_label(Node *n) {
    Str s = {0};
    str_add(&s, "");
    for (int k = 0; k < n->ninputs; k++) {
        Node *p = n->inputs[k]->producer;
        if (p && p->fused_into == n)
            str_addf(&s, "%s + ", fused_label(p));
    }
    str_add(&s, n->name);
    Node *epi[4] = {n->epi_bias, n->epi_res, n->epi_act, n->epi_perm};
    for (int k = 0; k < 4; k++)
        if (epi[k])
            str_addf(&s, " + %s", epi[k]->name);
    for (int k = 0; k < n->nsiblings; k++)
        str_addf(&s, " + %s", n->siblings[k]->name);
    if (n->split_out)
        str_addf(&s, " + %s", n->split_out->name);
    return s.buf;
}

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
char *glsl_float(double v) {
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

void dispatch_rebind(Dispatch *d, int i, Tensor *t, bool written) {
    d->args[i] = t;
    d->arg_begin[i] = 0;
    d->arg_end[i] = tensor_bytes(t);
    d->unused &= ~(1u << i);
    d->writes = written ? d->writes | 1u << i : d->writes & ~(1u << i);
}

void dispatch_unused(Dispatch *d, Tensor *t) {
    dispatch_arg(d, t, false);
    d->arg_end[d->nargs - 1] = 0; /* an empty range: no bytes, no hazards */
    d->unused |= 1u << (d->nargs - 1);
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

bool dispatch_runs_on(const Dispatch *d, uint32_t features) {
    return (d->needs & ~features) == 0 && (d->unless == 0 || (d->unless & ~features) != 0);
}

int dispatches_on(const Program *p, uint32_t features) {
    int n = 0;
    for (int i = 0; i < p->ndispatches; i++)
        n += dispatch_runs_on(p->dispatches[i], features);
    return n;
}

DeviceCounts device_counts(const Program *p) {
    uint32_t bits = 0;
    for (int i = 0; i < p->ndispatches; i++)
        bits |= p->dispatches[i]->needs | p->dispatches[i]->unless;
    DeviceCounts c = {p->ndispatches, 0, 0, 0};
    /* every subset of the bits the dispatches name (a handful) */
    for (uint32_t sub = bits;; sub = (sub - 1) & bits) {
        int n = dispatches_on(p, sub);
        if (n > c.most || (n == c.most && sub > c.most_features))
            c.most = n, c.most_features = sub;
        if (sub == bits || n < c.fewest)
            c.fewest = n;
        if (!sub)
            break;
    }
    return c;
}

uint32_t groups_for(int64_t items, int64_t per_group) {
    int64_t g = (items + per_group - 1) / per_group;
    return g > MAX_GROUPS ? MAX_GROUPS : (uint32_t)(g < 1 ? 1 : g);
}

/* The GLSL of `items`, a count over tensor dyn's shape at its largest: the
 * same count at the run's extent (items is a multiple of the dynamic axis's
 * size, since that axis is outermost), or the constant when dyn is NULL. */
char *dyn_count(const Tensor *dyn, int64_t items) {
    if (!dyn)
        return format("%lld", (long long)items);
    return dim_expr_glsl(&dyn->extent, items / dyn->shape[dyn->dyn_axis]);
}

/* groups[axis] of d follows `items` (a count over dyn's shape, as in
 * dyn_count), per_group items a group, at run time. */
void dyn_groups(Dispatch *d, int axis, const Tensor *dyn, int64_t items,
                int64_t per_group) {
    if (dyn)
        dyn_groups_along(d, axis, &dyn->extent, items / dyn->shape[dyn->dyn_axis], per_group);
}

/* groups[axis] of d follows scale items for each of the run's `extent`,
 * per_group items a group. */
void dyn_groups_along(Dispatch *d, int axis, const DimExpr *extent, int64_t scale,
                      int64_t per_group) {
    d->dynamic = true;
    d->dyn_axis = axis;
    d->work = *extent;
    d->scale = scale;
    d->per_group = per_group;
    d->work_min = 0;
    d->work_max = INT64_MAX;
}

bool all_multiples(int n, const int64_t *v, int64_t of) {
    for (int i = 0; i < n; i++)
        if (v[i] % of)
            return false;
    return true;
}

void contiguous_strides(int rank, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

Operand whole(Tensor *t) {
    Operand o = {t, {0}, 0, false, {0, {0}}};
    contiguous_strides(t->rank, t->shape, o.strides);
    return o;
}

/* Tensor t read as if broadcast to `rank` dimensions of `shape`: a missing
 * or size-1 dimension that is broadcast has stride 0. */
Operand broadcast(Tensor *t, int rank, const int64_t *shape) {
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
int collapse(int rank, int64_t *shape, int nops, Operand *ops) {
    return collapse_keeping(rank, shape, nops, ops, NULL, NULL);
}

/* collapse, where the axes in the mask *keep (each larger than 1; keep may
 * be NULL) follow a run's extent: each takes the fixed axes after it that
 * merge into it and never merges into the axis before it. *keep becomes
 * the mask of their new indices, and origin[j] (origin may be NULL) the
 * axis that kept axis j was. */
int collapse_keeping(int rank, int64_t *shape, int nops, Operand *ops, uint32_t *keep,
                     int *origin) {
    uint32_t in = keep ? *keep : 0, kept = 0, out = 0;
    int r = 0, from[ITER_RANK];
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 1 && !((in >> i) & 1u))
            continue;
        if ((in >> i) & 1u)
            kept |= 1u << r;
        from[r] = i;
        shape[r] = shape[i];
        for (int k = 0; k < nops; k++)
            ops[k].strides[r] = ops[k].strides[i];
        r++;
    }
    int w = 0;
    for (int i = 0; i < r; i++) {
        bool merge = w > 0 && !((kept >> i) & 1u);
        for (int k = 0; merge && k < nops; k++)
            merge = ops[k].strides[w - 1] == ops[k].strides[i] * shape[i];
        if (merge) {
            shape[w - 1] *= shape[i];
            for (int k = 0; k < nops; k++)
                ops[k].strides[w - 1] = ops[k].strides[i];
            continue;
        }
        if ((kept >> i) & 1u) {
            out |= 1u << w;
            if (origin)
                origin[w] = from[i];
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
    if (keep)
        *keep = out;
    return w;
}

/* GLSL names by dtype: the buffer type, and how a loaded element becomes a
 * value of the compute type CT (8-bit values convert through 32 bits). */
const char *buffer_type(kiln_dtype dt, bool readonly) {
    static const char *const names[][2] = {
        {"F32", "F32R"}, {"F16", "F16R"}, {"I32", "I32R"}, {"I64", "I64R"},
        {"U8", "U8R"}, {"U8", "U8R"}, {"I8", "I8R"}};
    return names[dt][readonly];
}

/* `CT(...)` around an element reference, through 32 bits for small types. */
char *load_conversion(kiln_dtype dt, const char *ref) {
    switch (dt) {
    case KILN_DTYPE_F16: return format("CT(float(%s))", ref);
    case KILN_DTYPE_BOOL:
    case KILN_DTYPE_U8: return format("CT(uint(%s))", ref);
    case KILN_DTYPE_I8: return format("CT(int(%s))", ref);
    default: return format("CT(%s)", ref);
    }
}

const char *store_conversion(kiln_dtype dt) {
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

const char *compute_type(kiln_dtype dt) {
    switch (dt) {
    case KILN_DTYPE_F32:
    case KILN_DTYPE_F16: return "float";
    case KILN_DTYPE_I64: return "int64_t";
    default: return "int";
    }
}

/* Records the NEED_* define and device feature a dtype requires. */
void need_dtype(Program *p, bool *need, kiln_dtype dt) {
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

/* A binding whose dtype the compiler picks (f32 or f16 storage): defines
 * NAME_BUF, its buffer type (readonly unless written), and for a written
 * one NAME_T, its element type; records the dtype's needs. */
void define_storage(Program *p, Dispatch *d, bool *need, const char *name, const Tensor *t,
                    bool written) {
    need_dtype(p, need, t->dtype);
    define_str(d, format("%s_BUF", name), buffer_type(t->dtype, !written));
    if (written)
        define_str(d, format("%s_T", name), t->dtype == KILN_DTYPE_F16 ? "float16_t" : "float");
}

void define_needs(Dispatch *d, const bool *need) {
    define_int(d, "NEED_F16", need[0]);
    define_int(d, "NEED_I64", need[1]);
    define_int(d, "NEED_8BIT", need[2]);
}

/* Elements of op reached over the iteration shape: [lo, hi] (for every
 * value of a dynamic base). */
void operand_extent(const Graph *g, const Operand *op, int rank,
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
 * dyn: the tensor whose dynamic extent the iteration follows, or NULL: its
 * one dynamic axis is the iteration's axis of the same index (the
 * iteration's outermost where dyn has the prefix layout; an inner one is
 * walked with its run-time size, every operand through its strides). */
Dispatch *eltwise_dispatch(Program *p, Node *n, int rank, const int64_t *shape_in,
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
    /* the iteration's axes that follow a run's extent (the walk's tensor
     * at its largest strides; an axis that is not the iteration's of the
     * same size leaves the largest shape): one inside (dyn_inside), or
     * several (dyn_several), each with its extent; groups follow the
     * innermost's */
    uint32_t walk = 0;
    const Tensor *along = dyn;
    if (dyn && (dyn_several(dyn) || dyn_inside(dyn))) {
        walk = !dyn_several(dyn)      ? 1u << dyn_axis_of(dyn)
               : rank == dyn->rank ? dyn->dyn_axes
                                   : 0;
        for (int a = 0; a < ITER_RANK && walk >> a; a++)
            if (((walk >> a) & 1u) && (a >= rank || shape[a] != dyn->shape[a]))
                walk = 0;
        dyn = NULL; /* its groups follow the innermost walked axis (below), else the largest */
    }
    int origin[ITER_RANK];
    rank = collapse_keeping(rank, shape, nin + 1, ops, walk ? &walk : NULL, origin);
    int64_t cs[ITER_RANK];
    contiguous_strides(rank, shape, cs);

    Dispatch *d = new_dispatch(p, n, "eltwise");
    bool need[3] = {false, false, false};
    if (strcmp(ct, "int64_t") == 0)
        need_dtype(p, need, KILN_DTYPE_I64);
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    int inner = -1; /* the innermost walked axis */
    if (walk) {
        /* each walked axis's size (with the fixed axes merged into it) at
         * run time, and their product with the fixed ones */
        Str sh = {0}, cnt = {0};
        for (int i = 0; i < rank; i++) {
            bool walked = (walk >> i) & 1u;
            char *v = walked ? format("uint(%s)", dim_expr_glsl(&along->ext[origin[i]],
                                                                shape[i] /
                                                                    along->shape[origin[i]]))
                             : format("%lldu", (long long)shape[i]);
            str_addf(&sh, "%s%s", i ? ", " : "", v);
            str_addf(&cnt, "%s%s", i ? " * " : "(", v);
            inner = walked ? i : inner;
        }
        str_addf(&cnt, ")");
        define_str(d, "COUNT", cnt.buf);
        define_int(d, "RANK", rank);
        define_str(d, "SHAPE", sh.buf);
        define_int(d, "SHAPE_DYN", 1);
    } else {
        define_str(d, "COUNT", dyn_count(dyn, count));
        define_int(d, "RANK", rank);
        define_list(d, "SHAPE", rank, shape);
    }
    define_int(d, "NOPS", nin + 1);
    /* All operands contiguous f32 (and a multiple of 4 elements at every
     * extent): vec4s. */
    bool vec4 = count % 4 == 0 && strcmp(ct, "float") == 0 && inner < 0 &&
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
        /* with an inner dynamic axis a run's element i is not at i */
        bool same = o->base == 0 && !o->dyn_base && inner < 0, scalar = !o->dyn_base;
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
        /* walking several axes, the groups follow the innermost only: each
         * invocation takes up to `per` elements of the largest shape, so
         * that a short run starts few idle groups (4096 at the most) */
        int64_t per = walk & (walk - 1) ? 1 + count / ((int64_t)d->local_size * 4096) : 1;
        d->groups[0] = groups_for(count, d->local_size * per);
        if (inner >= 0)
            dyn_groups_along(d, 0, &along->ext[origin[inner]],
                             count / along->shape[origin[inner]], d->local_size * per);
        else
            dyn_groups(d, 0, dyn, count, d->local_size);
    }
    /* A copy computes nothing; otherwise about one operation per operand. */
    d->flops = strcmp(expr, "a") == 0 ? 0 : (uint64_t)count * (uint64_t)(nin > 1 ? nin - 1 : 1);
    return d;
}

void copy(Program *p, Node *n, int rank, const int64_t *shape, Operand out,
          Operand in, const Tensor *dyn) {
    eltwise_dispatch(p, n, rank, shape, out, 1, &in, compute_type(in.t->dtype), "a", dyn);
}

/* Row kernels (reduce.glsl): ROWS rows of LEN elements, element j of row r
 * at (r / INNER) * LEN * INNER + r % INNER + j * INNER. One workgroup per row
 * (looping when rows exceed the cap), its invocations striding over the row
 * and reducing in shared memory. */
uint32_t row_workgroup(int64_t len) {
    uint32_t wg = 32;
    while (wg < 256 && wg < len)
        wg *= 2;
    return wg;
}

/* ROWS, LEN and INNER of d (INNER unless the kernel defines it, as
 * reduce.comp does: 1), `rows` rows of len elements, each `inner` apart,
 * and groups[0], a workgroup a row: following dyn, the tensor whose dynamic
 * extent the rows follow, or fixed where dyn is NULL or has no single
 * dynamic axis. Its dynamic axis is the rows' outermost (the prefix
 * layout), or inside, one of the axes before the row's (dyn_inside): then a
 * run's rows are, of the rows' outer part, the first ROW_RUN of every
 * ROW_BLOCK of the largest shape (reduce.glsl, kiln_row_of). */
void row_groups(Dispatch *d, int64_t rows, int64_t len, int64_t inner, bool kernel_inner,
                const Tensor *dyn) {
    /* with an outer dynamic axis too (dyn_outer_inner, its callers' rows
     * before the row's axes): the run's blocks of it only */
    bool outer = dyn && dyn_outer_inner(dyn);
    if (dyn && !dyn->dynamic && !dyn_inside(dyn) && !outer)
        dyn = NULL;
    bool inside = dyn && (dyn_inside(dyn) || outer);
    int a = !inside ? 0 : outer ? inner_dyn_axis(dyn) : dyn_axis_of(dyn);
    int64_t before = inside ? shape_count(a, dyn->shape) : 0;
    int64_t in = inside ? rows / inner / before / dyn->shape[a] : 0;
    if (outer)
        define_str(d, "ROWS", format("(uint(%s) * uint(%s))",
                                     dim_expr_glsl(&dyn->ext[0], before / dyn->shape[0]),
                                     dim_expr_glsl(&dyn->ext[a], in * inner)));
    else
        define_str(d, "ROWS", inside ? dim_expr_glsl(&dyn->ext[a], before * in * inner)
                                     : dyn_count(dyn, rows));
    define_int(d, "LEN", len);
    if (!kernel_inner)
        define_int(d, "INNER", inner);
    d->groups[0] = groups_for(rows, 1);
    if (inside) {
        define_str(d, "ROW_RUN", format("uint%s", dim_expr_glsl(&dyn->ext[a], in)));
        define_int(d, "ROW_BLOCK", dyn->shape[a] * in);
        dyn_groups_along(d, 0, &dyn->ext[a], before * in * inner, 1);
    } else {
        dyn_groups(d, 0, dyn, rows, 1);
    }
}

/* A row kernel's dispatch: rows of len elements, each `inner` apart
 * (row_groups). */
Dispatch *row_dispatch(Program *p, Node *n, const char *family, int64_t rows,
                       int64_t len, int64_t inner, const Tensor *dyn) {
    if (rows == 0 || len == 0)
        return NULL;
    Dispatch *d = new_dispatch(p, n, family);
    d->local_size = row_workgroup(len);
    define_int(d, "WG", d->local_size);
    row_groups(d, rows, len, inner, false, dyn);
    d->flops = 5ull * (uint64_t)(rows * len); /* a few passes over each row */
    return d;
}

/* Rows along one axis of x. */
Dispatch *axis_dispatch(Program *p, Node *n, const char *family, int axis) {
    Tensor *x = n->inputs[0];
    int64_t len = x->shape[axis];
    int64_t inner = shape_count(x->rank - axis - 1, x->shape + axis + 1);
    int64_t rows = len ? tensor_count(x) / len : 0;
    /* rows follow x's extent unless it is along the rows (softmax's
     * RUN_LEN) or after them */
    bool follow = x->dynamic ? x->dyn_axis != axis : dyn_inside(x) && dyn_axis_of(x) < axis;
    /* or x's outer axis and one inside before the rows' axis (scores [b,
     * heads, seq, keys], the keys dynamic too: RUN_LEN): the run's blocks
     * of rows (row_groups), through x's dynamic axes before the rows' */
    Tensor rows_of = *x;
    rows_of.dyn_axes &= (1u << axis) - 1u;
    rows_of.dynamic = false;
    bool outer = !follow && dyn_outer_inner(&rows_of) && inner == 1;
    Dispatch *d = row_dispatch(p, n, family, rows, len, inner,
                               follow ? x : outer ? &rows_of : NULL);
    if (d) {
        dispatch_arg(d, n->outputs[0], true);
        dispatch_arg(d, x, false);
    }
    return d;
}


/* The weight named `name`, or NULL. */
Tensor *find_weight(const Graph *g, const char *name) {
    for (int i = 0; i < g->weights.len; i++) {
        Tensor *t = g->weights.data[i];
        if (strcmp(t->name, name) == 0)
            return t;
    }
    return NULL;
}

/* A constant table the compiler computes (shared by name between nodes). */
Tensor *table_weight(Program *p, Node *n, const char *name, int rank,
                     const int64_t *shape, const float *values) {
    Graph *g = p->graph;
    Tensor *t = find_weight(g, name);
    if (t)
        return t;
    t = graph_tensor(g, name, T_WEIGHT, n->loc);
    t->dtype = KILN_DTYPE_F32;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    t->data = xcalloc((size_t)tensor_bytes(t) + 4, 1);
    memcpy(t->data, values, (size_t)tensor_bytes(t));
    return t;
}

/* A scratch tensor of the arena that a lowering uses between its kernels. */
Tensor *scratch(Program *p, Node *n, const char *suffix, int rank,
                const int64_t *shape) {
    Tensor *t = graph_tensor(p->graph, format("%s.%s", n->name, suffix), T_VALUE, n->loc);
    t->dtype = KILN_DTYPE_F32;
    t->rank = rank;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    t->producer = n;
    return t;
}

int64_t define_value(const Dispatch *d, const char *name) {
    size_t len = strlen(name);
    for (const char *l = d->defines.buf; l && *l;) {
        if (strncmp(l, name, len) == 0 && l[len] == ' ')
            return strtoll(l + len + 1, NULL, 10);
        const char *e = strchr(l, '\n');
        l = e ? e + 1 : NULL;
    }
    return 0;
}

Dispatch *one_row_of(Program *p, const Node *prod, const Dispatch *nd) {
    for (int i = p->ndispatches - 1; i >= 0; i--) {
        Dispatch *d = p->dispatches[i];
        if (d->node == prod && d->one_row)
            return strcmp(d->family, "matvec_k") == 0 && dim_expr_eq(&nd->work, &d->work)
                       ? d : NULL;
    }
    return NULL;
}

bool split_last_off(void) {
    const char *v = getenv("KILN_SPLIT_LAST");
    return v && strcmp(v, "0") == 0;
}

bool every_run(const Dispatch *nd) {
    return nd && nd->dynamic && !nd->variant && nd->work_min == 0 &&
           nd->work_max == INT64_MAX;
}

void bind_counters(Program *p, Dispatch *d, int64_t count) {
    Tensor *t = p->counters;
    if (!t) {
        t = p->counters = graph_tensor(p->graph, "kiln.counters", T_WEIGHT,
                                       (Loc){NULL, 0, 0});
        t->dtype = KILN_DTYPE_I32;
        t->rank = 1;
    }
    int64_t at = t->shape[0];
    t->shape[0] += count;
    t->data = xrealloc(t->data, (size_t)tensor_bytes(t));
    memset(t->data + 4 * at, 0, 4 * (size_t)count);
    /* at its own offset (kernels stay shared) */
    dispatch_arg(d, t, true);
    d->arg_offset[d->nargs - 1] = d->arg_begin[d->nargs - 1] = 4 * (uint64_t)at;
    d->arg_end[d->nargs - 1] = 4 * (uint64_t)(at + count);
}
