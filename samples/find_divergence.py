#!/usr/bin/env python3
"""find_divergence.py: the first intermediate tensor where a kiln run goes wrong.

  kiln compile model.yaml --debug-tensors --name model -o model.c
  (build it with samples/run_model.c)
  ./model -i x.bin --dump dump/
  samples/find_divergence.py model.yaml dump/ -i x.bin
  samples/find_divergence.py model.yaml dump/ --reference ref/   # your tensors

Reads dump/manifest.tsv (every tensor in schedule order) and compares each
with the CPU reference: kiln's numpy interpreter of the YAML model
(tests/interpret.py, independent of kiln's kernels) run on the same inputs,
or, with --reference DIR, the raw little-endian files DIR/NAME.bin that you
supply (from PyTorch hooks, say). Prints the first tensor that diverges
(node, max absolute and relative error, where) and exits 1, or says that
all agree. Inputs not given with -i are made as run_model makes them.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

NP = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64,
      "bool": np.bool_, "u8": np.uint8, "i8": np.int8}


def default_input(shape, dtype, index):
    """What samples/run_model.c fills an input with when given no file."""
    n = int(np.prod(shape))
    k = np.arange(n, dtype=np.uint64)
    if dtype == "f32":
        h = (k * np.uint64(2654435761) + np.uint64(12345 * (index + 1))) % np.uint64(2 ** 32)
        return (h.astype(np.float64) / 2147483648.0 - 1.0).astype(np.float32).reshape(shape)
    if dtype == "bool":
        return (k % 2).astype(np.bool_).reshape(shape)
    return (k % 7).astype(NP[dtype]).reshape(shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("dump")
    ap.add_argument("-i", action="append", default=[], help="an input file, in order")
    ap.add_argument("--reference", help="a directory of NAME.bin tensors to compare with")
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args()

    dump = Path(args.dump)
    rows = [ln.split("\t") for ln in (dump / "manifest.tsv").read_text().splitlines() if ln]
    env = None
    if not args.reference:
        import interpret
        import yaml
        spec = yaml.safe_load(Path(args.model).read_text())
        inputs = []
        for i, (name, s) in enumerate(spec.get("inputs", {}).items()):
            if i < len(args.i):
                inputs.append(np.fromfile(args.i[i], NP[s["dtype"]]).reshape(s["shape"]))
            else:
                inputs.append(default_input(s["shape"], s["dtype"], i))
        _, env = interpret.interpret_all(args.model, inputs)
        nodes = {n["name"]: n for n in spec["nodes"]}
        for n in spec["nodes"]:
            for o in n.get("outputs", [n["name"]]):
                nodes[o] = n
    for count, (name, dtype, shape, file) in enumerate(rows):
        shape = [int(x) for x in shape.split("x")] if shape else []
        got = np.fromfile(dump / file, NP[dtype]).reshape(shape)
        if args.reference:
            ref_file = Path(args.reference) / f"{name}.bin"
            if not ref_file.exists():
                continue
            want = np.fromfile(ref_file, NP[dtype]).reshape(shape)
            where = "your reference"
        else:
            if name not in env:
                continue
            want = np.asarray(env[name])
            where = f"node '{nodes[name]['name']}' ({nodes[name]['op']})" if name in nodes else ""
        g, w = got.astype(np.float64), want.astype(np.float64).reshape(got.shape)
        err = np.abs(g - w)
        bad = (err > args.atol + args.rtol * np.abs(w)) | (np.isnan(g) != np.isnan(w))
        if bad.any():
            i = tuple(int(x) for x in np.argwhere(bad)[0])
            rel = err / np.maximum(np.abs(w), 1e-30)
            print(f"first divergence: tensor '{name}' {where}, {dtype} {shape}\n"
                  f"  {int(bad.sum())} of {w.size} elements off; max absolute error "
                  f"{np.nanmax(err):.4g}, max relative error {np.nanmax(rel):.4g}\n"
                  f"  first at {list(i)}: kiln {g[i]!r}, reference {w[i]!r}\n"
                  f"  the {count} tensor(s) before it agree")
            return 1
    print(f"no divergence: all {len(rows)} tensors agree (rtol {args.rtol}, atol {args.atol})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
