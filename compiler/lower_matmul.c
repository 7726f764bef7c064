/*
 * lower_matmul.c: matmul, gemm, grouped_matmul and det, and which kernel a
 * product gets (matmul_dispatch): cooperative matrices for f16
 * (matmul_coopmat.c), the matrix-vector kernels for few rows
 * (matmul_matvec.c) or the tiled one, split along K where that fills the
 * GPU (matmul_tiled.c); with the products' epilogues (bias, residual norm,
 * activation) and QKV splits.
 */
#include "matmul.h"

#include <stdlib.h>
#include <string.h>

/* The environment variables that override the matmul kernels' tiles and
 * splits, or keep convolutions off them (lower_conv.c), for tuning: the
 * generated C names those that were set (emit_c.c). */
const char *const tuning_variables[] = {
    "KILN_MATMUL_TILE", "KILN_MATMUL_SPLITK", "KILN_COOPMAT_TILE", "KILN_COOPMAT_SPLITK",
    "KILN_COOPMAT_PIPE", "KILN_COOPMAT_CEILING", "KILN_MATVEC_NCOL", "KILN_MATVEC_K",
    "KILN_MATVEC_K_M", "KILN_DIRECT_CONV", "KILN_DWCONV", "KILN_FLASH", "KILN_FLASH_CM",
    "KILN_ATTN_SPLITS", "KILN_ATTN_VPRE", "KILN_SPLIT_LAST", "KILN_F16_PAIRS",
    "KILN_ROW_SPLIT", "KILN_PREFETCH", NULL};

/* The matrix-vector kernel of s for runs of lo to hi rows (multiples of
 * per, the rows a unit of the dims adds): all its column groups then, none
 * otherwise. */
static Dispatch *matvec_variant(Program *p, Node *n, MatmulShape *s, int64_t per, int64_t hi,
                                int64_t lo) {
    Dispatch *v = matmul_kernel(p, n, s, true, hi, false, 0);
    uint32_t cols = v->groups[0];
    v->dynamic = true;
    v->dyn_axis = 0;
    v->work = *s->dyn;
    v->scale = per * cols;
    v->per_group = 1;
    v->work_min = lo * cols;
    v->work_max = hi * cols;
    v->one_row = hi == 1;
    return v;
}

/* The few-rows variant of a product whose rows follow the dims: split
 * along K for runs of `least` rows (and the dims' least) up to *upto, the
 * most rows at which a fixed build of the same rows would split (the cost
 * model: split_chunk; coopmat.comp: fewer than COOPMAT_GROUPS tiles of 64 x
 * 64), its one chunk count chosen over that range (split_over_range;
 * coopmat.comp: as many as fill the GPU at the fewest). Returns the
 * dispatch that writes C (the chunks' sum, splitk.comp), or NULL where no
 * run of the range gains. Not with KILN_SPLIT_LAST or KILN_MATMUL_SPLITK
 * set. A run of fewer rows (a decoding step's one) leaves it idle: its
 * sum's barrier then falls to the next dispatch that runs, the product's
 * reader, which has one anyway. BERT-base exported with a
 * dynamic sequence, its FFN output [128, 3072] x [3072, 768] at 128 rows:
 * 24 tiles each walking K, where a fixed build splits it in 11
 * (bench/experiments/dynamic_seq.py). */
static Dispatch *few_rows_split(Program *p, Node *n, const MatmulShape *s, int64_t least,
                                int64_t *upto) {
    if (!s->dyn || s->batch != 1 || s->dyn_k || split_in_last(n) ||
        getenv("KILN_MATMUL_SPLITK"))
        return NULL;
    int64_t per = s->M / s->dyn_most;
    int64_t lo = dim_expr_min(p->graph, s->dyn) * per;
    lo = lo > least ? lo : least;
    lo = (lo + per - 1) / per * per;
    lo = lo > per ? lo : per;
    bool cm = coopmat_takes(n, s);
    int64_t hi = 0;
    /* down from the most rows, a 64-row tile at a time (the model's time
     * steps with the tiles), each a whole number of units */
    for (int64_t top = s->M; top >= lo && !hi; top = (top - 1) / 64 * 64) {
        int64_t r = top / per * per;
        if (r < lo)
            break;
        MatmulShape at = shape_at(s, r);
        double ns;
        Tiles t = pick_tiles(n, &at, false);
        if (cm ? groups_for(r, 64) * groups_for(s->N, 64) < COOPMAT_GROUPS
               : best_split(&at, t, (s->K + t.bk - 1) / t.bk, &ns) > 1)
            hi = r;
    }
    MatmulShape few = shape_at(s, hi);
    few.dyn_most = hi / per;
    few.rows_least = lo;
    /* coopmat.comp splits where K has 8 steps of 32 and the scratch takes
     * two chunks at the most rows */
    if (!hi || (cm && (s->K / 32 / 4 < 2 || split_scratch_cap(&few) < 2)))
        return NULL;
    Dispatch *sum;
    if (cm) {
        sum = coopmat_few_rows(p, n, s, lo, hi);
    } else {
        few.tile_rows = few_rows_tiles(n, &few);
        int64_t kchunk = split_chunk(&few, pick_tiles(n, &few, false));
        if (!kchunk)
            return NULL;
        int start = p->ndispatches;
        sum = split_product(p, n, &few, kchunk);
        for (int i = start; i < p->ndispatches; i++) /* the product and its sum */
            for_rows(p->dispatches[i], &few, lo, hi);
    }
    *upto = hi;
    return sum;
}

