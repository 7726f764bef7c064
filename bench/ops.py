#!/usr/bin/env python3
"""ops.py: every op family at shapes from real models and the corners
between them, kiln against PyTorch's own kernel for the same op, dtype and
shape, in one run on the same GPU; writes bench/OPS.md and ops.json, worst
first.

Runs where bench/run.py runs (kiln built or carried, PyTorch with CUDA).
Each cell is a one-node kiln model (YAML) over seeded inputs, f32 and f16
(in an f16 cell every float input and output f16, indices as they are;
the parameters, a norm's scale and bias or a convolution's filter and
bias, are weights, as in a model):
compiled (--precision f16 --io f16 for the f16 cells, as a user would) and built with
bench/bench.c, in parallel; then, one cell at a time, kiln's outputs are
checked against torch's (max |error| at most 1e-3 of max |torch| in f32,
1e-2 in f16; indices exactly) before anything is timed. A cell that fails
to compile or to match is reported, not timed. Timed, medians of RUNS:

- kiln: the GPU time of its dispatches (bench.c: timestamps, the sum),
  with every input and output copied through the arena
  (KILN_STAGED_IO=1), as torch's kernel reads and writes device memory:
  with direct I/O a kernel that writes an output of up to 1 MiB writes it
  across the bus, into the host's staging memory, and its time is the
  bus's (an f16 softmax [2364, 197]: 21.6 us against 6.1 in f32, whose
  output is over the limit);
- torch: CUDA events around its op (TF32 off);
- the roofline: the time the op's bytes take at the copy bandwidth
  measured in the same run (kiln's copy of 256 MiB), or its operations at
  the rate of torch's own 8192^3 matmul in that dtype (cuBLAS), whichever
  is longer; a cell's share is that time over kiln's.

The issue's bar (docs/performance.md, "No cliffs"): every cell at least
0.7x torch or at least 50% of its roofline, none below 0.3x torch.

  bench/ops.py [--only SUBSTRING[|SUBSTRING...]] [--runs N] [--jobs N] [--out DIR]
               [--f32-only]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import run  # noqa: E402  (bench/run.py: build_kiln, run_kiln, cuda_time_us)

torch = run.torch
F = run.F if torch else None
STAGED = {"KILN_STAGED_IO": "1"}  # kernels' times, not the bus's


class Cell:
    """One op at one shape: kiln's node, its inputs (name, array, data: the
    data is f16 in an f16 cell), torch's function of the same tensors, the
    same in numpy (ref, over float64 arrays: the small grid's reference in
    tests/test_ops_grid.py), and the bytes and operations that make its
    roofline."""

    def __init__(self, family, label, node, inputs, fn, ref, flops=0, nout=1, other=None):
        self.family, self.label, self.node, self.inputs = family, label, node, inputs
        self.fn, self.ref, self.flops, self.nout = fn, ref, flops, nout
        self.other = other  # a compiler variable whose build is timed beside (KILN_*_SPLIT)


def data(r, shape, scale=1.0, offset=0.0):
    return (r.standard_normal(shape) * scale + offset).astype(np.float32)


def cells(small=False):
    """The grid; small: the same cells at shapes lavapipe runs in seconds
    (tests/test_ops_grid.py), each still of its cell's class (a long row
    still past the chunking threshold, many rows still many, a batch of
    tiny products still many, a product still split along K) so that it
    takes the same kernels: by `kiln inspect`, the same dispatch families
    as the full cell in f32 and f16 but for the largest products, whose
    variants for other devices differ (2026-12-07)."""
    r = np.random.default_rng(66)
    out = []
    ref = run.ref

    def sz(big, little):
        return little if small else big

    def add(family, label, op, attrs, inputs, fn, rfn, flops=0, nout=1):
        node = dict({"name": "y", "op": op, "inputs": [n for n, _, _ in inputs],
                     "outputs": ["y", "y1"][:nout]}, **attrs)
        other = ({"KILN_ROW_SPLIT": "0"} if family in ("norm", "softmax", "reduce", "scan")
                 or "global" in label else {"KILN_FLASH_ROWS": "0"} if family == "attention"
                 else {"KILN_MATMUL_F16_VEC4": "0"} if family == "matmul"
                 else None)
        out.append(Cell(family, label, node, inputs, fn, rfn, flops, nout, other))

    # ---- norms: layer, RMS, batch, instance, group (1 to C groups) ----
    for shape in sz(([197, 768], [4096, 4096], [8, 65536]), ([5, 768], [64, 256], [2, 20000])):
        c = shape[-1]
        add("norm", f"layer_norm {shape}", "layer_norm", {},
            [("x", data(r, shape), True), ("g", data(r, [c]), False), ("b", data(r, [c]), False)],
            lambda t, c=c: F.layer_norm(t[0], (c,), t[1], t[2]),
            lambda a: ref.layer_norm(a[0], a[1], a[2]))
    for shape in sz(([1, 4096], [128, 4096], [2048, 8192]), ([1, 4096], [16, 512], [128, 1024])):
        c = shape[-1]
        add("norm", f"rms_norm {shape}", "rms_norm", {},
            [("x", data(r, shape), True), ("g", data(r, [c]), False)],
            lambda t, c=c: F.rms_norm(t[0], (c,), t[1], 1e-5),
            lambda a: ref.norm(a[0], -1, a[1], None, 1e-5, rms=True))
    for shape, groups in sz(
            (([1, 64, 56, 56], 1), ([8, 64, 56, 56], 1), ([1, 320, 14, 14], 1),
             ([2, 256, 28, 28], 32), ([1, 64, 56, 56], 64), ([32, 128, 28, 28], 8)),
            (([1, 8, 48, 48], 1), ([2, 8, 48, 48], 1), ([1, 96, 14, 14], 1), ([2, 64, 8, 8], 32),
             ([1, 16, 12, 12], 16), ([4, 32, 6, 6], 8))):
        c = shape[1]
        add("norm", f"group_norm {shape} groups={groups}", "group_norm", {"groups": groups},
            [("x", data(r, shape, 1.0, 2.0), True), ("g", data(r, [c]), False),
             ("b", data(r, [c]), False)],
            lambda t, g=groups: F.group_norm(t[0], g, t[1], t[2], 1e-5),
            lambda a, g=groups: ref.group_norm(a[0], a[1], a[2], g, 1e-5))
    for shape in sz(([1, 3, 224, 224], [8, 64, 32, 32], [1, 2, 256, 256]),
                    ([1, 3, 130, 130], [2, 8, 16, 16], [1, 2, 130, 130])):
        c = shape[1]
        add("norm", f"instance_norm {shape}", "instance_norm", {},
            [("x", data(r, shape), True), ("g", data(r, [c]), False), ("b", data(r, [c]), False)],
            lambda t: F.instance_norm(t[0], weight=t[1], bias=t[2], eps=1e-5),
            lambda a, c=c: ref.group_norm(a[0], a[1], a[2], c, 1e-5))
    for shape in sz(([32, 64, 56, 56], [1, 256, 14, 14]), ([4, 8, 10, 10], [1, 32, 7, 7])):
        c = shape[1]
        v = (np.abs(data(r, [c])) + 0.5).astype(np.float32)
        add("norm", f"batch_norm {shape}", "batch_norm", {},
            [("x", data(r, shape), True), ("s", data(r, [c]), False), ("b", data(r, [c]), False),
             ("m", data(r, [c]), False), ("v", v, False)],
            lambda t: F.batch_norm(t[0], t[3], t[4], t[1], t[2], False, 0.0, 1e-5),
            lambda a: ref.batch_norm(a[0], a[1], a[2], a[3], a[4], 1e-5))

    # ---- softmax and reductions, long and short axes, few and many outputs ----
    for shape, axis in sz((([2364, 197], -1), ([16384, 4096], -1), ([1, 262144], -1),
                           ([4, 1000, 1000], 1), ([64, 49, 49], -1)),
                          (([300, 197], -1), ([64, 512], -1), ([1, 40000], -1),
                           ([2, 300, 50], 1), ([8, 49, 49], -1))):
        add("softmax", f"softmax {shape} axis={axis}", "softmax", {"axis": axis},
            [("x", data(r, shape), True)], lambda t, a=axis: torch.softmax(t[0], a),
            lambda x, a=axis: ref.softmax(x[0], a))
    for op, tfn in (("reduce_sum", "sum"), ("reduce_max", "amax"), ("reduce_mean", "mean")):
        for shape, axes in sz((([1 << 24], [0]), ([8192, 1024], [1]), ([1024, 8192], [0]),
                               ([32, 2048, 7, 7], [2, 3]), ([64, 4096], [0, 1])),
                              (([70000], [0]), ([256, 64], [1]), ([512, 96], [0]),
                               ([8, 512, 7, 7], [2, 3]), ([16, 4096], [0, 1]))):
            nfn = {"sum": np.sum, "amax": np.max, "mean": np.mean}[tfn]
            add("reduce", f"{op} {shape} axes={axes}", op, {"axes": axes, "keep_dims": 1},
                [("x", data(r, shape), True)],
                lambda t, f=tfn, a=axes: getattr(torch, f)(t[0], dim=tuple(a), keepdim=True),
                lambda x, f=nfn, a=axes: f(x[0], axis=tuple(a), keepdims=True))
    for shape in sz(([64, 4096], [1, 1 << 20]), ([16, 512], [1, 40000])):
        add("scan", f"cumsum {shape}", "cumsum", {"axis": -1}, [("x", data(r, shape), True)],
            lambda t: torch.cumsum(t[0], -1), lambda x: np.cumsum(x[0], -1))
    for shape, k in sz((([64, 32000], 50), ([1, 1 << 20], 10)),
                       (([4, 20000], 50), ([1, 50000], 10))):
        add("topk", f"topk {shape} k={k}", "topk", {"k": k, "axis": -1},
            [("x", data(r, shape), True)], lambda t, k=k: list(torch.topk(t[0], k, -1)),
            lambda x, k=k: list(ref.topk(x[0], k, -1)), nout=2)

    # ---- pools ----
    shape = sz([32, 64, 112, 112], [2, 4, 20, 20])
    add("pool", f"max_pool 3x3/2 {shape}", "max_pool",
        {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        [("x", data(r, shape), True)], lambda t: F.max_pool2d(t[0], 3, 2, 1),
        lambda x: ref.pool(x[0], [3, 3], "max", [2, 2], [1, 1, 1, 1]))
    shape = sz([8, 128, 56, 56], [2, 8, 12, 12])
    add("pool", f"avg_pool 2x2/2 {shape}", "avg_pool",
        {"kernel": [2, 2], "strides": [2, 2]}, [("x", data(r, shape), True)],
        lambda t: F.avg_pool2d(t[0], 2, 2), lambda x: ref.pool(x[0], [2, 2], "avg", [2, 2]))
    for shape in sz(([32, 2048, 7, 7], [1, 64, 112, 112]), ([8, 512, 7, 7], [1, 8, 100, 100])):
        add("pool", f"global_avg_pool {shape}", "global_avg_pool", {},
            [("x", data(r, shape), True)], lambda t: torch.mean(t[0], (2, 3), keepdim=True),
            lambda x: np.mean(x[0], (2, 3), keepdims=True))

    # ---- convolutions: depthwise, grouped, dilated, strided, transposed ----
    def conv(label, xs, ws, attrs, stride=1, pad=0, dil=1, groups=1, transpose=False,
             arrow=False):
        xa, wa, ba = data(r, xs), data(r, ws, 0.1), data(r, [ws[1] * groups if transpose
                                                              else ws[0]])
        n, _, h, w = xs
        oc = ws[1] * groups if transpose else ws[0]
        kh, kw = ws[2], ws[3]
        if transpose:
            flops = 2 * n * xs[1] * h * w * ws[1] * kh * kw
        else:
            oh = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
            ow = (w + 2 * pad - dil * (kw - 1) - 1) // stride + 1
            flops = 2 * n * oc * oh * ow * ws[1] * kh * kw
        fn = (lambda t: F.conv_transpose2d(t[0], t[1], t[2], stride, pad, 0, groups)) \
            if transpose else (lambda t: F.conv2d(t[0], t[1], t[2], stride, pad, dil, groups))
        pads, st, dl = [pad] * 4, [stride] * 2, [dil] * 2
        rfn = (lambda a: ref.conv_transpose(a[0], a[1], a[2], st, pads, None, groups)) \
            if transpose else (lambda a: ref.conv(a[0], a[1], a[2], st, pads, dl, groups))
        add("conv", f"{label} {xs}" + (f" -> {oc}" if arrow else ""),
            "conv_transpose" if transpose else "conv", attrs,
            [("x", xa, True), ("w", wa, False), ("b", ba, False)], fn, rfn, flops)

    conv("depthwise 3x3", sz([8, 128, 56, 56], [2, 16, 20, 20]), sz([128, 1, 3, 3], [16, 1, 3, 3]),
         {"pads": [1, 1, 1, 1], "group": sz(128, 16)}, pad=1, groups=sz(128, 16))
    conv("depthwise 7x7", sz([1, 384, 14, 14], [1, 32, 14, 14]), sz([384, 1, 7, 7], [32, 1, 7, 7]),
         {"pads": [3, 3, 3, 3], "group": sz(384, 32)}, pad=3, groups=sz(384, 32))
    conv("grouped 3x3 g=8", sz([8, 128, 28, 28], [2, 32, 10, 10]),
         sz([128, 16, 3, 3], [32, 4, 3, 3]), {"pads": [1, 1, 1, 1], "group": 8}, pad=1, groups=8)
    conv("grouped 3x3 g=32", sz([32, 256, 28, 28], [2, 64, 8, 8]),
         sz([256, 8, 3, 3], [64, 2, 3, 3]), {"pads": [1, 1, 1, 1], "group": 32}, pad=1,
         groups=32)
    conv("dilated 3x3 d=2", sz([4, 64, 56, 56], [1, 64, 20, 20]),
         sz([64, 64, 3, 3], [32, 64, 3, 3]), {"pads": [2, 2, 2, 2], "dilations": [2, 2]},
         pad=2, dil=2)
    conv("strided 3x3/2", sz([8, 64, 56, 56], [2, 64, 12, 12]),
         sz([128, 64, 3, 3], [32, 64, 3, 3]), {"pads": [1, 1, 1, 1], "strides": [2, 2]},
         stride=2, pad=1, arrow=True)
    conv("1x1", sz([32, 256, 56, 56], [4, 32, 10, 10]), sz([64, 256, 1, 1], [24, 32, 1, 1]),
         {}, arrow=True)
    conv("transposed 2x2/2", sz([8, 64, 28, 28], [2, 8, 7, 7]),
         sz([64, 32, 2, 2], [8, 4, 2, 2]), {"strides": [2, 2]}, stride=2, transpose=True,
         arrow=True)

    # ---- resize in every mode ----
    for mode, shape in (("nearest", sz([8, 64, 56, 56], [2, 4, 9, 9])),
                        ("linear", sz([8, 64, 56, 56], [2, 4, 9, 9])),
                        ("cubic", sz([1, 3, 224, 224], [1, 3, 17, 17]))):
        attrs = {"mode": mode, "scales": [1, 1, 2, 2]}
        tmode = {"nearest": "nearest", "linear": "bilinear", "cubic": "bicubic"}[mode]
        if mode == "nearest":
            attrs["coordinate_transformation_mode"] = "asymmetric"
            attrs["nearest_mode"] = "floor"
        outs = shape[:2] + [2 * shape[2], 2 * shape[3]]
        coord = "asymmetric" if mode == "nearest" else "half_pixel"
        add("resize", f"resize {mode} x2 {shape}", "resize", attrs,
            [("x", data(r, shape), True)],
            lambda t, m=tmode: F.interpolate(t[0], scale_factor=2, mode=m,
                                             **({} if m == "nearest" else
                                                {"align_corners": False})),
            lambda x, m=mode, o=outs, c=coord: ref.resize(x[0], o, m, c, "floor",
                                                          scales=[1, 1, 2, 2]))

    # ---- gathers and scatters ----
    rows, width, nids = sz((32000, 2048, 512), (500, 64, 40))
    table = data(r, [rows, width])
    ids = r.integers(0, rows, (1, nids)).astype(np.int64)
    add("gather", f"embedding [{rows}, {width}] x {nids} ids", "gather", {"axis": 0},
        [("x", table, True), ("i", ids, False)], lambda t: t[0][t[1]], lambda a: a[0][a[1]])
    side, per = sz((1024, 256), (64, 16))
    src = data(r, [side, side])
    idx = r.integers(0, side, (side, per)).astype(np.int64)
    add("gather", f"gather_elements [{side}, {side}] axis=1, {per} a row", "gather_elements",
        {"axis": 1}, [("x", src, True), ("i", idx, False)],
        lambda t: torch.gather(t[0], 1, t[1]), lambda a: np.take_along_axis(a[0], a[1], 1))
    shape, pairs = sz(([512, 512, 64], 4096), ([32, 32, 8], 100))
    nd = r.integers(0, shape[0], (pairs, 2)).astype(np.int64)
    add("gather", f"gather_nd {shape}, {pairs} pairs", "gather_nd", {},
        [("x", data(r, shape), True), ("i", nd, False)],
        lambda t: t[0][t[1][:, 0], t[1][:, 1]], lambda a: a[0][a[1][:, 0], a[1][:, 1]])

    # ---- copies: concat and split of many parts, pad, transposes of every rank ----
    shape = sz([8, 32, 56, 56], [2, 4, 6, 6])
    parts = [("x%d" % k, data(r, shape), True) for k in range(8)]
    add("copy", f"concat 8 x {shape} axis=1", "concat", {"axis": 1}, parts,
        lambda t: torch.cat(t, 1), lambda a: np.concatenate(a, 1))
    shape = sz([8, 64, 56, 56], [2, 4, 9, 9])
    add("copy", f"pad 1 {shape} constant", "pad",
        {"pads": [0, 0, 1, 1, 0, 0, 1, 1]}, [("x", data(r, shape), True)],
        lambda t: F.pad(t[0], (1, 1, 1, 1)), lambda a: ref.pad(a[0], [0, 0, 1, 1, 0, 0, 1, 1]))
    add("copy", f"pad 3 {shape} reflect", "pad",
        {"pads": [0, 0, 3, 3, 0, 0, 3, 3], "mode": "reflect"},
        [("x", data(r, shape), True)], lambda t: F.pad(t[0], (3, 3, 3, 3), "reflect"),
        lambda a: ref.pad(a[0], [0, 0, 3, 3, 0, 0, 3, 3], "reflect"))
    for shape, perm in sz(
            (([4096, 4096], [1, 0]), ([64, 197, 64], [1, 0, 2]), ([8, 64, 56, 56], [0, 2, 3, 1]),
             ([2, 16, 8, 32, 32], [0, 2, 1, 4, 3]), ([1, 8, 7, 8, 7, 96], [0, 1, 3, 2, 4, 5])),
            (([70, 90], [1, 0]), ([6, 19, 8], [1, 0, 2]), ([2, 8, 6, 7], [0, 2, 3, 1]),
             ([2, 4, 3, 5, 6], [0, 2, 1, 4, 3]), ([1, 2, 7, 3, 7, 8], [0, 1, 3, 2, 4, 5]))):
        add("copy", f"transpose {shape} perm={perm}", "transpose", {"perm": perm},
            [("x", data(r, shape), True)],
            lambda t, p=perm: torch.permute(t[0], p).contiguous(),
            lambda a, p=perm: np.transpose(a[0], p))

    # ---- batched products: 4x4 to 4096^2, batches 1 to 4096 ----
    for b, m, k, n in sz(((192, 49, 32, 49), (192, 49, 49, 32), (4096, 4, 4, 4),
                          (1024, 16, 16, 16), (144, 197, 64, 197), (96, 64, 64, 64),
                          (8, 512, 512, 512), (1, 4096, 4096, 4096), (1, 128, 768, 3072)),
                         ((12, 49, 32, 49), (12, 49, 49, 32), (300, 4, 4, 4), (64, 16, 16, 16),
                          (6, 67, 64, 53), (8, 64, 64, 64), (16, 128, 64, 512),
                          (1, 1024, 256, 1024), (1, 32, 768, 512))):
        a, bb = data(r, [b, m, k]), data(r, [b, k, n])
        add("matmul", f"matmul [{b}, {m}, {k}] x [{b}, {k}, {n}]", "matmul", {},
            [("a", a, True), ("b", bb, True)], lambda t: t[0] @ t[1], lambda x: x[0] @ x[1],
            2 * b * m * k * n)

    # ---- attention: heads 32-256, sequences 1-8192, masks, grouped-query ----
    for b, h, kvh, s, kv, d, causal, mask in sz(
            ((1, 12, 12, 197, 197, 64, 0, False), (64, 3, 3, 49, 49, 32, 0, True),
             (1, 8, 8, 4096, 4096, 64, 1, False), (1, 32, 8, 2048, 2048, 128, 1, False),
             (1, 32, 8, 1, 4096, 128, 0, False), (1, 8, 8, 8192, 8192, 128, 1, False),
             (1, 16, 16, 512, 512, 256, 0, False), (8, 12, 12, 128, 128, 64, 0, True)),
            ((1, 2, 2, 37, 37, 64, 0, False), (4, 3, 3, 49, 49, 32, 0, True),
             (1, 2, 2, 100, 100, 64, 1, False), (1, 4, 2, 40, 40, 128, 1, False),
             (1, 4, 2, 1, 300, 128, 0, False), (1, 1, 1, 70, 70, 128, 1, False),
             (1, 2, 2, 20, 20, 256, 0, False), (2, 2, 2, 16, 16, 64, 0, True))):
        q, k, v = data(r, [b, h, s, d]), data(r, [b, kvh, kv, d]), data(r, [b, kvh, kv, d])
        ins = [("q", q, True), ("k", k, True), ("v", v, True)]
        if mask:
            ins.append(("m", data(r, [1, 1, s, kv]), True))
        attrs = {"heads": h, "kv_heads": kvh}
        if causal:
            attrs["causal"] = 1

        def sdpa(t, h=h, kvh=kvh, causal=causal, mask=mask):
            kk, vv = t[1], t[2]
            if kvh != h:
                kk, vv = kk.repeat_interleave(h // kvh, 1), vv.repeat_interleave(h // kvh, 1)
            return F.scaled_dot_product_attention(t[0], kk, vv, t[3] if mask else None,
                                                  is_causal=bool(causal))

        def sdpa_ref(a, causal=causal, mask=mask):
            return ref.attention(a[0], a[1], a[2], a[3] if mask else None, causal=bool(causal))
        flops = 4 * b * h * s * kv * d // (2 if causal else 1)
        add("attention", f"attention b={b} heads={h}/{kvh} seq={s} keys={kv} d={d}"
            f"{' causal' if causal else ''}{' mask' if mask else ''}", "attention", attrs,
            ins, sdpa, sdpa_ref, flops)
    return out


def weight(cell, name, a):
    """Whether input `name` of the cell is a weight in kiln's model: a float
    parameter (a norm's scale, bias and statistics, a convolution's filter
    and bias), as in a real model, where --precision f16 converts it once
    at compile time; the data and the indices are the model's inputs."""
    return a.dtype == np.float32 and not next(d for n, _, d in cell.inputs if n == name)


