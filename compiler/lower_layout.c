/*
 * lower_layout.c: views, transpose, slice, concat, split, expand, tile,
 * depth_to_space and space_to_depth: strided copies (eltwise.comp).
 */
#include "lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
                     dyn_walk(out.t));
}

/* Transpose n's perm: its attribute (negative axes from the end), else
 * the axes reversed. */
static void transpose_perm(Node *n, int64_t *perm) {
    int rank = n->inputs[0]->rank;
    int np = attr_ints(n, "perm", perm, MAX_RANK);
    for (int i = 0; i < rank; i++)
        perm[i] = np < 0 ? rank - 1 - i : perm[i] < 0 ? perm[i] + rank : perm[i];
}

/* Transpose n's input read in the order of its output: the input with its
 * strides permuted (an elementwise group reads a transpose fused into it
 * so: lower_eltwise.c). */
Operand transposed_input(Node *n) {
    Tensor *x = n->inputs[0];
    int64_t perm[MAX_RANK], own[MAX_RANK];
    transpose_perm(n, perm);
    contiguous_strides(x->rank, x->shape, own);
    Operand in = {x, {0}, 0, false, {0, {0}}};
    for (int i = 0; i < x->rank; i++)
        in.strides[i] = own[perm[i]];
    return in;
}

void lower_transpose(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int64_t perm[MAX_RANK];
    transpose_perm(n, perm);
    permuted_copy(p, n, x, x->rank, x->shape, perm);
}

void lower_view(Program *p, Node *n) {
    (void)p;
    n->outputs[0]->alias = n->inputs[0];
}

/* A reshape that merges two adjacent dynamic axes of its input into one
 * (pack) or splits an axis of their product into them (dynamic.c
 * repack_reshape), the first of them possibly fixed: repack.comp moves
 * the run's elements between [O, S1, S2, R] (holes past each extent) and
 * [O, S1 * S2, R] (a prefix of the merged axis). */
void lower_repack(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    bool pack = attr_int(n, "pack") != 0;
    int a = (int)attr_int(n, "axis");
    const Tensor *two = pack ? x : out; /* the side with the two axes */
    if (a < 0 || a + 1 >= two->rank || !is_dyn(two, a + 1))
        error_at(n->loc, "node '%s': repack is kiln's own op, for reshapes of dynamic axes",
                 n->name);
    Dispatch *d = new_dispatch(p, n, "repack");
    d->local_size = 256;
    bool need[3] = {false, false, false};
    uint32_t size = kiln_dtype_size(x->dtype);
    if (size <= 2)
        need_dtype(p, need, x->dtype);
    define_needs(d, need);
    const char *elem = size == 8 ? "U2" : size == 4 ? "U32" : size == 2 ? "F16" : "U8";
    define_str(d, "ELEM", elem);
    define_str(d, "ELEM_R", format("%sR", elem));
    int64_t outer = shape_count(a, two->shape);
    int64_t inner = shape_count(two->rank - a - 2, two->shape + a + 2);
    define_int(d, "PACK", pack);
    define_int(d, "O", outer);
    define_int(d, "S1", two->shape[a]);
    define_int(d, "S2", two->shape[a + 1]);
    define_int(d, "R", inner);
    /* the first axis's extent: its dims', or its size where it is fixed */
    define_str(d, "E1", is_dyn(two, a) ? dim_expr_glsl(&two->ext[a], 1)
                                       : format("%lld", (long long)two->shape[a]));
    define_str(d, "E2", dim_expr_glsl(&two->ext[a + 1], 1));
    dispatch_arg(d, out, true);
    dispatch_arg(d, x, false);
    d->groups[0] = groups_for(tensor_count(out), d->local_size);
    const Tensor *merged = pack ? out : x;
    if (outer == 1) /* the merged run a prefix: groups follow it */
        dyn_groups_along(d, 0, &merged->ext[a], inner, d->local_size);
}


