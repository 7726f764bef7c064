"""test_onnx_quant.py: ONNX quantization ops against numpy.

QuantizeLinear and DequantizeLinear per tensor, per axis and blocked (opset
21), uint8 and int8, output_dtype; a dequantized constant weight (folded at
compile time) feeding a MatMul, and kept as its 8-bit codes where its
layout fits kiln's int8 formats; DynamicQuantizeLinear; MatMulInteger and
ConvInteger with reductions long enough that an f32 sum of their products
would not be exact (kiln cuts them into exact chunks: the results must be
the exact int32 values); QLinearMatMul and QLinearConv with per-channel
scales and a bias; and the refusals. The references are numpy, written
from the ONNX operator descriptions (np.rint rounds half to even, as ONNX
does).
"""
import numpy as np

from pathlib import Path

from harness import check, kiln, registry
from test_onnx import attr, expect_refused, initializer, model, node, run_onnx, value_info

TESTS, case = registry()

ELEM = {np.float32: 1, np.uint8: 2, np.int8: 3, np.int32: 6, np.float16: 10}
RANGE = {np.uint8: (0, 255), np.int8: (-128, 127), np.int32: (-100000, 100000)}


def quantize_ref(x, scale, zp, dt):
    lo, hi = RANGE[dt]
    q = np.rint(x.astype(np.float32) / scale.astype(np.float32))
    return np.clip(q + (zp.astype(np.float32) if zp is not None else 0), lo, hi).astype(dt)


def dequantize_ref(q, scale, zp):
    z = zp.astype(np.float32) if zp is not None else np.float32(0)
    return ((q.astype(np.float32) - z) * scale.astype(np.float32)).astype(np.float32)


def expand_param(p, shape, axis, block):
    """A scale or zero point broadcast to x's shape (per axis or blocked)."""
    if p.size == 1 and not block:
        return p.reshape([1] * len(shape))
    if not block:
        return p.reshape([shape[axis]] + [1] * (len(shape) - axis - 1))
    return np.repeat(p, block, axis=axis).take(range(shape[axis]), axis=axis)


def rand_q(rng, dt, shape):
    lo, hi = RANGE[dt]
    return rng.integers(lo, hi + 1, shape).astype(dt)


def qdq_case(op, dt, shape, pshape, axis=1, block=0, opset=13, zp=True, out_dtype=None):
    def test(workdir):
        rng = np.random.default_rng(7)
        scale = (rng.random(pshape) * 0.05 + 0.01).astype(np.float32)
        z = rand_q(rng, dt, pshape) // 4 if zp else None
        if z is not None:
            z = z.astype(dt)
        attrs = (attr("axis", axis) if axis != 1 else b"") + \
            (attr("block_size", block) if block else b"") + \
            (attr("output_dtype", ELEM[out_dtype]) if out_dtype else b"")
        inits = [initializer("s", scale)] + ([initializer("z", z)] if zp else [])
        ax = axis % len(shape)
        s_full = expand_param(scale, shape, ax, block)
        z_full = expand_param(z, shape, ax, block) if zp else None
        if op == "QuantizeLinear":
            x = (rng.standard_normal(shape) * 3).astype(np.float32)
            # values exactly half-way between two steps round to even
            x.flat[:4] = (np.array([0.5, 1.5, -2.5, 3.5]) * s_full.flat[0]).astype(np.float32)
            q_dt = dt if zp else (out_dtype or np.uint8)
            want, in_elem, out_elem = quantize_ref(x, s_full, z_full, q_dt), 1, ELEM[q_dt]
        else:
            x = rand_q(rng, dt, shape)
            want = dequantize_ref(x, s_full, z_full)
            in_elem, out_elem = ELEM[dt], ELEM[out_dtype or np.float32]
            if out_dtype:
                want = want.astype(out_dtype)
        data = model([node(op, ["x", "s"] + (["z"] if zp else []), ["y"], "q", attrs)],
                     [value_info("x", list(shape), in_elem)],
                     [value_info("y", list(shape), out_elem)], inits, opset=opset)
        tol = (1e-3, 0) if out_dtype == np.float16 else (0, 0)
        run_onnx(workdir, data, [x], [want], ["y"], tol=tol)
    return test


