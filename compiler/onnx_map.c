/*
 * onnx_map.c: every supported ONNX op, mapped to kiln nodes by a function
 * of its family (onnx_map_generic.c, onnx_map_layout.c, onnx_map_math.c,
 * onnx_map_attention.c, onnx_map_einsum.c, onnx_map_nd.c).
 * The table lists them all: adding an ONNX op is a row here (and a mapper
 * when it is not a plain rename).
 */
#include "onnx.h"

#include <string.h>

static void map_if(Ctx *c, const OnnxOp *op);
static void map_loop(Ctx *c, const OnnxOp *op);
static void map_scan(Ctx *c, const OnnxOp *op);

static const OnnxOp onnx_ops[] = {
    {"Abs", map_simple, OP_ABS, NULL},
    {"Acos", map_simple, OP_ACOS, NULL},
    {"Acosh", map_simple, OP_ACOSH, NULL},
    {"Add", map_simple, OP_ADD, NULL},
    {"AffineGrid", map_affine_grid, OP_COUNT, NULL},
    {"And", map_simple, OP_AND, NULL},
    {"ArgMax", map_arg, OP_ARGMAX, NULL},
    {"ArgMin", map_arg, OP_ARGMIN, NULL},
    {"Asin", map_simple, OP_ASIN, NULL},
    {"Asinh", map_simple, OP_ASINH, NULL},
    {"Atan", map_simple, OP_ATAN, NULL},
    {"Atanh", map_simple, OP_ATANH, NULL},
    {"Attention", map_attention, OP_ATTENTION, NULL},
    {"AveragePool", map_window, OP_AVG_POOL, "kernel_shape:kernel"},
    {"BatchNormalization", map_norm, OP_BATCH_NORM, NULL},
    {"BitShift", map_bit_shift, OP_SHIFT_LEFT, NULL},
    {"BitwiseAnd", map_simple, OP_BIT_AND, NULL},
    {"BitwiseNot", map_simple, OP_BIT_NOT, NULL},
    {"BitwiseOr", map_simple, OP_BIT_OR, NULL},
    {"BitwiseXor", map_simple, OP_BIT_XOR, NULL},
    {"BlackmanWindow", map_folded_only, OP_COUNT, NULL},
    {"Cast", map_cast, OP_CAST, NULL},
    {"CastLike", map_cast, OP_CAST, NULL},
    {"Ceil", map_simple, OP_CEIL, NULL},
    {"Celu", map_unary_attr, OP_CELU, NULL},
    {"Clip", map_clip, OP_CLIP, NULL},
    {"Compress", map_compress, OP_COUNT, NULL},
    {"Concat", map_simple, OP_CONCAT, NULL},
    {"Constant", map_folded_only, OP_COUNT, NULL},
    {"ConstantOfShape", map_folded_only, OP_COUNT, NULL},
    {"Conv", map_window, OP_CONV, "kernel_shape:-"},
    {"ConvInteger", map_integer_product, OP_CONV, NULL},
    {"ConvTranspose", map_window, OP_CONV_TRANSPOSE, "kernel_shape:-"},
    {"Cos", map_simple, OP_COS, NULL},
    {"Cosh", map_simple, OP_COSH, NULL},
    {"CumSum", map_cumsum, OP_CUMSUM, NULL},
    {"DFT", map_dft, OP_DFT, NULL},
    {"DepthToSpace", map_unary_attr, OP_DEPTH_TO_SPACE, "blocksize:block"},
    {"DequantizeLinear", map_dequantize, OP_COUNT, NULL},
    {"Det", map_simple, OP_DET, NULL},
    {"Div", map_simple, OP_DIV, NULL},
    {"Dropout", map_view, OP_RESHAPE, NULL},
    {"DynamicQuantizeLinear", map_dynamic_quantize, OP_COUNT, NULL},
    {"Einsum", map_einsum, OP_COUNT, NULL},
    {"Elu", map_unary_attr, OP_ELU, NULL},
    {"Equal", map_simple, OP_EQ, NULL},
    {"Erf", map_simple, OP_ERF, NULL},
    {"Exp", map_simple, OP_EXP, NULL},
    {"Expand", map_expand_tile, OP_EXPAND, NULL},
    {"EyeLike", map_eye_like, OP_COUNT, NULL},
    {"Flatten", map_view, OP_FLATTEN, NULL},
    {"Floor", map_simple, OP_FLOOR, NULL},
    {"GRU", map_recurrent, OP_COUNT, NULL},
    {"Gather", map_gather, OP_GATHER, NULL},
    {"GatherElements", map_gather, OP_GATHER_ELEMENTS, NULL},
    {"GatherND", map_gather_nd, OP_COUNT, NULL},
    {"Gelu", map_gelu, OP_GELU, NULL},
    {"Gemm", map_gemm, OP_GEMM, NULL},
    {"GlobalAveragePool", map_simple, OP_GLOBAL_AVG_POOL, NULL},
    {"GlobalMaxPool", map_simple, OP_GLOBAL_MAX_POOL, NULL},
    {"Greater", map_simple, OP_GT, NULL},
    {"GreaterOrEqual", map_simple, OP_GE, NULL},
    {"GridSample", map_grid_sample, OP_GRID_SAMPLE, NULL},
    {"GroupNormalization", map_group_norm, OP_GROUP_NORM, NULL},
    {"HammingWindow", map_folded_only, OP_COUNT, NULL},
    {"HannWindow", map_folded_only, OP_COUNT, NULL},
    {"HardSigmoid", map_unary_attr, OP_HARD_SIGMOID, NULL},
    {"HardSwish", map_simple, OP_HARD_SWISH, NULL},
    {"Hardmax", map_softmax, OP_ARGMAX, NULL},
    {"Identity", map_view, OP_RESHAPE, NULL},
    {"If", map_if, OP_COUNT, NULL},
    {"InstanceNormalization", map_norm, OP_INSTANCE_NORM, NULL},
    {"IsInf", map_unary_attr, OP_ISINF, NULL},
    {"IsNaN", map_simple, OP_ISNAN, NULL},
    {"LRN", map_lrn, OP_COUNT, NULL},
    {"Loop", map_loop, OP_COUNT, NULL},
    {"LSTM", map_recurrent, OP_COUNT, NULL},
    {"LpNormalization", map_lp_norm, OP_COUNT, NULL},
    {"LpPool", map_lp_pool, OP_COUNT, NULL},
    {"LayerNormalization", map_norm, OP_LAYER_NORM, NULL},
    {"LeakyRelu", map_unary_attr, OP_LEAKY_RELU, NULL},
    {"Less", map_simple, OP_LT, NULL},
    {"LessOrEqual", map_simple, OP_LE, NULL},
    {"Log", map_simple, OP_LOG, NULL},
    {"LogSoftmax", map_softmax, OP_LOG_SOFTMAX, NULL},
    {"MatMul", map_simple, OP_MATMUL, NULL},
    {"MatMulInteger", map_integer_product, OP_MATMUL, NULL},
    {"Max", map_variadic, OP_MAX, NULL},
    {"MaxPool", map_window, OP_MAX_POOL, "kernel_shape:kernel"},
    {"MaxUnpool", map_max_unpool, OP_COUNT, NULL},
    {"Mean", map_variadic, OP_ADD, NULL},
    {"MeanVarianceNormalization", map_mvn, OP_COUNT, NULL},
    {"MelWeightMatrix", map_folded_only, OP_COUNT, NULL},
    {"Min", map_variadic, OP_MIN, NULL},
    {"Mish", map_mish_swish, OP_MUL, NULL},
    {"Mod", map_simple, OP_MOD, NULL},
    {"Mul", map_simple, OP_MUL, NULL},
    {"Neg", map_simple, OP_NEG, NULL},
    {"NegativeLogLikelihoodLoss", map_nll, OP_NEG, NULL},
    {"NonMaxSuppression", map_nms, OP_NMS, NULL},
    {"Not", map_simple, OP_NOT, NULL},
    {"OneHot", map_onehot, OP_ONE_HOT, NULL},
    {"Or", map_simple, OP_OR, NULL},
    {"PRelu", map_prelu, OP_PRELU, NULL},
    {"Pad", map_pad, OP_PAD, NULL},
    {"Pow", map_pow, OP_POW, NULL},
    {"QLinearConv", map_qlinear, OP_CONV, NULL},
    {"QLinearMatMul", map_qlinear, OP_MATMUL, NULL},
    {"QuantizeLinear", map_quantize, OP_COUNT, NULL},
    {"RMSNormalization", map_rms_norm, OP_RMS_NORM, NULL},
    {"RNN", map_recurrent, OP_COUNT, NULL},
    {"Range", map_folded_only, OP_COUNT, NULL},
    {"Reciprocal", map_simple, OP_RECIPROCAL, NULL},
    {"ReduceL1", map_reduce, OP_REDUCE_L1, NULL},
    {"ReduceL2", map_reduce, OP_REDUCE_L2, NULL},
    {"ReduceLogSum", map_reduce_log_sum, OP_LOG, NULL},
    {"ReduceLogSumExp", map_reduce, OP_REDUCE_LOG_SUM_EXP, NULL},
    {"ReduceMax", map_reduce, OP_REDUCE_MAX, NULL},
    {"ReduceMean", map_reduce, OP_REDUCE_MEAN, NULL},
    {"ReduceMin", map_reduce, OP_REDUCE_MIN, NULL},
    {"ReduceProd", map_reduce, OP_REDUCE_PROD, NULL},
    {"ReduceSum", map_reduce, OP_REDUCE_SUM, NULL},
    {"ReduceSumSquare", map_reduce, OP_REDUCE_SUM_SQUARE, NULL},
    {"Relu", map_simple, OP_RELU, NULL},
    {"Reshape", map_view, OP_RESHAPE, NULL},
    {"Resize", map_resize, OP_RESIZE, NULL},
    {"ReverseSequence", map_reverse_sequence, OP_COUNT, NULL},
    {"RotaryEmbedding", map_rotary_embedding, OP_ROPE, NULL},
    {"RoiAlign", map_roi_align, OP_ROI_ALIGN, NULL},
    {"Round", map_simple, OP_ROUND, NULL},
    {"STFT", map_dft, OP_STFT, NULL},
    {"Scatter", map_scatter, OP_SCATTER_ELEMENTS, NULL},
    {"ScatterElements", map_scatter, OP_SCATTER_ELEMENTS, NULL},
    {"ScatterND", map_scatter_nd, OP_COUNT, NULL},
    {"Scan", map_scan, OP_COUNT, NULL},
    {"Selu", map_unary_attr, OP_SELU, NULL},
    {"Shape", map_folded_only, OP_COUNT, NULL},
    {"Shrink", map_unary_attr, OP_SHRINK, NULL},
    {"Sigmoid", map_simple, OP_SIGMOID, NULL},
    {"Sign", map_simple, OP_SIGN, NULL},
    {"Sin", map_simple, OP_SIN, NULL},
    {"Sinh", map_simple, OP_SINH, NULL},
    {"Size", map_folded_only, OP_COUNT, NULL},
    {"Slice", map_slice, OP_SLICE, NULL},
    {"Softmax", map_softmax, OP_SOFTMAX, NULL},
    {"SoftmaxCrossEntropyLoss", map_sce, OP_LOG_SOFTMAX, NULL},
    {"Softplus", map_simple, OP_SOFTPLUS, NULL},
    {"Softsign", map_simple, OP_SOFTSIGN, NULL},
    {"SpaceToDepth", map_unary_attr, OP_SPACE_TO_DEPTH, "blocksize:block"},
    {"Split", map_split, OP_SPLIT, NULL},
    {"Sqrt", map_simple, OP_SQRT, NULL},
    {"Squeeze", map_view, OP_SQUEEZE, NULL},
    {"Sub", map_simple, OP_SUB, NULL},
    {"Sum", map_variadic, OP_ADD, NULL},
    {"Swish", map_mish_swish, OP_MUL, NULL},
    {"SwiGLU", map_mish_swish, OP_MUL, NULL},
    {"Tan", map_simple, OP_TAN, NULL},
    {"Tanh", map_simple, OP_TANH, NULL},
    {"ThresholdedRelu", map_unary_attr, OP_THRESHOLDED_RELU, NULL},
    {"Tile", map_expand_tile, OP_TILE, NULL},
    {"TopK", map_topk, OP_TOPK, NULL},
    {"Transpose", map_simple, OP_TRANSPOSE, NULL},
    {"Trilu", map_trilu, OP_TRILU, NULL},
    {"Unsqueeze", map_view, OP_UNSQUEEZE, NULL},
    {"Upsample", map_resize, OP_RESIZE, NULL},
    {"Where", map_simple, OP_WHERE, NULL},
    {"Xor", map_simple, OP_XOR, NULL},
};

