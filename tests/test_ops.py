"""test_ops.py: every op on Vulkan against the CPU reference, one file per
family (test_ops_<family>.py, mirroring shaders/), and the check that every
ops.def row has a test of its own. ops_common.py holds what they share.
"""
import re
from pathlib import Path

import test_ops_attention
import test_ops_conv
import test_ops_eltwise
import test_ops_index
import test_ops_layout
import test_ops_matmul
import test_ops_rows
import test_ops_select
from harness import check, registry

FAMILY_TESTS, case = registry()


@case("ops.def: every op has a test of its own (a test named 'op ... NAME ...')")
def _(workdir):
    from run_tests import all_tests  # the whole registry, every tier
    names = [n for n, _ in all_tests()]
    rows = re.findall(r'^OP\(\w+, "(\w+)"', (Path(__file__).resolve().parents[1] / "compiler" /
                                              "ops.def").read_text(), re.M)
    check(len(rows) > 100, f"read only {len(rows)} rows of ops.def")
    lacking = [op for op in rows
               if not any(n.startswith("op ") and re.search(r"[ ,]" + op + r"\b", n)
                          for n in names)]
    check(not lacking, f"ops with no test of their own: {' '.join(lacking)}")


TESTS = (test_ops_eltwise.TESTS + test_ops_matmul.TESTS + test_ops_rows.TESTS +
         test_ops_layout.TESTS + test_ops_index.TESTS + test_ops_attention.TESTS +
         test_ops_conv.TESTS + test_ops_select.TESTS + FAMILY_TESTS)
