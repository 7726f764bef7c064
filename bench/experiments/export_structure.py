#!/usr/bin/env python3
"""export_structure.py: a model's exported graph without its weights' bytes,
to study kiln's schedule for it on a machine without PyTorch.

On the GPU machine (PyTorch, torchvision, timm, transformers), each NAME of
bench/models.py (a torchvision or transformers name, timm:NAME, NAME@B) is
exported as bench/models.py exports it (dynamo, opset 20) and saved as
OUT/NAME.onnx with every initializer over 1 KiB moved to external data
(OUT/NAME.data, not kept: only its size, in OUT/NAME.json with the input
shapes). Small initializers (shapes, axes, indices) stay in the graph, so
kiln folds what it would fold. On any machine,

  truncate -s SIZE NAME.data      (SIZE from NAME.json: a file of zeros)
  kiln inspect NAME.onnx          (or compile: the schedule, kernels, arena)

gives the dispatches, barriers and kernels of the real model; only the
weights' values are zeros, which changes no shape or kernel choice.

  bench/experiments/export_structure.py NAME [NAME...] --out DIR
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "models"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import onnx
    import torch
    import export  # tests/models/export.py: the models
    import models  # bench/models.py: model_and_inputs, which reads these two
    models.torch, models.export = torch, export
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.names:
        safe = name.replace(":", "_").replace("@", "_b")
        try:
            module, inputs = models.model_and_inputs(name)
            tmp = a.out / f"{safe}.full.onnx"
            args = tuple(torch.from_numpy(x) for x in inputs)
            torch.onnx.export(module, args, str(tmp), dynamo=True, opset_version=20,
                              external_data=False,
                              input_names=[f"x{i}" for i in range(len(args))])
            m = onnx.load(str(tmp))
            onnx.save_model(m, str(a.out / f"{safe}.onnx"), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=f"{safe}.data",
                            size_threshold=1024)
            tmp.unlink()
            data = a.out / f"{safe}.data"
            meta = {"name": name, "data_bytes": data.stat().st_size if data.exists() else 0,
                    "inputs": [[list(x.shape), str(x.dtype)] for x in inputs]}
            if data.exists():
                data.unlink()
            (a.out / f"{safe}.json").write_text(json.dumps(meta) + "\n")
            print(f"{name}: {(a.out / f'{safe}.onnx').stat().st_size} bytes of graph, "
                  f"{meta['data_bytes']} of weights", flush=True)
        except Exception as e:  # one model's failure leaves the others
            print(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
