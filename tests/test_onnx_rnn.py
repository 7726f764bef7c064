"""test_onnx_rnn.py: ONNX RNN, GRU and LSTM against a numpy reference.

The reference below is written from the ONNX operator descriptions (gate
orders, biases, peepholes, clip, linear_before_reset, input_forget, the
activations with their alpha and beta, sequence_lens: a finished sequence
keeps its state and outputs zeros, the reverse direction starts at each
sequence's own last step), not from kiln's code. Cases: every cell in all
three directions, both layouts, initial states, constant and run-time
sequence lengths, a 20-step sequence (more parts than one concat binds),
non-default activations; and the refusals.
"""
import struct

import numpy as np

from harness import registry
from test_onnx import attr, expect_refused, field, initializer, model, node, run_onnx, value_info

TESTS, case = registry()

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def act_fn(name, alpha=None, beta=None):
    f = {"Tanh": np.tanh, "Sigmoid": sigmoid, "Relu": lambda x: np.maximum(x, 0),
         "Softsign": lambda x: x / (1 + np.abs(x)), "Softplus": lambda x: np.log1p(np.exp(x))}
    if name in f:
        return f[name]
    if name == "LeakyRelu":
        a = 0.01 if alpha is None else alpha
        return lambda x: np.where(x >= 0, x, a * x)
    if name == "HardSigmoid":
        a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
        return lambda x: np.clip(a * x + b, 0, 1)
    if name == "ScaledTanh":
        return lambda x: alpha * np.tanh(beta * x)
    if name == "Affine":
        return lambda x: alpha * x + beta
    if name == "Elu":
        a = 1.0 if alpha is None else alpha
        return lambda x: np.where(x >= 0, x, a * (np.exp(x) - 1))
    raise KeyError(name)


def rnn_ref(op, x, w, r, b, lens, h0, c0, p, hidden, direction, clip=0.0, lbr=0,
            input_forget=0, acts=None, alphas=(), betas=()):
    """ONNX's recurrent ops (layout 0) in float64: Y [seq, dirs, batch, H],
    Y_h and Y_c [dirs, batch, H]."""
    seq, batch, _ = x.shape
    dirs = 2 if direction == "bidirectional" else 1
    n = len(DEFAULT_ACTS[op])
    names = acts or DEFAULT_ACTS[op] * dirs
    if len(names) == n:
        names = names * dirs
    fns, ai, bi = [], 0, 0
    for k, name in enumerate(names):
        takes = {"LeakyRelu": 1, "ThresholdedRelu": 1, "Elu": 1, "HardSigmoid": 2,
                 "ScaledTanh": 2, "Affine": 2}.get(name, 0)
        a = alphas[ai] if takes >= 1 and ai < len(alphas) else None
        bb = betas[bi] if takes >= 2 and bi < len(betas) else None
        ai += takes >= 1 and ai < len(alphas)
        bi += takes >= 2 and bi < len(betas)
        fns.append(act_fn(name, a, bb))
    lens = np.full(batch, seq) if lens is None else lens
    H = hidden
    y = np.zeros([seq, dirs, batch, H])
    yh, yc = np.zeros([dirs, batch, H]), np.zeros([dirs, batch, H])

    def clipped(v):
        return np.clip(v, -clip, clip) if clip else v
    for d in range(dirs):
        f = fns[d * n:(d + 1) * n]
        wd, rd = w[d].astype(np.float64), r[d].astype(np.float64)
        g = GATES[op]
        wb = b[d, :g * H] if b is not None else np.zeros(g * H)
        rb = b[d, g * H:] if b is not None else np.zeros(g * H)
        pd = p[d] if p is not None else np.zeros(3 * H)
        back = direction == "reverse" or d == 1
        for bt in range(batch):
            h = h0[d, bt].astype(np.float64) if h0 is not None else np.zeros(H)
            cs = c0[d, bt].astype(np.float64) if c0 is not None else np.zeros(H)
            steps = range(lens[bt] - 1, -1, -1) if back else range(lens[bt])
            for t in steps:
                xt = x[t, bt].astype(np.float64)
                if op == "RNN":
                    h = f[0](clipped(xt @ wd.T + h @ rd.T + wb + rb))
                elif op == "GRU":
                    gx = xt @ wd.T + wb
                    z = f[0](clipped(gx[:H] + h @ rd[:H].T + rb[:H]))
                    rr = f[0](clipped(gx[H:2 * H] + h @ rd[H:2 * H].T + rb[H:2 * H]))
                    if lbr:
                        hh = f[1](clipped(gx[2 * H:] + rr * (h @ rd[2 * H:].T + rb[2 * H:])))
                    else:
                        hh = f[1](clipped(gx[2 * H:] + (rr * h) @ rd[2 * H:].T + rb[2 * H:]))
                    h = (1 - z) * hh + z * h
                else:
                    gg = xt @ wd.T + h @ rd.T + wb + rb
                    i = f[0](clipped(gg[:H] + pd[:H] * cs))
                    fg = 1 - i if input_forget else f[0](clipped(gg[2 * H:3 * H] +
                                                                pd[2 * H:] * cs))
                    cs = fg * cs + i * f[1](clipped(gg[3 * H:]))
                    o = f[0](clipped(gg[H:2 * H] + pd[H:2 * H] * cs))
                    h = o * f[2](cs)
                y[t, d, bt] = h
            yh[d, bt], yc[d, bt] = h, cs
    return y, yh, yc


