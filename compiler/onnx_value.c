/*
 * onnx_value.c: what the ONNX loader's parts share: values (a kiln tensor,
 * and a constant's bytes), ONNX dtypes, TensorProto decoding (raw, typed and
 * external data), a node's inputs and attributes, and making kiln nodes
 * (each checked by its shape rule as it is made).
 */
#include "onnx.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Noreturn void node_fail(Ctx *c, const char *msg) {
    error_at(c->loc, "node '%s': %s", c->nname, msg);
}

/* ---- dtypes and constants ---- */

int kiln_dtype_of(int32_t onnx) {
    switch (onnx) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: return KILN_DTYPE_F32;
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: return KILN_DTYPE_F16;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: return KILN_DTYPE_I32;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return KILN_DTYPE_I64;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: return KILN_DTYPE_BOOL;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8: return KILN_DTYPE_U8;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT8: return KILN_DTYPE_I8;
    default: return -1;
    }
}

const char *onnx_type_name(int32_t t) {
    static const char *const names[] = {"UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16",
                                        "INT16", "INT32", "INT64", "STRING", "BOOL",
                                        "FLOAT16", "DOUBLE", "UINT32", "UINT64",
                                        "COMPLEX64", "COMPLEX128", "BFLOAT16"};
    return t >= 0 && t <= 16 ? names[t] : "an unknown type";
}

bool is_integral(kiln_dtype d) { return d != KILN_DTYPE_F32 && d != KILN_DTYPE_F16; }

int64_t vcount(const Value *v) { return shape_count(v->rank, v->shape); }

double vget(const Value *v, int64_t i) {
    const uint8_t *p = v->data;
    switch (v->dtype) {
    case KILN_DTYPE_F32: { float f; memcpy(&f, p + 4 * i, 4); return f; }
    case KILN_DTYPE_F16: { uint16_t h; memcpy(&h, p + 2 * i, 2); return half_to_float(h); }
    case KILN_DTYPE_I32: { int32_t x; memcpy(&x, p + 4 * i, 4); return x; }
    case KILN_DTYPE_I64: { int64_t x; memcpy(&x, p + 8 * i, 8); return (double)x; }
    case KILN_DTYPE_BOOL:
    case KILN_DTYPE_U8: return p[i];
    case KILN_DTYPE_I8: return (int8_t)p[i];
    }
    return 0;
}

int64_t vgeti(const Value *v, int64_t i) {
    if (v->dtype == KILN_DTYPE_I64) {
        int64_t x;
        memcpy(&x, v->data + 8 * i, 8);
        return x;
    }
    return double_to_i64(vget(v, i));
}

void vset(Value *v, int64_t i, double d) {
    uint8_t *p = v->data;
    switch (v->dtype) {
    case KILN_DTYPE_F32: { float f = (float)d; memcpy(p + 4 * i, &f, 4); break; }
    case KILN_DTYPE_F16: { uint16_t h = float_to_half((float)d); memcpy(p + 2 * i, &h, 2); break; }
    case KILN_DTYPE_I32: { int32_t x = (int32_t)(uint32_t)double_to_i64(d); memcpy(p + 4 * i, &x, 4); break; }
    case KILN_DTYPE_I64: { int64_t x = double_to_i64(d); memcpy(p + 8 * i, &x, 8); break; }
    case KILN_DTYPE_BOOL: p[i] = d != 0; break;
    case KILN_DTYPE_U8: p[i] = (uint8_t)double_to_i64(d); break;
    case KILN_DTYPE_I8: p[i] = (uint8_t)double_to_i64(d); break;
    }
}

void vseti(Value *v, int64_t i, int64_t x) {
    if (v->dtype == KILN_DTYPE_I64)
        memcpy(v->data + 8 * i, &x, 8);
    else
        vset(v, i, (double)x);
}