for _args, _kw in [
        (("QuantizeLinear", np.uint8, [6], [1]), dict(opset=10)),
        (("QuantizeLinear", np.int8, [2, 3, 4], [3]), dict()),
        (("QuantizeLinear", np.int8, [3, 5], [5]), dict(axis=-1)),
        (("QuantizeLinear", np.uint8, [2, 10, 3], [2, 3, 3]), dict(block=4, opset=21)),
        (("QuantizeLinear", np.int8, [4, 6], [4]), dict(axis=0, zp=False, out_dtype=np.int8,
                                                         opset=21)),
        (("QuantizeLinear", np.uint8, [7], [1]), dict(zp=False)),
        (("DequantizeLinear", np.uint8, [2, 3, 4], [3]), dict()),
        (("DequantizeLinear", np.int8, [4, 9], [4, 3]), dict(block=3, opset=21)),
        (("DequantizeLinear", np.int8, [5, 4], [1]), dict(zp=False)),
        (("DequantizeLinear", np.int32, [5, 4], [4]), dict(axis=1, zp=False)),
        (("DequantizeLinear", np.uint8, [3, 8], [8]), dict(out_dtype=np.float16, opset=25)),
        # blocked along the only axis: the parameters are 1-D as per-axis ones are
        (("DequantizeLinear", np.int8, [10], [3]), dict(axis=0, block=4, opset=21)),
        (("QuantizeLinear", np.uint8, [10], [3]), dict(axis=0, block=4, opset=21))]:
    case(f"onnx {_args[0]} {_args[1].__name__} x {_args[2]} params {_args[3]} {_kw} matches "
         f"numpy")(qdq_case(*_args, **_kw))


@case("onnx DequantizeLinear of a constant int8 weight (per output channel) folds at "
      "compile time and feeds a MatMul")
def _(workdir):
    rng = np.random.default_rng(3)
    w = rand_q(rng, np.int8, [16, 12])
    s = (rng.random([12]) * 0.02 + 0.001).astype(np.float32)
    z = rand_q(rng, np.int8, [12]) // 8
    x = rng.standard_normal([5, 16]).astype(np.float32)
    nodes = [node("DequantizeLinear", ["w", "s", "z"], ["wd"], "dq", attr("axis", 1)),
             node("MatMul", ["x", "wd"], ["y"], "mm")]
    data = model(nodes, [value_info("x", [5, 16])], [value_info("y", [5, 12])],
                 [initializer("w", w), initializer("s", s), initializer("z", z.astype(np.int8))])
    wd = dequantize_ref(w, s.reshape(1, 12), z.astype(np.int8).reshape(1, 12))
    run_onnx(workdir, data, [x], [x.astype(np.float64) @ wd], ["y"], tol=(1e-5, 1e-5))


@case("onnx DequantizeLinear of a constant 1-D tensor blocked along its axis folds each "
      "block with its own scale")
def _(workdir):
    x = np.arange(-5, 5, dtype=np.int8)
    s = np.array([0.5, 2.0, 0.25], np.float32)
    a = np.random.default_rng(4).standard_normal(10).astype(np.float32)
    data = model([node("DequantizeLinear", ["x", "s"], ["y"], "dq",
                       attr("axis", 0) + attr("block_size", 4)),
                  node("Add", ["y", "a"], ["z"], "add")],
                 [value_info("a", [10])], [value_info("z", [10])],
                 [initializer("x", x), initializer("s", s)], opset=21)
    want = x.astype(np.float32) * np.repeat(s, 4)[:10] + a
    run_onnx(workdir, data, [a], [want], ["z"], tol=(0, 0))


