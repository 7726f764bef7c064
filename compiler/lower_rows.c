/*
 * lower_rows.c: ops over rows: softmax, cumsum, the norms, batch_norm, the
 * reductions, topk, sample, the selective scan, and the norms' gradients.
 */
#include "lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int node_axis(Node *n) {
    int64_t axis = attr_int(n, "axis");
    return (int)(axis < 0 ? axis + n->inputs[0]->rank : axis);
}

void lower_softmax(Program *p, Node *n) {
    Dispatch *d = axis_dispatch(p, n, "softmax", node_axis(n));
    if (!d)
        return;
    define_int(d, "LOG", n->op == OP_LOG_SOFTMAX);
    Tensor *x = n->inputs[0];
    int axis = node_axis(n);
    if (is_dyn(x, axis)) /* rows along a dynamic axis: the run's extent of each */
        define_str(d, "RUN_LEN", format("uint%s", dim_expr_glsl(&x->ext[axis], 1)));
    bool need[3] = {false, false, false};
    define_storage(p, d, need, "Y", n->outputs[0], true);
    define_storage(p, d, need, "X", n->inputs[0], false);
    define_needs(d, need);
}

void lower_cumsum(Program *p, Node *n) {
    Dispatch *d = axis_dispatch(p, n, "cumsum", node_axis(n));
    kiln_dtype dt = n->inputs[0]->dtype;
    if (d && (dt == KILN_DTYPE_I32 || dt == KILN_DTYPE_I64)) { /* integer sums */
        bool need[3] = {false, false, false};
        need_dtype(p, need, dt);
        define_needs(d, need);
        define_str(d, "SCAN_T", compute_type(dt));
        define_str(d, "Y_BUF", buffer_type(dt, false));
        define_str(d, "X_BUF", buffer_type(dt, true));
    }
    if (d) {
        define_int(d, "EXCLUSIVE", attr_int(n, "exclusive") != 0);
        /* cumsum_grad: the transpose of a cumulative sum runs the other way */
        define_int(d, "REVERSE", (attr_int(n, "reverse") != 0) != (n->op == OP_CUMSUM_GRAD));
    }
}

/* norm.comp for every normalization but batch_norm. Arguments in order:
 * y, x, gamma, beta, residual, sum; absent ones are filled with x (read,
 * never touched) so each keeps its push-constant slot. */
void lower_norm(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    bool residual = n->op == OP_RESIDUAL_LAYER_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    /* A residual add fused into this norm (optimize.c): one kernel adds,
     * writes the sum where anything else reads it, and normalizes. */
    Node *add = x->producer && x->producer->fused_into == n && x->producer->op == OP_ADD
                    ? x->producer : NULL;
    /* Between transposes to channels last and back (optimize.c,
     * fuse_channels_first_norms): over the channels of the untransposed
     * input, each row's elements `inner` (the positions) apart, written in
     * that layout to the second transpose's output. */
    Node *perm = n->epi_perm;
    if (perm)
        x = x->producer->inputs[0];
    Tensor *y = perm ? perm->outputs[0] : n->outputs[0];
    bool rms = n->op == OP_RMS_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    int first_param = residual ? 2 : 1, nparams = n->ninputs - first_param;
    int64_t rows, len, pr = 1, pj = 0, pd = 1, inner = 1;
    bool outer_ok = false; /* rows over an outer and an inner dynamic axis */
    int64_t spatial = x->rank >= 2 ? shape_count(x->rank - 2, x->shape + 2) : 1;
    if (n->op == OP_INSTANCE_NORM) {
        rows = x->shape[0] * x->shape[1];
        len = spatial;
        pr = x->shape[1];
        pj = 1;
        pd = len;
    } else if (n->op == OP_GROUP_NORM) {
        int64_t g = attr_int(n, "groups");
        rows = x->shape[0] * g;
        len = x->shape[1] / g * spatial;
        pr = g;
        pj = x->shape[1] / g;
        pd = spatial;
    } else if (perm) {
        len = x->shape[1];
        inner = spatial;
        rows = x->shape[0] * spatial;
    } else {
        int axis = node_axis(n);
        len = shape_count(x->rank - axis, x->shape + axis);
        rows = len ? tensor_count(x) / len : 0;
        outer_ok = dyn_outer_inner(x) && inner_dyn_axis(x) < axis;
    }
    /* layer and rms norms follow a dynamic axis inside their rows too, and
     * an outer one with it */
    Dispatch *d = row_dispatch(p, n, "norm", rows, len, inner,
                               pr == 1 && dyn_inside(x) ? x : outer_ok ? x : dyn_of(x));
    if (!d)
        return;
    define_float(d, "EPS", attr_float(n, "eps"));
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
    Tensor *res = residual || add ? (add ? add->inputs[1] : n->inputs[1]) : x;
    Tensor *sum = write_sum ? (add ? add->outputs[0] : n->outputs[1]) : y;
    bool need[3] = {false, false, false};
    define_storage(p, d, need, "Y", y, true);
    define_storage(p, d, need, "X", x, false);
    define_storage(p, d, need, "RES", res, false);
    define_storage(p, d, need, "SUM", sum, true);
    define_needs(d, need);
    dispatch_arg(d, y, true);
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
        dispatch_arg(d, res, false);
    else
        dispatch_unused(d, x);
    if (write_sum)
        dispatch_arg(d, sum, true);
    /* A decoding step's row after a product (o + res, the residual add
     * fused here): the product's last workgroup normalizes it */
    if (add && n->noutputs == 1 && (n->op == OP_RMS_NORM || n->op == OP_LAYER_NORM) &&
        n->outputs[0]->rank >= 1 && len == n->outputs[0]->shape[n->outputs[0]->rank - 1]) {
        Tensor *gamma = nparams > 0 ? n->inputs[first_param] : NULL;
        Tensor *beta = nparams > 1 ? n->inputs[first_param + 1] : NULL;
        Tensor *o = add->inputs[0], *other = add->inputs[1];
        if (!norm_after_product(p, n, d, o, other, n->outputs[0], write_sum ? sum : NULL,
                                gamma, beta, rms))
            norm_after_product(p, n, d, other, o, n->outputs[0], write_sum ? sum : NULL, gamma,
                               beta, rms);
    }
}