/* Element j of v into element i of o (integers exactly, past 2^53 too). */
void vcopy(Value *o, int64_t i, const Value *v, int64_t j) {
    if (is_integral(o->dtype))
        vseti(o, i, vgeti(v, j));
    else
        vset(o, i, vget(v, j));
}

Value *new_value(const char *name, kiln_dtype dt, int rank, const int64_t *shape,
                 bool constant) {
    Value *v = xcalloc(1, sizeof *v);
    v->name = xstrdup(name);
    v->dtype = dt;
    v->rank = rank;
    if (rank)
        memcpy(v->shape, shape, sizeof(int64_t) * (size_t)rank);
    if (constant)
        v->data = v->alloc = xcalloc((size_t)(vcount(v) * kiln_dtype_size(dt)) + 1, 1);
    return v;
}

void bind_value(Ctx *c, const char *name, Value *v) {
    if (!*name)
        return; /* an omitted optional output */
    v->name = xstrdup(name);
    map_put(&c->values, v->name, v);
}

Value *range_node(Ctx *c, const DimExpr *size, const DimExpr *start, int64_t delta,
                  kiln_dtype dt, const char *out) {
    Node *k = *out ? emit(c, OP_RANGE, 0, NULL, out) : emit_tmp(c, OP_RANGE, 0, NULL);
    node_set_attr(k, "size", dim_expr_str(c->g, size));
    node_set_attr(k, "start", dim_expr_str(c->g, start));
    node_set_int(k, "delta", delta);
    node_set_attr(k, "dtype", kiln_dtype_name(dt));
    return finish(c, k);
}

/* A value that follows the dims, computed on the GPU where a kernel reads
 * it: one range node when its elements step by a constant, else one per
 * element, concatenated; shaped (and typed) as the value. */
static Tensor *sym_tensor(Ctx *c, Value *v) {
    kiln_dtype dt = v->dtype == KILN_DTYPE_I32 ? KILN_DTYPE_I32 : KILN_DTYPE_I64;
    int64_t n = vcount(v), delta = 1;
    bool steps = true;
    for (int64_t i = 1; i < n; i++) {
        DimExpr neg = dim_expr_scale(&v->sym[i - 1], -1);
        DimExpr d = dim_expr_add(&v->sym[i], &neg);
        if (!dim_expr_const(&d) || (i > 1 && d.c0 != delta))
            steps = false;
        delta = d.c0;
    }
    DimExpr one = {1, {0}}, size = {n, {0}};
    Value *r;
    if (steps) {
        r = range_node(c, &size, &v->sym[0], delta, dt, "");
    } else {
        Value **parts = xcalloc((size_t)n, sizeof *parts);
        for (int64_t i = 0; i < n; i++)
            parts[i] = range_node(c, &one, &v->sym[i], 1, dt, "");
        Node *k = emit_tmp(c, OP_CONCAT, (int)n, parts);
        node_set_int(k, "axis", 0);
        r = finish(c, k);
    }
    Node *k = emit_tmp(c, OP_RESHAPE, 1, &r);
    node_set_ints(k, "shape", v->rank, v->shape);
    r = finish(c, k);
    if (r->dtype != v->dtype) {
        k = emit_tmp(c, OP_CAST, 1, &r);
        node_set_attr(k, "to", kiln_dtype_name(v->dtype));
        r = finish(c, k);
    }
    return tens(c, r);
}

/* The kiln tensor of a value; constants become weights on first use. */
Tensor *tens(Ctx *c, Value *v) {
    if (v->t)
        return v->t;
    if (v->sym)
        return v->t = sym_tensor(c, v);
    if (!v->data)
        internal_error("value '%s' has neither a tensor nor data", v->name);
    Tensor *t = graph_tensor(c->g, format("%s", v->name), T_WEIGHT, c->loc);
    t->dtype = v->dtype;
    t->rank = v->rank;
    memcpy(t->shape, v->shape, sizeof t->shape);
    t->data = v->data;
    t->owns_data = v->data == v->alloc;
    t->file_bytes = !t->owns_data;
    t->quant = v->quant;
    t->src.from = W_VALUES;
    v->t = t;
    return t;
}

