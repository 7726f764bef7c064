/*
 * load_onnx.c: ONNX models into a Graph.
 *
 * The file is parsed by protobuf-c with code generated from Debian's
 * onnx.proto (no hand-written protobuf parser). Then, in the graph's order
 * (ONNX requires nodes to be topologically sorted):
 *
 *  - initializers become weights (raw_data, the typed fields, or external
 *    data files beside the model, sizes checked); graph inputs without an
 *    initializer become the model's inputs, their symbolic dimensions fixed
 *    by --shape NAME=AxBxC;
 *  - every value is tracked as a Value: a kiln tensor, and for constants
 *    its bytes. Nodes whose inputs are all constants and that compute shapes
 *    (Shape, Gather, Concat, Slice, Unsqueeze, arithmetic, Range,
 *    ConstantOfShape, Cast, ...) are folded on the CPU here, since kiln's
 *    shapes are static; a folded value becomes a weight only if a kernel or
 *    an output needs it;
 *  - every other node maps to kiln nodes: one for most ops, a few for
 *    decompositions (variadic Sum/Mean/Max/Min, Softmax of opsets before 13,
 *    Hardmax, PRelu-like forms); inputs that ONNX passes as tensors but kiln
 *    takes as attributes (Reshape's shape, Slice's starts, Pad's pads, TopK's
 *    K, ...) must be constants. Each kiln node is checked by its shape rule
 *    as it is made, so a later Shape node sees real shapes.
 *
 * Before any of that, every node's op type is checked: all unsupported op
 * types are reported in one message (with their node names and counts).
 * Errors name the node and its op type; nothing is written on error.
 * Messages for a legal model that kiln cannot run begin with "unsupported".
 */
#include "kiln.h"
#include "onnx.pb-c.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Value {
    const char *name;
    kiln_dtype dtype;
    int rank;
    int64_t shape[MAX_RANK];
    uint8_t *data; /* a constant's bytes (kiln layout), or NULL */
    Tensor *t;     /* the kiln tensor, once one exists */
} Value;

typedef struct Ctx {
    const char *path, *dir;
    Graph *g;
    Map values;            /* name -> Value* */
    int64_t opset;
    Onnx__NodeProto *node; /* the node being mapped */
    const char *nname;     /* "name (OpType)" */
    Loc loc;
} Ctx;

#define MAX_CONST_FOLD (1 << 22) /* elements a folded constant may have */

static _Noreturn void node_fail(Ctx *c, const char *msg) {
    error_at(c->loc, "node '%s': %s", c->nname, msg);
}

/* ---- dtypes and constants ---- */

