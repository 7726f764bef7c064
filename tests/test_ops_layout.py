"""test_ops_layout.py: layout: reshape, transpose, slice, concat, split,
expand, tile, views, depth_to_space (shaders/index.comp), on Vulkan against
the CPU reference (ops_common.py says how).
"""
import json
import subprocess
from pathlib import Path

import numpy as np

import reference as ref
from harness import (KILN, assert_close, assert_relative, build_model, check, check_kernels,
                     kiln, model_yaml, registry, run_model, run_program)
from ops_common import half, ints, one_op, rng, spec, values, weight_specs

TESTS, case = registry()


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
    assert_close(got, want, 1e-6, 1e-6)  # add's tolerance


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


def transpose_read_case(precision, shared):
    """A transpose read only by an elementwise group of its shape (ConvNeXt's
    permute back to channels first, then its layer scale and residual add):
    the group reads its input through permuted strides, one dispatch, no
    copy (optimize.c, fuse_transpose_reads); with a second reader (shared)
    the transpose stays its own copy. With --precision f16 the operands are
    stored in f16."""
    def test(workdir):
        r = rng(760)
        x, res, g = values(r, [2, 5, 6, 3]), values(r, [2, 3, 5, 6]), values(r, [3, 1, 1])
        nodes = [{"name": "t", "op": "transpose", "inputs": ["x"], "perm": [0, 3, 1, 2]},
                 {"name": "m", "op": "mul", "inputs": ["t", "g"]},
                 {"name": "y", "op": "add", "inputs": ["m", "res"]}]
        outs = ["y"]
        if shared:
            nodes.append({"name": "z", "op": "neg", "inputs": ["t"]})
            outs.append("z")
        y = model_yaml("trr", {"x": spec(x), "res": spec(res)}, nodes, outs, weight_specs(g=g))
        flags = ("--precision", "f16") if precision == "f16" else ()
        prog = build_model(workdir, y, flags=flags)
        q = half if precision == "f16" else np.asarray
        t = np.transpose(q(x), [0, 3, 1, 2])
        want = [q(t * q(g)) + q(res)] + ([-t] if shared else [])
        got = run_program(prog, [x, res], [w.astype(np.float32) for w in want])
        tol = 2e-3 if precision == "f16" else 1e-6
        for a, b in zip(got, want):
            assert_close(a, b, tol, tol)
        c = (Path(workdir) / "model.c").read_text()
        fused = "t + m + y (add)" in c
        check(fused != shared, f"the transpose {'is' if fused else 'is not'} in the group")
        if not shared:
            check_kernels(workdir, {"eltwise"})
            check(c.count("(transpose)") == 0, "a transpose dispatch remains")
    return test


for prec in ("f32", "f16"):
    case(f"op transpose read by an elementwise group, {prec}")(transpose_read_case(prec, False))
case("op transpose with a second reader stays a copy")(transpose_read_case("f32", True))


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
        one_op(workdir, "concat", xs, np.concatenate(xs, axis), {"axis": axis},
               names=[f"x{i}" for i in range(len(xs))])
    return test


for i, (shapes, axis) in enumerate([([[2, 3], [4, 3]], 0), ([[2, 3], [2, 1], [2, 5]], 1),
                                    ([[2, 3, 4], [2, 3, 1]], -1),
                                    ([[3, 0, 2], [3, 4, 2]], 1)]):
    case(f"op concat {shapes} axis={axis}")(concat_case(i, shapes, axis))
case("op concat bool")(concat_case(9, [[3, 2], [3, 5]], 1, np.bool_))
# Pieces copied by one concat.comp dispatch: in 16-byte units (every width
# and offset a multiple), two rows of the output; f16 and int64 elements.
case("op concat in 16-byte units, two rows")(
    concat_case(7, [[2, 4, 8], [2, 12, 8], [2, 4, 8]], 1))
