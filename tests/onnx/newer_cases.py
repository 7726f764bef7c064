#!/usr/bin/env python3
"""newer_cases.py: writes onnx's own node test cases of the named ops into
tests/onnx/node-1.23/ (or --out), as onnx's backend-test generator defines
them (onnx.backend.test.case.node.collect_testcases). Runs where a newer
onnx is installed (the GPU machine: onnx 1.23.1); conformance.py runs the
cases beside Debian's 1.12 suite.

  newer_cases.py [--out DIR] OP...
  newer_cases.py --all --out DIR      (every case of every op)

(conformance.py -k node-1.23/ with KILN_ONNX_NEWER=DIR runs a directory of
them, written with every op named, in place of the repository's selection.)
"""
import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases


def write_case(case, out):
    d = Path(out) / case.name
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(case.model, str(d / "model.onnx"))
    ins = [i.name for i in case.model.graph.input]
    outs = [o.name for o in case.model.graph.output]
    for k, (inputs, outputs) in enumerate(case.data_sets):
        s = d / f"test_data_set_{k}"
        s.mkdir(exist_ok=True)
        for i, x in enumerate(inputs):
            t = numpy_helper.from_array(np.asarray(x), ins[i] if i < len(ins) else f"input_{i}")
            (s / f"input_{i}.pb").write_bytes(t.SerializeToString())
        for i, y in enumerate(outputs):
            t = numpy_helper.from_array(np.asarray(y),
                                        outs[i] if i < len(outs) else f"output_{i}")
            (s / f"output_{i}.pb").write_bytes(t.SerializeToString())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "node-1.23"))
    ap.add_argument("--all", action="store_true", help="every case, of every op")
    ap.add_argument("ops", nargs="*")
    a = ap.parse_args()
    wanted = set(a.ops)
    n = 0
    for case in collect_testcases(None):
        op = case.model.graph.node[0].op_type if case.model.graph.node else ""
        if (not a.all and op not in wanted) or case.name.endswith("_expanded"):
            continue
        try:
            write_case(case, a.out)
            n += 1
        except Exception as e:  # a sequence or optional value: not a tensor case
            print(f"{case.name}: skipped: {e}")
    print(f"{n} cases written to {a.out}")


if __name__ == "__main__":
    main()
