"""test_corpus.py: models that an exporter wrote, against onnxruntime.

Every directory under tests/models/ that holds a model.onnx is a case: the
file exactly as torch.onnx.export wrote it (tests/models/export.py makes
them where PyTorch is), its inputs (input_N.npy) and onnxruntime's outputs
(ort_N.npy; torch's beside them as torch_N.npy). kiln compiles the file
unchanged, the program runs on Vulkan with validation on, and every output
element must be within atol 1e-4 + rtol 1e-3 of onnxruntime's; the output
shapes in the generated header must be the ones onnxruntime gave.

The exported models with depthwise convolutions also run with every
depthwise convolution direct (KILN_DWCONV=0) and every one tiled
(KILN_DWCONV=8,8,8,4), f32 and f16.

Each model is also compiled with --precision f16 (activations and matmul
weights stored in f16) and compared with the same outputs within
F16_TOLERANCE of the largest reference value: every element, max |error| /
max |reference| of its output (docs/cli.md, "Precision"); the dynamo
exporter's opset-20 files also with --io f16 (the f32 inputs given and the
outputs read as f16, the header declaring them so). Each model's arena,
f32 and f16, must be at its lower bound (the peak of live bytes).

tests/models/dynamic/ holds models exported with dynamic axes (export.py
dynamic): a fixed batch of 2 and a dynamic sequence, or a dynamic batch
and sequence with an attention mask. Each is compiled once with --shape
DIM=MIN..MAX for its dims (meta.json names them as the exporter did) and
run by one process at every stored run in turn (runK_input_I.npy at the
dims meta.json lists), each output element against onnxruntime's for that
run (runK_ort_0.npy), f32 and --precision f16.
"""
import json
import re
from pathlib import Path

import numpy as np

from harness import (F16_TOLERANCE, ROOT, assert_close, assert_relative, check, kiln,
                     link_model, precision_compare, registry, run_program)
from test_dynamic import run_built
from test_onnx import check_outputs, declared_outputs

TESTS, case = registry()
MODELS = ROOT / "tests" / "models"


def corpus_case(d, precision="f32", io="f32", env=None):
    def test(workdir):
        wd = Path(workdir)
        meta = json.loads((d / "meta.json").read_text())
        inputs = [np.load(p) for p in sorted(d.glob("input_*.npy"))]
        want = [np.load(p) for p in sorted(d.glob("ort_*.npy"))]
        check(inputs and want, f"{d}: no inputs or no reference outputs")
        r = kiln("compile", d / "model.onnx", "--name", "model", "-o", wd / "model.c", "--guard",
                 "--precision", precision, *(("--io", io) if io != "f32" else ()), env=env)
        check(r.returncode == 0, f"kiln compile failed ({meta['exporter']} exporter, opset "
              f"{meta['opset']}):\n{r.stderr}")
        if env and "KILN_DWCONV" in env:
            tiles = "DW_TILE 1" in (wd / "model.c").read_text()
            check(tiles == (env["KILN_DWCONV"] != "0"),
                  f"tiled depthwise kernel {'present' if tiles else 'absent'}")
        names = list(declared_outputs(wd / "model.h"))
        check_outputs(wd, names, want)
        if io == "f16":  # f32 inputs and outputs f16, as the header says
            dts = declared_dtypes(wd / "model.h")
            was = [x.dtype for x in inputs] + [w.dtype for w in want]
            check(dts == ["f16" if w == np.float32 else np.dtype(w).name for w in was],
                  f"declared dtypes {dts}, the reference's {[str(w) for w in was]}")
            inputs = [x.astype(np.float16) if x.dtype == np.float32 else x for x in inputs]
            got = run_program(link_model(wd), inputs,
                              [w.astype(np.float16) if w.dtype == np.float32 else w
                               for w in want])
            got = [g.astype(np.float32) if g.dtype == np.float16 else g for g in got]
        else:
            got = run_program(link_model(wd), inputs, want)
        for i, (g, w) in enumerate(zip(got, want)):
            if precision == "f16":
                assert_relative(g, w, F16_TOLERANCE, f"output {i} ({names[i]})")
            else:
                assert_close(g, w, 1e-3, 1e-4, f"output {i} ({names[i]})")
    return test


