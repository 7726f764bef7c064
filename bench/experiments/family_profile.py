#!/usr/bin/env python3
"""family_profile.py: where a model's GPU time goes, by kernel family.

For each model of bench/models.py (exported once, dynamo, opset 20), kiln
compiles it (f32, and with --f16 also --precision f16), checks the first
output against onnxruntime, runs it 50 times with GPU timestamps (run_model
-p) and prints, per kernel family, the dispatches, the barriers before them
and the mean GPU microseconds they take; with --inspect DIR it also writes
`kiln inspect`'s text schedule of each build there.

  bench/experiments/family_profile.py [--models A,B] [--f16] [--inspect DIR]
                                      [--configs "default;K=V&K=V;..."]

Each configuration (environment variables for the compiler, such as
KILN_FLASH=BQ,BK) is a build of its own, the model exported once.

Runs where bench/models.py runs (PyTorch, transformers, onnxruntime, kiln
built or carried).
"""
import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import models  # noqa: E402  (bench/models.py: the models, kiln's build of them)


def profile(wd, onnx_path, inputs, ort_outs, flags, inspect_dir, tag, cfg):
    wd.mkdir()
    env = dict(os.environ)
    if cfg != "default":
        for kv in cfg.split("&"):
            k, v = kv.split("=", 1)
            env[k] = v
        tag += " " + cfg
    _, _, insp = models.kiln_build(wd, onnx_path, env=env, flags=flags)
    if inspect_dir:
        text = models.sh([models.BUILD / "kiln", "inspect", onnx_path, *flags], env=env)
        (Path(inspect_dir) / f"{tag.replace(' ', '_')}.txt").write_text(text)
    for i, x in enumerate(inputs):
        np.ascontiguousarray(x).tofile(wd / f"in{i}.bin")
    args = [wd / "run_model", "-q", "-n", "50", "-p", wd / "prof.json"]
    for i in range(len(inputs)):
        args += ["-i", wd / f"in{i}.bin"]
    args += ["-o", wd / "out0.bin"]
    models.sh(args, cwd=wd)
    got = np.fromfile(wd / "out0.bin", np.float32).reshape(ort_outs[0].shape)
    err = float(np.abs(got - ort_outs[0]).max() / max(np.abs(ort_outs[0]).max(), 1e-30))
    prof = json.loads((wd / "prof.json").read_text())
    fam = collections.OrderedDict()
    for p, d in zip(prof["dispatches"], insp["dispatches"]):
        e = fam.setdefault(d["family"], [0, 0, 0.0])
        e[0] += 1
        e[1] += 1 if d.get("barrier") else 0
        e[2] += p["us"]
    print(f"\n== {tag}: {insp['summary']['dispatches']} dispatches, "
          f"{insp['summary']['barriers']} barriers, GPU {prof['total_us']:.0f} us, "
          f"rel err {err:.2g}")
    for f, (n, b, us) in sorted(fam.items(), key=lambda kv: -kv[1][2]):
        print(f"  {f:14s} {n:4d} dispatches {b:4d} barriers {us:8.1f} us  "
              f"{us / n:6.1f} us each")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bert-base,gpt2,vit-b16,llama-1024,convnext_tiny")
    ap.add_argument("--f16", action="store_true")
    ap.add_argument("--inspect")
    ap.add_argument("--configs", default="default")
    a = ap.parse_args()
    import torch  # noqa: F401
    import export
    models.export = export
    for name in a.models.split(","):
        with tempfile.TemporaryDirectory() as wd:
            wd = Path(wd)
            module, inputs = models.model_and_inputs(name)
            onnx_path = wd / "model.onnx"
            kw = dict(dynamo=True, opset_version=20, external_data=False)
            ort_outs, _ = export.export(module, inputs, onnx_path, kw)
            for ci, cfg in enumerate(a.configs.split(";")):
                profile(wd / f"f32-{ci}", onnx_path, inputs, ort_outs, (), a.inspect, name,
                        cfg)
                if a.f16:
                    profile(wd / f"f16-{ci}", onnx_path, inputs, ort_outs,
                            ("--precision", "f16"), a.inspect, name + "-f16", cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
