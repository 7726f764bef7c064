/*
 * dynamic_dims.c: the dynamic dimensions and their affine expressions
 * (DimExpr): declaring dims, deriving them (derive_dim: a product,
 * quotient, max or min of others), their ranges, and an expression's text
 * in GLSL and for messages. Which axes follow them: dynamic.c.
 */
#include "dynamic.h"

#include <errno.h>
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
    if (declared_dims(g) != g->ndims)
        internal_error("dimension '%s' declared after a derived one", name);
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

int find_dim(const Graph *g, const char *name) {
    for (int i = 0; i < g->ndims; i++)
        if (strcmp(g->dims[i].name, name) == 0)
            return i;
    return -1;
}

/* a op b for values (b >= 1 for DIM_DIV: a quotient rounded down). */
static int64_t dim_op(DimOp op, int64_t a, int64_t b) {
    switch (op) {
    case DIM_MUL: return a * b;
    case DIM_DIV: return a >= 0 ? a / b : -((-a + b - 1) / b);
    case DIM_MAX: return a > b ? a : b;
    case DIM_MIN: return a < b ? a : b;
    default: internal_error("dim op %d", (int)op);
    }
}

/* An operand of a derived dim's name: "seq", or "(past + seq)". */
static char *dim_operand(const Graph *g, const DimExpr *e) {
    int terms = e->c0 != 0;
    for (int i = 0; i < MAX_DIMS; i++)
        terms += e->c[i] != 0;
    char *s = dim_expr_str(g, e);
    return terms > 1 ? format("(%s)", s) : s;
}

/* e times k in out, false where a term overflows or the product is not
 * small (dim_expr_small). */
bool scale_small(const DimExpr *e, int64_t k, DimExpr *out) {
    bool over = __builtin_mul_overflow(e->c0, k, &out->c0);
    for (int i = 0; i < MAX_DIMS; i++)
        over |= __builtin_mul_overflow(e->c[i], k, &out->c[i]);
    return !over && dim_expr_small(out);
}

/* e / k in q where k divides every term of e; false (q untouched)
 * otherwise. */
bool div_exact(const DimExpr *e, int64_t k, DimExpr *q) {
    if (k == 0 || (k == -1 && e->c0 == INT64_MIN) || e->c0 % k)
        return false;
    DimExpr r = {e->c0 / k, {0}};
    for (int i = 0; i < MAX_DIMS; i++) {
        if ((k == -1 && e->c[i] == INT64_MIN) || e->c[i] % k)
            return false;
        r.c[i] = e->c[i] / k;
    }
    *q = r;
    return true;
}

