"""test_limits.py: nothing is truncated; every limit is an error naming itself.

A node with many inputs or outputs (ONNX Concat of 9, 17 and 64 parts, a
variadic Sum of 12, a DenseNet-style block whose concatenation grows by one
part per layer, a split into 20) compiles with all of them and matches numpy
element by element, with the output shape the model declares. What the model
declares is checked: an output or value_info whose shape or element type
disagrees with kiln's inference is a located error naming the node, the
tensor and both shapes. Each real limit (rank 8, 8 dynamic dimensions) is
tested at limit + 1.
"""
from pathlib import Path

import numpy as np

import reference as ref
from harness import (assert_close, build_model, check, kiln, model_yaml,
                     registry, run_program)
from test_onnx import (attr, check_outputs, expect_refused, initializer, model, node,
                       run_onnx, value_info)

TESTS, case = registry()


def parts(n, shape, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def concat_onnx(n):
    names = [f"x{i}" for i in range(n)]
    return model([node("Concat", names, ["y"], "cat", attr("axis", 1))],
                 [value_info(x, [1, 2, 3]) for x in names], [value_info("y", [1, 2 * n, 3])])


for n in (9, 17, 64):
    @case(f"limits: ONNX Concat of {n} inputs keeps them all")
    def _(workdir, n=n):
        xs = parts(n, (1, 2, 3), n)
        run_onnx(workdir, concat_onnx(n), xs, [np.concatenate(xs, axis=1)], ["y"])

    @case(f"limits: YAML concat of {n} inputs keeps them all")
    def _(workdir, n=n):
        xs = parts(n, (1, 2, 3), 100 + n)
        text = model_yaml("c", {f"x{i}": {"dtype": "f32", "shape": [1, 2, 3]} for i in range(n)},
                          [{"name": "y", "op": "concat", "axis": 1,
                            "inputs": [f"x{i}" for i in range(n)]}], ["y"])
        prog = build_model(workdir, text)
        check_outputs(workdir, ["y"], [np.concatenate(xs, axis=1)])
        got = run_program(prog, xs, [np.concatenate(xs, axis=1)])
        assert_close(got[0], np.concatenate(xs, axis=1), 0, 0, "y")


@case("limits: ONNX Sum, Max and Mean of 12 inputs")
def _(workdir):
    xs = parts(12, (3, 5), 12)
    names = [f"x{i}" for i in range(12)]
    data = model([node("Sum", names, ["s"], "sum"), node("Max", names, ["m"], "max"),
                  node("Mean", names, ["a"], "mean")],
                 [value_info(x, [3, 5]) for x in names],
                 [value_info("s", [3, 5]), value_info("m", [3, 5]), value_info("a", [3, 5])])
    x64 = [ref.f64(x) for x in xs]
    run_onnx(workdir, data, xs, [sum(x64), np.max(x64, axis=0), sum(x64) / 12],
             ["s", "m", "a"])


@case("limits: a DenseNet-style block, its concat growing to 13 inputs over 12 layers")
def _(workdir):
    """Each layer: BatchNormalization, Relu and a 3x3 Conv over the concatenation
    of the block's input and every earlier layer's output (DenseNet's dense
    layer); the block's output concatenates all 13."""
    rng = np.random.default_rng(7)
    c0, growth, layers = 4, 3, 12
    x = rng.standard_normal((1, c0, 6, 6)).astype(np.float32)
    nodes, inits, feats, feat_ref = [], [], ["x"], [ref.f64(x)]
    for i in range(layers):
        c = c0 + growth * i
        scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
        bias = rng.uniform(-0.5, 0.5, c).astype(np.float32)
        mean = rng.uniform(-0.2, 0.2, c).astype(np.float32)
        var = rng.uniform(0.5, 2.0, c).astype(np.float32)
        w = (rng.standard_normal((growth, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
        names = [f"l{i}_{k}" for k in ("scale", "bias", "mean", "var", "w")]
        inits += [initializer(nm, a) for nm, a in zip(names, (scale, bias, mean, var, w))]
        nodes += [node("Concat", list(feats), [f"cat{i}"], f"cat{i}", attr("axis", 1)),
                  node("BatchNormalization", [f"cat{i}", *names[:4]], [f"bn{i}"], f"bn{i}"),
                  node("Relu", [f"bn{i}"], [f"relu{i}"], f"relu{i}"),
                  node("Conv", [f"relu{i}", names[4]], [f"f{i}"], f"conv{i}",
                       attr("kernel_shape", [3, 3]) + attr("pads", [1, 1, 1, 1]))]
        cat = np.concatenate(feat_ref, axis=1)
        h = np.maximum(ref.batch_norm(cat, scale, bias, mean, var), 0)
        feat_ref.append(ref.conv(h, w, pads=[1, 1, 1, 1]))
        feats.append(f"f{i}")
    nodes.append(node("Concat", feats, ["y"], "out", attr("axis", 1)))
    want = np.concatenate(feat_ref, axis=1)
    data = model(nodes, [value_info("x", [1, c0, 6, 6])],
                 [value_info("y", [1, c0 + growth * layers, 6, 6])], inits)
    run_onnx(workdir, data, [x], [want], ["y"])


@case("limits: split into 20 outputs (ONNX and YAML)")
def _(workdir):
    rng = np.random.default_rng(20)
    x = rng.standard_normal((2, 40)).astype(np.float32)
    sizes = [1, 3] * 10
    outs = np.split(x, np.cumsum(sizes)[:-1], axis=1)
    names = [f"y{i}" for i in range(20)]
    data = model([node("Split", ["x"], names, "sp", attr("axis", 1) + attr("split", sizes))],
                 [value_info("x", [2, 40])], [value_info(y, [2, s]) for y, s in zip(names, sizes)],
                 opset=11)
    run_onnx(workdir, data, [x], outs, names)
    wd = Path(workdir) / "yaml"
    wd.mkdir()
    text = model_yaml("s", {"x": {"dtype": "f32", "shape": [2, 40]}},
                      [{"name": "sp", "op": "split", "axis": 1, "sizes": sizes,
                        "inputs": ["x"], "outputs": names}], names)
    got = run_program(build_model(wd, text), [x], outs)
    for i, (g, e) in enumerate(zip(got, outs)):
        assert_close(g, e, 0, 0, names[i])


@case("limits: ONNX Split by num_outputs (opset 18) into unequal parts")
def _(workdir):
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    names = ["a", "b", "c"]
    data = model([node("Split", ["x"], names, "sp", attr("axis", 1) + attr("num_outputs", 3))],
                 [value_info("x", [2, 7])],
                 [value_info("a", [2, 3]), value_info("b", [2, 3]), value_info("c", [2, 1])],
                 opset=18)
    run_onnx(workdir, data, [x], [x[:, :3], x[:, 3:6], x[:, 6:]], names)


# ---- what the model declares ----

def onnx_error(name, data, words, flags=()):
    case(f"limits: {name}")(lambda workdir: expect_refused(workdir, data, words, flags))


TWO = [value_info("x0", [1, 2, 3]), value_info("x1", [1, 2, 3])]
onnx_error("a declared output shape that disagrees is an error at its node",
           model([node("Concat", ["x0", "x1"], ["y"], "cat", attr("axis", 1))], TWO,
                 [value_info("y", [1, 5, 3])]),
           ["node 'cat (Concat)'", "kiln infers f32 [1, 4, 3] for 'y'",
            "the model declares FLOAT [1, 5, 3]"])
onnx_error("a declared output element type that disagrees is an error",
           model([node("Relu", ["x0"], ["y"], "r")], TWO[:1], [value_info("y", [1, 2, 3], 7)]),
           ["node 'r (Relu)'", "kiln infers f32 [1, 2, 3] for 'y'", "declares INT64 [1, 2, 3]"])
onnx_error("a declared rank that disagrees is an error",
           model([node("Relu", ["x0"], ["y"], "r")], TWO[:1], [value_info("y", [6])]),
           ["node 'r (Relu)'", "kiln infers f32 [1, 2, 3] for 'y'", "declares FLOAT [6]"])
# value_info for an intermediate: the error is at the node that made it,
# before anything downstream.
onnx_error("a declared intermediate (value_info) that disagrees is an error at its node",
           model([node("Concat", ["x0", "x1"], ["c"], "cat", attr("axis", 2)),
                  node("Relu", ["c"], ["y"], "r")], TWO, [value_info("y", [1, 2, 6])],
                 value_infos=[value_info("c", [1, 2, 7])]),
           ["node 'cat (Concat)'", "kiln infers f32 [1, 2, 6] for 'c'",
            "declares FLOAT [1, 2, 7]"])
onnx_error("a symbolic declared dimension is matched against --shape",
           model([node("Concat", ["x", "x"], ["y"], "cat", attr("axis", 0))],
                 [value_info("x", ["batch", 3])], [value_info("y", ["batch", 3])]),
           ["node 'cat (Concat)'", "kiln infers f32 [8, 3] for 'y'",
            "declares FLOAT ['batch', 3]"], flags=("--shape", "x=4x3"))
onnx_error("an initializer that disagrees with its declared input is an error",
           model([node("Add", ["x0", "w"], ["y"], "a")],
                 [TWO[0], value_info("w", [4])], [value_info("y", [1, 2, 3])],
                 [initializer("w", np.ones(3, np.float32))]),
           ["initializer 'w'", "kiln infers f32 [3] for 'w'", "declares FLOAT [4]"])


onnx_error("a folded Slice with more starts than axes, or ends of another count, is an error",
           model([node("Slice", ["c", "s", "e"], ["y"], "sl"), node("Add", ["x0", "y"], ["z"], "a")],
                 [value_info("x0", [4])], [value_info("z", [4])],
                 [initializer("c", np.arange(4, dtype=np.float32)),
                  initializer("s", np.zeros(3, np.int64)), initializer("e", np.full(1, 4, np.int64))]),
           ["node 'sl (Slice)'", "3 starts, 1 ends for a rank-1 input"])


onnx_error("a folded Gather whose result passes rank 8 is an error, not a stack overrun",
           model([node("Gather", ["c", "i"], ["g"], "ga"), node("Add", ["x0", "g"], ["z"], "a")],
                 [value_info("x0", [1])], [value_info("z", [1])],
                 [initializer("c", np.zeros((2,) + (1,) * 7, np.float32)),
                  initializer("i", np.zeros((1,) * 8, np.int64))]),
           ["node 'ga (Gather)'", "rank 15"])


@case("limits: declared symbolic dimensions that agree compile")
def _(workdir):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    data = model([node("Concat", ["x", "x"], ["y"], "cat", attr("axis", 1))],
                 [value_info("x", ["batch", 3])], [value_info("y", ["batch", "unknown"])])
    run_onnx(workdir, data, [x], [np.concatenate([x, x], axis=1)], ["y"],
             flags=("--shape", "x=4x3"))


# ---- real limits, at limit + 1 ----

def compile_fails(workdir, name, data, words, *flags):
    expect_refused(workdir, data, words, flags, name)


@case("limits: rank 9 is refused by name (YAML, ONNX, --shape); rank 8 compiles")
def _(workdir):
    eight, nine = [1] * 7 + [2], [1] * 8 + [2]
    ok = model_yaml("r", {"x": {"dtype": "f32", "shape": eight}},
                    [{"name": "y", "op": "relu", "inputs": ["x"]}], ["y"])
    (Path(workdir) / "ok.yaml").write_text(ok)
    r = kiln("compile", "ok.yaml", "-o", "ok.c", cwd=workdir)
    check(r.returncode == 0, r.stderr)
    r9 = model_yaml("r", {"x": {"dtype": "f32", "shape": nine}},
                    [{"name": "y", "op": "relu", "inputs": ["x"]}], ["y"])
    compile_fails(workdir, "r9.yaml", r9.encode(), ["rank 9", "up to 8"])
    m9 = model([node("Relu", ["x"], ["y"], "r")], [value_info("x", nine)],
               [value_info("y", nine)])
    compile_fails(workdir, "r9.onnx", m9, ["input 'x' has rank 9"])
    m = model([node("Relu", ["x"], ["y"], "r")], [value_info("x", ["n"] + eight)],
              [value_info("y", ["n"] + eight)])
    compile_fails(workdir, "s9.onnx", m, ["more than 8 dimensions"],
                  "--shape", "x=" + "x".join(["1"] * 9))
    un = model([node("Unsqueeze", ["x"], ["y"], "u", attr("axes", [0]))],
               [value_info("x", eight)], [value_info("y", [1] + eight)], opset=11)
    compile_fails(workdir, "u9.onnx", un, ["node 'u (Unsqueeze)'", "rank 9"])


@case("limits: ReduceSum with 9 axes and Resize with 9 scales are refused by name")
def _(workdir):
    x = [value_info("x", [2, 3])]
    m = model([node("ReduceSum", ["x"], ["y"], "rs", attr("axes", list(range(9))))], x,
              [value_info("y", [1, 1])], opset=11)
    compile_fails(workdir, "r.onnx", m, ["node 'rs (ReduceSum)'", "axes has 9 values, at most 8"])
    sc = initializer("sc", np.ones(9, np.float32))
    m = model([node("Resize", ["x", "", "sc"], ["y"], "rz")], x, [value_info("y", [2, 3])],
              [sc], opset=13)
    compile_fails(workdir, "z.onnx", m, ["node 'rz (Resize)'", "scales has 9 values for 2 axes"])


@case("limits: 9 dynamic dimensions are refused by name; 8 compile")
def _(workdir):
    def text(n):
        dims = {f"d{i}": "1..4" for i in range(n)}
        inputs = {f"x{i}": {"dtype": "f32", "shape": [f"d{i}"]} for i in range(n)}
        nodes = [{"name": f"y{i}", "op": "relu", "inputs": [f"x{i}"]} for i in range(n)]
        return model_yaml("d", inputs, nodes, [f"y{i}" for i in range(n)]).replace(
            '"inputs"', '"dims": ' + str(dims).replace("'", '"') + ', "inputs"', 1)
    (Path(workdir) / "d8.yaml").write_text(text(8))
    r = kiln("compile", "d8.yaml", "-o", "d8.c", cwd=workdir)
    check(r.returncode == 0, r.stderr)
    compile_fails(workdir, "d9.yaml", text(9).encode(), ["more than 8 dynamic dimensions"])
