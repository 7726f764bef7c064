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

/* Whether t is stored as f32 or f16 (--precision f16), the two that the
 * convolution kernels read and write. */
static bool float_storage(const Tensor *t) {
    return t->dtype == KILN_DTYPE_F32 || t->dtype == KILN_DTYPE_F16;
}

/* A dynamic batch (dynamic.c's dynamic_images: axis 0 of x and y): the
 * run's images of x in GLSL times scale, and groups[0] of d following them,
 * per_image items an image, per_group a group. The kernels' loops end at
 * the run's images (NRUN, NC_RUN, COUNT), not at the largest batch. */
static bool dyn_images(const Tensor *x) { return x->dyn_axes & 1u; }

static char *images_glsl(const Tensor *x, int64_t scale) {
    return dyn_images(x) ? dim_expr_glsl(&x->ext[0], scale)
                         : format("%lld", (long long)(x->shape[0] * scale));
}

static void images_groups(Dispatch *d, const Tensor *x, int64_t per_image,
                          int64_t per_group) {
    if (dyn_images(x))
        dyn_groups_along(d, 0, &x->ext[0], per_image, per_group);
}

/* An f16 convolution's weights [OC, C, KH, KW] as [OC, KH, KW, C] (the
 * product's CONV_KLAST): K in the order (kh, kw, ci), so that eight
 * consecutive k of the input's im2col matrix are eight channels at one
 * kernel offset, gathered with one bounds check (coopmat.comp's b_vec).
 * Made once a weight; the original, bound by no dispatch then, is not
 * placed. */
static Tensor *klast_weight(Program *p, Node *n, Tensor *w, int64_t kh, int64_t kw) {
    Graph *g = p->graph;
    const char *name = format("%s.khwc", w->name);
    Tensor *t = find_weight(g, name);
    if (t)
        return t;
    int64_t oc = w->shape[0], c = w->shape[1], khw = kh * kw;
    t = graph_tensor(g, name, T_WEIGHT, n->loc);
    t->dtype = KILN_DTYPE_F16;
    t->rank = 2;
    t->shape[0] = oc;
    t->shape[1] = c * khw;
    uint8_t *to = xcalloc((size_t)(oc * c * khw) + 1, 2);
    for (int64_t o = 0; o < oc; o++) /* by bytes: a mapped model's data may be unaligned */
        for (int64_t ci = 0; ci < c; ci++)
            for (int64_t k = 0; k < khw; k++)
                memcpy(to + 2 * ((o * khw + k) * c + ci), w->data + 2 * ((o * c + ci) * khw + k),
                       2);
    t->data = to;
    return t;
}

/* Invocations a convolution's channel split aims at (lower_conv). */
#define CONV_SPLIT_TARGET 65536

/* The other operand of a convolution's fused residual add (n->epi_res). */
static Tensor *conv_residual(Node *n) {
    return other_input(n->epi_res, n->epi_bias ? n->epi_bias->outputs[0] : n->outputs[0]);
}

/* conv.comp's tiled depthwise path (DW_TILE) for n: a depthwise
 * convolution (groups = input = output channels), not transposed, of 1 or
 * 2 spatial axes, with unit strides and a window of 49 taps or more or
 * 1024 output positions or more. On an H200 (bench/experiments/
 * dwconv-h200.txt) the tiles took ConvNeXt-tiny's 7 x 7 convolutions
 * from 13.7 to 9.7 us at 56 x 56 and 7.7 to 6.3 at 7 x 7, MobileNetV3's
 * 3 x 3 at 56 x 56 from 6.4 to 5.8; they were slower where a window loads
 * much more than its outputs use: strides of 2 (4x the outputs) and 3 x 3
 * or 5 x 5 windows at 14 x 14 and 7 x 7 (4.3 -> 4.8 us). Tiles of 8 x 8
 * positions (1 x 64 for 1 axis) of 8 channels, each invocation DW_PX = 2
 * adjacent outputs of a row (1 and 4 were slower in total); the channels
 * halved while the window and weights pass 16 KiB of shared memory; none
 * (false) where one channel's do. KILN_DWCONV=0 keeps every depthwise
 * convolution direct, =TH,TW,CB[,PX] forces these tiles on every one (any
 * strides and sizes; PX must divide TW), for tuning. tile: TH, TW, CB, the
 * floats of one channel's window in shared memory (odd), the tiles, PX. */