const OnnxOp *find_mapper(const char *name) {
    for (size_t i = 0; i < sizeof onnx_ops / sizeof onnx_ops[0]; i++)
        if (strcmp(onnx_ops[i].name, name) == 0)
            return &onnx_ops[i];
    return NULL;
}

/* A node of a subgraph (an If's branch, a Loop's or Scan's body), mapped in
 * this graph's scope under nname, checked as a top-level one is. */
static void map_inner_node(Ctx *c, Onnx__NodeProto *n, const char *nname) {
    c->node = n;
    c->nname = nname;
    if ((*n->domain && strcmp(n->domain, "ai.onnx") != 0) || !find_mapper(n->op_type))
        node_fail(c, format("unsupported: op type %s%s%s", n->domain, *n->domain ? "." : "",
                            n->op_type));
    map_node(c);
}

/* If whose condition is a constant: the branch it takes, inlined. Its
 * initializers and nodes are mapped in this graph's scope (ONNX names are
 * unique across scopes), each node checked as a top-level one is; its
 * outputs become the If's (views under the If's output names). A condition
 * computed at run time is refused by name (in_const). */
static void map_if(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *cond = in_const(c, 0, "If's condition");
    if (vcount(cond) != 1)
        node_fail(c, "If's condition must hold one value");
    const char *which = vget(cond, 0) != 0 ? "then_branch" : "else_branch";
    Onnx__AttributeProto *a = oattr(c, which);
    if (!a || !a->g)
        node_fail(c, format("If has no %s graph", which));
    Onnx__GraphProto *g = a->g;
    Onnx__NodeProto *self = c->node;
    const char *self_name = c->nname;
    if (g->n_output != self->n_output)
        node_fail(c, format("its %s has %zu outputs for the If's %zu", which, g->n_output,
                            self->n_output));
    fill_absent_names(g);
    for (size_t i = 0; i < g->n_initializer; i++) {
        Onnx__TensorProto *tp = g->initializer[i];
        bind_value(c, tp->name, decode_tensor(c->path, c->dir, tp,
                                              format("initializer '%s' of %s", tp->name,
                                                     which), c->loc, false));
    }
    for (size_t i = 0; i < g->n_node; i++) {
        Onnx__NodeProto *n = g->node[i];
        map_inner_node(c, n, format("%s (%s), in the %s of %s",
                                    *n->name ? n->name : format("#%zu", i), n->op_type, which,
                                    self_name));
    }
    c->node = self;
    c->nname = self_name;
    for (size_t i = 0; i < g->n_output; i++) {
        Value *v = map_get(&c->values, g->output[i]->name ? g->output[i]->name : "");
        if (!v)
            node_fail(c, format("output '%s' of its %s is not computed there",
                                g->output[i]->name, which));
        bind_output(c, (int)i, v);
    }
}