def declared_dtypes(header):
    """Each input's, then each output's dtype as the header declares it
    ("f16", "i64", ...), with numpy's names for the others ("int64")."""
    text = Path(header).read_text()
    part = text[text.index(" * Inputs:"):text.index("*/")]
    names = {"f32": "float32", "i64": "int64", "i32": "int32", "u8": "uint8", "i8": "int8",
             "bool": "bool"}
    return [names.get(d, d) for d in re.findall(r"\[\d+\] \S+: (\w+) \[", part)]


def recorded(dispatches, features):
    """How many of inspect's dispatches a device with the KILN_FEATURE_*
    bits `features` records (it has every bit of needs and lacks one of
    unless: the runtime's rule; the others are variants for other
    devices)."""
    return sum(1 for d in dispatches if d["needs"] & ~features == 0 and
               (d["unless"] == 0 or d["unless"] & ~features != 0))


def recorded_pairs(a, b):
    """(features, dispatches a records, dispatches b records) for every
    combination of the feature bits that either build's dispatches name."""
    bits = 0
    for x in a + b:
        bits |= x["needs"] | x["unless"]
    return [(f, recorded(a, f), recorded(b, f)) for f in range(bits + 1) if f & ~bits == 0]


# The f16 builds that still record more dispatches than f32, each by the
# casts it needs today (docs/performance.md, "f16 dispatch counts"): an f32
# model input read by a product (its kernels read f16 A), RoiAlign's
# kernel (f32 only: its input's cast; the flatten before it, read only as
# f32, is stored f32), an LSTM's weights seen through views (29 casts to
# f16 for its gemms, each once) and 7 step slices cast to f32 for a gemm's
# C (the other steps' inputs, read only as f32, are stored f32). A fix
# lowers the count; the test then asks for the new one.
EXTRA_F16_DISPATCHES = {"einsum_block": 3, "roi_head": 1, "rnn_block": 37}


def arena_case(d):
    """The arena at its lower bound (the peak of live bytes at any
    dispatch), f32 and --precision f16, as kiln compile reports them (no
    guard bands: those the other cases add widen both); and the f16 build
    records no more dispatches than the f32 build on any device: every
    combination of the features either build's dispatches name."""
    def test(workdir):
        builds = {}
        for flags in ((), ("--precision", "f16")):
            r = kiln("compile", d / "model.onnx", "-o", Path(workdir) / "a.c", *flags)
            check(r.returncode == 0, f"kiln compile {' '.join(flags)} failed:\n{r.stderr}")
            m = re.search(r"arena (\d+) bytes \(lower bound (\d+)\)", r.stdout + r.stderr)
            check(m, f"no arena line in:\n{r.stdout + r.stderr}")
            check(m.group(1) == m.group(2),
                  f"{' '.join(flags) or 'f32'}: arena {m.group(1)} bytes, lower bound "
                  f"{m.group(2)}")
            r = kiln("inspect", d / "model.onnx", "--format", "json", *flags)
            check(r.returncode == 0, f"kiln inspect {' '.join(flags)} failed:\n{r.stderr}")
            builds[flags[-1] if flags else "f32"] = json.loads(r.stdout)["dispatches"]
        extra = EXTRA_F16_DISPATCHES.get(d.name.rsplit("_", 1)[0], 0)
        casts = [x['node'] for x in builds['f16'] if '/to_f' in x['node']][:6]
        for feats, n32, n16 in recorded_pairs(builds["f32"], builds["f16"]):
            check(n16 - n32 == extra if extra else n16 <= n32,
                  f"features {feats:#x}: f16 records {n16} dispatches, f32 {n32} (expected "
                  f"{extra} more): {casts}")
    return test


for _d in sorted(p.parent for p in MODELS.glob("*/model.onnx")):
    case(f"corpus: {_d.name}")(corpus_case(_d))
    case(f"corpus arena at its lower bound, f16 no more dispatches than f32: {_d.name}")(
        arena_case(_d))
    case(f"corpus f16: {_d.name}")(corpus_case(_d, "f16"))
    if _d.name.endswith("_dynamo20"):
        case(f"corpus f16 --io f16: {_d.name}")(corpus_case(_d, "f16", "f16"))
