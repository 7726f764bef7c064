#!/usr/bin/env python3
"""coopmat_pipe.py: coopmat.comp's software pipeline on lone f16 products.

C = A x B, A [M, K] and B [K, N] f16 (C f16), compiled by kiln under each
configuration (environment variables for the compiler, such as
KILN_COOPMAT_PIPE=PF,NS: K steps loaded ahead in registers, shared-memory
stages), each result checked against numpy (f32 arithmetic on the same
halves, max |error| / max |C| under 1e-2), then timed with bench/bench.c
(median GPU time of the schedule, after 300 ms of warm-up); torch's
A @ B in f16 (cuBLAS) in the same run for scale.

  bench/experiments/coopmat_pipe.py [--shapes MxKxN,...] [--configs "default;K=V&K=V"]
                                    [--runs N] [--passes N]

Each configuration is timed in --passes passes (2), all configurations in
turn each pass, and the fastest pass counts.

A configuration with KILN_COOPMAT_CEILING=1 (multiply-adds only), =2 (with
the fragments' loads from shared memory) or =3 (coopmat_wg.comp's tiles'
traffic alone, no matrices) times the kernel without part of its work (its
output is not the product and is not checked); with a CEILING=1 configuration each row ends with the first
configuration's speed as a share of it (issue: the f16 product's share of
what Vulkan's matrix units allow), e.g.
  --configs "default;KILN_COOPMAT_CEILING=1;KILN_COOPMAT_CEILING=2"

--trans-b: B given as [N, K] (K-major), the product gemm's trans_b compiled
with --precision f16 --io f16 (f16 at the edges, no conversions): a
transposed B, which coopmat.comp gathers by columns (B_KVEC).

Runs where bench/run.py runs (kiln built or carried, PyTorch with CUDA).
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import run as bench  # noqa: E402  (bench/run.py: build_kiln, run_kiln, cuda_time_us)

SHAPES = "4096x4096x4096,1024x1024x1024,128x768x3072,128x3072x768,128x768x768,128x768x2304," \
         "197x768x3072,3136x96x384"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--configs", default="default;KILN_COOPMAT_PIPE=2,1;KILN_COOPMAT_PIPE=1,2;"
                                         "KILN_COOPMAT_PIPE=2,2")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--trans-b", action="store_true",
                    help="B as [N, K]: gemm with trans_b (--precision f16 --io f16)")
    ap.add_argument("--passes", type=int, default=2,
                    help="times each configuration is timed, in turn; the fastest counts")
    args = ap.parse_args()
    configs = args.configs.split(";")
    rng = np.random.default_rng(5)
    print(f"{'M x K x N':>18} {'torch us':>9} " +
          " ".join(f"{c[-24:]:>26}" for c in configs))
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(tmp)
        for si, shp in enumerate(args.shapes.split(",")):
            M, K, N = (int(v) for v in shp.split("x"))
            a = (rng.standard_normal((M, K)) * 0.5).astype(np.float16)
            b = (rng.standard_normal((N, K) if args.trans_b else (K, N)) * 0.5).astype(
                np.float16)
            bkn = b.T if args.trans_b else b
            want = a.astype(np.float32) @ bkn.astype(np.float32)
            if args.trans_b:  # f32 declared, f16 at the edges (--io f16)
                y = bench.yaml_model("gm", {"a": bench.spec([M, K]), "b": bench.spec([N, K])},
                                     [{"name": "c", "op": "gemm", "inputs": ["a", "b"],
                                       "trans_b": 1}], ["c"])
            else:
                y = bench.yaml_model("mm", {"a": bench.spec([M, K], "f16"),
                                            "b": bench.spec([K, N], "f16")},
                                     [{"name": "c", "op": "matmul", "inputs": ["a", "b"]}],
                                     ["c"])
            flags = ("--precision", "f16", "--io", "f16") if args.trans_b else ()
            progs, envs = [], []
            for ci, cfg in enumerate(configs):
                # the configuration's variables at run time too (the
                # runtime's: KILN_COOPMAT_WG=0)
                envs.append({"KILN_STAGED_IO": "1", **({} if cfg == "default" else
                             dict(kv.split("=", 1) for kv in cfg.split("&")))})
                saved = dict(os.environ)
                if cfg != "default":
                    for kv in cfg.split("&"):
                        k, v = kv.split("=", 1)
                        os.environ[k] = v
                try:
                    progs.append(bench.build_kiln(wd, y, f"s{si}c{ci}", flags=flags)[0])
                finally:
                    os.environ.clear()
                    os.environ.update(saved)
            # each configuration timed in every pass, the passes in turn
            # (the first run of a program after other work can be far
            # slower, bench/experiments/coopmat-loop-h200.txt): the fastest
            # pass counts
            times = [float("inf")] * len(configs)
            errs = [0.0] * len(configs)
            for pas in range(args.passes):
                for ci, (cfg, prog, env) in enumerate(zip(configs, progs, envs)):
                    # staged I/O: inputs up to 64 KiB would otherwise be
                    # read from host memory by the kernel (direct I/O),
                    # outputs to 1 MiB written there
                    res, outs = bench.run_kiln(wd, prog, [a, b], [want.astype(np.float16)],
                                               args.runs, warmup_ms=300, env=env)
                    # KILN_COOPMAT_CEILING: the matrix units alone, no
                    # product to check
                    if pas == 0 and "KILN_COOPMAT_CEILING" not in cfg:
                        try:
                            errs[ci] = bench.check_close(f"{shp} {cfg}", outs[0], want, 1e-2)
                        except RuntimeError as e:  # a wrong variant: reported, not timed
                            print(f"WRONG {e}", flush=True)
                            errs[ci] = float("inf")
                    times[ci] = min(times[ci], res["gpu_us"])
            cells = [f"{us:8.1f} us {2 * M * N * K / us / 1e6:6.1f} TF " +
                     ("ceil " if "KILN_COOPMAT_CEILING" in cfg else f"{err:.0e}")
                     for cfg, us, err in zip(configs, times, errs)]
            tus = float("nan")
            if bench.torch is not None and bench.torch.cuda.is_available():
                ta = bench.torch.from_numpy(a).cuda()
                tb = bench.torch.from_numpy(np.ascontiguousarray(bkn)).cuda()
                tus = bench.cuda_time_us(lambda: ta @ tb, args.runs)
            # the first configuration's time as a share of the first ceiling's
            ceil = [t for c, t in zip(configs, times) if "KILN_COOPMAT_CEILING=1" in c]
            share = f" {100 * ceil[0] / times[0]:5.1f}% of ceiling" if ceil else ""
            print(f"{shp:>18} {tus:9.1f} " + " ".join(f"{c:>26}" for c in cells) + share,
                  flush=True)


if __name__ == "__main__":
    main()