/* ---- Loop and Scan with their iteration counts known at compile time:
 * unrolled. Each iteration maps a copy of the body whose own names (its
 * inputs, initializers and node outputs) carry the iteration's prefix, so
 * that the copies' values and tensors stay apart; names from outside the
 * body are read as they are. ---- */

typedef struct Unroll {
    Onnx__GraphProto *body;
    Map local; /* the body's own names */
    const char *prefix;
} Unroll;

static const char *unrolled_name(const Unroll *u, const char *name) {
    return *name && map_get(&u->local, name) ? format("%s%s", u->prefix, name) : name;
}

static void unroll_begin(Ctx *c, Unroll *u, Onnx__GraphProto *body, const char *what) {
    static int mark;
    memset(u, 0, sizeof *u);
    u->body = body;
    fill_absent_names(body);
    for (size_t i = 0; i < body->n_input; i++)
        map_put(&u->local, body->input[i]->name, &mark);
    for (size_t i = 0; i < body->n_initializer; i++)
        map_put(&u->local, body->initializer[i]->name, &mark);
    for (size_t i = 0; i < body->n_node; i++) {
        Onnx__NodeProto *n = body->node[i];
        for (size_t a = 0; a < n->n_attribute; a++)
            if (n->attribute[a]->g || n->attribute[a]->n_graphs)
                node_fail(c, format("unsupported: a %s body whose node '%s' (%s) holds a graph",
                                    what, n->name, n->op_type));
        for (size_t o = 0; o < n->n_output; o++)
            map_put(&u->local, n->output[o], &mark);
    }
}

