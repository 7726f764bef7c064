#!/usr/bin/env python3
"""half.py: the corpus's f16 models (tests/models/half/NAME/model.onnx), made
from tests/models/NAME/model.onnx as `model.half()` before
torch.onnx.export writes one: float initializers, constants, graph inputs
and outputs in f16; the model's explicit casts to f32 kept, so that its f32
islands (an RMSNorm computed in f32) stay, a constant that such an island
reads kept f32, and an f32 value an f16 op reads cast to f16 as
transformers does (rope's cos.to(x.dtype)): found by ONNX type inference,
until no node mixes the two. Constants beyond f16's range (torch's finfo(f32).min masks)
become f16's largest, as transformers' masks in f16 are. The test
(tests/test_corpus.py, half_case) compares each against NAME's stored
torch outputs with the f16 bound; the inputs are NAME's, in f16.

Needs the onnx package (Debian's python3-onnx); run by hand, not by make:

  python3 tests/models/half.py NAME...     (tests/models/half/NAME)
  python3 tests/models/half.py llm/NAME... (tests/models/llm/half/NAME: a
                                            decoder with its cache, f16)
"""
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

F, H = TensorProto.FLOAT, TensorProto.FLOAT16
HERE = Path(__file__).resolve().parent
# ops whose inputs may mix dtypes by design (data and shapes, indices, scales)
MIXED_OK = {"Cast", "Shape", "Reshape", "Expand", "Slice", "Gather", "Range", "ConstantOfShape",
            "Resize", "Pad", "Tile", "Unsqueeze", "Squeeze"}


def retype(t, to):
    if t.data_type == (F if to == H else H):
        a = numpy_helper.to_array(t)
        a = np.clip(a, -65504, 65504).astype(np.float16) if to == H else a.astype(np.float32)
        t.CopyFrom(numpy_helper.from_array(a, t.name))


def halve(m):
    g = m.graph
    for t in g.initializer:
        retype(t, H)
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == F:
            v.type.tensor_type.elem_type = H
    del g.value_info[:]
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                retype(a.t, H)
    inits = {t.name: t for t in g.initializer}
    consts = {n.output[0]: n for n in g.node if n.op_type in ("Constant", "ConstantOfShape")}
    for _ in range(50):
        inferred = shape_inference.infer_shapes(m).graph
        types = {v.name: v.type.tensor_type.elem_type
                 for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output)}
        for t in g.initializer:
            types.setdefault(t.name, t.data_type)
        changed, cast = False, []
        for n in g.node:
            ts = [types.get(i) for i in n.input if i]
            if n.op_type in MIXED_OK or not (F in ts and H in ts):
                continue
            fixed = False
            for i in n.input:
                if types.get(i) != H:
                    continue
                if i in inits:
                    retype(inits[i], F)
                    fixed = True
                elif i in consts:
                    for a in consts[i].attribute:
                        if a.type == onnx.AttributeProto.TENSOR:
                            retype(a.t, F)
                    fixed = True
            if not fixed:  # an f32 value computed beside f16 ones: cast to f16
                for k, i in enumerate(n.input):  # (transformers' cos.to(x.dtype))
                    if types.get(i) == F:
                        cast.append((n, k, i))
            changed |= fixed
        for n, k, i in cast:
            c = helper.make_node("Cast", [i], [f"{i}/to_f16/{n.name}"], to=H,
                                 name=f"{n.name}/cast_{k}")
            n.input[k] = c.output[0]
            g.node.insert(list(g.node).index(n), c)
        changed |= bool(cast)
        cast.clear()
        if not changed:
            return m
    sys.exit("the f16 model's dtypes did not settle")


def main():
    for name in sys.argv[1:]:  # NAME, or llm/NAME (into llm/half/NAME)
        src = HERE / name
        m = halve(onnx.load(src / "model.onnx"))
        out = HERE / (f"llm/half/{name[4:]}" if name.startswith("llm/") else f"half/{name}")
        out.mkdir(parents=True, exist_ok=True)
        onnx.save(m, out / "model.onnx")
        meta = {"source": name, "made_by": "tests/models/half.py", "onnx": onnx.__version__}
        (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{out / 'model.onnx'}: {(out / 'model.onnx').stat().st_size} bytes")


if __name__ == "__main__":
    main()