/* The tiled kernel for rows that follow the dims, or coopmat.comp where it
 * applies (a decoder's prompt in f16) with the tiled kernel as its variant;
 * runs of fewer than `least` rows give neither workgroups. Runs of few
 * rows take a variant split along K first where it gains (few_rows_split;
 * on devices without cooperative matrices the tiled kernel takes every
 * run of an f16 product). Returns the first. */
static Dispatch *dyn_tiled_dispatch(Program *p, Node *n, MatmulShape *s, int64_t least) {
    int64_t upto = 0;
    Dispatch *few = few_rows_split(p, n, s, least, &upto);
    if (few && upto >= s->M && !coopmat_takes(n, s))
        return few; /* it takes every run */
    Dispatch *cm = coopmat_kernel(p, n, s);
    Dispatch *first = cm ? with_tiled_variant(p, n, s, cm)
                         : matmul_kernel(p, n, s, false, 0, false, 0);
    for (Dispatch *v = first; v; v = v->variant)
        v->work_min = least;
    if (!few)
        return first;
    first->work_min = upto + 1; /* rows after the few-rows variants' */
    Dispatch *last = few;
    while (last->variant)
        last = last->variant;
    last->variant = first;
    return few;
}

/* The kernel by the rows: matrix-vector up to MATVEC_MAX_M, else tiled.
 * Dynamic rows that can be either get both, recorded one after the other:
 * each run gives one of them its groups and the other none (work_min and
 * work_max over the run's rows), and no barrier separates them; a decode
 * step's product has a third, the matrix-vector kernel for exactly one
 * row, first. Returns the first; d->variant is the next. *why: the rule
 * that chose (kiln inspect -v, the JSON's "why"). */