bool derive_dim(Graph *g, DimOp op, const DimExpr *a, const DimExpr *b, DimExpr *out) {
    memset(out, 0, sizeof *out);
    if (!dim_expr_small(a) || !dim_expr_small(b))
        return false;
    int64_t alo = dim_expr_min(g, a), ahi = dim_expr_max(g, a);
    int64_t blo = dim_expr_min(g, b), bhi = dim_expr_max(g, b);
    if (op == DIM_MUL && (dim_expr_const(a) || dim_expr_const(b))) {
        bool ok = dim_expr_const(a) ? scale_small(b, a->c0, out) : scale_small(a, b->c0, out);
        if (!ok)
            memset(out, 0, sizeof *out);
        return ok;
    }
    if (op == DIM_DIV && dim_expr_const(b) && div_exact(a, b->c0, out))
        return true; /* exact: every term divides */
    if (op == DIM_DIV && (alo < 0 || blo < 1))
        return false;
    if (dim_expr_const(a) && dim_expr_const(b)) {
        out->c0 = dim_op(op, a->c0, b->c0);
        return true;
    }
    if ((op == DIM_MAX || op == DIM_MIN) && (alo >= bhi || blo >= ahi)) {
        *out = (alo >= bhi) == (op == DIM_MAX) ? *a : *b; /* the ranges decide */
        return true;
    }
    /* the range: the operation over the operands' ranges' corners */
    int64_t lo, hi;
    if (op == DIM_MUL) {
        int64_t k[4];
        if (__builtin_mul_overflow(alo, blo, &k[0]) || __builtin_mul_overflow(alo, bhi, &k[1]) ||
            __builtin_mul_overflow(ahi, blo, &k[2]) || __builtin_mul_overflow(ahi, bhi, &k[3]))
            return false;
        lo = hi = k[0];
        for (int i = 1; i < 4; i++) {
            lo = k[i] < lo ? k[i] : lo;
            hi = k[i] > hi ? k[i] : hi;
        }
    } else if (op == DIM_DIV) {
        lo = alo / bhi;
        hi = ahi / blo;
    } else {
        lo = dim_op(op, alo, blo);
        hi = dim_op(op, ahi, bhi);
    }
    if (lo == hi) {
        out->c0 = lo;
        return true;
    }
    for (int i = declared_dims(g); i < g->ndims; i++) { /* derived before */
        const DimSym *d = &g->dims[i];
        bool swap = op != DIM_DIV && dim_expr_eq(&d->a, b) && dim_expr_eq(&d->b, a);
        if (d->op == op && ((dim_expr_eq(&d->a, a) && dim_expr_eq(&d->b, b)) || swap)) {
            out->c[i] = 1;
            return true;
        }
    }
    if (g->ndims == MAX_DIMS || hi > 0x7fffffff || lo < -0x7fffffff)
        return false;
    DimSym *d = &g->dims[g->ndims];
    char *x = dim_operand(g, a), *y = dim_operand(g, b);
    d->name = op == DIM_MUL ? format("%s*%s", x, y) : op == DIM_DIV ? format("%s/%s", x, y)
                                                    : format("%s(%s, %s)",
                                                             op == DIM_MAX ? "max" : "min",
                                                             dim_expr_str(g, a),
                                                             dim_expr_str(g, b));
    d->lo = lo;
    d->hi = hi;
    d->op = op;
    d->a = *a;
    d->b = *b;
    out->c[g->ndims++] = 1;
    return true;
}

int64_t dim_expr_max(const Graph *g, const DimExpr *e) {
    int64_t v = e->c0;
    for (int i = 0; i < g->ndims; i++)
        v += e->c[i] * (e->c[i] > 0 ? g->dims[i].hi : g->dims[i].lo);
    return v;
}

int64_t dim_expr_min(const Graph *g, const DimExpr *e) {
    int64_t v = e->c0;
    for (int i = 0; i < g->ndims; i++)
        v += e->c[i] * (e->c[i] > 0 ? g->dims[i].lo : g->dims[i].hi);
    return v;
}

bool dim_expr_small(const DimExpr *e) {
    const int64_t c_limit = (int64_t)1 << 40, k_limit = (int64_t)1 << 20;
    if (e->c0 > c_limit || e->c0 < -c_limit)
        return false;
    for (int i = 0; i < MAX_DIMS; i++)
        if (e->c[i] > k_limit || e->c[i] < -k_limit)
            return false;
    return true;
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

bool dim_expr_const(const DimExpr *e) {
    for (int i = 0; i < MAX_DIMS; i++)
        if (e->c[i])
            return false;
    return true;
}

bool dim_expr_eq(const DimExpr *a, const DimExpr *b) {
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
            str_add(&s, e->c[i] < 0 ? " - " : " + ");
        else if (e->c[i] < 0)
            str_add(&s, "-");
        if (e->c[i] != 1 && e->c[i] != -1)
            str_addf(&s, "%lld*", (long long)(e->c[i] < 0 ? -e->c[i] : e->c[i]));
        str_add(&s, g->dims[i].name);
    }
    if (e->c0 || !s.len)
        str_addf(&s, "%s%lld", s.len ? (e->c0 < 0 ? " - " : " + ") : "",
                 (long long)(s.len && e->c0 < 0 ? -e->c0 : e->c0));
    return s.buf;
}
