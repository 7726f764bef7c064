#!/usr/bin/env python3
"""matvec_k_dyn.py: matvec_k.comp's invocations and columns a workgroup,
and the chunks each loads before it multiplies (KILN_MATVEC_K=WG,CN,UNROLL)
on a decoder's products, one row of a dynamic [1, seq, K] (seq 1..128: M 4
in the kernel, MROWS 1), each weight format. Prints the GPU microseconds of
the product (run_model -p, 200 runs) and the weight GB/s. Runs where kiln
and a Vulkan GPU are; KILN_BUILD, KILN_VULKAN_LIB as bench/llm.py. Each
point compiles and links a model (about 7 s on the GPU machine): --quick
takes the first two shapes and f16 and int4 only.

  bench/experiments/matvec_k_dyn.py [--work DIR] [--quick] [--formats f16,int4]
                                    [--configs WG,CN,U[,TEAMS,A_SHARED];...]
                                    [--shapes KxN,...] [--fixed]

Environment passed to kiln compile as it is (KILN_MATVEC_K_M=1: the
matrix-vector kernel sized for one row, M 1, the tiled one from 2 rows).
--fixed: x is [1, K] (no dims; matvec_k's M 1, its fixed-shape rules).
The formats f16-int8 and f16-int4 are --precision f16 with those weights
(A in f16, as bench/llm.py's decoder). The points are built in parallel
(compile and link), then run one after the other.
"""
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KILN_BUILD", ROOT / "build"))
VULKAN_LIB = os.environ.get("KILN_VULKAN_LIB", "-lvulkan")
SHAPES = [(2048, 2560), (2048, 11264), (5632, 2048), (2048, 32000)]
FORMATS = {"f16": (["--precision", "f16"], 2.0), "int8": (["--weights", "int8"], 1.125),
           "int4": (["--weights", "int4"], 0.625),
           "f16-int8": (["--precision", "f16", "--weights", "int8"], 1.125),
           "f16-int4": (["--precision", "f16", "--weights", "int4"], 0.625)}
CONFIGS = [None, (64, 4, 1), (64, 4, 2), (64, 4, 4), (128, 4, 2), (32, 8, 4), (64, 8, 2),
           (128, 2, 4)]


def sh(cmd, env=None, cwd=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, cwd=cwd)
    if r.returncode:
        raise RuntimeError(r.stdout[-1500:] + r.stderr[-1500:])
    return r.stdout


def main():
    work = Path(sys.argv[sys.argv.index("--work") + 1]) if "--work" in sys.argv else \
        Path("/tmp/matvec-k")
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    quick = "--quick" in sys.argv
    fmts = sys.argv[sys.argv.index("--formats") + 1].split(",") if "--formats" in sys.argv \
        else list(FORMATS)
    configs = CONFIGS
    if "--configs" in sys.argv:
        configs = [None] + [tuple(int(v) for v in c.split(","))
                            for c in sys.argv[sys.argv.index("--configs") + 1].split(";")]
    shapes = SHAPES[:2] if quick else SHAPES
    if "--shapes" in sys.argv:
        shapes = [tuple(int(v) for v in kn.split("x"))
                  for kn in sys.argv[sys.argv.index("--shapes") + 1].split(",")]
    fixed = "--fixed" in sys.argv
    points = []  # (K, N, fmt, cfg, dir)
    for K, N in shapes:
        for fmt in FORMATS:
            if (quick and fmt == "int8") or fmt not in fmts:
                continue
            for cfg in configs:
                d = work / f"{K}x{N}-{fmt}-{'d' if cfg is None else '_'.join(map(str, cfg))}"
                points.append((K, N, fmt, cfg, d))

    def build(pt):
        K, N, fmt, cfg, d = pt
        d.mkdir(parents=True, exist_ok=True)
        x = [1, K] if fixed else [1, "seq", K]
        model = {"name": "mv", "inputs": {"x": {"dtype": "f32", "shape": x}},
                 "weights": {"w": {"dtype": "f32", "shape": [K, N],
                                   "init": {"normal": 0.02, "seed": 1}}},
                 "nodes": [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}],
                 "outputs": ["y"]}
        if not fixed:
            model["dims"] = {"seq": "1..128"}
        y = d / "mv.yaml"
        y.write_text(json.dumps(model))
        env = {"KILN_MATVEC_K": ",".join(map(str, cfg))} if cfg else {}
        try:
            sh([BUILD / "kiln", "compile", y, "--name", "mv", "-o", d / "mv.c",
                *FORMATS[fmt][0]], env=env)
            sh(["cc", "-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I",
                ROOT / "runtime", "-DKILN_MODEL=mv", "-include", d / "mv.h", "-o",
                d / "mv", ROOT / "samples" / "run_model.c", d / "mv.c", "-L",
                BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
            return None
        except Exception as e:  # noqa: BLE001
            return str(e)

    with ThreadPoolExecutor(max(1, (os.cpu_count() or 2) - 2)) as ex:
        errors = list(ex.map(build, points))
    line, last = [], None
    for (K, N, fmt, cfg, d), err in zip(points, errors):
        if (K, N, fmt) != last:
            if line:
                print(" ".join(line), flush=True)
            line, last = [f"{K}x{N}", fmt], (K, N, fmt)
        if err:
            line.append("err")
            print(err, file=sys.stderr)
            continue
        try:
            out = sh([d / "mv", *([] if fixed else ["-d", "seq=1"]), "-n", "200", "-p"], cwd=d)
            us = max(float(m.group(1)) for m in
                     re.finditer(r"^\s+\d+\s+y\s+([\d.]+)", out, re.M))
            line.append(f"{us:.1f}")
            rows.append({"shape": [K, N], "fmt": fmt, "cfg": cfg, "us": us,
                         "gbs": K * N * FORMATS[fmt][1] / us / 1e3})
        except Exception as e:  # noqa: BLE001
            line.append("err")
            print(e, file=sys.stderr)
    if line:
        print(" ".join(line), flush=True)
    print("configs:", ["default" if c is None else ",".join(map(str, c)) for c in configs])
    (work / "matvec_k_dyn.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
