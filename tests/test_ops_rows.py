"""test_ops_rows.py: along an axis: softmax, log_softmax, cumsum, the norms,
reductions; the shared-memory reductions (shaders/softmax.comp, norm.comp,
reduce.comp, cumsum.comp), on Vulkan against the CPU reference
(ops_common.py says how).
"""
from pathlib import Path

import numpy as np

import reference as ref
from harness import (assert_close, build_model, check, check_kernels, kernel_defines,
                     model_yaml, program_env, registry, run_model, run_program)
from test_ops_attention import ATTENTIONS, attention_case
from ops_common import half, one_op, rng, spec, values, weight_specs

TESTS, case = registry()


# ---- softmax ----

SOFTMAX_SHAPES = [[1, 1], [3, 10], [4, 1000], [2, 3, 257], [7], [64, 4096],
                  [3, 5000]]  # rows longer than 16 x 256: not cached in registers


def softmax_case(i, shape, scale):
    def test(workdir):
        r = rng(400 + i)
        x = values(r, shape, scale)
        want = ref.softmax(x)
        y = model_yaml("sm", {"x": spec(x)},
                       [{"name": "y", "op": "softmax", "inputs": ["x"], "axis": -1}],
                       ["y"])
        got, = run_model(workdir, y, [x], [want.astype(np.float32)])
        assert_close(got, want, 1e-5, 1e-7)
    return test


for i, shape in enumerate(SOFTMAX_SHAPES):
    case(f"op softmax {shape}")(softmax_case(i, shape, 3.0))
case("op softmax [5, 300] large logits")(softmax_case(20, [5, 300], 60.0))

# Few long rows (lower_rows.c, softmax_chunks): chunks of a row, a workgroup
# each, a first dispatch writing each chunk's maximum and sum, a second
# combining them (softmax.comp SPLIT). The logits rise along the row, so
# that the chunks' maxima differ; a chunk of -inf only (a masked span)
# must not poison its row; log_softmax and f16 storage.
def split_softmax_case(i, shape, op, masked=False, precision="f32"):
    def test(workdir):
        r = rng(420 + i)
        ramp = np.linspace(-8, 8, shape[-1], dtype=np.float32)
        x = (values(r, shape, 3.0) + ramp).astype(np.float32)
        if masked:
            x[..., 100:9000] = -np.inf
        f16 = precision == "f16"  # then op(-x): the negation is an f16 operand
        xin = -half(x) if f16 else x
        want = ref.softmax(xin) if op == "softmax" else ref.log_softmax(xin)
        nodes = [{"name": "y", "op": op, "inputs": ["nx" if f16 else "x"], "axis": -1}]
        if f16:
            nodes.insert(0, {"name": "nx", "op": "neg", "inputs": ["x"]})
        prog = build_model(workdir, model_yaml("sm", {"x": spec(x)}, nodes, ["y"]),
                           flags=("--precision", precision))
        splits = sorted(d.get("SPLIT") for d in kernel_defines(workdir) if "CHUNKS" in d)
        check(splits == ["1", "2"], f"softmax kernels' SPLIT {splits}, expected 1 and 2")
        got, = run_program(prog, [x], [want.astype(np.float32)])
        if op == "log_softmax" and masked:  # -inf where masked, compared apart
            check(np.array_equal(np.isinf(got), np.isinf(want)), "-inf positions differ")
            got, want = got[np.isfinite(want)], want[np.isfinite(want)]
        assert_close(got, want, 2e-3 if f16 else 1e-5, 1e-4 if f16 else 1e-7)
    return test


case("op softmax [3, 40000]: few long rows in chunks")(split_softmax_case(0, [3, 40000],
                                                                           "softmax"))
case("op softmax [1, 70001], a span of -inf: in chunks")(
    split_softmax_case(1, [1, 70001], "softmax", masked=True))
case("op log_softmax [2, 30000], a span of -inf: in chunks")(
    split_softmax_case(2, [2, 30000], "log_softmax", masked=True))
case("op softmax [3, 40000] in chunks, f16 storage (--precision f16)")(
    split_softmax_case(0, [3, 40000], "softmax", precision="f16"))

# ---- layer_norm ----

LN_CASES = [
    ([1, 1], 0, 1e-5, 0.0),
    ([3, 10], 2, 1e-5, 0.0),
    ([4, 1000], 2, 1e-3, 0.0),
    ([2, 3, 257], 1, 1e-5, 0.0),
    ([6, 64], 0, 1e-5, 1000.0),  # a large mean: the variance must not cancel
    ([128, 4096], 2, 1e-5, 0.0),  # large
    ([3, 6000], 2, 1e-5, 0.0),    # rows longer than 16 x 256: not cached
]


