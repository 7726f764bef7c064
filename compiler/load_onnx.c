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
 *
 * The parts: onnx_value.c (values, TensorProto, node inputs and
 * attributes), onnx_fold.c (constant folding), onnx_map.c (the op table and
 * mappers); onnx.h declares what they share.
 */
#include "onnx.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- declared types ---- */

/* A declared shape as text: "[1, 18, 'batch']". */
static char *declared_shape_str(const Onnx__TensorShapeProto *sp) {
    Str s = {0};
    str_add(&s, "[");
    for (size_t d = 0; d < sp->n_dim; d++) {
        const Onnx__TensorShapeProto__Dimension *dim = sp->dim[d];
        if (d)
            str_add(&s, ", ");
        if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
            str_addf(&s, "%lld", (long long)dim->dim_value);
        else if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM)
            str_addf(&s, "'%s'", dim->dim_param ? dim->dim_param : "");
        else
            str_add(&s, "?");
    }
    str_add(&s, "]");
    return s.buf;
}

/* The dims expression of symbolic dimension dim: a decoder's binding
 * (onnx_decoder.c) or a --shape NAME=MIN..MAX; false when it has none. */
static bool dim_param_expr(Ctx *c, const Onnx__TensorShapeProto__Dimension *dim, DimExpr *e) {
    if (dim->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM ||
        !dim->dim_param)
        return false;
    DimExpr *bound = map_get(&c->dim_exprs, dim->dim_param);
    if (bound) {
        *e = *bound;
        return true;
    }
    int d = find_dim(c->g, dim->dim_param);
    if (d < 0)
        return false;
    memset(e, 0, sizeof *e);
    e->c[d] = 1;
    return true;
}

/* Remembers the value an input gives each symbolic dimension of its
 * declared shape (dims: the shape kiln uses for it). */
static void bind_symbols(Ctx *c, const Onnx__TypeProto__Tensor *tt, int rank,
                         const int64_t *dims) {
    if (!tt->shape || (int)tt->shape->n_dim != rank)
        return;
    for (int d = 0; d < rank; d++) {
        const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
        if (dim->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM ||
            !dim->dim_param || !*dim->dim_param || map_get(&c->syms, dim->dim_param))
            continue;
        int64_t *v = xcalloc(1, sizeof *v);
        *v = dims[d];
        map_put(&c->syms, dim->dim_param, v);
    }
}

/* Checks value v (kiln's inference) against what the model declares for
 * it, if anything: the element type, the rank, every fixed dimension, and
 * every symbolic one that an input fixed. where: "node 'X (Op)'", or NULL
 * for a graph input or output. */
static void check_type(Ctx *c, const Value *v, const Onnx__ValueInfoProto *vi,
                       const char *where) {
    if (!vi || !vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
        return;
    const Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
    bool type_ok = tt->elem_type == 0 || kiln_dtype_of(tt->elem_type) == (int)v->dtype;
    bool shape_ok = !tt->shape || (int)tt->shape->n_dim == v->rank;
    for (int d = 0; shape_ok && tt->shape && d < v->rank; d++) {
        const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[d];
        const int64_t *sym = NULL;
        bool at_most = d == 0 && v->t && v->t->row_count; /* rows decided at run time */
        if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
            shape_ok = at_most ? dim->dim_value <= v->shape[d] : dim->dim_value == v->shape[d];
        else if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                 dim->dim_param && (sym = map_get(&c->syms, dim->dim_param)))
            shape_ok = *sym == v->shape[d];
    }
    if (type_ok && shape_ok)
        return;
    Loc file = {c->path, 0, 0};
    error_at(where ? c->loc : file, "%s%skiln infers %s %s for '%s'; the model declares %s %s",
             where ? where : "", where ? ": " : "", kiln_dtype_name(v->dtype),
             shape_str(v->rank, v->shape), v->name,
             tt->elem_type ? onnx_type_name(tt->elem_type) : "an unknown type",
             tt->shape ? declared_shape_str(tt->shape) : "of unknown shape");
}

/* check_type against the graph output or value_info named like v. */
static void check_declared(Ctx *c, const Value *v, const char *where) {
    check_type(c, v, map_get(&c->declared, v->name), where);
}

/* ---- the model ---- */

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
            if (end == p || v < 0)
                fatal("--shape %s: expected NAME=D0xD1x...", shapes[i]);
            if (*rank == MAX_RANK)
                fatal("--shape %s: more than %d dimensions (kiln supports rank %d at most)",
                      shapes[i], MAX_RANK, MAX_RANK);
            dims[(*rank)++] = v;
            p = *end == 'x' ? end + 1 : end;
            if (*end && *end != 'x')
                fatal("--shape %s: expected NAME=D0xD1x...", shapes[i]);
        }
        return true;
    }
    return false;
}

/* Whether --shape entry e names an input of gp (NAME=...). */
static bool names_input(const Onnx__GraphProto *gp, const char *e) {
    for (size_t k = 0; k < gp->n_input; k++) {
        size_t n = strlen(gp->input[k]->name);
        if (strncmp(e, gp->input[k]->name, n) == 0 && e[n] == '=')
            return true;
    }
    return false;
}

