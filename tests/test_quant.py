"""test_quant.py: matmul weights stored as f16, int8, int4 and fp8 (--weights).

For each format and several shapes (matvec and tiled kernels, K not a
multiple of the block, a gemm with a transposed weight, one weight read by
two matmuls, one also read by another op), the weight is quantized again
here with numpy from docs/cli.md's description of the format (not from
kiln's code), and kiln's output is compared twice:
- with x @ dequantized(W) in float64, to f32 matmul accuracy: the kernel
  decodes exactly the bytes the description says;
- with x @ W (the f32 weights), within |x| @ bound, where bound is the
  format's documented worst error per element: what a user can count on.
The weight memory is checked against the format's size.
"""
import re
from pathlib import Path

import numpy as np

from harness import (assert_close, build_model, check, check_kernels, kiln, model_yaml,
                     program_env, registry, run_program)

TESTS, case = registry()

BLOCK = 32
LEVELS = {"int8": 127, "int4": 7, "int8-asym": 255, "int4-asym": 15,
          "fp8-e4m3": 448, "fp8-e5m2": 57344}
# Bytes per weight, scales and zero points included (blocks of 32).
SIZE = {"f32": 4, "f16": 2, "int8": 1 + 4 / 32, "int8-asym": 1 + 5 / 32, "int4": 0.5 + 4 / 32,
        "int4-asym": 0.5 + 5 / 32, "fp8-e4m3": 1 + 4 / 32, "fp8-e5m2": 1 + 4 / 32}


def fp8_table(ebits):
    """Every finite non-negative fp8 value, by code (0 .. largest finite)."""
    mbits, bias = 7 - ebits, (1 << (ebits - 1)) - 1
    top = 126 if ebits == 4 else 123
    vals = []
    for q in range(top + 1):
        e, m = q >> mbits, q & ((1 << mbits) - 1)
        vals.append(m * 2.0 ** (1 - bias - mbits) if e == 0
                    else (m + (1 << mbits)) * 2.0 ** (e - bias - mbits))
    return np.array(vals)


def fp8_round(v, ebits):
    """The nearest fp8 value to each element of v, ties to the even code."""
    table = fp8_table(ebits)
    a = np.minimum(np.abs(v), table[-1])
    hi = np.clip(np.searchsorted(table, a), 1, len(table) - 1)
    lo = hi - 1
    dl, dh = a - table[lo], table[hi] - a
    code = np.where((dh < dl) | ((dh == dl) & (hi % 2 == 0)), hi, lo)
    return np.sign(v) * table[code]


def dequantized(w, fmt):
    """W as the format stores it ([K, N], blocks along K), and the
    documented worst error of each element."""
    w64 = w.astype(np.float64)
    if fmt == "f32":
        return w64, np.zeros_like(w64)
    if fmt == "f16":
        return (w.astype(np.float16).astype(np.float64),
                np.maximum(np.abs(w64) * 2.0 ** -11, 2.0 ** -25))
    out = np.zeros_like(w64)
    bound = np.zeros_like(w64)
    L = LEVELS[fmt]
    for k0 in range(0, w.shape[0], BLOCK):
        blk = w64[k0:k0 + BLOCK]
        lo, hi = np.minimum(blk.min(0), 0), np.maximum(blk.max(0), 0)
        asym = fmt.endswith("asym")
        s = ((hi - lo) if asym else np.abs(blk).max(0)) / L
        s = s.astype(np.float32).astype(np.float64)  # stored as f32
        v = np.divide(blk, s, out=np.zeros_like(blk), where=s > 0)
        if fmt.startswith("fp8"):
            ebits = 4 if fmt == "fp8-e4m3" else 5
            out[k0:k0 + BLOCK] = fp8_round(v, ebits) * s
            rel, sub = (2.0 ** -4, 2.0 ** -10) if ebits == 4 else (2.0 ** -3, 2.0 ** -17)
            bound[k0:k0 + BLOCK] = np.maximum(np.abs(blk) * rel, sub * s)
        elif asym:
            z = np.where(s > 0, np.clip(np.rint(np.divide(-lo, s, out=np.zeros_like(s),
                                                          where=s > 0)), 0, L), 0)
            q = np.clip(np.rint(v) + z, 0, L)
            out[k0:k0 + BLOCK] = (q - z) * s
            bound[k0:k0 + BLOCK] = s * 1.0001  # rounding, and a rounded zero point
        else:
            q = np.clip(np.rint(v), -L - 1, L)
            out[k0:k0 + BLOCK] = q * s
            bound[k0:k0 + BLOCK] = s / 2 * 1.0001
    return out, bound


