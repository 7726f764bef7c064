#!/usr/bin/env python3
"""scale.py: a Llama decoder larger than bench/llm.py's 1.1B, exported in
f16 (random weights, the model in halves before torch.onnx.export, as a
user exporting a 3B or 8B decoder would), compiled by one or more kiln
binaries with --precision f16, then decoded by samples/llm/llm.c: 128
prompt ids, 64 new tokens. For each kiln: the compile's wall time and
peak host memory (/usr/bin/time), its --time stages, the number of
products on matvec_k.comp and on matvec.comp, and llm.c's wall time and
peak host memory (create, the weights' upload, the prompt and the
decode) and decode tokens/s. Runs where bench/llm.py runs.

  bench/experiments/scale.py [--size 1b|3b|8b] [--kilns NAME=PATH,...] [--work DIR]

Written 2026-12-07 for issue 65's scale step; run at 3B on an H100 on
2026-12-08 (scale-3b-h100.txt).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import llm  # noqa: E402

SIZES = {  # bench/llm.py's 1.1B, Llama 3.2 3B's and Llama 3 8B's shapes
    "1b": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, intermediate_size=5632, vocab_size=32000),
    "3b": dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, intermediate_size=8192, vocab_size=128256),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=128256)}


def timed(cmd, cwd=None, timeout=1200):
    """Runs cmd under /usr/bin/time -v: (output, wall s, peak RSS MiB)."""
    t0 = time.monotonic()
    r = subprocess.run(["/usr/bin/time", "-v", *[str(c) for c in cmd]], capture_output=True,
                       text=True, cwd=cwd, timeout=timeout)
    wall = time.monotonic() - t0
    out = r.stdout + r.stderr
    if r.returncode:
        raise RuntimeError(f"{Path(str(cmd[0])).name} failed ({r.returncode}):\n{out[-3000:]}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", out)
    return out, wall, int(rss.group(1)) / 1024 if rss else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="3b", choices=sorted(SIZES))
    ap.add_argument("--kilns", default=f"kiln={llm.BUILD / 'kiln'}")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-scale"))
    a = ap.parse_args()
    import torch
    import transformers as tf
    llm.torch, llm.tf = torch, tf
    a.work.mkdir(parents=True, exist_ok=True)
    onnx_path = a.work / f"llama_{a.size}.onnx"
    res = {"size": a.size, "gpu": torch.cuda.get_device_name(), "runs": {}}
    if not onnx_path.exists():
        t0 = time.monotonic()
        torch.manual_seed(0)
        cfg = tf.LlamaConfig(max_position_embeddings=2048, **SIZES[a.size])
        torch.set_default_dtype(torch.float16)  # the weights and the example cache
        with torch.device("cuda"):
            model = tf.LlamaForCausalLM(cfg).eval()
        model = model.cpu()
        res["params"] = sum(p.numel() for p in model.parameters())
        llm.export_model(model, onnx_path)
        torch.set_default_dtype(torch.float32)
        res["export_s"] = time.monotonic() - t0
        model = None
    res["onnx_bytes"] = sum(f.stat().st_size for f in a.work.glob(f"llama_{a.size}.onnx*"))
    res["weights_gb"] = res["onnx_bytes"] / 1e9
    print(json.dumps(res), flush=True)
    prompt = [int(t) for t in np.random.default_rng(2).integers(0, 32000, size=128)]
    for spec in a.kilns.split(","):
        name, kiln = spec.split("=")
        d = a.work / name
        d.mkdir(exist_ok=True)
        out, wall, rss = timed([kiln, "compile", onnx_path, "--name", "llm", "-o",
                                d / "llm_model.c", "--precision", "f16", "--shape",
                                "seq=1..128", "--shape", "past=0..192", "--time"])
        row = {"compile_s": wall, "compile_peak_mib": rss,
               "stages": [ln for ln in out.splitlines() if " s in all)" in ln],
               "summary": [ln for ln in out.splitlines() if " dispatches (" in ln][-1:]}
        c = (d / "llm_model.c").read_text(errors="replace")
        row["matvec_k_products"] = len(re.findall(r"/\* \d+: .* matvec_k", c))
        row["matvec_products"] = len(re.findall(r"/\* \d+: .* matvec[;\s]", c))
        common = ["-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime",
                  "-I", d]
        subprocess.run(["cc", *common, "-o", d / "llm", ROOT / "samples" / "llm" / "llm.c",
                        d / "llm_model.c", "-L", llm.BUILD, "-lkilnrt", llm.VULKAN_LIB, "-lm"],
                       check=True)
        out, wall, rss = timed([d / "llm", "-n", 64, *prompt], cwd=d)
        row.update({"llm_s": wall, "llm_peak_mib": rss,
                    "tokens_s": float(re.search(r"decode: ([\d.]+) tokens/s", out).group(1)),
                    "prompt_us": float(re.search(r"prompt: ([\d.]+) us", out).group(1))})
        res["runs"][name] = row
        print(name, json.dumps(row), flush=True)
        (a.work / "scale.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
