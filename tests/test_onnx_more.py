"""test_onnx_more.py: ONNX ops kiln maps by decomposition, against numpy:
EyeLike (a constant), LRN (an average pool over the channels),
MeanVarianceNormalization (means over its axes), ReverseSequence (a
Gather of rows; lengths constant or not), AffineGrid (a constant table
times theta) with GridSample (kiln's grid_sample); and ConvNeXt's block
structure, where three transpose fusions compose. The references are
written from the ONNX operator descriptions.
"""
import json
from pathlib import Path

import numpy as np

import reference as ref
from harness import check, kiln, registry
from test_onnx import (attr, branch, expect_refused, initializer, model, node, run_onnx,
                       value_info)

TESTS, case = registry()


@case("onnx EyeLike (k = -1, int32, and k = 2 of a float input) feeding Adds matches numpy")
def _(workdir):
    rng = np.random.default_rng(1)
    a = rng.integers(-5, 5, [4, 6]).astype(np.int32)
    b = rng.standard_normal([3, 5]).astype(np.float32)
    nodes = [node("EyeLike", ["a"], ["ea"], "e1", attr("k", -1)),
             node("Add", ["ea", "a"], ["ya"], "add1"),
             node("EyeLike", ["b"], ["eb"], "e2", attr("k", 2)),
             node("Add", ["eb", "b"], ["yb"], "add2")]
    data = model(nodes, [value_info("a", [4, 6], 6), value_info("b", [3, 5])],
                 [value_info("ya", [4, 6], 6), value_info("yb", [3, 5])])
    run_onnx(workdir, data, [a, b], [np.eye(4, 6, -1, np.int32) + a, np.eye(3, 5, 2, np.float32) + b],
             ["ya", "yb"], tol=(0, 0))


def lrn_ref(x, size, alpha, beta, bias):
    sq = x.astype(np.float64) ** 2
    c = x.shape[1]
    s = np.zeros_like(sq)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + size // 2)
        s[:, ch] = sq[:, lo:hi + 1].sum(1)
    return x / (bias + alpha / size * s) ** beta


@case("onnx LRN of sizes 4 and 5 on 3-D and 5-D inputs matches numpy")
def _(workdir):
    rng = np.random.default_rng(2)
    for shape, size in (([2, 7, 9], 4), ([1, 6, 2, 3, 4], 5)):
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        attrs = attr("size", size) + attr("alpha", 0.02) + attr("beta", 0.6) + attr("bias", 1.5)
        data = model([node("LRN", ["x"], ["y"], "lrn", attrs)], [value_info("x", shape)],
                     [value_info("y", shape)])
        run_onnx(workdir, data, [x], [lrn_ref(x, size, 0.02, 0.6, 1.5)], ["y"])


@case("onnx MeanVarianceNormalization over axes [0, 2, 3] (default) and [1] matches numpy")
def _(workdir):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal([2, 3, 4, 5]) * 2 + 1).astype(np.float32)
    for axes in (None, [1]):
        ax = tuple(axes or [0, 2, 3])
        m = x.astype(np.float64).mean(ax, keepdims=True)
        want = (x - m) / (np.sqrt((x.astype(np.float64) ** 2).mean(ax, keepdims=True) - m * m)
                          + 1e-9)
        data = model([node("MeanVarianceNormalization", ["x"], ["y"], "mvn",
                           attr("axes", axes) if axes else b"")],
                     [value_info("x", [2, 3, 4, 5])], [value_info("y", [2, 3, 4, 5])])
        run_onnx(workdir, data, [x], [want], ["y"])


def reverse_ref(x, lens, time_axis):
    y = x.copy()
    for b, n in enumerate(lens):
        if time_axis == 0:
            y[:n, b] = x[:n, b][::-1]
        else:
            y[b, :n] = x[b, :n][::-1]
    return y


@case("onnx ReverseSequence (time first and batch first, lengths constant and not, "
      "trailing dimensions) matches numpy")
def _(workdir):
    rng = np.random.default_rng(4)
    for time_axis, const in ((0, True), (1, True), (0, False), (1, False)):
        shape = [5, 3, 2] if time_axis == 0 else [3, 5, 2]
        x = rng.standard_normal(shape).astype(np.float32)
        lens = np.array([5, 0, 3], np.int64)
        attrs = attr("time_axis", time_axis) + attr("batch_axis", 1 - time_axis)
        inputs = [value_info("x", shape)] + ([] if const else [value_info("l", [3], 7)])
        data = model([node("ReverseSequence", ["x", "l"], ["y"], "rs", attrs)], inputs,
                     [value_info("y", shape)], [initializer("l", lens)] if const else [])
        run_onnx(workdir, data, [x] + ([] if const else [lens]),
                 [reverse_ref(x, lens, time_axis)], ["y"], tol=(0, 0))