def layer_norm_case(i, shape, nparams, eps, offset):
    def test(workdir):
        r = rng(500 + i)
        x = values(r, shape) + np.float32(offset)
        cols = shape[-1]
        gamma = values(r, [cols], 1.0)
        beta = values(r, [cols], 1.0)
        params = [gamma, beta][:nparams]
        want = ref.layer_norm(x, *params, eps=eps)
        inputs = {"x": spec(x)}
        names = ["x"]
        for name, p in zip(["gamma", "beta"], params):
            inputs[name] = spec(p)
            names.append(name)
        y = model_yaml("ln", inputs, [{"name": "y", "op": "layer_norm", "inputs": names,
                                       "eps": eps}], ["y"])
        got, = run_model(workdir, y, [x, *params], [want.astype(np.float32)])
        assert_close(got, want, 1e-4, 1e-4 if offset == 0 else 2e-3)
    return test


for i, c in enumerate(LN_CASES):
    case(f"op layer_norm {c[0]} params={c[1]} eps={c[2]} offset={c[3]}")(
        layer_norm_case(i, *c))

# ---- along an axis: softmax, log_softmax, cumsum; normalization ----

def axis_case(op, i, shape, axis, fn, attrs=None, scale=3.0, tol=(1e-5, 1e-6)):
    def test(workdir):
        x = values(rng(1500 + i), shape, scale)
        a = {"axis": axis}
        a.update(attrs or {})
        one_op(workdir, op, [x], fn(x), a, *tol)
    return test


for i, (shape, axis) in enumerate([([4, 5, 6], 0), ([4, 5, 6], 1), ([3, 300], 0),
                                   ([2, 3, 1000], -1)]):
    case(f"op softmax {shape} axis={axis}")(
        axis_case("softmax", i, shape, axis, lambda x, a=axis: ref.softmax(x, a)))
    case(f"op log_softmax {shape} axis={axis}")(
        axis_case("log_softmax", i, shape, axis, lambda x, a=axis: ref.log_softmax(x, a),
                  tol=(1e-5, 1e-5)))
case("op log_softmax [4, 50] large logits")(
    axis_case("log_softmax", 9, [4, 50], -1, lambda x: ref.log_softmax(x), scale=80.0,
              tol=(1e-5, 1e-4)))

CUMSUMS = [([10], -1, 0, 0), ([4, 700], 1, 0, 0), ([4, 700], 1, 1, 0), ([5, 6, 7], 0, 0, 1),
           ([3, 257], -1, 1, 1), ([2, 5000], 1, 0, 0)]
for i, (shape, axis, excl, rev) in enumerate(CUMSUMS):
    case(f"op cumsum {shape} axis={axis} exclusive={excl} reverse={rev}")(
        axis_case("cumsum", 10 + i, shape, axis,
                  lambda x, a=axis, e=excl, r=rev: ref.cumsum(x, a, e, r),
                  {"exclusive": excl, "reverse": rev}, tol=(1e-5, 2e-4)))

# Few long rows of f32 (lower_rows.c, cumsum_chunks): a first dispatch sums
# each chunk, a second scans each chunk from the sum of those before it
# (cumsum.comp SPLIT): along the last axis and down the first (strided),
# exclusive, reversed. Sums of up to 40,000 values of scale 3 (~600) in f32.
SPLIT_CUMSUMS = [([2, 40000], -1, 0, 0), ([1, 70001], -1, 1, 1), ([20000, 3], 0, 0, 1)]


def split_cumsum_case(i, shape, axis, excl, rev):
    def test(workdir):
        x = values(rng(1530 + i), shape, 3.0)
        node = {"name": "y", "op": "cumsum", "inputs": ["x"], "axis": axis,
                "exclusive": excl, "reverse": rev}
        prog = build_model(workdir, model_yaml("cs", {"x": spec(x)}, [node], ["y"]))
        splits = sorted(d.get("SPLIT") for d in kernel_defines(workdir) if "CHUNKS" in d)
        check(splits == ["1", "2"], f"cumsum kernels' SPLIT {splits}, expected 1 and 2")
        want = ref.cumsum(x, axis, excl, rev)
        got, = run_program(prog, [x], [want.astype(np.float32)])
        assert_close(got, want, 1e-5, 2e-3)
    return test


for _i, (_shape, _axis, _excl, _rev) in enumerate(SPLIT_CUMSUMS):
    case(f"op cumsum {_shape} axis={_axis} exclusive={_excl} reverse={_rev}: in chunks")(
        split_cumsum_case(_i, _shape, _axis, _excl, _rev))

