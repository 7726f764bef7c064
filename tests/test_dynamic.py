"""test_dynamic.py: dynamic dimensions (`dims: {seq: 1..64}`).

Each model is compiled once, for the largest extents, and run by one
process at several extents in a row (1, a few in between, the largest, and
back down: nothing is re-recorded between them), each run's inputs drawn at
that extent. Every output element of every run is compared with
tests/reference.py evaluated at that extent. Extents outside the declared
range are a run-time error; graphs kiln cannot run dynamically are located
compile errors.
"""
import json
import re
from pathlib import Path

import numpy as np

import reference as ref
from harness import (F16_TOLERANCE, VALIDATION, assert_close, assert_relative, build_model,
                     check, kernel_defines, kiln, link_model, model_yaml, precision_compare,
                     registry, run)
from test_quant import a_int8, dequantized

TESTS, case = registry()

SEQ = [1, 3, 64, 17, 2, 64, 1]  # seq: 1..64, up and down


def dyn_yaml(dims, inputs, nodes, outputs, weights=None):
    doc = json.loads(model_yaml("dyn", inputs, nodes, outputs, weights))
    return json.dumps({"name": doc.pop("name"), "dims": dims, **doc}, indent=1)


# matvec_k in 4 teams of 32 with A in shared memory (a tuning hook; the
# default for fixed-shape int4 products only)
TEAMS = {"KILN_MATVEC_K": "128,4,1,4,1"}
# int4 weights with A as 8-bit integers in matvec_k.comp (runs of up to 4 rows)
A8 = ("--weights", "int4", "--activations", "int8")


def a_rows(x, flags, seq):
    """x as the product multiplies it: a_int8(x) for --activations int8 on
    matvec_k.comp's runs (up to 4 rows), else as it is (float64)."""
    return a_int8(x) if "--activations" in flags and seq <= 4 else ref.f64(x)


def build_tuned(sub, y, flags, env):
    """build_model with the compiler's share of a case's environment (its
    tuning hooks: KILN_MATVEC_K, matvec_k's teams and A in shared memory),
    which must reach the kernel."""
    tuning = {k: v for k, v in env.items() if k.startswith("KILN_MATVEC")}
    prog = build_model(sub, y, flags=flags, env=tuning)
    check(not tuning or "TEAMS 4" in (sub / "model.c").read_text(),
          "KILN_MATVEC_K's teams did not reach the kernel")
    return prog


def run_steps(workdir, yaml_text, steps, make_inputs, reference, rtol=1e-5, atol=1e-5,
              flags=(), extra_args=()):
    """steps: a list of {dim: value}; make_inputs(rng, **dims) -> arrays;
    reference(*arrays, **dims) -> expected outputs."""
    workdir = Path(workdir)
    run_built(build_model(workdir, yaml_text, flags=flags), steps, make_inputs, reference,
              rtol, atol, extra_args)


def run_built(prog, steps, make_inputs, reference, rtol=1e-5, atol=1e-5, extra_args=(),
              compare=None, env=None):
    """run_steps on a model program already built (in its directory);
    compare(got, want, what) replaces assert_close when given; env adds to
    the program's environment."""
    workdir = Path(prog).parent
    rng = np.random.default_rng(7)
    wanted = []
    for s, dims in enumerate(steps):
        ins = make_inputs(rng, **dims)
        for i, a in enumerate(ins):
            np.ascontiguousarray(a).tofile(workdir / f"in{i}_{s}.bin")
        wanted.append([np.asarray(w) for w in reference(*ins, **dims)])
        nin = len(ins)
    args = [prog, "-q", "--steps", str(len(steps))]
    for name in steps[0]:
        args += ["-d", f"{name}=" + ",".join(str(d[name]) for d in steps)]
    args += [a for i in range(nin) for a in ("-i", workdir / f"in{i}_%d.bin")]
    args += [a for i in range(len(wanted[0])) for a in ("-o", workdir / f"out{i}_%d.bin")]
    r = run(args + list(extra_args), cwd=workdir,
            env={"KILN_VALIDATION": VALIDATION, **(env or {})})
    check(r.returncode != 3, f"Vulkan validation messages:\n{r.stderr[-3000:]}")
    check(r.returncode == 0, f"the model program failed ({r.returncode}):\n{r.stderr}")
    for s, (dims, want) in enumerate(zip(steps, wanted)):
        for i, w in enumerate(want):
            dt = w.dtype if w.dtype != np.float64 else np.float32
            got = np.fromfile(workdir / f"out{i}_{s}.bin", dtype=dt)
            check(got.size == w.size, f"step {s} {dims}: output {i} has {got.size} "
                  f"elements, expected {w.size} {list(w.shape)}")
            what = f"step {s} {dims}, output {i}"
            if compare:
                compare(got.reshape(w.shape), w, what)
            else:
                assert_close(got.reshape(w.shape), w, rtol, atol, what)


def seq_steps(values=SEQ):
    return [{"seq": v} for v in values]


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


W = {"dtype": "f32"}


def weight(shape, seed, std=0.3):
    return {**W, "shape": list(shape), "init": {"normal": std, "seed": seed}}


def w_of(shape, seed, std=0.3):
    return ref.init_normal(list(shape), std, seed)


@case("dynamic: elementwise chain with a broadcast bias (fused, vec4 and scalar paths)")
def test_eltwise(workdir):
    for inner in (24, 5):  # a multiple of 4 (vec4 kernel) and not
        sub = Path(workdir) / f"w{inner}"
        sub.mkdir()
        y = dyn_yaml({"seq": "1..64"}, {"x": {**W, "shape": ["seq", inner]}},
                     [{"name": "a", "op": "add", "inputs": ["x", "b"]},
                      {"name": "g", "op": "gelu", "inputs": ["a"]},
                      {"name": "y", "op": "mul", "inputs": ["g", "x"]}],
                     ["y"], {"b": weight([inner], 3)})
        b = w_of([inner], 3)
        run_steps(sub, y, seq_steps(), lambda rng, seq: [normal(rng, seq, inner)],
                  lambda x, seq: [ref.UNARY["gelu"](x + b) * x])


@case("dynamic: transpose of fixed axes, reshape and slice behind a dynamic axis")
def test_views(workdir):
    y = dyn_yaml({"seq": "1..64"}, {"x": {**W, "shape": [1, "seq", 3, 4]}},
                 [{"name": "t", "op": "transpose", "inputs": ["x"], "perm": [0, 1, 3, 2]},
                  {"name": "r", "op": "reshape", "inputs": ["t"], "shape": [-1, 12]},
                  {"name": "s", "op": "slice", "inputs": ["r"], "starts": [2], "ends": [11],
                   "axes": [1], "steps": [3]},
                  {"name": "y", "op": "neg", "inputs": ["s"]}],
                 ["y", "r"])
    run_steps(workdir, y, seq_steps(), lambda rng, seq: [normal(rng, 1, seq, 3, 4)],
              lambda x, seq: [-x.transpose(0, 1, 3, 2).reshape(-1, 12)[:, 2:11:3],
                              x.transpose(0, 1, 3, 2).reshape(-1, 12)])


@case("dynamic: slices of a dynamic axis: from a start to its end (extent seq - s, outer "
      "and inner axis) and up to an end within its least extent (a fixed axis)")
def test_slice_dynamic_axis(workdir):
    y = dyn_yaml({"seq": "3..40"}, {"x": {**W, "shape": ["seq", 5]},
                                    "z": {**W, "shape": [2, "seq", 3]}},
                 [{"name": "a", "op": "slice", "inputs": ["x"], "starts": [2], "ends": [99],
                   "axes": [0]},
                  {"name": "y", "op": "exp", "inputs": ["a"]},
                  {"name": "b", "op": "slice", "inputs": ["z"], "starts": [1, 1],
                   "ends": [1000, 3], "axes": [1, 2]},
                  {"name": "w", "op": "neg", "inputs": ["b"]},
                  {"name": "c", "op": "slice", "inputs": ["x"], "starts": [0], "ends": [3],
                   "axes": [0]},
                  {"name": "v", "op": "tanh", "inputs": ["c"]}],
                 ["y", "w", "v"])
    run_steps(workdir, y, seq_steps([3, 40, 17, 4]),
              lambda rng, seq: [normal(rng, seq, 5), normal(rng, 2, seq, 3)],
              lambda x, z, seq: [np.exp(x[2:]), -z[:, 1:, 1:3], np.tanh(x[:3])])


@case("dynamic: matmul (tiled and matrix-vector) with bias and activation, gemm")
def test_matmul(workdir):
    # rows above 16: tiled (scalar; vec4, K and N multiples of 4, with loops
    # over its tiles: the run's groups); up to 16: matvec
    for hi, n, k in ((64, 40, 33), (16, 24, 33), (200, 64, 36)):
        sub = Path(workdir) / f"m{hi}"
        sub.mkdir()
        y = dyn_yaml({"seq": f"1..{hi}"}, {"x": {**W, "shape": ["seq", k]}},
                     [{"name": "h", "op": "matmul", "inputs": ["x", "w"]},
                      {"name": "hb", "op": "add", "inputs": ["h", "b"]},
                      {"name": "a", "op": "relu", "inputs": ["hb"]},
                      {"name": "g", "op": "gemm", "inputs": ["a", "w2", "c"], "trans_b": 1,
                       "alpha": 0.5}],
                     ["a", "g"],
                     {"w": weight([k, n], 1), "b": weight([n], 2), "w2": weight([7, n], 4),
                      "c": weight([7], 5)})
        w, b, w2, c = w_of([k, n], 1), w_of([n], 2), w_of([7, n], 4), w_of([7], 5)
        steps = [v for v in SEQ if v <= hi] + [hi]

        def want(x, seq):
            a = np.maximum(ref.f64(x) @ w + b, 0)
            return [a, 0.5 * a @ w2.T + c]
        run_steps(sub, y, seq_steps(steps), lambda rng, seq: [normal(rng, seq, k)], want,
                  rtol=1e-4, atol=1e-4)
        if k % 4 == 0:
            c_text = (sub / "model.c").read_text()
            check(any("VEC4 1\n" in k and "ONE_TILE 0\n" in k
                      for k in re.findall(r"/\* kernel .*?\*/", c_text, re.S)),
                  "no vec4 matmul kernel looping over its tiles")


@case("dynamic: a decode step's product on its kernel variants by rows: matrix-vector for "
      "one row, for the next few, and tiled above (K-major weights, f32 and f16; in f16 "
      "coopmat.comp for devices with cooperative matrices; test_quant runs the weight "
      "formats)")
def test_matvec_variants(workdir):
    K, N = 96, 40
    w = w_of([K, N], 3)
    for hi, flags in ((64, ()), (64, ("--precision", "f16")), (16, ("--precision", "f16"))):
        sub = Path(workdir) / f"{hi}{''.join(flags)}"
        sub.mkdir()
        y = dyn_yaml({"seq": f"1..{hi}"}, {"x": {**W, "shape": [1, "seq", K]}},
                     [{"name": "h", "op": "matmul", "inputs": ["x", "w"]},
                      {"name": "y", "op": "tanh", "inputs": ["h"]}],
                     ["y"], {"w": weight([K, N], 3)})
        prog = build_model(sub, y, flags=flags)
        r = kiln("inspect", sub / "model.yaml", "--format", "json", *flags)
        check(r.returncode == 0, r.stderr)
        fams = [d["family"] for d in json.loads(r.stdout)["dispatches"]
                if d["node"].split(" + ")[0] == "h"]
        # up to 16 rows: matvec_k for 2..16; more: for 2..4, then tiled (in
        # f16 coopmat.comp first, reading the K-major f16 weight, for devices
        # with cooperative matrices; the tiled kernel its variant)
        want_fams = ["matvec_k", "matvec_k"] + (
            (["coopmat"] if flags else []) + ["matmul"] if hi > 16 else [])
        check(fams == want_fams, f"seq 1..{hi} {flags}: expected {want_fams}, got {fams}")

        def compare(got, want, what, tol=F16_TOLERANCE if flags else 1e-5):
            assert_relative(got, want, tol, what)
        run_built(prog, seq_steps([1, 3, hi, 5, 2, 1, 4, 1]),
                  lambda rng, seq: [normal(rng, 1, seq, K)],
                  lambda x, seq: [np.tanh(ref.f64(x) @ w)], compare=compare)


@case("dynamic: a norm after a decode step's product (its residual add fused) done by the "
      "product's last workgroup at one row, its own dispatch for more rows: rms_norm and "
      "layer_norm, f32 and f16, int4 weights with A as 8-bit integers, many one-row runs in a "
      "row (the counter set back), the product in teams (KILN_MATVEC_K)")
def test_norm_after_product(workdir):
    K, N = 96, 40
    w, g, b = w_of([K, N], 3), w_of([N], 4), w_of([N], 5)
    # (the last: the kernels built without subgroup arithmetic, whose
    # reductions go through shared memory)
    for norm, flags, env in (("rms_norm", (), {}), ("layer_norm", (), {}),
                             ("rms_norm", ("--precision", "f16"), {}),
                             ("layer_norm", ("--precision", "f16"), {}),
                             ("layer_norm", (), {"KILN_SUBGROUP": "0"}),
                             ("rms_norm", ("--precision", "f16"), TEAMS),
                             ("rms_norm", A8, {})):
        sub = Path(workdir) / f"{norm}{''.join(flags)}{''.join(env)}"
        sub.mkdir()
        params = ["g"] if norm == "rms_norm" else ["g", "b"]
        y = dyn_yaml({"seq": "1..64"}, {"x": {**W, "shape": [1, "seq", K]},
                                        "r": {**W, "shape": [1, "seq", N]}},
                     [{"name": "h", "op": "matmul", "inputs": ["x", "w"]},
                      {"name": "s", "op": "add", "inputs": ["r", "h"]},
                      {"name": "n", "op": norm, "inputs": ["s", *params], "eps": 1e-3}],
                     ["n", "s"], {"w": weight([K, N], 3), "g": weight([N], 4),
                                  "b": weight([N], 5)})
        prog = build_tuned(sub, y, flags, env)
        r = kiln("inspect", sub / "model.yaml", "--format", "json", *flags)
        check(r.returncode == 0, r.stderr)
        ds = json.loads(r.stdout)["dispatches"]
        first = [d for d in ds if d["node"] == "h"][0]
        written = {a["tensor"] for a in first["args"] if a["access"] == "write"}
        check({"n", "s", "kiln.counters"} <= written,
              f"{norm} {flags}: the one-row product does not write the norm: {written}")

        wn = dequantized(w, "int4")[0] if "int4" in flags else w

        def want(x, r, seq, norm=norm, flags=flags, wn=wn):
            s = a_rows(x, flags, seq) @ wn + r
            return [ref.norm(s, -1, g, b if norm == "layer_norm" else None,
                             rms=norm == "rms_norm", eps=1e-3), s]

        def compare(got, want, what, tol=F16_TOLERANCE if "f16" in flags else 1e-4):
            assert_relative(got, want, tol, what)
        run_built(prog, seq_steps([1, 1, 1, 3, 1, 64, 1, 1, 2, 1]),
                  lambda rng, seq: [normal(rng, 1, seq, K), normal(rng, 1, seq, N)], want,
                  compare=compare, env=env)


@case("dynamic: a gated MLP's silu(gate) * up after a decode step's gate and up products "
      "(one product, two parts) done by that product at one row, its own dispatch for more "
      "rows: the gate first or second, f32, f16, int4 weights (A as 8-bit integers too), ragged "
      "columns, without subgroup arithmetic, one-row runs in a row, the product in teams "
      "(KILN_MATVEC_K)")
def test_glu_after_product(workdir):
    K = 96
    for N, gate_first, flags, env in ((40, True, (), {}), (37, False, (), {}),
                                      (40, True, ("--precision", "f16"), {}),
                                      (37, True, ("--weights", "int4"), {}),
                                      (40, False, (), {"KILN_SUBGROUP": "0"}),
                                      (37, True, ("--weights", "int4"), TEAMS),
                                      (40, False, A8, {})):
        sub = Path(workdir) / f"n{N}{gate_first}{''.join(flags)}{''.join(env)}"
        sub.mkdir()
        prods = [{"name": "g", "op": "matmul", "inputs": ["x", "wg"]},
                 {"name": "u", "op": "matmul", "inputs": ["x", "wu"]}]
        # torch's SiLU: x * sigmoid(x) (rewrite.c makes it silu)
        y = dyn_yaml({"seq": "1..64"}, {"x": {**W, "shape": [1, "seq", K]}},
                     (prods if gate_first else prods[::-1]) +
                     [{"name": "sg", "op": "sigmoid", "inputs": ["g"]},
                      {"name": "sl", "op": "mul", "inputs": ["g", "sg"]},
                      {"name": "y", "op": "mul", "inputs": ["u", "sl"]}],
                     ["y"], {"wg": weight([K, N], 3), "wu": weight([K, N], 4)})
        prog = build_tuned(sub, y, flags, env)
        r = kiln("inspect", sub / "model.yaml", "--format", "json", *flags)
        check(r.returncode == 0, r.stderr)
        ds = json.loads(r.stdout)["dispatches"]
        first = [d for d in ds if d["family"] == "matvec_k"][0]  # the one-row variant
        written = {a["tensor"] for a in first["args"] if a["access"] == "write"}
        check(" + " in first["node"] and "y" in written,
              f"N {N} {flags}: the one-row product does not write silu(g) * u: "
              f"{first['node']} {first['family']} {written}")
        wg, wu = w_of([K, N], 3), w_of([K, N], 4)
        if "int4" in flags:  # the weights as the format stores them
            wg, wu = dequantized(wg, "int4")[0], dequantized(wu, "int4")[0]

        def want(x, seq, wg=wg, wu=wu, flags=flags):
            xa = a_rows(x, flags, seq)
            g, u = xa @ wg, xa @ wu
            return [g / (1 + np.exp(-g)) * u]

        tol = F16_TOLERANCE if "f16" in flags else 1e-4

        def compare(got, want, what, tol=tol):
            assert_relative(got, want, tol, what)
        run_built(prog, seq_steps([1, 1, 3, 1, 64, 1, 1, 2, 1]),
                  lambda rng, seq: [normal(rng, 1, seq, K)], want, compare=compare, env=env)


@case("dynamic: the rotary embedding of a decode step's query and key products (one QKV "
      "product) done by that product at one row, its pairs of head columns rotated as it "
      "stores them, the rope's own dispatches for more rows: f32, f16, int4 weights (A as "
      "8-bit integers too), without subgroup arithmetic, an interleaved rope left to its dispatch, the product in "
      "teams (KILN_MATVEC_K)")
