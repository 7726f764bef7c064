#!/usr/bin/env python3
"""measure_newer.py: the share of onnx's newer node cases that kiln passes,
among those whose inputs are tensors of dtypes kiln reads.

  KILN_ONNX_NEWER=DIR tests/onnx/conformance.py -k node-1.23/ -v > LOG
  tests/onnx/measure_newer.py LOG DIR

DIR is what `newer_cases.py --all --out DIR` wrote on a machine with the
newer onnx. A case counts when every graph input that is not an
initializer is a tensor of f32, f16, i32, i64, i8, u8 or bool and the case
has data; cases with bfloat16, double, 16-bit, unsigned 32/64-bit, float8,
int4, string, sequence or optional inputs are left out. Needs the onnx
Python package (any version that parses the files: Debian's python3-onnx).
"""
import collections
import re
import sys
from pathlib import Path

import onnx

READ = {1, 2, 3, 6, 7, 9, 10}  # float, uint8, int8, int32, int64, bool, float16


def main():
    log, root = sys.argv[1], Path(sys.argv[2])
    results = {}
    for line in open(log):
        m = re.match(r"(passed|failed|unsupported)\s+node-1.23/(\S+)\s*(.*)", line)
        if m:
            results[m.group(2)] = (m.group(1), m.group(3))
    counted, refused = collections.Counter(), []
    for name, (status, reason) in sorted(results.items()):
        d = root / name
        g = onnx.load(str(d / "model.onnx"), load_external_data=False).graph
        inits = {i.name for i in g.initializer}
        ins = [v for v in g.input if v.name not in inits]
        reads = (any(d.glob("test_data_set_*/output_*.pb")) and
                 all(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in READ
                     for v in ins))
        counted[(reads, status)] += 1
        if reads and status != "passed":
            refused.append(f"  {status} {name}: {reason[:110]}")
    n = sum(v for (r, _), v in counted.items() if r)
    ok = counted[(True, "passed")]
    print("\n".join(refused))
    print(f"{len(results)} cases; {n} with inputs of dtypes kiln reads: {ok} passed "
          f"({100.0 * ok / max(n, 1):.1f}%), {counted[(True, 'failed')]} failed, "
          f"{counted[(True, 'unsupported')]} unsupported; all cases: "
          f"{sum(v for (_, s), v in counted.items() if s == 'passed')} passed, "
          f"{sum(v for (_, s), v in counted.items() if s == 'failed')} failed")


if __name__ == "__main__":
    main()
