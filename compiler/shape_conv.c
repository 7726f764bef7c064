/*
 * shape_conv.c: shape rules of convolution, pooling and resize.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* [N, channels, *window outputs] for a window op over input 0. */
/* max_pool may list a second output: each maximum's flat index into x
 * (i64; storage_order 1 counts the spatial axes column-major). */
static void set_window_output(Node *n, int64_t channels, const Window *win) {
    Tensor *x = n->inputs[0];
    int64_t shape[MAX_RANK] = {x->shape[0], channels};
    for (int i = 0; i < win->nsp; i++)
        shape[2 + i] = win->out[i];
    bool indices = n->op == OP_MAX_POOL && n->noutputs == 2;
    if (indices)
        n->noutputs = 1; /* set_output checks the first */
    set_output(n, x->dtype, x->rank, shape);
    if (indices) {
        n->noutputs = 2;
        set_output_i(n, 1, x, x->rank, shape);
        n->outputs[1]->dtype = KILN_DTYPE_I64;
    }
    if (n->op == OP_MAX_POOL && attr_int(n, "storage_order") != 0 &&
        attr_int(n, "storage_order") != 1)
        node_error_at(n, attr_loc(n, "storage_order"), "storage_order must be 0 or 1");
}

/* conv(x, w, [bias]): x [N, C, *spatial] (1 to 3 spatial axes), w [OC, C/group,
 * *kernel]; conv_transpose: w [C, OC/group, *kernel]. */
void shape_conv(Node *n) {
    Tensor *x = n->inputs[0], *w = n->inputs[1];
    bool tr = n->op == OP_CONV_TRANSPOSE;
    require_float(n);
    int nsp = x->rank - 2;
    if (nsp < 1 || nsp > 3)
        node_error(n, "%s needs [N, C, D1 (, D2 (, D3))], got %s",
                   op_info[n->op].name, shape_str(x->rank, x->shape));
    if (w->rank != x->rank)
        node_error_at(n, n->input_locs[1], "weights %s must have the input's rank %d",
                      shape_str(w->rank, w->shape), x->rank);
    int64_t g = attr_int(n, "group");
    if (g < 1 || x->shape[1] % g || (!tr && w->shape[0] % g))
        node_error_at(n, node_attr(n, "group") ? attr_loc(n, "group") : n->loc,
                      "group %lld must divide the channels", (long long)g);
    int64_t oc = tr ? w->shape[1] * g : w->shape[0];
    if ((tr ? w->shape[0] : w->shape[1] * g) != x->shape[1])
        node_error_at(n, n->input_locs[1], "weights %s do not match %lld input channels "
                      "in %lld groups", shape_str(w->rank, w->shape),
                      (long long)x->shape[1], (long long)g);
    if (n->ninputs > 2) {
        Tensor *b = n->inputs[2];
        if (b->rank != 1 || b->shape[0] != oc)
            node_error_at(n, n->input_locs[2], "bias %s must be [%lld]",
                          shape_str(b->rank, b->shape), (long long)oc);
    }
    if (n->op == OP_CONV)
        check_activation(n);
    Window win;
    window_geometry(n, x->shape + 2, w->shape + 2, nsp, &win);
    set_window_output(n, oc, &win);
}

void shape_pool(Node *n) {
    Tensor *x = n->inputs[0];
    require_float(n);
    int nsp = x->rank - 2;
    if (nsp < 1 || nsp > 3)
        node_error(n, "%s needs [N, C, D1 (, D2 (, D3))], got %s",
                   op_info[n->op].name, shape_str(x->rank, x->shape));
    int64_t k[MAX_RANK];
    if (attr_ints(n, "kernel", k, MAX_RANK) != nsp)
        node_error_at(n, node_attr(n, "kernel") ? attr_loc(n, "kernel") : n->loc,
                      "kernel needs %d sizes", nsp);
    for (int i = 0; i < nsp; i++)
        if (k[i] < 1)
            node_error_at(n, attr_loc(n, "kernel"), "kernel sizes must be positive");
    Window win;
    window_geometry(n, x->shape + 2, k, nsp, &win);
    for (int i = 0; i < nsp; i++)
        if (win.pad_begin[i] >= k[i] || win.pad_end[i] >= k[i])
            node_error(n, "padding must be smaller than the kernel");
    set_window_output(n, x->shape[1], &win);
}

