"""test_python.py: the Python package (python/kiln) as a user meets it.

Each case runs a Python script in a process of its own (the package
imported from the tree, PYTHONPATH=python, finding this build through
KILN_BUILD; the Khronos validation layer on, and the script fails when the
process' device saw any message). Models are compiled with --guard and
--sync-check, as every test model is. The scripts save what they got as
.npy files; the test compares them here, every element, with onnxruntime's
stored outputs:

- every corpus model (tests/models/*/model.onnx) through InferenceSession,
  its stored inputs given as {name: array} by get_inputs()' names;
- every model of tests/models/dynamic/ at every stored size, one session;
- a bad model raises CompileError with kiln's located message; bad inputs
  and output names raise with the names; copy=False views; two sessions
  in one process; one session from two threads; the build cache;
- pip install ./python offline into a virtual environment, then the
  installed package used from outside the tree.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from harness import (BUILD, ROOT, SANITIZING, VALIDATION, Skip, assert_close, check, registry,
                     run)

TESTS, case = registry()
MODELS = ROOT / "tests" / "models"

PROLOGUE = """\
import json, sys, threading
import numpy as np
import kiln
OPTS = dict(guard=True, sync_check=True)


def finish():
    info = kiln.device_info()
    if info and info["validation_messages"]:
        sys.exit(f"{info['validation_messages']} Vulkan validation messages")