bool block_view(Tensor *x, Tensor *out, const Operand *in) {
    if (x->dyn_axes || out->dyn_axes || x->kind == T_STATE || out->is_output ||
        out->is_update || out->dtype != x->dtype || in->dyn_base || in->base < 0 ||
        !tensor_bytes(out))
        return false;
    int64_t own[MAX_RANK];
    contiguous_strides(out->rank, out->shape, own);
    for (int i = 0; i < out->rank; i++)
        if (out->shape[i] > 1 && in->strides[i] != own[i])
            return false;
    out->alias = x;
    out->view_offset = (uint64_t)in->base * kiln_dtype_size(x->dtype);
    return true;
}

void lower_slice(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    int64_t start[MAX_RANK], step[MAX_RANK], shape[MAX_RANK];
    slice_params(n, start, step, shape);
    Operand in = whole(x);
    for (int i = 0; i < x->rank; i++) {
        in.base += start[i] * in.strides[i];
        in.strides[i] *= step[i];
    }
    if (block_view(x, out, &in))
        return;
    copy(p, n, out->rank, out->shape, whole(out), in, dyn_one(out));
}

/* Where piece k of concat n lands in its output: the output's strides
 * from the piece's start along the axis, which follows the dynamic
 * dimensions after a dynamic piece along a dynamic axis. The pieces go in
 * order: a piece computed at its largest shape writes don't-care rows past
 * its extent, where the next piece then lands (the schedule orders writes
 * that overlap). */
static Operand concat_region(Node *n, int k) {
    Tensor *out = n->outputs[0];
    int axis = (int)attr_int(n, "axis");
    if (axis < 0)
        axis += out->rank;
    DimExpr at = {0, {0}};
    bool dyn_at = false;
    for (int j = 0; j < k; j++) {
        Tensor *x = n->inputs[j];
        if (is_dyn(x, axis)) {
            at = dim_expr_add(&at, &x->ext[axis]);
            dyn_at = true;
        } else {
            at.c0 += x->shape[axis];
        }
    }
    Operand o = whole(out);
    o.base = at.c0 * o.strides[axis];
    if (dyn_at) {
        o.dyn_base = true;
        o.base_expr = dim_expr_scale(&at, o.strides[axis]);
    }
    return o;
}

/* Whether concat n appends to a state in place (its first piece is the
 * state, which its output shares). */
static bool appends_in_place(const Node *n) {
    return n->op == OP_CONCAT && tensor_root(n->inputs[0]) == tensor_root(n->outputs[0]);
}

bool append_region(Program *p, Tensor *piece, Operand *o) {
    if (p->debug_tensors || piece->uses != 1 || piece->is_output || piece->is_update)
        return false;
    Graph *g = p->graph;
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if (n->dead || n->ninputs < 1 || n->inputs[0] != piece || !is_view_op(n->op))
            continue;
        return append_region(p, n->outputs[0], o); /* the same elements in order */
    }
    for (int i = 0; i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        if (n->dead || n->ninputs != 2 || n->inputs[1] != piece || !appends_in_place(n) ||
            n->outputs[0]->dtype != piece->dtype)
            continue;
        Operand region = concat_region(n, 1), own = whole(piece);
        for (int a = 0; a < piece->rank; a++)
            if (piece->shape[a] > 1 && own.strides[a] != region.strides[a])
                return false;
        *o = region;
        piece->appended = true;
        return true;
    }
    return false;
}

/* Piece k of concat n written in place by its producer: where the piece's
 * region of the output is one contiguous block (the axes before the
 * concatenated one of extent 1, as at batch 1 along channels), the piece,
 * or the tensor it is a whole view of (a reshape's input), becomes a view
 * of the output there: its producer's dispatch writes into the output and
 * no copy runs. Not a graph input, output, state or weight, nor a piece
 * that is a view of part of another tensor, one placed already (a piece
 * given twice, or to two concats: the later ones copy it) or one whose
 * shape follows the dims. */
