/*
 * onnx_map_quant.c: ONNX's quantization ops as kiln's elementwise ops,
 * matmuls and convolutions.
 *
 *  - DequantizeLinear: (float(x) - zero_point) * scale. A dequantized
 *    constant (a weight, as onnxruntime's QDQ tools write them) is
 *    computed here on the CPU and becomes an f32 constant; one of rank 2
 *    from 8-bit codes keeps them beside it, so that a matmul's B can be
 *    stored as those codes (quantize.c).
 *  - QuantizeLinear: clamp(roundEven(x / scale) + zero_point) to the
 *    output type's range (uint8 or int8), then a cast.
 *  - DynamicQuantizeLinear: the scale and zero point from the input's
 *    range (extended to include 0), then QuantizeLinear to uint8.
 *  - MatMulInteger, ConvInteger: the product of the inputs less their
 *    zero points, exact in int32. kiln's matmul and convolution compute in
 *    f32, where a sum of integer products is exact while it stays below
 *    2^24; the reduction is cut into chunks short enough for that (from the
 *    largest |x - zero_point| the dtypes, or constant values, allow), each
 *    chunk's product converted to int32 and the chunks added there.
 *  - QLinearMatMul, QLinearConv: the same product (in f32), plus the int32
 *    bias, times x_scale * w_scale / y_scale, then quantized with y's
 *    zero point.
 *
 * Scales and zero points are per tensor (a scalar), per axis (1-D, along
 * `axis`) or, from QuantizeLinear/DequantizeLinear 21, blocked (x's rank,
 * each value repeated block_size times along `axis`: a Gather of constant
 * positions). Types kiln does not read (int4, int16, float8) are refused
 * when the tensors are read; a `precision` other than float is refused.
 */
#include "onnx.h"

#include <math.h>
#include <string.h>

#define F32_EXACT 16777216.0 /* 2^24: integers up to here are exact in f32 */

/* ONNX TensorProto data types used here */
enum { ONNX_FLOAT = 1, ONNX_UINT8 = 2, ONNX_INT8 = 3, ONNX_FLOAT16 = 10 };

static int norm_axis(Ctx *c, int64_t axis, int rank) {
    if (axis < -rank || axis >= (rank ? rank : 1))
        node_fail(c, format("axis %lld is out of range for rank %d", (long long)axis, rank));
    return (int)(axis < 0 ? axis + rank : axis);
}

/* The index into p (a scale or zero point) of x's element i. */
static int64_t param_index(const Value *x, const Value *p, int axis, int64_t block, int64_t i) {
    return quant_param_index(x->rank, x->shape, vcount(p) == 1 ? -1 : axis, block, i);
}

/* Checks p's shape against x for the granularity ONNX defines. */
static void check_param(Ctx *c, const Value *x, const Value *p, int axis, int64_t block,
                        const char *what) {
    if (vcount(p) == 1 && p->rank <= 1 && !block)
        return;
    if (axis < 0 || axis >= x->rank) /* no such axis: a vector operand's rows or columns */
        node_fail(c, format("%s of shape %s must hold one value for an input of shape %s", what,
                            shape_str(p->rank, p->shape), shape_str(x->rank, x->shape)));
    if (p->rank == 1 && !block) {
        if (p->shape[0] != x->shape[axis])
            node_fail(c, format("%s has %lld values for a dimension of %lld along axis %d", what,
                                (long long)p->shape[0], (long long)x->shape[axis], axis));
        return;
    }
    if (block && p->rank == x->rank) {
        for (int d = 0; d < x->rank; d++) {
            int64_t want = d == axis ? (x->shape[d] + block - 1) / block : x->shape[d];
            if (p->shape[d] != want)
                node_fail(c, format("%s of shape %s for blocks of %lld along axis %d of %s", what,
                                    shape_str(p->rank, p->shape), (long long)block, axis,
                                    shape_str(x->rank, x->shape)));
        }
        return;
    }
    node_fail(c, format("%s of shape %s for an input of shape %s%s", what,
                        shape_str(p->rank, p->shape), shape_str(x->rank, x->shape),
                        block ? "" : " (block_size is 0: a scalar or a 1-D tensor)"));
}

