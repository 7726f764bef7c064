#!/usr/bin/env python3
"""export.py: a transformers decoder exported to ONNX with its key/value cache.

Runs where PyTorch, transformers, onnx and onnxruntime are (the GPU machine;
not CI). For each model named (llama_tiny, qwen2_tiny, gpt2_tiny, or a
transformers checkpoint directory with --checkpoint), writes OUT/NAME/:

  model.onnx     torch.onnx.export (dynamo) of one decoder step: inputs
                 input_ids [1, seq], attention_mask [1, past + seq],
                 position_ids [1, seq], past_key_values.N.key/value
                 [1, kv_heads, past, head_dim]; outputs logits
                 [1, seq, vocab], present.N.key/value [1, kv_heads,
                 past + seq, head_dim] (the layout optimum and
                 onnxruntime-genai use). seq and past are dynamic.
  prompt.npy     the prompt's token ids (int64 [1, P], seeded random)
  ids.npy        transformers' own greedy generate() from the same weights:
                 the prompt followed by --new tokens (int64 [1, P + new])
  ort_ids.npy    the same greedy decoding run step by step on model.onnx
                 with onnxruntime (prompt in one step, then one token a
                 step); the script fails when it differs from ids.npy
  step0_*.npy, step1_*.npy
                 onnxruntime's inputs and outputs of the prompt step and
                 of the first decoding step (for locating a difference)
  meta.json      versions, opset, date, the graph's op counts, its inputs'
                 and outputs' dimensions as the exporter named them

  python3 samples/llm/export.py --out tests/models/llm llama_tiny qwen2_tiny gpt2_tiny
"""
import argparse
import datetime
import json
import sys
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers as tf


def tiny(name):
    """A small configuration of transformers' own class, random weights,
    initialized wider than the default (std 0.02 makes a tiny model repeat
    one token and leaves the best two logits close)."""
    torch.manual_seed(0)
    common = dict(vocab_size=256, max_position_embeddings=128, initializer_range=0.1)
    if name == "llama_tiny":
        cfg = tf.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=128, **common)
        return tf.LlamaForCausalLM(cfg)
    if name == "qwen2_tiny":
        cfg = tf.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                             num_key_value_heads=2, intermediate_size=128, **common)
        return tf.Qwen2ForCausalLM(cfg)
    if name == "gpt2_tiny":
        cfg = tf.GPT2Config(vocab_size=256, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                            initializer_range=0.1)
        return tf.GPT2LMHeadModel(cfg)
    raise SystemExit(f"unknown model {name}")


def kv_shape(cfg):
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return heads, cfg.hidden_size // cfg.num_attention_heads, cfg.num_hidden_layers


def layer_kv(cache, i):
    if hasattr(cache, "layers"):
        return cache.layers[i].keys, cache.layers[i].values
    if hasattr(cache, "key_cache"):
        return cache.key_cache[i], cache.value_cache[i]
    return cache[i]


class Step(torch.nn.Module):
    """One decoder step on plain tensors: the past as 2 * layers tensors in,
    logits and the present out."""
    def __init__(self, model, layers):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = tf.DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=cache, use_cache=True)
        present = []
        for i in range(self.layers):
            present += list(layer_kv(out.past_key_values, i))
        return (out.logits, *present)


def names(layers):
    ins = ["input_ids", "attention_mask", "position_ids"]
    outs = ["logits"]
    for i in range(layers):
        ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return ins, outs


def step_feeds(ids, past, ins, empty, t0):
    """onnxruntime feeds for token ids [1, n] after t0 cached positions:
    past (the last step's presents) for the inputs after the first three,
    or the empty cache."""
    n = ids.shape[1]
    f = {"input_ids": ids.astype(np.int64),
         "attention_mask": np.ones((1, t0 + n), np.int64),
         "position_ids": np.arange(t0, t0 + n, dtype=np.int64)[None]}
    for k, name in enumerate(ins[3:]):
        f[name] = past[k] if past else empty
    return f


def dims_of(vis):
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in vis}