/* Maps one iteration of the body: inputs bound to ins[] (n of them, in the
 * body's order); returns the body's outputs in outs[] (nout of them). */
static void unroll_step(Ctx *c, Unroll *u, int step, Value **ins, int n, Value **outs,
                        int nouts, const char *what) {
    Onnx__NodeProto *self = c->node;
    const char *self_name = c->nname;
    u->prefix = format("%s/%d/", *self->name ? self->name : self->op_type, step);
    if ((int)u->body->n_input != n || (int)u->body->n_output != nouts)
        node_fail(c, format("its body has %zu inputs and %zu outputs, the %s needs %d and %d",
                            u->body->n_input, u->body->n_output, what, n, nouts));
    for (int i = 0; i < n; i++)
        bind_value(c, unrolled_name(u, u->body->input[i]->name), ins[i]);
    for (size_t i = 0; i < u->body->n_initializer; i++) {
        Onnx__TensorProto *tp = u->body->initializer[i];
        Value *v = decode_tensor(c->path, c->dir, tp, format("initializer '%s' of the %s body",
                                                           tp->name, what), c->loc, false);
        v->name = unrolled_name(u, tp->name);
        bind_value(c, v->name, v);
    }
    for (size_t i = 0; i < u->body->n_node; i++) {
        Onnx__NodeProto copy = *u->body->node[i];
        copy.input = xcalloc(copy.n_input + 1, sizeof(char *));
        copy.output = xcalloc(copy.n_output + 1, sizeof(char *));
        for (size_t j = 0; j < copy.n_input; j++)
            copy.input[j] = xstrdup(unrolled_name(u, u->body->node[i]->input[j]));
        for (size_t j = 0; j < copy.n_output; j++)
            copy.output[j] = xstrdup(unrolled_name(u, u->body->node[i]->output[j]));
        copy.name = format("%s%s", u->prefix, copy.name);
        Onnx__NodeProto *node = xcalloc(1, sizeof *node);
        *node = copy;
        map_inner_node(c, node, format("%s (%s), in step %d of %s", copy.name, copy.op_type,
                                       step, self_name));
    }
    c->node = self;
    c->nname = self_name;
    for (int i = 0; i < nouts; i++) {
        const char *name = unrolled_name(u, u->body->output[i]->name);
        outs[i] = map_get(&c->values, name);
        if (!outs[i])
            node_fail(c, format("output '%s' of its body is not computed there",
                                u->body->output[i]->name));
    }
}

