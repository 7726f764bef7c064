/*
 * op_params.c: what a node's attributes and inputs mean, decoded once for
 * shape inference, the dynamic rules and lowering alike: attribute access
 * with located errors, axes, slice and split parameters, windows of
 * convolutions and pools, resize, attention and spectral geometry.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
        node_error_at(n, loc, "%s must be an integer, not '%s'", key, s);
    return v;
}

/* The default an op's ops.def row gives key: "" when the row lists key
 * without one; a key the row does not list is a bug in the caller. */
static const char *row_default(Node *n, const char *key) {
    const char *d = op_attr_default(n->op, key);
    if (!d)
        internal_error("op %s reads attribute '%s', which its ops.def row does not list",
                       op_info[n->op].name, key);
    return d;
}

/* The attribute's text: the node's own, else its row's default, else (the
 * row gives none) an error naming it. */
static const char *attr_text(Node *n, const char *key, const char *what, Loc *loc) {
    Attr *a = node_attr(n, key);
    if (a) {
        if (a->is_list)
            node_error_at(n, a->loc, "%s must be %s, not a list", key, what);
        *loc = a->loc;
        return a->scalar;
    }
    const char *d = row_default(n, key);
    if (!*d)
        node_error(n, "%s needs the attribute %s (it has no default)", op_info[n->op].name,
                   key);
    *loc = n->loc;
    return d;
}

static double parse_float_at(Node *n, const char *key, const char *s, Loc loc) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno == ERANGE || !isfinite(v))
        node_error_at(n, loc, "%s must be a finite number, not '%s'", key, s);
    return v;
}

int64_t attr_int(Node *n, const char *key) {
    Loc loc;
    const char *s = attr_text(n, key, "an integer", &loc);
    return parse_int_at(n, key, s, loc);
}

double attr_float(Node *n, const char *key) {
    Loc loc;
    const char *s = attr_text(n, key, "a number", &loc);
    return parse_float_at(n, key, s, loc);
}

/* For the attributes whose default is computed from the node (attention's
 * scale, rope's n_rot): the row lists them without a default. */
static void check_computed_default(Node *n, const char *key) {
    if (*row_default(n, key))
        internal_error("op %s: attribute '%s' has a default in its ops.def row; read it "
                       "with attr_int or attr_float", op_info[n->op].name, key);
}

bool parse_dim_expr(const Graph *g, const char *s, DimExpr *e) {
    memset(e, 0, sizeof *e);
    const char *p = s;
    int sign = 1, terms = 0;
    for (;;) {
        while (*p == ' ')
            p++;
        if (!*p)
            return terms > 0;
        if (terms) { /* an operator between terms */
            if (*p != '+' && *p != '-')
                return false;
            sign = *p++ == '-' ? -1 : 1;
            while (*p == ' ')
                p++;
        } else if (*p == '-') {
            sign = -1;
            p++;
        }
        int64_t k = 1;
        bool num = false;
        if (*p >= '0' && *p <= '9') {
            char *end;
            errno = 0;
            k = strtoll(p, &end, 10);
            if (errno)
                return false;
            p = end;
            num = true;
            while (*p == ' ')
                p++;
            if (*p != '*') {
                e->c0 += sign * k;
                terms++;
                continue;
            }
            p++;
            while (*p == ' ')
                p++;
        }
        const char *name = p;
        int d = -1;
        size_t best = 0; /* a derived dim's name ("b*seq", "(seq + 1)/2"), the longest */
        for (int i = declared_dims(g); i < g->ndims; i++) {
            size_t len = strlen(g->dims[i].name);
            if (len > best && strncmp(g->dims[i].name, p, len) == 0 &&
                strchr(" +-", p[len] ? p[len] : ' ')) {
                d = i;
                best = len;
            }
        }
        if (d >= 0) {
            p += best;
        } else {
            while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                   (*p >= '0' && *p <= '9') || *p == '_')
                p++;
            if (p == name)
                return false;
            for (int i = 0; i < declared_dims(g); i++)
                if (strlen(g->dims[i].name) == (size_t)(p - name) &&
                    strncmp(g->dims[i].name, name, (size_t)(p - name)) == 0)
                    d = i;
        }
        if (d < 0)
            return false;
        while (*p == ' ')
            p++;
        if (!num && *p == '*') { /* name * k */
            char *end;
            p++;
            errno = 0;
            k = strtoll(p, &end, 10);
            if (end == p || errno)
                return false;
            p = end;
        }
        e->c[d] += sign * k;
        terms++;
    }
}