def export(name, model, out, new, opset, prompt_len):
    cfg = model.config
    kvh, hd, layers = kv_shape(cfg)
    model.eval()
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, cfg.vocab_size, size=(1, prompt_len)).astype(np.int64)

    # The exporter's example: 2 new tokens after 3 cached ones (neither 0
    # nor 1, which torch.export would specialize).
    seq, past_len = 2, 3
    ex = (torch.from_numpy(rng.integers(0, cfg.vocab_size, size=(1, seq))),
          torch.ones(1, past_len + seq, dtype=torch.int64),
          torch.arange(past_len, past_len + seq)[None])
    ex += tuple(torch.randn(1, kvh, past_len, hd) for _ in range(2 * layers))
    S, P, T = (torch.export.Dim.DYNAMIC,) * 3
    dyn = ({1: S}, {1: T}, {1: S}, tuple({2: P} for _ in range(2 * layers)))  # *past: one tuple
    ins, outs = names(layers)
    step = Step(model, layers).eval()
    path = d / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(step, ex, str(path), input_names=ins, output_names=outs,
                          dynamic_shapes=dyn, dynamo=True, opset_version=opset,
                          external_data=False)
    onnx.checker.check_model(str(path))
    m = onnx.load(str(path))
    counts = {}
    for n in m.graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1

    # transformers' greedy decoding.
    with torch.no_grad():
        ids = model.generate(torch.from_numpy(prompt), attention_mask=torch.ones_like(
            torch.from_numpy(prompt)), max_new_tokens=new, min_new_tokens=new,
            do_sample=False, eos_token_id=None, pad_token_id=0).numpy()

    # The same on the exported step with onnxruntime.
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    seqs = prompt.copy()
    empty = np.zeros((1, kvh, 0, hd), np.float32)
    feeds = step_feeds(prompt, None, ins, empty, 0)
    gap = np.inf  # the closest call between the best two logits
    for k in range(new):
        res = sess.run(None, feeds)
        top = np.sort(res[0][0, -1])[-2:]
        gap = min(gap, float(top[1] - top[0]))
        if k < 2:
            for key, v in feeds.items():
                np.save(d / f"step{k}_in_{key}.npy", v)
            for key, v in zip(outs, res):
                np.save(d / f"step{k}_out_{key}.npy", v)
        tok = int(np.argmax(res[0][0, -1]))
        t0 = seqs.shape[1]
        seqs = np.concatenate([seqs, [[tok]]], axis=1)
        feeds = step_feeds(np.array([[tok]]), res[1:], ins, empty, t0)
    np.save(d / "prompt.npy", prompt)
    np.save(d / "ids.npy", ids)
    np.save(d / "ort_ids.npy", seqs)
    same = bool(np.array_equal(seqs, ids))
    meta = {"model": f"{type(model).__name__} {name}", "exporter": "dynamo", "opset": opset,
            "torch": torch.__version__, "transformers": tf.__version__,
            "onnx": onnx.__version__, "onnxruntime": ort.__version__,
            "date": datetime.date.today().isoformat(), "prompt": prompt_len, "new": new,
            "ort_matches_generate": same, "min_top2_gap": gap,
            "ops": dict(sorted(counts.items())), "inputs": dims_of(m.graph.input),
            "outputs": dims_of(m.graph.output)}
    (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{name}: {len(m.graph.node)} nodes, onnxruntime greedy == generate(): {same}, "
          f"closest top-2 logits {gap:.2e}, ids {ids[0, prompt_len:prompt_len + 16]}")
    return same


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out", type=Path, default=Path("llm"))
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--opset", type=int, default=20)
    ap.add_argument("--tag", default="", help="appended to each output directory's name")
    ap.add_argument("--checkpoint", action="store_true",
                    help="MODELS are transformers checkpoint directories")
    a = ap.parse_args()
    ok = True
    for name in a.models:
        try:
            model = (tf.AutoModelForCausalLM.from_pretrained(name) if a.checkpoint
                     else tiny(name))
            ok &= export(Path(name).name + a.tag, model, a.out, a.new, a.opset, a.prompt)
        except Exception as e:  # report and go on with the next model
            traceback.print_exc()
            print(f"{name}: failed: {e}")
            ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
