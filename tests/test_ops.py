"""test_ops.py: every op on Vulkan against the CPU reference.

Each case builds a one- or two-node model with random shapes and values
(never all zeros: normal values scaled to cover negatives and large
magnitudes), runs it with kiln, and compares every element with
reference.py under the op's tolerance. Shapes include odd sizes, size-1
dimensions, broadcasting, sizes that are not multiples of the workgroup
size, and one large case per op.
"""
import re
from pathlib import Path

import numpy as np

import reference as ref
from harness import (assert_close, build_model, check, model_yaml, program_env, registry,
                     run_model, run_program)

TESTS, case = registry()


def rng(seed):
    return np.random.default_rng(seed)


def values(r, shape, scale=3.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16",
          np.dtype(np.int32): "i32", np.dtype(np.int64): "i64",
          np.dtype(np.bool_): "bool", np.dtype(np.uint8): "u8", np.dtype(np.int8): "i8"}


def spec(a):
    return {"dtype": DTYPES[np.asarray(a).dtype], "shape": list(np.shape(a))}


def one_op(workdir, op, inputs, want, attrs=None, rtol=0, atol=0, names="abcdef"):
    """A model of one node over `inputs`; compares with `want`."""
    ins = {names[i]: spec(x) for i, x in enumerate(inputs)}
    node = {"name": "y", "op": op, "inputs": list(ins)}
    node.update(attrs or {})
    y = model_yaml(op, ins, [node], ["y"])
    want = np.asarray(want)
    got, = run_model(workdir, y, list(inputs), [want])
    if want.dtype.kind in "biu":
        bad = got != want
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            from harness import Failure
            raise Failure(f"{int(bad.sum())} of {want.size} elements differ; first at "
                          f"{list(i)}: got {got[i]!r}, expected {want[i]!r}")
    else:
        assert_close(got, want, rtol, atol)


# ---- elementwise binary with broadcasting ----

BINARY_SHAPES = [
    ([7], [7]),
    ([3, 5], [5]),
    ([2, 1, 4], [3, 1]),
    ([1], [9, 9]),
    ([33, 257], [33, 257]),
    ([4, 1, 6, 1], [1, 5, 1, 3]),
    ([5, 1], [1]),
    ([512, 1024], [1024]),  # large
]
BINARY_TOL = {"add": (1e-6, 1e-6), "sub": (1e-6, 1e-6), "mul": (1e-6, 1e-6),
              "div": (2e-6, 1e-6), "max": (0, 0), "min": (0, 0), "pow": (1e-5, 1e-6),
              "mod": (1e-5, 1e-5), "prelu": (1e-6, 1e-7)}


def binary_case(op, i, sa, sb):
    def test(workdir):
        r = rng(100 * i + len(op))
        a = values(r, sa)
        b = values(r, sb)
        if op in ("div", "mod"):  # keep the divisor away from zero
            b = (np.sign(b) + (b == 0)) * (0.5 + np.abs(b))
            b = b.astype(np.float32)
        if op == "pow":  # positive bases, moderate exponents
            a = (np.abs(a) + 0.1).astype(np.float32)
            b = (b / 3).astype(np.float32)
        want = ref.BINARY[op](a, b)
        y = model_yaml(op, {"a": spec(a), "b": spec(b)},
                       [{"name": "y", "op": op, "inputs": ["a", "b"]}], ["y"])
        got, = run_model(workdir, y, [a, b], [want.astype(np.float32)])
        assert_close(got, want, *BINARY_TOL[op])
    return test


for op in ref.BINARY:
    shapes = BINARY_SHAPES if op in ("add", "sub", "mul", "div") else BINARY_SHAPES[1::2]
    for i, (sa, sb) in enumerate(shapes):
        case(f"op {op} {sa} {sb}")(binary_case(op, i, sa, sb))


def weight_operand_case(workdir):
    """Broadcast against a weight read from a raw file, operand order b, a."""
    r = rng(7)
    a = values(r, [6, 10])
    w = values(r, [10])
    want = ref.BINARY["sub"](w, a)
    y = model_yaml("wsub", {"a": spec(a)},
                   [{"name": "y", "op": "sub", "inputs": ["w", "a"]}], ["y"],
                   weights={"w": {"dtype": "f32", "shape": [10], "file": "w.bin",
                                  "offset": 8}})
    got, = run_model(workdir, y, [a], [want.astype(np.float32)],
                     extra_files={"w.bin": b"\x01" * 8 + w.tobytes() + b"\x02" * 4})
    assert_close(got, want, 1e-6, 1e-6)


case("op sub [10] weight from file at an offset, [6, 10]")(weight_operand_case)

# ---- elementwise unary ----

UNARY_SHAPES = [[1], [5, 7], [1000], [3, 1, 257], [1 << 20]]
UNARY_TOL = {"relu": (0, 0), "gelu": (1e-5, 1e-6), "silu": (1e-5, 1e-6),
             "sigmoid": (1e-5, 1e-7), "tanh": (1e-5, 1e-6), "exp": (1e-5, 0),
             "leaky_relu": (1e-6, 0), "elu": (1e-5, 1e-6), "selu": (1e-5, 1e-6),
             "hard_sigmoid": (1e-6, 1e-7), "hard_swish": (1e-6, 1e-6), "log": (1e-5, 1e-6),
             "sqrt": (1e-6, 0), "rsqrt": (1e-5, 0), "reciprocal": (1e-6, 0), "neg": (0, 0),
             "abs": (0, 0), "sign": (0, 0), "floor": (0, 0), "ceil": (0, 0), "round": (0, 0),
             "erf": (1e-5, 2e-7), "gelu_tanh": (1e-5, 1e-6), "softplus": (1e-5, 1e-6),
             "sin": (1e-5, 2e-6), "cos": (1e-5, 2e-6), "tan": (1e-4, 1e-5),
             "atan": (1e-5, 1e-6), "asin": (1e-5, 1e-6), "acos": (1e-5, 1e-6),
             "sinh": (1e-5, 1e-6), "cosh": (1e-5, 1e-6), "asinh": (1e-5, 1e-6),
             "acosh": (1e-5, 1e-6), "atanh": (1e-5, 1e-6), "softsign": (1e-6, 1e-7),
             "celu": (1e-5, 1e-6), "thresholded_relu": (0, 0), "shrink": (0, 0)}
# Ops whose domain is limited get inputs inside it.
POSITIVE = {"log", "sqrt", "rsqrt"}
UNIT = {"asin", "acos", "atanh"}  # (-1, 1)


def unary_case(op, i, shape):
    def test(workdir):
        r = rng(200 * i + len(op))
        x = values(r, shape, 4.0)
        flat = x.reshape(-1)
        # Exercise the tails: large magnitudes of both signs.
        edge = np.array([-60.0, -20.0, -5.5, 0.0, 1e-4, 5.5, 20.0, 60.0, 0.5, 1.5,
                         2.5, -0.5, -2.5], np.float32)
        flat[:min(flat.size, edge.size)] = edge[:flat.size]
        if op in POSITIVE:
            x = (np.abs(x) + 1e-3).astype(np.float32)
        if op == "reciprocal":
            x = (np.sign(x) + (x == 0)) * (0.01 + np.abs(x))
            x = x.astype(np.float32)
        if op == "tan":
            x = np.clip(x, -1.4, 1.4).astype(np.float32)
        if op in UNIT:
            x = (np.tanh(x / 2) * 0.999).astype(np.float32)
        if op == "acosh":
            x = (1 + np.abs(x)).astype(np.float32)
        if op in ("sinh", "cosh"):  # inside f32's range
            x = np.clip(x, -80, 80).astype(np.float32)
        want = ref.UNARY[op](x)
        y = model_yaml(op, {"x": spec(x)},
                       [{"name": "y", "op": op, "inputs": ["x"]}], ["y"])
        got, = run_model(workdir, y, [x], [want.astype(np.float32)])
        assert_close(got, want, *UNARY_TOL[op])
    return test


