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

/* KILN_ROW_SPLIT=0: every row kernel a workgroup a row, as before the
 * splits below (the norms', softmax's, cumsum's and the reductions' chunks
 * and the reductions' invocation an output), for comparison. */
static bool row_split_off(void) {
    const char *env = getenv("KILN_ROW_SPLIT");
    return env && strcmp(env, "0") == 0;
}

/* Workgroups that fill a large GPU with a memory-bound pass over long
 * rows: eight a multiprocessor of an H100 or H200 (132). */
#define ROW_FILL_GROUPS 1024

/* How many chunks of at least 2 Ki elements each of rows rows of len is cut
 * into for about ROW_FILL_GROUPS workgroups (1: none, where there are 128
 * rows or more, or fewer than 16 Ki elements a row). */
static int64_t long_row_chunks(int64_t rows, int64_t len) {
    if (len < 16384 || rows >= 128)
        return 1;
    int64_t fill = (ROW_FILL_GROUPS + rows - 1) / rows, most = len / 2048;
    int64_t c = fill < most ? fill : most;
    int64_t chunk = (len + c - 1) / c;
    return (len + chunk - 1) / chunk; /* none empty */
}

/* Pass 1 or 2 of a split row kernel (softmax.comp, cumsum.comp SPLIT):
 * rows of len elements, inner apart, cut into chunks, a workgroup a
 * chunk; the caller adds its own defines, then split_io binds it. */
static Dispatch *split_pass(Program *p, Node *n, const char *family, int pass, int64_t rows,
                            int64_t len, int64_t inner, int64_t chunks) {
    Dispatch *d = row_dispatch(p, n, family, rows, len, inner, NULL);
    define_int(d, "SPLIT", pass);
    define_int(d, "CHUNK", (len + chunks - 1) / chunks);
    define_int(d, "CHUNKS", chunks);
    d->groups[0] = groups_for(rows * chunks, 1);
    return d;
}

/* A split pass's arguments: y (pass 1 writes none of it), x, and the
 * chunks' partials, written by pass 1 and read by pass 2. */
static void split_io(Dispatch *d, int pass, Tensor *y, Tensor *x, Tensor *partials) {
    if (pass == 1)
        dispatch_unused(d, x);
    else
        dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, partials, pass == 1);
}

/* A softmax's chunks (softmax.comp SPLIT): fixed rows along the last axis;
 * a workgroup a row left a GPU idle where there are few, long ones (a
 * softmax over 262,144 elements: 272 us on an H100, torch 61).
 * KILN_ROW_SPLIT=0 keeps a workgroup a row. */
static int64_t softmax_chunks(const Node *n, int axis) {
    const Tensor *x = n->inputs[0], *y = n->outputs[0];
    if (row_split_off() || axis != x->rank - 1 || x->dyn_axes || x->dynamic ||
        y->dyn_axes || y->dynamic)
        return 1;
    int64_t len = x->shape[axis];
    return long_row_chunks(len ? tensor_count(x) / len : 0, len);
}

