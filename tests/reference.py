"""reference.py: kiln's CPU reference, written independently of kiln.

Each function computes an op from its mathematical definition in float64
with numpy, sharing no code or formula shortcuts with the GLSL kernels
(gelu uses math.erf, not kiln's approximation; layer_norm uses numpy's
variance). Tests compare kiln's f32 results with these under per-op
tolerances.
"""
import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def f64(x):
    return np.asarray(x, dtype=np.float64)


BINARY = {
    "add": lambda a, b: f64(a) + f64(b),
    "sub": lambda a, b: f64(a) - f64(b),
    "mul": lambda a, b: f64(a) * f64(b),
    "div": lambda a, b: f64(a) / f64(b),
}


def sigmoid(x):
    x = f64(x)
    return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))),
                    np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


UNARY = {
    "relu": lambda x: np.maximum(f64(x), 0),
    "gelu": lambda x: 0.5 * f64(x) * (1 + _erf(f64(x) / math.sqrt(2))),
    "silu": lambda x: f64(x) * sigmoid(x),
    "sigmoid": sigmoid,
    "tanh": lambda x: np.tanh(f64(x)),
    "exp": lambda x: np.exp(f64(x)),
}


def matmul(a, b):
    return np.matmul(f64(a), f64(b))


def softmax(x, axis=-1):
    x = f64(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_norm(x, gamma=None, beta=None, eps=1e-5):
    x = f64(x)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * f64(gamma)
    if beta is not None:
        y = y + f64(beta)
    return y


def transpose(x, perm=None):
    return np.transpose(x, perm)


# ---- kiln's seeded weight generator (`init:` in YAML), from its spec ----

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(seed, n):
    """Outputs 1..n of splitmix64 started at state `seed`."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + _GOLDEN * np.arange(1, n + 1, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def init_uniform(shape, lo, hi, seed):
    n = int(np.prod(shape))
    u = (splitmix64(seed, n) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return (lo + (hi - lo) * u).astype(np.float32).reshape(shape)


def init_normal(shape, std, seed, mean=0.0):
    n = int(np.prod(shape))
    u = (splitmix64(seed, 2 * n) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    u1, u2 = u[0::2], u[1::2]
    z = np.sqrt(-2 * np.log(1 - u1)) * np.cos(2 * np.pi * u2)
    return (mean + std * z).astype(np.float32).reshape(shape)


def run_model_inputs(shape, input_index):
    """The inputs samples/run_model.c makes when given no -i files."""
    n = int(np.prod(shape))
    k = np.arange(n, dtype=np.uint64)
    h = (k * np.uint64(2654435761) + np.uint64(12345 * (input_index + 1))) % np.uint64(2 ** 32)
    return (h.astype(np.float64) / 2147483648.0 - 1.0).astype(np.float32).reshape(shape)


# ---- the op set beyond the first issue ----

def _floor_mod(a, b):
    return a - b * np.floor(a / b)


BINARY.update({
    "max": lambda a, b: np.maximum(f64(a), f64(b)),
    "min": lambda a, b: np.minimum(f64(a), f64(b)),
    "pow": lambda a, b: np.power(f64(a), f64(b)),
    "mod": lambda a, b: _floor_mod(f64(a), f64(b)),
    "prelu": lambda a, b: np.where(f64(a) >= 0, f64(a), f64(a) * f64(b)),
})

COMPARE = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}

LOGICAL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _selu(x, alpha=1.6732632423543772, gamma=1.0507009873554805):
    return gamma * np.where(x > 0, x, alpha * (np.exp(x) - 1))


UNARY.update({
    "leaky_relu": lambda x: np.where(f64(x) >= 0, f64(x), 0.01 * f64(x)),
    "elu": lambda x: np.where(f64(x) >= 0, f64(x), np.exp(f64(x)) - 1),
    "selu": lambda x: _selu(f64(x)),
    "hard_sigmoid": lambda x: np.clip(0.2 * f64(x) + 0.5, 0, 1),
    "hard_swish": lambda x: f64(x) * np.clip(f64(x) / 6 + 0.5, 0, 1),
    "log": lambda x: np.log(f64(x)),
    "sqrt": lambda x: np.sqrt(f64(x)),
    "rsqrt": lambda x: 1 / np.sqrt(f64(x)),
    "reciprocal": lambda x: 1 / f64(x),
    "neg": lambda x: -f64(x),
    "abs": lambda x: np.abs(f64(x)),
    "sign": lambda x: np.sign(f64(x)),
    "floor": lambda x: np.floor(f64(x)),
    "ceil": lambda x: np.ceil(f64(x)),
    "round": lambda x: np.round(f64(x)),  # half to even
    "erf": lambda x: _erf(f64(x)),
    "gelu_tanh": lambda x: 0.5 * f64(x) * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                                         (f64(x) + 0.044715 * f64(x) ** 3))),
    "softplus": lambda x: np.log1p(np.exp(-np.abs(f64(x)))) + np.maximum(f64(x), 0),
    "sin": lambda x: np.sin(f64(x)),
    "cos": lambda x: np.cos(f64(x)),
    "tan": lambda x: np.tan(f64(x)),
    "atan": lambda x: np.arctan(f64(x)),
    "asin": lambda x: np.arcsin(f64(x)),
    "acos": lambda x: np.arccos(f64(x)),
    "sinh": lambda x: np.sinh(f64(x)),
    "cosh": lambda x: np.cosh(f64(x)),
    "asinh": lambda x: np.arcsinh(f64(x)),
    "acosh": lambda x: np.arccosh(f64(x)),
    "atanh": lambda x: np.arctanh(f64(x)),
    "softsign": lambda x: f64(x) / (1 + np.abs(f64(x))),
    # ONNX's definitions at their default attributes (alpha 1; bias 0, lambd 0.5)
    "celu": lambda x: np.maximum(f64(x), 0) + np.minimum(0, np.expm1(f64(x))),
    "thresholded_relu": lambda x: np.where(f64(x) > 1, f64(x), 0),
    "shrink": lambda x: np.where(f64(x) < -0.5, f64(x), np.where(f64(x) > 0.5, f64(x), 0)),
})


def slice_ref(x, starts, ends, axes=None, steps=None):
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        idx[a] = slice(s, e, st)
    return x[tuple(idx)]


def depth_to_space(x, b, mode="DCR"):
    n, c, h, w = x.shape
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


def space_to_depth(x, b):
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


def log_softmax(x, axis=-1):
    x = f64(x)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def norm(x, axis=-1, gamma=None, beta=None, eps=1e-5, rms=False):
    """layer_norm / rms_norm over the axes from `axis` to the last."""
    x = f64(x)
    axes = tuple(range(axis % x.ndim, x.ndim))
    if rms:
        y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    else:
        y = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    shape = x.shape[axis % x.ndim:]
    if gamma is not None:
        y = y * f64(gamma).reshape(shape)
    if beta is not None:
        y = y + f64(beta).reshape(shape)
    return y


def group_norm(x, scale, bias, groups, eps=1e-5):
    x = f64(x)
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    g = (g - g.mean(axis=2, keepdims=True)) / np.sqrt(g.var(axis=2, keepdims=True) + eps)
    y = g.reshape(x.shape)
    shape = [1, c] + [1] * (x.ndim - 2)
    return y * f64(scale).reshape(shape) + f64(bias).reshape(shape)


def batch_norm(x, scale, bias, mean, var, eps=1e-5):
    shape = [1, -1] + [1] * (x.ndim - 2)
    r = lambda p: f64(p).reshape(shape)  # noqa: E731
    return (f64(x) - r(mean)) / np.sqrt(r(var) + eps) * r(scale) + r(bias)


def cumsum(x, axis=-1, exclusive=False, reverse=False):
    x = f64(x)
    if reverse:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis)
    if exclusive:
        y = y - x
    return np.flip(y, axis) if reverse else y


REDUCE = {
    "reduce_sum": lambda x, a, k: np.sum(x, axis=a, keepdims=k),
    "reduce_mean": lambda x, a, k: np.mean(x, axis=a, keepdims=k),
    "reduce_max": lambda x, a, k: np.max(x, axis=a, keepdims=k),
    "reduce_min": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "reduce_prod": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "reduce_l1": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "reduce_l2": lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k)),
    "reduce_sum_square": lambda x, a, k: np.sum(x * x, axis=a, keepdims=k),
    "reduce_log_sum_exp": lambda x, a, k: (
        np.max(x, axis=a, keepdims=True) +
        np.log(np.sum(np.exp(x - np.max(x, axis=a, keepdims=True)), axis=a, keepdims=True))
    ) if k else np.squeeze(
        np.max(x, axis=a, keepdims=True) +
        np.log(np.sum(np.exp(x - np.max(x, axis=a, keepdims=True)), axis=a, keepdims=True)),
        axis=a),
}


def arg_reduce(x, axis, keep, largest, last):
    x = np.asarray(x)
    if last:
        x = np.flip(x, axis)
    i = np.argmax(x, axis=axis) if largest else np.argmin(x, axis=axis)
    if last:
        i = x.shape[axis] - 1 - i
    if keep:
        i = np.expand_dims(i, axis)
    return i.astype(np.int64)


ACTIVATIONS = {"none": lambda x: x, "relu": lambda x: np.maximum(x, 0),
               "gelu": lambda x: UNARY["gelu"](x), "gelu_tanh": lambda x: UNARY["gelu_tanh"](x),
               "silu": lambda x: UNARY["silu"](x), "sigmoid": sigmoid, "tanh": np.tanh}


def gemm(a, b, c=None, alpha=1.0, beta=1.0, trans_a=0, trans_b=0, activation="none"):
    a, b = f64(a), f64(b)
    y = alpha * (a.T if trans_a else a) @ (b.T if trans_b else b)
    if c is not None:
        y = y + beta * f64(c)
    return ACTIVATIONS[activation](y)


def scatter_elements(x, idx, upd, axis, reduction="none"):
    y = np.array(x, dtype=np.float64)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    for pos in np.ndindex(*idx.shape):
        tgt = list(pos)
        tgt[axis] = idx[pos]
        tgt = tuple(tgt)
        v = float(upd[pos])
        if reduction == "none":
            y[tgt] = v
        elif reduction == "add":
            y[tgt] += v
        elif reduction == "mul":
            y[tgt] *= v
        elif reduction == "max":
            y[tgt] = max(y[tgt], v)
        else:
            y[tgt] = min(y[tgt], v)
    return y


def one_hot(idx, depth, axis=-1, on=1.0, off=0.0):
    idx = np.where(idx < 0, idx + depth, idx)
    y = (np.arange(depth) == idx[..., None]).astype(np.float64)
    y = np.where(y == 1, on, off)
    return np.moveaxis(y, -1, axis % (idx.ndim + 1))


def pad(x, pads, mode="constant", value=0.0):
    r = x.ndim
    begin, end = pads[:r], pads[r:]
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0))
                 for i, (b, e) in enumerate(zip(begin, end)))
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    if mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=value)
    return np.pad(x, widths, mode="reflect" if mode == "reflect" else "edge")


def attention(q, k, v, mask=None, layout="bhsd", heads=None, kv_heads=None, scale=None,
              softcap=0.0, causal=False, window=0):
    q, k, v = f64(q), f64(k), f64(v)
    if layout == "bshd":
        b, sq, _ = q.shape
        kvh = kv_heads or heads
        q = q.reshape(b, sq, heads, -1).transpose(0, 2, 1, 3)
        k = k.reshape(b, k.shape[1], kvh, -1).transpose(0, 2, 1, 3)
        v = v.reshape(b, v.shape[1], kvh, -1).transpose(0, 2, 1, 3)
    h, kvh = q.shape[1], k.shape[1]
    k = np.repeat(k, h // kvh, axis=1)
    v = np.repeat(v, h // kvh, axis=1)
    sq, sk, d = q.shape[2], k.shape[2], q.shape[3]
    s = q @ k.transpose(0, 1, 3, 2) * (1 / math.sqrt(d) if scale is None else scale)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        s = s + f64(mask)
    i = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    visible = np.ones((sq, sk), bool)
    if causal:
        visible &= j <= i
    if window:
        visible &= j > i - window
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.where(np.isfinite(m), np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    tot = e.sum(axis=-1, keepdims=True)
    p = np.where(tot > 0, e / np.where(tot > 0, tot, 1), 0)
    o = p @ v
    if layout == "bshd":
        o = o.transpose(0, 2, 1, 3).reshape(o.shape[0], sq, -1)
    return o


def rope(x, cos, sin, interleaved=False, n_rot=None, seq_axis=-2):
    x = f64(x)
    d = x.shape[-1]
    r = n_rot or d
    shape = [1] * x.ndim
    shape[seq_axis % x.ndim] = cos.shape[0]
    shape[-1] = r // 2
    c, s = f64(cos).reshape(shape), f64(sin).reshape(shape)
    y = x.copy()
    if interleaved:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        y[..., 0:r:2] = x1 * c - x2 * s
        y[..., 1:r:2] = x2 * c + x1 * s
    else:
        x1, x2 = x[..., :r // 2], x[..., r // 2:r]
        y[..., :r // 2] = x1 * c - x2 * s
        y[..., r // 2:r] = x2 * c + x1 * s
    return y


def _out_size(n, k, s, d, pb, pe, ceil_mode=False):
    room = n + pb + pe - ((k - 1) * d + 1)
    out = (-(-room // s) if ceil_mode else room // s) + 1
    if ceil_mode and (out - 1) * s >= n + pb:
        out -= 1
    return out


def conv(x, w, b=None, strides=None, pads=None, dilations=None, group=1):
    """Direct N-D convolution from the definition (cross-correlation)."""
    x, w = f64(x), f64(w)
    nsp = x.ndim - 2
    strides = strides or [1] * nsp
    dil = dilations or [1] * nsp
    pads = pads or [0] * (2 * nsp)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)])
    n, c = x.shape[:2]
    oc, cg = w.shape[:2]
    ks = w.shape[2:]
    outs = [_out_size(x.shape[2 + i], ks[i], strides[i], dil[i], pads[i], pads[i + nsp])
            for i in range(nsp)]
    y = np.zeros([n, oc] + outs)
    ocg = oc // group
    for kpos in np.ndindex(*ks):
        sl = tuple(slice(kpos[i] * dil[i], kpos[i] * dil[i] + (outs[i] - 1) * strides[i] + 1,
                         strides[i]) for i in range(nsp))
        patch = xp[(slice(None), slice(None)) + sl]  # [n, c, *outs]
        for g in range(group):
            wk = w[(slice(g * ocg, (g + 1) * ocg), slice(None)) + kpos]  # [ocg, cg]
            y[:, g * ocg:(g + 1) * ocg] += np.einsum(
                "oc,nc...->no...", wk, patch[:, g * cg:(g + 1) * cg])
    if b is not None:
        y += f64(b).reshape([1, -1] + [1] * nsp)
    return y


def conv_transpose(x, w, b=None, strides=None, pads=None, dilations=None, group=1,
                   output_padding=None):
    x, w = f64(x), f64(w)
    nsp = x.ndim - 2
    strides = strides or [1] * nsp
    dil = dilations or [1] * nsp
    pads = pads or [0] * (2 * nsp)
    op = output_padding or [0] * nsp
    n, c = x.shape[:2]
    ocg = w.shape[1]
    ks = w.shape[2:]
    full = [(x.shape[2 + i] - 1) * strides[i] + (ks[i] - 1) * dil[i] + 1 + op[i]
            for i in range(nsp)]
    y = np.zeros([n, ocg * group] + full)
    cg = c // group
    for pos in np.ndindex(*x.shape[2:]):
        for kpos in np.ndindex(*ks):
            tgt = tuple(pos[i] * strides[i] + kpos[i] * dil[i] for i in range(nsp))
            for g in range(group):
                xv = x[(slice(None), slice(g * cg, (g + 1) * cg)) + pos]  # [n, cg]
                wk = w[(slice(g * cg, (g + 1) * cg), slice(None)) + kpos]  # [cg, ocg]
                y[(slice(None), slice(g * ocg, (g + 1) * ocg)) + tgt] += xv @ wk
    crop = tuple(slice(pads[i], full[i] - pads[i + nsp]) for i in range(nsp))
    y = y[(slice(None), slice(None)) + crop]
    if b is not None:
        y += f64(b).reshape([1, -1] + [1] * nsp)
    return y


def pool(x, kernel, kind, strides=None, pads=None, dilations=None, ceil_mode=False,
         count_include_pad=False):
    x = f64(x)
    nsp = x.ndim - 2
    strides = strides or [1] * nsp
    dil = dilations or [1] * nsp
    pads = pads or [0] * (2 * nsp)
    outs = [_out_size(x.shape[2 + i], kernel[i], strides[i], dil[i], pads[i], pads[i + nsp],
                      ceil_mode) for i in range(nsp)]
    y = np.zeros(list(x.shape[:2]) + outs)
    for opos in np.ndindex(*outs):
        vals, count = [], 0
        for kpos in np.ndindex(*kernel):
            idx = [opos[i] * strides[i] - pads[i] + kpos[i] * dil[i] for i in range(nsp)]
            inside = all(0 <= idx[i] < x.shape[2 + i] for i in range(nsp))
            padded = all(-pads[i] <= idx[i] < x.shape[2 + i] + pads[i + nsp]
                         for i in range(nsp))
            if inside:
                vals.append(x[(slice(None), slice(None)) + tuple(idx)])
            count += padded if count_include_pad else inside
        st = np.stack(vals)
        y[(slice(None), slice(None)) + opos] = st.max(0) if kind == "max" else st.sum(0) / count
    return y


def roi_align(x, rois, batch, oh, ow, sampling=0, scale=1.0, mode="avg", half_pixel=True):
    """ONNX RoiAlign as its description and reference read: each bin of each
    region averages (or takes the largest weighted corner of) a grid of
    bilinear samples; samples more than a pixel outside read 0."""
    x = f64(x)
    N, C, H, W = x.shape
    y = np.zeros([len(rois), C, oh, ow])
    off = 0.5 if half_pixel else 0.0
    for r, (x1, y1, x2, y2) in enumerate(np.asarray(rois, np.float64)):
        sx, sy = x1 * scale - off, y1 * scale - off
        rw, rh = x2 * scale - off - sx, y2 * scale - off - sy
        if not half_pixel:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = sampling if sampling > 0 else int(np.ceil(rh / oh))
        gw = sampling if sampling > 0 else int(np.ceil(rw / ow))
        img = x[int(batch[r])]
        for ph in range(oh):
            for pw in range(ow):
                vals = []
                for iy in range(gh):
                    yy = sy + ph * bh + (iy + 0.5) * bh / gh
                    for ix in range(gw):
                        xx = sx + pw * bw + (ix + 0.5) * bw / gw
                        if yy < -1 or yy > H or xx < -1 or xx > W:
                            vals.append(np.zeros(C))
                            continue
                        py, px = max(yy, 0.0), max(xx, 0.0)
                        y0, x0 = int(py), int(px)
                        y1_ = x1_ = None
                        if y0 >= H - 1:
                            y0 = y1_ = H - 1
                            py = float(y0)
                        else:
                            y1_ = y0 + 1
                        if x0 >= W - 1:
                            x0 = x1_ = W - 1
                            px = float(x0)
                        else:
                            x1_ = x0 + 1
                        ly, lx = py - y0, px - x0
                        parts = [(1 - ly) * (1 - lx) * img[:, y0, x0], (1 - ly) * lx * img[:, y0, x1_],
                                 ly * (1 - lx) * img[:, y1_, x0], ly * lx * img[:, y1_, x1_]]
                        vals.append(np.max(parts, 0) if mode == "max" else np.sum(parts, 0))
                if mode == "max":
                    y[r, :, ph, pw] = np.max(vals, 0) if vals else 0
                else:
                    y[r, :, ph, pw] = np.sum(vals, 0) / max(gh * gw, 1) if vals else 0
    return y


def max_pool_indices(x, kernel, strides=None, pads=None, dilations=None, ceil_mode=False,
                     column_major=False):
    """ONNX MaxPool's Indices: each window's first maximum as a flat index
    into x, the spatial axes row-major or (storage_order 1) column-major."""
    nsp = x.ndim - 2
    strides = strides or [1] * nsp
    dil = dilations or [1] * nsp
    pads = pads or [0] * (2 * nsp)
    sp = x.shape[2:]
    outs = [_out_size(sp[i], kernel[i], strides[i], dil[i], pads[i], pads[i + nsp], ceil_mode)
            for i in range(nsp)]
    y = np.zeros(list(x.shape[:2]) + outs, np.int64)
    plane = int(np.prod(sp))
    for n, c in np.ndindex(*x.shape[:2]):
        for opos in np.ndindex(*outs):
            best, at = None, None
            for kpos in np.ndindex(*kernel):
                idx = [opos[i] * strides[i] - pads[i] + kpos[i] * dil[i] for i in range(nsp)]
                if all(0 <= idx[i] < sp[i] for i in range(nsp)):
                    v = x[(n, c) + tuple(idx)]
                    if best is None or v > best:
                        best, at = v, idx
            flat = int(np.ravel_multi_index(at[::-1], sp[::-1]) if column_major
                       else np.ravel_multi_index(at, sp))
            y[(n, c) + opos] = (n * x.shape[1] + c) * plane + flat
    return y


def resize(x, out_shape, mode="nearest", coord="half_pixel", nearest="round_prefer_floor",
           scales=None, roi=None, extrapolation=0.0, cubic_a=-0.75):
    """ONNX Resize: nearest, linear, or cubic (Keys' kernel with cubic_a,
    the four taps' indices clamped to the axis, as exclude_outside 0)."""
    y = f64(x)
    outside = np.zeros(out_shape, bool)
    for d, out in enumerate(out_shape):
        n = y.shape[d]
        sc = scales[d] if scales else out / n
        c = np.arange(out, dtype=np.float64)
        if coord == "half_pixel":
            s = (c + 0.5) / sc - 0.5
        elif coord == "asymmetric":
            s = c / sc
        elif coord == "align_corners":
            s = c * (n - 1) / (out - 1) if out > 1 else np.zeros(out)
        elif coord == "tf_crop_and_resize":
            lo, hi = roi[d], roi[len(out_shape) + d]
            s = (lo * (n - 1) + c * (hi - lo) * (n - 1) / (out - 1) if out > 1
                 else np.full(out, 0.5 * (lo + hi) * (n - 1)))
            shape = [1] * len(out_shape)
            shape[d] = out
            outside |= ((s < 0) | (s > n - 1)).reshape(shape)
        elif coord == "half_pixel_symmetric":  # Resize 19
            offset = n / 2 * (1 - out / (n * sc))
            s = offset + (c + 0.5) / sc - 0.5
        else:
            s = (c + 0.5) / sc - 0.5 if out > 1 else np.zeros(out)
        if mode == "nearest":
            frac_half = (s - np.floor(s)) == 0.5
            r = {"round_prefer_floor": np.where(frac_half, np.floor(s), np.round(s)),
                 "round_prefer_ceil": np.where(frac_half, np.ceil(s), np.round(s)),
                 "floor": np.floor(s), "ceil": np.ceil(s)}[nearest]
            y = np.take(y, np.clip(r, 0, n - 1).astype(int), axis=d)
        elif mode == "cubic":
            f = np.floor(s)
            t = s - f
            shape = [1] * y.ndim
            shape[d] = out
            acc = 0
            for j in (-1, 0, 1, 2):
                u = np.abs(t - j)
                w = np.where(u <= 1, ((cubic_a + 2) * u - (cubic_a + 3)) * u * u + 1,
                             np.where(u < 2, ((cubic_a * u - 5 * cubic_a) * u + 8 * cubic_a) * u
                                      - 4 * cubic_a, 0))
                at = np.clip(f + j, 0, n - 1).astype(int)
                acc = acc + np.take(y, at, axis=d) * w.reshape(shape)
            y = acc
        else:
            f = np.floor(s)
            w = s - f
            lo = np.clip(f, 0, n - 1).astype(int)
            hi = np.clip(f + 1, 0, n - 1).astype(int)
            shape = [1] * y.ndim
            shape[d] = out
            w = w.reshape(shape)
            y = np.take(y, lo, axis=d) * (1 - w) + np.take(y, hi, axis=d) * w
    return np.where(outside, extrapolation, y)


def grid_sample(x, grid, mode="linear", padding="zeros", align=False):
    """ONNX GridSample (and torch's grid_sample) from the spec, in float64:
    x [N, C, D1..Dr], grid [N, O1..Or, r] (the last axis's coordinate
    first). Each axis's taps and weights, then every combination of taps."""
    x, grid = f64(x), f64(grid)
    r = x.ndim - 2
    dims = x.shape[2:]

    def reflect(v, lo, hi):
        span = hi - lo
        if span <= 0:
            return np.full_like(v, lo)
        out = v.copy()
        below, above = v < lo, v > hi
        dx = np.where(below, lo - v, v - hi)
        k = np.floor(dx / span)
        rest = dx - k * span
        even = (k % 2) == 0
        moved = np.where(below == even, lo + rest, hi - rest)
        return np.where(below | above, moved, out)

    taps, weights, valid = [], [], []
    for d in range(r):
        n = dims[d]
        g = grid[..., r - 1 - d]
        s = (g + 1) / 2 * (n - 1) if align else ((g + 1) * n - 1) / 2
        if mode == "nearest":
            s = np.round(s)  # half to even
        lo, hi = (0.0, n - 1.0) if align else (-0.5, n - 0.5)
        out = (s < lo) | (s > hi)
        if padding == "border":
            s = np.where(out, np.clip(s, 0, n - 1), s)
        elif padding == "reflection":
            s = reflect(s, lo, hi)
        if mode == "nearest":
            base, ws = np.trunc(s)[None], [np.ones_like(s)]
        else:
            f = np.floor(s)
            t = s - f
            if mode == "linear":
                base, ws = f[None] + np.arange(2).reshape(2, *[1] * f.ndim), [1 - t, t]
            else:
                a = -0.75

                def keys(z):
                    z = np.abs(z)
                    return np.where(z <= 1, ((a + 2) * z - (a + 3)) * z * z + 1,
                                    np.where(z < 2, ((a * z - 5 * a) * z + 8 * a) * z - 4 * a, 0))
                base = f[None] + np.arange(-1, 3).reshape(4, *[1] * f.ndim)
                ws = [keys(t + 1), keys(t), keys(1 - t), keys(2 - t)]
        idx = base.astype(np.int64)
        ok = (idx >= 0) & (idx < n)
        if padding == "border":
            idx = np.clip(idx, 0, n - 1)
        elif padding == "reflection":
            idx = np.trunc(reflect(idx.astype(np.float64), lo, hi)).astype(np.int64)
        if padding != "zeros":
            ok = np.ones_like(ok)
        taps.append(np.clip(idx, 0, n - 1))
        weights.append(np.stack(ws))
        valid.append(ok)
    N, C = x.shape[:2]
    y = np.zeros((N, C) + grid.shape[1:-1])
    for corner in np.ndindex(*[len(t) for t in taps]):
        w = np.ones(grid.shape[:-1])
        ok = np.ones(grid.shape[:-1], bool)
        index = [np.arange(N).reshape(N, *[1] * (grid.ndim - 2))]
        for d, k in enumerate(corner):
            w = w * weights[d][k]
            ok = ok & valid[d][k]
            index.append(taps[d][k])
        vals = np.stack([x[:, c][tuple(index)] for c in range(C)], axis=1)
        y += np.where(ok[:, None], w[:, None] * vals, 0)
    return y


def nms(boxes, scores, max_per_class, iou_threshold=0.0, score_threshold=None, center=False):
    """ONNX NonMaxSuppression as its description reads: per batch and class,
    the candidates (score above the threshold, when one is given) in
    descending score order (ties: lower box first); each is kept unless a
    box kept before it overlaps it by more than iou_threshold (intersection
    over union, in f32 as ONNX computes it). Rows (batch, class, box)."""
    boxes = np.asarray(boxes, np.float32)
    scores = np.asarray(scores, np.float32)

    def corners(b):
        if center:
            x, y, w, h = b
            return x - w / 2, y - h / 2, x + w / 2, y + h / 2
        y1, x1, y2, x2 = b
        return min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)

    def overlaps(p, q):
        ix0, ix1 = max(p[0], q[0]), min(p[2], q[2])
        iy0, iy1 = max(p[1], q[1]), min(p[3], q[3])
        if ix1 <= ix0 or iy1 <= iy0:
            return False
        inter = (ix1 - ix0) * (iy1 - iy0)
        a1 = (p[2] - p[0]) * (p[3] - p[1])
        a2 = (q[2] - q[0]) * (q[3] - q[1])
        union = a1 + a2 - inter
        if inter <= 0 or a1 <= 0 or a2 <= 0 or union <= 0:
            return False
        return np.float32(inter / union) > np.float32(iou_threshold)

    rows = []
    for b in range(boxes.shape[0]):
        box = [corners(x) for x in boxes[b]]
        for c in range(scores.shape[1]):
            s = scores[b, c]
            cand = [i for i in range(len(s)) if not np.isnan(s[i]) and
                    (score_threshold is None or s[i] > np.float32(score_threshold))]
            cand.sort(key=lambda i: (-s[i], i))
            kept = []
            for i in cand:
                if len(kept) == max_per_class:
                    break
                if not any(overlaps(box[i], box[j]) for j in kept):
                    kept.append(i)
                    rows.append((b, c, i))
    return np.array(rows, np.int64).reshape(-1, 3)


def topk(x, k, axis=-1, largest=True):
    """Stable: equal values keep index order."""
    x = np.asarray(x)
    key = -x if largest else x
    idx = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(idx, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis), idx.astype(np.int64)


def selective_scan(u, delta, A, B, C, D=None, z=None, softplus=False):
    u, delta, A, B, C = (f64(t) for t in (u, delta, A, B, C))
    if softplus:
        delta = np.log1p(np.exp(-np.abs(delta))) + np.maximum(delta, 0)
    bt, L, dim = u.shape
    h = np.zeros((bt, dim, A.shape[1]))
    y = np.zeros_like(u)
    for t in range(L):
        dt = delta[:, t, :, None]
        h = np.exp(dt * A[None]) * h + dt * B[:, t, None, :] * u[:, t, :, None]
        y[:, t] = (h * C[:, t, None, :]).sum(-1)
    if D is not None:
        y += f64(D) * u
    if z is not None:
        z = f64(z)
        y *= z / (1 + np.exp(-z))
    return y


def grouped_matmul(x, w, idx, bias=None):
    """Row r of x times w[idx[r]] (+ bias[idx[r]]); rows whose index is
    outside [0, E) are zero."""
    x, w = f64(x), f64(w)
    E, K, N = w.shape
    rows = x.reshape(-1, K)
    e = np.asarray(idx).reshape(-1)
    y = np.zeros((rows.shape[0], N))
    for r in range(rows.shape[0]):
        if 0 <= e[r] < E:
            y[r] = rows[r] @ w[e[r]]
            if bias is not None:
                y[r] += f64(bias)[e[r]]
    return y.reshape(x.shape[:-1] + (N,))


# ---- signal ----

def _complex(x):
    x = f64(x)
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0].astype(complex)