def weight_bytes(header):
    """MODEL_WEIGHT_BYTES of a generated header (compiled with --name model)."""
    return int(re.search(r"#define MODEL_WEIGHT_BYTES (\d+)", Path(header).read_text())[1])


def quant_case(fmt, M, K, N, gemm=False, shared=False, other_use=False, seed=0, kernels=None,
               env=None, compile_env=None):
    """kernels: the kernel families the model must run (a set); env: the
    program's environment (program_env); compile_env: the compiler's."""
    def test(workdir):
        r = np.random.default_rng(seed)
        x = r.standard_normal([M, K]).astype(np.float32)
        w = (r.standard_normal([K, N]) * 0.5).astype(np.float32)
        w[:, 0] *= 40  # one column of large values: scales differ per block and column
        w[3 % K, 1 % N] = 0.0
        # One column of magnitudes 1 to 2^-31 within each block, alternating
        # signs: fp8's subnormal codes, and every other small code.
        kk = np.arange(K)
        w[:, 2 % N] = np.where(kk % 2, -1.0, 1.0) * 2.0 ** -(kk % BLOCK)
        wq, bound = dequantized(w, fmt)
        stored = w.T.copy() if gemm else w  # gemm trans_b: the weight is [N, K]
        weights = {"w": {"dtype": "f32", "shape": list(stored.shape), "file": "w.bin"}}
        if gemm:
            nodes = [{"name": "y", "op": "gemm", "inputs": ["x", "w"], "trans_b": 1}]
        else:
            nodes = [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}]
        outs = ["y"]
        if shared:  # a second reader of the same weight, sharing its bytes
            nodes.append({"name": "y2", "op": "matmul", "inputs": ["x2", "w"]})
            outs.append("y2")
        if other_use:  # read by another op too: stays f32 for both
            nodes.append({"name": "y2", "op": "mul", "inputs": ["w", "w"]})
            outs.append("y2")
        ins = {"x": {"dtype": "f32", "shape": [M, K]}}
        inputs = [x]
        if shared:
            x2 = (r.standard_normal([3, K]) * 2).astype(np.float32)
            ins["x2"] = {"dtype": "f32", "shape": [3, K]}
            inputs.append(x2)
        y = model_yaml("q", ins, nodes, outs, weights=weights)
        prog = build_model(workdir, y, {"w.bin": stored.tobytes()}, flags=("--weights", fmt),
                           env=compile_env)
        if compile_env:  # KILN_MATVEC_K=WG,CN,UNROLL[,TEAMS,A_SHARED] reached the kernel
            t = [int(v) for v in compile_env["KILN_MATVEC_K"].split(",")]
            t += [0, 0, 1, 1, 0][len(t):]
            src = (Path(workdir) / "model.c").read_text()
            for name, v in (("UNROLL", t[2]), ("TEAMS", t[3]), ("A_SHARED", t[4])):
                check((f"{name} {v}" in src) == (v > 1 or (name == "A_SHARED" and v > 0)),
                      f"KILN_MATVEC_K's {name} {v} did not reach the kernel")
        if kernels:
            check_kernels(workdir, kernels)
        x64 = x.astype(np.float64)
        wants = [x64 @ (w.astype(np.float64) if other_use else wq)]
        if shared:
            wants.append(x2.astype(np.float64) @ wq)
        if other_use:
            wants.append(w * w)
        header = Path(workdir) / "model.h"
        with program_env(**(env or {})):
            gots = run_program(prog, inputs, [np.zeros(np.shape(v), np.float32) for v in wants])
        for i, (g, want) in enumerate(zip(gots, wants)):
            assert_close(g, want, 1e-5, 2e-6 * K ** 0.5 * 4 * max(1, np.abs(w).max()),
                         f"output {i} against x @ dequantized(W)")
        if other_use:
            check(weight_bytes(header) >= K * N * 4, "the f32 weight should stay")
            return
        # The documented error, against the f32 weights.
        err = np.abs(gots[0] - x64 @ w.astype(np.float64))
        allowed = np.abs(x64) @ bound + 1e-5 * (1 + np.abs(x64) @ np.abs(w.astype(np.float64)))
        worst = np.unravel_index(np.argmax(err - allowed), err.shape)
        check((err <= allowed).all(),
              f"{fmt}: error {err[worst]:.3g} at {list(worst)} above the documented "
              f"{allowed[worst]:.3g}")
        got_bytes, want_bytes = weight_bytes(header), SIZE[fmt] * K * N
        check(got_bytes <= want_bytes + 3 * 256 and (fmt == "f32" or got_bytes < K * N * 4),
              f"{fmt}: {got_bytes} bytes of weights, expected about {want_bytes:.0f}")
    return test


