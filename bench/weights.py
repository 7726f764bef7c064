#!/usr/bin/env python3
"""weights.py: matmuls with f16, int8, int4 and fp8 weights (--weights), against PyTorch.

Runs where bench/run.py runs (a GPU, kiln built, PyTorch with CUDA). For
each shape and weight format it compiles y = x @ W with `--weights FMT`
(weights in a sidecar file), checks kiln's result against PyTorch's x @ W'
where W' is W quantized as docs/cli.md describes (tests/test_quant.py's
reference), then times kiln (GPU timestamps) against torch f32 x @ W and
torch f16 x @ W (CUDA events), medians of 50 runs. kiln's copy kernel
(bench/run.py's, 256 MiB) is timed in the same run: each row's weight bytes
per second as a share of its bandwidth. Writes bench/WEIGHTS.md and
bench/weights.json (--page: another page, its .json beside it).

  bench/weights.py [--out DIR] [--quick] [--rows 1,16,4096] [--formats f32,int4,int4+a8]
                   [--sizes 4096x4096,4096x16384] [--page WEIGHTS.md]
  bench/weights.py --markdown [--out DIR] [--page WEIGHTS.md]

A format FMT/h is FMT with f16 A, as a decoder built with --precision f16
runs it: `--precision f16 --io f16`, x given in halves (and rounded so in
the reference), y returned in halves; checked within 5e-3 of the largest
|y| (the output's own rounding, and the f16 pairs of F16_PAIRS and A_H2:
docs/cli.md). --page names the page (and its .json beside it), which the
run rewrites after every row.

The environment reaches kiln compile (KILN_MATVEC_K=WG,CN, or 0 for the
row-major matvec.comp, when comparing).
"""
import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402
from test_quant import a_int8, dequantized, weight_bytes  # noqa: E402  (tests/ on the path)