DimExpr attr_dims(Node *n, const char *key) {
    Loc loc;
    const char *s = attr_text(n, key, "a dims expression", &loc);
    DimExpr e;
    if (!n->graph || !parse_dim_expr(n->graph, s, &e))
        node_error_at(n, loc, "%s must be an integer or an expression of the dims (\"past "
                      "+ seq\", \"2*seq - 1\"), not '%s'", key, s);
    return e;
}

int64_t attr_int_or(Node *n, const char *key, int64_t computed) {
    check_computed_default(n, key);
    return node_attr(n, key) ? attr_int(n, key) : computed;
}

double attr_float_or(Node *n, const char *key, double computed) {
    check_computed_default(n, key);
    return node_attr(n, key) ? attr_float(n, key) : computed;
}

int attr_ints(Node *n, const char *key, int64_t *out, int max) {
    Attr *a = node_attr(n, key);
    if (!a)
        return -1;
    if (!a->is_list)
        node_error_at(n, a->loc, "%s must be a list of integers", key);
    if (a->nitems > max)
        node_error_at(n, a->loc, "%s has %d items, at most %d allowed",
                      key, a->nitems, max);
    for (int i = 0; i < a->nitems; i++)
        out[i] = parse_int_at(n, key, a->items[i], a->item_locs[i]);
    return a->nitems;
}

Loc attr_loc(Node *n, const char *key) {
    Attr *a = node_attr(n, key);
    return a ? a->loc : n->loc;
}

/* A number attribute (default dflt) that must be positive: eps, rates. */
double positive_float(Node *n, const char *key) {
    double v = attr_float(n, key);
    if (!(v > 0))
        node_error_at(n, attr_loc(n, key), "%s must be positive, got %g", key, v);
    return v;
}