/* batch_norm is elementwise: (x - mean) / sqrt(var + eps) * scale + bias,
 * each parameter read per channel (axis 1). */
void lower_batch_norm(Program *p, Node *n) {
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
        define_float(d, "EPS", attr_float(n, "eps"));
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

void lower_reduce(Program *p, Node *n) {
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
    /* a dynamic reduced axis (dynamic.c: one at most): reduced element j's
     * coordinate along it, (j / RDYN_IN) % RDYN_S, below the run's extent */
    int dyn = -1;
    int64_t dyn_in = 1;
    for (int i = 0; i < x->rank; i++) {
        if (reduced[i] && dyn >= 0)
            dyn_in *= x->shape[i];
        if (reduced[i] && is_dyn(x, i))
            dyn = i;
    }
    kr = merge_dims(kr, kshape, kstr);
    rr = merge_dims(rr, rshape, rstr);
    if (rows == 0)
        return;
    bool arg = n->op == OP_ARGMAX || n->op == OP_ARGMIN;
    Dispatch *d = new_dispatch(p, n, "reduce");
    d->local_size = row_workgroup(len);
    define_int(d, "WG", d->local_size);
    /* the output's rows follow its dynamic axis, outermost or inside (never
     * a reduced one: dynamic.c) */
    row_groups(d, rows, len, 1, true, out);
    define_int(d, "KRANK", kr);
    define_list(d, "KSHAPE", kr, kshape);
    define_list(d, "KSTRIDES", kr, kstr);
    define_int(d, "RRANK", rr);
    define_list(d, "RSHAPE", rr, rshape);
    define_list(d, "RSTRIDES", rr, rstr);
    define_str(d, "KIND", reduce_kinds[n->op]);
    define_int(d, "ARG", arg);
    define_int(d, "LAST_INDEX", arg && attr_int(n, "select_last_index"));
    if (dyn >= 0) {
        define_int(d, "RDYN_S", x->shape[dyn]);
        define_int(d, "RDYN_IN", dyn_in);
        define_str(d, "RDYN_EXT", format("uint%s", dim_expr_glsl(&x->ext[dyn], 1)));
    }
    bool need[3] = {false, false, false};
    if (arg && (x->dtype == KILN_DTYPE_I32 || x->dtype == KILN_DTYPE_I64))
        define_str(d, "ARG_T", compute_type(x->dtype));
    if (arg)
        need_dtype(p, need, KILN_DTYPE_I64);
    else
        define_storage(p, d, need, "Y", out, true);
    define_storage(p, d, need, "X", x, false);
    define_needs(d, need);
    dispatch_arg(d, out, true);
    dispatch_arg(d, x, false);
    d->flops = (uint64_t)(rows * len) * (n->op == OP_REDUCE_LOG_SUM_EXP ? 3u : 1u);
}


/* ---- selection and scans ---- */

void lower_topk(Program *p, Node *n) {
    Tensor *x = n->inputs[0];
    int axis = attr_axis(n, x->rank);
    int64_t k = attr_int(n, "k");
    if (k == 0)
        return;
    Dispatch *d = axis_dispatch(p, n, "topk", axis);
    if (!d)
        return;
    define_int(d, "K", k);
    d->flops *= (uint64_t)k;
    define_int(d, "LARGEST", attr_int(n, "largest") != 0);
    define_int(d, "NEED_I64", 1);
    p->features |= KILN_FEATURE_INT64;
    dispatch_arg(d, n->outputs[1], true);
}

/* nms: one workgroup per (batch, class) selects its boxes greedily into a
 * scratch (count, then box numbers); a second kernel, one workgroup,
 * packs every pair's rows in order, fills the rest with -1 and writes the
 * count. */
void lower_nms(Program *p, Node *n) {
    Tensor *boxes = n->inputs[0], *scores = n->inputs[1], *sel = n->outputs[0];
    int64_t B = boxes->shape[0], N = boxes->shape[1], C = scores->shape[1];
    int64_t K = sel->shape[0] / (B * C);
    if (tensor_count(sel) == 0)
        return;
    Tensor *alive = scratch(p, n, "alive", 2, (int64_t[]){B * C, N});
    Tensor *picks = scratch(p, n, "picks", 2, (int64_t[]){B * C, K + 1});
    for (int phase = 1; phase <= 2; phase++) {
        Dispatch *d = new_dispatch(p, n, "nms");
        d->local_size = 256;
        define_int(d, "WG", d->local_size);
        define_int(d, "PHASE", phase);
        define_int(d, "B", B);
        define_int(d, "C", C);
        define_int(d, "N", N);
        define_int(d, "K", K);
        define_int(d, "NEED_I64", 1);
        Attr *st = node_attr(n, "score_threshold");
        define_int(d, "SCORE_FILTER", st != NULL);
        define_float(d, "SCORE_THRESHOLD", st ? attr_float_or(n, "score_threshold", 0) : 0);
        define_float(d, "IOU_THRESHOLD", attr_float(n, "iou_threshold"));
        define_int(d, "CENTER", attr_int(n, "center_point_box") != 0);
        define_int(d, "WITH_COUNT", n->noutputs == 2);
        dispatch_arg(d, sel, phase == 2);
        dispatch_arg(d, n->noutputs == 2 ? n->outputs[1] : sel, phase == 2);
        dispatch_arg(d, boxes, false);
        dispatch_arg(d, scores, false);
        dispatch_arg(d, alive, phase == 1);
        dispatch_arg(d, picks, phase == 1);
        d->groups[0] = phase == 1 ? groups_for(B * C, 1) : 1;
        d->flops = phase == 1 ? (uint64_t)(B * C) * (uint64_t)N * (uint64_t)K * 20 : 0;
    }
    p->features |= KILN_FEATURE_INT64;
}

void lower_sample(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *seed = n->inputs[1];
    int64_t V = x->shape[x->rank - 1], rows = tensor_count(x) / V;
    /* rows follow x's dynamic axis, outermost or inside (never the last:
     * dynamic.c) */
    Dispatch *d = row_dispatch(p, n, "sample", rows, V, 1, x);
    if (!d)
        return;
    int64_t top_k = attr_int(n, "top_k");
    double temp = attr_float(n, "temperature");
    define_int(d, "GREEDY", temp == 0 || top_k == 1);
    define_int(d, "TOP_K", top_k == 0 || top_k > V ? V : top_k);
    define_float(d, "TOP_P", attr_float(n, "top_p"));
    define_float(d, "TEMPERATURE", temp == 0 ? 1 : temp);
    define_int(d, "MAX_CAND", 1024);
    define_str(d, "TSEED", buffer_type(seed->dtype, true));
    define_int(d, "NEED_I64", 1);
    p->features |= KILN_FEATURE_INT64;
    dispatch_arg(d, n->outputs[0], true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, seed, false);
}

void lower_selective_scan(Program *p, Node *n) {
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
    define_int(d, "SOFTPLUS", attr_int(n, "delta_softplus") != 0);
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


/* ---- gradients ---- */

/* layer_norm_grad, rms_norm_grad: dx a workgroup per row (keeping each
 * row's mean and rstd in a scratch), then dgamma and dbeta per column. */
void lower_norm_grad(Program *p, Node *n) {
    Tensor *dy = n->inputs[0], *x = n->inputs[1];
    int axis = (int)attr_int(n, "axis");
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
    define_float(d, "EPS", attr_float(n, "eps"));
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