@case("onnx LRN without size, EyeLike of a 3-D input and ReverseSequence with a length past "
      "the time axis are refused by name")
def _(workdir):
    x = [value_info("x", [2, 3, 4])]
    y = [value_info("y", [2, 3, 4])]
    expect_refused(workdir, model([node("LRN", ["x"], ["y"], "lrn")], x, y),
                   ["node 'lrn (LRN)'", "size must be given"])
    expect_refused(workdir, model([node("EyeLike", ["x"], ["y"], "eye")], x, y),
                   ["node 'eye (EyeLike)'", "expected 2-D"])
    expect_refused(workdir, model([node("ReverseSequence", ["x", "l"], ["y"], "rs")], x, y,
                                  [initializer("l", np.array([1, 9, 1], np.int64))]),
                   ["node 'rs (ReverseSequence)'", "sequence_lens[1] is 9"])


def affine_grid_ref(theta, size, align):
    """ONNX AffineGrid: each output position's normalized (x, y[, z], 1)
    times theta transposed."""
    axes = []
    for n in size[2:]:
        i = np.arange(n, dtype=np.float64)
        axes.append((-1 + 2 * i / (n - 1) if n > 1 else np.full(1, -1.0)) if align
                    else (2 * i + 1) / n - 1)
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([m.reshape(-1) for m in mesh[::-1]] + [np.ones(mesh[0].size)], 1)
    grid = np.einsum("pk,nrk->npr", base, theta.astype(np.float64))
    return grid.reshape([size[0], *size[2:], len(size) - 2])


@case("onnx AffineGrid 20 feeding GridSample 20 (a spatial transformer: 2-D and 3-D, "
      "theta computed at run time, align_corners 0 and 1) matches numpy")
def _(workdir):
    rng = np.random.default_rng(5)
    for size, align, mode, pad in (([2, 3, 5, 6], 0, "linear", "zeros"),
                                   ([1, 2, 4, 7], 1, "cubic", "border"),
                                   ([2, 2, 3, 4, 5], 0, "linear", "reflection"),
                                   ([1, 1, 3, 3, 4], 1, "nearest", "zeros")):
        r = len(size) - 2
        x = rng.standard_normal(size).astype(np.float32)
        t = (np.concatenate([np.eye(r), np.zeros([r, 1])], 1) +
             rng.uniform(-0.4, 0.4, [size[0], r, r + 1])).astype(np.float32)
        grid = affine_grid_ref(t, size, align)
        want = ref.grid_sample(x, grid.astype(np.float32), mode, pad, bool(align))
        nodes = [node("Mul", ["t", "one"], ["theta"], "m"),  # theta is computed
                 node("AffineGrid", ["theta", "size"], ["grid"], "ag", attr("align_corners", align)),
                 node("GridSample", ["x", "grid"], ["y"], "gs",
                      attr("mode", mode) + attr("padding_mode", pad) +
                      attr("align_corners", align))]
        data = model(nodes, [value_info("x", size), value_info("t", [size[0], r, r + 1])],
                     [value_info("grid", list(grid.shape)), value_info("y", list(want.shape))],
                     [initializer("size", np.array(size, np.int64)),
                      initializer("one", np.ones(1, np.float32))], opset=20)
        run_onnx(workdir, data, [x, t], [grid, want], ["grid", "y"])


@case("onnx GridSample 16 names its modes bilinear and bicubic; the other version's names, "
      "a 5-D input at 16 and AffineGrid's wrong theta are refused by name")