FORMATS = ["f16", "int8", "int8-asym", "int4", "int4-asym", "fp8-e4m3", "fp8-e5m2"]
for i, fmt in enumerate(FORMATS):
    case(f"--weights {fmt}: matvec [5, 70] x [70, 40]")(
        quant_case(fmt, 5, 70, 40, seed=i, kernels={"matvec"}))
    case(f"--weights {fmt}: tiled matmul [70, 96] x [96, 130]")(
        quant_case(fmt, 70, 96, 130, seed=10 + i))
    case(f"--weights {fmt}: gemm, transposed weight [33, 64] x [50, 64]^T")(
        quant_case(fmt, 33, 64, 50, gemm=True, seed=20 + i))
# f16 weights read four halves at a time (matmul.comp's VEC4 B, N a multiple of 4)
case("--weights f16: tiled matmul [70, 96] x [96, 128], B as vec4s")(
    quant_case("f16", 70, 96, 128, seed=17))
case("--weights int4: one weight, two matmuls, one copy")(
    quant_case("int4", 6, 40, 24, shared=True, seed=40))
case("--weights int8: a weight another op reads stays f32")(
    quant_case("int8", 6, 40, 24, other_use=True, seed=41))

# Decode-shaped products (up to 2 fixed rows for f32, 8 for the other
# formats, and K whole 16-byte chunks of the format) store their weight
# K-major and run matvec_k.comp: every format; columns that leave a ragged
# last workgroup; 1 row and the most rows; the gemm whose transposed weight
# is K-major already (f32 up to 16 rows); the shared-memory reduction of
# devices without subgroup arithmetic. One row more keeps the weight
# row-major (matvec.comp).
for i, fmt in enumerate(["f32"] + FORMATS):
    m = 2 if fmt == "f32" else 5
    case(f"--weights {fmt}: K-major matvec [{m}, 192] x [192, 41] (matvec_k)")(
        quant_case(fmt, m, 192, 41, seed=50 + i, kernels={"matvec_k"}))
    case(f"--weights {fmt}: K-major gemm, transposed weight [2, 96] x [30, 96]^T (matvec_k)")(
        quant_case(fmt, 2, 96, 30, gemm=True, seed=60 + i, kernels={"matvec_k"}))
for fmt, most in (("f32", 2), ("int4", 8)):
    case(f"--weights {fmt}: K-major matvec, 1 row [1, 1024] x [1024, 600] (matvec_k)")(
        quant_case(fmt, 1, 1024, 600, seed=70, kernels={"matvec_k"}))
    case(f"--weights {fmt}: K-major matvec, {most} rows [{most}, 256] x [256, 70] (matvec_k)")(
        quant_case(fmt, most, 256, 70, seed=71, kernels={"matvec_k"}))
    case(f"--weights {fmt}: {most + 1} rows keep the weight row-major (matvec)")(
        quant_case(fmt, most + 1, 256, 70, seed=72, kernels={"matvec"}))
    case(f"--weights {fmt}: K-major matvec on the shared-memory reduction "
         "(KILN_SUBGROUP=0)")(
        quant_case(fmt, 2, 512, 100, seed=73, kernels={"matvec_k"},
                   env={"KILN_SUBGROUP": "0"}))