/* p as an f32 tensor that broadcasts against x (see check_param). */
static Value *broadcast_param(Ctx *c, const Value *x, Value *p, int axis, int64_t block) {
    p = cast_to(c, p, KILN_DTYPE_F32);
    if (vcount(p) == 1)
        return p;
    if (!block) {
        int64_t shape[MAX_RANK] = {p->shape[0]};
        for (int d = axis + 1; d < x->rank; d++)
            shape[d - axis] = 1;
        return reshaped(c, p, x->rank - axis, shape);
    }
    /* blocked: each value repeated block times along axis */
    Value *pos = new_value(format("%s/blocks%d", c->nname, ++c->tmp_count), KILN_DTYPE_I64, 1,
                           &x->shape[axis], true);
    for (int64_t i = 0; i < x->shape[axis]; i++)
        vseti(pos, i, i / block);
    Value *ins[2] = {p, pos};
    Node *k = emit_tmp(c, OP_GATHER, 2, ins);
    node_set_int(k, "axis", axis);
    return finish(c, k);
}

/* QuantizeLinear's and DequantizeLinear's inputs: x, its scale (checked
 * against x: per tensor, per axis from opset 13, or blocked), the optional
 * zero point (for the caller to check), the axis (normalized; 0, and not
 * checked, for a per-tensor scale) and block_size. A precision other than
 * FLOAT is refused. */
typedef struct QuantIn {
    Value *x, *scale, *zp;
    int axis;
    int64_t block;
} QuantIn;

static QuantIn quant_inputs(Ctx *c, const char *scale_name) {
    int64_t p = oattr_int(c, "precision", 0);
    if (p && p != ONNX_FLOAT)
        node_fail(c, format("unsupported: precision %s (kiln computes in FLOAT)",
                            onnx_type_name((int32_t)p)));
    QuantIn q = {in(c, 0), in(c, 1), in_opt(c, 2), 0, oattr_int(c, "block_size", 0)};
    if (q.block < 0)
        node_fail(c, format("block_size %lld is negative", (long long)q.block));
    if (c->opset < 13 && vcount(q.scale) != 1)
        node_fail(c, "the scale must be a scalar before opset 13 (version 10)");
    if (q.block || q.scale->rank > 1 || vcount(q.scale) != 1)
        q.axis = norm_axis(c, oattr_int(c, "axis", 1), q.x->rank);
    check_param(c, q.x, q.scale, q.axis, q.block, scale_name);
    return q;
}

/* The dtype an output_dtype attribute names (dflt when absent); only the
 * dtypes in `allowed` (-1 ended). */
static kiln_dtype output_dtype(Ctx *c, kiln_dtype dflt, const int *allowed) {
    int64_t t = oattr_int(c, "output_dtype", 0);
    if (!t)
        return dflt;
    int dt = kiln_dtype_of((int32_t)t);
    for (int i = 0; dt >= 0 && allowed[i] >= 0; i++)
        if (allowed[i] == dt)
            return (kiln_dtype)dt;
    node_fail(c, format("unsupported: output_dtype %s", onnx_type_name((int32_t)t)));
}

/* Clamps a float tensor of integers to dt's range and casts it to dt. */
static Node *saturate_cast(Ctx *c, Value *v, kiln_dtype dt, const char *out) {
    Node *k = emit_tmp(c, OP_CLIP, 1, &v);
    node_set_float(k, "min", dt == KILN_DTYPE_U8 ? 0 : -128);
    node_set_float(k, "max", dt == KILN_DTYPE_U8 ? 255 : 127);
    v = finish(c, k);
    Node *cast = out ? emit(c, OP_CAST, 1, &v, out) : emit_tmp(c, OP_CAST, 1, &v);
    node_set_attr(cast, "to", kiln_dtype_name(dt));
    return cast;
}

/* roundEven(v) + zp, saturated to dt (zp a broadcast f32 tensor or NULL). */
static Node *quantize_to(Ctx *c, Value *v, Value *zp, kiln_dtype dt, const char *out) {
    v = unary_tmp(c, OP_ROUND, v);
    if (zp)
        v = binary_tmp(c, OP_ADD, v, zp);
    return saturate_cast(c, v, dt, out);
}

static void check_quant_type(Ctx *c, kiln_dtype dt, const char *what) {
    if (dt != KILN_DTYPE_U8 && dt != KILN_DTYPE_I8)
        node_fail(c, format("unsupported: %s of dtype %s (kiln quantizes to uint8 and int8)",
                            what, kiln_dtype_name(dt)));
}