torch = bench.torch
# FMT+a8: --weights FMT --activations int8 (A as 8-bit integers where
# matvec_k.comp runs; the reference then multiplies a_int8(x))
FORMATS = ["f32", "f16", "int8", "int8-asym", "int4", "int4-asym", "fp8-e4m3", "fp8-e5m2",
           "int8+a8", "int8-asym+a8", "int4+a8", "int4-asym+a8"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(bench.ROOT / "bench"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows", default="1,16,4096", help="M of each product, comma-separated")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--sizes", default="4096x4096", help="W's K x N, comma-separated")
    ap.add_argument("--page", default="WEIGHTS.md", help="the page's name in OUT")
    ap.add_argument("--markdown", action="store_true",
                    help="only rewrite OUT/PAGE from its .json")
    args = ap.parse_args()
    out = Path(args.out)
    page = out / args.page
    data = page.with_name(page.stem.lower() + ".json")
    if args.markdown:
        write_markdown(json.loads(data.read_text()), page)
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    wd = Path(tempfile.mkdtemp(prefix="kiln-weights-"))
    sizes = [(512, 512)] if args.quick else [tuple(int(v) for v in kn.split("x"))
                                             for kn in args.sizes.split(",")]
    rows = [int(m) for m in args.rows.split(",") if not (args.quick and int(m) > 16)]
    r = np.random.default_rng(0)
    res = {"date": datetime.date.today().isoformat(), "rows": []}
    try:
        smi = bench.sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
        res["gpu"], res["driver"] = [s.strip() for s in smi.strip().split(",")][:2]
    except Exception:
        res["gpu"], res["driver"] = "?", "?"
    # kiln's copy kernel, the bandwidth a memory-bound kernel can reach
    key, title, yml, cin, tfn, _, nbytes, _ = bench.kernel_rows(args.quick)[0]
    prog, _, _ = bench.build_kiln(wd, yml, key)
    kr, (got,) = bench.run_kiln(wd, prog, cin, [cin[0]], 20)
    bench.check_close(title, got, cin[0], 1e-7)
    res["copy_gbs"] = nbytes / kr["gpu_us"] / 1e3
    print(f"copy: {res['copy_gbs']:.0f} GB/s", flush=True)
    formats = args.formats.split(",")
    for K, N in sizes:
        w = (r.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        (wd / "w.bin").write_bytes(w.tobytes())
        wt = torch.from_numpy(w).to(bench.DEV)
        wh = wt.half()
        deq = {}  # W as each --weights format stores it, made once a format
        for M in rows:
            x32 = r.standard_normal((M, K)).astype(np.float32)
            xt = torch.from_numpy(x32).to(bench.DEV)
            runs = 50
            t32 = bench.cuda_time_us(lambda: xt @ wt, runs)
            xh = xt.half()
            t16 = bench.cuda_time_us(lambda: xh @ wh, runs)
            for fmt in formats:
                half = fmt.endswith("/h")  # f16 A and y: --precision f16 --io f16
                x = x32.astype(np.float16) if half else x32
                key = f"mm{M}_{K}x{N}_{fmt.replace('/', '_')}"
                doc = {"name": "q", "inputs": {"x": bench.spec([M, K])},
                       "weights": {"w": {"dtype": "f32", "shape": [K, N],
                                         "file": str(wd / "w.bin")}},
                       "nodes": [{"name": "y", "op": "matmul", "inputs": ["x", "w"]}],
                       "outputs": ["y"]}
                (wd / f"{key}.yaml").write_text(json.dumps(doc))
                bench.sh([bench.BUILD / "kiln", "compile", wd / f"{key}.yaml", "--name", "model",
                          "-o", wd / f"{key}.c", "--weights", base(fmt),
                          *(["--activations", "int8"] if "+a8" in fmt else []),
                          *(["--precision", "f16", "--io", "f16"] if half else []),
                          "--weights-file", wd / f"{key}.weights"])
                prog = wd / key
                bench.sh(["cc", "-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I",
                          bench.ROOT / "runtime", "-DKILN_MODEL=model", "-include", wd / f"{key}.h",
                          "-o", prog, bench.ROOT / "bench" / "bench.c", wd / f"{key}.c", "-L",
                          bench.BUILD, "-lkilnrt", bench.VULKAN_LIB, "-lm"])
                # A as the kernel multiplies it: 8-bit integers on matvec_k.comp
                q8 = "+a8" in fmt and "A_Q8 1" in (wd / f"{key}.c").read_text()
                x64 = x.astype(np.float64)
                xa = torch.from_numpy(a_int8(x64) if q8 else x64).to(bench.DEV)
                if base(fmt) not in deq:
                    deq[base(fmt)] = dequantized(w, base(fmt))[0]
                want = (xa @ torch.from_numpy(deq[base(fmt)]).to(bench.DEV)).cpu().numpy()
                kr, (got,) = bench.run_kiln(wd, prog, [x], [want.astype(x.dtype)], runs, 5)
                err = bench.check_close(f"{key}", got, want, 5e-3 if half else 2e-4)
                wbytes = weight_bytes(wd / f"{key}.h")
                row = {"M": M, "K": K, "N": N, "format": fmt, "kiln_us": kr["gpu_us"],
                       "torch_f32_us": t32, "torch_f16_us": t16, "weight_bytes": wbytes,
                       "rel_error_vs_reference": err,
                       "rel_error_vs_f32": float(np.abs(got - x32.astype(np.float64) @ w).max() /
                                                 np.abs(x32.astype(np.float64) @ w).max())}
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
                data.write_text(json.dumps(res, indent=1))
                write_markdown(res, page)
    data.write_text(json.dumps(res, indent=1))
    write_markdown(res, page)
    print(page.read_text())


def base(fmt):
    """The --weights format of a row's format (FMT, FMT+a8, FMT/h)."""
    return fmt.split("+")[0].split("/")[0]


def write_markdown(res, path):
    L = ["# kiln matmuls with quantized weights, against PyTorch", "",
         f"Measured {res['date']} on {res['gpu']} (driver {res['driver']}), TF32 off, by "
         "`bench/weights.py`. Do not edit: rerun it (`--markdown` rewrites this page from "
         f"{Path(path).stem.lower()}.json).", "",
         "y = x @ W, x [M, K], W [K, N]. kiln: `--weights FMT`, dequantized inside the "
         "matmul, f32 arithmetic (FMT+a8: with `--activations int8`, A as 8-bit integers and "
         "integer dot products where `matvec_k.comp` runs, its reference x then as those "
         "integers stand for; FMT/h: with `--precision f16 --io f16`, x and y in halves as "
         "a decoder built so runs the product, the 8-bit, 4-bit and fp8 codes then "
         "multiplying A in f16 pairs where the kernel has them, checked within 5e-3 of the "
         "largest |y|); median GPU time of 50 runs. Up to 2 rows (f32) or 8 (the "
         "other formats) kiln stores W K-major and runs `matvec_k.comp`; more rows up to 16 "
         "read W row-major on `matvec.comp`, more still on the tiled kernel "
         "(docs/performance.md). torch: x @ W in f32 and in "
         "f16 (CUDA events). Each kiln result was first checked against torch's x @ W' "
         "with W' the format's reference dequantization (error column 'vs ref'); 'vs f32' "
         "is the quantization error itself (max |y - x @ W| / max |x @ W|). 'of copy': "
         f"the weight GB/s over kiln's copy kernel's {res['copy_gbs']:.0f} GB/s in the same "
         "run (256 MiB read and written).", "",
         *([res["note"], ""] if res.get("note") else []),
         "| M | K x N | format | weight MiB | kiln us | torch f32 us | torch f16 us | "
         "kiln / torch f32 speed | weight GB/s | of copy | vs ref | vs f32 |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in res["rows"]:
        L.append(f"| {x['M']} | {x['K']} x {x['N']} | {x['format']} | "
                 f"{x['weight_bytes'] / 2**20:.1f} | "
                 f"{x['kiln_us']:.1f} | {x['torch_f32_us']:.1f} | {x['torch_f16_us']:.1f} | "
                 f"{x['torch_f32_us'] / x['kiln_us']:.2f} | "
                 f"{x['weight_bytes'] / x['kiln_us'] / 1e3:.0f} | "
                 f"{100 * x['weight_bytes'] / x['kiln_us'] / 1e3 / res['copy_gbs']:.0f}% | "
                 f"{x['rel_error_vs_reference']:.1e} | {x['rel_error_vs_f32']:.1e} |")
    Path(path).write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