case("op concat f16")(concat_case(8, [[3, 5], [3, 2], [3, 9]], 1, np.float16))
case("op concat int64")(concat_case(6, [[4, 3], [1, 3], [2, 3]], 0, np.int64))
# Parts whose bytes are not a multiple of the storage-buffer alignment: with
# --sync-check (every test compiles with it) each part's write descriptor
# starts rounded down into its neighbour's last unit; no hazard may be
# reported, since the writes do not overlap.
for _n, _len in [(4, 30), (5, 7), (8, 30), (16, 3)]:
    case(f"op concat of {_n} [{_len}] parts (not 16-byte multiples)")(
        concat_case(10 + _n, [[_len]] * _n, 0))


def concat_in_place_case(batch, precision):
    """Pieces computed by kernels land in the concatenation directly at
    batch 1 (each piece's region one block of the output): a relu, a 1 x 1
    convolution's output read again by a later node, a reshape of a product
    (the product writes in place through the view), a piece given twice
    (its second region copied), and an input (copied; the copies by one
    dispatch). At batch 2 the regions are strided: every piece is copied.
    Every element against numpy."""
    def test(workdir):
        r = rng(770 + batch)
        x = values(r, [batch, 4, 5, 6])
        w = values(r, [6, 4, 1, 1])
        wm = values(r, [30, 30])
        nodes = [{"name": "a", "op": "relu", "inputs": ["x"]},
                 {"name": "c", "op": "conv", "inputs": ["x", "w"]},
                 {"name": "f", "op": "reshape", "inputs": ["x"], "shape": [batch, 4, 30]},
                 {"name": "m", "op": "matmul", "inputs": ["f", "wm"]},
                 {"name": "mr", "op": "reshape", "inputs": ["m"], "shape": [batch, 4, 5, 6]},
                 {"name": "y", "op": "concat", "inputs": ["a", "c", "mr", "a", "x"], "axis": 1},
                 {"name": "z", "op": "neg", "inputs": ["c"]}]
        y = model_yaml("cip", {"x": spec(x)}, nodes, ["y", "z"], weight_specs(w=w, wm=wm))
        flags = ("--precision", "f16") if precision == "f16" else ()
        prog = build_model(workdir, y, flags=flags)
        q = half if precision == "f16" else np.asarray
        xq = q(x)
        a = np.maximum(xq, 0)
        c = q(np.einsum("nchw,oc->nohw", xq, q(w[:, :, 0, 0])))
        m = q(xq.reshape(batch, 4, 30) @ q(wm)).reshape(batch, 4, 5, 6)
        want = [np.concatenate([a, c, m, a, xq], 1), -c]
        got = run_program(prog, [x], [v.astype(np.float32) for v in want])
        for j, (g_, w_) in enumerate(zip(got, want)):
            if precision == "f16":  # which values kiln keeps f32 is its own choice
                assert_relative(g_, w_, 1e-2, f"output {j}")
            else:
                assert_close(g_, w_, 1e-5, 1e-5)
        # batch 1: the piece given twice and the input copied, by one
        # dispatch; in f16 the convolution's f16 output by its own (a cast
        # into the f32 result). Batch 2: all five by one.
        copies = (Path(workdir) / "model.c").read_text().count("(concat)")
        want_copies = 2 if batch == 1 and precision == "f16" else 1
        check(copies == want_copies, f"{copies} concat dispatches, expected {want_copies}")
    return test


for _b, _p in ((1, "f32"), (1, "f16"), (2, "f32")):
    case(f"op concat of computed pieces at batch {_b}, {_p}: in place where a block")(
        concat_in_place_case(_b, _p))


