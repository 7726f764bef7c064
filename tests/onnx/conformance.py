#!/usr/bin/env python3
"""conformance.py: the ONNX backend test data as kiln's yardstick.

Runs every case of Debian's libonnx-testdata (data/node, pytorch-converted,
pytorch-operator, simple) and of tests/onnx/node-1.23 (newer ops): kiln compiles model.onnx (retrying with
`--const NAME=input_N.pb` when kiln reports that an input must be a
constant, since kiln's shapes are static), the generated C is built and run
on Vulkan with each test_data_set_*'s inputs; each output's dtype and shape
(as the generated header declares them) must be output_N.pb's, and every
output element is compared with it: f32 within rtol 1e-3 and atol 1e-4, f16 within
2e-3 and 1e-3, integers and bools exactly, NaN where NaN is expected.

  conformance.py --report      run all cases; write tests/onnx/REPORT.md and
                               tests/onnx/passing.txt
  conformance.py --check       run the cases listed in passing.txt; exit 1 if
                               one no longer passes
  conformance.py -k WORD       only cases whose name contains WORD
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("KILN_BUILD", ROOT / "build"))
EXTRA_CFLAGS = os.environ.get("KILN_CFLAGS", "").split()
NO_LEAKS = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")  # kiln never frees
KILN = BUILD / "kiln"
DATA = Path(os.environ.get("KILN_ONNX_DATA", "/usr/share/libonnx-testdata/data"))
SUITES = ["node", "pytorch-converted", "pytorch-operator", "simple"]
# Node cases of the ops and versions newer than Debian's 1.12 data, which
# kiln carries itself (tests/onnx/node-1.23/): written by onnx 1.23.1's own
# generator (onnx.backend.test.case.node.collect_testcases; newer_cases.py
# writes them) for Attention, RMSNormalization, RotaryEmbedding,
# GroupNormalization, Gelu, Mish, Swish, GridSample, AffineGrid, RoiAlign,
# the Bitwise ops, NonMaxSuppression and MaxUnpool; the expanded forms of
# Attention, which only repeat its function body, left out.
OWN_SUITES = ["node-1.23"]
# KILN_ONNX_NEWER=DIR reads the node-1.23 suite from DIR instead: every case
# newer_cases.py writes (all of onnx 1.23.1's tensor cases, for a measure
# beyond the ones the repository carries; not with --report).
NEWER = Path(os.environ.get("KILN_ONNX_NEWER", HERE / "node-1.23"))


def case_dir(case):
    if case.split("/")[0] in OWN_SUITES:
        return NEWER / case.split("/", 1)[1] if "/" in case else NEWER
    return DATA / case
CC = os.environ.get("CC", "cc")
VULKAN_LIB = os.environ.get("KILN_VULKAN_LIB", "-lvulkan")
NP = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64,
      "bool": np.bool_, "u8": np.uint8, "i8": np.int8}


def onnx_op_names():
    header = Path("/usr/include/onnx/defs/operator_sets.h")  # from libonnx-dev
    if not header.exists():
        return []
    text = header.read_text()
    return sorted(set(re.findall(r"ONNX_OPERATOR_SET_SCHEMA_CLASS_NAME\(Onnx, \d+, (\w+)\)", text)),
                  key=len, reverse=True)


OPS = onnx_op_names()


def op_of(case):
    """The op a case tests, from its name (test_reduce_sum_... -> ReduceSum)."""
    name = case.split("/")[-1].removeprefix("test_").replace("_", "").lower()
    for op in OPS:
        if name.startswith(op.lower()):
            return op
    return "(model)" if not case.startswith("node/") else "(other)"


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 600), **kw)


def tensor(pb, out):
    """Converts a TensorProto; returns (dtype, shape, name) or raises."""
    r = run([KILN, "tensor", pb, out], env=NO_LEAKS)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[0] if r.stderr else "kiln tensor failed")
    m = re.match(r"(\w+) \[([\d, ]*)\] ?(.*)", r.stdout.strip())
    shape = [int(x) for x in m[2].split(",") if x.strip()]
    return m[1], shape, m[3]


def compare(got, want, dt):
    """None when equal within tolerance, else a description."""
    if got.size != want.size:
        return f"size {got.size}, expected {want.size}"
    if dt in ("f32", "f16"):
        g, w = got.astype(np.float64), want.astype(np.float64)
        if (np.isnan(g) != np.isnan(w)).any():
            return "NaN mismatch"
        rtol, atol = (1e-3, 1e-4) if dt == "f32" else (2e-3, 1e-3)
        g, w = np.nan_to_num(g, posinf=1e300, neginf=-1e300), np.nan_to_num(w, posinf=1e300,
                                                                              neginf=-1e300)
        err = np.abs(g - w)
        bad = err > atol + rtol * np.abs(w)
        if bad.any():
            return f"max abs error {err.max():.3g} ({int(bad.sum())} of {w.size} elements)"
        return None
    bad = got != want
    return f"{int(bad.sum())} of {want.size} elements differ" if bad.any() else None


def declared_outputs(header):
    """[(dtype, shape)] of the outputs a generated header lists, in order, and
    {output: the output holding its count of valid rows} for those whose
    rows are decided at run time (NonMaxSuppression's)."""
    text = Path(header).read_text()
    part = text[text.index(" * Outputs:"):text.index("*/")]
    outs, counts = [], {}
    for line in part.splitlines():
        m = re.search(r"\[\d+\] \S+: (\w+) \[([^\]]*)\]", line)
        if m:
            outs.append((m[1], [int(d) for d in m[2].split(",") if d.strip()]))
        m = re.search(r"rows decided at run time: output \[(\d+)\]", line)
        if m:
            counts[len(outs) - 1] = int(m[1])
    return outs, counts


def run_case(case, keep=False):
    """Returns (status, detail): status is passed, failed or unsupported."""
    d = case_dir(case)
    wd = Path(tempfile.mkdtemp(prefix="kiln-onnx-"))
    try:
        sets = sorted(p for p in d.glob("test_data_set_*") if p.is_dir())
        inputs0 = sorted(sets[0].glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1])) \
            if sets else []
        names = {}
        for i, pb in enumerate(inputs0):
            try:
                names[tensor(pb, wd / f"probe{i}.bin")[2]] = i
            except RuntimeError as e:
                return "unsupported", f"input {i}: {e}"
        consts = {}
        for _ in range(8):
            # --guard: every run also checks that no kernel wrote outside
            # its tensors (guard bands between arena slots); --sync-check:
            # synchronization validation sees what each kernel touches.
            args = [KILN, "compile", d / "model.onnx", "--name", "model", "--guard",
                    "--sync-check", "-o", wd / "model.c"]
            for name, i in consts.items():
                args += ["--const", f"{name}={inputs0[i]}"]
            r = run(args, env=NO_LEAKS)
            if r.returncode == 0:
                break
            msg = (r.stderr.strip().splitlines() or ["?"])[0]
            m = re.search(r"must be a constant", msg)
            # the value itself, or the graph inputs it is computed from
            src = re.search(r"computed from graph inputs? (.*?) \(--const", msg)
            want = re.findall(r"'([^']+)'", src[1]) if src else \
                re.findall(r"input \d+, '([^']+)'", msg)[:1]
            want = [w for w in want if w in names and w not in consts]
            if m and want:
                for w in want:
                    consts[w] = names[w]
                continue
            if "unsupported" in msg:
                detail = msg.split("unsupported: ", 1)[-1]
                if "op type" in detail:  # the op types follow, one a line
                    detail += " " + "; ".join(ln.strip() for ln in r.stderr.splitlines()[1:])
                return "unsupported", detail[:300]
            return "failed", "compile: " + msg[:300]
        else:
            return "failed", "compile: too many constant inputs"
        prog = wd / "model"
        r = run([CC, "-O1", "-std=c99", *EXTRA_CFLAGS, "-I", ROOT / "runtime", "-o", prog,
                 wd / "model.c",
                 BUILD / "run_model_test.o", "-L", BUILD, "-lkilnrt", VULKAN_LIB, "-lm"])
        if r.returncode != 0:
            return "failed", "cc: " + r.stderr[:300]
        declared, row_counts = declared_outputs(wd / "model.h")
        const_idx = set(consts.values())
        for s in sets:
            ins = sorted(s.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
            outs = sorted(s.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
            args = [prog, "-q"]
            for i, pb in enumerate(ins):
                if i in const_idx:
                    continue
                tensor(pb, wd / f"in{i}.bin")
                args += ["-i", wd / f"in{i}.bin"]
            expected = []
            for i, pb in enumerate(outs):
                try:
                    dt, shape, _ = tensor(pb, wd / f"want{i}.bin")
                except RuntimeError as e:
                    return "unsupported", f"output {i}: {e}"
                expected.append((dt, shape))
                args += ["-o", wd / f"got{i}.bin"]
            for i in range(len(outs), len(declared)):  # outputs kiln adds (counts)
                args += ["-o", wd / f"got{i}.bin"]
            r = run(args, env=dict(os.environ, KILN_VALIDATION=os.environ.get(
                "KILN_TEST_VALIDATION", "1")))
            if r.returncode != 0:
                return "failed", f"run ({r.returncode}): " + (r.stderr.strip()[:300])
            for i, (dt, shape) in enumerate(expected):
                got = np.fromfile(wd / f"got{i}.bin", dtype=NP[dt])
                if i in row_counts and i < len(declared) and shape and \
                        declared[i][1][1:] == shape[1:]:
                    # rows decided at run time: the count's leading rows, -1 after
                    n = int(np.fromfile(wd / f"got{row_counts[i]}.bin", dtype=np.int64)[0])
                    row = int(np.prod(shape[1:]))
                    if n != shape[0] or (got[n * row:] != -1).any():
                        return "failed", (f"{s.name} output {i}: {n} rows counted, "
                                          f"{shape[0]} expected, or rows after them not -1")
                    got = got[:n * row]
                elif i >= len(declared) or declared[i] != (dt, shape):
                    return "failed", (f"{s.name} output {i}: kiln gives "
                                      f"{declared[i] if i < len(declared) else 'none'}, "
                                      f"expected {(dt, shape)}")
                want = np.fromfile(wd / f"want{i}.bin", dtype=NP[dt])
                why = compare(got, want, dt)
                if why:
                    return "failed", f"{s.name} output {i}: {why}"
        return "passed", ""
    except subprocess.TimeoutExpired:
        return "failed", "timed out"
    finally:
        if not keep:
            shutil.rmtree(wd, ignore_errors=True)


def all_cases():
    out = []
    for suite in SUITES + OWN_SUITES:
        base = case_dir(suite)
        if base.is_dir():
            out += [f"{suite}/{p.name}" for p in sorted(base.iterdir())
                    if (p / "model.onnx").exists()]
    return out


def run_cases(cases, jobs, verbose=False):
    results = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for case, res in zip(cases, pool.map(run_case, cases)):
            results[case] = res
            if verbose:
                print(f"{res[0]:11s} {case} {res[1]}", flush=True)
    return results


def write_report(results, seconds):
    lines = ["# ONNX conformance", "",
             "Generated by `make onnx-report` (tests/onnx/conformance.py --report) from",
             "Debian's libonnx-testdata 1.12 and the newer cases in tests/onnx/node-1.23",
             "(onnx 1.23.1). Do not edit.", "",
             f"Run on lavapipe in {seconds:.0f} s.", "",
             "| suite | cases | passed | failed | unsupported |", "| --- | --- | --- | --- | --- |"]
    for suite in SUITES + OWN_SUITES:
        rs = [r for c, r in results.items() if c.startswith(suite + "/")]
        if rs:
            lines.append(f"| {suite} | {len(rs)} | {sum(r[0] == 'passed' for r in rs)} | "
                         f"{sum(r[0] == 'failed' for r in rs)} | "
                         f"{sum(r[0] == 'unsupported' for r in rs)} |")
    tot = list(results.values())
    lines.append(f"| all | {len(tot)} | {sum(r[0] == 'passed' for r in tot)} | "
                 f"{sum(r[0] == 'failed' for r in tot)} | "
                 f"{sum(r[0] == 'unsupported' for r in tot)} |")
    lines += ["", "## By op", "", "| op | passed | failed | unsupported |",
              "| --- | --- | --- | --- |"]
    by_op = {}
    for c, r in results.items():
        by_op.setdefault(op_of(c), [0, 0, 0])[["passed", "failed", "unsupported"].index(r[0])] += 1
    for op in sorted(by_op):
        p, f, u = by_op[op]
        lines.append(f"| {op} | {p} | {f} | {u} |")
    lines += ["", "## Failing cases", ""]
    lines += [f"- `{c}`: {r[1]}" for c, r in sorted(results.items()) if r[0] == "failed"] or ["None."]
    lines += ["", "## Unsupported cases", ""]
    lines += [f"- `{c}`: {r[1]}" for c, r in sorted(results.items()) if r[0] == "unsupported"]
    (HERE / "REPORT.md").write_text("\n".join(lines) + "\n")
    passing = sorted(c for c, r in results.items() if r[0] == "passed")
    (HERE / "passing.txt").write_text("\n".join(passing) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("-k", default="")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args()
    if (args.report or args.check) and "KILN_ONNX_NEWER" in os.environ:
        ap.error("KILN_ONNX_NEWER is for measuring, not --report or --check")
    t0 = time.monotonic()
    if args.check:
        cases = [c for c in (HERE / "passing.txt").read_text().split() if args.k in c]
    else:
        cases = [c for c in all_cases() if args.k in c]
    results = run_cases(cases, args.j, args.v)
    secs = time.monotonic() - t0
    if args.report:
        write_report(results, secs)
    failed = [c for c, r in results.items() if r[0] != "passed"]
    for c in failed if args.check else []:
        print(f"FAIL {c}: {results[c][1]}")
    n = {s: sum(r[0] == s for r in results.values()) for s in ("passed", "failed", "unsupported")}
    print(f"onnx conformance: {n['passed']} passed, {n['failed']} failed, "
          f"{n['unsupported']} unsupported of {len(results)} in {secs:.0f}s")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