static int kiln_dtype_of(int32_t onnx) {
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

static const char *onnx_type_name(int32_t t) {
    static const char *const names[] = {"UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16",
                                        "INT16", "INT32", "INT64", "STRING", "BOOL",
                                        "FLOAT16", "DOUBLE", "UINT32", "UINT64",
                                        "COMPLEX64", "COMPLEX128", "BFLOAT16"};
    return t >= 0 && t <= 16 ? names[t] : "an unknown type";
}

static bool is_integral(kiln_dtype d) { return d != KILN_DTYPE_F32 && d != KILN_DTYPE_F16; }

static int64_t vcount(const Value *v) { return shape_count(v->rank, v->shape); }

static double vget(const Value *v, int64_t i) {
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

static int64_t vgeti(const Value *v, int64_t i) {
    if (v->dtype == KILN_DTYPE_I64) {
        int64_t x;
        memcpy(&x, v->data + 8 * i, 8);
        return x;
    }
    return double_to_i64(vget(v, i));
}

static void vset(Value *v, int64_t i, double d) {
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

static void vseti(Value *v, int64_t i, int64_t x) {
    if (v->dtype == KILN_DTYPE_I64)
        memcpy(v->data + 8 * i, &x, 8);
    else
        vset(v, i, (double)x);
}

static Value *new_value(const char *name, kiln_dtype dt, int rank, const int64_t *shape,
                        bool constant) {
    Value *v = xcalloc(1, sizeof *v);
    v->name = xstrdup(name);
    v->dtype = dt;
    v->rank = rank;
    if (rank)
        memcpy(v->shape, shape, sizeof(int64_t) * (size_t)rank);
    if (constant)
        v->data = xcalloc((size_t)(vcount(v) * kiln_dtype_size(dt)) + 1, 1);
    return v;
}

static void bind(Ctx *c, const char *name, Value *v) {
    if (!*name)
        return; /* an omitted optional output */
    v->name = xstrdup(name);
    map_put(&c->values, v->name, v);
}

/* The kiln tensor of a value; constants become weights on first use. */
static Tensor *tens(Ctx *c, Value *v) {
    if (v->t)
        return v->t;
    if (!v->data)
        internal_error("value '%s' has neither a tensor nor data", v->name);
    Tensor *t = graph_tensor(c->g, format("%s", v->name), T_WEIGHT, c->loc);
    t->dtype = v->dtype;
    t->rank = v->rank;
    memcpy(t->shape, v->shape, sizeof t->shape);
    t->data = v->data;
    t->src.from = W_VALUES;
    v->t = t;
    return t;
}

static Value *value_of_tensor(Tensor *t) {
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

static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

/* Decodes a TensorProto into a constant Value; `what` names it in errors. */
static Value *decode_tensor(const char *path, const char *dir, Onnx__TensorProto *tp,
                            const char *what, Loc loc) {
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
        Value *v = new_value(name, (kiln_dtype)dt, (int)tp->n_dims, tp->dims, true);
        if (bytes) /* an empty tensor may have no data pointer */
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
static Value *read_tensor_file(const char *path, const char *what) {
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
    return decode_tensor(path, dir, tp, what, loc);
}

int convert_tensor(const char *in, const char *out) {
    Value *v = read_tensor_file(in, "the tensor");
    size_t bytes = (size_t)vcount(v) * kiln_dtype_size(v->dtype);
    if (!write_file(out, v->data, bytes))
        fatal("cannot write %s", out);
    printf("%s %s %s\n", kiln_dtype_name(v->dtype), shape_str(v->rank, v->shape), v->name);
    return 0;
}

/* ---- node inputs, outputs, attributes ---- */

static int nin(Ctx *c) { return (int)c->node->n_input; }
static int nout(Ctx *c) { return (int)c->node->n_output; }

/* Input i, or NULL when absent (an empty name or past the end). */
static Value *in_opt(Ctx *c, int i) {
    if (i >= nin(c) || !c->node->input[i] || !*c->node->input[i])
        return NULL;
    Value *v = map_get(&c->values, c->node->input[i]);
    if (!v)
        node_fail(c, format("input '%s' is not defined before it is used",
                            c->node->input[i]));
    return v;
}

static Value *in(Ctx *c, int i) {
    Value *v = in_opt(c, i);
    if (!v)
        node_fail(c, format("input %d is missing", i));
    return v;
}

/* An input that kiln needs as a constant (it becomes an attribute). */
static Value *in_const(Ctx *c, int i, const char *what) {
    Value *v = in(c, i);
    if (!v->data)
        node_fail(c, format("unsupported: %s (input %d, '%s') must be a constant: kiln's "
                            "shapes are static", what, i, v->name));
    return v;
}

static const char *out_name(Ctx *c, int i) {
    return i < nout(c) && c->node->output[i] ? c->node->output[i] : "";
}

static Onnx__AttributeProto *oattr(Ctx *c, const char *name) {
    for (size_t i = 0; i < c->node->n_attribute; i++)
        if (c->node->attribute[i]->name && strcmp(c->node->attribute[i]->name, name) == 0)
            return c->node->attribute[i];
    return NULL;
}

static int64_t oattr_int(Ctx *c, const char *name, int64_t dflt) {
    Onnx__AttributeProto *a = oattr(c, name);
    return a ? a->i : dflt;
}

static double oattr_float(Ctx *c, const char *name, double dflt) {
    Onnx__AttributeProto *a = oattr(c, name);
    return a ? a->f : dflt;
}

static const char *oattr_str(Ctx *c, const char *name, const char *dflt) {
    Onnx__AttributeProto *a = oattr(c, name);
    return a && a->has_s ? format("%.*s", (int)a->s.len, (const char *)a->s.data) : dflt;
}

/* ---- making kiln nodes ---- */

static Node *knode(Ctx *c, OpKind op, const char *suffix) {
    return graph_node(c->g, op, format("%s%s", c->nname, suffix), c->loc);
}

/* A kiln node of `op` over values, producing ONNX output `out`. */
static Node *emit(Ctx *c, OpKind op, int n, Value **ins, const char *out) {
    Node *k = knode(c, op, *out ? "" : "/tmp");
    for (int i = 0; i < n; i++) {
        if (!ins[i])
            node_fail(c, format("input %d is missing", i));
        node_add_input(k, tens(c, ins[i]));
    }
    node_add_output(k, graph_tensor(c->g, out, T_VALUE, c->loc));
    return k;
}

static int tmp_count;

/* The same, with an internal output (for decompositions). */
static Node *emit_tmp(Ctx *c, OpKind op, int n, Value **ins) {
    return emit(c, op, n, ins, format("%s/%d", c->nname, ++tmp_count));
}

/* Checks the node and binds its outputs to the ONNX names. */
static Value *finish(Ctx *c, Node *k) {
    infer_node(k);
    infer_dynamic(c->g, k);
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
static void copy_attrs(Ctx *c, Node *k, const char *renames) {
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

/* Values of a constant integer input as int64 (for attributes). */
static int const_ints(Ctx *c, int i, const char *what, int64_t *out, int max) {
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
#include "onnx_ops.inc"

/* ---- the model ---- */

/* protobuf-c leaves absent strings NULL; kiln reads names everywhere, so an
 * absent one becomes "" here, once. */
static void fill_string(char **s) {
    if (!*s)
        *s = (char *)"";
}

static void fill_absent_names(Onnx__GraphProto *gp) {
    fill_string(&gp->name);
    Onnx__ValueInfoProto **lists[3] = {gp->input, gp->output, gp->value_info};
    size_t counts[3] = {gp->n_input, gp->n_output, gp->n_value_info};
    for (int l = 0; l < 3; l++)
        for (size_t i = 0; i < counts[l]; i++)
            fill_string(&lists[l][i]->name);
    for (size_t i = 0; i < gp->n_initializer; i++)
        fill_string(&gp->initializer[i]->name);
    for (size_t i = 0; i < gp->n_node; i++) {
        Onnx__NodeProto *n = gp->node[i];
        fill_string(&n->name);
        fill_string(&n->op_type);
        fill_string(&n->domain);
        for (size_t a = 0; a < n->n_attribute; a++) {
            fill_string(&n->attribute[a]->name);
            if (n->attribute[a]->t)
                fill_string(&n->attribute[a]->t->name);
        }
    }
}

static void check_supported(Onnx__GraphProto *gp, const char *path) {
    Str msg = {0};
    int kinds = 0;
    bool *done = xcalloc(gp->n_node + 1, sizeof(bool));
    for (size_t i = 0; i < gp->n_node; i++) {
        Onnx__NodeProto *n = gp->node[i];
        const char *op = n->op_type ? n->op_type : "";
        bool custom = n->domain && *n->domain && strcmp(n->domain, "ai.onnx") != 0;
        if (done[i] || (!custom && find_mapper(op)))
            continue;
        Str names = {0};
        int count = 0;
        for (size_t j = i; j < gp->n_node; j++) {
            Onnx__NodeProto *m = gp->node[j];
            if (strcmp(m->op_type ? m->op_type : "", op) == 0 &&
                strcmp(m->domain ? m->domain : "", n->domain ? n->domain : "") == 0) {
                done[j] = true;
                if (count < 5)
                    str_addf(&names, "%s'%s'", count ? ", " : "",
                             m->name && *m->name ? m->name : "(unnamed)");
                count++;
            }
        }
        str_addf(&msg, "\n  %s%s%s: %d node%s (%s%s)", custom ? n->domain : "",
                 custom ? "." : "", op, count, count == 1 ? "" : "s", names.buf,
                 count > 5 ? ", ..." : "");
        kinds++;
    }
    if (kinds) {
        Loc loc = {path, 0, 0};
        error_at(loc, "unsupported: %d op type%s:%s", kinds, kinds == 1 ? "" : "s", msg.buf);
    }
}

/* --shape NAME=AxBxC for input `name`; false when none is given. */
static bool shape_override(const char *name, int nshapes, const char **shapes, int *rank,
                           int64_t *dims) {
    size_t n = strlen(name);
    for (int i = 0; i < nshapes; i++) {
        if (strncmp(shapes[i], name, n) != 0 || shapes[i][n] != '=' || strstr(shapes[i], ".."))
            continue;
        const char *p = shapes[i] + n + 1;
        *rank = 0;
        while (*p) {
            char *end;
            long long v = strtoll(p, &end, 10);
            if (end == p || v < 0 || *rank == MAX_RANK)
                fatal("--shape %s: expected NAME=D0xD1x...", shapes[i]);
            dims[(*rank)++] = v;
            p = *end == 'x' ? end + 1 : end;
            if (*end && *end != 'x')
                fatal("--shape %s: expected NAME=D0xD1x...", shapes[i]);
        }
        return true;
    }
    return false;
}

/* --const NAME=TENSOR.pb for input `name`, decoded; NULL when none. */
static Value *const_override(Ctx *c, const char *name, int nconsts, const char **consts) {
    size_t n = strlen(name);
    for (int i = 0; i < nconsts; i++) {
        if (strncmp(consts[i], name, n) != 0 || consts[i][n] != '=')
            continue;
        return read_tensor_file(consts[i] + n + 1, format("--const %s", name));
    }
    (void)c;
    return NULL;
}

Graph *load_onnx(const char *path, int nshapes, const char **shapes, int nconsts,
                 const char **consts) {
    size_t size;
    char *raw = read_file(path, &size);
    Loc file = {path, 0, 0};
    if (!raw)
        error_at(file, "cannot read: %s", strerror(errno));
    return load_onnx_bytes(path, raw, size, nshapes, shapes, nconsts, consts);
}

Graph *load_onnx_bytes(const char *path, const char *raw, size_t size, int nshapes,
                       const char **shapes, int nconsts, const char **consts) {
    Loc file = {path, 0, 0};
    tmp_count = 0;
    Onnx__ModelProto *m = onnx__model_proto__unpack(&pb_allocator, size, (const uint8_t *)raw);
    if (!m)
        error_at(file, "not a valid ONNX model (malformed or truncated protobuf)");
    if (!m->graph)
        error_at(file, "the model has no graph");
    Ctx c = {0};
    c.path = path;
    const char *slash = strrchr(path, '/');
    c.dir = slash ? format("%.*s", (int)(slash - path), path) : ".";
    c.opset = 1;
    for (size_t i = 0; i < m->n_opset_import; i++) {
        Onnx__OperatorSetIdProto *o = m->opset_import[i];
        if (!o->domain || !*o->domain || strcmp(o->domain, "ai.onnx") == 0)
            c.opset = o->version;
    }
    if (c.opset < 1 || c.opset > 18)
        error_at(file, "unsupported: opset %lld (kiln reads opsets 1 to 18)",
                 (long long)c.opset);
    Onnx__GraphProto *gp = m->graph;
    fill_absent_names(gp);
    check_supported(gp, path);

    Graph *g = xcalloc(1, sizeof *g);
    g->path = path;
    g->name = gp->name && *gp->name ? xstrdup(gp->name) : "model";
    c.g = g;
    c.loc = file;

    for (size_t i = 0; i < gp->n_initializer; i++) {
        Onnx__TensorProto *tp = gp->initializer[i];
        Value *v = decode_tensor(path, c.dir, tp, format("initializer '%s'", tp->name), file);
        bind(&c, tp->name, v);
    }
    /* --shape NAME=LO..HI: a dynamic dimension for the symbolic dimension
     * (dim_param) NAME of the inputs. */
    for (int i = 0; i < nshapes; i++) {
        const char *eq = strchr(shapes[i], '=');
        int64_t lo, hi;
        if (!eq || !strstr(shapes[i], ".."))
            continue;
        if (!parse_dim_range(eq + 1, &lo, &hi))
            fatal("--shape %s: expected NAME=MIN..MAX", shapes[i]);
        declare_dim(g, format("%.*s", (int)(eq - shapes[i]), shapes[i]), lo, hi, file);
    }
    for (size_t i = 0; i < gp->n_input; i++) {
        Onnx__ValueInfoProto *vi = gp->input[i];
        if (map_get(&c.values, vi->name))
            continue; /* has an initializer: a constant */
        Value *fixed = const_override(&c, vi->name, nconsts, consts);
        if (fixed) {
            bind(&c, vi->name, fixed);
            continue;
        }
        if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
            error_at(file, "unsupported: input '%s' is not a tensor", vi->name);
        Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
        int dt = kiln_dtype_of(tt->elem_type);
        if (dt < 0)
            error_at(file, "unsupported: input '%s' has dtype %s", vi->name,
                     onnx_type_name(tt->elem_type));
        Tensor *t = graph_tensor(g, vi->name, T_INPUT, file);
        t->dtype = (kiln_dtype)dt;
        int rank;
        int64_t dims[MAX_RANK];
        if (shape_override(vi->name, nshapes, shapes, &rank, dims)) {
            if (tt->shape && (int)tt->shape->n_dim != rank)
                error_at(file, "--shape gives input '%s' rank %d; the model says %zu",
                         vi->name, rank, tt->shape->n_dim);
        } else {
            if (!tt->shape)
                error_at(file, "input '%s' has no shape; give one with --shape %s=D0xD1x...",
                         vi->name, vi->name);
            if (tt->shape->n_dim > MAX_RANK)
                error_at(file, "unsupported: input '%s' has rank %zu", vi->name,
                         tt->shape->n_dim);
            rank = (int)tt->shape->n_dim;
            for (int d = 0; d < rank; d++) {
                Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
                int sym = dim->value_case ==
                                  ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                                  dim->dim_param
                              ? find_dim(g, dim->dim_param) : -1;
                if (sym >= 0) {
                    if (t->dynamic)
                        error_at(file, "unsupported: input '%s' has two dynamic dimensions",
                                 vi->name);
                    t->dynamic = true;
                    t->dyn_axis = d;
                    t->extent.c[sym] = 1;
                    dims[d] = g->dims[sym].hi;
                    continue;
                }
                if (dim->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
                    error_at(file, "input '%s' dimension %d is symbolic (%s); fix it with "
                             "--shape %s=D0xD1x...", vi->name, d,
                             dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM
                                 ? format("'%s'", dim->dim_param)
                                 : "unknown",
                             vi->name);
                dims[d] = dim->dim_value;
                if (dims[d] < 0)
                    error_at(file, "input '%s' dimension %d is negative", vi->name, d);
            }
        }
        t->rank = rank;
        memcpy(t->shape, dims, sizeof(int64_t) * (size_t)rank);
        if (t->dynamic)
            check_dynamic_input(t);
        if ((double)shape_count(rank, dims) > 4294967295.0)
            error_at(file, "input '%s' has more than 2^32 - 1 elements", vi->name);
        bind(&c, vi->name, value_of_tensor(t));
    }

    int unused = unused_dim(g); /* only the inputs have tensors yet */
    if (unused >= 0)
        error_at(file, "--shape %s=%lld..%lld: no input has the symbolic dimension '%s'",
                 g->dims[unused].name, (long long)g->dims[unused].lo,
                 (long long)g->dims[unused].hi, g->dims[unused].name);
    for (size_t i = 0; i < gp->n_node; i++) {
        Onnx__NodeProto *n = gp->node[i];
        c.node = n;
        c.nname = format("%s (%s)", n->name && *n->name ? n->name : format("#%zu", i),
                         n->op_type);
        map_node(&c);
    }

    for (size_t i = 0; i < gp->n_output; i++) {
        const char *name = gp->output[i]->name;
        Value *v = map_get(&c.values, name);
        if (!v)
            error_at(file, "graph output '%s' is not produced by any node", name);
        Tensor *t = tens(&c, v);
        if (strcmp(t->name, name) != 0 || t->is_output) {
            /* An output that is another value (an input, a repeated output):
             * a view under its own name. */
            c.nname = format("output %s", name);
            Node *k = knode(&c, OP_RESHAPE, "");
            node_add_input(k, t);
            node_set_ints(k, "shape", t->rank, t->shape);
            node_add_output(k, graph_tensor(g, name, T_VALUE, file));
            infer_node(k);
            infer_dynamic(g, k);
            t = k->outputs[0];
        }
        t->is_output = true;
        vec_push(&g->outputs, t);
    }
    return g;
}
