/*
 * onnx_map_attention.c: ONNX Attention (versions 23 to 25) as kiln's
 * attention: 4-D [B, heads, S, D] inputs (layout bhsd) or 3-D [B, S,
 * heads * D] ones with q_num_heads and kv_num_heads (layout bshd); fewer
 * key/value heads than query heads (grouped-query); scale, softcap (before
 * the mask, as ONNX orders them), a float mask added to the scores or a
 * boolean one (false: -inf), and is_causal (with fewer queries than keys
 * and no cache, a constant mask: ONNX aligns it to the first key). A fully
 * masked row gives zeros, as ONNX asks. f16 inputs are computed in f32.
 * The key/value cache: past_key and past_value concatenated with this
 * step's keys and values (present_key, present_value; 3-D inputs are then
 * viewed as [B, heads, S, D]), nonpad_kv_seqlen as a mask computed on the
 * GPU (with is_causal, each batch's frontier). Version 25's windows
 * (left_window_size, right_window_size) are a mask too: constant, or with
 * nonpad_kv_seqlen computed on the GPU. The qk_matmul_output debug
 * output, when asked for, is written out in kiln ops beside the fused
 * attention (qk_output).
 */
#include "onnx.h"

#include <math.h>
#include <string.h>

/* [B, S, heads * D] viewed as [B, heads, S, D], and back. */
static Value *split_heads(Ctx *c, Value *x, int64_t heads) {
    int64_t B = x->shape[0], S = x->shape[1], D = x->shape[2] / heads;
    Value *v = reshaped(c, x, 4, (int64_t[]){B, S, heads, D});
    return transposed(c, v, 4, (int64_t[]){0, 2, 1, 3});
}

static Value *merge_heads(Ctx *c, Value *y) {
    Value *v = transposed(c, y, 4, (int64_t[]){0, 2, 1, 3});
    return reshaped(c, v, 3, (int64_t[]){v->shape[0], v->shape[1], v->shape[2] * v->shape[3]});
}

/* f32 0 where ok is true, -inf where it is false: a mask added to scores. */
static Value *additive_mask(Ctx *c, Value *ok) {
    Value *w[3] = {ok, const_scalar(c, KILN_DTYPE_F32, 0.0),
                   const_scalar(c, KILN_DTYPE_F32, -INFINITY)};
    return finish(c, emit_tmp(c, OP_WHERE, 3, w));
}

/* Attention 25's window around query i at absolute position p = i + offset:
 * keys p - left <= j <= p + right (a bound of -1: unbounded). */
typedef struct AttnWindow {
    int64_t left, right;
} AttnWindow;

static bool windowed(AttnWindow w) { return w.left >= 0 || w.right >= 0; }

/* The additive f32 mask of nonpad_kv_seqlen [B] over T keys, [B, 1, Sq, T]:
 * key j is visible when j < len[b]; causal, when j <= i + len[b] - Sq
 * (ONNX's frontier for an external cache, offset len[b] - Sq); within the
 * window, when i + len[b] - Sq - left <= j <= i + len[b] - Sq + right.
 * Computed on the GPU: len[b] compared with a constant table of the least
 * length each key needs (and, with a left bound, the most it allows). */
static Value *length_mask(Ctx *c, Value *lens, int64_t Sq, int64_t T, bool causal, AttnWindow w) {
    int64_t B = lens->shape[0];
    Value *l = reshaped(c, cast_to(c, lens, KILN_DTYPE_I64), 3, (int64_t[]){B, 1, 1});
    Value *need = new_value(format("%s/key_need", c->nname), KILN_DTYPE_I64, 3,
                            (int64_t[]){1, Sq, T}, true);
    Value *most = w.left >= 0 ? new_value(format("%s/key_most", c->nname), KILN_DTYPE_I64, 3,
                                          (int64_t[]){1, Sq, T}, true)
                              : NULL;
    for (int64_t i = 0; i < Sq; i++)
        for (int64_t j = 0; j < T; j++) {
            int64_t n = j + 1;
            if (causal && j - i + Sq > n)
                n = j - i + Sq;
            if (w.right >= 0 && j - i + Sq - w.right > n)
                n = j - i + Sq - w.right;
            vseti(need, i * T + j, n);
            if (most)
                vseti(most, i * T + j, j - i + Sq + w.left);
        }
    Value *ok = binary_tmp(c, OP_LE, need, l);
    if (most)
        ok = binary_tmp(c, OP_AND, ok, binary_tmp(c, OP_LE, l, most));
    return reshaped(c, additive_mask(c, ok), 4, (int64_t[]){B, 1, Sq, T});
}