KEPT = [  # name, codes dtype, zero points, weight [rows, cols], axis, block, gemm, kept
    ("int8 per column", np.int8, False, [70, 12], 1, 0, False, True),
    ("uint8 per column, zero points", np.uint8, True, [70, 12], 1, 0, False, True),
    ("int8 per column, zero points", np.int8, True, [40, 9], 1, 0, False, True),
    ("int8 per tensor", np.int8, False, [33, 8], None, 0, False, True),
    ("int8 blocks of 32 along K", np.int8, True, [96, 10], 0, 32, False, True),
    ("int8 blocks of 16 along K (no fit: f32)", np.int8, False, [64, 6], 0, 16, False, False),
    ("Gemm transB, int8 per output row", np.int8, False, [12, 50], 0, 0, True, True),
]


def kept_case(name, dt, zp, wshape, axis, block, gemm, kept):
    """A dequantized constant weight feeding a matmul's B: stored as its own
    8-bit codes (kiln's int8 or int8-asym) where every 32 k of a column
    share one scale and zero point, else as f32; either way the product
    must equal x @ dequantized(w) to f32 accuracy."""
    def test(workdir):
        rng = np.random.default_rng(11)
        K = wshape[1] if gemm else wshape[0]
        if axis is None:
            pshape = []
        elif block:
            pshape = [(wshape[0] + block - 1) // block, wshape[1]]
        else:
            pshape = [wshape[axis]]
        w = rand_q(rng, dt, wshape)
        s = (rng.random(pshape) * 0.02 + 0.001).astype(np.float32)
        z = (rand_q(rng, dt, pshape) // 8).astype(dt) if zp else None
        x = rng.standard_normal([5, K]).astype(np.float32)
        attrs = (attr("axis", axis) if axis is not None else b"") + \
            (attr("block_size", block) if block else b"")
        inits = [initializer("w", w), initializer("s", s)] + ([initializer("z", z)] if zp else [])
        mm = node("Gemm", ["x", "wd"], ["y"], "mm", attr("transB", 1)) if gemm else \
            node("MatMul", ["x", "wd"], ["y"], "mm")
        nodes = [node("DequantizeLinear", ["w", "s"] + (["z"] if zp else []), ["wd"], "dq",
                      attrs), mm]
        N = wshape[0] if gemm else wshape[1]
        data = model(nodes, [value_info("x", [5, K])], [value_info("y", [5, N])], inits,
                     opset=21 if block else 13)
        full_s = expand_param(s, wshape, axis or 0, block) if axis is not None else s
        full_z = None if z is None else (expand_param(z, wshape, axis or 0, block)
                                         if axis is not None else z)
        wd = dequantize_ref(w, full_s, full_z)
        want = x.astype(np.float64) @ (wd.T if gemm else wd).astype(np.float64)
        run_onnx(workdir, data, [x], [want], ["y"], tol=(1e-5, 1e-5))
        r = kiln("compile", Path(workdir) / "m.onnx", "-o", Path(workdir) / "v.c", "-v")
        said = "1 dequantized matmul weights kept as their 8-bit codes" in r.stderr
        check(r.returncode == 0 and said == kept,
              f"expected the codes {'kept' if kept else 'not kept'}:\n{r.stderr[-2000:]}")
    return test


for _c in KEPT:
    case(f"onnx DequantizeLinear weight of a MatMul keeps its codes: {_c[0]}")(kept_case(*_c))


@case("onnx DynamicQuantizeLinear: scale, zero point and uint8 values match numpy")
def _(workdir):
    for k, shape in enumerate([[3, 5], [40]]):
        rng = np.random.default_rng(11 + k)
        x = (rng.standard_normal(shape) * 2 + (0.7 if k else -0.4)).astype(np.float32)
        lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
        scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255))
        zp = np.uint8(np.rint(np.clip(np.float32(0) - np.float32(lo) / scale, 0, 255)))
        y = np.clip(np.rint(x / scale) + np.float32(zp), 0, 255).astype(np.uint8)
        data = model([node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], "dq")],
                     [value_info("x", shape)],
                     [value_info("y", shape, 2), value_info("s", []), value_info("z", [], 2)],
                     opset=11)
        run_onnx(workdir, data, [x], [y, np.array(scale), np.array(zp)], ["y", "s", "z"],
                 tol=(1e-6, 0))