NORMS = [  # op, shape, axis, params, eps, offset
    ("layer_norm", [2, 3, 4], 1, 2, 1e-5, 0.0),
    ("layer_norm", [5, 300], -1, 1, 1e-3, 100.0),
    ("rms_norm", [3, 10], -1, 0, 1e-5, 0.0),
    ("rms_norm", [4, 2, 513], -1, 1, 1e-6, 0.0),
    ("rms_norm", [2, 3, 4], 0, 2, 1e-5, 0.0),
]


def norm_case(i, op, shape, axis, nparams, eps, offset):
    def test(workdir):
        r = rng(1600 + i)
        x = values(r, shape) + np.float32(offset)
        pshape = shape[axis % len(shape):]
        params = [values(r, pshape, 1.0) for _ in range(nparams)]
        want = ref.norm(x, axis, *params, eps=eps, rms=op == "rms_norm")
        one_op(workdir, op, [x, *params], want, {"axis": axis, "eps": eps}, 1e-4,
               1e-4 if offset == 0 else 2e-3)
    return test


for i, c in enumerate(NORMS):
    case(f"op {c[0]} {c[1]} axis={c[2]} params={c[3]} eps={c[4]} offset={c[5]}")(
        norm_case(i, *c))


def residual_case(op, two_outputs):
    def test(workdir):
        r = rng(1700 + len(op))
        x, res, g, b = values(r, [6, 40]), values(r, [6, 40]), values(r, [40]), values(r, [40])
        params = [g, b] if op == "residual_layer_norm" else [g]
        s = x.astype(np.float64) + res
        want = ref.norm(s, -1, *params, rms=op == "residual_rms_norm")
        ins = {"x": spec(x), "r": spec(res), "g": spec(g), "b": spec(b)}
        node = {"name": "n", "op": op, "inputs": ["x", "r", "g", "b"][:2 + len(params)]}
        outs = ["y"]
        if two_outputs:
            node["outputs"] = ["y", "s"]
            outs = ["y", "s"]
        else:
            node["outputs"] = ["y"]
        y = model_yaml(op, ins, [node], outs)
        wants = [want.astype(np.float32)] + ([s.astype(np.float32)] if two_outputs else [])
        gots = run_model(workdir, y, [x, res, g, b], wants)
        assert_close(gots[0], want, 1e-4, 1e-4, "norm")
        if two_outputs:
            assert_close(gots[1], s, 1e-6, 1e-6, "sum")
    return test


case("op residual_layer_norm writing the norm and the sum")(
    residual_case("residual_layer_norm", True))
case("op residual_rms_norm writing the norm")(residual_case("residual_rms_norm", False))


@case("op add + layer_norm: a reader of the sum placed before the norm keeps the add "
      "unfused (the norm's dispatch would write the sum after it)")
def _(workdir):
    r = rng(1750)
    x, res, g = values(r, [5, 96]), values(r, [5, 96]), values(r, [96])
    nodes = [{"name": "s", "op": "add", "inputs": ["x", "res"]},
             {"name": "ns", "op": "neg", "inputs": ["s"]},
             {"name": "o", "op": "layer_norm", "inputs": ["s", "g"]}]
    s = x.astype(np.float64) + res
    wants = [-s, ref.norm(s, -1, g)]
    y = model_yaml("order", {"x": spec(x), "res": spec(res), "g": spec(g)}, nodes, ["ns", "o"])
    gots = run_model(workdir, y, [x, res, g], [w.astype(np.float32) for w in wants])
    assert_close(gots[0], wants[0], 1e-6, 1e-6, "the sum's reader")
    assert_close(gots[1], wants[1], 1e-4, 1e-4, "the norm")


# ---- f16 storage (--precision f16): softmax and the norms read and write
# halves. neg before and after makes the op's operands and results f16
# tensors between f32 model inputs and outputs; the reference takes the
# inputs rounded to f16 and computes in f32, as the kernels do. ----

