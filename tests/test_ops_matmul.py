"""test_ops_matmul.py: matmul (tiled, matvec, cooperative matrices, weight
formats, QKV splits) and gemm (shaders/matmul.comp, matvec.comp,
coopmat.comp), on Vulkan against the CPU reference (ops_common.py says how).
"""
import json
import os
import re
from pathlib import Path

import numpy as np

import reference as ref
from harness import (F16_TOLERANCE, assert_close, assert_relative, build_model, check,
                     check_defines, check_kernels, kernel_defines, kiln, model_yaml, registry,
                     run, run_model, run_program, run_steps, Skip)
from ops_common import half, one_op, rng, spec, values, weight_specs

TESTS, case = registry()


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
    # 32 x 64 tiles of 4 x 4 (128 invocations, vec4): 49 rows split 16 ways
    # along K (split-K counts such workgroups as half a slot); 197 rows,
    # which leave a 64-row tiling's last tile 5 rows, on 32-row tiles
    ([49, 512], [512, 200]),
    ([197, 68], [68, 132]),
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
        check_tile_defines(workdir)
        got, = run_program(prog, [a, b], [want.astype(np.float32)])
        k = sa[-1]
        assert_close(got, want, 1e-5, 2e-6 * k ** 0.5 * 4)
    return test


def check_tile_defines(workdir):
    """Each vec4 matmul.comp kernel in the generated C is ONE_TILE: fixed
    shapes, a workgroup for every tile."""
    for d in kernel_defines(workdir):
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
    ([128, 64], [64, 8192]),  # and coopmat_wg.comp's 128 x 64 (128 of them)
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