static Dispatch *choose_kernel(Program *p, Node *n, MatmulShape *s, const char **why) {
    if (s->dyn_k) { /* a dynamic contracted axis: the tiled kernel, K at run time */
        *why = "K follows the dims: the tiled kernel, K read at run time";
        return matmul_kernel(p, n, s, false, 0, false, 0);
    }
    if (n->wkmajor) { /* its weight encoded K-major (quantize.c): column n at n * K */
        s->b_sk = 1;
        s->b_sn = s->K;
    }
    /* devices with cooperative matrices of workgroup scope run
     * coopmat_wg.comp, others with cooperative matrices coopmat.comp (its
     * dispatches from `before` on), the rest the tiled kernel */
    Dispatch *wg = s->dyn ? NULL : coopmat_wg_kernel(p, n, s);
    int before = p->ndispatches;
    Dispatch *cm = s->dyn ? NULL : coopmat_kernel(p, n, s);
    if (wg && !cm)
        internal_error("coopmat_wg.comp without coopmat.comp for node '%s'", n->name);
    if (wg)
        for (int i = before; i < p->ndispatches; i++)
            p->dispatches[i]->unless |= KILN_FEATURE_COOPMAT_WG;
    if (cm) { /* devices without cooperative matrices run the tiled kernel */
        with_tiled_variant(p, n, s, cm);
        *why = wg ? "f16 operands: coopmat_wg.comp where the device has cooperative matrices "
                    "of workgroup scope, else coopmat.comp, else the tiled kernel"
                  : "f16 operands: coopmat.comp where the device has cooperative matrices, "
                    "else the tiled kernel";
        if (!wg)
            return cm;
        wg->variant = cm;
        return wg;
    }
    const char *refusal = coopmat_refusal(n, s);
    if (s->ops[1].t->dtype == KILN_DTYPE_F16 && refusal)
        *why = format("not on the matrix units (%s); ", refusal);
    else if (s->dyn && coopmat_takes(n, s))
        *why = "not on the matrix units (the rows follow the dims); ";
    else
        *why = "";
    if (s->M <= MATVEC_MAX_M && s->M > 1 && s->dyn && n->wkmajor &&
        s->M / s->dyn_most == 1) { /* one row, then 2 to M (see below) */
        *why = format("%sa decoding step's rows: a kernel for one row, one for 2 to %lld",
                      *why, (long long)s->M);
        Dispatch *one = matvec_variant(p, n, s, 1, 1, 1);
        one->variant = matvec_variant(p, n, s, 1, s->M, 2);
        return one;
    }
    if (s->M <= MATVEC_MAX_M) {
        *why = format("%sat most %d rows: the matrix-vector kernel", *why, MATVEC_MAX_M);
        return matmul_kernel(p, n, s, true, s->M, false, 0);
    }
    /* Fixed f32 products with at least 128 tiles of 128 x 256 run on those
     * where the device has 48 KiB of shared memory (H200: 3.5 against 4.2
     * ms at 4096), on 128 x 128 (or smaller) tiles elsewhere; not with 64
     * rows or fewer, half of a 128-row tile (a 1 x 1 convolution of 64
     * channels over 32 images: 102 against 72 us on 64 x 128 tiles). */
    if (!s->dyn && s->M > 64 && matmul_vec4_shape(n, s) && !conv_narrow(s) &&
        (s->M + 127) / 128 * ((s->N + 255) / 256) * s->batch >= 128 &&
        !getenv("KILN_MATMUL_TILE")) {
        *why = format("%s128 or more tiles of 128 x 256: those where the device has 48 KiB of "
                      "shared memory, else 128 x 128", *why);
        Dispatch *w = matmul_kernel(p, n, s, false, 0, true, 0);
        w->needs = KILN_FEATURE_SHARED48K;
        w->variant = matmul_kernel(p, n, s, false, 0, false, 0);
        w->variant->unless = KILN_FEATURE_SHARED48K;
        return w;
    }
    int64_t kchunk = split_chunk(s, pick_tiles(n, s, false));
    if (kchunk) {
        *why = format("%stoo few tiles to fill the GPU: K in chunks of %lld, summed after",
                      *why, (long long)kchunk);
        return split_product(p, n, s, kchunk);
    }
    int64_t per = s->dyn ? s->M / s->dyn_most : 0; /* rows per unit */
    /* a K-major weight: matvec_k.comp up to MATVEC_K_DYN_M rows
     * (KILN_MATVEC_K_M=R, 1 to that, fewer: for tuning) */
    int64_t most = n->wkmajor ? MATVEC_K_DYN_M : MATVEC_MAX_M;
    const char *tune_m = getenv("KILN_MATVEC_K_M");
    if (n->wkmajor && tune_m && atoi(tune_m) >= 1 && atoi(tune_m) <= MATVEC_K_DYN_M)
        most = atoi(tune_m);
    if (!s->dyn) {
        *why = format("%sthe tiled kernel", *why);
        return matmul_kernel(p, n, s, false, 0, false, 0);
    }
    if (per > most) {
        *why = format("%srows that follow the dims, more than %lld a unit: the tiled kernel",
                      *why, (long long)most);
        return dyn_tiled_dispatch(p, n, s, 0);
    }
    *why = format("%srows that follow the dims: the matrix-vector kernel up to %lld, tiled "
                  "above", *why, (long long)(most / per * per));
    int64_t small = most / per * per; /* the most rows the matvec one takes */
    /* A decoding step's one row on a kernel built for one (as above): its
     * arrays and the partial sums it reduces are the rows' (bench/
     * experiments/matvec_k_dyn-h200.txt: 2048 x 2560 f16 8.6 -> 6.0 us on
     * the H200, 2048 x 11264 int4 17.0 -> 15.5). Recorded first: the
     * variants go in the order of their rows. */
    Dispatch *one = n->wkmajor && per == 1 && small > 1 ? matvec_variant(p, n, s, 1, 1, 1)
                                                        : NULL;
    Dispatch *v = matvec_variant(p, n, s, per, small, one ? 2 : 1);
    v->variant = dyn_tiled_dispatch(p, n, s, small + 1);
    if (!one)
        return v;
    one->variant = v;
    return one;
}

/* choose_kernel, each dispatch it made given the rule that chose it. */
Dispatch *matmul_dispatch(Program *p, Node *n, MatmulShape *s) {
    if (s->M * s->N * s->batch == 0)
        return NULL;
    int first = p->ndispatches;
    const char *why = NULL;
    Dispatch *d = choose_kernel(p, n, s, &why);
    for (int i = first; i < p->ndispatches; i++)
        if (!p->dispatches[i]->why)
            p->dispatches[i]->why = why;
    return d;
}

