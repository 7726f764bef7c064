"""test_ops_index.py: indexing: gather, gather_nd, embedding, gather_elements, scatter,
one_hot, trilu, pad (shaders/index.comp, scatter.comp), on Vulkan against
the CPU reference (ops_common.py says how).
"""
from pathlib import Path

import numpy as np

import reference as ref
from harness import (assert_close, build_model, check, model_yaml, registry, run_program,
                     run_program_raw)
from ops_common import ints, one_op, rng, spec, values

TESTS, case = registry()


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


@case("op gather, gather_elements, trilu and pad of bool and u8 data")
def _(workdir):
    # index.comp chooses between the source element and a fill value by a
    # branch: a select of 8-bit values would need the Int8 capability
    # (validation caught it in an exported decoder's GatherND of its mask).
    r = rng(2214)
    for dt in (np.bool_, np.uint8):
        def sub(op):  # one model a directory
            d = Path(workdir) / f"{op}_{dt.__name__}"
            d.mkdir()
            return d
        x = (r.integers(0, 2, size=[5, 4]) if dt == np.bool_ else
             r.integers(0, 256, size=[5, 4])).astype(dt)
        idx = r.integers(-7, 7, size=[3]).astype(np.int64)  # some outside: 0
        want = np.zeros([3, 4], dt)
        for j, i in enumerate(idx):
            if -5 <= i < 5:
                want[j] = x[i]
        one_op(sub("gather"), "gather", [x, idx], want, {"axis": 0}, guard=False)
        e = r.integers(-4, 4, size=[5, 2]).astype(np.int64)
        one_op(sub("gather_elements"), "gather_elements", [x, e],
               np.take_along_axis(x, np.where(e < 0, e + 4, e), 1), {"axis": 1})
        one_op(sub("trilu"), "trilu", [x], np.triu(x, 1), {"upper": 1, "k": 1})
        one_op(sub("pad"), "pad", [x], np.pad(x, [(1, 0), (0, 2)]), {"pads": [1, 0, 0, 2]})


@case("op gather_elements and gather_nd of the model's f16 data under --precision f16")
def _(workdir):
    # Their rule keeps f32 (precision.c, F32): data the model declares f16
    # stays f16 for them as without --precision, not cast to f32 while the
    # result stays f16 (index.comp then read f32 into f16: no kernel).
    r = rng(2215)
    x = values(r, [6, 5, 4]).astype(np.float16)
    e = r.integers(-5, 5, size=[6, 3, 4]).astype(np.int64)
    nd = r.integers(0, 5, size=[4, 2]).astype(np.int64)
    ins = {"x": spec(x), "e": spec(e), "nd": spec(nd)}
    nodes = [{"name": "ye", "op": "gather_elements", "inputs": ["x", "e"], "axis": 1},
             {"name": "yn", "op": "gather_nd", "inputs": ["x", "nd"]}]
    prog = build_model(workdir, model_yaml("f16data", ins, nodes, ["ye", "yn"]),
                       flags=("--precision", "f16"))
    want_e = np.take_along_axis(x, np.where(e < 0, e + 5, e), 1)
    want_n = x[nd[:, 0], nd[:, 1]]
    got_e, got_n = run_program(prog, [x, e, nd], [want_e, want_n])
    for got, want, name in ((got_e, want_e, "gather_elements"), (got_n, want_n, "gather_nd")):
        if got.dtype != np.float16 or not np.array_equal(got, want):
            raise AssertionError(f"{name}: {got.dtype}, "
                                 f"{int((got != want).sum())} of {want.size} differ")


def gather_nd_want(x, idx, b):
    """ONNX GatherND (numpy, one tuple at a time): zeros for a tuple with an
    index outside its dimension (kiln's choice; ONNX leaves it undefined)."""
    k = idx.shape[-1]
    lead = idx.shape[:-1]
    out = np.zeros(lead + x.shape[b + k:], x.dtype)
    for t in np.ndindex(*lead):
        tup = idx[t]
        dims = x.shape[b:b + k]
        if any(not -d <= int(i) < d for i, d in zip(tup, dims)):
            continue
        src = x[t[:b]] if b else x
        out[t] = src[tuple(int(i) % d for i, d in zip(tup, dims))]
    return out


