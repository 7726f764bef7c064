/*
 * lower.h: what the lowering files share. lower.c (the driver: the table
 * of lowerings, dims and states) calls lower_<family>.c, one per op family
 * named as in shaders/, which call lower_dispatch.c (a dispatch, its
 * defines and arguments, operands, the shared builders): the dependencies
 * run one way. Each section is named after the file that defines it;
 * every op's lowering function is declared from ops.def at the end.
 */
#ifndef KILN_LOWER_H
#define KILN_LOWER_H

#include "kiln.h"

#define MAX_GROUPS 65535u /* workgroups per dimension: kernels loop past it */

#define ITER_RANK (2 * MAX_RANK) /* tile iterates over twice the rank */
#define MAX_OPS 7                /* the output and up to 6 inputs */

/* A tensor as an elementwise kernel walks it: element strides over the
 * iteration shape (0: broadcast, negative: a reversed slice) and the element
 * where index 0 lands. */
typedef struct Operand {
    Tensor *t;
    int64_t strides[ITER_RANK];
    int64_t base;
    /* A base that follows the dynamic dimensions (a concatenation after a
     * dynamic piece): base_expr elements, base unused. */
    bool dyn_base;
    DimExpr base_expr;
} Operand;

/* One matrix product per batch: element (m, k) of A at a_sm*m + a_sk*k,
 * (k, n) of B at b_sk*k + b_sn*n, batches over bshape with per-operand
 * strides ops[0] (C), ops[1] (A), ops[2] (B). */
typedef struct MatmulShape {
    int64_t M, N, K, a_sm, a_sk, b_sk, b_sn, batch;
    int brank;
    int64_t bshape[ITER_RANK];
    Operand ops[3];
    /* Rows that follow the dynamic dimensions: a unit of the run's extent
     * *dyn (of at most dyn_most) adds M / dyn_most rows to each batch, M
     * the most; NULL for fixed rows. */
    const DimExpr *dyn;
    int64_t dyn_most;
    /* An outer batch axis that follows the dims (batch axis 0 of A and C,
     * B's too where it is batched; rows following the dims in each
     * batch): its run extent, each unit batch_per of the batches, or NULL;
     * the kernels loop over the run's batches only (BATCH_RUN). */
    const DimExpr *dyn_batch;
    int64_t batch_per;
    /* Dynamic rows split along K (the few-rows variant of a product whose
     * rows follow the dims, lower_matmul.c dyn_tiled_dispatch): the
     * fewest rows of the runs it serves, the split chosen for them; 0 for
     * none. */
    int64_t rows_least;
    /* The rows whose tiles pick_tiles gives the tiled kernel (0: M): for
     * the few-rows variant, the rows over its range whose tiles serve the
     * range best (few_rows_tiles). */
    int64_t tile_rows;
    /* K's run extent when the contracted axis is dynamic (the tiled kernel
     * only, K then a run-time value; strides stay at the largest K). */
    const DimExpr *dyn_k;
    /* B as a 2-D convolution's im2col matrix, read from its input on the
     * fly (matmul.comp's CONV): the input's height and width, the kernel's,
     * strides, pads at the beginning, dilations, and the output's width;
     * conv.in[0] 0 for a plain B. Several images fold into N where
     * conv.images is not 0 (plain B or not): N is images * positions (the
     * output's OH * OW), each image's input in_img elements after the
     * last, C [images, M, positions]. klast: A (the weights) is [OC, KH,
     * KW, C], K in the order (kh, kw, ci), of `channels` input channels.
     * With conv.dyn_images the kernels' tiles end at the run's columns
     * (N_RUN). */
    struct {
        int64_t in[2], k[2], stride[2], pad[2], dil[2], out_w;
        int64_t images, positions, in_img;
        int64_t channels;
        bool klast;
        /* a dynamic batch of images (dynamic_images): their run extent,
         * N's columns following it (positions a unit), and its least
         * value, 1 at least (the split along K is chosen over the range) */
        const DimExpr *dyn_images;
        int64_t images_min;
    } conv;
    const Tensor *res; /* a convolution's residual (HAS_RES), f32 or f16 */
} MatmulShape;

/* t when its size follows the dynamic dimensions, else NULL. */
static inline const Tensor *dyn_of(const Tensor *t) { return t->dynamic ? t : NULL; }
/* t when its size follows the dims along one axis, in the prefix layout or
 * inside (an elementwise dispatch follows either), else NULL. */
