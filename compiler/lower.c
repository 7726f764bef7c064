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

#include <string.h>

#define MAX_GROUPS 65535u

Dispatch *new_dispatch(Program *p, Node *n, const char *family) {
    Dispatch *d = xcalloc(1, sizeof *d);
    d->node = n;
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

void define_float(Dispatch *d, const char *name, double v) {
    /* %.9g round-trips an f32; make sure GLSL reads a float literal. */
    char *s = format("%.9g", (double)(float)v);
    if (!strpbrk(s, ".eEn"))
        s = format("%s.0", s);
    str_addf(&d->defines, "%s %s\n", name, s);
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
    d->args[d->nargs++] = t;
}

static uint32_t groups_for(int64_t items, int64_t per_group) {
    int64_t g = (items + per_group - 1) / per_group;
    return g > MAX_GROUPS ? MAX_GROUPS : (uint32_t)(g < 1 ? 1 : g);
}

static void contiguous_strides(int rank, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

/* Strides of tensor t read as if broadcast to `rank` dimensions of `shape`:
 * a missing or size-1 dimension that is broadcast has stride 0. */
static void broadcast_strides(const Tensor *t, int rank, const int64_t *shape,
                              int64_t *out) {
    int64_t own[MAX_RANK];
    contiguous_strides(t->rank, t->shape, own);
    for (int i = 0; i < rank; i++) {
        int j = i - (rank - t->rank);
        out[i] = (j < 0 || (t->shape[j] == 1 && shape[i] != 1)) ? 0 : own[j];
    }
}

/* Drops size-1 dimensions and merges neighbours that every operand walks
 * contiguously, so kernels index with as few divisions as possible.
 * strides[k] are the operands' strides; returns the new rank (at least 1). */
static int collapse(int rank, int64_t *shape, int nops, int64_t (*strides)[MAX_RANK]) {
    int r = 0;
    for (int i = 0; i < rank; i++) {
        if (shape[i] == 1)
            continue;
        shape[r] = shape[i];
        for (int k = 0; k < nops; k++)
            strides[k][r] = strides[k][i];
        r++;
    }
    int w = 0;
    for (int i = 0; i < r; i++) {
        if (w > 0) {
            bool merge = true;
            for (int k = 0; k < nops; k++)
                merge &= strides[k][w - 1] == strides[k][i] * shape[i];
            if (merge) {
                shape[w - 1] *= shape[i];
                for (int k = 0; k < nops; k++)
                    strides[k][w - 1] = strides[k][i];
                continue;
            }
        }
        shape[w] = shape[i];
        for (int k = 0; k < nops; k++)
            strides[k][w] = strides[k][i];
        w++;
    }
    if (w == 0) {
        shape[0] = 1;
        for (int k = 0; k < nops; k++)
            strides[k][0] = 0;
        w = 1;
    }
    return w;
}

/* One elementwise dispatch: out[i] = expr(in0[s0(i)], in1[s1(i)], ...).
 * strides[0] belongs to the output (contiguous), strides[1 + k] to input k.
 * Inputs read at the output's index are IN<k>_MODE 0, scalars mode 1,
 * anything else mode 2 with IN<k>_STRIDES. */
static void eltwise_dispatch(Program *p, Node *n, Tensor *out, int nin, Tensor **in,
                             int64_t (*strides)[MAX_RANK], const char *expr) {
    int64_t count = tensor_count(out);
    if (count == 0)
        return;
    int64_t shape[MAX_RANK];
    memcpy(shape, out->shape, sizeof shape);
    int rank = collapse(out->rank, shape, nin + 1, strides);

    Dispatch *d = new_dispatch(p, n, "eltwise");
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    define_int(d, "COUNT", count);
    define_int(d, "RANK", rank);
    define_list(d, "SHAPE", rank, shape);
    define_int(d, "N_IN", nin);
    dispatch_arg(d, out, true);
    for (int k = 0; k < nin; k++) {
        bool same = true, scalar = true;
        for (int i = 0; i < rank; i++) {
            same &= strides[k + 1][i] == strides[0][i];
            scalar &= strides[k + 1][i] == 0;
        }
        char *mode = format("IN%d_MODE", k);
        define_int(d, mode, same ? 0 : scalar ? 1 : 2);
        if (!same && !scalar)
            define_list(d, format("IN%d_STRIDES", k), rank, strides[k + 1]);
        dispatch_arg(d, in[k], false);
    }
    define_str(d, "EXPR", format("(%s)", expr));
    d->groups[0] = groups_for(count, d->local_size);
}

/* ---- lowering functions (named in ops.def) ---- */

static void lower_eltwise(Program *p, Node *n) {
    Tensor *out = n->outputs[0];
    int64_t strides[1 + MAX_ARGS][MAX_RANK];
    contiguous_strides(out->rank, out->shape, strides[0]);
    for (int k = 0; k < n->ninputs; k++)
        broadcast_strides(n->inputs[k], out->rank, out->shape, strides[k + 1]);
    eltwise_dispatch(p, n, out, n->ninputs, n->inputs, strides, op_info[n->op].expr);
}

/* A transpose is an elementwise copy whose input strides are permuted. */
static void lower_transpose(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    int64_t perm[MAX_RANK], own[MAX_RANK];
    int np = attr_ints(n, "perm", perm, MAX_RANK);
    if (np < 0)
        for (int i = 0; i < x->rank; i++)
            perm[i] = x->rank - 1 - i;
    contiguous_strides(x->rank, x->shape, own);
    int64_t strides[2][MAX_RANK];
    contiguous_strides(out->rank, out->shape, strides[0]);
    for (int i = 0; i < x->rank; i++)
        strides[1][i] = own[perm[i] < 0 ? perm[i] + x->rank : perm[i]];
    eltwise_dispatch(p, n, out, 1, &x, strides, "a");
}

static void lower_view(Program *p, Node *n) {
    (void)p;
    n->outputs[0]->alias = n->inputs[0];
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

static void lower_matmul(Program *p, Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1], *out = n->outputs[0];
    if (tensor_count(out) == 0)
        return;
    int64_t K = a->shape[a->rank - 1];
    int64_t M = a->rank >= 2 ? a->shape[a->rank - 2] : 1;
    int64_t N = b->rank >= 2 ? b->shape[b->rank - 1] : 1;
    /* Element (m, k) of A and (k, n) of B within one batch. */
    int64_t a_sm = K, a_sk = 1;
    int64_t b_sk = b->rank >= 2 ? N : 1, b_sn = 1;

    /* Batch dimensions of the output and each operand's strides over them. */
    int brank = out->rank - (a->rank >= 2) - (b->rank >= 2);
    int64_t bshape[MAX_RANK], st[3][MAX_RANK];
    memcpy(bshape, out->shape, sizeof(int64_t) * (size_t)brank);
    for (int i = 0; i < brank; i++) {
        int ja = i - (brank - (a->rank - 2)), jb = i - (brank - (b->rank - 2));
        st[0][i] = 0;
        st[1][i] = (a->rank > 2 && ja >= 0 && a->shape[ja] == bshape[i]) ? 1 : 0;
        st[2][i] = (b->rank > 2 && jb >= 0 && b->shape[jb] == bshape[i]) ? 1 : 0;
    }
    /* Turn the 0/1 flags into element strides, innermost batch first. */
    int64_t sa = M * K, sb = K * N, so = M * N;
    for (int i = brank - 1; i >= 0; i--) {
        st[0][i] = so;
        so *= bshape[i];
        if (st[1][i]) {
            st[1][i] = sa;
            sa *= bshape[i];
        }
        if (st[2][i]) {
            st[2][i] = sb;
            sb *= bshape[i];
        }
    }
    int64_t batch = shape_count(brank, bshape);
    brank = collapse(brank, bshape, 3, st);
    /* A shared B and an unbroadcast A: fold the batch into M. */
    if (brank == 1 && st[2][0] == 0 && st[1][0] == M * K && a->rank >= 2) {
        M *= bshape[0];
        batch = 1;
        bshape[0] = 1;
        st[0][0] = st[1][0] = 0;
    }

    int64_t bm, tm, bn, tn;
    pick_tile(M, &bm, &tm);
    pick_tile(N, &bn, &tn);
    Dispatch *d = new_dispatch(p, n, "matmul");
    d->local_size = (uint32_t)((bm / tm) * (bn / tn));
    define_int(d, "M", M);
    define_int(d, "N", N);
    define_int(d, "K", K);
    define_int(d, "A_SM", a_sm);
    define_int(d, "A_SK", a_sk);
    define_int(d, "B_SK", b_sk);
    define_int(d, "B_SN", b_sn);
    define_int(d, "BATCH", batch);
    define_int(d, "BRANK", brank);
    define_list(d, "BSHAPE", brank, bshape);
    define_list(d, "C_BSTRIDES", brank, st[0]);
    define_list(d, "A_BSTRIDES", brank, st[1]);
    define_list(d, "B_BSTRIDES", brank, st[2]);
    define_int(d, "BM", bm);
    define_int(d, "BN", bn);
    define_int(d, "BK", 16);
    define_int(d, "TM", tm);
    define_int(d, "TN", tn);
    dispatch_arg(d, out, true);
    dispatch_arg(d, a, false);
    dispatch_arg(d, b, false);
    d->groups[0] = groups_for(N, bn);
    d->groups[1] = groups_for(M, bm);
    d->groups[2] = groups_for(batch, 1);
}

/* Row kernels: one workgroup per row (looping when rows exceed the cap),
 * its invocations striding over the row and reducing in shared memory. */
static Dispatch *row_dispatch(Program *p, Node *n, const char *family) {
    Tensor *x = n->inputs[0];
    int64_t cols = x->rank ? x->shape[x->rank - 1] : 1;
    int64_t rows = cols ? tensor_count(x) / cols : 0;
    if (rows == 0 || cols == 0)
        return NULL;
    Dispatch *d = new_dispatch(p, n, family);
    uint32_t wg = 32;
    while (wg < 256 && wg < cols)
        wg *= 2;
    d->local_size = wg;
    define_int(d, "WG", wg);
    define_int(d, "ROWS", rows);
    define_int(d, "COLS", cols);
    dispatch_arg(d, n->outputs[0], true);
    dispatch_arg(d, x, false);
    d->groups[0] = groups_for(rows, 1);
    return d;
}

static void lower_softmax(Program *p, Node *n) { row_dispatch(p, n, "softmax"); }

static void lower_layer_norm(Program *p, Node *n) {
    Dispatch *d = row_dispatch(p, n, "layer_norm");
    if (!d)
        return;
    define_float(d, "EPS", attr_float(n, "eps", 1e-5));
    define_int(d, "HAS_GAMMA", n->ninputs > 1);
    define_int(d, "HAS_BETA", n->ninputs > 2);
    for (int i = 1; i < n->ninputs; i++)
        dispatch_arg(d, n->inputs[i], false);
}

typedef void (*LowerFn)(Program *p, Node *n);
static const LowerFn lowerings[OP_COUNT] = {
#define OP(id, name, mn, mx, attrs, shape, lower, expr) [OP_##id] = lower,
#include "ops.def"
#undef OP
};

Program *lower(Graph *g) {
    Program *p = xcalloc(1, sizeof *p);
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if (!n->dead)
            lowerings[n->op](p, n);
    }
    return p;
}
