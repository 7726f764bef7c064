#!/usr/bin/env python3
"""tiles_in_models.py: kiln's matmul and convolution dispatches timed inside
whole models, under each tile or split override, on this machine's GPU.

A product timed alone runs at the clocks of a short burst (BERT-base's FFN
output: 310 us alone, 135 us inside the model; tile_sweep-h200.txt), so the
tile choice is measured where it is used. Each model of bench/models.py is
exported once (dynamo, opset 20), then compiled under each configuration of
environment variables (KILN_MATMUL_TILE=BM,BN,TM,TN[,BK], KILN_MATMUL_SPLITK=S;
lower_matmul.c), its first output checked against onnxruntime, and run 300
times with GPU timestamps (run_model -p). Prints, per distinct product of
each model (its MFLOP and workgroup grid under the default choice; xN: how
many dispatches share them), the mean GPU microseconds under each
configuration, with that configuration's grid.

  bench/experiments/tiles_in_models.py [--models A,B] [--configs "default;K=V&K=V;..."]
                                       [--out FILE.json] [--f16] [--families F,G]

--families lists other kernel families than the products (conv: the direct and tiled
depthwise convolutions, KILN_DWCONV).
  bench/experiments/tiles_in_models.py --report FILE.json

Runs where bench/models.py runs (PyTorch, transformers, onnxruntime, kiln
built or carried).
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import models  # noqa: E402  (bench/models.py: the models, kiln's build of them)

PRODUCTS = ("matmul", "splitk", "matvec", "matvec_k", "coopmat")


def measure(wd, inputs, ort_outs, cfg, flags=(), families=PRODUCTS):
    """{total_us, err, nodes: {node: {us, flops, groups}}} under cfg (and
    kiln compile's flags), nodes those of the kernel families listed."""
    env = dict(os.environ)
    if cfg != "default":
        for kv in cfg.split("&"):
            k, v = kv.split("=", 1)
            env[k] = v
    _, _, insp = models.kiln_build(wd, wd / "m.onnx", env, flags)
    args = [wd / "run_model", "-q", "-n", "300", "-p", wd / "prof.json"]
    for i in range(len(inputs)):
        args += ["-i", wd / f"in{i}.bin"]
    for i in range(len(ort_outs)):
        args += ["-o", wd / f"out{i}.bin"]
    models.sh(args, cwd=wd)
    got = np.fromfile(wd / "out0.bin", np.float32).reshape(ort_outs[0].shape)
    prof = json.loads((wd / "prof.json").read_text())
    nodes = {}
    for p, d in zip(prof["dispatches"], insp["dispatches"]):
        if d["family"] in families:
            e = nodes.setdefault(d["node"], {"us": 0, "flops": 0, "groups": []})
            e["us"] += p["us"]
            e["flops"] = max(e["flops"], d["flops"])
            e["groups"].append(d["groups"])
    return {"total_us": prof["total_us"], "err": float(np.abs(got - ort_outs[0]).max()),
            "nodes": nodes}


def report(results):
    for name, per in results.items():
        print(f"\n{name}")
        for tag, r in per.items():
            mm = sum(e["us"] for e in r["nodes"].values())
            print(f"  {tag:28} total {r['total_us']:7.0f} us, listed {mm:7.0f} us, "
                  f"first output vs onnxruntime {r['err']:.1e}")
        tags = list(per)
        groups = {}  # (flops, default grid) -> [{tag: node entry}]
        for node in per[tags[0]]["nodes"]:
            d = per[tags[0]]["nodes"][node]
            groups.setdefault((d["flops"], str(d["groups"])), []).append(
                {t: per[t]["nodes"].get(node) for t in tags})
        for (flops, grid), entries in groups.items():
            cells = []
            for t in tags:
                us = [e[t]["us"] for e in entries if e[t]]
                if us:
                    g = "" if t == tags[0] else str(entries[0][t]["groups"][0])
                    cells.append(f"{t} {np.mean(us):.1f}{g}")
            print(f"    {flops / 1e6:5.0f} MFLOP {grid} x{len(entries)}: " + "; ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="convnext_tiny,vit-b16,bert-base,llama-1024,resnet50")
    ap.add_argument("--configs", default="default;KILN_MATMUL_SPLITK=1")
    ap.add_argument("--out", default="tiles_in_models.json")
    ap.add_argument("--families", default=",".join(PRODUCTS),
                    help="the kernel families listed, e.g. conv for the depthwise path "
                         "(KILN_DWCONV)")
    ap.add_argument("--report", help="only print the report of a stored JSON")
    ap.add_argument("--f16", action="store_true",
                    help="compile with --precision f16 (the outputs stay f32)")
    a = ap.parse_args()
    if a.report:
        report(json.loads(Path(a.report).read_text()))
        return
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    import export
    models.export = export  # what models.model_and_inputs builds from
    results = {}
    for name in a.models.split(","):
        t0 = time.time()
        module, inputs = models.model_and_inputs(name)
        wd = Path(tempfile.mkdtemp())
        ort_outs, _ = export.export(module, inputs, wd / "m.onnx",
                                    dict(dynamo=True, opset_version=20, external_data=False))
        for i, x in enumerate(inputs):
            np.ascontiguousarray(x).tofile(wd / f"in{i}.bin")
        print(f"{name}: exported in {time.time() - t0:.0f} s", flush=True)
        results[name] = {}
        for cfg in a.configs.split(";"):
            try:
                results[name][cfg.replace("KILN_MATMUL_", "")] = measure(
                    wd, inputs, ort_outs, cfg, ("--precision", "f16") if a.f16 else (),
                    tuple(a.families.split(",")))
            except RuntimeError as e:
                print(f"  {cfg}: failed: {str(e)[-300:]}", flush=True)
        Path(a.out).write_text(json.dumps(results))
    report(results)


if __name__ == "__main__":
    main()
