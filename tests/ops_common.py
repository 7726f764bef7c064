"""ops_common.py: what the op tests (tests/test_ops_*.py) share.

Each op case builds a one- or two-node model with random shapes and values
(never all zeros: normal values scaled to cover negatives and large
magnitudes), runs it with kiln, and compares every element with
reference.py under the op's tolerance. Shapes include odd sizes, size-1
dimensions, broadcasting, sizes that are not multiples of the workgroup
size, and one large case per op.
"""
import numpy as np

from harness import Failure, assert_close, build_model, model_yaml, run_program


def rng(seed):
    return np.random.default_rng(seed)


def values(r, shape, scale=3.0):
    return (r.standard_normal(shape) * scale).astype(np.float32)


DTYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16",
          np.dtype(np.int32): "i32", np.dtype(np.int64): "i64",
          np.dtype(np.bool_): "bool", np.dtype(np.uint8): "u8", np.dtype(np.int8): "i8"}


def ints(r, shape, lo=-20, hi=20, dtype=np.int32):
    return r.integers(lo, hi, size=shape).astype(dtype)


def spec(a):
    return {"dtype": DTYPES[np.asarray(a).dtype], "shape": list(np.shape(a))}


def half(a):
    """a's values rounded to f16, as f64: the reference's operands under
    --precision f16 (the kernels compute in f32 on f16-stored values)."""
    return np.asarray(a).astype(np.float16).astype(np.float64)


def weight_specs(**arrays):
    """A model's weights, one per keyword, as f32 values written inline."""
    return {k: {"dtype": "f32", "shape": list(np.shape(a)),
                "values": np.asarray(a, dtype=np.float32).ravel().tolist()}
            for k, a in arrays.items()}


def one_op(workdir, op, inputs, want, attrs=None, rtol=0, atol=0, names="abcdef", guard=True,
           env=None):
    """A model of one node over `inputs`; compares with `want`. guard=False
    compiles without --guard (which fails a run on an index outside its
    axis): for the tests of what such an index gives by default. env: added
    to the compiler's environment (a KILN_* kernel choice)."""
    ins = {names[i]: spec(x) for i, x in enumerate(inputs)}
    node = {"name": "y", "op": op, "inputs": list(ins)}
    node.update(attrs or {})
    y = model_yaml(op, ins, [node], ["y"])
    want = np.asarray(want)
    got, = run_program(build_model(workdir, y, guard=guard, env=env), list(inputs), [want])
    if want.dtype.kind in "biu":
        bad = got != want
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            raise Failure(f"{int(bad.sum())} of {want.size} elements differ; first at "
                          f"{list(i)}: got {got[i]!r}, expected {want[i]!r}")
    else:
        assert_close(got, want, rtol, atol)
