#!/usr/bin/env python3
"""runtime_ab.py: two runtime libraries or two decode loops, A/B, on
bench/llm.py's 1.1B Llama decoder (the GPU machine). Exports and compiles
the decoder as llm.py does (--formats), links a decode loop (--llm-a,
--llm-b: llm.c sources, samples/llm/llm.c by default) and
samples/run_model.c against a runtime library each (--a, --b: libkilnrt.a
files, the build's by default) and runs them alternately: llm.c's prompt
and 256 greedy tokens (tokens/s), and run_model's decoding step (seq 1,
past 256) 500 times (us a run).

  runtime_ab.py [--a OLD/libkilnrt.a] [--b NEW/libkilnrt.a] [--llm-a OLD/llm.c]
                [--llm-b NEW/llm.c] [--env-b NAME=VALUE] [--formats f16,int4] [--rounds 3]

--env-b: B's model compiled again with NAME=VALUE in kiln's environment (a
tuning variable such as KILN_F16_PAIRS=0), A's as it is.
"""
import argparse
import os
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import llm  # noqa: E402  bench/llm.py

ROOT = llm.ROOT


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    lib = llm.BUILD / "libkilnrt.a"
    src = ROOT / "samples" / "llm" / "llm.c"
    ap.add_argument("--a", type=Path, default=lib)
    ap.add_argument("--b", type=Path, default=lib)
    ap.add_argument("--llm-a", type=Path, default=src)
    ap.add_argument("--llm-b", type=Path, default=src)
    ap.add_argument("--formats", default="f16,int4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--env-b", help="NAME=VALUE for kiln compile of B's model")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-llm"))
    args = ap.parse_args()
    llm.ARGS = argparse.Namespace(prompt=128, new=256)
    import torch
    import transformers
    llm.torch, llm.tf = torch, transformers
    args.work.mkdir(parents=True, exist_ok=True)
    onnx_path = args.work / "model.onnx"
    if not onnx_path.exists():
        llm.export_model(llm.llama(22), onnx_path)
    prompt = [str(t) for t in np.random.default_rng(2).integers(0, 32000, size=128)]
    for fmt in args.formats.split(","):
        prog, line, _ = llm.kiln_build(args.work, onnx_path, fmt, 22)
        d = db = prog.parent
        if args.env_b:
            name, value = args.env_b.split("=", 1)
            os.environ[name] = value
            db = llm.kiln_build(args.work / "b", onnx_path, fmt, 22)[0].parent
            del os.environ[name]
        for tag, lib, loop, md in (("a", args.a, args.llm_a, d), ("b", args.b, args.llm_b, db)):
            common = ["-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime",
                      "-I", md]
            llm.sh(["cc", *common, "-o", d / f"llm_{tag}", loop, md / "llm_model.c", lib,
                    llm.VULKAN_LIB, "-lm"])
            llm.sh(["cc", *common, "-DKILN_MODEL=llm", "-include", md / "llm_model.h", "-o",
                    d / f"step_{tag}", ROOT / "samples" / "run_model.c", md / "llm_model.c",
                    lib, llm.VULKAN_LIB, "-lm"])
        print(f"{fmt}: {line}", flush=True)
        for r in range(args.rounds):
            for tag in ("a", "b"):
                out = llm.sh([d / f"llm_{tag}", "-n", 256, *prompt], cwd=d)
                tps = re.search(r"decode: ([\d.]+) tokens/s", out).group(1)
                step = llm.sh([d / f"step_{tag}", "-d", "seq=1", "-d", "past=256", "-n", 500],
                              cwd=d)
                us = re.search(r"([\d.]+) us per run", step).group(1)
                print(f"{fmt} round {r} {tag}: decode {tps} tokens/s, step {us} us a run",
                      flush=True)


if __name__ == "__main__":
    main()
