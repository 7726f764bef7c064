"""test_llm.py: decoders from transformers, exported with their key/value cache.

tests/models/llm/NAME/ holds a decoder step as torch.onnx.export (dynamo)
wrote it from transformers' own class (samples/llm/export.py: Llama, Qwen2
with grouped-query heads, GPT-2; tiny configurations, random weights), at
opset 20 (attention as MatMul, Softmax, MatMul; the cache a Concat) and at
opset 23 (NAME_opset23: Attention, RotaryEmbedding, RMSNormalization), with
onnxruntime's inputs and outputs of two steps of greedy decoding: step0,
the 8-token prompt with an empty cache (past 0), and step1, one token
after 8 cached positions. Each step is compiled with its
shapes fixed (--shape per input, the cache's past 0 included), run on
Vulkan with validation on, and every output element (logits and each
layer's present key and value) compared with onnxruntime's; the decoding
step also with --precision f16, within F16_TOLERANCE of the largest
reference value.
"""
import json
from pathlib import Path

import numpy as np

from harness import (F16_TOLERANCE, ROOT, assert_close, assert_relative, check, kiln,
                     link_model, registry, run_program)

TESTS, case = registry()
LLM = ROOT / "tests" / "models" / "llm"


def step_io(d, step):
    """The step's input and output names in the model's order, and arrays."""
    layers = len(list(d.glob(f"step{step}_in_past_key_values.*.key.npy")))
    ins = ["input_ids", "attention_mask", "position_ids"]
    outs = ["logits"]
    for i in range(layers):
        ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return (ins, [np.load(d / f"step{step}_in_{n}.npy") for n in ins],
            outs, [np.load(d / f"step{step}_out_{n}.npy") for n in outs])


def fixed_step_case(d, step, precision="f32"):
    def test(workdir):
        wd = Path(workdir)
        meta = json.loads((d / "meta.json").read_text())
        ins, xs, outs, want = step_io(d, step)
        check(len(ins) > 3, f"{d}: no cache inputs")
        shapes = []
        for n, x in zip(ins, xs):
            shapes += ["--shape", f"{n}={'x'.join(str(s) for s in x.shape)}"]
        r = kiln("compile", d / "model.onnx", "--name", "model", "-o", wd / "model.c",
                 "--guard", "--precision", precision, *shapes)
        check(r.returncode == 0, f"kiln compile failed ({meta['model']}, opset "
              f"{meta['opset']}):\n{r.stderr}")
        got = run_program(link_model(wd), xs, want)
        for n, g, w in zip(outs, got, want):
            if precision == "f16":
                assert_relative(g, w, F16_TOLERANCE, n)
            else:
                assert_close(g, w, 1e-3, 1e-5, n)
    return test


for _d in sorted(p.parent for p in LLM.glob("*/model.onnx")):
    case(f"llm {_d.name}: prompt step, fixed shapes")(fixed_step_case(_d, 0))
    case(f"llm {_d.name}: decoding step, fixed shapes")(fixed_step_case(_d, 1))
    case(f"llm {_d.name}: decoding step, fixed shapes, f16")(fixed_step_case(_d, 1, "f16"))