def f16_rows_case(i, op, shape, attrs, residual=False):
    def test(workdir):
        r = rng(1800 + i)
        x = values(r, shape, 3.0)
        cols = shape[-1]
        g, b = values(r, [cols], 1.0), values(r, [cols], 1.0)
        ins, names = {"x": spec(x)}, ["nx"]
        nodes = [{"name": "nx", "op": "neg", "inputs": ["x"]}]
        a = -half(x)
        if residual:  # x + res fused into the norm, the sum read elsewhere
            res = values(r, shape, 3.0)
            ins["res"] = spec(res)
            nodes += [{"name": "nr", "op": "neg", "inputs": ["res"]},
                      {"name": "s", "op": "add", "inputs": ["nx", "nr"]}]
            a = a - half(res)
            names = ["s"]
        params = {"layer_norm": [g, b], "rms_norm": [g]}.get(op, [])
        for name, p in zip(["g", "b"], params):
            ins[name] = spec(p)
            names.append(name)
        nodes += [{"name": "o", "op": op, "inputs": names, **attrs},
                  {"name": "y", "op": "neg", "inputs": ["o"]}]
        if residual:  # after the norm, whose dispatch writes the sum
            nodes.append({"name": "ns", "op": "neg", "inputs": ["s"]})
        fn = {"softmax": lambda v: ref.softmax(v, attrs["axis"]),
              "log_softmax": lambda v: ref.log_softmax(v, attrs["axis"]),
              "layer_norm": lambda v: ref.norm(v, -1, g, b),
              "rms_norm": lambda v: ref.norm(v, -1, g, rms=True)}[op]
        wants = [-fn(a)] + ([-a] if residual else [])
        prog = build_model(workdir, model_yaml("f16", ins, nodes,
                                               ["y", "ns"] if residual else ["y"]),
                           flags=("--precision", "f16"))
        want_defs = {"X_BUF": "F16R", "Y_BUF": "F16"}
        if residual:
            want_defs.update({"RES_BUF": "F16R", "SUM_BUF": "F16"})
        defs = kernel_defines(workdir)
        check(any(all(d.get(k) == v for k, v in want_defs.items()) for d in defs),
              f"no kernel with {want_defs}: {defs}")
        gots = run_program(prog, [x] + ([res] if residual else []) + params,
                           [w.astype(np.float32) for w in wants])
        for k, (got, want) in enumerate(zip(gots, wants)):
            assert_close(got, want, 1e-3, 1e-3 if "norm" in op else 1e-7, f"output {k}")
    return test


F16_ROWS = [("softmax", [3, 300], {"axis": -1}), ("softmax", [2, 5000], {"axis": -1}),
            ("softmax", [4, 5, 6], {"axis": 1}), ("log_softmax", [3, 300], {"axis": -1}),
            ("layer_norm", [4, 768], {}), ("layer_norm", [2, 6000], {}),
            ("rms_norm", [3, 513], {})]
for i, (op, shape, attrs) in enumerate(F16_ROWS):
    case(f"op {op} {shape} {attrs} in f16 storage (--precision f16)")(
        f16_rows_case(i, op, shape, attrs))
case("op add + layer_norm in f16 storage, the sum written too (--precision f16)")(
    f16_rows_case(9, "layer_norm", [5, 96], {}, residual=True))


# Few long rows (lower_rows.c, norm_chunks): each row cut into chunks, a
# workgroup a chunk; a first dispatch writes each chunk's mean and squared
# deviations, a second combines its row's and normalizes (norm.comp SPLIT).
# Uneven last chunks, gamma and beta across chunk edges, a large mean
# (offset: the combination stays centered), RMS, a residual whose sum is
# written, and f16 storage.
SPLIT_NORMS = [  # op, shape, attrs, offset, outputs
    ("group_norm", [1, 64, 28, 28], {"groups": 1}, 100.0, 1),
    ("group_norm", [2, 8, 60, 70], {"groups": 2, "eps": 1e-3}, 0.0, 1),
    ("instance_norm", [1, 3, 130, 129], {}, 3.0, 1),
    ("layer_norm", [2, 20000], {"axis": -1}, 50.0, 1),
    ("rms_norm", [1, 40000], {"axis": -1}, 0.0, 1),
    ("residual_layer_norm", [1, 17000], {"axis": -1}, 0.0, 2),
]


