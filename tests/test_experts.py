"""test_experts.py: mixture of experts on Vulkan against the CPU reference.

grouped_matmul (each row of x times the matrix of the expert its index
names) over several shapes, index dtypes, with and without a bias, with
rows routed nowhere; and samples/moe.yaml, a top-k gated expert layer,
against tests/interpret.py.
"""
import numpy as np

import reference as ref
from harness import ROOT, assert_close, registry
from ops_common import one_op, rng, values

TESTS, case = registry()

GROUPED = [  # x shape, experts, N, index dtype, bias, rows routed nowhere
    ([1, 8], 3, 5, np.int32, False, False),
    ([37, 64], 4, 100, np.int64, True, True),
    ([2, 5, 16], 2, 33, np.int32, True, False),
    ([16, 96], 8, 64, np.int64, False, True),
    ([300, 256], 8, 192, np.int32, True, False),  # large
]


def grouped_case(i, shape, E, N, idt, bias, dropped):
    def test(workdir):
        r = rng(500 + i)
        K = shape[-1]
        x = values(r, shape, 1.0)
        w = values(r, [E, K, N], 0.2)
        idx = r.integers(0, E, shape[:-1]).astype(idt)
        if dropped:  # -1 and E: no expert, the row is zero
            flat = idx.reshape(-1)
            flat[::5] = -1
            flat[1::7] = E
            if idt == np.int64:  # past 2^32 too, not taken as its low bits
                flat[2::9] = 2 ** 32 + 1
        ins = [x, w, idx]
        if bias:
            ins.append(values(r, [E, N]))
        one_op(workdir, "grouped_matmul", ins, ref.grouped_matmul(*ins), rtol=1e-4,
               atol=1e-4)
    return test


for i, args in enumerate(GROUPED):
    shape, E, N, idt, bias, dropped = args
    case(f"op grouped_matmul x {shape} experts {E} N {N} {np.dtype(idt).name}"
         f"{' bias' if bias else ''}{' dropped rows' if dropped else ''}")(
        grouped_case(i, *args))


@case("model samples/moe.yaml (router, softmax, top-2, experts, gated sum) against "
      "the CPU reference")
def test_moe_sample(workdir):
    import interpret
    from harness import build_model, run_program
    path = ROOT / "samples" / "moe.yaml"
    x = np.random.default_rng(6).standard_normal([16, 64]).astype(np.float32)
    model, env = interpret.interpret_all(path, [x])
    want = env[model["outputs"][0]]
    # The routing must spread the rows: several experts, none taking all.
    used = np.unique(env["top_i"])
    if len(used) < 4:
        from harness import Failure
        raise Failure(f"the sample routes to experts {used.tolist()} only")
    prog = build_model(workdir, path.read_text(), guard=True)
    got, = run_program(prog, [x], [np.asarray(want, np.float32)])
    assert_close(got, want, 1e-4, 1e-5)
