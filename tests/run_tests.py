#!/usr/bin/env python3
"""run_tests.py: every kiln test, ending with "N passed, N failed".

Tiers: the C unit tests of the compiler passes (build/test_units), the op
tests (test_ops_<family>.py, gathered by test_ops.py), the command-line error tests (test_cli.py), the
whole-model, runtime and generated-code tests (test_models.py), and the ONNX
loader and conformance cases (test_onnx.py: every case listed in
tests/onnx/passing.txt must still pass; test_onnx_quant.py, test_onnx_rnn.py and
test_onnx_more.py: quantization, recurrent and other decomposed ops). Tests run in parallel, one
temporary directory each, sharing a kernel cache that starts empty. Exit status 1 on any failure.

  tests/run_tests.py [-k SUBSTRING] [-j JOBS] [-v]

Run by hand, it first makes what the tests run (make test-build: the
compiler, the runtime, the test program's object, the unit tests; in
build/, or build-san/ with KILN_BUILD pointing there, or the directory
KILN_BUILD names). -k selects the tests (unit tests too: "unit NAME") whose
name contains SUBSTRING. A running count is printed every 30 s; the last line is always
"N passed, N failed" (", N skipped" when some were).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cli  # noqa: E402
import test_inspect  # noqa: E402
import test_onnx  # noqa: E402
import test_onnx_quant  # noqa: E402
import test_onnx_rnn  # noqa: E402
import test_onnx_more  # noqa: E402
import test_models  # noqa: E402
import test_ops  # noqa: E402
import test_ops_grid  # noqa: E402
import test_quant  # noqa: E402
import test_dynamic  # noqa: E402
import test_experts  # noqa: E402
import test_signal  # noqa: E402
import test_backward  # noqa: E402
import test_limits  # noqa: E402
import test_corpus  # noqa: E402
import test_llm  # noqa: E402
import test_rewrite  # noqa: E402
import test_readme  # noqa: E402
import test_golden  # noqa: E402
import test_python  # noqa: E402
from harness import BUILD, SANITIZING, Failure, Skip  # noqa: E402

SKIPPED = "skipped: "  # a `why` that starts so is a skip, not a failure


def make_test_build():
    """make test-build for BUILD, unless make itself is running us."""
    if "MAKELEVEL" in os.environ:
        return True
    root = Path(__file__).resolve().parents[1]
    if BUILD.resolve() == (root / "build-san").resolve():
        how = ["SANITIZE=1"]
    elif BUILD.resolve() == (root / "build").resolve():
        how = []
    else:
        how = [f"B={os.path.relpath(BUILD.resolve(), root)}"]
    cmd = ["make", "-s", "-C", str(root), *how, "test-build"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}", file=sys.stderr)
    return r.returncode == 0


def unit_tests():
    """build/test_units prints "ok NAME" or "FAIL NAME: why" per test."""
    if not (BUILD / "test_units").exists():
        return [("unit test_units", f"{BUILD / 'test_units'} is not built: run make test "
                 f"(or make {BUILD / 'test_units'})")]
    r = subprocess.run([str(BUILD / "test_units")], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    results = []
    for line in r.stdout.splitlines():
        if line.startswith("ok "):
            results.append((f"unit {line[3:]}", None))
        elif line.startswith("FAIL "):
            results.append((f"unit {line[5:].split(':')[0]}", line[5:]))
    if r.returncode != 0 and not any(why for _, why in results):
        results.append(("unit test_units", f"exit {r.returncode}\n{r.stderr}"))
    return results


def run_one(name, fn, keep):
    workdir = tempfile.mkdtemp(prefix="kiln-test-")
    t0 = time.monotonic()
    try:
        fn(workdir)
        why = None
    except Skip as e:
        why = SKIPPED + str(e)
    except Failure as e:
        # never empty: a check whose message is empty (check(ok, r.stderr)
        # of a command that printed nothing) still fails
        why = str(e) or f"a check failed with no message:\n{traceback.format_exc()}"
    except Exception:  # a bug in the test or an unexpected crash: a failure
        why = traceback.format_exc()
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return name, why, time.monotonic() - t0


# The tiers, in the order they run.
TIERS = (test_ops, test_ops_grid, test_quant, test_dynamic, test_experts, test_signal, test_backward,
         test_limits, test_corpus, test_llm, test_rewrite, test_readme, test_golden, test_cli,
         test_models, test_inspect, test_python, test_onnx, test_onnx_quant, test_onnx_rnn,
         test_onnx_more)


def all_tests():
    """Every (name, function) of the Python tiers, in the order they run."""
    return [t for tier in TIERS for t in tier.TESTS]


# Under the sanitizers (make test SANITIZE=1) a test takes 3 to 4 times as
# long (ASan's allocator under lavapipe and the validation layer, the
# instrumented builds of every generated program): the whole list would be
# about 50 minutes on CI's two cores, on top of the plain run's 19. Without
# -k, that run takes a share of each tier, one test in N chosen by a hash of
# its name (so the sample stays put as tests come and go): every test of the
# tiers that drive the most host code per second (the unit tests, the
# command-line errors, the runtime and whole-model tests with fault
# injection, the limits), fewer of the wide op, ONNX-conformance and corpus
# lists, whose host paths the plain run and the fuzz targets also cover.
# KILN_SANITIZE_ALL=1 runs them all; -k selects among all of them.
SANITIZE_SHARE = {
    test_ops: 10, test_ops_grid: 10, test_quant: 6, test_dynamic: 3, test_experts: 2, test_signal: 4,
    test_backward: 4, test_limits: 1, test_corpus: 10, test_llm: 6, test_rewrite: 6,
    test_readme: 0, test_golden: 0, test_cli: 1, test_models: 1, test_inspect: 2,
    test_python: 0,
    test_onnx_quant: 4, test_onnx_rnn: 4, test_onnx_more: 4,
    # the conformance cases one in 16, the loader's own tests one in 3
    test_onnx: lambda name: 16 if test_onnx.is_conformance(name) else 3,
}


def sanitizer_sample():
    """The tests a sanitizer run takes without -k (SANITIZE_SHARE)."""
    out = []
    for tier in TIERS:
        share = SANITIZE_SHARE[tier]
        for name, fn in tier.TESTS:
            n = share(name) if callable(share) else share
            if n and zlib.crc32(name.encode()) % n == 0:
                out.append((name, fn))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="run tests whose name contains this")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("-v", action="store_true", help="print every test")
    ap.add_argument("--keep", action="store_true", help="keep temporary directories")
    args = ap.parse_args()

    if not make_test_build():
        print("0 passed, 1 failed")
        return 1
    if SANITIZING and not args.k and os.environ.get("KILN_SANITIZE_ALL") != "1":
        tests = sanitizer_sample()
        print(f"under the sanitizers: {len(tests)} of {len(all_tests())} tests "
              "(a share of each tier; KILN_SANITIZE_ALL=1 runs all)")
    else:
        tests = [(n, f) for n, f in all_tests() if args.k in n]
    # One kernel cache for this run only, starting empty: the first compile
    # of each kernel goes through shaderc, later ones through the cache; the
    # user's own cache is neither read nor filled.
    cache = tempfile.mkdtemp(prefix="kiln-cache-")
    os.environ["KILN_CACHE_DIR"] = cache
    t0 = time.monotonic()
    results = [(n, why) for n, why in unit_tests() if args.k in n]
    for name, why in results:
        if why or args.v:
            print(f"{'FAIL' if why else 'ok  '} {name}" + (f"\n    {why}" if why else ""))
    total = len(results) + len(tests)
    print(f"running {total} tests on {max(1, args.j)} threads", flush=True)
    last_report = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
        futures = [pool.submit(run_one, n, f, args.keep) for n, f in tests]
        for fut in futures:
            name, why, secs = fut.result()
            results.append((name, why))
            # A running count at most every 30 s (and on the last test), so
            # that a long run is never silent.
            now = time.monotonic()
            if not args.v and (now - last_report >= 30 or len(results) == total):
                failed = sum(1 for _, w in results if w and not w.startswith(SKIPPED))
                print(f"  [{len(results)}/{total}] {now - t0:.0f} s, {failed} failed",
                      flush=True)
                last_report = now
            if why and why.startswith(SKIPPED):
                if args.v:
                    print(f"skip {name}: {why[len(SKIPPED):]}", flush=True)
            elif why:
                print(f"FAIL {name}\n    " + why.replace("\n", "\n    "), flush=True)
            elif args.v:
                print(f"ok   {name} ({secs:.1f}s)", flush=True)
    shutil.rmtree(cache, ignore_errors=True)
    skipped = sum(1 for _, why in results if why and why.startswith(SKIPPED))
    failed = sum(1 for _, why in results if why) - skipped
    print(f"tests took {time.monotonic() - t0:.0f}s")
    print(f"{len(results) - failed - skipped} passed, {failed} failed"
          + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