def _(workdir):
    rng = np.random.default_rng(6)
    x = rng.standard_normal([1, 2, 4, 5]).astype(np.float32)
    g = rng.uniform(-1.2, 1.2, [1, 3, 4, 2]).astype(np.float32)

    def gs(mode, opset, xs=(1, 2, 4, 5), gshape=(1, 3, 4, 2)):
        return model([node("GridSample", ["x", "g"], ["y"], "gs", attr("mode", mode))],
                     [value_info("x", list(xs)), value_info("g", list(gshape))],
                     [value_info("y", [1, 2, *gshape[1:-1]])], opset=opset)
    for mode in ("bilinear", "bicubic", "nearest"):
        want = ref.grid_sample(x, g, mode.replace("bi", "").replace("cucic", "cubic"))
        run_onnx(workdir, gs(mode, 16), [x, g], [want], ["y"])
    expect_refused(workdir, gs("cubic", 16), ["node 'gs (GridSample)'", "unsupported: mode cubic",
                                             "GridSample 16 takes nearest, bilinear or bicubic"])
    expect_refused(workdir, gs("bilinear", 20), ["unsupported: mode bilinear",
                                                "GridSample 20 takes nearest, linear or cubic"])
    expect_refused(workdir, gs("bilinear", 16, (1, 2, 3, 4, 5), (1, 2, 2, 2, 3)),
                   ["GridSample version 16 needs X of rank 4"])
    expect_refused(workdir, model([node("AffineGrid", ["t", "size"], ["y"], "ag")],
                                  [value_info("t", [1, 3, 3])], [value_info("y", [1, 4, 5, 2])],
                                  [initializer("size", np.array([1, 2, 4, 5], np.int64))],
                                  opset=20),
                   ["node 'ag (AffineGrid)'", "theta must be f32 [1, 2, 3]"])


def max_unpool_ref(x, idx, shape, out_shape=None):
    """ONNX MaxUnpool: x scattered to idx's flat positions in zeros of
    shape, then (output_shape) placed at the start of a larger zero tensor."""
    y = np.zeros(int(np.prod(shape)), np.float32)
    y[idx.reshape(-1)] = x.reshape(-1)
    y = y.reshape(shape)
    if out_shape is None:
        return y
    big = np.zeros(out_shape, np.float32)
    big[tuple(slice(n) for n in shape)] = y
    return big


@case("onnx MaxPool's indices (both storage orders) feeding MaxUnpool (pads; output_shape) "
      "matches numpy")
def _(workdir):
    rng = np.random.default_rng(7)
    for xs, order, pads, out_shape in (([2, 3, 6, 8], 0, [0, 0, 0, 0], None),
                                       ([2, 3, 7, 6], 1, [1, 0, 0, 0], None),
                                       ([2, 3, 6, 6], 0, [0, 0, 0, 0], [2, 3, 9, 7])):
        x = rng.integers(-5, 6, xs).astype(np.float32)
        pool = ref.pool(x, [2, 2], "max", [2, 2], pads).astype(np.float32)
        idx = ref.max_pool_indices(x, [2, 2], [2, 2], pads, column_major=order)
        shape = [2, 3] + [(pool.shape[2 + i] - 1) * 2 + 2 - (0 if out_shape else
                                                             pads[i] + pads[2 + i])
                          for i in range(2)]
        geom = attr("kernel_shape", [2, 2]) + attr("strides", [2, 2]) + attr("pads", pads)
        unpool_in = ["y", "i"] + (["os"] if out_shape else [])
        nodes = [node("MaxPool", ["x"], ["y", "i"], "mp", geom + attr("storage_order", order)),
                 node("MaxUnpool", unpool_in, ["u"], "mu", geom)]
        inits = [initializer("os", np.array(out_shape, np.int64))] if out_shape else []
        # column-major indices name other positions: MaxUnpool scatters them as given
        want_u = max_unpool_ref(pool, idx, shape, out_shape)
        data = model(nodes, [value_info("x", list(x.shape))],
                     [value_info("y", list(pool.shape)), value_info("i", list(pool.shape), 7),
                      value_info("u", list(want_u.shape))], inits, opset=12)
        run_onnx(workdir, data, [x], [pool, idx, want_u], ["y", "i", "u"], tol=(0, 0))


@case("onnx NonMaxSuppression (run-time rows: '<output>.count' added after the graph's "
      "outputs, -1 rows after the selection) matches numpy; max_output_boxes_per_class 0 "
      "and a run-time threshold are refused")