void map_dequantize(Ctx *c, const OnnxOp *op) {
    (void)op;
    QuantIn q = quant_inputs(c, "x_scale");
    Value *x = q.x, *scale = q.scale, *zp = q.zp;
    int axis = q.axis;
    int64_t block = q.block;
    if (x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8 && x->dtype != KILN_DTYPE_I32)
        node_fail(c, format("unsupported: dequantizing %s", kiln_dtype_name(x->dtype)));
    if (scale->dtype != KILN_DTYPE_F32 && scale->dtype != KILN_DTYPE_F16)
        node_fail(c, format("x_scale of dtype %s", kiln_dtype_name(scale->dtype)));
    if (zp) {
        if (zp->dtype != x->dtype)
            node_fail(c, format("x_zero_point is %s and x %s", kiln_dtype_name(zp->dtype),
                                kiln_dtype_name(x->dtype)));
        check_param(c, x, zp, axis, block, "x_zero_point");
        if (zp->rank != scale->rank || vcount(zp) != vcount(scale))
            node_fail(c, "x_scale and x_zero_point have different shapes");
    }
    static const int outs[] = {KILN_DTYPE_F32, KILN_DTYPE_F16, -1};
    kiln_dtype dt = output_dtype(c, scale->dtype, outs);
    if (x->data && scale->data && (!zp || zp->data)) {
        Value *y = new_value(out_name(c, 0), dt, x->rank, x->shape, true);
        for (int64_t i = 0; i < vcount(x); i++) {
            int64_t p = param_index(x, scale, axis, block, i);
            double z = zp ? vget(zp, p) : 0;
            vset(y, i, (float)((float)(vget(x, i) - z) * (float)vget(scale, p)));
        }
        if (x->rank == 2 && dt == KILN_DTYPE_F32 && x->dtype != KILN_DTYPE_I32) {
            /* a matmul weight may keep its codes (quantize.c) */
            float *s = xcalloc((size_t)vcount(scale) + 1, sizeof(float));
            for (int64_t i = 0; i < vcount(scale); i++)
                s[i] = (float)vget(scale, i);
            y->quant = (QuantCodes){x->data, x->dtype == KILN_DTYPE_I8, s,
                                    zp ? zp->data : NULL, vcount(scale) == 1 ? -1 : axis,
                                    block};
        }
        bind_value(c, out_name(c, 0), y);
        return;
    }
    Value *v = cast_to(c, x, KILN_DTYPE_F32);
    if (zp)
        v = binary_tmp(c, OP_SUB, v, broadcast_param(c, x, zp, axis, block));
    Value *pair[2] = {v, broadcast_param(c, x, scale, axis, block)};
    if (dt == KILN_DTYPE_F32) {
        finish(c, emit(c, OP_MUL, 2, pair, out_name(c, 0)));
        return;
    }
    v = finish(c, emit_tmp(c, OP_MUL, 2, pair));
    Node *k = emit(c, OP_CAST, 1, &v, out_name(c, 0));
    node_set_attr(k, "to", kiln_dtype_name(dt));
    finish(c, k);
}

void map_quantize(Ctx *c, const OnnxOp *op) {
    (void)op;
    QuantIn q = quant_inputs(c, "y_scale");
    Value *x = q.x, *scale = q.scale, *zp = q.zp;
    int axis = q.axis;
    int64_t block = q.block;
    if (x->dtype != KILN_DTYPE_F32 && x->dtype != KILN_DTYPE_F16)
        node_fail(c, format("quantizing %s", kiln_dtype_name(x->dtype)));
    static const int outs[] = {KILN_DTYPE_U8, KILN_DTYPE_I8, -1};
    kiln_dtype dt = output_dtype(c, zp ? zp->dtype : KILN_DTYPE_U8, outs);
    if (zp) {
        check_quant_type(c, zp->dtype, "y_zero_point");
        if (oattr(c, "output_dtype") && dt != zp->dtype)
            node_fail(c, format("output_dtype %s and y_zero_point of dtype %s",
                                kiln_dtype_name(dt), kiln_dtype_name(zp->dtype)));
        check_param(c, x, zp, axis, block, "y_zero_point");
    }
    Value *v = cast_to(c, x, KILN_DTYPE_F32);
    v = binary_tmp(c, OP_DIV, v, broadcast_param(c, x, scale, axis, block));
    finish(c, quantize_to(c, v, zp ? broadcast_param(c, x, zp, axis, block) : NULL, dt,
                          out_name(c, 0)));
}