static inline const Tensor *dyn_one(const Tensor *t) {
    return t->dyn_axes && !(t->dyn_axes & (t->dyn_axes - 1)) ? t : NULL;
}
/* t when it follows the dims along its outermost axis (0, of more than
 * one at its largest) and one axis inside (a dynamic batch and sequence:
 * [b, seq, 768], [b, heads, seq, 64]), else NULL: rows walk the run's
 * extents of both (row_groups, axis_dispatch; elementwise dispatches and
 * copies walk those of any several, dyn_several). */
static inline const Tensor *dyn_outer_inner(const Tensor *t) {
    uint32_t in = t->dyn_axes & ~1u;
    return t->rank >= 2 && t->shape[0] > 1 && (t->dyn_axes & 1u) && in && !(in & (in - 1))
               ? t
               : NULL;
}
/* The inner dynamic axis of such a tensor. */
static inline int inner_dyn_axis(const Tensor *t) {
    int a = 1;
    while (!((t->dyn_axes >> a) & 1u))
        a++;
    return a;
}
/* t when it follows the dims along several axes, at its largest strides
 * (not the prefix layout): a dynamic batch and sequence's attention scores
 * [b, heads, seq, keys], or [1, heads, seq, keys] with the batch fixed;
 * else NULL. Elementwise dispatches walk the run's extent of each. */
static inline const Tensor *dyn_several(const Tensor *t) {
    return !t->dynamic && (t->dyn_axes & (t->dyn_axes - 1)) ? t : NULL;
}
/* The tensor an elementwise dispatch over t follows: t along one dynamic
 * axis (dyn_one), or along several (dyn_several, which dyn_outer_inner's
 * tensors are too), else NULL (its largest shape). */
static inline const Tensor *dyn_walk(const Tensor *t) {
    return dyn_one(t) ? t : dyn_several(t);
}
/* The one dynamic axis of such a tensor. */
static inline int dyn_axis_of(const Tensor *t) {
    int a = 0;
    while (!((t->dyn_axes >> a) & 1u))
        a++;
    return a;
}

/* ---- lower_dispatch.c -------------------------------------------------- */

char *glsl_float(double v);
uint32_t groups_for(int64_t items, int64_t per_group);
char *dyn_count(const Tensor *dyn, int64_t items);
void dyn_groups(Dispatch *d, int axis, const Tensor *dyn, int64_t items,
                int64_t per_group);
void dyn_groups_along(Dispatch *d, int axis, const DimExpr *extent, int64_t scale,
                      int64_t per_group);
/* Whether each of the n values is a multiple of `of`. */
bool all_multiples(int n, const int64_t *v, int64_t of);
void contiguous_strides(int rank, const int64_t *shape, int64_t *strides);
Operand whole(Tensor *t);
/* The region of a state that piece is appended to, when piece's producer
 * may write it there itself (read once, by a concat appending it in
 * place, with the state's strides; or read once by a view of it that is):
 * the concat's piece is then marked `appended` and the concat copies
 * nothing (lower_layout.c). */
bool append_region(Program *p, Tensor *piece, Operand *o);
Operand broadcast(Tensor *t, int rank, const int64_t *shape);
/* A slice, split part or one-index gather whose elements are one
 * contiguous block of x, in out's own order (read through `in`, x's
 * strides and base, out's rank): out becomes a view of x at that block's
 * offset, no dispatch, and true. False (nothing changed) for dynamic
 * tensors (a run's elements have holes), states, a graph output (its own
 * bytes) or a block that is not contiguous (lower_layout.c). */
bool block_view(Tensor *x, Tensor *out, const Operand *in);
/* Transpose n's input as an operand of n's output shape (lower_layout.c). */
Operand transposed_input(Node *n);
int collapse(int rank, int64_t *shape, int nops, Operand *ops);
int collapse_keeping(int rank, int64_t *shape, int nops, Operand *ops, uint32_t *keep,
                     int *origin);
void operand_extent(const Graph *g, const Operand *op, int rank,
                    const int64_t *shape, int64_t *lo, int64_t *hi);
const char *buffer_type(kiln_dtype dt, bool readonly);
char *load_conversion(kiln_dtype dt, const char *ref);
const char *store_conversion(kiln_dtype dt);
const char *compute_type(kiln_dtype dt);
void need_dtype(Program *p, bool *need, kiln_dtype dt);
void define_needs(Dispatch *d, const bool *need);
/* NAME_BUF and, written, NAME_T for a binding of f32 or f16 storage t. */
void define_storage(Program *p, Dispatch *d, bool *need, const char *name, const Tensor *t,
                    bool written);
Dispatch *eltwise_dispatch(Program *p, Node *n, int rank, const int64_t *shape_in,
                           Operand out, int nin, const Operand *in,
                           const char *ct, const char *expr, const Tensor *dyn);
void copy(Program *p, Node *n, int rank, const int64_t *shape, Operand out,
          Operand in, const Tensor *dyn);