def _(workdir):
    rng = np.random.default_rng(8)
    B, C, N, most = 2, 3, 50, 30
    lo = rng.uniform(0, 4, [B, N, 2])
    boxes = np.concatenate([lo, lo + rng.uniform(0.5, 3, [B, N, 2])], 2).astype(np.float32)
    scores = rng.random([B, C, N]).astype(np.float32)
    want = ref.nms(boxes, scores, most, 0.4, 0.3)
    padded = np.full([B * C * most, 3], -1, np.int64)
    padded[:len(want)] = want
    inits = [initializer("most", np.array([most], np.int64)),
             initializer("iou", np.array([0.4], np.float32)),
             initializer("thr", np.array([0.3], np.float32))]
    ins = [value_info("boxes", [B, N, 4]), value_info("scores", [B, C, N])]
    data = model([node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "thr"], ["sel"],
                       "nms")], ins, [value_info("sel", ["selected", 3], 7)], inits, opset=11)
    run_onnx(workdir, data, [boxes, scores], [padded, np.array([len(want)], np.int64)],
             ["sel", "sel.count"], tol=(0, 0))
    check(0 < len(want) < B * C * most, f"{len(want)} rows: the test selects none or all")
    expect_refused(workdir, model([node("NonMaxSuppression", ["boxes", "scores"], ["sel"],
                                        "nms")], ins, [value_info("sel", ["s", 3], 7)],
                                  opset=11),
                   ["node 'nms (NonMaxSuppression)'", "max_output_boxes_per_class 0"])
    expect_refused(workdir, model([node("NonMaxSuppression", ["boxes", "scores", "most", "t"],
                                        ["sel"], "nms")],
                                  ins + [value_info("t", [1])], [value_info("sel", ["s", 3], 7)],
                                  inits[:1], opset=11),
                   ["node 'nms (NonMaxSuppression)'", "iou_threshold (input 3, 't') must be a "
                    "constant"])


@case("onnx a node computing with NonMaxSuppression's rows (known only at run time) is refused")
def _(workdir):
    inits = [initializer("most", np.array([4], np.int64))]
    data = model([node("NonMaxSuppression", ["boxes", "scores", "most"], ["sel"], "nms"),
                  node("Cast", ["sel"], ["y"], "use", attr("to", 1))],
                 [value_info("boxes", [1, 8, 4]), value_info("scores", [1, 2, 8])],
                 [value_info("y", ["s", 3])], inits, opset=11)
    expect_refused(workdir, data, ["node 'use (Cast)'", "computes with 'sel'",
                                   "known only at run time"])


@case("onnx RoiAlign 10 (regions as output_half_pixel) and 16 (half_pixel by default) match "
      "numpy")
def _(workdir):
    rng = np.random.default_rng(9)
    x = rng.standard_normal([2, 3, 12, 10]).astype(np.float32)
    rois = np.array([[1, 1, 6, 8], [0.5, 2, 9.5, 11], [-2, -1, 4, 3]], np.float32)
    batch = np.array([1, 0, 1], np.int64)
    for opset, half in ((10, False), (16, True)):
        want = ref.roi_align(x, rois, batch, 3, 2, 0, 0.75, "avg", half)
        attrs = attr("output_height", 3) + attr("output_width", 2) + attr("spatial_scale", 0.75)
        data = model([node("RoiAlign", ["x", "rois", "b"], ["y"], "ra", attrs)],
                     [value_info("x", [2, 3, 12, 10]), value_info("rois", [3, 4]),
                      value_info("b", [3], 7)], [value_info("y", [3, 3, 3, 2])], opset=opset)
        run_onnx(workdir, data, [x, rois, batch], [want], ["y"])


@case("onnx BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot (int32, int8) and BitShift (uint8) "
      "match numpy; a BitShift of int32 is refused before version 28 and matches Python's "
      "integers at 28")
