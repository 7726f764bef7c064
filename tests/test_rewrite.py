"""test_rewrite.py: the ops exporters write out in pieces (compiler/rewrite.c).

Each graph is rms_norm, rope, attention, the tanh GELU or SiLU decomposed the way
torch.onnx.export writes them (test_llm.py runs the exported decoders
themselves); each is compiled with the rewrites and with --no-fuse=patterns
and run on Vulkan against numpy, every element, and `kiln compile -v` must
say what it recognised. The near misses (a reduction over another axis, a
rope table whose halves differ, a mask without the NaN guard) must be left
as they are and still compute the same values.
"""
import re
from pathlib import Path

import numpy as np

from harness import build_model, check, kiln, model_yaml, registry, run_program
from ops_common import rng, spec, values, weight_specs

TESTS, case = registry()


def recognised(workdir, flags=()):
    """kiln compile -v's counts: {'rms_norm': n, 'rope': n, 'attention': n,
    'gelu_tanh': n, 'silu': n}."""
    workdir = Path(workdir)
    r = kiln("compile", workdir / "model.yaml", "--name", "model", "-o",
             workdir / "check.c", "-v", *flags)
    check(r.returncode == 0, f"kiln compile failed:\n{r.stderr}")
    m = re.search(r"recognised (\d+) rms_norm, (\d+) rope, (\d+) attention, (\d+) gelu_tanh, "
                  r"(\d+) silu", r.stderr)
    n = [int(g) for g in m.groups()] if m else [0] * len(PATTERNS)
    return dict(zip(PATTERNS, n))


PATTERNS = ["rms_norm", "rope", "attention", "gelu_tanh", "silu"]


def both_ways(workdir, yaml_text, inputs, want, found, rtol=1e-4, atol=1e-5):
    """Compiled as is (the rewrites must find `found`) and with
    --no-fuse=patterns (nothing found); both within tolerance of want."""
    for flags, expect in [((), found), (("--no-fuse=patterns",), {})]:
        prog = build_model(workdir, yaml_text, flags=flags)
        got = recognised(workdir, flags)
        for k in PATTERNS:
            check(got[k] == expect.get(k, 0), f"{flags or 'default'}: recognised {got}, "
                  f"expected {expect or 'none'}")
        out, = run_program(prog, inputs, [want])
        err = np.abs(out.astype(np.float64) - want)
        bound = atol + rtol * np.abs(want)
        check(np.all(np.isfinite(out) == np.isfinite(want)) and np.all(err <= bound),
              f"{flags or 'default'}: max error {np.nanmax(err):.3g}")


def node(name, op, inputs, **attrs):
    return {"name": name, "op": op, "inputs": inputs, **attrs}


# ---- rms_norm ----

def rms_graph(form, axis=-1):
    """gamma * (x * reciprocal(sqrt(mean(x^2) + eps))), in one of the forms
    exporters write."""
    nodes = [node("sq", "pow", ["x", "two"]),
             node("ms", "reduce_mean", ["sq"], axes=[axis], keep_dims=1),
             node("var", "add", ["ms", "eps"])]
    if form == "reciprocal":
        nodes += [node("rt", "sqrt", ["var"]), node("inv", "reciprocal", ["rt"]),
                  node("nx", "mul", ["x", "inv"])]
    elif form == "rsqrt":
        nodes += [node("inv", "rsqrt", ["var"]), node("nx", "mul", ["inv", "x"])]
    else:
        nodes += [node("rt", "sqrt", ["var"]), node("nx", "div", ["x", "rt"])]
    nodes.append(node("y", "mul", ["gamma", "nx"]))
    return nodes


def rms_case(form, axis):
    def test(workdir):
        r = rng(4100)
        x = values(r, [3, 4, 16])
        gamma = values(r, [16], 1.0)
        eps = 1e-5
        w = weight_specs(gamma=gamma, two=np.float32(2.0), eps=np.float32(eps))
        y = model_yaml("rms", {"x": spec(x)}, rms_graph(form, axis), ["y"], w)
        x64 = x.astype(np.float64)
        want = gamma * x64 / np.sqrt((x64 ** 2).mean(axis=axis, keepdims=True) + eps)
        both_ways(workdir, y, [x], want.astype(np.float32),
                  {"rms_norm": 1} if axis == -1 else {})
    return test


for form in ["reciprocal", "rsqrt", "div"]:
    case(f"rewrite rms_norm ({form})")(rms_case(form, -1))
case("rewrite rms_norm: a mean over another axis is left alone")(rms_case("reciprocal", 1))


# ---- rope ----

