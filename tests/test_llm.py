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
reference value. The Llamas also with --precision f16 and fp8 weights,
the codes times A in f16 pairs against the same codes in f32
(quant_steps_case).
"""
import json
import re
import tarfile
from pathlib import Path

import numpy as np

from harness import (BUILD, CC, EXTRA_CFLAGS, F16_TOLERANCE, ROOT, VALIDATION, VULKAN_LIB,
                     assert_close, assert_relative, check, kiln, link_model,
                     precision_compare, registry, run, run_program)
from test_dynamic import run_built

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


# The same decoders compiled once with a dynamic sequence and the cache as
# state (onnx_decoder.c): seq 1..16 new tokens, past 0..72 cached ones. At
# opset 23 RotaryEmbedding and Attention see the heads' layout [1, heads,
# seq, d], dynamic along an inner axis: rewrite.c moves them onto the
# tensors they view.
DYN_SHAPES = ["--shape", "seq=1..16", "--shape", "past=0..72"]
DECODERS = sorted(p.parent for p in LLM.glob("*/model.onnx"))


def step_inputs(d, step):
    return [np.load(d / f"step{step}_in_{n}.npy")
            for n in ("input_ids", "attention_mask", "position_ids")]


def run_two_steps(d, prog, compare):
    """Runs the prompt (seq 8, past 0) then one token (seq 1, past 8) on a
    dynamic build of d in one process, the cache kept on the GPU between
    them; compare(got, want, what) gets each step's logits and
    onnxruntime's."""
    inputs = {(8, 0): step_inputs(d, 0), (1, 8): step_inputs(d, 1)}
    logits = {(8, 0): np.load(d / "step0_out_logits.npy"),
              (1, 8): np.load(d / "step1_out_logits.npy")}
    run_built(prog, [{"seq": 8, "past": 0}, {"seq": 1, "past": 8}],
              lambda rng, seq, past: inputs[seq, past],
              lambda *xs, seq, past: [logits[seq, past]], compare=compare)


def dynamic_steps_case(d, precision, flags=()):
    """The two steps of run_two_steps: every logit against onnxruntime's."""
    def test(workdir):
        wd = Path(workdir)
        r = kiln("compile", d / "model.onnx", "--name", "model", "-o", wd / "model.c",
                 "--precision", precision, *DYN_SHAPES, *flags)
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        run_two_steps(d, link_model(wd), precision_compare(precision == "f16", 1e-3, 1e-5))
    return test


def quant_steps_case(d, fmt, tol):
    """--precision f16 --weights FMT, the two steps of run_two_steps, twice:
    with the codes times A in f16 pairs (A_H2 for fp8, F16_PAIRS for 8- and
    4-bit codes; what a decoder built so runs on a device with f16
    arithmetic) and with KILN_F16_PAIRS=0 (the codes in f32). Every logit of the first within F16_TOLERANCE of
    the largest of the second's, and both within tol of the largest of
    onnxruntime's (from the f32 weights: tol bounds the format's own
    error)."""
    def test(workdir):
        wd = Path(workdir)
        got = {}  # each build's (logits, onnxruntime's) a step
        for name, env in (("pairs", None), ("f32", {"KILN_F16_PAIRS": "0"})):
            sub = wd / name
            sub.mkdir()
            r = kiln("compile", d / "model.onnx", "--name", "model", "-o", sub / "model.c",
                     "--precision", "f16", "--weights", fmt, *DYN_SHAPES, env=env)
            check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
            marker = "A_H2 1" if fmt.startswith("fp8") else "F16_PAIRS 1"
            check((marker in (sub / "model.c").read_text()) == (env is None),
                  f"{name}: {marker} expected only without KILN_F16_PAIRS=0")
            got[name] = []
            run_two_steps(d, link_model(sub),
                          lambda g, w, what, out=got[name]: out.append((g, w, what)))
        for (g, want, what), (f, _, _) in zip(got["pairs"], got["f32"]):
            assert_relative(g, f, F16_TOLERANCE, f"{what}: f16 pairs against the codes in f32")
            for name, v in (("pairs", g), ("f32", f)):
                assert_relative(v, want, tol, f"{what}: {name} against onnxruntime (f32 weights)")
    return test