def _(workdir):
    rng = np.random.default_rng(10)
    for dt, elem in ((np.int32, 6), (np.int8, 3)):
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, [4, 9]).astype(dt)
        b = rng.integers(info.min, info.max, [9]).astype(dt)
        nodes = [node("BitwiseAnd", ["a", "b"], ["y1"], "and"),
                 node("BitwiseOr", ["a", "b"], ["y2"], "or"),
                 node("BitwiseXor", ["a", "b"], ["y3"], "xor"),
                 node("BitwiseNot", ["a"], ["y4"], "not")]
        outs = ["y1", "y2", "y3", "y4"]
        data = model(nodes, [value_info("a", [4, 9], elem), value_info("b", [9], elem)],
                     [value_info(o, [4, 9], elem) for o in outs], opset=18)
        run_onnx(workdir, data, [a, b], [a & b, a | b, a ^ b, ~a], outs, tol=(0, 0))
    a = rng.integers(0, 256, [3, 8]).astype(np.uint8)
    s = rng.integers(0, 8, [8]).astype(np.uint8)
    data = model([node("BitShift", ["a", "s"], ["l"], "sl", attr("direction", "LEFT")),
                  node("BitShift", ["a", "s"], ["r"], "sr", attr("direction", "RIGHT"))],
                 [value_info("a", [3, 8], 2), value_info("s", [8], 2)],
                 [value_info("l", [3, 8], 2), value_info("r", [3, 8], 2)], opset=18)
    run_onnx(workdir, data, [a, s], [a << s, a >> s], ["l", "r"], tol=(0, 0))
    expect_refused(workdir, model([node("BitShift", ["a", "a"], ["l"], "sl",
                                        attr("direction", "LEFT"))],
                                  [value_info("a", [3], 6)], [value_info("l", [3], 6)],
                                  opset=18),
                   ["node 'sl (BitShift)'", "BitShift 11 shifts unsigned integers, not i32"])
    a = rng.integers(-2**31, 2**31 - 1, [3, 8]).astype(np.int32)
    s = rng.integers(-2, 36, [8]).astype(np.int32)
    sb = np.broadcast_to(s, a.shape)
    ok = (sb >= 0) & (sb < 32)
    wide = a.astype(np.int64)
    left = np.where(ok, ((wide << np.where(ok, sb, 0)) & 0xFFFFFFFF), 0)
    left = np.where(left >= 2**31, left - 2**32, left).astype(np.int32)
    right = np.where(ok, wide >> np.where(ok, sb, 0), np.where(a < 0, -1, 0)).astype(np.int32)
    data = model([node("BitShift", ["a", "s"], ["l"], "sl", attr("direction", "LEFT")),
                  node("BitShift", ["a", "s"], ["r"], "sr", attr("direction", "RIGHT"))],
                 [value_info("a", [3, 8], 6), value_info("s", [8], 6)],
                 [value_info("l", [3, 8], 6), value_info("r", [3, 8], 6)], opset=28)
    run_onnx(workdir, data, [a, s], [left, right], ["l", "r"], tol=(0, 0))


@case("onnx Dropout in training mode with ratio 0 passes x and an all-true mask; with ratio "
      "0.3 it is refused by name")
def _(workdir):
    x = np.random.default_rng(11).standard_normal([3, 4]).astype(np.float32)

    def drop(ratio):
        return model([node("Dropout", ["x", "r", "t"], ["y", "m"], "d")],
                     [value_info("x", [3, 4])],
                     [value_info("y", [3, 4]), value_info("m", [3, 4], 9)],
                     [initializer("r", np.array(ratio, np.float32)),
                      initializer("t", np.array(True))], opset=13)
    run_onnx(workdir, drop(0.0), [x], [x, np.ones([3, 4], bool)], ["y", "m"], tol=(0, 0))
    expect_refused(workdir, drop(0.3), ["node 'd (Dropout)'", "training mode with ratio 0.3"])


def body(nodes, inputs, outputs, inits=()):
    """A Loop's or Scan's body attribute."""
    return branch("body", nodes, outputs, inits, inputs)


@case("onnx Loop with a constant trip count unrolled (a run-time state, an outer input read "
      "by the iteration number, a scan output; a condition that folds ends it early) matches "
      "numpy; a condition computed at run time is refused")
def _(workdir):
    rng = np.random.default_rng(12)
    x = rng.standard_normal([6, 3]).astype(np.float32)
    y0 = rng.standard_normal([3]).astype(np.float32)
    b = body([node("Unsqueeze", ["i", "zero"], ["at"], "u"),
              node("Add", ["at", "one"], ["end"], "e"),
              node("Slice", ["x", "at", "end"], ["row"], "s"),
              node("Reshape", ["row", "three"], ["r3"], "r"),
              node("Mul", ["y", "half"], ["yh"], "m"),
              node("Add", ["yh", "r3"], ["y2"], "a"),
              node("Less", ["i", "stop"], ["c2"], "lt"),
              node("Identity", ["y2"], ["scan"], "id")],
             [value_info("i", [], 7), value_info("c", [], 9), value_info("y", [3])],
             [value_info("c2", [], 9), value_info("y2", [3]), value_info("scan", [3])],
             [initializer("zero", np.array([0], np.int64)),
              initializer("one", np.array([1], np.int64)),
              initializer("three", np.array([3], np.int64)),
              initializer("half", np.array(0.5, np.float32))])
    for trips, stop in ((4, 100), (10, 2)):  # 4 steps; 10 allowed, the condition stops at 3
        steps = min(trips, stop + 1)
        ys, y = [], y0.astype(np.float64)
        for i in range(steps):
            y = y * 0.5 + x[i]
            ys.append(y)
        data = model([node("Loop", ["m", "", "y0"], ["yf", "ys"], "loop", b)],
                     [value_info("x", [6, 3]), value_info("y0", [3])],
                     [value_info("yf", [3]), value_info("ys", [steps, 3])],
                     [initializer("m", np.array(trips, np.int64)),
                      initializer("stop", np.array(stop, np.int64))], opset=13)
        run_onnx(workdir, data, [x, y0], [y, np.stack(ys)], ["yf", "ys"])
    runtime = body([node("ReduceSum", ["y"], ["s"], "rs", attr("keepdims", 0)),
                    node("Greater", ["s", "zf"], ["c2"], "gt"),
                    node("Identity", ["y"], ["y2"], "id")],
                   [value_info("i", [], 7), value_info("c", [], 9), value_info("y", [3])],
                   [value_info("c2", [], 9), value_info("y2", [3])],
                   [initializer("zf", np.array(0, np.float32))])
    expect_refused(workdir, model([node("Loop", ["m", "", "y0"], ["yf"], "loop", runtime)],
                                  [value_info("y0", [3])], [value_info("yf", [3])],
                                  [initializer("m", np.array(3, np.int64))], opset=13),
                   ["node 'loop (Loop)'", "condition is computed at run time"])