Value *value_of_tensor(Tensor *t) {
    Value *v = new_value(t->name, t->dtype, t->rank, t->shape, false);
    v->t = t;
    return v;
}

/* ---- TensorProto ---- */

/* protobuf-c allocates through kiln's heap, so kiln_free_all frees the
 * decoded messages too. */
static void *pb_alloc(void *data, size_t size) {
    (void)data;
    return try_alloc(size);
}

static void pb_free(void *data, void *p) {
    (void)data;
    xfree(p);
}

ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

/* Decodes a TensorProto into a constant Value; `what` names it in errors. */
Value *decode_tensor(const char *path, const char *dir, Onnx__TensorProto *tp,
                     const char *what, Loc loc, bool borrow) {
    int dt = kiln_dtype_of(tp->data_type);
    if (dt < 0)
        error_at(loc, "unsupported: %s has dtype %s", what, onnx_type_name(tp->data_type));
    if (tp->n_dims > MAX_RANK)
        error_at(loc, "unsupported: %s has rank %zu; kiln supports up to %d", what,
                 tp->n_dims, MAX_RANK);
    double count = 1;
    for (size_t i = 0; i < tp->n_dims; i++) {
        if (tp->dims[i] < 0)
            error_at(loc, "%s has a negative dimension", what);
        count *= (double)tp->dims[i];
    }
    if (count > 4294967295.0)
        error_at(loc, "%s has more than 2^32 - 1 elements", what);
    /* Every size is checked against the data present before anything is
     * allocated: a few bytes of protobuf must not claim gigabytes. */
    int64_t n = (int64_t)count;
    size_t bytes = (size_t)n * kiln_dtype_size((kiln_dtype)dt);
    const char *name = tp->name ? tp->name : "";
    if (tp->has_data_location &&
        tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        const char *file = NULL;
        long long offset = 0, length = -1;
        for (size_t i = 0; i < tp->n_external_data; i++) {
            Onnx__StringStringEntryProto *e = tp->external_data[i];
            if (!e->key || !e->value)
                continue;
            if (strcmp(e->key, "location") == 0)
                file = e->value;
            else if (strcmp(e->key, "offset") == 0)
                offset = atoll(e->value);
            else if (strcmp(e->key, "length") == 0)
                length = atoll(e->value);
        }
        if (!file || strstr(file, ".."))
            error_at(loc, "%s: external data without a usable location", what);
        if (length >= 0 && (size_t)length != bytes)
            error_at(loc, "%s: external data length %lld, the tensor needs %zu bytes", what,
                     length, bytes);
        char *full = format("%s/%s", dir, file);
        uint64_t size = 0;
        FILE *f = open_regular(full, &size);
        if (!f)
            error_at(loc, "%s: cannot read external data %s: %s", what, full, strerror(errno));
        bool fits = offset >= 0 && (uint64_t)offset <= size && size - (uint64_t)offset >= bytes;
        Value *v = fits ? new_value(name, (kiln_dtype)dt, (int)tp->n_dims, tp->dims, true) : NULL;
        bool ok = fits && read_at(f, (uint64_t)offset, v->data, bytes);
        fclose(f);
        if (!fits)
            error_at(loc, "%s: %s has %llu bytes, the tensor needs %zu at offset %lld", what,
                     full, (unsigned long long)size, bytes, offset);
        if (!ok)
            error_at(loc, "%s: cannot read external data %s", what, full);
        (void)path;
        return v;
    }
    if (tp->has_raw_data) {
        if (tp->raw_data.len != bytes)
            error_at(loc, "%s: raw data of %zu bytes, the tensor needs %zu", what,
                     tp->raw_data.len, bytes);
        borrow &= tp->raw_data.data != NULL;
        Value *v = new_value(name, (kiln_dtype)dt, (int)tp->n_dims, tp->dims, !borrow);
        if (borrow) /* kiln reads and writes weights with memcpy: any alignment */
            v->data = tp->raw_data.data;
        else if (bytes) /* an empty tensor may have no data pointer */
            memcpy(v->data, tp->raw_data.data, bytes);
        return v;
    }
    size_t have = dt == KILN_DTYPE_F32   ? tp->n_float_data
                  : dt == KILN_DTYPE_I64 ? tp->n_int64_data
                                         : tp->n_int32_data;
    if (have != (size_t)n)
        error_at(loc, "%s: %zu values for %lld elements", what, have, (long long)n);
    Value *v = new_value(name, (kiln_dtype)dt, (int)tp->n_dims, tp->dims, true);
    for (int64_t i = 0; i < n; i++) {
        if (v->dtype == KILN_DTYPE_F32)
            vset(v, i, tp->float_data[i]);
        else if (v->dtype == KILN_DTYPE_I64)
            vseti(v, i, tp->int64_data[i]);
        else if (v->dtype == KILN_DTYPE_F16) {
            uint16_t h = (uint16_t)tp->int32_data[i];
            memcpy(v->data + 2 * i, &h, 2);
        } else
            vset(v, i, tp->int32_data[i]);
    }
    return v;
}

