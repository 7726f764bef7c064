"""test_ops_eltwise.py: elementwise ops: binary with broadcasting, unary, other
dtypes, attributes, comparisons, logic, cast (shaders/eltwise.comp), on
Vulkan against the CPU reference (ops_common.py says how).
"""
import numpy as np

import reference as ref
from harness import assert_close, check, model_yaml, registry, run_model
from ops_common import ints, one_op, rng, spec, values

TESTS, case = registry()


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


# ---- elementwise ops in other dtypes, attributes, comparisons, logic ----

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


def bitwise_case(op, dtype):
    def test(workdir):
        r = rng(960 + len(op))
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -2**40), min(info.max, 2**40)
        a = r.integers(lo, hi, [5, 17], endpoint=True).astype(dtype)
        b = r.integers(lo, hi, [17], endpoint=True).astype(dtype)
        want = {"bit_and": a & b, "bit_or": a | b, "bit_xor": a ^ b, "bit_not": ~a}[op]
        one_op(workdir, op, [a] if op == "bit_not" else [a, b], want.astype(dtype))
    return test


for dtype in (np.int32, np.int64, np.uint8, np.int8):
    for op in ("bit_and", "bit_or", "bit_xor", "bit_not"):
        case(f"op {op} {np.dtype(dtype).name}")(bitwise_case(op, dtype))


@case("op shift_left and shift_right u8 (amounts 0 to 9: 8 and more give 0)")
def _(workdir):
    r = rng(970)
    a = r.integers(0, 256, [6, 20]).astype(np.uint8)
    b = r.integers(0, 10, [20]).astype(np.uint8)
    wide = a.astype(np.int64)
    one_op(workdir, "shift_left", [a, b],
           np.where(b < 8, (wide << b.astype(np.int64)) & 255, 0).astype(np.uint8))
    one_op(workdir, "shift_right", [a, b],
           np.where(b < 8, wide >> b.astype(np.int64), 0).astype(np.uint8))


def signed_shift_case(dtype):
    """Signed shifts (ONNX BitShift 28): arithmetic right shifts, left shifts
    past the sign bit wrapping, and amounts that are negative or not below
    the width (-1 for a right shift of a negative value, else 0)."""
    def test(workdir):
        r = rng(975)
        bits = np.iinfo(dtype).bits
        info = np.iinfo(dtype)
        a = r.integers(info.min, info.max, [6, 24], endpoint=True).astype(dtype)
        b = r.integers(-3, bits + 4, [24]).astype(dtype)
        big = [int(x) for x in a.ravel()]
        sh = [int(x) for x in np.broadcast_to(b, a.shape).ravel()]
        inside = [0 <= s < bits for s in sh]

        def wrap(v):  # to the signed range of the dtype
            v &= (1 << bits) - 1
            return v - (1 << bits) if v >> (bits - 1) else v
        left = [wrap(x << s) if ok else 0 for x, s, ok in zip(big, sh, inside)]
        right = [x >> s if ok else (-1 if x < 0 else 0) for x, s, ok in zip(big, sh, inside)]
        one_op(workdir, "shift_left", [a, b], np.array(left, dtype).reshape(a.shape))
        one_op(workdir, "shift_right", [a, b], np.array(right, dtype).reshape(a.shape))
    return test


for dtype in (np.int8, np.int32, np.int64):
    case(f"op shift_left and shift_right {np.dtype(dtype).name} (signed, every amount)")(
        signed_shift_case(dtype))


@case("op mod f32 at infinities, zeros and NaN (ONNX Mod 28's cases)")
def _(workdir):
    inf, nan = np.inf, np.nan
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, inf, -inf, 3.0, nan, 2.0, -7.25, 7.25], np.float32)
    b = np.array([inf, inf, -inf, -inf, 2.0, 2.0, 3.0, 0.0, 1.0, nan, 2.5, -2.5], np.float32)
    with np.errstate(all="ignore"):
        one_op(workdir, "mod", [a, b], np.mod(a, b).astype(np.float32))
        one_op(workdir, "mod", [a, b], np.fmod(a, b).astype(np.float32), attrs={"fmod": 1})


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