def f16_matmul_yaml(sa, sb):
    """A model of one f16 matmul y = a x b (a of shape sa, b of sb)."""
    return model_yaml("mm", {"a": {"dtype": "f16", "shape": list(sa)},
                             "b": {"dtype": "f16", "shape": list(sb)}},
                      [{"name": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"])


def coopmat_tile_case(K, bm):
    """[1024, K] x [K, 1024] in f16: 64 tiles of 128 x 128, which
    coopmat.comp takes for K over 256 and not for fewer steps of K (64 x 64
    then); compiled only (lavapipe runs the tiled variant, which the f16
    cases above check)."""
    def test(workdir):
        y = f16_matmul_yaml([1024, K], [K, 1024])
        build_model(workdir, y)
        cm = [d for d in kernel_defines(workdir) if "WM" in d]
        check(len(cm) == 1 and cm[0].get("BM") == str(bm) and cm[0].get("BN") == str(bm),
              f"K {K}: coopmat tiles {[(d.get('BM'), d.get('BN')) for d in cm]}, "
              f"expected {bm} x {bm}")
    return test


for _k, _bm in ((96, 64), (512, 128)):
    case(f"op matmul f16 coopmat tiles [1024, {_k}] x [{_k}, 1024]: {_bm} x {_bm}")(
        coopmat_tile_case(_k, _bm))


def coopmat_split_case(m, k, n, tiles, splits):
    """[m, k] x [k, n] in f16: coopmat.comp's tiles and its chunks of K. A
    product on 128 x 256 tiles (at least 128 of them) is not split; one of
    fewer, smaller tiles is, until about 264 workgroups. Compiled only, as
    above."""
    def test(workdir):
        y = f16_matmul_yaml([m, k], [k, n])
        build_model(workdir, y)
        cm = [d for d in kernel_defines(workdir) if "WM" in d]
        got = [(d.get("BM"), d.get("BN"), d.get("SPLITS", "1")) for d in cm]
        check(got == [(str(tiles[0]), str(tiles[1]), str(splits))],
              f"coopmat tiles and splits {got}, expected {tiles} in {splits}")
    return test


for _m, _k, _n, _tiles, _splits in ((2048, 2048, 2048, (128, 256), 1),
                                    (1024, 1024, 1024, (128, 128), 5),
                                    (128, 3072, 768, (64, 64), 11)):
    case(f"op matmul f16 coopmat split [{_m}, {_k}] x [{_k}, {_n}]: {_tiles}, {_splits}")(
        coopmat_split_case(_m, _k, _n, _tiles, _splits))


def wg_defines(workdir):
    """The defines of each coopmat_wg.comp kernel in workdir/model.c."""
    c = (Path(workdir) / "model.c").read_text()
    return [dict(re.findall(r"^ \*   (\w+) (\S+)$", block, re.M))
            for block in re.findall(r"/\* kernel \d+: coopmat_wg\n.*?\*/", c, re.S)]


def coopmat_wg_case(sa, sb, bn, op="matmul", trans_b=0):
    """A product in f16 and the kernels it compiles to: coopmat_wg.comp
    on 128 x bn tiles (bn None: not taken) for devices with cooperative
    matrices of workgroup scope, then coopmat.comp for those with only
    subgroup ones, then the tiled kernel for the rest, each recorded only
    where the ones before it are not (the dispatch table's needs and
    unless, as its comments say them). Compiled only: lavapipe runs the
    tiled kernel, which the f16 cases above check, among them a shape
    coopmat_wg.comp takes; an H200 ran coopmat_wg.comp
    (bench/experiments/cm2-h200.txt)."""
    def test(workdir):
        dt = "f32" if op == "gemm" else "f16"  # gemm: f16 by --precision
        ins = {"a": {"dtype": dt, "shape": sa}, "b": {"dtype": dt, "shape": sb}}
        node = {"name": "y", "op": op, "inputs": ["a", "b"]}
        if op == "gemm":  # with a bias: an epilogue
            ins["c"] = {"dtype": dt, "shape": [sb[-1]]}
            node["inputs"].append("c")
        if trans_b:  # B given as [N, K]: B_KMAJOR
            ins["b"]["shape"] = sb[:-2] + [sb[-1], sb[-2]]
            node["trans_b"] = 1
        build_model(workdir, model_yaml("mm", ins, [node], ["y"]), None,
                    ["--precision", "f16"] if op == "gemm" else [])
        c = (Path(workdir) / "model.c").read_text()
        wg = wg_defines(workdir)
        order = re.findall(r"/\* \d+: y \((?:matmul|gemm)\) (\w+)(;[^*]*)?\*/", c)
        if bn is None:  # coopmat.comp's alone
            check("coopmat_wg" not in [k for k, _ in order] and
                  "coopmat" in [k for k, _ in order], f"kernels {order}")
            return
        check(len(wg) == 1 and wg[0]["BN"] == str(bn) and
              wg[0].get("B_KMAJOR") == ("1" if trans_b else None),
              f"coopmat_wg tiles {[(d.get('BN'), d.get('B_KMAJOR')) for d in wg]}, expected "
              f"128 x {bn}, B_KMAJOR {trans_b}")
        kinds = [k for k, _ in order]
        check(kinds[0] == "coopmat_wg" and kinds[-1] == "matmul" and "coopmat" in kinds,
              f"kernels in order {kinds}")
        say = dict(order)
        check(say["coopmat_wg"].strip().endswith(
                  "; only on devices with cooperative matrices of workgroup scope") and
              "only on devices without cooperative matrices of workgroup scope"
              in say["coopmat"] and
              say["matmul"].strip().endswith("; only on devices without cooperative matrices")
              and "of workgroup scope" not in say["matmul"], f"alternatives {say}")
    return test


for _sa, _sb, _bn, _op, _tb in (([2048, 2048], [2048, 2048], 128, "matmul", 0),
                                ([1024, 1024], [1024, 1024], 64, "matmul", 0),
                                ([2, 1024, 512], [2, 512, 1024], 128, "matmul", 0),
                                ([128, 3072], [3072, 768], None, "matmul", 0),
                                ([2048, 2048], [2048, 2048], 64, "gemm", 0),
                                ([2048, 2048], [2048, 2048], 64, "gemm", 1),
                                ([2048, 2040], [2040, 2048], None, "matmul", 0)):
    case(f"op {_op} f16 coopmat_wg {_sa} x {_sb}{', trans_b' if _tb else ''}: "
         f"{'128 x ' + str(_bn) if _bn else 'not taken'}")(
        coopmat_wg_case(_sa, _sb, _bn, _op, _tb))


@case("op matmul f16 coopmat_wg: its SPIR-V (KHR cooperative matrices of workgroup scope, "
      "rewritten from NV ones) valid to a spirv-val that knows the extension "
      "(KILN_SPIRV_VAL=path; skipped without one: Debian 12's predates it)")
def test_coopmat_wg_spirv(workdir):
    val = os.environ.get("KILN_SPIRV_VAL")
    if not val:
        raise Skip("KILN_SPIRV_VAL names no spirv-val newer than SPV_KHR_cooperative_matrix")
    wd = Path(workdir)
    builds = {"plain": (f16_matmul_yaml([2048, 2048], [2048, 2048]), (), {}),
              "batched": (f16_matmul_yaml([2, 1024, 512], [2, 512, 1024]), (), {}),
              # B K-major (B_KMAJOR: its matrix loaded column-major), with an epilogue
              "trans_b": (model_yaml("gm", {"a": {"dtype": "f32", "shape": [1024, 512]},
                                            "b": {"dtype": "f32", "shape": [2048, 512]},
                                            "c": {"dtype": "f32", "shape": [2048]}},
                                     [{"name": "y", "op": "gemm", "inputs": ["a", "b", "c"],
                                       "trans_b": 1}], ["y"]),
                          ("--precision", "f16"), {})}
    for mode in "123":
        builds[f"ceiling{mode}"] = (f16_matmul_yaml([1024, 1024], [1024, 1024]), (),
                                    {"KILN_COOPMAT_CEILING": mode})
    for sub, (y, flags, env) in builds.items():
        (wd / sub).mkdir()
        build_model(wd / sub, y, None, flags, env=env)
        c = (wd / sub / "model.c").read_text()
        arrays = dict(re.findall(r"static const uint32_t (\w+_spirv_\d+)\[\d*\] = \{(.*?)\};",
                                 c, re.S))
        names = re.findall(r"\{(\w+_spirv_\d+), \d+u, \"coopmat_wg\"", c)
        check(len(names) == 1, f"{sub}: coopmat_wg kernels {names}")
        words = [int(x, 0) for x in re.findall(r"0x[0-9a-fA-F]+|\b\d+\b", arrays[names[0]])]
        spv = wd / sub / "wg.spv"
        spv.write_bytes(np.array(words, dtype="<u4").tobytes())
        r = run([val, "--target-env", "vulkan1.2", spv])
        check(r.returncode == 0, f"{sub}: {r.stdout}{r.stderr}")


def f16_product(seed, m, k, n):
    """Seeded values of a [m, k] and b [k, n], and the model of their f16
    product."""
    r = rng(seed)
    return values(r, [m, k]), values(r, [k, n]), f16_matmul_yaml([m, k], [k, n])


def dispatch_us(prog, folder):
    """The GPU microseconds of each of prog's dispatches in one run (-p,
    its profile written to folder/p.json): a variant the device did not
    record takes none."""
    r = run([prog, "-n", "1", "-p", folder / "p.json"])
    check(r.returncode == 0, r.stderr)
    return [d["us"] for d in json.loads((folder / "p.json").read_text())["dispatches"]]


def ceiling_build(wd, y, mode, env=None):
    """The model y built in wd/mode with KILN_COOPMAT_CEILING=mode (and
    env), once the compiler has said that the products are not computed:
    (that folder, the program)."""
    sub = wd / mode
    sub.mkdir()
    env = {"KILN_COOPMAT_CEILING": mode, **(env or {})}
    prog = build_model(sub, y, env=env)
    r = kiln("compile", sub / "model.yaml", "-o", sub / "again.c", env=env)
    check(r.returncode == 0 and "do not compute their products" in r.stderr, r.stderr)
    return sub, prog


def wg_ceiling_want(a, b, mode, bm, bn, bk):
    """What coopmat_wg.comp's KILN_COOPMAT_CEILING=mode build writes for
    a x b (f16 values as float64) on bm x bn tiles of K steps of bk: 1, the
    first step's matrices multiplied every step; 3, the last step's
    multiplied once; 2, the matrices loaded every step from the shared array
    (zeroed, then the first step's tiles stored: A's rows bk / 8 + 1
    vectors of eight halves apart, B's tile after A's, its rows bn / 8 + 1
    apart) at offsets of 0 (even steps) or 8 vectors (odd steps: A's
    after, B's before)."""
    steps = a.shape[1] // bk
    if mode == "1":
        return steps * (a[:, :bk] @ b[:bk])
    if mode == "3":
        return a[:, -bk:] @ b[-bk:]
    av, bv = bk // 8 + 1, bn // 8 + 1  # row strides in vectors
    a_tile = bm * av
    want = np.zeros((a.shape[0], b.shape[1]))
    for m0 in range(0, a.shape[0], bm):
        for n0 in range(0, b.shape[1], bn):
            sh = np.zeros((a_tile + bk * bv) * 8)
            for r in range(bm):
                sh[r * av * 8:r * av * 8 + bk] = a[m0 + r, :bk]
            for k in range(bk):
                sh[(a_tile + k * bv) * 8:(a_tile + k * bv) * 8 + bn] = b[k, n0:n0 + bn]
            for o, times in ((0, (steps + 1) // 2), (8, steps // 2)):
                fa = np.array([sh[(o + r * av) * 8:(o + r * av) * 8 + bk] for r in range(bm)])
                fb = np.array([sh[(a_tile - o + k * bv) * 8:(a_tile - o + k * bv) * 8 + bn]
                               for k in range(bk)])
                want[m0:m0 + bm, n0:n0 + bn] += times * (fa @ fb)
    return want


@case("op matmul f16 coopmat_wg KILN_COOPMAT_CEILING=1, 2, 3 (benchmarks of the matrix units, "
      "of shared memory feeding them, of the tiles' traffic): the mode reaches coopmat_wg.comp "
      "and, but for 3 (coopmat_wg's alone), coopmat.comp; the compiler says the products are "
      "not computed; the tiled kernel lavapipe runs still computes it")
def test_coopmat_wg_ceiling(workdir):
    a, b, y = f16_product(3311, 1024, 256, 1024)
    product = half(a) @ half(b)
    for mode in "123":
        sub, prog = ceiling_build(Path(workdir), y, mode)
        wg = wg_defines(sub)
        cm = [d for d in kernel_defines(sub) if "WM" in d]
        check(len(wg) == 1 and wg[0].get("CEILING") == mode,
              f"mode {mode}: coopmat_wg defines {wg}")
        check(len(cm) == 1 and cm[0].get("CEILING") == (None if mode == "3" else mode),
              f"mode {mode}: coopmat.comp defines {cm}")
        us = dispatch_us(prog, sub)  # which of the three the device recorded
        want = product
        if us[0] > 0:  # coopmat_wg.comp: its ceiling's values
            want = wg_ceiling_want(half(a), half(b), mode, *(int(wg[0][k])
                                                             for k in ("BM", "BN", "BK")))
        elif us[1] > 0 and mode != "3":  # coopmat.comp: test_coopmat_ceiling checks its
            continue
        got, = run_program(prog, [a.astype(np.float16), b.astype(np.float16)],
                           [want.astype(np.float16)])
        assert_close(got.astype(np.float64), want, 1e-2, 1e-2)


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


def products_yaml(x, ws, names):
    """A model of the input x times each weight of ws (inline f32 values),
    the products its outputs names (the QKV split's candidates)."""
    return model_yaml("qkv", {"x": spec(x)},
                      [{"name": n, "op": "matmul", "inputs": ["x", f"w{j}"]}
                       for j, n in enumerate(names)], names,
                      weights={f"w{j}": {"dtype": "f32", "shape": list(w.shape),
                                         "values": [float(v) for v in w.reshape(-1)]}
                               for j, w in enumerate(ws)})


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
        y = products_yaml(x, ws, names)
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

def qkv_bias_case(xshape, widths, flags=(), tol=1e-5):
    """Matmuls of one input by weights of the same K, each followed by the
    add of its own bias (BERT's and ViT's Q, K and V projections): one
    dispatch, the biases side by side; without biases on all of them (one
    product lacks one) they stay apart."""
    def test(workdir):
        r = rng(360)
        k = xshape[-1]
        x = values(r, xshape, 1.0)
        ws = [values(r, [k, w], 1.0) for w in widths]
        bs = [values(r, [w], 1.0) for w in widths]
        all_bias = "mixed" not in flags
        nodes, names, want = [], [], []
        for j, (w, b) in enumerate(zip(ws, bs)):
            biased = all_bias or j > 0
            nodes.append({"name": f"p{j}", "op": "matmul", "inputs": ["x", f"w{j}"]})
            if biased:
                nodes.append({"name": f"y{j}", "op": "add", "inputs": [f"p{j}", f"b{j}"]})
            names.append(f"y{j}" if biased else f"p{j}")
            want.append(ref.matmul(x, w) + (b if biased else 0))
        weights = {f"w{j}": {"dtype": "f32", "shape": list(w.shape),
                             "values": [float(v) for v in w.reshape(-1)]}
                   for j, w in enumerate(ws)}
        weights.update({f"b{j}": {"dtype": "f32", "shape": list(b.shape),
                                  "values": [float(v) for v in b]} for j, b in enumerate(bs)})
        y = model_yaml("qkvb", {"x": spec(x)}, nodes, names, weights=weights)
        kflags = [f for f in flags if f != "mixed"]
        prog = build_model(workdir, y, flags=kflags)
        c = (Path(workdir) / "model.c").read_text()  # the group's label
        check(("p0 + y0 + p1 + p2 (matmul)" in c) == all_bias,
              "the biased products are not one dispatch" if all_bias else
              "products with and without a bias were grouped")
        got = run_program(prog, [x], [w.astype(np.float32) for w in want])
        for g, w in zip(got, want):
            if "--precision" in kflags:
                assert_relative(g, w, F16_TOLERANCE, "f16")
            else:
                assert_close(g, w, tol, 2e-6 * k ** 0.5 * 4 + tol)
    return test


for xs, ws, fl in [([4, 32], [16, 8, 24], ()), ([1, 40, 36], [20, 12, 12], ()),
                   ([1, 40, 36], [20, 12, 12], ("--precision", "f16")),
                   ([4, 32], [16, 8, 24], ("mixed",))]:
    case(f"op matmul QKV split with biases {xs} x {ws} {' '.join(fl)}".rstrip())(
        qkv_bias_case(xs, ws, fl))

# ---- a gemm cut by a Split (GPT-2's attention projection) ----

def gemm_split_case(i, M, K, parts, flags=()):
    """gemm(x, w, b) -> reshape [1, M, N] -> Split along the last axis into
    `parts` (widths): the gemm's dispatch writes the parts (optimize.c
    fuse_gemm_split), no copies; against float64, every part, each part
    also read by a node after it (as attention reads q, k, v). With
    --no-fuse=qkv the Split runs on its own."""
    def test(workdir):
        r = rng(380 + i)
        N = sum(parts)
        x, w, b = values(r, [M, K], 1.0), values(r, [K, N], 0.3), values(r, [N], 1.0)
        nodes = [{"name": "g", "op": "gemm", "inputs": ["x", "w", "b"]},
                 {"name": "v", "op": "reshape", "inputs": ["g"], "shape": [1, M, N]},
                 {"name": "s", "op": "split", "inputs": ["v"], "axis": 2,
                  "sizes": list(parts), "outputs": [f"p{k}" for k in range(len(parts))]}]
        nodes += [{"name": f"y{k}", "op": "neg", "inputs": [f"p{k}"]} for k in range(len(parts))]
        y = model_yaml("gs", {"x": spec(x)}, nodes, [f"y{k}" for k in range(len(parts))],
                       weight_specs(w=w, b=b))
        h = (x.astype(np.float64) @ w + b).reshape(1, M, N)
        cuts = np.cumsum(parts)[:-1]
        want = [-p for p in np.split(h, cuts, axis=2)]
        f16 = "--precision" in flags
        prog = build_model(workdir, y, flags=list(flags))
        got = run_steps(prog, [[x], [values(r, [M, K], 1.0)]],
                        [np.zeros_like(v, np.float32) for v in want])[0]
        for k, (g, v) in enumerate(zip(got, want)):
            if f16:
                assert_relative(g, v, F16_TOLERANCE, f"part {k}")
            else:
                assert_close(g, v, 1e-5, 2e-6 * K ** 0.5 * 4, f"part {k}")
        c = (Path(workdir) / "model.c").read_text()
        fused = "g + s (gemm)" in c
        check(fused == ("--no-fuse=qkv" not in flags), f"fused: {fused}")
    return test


for i, (M, K, parts, fl) in enumerate([
        (8, 16, (16, 16, 16), ()),                 # matvec, three equal parts
        (40, 64, (24, 8, 40), ()),                 # tiled, three unequal parts
        (8, 32, (20, 12), ()),                     # two parts
        (40, 1000, (16, 16, 32), ()),              # split along K too (the last workgroups)
        (40, 64, (32, 32, 32), ("--precision", "f16")),
        (8, 16, (16, 16, 16), ("--no-fuse=qkv",))]):
    case(f"op gemm + reshape + split into {list(parts)}: the gemm writes the parts, "
         f"M={M} K={K} {' '.join(fl)}".rstrip())(gemm_split_case(i, M, K, parts, fl))


# ---- split K: matmul.comp's partial products, each tile's last workgroup's sum ----

SPLIT_PRODUCTS = [  # a shape, b shape, dtype: few tiles and a long K, which the cost model splits
    ([40, 1000], [1000, 64], np.float32),   # vec4, the last chunk of K ragged
    ([3, 11, 999], [999, 40], np.float32),  # scalar (K odd), the batch folded into M
    ([40, 1001], [1001, 20], np.float16),   # f16 A, B and C on the tiled kernel (K odd)
]


def split_case(i, sa, sb, dt, last):
    """Split along K: splitk.comp adds the chunks up (the default), or with
    KILN_SPLIT_LAST=1 each tile's last workgroup."""
    def test(workdir):
        r = rng(360 + i)
        a, b = values(r, sa, 1.0).astype(dt), values(r, sb, 1.0).astype(dt)
        want = ref.matmul(a.astype(np.float64), b.astype(np.float64))
        y = model_yaml("mm", {"a": spec(a), "b": spec(b)},
                       [{"name": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"])
        # two runs of other inputs (run_steps): the counters and partial
        # products the first leaves must not reach the second's result
        a2 = values(r, sa, 1.0).astype(dt)
        want2 = ref.matmul(a2.astype(np.float64), b.astype(np.float64))
        env = {"KILN_SPLIT_LAST": "1"} if last else None
        got, got2 = run_steps(build_model(workdir, y, env=env), [[a, b], [a2, b]],
                              [want.astype(dt)])
        got, got2 = got[0], got2[0]
        check(got.dtype == dt, f"output dtype {got.dtype}")
        k = sa[-1]
        for g, w in ((got, want), (got2, want2)):
            assert_close(g, w, 2 ** -10 if dt == np.float16 else 1e-5, 2e-6 * k ** 0.5 * 4)
        # an f16 product also has its cooperative-matrix variant (A and B
        # gathered where K or N is not a multiple of 8), for devices with them
        check_kernels(workdir, {"matmul"} | ({"coopmat"} if dt == np.float16 else set()) |
                      (set() if last else {"splitk"}))
        defs = kernel_defines(workdir)
        check(any("KCHUNK" in d for d in defs) and
              any(d.get("SPLIT_LAST") == "1" for d in defs) == last,
              f"not split{' in the last workgroups' if last else ' by splitk.comp'}: {defs}")
    return test


for i, (sa, sb, dt) in enumerate(SPLIT_PRODUCTS):
    case(f"op matmul split along K {sa} x {sb} {np.dtype(dt).name}")(
        split_case(i, sa, sb, dt, False))
    case(f"op matmul split along K {sa} x {sb} {np.dtype(dt).name}, KILN_SPLIT_LAST=1: "
         f"each tile's last workgroup adds the chunks up")(split_case(i, sa, sb, dt, True))


@case("op gemm split along K: transposes, bias [M, N], alpha, beta, gelu by splitk.comp")
def _(workdir):
    r = rng(370)
    M, K, N = 24, 1500, 40
    a, b, c = values(r, [K, M], 1.0), values(r, [N, K], 1.0), values(r, [M, N], 1.0)
    want = ref.gemm(a, b, c, alpha=0.5, beta=2.0, trans_a=1, trans_b=1, activation="gelu")
    one_op(workdir, "gemm", [a, b, c], want, {"alpha": 0.5, "beta": 2.0, "trans_a": 1,
                                                "trans_b": 1, "activation": "gelu"},
           1e-5, 2e-6 * K ** 0.5 * 4)
    check_kernels(workdir, {"matmul", "splitk"})
    check_defines(workdir, {"SPLIT_LAST": None})
    defs = kernel_defines(workdir)
    check(any("KCHUNK" in d for d in defs) and
          any(d.get("HAS_BIAS") == "1" and "SPLITK" in d for d in defs),
          f"no split with the bias in its sum: {defs}")


def split_qkv_case(flags, rtol, atol, env=None):
    """A QKV split product split along K too: splitk.comp (or, with
    KILN_SPLIT_LAST=1, each tile's last workgroup) writes the three outputs; with int8 weights the partial products read their scales (the
    products' elements are about 32 in size; int8's rounding adds up to
    about 1 over K = 1024, a lost or doubled chunk of K about 30)."""
    def test(workdir):
        r = rng(375)
        x = values(r, [40, 1024], 1.0)
        ws = [values(r, [1024, w], 1.0) for w in (16, 8, 24)]
        names = ["q", "k", "v"]
        y = products_yaml(x, ws, names)
        want = [ref.matmul(x, w) for w in ws]
        prog = build_model(workdir, y, flags=list(flags), env=env)
        got = run_program(prog, [x], [w.astype(np.float32) for w in want])
        for g, w in zip(got, want):
            assert_close(g, w, rtol, atol)
        c = (Path(workdir) / "model.c").read_text()
        check("q + k + v (matmul)" in c, "the products are not one")
        check_kernels(workdir, {"matmul"} | (set() if env else {"splitk"}))
        check_defines(workdir, {"SPLIT_LAST": "1" if env else None})
    return test


case("op matmul QKV split, split along K")(split_qkv_case((), 1e-5, 2.6e-4))
case("op matmul QKV split, split along K, KILN_SPLIT_LAST=1")(
    split_qkv_case((), 1e-5, 2.6e-4, {"KILN_SPLIT_LAST": "1"}))
case("op matmul QKV split, split along K, int8 weights")(
    split_qkv_case(("--weights", "int8"), 0.02, 1.6))


# ---- gemm: transposes, bias, alpha/beta, fused activation ----

GEMMS = [  # M, K, N, trans_a, trans_b, bias shape, alpha, beta, activation[, defines]
    (5, 7, 3, 0, 0, None, 1.0, 1.0, "none"),
    (5, 7, 3, 1, 0, [3], 1.0, 1.0, "relu"),
    (33, 65, 17, 0, 1, [33, 17], 0.5, 2.0, "gelu"),
    (64, 64, 64, 1, 1, [1], 1.0, -1.0, "silu"),
    (8, 16, 130, 0, 1, [8, 1], 2.0, 0.5, "tanh"),
    (4, 9, 6, 0, 0, [6], 1.0, 1.0, "sigmoid"),
    (7, 3, 5, 1, 0, [5], 1.0, 1.0, "gelu_tanh"),
    # matmul.comp's two-stage (VEC4) path with operands it reads one
    # element at a time: both transposed (A_SCALAR: runs of 8 along K into
    # padded stages; B_SCALAR) on 32-row tiles; A's rows unaligned on 128 x
    # 128 tiles in K steps of 8; ragged tiles, K steps past K
    (130, 75, 140, 1, 1, [140], 1.0, 1.0, "none",
     {"VEC4": "1", "A_SCALAR": "1", "B_SCALAR": "1", "BM": "32"}),
    (2100, 37, 2060, 0, 0, [2060], 1.0, 1.0, "none",
     {"VEC4": "1", "A_SCALAR": "1", "BM": "128", "BK": "8"}),
]


def gemm_case(i, M, K, N, ta, tb, bias, alpha, beta, act, defines=None):
    def test(workdir):
        r = rng(2100 + i)
        a = values(r, [K, M] if ta else [M, K], 1.0)
        b = values(r, [N, K] if tb else [K, N], 1.0)
        ins = [a, b] + ([values(r, bias, 1.0)] if bias else [])
        want = ref.gemm(*ins, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, activation=act)
        attrs = {"alpha": alpha, "beta": beta, "trans_a": ta, "trans_b": tb, "activation": act}
        one_op(workdir, "gemm", ins, want, attrs, 1e-5, 2e-6 * K ** 0.5 * 4)
        if defines:
            check_defines(workdir, defines)
    return test


for i, g in enumerate(GEMMS):
    case(f"op gemm M={g[0]} K={g[1]} N={g[2]} ta={g[3]} tb={g[4]} bias={g[5]} "
         f"alpha={g[6]} beta={g[7]} act={g[8]}")(gemm_case(i, *g))


@case("op det [M, M] and [..., M, M] (M 1 to 12; a zero pivot, a singular matrix) against numpy")
def _(workdir):
    r = rng(3100)
    for shape in ([1, 1], [3, 3], [2, 4, 5, 5], [12, 12], [7, 2, 2]):
        x = r.standard_normal(shape).astype(np.float32)
        if shape == [3, 3]:
            x[0, 0] = 0.0  # the first pivot must come from another row
        if shape == [2, 4, 5, 5]:
            x[1, 2, 3] = x[1, 2, 1] * 2  # singular: two rows proportional
        want = np.linalg.det(x.astype(np.float64))
        one_op(workdir, "det", [x], want.astype(np.float32), None, 1e-4, 1e-5)


# ---- --precision f16: products of f16 activations and weights with their
# fused epilogues. Where the device has cooperative matrices they run
# coopmat.comp (EPILOGUE 1: every element through store_c); elsewhere
# (lavapipe) matmul.comp with f16 A, B and C. The reference multiplies the
# f16-rounded operands in f64. ----

def wg_epilogue(workdir, wanted):
    """That coopmat_wg.comp has (wanted) or lacks an epilogue kernel."""
    wg = wg_defines(workdir)
    check(bool(wg) == wanted and all(d.get("EPILOGUE") == "1" for d in wg),
          f"coopmat_wg kernels: {wg}")


def f16_product_case(qkv, K=64, N=96):
    def test(workdir):
        r = rng(2100 + qkv + K + N)
        M = 128
        x = values(r, [M, K], 1.0)
        ws = [values(r, [K, N], 0.2) for _ in range(3 if qkv else 1)]
        b = values(r, [N], 1.0)
        weights = weight_specs(**{f"w{i}": w for i, w in enumerate(ws)}, b=b)
        nodes = [{"name": "hx", "op": "neg", "inputs": ["x"]}]
        if qkv:  # three products of one A: one dispatch writing three outputs
            outs = []
            for i in range(3):
                nodes += [{"name": f"p{i}", "op": "matmul", "inputs": ["hx", f"w{i}"]},
                          {"name": f"y{i}", "op": "neg", "inputs": [f"p{i}"]}]
                outs.append(f"y{i}")
            wants = [half(x) @ half(w) for w in ws]  # y = -(-x @ w)
        else:
            nodes += [{"name": "p", "op": "matmul", "inputs": ["hx", "w0"]},
                      {"name": "pb", "op": "add", "inputs": ["p", "b"]},
                      {"name": "a", "op": "gelu", "inputs": ["pb"]},
                      {"name": "y0", "op": "neg", "inputs": ["a"]}]
            outs = ["y0"]
            wants = [-ref.UNARY["gelu"](-half(x) @ half(ws[0]) + b)]
        prog = build_model(workdir, model_yaml("f16mm", {"x": spec(x)}, nodes, outs, weights),
                           flags=("--precision", "f16"))
        defs = [d for d in kernel_defines(workdir) if "WM" in d]
        if K > 256:  # few tiles, a long K: split, the epilogue by splitk.comp
            check(defs and defs[0].get("KCHUNK") == "128" and defs[0].get("SPLITS") == "4" and
                  "SPLIT_LAST" not in defs[0] and
                  any(d.get("HAS_BIAS") == "1" and "SPLITK" in d
                      for d in kernel_defines(workdir)),
                  f"no split cooperative-matrix kernel: {kernel_defines(workdir)}")
        else:
            check(defs and defs[0].get("EPILOGUE") == "1" and defs[0].get("C_F16") == "1",
                  f"no cooperative-matrix kernel with an epilogue: {kernel_defines(workdir)}")
        if qkv:
            check("SPLIT_N0" in defs[0], f"not one split product: {defs[0]}")
        else:
            check(defs[0].get("HAS_BIAS") == "1" or K > 256,  # split: splitk.comp's bias
                  f"no bias: {defs[0]}")
        wg_epilogue(workdir, N >= 8192)
        gots = run_program(prog, [x], [w.astype(np.float32) for w in wants])
        for i, (g, w) in enumerate(zip(gots, wants)):
            assert_close(g, w, 2e-3, 2e-3, f"output {i}")
    return test


case("op matmul --precision f16: [128, 64] x [64, 96] + bias, gelu (coopmat epilogue "
     "where the device has cooperative matrices)")(f16_product_case(False))
case("op matmul --precision f16: a QKV split of three [64, 96] weights (coopmat "
     "epilogue where the device has cooperative matrices)")(f16_product_case(True))
case("op matmul --precision f16: [128, 512] x [512, 96] + bias, gelu (coopmat split along "
     "K in 4 chunks, the epilogue by splitk.comp, where the device has "
     "cooperative matrices)")(
    f16_product_case(False, K=512))
case("op matmul --precision f16: [128, 64] x [64, 8192] + bias, gelu (coopmat_wg's "
     "epilogue where the device has cooperative matrices of workgroup scope)")(
    f16_product_case(False, N=8192))
case("op matmul --precision f16: a QKV split of three [64, 8192] weights (coopmat_wg's "
     "epilogue, element by element)")(f16_product_case(True, N=8192))


def f16_gemm_case(trans_b, N=96, K=64):
    def test(workdir):
        r = rng(2200 + trans_b + N + K)
        M = 128
        x, c = values(r, [M, K], 1.0), values(r, [N], 1.0)
        w = values(r, [N, K] if trans_b else [K, N], 0.2)
        weights = weight_specs(w=w, c=c)
        nodes = [{"name": "hx", "op": "neg", "inputs": ["x"]},
                 {"name": "g", "op": "gemm", "inputs": ["hx", "w", "c"], "alpha": 0.5,
                  "beta": 2.0, "trans_b": trans_b, "activation": "relu"},
                 {"name": "y", "op": "neg", "inputs": ["g"]}]
        prog = build_model(workdir, model_yaml("f16gemm", {"x": spec(x)}, nodes, ["y"], weights),
                           flags=("--precision", "f16"))
        coop = [d for d in kernel_defines(workdir) if "WM" in d]
        # a transposed B (K-major) is gathered by columns: eight k a vector
        # where K is a multiple of 8 (B_KVEC), else one at a time
        gather = ("1", "1" if K % 8 == 0 else None) if trans_b else (None, None)
        check(len(coop) == 1 and coop[0].get("EPILOGUE") == "1" and
              (coop[0].get("B_GATHER"), coop[0].get("B_KVEC")) == gather,
              f"cooperative-matrix kernels {coop}, expected B_GATHER and B_KVEC {gather}")
        wg_epilogue(workdir, N >= 8192)
        kmajor = [d.get("B_KMAJOR") for d in wg_defines(workdir)]
        check(all(k == ("1" if trans_b else None) for k in kmajor), f"coopmat_wg B_KMAJOR {kmajor}")
        wb = half(w).T if trans_b else half(w)
        want = -np.maximum(0.5 * (-half(x)) @ wb + 2.0 * c, 0)
        got, = run_program(prog, [x], [want.astype(np.float32)])
        assert_close(got, want, 2e-3, 2e-3)
    return test


for _tb, _k in ((0, 64), (1, 64), (1, 60)):
    case(f"op gemm --precision f16: alpha, beta, relu, trans_b={_tb}, K {_k} (coopmat "
         "epilogue where the device has cooperative matrices; a transposed B gathered by "
         "columns)")(f16_gemm_case(_tb, K=_k))
for _tb in (0, 1):
    case(f"op gemm --precision f16: alpha, beta, relu, [128, 64] x [64, 8192], trans_b={_tb} "
         "(coopmat_wg's epilogue where the device has cooperative matrices of workgroup "
         "scope; a transposed B loaded column-major)")(f16_gemm_case(_tb, N=8192))


@case("op matmul f16 coopmat pipeline: KILN_COOPMAT_PIPE=2,2 reaches coopmat.comp (PF, NS) "
      "and the generated C names it; two stages dropped where they pass 48 KiB; the steps "
      "in pairs (EVEN_STEPS) where every workgroup's count is even")
def test_coopmat_pipe(workdir):
    wd = Path(workdir)
    for sub, (M, K, N), ns, even in (("small", (256, 512, 256), "2", "1"),
                                     ("wide", (4096, 512, 4096), None, "1"),
                                     ("odd", (512, 480, 512), "2", None)):
        y = f16_matmul_yaml([M, K], [K, N])
        (wd / sub).mkdir()
        build_model(wd / sub, y, env={"KILN_COOPMAT_PIPE": "2,2"})
        cm = [d for d in kernel_defines(wd / sub) if "WM" in d]
        check(len(cm) == 1 and cm[0].get("PF") == "2" and cm[0].get("NS") == ns and
              cm[0].get("EVEN_STEPS") == even,
              f"{sub}: coopmat defines PF {cm[0].get('PF') if cm else None}, "
              f"NS {cm[0].get('NS') if cm else None}, EVEN_STEPS "
              f"{cm[0].get('EVEN_STEPS') if cm else None}, expected 2, {ns}, {even}")
        check("KILN_COOPMAT_PIPE" in (wd / sub / "model.c").read_text()[:4000],
              "the generated C does not name KILN_COOPMAT_PIPE")


@case("op matmul f16 KILN_COOPMAT_CEILING=1 and 2 (a benchmark of the matrix units): "
      "coopmat.comp's CEILING compiles, one step in flight, the compiler says the products "
      "are not computed; the tiled variant lavapipe runs still is, and on the matrix units "
      "each step multiplies the first step's fragments")
def test_coopmat_ceiling(workdir):
    a, b, y = f16_product(3310, 128, 96, 192)
    for ceiling in ("1", "2"):
        sub, prog = ceiling_build(Path(workdir), y, ceiling, {"KILN_COOPMAT_PIPE": "2,2"})
        cm = [d for d in kernel_defines(sub) if "WM" in d]
        check(len(cm) == 1 and cm[0].get("CEILING") == ceiling and "PF" not in cm[0] and
              "NS" not in cm[0], f"coopmat defines {cm}")
        text = (sub / "model.c").read_text()[:4000]
        check("KILN_COOPMAT_CEILING" in text, "the generated C does not name the variable")
        want = half(a) @ half(b)
        got, = run_program(prog, [a.astype(np.float16), b.astype(np.float16)],
                           [want.astype(np.float16)])
        us = dispatch_us(prog, sub)  # which variant ran
        if us[0] > 0:
            # the matrix units ran the ceiling: each of the 3 steps of BK
            # multiplies the first step's fragments, CEILING 1 the first 16
            # of K (BK / 16 times a step), 2 the first BK
            bk, steps = int(cm[0]["BK"]), -(-96 // int(cm[0]["BK"]))
            kf = 16 if ceiling == "1" else bk
            want = steps * (bk // kf) * (half(a)[:, :kf] @ half(b)[:kf])
        assert_close(got.astype(np.float64), want, 1e-2, 1e-2)


@case("op matmul f16 batch of small products ([24, 49, 32] x [24, 32, 49], windowed "
      "attention's): the tiled kernel, not coopmat.comp (a fragment row per subgroup)")
def _(workdir):
    r = rng(3320)
    a, b = values(r, [24, 49, 32], 1.0), values(r, [24, 32, 49], 1.0)
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    y = model_yaml("win", {"a": spec(a16), "b": spec(b16)},
                   [{"name": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"])
    prog = build_model(workdir, y, flags=("--precision", "f16"))
    check_kernels(workdir, {"matmul"})
    want = half(a).astype(np.float64) @ half(b)
    got, = run_program(prog, [a16, b16], [want.astype(np.float16)])
    assert_close(got.astype(np.float64), want, 2e-3, 2e-3)
