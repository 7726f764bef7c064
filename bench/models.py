#!/usr/bin/env python3
"""models.py: kiln against PyTorch on real models, on the same GPU, in one
run; writes bench/MODELS.md (and models.json).

Runs where PyTorch with CUDA, torchvision, transformers, onnx and
onnxruntime are (the GPU machine), with kiln built there or carried
(build/kiln, build/libkilnrt.a, build/run_model_test.o). For each model:

1. the model with random weights (torchvision's and transformers' own
   classes, as tests/models/export.py builds them), exported by
   torch.onnx.export with the dynamo exporter at its default opset (20);
2. kiln compiles the file unchanged; the program runs the stored inputs,
   and every output element is checked against onnxruntime's (CPU) within
   atol 1e-4 + rtol 1e-3 before anything is timed (a model that fails is
   reported, not timed);
3. timed, each the median of RUNS runs after a warm-up of at least 0.3 s:
   kiln's latency of one inference from host memory to host memory
   (bench/bench.c: inputs in, submit, wait, outputs out) two ways: in
   place (kiln_model_run_mapped: the inputs in the model's mapped staging
   memory, pinned host memory, the outputs left there; the "kiln ms" the
   speed is computed with, the same work as torch's copies below) and
   through the caller's own memory (kiln_model_run's two memcpy, "kiln ms,
   user buffers"), kiln's GPU time
   (the sum of its dispatches' timestamps), torch eager and torch replaying
   a CUDA graph, both also host to host (the inputs copied in from pinned
   host memory, the output copied out to pinned memory, synchronized, as
   bench/run.py does: torch's fastest copies); with --compile also
   torch.compile, mode "max-autotune" and mode "reduce-overhead" (Inductor's
   kernels replayed as a CUDA graph), each warmed up past its compile and
   recording (--compile f16: in f16 only); the speed against the fastest
   of torch's ways is the claim ("kiln / fastest torch"). f32 with TF32
   off in torch;
4. kiln's five slowest dispatches (run_model -p: GPU microseconds, and the
   TFLOP/s and GB/s that the compiler's operation and byte counts give);
5. with --f16, half precision too: kiln compiled with --precision f16, its
   outputs checked against onnxruntime's f32 ones within the documented
   bound (max |error| <= 1e-2 max |reference|, docs/cli.md "Precision"),
   against torch with the module and its float inputs in f16 (eager and a
   CUDA graph and, with --compile, torch.compile's two modes, host to host
   as above). bench/MODELS.md gets a second table.
   With --io-f16, kiln is compiled with --io f16 too and takes the float
   inputs and gives the outputs in f16, as the torch module does (its
   rows are marked so).

  bench/models.py [--only NAME[,NAME...] | --held-out] [--runs N] [--compile [f16]]
                  [--compile-modes max-autotune,reduce-overhead]
                  [--f16 [--io-f16]]
                  [--out DIR]
  bench/models.py --from-json A.json [B.json...] [--out DIR]

NAMEs: mobilenet_v3_large, efficientnet_b0, resnet50, convnext_tiny,
vit-b16, bert-base, gpt2, llama-1024, resnet50@32 (batch 32); any other
torchvision model by name, timm:NAME for timm's; --held-out runs HELD_OUT
(models no kiln tuning looked at: swin_t, maxvit_t, regnet_y_800mf,
resnext50_32x4d, densenet121, efficientnet_v2_s, timm's DeiT-S and
PoolFormer-S12, BERT-base at batch 8). With --out,
models.json and MODELS.md go to DIR (else bench/). --from-json writes
MODELS.md from the models.json of runs split across calls (same GPU and
driver; needs no torch): a later file's row of a model replaces an earlier
one's, and MODELS.md says which kiln commit and date each row measured
(each run records its commit: $KILN_COMMIT, else git's).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("KILN_BUILD", ROOT / "build"))
sys.path.insert(0, str(ROOT / "tests" / "models"))
torch = export = run = None  # imported by main() when it benchmarks (not for --from-json)

VULKAN_LIB = os.environ.get("KILN_VULKAN_LIB", "-lvulkan")
MODELS = ["mobilenet_v3_large", "efficientnet_b0", "resnet50", "convnext_tiny", "vit-b16",
          "bert-base", "gpt2", "llama-1024", "resnet50@32"]
# --held-out: families the list above does not cover (issue 64): windowed
# attention, a conv-attention hybrid, grouped convolutions, dense blocks,
# EfficientNetV2, a small ViT and a metaformer (timm's), an encoder at
# batch 8. Not tuned on: run them before saying a speed goal holds.
HELD_OUT = ["swin_t", "maxvit_t", "regnet_y_800mf", "resnext50_32x4d", "densenet121",
            "efficientnet_v2_s", "timm:deit_small_patch16_224", "timm:poolformer_s12",
            "bert-base@8"]


def sh(cmd, cwd=None, env=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{Path(str(cmd[0])).name} failed ({r.returncode}):\n"
                           f"{(r.stdout + r.stderr)[-3000:]}")
    return r.stdout + r.stderr


def wall_us(fn, runs):
    """Median wall time of fn() in microseconds after 0.3 s of warm-up
    (bench/run.py's)."""
    return run.wall_us(fn, runs, warmup_s=0.3)


def model_and_inputs(name):
    """(module, inputs) of a benchmark NAME (NAME@B: batch B): a name of
    tests/models/export.py's full models (transformers' four, or any of
    torchvision's), or timm:NAME (timm's, random weights and norm
    statistics, one 224 x 224 image)."""
    base, _, batch = name.partition("@")
    if base.startswith("timm:"):
        import timm
        torch.manual_seed(0)
        module = export.randomize_norms(timm.create_model(base[5:], pretrained=False), 1).eval()
        specs = [((1, 3, 224, 224), np.float32, None)]
    else:
        module, specs, _ = export.full_model(base)
    if batch:
        specs = [((int(batch),) + tuple(shape[1:]), dt, high) for shape, dt, high in specs]
    return module, export.make_inputs(specs)


def kiln_build(wd, onnx_path, env=None, flags=()):
    """Compiles the model (kiln in env, default this process's; with
    flags); builds bench.c and run_model with it."""
    t0 = time.monotonic()
    log = sh([BUILD / "kiln", "compile", onnx_path, "--name", "model", "-o", wd / "model.c",
              *flags], env=env)
    compile_s = time.monotonic() - t0
    summary = [line for line in log.splitlines() if " dispatches (" in line]
    common = ["-O2", "-std=c99", "-I", ROOT / "runtime"]
    sh(["cc", *common, "-c", "-o", wd / "model.o", wd / "model.c"])
    sh(["cc", *common, "-D_POSIX_C_SOURCE=199309L", "-DKILN_MODEL=model", "-include",
        wd / "model.h", "-o", wd / "bench", ROOT / "bench" / "bench.c", wd / "model.o",
        "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    sh(["cc", "-o", wd / "run_model", wd / "model.o", BUILD / "run_model_test.o", "-L", BUILD,
        "-lkilnrt", VULKAN_LIB, "-lm"])
    inspect = json.loads(sh([BUILD / "kiln", "inspect", onnx_path, "--format", "json", *flags],
                            env=env))
    return (summary or [""])[-1], compile_s, inspect


def kiln_time(wd, inputs, outs_like, runs, out_dtype=np.float32, dims=()):
    """bench.c's timings of the build in wd (and its outputs, as outs_like);
    dims: DIM=V settings of a dynamic build, whose input arrays then hold
    the largest extent's bytes, the run's elements packed first."""
    args = [wd / "bench", "-w", 3, "-W", 300, "-n", runs, *(a for d in dims for a in ("-d", d))]
    for i, x in enumerate(inputs):
        np.ascontiguousarray(x).tofile(wd / f"in{i}.bin")
        args += ["-i", wd / f"in{i}.bin"]
    for i in range(len(outs_like)):
        args += ["-o", wd / f"out{i}.bin"]
    res = json.loads(sh(args, cwd=wd).strip().splitlines()[-1])
    outs = [np.fromfile(wd / f"out{i}.bin", out_dtype).reshape(o.shape).astype(np.float32)
            for i, o in enumerate(outs_like)]
    return res, outs


def recorded(inspect):
    """The dispatches one device records: the most over every set of
    device features (a cooperative-matrix kernel and its fallback are both
    listed, one runs)."""
    s = inspect["summary"]
    return s.get("most_on_one_device", s["dispatches"])


def slowest(wd, inspect, inputs, runs=20, top=5):
    """kiln's slowest dispatches: (us, node, family, TFLOP/s, GB/s)."""
    args = [wd / "run_model", "-q", "-n", runs, "-p", wd / "prof.json"]
    for i in range(len(inputs)):
        args += ["-i", wd / f"in{i}.bin"]
    sh(args, cwd=wd)
    prof = json.loads((wd / "prof.json").read_text())
    rows = []
    for p, d in zip(prof["dispatches"], inspect["dispatches"]):
        us = p["us"]
        rows.append((us, d["node"], d["family"], p["flops"] / us / 1e6 if us else 0,
                     p["bytes"] / us / 1e3 if us else 0))
    rows.sort(key=lambda r: -r[0])
    if KEEP:  # every dispatch, slowest first
        with open(KEEP / f"{wd.parent.name if wd.name == 'f16' else ''}{wd.name}.tsv", "w") as f:
            f.write("us\tnode\tfamily\tTFLOP/s\tGB/s\n")
            f.writelines("\t".join(str(round(v, 2) if isinstance(v, float) else v) for v in r)
                         + "\n" for r in rows)
    return prof["total_us"], rows[:top]


COMPILE_MODES = ("max-autotune", "reduce-overhead")
MODES = list(COMPILE_MODES)  # --compile-modes


def torch_times(module, inputs, runs, compile_modes=()):
    """Median host-to-host latency (us) of torch eager, a CUDA graph and
    torch.compile in each of compile_modes (compiled_MODE_us, MODE with
    "_" for "-"; compile_MODE_s its first calls): the inputs copied from
    pinned host memory into the device tensors the model or graph reads,
    the output copied back to pinned host memory, then a synchronize."""
    dev = torch.device("cuda")
    m = module.to(dev).eval()
    host = [torch.from_numpy(x).pin_memory() for x in inputs]
    static = [h.to(dev) for h in host]
    with torch.no_grad():
        out_host = torch.empty_like(m(*static), device="cpu").pin_memory()
    res = {}

    def timed(fn):
        def once():
            for d, h in zip(static, host):
                d.copy_(h, non_blocking=True)
            out_host.copy_(fn(), non_blocking=True)
            torch.cuda.synchronize()
        return wall_us(once, runs)
    with torch.no_grad():
        res["eager_us"] = timed(lambda: m(*static))
        g, out = run.cuda_graph(m, *static)
        res["graph_us"] = timed(lambda: (g.replay(), out)[1])
        for mode in compile_modes:
            key = mode.replace("-", "_")
            torch._dynamo.reset()
            cm = torch.compile(m, mode=mode)
            t0 = time.monotonic()
            for _ in range(3):  # compiles, then (reduce-overhead) records its graph
                cm(*static)
            torch.cuda.synchronize()
            res[f"compile_{key}_s"] = round(time.monotonic() - t0, 1)
            res[f"compiled_{key}_us"] = timed(lambda: cm(*static))
    m.to("cpu")
    torch.cuda.empty_cache()
    return res


def fastest_torch(row, prefix=""):
    """The fastest of torch's timed ways in row (the CUDA graph and each
    torch.compile mode), with prefix "f16_" the f16 ones: (us, name)."""
    ways = [(row[prefix + "graph_us"], "CUDA graph")]
    ways += [(v, "torch.compile " + k[len(prefix) + 9:-3].replace("_", "-"))
             for k, v in row.items()
             if k.startswith(prefix + "compiled_") and k.endswith("_us") and v]
    return min(ways)


def compile_modes_in(rows, prefix):
    """The torch.compile modes timed in rows ("" for an older run's default
    mode), with prefix "f16_" the f16 ones."""
    return sorted({k[len(prefix) + 9:-3] for r in rows for k in r
                   if k.startswith(prefix + "compiled_") and k.endswith("_us")})


def compile_head(rows, prefix):
    """MODELS.md's torch.compile columns (none where none was timed): a
    column a mode, then kiln against the fastest of torch's ways."""
    modes = compile_modes_in(rows, prefix)
    if not modes:
        return ""
    return "".join(f" torch.compile {m.replace('_', '-') or 'default'} ms |" for m in modes) + \
        " fastest torch | kiln speed / fastest torch |"


def compile_rule(rows, prefix):
    n = len(compile_modes_in(rows, prefix))
    return " --- |" * (n + 2) if n else ""


def compile_cells(rows, r, prefix):
    modes = compile_modes_in(rows, prefix)
    if not modes:
        return ""
    key = "kiln_f16_vs_fastest" if prefix else "kiln_vs_fastest"
    kiln = "kiln_f16_wall_us" if prefix else "kiln_wall_us"
    cells = "".join(f" {ms(r.get(f'{prefix}compiled_{m}_us' if m else prefix + 'compiled_us'))} |"
                    for m in modes)
    return cells + (f" {r[prefix + 'fastest_torch']} | {speed(r, key, kiln)} |"
                    if key in r else " | |")


KEEP = None  # --keep: where every dispatch's profile goes

# docs/cli.md, "Precision": --precision f16 against the f32 reference
F16_BOUND = 1e-2


def bench_f16(row, module, inputs, ort_outs, runs, wd, onnx_path, io_f16=False,
              compile_modes=()):
    """The f16 columns: kiln --precision f16 checked against onnxruntime's
    f32 outputs, then timed against torch's f16 module; with io_f16, kiln
    --io f16 takes the float inputs and gives the outputs in f16, as the
    torch module does."""
    wd.mkdir()
    flags = ("--precision", "f16") + (("--io", "f16") if io_f16 else ())
    summary, _, inspect = kiln_build(wd, onnx_path, flags=flags)
    feed = [x.astype(np.float16) if io_f16 and x.dtype == np.float32 else x for x in inputs]
    res, got = kiln_time(wd, feed, ort_outs, runs, np.float16 if io_f16 else np.float32)
    row["f16_io"] = io_f16
    err = max(float(np.abs(g - a).max() / max(np.abs(a).max(), 1e-30))
              for g, a in zip(got, ort_outs))
    row.update(f16_dispatches=recorded(inspect),
               f16_barriers=inspect["summary"]["barriers"], f16_rel_err=err,
               f16_checked=err <= F16_BOUND)
    if not row["f16_checked"]:
        return
    row.update(kiln_f16_wall_us=res["mapped_us"], kiln_f16_copy_us=res["wall_us"],
               kiln_f16_gpu_us=res["gpu_us"])
    total, top = slowest(wd, inspect, feed)
    row["f16_profile_total_us"] = total
    row["f16_slowest"] = [{"us": round(u, 1), "node": n, "family": f, "tflops": round(t, 2),
                           "gbs": round(b, 1)} for u, n, f, t, b in top]
    half = [x.astype(np.float16) if x.dtype == np.float32 else x for x in inputs]
    t = torch_times(module.half(), half, runs, compile_modes)
    row.update({f"f16_{k}": v for k, v in t.items()})
    row["kiln_f16_vs_graph"] = t["graph_us"] / res["mapped_us"]
    us, way = fastest_torch(row, "f16_")
    row.update(f16_fastest_torch=way, kiln_f16_vs_fastest=us / res["mapped_us"])


def bench_one(name, runs, compile_too, wd, f16=False, io_f16=False):
    module, inputs = model_and_inputs(name)
    onnx_path = wd / "model.onnx"
    t0 = time.monotonic()
    kw = dict(dynamo=True, opset_version=20, external_data=False)
    ort_outs, torch_outs = export.export(module, inputs, onnx_path, kw)
    row = {"model": name, "export_s": round(time.monotonic() - t0, 1)}
    summary, compile_s, inspect = kiln_build(wd, onnx_path)
    row.update(kiln_compile=summary, compile_s=round(compile_s, 2),
               dispatches=recorded(inspect),
               barriers=inspect["summary"]["barriers"],
               arena_bytes=inspect["summary"]["arena_bytes"],
               arena_lower_bound=inspect["summary"]["peak_live_bytes"])
    res, got = kiln_time(wd, inputs, ort_outs, runs)
    diffs, ok = [], True
    for g, a in zip(got, ort_outs):
        ok &= not bool((np.abs(g - a) > 1e-4 + 1e-3 * np.abs(a)).any())
        diffs.append(float(np.abs(g - a).max()))
    row.update(max_abs_vs_ort=max(diffs), ort_vs_torch=max(
        float(np.abs(a - b).max()) for a, b in zip(ort_outs, torch_outs)), checked=ok)
    if not ok:
        return row
    row.update(kiln_wall_us=res["mapped_us"], kiln_copy_us=res["wall_us"],
               kiln_gpu_us=res["gpu_us"],
               create_ms=round(res["create_us"] / 1000, 1))
    total, top = slowest(wd, inspect, inputs)
    row["profile_total_us"] = total
    row["slowest"] = [{"us": round(u, 1), "node": n, "family": f, "tflops": round(t, 2),
                       "gbs": round(b, 1)} for u, n, f, t, b in top]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    modes = tuple(MODES) if compile_too else ()
    row.update(torch_times(module, inputs, runs, modes if compile_too == "all" else ()))
    row["kiln_vs_graph"] = row["graph_us"] / row["kiln_wall_us"]
    row["kiln_vs_eager"] = row["eager_us"] / row["kiln_wall_us"]
    us, way = fastest_torch(row)
    row.update(fastest_torch=way, kiln_vs_fastest=us / row["kiln_wall_us"])
    if f16:
        bench_f16(row, module, inputs, ort_outs, runs, wd / "f16", onnx_path, io_f16, modes)
    return row


def kiln_commit():
    """The kiln commit measured: $KILN_COMMIT (a copy of the tree without
    its history), else git's."""
    if os.environ.get("KILN_COMMIT"):
        return os.environ["KILN_COMMIT"]
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                       cwd=ROOT)
    return r.stdout.strip() or "unknown"