def strings_attr(name, values):
    return field(5, field(1, name) + b"".join(field(9, v) for v in values) + field(20, 8))


def floats_attr(name, values):
    """A list of floats (AttributeProto field 7, packed)."""
    return field(5, field(1, name) + field(7, struct.pack(f"<{len(values)}f", *values)) +
                 field(20, 6))


def rnn_case(op, direction, seq=4, batch=3, inp=5, hidden=4, layout=0, bias=True,
             init=False, lens=None, lens_input=False, peep=False, clip=0.0, lbr=0,
             input_forget=0, acts=None, alphas=(), betas=(), outs=("Y", "Y_h", "Y_c")):
    def test(workdir):
        rng = np.random.default_rng(seq * 7 + hidden + len(direction) + GATES[op])
        dirs = 2 if direction == "bidirectional" else 1
        g = GATES[op]
        x = rng.standard_normal([seq, batch, inp]).astype(np.float32)
        w = (rng.standard_normal([dirs, g * hidden, inp]) * 0.5).astype(np.float32)
        r = (rng.standard_normal([dirs, g * hidden, hidden]) * 0.5).astype(np.float32)
        b = (rng.standard_normal([dirs, 2 * g * hidden]) * 0.3).astype(np.float32) \
            if bias else None
        h0 = rng.standard_normal([dirs, batch, hidden]).astype(np.float32) if init else None
        c0 = rng.standard_normal([dirs, batch, hidden]).astype(np.float32) \
            if init and op == "LSTM" else None
        p = (rng.standard_normal([dirs, 3 * hidden]) * 0.5).astype(np.float32) if peep else None
        sl = np.array(lens, np.int32) if lens is not None else None
        y, yh, yc = rnn_ref(op, x, w, r, b, sl, h0, c0, p, hidden, direction, clip, lbr,
                            input_forget, acts, alphas, betas)
        names = ["x", "w", "r", "b" if bias else "", "sl" if lens is not None else "",
                 "h0" if init else "", "c0" if c0 is not None else "", "p" if peep else ""]
        while names and not names[-1]:
            names.pop()
        feeds = {"x": x, "w": w, "r": r, "b": b, "sl": sl, "h0": h0, "c0": c0, "p": p}
        consts = {"w", "r", "b", "p"} | (set() if lens_input else {"sl"})
        attrs = attr("hidden_size", hidden) + \
            (field(5, field(1, "direction") + field(4, direction) + field(20, 3))
             if direction != "forward" else b"")
        attrs += attr("layout", layout) if layout else b""
        attrs += attr("clip", clip) if clip else b""
        attrs += attr("linear_before_reset", lbr) if lbr else b""
        attrs += attr("input_forget", input_forget) if input_forget else b""
        attrs += strings_attr("activations", acts) if acts else b""
        attrs += floats_attr("activation_alpha", alphas) if alphas else b""
        attrs += floats_attr("activation_beta", betas) if betas else b""
        want = {"Y": y, "Y_h": yh, "Y_c": yc}
        if layout:
            x = x.transpose(1, 0, 2)
            feeds["x"] = x
            for k in ("h0", "c0"):
                if feeds[k] is not None:
                    feeds[k] = feeds[k].transpose(1, 0, 2)
            want = {"Y": y.transpose(2, 0, 1, 3), "Y_h": yh.transpose(1, 0, 2),
                    "Y_c": yc.transpose(1, 0, 2)}
        outs_used = [o for o in outs if o != "Y_c" or op == "LSTM"]
        out_names = [o if o in outs_used else "" for o in ("Y", "Y_h", "Y_c")[:3 if op == "LSTM"
                                                                               else 2]]
        while out_names and not out_names[-1]:
            out_names.pop()
        inputs, inits, run_feeds = [], [], []
        for n in names:
            if not n:
                continue
            if n in consts:
                inits.append(initializer(n, feeds[n]))
            else:
                inputs.append(value_info(n, list(feeds[n].shape), 6 if n == "sl" else 1))
                run_feeds.append(feeds[n])
        data = model([node(op, names, out_names, "rnn", attrs)], inputs,
                     [value_info(o, list(want[o].shape)) for o in out_names if o], inits,
                     opset=14 if layout else 13)
        outs_final = [o for o in out_names if o]
        run_onnx(workdir, data, run_feeds, [want[o] for o in outs_final], outs_final,
                 tol=(1e-4, 1e-5))
    return test