uint32_t row_workgroup(int64_t len);
void row_groups(Dispatch *d, int64_t rows, int64_t len, int64_t inner, bool kernel_inner,
                const Tensor *dyn);
Dispatch *row_dispatch(Program *p, Node *n, const char *family, int64_t rows,
                       int64_t len, int64_t inner, const Tensor *dyn);
Dispatch *axis_dispatch(Program *p, Node *n, const char *family, int axis);
Tensor *find_weight(const Graph *g, const char *name);
Tensor *table_weight(Program *p, Node *n, const char *name, int rank,
                     const int64_t *shape, const float *values);
Tensor *scratch(Program *p, Node *n, const char *suffix, int rank,
                const int64_t *shape);
/* Counters for a dispatch whose last workgroups do more (LAST_NORM,
 * SPLIT_LAST, attention's COMBINE_LAST): `count` u32s of p->counters, a
 * weight that is zero in the weights' image, bound as d's next argument at
 * the first of them; every workgroup bumps its own and the last sets it
 * back to zero. Each model has its own weights buffer, so no other model's
 * runs share them. */
void bind_counters(Program *p, Dispatch *d, int64_t count);
/* The integer value of define `name` in d (0 when it has none). */
int64_t define_value(const Dispatch *d, const char *name);
/* The one-row matvec_k variant among the dispatches of product node prod
 * whose work is nd's (a decode step's row), or NULL. */
Dispatch *one_row_of(Program *p, const Node *prod, const Dispatch *nd);
/* Whether nd is a dynamic dispatch that runs for every run (no variant,
 * no range of work): one that a product's last workgroups may stand in for
 * at one row. */
bool every_run(const Dispatch *nd);
/* KILN_SPLIT_LAST=0: attention's spans combined by a second dispatch, not
 * by each row's last span workgroup; for comparison (split products add
 * their chunks with splitk.comp unless KILN_SPLIT_LAST=1: matmul_tiled.c,
 * split_in_last). */
bool split_last_off(void);

/* ---- lower_matmul.c (the kernels themselves: matmul_*.c, matmul.h) ------ */

Dispatch *matmul_dispatch(Program *p, Node *n, MatmulShape *s);
/* The norm nd of node n (layer_norm or rms_norm of one row of o + res, y
 * out, sum = o + res too when not NULL), done for runs of one row by the
 * last workgroup of the product that writes o, when that is a decode
 * step's one-row variant: nd then runs only for more rows. Returns whether
 * it did. */
bool norm_after_product(Program *p, Node *n, Dispatch *nd, Tensor *o, Tensor *res,
                        Tensor *y, Tensor *sum, Tensor *gamma, Tensor *beta, bool rms);
MatmulShape matrix_product(Tensor *c, Tensor *a, Tensor *b, int64_t M, int64_t N,
                           int64_t K, bool ta, bool tb);
void bind_bias(Dispatch *d, Tensor *bias, Operand bo, double beta, Tensor *a);
/* (matmul_common.c) */
void bind_weight_scales(Dispatch *d, Node *n, bool later);
const char *activation_expr(const char *name);
/* e with each identifier that sub (given ctx) maps to text replaced by it
 * (sub returns NULL: the identifier stays). */
char *rewrite_identifiers(const char *e, const char *(*sub)(void *ctx, const char *ident),
                          void *ctx);
/* (lower_eltwise.c) The elementwise dispatch nd of node n, silu(gate) * up
 * where gate and up are the two parts of one product (a gated MLP's
 * projections side by side), done for runs of one row by that product
 * when it is a decode step's one-row variant on matvec_k.comp: nd then
 * runs only for more rows. Returns whether it did. */
bool glu_after_product(Program *p, Node *n, Dispatch *nd);

/* ---- lower_index.c ----------------------------------------------------- */

int attr_axis(Node *n, int rank);
Dispatch *index_dispatch(Program *p, Node *n, const char *mode, Tensor *y,
                         Tensor *x, Tensor *idx);
Dispatch *scatter_dispatch(Program *p, Node *n, Tensor *y, Tensor *idx, Tensor *upd,
                           int rank, const int64_t *shape, const int64_t *ys,
                           int axis, int64_t axis_len, int reduce);

/* ---- lower_attention.c ------------------------------------------------- */

void attention_strides(Dispatch *d, const AttentionDims *a);

/* ---- each op's lowering, in lower_<family>.c (ops.def names it) ------- */

#define OP(id, name, mn, mx, flags, attrs, shape, lower, dyn, expr) \
    void lower(Program *p, Node *n);
#include "ops.def"
#undef OP

#endif /* KILN_LOWER_H */
