"""kiln from Python: compile a model with kiln and run it on Vulkan.

    import kiln
    s = kiln.InferenceSession("model.onnx")          # compiled once, cached
    y, = s.run(None, {"x": x})                        # numpy in, numpy out

InferenceSession has onnxruntime's shape (get_inputs, get_outputs, run);
compile() writes the C a program links, inspect() returns the schedule.
Pure Python over the kiln CLI and libkilnrt (ctypes); needs numpy and a C
compiler. docs/python.md has the whole story.
"""
import json
from pathlib import Path

from . import _build
from ._errors import CompileError, KilnError
from .session import InferenceSession, NodeArg, device_info

__all__ = ["InferenceSession", "NodeArg", "KilnError", "CompileError", "compile", "inspect",
           "device_info"]
__version__ = "0.4.0"


def compile(path, out_dir, name=None, precision="f32", shapes=None, **options):
    """kiln compile PATH into OUT_DIR (made if missing): returns {"c", "h",
    "weights"}, the generated files' paths ("weights" None when the weights
    are in the C). name is the C prefix (default: the model's name); the other
    options are kiln compile's, as for InferenceSession (weights_file= and
    embed_weights=True allowed here). A refused model raises CompileError
    with kiln's located message."""
    path, out_dir = Path(path), Path(out_dir)
    if not path.is_file():
        raise FileNotFoundError(f"kiln: no model file {path}")
    weights_file = options.pop("weights_file", None)
    embed = options.pop("embed_weights", False)
    args = _build.cli_options(precision, shapes, options)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_c = (out_dir / path.name).with_suffix(".c").resolve()
    if embed:
        args.append("--embed-weights")
    if weights_file is not None:
        weights_file = Path(weights_file).resolve()
    weights = _build.compile_model(_build.find_toolchain(), path, out_c, args, weights_file,
                                   name)
    return {"c": out_c, "h": out_c.with_suffix(".h"), "weights": weights}


def inspect(path, precision="f32", shapes=None, **options):
    """kiln inspect PATH --format json with kiln compile's options: the
    schedule (dispatches, kernels, barriers, arena, products' kernels and
    why) as Python objects."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"kiln: no model file {path}")
    args = _build.cli_options(precision, shapes, options)
    r = _build.run_kiln(_build.find_toolchain(), ["inspect", path, "--format", "json", *args])
    return json.loads(r.stdout)