def _pair(c):
    return np.stack([c.real, c.imag], axis=-1)


def dft(x, axis=-2, inverse=0, onesided=0, length=None):
    """numpy's FFT over `axis` of x [..., 1 or 2] (real, or real and imaginary)."""
    rank = np.ndim(x)
    axis = axis + rank if axis < 0 else axis
    c = _complex(x)
    n = length or c.shape[axis]
    y = np.fft.ifft(c, n=n, axis=axis) if inverse else np.fft.fft(c, n=n, axis=axis)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return _pair(y)


def frames(x, length, step):
    """[..., T] -> [..., F, length]: frames `step` apart."""
    x = np.asarray(x)
    count = (x.shape[-1] - length) // step + 1
    idx = np.arange(count)[:, None] * step + np.arange(length)[None, :]
    return x[..., idx]


def stft(x, step, window=None, frame_length=None, onesided=1):
    """ONNX STFT: x [B, T] or [B, T, 1|2] -> [B, F, bins, 2]."""
    x = f64(x)
    c = _complex(x) if x.ndim == 3 else x.astype(complex)
    L = len(window) if window is not None else frame_length
    fr = frames(c, L, step)
    if window is not None:
        fr = fr * f64(window)
    y = np.fft.fft(fr, axis=-1)
    if onesided:
        y = y[..., :L // 2 + 1]
    return _pair(y)


def window(kind, n, periodic=True):
    N = n if periodic else n - 1
    k = np.arange(n)
    x = 2 * np.pi * k / N if N > 0 else np.zeros(n)
    if kind == "hann":
        return 0.5 - 0.5 * np.cos(x)
    if kind == "hamming":
        return 25 / 46 - 21 / 46 * np.cos(x)
    if kind == "blackman":
        return 0.42 - 0.5 * np.cos(x) + 0.08 * np.cos(2 * x)
    return np.ones(n)


def mel_weight_matrix(mels, dft_length, rate, lo, hi):
    """ONNX MelWeightMatrix: triangles on the HTK mel scale, at DFT bins."""
    bins = dft_length // 2 + 1
    # Points (mel(hi) - mel(lo)) / (mels + 2) apart, as ONNX defines it.
    low, high = 2595 * np.log10(1 + lo / 700), 2595 * np.log10(1 + hi / 700)
    mel = low + np.arange(mels + 2) * (high - low) / (mels + 2)
    hz = 700 * (10 ** (mel / 2595) - 1)
    pts = np.floor((dft_length + 1) * hz / rate).astype(int)
    out = np.zeros((bins, mels))
    for m in range(mels):
        left, center, right = pts[m:m + 3]
        if center == left:
            out[center, m] = 1
        else:
            out[left:center + 1, m] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, m] = (right - np.arange(center, right)) / (right - center)
    return out


