"""cache_export.py: can a plain torch.onnx.export write a transformers decoder
with its DynamicCache (issue 67)? Tries, on a tiny LlamaForCausalLM with a
DynamicCache of 5 tokens, with transformers' pytree registration
(register_dynamic_cache_export_support) and dynamic seq and past:
  a_positional   torch.onnx.export(model, (ids,), kwargs={past_key_values}, ...)
  b_ep_nonstrict torch.export.export(strict=False) first, then torch.onnx.export
  c_tuple_ds     positional arguments with dynamic_shapes as a tuple
and prints each file's inputs, outputs and op counts, or the exporter's error.
Without the registration torch.export refuses the cache in the output; with
it and kwargs only, the exporter failed in its decompositions (IndexError in
_get_updated_module_call_graph; torch 2.11, transformers 5.17, 2026-12-07).
Run on the GPU machine: python3 bench/experiments/cache_export.py
"""
import traceback, torch, transformers as tf, onnx
from collections import Counter
import transformers.cache_utils as cu
from transformers.integrations.executorch import register_dynamic_cache_export_support
register_dynamic_cache_export_support()
cfg = tf.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, num_key_value_heads=2)
torch.manual_seed(0)
m = tf.LlamaForCausalLM(cfg).eval()
ids = torch.randint(3, 100, (1, 3))
def fresh():
    past = cu.DynamicCache(config=cfg)
    with torch.no_grad():
        return m(torch.randint(3, 100, (1, 5)), past_key_values=past, use_cache=True).past_key_values
Dim = torch.export.Dim
seq, pl = Dim("seq", min=1, max=32), Dim("past", min=1, max=32)
cache_ds = [[{2: pl}, {2: pl}] for _ in range(2)]
def report(tag, path):
    mm = onnx.load(path)
    print(tag, "OK inputs", [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]) for i in mm.graph.input])
    print("outputs", [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]) for i in mm.graph.output])
    print(Counter(n.op_type for n in mm.graph.node))
tries = {
 "a_positional": lambda: torch.onnx.export(m, (ids,), "/tmp/a.onnx", kwargs={"past_key_values": fresh()}, dynamo=True, external_data=False,
                                     dynamic_shapes={"input_ids": {1: seq}, "past_key_values": cache_ds}),
 "b_ep_nonstrict": lambda: torch.onnx.export(torch.export.export(m, (ids,), {"past_key_values": fresh()},
                                     dynamic_shapes={"input_ids": {1: seq}, "past_key_values": cache_ds}, strict=False),
                                     (ids,), "/tmp/b.onnx", kwargs={"past_key_values": fresh()}, dynamo=True, external_data=False),
 "c_tuple_ds": lambda: torch.onnx.export(m, (ids, None, None, fresh()), "/tmp/c.onnx", dynamo=True, external_data=False,
                                     dynamic_shapes=({1: seq}, None, None, cache_ds)),
}
for tag, f in tries.items():
    try:
        with torch.no_grad():
            f()
        report(tag, f"/tmp/{tag[0]}.onnx")
    except Exception:
        tb = traceback.format_exc()
        print(tag, "FAILED\n", tb[:1500], "\n...\n", tb[-1200:])