void shape_global_pool(Node *n) {
    Tensor *x = n->inputs[0];
    require_float(n);
    if (x->rank < 3)
        node_error(n, "%s needs [N, C, D1, ...], got %s",
                   op_info[n->op].name, shape_str(x->rank, x->shape));
    int64_t shape[MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        shape[i] = i < 2 ? x->shape[i] : 1;
    set_output(n, x->dtype, x->rank, shape);
}

/* x [N, C, D1..Dr] sampled at grid [N, O1..Or, r] (r from 1 to 3): y [N, C,
 * O1..Or]. */
void shape_grid_sample(Node *n) {
    Tensor *x = n->inputs[0], *g = n->inputs[1];
    require_f32(n);
    int r = x->rank - 2;
    if (r < 1 || r > 3)
        node_error(n, "grid_sample needs x of rank 3 to 5 ([N, C, D1, ...]), got %s",
                   shape_str(x->rank, x->shape));
    if (g->rank != x->rank || g->shape[0] != x->shape[0] || g->shape[g->rank - 1] != r)
        node_error(n, "grid_sample's grid must be [%lld, O1..O%d, %d] for x %s, got %s",
                   (long long)x->shape[0], r, r, shape_str(x->rank, x->shape),
                   shape_str(g->rank, g->shape));
    attr_choice(n, "mode", resize_modes, 3);
    attr_choice(n, "padding_mode", grid_sample_pads, 3);
    int64_t shape[MAX_RANK] = {x->shape[0], x->shape[1]};
    for (int i = 0; i < r; i++)
        shape[2 + i] = g->shape[1 + i];
    set_output(n, x->dtype, x->rank, shape);
}

/* roi_align(x [N, C, H, W], rois [R, 4] (x1, y1, x2, y2), batch_indices [R]
 * (i64 or i32)) -> [R, C, output_height, output_width]. */
void shape_roi_align(Node *n) {
    Tensor *x = n->inputs[0], *rois = n->inputs[1], *bi = n->inputs[2];
    require(n, 0, x->dtype == KILN_DTYPE_F32, "f32");
    require(n, 1, rois->dtype == KILN_DTYPE_F32, "f32");
    require(n, 2, bi->dtype == KILN_DTYPE_I64 || bi->dtype == KILN_DTYPE_I32, "i64 or i32");
    if (x->rank != 4 || rois->rank != 2 || rois->shape[1] != 4 || bi->rank != 1 ||
        bi->shape[0] != rois->shape[0])
        node_error(n, "roi_align needs x [N, C, H, W], rois [R, 4] and batch_indices [R], "
                   "got %s, %s and %s", shape_str(x->rank, x->shape),
                   shape_str(rois->rank, rois->shape), shape_str(bi->rank, bi->shape));
    attr_choice(n, "mode", roi_align_modes, 2);
    attr_choice(n, "coordinate_transformation_mode", roi_align_coords, 2);
    if (attr_int(n, "sampling_ratio") < 0)
        node_error_at(n, attr_loc(n, "sampling_ratio"), "sampling_ratio must not be negative");
    int64_t shape[4] = {rois->shape[0], x->shape[1],
                        positive_attr(n, "output_height", 1 << 20),
                        positive_attr(n, "output_width", 1 << 20)};
    set_output(n, x->dtype, 4, shape);
}

void shape_resize(Node *n) {
    Tensor *x = n->inputs[0];
    require_float(n);
    if (x->rank < 1)
        node_error(n, "resize of a scalar");
    double scales[MAX_RANK];
    int64_t out[MAX_RANK];
    resize_geometry(n, scales, out);
    attr_choice(n, "mode", resize_modes, 3);
    if (attr_choice(n, "coordinate_transformation_mode", resize_coords, 7) == 5) {
        Attr *roi = node_attr(n, "roi");
        if (!roi || !roi->is_list || roi->nitems != 2 * x->rank)
            node_error_at(n, roi ? roi->loc : n->loc, "tf_crop_and_resize needs roi: %d "
                          "values (starts, then ends, of each axis, as fractions)", 2 * x->rank);
    }
    attr_choice(n, "nearest_mode", resize_nearest, 4);
    set_output(n, x->dtype, x->rank, out);
}