case("--weights f32: gemm, transposed weight, 16 rows [16, 256] x [70, 256]^T (matvec_k)")(
    quant_case("f32", 16, 256, 70, gemm=True, seed=74, kernels={"matvec_k"}))
# matvec_k's unrolled loop (KILN_MATVEC_K=WG,CN,UNROLL, a tuning hook): 3
# chunks loaded before any is used, a last pass with some past K.
for _fmt, _k in (("int4", 640), ("f16", 328)):
    case(f"--weights {_fmt}: K-major matvec unrolled by 3 (KILN_MATVEC_K=32,2,3) "
         f"[2, {_k}] x [{_k}, 37] (matvec_k)")(
        quant_case(_fmt, 2, _k, 37, seed=76, kernels={"matvec_k"},
                   compile_env={"KILN_MATVEC_K": "32,2,3"}))
# Fixed-shape int4 products whose A fits in shared memory run matvec_k in
# teams (TEAMS: each team its own columns) with A staged in shared memory
# (A_SHARED): 8 teams, 4 and 2 by the columns, ragged last workgroups, 3
# rows, the shared-memory reduction; and through the tuning hook
# (KILN_MATVEC_K=WG,CN,UNROLL,TEAMS,A_SHARED) the other formats' paths:
# teams without A shared, unrolled with the first loads issued before A's
# copy, and teams smaller than lavapipe's subgroups (partial sums summed
# without subgroup arithmetic).
for _fmt, _m, _k, _n, _env, _cenv in (
        ("int4", 1, 512, 8200, None, None),
        ("int4-asym", 1, 1024, 4100, None, None),
        ("int4", 3, 256, 2100, None, None),
        ("int4", 1, 512, 8200, {"KILN_SUBGROUP": "0"}, None),
        ("f16", 2, 328, 300, None, {"KILN_MATVEC_K": "128,4,1,4,1"}),
        ("int8", 1, 640, 301, None, {"KILN_MATVEC_K": "64,2,2,4,1"}),
        ("fp8-e4m3", 2, 256, 150, None, {"KILN_MATVEC_K": "32,4,1,8,1"}),
        ("f32", 2, 256, 150, None, {"KILN_MATVEC_K": "128,4,1,4,0"}),
        ("f32", 1, 264, 150, None, {"KILN_MATVEC_K": "128,2,1,2,1"})):
    _how = ", ".join(f"{k}={v}" for k, v in {**(_env or {}), **(_cenv or {})}.items())
    case(f"--weights {_fmt}: K-major matvec in teams [{_m}, {_k}] x [{_k}, {_n}]"
         f"{' (' + _how + ')' if _how else ''} (matvec_k)")(
        quant_case(_fmt, _m, _k, _n, seed=77, kernels={"matvec_k"}, env=_env,
                   compile_env=_cenv))
case("--weights f32: a product of 17 rows keeps its weight row-major (tiled)")(
    quant_case("f32", 17, 64, 40, seed=75, kernels={"matmul"}))


def dynamic_case(fmt, precision_f16=False):
    """Rows that follow a dim ([1, seq, K], a decoder's product): the weight
    is stored K-major; runs of up to 4 rows take matvec_k.comp, longer ones
    the tiled kernel reading the K-major weight (its scales K-major too).
    precision_f16: --precision f16 without --weights, which stores such a
    weight as f16 K-major (f16 activations: the bound widens; longer runs
    on coopmat.comp where the device has cooperative matrices)."""
    def test(workdir):
        import test_dynamic
        r = np.random.default_rng(80)
        K, N = 96, 40
        w = (r.standard_normal([K, N]) * 0.5).astype(np.float32)
        w[:, 0] *= 40
        wq, _ = dequantized(w, "f16" if precision_f16 else fmt)
        y = test_dynamic.dyn_yaml(
            {"seq": "1..40"}, {"x": {"dtype": "f32", "shape": [1, "seq", K]}},
            [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}], ["y"],
            {"w": {"dtype": "f32", "shape": [K, N], "file": "w.bin"}})
        flags = ("--precision", "f16") if precision_f16 else ("--weights", fmt)
        prog = build_model(workdir, y, {"w.bin": w.tobytes()}, flags=flags)
        kernels = {"matvec_k", "matmul"}
        # f16: coopmat.comp too (the tiled kernel its variant on devices
        # without cooperative matrices: lavapipe runs that)
        check_kernels(workdir, kernels | {"eltwise", "coopmat"} if precision_f16 else kernels)
        tol = 2e-3 if precision_f16 else 1e-5

        def ref(x, seq):
            xs = x.astype(np.float16).astype(np.float64) if precision_f16 else x
            return [xs.astype(np.float64) @ wq]

        def compare(got, want, what):
            assert_close(got, want, tol, tol * K ** 0.5 * np.abs(w).max(), what)
        test_dynamic.run_built(
            prog, [{"seq": s} for s in (1, 7, 4, 40, 1)],
            lambda rng, seq: [rng.standard_normal([1, seq, K]).astype(np.float32)], ref,
            compare=compare)
    return test


