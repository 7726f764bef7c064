"""test_cli.py: the command line, and every error a bad model must produce.

An error case is a model (plus files) that kiln must reject with exit status
1, a first line `model.yaml:LINE:COL: error: ...` at the expected place
containing the expected words (the node's name among them), and no output
file left behind.
"""
import re
from pathlib import Path

from harness import check, kiln

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
    check(r.returncode == 0 and "kiln compile MODEL.yaml" in r.stdout, r.stdout)
    r = kiln()
    check(r.returncode == 2 and "usage:" in r.stderr, "no arguments")
    r = kiln("frob")
    check(r.returncode == 2 and "unknown command 'frob'" in r.stderr, r.stderr)
    r = kiln("compile")
    check(r.returncode == 1 and "no model given" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--bogus")
    check(r.returncode == 1 and "unknown option '--bogus'" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "--name", "9lives")
    check(r.returncode == 1 and "not a C identifier" in r.stderr, r.stderr)
    r = kiln("compile", "m.onnx")
    check(r.returncode == 1 and "unsupported model format" in r.stderr, r.stderr)
    r = kiln("compile", "missing.yaml", cwd=workdir)
    check(r.returncode == 1 and "missing.yaml: error: cannot read" in r.stderr, r.stderr)
    r = kiln("compile", "m.yaml", "-o", "out.txt")
    check(r.returncode == 1 and "must end in .c" in r.stderr, r.stderr)


def test_name_and_output(workdir):
    """--name sets the prefix; the default is the sanitized model name."""
    wd = Path(workdir)
    (wd / "m.yaml").write_text("name: 2-layer net\ninputs:\n  x: {dtype: f32, shape: [3]}\n"
                               "nodes:\n  - {name: y, op: relu, inputs: [x]}\n"
                               "outputs: [y]\n")
    r = kiln("compile", "m.yaml", cwd=wd)
    check(r.returncode == 0, r.stderr)
    check((wd / "m_2_layer_net.c").exists() and (wd / "m_2_layer_net.h").exists(),
          f"default output: {sorted(p.name for p in wd.iterdir())}")
    check("m_2_layer_net_create(" in (wd / "m_2_layer_net.h").read_text(), "prefix")
    r = kiln("compile", "m.yaml", "--name", "net", "-o", "sub.c", cwd=wd)
    check(r.returncode == 0, r.stderr)
    h = (wd / "sub.h").read_text()
    check("kiln_status net_create(" in h and "NET_ARENA_BYTES" in h, "--name net")


TESTS.append(("cli usage, --help, --version, bad options", test_usage))
TESTS.append(("cli --name and default output names", test_name_and_output))