def yaml_of(cell, wd, k):
    """The model as a user declares it: f32 inputs (--io f16 makes them
    f16), the parameters weights read from raw files beside it."""
    ins, weights = {}, {}
    for name, a, _ in cell.inputs:
        spec = {"dtype": {np.dtype(np.float32): "f32", np.dtype(np.int64): "i64"}[a.dtype],
                "shape": list(a.shape)}
        if weight(cell, name, a):
            a.tofile(wd / f"c{k}_{name}.bin")
            weights[name] = dict(spec, file=f"c{k}_{name}.bin")
        else:
            ins[name] = spec
    model = json.loads(run.yaml_model("op", ins, [cell.node], cell.node["outputs"]))
    model["weights"] = weights
    return json.dumps(model)


def arrays_of(cell, f16):
    """kiln's inputs (not its weights): every float one f16 in an f16 cell
    (--io f16)."""
    return [a.astype(np.float16) if f16 and a.dtype == np.float32 else a
            for name, a, _ in cell.inputs if not weight(cell, name, a)]


def torch_inputs(cell, f16, dev):
    """torch's: every tensor of the cell, the floats f16 in an f16 cell
    (its ops take one dtype; kiln keeps a norm's parameters f32)."""
    return [torch.from_numpy(a.astype(np.float16) if f16 and a.dtype == np.float32 else a)
            .to(dev) for _, a, _ in cell.inputs]


