/*
 * lower_eltwise.c: elementwise ops, and the GLSL of fused elementwise chains
 * (each op's expression in ops.def, its operands and attributes substituted).
 */
#include "lower.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>


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
        if (node_attr(n, key)) /* the row's default may be infinite (clip) */
            v = attr_float(n, key);
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

char *rewrite_identifiers(const char *e, const char *(*sub)(void *ctx, const char *ident),
                          void *ctx) {
    Str out = {0};
    str_add(&out, "");
    while (*e) {
        if (isalpha((unsigned char)*e) || *e == '_') {
            const char *s0 = e;
            while (isalnum((unsigned char)*e) || *e == '_')
                e++;
            char *ident = format("%.*s", (int)(e - s0), s0);
            const char *by = sub(ctx, ident);
            str_add(&out, by ? by : ident);
        } else {
            str_addn(&out, e++, 1);
        }
    }
    return out.buf;
}

typedef struct FusedNames {
    Node *n;
    const char *ct;
    char **sub; /* operand k's expression */
} FusedNames;

static const char *fused_name(void *ctx, const char *ident) {
    FusedNames *f = ctx;
    if (ident[0] >= 'a' && ident[0] < 'a' + f->n->ninputs && !ident[1])
        return f->sub[ident[0] - 'a'];
    if (strcmp(ident, "BITS") == 0) /* the width of the first input's dtype */
        return format("%u", 8 * kiln_dtype_size(f->n->inputs[0]->dtype));
    return attribute_literal(f->n, ident, f->ct);
}

char *fused_expr(Node *n, const char *ct, Tensor **leaves, int *nleaves, int max) {
    char **sub = xcalloc((size_t)n->ninputs + 1, sizeof(char *));
    for (int k = 0; k < n->ninputs; k++) {
        Tensor *in = n->inputs[k];
        if (in->producer && in->producer->fused_into == n &&
            in->producer->op != OP_TRANSPOSE) { /* a transpose's output: a leaf (read_leaf) */
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
    /* Rewrite identifiers: operands a..f become their expressions, BITS
     * the first input's width, attribute names their values; everything
     * else stays. */
    FusedNames names = {n, ct, sub};
    return rewrite_identifiers(node_expr(n, ct), fused_name, &names);
}


/* Leaf t of the elementwise group that root's dispatch computes, as an
 * operand of its shape: through a transpose fused into the group
 * (optimize.c, fuse_transpose_reads), the transpose's input with permuted
 * strides; else t broadcast. */
static Operand read_leaf(Tensor *t, const Node *root) {
    Node *tr = t->producer;
    if (tr && tr->op == OP_TRANSPOSE && tr->fused_into && fused_head(tr) == root)
        return transposed_input(tr);
    /* made by its own dispatch, or by another's (a transpose a conv or a
     * norm writes: epi_perm), and stored */
    return broadcast(t, root->outputs[0]->rank, root->outputs[0]->shape);
}

/* An elementwise node and every node fused into it: one dispatch. */
void lower_eltwise(Program *p, Node *n) {
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
        in[k] = read_leaf(leaves[k], n);
    Dispatch *d = eltwise_dispatch(p, n, out->rank, out->shape, whole(out), nleaves, in, ct,
                                   expr, dyn_walk(out));
    /* a gated MLP's silu(gate) * up at a decoding step's one row: in the
     * product of gate and up (their one-row variant) */
    glu_after_product(p, n, d);
}

bool glu_after_product(Program *p, Node *n, Dispatch *nd) {
    Tensor *y = n->outputs[0];
    if (n->op != OP_MUL || !every_run(nd) || n->ninputs != 2)
        return false;
    for (int i = 0; i < 2; i++) {
        Node *act = n->inputs[i]->producer;
        if (!act || act->op != OP_SILU || act->fused_into != n)
            continue;
        Tensor *gate = act->inputs[0], *up = n->inputs[1 - i];
        Node *prod = gate->producer;
        if (prod && prod->fused_into)
            prod = prod->fused_into;
        if (!prod || prod->nsiblings != 1 || prod->split_out)
            return false;
        Tensor *first = prod->outputs[0], *second = prod->siblings[0]->outputs[0];
        bool gate_first = gate == first;
        if (!(gate_first ? up == second : gate == second && up == first) ||
            gate->uses != 1 || up->uses != 1 || gate->is_output || up->is_output ||
            !shape_equal(gate, up) || !shape_equal(gate, y))
            return false;
        Dispatch *one = one_row_of(p, prod, nd);
        /* a workgroup takes CN / 2 columns of each part */
        if (!one || define_value(one, "CN") < 2 || one->nargs != 8 || one->groups[2] != 1)
            return false;
        /* y f32, or f16 where the kernel has 16-bit storage already (its A
         * or C f16: define_operand_types defined its needs) */
        bool f16 = gate->dtype == KILN_DTYPE_F16 || one->args[1]->dtype == KILN_DTYPE_F16;
        if (y->dtype != KILN_DTYPE_F32 && (y->dtype != KILN_DTYPE_F16 || !f16))
            return false;
        define_int(one, "GLU", 1);
        define_int(one, "GLU_N", gate->shape[gate->rank - 1]);
        define_int(one, "GLU_SILU_FIRST", gate_first);
        bool need[3] = {false, false, false}; /* recorded already */
        define_storage(p, one, need, "GLU", y, true);
        dispatch_arg(one, y, true);
        /* the elementwise dispatch: runs of two rows or more */
        nd->work_min = 2 * nd->scale;
        return true;
    }
    return false;
}