def prefetch_case(d):
    """KILN_PREFETCH (compiler/prefetch.c): a prefetch of each one-row
    product's weights, with no barrier of its own, placed before the
    product's first dispatch; the two steps of run_two_steps against
    onnxruntime as dynamic_steps_case's f16, and a malformed value refused
    by name."""
    def test(workdir):
        wd = Path(workdir)
        args = [d / "model.onnx", "--precision", "f16", *DYN_SHAPES]
        r = kiln("inspect", *args, "--format", "json", env={"KILN_PREFETCH": "0.005"})
        check(r.returncode == 0, f"kiln inspect failed:\n{r.stderr}")
        disp = json.loads(r.stdout)["dispatches"]
        fams = [x["family"] for x in disp]
        pf = [i for i, f in enumerate(fams) if f == "prefetch"]
        prods = {x["node"] for x in disp if x["family"] == "matvec_k"}
        check(pf and len(pf) == len(prods),
              f"{len(pf)} prefetches for {len(prods)} products on matvec_k")
        for i in pf:
            check(not disp[i].get("barrier"), f"prefetch {i} has a barrier")
            check(fams[i + 1] == "matvec_k" and
                  disp[i]["node"] == disp[i + 1]["node"] + " (prefetch)",
                  f"prefetch {i} is not right before its product's first dispatch")
        r = kiln("compile", *args, "--name", "model", "-o", wd / "model.c",
                 env={"KILN_PREFETCH": "0.005"})
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        check("KILN_PREFETCH" in (wd / "model.c").read_text(),
              "the generated C does not name KILN_PREFETCH among its tuning variables")
        run_two_steps(d, link_model(wd), precision_compare(True, 1e-3, 1e-5))
        r = kiln("inspect", *args, env={"KILN_PREFETCH": "lots"})
        check(r.returncode != 0 and "KILN_PREFETCH=lots" in r.stderr,
              f"a malformed KILN_PREFETCH was not refused by name:\n{r.stderr}")
    return test


def decode_case(d):
    """samples/llm/llm.c: the prompt, then 64 greedy tokens, each fed back,
    identical to transformers' generate() (ids.npy)."""
    def test(workdir):
        wd = Path(workdir)
        r = kiln("compile", d / "model.onnx", "--name", "llm", "-o", wd / "llm_model.c",
                 *DYN_SHAPES)
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        prog = wd / "llm"
        r = run([CC, "-O1", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror",
                 *EXTRA_CFLAGS, "-I", ROOT / "runtime", "-I", wd, "-o", prog,
                 ROOT / "samples" / "llm" / "llm.c", wd / "llm_model.c", "-L", BUILD,
                 "-lkilnrt", VULKAN_LIB, "-lm"])
        check(r.returncode == 0, f"building samples/llm/llm.c failed:\n{r.stderr}")
        prompt = np.load(d / "prompt.npy").ravel()
        want = np.load(d / "ids.npy").ravel()
        new = len(want) - len(prompt)
        r = run([prog, "-q", "-n", str(new), "-o", wd / "ids.txt",
                 *[str(t) for t in prompt]], cwd=wd, env={"KILN_VALIDATION": VALIDATION})
        check(r.returncode != 3, f"Vulkan validation messages:\n{r.stderr[-3000:]}")
        check(r.returncode == 0, f"llm failed ({r.returncode}):\n{r.stderr}")
        got = np.array((wd / "ids.txt").read_text().split(), dtype=np.int64)
        check(got.shape == want.shape and (got == want).all(),
              f"generated ids differ from transformers' generate() at position "
              f"{int(np.argmax(got != want)) if got.shape == want.shape else '?'}:\n"
              f"  kiln:         {got.tolist()}\n  transformers: {want.tolist()}")
    return test


case("llm llama_tiny: KILN_PREFETCH's prefetches beside the work before each "
     "product, both steps against onnxruntime")(
         prefetch_case(LLM / "llama_tiny"))
for _d in DECODERS:
    case(f"llm {_d.name}: prompt and decoding steps with a dynamic sequence and the cache "
         f"as state")(dynamic_steps_case(_d, "f32"))
    case(f"llm {_d.name}: prompt and decoding steps with a dynamic sequence, f16")(
        dynamic_steps_case(_d, "f16"))
    case(f"llm {_d.name}: samples/llm decodes 64 tokens identical to transformers' "
         f"generate()")(decode_case(_d))
    if _d.name.startswith("llama"):  # a gated MLP, rope and norms after the products
        # fp8's own error with these random weights: 0.07 (e4m3) and 0.11 (e5m2) of the
        # largest logit; the pairs within 2e-3 of the f32 build's
        for _fmt, _tol in (("fp8-e4m3", 0.15), ("fp8-e5m2", 0.25)):
            case(f"llm {_d.name}: prompt and decoding steps, --precision f16 --weights {_fmt} "
                 f"(A_H2 against the codes in f32, and onnxruntime)")(
                quant_steps_case(_d, _fmt, _tol))
    if _d.name.endswith("opset23"):  # rope and attention on [1, heads, seq, d] themselves
        case(f"llm {_d.name}: prompt and decoding steps, --no-fuse=patterns (RotaryEmbedding "
             f"and Attention dynamic along an inner axis)")(
            dynamic_steps_case(_d, "f32", ("--no-fuse=patterns",)))