/* A TensorProto file (kiln tensor, --const), decoded; `what` names it. */
Value *read_tensor_file(const char *path, const char *what) {
    size_t size;
    char *raw = read_file(path, &size);
    Loc loc = {path, 0, 0};
    if (!raw)
        error_at(loc, "cannot read: %s", strerror(errno));
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(&pb_allocator, size, (const uint8_t *)raw);
    if (!tp)
        error_at(loc, "not a valid ONNX TensorProto");
    const char *slash = strrchr(path, '/');
    char *dir = slash ? format("%.*s", (int)(slash - path), path) : xstrdup(".");
    return decode_tensor(path, dir, tp, what, loc, false);
}

int convert_tensor(const char *in, const char *out) {
    Value *v = read_tensor_file(in, "the tensor");
    size_t bytes = (size_t)vcount(v) * kiln_dtype_size(v->dtype);
    size_t n = strlen(out);
    Str file = {0};
    if (n >= 4 && strcmp(out + n - 4, ".npy") == 0) { /* NumPy format 1.0 */
        static const char *const descr[] = {"<f4", "<f2", "<i4", "<i8", "|b1", "|u1", "|i1"};
        Str dict = {0};
        str_addf(&dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr[v->dtype]);
        for (int i = 0; i < v->rank; i++)
            str_addf(&dict, "%lld,%s", (long long)v->shape[i], i + 1 < v->rank ? " " : "");
        str_add(&dict, "), }");
        while ((10 + dict.len + 1) % 64) /* the data starts 64-byte aligned */
            str_add(&dict, " ");
        str_add(&dict, "\n");
        uint8_t head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(dict.len & 0xff),
                            (uint8_t)(dict.len >> 8)};
        str_addn(&file, head, sizeof head);
        str_addn(&file, dict.buf, dict.len);
    }
    str_addn(&file, bytes ? (const char *)v->data : "", bytes);
    if (!write_file(out, file.buf ? file.buf : "", file.len))
        fatal("cannot write %s: %s", out, strerror(errno));
    printf("%s %s %s\n", kiln_dtype_name(v->dtype), shape_str(v->rank, v->shape), v->name);
    return 0;
}

/* ---- node inputs, outputs, attributes ---- */

int nin(Ctx *c) { return (int)c->node->n_input; }
int nout(Ctx *c) { return (int)c->node->n_output; }