static bool depthwise_tiles(Node *n, const Tensor *x, const Tensor *y, int nsp,
                            const Window *win, int64_t tile[6]) {
    const char *env = getenv("KILN_DWCONV");
    int64_t c = x->shape[1], g = attr_int(n, "group");
    if ((env && strcmp(env, "0") == 0) || n->op != OP_CONV || nsp < 1 || nsp > 2 || g != c ||
        y->shape[1] != c)
        return false;
    const Tensor *w = n->inputs[1];
    int64_t kh = nsp == 2 ? w->shape[2] : 1, kw = w->shape[1 + nsp];
    int64_t sh = nsp == 2 ? win->stride[0] : 1, sw = win->stride[nsp - 1];
    int64_t dh = nsp == 2 ? win->dil[0] : 1, dwl = win->dil[nsp - 1];
    int64_t oh = nsp == 2 ? y->shape[2] : 1, ow = y->shape[1 + nsp];
    int64_t th = nsp == 2 ? 8 : 1, tw = nsp == 2 ? 8 : 64, cb = 8, px = 2;
    long t[4] = {0, 0, 0, 1};
    int got = env ? sscanf(env, "%ld,%ld,%ld,%ld", &t[0], &t[1], &t[2], &t[3]) : 0;
    if (got >= 3 && t[0] >= 1 && t[1] >= 1 && t[2] >= 1 && t[3] >= 1 && t[3] <= 8 &&
        t[1] % t[3] == 0 && t[0] * t[1] * t[2] <= 4096) {
        th = nsp == 2 ? t[0] : 1;
        tw = t[1];
        cb = t[2];
        px = t[3];
    } else if (sh != 1 || sw != 1 || (kh * kw < 49 && oh * ow < 1024)) {
        return false;
    }
    int64_t xs = ((th - 1) * sh + (kh - 1) * dh + 1) * ((tw - 1) * sw + (kw - 1) * dwl + 1);
    xs |= 1;
    while (cb > 1 && 4 * cb * (xs + kh * kw) > 16384)
        cb /= 2;
    if (4 * cb * (xs + kh * kw) > 16384)
        return false;
    tile[0] = th, tile[1] = tw, tile[2] = cb, tile[3] = xs;
    tile[4] = x->shape[0] * groups_for(c, cb) * groups_for(oh, th) * groups_for(ow, tw);
    tile[5] = px;
    return true;
}

/* A convolution as a matrix product on matmul.comp's tiles (implicit
 * GEMM): per image, C [OC, OH * OW] = W [OC, C * KH * KW] x the input's
 * im2col matrix [C * KH * KW, OH * OW], which the kernel reads from the
 * input as it loads each tile (none is stored); a 1 x 1 kernel with unit
 * strides and no padding reads each image's input as a plain [C, H * W]
 * matrix. Several images are one product, [OC, images * OH * OW]
 * (MatmulShape's conv.images); bias, residual and activation its
 * epilogue. f16 weights (--precision f16) take the matrix units where the
 * device has them (coopmat.comp, the input gathered as halves). For
 * convolutions of one group, 1 or 2 spatial axes (a dynamic batch too:
 * the tiles end at the run's images' columns, N_RUN), with
 * more output channels than matvec.comp would take
 * (matmul_dispatch) and more than 16 output positions; others stay on
 * conv.comp, whose split channels serve the products of few positions
 * better (on an H200, MobileNetV3's squeeze-and-excitation convolutions,
 * [C, 1, 1], took 17-28 us each as products, a few as conv.comp). */