@case("onnx Scan 11 unrolled (two scan inputs, one read in reverse along axis 1; a state; "
      "a scan output stacked along axis 1) matches numpy; Scan 8 is refused")
def _(workdir):
    rng = np.random.default_rng(13)
    a = rng.standard_normal([5, 2]).astype(np.float32)
    bq = rng.standard_normal([2, 5]).astype(np.float32)
    s0 = rng.standard_normal([2]).astype(np.float32)
    b = body([node("Add", ["s", "ai"], ["t"], "add"), node("Mul", ["t", "bi"], ["s2"], "mul"),
              node("Sub", ["s2", "ai"], ["out"], "sub")],
             [value_info("s", [2]), value_info("ai", [2]), value_info("bi", [2])],
             [value_info("s2", [2]), value_info("out", [2])])
    attrs = (b + attr("num_scan_inputs", 2) + attr("scan_input_axes", [0, 1]) +
             attr("scan_input_directions", [0, 1]) + attr("scan_output_axes", [1]))
    s, outs = s0.astype(np.float64), []
    for t in range(5):
        s = (s + a[t]) * bq[:, 4 - t]
        outs.append(s - a[t])
    data = model([node("Scan", ["s0", "a", "b"], ["sf", "o"], "scan", attrs)],
                 [value_info("s0", [2]), value_info("a", [5, 2]), value_info("b", [2, 5])],
                 [value_info("sf", [2]), value_info("o", [2, 5])], opset=11)
    run_onnx(workdir, data, [s0, a, bq], [s, np.stack(outs, 1)], ["sf", "o"])
    expect_refused(workdir, model([node("Scan", ["", "s0", "a"], ["sf", "o"], "scan",
                                        b + attr("num_scan_inputs", 1))],
                                  [value_info("s0", [1, 2]), value_info("a", [1, 5, 2])],
                                  [value_info("sf", [1, 2]), value_info("o", [1, 5, 2])],
                                  opset=8),
                   ["node 'scan (Scan)'", "Scan version 8"])


@case("onnx Flatten at opsets 13, 21 and 25 (default axis 1, axes 3 and -1) flattens where "
      "its axis says (a DFT rule once gave it axis -2 from opset 20 on)")
def _(workdir):
    x = np.random.default_rng(14).standard_normal([2, 3, 4, 5]).astype(np.float32)
    for opset in (13, 21, 25):
        for axis in (None, 3, -1):
            a = 1 if axis is None else axis % 4
            shape = [int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:]))]
            data = model([node("Flatten", ["x"], ["y"], "f",
                               attr("axis", axis) if axis is not None else b"")],
                         [value_info("x", [2, 3, 4, 5])], [value_info("y", shape)], opset=opset)
            run_onnx(workdir, data, [x], [x.reshape(shape)], ["y"], tol=(0, 0))