CASES = []
for _op in ("RNN", "GRU", "LSTM"):
    for _dir in ("forward", "reverse", "bidirectional"):
        CASES.append((_op, _dir, dict(init=_dir != "forward")))
    CASES.append((_op, "bidirectional", dict(lens=[4, 2, 3])))
    CASES.append((_op, "bidirectional", dict(lens=[3, 4, 1], lens_input=True, layout=1,
                                             init=True)))
    CASES.append((_op, "forward", dict(seq=20, batch=2, bias=False)))
CASES += [
    ("GRU", "bidirectional", dict(lbr=1, init=True)),
    ("GRU", "forward", dict(lbr=1, lens=[1, 4, 2], clip=0.8)),
    ("LSTM", "bidirectional", dict(peep=True, init=True, lens=[4, 3, 2])),
    ("LSTM", "forward", dict(input_forget=1, clip=1.5, outs=("Y_h", "Y_c"))),
    ("LSTM", "reverse", dict(acts=["HardSigmoid", "LeakyRelu", "ScaledTanh"],
                             alphas=[0.3, 0.2, 1.5], betas=[0.4, 0.7])),
    ("GRU", "bidirectional", dict(acts=["Sigmoid", "Softsign", "HardSigmoid", "Affine"],
                                  alphas=[0.25, 0.9], betas=[0.55, 0.1])),
    ("RNN", "forward", dict(acts=["Relu"], outs=("Y",))),
]
for _op, _dir, _kw in CASES:
    case(f"onnx {_op} {_dir} {_kw} matches the numpy reference")(rnn_case(_op, _dir, **_kw))


@case("onnx recurrent ops: an unknown activation, a wrong weight shape, a direction ONNX "
      "does not define and non-f32 inputs are refused by name")
def _(workdir):
    w = initializer("w", np.zeros([1, 4, 3], np.float32))
    r = initializer("r", np.zeros([1, 4, 4], np.float32))
    x = [value_info("x", [2, 1, 3])]
    y = [value_info("y", [1, 1, 4])]

    def rnn(attrs=attr("hidden_size", 4), inits=(w, r)):
        return model([node("RNN", ["x", "w", "r"], ["", "y"], "rnn", attrs)], x, y, list(inits))
    expect_refused(workdir, rnn(attr("hidden_size", 4) + strings_attr("activations", ["Gelu"])),
                   ["node 'rnn (RNN)'", "unsupported: activation 'Gelu'"])
    expect_refused(workdir, rnn(inits=(initializer("w", np.zeros([1, 4, 2], np.float32)), r)),
                   ["node 'rnn (RNN)'", "W has shape [1, 4, 2], expected [1, 4, 3]"])
    expect_refused(workdir, rnn(attr("hidden_size", 4) + field(5, field(1, "direction") +
                                                              field(4, "sideways") + field(20, 3))),
                   ["node 'rnn (RNN)'", "direction 'sideways'"])
    expect_refused(workdir, rnn(inits=(initializer("w", np.zeros([1, 4, 3], np.float16)), r)),
                   ["node 'rnn (RNN)'", "W of dtype f16"])
