"""test_ops_select.py: topk, nms, sample, selective_scan (shaders/topk.comp,
nms.comp, sample.comp, scan.comp), on Vulkan against the CPU reference
(ops_common.py says how).
"""
import numpy as np

import reference as ref
from harness import (assert_close, build_model, check, kernel_defines, model_yaml, registry,
                     run_model, run_program)
from ops_common import one_op, rng, spec, values

TESTS, case = registry()


# ---- topk, sample, selective_scan ----

TOPKS = [([7], 3, -1, 1), ([4, 50], 5, 1, 1), ([4, 50], 4, 1, 0), ([6, 5, 3], 2, 0, 1),
         ([3, 2000], 8, -1, 1), ([2, 9], 9, -1, 0)]


def topk_case(i, shape, k, axis, largest):
    def test(workdir):
        x = rng(2600 + i).integers(-6, 7, size=shape).astype(np.float32)  # ties
        wv, wi = ref.topk(x, k, axis, largest)
        node = {"name": "t", "op": "topk", "inputs": ["x"], "k": k, "axis": axis,
                "largest": largest, "outputs": ["v", "i"]}
        y = model_yaml("topk", {"x": spec(x)}, [node], ["v", "i"])
        gv, gi = run_model(workdir, y, [x], [wv, wi])
        assert_close(gv, wv, 0, 0, "values")
        check_equal(gi, wi, "indices")
    return test


def check_equal(got, want, what):
    from harness import Failure
    if got.shape != want.shape or (got != want).any():
        bad = np.argwhere(got != want)[0] if got.shape == want.shape else None
        raise Failure(f"{what}: differ at {bad}: got {got[tuple(bad)] if bad is not None else got.shape}"
                      f", expected {want[tuple(bad)] if bad is not None else want.shape}")


for i, c in enumerate(TOPKS):
    case(f"op topk {c[0]} k={c[1]} axis={c[2]} largest={c[3]}")(topk_case(i, *c))


# Few long rows (lower_rows.c, topk_chunks): a first dispatch selects each
# chunk's K best, a second the row's K from those candidates (topk.comp
# SPLIT). Ties everywhere (integers from a few values): the original
# indices must order equal values across chunks; K as large as the split
# takes (64), K more than a chunk's tail holds, and down the first axis.
SPLIT_TOPKS = [([2, 40000], 5, -1, 1, 40), ([1, 70001], 64, -1, 0, 3), ([20000, 3], 7, 0, 1, 9)]


def split_topk_case(i, shape, k, axis, largest, spread):
    def test(workdir):
        x = rng(2620 + i).integers(-spread, spread + 1, size=shape).astype(np.float32)
        wv, wi = ref.topk(x, k, axis, largest)
        node = {"name": "t", "op": "topk", "inputs": ["x"], "k": k, "axis": axis,
                "largest": largest, "outputs": ["v", "i"]}
        prog = build_model(workdir, model_yaml("topk", {"x": spec(x)}, [node], ["v", "i"]))
        splits = sorted(d.get("SPLIT") for d in kernel_defines(workdir) if "CHUNKS" in d)
        check(splits == ["1", "2"], f"topk kernels' SPLIT {splits}, expected 1 and 2")
        gv, gi = run_program(prog, [x], [wv, wi])
        assert_close(gv, wv, 0, 0, "values")
        check_equal(gi, wi, "indices")
    return test


for i, c in enumerate(SPLIT_TOPKS):
    case(f"op topk {c[0]} k={c[1]} axis={c[2]} largest={c[3]}: in chunks")(
        split_topk_case(i, *c))


# topk.comp's radix selection (K up to 256; shaders/topk.comp RADIX) on
# values that are not ties: normal floats with infinities and signed zeros
# (-0 equal to +0: index order), in chunks and a workgroup a row, largest
# and smallest; K = 300 keeps the selection rounds (RADIX 0).
RADIX_TOPKS = [([5, 3000], 50, -1, 1, "1"), ([3, 40000], 64, -1, 0, "1"),
               ([2, 700], 256, -1, 1, "1"), ([2, 700], 300, -1, 0, "0")]