def split_norm_case(i, op, shape, attrs, offset, nout, precision="f32"):
    def test(workdir):
        r = rng(2700 + i)
        # a ramp along each row: the chunks' means differ, so that their
        # combination's between-chunk term matters
        ramp = np.linspace(0, 4, int(np.prod(shape)), dtype=np.float32).reshape(shape)
        x = values(r, shape) + np.float32(offset) + ramp
        c = shape[1] if op in ("group_norm", "instance_norm") else shape[-1]
        g, b = values(r, [c], 1.0), values(r, [c], 1.0)
        res = values(r, shape)
        f16 = precision == "f16"  # then norm(-x), negated: an f16 operand and result
        xin = -half(x) if f16 else x.astype(np.float64)
        if op == "group_norm":
            want = ref.group_norm(xin, g, b, attrs["groups"], attrs.get("eps", 1e-5))
            args = ["x", "g", "b"]
        elif op == "instance_norm":
            want = ref.group_norm(xin, g, b, shape[1])
            args = ["x", "g", "b"]
        elif op == "residual_layer_norm":
            xin = xin + res
            want = ref.norm(xin, -1, g, b)
            args = ["x", "res", "g", "b"]
        else:
            want = ref.norm(xin, -1, g, *([b] if op == "layer_norm" else []),
                            rms=op == "rms_norm")
            args = ["x", "g"] + (["b"] if op == "layer_norm" else [])
        ins = {"x": spec(x), "res": spec(res), "g": spec(g), "b": spec(b)}
        ins = {k: v for k, v in ins.items() if k in args}
        node = dict({"name": "n", "op": op, "inputs": args,
                     "outputs": ["y", "s"][:nout]}, **attrs)
        nodes = [node]
        if f16:
            node["inputs"] = ["nx"] + args[1:]
            node["outputs"] = ["o"]
            nodes = [{"name": "nx", "op": "neg", "inputs": ["x"]}, node,
                     {"name": "y", "op": "neg", "inputs": ["o"]}]
            want = -want
        model = model_yaml("split", ins, nodes, ["y", "s"][:nout])
        prog = build_model(workdir, model, flags=("--precision", precision))
        splits = sorted(d.get("SPLIT") for d in kernel_defines(workdir) if "CHUNKS" in d)
        check(splits == ["1", "2"], f"norm kernels' SPLIT {splits}, expected 1 and 2")
        wants = [want] + ([xin] if nout == 2 else [])
        arrays = {"x": x, "res": res, "g": g, "b": b}
        gots = run_program(prog, [arrays[k] for k in args],
                           [w.astype(np.float32) for w in wants])
        for k, (got, w) in enumerate(zip(gots, wants)):
            assert_close(got, w, 1e-3 if f16 else 1e-4, 2e-3 if f16 else 2e-4, f"output {k}")
    return test


for _i, _c in enumerate(SPLIT_NORMS):
    case(f"op {_c[0]} {_c[1]} {_c[2]} offset={_c[3]}: few long rows in chunks")(
        split_norm_case(_i, *_c))
case("op group_norm [1, 64, 28, 28] groups=1 in chunks, f16 storage (--precision f16)")(
    split_norm_case(0, *SPLIT_NORMS[0], precision="f16"))


@case("op instance_norm [2, 3, 5, 4]")
def _(workdir):
    r = rng(1800)
    x, s, b = values(r, [2, 3, 5, 4]), values(r, [3], 1.0), values(r, [3], 1.0)
    one_op(workdir, "instance_norm", [x, s, b], ref.group_norm(x, s, b, 3, 1e-5), None,
           1e-4, 1e-4)


@case("op group_norm [2, 6, 5] groups=3 eps=1e-3")
def _(workdir):
    r = rng(1801)
    x, s, b = values(r, [2, 6, 5]), values(r, [6], 1.0), values(r, [6], 1.0)
    one_op(workdir, "group_norm", [x, s, b], ref.group_norm(x, s, b, 3, 1e-3),
           {"groups": 3, "eps": 1e-3}, 1e-4, 1e-4)


@case("op batch_norm [2, 3, 4, 4]")
def _(workdir):
    r = rng(1802)
    x = values(r, [2, 3, 4, 4])
    s, b, m = values(r, [3], 1.0), values(r, [3], 1.0), values(r, [3], 1.0)
    v = (np.abs(values(r, [3], 1.0)) + 0.1).astype(np.float32)
    one_op(workdir, "batch_norm", [x, s, b, m, v], ref.batch_norm(x, s, b, m, v), None,
           1e-5, 1e-5)

# ---- reductions ----

REDUCTIONS = [([4, 5, 6], None, 1), ([4, 5, 6], [1], 0), ([4, 5, 6], [0, 2], 1),
              ([3, 1000], [-1], 0), ([7], [0], 1), ([2, 3, 4, 5], [1, 3], 0)]


def reduce_case(op, i, shape, axes, keep):
    def test(workdir):
        x = values(rng(1900 + i), shape, 1.0)
        if op == "reduce_prod":
            x = (1 + 0.05 * x).astype(np.float32)  # keep products finite
        if op == "reduce_log_sum_exp":
            x = (x * 40).astype(np.float32)
        a = tuple(range(len(shape))) if axes is None else tuple(ax % len(shape) for ax in axes)
        want = ref.REDUCE[op](x.astype(np.float64), a, bool(keep))
        attrs = {"keep_dims": keep}
        if axes is not None:
            attrs["axes"] = axes
        one_op(workdir, op, [x], np.asarray(want), attrs, 1e-5, 1e-5)
    return test


