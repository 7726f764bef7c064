"""test_models.py: whole models, the runtime API, and the generated C itself.

- samples/mlp.yaml end to end against the CPU reference, its weights rebuilt
  from the documented `init` generator;
- a model whose weights come from a safetensors file;
- determinism: two compiles give identical bytes;
- the generated C compiles with -std=c99 -Wall -Wextra -pedantic -Werror
  under gcc and clang, and as C++;
- tests/test_runtime.c: the runtime's API contract on Vulkan.
"""
import json
import os
import re
import struct
from pathlib import Path

import numpy as np

import reference as ref
from harness import (Skip, BUILD, CC, EXTRA_CFLAGS, F16_TOLERANCE, ROOT, VALIDATION, VULKAN_LIB,
                     assert_close, assert_relative,
                     build_model, check, kiln, link_model, model_yaml, program_env, registry,
                     run, run_model, run_program)

TESTS, case = registry()


def mlp_reference(x):
    w1 = ref.init_normal([256, 512], 0.05, 1)
    b1 = ref.init_uniform([512], -0.1, 0.1, 2)
    w2 = ref.init_normal([512, 10], 0.05, 3)
    b2 = np.array([0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], np.float32)
    h = ref.matmul(x, w1) + b1
    z = ref.matmul(ref.UNARY["gelu"](h), w2) + b2
    return ref.softmax(z)


@case("model samples/mlp.yaml against the CPU reference (random and default inputs)")
def test_mlp(workdir):
    text = (ROOT / "samples" / "mlp.yaml").read_text()
    prog = build_model(workdir, text)
    x = (np.random.default_rng(1).standard_normal([4, 256]) * 2).astype(np.float32)
    want = mlp_reference(x)
    got, = run_program(prog, [x], [want.astype(np.float32)])
    assert_close(got, want, 1e-4, 1e-6)
    # The inputs run_model makes by itself, as `make` runs the sample.
    x0 = ref.run_model_inputs([4, 256], 0)
    r = run([prog], env={"KILN_VALIDATION": VALIDATION})
    check(r.returncode == 0, r.stderr)
    line = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("y:")][0]
    printed = np.array([float(v) for v in line.split(":")[2].split()[:8]])
    assert_close(printed, mlp_reference(x0).reshape(-1)[:8], 1e-4, 1e-5,
                 "printed outputs")
    check(re.search(r"^arena: \d+ bytes$", r.stdout, re.M), r.stdout)
    want = json.loads(kiln("inspect", ROOT / "samples" / "mlp.yaml", "--format",
                           "json").stdout)["summary"]["dispatches"]
    check(re.search(rf"^dispatches: {want}$", r.stdout, re.M), r.stdout)


def safetensors_bytes(tensors):
    header, data = {}, b""
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = {"format": "pt", "note": "a [nested] {value}"}
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


@case("model with weights from a safetensors file")
def test_safetensors(workdir):
    r = np.random.default_rng(5)
    w = (r.standard_normal([8, 3])).astype(np.float32)
    b = (r.standard_normal([3])).astype(np.float32)
    x = (r.standard_normal([2, 8])).astype(np.float32)
    y = model_yaml("st", {"x": {"dtype": "f32", "shape": [2, 8]}},
                   [{"name": "h", "op": "matmul", "inputs": ["x", "w"]},
                    {"name": "y", "op": "add", "inputs": ["h", "b"]}], ["y"],
                   weights={"w": {"dtype": "f32", "shape": [8, 3],
                                  "safetensors": "m.safetensors", "key": "fc.weight"},
                            "b": {"dtype": "f32", "shape": [3],
                                  "safetensors": "m.safetensors", "key": "fc.bias"}})
    want = ref.matmul(x, w) + b
    files = {"m.safetensors": safetensors_bytes({"fc.bias": b, "fc.weight": w})}
    got, = run_model(workdir, y, [x], [want.astype(np.float32)], extra_files=files)
    assert_close(got, want, 1e-5, 1e-5)


@case("model: every op of the table in one graph, with a shared intermediate")
def test_all_ops(workdir):
    r = np.random.default_rng(9)
    x = r.standard_normal([3, 4, 8]).astype(np.float32)
    w = r.standard_normal([8, 8]).astype(np.float32)
    nodes = [
        {"name": "mm", "op": "matmul", "inputs": ["x", "w"]},
        {"name": "t", "op": "transpose", "inputs": ["mm"], "perm": [1, 0, 2]},
        {"name": "rs", "op": "reshape", "inputs": ["t"], "shape": [12, 8]},
        {"name": "g", "op": "gelu", "inputs": ["rs"]},
        {"name": "s", "op": "silu", "inputs": ["rs"]},
        {"name": "sg", "op": "sigmoid", "inputs": ["g"]},
        {"name": "th", "op": "tanh", "inputs": ["s"]},
        {"name": "e", "op": "exp", "inputs": ["th"]},
        {"name": "re", "op": "relu", "inputs": ["rs"]},
        {"name": "m1", "op": "mul", "inputs": ["sg", "e"]},
        {"name": "d1", "op": "div", "inputs": ["m1", "e"]},
        {"name": "s1", "op": "sub", "inputs": ["d1", "re"]},
        {"name": "ln", "op": "layer_norm", "inputs": ["s1"]},
        {"name": "sm", "op": "softmax", "inputs": ["ln"]},
        {"name": "dropped", "op": "exp", "inputs": ["x"]},
    ]
    y = model_yaml("all", {"x": {"dtype": "f32", "shape": [3, 4, 8]}}, nodes,
                   ["sm", "rs"],
                   weights={"w": {"dtype": "f32", "shape": [8, 8], "file": "w.bin"}})
    rs = np.transpose(ref.matmul(x, w), (1, 0, 2)).reshape(12, 8)
    g, s = ref.UNARY["gelu"](rs), ref.UNARY["silu"](rs)
    e = np.exp(np.tanh(s))
    s1 = ref.sigmoid(g) * e / e - np.maximum(rs, 0)
    want = ref.softmax(ref.layer_norm(s1))
    got, got_rs = run_model(workdir, y, [x], [want.astype(np.float32),
                                                rs.astype(np.float32)],
                            extra_files={"w.bin": w.tobytes()})
    assert_close(got_rs, rs, 1e-5, 1e-5, "rs")
    assert_close(got, want, 1e-4, 1e-5, "sm")
    c = (Path(workdir) / "model.c").read_text()
    check("dropped" not in c, "the dead node 'dropped' was emitted")


def compile_sample(workdir, sub):
    d = Path(workdir) / sub
    d.mkdir()
    (d / "mlp.yaml").write_text((ROOT / "samples" / "mlp.yaml").read_text())
    r = kiln("compile", "mlp.yaml", "-o", "mlp.c", cwd=d)
    check(r.returncode == 0, r.stderr)
    return d