/* The bias slot of a matmul kernel: bias read at BIAS_SM * m + BIAS_SN * n
 * (strides of bo) and added times beta, or, without one, a slot the kernel
 * does not touch (a's address). */
void bind_bias(Dispatch *d, Tensor *bias, Operand bo, double beta, Tensor *a) {
    if (!bias) {
        dispatch_unused(d, a);
        return;
    }
    define_int(d, "HAS_BIAS", 1);
    define_float(d, "BETA", beta);
    define_int(d, "BIAS_SM", bo.strides[0]);
    define_int(d, "BIAS_SN", bo.strides[1]);
    dispatch_arg(d, bias, false);
}

bool norm_after_product(Program *p, Node *n, Dispatch *nd, Tensor *o, Tensor *res,
                        Tensor *y, Tensor *sum, Tensor *gamma, Tensor *beta, bool rms) {
    Node *prod = o->producer;
    if (!prod || prod->fused_into || o->uses != 1 || o->is_output || !every_run(nd) ||
        !shape_equal(o, res) || (sum && !shape_equal(sum, o)) || !shape_equal(y, o))
        return false;
    Dispatch *one = one_row_of(p, prod, nd);
    int64_t N = o->shape[o->rank - 1];
    /* C is o's whole row, the norm over it; gamma and beta per element; not
     * a QKV split's product */
    if (!one || one->args[0] != o || prod->nsiblings ||
        (gamma && tensor_count(gamma) != N) || (beta && tensor_count(beta) != N) ||
        /* each invocation holds its N / WG elements in registers */
        (N + one->local_size - 1) / one->local_size > 64)
        return false;
    /* f32 or f16; 16-bit storage where a half is read or written: the
     * kernel's needs are defined already (define_operand_types), from its
     * A and C */
    bool f16 = o->dtype == KILN_DTYPE_F16 || one->args[1]->dtype == KILN_DTYPE_F16;
    Tensor *all[6] = {o, res, y, sum, gamma, beta};
    for (int k = 0; k < 6; k++)
        if (all[k] && all[k]->dtype != KILN_DTYPE_F32 &&
            (all[k]->dtype != KILN_DTYPE_F16 || !f16))
            return false;
    define_int(one, "LAST_NORM", 1);
    define_int(one, "NORM_RMS", rms);
    define_int(one, "NORM_GAMMA", gamma != NULL);
    define_int(one, "NORM_BETA", beta != NULL);
    define_int(one, "NORM_SUM", sum != NULL);
    define_float(one, "EPS", attr_float(n, "eps"));
    bool need[3] = {false, false, false}; /* recorded already (f16) */
    define_storage(p, one, need, "NRES", res, false);
    define_storage(p, one, need, "NG", gamma ? gamma : res, false);
    define_storage(p, one, need, "NB", beta ? beta : res, false);
    define_storage(p, one, need, "NY", y, true);
    define_storage(p, one, need, "NSUM", sum ? sum : y, true);
    while (one->nargs < 8) /* c, a, b, bias, scales, zero points, the split's two */
        dispatch_unused(one, o);
    bind_counters(p, one, 1);
    dispatch_arg(one, res, false);
    if (gamma)
        dispatch_arg(one, gamma, false);
    else
        dispatch_unused(one, res);
    if (beta)
        dispatch_arg(one, beta, false);
    else
        dispatch_unused(one, res);
    dispatch_arg(one, y, true);
    if (sum)
        dispatch_arg(one, sum, true);
    else
        dispatch_unused(one, y);
    /* the norm's own dispatch: runs of two rows or more */
    nd->work_min = 2 * nd->scale;
    return true;
}

/* QKV split (optimize.c): the product's columns [0, N0) are n's output,
 * the next N1 its first sibling's, the rest its second's; each a row-major
 * [M, width] tensor (B is one 2-D weight, so the batch folded into M). The
 * kernels take the siblings' outputs after the scale and zero-point slots
 * (bind_weight_scales). A sibling's output that a decoder appends to its
 * cache state (a view of it; append_region) is written there directly,
 * SPLIT_BASE1 or 2 elements in. */
