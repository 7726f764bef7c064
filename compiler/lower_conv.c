/*
 * lower_conv.c: convolution, pooling and resize (conv.comp, pool.comp,
 * resize.comp).
 */
#include "lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* Spatial lists padded to 3 axes (1 for sizes, 0 for pads, ...). */
static void define_spatial(Dispatch *d, const char *name, int nsp, const int64_t *v,
                           int64_t fill) {
    int64_t pad3[3] = {fill, fill, fill};
    for (int i = 0; i < nsp; i++)
        pad3[3 - nsp + i] = v[i];
    Str s = {0};
    for (int i = 0; i < 3; i++)
        str_addf(&s, "%s%lld", i ? ", " : "", (long long)pad3[i]);
    define_str(d, name, s.buf);
}

/* Invocations a convolution's channel split aims at (lower_conv). */
#define CONV_SPLIT_TARGET 65536

void lower_conv(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *w = n->inputs[1], *y = n->outputs[0];
    /* A fused batch norm (already in w and the bias), residual add and
     * activation: the dispatch writes the last tensor of the group. */
    Node *last = n->epi_act ? n->epi_act : n->epi_res ? n->epi_res : n->epi_bias;
    if (last)
        y = last->outputs[0];
    int64_t count = tensor_count(y);
    if (count == 0)
        return;
    int nsp = x->rank - 2;
    Window win;
    window_geometry(n, x->shape + 2, w->shape + 2, nsp, &win);
    Dispatch *d = new_dispatch(p, n, "conv");
    d->local_size = 64;
    define_int(d, "WG", d->local_size);
    define_int(d, "N", x->shape[0]);
    define_int(d, "C", x->shape[1]);
    define_int(d, "OC", y->shape[1]);
    define_int(d, "G", attr_int(n, "group"));
    define_int(d, "TRANSPOSED", n->op == OP_CONV_TRANSPOSE);
    define_spatial(d, "IN_SP", nsp, x->shape + 2, 1);
    define_spatial(d, "OUT_SP", nsp, y->shape + 2, 1);
    define_spatial(d, "K_SP", nsp, w->shape + 2, 1);
    define_spatial(d, "STRIDE", nsp, win.stride, 1);
    define_spatial(d, "PAD", nsp, win.pad_begin, 0);
    define_spatial(d, "DIL", nsp, win.dil, 1);
    define_int(d, "HAS_BIAS", n->ninputs > 2);
    Attr *act = node_attr(n, "activation");
    define_str(d, "ACT(x)", activation_expr(n->epi_act ? op_info[n->epi_act->op].name
                                            : act ? act->scalar : "none"));
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, w, false);
    if (n->ninputs > 2)
        dispatch_arg(d, n->inputs[2], false);
    else
        dispatch_unused(d, x);
    if (n->epi_res) {
        define_int(d, "HAS_RES", 1);
        dispatch_arg(d, other_input(n->epi_res, n->epi_bias ? n->epi_bias->outputs[0]
                                                             : n->outputs[0]), false);
    }
    /* products per output: the input channels of its group by the kernel */
    int64_t cg = x->shape[1] / attr_int(n, "group");
    int64_t per_out = cg * shape_count(nsp, w->shape + 2);
    /* Split the channels of an output over up to 32 invocations while the
     * whole takes fewer than CONV_SPLIT_TARGET (small convolutions: one
     * invocation per output would be a long chain on a mostly idle GPU). */
    int64_t split = 1;
    while (split < 32 && split < cg && count * split < CONV_SPLIT_TARGET)
        split *= 2;
    define_int(d, "SPLIT", split);
    d->groups[0] = groups_for(count * split, d->local_size);
    d->flops = 2ull * (uint64_t)count * (uint64_t)per_out;
}

void lower_pool(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *y = n->outputs[0];
    int64_t count = tensor_count(y);
    if (count == 0)
        return;
    int nsp = x->rank - 2;
    int64_t k[MAX_RANK];
    attr_ints(n, "kernel", k, MAX_RANK);
    Window win;
    window_geometry(n, x->shape + 2, k, nsp, &win);
    Dispatch *d = new_dispatch(p, n, "pool");
    d->local_size = 64;
    define_int(d, "WG", d->local_size);
    define_int(d, "NC", x->shape[0] * x->shape[1]);
    define_spatial(d, "IN_SP", nsp, x->shape + 2, 1);
    define_spatial(d, "OUT_SP", nsp, y->shape + 2, 1);
    define_spatial(d, "K_SP", nsp, k, 1);
    define_spatial(d, "STRIDE", nsp, win.stride, 1);
    define_spatial(d, "PAD", nsp, win.pad_begin, 0);
    define_spatial(d, "PAD_END", nsp, win.pad_end, 0);
    define_spatial(d, "DIL", nsp, win.dil, 1);
    define_int(d, "MAX", n->op == OP_MAX_POOL);
    define_int(d, "INCLUDE_PAD", n->op == OP_AVG_POOL && attr_int(n, "count_include_pad"));
    bool indices = n->noutputs == 2;
    define_int(d, "INDICES", indices);
    if (indices) {
        define_int(d, "NEED_I64", 1);
        p->features |= KILN_FEATURE_INT64;
        define_int(d, "COLUMN_MAJOR", attr_int(n, "storage_order") != 0);
    }
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    if (indices)
        dispatch_arg(d, n->outputs[1], true);
    d->groups[0] = groups_for(count, d->local_size);
    d->flops = (uint64_t)count * (uint64_t)shape_count(nsp, k);
}