for fmt in ["int8", "int4-asym", "fp8-e4m3"]:
    case(f"--weights {fmt}: rows that follow a dim, weight K-major (matvec_k, and the "
         "tiled kernel reading it K-major)")(dynamic_case(fmt))
case("--precision f16: rows that follow a dim, the weight f16 K-major (matvec_k, coopmat or "
     "tiled)")(
    dynamic_case("f16", precision_f16=True))


def check_magnitudes(got, want, mag, what):
    """Every output within 2e-3 of mag, its products' sum of magnitudes
    (the f16 pairs' bound: F16_PAIRS, A_H2)."""
    err, bound = np.abs(got - want), 2e-3 * mag + 1e-30
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    check((err <= bound).all(), f"{what}: error {err[worst]:.3g} at {list(worst)} (got "
          f"{got[worst]:.6g}, expected {want[worst]:.6g}) past 2e-3 of the sum of its "
          f"products' magnitudes, {bound[worst]:.3g}")


def halves_case(fmt, tune=None):
    """--precision f16 with 8-, 4-bit or fp8 weights, a decoder's product
    ([1, seq, K], runs of 1 to 4 rows on matvec_k.comp): on devices with
    f16 and subgroup arithmetic the codes multiply A's halves in f16 pairs
    (F16_PAIRS: a chunk whose A leaves [1/64, 1024] in f32; fp8, A_H2: A
    staged in shared memory as pairs, each chunk scaled by a power of two,
    a chunk with an infinite element in f32); every run against x (as
    halves) @ the dequantized weight within 2e-3 of the sum of each
    output's products' magnitudes: activations of order 1, some chunks past
    1024 (up to 3e4), all near 1e-6 (a column of large weights makes their
    outputs normal halves), and mixed (fp8: and one infinite element in a
    row, whose outputs must be the same infinities and NaNs as numpy's);
    then KILN_SUBGROUP=0 (the f32 build). tune: KILN_MATVEC_K for the
    compiler (16 teams of 16 invocations, which a product this small would
    not get: their sums meet in shared memory where a subgroup is wider)."""
    fp8 = fmt.startswith("fp8")

    def test(workdir):
        import test_dynamic
        workdir = Path(workdir)
        r = np.random.default_rng(90)
        K, N = 256, 70
        w = (r.standard_normal([K, N]) * 0.05).astype(np.float32)
        w[:, 3] *= 20
        w[:, 5] *= 1e4  # outputs of normal size from A of 1e-6 (the "tiny" run)
        wq, _ = dequantized(w, fmt)
        y = test_dynamic.dyn_yaml(
            {"seq": "1..4"}, {"x": {"dtype": "f32", "shape": [1, "seq", K]}},
            [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}], ["y"],
            {"w": {"dtype": "f32", "shape": [K, N], "file": "w.bin"}})
        prog = build_model(workdir, y, {"w.bin": w.tobytes()},
                           flags=("--precision", "f16", "--weights", fmt),
                           env={"KILN_MATVEC_K": tune} if tune else None)
        check_kernels(workdir, {"matvec_k", "eltwise"})
        src = (workdir / "model.c").read_text()
        check(not tune or "TEAMS 16" in src, "matvec_k not in 16 teams")
        marker = "A_H2 1" if fp8 else "F16_PAIRS 1"
        check(marker in src and "and f16 arithmetic (shaderFloat16)" in src,
              f"matvec_k without {marker}, or its build not marked as needing f16 arithmetic")
        kinds = ["normal", "large", "tiny", "mixed", "normal"] + (["inf"] if fp8 else [])
        seqs = [1, 4, 3, 2, 1] + ([3] if fp8 else [])

        def inputs(rng, seq):
            kind = next(run_kinds)
            x = rng.standard_normal([1, seq, K])
            if kind == "large":  # every chunk's A past 1024
                x[..., ::7] *= 3e4
            elif kind == "tiny":  # products of such halves would lose their bits
                x *= 1e-6
            elif kind == "mixed":  # the first 64 k past 1024, the rest small
                x[..., :64] *= 2e3
                x[..., 64:] *= 1e-2
            x = np.clip(x, -6e4, 6e4)
            if kind == "inf":  # row 1's chunk of k 32 to 47 not finite, with a large
                x[0, 1, 37] = np.inf  # a whose products would overflow halves
                x[0, 1, 40] = -6e4
            return [x.astype(np.float32)]

        def reference(x, seq):
            xh = x.astype(np.float16).astype(np.float64)
            with np.errstate(invalid="ignore"):
                mags.append(np.abs(xh) @ np.abs(wq))  # each output's sum of |products|
                return [xh @ wq]

        def compare(got, want, what):  # within 2e-3 of each output's magnitudes
            odd = ~np.isfinite(want)  # an infinite A's row: numpy's infinities and NaNs
            check((np.isnan(got) == np.isnan(want)).all() and
                  (got[odd & ~np.isnan(want)] == want[odd & ~np.isnan(want)]).all(),
                  f"{what}: not the reference's infinities and NaNs")
            check_magnitudes(got[~odd], want[~odd], mags.pop(0)[~odd], what)
        for env in ({}, {"KILN_SUBGROUP": "0"}):
            run_kinds = iter(kinds)
            mags = []
            test_dynamic.run_built(prog, [{"seq": s} for s in seqs], inputs, reference,
                                   compare=compare, env=env)
    return test


