/*
 * onnx_versions.c: which version of each ONNX op a model uses, and whether
 * kiln reads that version.
 *
 * An op's version in a model is the newest of its versions (the opsets at
 * which ONNX changed its definition, onnx_versions.def) not past the
 * model's opset. kiln's mappers were written against every op's versions
 * up to opset 18; a newer version is read only when it is listed in
 * `reviewed` below, after its changes were checked against kiln's mapping.
 * Any other newer version is refused by name, never read with an older
 * version's meaning.
 */
#include "onnx.h"

#include <stdlib.h>
#include <string.h>

#define OPSET_MAX(n) enum { ONNX_OPSET_NEWEST = n };
#define V(name, versions)
#include "onnx_versions.def"
#undef OPSET_MAX
#undef V

static const struct {
    const char *name, *versions;
} all_ops[] = {
#define OPSET_MAX(n)
#define V(name, versions) {name, versions},
#include "onnx_versions.def"
#undef OPSET_MAX
#undef V
};

/* Every version kiln read before it went past opset 18. */
#define READ_THROUGH 18

/* Versions past 18 that kiln reads, each up to `through`. What changed in
 * them (onnx 1.23.1's schemas compared, version by version):
 *   - types only, all of which kiln refuses by dtype anyway (bfloat16,
 *     float8, int4/uint4, float4, float8e8m0, int2/uint2, string), or that
 *     it reads like the others (float16 and double for Celu, bool for
 *     ReduceMax/ReduceMin, integers removed from ReduceLogSum*);
 *   - Cast and CastLike 19: `saturate`, which applies to float8 results
 *     only (kiln reads none); 24 `round_mode`, for float8e8m0 results
 *     only, and the float8 saturation table; 25 and 28 new types only;
 *   - AveragePool 19: `dilations`, which kiln's avg_pool does not take: a
 *     node that sets it is refused by name (unsupported attribute);
 *   - BitShift 28: signed integers (a signed right shift is arithmetic)
 *     and every shift amount defined: kiln's shift_left/shift_right;
 *   - Mod 28: floating-point fmod=0 (A - floor(A / B) * B) and the cases of
 *     infinite, zero and NaN operands: kiln's mod (shaders/common.glsl);
 *   - SpaceToDepth 28: `mode` (DCR or CRD), kiln's space_to_depth's mode;
 *   - Range 27: f16 inputs and `stash_type`, whose default (f32 arithmetic)
 *     kiln's folding in double matches; stash_type 0 is refused by name;
 *   - QLinearMatMul 21: f16 scales (kiln rescales in f32) and float8
 *     types, which kiln refuses by dtype;
 *   - LpNormalization 22: types only; LpPool 18: ceil_mode (refused by
 *     name), 22 types only;
 *   - DFT 20: the axis became an input (a constant in kiln), -2 by
 *     default (onnx_map_math.c);
 *   - Det 22, Compress 28, ReverseSequence 28, Einsum 28, QuantizeLinear
 *     and DequantizeLinear 28: types only;
 *   - MaxPool and AveragePool 22: bfloat16, and the output size with
 *     ceil_mode written out: a window that would start in the right
 *     padding is dropped, the rule kiln applies at every version
 *     (window_geometry in op_params.c, as onnxruntime and PyTorch do);
 *   - Pad 19: mode "wrap", and Resize 19: coordinate mode
 *     "half_pixel_symmetric": both refused by name where they appear;
 *   - If 19, 21, 23, 24 and 25: new types only (kiln takes a constant
 *     condition and inlines the branch: onnx_map.c); Loop and Scan 19 to
 *     25 likewise (kiln unrolls them);
 *   - GridSample 20: modes renamed (linear, cubic) and N-D grids; 22 types
 *     only; RoiAlign 22 and MaxUnpool 22: types only;
 *   - ops new after 18: Gelu 20, AffineGrid 20, GroupNormalization 21 (scale
 *     and bias per channel; 18's per group is read too), RMSNormalization
 *     23, Attention 23, 24 (nonpad_kv_seqlen: a mask) and 25 (left and
 *     right windows: a mask),
 *     RotaryEmbedding 23, Mish 22, Swish 24 and SwiGLU 28 (onnx_map_math.c,
 *     onnx_map_attention.c).
 */
