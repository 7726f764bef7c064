"""test_cli.py: the command line, and every error a bad model must produce.

An error case is a model (plus files) that kiln must reject with exit status
1, a first line `model.yaml:LINE:COL: error: ...` at the expected place
containing the expected words (the node's name among them), and no output
file left behind.
"""
import json
import os
import re
import stat
import struct
from pathlib import Path

from harness import KILN, ROOT, check, kiln, run

TESTS = []

GOOD_HEAD = """name: t
inputs:
  x: {dtype: f32, shape: [2, 3]}
"""

ERRORS = [
    # (name, model text, line, col, words that must appear)
    ("malformed YAML", GOOD_HEAD + "nodes: [{name: y, op: relu, inputs: [x]\noutputs: [y]\n",
     5, 1, ["malformed YAML"]),
    ("empty file", "", None, None, ["empty model file"]),
    ("not a mapping", "- 1\n- 2\n", 1, 1, ["the model must be a mapping"]),
    ("unknown top-level key", GOOD_HEAD + "nodez: []\n", 4, 1, ["unknown key 'nodez'"]),
    ("unknown op", GOOD_HEAD + "nodes:\n  - {name: y, op: frobnicate, inputs: [x]}\n"
     "outputs: [y]\n", 5, 19, ["node 'y'", "unknown op 'frobnicate'"]),
    ("wrong arity", GOOD_HEAD + "nodes:\n  - {name: y, op: add, inputs: [x]}\n"
     "outputs: [y]\n", 5, 32, ["node 'y'", "add takes 2 inputs, got 1"]),
    ("shapes do not broadcast",
     GOOD_HEAD + "  z: {dtype: f32, shape: [4]}\nnodes:\n"
     "  - {name: s, op: add, inputs: [x, z]}\noutputs: [s]\n",
     6, 5, ["node 's'", "[2, 3]", "[4]", "do not broadcast"]),
    ("shapes do not multiply",
     GOOD_HEAD + "  w: {dtype: f32, shape: [4, 5]}\nnodes:\n"
     "  - {name: mm, op: matmul, inputs: [x, w]}\noutputs: [mm]\n",
     6, 5, ["node 'mm'", "inner dimensions 3 and 4"]),
    ("missing weight file",
     GOOD_HEAD + "weights:\n  w: {dtype: f32, shape: [3], file: nowhere.bin}\n"
     "nodes:\n  - {name: y, op: add, inputs: [x, w]}\noutputs: [y]\n",
     5, 31, ["weight 'w'", "nowhere.bin", "No such file"]),
    ("short weight file",
     GOOD_HEAD + "weights:\n  w: {dtype: f32, shape: [3], file: short.bin, offset: 4}\n"
     "nodes:\n  - {name: y, op: add, inputs: [x, w]}\noutputs: [y]\n",
     5, 31, ["weight 'w'", "needs 12 bytes at offset 4", "has 8 bytes"]),
    ("duplicate names",
     GOOD_HEAD + "nodes:\n  - {name: y, op: relu, inputs: [x]}\n"
     "  - {name: y, op: exp, inputs: [x]}\noutputs: [y]\n",
     6, 12, ["'y' is defined twice", "first at line 5"]),
    ("duplicate input and node", GOOD_HEAD + "nodes:\n  - {name: x, op: relu, inputs: [x]}\n"
     "outputs: [x]\n", 5, 12, ["'x' is defined twice"]),
    ("cycle",
     GOOD_HEAD + "nodes:\n  - {name: a, op: add, inputs: [x, b]}\n"
     "  - {name: b, op: relu, inputs: [a]}\noutputs: [b]\n",
     6, 5, ["node 'b' is on a cycle"]),
    ("self reference", GOOD_HEAD + "nodes:\n  - {name: a, op: relu, inputs: [a]}\n"
     "outputs: [a]\n", 5, 5, ["node 'a' is on a cycle"]),
    ("undefined tensor", GOOD_HEAD + "nodes:\n  - {name: y, op: add, inputs: [x, ghost]}\n"
     "outputs: [y]\n", 5, 36, ["node 'y'", "input 'ghost' is not defined"]),
    ("undefined output", GOOD_HEAD + "nodes:\n  - {name: y, op: relu, inputs: [x]}\n"
     "outputs: [y, q]\n", 6, 14, ["output 'q' is not defined"]),
    ("unknown attribute", GOOD_HEAD + "nodes:\n  - {name: y, op: softmax, inputs: [x], "
     "axes: 1}\noutputs: [y]\n", 5, 41, ["node 'y'", "no attribute 'axes'", "axis"]),
    ("attribute of the wrong type", GOOD_HEAD + "nodes:\n  - {name: y, op: softmax, "
     "inputs: [x], axis: last}\noutputs: [y]\n", 5, 47, ["node 'y'", "axis must be an integer"]),
    ("softmax axis out of range", GOOD_HEAD + "nodes:\n  - {name: y, op: softmax, "
     "inputs: [x], axis: 2}\noutputs: [y]\n", 5, 47, ["node 'y'", "axis 2 is out of range"]),
    ("keep_dims not 0 or 1", GOOD_HEAD + "nodes:\n  - {name: y, op: reduce_sum, "
     "inputs: [x], keep_dims: 2}\noutputs: [y]\n", 5, 55, ["node 'y'", "keep_dims must be 0 or 1"]),
    ("group_norm groups that do not divide",
     "name: t\ninputs:\n  x: {dtype: f32, shape: [1, 6, 4]}\n  s: {dtype: f32, shape: [6]}\n"
     "nodes:\n  - {name: g, op: group_norm, inputs: [x, s, s], groups: 4}\noutputs: [g]\n",
     6, 58, ["node 'g'", "positive divisor of the 6 channels"]),
    ("instance_norm scale of the wrong size",
     "name: t\ninputs:\n  x: {dtype: f32, shape: [1, 6, 4]}\n  s: {dtype: f32, shape: [4]}\n"
     "nodes:\n  - {name: i, op: instance_norm, inputs: [x, s, s]}\noutputs: [i]\n",
     6, 46, ["node 'i'", "'s' has shape [4]", "[6]"]),
    ("residual of another shape",
     GOOD_HEAD + "  r: {dtype: f32, shape: [3]}\nnodes:\n"
     "  - {name: n, op: residual_rms_norm, inputs: [x, r]}\noutputs: [n]\n",
     6, 50, ["node 'n'", "residual 'r' [3] must have the shape"]),
    ("reduce over a repeated axis", GOOD_HEAD + "nodes:\n  - {name: y, op: reduce_max, "
     "inputs: [x], axes: [1, -1]}\noutputs: [y]\n", 5, 50, ["node 'y'", "axis 1 twice"]),
    ("layer_norm gamma of the wrong size",
     GOOD_HEAD + "  g: {dtype: f32, shape: [2]}\nnodes:\n"
     "  - {name: n, op: layer_norm, inputs: [x, g]}\noutputs: [n]\n",
     6, 43, ["node 'n'", "gamma 'g'", "shape [3] of the normalized axes"]),
    ("layer_norm eps not positive", GOOD_HEAD + "nodes:\n  - {name: n, op: layer_norm, "
     "inputs: [x], eps: 0}\noutputs: [n]\n", 5, 49, ["node 'n'", "eps must be positive"]),
    ("reshape to the wrong count", GOOD_HEAD + "nodes:\n  - {name: r, op: reshape, "
     "inputs: [x], shape: [4, 2]}\noutputs: [r]\n", 5, 48,
     ["node 'r'", "cannot reshape [2, 3]", "[4, 2]"]),
    ("reshape with two -1", GOOD_HEAD + "nodes:\n  - {name: r, op: reshape, "
     "inputs: [x], shape: [-1, -1]}\noutputs: [r]\n", 5, 48, ["more than one -1"]),
    ("transpose with a repeated axis", GOOD_HEAD + "nodes:\n  - {name: t, op: transpose, "
     "inputs: [x], perm: [0, 0]}\noutputs: [t]\n", 5, 49, ["node 't'", "axis 0 twice"]),
    ("transpose of the wrong length", GOOD_HEAD + "nodes:\n  - {name: t, op: transpose, "
     "inputs: [x], perm: [0, 1, 2]}\noutputs: [t]\n", 5, 49, ["perm has 3 axes"]),
    ("unknown dtype", "name: t\ninputs:\n  x: {dtype: f33, shape: [2]}\n", 3, 14,
     ["unknown dtype 'f33'"]),
    ("negative dimension", "name: t\ninputs:\n  x: {dtype: f32, shape: [2, -3]}\n",
     3, 30, ["dimension 1 of 'x' is negative"]),
    ("too many elements", "name: t\ninputs:\n  x: {dtype: f32, shape: [65536, 65536, 2]}\n",
     3, 26, ["2^32 - 1"]),
    ("dimension overflows", "name: t\ninputs:\n  x: {dtype: f32, shape: [99999999999999999999]}\n",
     3, 27, ["must be an integer"]),
    ("dimension of 2^63 - 1", "name: t\ninputs:\n  x: {dtype: f32, shape: "
     "[9223372036854775807]}\n", 3, 26, ["2^32 - 1"]),
    ("element count over 2^64", "name: t\ninputs:\n  x: {dtype: f32, shape: "
     "[4294967296, 4294967296, 2]}\n", 3, 26, ["2^32 - 1"]),
    ("reshape product overflows", GOOD_HEAD + "nodes:\n  - {name: r, op: reshape, "
     "inputs: [x], shape: [3037000500, 3037000500, -1]}\noutputs: [r]\n", 5, 48,
     ["node 'r'", "cannot reshape [2, 3]"]),
    ("tile product overflows", GOOD_HEAD + "nodes:\n  - {name: t, op: tile, "
     "inputs: [x], repeats: [4611686018427387904, 4]}\noutputs: [t]\n", 5, 5,
     ["node 't'", "2^32 - 1"]),
    ("nesting too deep", GOOD_HEAD + "nodes:\n  - {name: y, op: relu, inputs: [x], alpha: "
     + "[" * 100 + "]" * 100 + "}\noutputs: [y]\n", 5, 108, ["nested deeper than 64"]),
    ("list containing itself", GOOD_HEAD + "nodes: &n [*n]\noutputs: [y]\n", 4, 8,
     ["a node must be a mapping, not a list"]),
    ("weight from a device", GOOD_HEAD + "weights:\n  w: {dtype: f32, shape: [3], "
     "file: /dev/zero}\nnodes:\n  - {name: y, op: add, inputs: [x, w]}\noutputs: [y]\n",
     5, 31, ["weight 'w'", "cannot read /dev/zero"]),
    ("weight value out of range", GOOD_HEAD + "weights:\n  w: {dtype: i8, shape: [2], "
     "values: [1, 300]}\nnodes:\n  - {name: y, op: cast, inputs: [w], to: f32}\n"
     "outputs: [y]\n", 5, 30, ["weight 'w'", "value 1 (300) is out of its range [-128, 127]"]),
    ("weight without data", GOOD_HEAD + "weights:\n  w: {dtype: f32, shape: [3]}\n", 5, 6,
     ["weight 'w' has no data"]),
    ("weight with two sources", GOOD_HEAD + "weights:\n  w: {dtype: f32, shape: [1], "
     "value: 1, file: a.bin}\n", 5, 41, ["two data sources"]),
    ("wrong number of values", GOOD_HEAD + "weights:\n  w: {dtype: f32, shape: [3], "
     "values: [1, 2]}\nnodes:\n  - {name: y, op: add, inputs: [x, w]}\noutputs: [y]\n",
     5, 31, ["weight 'w'", "3 elements but 2 values"]),
    ("safetensors key missing",
     GOOD_HEAD + "weights:\n  w: {dtype: f32, shape: [3], safetensors: m.safetensors, "
     "key: nope}\nnodes:\n  - {name: y, op: add, inputs: [x, w]}\noutputs: [y]\n",
     5, 31, ["weight 'w'", "no tensor named 'nope'"]),
    ("safetensors shape mismatch",
     GOOD_HEAD + "weights:\n  w: {dtype: f32, shape: [3], safetensors: m.safetensors, "
     "key: w4}\nnodes:\n  - {name: y, op: add, inputs: [x, w]}\noutputs: [y]\n",
     5, 31, ["weight 'w'", "declared [3]", "[4]"]),
    ("truncated safetensors",
     GOOD_HEAD + "weights:\n  w: {dtype: f32, shape: [3], safetensors: bad.safetensors, "
     "key: w}\nnodes:\n  - {name: y, op: add, inputs: [x, w]}\noutputs: [y]\n",
     5, 31, ["weight 'w'", "not a safetensors file"]),
    ("no outputs", GOOD_HEAD + "nodes:\n  - {name: y, op: relu, inputs: [x]}\n", 1, 1,
     ["no outputs"]),
    ("matmul of a dtype it lacks", "name: t\ninputs:\n  x: {dtype: i32, shape: [2, 2]}\n"
     "nodes:\n  - {name: m, op: matmul, inputs: [x, x]}\noutputs: [m]\n", 5, 36,
     ["node 'm'", "needs f32 input", "'x' is i32"]),
]