def bytes_of(cell, f16, outs):
    inb = sum(a.nbytes * (0.5 if f16 and a.dtype == np.float32 else 1)
              for _, a, _ in cell.inputs)
    return inb + sum(o.numel() * o.element_size() for o in outs)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench"))
    ap.add_argument("--only", default="")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--f32-only", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = run.DEV
    todo = [(c, f16) for c in cells() for f16 in ((False,) if args.f32_only else (False, True))
            if any(o in c.label for o in args.only.split("|"))]
    wd = Path(tempfile.mkdtemp(prefix="kiln-ops-"))

    def build(k):
        """(program, inspect summary, its outputs' numpy dtypes, error, the
        program built with the cell's other variable)."""
        c, f16 = todo[k]
        flags = ("--precision", "f16", "--io", "f16") if f16 else ()
        try:
            prog, _, summary = run.build_kiln(wd, yaml_of(c, wd, k), f"c{k}", flags=flags)
            other = run.build_kiln(wd, yaml_of(c, wd, k), f"c{k}o", env=c.other,
                                   flags=flags)[0] if c.other else None
            tensors = json.loads(run.sh([run.BUILD / "kiln", "inspect", wd / f"c{k}.yaml",
                                         "--format", "json", *flags]))["tensors"]
            kinds = {t["name"]: t["dtype"] for t in tensors}
            dts = [{"f32": np.float32, "f16": np.float16, "i64": np.int64,
                    "i32": np.int32}[kinds[o]] for o in c.node["outputs"]]
            return prog, summary, dts, None, other
        except Exception as e:  # reported in the table, not timed
            return None, None, None, str(e).strip().splitlines()[-1][:200], None
    with ThreadPoolExecutor(args.jobs) as pool:
        built = list(pool.map(build, range(len(todo))))

    # the roofline's two rates, measured here
    n = 1 << 26
    x = torch.randn(n, device=dev)
    copy_us = run.cuda_time_us(lambda: x.clone(), args.runs)
    bandwidth = 2 * n * 4 / copy_us * 1e6  # bytes per second
    peaks = {}
    for f16 in (False, True):
        m = torch.randn(8192, 8192, device=dev, dtype=torch.float16 if f16 else torch.float32)
        peaks[f16] = 2 * 8192 ** 3 / run.cuda_time_us(lambda: m @ m, 5) * 1e6
    del x, m

    rows = []
    for k, ((c, f16), (prog, summary, dts, err, other)) in enumerate(zip(todo, built)):
        if k and k % 16 == 0:  # the table so far, should the run be cut short
            write(args.out, rows, bandwidth, peaks)
        row = {"family": c.family, "cell": c.label, "dtype": "f16" if f16 else "f32"}
        rows.append(row)
        if err:
            row["error"] = f"compile: {err}"
            continue
        arrays = arrays_of(c, f16)
        t = torch_inputs(c, f16, dev)
        try:
            want = c.fn(t)
            want = want if isinstance(want, list) else [want]
            like = [w.cpu().numpy().astype(dt) for w, dt in zip(want, dts)]
            res, got = run.run_kiln(wd, prog, arrays, like, args.runs, env=STAGED)
            for g, w in zip(got, like):
                if w.dtype.kind in "iu":  # indices: exact in f32 (f16's ties may differ)
                    if not f16 and not np.array_equal(g, w):
                        raise RuntimeError(f"{int((g != w).sum())} indices differ")
                else:
                    run.check_close(c.label, g, w, 1e-2 if f16 else 1e-3)
        except Exception as e:
            row["error"] = f"check: {str(e).strip().splitlines()[-1][:200]}"
            continue
        if other:  # the same check first
            ores, ogot = run.run_kiln(wd, other, arrays, like, args.runs, env=STAGED)
            for g, w in zip(ogot, like):
                if w.dtype.kind not in "iu":
                    run.check_close(c.label, g, w, 1e-2 if f16 else 1e-3)
            row["other"] = " ".join(f"{k}={v}" for k, v in c.other.items())
            row["other_us"] = ores["gpu_us"]
        torch_us = run.cuda_time_us(lambda: c.fn(t), args.runs)
        floor_us = max(bytes_of(c, f16, want) / bandwidth * 1e6, c.flops / peaks[f16] * 1e6)
        row.update(kiln_us=res["gpu_us"], torch_us=torch_us, ratio=torch_us / res["gpu_us"],
                   roofline=floor_us / res["gpu_us"],
                   dispatches=summary.get("most_on_one_device", summary["dispatches"]))
        print(f"{row['dtype']} {c.label}: kiln {res['gpu_us']:.1f} us, torch {torch_us:.1f}, "
              f"{row['ratio']:.2f}x, roofline {100 * row['roofline']:.0f}%", flush=True)
    write(args.out, rows, bandwidth, peaks)


