#!/usr/bin/env python3
"""run.py: kiln against PyTorch on the same GPU, in one run; writes RESULTS.md.

Runs on a machine with a GPU, kiln built (build/kiln, build/libkilnrt.a)
and PyTorch with CUDA. For every row it writes a kiln model, compiles it,
builds bench/bench.c with it, makes seeded inputs, checks kiln's result
against PyTorch's before timing anything, then times both:

- kernels (memory-bound rows, matmuls): kiln's GPU time from timestamps
  around its dispatches, torch's from CUDA events around its op; medians;
- whole models (samples/*.yaml; the transformer at sequence 16, 128 and
  1): the latency of one inference from host memory to host memory (inputs
  in, compute, outputs out, synchronized), for kiln, torch eager and torch
  replaying a CUDA graph; medians of 1000 inferences after 0.3 s of
  warm-up, the lower of two (one that met the GPU's clocks still low after
  an idle moment, or another process, does not decide).

  bench/run.py [--out DIR] [--quick]     (--quick: small sizes, a smoke test)
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("KILN_BUILD", ROOT / "build"))
sys.path.insert(0, str(ROOT / "tests"))
import interpret  # noqa: E402
import reference as ref  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    DEV = "cuda" if torch.cuda.is_available() else "cpu"
except ImportError:  # a smoke test without torch: kiln only
    torch = None

VULKAN_LIB = os.environ.get("KILN_VULKAN_LIB", "-lvulkan")
MODEL_RUNS = 1000  # timed inferences of a model, after 0.3 s of warm-up


def sh(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {r.stderr[-2000:]}")
    return r.stdout


def build_kiln(wd, yaml_text, name, env=None, flags=()):
    """Compiles a model (env: variables for the compiler; flags: more
    arguments to kiln compile); returns (program, compile seconds cold and
    with a warm kernel cache, inspect summary)."""
    (wd / f"{name}.yaml").write_text(yaml_text)
    cache = wd / f"cache-{name}"  # empty: the first compile is cold
    compile_s = []
    for _ in range(2):
        t0 = time.monotonic()
        sh([BUILD / "kiln", "compile", wd / f"{name}.yaml", "--name", "model", "-o",
            wd / f"{name}.c", "--kernel-cache", cache, *flags], env={**os.environ, **(env or {})})
        compile_s.append(time.monotonic() - t0)
    summary = json.loads(sh([BUILD / "kiln", "inspect", wd / f"{name}.yaml", "--format",
                             "json", *flags]))["summary"]
    prog = wd / name
    sh(["cc", "-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-I", ROOT / "runtime",
        "-DKILN_MODEL=model",
        "-include", wd / f"{name}.h", "-o", prog, ROOT / "bench" / "bench.c", wd / f"{name}.c",
        "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    return prog, compile_s, summary


def run_kiln(wd, prog, inputs, outputs_like, runs, warmup=3, env=None, warmup_ms=0):
    args = [prog, "-w", warmup, "-W", warmup_ms, "-n", runs]
    for i, x in enumerate(inputs):
        np.ascontiguousarray(x).tofile(wd / f"in{i}.bin")
        args += ["-i", wd / f"in{i}.bin"]
    for i in range(len(outputs_like)):
        args += ["-o", wd / f"out{i}.bin"]
    res = json.loads(sh(args, env={**os.environ, **(env or {})}))
    outs = [np.fromfile(wd / f"out{i}.bin", dtype=o.dtype).reshape(o.shape)
            for i, o in enumerate(outputs_like)]
    return res, outs


def cuda_time_us(fn, runs, warmup=3):
    """Median of CUDA-event times of fn()."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def wall_us(fn, runs, warmup=3, warmup_s=0.0):
    """Median wall time of fn(), after warmup calls lasting at least
    warmup_s seconds."""
    t_end = time.perf_counter() + warmup_s
    n = 0
    while n < warmup or time.perf_counter() < t_end:
        fn()
        n += 1
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def cuda_graph(fn, *args):
    """fn(*args) captured in a CUDA graph after three calls on a side stream
    (PyTorch's recipe): (the graph, the outputs its replays overwrite)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    return graph, out


def check_close(name, got, want, tol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
    if not np.isfinite(err) or err > tol:
        raise RuntimeError(f"{name}: kiln differs from torch (relative error {err:.3g})")
    return err


# ---- rows ----

def yaml_model(name, inputs, nodes, outputs):
    return json.dumps({"name": name, "inputs": inputs, "nodes": nodes, "outputs": outputs})


def spec(shape, dtype="f32"):
    return {"dtype": dtype, "shape": list(shape)}


def kernel_rows(quick):
    n = 1 << (20 if quick else 26)  # 256 MiB of f32
    rows = 4096 if quick else 16384
    sizes = [256, 512] if quick else [1024, 2048, 4096, 8192]
    r = np.random.default_rng(0)
    out = []
    x = r.standard_normal(n, dtype=np.float32)
    y = r.standard_normal(n, dtype=np.float32)
    out.append(("copy", f"copy [{n}] f32", yaml_model(
        "copy", {"x": spec([n])}, [{"name": "y", "op": "cast", "inputs": ["x"], "to": "f32"}],
        ["y"]), [x], lambda t: t[0].clone(), lambda t, o: o.copy_(t[0]), 2 * n * 4, 0))
    out.append(("add", f"add [{n}] + [{n}]", yaml_model(
        "add", {"a": spec([n]), "b": spec([n])}, [{"name": "y", "op": "add", "inputs": ["a", "b"]}],
        ["y"]), [x, y], lambda t: t[0] + t[1], lambda t, o: torch.add(t[0], t[1], out=o),
        3 * n * 4, n))
    s = r.standard_normal((rows, 4096), dtype=np.float32)
    out.append(("softmax", f"softmax [{rows}, 4096]", yaml_model(
        "softmax", {"x": spec(s.shape)}, [{"name": "y", "op": "softmax", "inputs": ["x"]}], ["y"]),
        [s], lambda t: torch.softmax(t[0], -1), None, 2 * s.size * 4, 5 * s.size))
    out.append(("layer_norm", f"layer_norm [{rows}, 4096]", yaml_model(
        "layer_norm", {"x": spec(s.shape)}, [{"name": "y", "op": "layer_norm", "inputs": ["x"]}],
        ["y"]), [s], lambda t: F.layer_norm(t[0], (4096,)), None, 2 * s.size * 4, 8 * s.size))
    for m in sizes + ["skinny"]:
        M, K, N = (16, 4096, 4096) if m == "skinny" else (m, m, m)
        if quick and m == "skinny":
            M, K, N = 16, 512, 512
        a = r.standard_normal((M, K), dtype=np.float32)
        b = r.standard_normal((K, N), dtype=np.float32)
        out.append((f"matmul_{M}x{K}x{N}", f"matmul f32 [{M}, {K}] x [{K}, {N}]", yaml_model(
            "mm", {"a": spec(a.shape), "b": spec(b.shape)},
            [{"name": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
            [a, b], lambda t: t[0] @ t[1], None, (M * K + K * N + M * N) * 4, 2 * M * N * K))
    # f16 storage, f32 accumulation: kiln's cooperative-matrix kernel where
    # the device has it, against torch's f16 matmul (cuBLAS, tensor cores)
    for m in ([256, 512] if quick else [2048, 4096, 8192]):
        a = r.standard_normal((m, m), dtype=np.float32).astype(np.float16)
        b = r.standard_normal((m, m), dtype=np.float32).astype(np.float16)
        out.append((f"matmul_f16_{m}", f"matmul f16 [{m}, {m}] x [{m}, {m}]", yaml_model(
            "mm16", {"a": spec(a.shape, "f16"), "b": spec(b.shape, "f16")},
            [{"name": "y", "op": "matmul", "inputs": ["a", "b"]}], ["y"]),
            [a, b], lambda t: t[0] @ t[1], None, 3 * m * m * 2, 2 * m ** 3))
    return out


# ---- whole models in torch, from the YAML (weights from kiln's generator) ----

def torch_model(path):
    import yaml
    model = yaml.safe_load(Path(path).read_text())
    weights = {k: torch.from_numpy(np.ascontiguousarray(interpret.weight(v, Path(path).parent))).to(DEV)
               for k, v in (model.get("weights") or {}).items()}

    def forward(*inputs):
        env = dict(weights)
        env.update(zip(model["inputs"], inputs))
        for n in model["nodes"]:
            a = {k: interpret.number(v) for k, v in n.items()
                 if k not in ("name", "op", "inputs", "outputs")}
            x = [env[i] for i in n["inputs"]]
            op = n["op"]
            if op == "embedding":
                y = F.embedding(x[0].long(), x[1])
            elif op == "matmul":
                y = x[0] @ x[1]
            elif op == "add":
                y = x[0] + x[1]
            elif op == "mul":
                y = x[0] * x[1]
            elif op in ("cos", "sin", "silu", "relu", "gelu"):
                y = {"cos": torch.cos, "sin": torch.sin, "silu": F.silu, "relu": F.relu,
                     "gelu": F.gelu}[op](x[0])
            elif op == "rms_norm":
                y = x[0] * torch.rsqrt(x[0].pow(2).mean(-1, keepdim=True) + a.get("eps", 1e-5))
                y = y * x[1]
            elif op == "softmax":
                y = torch.softmax(x[0], a.get("axis", -1))
            elif op == "reshape":
                y = x[0].reshape(a["shape"])
            elif op == "flatten":
                y = x[0].flatten(a.get("axis", 1))
            elif op == "rope":
                t, c, s = x
                half = t.shape[-1] // 2
                c = c.reshape(1, c.shape[0], 1, half)
                s = s.reshape(1, s.shape[0], 1, half)
                t1, t2 = t[..., :half], t[..., half:]
                y = torch.cat([t1 * c - t2 * s, t2 * c + t1 * s], -1)
            elif op == "attention":
                h, kvh = a["heads"], a.get("kv_heads", a["heads"])
                b, sq, _ = x[0].shape
                q = x[0].reshape(b, sq, h, -1).transpose(1, 2)
                k = x[1].reshape(b, -1, kvh, q.shape[-1]).transpose(1, 2)
                v = x[2].reshape(b, -1, kvh, q.shape[-1]).transpose(1, 2)
                k = k.repeat_interleave(h // kvh, 1)
                v = v.repeat_interleave(h // kvh, 1)
                y = F.scaled_dot_product_attention(q, k, v, is_causal=bool(a.get("causal")))
                y = y.transpose(1, 2).reshape(b, sq, -1)
            elif op == "conv":
                pads = a.get("pads", [0, 0, 0, 0])
                pad = "same" if a.get("auto_pad") == "same_upper" else (pads[0], pads[1])
                y = F.conv2d(x[0], x[1], x[2] if len(x) > 2 else None, padding=pad)
            elif op == "batch_norm":
                y = F.batch_norm(x[0], x[3], x[4], x[1], x[2], False, 0.0, a.get("eps", 1e-5))
            elif op == "max_pool":
                y = F.max_pool2d(x[0], a["kernel"], a.get("strides"))
            elif op == "global_avg_pool":
                y = x[0].mean((2, 3), keepdim=True)
            elif op == "gemm":
                y = x[0] @ x[1] + x[2]
            else:
                raise ValueError(f"op {op} not in the torch interpreter")
            env[n["name"]] = y
        return [env[o] for o in model["outputs"]]
    return model, forward


def transformer_at(seq, wd):
    """samples/transformer.yaml (16 tokens) for seq tokens: the token input,
    the positions and the reshapes; written to wd, returns its path."""
    text = (ROOT / "samples" / "transformer.yaml").read_text()
    text = text.replace("tokens: {dtype: i32, shape: [1, 16]}",
                        f"tokens: {{dtype: i32, shape: [1, {seq}]}}")
    text = re.sub(r"positions: \{dtype: f32, shape: \[16, 1\], values: \[[0-9, ]*\]\}",
                  f"positions: {{dtype: f32, shape: [{seq}, 1], values: "
                  f"[{', '.join(str(i) for i in range(seq))}]}}", text)
    text = text.replace("shape: [1, 16, ", f"shape: [1, {seq}, ")
    path = wd / f"transformer_s{seq}.yaml"
    path.write_text(text)
    return path


def model_rows(quick, wd):
    """(row name, YAML path, inputs) of the whole-model rows."""
    r = np.random.default_rng(1)
    samples = ROOT / "samples"
    rows = [("mlp", samples / "mlp.yaml", [r.standard_normal((4, 256), dtype=np.float32)]),
            ("transformer seq 16", samples / "transformer.yaml",
             [r.integers(0, 64, (1, 16)).astype(np.int32)])]
    for seq in (128, 1):
        rows.append((f"transformer seq {seq}", transformer_at(seq, wd),
                     [r.integers(0, 64, (1, seq)).astype(np.int32)]))
    rows.append(("cnn", samples / "cnn.yaml",
                 [r.standard_normal((1, 3, 32, 32), dtype=np.float32)]))
    return rows


FEATURE_COOPMAT, FEATURE_COOPMAT_WG = 16, 256  # runtime/kiln_rt_tables.h's bits
CEILINGS = {"1": "multiply-adds alone", "2": "+ matrix loads from shared memory",
            "3": "tiles' traffic alone"}


def ceilings(wd, key, yml, inputs, want, runs, wg):
    """The f16 product's cooperative-matrix kernel rebuilt with each
    KILN_COOPMAT_CEILING mode (docs/performance.md): its K steps without
    part of their work, the product not computed (not checked), timed as
    the product was; {mode: us}. Mode 3 is coopmat_wg.comp's alone (wg:
    the device runs it)."""
    out = {}
    for mode in CEILINGS:
        if mode == "3" and not wg:
            continue
        name = f"{key}_ceiling{mode}"
        prog, _, _ = build_kiln(wd, yml, name, env={"KILN_COOPMAT_CEILING": mode})
        kr, _ = run_kiln(wd, prog, inputs, [want.cpu().numpy()], runs)
        out[mode] = kr["gpu_us"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "bench"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    wd = Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    results = {"date": datetime.date.today().isoformat(), "kernels": [], "models": []}
    try:
        smi = sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
        results["gpu"], results["driver"] = [s.strip() for s in smi.strip().split(",")][:2]
    except Exception:
        results["gpu"], results["driver"] = "?", "?"
    results["torch"] = torch.__version__

    copy_gbs = None
    for key, title, yml, inputs, tfn, tout, nbytes, flops in kernel_rows(args.quick):
        prog, compile_s, summary = build_kiln(wd, yml, key)
        tin = [torch.from_numpy(x).to(DEV) for x in inputs]
        want = tfn(tin)
        runs = 5 if "8192" in key else 20
        kr, (got,) = run_kiln(wd, prog, inputs, [want.cpu().numpy()], runs)
        tol = 5e-3 if "f16" in key else 2e-4 if "matmul" in key else 1e-5
        err = check_close(title, got, want.cpu().numpy(), tol)
        if tout is not None:
            o = torch.empty_like(want)
            tus = cuda_time_us(lambda: tout(tin, o), runs)
        else:
            tus = cuda_time_us(lambda: tfn(tin), runs)
        row = {"key": key, "title": title, "kiln_us": kr["gpu_us"], "torch_us": tus,
               "bytes": nbytes, "flops": flops, "rel_error": err, "compile_s": compile_s,
               "create_us": kr["create_us"], "dispatches": kr["dispatches"]}
        if key.startswith("matmul_f16_") and kr.get("features", 0) & FEATURE_COOPMAT:
            row["ceilings"] = ceilings(wd, key, yml, inputs, want, runs,
                                       kr["features"] & FEATURE_COOPMAT_WG)
        if key == "copy":
            copy_gbs = nbytes / kr["gpu_us"] / 1e3
        results["kernels"].append(row)
        print(json.dumps(row), flush=True)
    results["copy_gbs"] = copy_gbs

    for name, path, inputs in model_rows(args.quick, wd):
        prog, compile_s, summary = build_kiln(wd, path.read_text(), name.replace(" ", "_"))
        model, fwd = torch_model(path)
        want = interpret.interpret(path, inputs)
        # The program as built, then with every input and output copied
        # through the arena (the runtime's direct I/O off), twice each,
        # alternating; each the lower of its two medians (one that met the
        # GPU's clocks still low, or another process, does not decide).
        like = [np.asarray(want[0], np.float32)]
        kr, staged = None, None
        for _ in range(2):
            k1, (got,) = run_kiln(wd, prog, inputs, like, MODEL_RUNS, 20, warmup_ms=300)
            err = check_close(name, got, want[0], 2e-3)
            s1, (got_s,) = run_kiln(wd, prog, inputs, like, MODEL_RUNS, 20,
                                    env={"KILN_STAGED_IO": "1"}, warmup_ms=300)
            check_close(name + " (copied I/O)", got_s, want[0], 2e-3)
            kr = k1 if kr is None or k1["wall_us"] < kr["wall_us"] else kr
            staged = s1 if staged is None or s1["wall_us"] < staged["wall_us"] else staged
        host = [torch.from_numpy(x).pin_memory() if DEV == "cuda" else torch.from_numpy(x)
                for x in inputs]
        dev_in = [h.to(DEV) for h in host]
        out_host = torch.empty(got.shape, dtype=torch.float32).pin_memory()

        def eager():
            for d_, h_ in zip(dev_in, host):
                d_.copy_(h_, non_blocking=True)
            out_host.copy_(fwd(*dev_in)[0], non_blocking=True)
            torch.cuda.synchronize()
        eager_us = min(wall_us(eager, MODEL_RUNS, 20, 0.3) for _ in range(2))
        tcheck = check_close(name + " (torch)", out_host.numpy(), want[0], 2e-3)
        graph, static_out = cuda_graph(lambda *a: fwd(*a)[0], *dev_in)

        def graphed():
            for d_, h_ in zip(dev_in, host):
                d_.copy_(h_, non_blocking=True)
            graph.replay()
            out_host.copy_(static_out, non_blocking=True)
            torch.cuda.synchronize()
        graph_us = min(wall_us(graphed, MODEL_RUNS, 20, 0.3) for _ in range(2))
        row = {"key": name, "kiln_us": kr["wall_us"], "kiln_staged_us": staged["wall_us"],
               "kiln_gpu_us": kr["gpu_us"],
               "eager_us": eager_us, "graph_us": graph_us, "dispatches": kr["dispatches"],
               "barriers": kr["barriers"], "rel_error": err, "torch_rel_error": tcheck,
               "compile_s": compile_s, "create_us": kr["create_us"],
               "arena": summary["arena_bytes"], "peak": summary["peak_live_bytes"]}
        results["models"].append(row)
        print(json.dumps(row), flush=True)

    out = Path(args.out)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_markdown(results, out / "RESULTS.md")
    print((out / "RESULTS.md").read_text())


def write_markdown(res, path):
    L = [f"# kiln against PyTorch", "",
         f"Measured {res['date']} on {res['gpu']} (driver {res['driver']}), PyTorch "
         f"{res['torch']}, TF32 off, by `bench/run.py` in one run. Do not edit: rerun it.", "",
         "Every kiln result was checked against PyTorch's before it was timed (relative "
         "error column). Kernel rows: median GPU time (kiln: timestamps around its "
         "dispatches; torch: CUDA events). Model rows: median latency of one inference "
         "from host memory to host memory (kiln's from a model created without "
         f"timestamps), {MODEL_RUNS} inferences after 0.3 s of warm-up, each "
         "figure the lower median of two such measurements (kiln's two variants "
         "alternating); kiln GPU us is the sum of its dispatches' times from a "
         "timestamp after every dispatch, which lengthen the schedule (an upper bound, "
         "above the wall time on NVIDIA).", "",
         "## Kernels", "",
         "| row | kiln us | torch us | kiln / torch speed | kiln GB/s | kiln GFLOP/s | rel. error |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["kernels"]:
        L.append(f"| {r['title']} | {r['kiln_us']:.1f} | {r['torch_us']:.1f} | "
                 f"{r['torch_us'] / r['kiln_us']:.2f} | {r['bytes'] / r['kiln_us'] / 1e3:.0f} | "
                 f"{r['flops'] / r['kiln_us'] / 1e3:.0f} | {r['rel_error']:.1e} |")
    if res.get("copy_gbs"):
        L += ["", f"kiln's copy kernel: {res['copy_gbs']:.0f} GB/s. Memory-bound rows as a "
              "share of it: " + ", ".join(
                  f"{r['key']} {100 * r['bytes'] / r['kiln_us'] / 1e3 / res['copy_gbs']:.0f}%"
                  for r in res["kernels"] if r["key"] in ("add", "softmax", "layer_norm")) + "."]
    cm = [r for r in res["kernels"] if r.get("ceilings")]
    if cm:
        L += ["", "### f16 matmul against the matrix units' rate", "",
              "The same kernel built with `KILN_COOPMAT_CEILING` (docs/performance.md), timed "
              "in the same run: its K steps without part of their work (not the product). "
              "Share = the ceiling's time / the product's time.", "",
              "| row | kiln us | " + " | ".join(f"{m}: {t} us (share)"
                                             for m, t in CEILINGS.items()) + " |",
              "| --- | --- | " + " | ".join("---" for _ in CEILINGS) + " |"]
        for r in cm:
            c = r["ceilings"]
            L.append(f"| {r['title']} | {r['kiln_us']:.1f} | " + " | ".join(
                f"{c[m]:.1f} ({100 * c[m] / r['kiln_us']:.0f}%)" if m in c else "-"
                for m in CEILINGS) + " |")
    L += ["", "## Whole models", "",
          "| model | kiln us | kiln us, I/O copied | torch eager us | torch CUDA graph us "
          "| kiln vs eager | kiln vs graph "
          "| dispatches | barriers | kiln GPU us | us per dispatch | compile s cold / warm | create ms "
          "| arena / peak bytes |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["models"]:
        L.append(f"| {r['key']} | {r['kiln_us']:.1f} | {r['kiln_staged_us']:.1f} | "
                 f"{r['eager_us']:.1f} | {r['graph_us']:.1f} | "
                 f"{r['eager_us'] / r['kiln_us']:.2f}x | {r['graph_us'] / r['kiln_us']:.2f}x | "
                 f"{r['dispatches']} | {r['barriers']} | {r['kiln_gpu_us']:.1f} | "
                 f"{r['kiln_gpu_us'] / max(r['dispatches'], 1):.2f} | "
                 f"{r['compile_s'][0]:.2f} / {r['compile_s'][1]:.3f} | "
                 f"{r['create_us'] / 1e3:.1f} | {r['arena']} / {r['peak']} |")
    L += ["", "Speed ratios above 1 mean kiln is faster. kiln us, I/O copied: the same "
          "program with KILN_STAGED_IO=1 (every input and output copied between staging and "
          "the arena on the device, as before direct I/O). Compile times: cold (an empty "
          "kernel cache: every kernel through shaderc and the optimizer) and warm (the same "
          "model again, its kernels from the cache); create is pipeline creation, buffers, "
          "weight upload and recording (the first create of the process)."]
    path.write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