/* Input i, or NULL when absent (an empty name or past the end). */
Value *in_opt(Ctx *c, int i) {
    if (i >= nin(c) || !c->node->input[i] || !*c->node->input[i])
        return NULL;
    Value *v = map_get(&c->values, c->node->input[i]);
    if (!v)
        node_fail(c, format("input '%s' is not defined before it is used",
                            c->node->input[i]));
    return v;
}

Value *in(Ctx *c, int i) {
    Value *v = in_opt(c, i);
    if (!v)
        node_fail(c, format("input %d is missing", i));
    return v;
}

/* The graph inputs that value `name` is computed from, appended to *s as
 * "'a', 'b'" (the first few), found by walking back through the nodes that
 * produced it. */
static void source_inputs(Ctx *c, const char *name, Map *seen, Str *s, int *count) {
    if (!*name || map_get(seen, name) || *count >= 4)
        return;
    static int mark;
    map_put(seen, name, &mark);
    Onnx__NodeProto *n = map_get(&c->producer, name);
    if (!n) {
        Value *v = map_get(&c->values, name);
        if (v && !v->data)
            str_addf(s, "%s'%s'", (*count)++ ? ", " : "", name);
        return;
    }
    for (size_t i = 0; i < n->n_input; i++)
        source_inputs(c, n->input[i], seen, s, count);
}

/* The node on the way to value `name` that takes a value following the
 * dynamic dims but gives one kiln does not follow (a product of two dims, a
 * division that is not exact, a comparison their ranges leave open), or
 * NULL when none does. */
static Onnx__NodeProto *unfollowed_node(Ctx *c, const char *name, Map *seen) {
    if (!*name || map_get(seen, name))
        return NULL;
    static int mark;
    map_put(seen, name, &mark);
    Onnx__NodeProto *n = map_get(&c->producer, name);
    if (!n)
        return NULL;
    for (size_t i = 0; i < n->n_input; i++) {
        Value *v = *n->input[i] ? map_get(&c->values, n->input[i]) : NULL;
        if (v && v->sym)
            return n;
    }
    for (size_t i = 0; i < n->n_input; i++) {
        Onnx__NodeProto *u = unfollowed_node(c, n->input[i], seen);
        if (u)
            return u;
    }
    return NULL;
}

/* An input that kiln needs as a constant (it becomes an attribute). When
 * it is computed from graph inputs, the refusal names them: `--const
 * NAME=FILE` fixes an input's value at compile time; when from the dynamic
 * dims, it names the node whose result kiln could not follow. */
Value *in_const(Ctx *c, int i, const char *what) {
    Value *v = in(c, i);
    if (v->data)
        return v;
    if (v->sym)
        node_fail(c, format("unsupported: %s (input %d, '%s') follows the dynamic dims (%s...); "
                            "kiln needs a constant here", what, i, v->name,
                            dim_expr_str(c->g, &v->sym[0])));
    Map seen = {0}, walked = {0};
    Str from = {0};
    int count = 0;
    Onnx__NodeProto *u = c->g->ndims ? unfollowed_node(c, v->name, &walked) : NULL;
    if (u)
        node_fail(c, format("unsupported: %s (input %d, '%s') must be known when kiln compiles "
                            "or follow the dynamic dims as a sum of them; it is computed from "
                            "the dims by %s%s%s (%s), whose result kiln does not follow "
                            "(a product of two dims, a division that is not exact, a "
                            "comparison or min/max that the dims' ranges leave open: "
                            "docs/onnx.md, Decoders with their key/value cache)",
                            what, i, v->name, u->name && *u->name ? "node '" : "the node of '",
                            u->name && *u->name ? u->name
                                                : u->n_output ? u->output[0] : "?", "'",
                            u->op_type));
    source_inputs(c, v->name, &seen, &from, &count);
    if (count && map_get(&c->producer, v->name)) /* computed, not an input itself */
        node_fail(c, format("unsupported: %s (input %d, '%s') must be a constant: kiln's "
                            "shapes are static; it is computed from graph input%s %s "
                            "(--const NAME=FILE fixes an input's value)",
                            what, i, v->name, count > 1 ? "s" : "", from.buf));
    node_fail(c, format("unsupported: %s (input %d, '%s') must be a constant: kiln's "
                        "shapes are static", what, i, v->name));
    return v;
}

