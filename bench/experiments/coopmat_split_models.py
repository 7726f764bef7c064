"""coopmat_split_models.py: the coopmat split along K in whole models, f16 --io f16:
the default (splitk.comp), none (KILN_COOPMAT_SPLITK=1) and the sums in
each tile's last workgroup (KILN_SPLIT_LAST=1); with KILN_SPLIT_VARIANTS=tiles
the split against 64x32 and 32x32 tiles unsplit (run 2026-12-08). Run from the repository root
where bench/models.py runs: python3 bench/experiments/coopmat_split_models.py
NAME[,NAME...]; writes one line a model and variant (coopmat-split-models-h100.txt)."""
import json, os, sys, tempfile
from pathlib import Path
import numpy as np
sys.path.insert(0, "bench")
import models as M
import torch
sys.path.insert(0, 'tests/models')
import export
import run as R
M.torch, M.export, M.run = torch, export, R
names = sys.argv[1].split(",")
variants = [("default", {}), ("nosplit", {"KILN_COOPMAT_SPLITK": "1"}), ("last", {"KILN_SPLIT_LAST": "1"})]
# KILN_SPLIT_VARIANTS=tiles: instead, the split against smaller matrix-unit
# tiles without one (every product of the model on those tiles: an upper
# bound on what a per-product choice would lose, a lower one on its gain)
if os.environ.get("KILN_SPLIT_VARIANTS") == "tiles":
    variants = [("default", {}),
                ("64x32 nosplit", {"KILN_COOPMAT_TILE": "64,32,2,1,32", "KILN_COOPMAT_SPLITK": "1"}),
                ("32x32 nosplit", {"KILN_COOPMAT_TILE": "32,32,2,2,32", "KILN_COOPMAT_SPLITK": "1"})]
for name in names:
    wd0 = Path(tempfile.mkdtemp())
    module, inputs = M.model_and_inputs(name)
    onnx_path = wd0 / "model.onnx"
    ort_outs, _ = M.export.export(module, inputs, onnx_path, dict(dynamo=True, opset_version=20, external_data=False))
    ins16 = [x.astype(np.float16) if x.dtype == np.float32 else x for x in inputs]
    built = {}
    for tag, env in variants:
        wd = wd0 / tag; wd.mkdir()
        summary, _, insp = M.kiln_build(wd, onnx_path, env={**os.environ, **env}, flags=("--precision", "f16", "--io", "f16"))
        built[tag] = (wd, M.recorded(insp))
    best = {}
    for rep in range(2):
        for tag, _ in variants:
            wd, nd = built[tag]
            res, got = M.kiln_time(wd, ins16, ort_outs, 200, out_dtype=np.float16)
            err = max(float(np.abs(g - a).max() / np.abs(a).max()) for g, a in zip(got, ort_outs))
            if tag not in best or res["mapped_us"] < best[tag][0]:
                best[tag] = (res["mapped_us"], res["gpu_us"], nd, err)
    for tag, (w, g, nd, err) in best.items():
        print(f"{name} {tag}: mapped {w:.1f} us, gpu {g:.1f}, dispatches {nd}, rel err {err:.2g}", flush=True)