def log_mel(x, n_fft, hop=None, sample_rate=16000, n_mels=80, fmin=0, fmax=0,
            window_kind="hann", eps=1e-10, mel=None):
    hop = hop or max(n_fft // 4, 1)
    fr = frames(f64(x), n_fft, hop) * window(window_kind, n_fft)
    power = np.abs(np.fft.rfft(fr, axis=-1)) ** 2
    if mel is None:
        mel = mel_weight_matrix(n_mels, n_fft, sample_rate, fmin, fmax or sample_rate / 2)
    return np.log(np.maximum(power @ f64(mel), eps))


def welch(x, segment=256, overlap=None, fs=1.0, window_kind="hann"):
    """Welch's power spectral density (as scipy.signal.welch's defaults: each
    segment less its mean, a periodic window, one-sided, density scaling)."""
    overlap = segment // 2 if overlap is None else overlap
    fr = frames(f64(x), segment, segment - overlap)
    fr = fr - fr.mean(axis=-1, keepdims=True)
    w = window(window_kind, segment)
    p = np.abs(np.fft.rfft(fr * w, axis=-1)) ** 2 / (fs * (w * w).sum())
    p = p.mean(axis=-2)
    if segment % 2:
        p[..., 1:] *= 2
    else:
        p[..., 1:-1] *= 2
    return p


# ---- gradients (backward ops), analytic; tests check them against
# ---- numeric_grad on small shapes ----

def numeric_grad(f, xs, dy, h=1e-6):
    """Central differences of sum(dy * f(*xs)) with respect to each of xs
    (float64): the yardstick for the analytic gradients below."""
    xs = [f64(x).copy() for x in xs]
    grads = []
    for x in xs:
        g = np.zeros_like(x)
        flat, gf = x.reshape(-1), g.reshape(-1)
        for i in range(flat.size):
            keep = flat[i]
            flat[i] = keep + h
            up = np.sum(f64(dy) * f(*xs))
            flat[i] = keep - h
            down = np.sum(f64(dy) * f(*xs))
            flat[i] = keep
            gf[i] = (up - down) / (2 * h)
        grads.append(g)
    return grads


def norm_grad(dy, x, gamma=None, axis=-1, eps=1e-5, rms=False):
    """dx, dgamma, dbeta of norm(x, axis, gamma, beta)."""
    dy, x = f64(dy), f64(x)
    axes = tuple(range(axis % x.ndim, x.ndim))
    pshape = x.shape[axis % x.ndim:]
    n = int(np.prod(pshape))
    mean = 0 if rms else x.mean(axis=axes, keepdims=True)
    xc = x - mean
    rstd = 1 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + eps)
    xhat = xc * rstd
    g = dy * (f64(gamma).reshape(pshape) if gamma is not None else 1)
    mg = 0 if rms else g.sum(axis=axes, keepdims=True) / n
    dx = rstd * (g - mg - xhat * (g * xhat).sum(axis=axes, keepdims=True) / n)
    lead = tuple(range(axis % x.ndim))
    return dx, (dy * xhat).sum(axis=lead), dy.sum(axis=lead)