for op in ref.REDUCE:
    for i, (shape, axes, keep) in enumerate(REDUCTIONS if op == "reduce_sum" else REDUCTIONS[:4]):
        case(f"op {op} {shape} axes={axes} keep_dims={keep}")(
            reduce_case(op, i, shape, axes, keep))

# Few outputs over long reductions (lower_rows.c, reduce_chunks): each
# output's elements cut into chunks, a workgroup a chunk; a first dispatch
# writes each chunk's partial, a second combines them (reduce.comp SPLIT).
# Rows of uneven chunks, a reduction over every axis of a 3-D tensor, one
# down the columns (strided), and every kind; the data rises along each
# reduction, so that the chunks' partials differ.
SPLIT_REDUCTIONS = [([3, 20000], [-1], 0), ([5, 7, 1000], None, 1), ([20000, 3], [0], 1)]


def split_reduce_case(op, i, shape, axes, keep, precision="f32"):
    def test(workdir):
        r = rng(1950 + i)
        ramp = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)
        x = (values(r, shape, 1.0) + ramp).astype(np.float32)
        if op == "reduce_prod":
            x = (1 + 0.002 * x).astype(np.float32)  # keep products of 35,000 finite
        if op == "reduce_log_sum_exp":
            x = (x * 40).astype(np.float32)
        a = tuple(range(len(shape))) if axes is None else tuple(ax % len(shape) for ax in axes)
        f16 = precision == "f16"  # then op(-x): the negation is an f16 operand
        xin = -half(x) if f16 else x.astype(np.float64)
        want = np.asarray(ref.REDUCE[op](xin, a, bool(keep)))
        attrs = {"keep_dims": keep}
        if axes is not None:
            attrs["axes"] = axes
        nodes = [dict({"name": "y", "op": op, "inputs": ["nx" if f16 else "x"]}, **attrs)]
        if f16:
            nodes.insert(0, {"name": "nx", "op": "neg", "inputs": ["x"]})
        prog = build_model(workdir, model_yaml("split", {"x": spec(x)}, nodes, ["y"]),
                           flags=("--precision", precision))
        splits = sorted(d.get("SPLIT") for d in kernel_defines(workdir) if "CHUNKS" in d)
        check(splits == ["1", "2"], f"reduce kernels' SPLIT {splits}, expected 1 and 2")
        got, = run_program(prog, [x], [want.astype(np.float32)])
        assert_close(got, want, 2e-3 if f16 else 1e-4, 1e-3 if f16 else 1e-4)
    return test


for op in ref.REDUCE:
    for i, (shape, axes, keep) in enumerate(SPLIT_REDUCTIONS if op == "reduce_sum"
                                            else SPLIT_REDUCTIONS[:1]):
        case(f"op {op} {shape} axes={axes}: few outputs, long reductions in chunks")(
            split_reduce_case(op, i, shape, axes, keep))
case("op reduce_mean [3, 20000] in chunks, f16 data (--precision f16)")(
    split_reduce_case("reduce_mean", 0, [3, 20000], [-1], 0, precision="f16"))
case("op reduce_log_sum_exp [3, 20000] in chunks, f16 data (--precision f16)")(
    split_reduce_case("reduce_log_sum_exp", 0, [3, 20000], [-1], 0, precision="f16"))

# Many short reductions (lower_rows.c, reduce_per_thread): an invocation an
# output, in order (reduce.comp PER_THREAD): rows, a global pool's
# positions ([2, 1100, 7, 7] over its last two axes, as global_avg_pool too)
# and a strided middle axis, every kind.
PER_THREAD_REDUCTIONS = [([4100, 9], [-1], 0), ([2, 1100, 7, 7], [2, 3], 1),
                         ([64, 5, 40], [1], 1)]


def per_thread_case(op, i, shape, axes, keep):
    def test(workdir):
        r = rng(1970 + i)
        x = values(r, shape, 1.0)
        if op == "reduce_prod":
            x = (1 + 0.05 * x).astype(np.float32)
        if op == "reduce_log_sum_exp":
            x = (x * 40).astype(np.float32)
        a = tuple(ax % len(shape) for ax in axes)
        want = np.asarray(ref.REDUCE.get(op, ref.REDUCE["reduce_mean"])(
            x.astype(np.float64), a, bool(keep)))
        node = {"name": "y", "op": op, "inputs": ["x"]}
        if op != "global_avg_pool":
            node.update({"axes": axes, "keep_dims": keep})
        prog = build_model(workdir, model_yaml("pt", {"x": spec(x)}, [node], ["y"]))
        kinds = [d.get("PER_THREAD") for d in kernel_defines(workdir) if "KIND" in d]
        check(kinds and all(k == "1" for k in kinds), f"reduce kernels' PER_THREAD {kinds}")
        got, = run_program(prog, [x], [want.astype(np.float32)])
        assert_close(got, want, 1e-5, 1e-5)
    return test


