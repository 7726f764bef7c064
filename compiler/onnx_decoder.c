/*
 * onnx_decoder.c: a decoder exported with its key/value cache, compiled so
 * that the cache lives on the GPU.
 *
 * The layout that exporters write for a causal language model (optimum,
 * onnxruntime-genai, torch.onnx's export of transformers models): inputs
 * input_ids [batch, seq], attention_mask [batch, past + seq], position_ids
 * [batch, seq] (optional) and past_key_values.N.key / .value [batch,
 * kv_heads, past, head_dim]; outputs logits and present.N.key / .value, the
 * past concatenated with this step's keys and values along the positions.
 * Each exporter names the dynamic axes its own way (torch's dynamo export
 * gives every one its own symbol, even those the graph forces equal), so
 * kiln binds them itself: input_ids' and position_ids' axis 1 to the dim
 * `seq`, every past input's axis 2 to `past`, attention_mask's axis 1 to
 * past + seq.
 *
 * Each past input becomes a state in [batch, position, kv_heads, head_dim]
 * order (its dynamic axis outermost: a run's cache is a prefix of its
 * bytes), and the graph reads it through a transpose back to the exported
 * order. The exporter's Concat(past, new) becomes an append to the state in
 * place (this step's keys moved to the state's order, written after the
 * past), read back in the exported order; present.N.* are then no outputs:
 * the states hold them (kiln_model_read_state).
 */
#include "onnx.h"

#include <string.h>

#define PAST_PREFIX "past_key_values."
#define PRESENT_PREFIX "present."

static const Onnx__ValueInfoProto *find_info(Onnx__ValueInfoProto **list, size_t n,
                                             const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i]->name, name) == 0)
            return list[i];
    return NULL;
}

bool onnx_is_decoder(const Onnx__GraphProto *gp) {
    if (!find_info(gp->input, gp->n_input, "input_ids"))
        return false;
    int npast = 0;
    for (size_t i = 0; i < gp->n_input; i++) {
        const char *name = gp->input[i]->name;
        if (strncmp(name, PAST_PREFIX, strlen(PAST_PREFIX)) != 0)
            continue;
        const char *rest = name + strlen(PAST_PREFIX);
        if (!find_info(gp->output, gp->n_output, format(PRESENT_PREFIX "%s", rest)))
            return false;
        npast++;
    }
    return npast > 0;
}

bool onnx_is_past(const char *name) {
    return strncmp(name, PAST_PREFIX, strlen(PAST_PREFIX)) == 0;
}

bool onnx_is_present(Ctx *c, const char *name) {
    return map_get(&c->present_states, name) != NULL;
}

/* The expression of symbolic dimension `param` is e; the same name
 * elsewhere must mean the same. */
static void bind_param(Ctx *c, const Onnx__TensorShapeProto__Dimension *dim, DimExpr e,
                       const char *input, int axis) {
    Loc file = {c->path, 0, 0};
    if (dim->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM ||
        !dim->dim_param || !*dim->dim_param)
        error_at(file, "decoder input '%s': axis %d should be symbolic (the exporter's "
                 "dynamic axis), not fixed", input, axis);
    DimExpr *old = map_get(&c->dim_exprs, dim->dim_param);
    if (old && !dim_expr_eq(old, &e))
        error_at(file, "decoder input '%s': axis %d is '%s', which another input uses as %s",
                 input, axis, dim->dim_param, dim_expr_str(c->g, old));
    DimExpr *p = xcalloc(1, sizeof *p);
    *p = e;
    map_put(&c->dim_exprs, dim->dim_param, p);
}