/* parts[0..n) (each of one shape) stacked along a new axis at `axis`
 * (reversed: the last first), as output i. */
static void stack_output(Ctx *c, int i, Value **parts, int n, int axis, bool reversed) {
    if (i >= nout(c) || !*out_name(c, i))
        return;
    Value **views = xcalloc((size_t)n, sizeof *views);
    for (int t = 0; t < n; t++) {
        Value *v = parts[reversed ? n - 1 - t : t];
        int64_t shape[MAX_RANK];
        if (v->rank + 1 > MAX_RANK)
            node_fail(c, "a scan output of too high a rank");
        for (int d = 0, s = 0; d <= v->rank; d++)
            shape[d] = d == axis ? 1 : v->shape[s++];
        views[t] = reshaped(c, v, v->rank + 1, shape);
    }
    if (n == 1) {
        bind_output(c, i, views[0]);
        return;
    }
    joined(c, n, views, axis, out_name(c, i));
}

#define MAX_UNROLL 4096

/* Loop with a constant trip count and condition (each iteration's computed
 * condition must fold to a constant too): unrolled. Outputs: the final
 * loop-carried values, then each scan output stacked along a new first
 * axis. */
static void map_loop(Ctx *c, const OnnxOp *op) {
    (void)op;
    Onnx__AttributeProto *a = oattr(c, "body");
    if (!a || !a->g)
        node_fail(c, "Loop has no body graph");
    int64_t trips = INT64_MAX;
    if (in_opt(c, 0)) {
        Value *m = in_const(c, 0, "Loop's trip count");
        if (vcount(m) != 1)
            node_fail(c, "Loop's trip count must hold one value");
        trips = vgeti(m, 0);
    }
    bool go = true;
    if (in_opt(c, 1)) {
        Value *cond = in_const(c, 1, "Loop's condition");
        go = vcount(cond) == 1 && vget(cond, 0) != 0;
    }
    int carried = nin(c) - 2, nscan = (int)a->g->n_output - 1 - carried;
    if (carried < 0 || nscan < 0)
        node_fail(c, format("Loop's body has %zu outputs for %d loop-carried values",
                            a->g->n_output, carried));
    Value **state = xcalloc((size_t)carried + 2, sizeof *state);
    for (int i = 0; i < carried; i++)
        state[i + 2] = in(c, 2 + i);
    Value ***scans = xcalloc((size_t)nscan + 1, sizeof *scans);
    Value **outs = xcalloc((size_t)a->g->n_output + 1, sizeof *outs);
    Unroll u;
    unroll_begin(c, &u, a->g, "Loop");
    int steps = 0;
    for (; go && steps < trips; steps++) {
        if (steps == MAX_UNROLL)
            node_fail(c, format("unsupported: a Loop of more than %d iterations (unrolled)",
                                MAX_UNROLL));
        state[0] = const_scalar(c, KILN_DTYPE_I64, (double)steps);
        state[1] = const_scalar(c, KILN_DTYPE_BOOL, 1);
        unroll_step(c, &u, steps, state, carried + 2, outs, (int)a->g->n_output, "Loop");
        if (!outs[0]->data)
            node_fail(c, "unsupported: a Loop whose condition is computed at run time");
        go = vget(outs[0], 0) != 0;
        for (int i = 0; i < carried; i++)
            state[i + 2] = outs[1 + i];
        for (int i = 0; i < nscan; i++) {
            scans[i] = xrealloc(scans[i], sizeof(Value *) * (size_t)(steps + 1));
            scans[i][steps] = outs[1 + carried + i];
        }
    }
    if (nscan && steps == 0)
        node_fail(c, "unsupported: a Loop of no iterations with scan outputs (empty tensors)");
    for (int i = 0; i < carried; i++)
        bind_output(c, i, state[i + 2]);
    for (int i = 0; i < nscan; i++)
        stack_output(c, carried + i, scans[i], steps, 0, false);
}