const char *out_name(Ctx *c, int i) {
    return i < nout(c) && c->node->output[i] ? c->node->output[i] : "";
}

Onnx__AttributeProto *oattr(Ctx *c, const char *name) {
    for (size_t i = 0; i < c->node->n_attribute; i++)
        if (c->node->attribute[i]->name && strcmp(c->node->attribute[i]->name, name) == 0)
            return c->node->attribute[i];
    return NULL;
}

/* An attribute type's name in the ONNX schema (INT, FLOATS, ...). */
static const char *attr_type_name(int type) {
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
        &onnx__attribute_proto__attribute_type__descriptor, type);
    return v ? v->name : "unknown";
}

/* The attribute `name`, which the op takes as `type`: one of another type
 * (a string given as a list of ints, an int as a float) is refused, naming
 * both, rather than read as its absence or as 0. An attribute without a
 * type (files from before types were written) is taken as it is. */
Onnx__AttributeProto *oattr_typed(Ctx *c, const char *name,
                                  Onnx__AttributeProto__AttributeType type) {
    Onnx__AttributeProto *a = oattr(c, name);
    if (a && a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__UNDEFINED && a->type != type)
        node_fail(c, format("attribute '%s' is of type %s; this op takes it as %s", name,
                            attr_type_name(a->type), attr_type_name(type)));
    return a;
}