def test_rope_after_product(workdir):
    K, H, KVH, D = 64, 3, 1, 8
    for flags, env, inter in (((), {}, 0), (("--precision", "f16"), {}, 0),
                              (("--weights", "int4"), {}, 0), ((), {"KILN_SUBGROUP": "0"}, 0),
                              ((), {}, 1), (("--precision", "f16"), TEAMS, 0), (A8, {}, 0)):
        sub = Path(workdir) / f"{''.join(flags)}{''.join(env)}{inter}"
        sub.mkdir()
        nodes = [{"name": "q", "op": "matmul", "inputs": ["x", "wq"]},
                 {"name": "k", "op": "matmul", "inputs": ["x", "wk"]},
                 {"name": "v", "op": "matmul", "inputs": ["x", "wv"]},
                 {"name": "q4", "op": "reshape", "inputs": ["q"], "shape": [1, -1, H, D]},
                 {"name": "k4", "op": "reshape", "inputs": ["k"], "shape": [1, -1, KVH, D]},
                 {"name": "rq", "op": "rope", "inputs": ["q4", "c", "s"], "seq_axis": 1,
                  "interleaved": inter},
                 {"name": "rk", "op": "rope", "inputs": ["k4", "c", "s"], "seq_axis": 1,
                  "interleaved": inter}]
        y = dyn_yaml({"seq": "1..64"}, {"x": {**W, "shape": [1, "seq", K]},
                                        "c": {**W, "shape": ["seq", D // 2]},
                                        "s": {**W, "shape": ["seq", D // 2]}},
                     nodes, ["rq", "rk", "v"],
                     {"wq": weight([K, H * D], 3), "wk": weight([K, KVH * D], 4),
                      "wv": weight([K, KVH * D], 5)})
        prog = build_tuned(sub, y, flags, env)
        r = kiln("inspect", sub / "model.yaml", "--format", "json", *flags)
        check(r.returncode == 0, r.stderr)
        first = [d for d in json.loads(r.stdout)["dispatches"] if d["family"] == "matvec_k"][0]
        written = {a["tensor"] for a in first["args"] if a["access"] == "write"}
        check(({"rq", "rk"} <= written) == (not inter),
              f"{flags} {env} interleaved {inter}: the one-row QKV product writes {written}")
        wq, wk, wv = w_of([K, H * D], 3), w_of([K, KVH * D], 4), w_of([K, KVH * D], 5)
        if "int4" in flags:  # the weights as the format stores them
            wq, wk, wv = (dequantized(w, "int4")[0] for w in (wq, wk, wv))

        def want(x, c, s, seq, wq=wq, wk=wk, wv=wv, inter=inter, flags=flags):
            xa = a_rows(x, flags, seq)
            q = (xa @ wq).reshape(1, seq, H, D)
            k = (xa @ wk).reshape(1, seq, KVH, D)
            return [ref.rope(q, c, s, inter, seq_axis=1), ref.rope(k, c, s, inter, seq_axis=1),
                    xa @ wv]

        def angles(rng, seq):
            a = rng.uniform(0, 6.3, (seq, D // 2))
            return np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)

        def compare(got, want, what, tol=F16_TOLERANCE if "f16" in flags else 1e-4):
            assert_relative(got, want, tol, what)
        run_built(prog, seq_steps([1, 1, 3, 1, 64, 1, 2, 1]),
                  lambda rng, seq: [normal(rng, 1, seq, K), *angles(rng, seq)], want,
                  compare=compare, env=env)


@case("dynamic: layer_norm, rms_norm and a residual add fused into a norm")
def test_norms(workdir):
    y = dyn_yaml({"seq": "1..64"}, {"x": {**W, "shape": ["seq", 48]},
                                    "r": {**W, "shape": ["seq", 48]}},
                 [{"name": "l", "op": "layer_norm", "inputs": ["x", "g", "bt"]},
                  {"name": "s", "op": "add", "inputs": ["l", "r"]},
                  {"name": "n", "op": "rms_norm", "inputs": ["s", "g"]}],
                 ["l", "n"], {"g": weight([48], 6), "bt": weight([48], 7)})
    g, bt = w_of([48], 6), w_of([48], 7)

    def want(x, r, seq):
        lo = ref.norm(x, -1, g, bt)
        return [lo, ref.norm(lo + r, -1, g, rms=True)]
    run_steps(workdir, y, seq_steps(), lambda rng, seq: [normal(rng, seq, 48),
                                                         normal(rng, seq, 48)],
              want, rtol=1e-4, atol=1e-4)


@case("dynamic: softmax, log_softmax, cumsum, reduce_sum and argmax over a fixed axis")
def test_rows(workdir):
    y = dyn_yaml({"seq": "1..64"}, {"x": {**W, "shape": ["seq", 2, 37]}},
                 [{"name": "a", "op": "softmax", "inputs": ["x"]},
                  {"name": "b", "op": "log_softmax", "inputs": ["x"], "axis": 1},
                  {"name": "c", "op": "cumsum", "inputs": ["x"], "axis": 2},
                  {"name": "d", "op": "reduce_sum", "inputs": ["x"], "axes": [2],
                   "keep_dims": 0},
                  {"name": "e", "op": "argmax", "inputs": ["x"], "axis": 2}],
                 ["a", "b", "c", "d", "e"])

    def want(x, seq):
        return [ref.softmax(x, -1), ref.log_softmax(x, 1), ref.cumsum(x, 2),
                ref.f64(x).sum(axis=2), ref.arg_reduce(x, 2, 1, True, False)]
    run_steps(workdir, y, seq_steps(), lambda rng, seq: [normal(rng, seq, 2, 37)], want,
              rtol=1e-4, atol=1e-4)


@case("dynamic: topk, split, expand, batch_norm, where and greedy sample")
def test_more(workdir):
    y = dyn_yaml({"seq": "1..64"}, {"x": {**W, "shape": ["seq", 1, 6]},
                                    "seed": {"dtype": "i32", "shape": [1]}},
                 [{"name": "topk1", "outputs": ["tv", "ti"], "op": "topk", "inputs": ["x"],
                   "k": 2},
                  {"name": "split1", "outputs": ["s1", "s2"], "op": "split", "inputs": ["x"],
                   "axis": 2, "sizes": [2, 4]},
                  {"name": "e", "op": "expand", "inputs": ["x"], "shape": [1, 3, 1]},
                  {"name": "f", "op": "reshape", "inputs": ["x"], "shape": [-1, 6]},
                  {"name": "bn", "op": "batch_norm", "inputs": ["f", "g", "b", "mu", "var"]},
                  {"name": "c", "op": "gt", "inputs": ["bn", "b"]},
                  {"name": "wh", "op": "where", "inputs": ["c", "bn", "f"]},
                  {"name": "sm", "op": "sample", "inputs": ["f", "seed"], "temperature": 0}],
                 ["tv", "ti", "s1", "s2", "e", "wh", "sm"],
                 {"g": weight([6], 13), "b": weight([6], 14), "mu": weight([6], 15),
                  "var": {**W, "shape": [6], "init": {"uniform": [0.5, 2], "seed": 16}}})
    g, b, mu = w_of([6], 13), w_of([6], 14), w_of([6], 15)
    var = ref.init_uniform([6], 0.5, 2, 16)

    def want(x, seed, seq):
        tv, ti = ref.topk(x, 2, axis=-1)
        f = ref.f64(x).reshape(-1, 6)
        bn = ref.batch_norm(f, g, b, mu, var)
        return [tv, ti, x[:, :, :2], x[:, :, 2:], np.broadcast_to(x, (seq, 3, 6)),
                np.where(bn > b, bn, f), np.argmax(f, axis=-1).astype(np.int64)]
    run_steps(workdir, y, seq_steps(), lambda rng, seq: [normal(rng, seq, 1, 6),
                                                         np.array([5], np.int32)],
              want, rtol=1e-4, atol=1e-5)


@case("dynamic: embedding of dynamic token ids, rope with positions gathered")
def test_embedding_rope(workdir):
    y = dyn_yaml({"seq": "1..64"}, {"tok": {"dtype": "i32", "shape": ["seq"]},
                                    "pos": {"dtype": "i32", "shape": ["seq"]}},
                 [{"name": "e", "op": "embedding", "inputs": ["tok", "table"]},
                  {"name": "h", "op": "reshape", "inputs": ["e"], "shape": [-1, 2, 8]},
                  {"name": "c", "op": "gather", "inputs": ["cos", "pos"]},
                  {"name": "s", "op": "gather", "inputs": ["sin", "pos"]},
                  {"name": "y", "op": "rope", "inputs": ["h", "c", "s"], "seq_axis": 0}],
                 ["e", "y"], {"table": weight([50, 16], 8), "cos": weight([128, 4], 9),
                              "sin": weight([128, 4], 10)})
    table, cos, sin = w_of([50, 16], 8), w_of([128, 4], 9), w_of([128, 4], 10)

    def inputs(rng, seq):
        return [rng.integers(0, 50, seq).astype(np.int32),
                rng.integers(0, 128, seq).astype(np.int32)]

    def want(tok, pos, seq):
        e = table[tok]
        return [e, ref.rope(e.reshape(-1, 2, 8), cos[pos], sin[pos], seq_axis=0)]
    run_steps(workdir, y, seq_steps(), inputs, want, rtol=1e-5, atol=1e-5)


@case("dynamic: attention over a packed QKV product's rows [1, seq, 3 * 32] at offsets "
      "(head_dim, q_offset, k_offset, v_offset): flash.comp for runs of 8 or more, "
      "attention.comp for fewer")
def test_attention_packed(workdir):
    y = dyn_yaml({"seq": "1..40"}, {"x": {**W, "shape": [1, "seq", 16]}},
                 [{"name": "qkv", "op": "matmul", "inputs": ["x", "w"]},
                  {"name": "o", "op": "attention", "inputs": ["qkv", "qkv", "qkv"],
                   "layout": "bshd", "heads": 4, "kv_heads": 2, "head_dim": 8,
                   "q_offset": 0, "k_offset": 32, "v_offset": 48, "causal": 1}],
                 ["o"], {"w": weight([16, 64], 31)})
    w = w_of([16, 64], 31)

    def want(x, seq):
        p = ref.f64(x) @ w
        return [ref.attention(p[..., :32], p[..., 32:48], p[..., 48:], None, "bshd", 4, 2,
                              causal=True)]
    run_steps(workdir, y, seq_steps([1, 40, 9, 3, 17]), lambda rng, seq: [normal(rng, 1, seq, 16)],
              want, rtol=1e-4, atol=1e-5)


@case("dynamic: causal attention with dynamic queries and keys (two dims)")
def test_attention(workdir):
    # queries: seq new positions; keys: past + seq (a concatenation).
    y = dyn_yaml({"seq": "1..8", "past": "0..24"},
                 {"q": {**W, "shape": [1, "seq", 32]},
                  "kp": {**W, "shape": [1, "past", 16]},
                  "kn": {**W, "shape": [1, "seq", 16]},
                  "vp": {**W, "shape": [1, "past", 16]},
                  "vn": {**W, "shape": [1, "seq", 16]}},
                 [{"name": "k", "op": "concat", "inputs": ["kp", "kn"], "axis": 1},
                  {"name": "v", "op": "concat", "inputs": ["vp", "vn"], "axis": 1},
                  {"name": "o", "op": "attention", "inputs": ["q", "k", "v"],
                   "layout": "bshd", "heads": 4, "kv_heads": 2, "causal": 1}],
                 ["o", "k"])
    steps = [{"seq": s, "past": p} for s, p in
             ((1, 0), (8, 0), (3, 5), (1, 24), (8, 24), (1, 1), (5, 13))]

    def inputs(rng, seq, past):
        return [normal(rng, 1, seq, 32), normal(rng, 1, past, 16), normal(rng, 1, seq, 16),
                normal(rng, 1, past, 16), normal(rng, 1, seq, 16)]

    def want(q, kp, kn, vp, vn, seq, past):
        k, v = np.concatenate([kp, kn], 1), np.concatenate([vp, vn], 1)
        return [ref.attention(q, k, v, layout="bshd", heads=4, kv_heads=2, causal=1), k]
    run_steps(workdir, y, steps, inputs, want, rtol=1e-4, atol=1e-5)


@case("dynamic: attention with up to 40 dynamic queries: attention.comp for runs of fewer "
      "than 8 rows, flash.comp for the rest, both variants in one schedule")
def test_attention_flash(workdir):
    y = dyn_yaml({"seq": "1..40", "past": "0..100"},
                 {"q": {**W, "shape": [1, "seq", 64]},
                  "kp": {**W, "shape": [1, "past", 32]},
                  "kn": {**W, "shape": [1, "seq", 32]},
                  "vp": {**W, "shape": [1, "past", 32]},
                  "vn": {**W, "shape": [1, "seq", 32]}},
                 [{"name": "k", "op": "concat", "inputs": ["kp", "kn"], "axis": 1},
                  {"name": "v", "op": "concat", "inputs": ["vp", "vn"], "axis": 1},
                  {"name": "o", "op": "attention", "inputs": ["q", "k", "v"],
                   "layout": "bshd", "heads": 4, "kv_heads": 2, "causal": 1}],
                 ["o"])
    steps = [{"seq": s, "past": p} for s, p in
             ((1, 0), (8, 0), (40, 0), (7, 5), (9, 90), (33, 60), (1, 100), (16, 16))]

    def inputs(rng, seq, past):
        return [normal(rng, 1, seq, 64), normal(rng, 1, past, 32), normal(rng, 1, seq, 32),
                normal(rng, 1, past, 32), normal(rng, 1, seq, 32)]

    def want(q, kp, kn, vp, vn, seq, past):
        k, v = np.concatenate([kp, kn], 1), np.concatenate([vp, vn], 1)
        return [ref.attention(q, k, v, layout="bshd", heads=4, kv_heads=2, causal=1)]
    run_steps(workdir, y, steps, inputs, want, rtol=1e-4, atol=1e-5)
    fams = {d["family"] for d in json.loads(kiln("inspect", Path(workdir) / "model.yaml",
                                                 "--format", "json").stdout)["dispatches"]}
    check({"attention", "flash"} <= fams, f"kernels {sorted(fams)}")


def heads_layout_case(layout, dtype):
    """q, k, v dynamic along the positions, an inner axis: [2, heads, seq, d]
    (bhsd) or [2, seq, heads * d] (bshd), batch 2 before it; keys roped and
    appended to a past along that axis; causal, grouped queries; up to 40
    query rows (attention.comp for fewer than 8, flash.comp or, on f16 with
    cooperative matrices, flash_cm.comp for the rest)."""
    def test(workdir):
        B, H, KVH, D = 2, 4, 2, 16
        f = {"dtype": dtype}
        if layout == "bhsd":
            shp = lambda h, s: [B, h, s, D]  # noqa: E731
            ax, attrs = 2, {}
        else:
            shp = lambda h, s: [B, s, h * D]  # noqa: E731
            ax, attrs = 1, {"layout": "bshd", "heads": H, "kv_heads": KVH}
        ins = {"q": {**f, "shape": shp(H, "seq")}, "kp": {**f, "shape": shp(KVH, "past")},
               "kn": {**f, "shape": shp(KVH, "seq")}, "vp": {**f, "shape": shp(KVH, "past")},
               "vn": {**f, "shape": shp(KVH, "seq")},
               "cos": {**W, "shape": ["seq", D // 2]}, "sin": {**W, "shape": ["seq", D // 2]}}
        nodes = [{"name": "k", "op": "concat", "inputs": ["kp", "kr"], "axis": ax},
                 {"name": "v", "op": "concat", "inputs": ["vp", "vn"], "axis": ax},
                 {"name": "o", "op": "attention", "inputs": ["qr", "k", "v"], "causal": 1,
                  **attrs}]
        if layout == "bhsd":
            nodes = [{"name": "qr", "op": "rope", "inputs": ["q", "cos", "sin"], "seq_axis": 2},
                     {"name": "kr", "op": "rope", "inputs": ["kn", "cos", "sin"],
                      "seq_axis": 2}] + nodes
        else:  # rope on [2, seq, heads, d] views
            nodes = [{"name": n + "4", "op": "reshape", "inputs": [n], "shape": [B, -1, h, D]}
                     for n, h in (("q", H), ("kn", KVH))] + \
                    [{"name": n + "r4", "op": "rope", "inputs": [n + "4", "cos", "sin"],
                      "seq_axis": 1} for n in ("q", "kn")] + \
                    [{"name": n[0] + "r", "op": "reshape", "inputs": [n + "r4"],
                      "shape": [B, -1, h * D]} for n, h in (("q", H), ("kn", KVH))] + nodes
        y = dyn_yaml({"seq": "1..40", "past": "0..60"}, ins, nodes, ["o", "k"])
        npt = np.float16 if dtype == "f16" else np.float32

        def inputs(rng, seq, past):
            def t(h, s):
                return normal(rng, *(shp(h, s))).astype(npt)
            ang = rng.uniform(-3, 3, (seq, D // 2)).astype(np.float32)
            return [t(H, seq), t(KVH, past), t(KVH, seq), t(KVH, past), t(KVH, seq),
                    np.cos(ang), np.sin(ang)]

        def want(q, kp, kn, vp, vn, c, s, seq, past):
            if layout == "bhsd":
                qr, kr = ref.rope(q, c, s, seq_axis=2), ref.rope(kn, c, s, seq_axis=2)
            else:
                qr, kr = (ref.rope(x.reshape(B, seq, -1, D), c, s, seq_axis=1).reshape(B, seq, -1)
                          for x in (q, kn))
            k, v = np.concatenate([kp, kr], ax), np.concatenate([vp, vn], ax)
            return [np.asarray(w).astype(npt) for w in
                    (ref.attention(qr, k, v, layout=layout, heads=H, kv_heads=KVH, causal=1), k)]
        steps = [{"seq": s, "past": p} for s, p in
                 ((1, 0), (8, 0), (40, 60), (7, 5), (1, 60), (33, 20), (16, 16))]
        if dtype == "f16":
            def compare(g, w, what):
                assert_relative(g, w, F16_TOLERANCE, what)
            run_built(build_model(workdir, y), steps, inputs, want, compare=compare)
        else:
            run_steps(workdir, y, steps, inputs, want, rtol=1e-4, atol=1e-5)
        fams = {d["family"] for d in json.loads(kiln("inspect", Path(workdir) / "model.yaml",
                                                     "--format", "json").stdout)["dispatches"]}
        want_fams = {"attention", "flash"} | ({"flash_cm"} if dtype == "f16" and D % 16 == 0
                                             and layout == "bhsd" else set())
        check(want_fams <= fams, f"kernels {sorted(fams)}")
    return test


for _lay, _dt in (("bhsd", "f32"), ("bhsd", "f16"), ("bshd", "f32")):
    case(f"dynamic: rope and attention on {_lay} with batch 2, dynamic along the positions "
         f"(an inner axis), past + seq keys, {_dt}")(heads_layout_case(_lay, _dt))


@case("dynamic: layer_norm (its residual sum read later) over [2, seq, 16] and [2, seq, 3, 8], "
      "rms_norm over the heads' layout [1, 2, seq, 8], dynamic along an axis inside their "
      "rows: the run's rows only (ROW_BLOCK)")
def test_norm_inner_rows(workdir):
    f = {**W}
    ins = {"x": {**f, "shape": [2, "seq", 16]}, "r": {**f, "shape": [2, "seq", 16]},
           "h": {**f, "shape": [1, 2, "seq", 8]}, "u": {**f, "shape": [2, "seq", 3, 8]}}
    nodes = [{"name": "s", "op": "add", "inputs": ["x", "r"]},
             {"name": "y", "op": "layer_norm", "inputs": ["s", "g16", "b16"]},
             {"name": "z", "op": "mul", "inputs": ["s", "s"]},
             {"name": "q", "op": "rms_norm", "inputs": ["h", "g8"]},
             {"name": "v", "op": "layer_norm", "inputs": ["u"]}]  # 3 rows a position
    y = dyn_yaml({"seq": "1..12"}, ins, nodes, ["y", "z", "q", "v"],
                 {"g16": weight([16], 41), "b16": weight([16], 42), "g8": weight([8], 43)})
    g16, b16, g8 = w_of([16], 41), w_of([16], 42), w_of([8], 43)

    def make(rng, seq):
        return [normal(rng, 2, seq, 16), normal(rng, 2, seq, 16), normal(rng, 1, 2, seq, 8),
                normal(rng, 2, seq, 3, 8)]

    def want(x, r, h, u, seq):
        s_ = ref.f64(x) + ref.f64(r)
        hh = ref.f64(h)
        qn = hh / np.sqrt((hh ** 2).mean(-1, keepdims=True) + 1e-5) * g8
        return [ref.layer_norm(s_, g16, b16), s_ * s_, qn, ref.layer_norm(u)]
    run_steps(workdir, y, seq_steps([1, 7, 12, 3, 1]), make, want, rtol=1e-4, atol=1e-5)
    blocks = [d for d in kernel_defines(workdir) if "ROW_BLOCK" in d]
    check(len(blocks) >= 3 and {d["ROW_BLOCK"] for d in blocks} == {"12", "36"},
          f"the norms do not follow the rows' extent: {blocks}")


@case("dynamic: elementwise ops and copies along an inner dynamic axis: [3, seq, 4, 5] with "
      "operands broadcast along it and across it, the fixed axes after it merged, a "
      "transpose moving it, a slice and a concat of fixed axes; the run's extent only")
def test_inner_eltwise(workdir):
    f = {**W}
    ins = {"a": {**f, "shape": [3, "seq", 4, 5]}, "b": {**f, "shape": [1, "seq", 1, 5]}}
    nodes = [{"name": "t", "op": "add", "inputs": ["a", "b"]},
             {"name": "u", "op": "mul", "inputs": ["t", "c"]},
             {"name": "v", "op": "transpose", "inputs": ["u"], "perm": [0, 2, 1, 3]},
             {"name": "w", "op": "tanh", "inputs": ["v"]},
             {"name": "sl", "op": "slice", "inputs": ["u"], "starts": [1], "ends": [4],
              "axes": [2]},
             {"name": "cc", "op": "concat", "inputs": ["sl", "a"], "axis": 2}]
    y = dyn_yaml({"seq": "1..9"}, ins, nodes, ["u", "w", "cc"], {"c": weight([5], 44)})
    c = w_of([5], 44)

    def make(rng, seq):
        return [normal(rng, 3, seq, 4, 5), normal(rng, 1, seq, 1, 5)]

    def want(a, b, seq):
        u = (ref.f64(a) + ref.f64(b)) * c
        return [u, np.tanh(u.transpose(0, 2, 1, 3)), np.concatenate([u[:, :, 1:4], a], 2)]
    run_steps(workdir, y, seq_steps([1, 9, 4, 2]), make, want, rtol=1e-5, atol=1e-6)
    dyn = [d for d in kernel_defines(workdir) if d.get("SHAPE_DYN") == "1"]
    check(len(dyn) >= 4, f"{len(dyn)} elementwise kernels follow the inner axis")


@case("dynamic: softmax, cumsum and topk along a fixed axis of tensors dynamic along an "
      "axis before it, inside ([2, seq, 7], [2, seq, 4, 3] along axis 2, [3, seq, 6]): the "
      "run's rows only (ROW_BLOCK)")
def test_rows_inner(workdir):
    f = {**W}
    ins = {"x": {**f, "shape": [2, "seq", 7]}, "z": {**f, "shape": [2, "seq", 4, 3]},
           "t": {**f, "shape": [3, "seq", 6]}}
    nodes = [{"name": "sx", "op": "softmax", "inputs": ["x"], "axis": -1},
             {"name": "sz", "op": "softmax", "inputs": ["z"], "axis": 2},
             {"name": "cz", "op": "cumsum", "inputs": ["z"], "axis": 2},
             {"name": "tk", "outputs": ["tv", "ti"], "op": "topk", "inputs": ["t"], "k": 2,
              "axis": -1}]
    y = dyn_yaml({"seq": "1..10"}, ins, nodes, ["sx", "sz", "cz", "tv", "ti"])

    def make(rng, seq):
        return [normal(rng, 2, seq, 7), normal(rng, 2, seq, 4, 3), normal(rng, 3, seq, 6)]

    def want(x, z, t, seq):
        v, i = ref.topk(t, 2)
        return [ref.softmax(x), ref.softmax(z, axis=2), np.cumsum(ref.f64(z), axis=2), v, i]
    run_steps(workdir, y, seq_steps([1, 10, 6, 2]), make, want, rtol=1e-5, atol=1e-6)
    blocks = [d for d in kernel_defines(workdir) if "ROW_BLOCK" in d]
    check(len(blocks) >= 3, f"the row kernels do not follow the rows' extent: {blocks}")


@case("dynamic: reductions and greedy sampling of tensors dynamic along an axis before "
      "theirs, inside ([2, seq, 7] summed and maxed over its last axis, kept and not; argmax "
      "and argmin; [2, seq, 4, 3] over axes 2 and 3; sample over [3, seq, 11]): the run's "
      "rows only (ROW_BLOCK)")
def test_reduce_inner(workdir):
    ins = {"x": {**W, "shape": [2, "seq", 7]}, "z": {**W, "shape": [2, "seq", 4, 3]},
           "t": {**W, "shape": [3, "seq", 11]}, "seed": {"dtype": "i32", "shape": [1]}}
    nodes = [{"name": "rs", "op": "reduce_sum", "inputs": ["x"], "axes": [2]},
             {"name": "rm", "op": "reduce_max", "inputs": ["x"], "axes": [-1], "keep_dims": 0},
             {"name": "am", "op": "argmax", "inputs": ["x"], "axis": 2},
             {"name": "an", "op": "argmin", "inputs": ["x"], "axis": -1, "keep_dims": 0},
             {"name": "rz", "op": "reduce_mean", "inputs": ["z"], "axes": [2, 3],
              "keep_dims": 0},
             {"name": "sm", "op": "sample", "inputs": ["t", "seed"], "temperature": 0}]
    y = dyn_yaml({"seq": "1..12"}, ins, nodes, ["rs", "rm", "am", "an", "rz", "sm"])

    def make(rng, seq):
        return [normal(rng, 2, seq, 7), normal(rng, 2, seq, 4, 3), normal(rng, 3, seq, 11),
                np.array([5], np.int32)]

    def want(x, z, t, seed, seq):
        return [ref.f64(x).sum(axis=2, keepdims=True), ref.f64(x).max(axis=2),
                ref.arg_reduce(x, 2, 1, True, False), ref.arg_reduce(x, 2, 0, False, False),
                ref.f64(z).mean(axis=(2, 3)), np.argmax(t, axis=-1).astype(np.int64)]
    run_steps(workdir, y, seq_steps([1, 12, 5, 2, 9]), make, want, rtol=1e-5, atol=1e-5)
    blocks = [d.get("KIND", "sample") for d in kernel_defines(workdir) if "ROW_BLOCK" in d]
    check(len(blocks) == 6, f"not every reduction and the sample follow the rows' extent: "
          f"{blocks}")


@case("dynamic: attention written out with the dynamic axes inside: [heads, seq, past + seq] "
      "scores, softmax over keys, a product contracting them, concat of inner pieces")
def test_inner_axes(workdir):
    # q, k, v [seq, 2, 8] and the past keys and values [past, 2, 8], moved to
    # [2, seq, 8] and [2, past + seq, 8] (the dynamic axis inside the heads),
    # scores [2, seq, past + seq], softmax over them, the values' product
    # (K dynamic), back to [seq, 2, 8]; a range of key positions from the dims
    dims = {"seq": "1..12", "past": "0..20"}
    f = {**W}
    ins = {"q": {**f, "shape": ["seq", 2, 8]}, "k": {**f, "shape": ["seq", 2, 8]},
           "v": {**f, "shape": ["seq", 2, 8]}, "kp": {**f, "shape": ["past", 2, 8]},
           "vp": {**f, "shape": ["past", 2, 8]}}
    t = [1, 0, 2]
    nodes = [{"name": n + "t", "op": "transpose", "inputs": [n], "perm": t}
             for n in ("q", "k", "v", "kp", "vp")]
    nodes += [
        {"name": "ka", "op": "concat", "inputs": ["kpt", "kt"], "axis": 1},
        {"name": "va", "op": "concat", "inputs": ["vpt", "vt"], "axis": 1},
        {"name": "kT", "op": "transpose", "inputs": ["ka"], "perm": [0, 2, 1]},
        {"name": "s", "op": "matmul", "inputs": ["qt", "kT"]},
        {"name": "pos", "op": "range", "size": "past + seq", "dtype": "f32"},
        {"name": "sp", "op": "mul", "inputs": ["s", "pos"]},
        {"name": "p", "op": "softmax", "inputs": ["sp"], "axis": -1},
        {"name": "o", "op": "matmul", "inputs": ["p", "va"]},
        {"name": "y", "op": "transpose", "inputs": ["o"], "perm": t},
    ]
    y = dyn_yaml(dims, ins, nodes, ["y"])

    def make(rng, seq, past):
        return [normal(rng, seq, 2, 8) * 0.3 for _ in range(3)] + \
               [normal(rng, past, 2, 8) * 0.3 for _ in range(2)]

    def want(q, k, v, kp, vp, seq, past):
        ka = np.concatenate([kp, k]).transpose(1, 0, 2).astype(np.float64)
        va = np.concatenate([vp, v]).transpose(1, 0, 2).astype(np.float64)
        s = q.transpose(1, 0, 2) @ ka.transpose(0, 2, 1) * np.arange(past + seq)
        return [(ref.softmax(s) @ va).transpose(1, 0, 2)]
    steps = [{"seq": s, "past": p} for s, p in ((1, 0), (12, 20), (5, 3), (1, 19), (12, 0),
                                                 (3, 20))]
    run_steps(workdir, y, steps, make, want, rtol=1e-4, atol=1e-5)


@case("dynamic: inputs and outputs dynamic along inner axes, several per tensor: "
      "[batch, heads, seq, d], [seq, seq] and a [2, seq, past + seq] output, copied "
      "between the caller's packed tensors and the largest shape's strides")
def test_inner_io(workdir):
    # x [2, 3, seq, 4] (the cache layout), m [seq, seq], kp [2, 3, past, 4]:
    # y = gelu(x); s = x @ concat(kp, x)^T: [2, 3, seq, past + seq]; z = m * w
    # (two dynamic axes of one dim); t = x moved to [seq, 2, 3, 4]
    dims = {"seq": "1..9", "past": "0..7"}
    ins = {"x": {**W, "shape": [2, 3, "seq", 4]}, "m": {**W, "shape": ["seq", "seq"]},
           "kp": {**W, "shape": [2, 3, "past", 4]}}
    nodes = [
        {"name": "y", "op": "gelu", "inputs": ["x"]},
        {"name": "k", "op": "concat", "inputs": ["kp", "x"], "axis": 2},
        {"name": "kT", "op": "transpose", "inputs": ["k"], "perm": [0, 1, 3, 2]},
        {"name": "s", "op": "matmul", "inputs": ["x", "kT"]},
        {"name": "z", "op": "mul", "inputs": ["m", "two"]},
        {"name": "t", "op": "transpose", "inputs": ["x"], "perm": [2, 0, 1, 3]},
    ]
    y = dyn_yaml(dims, ins, nodes, ["y", "s", "z", "t"],
                 {"two": weight([1], 5)})

    def make(rng, seq, past):
        return [normal(rng, 2, 3, seq, 4), normal(rng, seq, seq), normal(rng, 2, 3, past, 4)]

    def want(x, m, kp, seq, past):
        k = np.concatenate([kp, x], 2)
        return [ref.UNARY["gelu"](x), x @ k.transpose(0, 1, 3, 2), m * w_of([1], 5),
                x.transpose(2, 0, 1, 3)]
    steps = [{"seq": s, "past": p} for s, p in ((1, 0), (9, 7), (4, 2), (1, 7), (9, 0),
                                                 (2, 5))]
    run_steps(workdir, y, steps, make, want, rtol=1e-5, atol=1e-5)


@case("dynamic: I/O copies of the run's elements only (spans rounded to powers of two, "
      "more shapes than recordings, the least recent recorded over), staged and direct")
def test_io_spans(workdir):
    # x [a, 512] and w [b, 1024] copy 64 KiB to 2 and 4 MiB a run: up to 42
    # pairs of spans, more than the runtime's recordings (8); z [2, b, 64]
    # has an inner dynamic axis (its span nearly the whole tensor)
    dims = {"a": "1..1024", "b": "1..1024"}
    ins = {"x": {**W, "shape": ["a", 512]}, "w": {**W, "shape": ["b", 1024]},
           "z": {**W, "shape": [2, "b", 64]}}
    nodes = [{"name": "y", "op": "mul", "inputs": ["x", "two"]},
             {"name": "v", "op": "neg", "inputs": ["w"]},
             {"name": "u", "op": "add", "inputs": ["z", "two"]}]
    y = dyn_yaml(dims, ins, nodes, ["y", "v", "u"], {"two": weight([1], 5)})
    two = w_of([1], 5)
    pairs = ((1024, 1024), (1, 1), (300, 9), (64, 700), (17, 130), (1000, 1), (513, 64),
             (129, 1000), (2, 300), (700, 33), (1, 1024), (1024, 1), (300, 9), (33, 600),
             (1, 1), (1024, 1024))
    steps = [{"a": a, "b": b} for a, b in pairs]
    prog = build_model(workdir, y)
    for env in ({"KILN_STAGED_IO": "1"}, {}):
        run_built(prog, steps,
                  lambda rng, a, b: [normal(rng, a, 512), normal(rng, b, 1024),
                                     normal(rng, 2, b, 64)],
                  lambda x, w, z, a, b: [x * two, -w, z + two], env=env)


@case("op range: positions from the dims (start and size expressions), fixed and dynamic "
      "sizes, i64, i32 and f32")
def test_range(workdir):
    y = dyn_yaml({"seq": "1..16", "past": "0..8"}, {"x": {**W, "shape": ["seq"]}},
                 [{"name": "pos", "op": "range", "size": "seq", "start": "past + 2",
                   "delta": 3, "dtype": "i64"},
                  {"name": "pf", "op": "cast", "inputs": ["pos"], "to": "f32"},
                  {"name": "y", "op": "add", "inputs": ["x", "pf"]},
                  {"name": "z", "op": "range", "size": "seq", "start": "-1", "delta": -2,
                   "dtype": "i32"},
                  {"name": "f", "op": "range", "size": 5, "start": "past - 1", "dtype": "f32"}],
                 ["y", "z", "f"])
    steps = [{"seq": s, "past": p} for s, p in ((1, 0), (5, 3), (16, 8), (2, 7))]
    run_steps(workdir, y, steps, lambda rng, seq, past: [normal(rng, seq)],
              lambda x, seq, past: [x + (past + 2 + 3 * np.arange(seq)).astype(np.float32),
                                    (-1 - 2 * np.arange(seq)).astype(np.int32),
                                    (past - 1 + np.arange(5)).astype(np.float32)])


@case("dynamic: concatenation along a fixed axis and of a fixed piece after a dynamic one")
def test_concat(workdir):
    y = dyn_yaml({"seq": "1..64"}, {"x": {**W, "shape": ["seq", 5]},
                                    "z": {**W, "shape": ["seq", 3]}},
                 [{"name": "a", "op": "concat", "inputs": ["x", "z"], "axis": 1},
                  {"name": "b", "op": "concat", "inputs": ["z", "t", "z"], "axis": 0}],
                 ["a", "b"], {"t": weight([2, 3], 11)})
    t = w_of([2, 3], 11)
    run_steps(workdir, y, seq_steps(), lambda rng, seq: [normal(rng, seq, 5),
                                                         normal(rng, seq, 3)],
              lambda x, z, seq: [np.concatenate([x, z], 1), np.concatenate([z, t, z], 0)])


@case("dynamic: an extent outside its range is KILN_ERROR_OUT_OF_RANGE; the model "
      "still runs after it")
def test_out_of_range(workdir):
    y = dyn_yaml({"seq": "2..8"}, {"x": {**W, "shape": ["seq", 4]}},
                 [{"name": "y", "op": "exp", "inputs": ["x"]}], ["y"])
    prog = build_model(workdir, y)
    for bad in ("1", "9", "-3"):
        r = run([prog, "-q", "-d", f"seq={bad}"], cwd=workdir)
        check(r.returncode == 1 and "KILN_ERROR_OUT_OF_RANGE" in r.stderr and
              "range 2..8" in r.stderr, f"seq={bad}: {r.returncode} {r.stderr}")
    run_steps(workdir, y, seq_steps([2, 8, 5]), lambda rng, seq: [normal(rng, seq, 4)],
              lambda x, seq: [np.exp(ref.f64(x))])


@case("state: an update copied into its state after each run; reset, write and read "
      "from the host")
def test_state_copy(workdir):
    workdir = Path(workdir)
    y = json.dumps({"name": "acc", "inputs": {"x": {**W, "shape": [2, 3]}},
                    "state": {"acc": {**W, "shape": [2, 3], "update": "acc2"}},
                    "nodes": [{"name": "acc2", "op": "add", "inputs": ["acc", "x"]},
                              {"name": "y", "op": "mul", "inputs": ["acc2", "x"]}],
                    "outputs": ["y"]})
    init = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    sd = workdir / "states"
    sd.mkdir()
    init.tofile(sd / "init0.bin")
    total = {"acc": init.astype(np.float64)}

    def want(x):
        if want.step == 3:  # --reset-at 3
            total["acc"] = np.zeros((2, 3))
        want.step += 1
        total["acc"] = total["acc"] + x
        return [total["acc"] * x]
    want.step = 0
    run_steps(workdir, y, [{}] * 6, lambda rng: [normal(rng, 2, 3)], want,
              extra_args=("--states", sd, "--reset-at", "3"))
    got = np.fromfile(sd / "state0.bin", dtype=np.float32).reshape(2, 3)
    assert_close(got, total["acc"], 1e-5, 1e-5, "state read after the last run")


@case("state: a dynamic cache that grows in place (concat) across runs of varying extent")
def test_state_append(workdir):
    workdir = Path(workdir)
    y = dyn_yaml({"seq": "1..3", "past": "0..6"}, {"x": {**W, "shape": ["seq", 3]}},
                 [{"name": "all", "op": "concat", "inputs": ["c", "x"], "axis": 0},
                  {"name": "y", "op": "exp", "inputs": ["all"]}], ["y", "all"])
    doc = json.loads(y)
    doc["state"] = {"c": {**W, "shape": ["past", 3], "update": "all"}}
    steps = [{"seq": 2, "past": 0}, {"seq": 1, "past": 2}, {"seq": 3, "past": 3},
             {"seq": 1, "past": 6}]
    cache = []

    def want(x, seq, past):
        check(sum(len(c) for c in cache) == past, "test bug")
        cache.append(ref.f64(x))
        a = np.concatenate(cache)
        return [np.exp(a), a]
    sd = workdir / "states"
    sd.mkdir()
    run_steps(workdir, json.dumps(doc), steps, lambda rng, seq, past: [normal(rng, seq, 3)],
              want, extra_args=("--states", sd))
    c_text = (workdir / "model.c").read_text()  # as run_steps compiled it
    check("copied after" in c_text and "{0ull, 0ull, 0ull}" in c_text,
          "the append is not in place (a state copy was emitted)")
    got = np.fromfile(sd / "state0.bin", dtype=np.float32)
    check(got.size == 9 * 3, f"state storage {got.size} floats, expected 27 (past + seq "
          "at most)")
    assert_close(got.reshape(9, 3)[:7], np.concatenate(cache), 0, 0, "the cache")


@case("state: a cache in the heads' layout [2, 3, past, 4], dynamic along that inner axis: "
      "appended by concat, copied into the state by the last dispatch, across runs of "
      "varying extent; the state read back")
def test_state_inner(workdir):
    workdir = Path(workdir)
    y = dyn_yaml({"seq": "1..3", "past": "0..6"}, {"x": {**W, "shape": [2, 3, "seq", 4]}},
                 [{"name": "all", "op": "concat", "inputs": ["c", "x"], "axis": 2},
                  {"name": "y", "op": "exp", "inputs": ["all"]}], ["y", "all"])
    doc = json.loads(y)
    doc["state"] = {"c": {**W, "shape": [2, 3, "past", 4], "update": "all"}}
    steps = [{"seq": 2, "past": 0}, {"seq": 1, "past": 2}, {"seq": 3, "past": 3},
             {"seq": 1, "past": 6}]
    cache = []

    def want(x, seq, past):
        check(sum(c.shape[2] for c in cache) == past, "test bug")
        cache.append(ref.f64(x))
        a = np.concatenate(cache, axis=2)
        return [np.exp(a), a]
    sd = workdir / "states"
    sd.mkdir()
    run_steps(workdir, json.dumps(doc), steps,
              lambda rng, seq, past: [normal(rng, 2, 3, seq, 4)], want,
              extra_args=("--states", sd))
    c_text = (workdir / "model.c").read_text()
    check("{0ull, 0ull, 0ull}" in c_text, "a byte copy of the state was emitted")
    got = np.fromfile(sd / "state0.bin", dtype=np.float32)
    check(got.size == 2 * 3 * 6 * 4, f"state storage {got.size} floats, expected 144 "
          "(its own largest shape)")
    # the last run (past 6, seq 1) leaves 7 positions, of which the state holds 6
    assert_close(got.reshape(2, 3, 6, 4), np.concatenate(cache, axis=2)[:, :, :6], 0, 0,
                 "the cache")


@case("state: keys roped straight into the cache (a partial rotation, n_rot < D), no "
      "copy for the append, across runs of varying extent")
def test_rope_append(workdir):
    workdir = Path(workdir)
    y = dyn_yaml({"seq": "1..3", "past": "0..6"},
                 {"x": {**W, "shape": [1, "seq", 2, 8]}, "cos": {**W, "shape": ["seq", 3]},
                  "sin": {**W, "shape": ["seq", 3]}},
                 [{"name": "r", "op": "rope", "inputs": ["x", "cos", "sin"], "seq_axis": 1,
                   "n_rot": 6},
                  {"name": "all", "op": "concat", "inputs": ["c", "r"], "axis": 1},
                  {"name": "y", "op": "exp", "inputs": ["all"]}], ["y"])
    doc = json.loads(y)
    doc["state"] = {"c": {**W, "shape": [1, "past", 2, 8], "update": "all"}}
    steps = [{"seq": 2, "past": 0}, {"seq": 1, "past": 2}, {"seq": 3, "past": 3},
             {"seq": 1, "past": 6}]
    cache = []

    def make(rng, seq, past):
        ang = rng.uniform(-3, 3, (seq, 3))
        return [normal(rng, 1, seq, 2, 8), np.cos(ang).astype(np.float32),
                np.sin(ang).astype(np.float32)]

    def want(x, c, s, seq, past):
        cache.append(ref.rope(x, c, s, False, 6, 1))
        return [np.exp(np.concatenate(cache, 1))]
    run_steps(workdir, json.dumps(doc), steps, make, want, rtol=1e-5, atol=1e-5)
    r = kiln("inspect", workdir / "model.yaml", "--format", "json")
    check(r.returncode == 0, r.stderr)
    nodes = [d["node"] for d in json.loads(r.stdout)["dispatches"]]
    check("all" not in nodes and nodes.count("r") == 2,
          f"expected the rope (and its tail) writing the state, no concat copy: {nodes}")


@case("state: a QKV product writes its keys and values straight into the caches (views "
      "of them appended), no copy for the appends, across runs of varying extent")
def test_qkv_append(workdir):
    workdir = Path(workdir)
    y = dyn_yaml({"seq": "1..3", "past": "0..6"}, {"x": {**W, "shape": [1, "seq", 16]}},
                 [{"name": "q", "op": "matmul", "inputs": ["x", "wq"]},
                  {"name": "k", "op": "matmul", "inputs": ["x", "wk"]},
                  {"name": "v", "op": "matmul", "inputs": ["x", "wv"]},
                  {"name": "k4", "op": "reshape", "inputs": ["k"], "shape": [1, -1, 2, 4]},
                  {"name": "v4", "op": "reshape", "inputs": ["v"], "shape": [1, -1, 2, 4]},
                  {"name": "ka", "op": "concat", "inputs": ["ck", "k4"], "axis": 1},
                  {"name": "va", "op": "concat", "inputs": ["cv", "v4"], "axis": 1},
                  {"name": "ke", "op": "exp", "inputs": ["ka"]},
                  {"name": "vn", "op": "neg", "inputs": ["va"]}], ["q", "ke", "vn"],
                 {"wq": weight([16, 16], 21), "wk": weight([16, 8], 22),
                  "wv": weight([16, 8], 23)})
    doc = json.loads(y)
    doc["state"] = {"ck": {**W, "shape": [1, "past", 2, 4], "update": "ka"},
                    "cv": {**W, "shape": [1, "past", 2, 4], "update": "va"}}
    steps = [{"seq": 2, "past": 0}, {"seq": 1, "past": 2}, {"seq": 3, "past": 3},
             {"seq": 1, "past": 6}]
    wq, wk, wv = w_of([16, 16], 21), w_of([16, 8], 22), w_of([16, 8], 23)
    ks, vs = [], []

    def want(x, seq, past):
        x64 = ref.f64(x)
        ks.append((x64 @ wk).reshape(1, seq, 2, 4))
        vs.append((x64 @ wv).reshape(1, seq, 2, 4))
        return [x64 @ wq, np.exp(np.concatenate(ks, 1)), -np.concatenate(vs, 1)]
    run_steps(workdir, json.dumps(doc), steps, lambda rng, seq, past: [normal(rng, 1, seq, 16)],
              want, rtol=1e-5, atol=1e-5)
    r = kiln("inspect", workdir / "model.yaml", "--format", "json")
    check(r.returncode == 0, r.stderr)
    nodes = [d["node"] for d in json.loads(r.stdout)["dispatches"]]
    # (its kernel variants by rows are dispatches of the one product)
    check(not {"ka", "va"} & set(nodes) and len({n for n in nodes if "q" in n and "k" in n}) == 1,
          f"expected one QKV product writing both caches and no concat copy: {nodes}")


@case("dynamic: ONNX --shape DIM=MIN..MAX makes a symbolic dimension dynamic; Shape of "
      "it folds as an expression of the dims; a Range that can be negative, a reshape "
      "merging two dynamic axes, a shape kiln cannot follow and an unused DIM are errors")
def test_onnx(workdir):
    import struct
    from test_onnx import attr, field, model, node, value_info
    workdir = Path(workdir)
    w = ref.init_normal([3, 4], 0.5, 12).astype(np.float32)
    init = (field(1, 3) + field(1, 4) + field(2, 1) + field(8, "w") +
            field(9, struct.pack("<12f", *w.ravel())))
    (workdir / "m.onnx").write_bytes(model(
        [node("MatMul", ["x", "w"], ["h"], "mm"), node("Relu", ["h"], ["y"], "r")],
        [value_info("x", ["seq", 3])], [value_info("y", ["seq", 4])], [init]))
    r = kiln("compile", workdir / "m.onnx", "--shape", "seq=1..16", "--name", "model",
             "-o", workdir / "model.c", "--guard")
    check(r.returncode == 0, r.stderr)
    run_built(link_model(workdir), seq_steps([1, 16, 5]),
              lambda rng, seq: [normal(rng, seq, 3)],
              lambda x, seq: [np.maximum(ref.f64(x) @ w, 0)])
    # Reshape to its own Shape, doubled along the rows by a Concat: [2 * seq, 3]
    sub = workdir / "s"
    sub.mkdir()
    (sub / "s.onnx").write_bytes(model(
        [node("Shape", ["x"], ["s"], "sh"),
         node("Concat", ["x", "x"], ["xx"], "cc", attr("axis", 0)),
         node("Mul", ["s", "k"], ["s4"], "mul"), node("Div", ["s4", "two"], ["s2"], "div"),
         node("Reshape", ["xx", "s2"], ["y"], "rs")],
        [value_info("x", ["seq", 3])], [value_info("y", ["dbl", 3])],
        [i64_init("k", [4, 1]), i64_init("two", [2, 1])]))
    r = kiln("compile", sub / "s.onnx", "--shape", "seq=1..16", "--name", "model",
             "-o", sub / "model.c")
    check(r.returncode == 0, r.stderr)
    run_built(link_model(sub), seq_steps([1, 16, 5]), lambda rng, seq: [normal(rng, seq, 3)],
              lambda x, seq: [np.concatenate([x, x])])
    # Range(2 * seq, 4, -2): seq - 2 elements 2 * seq, 2 * seq - 2, ..., 6, added to x's
    # first column (a range node whose start and size follow the dims)
    sub = workdir / "rd"
    sub.mkdir()
    (sub / "rd.onnx").write_bytes(model(
        [node("Shape", ["x"], ["s"], "sh"), node("Mul", ["s", "k"], ["s2"], "mul"),
         node("Gather", ["s2", "z0"], ["st"], "g"),
         node("Range", ["st", "four", "m2"], ["r"], "rg"), node("Cast", ["r"], ["rf"], "cf",
                                                                attr("to", 1)),
         node("Unsqueeze", ["rf", "one"], ["y"], "un")],
        [value_info("x", ["seq", 3])], [value_info("y", ["n", 1])],
        [i64_init("k", [2, 1]), i64_init("z0", 0), i64_init("four", 4), i64_init("m2", -2),
         i64_init("one", [1])]))
    r = kiln("compile", sub / "rd.onnx", "--shape", "seq=2..16", "--name", "model",
             "-o", sub / "model.c")
    check(r.returncode == 0, r.stderr)
    run_built(link_model(sub), seq_steps([2, 16, 5, 3]), lambda rng, seq: [normal(rng, seq, 3)],
              lambda x, seq: [np.arange(2 * seq, 4, -2, dtype=np.float32)[:, None]])
    # [1, 2, seq, 4] (the heads' layout) in and out: scores over the keys
    # x @ x^T [1, 2, seq, seq], a softmax over them, times x; and x moved to
    # [1, seq, 2, 4]
    sub = workdir / "h"
    sub.mkdir()
    (sub / "h.onnx").write_bytes(model(
        [node("Transpose", ["x"], ["xt"], "t", attr("perm", [0, 1, 3, 2])),
         node("MatMul", ["x", "xt"], ["sc"], "qk"),
         node("Softmax", ["sc"], ["p"], "sm", attr("axis", -1)),
         node("MatMul", ["p", "x"], ["y"], "pv"),
         node("Transpose", ["x"], ["z"], "t2", attr("perm", [0, 2, 1, 3]))],
        [value_info("x", [1, 2, "seq", 4])],
        [value_info("y", [1, 2, "seq", 4]), value_info("z", [1, "seq", 2, 4])]))
    r = kiln("compile", sub / "h.onnx", "--shape", "seq=1..12", "--name", "model",
             "-o", sub / "model.c")
    check(r.returncode == 0, r.stderr)
    run_built(link_model(sub), seq_steps([1, 12, 5, 2]),
              lambda rng, seq: [normal(rng, 1, 2, seq, 4)],
              lambda x, seq: [ref.softmax(ref.f64(x) @ ref.f64(x).transpose(0, 1, 3, 2)) @ x,
                              x.transpose(0, 2, 1, 3)], rtol=1e-4)
    # Range(0, seq - 9, 2): (seq - 9) / 2 elements, negative for seq < 9
    (workdir / "r.onnx").write_bytes(model(
        [node("Shape", ["x"], ["s"], "sh"), node("Range", ["nine", "s", "two0"], ["y"], "rg")],
        [value_info("x", ["seq", 3])], [value_info("y", ["n"])],
        [i64_init("nine", 9), i64_init("two0", 2)]))
    r = kiln("compile", workdir / "r.onnx", "--shape", "seq=1..16", "-o", workdir / "r.c")
    check(r.returncode == 1 and "rg (Range)" in r.stderr and "(seq - 9) / 2" in r.stderr and
          "negative for some dims" in r.stderr, r.stderr)
    # [b, seq, 3] flattened to [b * seq * 3]: the two dynamic axes and a
    # fixed one merged (repack.comp takes two adjacent dynamic axes alone)
    # are refused naming them
    (workdir / "p.onnx").write_bytes(model(
        [node("Reshape", ["x", "flat"], ["y"], "rs")],
        [value_info("x", ["b", "seq", 3])], [value_info("y", ["n"])], [i64_init("flat", [-1])]))
    r = kiln("compile", workdir / "p.onnx", "--shape", "b=1..4", "--shape", "seq=1..16",
             "-o", workdir / "p.c")
    check(r.returncode == 1 and "rs (Reshape)" in r.stderr and
          "would merge its dynamic axes 0 (b) and 1 (seq)" in r.stderr,
          f"exit {r.returncode}: {r.stderr}")
    # ... and a shape computed from the dims in a way kiln does not follow
    # (a division of a value that can be negative) is refused naming the
    # node that computed it
    (workdir / "q.onnx").write_bytes(model(
        [node("Shape", ["x"], ["s"], "sh"),
         node("Gather", ["s", "one0"], ["q"], "gq", attr("axis", 0)),
         node("Sub", ["q", "four"], ["q4"], "sub"),
         node("Div", ["q4", "two"], ["h"], "div"),
         node("Unsqueeze", ["h", "zl"], ["h1"], "un"),
         node("Concat", ["h1", "three"], ["shp"], "cat", attr("axis", 0)),
         node("Reshape", ["y0", "shp"], ["y"], "rs")],
        [value_info("x", [1, "seq", 3]), value_info("y0", [6])], [value_info("y", ["n", 3])],
        [i64_init("one0", 1), i64_init("four", 4), i64_init("two", 2), i64_init("zl", [0]),
         i64_init("three", [3])]))
    r = kiln("compile", workdir / "q.onnx", "--shape", "seq=1..16", "-o", workdir / "q.c")
    check(r.returncode == 1 and "rs (Reshape)" in r.stderr and
          "computed from the dims by node 'div' (Div)" in r.stderr,
          f"exit {r.returncode}: {r.stderr}")
    r = kiln("compile", workdir / "m.onnx", "--shape", "len=1..16", "--shape", "seq=1..4",
             "-o", workdir / "u.c")
    check(r.returncode == 1 and "no input has the symbolic dimension 'len'" in r.stderr,
          r.stderr)


def i64_init(name, values):
    """An int64 initializer: a list (1-D) or a number (a scalar)."""
    import struct
    from test_onnx import field
    vals = values if isinstance(values, list) else [values]
    dims = field(1, len(vals)) if isinstance(values, list) else b""
    return dims + field(2, 7) + field(8, name) + field(9, struct.pack(f"<{len(vals)}q", *vals))


def compile_error(workdir, yaml_text, *needles):
    workdir = Path(workdir)
    (workdir / "m.yaml").write_text(yaml_text)
    r = kiln("compile", workdir / "m.yaml", "-o", workdir / "m.c")
    check(r.returncode == 1, f"expected a compile error, got {r.returncode}: {needles}")
    check("m.yaml:" in r.stderr and all(n in r.stderr for n in needles),
          f"expected a located error with {needles}:\n{r.stderr}")
    check("Traceback" not in r.stderr and "internal" not in r.stderr, r.stderr)


@case("dynamic: graphs kiln cannot run dynamically are located compile errors")
def test_errors(workdir):
    x = {"x": {**W, "shape": ["seq", 4]}}
    ok_dims = {"seq": "1..64"}
    cases = [
        (ok_dims, x, [{"name": "y", "op": "add", "inputs": ["x", "p"]}],
         {"p": weight([64, 4], 1)}, ["fixed size 64"]),
        ({"b": "1..4", "seq": "1..64"}, {"x": {**W, "shape": ["b", "seq", 4]}},
         [{"name": "y", "op": "reduce_sum", "inputs": ["x"], "axes": [0, 1]}], None,
         ["reduces over 2 dynamic axes"]),
        (ok_dims, {"x": {**W, "shape": [1, 1, "seq", 4]}},
         [{"name": "y", "op": "max_pool", "inputs": ["x"], "kernel": [1, 2]}], None,
         ["dynamic along axis 2", "batch axis 0 only"]),
        (ok_dims, x, [{"name": "y", "op": "tile", "inputs": ["x"], "repeats": [1, 2]}], None,
         ["does not take a dynamic extent"]),
        (ok_dims, x, [{"name": "y", "op": "matmul", "inputs": ["w", "x"]}],
         {"w": weight([3, 64], 1)}, ["contracted axis"]),
        (ok_dims, x, [{"name": "y", "op": "slice", "inputs": ["x"], "starts": [1],
                       "ends": [5], "axes": [0]}], None, ["slices the dynamic axis",
                                                          "inside its range"]),
        (ok_dims, x, [{"name": "y", "op": "slice", "inputs": ["x"], "starts": [-2],
                       "ends": [99], "axes": [0]}], None, ["start -2", "counts from the run"]),
        (ok_dims, x, [{"name": "y", "op": "slice", "inputs": ["x"], "starts": [1],
                       "ends": [99], "axes": [0]}], None, ["leaves no elements",
                                                           "least value above 1"]),
        ({"seq": "4..2"}, x, [{"name": "y", "op": "exp", "inputs": ["x"]}], None,
         ["range 4..2"]),
        ({"seq": "1-8"}, x, [{"name": "y", "op": "exp", "inputs": ["x"]}], None,
         ["MIN..MAX"]),
        ({"seq": "3..3"}, x, [{"name": "y", "op": "exp", "inputs": ["x"]}], None,
         ["fixed size"]),
        ({"seq": "1..8"}, {"x": {**W, "shape": ["sq", 4]}},
         [{"name": "y", "op": "exp", "inputs": ["x"]}], None, ["'sq'"]),
        ({"seq": "1..8", "len": "1..4"}, x,
         [{"name": "y", "op": "exp", "inputs": ["x"]}], None, ["'len' is declared but no"]),
    ]
    # state: an update of another shape; a state listed as an output
    base = json.loads(dyn_yaml(ok_dims, x, [{"name": "y", "op": "exp", "inputs": ["s"]}],
                               ["y"]))
    base["state"] = {"s": {**W, "shape": [3, 4], "update": "x"}}
    cases_state = [(json.dumps(base), ["update 'x'", "must"])]
    base2 = dict(base, state={"s": {**W, "shape": ["seq", 4]}}, outputs=["s"])
    cases_state.append((json.dumps(base2), ["'s' is a state"]))
    base3 = dict(base, state={"s": {**W, "shape": [3, 4], "update": "nope"}})
    cases_state.append((json.dumps(base3), ["'nope' is not defined"]))
    # a state grows along one axis
    base4 = dict(base, inputs={"x": {**W, "shape": ["seq", "seq"]}},
                 state={"s": {**W, "shape": ["seq", "seq"], "update": "x"}})
    cases_state.append((json.dumps(base4), ["state 's'", "two dynamic"]))
    for k, (text, needles) in enumerate(cases_state):
        sub = Path(workdir) / f"s{k}"
        sub.mkdir()
        compile_error(sub, text, *needles)
    for k, (dims, ins, nodes, weights, needles) in enumerate(cases):
        sub = Path(workdir) / f"c{k}"
        sub.mkdir()
        compile_error(sub, dyn_yaml(dims, ins, nodes, ["y"], weights), *needles)


@case("dynamic: ONNX Slices whose ends follow the dims on a dynamic axis: torch.diff's "
      "x[..., :n - 1] and x[..., 1:n] of [1, seq + 1] (as transformers' packed-sequence check "
      "writes it); ends past the axis's extent refused")
def test_onnx_slice_dynamic_end(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)

    def diff_model(end_of_b):
        return model(
            [node("Shape", ["x"], ["s"], "sh", attr("start", 1)),
             node("Slice", ["x", "z", "one", "m1"], ["x0"], "first"),
             node("Sub", ["x0", "onef"], ["p"], "prepend"),
             node("Concat", ["p", "x"], ["cat"], "cat", attr("axis", -1)),
             node("Add", ["s", "one"], ["s1"], "plus1"),
             node("Slice", ["cat", "z", "s", "m1"], ["a"], "head"),
             node("Slice", ["cat", "one", end_of_b, "m1"], ["b"], "tail"),
             node("Sub", ["b", "a"], ["y"], "diff")],
            [value_info("x", [2, "seq"])], [value_info("y", [2, "seq"])],
            [i64_init("z", [0]), i64_init("one", [1]), i64_init("m1", [-1]),
             initializer("onef", np.float32(1.0))])
    (workdir / "d.onnx").write_bytes(diff_model("s1"))
    r = kiln("compile", workdir / "d.onnx", "--shape", "seq=2..24", "--name", "model",
             "-o", workdir / "model.c", "--guard")
    check(r.returncode == 0, r.stderr)

    def diff(x, seq):
        cat = np.concatenate([x[:, :1] - 1, x], axis=-1)
        return [cat[:, 1:] - cat[:, :-1]]
    run_built(link_model(workdir), seq_steps([2, 24, 9, 3]),
              lambda rng, seq: [normal(rng, 2, seq)], diff)
    # an end of seq + 2 on an axis of seq + 1 would pass the axis's end
    sub = workdir / "past"
    sub.mkdir()
    (sub / "p.onnx").write_bytes(model(
        [node("Shape", ["x"], ["s"], "sh", attr("start", 1)),
         node("Concat", ["x", "x"], ["cat"], "cat", attr("axis", -1)),
         node("Add", ["s", "s"], ["s2"], "dbl"), node("Add", ["s2", "one"], ["e"], "plus1"),
         node("Slice", ["cat", "z", "e", "m1"], ["y"], "over")],
        [value_info("x", [2, "seq"])], [value_info("y", [2, "n"])],
        [i64_init("z", [0]), i64_init("one", [1]), i64_init("m1", [-1])]))
    r = kiln("compile", sub / "p.onnx", "--shape", "seq=2..24", "-o", sub / "p.c")
    check(r.returncode == 1 and "'over (Slice)'" in r.stderr and "2*seq + 1" in r.stderr and
          "the axis's extent or a constant less" in r.stderr, f"exit {r.returncode}: {r.stderr}")


@case("dynamic: ONNX shape arithmetic that is no sum of the dims follows derived dims, "
      "evaluated by kiln_model_set_dims: Range(0, seq, 2) of (seq + 1)/2 elements, "
      "Range(0, seq / 3) (Div rounding down), Range(0, Max(seq, 5)); the header and "
      "kiln inspect (text and json, with each tensor's extents) name them")
def test_onnx_derived(workdir):
    from test_onnx import model, node, value_info
    workdir = Path(workdir)
    (workdir / "d.onnx").write_bytes(model(
        [node("Shape", ["x"], ["s"], "sh"),
         node("Range", ["z0", "s", "two"], ["r2"], "half"),
         node("Div", ["s", "three"], ["q3"], "third"),
         node("Range", ["z0", "q3", "one"], ["r3"], "rthird"),
         node("Max", ["s", "five"], ["m5"], "atleast5"),
         node("Range", ["z0", "m5", "one"], ["r5"], "rmax"),
         # an exact division by a negative constant stays a sum: -4*seq / -2
         node("Mul", ["s", "mfour"], ["s4"], "times"),
         node("Div", ["s4", "mtwo"], ["s2"], "exact"),
         node("Range", ["z0", "s2", "one"], ["r6"], "rexact"),
         node("Mul", ["x", "x"], ["y"], "sq")],
        [value_info("x", ["seq"])],
        [value_info("r2", ["a"], elem=7), value_info("r3", ["b"], elem=7),
         value_info("r5", ["c"], elem=7), value_info("r6", ["d"], elem=7),
         value_info("y", ["seq"])],
        [i64_init("z0", 0), i64_init("one", 1), i64_init("two", 2), i64_init("three", [3]),
         i64_init("five", [5]), i64_init("mfour", [-4]), i64_init("mtwo", [-2])]))
    r = kiln("compile", workdir / "d.onnx", "--shape", "seq=1..16", "--name", "model",
             "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)
    c = (workdir / "model.c").read_text()
    for name, op in (("(seq + 1)/2", "DIV"), ("seq/3", "DIV"), ("max(seq, 5)", "MAX")):
        check(f'{{"{name}", KILN_DIM_{op},' in c, f"no derived dim {name}")
    r = kiln("inspect", workdir / "d.onnx", "--shape", "seq=1..16")
    check("(seq + 1)/2 1..8 (derived)" in r.stdout and "seq/3 0..5 (derived)" in r.stdout and
          "max(seq, 5) 5..16 (derived)" in r.stdout, r.stdout)
    r = kiln("inspect", workdir / "d.onnx", "--shape", "seq=1..16", "--format", "json")
    js = json.loads(r.stdout)
    check(js["dims"] == [{"name": "seq", "min": 1, "max": 16, "derived": None},
                         {"name": "(seq + 1)/2", "min": 1, "max": 8, "derived": "div"},
                         {"name": "seq/3", "min": 0, "max": 5, "derived": "div"},
                         {"name": "max(seq, 5)", "min": 5, "max": 16, "derived": "max"}],
          f"json dims {js['dims']}")
    ext = {t["name"]: t.get("extents") for t in js["tensors"]}
    check(ext.get("r2") == ["(seq + 1)/2"] and ext.get("x") == ["seq"],
          f"json extents {ext}")
    run_built(link_model(workdir), seq_steps([1, 2, 7, 16, 5, 12, 3]),
              lambda rng, seq: [normal(rng, seq)],
              lambda x, seq: [np.arange(0, seq, 2), np.arange(0, seq // 3),
                              np.arange(0, max(seq, 5)), np.arange(0, 2 * seq), x * x])


def batch_seq_case(dtype):
    """[b, seq, 8] viewed as rows [b*seq, 8] (as a linear layer of a model with
    a dynamic batch and sequence writes it: Shape, Gather, Mul, Concat,
    Reshape), a product, bias and relu on the rows, and viewed back as
    [b, seq, 6]: the reshapes become repacks (the run's elements moved
    between the holes of [b, seq] and a prefix of [b*seq]); both the rows
    and the result are outputs. dtype f32, or i64 rows (a Cast around the
    second view, its elements moved 8 bytes at a time)."""
    def test(workdir):
        from test_onnx import attr, initializer, model, node, value_info
        workdir = Path(workdir)
        rng = np.random.default_rng(31)
        w = rng.standard_normal((8, 6)).astype(np.float32)
        bias = rng.standard_normal(6).astype(np.float32)
        i64 = dtype == "i64"
        nodes = [node("Shape", ["x"], ["s"], "sh"),
                 node("Gather", ["s", "z0"], ["b"], "gb", attr("axis", 0)),
                 node("Gather", ["s", "one0"], ["q"], "gq", attr("axis", 0)),
                 node("Mul", ["b", "q"], ["bq"], "rows"),
                 node("Unsqueeze", ["bq", "zl"], ["bq1"], "un"),
                 node("Concat", ["bq1", "eight"], ["shp"], "cat", attr("axis", 0)),
                 node("Reshape", ["x", "shp"], ["x2"], "pack"),
                 node("MatMul", ["x2", "w"], ["m"], "mm"),
                 node("Add", ["m", "bias"], ["mb"], "addb"),
                 node("Relu", ["mb"], ["h0"], "relu")]
        if i64:
            nodes += [node("Cast", ["h0"], ["h"], "toint", attr("to", 7))]
        else:
            nodes += [node("Identity", ["h0"], ["h"], "id")]
        nodes += [node("Unsqueeze", ["b", "zl"], ["b1"], "ub"),
                  node("Unsqueeze", ["q", "zl"], ["q1"], "uq"),
                  node("Concat", ["b1", "q1", "six"], ["shp2"], "cat2", attr("axis", 0)),
                  node("Reshape", ["h", "shp2"], ["y"], "unpack")]
        elem = 7 if i64 else 1
        (workdir / "bs.onnx").write_bytes(model(
            nodes, [value_info("x", ["b", "seq", 8])],
            [value_info("h", ["n", 6], elem=elem), value_info("y", ["b", "seq", 6], elem=elem)],
            [i64_init("z0", 0), i64_init("one0", 1), i64_init("zl", [0]),
             i64_init("eight", [8]), i64_init("six", [6]), initializer("w", w),
             initializer("bias", bias)]))
        r = kiln("compile", workdir / "bs.onnx", "--shape", "b=1..4", "--shape", "seq=1..12",
                 "--name", "model", "-o", workdir / "model.c")
        check(r.returncode == 0, r.stderr)
        c = (workdir / "model.c").read_text()
        check(c.count("k0 repack") + c.count(" repack ") >= 2 and
              '{"b*seq", KILN_DIM_MUL,' in c, "no repack dispatches or no derived b*seq")

        def reference(x, b, seq):
            h = np.maximum(x.reshape(b * seq, 8).astype(np.float64) @ w + bias, 0)
            h = np.trunc(h).astype(np.int64) if i64 else h
            return [h, h.reshape(b, seq, 6)]
        steps = [{"b": b, "seq": q} for b, q in ((1, 1), (2, 5), (4, 12), (3, 7), (1, 12),
                                                 (4, 1), (2, 9))]
        run_built(link_model(workdir), steps,
                  lambda rng, b, seq: [(rng.standard_normal((b, seq, 8)) *
                                        (3 if i64 else 1)).astype(np.float32)],
                  reference, rtol=1e-4, atol=1e-4)
    return test


for _dt in ("f32", "i64"):
    case(f"op repack: ONNX [b, seq, 8] viewed as [b*seq, 8] rows and back (a dynamic batch "
         f"and sequence): the reshapes move the run's elements (repack.comp), the rows follow "
         f"the derived b*seq, {_dt}")(batch_seq_case(_dt))


@case("op repack: ONNX [3, seq, 8] (a fixed batch of 3, a dynamic sequence) viewed as "
      "[3*seq, 8] rows ([-1, 8]), a product, bias and relu, and back to [3, seq, 6] (a shape "
      "computed from Shape): the rows follow 3 seq, no derived dim")
def test_repack_fixed_batch(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    rng = np.random.default_rng(47)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    (workdir / "fb.onnx").write_bytes(model(
        [node("Reshape", ["x", "rows"], ["x2"], "pack"),
         node("MatMul", ["x2", "w"], ["m"], "mm"),
         node("Add", ["m", "bias"], ["mb"], "addb"),
         node("Relu", ["mb"], ["h"], "relu"),
         node("Shape", ["x"], ["s"], "sh"),
         node("Gather", ["s", "one0"], ["q"], "gq", attr("axis", 0)),
         node("Unsqueeze", ["q", "zl"], ["q1"], "uq"),
         node("Concat", ["three", "q1", "six"], ["shp"], "cat", attr("axis", 0)),
         node("Reshape", ["h", "shp"], ["y"], "unpack")],
        [value_info("x", [3, "seq", 8])],
        [value_info("h", ["n", 6]), value_info("y", [3, "seq", 6])],
        [i64_init("rows", [-1, 8]), i64_init("one0", 1), i64_init("zl", [0]),
         i64_init("three", [3]), i64_init("six", [6]), initializer("w", w),
         initializer("bias", bias)]))
    r = kiln("compile", workdir / "fb.onnx", "--shape", "seq=1..10", "--name", "model",
             "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)
    c = (workdir / "model.c").read_text()
    check(c.count(" repack ") >= 2 and "KILN_DIM_MUL" not in c,
          "no repack dispatches, or a derived dim")
    steps = [{"seq": q} for q in (1, 10, 4, 7, 1, 9)]
    run_built(link_model(workdir), steps,
              lambda rng, seq: [normal(rng, 3, seq, 8)],
              lambda x, seq: [np.maximum(x.reshape(3 * seq, 8).astype(np.float64) @ w + bias,
                                         0),
                              np.maximum(x.reshape(3 * seq, 8).astype(np.float64) @ w + bias,
                                         0).reshape(3, seq, 6)], rtol=1e-4, atol=1e-4)


def batched_rows_case(flags):
    def test(workdir):
        from test_onnx import initializer, model, node, value_info
        workdir = Path(workdir)
        rng = np.random.default_rng(53)
        w = rng.standard_normal((8, 6)).astype(np.float32)
        bias = rng.standard_normal(6).astype(np.float32)
        wb = rng.standard_normal((2, 6, 5)).astype(np.float32)
        (workdir / "br.onnx").write_bytes(model(
            [node("MatMul", ["x", "w"], ["m"], "mm"),
             node("Add", ["m", "bias"], ["mb"], "addb"),
             node("Relu", ["mb"], ["h"], "relu"),
             node("MatMul", ["h", "wb"], ["y"], "mm2")],
            [value_info("x", [2, "seq", 8])],
            [value_info("h", [2, "seq", 6]), value_info("y", [2, "seq", 5])],
            [initializer("w", w), initializer("bias", bias), initializer("wb", wb)]))
        r = kiln("compile", workdir / "br.onnx", "--shape", "seq=1..40", "--name", "model",
                 "-o", workdir / "model.c", *flags)
        check(r.returncode == 0, r.stderr)
        # each product: the matrix-vector kernel up to 16 rows a batch, the
        # tiled one above, both bounded by the run's rows, two batches each
        # (in f16 too: products of at most 64 x 64 a batch never take
        # coopmat.comp: coopmat_takes)
        c = (workdir / "model.c").read_text()
        blocks = re.findall(r"/\* kernel \d+: (matvec|matmul|coopmat)\n(.*?)\*/", c, re.S)
        rows = [(k, re.findall(r"^ \*   (?:MROWS|M) (.*)$", b, re.M)[-1],
                 re.findall(r"^ \*   BATCH (.*)$", b, re.M)) for k, b in blocks]
        want = 4
        check(len(rows) == want and all("KILN_DIM" in m and bt == ["2"] for _, m, bt in rows),
              f"not {want} product kernels of two batches with rows that follow seq: {rows}")

        def reference(x, seq):
            h = np.maximum(x.astype(np.float64) @ w + bias, 0)
            return [h, h @ wb]

        compare = precision_compare(bool(flags), 1e-4, 1e-4)
        run_built(link_model(workdir), seq_steps((1, 40, 17, 3, 33, 16, 1)),
                  lambda rng, seq: [normal(rng, 2, seq, 8)], reference, compare=compare)
    return test


for _flags in ((), ("--precision", "f16")):
    case("dynamic: batched products whose rows follow the dims in each batch: ONNX [2, seq, "
         "8] x [8, 6] (a shared weight, not folded into 2 x 40 rows), bias and relu fused, "
         "then [2, seq, 6] x [2, 6, 5]; the matrix-vector kernel to 16 rows, tiled above"
         + (", " + " ".join(_flags) if _flags else ""))(batched_rows_case(_flags))


@case("op repack: ONNX [2, b, seq, 4] viewed as [2, b*seq, 4] and back (an outer axis: the "
      "merged run is no prefix, the whole largest shape is visited)")
def test_repack_outer(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    bias = np.arange(4, dtype=np.float32) + 0.5
    (workdir / "o.onnx").write_bytes(model(
        [node("Shape", ["x"], ["s"], "sh"),
         node("Gather", ["s", "one0"], ["b"], "gb", attr("axis", 0)),
         node("Gather", ["s", "two0"], ["q"], "gq", attr("axis", 0)),
         node("Mul", ["b", "q"], ["bq"], "rows"),
         node("Unsqueeze", ["bq", "zl"], ["bq1"], "un"),
         node("Concat", ["twol", "bq1", "four"], ["shp"], "cat", attr("axis", 0)),
         node("Reshape", ["x", "shp"], ["x2"], "pack"),
         node("Add", ["x2", "bias"], ["h"], "addb"),
         node("Unsqueeze", ["b", "zl"], ["b1"], "ub"),
         node("Unsqueeze", ["q", "zl"], ["q1"], "uq"),
         node("Concat", ["twol", "b1", "q1", "four"], ["shp2"], "cat2", attr("axis", 0)),
         node("Reshape", ["h", "shp2"], ["y"], "unpack")],
        [value_info("x", [2, "b", "seq", 4])],
        [value_info("h", [2, "n", 4]), value_info("y", [2, "b", "seq", 4])],
        [i64_init("one0", 1), i64_init("two0", 2), i64_init("zl", [0]), i64_init("twol", [2]),
         i64_init("four", [4]), initializer("bias", bias)]))
    r = kiln("compile", workdir / "o.onnx", "--shape", "b=1..3", "--shape", "seq=1..5",
             "--name", "model", "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)
    check((workdir / "model.c").read_text().count(" repack ") >= 2, "no repack dispatches")
    steps = [{"b": b, "seq": q} for b, q in ((1, 1), (3, 5), (2, 3), (1, 5), (3, 1))]
    run_built(link_model(workdir), steps,
              lambda rng, b, seq: [normal(rng, 2, b, seq, 4)],
              lambda x, b, seq: [x.reshape(2, b * seq, 4) + bias, x + bias])


@case("op repack: ONNX Flatten(axis 2) of [b, seq, 4] (the legacy exporter's flatten(0, 1)) "
      "packs the run's rows")
def test_repack_flatten(workdir):
    from test_onnx import attr, model, node, value_info
    workdir = Path(workdir)
    (workdir / "f.onnx").write_bytes(model(
        [node("Flatten", ["x"], ["f"], "fl", attr("axis", 2)),
         node("Relu", ["f"], ["y"], "relu")],
        [value_info("x", ["b", "seq", 4])], [value_info("y", ["n", 4])]))
    r = kiln("compile", workdir / "f.onnx", "--shape", "b=1..3", "--shape", "seq=1..6",
             "--name", "model", "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)
    check(" repack " in (workdir / "model.c").read_text(), "no repack dispatch")
    steps = [{"b": b, "seq": q} for b, q in ((2, 3), (3, 6), (1, 1), (3, 2))]
    run_built(link_model(workdir), steps, lambda rng, b, seq: [normal(rng, b, seq, 4)],
              lambda x, b, seq: [np.maximum(x.reshape(b * seq, 4), 0)])


@case("dynamic: ONNX self-attention over a dynamic batch and sequence ([b, seq, 16], two "
      "heads: Q, K, V products, reshapes to [b, seq, 2, 8] from Shape, transposes, scores, "
      "softmax, values, back to [b, seq, 16]) at six (b, seq) pairs")
def test_batch_seq_attention(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    rng = np.random.default_rng(41)
    w = {k: (rng.standard_normal((16, 16)) * 0.3).astype(np.float32) for k in "qkv"}
    nodes = [node("Shape", ["x"], ["s"], "sh"),
             node("Gather", ["s", "z0"], ["b"], "gb", attr("axis", 0)),
             node("Gather", ["s", "one0"], ["q"], "gq", attr("axis", 0)),
             node("Unsqueeze", ["b", "zl"], ["b1"], "ub"),
             node("Unsqueeze", ["q", "zl"], ["q1"], "uq"),
             node("Concat", ["b1", "q1", "hd"], ["shp4"], "c4", attr("axis", 0)),
             node("Concat", ["b1", "q1", "c16"], ["shp3"], "c3", attr("axis", 0))]
    for k in "qkv":
        nodes += [node("MatMul", ["x", "w" + k], [k + "p"], k + "proj"),
                  node("Reshape", [k + "p", "shp4"], [k + "r"], k + "heads"),
                  node("Transpose", [k + "r"], [k + "t"], k + "t", attr("perm", [0, 2, 1, 3]))]
    nodes += [node("Transpose", ["kt"], ["ktt"], "kT", attr("perm", [0, 1, 3, 2])),
              node("MatMul", ["qt", "ktt"], ["sc"], "scores"),
              node("Mul", ["sc", "scale"], ["scs"], "scaled"),
              node("Softmax", ["scs"], ["p"], "sm", attr("axis", -1)),
              node("MatMul", ["p", "vt"], ["o"], "pv"),
              node("Transpose", ["o"], ["ot"], "ot", attr("perm", [0, 2, 1, 3])),
              node("Reshape", ["ot", "shp3"], ["y"], "merge")]
    (workdir / "a.onnx").write_bytes(model(
        nodes, [value_info("x", ["b", "seq", 16])], [value_info("y", ["b", "seq", 16])],
        [i64_init("z0", 0), i64_init("one0", 1), i64_init("zl", [0]), i64_init("hd", [2, 8]),
         i64_init("c16", [16]), initializer("scale", np.array(8 ** -0.5, np.float32))] +
        [initializer("w" + k, w[k]) for k in "qkv"]))
    r = kiln("compile", workdir / "a.onnx", "--shape", "b=1..3", "--shape", "seq=1..9",
             "--name", "model", "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)

    def reference(x, b, seq):
        x = x.astype(np.float64)
        q, k, v = ((x @ w[c]).reshape(b, seq, 2, 8).transpose(0, 2, 1, 3) for c in "qkv")
        p = ref.softmax(q @ k.transpose(0, 1, 3, 2) * 8 ** -0.5)
        return [(p @ v).transpose(0, 2, 1, 3).reshape(b, seq, 16)]
    steps = [{"b": b, "seq": q} for b, q in ((1, 1), (3, 9), (2, 4), (1, 9), (3, 1), (2, 7))]
    run_built(link_model(workdir), steps, lambda rng, b, seq: [normal(rng, b, seq, 16)],
              reference, rtol=1e-4, atol=1e-5)


def repack_fixed_case(inner, out_inner, seed):
    """YAML [2, seq, *inner] reshaped to [-1, 8] rows, a product by [8, 6],
    and reshaped to the largest [2, 7, *out_inner]: both reshapes repack,
    the rows follow 2 seq."""
    def test(workdir):
        rng = np.random.default_rng(seed)
        w = rng.standard_normal((8, 6)).astype(np.float32)
        y = dyn_yaml({"seq": "1..7"},
                     {"x": {"dtype": "f32", "shape": [2, "seq", *inner]}},
                     [{"name": "rows", "op": "reshape", "inputs": ["x"], "shape": [-1, 8]},
                      {"name": "h", "op": "matmul", "inputs": ["rows", "w"]},
                      {"name": "y", "op": "reshape", "inputs": ["h"],
                       "shape": [2, 7, *out_inner]}],
                     ["h", "y"], {"w": {"dtype": "f32", "shape": [8, 6],
                                        "values": w.ravel().tolist()}})
        prog = build_model(workdir, y)
        check((Path(workdir) / "model.c").read_text().count(" repack ") >= 2,
              "no repack dispatches")
        steps = [{"seq": q} for q in (1, 7, 3, 6, 1)]
        run_built(prog, steps, lambda rng, seq: [normal(rng, 2, seq, *inner)],
                  lambda x, seq: [x.reshape(2 * seq, 8) @ w, (x.reshape(2 * seq, 8) @ w)
                                  .reshape(2, seq, *out_inner)], rtol=1e-4, atol=1e-5)
    return test


case("op repack: YAML [2, seq, 8] (a fixed batch) reshaped to [-1, 8] rows, a product, and "
     "reshaped to the largest [2, 7, 6]: the rows follow 2 seq, the result seq")(
    repack_fixed_case([8], [6], 53))
case("op repack: YAML [2, seq, 2, 4] reshaped to [-1, 8] rows at once (the batch and sequence "
     "merged, the heads' axes regrouped: GPT-2's merge of heads and Conv1D view), a product, "
     "and back to the largest [2, 7, 3, 2]")(repack_fixed_case([2, 4], [3, 2], 59))


@case("op repack: YAML [b, seq, 8] reshaped to [-1, 8] rows, a product, and reshaped to the "
      "largest [4, 8, 6] (dims b and seq: the rows follow b*seq, the result b and seq)")
def test_repack_yaml(workdir):
    rng = np.random.default_rng(43)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    y = dyn_yaml({"b": "1..4", "seq": "1..8"},
                 {"x": {"dtype": "f32", "shape": ["b", "seq", 8]}},
                 [{"name": "rows", "op": "reshape", "inputs": ["x"], "shape": [-1, 8]},
                  {"name": "h", "op": "matmul", "inputs": ["rows", "w"]},
                  {"name": "y", "op": "reshape", "inputs": ["h"], "shape": [4, 8, 6]}],
                 ["h", "y"], {"w": {"dtype": "f32", "shape": [8, 6],
                                    "values": w.ravel().tolist()}})
    prog = build_model(workdir, y)
    c = (Path(workdir) / "model.c").read_text()
    check(c.count(" repack ") >= 2 and '{"b*seq", KILN_DIM_MUL,' in c,
          "no repack dispatches or no derived b*seq")
    steps = [{"b": b, "seq": q} for b, q in ((1, 1), (4, 8), (2, 5), (3, 1), (1, 8))]
    run_built(prog, steps, lambda rng, b, seq: [normal(rng, b, seq, 8)],
              lambda x, b, seq: [x.reshape(b * seq, 8) @ w, (x.reshape(b * seq, 8) @ w)
                                 .reshape(b, seq, 6)], rtol=1e-4, atol=1e-5)


@case("dynamic: ONNX Slice of a constant table up to the sequence length (BERT's "
      "position_ids[:, :seq], and from 2 to seq + 2), its prefix gathered by Gather and "
      "GatherElements into [2, seq, 4] at six lengths; other dynamic slice bounds refused")
def test_slice_dynamic_end(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    rng = np.random.default_rng(61)
    table = rng.permutation(40).astype(np.int64)[None]  # [1, 40] positions, shuffled
    emb = rng.standard_normal((40, 4)).astype(np.float32)
    types = rng.standard_normal((1, 40)).astype(np.float32)

    def graph(slice_b):
        return model(
            [node("Shape", ["x"], ["s"], "sh", attr("start", 1) + attr("end", 2)),
             node("Add", ["s", "two"], ["s2"], "plus2"),
             node("Slice", ["table", "zl", "s", "onel"], ["pos"], "prefix"),
             slice_b,
             node("Gather", ["emb", "pos"], ["e"], "lookup", attr("axis", 0)),
             node("GatherElements", ["types", "pos2"], ["t"], "types_of",
                  attr("axis", 1)),
             node("Unsqueeze", ["t", "minus1"], ["t3"], "t3"),
             node("Add", ["x", "e"], ["xe"], "add_e"),
             node("Add", ["xe", "t3"], ["y"], "add_t")],
            [value_info("x", [2, "seq", 4])], [value_info("y", [2, "seq", 4])],
            [initializer("table", table), initializer("emb", emb),
             initializer("types", types), i64_init("zl", [0]), i64_init("onel", [1]),
             i64_init("two", [2]), i64_init("twol", [2]), i64_init("minus1", [-1])])
    (workdir / "s.onnx").write_bytes(graph(
        node("Slice", ["table", "twol", "s2", "onel"], ["pos2"], "shifted")))
    r = kiln("compile", workdir / "s.onnx", "--shape", "seq=1..32", "--name", "model", "-o",
             workdir / "model.c")
    check(r.returncode == 0, r.stderr)

    def reference(x, seq):
        pos, pos2 = table[:, :seq], table[:, 2:seq + 2]
        return [x + emb[pos] + np.take_along_axis(types, pos2, 1)[..., None]]
    steps = [{"seq": s} for s in (1, 5, 32, 13, 2, 32)]
    run_built(link_model(workdir), steps, lambda rng, seq: [normal(rng, 2, seq, 4)], reference)
    # a dynamic end with step 2, or past the table at the largest dims: refused by name
    for bad, what in ((node("Slice", ["table", "twol", "s2", "onel", "twol"], ["pos2"],
                            "shifted"), "step 2"),
                      (node("Slice", ["table", "zl", "s2", "onel"], ["pos2"], "shifted"),
                       "an end of 41 over 40 elements")):
        (workdir / "bad.onnx").write_bytes(graph(bad))
        r = kiln("compile", workdir / "bad.onnx", "--shape", "seq=1..39", "-o",
                 workdir / "bad.c")
        check(r.returncode != 0 and "'shifted (Slice)'" in r.stderr and
              "follows the dynamic dims" in r.stderr, f"{what}: {r.stderr}")


@case("dynamic: ONNX [b, 2, seq, 4] viewed as [2b, seq, 4] (batch and heads merged), a product, "
      "and viewed back as [b, 2, seq, 3] from Shape (a dynamic axis split into itself and the "
      "fixed heads inside it, as exported attention does at a dynamic batch) at six (b, seq)")
def test_split_dynamic_heads(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    w = (np.random.default_rng(67).standard_normal((4, 3)) * 0.5).astype(np.float32)
    (workdir / "h.onnx").write_bytes(model(
        [node("Shape", ["x"], ["s"], "sh"),
         node("Gather", ["s", "z0"], ["b"], "gb"),
         node("Gather", ["s", "two0"], ["q"], "gq"),
         node("Unsqueeze", ["b", "zl"], ["b1"], "ub"),
         node("Unsqueeze", ["q", "zl"], ["q1"], "uq"),
         node("Concat", ["m1", "q1", "four"], ["shp1"], "c1", attr("axis", 0)),
         node("Reshape", ["x", "shp1"], ["m"], "merge"),
         node("MatMul", ["m", "w"], ["r"], "proj"),
         node("Concat", ["b1", "twol", "q1", "three"], ["shp2"], "c2", attr("axis", 0)),
         node("Reshape", ["r", "shp2"], ["y"], "split")],
        [value_info("x", ["b", 2, "seq", 4])], [value_info("y", ["b", 2, "seq", 3])],
        [i64_init("z0", 0), i64_init("two0", 2), i64_init("zl", [0]), i64_init("m1", [-1]),
         i64_init("four", [4]), i64_init("twol", [2]), i64_init("three", [3]),
         initializer("w", w)]))
    r = kiln("compile", workdir / "h.onnx", "--shape", "b=1..4", "--shape", "seq=1..9",
             "--name", "model", "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)
    steps = [{"b": b, "seq": q} for b, q in ((1, 1), (4, 9), (2, 4), (3, 9), (4, 1), (2, 7))]
    run_built(link_model(workdir), steps, lambda rng, b, seq: [normal(rng, b, 2, seq, 4)],
              lambda x, b, seq: [(x.reshape(2 * b, seq, 4) @ w).reshape(b, 2, seq, 3)],
              rtol=1e-5, atol=1e-6)


@case("dynamic: ONNX CumSum along the dynamic axis (RoBERTa's position ids: a forward "
      "cumulative count of its tokens over the sequence, int64) at six (b, seq); reverse along "
      "it refused")
def test_cumsum_dynamic_axis(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)

    def graph(attrs):
        return model([node("Equal", ["x", "pad"], ["e"], "is_pad"),
                      node("Not", ["e"], ["ne"], "not_pad"),
                      node("Cast", ["ne"], ["m"], "mask", attr("to", 7)),
                      node("CumSum", ["m", "ax"], ["c"], "count", attrs),
                      node("Mul", ["c", "m"], ["y"], "keep")],
                     [value_info("x", ["b", "seq"], 7)], [value_info("y", ["b", "seq"], 7)],
                     [initializer("pad", np.array(1, np.int64)),
                      initializer("ax", np.array(1, np.int64))])
    (workdir / "c.onnx").write_bytes(graph(b""))
    r = kiln("compile", workdir / "c.onnx", "--shape", "b=1..3", "--shape", "seq=1..40",
             "--name", "model", "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)

    def reference(x, b, seq):
        m = (x != 1).astype(np.int64)
        return [np.cumsum(m, 1) * m]
    steps = [{"b": b, "seq": q} for b, q in ((1, 1), (3, 40), (2, 7), (3, 1), (1, 40), (2, 23))]
    run_built(link_model(workdir), steps,
              lambda rng, b, seq: [rng.integers(0, 4, [b, seq]).astype(np.int64)], reference)
    (workdir / "r.onnx").write_bytes(graph(attr("reverse", 1)))
    r = kiln("compile", workdir / "r.onnx", "--shape", "b=1..3", "--shape", "seq=1..40", "-o",
             workdir / "r.c")
    check(r.returncode != 0 and "'count (CumSum)'" in r.stderr and "dynamic axis" in r.stderr,
          f"a reverse cumsum along the dynamic axis: {r.stderr}")


@case("dynamic: ONNX reductions over the dynamic sequence (a sentence embedding's masked mean "
      "pooling: ReduceSum of x * mask over the tokens over the mask's count; ReduceMean, "
      "ReduceMax kept, ArgMax, ReduceLogSumExp over [b, seq, 8]) at six (b, seq); two dynamic "
      "axes reduced refused")
def test_reduce_dynamic_axis(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    one = i64_init("ax1", [1])
    nodes = [node("Cast", ["mask"], ["mf"], "mf", attr("to", 1)),
             node("Unsqueeze", ["mf", "axm1"], ["m3"], "m3"),
             node("Mul", ["x", "m3"], ["xm"], "xm"),
             node("ReduceSum", ["xm", "ax1"], ["s"], "sum", attr("keepdims", 0)),
             node("ReduceSum", ["m3", "ax1"], ["cnt"], "count", attr("keepdims", 0)),
             node("Max", ["cnt", "tiny"], ["cntc"], "clamp"),
             node("Div", ["s", "cntc"], ["pooled"], "pool"),
             node("ReduceMean", ["x", "ax1"], ["mean"], "mean", attr("keepdims", 0)),
             node("ReduceMax", ["x", "ax1"], ["mx"], "max"),
             node("ArgMax", ["x"], ["am"], "argmax", attr("axis", 1) + attr("keepdims", 0)),
             node("ReduceLogSumExp", ["x", "ax1"], ["lse"], "lse", attr("keepdims", 0))]
    (workdir / "r.onnx").write_bytes(model(
        nodes, [value_info("x", ["b", "seq", 8]), value_info("mask", ["b", "seq"], 7)],
        [value_info("pooled", ["b", 8]), value_info("mean", ["b", 8]),
         value_info("mx", ["b", 1, 8]), value_info("am", ["b", 8], 7),
         value_info("lse", ["b", 8])],
        [one, i64_init("axm1", [-1]), initializer("tiny", np.array(1e-9, np.float32))],
        opset=18))
    r = kiln("compile", workdir / "r.onnx", "--shape", "b=1..3", "--shape", "seq=1..40",
             "--name", "model", "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)

    def inputs(rng, b, seq):
        mask = np.ones((b, seq), np.int64)
        for i in range(b):
            mask[i, max(1, seq - 3 * i):] = 0  # row i's last 3i tokens padding
        return [normal(rng, b, seq, 8), mask]

    def reference(x, mask, b, seq):
        m = mask[..., None].astype(np.float64)
        pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        mx = x.max(1, keepdims=True)
        lse = np.log(np.exp(x - mx).sum(1)) + mx[:, 0]
        return [pooled, x.mean(1), mx, x.argmax(1), lse]
    steps = [{"b": b, "seq": q} for b, q in ((1, 1), (3, 40), (2, 7), (3, 1), (1, 40), (2, 23))]
    run_built(link_model(workdir), steps, inputs, reference, rtol=1e-5, atol=1e-5)
    (workdir / "two.onnx").write_bytes(model(
        [node("ReduceSum", ["x", "ax01"], ["s"], "both", attr("keepdims", 0))],
        [value_info("x", ["b", "seq", 8])], [value_info("s", [8])],
        [i64_init("ax01", [0, 1])], opset=18))
    r = kiln("compile", workdir / "two.onnx", "--shape", "b=1..3", "--shape", "seq=1..40",
             "-o", workdir / "two.c")
    check(r.returncode != 0 and "'both (ReduceSum)'" in r.stderr and
          "2 dynamic axes" in r.stderr, f"two dynamic axes reduced: {r.stderr}")


def fan_in_weights(rng, *shape):
    """Normal weights scaled by their fan-in (a convolution's or bias's)."""
    fan = int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) / np.sqrt(fan)).astype(np.float32)


def compile_images(workdir, most, f16):
    """Compiles workdir/cnn.onnx for a batch of 1..most (--precision f16
    where f16); returns the generated C."""
    r = kiln("compile", workdir / "cnn.onnx", "--shape", f"batch=1..{most}", "--name", "model",
             "-o", workdir / "model.c", *(["--precision", "f16"] if f16 else []))
    check(r.returncode == 0, r.stderr)
    return (workdir / "model.c").read_text()


def images_case(precision):
    """A small CNN over a dynamic batch of images (as torchvision models are
    exported for serving): convolutions direct (8 channels), as a product
    (24 channels, stride 2, the implicit GEMM) and depthwise on tiles (7 x
    7), max and average pooling, nearest resize, a transposed convolution,
    global average pooling; every kernel's loop ends at the run's images.
    Batches 1..5, up and down; f32 or --precision f16 (the documented f16
    tolerance of max |reference|)."""
    def test(workdir):
        from test_onnx import attr, initializer, model, node, value_info
        workdir = Path(workdir)
        rng = np.random.default_rng(61)

        def w_(*shape):
            return fan_in_weights(rng, *shape)
        w1, b1, w2, w3, wt = w_(8, 3, 3, 3), w_(8), w_(24, 8, 3, 3), w_(24, 1, 7, 7), \
            w_(24, 4, 2, 2)
        b2 = w_(24)
        (workdir / "cnn.onnx").write_bytes(model(
            [node("Conv", ["x", "w1", "b1"], ["c1"], "c1", attr("pads", [1, 1, 1, 1])),
             node("Relu", ["c1"], ["r1"], "r1"),
             node("Conv", ["r1", "w2", "b2"], ["c2"], "c2",
                  attr("pads", [1, 1, 1, 1]) + attr("strides", [2, 2])),
             node("Conv", ["c2", "w3"], ["c3"], "dw",
                  attr("pads", [3, 3, 3, 3]) + attr("group", 24)),
             node("MaxPool", ["c3"], ["p1"], "mp",
                  attr("kernel_shape", [2, 2]) + attr("strides", [2, 2])),
             node("Resize", ["p1", "", "scales"], ["u"], "up", attr("mode", "nearest")),
             node("AveragePool", ["u"], ["p2"], "ap",
                  attr("kernel_shape", [3, 3]) + attr("pads", [1, 1, 1, 1])),
             node("ConvTranspose", ["p2", "wt"], ["y"], "ct", attr("strides", [2, 2])),
             node("GlobalAveragePool", ["y"], ["g"], "gap")],
            [value_info("x", ["batch", 3, 12, 12])],
            [value_info("y", ["batch", 4, 12, 12]), value_info("g", ["batch", 4, 1, 1])],
            [initializer("w1", w1), initializer("b1", b1), initializer("w2", w2),
             initializer("b2", b2), initializer("w3", w3), initializer("wt", wt),
             initializer("scales", np.array([1, 1, 2, 2], np.float32))]))
        f16 = precision == "f16"
        c = compile_images(workdir, 5, f16)
        for define in ("NRUN .*KILN_DIM", "NC_RUN .*KILN_DIM", "N_RUN .*KILN_DIM", "DW_TILE 1"):
            check(re.search(rf"^ \*   {define}", c, re.M), f"no kernel define {define}")

        def reference(x, batch):
            h = np.maximum(ref.conv(x, w1, b1, pads=[1, 1, 1, 1]), 0)
            h = ref.conv(h, w2, b2, strides=[2, 2], pads=[1, 1, 1, 1])
            h = ref.conv(h, w3, pads=[3, 3, 3, 3], group=24)
            h = ref.pool(h, [2, 2], "max", strides=[2, 2])
            h = h.repeat(2, axis=2).repeat(2, axis=3)
            h = ref.pool(h, [3, 3], "avg", pads=[1, 1, 1, 1])
            y = ref.conv_transpose(h, wt, strides=[2, 2])
            return [y, y.mean(axis=(2, 3), keepdims=True)]
        steps = [{"batch": b} for b in (1, 5, 2, 4, 1, 3, 5)]
        run_built(link_model(workdir), steps, lambda rng, batch: [normal(rng, batch, 3, 12, 12)],
                  reference, compare=precision_compare(f16, 1e-4, 1e-4))
    return test


for _p in ("f32", "f16"):
    case(f"dynamic: convolutions (direct, product, depthwise tiles, transposed), pooling and "
         f"resize over a dynamic batch of images, ONNX, {_p}")(images_case(_p))


def images_split_case(precision):
    """Convolutions over a dynamic batch of images with few positions and a
    long K (as a CNN's last stage): split along K for the fewest images, the
    chunks' sum (splitk.comp, the bias and activation in it) following the
    run's images; batches 1..6, up and down; f32 or --precision f16."""
    def test(workdir):
        from test_onnx import initializer, model, node, value_info, attr
        workdir = Path(workdir)
        rng = np.random.default_rng(67)
        w1, b1, w2 = [fan_in_weights(rng, *shape) for shape in ((48, 128, 3, 3), (48,),
                                                                 (40, 48, 3, 3))]
        (workdir / "cnn.onnx").write_bytes(model(
            [node("Conv", ["x", "w1", "b1"], ["c1"], "c1", attr("pads", [1, 1, 1, 1])),
             node("Relu", ["c1"], ["r1"], "r1"),
             node("Conv", ["r1", "w2"], ["y"], "c2", attr("pads", [1, 1, 1, 1]))],
            [value_info("x", ["batch", 128, 5, 5])], [value_info("y", ["batch", 40, 5, 5])],
            [initializer("w1", w1), initializer("b1", b1), initializer("w2", w2)]))
        f16 = precision == "f16"
        c = compile_images(workdir, 6, f16)
        sums = re.findall(r"\(conv\) splitk;[^\n]*groups\[0\] follow batch", c)
        check(len(sums) == 2, f"{len(sums)} sums of a split following the batch, not 2")
        check(re.search(r"^ \*   SPLITK \d+", c, re.M) and
              re.search(r"^ \*   N_RUN .*KILN_DIM", c, re.M), "no split kernel over the run")

        def reference(x, batch):
            h = np.maximum(ref.conv(x, w1, b1, pads=[1, 1, 1, 1]), 0)
            return [ref.conv(h, w2, pads=[1, 1, 1, 1])]
        steps = [{"batch": b} for b in (1, 6, 2, 5, 1, 3, 6)]
        run_built(link_model(workdir), steps,
                  lambda rng, batch: [normal(rng, batch, 128, 5, 5)],
                  reference, compare=precision_compare(f16, 1e-4, 1e-4))
    return test


for _p in ("f32", "f16"):
    case(f"dynamic: convolutions of few positions over a dynamic batch of images, split along "
         f"K for the fewest, ONNX, {_p}")(images_split_case(_p))


def linear_onnx(path, rng, k, n):
    """Writes an ONNX linear layer, y = x @ w + b over x [batch, seq, k]
    (MatMul and Add, as exporters write one); returns w and b."""
    from test_onnx import initializer, model, node, value_info
    w, b = fan_in_weights(rng, k, n), fan_in_weights(rng, n)
    Path(path).write_bytes(model(
        [node("MatMul", ["x", "w"], ["h"], "mm"), node("Add", ["h", "b"], ["y"], "add")],
        [value_info("x", ["batch", "seq", k])], [value_info("y", ["batch", "seq", n])],
        [initializer("w", w), initializer("b", b)]))
    return w, b


@case("dynamic: ONNX [batch, seq, 24] with --shape batch=2 (fixed) and seq=1..7 (dynamic): "
      "the product's rows follow seq in each of the two batches")
def test_fixed_batch_dynamic_seq(workdir):
    workdir = Path(workdir)
    w, b = linear_onnx(workdir / "m.onnx", np.random.default_rng(71), 24, 16)
    r = kiln("compile", workdir / "m.onnx", "--shape", "batch=2", "--shape", "seq=1..7",
             "--name", "model", "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)
    c = (workdir / "model.c").read_text()
    check(re.search(r"^ \*   MROWS .*KILN_DIM\(0\)", c, re.M),
          "the product's rows do not follow seq")
    steps = [{"seq": q} for q in (1, 7, 3, 5, 1, 6)]
    run_built(link_model(workdir), steps, lambda rng, seq: [normal(rng, 2, seq, 24)],
              lambda x, seq: [x.astype(np.float64) @ w + b], rtol=1e-4, atol=1e-4)


def rows_split_case(flags):
    """A product whose rows follow the dims, few of them against a long K
    ([seq, 1536] x [1536, 256], seq 2..96, as an encoder's FFN output):
    below the rows where a fixed build would stop splitting, a variant
    split along K (the chunks' sum following the run's rows), above it the
    unsplit kernel; runs on both sides, up and down, every element against
    numpy. flags: --precision f16 (on lavapipe the tiled fallback),
    --weights int8 (K-major codes)."""
    def test(workdir):
        workdir = Path(workdir)
        w, b = linear_onnx(workdir / "m.onnx", np.random.default_rng(73), 1536, 256)
        r = kiln("compile", workdir / "m.onnx", "--shape", "batch=1", "--shape", "seq=2..96",
                 "--name", "model", "-o", workdir / "model.c", *flags)
        check(r.returncode == 0, r.stderr)
        c = (workdir / "model.c").read_text()
        check(re.search(r"\) splitk;[^\n]*groups\[0\] follow seq", c),
              "no sum of a split following seq")
        f16 = "f16" in flags
        # f16: coopmat.comp's count read at run time (its split runs on
        # devices with cooperative matrices; lavapipe runs the tiled kernel)
        check(re.search(r"^ \*   SPLITS \d+" if f16 else r"^ \*   SPLITK \d+", c, re.M),
              "no product split along K")
        quant = "--weights" in flags
        wq = w
        if quant:  # as the format stores W
            from test_quant import dequantized
            wq = dequantized(w, "int8")[0]
        steps = [{"seq": q} for q in (2, 96, 40, 5, 17, 80, 3, 64)]
        run_built(link_model(workdir), steps, lambda rng, seq: [normal(rng, 1, seq, 1536)],
                  lambda x, seq: [x.astype(np.float64) @ wq + b],
                  compare=precision_compare(f16, 1e-4, 1e-4))
    return test


def outer_batch_case(precision):
    """Products over a dynamic batch and sequence ([b, seq, ...] with both
    dynamic, as an encoder exported with both): a linear layer [b, seq, 24]
    x [24, 16] + bias, and attention's two batched products [b, 2, seq, 8]
    x [b, 2, 8, seq] and the scores x [b, 2, seq, 8] (K the run's seq),
    with a softmax of the scores (its rows the run's blocks, its length
    the run's keys):
    rows follow seq in each batch, and the kernels loop over the run's
    batches only (BATCH_RUN); seq 1..40 (the matrix-vector and the tiled
    kernels), b 1..4, up and down; f32 or --precision f16."""
    def test(workdir):
        from test_onnx import attr, initializer, model, node, value_info
        workdir = Path(workdir)
        rng = np.random.default_rng(83)
        w, bias = fan_in_weights(rng, 24, 16), fan_in_weights(rng, 16)
        w2, w3 = fan_in_weights(rng, 24, 8), fan_in_weights(rng, 24, 8)
        (workdir / "m.onnx").write_bytes(model(
            [node("MatMul", ["x", "w"], ["h"], "mm"), node("Add", ["h", "bias"], ["y"], "add"),
             node("MatMul", ["q", "k"], ["sc"], "qk"), node("MatMul", ["sc", "v"], ["o"], "pv"),
             node("MatMul", ["x2", "w2"], ["p2"], "m2"), node("MatMul", ["x2", "w3"], ["p3"], "m3"),
             node("Softmax", ["sc"], ["sm"], "soft", attr("axis", -1))],
            [value_info("x", ["b", "seq", 24]), value_info("q", ["b", 2, "seq", 8]),
             value_info("k", ["b", 2, 8, "seq"]), value_info("v", ["b", 2, "seq", 8]),
             value_info("x2", ["b", "seq", 24])],
            [value_info("y", ["b", "seq", 16]), value_info("sc", ["b", 2, "seq", "seq"]),
             value_info("o", ["b", 2, "seq", 8]), value_info("p2", ["b", "seq", 8]),
             value_info("p3", ["b", "seq", 8]), value_info("sm", ["b", 2, "seq", "seq"])],
            [initializer("w", w), initializer("bias", bias), initializer("w2", w2),
             initializer("w3", w3)]))
        f16 = precision == "f16"
        r = kiln("compile", workdir / "m.onnx", "--shape", "b=1..4", "--shape", "seq=1..40",
                 "--name", "model", "-o", workdir / "model.c",
                 *(["--precision", "f16"] if f16 else []))
        check(r.returncode == 0, r.stderr)
        c = (workdir / "model.c").read_text()
        runs = re.findall(r"^ \*   BATCH_RUN .*KILN_DIM\(0\)", c, re.M)
        check(len(runs) >= 3, f"{len(runs)} kernels loop over the run's batches, not 3 or more")
        # x2's two products side by side (a QKV split): the run's rows of each of the
        # run's batches (runs of one batch on their own kernels: min(b - 1, 1))
        check(re.search(r"\d+: m2 \(MatMul\) \+ m3 \(MatMul\) \(matmul\) \w+;[^\n]*"
                        r"groups\[1\] follow seq \+ 40\*min\(b - 1, 1\) - 40", c),
              "the side-by-side products do not follow the sequence in each batch")
        check(re.search(r"^ \*   ROWS \(uint\(.*KILN_DIM\(0\).*\) \* uint\(.*KILN_DIM\(1\)", c,
                        re.M), "the softmax's rows do not follow both")

        def reference(x, q, k, v, x2, b, seq):
            x, q, k, v, x2 = (a.astype(np.float64) for a in (x, q, k, v, x2))
            sc = q @ k
            e = np.exp(sc - sc.max(-1, keepdims=True))
            return [x @ w + bias, sc, sc @ v, x2 @ w2, x2 @ w3, e / e.sum(-1, keepdims=True)]
        steps = [{"b": b, "seq": q} for b, q in ((1, 1), (4, 40), (2, 17), (1, 40), (3, 5),
                                                 (4, 1), (2, 33))]
        run_built(link_model(workdir), steps,
                  lambda rng, b, seq: [normal(rng, b, seq, 24), normal(rng, b, 2, seq, 8),
                                       normal(rng, b, 2, 8, seq), normal(rng, b, 2, seq, 8),
                                       normal(rng, b, seq, 24)],
                  reference, compare=precision_compare(f16, 1e-4, 1e-4))
    return test


for _p in ("f32", "f16"):
    case("dynamic: products over a dynamic batch and sequence (a linear layer, attention's "
         f"two products) loop over the run's batches only, ONNX, {_p}")(outer_batch_case(_p))


def one_batch_case(flags):
    """A linear layer over a dynamic batch and sequence ([b, seq, 1536] x
    [1536, 256] + bias, b 1..3, seq 2..96, as an encoder's FFN output
    exported with both dynamic), and two products of another input side by
    side (x2 [b, seq, 1536] x [1536, 128] twice: a QKV split, each part
    [b, seq, 128]): runs of one batch take the unbatched product's
    kernels (split along K for few rows, as a build with b fixed at 1), the
    others those of all batches; the compiler derives min(b - 1, 1) to
    choose. Every (b, seq) gives work to exactly one kernel of each product
    (with its sum where split), the split ones at one batch only; runs of
    both kinds, up and down, every element against numpy. flags:
    --precision f16 (on lavapipe the tiled fallback), --weights int8."""
    def test(workdir):
        from test_onnx import initializer, model, node, value_info
        workdir = Path(workdir)
        rng = np.random.default_rng(97)
        w, bias = fan_in_weights(rng, 1536, 256), fan_in_weights(rng, 256)
        w2, w3 = fan_in_weights(rng, 1536, 128), fan_in_weights(rng, 1536, 128)
        (workdir / "m.onnx").write_bytes(model(
            [node("MatMul", ["x", "w"], ["h"], "mm"), node("Add", ["h", "bias"], ["y"], "add"),
             node("MatMul", ["x2", "w2"], ["p2"], "m2"),
             node("MatMul", ["x2", "w3"], ["p3"], "m3")],
            [value_info("x", ["batch", "seq", 1536]), value_info("x2", ["batch", "seq", 1536])],
            [value_info("y", ["batch", "seq", 256]), value_info("p2", ["batch", "seq", 128]),
             value_info("p3", ["batch", "seq", 128])],
            [initializer("w", w), initializer("bias", bias), initializer("w2", w2),
             initializer("w3", w3)]))
        r = kiln("compile", workdir / "m.onnx", "--shape", "batch=1..3", "--shape",
                 "seq=2..96", "--name", "model", "-o", workdir / "model.c", *flags)
        check(r.returncode == 0, r.stderr)
        c = (workdir / "model.c").read_text()
        check('{"min(batch - 1, 1)", KILN_DIM_MIN' in c, "no derived dim min(batch - 1, 1)")
        check(re.search(r"\d+: m2 \(MatMul\) \+ m3 \(MatMul\) \(matmul\)", c),
              "the two products of x2 are not one")
        f16 = "--precision" in flags
        for prod in ("mm", "m2"):
            for coopmat in (True, False) if f16 else (False,):
                for b in (1, 2, 3):
                    split_at = 0
                    for seq in range(2, 97):
                        act = active_dispatches(c, [b, seq, min(b - 1, 1)], coopmat, prod)
                        sums = [a for a in act if a[0] == "splitk"]
                        prods = [a for a in act if a[0] != "splitk"]
                        check(len(prods) == 1 and len(sums) <= 1,
                              f"{prod}: b {b}, seq {seq}, coopmat {coopmat}: {act}")
                        split_at += len(sums)
                    # f16 without cooperative matrices: the tiled kernel takes every run
                    check((split_at > 0) == (b == 1 and (coopmat or not f16)),
                          f"{prod}: b {b}: {split_at} runs split along K, coopmat {coopmat}")
        wq, wq2, wq3 = w, w2, w3
        if "--weights" in flags:
            from test_quant import dequantized
            wq, wq2, wq3 = (dequantized(v, "int8")[0] for v in (w, w2, w3))

        def reference(x, x2, batch, seq):
            x, x2 = x.astype(np.float64), x2.astype(np.float64)
            return [x @ wq + bias, x2 @ wq2, x2 @ wq3]
        steps = [{"batch": b, "seq": q} for b, q in ((1, 2), (3, 96), (1, 40), (2, 5), (1, 96),
                                                     (3, 17), (1, 7), (2, 80))]
        run_built(link_model(workdir), steps,
                  lambda rng, batch, seq: [normal(rng, batch, seq, 1536),
                                           normal(rng, batch, seq, 1536)],
                  reference, compare=precision_compare(f16, 1e-4, 1e-4))
    return test


for _f in ((), ("--precision", "f16"), ("--weights", "int8")):
    case("dynamic: a linear layer and a QKV split over a dynamic batch and sequence take the "
         "unbatched kernels (split along K for few rows) in runs of one batch, those of all "
         f"batches in others, {' '.join(_f) or 'f32'}")(one_batch_case(_f))


@case("dynamic: elementwise ops, a transpose, a broadcast and a layer norm over a dynamic "
      "batch and sequence ([b, seq, 6], [b, 6, seq], a mask [b, 1, seq]) walk the run's "
      "extents of both, ONNX")
def test_outer_inner_eltwise(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    rng = np.random.default_rng(89)
    c, gamma, beta = normal(rng, 6), normal(rng, 6), normal(rng, 6)
    (workdir / "m.onnx").write_bytes(model(
        [node("Add", ["x", "c"], ["h"], "add"), node("Relu", ["h"], ["y1"], "relu"),
         node("Transpose", ["y1"], ["t"], "tr", attr("perm", [0, 2, 1])),
         node("Mul", ["t", "m"], ["y2"], "mul"),
         node("LayerNormalization", ["x", "gamma", "beta"], ["y3"], "ln",
              attr("axis", -1) + attr("epsilon", 1e-5))],
        [value_info("x", ["b", "seq", 6]), value_info("m", ["b", 1, "seq"])],
        [value_info("y1", ["b", "seq", 6]), value_info("y2", ["b", 6, "seq"]),
         value_info("y3", ["b", "seq", 6])],
        [initializer("c", c), initializer("gamma", gamma), initializer("beta", beta)],
        opset=17))
    r = kiln("compile", workdir / "m.onnx", "--shape", "b=1..4", "--shape", "seq=1..9",
             "--name", "model", "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)
    check("compute their largest shape" not in r.stdout, r.stdout)
    src = (workdir / "model.c").read_text()
    walks = [c for c in re.findall(r"^ \*   COUNT (.*)$", src, re.M)
             if "KILN_DIM(0)" in c and "KILN_DIM(1)" in c]
    check(len(walks) >= 2, f"{len(walks)} dispatches walk both extents, expected 2 or more")

    check(re.search(r"^ \*   ROWS \(uint\(.*KILN_DIM\(0\).*\) \* uint\(.*KILN_DIM\(1\)", src,
                    re.M), "the norm's rows do not follow both")

    def reference(x, m, b, seq):
        x = x.astype(np.float64)
        y1 = np.maximum(x + c, 0)
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return [y1, y1.transpose(0, 2, 1) * m, (x - mu) / np.sqrt(var + 1e-5) * gamma + beta]
    steps = [{"b": b, "seq": q} for b, q in ((1, 1), (4, 9), (2, 5), (1, 9), (3, 2), (4, 1))]
    run_built(link_model(workdir), steps,
              lambda rng, b, seq: [normal(rng, b, seq, 6), normal(rng, b, 1, seq)],
              reference, rtol=1e-5, atol=1e-5)


@case("dynamic: elementwise ops over attention scores [b, heads, seq, seq] with the batch "
      "and the sequence dynamic (the mask added, softmax, its NaNs set to 0 by IsNaN and "
      "Where, as the dynamo exporter writes them) walk the run's extents of all three "
      "axes, and of both with the batch fixed: no dispatch computes its largest shape; "
      "every output element against numpy at runs of several sizes")
def test_several_axes_eltwise(workdir):
    from test_onnx import initializer, model, node, value_info
    workdir = Path(workdir)
    zero = np.zeros((), np.float32)
    (workdir / "m.onnx").write_bytes(model(
        [node("Add", ["s", "mask"], ["h"], "add"), node("Softmax", ["h"], ["p"], "softmax"),
         node("IsNaN", ["p"], ["nan"], "isnan"), node("Where", ["nan", "zero", "p"], ["y"], "where"),
         node("Mul", ["s", "s"], ["y2"], "square")],
        [value_info("s", ["b", 3, "seq", "seq"]), value_info("mask", ["b", 1, "seq", "seq"])],
        [value_info("y", ["b", 3, "seq", "seq"]), value_info("y2", ["b", 3, "seq", "seq"])],
        [initializer("zero", zero)]))

    def reference(s, mask, seq, b=1):
        h = (s + mask).astype(np.float64)
        e = np.exp(h - h.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        return [np.where(np.isnan(p), 0.0, p), s.astype(np.float64) ** 2]

    def inputs(rng, seq, b=1):
        mask = np.where(rng.random((b, 1, seq, seq)) < 0.3, -1e4, 0.0).astype(np.float32)
        return [normal(rng, b, 3, seq, seq), mask]
    for shapes, steps in ((("b=1..4", "seq=1..9"),
                           [{"b": b, "seq": q} for b, q in ((1, 1), (4, 9), (2, 5), (1, 9),
                                                            (3, 2), (4, 1))]),
                          (("b=1", "seq=1..9"), [{"seq": q} for q in (1, 9, 4, 7)])):
        r = kiln("compile", workdir / "m.onnx", *[a for sh in shapes for a in ("--shape", sh)],
                 "--name", "model", "-o", workdir / "model.c")
        check(r.returncode == 0, r.stderr)
        check("compute their largest shape" not in r.stdout, r.stdout)
        src = (workdir / "model.c").read_text()
        # the add, square and where walk [b * 3, seq, seq] (three run extents
        # in their count), or [3, seq, seq] (two)
        need = 3 if shapes[0] == "b=1..4" else 2
        walks = [c for c in re.findall(r"^ \*   COUNT (.*)$", src, re.M)
                 if c.count("KILN_DIM(") == need]
        check(len(walks) >= 3, f"{shapes}: {len(walks)} dispatches walk {need} extents")
        run_built(link_model(workdir), steps, inputs, reference, rtol=1e-5, atol=1e-6)


def active_dispatches(c, dims, coopmat, node=None):
    """The dispatches of generated C that a run at dims gives work (the
    runtime's rule: the work range, the device features; a device with
    cooperative matrices and every other feature, or none of them), of
    the node named `node` (the first of its group) or all: [(family,
    groups)]."""
    table = c[c.index("_dispatches["):]
    table = table[:table.index("};")]
    out = []
    for m in re.finditer(r"/\* \d+: (?:" + (re.escape(node) + " " if node else "") +
                         r").*?\((\w+)\) (\w+);[^\n]*\n\s*\{\d+u, \{(\d+)u, (\d+)u, "
                         r"(\d+)u\}[^\n]*\n\s*(\d+)u, \{(-?\d+)ll, \{([^}]*)\}\}, (\d+)ull, \d+ull, "
                         r"(\d+)ull, (\d+)ull, (\d+)u, (\d+)u\}", table):
        family, groups = m[2], (int(m[3]), int(m[4]), int(m[5]))
        axis, c0 = int(m[6]), int(m[7])
        cs = [int(x.strip().rstrip("l")) for x in m[8].split(",")]
        scale, lo, hi, needs, unless = (int(m[i]) for i in range(9, 14))
        if (needs and not coopmat) or (unless and coopmat):
            continue
        if axis != 3:
            w = (c0 + sum(a * b for a, b in zip(cs, dims))) * scale
            if w < lo or w > hi or w <= 0:
                continue
        out.append((family, groups))
    return out


@case("dynamic: an f16 product of few rows that follow the dims ([seq, 3072] x [3072, 768], "
      "seq 2..512) has a split variant on the matrix units for each range of rows whose "
      "chunk count a fixed build keeps: every run of 2 to 512 rows gives work to exactly "
      "one product kernel (matrix-vector, a split one with its sum, or the unsplit one), "
      "on a device with cooperative matrices and on one without; one barrier before the sums")
def test_few_rows_variants(workdir):
    workdir = Path(workdir)
    w, b = linear_onnx(workdir / "m.onnx", np.random.default_rng(79), 3072, 768)
    # without --sync-check (the test harness's default), which orders the
    # variants a run chooses between too
    import subprocess
    from harness import KILN
    r = subprocess.run([str(KILN), "compile", workdir / "m.onnx", "--shape", "batch=1",
                        "--shape", "seq=2..512", "--precision", "f16", "--name", "model", "-o",
                        workdir / "model.c"], capture_output=True, text=True)
    check(r.returncode == 0, r.stderr)
    c = (workdir / "model.c").read_text()
    partials = set()
    for coopmat in (True, False):
        for seq in range(2, 513):
            act = [a for a in active_dispatches(c, [seq], coopmat) if a[0] != "eltwise"]
            split = [a for a in act if a[0] == "coopmat" and a[1][2] > 1]
            sums = [a for a in act if a[0] == "splitk"]
            whole = [a for a in act if a not in split and a not in sums]
            check(len(split) == len(sums) <= 1 and len(whole) + len(sums) == 1,
                  f"seq {seq}, {'with' if coopmat else 'without'} cooperative matrices: "
                  f"{act}")
            check(coopmat or not split, f"seq {seq}: a split on the matrix units without them")
            partials.update(a[1] for a in split)
    check(len(partials) >= 3, f"{len(partials)} split variants, expected several")
    # the barriers: the cast's, then one before the sums
    check(re.search(r"^ \* \d+ dispatches \(2 barriers\)", c, re.M),
          "not two barriers")


for _f in ((), ("--precision", "f16"), ("--weights", "int8")):
    case("dynamic: a product of few rows that follow the dims split along K, "
         f"{' '.join(_f) or 'f32'}")(rows_split_case(_f))


@case("dynamic: a convolution, pooling or resize dynamic along an axis other than the batch "
      "is refused, named")
def test_images_refused(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    w = np.ones((4, 3, 3, 3), np.float32)
    for op, extra in (("Conv", ["w"]), ("MaxPool", [])):
        attrs = attr("kernel_shape", [2, 2]) if op == "MaxPool" else b""
        (workdir / f"{op}.onnx").write_bytes(model(
            [node(op, ["x"] + extra, ["y"], "op", attrs)],
            [value_info("x", [1, 3, "h", 8])], [value_info("y", [1, 4, "oh", 6])],
            [initializer("w", w)]))
        r = kiln("compile", workdir / f"{op}.onnx", "--shape", "h=3..8", "-o", workdir / "m.c")
        check(r.returncode != 0 and f"'op ({op})'" in r.stderr and "axis 2" in r.stderr and
              "batch axis 0 only" in r.stderr, f"{op}: {r.stderr}")


@case("dynamic: pad (reflect), instance and group norms over a dynamic batch of images, "
      "ONNX opset 18; padding the batch is refused, named")
def test_images_norms(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    rng = np.random.default_rng(67)
    scale, bias, gscale, gbias = normal(rng, 6), normal(rng, 6), normal(rng, 3), normal(rng, 3)
    pads = [0, 0, 1, 2, 0, 0, 2, 1]
    (workdir / "n.onnx").write_bytes(model(
        [node("Pad", ["x", "pads"], ["p"], "pad", attr("mode", "reflect")),
         node("InstanceNormalization", ["p", "scale", "bias"], ["i"], "inorm",
              attr("epsilon", 1e-5)),
         node("GroupNormalization", ["i", "gscale", "gbias"], ["y"], "gnorm",
              attr("num_groups", 3) + attr("epsilon", 1e-5))],
        [value_info("x", ["batch", 6, 5, 4])], [value_info("y", ["batch", 6, 8, 7])],
        [i64_init("pads", pads), initializer("scale", scale), initializer("bias", bias),
         initializer("gscale", gscale), initializer("gbias", gbias)], opset=18))
    r = kiln("compile", workdir / "n.onnx", "--shape", "batch=1..4", "--name", "model",
             "-o", workdir / "model.c")
    check(r.returncode == 0, r.stderr)

    def reference(x, batch):
        h = ref.pad(ref.f64(x), pads, "reflect")
        h = ref.group_norm(h, scale, bias, 6)  # instance norm: a group a channel
        return [ref.group_norm(h, np.repeat(gscale, 2), np.repeat(gbias, 2), 3)]
    run_built(link_model(workdir), [{"batch": b} for b in (1, 4, 2, 3, 1, 4)],
              lambda rng, batch: [normal(rng, batch, 6, 5, 4) * 3 + 1], reference,
              rtol=1e-4, atol=1e-4)
    (workdir / "b.onnx").write_bytes(model(
        [node("Pad", ["x", "bpads"], ["y"], "padb")],
        [value_info("x", ["batch", 6, 5, 4])], [value_info("y", ["nb", 6, 5, 4])],
        [i64_init("bpads", [1, 0, 0, 0, 0, 0, 0, 0])], opset=18))
    r = kiln("compile", workdir / "b.onnx", "--shape", "batch=1..4", "-o", workdir / "b.c")
    check(r.returncode != 0 and "'padb (Pad)'" in r.stderr and
          "pads the dynamic axis 0" in r.stderr, f"padding the batch: {r.stderr}")


@case("bench/bench.c with -d: a model with a dynamic dim timed at one extent (its input "
      "file at the largest), the run's output written and checked")
def test_bench_dims(workdir):
    from harness import BUILD, CC, EXTRA_CFLAGS, ROOT, VULKAN_LIB
    workdir = Path(workdir)
    K, N = 24, 10
    w = w_of([K, N], 9)
    y = dyn_yaml({"seq": "1..8"}, {"x": {**W, "shape": ["seq", K]}},
                 [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}], ["y"],
                 {"w": weight([K, N], 9)})
    build_model(workdir, y)
    r = run([CC, "-O1", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", *EXTRA_CFLAGS,
             "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime", "-DKILN_MODEL=model",
             "-include", workdir / "model.h", "-o", workdir / "bench", ROOT / "bench" / "bench.c",
             workdir / "model.c", "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    check(r.returncode == 0, f"building bench.c failed:\n{r.stderr}")
    x = normal(np.random.default_rng(5), 8, K)
    x.tofile(workdir / "x.bin")
    r = run([workdir / "bench", "-i", workdir / "x.bin", "-o", workdir / "y.bin", "-d",
             "seq=3", "-n", "2", "-w", "1", "-W", "0"], cwd=workdir,
            env={"KILN_VALIDATION": VALIDATION})
    check(r.returncode == 0, f"bench failed ({r.returncode}):\n{r.stderr}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    check(res["wall_us"] > 0 and res["dispatches"] >= 1, f"bench printed {res}")
    got = np.fromfile(workdir / "y.bin", np.float32)
    check(got.size == 3 * N, f"{got.size} output elements, expected the run's {3 * N}")
    assert_close(got.reshape(3, N), ref.f64(x[:3]) @ w, 1e-5, 1e-5, "bench's output")
    r = run([workdir / "bench", "-i", workdir / "x.bin", "-d", "seq"], cwd=workdir)
    check(r.returncode == 2 and "DIM=VALUE" in r.stderr, f"-d seq: {r.returncode} {r.stderr}")
    # two dims, the inner one short: the in-place runs' elements at the
    # largest shape's strides, not a prefix (bench checks them against the
    # copied runs' outputs)
    sub = workdir / "two"
    sub.mkdir()
    y = dyn_yaml({"b": "1..3", "s": "1..5"}, {"x": {**W, "shape": ["b", "s", K]}},
                 [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}], ["y"],
                 {"w": weight([K, N], 9)})
    build_model(sub, y)
    r = run([CC, "-O1", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", *EXTRA_CFLAGS,
             "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime", "-DKILN_MODEL=model",
             "-include", sub / "model.h", "-o", sub / "bench", ROOT / "bench" / "bench.c",
             sub / "model.c", "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    check(r.returncode == 0, f"building bench.c failed:\n{r.stderr}")
    x = normal(np.random.default_rng(6), 3 * 5 * K)
    x.tofile(sub / "x.bin")
    r = run([sub / "bench", "-i", sub / "x.bin", "-o", sub / "y.bin", "-d", "b=2", "-d", "s=3",
             "-n", "2", "-w", "1", "-W", "0"], cwd=sub, env={"KILN_VALIDATION": VALIDATION})
    check(r.returncode == 0, f"bench with two dims failed ({r.returncode}):\n{r.stderr}")
    got = np.fromfile(sub / "y.bin", np.float32)
    assert_close(got.reshape(2, 3, N), ref.f64(x[:2 * 3 * K].reshape(2, 3, K)) @ w, 1e-5, 1e-5,
                 "bench's output at b=2, s=3")


@case("dynamic: the few-rows kernel of a product over a sequence of 2..512 ([1, seq, 768] x "
      "[768, 3072], BERT-base's FFN input) takes the tiles that serve the range best in the "
      "cost model, 64 x 64 as a build fixed at 128 rows (not the 64 x 128 of 512 rows), split "
      "along K; runs of 128 and 17 rows against numpy")
def test_few_rows_tiles(workdir):
    workdir = Path(workdir)
    K, N = 768, 3072
    nodes = [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}]
    tiles = {}
    for name, shape, dims in (("dyn", [1, "seq", K], {"seq": "2..512"}),
                              ("fixed", [1, 128, K], None)):
        sub = workdir / name
        sub.mkdir()
        ins = {"x": {**W, "shape": shape}}
        y = (dyn_yaml(dims, ins, nodes, ["y"], {"w": weight([K, N], 3, 0.03)}) if dims else
             model_yaml("fixed", ins, nodes, ["y"], {"w": weight([K, N], 3, 0.03)}))
        prog = build_model(sub, y, {})
        split = [d for d in kernel_defines(sub) if "SPLITK" in d and "BM" in d]
        check(len(split) == 1, f"{name}: {len(split)} kernels split along K, expected one")
        tiles[name] = (split[0]["BM"], split[0]["BN"])
    check(tiles["dyn"] == tiles["fixed"] == ("64", "64"),
          f"the few-rows kernel's tiles {tiles['dyn']}, the fixed build's {tiles['fixed']}")
    w = w_of([K, N], 3, 0.03)
    run_built(prog.parent.parent / "dyn" / prog.name, seq_steps([128, 17]),
              lambda rng, seq: [normal(rng, 1, seq, K)], lambda x, seq: [ref.f64(x) @ w],
              compare=lambda got, want, what: assert_relative(got, want, 1e-5, what))


@case("dynamic: a decoder exported in f16 (its weights halves in the file): --precision f16 "
      "stores them K-major for matvec_k.comp, the halves as they are, and --weights int8 "
      "encodes them from the halves; runs of 1, 5, 33 and 1 rows (matvec_k.comp, the "
      "few-rows and the tiled kernels) against numpy")
def test_onnx_f16_weights_kmajor(workdir):
    from test_onnx import attr, initializer, model, node, value_info
    workdir = Path(workdir)
    rng = np.random.default_rng(3)
    w0 = (rng.standard_normal((64, 96)) * 0.2).astype(np.float16)
    w1 = (rng.standard_normal((96, 64)) * 0.2).astype(np.float16)
    data = model([node("MatMul", ["x", "w0"], ["h"], "up"),
                  node("Relu", ["h"], ["r"], "act"),
                  node("MatMul", ["r", "w1"], ["y"], "down")],
                 [value_info("x", [1, "seq", 64], 10)], [value_info("y", [1, "seq", 64], 10)],
                 [initializer("w0", w0), initializer("w1", w1)], opset=17)
    (workdir / "m.onnx").write_bytes(data)
    for fmt in ("f16", "int8"):
        sub = workdir / fmt
        sub.mkdir()
        flags = ["--precision", "f16", "--io", "f16", "--shape", "seq=1..40"]
        flags += ["--weights", fmt] if fmt != "f16" else []
        r = kiln("inspect", workdir / "m.onnx", "--format", "json", *flags)
        check(r.returncode == 0, r.stderr)
        fams = [x["family"] for x in json.loads(r.stdout)["dispatches"]]
        check(fams.count("matvec_k") >= 2, f"{fmt}: no matvec_k for the one-row runs: {fams}")
        r = kiln("compile", workdir / "m.onnx", "--name", "model", "-o", sub / "model.c",
                 "-v", *flags)
        check(r.returncode == 0, r.stderr)
        check("2 matmul weights stored K-major" in r.stderr, f"{fmt}: {r.stderr}")
        d0, _ = dequantized(w0.astype(np.float32), fmt)
        d1, _ = dequantized(w1.astype(np.float32), fmt)

        def forward(x, seq, d0=d0, d1=d1):
            h = np.maximum(x.astype(np.float64) @ d0, 0).astype(np.float16)
            return [(h.astype(np.float64) @ d1).astype(np.float16)]
        run_built(link_model(sub), seq_steps([1, 5, 33, 1]),
                  lambda rng, seq: [normal(rng, 1, seq, 64).astype(np.float16)], forward,
                  compare=lambda g, w, what: assert_relative(g, w, 5e-3, what))