def lp_pool_ref(x, k, p, strides, pads):
    """LpPool over [N, C, H, W]: (sum of |x|^p over each window)^(1/p), the
    padding adding nothing."""
    xp = np.pad(np.abs(x.astype(np.float64)) ** p,
                ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (xp.shape[2] - k[0]) // strides[0] + 1
    ow = (xp.shape[3] - k[1]) // strides[1] + 1
    y = np.zeros(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            y[:, :, i, j] = xp[:, :, i * strides[0]:i * strides[0] + k[0],
                               j * strides[1]:j * strides[1] + k[1]].sum(axis=(2, 3))
    return y ** (1.0 / p)


@case("onnx LpPool 1 (a float p) and 11 (an int p of 3, strides, pads) match numpy; "
      "LpPool 1's fractional p is refused by name")
def _(workdir):
    x = np.random.default_rng(21).standard_normal([2, 3, 7, 6]).astype(np.float32)
    for opset, p, pattr, strides, pads in ((1, 2, attr("p", 2.0), [1, 1], [0, 0, 0, 0]),
                                           (11, 3, attr("p", 3), [2, 1], [1, 0, 1, 2])):
        want = lp_pool_ref(x, [3, 2], p, strides, pads)
        attrs = pattr + attr("kernel_shape", [3, 2]) + attr("strides", strides) + \
            attr("pads", pads)
        data = model([node("LpPool", ["x"], ["y"], "lp", attrs)],
                     [value_info("x", list(x.shape))], [value_info("y", list(want.shape))],
                     opset=opset)
        run_onnx(workdir, data, [x], [want], ["y"], tol=(1e-5, 1e-6))
    bad = model([node("LpPool", ["x"], ["y"], "lp", attr("p", 2.5) + attr("kernel_shape", [3, 2]))],
                [value_info("x", list(x.shape))], [value_info("y", [2, 3, 5, 5])], opset=1)
    expect_refused(workdir, bad, ["node 'lp (LpPool)'", "LpPool 1's p 2.5"])


@case("onnx versions keep their own types: ReduceMax of bools before 20 and QLinearMatMul's "
      "f16 scales before 21 are refused by name")
def _(workdir):
    r = model([node("ReduceMax", ["x"], ["y"], "r", attr("keepdims", 0))],
              [value_info("x", [2, 3], 9)], [value_info("y", [], 9)], opset=18)
    expect_refused(workdir, r, ["node 'r (ReduceMax)'", "ReduceMax 18 reduces numbers, not bools"])
    h = np.array(0.5, np.float16)
    q = model([node("QLinearMatMul", ["a", "s", "z", "b", "s", "z", "s", "z"], ["y"], "q")],
              [value_info("a", [2, 3], 2), value_info("b", [3, 2], 2)], [value_info("y", [2, 2], 2)],
              [initializer("s", h), initializer("z", np.array(1, np.uint8))], opset=13)
    expect_refused(workdir, q, ["node 'q (QLinearMatMul)'", "scales are f32, not f16"])


def convnext_structure(workdir, precision):
    """The three transpose fusions composed as torchvision's ConvNeXt
    writes them (optimize.c: a norm between transposes in place, a grouped
    conv writing channels last, an elementwise group reading through
    permuted strides), with the LayerNorm2d's result also read by the
    first block's residual add; with --precision f16 within the documented
    bound (max |error| <= 1e-2 max |reference|)."""
    from math import erf
    from pathlib import Path
    rng = np.random.default_rng(7)
    c, hid = 16, 64
    w = {}

    def weight(name, shape, s=0.2):
        w[name] = (rng.standard_normal(shape) * s).astype(np.float32)
        return name

    nodes = [node("Conv", ["x", weight("sw", [c, 3, 4, 4]), weight("sb", [c])], ["s"], "stem",
                  attr("strides", [4, 4])),
             node("Transpose", ["s"], ["s1"], "st1", attr("perm", [0, 2, 3, 1])),
             node("LayerNormalization", ["s1", weight("sg", [c], 1.0), weight("sbeta", [c])],
                  ["s2"], "sln", attr("epsilon", 1e-6)),
             node("Transpose", ["s2"], ["h0"], "st2", attr("perm", [0, 3, 1, 2]))]
    for b in range(2):
        p, h = f"b{b}", f"h{b}"
        nodes += [
            node("Conv", [h, weight(p + "dw", [c, 1, 7, 7]), weight(p + "db", [c])], [p + "c"],
                 p + "dw", attr("pads", [3, 3, 3, 3]) + attr("group", c)),
            node("Transpose", [p + "c"], [p + "t"], p + "t1", attr("perm", [0, 2, 3, 1])),
            node("LayerNormalization", [p + "t", weight(p + "g", [c], 1.0),
                                        weight(p + "be", [c])], [p + "n"], p + "ln",
                 attr("epsilon", 1e-6)),
            node("MatMul", [p + "n", weight(p + "w1", [c, hid])], [p + "m1"], p + "mm1"),
            node("Add", [p + "m1", weight(p + "b1", [hid])], [p + "a1"], p + "add1"),
            node("Gelu", [p + "a1"], [p + "g1"], p + "gelu"),
            node("MatMul", [p + "g1", weight(p + "w2", [hid, c])], [p + "m2"], p + "mm2"),
            node("Add", [p + "m2", weight(p + "b2", [c])], [p + "a2"], p + "add2"),
            node("Transpose", [p + "a2"], [p + "t2"], p + "t2", attr("perm", [0, 3, 1, 2])),
            node("Mul", [p + "t2", weight(p + "ls", [c, 1, 1], 0.5)], [p + "mu"], p + "scale"),
            node("Add", [p + "mu", h], [f"h{b + 1}"], p + "res")]
    x = rng.standard_normal([2, 3, 32, 32]).astype(np.float32)
    data = model(nodes, [value_info("x", [2, 3, 32, 32])], [value_info("h2", [2, c, 8, 8])],
                 [initializer(k, v) for k, v in w.items()], opset=20)

    def ln(t, g, beta):
        mu = t.mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * g + beta

    f = {k: v.astype(np.float64) for k, v in w.items()}
    s = ref.conv(x.astype(np.float64), f["sw"], f["sb"], strides=[4, 4])
    h = ln(s.transpose(0, 2, 3, 1), f["sg"], f["sbeta"]).transpose(0, 3, 1, 2)
    gelu = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / 2 ** 0.5)))
    for b in range(2):
        p = f"b{b}"
        t = ln(ref.conv(h, f[p + "dw"], f[p + "db"], pads=[3, 3, 3, 3], group=c)
               .transpose(0, 2, 3, 1), f[p + "g"], f[p + "be"])
        a2 = gelu(t @ f[p + "w1"] + f[p + "b1"]) @ f[p + "w2"] + f[p + "b2"]
        h = a2.transpose(0, 3, 1, 2) * f[p + "ls"] + h
    if precision == "f16":
        run_onnx(workdir, data, [x], [h.astype(np.float32)], ["h2"], ("--precision", "f16"),
                 tol=(0, 1e-2 * float(np.abs(h).max())))
    else:
        run_onnx(workdir, data, [x], [h.astype(np.float32)], ["h2"], tol=(1e-4, 1e-4))
    table = (Path(workdir) / "model.c").read_text().split("Sections, in this order")[0]
    check(" transpose " not in table, "a transpose is still its own dispatch:\n" + table)