# conv.comp's depthwise paths on the exported models with depthwise
# convolutions: the default tiles them at unit strides; KILN_DWCONV=0 keeps
# them all direct, 8,8,8,4 tiles every one (strides of 2 too) with four
# outputs an invocation
for _name in ("efficientnet_tiny_dynamo20", "mobilenet_v3_small_dynamo20",
              "shufflenet_tiny_dynamo20"):
    for _prec in ("f32", "f16"):
        for _tile in ("0", "8,8,8,4"):
            case(f"corpus{' f16' if _prec == 'f16' else ''} KILN_DWCONV={_tile}: {_name}")(
                corpus_case(MODELS / _name, _prec, env={"KILN_DWCONV": _tile}))


def half_case(d, precision):
    """tests/models/half/NAME: NAME's model with f16 weights, inputs and
    outputs (as model.half() exports it; tests/models/half.py), against
    NAME's stored torch outputs, within the f16 bound; its inputs in f16."""
    def test(workdir):
        wd = Path(workdir)
        src = MODELS / json.loads((d / "meta.json").read_text())["source"]
        inputs = [np.load(p) for p in sorted(src.glob("input_*.npy"))]
        want = [np.load(p) for p in sorted(src.glob("torch_*.npy"))]
        check(inputs and want, f"{src}: no inputs or no reference outputs")
        r = kiln("compile", d / "model.onnx", "--name", "model", "-o", wd / "model.c", "--guard",
                 *(("--precision", precision) if precision else ()))
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        names = list(declared_outputs(wd / "model.h"))
        dts = declared_dtypes(wd / "model.h")
        half = [x.astype(np.float16) if x.dtype == np.float32 else x for x in inputs]
        out16 = [w.astype(np.float16) if w.dtype == np.float32 else w for w in want]
        check(dts == ["f16" if a.dtype == np.float16 else np.dtype(a.dtype).name
                     for a in half + out16],
              f"declared dtypes {dts}, expected the model's f16 inputs and outputs")
        got = run_program(link_model(wd), half, out16)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_relative(g.astype(np.float32) if g.dtype == np.float16 else g, w,
                            F16_TOLERANCE, f"output {i} ({names[i]})")
    return test


# The f16 models whose f32-only ops (RoiAlign, GridSample: their kernels
# compute in f32) read casts of their f16 inputs and cast their results
# back: the casts they record beyond their source's --precision f16 build.
EXTRA_HALF_DISPATCHES = {"roi_head": 2, "stn": 3}


def half_dispatch_case(d):
    """An f16 model fuses as its f32 source does: on every combination of
    the features either build names, it records no more dispatches than
    the source compiled with --precision f16 (but the casts above)."""
    def test(workdir):
        src = MODELS / json.loads((d / "meta.json").read_text())["source"]
        builds = []
        for path, flags in ((src, ("--precision", "f16")), (d, ())):
            r = kiln("inspect", path / "model.onnx", "--format", "json", *flags)
            check(r.returncode == 0, f"kiln inspect {path} failed:\n{r.stderr}")
            builds.append(json.loads(r.stdout)["dispatches"])
        extra = EXTRA_HALF_DISPATCHES.get(d.name.rsplit("_", 1)[0], 0)
        for feats, n32, n16 in recorded_pairs(*builds):
            check(n16 - n32 == extra if extra else n16 <= n32,
                  f"features {feats:#x}: the f16 model records {n16} dispatches, its source "
                  f"at --precision f16 {n32} (expected {extra} more)")
    return test


for _d in sorted(p.parent for p in (MODELS / "half").glob("*/model.onnx")):
    case(f"corpus f16 model: {_d.name}")(half_case(_d, None))
    case(f"corpus f16 model --precision f16: {_d.name}")(half_case(_d, "f16"))
    case(f"corpus f16 model no more dispatches than its source in f16: {_d.name}")(
        half_dispatch_case(_d))


