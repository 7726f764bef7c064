/*
 * onnx_map_attention.c: ONNX Attention (versions 23 and 24) as kiln's
 * attention: 4-D [B, heads, S, D] inputs (layout bhsd) or 3-D [B, S,
 * heads * D] ones with q_num_heads and kv_num_heads (layout bshd); fewer
 * key/value heads than query heads (grouped-query); scale, softcap (before
 * the mask, as ONNX orders them), a float mask added to the scores or a
 * boolean one (false: -inf), and is_causal (with fewer queries than keys
 * and no cache, a constant mask: ONNX aligns it to the first key). A fully
 * masked row gives zeros, as ONNX asks. f16 inputs are computed in f32. The key/value cache inputs and outputs (past_key,
 * present_key, ...) and the qk_matmul_output debug output are refused by
 * name.
 */
#include "onnx.h"

#include <math.h>
#include <string.h>

void map_attention(Ctx *c, const OnnxOp *op) {
    (void)op;
    Value *q = in(c, 0), *k = in(c, 1), *v = in(c, 2), *mask = in_opt(c, 3);
    static const char *const cache_inputs[] = {"past_key", "past_value", "nonpad_kv_seqlen"};
    for (int i = 4; i < 7; i++)
        if (in_opt(c, i))
            node_fail(c, format("unsupported: the %s input (a key/value cache)",
                                cache_inputs[i - 4]));
    static const char *const outputs[] = {"", "present_key", "present_value",
                                          "qk_matmul_output"};
    for (int i = 1; i < nout(c) && i < 4; i++)
        if (*out_name(c, i))
            node_fail(c, format("unsupported: the %s output", outputs[i]));
    if (q->rank != 3 && q->rank != 4)
        node_fail(c, format("Q must be 3-D or 4-D, not %s", shape_str(q->rank, q->shape)));
    /* f16 (and double) inputs: computed in f32, the result cast back */
    kiln_dtype dt = q->dtype;
    Value *ins[4] = {cast_to(c, q, KILN_DTYPE_F32), cast_to(c, k, KILN_DTYPE_F32),
                     cast_to(c, v, KILN_DTYPE_F32), NULL};
    int n = 3;
    if (mask) {
        if (mask->dtype == KILN_DTYPE_BOOL) { /* true: attend; false: -inf */
            Value *w[3] = {mask, const_scalar(c, KILN_DTYPE_F32, 0.0),
                           const_scalar(c, KILN_DTYPE_F32, -INFINITY)};
            mask = finish(c, emit_tmp(c, OP_WHERE, 3, w));
        }
        ins[n++] = cast_to(c, mask, KILN_DTYPE_F32);
    }
    bool causal = oattr_int(c, "is_causal", 0) != 0;
    int64_t sq = q->shape[q->rank == 4 ? 2 : 1], sk = k->shape[k->rank == 4 ? 2 : 1];
    if (causal && sq != sk) {
        /* Without a cache ONNX's causal frontier is j <= i (its offset, the
         * cached keys, is 0); kiln's is aligned to the newest key: the
         * frontier becomes a constant mask added to the scores. */
        int64_t shape[2] = {sq, sk};
        Value *cm = new_value(format("%s/causal", c->nname), KILN_DTYPE_F32, 2, shape, true);
        for (int64_t i = 0; i < sq; i++)
            for (int64_t j = 0; j < sk; j++)
                vset(cm, i * sk + j, j <= i ? 0.0 : -INFINITY);
        ins[3] = n == 4 ? binary_tmp(c, OP_ADD, ins[3], cm) : cm;
        n = 4;
        causal = false;
    }
    const char *out = dt == KILN_DTYPE_F32 ? out_name(c, 0) : NULL;
    Node *kn = out ? emit(c, OP_ATTENTION, n, ins, out) : emit_tmp(c, OP_ATTENTION, n, ins);
    if (q->rank == 3) {
        int64_t qh = oattr_int(c, "q_num_heads", 0), kvh = oattr_int(c, "kv_num_heads", 0);
        if (qh < 1 || kvh < 1)
            node_fail(c, "3-D inputs need q_num_heads and kv_num_heads");
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
    if (!out) {
        Node *back = emit(c, OP_CAST, 1, &y, out_name(c, 0));
        node_set_attr(back, "to", kiln_dtype_name(dt));
        finish(c, back);
    }
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
