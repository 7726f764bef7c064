/*
 * onnx_map_einsum.c: ONNX Einsum as transposes, reshapes, sums, diagonals
 * and batched matmuls.
 *
 * The equation's labels become numbers: letters 0-51, the dimensions an
 * ellipsis stands for 52 and up (right-aligned across the operands, as
 * numpy broadcasts them). Without "->" the output is the ellipsis, then the
 * labels that appear once, in alphabetical order. Then:
 *
 *  - a label repeated in one operand takes that operand's diagonal (the
 *    two axes last, flattened, and a gather of every (n + 1)-th element);
 *  - a label that no other operand and not the output has is summed away;
 *  - operands are contracted left to right, two at a time: labels of both
 *    and of what comes after (later operands or the output) are batch
 *    dimensions, labels of both and nothing after are contracted, the rest
 *    are kept from one side. A goes to [batch, kept, contracted] and B to
 *    [batch, contracted, kept] (transposes, then reshapes that flatten each
 *    group), one batched matmul, then a reshape back to the dimensions;
 *  - a transpose puts the last result in the output's order.
 *
 * Float inputs only (kiln's matmul); other dtypes are refused by name.
 */
#include "onnx.h"

#include <ctype.h>
#include <string.h>

#define MAX_LABELS (52 + MAX_RANK)

/* An operand: its value and the label of each of its axes. */
typedef struct Term {
    Value *v;
    int rank;
    int label[MAX_RANK];
} Term;

static int letter_label(char ch) {
    return islower((unsigned char)ch) ? ch - 'a' : ch - 'A' + 26;
}

/* Parses one side's term (n characters at s) for an operand of rank
 * `rank` (or, for the output, ellipsis dimensions `ell`); returns its rank,
 * or -1 when malformed. */
static int parse_term(const char *s, size_t n, int rank, int *ell, int *label) {
    int letters = 0, dots = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '.') {
            if (dots || i + 2 >= n || s[i + 1] != '.' || s[i + 2] != '.')
                return -1;
            dots = 1;
            i += 2;
        } else if (isalpha((unsigned char)s[i])) {
            letters++;
        } else {
            return -1;
        }
    }
    int e = rank >= 0 ? rank - letters : *ell;
    if (e < 0 || (!dots && e > 0 && rank >= 0) || letters + (dots ? e : 0) > MAX_RANK)
        return -1;
    if (rank >= 0 && dots)
        *ell = e;
    if (!dots)
        e = 0;
    int r = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '.') {
            for (int k = 0; k < e; k++) /* right-aligned: the last is 52 */
                label[r++] = 52 + (e - 1 - k);
            i += 2;
        } else {
            label[r++] = letter_label(s[i]);
        }
    }
    return r;
}

/* t's axes in the order of `order` (labels); `out`, when given, names the
 * result (the node's output). */
static Value *transpose_to(Ctx *c, const Term *t, const int *order, const char *out) {
    int64_t perm[MAX_RANK];
    bool identity = true;
    for (int i = 0; i < t->rank; i++) {
        for (int j = 0; j < t->rank; j++)
            if (t->label[j] == order[i])
                perm[i] = j;
        identity &= perm[i] == i;
    }
    if (identity && !out)
        return t->v;
    Value *v = t->v;
    OpKind kind = identity ? OP_RESHAPE : OP_TRANSPOSE; /* a named copy: a view */
    Node *k = out ? emit(c, kind, 1, &v, out) : emit_tmp(c, kind, 1, &v);
    if (identity)
        node_set_ints(k, "shape", v->rank, v->shape);
    else
        node_set_ints(k, "perm", t->rank, perm);
    return finish(c, k);
}

/* Replaces t by its diagonal over the two axes labelled l (the label kept
 * once, last). */
static void take_diagonal(Ctx *c, Term *t, int l) {
    int a = -1, b = -1, order[MAX_RANK], r = 0;
    for (int i = 0; i < t->rank; i++) {
        if (t->label[i] == l && a < 0)
            a = i;
        else if (t->label[i] == l && b < 0)
            b = i;
        else
            order[r++] = t->label[i];
    }
    int64_t n = t->v->shape[a];
    if (t->v->shape[b] != n)
        node_fail(c, format("label '%c' has sizes %lld and %lld in one operand",
                            l < 26 ? 'a' + l : 'A' + l - 26, (long long)n,
                            (long long)t->v->shape[b]));
    /* The two axes last (a transpose by labels cannot tell them apart). */
    int64_t perm[MAX_RANK], shape[MAX_RANK];
    for (int i = 0, j = 0; i < t->rank; i++)
        if (i != a && i != b)
            perm[j++] = i;
    perm[t->rank - 2] = a;
    perm[t->rank - 1] = b;
    Value *v = transposed(c, t->v, t->rank, perm);
    for (int i = 0; i < r; i++)
        shape[i] = v->shape[i];
    shape[r] = n * n;
    v = reshaped(c, v, r + 1, shape);
    Value *idx = new_value(format("%s/diagonal%d", c->nname, ++c->tmp_count), KILN_DTYPE_I64,
                           1, &n, true);
    for (int64_t i = 0; i < n; i++)
        vseti(idx, i, i * (n + 1));
    Value *gi[2] = {v, idx};
    Node *k = emit_tmp(c, OP_GATHER, 2, gi);
    node_set_int(k, "axis", r);
    t->v = finish(c, k);
    order[r] = l;
    t->rank = r + 1;
    memcpy(t->label, order, sizeof(int) * (size_t)t->rank);
}