static void bind_split(Program *p, Dispatch *d, Node *n, const MatmulShape *s) {
    /* several batches: C's [batch, M, N] (KILN_STORE_C's rows) */
    if (s->batch != 1 && (s->brank != 1 || s->ops[0].strides[0] != s->M * s->N))
        internal_error("node '%s': a split product with %lld batches", n->name,
                       (long long)s->batch);
    Tensor *a = n->inputs[0];
    /* the parts: n's output and its siblings' (each product's last tensor,
     * its bias add's where it has one), or a gemm's Split's outputs */
    Tensor *part[3] = {n->epi_bias ? n->epi_bias->outputs[0] : n->outputs[0], NULL, NULL};
    int nparts = 1 + n->nsiblings;
    for (int k = 0; k < n->nsiblings; k++) {
        Node *sib = n->siblings[k];
        part[k + 1] = sib->epi_bias ? sib->epi_bias->outputs[0] : sib->outputs[0];
    }
    if (n->split_out) {
        nparts = n->split_out->noutputs;
        for (int k = 0; k < nparts; k++)
            part[k] = n->split_out->outputs[k];
    }
    int64_t n0 = part[0]->shape[part[0]->rank - 1];
    int64_t n1 = part[1]->shape[part[1]->rank - 1];
    define_int(d, "SPLIT_N0", n0);
    define_int(d, "SPLIT_N1", nparts > 2 ? n1 : s->N - n0);
    for (int k = 0; k + 1 < nparts; k++) {
        Tensor *t = part[k + 1];
        Operand region;
        if (append_region(p, t, &region)) {
            define_str(d, format("SPLIT_BASE%d", k + 1),
                       region.dyn_base ? format("uint(%s)", dim_expr_glsl(&region.base_expr, 1))
                                       : format("%lldu", (long long)region.base));
            t = region.t;
        }
        dispatch_arg(d, t, true);
    }
    if (nparts < 3)
        dispatch_unused(d, a);
}

/* s's rows follow axis of A: its run extent, at most its size. */
static void follow_rows(MatmulShape *s, const Tensor *a, int axis) {
    s->dyn = &a->ext[axis];
    s->dyn_most = a->shape[axis];
}

/* The outer batch axis of a product A x B = C that follows the dims
 * (axis 0 of A and C, of one rank, with the same extent, and of B where B
 * has batch axes: B's rank the same), and that is a batch axis (A's rows
 * and contracted axis after it): its extent, else NULL. */
static const DimExpr *outer_batch(const Tensor *a, const Tensor *b, const Tensor *c) {
    if (a->rank < 3 || c->rank != a->rank || !is_dyn(a, 0) || !is_dyn(c, 0) ||
        !dim_expr_eq(&a->ext[0], &c->ext[0]))
        return NULL;
    if (b->rank > 2 && (b->rank != a->rank || (is_dyn(b, 0) && !dim_expr_eq(&b->ext[0],
                                                                            &a->ext[0])) ||
                        (!is_dyn(b, 0) && b->shape[0] != 1)))
        return NULL;
    return &a->ext[0];
}

/* Whether a product of one batch whose A follows the dims along its outer
 * axis and others (its batch folded into the rows: one that
 * batched_dyn_rows leaves out) takes the run's outer blocks of rows only
 * (each block of rows at its largest, a prefix of A's and C's rows). */
static bool outer_rows(const Tensor *a, const Tensor *c) {
    return a->rank >= 3 && c->rank == a->rank && a->shape[0] > 1 && is_dyn(a, 0) &&
           is_dyn(c, 0) && dim_expr_eq(&a->ext[0], &c->ext[0]) && !is_dyn(a, a->rank - 1);
}

/* Whether a batched product's rows follow the dims batch by batch: A's
 * row axis (the one before K) dynamic and no batch axis of A, B or C but
 * an outer one (outer_batch: then the run's batches only); C's rows the
 * same (a QKV split's parts too, each [batch, rows, width] as C's columns
 * of it lie). K may be dynamic too (dyn_k), and C's columns (B's then:
 * computed at their largest). */
static bool batched_dyn_rows(const Tensor *a, const Tensor *b,
                             const Tensor *c) {
    /* an outer batch axis (0) that follows the dims in A and C alike (and
     * in B where B is batched): the run's batches only (outer_batch) */
    uint32_t outer = outer_batch(a, b, c) ? 1u : 0u;
    if (a->rank < 3 || a->dynamic ||
        (a->dyn_axes & ~(1u << (a->rank - 1))) != (1u << (a->rank - 2) | outer) ||
        (c->dyn_axes & ~(1u << (c->rank - 1))) != (1u << (c->rank - 2) | outer) ||
        !dim_expr_eq(&a->ext[a->rank - 2], &c->ext[c->rank - 2]))
        return false;
    return b->rank <= 2 ||
           (b->dyn_axes & ((1u << (b->rank - 2)) - 1)) == (outer & b->dyn_axes);
}

