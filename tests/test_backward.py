"""test_backward.py: the backward ops on Vulkan.

Each op's gradients are compared, every element, with analytic float64
gradients (tests/reference.py), and on the small shapes those are first
checked against central finite differences of the forward reference
(reference.numeric_grad), so the yardstick itself is tested. Then the
training-step sample (samples/train.yaml): steps of SGD on the GPU, its
weights held as state, against the same step in numpy and its gradients
against finite differences of the loss.
"""
import numpy as np

import reference as ref
from harness import Failure, assert_close, check, model_yaml, registry, run_model
from ops_common import one_op, rng, spec, values

TESTS, case = registry()


def numeric_check(f, xs, dy, analytic, what):
    """The analytic reference agrees with finite differences (small shapes)."""
    for i, (num, ana) in enumerate(zip(ref.numeric_grad(f, xs, dy), analytic)):
        err = np.max(np.abs(num - ana)) if num.size else 0
        if err > 1e-6 * max(1.0, float(np.max(np.abs(num)))):
            raise Failure(f"{what}: the reference's gradient {i} is off finite differences "
                          f"by {err:.3g}")


def multi_op(workdir, op, inputs, wants, attrs, outs, rtol, atol, names="abcdef"):
    """One node with several outputs; every output compared."""
    ins = {names[i]: spec(x) for i, x in enumerate(inputs)}
    node = {"name": "n", "op": op, "inputs": list(ins), "outputs": outs}
    node.update(attrs)
    y = model_yaml(op, ins, [node], outs)
    gots = run_model(workdir, y, list(inputs), [np.asarray(w, np.float32) for w in wants])
    for name, got, want in zip(outs, gots, wants):
        assert_close(got, want, rtol, atol, name)


NORM_GRADS = [  # op, shape, axis, gamma, outputs, small
    ("layer_norm_grad", [3, 7], -1, True, 3, True),
    ("layer_norm_grad", [2, 3, 5], 1, True, 3, True),
    ("layer_norm_grad", [4, 6], -1, False, 1, True),
    ("rms_norm_grad", [3, 8], -1, True, 2, True),
    ("rms_norm_grad", [2, 2, 9], -1, False, 2, True),
    ("layer_norm_grad", [300, 1000], -1, True, 3, False),  # large
    ("rms_norm_grad", [1000, 300], -1, True, 2, False),
]


def norm_grad_case(i, op, shape, axis, gamma, nout, small):
    def test(workdir):
        r = rng(900 + i)
        rms = op == "rms_norm_grad"
        x = values(r, shape, 2.0) + 0.5
        dy = values(r, shape, 1.0)
        pshape = shape[axis % len(shape):]
        g = values(r, pshape, 1.0) if gamma else None
        want = ref.norm_grad(dy, x, g, axis, 1e-5, rms)
        if small:
            xs = [x] + ([g] if gamma else [])
            fwd = (lambda xx, gg=None: ref.norm(xx, axis, gg, None, 1e-5, rms))
            numeric_check(fwd, xs, dy, [want[0]] + ([want[1]] if gamma else []), op)
        ins = [dy, x] + ([g] if gamma else [])
        outs = ["dx", "dgamma", "dbeta"][:nout]
        multi_op(workdir, op, ins, want[:nout], {"axis": axis}, outs, 1e-4, 1e-4)
    return test


for i, args in enumerate(NORM_GRADS):
    op, shape, axis, gamma, nout, _ = args
    case(f"op {op} {shape} axis {axis}{' gamma' if gamma else ''} {nout} outputs")(
        norm_grad_case(i, *args))

CUMSUM_GRADS = [([10], -1, 0, 0), ([4, 700], 1, 1, 0), ([5, 6, 7], 0, 0, 1),
                ([3, 4], -1, 1, 1)]


def cumsum_grad_case(i, shape, axis, exclusive, reverse):
    def test(workdir):
        r = rng(920 + i)
        dy = values(r, shape, 1.0)
        want = ref.cumsum_grad(dy, axis, exclusive, reverse)
        if np.prod(shape) <= 64:
            x = values(r, shape, 1.0)
            numeric_check(lambda xx: ref.cumsum(xx, axis, exclusive, reverse), [x], dy,
                          [want], "cumsum")
        one_op(workdir, "cumsum_grad", [dy], want,
               {"axis": axis, "exclusive": exclusive, "reverse": reverse}, 1e-5, 1e-4)
    return test