/* Sums t over every axis whose label `keep` does not hold. */
static void sum_unkept(Ctx *c, Term *t, const bool *keep) {
    int64_t axes[MAX_RANK];
    int na = 0, r = 0;
    for (int i = 0; i < t->rank; i++) {
        if (!keep[t->label[i]])
            axes[na++] = i;
        else
            t->label[r++] = t->label[i];
    }
    if (!na)
        return;
    Value *v = t->v;
    Node *k = emit_tmp(c, OP_REDUCE_SUM, 1, &v);
    node_set_ints(k, "axes", na, axes);
    node_set_int(k, "keep_dims", 0);
    t->v = finish(c, k);
    t->rank = r;
}

static int64_t size_of(const Term *t, int l) {
    for (int i = 0; i < t->rank; i++)
        if (t->label[i] == l)
            return t->v->shape[i];
    return 1;
}

/* a and b contracted into a term whose labels are those of a and b that
 * `later` holds (batch first, then a's kept, then b's kept). */
static Term contract(Ctx *c, Term *a, Term *b, const bool *later) {
    bool in_a[MAX_LABELS] = {0}, in_b[MAX_LABELS] = {0};
    for (int i = 0; i < a->rank; i++)
        in_a[a->label[i]] = true;
    for (int i = 0; i < b->rank; i++)
        in_b[b->label[i]] = true;
    int batch[MAX_RANK], left[MAX_RANK], right[MAX_RANK], inner[MAX_RANK];
    int nb = 0, nl = 0, nr = 0, ni = 0;
    for (int i = 0; i < a->rank; i++) {
        int l = a->label[i];
        if (in_b[l] && later[l])
            batch[nb++] = l;
        else if (in_b[l])
            inner[ni++] = l;
        else
            left[nl++] = l;
    }
    for (int i = 0; i < b->rank; i++)
        if (!in_a[b->label[i]])
            right[nr++] = b->label[i];
    if (nb + 2 > MAX_RANK)
        node_fail(c, format("unsupported: %d batch dimensions (kiln's matmul takes %d)", nb,
                            MAX_RANK - 2));
    int64_t m = 1, kk = 1, n = 1, ashape[MAX_RANK], bshape[MAX_RANK];
    for (int i = 0; i < nl; i++)
        m *= size_of(a, left[i]);
    for (int i = 0; i < nr; i++)
        n *= size_of(b, right[i]);
    for (int i = 0; i < ni; i++) {
        kk *= size_of(a, inner[i]);
        if (size_of(a, inner[i]) != size_of(b, inner[i]))
            node_fail(c, format("a contracted label has sizes %lld and %lld",
                                (long long)size_of(a, inner[i]),
                                (long long)size_of(b, inner[i])));
    }
    int aorder[MAX_RANK], border[MAX_RANK];
    memcpy(aorder, batch, sizeof(int) * (size_t)nb);
    memcpy(aorder + nb, left, sizeof(int) * (size_t)nl);
    memcpy(aorder + nb + nl, inner, sizeof(int) * (size_t)ni);
    memcpy(border, batch, sizeof(int) * (size_t)nb);
    memcpy(border + nb, inner, sizeof(int) * (size_t)ni);
    memcpy(border + nb + ni, right, sizeof(int) * (size_t)nr);
    for (int i = 0; i < nb; i++) {
        ashape[i] = size_of(a, batch[i]);
        bshape[i] = size_of(b, batch[i]);
    }
    ashape[nb] = m;
    ashape[nb + 1] = kk;
    bshape[nb] = kk;
    bshape[nb + 1] = n;
    Value *av = reshaped(c, transpose_to(c, a, aorder, NULL), nb + 2, ashape);
    Value *bv = reshaped(c, transpose_to(c, b, border, NULL), nb + 2, bshape);
    Value *prod = binary_tmp(c, OP_MATMUL, av, bv);
    Term t = {NULL, nb + nl + nr, {0}};
    int64_t shape[MAX_RANK];
    for (int i = 0; i < nb; i++) {
        t.label[i] = batch[i];
        shape[i] = prod->shape[i];
    }
    for (int i = 0; i < nl; i++) {
        t.label[nb + i] = left[i];
        shape[nb + i] = size_of(a, left[i]);
    }
    for (int i = 0; i < nr; i++) {
        t.label[nb + nl + i] = right[i];
        shape[nb + nl + i] = size_of(b, right[i]);
    }
    if (t.rank > MAX_RANK)
        node_fail(c, format("unsupported: a product of rank %d", t.rank));
    t.v = reshaped(c, prod, t.rank, shape);
    return t;
}