def shape_flags(meta):
    """--shape DIM=MIN..MAX for each of a dynamic corpus model's dims."""
    return [a for dim, (lo, hi) in meta["dims"].items() for a in ("--shape", f"{dim}={lo}..{hi}")]


def dynamic_case(d, precision):
    """One build at --shape DIM=MIN..MAX for each dim, every stored run
    (its dims' values, its inputs, onnxruntime's output) in turn by one
    process."""
    def test(workdir):
        wd = Path(workdir)
        meta = json.loads((d / "meta.json").read_text())
        flags = shape_flags(meta)
        r = kiln("compile", d / "model.onnx", "--name", "model", "-o", wd / "model.c", "--guard",
                 "--precision", precision, *flags)
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        runs = meta["runs"]
        nin = len(list(d.glob("run0_input_*.npy")))
        nout = len(list(d.glob("run0_ort_*.npy")))
        data = [([np.load(d / f"run{k}_input_{i}.npy") for i in range(nin)],
                 [np.load(d / f"run{k}_ort_{j}.npy") for j in range(nout)])
                for k in range(len(runs))]
        compare = precision_compare(precision == "f16", 1e-3, 1e-4)
        step = iter(range(len(runs)))
        current = {}

        def inputs(rng, **dims):
            current["k"] = next(step)
            check(dims == runs[current["k"]], f"run {current['k']}: dims {dims}")
            return data[current["k"]][0]
        run_built(link_model(wd), runs, inputs, lambda *xs, **dims: data[current["k"]][1],
                  compare=compare)
    return test


def runs_text(meta):
    return ", ".join("x".join(str(v) for v in run.values()) for run in meta["runs"])


for _d in sorted(p.parent for p in (MODELS / "dynamic").glob("*/model.onnx")):
    _meta = json.loads((_d / "meta.json").read_text())
    for _prec in ("f32", "f16"):
        case(f"corpus dynamic{' f16' if _prec == 'f16' else ''}: {_d.name}, "
             f"{' x '.join(_meta['dims'])} at {runs_text(_meta)}")(dynamic_case(_d, _prec))
# transformers models exported by a plain torch.onnx.export with dynamic_shapes
# (export.py plain), every output at the smallest, a middle and the largest size
for _d in sorted(p.parent for p in (MODELS / "plain").glob("*/model.onnx")):
    _meta = json.loads((_d / "meta.json").read_text())
    for _prec in ("f32", "f16"):
        case(f"corpus plain dynamic_shapes export{' f16' if _prec == 'f16' else ''}: "
             f"{_d.name}, {' x '.join(_meta['dims'])} at {runs_text(_meta)}")(
                 dynamic_case(_d, _prec))


@case("corpus dynamic: attention is one fused kernel in every transformer exported with a "
      "dynamic batch (and sequence) or a batch of 2: the keys' transpose through [b * h, s, "
      "d] and back traced, the batch followed at the run's extent (the runs against "
      "onnxruntime are the cases above)")
def test_dynamic_attention_fused(workdir):
    names = [p.parent for p in sorted((MODELS / "dynamic").glob("*/model.onnx"))
             if re.match(r"(bert|distilbert|roberta|gpt2|llama|qwen2|sentence|vit|whisper)",
                         p.parent.name)]
    check(len(names) >= 10, f"{len(names)} transformers in tests/models/dynamic")
    for d in names:
        meta = json.loads((d / "meta.json").read_text())
        flags = shape_flags(meta)
        r = kiln("inspect", d / "model.onnx", *flags)
        check(r.returncode == 0, f"{d.name}: {r.stderr}")
        kernels = re.findall(r"^\s+\d+\s+.*?\s+k\d+ (\w+)\s+\d+x\d+x\d+", r.stdout, re.M)
        check(kernels, f"{d.name}: no dispatches read from kiln inspect")
        fused = sum(k in ("attention", "flash", "flash_cm") for k in kernels)
        check(fused >= 1 and "softmax" not in kernels,
              f"{d.name} ({', '.join(meta['dims'])}): {fused} fused attention dispatches, "
              f"softmax {'present' if 'softmax' in kernels else 'absent'}")