def safetensors(tensors):
    """A .safetensors file of f32 tensors {name: (shape, bytes)}."""
    import json
    import struct
    header, data = {}, b""
    for name, (shape, raw) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


FILES = {
    "short.bin": b"\0" * 8,
    "m.safetensors": safetensors({"w4": ([4], b"\0" * 16), "w": ([3], b"\0" * 12)}),
    "bad.safetensors": b"\xff" * 9,
}


def error_case(text, line, col, words):
    def test(workdir):
        wd = Path(workdir)
        (wd / "model.yaml").write_text(text)
        for name, data in FILES.items():
            (wd / name).write_bytes(data)
        r = kiln("compile", "model.yaml", "-o", "out.c", cwd=wd)
        check(r.returncode == 1, f"exit status {r.returncode}, expected 1\n{r.stderr}")
        first = r.stderr.splitlines()[0] if r.stderr else ""
        if line is None:
            check(first.startswith("model.yaml: error: "), f"unlocated message: {first}")
        else:
            m = re.match(r"model\.yaml:(\d+):(\d+): error: ", first)
            check(m is not None, f"no FILE:LINE:COL: error: in {first!r}")
            check((int(m[1]), int(m[2])) == (line, col),
                  f"located at {m[1]}:{m[2]}, expected {line}:{col}: {first}")
        for w in words:
            check(w in first, f"{w!r} missing from {first!r}")
        check(not (wd / "out.c").exists() and not (wd / "out.h").exists(),
              "an output file was left behind")
        check("internal error" not in r.stderr, r.stderr)
    return test