static bool conv_product(Program *p, Node *n, Tensor *x, Tensor *w, Tensor *y,
                         const Window *win, const char *act) {
    int nsp = x->rank - 2;
    if (n->op != OP_CONV || attr_int(n, "group") != 1 || nsp < 1 || nsp > 2 ||
        !float_storage(x) || !float_storage(w) || !float_storage(y) ||
        w->shape[0] <= 16 || tensor_count(y) / (y->shape[0] * y->shape[1]) <= 16 ||
        getenv("KILN_DIRECT_CONV"))
        return false;
    /* a 1-D convolution as a 2-D one of height 1 */
    int64_t in[2] = {1, x->shape[nsp + 1]}, k[2] = {1, w->shape[nsp + 1]};
    int64_t out[2] = {1, y->shape[nsp + 1]}, str[2] = {1, win->stride[nsp - 1]};
    int64_t pad[2] = {0, win->pad_begin[nsp - 1]}, dil[2] = {1, win->dil[nsp - 1]};
    if (nsp == 2) {
        in[0] = x->shape[2], k[0] = w->shape[2], out[0] = y->shape[2];
        str[0] = win->stride[0], pad[0] = win->pad_begin[0], dil[0] = win->dil[0];
    }
    MatmulShape s = {0};
    s.M = w->shape[0];
    s.N = out[0] * out[1];
    s.K = x->shape[1] * k[0] * k[1];
    s.a_sm = s.K;
    s.a_sk = 1;
    /* Several images fold into N: one product of their positions side by
     * side, whose tiles fill a large GPU where one image's few positions
     * would not (ResNet-50's last stage, 49 a image). */
    int64_t images = x->shape[0];
    bool plain = k[0] * k[1] == 1 && str[0] * str[1] == 1 && pad[0] + pad[1] == 0;
    if (plain) { /* B [C, H * W] as it is, an image's */
        s.b_sk = in[0] * in[1];
        s.b_sn = 1;
    } else {
        memcpy(s.conv.in, in, sizeof in);
        memcpy(s.conv.k, k, sizeof k);
        memcpy(s.conv.stride, str, sizeof str);
        memcpy(s.conv.pad, pad, sizeof pad);
        memcpy(s.conv.dil, dil, sizeof dil);
        s.conv.out_w = out[1];
    }
    if (images > 1) {
        s.conv.images = images;
        s.conv.positions = s.N;
        s.conv.in_img = x->shape[1] * in[0] * in[1];
        s.N *= images;
    }
    if (dyn_images(x)) { /* the tiles end at the run's images' columns */
        s.conv.dyn_images = &x->ext[0];
        /* a split is chosen for one image at least (a batch range may
         * start at 0) */
        int64_t least = dim_expr_min(p->graph, &x->ext[0]);
        s.conv.images_min = least < 1 ? 1 : least;
    }
    s.brank = 1;
    s.bshape[0] = s.batch = 1;
    s.ops[0] = (Operand){y, {0}, 0, false, {0, {0}}};
    /* f16 weights of a kernel larger than 1 x 1 over channels in eights:
     * K over channels last */
    if (w->dtype == KILN_DTYPE_F16 && w->kind == T_WEIGHT && w->data && !plain &&
        k[0] * k[1] > 1 && x->shape[1] % 8 == 0) {
        w = klast_weight(p, n, w, k[0], k[1]);
        s.conv.klast = true;
        s.conv.channels = x->shape[1];
    }
    s.ops[1] = (Operand){w, {0}, 0, false, {0, {0}}};
    s.ops[2] = (Operand){x, {0}, 0, false, {0, {0}}};
    if (n->epi_res)
        s.res = conv_residual(n);
    for (Dispatch *d = matmul_dispatch(p, n, &s); d; d = d->variant) {
        define_str(d, "ACT(x)", act);
        Tensor *bias = n->ninputs > 2 ? n->inputs[2] : NULL;
        Operand bo = whole(x);
        bo.strides[0] = 1; /* one per output channel, the product's row */
        bo.strides[1] = 0;
        bind_bias(d, bias, bo, 1.0, x);
        if (n->epi_res) {
            define_int(d, "HAS_RES", 1);
            bind_weight_scales(d, n, true); /* unused: a convolution's are not quantized */
            dispatch_arg(d, conv_residual(n), false);
        }
    }
    return true;
}

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
    Attr *act = node_attr(n, "activation");
    const char *act_expr = activation_expr(n->epi_act ? op_info[n->epi_act->op].name
                                           : act ? act->scalar : "none");
    if (conv_product(p, n, x, w, y, &win, act_expr))
        return;
    Dispatch *d = new_dispatch(p, n, "conv");
    int64_t dw[6];
    bool tiled = depthwise_tiles(n, x, y, nsp, &win, dw);
    /* tiled: an invocation for each DW_PX outputs of a tile, up to 256 */
    int64_t items = tiled ? dw[0] * dw[1] * dw[2] / dw[5] : 0;
    d->local_size = !tiled ? 64 : items >= 256 ? 256 : items >= 128 ? 128 : 64;
    define_int(d, "WG", d->local_size);
    /* a transpose to channels last fused (epi_perm): written in its
     * layout, y's shape the convolution's own */
    Tensor *yw = n->epi_perm ? n->epi_perm->outputs[0] : y;
    if (n->epi_perm)
        define_int(d, "Y_CLAST", 1);
    bool need[3] = {false, false, false};
    define_storage(p, d, need, "Y", yw, true);
    define_storage(p, d, need, "X", x, false);
    define_storage(p, d, need, "W", w, false);
    if (n->epi_res)
        define_storage(p, d, need, "RES", conv_residual(n), false);
    define_needs(d, need);
    define_int(d, "N", x->shape[0]);
    if (dyn_images(x))
        define_str(d, "NRUN", images_glsl(x, 1));
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
    if (n->op == OP_CONV_TRANSPOSE) { /* the taps that reach an output: every KSTEP */
        int64_t kstep[MAX_RANK];
        for (int i = 0; i < nsp; i++) {
            int64_t a = win.stride[i], b = win.dil[i];
            while (b) {
                int64_t t = a % b;
                a = b;
                b = t;
            }
            kstep[i] = win.stride[i] / a;
        }
        define_spatial(d, "KSTEP", nsp, kstep, 1);
    }
    define_int(d, "HAS_BIAS", n->ninputs > 2);
    define_str(d, "ACT(x)", act_expr);
    dispatch_arg(d, yw, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, w, false);
    if (n->ninputs > 2)
        dispatch_arg(d, n->inputs[2], false);
    else
        dispatch_unused(d, x);
    if (n->epi_res) {
        define_int(d, "HAS_RES", 1);
        dispatch_arg(d, conv_residual(n), false);
    }
    /* products per output: the input channels of its group by the kernel */
    int64_t cg = x->shape[1] / attr_int(n, "group");
    int64_t per_out = cg * shape_count(nsp, w->shape + 2);
    /* Split the channels of an output over up to 32 invocations while the
     * whole takes fewer than CONV_SPLIT_TARGET (small convolutions: one
     * invocation per output would be a long chain on a mostly idle GPU). */
    int64_t split = 1;
    while (!tiled && split < 32 && split < cg && count * split < CONV_SPLIT_TARGET)
        split *= 2;
    define_int(d, "SPLIT", split);
    d->groups[0] = groups_for(count * split, d->local_size);
    images_groups(d, x, count / x->shape[0] * split, d->local_size);
    if (tiled) {
        define_int(d, "DW_TILE", 1);
        define_int(d, "DW_TH", dw[0]);
        define_int(d, "DW_TW", dw[1]);
        define_int(d, "DW_CB", dw[2]);
        define_int(d, "DW_XS", dw[3]);
        define_int(d, "DW_PX", dw[5]);
        d->groups[0] = groups_for(dw[4], 1);
        images_groups(d, x, dw[4] / x->shape[0], 1); /* the image outermost */
    }
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
    bool need[3] = {false, false, false};
    define_storage(p, d, need, "Y", y, true);
    define_storage(p, d, need, "X", x, false);
    define_int(d, "NC", x->shape[0] * x->shape[1]);
    if (dyn_images(x))
        define_str(d, "NC_RUN", images_glsl(x, x->shape[1]));
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
        need_dtype(p, need, KILN_DTYPE_I64);
        define_int(d, "COLUMN_MAJOR", attr_int(n, "storage_order") != 0);
    }
    define_needs(d, need);
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    if (indices)
        dispatch_arg(d, n->outputs[1], true);
    d->groups[0] = groups_for(count, d->local_size);
    images_groups(d, x, count / x->shape[0], d->local_size);
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
    define_str(d, "COUNT", images_glsl(y, count / y->shape[0]));
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
    bool need[3] = {false, false, false};
    define_storage(p, d, need, "Y", y, true);
    define_storage(p, d, need, "X", x, false);
    define_needs(d, need);
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    d->groups[0] = groups_for(count, d->local_size);
    images_groups(d, y, count / y->shape[0], d->local_size);
    d->flops = (uint64_t)count * (2ull << (x->rank * mode)); /* taps of each element */
}