void map_einsum(Ctx *c, const OnnxOp *op) {
    (void)op;
    const char *eq = oattr_str(c, "equation", NULL);
    if (!eq)
        node_fail(c, "Einsum needs its equation attribute");
    char *s = xstrdup(eq), *w = s; /* without spaces */
    for (const char *p = eq; *p; p++)
        if (!isspace((unsigned char)*p))
            *w++ = *p;
    *w = 0;
    int n = nin(c);
    if (n < 1 || n > 8)
        node_fail(c, format("unsupported: Einsum of %d operands (kiln takes 1 to 8)", n));
    char *arrow = strstr(s, "->");
    int terms = 1;
    for (const char *q = s; *q && (!arrow || q < arrow); q++)
        terms += *q == ',';
    if (terms != n)
        node_fail(c, format("equation '%s' has %d term%s for %d operand%s", eq, terms,
                            terms == 1 ? "" : "s", n, n == 1 ? "" : "s"));
    Term t[8];
    int ell = 0, count[MAX_LABELS] = {0};
    const char *p = s;
    for (int i = 0; i < n; i++) {
        const char *end = i + 1 < n ? strchr(p, ',') : arrow ? arrow : s + strlen(s);
        t[i].v = in(c, i);
        if (t[i].v->dtype != KILN_DTYPE_F32 && t[i].v->dtype != KILN_DTYPE_F16)
            node_fail(c, format("unsupported: Einsum of %s tensors (kiln's takes f32 and f16)",
                                kiln_dtype_name(t[i].v->dtype)));
        int e = 0;
        t[i].rank = parse_term(p, (size_t)(end - p), t[i].v->rank, &e, t[i].label);
        if (t[i].rank != t[i].v->rank)
            node_fail(c, format("equation '%s': term %d does not fit operand %d of rank %d", eq,
                                i + 1, i + 1, t[i].v->rank));
        ell = e > ell ? e : ell;
        for (int k = 0; k < t[i].rank; k++)
            count[t[i].label[k]]++;
        p = end + 1;
    }
    Term out = {NULL, 0, {0}};
    if (arrow) {
        out.rank = parse_term(arrow + 2, strlen(arrow + 2), -1, &ell, out.label);
        if (out.rank < 0)
            node_fail(c, format("equation '%s': malformed output term", eq));
    } else { /* numpy's implicit output: the ellipsis, then labels seen once */
        for (int k = 0; k < ell; k++)
            out.label[out.rank++] = 52 + (ell - 1 - k);
        for (int l = 0; l < 52; l++)
            if (count[l] == 1)
                out.label[out.rank++] = l;
    }
    bool in_out[MAX_LABELS] = {0};
    for (int k = 0; k < out.rank; k++) {
        if (in_out[out.label[k]] || (out.label[k] < 52 && !count[out.label[k]]))
            node_fail(c, format("equation '%s': an output label repeats or names no input "
                                "axis", eq));
        in_out[out.label[k]] = true;
    }
    for (int i = 0; i < n; i++) { /* diagonals, then sums of labels no one else has */
        for (bool again = true; again;) {
            again = false;
            for (int a = 0; a < t[i].rank && !again; a++)
                for (int b = a + 1; b < t[i].rank && !again; b++)
                    if (t[i].label[a] == t[i].label[b]) {
                        take_diagonal(c, &t[i], t[i].label[a]);
                        again = true;
                    }
        }
        bool keep[MAX_LABELS];
        memcpy(keep, in_out, sizeof keep);
        for (int j = 0; j < n; j++)
            for (int k = 0; j != i && k < t[j].rank; k++)
                keep[t[j].label[k]] = true;
        sum_unkept(c, &t[i], keep);
    }
    Term acc = t[0];
    for (int i = 1; i < n; i++) {
        bool later[MAX_LABELS];
        memcpy(later, in_out, sizeof later);
        for (int j = i + 1; j < n; j++)
            for (int k = 0; k < t[j].rank; k++)
                later[t[j].label[k]] = true;
        acc = contract(c, &acc, &t[i], later);
    }
    sum_unkept(c, &acc, in_out);
    bool have[MAX_LABELS] = {0};
    for (int k = 0; k < acc.rank; k++)
        have[acc.label[k]] = true;
    for (int k = 0; k < out.rank; k++)
        if (!have[out.label[k]] || acc.rank != out.rank)
            node_fail(c, format("equation '%s': the output's ellipsis does not match the "
                                "inputs'", eq));
    transpose_to(c, &acc, out.label, out_name(c, 0));
}
