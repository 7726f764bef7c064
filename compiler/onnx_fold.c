/*
 * onnx_fold.c: ONNX nodes whose inputs are all constants, folded on the
 * CPU (shape computations: Shape, Gather, Concat, Slice, Transpose,
 * Expand, CumSum, arithmetic, Range, ConstantOfShape, Cast, ...), since kiln's
 * shapes are static; a folded value becomes a weight only if a kernel or an
 * output needs it.
 */
#include "onnx.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- folding constants ---- */

static void unravel(int64_t i, int rank, const int64_t *shape, int64_t *coords) {
    for (int d = rank - 1; d >= 0; d--) {
        coords[d] = shape[d] ? i % shape[d] : 0;
        i = shape[d] ? i / shape[d] : 0;
    }
}

/* The row-major index of coords in shape (unravel's inverse). */
static int64_t ravel(int rank, const int64_t *shape, const int64_t *coords) {
    int64_t i = 0;
    for (int d = 0; d < rank; d++)
        i = i * shape[d] + coords[d];
    return i;
}

/* Index into v of output coordinates broadcast from an output of `rank`. */
static int64_t bcast_index(const Value *v, int rank, const int64_t *coords) {
    int64_t idx = 0;
    for (int d = 0; d < v->rank; d++) {
        int64_t c = coords[d + rank - v->rank];
        idx = idx * v->shape[d] + (v->shape[d] == 1 ? 0 : c);
    }
    return idx;
}

static bool all_const(Ctx *c) {
    for (int i = 0; i < nin(c); i++) {
        Value *v = in_opt(c, i);
        if (v && !v->data)
            return false;
    }
    return true;
}

static Value *const_out(Ctx *c, kiln_dtype dt, int rank, const int64_t *shape) {
    for (int i = 0; i < rank; i++)
        if (shape[i] < 0)
            node_fail(c, format("a folded constant of shape %s", shape_str(rank, shape)));
    if ((double)shape_count(rank, shape) > MAX_CONST_FOLD)
        node_fail(c, "a folded constant is too large");
    return new_value(out_name(c, 0), dt, rank, shape, true);
}

static int fold_axis(Ctx *c, int64_t axis, int rank) {
    if (axis < -rank || axis >= (rank ? rank : 1))
        node_fail(c, format("axis %lld is out of range for rank %d", (long long)axis, rank));
    return (int)(axis < 0 ? axis + rank : axis);
}

/* The index of s in a NULL-terminated list, or -1. */
static int list_index(const char *const *list, const char *s) {
    for (int k = 0; list[k]; k++)
        if (strcmp(list[k], s) == 0)
            return k;
    return -1;
}

/* The operands of an elementwise op folded here: a, b (a again for unary
 * ops) and Where's w (NULL otherwise). False for a variadic Max or Min of
 * more than two inputs (the mapper takes those); a node with the wrong
 * number of inputs is an error, never folded with a missing operand. */
static bool elementwise_operands(Ctx *c, const char *op, Value **a, Value **b, Value **w) {
    static const char *const unary[] = {"Neg", "Abs", "Not", "Floor", "Ceil", "Sqrt",
                                        "Reciprocal", "Relu", NULL};
    bool variadic = strcmp(op, "Max") == 0 || strcmp(op, "Min") == 0;
    int n = strcmp(op, "Where") == 0 ? 3 : list_index(unary, op) >= 0 ? 1 : 2;
    if (variadic && nin(c) > 2)
        return false;
    if (nin(c) != n && !(variadic && nin(c) == 1))
        node_fail(c, format("%s takes %d input%s, not %d", op, n, n > 1 ? "s" : "", nin(c)));
    *a = in(c, 0);
    *b = nin(c) > 1 ? in(c, 1) : *a;
    *w = nin(c) > 2 ? in(c, 2) : NULL;
    return true;
}