def radix_topk_case(i, shape, k, axis, largest, radix):
    def test(workdir):
        r = rng(2640 + i)
        x = r.standard_normal(shape).astype(np.float32)
        flat = x.reshape(-1)
        spots = r.choice(flat.size, 12, replace=False)
        flat[spots] = [np.inf, -np.inf, 0.0, -0.0, 0.0, -0.0, np.inf, -np.inf, 0.0, -0.0,
                       1e-30, -1e-30]
        wv, wi = ref.topk(x, k, axis, largest)
        node = {"name": "t", "op": "topk", "inputs": ["x"], "k": k, "axis": axis,
                "largest": largest, "outputs": ["v", "i"]}
        prog = build_model(workdir, model_yaml("topk", {"x": spec(x)}, [node], ["v", "i"]))
        got = sorted({d.get("RADIX") for d in kernel_defines(workdir) if "K" in d})
        check(got == [radix], f"topk kernels' RADIX {got}, expected {radix}")
        gv, gi = run_program(prog, [x], [wv, wi])
        assert_close(gv, wv, 0, 0, "values")
        check_equal(gi, wi, "indices")
    return test


for i, c in enumerate(RADIX_TOPKS):
    case(f"op topk {c[0]} k={c[1]} axis={c[2]} largest={c[3]}: normal values, infinities, "
         f"signed zeros (RADIX {c[4]})")(radix_topk_case(i, *c))


NMSES = [  # batches, classes, boxes, max_per_class, iou_threshold, score_threshold, center
    (1, 1, 6, 3, 0.5, None, 0),
    (2, 3, 40, 10, 0.3, 0.2, 0),
    (1, 2, 700, 50, 0.45, None, 1),   # more boxes than a workgroup's invocations
    (3, 2, 25, 25, 0.0, 0.5, 0),      # any overlap suppresses
    (1, 4, 300, 400, 0.6, 0.05, 1),   # max_per_class past the boxes
]


def nms_case(i, B, C, N, most, iou, score_thr, center):
    def test(workdir):
        r = rng(2620 + i)
        # boxes in a few clusters (so they overlap), corners in either order
        centre = r.uniform(0, 10, [B, 4, 2])[:, r.integers(0, 4, N)] + r.normal(0, 0.4, [B, N, 2])
        size = r.uniform(0.5, 2.5, [B, N, 2])
        if center:
            boxes = np.concatenate([centre, size], 2)
        else:
            lo, hi = centre - size / 2, centre + size / 2
            boxes = np.stack([lo[..., 1], lo[..., 0], hi[..., 1], hi[..., 0]], 2)
            flip = r.random([B, N]) < 0.3
            boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
        boxes = boxes.astype(np.float32)
        scores = r.integers(0, 40, [B, C, N]).astype(np.float32) / 40  # equal scores
        want = ref.nms(boxes, scores, most, iou, score_thr, center)
        rows = B * C * min(most, N)
        padded = np.full([rows, 3], -1, np.int64)
        padded[:len(want)] = want
        node = {"name": "s", "op": "nms", "inputs": ["boxes", "scores"], "outputs": ["s", "n"],
                "max_per_class": most, "iou_threshold": iou, "center_point_box": center}
        if score_thr is not None:
            node["score_threshold"] = score_thr
        y = model_yaml("nms", {"boxes": spec(boxes), "scores": spec(scores)}, [node], ["s", "n"])
        got, count = run_model(workdir, y, [boxes, scores],
                               [padded, np.array([len(want)], np.int64)])
        check_equal(count, np.array([len(want)], np.int64), "count")
        check_equal(got, padded, "selected rows")
    return test


for i, c in enumerate(NMSES):
    case(f"op nms {c[0]}x{c[1]} classes, {c[2]} boxes, max {c[3]}, iou {c[4]}, "
         f"score {c[5]}, center {c[6]}")(nms_case(i, *c))



def sample_model(logits, attrs):
    node = {"name": "s", "op": "sample", "inputs": ["logits", "seed"]}
    node.update(attrs)
    return model_yaml("sample", {"logits": spec(logits), "seed": {"dtype": "i64", "shape": [1]}},
                      [node], ["s"])


