#!/usr/bin/env python3
"""seeds.py: the starting corpus of each fuzz target (make fuzz).

  tests/fuzz/seeds.py OUT_DIR TARGET...

yaml and frontend: samples/*.yaml, the model of every op test and a small
model per weight source;
onnx: every model of Debian's libonnx-testdata; onnx_dims: the ONNX models
of the dynamic-dimension tests (test_dynamic.py), each behind the line of
--shape arguments it is compiled with; safetensors: files written here,
each behind the two bytes the target reads as dtype and rank. Every
target also gets its committed regressions (tests/fuzz/regressions/TARGET/).
"""
import json
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ONNX_DATA = Path("/usr/share/libonnx-testdata/data")

SOURCES = {
    "values": "values: [1, 2, 3, 4, 5, 6]",
    "value": "value: 0.5",
    "normal": "init: {normal: 0.02, mean: 0, seed: 7}",
    "uniform": "init: {uniform: [-1, 1], seed: 3}",
}


class Captured(Exception):
    pass


def captured_compiles(tests, keep):
    """Runs each (name, function) of tests with subprocess.run replaced:
    the first command a test runs (its `kiln compile`, as a list of
    strings) goes to keep(cmd) and stops the test there, so nothing is
    compiled, built or run, and no test's own checks matter."""
    import subprocess
    import tempfile
    real = subprocess.run

    def capture(cmd, *args, **kwargs):
        cmd = [str(c) for c in cmd]
        if len(cmd) > 2 and cmd[1] == "compile":
            keep(cmd)
        raise Captured()
    subprocess.run = capture
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, (_, fn) in enumerate(tests):
                wd = Path(tmp) / str(i)
                wd.mkdir()
                try:
                    fn(str(wd))
                except Exception:  # Captured, or a case that fails before compiling
                    pass
    finally:
        subprocess.run = real


def compiled_file(cmd, suffix):
    """The model file a `kiln compile` command names (ending in suffix), or None."""
    files = [a for a in cmd[2:] if a.endswith(suffix) and Path(a).is_file()]
    return Path(files[0]) if files else None


def op_test_models():
    """The YAML of every op test (test_ops.py), captured before it compiles."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_ops
    texts = []

    def keep(cmd):
        f = compiled_file(cmd, ".yaml")
        if f:
            texts.append(f.read_text())
    captured_compiles(test_ops.TESTS, keep)
    return texts


def yaml_seeds():
    out = {p.name: p.read_bytes() for p in sorted((ROOT / "samples").glob("*.yaml"))}
    for i, text in enumerate(op_test_models()):
        out[f"op{i}.yaml"] = text.encode()
    for name, src in SOURCES.items():
        out[f"src_{name}.yaml"] = f"""name: s
inputs: {{x: {{dtype: f32, shape: [2, 3]}}}}
weights: {{w: {{dtype: f32, shape: [3, 2], {src}}}}}
nodes:
  - {{name: m, op: matmul, inputs: [x, w], outputs: [y]}}
  - {{name: r, op: relu, inputs: [y], outputs: [z]}}
  - {{name: s, op: softmax, inputs: [z], outputs: [p], axis: -1}}
outputs: [p]
""".encode()
    return out


def onnx_seeds():
    if not ONNX_DATA.is_dir():
        return {}
    return {f"{p.parent.name}.onnx": p.read_bytes()
            for p in sorted(ONNX_DATA.glob("*/*/model.onnx"))}


def onnx_dims_seeds():
    """Every ONNX model that test_dynamic.py compiles with --shape: the
    arguments on one line, the model after it (captured before it
    compiles)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_dynamic
    seeds = {}

    def keep(cmd):
        shapes = [cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a == "--shape"]
        f = compiled_file(cmd, ".onnx")
        if shapes and f:
            seeds[f"dyn{len(seeds)}"] = (" ".join(shapes) + "\n").encode() + f.read_bytes()
    captured_compiles([t for t in test_dynamic.TESTS if "onnx" in t[0].lower()], keep)
    return seeds


def safetensors_file(tensors):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    # The target declares weight "w" of dtype index b0 % 5 (f32 f16 i32 i64
    # u8) and rank b1 % 4, dimensions 1, 2, 3.
    out = {}
    for rank, shape in enumerate([[], [1], [1, 2], [1, 2, 3]]):
        n = 1
        for d in shape:
            n *= d
        out[f"f32_r{rank}"] = bytes([0, rank]) + safetensors_file(
            {"a": ("I32", [2], b"\0" * 8), "w": ("F32", shape, b"\1" * 4 * n)})
    out["u8_meta"] = bytes([4, 1]) + safetensors_file(
        {"__metadata__": ("U8", [0], b""), "w": ("U8", [1], b"\7")}).replace(
        b'"__metadata__": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}',
        b'"__metadata__": {"format": "pt", "nested": [1, {"a": "b\\\\"}]}')
    return out


def main():
    out_dir = Path(sys.argv[1])
    makers = {"yaml": yaml_seeds, "frontend": yaml_seeds, "onnx": onnx_seeds,
              "onnx_dims": onnx_dims_seeds, "safetensors": safetensors_seeds}
    for target in sys.argv[2:]:
        d = out_dir / target
        d.mkdir(parents=True, exist_ok=True)
        seeds = makers[target]()
        reg = ROOT / "tests" / "fuzz" / "regressions" / target
        if reg.is_dir():
            seeds.update({f"reg_{p.name}": p.read_bytes() for p in reg.iterdir()})
        for name, data in seeds.items():
            (d / f"seed_{name}").write_bytes(data)
        print(f"fuzz corpus {target}: {len(list(d.iterdir()))} inputs ({len(seeds)} seeds)")


if __name__ == "__main__":
    main()