def ms(us):
    return f"{us / 1000:.2f}" if us else "-"


def speed(r, key, wall):
    """A speed column: from the in-place time, or marked as from the
    caller's buffers (a row from before the in-place times)."""
    return f"{r[key]:.2f}" + ("" if wall in r else " (user buffers)")


def runs_line(rows, env):
    """Which kiln commit and date each row measured, where they differ."""
    groups = {}
    for r in rows:
        groups.setdefault((r.get("kiln", env.get("kiln", "unrecorded")),
                           r.get("date", env["date"])), []).append(r["model"])
    if len(groups) < 2:
        k = next(iter(groups))[0] if groups else env.get("kiln", "unrecorded")
        return [f"kiln {k}.", ""]
    return ["Rows by run: " + "; ".join(f"kiln {k} on {d}: {', '.join(m)}"
                                        for (k, d), m in groups.items()) + ".", ""]


def write_md(rows, out, env):
    lines = [
        "# kiln on real models, against PyTorch",
        "",
        "Written by `bench/models.py` (do not edit): each model with random weights,",
        "exported by `torch.onnx.export` (dynamo, opset 20), compiled by kiln unchanged,",
        "its outputs checked against onnxruntime (atol 1e-4 + rtol 1e-3) before timing.",
        "Latency of one inference from host memory to host memory, median of "
        f"{env['runs']} runs:",
        "torch copies its inputs in from pinned host memory and its output back to pinned",
        "memory; kiln ms is the same work (`kiln_model_run_mapped`, the tensors in kiln's",
        "mapped staging memory), \"user buffers\" kiln_model_run's (the caller's pageable",
        "memory, a memcpy each way). kiln GPU: the sum of its dispatches' GPU times;",
        "speed = torch CUDA graph ms / kiln ms (above 1: kiln faster). f32, TF32 off in torch.",
        "",
        f"{env['date']}, {env['gpu']}, driver {env['driver']}, PyTorch {env['torch']}, "
        f"onnxruntime {env['ort']}" + (f"; the models in {env['calls']} runs of the script, "
                                       "each on a machine of this GPU and driver."
                                       if env.get("calls", 1) > 1 else "."),
        "",
        *runs_line(rows, env),
        "| model | dispatches (barriers) | max \\|kiln - ort\\| | kiln ms | "
        "kiln ms, user buffers | kiln GPU ms | "
        "torch eager ms | torch CUDA graph ms | kiln speed / graph |"
        + compile_head(rows, ""),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + compile_rule(rows, ""),
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error'][:200]} | | | | | | | |")
            continue
        if not r["checked"]:
            lines.append(f"| {r['model']} | {r['dispatches']} ({r['barriers']}) | "
                         f"{r['max_abs_vs_ort']:.3g} OFF | not timed | | | | | |")
            continue
        lines.append(
            f"| {r['model']} | {r['dispatches']} ({r['barriers']}) | {r['max_abs_vs_ort']:.2g} | "
            f"{ms(r.get('kiln_wall_us'))} | {ms(r.get('kiln_copy_us'))} | {ms(r['kiln_gpu_us'])} | "
            f"{ms(r['eager_us'])} | "
            f"{ms(r['graph_us'])} | {speed(r, 'kiln_vs_graph', 'kiln_wall_us')} |"
            + compile_cells(rows, r, ""))
    f16 = [r for r in rows if "f16_checked" in r]
    if f16:
        lines += ["", "## Half precision", "",
                  "kiln compiled with `--precision f16` (docs/cli.md, \"Precision\"), its "
                  "outputs checked",
                  f"against onnxruntime's f32 ones (max |error| <= {F16_BOUND} max "
                  "|reference|), against torch",
                  "with the module and its float inputs in f16; speed = torch f16 CUDA graph "
                  "ms / kiln f16 ms.", "",
                  "| model | dispatches (barriers) | error / max \\|ort\\| | kiln f16 ms | "
                  "kiln f16 ms, user buffers | kiln f16 GPU ms | kiln f32 ms | "
                  "torch f16 eager ms | torch f16 CUDA graph ms | kiln f16 speed / f16 graph |"
                  + compile_head(f16, "f16_"),
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
                  + compile_rule(f16, "f16_")]
        for r in f16:
            head = (f"| {r['model']}{' (--io f16)' if r.get('f16_io') else ''} | "
                    f"{r['f16_dispatches']} ({r['f16_barriers']}) | "
                    f"{r['f16_rel_err']:.2g}")
            if not r["f16_checked"]:
                lines.append(head + " OFF | not timed | | | | | | |")
                continue
            lines.append(head + f" | {ms(r.get('kiln_f16_wall_us'))} | "
                         f"{ms(r.get('kiln_f16_copy_us'))} | {ms(r['kiln_f16_gpu_us'])} | "
                         f"{ms(r.get('kiln_wall_us', r.get('kiln_copy_us')))} | "
                         f"{ms(r['f16_eager_us'])} | "
                         f"{ms(r['f16_graph_us'])} | "
                         f"{speed(r, 'kiln_f16_vs_graph', 'kiln_f16_wall_us')} |"
                         + compile_cells(f16, r, "f16_"))
    lines += ["", "## Memory", "",
              "kiln's arena against its lower bound (the peak of live bytes at any dispatch):",
              "", "| model | arena MiB | lower bound MiB | over |", "| --- | --- | --- | --- |"]
    for r in rows:
        if "arena_bytes" in r:
            a, lb = r["arena_bytes"], r["arena_lower_bound"]
            lines.append(f"| {r['model']} | {a / 2**20:.1f} | {lb / 2**20:.1f} | "
                         f"{100.0 * (a - lb) / lb if lb else 0:.1f}% |")
    lines += ["", "## Where kiln's time goes", "",
              "The five slowest dispatches of each model (`run_model -p`, mean of 20 runs):",
              "GPU microseconds, and what the compiler's counts of operations and bytes give.",
              ""]
    for r in rows:
        for key, what, total, count in [
                ("slowest", "", "profile_total_us", "dispatches"),
                ("f16_slowest", ", --precision f16", "f16_profile_total_us", "f16_dispatches")]:
            if not r.get(key):
                continue
            lines += [f"**{r['model']}{what}** ({ms(r[total])} ms of GPU time in "
                      f"{r[count]} dispatches)", "",
                      "| us | node | kernel | TFLOP/s | GB/s |", "| --- | --- | --- | --- | --- |"]
            for s in r[key]:
                lines.append(f"| {s['us']} | {s['node'][:70]} | {s['family']} | {s['tflops']} "
                             f"| {s['gbs']} |")
            lines.append("")
    (out / "MODELS.md").write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--held-out", action="store_true", help="the models of HELD_OUT")
    ap.add_argument("--compile", nargs="?", const="all", choices=["all", "f16"],
                    help="also time torch.compile (max-autotune and reduce-overhead); "
                    "--compile f16: in f16 only (half the compile time)")
    ap.add_argument("--compile-modes", default=",".join(COMPILE_MODES),
                    help="with --compile: the torch.compile modes, comma-separated "
                    "(max-autotune compiles 1.5-3 minutes a held-out model on an H100)")
    ap.add_argument("--f16", action="store_true",
                    help="also kiln --precision f16 against torch in f16")
    ap.add_argument("--io-f16", action="store_true",
                    help="with --f16: kiln --io f16 (inputs and outputs in f16, as torch's)")
    ap.add_argument("--out", default=str(ROOT / "bench"))
    ap.add_argument("--from-json", nargs="+", metavar="JSON")
    ap.add_argument("--keep", metavar="DIR",
                    help="write every dispatch's profile to DIR/MODEL.tsv (MODELf16.tsv)")
    a = ap.parse_args()
    global KEEP, MODES
    MODES = [m for m in a.compile_modes.split(",") if m]
    bad = [m for m in MODES if m not in COMPILE_MODES]
    if bad:
        ap.error(f"--compile-modes: unknown {', '.join(bad)} (of {', '.join(COMPILE_MODES)})")
    KEEP = Path(a.keep) if a.keep else None
    if KEEP:
        KEEP.mkdir(parents=True, exist_ok=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.from_json:
        runs = [json.loads(Path(p).read_text()) for p in a.from_json]
        # a later run's row of a model replaces an earlier one's; each row
        # keeps the kiln commit and date of its run
        by_model = {}
        for rec in runs:
            for r in rec["rows"]:
                r.setdefault("kiln", rec["env"].get("kiln", "unrecorded"))
                r.setdefault("date", rec["env"]["date"])
                # a row from before the in-place times: its kiln ms (and the
                # speed from it) went through the caller's buffers
                for k in ("", "_f16"):
                    if f"kiln{k}_wall_us" in r and f"kiln{k}_copy_us" not in r:
                        r[f"kiln{k}_copy_us"] = r.pop(f"kiln{k}_wall_us")
                by_model[r["model"]] = r
        env, rows = dict(runs[-1]["env"]), list(by_model.values())
        env["calls"] = len({(r["kiln"], r["date"]) for r in rows})  # the runs rows remain of
        order = {m: i for i, m in enumerate(MODELS)}
        rows.sort(key=lambda r: order.get(r["model"], len(order)))
        (out / "models.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
        write_md(rows, out, env)
        return 0
    global torch, export, run
    import torch
    import export  # tests/models/export.py: the models and the exporter calls
    sys.path.insert(0, str(ROOT / "bench"))
    import run  # bench/run.py: its timing and CUDA-graph helpers
    smi = sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    gpu, driver = [s.strip() for s in smi.strip().splitlines()[0].split(",")]
    import onnxruntime
    env = {"date": datetime.date.today().isoformat(), "gpu": gpu, "driver": driver,
           "torch": torch.__version__, "ort": onnxruntime.__version__, "runs": a.runs,
           "kiln": kiln_commit()}
    rows = []
    for name in (HELD_OUT if a.held_out else a.only.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                wd = Path(tmp) / name
                wd.mkdir()
                row = bench_one(name, a.runs, a.compile, wd, a.f16, a.io_f16)
            except Exception as e:  # reported in the table, the run goes on
                row = {"model": name, "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        # after each model, so that a run stopped by a time limit keeps them
        (out / "models.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    write_md(rows, out, env)
    return 1 if any("error" in r or not r.get("checked") or r.get("f16_checked") is False
                    for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