/* Normalizes a possibly negative axis against rank; errors when outside. */
int norm_axis(Node *n, const char *key, int64_t axis, int rank) {
    if (axis < -rank || axis >= rank)
        node_error_at(n, attr_loc(n, key), "%s %lld is out of range for rank %d", key,
                      (long long)axis, rank);
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
            node_error(n, "%s of a scalar", op_info[n->op].name);
        axes[0] = norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
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

int64_t slice_axis(int64_t dim, int64_t *start, int64_t end, int64_t step) {
    int64_t s = *start, e = end;
    /* ONNX semantics: negative indices count from the end, then clamp. */
    if (s < 0)
        s += dim;
    if (e < 0)
        e += dim;
    int64_t count;
    if (step > 0) {
        s = s < 0 ? 0 : s > dim ? dim : s;
        e = e < 0 ? 0 : e > dim ? dim : e;
        count = e > s ? (e - s + step - 1) / step : 0;
    } else {
        s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
        e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
        count = s > e ? (s - e + (-step) - 1) / (-step) : 0;
    }
    *start = s;
    return count;
}

/* Reads a list of axes of a tensor of `rank` into `axes` (normalized),
 * rejecting repeats; returns the count, or -1 when absent. */
int attr_axes(Node *n, const char *key, int rank, int *axes) {
    int64_t v[MAX_RANK];
    int k = attr_ints(n, key, v, MAX_RANK);
    bool seen[MAX_RANK] = {0};
    for (int i = 0; i < k; i++) {
        axes[i] = norm_axis(n, key, v[i], rank);
        if (seen[axes[i]])
            node_error_at(n, attr_loc(n, key), "%s names axis %d twice",
                          key, axes[i]);
        seen[axes[i]] = true;
    }
    return k;
}

void slice_params(Node *n, int64_t *start, int64_t *step, int64_t *out_shape) {
    Tensor *x = n->inputs[0];
    int64_t starts[MAX_RANK], ends[MAX_RANK], steps[MAX_RANK];
    int axes[MAX_RANK];
    int ns = attr_ints(n, "starts", starts, MAX_RANK);
    int ne = attr_ints(n, "ends", ends, MAX_RANK);
    if (ns < 0 || ne < 0)
        node_error(n, "slice needs starts and ends");
    if (ns != ne)
        node_error_at(n, attr_loc(n, "ends"), "%d starts but %d ends", ns, ne);
    int na = attr_axes(n, "axes", x->rank, axes);
    if (na < 0)
        for (na = 0; na < ns; na++)
            axes[na] = na;
    if (na != ns || ns > x->rank)
        node_error_at(n, attr_loc(n, na != ns ? "axes" : "starts"), "%d starts for "
                      "%d axes of a rank-%d input", ns, na, x->rank);
    int nst = attr_ints(n, "steps", steps, MAX_RANK);
    if (nst < 0)
        for (nst = 0; nst < ns; nst++)
            steps[nst] = 1;
    if (nst != ns)
        node_error_at(n, attr_loc(n, "steps"), "%d steps for %d starts", nst,
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
            node_error_at(n, attr_loc(n, "steps"), "a step is 0");
        out_shape[d] = slice_axis(dim, &s, e, st);
        start[d] = out_shape[d] ? s : 0;
        step[d] = st;
    }
}

/* split: outputs along axis, sizes given or equal. */
int64_t *split_sizes(Node *n, int *axis_out) {
    Tensor *x = n->inputs[0];
    if (x->rank < 1)
        node_error(n, "split of a scalar");
    int axis = norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
    int64_t dim = x->shape[axis];
    Attr *a = node_attr(n, "sizes");
    int given = a && a->is_list ? a->nitems : 0;
    int64_t *sizes = xcalloc((size_t)(given > n->noutputs ? given : n->noutputs) + 1,
                             sizeof(int64_t));
    int k = attr_ints(n, "sizes", sizes, given);
    if (k < 0) {
        if (dim % n->noutputs)
            node_error(n, "axis %d of size %lld does not split into %d "
                       "equal parts; give sizes", axis, (long long)dim,
                       n->noutputs);
        for (int i = 0; i < n->noutputs; i++)
            sizes[i] = dim / n->noutputs;
    } else {
        int64_t sum = 0;
        if (k != n->noutputs)
            node_error_at(n, attr_loc(n, "sizes"), "%d sizes for %d outputs",
                          k, n->noutputs);
        for (int i = 0; i < k; i++) {
            if (sizes[i] < 0)
                node_error_at(n, attr_loc(n, "sizes"), "a negative size");
            sum = sum > INT64_MAX - sizes[i] ? INT64_MAX : sum + sizes[i];
        }
        if (sum != dim)
            node_error_at(n, attr_loc(n, "sizes"), "sizes add up to %lld, axis %d has "
                          "%lld", (long long)sum, axis, (long long)dim);
    }
    *axis_out = axis;
    return sizes;
}

int64_t block_of(Node *n, Tensor *x) {
    if (x->rank != 4)
        node_error(n, "%s needs an [N, C, H, W] input, got %s",
                   op_info[n->op].name, shape_str(x->rank, x->shape));
    int64_t b = attr_int(n, "block");
    if (b < 1)
        node_error_at(n, node_attr(n, "block") ? attr_loc(n, "block") : n->loc,
                      "block must be a positive integer");
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
    node_error_at(n, a->loc, "mode must be DCR or CRD");
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
    node_error_at(n, a->loc, "reduction must be none, add, mul, max or min");
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
    node_error_at(n, a->loc, "mode must be constant, reflect or edge");
}

/* attention(q, k, v, [mask]). layout bhsd: q [B, H, Sq, D], k [B, KVH, Sk, D],
 * v [B, KVH, Sk, DV]. layout bshd: q [B, Sq, H*D], k [B, Sk, KVH*D],
 * v [B, Sk, KVH*DV] with heads (and kv_heads) given. H divides by KVH. The
 * mask is additive f32, broadcast to [B, H, Sq, Sk]. out_layout (default:
 * layout) is the output's: bhsd [B, H, Sq, DV], bshd [B, Sq, H*DV]. */
void attention_dims(Node *n, AttentionDims *a) {
    Tensor *q = n->inputs[0], *k = n->inputs[1], *v = n->inputs[2];
    Attr *lay = node_attr(n, "layout");
    const char *layout = lay && !lay->is_list ? lay->scalar : "bhsd";
    a->bshd = strcmp(layout, "bshd") == 0;
    if (!a->bshd && strcmp(layout, "bhsd") != 0)
        node_error_at(n, lay->loc, "layout must be bhsd or bshd");
    if (node_attr(n, "head_dim") && (!a->bshd || n->op != OP_ATTENTION))
        node_error_at(n, attr_loc(n, "head_dim"), "head_dim (q, k and v at offsets in wider "
                      "rows) takes attention with layout bshd only");
    int want = a->bshd ? 3 : 4;
    for (int i = 0; i < 3; i++)
        if (n->inputs[i]->rank != want)
            node_error_at(n, n->input_locs[i], "with layout %s, '%s' must have rank %d, "
                          "not %s", layout, n->inputs[i]->name, want,
                          shape_str(n->inputs[i]->rank, n->inputs[i]->shape));
    a->B = q->shape[0];
    static const char *const offs[3] = {"q_offset", "k_offset", "v_offset"};
    for (int i = 0; i < 3; i++) {
        a->off[i] = 0;
        if (node_attr(n, offs[i]) && !node_attr(n, "head_dim"))
            node_error_at(n, attr_loc(n, offs[i]), "%s needs head_dim (and layout bshd)",
                          offs[i]);
    }
    if (a->bshd) {
        a->H = attr_int(n, "heads");
        bool packed = node_attr(n, "head_dim") != NULL;
        if (a->H < 1 || (!packed && q->shape[2] % a->H))
            node_error_at(n, node_attr(n, "heads") ? attr_loc(n, "heads") : n->loc,
                          "layout bshd needs heads, a positive divisor of %lld",
                          (long long)q->shape[2]);
        a->KVH = attr_int_or(n, "kv_heads", a->H);
        if (a->KVH < 1 || (!packed && (k->shape[2] % a->KVH || v->shape[2] % a->KVH)))
            node_error_at(n, node_attr(n, "kv_heads") ? attr_loc(n, "kv_heads") : n->loc,
                          "kv_heads must divide the key and value widths");
        a->Sq = q->shape[1];
        a->Sk = k->shape[1];
        a->D = packed ? attr_int(n, "head_dim") : q->shape[2] / a->H;
        a->DV = packed ? a->D : v->shape[2] / a->KVH;
        for (int i = 0; i < 3; i++) {
            int64_t width = (i ? a->KVH : a->H) * a->D, row = n->inputs[i]->shape[2];
            a->off[i] = packed && node_attr(n, offs[i]) ? attr_int(n, offs[i]) : 0;
            a->row[i] = row;
            if (packed && (a->D < 1 || a->off[i] < 0 || a->off[i] + width > row))
                node_error_at(n, node_attr(n, offs[i]) ? attr_loc(n, offs[i])
                                                       : attr_loc(n, "head_dim"),
                              "%c's %lld heads of head_dim %lld at %s %lld pass the end of "
                              "'%s''s rows of %lld", "qkv"[i], (long long)(i ? a->KVH : a->H),
                              (long long)a->D, offs[i], (long long)a->off[i],
                              n->inputs[i]->name, (long long)row);
        }
        if ((!packed && k->shape[2] / a->KVH != a->D) || v->shape[1] != a->Sk ||
            k->shape[0] != a->B || v->shape[0] != a->B)
            node_error(n, "q %s, k %s and v %s do not agree",
                       shape_str(3, q->shape), shape_str(3, k->shape), shape_str(3, v->shape));
    } else {
        a->H = q->shape[1];
        a->KVH = k->shape[1];
        a->Sq = q->shape[2];
        a->Sk = k->shape[2];
        a->D = q->shape[3];
        a->DV = v->shape[3];
        for (int i = 0; i < 3; i++)
            a->row[i] = n->inputs[i]->shape[3];
        if (k->shape[0] != a->B || v->shape[0] != a->B || v->shape[1] != a->KVH ||
            v->shape[2] != a->Sk || k->shape[3] != a->D)
            node_error(n, "q %s, k %s and v %s do not agree",
                       shape_str(4, q->shape), shape_str(4, k->shape), shape_str(4, v->shape));
    }
    if (a->KVH < 1 || a->H % a->KVH)
        node_error(n, "%lld query heads do not divide into %lld key/value "
                   "heads", (long long)a->H, (long long)a->KVH);
    if (a->D > 1024)
        node_error(n, "head size %lld exceeds 1024", (long long)a->D);
    Attr *out = node_attr(n, "out_layout");
    a->out_bshd = a->bshd;
    if (out) {
        a->out_bshd = !out->is_list && strcmp(out->scalar, "bshd") == 0;
        if (!a->out_bshd && (out->is_list || strcmp(out->scalar, "bhsd") != 0))
            node_error_at(n, out->loc, "out_layout must be bhsd or bshd");
    }
}

/* Reads an attribute of `n` spatial values (default dflt each). */
static void spatial_attr(Node *n, const char *key, int nsp, int64_t dflt, int64_t *out) {
    int k = attr_ints(n, key, out, 2 * MAX_RANK);
    if (k < 0)
        for (k = 0; k < nsp; k++)
            out[k] = dflt;
    if (k != nsp)
        node_error_at(n, attr_loc(n, key), "%s needs %d values, one per spatial axis", key, nsp);
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
        node_error_at(n, attr_loc(n, "pads"), "pads needs %d values (the beginnings, then "
                      "the ends)", 2 * nsp);
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
            node_error_at(n, ap->loc, "auto_pad must be notset, same_upper, same_lower "
                          "or valid");
    }
    int64_t outpad[MAX_RANK] = {0};
    if (transposed)
        spatial_attr(n, "output_padding", nsp, 0, outpad);
    bool ceil_mode = op_attr_default(n->op, "ceil_mode") && attr_int(n, "ceil_mode");
    for (int i = 0; i < nsp; i++) {
        if (w->stride[i] < 1 || w->dil[i] < 1)
            node_error(n, "strides and dilations must be positive");
        if (pads[i] < 0 || pads[i + nsp] < 0)
            node_error_at(n, attr_loc(n, "pads"), "negative pads");
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
                node_error(n, "the window (%lld) is larger than the padded "
                           "input (%lld) on spatial axis %d", (long long)span,
                           (long long)(in[i] + w->pad_begin[i] + w->pad_end[i]), i);
            w->out[i] = (ceil_mode ? (room + w->stride[i] - 1) / w->stride[i]
                                   : room / w->stride[i]) + 1;
            /* The last window must start inside the input or its left padding. */
            if (ceil_mode && (w->out[i] - 1) * w->stride[i] >= in[i] + w->pad_begin[i])
                w->out[i]--;
        }
        if (w->out[i] < 1)
            node_error(n, "spatial axis %d would have size %lld", i,
                       (long long)w->out[i]);
    }
}

