#!/usr/bin/env python3
"""llm.py: decoding with a Llama-architecture language model, kiln against
transformers on the same GPU, in one run; writes bench/LLM.md (and
llm.json).

Runs where PyTorch with CUDA, transformers, onnx and onnxruntime are (the
GPU machine), with kiln built there or carried (build/kiln,
build/libkilnrt.a). The model: transformers' LlamaForCausalLM with random
weights (seeded; hidden 2048, 22 layers, 32 query and 4 key/value heads,
MLP 5632, vocabulary 32000: 1.1B parameters), exported by
samples/llm/export.py's decoder step (dynamo, opset 20, the cache as
past_key_values.N.* inputs), compiled by kiln with --precision f16 and each
--weights format, run by samples/llm/llm.c: a prompt of PROMPT random ids
in one run, then NEW greedy tokens, one run each, the cache on the GPU.

Checked before anything is timed: the prompt step's last logits of every
kiln build against torch's f32 forward on the GPU (max |error| / max
|reference|, within 1e-2 for f16 as docs/cli.md's precision bound), and the
generated ids against torch's f16 greedy decoding (how many of the first
tokens agree: random weights leave close logits, so f16 rounding may take
another branch after a while; reported, not required).

transformers, f16, the same prompt and token count, each timed in the same
run:
  - generate() with its default (dynamic) cache and with
    cache_implementation="static";
  - a decode loop of our own over a StaticCache whose one-token forward is
    captured in a CUDA graph once and replayed per token;
and a gpt-fast-style decoder in plain PyTorch over the same weights
(bench/fast_decoder.py: fused q/k/v and gate/up weights, a static cache,
SDPA with grouped-query heads, the step under torch.compile's
reduce-overhead mode: the fastest thing a user would write; its ids are
compared with the CUDA-graph loop's). Tokens per second of decoding, the
prompt's latency, and for kiln and the decode loops the bytes of weights a
token reads over the time per token, against the bandwidth of kiln's copy
kernel measured in the same run; kiln's speed is over the fastest torch
decoder's.

  bench/llm.py [--layers N] [--prompt P] [--new N] [--formats f16,int8,int4,int4-a8]
               [--graph-only] [--work DIR] [--out DIR]
  bench/llm.py --from-json llm.json [--out DIR]   (LLM.md again, no GPU)
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("KILN_BUILD", ROOT / "build"))
VULKAN_LIB = os.environ.get("KILN_VULKAN_LIB", "-lvulkan")
sys.path.insert(0, str(ROOT / "samples" / "llm"))
sys.path.insert(0, str(ROOT / "bench"))
torch = tf = None  # imported by main()

FORMATS = {"f16": [], "int8": ["--weights", "int8"], "int4": ["--weights", "int4"],
           "int8-a8": ["--weights", "int8", "--activations", "int8"],
           "int4-a8": ["--weights", "int4", "--activations", "int8"]}
# bytes a weight of a matmul takes in each format (blocks of 32 with an f32 scale)
WEIGHT_BYTES = {"f16": 2.0, "int8": 1.0 + 4 / 32, "int4": 0.5 + 4 / 32,
                "int8-a8": 1.0 + 4 / 32, "int4-a8": 0.5 + 4 / 32}


def sh(cmd, cwd=None, env=None, timeout=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd,
                       env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{Path(str(cmd[0])).name} failed ({r.returncode}):\n"
                           f"{(r.stdout + r.stderr)[-3000:]}")
    return r.stdout + r.stderr


def llama(layers):
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=2048, num_hidden_layers=layers, num_attention_heads=32,
                         num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                         max_position_embeddings=2048)
    return tf.LlamaForCausalLM(cfg).eval()


def export_model(model, path):
    """samples/llm/export.py's decoder step, weights as external data."""
    import export as ex
    cfg = model.config
    kvh, hd, layers = ex.kv_shape(cfg)
    rng = np.random.default_rng(1)
    seq, past = 2, 3
    args = (torch.from_numpy(rng.integers(0, cfg.vocab_size, size=(1, seq))),
            torch.ones(1, past + seq, dtype=torch.int64), torch.arange(past, past + seq)[None])
    args += tuple(torch.randn(1, kvh, past, hd) for _ in range(2 * layers))
    S = torch.export.Dim.DYNAMIC
    dyn = ({1: S}, {1: S}, {1: S}, tuple({2: S} for _ in range(2 * layers)))
    ins, outs = ex.names(layers)
    with torch.no_grad():
        torch.onnx.export(ex.Step(model, layers).eval(), args, str(path), input_names=ins,
                          output_names=outs, dynamic_shapes=dyn, dynamo=True,
                          opset_version=20, external_data=True)