/* The window as a constant additive mask [Sq, T], offset P cached keys. */
static Value *window_mask(Ctx *c, int64_t Sq, int64_t T, int64_t P, AttnWindow w) {
    Value *m = new_value(format("%s/window", c->nname), KILN_DTYPE_F32, 2, (int64_t[]){Sq, T},
                         true);
    for (int64_t i = 0; i < Sq; i++)
        for (int64_t j = 0; j < T; j++) {
            bool ok = (w.left < 0 || j >= i + P - w.left) && (w.right < 0 || j <= i + P + w.right);
            vset(m, i * T + j, ok ? 0.0 : -INFINITY);
        }
    return m;
}

/* The qk_matmul_output debug output, written out in kiln ops over f32
 * [B, heads, S, D] q, k (the cache included) and the additive mask: the
 * scaled product Q K^T (grouped-query heads share their key head), after
 * softcap (as ONNX's reference applies it in every mode), plus the mask
 * (mode 2), or softmaxed (mode 3). */
static void qk_output(Ctx *c, Value *q, Value *k, Value *mask, double scale, double softcap,
                      int64_t mode) {
    int64_t B = q->shape[0], H = q->shape[1], Sq = q->shape[2], D = q->shape[3];
    int64_t KH = k->shape[1], T = k->shape[2], G = H / KH;
    Value *qg = reshaped(c, q, 5, (int64_t[]){B, KH, G, Sq, D});
    Value *kt = reshaped(c, transposed(c, k, 4, (int64_t[]){0, 1, 3, 2}), 5,
                         (int64_t[]){B, KH, 1, D, T});
    Value *mm[2] = {qg, kt};
    Value *s = finish(c, emit_tmp(c, OP_MATMUL, 2, mm));
    s = binary_tmp(c, OP_MUL, reshaped(c, s, 4, (int64_t[]){B, H, Sq, T}),
                   const_scalar(c, KILN_DTYPE_F32, scale));
    if (softcap > 0) {
        Value *cap = const_scalar(c, KILN_DTYPE_F32, softcap);
        s = binary_tmp(c, OP_MUL, unary_tmp(c, OP_TANH, binary_tmp(c, OP_DIV, s, cap)), cap);
    }
    if (mode >= 2 && mask)
        s = binary_tmp(c, OP_ADD, s, mask);
    if (mode == 3) { /* a row with every key masked gives zeros, as Y does */
        Node *sm = emit_tmp(c, OP_SOFTMAX, 1, &s);
        node_set_int(sm, "axis", -1);
        Node *mx = emit_tmp(c, OP_REDUCE_MAX, 1, &s);
        node_set_ints(mx, "axes", 1, (int64_t[]){-1});
        Value *none = binary_tmp(c, OP_EQ, finish(c, mx),
                                 const_scalar(c, KILN_DTYPE_F32, -INFINITY));
        Value *w[3] = {none, const_scalar(c, KILN_DTYPE_F32, 0.0), finish(c, sm)};
        s = finish(c, emit_tmp(c, OP_WHERE, 3, w));
    }
    bind_output(c, 3, cast_to(c, s, in(c, 0)->dtype));
}

