"""harness.py: compile a model with kiln, build it, run it on Vulkan, compare.

Every model runs through the real path a user takes: `kiln compile` writes
C, the C compiler builds it with build/run_model_test.o (samples/run_model.c)
and libkilnrt, and the program runs on the Vulkan device (lavapipe in CI)
with the Khronos validation layer on (KILN_VALIDATION=1): any validation
message makes the program exit 3, which fails the test.
"""
import contextlib
import json
import os
import re
import subprocess
import threading
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("KILN_BUILD", ROOT / "build"))  # build-san with SANITIZE=1
# Extra C flags for generated programs (the sanitizers with SANITIZE=1).
EXTRA_CFLAGS = os.environ.get("KILN_CFLAGS", "").split()
# make test SANITIZE=1 (run_tests.py runs a share of the suite then).
SANITIZING = any(f.startswith("-fsanitize") for f in EXTRA_CFLAGS)
KILN = BUILD / "kiln"
CC = os.environ.get("CC", "cc")
# How to link libvulkan (a machine with only libvulkan.so.1: -l:libvulkan.so.1).
VULKAN_LIB = os.environ.get("KILN_VULKAN_LIB", "-lvulkan")
# The Khronos validation layer is on unless KILN_TEST_VALIDATION=0.
VALIDATION = os.environ.get("KILN_TEST_VALIDATION", "1")
# Every `kiln compile` (and `kiln inspect`) the suite runs gets --sync-check (unless
# KILN_TEST_SYNC_CHECK=0): the kernels also bind their tensors as descriptors,
# so that the validation layer's synchronization validation, which cannot see
# device addresses, checks every barrier of every generated program.
SYNC_CHECK = os.environ.get("KILN_TEST_SYNC_CHECK", "1") != "0"

_thread = threading.local()  # the suite runs its cases on a pool of threads


@contextlib.contextmanager
def program_env(**env):
    """Extra environment for the model programs that run_program starts on
    this thread (a test's own), e.g. KILN_SUBGROUP="0"."""
    old = getattr(_thread, "env", {})
    _thread.env = {**old, **env}
    try:
        yield
    finally:
        _thread.env = old


def registry():
    """A test list and a decorator that appends (name, fn) to it."""
    tests = []

    def case(name):
        def register(fn):
            tests.append((name, fn))
            return fn
        return register
    return tests, case


class Failure(Exception):
    """A test's check did not hold; the message says which and by how much."""


class Skip(Exception):
    """The test does not apply to this build; the message says why."""


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def run(cmd, cwd=None, env=None, timeout=300):
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    cmd = [str(c) for c in cmd]
    if SYNC_CHECK and cmd[:2] in ([str(KILN), "compile"], [str(KILN), "inspect"]):
        cmd.insert(2, "--sync-check")
    return subprocess.run(cmd, cwd=cwd, env=full_env,
                          capture_output=True, text=True, errors="replace",
                          timeout=timeout)


def kiln(*args, cwd=None, env=None):
    # The compiler frees nothing by design: no leak report for it.
    return run([KILN, *args], cwd=cwd, env={"ASAN_OPTIONS": "detect_leaks=0", **(env or {})})


def model_yaml(name, inputs, nodes, outputs, weights=None):
    """A model as YAML text. JSON is YAML's flow style, so json.dumps writes
    it; hand-written block-style YAML is tested by the samples."""
    doc = {"name": name, "inputs": inputs}
    if weights:
        doc["weights"] = weights
    doc["nodes"] = nodes
    doc["outputs"] = outputs
    return json.dumps(doc, indent=1)


def build_model(workdir, yaml_text, extra_files=None, flags=(), guard=True, env=None):
    """Writes model.yaml (and extra files), compiles it (with extra kiln
    flags, and env added to the compiler's environment) and builds it;
    returns the program's path. With guard (the default), kiln --guard puts
    a band after every arena slot that each run checks: a kernel writing out
    of bounds fails the test."""
    workdir = Path(workdir)
    (workdir / "model.yaml").write_text(yaml_text)
    for name, data in (extra_files or {}).items():
        (workdir / name).write_bytes(data)
    r = kiln("compile", workdir / "model.yaml", "--name", "model",
             "-o", workdir / "model.c", *(("--guard",) if guard else ()), *flags, env=env)
    check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
    return link_model(workdir)