for op in ref.UNARY:
    shapes = UNARY_SHAPES if op in ("relu", "gelu", "exp", "tanh") else UNARY_SHAPES[1:4]
    for i, shape in enumerate(shapes):
        case(f"op {op} {shape}")(unary_case(op, i, shape))



@case("op isnan and isinf (both signs, each sign alone) on NaN, infinities and numbers")
def _(workdir):
    x = values(rng(77), [5, 41])
    flat = x.reshape(-1)
    flat[::7] = np.nan
    flat[1::11] = np.inf
    flat[2::13] = -np.inf
    wants = [np.isnan(x), np.isinf(x), np.isposinf(x), np.isneginf(x)]
    y = model_yaml("predicates", {"x": spec(x)},
                   [{"name": "nan", "op": "isnan", "inputs": ["x"]},
                    {"name": "inf", "op": "isinf", "inputs": ["x"]},
                    {"name": "pos", "op": "isinf", "inputs": ["x"], "detect_negative": 0},
                    {"name": "neg", "op": "isinf", "inputs": ["x"], "detect_positive": 0}],
                   ["nan", "inf", "pos", "neg"])
    got = run_model(workdir, y, [x], wants)
    for g, w in zip(got, wants):
        check(np.array_equal(g.astype(bool), w), f"got {g.astype(int)}\nwant {w.astype(int)}")


@case("ops.def: every op has a test of its own (a test named 'op ... NAME ...')")
def _(workdir):
    from run_tests import all_tests  # the whole registry, every tier
    names = [n for n, _ in all_tests()]
    rows = re.findall(r'^OP\(\w+, "(\w+)"', (Path(__file__).resolve().parents[1] / "compiler" /
                                              "ops.def").read_text(), re.M)
    check(len(rows) > 100, f"read only {len(rows)} rows of ops.def")
    lacking = [op for op in rows
               if not any(n.startswith("op ") and re.search(r"[ ,]" + op + r"\b", n)
                          for n in names)]
    check(not lacking, f"ops with no test of their own: {' '.join(lacking)}")


# ---- matmul ----

MATMUL_SHAPES = [
    ([1, 1], [1, 1]),
    ([5, 7], [7, 3]),
    ([33, 65], [65, 17]),
    ([3, 5, 7], [3, 7, 4]),        # batched
    ([2, 3, 5, 7], [7, 6]),        # broadcast weights
    ([2, 1, 4, 8], [1, 3, 8, 5]),  # broadcast batch dimensions
    ([4, 9], [2, 9, 3]),           # 2-D times batched
    ([7], [7, 3]),                 # vector times matrix
    ([4, 7], [7]),                 # matrix times vector
    ([130, 100], [100, 70]),
    ([256, 512], [512, 384]),      # large
    ([600, 520], [520, 700]),      # 64 tiles with ragged edges
    ([2100, 40], [40, 2050]),      # 128 x 128 tiles (enough of them), ragged edges
    # matmul.comp's vec4 path (rows 16-byte aligned): 128 x 128 tiles with
    # ragged edges and K steps past K, a batch, broadcast weights.
    ([2100, 44], [44, 2052]),
    ([3, 70, 36], [3, 36, 68]),
    ([2, 3, 66, 20], [20, 72]),
    # ... and where the tiles divide the product: K steps odd (3, 5) and
    # even (4), one step (the steps go two to an iteration), a batch on the
    # dispatch's z; 128 x 128 tiles (on lavapipe; the H200 takes 128 x 256)
    # in three K steps of 8.
    ([128, 48], [48, 192]),
    ([2, 64, 80], [2, 80, 128]),
    ([64, 64], [64, 64]),
    ([64, 16], [16, 64]),
    ([2048, 24], [24, 2048]),
    # ragged M and N with K a multiple of the K step, 64 and 128 tiles
    ([100, 64], [64, 92]),
    ([2100, 48], [48, 2052]),
    # 64 x 128 tiles of 4 x 8 (at least 128 of them), ragged, K steps past K
    ([1030, 36], [36, 1028]),
    # matvec.comp: vec4 columns and vec4 rows of A, 16 rows in six rounds of
    # 3, columns past the last workgroup's; then vec4 columns with scalar A
    # (K odd), and a batch with vec4 on both sides.
    ([16, 1028], [1028, 1000]),
    ([11, 257], [257, 84]),
    ([3, 2, 64], [3, 64, 36]),
]