/* A product over a dynamic outer batch of one batch up ([b, seq, K] x
 * [K, N], b from 1; batched_dyn_rows: rows s->dyn in each of the batches
 * s->dyn_batch): runs of one batch take the kernels of the unbatched
 * product of seq rows, as a build with b fixed at 1 takes them (split
 * along K for few rows, matrix-vector for fewer), the others the batched
 * kernels, whose tiles and lack of a split suit many rows. A dim derived
 * here, t = min(b - 1, 1), chooses: the one-batch kernels' rows are seq +
 * most * t (past their most where b > 1: none runs), the batched ones'
 * seq - most * (1 - t) (none runs where b is 1). ext: the two extents,
 * which the dispatches' defines and s->dyn (the batched ones' after this)
 * point to. Returns the first dispatch, the one-batch ones then the
 * batched ones as its variants; NULL where this does not apply (s
 * unchanged). Measured on an H200: BERT-base exported with a dynamic batch
 * and sequence, at b 1 and seq 128 (f32) its FFN output product [128,
 * 3072] x [3072, 768] 218 -> 53 us, split along K as the b = 1 build's
 * (bench/experiments/dynamic-seq-h200.txt). */
static Dispatch *one_batch_dispatch(Program *p, Node *n, MatmulShape *s, DimExpr ext[2]) {
    Graph *g = p->graph;
    /* rows above the matrix-vector kernel's most (which computes them all
     * in fixed work) */
    if (!s->dyn || s->M <= MATVEC_MAX_M || !s->dyn_batch || s->batch_per != 1 ||
        s->brank != 1 || s->dyn_k || s->conv.in[0] || dim_expr_min(g, s->dyn_batch) != 1 ||
        dim_expr_max(g, s->dyn_batch) < 2)
        return NULL;
    DimExpr less = *s->dyn_batch, one = {1, {0}}, t;
    less.c0 -= 1;
    if (!derive_dim(g, DIM_MIN, &less, &one, &t))
        return NULL;
    DimExpr most_t = dim_expr_scale(&t, s->dyn_most);
    ext[0] = dim_expr_add(s->dyn, &most_t);
    ext[1] = ext[0];
    ext[1].c0 -= s->dyn_most;
    MatmulShape one_batch = *s;
    one_batch.batch = 1;
    one_batch.bshape[0] = 1;
    for (int i = 0; i < 3; i++)
        one_batch.ops[i].strides[0] = 0;
    one_batch.dyn_batch = NULL;
    one_batch.batch_per = 0;
    one_batch.dyn = &ext[0];
    int start = p->ndispatches;
    Dispatch *first = matmul_dispatch(p, n, &one_batch);
    for (int i = start; i < p->ndispatches; i++) { /* none past the most rows */
        Dispatch *d = p->dispatches[i];
        if (!d->dynamic)
            internal_error("node '%s': a one-batch kernel of fixed work", n->name);
        int64_t cap = s->dyn_most * d->scale;
        d->work_max = d->work_max < cap ? d->work_max : cap;
    }
    Dispatch *last = first;
    while (last->variant)
        last = last->variant;
    s->dyn = &ext[1];
    last->variant = matmul_dispatch(p, n, s);
    return first;
}

