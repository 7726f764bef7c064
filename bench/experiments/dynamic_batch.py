#!/usr/bin/env python3
"""dynamic_batch.py: what a dynamic batch costs a CNN. Exports
torchvision's ResNet-50 (random weights) with a dynamic batch (dynamo,
opset 20, batch 1..32), compiles it with kiln once with the batch dynamic
(--shape batch=1..32) and once fixed at each of --batches, checks the
dynamic build's output at the second batch against onnxruntime's, and
prints the wall time of one run (bench/bench.c: host to host, the median of
--runs after a warm-up) of each build at its batches. Runs where kiln and a Vulkan GPU
are (KILN_BUILD, KILN_VULKAN_LIB as bench/models.py).

  bench/experiments/dynamic_batch.py [--work DIR] [--batches 1,32] [--runs 30]
                                     [--fixed-env NAME=VALUE] [--f16]

--fixed-env: each fixed build again with NAME=VALUE in kiln's environment
(a tuning variable, e.g. KILN_MATMUL_SPLITK=1: no product split along K).
--f16: every build with --precision f16 (the inputs and outputs f32), the
check within 1e-2 of max |ort| (docs/cli.md's precision bound).
"""
import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402  bench/models.py


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-dynbatch"))
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--fixed-env")
    ap.add_argument("--f16", action="store_true")
    args = ap.parse_args()
    import onnxruntime as ort
    import torch
    import torchvision
    batches = [int(b) for b in args.batches.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    onnx_path = args.work / "resnet50.onnx"
    torch.manual_seed(0)
    module = torchvision.models.resnet50().eval()
    if not onnx_path.exists():
        with torch.no_grad():
            torch.onnx.export(module, (torch.randn(2, 3, 224, 224),), str(onnx_path),
                              input_names=["x"], dynamo=True, opset_version=20,
                              external_data=False,
                              dynamic_shapes=({0: torch.export.Dim("batch", max=32)},))
    prec = ["--precision", "f16"] if args.f16 else []
    builds = {"dynamic": (["--shape", "batch=1..32", *prec], None)}
    builds.update({f"fixed {b}": (["--shape", f"x={b}x3x224x224", *prec], None)
                   for b in batches})
    if args.fixed_env:
        env = dict(os.environ, **dict([args.fixed_env.split("=", 1)]))
        builds.update({f"fixed {b} {args.fixed_env}": (["--shape", f"x={b}x3x224x224", *prec],
                                                       env)
                       for b in batches})

    def build(item):
        name, (flags, env) = item
        wd = args.work / (("f16_" if args.f16 else "") +
                          name.replace(" ", "_").replace("=", "_"))
        wd.mkdir(exist_ok=True)
        return name, wd, models.kiln_build(wd, onnx_path, env=env, flags=flags)[0]
    with ThreadPoolExecutor(len(builds)) as ex:
        built = list(ex.map(build, builds.items()))
    for name, _, summary in built:
        print(f"{name}: {summary}", flush=True)
    # the dynamic build at the second batch against onnxruntime
    b = batches[min(1, len(batches) - 1)]
    wd = built[0][1]
    x = np.random.default_rng(0).standard_normal((b, 3, 224, 224)).astype(np.float32)
    x.tofile(wd / "x.bin")
    models.sh([wd / "run_model", "-q", "-d", f"batch={b}", "-i", wd / "x.bin", "-o",
               wd / "y.bin"], cwd=wd)
    want = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = np.fromfile(wd / "y.bin", np.float32).reshape(want.shape)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"dynamic build at batch {b} against onnxruntime: max |error| / max |ort| {err:.3g}",
          flush=True)
    if err > (1e-2 if args.f16 else 1e-4):
        sys.exit("FAIL: the dynamic build's output is off")
    print("| build | batch | ms a run | GPU ms |\n| --- | --- | --- | --- |")
    x32 = np.random.default_rng(1).standard_normal((32, 3, 224, 224)).astype(np.float32)
    for name, wd, _ in built:
        for bb in batches:
            if name.startswith("fixed") and name.split()[1] != str(bb):
                continue
            dims = [f"batch={bb}"] if name == "dynamic" else []
            res, _ = models.kiln_time(wd, [x32 if name == "dynamic" else x32[:bb]], [],
                                      args.runs, dims=dims)
            print(f"| {name} | {bb} | {res['wall_us'] / 1e3:.2f} | {res['gpu_us'] / 1e3:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
