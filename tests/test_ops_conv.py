"""test_ops_conv.py: convolution, pooling, resize, fused epilogues
(shaders/conv.comp, pool.comp, resize.comp), on Vulkan against the CPU
reference (ops_common.py says how).
"""
import json
from pathlib import Path

import numpy as np

import reference as ref
from harness import (assert_close, assert_relative, build_model, check, check_defines,
                     kiln, run_steps,
                     check_kernels, kernel_defines, model_yaml, registry, run_model,
                     run_program)
from ops_common import half, one_op, rng, spec, values, weight_specs

TESTS, case = registry()


# ---- convolution, pooling, resize ----

CONVS = [  # x shape, w shape, attrs, bias
    ([1, 2, 9], [3, 2, 3], {}, True),                                          # 1-D
    ([2, 3, 7, 8], [4, 3, 3, 3], {"pads": [1, 1, 1, 1]}, True),                # 2-D
    ([1, 4, 9, 9], [6, 2, 3, 3], {"strides": [2, 2], "group": 2}, False),       # groups
    ([1, 2, 10, 9], [2, 2, 3, 2], {"dilations": [2, 1], "pads": [2, 0, 1, 1]}, True),
    ([1, 3, 7, 6], [3, 1, 3, 3], {"group": 3, "auto_pad": "same_upper"}, True),  # depthwise
    ([1, 2, 8, 7], [2, 2, 2, 3], {"strides": [2, 2], "auto_pad": "same_lower"}, False),
    ([1, 2, 6, 6], [3, 2, 3, 3], {"auto_pad": "valid"}, True),
    ([1, 2, 5, 6, 4], [3, 2, 2, 3, 2], {"pads": [1, 0, 1, 0, 1, 1]}, True),   # 3-D
    # channels split over invocations (conv.comp SPLIT): 32 ways, 48 channels
    # (some invocations take two); 4 ways within groups; one way (65,536 outputs)
    ([1, 48, 6, 6], [8, 48, 3, 3], {"pads": [1, 1, 1, 1]}, True),
    ([1, 8, 9, 9], [4, 4, 3, 3], {"group": 2}, True),
    ([1, 4, 130, 130], [4, 4, 3, 3], {}, True),
]