GATHER_NDS = [([5, 4, 3], [6, 2], 0, np.int64), ([5, 4, 3], [2, 3, 1], 0, np.int32),
              ([4, 6], [7, 2], 0, np.int64), ([2, 5, 3, 2], [2, 4, 2], 1, np.int64),
              ([3, 4], [3, 1], 1, np.int32)]


def gather_nd_case(i, shape, ishape, b, idt):
    def test(workdir):
        r = rng(2230 + i)
        x = values(r, shape)
        k = ishape[-1]
        dims = np.array(shape[b:b + k])
        # in range, negative, and (every few) outside: zeros
        idx = r.integers(-dims - 1, dims + 1, size=ishape).astype(idt)
        one_op(workdir, "gather_nd", [x, idx], gather_nd_want(x, idx, b), {"batch_dims": b},
               guard=False)
    return test


for i, g in enumerate(GATHER_NDS):
    case(f"op gather_nd data={g[0]} indices={g[1]} batch_dims={g[2]} "
         f"{np.dtype(g[3]).name}")(gather_nd_case(i, *g))


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


@case("op gather, gather_nd, gather_elements, one_hot and scatter_elements with i64 indices "
      "past 2^31 and 2^32: outside, never taken as their low 32 bits")
def _(workdir):
    r = rng(2240)
    x = values(r, [5, 4])
    big = [2 ** 32 + 1, -(2 ** 32) + 2, 2 ** 31, -(2 ** 31) - 1]
    idx = np.array([1] + big + [-1], np.int64)

    def sub(op):
        d = Path(workdir) / op
        d.mkdir()
        return d
    want = np.zeros([len(idx), 4], np.float32)
    want[0], want[-1] = x[1], x[-1]
    one_op(sub("gather"), "gather", [x, idx], want, {"axis": 0}, guard=False)
    nd = np.stack([idx, np.ones_like(idx)], 1)  # tuples (i, 1)
    want_nd = np.zeros([len(idx)], np.float32)
    want_nd[0], want_nd[-1] = x[1, 1], x[-1, 1]
    one_op(sub("gather_nd"), "gather_nd", [x, nd], want_nd, guard=False)
    e = np.array([[0, 2 ** 32 + 1, 3, -(2 ** 32) + 1]] * 5, np.int64)
    want_e = np.zeros([5, 4], np.float32)
    want_e[:, 0], want_e[:, 2] = x[:, 0], x[:, 3]
    one_op(sub("gather_elements"), "gather_elements", [x, e], want_e, {"axis": 1}, guard=False)
    oh = np.array([2, 2 ** 32 + 2], np.int64)
    want_oh = np.zeros([2, 5], np.float32)
    want_oh[0, 2] = 1
    one_op(sub("one_hot"), "one_hot", [oh], want_oh, {"depth": 5, "axis": -1})
    s_idx = np.array([[2 ** 32 + 1, 1, 2, 3], [0, 2 ** 32, 4, -(2 ** 32) + 1]], np.int64)
    u = values(r, [2, 4], 1.0)
    want_s = np.array(x, np.float64)
    for (a, b), v in np.ndenumerate(u):
        i = int(s_idx[a, b])
        if -5 <= i < 5:
            want_s[i, b] = v
    one_op(sub("scatter"), "scatter_elements", [x, s_idx, u], want_s, {"axis": 0}, 1e-6, 1e-6,
           guard=False)


@case("op gather, gather_nd, gather_elements, scatter_elements, embedding: a run-time index "
      "outside its axis fails a --guard run, naming the node, the index and where")
