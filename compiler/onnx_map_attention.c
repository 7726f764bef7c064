/*
 * onnx_map_attention.c: ONNX Attention (versions 23 and 24) as kiln's
 * attention: 4-D [B, heads, S, D] inputs (layout bhsd) or 3-D [B, S,
 * heads * D] ones with q_num_heads and kv_num_heads (layout bshd); fewer
 * key/value heads than query heads (grouped-query); scale, softcap (before
 * the mask, as ONNX orders them), a float mask added to the scores or a
 * boolean one (false: -inf), and is_causal. A fully masked row gives zeros,
 * as ONNX asks. The key/value cache inputs and outputs (past_key,
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
    Value *ins[4] = {q, k, v, NULL};
    int n = 3;
    if (mask) {
        if (mask->dtype == KILN_DTYPE_BOOL) { /* true: attend; false: -inf */
            Value *w[3] = {mask, const_scalar(c, q->dtype, 0.0),
                           const_scalar(c, q->dtype, -INFINITY)};
            mask = finish(c, emit_tmp(c, OP_WHERE, 3, w));
        }
        ins[n++] = mask;
    }
    bool causal = oattr_int(c, "is_causal", 0) != 0;
    int64_t sq = q->shape[q->rank == 4 ? 2 : 1], sk = k->shape[k->rank == 4 ? 2 : 1];
    if (causal && sq != sk) /* ONNX aligns to the cache's length, which is 0 here */
        node_fail(c, format("unsupported: is_causal with %lld queries and %lld keys and no "
                            "past_key (kiln's causal mask is aligned to the newest key)",
                            (long long)sq, (long long)sk));
    Node *kn = emit(c, OP_ATTENTION, n, ins, out_name(c, 0));
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
    finish(c, kn);
}
