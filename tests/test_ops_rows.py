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