void lower_matmul(Program *p, Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1], *out = n->outputs[0];
    MatmulShape s = {0};
    s.K = a->shape[a->rank - 1];
    s.M = a->rank >= 2 ? a->shape[a->rank - 2] : 1;
    s.N = b->rank >= 2 ? b->shape[b->rank - 1] : 1;
    s.a_sm = s.K;
    s.a_sk = 1;
    s.b_sk = b->rank >= 2 ? s.N : 1;
    s.b_sn = 1;
    /* Batch dimensions of the output and each operand's strides over them
     * (stride 0 where broadcast). */
    s.brank = out->rank - (a->rank >= 2) - (b->rank >= 2);
    s.ops[0] = (Operand){out, {0}, 0, false, {0, {0}}};
    s.ops[1] = (Operand){a, {0}, 0, false, {0, {0}}};
    s.ops[2] = (Operand){b, {0}, 0, false, {0, {0}}};
    memcpy(s.bshape, out->shape, sizeof(int64_t) * (size_t)s.brank);
    int64_t sa = s.M * s.K, sb = s.K * s.N, so = s.M * s.N;
    for (int i = s.brank - 1; i >= 0; i--) {
        int ja = i - (s.brank - (a->rank - 2)), jb = i - (s.brank - (b->rank - 2));
        s.ops[0].strides[i] = so;
        so *= s.bshape[i];
        if (a->rank > 2 && ja >= 0 && a->shape[ja] == s.bshape[i]) {
            s.ops[1].strides[i] = sa;
            sa *= s.bshape[i];
        }
        if (b->rank > 2 && jb >= 0 && b->shape[jb] == s.bshape[i]) {
            s.ops[2].strides[i] = sb;
            sb *= s.bshape[i];
        }
    }
    s.batch = shape_count(s.brank, s.bshape);
    s.brank = collapse(s.brank, s.bshape, 3, s.ops);
    /* Rows that follow the dims in each of several batches: A's row axis
     * (as [2, seq, K] x [K, N], two batches of seq rows at their largest
     * strides), not folded into M, where its rows would be no prefix. */
    bool batch_rows = batched_dyn_rows(a, b, out);
    /* A shared B and an unbroadcast A: fold the batch into M. */
    if (!batch_rows && s.brank == 1 && s.ops[2].strides[0] == 0 &&
        s.ops[1].strides[0] == s.M * s.K && a->rank >= 2) {
        s.M *= s.bshape[0];
        s.batch = 1;
        s.bshape[0] = 1;
        s.ops[0].strides[0] = s.ops[1].strides[0] = 0;
    }
    /* A fused epilogue (optimize.c): the dispatch writes the last tensor of
     * the group, adding a per-column (or, unbatched, per-element) bias and
     * applying the activation. */
    Node *last = n->epi_act ? n->epi_act : n->epi_bias;
    if (last)
        s.ops[0].t = last->outputs[0];
    /* Rows follow A's prefix extent in one batch, or its row axis in each
     * batch (above); other products with a dynamic A compute their largest
     * shape. */
    if (s.batch == 1 && a->dynamic)
        follow_rows(&s, a, a->dyn_axis);
    else if (s.batch == 1 && outer_rows(a, out))
        follow_rows(&s, a, 0);
    else if (batch_rows && s.batch > 1)
        follow_rows(&s, a, a->rank - 2);
    if (batch_rows && s.batch > 1 && outer_batch(a, b, out)) {
        s.dyn_batch = outer_batch(a, b, out);
        s.batch_per = s.batch / out->shape[0];
    }
    if (is_dyn(a, a->rank - 1))
        s.dyn_k = &a->ext[a->rank - 1];
    DimExpr one_batch_ext[2];
    Dispatch *first = one_batch_dispatch(p, n, &s, one_batch_ext);
    if (!first)
        first = matmul_dispatch(p, n, &s);
    for (Dispatch *d = first; d; d = d->variant) {
        if (n->epi_act)
            define_str(d, "ACT(x)", activation_expr(op_info[n->epi_act->op].name));
        Tensor *bias = NULL;
        Operand bo = whole(a);
        if (n->qkv_bias) { /* a QKV split's biases side by side */
            bias = n->qkv_bias;
            bo = broadcast(bias, 2, (int64_t[]){s.M, s.N});
        } else if (n->epi_bias) {
            bias = other_input(n->epi_bias, out);
            bo = broadcast(bias, 2, (int64_t[]){s.M, s.N});
            if (bias->rank >= 2 && bias->shape[bias->rank - 2] != 1)
                bo = broadcast(bias, 2, (int64_t[]){out->shape[out->rank - 2], s.N});
        }
        bind_bias(d, bias, bo, 1.0, a);
        bind_weight_scales(d, n, n->nsiblings != 0);
        if (n->nsiblings)
            bind_split(p, d, n, &s);
    }
}

/* A fused epilogue's activation over its float accumulator x: the named
 * ACTIVATION row's expression (ops.def) with the operand a as x and the
 * compute type CT as float; "(x)" for none. */
static const char *activation_name(void *ctx, const char *ident) {
    (void)ctx;
    return strcmp(ident, "a") == 0 ? "(x)" : strcmp(ident, "CT") == 0 ? "float" : NULL;
}

const char *activation_expr(const char *name) {
    int op = activation_lookup(name);
    if (op < 0)
        internal_error("activation '%s' is not an ACTIVATION row of ops.def", name);
    if (op == OP_COUNT)
        return "(x)";
    const char *e = op_info[op].expr, *bar = strchr(e, '#'); /* the float variant */
    return rewrite_identifiers(bar ? format("%.*s", (int)(bar - e), e) : e, activation_name,
                               NULL);
}

/* One product C [M, N] = op(A) op(B) of whole 2-D tensors, op a transpose
 * when ta / tb; A's rows dynamic when A is. */