/* --shape DIM=V: symbolic dimension dim_param fixed at V wherever an input
 * has it (an entry of one number that names no input); false when none. */
static bool fixed_dim(const Onnx__GraphProto *gp, const char *dim_param, int nshapes,
                      const char **shapes, int64_t *v) {
    size_t n = strlen(dim_param);
    for (int i = 0; i < nshapes; i++) {
        const char *e = shapes[i];
        if (strncmp(e, dim_param, n) != 0 || e[n] != '=' || strstr(e, "..") ||
            names_input(gp, e))
            continue;
        char *end;
        long long x = strtoll(e + n + 1, &end, 10);
        if (end == e + n + 1 || *end || x < 0)
            fatal("--shape %s: expected DIM=N (a symbolic dimension's one value), "
                  "DIM=MIN..MAX or INPUT=D0xD1x...", e);
        *v = x;
        return true;
    }
    return false;
}

/* Whether some input of gp has the symbolic dimension `name`. */
static bool has_dim_param(const Onnx__GraphProto *gp, const char *name, size_t len) {
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
            !vi->type->tensor_type->shape)
            continue;
        const Onnx__TensorShapeProto *sh = vi->type->tensor_type->shape;
        for (size_t d = 0; d < sh->n_dim; d++)
            if (sh->dim[d]->value_case ==
                    ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                sh->dim[d]->dim_param && strlen(sh->dim[d]->dim_param) == len &&
                strncmp(sh->dim[d]->dim_param, name, len) == 0)
                return true;
    }
    return false;
}

/* Every --shape entry but a range names an input (NAME=D0xD1x...) or an
 * inputs' symbolic dimension (DIM=N), and none is given twice: a misspelt
 * one is an error, not ignored. */