static bool piece_in_place(Program *p, Node *n, int k) {
    Tensor *x = n->inputs[k], *out = n->outputs[0];
    if (p->debug_tensors || x->dyn_axes || out->dyn_axes || out->is_update ||
        x->dtype != out->dtype || !tensor_bytes(x))
        return false;
    Tensor *t = x;
    while (t->alias && t->view_offset == 0 && tensor_bytes(t) == tensor_bytes(t->alias) &&
           t->alias->dtype == x->dtype)
        t = t->alias;
    if (t->alias || t->kind != T_VALUE || !t->producer || t->is_output || t->is_update ||
        t->dyn_axes || t == tensor_root(out))
        return false;
    Operand region = concat_region(n, k), own = whole(x);
    for (int a = 0; a < x->rank; a++)
        if (x->shape[a] > 1 && own.strides[a] != region.strides[a])
            return false;
    t->alias = out;
    t->view_offset = (uint64_t)region.base * kiln_dtype_size(out->dtype);
    return true;
}

/* The bytes from t's root to t (the views' offsets on the way). */
static uint64_t view_bytes(const Tensor *t) {
    uint64_t at = 0;
    for (; t->alias; t = t->alias)
        at += t->view_offset;
    return at;
}

/* Whether piece k of concat n is where its region of the output is already:
 * a piece of an earlier concat whose output is a prefix of n's (below). */
static bool piece_placed(Node *n, int k) {
    Tensor *x = n->inputs[k], *out = n->outputs[0];
    Operand region = concat_region(n, k), own = whole(x);
    if (region.dyn_base || tensor_root(x) != tensor_root(out) ||
        view_bytes(x) != view_bytes(out) + (uint64_t)region.base * kiln_dtype_size(out->dtype))
        return false;
    for (int a = 0; a < x->rank; a++)
        if (x->shape[a] > 1 && own.strides[a] != region.strides[a])
            return false;
    return true;
}

/* The next concat after n whose pieces begin with all of n's, in order,
 * along the same axis and of n's dtype, or NULL. */
static Node *extending_concat(Graph *g, Node *n) {
    bool after = false;
    for (int i = 0; i < g->nodes.len; i++) {
        Node *m = g->nodes.data[i];
        if (m == n)
            after = true;
        if (!after || m == n || m->dead || m->op != OP_CONCAT || m->ninputs <= n->ninputs ||
            attr_int(m, "axis") != attr_int(n, "axis") ||
            m->outputs[0]->dtype != n->outputs[0]->dtype)
            continue;
        bool prefix = true;
        for (int k = 0; k < n->ninputs; k++)
            prefix &= m->inputs[k] == n->inputs[k];
        if (prefix)
            return m;
    }
    return NULL;
}

/* A concat whose pieces a later concat begins with (DenseNet's dense
 * blocks: each layer concatenates the features so far, and the block's
 * end all of them): its output is a view of the last such concat's, the
 * first block of it where it is one block (batch 1 along channels), so
 * that the pieces written in place there serve every concat of the chain
 * and none is copied. */
static void concat_prefix_view(Program *p, Node *n) {
    Tensor *out = n->outputs[0];
    Node *last = n;
    for (Node *m = extending_concat(p->graph, n); m; m = extending_concat(p->graph, m))
        last = m;
    Tensor *all = last->outputs[0];
    if (last == n || p->debug_tensors || out->alias || out->dyn_axes || all->dyn_axes ||
        out->is_output || out->is_update || all->is_update || out->kind != T_VALUE ||
        tensor_root(all) == out || appends_in_place(n) || all->rank != out->rank)
        return;
    int axis = (int)attr_int(n, "axis");
    if (axis < 0)
        axis += out->rank;
    Operand own = whole(out), region = whole(all);
    for (int a = 0; a < out->rank; a++)
        if ((a != axis && out->shape[a] != all->shape[a]) ||
            (out->shape[a] > 1 && own.strides[a] != region.strides[a]))
            return;
    out->alias = all;
    out->view_offset = 0;
}