for name, text, line, col, words in ERRORS:
    TESTS.append((f"cli error: {name}", error_case(text, line, col, words)))


def test_usage(workdir):
    r = kiln("--version")
    check(r.returncode == 0 and r.stdout.startswith("kiln "), r.stdout + r.stderr)
    r = kiln("--help")
    check(r.returncode == 0 and "kiln compile MODEL" in r.stdout and "--shape" in r.stdout
          and "kiln tensor" in r.stdout, r.stdout)
    r = kiln()
    check(r.returncode == 2 and "usage:" in r.stderr, "no arguments")
    r = kiln("frob")
    check(r.returncode == 2 and "unknown command 'frob'" in r.stderr, r.stderr)
    r = kiln("compile")
    check(r.returncode == 1 and "no model given" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--bogus")
    check(r.returncode == 1 and "unknown option '--bogus'" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--weights", "int3")
    check(r.returncode == 1 and "--weights: unknown format 'int3'" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--precision", "f8")
    check(r.returncode == 1 and "--precision: unknown precision 'f8'" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--keep-f32", "h")
    check(r.returncode == 1 and "--keep-f32 is for --precision f16" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--io", "f16")
    check(r.returncode == 1 and "--io f16 is for --precision f16" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--activations", "int4")
    check(r.returncode == 1 and "--activations: unknown choice 'int4'" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--weights", "fp8-e4m3", "--activations", "int8")
    check(r.returncode == 1 and "--activations int8 is for --weights int8, int8-asym, int4 "
          "or int4-asym" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--precision", "f16", "--io", "bf16")
    check(r.returncode == 1 and "--io: unknown type 'bf16'" in r.stderr, r.stderr)
    r = kiln("compile", ROOT / "samples" / "mlp.yaml", "--precision", "f16", "--keep-f32",
             "h,nosuch", "-o", Path(workdir) / "m.c")
    check(r.returncode == 1 and "--keep-f32: the model has no node named 'nosuch'" in r.stderr,
          r.stderr)
    r = kiln("compile", "m.yaml", "--name", "9lives")
    check(r.returncode == 1 and "not a C identifier" in r.stderr, r.stderr)
    r = kiln("compile", "m.pt")
    check(r.returncode == 1 and "unsupported model format" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--shape", "x=1x2")
    check(r.returncode == 1 and "--shape and --const are for ONNX models" in r.stderr, r.stderr)
    r = kiln("compile", "missing.yaml", cwd=workdir)
    check(r.returncode == 1 and "missing.yaml: error: cannot read" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "-o", "out.txt")
    check(r.returncode == 1 and "must end in .c" in r.stderr, r.stderr)
    # An output directory that does not exist is named as such, before any
    # compiling (the model need not even exist), for -o, --weights-file,
    # inspect -o and --html; so is one that is a file.
    wd = Path(workdir)
    (wd / "file").write_text("")
    for args in (["compile", "m.yaml", "-o", wd / "nodir" / "m.c"],
                 ["compile", "m.yaml", "--weights-file", wd / "nodir" / "w.bin"],
                 ["inspect", "m.yaml", "-o", wd / "nodir" / "i.txt"],
                 ["inspect", "m.yaml", "--html", wd / "nodir" / "i.html"]):
        r = kiln(*args)
        check(r.returncode == 1 and f"cannot write {args[-1]}: the directory {wd / 'nodir'} "
              "does not exist" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "-o", wd / "file" / "m.c")
    check(r.returncode == 1 and f"{wd / 'file'} is not a directory" in r.stderr, r.stderr)


def test_usage_lists_every_option(workdir):
    """Every option the command line takes (each "--x" that main.c compares
    an argument with) is in --help's usage lines and in docs/cli.md's copy."""
    src = (ROOT / "compiler" / "main.c").read_text()
    options = set(re.findall(r'strn?cmp\(arg, "(-[-a-z]+)"', src))
    check(len(options) > 15, f"found only {sorted(options)} in main.c")
    help_text = kiln("--help").stdout
    synopsis = help_text[:help_text.index("\n\n")]
    readme = (ROOT / "docs" / "cli.md").read_text()
    block = readme[readme.index("```\nkiln compile MODEL"):]
    block = block[:block.index("```", 4)]
    for o in sorted(options):
        check(o in synopsis, f"{o} missing from --help's usage lines:\n{synopsis}")
        check(o in block, f"{o} missing from docs/cli.md's usage block:\n{block}")
        check(o in help_text[len(synopsis):] or o in ("-o", "-v"),
              f"{o} is not explained in --help")


def test_name_and_output(workdir):
    """--name sets the prefix; the default is the sanitized model name. The
    output files default to the model file's name, in the current directory
    (an ONNX file's graph name, often torch_jit or main_graph, is not used),
    and the summary line names them."""
    wd = Path(workdir)
    (wd / "sub").mkdir()
    (wd / "sub" / "m.v2.yaml").write_text(
        "name: 2-layer net\ninputs:\n  x: {dtype: f32, shape: [3]}\n"
        "nodes:\n  - {name: y, op: relu, inputs: [x]}\noutputs: [y]\n")
    r = kiln("compile", "sub/m.v2.yaml", cwd=wd)
    check(r.returncode == 0, r.stderr)
    check((wd / "m.v2.c").exists() and (wd / "m.v2.h").exists(),
          f"default output: {sorted(p.name for p in wd.iterdir())}")
    check("-> m.v2.c:" in r.stdout, r.stdout)
    check("m_2_layer_net_create(" in (wd / "m.v2.h").read_text(), "prefix")
    onnx = ROOT / "tests" / "models" / "resnet_tiny_dynamo20" / "model.onnx"
    (wd / "cnn.onnx").write_bytes(onnx.read_bytes())
    r = kiln("compile", "cnn.onnx", cwd=wd)
    check(r.returncode == 0 and (wd / "cnn.c").exists() and (wd / "cnn.h").exists(),
          f"{r.stderr} {sorted(p.name for p in wd.iterdir())}")
    (wd / "m.yaml").write_text((wd / "sub" / "m.v2.yaml").read_text())
    r = kiln("compile", "m.yaml", "--name", "net", "-o", "sub.c", cwd=wd)
    check(r.returncode == 0, r.stderr)
    h = (wd / "sub.h").read_text()
    check("kiln_status net_create(" in h and "NET_ARENA_BYTES" in h, "--name net")


def test_time_stages(workdir):
    """--time prints every stage of the compile, in order, with a time that
    adds up to the total, and the host memory held after it and at most so
    far (never less than after it, never falling); without it, stderr
    holds none of those lines."""
    wd = Path(workdir)
    stages = ["read", "weights", "shapes", "optimize", "precision", "encode", "lower", "plan",
              "kernels", "emit", "write"]  # and "sidecar" before emit when there is one
    r = kiln("compile", ROOT / "samples" / "mlp.yaml", "-o", "m.c", "--time", cwd=wd)
    check(r.returncode == 0, r.stderr)
    rows = re.findall(r"^kiln: (\w+) +([0-9.]+) s \(([0-9.]+) s in all\); host memory "
                      r"(\d+) MiB, at most (\d+)$", r.stderr, re.M)
    check([s for s, *_ in rows] == stages, f"stages {rows} in:\n{r.stderr}")
    total = sum(float(t) for _, t, *_ in rows)
    check(abs(total - float(rows[-1][2])) < 0.01, f"stage times sum to {total}: {rows}")
    peaks = [int(p) for *_, p in rows]
    check(all(0 < int(m) <= int(p) + 1 for *_, m, p in rows) and peaks == sorted(peaks),
          f"host memory figures: {rows}")
    r = kiln("compile", ROOT / "samples" / "mlp.yaml", "-o", "m.c", cwd=wd)
    check(r.returncode == 0 and " s in all)" not in r.stderr, r.stderr)
    r = kiln("compile", ROOT / "samples" / "mlp.yaml", "-o", "m.c", "--time",
             "--weights-file", "m.weights", cwd=wd)
    check(r.returncode == 0, r.stderr)
    rows = re.findall(r"^kiln: (\w+) +[0-9.]+ s", r.stderr, re.M)
    check(rows == stages[:9] + ["sidecar"] + stages[9:], f"stages {rows}")


def fnv1a(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def test_kernel_cache(workdir):
    """A warm kernel cache gives the same C as no cache; damaged, foreign or
    invalid entries are compiled afresh (and repaired), never used; a cache
    that cannot be written never fails a compile."""
    wd = Path(workdir)
    model = ROOT / "samples" / "transformer.yaml"
    cache = wd / "cache"

    def compile_with(*opts, env=None):
        out = wd / "out"
        out.mkdir(exist_ok=True)
        r = run([KILN, "compile", model, "-o", "m.c", "-v", *opts], cwd=out,
                env=dict(env or {}, ASAN_OPTIONS="detect_leaks=0"))
        check(r.returncode == 0, r.stderr)
        text = (out / "m.c").read_text()
        # The command line (in the frontmatter) names the options; the rest
        # must be byte for byte the same.
        return re.sub(r"command: .*", "", text), r.stderr

    def counts(err):
        m = re.search(r"kernel cache .*: (\d+) kernels found, (\d+) compiled", err)
        check(m, f"no cache report in: {err}")
        return int(m.group(1)), int(m.group(2))

    ref, err = compile_with("--no-kernel-cache")
    check("kernel cache" not in err, err)
    cold, err = compile_with("--kernel-cache", cache)
    found, compiled = counts(err)
    entries = sorted(cache.glob("*.spv"))
    check(found == 0 and compiled == len(entries) and len(entries) >= 10,
          f"cold: {found} found, {compiled} compiled, {len(entries)} entries")
    check(cold == ref, "cold compile through the cache differs from no cache")
    warm, err = compile_with("--kernel-cache", cache)
    check(counts(err) == (compiled, 0), f"warm: {counts(err)}")
    check(warm == ref, "warm compile differs from no cache")

    # Damage four entries: truncated, a flipped word (checksum), another
    # kernel's entry under this name (key), and valid framing around words
    # that are not valid SPIR-V (caught by validating again).
    a, b, c, d = entries[:4]
    a.write_bytes(a.read_bytes()[:-13])
    raw = bytearray(b.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    b.write_bytes(bytes(raw))
    c.write_bytes(entries[5].read_bytes())
    raw = d.read_bytes()
    klen = struct.unpack_from("<I", raw, 8)[0]
    head = raw[:12 + klen]
    words = [0x07230203, 0x00010500, 0, 10, 0] + [0xDEADBEEF] * 8
    body = head + struct.pack("<I", len(words)) + struct.pack(f"<{len(words)}I", *words)
    d.write_bytes(body + struct.pack("<Q", fnv1a(body)))
    damaged, err = compile_with("--kernel-cache", cache)
    check(counts(err) == (compiled - 3, 3),
          f"damaged entries: {counts(err)} (the invalid SPIR-V is found, then recompiled)")
    check(damaged == ref, "a damaged cache changed the output")
    again, err = compile_with("--kernel-cache", cache)
    check(counts(err) == (compiled, 0) and again == ref, f"not repaired: {counts(err)}")

    # A cache that cannot be made: the compile goes on without it.
    (wd / "file").write_text("x")
    off, err = compile_with("--kernel-cache", wd / "file" / "cache")
    check("kernel cache off" in err and off == ref, err)
    # KILN_CACHE_DIR picks the default; empty turns it off.
    env_cache = wd / "env-cache"
    compile_with(env={"KILN_CACHE_DIR": str(env_cache)})
    check(len(list(env_cache.glob("*.spv"))) == len(entries), "KILN_CACHE_DIR unused")
    _, err = compile_with(env={"KILN_CACHE_DIR": ""})
    check("kernel cache" not in err, f"KILN_CACHE_DIR= left a cache on: {err}")
    r = kiln("compile", model, "--kernel-cache", "")
    check(r.returncode == 1 and "--kernel-cache needs a directory" in r.stderr, r.stderr)


TESTS.append(("cli usage, --help, --version, bad options", test_usage))


def test_precision_f16(workdir):
    """--precision f16 stores mlp's activations and matmul weights in f16
    and casts its input for the product (the model's inputs and outputs stay
    f32; softmax reads f16 logits and writes the f32 output);
    --keep-f32 keeps the named node's group in f32."""
    def dtypes(*flags):
        r = kiln("inspect", ROOT / "samples" / "mlp.yaml", "--format", "json", *flags)
        check(r.returncode == 0, r.stderr)
        j = json.loads(r.stdout)
        return ({t["name"]: t["dtype"] for t in j["tensors"]},
                [d["node"] for d in j["dispatches"]])
    t, nodes = dtypes()
    check(set(t.values()) == {"f32"} and nodes == ["h + h_bias + a", "z + logits", "y"],
          f"f32: {t} {nodes}")
    t, nodes = dtypes("--precision", "f16")
    check(t["a"] == "f16" and t["logits"] == "f16" and t["w1.f16"] == "f16" and
          t["x"] == "f32" and t["y"] == "f32", f"f16: {t}")
    check(nodes == ["x/to_f16", "h + h_bias + a", "z + logits", "y"], f"f16: {nodes}")
    t, nodes = dtypes("--precision", "f16", "--keep-f32", "h_bias")
    check(t["a"] == "f32" and "w1.f16" not in t and t["logits"] == "f16", f"kept: {t}")
    check(nodes == ["h + h_bias + a", "a/to_f16", "z + logits", "y"], f"kept: {nodes}")


TESTS.append(("cli usage lists every option (--help and docs/cli.md)", test_usage_lists_every_option))
TESTS.append(("cli --precision f16 and --keep-f32: dtypes and casts", test_precision_f16))
TESTS.append(("cli kernel cache: warm equals cold, damaged entries recompiled",
              test_kernel_cache))
TESTS.append(("cli --name and default output names", test_name_and_output))
TESTS.append(("cli --time stage report", test_time_stages))

# Errors of the full op set: line and words checked (the column is tested
# above for every kind of place an error can point at).
H4 = ("name: t\ninputs:\n  x: {dtype: f32, shape: [1, 2, 6, 6]}\n"
      "  i: {dtype: i64, shape: [3]}\n  b: {dtype: bool, shape: [2]}\n")


def node_error(op_text, words, head=H4, line=7, out="n"):
    return (head + "nodes:\n  - {name: n, " + op_text + "}\noutputs: [" + out + "]\n", line,
            words)


OP_ERRORS = [
    ("add of mixed dtypes", node_error("op: add, inputs: [x, i]", ["is f32 but 'i' is i64"])),
    ("exp of integers", node_error("op: exp, inputs: [i]", ["exp needs f32 or f16 inputs"])),
    ("logic on floats", node_error("op: and, inputs: [x, x]", ["and needs bool inputs"])),
    ("where with a float condition", node_error("op: where, inputs: [x, x, x]",
                                                ["condition 'x' of where must be bool"])),
    ("cast to an unknown dtype", node_error("op: cast, inputs: [x], to: f64",
                                            ["to must be a dtype"])),
    ("cast without to", node_error("op: cast, inputs: [x]", ["needs a 'to' attribute"])),
    ("gemm of 4-D operands", node_error("op: gemm, inputs: [x, x]", ["gemm needs 2-D"])),
    ("gemm with an unknown activation",
     ("name: t\ninputs:\n  a: {dtype: f32, shape: [2, 3]}\n  w: {dtype: f32, shape: [3, 4]}\n"
      "nodes:\n  - {name: n, op: gemm, inputs: [a, w], activation: swish}\noutputs: [n]\n",
      6, ["unknown activation"])),
    ("squeeze of a non-1 axis", node_error("op: squeeze, inputs: [x], axes: [2]",
                                           ["axis 2 of [1, 2, 6, 6] has size 6"])),
    ("unsqueeze past rank 8", node_error("op: unsqueeze, inputs: [x], axes: [0, 1, 2, 3, 4]",
                                         ["rank 9"])),
    ("slice with a zero step", node_error("op: slice, inputs: [x], starts: [0], ends: [2], "
                                          "steps: [0]", ["a step is 0"])),
    ("slice starts and ends differ", node_error("op: slice, inputs: [x], starts: [0, 1], "
                                                "ends: [2]", ["2 starts but 1 ends"])),
    ("concat without an axis", node_error("op: concat, inputs: [x, x]", ["needs an axis"])),
    ("concat of unequal shapes",
     ("name: t\ninputs:\n  a: {dtype: f32, shape: [2, 3]}\n  c: {dtype: f32, shape: [3, 3]}\n"
      "nodes:\n  - {name: n, op: concat, inputs: [a, c], axis: 1}\noutputs: [n]\n",
      6, ["does not match [2, 3] outside axis 1"])),
    ("split that does not divide", node_error("op: split, inputs: [x], axis: 2, "
                                              "outputs: [p, q, r, s]",
                                              ["does not split into 4 equal parts"], out="p")),
    ("split sizes that do not add up", node_error("op: split, inputs: [x], axis: 2, "
                                                  "sizes: [2, 3], outputs: [p, q]",
                                                  ["sizes add up to 5"], out="p")),
    ("expand that does not broadcast", node_error("op: expand, inputs: [x], shape: [3, 6]",
                                                  ["does not broadcast to [3, 6]"])),
    ("tile with too few repeats", node_error("op: tile, inputs: [x], repeats: [2]",
                                             ["tile needs 4 repeats"])),
    ("depth_to_space of indivisible channels", node_error(
        "op: depth_to_space, inputs: [x], block: 2", ["2 channels do not divide by block^2"])),
    ("depth_to_space with a bad mode", node_error(
        "op: depth_to_space, inputs: [x], block: 1, mode: XYZ", ["mode must be DCR or CRD"])),
    ("space_to_depth of indivisible size", node_error(
        "op: space_to_depth, inputs: [x], block: 4", ["do not divide by block 4"])),
    ("batch_norm with a wrong parameter", node_error(
        "op: batch_norm, inputs: [x, b, b, b, i]", ["needs f32 or f16 inputs"])),
    ("gather with float indices", node_error("op: gather, inputs: [x, x]",
                                             ["needs i32 or i64 index inputs"])),
    ("embedding with a 4-D table", node_error("op: embedding, inputs: [i, x]",
                                              ["embedding table 'x' must be 2-D"])),
    ("gather_elements of another rank", node_error("op: gather_elements, inputs: [x, i]",
                                                   ["must have the rank of the data"])),
    ("scatter with an unknown reduction", node_error(
        "op: scatter_elements, inputs: [x, i, x], reduction: avg",
        ["reduction must be none, add, mul, max or min"])),
    ("one_hot without depth", node_error(
        "op: one_hot, inputs: [i]", ["one_hot needs the attribute depth (it has no default)"])),
    ("trilu of a vector", node_error("op: trilu, inputs: [i]", ["trilu needs a matrix"])),
    ("pad with too few pads", node_error("op: pad, inputs: [x], pads: [1, 1]",
                                         ["pads needs 8 values"])),
    ("pad with an unknown mode", node_error("op: pad, inputs: [x], pads: [0, 0, 1, 1, 0, 0, 1, 1], "
                                            "mode: wrap", ["mode must be constant, reflect"])),
    ("attention with a wrong layout", node_error("op: attention, inputs: [x, x, x], layout: sbhd",
                                                 ["layout must be bhsd or bshd"])),
    ("attention heads that do not divide", (
        "name: t\ninputs:\n  q: {dtype: f32, shape: [1, 4, 6, 8]}\n"
        "  k: {dtype: f32, shape: [1, 3, 6, 8]}\n"
        "nodes:\n  - {name: n, op: attention, inputs: [q, k, k]}\noutputs: [n]\n",
        6, ["4 query heads do not divide into 3"])),
    ("attention mask that does not broadcast", node_error(
        "op: attention, inputs: [x, x, x, i]", ["needs f32 or f16 inputs"])),
    ("grouped_matmul with weights not [E, K, N]", (
        "name: t\ninputs:\n  x: {dtype: f32, shape: [4, 8]}\n"
        "  w: {dtype: f32, shape: [3, 6, 5]}\n  e: {dtype: i32, shape: [4]}\n"
        "nodes:\n  - {name: n, op: grouped_matmul, inputs: [x, w, e]}\noutputs: [n]\n",
        7, ["'w' are [3, 6, 5]; they must be [experts, 8, N]"])),
    ("grouped_matmul with an index per the wrong rows", (
        "name: t\ninputs:\n  x: {dtype: f32, shape: [4, 8]}\n"
        "  w: {dtype: f32, shape: [3, 8, 5]}\n  e: {dtype: i32, shape: [5]}\n"
        "nodes:\n  - {name: n, op: grouped_matmul, inputs: [x, w, e]}\noutputs: [n]\n",
        7, ["index 'e' is [5]; it must be [4]"])),
    ("grouped_matmul with float expert indices", (
        "name: t\ninputs:\n  x: {dtype: f32, shape: [4, 8]}\n"
        "  w: {dtype: f32, shape: [3, 8, 5]}\n  e: {dtype: f32, shape: [4]}\n"
        "nodes:\n  - {name: n, op: grouped_matmul, inputs: [x, w, e]}\noutputs: [n]\n",
        7, ["needs an i32 or i64 expert index"])),
    ("grouped_matmul with a bias not [E, N]", (
        "name: t\ninputs:\n  x: {dtype: f32, shape: [4, 8]}\n"
        "  w: {dtype: f32, shape: [3, 8, 5]}\n  e: {dtype: i32, shape: [4]}\n"
        "  b: {dtype: f32, shape: [5]}\n"
        "nodes:\n  - {name: n, op: grouped_matmul, inputs: [x, w, e, b]}\noutputs: [n]\n",
        8, ["bias 'b' is [5]; it must be [3, 5]"])),
    ("dft of a signal without a real/imaginary axis", node_error(
        "op: dft, inputs: [x]", ["dft needs [..., N, ..., 1 or 2]"])),
    ("dft along the real/imaginary axis", (
        "name: t\ninputs:\n  c: {dtype: f32, shape: [4, 8, 2]}\n"
        "nodes:\n  - {name: n, op: dft, inputs: [c], axis: -1}\noutputs: [n]\n",
        5, ["axis 2 holds the real and imaginary parts"])),
    ("inverse one-sided dft", (
        "name: t\ninputs:\n  c: {dtype: f32, shape: [4, 8, 2]}\n"
        "nodes:\n  - {name: n, op: dft, inputs: [c], inverse: 1, onesided: 1}\n"
        "outputs: [n]\n", 5, ["unsupported: a one-sided inverse transform (irfft)"])),
    ("dft longer than 16384 points", (
        "name: t\ninputs:\n  c: {dtype: f32, shape: [4, 8, 2]}\n"
        "nodes:\n  - {name: n, op: dft, inputs: [c], length: 20000}\noutputs: [n]\n",
        5, ["length must be from 1 to 16384"])),
    ("stft without a window or frame_length", (
        "name: t\ninputs:\n  s: {dtype: f32, shape: [1, 100]}\n"
        "nodes:\n  - {name: n, op: stft, inputs: [s], frame_step: 10}\noutputs: [n]\n",
        5, ["stft needs a window input or a frame_length"])),
    ("log_mel with n_fft past the signal", (
        "name: t\ninputs:\n  s: {dtype: f32, shape: [1, 100]}\n"
        "nodes:\n  - {name: n, op: log_mel, inputs: [s], n_fft: 128}\noutputs: [n]\n",
        5, ["the n_fft (128) is longer than the signal (100 samples)"])),
    ("log_mel with fmax past Nyquist", (
        "name: t\ninputs:\n  s: {dtype: f32, shape: [1, 1000]}\n"
        "nodes:\n  - {name: n, op: log_mel, inputs: [s], n_fft: 128, sample_rate: 8000, "
        "fmax: 5000}\noutputs: [n]\n", 5, ["0 <= fmin < fmax <= sample_rate / 2 (4000)"])),
    ("welch with an overlap of a whole segment", (
        "name: t\ninputs:\n  s: {dtype: f32, shape: [1, 1000]}\n"
        "nodes:\n  - {name: n, op: welch, inputs: [s], segment: 64, overlap: 64}\n"
        "outputs: [n]\n", 5, ["overlap must be from 0 to segment - 1 (63)"])),
    ("welch with an unknown window", (
        "name: t\ninputs:\n  s: {dtype: f32, shape: [1, 1000]}\n"
        "nodes:\n  - {name: n, op: welch, inputs: [s], window: kaiser}\noutputs: [n]\n",
        5, ["window must be one of rect, hann, hamming, blackman"])),
    ("layer_norm_grad with a gradient of another shape", (
        "name: t\ninputs:\n  d: {dtype: f32, shape: [4, 8]}\n"
        "  x: {dtype: f32, shape: [4, 9]}\n"
        "nodes:\n  - {name: n, op: layer_norm_grad, inputs: [d, x]}\noutputs: [n]\n",
        6, ["the gradient 'd' is [4, 8]; it must be [4, 9] like 'x'"])),
    ("rms_norm_grad with a dbeta", (
        "name: t\ninputs:\n  x: {dtype: f32, shape: [4, 8]}\n"
        "nodes:\n  - {name: n, op: rms_norm_grad, inputs: [x, x], outputs: [a, b, c]}\n"
        "outputs: [a]\n", 5, ["rms_norm_grad has at most 2 outputs"])),
    ("gather_grad without a size", (
        "name: t\ninputs:\n  d: {dtype: f32, shape: [3, 5]}\n  i: {dtype: i32, shape: [3]}\n"
        "nodes:\n  - {name: n, op: gather_grad, inputs: [d, i]}\noutputs: [n]\n",
        6, ["size must be from 1 to 2147483647 (it has no default)"])),
    ("gather_grad with indices not in the gradient", node_error(
        "op: gather_grad, inputs: [x, i], size: 4", ["does not hold the indices' shape [3]"])),
    ("attention_grad with one output", (
        "name: t\ninputs:\n  q: {dtype: f32, shape: [1, 2, 4, 8]}\n"
        "nodes:\n  - {name: n, op: attention_grad, inputs: [q, q, q, q]}\noutputs: [n]\n",
        5, ["attention_grad has three outputs"])),
    ("rope with odd n_rot", (
        "name: t\ninputs:\n  x: {dtype: f32, shape: [1, 2, 4, 8]}\n"
        "  c: {dtype: f32, shape: [4, 4]}\n"
        "nodes:\n  - {name: n, op: rope, inputs: [x, c, c], n_rot: 5}\noutputs: [n]\n",
        6, ["n_rot must be even"])),
    ("rope tables of the wrong shape", (
        "name: t\ninputs:\n  x: {dtype: f32, shape: [1, 2, 4, 8]}\n"
        "  c: {dtype: f32, shape: [4, 3]}\n"
        "nodes:\n  - {name: n, op: rope, inputs: [x, c, c]}\noutputs: [n]\n",
        6, ["'c' is [4, 3]; it must be [4, 4]"])),
    ("conv with mismatched channels", (
        H4 + "  w: {dtype: f32, shape: [3, 4, 3, 3]}\n"
        "nodes:\n  - {name: n, op: conv, inputs: [x, w]}\noutputs: [n]\n",
        8, ["do not match 2 input channels"])),
    ("conv window larger than its input", (
        H4 + "  w: {dtype: f32, shape: [3, 2, 9, 9]}\n"
        "nodes:\n  - {name: n, op: conv, inputs: [x, w]}\noutputs: [n]\n",
        8, ["larger than the padded input"])),
    ("conv with an unknown auto_pad", (
        H4 + "  w: {dtype: f32, shape: [3, 2, 3, 3]}\n"
        "nodes:\n  - {name: n, op: conv, inputs: [x, w], auto_pad: full}\noutputs: [n]\n",
        8, ["auto_pad must be"])),
    ("pool without a kernel", node_error("op: max_pool, inputs: [x]", ["kernel needs 2 sizes"])),
    ("pool padding as large as the kernel", node_error(
        "op: avg_pool, inputs: [x], kernel: [2, 2], pads: [2, 2, 2, 2]",
        ["padding must be smaller than the kernel"])),
    ("resize with neither scales nor sizes", node_error(
        "op: resize, inputs: [x]", ["resize needs scales or sizes (or both)"])),
    ("resize with an unknown mode", node_error(
        "op: resize, inputs: [x], scales: [1, 1, 2, 2], mode: bicubic",
        ["mode must be one of nearest, linear, cubic"])),
    ("topk with k too large", node_error("op: topk, inputs: [x], k: 7, outputs: [v, w]",
                                         ["k must be from 0 to the axis size 6"], out="v")),
    ("topk with one output", node_error("op: topk, inputs: [x], k: 2", ["two outputs"])),
    ("sample with a seed of three elements", node_error("op: sample, inputs: [x, i]",
                                             ["seed 'i' must hold one element"])),
    ("selective_scan state too large", (
        "name: t\ninputs:\n  u: {dtype: f32, shape: [1, 4, 2]}\n"
        "  a: {dtype: f32, shape: [2, 300]}\n  m: {dtype: f32, shape: [1, 4, 300]}\n"
        "nodes:\n  - {name: n, op: selective_scan, inputs: [u, u, a, m, m]}\noutputs: [n]\n",
        7, ["state size 300 must be from 1 to 256"])),
    ("reduce keep_dims list", node_error("op: reduce_mean, inputs: [x], keep_dims: [1]",
                                         ["keep_dims must be an integer"])),
    ("instance_norm of a matrix", (
        "name: t\ninputs:\n  x: {dtype: f32, shape: [2, 3]}\n  s: {dtype: f32, shape: [3]}\n"
        "nodes:\n  - {name: n, op: instance_norm, inputs: [x, s, s]}\noutputs: [n]\n",
        6, ["instance_norm needs [N, C, D1, ...]"])),
]


def op_error_case(text, line, words):
    def test(workdir):
        wd = Path(workdir)
        (wd / "model.yaml").write_text(text)
        r = kiln("compile", "model.yaml", "-o", "out.c", cwd=wd)
        check(r.returncode == 1, f"exit status {r.returncode}, expected 1\n{r.stderr}")
        first = r.stderr.splitlines()[0] if r.stderr else ""
        m = re.match(r"model\.yaml:(\d+):(\d+): error: ", first)
        check(m is not None and int(m[1]) == line, f"expected line {line}: {first!r}")
        for w in words:
            check(w in first, f"{w!r} missing from {first!r}")
        check(not (wd / "out.c").exists(), "an output file was left behind")
    return test


for name, (text, line, words) in OP_ERRORS:
    TESTS.append((f"cli op error: {name}", op_error_case(text, line, words)))


# ---- fuzzer findings (tests/fuzz/regressions/TARGET/), replayed ----
# Each input once crashed a fuzz target (make fuzz). Through the command line
# it must now compile (exit 0) or give an error (exit 1, a message, nothing
# written), never crash. onnx_dims inputs give their --shape arguments on
# their first line (see tests/fuzz/fuzz.c). safetensors inputs are two bytes (dtype, rank: see tests/fuzz/fuzz.c)
# and the file; they are loaded as the weight of a small model.

REGRESSIONS = Path(__file__).resolve().parent / "fuzz" / "regressions"
ST_DTYPES = ["f32", "f16", "i32", "i64", "u8"]


def fuzz_regression(target, path):
    def test(workdir):
        wd = Path(workdir)
        data = path.read_bytes()
        flags = []
        if target == "onnx_dims":  # --shape arguments on the first line
            line, _, data = data.partition(b"\n")
            for arg in line.decode("latin-1").split()[:8]:
                flags += ["--shape", arg]
        if target in ("onnx", "onnx_dims"):
            model = "model.onnx"
            (wd / model).write_bytes(data)
        elif target == "safetensors":
            model = "model.yaml"
            (wd / "w.safetensors").write_bytes(data[2:])
            shape = list(range(1, 1 + data[1] % 4))
            (wd / model).write_text(
                f"name: t\ninputs:\n  x: {{dtype: f32, shape: [1]}}\nweights:\n"
                f"  w: {{dtype: {ST_DTYPES[data[0] % 5]}, shape: {shape}, "
                "safetensors: w.safetensors, key: w}\nnodes:\n"
                "  - {name: y, op: relu, inputs: [x]}\noutputs: [y]\n")
        else:
            model = "model.yaml"
            (wd / model).write_bytes(data)
        r = kiln("compile", model, *flags, "-o", "out.c", cwd=wd)
        if r.returncode == 0:  # some findings are valid models once fixed
            check((wd / "out.c").exists(), "exit 0 but no output")
            return
        check(r.returncode == 1, f"exit status {r.returncode}, expected 0 or 1\n"
              f"{r.stderr[-2000:]}")
        check("error:" in r.stderr and "internal error" not in r.stderr
              and "Sanitizer" not in r.stderr, f"not a plain error:\n{r.stderr[-2000:]}")
        check(not (wd / "out.c").exists(), "an output file was left behind")
    return test


for target_dir in sorted(REGRESSIONS.iterdir()) if REGRESSIONS.is_dir() else []:
    for p in sorted(target_dir.iterdir()):
        TESTS.append((f"cli fuzz regression: {target_dir.name}/{p.name}",
                      fuzz_regression(target_dir.name, p)))


def test_make_waits_for_packages(workdir):
    """make -jN on a bare machine: every rule that runs the C compiler waits
    for the package step (| deps), since cc is not there before it. The
    Makefile's package recipe is replaced by a slow stand-in that leaves a
    mark, and CC by a wrapper that fails without the mark; the first
    compiles of each kind (the embedder, a compiler and a runtime object,
    the test driver's object, the protobuf-c sources) built with -j8."""
    wd = Path(workdir)
    mark = wd / "packages-done"
    text = (ROOT / "Makefile").read_text()
    recipe = "\t@sh tools/packages.sh $(PACKAGES)\n"
    check(recipe in text, "the Makefile's deps recipe changed: update this test")
    (wd / "Makefile").write_text(text.replace(recipe, f"\t@sleep 2; touch {mark}\n"))
    cc = wd / "cc"
    cc.write_text(f"#!/bin/sh\n[ -f {mark} ] || {{ echo 'cc before the package step:' "
                  f"\"$@\" >&2; exit 99; }}\nexec cc \"$@\"\n")
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR)
    b = wd / "b"
    targets = [b / "embed", b / "compiler" / "util.o", b / "runtime" / "dtype.o",
               b / "run_model_test.o", b / "compiler" / "onnx.pb-c.c"]
    r = run(["make", "-f", wd / "Makefile", "-C", ROOT, "-j8", f"B={b}", f"CC={cc}",
             *targets], timeout=600, env=dict(os.environ, MAKEFLAGS=""))
    check(r.returncode == 0, (r.stdout + r.stderr)[-3000:])
    check(all(t.exists() for t in targets), f"not built: {[t for t in targets if not t.exists()]}")


TESTS.append(("build: make -j8 runs no compiler before the package step",
              test_make_waits_for_packages))
