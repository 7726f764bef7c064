/*
 * matmul_common.c: what the matrix-product kernels' bindings share: the
 * product's and a convolution's defines, the operand types, rows and
 * columns that follow the dims, and a quantized B's scale slots.
 */
#include "matmul.h"

#include <string.h>

/* A product's rows at the run's extent, in GLSL (the constant M when they
 * are fixed), and groups[1] of d following them, per_group rows a group. */
char *rows_glsl(const MatmulShape *s) {
    return s->dyn ? dim_expr_glsl(s->dyn, s->M / s->dyn_most) : format("%lld", (long long)s->M);
}

void rows_groups(Dispatch *d, const MatmulShape *s, int64_t per_group) {
    if (s->dyn)
        dyn_groups_along(d, 1, s->dyn, s->M / s->dyn_most, per_group);
}

/* Whether s's extent follows the dims: its rows, or a convolution's images
 * (its columns). Its tiles are looped over, not one a workgroup; it is not
 * split along K but for a convolution's images and a product's few-rows
 * variant (split_over_range). */
bool follows_dims(const MatmulShape *s) { return s->dyn || s->conv.dyn_images; }

/* A convolution over a dynamic batch of images (its columns, the images'
 * positions side by side): the run's columns N_RUN, in GLSL, and groups[0]
 * of d following them, per_group columns a group. */
void cols_groups(Dispatch *d, const MatmulShape *s, int64_t per_group) {
    const DimExpr *e = s->conv.dyn_images;
    if (!e)
        return;
    int64_t per = s->conv.images ? s->conv.positions : s->N;
    define_str(d, "N_RUN", dim_expr_glsl(e, per));
    dyn_groups_along(d, 0, e, per, per_group);
}

/* The defines of a product that every matmul kernel shares but M: N, K,
 * the operands' strides and the batches. */
void define_product(Dispatch *d, const MatmulShape *s) {
    define_int(d, "N", s->N);
    if (s->dyn_k)
        define_str(d, "K", format("uint%s", dim_expr_glsl(s->dyn_k, 1)));
    else
        define_int(d, "K", s->K);
    define_int(d, "A_SM", s->a_sm);
    define_int(d, "A_SK", s->a_sk);
    define_int(d, "B_SK", s->b_sk);
    define_int(d, "B_SN", s->b_sn);
    define_int(d, "BATCH", s->batch);
    if (s->dyn_batch)
        define_str(d, "BATCH_RUN", dim_expr_glsl(s->dyn_batch, s->batch_per));
    define_int(d, "BRANK", s->brank);
    define_list(d, "BSHAPE", s->brank, s->bshape);
    define_list(d, "C_BSTRIDES", s->brank, s->ops[0].strides);
    define_list(d, "A_BSTRIDES", s->brank, s->ops[1].strides);
    define_list(d, "B_BSTRIDES", s->brank, s->ops[2].strides);
}

/* A convolution's defines (product.glsl): its im2col matrix (CONV) and
 * images (CIMG; C_IMG where the kernel writes C, not a split's partial
 * products). */
void define_conv(Dispatch *d, const MatmulShape *s, bool partial) {
    if (s->conv.in[0]) {
        define_int(d, "CONV", 1);
        define_int(d, "CIH", s->conv.in[0]);
        define_int(d, "CIW", s->conv.in[1]);
        define_int(d, "CKH", s->conv.k[0]);
        define_int(d, "CKW", s->conv.k[1]);
        define_int(d, "CSH", s->conv.stride[0]);
        define_int(d, "CSW", s->conv.stride[1]);
        define_int(d, "CPH", s->conv.pad[0]);
        define_int(d, "CPW", s->conv.pad[1]);
        define_int(d, "CDH", s->conv.dil[0]);
        define_int(d, "CDW", s->conv.dil[1]);
        define_int(d, "COW", s->conv.out_w);
        if (s->conv.klast) {
            define_int(d, "CONV_KLAST", 1);
            define_int(d, "CIC", s->conv.channels);
        }
    }
    if (s->conv.images) {
        define_int(d, "CIMG", s->conv.positions);
        define_int(d, "CIN_IMG", s->conv.in_img);
        if (!partial) /* else splitk.comp writes C */
            define_int(d, "C_IMG", s->conv.positions);
    }
}

/* The residual's type (RES_F16) and the storage features it needs. */
void define_res_type(Program *p, Dispatch *d, bool *need, const MatmulShape *s) {
    if (!s->res)
        return;
    need_dtype(p, need, s->res->dtype);
    define_int(d, "RES_F16", s->res->dtype == KILN_DTYPE_F16);
}

int b_weight_format(const Node *n, const MatmulShape *s) {
    if (n->wq) /* encoded by quantize.c, from f32 or f16 */
        return n->wformat;
    return s->ops[2].t->dtype == KILN_DTYPE_F16 ? WF_F16 : n->wformat;
}

/* The defines of a matmul kernel's operand types: f16 A and C through
 * 16-bit storage (B's f16 is weights.glsl's format, packed halves). */
void define_operand_types(Program *p, Dispatch *d, const MatmulShape *s) {
    bool need[3] = {false, false, false};
    need_dtype(p, need, s->ops[0].t->dtype);
    need_dtype(p, need, s->ops[1].t->dtype);
    define_res_type(p, d, need, s);
    define_needs(d, need);
    define_int(d, "A_F16", s->ops[1].t->dtype == KILN_DTYPE_F16);
    define_int(d, "C_F16", s->ops[0].t->dtype == KILN_DTYPE_F16);
}

/* s at `units` of what follows the dims: a convolution's images (N their
 * positions side by side), else its rows. */
MatmulShape shape_at(const MatmulShape *s, int64_t units) {
    MatmulShape at = *s;
    if (s->conv.dyn_images)
        at.N = s->conv.positions * units;
    else
        at.M = units;
    return at;
}

/* d, whose groups follow s's rows (their scale a multiple of the rows a
 * unit adds), runs only for lo to hi rows. */
void for_rows(Dispatch *d, const MatmulShape *s, int64_t lo, int64_t hi) {
    int64_t per = s->M / s->dyn_most;
    d->work_min = (uint64_t)((lo + per - 1) / per * d->scale);
    d->work_max = (uint64_t)(hi / per * d->scale);
}

/* After the bias slot: the scales and zero points of a quantized B, where
 * d reads B (splitk.comp does not), and unused slots in their place where
 * a later slot follows (later: the QKV split's outputs, a convolution's
 * residual). */
void bind_weight_scales(Dispatch *d, Node *n, bool later) {
    Tensor *a = n->inputs[0];
    bool scales = n->wscale && strcmp(d->family, "splitk") != 0;
    if (scales)
        dispatch_arg(d, n->wscale, false);
    else if (later)
        dispatch_unused(d, a);
    if (scales && n->wzero)
        dispatch_arg(d, n->wzero, false);
    else if (later)
        dispatch_unused(d, a);
}