void lower_softmax(Program *p, Node *n) {
    int64_t chunks = softmax_chunks(n, node_axis(n));
    if (chunks > 1) {
        Tensor *x = n->inputs[0], *y = n->outputs[0];
        int64_t len = x->shape[x->rank - 1], rows = tensor_count(x) / len;
        Tensor *stats = scratch(p, n, "stats", 1, (int64_t[]){2 * rows * chunks});
        for (int pass = 1; pass <= 2; pass++) {
            Dispatch *d = split_pass(p, n, "softmax", pass, rows, len, 1, chunks);
            define_int(d, "LOG", n->op == OP_LOG_SOFTMAX);
            bool need[3] = {false, false, false};
            define_storage(p, d, need, "Y", y, true);
            define_storage(p, d, need, "X", x, false);
            define_needs(d, need);
            split_io(d, pass, y, x, stats);
        }
        return;
    }
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

/* A cumsum's chunks (cumsum.comp SPLIT): fixed rows of f32; a workgroup a
 * row walked a long one alone (a cumsum of 2^20 elements: 2.8 ms on an
 * H100, torch 21 us). KILN_ROW_SPLIT=0 keeps a workgroup a row. */
static int64_t cumsum_chunks(const Node *n, int axis) {
    const Tensor *x = n->inputs[0], *y = n->outputs[0];
    int64_t len = x->shape[axis];
    if (row_split_off() || x->dtype != KILN_DTYPE_F32 || x->dyn_axes || x->dynamic ||
        y->dyn_axes || y->dynamic)
        return 1;
    return long_row_chunks(len ? tensor_count(x) / len : 0, len);
}

/* cumsum's direction and kind (cumsum_grad: the transpose of a cumulative
 * sum runs the other way). */
static void define_scan(Dispatch *d, Node *n) {
    define_int(d, "EXCLUSIVE", attr_int(n, "exclusive") != 0);
    define_int(d, "REVERSE", (attr_int(n, "reverse") != 0) != (n->op == OP_CUMSUM_GRAD));
}

void lower_cumsum(Program *p, Node *n) {
    int axis = node_axis(n);
    Tensor *x = n->inputs[0], *y = n->outputs[0];
    int64_t chunks = cumsum_chunks(n, axis);
    if (chunks > 1) {
        int64_t len = x->shape[axis], rows = tensor_count(x) / len;
        int64_t inner = shape_count(x->rank - axis - 1, x->shape + axis + 1);
        Tensor *sums = scratch(p, n, "sums", 1, (int64_t[]){rows * chunks});
        for (int pass = 1; pass <= 2; pass++) {
            Dispatch *d = split_pass(p, n, "cumsum", pass, rows, len, inner, chunks);
            define_scan(d, n);
            split_io(d, pass, y, x, sums);
        }
        return;
    }
    Dispatch *d = axis_dispatch(p, n, "cumsum", axis);
    if (!d)
        return;
    kiln_dtype dt = x->dtype;
    if (dt == KILN_DTYPE_I32 || dt == KILN_DTYPE_I64) { /* integer sums */
        bool need[3] = {false, false, false};
        need_dtype(p, need, dt);
        define_needs(d, need);
        define_str(d, "SCAN_T", compute_type(dt));
        define_str(d, "Y_BUF", buffer_type(dt, false));
        define_str(d, "X_BUF", buffer_type(dt, true));
    }
    define_scan(d, n);
}

/* What lower_norm works out once for norm.comp's dispatches: the
 * operands (x after a fused residual add's, res, the sum where one is
 * written, else NULL) and the rows, len elements each, inner apart; gamma
 * and beta of row r's element j at (r % pr) * pj + j / pd. */
typedef struct NormShape {
    Node *add;
    Tensor *x, *y, *res, *sum;
    bool rms, has_res;
    int first_param, nparams;
    int64_t rows, len, inner, pr, pj, pd;
    const Tensor *dyn;
} NormShape;

/* Workgroups that fill a large GPU: two a multiprocessor of an H100 or
 * H200 (132). */
#define NORM_FILL_GROUPS 256

/* How many chunks each row is cut into (1: none). A workgroup a row leaves
 * a GPU idle where there are few, long rows: a group norm of one group over
 * a feature map is one row of C x H x W elements (64 x 56 x 56 in a
 * PoolFormer), which one workgroup read at 4-8 GB/s on an H100. Fixed
 * contiguous rows of at least 16 Ki elements, fewer of them than
 * NORM_FILL_GROUPS / 2: chunks of at least 2 Ki elements, enough for
 * NORM_FILL_GROUPS workgroups, and at most 16 an invocation of 256 (so that
 * norm.comp holds its chunk in registers). KILN_ROW_SPLIT=0 keeps a
 * workgroup a row, for comparison. */
static int64_t norm_chunks(const NormShape *s) {
    if (row_split_off() || s->inner != 1 || s->x->dyn_axes || s->x->dynamic ||
        s->add || s->len < 16384 || s->rows >= NORM_FILL_GROUPS / 2)
        return 1;
    int64_t fill = (NORM_FILL_GROUPS + s->rows - 1) / s->rows;
    int64_t most = (s->len + 2047) / 2048, least = (s->len + 4095) / 4096;
    int64_t c = fill < most ? fill : most;
    c = c > least ? c : least;
    int64_t chunk = (s->len + c - 1) / c;
    return (s->len + chunk - 1) / chunk; /* none empty */
}

/* One dispatch of norm.comp. pass 0: the whole norm, a workgroup a row;
 * with chunks, pass 1 writes each chunk's mean and squared deviations to
 * stats and pass 2 combines its row's and normalizes its chunk (norm.comp
 * SPLIT). Arguments in order: y, x, gamma, beta, residual, sum, then the
 * statistics (passes 1 and 2); a slot a pass does not use holds x (never
 * touched), so each keeps its push-constant slot. */
static Dispatch *norm_pass(Program *p, Node *n, const NormShape *s, int pass, int64_t chunks,
                           Tensor *stats) {
    Dispatch *d = row_dispatch(p, n, "norm", s->rows, s->len, s->inner, s->dyn);
    if (!d)
        return NULL;
    if (pass) {
        define_int(d, "SPLIT", pass);
        define_int(d, "CHUNK", (s->len + chunks - 1) / chunks);
        define_int(d, "CHUNKS", chunks);
        d->groups[0] = groups_for(s->rows * chunks, 1);
        d->flops = 3ull * (uint64_t)(s->rows * s->len);
    }
    define_float(d, "EPS", attr_float(n, "eps"));
    define_int(d, "RMS", s->rms);
    define_int(d, "HAS_GAMMA", s->nparams > 0);
    define_int(d, "HAS_BETA", s->nparams > 1);
    define_int(d, "HAS_RES", s->has_res);
    define_int(d, "HAS_SUM", s->sum != NULL);
    define_int(d, "PR", s->pr);
    define_int(d, "PJ", s->pj);
    define_int(d, "PD", s->pd);
    Tensor *x = s->x, *res = s->has_res ? s->res : x, *sum = s->sum ? s->sum : s->y;
    bool need[3] = {false, false, false};
    define_storage(p, d, need, "Y", s->y, true);
    define_storage(p, d, need, "X", x, false);
    define_storage(p, d, need, "RES", res, false);
    define_storage(p, d, need, "SUM", sum, true);
    define_needs(d, need);
    if (pass == 1) /* the statistics pass writes neither y nor the sum */
        dispatch_unused(d, x);
    else
        dispatch_arg(d, s->y, true);
    dispatch_arg(d, x, false);
    for (int k = 0; k < 2; k++) {
        if (s->nparams > k && pass != 1)
            dispatch_arg(d, n->inputs[s->first_param + k], false);
        else
            dispatch_unused(d, x);
    }
    if (s->has_res)
        dispatch_arg(d, res, false);
    else
        dispatch_unused(d, x);
    if (s->sum && pass != 1)
        dispatch_arg(d, sum, true);
    else if (pass)
        dispatch_unused(d, x);
    if (pass)
        dispatch_arg(d, stats, pass == 1);
    return d;
}

/* norm.comp for every normalization but batch_norm. */
void lower_norm(Program *p, Node *n) {
    NormShape s;
    memset(&s, 0, sizeof s);
    s.x = n->inputs[0];
    bool residual = n->op == OP_RESIDUAL_LAYER_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    /* A residual add fused into this norm (optimize.c): one kernel adds,
     * writes the sum where anything else reads it, and normalizes. */
    Node *add = s.x->producer && s.x->producer->fused_into == n && s.x->producer->op == OP_ADD
                    ? s.x->producer : NULL;
    s.add = add;
    /* Between transposes to channels last and back (optimize.c,
     * fuse_channels_first_norms): over the channels of the untransposed
     * input, each row's elements `inner` (the positions) apart, written in
     * that layout to the second transpose's output. */
    Node *perm = n->epi_perm;
    if (perm)
        s.x = s.x->producer->inputs[0];
    Tensor *x = s.x;
    s.y = perm ? perm->outputs[0] : n->outputs[0];
    s.rms = n->op == OP_RMS_NORM || n->op == OP_RESIDUAL_RMS_NORM;
    s.first_param = residual ? 2 : 1;
    s.nparams = n->ninputs - s.first_param;
    s.pr = 1, s.pj = 0, s.pd = 1, s.inner = 1;
    bool outer_ok = false; /* rows over an outer and an inner dynamic axis */
    int64_t spatial = x->rank >= 2 ? shape_count(x->rank - 2, x->shape + 2) : 1;
    if (n->op == OP_INSTANCE_NORM) {
        s.rows = x->shape[0] * x->shape[1];
        s.len = spatial;
        s.pr = x->shape[1];
        s.pj = 1;
        s.pd = s.len;
    } else if (n->op == OP_GROUP_NORM) {
        int64_t g = attr_int(n, "groups");
        s.rows = x->shape[0] * g;
        s.len = x->shape[1] / g * spatial;
        s.pr = g;
        s.pj = x->shape[1] / g;
        s.pd = spatial;
    } else if (perm) {
        s.len = x->shape[1];
        s.inner = spatial;
        s.rows = x->shape[0] * spatial;
    } else {
        int axis = node_axis(n);
        s.len = shape_count(x->rank - axis, x->shape + axis);
        s.rows = s.len ? tensor_count(x) / s.len : 0;
        outer_ok = dyn_outer_inner(x) && inner_dyn_axis(x) < axis;
    }
    /* layer and rms norms follow a dynamic axis inside their rows too, and
     * an outer one with it */
    s.dyn = s.pr == 1 && dyn_inside(x) ? x : outer_ok ? x : dyn_of(x);
    bool write_sum = n->noutputs > 1 ||
                     (add && (add->outputs[0]->is_output || add->outputs[0]->uses > 1));
    s.has_res = residual || add;
    if (add)
        s.x = add->inputs[0];
    s.res = s.has_res ? (add ? add->inputs[1] : n->inputs[1]) : NULL;
    s.sum = write_sum ? (add ? add->outputs[0] : n->outputs[1]) : NULL;
    int64_t chunks = norm_chunks(&s);
    Dispatch *d;
    if (chunks > 1) {
        Tensor *stats = scratch(p, n, "stats", 1, (int64_t[]){2 * s.rows * chunks});
        norm_pass(p, n, &s, 1, chunks, stats);
        d = norm_pass(p, n, &s, 2, chunks, stats);
    } else {
        d = norm_pass(p, n, &s, 0, 1, NULL);
    }
    if (!d)
        return;
    /* A decoding step's row after a product (o + res, the residual add
     * fused here): the product's last workgroup normalizes it */
    if (add && n->noutputs == 1 && (n->op == OP_RMS_NORM || n->op == OP_LAYER_NORM) &&
        n->outputs[0]->rank >= 1 && s.len == n->outputs[0]->shape[n->outputs[0]->rank - 1]) {
        Tensor *gamma = s.nparams > 0 ? n->inputs[s.first_param] : NULL;
        Tensor *beta = s.nparams > 1 ? n->inputs[s.first_param + 1] : NULL;
        Tensor *o = add->inputs[0], *other = add->inputs[1];
        if (!norm_after_product(p, n, d, o, other, n->outputs[0], s.sum, gamma, beta, s.rms))
            norm_after_product(p, n, d, other, o, n->outputs[0], s.sum, gamma, beta, s.rms);
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

/* What lower_reduce works out once for reduce.comp's dispatches: the kept
 * (k) and reduced (r) dimensions with their strides in x, merged where
 * contiguous; a dynamic reduced axis (dyn, or -1) and the elements inside
 * it (dyn_in); rows outputs of len elements each. */
typedef struct ReduceShape {
    int kr, rr, dyn;
    int64_t kshape[MAX_RANK], kstr[MAX_RANK], rshape[MAX_RANK], rstr[MAX_RANK];
    int64_t dyn_in, rows, len;
} ReduceShape;

/* Whether reduce.comp gives each output an invocation (PER_THREAD), not a
 * workgroup: fixed shapes, many outputs (at least 2048: eight workgroups)
 * of at most 64 elements each, not ARGMAX / ARGMIN. KILN_ROW_SPLIT=0
 * keeps a workgroup an output. */
static bool reduce_per_thread(const Node *n, const ReduceShape *s) {
    const Tensor *x = n->inputs[0], *out = n->outputs[0];
    return !row_split_off() && s->dyn < 0 && !out->dyn_axes && !out->dynamic &&
           !x->dyn_axes && !x->dynamic && n->op != OP_ARGMAX && n->op != OP_ARGMIN &&
           s->len <= 64 && s->rows >= 2048;
}

/* Whether reduce.comp gives a workgroup 32 neighbouring outputs (COLS):
 * fixed shapes, not ARGMAX / ARGMIN, at least 32 outputs of at least 8
 * elements, the outputs' innermost axis contiguous in x and every reduced
 * axis strided (a reduction down columns, or over a sequence: [b, seq, d]
 * over seq), where a workgroup an output read its elements far apart. */
static bool reduce_cols(const Node *n, const ReduceShape *s) {
    const Tensor *x = n->inputs[0], *out = n->outputs[0];
    if (row_split_off() || s->dyn >= 0 || out->dyn_axes || out->dynamic || x->dyn_axes ||
        x->dynamic || n->op == OP_ARGMAX || n->op == OP_ARGMIN || s->rows < 32 ||
        s->len < 8 || s->kr < 1 || s->kstr[s->kr - 1] != 1)
        return false;
    for (int i = 0; i < s->rr; i++)
        if (s->rstr[i] == 1)
            return false;
    return true;
}

/* One dispatch of reduce.comp: pass 0 the whole reduction, a workgroup an
 * output (or an invocation: reduce_per_thread; or 32: reduce_cols); with chunks, pass 1 each
 * chunk's partial into part and pass 2 each output from its chunks'
 * (reduce.comp SPLIT). */
static void reduce_pass(Program *p, Node *n, const ReduceShape *s, int pass, int64_t chunks,
                        Tensor *part) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    bool arg = n->op == OP_ARGMAX || n->op == OP_ARGMIN;
    Dispatch *d = new_dispatch(p, n, "reduce");
    bool per_thread = pass == 0 && reduce_per_thread(n, s);
    bool cols = pass == 0 && !per_thread && reduce_cols(n, s);
    d->local_size = per_thread || cols ? 256 : row_workgroup(pass == 2 ? chunks : s->len);
    define_int(d, "WG", d->local_size);
    /* the output's rows follow its dynamic axis, outermost or inside (never
     * a reduced one: dynamic.c) */
    row_groups(d, s->rows, s->len, 1, true, out);
    if (per_thread) {
        define_int(d, "PER_THREAD", 1);
        d->groups[0] = groups_for(s->rows, d->local_size);
    }
    if (cols) {
        define_int(d, "COLS", 1);
        d->groups[0] = groups_for(s->rows, 32);
    }
    if (pass) {
        define_int(d, "SPLIT", pass);
        define_int(d, "CHUNK", (s->len + chunks - 1) / chunks);
        define_int(d, "CHUNKS", chunks);
        if (pass == 1)
            d->groups[0] = groups_for(s->rows * chunks, 1);
    }
    define_int(d, "KRANK", s->kr);
    define_list(d, "KSHAPE", s->kr, s->kshape);
    define_list(d, "KSTRIDES", s->kr, s->kstr);
    define_int(d, "RRANK", s->rr);
    define_list(d, "RSHAPE", s->rr, s->rshape);
    define_list(d, "RSTRIDES", s->rr, s->rstr);
    define_str(d, "KIND", reduce_kinds[n->op]);
    define_int(d, "ARG", arg);
    define_int(d, "LAST_INDEX", arg && attr_int(n, "select_last_index"));
    if (s->dyn >= 0) {
        define_int(d, "RDYN_S", x->shape[s->dyn]);
        define_int(d, "RDYN_IN", s->dyn_in);
        define_str(d, "RDYN_EXT", format("uint%s", dim_expr_glsl(&x->ext[s->dyn], 1)));
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
    if (pass == 1) /* the partials pass writes no output */
        dispatch_unused(d, x);
    else
        dispatch_arg(d, out, true);
    if (pass == 2) /* nor does the combining pass read x */
        dispatch_unused(d, part);
    else
        dispatch_arg(d, x, false);
    if (pass)
        dispatch_arg(d, part, pass == 1);
    if (pass != 2)
        d->flops = (uint64_t)(s->rows * s->len) * (n->op == OP_REDUCE_LOG_SUM_EXP ? 3u : 1u);
}

/* How many chunks each output's reduction is cut into (1: none). A
 * workgroup an output leaves a GPU idle where there are few outputs over
 * many elements: a sum of 2^24 elements was one workgroup, 5.7 ms on an
 * H100 against torch's 21 us (bench/OPS.md). Fixed shapes, not ARGMAX /
 * ARGMIN, as long_row_chunks cuts them. KILN_ROW_SPLIT=0 keeps a
 * workgroup an output, for comparison. */
static int64_t reduce_chunks(const Node *n, const ReduceShape *s) {
    const Tensor *x = n->inputs[0], *out = n->outputs[0];
    if (row_split_off() || s->dyn >= 0 || out->dyn_axes || out->dynamic ||
        x->dyn_axes || x->dynamic || n->op == OP_ARGMAX || n->op == OP_ARGMIN)
        return 1;
    return long_row_chunks(s->rows, s->len);
}

void lower_reduce(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *out = n->outputs[0];
    bool reduced[MAX_RANK];
    reduced_axes(n, reduced);
    ReduceShape s;
    memset(&s, 0, sizeof s);
    int64_t own[MAX_RANK];
    contiguous_strides(x->rank, x->shape, own);
    for (int i = 0; i < x->rank; i++) {
        if (reduced[i]) {
            s.rshape[s.rr] = x->shape[i];
            s.rstr[s.rr++] = own[i];
        } else {
            s.kshape[s.kr] = x->shape[i];
            s.kstr[s.kr++] = own[i];
        }
    }
    s.rows = tensor_count(out);
    s.len = shape_count(s.rr, s.rshape);
    /* a dynamic reduced axis (dynamic.c: one at most): reduced element j's
     * coordinate along it, (j / RDYN_IN) % RDYN_S, below the run's extent */
    s.dyn = -1;
    s.dyn_in = 1;
    for (int i = 0; i < x->rank; i++) {
        if (reduced[i] && s.dyn >= 0)
            s.dyn_in *= x->shape[i];
        if (reduced[i] && is_dyn(x, i))
            s.dyn = i;
    }
    s.kr = merge_dims(s.kr, s.kshape, s.kstr);
    s.rr = merge_dims(s.rr, s.rshape, s.rstr);
    if (s.rows == 0)
        return;
    int64_t chunks = reduce_chunks(n, &s);
    if (chunks == 1) {
        reduce_pass(p, n, &s, 0, 1, NULL);
        return;
    }
    Tensor *part = scratch(p, n, "partials", 1, (int64_t[]){2 * s.rows * chunks});
    reduce_pass(p, n, &s, 1, chunks, part);
    reduce_pass(p, n, &s, 2, chunks, part);
}


/* ---- selection and scans ---- */

/* The most candidates topk.comp's second pass selects from (CHUNKS x K):
 * its K rounds each read them all, in one workgroup a row. */
#define TOPK_CANDIDATES 8192

/* A top-k's chunks (topk.comp SPLIT): fixed rows, K of at most 64; a
 * workgroup a row made K passes over a long one alone (the 10 largest of
 * 2^20: 9.8 ms on an H100, torch 93 us). KILN_ROW_SPLIT=0 keeps a
 * workgroup a row. */
static int64_t topk_chunks(const Node *n, int axis, int64_t k) {
    const Tensor *x = n->inputs[0];
    int64_t len = x->shape[axis];
    if (row_split_off() || k > 64 || x->dyn_axes || x->dynamic || n->outputs[0]->dyn_axes ||
        n->outputs[0]->dynamic)
        return 1;
    int64_t c = long_row_chunks(len ? tensor_count(x) / len : 0, len);
    if (c * k > TOPK_CANDIDATES) { /* fewer, longer chunks */
        int64_t chunk = (len + TOPK_CANDIDATES / k - 1) / (TOPK_CANDIDATES / k);
        c = (len + chunk - 1) / chunk;
    }
    return c;
}

/* K, the order and the outputs of a topk.comp dispatch (its values, the
 * data and its indices bound before). */
static void define_topk(Program *p, Dispatch *d, Node *n, int64_t k) {
    define_int(d, "K", k);
    /* radix selection (about five passes over a row) where its K fit
     * shared memory, else K selection rounds; KILN_TOPK_RADIX=0 keeps
     * the rounds (for comparison) */
    const char *radix = getenv("KILN_TOPK_RADIX");
    define_int(d, "RADIX", k <= 256 && !(radix && strcmp(radix, "0") == 0));
    define_int(d, "LARGEST", attr_int(n, "largest") != 0);
    define_int(d, "NEED_I64", 1);
    p->features |= KILN_FEATURE_INT64;
}

void lower_topk(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *values = n->outputs[0], *indices = n->outputs[1];
    int axis = attr_axis(n, x->rank);
    int64_t k = attr_int(n, "k");
    if (k == 0)
        return;
    int64_t chunks = topk_chunks(n, axis, k);
    if (chunks > 1) {
        int64_t len = x->shape[axis], rows = tensor_count(x) / len;
        int64_t inner = shape_count(x->rank - axis - 1, x->shape + axis + 1);
        Tensor *cand = scratch(p, n, "candidates", 1, (int64_t[]){2 * rows * chunks * k});
        for (int pass = 1; pass <= 2; pass++) {
            Dispatch *d = row_dispatch(p, n, "topk", rows, len, inner, NULL);
            define_int(d, "SPLIT", pass);
            define_int(d, "CHUNK", (len + chunks - 1) / chunks);
            define_int(d, "CHUNKS", chunks);
            define_topk(p, d, n, k);
            d->groups[0] = groups_for(pass == 1 ? rows * chunks : rows, 1);
            d->flops = pass == 1 ? (uint64_t)(rows * len * k) : (uint64_t)(rows * chunks * k * k);
            if (pass == 1) { /* the candidates pass reads x only */
                dispatch_unused(d, x);
                dispatch_arg(d, x, false);
                dispatch_unused(d, x);
            } else {
                dispatch_arg(d, values, true);
                dispatch_unused(d, cand);
                dispatch_arg(d, indices, true);
            }
            dispatch_arg(d, cand, pass == 1);
        }
        return;
    }
    Dispatch *d = axis_dispatch(p, n, "topk", axis);
    if (!d)
        return;
    define_topk(p, d, n, k);
    d->flops *= (uint64_t)k;
    dispatch_arg(d, indices, true);
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