void map_attention(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *q = in(c, 0), *k = in(c, 1), *v = in(c, 2), *mask = in_opt(c, 3);
    Value *pk = in_opt(c, 4), *pv = in_opt(c, 5), *lens = in_opt(c, 6);
    if (!pk != !pv)
        node_fail(c, "past_key and past_value come together");
    bool qk = nout(c) > 3 && *out_name(c, 3);
    int64_t qk_mode = oattr_int(c, "qk_matmul_output_mode", 0);
    if (qk_mode < 0 || qk_mode > 3)
        node_fail(c, format("qk_matmul_output_mode %lld is not 0 to 3", (long long)qk_mode));
    if (q->rank != 3 && q->rank != 4)
        node_fail(c, format("Q must be 3-D or 4-D, not %s", shape_str(q->rank, q->shape)));
    int64_t qh = oattr_int(c, "q_num_heads", 0), kvh = oattr_int(c, "kv_num_heads", 0);
    if (q->rank == 3 && (qh < 1 || kvh < 1))
        node_fail(c, "3-D inputs need q_num_heads and kv_num_heads");
    bool present = (nout(c) > 1 && *out_name(c, 1)) || (nout(c) > 2 && *out_name(c, 2));
    /* A cache is [B, kv heads, P, D]: with one, 3-D inputs are viewed as 4-D. */
    bool heads4 = q->rank == 3 && (pk || present || qk);
    if (heads4) {
        q = split_heads(c, q, qh);
        k = split_heads(c, k, kvh);
        v = split_heads(c, v, kvh);
    }
    if (pk) {
        Value *kk[2] = {pk, k}, *vv[2] = {pv, v};
        if (pk->rank != 4 || pv->rank != 4 || k->rank != 4)
            node_fail(c, format("past_key and past_value must be [B, kv heads, P, D], got %s "
                                "and %s", shape_str(pk->rank, pk->shape),
                                shape_str(pv->rank, pv->shape)));
        k = joined(c, 2, kk, 2, NULL);
        v = joined(c, 2, vv, 2, NULL);
    }
    bind_output(c, 1, k);
    bind_output(c, 2, v);
    /* f16 (and double) inputs: computed in f32, the result cast back */
    kiln_dtype dt = q->dtype;
    Value *ins[4] = {cast_to(c, q, KILN_DTYPE_F32), cast_to(c, k, KILN_DTYPE_F32),
                     cast_to(c, v, KILN_DTYPE_F32), NULL};
    int64_t sq = q->shape[q->rank == 4 ? 2 : 1], T = k->shape[k->rank == 4 ? 2 : 1];
    bool causal = oattr_int(c, "is_causal", 0) != 0;
    AttnWindow win = {oattr_int(c, "left_window_size", -1), oattr_int(c, "right_window_size", -1)};
    if (win.left < -1 || win.right < -1)
        node_fail(c, "left_window_size and right_window_size must be -1 (unbounded) or at "
                     "least 0");
    if (mask) {
        if (mask->dtype == KILN_DTYPE_BOOL) /* true: attend; false: -inf */
            mask = additive_mask(c, mask);
        mask = cast_to(c, mask, KILN_DTYPE_F32);
        int64_t last = mask->shape[mask->rank - 1];
        if (mask->rank >= 1 && last < T) { /* ONNX pads a short mask with -inf */
            int64_t shape[MAX_RANK];
            memcpy(shape, mask->shape, sizeof(int64_t) * (size_t)mask->rank);
            shape[mask->rank - 1] = T - last;
            Value *tail = new_value(format("%s/mask_pad", c->nname), KILN_DTYPE_F32,
                                    mask->rank, shape, true);
            for (int64_t i = 0; i < vcount(tail); i++)
                vset(tail, i, -INFINITY);
            Value *parts[2] = {mask, tail};
            mask = joined(c, 2, parts, mask->rank - 1, NULL);
        }
    }
    if (lens) {
        if (lens->rank != 1 || lens->shape[0] != q->shape[0] || pk)
            node_fail(c, format("nonpad_kv_seqlen must be [%lld] and come without past_key, "
                                "got %s", (long long)q->shape[0],
                                shape_str(lens->rank, lens->shape)));
        /* an external cache: the causal frontier is each batch's */
        Value *lm = length_mask(c, lens, sq, T, causal, win);
        mask = mask ? binary_tmp(c, OP_ADD, mask, lm) : lm;
        causal = false;
    }
    /* ONNX's causal frontier is j <= i + P, P the cached keys (0 without
     * past_key); kiln's is aligned to the newest key, j <= i + T - Sq. They
     * differ when this step brings other than Sq keys: then the frontier is
     * a constant mask added to the scores. */
    int64_t P = pk ? pk->shape[2] : 0;
    if (windowed(win) && !lens) {
        Value *wm = window_mask(c, sq, T, P, win);
        mask = mask ? binary_tmp(c, OP_ADD, mask, wm) : wm;
    }
    Value *frontier = NULL; /* only where the mask or the debug output takes it */
    if (causal && (T - sq != P || qk)) {
        frontier = new_value(format("%s/causal", c->nname), KILN_DTYPE_F32, 2,
                             (int64_t[]){sq, T}, true);
        for (int64_t i = 0; i < sq; i++)
            for (int64_t j = 0; j < T; j++)
                vset(frontier, i * T + j, j <= i + P ? 0.0 : -INFINITY);
    }
    if (causal && T - sq != P) {
        mask = mask ? binary_tmp(c, OP_ADD, mask, frontier) : frontier;
        causal = false;
    }
    if (qk) {
        double scale = oattr(c, "scale") ? oattr_float(c, "scale", 0)
                                         : 1.0 / sqrt((double)q->shape[3]);
        Value *m = causal ? (mask ? binary_tmp(c, OP_ADD, mask, frontier) : frontier) : mask;
        qk_output(c, ins[0], ins[1], m, scale, oattr_float(c, "softcap", 0), qk_mode);
    }
    int n = 3;
    if (mask)
        ins[n++] = mask;
    const char *out = dt == KILN_DTYPE_F32 && !heads4 ? out_name(c, 0) : NULL;
    Node *kn = out ? emit(c, OP_ATTENTION, n, ins, out) : emit_tmp(c, OP_ATTENTION, n, ins);
    if (q->rank == 3) {
        node_set_attr(kn, "layout", "bshd");
        node_set_int(kn, "heads", qh);
        node_set_int(kn, "kv_heads", kvh);
    }
    if (oattr(c, "scale"))
        node_set_float(kn, "scale", oattr_float(c, "scale", 0));
    double softcap = oattr_float(c, "softcap", 0);
    if (softcap < 0)
        node_fail(c, "softcap must not be negative");
    if (softcap > 0)
        node_set_float(kn, "softcap", softcap);
    if (causal)
        node_set_int(kn, "causal", 1);
    Value *y = finish(c, kn);
    if (out)
        return;
    if (heads4)
        y = merge_heads(c, y);
    output_as(c, y, dt);
}