"""


def run_script(workdir, body, python=sys.executable, env=None):
    """Runs PROLOGUE + body in workdir; returns its stdout. A script that
    exits non-zero fails the test with its stderr. env adds to the script's
    environment (None: removes a variable)."""
    if SANITIZING:
        raise Skip("skipped: the sanitized runtime cannot load into python")
    wd = Path(workdir)
    (wd / "script.py").write_text(PROLOGUE + textwrap.dedent(body) + "\nfinish()\n")
    full = {**os.environ, "KILN_BUILD": str(BUILD), "KILN_VALIDATION": VALIDATION,
            "PYTHONPATH": str(ROOT / "python"), **(env or {})}
    full = {k: v for k, v in full.items() if v is not None}
    r = subprocess.run([str(python), str(wd / "script.py")], cwd=wd, env=full, timeout=600,
                       capture_output=True, text=True, errors="replace")
    check(r.returncode == 0, f"the script failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return r.stdout


def compare_saved(workdir, want, prefix, what):
    for i, w in enumerate(want):
        got = np.load(Path(workdir) / f"{prefix}{i}.npy")
        check(got.shape == w.shape, f"{what} output {i}: shape {got.shape}, onnxruntime's "
              f"{w.shape}")
        assert_close(got, w, 1e-3, 1e-4, f"{what} output {i}")


def corpus_case(d):
    def test(workdir):
        inputs = sorted(d.glob("input_*.npy"), key=lambda p: int(p.stem.split("_")[1]))
        want = [np.load(p) for p in sorted(d.glob("ort_*.npy"),
                                           key=lambda p: int(p.stem.split("_")[1]))]
        run_script(workdir, f"""
            s = kiln.InferenceSession({str(d / "model.onnx")!r}, cache_dir="cache", **OPTS)
            inputs = [np.load(p) for p in {[str(p) for p in inputs]!r}]
            outs = s.run(None, dict(zip([i.name for i in s.get_inputs()], inputs)))
            assert len(outs) == len(s.get_outputs()), (len(outs), s.get_outputs())
            for i, y in enumerate(outs):
                np.save(f"got{{i}}.npy", y)
            """)
        compare_saved(workdir, want, "got", d.name)
    return test


def dynamic_case(d):
    def test(workdir):
        meta = json.loads((d / "meta.json").read_text())
        shapes = {k: f"{lo}..{hi}" for k, (lo, hi) in meta["dims"].items()}
        runs = len(meta["runs"])
        run_script(workdir, f"""
            s = kiln.InferenceSession({str(d / "model.onnx")!r}, shapes={shapes!r},
                                      cache_dir="cache", **OPTS)
            names = [i.name for i in s.get_inputs()]
            assert all(isinstance(a, str) for i in s.get_inputs() for a in i.shape
                       if not isinstance(a, int)), s.get_inputs()
            for k in range({runs}):
                xs = [np.load(f"{d}/run{{k}}_input_{{i}}.npy") for i in range(len(names))]
                for i, y in enumerate(s.run(None, dict(zip(names, xs)))):
                    np.save(f"run{{k}}_got{{i}}.npy", y)
            """)
        for k, dims in enumerate(meta["runs"]):
            want = [np.load(p) for p in sorted(d.glob(f"run{k}_ort_*.npy"))]
            compare_saved(workdir, want, f"run{k}_got", f"{d.name} at {dims}")
    return test


for _d in sorted(p.parent for p in MODELS.glob("*/model.onnx")):
    case(f"python: {_d.name} through InferenceSession against onnxruntime")(corpus_case(_d))
for _d in sorted(p.parent for p in (MODELS / "dynamic").glob("*/model.onnx")):
    case(f"python: dynamic {_d.name} at every stored size, one session")(dynamic_case(_d))

DENSENET = MODELS / "densenet_tiny_dynamo18"


@case("python: errors raise with kiln's located message and the names")
def test_errors(workdir):
    (Path(workdir) / "bad.yaml").write_text(
        "name: bad\ninputs:\n  x: {dtype: f32, shape: [2, 3]}\nnodes:\n"
        "  - {name: n, op: matmul, inputs: [x, x], outputs: [y]}\noutputs: [y]\n")
    out = run_script(workdir, f"""
        def raised(fn, kind):
            try:
                fn()
            except kind as e:
                return str(e)
            raise AssertionError(f"no {{kind.__name__}}")
        print(json.dumps({{
            "compile": raised(lambda: kiln.InferenceSession("bad.yaml", cache_dir="c"),
                              kiln.CompileError),
            "missing_file": raised(lambda: kiln.InferenceSession("nope.onnx"), FileNotFoundError),
            "option": raised(lambda: kiln.InferenceSession("bad.yaml", precision="f8",
                                                           cache_dir="c"), kiln.CompileError),
        }}))
        s = kiln.InferenceSession({str(DENSENET / "model.onnx")!r}, cache_dir="c",
                                  providers=["CUDAExecutionProvider"], sess_options=None,
                                  **OPTS)  # onnxruntime's arguments: ignored
        x = np.load({str(DENSENET / "input_0.npy")!r})
        print(json.dumps({{
            "dtype": raised(lambda: s.run(None, {{"x0": x.astype(np.float64)}}), TypeError),
            "shape": raised(lambda: s.run(None, {{"x0": x[:, :2]}}), ValueError),
            "name": raised(lambda: s.run(None, {{"x": x}}), ValueError),
            "output": raised(lambda: s.run(["y"], {{"x0": x}}), ValueError),
        }}))
        s.close()
        print(json.dumps({{"closed": raised(lambda: s.run(None, {{"x0": x}}), kiln.KilnError)}}))
        """)
    got = {}
    for line in out.splitlines():
        got.update(json.loads(line))
    wants = {"compile": ["bad.yaml:5:5: error: node 'n': matmul of [2, 3]", "differ"],
             "missing_file": ["no model file nope.onnx"],
             "option": ["--precision", "f8"],
             "dtype": ["'x0'", "float64", "float32"],
             "shape": ["'x0'", "[1, 2, 32, 32]", "[1, 3, 32, 32]"],
             "name": ["no input named 'x'", "missing 'x0'"],
             "output": ["no output named 'y'", "linear"],
             "closed": ["closed"]}
    for k, words in wants.items():
        check(all(w in got[k] for w in words), f"{k}: {got[k]!r} lacks one of {words}")


@case("python: copy=False views, two sessions in one process, one session from two threads")
def test_sessions(workdir):
    resnet = MODELS / "resnet_tiny_dynamo20"
    run_script(workdir, f"""
        a = kiln.InferenceSession({str(DENSENET / "model.onnx")!r}, cache_dir="c", **OPTS)
        b = kiln.InferenceSession({str(resnet / "model.onnx")!r}, cache_dir="c", **OPTS)
        xa = np.load({str(DENSENET / "input_0.npy")!r})
        xb = np.load({str(resnet / "input_0.npy")!r})
        na, nb = a.get_inputs()[0].name, b.get_inputs()[0].name
        ya, = a.run(None, {{na: xa}})
        yb, = b.run(None, {{nb: xb}})
        ya2, = a.run(None, {{na: xa}})  # interleaved with b: still its own
        assert np.array_equal(ya, ya2)
        np.save("a0.npy", ya)
        np.save("b0.npy", yb)
        # copy=False: a read-only view of the staging memory, the next run's
        v, = a.run(None, {{na: xa}}, copy=False)
        assert not v.flags.writeable and np.array_equal(v, ya)
        a.run(None, {{na: xa * 0.5}})
        assert not np.array_equal(v, ya), "the view kept the old output"
        # one session, two threads, each its own inputs
        rng = np.random.default_rng(3)
        feeds = [rng.standard_normal(xa.shape).astype(np.float32) for _ in range(2)]
        alone = [a.run(None, {{na: f}})[0] for f in feeds]
        bad = []
        def worker(k):
            for _ in range(10):
                y, = a.run(None, {{na: feeds[k]}})
                if not np.array_equal(y, alone[k]):
                    bad.append(k)
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert not bad, f"threads got other runs' outputs: {{bad}}"
        a.close()
        b.close()
        """)
    compare_saved(workdir, [np.load(DENSENET / "ort_0.npy")], "a", "densenet")
    compare_saved(workdir, [np.load(resnet / "ort_0.npy")], "b", "resnet")


@case("python: the build cache, f16 inputs, compile() and inspect()")
def test_cache_compile_inspect(workdir):
    out = run_script(workdir, f"""
        import os
        m = {str(DENSENET / "model.onnx")!r}
        s = kiln.InferenceSession(m, cache_dir="c", **OPTS)
        so = [p for p in os.listdir("c") if not p.startswith(".")]
        t = os.stat(f"c/{{so[0]}}/model.so").st_mtime_ns
        s2 = kiln.InferenceSession(m, cache_dir="c", **OPTS)
        assert os.stat(f"c/{{so[0]}}/model.so").st_mtime_ns == t, "rebuilt"
        s3 = kiln.InferenceSession(m, cache_dir="c", precision="f16", io="f16", **OPTS)
        assert len(os.listdir("c")) == 2, os.listdir("c")
        assert s3.get_inputs()[0].type == "tensor(float16)", s3.get_inputs()
        x = np.load({str(DENSENET / "input_0.npy")!r})
        y16, = s3.run(None, {{"x0": x.astype(np.float16)}})
        np.save("f16_0.npy", y16.astype(np.float32))
        files = kiln.compile(m, "out", name="net", weights_file="out/w.bin")
        assert [files[k].name for k in ("c", "h", "weights")] == ["model.c", "model.h", "w.bin"]
        assert all(files[k].exists() for k in files) and "net_create" in files["h"].read_text()
        info = kiln.inspect(m)
        print(json.dumps({{"dispatches": len(info["dispatches"]), "keys": sorted(info)}}))
        """)
    got = json.loads(out.splitlines()[-1])
    check(got["dispatches"] > 10, f"inspect: {got}")
    y16 = np.load(Path(workdir) / "f16_0.npy")
    want = np.load(DENSENET / "ort_0.npy")
    err = np.abs(y16 - want).max() / np.abs(want).max()
    check(err < 0.02, f"f16 session: max |error| / max |reference| = {err:.4f}")


@case("python: pip install ./python offline, then used from outside the tree")
def test_pip_install(workdir):
    """Installed from a tree (a copy of python/ beside links to this tree's
    runtime/ and build: pip builds in place and would leave its files in
    python/), the package finds kiln through the tree it was installed from,
    with no variable set."""
    wd = Path(workdir)
    if subprocess.run([sys.executable, "-c", "import venv, ensurepip"],
                      capture_output=True).returncode:
        raise Skip("skipped: no python3-venv (make test-deps installs it)")
    venv, tree = wd / "venv", wd / "tree"
    r = run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    check(r.returncode == 0, f"python3 -m venv failed:\n{r.stderr}")
    shutil.copytree(ROOT / "python", tree / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    (tree / "runtime").symlink_to(ROOT / "runtime")
    (tree / "build").symlink_to(BUILD)
    r = run([venv / "bin" / "pip", "install", "--no-index", "--no-cache-dir", tree / "python"],
            env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    check(r.returncode == 0, f"pip install failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    run_script(workdir, f"""
        assert "site-packages" in kiln.__file__, kiln.__file__
        s = kiln.InferenceSession({str(DENSENET / "model.onnx")!r}, cache_dir="c", **OPTS)
        y, = s.run(None, {{"x0": np.load({str(DENSENET / "input_0.npy")!r})}})
        np.save("pip0.npy", y)
        """, python=venv / "bin" / "python",
        env={"PYTHONPATH": None, "KILN_BUILD": None, "KILN_HOME": None})
    compare_saved(workdir, [np.load(DENSENET / "ort_0.npy")], "pip", "installed package")


@case("python: a kiln that is not where a variable says is a clear error")
def test_not_found(workdir):
    out = run_script(workdir, f"""
        for var in ("KILN_BUILD", "KILN_HOME"):
            try:
                kiln.InferenceSession({str(DENSENET / "model.onnx")!r}, cache_dir="c")
            except kiln.KilnError as e:
                print(e)
            import os
            os.environ.pop("KILN_BUILD", None)
            os.environ["KILN_HOME"] = "/nonexistent/prefix"
        """, env={"KILN_BUILD": "/nonexistent/build"})
    for want in ("KILN_BUILD=/nonexistent/build: no /nonexistent/build/kiln",
                 "KILN_HOME=/nonexistent/prefix: no /nonexistent/prefix/bin/kiln"):
        check(want in out, f"message: {out!r} lacks {want!r}")
