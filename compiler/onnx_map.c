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
    {"LSTM", map_recurrent, OP_COUNT, NULL},
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
        c->node = n;
        c->nname = format("%s (%s), in the %s of %s",
                          *n->name ? n->name : format("#%zu", i), n->op_type, which,
                          self_name);
        if ((*n->domain && strcmp(n->domain, "ai.onnx") != 0) || !find_mapper(n->op_type))
            node_fail(c, format("unsupported: op type %s%s%s", n->domain, *n->domain ? "." : "",
                                n->op_type));
        map_node(c);
    }
    c->node = self;
    c->nname = self_name;
    for (size_t i = 0; i < g->n_output; i++) {
        Value *v = map_get(&c->values, g->output[i]->name ? g->output[i]->name : "");
        if (!v)
            node_fail(c, format("output '%s' of its %s is not computed there",
                                g->output[i]->name, which));
        if (!*out_name(c, (int)i))
            continue;
        if (v->data) { /* a constant: a copy under the If's name */
            Value *o = new_value(out_name(c, (int)i), v->dtype, v->rank, v->shape, true);
            memcpy(o->data, v->data, (size_t)(vcount(v) * kiln_dtype_size(v->dtype)));
            bind_value(c, out_name(c, (int)i), o);
            continue;
        }
        Node *k = emit(c, OP_RESHAPE, 1, &v, out_name(c, (int)i));
        node_set_ints(k, "shape", v->rank, v->shape);
        finish(c, k);
    }
}

void map_node(Ctx *c) {
    for (size_t o = 0; o < c->node->n_output; o++)
        if (*c->node->output[o])
            map_put(&c->producer, c->node->output[o], c->node);
    check_op_version(c);
    if (fold(c))
        return;
    const OnnxOp *op = find_mapper(c->node->op_type);
    op->fn(c, op);
}
