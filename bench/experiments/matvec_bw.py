#!/usr/bin/env python3
"""matvec_bw.py: one row times a weight matrix ([1, K] x [K, N], fixed shape),
each weight format, each matvec_k.comp setting (KILN_MATVEC_K=WG,CN,UNROLL,
TEAMS,A_SHARED): GPU microseconds (run_model -p, 200 runs) and the weight
bytes a second as a share of kiln's copy kernel (256 MiB, same run). Each
model holds R products of R inputs with R weights (--repeat R, no
dependence between them), so that the first dispatch's time can be told
from the later ones'. Runs where kiln and a Vulkan GPU are (KILN_BUILD,
KILN_VULKAN_LIB as bench/llm.py).

  bench/experiments/matvec_bw.py [--work DIR] [--formats f16,int8]
      [--shapes 4096x16384] [--repeat R] [--configs 'FMT:WG,CN,U,T,S;...']
      [--copy-sizes 22,24]

A format FMT@VAR=VALUE compiles FMT with that environment variable set (a
compiler knob such as KILN_F16_PAIRS=0, for an A/B in one run).
--copy-sizes times the copy kernel also at 2^S f32 elements each (16 MiB
at 22), for the fixed cost a dispatch pays at the products' sizes.
"""
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from matvec_k_dyn import BUILD, ROOT, VULKAN_LIB, sh  # noqa: E402

FORMATS = {"f32": ([], 4.0), "f16": (["--weights", "f16"], 2.0),
           "int8": (["--weights", "int8"], 1.125), "int4": (["--weights", "int4"], 0.625),
           "fp8-e4m3": (["--weights", "fp8-e4m3"], 1.125),
           "f16-int8": (["--precision", "f16", "--weights", "int8"], 1.125),
           "f16-int4": (["--precision", "f16", "--weights", "int4"], 0.625)}
FORMATS["fp8-e5m2"] = (["--weights", "fp8-e5m2"], 1.125)
# f16-FMT: f16 A (--precision f16), as a decoder runs
for _f in ("f16", "fp8-e4m3", "fp8-e5m2"):
    FORMATS["f16-" + _f] = (["--precision", "f16"] + FORMATS[_f][0], FORMATS[_f][1])
