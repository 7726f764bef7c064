#!/usr/bin/env python3
"""prologue_dyn.py: a decode step's product computing its own input (the
`prologue` fusion, docs/cli.md) against the input's own dispatch, on the
1.1B Llama's shapes (bench/llm.py): the residual add and rms_norm before
the QKV product (2048 -> 2560), before the gate and up product (2048 ->
11264) and before the vocabulary's (2048 -> 32000, no residual), and the
gated MLP's silu(g) * u before the down product (5632 -> 2048). Each model
has rows [1, seq, K] (seq 1..128, the prompt's tiled variant beside the
matrix-vector one) and runs one row; built with and without
--no-fuse=prologue, in f16 and with int4 weights. Prints the wall time of a
run (run_model, 500 runs: what a decoding step pays) and the GPU
microseconds of the product and of the whole run (-p, 200 runs; the
profile records idle dispatches too, at about 1 us each). Runs where kiln
and a Vulkan GPU are; KILN_BUILD, KILN_VULKAN_LIB as bench/llm.py.

  bench/experiments/prologue_dyn.py [--work DIR] [--formats f16,int4]
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KILN_BUILD", ROOT / "build"))
VULKAN_LIB = os.environ.get("KILN_VULKAN_LIB", "-lvulkan")
FORMATS = {"f16": ["--precision", "f16"], "int8": ["--precision", "f16", "--weights", "int8"],
           "int4": ["--precision", "f16", "--weights", "int4"]}


def weight(shape, seed, std=0.02):
    return {"dtype": "f32", "shape": shape, "init": {"normal": std, "seed": seed}}


def norm_model(K, N, residual):
    ins = {"x": {"dtype": "f32", "shape": [1, "seq", K]}}
    nodes = [{"name": "n", "op": "rms_norm", "inputs": ["s" if residual else "x", "g"]},
             {"name": "y", "op": "matmul", "inputs": ["n", "w"]}]
    outs = ["y"]
    if residual:
        ins["r"] = {"dtype": "f32", "shape": [1, "seq", K]}
        nodes.insert(0, {"name": "s", "op": "add", "inputs": ["x", "r"]})
        outs.append("s")
    return {"name": "pro", "dims": {"seq": "1..128"}, "inputs": ins, "nodes": nodes,
            "outputs": outs, "weights": {"g": weight([K], 2, 1.0), "w": weight([K, N], 1)}}


def glu_model(F, N):
    return {"name": "pro", "dims": {"seq": "1..128"},
            "inputs": {"g": {"dtype": "f32", "shape": [1, "seq", F]},
                       "u": {"dtype": "f32", "shape": [1, "seq", F]}},
            "nodes": [{"name": "sg", "op": "sigmoid", "inputs": ["g"]},
                      {"name": "si", "op": "mul", "inputs": ["g", "sg"]},
                      {"name": "m", "op": "mul", "inputs": ["si", "u"]},
                      {"name": "y", "op": "matmul", "inputs": ["m", "w"]}],
            "outputs": ["y"], "weights": {"w": weight([F, N], 1)}}


CASES = [("norm+res 2048x2560", norm_model(2048, 2560, True)),
         ("norm+res 2048x11264", norm_model(2048, 11264, True)),
         ("silu*u 5632x2048", glu_model(5632, 2048)),
         ("norm 2048x32000", norm_model(2048, 32000, False))]


def sh(cmd, env=None, cwd=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, cwd=cwd)
    if r.returncode:
        raise RuntimeError(r.stdout[-1500:] + r.stderr[-1500:])
    return r.stdout


def measure(work, model, flags):
    y = work / "pro.yaml"
    y.write_text(json.dumps(model))
    sh([BUILD / "kiln", "compile", y, "--name", "pro", "-o", work / "pro.c", *flags])
    sh(["cc", "-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime",
        "-DKILN_MODEL=pro", "-include", work / "pro.h", "-o", work / "pro",
        ROOT / "samples" / "run_model.c", work / "pro.c", "-L", BUILD, "-lkilnrt",
        VULKAN_LIB, "-lm"])
    wall = sh([work / "pro", "-d", "seq=1", "-n", "500"], cwd=work)
    wall_us = float(re.search(r"([\d.]+) us per run", wall).group(1))
    prof = sh([work / "pro", "-d", "seq=1", "-n", "200", "-p"], cwd=work)
    total = float(re.search(r"GPU time ([\d.]+) us", prof).group(1))
    prod = max(float(m.group(1)) for m in re.finditer(r"^\s+\d+\s+y\s+([\d.]+)", prof, re.M))
    return wall_us, prod, total


def main():
    work = Path(sys.argv[sys.argv.index("--work") + 1]) if "--work" in sys.argv else \
        Path("/tmp/prologue")
    fmts = (sys.argv[sys.argv.index("--formats") + 1] if "--formats" in sys.argv
            else "f16,int4").split(",")
    work.mkdir(parents=True, exist_ok=True)
    print("case format | fused: wall us, product us, GPU us | unfused: wall, product, GPU")
    rows = []
    for name, model in CASES:
        for fmt in fmts:
            line = [name, fmt, "|"]
            r = {"case": name, "format": fmt}
            for label, extra in (("fused", []), ("unfused", ["--no-fuse=prologue"])):
                try:
                    r[label] = measure(work, model, FORMATS[fmt] + extra)
                    line += [f"{v:.1f}" for v in r[label]] + ["|"]
                except Exception as e:  # noqa: BLE001
                    line.append("err |")
                    print(e, file=sys.stderr)
            rows.append(r)
            print(" ".join(line), flush=True)
    (work / "prologue_dyn.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
