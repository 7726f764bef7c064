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