# --activations int8 (A as 8-bit integers, integer dot products) for each
# 8- and 4-bit format: FMT-a8
for _f in ("int8", "int8-asym", "int4", "int4-asym", "f16-int8", "f16-int4",
           "f16-int8-asym", "f16-int4-asym"):
    if _f not in FORMATS:
        _w = _f[4:] if _f.startswith("f16-") else _f
        FORMATS[_f] = ((["--precision", "f16"] if _w != _f else []) + ["--weights", _w],
                       1.125 + ("asym" in _f) / 32 if "int8" in _f else
                       0.625 + ("asym" in _f) / 32)
    FORMATS[_f + "-a8"] = (FORMATS[_f][0] + ["--activations", "int8"], FORMATS[_f][1])


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def build(d, model, flags, env):
    d.mkdir(parents=True, exist_ok=True)
    (d / "mv.yaml").write_text(json.dumps(model))
    sh([BUILD / "kiln", "compile", d / "mv.yaml", "--name", "mv", "-o", d / "mv.c", *flags],
       env=env)
    sh(["cc", "-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime",
        "-DKILN_MODEL=mv", "-include", d / "mv.h", "-o", d / "mv", ROOT / "samples" /
        "run_model.c", d / "mv.c", "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])


def times(d, names):
    out = sh([d / "mv", "-n", "200", "-p"], cwd=d)
    got = {m.group(1): float(m.group(2)) for m in
           re.finditer(r"^\s+\d+\s+(\S+)\s+([\d.]+)", out, re.M)}
    return [got[n] for n in names]


def main():
    work = Path(arg("--work", "/tmp/matvec-bw"))
    work.mkdir(parents=True, exist_ok=True)
    fmts = arg("--formats", "f32,f16,int8,int4,fp8-e4m3").split(",")
    shapes = [tuple(int(v) for v in s.split("x")) for s in arg("--shapes", "4096x16384").split(",")]
    reps = int(arg("--repeat", "2"))
    configs = {f: [None] for f in fmts}
    for spec in arg("--configs", "").split(";"):
        if spec:
            f, c = spec.split(":")
            configs.setdefault(f, [None]).append(c)
    n = 1 << 26
    copy = {"name": "copy", "inputs": {"x": {"dtype": "f32", "shape": [n]}},
            "nodes": [{"name": "y", "op": "cast", "inputs": ["x"], "to": "f32"}],
            "outputs": ["y"]}
    points = [(work / "copy", copy, [], {})]
    copy_sizes = [int(v) for v in arg("--copy-sizes", "").split(",") if v]
    for lg in copy_sizes:
        small = json.loads(json.dumps(copy))
        small["inputs"]["x"]["shape"] = [1 << lg]
        points.append((work / f"copy{lg}", small, [], {}))
    meta = []
    for K, N in shapes:
        for f in fmts:
            for c in configs.get(f, [None]):
                model = {"name": "mv", "inputs": {f"x{i}": {"dtype": "f32", "shape": [1, K]}
                                              for i in range(reps)},
                         "weights": {f"w{i}": {"dtype": "f32", "shape": [K, N],
                                               "init": {"normal": 0.02, "seed": i + 1}}
                                     for i in range(reps)},
                         "nodes": [{"name": f"y{i}", "op": "matmul", "inputs": [f"x{i}", f"w{i}"]}
                                   for i in range(reps)],
                         "outputs": [f"y{i}" for i in range(reps)]}
                d = work / f"{K}x{N}-{f}-{c or 'd'}".replace(",", "_").replace("@", "_")
                base, *knobs = f.split("@")
                env = dict(kv.split("=", 1) for kv in knobs)
                if c:
                    env["KILN_MATVEC_K"] = c
                points.append((d, model, FORMATS[base][0], env))
                meta.append((K, N, f, c, d))
    with ThreadPoolExecutor(max(1, (os.cpu_count() or 2) - 2)) as ex:
        errs = list(ex.map(_safe_build, points))
    if errs[0]:
        sys.exit(errs[0])
    errs = errs[:1] + errs[1 + len(copy_sizes):]
    copy_us = times(work / "copy", ["y"])[0]
    copy_gbs = 2 * n * 4 / copy_us / 1e3
    print(f"copy: {copy_us:.1f} us, {copy_gbs:.0f} GB/s", flush=True)
    for lg in copy_sizes:
        us = times(work / f"copy{lg}", ["y"])[0]
        print(f"copy 2^{lg} f32: {us:.1f} us, {2 * (1 << lg) * 4 / us / 1e3:.0f} GB/s",
              flush=True)
    rows = []
    for (K, N, f, c, d), err in zip(meta, errs[1:]):
        if err:
            print(f"{K}x{N} {f} {c or 'default'}: {err[-400:]}", flush=True)
            continue
        us = times(d, [f"y{i}" for i in range(reps)])
        gb = K * N * FORMATS[f.split("@")[0]][1]
        shares = [100 * gb / u / 1e3 / copy_gbs for u in us]
        print(f"{K}x{N} {f:9s} {c or 'default':14s} " +
              " ".join(f"{u:7.1f} us {s:4.0f}%" for u, s in zip(us, shares)), flush=True)
        rows.append({"shape": [K, N], "fmt": f, "cfg": c, "us": us, "share": shares})
    (work / "matvec_bw.json").write_text(json.dumps({"copy_gbs": copy_gbs, "rows": rows},
                                                    indent=1))


def _safe_build(p):
    try:
        build(*p)
        return None
    except Exception as e:  # noqa: BLE001
        return str(e)


if __name__ == "__main__":
    main()