/* A reduction of x over all its axes to a scalar. */
static Value *reduce_all(Ctx *c, OpKind op, Value *x) {
    Node *k = emit_tmp(c, op, 1, &x);
    int64_t axes[MAX_RANK];
    for (int d = 0; d < x->rank; d++)
        axes[d] = d;
    node_set_ints(k, "axes", x->rank, axes);
    node_set_int(k, "keep_dims", 0);
    return finish(c, k);
}

void map_dynamic_quantize(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0);
    if (x->dtype != KILN_DTYPE_F32)
        node_fail(c, format("unsupported: x of dtype %s", kiln_dtype_name(x->dtype)));
    Value *zero = const_scalar(c, KILN_DTYPE_F32, 0);
    Value *lo = binary_tmp(c, OP_MIN, reduce_all(c, OP_REDUCE_MIN, x), zero);
    Value *hi = binary_tmp(c, OP_MAX, reduce_all(c, OP_REDUCE_MAX, x), zero);
    Value *pair[2] = {binary_tmp(c, OP_SUB, hi, lo), const_scalar(c, KILN_DTYPE_F32, 255)};
    Value *scale = finish(c, emit(c, OP_DIV, 2, pair, out_name(c, 1)));
    /* zero point: roundEven(clamp(0 - lo / scale, 0, 255)) */
    Value *zf = binary_tmp(c, OP_SUB, zero, binary_tmp(c, OP_DIV, lo, scale));
    Node *k = emit_tmp(c, OP_CLIP, 1, &zf);
    node_set_float(k, "min", 0);
    node_set_float(k, "max", 255);
    zf = unary_tmp(c, OP_ROUND, finish(c, k));
    Node *cast = emit(c, OP_CAST, 1, &zf, out_name(c, 2));
    node_set_attr(cast, "to", kiln_dtype_name(KILN_DTYPE_U8));
    finish(c, cast);
    Value *v = binary_tmp(c, OP_DIV, x, scale);
    finish(c, quantize_to(c, v, zf, KILN_DTYPE_U8, out_name(c, 0)));
}

/* ---- integer products ---- */

/* The largest |x - zp| (zp absent: 0) that x's dtype, or x's and zp's
 * values when both are constants, allow. */
static double max_shifted(const Value *x, const Value *zp) {
    if (!x->data || (zp && !zp->data)) {
        if (!zp)
            return x->dtype == KILN_DTYPE_U8 ? 255 : 128;
        return 255;
    }
    double lo = INFINITY, hi = -INFINITY, zlo = 0, zhi = 0;
    for (int64_t i = 0; i < vcount(x); i++) {
        lo = fmin(lo, vget(x, i));
        hi = fmax(hi, vget(x, i));
    }
    if (zp) {
        zlo = INFINITY;
        zhi = -INFINITY;
        for (int64_t i = 0; i < vcount(zp); i++) {
            zlo = fmin(zlo, vget(zp, i));
            zhi = fmax(zhi, vget(zp, i));
        }
    }
    return vcount(x) ? fmax(fabs(hi - zlo), fabs(lo - zhi)) : 0;
}

/* x less its zero point, in f32 (zp per tensor, or per axis along axis). */
static Value *shifted(Ctx *c, Value *x, Value *zp, int axis, const char *what) {
    if (x->dtype != KILN_DTYPE_U8 && x->dtype != KILN_DTYPE_I8)
        node_fail(c, format("unsupported: %s of dtype %s (uint8 and int8 only)", what,
                            kiln_dtype_name(x->dtype)));
    Value *v = cast_to(c, x, KILN_DTYPE_F32);
    if (!zp)
        return v;
    if (zp->dtype != x->dtype)
        node_fail(c, format("the zero point of %s is %s, %s is %s", what,
                            kiln_dtype_name(zp->dtype), what, kiln_dtype_name(x->dtype)));
    check_param(c, x, zp, axis, 0, format("the zero point of %s", what));
    return binary_tmp(c, OP_SUB, v, broadcast_param(c, x, zp, axis, 0));
}

