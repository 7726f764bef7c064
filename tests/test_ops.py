"""test_ops.py: every op on Vulkan against the CPU reference.

Each case builds a one- or two-node model with random shapes and values
(never all zeros: normal values scaled to cover negatives and large
magnitudes), runs it with kiln, and compares every element with
reference.py under the op's tolerance. Shapes include odd sizes, size-1
dimensions, broadcasting, sizes that are not multiples of the workgroup
size, and one large case per op.
"""
import numpy as np

import reference as ref
from harness import assert_close, model_yaml, registry, run_model

TESTS, case = registry()


def rng(seed):
    return np.random.default_rng(seed)


def values(r, shape, scale=3.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


def spec(a):
    return {"dtype": "f32", "shape": list(np.shape(a))}


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
              "div": (2e-6, 1e-6)}


def binary_case(op, i, sa, sb):
    def test(workdir):
        r = rng(100 * i + len(op))
        a = values(r, sa)
        b = values(r, sb)
        if op == "div":  # keep the divisor away from zero
            b = (np.sign(b) + (b == 0)) * (0.5 + np.abs(b))
            b = b.astype(np.float32)
        want = ref.BINARY[op](a, b)
        y = model_yaml(op, {"a": spec(a), "b": spec(b)},
                       [{"name": "y", "op": op, "inputs": ["a", "b"]}], ["y"])
        got, = run_model(workdir, y, [a, b], [want.astype(np.float32)])
        assert_close(got, want, *BINARY_TOL[op])
    return test


for op in ref.BINARY:
    for i, (sa, sb) in enumerate(BINARY_SHAPES):
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
             "sigmoid": (1e-5, 1e-7), "tanh": (1e-5, 1e-6), "exp": (1e-5, 0)}


def unary_case(op, i, shape):
    def test(workdir):
        r = rng(200 * i + len(op))
        x = values(r, shape, 4.0)
        flat = x.reshape(-1)
        # Exercise the tails: large magnitudes of both signs.
        edge = np.array([-60.0, -20.0, -5.5, 0.0, 1e-4, 5.5, 20.0, 60.0], np.float32)
        if op == "exp":
            edge = np.clip(edge, -80, 80)
        flat[:min(flat.size, edge.size)] = edge[:flat.size]
        want = ref.UNARY[op](x)
        y = model_yaml(op, {"x": spec(x)},
                       [{"name": "y", "op": op, "inputs": ["x"]}], ["y"])
        got, = run_model(workdir, y, [x], [want.astype(np.float32)])
        assert_close(got, want, *UNARY_TOL[op])
    return test


for op in ref.UNARY:
    for i, shape in enumerate(UNARY_SHAPES):
        case(f"op {op} {shape}")(unary_case(op, i, shape))

# ---- matmul ----

MATMUL_SHAPES = [
    ([1, 1], [1, 1]),
    ([5, 7], [7, 3]),
    ([64, 64], [64, 64]),
    ([33, 65], [65, 17]),
    ([3, 5, 7], [3, 7, 4]),        # batched
    ([2, 3, 5, 7], [7, 6]),        # broadcast weights
    ([2, 1, 4, 8], [1, 3, 8, 5]),  # broadcast batch dimensions
    ([4, 9], [2, 9, 3]),           # 2-D times batched
    ([7], [7, 3]),                 # vector times matrix
    ([4, 7], [7]),                 # matrix times vector
    ([130, 100], [100, 70]),
    ([256, 512], [512, 384]),      # large
]


def matmul_case(i, sa, sb):
    def test(workdir):
        r = rng(300 + i)
        a = values(r, sa, 1.0)
        b = values(r, sb, 1.0)
        want = ref.matmul(a, b)
        y = model_yaml("mm", {"a": spec(a), "b": spec(b)},
                       [{"name": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"])
        got, = run_model(workdir, y, [a, b], [want.astype(np.float32)])
        k = sa[-1]
        assert_close(got, want, 1e-5, 2e-6 * k ** 0.5 * 4)
    return test


for i, (sa, sb) in enumerate(MATMUL_SHAPES):
    case(f"op matmul {sa} {sb}")(matmul_case(i, sa, sb))


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

# ---- softmax ----

SOFTMAX_SHAPES = [[1, 1], [3, 10], [4, 1000], [2, 3, 257], [7], [64, 4096]]


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
