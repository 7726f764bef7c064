#!/usr/bin/env python3
"""tile_sweep.py: kiln's tiled matmul on the products that bench/MODELS.md
finds slow, at every tile KILN_MATMUL_TILE can give and every split of K
KILN_MATMUL_SPLITK can give, on this machine's GPU.

The products of real models with a few hundred rows leave most of a large
GPU idle on kiln's default tiles (BERT-base's FFN output [128, 3072] x
[3072, 768] runs 24 workgroups on the H200's 132 multiprocessors). This
measures how far smaller tiles alone go (more workgroups, less reuse per
load), as the ground for the tile choice and split-K of issue 26. Each
product is y = x @ W + b (the bias as the models fuse it), W from kiln's
generator; each result is checked against numpy (tests/interpret.py makes
the same weights) to 1e-4 of its largest element; GPU time from
bench/bench.c's timestamps (median of 200 runs).

  bench/experiments/tile_sweep.py [--tiles T;T...] [--splits S,S...]
                                  [--shapes NAME,...] [--out FILE.json]

--tiles takes KILN_MATMUL_TILE values ("default": kiln's own choice),
--splits KILN_MATMUL_SPLITK values ("default": the cost model's choice).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import interpret  # noqa: E402  (kiln's weight generator, in numpy)
BUILD = Path(os.environ.get("KILN_BUILD", ROOT / "build"))
VULKAN_LIB = os.environ.get("KILN_VULKAN_LIB", "-lvulkan")

SHAPES = [  # name, M, K, N
    ("bert ffn out", 128, 3072, 768),
    ("bert ffn in", 128, 768, 3072),
    ("bert qkv/out", 128, 768, 768),
    ("vit ffn in", 197, 768, 3072),
    ("convnext stage 4 ffn out", 49, 3072, 768),
    ("gpt2 lm-shaped 128 x 2304", 128, 768, 2304),
    ("vit ffn out", 197, 3072, 768),
    ("convnext stage 4 ffn in", 49, 768, 3072),
    ("llama down", 128, 2816, 1024),
    ("llama gate/up", 128, 1024, 2816),
]
TILES = [None, "64,64,4,4", "32,64,2,4", "64,32,4,2", "32,32,2,2", "16,64,1,4", "32,32,2,2,8",
         "16,32,1,2", "16,16,1,1", "32,64,4,4", "32,32,4,4", "16,64,2,4", "16,32,2,2"]


def sh(cmd, tile=None, split=None, cwd=None):
    """Runs cmd with KILN_MATMUL_TILE set to tile and KILN_MATMUL_SPLITK to
    split (each unset for None)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KILN_MATMUL_TILE", "KILN_MATMUL_SPLITK")}
    if tile:
        env["KILN_MATMUL_TILE"] = tile
    if split:
        env["KILN_MATMUL_SPLITK"] = split
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd)
    if r.returncode:
        raise RuntimeError((r.stdout + r.stderr)[-2000:])
    return r.stdout


def one(wd, M, K, N, tile, split):
    y = {"name": "mm", "inputs": {"x": {"dtype": "f32", "shape": [M, K]}},
         "weights": {"w": {"dtype": "f32", "shape": [K, N], "init": {"normal": 0.03, "seed": 1}},
                     "b": {"dtype": "f32", "shape": [N], "init": {"uniform": [-0.1, 0.1],
                                                                  "seed": 2}}},
         "nodes": [{"name": "h", "op": "matmul", "inputs": ["x", "w"]},
                   {"name": "y", "op": "add", "inputs": ["h", "b"]}],
         "outputs": ["y"]}
    (wd / "mm.yaml").write_text(json.dumps(y))
    sh([BUILD / "kiln", "compile", wd / "mm.yaml", "--name", "model", "-o", wd / "mm.c"],
       tile, split)
    sh(["cc", "-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime",
        "-DKILN_MODEL=model", "-include", wd / "mm.h", "-o", wd / "bench",
        ROOT / "bench" / "bench.c", wd / "mm.c", "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    x = np.random.default_rng(0).standard_normal((M, K)).astype(np.float32)
    x.tofile(wd / "x.bin")
    res = json.loads(sh([wd / "bench", "-i", wd / "x.bin", "-o", wd / "y.bin", "-w", 3, "-W",
                         200, "-n", 200], cwd=wd).strip().splitlines()[-1])
    got = np.fromfile(wd / "y.bin", np.float32).reshape(M, N)
    w, b = (interpret.weight(y["weights"][k], wd) for k in ("w", "b"))
    want = x.astype(np.float64) @ w.astype(np.float64) + b
    return res["gpu_us"], float(np.abs(got - want).max() / np.abs(want).max())


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiles", help="KILN_MATMUL_TILE values, ';' between them")
    ap.add_argument("--splits", default="1", help="KILN_MATMUL_SPLITK values")
    ap.add_argument("--shapes", help="names of SHAPES, ',' between them")
    ap.add_argument("--out")
    a = ap.parse_args()
    tiles = [None if t == "default" else t for t in a.tiles.split(";")] if a.tiles else TILES
    splits = [None if t == "default" else t for t in a.splits.split(",")]
    shapes = [s for s in SHAPES if not a.shapes or s[0] in a.shapes.split(",")]
    rows = []
    for name, M, K, N in shapes:
        for tile in tiles:
            for split in splits:
                what = f"{tile or 'default'} split {split or 'default'}"
                with tempfile.TemporaryDirectory() as wd:
                    try:
                        us, err = one(Path(wd), M, K, N, tile, split)
                    except Exception as e:  # a tile the kernel refuses
                        print(f"{name} {what}: {str(e)[-200:]}", flush=True)
                        continue
                if err > 1e-4:
                    print(f"{name} {what}: WRONG (relative error {err:.2e})", flush=True)
                    continue
                tflops = 2 * M * K * N / us / 1e6
                rows.append({"shape": name, "M": M, "K": K, "N": N, "tile": tile or "default",
                             "split": split or "default", "gpu_us": us,
                             "tflops": round(tflops, 2), "rel_err": err})
                print(f"{name:28s} {what:24s} {us:8.1f} us {tflops:6.2f} TFLOP/s"
                      f"  rel err {err:.1e}", flush=True)
                if a.out:
                    Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
