"""test_ops_attention.py: attention (shaders/attention.comp, and
shaders/flash.comp for 8 or more query rows) and rope, on Vulkan against the
CPU reference (ops_common.py says how).
"""
import json
from pathlib import Path

import numpy as np

import reference as ref
from harness import (assert_close, build_model, check, kiln, model_yaml, registry,
                     run_program, run_steps)
from ops_common import one_op, rng, spec, values

TESTS, case = registry()


# ---- attention and rope ----

ATTENTIONS = [  # layout, B, H, KVH, Sq, Sk, D, DV, attrs, mask shape
    ("bhsd", 1, 2, 2, 5, 5, 8, 8, {}, None),
    ("bhsd", 2, 4, 2, 7, 7, 16, 16, {"causal": 1}, None),  # grouped-query
    ("bhsd", 1, 2, 1, 3, 9, 8, 4, {"causal": 1}, None),    # Sq < Sk (a KV cache)
    ("bshd", 2, 4, 4, 6, 6, 8, 8, {"scale": 0.3}, None),
    ("bshd", 1, 6, 2, 5, 5, 4, 4, {"causal": 1, "window": 3}, None),
    ("bhsd", 2, 2, 2, 4, 6, 8, 8, {"softcap": 5.0, "scale": 1.0}, [2, 1, 1, 6]),
    ("bhsd", 1, 2, 2, 300, 300, 64, 64, {"causal": 1}, [300, 300]),  # long rows
    ("bshd", 1, 2, 1, 1, 40, 32, 32, {}, [1, 40]),  # one query row, decode
    # few rows, many keys: the keys split into spans (SPLITS), then combined
    ("bshd", 1, 4, 2, 1, 1000, 32, 16, {}, [1, 1000]),  # 8 spans, a masked span
    ("bhsd", 1, 2, 1, 3, 700, 16, 16, {"causal": 1, "window": 100}, None),  # empty spans
    ("bhsd", 2, 2, 2, 1, 260, 8, 8, {"causal": 1, "softcap": 3.0}, None),
    ("bhsd", 1, 2, 2, 4, 70, 6, 6, {}, None),  # D not a multiple of 4: keys read by floats
]