def cumsum_grad(dy, axis=-1, exclusive=False, reverse=False):
    return cumsum(dy, axis, exclusive, not reverse)


def gather_grad(dy, idx, axis, size):
    """The gradient of np.take(data, idx, axis) for data with `size` along axis."""
    dy = f64(dy)
    idx = np.asarray(idx)
    shape = dy.shape[:axis] + (size,) + dy.shape[axis + idx.ndim:]
    out = np.zeros(shape)
    flat = dy.reshape(dy.shape[:axis] + (idx.size,) + dy.shape[axis + idx.ndim:])
    for p, i in enumerate(idx.reshape(-1)):
        i = i + size if i < 0 else i
        if 0 <= i < size:
            out[(slice(None),) * axis + (i,)] += flat[(slice(None),) * axis + (p,)]
    return out


def attention_grad(q, k, v, dy, layout="bhsd", heads=None, kv_heads=None, scale=None,
                   causal=False):
    """dq, dk, dv of attention(q, k, v) (no mask, softcap or window)."""
    q, k, v, dy = f64(q), f64(k), f64(v), f64(dy)
    bshd = layout == "bshd"
    if bshd:
        kvh = kv_heads or heads
        split = lambda t, hh: t.reshape(t.shape[0], t.shape[1], hh, -1).transpose(0, 2, 1, 3)
        q, k, v, dy = split(q, heads), split(k, kvh), split(v, kvh), split(dy, heads)
    h, kvh = q.shape[1], k.shape[1]
    g = h // kvh
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    sq, sk, d = q.shape[2], k.shape[2], q.shape[3]
    sc = 1 / math.sqrt(d) if scale is None else scale
    s = q @ kr.transpose(0, 1, 3, 2) * sc
    if causal:
        vis = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = np.where(vis, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dv = p.transpose(0, 1, 3, 2) @ dy
    dp = dy @ vr.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * sc
    dq = ds @ kr
    dk = ds.transpose(0, 1, 3, 2) @ q
    fold = lambda t: t.reshape(t.shape[0], kvh, g, t.shape[2], t.shape[3]).sum(axis=2)
    dk, dv = fold(dk), fold(dv)
    if bshd:
        join = lambda t: t.transpose(0, 2, 1, 3).reshape(t.shape[0], t.shape[2], -1)
        dq, dk, dv = join(dq), join(dk), join(dv)
    return dq, dk, dv


def rope_grad(dy, cos, sin, interleaved=False, n_rot=None, seq_axis=-2):
    """The transpose of the rotation: rope by the opposite angle."""
    return rope(dy, cos, -f64(sin), interleaved, n_rot, seq_axis)