/* x[..., start:end:step] along the last axis. */
static Value *last_slice(Ctx *c, Value *x, int64_t start, int64_t end, int64_t step) {
    Node *k = emit_tmp(c, OP_SLICE, 1, &x);
    node_set_ints(k, "starts", 1, &start);
    node_set_ints(k, "ends", 1, &end);
    node_set_ints(k, "axes", 1, (int64_t[]){-1});
    node_set_ints(k, "steps", 1, &step);
    return finish(c, k);
}

/* A batch of more than one: kiln's rope shares one cos and sin across the
 * batch, so the rotation is written out in elementwise ops over x viewed as
 * [B, S, heads, D] (cos and sin [B, S, 1, R/2]) or [B, heads, S, D] (cos and
 * sin [B, 1, S, R/2]): real = cos x1 - sin x2, imag = sin x1 + cos x2, x1
 * and x2 the halves (or the even and odd elements) of the first R. */
static void rotary_per_batch(Ctx *c, Value *x, Value **cs, int64_t heads, int64_t D,
                             int64_t R) {
    int64_t B = x->shape[0], S = x->shape[x->rank == 4 ? 2 : 1];
    bool inter = oattr_int(c, "interleaved", 0) != 0;
    Value *xv = x->rank == 3 ? reshaped(c, x, 4, (int64_t[]){B, S, heads, D}) : x;
    int64_t cshape[4] = {B, S, 1, R / 2};
    if (x->rank == 4) {
        cshape[1] = 1;
        cshape[2] = S;
    }
    Value *cv = reshaped(c, cs[0], 4, cshape), *sv = reshaped(c, cs[1], 4, cshape);
    Value *x1 = inter ? last_slice(c, xv, 0, R, 2) : last_slice(c, xv, 0, R / 2, 1);
    Value *x2 = inter ? last_slice(c, xv, 1, R, 2) : last_slice(c, xv, R / 2, R, 1);
    Value *real = binary_tmp(c, OP_SUB, binary_tmp(c, OP_MUL, cv, x1),
                             binary_tmp(c, OP_MUL, sv, x2));
    Value *imag = binary_tmp(c, OP_ADD, binary_tmp(c, OP_MUL, sv, x1),
                             binary_tmp(c, OP_MUL, cv, x2));
    Value *rot;
    if (inter) { /* [..., R/2, 2] -> [..., R] */
        int64_t pshape[5] = {xv->shape[0], xv->shape[1], xv->shape[2], R / 2, 1};
        Value *pair[2] = {reshaped(c, real, 5, pshape), reshaped(c, imag, 5, pshape)};
        Value *both = joined(c, 2, pair, 4, NULL);
        rot = reshaped(c, both, 4, (int64_t[]){xv->shape[0], xv->shape[1], xv->shape[2], R});
    } else {
        Value *halves[2] = {real, imag};
        rot = joined(c, 2, halves, 3, NULL);
    }
    Value *parts[2] = {rot, R < D ? last_slice(c, xv, R, D, 1) : NULL};
    if (x->rank == 4) {
        if (parts[1])
            joined(c, 2, parts, 3, out_name(c, 0));
        else {
            Node *k = emit(c, OP_RESHAPE, 1, &rot, out_name(c, 0));
            node_set_ints(k, "shape", 4, x->shape);
            finish(c, k);
        }
        return;
    }
    Value *y = parts[1] ? joined(c, 2, parts, 3, NULL) : rot;
    Node *k = emit(c, OP_RESHAPE, 1, &y, out_name(c, 0));
    node_set_ints(k, "shape", 3, x->shape);
    finish(c, k);
}