def rope_case(same_halves, heads_first):
    """x * cos(cat(f, f)) + cat(-x2, x1) * sin(cat(f, f)); heads_first: x is
    a transpose of [B, S, H, D] (the rope then runs before it)."""
    def test(workdir):
        r = rng(4200)
        B, S, H, D = 1, 6, 3, 8
        xin = values(r, [B, S, H, D], 1.0)
        f = values(r, [B, S, D // 2], 1.0)
        g = f if same_halves else values(r, [B, S, D // 2], 1.0)
        nodes = [node("t", "concat", ["f", "g"] if not same_halves else ["f", "f"], axis=-1),
                 node("c", "cos", ["t"]), node("s", "sin", ["t"]),
                 node("cu", "unsqueeze", ["c"], axes=[1 if heads_first else 2]),
                 node("su", "unsqueeze", ["s"], axes=[1 if heads_first else 2])]
        x = "xin"
        if heads_first:
            nodes.append(node("x", "transpose", ["xin"], perm=[0, 2, 1, 3]))
            x = "x"
        nodes += [node("x1", "slice", [x], starts=[0], ends=[D // 2], axes=[3], steps=[1]),
                  node("x2", "slice", [x], starts=[D // 2], ends=[D], axes=[3], steps=[1]),
                  node("n2", "neg", ["x2"]),
                  node("rot", "concat", ["n2", "x1"], axis=-1),
                  node("a", "mul", [x, "cu"]), node("b", "mul", ["rot", "su"]),
                  node("y", "add", ["a", "b"])]
        ins = {"xin": spec(xin), "f": spec(f)}
        feeds = [xin, f]
        if not same_halves:
            ins["g"] = spec(g)
            feeds.append(g)
        y = model_yaml("rope", ins, nodes, ["y"])
        xs = xin.astype(np.float64)
        if heads_first:
            xs = xs.transpose(0, 2, 1, 3)
        t = np.concatenate([f, g], -1).astype(np.float64)
        cu = np.expand_dims(np.cos(t), 1 if heads_first else 2)
        su = np.expand_dims(np.sin(t), 1 if heads_first else 2)
        rot = np.concatenate([-xs[..., D // 2:], xs[..., :D // 2]], -1)
        want = (xs * cu + rot * su).astype(np.float32)
        both_ways(workdir, y, feeds, want, {"rope": 1} if same_halves else {})
    return test


def rope_constant_case(same_halves):
    """The exporter's folded tables: cos and sin as constants [1, 1, S, D]
    (the same halves, or not)."""
    def test(workdir):
        r = rng(4250)
        B, S, H, D = 1, 5, 2, 8
        xin = values(r, [B, S, H, D], 1.0)
        f = values(r, [S, D // 2], 1.0)
        t = np.concatenate([f, f if same_halves else values(r, [S, D // 2], 1.0)], -1)
        c, s_ = np.cos(t)[None, None], np.sin(t)[None, None]
        nodes = [node("x", "transpose", ["xin"], perm=[0, 2, 1, 3]),
                 node("x1", "slice", ["x"], starts=[0], ends=[D // 2], axes=[3], steps=[1]),
                 node("x2", "slice", ["x"], starts=[D // 2], ends=[D], axes=[3], steps=[1]),
                 node("n2", "neg", ["x2"]), node("rot", "concat", ["n2", "x1"], axis=-1),
                 node("a", "mul", ["x", "c"]), node("b", "mul", ["rot", "s"]),
                 node("y", "add", ["a", "b"])]
        y = model_yaml("rope", {"xin": spec(xin)}, nodes, ["y"], weight_specs(c=c, s=s_))
        xs = xin.astype(np.float64).transpose(0, 2, 1, 3)
        rot = np.concatenate([-xs[..., D // 2:], xs[..., :D // 2]], -1)
        want = (xs * c + rot * s_).astype(np.float32)
        both_ways(workdir, y, [xin], want, {"rope": 1} if same_halves else {})
    return test


case("rewrite rope, positions before heads")(rope_case(True, False))
case("rewrite rope, constant tables")(rope_constant_case(True))
case("rewrite rope: constant tables whose halves differ are left alone")(
    rope_constant_case(False))
case("rewrite rope, heads before positions (runs before the transpose)")(rope_case(True, True))
case("rewrite rope: a table whose halves differ is left alone")(rope_case(False, True))


# ---- attention ----

def heads_view(name, src, S, kvh, rep, D, transposed=False):
    """[1, S, kvh * D] -> [1, kvh * rep, S, D] (rep: repeated heads), as
    transformers' repeat_kv and the exporter write it; transposed: then
    [1, H, D, S]."""
    nodes = [node(f"{name}4", "reshape", [src], shape=[1, S, kvh, D]),
             node(f"{name}t", "transpose", [f"{name}4"], perm=[0, 2, 1, 3])]
    last = f"{name}t"
    if rep > 1:
        nodes += [node(f"{name}u", "unsqueeze", [last], axes=[2]),
                  node(f"{name}e", "expand", [f"{name}u"], shape=[1, kvh, rep, S, D]),
                  node(f"{name}r", "reshape", [f"{name}e"], shape=[1, kvh * rep, S, D])]
        last = f"{name}r"
    if transposed:
        nodes.append(node(f"{name}T", "transpose", [last], perm=[0, 1, 3, 2]))
        last = f"{name}T"
    return nodes, last


def attention_case(H, KVH, Sq, Sk, guard, masked_row):
    def test(workdir):
        r = rng(4300 + H + Sq)
        D = 8
        q = values(r, [1, Sq, H * D], 1.0)
        k = values(r, [1, Sk, KVH * D], 1.0)
        v = values(r, [1, Sk, KVH * D], 1.0)
        mask = np.where(r.random([1, 1, Sq, Sk]) < 0.3, -np.inf, 0).astype(np.float32)
        mask[..., 0] = 0
        if masked_row:
            mask[0, 0, 1, :] = -np.inf  # a row that sees no key
        a, b = 0.5, D ** -0.5 / 0.5
        nodes, qn = heads_view("q", "q", Sq, H, 1, D)
        kn_nodes, kn = heads_view("k", "k", Sk, KVH, H // KVH, D, transposed=True)
        vn_nodes, vn = heads_view("v", "v", Sk, KVH, H // KVH, D)
        nodes += kn_nodes + vn_nodes
        nodes += [node("qs", "mul", [qn, "a"]), node("ks", "mul", [kn, "b"]),
                  node("sc", "matmul", ["qs", "ks"]), node("sm", "add", ["sc", "mask"]),
                  node("p", "softmax", ["sm"], axis=-1)]
        p = "p"
        if guard:
            nodes += [node("nan", "isnan", ["p"]), node("pg", "where", ["nan", "zero", "p"])]
            p = "pg"
        nodes += [node("o", "matmul", [p, vn]),
                  node("ot", "transpose", ["o"], perm=[0, 2, 1, 3]),
                  node("y", "reshape", ["ot"], shape=[1, Sq, H * D])]
        w = weight_specs(a=np.float32(a), b=np.float32(b), zero=np.float32(0))
        y = model_yaml("sdpa", {"q": spec(q), "k": spec(k), "v": spec(v), "mask": spec(mask)},
                       nodes, ["y"], w)
        # numpy: per head, grouped-query
        qh = q.reshape(Sq, H, D).transpose(1, 0, 2).astype(np.float64)
        kh = np.repeat(k.reshape(Sk, KVH, D).transpose(1, 0, 2), H // KVH, 0).astype(np.float64)
        vh = np.repeat(v.reshape(Sk, KVH, D).transpose(1, 0, 2), H // KVH, 0).astype(np.float64)
        s = (qh * a) @ (kh * b).transpose(0, 2, 1) + mask[0]
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max(-1, keepdims=True))
            pr = e / e.sum(-1, keepdims=True)
        if guard:
            pr = np.where(np.isnan(pr), 0, pr)
        want = (pr @ vh).transpose(1, 0, 2).reshape(1, Sq, H * D).astype(np.float32)
        both_ways(workdir, y, [q, k, v, mask], want, {"attention": 1} if guard else {})
    return test


case("rewrite attention, grouped-query, a row that sees no key")(
    attention_case(4, 2, 5, 7, True, True))
case("rewrite attention, one query row")(attention_case(2, 2, 1, 9, True, False))
case("rewrite attention: a mask without the NaN guard is left alone")(
    attention_case(4, 2, 5, 7, False, False))


@case("rewrite attention at a batch of 2, K^T written as the exporter's SDPA writes it: "
      "the heads' [b, h, s, d] (a transpose of the projection's [b, s, h, d]) viewed as "
      "[b * h, s, d], transposed, viewed back as [b, h, d, s] (the merged axis of batch and "
      "heads has no single stride)")
def _(workdir):
    r = rng(4411)
    B, H, Sq, Sk, D = 2, 3, 5, 6, 8
    proj = {n: values(r, [B, s, H * D], 1.0) for n, s in (("q", Sq), ("k", Sk), ("v", Sk))}
    heads = {n: x.reshape(B, -1, H, D).transpose(0, 2, 1, 3).astype(np.float64)
             for n, x in proj.items()}
    mask = np.where(r.random([B, 1, Sq, Sk]) < 0.3, -np.inf, 0).astype(np.float32)
    mask[..., 0] = 0
    mask[1, 0, 2, :] = -np.inf  # a row that sees no key
    nodes = []
    for n, s in (("q", Sq), ("k", Sk), ("v", Sk)):
        nodes += [node(f"{n}4", "reshape", [f"{n}in"], shape=[B, s, H, D]),
                  node(n, "transpose", [f"{n}4"], perm=[0, 2, 1, 3])]
    nodes += [node("k3", "reshape", ["k"], shape=[B * H, Sk, D]),
              node("kt3", "transpose", ["k3"], perm=[0, 2, 1]),
              node("kt", "reshape", ["kt3"], shape=[B, H, D, Sk]),
              node("qs", "mul", ["q", "a"]),
              node("sc", "matmul", ["qs", "kt"]), node("sm", "add", ["sc", "mask"]),
              node("p", "softmax", ["sm"], axis=-1), node("nan", "isnan", ["p"]),
              node("pg", "where", ["nan", "zero", "p"]), node("y", "matmul", ["pg", "v"])]
    a = D ** -0.5
    w = weight_specs(a=np.float32(a), zero=np.float32(0))
    y = model_yaml("sdpa_b2", {"qin": spec(proj["q"]), "kin": spec(proj["k"]),
                               "vin": spec(proj["v"]), "mask": spec(mask)}, nodes, ["y"], w)
    s = (heads["q"] * a) @ heads["k"].transpose(0, 1, 3, 2) + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        pr = e / e.sum(-1, keepdims=True)
    want = (np.where(np.isnan(pr), 0, pr) @ heads["v"]).astype(np.float32)
    both_ways(workdir, y, [proj["q"], proj["k"], proj["v"], mask], want, {"attention": 1})


def windowed_case(shifted, constant):
    """Swin's window attention, as torchvision writes it and the exporter
    writes that: q scaled, q k^T, plus a constant relative-position bias
    [1, H, N, N], and in a shifted block the scores viewed as [1, W, H, N, N]
    plus the windows' constant mask [1, W, 1, N, N] (0 and -100), viewed
    back, softmax, times v, heads merged. No NaN guard: the rewrite takes
    the bias (and the mask) only as finite constants, summed once into the
    attention's mask; a bias given as an input (it might hold -inf) is left
    alone."""
    def test(workdir):
        r = rng(4500 + 2 * shifted + constant)
        W, H, N, D = 4, 3, 9, 8
        qkv = values(r, [W, N, 3 * H * D], 1.0)
        bias = values(r, [1, H, N, N], 1.0)
        mask = np.where(r.random([1, W, 1, N, N]) < 0.3, -100.0, 0.0).astype(np.float32)
        nodes = [node("q5", "reshape", ["qkv"], shape=[W, N, 3, H, D]),
                 node("qp", "transpose", ["q5"], perm=[2, 0, 3, 1, 4]),
                 node("q", "gather", ["qp", "i0"], axis=0),
                 node("k", "gather", ["qp", "i1"], axis=0),
                 node("v", "gather", ["qp", "i2"], axis=0),
                 node("qs", "mul", ["q", "a"]),
                 node("kt", "transpose", ["k"], perm=[0, 1, 3, 2]),
                 node("sc", "matmul", ["qs", "kt"]), node("sb", "add", ["sc", "bias"])]
        last = "sb"
        if shifted:
            nodes += [node("s5", "reshape", ["sb"], shape=[1, W, H, N, N]),
                      node("sm5", "add", ["s5", "mask"]),
                      node("s4", "reshape", ["sm5"], shape=[W, H, N, N])]
            last = "s4"
        nodes += [node("p", "softmax", [last], axis=-1), node("o", "matmul", ["p", "v"]),
                  node("ot", "transpose", ["o"], perm=[0, 2, 1, 3]),
                  node("y", "reshape", ["ot"], shape=[W, N, H * D])]
        a = D ** -0.5
        w = weight_specs(a=np.float32(a), mask=mask, **({"bias": bias} if constant else {}))
        for k in range(3):
            w[f"i{k}"] = {"dtype": "i64", "shape": [], "values": [k]}
        ins = {"qkv": spec(qkv), **({} if constant else {"bias": spec(bias)})}
        y = model_yaml("swin_attn", ins, nodes, ["y"], w)
        x = qkv.reshape(W, N, 3, H, D).transpose(2, 0, 3, 1, 4).astype(np.float64)
        s = (x[0] * a) @ x[1].transpose(0, 1, 3, 2) + bias
        if shifted:
            s = (s.reshape(1, W, H, N, N) + mask).reshape(W, H, N, N)
        e = np.exp(s - s.max(-1, keepdims=True))
        pr = e / e.sum(-1, keepdims=True)
        want = (pr @ x[2]).transpose(0, 2, 1, 3).reshape(W, N, H * D).astype(np.float32)
        both_ways(workdir, y, [qkv] + ([] if constant else [bias]), want,
                  {"attention": 1} if constant else {})
    return test


case("rewrite attention of windows: a constant relative-position bias, no NaN guard")(
    windowed_case(False, True))
case("rewrite attention of shifted windows: the bias and the windows' mask, summed once")(
    windowed_case(True, True))
case("rewrite attention: a bias given as an input, without the NaN guard, is left alone")(
    windowed_case(True, False))


def einsum_windows_case(shared_bias):
    """MaxViT's block attention as torchvision writes it and the exporter
    writes that (ONNX, opset 13): one QKV product [1, G, P, 3C] split three
    ways, each reshaped to [1, G, P, H, D] and its heads moved ahead of
    the positions, k times the scale, Einsum 'B G H I D, B G H J D -> B G
    H I J' (kiln's rank-5 product), a constant relative-position bias, the
    softmax, Einsum back, the heads merged. The rewrite reads q, k and v in
    place from the QKV product (the packed layout), folds the scale found
    on k, sums the bias into the attention's mask (kept at [1, H, P, P]
    when every window shares it), and the heads' transpose cancels: one
    dispatch. With --no-fuse=patterns the same values the long way."""
    def test(workdir):
        from test_onnx import attr, initializer, model, node as onode, run_onnx, value_info
        r = rng(4600 + shared_bias)
        G, P, H, D = 5, 7, 3, 8
        C = H * D
        qkv = values(r, [1, G, P, 3 * C], 1.0)
        bias = values(r, [1, H, P, P] if shared_bias else [G, H, P, P], 1.0)
        scale = np.float32(D ** -0.5)
        five = np.array([1, G, P, H, D], np.int64)
        nodes = [onode("Split", ["qkv"], ["q0", "k0", "v0"], "split", attr("axis", 3))]
        for t in "qkv":
            nodes += [onode("Reshape", [t + "0", "five"], [t + "5"], t + "r"),
                      onode("Transpose", [t + "5"], [t + "h"], t + "t",
                            attr("perm", [0, 1, 3, 2, 4]))]
        nodes += [onode("Mul", ["kh", "scale"], ["ks"], "ks"),
                  onode("Einsum", ["qh", "ks"], ["s"], "qk",
                        attr("equation", "B G H I D, B G H J D -> B G H I J")),
                  onode("Add", ["s", "bias"], ["sb"], "bias_add"),
                  onode("Softmax", ["sb"], ["p"], "softmax", attr("axis", -1)),
                  onode("Einsum", ["p", "vh"], ["o"], "pv",
                        attr("equation", "B G H I J, B G H J D -> B G H I D")),
                  onode("Transpose", ["o"], ["ot"], "merge", attr("perm", [0, 1, 3, 2, 4])),
                  onode("Reshape", ["ot", "four"], ["y"], "y")]
        inits = [initializer("five", five), initializer("scale", scale),
                 initializer("bias", bias),
                 initializer("four", np.array([1, G, P, C], np.int64))]
        data = model(nodes, [value_info("qkv", [1, G, P, 3 * C])],
                     [value_info("y", [1, G, P, C])], inits)
        x = qkv.astype(np.float64).reshape(1, G, P, 3, H, D).transpose(3, 0, 1, 4, 2, 5)
        sc = np.einsum("bghid,bghjd->bghij", x[0], x[1] * float(scale)) + bias
        e = np.exp(sc - sc.max(-1, keepdims=True))
        o = np.einsum("bghij,bghjd->bghid", e / e.sum(-1, keepdims=True), x[2])
        want = o.transpose(0, 1, 3, 2, 4).reshape(1, G, P, C).astype(np.float32)
        wd = Path(workdir)
        for flags, found in (((), 1), (("--no-fuse=patterns",), 0)):
            run_onnx(workdir, data, [qkv], [want], ["y"], flags=flags)
            r1 = kiln("compile", wd / "m.onnx", "-o", wd / "v.c", "-v", *flags)
            m = re.search(r"recognised \d+ rms_norm, \d+ rope, (\d+) attention", r1.stderr)
            check(int(m.group(1) if m else 0) == found, f"{flags}: {r1.stderr}")
            if found:
                ins = kiln("inspect", wd / "m.onnx", "--format", "json")
                import json
                d = json.loads(ins.stdout)
                ops = [x["op"] for x in d["dispatches"]]
                check(ops == ["attention"], f"dispatches {ops}, expected one attention")
                mask = [t for t in d["tensors"] if t["name"].startswith("kiln.mask")]
                want_shape = [1, H, P, P] if shared_bias else [G, H, P, P]
                check(len(mask) == 1 and mask[0]["shape"] == want_shape,
                      f"mask {mask}, expected shape {want_shape}")
    return test


case("rewrite attention of Einsum's rank-5 windows (MaxViT): bias shared by the windows")(
    einsum_windows_case(True))
case("rewrite attention of Einsum's rank-5 windows (MaxViT): a bias per window")(
    einsum_windows_case(False))


def transpose_chain_case(kind):
    """Transposes between reshapes, each read by nothing else, composed
    into one transpose of a view of the first one's input (MaxViT's heads
    moved back and the window partition undone: [B, H, W, C] transposed,
    viewed as windows, permuted), or into a view where they undo each
    other; with a second reader of the middle tensor they stay as they
    are. Every element against numpy; the transposes counted in inspect."""
    def test(workdir):
        import json
        r = rng(4700 + kind)
        B, A, P, C = 1, 4, 6, 5  # [B, A, P, C]: A windows of P = 2 x 3 positions
        x = values(r, [B, A, P, C], 1.0)
        nodes = [node("t1", "transpose", ["x"], perm=[0, 2, 1, 3]),  # [B, P, A, C]
                 node("v1", "reshape", ["t1"], shape=[B, 2, 3, 2, 2, C])]
        if kind == 1:  # undone: back to [B, A, P, C] through the same view
            nodes += [node("v2", "reshape", ["v1"], shape=[B, P, A, C]),
                      node("y", "transpose", ["v2"], perm=[0, 2, 1, 3])]
            want = x
        else:
            nodes += [node("t2", "transpose", ["v1"], perm=[0, 5, 1, 3, 2, 4]),
                      node("y", "reshape", ["t2"], shape=[B, C, 2 * 2, 3 * 2])]
            want = x.transpose(0, 2, 1, 3).reshape(B, 2, 3, 2, 2, C).transpose(
                0, 5, 1, 3, 2, 4).reshape(B, C, 4, 6)
        outs = ["y"]
        if kind == 2:  # the middle tensor read twice: nothing composed
            nodes.append(node("z", "neg", ["v1"]))
            outs.append("z")
        y = model_yaml("chain", {"x": spec(x)}, nodes, outs)
        prog = build_model(workdir, y)
        wants = [want.astype(np.float32)]
        if kind == 2:
            wants.append(-x.transpose(0, 2, 1, 3).reshape(B, 2, 3, 2, 2, C))
        got = run_program(prog, [x], wants)
        for g, w in zip(got, wants):
            check(np.array_equal(g, w), f"max error {np.abs(g - w).max()}")
        info = json.loads(kiln("inspect", Path(workdir) / "model.yaml", "--format",
                               "json").stdout)
        n = sum(d["op"] == "transpose" for d in info["dispatches"])
        check(n == [1, 0, 2][kind], f"{n} transpose dispatches, expected {[1, 0, 2][kind]}")
    return test


case("rewrite: transposes between reshapes composed into one (a window partition)")(
    transpose_chain_case(0))
case("rewrite: transposes between reshapes that undo each other: a view")(
    transpose_chain_case(1))
case("rewrite: transposes between reshapes, the middle one read twice, left alone")(
    transpose_chain_case(2))


@case("rewrite: batch norms no convolution folds (DenseNet's, on a concat) as x * a + b, "
      "one dispatch with the ReLU after; one after a convolution left to the fold")
def _(workdir):
    import json
    r = rng(4800)
    N, C, H, W = 2, 6, 5, 4
    x = values(r, [N, C, H, W], 1.0)
    u = values(r, [N, 3, H, W], 1.0)
    cw = values(r, [C + 3, C + 3, 1, 1], 0.5)
    p = {f"{n}{k}": values(r, [C + 3], 1.0) for k in (1, 2) for n in ("s", "b", "m")}
    for k in (1, 2):
        p[f"v{k}"] = (np.abs(values(r, [C + 3], 1.0)) + 0.5).astype(np.float32)
    nodes = [node("cat", "concat", ["x", "u"], axis=1),
             node("n1", "batch_norm", ["cat", "s1", "b1", "m1", "v1"], eps=1e-3),
             node("r1", "relu", ["n1"]),
             node("c", "conv", ["r1", "cw"]),
             node("n2", "batch_norm", ["c", "s2", "b2", "m2", "v2"], eps=1e-5),
             node("y", "relu", ["n2"])]
    y = model_yaml("bn", {"x": spec(x), "u": spec(u)}, nodes, ["y"], weight_specs(cw=cw, **p))
    cat = np.concatenate([x, u], 1).astype(np.float64)

    def bn(t, k, eps):
        sh = (1, -1, 1, 1)
        return ((t - p[f"m{k}"].reshape(sh)) / np.sqrt(p[f"v{k}"].reshape(sh) + eps) *
                p[f"s{k}"].reshape(sh) + p[f"b{k}"].reshape(sh))
    r1 = np.maximum(bn(cat, 1, 1e-3), 0)
    c = np.einsum("nchw,oc->nohw", r1, cw[:, :, 0, 0].astype(np.float64))
    want = np.maximum(bn(c, 2, 1e-5), 0).astype(np.float32)
    wd = Path(workdir)
    for flags, found in (((), 1), (("--no-fuse=patterns",), 0)):
        prog = build_model(workdir, y, flags=flags)
        got, = run_program(prog, [x, u], [want])
        err = np.abs(got - want).max()
        check(err <= 1e-4 * np.abs(want).max() + 1e-5, f"{flags}: max error {err}")
        r1 = kiln("compile", wd / "model.yaml", "-o", wd / "v.c", "-v", *flags)
        m = re.search(r"(\d+) batch norms as x \* a \+ b", r1.stderr)
        check(int(m.group(1) if m else 0) == found, f"{flags}: {r1.stderr}")
        info = json.loads(kiln("inspect", wd / "model.yaml", "--format", "json",
                               *flags).stdout)
        ops = [d["op"] for d in info["dispatches"]]
        if found:  # the norm, its ReLU: one dispatch; the second folded into the conv
            check("batch_norm" not in ops and len(ops) <= 3, f"dispatches {ops}")


# ---- gelu_tanh ----

def gelu_tanh_case(c3):
    """GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + c3 x^3))), on a gemm's
    result seen through a reshape (as its Conv1D writes it): with c3 =
    0.044715 a gelu_tanh that the gemm takes into its epilogue (one
    dispatch); another c3 is left alone."""
    def test(workdir):
        r = rng(4300)
        x, w, b = values(r, [8, 16], 1.0), values(r, [16, 24], 0.5), values(r, [24], 1.0)
        ws = weight_specs(w=w, b=b, half=np.float32(0.5), one=np.float32(1.0),
                          three=np.float32(3.0), c3=np.float32(c3),
                          k=np.float32(0.7978845608028654))
        nodes = [node("mm", "gemm", ["x", "w", "b"]),
                 node("v", "reshape", ["mm"], shape=[1, 8, 24]),
                 node("hx", "mul", ["v", "half"]), node("p3", "pow", ["v", "three"]),
                 node("cp", "mul", ["p3", "c3"]), node("inner", "add", ["v", "cp"]),
                 node("sc", "mul", ["inner", "k"]), node("th", "tanh", ["sc"]),
                 node("op", "add", ["th", "one"]), node("y", "mul", ["hx", "op"])]
        y = model_yaml("gelu", {"x": spec(x)}, nodes, ["y"], ws)
        h = (x.astype(np.float64) @ w + b).reshape(1, 8, 24)
        want = 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + c3 * h ** 3)))
        found = {"gelu_tanh": 1} if c3 == 0.044715 else {}
        both_ways(workdir, y, [x], want.astype(np.float32), found)
        prog = build_model(workdir, y)
        c = (Path(workdir) / "model.c").read_text()
        fused = "mm + y (gemm)" in c
        check(fused == bool(found) and c.count(" eltwise ") == (0 if found else 1),
              "the gemm's epilogue does not hold the gelu" if found else
              "a near miss was fused")
        out, = run_program(prog, [x], [want.astype(np.float32)])
        check(np.abs(out - want).max() <= 1e-5 + 1e-4 * np.abs(want).max(), "fused result")
    return test


case("rewrite gelu_tanh after a gemm and a reshape (GPT-2's), in the gemm's epilogue")(
    gelu_tanh_case(0.044715))
case("rewrite gelu_tanh: another cubic coefficient is left alone")(gelu_tanh_case(0.05))


# ---- silu ----

def conv_act_case(form):
    """A convolution (batch norm folded: a bias) then SiLU written as x *
    sigmoid(x) or sigmoid(x) * x (torch's), a hard_swish, or a near miss
    (x * sigmoid(y)): the activation in the convolution's epilogue, one
    dispatch; the near miss left as it is."""
    def test(workdir):
        r = rng(4400)
        x, w, b = values(r, [2, 3, 9, 9], 1.0), values(r, [8, 3, 3, 3], 0.5), values(r, [8], 1.0)
        ys = values(r, [2, 8, 9, 9], 1.0)
        ws = weight_specs(w=w, b=b, ys=ys)
        nodes = [node("c", "conv", ["x", "w", "b"], pads=[1, 1, 1, 1])]
        if form == "hard_swish":
            nodes.append(node("y", "hard_swish", ["c"]))
        else:
            nodes.append(node("s", "sigmoid", ["ys" if form == "near miss" else "c"]))
            nodes.append(node("y", "mul", ["s", "c"] if form == "sigmoid first" else ["c", "s"]))
        y = model_yaml("silu", {"x": spec(x)}, nodes, ["y"], ws)
        x64 = x.astype(np.float64)
        h = np.zeros((2, 8, 9, 9))
        xp = np.pad(x64, ((0, 0), (0, 0), (1, 1), (1, 1)))
        for i in range(3):
            for j in range(3):
                h += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 9, j:j + 9], w[:, :, i, j])
        h += b[None, :, None, None]
        if form == "hard_swish":
            want = h * np.clip(h / 6 + 0.5, 0, 1)
        elif form == "near miss":
            want = h / (1 + np.exp(-ys.astype(np.float64)))
        else:
            want = h / (1 + np.exp(-h))
        found = {} if form in ("near miss", "hard_swish") else {"silu": 1}
        both_ways(workdir, y, [x], want.astype(np.float32), found)
        build_model(workdir, y)
        c = (Path(workdir) / "model.c").read_text()
        fused = form != "near miss"
        check((c.count(" eltwise ") == 0) == fused,
              "the convolution's epilogue does not hold the activation" if fused else
              "a near miss was fused")
    return test


for form in ["x first", "sigmoid first", "hard_swish", "near miss"]:
    case(f"rewrite silu: a convolution then {form if form != 'hard_swish' else 'hard_swish'}"
         + (" (left alone)" if form == "near miss" else ", in its epilogue"))(
        conv_act_case(form))


@case("rewrite: rope and attention nodes of the heads' layout [1, heads, seq, d], dynamic "
      "along that inner axis (RotaryEmbedding and Attention 23), run on the tensors they "
      "view; with --no-fuse=patterns on that layout itself")
def _(workdir):
    from test_dynamic import dyn_yaml, run_built
    import reference as ref
    from harness import VALIDATION  # noqa: F401 (run_built runs with it)
    H, KVH, D = 4, 2, 8
    f = {"dtype": "f32"}
    ins = {"q": {**f, "shape": [1, "seq", H, D]}, "k": {**f, "shape": [1, "seq", KVH, D]},
           "v": {**f, "shape": [1, "seq", KVH, D]}, "cos": {**f, "shape": ["seq", D // 2]},
           "sin": {**f, "shape": ["seq", D // 2]}}
    t = [0, 2, 1, 3]
    nodes = [node("qt", "transpose", ["q"], perm=t), node("kt", "transpose", ["k"], perm=t),
             node("vt", "transpose", ["v"], perm=t),
             node("qr", "rope", ["qt", "cos", "sin"], seq_axis=2),
             node("kr", "rope", ["kt", "cos", "sin"], seq_axis=2)]
    for n in ("kr", "vt"):  # repeat_kv: [1, KVH, 1, seq, D] -> [1, KVH, 2, seq, D]
        nodes += [node(n + "u", "unsqueeze", [n], axes=[2]),
                  node(n + "e", "expand", [n + "u"], shape=[1, KVH, H // KVH, 1, 1]),
                  node(n + "h", "reshape", [n + "e"], shape=[1, H, -1, D])]
    nodes += [node("o", "attention", ["qr", "krh", "vth"], causal=1, scale=0.3),
              node("y", "transpose", ["o"], perm=t)]
    y = dyn_yaml({"seq": "1..12"}, ins, nodes, ["y"])
    wd = Path(workdir)
    (wd / "model.yaml").write_text(y)
    got = recognised(wd)
    check(got["rope"] == 2 and got["attention"] == 1, f"recognised {got}")

    def make(g, seq):
        ang = g.uniform(-3, 3, (seq, D // 2)).astype(np.float32)
        return [g.standard_normal((1, seq, H, D)).astype(np.float32),
                g.standard_normal((1, seq, KVH, D)).astype(np.float32),
                g.standard_normal((1, seq, KVH, D)).astype(np.float32), np.cos(ang), np.sin(ang)]

    def want(q, k, v, c, s, seq):
        qr = ref.rope(q.transpose(t), c, s, seq_axis=2)
        kr = ref.rope(k.transpose(t), c, s, seq_axis=2)
        return [ref.attention(qr, kr, v.transpose(t), scale=0.3, causal=True).transpose(t)]
    for sub, flags in (("moved", ()), ("in place", ("--no-fuse=patterns",))):
        (wd / sub).mkdir()
        run_built(build_model(wd / sub, y, flags=flags), [{"seq": s} for s in (1, 12, 5, 2)],
                  make, want, rtol=1e-4, atol=1e-5)