static const struct {
    const char *name;
    int through;
} reviewed[] = {
    {"Acos", 22}, {"Acosh", 22}, {"AffineGrid", 20}, {"Asin", 22}, {"Asinh", 22}, {"Atan", 22}, {"Atanh", 22},
    {"Attention", 25}, {"BitShift", 28}, {"Compress", 28}, {"Det", 22}, {"Einsum", 28}, {"AveragePool", 22}, {"Cast", 28}, {"CastLike", 25}, {"Celu", 28},
    {"Constant", 25}, {"ConstantOfShape", 25}, {"Conv", 22}, {"ConvTranspose", 22},
    {"Cos", 22}, {"Cosh", 22}, {"DepthToSpace", 28}, {"DFT", 20}, {"DequantizeLinear", 28}, {"Dropout", 22}, {"Elu", 22}, {"EyeLike", 22},
    {"Equal", 19}, {"Flatten", 25}, {"Gelu", 20}, {"GlobalAveragePool", 22},
    {"GlobalMaxPool", 22}, {"GRU", 22}, {"GridSample", 22}, {"GroupNormalization", 21}, {"HardSigmoid", 22},
    {"HardSwish", 22}, {"Identity", 25}, {"If", 25}, {"InstanceNormalization", 22}, {"LRN", 13}, {"Loop", 25}, {"LpNormalization", 22}, {"LpPool", 22}, {"LSTM", 22}, {"MaxPool", 22}, {"MaxUnpool", 22}, {"IsInf", 20},
    {"IsNaN", 20}, {"MeanVarianceNormalization", 13}, {"Mod", 28}, {"Mish", 22}, {"NegativeLogLikelihoodLoss", 22}, {"OneHot", 28},
    {"Pad", 25}, {"QLinearMatMul", 21}, {"QuantizeLinear", 28}, {"RMSNormalization", 23}, {"RNN", 22}, {"ReduceLogSum", 28}, {"ReduceLogSumExp", 28},
    {"ReduceMax", 20}, {"ReduceMin", 20}, {"Range", 27}, {"Reshape", 25}, {"ReverseSequence", 28}, {"Resize", 19}, {"RoiAlign", 22}, {"Scan", 25}, {"RotaryEmbedding", 23}, {"Round", 22},
    {"Selu", 22}, {"Shape", 25}, {"Sin", 22}, {"Sinh", 22}, {"Size", 25}, {"Softplus", 22},
    {"Softsign", 22}, {"SpaceToDepth", 28}, {"Squeeze", 25}, {"Swish", 24}, {"SwiGLU", 28}, {"Tan", 22}, {"ThresholdedRelu", 22},
    {"TopK", 24}, {"Transpose", 25}, {"Unsqueeze", 25},
};

int64_t onnx_opset_newest(void) { return ONNX_OPSET_NEWEST; }

int64_t onnx_op_version(const char *op, int64_t opset) {
    for (size_t i = 0; i < sizeof all_ops / sizeof all_ops[0]; i++) {
        if (strcmp(all_ops[i].name, op) != 0)
            continue;
        int64_t best = 0;
        for (const char *p = all_ops[i].versions; *p;) {
            char *end;
            long long v = strtoll(p, &end, 10);
            if (v <= opset)
                best = v;
            p = *end ? end + 1 : end;
        }
        return best;
    }
    return 0;
}

static int read_through(const char *op) {
    for (size_t i = 0; i < sizeof reviewed / sizeof reviewed[0]; i++)
        if (strcmp(reviewed[i].name, op) == 0)
            return reviewed[i].through;
    return READ_THROUGH;
}

void check_op_version(Ctx *c) {
    const char *op = c->node->op_type;
    int64_t v = onnx_op_version(op, c->opset);
    int through = read_through(op);
    if (v > through)
        node_fail(c, format("unsupported: %s version %lld (opset %lld); kiln reads %s up to "
                            "version %lld", op, (long long)v, (long long)c->opset, op,
                            (long long)onnx_op_version(op, through)));
}
