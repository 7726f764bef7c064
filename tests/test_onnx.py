"""test_onnx.py: ONNX input.

- every conformance case that passed when tests/onnx/REPORT.md was made
  (tests/onnx/passing.txt) must still pass: compiled from its model.onnx,
  run on Vulkan, compared with its output_N.pb (tests/onnx/conformance.py);
- bad ONNX files: truncated, not protobuf, unsupported ops (all listed, with
  node names and counts), symbolic dimensions (and --shape fixing them), a
  missing external data file: a clear error, exit 1, nothing written.
"""
import json
import re
import struct
import sys
from pathlib import Path

import numpy as np

from harness import (F16_TOLERANCE, ROOT, SANITIZING, assert_close, assert_relative, check,
                     kiln, link_model, registry, run_program, run_program_raw)


sys.path.insert(0, str(ROOT / "tests" / "onnx"))
import conformance  # noqa: E402

TESTS, case = registry()


def conformance_case(name):
    def test(workdir):
        status, detail = conformance.run_case(name)
        check(status == "passed", f"{status}: {detail}")
    return test


CONFORMANCE = (ROOT / "tests" / "onnx" / "passing.txt").read_text().split()
for name in CONFORMANCE:
    case(f"onnx {name}")(conformance_case(name))
_CONFORMANCE_NAMES = {f"onnx {name}" for name in CONFORMANCE}


def is_conformance(test_name):
    """Whether a test of this tier is one of the conformance cases (run_tests.py
    samples them under the sanitizers)."""
    return test_name in _CONFORMANCE_NAMES

# ---- a tiny protobuf writer, so the bad-input tests need no onnx package ----


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num, value):
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(num << 3 | 2) + varint(len(value)) + value


def node(op, inputs, outputs, name="", attrs=b""):
    b = b"".join(field(1, i) for i in inputs) + b"".join(field(2, o) for o in outputs)
    return b + field(3, name) + field(4, op) + attrs


def attr(name, value):
    """A node attribute (NodeProto field 5): an int, a float, a string or a
    list of ints."""
    if isinstance(value, str):
        body = field(1, name) + field(4, value) + field(20, 3)
    elif isinstance(value, float):
        body = field(1, name) + varint(2 << 3 | 5) + struct.pack("<f", value) + field(20, 1)
    elif isinstance(value, int):
        body = field(1, name) + field(3, value & (1 << 64) - 1) + field(20, 2)
    else:
        body = field(1, name) + b"".join(field(8, v & (1 << 64) - 1) for v in value) + \
            field(20, 7)
    return field(5, body)


ONNX_ELEM = {"float32": 1, "uint8": 2, "int8": 3, "int32": 6, "int64": 7, "bool": 9,
             "float16": 10}


def initializer(name, array):
    """A TensorProto holding a numpy array (raw data, little-endian)."""
    import numpy as np
    a = np.ascontiguousarray(array)
    return (b"".join(field(1, d) for d in a.shape) + field(2, ONNX_ELEM[a.dtype.name]) +
            field(8, name) + field(9, a.tobytes()))


def value_info(name, dims, elem=1):
    shape = b"".join(field(1, field(1, d) if isinstance(d, int) else field(2, d)) for d in dims)
    tensor_type = field(1, elem) + field(2, shape)
    return field(1, name) + field(2, field(1, tensor_type))


def model(nodes, inputs, outputs, initializers=(), opset=13, value_infos=()):
    g = b"".join(field(1, n) for n in nodes) + field(2, "g")
    g += b"".join(field(5, t) for t in initializers)
    g += b"".join(field(11, i) for i in inputs) + b"".join(field(12, o) for o in outputs)
    g += b"".join(field(13, v) for v in value_infos)
    return field(1, 8) + field(8, field(2, opset)) + field(7, g)


def expect_refused(workdir, data, words, extra=(), name="m.onnx"):
    """Writes a model file (ONNX, or YAML by its name) and checks that kiln
    refuses it: exit status 1, every word in the message, no output left."""
    wd = Path(workdir)
    (wd / name).write_bytes(data)
    r = kiln("compile", name, "-o", "out.c", *extra, cwd=wd)
    check(r.returncode == 1, f"{name}: exit status {r.returncode}, expected 1\n{r.stderr}")
    for w in words:
        check(w in r.stderr, f"{name}: {w!r} missing from {r.stderr!r}")
    check(not (wd / "out.c").exists(), "an output file was left behind")


def declared_outputs(header):
    """{name: (dtype, shape)} of the outputs listed in a generated header."""
    text = Path(header).read_text()
    part = text[text.index(" * Outputs:"):text.index("*/")]
    return {m[0]: (m[1], [int(d) for d in m[2].split(",") if d.strip()])
            for m in re.findall(r"\[\d+\] (\S+): (\w+) \[([^\]]*)\]", part)}


def check_outputs(workdir, names, expected):
    got = declared_outputs(Path(workdir) / "model.h")
    for name, want in zip(names, expected):
        check(name in got, f"output {name} missing from the header: {got}")
        check(got[name][1] == list(np.shape(want)),
              f"output {name}: kiln's shape {got[name][1]}, expected {list(np.shape(want))}")


def run_onnx(workdir, data, inputs, expected, out_names, flags=(), tol=(1e-4, 1e-5),
             guard=True):
    """Compiles an ONNX model, checks its output shapes in the header, runs it
    on the inputs and compares every element with expected (rtol, atol).
    guard=False: without --guard (which fails a run-time index outside its
    axis)."""
    wd = Path(workdir)
    (wd / "m.onnx").write_bytes(data)
    r = kiln("compile", wd / "m.onnx", "--name", "model", "-o", wd / "model.c",
             *(("--guard",) if guard else ()), *flags)
    check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
    check_outputs(wd, out_names, expected)
    got = run_program(link_model(wd), inputs, expected)
    for name, g, e in zip(out_names, got, expected):
        assert_close(g, e, *tol, name)


def bad_case(name, data, words, extra=()):
    case(f"onnx error: {name}")(lambda workdir: expect_refused(workdir, data, words, extra))


GOOD = model([node("Relu", ["x"], ["y"], "r")], [value_info("x", [2, 3])],
             [value_info("y", [2, 3])])