@case("determinism: compiling twice gives identical bytes")
def test_determinism(workdir):
    a, b = compile_sample(workdir, "a"), compile_sample(workdir, "b")
    for f in ["mlp.c", "mlp.h"]:
        check((a / f).read_bytes() == (b / f).read_bytes(), f"{f} differs")
    c = (a / "mlp.c").read_text()
    check(c.startswith("/*\n * Generated by kiln ") and "Do not edit." in c and
          re.search(r"command: kiln compile (--sync-check )?mlp.yaml -o mlp.c", c),
          "frontmatter")
    check(re.search(r"static const uint32_t mlp_spirv_0\[\d+\]", c), "SPIR-V words")
    check(re.search(r'/\* 0: h \+ h_bias \+ a \(matmul\) mat(mul|vec)', c),
          "schedule records name their (fused) nodes")


def pedantic_case(compiler, lang):
    def test(workdir):
        d = compile_sample(workdir, "m")
        flags = ["-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror"]
        if lang == "c++":
            flags = ["-x", "c++", "-std=c++11", "-Wall", "-Wextra", "-pedantic", "-Werror"]
        r = run([compiler, *flags, "-I", ROOT / "runtime", "-c", d / "mlp.c",
                 "-o", d / "mlp.o"])
        check(r.returncode == 0, f"{compiler} {lang}:\n{r.stderr[-3000:]}")
        # Empty tables: no dispatch, no weight, no kernel.
        (d / "z.yaml").write_text("name: z\ninputs:\n  x: {dtype: f32, shape: [2]}\n"
                                  "nodes:\n  - {name: y, op: reshape, inputs: [x], "
                                  "shape: [2, 1]}\noutputs: [y]\n")
        r = kiln("compile", "z.yaml", "-o", "z.c", "--debug-tensors", cwd=d)
        check(r.returncode == 0, r.stderr)
        r = run([compiler, *flags, "-I", ROOT / "runtime", "-c", d / "z.c", "-o", d / "z.o"])
        check(r.returncode == 0, f"{compiler} {lang}, empty tables:\n{r.stderr[-3000:]}")
    return test


for compiler, lang in [("gcc", "c"), ("clang", "c"), ("g++", "c++")]:
    case(f"generated C compiles warning-free: {compiler} ({lang}) -pedantic -Werror")(
        pedantic_case(compiler, lang))


