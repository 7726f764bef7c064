"""test_corpus.py: models that an exporter wrote, against onnxruntime.

Every directory under tests/models/ that holds a model.onnx is a case: the
file exactly as torch.onnx.export wrote it (tests/models/export.py makes
them where PyTorch is), its inputs (input_N.npy) and onnxruntime's outputs
(ort_N.npy; torch's beside them as torch_N.npy). kiln compiles the file
unchanged, the program runs on Vulkan with validation on, and every output
element must be within atol 1e-4 + rtol 1e-3 of onnxruntime's; the output
shapes in the generated header must be the ones onnxruntime gave.

Each model is also compiled with --precision f16 (activations and matmul
weights stored in f16) and compared with the same outputs within
F16_TOLERANCE of the largest reference value: every element, max |error| /
max |reference| of its output (docs/cli.md, "Precision").
"""
import json
from pathlib import Path

import numpy as np

from harness import (F16_TOLERANCE, ROOT, assert_close, assert_relative, check, kiln,
                     link_model, registry, run_program)
from test_onnx import check_outputs, declared_outputs

TESTS, case = registry()
MODELS = ROOT / "tests" / "models"


def corpus_case(d, precision="f32"):
    def test(workdir):
        wd = Path(workdir)
        meta = json.loads((d / "meta.json").read_text())
        inputs = [np.load(p) for p in sorted(d.glob("input_*.npy"))]
        want = [np.load(p) for p in sorted(d.glob("ort_*.npy"))]
        check(inputs and want, f"{d}: no inputs or no reference outputs")
        r = kiln("compile", d / "model.onnx", "--name", "model", "-o", wd / "model.c", "--guard",
                 "--precision", precision)
        check(r.returncode == 0, f"kiln compile failed ({meta['exporter']} exporter, opset "
              f"{meta['opset']}):\n{r.stderr}")
        names = list(declared_outputs(wd / "model.h"))
        check_outputs(wd, names, want)
        got = run_program(link_model(wd), inputs, want)
        for i, (g, w) in enumerate(zip(got, want)):
            if precision == "f16":
                assert_relative(g, w, F16_TOLERANCE, f"output {i} ({names[i]})")
            else:
                assert_close(g, w, 1e-3, 1e-4, f"output {i} ({names[i]})")
    return test


for _d in sorted(p.parent for p in MODELS.glob("*/model.onnx")):
    case(f"corpus: {_d.name}")(corpus_case(_d))
    case(f"corpus f16: {_d.name}")(corpus_case(_d, "f16"))
