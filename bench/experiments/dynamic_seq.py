#!/usr/bin/env python3
"""dynamic_seq.py: what a dynamic batch and sequence cost a transformer
encoder. Exports transformers' BERT-base (random weights, bench/models.py's
bert-base) twice: with batch and sequence dynamic (dynamo, opset 20, batch
1..8, sequence 2..512, as encoders are exported for serving) and fixed at
each --shapes point; compiles each with kiln; checks the dynamic build at
the first point against onnxruntime; prints the wall time of one run
(bench/bench.c: host to host, the median of --runs after a warm-up) and the
GPU time of its dispatches for each build at its points. The question it
answers: a product whose rows follow the dims is not split along K
(matmul_tiled.c split_chunk), where a fixed build of few rows splits (BERT's
[128, 3072] x [3072, 768] into 11 chunks); convolutions over a dynamic
batch lost 6.6x at batch 1 to the same rule
(bench/experiments/dynamic-batch-h200.txt). Also the dynamic export
compiled with its batch fixed (--shape batch=1: the sequence alone
dynamic), checked and timed at the points of batch 1. Every dynamic
build's output is checked against onnxruntime at each of its points. Runs where kiln and a Vulkan GPU
are (KILN_BUILD, KILN_VULKAN_LIB as bench/models.py).

  bench/experiments/dynamic_seq.py [--work DIR] [--shapes 1x128,8x128,1x512] [--runs 30]
                                   [--f16] [--profile]

--f16: every build with --precision f16 (outputs f32), the check within
1e-2 of max |ort|.
"""
import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "models"))
import models  # noqa: E402  bench/models.py
import export  # noqa: E402  tests/models/export.py


def profile(wd, dims):
    """Prints the ten slowest dispatches of the build in wd at dims
    (run_model -p, 20 runs) and its GPU time by kernel: us (dispatches that
    ran of those recorded)."""
    out = models.sh([wd / "run_model", "-n", "20", "-p", wd / "profile.json", *dims, "-i",
                     wd / "x.bin", "-o", wd / "y.bin"], cwd=wd)
    print(out.split("GPU time")[-1], flush=True)
    disp = json.loads((wd / "inspect.json").read_text())["dispatches"]
    us = [x["us"] for x in json.loads((wd / "profile.json").read_text())["dispatches"]]
    fam = {}
    for x, t in zip(disp, us):
        f = fam.setdefault(x["family"], [0.0, 0, 0])
        f[0] += t
        f[1] += t > 0.5
        f[2] += 1
    print(" by kernel: " + ", ".join(f"{k} {v[0]:.0f} us ({v[1]} of {v[2]})" for k, v in
                                     sorted(fam.items(), key=lambda kv: -kv[1][0])), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-dynseq"))
    ap.add_argument("--shapes", default="1x128,8x128,1x512")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--f16", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also print each build's ten slowest dispatches and its GPU time "
                         "by kernel at each point")
    args = ap.parse_args()
    import onnxruntime as ort
    points = [tuple(int(v) for v in p.split("x")) for p in args.shapes.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    module, _ = export.transformers_model("bert-base")
    module = module.eval()
    dyn_path = args.work / "bert_dyn.onnx"
    if not dyn_path.exists():
        names = export.dynamic_export(module, [(("batch", "seq"), np.int64, 1000)],
                                      {"batch": (1, 8), "seq": (2, 512)}, dyn_path)
        (args.work / "names.json").write_text(json.dumps(names))
    names = json.loads((args.work / "names.json").read_text())
    prec = ["--precision", "f16"] if args.f16 else []
    builds = {"dynamic": (dyn_path, ["--shape", f"{names['batch']}=1..8",
                                     "--shape", f"{names['seq']}=2..512", *prec]),
              "dynamic seq, batch=1": (dyn_path, ["--shape", f"{names['batch']}=1",
                                                  "--shape", f"{names['seq']}=2..512", *prec])}
    for b, s in points:
        path = args.work / f"bert_{b}x{s}.onnx"
        if not path.exists():
            ids = export.make_inputs([((b, s), np.int64, 1000)])
            export.export(module, ids, path, dict(dynamo=True, opset_version=20,
                                                  external_data=False))
        builds[f"fixed {b}x{s}"] = (path, prec)

    def build(item):
        name, (path, flags) = item
        wd = args.work / (("f16_" if args.f16 else "") + name.replace(" ", "_"))
        wd.mkdir(exist_ok=True)
        if args.profile:  # the dispatches' kernels, for the profile's sums by kernel
            models.sh([models.BUILD / "kiln", "inspect", path, "--format", "json", "-o",
                       wd / "inspect.json", *flags])
        return name, wd, models.kiln_build(wd, path, flags=flags)[0]
    with ThreadPoolExecutor(len(builds)) as ex:
        built = list(ex.map(build, builds.items()))
    for name, _, summary in built:
        print(f"{name}: {summary}", flush=True)
    # the dynamic builds at each point (the batch=1 build at those of one
    # batch) against onnxruntime
    sess = ort.InferenceSession(str(dyn_path), providers=["CPUExecutionProvider"])
    for b, s in points:
        ids = export.make_inputs([((b, s), np.int64, 1000)], seed=3)[0]
        want = sess.run(None, {"x0": ids})[0]
        for name, wd, _ in built[:2]:
            if name.endswith("batch=1") and b != 1:
                continue
            ids.tofile(wd / "x.bin")
            dims = ["-d", f"{names['seq']}={s}"]
            if not name.endswith("batch=1"):
                dims += ["-d", f"{names['batch']}={b}"]
            models.sh([wd / "run_model", "-q", *dims, "-i", wd / "x.bin", "-o",
                       wd / "y.bin"], cwd=wd)
            got = np.fromfile(wd / "y.bin", np.float32).reshape(want.shape)
            err = float(np.abs(got - want).max() / np.abs(want).max())
            print(f"{name} build at {b}x{s} against onnxruntime: max |error| / max |ort| "
                  f"{err:.3g}", flush=True)
            if err > (1e-2 if args.f16 else 1e-4):
                sys.exit(f"FAIL: the {name} build's output is off")
            if args.profile:
                profile(wd, dims)
    if args.profile:  # the fixed builds too, at their own point
        for name, wd, _ in built[2:]:
            b, s = (int(v) for v in name.split()[1].split("x"))
            export.make_inputs([((b, s), np.int64, 1000)], seed=3)[0].tofile(wd / "x.bin")
            print(f"{name} build at {b}x{s}", flush=True)
            profile(wd, [])
    print("| build | batch x seq | ms a run | GPU ms |\n| --- | --- | --- | --- |")
    for name, wd, _ in built:
        for b, s in points:
            if name.startswith("fixed") and name.split()[1] != f"{b}x{s}":
                continue
            if name.endswith("batch=1") and b != 1:
                continue
            ids = export.make_inputs([((b, s), np.int64, 1000)], seed=4)[0]
            dims = []
            if name.startswith("dynamic"):  # the largest extent's bytes, the run's ids first
                most = 512 if name.endswith("batch=1") else 8 * 512
                dims = [f"{names['seq']}={s}"] if name.endswith("batch=1") else \
                    [f"{names['batch']}={b}", f"{names['seq']}={s}"]
                ids = np.concatenate([ids.ravel(), np.zeros(most - ids.size, np.int64)])
            res, _ = models.kiln_time(wd, [ids], [], args.runs, dims=dims)
            print(f"| {name} | {b}x{s} | {res['wall_us'] / 1e3:.2f} | "
                  f"{res['gpu_us'] / 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