MatmulShape matrix_product(Tensor *c, Tensor *a, Tensor *b, int64_t M, int64_t N,
                           int64_t K, bool ta, bool tb) {
    MatmulShape s = {0};
    s.M = M;
    s.N = N;
    s.K = K;
    s.a_sm = ta ? 1 : K;
    s.a_sk = ta ? M : 1;
    s.b_sk = tb ? 1 : N;
    s.b_sn = tb ? K : 1;
    s.batch = 1;
    s.brank = 1;
    s.bshape[0] = 1;
    s.ops[0] = (Operand){c, {0}, 0, false, {0, {0}}};
    s.ops[1] = (Operand){a, {0}, 0, false, {0, {0}}};
    s.ops[2] = (Operand){b, {0}, 0, false, {0, {0}}};
    if (a->dynamic)
        follow_rows(&s, a, a->dyn_axis);
    return s;
}

/* gemm: Y = act(alpha * op(A) op(B) + beta * C), op a transpose when asked;
 * the transposes are strides, bias and activation the matmul's epilogue
 * (the activation its own, or one fused after it: epi_act, optimize.c). */
void lower_gemm(Program *p, Node *n) {
    Tensor *a = n->inputs[0], *b = n->inputs[1], *y = n->outputs[0];
    Tensor *out = n->epi_act ? n->epi_act->outputs[0]
                  : n->split_out ? n->split_out->outputs[0] : y;
    bool ta = attr_int(n, "trans_a") != 0, tb = attr_int(n, "trans_b") != 0;
    MatmulShape s = matrix_product(out, a, b, y->shape[0], y->shape[1],
                                   ta ? a->shape[0] : a->shape[1], ta, tb);
    Attr *act = node_attr(n, "activation");
    const char *act_name = n->epi_act ? op_info[n->epi_act->op].name
                                      : act ? act->scalar : "none";
    for (Dispatch *d = matmul_dispatch(p, n, &s); d; d = d->variant) {
        define_float(d, "ALPHA", attr_float(n, "alpha"));
        define_str(d, "ACT(x)", activation_expr(act_name));
        Tensor *c = n->ninputs > 2 ? n->inputs[2] : NULL;
        bind_bias(d, c, c ? broadcast(c, 2, y->shape) : whole(a),
                  attr_float(n, "beta"), a);
        bind_weight_scales(d, n, n->split_out != NULL);
        if (n->split_out)
            bind_split(p, d, n, &s);
    }
}

/* grouped_matmul: grouped.comp, NCOL columns of GROUPED_RB rows a workgroup
 * (NCOL x KSPLIT invocations), each row reading its own expert's matrix. */
#define GROUPED_RB 4
#define GROUPED_NCOL 32
#define GROUPED_KSPLIT 8

void lower_grouped_matmul(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *w = n->inputs[1], *idx = n->inputs[2], *y = n->outputs[0];
    int64_t K = w->shape[1], N = w->shape[2], M = tensor_count(idx);
    if (M * N == 0)
        return;
    Dispatch *d = new_dispatch(p, n, "grouped");
    bool need[3] = {false, false, false};
    need_dtype(p, need, idx->dtype);
    define_needs(d, need);
    d->local_size = GROUPED_NCOL * GROUPED_KSPLIT;
    define_int(d, "M", M);
    define_int(d, "N", N);
    define_int(d, "K", K);
    define_int(d, "E", w->shape[0]);
    define_int(d, "RB", GROUPED_RB);
    define_int(d, "NCOL", GROUPED_NCOL);
    define_int(d, "KSPLIT", GROUPED_KSPLIT);
    define_str(d, "TIDX", buffer_type(idx->dtype, true));
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, w, false);
    dispatch_arg(d, idx, false);
    if (n->ninputs > 3) {
        define_int(d, "HAS_BIAS", 1);
        dispatch_arg(d, n->inputs[3], false);
    } else {
        dispatch_unused(d, x);
    }
    d->flops = 2ull * (uint64_t)(M * N) * (uint64_t)K;
    d->groups[0] = groups_for(N, GROUPED_NCOL);
    d->groups[1] = groups_for(M, GROUPED_RB);
}

/* det: one invocation per matrix, Gaussian elimination with partial
 * pivoting on a copy in a scratch tensor. */
void lower_det(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *y = n->outputs[0];
    int64_t M = x->shape[x->rank - 1], count = tensor_count(y);
    if (count == 0)
        return;
    Tensor *work = scratch(p, n, "lu", 2, (int64_t[]){count, M * M});
    Dispatch *d = new_dispatch(p, n, "det");
    d->local_size = 64;
    define_int(d, "WG", d->local_size);
    define_int(d, "COUNT", count);
    define_int(d, "M", M);
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, work, true);
    d->groups[0] = groups_for(count, d->local_size);
    d->flops = (uint64_t)count * (uint64_t)(M * M * M) * 2 / 3;
}