for op in ref.REDUCE:
    for i, (shape, axes, keep) in enumerate(PER_THREAD_REDUCTIONS if op == "reduce_sum"
                                            else PER_THREAD_REDUCTIONS[:1]):
        case(f"op {op} {shape} axes={axes}: many short reductions, an invocation each")(
            per_thread_case(op, i, shape, axes, keep))
case("op global_avg_pool [2, 1100, 7, 7]: an invocation an output")(
    per_thread_case("global_avg_pool", 1, [2, 1100, 7, 7], [2, 3], 1))

# Reductions down strided axes to neighbouring outputs (lower_rows.c,
# reduce_cols): a workgroup 32 outputs, its parts sharing each one's
# elements (reduce.comp COLS). Columns of a matrix (300 outputs: a last,
# partial group), a mean over a sequence ([b, seq, d] over seq), two
# reduced axes merged; every kind.
COL_REDUCTIONS = [([1024, 300], [0], 0), ([2, 64, 100], [1], 1), ([3, 50, 40], [0, 1], 0)]


def cols_case(op, i, shape, axes, keep):
    def test(workdir):
        r = rng(1990 + i)
        x = values(r, shape, 1.0)
        if op == "reduce_prod":
            x = (1 + 0.01 * x).astype(np.float32)
        if op == "reduce_log_sum_exp":
            x = (x * 40).astype(np.float32)
        a = tuple(ax % len(shape) for ax in axes)
        want = np.asarray(ref.REDUCE[op](x.astype(np.float64), a, bool(keep)))
        node = {"name": "y", "op": op, "inputs": ["x"], "axes": axes, "keep_dims": keep}
        prog = build_model(workdir, model_yaml("cols", {"x": spec(x)}, [node], ["y"]))
        kinds = [d.get("COLS") for d in kernel_defines(workdir) if "KIND" in d]
        check(kinds and all(k == "1" for k in kinds), f"reduce kernels' COLS {kinds}")
        got, = run_program(prog, [x], [want.astype(np.float32)])
        assert_close(got, want, 1e-5, 1e-5)
    return test


for op in ref.REDUCE:
    for i, (shape, axes, keep) in enumerate(COL_REDUCTIONS if op == "reduce_sum"
                                            else COL_REDUCTIONS[:1]):
        case(f"op {op} {shape} axes={axes}: strided reductions, 32 outputs a workgroup")(
            cols_case(op, i, shape, axes, keep))

ARGS = [([6, 7], 1, 1, 0), ([6, 7], 0, 0, 0), ([3, 4, 500], 2, 1, 0), ([5, 9], 1, 1, 1)]


def arg_case(op, i, shape, axis, keep, last):
    def test(workdir):
        x = rng(2000 + i).integers(-3, 4, size=shape).astype(np.float32)  # many ties
        want = ref.arg_reduce(x, axis, keep, op == "argmax", last)
        one_op(workdir, op, [x], want, {"axis": axis, "keep_dims": keep,
                                        "select_last_index": last})
    return test


for op in ("argmax", "argmin"):
    for i, (shape, axis, keep, last) in enumerate(ARGS):
        case(f"op {op} {shape} axis={axis} keep_dims={keep} last={last}")(
            arg_case(op, i, shape, axis, keep, last))

# ---- the shared-memory reductions ----
# Kernels that reduce rows across a workgroup (reduce.glsl) have a second
# build that reduces within subgroups first; devices with subgroup arithmetic
# (lavapipe too) run it, so the cases above test it. These run the first
# build, which other devices run (KILN_SUBGROUP=0 hides the feature).

def shared_memory_reductions(test):
    def run_case(workdir):
        with program_env(KILN_SUBGROUP="0"):
            test(workdir)
    return run_case