/* The kiln product (OP_MATMUL of a, b; or OP_CONV with the node's
 * attributes) of f32 tensors holding integers, the reduction cut into
 * chunks of at most `chunk` along a's axis a_axis and b's axis b_axis
 * (each chunk's inner size `per`). as_int: the result in int32, exact;
 * otherwise in f32. out: the result's name, or NULL for a temporary. */
static Value *integer_product(Ctx *c, OpKind op, Value *a, Value *b, int a_axis, int b_axis,
                              int64_t chunk, bool as_int, const char *out) {
    int64_t total = a->shape[a_axis];
    Value *acc = NULL;
    for (int64_t start = 0; start < total || !acc; start += chunk) { /* once if empty */
        int64_t end = start + chunk < total ? start + chunk : total;
        bool last = end == total;
        Value *ab[2] = {sliced(c, a, a_axis, start, end), sliced(c, b, b_axis, start, end)};
        bool named = last && !acc && out;
        Node *k = named && !as_int ? emit(c, op, 2, ab, out) : emit_tmp(c, op, 2, ab);
        if (op == OP_CONV)
            copy_attrs(c, k, "kernel_shape:-");
        Value *p = finish(c, k);
        if (as_int) {
            Node *cast = named ? emit(c, OP_CAST, 1, &p, out) : emit_tmp(c, OP_CAST, 1, &p);
            node_set_attr(cast, "to", kiln_dtype_name(KILN_DTYPE_I32));
            p = finish(c, cast);
        }
        if (acc) {
            Value *pair[2] = {acc, p};
            p = finish(c, last && out ? emit(c, OP_ADD, 2, pair, out) : emit_tmp(c, OP_ADD, 2, pair));
        }
        acc = p;
    }
    return acc;
}

/* How many of the reduction's terms (each `per` products) one f32 chunk
 * may hold exactly, given the operands' bounds. */
static int64_t exact_chunk(Ctx *c, double bound_a, double bound_b, int64_t per) {
    double prod = fmax(bound_a * bound_b, 1);
    int64_t n = (int64_t)(F32_EXACT / prod) / (per ? per : 1);
    if (n < 1)
        node_fail(c, "unsupported: a kernel window too large for an exact f32 product");
    return n;
}

/* MatMulInteger (a, b, a_zero_point, b_zero_point) and QLinearMatMul's
 * product; a's zero point per row, b's per column. */
static Value *matmul_integer(Ctx *c, Value *a, Value *azp, Value *b, Value *bzp, bool as_int,
                             const char *out) {
    if (a->rank < 1 || b->rank < 1)
        node_fail(c, "the operands must have rank 1 or more");
    int64_t ka = a->shape[a->rank - 1], kb = b->shape[b->rank >= 2 ? b->rank - 2 : 0];
    if (ka != kb)
        node_fail(c, format("inner dimensions %lld and %lld differ", (long long)ka,
                            (long long)kb));
    double ba = max_shifted(a, azp), bb = max_shifted(b, bzp);
    Value *af = shifted(c, a, azp, a->rank >= 2 ? a->rank - 2 : 0, "A");
    Value *bf = shifted(c, b, bzp, b->rank - 1, "B");
    int64_t chunk = exact_chunk(c, ba, bb, 1);
    if (a->rank == 1 || b->rank == 1)
        chunk = a->shape[a->rank - 1]; /* vectors: one product (shape rules) */
    return integer_product(c, OP_MATMUL, af, bf, a->rank - 1, b->rank >= 2 ? b->rank - 2 : 0,
                           chunk, as_int, out);
}

/* ConvInteger (x, w, x_zero_point, w_zero_point) and QLinearConv's
 * product; w's zero point per output channel. */