def conv_geometry(xs, ws, attrs):
    """Explicit pads for auto_pad, from ONNX's rules."""
    a = dict(attrs)
    mode = a.pop("auto_pad", None)
    nsp = len(xs) - 2
    if mode in ("same_upper", "same_lower"):
        st = a.get("strides", [1] * nsp)
        pb, pe = [], []
        for i in range(nsp):
            out = -(-xs[2 + i] // st[i])
            total = max(0, (out - 1) * st[i] + ws[2 + i] - xs[2 + i])
            small = total // 2
            b = small if mode == "same_upper" else total - small
            pb.append(b)
            pe.append(total - b)
        a["pads"] = pb + pe
    return a


def conv_inputs(seed, xs, ws, attrs, bias):
    """Seeded x, w (and bias) of a convolution, and its reference output."""
    r = rng(seed)
    x, w = values(r, xs, 1.0), values(r, ws, 1.0)
    ins = [x, w] + ([values(r, [ws[0]], 1.0)] if bias else [])
    a = conv_geometry(xs, ws, attrs)
    want = ref.conv(x, w, ins[2] if bias else None, a.get("strides"), a.get("pads"),
                    a.get("dilations"), a.get("group", 1))
    return ins, want


def conv_case(i, xs, ws, attrs, bias):
    def test(workdir):
        ins, want = conv_inputs(2500 + i, xs, ws, attrs, bias)
        one_op(workdir, "conv", ins, want, attrs, 1e-5, 1e-4)
    return test


for i, c in enumerate(CONVS):
    case(f"op conv x={c[0]} w={c[1]} {c[2]} bias={c[3]}")(conv_case(i, *c))


# Convolutions as matrix products on matmul.comp's tiles (implicit GEMM,
# lower_conv.c's conv_product: one group, more than 16 output channels):
# the input read as its im2col matrix for every attribute the loader takes,
# 1 x 1 kernels on one image as a plain matrix (vec4 where H * W is a
# multiple of 4, over several images too), several images folded into the
# product's columns (CIMG),
# and long K split along it (splitk.comp adds a convolution's chunks up).
# Each checks that its dispatch is
# the product kernel, not conv.comp, and the later ones the path they take
# (the first matmul kernel's defines).
CONV_PRODUCTS = [  # x shape, w shape, attrs, bias, kernels the dispatches use[, defines]
    ([3, 5, 9, 10], [24, 5, 3, 3], {"pads": [1, 1, 1, 1]}, True, {"matmul"}),
    ([2, 6, 13, 11], [20, 6, 3, 2],
     {"strides": [2, 3], "pads": [1, 0, 2, 1], "dilations": [2, 1]}, True, {"matmul"}),
    ([2, 7, 40], [18, 7, 5], {"strides": [2], "pads": [2, 1], "dilations": [2]}, False,
     {"matmul"}),                                                             # 1-D
    ([2, 16, 8, 8], [32, 16, 1, 1], {}, True, {"matmul"},                    # 1 x 1, vec4
     {"VEC4": "1", "B_SCALAR": None, "CONV": None, "CIMG": "64", "B_SK": "64"}),
    ([1, 12, 7, 7], [24, 12, 1, 1], {}, False, {"matmul"}),                  # 1 x 1, H * W odd
    ([1, 8, 9, 9], [17, 8, 1, 1], {"strides": [2, 2]}, True, {"matmul"}),   # 1 x 1, strided
    ([1, 3, 7, 6], [17, 3, 3, 3], {"auto_pad": "same_upper"}, True, {"matmul"}),
    ([1, 256, 7, 7], [32, 256, 3, 3], {"pads": [1, 1, 1, 1]}, True, {"matmul", "splitk"}),
    ([1, 1024, 7, 7], [64, 1024, 1, 1], {}, True, {"matmul", "splitk"}),    # split, 1 x 1
    # the two-stage (VEC4) path: a stem of K 147 (A read one by one), four
    # images of 90 positions; 64 x 128 tiles over four images; 128 x 128;
    # 1 x 1 on three images of 49 (B gathered, not vec4); three images of
    # 25 positions split along K
    ([4, 3, 20, 18], [32, 3, 7, 7], {"strides": [2, 2], "pads": [3, 3, 3, 3]}, True,
     {"matmul"}, {"VEC4": "1", "A_SCALAR": "1", "B_SCALAR": "1", "CIMG": "90"}),
    ([4, 8, 64, 64], [64, 8, 3, 3], {"pads": [1, 1, 1, 1]}, True, {"matmul"},
     {"VEC4": "1", "BM": "64", "BN": "128", "TM": "8", "TN": "4", "CIMG": "4096"}),
    ([2, 3, 128, 128], [96, 3, 3, 3], {"pads": [1, 1, 1, 1]}, False, {"matmul"},
     {"VEC4": "1", "BM": "128", "BN": "128", "A_SCALAR": "1"}),
    ([3, 12, 7, 7], [32, 12, 1, 1], {}, True, {"matmul"},
     {"VEC4": "1", "B_SCALAR": "1", "CIMG": "49", "C_IMG": "49"}),
    ([3, 256, 5, 5], [32, 256, 3, 3], {"pads": [1, 1, 1, 1]}, True, {"matmul", "splitk"},
     {"VEC4": "1", "CIMG": "25", "C_IMG": None, "SPLIT_LAST": None}),
    # pick_tiles' convolution rules: 128 x 128 tiles in K steps of 8 from
    # 32 tiles (96 channels, K 288, split); a 1 x 1 of K 16 in steps of 8 on 64 x
    # 128 tiles, too few vec4s of A a step for 256 invocations (A_SCALAR)
    ([4, 32, 32, 32], [96, 32, 3, 3], {"pads": [1, 1, 1, 1]}, True, {"matmul", "splitk"},
     {"VEC4": "1", "BM": "128", "BN": "128", "BK": "8", "CIMG": "1024"}),
    ([4, 16, 64, 64], [64, 16, 1, 1], {}, False, {"matmul"},
     {"VEC4": "1", "BM": "64", "BN": "128", "BK": "8", "TM": "8", "TN": "4", "A_SCALAR": "1"}),
    # conv_narrow: a 1 x 1 of 128 channels over eight images, 64 x 128
    # tiles of 8 x 4 (not 128 x 128); strided, it keeps those
    ([8, 16, 32, 32], [128, 16, 1, 1], {}, True, {"matmul"},
     {"VEC4": "1", "BM": "64", "BN": "128", "TM": "8", "TN": "4", "CIMG": "1024"}),
    ([8, 16, 64, 64], [128, 16, 1, 1], {"strides": [2, 2]}, True, {"matmul"},
     {"VEC4": "1", "BM": "128", "BN": "128", "TM": "8", "TN": "8", "CONV": "1"}),
]


def conv_product_case(i, xs, ws, attrs, bias, kernels, defines=None):
    def test(workdir):
        ins, want = conv_inputs(2530 + i, xs, ws, attrs, bias)
        k = int(np.prod(ws[1:]))
        one_op(workdir, "conv", ins, want, attrs, 1e-5, 2e-6 * k ** 0.5 * 4)
        check_kernels(workdir, kernels)
        if defines:
            check_defines(workdir, defines)
    return test


for i, c in enumerate(CONV_PRODUCTS):
    case(f"op conv as a product x={c[0]} w={c[1]} {c[2]} bias={c[3]}")(conv_product_case(i, *c))


def conv_product_epilogue_case(xs, ws, kernels, split=False):
    """Conv + residual add + relu in the product's epilogue (with split,
    in splitk.comp's, over the chunks of a long K; run twice on other
    inputs)."""
    def test(workdir):
        r = rng(2545)
        x, w, b = values(r, xs, 1.0), values(r, ws, 1.0), values(r, [ws[0]], 1.0)
        conv = ref.conv(x, w, b, pads=[1, 1, 1, 1])
        res = values(r, list(conv.shape), 1.0)
        ins = {"x": spec(x), "w": spec(w), "b": spec(b), "r": spec(res)}
        nodes = [{"name": "c", "op": "conv", "inputs": ["x", "w", "b"], "pads": [1, 1, 1, 1]},
                 {"name": "s", "op": "add", "inputs": ["r", "c"]},
                 {"name": "y", "op": "relu", "inputs": ["s"]}]
        want = np.maximum(conv + res, 0)
        prog = build_model(workdir, model_yaml("epi", ins, nodes, ["y"]))
        tol = 2e-6 * int(np.prod(ws[1:])) ** 0.5 * 4
        if split:  # two runs of other inputs (run_steps)
            x2, res2 = values(r, xs, 1.0), values(r, list(conv.shape), 1.0)
            want2 = np.maximum(ref.conv(x2, w, b, pads=[1, 1, 1, 1]) + res2, 0)
            got, got2 = run_steps(prog, [[x, w, b, res], [x2, w, b, res2]],
                                  [want.astype(np.float32)])
            assert_close(got2[0], want2, 1e-5, tol, "second run")
            got = got[0]
        else:
            got, = run_program(prog, [x, w, b, res], [want.astype(np.float32)])
        assert_close(got, want, 1e-5, tol)
        check("c + s + y (conv)" in (Path(workdir) / "model.c").read_text(),
              "the residual and relu are not in the product's epilogue")
        check_kernels(workdir, kernels)
    return test


case("op conv as a product + residual + relu, two images")(
    conv_product_epilogue_case([2, 4, 8, 8], [20, 4, 3, 3], {"matmul"}))
case("op conv as a product + residual + relu, split along K")(
    conv_product_epilogue_case([1, 128, 6, 6], [24, 128, 3, 3], {"matmul", "splitk"}, True))
case("op conv as a product + residual + relu, three images split along K")(
    conv_product_epilogue_case([3, 128, 5, 5], [32, 128, 3, 3], {"matmul", "splitk"}, True))
case("op conv as a product + residual + relu, three images on two stages")(
    conv_product_epilogue_case([3, 8, 9, 9], [32, 8, 3, 3], {"matmul"}))


def conv_activation_case(act):
    def test(workdir):
        r = rng(2520)
        x, w, b = values(r, [1, 3, 6, 6], 1.0), values(r, [4, 3, 3, 3], 1.0), values(r, [4], 1.0)
        want = ref.ACTIVATIONS[act](ref.conv(x, w, b, pads=[1, 1, 1, 1]))
        one_op(workdir, "conv", [x, w, b], want, {"pads": [1, 1, 1, 1], "activation": act},
               1e-5, 1e-4)
    return test


# every ACTIVATION row of ops.def, as conv's activation attribute
for act in sorted(set(ref.ACTIVATIONS) - {"none"}):
    case(f"op conv with a fused {act}")(conv_activation_case(act))


def epilogue_case(kind, flags=()):
    """Fusion into a conv or matmul epilogue (optimize.c): a conv's
    residual add and activation ("residual": one dispatch); an add whose
    other input a later node makes ("later": not fused, since the epilogue
    runs at the conv's or matmul's place); a broadcast residual."""
    def test(workdir):
        r = rng(2525)
        x, w, b = values(r, [1, 4, 8, 8], 1.0), values(r, [4, 4, 3, 3], 1.0), values(r, [4], 1.0)
        res = values(r, [1, 1, 8, 1] if kind == "broadcast" else [1, 4, 8, 8], 1.0)
        conv = ref.conv(x, w, b, pads=[1, 1, 1, 1])
        ins = {"x": spec(x), "w": spec(w), "b": spec(b), "r": spec(res)}
        nodes = [{"name": "c", "op": "conv", "inputs": ["x", "w", "b"], "pads": [1, 1, 1, 1]}]
        if kind == "later":
            nodes.append({"name": "z", "op": "exp", "inputs": ["r"]})
            nodes.append({"name": "s", "op": "add", "inputs": ["c", "z"]})
            want = np.maximum(conv + np.exp(res.astype(np.float64)), 0)
        else:
            nodes.append({"name": "s", "op": "add", "inputs": ["r", "c"]})
            want = np.maximum(conv + res, 0)
        nodes.append({"name": "y", "op": "relu", "inputs": ["s"]})
        if kind == "matmul":  # the later operand of a matmul's bias add
            a, m = values(r, [6, 9], 1.0), values(r, [9, 5], 1.0)
            res = values(r, [6, 5], 1.0)
            ins = {"a": spec(a), "m": spec(m), "r": spec(res)}
            nodes = [{"name": "p", "op": "matmul", "inputs": ["a", "m"]},
                     {"name": "z", "op": "exp", "inputs": ["r"]},
                     {"name": "y", "op": "add", "inputs": ["p", "z"]}]
            want = a.astype(np.float64) @ m + np.exp(res.astype(np.float64))
        inputs = [v for v in (x, w, b, res)] if kind != "matmul" else [a, m, res]
        prog = build_model(workdir, model_yaml("epi", ins, nodes, ["y"]), flags=list(flags))
        got, = run_program(prog, inputs, [want.astype(np.float32)])
        assert_close(got, want, 1e-5, 1e-4)
        header = (Path(workdir) / "model.h").read_text()
        if kind == "residual":
            one = "--no-fuse=epilogue" not in flags
            check(("_DISPATCH_COUNT 1u\n" in header) == one and
                  ("c + s + y (conv)" in (Path(workdir) / "model.c").read_text()) == one,
                  "the residual and relu in the conv's dispatch" if one else "not fused")
    return test


case("op conv + residual add + relu: one dispatch")(epilogue_case("residual"))
case("op conv + residual add + relu with --no-fuse=epilogue")(
    epilogue_case("residual", ["--no-fuse=epilogue"]))
case("op conv + add of a tensor made after the conv: not in its epilogue")(
    epilogue_case("later"))
case("op conv + broadcast add + relu")(epilogue_case("broadcast"))
case("op matmul + add of a tensor made after the matmul: not in its epilogue")(
    epilogue_case("matmul"))


# ---- --precision f16: convolutions of f16 weights (converted when
# compiled) with their epilogues. Where the device has cooperative matrices
# the products run coopmat.comp (implicit GEMM, the input gathered as halves
# or loaded as vectors); elsewhere (lavapipe) matmul.comp with f16 operands,
# or conv.comp with f16 storage; kernels larger than 1 x 1 over channels in
# eights take their weights as [OC, KH, KW, C] (CONV_KLAST), in both. Each
# checks the cooperative-matrix kernel's
# defines (it is compiled everywhere) and the kernels the dispatches use.
# The reference convolves the f16-rounded operands in f64. ----

F16_CONVS = [  # x shape, w shape, attrs, input: "f16" (made by a node) or "f32" (the
    # model's), residual, defines of the coopmat kernel (None: none), kernels
    ([2, 8, 9, 10], [24, 8, 3, 3], {"pads": [1, 1, 1, 1]}, "f16", True,
     {"CONV": "1", "B_GATHER": "1", "A_GATHER": None, "C_IMG": "90", "HAS_RES": "1",
      "RES_F16": "1", "EPILOGUE": "1", "CONV_KLAST": "1", "CIC": "8", "STORE8": "0"}, {"eltwise", "coopmat", "matmul"}),
    # a stem: K 147 (A gathered), the model's f32 input read as it is, f32 output
    ([2, 3, 20, 18], [32, 3, 7, 7], {"strides": [2, 2], "pads": [3, 3, 3, 3]}, "f32", False,
     {"CONV": "1", "A_GATHER": "1", "B_GATHER": "1", "B_F32": "1", "C_F16": "0",
      "CONV_KLAST": None},
     {"coopmat", "matmul"}),
    # 1 x 1 over two images of 64 positions: B in vectors
    ([2, 16, 8, 8], [32, 16, 1, 1], {}, "f16", False,
     {"CONV": None, "B_GATHER": None, "CIMG": "64", "STORE8": "1"},
     {"eltwise", "coopmat", "matmul"}),
    # 1 x 1 over three images of 49: B gathered as a plain matrix
    ([3, 16, 7, 7], [32, 16, 1, 1], {}, "f16", True,
     {"CONV": None, "B_GATHER": "1", "CIMG": "49", "HAS_RES": "1", "RES_F16": "1"},
     {"eltwise", "coopmat", "matmul"}),
    ([2, 8, 13, 11], [20, 8, 3, 2],
     {"strides": [2, 3], "pads": [1, 0, 2, 1], "dilations": [2, 1]}, "f16", False,
     {"CONV": "1", "B_GATHER": "1"}, {"eltwise", "coopmat", "matmul"}),
    # a long K over two images: split in chunks, splitk.comp's epilogue
    ([2, 256, 5, 5], [32, 256, 3, 3], {"pads": [1, 1, 1, 1]}, "f16", True,
     {"CONV": "1", "KCHUNK": "128", "C_IMG": None, "CONV_KLAST": "1", "SPLIT_LAST": None},
     {"eltwise", "coopmat", "matmul", "splitk"}),
    # 64 x 256 tiles of 8 subgroups over several images (coopmat_kernel):
    # a 3 x 3 of 64 channels, eight channels a kernel offset; a 1 x 1 of
    # 128, B in vectors; strided, gathered element by element, it keeps the
    # larger tiles
    ([2, 8, 128, 128], [64, 8, 3, 3], {"pads": [1, 1, 1, 1]}, "f16", False,
     {"CONV": "1", "CONV_KLAST": "1", "BM": "64", "BN": "256", "WM": "2", "WN": "4"},
     {"eltwise", "coopmat", "matmul"}),
    ([4, 16, 64, 64], [128, 16, 1, 1], {}, "f16", True,
     {"CONV": None, "B_GATHER": None, "BM": "64", "BN": "256", "WM": "2", "WN": "4"},
     {"eltwise", "coopmat", "matmul"}),
    ([4, 16, 128, 128], [256, 16, 1, 1], {"strides": [2, 2]}, "f16", False,
     {"CONV": "1", "B_GATHER": "1", "BM": "128", "BN": "256"},
     {"eltwise", "coopmat", "matmul"}),
    # depthwise: conv.comp with f16 storage
    ([1, 8, 7, 6], [8, 1, 3, 3], {"group": 8, "pads": [1, 1, 1, 1]}, "f16", True, None,
     {"eltwise", "conv"}),
]


def f16_conv_case(i, xs, ws, attrs, inp, residual, coop, kernels):
    def test(workdir):
        r = rng(2560 + i)
        x, w, b = values(r, xs, 1.0), values(r, ws, 0.5), values(r, [ws[0]], 1.0)
        weights = weight_specs(w=w, b=b)
        ins, feeds, nodes = {"x": spec(x)}, [x], []
        src, hx = "x", half(x)
        if inp == "f16":  # an f16 tensor: the negated input
            nodes.append({"name": "hx", "op": "neg", "inputs": ["x"]})
            src, hx = "hx", -half(x)
        nodes.append(dict({"name": "c", "op": "conv", "inputs": [src, "w", "b"]}, **attrs))
        want = ref.conv(hx, half(w), b, attrs.get("strides"), attrs.get("pads"),
                        attrs.get("dilations"), attrs.get("group", 1))
        last = "c"
        if residual:  # + an f16 skip tensor, relu: in the epilogue
            res = values(r, list(want.shape), 1.0)
            ins["r"] = spec(res)
            feeds.append(res)
            # the skip tensor made before the conv (else not in its epilogue)
            nodes.insert(0, {"name": "hr", "op": "neg", "inputs": ["r"]})
            nodes += [{"name": "s", "op": "add", "inputs": ["hr", "c"]},
                      {"name": "a", "op": "relu", "inputs": ["s"]}]
            want = np.maximum(half(want) - half(res), 0)  # the conv's own f16 result
            last = "a"
        if inp == "f16":  # an f16 result, negated into the f32 output
            nodes.append({"name": "y", "op": "neg", "inputs": [last]})
            want, last = -want, "y"
        prog = build_model(workdir, model_yaml("f16conv", ins, nodes, [last], weights),
                           flags=("--precision", "f16"))
        defs = [d for d in kernel_defines(workdir) if "WM" in d]
        if coop is None:
            check(not defs, f"a cooperative-matrix kernel: {defs}")
        else:
            check(defs and all(defs[0].get(k) == v for k, v in coop.items()),
                  f"cooperative-matrix kernel defines {defs}, expected {coop}")
        check_kernels(workdir, kernels)
        got, = run_program(prog, feeds, [want.astype(np.float32)])
        assert_relative(got, want, 2e-3, "output")
    return test


for i, c in enumerate(F16_CONVS):
    case(f"op conv --precision f16 x={c[0]} w={c[1]} {c[2]} input {c[3]} residual={c[4]}")(
        f16_conv_case(i, *c))


CONV_TS = [([1, 2, 4, 5], [2, 3, 3, 3], {}, True),
           ([1, 4, 3, 3], [4, 1, 3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2},
            False),
           ([2, 2, 4, 3], [2, 2, 2, 2], {"strides": [2, 3], "output_padding": [1, 0],
                                         "dilations": [1, 2]}, True),
           # conv.comp walks only the taps that reach an output (every KSTEP =
           # stride / gcd(stride, dilation)): a kernel of the stride's size (a
           # UNet's upsampling), strides 4 with dilation 2 (every second tap)
           # and 2 with 2 (all), a kernel smaller than the stride (outputs no
           # tap reaches), 1-D and 3-D
           ([2, 8, 5, 6], [8, 3, 2, 2], {"strides": [2, 2]}, True),
           ([1, 3, 4, 5], [3, 2, 5, 3], {"strides": [4, 2], "dilations": [2, 2],
                                         "pads": [2, 1, 3, 0]}, False),
           ([1, 2, 7], [2, 4, 1], {"strides": [3], "output_padding": [2]}, True),
           ([1, 2, 3, 2, 3], [2, 2, 3, 2, 2], {"strides": [2, 3, 1], "pads": [1, 0, 0, 1, 1, 0]},
            True)]


def conv_t_case(i, xs, ws, attrs, bias):
    def test(workdir):
        r = rng(2530 + i)
        x, w = values(r, xs, 1.0), values(r, ws, 1.0)
        g = attrs.get("group", 1)
        ins = [x, w] + ([values(r, [ws[1] * g], 1.0)] if bias else [])
        want = ref.conv_transpose(x, w, ins[2] if bias else None, attrs.get("strides"),
                                  attrs.get("pads"), attrs.get("dilations"), g,
                                  attrs.get("output_padding"))
        one_op(workdir, "conv_transpose", ins, want, attrs, 1e-5, 1e-4)
    return test


for i, c in enumerate(CONV_TS):
    case(f"op conv_transpose x={c[0]} w={c[1]} {c[2]} bias={c[3]}")(conv_t_case(i, *c))

POOLS = [  # kind, x shape, attrs
    ("max", [1, 2, 9], {"kernel": [3], "strides": [2]}),
    ("max", [2, 3, 7, 8], {"kernel": [2, 2], "strides": [2, 2]}),
    ("max", [1, 2, 7, 7], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                           "ceil_mode": 1}),
    ("max", [1, 1, 8, 8], {"kernel": [2, 2], "dilations": [2, 2]}),
    ("avg", [1, 2, 7, 7], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("avg", [1, 2, 7, 7], {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                           "count_include_pad": 1}),
    ("avg", [1, 2, 6, 7], {"kernel": [3, 2], "strides": [2, 2], "ceil_mode": 1,
                           "count_include_pad": 1, "pads": [1, 0, 1, 0]}),
    ("avg", [1, 2, 4, 5, 6], {"kernel": [2, 2, 3], "strides": [1, 2, 2]}),
]


def pool_case(i, kind, xs, attrs):
    def test(workdir):
        x = values(rng(2540 + i), xs)
        want = ref.pool(x, attrs["kernel"], kind, attrs.get("strides"), attrs.get("pads"),
                        attrs.get("dilations"), attrs.get("ceil_mode", 0),
                        attrs.get("count_include_pad", 0))
        one_op(workdir, f"{kind}_pool", [x], want, attrs, 1e-6, 1e-6)
    return test


for i, c in enumerate(POOLS):
    case(f"op {c[0]}_pool {c[1]} {c[2]}")(pool_case(i, *c))


@case("op conv_transpose --precision f16: f16 weights and storage on conv.comp")
def _(workdir):
    r = rng(2580)
    x, w, b = values(r, [1, 4, 5, 6], 1.0), values(r, [4, 3, 3, 3], 0.5), values(r, [3], 1.0)
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    weights = weight_specs(w=w, b=b)
    nodes = [{"name": "hx", "op": "neg", "inputs": ["x"]},
             dict({"name": "c", "op": "conv_transpose", "inputs": ["hx", "w", "b"]}, **attrs),
             {"name": "y", "op": "neg", "inputs": ["c"]}]
    prog = build_model(workdir, model_yaml("f16ct", {"x": spec(x)}, nodes, ["y"], weights),
                       flags=("--precision", "f16"))
    check_kernels(workdir, {"eltwise", "conv"})
    defs = kernel_defines(workdir)[1]
    check(defs.get("X_BUF") == "F16R" and defs.get("W_BUF") == "F16R" and
          defs.get("Y_BUF") == "F16", f"not f16 storage: {defs}")
    want = -ref.conv_transpose(-half(x), half(w), b, [2, 2], [1, 1, 1, 1])
    got, = run_program(prog, [x], [want.astype(np.float32)])
    assert_relative(got, want, 2e-3, "output")


# --precision f16: pooling and the reductions that keep their input's
# range read and write f16 (no casts around them); argmax's result stays i64.
F16_POOLS = [  # op, attrs, reference over f64 x
    ("max_pool", {"kernel": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
     lambda x: ref.pool(x, [3, 3], "max", [2, 2], [1, 1, 1, 1])),
    ("avg_pool", {"kernel": [2, 3], "strides": [2, 1]},
     lambda x: ref.pool(x, [2, 3], "avg", [2, 1])),
    ("global_avg_pool", {}, lambda x: x.mean(axis=(2, 3), keepdims=True)),
    ("reduce_max", {"axes": [1]}, lambda x: x.max(axis=1, keepdims=True)),
    ("reduce_mean", {"axes": [2, 3], "keep_dims": 0}, lambda x: x.mean(axis=(2, 3))),
    ("argmax", {"axis": 3}, lambda x: x.argmax(axis=3)[..., None]),
]


def f16_pool_case(op, attrs, reference):
    def test(workdir):
        x = values(rng(2590), [2, 5, 9, 8], 1.0)
        hx = -half(x)
        want = reference(hx)
        arg = op == "argmax"
        nodes = [{"name": "hx", "op": "neg", "inputs": ["x"]},
                 dict({"name": "p", "op": op, "inputs": ["hx"]}, **attrs)]
        if not arg:  # an f16 result, negated into the f32 output
            nodes.append({"name": "y", "op": "neg", "inputs": ["p"]})
            want = -want
        prog = build_model(workdir, model_yaml("f16pool", {"x": spec(x)}, nodes,
                                               ["p" if arg else "y"]),
                           flags=("--precision", "f16"))
        check_kernels(workdir, {"eltwise", "reduce" if "reduce" in op or op in (
            "argmax", "global_avg_pool") else "pool"})
        defs = kernel_defines(workdir)[1]
        check(defs.get("X_BUF") == "F16R" and (arg or defs.get("Y_BUF") == "F16"),
              f"not f16 storage: {defs}")
        got, = run_program(prog, [x], [want.astype(np.int64 if arg else np.float32)])
        if arg:
            check(np.array_equal(got, want), f"argmax {got.ravel()} != {want.ravel()}")
        else:
            assert_relative(got, want, 1e-3, "output")
    return test


for _op, _attrs, _ref in F16_POOLS:
    case(f"op {_op} --precision f16: f16 storage {_attrs}")(f16_pool_case(_op, _attrs, _ref))


# --precision f16 adds no cast dispatch where a kernel converts on load: the
# sums read f16 data and keep an f32 result (reduce.comp), batch norm reads
# and writes f16 (an elementwise dispatch), a concat of an f16 and an f32
# piece converts each as it copies it into an f16 result. Each case: hx =
# -x (f16), the op, y = -(the op) or the op itself into the f32 output.
def f16_uncast_case(op, attrs, reference, result_dtype, extra=None):
    def test(workdir):
        r = rng(2611)
        x = values(r, [2, 3, 5, 4], 1.0)
        ins, arrays, weights, args = {"x": spec(x)}, [x], None, ["hx"]
        if op == "batch_norm":
            stats = [values(r, [3], 1.0) for _ in range(3)]
            stats.append((np.abs(values(r, [3], 1.0)) + 0.1).astype(np.float32))
            weights = weight_specs(s=stats[0], b=stats[1], m=stats[2], v=stats[3])
            args += ["s", "b", "m", "v"]
        if op == "concat":  # an f32 model input as the second piece
            x2 = values(r, [2, 2, 5, 4], 1.0)
            ins["x2"] = spec(x2)
            arrays.append(x2)
            args.append("x2")
        nodes = [{"name": "hx", "op": "neg", "inputs": ["x"]},
                 dict({"name": "p", "op": op, "inputs": args}, **attrs),
                 {"name": "y", "op": "neg", "inputs": ["p"]}]
        y = model_yaml("f16uncast", ins, nodes, ["y"], weights)
        # batch norm's own kernel: without the rewrite to x * a + b, which
        # would join the negations in one elementwise chain
        flags = ("--precision", "f16") + (("--no-fuse=patterns",) if op == "batch_norm" else ())
        prog = build_model(workdir, y, flags=flags)
        j = json.loads(kiln("inspect", Path(workdir) / "model.yaml", "--format", "json",
                            *flags).stdout)
        nodes_run = [d["node"] for d in j["dispatches"]]
        check(not [n for n in nodes_run if "/to_f" in n], f"casts among {nodes_run}")
        dt = {t["name"]: t["dtype"] for t in j["tensors"]}
        check(dt["hx"] == "f16" and dt["p"] == result_dtype,
              f"hx {dt['hx']}, p {dt['p']}: want f16 and {result_dtype}")
        others = stats if op == "batch_norm" else [half(a) for a in arrays[1:]]
        want = -reference(-half(x), *others)
        got, = run_program(prog, arrays, [want.astype(np.float32)])
        assert_relative(got, want, 2e-3, "output")
    return test


F16_UNCAST = [  # op, attrs, reference over f64 operands, the op's result dtype
    ("reduce_sum", {"axes": [1, 3]}, lambda x: x.sum(axis=(1, 3), keepdims=True), "f32"),
    ("reduce_l2", {"axes": [2], "keep_dims": 0},
     lambda x: np.sqrt((x * x).sum(axis=2)), "f32"),
    ("reduce_log_sum_exp", {"axes": [3]},
     lambda x: np.log(np.exp(x).sum(axis=3, keepdims=True)), "f32"),
    ("batch_norm", {}, lambda x, s, b, m, v: ref.batch_norm(x, s, b, m, v), "f16"),
    ("concat", {"axis": 1}, lambda x, x2: np.concatenate([x, x2], 1), "f16"),
    ("resize", {"mode": "nearest", "scales": [1, 1, 2, 2],
                "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
     lambda x: x.repeat(2, axis=2).repeat(2, axis=3), "f16"),
    ("resize", {"mode": "linear", "scales": [1, 1, 2, 2],
                "coordinate_transformation_mode": "align_corners"},
     lambda x: ref.resize(x, [x.shape[0], x.shape[1], 2 * x.shape[2], 2 * x.shape[3]],
                          "linear", "align_corners"), "f16"),
]

for _op, _attrs, _ref, _dt in F16_UNCAST:
    case(f"op {_op} {_attrs.get('mode', '')} --precision f16: no cast dispatch, result {_dt}")(
        f16_uncast_case(_op, _attrs, _ref, _dt))


@case("op reduce_sum --precision f16 --io f16: the f16 output written by the sum itself")
def _(workdir):
    r = rng(2612)
    x = values(r, [3, 40, 50], 1.0)
    node = {"name": "y", "op": "reduce_sum", "inputs": ["x"], "axes": [2], "keep_dims": 0}
    flags = ("--precision", "f16", "--io", "f16")
    prog = build_model(workdir, model_yaml("sum16", {"x": spec(x)}, [node], ["y"]), flags=flags)
    j = json.loads(kiln("inspect", Path(workdir) / "model.yaml", "--format", "json",
                        *flags).stdout)
    nodes_run = [d["node"] for d in j["dispatches"]]
    check(nodes_run == ["y"], f"dispatches {nodes_run}, expected the sum alone")
    want = half(x).sum(axis=2)
    got, = run_program(prog, [x.astype(np.float16)], [want.astype(np.float16)])
    assert_relative(got.astype(np.float64), want, 2e-3, "output")


ROI_ALIGNS = [  # x shape, rois, output, sampling, scale, mode, half_pixel, index dtype
    ([2, 3, 10, 12], 5, (3, 4), 0, 1.0, "avg", True, np.int64),
    ([1, 2, 16, 16], 4, (2, 2), 2, 0.5, "avg", False, np.int64),
    ([2, 4, 9, 11], 6, (3, 3), 0, 0.75, "max", True, np.int32),
    ([1, 1, 12, 8], 3, (5, 2), 3, 1.0, "max", False, np.int64),
]


def roi_align_case(i, xs, n, out, sampling, scale, mode, half, idt):
    def test(workdir):
        r = rng(2590 + i)
        x = values(r, xs)
        extent = np.array([xs[3], xs[2]]) / scale
        # regions inside, across the border and past it (samples reading 0)
        lo = r.uniform(-0.3, 0.9, [n, 2]) * extent
        rois = np.concatenate([lo, lo + r.uniform(0.05, 0.6, [n, 2]) * extent], 1)
        rois = rois.astype(np.float32)
        batch = r.integers(0, xs[0], n).astype(idt)
        want = ref.roi_align(x, rois, batch, *out, sampling, scale, mode, half)
        one_op(workdir, "roi_align", [x, rois, batch], want,
               {"output_height": out[0], "output_width": out[1], "sampling_ratio": sampling,
                "spatial_scale": scale, "mode": mode,
                "coordinate_transformation_mode": "half_pixel" if half else "output_half_pixel"},
               1e-5, 1e-5)
    return test


for i, c in enumerate(ROI_ALIGNS):
    case(f"op roi_align {c[0]} {c[1]} rois {c[2]} sampling {c[3]} scale {c[4]} {c[5]} "
         f"half_pixel {c[6]}")(roi_align_case(i, *c))


MAX_POOL_INDICES = [  # x shape, attrs; small integers, so windows have equal maxima
    ([2, 3, 9], {"kernel": [3], "strides": [2], "pads": [1, 1]}),
    ([1, 2, 7, 6], {"kernel": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1}),
    ([1, 2, 7, 6], {"kernel": [3, 2], "strides": [2, 1], "storage_order": 1}),
    ([1, 1, 8, 8], {"kernel": [2, 2], "dilations": [2, 2], "storage_order": 1}),
    ([1, 2, 4, 5, 6], {"kernel": [2, 2, 3], "strides": [1, 2, 2], "storage_order": 1}),
]


def max_pool_indices_case(i, xs, attrs):
    def test(workdir):
        x = rng(2580 + i).integers(-4, 5, xs).astype(np.float32)
        geom = (attrs["kernel"], attrs.get("strides"), attrs.get("pads"),
                attrs.get("dilations"), attrs.get("ceil_mode", 0))
        want = [ref.pool(x, attrs["kernel"], "max", *geom[1:]),
                ref.max_pool_indices(x, *geom, column_major=attrs.get("storage_order", 0))]
        node = dict({"name": "p", "op": "max_pool", "inputs": ["x"], "outputs": ["y", "i"]},
                    **attrs)
        got = run_model(workdir, model_yaml("mpi", {"x": spec(x)}, [node], ["y", "i"]), [x],
                        want)
        assert_close(got[0], want[0], 0, 0)
        bad = got[1] != want[1]
        check(not bad.any(), f"{int(bad.sum())} of {bad.size} indices differ; first at "
              f"{np.argwhere(bad)[0].tolist() if bad.any() else None}")
    return test


for i, c in enumerate(MAX_POOL_INDICES):
    case(f"op max_pool with indices {c[0]} {c[1]}")(max_pool_indices_case(i, *c))


@case("op resize tf_crop_and_resize (linear and nearest; a region past the input's edge)")
def _(workdir):
    x = values(rng(2578), [1, 2, 6, 7])
    for mode, roi in (("linear", [0, 0, 0.2, 0.1, 1, 1, 0.9, 0.7]),
                      ("nearest", [0, 0, -0.3, 0.4, 1, 1, 0.8, 1.4])):
        want = ref.resize(x, [1, 2, 4, 5], mode, "tf_crop_and_resize", "round_prefer_floor",
                          None, roi, 2.5)
        one_op(workdir, "resize", [x], want,
               {"sizes": [1, 2, 4, 5], "mode": mode, "roi": roi, "extrapolation_value": 2.5,
                "coordinate_transformation_mode": "tf_crop_and_resize"}, 1e-5, 1e-5)


@case("op global_avg_pool and global_max_pool [2, 3, 5, 4]")
def _(workdir):
    x = values(rng(2560), [2, 3, 5, 4])
    one_op(workdir, "global_avg_pool", [x], x.astype(np.float64).mean((2, 3), keepdims=True),
           None, 1e-6, 1e-6)


@case("op global_max_pool [1, 4, 3, 3, 2]")
def _(workdir):
    x = values(rng(2561), [1, 4, 3, 3, 2])
    one_op(workdir, "global_max_pool", [x], x.max((2, 3, 4), keepdims=True))


RESIZES = [  # x shape, attrs (scales or sizes), mode, coord, nearest
    ([1, 1, 3, 4], {"scales": [1, 1, 2, 2]}, "nearest", "asymmetric", "floor"),
    ([1, 2, 4, 4], {"scales": [1, 1, 2, 2]}, "nearest", "half_pixel", "round_prefer_floor"),
    ([1, 2, 5, 3], {"sizes": [1, 2, 3, 7]}, "nearest", "half_pixel", "round_prefer_ceil"),
    ([1, 2, 4, 4], {"scales": [1, 1, 2, 2]}, "linear", "half_pixel", None),
    ([1, 1, 3, 5], {"sizes": [1, 1, 7, 4]}, "linear", "align_corners", None),
    ([2, 3, 6], {"scales": [1, 1, 0.5]}, "linear", "pytorch_half_pixel", None),
    ([1, 1, 4, 6], {"sizes": [1, 1, 5, 9]}, "linear", "asymmetric", None),
    ([1, 1, 5, 5], {"scales": [1, 1, 1.5, 0.6]}, "nearest", "asymmetric", "ceil"),
    ([1, 2, 5, 7], {"scales": [1, 1, 1.7, 0.45]}, "linear", "half_pixel_symmetric", None),
    ([1, 1, 6, 5], {"scales": [1, 1, 1.3, 1.9]}, "nearest", "half_pixel_symmetric",
     "round_prefer_ceil"),
    # both: the output's sizes, and the scale that maps coordinates (ONNX's
    # keep_aspect_ratio_policy gives a common scale and rounds the sizes)
    ([1, 1, 4, 6], {"sizes": [1, 1, 3, 4], "scales": [1, 1, 0.7, 0.7]}, "linear",
     "half_pixel", None),
]


def resize_case(i, xs, geom, mode, coord, nearest):
    def test(workdir):
        x = values(rng(2570 + i), xs)
        if "sizes" in geom:
            out, scales = geom["sizes"], geom.get("scales")
        else:
            scales = geom["scales"]
            out = [int(np.floor(n * s)) for n, s in zip(xs, scales)]
        attrs = dict(geom, mode=mode, coordinate_transformation_mode=coord)
        if nearest:
            attrs["nearest_mode"] = nearest
        want = ref.resize(x, out, mode, coord, nearest or "round_prefer_floor",
                          [np.float32(s) for s in scales] if scales else None)
        one_op(workdir, "resize", [x], want, attrs, 1e-5, 1e-5)
    return test


for i, c in enumerate(RESIZES):
    case(f"op resize {c[0]} {c[1]} {c[2]} {c[3]} {c[4]}")(resize_case(i, *c))


GRID_SAMPLES = [  # x shape, grid's output extents, mode, padding_mode, align_corners
    ([2, 3, 5, 6], [4, 7], "linear", "zeros", 0),
    ([1, 2, 4, 5], [6, 3], "linear", "border", 1),
    ([1, 2, 5, 4], [5, 5], "linear", "reflection", 0),
    ([2, 1, 6, 5], [4, 4], "nearest", "zeros", 1),
    ([1, 3, 5, 5], [3, 6], "nearest", "reflection", 1),
    ([1, 2, 4, 6], [5, 4], "nearest", "border", 0),
    ([1, 2, 6, 5], [4, 5], "cubic", "zeros", 0),
    ([1, 1, 5, 6], [5, 3], "cubic", "border", 1),
    ([2, 2, 4, 4], [3, 4], "cubic", "reflection", 0),
    ([2, 3, 9], [7], "linear", "reflection", 1),                 # 1-D
    ([1, 2, 3, 4, 5], [2, 3, 4], "linear", "zeros", 0),         # 3-D
    ([1, 2, 4, 3, 5], [3, 2, 3], "nearest", "border", 1),
    ([1, 1, 1, 6], [3, 4], "linear", "reflection", 1),          # an axis of one pixel
]


def grid_sample_case(i, xs, outs, mode, padding, align):
    def test(workdir):
        r = np.random.default_rng(2700 + i)
        x = values(r, xs)
        # coordinates past the borders, and exact pixel centres and half-way
        # points (where nearest rounds half to even)
        grid = r.uniform(-1.7, 1.7, [xs[0], *outs, len(xs) - 2]).astype(np.float32)
        flat = grid.reshape(-1)
        flat[::5] = np.float32(0.5) * r.integers(-4, 5, flat[::5].shape)
        want = ref.grid_sample(x, grid, mode, padding, bool(align))
        one_op(workdir, "grid_sample", [x, grid], want,
               {"mode": mode, "padding_mode": padding, "align_corners": align}, 1e-5, 1e-5)
    return test


for i, c in enumerate(GRID_SAMPLES):
    case(f"op grid_sample {c[0]} {c[1]} {c[2]} {c[3]} align {c[4]}")(grid_sample_case(i, *c))


# ---- a grouped convolution writing channels last (optimize.c: a transpose
# to channels last after it, epi_perm; conv.comp's Y_CLAST): ConvNeXt's
# depthwise convolution, then its layer norm over the channels. A
# convolution of one group (a product) keeps the transpose. ----

def conv_channels_last_case(xs, group, precision, fused, then="layer_norm"):
    """then: what reads the channels-last result: a layer norm, or "add"
    (an elementwise add with another tensor, which must read what the
    convolution's dispatch wrote)."""
    def test(workdir):
        r = rng(2590 + len(xs) + group)
        c = xs[1]
        x = values(r, xs, 1.0)
        w = values(r, [c, c // group] + [3] * (len(xs) - 2), 0.5)
        b, gamma, beta = values(r, [c], 1.0), values(r, [c], 1.0), values(r, [c], 1.0)
        perm = [0] + list(range(2, len(xs))) + [1]
        pads = [1] * (2 * (len(xs) - 2))
        nodes = [{"name": "c", "op": "conv", "inputs": ["x", "w", "b"], "group": group,
                  "pads": pads},
                 {"name": "t", "op": "transpose", "inputs": ["c"], "perm": perm}]
        ins = {"x": spec(x)}
        other = values(r, [xs[0]] + xs[2:] + [c], 1.0)
        if then == "add":
            nodes.append({"name": "y", "op": "add", "inputs": ["t", "r"]})
            ins["r"] = spec(other)
        else:
            nodes.append({"name": "y", "op": "layer_norm", "inputs": ["t", "gamma", "beta"]})
        y = model_yaml("clast", ins, nodes, ["y"], weight_specs(w=w, b=b, gamma=gamma, beta=beta))
        f16 = precision == "f16"
        prog = build_model(workdir, y, flags=("--precision", "f16") if f16 else ())
        q = half if f16 else np.asarray
        conv = ref.conv(q(x), q(w), b, pads=pads, group=group)
        if then == "add":
            want = np.transpose(q(conv), perm) + other
            got, = run_program(prog, [x, other], [want.astype(np.float32)])
        else:
            want = ref.layer_norm(np.transpose(q(conv), perm), gamma, beta)
            got, = run_program(prog, [x], [want.astype(np.float32)])
        assert_close(got, want, 2e-2 if f16 else 1e-4, 2e-2 if f16 else 1e-4)
        text = (Path(workdir) / "model.c").read_text()
        check(("c + t (conv)" in text) == fused,
              "the transpose is " + ("not " if fused else "") + "in the convolution's dispatch")
        if fused:
            check(any(d.get("Y_CLAST") == "1" for d in kernel_defines(workdir)),
                  "no kernel writes channels last")
    return test


for xs, group, prec, fused in [([2, 8, 7, 6], 8, "f32", True), ([2, 8, 7, 6], 8, "f16", True),
                               ([1, 6, 20], 3, "f32", True), ([2, 24, 5, 4], 1, "f32", False)]:
    case(f"op conv x={xs} group={group} then a transpose to channels last, {prec}")(
        conv_channels_last_case(xs, group, prec, fused))
case("op conv x=[2, 8, 7, 6] group=8 then a transpose to channels last read by an add")(
    conv_channels_last_case([2, 8, 7, 6], 8, "f32", True, "add"))


# ---- conv.comp's tiled depthwise path (DW_TILE, KILN_DWCONV): the window
# and weights of a tile's channels in shared memory. Channels not a multiple
# of the tile's, positions not a multiple of its rows and columns, strides,
# dilations, asymmetric pads, 1 and 2 axes, several images, f16, the fused
# epilogue (bias, residual, activation) and a transpose to channels last;
# a tile whose window does not fit keeps the direct path. ----

def depthwise_tiled_case(xs, k, attrs, tile="", precision="f32", then=None, tiled=True):
    """then: None, "res_relu" (a residual add and a relu fused) or "clast"
    (a transpose to channels last fused, then a layer norm)."""
    def test(workdir):
        r = rng(2700 + sum(xs) + k)
        c, nsp = xs[1], len(xs) - 2
        x = values(r, xs, 1.0)
        w = values(r, [c, 1] + [k] * nsp, 0.5)
        b = values(r, [c], 1.0)
        nodes = [{"name": "c", "op": "conv", "inputs": ["x", "w", "b"], "group": c, **attrs}]
        a = conv_geometry(xs, [c, 1] + [k] * nsp, attrs)
        f16 = precision == "f16"
        q = half if f16 else np.asarray
        conv = ref.conv(q(x), q(w), b, a.get("strides"), a.get("pads"), a.get("dilations"), c)
        ins, feeds, weights = {"x": spec(x)}, [x], weight_specs(w=w, b=b)
        want = conv
        if then == "res_relu":
            res = values(r, list(conv.shape), 1.0)
            nodes += [{"name": "s", "op": "add", "inputs": ["c", "res"]},
                      {"name": "y", "op": "relu", "inputs": ["s"]}]
            ins["res"] = spec(res)
            feeds.append(res)
            want = np.maximum(q(conv) + res, 0)
        elif then == "clast":
            perm = [0] + list(range(2, len(xs))) + [1]
            gamma, beta = values(r, [c], 1.0), values(r, [c], 1.0)
            nodes += [{"name": "t", "op": "transpose", "inputs": ["c"], "perm": perm},
                      {"name": "y", "op": "layer_norm", "inputs": ["t", "gamma", "beta"]}]
            weights = weight_specs(w=w, b=b, gamma=gamma, beta=beta)
            want = ref.layer_norm(np.transpose(q(conv), perm), gamma, beta)
        else:
            nodes[0]["name"] = "y"
        y = model_yaml("dw", ins, nodes, ["y"], weights)
        prog = build_model(workdir, y, flags=("--precision", "f16") if f16 else (),
                           env={"KILN_DWCONV": tile} if tile else None)
        got, = run_program(prog, feeds, [want.astype(np.float32)])
        tol = 2e-2 if f16 else 1e-4
        assert_close(got, want, tol, tol)
        dws = [d for d in kernel_defines(workdir) if d.get("DW_TILE") == "1"]
        check(len(dws) == (1 if tiled else 0), f"tiled depthwise kernels: {dws}")
        if then == "clast":
            check(dws and dws[0].get("Y_CLAST") == "1", "the transpose is not fused")
        if then == "res_relu":
            check(dws and dws[0].get("HAS_RES") == "1", "the residual is not fused")
    return test


# tile "" is the default (tiled at unit strides with 49 taps or 1024
# positions, 8 x 8 of 8 channels, two outputs of a row an invocation), "0"
# the direct kernel, TH,TW,CB[,PX] forced at any strides and sizes
for xs, k, attrs, tile, prec, then, tiled in [
        ([2, 20, 19, 17], 7, {"pads": [3, 3, 3, 3]}, "", "f32", None, True),    # ConvNeXt's
        ([2, 20, 19, 17], 7, {"pads": [3, 3, 3, 3]}, "0", "f32", None, False),
        ([1, 5, 13, 11], 3, {"strides": [2, 2], "dilations": [2, 1], "pads": [2, 0, 1, 2]},
         "4,8,4", "f32", None, True),
        ([1, 5, 13, 23], 3, {"strides": [1, 2], "dilations": [2, 2], "pads": [2, 0, 1, 2]},
         "4,8,4,4", "f32", None, True),
        ([1, 6, 12, 12], 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "", "f32", None, False),
        ([1, 12, 1030], 4, {"pads": [3, 0]}, "", "f32", None, True),           # 1-D (causal)
        ([1, 12, 100], 3, {"pads": [1, 1], "dilations": [3]}, "1,16,4,8", "f32", None, True),
        ([1, 9, 10, 12], 5, {"pads": [2, 2, 2, 2]}, "3,5,2", "f32", "res_relu", True),
        ([1, 9, 33, 32], 5, {"pads": [2, 2, 2, 2]}, "", "f32", "res_relu", True),
        ([2, 24, 15, 14], 7, {"pads": [3, 3, 3, 3]}, "", "f16", "clast", True),
        ([2, 24, 15, 14], 7, {"pads": [3, 3, 3, 3]}, "8,8,16,4", "f16", "clast", True),
        ([1, 40, 34, 31], 3, {"pads": [1, 1, 1, 1]}, "", "f16", None, True),
        ([1, 40, 9, 9], 3, {"pads": [1, 1, 1, 1]}, "", "f16", None, False),   # small: direct
        ([1, 4, 40, 40], 31, {"pads": [15, 15, 15, 15]}, "64,64,1", "f32", None, False)]:
    case(f"op conv depthwise tiled (KILN_DWCONV={tile or 'unset'}) x={xs} k={k} {attrs}, {prec}"
         f"{', ' + then if then else ''}{'' if tiled else ': direct'}")(
        depthwise_tiled_case(xs, k, attrs, tile, prec, then, tiled))