def int_matmul_ref(a, azp, b, bzp):
    a64 = a.astype(np.int64) - (azp.astype(np.int64).reshape(-1, 1) if azp is not None else 0)
    b64 = b.astype(np.int64) - (bzp.astype(np.int64) if bzp is not None else 0)
    return np.matmul(a64, b64)


@case("onnx MatMulInteger with K = 600 (sums past 2^24: kiln cuts K into exact f32 chunks) "
      "and per-row and per-column zero points is exact in int32")
def _(workdir):
    rng = np.random.default_rng(5)
    for k, (ashape, adt, bdt) in enumerate([([7, 600], np.uint8, np.int8),
                                            ([2, 3, 600], np.int8, np.int8)]):
        # large products of one sign, so that the sums pass 2^24
        a = (rng.integers(100, 128, ashape) * (2 if adt == np.uint8 else 1)).astype(adt)
        b = rng.integers(100, 128, [600, 5]).astype(bdt)
        azp = rng.integers(-20 if adt == np.int8 else 0, 10, [ashape[-2]]).astype(adt)
        bzp = rng.integers(-128, -90, [5]).astype(bdt)
        want = int_matmul_ref(a, azp, b, bzp).astype(np.int32)
        check(np.abs(want).max() > 2 ** 24 and (want % 2).any(),
              "the case does not reach past f32's exact range")
        out = ashape[:-1] + [5]
        data = model([node("MatMulInteger", ["a", "b", "az", "bz"], ["y"], "mmi")],
                     [value_info("a", ashape, ELEM[adt]), value_info("b", [600, 5], ELEM[bdt]),
                      value_info("az", [ashape[-2]], ELEM[adt]),
                      value_info("bz", [5], ELEM[bdt])],
                     [value_info("y", out, 6)], opset=10)
        run_onnx(workdir, data, [a, b, azp, bzp], [want], ["y"], tol=(0, 0))


def conv2d_ref(x, w, pad):
    """A direct NCHW convolution in int64 (stride 1, zero padding)."""
    x = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    n, cin, h, wd = x.shape
    m, _, kh, kw = w.shape
    oh, ow = h - kh + 1, wd - kw + 1
    out = np.zeros([n, m, oh, ow], np.int64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,mc->nmhw", x[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    return out


@case("onnx ConvInteger with 40 channels of 3x3 (360 products a sum, past f32's exact "
      "range: cut by channels) and per-channel weight zero points is exact in int32")
def _(workdir):
    rng = np.random.default_rng(9)
    # large products of one sign, so that the sums pass 2^24
    x = rng.integers(220, 256, [1, 40, 6, 6]).astype(np.uint8)
    w = rng.integers(220, 256, [4, 40, 3, 3]).astype(np.uint8)
    xzp, wzp = np.array(3, np.uint8), rng.integers(0, 10, [4]).astype(np.uint8)
    want = conv2d_ref(x.astype(np.int64) - 3,
                      w.astype(np.int64) - wzp.astype(np.int64).reshape(4, 1, 1, 1), 1)
    check(want.max() > 2 ** 24 and (want % 2).any(), "the case stays in f32's exact range")
    data = model([node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], "ci", attr("pads", [1] * 4))],
                 [value_info("x", [1, 40, 6, 6], 2), value_info("w", [4, 40, 3, 3], 2)],
                 [value_info("y", [1, 4, 6, 6], 6)],
                 [initializer("xz", xzp), initializer("wz", wzp)], opset=10)
    run_onnx(workdir, data, [x, w], [want.astype(np.int32)], ["y"], tol=(0, 0))


@case("onnx QLinearConv (int8 weights, per-channel scales, int32 bias) and QLinearMatMul "
      "match numpy within one quantization step")
