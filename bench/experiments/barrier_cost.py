#!/usr/bin/env python3
"""barrier_cost.py: what one dispatch and one barrier cost on this device
(issue 64, "Barriers"). Graphs of N softmaxes of ROWS x 256 f32 values,
each its own dispatch (a softmax fuses with nothing), two ways:

- chain: y1 = softmax(x), y2 = softmax(y1), ...: N dispatches, N - 1
  barriers (each reads what the one before wrote);
- fan: y_i = softmax(x), i = 1..N, concatenated into one output: N
  dispatches with no barrier between them (the concatenation, where kiln
  writes each y_i in place, adds at most one; only at one row: N copies of
  4 MiB would not fit).

The chain at ROWS 1 (one workgroup: launch and barrier alone) and 4096 (a
full GPU, 4 MiB a dispatch: launch, ramp and drain too), bench.c times
kiln_model_run_mapped (median of RUNS, host to host) and the sum of the
dispatches' GPU timestamps; the slope over N is the cost of a dispatch
(fan) and of a dispatch plus a barrier (chain). Every run's outputs are
checked against numpy first.

  bench/experiments/barrier_cost.py [--runs 500]

Runs where bench/run.py runs (KILN_BUILD, KILN_VULKAN_LIB); needs no torch.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import run as R  # noqa: E402

NS = (1, 65, 257)
ROWS = (1, 4096)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def graph(kind, n, rows):
    nodes, outs = [], []
    for i in range(1, n + 1):
        src = "x" if kind == "fan" or i == 1 else f"y{i - 1}"
        nodes.append({"name": f"y{i}", "op": "softmax", "inputs": [src]})
    if kind == "fan":
        nodes.append({"name": "y", "op": "concat", "axis": 0,
                      "inputs": [f"y{i}" for i in range(1, n + 1)]})
    return R.yaml_model(f"{kind}{n}", {"x": R.spec([rows, 256])}, nodes,
                        ["y" if kind == "fan" else f"y{n}"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=500)
    a = ap.parse_args()
    wd = Path(tempfile.mkdtemp())
    rng = np.random.default_rng(0)
    res = {}
    print("kind  rows     N  dispatches  barriers  run us  GPU us")
    for rows in ROWS:
        kinds = ("chain", "fan") if rows == 1 else ("chain",)
        x = rng.standard_normal((rows, 256), dtype=np.float32) * 4
        chain = [softmax(x)]
        for _ in range(max(NS) - 1):
            chain.append(softmax(chain[-1]))
        for kind in kinds:
            for n in NS:
                text = graph(kind, n, rows)
                name = f"{kind}{n}_{rows}"
                prog, _, _ = R.build_kiln(wd, text, name)
                want = [np.tile(chain[0], (n, 1)) if kind == "fan" else chain[n - 1]]
                r, outs = R.run_kiln(wd, prog, [x], want, a.runs, warmup_ms=300)
                for o, w in zip(outs, want):
                    R.check_close(name, o, w, 1e-4)
                res[(kind, rows, n)] = r
                print(f"{kind:5} {rows:5} {n:5}  {r['dispatches']:10}  {r['barriers']:8}  "
                      f"{r['mapped_us']:6.1f}  {r['gpu_us']:6.1f}", flush=True)
    print("\nslope over N (us a dispatch; chain: with its barrier):")
    for (kind, rows) in [("chain", r) for r in ROWS] + [("fan", 1)]:
        if True:
            lo, hi = res[(kind, rows, NS[1])], res[(kind, rows, NS[-1])]
            d = NS[-1] - NS[1]
            print(f"{kind:5} rows {rows:5}: run {(hi['mapped_us'] - lo['mapped_us']) / d:.2f} us, "
                  f"GPU {(hi['gpu_us'] - lo['gpu_us']) / d:.2f} us")
    print(json.dumps({f"{k}_{r}_{n}": v["mapped_us"] for (k, r, n), v in res.items()}))


if __name__ == "__main__":
    main()