@case("runtime API contract (tests/test_runtime.c)")
def test_runtime(workdir):
    d = compile_sample(workdir, "m")
    r = kiln("compile", "mlp.yaml", "--name", "model", "-o", "model.c", cwd=d)
    check(r.returncode == 0, r.stderr)
    prog = d / "test_runtime"
    r = run([CC, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", *EXTRA_CFLAGS,
             "-I", ROOT / "runtime", "-o", prog, ROOT / "tests" / "test_runtime.c",
             d / "model.c", "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    check(r.returncode == 0, r.stderr)
    r = run([prog], env={"KILN_VALIDATION": VALIDATION})
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    check(not fails and r.returncode == 0, "\n".join(fails) or r.stderr)
    check(r.stdout.count("ok ") >= 20, r.stdout)


@case("runtime fault injection: every Vulkan call and host allocation fails in turn "
      "(tests/test_faults.c)")
def test_faults(workdir):
    d = compile_sample(workdir, "m")
    r = kiln("compile", "mlp.yaml", "--name", "model", "--debug-tensors", "-o", "model.c",
             cwd=d)
    check(r.returncode == 0, r.stderr)
    prog = d / "test_faults"
    runtime = sorted((ROOT / "runtime").glob("*.c"))
    r = run([CC, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-g", *EXTRA_CFLAGS,
             "-DKILN_FAULT_INJECTION", "-I", ROOT / "runtime", "-o", prog,
             ROOT / "tests" / "test_faults.c", d / "model.c", *runtime, VULKAN_LIB, "-lm"])
    check(r.returncode == 0, r.stderr)
    r = run([prog], env={"KILN_VALIDATION": VALIDATION}, timeout=900)
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    check(not fails and r.returncode == 0, "\n".join(fails) or r.stdout[-2000:] + r.stderr[-3000:])
    check("kiln: validation:" not in r.stderr, r.stderr[-3000:])
    check(" 0 failures" in r.stdout and r.stdout.count("ok ") == 5, r.stdout)


@case("runtime: KILN_DEVICE selects by name; a bad KILN_DEVICE is an error")
def test_env_device(workdir):
    d = compile_sample(workdir, "m")
    prog = build_model(d, (ROOT / "samples" / "mlp.yaml").read_text())
    r = run([prog])
    check(r.returncode == 0, r.stderr)
    name = re.search(r"^device: (.*) \(", r.stdout, re.M)[1]
    r = run([prog], env={"KILN_DEVICE": name[:6]})
    check(r.returncode == 0 and f"device: {name}" in r.stdout, r.stdout + r.stderr)
    r = run([prog], env={"KILN_DEVICE": "7"})
    check(r.returncode == 1 and "KILN_ERROR_NO_DEVICE" in r.stderr and
          "device index 7" in r.stderr, r.stderr)
    r = run([prog], env={"KILN_DEVICE": "no such device"})
    check(r.returncode == 1 and 'no device name contains "no such device"' in r.stderr,
          r.stderr)


def sample_case(name, make_inputs, rtol, atol, flags=(), guard=True):
    def test(workdir):
        import interpret
        path = ROOT / "samples" / f"{name}.yaml"
        inputs = make_inputs()
        wants = interpret.interpret(path, inputs)
        prog = build_model(workdir, path.read_text(), flags=flags, guard=guard)
        gots = run_program(prog, inputs, [np.asarray(w, np.float32) for w in wants])
        for i, (g, w) in enumerate(zip(gots, wants)):
            if "f16" in flags:
                assert_relative(g, w, F16_TOLERANCE, f"output {i}")
            else:
                assert_close(g, w, rtol, atol, f"output {i}")
    return test


case("model samples/transformer.yaml against the CPU reference")(sample_case(
    "transformer", lambda: [np.random.default_rng(3).integers(0, 64, [1, 16]).astype(np.int32)],
    1e-3, 1e-3))
case("model samples/cnn.yaml against the CPU reference")(sample_case(
    "cnn", lambda: [np.random.default_rng(4).standard_normal([1, 3, 32, 32]).astype(np.float32)],
    1e-4, 1e-5))
case("model samples/mlp.yaml through the YAML interpreter")(sample_case(
    "mlp", lambda: [np.random.default_rng(5).standard_normal([4, 256]).astype(np.float32)],
    1e-4, 1e-6))
for _name, _inputs in [
        ("transformer", lambda: [np.random.default_rng(3).integers(0, 64, [1, 16])
                                 .astype(np.int32)]),
        ("cnn", lambda: [np.random.default_rng(4).standard_normal([1, 3, 32, 32])
                         .astype(np.float32)]),
        ("mlp", lambda: [np.random.default_rng(5).standard_normal([4, 256])
                         .astype(np.float32)])]:
    case(f"model samples/{_name}.yaml --precision f16 against the f32 CPU reference")(
        sample_case(_name, _inputs, None, None, flags=("--precision", "f16")))


@case("model --precision f16 --io f16: f16 inputs and outputs written by each kind of kernel "
      "(elementwise, a cumsum and a sum computed in f32 then cast, a copy of f32 data, a "
      "product, a gather of f16 rows), the header declaring them f16")
def _(workdir):
    r = np.random.default_rng(41)
    x = r.standard_normal([6, 16]).astype(np.float32)
    w = (r.standard_normal([16, 8]) * 0.3).astype(np.float32)
    idx = np.array([3, 0, 5, 5], np.int64)
    ins = {"x": {"dtype": "f32", "shape": [6, 16]}, "i": {"dtype": "i64", "shape": [4]}}
    nodes = [{"name": "a", "op": "relu", "inputs": ["x"]},
             {"name": "c", "op": "cumsum", "inputs": ["x"], "axis": 1},
             {"name": "s", "op": "reduce_sum", "inputs": ["x"], "axes": [1]},
             {"name": "e", "op": "exp", "inputs": ["x"]},
             {"name": "t", "op": "transpose", "inputs": ["s"], "perm": [1, 0]},
             {"name": "p", "op": "matmul", "inputs": ["x", "w"]},
             {"name": "g", "op": "gather", "inputs": ["e", "i"], "axis": 0}]
    y = model_yaml("io", ins, nodes, ["a", "c", "s", "t", "p", "g"],
                   {"w": {"dtype": "f32", "shape": [16, 8], "values": w.ravel().tolist()}})
    prog = build_model(workdir, y, flags=("--precision", "f16", "--io", "f16"))
    h = (Path(workdir) / "model.h").read_text()
    decl = re.findall(r"\[\d+\] (\w+): (\w+) \[", h[h.index(" * Inputs:"):h.index("*/")])
    check(decl == [("x", "f16"), ("i", "i64")] + [(n, "f16") for n in "acstpg"],
          f"declared {decl}")
    hx = x.astype(np.float16)
    xs = hx.astype(np.float32)
    s = xs.sum(1, keepdims=True)
    want = [np.maximum(xs, 0), np.cumsum(xs, 1), s, s.T,
            xs @ w.astype(np.float16).astype(np.float32), np.exp(xs)[idx]]
    got = run_program(prog, [hx, idx], [v.astype(np.float16) for v in want])
    for n, g, v in zip("acstpg", got, want):
        check(g.dtype == np.float16, f"{n}: {g.dtype}")
        assert_relative(g, v, F16_TOLERANCE, f"output {n}")


def io_states(prog, n_inputs, env):
    """run_model's io line (inputs in.bin files written already): name ->
    'direct' or 'copied'."""
    args = [prog]
    for i in range(n_inputs):
        args += ["-i", Path(prog).parent / f"in{i}.bin"]
    r = run(args, env={"KILN_VALIDATION": VALIDATION, **env})
    check(r.returncode == 0, r.stderr)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("io:"))
    return {w.split()[1]: w.split()[2] for w in line[3:].split(",")}


def f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


@case("direct I/O: small inputs and outputs only the dispatches touch are reached in "
      "staging, the rest copied; every output right either way and with KILN_STAGED_IO=1")
def test_direct_io(workdir):
    rng = np.random.default_rng(21)
    sig = lambda v: 1 / (1 + np.exp(-v.astype(np.float64)))  # noqa: E731
    x, big = f32(rng, [4, 8]), f32(rng, [130, 130])  # big: 67,600 bytes, over 64 KiB
    wide, w = f32(rng, [520, 512]), f32(rng, [512])  # wide: 1,064,960 bytes
    f = lambda n: {"dtype": "f32", "shape": n}  # noqa: E731
    cases = [
        # an output a later node reads (s), an input and an output over the
        # limits (big, u)
        ("a", {"x": f([4, 8]), "big": f([130, 130])},
         [{"name": "s", "op": "sigmoid", "inputs": ["x"]},
          {"name": "t", "op": "mul", "inputs": ["s", "s"]},
          {"name": "u", "op": "relu", "inputs": ["big"]}], ["s", "t", "u"], [x, big],
         [sig(x), sig(x) ** 2, np.maximum(big, 0)],
         {"x": "direct", "big": "copied", "s": "direct", "t": "direct", "u": "copied"}),
        # an output that is its input's bytes (a view): both copied
        ("b", {"x": f([4, 8])},
         [{"name": "r", "op": "reshape", "inputs": ["x"], "shape": [8, 4]},
          {"name": "y", "op": "exp", "inputs": ["x"]}], ["r", "y"], [x],
         [x.reshape(8, 4), np.exp(x)], {"x": "copied", "r": "copied", "y": "direct"}),
        # an input and an output over the limits beside a small input
        ("c", {"wide": f([520, 512]), "w": f([512])},
         [{"name": "y", "op": "mul", "inputs": ["wide", "w"]}], ["y"], [wide, w],
         [wide * w], {"wide": "copied", "w": "direct", "y": "copied"}),
    ]
    for name, inputs, nodes, outputs, ins, wants, states in cases:
        d = Path(workdir) / name
        d.mkdir()
        prog = build_model(d, model_yaml(name, inputs, nodes, outputs))
        for staged in ("0", "1"):
            with program_env(KILN_STAGED_IO=staged):
                gots = run_program(prog, ins, [np.asarray(v, np.float32) for v in wants])
            for o, g, v in zip(outputs, gots, wants):
                assert_close(g, v, 1e-6, 1e-6, f"model {name}, {o}, KILN_STAGED_IO={staged}")
            got = io_states(prog, len(ins), {"KILN_STAGED_IO": staged})
            want = states if staged == "0" else {k: "copied" for k in states}
            check(got == want, f"model {name}, KILN_STAGED_IO={staged}: io {got}, "
                  f"expected {want}")


@case("--guard: a kernel made to write past its tensor fails the run with "
      "KILN_ERROR_OUT_OF_BOUNDS (a direct output's band in staging, a copied one's in the arena)")
def test_guard_catches(workdir):
    d = Path(workdir)
    text = (ROOT / "samples" / "mlp.yaml").read_text()
    prog = build_model(d, text)
    x = np.random.default_rng(5).standard_normal([4, 256]).astype(np.float32)
    x.tofile(d / "x.bin")
    r = run([prog, "-q", "-i", d / "x.bin"])
    check(r.returncode == 0, f"the guarded model fails as it is:\n{r.stderr}")
    # Move the last dispatch's written binding 64 bytes on: its last 16
    # floats then land in a guard band after the tensor.
    c = (d / "model.c").read_text()
    lines = c.splitlines()
    idx = max(i for i, ln in enumerate(lines) if "writes" in ln and "KILN_BUFFER_ARENA" in ln)
    m = re.search(r"\{KILN_BUFFER_ARENA, (\d+)ull,", lines[idx])
    lines[idx] = lines[idx].replace(m[0], f"{{KILN_BUFFER_ARENA, {int(m[1]) + 64}ull,")
    (d / "model.c").write_text("\n".join(lines) + "\n")
    r = run([CC, "-O1", "-std=c99", *EXTRA_CFLAGS, "-I", ROOT / "runtime", "-o", prog,
             d / "model.c", BUILD / "run_model_test.o", "-L", BUILD, "-lkilnrt", VULKAN_LIB,
             "-lm"])
    check(r.returncode == 0, r.stderr)
    # The output is direct: the kernel's last floats land in the band the
    # compiler left after it in staging. Copied, in the arena's band.
    r = run([prog, "-q", "-i", d / "x.bin"])
    check(r.returncode != 0 and "KILN_ERROR_OUT_OF_BOUNDS" in r.stderr
          and "a kernel wrote past 'y' in staging (direct I/O)" in r.stderr,
          f"exit {r.returncode}:\n{r.stderr}")
    r = run([prog, "-q", "-i", d / "x.bin"], env={"KILN_STAGED_IO": "1"})
    check(r.returncode != 0 and "KILN_ERROR_OUT_OF_BOUNDS" in r.stderr
          and "a kernel wrote past tensor 'y'" in r.stderr, f"exit {r.returncode}:\n{r.stderr}")


@case("--sync-check: removing one barrier of each kind (read after write, write after "
      "read, write after write) from the real plan is a synchronization hazard")
def test_sync_check_catches(workdir):
    if VALIDATION == "0":
        raise Skip("the validation layer is off (KILN_TEST_VALIDATION=0)")
    rng = np.random.default_rng(3)
    # The transformer has barriers of the first two kinds; a rope of part of
    # each row (n_rot < D) writes the rotated part, then copies the tail:
    # interleaved bytes of one tensor, a write after write.
    rope = model_yaml("r", {"x": {"dtype": "f32", "shape": [1, 2, 6, 8]},
                            "c": {"dtype": "f32", "shape": [6, 2]},
                            "s": {"dtype": "f32", "shape": [6, 2]}},
                      [{"name": "y", "op": "rope", "inputs": ["x", "c", "s"], "n_rot": 4}],
                      ["y"])
    models = {"transformer": ((ROOT / "samples" / "transformer.yaml").read_text(),
                              [rng.integers(0, 64, [1, 16]).astype(np.int32)]),
              "rope": (rope, [rng.standard_normal(sh).astype(np.float32)
                              for sh in ([1, 2, 6, 8], [6, 2], [6, 2])])}
    # The layer does not report write after write between descriptor
    # writes; --sync-check binds each written range again, read-only, so a
    # missing barrier between two writes shows as a read after write.
    for kind, hazard, model in [("read after write", "READ-AFTER-WRITE", "transformer"),
                                ("write after read", "WRITE-AFTER-READ", "transformer"),
                                ("write after write", "READ-AFTER-WRITE", "rope")]:
        d = Path(workdir) / kind.replace(" ", "_")
        d.mkdir()
        text, inputs = models[model]
        prog = build_model(d, text, flags=["--sync-check"], guard=False)
        args = [prog, "-q"]
        for i, x in enumerate(inputs):
            x.tofile(d / f"in{i}.bin")
            args += ["-i", d / f"in{i}.bin"]
        r = run(args, env={"KILN_VALIDATION": "1"})
        check(r.returncode == 0, f"{model} fails as it is:\n{r.stderr}")
        # A dispatch record: its comment names the barrier's reason, the
        # next line holds {kernel, {groups}, first binding, count, barrier, ...
        lines = (d / "model.c").read_text().splitlines()
        idx = next(i for i, ln in enumerate(lines) if f"barrier: {kind}:" in ln) + 1
        m = re.match(r"(\s*\{\d+u, \{\d+u, \d+u, \d+u\}, \d+u, \d+u, )1u,", lines[idx])
        check(m, f"no barrier field in {lines[idx]!r}")
        lines[idx] = lines[idx].replace(m[0], m[1] + "0u,", 1)
        (d / "model.c").write_text("\n".join(lines) + "\n")
        link_model(d)
        r = run(args, env={"KILN_VALIDATION": "1"})
        check(r.returncode == 3 and f"SYNC-HAZARD-{hazard}" in r.stderr,
              f"{kind} barrier removed ({lines[idx - 1].strip()}): exit {r.returncode}\n"
              f"{r.stderr[-2000:]}")


@case("subgroup builds: a kernel's second build runs where the device has subgroup "
      "arithmetic, the first with KILN_SUBGROUP=0; inspect lists both")
def test_subgroup_builds(workdir):
    d = Path(workdir)
    x = np.random.default_rng(8).standard_normal([4, 50]).astype(np.float32) * 3
    y = model_yaml("sg", {"x": {"dtype": "f32", "shape": [4, 50]}},
                   [{"name": "p", "op": "softmax", "inputs": ["x"]},
                    {"name": "l", "op": "log_softmax", "inputs": ["x"]}], ["p", "l"])
    prog = build_model(d, y)
    np.ascontiguousarray(x).tofile(d / "x.bin")
    r = run([prog, "-i", d / "x.bin"])
    check(r.returncode == 0, r.stderr)
    if "subgroup arithmetic" not in r.stdout:
        raise Skip("the device has no subgroup arithmetic")
    r = kiln("inspect", d / "model.yaml", "--format", "json")
    check(r.returncode == 0, r.stderr)
    kernels = json.loads(r.stdout)["kernels"]
    check(len(kernels) == 2 and all(k["family"] == "softmax" and k["alt_spirv_bytes"] > 0
                                    and k["alt_needs"] == 64 for k in kernels), str(kernels))
    want_p, want_l = ref.softmax(x), ref.log_softmax(x)
    # The softmax kernel's second build swapped for log_softmax's: which
    # build a device runs shows in p.
    text = (d / "model.c").read_text()
    log_kernel = int(re.search(r"/\* kernel (\d+): softmax\n(?: \*   .*\n)*? \*   LOG 1\n",
                               text)[1])
    rows = re.findall(r"\{model_spirv_(\d+), (\d+)u, \"softmax\", model_spirv_\d+_alt, "
                      r"(\d+)u, 64u\}", text)
    check(len(rows) == 2, f"kernel table: {rows}")
    plain = next(r for r in rows if int(r[0]) != log_kernel)
    alt_words = next(r[2] for r in rows if int(r[0]) == log_kernel)
    text = text.replace(f"model_spirv_{plain[0]}_alt, {plain[2]}u, 64u}}",
                        f"model_spirv_{log_kernel}_alt, {alt_words}u, 64u}}")
    (d / "model.c").write_text(text)
    link_model(d)
    p, l = run_program(prog, [x], [want_p, want_l])
    assert_close(p, want_l, 1e-5, 1e-5, "p, the second build (log_softmax's) on this device")
    assert_close(l, want_l, 1e-5, 1e-5, "l")
    with program_env(KILN_SUBGROUP="0"):
        p, l = run_program(prog, [x], [want_p, want_l])
    assert_close(p, want_p, 1e-5, 1e-7, "p, the first build with KILN_SUBGROUP=0")
    assert_close(l, want_l, 1e-5, 1e-5, "l with KILN_SUBGROUP=0")


@case("weights sidecar (--weights-file): the model runs right; a missing, truncated, "
      "corrupt, padded or foreign file is a clear error")
def test_weights_file(workdir):
    import interpret
    d = Path(workdir)
    path = ROOT / "samples" / "transformer.yaml"
    wfile = d / "model.weights"
    prog = build_model(d, path.read_text(), flags=["--weights-file", str(wfile)])
    c_text = (d / "model.c").read_text()
    raw = wfile.read_bytes()
    check(raw[:8] == b"KILNWTS2", "no magic")
    size, = struct.unpack("<Q", raw[8:16])
    check(len(raw) == 24 + size, f"file {len(raw)} bytes, header says {size} + 24")
    check("#define model_weights ((const uint32_t *)0)" in c_text
          and "model_weights[" not in c_text, "the C still holds the weights")
    inputs = [np.random.default_rng(3).integers(0, 64, [1, 16]).astype(np.int32)]
    wants = interpret.interpret(path, inputs)
    gots = run_program(prog, inputs, [np.asarray(w, np.float32) for w in wants])
    assert_close(gots[0], wants[0], 1e-3, 1e-3)

    def fails(data, words, name="bad.weights"):
        if data is not None:
            (d / name).write_bytes(data)
        r = run([prog, "-q", "-w", d / name])
        check(r.returncode == 1 and "KILN_ERROR_WEIGHTS" in r.stderr
              and all(w in r.stderr for w in words), f"exit {r.returncode}: {r.stderr}")
    flipped = bytearray(raw)
    flipped[24 + size // 2] ^= 0x10
    fails(bytes(flipped), ["is corrupt", "checksum"])
    fails(raw[:24 + size - 1], ["is truncated"])
    fails(raw[:10], ["not a kiln weights file"])
    fails(raw + b"\0", ["bytes after its"])
    fails(None, ["cannot open the weights file", "No such file"], "nowhere.weights")
    other = d / "other"
    other.mkdir()
    r = kiln("compile", ROOT / "samples" / "mlp.yaml", "-o", other / "mlp.c",
             "--weights-file", other / "mlp.weights")
    check(r.returncode == 0, r.stderr)
    fails((other / "mlp.weights").read_bytes(), ["another compile"])
    # Same size, other values: the header's checksum tells them apart.
    forged = bytearray(raw)
    forged[16:24] = bytes(8)
    fails(bytes(forged), ["is from another compile"])


@case("weights over 16 MiB go to a sidecar file by default; --embed-weights and "
      "--weights-file conflict")
def test_weights_threshold(workdir):
    d = Path(workdir)
    (d / "big.yaml").write_text(
        "name: big\ninputs:\n  x: {dtype: f32, shape: [2, 1100]}\nweights:\n"
        "  w: {dtype: f32, shape: [1100, 4096], init: {normal: 0.05, seed: 9}}\n"
        "nodes:\n  - {name: y, op: matmul, inputs: [x, w]}\noutputs: [y]\n")
    r = kiln("compile", "big.yaml", "--name", "model", "-o", "model.c", cwd=d)
    check(r.returncode == 0 and "weights in model.weights" in r.stdout, r.stdout + r.stderr)
    raw = (d / "model.weights").read_bytes()
    check(len(raw) == 24 + 1100 * 4096 * 4, f"{len(raw)} bytes")
    check((d / "model.c").stat().st_size < 200000, "weights embedded anyway")
    prog = d / "model"
    r = run([CC, "-O1", "-std=c99", *EXTRA_CFLAGS, "-I", ROOT / "runtime", "-o", prog,
             d / "model.c", BUILD / "run_model_test.o", "-L", BUILD, "-lkilnrt", VULKAN_LIB,
             "-lm"])
    check(r.returncode == 0, r.stderr)
    x = np.random.default_rng(1).standard_normal([2, 1100]).astype(np.float32)
    # two rows: a decode-shaped product, whose weight is stored K-major
    w = np.frombuffer(raw[24:], np.float32).reshape(4096, 1100).T
    got, = run_program(prog, [x], [np.zeros([2, 4096], np.float32)])
    assert_close(got, x.astype(np.float64) @ w.astype(np.float64), 1e-4, 1e-4)
    r = kiln("compile", "big.yaml", "--embed-weights", "--weights-file", "w", cwd=d)
    check(r.returncode == 1 and "contradict" in r.stderr, r.stderr)


@case("two models in one program on one device; no allocation on the run path "
      "(tests/test_embed.c interposes malloc); zero-copy runs, direct and staged")
def test_embed(workdir):
    d = Path(workdir)
    for name in ("mlp", "cnn"):
        r = kiln("compile", ROOT / "samples" / f"{name}.yaml", "-o", d / f"{name}.c")
        check(r.returncode == 0, r.stderr)
    prog = d / "test_embed"
    interpose = [] if not EXTRA_CFLAGS else ["-DNO_INTERPOSE"]  # ASan owns malloc
    r = run([CC, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", *EXTRA_CFLAGS,
             *interpose, "-I", ROOT / "runtime", "-I", d, "-o", prog,
             ROOT / "tests" / "test_embed.c", d / "mlp.c", d / "cnn.c", "-L", BUILD,
             "-lkilnrt", VULKAN_LIB, "-lm", "-ldl"])
    check(r.returncode == 0, r.stderr)
    for staged in ("0", "1"):  # direct I/O, then every input and output copied
        r = run([prog], env={"KILN_VALIDATION": VALIDATION, "KILN_STAGED_IO": staged})
        check(r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr[-2000:])
        check(r.stdout.count("ok ") == (3 if interpose else 4), r.stdout)


@case("models on the caller's own VkInstance, VkDevice and queue, and its host allocator "
      "(tests/test_vulkan.c)")
def test_vulkan_handles(workdir):
    d = Path(workdir)
    r = kiln("compile", ROOT / "samples" / "mlp.yaml", "-o", d / "mlp.c")
    check(r.returncode == 0, r.stderr)
    (d / "half.yaml").write_text("name: half\ninputs:\n  x: {dtype: f16, shape: [8]}\n"
                                 "nodes:\n  - {name: y, op: add, inputs: [x, x]}\n"
                                 "outputs: [y]\n")
    r = kiln("compile", "half.yaml", "-o", "half.c", cwd=d)
    check(r.returncode == 0, r.stderr)
    prog = d / "test_vulkan"
    r = run([CC, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", *EXTRA_CFLAGS,
             "-I", ROOT / "runtime", "-I", d, "-o", prog, ROOT / "tests" / "test_vulkan.c",
             d / "mlp.c", d / "half.c", "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    check(r.returncode == 0, r.stderr)
    r = run([prog], env={"KILN_VALIDATION": VALIDATION}, timeout=600)
    check(r.returncode == 0 and "FAIL" not in r.stdout, r.stdout + r.stderr[-2000:])
    oks = [ln for ln in r.stdout.splitlines() if ln.startswith("ok ")]
    check(len(oks) == 22 and r.stdout.rstrip().endswith("\n0 failures"), r.stdout)


@case("make install PREFIX=...: samples/embed builds out of tree with pkg-config alone "
      "and with CMake (find_package(kiln)), and its firmware loop prints latency percentiles")
def test_install(workdir):
    if EXTRA_CFLAGS:
        raise Skip("the sanitizer build links its runtime statically; a shared "
                   "libkilnrt is tested in the plain build")
    from test_readme import scratch_tree
    d = Path(workdir)
    prefix = d / "prefix"
    # In a scratch copy of the tree and its build: where sources are newer
    # than the build, make relinks there, never under the tests that run the
    # build in parallel.
    tree = scratch_tree(d)
    r = run(["make", "-s", "-C", tree, "install", f"PREFIX={prefix}"], timeout=600)
    check(r.returncode == 0, r.stdout + r.stderr)
    for f in ["bin/kiln", "lib/libkilnrt.a", "lib/libkilnrt.so.1", "lib/libkilnrt.so",
              "include/kiln_rt.h", "include/kiln_rt_tables.h", "include/kiln_rt_vulkan.h",
              "lib/pkgconfig/kilnrt.pc", "lib/cmake/kiln/kiln-config.cmake",
              "lib/cmake/kiln/kiln-config-version.cmake", "share/man/man1/kiln.1"]:
        check((prefix / f).exists(), f"{f} was not installed")
    # The shared library exports the API of the installed headers, every
    # function of it, and none of the runtime's kiln__ internals.
    r = run(["nm", "-D", "--defined-only", prefix / "lib/libkilnrt.so.1"])
    check(r.returncode == 0, r.stderr)
    exported = {ln.split()[-1].split("@")[0] for ln in r.stdout.splitlines() if " T " in ln}
    api = set()
    for h in ("kiln_rt.h", "kiln_rt_vulkan.h"):
        api |= set(re.findall(r"\b(kiln_[a-z0-9]\w*)\(", (prefix / "include" / h).read_text()))
    check(not [s for s in exported if s.startswith("kiln__")],
          f"internal symbols exported: {sorted(s for s in exported if s.startswith('kiln__'))[:5]}")
    check(api and api <= exported, f"API functions not exported: {sorted(api - exported)}")
    check(exported <= api, f"exported but not in the headers: {sorted(exported - api)}")
    # man-db and pkg-config are among the test packages (make test-deps).
    r = run(["man", "-l", prefix / "share/man/man1/kiln.1"], env={"MANWIDTH": "80"})
    check(r.returncode == 0 and "ahead-of-time compiler" in r.stdout, r.stdout + r.stderr)
    import shutil
    embed = d / "embed"
    # Only the sample's sources: what the README's commands may have built in
    # samples/embed (firmware, net.c, net.h; ignored by git) stays behind.
    embed.mkdir()
    for f in ("Makefile", "firmware.c"):
        shutil.copy(ROOT / "samples" / "embed" / f, embed / f)
    # Out of tree: only the installed files, found through pkg-config.
    r = run(["make", "-s", "-C", embed, f"PKG_CONFIG_PATH={prefix}/lib/pkgconfig",
             f"KILN={prefix}/bin/kiln", f"MODEL={ROOT}/samples/mlp.yaml",
             "CFLAGS=-O2"], timeout=600)
    check(r.returncode == 0, r.stdout + r.stderr)
    r = run(["ldd", embed / "firmware"])
    check(str(prefix / "lib" / "libkilnrt.so.1") in r.stdout, f"not the installed library:\n{r.stdout}")
    r = run([embed / "firmware"], env={"KILN_VALIDATION": VALIDATION})
    check(r.returncode == 0 and re.search(r"mlp: 1000 runs, latency p50 [\d.]+ us, p99 [\d.]+ us",
                                          r.stdout), r.stdout + r.stderr)
    # The same sample with CMake: find_package(kiln) and kiln_add_model, an
    # ONNX model this time (it compiles when the model changes). A clean copy
    # of the sources: the net.h that make wrote beside firmware.c would be
    # found before the build tree's (#include "..." looks there first).
    src = d / "embed-cmake"
    src.mkdir()
    for f in ("CMakeLists.txt", "firmware.c"):
        shutil.copy(ROOT / "samples" / "embed" / f, src / f)
    cm = d / "cmake-build"
    onnx = ROOT / "tests" / "models" / "densenet_tiny_dynamo18" / "model.onnx"
    r = run(["cmake", "-S", src, "-B", cm, f"-DCMAKE_PREFIX_PATH={prefix}",
             f"-DMODEL={onnx}"], timeout=600)
    check(r.returncode == 0, r.stdout + r.stderr)
    r = run(["cmake", "--build", cm], timeout=600)
    check(r.returncode == 0 and "kiln: compiling" in r.stdout, r.stdout + r.stderr)
    r = run(["ldd", cm / "firmware"])
    check(str(prefix / "lib" / "libkilnrt.so.1") in r.stdout, f"not the installed library:\n{r.stdout}")
    r = run([cm / "firmware"], env={"KILN_VALIDATION": VALIDATION})
    check(r.returncode == 0 and re.search(r": 1000 runs, latency p50 [\d.]+ us, p99 [\d.]+ us",
                                          r.stdout), r.stdout + r.stderr)


# The samples again with the real memory plan (slots reused), not --guard's.
case("model samples/transformer.yaml, arena slots reused")(sample_case(
    "transformer", lambda: [np.random.default_rng(3).integers(0, 64, [1, 16]).astype(np.int32)],
    1e-3, 1e-3, guard=False))
case("model samples/cnn.yaml, arena slots reused")(sample_case(
    "cnn", lambda: [np.random.default_rng(4).standard_normal([1, 3, 32, 32]).astype(np.float32)],
    1e-4, 1e-5, guard=False))
case("model samples/mlp.yaml, arena slots reused")(sample_case(
    "mlp", lambda: [np.random.default_rng(5).standard_normal([4, 256]).astype(np.float32)],
    1e-4, 1e-6, guard=False))

case("model samples/transformer.yaml with fusion off")(sample_case(
    "transformer", lambda: [np.random.default_rng(3).integers(0, 64, [1, 16]).astype(np.int32)],
    1e-3, 1e-3, ["--no-fuse"]))
case("model samples/cnn.yaml with fusion off")(sample_case(
    "cnn", lambda: [np.random.default_rng(4).standard_normal([1, 3, 32, 32]).astype(np.float32)],
    1e-4, 1e-5, ["--no-fuse"]))


@case("fusion: each pass removes dispatches, and can be turned off")
def test_fusion_counts(workdir):
    def count(name, *flags):
        r = kiln("inspect", ROOT / "samples" / f"{name}.yaml", "--format", "json", *flags)
        check(r.returncode == 0, r.stderr)
        return json.loads(r.stdout)["summary"]["dispatches"]
    check(count("mlp", "--no-fuse") == 6, "mlp unfused")
    check(count("mlp", "--no-fuse=eltwise,norm") == 3, "matmul + bias + gelu in one")
    check(count("mlp") == 3, "mlp fused")
    t_all, t_none = count("transformer"), count("transformer", "--no-fuse")
    t_norm = count("transformer", "--no-fuse=eltwise,epilogue,qkv")
    t_elt = count("transformer", "--no-fuse=norm,epilogue,qkv")
    t_qkv = count("transformer", "--no-fuse=eltwise,epilogue,norm")
    check(t_norm == t_none - 4, f"residual norms: {t_norm} vs {t_none}")
    check(t_elt == t_none - 2, f"silu * up chains: {t_elt} vs {t_none}")
    # Per layer q, k and v become one product, and so do gate and up (no
    # silu epilogue on gate once epilogues are off).
    check(t_qkv == t_none - 6, f"q, k, v and gate, up in one product each per layer: "
          f"{t_qkv} vs {t_none}")
    check(t_all < t_norm and t_all < t_elt and t_all < t_qkv, f"all fusions: {t_all}")
    # conv + batch_norm (folded into the weights) (+ the skip connection's
    # add) + relu: three convs, one dispatch each.
    check(count("cnn", "--no-fuse") == 14, "cnn unfused")
    check(count("cnn", "--no-fuse=eltwise,norm") == 7, "conv epilogues")
    check(count("cnn", "--no-fuse=epilogue") == 13, "skip + relu2 fused as a chain")
    check(count("cnn") == 7, "cnn fused")
    r = kiln("inspect", ROOT / "samples" / "mlp.yaml", "--no-fuse=loops")
    check(r.returncode == 1 and "unknown fusion 'loops'" in r.stderr, r.stderr)
    # rope is one dispatch (both halves of each pair), and one more for the
    # unrotated tail when n_rot < D (op tests check the values).
    for attrs, want in (({}, 1), ({"interleaved": 1}, 1), ({"n_rot": 4}, 2)):
        y = model_yaml("r", {"x": {"dtype": "f32", "shape": [1, 2, 6, 8]},
                             "c": {"dtype": "f32", "shape": [6, 4 if not attrs.get("n_rot")
                                                             else 2]},
                             "s": {"dtype": "f32", "shape": [6, 4 if not attrs.get("n_rot")
                                                             else 2]}},
                       [{"name": "y", "op": "rope", "inputs": ["x", "c", "s"], **attrs}], ["y"])
        (Path(workdir) / "rope.yaml").write_text(y)
        r = kiln("inspect", Path(workdir) / "rope.yaml", "--format", "json")
        check(r.returncode == 0, r.stderr)
        got = json.loads(r.stdout)["summary"]
        check(got["dispatches"] == want and got["barriers"] == want - 1,
              f"rope {attrs}: {got['dispatches']} dispatches, {got['barriers']} barriers")


def decode_case(precision):
    def test(workdir):
        import interpret
        workdir = Path(workdir)
        src = ROOT / "samples" / "decode"
        r = kiln("compile", src / "decoder.yaml", "--name", "decoder", "-o",
                 workdir / "decoder.c", "--precision", precision)
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        prog = workdir / "decode"
        r = run([CC, "-O1", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror",
                 *EXTRA_CFLAGS, "-I", ROOT / "runtime", "-I", workdir, "-o", prog,
                 workdir / "decoder.c", src / "decode.c", "-L", BUILD, "-lkilnrt", VULKAN_LIB,
                 "-lm"])
        check(r.returncode == 0, f"building the decode sample failed:\n{r.stderr}")
        prompt, new = 7, 9
        r = run([prog, "-q", "-p", str(prompt), "-n", str(new), "--dump", workdir],
                env={"KILN_VALIDATION": VALIDATION})
        check(r.returncode == 0, f"decode failed ({r.returncode}):\n{r.stderr}")
        tokens = [int(t) for t in (workdir / "tokens.txt").read_text().split()]
        check(len(tokens) == prompt + new, f"{len(tokens)} tokens")
        empty = np.zeros((1, 0, 64), np.float32)
        state = {f"{kv}_cache{l}": empty for kv in "kv" for l in range(2)}
        for k in range(new):
            n = prompt + k  # tokens the model has seen after this step
            seq = np.array(tokens[:n], np.int32)
            logits, nxt = interpret.interpret(src / "decoder.yaml",
                                              [seq, np.arange(n, dtype=np.int32)], state)
            got = np.fromfile(workdir / f"logits_{k}.bin", np.float32).reshape(-1, 256)
            want = logits if k == 0 else logits[-1:]
            if precision == "f16":
                assert_relative(got, want, F16_TOLERANCE, f"logits of step {k}")
                near = 2 * F16_TOLERANCE * np.abs(want).max()
            else:
                assert_close(got, want, 1e-3, 1e-3, f"logits of step {k}")
                near = 1e-3
            top = np.sort(logits[-1])[-2:]
            if top[1] - top[0] > near:  # the greedy choice, unless a near tie
                check(tokens[n] == int(nxt[-1]), f"step {k}: token {tokens[n]}, reference "
                      f"{int(nxt[-1])}")
    return test


case("sample samples/decode: cached greedy decoding matches the CPU reference "
     "recomputing the whole prefix without a cache")(decode_case("f32"))
case("sample samples/decode --precision f16: cached greedy decoding within the f16 bound "
     "of the f32 CPU reference")(decode_case("f16"))


@case("run_model: .npy inputs and outputs of every dtype (dtype and shape checked), as raw "
      ".bin gives")
def _(workdir):
    wd = Path(workdir)
    y = model_yaml("np", {"x": {"dtype": "f32", "shape": [3, 5]},
                          "i": {"dtype": "i64", "shape": [4]}},
                   [{"name": "s", "op": "softmax", "inputs": ["x"]},
                    {"name": "j", "op": "add", "inputs": ["i", "i"]}], ["s", "j"])
    build_model(wd, y)
    prog = link_model(wd)
    r0 = np.random.default_rng(7)
    x = r0.standard_normal([3, 5]).astype(np.float32)
    i = r0.integers(-50, 50, [4]).astype(np.int64)
    np.save(wd / "x.npy", x)
    np.save(wd / "i.npy", i)
    r = run([prog, "-q", "-i", wd / "x.npy", "-i", wd / "i.npy", "-o", wd / "s.npy",
             "-o", wd / "j.npy"], env={"KILN_VALIDATION": VALIDATION})
    check(r.returncode == 0, r.stdout + r.stderr)
    s, j = np.load(wd / "s.npy"), np.load(wd / "j.npy")
    check(s.dtype == np.float32 and s.shape == (3, 5), f"s: {s.dtype} {s.shape}")
    check(j.dtype == np.int64 and j.shape == (4,), f"j: {j.dtype} {j.shape}")
    assert_close(s, ref.softmax(x), 1e-5, 1e-6, "s")
    check((j == 2 * i).all(), f"j: {j} != {2 * i}")
    # the same run through raw files gives the same bytes
    got = run_program(prog, [x, i], [s, j])
    check(got[0].tobytes() == s.tobytes() and got[1].tobytes() == j.tobytes(),
          ".npy and .bin runs differ")
    # every dtype kiln reads, through .npy both ways (outputs that are views
    # of the inputs)
    kinds = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64,
             "bool": np.bool_, "u8": np.uint8, "i8": np.int8}
    y = model_yaml("dt", {f"x_{k}": {"dtype": k, "shape": [2, 3]} for k in kinds},
                   [{"name": f"y_{k}", "op": "reshape", "inputs": [f"x_{k}"], "shape": [3, 2]}
                    for k in kinds], [f"y_{k}" for k in kinds])
    sub = wd / "dtypes"
    sub.mkdir()
    build_model(sub, y)
    args = [sub / "model", "-q"]
    for k, t in kinds.items():
        a = (r0.standard_normal([2, 3]) * 50).astype(t) if t != np.bool_ else \
            r0.random([2, 3]) < 0.5
        np.save(sub / f"x_{k}.npy", a)
        args += ["-i", sub / f"x_{k}.npy"]
    args += [a for k in kinds for a in ("-o", sub / f"y_{k}.npy")]
    r = run(args, env={"KILN_VALIDATION": VALIDATION})
    check(r.returncode == 0, r.stdout + r.stderr)
    for k, t in kinds.items():
        got, want = np.load(sub / f"y_{k}.npy"), np.load(sub / f"x_{k}.npy").reshape(3, 2)
        check(got.dtype == want.dtype and got.shape == (3, 2) and
              got.tobytes() == want.tobytes(), f"{k}: {got.dtype} {got.shape} {got} {want}")
    # a wrong dtype, a wrong shape, Fortran order: each refused by name
    for bad, what in [(x.astype(np.float64), "'<f8'"), (x.reshape(5, 3), "(5, 3)"),
                      (np.asfortranarray(x), "'fortran_order': True")]:
        np.save(wd / "bad.npy", bad)
        r = run([prog, "-q", "-i", wd / "bad.npy", "-i", wd / "i.npy"])
        check(r.returncode == 1 and what in r.stderr and "input 'x' needs dtype f32 (<f4), "
              "shape (3, 5), C order" in r.stderr, f"{what}: {r.returncode} {r.stderr}")


def fnv1a(data):
    h = 1469598103934665603
    for c in data:
        h = ((h ^ c) * 1099511628211) & (1 << 64) - 1
    return h


@case("pipeline cache: written after create, read by the next start, a damaged file "
      "ignored and rewritten, KILN_CACHE_DIR= turns it off")
def _(workdir):
    wd = Path(workdir)
    prog = build_model(wd, model_yaml("pc", {"x": {"dtype": "f32", "shape": [4, 8]}},
                                      [{"name": "y", "op": "softmax", "inputs": ["x"]}], ["y"]))
    x = np.random.default_rng(11).standard_normal([4, 8]).astype(np.float32)
    want = ref.softmax(x)
    cache = wd / "cache"

    def start(env_dir):
        np.ascontiguousarray(x).tofile(wd / "x.bin")
        r = run([prog, "-q", "-i", wd / "x.bin", "-o", wd / "y.bin"],
                env={"KILN_VALIDATION": VALIDATION, "KILN_CACHE_DIR": env_dir})
        check(r.returncode == 0, r.stdout + r.stderr)
        assert_close(np.fromfile(wd / "y.bin", np.float32).reshape(4, 8), want, 1e-5, 1e-6)
        return sorted((cache / "pipelines").glob("*.vkpc")) if (cache / "pipelines").exists() \
            else []

    def valid(path):
        b = path.read_bytes()
        n = struct.unpack("<Q", b[8:16])[0]
        return (b[:8] == b"KILNPC01" and n == len(b) - 24 and
                fnv1a(b[24:]) == struct.unpack("<Q", b[16:24])[0])

    check(start("") == [] and not cache.exists(), "KILN_CACHE_DIR= wrote a pipeline cache")
    files = start(str(cache))
    check(len(files) == 1 and valid(files[0]), f"no valid pipeline cache written: {files}")
    first = files[0].read_bytes()
    check(first[24:28] != b"\0\0\0\0", "the Vulkan header is missing")
    files[0].write_bytes(first[:-1] + bytes([first[-1] ^ 0xff]))  # damaged: checksum off
    files = start(str(cache))
    check(len(files) == 1 and valid(files[0]), "a damaged cache file was not rewritten")
    files[0].write_bytes(b"KILNPC01" + b"\xff" * 8)  # truncated
    files = start(str(cache))
    check(len(files) == 1 and valid(files[0]), "a truncated cache file was not rewritten")
    check(not list((cache / "pipelines").glob("*.tmp")), "a temporary file was left behind")


@case("weights record beside the pipeline cache: written after a create checks the sidecar "
      "whole; a sidecar changed in place since (its modification time set back) is checked "
      "again and its damage found; a damaged record is ignored")
def _(workdir):
    import interpret
    wd = Path(workdir)
    path = ROOT / "samples" / "mlp.yaml"
    wfile = wd / "model.weights"
    prog = build_model(wd, path.read_text(), flags=["--weights-file", str(wfile)])
    x = np.random.default_rng(5).standard_normal([4, 256]).astype(np.float32)
    want = interpret.interpret(path, [x])[0]
    cache = wd / "cache"

    def start(ok=True, words=()):
        x.tofile(wd / "x.bin")
        r = run([prog, "-q", "-i", wd / "x.bin", "-o", wd / "y.bin"],
                env={"KILN_VALIDATION": VALIDATION, "KILN_CACHE_DIR": str(cache)})
        if ok:
            check(r.returncode == 0, r.stdout + r.stderr)
            assert_close(np.fromfile(wd / "y.bin", np.float32).reshape(want.shape), want,
                         1e-4, 1e-5)
        else:
            check(r.returncode == 1 and all(w in r.stderr for w in words),
                  f"exit {r.returncode}: {r.stderr}")
        return sorted((cache / "pipelines").glob("*.vkpc.weights"))

    stamps = start()
    check(len(stamps) == 1, f"no weights record: {list(cache.rglob('*'))}")
    b = stamps[0].read_bytes()
    st = wfile.stat()
    fields = struct.unpack("<8Q", b[8:72])
    check(b[:8] == b"KILNWS01" and len(b) == 80 and fields[:3] == (st.st_dev, st.st_ino,
          st.st_size) and fields[3] * 10**9 + fields[4] == st.st_mtime_ns,
          f"record {fields} for {st}")
    start()  # the record matches: trusted, same results
    raw = bytearray(wfile.read_bytes())
    with open(wfile, "r+b") as f:  # the same file, one byte changed, its time set back
        f.seek(24 + len(raw) // 3)
        f.write(bytes([raw[24 + len(raw) // 3] ^ 0x40]))
    os.utime(wfile, ns=(st.st_atime_ns, st.st_mtime_ns))
    start(False, ["is corrupt", "checksum"])
    # A record forged for the damaged file (what a matching one does: its bytes
    # are not hashed again): create succeeds, whatever the weights now hold.
    st2 = wfile.stat()
    body = b"KILNWS01" + struct.pack("<8Q", st2.st_dev, st2.st_ino, st2.st_size,
                                     st2.st_mtime_ns // 10**9, st2.st_mtime_ns % 10**9,
                                     st2.st_ctime_ns // 10**9, st2.st_ctime_ns % 10**9,
                                     fields[7])
    stamps[0].write_bytes(body + struct.pack("<Q", fnv1a(body)))
    x.tofile(wd / "x.bin")
    r = run([prog, "-q", "-i", wd / "x.bin", "-o", wd / "y.bin"],
            env={"KILN_VALIDATION": VALIDATION, "KILN_CACHE_DIR": str(cache)})
    check(r.returncode == 0, f"a matching record was not trusted: {r.stderr}")
    wfile.write_bytes(bytes(raw))
    start()
    stamps[0].write_bytes(b"KILNWS01" + b"\0" * 72)  # damaged: ignored, rewritten
    start()
    check(stamps[0].read_bytes()[:72] != b"KILNWS01" + b"\0" * 64, "record not rewritten")