for i, args in enumerate(CUMSUM_GRADS):
    case(f"op cumsum_grad {args[0]} axis {args[1]} exclusive {args[2]} reverse {args[3]}")(
        cumsum_grad_case(i, *args))

GATHER_GRADS = [  # data shape, index shape, axis, index dtype
    ([10, 4], [6], 0, np.int32),
    ([3, 9, 5], [2, 4], 1, np.int64),      # repeated and negative indices
    ([50, 16], [3, 40], 0, np.int32),      # an embedding's gradient
    ([1000, 64], [512], 0, np.int64),      # large, many repeats
]


def gather_grad_case(i, dshape, ishape, axis, idt):
    def test(workdir):
        r = rng(940 + i)
        size = dshape[axis]
        idx = r.integers(-size, size, ishape).astype(idt)
        dyshape = dshape[:axis] + ishape + dshape[axis + 1:]
        dy = values(r, dyshape, 1.0)
        want = ref.gather_grad(dy, idx, axis, size)
        if np.prod(dshape) <= 64:
            x = values(r, dshape, 1.0)
            numeric_check(lambda xx: np.take(xx, np.where(idx < 0, idx + size, idx), axis),
                          [x], dy, [want], "gather")
        one_op(workdir, "gather_grad", [dy, idx], want, {"axis": axis, "size": size},
               1e-5, 1e-5)
    return test


for i, args in enumerate(GATHER_GRADS):
    case(f"op gather_grad data {args[0]} indices {args[1]} axis {args[2]}")(
        gather_grad_case(i, *args))

ATTN_GRADS = [  # layout, q shape, k shape, v shape, heads, kv_heads, causal, small
    ("bhsd", [1, 2, 3, 4], [1, 2, 5, 4], [1, 2, 5, 3], None, None, 0, True),
    ("bhsd", [2, 4, 6, 8], [2, 2, 6, 8], [2, 2, 6, 8], None, None, 1, False),  # grouped
    ("bshd", [1, 4, 6], [1, 4, 6], [1, 4, 6], 2, 2, 1, True),
    ("bshd", [2, 16, 64], [2, 16, 32], [2, 16, 32], 4, 2, 0, False),
    ("bhsd", [1, 2, 4, 8], [1, 2, 9, 8], [1, 2, 9, 8], None, None, 1, False),  # Sq < Sk
]


def attention_grad_case(i, layout, qs, ks, vs, heads, kvh, causal, small):
    def test(workdir):
        r = rng(960 + i)
        q, k, v = values(r, qs, 1.0), values(r, ks, 1.0), values(r, vs, 1.0)
        o = ref.attention(q, k, v, None, layout, heads, kvh, None, 0, causal)
        dy = values(r, o.shape, 1.0)
        want = ref.attention_grad(q, k, v, dy, layout, heads, kvh, None, causal)
        if small:
            numeric_check(lambda a, b, c: ref.attention(a, b, c, None, layout, heads, kvh,
                                                        None, 0, causal),
                          [q, k, v], dy, want, "attention")
        attrs = {"layout": layout, "causal": causal}
        if heads:
            attrs.update(heads=heads, kv_heads=kvh)
        multi_op(workdir, "attention_grad", [q, k, v, dy], want, attrs, ["dq", "dk", "dv"],
                 1e-4, 1e-4)
    return test


for i, args in enumerate(ATTN_GRADS):
    case(f"op attention_grad {args[0]} q {args[1]} k {args[2]} causal {args[6]}")(
        attention_grad_case(i, *args))

ROPE_GRADS = [  # x shape, interleaved, n_rot, seq_axis
    ([1, 2, 4, 8], 0, None, -2),
    ([2, 5, 3, 6], 1, 4, 1),
    ([3, 16, 64], 0, 32, -2),
]