def passes(row):
    return row["ratio"] >= 0.7 or row["roofline"] >= 0.5


def write(out, rows, bandwidth, peaks):
    out = Path(out)
    gpu = torch.cuda.get_device_name() if torch and torch.cuda.is_available() else "?"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        driver = "?"
    commit = os.environ.get("KILN_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=ROOT).stdout.strip()
    meta = {"date": datetime.date.today().isoformat(), "gpu": gpu, "driver": driver,
            "torch": torch.__version__, "commit": commit, "copy_gb_s": bandwidth / 1e9,
            "matmul_tflops": {"f32": peaks[False] / 1e12, "f16": peaks[True] / 1e12}}
    (out / "ops.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    timed = sorted((r for r in rows if "ratio" in r), key=lambda r: r["ratio"])
    failed = [r for r in rows if "error" in r]
    lines = [
        "# kiln's op sweep against PyTorch", "",
        f"{meta['date']}, {gpu}, driver {driver}, PyTorch {meta['torch']}, kiln {commit}. "
        f"Written by `bench/ops.py` (its docstring says how each number is measured). Copy "
        f"bandwidth {bandwidth / 1e9:.0f} GB/s; torch's 8192^3 matmul "
        f"{peaks[False] / 1e12:.0f} TFLOP/s in f32 (TF32 off), {peaks[True] / 1e12:.0f} in f16.",
        "",
        f"{len(timed)} cells timed; {sum(passes(r) for r in timed)} at least 0.7x torch or 50% "
        f"of their roofline; {sum(r['ratio'] < 0.3 for r in timed)} below 0.3x torch; "
        f"{len(failed)} not timed (below). Worst first:", "",
        "| cell | dtype | kiln us | torch us | torch / kiln | roofline share | dispatches | "
        "kiln us with | |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in timed:
        with_ = f"{r['other_us']:.1f} ({r['other']})" if "other_us" in r else ""
        lines.append(f"| {r['cell']} | {r['dtype']} | {r['kiln_us']:.1f} | {r['torch_us']:.1f} | "
                     f"{r['ratio']:.2f} | {100 * r['roofline']:.0f}% | {r['dispatches']} | "
                     f"{with_} | {'' if passes(r) else '**below the bar**'} |")
    if failed:
        lines += ["", "Not timed:", "", "| cell | dtype | why |", "| --- | --- | --- |"]
        lines += [f"| {r['cell']} | {r['dtype']} | {r['error'].replace('|', '/')} |"
                  for r in failed]
    (out / "OPS.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'OPS.md'}")


if __name__ == "__main__":
    main()