static void check_shape_names(const Onnx__GraphProto *gp, int nshapes, const char **shapes,
                              Loc file) {
    for (int i = 0; i < nshapes; i++) {
        const char *eq = strchr(shapes[i], '=');
        size_t len = eq ? (size_t)(eq - shapes[i]) : strlen(shapes[i]);
        /* a range's dimension is checked once declared (unused_dim; a
         * decoder's seq and past need not be the inputs') */
        if (!names_input(gp, shapes[i]) && !strstr(shapes[i], "..") &&
            !has_dim_param(gp, shapes[i], len))
            error_at(file, "--shape %s: the model has no input %s'%.*s'", shapes[i],
                     strchr(shapes[i], 'x') ? "" : "or inputs' symbolic dimension ",
                     (int)len, shapes[i]);
        for (int j = 0; j < i; j++)
            if (strncmp(shapes[j], shapes[i], len + 1) == 0)
                error_at(file, "--shape: dimension '%.*s' is given twice (%s, %s)", (int)len,
                         shapes[i], shapes[j], shapes[i]);
    }
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

static Graph *load(const char *path, const char *raw, size_t size, bool borrow, int nshapes,
                   const char **shapes, int nconsts, const char **consts);

Graph *load_onnx(const char *path, int nshapes, const char **shapes, int nconsts,
                 const char **consts) {
    size_t size;
    char *raw = map_file(path, &size);
    Loc file = {path, 0, 0};
    if (!raw)
        error_at(file, "cannot read: %s", strerror(errno));
    return load(path, raw, size, true, nshapes, shapes, nconsts, consts);
}

Graph *load_onnx_bytes(const char *path, const char *raw, size_t size, int nshapes,
                       const char **shapes, int nconsts, const char **consts) {
    return load(path, raw, size, false, nshapes, shapes, nconsts, consts);
}

/* borrow: raw lasts until exit and may be written (map_file's), so the
 * initializers' bytes stay where they are instead of being copied. */
static Graph *load(const char *path, const char *raw, size_t size, bool borrow, int nshapes,
                   const char **shapes, int nconsts, const char **consts) {
    Loc file = {path, 0, 0};
    RawSpan *spans;
    size_t nspans, packed_size;
    const uint8_t *packed = onnx_take_raw_data((const uint8_t *)raw, size, &packed_size,
                                               &spans, &nspans);
    Onnx__ModelProto *m = onnx__model_proto__unpack(&pb_allocator, packed_size, packed);
    if (!m)
        error_at(file, "not a valid ONNX model (malformed or truncated protobuf)");
    if (!m->graph)
        error_at(file, "the model has no graph");
    onnx_put_raw_data(m->graph, spans, nspans);
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
    if (c.opset < 1 || c.opset > onnx_opset_newest())
        error_at(file, "unsupported: opset %lld (kiln reads opsets 1 to %lld)",
                 (long long)c.opset, (long long)onnx_opset_newest());
    Onnx__GraphProto *gp = m->graph;
    fill_absent_names(gp);
    check_supported(gp, path);

    for (size_t i = 0; i < gp->n_value_info; i++)
        map_put(&c.declared, gp->value_info[i]->name, gp->value_info[i]);
    for (size_t i = 0; i < gp->n_output; i++)
        map_put(&c.declared, gp->output[i]->name, gp->output[i]);

    Graph *g = xcalloc(1, sizeof *g);
    g->path = path;
    g->name = gp->name && *gp->name ? xstrdup(gp->name) : "model";
    c.g = g;
    c.loc = file;

    for (size_t i = 0; i < gp->n_initializer; i++) {
        Onnx__TensorProto *tp = gp->initializer[i];
        Value *v = decode_tensor(path, c.dir, tp, format("initializer '%s'", tp->name), file,
                                 borrow);
        bind_value(&c, tp->name, v);
    }
    check_shape_names(gp, nshapes, shapes, file);
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
    /* A decoder with its cache (onnx_decoder.c), unless --shape fixes the
     * cache inputs (one compile per step shape). */
    bool decoder = onnx_is_decoder(gp);
    for (size_t i = 0; decoder && i < gp->n_input; i++) {
        int rank;
        int64_t dims[MAX_RANK];
        if (onnx_is_past(gp->input[i]->name) &&
            shape_override(gp->input[i]->name, nshapes, shapes, &rank, dims))
            decoder = false;
    }
    if (decoder)
        onnx_decoder_dims(&c, gp);
    for (size_t i = 0; i < gp->n_input; i++) {
        Onnx__ValueInfoProto *vi = gp->input[i];
        Value *init = map_get(&c.values, vi->name);
        if (init) { /* has an initializer: a constant */
            check_type(&c, init, vi, format("initializer '%s'", vi->name));
            continue;
        }
        Value *fixed = const_override(&c, vi->name, nconsts, consts);
        if (fixed) {
            bind_value(&c, vi->name, fixed);
            continue;
        }
        if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
            error_at(file, "unsupported: input '%s' is not a tensor", vi->name);
        Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
        int dt = kiln_dtype_of(tt->elem_type);
        if (dt < 0)
            error_at(file, "unsupported: input '%s' has dtype %s", vi->name,
                     onnx_type_name(tt->elem_type));
        Tensor decl = {0}; /* the input's type, until it becomes a tensor */
        Tensor *t = &decl;
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
                DimExpr e;
                if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                    dim->dim_param && fixed_dim(gp, dim->dim_param, nshapes, shapes, &dims[d]))
                    continue;
                if (dim_param_expr(&c, dim, &e)) {
                    t->dyn_axes |= 1u << d;
                    t->ext[d] = e;
                    dims[d] = dim_expr_max(g, &e);
                    continue;
                }
                if (dim->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE)
                {
                    bool named = dim->value_case ==
                                     ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                                 dim->dim_param && *dim->dim_param;
                    error_at(file, "input '%s' dimension %d is symbolic (%s); fix it with "
                             "--shape %s=D0xD1x...%s%s%s%s%s", vi->name, d,
                             named ? format("'%s'", dim->dim_param) : "unknown", vi->name,
                             named ? ", fix the dimension with --shape " : "",
                             named ? dim->dim_param : "", named ? "=N or make it dynamic with "
                                                                  "--shape " : "",
                             named ? dim->dim_param : "", named ? "=MIN..MAX" : "");
                }
                dims[d] = dim->dim_value;
                if (dims[d] < 0)
                    error_at(file, "input '%s' dimension %d is negative", vi->name, d);
            }
        }
        bind_symbols(&c, tt, rank, dims);
        if (decoder && onnx_is_past(vi->name)) {
            bind_value(&c, vi->name, onnx_decoder_past(&c, vi, (kiln_dtype)dt, dims));
            continue;
        }
        t = graph_tensor(g, vi->name, T_INPUT, file);
        t->dtype = decl.dtype;
        t->dyn_axes = decl.dyn_axes;
        memcpy(t->ext, decl.ext, sizeof t->ext);
        t->rank = rank;
        memcpy(t->shape, dims, sizeof(int64_t) * (size_t)rank);
        update_prefix(t);
        if ((double)shape_count(rank, dims) > 4294967295.0)
            error_at(file, "input '%s' has more than 2^32 - 1 elements", vi->name);
        bind_value(&c, vi->name, value_of_tensor(t));
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
        for (size_t o = 0; o < n->n_output; o++) {
            Value *v = *n->output[o] ? map_get(&c.values, n->output[o]) : NULL;
            if (v)
                check_declared(&c, v, format("node '%s'", c.nname));
        }
    }

    for (size_t i = 0; i < gp->n_output; i++) {
        const char *name = gp->output[i]->name;
        Value *v = map_get(&c.values, name);
        if (!v)
            error_at(file, "graph output '%s' is not produced by any node", name);
        if (onnx_is_present(&c, name))
            continue; /* a decoder's cache: in its state */
        check_declared(&c, v, NULL);
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
    for (int i = 0; i < c.extra_outputs.len; i++) {
        Tensor *t = c.extra_outputs.data[i];
        t->is_output = true;
        vec_push(&g->outputs, t);
    }
    return g;
}