static Value *conv_integer(Ctx *c, Value *x, Value *xzp, Value *w, Value *wzp, bool as_int,
                           const char *out) {
    if (x->rank < 3 || w->rank != x->rank)
        node_fail(c, format("input of shape %s and weight of shape %s",
                            shape_str(x->rank, x->shape), shape_str(w->rank, w->shape)));
    if (xzp && vcount(xzp) != 1)
        node_fail(c, "x_zero_point must be a scalar");
    double bx = max_shifted(x, xzp), bw = max_shifted(w, wzp);
    Value *xf = shifted(c, x, xzp, 1, "x");
    Value *wf = shifted(c, w, wzp, 0, "w");
    int64_t window = shape_count(w->rank - 2, w->shape + 2);
    int64_t chunk = exact_chunk(c, bx, bw, window);
    int64_t group = oattr_int(c, "group", 1);
    if (group != 1 && chunk < w->shape[1])
        node_fail(c, format("unsupported: a grouped integer convolution of %lld terms per "
                            "output (f32 is exact to %lld)",
                            (long long)(w->shape[1] * window), (long long)(chunk * window)));
    return integer_product(c, OP_CONV, xf, wf, 1, 1, group != 1 ? w->shape[1] : chunk, as_int,
                           out);
}

void map_integer_product(Ctx *c, const OnnxOp *op) {
    Value *a = in(c, 0), *b = in(c, 1), *azp = in_opt(c, 2), *bzp = in_opt(c, 3);
    if (op->kop == OP_CONV)
        conv_integer(c, a, azp, b, bzp, true, out_name(c, 0));
    else
        matmul_integer(c, a, azp, b, bzp, true, out_name(c, 0));
}

/* QLinearMatMul (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) and
 * QLinearConv (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B).
 * QLinearMatMul 21's scales may be f16: the rescaling runs in f32. */
void map_qlinear(Ctx *c, const OnnxOp *op) {
    bool conv = op->kop == OP_CONV;
    static const int scales[] = {1, 4, 6}; /* a_scale, b_scale, y_scale */
    for (int i = 0; !conv && onnx_op_version("QLinearMatMul", c->opset) < 21 && i < 3; i++)
        if (in(c, scales[i])->dtype != KILN_DTYPE_F32)
            node_fail(c, format("QLinearMatMul 10's scales are f32, not %s (f16 from "
                                "version 21)", kiln_dtype_name(in(c, scales[i])->dtype)));
    Value *a = in(c, 0), *as = cast_to(c, in(c, 1), KILN_DTYPE_F32), *azp = in_opt(c, 2);
    Value *b = in(c, 3), *bs = cast_to(c, in(c, 4), KILN_DTYPE_F32), *bzp = in_opt(c, 5);
    Value *ys = in(c, 6), *yzp = in_opt(c, 7), *bias = conv ? in_opt(c, 8) : NULL;
    kiln_dtype dt = yzp ? yzp->dtype : KILN_DTYPE_U8;
    check_quant_type(c, dt, "y_zero_point");
    Value *acc = conv ? conv_integer(c, a, azp, b, bzp, false, NULL)
                      : matmul_integer(c, a, azp, b, bzp, false, NULL);
    /* scales: a's per tensor (per row for a matmul), b's per column or per
     * output channel, y's per tensor */
    int a_axis = conv ? 1 : (a->rank >= 2 ? a->rank - 2 : -1); /* a vector: one row */
    if (conv && vcount(as) != 1)
        node_fail(c, "x_scale must be a scalar");
    check_param(c, a, as, a_axis, 0, conv ? "x_scale" : "a_scale");
    Value *sa = broadcast_param(c, a, as, a_axis, 0);
    int b_axis = conv ? 1 : b->rank >= 2 ? acc->rank - 1 : -1; /* in the result */
    check_param(c, acc, bs, b_axis, 0, conv ? "w_scale" : "b_scale");
    Value *sb = broadcast_param(c, acc, bs, b_axis, 0);
    if (vcount(ys) != 1 || (yzp && vcount(yzp) != 1))
        node_fail(c, "y_scale and y_zero_point must be scalars");
    if (bias) {
        if (bias->dtype != KILN_DTYPE_I32 || bias->rank != 1 || bias->shape[0] != acc->shape[1])
            node_fail(c, format("B must be int32 of shape [%lld]", (long long)acc->shape[1]));
        acc = binary_tmp(c, OP_ADD, acc, broadcast_param(c, acc, bias, 1, 0));
    }
    Value *m = binary_tmp(c, OP_DIV, binary_tmp(c, OP_MUL, sa, sb), cast_to(c, ys, KILN_DTYPE_F32));
    Value *v = binary_tmp(c, OP_MUL, acc, m);
    finish(c, quantize_to(c, v, yzp ? cast_to(c, yzp, KILN_DTYPE_F32) : NULL, dt,
                          out_name(c, 0)));
}