/* resize: scales (floats) or sizes (ints), one per axis; or both, sizes the
 * output's and scales the scale that maps its coordinates (ONNX's
 * keep_aspect_ratio_policy). */
void resize_geometry(Node *n, double *scales, int64_t *out) {
    Tensor *x = n->inputs[0];
    Attr *sc = node_attr(n, "scales"), *sz = node_attr(n, "sizes");
    if (!sc && !sz)
        node_error(n, "resize needs scales or sizes (or both)");
    if (sz) {
        if (attr_ints(n, "sizes", out, MAX_RANK) != x->rank)
            node_error_at(n, sz->loc, "sizes needs %d values", x->rank);
        for (int i = 0; i < x->rank; i++) {
            if (out[i] < 1 || x->shape[i] < 1)
                node_error_at(n, sz->loc, "sizes must be positive");
            scales[i] = (double)out[i] / (double)x->shape[i];
        }
    }
    if (sc) {
        if (!sc->is_list || sc->nitems != x->rank)
            node_error_at(n, sc->loc, "scales needs %d values", x->rank);
        for (int i = 0; i < x->rank; i++) {
            char *end;
            scales[i] = strtod(sc->items[i], &end);
            if (*end || !(scales[i] > 0) || !isfinite(scales[i]))
                node_error_at(n, sc->item_locs[i], "scales must be positive numbers");
            if (sz)
                continue;
            out[i] = (int64_t)floor((double)x->shape[i] * scales[i]);
            if (out[i] < 1)
                node_error_at(n, sc->item_locs[i], "axis %d would have size %lld", i,
                              (long long)out[i]);
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
    node_error_at(n, a ? a->loc : n->loc, "%s must be one of %s", key, list.buf);
}

const char *const resize_modes[] = {"nearest", "linear", "cubic"};
const char *const resize_coords[] = {"half_pixel", "asymmetric", "align_corners",
                                     "pytorch_half_pixel", "tf_half_pixel_for_nn",
                                     "tf_crop_and_resize", "half_pixel_symmetric"};
const char *const grid_sample_pads[] = {"zeros", "border", "reflection"};
const char *const roi_align_modes[] = {"avg", "max"};
const char *const roi_align_coords[] = {"half_pixel", "output_half_pixel"};
const char *const resize_nearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                      "ceil"};

int64_t positive_value(Node *n, const char *key, int64_t v, int64_t most) {
    if (v < 1 || v > most)
        node_error_at(n, attr_loc(n, key), "%s must be from 1 to %lld", key, (long long)most);
    return v;
}

int64_t positive_attr(Node *n, const char *key, int64_t most) {
    if (!node_attr(n, key) && !*row_default(n, key))
        node_error(n, "%s must be from 1 to %lld (it has no default)", key, (long long)most);
    return positive_value(n, key, attr_int(n, key), most);
}

static void flag_attr(Node *n, const char *key) {
    int64_t v = attr_int(n, key);
    if (v != 0 && v != 1)
        node_error_at(n, attr_loc(n, key), "%s must be 0 or 1", key);
}

/* Transforms longer than this are refused: past 2048 points the sum is
 * direct, O(L^2), and an invocation of it loops L times (lavapipe stops at
 * 65535 iterations). */
#define SPECTRAL_MAX_L (1 << 14)

/* Frames of length L, step apart, over time samples: at least one. */
static int64_t frame_count(Node *n, int64_t time, int64_t L, int64_t step, const char *what) {
    if (L > time)
        node_error(n, "the %s (%lld) is longer than the signal (%lld samples)", what,
                   (long long)L, (long long)time);
    return (time - L) / step + 1;
}

void spectral_params(Node *n, Spectral *sp) {
    Tensor *x = n->inputs[0];
    memset(sp, 0, sizeof *sp);
    sp->window = WINDOW_RECT;
    if (n->op == OP_DFT) {
        if (x->rank < 2 || (x->shape[x->rank - 1] != 1 && x->shape[x->rank - 1] != 2))
            node_error_at(n, n->input_locs[0], "dft needs [..., N, ..., 1 or 2] (real, or "
                          "real and imaginary last), not %s", shape_str(x->rank, x->shape));
        int axis = norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
        if (axis == x->rank - 1)
            node_error_at(n, attr_loc(n, "axis"), "axis %d holds the real and imaginary "
                          "parts, not the signal", axis);
        flag_attr(n, "inverse");
        flag_attr(n, "onesided");
        sp->inverse = attr_int(n, "inverse") != 0;
        if (sp->inverse && attr_int(n, "onesided"))
            node_error_at(n, attr_loc(n, "onesided"), "unsupported: a one-sided inverse "
                          "transform (irfft)");
        int64_t N = x->shape[axis];
        sp->C = x->shape[x->rank - 1];
        sp->L = node_attr(n, "length") ? positive_attr(n, "length", SPECTRAL_MAX_L) : N;
        if (sp->L < 1)
            node_error_at(n, n->input_locs[0], "an empty signal axis");
        sp->nin = N < sp->L ? N : sp->L;
        sp->outer = shape_count(axis, x->shape);
        sp->inner = shape_count(x->rank - 1 - axis - 1, x->shape + axis + 1);
        sp->in_so = N * sp->inner * sp->C;
        sp->in_si = sp->C;
        sp->in_sj = sp->inner * sp->C;
        sp->nout = attr_int(n, "onesided") ? sp->L / 2 + 1 : sp->L;
        return;
    }
    if (n->op == OP_STFT) {
        bool complex_ = x->rank == 3 && x->shape[2] == 2;
        if (!(x->rank == 2 || (x->rank == 3 && (x->shape[2] == 1 || x->shape[2] == 2))))
            node_error_at(n, n->input_locs[0], "stft needs a signal [batch, time] or "
                          "[batch, time, 1 or 2], not %s", shape_str(x->rank, x->shape));
        int64_t T = x->shape[1];
        Tensor *w = n->ninputs > 1 ? n->inputs[1] : NULL;
        if (w && w->rank != 1)
            node_error_at(n, n->input_locs[1], "the window '%s' must be 1-D, not %s", w->name,
                          shape_str(w->rank, w->shape));
        if (!w && !node_attr(n, "frame_length"))
            node_error(n, "stft needs a window input or a frame_length");
        sp->L = w ? w->shape[0] : positive_attr(n, "frame_length", SPECTRAL_MAX_L);
        if (w && node_attr(n, "frame_length") && attr_int(n, "frame_length") != sp->L)
            node_error_at(n, attr_loc(n, "frame_length"), "frame_length %lld differs from "
                          "the window's %lld", (long long)attr_int(n, "frame_length"),
                          (long long)sp->L);
        if (sp->L < 1 || sp->L > SPECTRAL_MAX_L)
            node_error_at(n, n->input_locs[1], "a window of %lld samples",
                          (long long)sp->L);
        flag_attr(n, "onesided");
        sp->step = positive_attr(n, "frame_step", T);
        sp->C = complex_ ? 2 : 1;
        sp->outer = x->shape[0];
        sp->inner = frame_count(n, T, sp->L, sp->step, "frame");
        sp->nin = sp->L;
        sp->in_so = T * sp->C;
        sp->in_si = sp->step * sp->C;
        sp->in_sj = sp->C;
        sp->nout = attr_int(n, "onesided") ? sp->L / 2 + 1 : sp->L;
        return;
    }
    /* log_mel, welch: real [..., time], framed along the last axis. */
    if (x->rank < 1)
        node_error_at(n, n->input_locs[0], "%s needs a signal [..., time], not a scalar",
                      op_info[n->op].name);
    int64_t T = x->shape[x->rank - 1];
    sp->window = attr_choice(n, "window", window_names, WINDOW_COUNT);
    if (n->op == OP_LOG_MEL) {
        sp->L = positive_attr(n, "n_fft", SPECTRAL_MAX_L);
        sp->step = positive_value(n, "hop", attr_int_or(n, "hop", sp->L / 4 > 0 ? sp->L / 4 : 1), T);
    } else {
        sp->L = positive_attr(n, "segment", SPECTRAL_MAX_L);
        int64_t overlap = attr_int_or(n, "overlap", sp->L / 2);
        if (overlap < 0 || overlap >= sp->L)
            node_error_at(n, attr_loc(n, "overlap"), "overlap must be from 0 to segment - 1 "
                          "(%lld)", (long long)(sp->L - 1));
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