bad_case("truncated file", GOOD[:len(GOOD) // 2], ["not a valid ONNX model"])
bad_case("not protobuf", b"\xff\xff\xff\xff garbage", ["not a valid ONNX model"])
bad_case("empty file", b"", ["the model has no graph"])
bad_case("unsupported ops, every one listed",
         model([node("Relu", ["x"], ["a"], "r1"), node("Unique", ["a"], ["b"], "l1"),
                node("Foo", ["b"], ["c"], "f1"), node("Unique", ["c"], ["y"], "l2")],
               [value_info("x", [2, 3])], [value_info("y", [2, 3])]),
         ["unsupported: 2 op types", "Unique: 2 nodes ('l1', 'l2')", "Foo: 1 node ('f1')"])
bad_case("symbolic dimension",
         model([node("Relu", ["x"], ["y"], "r")], [value_info("x", ["batch", 3])],
               [value_info("y", ["batch", 3])]),
         ["input 'x' dimension 0 is symbolic ('batch')", "--shape x="])
bad_case("symbolic dimension: the message names both remedies",
         model([node("Relu", ["x"], ["y"], "r")], [value_info("x", ["batch", 3])],
               [value_info("y", ["batch", 3])]),
         ["--shape batch=N", "--shape batch=MIN..MAX"])
_BS = model([node("Relu", ["x"], ["y"], "r")], [value_info("x", ["batch", "seq", 3])],
            [value_info("y", ["batch", "seq", 3])])
bad_case("--shape DIM=N of a dimension no input has (misspelt)", _BS,
         ["--shape bach=1", "no input or inputs' symbolic dimension 'bach'"],
         ["--shape", "bach=1", "--shape", "seq=1..4"])
bad_case("--shape of an input the model does not have", _BS,
         ["--shape z=2x3", "the model has no input 'z'"], ["--shape", "z=2x3"])
bad_case("--shape DIM given twice (fixed and dynamic)", _BS,
         ["dimension 'batch' is given twice (batch=1, batch=1..4)"],
         ["--shape", "batch=1", "--shape", "batch=1..4", "--shape", "seq=1..4"])
# Graphs that onnx's checker rejects but that would compile to something:
# a second writer of a name (kiln kept one of the two), an index constant
# outside its axis (the kernel read zeros).
_X23 = [value_info("x", [2, 3])]
bad_case("a tensor written by two nodes",
         model([node("Relu", ["x"], ["a"], "first"), node("Neg", ["x"], ["a"], "second"),
                node("Abs", ["a"], ["y"], "abs")], _X23, [value_info("y", [2, 3])]),
         ["second (Neg)", "it writes 'a', which node 'first (Relu)' already writes"])
bad_case("a node that writes a graph input's name",
         model([node("Relu", ["x"], ["x"], "again"), node("Abs", ["x"], ["y"], "abs")], _X23,
               [value_info("y", [2, 3])]),
         ["again (Relu)", "it writes 'x', which is a graph input or initializer"])
bad_case("a node that reads a name nothing defines",
         model([node("Add", ["x", "nowhere"], ["y"], "add")], _X23, [value_info("y", [2, 3])]),
         ["add (Add)", "input 'nowhere' is not defined before it is used"])
for _op, _idx, _words in (
        ("Gather", np.array([1, 7], np.int64), ["index 7 (element 1 of 'i')",
                                                "axis 1 of 'x', of size 3 (indices -3 to 2)"]),
        ("Gather", np.array([-4], np.int32), ["index -4 (element 0 of 'i')"]),
        ("GatherElements", np.array([[0, 1, 2], [2, 3, 0]], np.int64),
         ["index 3 (element 4 of 'i')", "axis 1 of 'x'"])):
    bad_case(f"{_op}: a constant index outside its axis ({_idx.dtype.name})",
             model([node(_op, ["x", "i"], ["y"], "g", attr("axis", 1))], _X23,
                   [value_info("y", [2, 3] if _idx.ndim == 2 else [2, _idx.size])],
                   [initializer("i", _idx)]), _words)
bad_case("--shape DIM=N not a number", _BS,
         ["--shape batch=2x", "expected DIM=N"], ["--shape", "batch=2x", "--shape", "seq=3"])


@case("onnx: --shape DIM=N fixes a symbolic dimension wherever the inputs have it (two "
      "inputs, [batch, seq, 4] and [batch, 4]), each dimension given its own value")
def test_shape_fixed_dims(workdir):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((2, 4)).astype(np.float32)
    data = model([node("Unsqueeze", ["b", "one"], ["b1"], "u"),
                  node("Add", ["a", "b1"], ["y"], "add")],
                 [value_info("a", ["batch", "seq", 4]), value_info("b", ["batch", 4])],
                 [value_info("y", ["batch", "seq", 4])],
                 [initializer("one", np.array([1], np.int64))])
    run_onnx(workdir, data, [a, b], [a + b[:, None, :]], ["y"],
             flags=("--shape", "batch=2", "--shape", "seq=3"))


bad_case("undefined input",
         model([node("Relu", ["nope"], ["y"], "r")], [value_info("x", [2])],
               [value_info("y", [2])]),
         ["node 'r (Relu)'", "input 'nope' is not defined"])
bad_case("wrong shapes in a node",
         model([node("MatMul", ["x", "x"], ["y"], "mm")], [value_info("x", [2, 3])],
               [value_info("y", [2, 2])]),
         ["node 'mm (MatMul)'", "inner dimensions 3 and 2 differ"])
bad_case("missing external data",
         model([node("Add", ["x", "w"], ["y"], "a")], [value_info("x", [2])],
               [value_info("y", [2])],
               [field(1, 2) + field(2, 1) + field(8, "w") + field(13, field(1, "location") +
                                                                 field(2, "nowhere.bin"))
                + field(14, 1)]),
         ["initializer 'w'", "cannot read external data", "nowhere.bin"])
bad_case("an output nothing produces",
         model([node("Relu", ["x"], ["y"], "r")], [value_info("x", [2])],
               [value_info("z", [2])]),
         ["graph output 'z' is not produced"])
bad_case("a shape input that is not constant",
         model([node("Reshape", ["x", "s"], ["y"], "rs")],
               [value_info("x", [6]), value_info("s", [2], elem=7)], [value_info("y", [2, 3])]),
         ["node 'rs (Reshape)'", "unsupported: the shape (input 1, 's') must be a constant"])
bad_case("a shape computed from a graph input",
         model([node("Cast", ["n"], ["nf"], "c", attr("to", 7)),
                node("Concat", ["nf", "nf"], ["s"], "cat", attr("axis", 0)),
                node("Reshape", ["x", "s"], ["y"], "rs")],
               [value_info("x", [4]), value_info("n", [1], elem=7)],
               [value_info("y", [2, 2])]),
         ["node 'rs (Reshape)'", "(input 1, 's') must be a constant",
          "computed from graph input 'n' (--const NAME=FILE"])

# Folded constants (fuzzer finding): an elementwise node with the wrong number
# of inputs is refused, never folded with an operand missing.
bad_case("a constant Where of two inputs",
         model([node("Where", ["c", "a"], ["y"], "w")], [], [value_info("y", [2])],
               [initializer("c", np.array([1, 0], np.bool_)),
                initializer("a", np.array([1, 2], np.float32))]),
         ["node 'w (Where)'", "Where takes 3 inputs, not 2"])
bad_case("a constant Add of three inputs",
         model([node("Add", ["a", "a", "a"], ["y"], "s")], [], [value_info("y", [2])],
               [initializer("a", np.array([1, 2], np.float32))]),
         ["node 's (Add)'", "Add takes 2 inputs, not 3"])


def external_initializer(name, array, location, offset):
    """A TensorProto whose float32 bytes are at offset in the file
    location (ONNX external data)."""
    n = array.size * 4
    return (b"".join(field(1, d) for d in array.shape) + field(2, 1) + field(8, name) +
            field(13, field(1, "location") + field(2, location)) +
            field(13, field(1, "offset") + field(2, str(offset))) +
            field(13, field(1, "length") + field(2, str(n))) + field(14, 1))


@case("onnx weights are held once while compiling: 8 layers of three products of one "
      "input (a QKV group, concatenated), 96 MiB of f32 weights in external data and as "
      "inline initializers, peak host memory under 1.2x the weights plus 48 MiB, also at "
      "--precision f16; outputs against numpy")
def _(workdir):
    wd = Path(workdir)
    rng = np.random.default_rng(21)
    k, layers = 1024, 8
    ws = [rng.standard_normal((k, k), dtype=np.float32) * 0.03 for _ in range(3 * layers)]
    with open(wd / "w.bin", "wb") as f:
        for w in ws:
            f.write(w.tobytes())

    def layered(inline):
        nodes, inits, h = [], [], "x"
        for i in range(layers):
            for j, part in enumerate("qkv"):
                name, w = f"w{part}{i}", ws[3 * i + j]
                inits.append(initializer(name, w) if inline else
                             external_initializer(name, w, "w.bin", (3 * i + j) * k * k * 4))
                nodes.append(node("MatMul", [h, name], [f"{part}{i}"], f"mm_{part}{i}"))
            nodes += [node("Add", [f"q{i}", f"k{i}"], [f"s{i}"], f"a{i}"),
                      node("Add", [f"s{i}", f"v{i}"], [f"h{i}"], f"b{i}")]
            h = f"h{i}"
        return model(nodes, [value_info("x", [1, k])], [value_info(h, [1, k])], inits), h

    weights_mib = len(ws) * k * k * 4 / 2**20
    for inline in (False, True):
        data, h = layered(inline)
        (wd / "m.onnx").write_bytes(data)
        for flags in ((), ("--precision", "f16")):
            r = kiln("compile", wd / "m.onnx", "-o", wd / "peak.c", "--time", *flags)
            check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
            peak = max(int(m) for m in re.findall(r"at most (\d+)$", r.stderr, re.M))
            what = f"{'inline' if inline else 'external'} weights, {' '.join(flags) or 'f32'}"
            # (a sanitized kiln keeps freed blocks in quarantine: no bound there)
            check(SANITIZING or peak < 1.2 * weights_mib + 48,
                  f"{what}: {peak} MiB at most for {weights_mib:.0f} MiB of weights")
    x = rng.standard_normal((1, k)).astype(np.float32)
    want = x.astype(np.float64)
    for i in range(layers):
        want = sum(want @ ws[3 * i + j] for j in range(3))
    run_onnx(workdir, data, [x], [want.astype(np.float32)], [h], tol=(1e-3, 1e-4))


@case("onnx Max and Min of one and of three constants: variadic, every input counts")
def _(workdir):
    rng = np.random.default_rng(11)
    x = rng.standard_normal([2, 3]).astype(np.float32)
    a, b, c = (rng.standard_normal([2, 3]).astype(np.float32) for _ in range(3))
    g = model([node("Max", ["a", "b", "c"], ["m3"], "x3"), node("Min", ["a", "b", "c"], ["n3"], "n3"),
               node("Max", ["b"], ["m1"], "x1"), node("Add", ["m3", "n3"], ["s"], "s1"),
               node("Add", ["s", "m1"], ["t"], "s2"), node("Add", ["x", "t"], ["y"], "s3")],
              [value_info("x", [2, 3])], [value_info("y", [2, 3])],
              [initializer("a", a), initializer("b", b), initializer("c", c)])
    want = x + np.maximum(np.maximum(a, b), c) + np.minimum(np.minimum(a, b), c) + b
    run_onnx(workdir, g, [x], [want], ["y"])


bad_case("a MatMul over an empty inner dimension",
         model([node("MatMul", ["a", "b"], ["y"], "mm")],
               [value_info("a", [2, 0]), value_info("b", [0, 3])], [value_info("y", [2, 3])]),
         ["node 'mm (MatMul)'", "empty inner dimension (K = 0)"])


bad_case("an opset past the newest kiln knows",
         model([node("Relu", ["x"], ["y"], "r")], [value_info("x", [2, 3])],
               [value_info("y", [2, 3])], opset=29),
         ["unsupported: opset 29 (kiln reads opsets 1 to 28)"])
# DFT 20 made its axis an input, which kiln bakes in.
bad_case("DFT 20 with an axis computed at run time",
         model([node("DFT", ["x", "", "ax"], ["y"], "d")],
               [value_info("x", [1, 8, 1]), value_info("ax", [], 7)],
               [value_info("y", [1, 8, 2])], opset=20),
         ["node 'd (DFT)'", "axis (input 2, 'ax') must be a constant"])
# Attention 25's windows: -1 (unbounded) or a bound of at least 0.
bad_case("Attention 25 with a window below -1",
         model([node("Attention", ["q", "k", "v"], ["y"], "a", attr("left_window_size", -2))],
               [value_info("q", [1, 2, 3, 4]), value_info("k", [1, 2, 3, 4]),
                value_info("v", [1, 2, 3, 4])],
               [value_info("y", [1, 2, 3, 4])], opset=25),
         ["node 'a (Attention)'", "left_window_size and right_window_size must be -1"])
# Range 27's stash_type 0 (f16 accumulation) is refused by name.
bad_case("Range 27 with stash_type 0 on f16",
         model([node("Range", ["s", "l", "d"], ["y"], "r", attr("stash_type", 0))], [],
               [value_info("y", [4], 10)],
               [initializer("s", np.array(0, np.float16)), initializer("l", np.array(4, np.float16)),
                initializer("d", np.array(1, np.float16))], opset=27),
         ["node 'r (Range)'", "unsupported: Range's stash_type 0"])
# AveragePool 19 added dilations, which kiln's avg_pool does not take.
bad_case("AveragePool 19 with dilations refused by name",
         model([node("AveragePool", ["x"], ["y"], "p",
                     attr("kernel_shape", [2, 2]) + attr("dilations", [2, 2]))],
               [value_info("x", [1, 1, 5, 5])], [value_info("y", [1, 1, 3, 3])], opset=19),
         ["node 'p (AveragePool)'", "unsupported: attribute dilations"])

# An attribute of the wrong type (a string written as a list of ints, an int
# as a float) is refused naming both types, not read as absent or as 0.
bad_case("Pad's mode as INTS, not a STRING",
         model([node("Pad", ["x", "pads"], ["y"], "p", attr("mode", list(b"reflect")))],
               [value_info("x", [1, 3])], [value_info("y", [1, 5])],
               [initializer("pads", np.array([0, 1, 0, 1], np.int64))], opset=18),
         ["node 'p (Pad)'", "attribute 'mode' is of type INTS", "takes it as STRING"])
bad_case("Softmax's axis as a FLOAT, not an INT",
         model([node("Softmax", ["x"], ["y"], "s", attr("axis", 0.0))],
               [value_info("x", [2, 3])], [value_info("y", [2, 3])]),
         ["node 's (Softmax)'", "attribute 'axis' is of type FLOAT", "takes it as INT"])

bad_case("Transpose's perm as an INT, not INTS",
         model([node("Transpose", ["x"], ["y"], "t", attr("perm", 1))],
               [value_info("x", [2, 3])], [value_info("y", [3, 2])]),
         ["node 't (Transpose)'", "perm must be a list of integers"])
bad_case("Conv's strides as a STRING, not INTS",
         model([node("Conv", ["x", "w"], ["y"], "c", attr("strides", "2,2"))],
               [value_info("x", [1, 1, 4, 4])], [value_info("y", [1, 1, 2, 2])],
               [initializer("w", np.ones((1, 1, 1, 1), np.float32))]),
         ["node 'c (Conv)'", "strides must be a list of integers"])
bad_case("Squeeze 11's axes as an INT, not INTS",
         model([node("Squeeze", ["x"], ["y"], "s", attr("axes", 0))],
               [value_info("x", [1, 3])], [value_info("y", [3])], opset=11),
         ["node 's (Squeeze)'", "attribute 'axes' is of type INT", "takes it as INTS"])
bad_case("LpPool's kernel_shape as an INT, not INTS",
         model([node("LpPool", ["x"], ["y"], "p", attr("kernel_shape", 2))],
               [value_info("x", [1, 1, 4, 4])], [value_info("y", [1, 1, 3, 3])]),
         ["node 'p (LpPool)'", "attribute 'kernel_shape' is of type INT", "takes it as INTS"])
bad_case("Constant's value_int as a FLOAT",
         model([node("Constant", [], ["k"], "k", attr("value_int", 3.0)),
                node("Add", ["x", "k"], ["y"], "a")],
               [value_info("x", [2], 7)], [value_info("y", [2], 7)]),
         ["node 'k (Constant)'", "attribute 'value_int' is of type FLOAT", "takes it as INT"])

def newer_opset_case(opset):
    """A graph at a newer opset that only uses op versions kiln reads there:
    Reshape, Transpose and Identity (versions to 25), Softsign and
    GlobalAveragePool (22), Relu; at opset 20 also Cast (19) and AveragePool
    (19)."""
    def test(workdir):
        import numpy as np
        shape = initializer("shape", np.array([1, 2, 4, 6], np.int64))
        old = opset < 22
        nodes = [node("Reshape", ["x", "shape"], ["r"], "reshape"),
                 node("Cast", ["r"], ["c"], "cast", attr("to", 1)) if old else
                 node("Relu", ["r"], ["c"], "relu"),
                 node("Softsign", ["c"], ["s"], "softsign"),
                 node("Transpose", ["s"], ["t"], "transpose", attr("perm", [0, 1, 3, 2])),
                 node("Identity", ["t"], ["i"], "identity")]
        nodes += [node("AveragePool", ["i"], ["p"], "pool", attr("kernel_shape", [2, 2])),
                  node("GlobalAveragePool", ["p"], ["y"], "gap")] if old else \
                 [node("GlobalAveragePool", ["i"], ["y"], "gap")]
        data = model(nodes, [value_info("x", [48])], [value_info("y", [1, 2, 1, 1])], [shape],
                     opset=opset)
        x = np.random.default_rng(opset).standard_normal(48).astype(np.float32) * 3
        s = x.reshape(1, 2, 4, 6).astype(np.float64)
        if not old:
            s = np.maximum(s, 0)
        t = (s / (1 + np.abs(s))).transpose(0, 1, 3, 2)            # [1, 2, 6, 4]
        if old:
            t = (t[:, :, :-1, :-1] + t[:, :, 1:, :-1] + t[:, :, :-1, 1:] + t[:, :, 1:, 1:]) / 4
        want = t.mean(axis=(2, 3), keepdims=True)
        run_onnx(workdir, data, [x], [want], ["y"], tol=(1e-5, 1e-6))
    return test


for _opset in (20, 23, 25):
    case(f"onnx opset {_opset}: op versions kiln reads there compile and match numpy")(
        newer_opset_case(_opset))


def einsum_case(equation, shapes, opset=13):
    """Einsum of random operands of the given shapes, against numpy.einsum."""
    def test(workdir):
        rng = np.random.default_rng(len(equation))
        xs = [rng.standard_normal(sh).astype(np.float32) for sh in shapes]
        want = np.einsum(equation, *[x.astype(np.float64) for x in xs])
        names = [f"x{i}" for i in range(len(xs))]
        eq = field(1, "equation") + field(4, equation) + field(20, 3)
        data = model([node("Einsum", names, ["y"], "einsum", field(5, eq))],
                     [value_info(n, list(x.shape)) for n, x in zip(names, xs)],
                     [value_info("y", list(np.shape(want)))], opset=opset)
        run_onnx(workdir, data, xs, [np.asarray(want)], ["y"], tol=(1e-4, 1e-5))
    return test


# The forms exporters and models write: batched products (attention's
# "bhqd,bhkd->bhqk"), a broadcast ellipsis, implicit outputs, sums,
# transposes, diagonals, three operands, a bilinear form.
for _eq, _shapes in [("bij,bjk->bik", [(3, 4, 5), (3, 5, 6)]),
                     ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),
                     ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)]),
                     ("i,i", [(7,), (7,)]), ("ij->i", [(4, 5)]), ("ij->ji", [(4, 5)]),
                     ("ij", [(3, 2)]), ("ba", [(3, 2)]), ("...ii->...i", [(2, 3, 4, 4)]),
                     ("ii", [(5, 5)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
                     ("bn,anm,bm->ba", [(3, 4), (2, 4, 5), (3, 5)]),
                     ("bij, bkj -> bki", [(2, 3, 4), (2, 5, 4)]),
                     ("ij,j->i", [(6, 8), (8,)])]:
    case(f"onnx Einsum '{_eq}' of {_shapes} matches numpy.einsum")(einsum_case(_eq, _shapes))


@case("onnx Einsum: a malformed equation, one that does not fit its operands and integer "
      "operands are refused by name")
def _(workdir):
    def einsum(equation, shapes, elem=1):
        eq = field(1, "equation") + field(4, equation) + field(20, 3)
        names = [f"x{i}" for i in range(len(shapes))]
        return model([node("Einsum", names, ["y"], "e", field(5, eq))],
                     [value_info(n, list(sh), elem) for n, sh in zip(names, shapes)],
                     [value_info("y", [2])])
    expect_refused(workdir, einsum("ij,jk", [(2, 3)]), ["node 'e (Einsum)'",
                                                       "has 2 terms for 1 operand"])
    expect_refused(workdir, einsum("ijk->i", [(2, 3)]), ["node 'e (Einsum)'",
                                                         "does not fit operand 1 of rank 2"])
    expect_refused(workdir, einsum("ij->q", [(2, 3)]), ["node 'e (Einsum)'",
                                                        "names no input axis"])
    expect_refused(workdir, einsum("i#->i", [(2, 3)]), ["node 'e (Einsum)'", "does not fit"])
    expect_refused(workdir, einsum("ij,jk->ik", [(2, 3), (4, 2)]),
                   ["node 'e (Einsum)'", "contracted label has sizes 3 and 4"])
    expect_refused(workdir, einsum("ij->i", [(2, 3)], elem=6),
                   ["node 'e (Einsum)'", "unsupported: Einsum of i32 tensors"])


def gather_nd_ref(data, idx, b):
    """GatherND as the ONNX reference defines it (batch_dims b)."""
    lead = idx.shape[:b]
    out = []
    for bi in np.ndindex(*lead) if b else [()]:
        d, ix = data[bi], idx[bi]
        flat = ix.reshape(-1, ix.shape[-1])
        out.append(np.stack([d[tuple(t)] for t in flat]).reshape(ix.shape[:-1] + d.shape[ix.shape[-1]:]))
    return np.stack(out).reshape(idx.shape[:-1] + data.shape[b + idx.shape[-1]:]) if b else out[0]


def scatter_nd_ref(data, idx, upd, red):
    out = data.copy()
    flat = idx.reshape(-1, idx.shape[-1])
    u = upd.reshape((flat.shape[0],) + data.shape[idx.shape[-1]:])
    f = {"none": lambda a, b: b, "add": np.add, "mul": np.multiply, "max": np.maximum,
         "min": np.minimum}[red]
    for t, ix in enumerate(flat):
        out[tuple(ix)] = f(out[tuple(ix)], u[t])
    return out


def nd_case(op, const_data, runtime_idx=False, **kw):
    """GatherND or ScatterND with constant indices, on the GPU (data an input)
    or folded on the CPU (data a constant, then added to an input); or with
    indices given at run time (an input: row numbers computed on the GPU)."""
    def test(workdir):
        rng = np.random.default_rng(17)
        dt = kw.get("dtype", np.float32)
        data = (rng.standard_normal(kw["data"]) * 4).astype(dt)
        idx = np.array(kw["indices"], np.int64)
        red, b = kw.get("reduction", "none"), kw.get("batch_dims", 0)
        attrs = attr("batch_dims", b) if b else b""
        if red != "none":
            attrs += field(5, field(1, "reduction") + field(4, red) + field(20, 3))
        ins, feeds = ["data", "idx"], []
        inits = [] if runtime_idx else [initializer("idx", idx)]
        if op == "ScatterND":
            upd = (rng.standard_normal(idx.shape[:-1] + data.shape[idx.shape[-1]:]) * 4)
            upd = upd.astype(dt)
            want = scatter_nd_ref(data, idx % np.array(data.shape[:idx.shape[-1]]), upd, red)
            ins.append("upd")
        else:
            want = gather_nd_ref(data, idx, b)
        elem = {np.float32: 1, np.int32: 6}[dt]
        nodes = [node(op, ins, ["y" if not const_data else "c"], "nd", attrs)]
        if const_data:  # a constant result, used by a kernel
            inits += [initializer("data", data)] + ([initializer("upd", upd)]
                                                    if op == "ScatterND" else [])
            nodes.append(node("Add", ["c", "x"], ["y"], "add"))
            x = rng.standard_normal(want.shape).astype(dt) if dt == np.float32 else \
                rng.integers(-9, 9, want.shape).astype(dt)
            feeds, inputs, want = [x], [value_info("x", list(want.shape), elem)], want + x
        else:
            feeds = [data] + ([upd] if op == "ScatterND" else [])
            inputs = [value_info("data", list(data.shape), elem)] + (
                [value_info("upd", list(upd.shape), elem)] if op == "ScatterND" else [])
        if runtime_idx:
            feeds.insert(1, idx)
            inputs.insert(1, value_info("idx", list(idx.shape), 7))
        out = model(nodes, inputs, [value_info("y", list(want.shape), elem)], inits,
                    opset=kw.get("opset", 18))
        run_onnx(workdir, out, feeds, [want], ["y"], tol=(1e-5, 1e-6))
    return test


for _op, _kw in [
        ("GatherND", dict(data=[4, 5, 3], indices=[[1, 2], [3, -1], [0, 0]])),
        ("GatherND", dict(data=[4, 5], indices=[[[1], [3]], [[0], [2]]], dtype=np.int32)),
        ("GatherND", dict(data=[2, 4, 3], indices=[[[1]], [[3]]], batch_dims=1)),
        ("GatherND", dict(data=[2, 3, 4, 2], indices=[[[2, 1], [0, 3]], [[1, 1], [2, 0]]],
                          batch_dims=1)),
        ("ScatterND", dict(data=[6, 3], indices=[[4], [1], [-1]])),
        ("ScatterND", dict(data=[4, 4, 2], indices=[[0, 1], [3, 3], [0, 1]],
                           reduction="add")),
        ("ScatterND", dict(data=[5, 2], indices=[[1], [1], [4]], reduction="mul")),
        ("ScatterND", dict(data=[5, 3], indices=[[2], [0], [2]], reduction="max")),
        ("ScatterND", dict(data=[5, 3], indices=[[2], [0], [2]], reduction="min",
                           dtype=np.int32))]:
    for _const, _rt in ((False, False), (True, False), (False, True)):
        if _op == "ScatterND" and _kw.get("dtype") == np.int32 and not _const:
            continue  # kiln's scatter_elements kernel is f32 only: folded only
        _how = ("with run-time indices" if _rt else
                "folded (constant data)" if _const else "on the GPU")
        case(f"onnx {_op} {_kw} {_how} matches the ONNX reference")(
            nd_case(_op, _const, _rt, **_kw))


@case("onnx GatherND and ScatterND with run-time indices: a tuple with an index outside its "
      "dimension gathers zeros and scatters nothing; under --guard the run fails naming it")
def _(workdir):
    rng = np.random.default_rng(5)
    d = rng.standard_normal([4, 3]).astype(np.float32)
    i = np.array([[1], [4], [-5], [-1]], np.int64)
    g = model([node("GatherND", ["d", "i"], ["y"], "g")],
              [value_info("d", [4, 3]), value_info("i", [4, 1], 7)], [value_info("y", [4, 3])])
    want = np.stack([d[1], np.zeros(3), np.zeros(3), d[3]]).astype(np.float32)
    wd = Path(workdir)
    for sub in ("g", "s", "g_guard", "s_guard"):
        (wd / sub).mkdir()
    run_onnx(wd / "g", g, [d, i], [want], ["y"], tol=(0, 0), guard=False)
    u = rng.standard_normal([4, 3]).astype(np.float32)
    s = model([node("ScatterND", ["d", "i", "u"], ["y"], "s")],
              [value_info("d", [4, 3]), value_info("i", [4, 1], 7), value_info("u", [4, 3])],
              [value_info("y", [4, 3])])
    want_s = d.copy()
    want_s[1], want_s[3] = u[0], u[3]
    run_onnx(wd / "s", s, [d, i, u], [want_s], ["y"], tol=(0, 0), guard=False)
    # --guard: GatherND's own kernel names the index; ScatterND's rows are
    # found on the GPU (an index outside gives one past the last row), and
    # its scatter reports that row number
    for sub, m, ins, words in [
            ("g_guard", g, [d, i], ["node 'g (GatherND)' (gather_nd): 'i' into 'd': index 4 "
                                    "(element 1 of the indices)", "of size 4"]),
            ("s_guard", s, [d, i, u], ["node 's (ScatterND)' (scatter_elements)", "index 4 ("
                                       "element", "is outside the axis, of size 4"])]:
        (wd / sub / "m.onnx").write_bytes(m)
        r = kiln("compile", wd / sub / "m.onnx", "--name", "model", "-o", wd / sub / "model.c",
                 "--guard")
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        res = run_program_raw(link_model(wd / sub), ins)
        check(res.returncode == 1 and "KILN_ERROR_OUT_OF_BOUNDS" in res.stderr and
              all(w in res.stderr for w in words),
              f"{sub}: status {res.returncode}, lacking one of {words}:\n{res.stderr[-1500:]}")


@case("onnx attention with q, k and v taken from one [3, B, heads, S, d] tensor by Gather "
      "(timm's and torchvision's qkv[0], qkv[1], qkv[2]): attention reads the QKV product "
      "[B, S, 3 * heads * d] in place (head_dim and offsets), no transpose or gather "
      "dispatch; the heads' merge after it written by the attention kernel; f32 and f16")
def _(workdir):
    B, S, D, H = 2, 9, 16, 2
    hd = D // H
    rng = np.random.default_rng(11)
    x = rng.standard_normal([B, S, D]).astype(np.float32)
    wqkv = (rng.standard_normal([D, 3 * D]) * 0.3).astype(np.float32)
    wo = (rng.standard_normal([D, D]) * 0.3).astype(np.float32)
    scale = np.array(hd ** -0.25, np.float32)
    inits = [initializer("wqkv", wqkv), initializer("wo", wo), initializer("scale", scale),
             initializer("s5", np.array([B, S, 3, H, hd], np.int64)),
             initializer("s3", np.array([B, S, D], np.int64))] + [
        # scalar indices (no dims; initializer() makes 0-d arrays [1]); the last negative
        field(2, ONNX_ELEM["int64"]) + field(8, f"i{c}") +
        field(9, np.array(c - 3 if c == 2 else c, np.int64).tobytes()) for c in range(3)]
    nodes = [node("MatMul", ["x", "wqkv"], ["mm"], "qkv_proj"),
             node("Reshape", ["mm", "s5"], ["r5"], "split_heads"),
             node("Transpose", ["r5"], ["qkv"], "to_front", attr("perm", [2, 0, 3, 1, 4]))]
    nodes += [node("Gather", ["qkv", f"i{c}"], [n], f"take_{n}", attr("axis", 0))
              for c, n in enumerate("qkv")]
    nodes += [node("Mul", ["q", "scale"], ["qs"], "scale_q"),
              node("Transpose", ["k"], ["kt"], "k_t", attr("perm", [0, 1, 3, 2])),
              node("Mul", ["kt", "scale"], ["kts"], "scale_k"),
              node("MatMul", ["qs", "kts"], ["sc"], "scores"),
              node("Softmax", ["sc"], ["p"], "softmax", attr("axis", -1)),
              node("MatMul", ["p", "v"], ["o"], "pv"),
              node("Transpose", ["o"], ["ot"], "merge", attr("perm", [0, 2, 1, 3])),
              node("Reshape", ["ot", "s3"], ["o3"], "merge_heads"),
              node("MatMul", ["o3", "wo"], ["y"], "out_proj")]
    m = model(nodes, [value_info("x", [B, S, D])], [value_info("y", [B, S, D])], inits,
              opset=17)
    qkv = (x @ wqkv).reshape(B, S, 3, H, hd).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv[0] * scale, qkv[1] * scale, qkv[2]
    sc = q @ k.transpose(0, 1, 3, 2)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = ((p @ v).transpose(0, 2, 1, 3).reshape(B, S, D) @ wo).astype(np.float32)
    wd = Path(workdir)
    for prec in ("f32", "f16"):
        (wd / prec).mkdir()
        flags = ("--precision", prec)
        run_onnx(wd / prec, m, [x], [want], ["y"], flags=flags,
                 tol=(1e-4, 1e-5) if prec == "f32" else (2e-2, 2e-2))
        r = kiln("inspect", wd / prec / "m.onnx", "--format", "json", *flags)
        check(r.returncode == 0, r.stderr)
        doc = json.loads(r.stdout)
        nodes_run = {d["node"] for d in doc["dispatches"]}
        check(not any(n.startswith(("take_", "merge", "to_front")) for n in nodes_run),
              f"{prec}: gather, transpose or heads-merge dispatches remain: "
              f"{sorted(nodes_run)}")
        text = (wd / prec / "model.c").read_text()
        check(all(f" *   {k} {v}\n" in text for k, v in
                  (("Q_OFF", 0), ("K_OFF", D), ("V_OFF", 2 * D), ("QS_S", 3 * D))),
              f"{prec}: attention does not read the product's rows at the thirds")


@case("onnx attention over one QKV product's parts taken by Split (GPT-2's c_attn) and by "
      "Slice (Phi-3's qkv_proj, grouped-query heads, the value's slice to the row's end): "
      "attention reads the product's rows at offsets, no split or slice dispatch")
def _(workdir):
    B, S, H, KVH, hd = 2, 11, 4, 2, 8
    D, W = H * hd, (H + 2 * KVH) * hd
    rng = np.random.default_rng(12)
    x = rng.standard_normal([B, S, D]).astype(np.float32)
    wqkv = (rng.standard_normal([D, W]) * 0.3).astype(np.float32)
    ends = [(0, D), (D, D + KVH * hd), (D + KVH * hd, W)]
    qkv = x @ wqkv
    parts = [qkv[..., a:b].reshape(B, S, -1, hd).transpose(0, 2, 1, 3) for a, b in ends]
    q, k, v = parts[0], np.repeat(parts[1], H // KVH, 1), np.repeat(parts[2], H // KVH, 1)
    sc = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    p_ = np.exp(sc - sc.max(-1, keepdims=True))
    p_ /= p_.sum(-1, keepdims=True)
    want = (p_ @ v).astype(np.float32)
    for how in ("split", "slice"):
        wd = Path(workdir) / how
        wd.mkdir()
        inits = [initializer("wqkv", wqkv), initializer("scale", np.array(hd ** -0.5, np.float32)),
                 initializer("sq", np.array([B, S, H, hd], np.int64)),
                 initializer("skv", np.array([B, S, KVH, hd], np.int64)),
                 initializer("sizes", np.array([D, KVH * hd, KVH * hd], np.int64)),
                 initializer("s5", np.array([B, KVH, H // KVH, S, hd], np.int64)),
                 initializer("s4", np.array([B, H, S, hd], np.int64)),
                 initializer("ax", np.array([2], np.int64)),
                 initializer("ax_last", np.array([-1], np.int64))]
        nodes = [node("MatMul", ["x", "wqkv"], ["mm"], "qkv_proj")]
        if how == "split":
            nodes.append(node("Split", ["mm", "sizes"], ["q0", "k0", "v0"], "c_attn_split",
                              attr("axis", 2)))
        else:
            for n_, (a, b) in zip(("q0", "k0", "v0"), ends):
                end = 2 ** 62 if n_ == "v0" else b  # to the row's end, as torch writes [..., a:]
                inits += [initializer(f"st_{n_}", np.array([a], np.int64)),
                          initializer(f"en_{n_}", np.array([end], np.int64))]
                nodes.append(node("Slice", ["mm", f"st_{n_}", f"en_{n_}", "ax_last"], [n_],
                                  f"slice_{n_}"))
        for n_, shape in (("q", "sq"), ("k", "skv"), ("v", "skv")):
            nodes += [node("Reshape", [f"{n_}0", shape], [f"{n_}1"], f"view_{n_}"),
                      node("Transpose", [f"{n_}1"], [f"{n_}2"], f"heads_{n_}",
                           attr("perm", [0, 2, 1, 3]))]
        for n_ in ("k", "v"):  # repeat the key/value heads: [B, KVH, 1, S, hd] expanded
            nodes += [node("Unsqueeze", [f"{n_}2", "ax"], [f"{n_}3"], f"unsq_{n_}"),
                      node("Expand", [f"{n_}3", "s5"], [f"{n_}4"], f"rep_{n_}"),
                      node("Reshape", [f"{n_}4", "s4"], [f"{n_}5"], f"flat_{n_}")]
        nodes += [node("Transpose", ["k5"], ["kt"], "k_t", attr("perm", [0, 1, 3, 2])),
                  node("Mul", ["q2", "scale"], ["qs"], "scaled"),
                  node("MatMul", ["qs", "kt"], ["sc"], "scores"),
                  node("Softmax", ["sc"], ["p"], "softmax", attr("axis", -1)),
                  node("MatMul", ["p", "v5"], ["y"], "pv")]
        m = model(nodes, [value_info("x", [B, S, D])], [value_info("y", [B, H, S, hd])],
                  inits, opset=17)
        run_onnx(wd, m, [x], [want], ["y"])
        r = kiln("inspect", wd / "m.onnx", "--format", "json")
        check(r.returncode == 0, r.stderr)
        ran = sorted({d["node"] for d in json.loads(r.stdout)["dispatches"]})
        check(not any(n.startswith(("c_attn", "slice_", "heads_", "rep_")) for n in ran),
              f"{how}: split, slice, transpose or repeat dispatches remain: {ran}")
        text = (wd / "model.c").read_text()
        check(all(f" *   {k} {v}\n" in text for k, v in
                  (("Q_OFF", 0), ("K_OFF", D), ("V_OFF", D + KVH * hd), ("QS_S", W))),
              f"{how}: attention does not read the product's rows at the parts' offsets")


@case("onnx GatherND and ScatterND: constant indices out of range and a reduction newer "
      "than the op's version are refused by name")
def _(workdir):
    d = np.zeros([4, 3], np.float32)
    g = model([node("GatherND", ["d", "i"], ["y"], "g")], [value_info("d", [4, 3])],
              [value_info("y", [2, 3])], [initializer("i", np.array([[1], [4]], np.int64))])
    expect_refused(workdir, g, ["node 'g (GatherND)'", "index 4 is out of range"])
    red = field(5, field(1, "reduction") + field(4, "max") + field(20, 3))
    s = model([node("ScatterND", ["d", "i", "u"], ["y"], "s", red)],
              [value_info("d", [4, 3]), value_info("u", [1, 3])], [value_info("y", [4, 3])],
              [initializer("i", np.array([[1]], np.int64))], opset=16)
    expect_refused(workdir, s, ["node 's (ScatterND)'", "unsupported: reduction 'max' "
                                "(ScatterND version 16)"])
    del d


@case("onnx Transpose and Expand of constants fold at compile time (Swin's legacy export "
      "builds Pad's pads through them); a transpose too large to fold runs on the GPU")
def _(workdir):
    # pads = Cast(Reshape(Transpose(Expand([[0, 1]], [2, 2])), [4])): [0, 0, 1, 1]
    inits = [initializer("p", np.array([[0, 1]], np.int64)),
             initializer("s", np.array([2, 2], np.int64)),
             initializer("flat", np.array([4], np.int64))]
    nodes = [node("Expand", ["p", "s"], ["e"], "expand"),
             node("Transpose", ["e"], ["t"], "transpose", attr("perm", [1, 0])),
             node("Reshape", ["t", "flat"], ["pads"], "reshape"),
             node("Pad", ["x", "pads"], ["y"], "pad")]
    data = model(nodes, [value_info("x", [3, 4])], [value_info("y", [4, 5])], inits)
    x = np.random.default_rng(2).standard_normal([3, 4]).astype(np.float32)
    run_onnx(workdir, data, [x], [np.pad(x, [(0, 1), (0, 1)])], ["y"], tol=(0, 0))
    # 4.4 M elements: more than kiln folds (MAX_CONST_FOLD), so a kernel transposes it
    w = np.random.default_rng(3).standard_normal([4, 1100001]).astype(np.float32)
    data = model([node("Transpose", ["w"], ["t"], "transpose"), node("Add", ["t", "x"], ["y"], "add")],
                 [value_info("x", [1100001, 4])], [value_info("y", [1100001, 4])],
                 [initializer("w", w)])
    x = np.random.default_rng(4).standard_normal([1100001, 4]).astype(np.float32)
    run_onnx(workdir, data, [x], [w.T + x], ["y"], tol=(0, 0))


def conv_transpose_ref(x, w, strides, out_shape, upper):
    """2-D ConvTranspose (group 1) to out_shape, pads as ONNX's reference
    splits them: the full output, then cropped (or zero-extended) at each end."""
    n, ci, h, wd = x.shape
    co, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    full = np.zeros((n, co, (h - 1) * strides[0] + kh, (wd - 1) * strides[1] + kw))
    for i in range(h):
        for j in range(wd):
            full[:, :, i * strides[0]:i * strides[0] + kh, j * strides[1]:j * strides[1] + kw] += \
                np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
    out = full
    for ax, want in ((2, out_shape[0]), (3, out_shape[1])):
        total = out.shape[ax] - want
        begin = total // 2 if upper else total - total // 2
        end = total - begin
        out = np.take(out, range(begin, out.shape[ax] - max(end, 0)), axis=ax)
        if end < 0:
            pad = [(0, 0)] * 4
            pad[ax] = (0, -end)
            out = np.pad(out, pad)
    return out


@case("onnx ConvTranspose with output_shape: pads split as ONNX's reference does (NOTSET "
      "and SAME_UPPER, more output than the convolution covers as output_padding); output "
      "before the first position refused by name")
def _(workdir):
    rng = np.random.default_rng(8)
    x = rng.standard_normal([1, 2, 3, 4]).astype(np.float32)
    w = rng.standard_normal([2, 3, 3, 3]).astype(np.float32)
    # full output 7 x 9: odd and even totals, negative ones (extended at the end)
    for shape, auto, sub in (([8, 9], b"", "a"), ([6, 7], b"", "b"),
                             ([7, 8], b"SAME_UPPER", "c"), ([8, 10], b"", "d")):
        attrs = attr("strides", [2, 2]) + attr("output_shape", shape)
        if auto:
            attrs += field(5, field(1, "auto_pad") + field(4, auto) + field(20, 3))
        want = conv_transpose_ref(x.astype(np.float64), w.astype(np.float64), [2, 2], shape,
                                  bool(auto))
        data = model([node("ConvTranspose", ["x", "w"], ["y"], "ct", attrs)],
                     [value_info("x", [1, 2, 3, 4])], [value_info("y", list(want.shape))],
                     [initializer("w", w)])
        d = Path(workdir) / sub
        d.mkdir()
        run_onnx(d, data, [x], [want], ["y"], tol=(1e-4, 1e-5))
    for shape, auto in (([9, 9], b"SAME_UPPER"), ([10, 9], b"")):  # totals -2 and -3
        attrs = attr("strides", [2, 2]) + attr("output_shape", shape)
        if auto:
            attrs += field(5, field(1, "auto_pad") + field(4, auto) + field(20, 3))
        data = model([node("ConvTranspose", ["x", "w"], ["y"], "ct", attrs)],
                     [value_info("x", [1, 2, 3, 4])], [value_info("y", [1, 3] + shape)],
                     [initializer("w", w)])
        expect_refused(workdir, data, ["node 'ct (ConvTranspose)'",
                                       f"unsupported: output_shape {shape[0]} on spatial axis 0",
                                       "before the first input position"])


@case("onnx Compress: a constant condition gathers (along an axis and flattened); one "
      "computed at run time is refused by name")
def _(workdir):
    x = np.random.default_rng(6).standard_normal([4, 3]).astype(np.float32)
    keep = np.array([True, False, True, True])
    for sub, attrs in (("a", attr("axis", 0)), ("b", b"")):  # b: flattened, a shorter one
        cond = keep if attrs else np.array([1, 1, 0, 1, 1], bool)
        want = x[cond] if attrs else x.ravel()[:5][cond]
        data = model([node("Compress", ["x", "c"], ["y"], "cp", attrs)],
                     [value_info("x", [4, 3])], [value_info("y", list(want.shape))],
                     [initializer("c", cond)])
        d = Path(workdir) / sub
        d.mkdir()
        run_onnx(d, data, [x], [want], ["y"], tol=(0, 0))
    data = model([node("Compress", ["x", "c"], ["y"], "cp", attr("axis", 0))],
                 [value_info("x", [4, 3]), value_info("c", [4], 9)], [value_info("y", [2, 3])])
    expect_refused(workdir, data, ["node 'cp (Compress)'", "Compress's condition",
                                   "must be a constant"])


@case("onnx CumSum of a constant folds at compile time (position ids from a mask): "
      "integers and floats, exclusive and reverse")
def _(workdir):
    rng = np.random.default_rng(9)
    for sub, dt, excl, rev in (("a", np.int64, 0, 0), ("b", np.float32, 1, 0),
                               ("c", np.int32, 0, 1), ("d", np.float32, 1, 1)):
        m = (rng.integers(0, 3, [2, 5]) if dt != np.float32 else
             rng.standard_normal([2, 5])).astype(dt)
        a = np.flip(m, 1) if rev else m
        want = np.cumsum(a, 1, dtype=dt)
        if excl:
            want = np.concatenate([np.zeros([2, 1], dt), want[:, :-1]], 1)
        want = np.flip(want, 1) if rev else want
        x = rng.integers(-9, 9, [2, 5]).astype(dt)
        attrs = (attr("exclusive", 1) if excl else b"") + (attr("reverse", 1) if rev else b"")
        elem = {np.int64: 7, np.int32: 6, np.float32: 1}[dt]
        # of a constant: folded, no kernel
        data = model([node("CumSum", ["m", "ax"], ["s"], "cs", attrs),
                      node("Add", ["s", "x"], ["y"], "add")],
                     [value_info("x", [2, 5], elem)], [value_info("y", [2, 5], elem)],
                     [initializer("m", m), initializer("ax", np.array(1, np.int32))])
        d = Path(workdir) / sub
        d.mkdir()
        run_onnx(d, data, [x], [want + x], ["y"], tol=(1e-5, 1e-6))


@case("onnx CumSum of run-time integers (RoBERTa's position ids): int64 past 2^53 and int32, "
      "300 along the axis (chunks carried), exclusive and reverse, axis 0 and 1, exact")
def _(workdir):
    rng = np.random.default_rng(19)
    for sub, dt, excl, rev, axis, big in (("a", np.int64, 0, 0, 1, 1 << 50),
                                          ("b", np.int32, 1, 1, 1, 1 << 20),
                                          ("c", np.int64, 1, 0, 0, 1 << 40),
                                          ("d", np.int32, 0, 1, 0, 1000)):
        x = rng.integers(-big, big, [3, 300] if axis == 1 else [300, 3]).astype(dt)
        a = np.flip(x, axis) if rev else x
        want = np.cumsum(a, axis, dtype=dt)
        if excl:
            want = want - a
        want = np.flip(want, axis) if rev else want
        attrs = (attr("exclusive", 1) if excl else b"") + (attr("reverse", 1) if rev else b"")
        elem = {np.int64: 7, np.int32: 6}[dt]
        data = model([node("CumSum", ["x", "ax"], ["y"], "cs", attrs)],
                     [value_info("x", list(x.shape), elem)],
                     [value_info("y", list(x.shape), elem)],
                     [initializer("ax", np.array(axis, np.int64))])
        d = Path(workdir) / sub
        d.mkdir()
        run_onnx(d, data, [x], [want], ["y"], tol=(0, 0))


@case("onnx ArgMax and ArgMin of integers (GPT-2's classifier finds its last token so): int64 "
      "past 2^53, int32, ties (first and last index), axes 0 and 1, exact")
def _(workdir):
    rng = np.random.default_rng(23)
    for sub, dt, op, last, axis, big in (("a", np.int64, "ArgMax", 0, 1, 1 << 60),
                                         ("b", np.int32, "ArgMin", 1, 0, 5),
                                         ("c", np.int64, "ArgMax", 1, 0, 3),
                                         ("d", np.int32, "ArgMin", 0, 1, 1 << 30)):
        x = rng.integers(-big, big, [6, 300]).astype(dt)
        if dt == np.int64 and big > 1 << 53:  # neighbours a float would merge
            x[:, 7] = 1 << 60
            x[:, 9] = (1 << 60) + 1
        f = np.argmax if op == "ArgMax" else np.argmin
        want = (x.shape[axis] - 1 - f(np.flip(x, axis), axis)) if last else f(x, axis)
        attrs = attr("axis", axis) + attr("keepdims", 0) + attr("select_last_index", last)
        elem = {np.int64: 7, np.int32: 6}[dt]
        out = [300] if axis == 0 else [6]
        data = model([node(op, ["x"], ["y"], "arg", attrs)],
                     [value_info("x", list(x.shape), elem)], [value_info("y", out, 7)])
        d = Path(workdir) / sub
        d.mkdir()
        run_onnx(d, data, [x], [want.astype(np.int64)], ["y"], tol=(0, 0))


def branch(name, nodes, outputs, inits=(), inputs=()):
    """A graph attribute: an If's then_branch or else_branch, or (with its
    inputs) a Loop's or Scan's body: nodes that read the outer scope too,
    with their own initializers and outputs."""
    g = b"".join(field(1, n) for n in nodes) + field(2, name)
    g += b"".join(field(5, t) for t in inits) + b"".join(field(11, i) for i in inputs)
    g += b"".join(field(12, o) for o in outputs)
    return field(5, field(1, name) + field(6, g) + field(20, 5))


@case("onnx If with a constant condition inlines the branch it takes (outer values, its "
      "own initializers, a nested If, a constant output); a run-time condition is refused")
def _(workdir):
    rng = np.random.default_rng(12)
    x = rng.standard_normal([2, 3]).astype(np.float32)
    w = rng.standard_normal([2, 3]).astype(np.float32)
    for sub, flag in (("t", True), ("f", False)):
        inner = node("If", ["c2"], ["z"], "inner",
                     branch("then_branch", [node("Neg", ["x"], ["n"], "neg")],
                            [value_info("n", [2, 3])]) +
                     branch("else_branch", [node("Abs", ["x"], ["ab"], "abs")],
                            [value_info("ab", [2, 3])]))
        then = branch("then_branch", [node("Mul", ["x", "w"], ["m"], "mul"), inner,
                                      node("Add", ["m", "z"], ["r"], "add")],
                      [value_info("r", [2, 3]), value_info("k", [3])],
                      [initializer("w", w), initializer("k", np.array([1, 2, 3], np.float32))])
        other = branch("else_branch", [node("Sub", ["x", "k2"], ["r2"], "sub")],
                       [value_info("r2", [2, 3]), value_info("k2", [3])],
                       [initializer("k2", np.array([4, 5, 6], np.float32))])
        nodes = [node("If", ["c"], ["y", "kk"], "if", then + other),
                 node("Add", ["y", "kk"], ["out"], "tail")]
        data = model(nodes, [value_info("x", [2, 3])], [value_info("out", [2, 3])],
                     [initializer("c", np.array(flag)), initializer("c2", np.array([False]))])
        want = x * w + np.abs(x) + [1, 2, 3] if flag else x - [4, 5, 6] + [4, 5, 6]
        d = Path(workdir) / sub
        d.mkdir()
        run_onnx(d, data, [x], [want.astype(np.float32)], ["out"], tol=(1e-5, 1e-6))
    data = model([node("If", ["c"], ["y"], "if",
                       branch("then_branch", [node("Neg", ["x"], ["n"], "neg")],
                              [value_info("n", [2, 3])]) +
                       branch("else_branch", [node("Abs", ["x"], ["a"], "abs")],
                              [value_info("a", [2, 3])]))],
                 [value_info("x", [2, 3]), value_info("c", [1], 9)], [value_info("y", [2, 3])])
    expect_refused(workdir, data, ["node 'if (If)'", "If's condition", "must be a constant"])
    data = model([node("If", ["c"], ["y"], "if",
                       branch("then_branch", [node("Unique", ["x"], ["n"], "uq")],
                              [value_info("n", [2, 3])]) +
                       branch("else_branch", [node("Abs", ["x"], ["a"], "abs")],
                              [value_info("a", [2, 3])]))],
                 [value_info("x", [2, 3])], [value_info("y", [2, 3])],
                 [initializer("c", np.array(True))])
    expect_refused(workdir, data, ["node 'uq (Unique), in the then_branch of if (If)'",
                                   "unsupported: op type Unique"])


@case("onnx --shape fixes a symbolic dimension; --const binds an input")
def _(workdir):
    import numpy as np
    wd = Path(workdir)
    (wd / "m.onnx").write_bytes(model([node("Relu", ["x"], ["y"], "r")],
                                      [value_info("x", ["batch", 3])],
                                      [value_info("y", ["batch", 3])]))
    r = kiln("compile", "m.onnx", "--shape", "x=4x3", "-o", "m.c", cwd=wd)
    check(r.returncode == 0, r.stderr)
    check("[0] x: f32 [4, 3]" in (wd / "m.h").read_text(), (wd / "m.h").read_text())
    r = kiln("compile", "m.onnx", "--shape", "x=4x3x2", "-o", "m.c", cwd=wd)
    check(r.returncode == 1 and "rank 3" in r.stderr, r.stderr)
    # Reshape whose shape is bound at compile time.
    shape = field(1, 2) + field(2, 7) + field(8, "s") + field(9, struct.pack("<qq", 3, 2))
    (wd / "s.pb").write_bytes(shape)
    (wd / "r.onnx").write_bytes(model([node("Reshape", ["x", "s"], ["y"], "rs")],
                                      [value_info("x", [6]), value_info("s", [2], elem=7)],
                                      [value_info("y", [3, 2])]))
    r = kiln("compile", "r.onnx", "--const", "s=s.pb", "-o", "r.c", cwd=wd)
    check(r.returncode == 0, r.stderr)
    h = (wd / "r.h").read_text()
    check("R_INPUT_COUNT 1u" in h.replace("MODEL", "R") or "INPUT_COUNT 1u" in h, h)
    check("f32 [3, 2]" in h, h)
    r = kiln("tensor", wd / "s.pb", wd / "s.bin")
    check(r.returncode == 0 and r.stdout.strip() == "i64 [2] s", r.stdout + r.stderr)
    check(np.fromfile(wd / "s.bin", np.int64).tolist() == [3, 2], "tensor data")
    # .npy: dtype and shape too, for every rank and dtype kiln tensor reads
    rng = np.random.default_rng(3)
    for a in (rng.standard_normal([2, 3, 5]).astype(np.float32),
              rng.integers(-9, 9, [7]).astype(np.int64), np.array(2.5, np.float32),
              rng.standard_normal([4, 1]).astype(np.float16),
              rng.integers(0, 2, [3, 2]).astype(bool), rng.integers(-5, 5, [6]).astype(np.int8)):
        (wd / "t.pb").write_bytes(initializer("t", a))
        r = kiln("tensor", wd / "t.pb", wd / "t.npy")
        check(r.returncode == 0, r.stderr)
        got = np.load(wd / "t.npy")
        shape = a.shape or (1,)  # kiln holds a scalar as [1], as it prints
        check(got.dtype == a.dtype and got.shape == shape and np.array_equal(got.ravel(),
                                                                                 a.ravel()),
              f"{a.dtype} {a.shape}: .npy holds {got.dtype} {got.shape}")


@case("onnx weights read in place (onnx_wire.c) keep protobuf's meaning: a tensor's last "
      "raw_data wins, initializers of a graph split over two fields keep their order")
def _(workdir):
    rng = np.random.default_rng(7)
    a, b, w3, x = (rng.standard_normal(512).astype(np.float32) for _ in range(4))
    # W1's raw_data twice (both large: taken out of the unpack): the second wins.
    w1 = initializer("W1", a) + field(9, b.tobytes())
    nodes = [node("Add", ["x", "W1"], ["t"], "add"), node("Mul", ["t", "W3"], ["y"], "mul")]
    part1 = b"".join(field(1, n) for n in nodes) + field(2, "g") + field(5, w1)
    part2 = (field(5, initializer("W3", w3)) + field(11, value_info("x", [512])) +
             field(12, value_info("y", [512])))
    data = field(1, 8) + field(8, field(2, 13)) + field(7, part1) + field(7, part2)
    run_onnx(workdir, data, [x], [(x + b) * w3], ["y"], tol=(1e-6, 1e-6))
    # A large raw_data, then a small one: the small one wins (and is too short).
    w1 = initializer("W1", a) + field(9, b.tobytes()[:16])
    data = model(nodes, [value_info("x", [512])], [value_info("y", [512])],
                 [w1, initializer("W3", w3)])
    expect_refused(workdir, data, ["initializer 'W1': raw data of 16 bytes, the tensor "
                                   "needs 2048"])


def rotary_reference(x, cos, sin, pos, interleaved, rdim, heads):
    """ONNX RotaryEmbedding-23 in numpy (its specification's algorithm)."""
    shape = x.shape
    x = np.transpose(x, (0, 2, 1, 3)) if x.ndim == 4 else x.reshape(
        shape[0], shape[1], heads, shape[2] // heads)
    rdim = rdim or x.shape[3]
    rot, rest = x[..., :rdim], x[..., rdim:]
    if pos is not None:
        cos, sin = cos[pos], sin[pos]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else np.split(rot, 2, axis=-1)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    rot = np.stack([real, imag], -1).reshape(rot.shape) if interleaved else \
        np.concatenate([real, imag], -1)
    y = np.concatenate([rot, rest], -1)
    return y.reshape(shape) if len(shape) == 3 else np.transpose(y, (0, 2, 1, 3))


def rotary_case(rank, interleaved, rdim, with_pos):
    """RotaryEmbedding with a batch of one: kiln's own rope kernel (the cases
    of tests/onnx/node-1.23 have a batch of two, which takes elementwise ops)."""
    def test(workdir):
        r = np.random.default_rng(23)
        S, H, D, P = 5, 2, 8, 16
        R = rdim or D
        xs = [1, H, S, D] if rank == 4 else [1, S, H * D]
        x = r.standard_normal(xs).astype(np.float32)
        angles = r.uniform(-3, 3, [P if with_pos else 1, S if not with_pos else R // 2])
        if with_pos:
            cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
            pos = r.integers(0, P, [1, S]).astype(np.int64)
        else:
            ang = r.uniform(-3, 3, [1, S, R // 2])
            cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
            pos = None
        want = rotary_reference(x, cos, sin, pos, interleaved, rdim, H)
        attrs = attr("interleaved", int(interleaved)) + attr("rotary_embedding_dim", rdim)
        if rank == 3:
            attrs += attr("num_heads", H)
        ins = ["x", "cos", "sin"] + (["pos"] if with_pos else [])
        inits = [initializer("cos", cos), initializer("sin", sin)]
        infos = [value_info("x", xs)]
        feeds = [x]
        if with_pos:
            infos.append(value_info("pos", [1, S], 7))
            feeds.append(pos)
        data = model([node("RotaryEmbedding", ins, ["y"], "rope", attrs)], infos,
                     [value_info("y", xs)], inits, opset=23)
        run_onnx(workdir, data, feeds, [want.astype(np.float32)], ["y"], tol=(1e-5, 1e-6))
    return test


for _rank, _inter, _rdim, _pos in [(4, 0, 0, True), (4, 1, 0, True), (3, 0, 4, False),
                                   (3, 1, 4, True), (4, 0, 6, False)]:
    case(f"onnx RotaryEmbedding 23, batch 1, rank {_rank}, interleaved {_inter}, "
         f"rotary_embedding_dim {_rdim}, {'position_ids' if _pos else 'no position_ids'}")(
        rotary_case(_rank, _inter, _rdim, _pos))


@case("docs/onnx-ops.md is what tools/onnx_ops_table.py writes from the compiler's tables")
def _(workdir):
    import subprocess
    import sys
    tool = Path(__file__).resolve().parents[1] / "tools" / "onnx_ops_table.py"
    r = subprocess.run([sys.executable, tool, "--check"], capture_output=True, text=True)
    check(r.returncode == 0, "docs/onnx-ops.md is stale: run tools/onnx_ops_table.py\n" +
          r.stdout + r.stderr)


@case("onnx Softmax, LogSoftmax and Hardmax of f16 values (a model exported in halves, as "
      "torch.onnx.export writes a model.half() decoder's attention): computed in f32, the "
      "results f16; opset 11's flattening axis and opset 17's last axis, f32 and --precision "
      "f16 builds, against numpy")
def _(workdir):
    rng = np.random.default_rng(31)
    x = (rng.standard_normal([2, 3, 5]) * 3).astype(np.float16)
    xf = x.astype(np.float64)

    def softmax(a, axis):
        e = np.exp(a - a.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)
    flat = xf.reshape(2, 15)
    cases = {  # opset: nodes, outputs, expected
        11: ([node("Softmax", ["x"], ["s"], "s", attr("axis", 1)),
              node("LogSoftmax", ["x"], ["ls"], "ls", attr("axis", 2)),
              node("Hardmax", ["x"], ["h"], "h", attr("axis", 1))],
             ["s", "ls", "h"],
             [softmax(flat, 1).reshape(2, 3, 5), np.log(softmax(xf, 2)),
              np.eye(15)[flat.argmax(1)].reshape(2, 3, 5)]),
        17: ([node("Softmax", ["x"], ["s"], "s", attr("axis", -1)),
              node("LogSoftmax", ["x"], ["ls"], "ls", attr("axis", 1))],
             ["s", "ls"], [softmax(xf, -1), np.log(softmax(xf, 1))]),
    }
    for opset, (nodes, outs, want) in cases.items():
        m = model(nodes, [value_info("x", [2, 3, 5], 10)],
                  [value_info(o, [2, 3, 5], 10) for o in outs], [], opset=opset)
        for prec in ("f32", "f16"):
            wd = Path(workdir) / f"{opset}_{prec}"
            wd.mkdir()
            run_onnx(wd, m, [x], [w.astype(np.float16) for w in want], outs,
                     flags=("--precision", prec), tol=(2e-3, 2e-3))


@case("onnx model of f16 values (weights, input and outputs f16): Conv with its bias, "
      "BatchNormalization, GlobalAveragePool, Gemm with C, LayerNormalization (the f16 scale and "
      "bias converted to f32 when compiled), TopK and CumSum (f32 kernels, through casts), "
      "ReduceSum; default and --precision f16 builds, against numpy in f64")
def _(workdir):
    rng = np.random.default_rng(33)
    h = lambda *shape, s=1.0: (rng.standard_normal(shape) * s).astype(np.float16)  # noqa: E731
    x, w, b = h(2, 4, 6, 6), h(8, 4, 3, 3, s=0.3), h(8)
    scale, bias, mean = h(8), h(8), h(8, s=0.2)
    var = (rng.random(8) + 0.5).astype(np.float16)
    wg, cg, ls, lb = h(8, 5), h(5), h(5), h(5)
    f = lambda a: a.astype(np.float64)  # noqa: E731
    xp = np.pad(f(x), ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.einsum("nchwij,ocij->nohw", np.lib.stride_tricks.sliding_window_view(
        xp, (3, 3), axis=(2, 3)), f(w)) + f(b)[None, :, None, None]
    per = lambda a: a[None, :, None, None]  # noqa: E731
    bn = (conv - per(f(mean))) / np.sqrt(per(f(var)) + 1e-5) * per(f(scale)) + per(f(bias))
    gm = bn.mean((2, 3)) @ f(wg) + f(cg)
    mu, sd = gm.mean(-1, keepdims=True), np.sqrt(gm.var(-1, keepdims=True) + 1e-5)
    ln = (gm - mu) / sd * f(ls) + f(lb)
    top = -np.sort(-ln, axis=1)[:, :3]
    nodes = [node("Conv", ["x", "w", "b"], ["c"], "conv", attr("pads", [1, 1, 1, 1])),
             node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], "bn"),
             node("GlobalAveragePool", ["bn"], ["g"], "gap"),
             node("Flatten", ["g"], ["fl"], "flat"),
             node("Gemm", ["fl", "wg", "cg"], ["gm"], "gemm"),
             node("LayerNormalization", ["gm", "ls", "lb"], ["ln"], "ln"),
             node("TopK", ["ln", "k"], ["tv", "ti"], "topk"),
             node("CumSum", ["ln", "ax"], ["cs"], "cumsum"),
             node("ReduceSum", ["bn", "axes"], ["rs"], "rsum", attr("keepdims", 0))]
    inits = [initializer(n, a) for n, a in [
        ("w", w), ("b", b), ("scale", scale), ("bias", bias), ("mean", mean), ("var", var),
        ("wg", wg), ("cg", cg), ("ls", ls), ("lb", lb), ("k", np.array([3], np.int64)),
        ("ax", np.array(1, np.int64)), ("axes", np.array([2, 3], np.int64))]]
    outs = [("tv", [2, 3], 10), ("ti", [2, 3], 7), ("cs", [2, 5], 10), ("rs", [2, 8], 10)]
    m = model(nodes, [value_info("x", [2, 4, 6, 6], 10)],
              [value_info(n, d, e) for n, d, e in outs], inits, opset=17)
    want = [top, ln.cumsum(1), bn.sum((2, 3))]
    for prec in ("f32", "f16"):
        wd = Path(workdir) / prec
        wd.mkdir()
        (wd / "m.onnx").write_bytes(m)
        r = kiln("compile", wd / "m.onnx", "--name", "model", "-o", wd / "model.c", "--guard",
                 "--precision", prec)
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        got = run_program(link_model(wd), [x], [np.zeros(d, np.float16 if e == 10 else np.int64)
                                                for _, d, e in outs])
        for (name, _, _), g, e in zip(outs[:1] + outs[2:], got[:1] + got[2:], want):
            assert_relative(g.astype(np.float64), e, F16_TOLERANCE, f"{prec} {name}")
        # the indices: where the reference has the values kiln found
        assert_relative(np.take_along_axis(ln, got[1], 1), top, F16_TOLERANCE, f"{prec} ti")


@case("onnx Softmax of opset 11 over a 2-D input at axis 0: the whole input flattened to one "
      "row [1, 24], the result back in [4, 6], against numpy")
def _(workdir):
    x = np.random.default_rng(32).standard_normal([4, 6]).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max())
    m = model([node("Softmax", ["x"], ["y"], "s", attr("axis", 0))],
              [value_info("x", [4, 6])], [value_info("y", [4, 6])], [], opset=11)
    run_onnx(workdir, m, [x], [(e / e.sum()).astype(np.float32)], ["y"])


@case("onnx RMSNorm of f16 values as transformers writes it: x cast up to f32, Pow, "
      "ReduceMean, Add eps, Sqrt, Reciprocal, Mul, cast back to f16, times the f16 scale: "
      "one rms_norm dispatch (no cast, pow or mean left), default and --precision f16, "
      "against numpy in f64 (large |x|, whose squares overflow f16)")
def _(workdir):
    rng = np.random.default_rng(34)
    x = (rng.standard_normal([2, 5, 64]) * 300).astype(np.float16)
    gamma = (rng.standard_normal(64) * 0.5 + 1).astype(np.float16)
    xf = x.astype(np.float64)
    want = xf / np.sqrt((xf * xf).mean(-1, keepdims=True) + 1e-6) * gamma.astype(np.float64)
    nodes = [node("Cast", ["x"], ["x32"], "up", attr("to", 1)),
             node("Pow", ["x32", "two"], ["sq"], "pow"),
             node("ReduceMean", ["sq"], ["ms"], "mean", attr("axes", [-1]) + attr("keepdims", 1)),
             node("Add", ["ms", "eps"], ["mse"], "add"),
             node("Sqrt", ["mse"], ["rms"], "sqrt"),
             node("Reciprocal", ["rms"], ["inv"], "rcp"),
             node("Mul", ["x32", "inv"], ["n32"], "norm"),
             node("Cast", ["n32"], ["n16"], "down", attr("to", 10)),
             node("Mul", ["gamma", "n16"], ["y"], "scale")]
    inits = [initializer("two", np.array(2, np.float32)),
             initializer("eps", np.array(1e-6, np.float32)), initializer("gamma", gamma)]
    m = model(nodes, [value_info("x", [2, 5, 64], 10)], [value_info("y", [2, 5, 64], 10)],
              inits)
    for prec in ("default", "f16"):
        wd = Path(workdir) / prec
        wd.mkdir()
        (wd / "m.onnx").write_bytes(m)
        flags = ("--precision", "f16") if prec == "f16" else ()
        r = kiln("inspect", wd / "m.onnx", "--format", "json", *flags)
        check(r.returncode == 0, f"kiln inspect failed:\n{r.stderr}")
        ops = [d["op"] for d in json.loads(r.stdout)["dispatches"]]
        check(ops == ["rms_norm"], f"{prec}: dispatches {ops}, expected one rms_norm")
        r = kiln("compile", wd / "m.onnx", "--name", "model", "-o", wd / "model.c", *flags)
        check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
        got = run_program(link_model(wd), [x], [np.zeros([2, 5, 64], np.float16)])
        assert_relative(got[0].astype(np.float64), want, F16_TOLERANCE, prec)
