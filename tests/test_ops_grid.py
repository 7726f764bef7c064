"""test_ops_grid.py: bench/ops.py's op sweep, small, on lavapipe: every
cell of the sweep's grid (ops.cells(small=True): the same ops, attributes
and kernel paths at shapes that run in seconds), f32 and f16 (--precision
f16 --io f16, as the sweep compiles them), each output element against the
cell's numpy reference (tests/reference.py, float64, over the inputs as
kiln sees them): max |error| within 1e-4 of max |reference| in f32, 1e-2 in
f16 (the sweep's precision bound), indices exactly in f32. A kernel path
that the sweep leads to (a chunked long row, a radix top-k, flash.comp's
narrow blocks) is covered here by the cell that takes it.
"""
import sys
from pathlib import Path

import numpy as np

from harness import assert_relative, build_model, check, registry, run_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ops  # noqa: E402  (bench/ops.py: its grid, cells(small=True))

TESTS, case = registry()


def grid_case(k, cell, f16):
    def test(workdir):
        wd = Path(workdir)
        prog = build_model(wd, ops.yaml_of(cell, wd, k),
                           flags=("--precision", "f16", "--io", "f16") if f16 else ())
        seen = [a.astype(np.float16) if f16 and a.dtype == np.float32 else a
                for _, a, _ in cell.inputs]
        want = cell.ref([a.astype(np.float64) if a.dtype.kind == "f" else a for a in seen])
        want = [np.asarray(w) for w in (want if isinstance(want, list) else [want])]
        like = [w.astype(np.int64) if w.dtype.kind in "iu" else
                np.zeros(w.shape, np.float16 if f16 else np.float32) for w in want]
        got = run_program(prog, ops.arrays_of(cell, f16), like)
        for j, (g, w) in enumerate(zip(got, want)):
            if w.dtype.kind in "iu":
                bad = int((g != w).sum())
                check(f16 or bad == 0, f"output {j}: {bad} of {w.size} indices differ")
                continue
            assert_relative(g, w, 1e-2 if f16 else 1e-4, f"output {j}")
    return test


for _k, _cell in enumerate(ops.cells(small=True)):
    for _f16 in (False, True):
        case(f"op sweep, small: {_cell.label} {'f16' if _f16 else 'f32'}")(
            grid_case(_k, _cell, _f16))