def dense_block_case(batch):
    """DenseNet's dense block: each layer concatenates the features so far
    (a prefix of the next layer's pieces) and adds its own. At batch 1
    every concat's output is a view of the last one's and each piece is
    written once, in place: no copy. At batch 2 every piece is copied, one
    dispatch a concat."""
    def test(workdir):
        r = rng(780 + batch)
        x = values(r, [batch, 4, 5, 6])
        ws = [values(r, [3, 4 + 3 * k, 1, 1]) for k in range(3)]
        nodes = [{"name": "x0", "op": "relu", "inputs": ["x"]}]
        feats = ["x0"]
        for k in range(3):
            src = feats[0] if k == 0 else f"c{k}"
            nodes.append({"name": f"f{k + 1}", "op": "conv", "inputs": [src, f"w{k}"]})
            feats.append(f"f{k + 1}")
            nodes.append({"name": f"c{k + 1}", "op": "concat", "inputs": list(feats), "axis": 1})
        nodes.append({"name": "z", "op": "neg", "inputs": ["c1"]})
        y = model_yaml("dense", {"x": spec(x)}, nodes, ["c3", "z"],
                       weight_specs(**{f"w{k}": w for k, w in enumerate(ws)}))
        prog = build_model(workdir, y)
        f = [np.maximum(x, 0)]
        cats = []
        for k in range(3):
            src = f[0] if k == 0 else cats[-1]
            f.append(np.einsum("nchw,oc->nohw", src, ws[k][:, :, 0, 0]))
            cats.append(np.concatenate(f, 1))
        got = run_program(prog, [x], [cats[2], -cats[0]])
        for g_, w_ in zip(got, [cats[2], -cats[0]]):
            assert_close(g_, w_, 1e-5, 1e-5)
        copies = (Path(workdir) / "model.c").read_text().count("(concat)")
        want_copies = 0 if batch == 1 else 3  # one dispatch a concat
        check(copies == want_copies, f"{copies} concat dispatches, expected {want_copies}")
    return test


for _b in (1, 2):
    case(f"op concat chain of a dense block at batch {_b}: one buffer, no copy at batch 1")(
        dense_block_case(_b))


@case("op concat of slices: a roll along H and W and Swin's patch merging, no slice copied")
def _(workdir):
    """torch.roll as the exporter writes it (two slices joined in the other
    order, along H: blocks, then W: strided) and Swin's patch merging
    (x[:, 0::2, 0::2], x[:, 1::2, 0::2], ... concatenated along channels:
    slices of slices, one slice read by two): the concats read each piece
    through the slices' offsets and strides; no slice is a dispatch."""
    r = rng(790)
    x = values(r, [1, 6, 8, 3])
    nodes = [{"name": "a0", "op": "slice", "inputs": ["x"], "starts": [2], "ends": [6], "axes": [1]},
             {"name": "a1", "op": "slice", "inputs": ["x"], "starts": [0], "ends": [2], "axes": [1]},
             {"name": "rh", "op": "concat", "inputs": ["a0", "a1"], "axis": 1},
             {"name": "b0", "op": "slice", "inputs": ["rh"], "starts": [3], "ends": [8], "axes": [2]},
             {"name": "b1", "op": "slice", "inputs": ["rh"], "starts": [0], "ends": [3], "axes": [2]},
             {"name": "roll", "op": "concat", "inputs": ["b0", "b1"], "axis": 2},
             {"name": "e", "op": "slice", "inputs": ["roll"], "starts": [0], "ends": [6],
              "axes": [1], "steps": [2]},
             {"name": "o", "op": "slice", "inputs": ["roll"], "starts": [1], "ends": [6],
              "axes": [1], "steps": [2]}]
    parts = []
    for rows in ("e", "o"):
        for c in (0, 1):
            nodes.append({"name": f"{rows}{c}", "op": "slice", "inputs": [rows], "starts": [c],
                          "ends": [8], "axes": [2], "steps": [2]})
            parts.append(f"{rows}{c}")
    nodes += [{"name": "m", "op": "concat", "inputs": [parts[0], parts[2], parts[1], parts[3]],
               "axis": 3},
              {"name": "y", "op": "neg", "inputs": ["m"]}]
    prog = build_model(workdir, model_yaml("slices", {"x": spec(x)}, nodes, ["y"]))
    rolled = np.roll(x, (-2, -3), (1, 2))
    want = -np.concatenate([rolled[:, 0::2, 0::2], rolled[:, 1::2, 0::2],
                            rolled[:, 0::2, 1::2], rolled[:, 1::2, 1::2]], 3)
    y, = run_program(prog, [x], [want])
    assert_close(y, want, 0, 0)
    c = (Path(workdir) / "model.c").read_text()
    check(c.count("(Slice)") == 0 and " slice " not in c.split("*/")[0],
          "a slice is a dispatch of its own")
    # a concat's copies write disjoint elements of interleaved byte ranges:
    # no barrier between them (but under --sync-check, which the suite's
    # builds use: the validation layer sees ranges only)
    r = subprocess.run([str(KILN), "inspect", str(Path(workdir) / "model.yaml"), "--format",
                        "json"], capture_output=True, text=True)
    ds = json.loads(r.stdout)["dispatches"]
    inner = [d["barrier"] for a, d in zip(ds, ds[1:]) if a["node"] == d["node"]]
    check(len(inner) == 4 and not any(inner), f"barriers between a concat's copies: {inner}")
    # --precision f16: the fused slices take their source's dtype, so the
    # concats copy f16 to f16 (no f32 piece, no cast)
    d16 = Path(workdir) / "f16"
    d16.mkdir()
    flags = ("--precision", "f16", "--io", "f16")
    prog = build_model(d16, model_yaml("slices", {"x": spec(x)}, nodes, ["y"]), flags=flags)
    y, = run_program(prog, [x.astype(np.float16)], [want.astype(np.float16)])
    assert_close(y.astype(np.float32), want.astype(np.float16).astype(np.float32), 0, 0)
    r = subprocess.run([str(KILN), "inspect", str(d16 / "model.yaml"), "--format", "json",
                        *flags], capture_output=True, text=True)
    info = json.loads(r.stdout)
    kinds = {t["name"]: t["dtype"] for t in info["tensors"]}
    ops = [d["op"] for d in info["dispatches"]]
    check("cast" not in ops and all(kinds[t] == "f16" for t in ("rh", "roll", "m")),
          f"f16 build: dispatches {ops}, dtypes {kinds}")


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


