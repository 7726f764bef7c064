#!/usr/bin/env python3
"""prefetch.py: the 1.1B Llama of bench/llm.py decoded by kiln (--precision
f16) with each KILN_PREFETCH setting (MiB of each one-row product's weights
read into the cache beside the work before it: compiler/prefetch.c; 0 off).
For each: decode tokens/s (best of 3 runs of llm.c, 256 tokens after a
128-token prompt), the last prompt logits against torch's f32 forward
(checked within 1e-2 of the largest, as bench/llm.py), the ids against the
setting 0's, and one decoding step by run_model (wall us a run, GPU us,
the products' GPU us). Runs where bench/llm.py runs (KILN_BUILD,
KILN_VULKAN_LIB).

  bench/experiments/prefetch.py [--caps 0,8,16,32] [--work DIR] [--layers N]
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import llm  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", default="0,8,16,32")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-prefetch"))
    ap.add_argument("--layers", type=int, default=22)
    a = ap.parse_args()
    import torch
    import transformers
    llm.torch, llm.tf = torch, transformers
    llm.ARGS = argparse.Namespace(prompt=128, new=256)
    a.work.mkdir(parents=True, exist_ok=True)
    model = llm.llama(a.layers)
    onnx_path = a.work / "model.onnx"
    if not onnx_path.exists():
        llm.export_model(model, onnx_path)
    prompt = np.random.default_rng(2).integers(0, 32000, size=(1, 128)).astype(np.int64)
    ref = llm.torch_reference_logits(model, prompt)
    model = None
    torch.cuda.empty_cache()
    rows, base_ids = [], None
    print("MiB  tokens/s (runs)            logits err  ids as 0  step wall us  GPU us  "
          "products us  dispatches")
    for cap in a.caps.split(","):
        os.environ["KILN_PREFETCH"] = cap
        wd = a.work / f"pf{cap}"
        prog, line, secs = llm.kiln_build(wd, onnx_path, "f16", a.layers)
        logits = wd / "f16" / "logits.bin"
        runs = [llm.kiln_run(prog, prompt, 256, logits if i == 0 else None) for i in range(3)]
        got = np.fromfile(logits, np.float32)
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        if err > 1e-2:
            raise RuntimeError(f"KILN_PREFETCH={cap}: logits differ by {err:.3g}")
        best = max(runs, key=lambda r: r["tokens_s"])
        base_ids = base_ids or best["ids"]
        step = llm.kiln_profile(prog.parent, 128 + 128)
        fam = step["by_family"]
        prods = fam.get("matvec_k", {}).get("us", 0) + fam.get("prefetch", {}).get("us", 0)
        row = {"cap_mib": cap, "tokens_s": best["tokens_s"],
               "runs": [r["tokens_s"] for r in runs], "logits_error": err,
               "ids_as_0": llm.agree(best["ids"], base_ids), "step": step, "compile": line}
        rows.append(row)
        print(f"{cap:>4} {best['tokens_s']:8.1f} {str(row['runs']):22s} {err:10.4f} "
              f"{row['ids_as_0']:8d} {step['wall_us']:12.1f} {step['gpu_us']:7.1f} "
              f"{prods:12.1f} {step['dispatches']}", flush=True)
        (a.work / "prefetch.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\nlast step's slowest dispatches:\n" + "\n".join(rows[-1]["step"]["slowest"]))


if __name__ == "__main__":
    main()