/* Pieces ks[0..np) of concat n (fixed shapes, n's dtype) copied by one
 * concat.comp dispatch: the output as [outer, OW] rows, each piece's
 * [outer, W] at its offset in them, in 16-byte units where every width
 * and offset allows (else elements). */
#define CONCAT_MAX_PIECES 14
static void concat_pieces(Program *p, Node *n, const int *ks, int np) {
    Tensor *out = n->outputs[0];
    int axis = (int)attr_int(n, "axis");
    if (axis < 0)
        axis += out->rank;
    int64_t inner = shape_count(out->rank - axis - 1, out->shape + axis + 1);
    int64_t outer = shape_count(axis, out->shape), ow = out->shape[axis] * inner;
    int64_t es = kiln_dtype_size(out->dtype), w[CONCAT_MAX_PIECES], off[CONCAT_MAX_PIECES];
    bool unit4 = ow * es % 16 == 0;
    for (int i = 0; i < np; i++) {
        w[i] = n->inputs[ks[i]]->shape[axis] * inner;
        off[i] = concat_region(n, ks[i]).base;
        unit4 &= w[i] * es % 16 == 0 && off[i] * es % 16 == 0;
    }
    int64_t per = unit4 ? 16 / es : 1, lo = ow, hi = 0, groups = 0;
    Dispatch *d = new_dispatch(p, n, "concat");
    d->local_size = 256;
    d->disjoint_writes = true;
    bool need[3] = {false, false, false};
    if (!unit4)
        need_dtype(p, need, out->dtype);
    define_needs(d, need);
    define_int(d, "P", np);
    define_int(d, "OUTER", outer);
    define_int(d, "OW", ow / per);
    define_str(d, "TOUT", unit4 ? "U4" : buffer_type(out->dtype, false));
    dispatch_arg(d, out, true);
    for (int i = 0; i < np; i++) {
        int64_t units = outer * w[i] / per;
        int64_t ng = (units + 255) / 256;
        ng = ng < 1 ? 1 : ng > 4096 ? 4096 : ng;
        define_int(d, format("W%d", i), w[i] / per);
        define_int(d, format("OFF%d", i), off[i] / per);
        define_int(d, format("GB%d", i), groups);
        define_int(d, format("NG%d", i), ng);
        define_str(d, format("T%d", i), unit4 ? "U4R" : buffer_type(out->dtype, true));
        dispatch_arg(d, n->inputs[ks[i]], false);
        groups += ng;
        lo = off[i] < lo ? off[i] : lo;
        hi = off[i] + w[i] > hi ? off[i] + w[i] : hi;
    }
    /* the bytes it writes: from the first piece's region to the last's */
    d->arg_begin[0] = (uint64_t)(lo * es);
    d->arg_end[0] = (uint64_t)(((outer - 1) * ow + hi) * es);
    d->groups[0] = groups_for(groups, 1);
}

/* Piece x of concat n made by a slice fused into n (optimize.c,
 * fuse_concat_slices): the slice's input seen through its offset and
 * strides, through slices of slices; else NULL. */
static bool sliced_piece(Node *n, Tensor *x, Operand *in) {
    Node *s = x->producer;
    if (!s || s->op != OP_SLICE || s->fused_into != n)
        return false;
    if (!sliced_piece(n, s->inputs[0], in))
        *in = whole(s->inputs[0]);
    int64_t start[MAX_RANK], step[MAX_RANK], shape[MAX_RANK];
    slice_params(s, start, step, shape);
    for (int i = 0; i < x->rank; i++) {
        in->base += start[i] * in->strides[i];
        in->strides[i] *= step[i];
    }
    return true;
}

/* Each input (or output) a region of the concatenation along axis: a
 * slice's piece copied from the slice's input; those not in place copied
 * by one dispatch where they are several of fixed shapes and the output's
 * dtype (concat_pieces), else one each. */