@case("op sample: temperature 0 and top_k 1 are the argmax")
def _(workdir):
    logits = values(rng(2700), [16, 100])
    want = np.argmax(logits, -1).astype(np.int64)
    for attrs in ({"temperature": 0}, {"top_k": 1, "temperature": 2.0}):
        got, = run_model(workdir, sample_model(logits, attrs),
                         [logits, np.array([7], np.int64)], [want])
        check_equal(got, want, f"{attrs}")


def sample_distribution_case(attrs, seed):
    def test(workdir):
        rows = 4000
        base = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 1.5], np.float32)
        logits = np.tile(base, (rows, 1))
        t = attrs.get("temperature", 1.0)
        p = np.exp(base / t - (base / t).max())
        p /= p.sum()
        order = np.argsort(-base, kind="stable")
        keep = np.zeros(6, bool)
        k = attrs.get("top_k", 0) or 6
        mass = 0.0
        for j, idx in enumerate(order[:k]):
            if mass >= attrs.get("top_p", 1.0):
                break
            keep[idx] = True
            mass += p[idx]
        q = np.where(keep, p, 0)
        q /= q.sum()
        prog_out, = run_model(workdir, sample_model(logits, attrs),
                              [logits, np.array([seed], np.int64)],
                              [np.zeros(rows, np.int64)])
        freq = np.bincount(prog_out, minlength=6) / rows
        from harness import Failure
        if (freq[~keep] > 0).any():
            raise Failure(f"sampled outside the allowed set: freq {freq}, allowed {keep}")
        if np.abs(freq - q).max() > 0.035:
            raise Failure(f"frequencies {np.round(freq, 3)} differ from {np.round(q, 3)}")
    return test


for attrs in ({}, {"temperature": 0.5}, {"top_k": 3}, {"top_p": 0.6}, {"top_k": 4, "top_p": 0.9,
                                                                       "temperature": 1.5}):
    case(f"op sample distribution {attrs}")(sample_distribution_case(attrs, 12345))


@case("op sample: a seed reproduces its draws, another seed changes them")
def _(workdir):
    from harness import build_model, run_program, Failure
    logits = np.zeros([500, 50], np.float32)
    prog = build_model(workdir, sample_model(logits, {}))
    want = np.zeros(500, np.int64)
    a, = run_program(prog, [logits, np.array([1], np.int64)], [want])
    b, = run_program(prog, [logits, np.array([1], np.int64)], [want])
    c, = run_program(prog, [logits, np.array([1 << 40], np.int64)], [want])
    check_equal(a, b, "same seed")
    if (a == c).mean() > 0.2:
        raise Failure("another seed drew nearly the same tokens")
    if len(np.unique(a)) < 30:
        raise Failure("rows drew too few distinct tokens from a uniform distribution")


SCANS = [(1, 5, 3, 4, False, False, False), (2, 17, 6, 16, True, False, True),
         (1, 40, 4, 256, True, True, True), (3, 9, 5, 33, False, True, False)]


def scan_case(i, bt, L, dim, N, has_d, has_z, softplus):
    def test(workdir):
        r = rng(2800 + i)
        u, delta = values(r, [bt, L, dim], 1.0), values(r, [bt, L, dim], 0.5)
        if not softplus:
            delta = np.abs(delta).astype(np.float32)
        A = (-np.abs(values(r, [dim, N], 1.0))).astype(np.float32)
        B, C = values(r, [bt, L, N], 1.0), values(r, [bt, L, N], 1.0)
        ins = [u, delta, A, B, C]
        if has_d or has_z:
            ins.append(values(r, [dim], 1.0))
        if has_z:
            ins.append(values(r, [bt, L, dim], 1.0))
        want = ref.selective_scan(*ins[:5], ins[5] if len(ins) > 5 else None,
                                  ins[6] if len(ins) > 6 else None, softplus)
        one_op(workdir, "selective_scan", ins, want, {"delta_softplus": int(softplus)},
               1e-4, 1e-4, names=["u", "dt", "A", "B", "C", "D", "z"])
    return test


for i, c in enumerate(SCANS):
    case(f"op selective_scan batch={c[0]} L={c[1]} dim={c[2]} N={c[3]} D={c[4]} z={c[5]} "
         f"softplus={c[6]}")(scan_case(i, *c))