def _(workdir):
    """Each model with every index inside runs and matches numpy; with one
    index outside, the run fails with KILN_ERROR_OUT_OF_BOUNDS and the
    runtime's message."""
    r = rng(2241)
    x, u, table = values(r, [5, 4]), values(r, [2, 4]), values(r, [11, 3])
    i64, i32 = np.int64, np.int32
    cases = [  # op, attrs, inputs with every index inside, the indices with one outside, message
        ("gather", {"axis": 0}, [x, np.array([1, -2, 4, 0], i64)], np.array([1, -2, 5, 0], i64),
         "'b' into axis 0 of 'a': index 5 (element 2 of the indices) is outside the axis, "
         "of size 5"),
        ("gather_elements", {"axis": 1}, [x, np.array([[0, 1, 2, 3]] * 5, i32)],
         np.array([[0, 1, 2, 3]] * 4 + [[0, -9, 1, 2]], i32),
         "index -9 (element 17 of the indices) is outside the axis, of size 4"),
        ("gather_nd", {}, [x, np.array([[1, 1], [4, 3], [0, 3]], i64)],
         np.array([[1, 1], [4, 4], [0, 3]], i64),
         "'b' into 'a': index 4 (element 3 of the indices) is outside the axis, of size 4"),
        ("scatter_elements", {"axis": 0}, [x, np.array([[0, 1, 2, 3], [4, 2, 1, 0]], i64), u],
         np.array([[0, 1, 2, 3], [4, 6, 1, 0]], i64),
         "index 6 (element 5 of the indices) is outside the axis, of size 5"),
        ("embedding", {}, [np.array([[3, 10]], i64), table], np.array([[3, 11]], i64),
         "'a' into axis 0 of 'b': index 11 (element 1 of the indices) is outside the axis, "
         "of size 11"),
    ]
    for op, attrs, good, bad_idx, message in cases:
        d = Path(workdir) / op
        d.mkdir()
        k = 0 if op == "embedding" else 1  # where the indices are
        names = "abc"[:len(good)]
        node = {"name": f"my_{op}", "op": op, "inputs": list(names), **attrs}
        prog = build_model(d, model_yaml(op, {n: spec(v) for n, v in zip(names, good)}, [node],
                                         [f"my_{op}"]))
        want = {"gather": lambda: np.take(x, good[1], 0),
                "gather_elements": lambda: np.take_along_axis(x, good[1], 1),
                "gather_nd": lambda: gather_nd_want(x, good[1], 0),
                "scatter_elements": lambda: ref.scatter_elements(x, good[1], u, 0, "none"),
                "embedding": lambda: table[good[0]]}[op]()
        got, = run_program(prog, good, [np.asarray(want, np.float32)])
        assert_close(got, want, 1e-6, 1e-6, f"{op}, every index inside")
        bad = list(good)
        bad[k] = bad_idx
        res = run_program_raw(prog, bad)
        check(res.returncode == 1 and "KILN_ERROR_OUT_OF_BOUNDS" in res.stderr and
              f"node 'my_{op}' ({op})" in res.stderr and message in res.stderr,
              f"{op}: status {res.returncode}, stderr:\n{res.stderr[-1500:]}")


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


@case("op pad by nothing (Swin's pad to whole windows that are whole already): a view")
def _(workdir):
    x = values(rng(2265), [1, 4, 6, 3])
    nodes = [{"name": "p", "op": "pad", "inputs": ["x"], "pads": [0] * 8},
             {"name": "y", "op": "neg", "inputs": ["p"]},
             {"name": "z", "op": "pad", "inputs": ["x"], "pads": [0] * 8, "mode": "reflect"}]
    prog = build_model(workdir, model_yaml("pad0", {"x": spec(x)}, nodes, ["y", "z"]))
    y, z = run_program(prog, [x], [x, x])
    assert_close(y, -x, 0, 0)
    assert_close(z, x, 0, 0)  # a model output: still copied, not a view
    c = (Path(workdir) / "model.c").read_text()
    check(c.count("(pad)") == 1, f"{c.count('(pad)')} pad dispatches, expected 1 (the output)")


@case("op pad i32 with a constant")
def _(workdir):
    x = ints(rng(2260), [2, 3])
    one_op(workdir, "pad", [x], np.pad(x, [(1, 0), (0, 2)], constant_values=7),
           {"pads": [1, 0, 0, 2], "value": 7})