/* RotaryEmbedding-23 as kiln's rope: X [B, heads, S, D], or [B, S, heads *
 * D] with num_heads (viewed as [B, S, heads, D]); cos_cache and sin_cache
 * [B, S, R/2], or [positions, R/2] gathered by position_ids [B, S].
 * kiln's rope shares one [S, R/2] cos and sin across the batch; a batch of
 * more than one takes elementwise ops instead (rotary_per_batch). */
void map_rotary_embedding(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *x = in(c, 0), *pos = in_opt(c, 3);
    int64_t heads = oattr_int(c, "num_heads", 0), R = oattr_int(c, "rotary_embedding_dim", 0);
    if (x->rank != 3 && x->rank != 4)
        node_fail(c, format("X must be 3-D or 4-D, not %s", shape_str(x->rank, x->shape)));
    int64_t B = x->shape[0], S = x->shape[x->rank == 4 ? 2 : 1], D = x->shape[x->rank - 1];
    if (x->rank == 3) {
        if (heads < 1 || D % heads)
            node_fail(c, format("a 3-D X needs num_heads, a divisor of %lld", (long long)D));
        D /= heads;
    }
    if (R == 0)
        R = D;
    if (R < 2 || R > D || R % 2)
        node_fail(c, format("rotary_embedding_dim %lld must be even and at most the head size "
                            "%lld", (long long)R, (long long)D));
    Value *cs[2];
    for (int i = 0; i < 2; i++) {
        Value *cache = in(c, 1 + i);
        if (pos) {
            if (cache->rank != 2)
                node_fail(c, format("with position_ids, input %d must be [positions, %lld], "
                                    "not %s", 1 + i, (long long)(R / 2),
                                    shape_str(cache->rank, cache->shape)));
            Value *g[2] = {cache, pos};
            cache = finish(c, emit_tmp(c, OP_GATHER, 2, g));
        }
        if (cache->rank != 3 || cache->shape[0] != B || cache->shape[1] != S ||
            cache->shape[2] != R / 2)
            node_fail(c, format("input %d gives cos or sin %s, not [%lld, %lld, %lld]", 1 + i,
                                shape_str(cache->rank, cache->shape), (long long)B,
                                (long long)S, (long long)(R / 2)));
        cs[i] = cache;
    }
    if (B > 1) {
        rotary_per_batch(c, x, cs, heads, D, R);
        return;
    }
    for (int i = 0; i < 2; i++)
        cs[i] = reshaped(c, cs[i], 2, (int64_t[]){S, R / 2});
    Value *xin = x->rank == 3 ? reshaped(c, x, 4, (int64_t[]){B, S, heads, D}) : x;
    Value *ins[3] = {xin, cs[0], cs[1]};
    Node *k = x->rank == 3 ? emit_tmp(c, OP_ROPE, 3, ins) : emit(c, OP_ROPE, 3, ins,
                                                                 out_name(c, 0));
    node_set_int(k, "seq_axis", x->rank == 3 ? 1 : 2);
    node_set_int(k, "n_rot", R);
    node_set_int(k, "interleaved", oattr_int(c, "interleaved", 0) != 0);
    Value *y = finish(c, k);
    if (x->rank == 3) {
        Node *back = emit(c, OP_RESHAPE, 1, &y, out_name(c, 0));
        node_set_ints(back, "shape", 3, x->shape);
        finish(c, back);
    }
}