for name, test in [
        ("softmax [64, 4096]", softmax_case(5, [64, 4096], 3.0)),
        ("softmax [3, 5000]", softmax_case(6, [3, 5000], 3.0)),
        ("log_softmax [2, 3, 1000] axis=-1", axis_case(
            "log_softmax", 3, [2, 3, 1000], -1, lambda x: ref.log_softmax(x, -1),
            tol=(1e-5, 1e-5))),
        ("layer_norm [5, 300] offset=100", norm_case(1, *NORMS[1])),
        ("rms_norm [4, 2, 513]", norm_case(3, *NORMS[3])),
        ("reduce_max [3, 1000]", reduce_case("reduce_max", 3, [3, 1000], [-1], 0)),
        ("reduce_prod [4, 5, 6]", reduce_case("reduce_prod", 2, [4, 5, 6], [0, 2], 1)),
        ("reduce_sum [2, 3, 4, 5]", reduce_case("reduce_sum", 5, [2, 3, 4, 5], [1, 3], 0)),
        ("attention causal 300 x 300", attention_case(6, *ATTENTIONS[6])),
        ("attention grouped-query", attention_case(1, *ATTENTIONS[1]))]:
    case(f"op {name} on the shared-memory reductions (KILN_SUBGROUP=0)")(
        shared_memory_reductions(test))


# ---- a norm over the channels between transposes to channels last and
# back (ConvNeXt's LayerNorm2d; optimize.c fuse_channels_first_norms): one
# norm dispatch over the untransposed tensor's channels, its rows' elements
# the positions apart (INNER), no copies; f16 storage too; a second reader
# of the norm's output keeps the transposes. ----

def channels_first_norm_case(op, xs, precision, shared, residual=False):
    """residual: the norm's result read by an elementwise add with the
    input (ConvNeXt's first block after its stem), which must read the
    tensor the norm's dispatch wrote, not through the transpose."""
    def test(workdir):
        r = rng(540 + len(xs))
        c = xs[1]
        x = values(r, xs) + np.float32(0.5)
        gamma, beta = values(r, [c], 1.0), values(r, [c], 1.0)
        rank = len(xs)
        to_last = [0] + list(range(2, rank)) + [1]
        to_first = [0, rank - 1] + list(range(1, rank - 1))
        params = ["gamma", "beta"] if op == "layer_norm" else ["gamma"]
        nodes = [{"name": "t1", "op": "transpose", "inputs": ["x"], "perm": to_last},
                 {"name": "n", "op": op, "inputs": ["t1"] + params, "eps": 1e-5},
                 {"name": "y", "op": "transpose", "inputs": ["n"], "perm": to_first}]
        outs = ["y"]
        if shared:
            nodes.append({"name": "z", "op": "neg", "inputs": ["n"]})
            outs.append("z")
        if residual:
            nodes.append({"name": "s", "op": "add", "inputs": ["y", "x"]})
            outs = ["s"]
        ins = {"x": spec(x)}
        w = {"gamma": gamma, "beta": beta} if op == "layer_norm" else {"gamma": gamma}
        model = model_yaml("cfn", ins, nodes, outs, weight_specs(**w))
        f16 = precision == "f16"
        prog = build_model(workdir, model, flags=("--precision", "f16") if f16 else ())
        q = half if f16 else np.asarray
        t = np.transpose(q(x), to_last)
        if op == "layer_norm":
            nrm = ref.layer_norm(t, gamma, beta)
        else:
            nrm = t / np.sqrt(np.mean(t * t, axis=-1, keepdims=True) + 1e-5) * gamma
        want = [np.transpose(nrm, to_first)] + ([-nrm] if shared else [])
        if residual:
            want = [want[0] + q(x)]
        got = run_program(prog, [x], [np.ascontiguousarray(w_).astype(np.float32) for w_ in want])
        tol = 2e-2 if f16 else 1e-4
        for a, b in zip(got, want):
            assert_close(a, b, tol, tol)
        text = (Path(workdir) / "model.c").read_text()
        fused = "t1 + n + y (" in text
        check(fused != shared, f"the transposes {'are' if fused else 'are not'} in the norm")
        if not shared:
            check_kernels(workdir, {"norm", "eltwise"} if residual else {"norm"})
            check(any(d.get("INNER") == str(int(np.prod(xs[2:]))) and d.get("LEN") == str(c)
                      for d in kernel_defines(workdir)), "no norm over the channels in place")
    return test


for op, xs, prec, shared in [("layer_norm", [2, 12, 5, 6], "f32", False),
                             ("layer_norm", [2, 12, 5, 6], "f16", False),
                             ("rms_norm", [3, 8, 7], "f32", False),
                             ("layer_norm", [1, 300, 3, 3], "f32", False),
                             ("layer_norm", [2, 12, 5, 6], "f32", True)]:
    case(f"op {op} between transposes to channels last and back x={xs}, {prec}"
         f"{', the norm read elsewhere too' if shared else ''}")(
        channels_first_norm_case(op, xs, prec, shared))
case("op layer_norm between transposes to channels last and back, then a residual add")(
    channels_first_norm_case("layer_norm", [2, 12, 5, 6], "f32", False, True))