def matmul_case(i, sa, sb):
    def test(workdir):
        r = rng(300 + i)
        a = values(r, sa, 1.0)
        b = values(r, sb, 1.0)
        want = ref.matmul(a, b)
        y = model_yaml("mm", {"a": spec(a), "b": spec(b)},
                       [{"name": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"])
        prog = build_model(workdir, y)
        check_tile_defines(Path(workdir) / "model.c")
        got, = run_program(prog, [a, b], [want.astype(np.float32)])
        k = sa[-1]
        assert_close(got, want, 1e-5, 2e-6 * k ** 0.5 * 4)
    return test


def check_tile_defines(c_path):
    """Each vec4 matmul.comp kernel in the generated C (its defines are in
    a comment) is ONE_TILE: fixed shapes, a workgroup for every tile."""
    for block in re.findall(r"/\* kernel .*?\*/", c_path.read_text(), re.S):
        d = dict(re.findall(r"^ \*   (\w+) (\S+)$", block, re.M))
        if d.get("VEC4") == "1":
            check(d.get("ONE_TILE") == "1", f"tile {d['BM']} x {d['BN']}: ONE_TILE "
                  f"{d.get('ONE_TILE')}")


for i, (sa, sb) in enumerate(MATMUL_SHAPES):
    case(f"op matmul {sa} {sb}")(matmul_case(i, sa, sb))


# f16 x f16 -> f16, f32 accumulation. Shapes that fit coopmat.comp (more
# than 16 rows, K and N multiples of 8) compile to it and to the tiled
# fallback; lavapipe has no cooperative matrices, so it runs the fallback
# (the NVIDIA run of the suite takes coopmat.comp); then matvec, and a
# ragged shape that only the tiled kernel takes.
MATMUL_F16_SHAPES = [
    ([40, 64], [64, 72]),
    ([2, 150, 136], [2, 136, 200]),
    ([300, 256], [256, 264]),
    ([5, 24], [24, 16]),
    ([33, 65], [65, 17]),
    ([128, 96], [96, 192]),  # coopmat.comp's 64 x 64 tiles divide it, 3 K steps
]


def matmul_f16_case(i, sa, sb):
    def test(workdir):
        r = rng(340 + i)
        a = values(r, sa, 1.0).astype(np.float16)
        b = values(r, sb, 1.0).astype(np.float16)
        exact = ref.matmul(a.astype(np.float64), b.astype(np.float64))
        y = model_yaml("mm", {"a": spec(a), "b": spec(b)},
                       [{"name": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"])
        got, = run_model(workdir, y, [a, b], [exact.astype(np.float16)])
        check(got.dtype == np.float16, f"output dtype {got.dtype}")
        # f32 sums of exact f16 products, rounded once to f16
        assert_close(got, exact, 2 ** -10, 1e-6 * sa[-1] ** 0.5 * 4)
    return test


for i, (sa, sb) in enumerate(MATMUL_F16_SHAPES):
    case(f"op matmul f16 {sa} {sb}")(matmul_f16_case(i, sa, sb))


def matmul_weights_case(workdir):
    """[B, S, D] x a weight [D, E] from inline values."""
    r = rng(330)
    x = values(r, [2, 3, 4], 1.0)
    w = values(r, [4, 5], 1.0)
    want = ref.matmul(x, w)
    y = model_yaml("mmw", {"x": spec(x)},
                   [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}], ["y"],
                   weights={"w": {"dtype": "f32", "shape": [4, 5],
                                  "values": [float(v) for v in w.reshape(-1)]}})
    got, = run_model(workdir, y, [x], [want.astype(np.float32)])
    assert_close(got, want, 1e-5, 1e-5)


case("op matmul [2, 3, 4] x inline weight [4, 5]")(matmul_weights_case)


def qkv_case(i, xshape, widths, flags=(), rtol=1e-5):
    """Matmuls of one input by weights of the same K (QKV split fusion: one
    dispatch writes every output), against float64 products; with
    --no-fuse=qkv one dispatch each."""
    def test(workdir):
        r = rng(340 + i)
        k = xshape[-1]
        x = values(r, xshape, 1.0)
        ws = [values(r, [k, w], 1.0) for w in widths]
        names = [f"y{j}" for j in range(len(ws))]
        y = model_yaml("qkv", {"x": spec(x)},
                       [{"name": n, "op": "matmul", "inputs": ["x", f"w{j}"]}
                        for j, n in enumerate(names)], names,
                       weights={f"w{j}": {"dtype": "f32", "shape": list(w.shape),
                                          "values": [float(v) for v in w.reshape(-1)]}
                                for j, w in enumerate(ws)})
        want = [ref.matmul(x, w) for w in ws]
        prog = build_model(workdir, y, flags=list(flags))
        c = (Path(workdir) / "model.c").read_text()
        fused = "--no-fuse=qkv" not in flags
        check(("_DISPATCH_COUNT 1u\n" in (Path(workdir) / "model.h").read_text()) == fused and
              (" + ".join(names) + " (matmul)" in c) == fused,
              "the products are not one dispatch" if fused else "fused with --no-fuse=qkv")
        got = run_program(prog, [x], [w.astype(np.float32) for w in want])
        for g, w in zip(got, want):
            assert_close(g, w, rtol, 2e-6 * k ** 0.5 * 4 + rtol)
    return test


for i, (xs, ws, fl, tol) in enumerate([
        ([4, 32], [16, 8, 24], (), 1e-5),                   # matvec, three outputs
        ([2, 40, 36], [20, 12], (), 1e-5),                  # tiled (vec4), two, batch folded
        ([3, 33, 7], [5, 6, 9], (), 1e-5),                  # tiled scalar, odd widths
        ([4, 32], [16, 8, 24], ("--weights", "int8"), 0.1),  # int8 B: its scales bound
        ([4, 32], [16, 8, 24], ("--no-fuse=qkv",), 1e-5)]):
    case(f"op matmul QKV split {xs} x {ws} {' '.join(fl)}".rstrip())(qkv_case(i, xs, ws, fl, tol))

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

# ---- reshape and transpose ----


def reshape_case(workdir):
    """A reshape is a view: its output feeds a dispatch in the new shape."""
    r = rng(600)
    x = values(r, [2, 3, 4])
    b = values(r, [4, 6])
    want = ref.BINARY["add"](x.reshape(4, 6), b)
    y = model_yaml("rs", {"x": spec(x), "b": spec(b)},
                   [{"name": "v", "op": "reshape", "inputs": ["x"], "shape": [4, -1]},
                    {"name": "y", "op": "add", "inputs": ["v", "b"]}], ["y"])
    got, = run_model(workdir, y, [x, b], [want.astype(np.float32)])
    assert_close(got, want, *BINARY_TOL["add"])


def reshape_output_case(workdir):
    """Outputs that are views of an input and of an intermediate."""
    r = rng(601)
    x = values(r, [6, 4])
    want1 = x.reshape(2, 12)
    want2 = ref.UNARY["relu"](x).reshape(24)
    y = model_yaml("rso", {"x": spec(x)},
                   [{"name": "v", "op": "reshape", "inputs": ["x"], "shape": [2, 12]},
                    {"name": "r", "op": "relu", "inputs": ["x"]},
                    {"name": "w", "op": "reshape", "inputs": ["r"], "shape": [-1]}],
                   ["v", "w"])
    got1, got2 = run_model(workdir, y, [x], [want1, want2.astype(np.float32)])
    assert_close(got1, want1, 0, 0, "view of the input")
    assert_close(got2, want2, 0, 0, "view of an intermediate")


case("op reshape [2, 3, 4] -> [4, -1] then add")(reshape_case)
case("op reshape outputs: views of an input and an intermediate")(reshape_output_case)

TRANSPOSE_CASES = [
    ([2, 3], None),
    ([2, 3, 4], [1, 0, 2]),
    ([2, 3, 4], [2, 1, 0]),
    ([3, 4, 5, 6], [0, 2, 3, 1]),
    ([5, 1, 7], [2, 1, 0]),
    ([2, 3, 4, 5, 3], [4, 2, 0, 3, 1]),
    ([256, 1024], [1, 0]),  # large
]


def transpose_case(i, shape, perm):
    def test(workdir):
        x = values(rng(700 + i), shape)
        want = ref.transpose(x, perm)
        node = {"name": "y", "op": "transpose", "inputs": ["x"]}
        if perm is not None:
            node["perm"] = perm
        y = model_yaml("tr", {"x": spec(x)}, [node], ["y"])
        got, = run_model(workdir, y, [x], [np.ascontiguousarray(want)])
        assert_close(got, want, 0, 0)
    return test


for i, (shape, perm) in enumerate(TRANSPOSE_CASES):
    case(f"op transpose {shape} perm={perm}")(transpose_case(i, shape, perm))


def zero_size_case(workdir):
    """A tensor with zero elements compiles and runs, with no dispatch."""
    a = np.zeros([0, 5], np.float32)
    b = values(rng(800), [5])
    y = model_yaml("z", {"a": spec(a), "b": spec(b)},
                   [{"name": "y", "op": "add", "inputs": ["a", "b"]},
                    {"name": "s", "op": "softmax", "inputs": ["y"]}], ["s"])
    got, = run_model(workdir, y, [a, b], [np.zeros([0, 5], np.float32)])
    assert_close(got, np.zeros([0, 5]), 0, 0)


case("op add and softmax on zero elements")(zero_size_case)


# ---- elementwise ops in other dtypes, attributes, comparisons, logic ----

def ints(r, shape, lo=-20, hi=20, dtype=np.int32):
    return r.integers(lo, hi, size=shape).astype(dtype)


def int_binary_case(op, dtype):
    def test(workdir):
        r = rng(900 + len(op))
        a = ints(r, [6, 33], dtype=dtype)
        b = ints(r, [33], 1, 9, dtype=dtype) * np.where(r.random(33) < 0.5, -1, 1).astype(dtype)
        want = {"add": a + b, "sub": a - b, "mul": a * b,
                "div": (np.abs(a) // np.abs(b)) * np.sign(a) * np.sign(b),
                "max": np.maximum(a, b), "min": np.minimum(a, b), "mod": np.mod(a, b)}[op]
        one_op(workdir, op, [a, b], want.astype(dtype))
    return test


for dtype in (np.int32, np.int64):
    for op in ("add", "sub", "mul", "div", "max", "min", "mod"):
        case(f"op {op} {np.dtype(dtype).name}")(int_binary_case(op, dtype))


@case("op mod fmod=1 (the dividend's sign)")
def _(workdir):
    r = rng(950)
    a, b = values(r, [40]), values(r, [40])
    b = ((np.sign(b) + (b == 0)) * (0.5 + np.abs(b))).astype(np.float32)
    one_op(workdir, "mod", [a, b], np.fmod(a.astype(np.float64), b), {"fmod": 1}, 1e-5, 1e-5)


@case("op pow: negative bases with integral exponents")
def _(workdir):
    r = rng(951)
    a = values(r, [50])
    b = r.integers(-3, 4, size=[50]).astype(np.float32)
    a[np.abs(a) < 0.2] = 0.7
    one_op(workdir, "pow", [a, b], np.power(a.astype(np.float64), b), rtol=1e-5, atol=1e-6)


@case("op add f16 [5, 37] + [37]")
def _(workdir):
    r = rng(952)
    a, b = values(r, [5, 37]).astype(np.float16), values(r, [37]).astype(np.float16)
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    one_op(workdir, "add", [a, b], want, rtol=1e-3, atol=1e-3)


def compare_case(op, dtype):
    def test(workdir):
        r = rng(960 + len(op))
        a = r.integers(-3, 4, size=[4, 9]).astype(dtype)  # ties happen
        b = r.integers(-3, 4, size=[9]).astype(dtype)
        one_op(workdir, op, [a, b], ref.COMPARE[op](a, b))
    return test


for op in ref.COMPARE:
    for dtype in (np.float32, np.int32):
        case(f"op {op} {np.dtype(dtype).name} -> bool")(compare_case(op, dtype))


def logical_case(op):
    def test(workdir):
        r = rng(970 + len(op))
        a, b = r.random([3, 1, 8]) < 0.5, r.random([5, 1]) < 0.5
        one_op(workdir, op, [a, b], ref.LOGICAL[op](a, b))
    return test


for op in ref.LOGICAL:
    case(f"op {op} bool [3, 1, 8] [5, 1]")(logical_case(op))


@case("op not bool [77]")
def _(workdir):
    a = rng(975).random([77]) < 0.5
    one_op(workdir, "not", [a], ~a)


@case("op where bool [4, 1] f32 [4, 6] f32 [6]")
def _(workdir):
    r = rng(976)
    c, x, y = r.random([4, 1]) < 0.5, values(r, [4, 6]), values(r, [6])
    one_op(workdir, "where", [c, x, y], np.where(c, x, y))


@case("op where with i64 values")
def _(workdir):
    r = rng(977)
    c, x, y = r.random([10]) < 0.5, ints(r, [10], dtype=np.int64), ints(r, [1], dtype=np.int64)
    one_op(workdir, "where", [c, x, y], np.where(c, x, y))


def int_unary_case(op, fn, attrs=None):
    def test(workdir):
        a = ints(rng(980 + len(op)), [7, 11])
        one_op(workdir, op, [a], fn(a).astype(np.int32), attrs)
    return test


for op, fn, attrs in [("neg", np.negative, None), ("abs", np.abs, None),
                      ("sign", np.sign, None), ("relu", lambda a: np.maximum(a, 0), None),
                      ("clip", lambda a: np.clip(a, -5, 7), {"min": -5, "max": 7})]:
    case(f"op {op} i32")(int_unary_case(op, fn, attrs))


def attr_case(op, attrs, fn, rtol=1e-5, atol=1e-6):
    def test(workdir):
        x = values(rng(990 + len(op)), [9, 13])
        one_op(workdir, op, [x], fn(x.astype(np.float64)), attrs, rtol, atol)
    return test


for op, attrs, fn in [
        ("leaky_relu", {"alpha": 0.2}, lambda x: np.where(x >= 0, x, 0.2 * x)),
        ("elu", {"alpha": 0.5}, lambda x: np.where(x >= 0, x, 0.5 * (np.exp(x) - 1))),
        ("hard_sigmoid", {"alpha": 0.1, "beta": 0.3}, lambda x: np.clip(0.1 * x + 0.3, 0, 1)),
        ("clip", {"min": -1.5}, lambda x: np.maximum(x, -1.5)),
        ("clip", {"min": -1, "max": 2.25}, lambda x: np.clip(x, -1, 2.25))]:
    case(f"op {op} {attrs}")(attr_case(op, attrs, fn))

CASTS = [(np.float32, "i32", np.int32), (np.float32, "bool", np.bool_),
         (np.bool_, "f32", np.float32), (np.int32, "f32", np.float32),
         (np.float32, "f16", np.float16), (np.float16, "f32", np.float32),
         (np.int64, "i32", np.int32), (np.float32, "i64", np.int64),
         (np.int32, "i64", np.int64), (np.uint8, "i32", np.int32),
         (np.int32, "i8", np.int8)]


def cast_case(src, to, dst):
    def test(workdir):
        r = rng(1000)
        if src == np.bool_:
            x = r.random([5, 8]) < 0.5
        elif np.dtype(src).kind in "iu":
            x = r.integers(0 if src == np.uint8 else -100, 100, size=[5, 8]).astype(src)
        else:
            x = values(r, [5, 8], 20.0).astype(src)
            x.reshape(-1)[:3] = [0, -0.0, 0.5]
        want = x.astype(dst)
        one_op(workdir, "cast", [x], want, {"to": to}, 1e-3 if dst == np.float16 else 0, 0)
    return test


for src, to, dst in CASTS:
    case(f"op cast {np.dtype(src).name} -> {to}")(cast_case(src, to, dst))

# ---- layout ----

SLICES = [
    ([10], {"starts": [2], "ends": [7]}),
    ([6, 8], {"starts": [1, -5], "ends": [5, 100], "axes": [0, 1]}),
    ([6, 8], {"starts": [-1], "ends": [-100], "axes": [1], "steps": [-2]}),
    ([4, 5, 6], {"starts": [0, 4], "ends": [4, 0], "axes": [2, 1], "steps": [3, -1]}),
    ([5, 7], {"starts": [3], "ends": [3], "axes": [0]}),  # empty
    ([64, 300], {"starts": [1, 7], "ends": [63, 290], "steps": [2, 3]}),
]


def slice_case(i, shape, attrs):
    def test(workdir):
        x = values(rng(1100 + i), shape)
        want = ref.slice_ref(x, attrs["starts"], attrs["ends"], attrs.get("axes"),
                             attrs.get("steps"))
        one_op(workdir, "slice", [x], np.ascontiguousarray(want), attrs)
    return test


for i, (shape, attrs) in enumerate(SLICES):
    case(f"op slice {shape} {attrs}")(slice_case(i, shape, attrs))


@case("op slice i64 with a negative step")
def _(workdir):
    x = ints(rng(1120), [9, 4], dtype=np.int64)
    attrs = {"starts": [7], "ends": [0], "steps": [-3]}
    one_op(workdir, "slice", [x], np.ascontiguousarray(x[7:0:-3]), attrs)


def concat_case(i, shapes, axis, dtype=np.float32):
    def test(workdir):
        r = rng(1200 + i)
        xs = [values(r, s).astype(dtype) if dtype != np.bool_ else r.random(s) < 0.5
              for s in shapes]
        one_op(workdir, "concat", xs, np.concatenate(xs, axis), {"axis": axis})
    return test


for i, (shapes, axis) in enumerate([([[2, 3], [4, 3]], 0), ([[2, 3], [2, 1], [2, 5]], 1),
                                    ([[2, 3, 4], [2, 3, 1]], -1),
                                    ([[3, 0, 2], [3, 4, 2]], 1)]):
    case(f"op concat {shapes} axis={axis}")(concat_case(i, shapes, axis))
case("op concat bool")(concat_case(9, [[3, 2], [3, 5]], 1, np.bool_))


def split_case(i, shape, axis, sizes, nout):
    def test(workdir):
        x = values(rng(1300 + i), shape)
        cuts = np.cumsum(sizes)[:-1] if sizes else nout
        wants = [np.ascontiguousarray(w) for w in np.split(x, cuts, axis)]
        node = {"name": "s", "op": "split", "inputs": ["x"], "axis": axis,
                "outputs": [f"o{k}" for k in range(nout)]}
        if sizes:
            node["sizes"] = sizes
        y = model_yaml("split", {"x": spec(x)}, [node], [f"o{k}" for k in range(nout)])
        gots = run_model(workdir, y, [x], wants)
        for k, (g, w) in enumerate(zip(gots, wants)):
            assert_close(g, w, 0, 0, f"output {k}")
    return test


case("op split [6, 4] axis 0 into 3")(split_case(0, [6, 4], 0, None, 3))
case("op split [2, 7, 3] axis 1 sizes [2, 4, 1]")(split_case(1, [2, 7, 3], 1, [2, 4, 1], 3))


@case("op expand [3, 1] -> [2, 3, 4]")
def _(workdir):
    x = values(rng(1400), [3, 1])
    one_op(workdir, "expand", [x], np.broadcast_to(x, [2, 3, 4]).copy(), {"shape": [2, 3, 4]})


@case("op tile [2, 3] x [3, 2] and [2, 1, 3] x [1, 4, 2]")
def _(workdir):
    x = values(rng(1401), [2, 3])
    one_op(workdir, "tile", [x], np.tile(x, [3, 2]), {"repeats": [3, 2]})


@case("op tile i32 [2, 1, 3] x [1, 4, 2]")
def _(workdir):
    x = ints(rng(1402), [2, 1, 3])
    one_op(workdir, "tile", [x], np.tile(x, [1, 4, 2]), {"repeats": [1, 4, 2]})


@case("op squeeze, unsqueeze, flatten (views) feeding a dispatch")
def _(workdir):
    r = rng(1403)
    x = values(r, [2, 1, 3, 1])
    nodes = [{"name": "s", "op": "squeeze", "inputs": ["x"], "axes": [1]},
             {"name": "u", "op": "unsqueeze", "inputs": ["s"], "axes": [0, -1]},
             {"name": "f", "op": "flatten", "inputs": ["u"], "axis": 2},
             {"name": "y", "op": "neg", "inputs": ["f"]},
             {"name": "z", "op": "squeeze", "inputs": ["x"]}]
    y = model_yaml("views", {"x": spec(x)}, nodes, ["y", "z"])
    want_y = -x.reshape(2, 3, 1)[None, ..., None].reshape(2, 3)
    want_z = x.reshape(2, 3)
    got_y, got_z = run_model(workdir, y, [x], [want_y, want_z])
    assert_close(got_y, want_y, 0, 0, "y")
    assert_close(got_z, want_z, 0, 0, "z")


def d2s_case(mode):
    def test(workdir):
        x = values(rng(1404), [2, 8, 3, 5])
        one_op(workdir, "depth_to_space", [x], ref.depth_to_space(x, 2, mode),
               {"block": 2, "mode": mode})
    return test


case("op depth_to_space DCR")(d2s_case("DCR"))
case("op depth_to_space CRD")(d2s_case("CRD"))


@case("op space_to_depth [2, 3, 4, 6] block 2")
def _(workdir):
    x = values(rng(1405), [2, 3, 4, 6])
    one_op(workdir, "space_to_depth", [x], ref.space_to_depth(x, 2), {"block": 2})

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

# ---- gemm: transposes, bias, alpha/beta, fused activation ----

GEMMS = [  # M, K, N, trans_a, trans_b, bias shape, alpha, beta, activation
    (5, 7, 3, 0, 0, None, 1.0, 1.0, "none"),
    (5, 7, 3, 1, 0, [3], 1.0, 1.0, "relu"),
    (33, 65, 17, 0, 1, [33, 17], 0.5, 2.0, "gelu"),
    (64, 64, 64, 1, 1, [1], 1.0, -1.0, "silu"),
    (8, 16, 130, 0, 1, [8, 1], 2.0, 0.5, "tanh"),
    (4, 9, 6, 0, 0, [6], 1.0, 1.0, "sigmoid"),
    (7, 3, 5, 1, 0, [5], 1.0, 1.0, "gelu_tanh"),
]


def gemm_case(i, M, K, N, ta, tb, bias, alpha, beta, act):
    def test(workdir):
        r = rng(2100 + i)
        a = values(r, [K, M] if ta else [M, K], 1.0)
        b = values(r, [N, K] if tb else [K, N], 1.0)
        ins = [a, b] + ([values(r, bias, 1.0)] if bias else [])
        want = ref.gemm(*ins, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, activation=act)
        attrs = {"alpha": alpha, "beta": beta, "trans_a": ta, "trans_b": tb, "activation": act}
        one_op(workdir, "gemm", ins, want, attrs, 1e-5, 1e-5 * K)
    return test


for i, g in enumerate(GEMMS):
    case(f"op gemm M={g[0]} K={g[1]} N={g[2]} ta={g[3]} tb={g[4]} bias={g[5]} "
         f"alpha={g[6]} beta={g[7]} act={g[8]}")(gemm_case(i, *g))

# ---- indexing ----

GATHERS = [([5, 4], [3], 0, np.int64), ([3, 6, 2], [2, 2], 1, np.int32),
           ([4, 7], [5], -1, np.int64), ([10, 3], [4, 1, 2], 0, np.int32)]


def gather_case(i, shape, ishape, axis, idt):
    def test(workdir):
        r = rng(2200 + i)
        x = values(r, shape)
        n = shape[axis]
        idx = r.integers(-n, n, size=ishape).astype(idt)
        one_op(workdir, "gather", [x, idx], np.take(x, idx, axis), {"axis": axis})
    return test


for i, g in enumerate(GATHERS):
    case(f"op gather data={g[0]} indices={g[1]} axis={g[2]} {np.dtype(g[3]).name}")(
        gather_case(i, *g))


@case("op gather of i64 data")
def _(workdir):
    r = rng(2210)
    x = ints(r, [6, 3], dtype=np.int64)
    idx = np.array([5, 0, 0, 2], np.int32)
    one_op(workdir, "gather", [x, idx], x[idx], {"axis": 0})


@case("op embedding ids [2, 5] table [11, 8]")
def _(workdir):
    r = rng(2211)
    ids, table = r.integers(0, 11, size=[2, 5]).astype(np.int32), values(r, [11, 8])
    one_op(workdir, "embedding", [ids, table], table[ids])


@case("op gather_elements [4, 5] axis 1 and axis 0")
def _(workdir):
    r = rng(2212)
    x = values(r, [4, 5])
    idx = r.integers(-5, 5, size=[4, 3]).astype(np.int64)
    want = np.take_along_axis(x, np.where(idx < 0, idx + 5, idx), 1)
    one_op(workdir, "gather_elements", [x, idx], want, {"axis": 1})


@case("op gather_elements [3, 4, 2] axis 0, i32")
def _(workdir):
    r = rng(2213)
    x = values(r, [3, 4, 2])
    idx = r.integers(0, 3, size=[2, 4, 2]).astype(np.int32)
    one_op(workdir, "gather_elements", [x, idx], np.take_along_axis(x, idx, 0), {"axis": 0})


def scatter_case(op, reduction, i):
    def test(workdir):
        r = rng(2220 + i)
        x = values(r, [6, 5], 1.0)
        if reduction == "none":  # distinct targets: duplicates are undefined
            idx = np.stack([r.permutation(6)[:4] for _ in range(5)], 1).astype(np.int64)
        else:
            idx = r.integers(-6, 6, size=[4, 5]).astype(np.int64)
        u = values(r, [4, 5], 1.0)
        attrs = {"axis": 0}
        if op == "scatter_elements":
            attrs["reduction"] = reduction
        want = ref.scatter_elements(x, idx, u, 0, reduction)
        one_op(workdir, op, [x, idx, u], want, attrs, 1e-5, 1e-5)
    return test


for i, red in enumerate(["none", "add", "mul", "max", "min"]):
    case(f"op scatter_elements reduction={red}")(scatter_case("scatter_elements", red, i))
case("op scatter_add with repeated indices")(scatter_case("scatter_add", "add", 9))


@case("op scatter_add many updates to few places (atomics)")
def _(workdir):
    r = rng(2230)
    x = values(r, [3, 64], 1.0)
    idx = r.integers(0, 3, size=[2000, 64]).astype(np.int32)
    u = values(r, [2000, 64], 1.0)
    want = x.astype(np.float64).copy()
    for j in range(64):
        np.add.at(want[:, j], idx[:, j], u[:, j].astype(np.float64))
    one_op(workdir, "scatter_add", [x, idx, u], want, {"axis": 0}, 1e-4, 1e-4)


@case("op one_hot [2, 3] depth 5 (negative and out-of-range indices)")
def _(workdir):
    idx = np.array([[0, 4, -1], [7, 2, -5]], np.int64)
    one_op(workdir, "one_hot", [idx], ref.one_hot(idx, 5), {"depth": 5})


@case("op one_hot axis 0 with on and off values")
def _(workdir):
    idx = np.array([1, 0, 2, 2], np.int32)
    one_op(workdir, "one_hot", [idx], ref.one_hot(idx, 3, 0, 4.0, -1.0),
           {"depth": 3, "axis": 0, "on_value": 4, "off_value": -1})


for i, (upper, k) in enumerate([(1, 0), (0, 0), (1, 2), (0, -1), (1, -3)]):
    def trilu_case(workdir, upper=upper, k=k, i=i):
        x = values(rng(2240 + i), [2, 5, 7])
        want = np.triu(x, k) if upper else np.tril(x, k)
        one_op(workdir, "trilu", [x], want, {"upper": upper, "k": k})
    case(f"op trilu upper={upper} k={k}")(trilu_case)

PADS = [([3, 4], [1, 2, 0, 3], "constant", 1.5), ([3, 4], [2, 1, 2, 3], "reflect", 0),
        ([2, 3, 4], [0, 1, 2, 1, 0, 3], "edge", 0), ([5, 6], [-1, 2, 1, -2], "constant", 0),
        ([1, 2, 5, 5], [0, 0, 2, 2, 0, 0, 2, 2], "reflect", 0)]
for i, (shape, pads, mode, value) in enumerate(PADS):
    def pad_case(workdir, shape=shape, pads=pads, mode=mode, value=value, i=i):
        x = values(rng(2250 + i), shape)
        one_op(workdir, "pad", [x], ref.pad(x, pads, mode, value),
               {"pads": pads, "mode": mode, "value": value})
    case(f"op pad {shape} {pads} {mode}")(pad_case)


@case("op pad i32 with a constant")
def _(workdir):
    x = ints(rng(2260), [2, 3])
    one_op(workdir, "pad", [x], np.pad(x, [(1, 0), (0, 2)], constant_values=7),
           {"pads": [1, 0, 0, 2], "value": 7})

# ---- attention and rope ----

ATTENTIONS = [  # layout, B, H, KVH, Sq, Sk, D, DV, attrs, mask shape
    ("bhsd", 1, 2, 2, 5, 5, 8, 8, {}, None),
    ("bhsd", 2, 4, 2, 7, 7, 16, 16, {"causal": 1}, None),  # grouped-query
    ("bhsd", 1, 2, 1, 3, 9, 8, 4, {"causal": 1}, None),    # Sq < Sk (a KV cache)
    ("bshd", 2, 4, 4, 6, 6, 8, 8, {"scale": 0.3}, None),
    ("bshd", 1, 6, 2, 5, 5, 4, 4, {"causal": 1, "window": 3}, None),
    ("bhsd", 2, 2, 2, 4, 6, 8, 8, {"softcap": 5.0, "scale": 1.0}, [2, 1, 1, 6]),
    ("bhsd", 1, 2, 2, 300, 300, 64, 64, {"causal": 1}, [300, 300]),  # long rows
    ("bshd", 1, 2, 1, 1, 40, 32, 32, {}, [1, 40]),  # one query row, decode
]


def attention_case(i, layout, B, H, KVH, Sq, Sk, D, DV, attrs, mshape):
    def test(workdir):
        r = rng(2300 + i)
        if layout == "bhsd":
            q, k, v = values(r, [B, H, Sq, D], 1), values(r, [B, KVH, Sk, D], 1), \
                values(r, [B, KVH, Sk, DV], 1)
        else:
            q, k, v = values(r, [B, Sq, H * D], 1), values(r, [B, Sk, KVH * D], 1), \
                values(r, [B, Sk, KVH * DV], 1)
        ins = [q, k, v]
        if mshape:
            ins.append(values(r, mshape, 2.0))
        a = {"layout": layout}
        if layout == "bshd":
            a.update({"heads": H, "kv_heads": KVH})
        a.update(attrs)
        want = ref.attention(*ins[:3], ins[3] if mshape else None, layout,
                             H if layout == "bshd" else None, KVH if layout == "bshd" else None,
                             attrs.get("scale"), attrs.get("softcap", 0),
                             attrs.get("causal", 0), attrs.get("window", 0))
        one_op(workdir, "attention", ins, want, a, 1e-4, 1e-5, names=["q", "k", "v", "m"])
    return test


for i, c in enumerate(ATTENTIONS):
    case(f"op attention {c[0]} B={c[1]} H={c[2]} KVH={c[3]} Sq={c[4]} Sk={c[5]} D={c[6]} "
         f"DV={c[7]} {c[8]} mask={c[9]}")(attention_case(i, *c))

ROPES = [([2, 3, 6, 8], {}), ([2, 3, 6, 8], {"interleaved": 1}),
         ([1, 5, 2, 16], {"n_rot": 8, "seq_axis": 1}),
         ([1, 2, 7, 10], {"n_rot": 6, "interleaved": 1})]


def rope_case(i, shape, attrs):
    def test(workdir):
        r = rng(2400 + i)
        x = values(r, shape)
        axis = attrs.get("seq_axis", -2)
        rot = attrs.get("n_rot", shape[-1])
        pos = np.arange(shape[axis])[:, None] * (10000.0 ** (-np.arange(rot // 2) / (rot // 2)))
        cos, sin = np.cos(pos).astype(np.float32), np.sin(pos).astype(np.float32)
        want = ref.rope(x, cos, sin, attrs.get("interleaved", 0), attrs.get("n_rot"), axis)
        one_op(workdir, "rope", [x, cos, sin], want, attrs, 1e-5, 1e-5)
    return test


for i, (shape, attrs) in enumerate(ROPES):
    case(f"op rope {shape} {attrs}")(rope_case(i, shape, attrs))

# ---- convolution, pooling, resize ----

CONVS = [  # x shape, w shape, attrs, bias
    ([1, 2, 9], [3, 2, 3], {}, True),                                          # 1-D
    ([2, 3, 7, 8], [4, 3, 3, 3], {"pads": [1, 1, 1, 1]}, True),                # 2-D
    ([1, 4, 9, 9], [6, 2, 3, 3], {"strides": [2, 2], "group": 2}, False),       # groups
    ([1, 2, 10, 9], [2, 2, 3, 2], {"dilations": [2, 1], "pads": [2, 0, 1, 1]}, True),
    ([1, 3, 7, 6], [3, 1, 3, 3], {"group": 3, "auto_pad": "same_upper"}, True),  # depthwise
    ([1, 2, 8, 7], [2, 2, 2, 3], {"strides": [2, 2], "auto_pad": "same_lower"}, False),
    ([1, 2, 6, 6], [3, 2, 3, 3], {"auto_pad": "valid"}, True),
    ([1, 2, 5, 6, 4], [3, 2, 2, 3, 2], {"pads": [1, 0, 1, 0, 1, 1]}, True),   # 3-D
    # channels split over invocations (conv.comp SPLIT): 32 ways, 48 channels
    # (some invocations take two); 4 ways within groups; one way (65,536 outputs)
    ([1, 48, 6, 6], [8, 48, 3, 3], {"pads": [1, 1, 1, 1]}, True),
    ([1, 8, 9, 9], [4, 4, 3, 3], {"group": 2}, True),
    ([1, 4, 130, 130], [4, 4, 3, 3], {}, True),
]


def conv_geometry(xs, ws, attrs):
    """Explicit pads for auto_pad, from ONNX's rules."""
    a = dict(attrs)
    mode = a.pop("auto_pad", None)
    nsp = len(xs) - 2
    if mode in ("same_upper", "same_lower"):
        st = a.get("strides", [1] * nsp)
        pb, pe = [], []
        for i in range(nsp):
            out = -(-xs[2 + i] // st[i])
            total = max(0, (out - 1) * st[i] + ws[2 + i] - xs[2 + i])
            small = total // 2
            b = small if mode == "same_upper" else total - small
            pb.append(b)
            pe.append(total - b)
        a["pads"] = pb + pe
    return a


def conv_case(i, xs, ws, attrs, bias):
    def test(workdir):
        r = rng(2500 + i)
        x, w = values(r, xs, 1.0), values(r, ws, 1.0)
        ins = [x, w] + ([values(r, [ws[0]], 1.0)] if bias else [])
        a = conv_geometry(xs, ws, attrs)
        want = ref.conv(x, w, ins[2] if bias else None, a.get("strides"), a.get("pads"),
                        a.get("dilations"), a.get("group", 1))
        one_op(workdir, "conv", ins, want, attrs, 1e-5, 1e-4)
    return test


for i, c in enumerate(CONVS):
    case(f"op conv x={c[0]} w={c[1]} {c[2]} bias={c[3]}")(conv_case(i, *c))


def conv_activation_case(act):
    def test(workdir):
        r = rng(2520)
        x, w, b = values(r, [1, 3, 6, 6], 1.0), values(r, [4, 3, 3, 3], 1.0), values(r, [4], 1.0)
        want = ref.ACTIVATIONS[act](ref.conv(x, w, b, pads=[1, 1, 1, 1]))
        one_op(workdir, "conv", [x, w, b], want, {"pads": [1, 1, 1, 1], "activation": act},
               1e-5, 1e-4)
    return test


# every ACTIVATION row of ops.def, as conv's activation attribute
for act in sorted(set(ref.ACTIVATIONS) - {"none"}):
    case(f"op conv with a fused {act}")(conv_activation_case(act))


def epilogue_case(kind, flags=()):
    """Fusion into a conv or matmul epilogue (optimize.c): a conv's
    residual add and activation ("residual": one dispatch); an add whose
    other input a later node makes ("later": not fused, since the epilogue
    runs at the conv's or matmul's place); a broadcast residual."""
    def test(workdir):
        r = rng(2525)
        x, w, b = values(r, [1, 4, 8, 8], 1.0), values(r, [4, 4, 3, 3], 1.0), values(r, [4], 1.0)
        res = values(r, [1, 1, 8, 1] if kind == "broadcast" else [1, 4, 8, 8], 1.0)
        conv = ref.conv(x, w, b, pads=[1, 1, 1, 1])
        ins = {"x": spec(x), "w": spec(w), "b": spec(b), "r": spec(res)}
        nodes = [{"name": "c", "op": "conv", "inputs": ["x", "w", "b"], "pads": [1, 1, 1, 1]}]
        if kind == "later":
            nodes.append({"name": "z", "op": "exp", "inputs": ["r"]})
            nodes.append({"name": "s", "op": "add", "inputs": ["c", "z"]})
            want = np.maximum(conv + np.exp(res.astype(np.float64)), 0)
        else:
            nodes.append({"name": "s", "op": "add", "inputs": ["r", "c"]})
            want = np.maximum(conv + res, 0)
        nodes.append({"name": "y", "op": "relu", "inputs": ["s"]})
        if kind == "matmul":  # the later operand of a matmul's bias add
            a, m = values(r, [6, 9], 1.0), values(r, [9, 5], 1.0)
            res = values(r, [6, 5], 1.0)
            ins = {"a": spec(a), "m": spec(m), "r": spec(res)}
            nodes = [{"name": "p", "op": "matmul", "inputs": ["a", "m"]},
                     {"name": "z", "op": "exp", "inputs": ["r"]},
                     {"name": "y", "op": "add", "inputs": ["p", "z"]}]
            want = a.astype(np.float64) @ m + np.exp(res.astype(np.float64))
        inputs = [v for v in (x, w, b, res)] if kind != "matmul" else [a, m, res]
        prog = build_model(workdir, model_yaml("epi", ins, nodes, ["y"]), flags=list(flags))
        got, = run_program(prog, inputs, [want.astype(np.float32)])
        assert_close(got, want, 1e-5, 1e-4)
        header = (Path(workdir) / "model.h").read_text()
        if kind == "residual":
            one = "--no-fuse=epilogue" not in flags
            check(("_DISPATCH_COUNT 1u\n" in header) == one and
                  ("c + s + y (conv)" in (Path(workdir) / "model.c").read_text()) == one,
                  "the residual and relu in the conv's dispatch" if one else "not fused")
    return test


case("op conv + residual add + relu: one dispatch")(epilogue_case("residual"))
case("op conv + residual add + relu with --no-fuse=epilogue")(
    epilogue_case("residual", ["--no-fuse=epilogue"]))
case("op conv + add of a tensor made after the conv: not in its epilogue")(
    epilogue_case("later"))
case("op conv + broadcast add + relu")(epilogue_case("broadcast"))
case("op matmul + add of a tensor made after the matmul: not in its epilogue")(
    epilogue_case("matmul"))


CONV_TS = [([1, 2, 4, 5], [2, 3, 3, 3], {}, True),
           ([1, 4, 3, 3], [4, 1, 3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2},
            False),
           ([2, 2, 4, 3], [2, 2, 2, 2], {"strides": [2, 3], "output_padding": [1, 0],
                                         "dilations": [1, 2]}, True)]


def conv_t_case(i, xs, ws, attrs, bias):
    def test(workdir):
        r = rng(2530 + i)
        x, w = values(r, xs, 1.0), values(r, ws, 1.0)
        g = attrs.get("group", 1)
        ins = [x, w] + ([values(r, [ws[1] * g], 1.0)] if bias else [])
        want = ref.conv_transpose(x, w, ins[2] if bias else None, attrs.get("strides"),
                                  attrs.get("pads"), attrs.get("dilations"), g,
                                  attrs.get("output_padding"))
        one_op(workdir, "conv_transpose", ins, want, attrs, 1e-5, 1e-4)
    return test


for i, c in enumerate(CONV_TS):
    case(f"op conv_transpose x={c[0]} w={c[1]} {c[2]} bias={c[3]}")(conv_t_case(i, *c))

POOLS = [  # kind, x shape, attrs
    ("max", [1, 2, 9], {"kernel": [3], "strides": [2]}),
    ("max", [2, 3, 7, 8], {"kernel": [2, 2], "strides": [2, 2]}),
    ("max", [1, 2, 7, 7], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                           "ceil_mode": 1}),
    ("max", [1, 1, 8, 8], {"kernel": [2, 2], "dilations": [2, 2]}),
    ("avg", [1, 2, 7, 7], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("avg", [1, 2, 7, 7], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                           "count_include_pad": 1}),
    ("avg", [1, 2, 6, 7], {"kernel": [3, 2], "strides": [2, 2], "ceil_mode": 1,
                           "count_include_pad": 1, "pads": [1, 0, 1, 0]}),
    ("avg", [1, 2, 4, 5, 6], {"kernel": [2, 2, 3], "strides": [1, 2, 2]}),
]


def pool_case(i, kind, xs, attrs):
    def test(workdir):
        x = values(rng(2540 + i), xs)
        want = ref.pool(x, attrs["kernel"], kind, attrs.get("strides"), attrs.get("pads"),
                        attrs.get("dilations"), attrs.get("ceil_mode", 0),
                        attrs.get("count_include_pad", 0))
        one_op(workdir, f"{kind}_pool", [x], want, attrs, 1e-6, 1e-6)
    return test


for i, c in enumerate(POOLS):
    case(f"op {c[0]}_pool {c[1]} {c[2]}")(pool_case(i, *c))


@case("op global_avg_pool and global_max_pool [2, 3, 5, 4]")
def _(workdir):
    x = values(rng(2560), [2, 3, 5, 4])
    one_op(workdir, "global_avg_pool", [x], x.astype(np.float64).mean((2, 3), keepdims=True),
           None, 1e-6, 1e-6)


@case("op global_max_pool [1, 4, 3, 3, 2]")
def _(workdir):
    x = values(rng(2561), [1, 4, 3, 3, 2])
    one_op(workdir, "global_max_pool", [x], x.max((2, 3, 4), keepdims=True))


RESIZES = [  # x shape, attrs (scales or sizes), mode, coord, nearest
    ([1, 1, 3, 4], {"scales": [1, 1, 2, 2]}, "nearest", "asymmetric", "floor"),
    ([1, 2, 4, 4], {"scales": [1, 1, 2, 2]}, "nearest", "half_pixel", "round_prefer_floor"),
    ([1, 2, 5, 3], {"sizes": [1, 2, 3, 7]}, "nearest", "half_pixel", "round_prefer_ceil"),
    ([1, 2, 4, 4], {"scales": [1, 1, 2, 2]}, "linear", "half_pixel", None),
    ([1, 1, 3, 5], {"sizes": [1, 1, 7, 4]}, "linear", "align_corners", None),
    ([2, 3, 6], {"scales": [1, 1, 0.5]}, "linear", "pytorch_half_pixel", None),
    ([1, 1, 4, 6], {"sizes": [1, 1, 5, 9]}, "linear", "asymmetric", None),
    ([1, 1, 5, 5], {"scales": [1, 1, 1.5, 0.6]}, "nearest", "asymmetric", "ceil"),
]


def resize_case(i, xs, geom, mode, coord, nearest):
    def test(workdir):
        x = values(rng(2570 + i), xs)
        if "sizes" in geom:
            out, scales = geom["sizes"], None
        else:
            scales = geom["scales"]
            out = [int(np.floor(n * s)) for n, s in zip(xs, scales)]
        attrs = dict(geom, mode=mode, coordinate_transformation_mode=coord)
        if nearest:
            attrs["nearest_mode"] = nearest
        want = ref.resize(x, out, mode, coord, nearest or "round_prefer_floor",
                          [np.float32(s) for s in scales] if scales else None)
        one_op(workdir, "resize", [x], want, attrs, 1e-5, 1e-5)
    return test


for i, c in enumerate(RESIZES):
    case(f"op resize {c[0]} {c[1]} {c[2]} {c[3]} {c[4]}")(resize_case(i, *c))

# ---- topk, sample, selective_scan ----

TOPKS = [([7], 3, -1, 1), ([4, 50], 5, 1, 1), ([4, 50], 4, 1, 0), ([6, 5, 3], 2, 0, 1),
         ([3, 2000], 8, -1, 1), ([2, 9], 9, -1, 0)]


def topk_case(i, shape, k, axis, largest):
    def test(workdir):
        x = rng(2600 + i).integers(-6, 7, size=shape).astype(np.float32)  # ties
        wv, wi = ref.topk(x, k, axis, largest)
        node = {"name": "t", "op": "topk", "inputs": ["x"], "k": k, "axis": axis,
                "largest": largest, "outputs": ["v", "i"]}
        y = model_yaml("topk", {"x": spec(x)}, [node], ["v", "i"])
        gv, gi = run_model(workdir, y, [x], [wv, wi])
        assert_close(gv, wv, 0, 0, "values")
        check_equal(gi, wi, "indices")
    return test


def check_equal(got, want, what):
    from harness import Failure
    if got.shape != want.shape or (got != want).any():
        bad = np.argwhere(got != want)[0] if got.shape == want.shape else None
        raise Failure(f"{what}: differ at {bad}: got {got[tuple(bad)] if bad is not None else got.shape}"
                      f", expected {want[tuple(bad)] if bad is not None else want.shape}")


for i, c in enumerate(TOPKS):
    case(f"op topk {c[0]} k={c[1]} axis={c[2]} largest={c[3]}")(topk_case(i, *c))


def sample_model(logits, attrs):
    node = {"name": "s", "op": "sample", "inputs": ["logits", "seed"]}
    node.update(attrs)
    return model_yaml("sample", {"logits": spec(logits), "seed": {"dtype": "i64", "shape": [1]}},
                      [node], ["s"])


@case("op sample: temperature 0 and top_k 1 are the argmax")
def _(workdir):
    logits = values(rng(2700), [16, 100])
    want = np.argmax(logits, -1).astype(np.int64)
    for attrs in ({"temperature": 0}, {"top_k": 1, "temperature": 2.0}):
        got, = run_model(workdir, sample_model(logits, attrs),
                         [logits, np.array([7], np.int64)], [want])
        check_equal(got, want, f"{attrs}")


def sample_distribution_case(attrs, seed):
    def test(workdir):
        rows = 4000
        base = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 1.5], np.float32)
        logits = np.tile(base, (rows, 1))
        t = attrs.get("temperature", 1.0)
        p = np.exp(base / t - (base / t).max())
        p /= p.sum()
        order = np.argsort(-base, kind="stable")
        keep = np.zeros(6, bool)
        k = attrs.get("top_k", 0) or 6
        mass = 0.0
        for j, idx in enumerate(order[:k]):
            if mass >= attrs.get("top_p", 1.0):
                break
            keep[idx] = True
            mass += p[idx]
        q = np.where(keep, p, 0)
        q /= q.sum()
        prog_out, = run_model(workdir, sample_model(logits, attrs),
                              [logits, np.array([seed], np.int64)],
                              [np.zeros(rows, np.int64)])
        freq = np.bincount(prog_out, minlength=6) / rows
        from harness import Failure
        if (freq[~keep] > 0).any():
            raise Failure(f"sampled outside the allowed set: freq {freq}, allowed {keep}")
        if np.abs(freq - q).max() > 0.035:
            raise Failure(f"frequencies {np.round(freq, 3)} differ from {np.round(q, 3)}")
    return test


for attrs in ({}, {"temperature": 0.5}, {"top_k": 3}, {"top_p": 0.6}, {"top_k": 4, "top_p": 0.9,
                                                                       "temperature": 1.5}):
    case(f"op sample distribution {attrs}")(sample_distribution_case(attrs, 12345))


@case("op sample: a seed reproduces its draws, another seed changes them")
def _(workdir):
    from harness import build_model, run_program, Failure
    logits = np.zeros([500, 50], np.float32)
    prog = build_model(workdir, sample_model(logits, {}))
    want = np.zeros(500, np.int64)
    a, = run_program(prog, [logits, np.array([1], np.int64)], [want])
    b, = run_program(prog, [logits, np.array([1], np.int64)], [want])
    c, = run_program(prog, [logits, np.array([1 << 40], np.int64)], [want])
    check_equal(a, b, "same seed")
    if (a == c).mean() > 0.2:
        raise Failure("another seed drew nearly the same tokens")
    if len(np.unique(a)) < 30:
        raise Failure("rows drew too few distinct tokens from a uniform distribution")


SCANS = [(1, 5, 3, 4, False, False, False), (2, 17, 6, 16, True, False, True),
         (1, 40, 4, 256, True, True, True), (3, 9, 5, 33, False, True, False)]


def scan_case(i, bt, L, dim, N, has_d, has_z, softplus):
    def test(workdir):
        r = rng(2800 + i)
        u, delta = values(r, [bt, L, dim], 1.0), values(r, [bt, L, dim], 0.5)
        if not softplus:
            delta = np.abs(delta).astype(np.float32)
        A = (-np.abs(values(r, [dim, N], 1.0))).astype(np.float32)
        B, C = values(r, [bt, L, N], 1.0), values(r, [bt, L, N], 1.0)
        ins = [u, delta, A, B, C]
        if has_d or has_z:
            ins.append(values(r, [dim], 1.0))
        if has_z:
            ins.append(values(r, [bt, L, dim], 1.0))
        want = ref.selective_scan(*ins[:5], ins[5] if len(ins) > 5 else None,
                                  ins[6] if len(ins) > 6 else None, softplus)
        one_op(workdir, "selective_scan", ins, want, {"delta_softplus": int(softplus)},
               1e-4, 1e-4, names=["u", "dt", "A", "B", "C", "D", "z"])
    return test


for i, c in enumerate(SCANS):
    case(f"op selective_scan batch={c[0]} L={c[1]} dim={c[2]} N={c[3]} D={c[4]} z={c[5]} "
         f"softplus={c[6]}")(scan_case(i, *c))


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