def sync_time(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def torch_generate(model, prompt, new, static):
    """generate(): the new tokens over the whole call's time (prompt
    included; a static cache is sized, and its forward compiled, per
    length, so the warm-up call has the timed one's)."""
    kw = {"cache_implementation": "static"} if static else {}
    ids = torch.from_numpy(prompt).cuda()
    gen = dict(attention_mask=torch.ones_like(ids), do_sample=False, eos_token_id=None,
               pad_token_id=0, max_new_tokens=new, min_new_tokens=new, **kw)
    with torch.no_grad():
        model.generate(ids, **gen)  # warm-up
        out, t_all = sync_time(lambda: model.generate(ids, **gen))
    return {"tokens_s": new / t_all, "ids": out[0, prompt.shape[1]:].cpu().numpy().tolist()}


def torch_graph_loop(model, prompt, new):
    """Prompt in one forward over a StaticCache, then each token by replaying
    a CUDA graph of the one-token forward (inputs in static tensors)."""
    P = prompt.shape[1]
    try:  # transformers 5: the layers are made on the first update
        cache = tf.StaticCache(config=model.config, max_cache_len=P + new)
    except TypeError:
        cache = tf.StaticCache(config=model.config, max_cache_len=P + new, max_batch_size=1,
                               device="cuda", dtype=torch.float16)
    tok = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros(1, dtype=torch.long, device="cuda")

    def one():
        return model(input_ids=tok, cache_position=pos, position_ids=pos[None],
                     past_key_values=cache, use_cache=True).logits

    def run():
        cache.reset()
        ids = torch.from_numpy(prompt).cuda()
        cp = torch.arange(P, device="cuda")
        t0 = time.perf_counter()
        logits = model(input_ids=ids, cache_position=cp, position_ids=cp[None],
                       past_key_values=cache, use_cache=True).logits
        nxt = logits[0, -1].argmax()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        out = [int(nxt)]
        for k in range(1, new):
            tok.fill_(out[-1])
            pos.fill_(P + k - 1)
            graph.replay()
            out.append(int(static_out[0, -1].argmax()))
        t2 = time.perf_counter()
        return out, t1 - t0, t2 - t1

    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                one()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = one()
        run()  # warm
        out, tp, td = run()
    return {"prompt_ms": tp * 1e3, "tokens_s": (new - 1) / td, "ids": out}


def torch_reference_logits(model, prompt):
    """f32 on the GPU, TF32 off: the prompt step's last logits (the model
    moves to the GPU)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        m32 = model.cuda()
        return m32(input_ids=torch.from_numpy(prompt).cuda()).logits[0, -1].float().cpu().numpy()


def kiln_build(wd, onnx_path, fmt, layers):
    """Compiles the decoder (seq up to the prompt, past up to the rest) and
    links llm.c with it; returns the program and the compile log line."""
    d = wd / fmt
    d.mkdir(parents=True, exist_ok=True)
    flags = ["--precision", "f16", *FORMATS[fmt], "--shape", f"seq=1..{ARGS.prompt}",
             "--shape", f"past=0..{ARGS.prompt + ARGS.new}"]
    t0 = time.monotonic()
    log = sh([BUILD / "kiln", "compile", onnx_path, "--name", "llm", "-o", d / "llm_model.c",
              *flags], timeout=3000)
    secs = time.monotonic() - t0
    sh([BUILD / "kiln", "inspect", onnx_path, "--format", "json", "-o", d / "inspect.json",
        *flags], timeout=3000)
    common = ["-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime", "-I", d]
    sh(["cc", *common, "-o", d / "llm", ROOT / "samples" / "llm" / "llm.c", d / "llm_model.c",
        "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    line = [s for s in log.splitlines() if " dispatches (" in s]
    return d / "llm", (line or [""])[-1], secs


def kiln_profile(d, past, seq=1):
    """samples/run_model.c with the decoder: one run of seq tokens (1: a
    decoding step; the prompt's length with past 0: the prompt) after past
    tokens cached, run 200 times: its wall time per run, and with GPU
    timestamps the GPU time and the slowest dispatches."""
    prog = d / "run_model"
    if not prog.exists():
        sh(["cc", "-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime",
            "-DKILN_MODEL=llm", "-include", d / "llm_model.h", "-o", prog,
            ROOT / "samples" / "run_model.c", d / "llm_model.c", "-L", BUILD, "-lkilnrt",
            VULKAN_LIB, "-lm"])
    dims = ["-d", f"seq={seq}", "-d", f"past={past}"]
    wall = sh([prog, *dims, "-n", 200], cwd=d)
    prof = sh([prog, *dims, "-n", 50, "-p", d / "profile.json"], cwd=d)
    m = re.search(r"([\d.]+) us per run", wall)
    g = re.search(r"GPU time ([\d.]+) us over (\d+) dispatches", prof)
    table = prof[prof.index("GPU time"):].strip().splitlines() if g else []
    # GPU time by kernel family (the inspect listing has the profile's order)
    disp = json.loads((d / "inspect.json").read_text())["dispatches"]
    us = [x["us"] for x in json.loads((d / "profile.json").read_text())["dispatches"]]
    fam = {}
    for x, t in zip(disp, us):
        f = fam.setdefault(x["family"], [0, 0.0, 0])
        f[0] += 1
        f[1] += t
        f[2] += t > 0.5
    return {"wall_us": float(m.group(1)) if m else None,
            "gpu_us": float(g.group(1)) if g else None,
            "dispatches": int(g.group(2)) if g else None,
            "barriers": sum(1 for x in disp if x.get("barrier")), "slowest": table[:12],
            "by_family": {k: {"dispatches": v[0], "us": round(v[1], 1), "ran": v[2]}
                          for k, v in sorted(fam.items(), key=lambda kv: -kv[1][1])}}


def kiln_run(prog, prompt, new, logits_path=None):
    args = [prog, "-n", new]
    if logits_path:
        args += ["-L", logits_path]
    out = sh(args + [int(t) for t in prompt[0]], cwd=prog.parent, timeout=600)
    ids = [int(t) for t in re.search(r"generated \(\d+ tokens\):([ \d]*)", out).group(1).split()]
    prompt_us = float(re.search(r"prompt: ([\d.]+) us", out).group(1))
    tps = float(re.search(r"decode: ([\d.]+) tokens/s", out).group(1))
    return {"ids": ids, "prompt_ms": prompt_us / 1e3, "tokens_s": tps}


def copy_bandwidth(wd):
    """kiln's copy kernel on 256 MiB of f32 (bench/run.py's copy row): GB/s."""
    import run as bench_run
    bench_run.BUILD, bench_run.VULKAN_LIB = BUILD, VULKAN_LIB
    n = 1 << 26
    prog, _, _ = bench_run.build_kiln(wd, bench_run.yaml_model(
        "copy", {"x": bench_run.spec([n])},
        [{"name": "y", "op": "cast", "inputs": ["x"], "to": "f32"}], ["y"]), "copy")
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    res, outs = bench_run.run_kiln(wd, prog, [x], [x], 50, warmup_ms=300)
    if not np.array_equal(outs[0], x):
        raise RuntimeError("the copy kernel's output differs from its input")
    return 2 * n * 4 / res["gpu_us"] / 1e3


def agree(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    global torch, tf, ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--formats", default="f16,int8,int4,int4-a8")
    ap.add_argument("--graph-only", action="store_true",
                    help="of torch, time only the CUDA-graph loop and the gpt-fast decoder")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kiln-llm"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench")
    ap.add_argument("--from-json", type=Path)
    ARGS = a = ap.parse_args()
    if a.from_json:
        write_md(json.loads(a.from_json.read_text()), a.out / "LLM.md")
        return
    import torch as torch_
    import transformers as tf_
    torch, tf = torch_, tf_
    a.work.mkdir(parents=True, exist_ok=True)
    res = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
           "torch_version": torch.__version__, "transformers": tf.__version__,
           "host": platform.node(), "layers": a.layers, "prompt": a.prompt, "new": a.new}
    try:
        res["kiln_commit"] = os.environ.get("KILN_COMMIT") or sh(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).strip()
    except Exception:  # noqa: BLE001
        res["kiln_commit"] = "?"
    try:
        res["driver"] = sh(["nvidia-smi", "--query-gpu=driver_version",
                            "--format=csv,noheader"]).strip()
    except Exception:  # noqa: BLE001
        res["driver"] = "?"
    model = llama(a.layers)
    params = sum(p.numel() for p in model.parameters())
    embed = model.model.embed_tokens.weight.numel()
    res["params"], res["embed_params"] = params, embed
    onnx_path = a.work / "model.onnx"
    if not onnx_path.exists():
        t0 = time.monotonic()
        export_model(model, onnx_path)
        res["export_s"] = time.monotonic() - t0
        print(f"exported in {res['export_s']:.0f} s", flush=True)
    prompt = np.random.default_rng(2).integers(0, 32000, size=(1, a.prompt)).astype(np.int64)

    ref_logits = torch_reference_logits(model, prompt)  # f32, before the f16 copy
    # torch f16 on the GPU
    m16 = model.half()
    res["torch"] = {}
    a.out.mkdir(parents=True, exist_ok=True)

    def save():  # after each stage: a run cut short keeps what it measured
        (a.out / "llm.json").write_text(json.dumps(res, indent=1) + "\n")

    import fast_decoder
    stages = [("static_cuda_graph", lambda: torch_graph_loop(m16, prompt, a.new)),
              ("gpt_fast", lambda: fast_decoder.decode(m16, prompt, a.new)),
              ("generate_dynamic", lambda: torch_generate(m16, prompt, a.new, False)),
              ("generate_static", lambda: torch_generate(m16, prompt, a.new, True))]
    for key, fn in stages[:2 if a.graph_only else 4]:
        try:
            res["torch"][key] = fn()
        except Exception as e:  # noqa: BLE001
            res["torch"][key] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(key, {k: v for k, v in res["torch"][key].items() if k != "ids"}, flush=True)
        save()
    ref_ids = next((r["ids"] for r in res["torch"].values() if "ids" in r), [])
    stages = m16 = model = None  # the GPU's memory back for kiln
    torch.cuda.empty_cache()

    res["copy_gbs"] = copy_bandwidth(a.work)
    res["kiln"] = {}
    for fmt in a.formats.split(","):
        prog, line, secs = kiln_build(a.work, onnx_path, fmt, a.layers)
        logits = a.work / fmt / "logits.bin"
        runs = [kiln_run(prog, prompt, a.new, logits if i == 0 else None) for i in range(3)]
        got = np.fromfile(logits, np.float32)
        err = float(np.max(np.abs(got - ref_logits)) / np.max(np.abs(ref_logits)))
        best = max(runs, key=lambda r: r["tokens_s"])
        wbytes = (params - embed) * WEIGHT_BYTES[fmt]
        row = {"compile": line, "compile_s": secs, "logits_error": err,
               "agree_with_torch": agree(best["ids"], ref_ids),
               "prompt_ms": min(r["prompt_ms"] for r in runs),
               "tokens_s": best["tokens_s"], "tokens_s_runs": [r["tokens_s"] for r in runs],
               "weight_bytes": wbytes,
               "weights_gbs": wbytes * best["tokens_s"] / 1e9}
        row["share_of_copy"] = row["weights_gbs"] / res["copy_gbs"]
        row["step"] = kiln_profile(prog.parent, a.prompt + a.new // 2)
        row["prompt_profile"] = kiln_profile(prog.parent, 0, a.prompt)
        res["kiln"][fmt] = row
        print(fmt, {k: v for k, v in row.items() if k != "step"}, flush=True)
        save()
        if err > 1e-2:
            print(f"{fmt}: logits differ from torch f32 by {err:.3g} of the largest",
                  flush=True)
    save()
    write_md(res, a.out / "LLM.md")


def write_md(res, path):
    graph = res["torch"].get("static_cuda_graph", {})
    lines = [
        "# Decoding with a 1.1B Llama: kiln against transformers",
        "",
        "Written by `bench/llm.py` (do not edit). transformers' LlamaForCausalLM, random",
        f"weights, {res['params'] / 1e9:.2f}B parameters ({res['layers']} layers, hidden 2048,",
        "32 query and 4 key/value heads, vocabulary 32000), exported by",
        "`samples/llm/export.py`'s decoder step (dynamo, opset 20) and compiled by kiln",
        "with `--precision f16` and each `--weights` format; `samples/llm/llm.c` runs a",
        f"prompt of {res['prompt']} ids in one run, then {res['new']} greedy tokens, one run",
        "each (set the dims, ids in, submit, wait, logits out, argmax on the host).",
        "transformers runs in f16 on the same GPU in the same run, and so does a",
        "gpt-fast-style decoder in plain PyTorch (`bench/fast_decoder.py`: the same",
        "weights with q/k/v and gate/up fused, a static cache, SDPA with grouped-query",
        "heads, the one-token step under `torch.compile(mode=\"reduce-overhead\",",
        "fullgraph=True)`). Speed = tokens/s over the fastest torch decoder's;",
        "generate()'s tokens/s count its whole call, prompt included.",
        "",
        f"{res['date']}, {res['gpu']}, driver {res['driver']}, PyTorch {res['torch_version']}, "
        f"transformers {res['transformers']}; kiln {res.get('kiln_commit', '?')}.",
        "",
        "| decoder | prompt ms | decode tokens/s | speed / fastest torch | weights GB/s "
        "(share of copy) | logits error | ids as torch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    timed = [r["tokens_s"] for r in res["torch"].values() if "tokens_s" in r]
    ref = max(timed) if timed else None  # the fastest torch decoder
    # f16 weights a token reads (the embedding table aside): as kiln's f16 row
    wbytes = (res["params"] - res["embed_params"]) * 2 if "embed_params" in res else None
    copy = res.get("copy_gbs")
    for key, label in [("generate_dynamic", "transformers generate(), dynamic cache"),
                       ("generate_static", "transformers generate(), static cache"),
                       ("static_cuda_graph", "transformers static cache, CUDA graph loop"),
                       ("gpt_fast", "gpt-fast-style PyTorch decoder, torch.compile "
                                    "reduce-overhead")]:
        r = res["torch"].get(key)
        if r is None:  # not run (--graph-only)
            continue
        if "error" in r:
            lines.append(f"| {label} | failed: {r['error'][:80]} | | | | | |")
            continue
        sp = f"{r['tokens_s'] / ref:.2f}" if ref else ""
        pm = f"{r['prompt_ms']:.1f}" if "prompt_ms" in r else "-"
        gbs = ""
        if wbytes and "prompt_ms" in r:  # a decode loop's tokens/s, not generate()'s
            g = wbytes * r["tokens_s"] / 1e9
            gbs = f"{g:.0f}" + (f" ({g / copy:.0%})" if copy else "")
        agree_ids = (f"{agree(r['ids'], graph['ids'])} / {res['new']}"
                     if key == "gpt_fast" and graph.get("ids") else "")
        lines.append(f"| {label} | {pm} | {r['tokens_s']:.0f} | {sp} | {gbs} | | {agree_ids} |")
    for fmt, r in res["kiln"].items():
        sp = f"**{r['tokens_s'] / ref:.2f}**" if ref else ""
        what = fmt.replace("-a8", ", activations int8")  # FORMATS' -a8: --activations int8
        lines.append(f"| kiln f16, weights {what} | {r['prompt_ms']:.1f} | {r['tokens_s']:.0f} "
                     f"| {sp} | {r['weights_gbs']:.0f} ({r['share_of_copy']:.0%}) | "
                     f"{r['logits_error']:.2g} | {r['agree_with_torch']} / {res['new']} |")
    lines += [
        "",
        f"kiln's copy kernel in the same run: {res['copy_gbs']:.0f} GB/s. Weights GB/s: the",
        "bytes of the matmul weights one token reads (all but the embedding table, in the",
        "format's size with its scales) times tokens/s. Logits error: the prompt step's last",
        "logits against torch's f32 forward (TF32 off), max |error| / max |reference|. Ids",
        "as torch: how many of the generated ids equal the first torch f16 decoder's",
        "(random weights leave close logits; f16 rounding may branch).",
        "",
        "kiln builds (`kiln compile` summary):",
        "",
    ]
    for fmt, r in res["kiln"].items():
        lines.append(f"- {fmt}: {r['compile']} ({r['compile_s']:.0f} s)")
    lines += ["", "One decoding step (seq 1, past "
              f"{res['prompt'] + res['new'] // 2}) by `samples/run_model.c`: wall time per "
              "run (200 runs, inputs in and logits out), and with GPU timestamps the sum of "
              "the dispatches' GPU times and the slowest of them:", ""]
    profiles = [("step", "")]
    if any("prompt_profile" in r for r in res["kiln"].values()):
        lines_p = ["", f"The prompt (seq {res['prompt']}, past 0) the same way:", ""]
        profiles.append(("prompt_profile", " prompt"))
    for key, what in profiles:
        if what:
            lines += lines_p
        for fmt, r in res["kiln"].items():
            st = r.get(key, {})
            lines += [f"**{fmt}{what}**: {st.get('wall_us')} us a run, {st.get('gpu_us')} us "
                      f"of GPU time in {st.get('dispatches')} dispatches "
                      f"({st.get('barriers')} barriers)",
                      "", "| kernel | dispatches (ran) | GPU us |", "| --- | --- | --- |"]
            lines += [f"| {k} | {v['dispatches']} ({v['ran']}) | {v['us']} |"
                      for k, v in st.get("by_family", {}).items()]
            lines += ["", "```", *st.get("slowest", []), "```", ""]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