Onnx__AttributeProto *oattr_ints(Ctx *c, const char *name) {
    return oattr_typed(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
}

int64_t oattr_int(Ctx *c, const char *name, int64_t dflt) {
    Onnx__AttributeProto *a = oattr_typed(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    return a ? a->i : dflt;
}

double oattr_float(Ctx *c, const char *name, double dflt) {
    Onnx__AttributeProto *a =
        oattr_typed(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    return a ? a->f : dflt;
}

const char *oattr_str(Ctx *c, const char *name, const char *dflt) {
    Onnx__AttributeProto *a =
        oattr_typed(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
    return a && a->has_s ? format("%.*s", (int)a->s.len, (const char *)a->s.data) : dflt;
}

/* ---- making kiln nodes ---- */

Node *knode(Ctx *c, OpKind op, const char *suffix) {
    return graph_node(c->g, op, format("%s%s", c->nname, suffix), c->loc);
}

/* A cast node (internal) unless v already has dtype dt. */
Value *cast_to(Ctx *c, Value *v, kiln_dtype dt) {
    if (v->dtype == dt)
        return v;
    Node *k = emit_tmp(c, OP_CAST, 1, &v);
    node_set_attr(k, "to", kiln_dtype_name(dt));
    return finish(c, k);
}

/* The ops whose kernels compute in f32 only (their shape rules require f32
 * data; precision.c's rule F32). Over an f16 model's values (a
 * model.half() export) they read casts of them to f32, and their f32
 * results are cast back to f16 under the ONNX names: the ONNX op of f16
 * computed in f32. */
static bool computes_f32(OpKind op) {
    switch (op) {
    case OP_CUMSUM: case OP_TOPK: case OP_SCATTER_ELEMENTS: case OP_SCATTER_ADD:
    case OP_GRID_SAMPLE: case OP_ROI_ALIGN: case OP_DET: case OP_DFT: case OP_STFT:
    case OP_NMS: case OP_SAMPLE:
        return true;
    default:
        return false;
    }
}

/* Input v of a node of `op`: as it is, or its cast to f32 (computes_f32). */
static Value *widen(Ctx *c, OpKind op, Value *v, bool *widened) {
    if (!v || !computes_f32(op) || v->dtype != KILN_DTYPE_F16)
        return v;
    *widened = true;
    return cast_to(c, v, KILN_DTYPE_F32);
}

/* A kiln node of `op` over x with `n` outputs: the ONNX node's, an absent
 * one under a temporary name. */
Node *emit_outputs(Ctx *c, OpKind op, Value *x, int n) {
    bool widened = false;
    x = widen(c, op, x, &widened);
    Node *k = knode(c, op, "");
    if (widened)
        vec_push(&c->widened, k);
    node_add_input(k, tens(c, x));
    for (int i = 0; i < n; i++)
        node_add_output(k, graph_tensor(c->g, *out_name(c, i) ? out_name(c, i)
                                                                : format("%s/%d", c->nname, i),
                                        T_VALUE, c->loc));
    return k;
}

/* A kiln node of `op` over values, producing ONNX output `out`. */
Node *emit(Ctx *c, OpKind op, int n, Value **ins, const char *out) {
    bool widened = false;
    Value **w = xcalloc((size_t)n + 1, sizeof *w);
    for (int i = 0; i < n; i++)
        w[i] = widen(c, op, ins[i], &widened);
    Node *k = knode(c, op, *out ? "" : "/tmp");
    if (widened)
        vec_push(&c->widened, k);
    for (int i = 0; i < n; i++) {
        if (!w[i])
            node_fail(c, format("input %d is missing", i));
        node_add_input(k, tens(c, w[i]));
    }
    xfree(w);
    node_add_output(k, graph_tensor(c->g, out, T_VALUE, c->loc));
    return k;
}

/* The same, with an internal output (for decompositions). */
Node *emit_tmp(Ctx *c, OpKind op, int n, Value **ins) {
    return emit(c, op, n, ins, format("%s/%d", c->nname, ++c->tmp_count));
}

/* Checks the node and binds its outputs to the ONNX names. */
Value *finish(Ctx *c, Node *k) {
    infer_node(k);
    infer_dynamic(c->g, k);
    int w = 0;
    while (w < c->widened.len && c->widened.data[w] != k)
        w++;
    if (w == c->widened.len)
        return bind_outputs(c, k);
    /* its f32 results back to f16, under their names (computes_f32) */
    c->widened.data[w] = c->widened.data[--c->widened.len];
    Value *first = NULL;
    for (int i = 0; i < k->noutputs; i++) {
        Tensor *t = k->outputs[i];
        Value *v = value_of_tensor(t);
        if (t->dtype == KILN_DTYPE_F32) {
            const char *name = t->name;
            t->name = xstrdup(format("%s/f32", name));
            Node *back = knode(c, OP_CAST, format("/%d", ++c->tmp_count));
            node_add_input(back, t);
            node_add_output(back, graph_tensor(c->g, name, T_VALUE, c->loc));
            node_set_attr(back, "to", kiln_dtype_name(KILN_DTYPE_F16));
            infer_node(back);
            infer_dynamic(c->g, back);
            v = value_of_tensor(back->outputs[0]);
        }
        map_put(&c->values, v->name, v);
        if (!first)
            first = v;
    }
    return first;
}

Value *bind_outputs(Ctx *c, Node *k) {
    Value *first = NULL;
    for (int i = 0; i < k->noutputs; i++) {
        Value *v = value_of_tensor(k->outputs[i]);
        map_put(&c->values, k->outputs[i]->name, v);
        if (!first)
            first = v;
    }
    return first;
}

/* Copies ONNX attributes onto a kiln node, renaming ("onnx:kiln") or
 * dropping ("onnx:-") as listed; any other attribute kiln's op does not take
 * is unsupported. */
void copy_attrs(Ctx *c, Node *k, const char *renames) {
    for (size_t i = 0; i < c->node->n_attribute; i++) {
        Onnx__AttributeProto *a = c->node->attribute[i];
        const char *key = a->name;
        const char *to = key;
        size_t n = strlen(key);
        for (const char *p = renames; p && *p;) {
            while (*p == ' ')
                p++;
            const char *colon = strchr(p, ':'), *end = strchr(p, ' ');
            if (!end)
                end = p + strlen(p);
            if (colon && colon < end && (size_t)(colon - p) == n && strncmp(p, key, n) == 0) {
                to = format("%.*s", (int)(end - colon - 1), colon + 1);
                break;
            }
            p = end;
        }
        /* Bookkeeping of opsets before 7, meaningless for inference. */
        if (strcmp(to, "-") == 0 || strcmp(key, "consumed_inputs") == 0 ||
            strcmp(key, "is_test") == 0)
            continue;
        if (!op_attr_default(k->op, to))
            node_fail(c, format("unsupported: attribute %s", key));
        switch (a->type) {
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT: node_set_int(k, to, a->i); break;
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT: node_set_float(k, to, a->f); break;
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING:
            node_set_attr(k, to, format("%.*s", (int)a->s.len, (const char *)a->s.data));
            break;
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS:
            node_set_ints(k, to, (int)a->n_ints, a->ints);
            break;
        case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS: {
            double *f = xcalloc(a->n_floats + 1, sizeof(double));
            for (size_t j = 0; j < a->n_floats; j++)
                f[j] = a->floats[j];
            node_set_floats(k, to, (int)a->n_floats, f);
            break;
        }
        default:
            node_fail(c, format("unsupported: attribute %s of this type", key));
        }
    }
}

int shape_ints(Ctx *c, int i, const char *what, int64_t *out, DimExpr *exprs, bool *dynamic,
               int max) {
    Value *v = in(c, i);
    *dynamic = false;
    if (!v->sym) {
        int n = const_ints(c, i, what, out, max);
        for (int j = 0; j < n; j++) {
            memset(&exprs[j], 0, sizeof exprs[j]);
            exprs[j].c0 = out[j];
        }
        return n;
    }
    int64_t n = vcount(v);
    if (n > max)
        node_fail(c, format("%s has %lld values, at most %d", what, (long long)n, max));
    for (int64_t j = 0; j < n; j++) {
        exprs[j] = v->sym[j];
        out[j] = dim_expr_max(c->g, &v->sym[j]);
        *dynamic |= !dim_expr_const(&v->sym[j]);
    }
    return (int)n;
}

void follow_shape(Ctx *c, Tensor *t, int n, const DimExpr *exprs) {
    if (n > t->rank)
        return;
    for (int j = 0; j < n; j++) {
        int a = t->rank - n + j;
        const DimExpr *e = &exprs[j];
        if (dim_expr_const(e))
            continue;
        if (is_dyn(t, a)) {
            if (!dim_expr_eq(&t->ext[a], e))
                node_fail(c, format("unsupported: axis %d of '%s' follows %s, but the shape "
                                    "input says %s; kiln cannot prove them equal", a,
                                    t->name, dim_expr_str(c->g, &t->ext[a]),
                                    dim_expr_str(c->g, e)));
            continue;
        }
        if (t->shape[a] != dim_expr_max(c->g, e))
            node_fail(c, format("unsupported: axis %d of '%s' has %lld elements, but the shape "
                                "input says %s", a, t->name, (long long)t->shape[a],
                                dim_expr_str(c->g, e)));
        t->dyn_axes |= 1u << a;
        t->ext[a] = *e;
    }
    update_prefix(t);
}

/* Values of a constant integer input as int64 (for attributes). */
int const_ints(Ctx *c, int i, const char *what, int64_t *out, int max) {
    Value *v = in_const(c, i, what);
    int64_t n = vcount(v);
    if (n > max)
        node_fail(c, format("%s has %lld values, at most %d", what, (long long)n, max));
    for (int64_t j = 0; j < n; j++)
        out[j] = vgeti(v, j);
    return (int)n;
}

/* The folder and the op mappers: a file of their own, sharing the helpers
 * above. */