def half_steps_case(d):
    """tests/models/llm/half/NAME: the decoder NAME in f16 (weights, logits
    and cache; tests/models/half.py), compiled without flags with its cache
    as f16 state: the two steps of run_two_steps, its f16 logits within the
    f16 bound of onnxruntime's for the f32 model; and it records no more
    dispatches than NAME compiled with --precision f16 (its products K-major
    for the decoding step, rope and attention fused as there)."""
    def test(workdir):
        wd = Path(workdir)
        src = LLM / d.name
        r = kiln("compile", d / "model.onnx", "--name", "model", "-o", wd / "model.c",
                 *DYN_SHAPES)
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        r = kiln("inspect", d / "model.onnx", *DYN_SHAPES)
        states = re.findall(r"^state +(\S+): (\w+) ", r.stdout, re.M)
        check(states and all(dt == "f16" for _, dt in states),
              f"the cache states are not all f16: {states}")

        def compare(got, want, what):
            assert_relative(got.astype(np.float32), want.astype(np.float32), F16_TOLERANCE, what)
        inputs = {(8, 0): step_inputs(src, 0), (1, 8): step_inputs(src, 1)}
        logits = {(8, 0): np.load(src / "step0_out_logits.npy"),
                  (1, 8): np.load(src / "step1_out_logits.npy")}
        run_built(link_model(wd), [{"seq": 8, "past": 0}, {"seq": 1, "past": 8}],
                  lambda rng, seq, past: inputs[seq, past],
                  lambda *xs, seq, past: [logits[seq, past].astype(np.float16)],
                  compare=compare)
        counts = []
        for path, flags in ((d, ()), (src, ("--precision", "f16"))):
            r = kiln("inspect", path / "model.onnx", "--format", "json", *DYN_SHAPES, *flags)
            check(r.returncode == 0, f"kiln inspect {path} failed:\n{r.stderr}")
            counts.append(json.loads(r.stdout)["summary"]["most_on_one_device"])
        check(counts[0] <= counts[1], f"the f16 decoder records up to {counts[0]} dispatches, "
              f"{src.name} at --precision f16 {counts[1]}")
    return test


for _d in sorted(p.parent for p in (LLM / "half").glob("*/model.onnx")):
    case(f"llm f16 model {_d.name}: prompt and decoding steps, the cache f16 state")(
        half_steps_case(_d))


@case("llm decoders exported by transformers with f16 weights (a Llama and a Qwen2, "
      "RMSNorm's f32 island and its casts; tests/models/llm/exports.tgz, zeros for weights): "
      "each records no more dispatches than its f32 export at --precision f16, on every "
      "device feature set, and computes each norm as one rms_norm")
def _(workdir):
    wd = Path(workdir)
    with tarfile.open(LLM / "exports.tgz") as t:
        t.extractall(wd)  # the repository's own archive
    sizes = json.loads((wd / "exports" / "exports.json").read_text())["data_bytes"]
    for name, size in sizes.items():
        with open(wd / "exports" / name / "model.onnx.data", "wb") as f:
            f.truncate(size)
    for model in ("llama", "qwen2"):
        summary, ops = {}, {}
        for dt in ("f16", "f32"):
            r = kiln("inspect", wd / "exports" / f"{model}_{dt}" / "model.onnx", "--format",
                     "json", "--precision", "f16", *DYN_SHAPES)
            check(r.returncode == 0, f"kiln inspect {model}_{dt} failed:\n{r.stderr}")
            j = json.loads(r.stdout)
            summary[dt] = j["summary"]
            ops[dt] = sorted({d["op"] for d in j["dispatches"]})
        for key in ("most_on_one_device", "fewest_on_one_device"):
            check(summary["f16"][key] <= summary["f32"][key],
                  f"{model}: the f16 export records up to {summary['f16'][key]} dispatches "
                  f"({key}), its f32 export {summary['f32'][key]}")
        check("rms_norm" in ops["f16"] and not {"pow", "reduce_mean"} & set(ops["f16"]),
              f"{model}: the f16 export's norms are not fused: {ops['f16']}")