def _(workdir):
    rng = np.random.default_rng(13)
    x, w = rand_q(rng, np.uint8, [1, 6, 5, 5]), rand_q(rng, np.int8, [3, 6, 3, 3])
    xs, xz = np.array(0.02, np.float32), np.array(120, np.uint8)
    ws = (rng.random([3]) * 0.01 + 0.002).astype(np.float32)
    wz = np.zeros([3], np.int8)
    ys, yz = np.array(0.5, np.float32), np.array(128, np.uint8)
    bias = rng.integers(-2000, 2000, [3]).astype(np.int32)
    acc = conv2d_ref(x.astype(np.int64) - 120, w.astype(np.int64), 0) + bias.reshape(1, 3, 1, 1)
    real = acc * (xs.astype(np.float64) * ws.reshape(1, 3, 1, 1) / ys)
    want = np.clip(np.rint(real) + 128, 0, 255).astype(np.uint8)
    check(len(np.unique(want)) > 20, "the conv's outputs are saturated")
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"]
    data = model([node("QLinearConv", names, ["y"], "qc")],
                 [value_info("x", [1, 6, 5, 5], 2)], [value_info("y", [1, 3, 3, 3], 2)],
                 [initializer(n, v) for n, v in zip(names[1:],
                                                    [xs, xz, w, ws, wz, ys, yz, bias])], opset=10)
    run_onnx(workdir, data, [x], [want], ["y"], tol=(0, 1))
    a, b = rand_q(rng, np.uint8, [4, 300]), rand_q(rng, np.uint8, [300, 6])
    az, bz = np.array([100], np.uint8), np.array([130], np.uint8)
    a_s, b_s, y_s = (np.array([v], np.float32) for v in (0.01, 0.02, 2.0))
    real = int_matmul_ref(a, None, b, None) - 100 * b.astype(np.int64).sum(0) \
        - 130 * a.astype(np.int64).sum(1, keepdims=True) + 300 * 100 * 130
    want = np.clip(np.rint(real * (0.01 * 0.02 / 2.0)) + 7, 0, 255).astype(np.uint8)
    check(len(np.unique(want)) > 5, "the matmul's outputs are saturated")
    names = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    data = model([node("QLinearMatMul", names, ["y"], "qm")],
                 [value_info("a", [4, 300], 2), value_info("b", [300, 6], 2)],
                 [value_info("y", [4, 6], 2)],
                 [initializer(n, v) for n, v in zip(["as", "az", "bs", "bz", "ys", "yz"],
                                                    [a_s, az, b_s, bz, y_s,
                                                     np.array([7], np.uint8)])], opset=10)
    run_onnx(workdir, data, [a, b], [want], ["y"], tol=(0, 1))


@case("onnx quantization: a precision other than float, an output_dtype kiln does not "
      "quantize to, a blocked scale of the wrong shape and per-axis scales before opset 13 are "
      "refused by name")
def _(workdir):
    s4, z4 = initializer("s", np.ones([4], np.float32)), initializer("z", np.zeros([4], np.uint8))
    x = [value_info("x", [2, 4])]
    y = [value_info("y", [2, 4], 2)]

    def q(attrs=b"", opset=21, inits=(s4, z4), ins=("x", "s", "z")):
        return model([node("QuantizeLinear", list(ins), ["y"], "q", attrs)], x, y, list(inits),
                     opset=opset)
    expect_refused(workdir, q(attr("precision", 10), opset=25),
                   ["node 'q (QuantizeLinear)'", "unsupported: precision FLOAT16"])
    expect_refused(workdir, q(attr("output_dtype", 5), inits=[s4], ins=("x", "s")),
                   ["node 'q (QuantizeLinear)'", "unsupported: output_dtype INT16"])
    expect_refused(workdir, q(attr("block_size", 3) + attr("axis", 1),
                              inits=[initializer("s", np.ones([2, 1], np.float32))],
                              ins=("x", "s")),
                   ["node 'q (QuantizeLinear)'", "for blocks of 3 along axis 1"])
    expect_refused(workdir, q(opset=10), ["node 'q (QuantizeLinear)'",
                                          "must be a scalar before opset 13"])
    dq = model([node("DequantizeLinear", ["x", "s", "z"], ["y"], "dq")],
               [value_info("x", [2, 4], 2)], [value_info("y", [2, 4])],
               [initializer("s", np.ones([4], np.float32)), initializer("z", np.zeros([4], np.int8))])
    expect_refused(workdir, dq, ["node 'dq (DequantizeLinear)'", "x_zero_point is i8 and x u8"])