void lower_concat(Program *p, Node *n) {
    concat_prefix_view(p, n);
    int ks[CONCAT_MAX_PIECES], np = 0;
    Tensor *out = n->outputs[0];
    for (int k = 0; k < n->ninputs; k++) {
        Tensor *x = n->inputs[k];
        Operand sliced;
        /* a slice's piece: a view where it is one block of the slice's
         * input (then copied with the others), else copied from there */
        if (sliced_piece(n, x, &sliced) && !block_view(sliced.t, x, &sliced)) {
            copy(p, n, x->rank, x->shape, concat_region(n, k), sliced, NULL);
            p->dispatches[p->ndispatches - 1]->disjoint_writes = true;
            continue;
        }
        /* a state's own bytes, a piece its producer wrote in place, or one
         * an earlier concat of the chain placed */
        if ((k == 0 && appends_in_place(n)) || x->appended || piece_placed(n, k) ||
            piece_in_place(p, n, k) || !tensor_bytes(x))
            continue;
        if (x->dyn_axes || out->dyn_axes || x->dtype != out->dtype) {
            copy(p, n, x->rank, x->shape, concat_region(n, k), whole(x), dyn_one(x));
            /* pieces at run-time offsets may overlap the next (a dynamic
             * piece computed at its largest shape): ordered */
            p->dispatches[p->ndispatches - 1]->disjoint_writes = !x->dyn_axes && !out->dyn_axes;
            continue;
        }
        ks[np++] = k;
        if (np == CONCAT_MAX_PIECES) {
            concat_pieces(p, n, ks, np);
            np = 0;
        }
    }
    if (np == 1) {
        copy(p, n, n->inputs[ks[0]]->rank, n->inputs[ks[0]]->shape, concat_region(n, ks[0]),
             whole(n->inputs[ks[0]]), NULL);
        p->dispatches[p->ndispatches - 1]->disjoint_writes = true;
    } else if (np > 1) {
        concat_pieces(p, n, ks, np);
    }
}

void lower_split(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int axis;
    int64_t *sizes = split_sizes(n, &axis);
    int64_t at = 0;
    for (int k = 0; k < n->noutputs; k++) {
        Tensor *t = n->outputs[k];
        Operand in = whole(x);
        in.base = at * in.strides[axis];
        if (!block_view(x, t, &in)) /* a part of a contiguous block: a view */
            copy(p, n, t->rank, t->shape, whole(t), in, dyn_one(t));
        at += sizes[k];
    }
}

void lower_expand(Program *p, Node *n) {
    Tensor *out = n->outputs[0];
    copy(p, n, out->rank, out->shape, whole(out),
         broadcast(n->inputs[0], out->rank, out->shape), dyn_walk(out));
}

/* tile: iterate over [rep0, d0, rep1, d1, ...]; the input repeats with
 * stride 0 over the rep dimensions, the output is contiguous over them. */
void lower_tile(Program *p, Node *n) {
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
void lower_depth_to_space(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int64_t b = attr_int(n, "block"), c = x->shape[1] / (b * b);
    int64_t H = x->shape[2], W = x->shape[3];
    if (depth_to_space_crd(n)) {
        int64_t view[6] = {x->shape[0], c, b, b, H, W}, perm[6] = {0, 1, 4, 2, 5, 3};
        permuted_copy(p, n, x, 6, view, perm);
    } else {
        int64_t view[6] = {x->shape[0], b, b, c, H, W}, perm[6] = {0, 3, 4, 1, 5, 2};
        permuted_copy(p, n, x, 6, view, perm);
    }
}

void lower_space_to_depth(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int64_t b = attr_int(n, "block");
    int64_t view[6] = {x->shape[0], x->shape[1], x->shape[2] / b, b, x->shape[3] / b, b};
    int64_t dcr[6] = {0, 3, 5, 1, 2, 4}, crd[6] = {0, 1, 3, 5, 2, 4};
    permuted_copy(p, n, x, 6, view, depth_to_space_crd(n) ? crd : dcr);
}