/* Elementwise ops over broadcast constants. */
static bool fold_elementwise(Ctx *c, const char *op) {
    static const char *const ops[] = {"Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater",
                                      "LessOrEqual", "GreaterOrEqual", "Max", "Min", "Mod",
                                      "And", "Or", "Where", "Neg", "Abs", "Not", "Floor",
                                      "Ceil", "Sqrt", "Reciprocal", "Pow", "Relu", NULL};
    int k = list_index(ops, op);
    if (k < 0)
        return false;
    Value *a, *b, *w;
    if (!elementwise_operands(c, op, &a, &b, &w))
        return false;
    int rank;
    int64_t shape[MAX_RANK];
    if (!broadcast_shapes(a->rank, a->shape, b->rank, b->shape, &rank, shape) ||
        (w && !broadcast_shapes(rank, shape, w->rank, w->shape, &rank, shape)))
        node_fail(c, "shapes do not broadcast");
    bool cmp = k >= 4 && k <= 8, logic = k == 12 || k == 13 || k == 17;
    Value *x = strcmp(op, "Where") == 0 ? b : a;
    kiln_dtype dt = cmp || logic ? KILN_DTYPE_BOOL : x->dtype;
    Value *o = const_out(c, dt, rank, shape);
    bool ints = is_integral(x->dtype);
    int64_t coords[MAX_RANK];
    for (int64_t i = 0; i < vcount(o); i++) {
        unravel(i, rank, shape, coords);
        int64_t ia = bcast_index(a, rank, coords), ib = bcast_index(b, rank, coords);
        if (strcmp(op, "Where") == 0) {
            int64_t iw = bcast_index(w, rank, coords);
            if (ints)
                vseti(o, i, vget(a, ia) != 0 ? vgeti(b, ib) : vgeti(w, iw));
            else
                vset(o, i, vget(a, ia) != 0 ? vget(b, ib) : vget(w, iw));
            continue;
        }
        if (ints && !cmp) {
            int64_t p = vgeti(a, ia), q = vgeti(b, ib), r = p;
            switch (k) {
            /* Integer arithmetic wraps, as in ONNX runtimes (no C overflow). */
            case 0: r = (int64_t)((uint64_t)p + (uint64_t)q); break;
            case 1: r = (int64_t)((uint64_t)p - (uint64_t)q); break;
            case 2: r = (int64_t)((uint64_t)p * (uint64_t)q); break;
            case 3:
                if (!q)
                    node_fail(c, "division by zero");
                r = q == -1 ? (int64_t)(0 - (uint64_t)p) : p / q;
                break;
            case 9: r = p > q ? p : q; break;
            case 10: r = p < q ? p : q; break;
            case 11:
                if (!q)
                    node_fail(c, "division by zero");
                r = q == -1 ? 0 : p % q;
                if (r && ((r < 0) != (q < 0)))
                    r += q;
                break;
            case 12: r = p && q; break;
            case 13: r = p || q; break;
            case 15: r = -p; break;
            case 16: r = p < 0 ? -p : p; break;
            case 17: r = !p; break;
            case 20: r = (int64_t)sqrt((double)p); break;
            case 21: r = p ? 1 / p : 0; break;
            case 22: r = (int64_t)pow((double)p, (double)q); break;
            case 23: r = p < 0 ? 0 : p; break;
            default: break; /* Floor, Ceil of an integer */
            }
            vseti(o, i, r);
            continue;
        }
        double p = vget(a, ia), q = vget(b, ib), r = 0;
        switch (k) {
        case 0: r = p + q; break;
        case 1: r = p - q; break;
        case 2: r = p * q; break;
        case 3: r = p / q; break;
        case 4: r = p == q; break;
        case 5: r = p < q; break;
        case 6: r = p > q; break;
        case 7: r = p <= q; break;
        case 8: r = p >= q; break;
        case 9: r = fmax(p, q); break;
        case 10: r = fmin(p, q); break;
        case 11:
            r = fmod(p, q);
            if (r != 0 && ((r < 0) != (q < 0)))
                r += q;
            break;
        case 12: r = p != 0 && q != 0; break;
        case 13: r = p != 0 || q != 0; break;
        case 15: r = -p; break;
        case 16: r = fabs(p); break;
        case 17: r = p == 0; break;
        case 18: r = floor(p); break;
        case 19: r = ceil(p); break;
        case 20: r = sqrt(p); break;
        case 21: r = 1 / p; break;
        case 22: r = pow(p, q); break;
        case 23: r = p < 0 ? 0 : p; break; /* Relu; NaN stays */
        default: break;
        }
        vset(o, i, r);
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

/* A constant input that must hold one value (read with vget or vgeti). */
static Value *scalar_in(Ctx *c, int i, const char *what) {
    Value *v = in(c, i);
    if (vcount(v) != 1)
        node_fail(c, format("%s (input %d) must hold one value, not %s", what, i,
                            shape_str(v->rank, v->shape)));
    return v;
}

/* The output dtype of a window or mel matrix (output_datatype, f32 default). */
static kiln_dtype table_dtype(Ctx *c) {
    int dt = kiln_dtype_of((int32_t)oattr_int(c, "output_datatype", 1));
    if (dt < 0)
        node_fail(c, "unsupported: this output_datatype");
    return (kiln_dtype)dt;
}

/* HannWindow, HammingWindow, BlackmanWindow and MelWeightMatrix of constant
 * inputs: tables computed by signal.c. */
static bool fold_signal_table(Ctx *c) {
    const char *op = c->node->op_type;
    static const char *const windows[] = {"", "HannWindow", "HammingWindow",
                                          "BlackmanWindow"};
    for (int kind = WINDOW_HANN; kind < WINDOW_COUNT; kind++) {
        if (strcmp(op, windows[kind]) != 0)
            continue;
        int64_t n = vgeti(scalar_in(c, 0, "the size"), 0);
        if (n < 0 || n > MAX_CONST_FOLD)
            node_fail(c, format("a window of %lld samples", (long long)n));
        Value *o = const_out(c, table_dtype(c), 1, &n);
        double *w = xcalloc((size_t)n + 1, sizeof *w);
        window_values((WindowKind)kind, n, oattr_int(c, "periodic", 1) != 0, w);
        for (int64_t i = 0; i < n; i++)
            vset(o, i, w[i]);
        bind_value(c, out_name(c, 0), o);
        return true;
    }
    if (strcmp(op, "MelWeightMatrix") != 0)
        return false;
    int64_t mels = vgeti(scalar_in(c, 0, "num_mel_bins"), 0);
    int64_t len = vgeti(scalar_in(c, 1, "dft_length"), 0);
    int64_t rate = vgeti(scalar_in(c, 2, "sample_rate"), 0);
    double lo = vget(scalar_in(c, 3, "lower_edge_hertz"), 0);
    double hi = vget(scalar_in(c, 4, "upper_edge_hertz"), 0);
    if (mels < 1 || len < 1 || rate < 1 || len > MAX_CONST_FOLD || mels > MAX_CONST_FOLD ||
        !(lo >= 0 && lo < hi))
        node_fail(c, "MelWeightMatrix needs positive sizes and rate, and 0 <= lower < upper");
    int64_t shape[2] = {len / 2 + 1, mels};
    Value *o = const_out(c, table_dtype(c), 2, shape);
    double *m = xcalloc((size_t)(shape[0] * mels), sizeof *m);
    if (!mel_weight_values(mels, len, (double)rate, lo, hi, m))
        node_fail(c, "MelWeightMatrix: upper_edge_hertz lies past the last DFT bin");
    for (int64_t i = 0; i < shape[0] * mels; i++)
        vset(o, i, m[i]);
    bind_value(c, out_name(c, 0), o);
    return true;
}

/* Constant: its value, float or int attributes. */
static bool fold_constant(Ctx *c) {
    Onnx__AttributeProto *a;
    Value *o;
    if ((a = oattr_typed(c, "value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR)) && a->t) {
        o = decode_tensor(c->path, c->dir, a->t, "the constant", c->loc, false);
    } else if ((a = oattr_typed(c, "value_float", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT)) ||
               (a = oattr_typed(c, "value_int", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT))) {
        bool f = strcmp(a->name, "value_float") == 0;
        o = const_out(c, f ? KILN_DTYPE_F32 : KILN_DTYPE_I64, 0, NULL);
        if (f)
            vset(o, 0, a->f);
        else
            vseti(o, 0, a->i);
    } else if ((a = oattr_typed(c, "value_floats", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS)) ||
               (a = oattr_ints(c, "value_ints"))) {
        bool f = strcmp(a->name, "value_floats") == 0;
        int64_t n = f ? (int64_t)a->n_floats : (int64_t)a->n_ints;
        o = const_out(c, f ? KILN_DTYPE_F32 : KILN_DTYPE_I64, 1, &n);
        for (int64_t i = 0; i < n; i++) {
            if (f)
                vset(o, i, a->floats[i]);
            else
                vseti(o, i, a->ints[i]);
        }
    } else {
        node_fail(c, "unsupported: this kind of Constant (sparse or string)");
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

/* Shape and Size: known at compile time (no dynamic axis). */
static bool fold_shape(Ctx *c) {
    const char *op = c->node->op_type;
    Value *x = in(c, 0);
    /* A dynamic axis's size is its expression of the dims (a value that
     * follows them). */
    Tensor *t = x->t && x->t->dyn_axes ? x->t : NULL;
    if (t && op[1] == 'i') {
        int a = 0, nd = 0;
        for (int d = 0; d < t->rank; d++)
            if (is_dyn(t, d)) {
                a = d;
                nd++;
            }
        if (nd > 1)
            node_fail(c, format("unsupported: Size of '%s', which has %d dynamic axes (a "
                                "product of dims)", x->name, nd));
        Value *o = new_value(out_name(c, 0), KILN_DTYPE_I64, 0, NULL, false);
        o->sym = xcalloc(1, sizeof(DimExpr));
        o->sym[0] = dim_expr_scale(&t->ext[a], vcount(x) / t->shape[a]);
        bind_value(c, out_name(c, 0), o);
        return true;
    }
    if (op[1] == 'i') {
        Value *o = const_out(c, KILN_DTYPE_I64, 0, NULL);
        vseti(o, 0, vcount(x));
        bind_value(c, out_name(c, 0), o);
        return true;
    }
    int64_t start = oattr_int(c, "start", 0), end = oattr_int(c, "end", x->rank);
    start = start < 0 ? start + x->rank : start;
    end = end < 0 ? end + x->rank : end;
    start = start < 0 ? 0 : start > x->rank ? x->rank : start;
    end = end < start ? start : end > x->rank ? x->rank : end;
    int64_t n = end - start;
    bool dyn = false;
    for (int64_t i = 0; t && i < n; i++)
        dyn |= is_dyn(t, (int)(start + i));
    if (dyn) {
        Value *o = new_value(out_name(c, 0), KILN_DTYPE_I64, 1, &n, false);
        o->sym = xcalloc((size_t)n, sizeof(DimExpr));
        for (int64_t i = 0; i < n; i++) {
            int d = (int)(start + i);
            if (is_dyn(t, d))
                o->sym[i] = t->ext[d];
            else
                o->sym[i].c0 = x->shape[d];
        }
        bind_value(c, out_name(c, 0), o);
        return true;
    }
    Value *o = const_out(c, KILN_DTYPE_I64, 1, &n);
    for (int64_t i = 0; i < n; i++)
        vseti(o, i, x->shape[start + i]);
    bind_value(c, out_name(c, 0), o);
    return true;
}

static bool fold_constant_of_shape(Ctx *c) {
    Value *s = in(c, 0);
    int64_t shape[MAX_RANK];
    if (vcount(s) > MAX_RANK)
        node_fail(c, "unsupported: rank above 8");
    for (int64_t i = 0; i < vcount(s); i++)
        shape[i] = vgeti(s, i);
    Onnx__AttributeProto *a = oattr_typed(c, "value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
    Value *fillv = a && a->t ? decode_tensor(c->path, c->dir, a->t, "value", c->loc, false) : NULL;
    Value *o = const_out(c, fillv ? fillv->dtype : KILN_DTYPE_F32, (int)vcount(s), shape);
    for (int64_t i = 0; i < vcount(o); i++) {
        if (fillv && is_integral(fillv->dtype))
            vseti(o, i, vgeti(fillv, 0));
        else
            vset(o, i, fillv ? vget(fillv, 0) : 0);
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

static bool fold_range(Ctx *c) {
    Value *s = in(c, 0), *l = in(c, 1), *d = in(c, 2);
    if (!vcount(s) || !vcount(l) || !vcount(d)) /* (more: the first, as always) */
        node_fail(c, format("Range takes scalars: start, limit and delta have %lld, %lld "
                            "and %lld elements", (long long)vcount(s), (long long)vcount(l),
                            (long long)vcount(d)));
    double start = vget(s, 0), limit = vget(l, 0), delta = vget(d, 0);
    if (delta == 0)
        node_fail(c, "Range with a zero delta");
    /* Range 27's stash_type 0 accumulates f16 in f16, step by step; kiln
     * computes each element as start + i * delta, as stash_type 1 does. */
    if (s->dtype == KILN_DTYPE_F16 && oattr_int(c, "stash_type", 1) == 0)
        node_fail(c, "unsupported: Range's stash_type 0 (f16 accumulation); kiln computes "
                     "each element in double, as stash_type 1 does");
    double nd = ceil((limit - start) / delta);
    if (!(nd <= MAX_CONST_FOLD)) /* a NaN too: an infinite or undefined count */
        node_fail(c, format("Range of %g elements (start %g, limit %g, delta %g): a folded "
                            "constant is too large", nd, start, limit, delta));
    int64_t n = nd > 0 ? (int64_t)nd : 0;
    Value *o = const_out(c, s->dtype, 1, &n);
    for (int64_t i = 0; i < n; i++) {
        if (is_integral(s->dtype))
            vseti(o, i, vgeti(s, 0) + i * vgeti(d, 0));
        else
            vset(o, i, start + (double)i * delta);
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

static bool fold_identity(Ctx *c) {
    Value *x = in(c, 0), *o = new_value(out_name(c, 0), x->dtype, x->rank, x->shape, false);
    o->data = x->data;
    bind_value(c, out_name(c, 0), o);
    return true;
}

static bool fold_cast(Ctx *c) {
    Value *x = in(c, 0);
    int dt = kiln_dtype_of((int32_t)oattr_int(c, "to", 1));
    if (dt < 0)
        return false;
    Value *o = const_out(c, (kiln_dtype)dt, x->rank, x->shape);
    for (int64_t i = 0; i < vcount(o); i++) {
        if (is_integral((kiln_dtype)dt) && is_integral(x->dtype))
            vseti(o, i, vgeti(x, i));
        else if (dt == KILN_DTYPE_BOOL)
            vseti(o, i, vget(x, i) != 0);
        else
            vset(o, i, vget(x, i));
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

static bool fold_concat(Ctx *c) {
    Value *x = in(c, 0);
    int axis = fold_axis(c, oattr_int(c, "axis", 0), x->rank);
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof shape);
    for (int i = 1; i < nin(c); i++) {
        Value *y = in(c, i);
        for (int d = 0; d < x->rank; d++)
            if (y->rank != x->rank || (d != axis && y->shape[d] != x->shape[d]))
                node_fail(c, format("cannot concatenate %s and %s on axis %d",
                                    shape_str(x->rank, x->shape),
                                    shape_str(y->rank, y->shape), axis));
        shape[axis] += y->shape[axis];
    }
    Value *o = const_out(c, x->dtype, x->rank, shape);
    int64_t coords[MAX_RANK];
    for (int64_t i = 0; i < vcount(o); i++) {
        unravel(i, o->rank, shape, coords);
        int k = 0;
        while (coords[axis] >= in(c, k)->shape[axis])
            coords[axis] -= in(c, k++)->shape[axis];
        Value *src = in(c, k);
        vcopy(o, i, src, ravel(src->rank, src->shape, coords));
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

static bool fold_gather(Ctx *c) {
    Value *x = in(c, 0), *idx = in(c, 1);
    int axis = fold_axis(c, oattr_int(c, "axis", 0), x->rank);
    int64_t shape[MAX_RANK], r = 0;
    if (x->rank - 1 + idx->rank > MAX_RANK)
        return false; /* the gather node's shape rule names the rank */
    for (int d = 0; d < axis; d++)
        shape[r++] = x->shape[d];
    for (int d = 0; d < idx->rank; d++)
        shape[r++] = idx->shape[d];
    for (int d = axis + 1; d < x->rank; d++)
        shape[r++] = x->shape[d];
    Value *o = const_out(c, x->dtype, (int)r, shape);
    int64_t inner = shape_count(x->rank - axis - 1, x->shape + axis + 1);
    int64_t n_idx = vcount(idx), len = x->shape[axis];
    for (int64_t i = 0; i < vcount(o); i++) {
        int64_t in_ = i % inner, p = (i / inner) % n_idx, outer = i / (inner * n_idx);
        int64_t k = vgeti(idx, p);
        if (k < 0)
            k += len;
        if (k < 0 || k >= len)
            node_fail(c, format("index %lld is out of range for %lld",
                                (long long)vgeti(idx, p), (long long)len));
        int64_t j = (outer * len + k) * inner + in_;
        vcopy(o, i, x, j);
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

static bool fold_slice(Ctx *c) {
    if (c->opset < 10)
        return false; /* Slice-1 takes attributes: map_slice */
    Value *x = in(c, 0);
    int64_t start[MAX_RANK], step[MAX_RANK], shape[MAX_RANK];
    for (int d = 0; d < x->rank; d++) {
        start[d] = 0;
        step[d] = 1;
        shape[d] = x->shape[d];
    }
    Value *st = in(c, 1), *en = in(c, 2), *ax = in_opt(c, 3), *sp = in_opt(c, 4);
    int64_t n = vcount(st);
    if (n > x->rank || vcount(en) != n || (ax && vcount(ax) != n) || (sp && vcount(sp) != n))
        node_fail(c, format("%lld starts, %lld ends%s%s for a rank-%d input",
                            (long long)n, (long long)vcount(en),
                            ax ? format(", %lld axes", (long long)vcount(ax)) : "",
                            sp ? format(", %lld steps", (long long)vcount(sp)) : "",
                            x->rank));
    for (int64_t i = 0; i < n; i++) {
        int d = ax ? fold_axis(c, vgeti(ax, i), x->rank) : (int)i;
        int64_t dim = x->shape[d], b = vgeti(st, i), e = vgeti(en, i);
        int64_t k = sp ? vgeti(sp, i) : 1;
        if (k == 0)
            node_fail(c, "a slice step is 0");
        shape[d] = slice_axis(dim, &b, e, k);
        start[d] = b;
        step[d] = k;
    }
    Value *o = const_out(c, x->dtype, x->rank, shape);
    int64_t coords[MAX_RANK];
    for (int64_t i = 0; i < vcount(o); i++) {
        unravel(i, x->rank, shape, coords);
        int64_t j = 0;
        for (int d = 0; d < x->rank; d++)
            j = j * x->shape[d] + start[d] + coords[d] * step[d];
        vcopy(o, i, x, j);
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

static bool fold_transpose(Ctx *c) {
    Value *x = in(c, 0);
    int64_t perm[MAX_RANK], shape[MAX_RANK];
    Onnx__AttributeProto *a = oattr_ints(c, "perm");
    if (a && (int)a->n_ints != x->rank)
        node_fail(c, format("perm has %zu entries for rank %d", a->n_ints, x->rank));
    bool seen[MAX_RANK] = {false};
    for (int d = 0; d < x->rank; d++) {
        perm[d] = a ? a->ints[d] : x->rank - 1 - d;
        if (perm[d] < 0 || perm[d] >= x->rank || seen[perm[d]])
            node_fail(c, "perm is not a permutation of the axes");
        seen[perm[d]] = true;
        shape[d] = x->shape[perm[d]];
    }
    if ((double)shape_count(x->rank, shape) > MAX_CONST_FOLD)
        return false; /* a large weight: transposed on the GPU */
    Value *o = const_out(c, x->dtype, x->rank, shape);
    int64_t coords[MAX_RANK], from[MAX_RANK];
    for (int64_t i = 0; i < vcount(o); i++) {
        unravel(i, x->rank, shape, coords);
        for (int d = 0; d < x->rank; d++)
            from[perm[d]] = coords[d];
        vcopy(o, i, x, ravel(x->rank, x->shape, from));
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

/* Expand: the input broadcast to the shape (numpy's rules, both ways). */
static bool fold_expand(Ctx *c) {
    Value *x = in(c, 0), *sv = in(c, 1);
    int64_t want[MAX_RANK], shape[MAX_RANK];
    int n = (int)vcount(sv), rank;
    if (n > MAX_RANK)
        return false; /* the expand node's shape rule names the rank */
    for (int i = 0; i < n; i++)
        want[i] = vgeti(sv, i);
    if (!broadcast_shapes(x->rank, x->shape, n, want, &rank, shape))
        node_fail(c, format("%s does not broadcast to %s", shape_str(x->rank, x->shape),
                            shape_str(n, want)));
    if ((double)shape_count(rank, shape) > MAX_CONST_FOLD)
        return false; /* expanded on the GPU */
    Value *o = const_out(c, x->dtype, rank, shape);
    int64_t coords[MAX_RANK];
    for (int64_t i = 0; i < vcount(o); i++) {
        unravel(i, rank, shape, coords);
        vcopy(o, i, x, bcast_index(x, rank, coords));
    }
    bind_value(c, out_name(c, 0), o);
    return true;
}

/* CumSum of a constant (exporters compute position ids from a mask so). */
static bool fold_cumsum(Ctx *c) {
    Value *x = in(c, 0), *ax = in(c, 1);
    if (vcount(ax) != 1)
        node_fail(c, "CumSum's axis must hold one value");
    int axis = fold_axis(c, vgeti(ax, 0), x->rank);
    bool excl = oattr_int(c, "exclusive", 0) != 0, rev = oattr_int(c, "reverse", 0) != 0;
    Value *o = const_out(c, x->dtype, x->rank, x->shape);
    int64_t len = x->shape[axis], inner = shape_count(x->rank - axis - 1,
                                                      x->shape + axis + 1);
    bool ints = is_integral(x->dtype);
    for (int64_t base = 0; base < vcount(x); base += len * inner)
        for (int64_t in_ = 0; in_ < inner; in_++) {
            int64_t si = 0;
            double sf = 0;
            for (int64_t step = 0; step < len; step++) {
                int64_t j = base + (rev ? len - 1 - step : step) * inner + in_;
                if (excl) {
                    if (ints)
                        vseti(o, j, si);
                    else
                        vset(o, j, sf);
                }
                if (ints)
                    si = (int64_t)((uint64_t)si + (uint64_t)vgeti(x, j));
                else
                    sf += vget(x, j);
                if (!excl) {
                    if (ints)
                        vseti(o, j, si);
                    else
                        vset(o, j, sf);
                }
            }
        }
    bind_value(c, out_name(c, 0), o);
    return true;
}

/* ---- values that follow the dynamic dims ---- */

static bool any_sym(Ctx *c) {
    for (int i = 0; i < nin(c); i++) {
        Value *v = in_opt(c, i);
        if (v && v->sym)
            return true;
    }
    return false;
}

/* Element i of v as an expression: a symbolic value's, or an integer
 * constant's; false for anything else. */
static bool sym_at(const Value *v, int64_t i, DimExpr *e) {
    if (v->sym) {
        *e = v->sym[i];
        return true;
    }
    if (!v->data || !is_integral(v->dtype))
        return false;
    memset(e, 0, sizeof *e);
    e->c0 = vgeti(v, i);
    return true;
}

static bool sym_operands(Ctx *c) {
    for (int i = 0; i < nin(c); i++) {
        Value *v = in_opt(c, i);
        DimExpr e;
        if (v && vcount(v) && !sym_at(v, 0, &e))
            return false;
    }
    return true;
}

/* Binds the output: a constant when every element came out constant. */
static void bind_sym(Ctx *c, kiln_dtype dt, int rank, const int64_t *shape, DimExpr *els) {
    int64_t n = shape_count(rank, shape);
    bool constant = true;
    for (int64_t i = 0; i < n; i++)
        constant &= dim_expr_const(&els[i]);
    Value *o = new_value(out_name(c, 0), dt, rank, shape, constant);
    for (int64_t i = 0; constant && i < n; i++)
        vseti(o, i, els[i].c0);
    if (!constant)
        o->sym = els;
    bind_value(c, out_name(c, 0), o);
}

/* The sign of a - b over every value of the dims: 1 (> 0), -1 (< 0), 0
 * (equal), or 2 when it depends on them. */
static int sym_compare(Ctx *c, const DimExpr *a, const DimExpr *b) {
    DimExpr nb = dim_expr_scale(b, -1), d = dim_expr_add(a, &nb);
    int64_t lo = dim_expr_min(c->g, &d), hi = dim_expr_max(c->g, &d);
    return lo > 0 ? 1 : hi < 0 ? -1 : lo == 0 && hi == 0 ? 0 : 2;
}

static const char *const sym_comparisons[] = {"Equal", "Less", "Greater", "LessOrEqual",
                                              "GreaterOrEqual", NULL};

/* One element of an arithmetic op on expressions; false when kiln does not
 * follow the result as an expression of the dims, declared or derived (the
 * GPU computes it then). */
static bool sym_arith(Ctx *c, const char *op, const DimExpr *a, const DimExpr *b,
                      const DimExpr *w, DimExpr *r) {
    /* operands and results past dim_expr_small's bounds are not followed
     * (no shape of kiln's is that large; the sums could overflow) */
    if (!dim_expr_small(a) || !dim_expr_small(b) || (w && !dim_expr_small(w)))
        return false;
    if (strcmp(op, "Add") == 0) {
        *r = dim_expr_add(a, b);
    } else if (strcmp(op, "Sub") == 0) {
        DimExpr nb = dim_expr_scale(b, -1);
        *r = dim_expr_add(a, &nb);
    } else if (strcmp(op, "Neg") == 0) {
        *r = dim_expr_scale(a, -1);
    } else if (strcmp(op, "Mul") == 0) {
        return derive_dim(c->g, DIM_MUL, a, b, r);
    } else if (strcmp(op, "Div") == 0) {
        /* integers: the quotient rounded toward zero, which is the one
         * rounded down where derive_dim follows it (a >= 0, b >= 1) */
        return derive_dim(c->g, DIM_DIV, a, b, r);
    } else if (strcmp(op, "Max") == 0 || strcmp(op, "Min") == 0) {
        int s = sym_compare(c, a, b);
        if (s != 2)
            *r = (s >= 0) == (op[1] == 'a') ? *a : *b;
        else
            return derive_dim(c->g, op[1] == 'a' ? DIM_MAX : DIM_MIN, a, b, r);
    } else if (strcmp(op, "Where") == 0) {
        if (!dim_expr_const(a))
            return false;
        *r = a->c0 ? *b : *w;
    } else {
        int k = list_index(sym_comparisons, op);
        if (k < 0)
            return false;
        int s = sym_compare(c, a, b);
        if (s == 2)
            return false;
        bool v = k == 0 ? s == 0 : k == 1 ? s < 0 : k == 2 ? s > 0 : k == 3 ? s <= 0 : s >= 0;
        memset(r, 0, sizeof *r);
        r->c0 = v;
    }
    return dim_expr_small(r);
}

static bool fold_sym_arith(Ctx *c, const char *op) {
    static const char *const ops[] = {"Add", "Sub", "Neg", "Mul", "Div", "Max", "Min", "Where",
                                      NULL};
    Value *a, *b, *w;
    if ((list_index(ops, op) < 0 && list_index(sym_comparisons, op) < 0) ||
        !elementwise_operands(c, op, &a, &b, &w))
        return false;
    int rank;
    int64_t shape[MAX_RANK];
    if (!broadcast_shapes(a->rank, a->shape, b->rank, b->shape, &rank, shape) ||
        (w && !broadcast_shapes(rank, shape, w->rank, w->shape, &rank, shape)))
        node_fail(c, "shapes do not broadcast");
    int64_t n = shape_count(rank, shape), coords[MAX_RANK];
    DimExpr *els = xcalloc((size_t)n + 1, sizeof *els);
    bool cmp = list_index(sym_comparisons, op) >= 0;
    for (int64_t i = 0; i < n; i++) {
        unravel(i, rank, shape, coords);
        DimExpr ea, eb, ew = {0};
        sym_at(a, bcast_index(a, rank, coords), &ea);
        sym_at(b, bcast_index(b, rank, coords), &eb);
        if (w)
            sym_at(w, bcast_index(w, rank, coords), &ew);
        if (!sym_arith(c, op, &ea, &eb, &ew, &els[i])) {
            xfree(els);
            return false;
        }
    }
    Value *x = strcmp(op, "Where") == 0 ? b : a;
    bind_sym(c, cmp ? KILN_DTYPE_BOOL : x->dtype, rank, shape, els);
    return true;
}

/* Range with a limit (or start) that follows the dims: a range node whose
 * size follows them. */
static bool fold_sym_range(Ctx *c) {
    DimExpr s, l, d;
    for (int i = 0; i < 3; i++)
        if (nin(c) < 3 || !in_opt(c, i) || !vcount(in(c, i)))
            return false; /* an input without elements: refused as a Range */
    if (!sym_at(in(c, 0), 0, &s) || !sym_at(in(c, 1), 0, &l) || !sym_at(in(c, 2), 0, &d) ||
        !dim_expr_const(&d) || d.c0 == 0 || !dim_expr_small(&s) || !dim_expr_small(&l) ||
        !dim_expr_small(&d))
        return false;
    DimExpr ns = dim_expr_scale(&s, -1), span = dim_expr_add(&l, &ns);
    /* size = ceil(span / delta): exact when delta divides every term of
     * the dims (the constant rounds up), else (span + delta - 1) / delta
     * rounded down, a derived dim (span >= 0, delta > 0; both negated for
     * delta < 0) */
    bool exact = true;
    for (int i = 0; i < MAX_DIMS; i++)
        exact = exact && span.c[i] % d.c0 == 0;
    DimExpr size = span;
    if (exact) {
        size.c0 = span.c0 / d.c0 + (span.c0 % d.c0 != 0 && (span.c0 > 0) == (d.c0 > 0));
        for (int i = 0; i < MAX_DIMS; i++)
            size.c[i] = span.c[i] / d.c0;
    } else {
        int64_t k = d.c0 > 0 ? 1 : -1;
        DimExpr num = dim_expr_scale(&span, k), den = {d.c0 * k, {0}};
        num.c0 += den.c0 - 1;
        if (!derive_dim(c->g, DIM_DIV, &num, &den, &size))
            node_fail(c, format("unsupported: a Range of (%s) / %lld elements, negative for "
                                "some dims (kiln follows sizes that stay at 0 or more)",
                                dim_expr_str(c->g, &span), (long long)d.c0));
    }
    if (dim_expr_min(c->g, &size) < 0)
        node_fail(c, format("unsupported: a Range of %s elements, negative for some dims "
                            "(kiln follows sizes that stay at 0 or more)",
                            dim_expr_str(c->g, &size)));
    range_node(c, &size, &s, d.c0, in(c, 0)->dtype, out_name(c, 0));
    return true;
}

/* Ops that only move elements (Gather, Slice, Concat, Transpose, Expand,
 * Identity and the views) fold a symbolic value through their constant
 * folding: the value's data inputs become the numbers of their elements,
 * the folder moves those, and the output's numbers name its elements. */
static bool fold_sym_moves(Ctx *c, const char *op) {
    /* folded by fold(); the views by map_view, which keeps a constant one */
    static const char *const folded[] = {"Gather", "Slice", "Concat", "Transpose", "Expand",
                                         "Identity", NULL};
    static const OnnxOp views[] = {{"Reshape", map_view, OP_RESHAPE, NULL},
                                   {"Squeeze", map_view, OP_SQUEEZE, NULL},
                                   {"Unsqueeze", map_view, OP_UNSQUEEZE, NULL},
                                   {"Flatten", map_view, OP_FLATTEN, NULL}};
    const OnnxOp *view = NULL;
    for (size_t v = 0; v < sizeof views / sizeof views[0]; v++)
        if (strcmp(views[v].name, op) == 0)
            view = &views[v];
    /* a result without a name (an output ONNX may omit, which these ops'
     * is not) binds nothing to fold into: mapped as it is */
    if ((!view && list_index(folded, op) < 0) || !*out_name(c, 0))
        return false;
    int ndata = strcmp(op, "Concat") == 0 ? nin(c) : 1;
    for (int i = ndata; i < nin(c); i++) { /* indices, bounds, shapes: constants */
        Value *v = in_opt(c, i);
        if (v && !v->data)
            return false;
    }
    int64_t total = 0;
    for (int i = 0; i < ndata; i++)
        total += vcount(in(c, i));
    DimExpr *table = xcalloc((size_t)total + 1, sizeof *table);
    Value **saved = xcalloc((size_t)ndata, sizeof *saved);
    int64_t at = 0;
    for (int i = 0; i < ndata; i++) /* first: an input may come twice */
        saved[i] = in(c, i);
    for (int i = 0; i < ndata; i++) {
        Value *v = saved[i];
        Value *numbers = new_value(v->name, KILN_DTYPE_I64, v->rank, v->shape, true);
        for (int64_t j = 0; j < vcount(v); j++) {
            if (!sym_at(v, j, &table[at]))
                return false; /* not reached: sym_operands checked */
            vseti(numbers, j, at++);
        }
        map_put(&c->values, c->node->input[i], numbers);
    }
    /* a view of a constant is one; fold() may decline (indices it does
     * not take, say): then nothing was bound, and the node is mapped as
     * it is. The result is read before the inputs come back (an output
     * may bear an input's name). */
    bool folded_it = true;
    if (view)
        map_view(c, view);
    else
        folded_it = fold(c);
    Value *o = folded_it ? map_get(&c->values, out_name(c, 0)) : NULL;
    for (int i = ndata - 1; i >= 0; i--)
        map_put(&c->values, c->node->input[i], saved[i]);
    if (!folded_it)
        return false;
    if (!o || !o->data)
        internal_error("node %s: a symbolic value moved into a non-constant", c->nname);
    int64_t n = vcount(o);
    DimExpr *els = xcalloc((size_t)n + 1, sizeof *els);
    for (int64_t j = 0; j < n; j++)
        els[j] = table[vgeti(o, j)];
    bind_sym(c, saved[0]->dtype, o->rank, o->shape, els);
    return true;
}

/* A node with an input that follows the dims: folded when every input is
 * an integer constant or a symbolic value and kiln can follow the op;
 * false otherwise (the node is then mapped, and its symbolic inputs
 * computed on the GPU). */
static bool fold_sym(Ctx *c) {
    const char *op = c->node->op_type;
    if (!sym_operands(c))
        return false;
    if (strcmp(op, "Range") == 0)
        return fold_sym_range(c);
    if (strcmp(op, "Cast") == 0) {
        int dt = kiln_dtype_of((int32_t)oattr_int(c, "to", 1));
        if (dt < 0 || !is_integral((kiln_dtype)dt) || dt == KILN_DTYPE_BOOL)
            return false;
        Value *x = in(c, 0);
        bind_sym(c, (kiln_dtype)dt, x->rank, x->shape, x->sym);
        return true;
    }
    if (fold_sym_moves(c, op))
        return true;
    return fold_sym_arith(c, op);
}

typedef struct Folder {
    const char *op;
    bool (*fold)(Ctx *c);
    bool any_inputs; /* folds inputs that are not constants (their shapes) */
} Folder;

/* The ONNX ops folded on the CPU when their inputs are constants (a
 * Reshape, Squeeze, Unsqueeze or Flatten of a constant is a kiln view,
 * whose shape rule computes it: map_view). */
static const Folder folders[] = {
    {"Constant", fold_constant, true},
    {"Shape", fold_shape, true},
    {"Size", fold_shape, true},
    {"ConstantOfShape", fold_constant_of_shape, false},
    {"Range", fold_range, false},
    {"Identity", fold_identity, false},
    {"Cast", fold_cast, false},
    {"Concat", fold_concat, false},
    {"Gather", fold_gather, false},
    {"Slice", fold_slice, false},
    {"Transpose", fold_transpose, false},
    {"Expand", fold_expand, false},
    {"CumSum", fold_cumsum, false},
    {"HannWindow", fold_signal_table, false},
    {"HammingWindow", fold_signal_table, false},
    {"BlackmanWindow", fold_signal_table, false},
    {"MelWeightMatrix", fold_signal_table, false},
};

/* Folds the node when it computes a constant; false when it does not. */
bool fold(Ctx *c) {
    const char *op = c->node->op_type;
    if (any_sym(c) && strcmp(op, "Shape") != 0 && strcmp(op, "Size") != 0)
        return fold_sym(c);
    for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++)
        if (strcmp(folders[i].op, op) == 0)
            return (folders[i].any_inputs || all_const(c)) && folders[i].fold(c);
    return all_const(c) && fold_elementwise(c, op);
}