def attention_case(i, layout, B, H, KVH, Sq, Sk, D, DV, attrs, mshape, f16=False,
                   kernel=None, seed=2300, env=None, climb=0.0):
    """f16: q, k, v, the mask and the result stored f16 (as --precision f16
    stores them), the arithmetic f32; with a mask, a third of the way in,
    one key masked out. kernel: the family the dispatch must take (flash, attention), and
    flash's blocks (BQ, BK) as a (define, value) list. env: the compiler's
    (a kernel choice). climb: the mask rises by that much a key."""
    def test(workdir):
        r = rng((2500 if f16 else seed) + i)
        if layout == "bhsd":
            q, k, v = values(r, [B, H, Sq, D], 1), values(r, [B, KVH, Sk, D], 1), \
                values(r, [B, KVH, Sk, DV], 1)
        else:
            q, k, v = values(r, [B, Sq, H * D], 1), values(r, [B, Sk, KVH * D], 1), \
                values(r, [B, Sk, KVH * DV], 1)
        ins = [q, k, v]
        if mshape:
            ins.append(values(r, mshape, 2.0) + climb * np.arange(Sk, dtype=np.float32))
            if Sk >= 1000:  # one span of 125 keys (of 8) and one key more masked out
                ins[3][..., 250:376] = -np.inf
        if f16:
            ins = [x.astype(np.float16) for x in ins]
            if mshape:
                ins[3][..., Sk // 3] = -np.inf
        a = {"layout": layout}
        if layout == "bshd":
            a.update({"heads": H, "kv_heads": KVH})
        a.update(attrs)
        want = ref.attention(*ins[:3], ins[3] if mshape else None, layout,
                             H if layout == "bshd" else None, KVH if layout == "bshd" else None,
                             attrs.get("scale"), attrs.get("softcap", 0),
                             attrs.get("causal", 0), attrs.get("window", 0))
        out = attrs.get("out_layout", layout)
        if out != layout and layout == "bhsd":  # [B, H, Sq, DV] as [B, Sq, H * DV]
            want = want.transpose(0, 2, 1, 3).reshape(B, Sq, H * DV)
        elif out != layout:  # [B, Sq, H * DV] as [B, H, Sq, DV]
            want = want.reshape(B, Sq, H, DV).transpose(0, 2, 1, 3)
        want = np.ascontiguousarray(want)
        if f16:
            one_op(workdir, "attention", ins, want.astype(np.float16), a, 2e-3, 2e-3,
                   names=["q", "k", "v", "m"], env=env)
        else:
            one_op(workdir, "attention", ins, want, a, 1e-4, 1e-5, names=["q", "k", "v", "m"],
                   env=env)
        if kernel:
            check_kernel(workdir, *kernel, env=env)
    return test


# The output in the other layout (out_layout): flash's many rows and
# attention.comp's few, grouped-query heads, a mask, f32 and f16.
for _i, _c in enumerate([
        ("bhsd", 2, 4, 2, 12, 20, 16, 8, {"out_layout": "bshd"}, [2, 1, 12, 20]),
        ("bhsd", 1, 4, 4, 1, 33, 16, 16, {"out_layout": "bshd", "causal": 1}, None),
        ("bshd", 2, 4, 2, 9, 9, 8, 8, {"out_layout": "bhsd", "causal": 1}, None)]):
    for _f16 in (False, True):
        case(f"op attention {_c[0]} out_layout={_c[8]['out_layout']} B={_c[1]} H={_c[2]} "
             f"KVH={_c[3]} Sq={_c[4]} Sk={_c[5]}{' f16' if _f16 else ''}")(
            attention_case(140 + _i, *_c, f16=_f16))


# q, k and v at offsets in wider rows (head_dim, q_offset, k_offset,
# v_offset): a packed QKV product's [B, S, 3 * H * D] read in place (timm's
# ViTs), a fused grouped-query product [q | k | v], and q and k/v from
# different tensors with spare columns; flash.comp (8 or more rows),
# attention.comp's spans (few rows, many keys), f32 and f16.
PACKED = [  # B, Sq, Sk, H, KVH, D, (q row, q offset), (kv row, k offset, v offset), attrs,
            # one tensor for q, k and v
    (2, 37, 37, 3, 3, 16, (144, 0), (144, 48, 96), {}, True),
    (1, 20, 20, 4, 2, 8, (64, 0), (64, 32, 48), {"causal": 1}, True),
    (1, 3, 50, 2, 2, 8, (40, 8), (72, 0, 40), {"causal": 1}, False),
    (1, 1, 300, 4, 1, 32, (200, 64), (96, 8, 48), {}, False),
]


def packed_case(i, B, Sq, Sk, H, KVH, D, qrow, kvrow, attrs, one, f16):
    def test(workdir):
        r = rng(2700 + i)
        x = values(r, [B, Sk, kvrow[0]], 1)
        xq = x if one else values(r, [B, Sq, qrow[0]], 1)
        if f16:
            x, xq = x.astype(np.float16), xq.astype(np.float16)
        q = xq[:, :, qrow[1]:qrow[1] + H * D]
        k = x[:, :, kvrow[1]:kvrow[1] + KVH * D]
        v = x[:, :, kvrow[2]:kvrow[2] + KVH * D]
        want = ref.attention(q, k, v, None, "bshd", H, KVH, None, 0, attrs.get("causal", 0))
        node = dict({"name": "y", "op": "attention",
                     "inputs": ["x", "x", "x"] if one else ["xq", "x", "x"],
                     "layout": "bshd", "heads": H, "kv_heads": KVH, "head_dim": D,
                     "q_offset": qrow[1], "k_offset": kvrow[1], "v_offset": kvrow[2]}, **attrs)
        ins = {"x": spec(x)} if one else {"xq": spec(xq), "x": spec(x)}
        feeds = [x] if one else [xq, x]
        want = want.astype(np.float16) if f16 else want
        got, = run_program(build_model(workdir, model_yaml("packed", ins, [node], ["y"])),
                           feeds, [want])
        assert_close(got, want, 2e-3 if f16 else 1e-4, 2e-3 if f16 else 1e-5)
    return test


for _i, _c in enumerate(PACKED):
    for _f16 in (False, True):
        case(f"op attention bshd packed: B={_c[0]} Sq={_c[1]} Sk={_c[2]} H={_c[3]} "
             f"KVH={_c[4]} D={_c[5]} q at {_c[6][1]} of {_c[6][0]}, k, v at {_c[7][1]}, "
             f"{_c[7][2]} of {_c[7][0]} {_c[8]}{' f16' if _f16 else ''}")(
            packed_case(_i, *_c, _f16))


@case("op attention: head_dim and offsets refused where they do not fit (past the row, "
      "without head_dim, with layout bhsd)")
def _(workdir):
    x = {"x": {"dtype": "f32", "shape": [1, 4, 48]}}
    base = {"name": "y", "op": "attention", "inputs": ["x", "x", "x"], "layout": "bshd",
            "heads": 2}
    for extra, needle in (({"head_dim": 8, "v_offset": 36}, "pass the end of 'x''s rows of 48"),
                          ({"k_offset": 16}, "k_offset needs head_dim"),
                          ({"head_dim": 8, "layout": "bhsd"}, "takes attention with layout "
                                                              "bshd only")):
        y = model_yaml("bad", x, [dict(base, **extra)], ["y"])
        (Path(workdir) / "bad.yaml").write_text(y)
        r = kiln("compile", Path(workdir) / "bad.yaml", "-o", Path(workdir) / "bad.c")
        check(r.returncode == 1 and needle in r.stderr and "bad.yaml:" in r.stderr,
              f"{extra}: exit {r.returncode}: {r.stderr}")


def check_kernel(workdir, family, defines=(), env=None):
    """The model's one attention dispatch is of family, its kernel built
    with defines (the kernel's comment in the generated C lists them);
    env: the compiler's, as the model was built."""
    workdir = Path(workdir)
    r = kiln("inspect", workdir / "model.yaml", "--format", "json", env=env)
    check(r.returncode == 0, f"kiln inspect failed:\n{r.stderr}")
    d, = json.loads(r.stdout)["dispatches"]
    check(d["family"] == family, f"attention took {d['family']}, expected {family}")
    text = (workdir / "model.c").read_text()
    for name, value in defines:
        check(f" *   {name} {value}\n" in text, f"{family} not built with {name} {value}")


for i, c in enumerate(ATTENTIONS):
    case(f"op attention {c[0]} B={c[1]} H={c[2]} KVH={c[3]} Sq={c[4]} Sk={c[5]} D={c[6]} "
         f"DV={c[7]} {c[8]} mask={c[9]}")(attention_case(i, *c))

# A decoding step's row whose values are wider than the workgroup (DV 96 of
# 64 invocations: two components an invocation, the second of half of them
# past DV): its 20 keys' values loaded first (VPRE), one key masked out; its
# keys, 96 wide, after the query (40 values and 96 key elements: more than
# KPRE's 128)
def wide_values_case():
    inner = attention_case(100, "bhsd", 1, 2, 2, 1, 20, 96, 96, {"causal": 1}, [1, 20],
                           kernel=("attention", [("VPRE", 20)]), seed=2650)

    def test(workdir):
        inner(workdir)
        check(" *   KPRE 1\n" not in (Path(workdir) / "model.c").read_text(),
              "KPRE with 40 values and a 96-element key")
    return test


case("op attention bhsd B=1 H=2 KVH=2 Sq=1 Sk=20 D=96 DV=96 causal mask=[1, 20]: values "
     "loaded first (VPRE 20), two output components an invocation, the key not (KPRE)")(
    wide_values_case())

# flash.comp (8 or more query rows; lower_attention.c flash_tile): ragged
# blocks, many blocks, grouped queries, fewer queries than keys (causal
# from an offset), more queries than keys (rows that see nothing), D != DV
# and neither a multiple of 4 (rows padded to vec4s), a window with softcap,
# D = 128 in chunks of 16 keys, D = 256 in blocks of 8 rows of 8 invocations;
# and past what fits 32 KiB of shared memory, attention.comp again.
FLASH = [  # the ATTENTIONS fields, then kernel
    (("bhsd", 1, 3, 3, 37, 37, 64, 64, {}, None), ("flash", [("BQ", 16), ("BK", 64)])),
    (("bhsd", 1, 16, 4, 129, 129, 16, 16, {"causal": 1}, None),
     ("flash", [("BQ", 16), ("BK", 64)])),
    (("bshd", 2, 4, 2, 20, 29, 16, 24, {"causal": 1}, [2, 1, 20, 29]), ("flash", [("BK", 64)])),
    (("bhsd", 1, 2, 2, 40, 24, 8, 8, {"causal": 1}, None), ("flash", [])),
    (("bhsd", 1, 2, 1, 50, 50, 10, 13, {"causal": 1, "window": 7, "softcap": 4.0},
      [50, 50]), ("flash", [])),
    (("bhsd", 1, 2, 2, 16, 70, 128, 128, {}, None), ("flash", [("BK", 32)])),
    (("bhsd", 1, 2, 2, 21, 30, 256, 256, {"causal": 1}, None),
     ("flash", [("BQ", 8), ("BK", 16), ("TPR", 16)])),
    (("bhsd", 1, 1, 1, 8, 9, 512, 16, {}, None), ("attention", [])),
]
for i, (c, kernel) in enumerate(FLASH):
    case(f"op attention (flash) {c[0]} B={c[1]} H={c[2]} KVH={c[3]} Sq={c[4]} Sk={c[5]} "
         f"D={c[6]} DV={c[7]} {c[8]} mask={c[9]}")(
        attention_case(i, *c, kernel=kernel, seed=2600))


# flash.comp with groups of RM rows (KILN_FLASH=BQ,BK,TPR,RM; the compiler
# takes them where the blocks fill a large GPU, sequences longer than
# these): blocks and chunks left ragged, a mask, grouped queries in bshd
# with D != DV, a window with softcap, D = 256 with 8 lanes a group, D and
# DV not multiples of 4, and f16 storage.
FLASH_RM = [
    (("bhsd", 1, 3, 3, 75, 75, 64, 64, {"causal": 1}, [1, 1, 75, 75]), "32,32,16,4", False),
    (("bshd", 2, 4, 2, 37, 50, 32, 48, {}, None), "16,16,16,2", False),
    (("bhsd", 1, 2, 1, 40, 40, 128, 128, {"causal": 1, "window": 9, "softcap": 3.0}, None),
     "32,16,16,4", False),
    (("bhsd", 1, 2, 2, 21, 30, 256, 256, {"causal": 1}, None), "16,8,8,4", False),
    (("bhsd", 1, 2, 2, 33, 33, 10, 13, {"causal": 1}, None), "16,16,8,2", False),
    (("bshd", 1, 4, 2, 70, 70, 64, 64, {"causal": 1}, [1, 1, 70, 70]), "32,32,16,4", True),
]
for i, (c, tile, f16) in enumerate(FLASH_RM):
    bq, bk, tpr, rm = tile.split(",")
    case(f"op attention (flash, {rm} rows a group) {c[0]} B={c[1]} H={c[2]} KVH={c[3]} "
         f"Sq={c[4]} Sk={c[5]} D={c[6]} DV={c[7]} {c[8]} mask={c[9]}{' f16' if f16 else ''}")(
        attention_case(i + 80, *c, f16=f16, env={"KILN_FLASH": tile, "KILN_FLASH_CM": "0"},
                       kernel=("flash", [("BQ", int(bq)), ("BK", int(bk)), ("TPR", int(tpr)),
                                         ("RM", int(rm))]), seed=2650))


def spans_case(split_last, vpre=True):
    """Few query rows, many keys: each row's keys in spans, whose parts the
    row's last span workgroup combines (COMBINE_LAST: one dispatch), or
    with KILN_SPLIT_LAST=0 a second dispatch; three runs of other inputs in
    one program (the counters set back, no stale parts)."""
    def test(workdir):
        r = rng(2700)
        B, H, KVH, Sq, Sk, D = 1, 4, 2, 1, 900, 32
        steps = [[values(r, [B, H, Sq, D], 1), values(r, [B, KVH, Sk, D], 1),
                  values(r, [B, KVH, Sk, D], 1)] for _ in range(3)]
        y = model_yaml("attn", {n: spec(x) for n, x in zip("qkv", steps[0])},
                       [{"name": "y", "op": "attention", "inputs": ["q", "k", "v"],
                         "layout": "bhsd"}], ["y"])
        env = {} if split_last else {"KILN_SPLIT_LAST": "0"}
        if not vpre:
            env["KILN_ATTN_VPRE"] = "0"
        prog = build_model(workdir, y, env=env)
        r = kiln("inspect", Path(workdir) / "model.yaml", "--format", "json", env=env)
        check(r.returncode == 0, f"kiln inspect failed:\n{r.stderr}")
        fams = [d["family"] for d in json.loads(r.stdout)["dispatches"]]
        check(fams == ["attention"] * (1 if split_last else 2),
              f"dispatches {fams}, expected {'one' if split_last else 'two'}")
        text = (Path(workdir) / "model.c").read_text()
        check((" *   COMBINE_LAST 1\n" in text) == split_last, "COMBINE_LAST")
        # 16 spans of 57 keys (the last 45): each span's values and keys
        # loaded first (VPRE, KPRE), or eight keys' values at a time
        check((" *   VPRE 57\n" in text) == vpre, "VPRE 57")
        check((" *   KPRE 1\n" in text) == vpre, "KPRE 1")
        wants = [ref.attention(q, k, v, None, "bhsd", None, None, None, 0, 0, 0)
                 for q, k, v in steps]
        for s, (got, want) in enumerate(zip(run_steps(prog, steps, [wants[0]]), wants)):
            assert_close(got[0], want, 1e-4, 1e-5, f"run {s}")
    return test


case("op attention spans (one query row, 900 keys) combined by each row's last span "
     "workgroup, three runs")(spans_case(True))
case("op attention spans with KILN_SPLIT_LAST=0: the combining pass, three runs")(
    spans_case(False))
case("op attention spans with KILN_ATTN_VPRE=0: each span's values loaded eight keys at a "
     "time after its scores, three runs")(spans_case(True, vpre=False))

ROPES = [([2, 3, 6, 8], {}), ([2, 3, 6, 8], {"interleaved": 1}),
         ([1, 5, 2, 16], {"n_rot": 8, "seq_axis": 1}),
         ([1, 2, 7, 10], {"n_rot": 6, "interleaved": 1})]


def rope_case(i, shape, attrs):
    def test(workdir):
        r = rng(2400 + i)
        x = values(r, shape)
        axis = attrs.get("seq_axis", -2)
        rot = attrs.get("n_rot", shape[-1])
        pos = np.arange(shape[axis])[:, None] * (10000.0 ** (-np.arange(rot // 2) / (rot // 2)))
        cos, sin = np.cos(pos).astype(np.float32), np.sin(pos).astype(np.float32)
        want = ref.rope(x, cos, sin, attrs.get("interleaved", 0), attrs.get("n_rot"), axis)
        one_op(workdir, "rope", [x, cos, sin], want, attrs, 1e-5, 1e-5)
    return test


for i, (shape, attrs) in enumerate(ROPES):
    case(f"op rope {shape} {attrs}")(rope_case(i, shape, attrs))


# f16 storage: one row a head with spans, and prefills (flash.comp).
ATTENTIONS_F16 = [("bshd", 1, 4, 2, 1, 300, 32, 32, {"causal": 1}, [1, 300]),
                  ("bhsd", 1, 2, 1, 9, 9, 16, 16, {"causal": 1}, [9, 9]),
                  ("bshd", 1, 4, 2, 33, 40, 64, 64, {"causal": 1}, [33, 40])]
for i, c in enumerate(ATTENTIONS_F16):
    case(f"op attention f16 storage {c[0]} H={c[2]} KVH={c[3]} Sq={c[4]} Sk={c[5]}")(
        attention_case(i, *c, f16=True))


def check_flash_cm(workdir, nsg):
    """The model's attention is flash_cm.comp (built with NSG nsg) for
    devices with cooperative matrices, flash.comp its variant for the
    others (lavapipe runs that one; a GPU with them the first)."""
    r = kiln("inspect", Path(workdir) / "model.yaml", "--format", "json")
    check(r.returncode == 0, f"kiln inspect failed:\n{r.stderr}")
    fams = [d["family"] for d in json.loads(r.stdout)["dispatches"]]
    check(fams == ["flash_cm", "flash"], f"dispatches {fams}, expected flash_cm, flash")
    check(f" *   NSG {nsg}\n" in (Path(workdir) / "model.c").read_text(),
          f"flash_cm not built with NSG {nsg}")


# f16 prefills whose D and DV are multiples of 16 compile to flash_cm.comp
# (the matrix units) as well: ragged blocks and chunks of keys, grouped
# queries, two batches in the bshd layout with D != DV and a mask, fewer
# queries than keys (causal from an offset), rows that see no key, a window
# with softcap (8 subgroups a block; at D = 64 40 KiB of shared memory, the
# dispatch needing 48 KiB), D = 128 (4) and DV = 256 (2).
FLASH_CM = [
    (("bhsd", 1, 3, 3, 37, 37, 64, 64, {}, None), 8),
    (("bhsd", 1, 16, 4, 129, 129, 16, 16, {"causal": 1}, None), 8),
    (("bshd", 2, 4, 2, 20, 29, 16, 32, {"causal": 1}, [2, 1, 20, 29]), 8),
    (("bhsd", 1, 2, 2, 40, 24, 32, 32, {"causal": 1}, None), 8),
    (("bhsd", 1, 2, 1, 50, 50, 16, 48, {"causal": 1, "window": 7, "softcap": 4.0}, [50, 50]),
     8),
    (("bhsd", 1, 2, 2, 16, 70, 128, 128, {}, None), 4),
    (("bhsd", 1, 1, 1, 20, 33, 16, 256, {}, [20, 33]), 2),
]


def flash_cm_case(i, c, nsg):
    run = attention_case(i + 10, *c, f16=True)

    def test(workdir):
        run(workdir)
        check_flash_cm(workdir, nsg)
    return test


for i, (c, nsg) in enumerate(FLASH_CM):
    case(f"op attention f16 storage (flash_cm) {c[0]} B={c[1]} H={c[2]} KVH={c[3]} Sq={c[4]} "
         f"Sk={c[5]} D={c[6]} DV={c[7]} {c[8]} mask={c[9]}")(flash_cm_case(i, c, nsg))


# Scores that climb key after key (a mask rising by 0.75 a key, 12 a
# chunk of 16): every chunk passes the rows' references by more than
# flash_cm's and flash_rows' RESCALE, so their accumulators are rescaled
# at each chunk (random scores do it at the first only). lavapipe runs
# flash.comp; the NVIDIA run the kernel named.
for _i, (_fam, _env) in enumerate((("flash_cm", None), ("flash_rows", {"KILN_FLASH_ROWS": "1"}))):
    def _climb_case(i=_i, fam=_fam, env=_env):
        c = ("bhsd", 1, 2, 2, 70, 90, 32, 32, {"causal": 1}, [1, 1, 70, 90])
        run = attention_case(60 + i, *c, f16=True, env=env, climb=0.75)

        def test(workdir):
            run(workdir)
            r = kiln("inspect", Path(workdir) / "model.yaml", "--format", "json", env=env)
            check(r.returncode == 0, f"kiln inspect failed:\n{r.stderr}")
            fams = [d["family"] for d in json.loads(r.stdout)["dispatches"]]
            check(fams == [fam, "flash"], f"dispatches {fams}, expected {fam}, flash")
        return test
    case(f"op attention f16 storage ({_fam}) scores climbing a key: rescaled each chunk")(
        _climb_case())


# The same on flash_rows.comp (the long sequences' kernel: blocks of 16 *
# NSG rows, each chunk of keys loaded once for them), forced by
# KILN_FLASH_ROWS=1 at these short ones: ragged blocks and chunks, grouped
# queries, two batches in bshd with D != DV and a mask, fewer queries than
# keys and rows that see no key, a window with softcap (the subgroups that
# skip chunks), D = 128, and D = 256 (queries in shared memory, two
# subgroups, the values in two slices of 128). lavapipe runs flash.comp;
# the NVIDIA run of the attention tests runs flash_rows.
FLASH_ROWS = [
    (("bhsd", 1, 3, 3, 70, 45, 64, 64, {}, None), 4, 2),
    (("bhsd", 1, 4, 2, 129, 129, 16, 16, {"causal": 1}, None), 4, 2),
    (("bshd", 2, 4, 2, 20, 29, 16, 32, {"causal": 1}, [2, 1, 20, 29]), 4, 2),
    (("bhsd", 1, 2, 2, 40, 24, 32, 32, {"causal": 1}, None), 4, 2),
    (("bhsd", 1, 2, 1, 90, 90, 16, 48, {"causal": 1, "window": 7, "softcap": 4.0}, [90, 90]),
     4, 2),
    (("bhsd", 1, 2, 2, 70, 70, 128, 128, {}, None), 4, 2),
    (("bhsd", 1, 1, 1, 40, 33, 256, 256, {"causal": 1}, [40, 33]), 2, 1),
]


def flash_rows_case(i, c, nsg, kf):
    run = attention_case(i + 30, *c, f16=True, env={"KILN_FLASH_ROWS": "1"})

    def test(workdir):
        run(workdir)
        r = kiln("inspect", Path(workdir) / "model.yaml", "--format", "json",
                 env={"KILN_FLASH_ROWS": "1"})
        check(r.returncode == 0, f"kiln inspect failed:\n{r.stderr}")
        fams = [d["family"] for d in json.loads(r.stdout)["dispatches"]]
        check(fams == ["flash_rows", "flash"], f"dispatches {fams}, expected flash_rows, flash")
        text = (Path(workdir) / "model.c").read_text()
        for name, value in (("NSG", nsg), ("KF", kf)):
            check(f" *   {name} {value}\n" in text, f"flash_rows not built with {name} {value}")
    return test


for i, (c, nsg, kf) in enumerate(FLASH_ROWS):
    case(f"op attention f16 storage (flash_rows) {c[0]} B={c[1]} H={c[2]} KVH={c[3]} "
         f"Sq={c[4]} Sk={c[5]} D={c[6]} DV={c[7]} {c[8]} mask={c[9]}")(
        flash_rows_case(i, c, nsg, kf))


@case("op attention f16: a long sequence's blocks fill the GPU: flash_rows.comp, not flash_cm")
def _(workdir):
    """The kernel follows the blocks' count: 32 heads of 257 rows give 160
    blocks of 64 (flash_rows), 8 heads 40 (flash_cm), at heads of 64 and of
    128; KILN_FLASH_ROWS=0, flash_cm (=auto, the default's rule)."""
    for heads, d, fam, env in ((32, 64, "flash_rows", None), (8, 64, "flash_cm", None),
                               (32, 128, "flash_rows", None), (8, 128, "flash_cm", None),
                               (32, 64, "flash_rows", "auto"), (32, 128, "flash_cm", "0")):
        y = Path(workdir) / f"h{heads}_{d}.yaml"
        spec = f"{{dtype: f16, shape: [1, {heads}, 257, {d}]}}"
        y.write_text(f"name: a\ninputs:\n  q: {spec}\n  k: {spec}\n  v: {spec}\nnodes:\n"
                     "  - {name: y, op: attention, inputs: [q, k, v], outputs: [y]}\n"
                     "outputs: [y]\n")
        r = kiln("inspect", y, "--format", "json", env={"KILN_FLASH_ROWS": env} if env else None)
        check(r.returncode == 0, f"kiln inspect failed:\n{r.stderr}")
        fams = [d["family"] for d in json.loads(r.stdout)["dispatches"]]
        check(fams == [fam, "flash"], f"{heads} heads of {d}, KILN_FLASH_ROWS={env}: "
              f"dispatches {fams}, expected {fam}, flash")


@case("op rope f16 storage [1, 5, 2, 16] seq_axis 1: x and the result f16, f32 tables")
def _(workdir):
    r = rng(2450)
    x = values(r, [1, 5, 2, 16]).astype(np.float16)
    ang = r.uniform(-3, 3, (5, 8))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    want = ref.rope(x, cos, sin, 0, None, 1).astype(np.float16)
    one_op(workdir, "rope", [x, cos, sin], want, {"seq_axis": 1}, 2e-3, 2e-3)