void lower_grid_sample(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *g = n->inputs[1], *y = n->outputs[0];
    int64_t count = tensor_count(y);
    if (count == 0)
        return;
    int r = x->rank - 2, mode = attr_choice(n, "mode", resize_modes, 3);
    Dispatch *d = new_dispatch(p, n, "grid_sample");
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    define_int(d, "COUNT", count);
    define_int(d, "R", r);
    define_int(d, "C", x->shape[1]);
    define_list(d, "XSPATIAL", r, x->shape + 2);
    define_list(d, "OSPATIAL", r, y->shape + 2);
    define_int(d, "MODE", mode);
    define_int(d, "PAD", attr_choice(n, "padding_mode", grid_sample_pads, 3));
    define_int(d, "ALIGN", attr_int(n, "align_corners") != 0);
    define_int(d, "EMPTY", tensor_count(x) == 0);
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, g, false);
    d->groups[0] = groups_for(count, d->local_size);
    d->flops = (uint64_t)count * (2ull << (r * mode)); /* taps of each element */
}

void lower_roi_align(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *bi = n->inputs[2], *y = n->outputs[0];
    int64_t count = tensor_count(y);
    if (count == 0)
        return;
    Dispatch *d = new_dispatch(p, n, "roi_align");
    d->local_size = 64;
    define_int(d, "WG", d->local_size);
    define_int(d, "COUNT", count);
    define_int(d, "C", x->shape[1]);
    define_int(d, "H", x->shape[2]);
    define_int(d, "W", x->shape[3]);
    define_int(d, "N", x->shape[0]);
    define_int(d, "OH", y->shape[2]);
    define_int(d, "OW", y->shape[3]);
    define_int(d, "MAX", attr_choice(n, "mode", roi_align_modes, 2) == 1);
    define_int(d, "HALF_PIXEL",
               attr_choice(n, "coordinate_transformation_mode", roi_align_coords, 2) == 0);
    define_int(d, "SAMPLING", attr_int(n, "sampling_ratio"));
    define_float(d, "SPATIAL_SCALE", attr_float(n, "spatial_scale"));
    define_str(d, "TIDX", buffer_type(bi->dtype, true));
    if (bi->dtype == KILN_DTYPE_I64) {
        define_int(d, "NEED_I64", 1);
        p->features |= KILN_FEATURE_INT64;
    }
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, n->inputs[1], false);
    dispatch_arg(d, bi, false);
    d->groups[0] = groups_for(count, d->local_size);
    d->flops = (uint64_t)count * 16;
}

void lower_resize(Program *p, Node *n) {
    Tensor *x = n->inputs[0], *y = n->outputs[0];
    int64_t count = tensor_count(y);
    if (count == 0 || tensor_count(x) == 0)
        return;
    double scales[MAX_RANK];
    int64_t out[MAX_RANK];
    resize_geometry(n, scales, out);
    Dispatch *d = new_dispatch(p, n, "resize");
    d->local_size = 256;
    define_int(d, "WG", d->local_size);
    define_int(d, "COUNT", count);
    define_int(d, "RANK", x->rank);
    define_list(d, "XSHAPE", x->rank, x->shape);
    define_list(d, "YSHAPE", y->rank, y->shape);
    Str sc = {0};
    for (int i = 0; i < x->rank; i++) {
        char *f = format("%.9g", (double)(float)scales[i]);
        str_addf(&sc, "%s%s%s", i ? ", " : "", f, strpbrk(f, ".eE") ? "" : ".0");
    }
    define_str(d, "SCALE", sc.buf);
    Str ol = {0};
    bool by_scales = node_attr(n, "scales") != NULL;
    for (int i = 0; i < x->rank; i++) {
        double len = by_scales ? (double)(float)((double)x->shape[i] * (float)scales[i])
                               : (double)out[i];
        char *f = format("%.9g", len);
        str_addf(&ol, "%s%s%s", i ? ", " : "", f, strpbrk(f, ".eE") ? "" : ".0");
    }
    define_str(d, "OUT_LEN", ol.buf);
    int mode = attr_choice(n, "mode", resize_modes, 3);
    define_int(d, "MODE", mode);
    char *a = format("%.9g", (double)(float)attr_float(n, "cubic_coeff_a"));
    define_str(d, "CUBIC_A", format("%s%s", a, strpbrk(a, ".eE") ? "" : ".0"));
    define_int(d, "EXCLUDE", attr_int(n, "exclude_outside") != 0);
    int coord = attr_choice(n, "coordinate_transformation_mode", resize_coords, 7);
    define_int(d, "COORD", coord);
    if (coord == 5) { /* tf_crop_and_resize: the region, and the value outside it */
        Attr *roi = node_attr(n, "roi");
        Str lo = {0}, hi = {0};
        for (int i = 0; i < x->rank; i++) {
            str_addf(&lo, "%s%s", i ? ", " : "", glsl_float(strtod(roi->items[i], NULL)));
            str_addf(&hi, "%s%s", i ? ", " : "",
                     glsl_float(strtod(roi->items[x->rank + i], NULL)));
        }
        define_str(d, "ROI_START", lo.buf);
        define_str(d, "ROI_END", hi.buf);
        define_float(d, "EXTRAPOLATION", attr_float(n, "extrapolation_value"));
    }
    define_int(d, "NEAREST", attr_choice(n, "nearest_mode", resize_nearest, 4));
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    d->groups[0] = groups_for(count, d->local_size);
    d->flops = (uint64_t)count * (2ull << (x->rank * mode)); /* taps of each element */
}