/* Scan (9 and later) over a sequence length known at compile time:
 * unrolled; scan inputs sliced along their axes (reversed when asked),
 * scan outputs stacked along theirs. Version 8 (a batch axis) is refused. */
static void map_scan(Ctx *c, const OnnxOp *op) {
    (void)op;
    if (onnx_op_version("Scan", c->opset) < 9)
        node_fail(c, "unsupported: Scan version 8 (its batch axis and sequence_lens)");
    Onnx__AttributeProto *a = oattr(c, "body");
    if (!a || !a->g)
        node_fail(c, "Scan has no body graph");
    int nscan_in = (int)oattr_int(c, "num_scan_inputs", 0);
    int nstate = nin(c) - nscan_in, nscan_out = (int)a->g->n_output - nstate;
    if (nscan_in < 1 || nstate < 0 || nscan_out < 0)
        node_fail(c, format("Scan's num_scan_inputs %d does not fit its %d inputs", nscan_in,
                            nin(c)));
    Onnx__AttributeProto *in_axes = oattr_ints(c, "scan_input_axes"),
                         *in_dirs = oattr_ints(c, "scan_input_directions"),
                         *out_axes = oattr_ints(c, "scan_output_axes"),
                         *out_dirs = oattr_ints(c, "scan_output_directions");
    int64_t len = -1;
    Value **seq = xcalloc((size_t)nscan_in, sizeof *seq);
    int *axis = xcalloc((size_t)nscan_in, sizeof *axis);
    for (int i = 0; i < nscan_in; i++) {
        seq[i] = in(c, nstate + i);
        int64_t ax = in_axes && (int)in_axes->n_ints > i ? in_axes->ints[i] : 0;
        if (ax < 0)
            ax += seq[i]->rank;
        if (ax < 0 || ax >= seq[i]->rank)
            node_fail(c, format("scan input %d has no axis %lld", i, (long long)ax));
        axis[i] = (int)ax;
        if (len >= 0 && seq[i]->shape[ax] != len)
            node_fail(c, "Scan's inputs differ in their sequence lengths");
        len = seq[i]->shape[ax];
    }
    if (len < 1)
        node_fail(c, "unsupported: a Scan over an empty sequence");
    if (len > MAX_UNROLL)
        node_fail(c, format("unsupported: a Scan of more than %d steps (unrolled)", MAX_UNROLL));
    Value **ins = xcalloc((size_t)nin(c) + 1, sizeof *ins);
    for (int i = 0; i < nstate; i++)
        ins[i] = in(c, i);
    Value ***scans = xcalloc((size_t)nscan_out + 1, sizeof *scans);
    for (int i = 0; i < nscan_out; i++)
        scans[i] = xcalloc((size_t)len, sizeof(Value *));
    Value **outs = xcalloc((size_t)a->g->n_output + 1, sizeof *outs);
    Unroll u;
    unroll_begin(c, &u, a->g, "Scan");
    for (int64_t t = 0; t < len; t++) {
        for (int i = 0; i < nscan_in; i++) {
            bool rev = in_dirs && (int)in_dirs->n_ints > i && in_dirs->ints[i];
            int64_t at = rev ? len - 1 - t : t;
            Value *s = sliced(c, seq[i], axis[i], at, at + 1);
            int64_t shape[MAX_RANK];
            for (int d = 0, k = 0; d < seq[i]->rank; d++)
                if (d != axis[i])
                    shape[k++] = seq[i]->shape[d];
            ins[nstate + i] = reshaped(c, s, seq[i]->rank - 1, shape);
        }
        unroll_step(c, &u, (int)t, ins, nin(c), outs, (int)a->g->n_output, "Scan");
        for (int i = 0; i < nstate; i++)
            ins[i] = outs[i];
        for (int i = 0; i < nscan_out; i++)
            scans[i][t] = outs[nstate + i];
    }
    for (int i = 0; i < nstate; i++)
        bind_output(c, i, ins[i]);
    for (int i = 0; i < nscan_out; i++) {
        int64_t ax = out_axes && (int)out_axes->n_ints > i ? out_axes->ints[i] : 0;
        int rank = scans[i][0]->rank + 1;
        if (ax < 0)
            ax += rank;
        if (ax < 0 || ax >= rank)
            node_fail(c, format("scan output %d has no axis %lld", i, (long long)ax));
        stack_output(c, nstate + i, scans[i], (int)len, (int)ax,
                     out_dirs && (int)out_dirs->n_ints > i && out_dirs->ints[i]);
    }
}

/* A name the node writes that is already defined: ONNX graphs are
 * single-assignment (a second writer would silently replace the first). */
static void check_single_assignment(Ctx *c) {
    for (size_t o = 0; o < c->node->n_output; o++) {
        const char *name = c->node->output[o];
        if (!*name)
            continue;
        Onnx__NodeProto *prev = map_get(&c->producer, name);
        if (prev == c->node)
            node_fail(c, format("it writes '%s' twice: a tensor has one writer", name));
        if (prev)
            node_fail(c, format("it writes '%s', which node '%s (%s)' already writes: a "
                                "tensor has one writer",
                                name, *prev->name ? prev->name : "unnamed", prev->op_type));
        if (map_get(&c->values, name))
            node_fail(c, format("it writes '%s', which is a graph input or initializer: a "
                                "tensor has one writer", name));
        map_put(&c->producer, name, c->node);
    }
}

void map_node(Ctx *c) {
    check_single_assignment(c);
    check_op_version(c);
    if (c->past_states.len && strcmp(c->node->op_type, "Concat") == 0 &&
        onnx_decoder_append(c))
        return;
    if (fold(c))
        return;
    const OnnxOp *op = find_mapper(c->node->op_type);
    op->fn(c, op);
}