for prec in ("f32", "f16"):
    case(f"onnx ConvNeXt's structure (a strided stem, LayerNorm2d, two blocks: depthwise conv, "
         f"transposes, layer norm, GELU MLP, layer scale, residual) matches numpy, no "
         f"transpose left a copy, {prec}")(lambda wd, prec=prec: convnext_structure(wd, prec))


@case("onnx MatMul of [1, 3, 1] by [2, 1, 4] (an outer product, batch broadcast; the rotary "
      "embedding's inv_freq @ position_ids) and of [5, 1] by a weight [1, 6]: elementwise "
      "products (no matmul dispatch), equal to numpy's")
def _(workdir):
    rng = np.random.default_rng(40)
    a = rng.standard_normal([1, 3, 1]).astype(np.float32)
    b = rng.standard_normal([2, 1, 4]).astype(np.float32)
    c = rng.standard_normal([5, 1]).astype(np.float32)
    w = rng.standard_normal([1, 6]).astype(np.float32)
    nodes = [node("MatMul", ["a", "b"], ["y"], "outer"),
             node("MatMul", ["c", "w"], ["z"], "outer_w")]
    data = model(nodes, [value_info("a", [1, 3, 1]), value_info("b", [2, 1, 4]),
                         value_info("c", [5, 1])],
                 [value_info("y", [2, 3, 4]), value_info("z", [5, 6])],
                 [initializer("w", w)])
    run_onnx(workdir, data, [a, b, c], [a @ b, c @ w], ["y", "z"], tol=(0, 0))
    r = kiln("inspect", Path(workdir) / "m.onnx", "--format", "json")
    check(r.returncode == 0, f"kiln inspect failed:\n{r.stderr}")
    fams = sorted(d["family"] for d in json.loads(r.stdout)["dispatches"])
    check(fams == ["eltwise", "eltwise"], f"dispatches {fams}, expected two elementwise")