def rope_grad_case(i, shape, inter, n_rot, seq_axis):
    def test(workdir):
        r = rng(980 + i)
        R = n_rot or shape[-1]
        S = shape[seq_axis]
        ang = r.uniform(-3, 3, [S, R // 2])
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        dy = values(r, shape, 1.0)
        want = ref.rope_grad(dy, cos, sin, inter, n_rot, seq_axis)
        if np.prod(shape) <= 64:
            x = values(r, shape, 1.0)
            numeric_check(lambda xx: ref.rope(xx, cos, sin, inter, n_rot, seq_axis), [x], dy,
                          [want], "rope")
        attrs = {"interleaved": inter, "seq_axis": seq_axis}
        if n_rot:
            attrs["n_rot"] = n_rot
        one_op(workdir, "rope_grad", [dy, cos, sin], want, attrs, 1e-5, 1e-5)
    return test


for i, args in enumerate(ROPE_GRADS):
    case(f"op rope_grad {args[0]} interleaved {args[1]} n_rot {args[2]}")(
        rope_grad_case(i, *args))


# ---- the training-step sample ----

def train_data():
    r = np.random.default_rng(12)
    x = r.standard_normal([32, 16]).astype(np.float32)
    t = (np.sin(1.5 * x[:, :4]) + 0.5 * x[:, 4:8]).astype(np.float32)  # learnable
    return x, t


def run_train(workdir, prog, x, t, steps, tag):
    """Runs the program for `steps` steps on (x, t); returns the losses and
    the states after the last step."""
    from pathlib import Path
    from harness import VALIDATION, run
    wd = Path(workdir)
    sd = wd / f"states_{tag}"
    sd.mkdir()
    for s in range(steps):
        x.tofile(wd / f"x_{s}.bin")
        t.tofile(wd / f"t_{s}.bin")
    r = run([prog, "-q", "--steps", str(steps), "-i", wd / "x_%d.bin", "-i", wd / "t_%d.bin",
             "-o", wd / f"loss_{tag}_%d.bin", "--states", sd], cwd=wd,
            env={"KILN_VALIDATION": VALIDATION})
    check(r.returncode != 3, f"Vulkan validation messages:\n{r.stderr[-3000:]}")
    check(r.returncode == 0, f"the training program failed ({r.returncode}):\n{r.stderr}")
    losses = [float(np.fromfile(wd / f"loss_{tag}_{s}.bin", np.float32)[0])
              for s in range(steps)]
    states = [np.fromfile(sd / f"state{i}.bin", np.float32) for i in range(6)]
    return losses, states


@case("sample samples/train.yaml: SGD steps on the GPU (weights as state) match numpy "
      "step by step; the first step's gradients match finite differences of the loss; "
      "the loss falls")
def test_train_sample(workdir):
    import interpret
    from harness import ROOT, build_model
    path = ROOT / "samples" / "train.yaml"
    model, _ = interpret._load(path)
    names = list(model["state"])
    shapes = {n: tuple(model["state"][n]["shape"]) for n in names}
    lr = 0.1
    x, t = train_data()
    prog = build_model(workdir, path.read_text())
    steps = 8
    losses, states = run_train(workdir, prog, x, t, steps, "many")
    _, first = run_train(workdir, prog, x, t, 1, "one")

    # numpy: the same steps through the interpreter (float64).
    st = {n: np.zeros(shapes[n]) for n in names}
    want_losses, grads0 = [], None
    for s in range(steps):
        _, env = interpret.interpret_all(path, [x, t], st)
        want_losses.append(float(np.asarray(env["loss"]).reshape(-1)[0]))
        new = {n: env[model["state"][n]["update"]] for n in names}
        if s == 0:
            grads0 = {n: (st[n] - new[n]) / lr for n in names}
        st = new
    assert_close(np.array(losses), np.array(want_losses), 2e-4, 1e-6, "losses")
    for i, n in enumerate(names):
        assert_close(states[i].reshape(shapes[n]), st[n], 1e-3, 2e-5, f"state {n}")
    check(losses[-1] < 0.7 * losses[0], f"the loss did not fall: {losses}")

    # Finite differences of the float64 loss at the initial parameters, for
    # every bias and norm parameter and 40 elements of each matrix.
    def loss_at(st_):
        _, env = interpret.interpret_all(path, [x, t], st_)
        return float(np.asarray(env["loss"]).reshape(-1)[0])
    r = np.random.default_rng(3)
    h = 1e-6
    for i, n in enumerate(names):
        size = int(np.prod(shapes[n]))
        picks = range(size) if size <= 32 else r.choice(size, 40, replace=False)
        gpu = (-first[i] / lr).reshape(-1)  # the GPU's first gradient
        for e in picks:
            base = {k: np.zeros(shapes[k]) for k in names}
            base[n].reshape(-1)[e] = h
            up = loss_at(base)
            base[n].reshape(-1)[e] = -h
            num = (up - loss_at(base)) / (2 * h)
            ana = grads0[n].reshape(-1)[e]
            check(abs(ana - num) <= 1e-6 + 1e-5 * abs(num),
                  f"{n}[{e}]: numpy's gradient {ana} vs finite differences {num}")
            check(abs(gpu[e] - num) <= 2e-5 + 2e-3 * abs(num),
                  f"{n}[{e}]: the GPU's gradient {gpu[e]} vs finite differences {num}")