@case("op slice, split and gather of contiguous blocks read by another op are views: no "
      "copy dispatch, the reader binds the block's offset")
def _(workdir):
    """Each block (rows 2..5 of [6, 4, 3], parts of [1, 6, 4] along axis 1,
    index -2 of [3, 2, 5]) read by a tanh; the block itself is no dispatch,
    the tanh reads it at its offset in x. Against numpy, every element, and
    kiln inspect's dispatch count (the tanh alone, or one a part)."""
    r = rng(1330)
    x3, x1, xg = values(r, [6, 4, 3]), values(r, [1, 6, 4]), values(r, [3, 2, 5])
    cases = [  # what, x, the node viewing it (input "a"), its weights, the outputs
        ("slice", x3, {"op": "slice", "inputs": ["a"], "starts": [2], "ends": [5],
                       "outputs": ["v0"]}, None, [np.tanh(x3[2:5])]),
        ("split", x1, {"op": "split", "inputs": ["a"], "axis": 1, "sizes": [1, 3, 2],
                       "outputs": ["v0", "v1", "v2"]}, None,
         [np.tanh(p) for p in np.split(x1, [1, 4], 1)]),
        # the index a weight, as exporters write qkv[1]
        ("gather", xg, {"op": "gather", "inputs": ["a", "b"], "axis": 0, "outputs": ["v0"]},
         {"b": {"dtype": "i64", "shape": [], "values": [-2]}}, [np.tanh(xg[-2])]),
    ]
    for what, x, view, weights, wants in cases:
        d = Path(workdir) / what
        d.mkdir()
        nodes = [{"name": "v", **view}] + [{"name": f"t{k}", "op": "tanh",
                                            "inputs": [f"v{k}"], "outputs": [f"y{k}"]}
                                           for k in range(len(wants))]
        y = model_yaml(what, {"a": spec(x)}, nodes, [f"y{k}" for k in range(len(wants))],
                       weights=weights)
        gots = run_program(build_model(d, y), [x], wants)
        for k, (g, w) in enumerate(zip(gots, wants)):
            assert_close(g, w, 1e-6, 1e-6, f"{what} output {k}")
        res = kiln("inspect", d / "model.yaml", "--format", "json")
        check(res.returncode == 0, res.stderr)
        ds = json.loads(res.stdout)["dispatches"]
        check(len(ds) == len(wants) and all(e["family"] == "eltwise" for e in ds),
              f"{what}: dispatches {[(e['node'], e['family']) for e in ds]}")


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