void onnx_decoder_dims(Ctx *c, const Onnx__GraphProto *gp) {
    Graph *g = c->g;
    Loc file = {c->path, 0, 0};
    /* seq: new tokens a run takes (the prompt, then 1); past: tokens in the
     * cache before them. The context is past + seq. */
    if (find_dim(g, "seq") < 0)
        declare_dim(g, "seq", 1, 128, file);
    if (find_dim(g, "past") < 0)
        declare_dim(g, "past", 0, 384, file);
    DimExpr seq = {0}, past = {0}, total;
    seq.c[find_dim(g, "seq")] = 1;
    past.c[find_dim(g, "past")] = 1;
    total = dim_expr_add(&seq, &past);
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        const char *name = vi->name;
        bool ids = strcmp(name, "input_ids") == 0 || strcmp(name, "position_ids") == 0;
        bool mask = strcmp(name, "attention_mask") == 0, past_in = onnx_is_past(name);
        if (!ids && !mask && !past_in)
            continue;
        const Onnx__TypeProto__Tensor *tt =
            vi->type && vi->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE
                ? vi->type->tensor_type : NULL;
        size_t want = past_in ? 4 : 2;
        if (!tt || !tt->shape || tt->shape->n_dim != want)
            error_at(file, "decoder input '%s' should have rank %zu ([batch, %s])", name,
                     want, past_in ? "kv_heads, past, head_dim" : mask ? "past + seq" : "seq");
        const Onnx__TensorShapeProto__Dimension *b = tt->shape->dim[0];
        if (b->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE ||
            b->dim_value != 1)
            error_at(file, "unsupported: decoder input '%s' has batch %s; kiln decodes one "
                     "sequence (export with batch 1)", name,
                     b->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE
                         ? format("%lld", (long long)b->dim_value) : "symbolic");
        if (past_in)
            bind_param(c, tt->shape->dim[2], past, name, 2);
        else
            bind_param(c, tt->shape->dim[1], mask ? total : seq, name, 1);
    }
}

Value *onnx_decoder_past(Ctx *c, const Onnx__ValueInfoProto *vi, kiln_dtype dt,
                         const int64_t *dims) {
    Graph *g = c->g;
    Loc file = {c->path, 0, 0};
    int p = find_dim(g, "past");
    DimExpr past = {0};
    past.c[p] = 1;
    /* The state: [1, past, kv_heads, head_dim]. */
    Tensor *s = graph_tensor(g, format("%s.state", vi->name), T_STATE, file);
    s->dtype = dt;
    s->rank = 4;
    s->shape[0] = 1;
    s->shape[1] = g->dims[p].hi;
    s->shape[2] = dims[1];
    s->shape[3] = dims[3];
    set_dyn_axis(s, 1, &past);
    vec_push(&g->states, s);
    map_put(&c->past_states, vi->name, s);
    /* The graph reads it as [1, kv_heads, past, head_dim]. */
    c->nname = vi->name;
    Value *sv = value_of_tensor(s);
    Node *k = emit(c, OP_TRANSPOSE, 1, &sv, vi->name);
    node_set_ints(k, "perm", 4, (int64_t[]){0, 2, 1, 3});
    return finish(c, k);
}

/* Concat(past, new) along the positions: new appended to the state in
 * place, the whole cache read back in the exported order. */
bool onnx_decoder_append(Ctx *c) {
    if (nin(c) != 2)
        return false;
    Tensor *s = map_get(&c->past_states, c->node->input[0]);
    if (!s)
        return false;
    int64_t axis = oattr_int(c, "axis", 0);
    if (axis != 2 && axis != -2)
        node_fail(c, "unsupported: the cache concatenated along an axis other than the "
                     "positions (axis 2)");
    const char *present = out_name(c, 0);
    if (s->update)
        node_fail(c, format("unsupported: '%s' is appended to twice", c->node->input[0]));
    Value *x = in(c, 1);
    Node *t = emit_tmp(c, OP_TRANSPOSE, 1, &x);
    node_set_ints(t, "perm", 4, (int64_t[]){0, 2, 1, 3});
    Value *parts[2] = {value_of_tensor(s), finish(c, t)};
    Node *cat = emit(c, OP_CONCAT, 2, parts, format("%s.state", present));
    node_set_int(cat, "axis", 1);
    Value *uv = finish(c, cat);
    s->update = uv->t;
    s->update_loc = c->loc;
    uv->t->is_update = true;
    Node *back = emit(c, OP_TRANSPOSE, 1, &uv, present);
    node_set_ints(back, "perm", 4, (int64_t[]){0, 2, 1, 3});
    finish(c, back);
    map_put(&c->present_states, present, s);
    return true;
}