for _fmt in ("int4", "int4-asym", "int8", "int8-asym"):
    case(f"--precision f16 --weights {_fmt}: a decoder's product with the codes times A in f16 "
         "pairs, chunks of A out of their range in f32 (matvec_k, F16_PAIRS)")(halves_case(_fmt))
for _fmt in ("fp8-e4m3", "fp8-e5m2"):
    case(f"--precision f16 --weights {_fmt}: a decoder's product with A staged as f16 pairs "
         "that the codes multiply, a chunk with an infinite A in f32 (matvec_k, A_H2)")(
        halves_case(_fmt))
case("--precision f16 --weights fp8-e4m3: A_H2 in 16 teams of 16 invocations (matvec_k)")(
    halves_case("fp8-e4m3", tune="256,4,1,16"))


def h2_rows_case(fmt):
    """--precision f16 --weights FMT (fp8), fixed [3, 2048] x [2048, 40] in
    16 teams of 16 (KILN_MATVEC_K): each invocation stages two chunks of A
    and multiplies eight of each column, where the other A_H2 cases have
    one. Each chunk of 16 k of x at its own scale (1e-4 to 1e3: the power
    of two staging picks differs chunk to chunk); against x (as halves) @
    the dequantized weight within 2e-3 of each output's products'
    magnitudes, in both builds."""
    def test(workdir):
        workdir = Path(workdir)
        r = np.random.default_rng(91)
        M, K, N = 3, 2048, 40
        w = (r.standard_normal([K, N]) * 0.05).astype(np.float32)
        wq, _ = dequantized(w, fmt)
        x = r.standard_normal([M, K]) * np.repeat(10.0 ** r.uniform(-4, 3, [M, K // 16]), 16, 1)
        x = x.astype(np.float32)
        y = model_yaml("q", {"x": {"dtype": "f32", "shape": [M, K]}},
                       [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}], ["y"],
                       weights={"w": {"dtype": "f32", "shape": [K, N], "file": "w.bin"}})
        prog = build_model(workdir, y, {"w.bin": w.tobytes()},
                           flags=("--precision", "f16", "--weights", fmt),
                           env={"KILN_MATVEC_K": "256,4,1,16"})
        src = (workdir / "model.c").read_text()
        check("A_H2 1" in src and "TEAMS 16" in src, "matvec_k without A_H2 in 16 teams")
        xh = x.astype(np.float16).astype(np.float64)
        want, mag = xh @ wq, np.abs(xh) @ np.abs(wq)
        for env in ({}, {"KILN_SUBGROUP": "0"}):
            with program_env(**env):
                got, = run_program(prog, [x], [np.zeros([M, N], np.float32)])
            check_magnitudes(got, want, mag, str(env or "default build"))
    return test


for _fmt in ("fp8-e4m3", "fp8-e5m2"):
    case(f"--precision f16 --weights {_fmt}: [3, 2048] x [2048, 40], A_H2 in 16 teams, "
         "chunks of A at scales 1e-4 to 1e3 (matvec_k)")(h2_rows_case(_fmt))


def a_int8(x):
    """A's rows as --activations int8 makes them (docs/cli.md): each run of
    32 k scaled by its largest |a| / 127 (f32), rounded half to even; the
    values the integer products stand for, as float64."""
    xb = x.astype(np.float32).reshape(x.shape[:-1] + (x.shape[-1] // 32, 32))
    most = np.abs(xb).max(-1)
    inv = np.divide(np.float32(127), most, out=np.zeros_like(most), where=most > 0)
    q = np.clip(np.rint(xb * inv[..., None]), -127, 127)
    scale = most / np.float32(127)
    return (q.astype(np.float64) * scale[..., None].astype(np.float64)).reshape(x.shape)


def act_int8_case(fmt, M, K, N, seq=None, precision_f16=False, env=None):
    """--weights FMT --activations int8: the products that run on
    matvec_k.comp quantize A (a_int8) and multiply codes in integers. Fixed
    [M, K] rows, or (seq) a decoder's [1, seq, K] over runs of 1 to 4 rows
    (A_Q8) and longer ones (the tiled kernel, A as it is). Each output
    against a_int8(x) @ dequantized(W) within 1e-5 of its products'
    magnitudes, and against x @ W within the documented bound (W's and A's
    errors). The KILN_SUBGROUP build (lavapipe: OpSDot) and, with
    env KILN_SUBGROUP=0, the one that multiplies a byte at a time."""
    def test(workdir):
        import test_dynamic
        workdir = Path(workdir)
        r = np.random.default_rng(95)
        w = (r.standard_normal([K, N]) * 0.5).astype(np.float32)
        w[:, 0] *= 40
        wq, bound = dequantized(w, fmt)
        w64 = w.astype(np.float64)
        shape = [1, "seq", K] if seq else [M, K]
        ins = {"x": {"dtype": "f32", "shape": shape}}
        nodes = [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}]
        weights = {"w": {"dtype": "f32", "shape": [K, N], "file": "w.bin"}}
        y = (test_dynamic.dyn_yaml({"seq": f"1..{max(seq)}"}, ins, nodes, ["y"], weights)
             if seq else model_yaml("q", ins, nodes, ["y"], weights=weights))
        flags = ("--weights", fmt, "--activations", "int8")
        if precision_f16:
            flags += ("--precision", "f16")
        prog = build_model(workdir, y, {"w.bin": w.tobytes()}, flags=flags)
        src = (workdir / "model.c").read_text()
        check("A_Q8 1" in src and "8-bit integer dot products" in src,
              "matvec_k without A_Q8, or its build not marked as needing integer dot products")

        def reference(x, seq):
            rows = seq
            xs = x.astype(np.float16) if precision_f16 else x
            xs = xs.astype(np.float32)
            q8 = rows <= 4
            xa = a_int8(xs) if q8 else xs.astype(np.float64)
            # the tiled kernel at --precision f16: f16 products (dynamic_case)
            mags.append(np.abs(xa) @ np.abs(wq) * (1 if q8 or not precision_f16 else 200))
            # the documented bound: W's error, and A's (half its run's scale)
            most = np.abs(xs.reshape(xs.shape[:-1] + (K // 32, 32))).max(-1) / 127
            da = np.repeat(most, 32, axis=-1) / 2 if q8 else 0 * xs
            true = xs.astype(np.float64) @ w64
            bounds.append(np.abs(xs) @ bound + da @ (np.abs(w64) + bound) +
                          2e-3 * np.abs(xs) @ np.abs(w64) * precision_f16 + 1e-6 * mags[-1])
            trues.append(true)
            return [xa @ wq]

        def compare(got, want, what):
            err, tol = np.abs(got - want), 1e-5 * mags.pop(0) + 1e-30
            if precision_f16:  # the product stored as a half
                tol += np.abs(want) * 2.0 ** -11
            worst = np.unravel_index(np.argmax(err / tol), err.shape)
            check((err <= tol).all(), f"{what}: error {err[worst]:.3g} at {list(worst)} "
                  f"against a_int8(x) @ dequantized(W) past {tol[worst]:.3g}")
            err, lim = np.abs(got - trues.pop(0)), bounds.pop(0)
            worst = np.unravel_index(np.argmax(err - lim), err.shape)
            check((err <= lim).all(), f"{what}: error {err[worst]:.3g} at {list(worst)} "
                  f"against x @ W past the documented {lim[worst]:.3g}")

        for e in ({}, {"KILN_SUBGROUP": "0"}):
            mags, bounds, trues = [], [], []
            if seq:
                test_dynamic.run_built(
                    prog, [{"seq": s} for s in seq],
                    lambda rng, seq: [rng.standard_normal([1, seq, K]).astype(np.float32)],
                    reference, compare=compare, env={**e, **(env or {})})
            else:
                x = (r.standard_normal([M, K]) * 3).astype(np.float32)
                x[0, :32] *= 1e-3  # a run of small values: its own scale
                x[-1, 32:64] = 0.0  # a run of zeros: scale 0
                want = reference(x, M)
                with program_env(**e, **(env or {})):
                    got = run_program(prog, [x], [np.zeros([M, N], np.float32)])
                compare(got[0], want[0], f"run ({e or 'subgroup build'})")
    return test


for _fmt in ("int8", "int8-asym", "int4", "int4-asym"):
    case(f"--weights {_fmt} --activations int8: [1, 1024] x [1024, 600], A as 8-bit "
         "integers (matvec_k, A_Q8)")(act_int8_case(_fmt, 1, 1024, 600))
    case(f"--weights {_fmt} --activations int8: [3, 256] x [256, 70] (matvec_k, A_Q8)")(
        act_int8_case(_fmt, 3, 256, 70))
for _fmt in ("int8", "int4"):
    case(f"--precision f16 --weights {_fmt} --activations int8: a decoder's product, runs of "
         "1 to 4 rows with A as 8-bit integers, longer ones as they are (matvec_k, A_Q8)")(
        act_int8_case(_fmt, None, 256, 70, seq=[1, 4, 9, 2, 1], precision_f16=True))


@case("--activations int8: kiln compile says when it changes no product (a [70, 96] x "
      "[96, 130] product: no matrix-vector kernel), and with -v how many dispatches it "
      "changes ([1, 256] x [256, 70])")
def test_act_int8_note(workdir):
    workdir = Path(workdir)
    w = np.random.default_rng(3).standard_normal([256, 130]).astype(np.float32)
    for rows, k, applies in ((70, 96, False), (1, 256, True)):
        ws = w[:k].copy()
        (workdir / f"w{k}.bin").write_bytes(ws.tobytes())
        y = model_yaml("q", {"x": {"dtype": "f32", "shape": [rows, k]}},
                       [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}], ["y"],
                       weights={"w": {"dtype": "f32", "shape": [k, 130], "file": f"w{k}.bin"}})
        (workdir / "m.yaml").write_text(y)
        r = kiln("compile", workdir / "m.yaml", "-o", workdir / "m.c", "--weights", "int4",
                 "--activations", "int8", "-v")
        check(r.returncode == 0, r.stderr)
        note = "--activations int8 changed no product" in r.stdout
        count = re.search(r"(\d+) matrix-vector dispatches multiply A as 8-bit integers",
                          r.stderr)
        check(note == (not applies) and bool(count) == applies and
              (not count or int(count[1]) == 1),
              f"rows {rows}: stdout {r.stdout!r}, stderr {r.stderr[-400:]!r}")