def link_model(workdir):
    """Builds workdir/model.c (compiled with --name model) into workdir/model
    with the run_model driver; returns the program's path."""
    prog = Path(workdir) / "model"
    r = run([CC, "-O1", "-std=c99", *EXTRA_CFLAGS, "-I", ROOT / "runtime", "-o", prog,
             Path(workdir) / "model.c", BUILD / "run_model_test.o",
             "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
    check(r.returncode == 0, f"building the generated C failed:\n{r.stderr}")
    return prog


def check_kernels(workdir, want):
    """That the dispatches of workdir/model.c (its schedule table, in the
    opening comment) run exactly the kernel families `want` (a set)."""
    c = (Path(workdir) / "model.c").read_text()
    got = set(re.findall(r"^ \*\s+\d+\s.*?\sk\d+ (\w+)\s", c, re.M))
    check(got == want, f"dispatch kernels {sorted(got)}, expected {sorted(want)}")


def kernel_defines(workdir):
    """The defines of each kernel in workdir/model.c (from the comment
    above its SPIR-V), as dicts of strings, in the file's order."""
    c = (Path(workdir) / "model.c").read_text()
    return [dict(re.findall(r"^ \*   (\w+) (\S+)$", block, re.M))
            for block in re.findall(r"/\* kernel .*?\*/", c, re.S)]


def check_defines(workdir, want):
    """That the first kernel of workdir/model.c has the defines `want`
    (a dict of strings; None: not defined), among others."""
    got = kernel_defines(workdir)[0]
    check(all(got.get(k) == v for k, v in want.items()),
          f"kernel defines {got}, expected {want}")


def run_program_raw(prog, inputs, outputs=1, validation=True):
    """Runs a built model on `inputs` (arrays, in the model's input order),
    its outputs to out0.bin ... in its directory; returns the finished
    process, unchecked (run_program checks it; a test of a run that must
    fail reads its status and message)."""
    workdir = Path(prog).parent
    args = [prog, "-q"]
    for i, a in enumerate(inputs):
        p = workdir / f"in{i}.bin"
        np.ascontiguousarray(a).tofile(p)
        args += ["-i", p]
    for i in range(outputs):
        args += ["-o", workdir / f"out{i}.bin"]
    # In the model's directory: a relative weights file name resolves there.
    return run(args, cwd=workdir, env={"KILN_VALIDATION": VALIDATION if validation else "0",
                                       **getattr(_thread, "env", {})})


def run_program(prog, inputs, expected, validation=True):
    """Runs a built model on `inputs` (arrays, in the model's input order)
    and returns its outputs read with the dtypes and shapes of `expected`."""
    workdir = Path(prog).parent
    r = run_program_raw(prog, inputs, len(expected), validation)
    check(r.returncode != 3, f"Vulkan validation messages:\n{r.stderr[-3000:]}")
    check(r.returncode == 0, f"the model program failed ({r.returncode}):\n{r.stderr}")
    outs = []
    for i, e in enumerate(expected):
        e = np.asarray(e)
        raw = np.fromfile(workdir / f"out{i}.bin", dtype=e.dtype if e.dtype != np.float64
                          else np.float32)
        check(raw.size == e.size, f"output {i} has {raw.size} elements, "
              f"expected {e.size} {list(e.shape)}")
        outs.append(raw.reshape(e.shape))
    return outs


def run_model(workdir, yaml_text, inputs, expected, extra_files=None):
    prog = build_model(workdir, yaml_text, extra_files)
    return run_program(prog, inputs, expected)


def run_steps(prog, steps, expected):
    """Runs a built model once per entry of `steps` (each a list of inputs,
    as run_program takes them) in one program (run_model --steps): what a
    run leaves for the next (the counters of a split product's last
    workgroups, its partial products) must not change the next one's
    outputs. Returns each step's outputs, read as `expected` (one step's
    arrays) gives them."""
    workdir = Path(prog).parent
    args = [prog, "-q", "--steps", str(len(steps))]
    for i in range(len(steps[0])):
        for s, ins in enumerate(steps):
            np.ascontiguousarray(ins[i]).tofile(workdir / f"in{i}_{s}.bin")
        args += ["-i", workdir / f"in{i}_%d.bin"]
    for i in range(len(expected)):
        args += ["-o", workdir / f"out{i}_%d.bin"]
    r = run(args, cwd=workdir, env={"KILN_VALIDATION": VALIDATION,
                                    **getattr(_thread, "env", {})})
    check(r.returncode != 3, f"Vulkan validation messages:\n{r.stderr[-3000:]}")
    check(r.returncode == 0, f"the model program failed ({r.returncode}):\n{r.stderr}")
    outs = []
    for s in range(len(steps)):
        step = []
        for i, e in enumerate(expected):
            e = np.asarray(e)
            raw = np.fromfile(workdir / f"out{i}_{s}.bin",
                              dtype=e.dtype if e.dtype != np.float64 else np.float32)
            check(raw.size == e.size, f"step {s}: output {i} has {raw.size} elements, "
                  f"expected {e.size}")
            step.append(raw.reshape(e.shape))
        outs.append(step)
    return outs


# The documented bound of kiln compile --precision f16 against the f32
# reference: max |error| <= F16_TOLERANCE * max |reference| (docs/cli.md).
F16_TOLERANCE = 1e-2


def assert_relative(got, want, tol, what):
    """max |got - want| <= tol * max |want| over every element."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    check(got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}")
    check(np.isfinite(got).all() == np.isfinite(want).all(), f"{what}: not finite")
    if got.size == 0:
        return
    scale = np.abs(want).max()
    err = np.abs(got - want)
    i = np.unravel_index(np.argmax(err), err.shape)
    check(err[i] <= tol * scale, f"{what}: max |error| {err[i]:.3g} at {list(i)} (got "
          f"{got[i]!r}, expected {want[i]!r}) is {err[i] / scale:.3g} of max |reference| "
          f"{scale:.3g}; the bound is {tol}")


def precision_compare(f16, rtol, atol):
    """run_built's compare for a build at --precision f16 (the documented
    F16_TOLERANCE of max |reference|) or f32 (assert_close at rtol, atol)."""
    def compare(got, want, what):
        if f16:
            assert_relative(got, want, F16_TOLERANCE, what)
        else:
            assert_close(got, want, rtol, atol, what)
    return compare


def assert_close(got, want, rtol, atol, what="output"):
    """Every element: |got - want| <= atol + rtol * |want| (NaN only where
    the reference has NaN)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    check(got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}")
    if got.size == 0:
        return
    nan_ok = np.isnan(got) == np.isnan(want)
    if not nan_ok.all():
        raise Failure(f"{what}: NaN mismatch at {np.argwhere(~nan_ok)[0].tolist()}")
    err = np.abs(np.nan_to_num(got) - np.nan_to_num(want))
    bound = atol + rtol * np.abs(np.nan_to_num(want))
    bad = err > bound
    if bad.any():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise Failure(f"{what}: {int(bad.sum())} of {err.size} elements off; worst at "
                      f"{list(i)}: got {got[i]!r}, expected {want[i]!r} "
                      f"(max abs error {err.max():.3g}, rtol {rtol}, atol {atol})")
