/*
 * load_yaml.c: the YAML graph format into a Graph.
 *
 * libyaml composes the file into a node tree that keeps the line and column
 * of every node; this file walks that tree against the format's schema:
 *
 *   name: NAME
 *   dims:    {NAME: MIN..MAX, ...}      (dynamic dimensions, optional)
 *   inputs:  {NAME: {dtype: D, shape: [..]}, ...}
 *   state:   {NAME: {dtype: D, shape: [..], update: TENSOR}, ...} (optional)
 *   weights: {NAME: {dtype: D, shape: [..], SOURCE}, ...}
 *   nodes:   [{name: N, op: OP, inputs: [..], outputs: [..], ATTR: V, ...}]
 *   outputs: [NAME, ...]
 *
 * SOURCE is one of: `file: F` (+ optional `offset: BYTES`), `safetensors: F`
 * + `key: K`, `values: [..]`, `value: X`, `init: {normal: STD, mean: M,
 * seed: S}` or `init: {uniform: [LO, HI], seed: S}`.
 *
 * Every key the format does not know is an error at its place; so are
 * duplicate names and references to tensors that nothing defines. Weight
 * bytes are read later (weights.c); op rules are checked in shape_<family>.c.
 */
#include "kiln.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

typedef struct Ctx {
    const char *path;
    yaml_document_t *doc;
    Graph *g;
    Map names;  /* tensor name -> Tensor* */
} Ctx;

static Loc loc_of(Ctx *c, yaml_node_t *n) {
    Loc l = {c->path, (int)n->start_mark.line + 1, (int)n->start_mark.column + 1};
    return l;
}

static const char *kind_name(yaml_node_t *n) {
    switch (n->type) {
    case YAML_SCALAR_NODE: return "a scalar";
    case YAML_SEQUENCE_NODE: return "a list";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "nothing";
    }
}

static yaml_node_t *expect(Ctx *c, yaml_node_t *n, yaml_node_type_t type,
                           const char *what) {
    if (n->type != type)
        error_at(loc_of(c, n), "%s must be %s, not %s", what,
                 type == YAML_SCALAR_NODE     ? "a scalar"
                 : type == YAML_SEQUENCE_NODE ? "a list"
                                              : "a mapping",
                 kind_name(n));
    return n;
}

static const char *scalar(Ctx *c, yaml_node_t *n, const char *what) {
    expect(c, n, YAML_SCALAR_NODE, what);
    return (const char *)n->data.scalar.value;
}

static yaml_node_t *node_at(Ctx *c, yaml_node_item_t id) {
    return yaml_document_get_node(c->doc, id);
}

static int64_t parse_int(Ctx *c, yaml_node_t *n, const char *what) {
    const char *s = scalar(c, n, what);
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno == ERANGE)
        error_at(loc_of(c, n), "%s must be an integer, not '%s'", what, s);
    return v;
}

static double parse_number(Ctx *c, yaml_node_t *n, const char *what) {
    const char *s = scalar(c, n, what);
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno == ERANGE || !isfinite(v))
        error_at(loc_of(c, n), "%s must be a finite number, not '%s'", what, s);
    return v;
}

/* Calls fn(c, key, value, arg) for each pair of a mapping. */
typedef void (*PairFn)(Ctx *c, yaml_node_t *key, yaml_node_t *val, void *arg);
static void each_pair(Ctx *c, yaml_node_t *map, const char *what, PairFn fn,
                      void *arg) {
    expect(c, map, YAML_MAPPING_NODE, what);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = node_at(c, p->key), *v = node_at(c, p->value);
        if (!k || !v)
            internal_error("dangling YAML node");
        scalar(c, k, "a key");
        fn(c, k, v, arg);
    }
}

static int seq_len(yaml_node_t *n) {
    return (int)(n->data.sequence.items.top - n->data.sequence.items.start);
}

static yaml_node_t *seq_item(Ctx *c, yaml_node_t *n, int i) {
    return node_at(c, n->data.sequence.items.start[i]);
}

static kiln_dtype parse_dtype(Ctx *c, yaml_node_t *n) {
    const char *s = scalar(c, n, "dtype");
    for (int d = KILN_DTYPE_F32; d <= KILN_DTYPE_I8; d++)
        if (strcmp(s, kiln_dtype_name((kiln_dtype)d)) == 0)
            return (kiln_dtype)d;
    error_at(loc_of(c, n), "unknown dtype '%s' (known: f32 f16 i32 i64 bool u8 i8)",
             s);
}

static void parse_shape(Ctx *c, yaml_node_t *n, Tensor *t) {
    expect(c, n, YAML_SEQUENCE_NODE, "shape");
    if (seq_len(n) > MAX_RANK)
        error_at(loc_of(c, n), "tensor '%s' has rank %d; kiln supports up to %d",
                 t->name, seq_len(n), MAX_RANK);
    t->rank = seq_len(n);
    double count = 1;
    for (int i = 0; i < t->rank; i++) {
        yaml_node_t *d = seq_item(c, n, i);
        int dim = d->type == YAML_SCALAR_NODE
                      ? find_dim(c->g, (const char *)d->data.scalar.value) : -1;
        if (dim >= 0) {
            if (t->dyn_axes && t->kind == T_STATE)
                error_at(loc_of(c, d), "state '%s' has two dynamic dimensions; a state takes "
                         "one", t->name);
            if (t->kind == T_WEIGHT)
                error_at(loc_of(c, d), "weight '%s' cannot have a dynamic dimension",
                         t->name);
            DimExpr e = {0};
            e.c[dim] = 1;
            t->shape[i] = c->g->dims[dim].hi;
            set_dyn_axis(t, i, &e);
            count *= (double)t->shape[i];
            continue;
        }
        int64_t v = parse_int(c, d, "a dimension (or a name from dims)");
        if (v < 0)
            error_at(loc_of(c, d), "dimension %d of '%s' is negative (%lld)", i,
                     t->name, (long long)v);
        t->shape[i] = v;
        count *= (double)v;
    }
    /* Kernels index elements with 32 bits. */
    if (count > 4294967295.0)
        error_at(loc_of(c, n), "tensor '%s' has %.0f elements; kiln supports up "
                 "to 2^32 - 1 per tensor", t->name, count);
}

static Tensor *new_tensor(Ctx *c, yaml_node_t *key, TensorKind kind) {
    const char *name = scalar(c, key, "a tensor name");
    Loc loc = loc_of(c, key);
    if (!*name)
        error_at(loc, "empty tensor name");
    Tensor *prev = map_get(&c->names, name);
    if (prev)
        error_at(loc, "'%s' is defined twice (first at line %d)", name,
                 prev->loc.line);
    Tensor *t = xcalloc(1, sizeof *t);
    t->name = xstrdup(name);
    t->kind = kind;
    t->loc = loc;
    t->id = c->g->tensors.len;
    vec_push(&c->g->tensors, t);
    map_put(&c->names, t->name, t);
    return t;
}

/* ---- inputs ---- */

typedef struct TensorDecl {
    Tensor *t;
    bool has_dtype, has_shape, has_source;
    yaml_node_t *map;
} TensorDecl;

static void set_source(Ctx *c, TensorDecl *d, yaml_node_t *k, WeightFrom from) {
    if (d->has_source)
        error_at(loc_of(c, k), "weight '%s' has two data sources; give one of "
                 "file, safetensors, values, value, init", d->t->name);
    d->has_source = true;
    d->t->src.from = from;
    d->t->src.loc = loc_of(c, k);
}

static const char *relative_to_model(Ctx *c, const char *file) {
    if (file[0] == '/')
        return xstrdup(file);
    const char *slash = strrchr(c->path, '/');
    if (!slash)
        return xstrdup(file);
    return format("%.*s/%s", (int)(slash - c->path), c->path, file);
}

static void init_pair(Ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg) {
    Tensor *t = arg;
    const char *key = (const char *)k->data.scalar.value;
    if (strcmp(key, "normal") == 0) {
        t->src.from = W_NORMAL;
        t->src.a = parse_number(c, v, "normal (the standard deviation)");
        if (t->src.a < 0)
            error_at(loc_of(c, v), "the standard deviation must not be negative");
    } else if (strcmp(key, "mean") == 0) {
        t->src.b = parse_number(c, v, "mean");
    } else if (strcmp(key, "uniform") == 0) {
        expect(c, v, YAML_SEQUENCE_NODE, "uniform");
        if (seq_len(v) != 2)
            error_at(loc_of(c, v), "uniform takes [low, high]");
        t->src.from = W_UNIFORM;
        t->src.a = parse_number(c, seq_item(c, v, 0), "low");
        t->src.b = parse_number(c, seq_item(c, v, 1), "high");
        if (t->src.b < t->src.a)
            error_at(loc_of(c, v), "uniform: high is below low");
    } else if (strcmp(key, "seed") == 0) {
        int64_t s = parse_int(c, v, "seed");
        if (s < 0)
            error_at(loc_of(c, v), "seed must not be negative");
        t->src.seed = (uint64_t)s;
    } else {
        error_at(loc_of(c, k), "unknown key '%s' in init (known: normal, mean, "
                 "uniform, seed)", key);
    }
}

static void tensor_pair(Ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg) {
    TensorDecl *d = arg;
    Tensor *t = d->t;
    const char *key = (const char *)k->data.scalar.value;
    bool weight = t->kind == T_WEIGHT;
    if (t->kind == T_STATE && strcmp(key, "update") == 0) {
        t->update = (Tensor *)v; /* its name, resolved once every node is known */
        t->update_loc = loc_of(c, v);
    } else if (strcmp(key, "dtype") == 0) {
        t->dtype = parse_dtype(c, v);
        d->has_dtype = true;
    } else if (strcmp(key, "shape") == 0) {
        parse_shape(c, v, t);
        d->has_shape = true;
    } else if (weight && strcmp(key, "file") == 0) {
        set_source(c, d, k, W_FILE);
        t->src.path = relative_to_model(c, scalar(c, v, "file"));
    } else if (weight && strcmp(key, "offset") == 0) {
        int64_t off = parse_int(c, v, "offset");
        if (off < 0)
            error_at(loc_of(c, v), "offset must not be negative");
        t->src.offset = (uint64_t)off;
    } else if (weight && strcmp(key, "safetensors") == 0) {
        set_source(c, d, k, W_SAFETENSORS);
        t->src.path = relative_to_model(c, scalar(c, v, "safetensors"));
    } else if (weight && strcmp(key, "key") == 0) {
        t->src.key = xstrdup(scalar(c, v, "key"));
    } else if (weight && strcmp(key, "values") == 0) {
        set_source(c, d, k, W_VALUES);
        expect(c, v, YAML_SEQUENCE_NODE, "values");
        t->src.nvalues = seq_len(v);
        t->src.values = xcalloc((size_t)t->src.nvalues + 1, sizeof(double));
        for (int i = 0; i < seq_len(v); i++)
            t->src.values[i] = parse_number(c, seq_item(c, v, i), "a value");
    } else if (weight && strcmp(key, "value") == 0) {
        set_source(c, d, k, W_VALUES);
        t->src.nvalues = 1;
        t->src.values = xcalloc(1, sizeof(double));
        t->src.values[0] = parse_number(c, v, "value");
    } else if (weight && strcmp(key, "init") == 0) {
        set_source(c, d, k, W_NORMAL);
        t->src.from = (WeightFrom)-1;
        each_pair(c, v, "init", init_pair, t);
        if ((int)t->src.from == -1)
            error_at(loc_of(c, v), "init needs normal: STD or uniform: [LO, HI]");
    } else {
        error_at(loc_of(c, k), "unknown key '%s' in %s '%s' (known: dtype, shape%s)",
                 key, weight ? "weight" : t->kind == T_STATE ? "state" : "input", t->name,
                 weight ? ", file, offset, safetensors, key, values, value, init"
                 : t->kind == T_STATE ? ", update" : "");
    }
}

static void declare(Ctx *c, yaml_node_t *k, yaml_node_t *v, TensorKind kind) {
    TensorDecl d = {0};
    d.t = new_tensor(c, k, kind);
    d.map = v;
    each_pair(c, v, kind == T_WEIGHT ? "a weight" : kind == T_STATE ? "a state" : "an input",
              tensor_pair, &d);
    const char *what = kind == T_WEIGHT ? "weight" : kind == T_STATE ? "state" : "input";
    if (!d.has_dtype)
        error_at(loc_of(c, v), "%s '%s' has no dtype", what, d.t->name);
    if (!d.has_shape)
        error_at(loc_of(c, v), "%s '%s' has no shape", what, d.t->name);
    if (kind == T_WEIGHT) {
        if (!d.has_source)
            error_at(loc_of(c, v), "weight '%s' has no data: give one of file, "
                     "safetensors, values, value, init", d.t->name);
        if (d.t->src.from == W_SAFETENSORS && !d.t->src.key)
            error_at(loc_of(c, v), "weight '%s' names a safetensors file but no key",
                     d.t->name);
        vec_push(&c->g->weights, d.t);
    } else if (kind == T_STATE) {
        vec_push(&c->g->states, d.t);
    } else {
        vec_push(&c->g->inputs, d.t);
    }
}

static void input_pair(Ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg) {
    (void)arg;
    declare(c, k, v, T_INPUT);
}

static void weight_pair(Ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg) {
    (void)arg;
    declare(c, k, v, T_WEIGHT);
}

static void state_pair(Ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg) {
    (void)arg;
    declare(c, k, v, T_STATE);
}

/* A state's update names a tensor that a node computes (or an input). */
static void resolve_update(Ctx *c, Tensor *s) {
    yaml_node_t *v = (yaml_node_t *)s->update;
    s->update = NULL;
    if (!v)
        return;
    const char *name = scalar(c, v, "update");
    Tensor *u = map_get(&c->names, name);
    if (!u)
        error_at(loc_of(c, v), "state '%s': update '%s' is not defined", s->name, name);
    if (u->kind == T_WEIGHT || u->kind == T_STATE)
        error_at(loc_of(c, v), "state '%s': update '%s' is a %s; name a tensor a node "
                 "computes", s->name, name, u->kind == T_WEIGHT ? "weight" : "state");
    for (int i = 0; i < c->g->states.len; i++) {
        Tensor *o = c->g->states.data[i];
        if (o != s && o->update == u)
            error_at(loc_of(c, v), "states '%s' and '%s' both take '%s'", o->name, s->name,
                     name);
    }
    s->update = u;
    u->is_update = true;
}

/* ---- nodes ---- */

typedef struct NodeDecl {
    Node *n;
    yaml_node_t *name, *op, *inputs, *outputs;
    Vec attr_keys, attr_vals; /* yaml_node_t* */
} NodeDecl;

static void node_pair(Ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg) {
    NodeDecl *d = arg;
    (void)c;
    const char *key = (const char *)k->data.scalar.value;
    yaml_node_t **slot = strcmp(key, "name") == 0      ? &d->name
                         : strcmp(key, "op") == 0      ? &d->op
                         : strcmp(key, "inputs") == 0  ? &d->inputs
                         : strcmp(key, "outputs") == 0 ? &d->outputs
                                                       : NULL;
    if (slot) {
        *slot = v;
        return;
    }
    vec_push(&d->attr_keys, k);
    vec_push(&d->attr_vals, v);
}

static Attr make_attr(Ctx *c, yaml_node_t *k, yaml_node_t *v) {
    Attr a = {0};
    a.key = xstrdup((const char *)k->data.scalar.value);
    a.loc = loc_of(c, v);
    if (v->type == YAML_SCALAR_NODE) {
        a.scalar = xstrdup((const char *)v->data.scalar.value);
    } else if (v->type == YAML_SEQUENCE_NODE) {
        a.is_list = true;
        a.nitems = seq_len(v);
        a.items = xcalloc((size_t)a.nitems + 1, sizeof(char *));
        a.item_locs = xcalloc((size_t)a.nitems + 1, sizeof(Loc));
        for (int i = 0; i < a.nitems; i++) {
            yaml_node_t *it = seq_item(c, v, i);
            a.items[i] = xstrdup(scalar(c, it, "a list item"));
            a.item_locs[i] = loc_of(c, it);
        }
    } else {
        error_at(a.loc, "attribute '%s' must be a scalar or a list", a.key);
    }
    return a;
}

/* Node inputs are names to resolve once every tensor is declared. */
typedef struct PendingNode {
    Node *n;
    yaml_node_t *inputs;
} PendingNode;

static void parse_node(Ctx *c, yaml_node_t *m, Vec *pending) {
    NodeDecl d = {0};
    Node *n = xcalloc(1, sizeof *n);
    d.n = n;
    n->loc = loc_of(c, m);
    n->graph = c->g;
    each_pair(c, m, "a node", node_pair, &d);
    if (!d.name)
        error_at(n->loc, "node has no name");
    n->name = xstrdup(scalar(c, d.name, "name"));
    if (!*n->name)
        error_at(loc_of(c, d.name), "empty node name");
    if (!d.op)
        error_at(n->loc, "node '%s' has no op", n->name);
    const char *opname = scalar(c, d.op, "op");
    n->op = op_lookup(opname);
    if (n->op == OP_COUNT)
        node_error_at(n, loc_of(c, d.op), "unknown op '%s'", opname);
    const OpInfo *info = &op_info[n->op];

    n->nattrs = d.attr_keys.len;
    n->attrs = xcalloc((size_t)n->nattrs + 1, sizeof(Attr));
    for (int i = 0; i < d.attr_keys.len; i++) {
        yaml_node_t *k = d.attr_keys.data[i];
        const char *key = (const char *)k->data.scalar.value;
        if (!op_attr_default(n->op, key))
            node_error_at(n, loc_of(c, k), "op %s has no attribute '%s'%s%s%s", info->name, key,
                          *info->attrs ? " (it takes: " : "",
                          info->attrs, *info->attrs ? ")" : "");
        n->attrs[i] = make_attr(c, k, d.attr_vals.data[i]);
    }

    if (!d.inputs && op_arity_error(n->op, 0))
        error_at(n->loc, "node '%s' has no inputs", n->name);
    if (d.inputs) { /* range takes none */
        expect(c, d.inputs, YAML_SEQUENCE_NODE, "inputs");
        const char *arity = op_arity_error(n->op, seq_len(d.inputs));
        if (arity)
            node_error_at(n, loc_of(c, d.inputs), "%s", arity);
        PendingNode *p = xcalloc(1, sizeof *p);
        p->n = n;
        p->inputs = d.inputs;
        vec_push(pending, p);
    }

    /* Outputs: the node's name, or the listed names. */
    if (d.outputs) {
        expect(c, d.outputs, YAML_SEQUENCE_NODE, "outputs");
        n->noutputs = seq_len(d.outputs);
        if (n->noutputs == 0)
            error_at(loc_of(c, d.outputs), "node '%s' lists no outputs", n->name);
    } else {
        n->noutputs = 1;
    }
    n->outputs = xcalloc((size_t)n->noutputs, sizeof(Tensor *));
    for (int i = 0; i < n->noutputs; i++) {
        Tensor *t = new_tensor(c, d.outputs ? seq_item(c, d.outputs, i) : d.name,
                               T_VALUE);
        t->producer = n;
        n->outputs[i] = t;
    }
    n->id = c->g->nodes.len;
    vec_push(&c->g->nodes, n);
}

static void resolve_inputs(Ctx *c, PendingNode *p) {
    Node *n = p->n;
    n->ninputs = seq_len(p->inputs);
    n->inputs = xcalloc((size_t)n->ninputs + 1, sizeof(Tensor *));
    n->input_locs = xcalloc((size_t)n->ninputs + 1, sizeof(Loc));
    for (int i = 0; i < n->ninputs; i++) {
        yaml_node_t *it = seq_item(c, p->inputs, i);
        const char *name = scalar(c, it, "an input name");
        Tensor *t = map_get(&c->names, name);
        if (!t)
            node_error_at(n, loc_of(c, it), "input '%s' is not defined",
                          name);
        n->inputs[i] = t;
        n->input_locs[i] = loc_of(c, it);
    }
}

static void dim_pair(Ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg) {
    (void)arg;
    const char *name = scalar(c, k, "a dimension name");
    const char *range = scalar(c, v, "a dimension's range");
    int64_t lo, hi;
    if (!parse_dim_range(range, &lo, &hi))
        error_at(loc_of(c, v), "dimension '%s': the range must be MIN..MAX (like 1..2048), "
                 "not '%s'", name, range);
    if (!*name || strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
                               "0123456789") != strlen(name) || (*name >= '0' && *name <= '9'))
        error_at(loc_of(c, k), "dimension name '%s' must be letters, digits and _, "
                 "not starting with a digit", name);
    declare_dim(c->g, name, lo, hi, loc_of(c, v));
}

static void top_pair(Ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg) {
    yaml_node_t **slots = arg;
    const char *key = (const char *)k->data.scalar.value;
    static const char *const keys[] = {"name", "inputs", "weights", "nodes",
                                       "outputs", "dims", "state"};
    for (int i = 0; i < 7; i++) {
        if (strcmp(key, keys[i]) == 0) {
            if (slots[i])
                error_at(loc_of(c, k), "'%s' appears twice", key);
            slots[i] = v;
            return;
        }
    }
    error_at(loc_of(c, k), "unknown key '%s' (known: name, dims, inputs, state, weights, "
             "nodes, outputs)", key);
}

Graph *load_yaml(const char *path) {
    size_t size;
    char *text = read_file(path, &size);
    Loc file_loc = {path, 0, 0};
    if (!text)
        error_at(file_loc, "cannot read: %s", strerror(errno));
    return load_yaml_text(path, text, size);
}

/* libyaml's parser and document, freed by kiln_free_all (the document stays
 * alive otherwise: nothing points into it, but freeing is not the command
 * line's business). */
typedef struct Yaml {
    yaml_parser_t parser;
    yaml_document_t doc;
    bool parser_live, doc_live;
} Yaml;

static void free_yaml(void *arg) {
    Yaml *y = arg;
    if (y->doc_live)
        yaml_document_delete(&y->doc);
    if (y->parser_live)
        yaml_parser_delete(&y->parser);
}

/* The deepest flow nesting ([ and {) the format allows. kiln's models need
 * three levels; the limit is there because libyaml's scanner does work
 * proportional to the depth at every token, so a file of a few hundred
 * kilobytes of brackets would otherwise take minutes. */
#define MAX_FLOW_DEPTH 64

static void check_nesting(const char *path, const char *text, size_t size) {
    int depth = 0, line = 1, col = 1;
    char quote = 0;
    bool comment = false;
    for (size_t i = 0; i < size; i++, col++) {
        char ch = text[i];
        if (ch == '\n') {
            line++;
            col = 0;
            comment = false;
        } else if (comment) {
        } else if (quote) {
            if (ch == quote)
                quote = 0;
            else if (ch == '\\' && quote == '"' && i + 1 < size && text[i + 1] != '\n')
                i++, col++;
        } else if (ch == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t')) {
            comment = true;
        } else if (ch == '"' || ch == '\'') {
            quote = ch;
        } else if (ch == '[' || ch == '{') {
            if (++depth > MAX_FLOW_DEPTH) {
                Loc l = {path, line, col};
                error_at(l, "lists and mappings nested deeper than %d levels", MAX_FLOW_DEPTH);
            }
        } else if ((ch == ']' || ch == '}') && depth > 0) {
            depth--;
        }
    }
}

Graph *load_yaml_text(const char *path, const char *text, size_t size) {
    Loc file_loc = {path, 0, 0};
    check_nesting(path, text, size);
    Ctx c = {0};
    c.path = path;
    Yaml *y = xcalloc(1, sizeof *y);
    c.doc = &y->doc;
    if (!yaml_parser_initialize(&y->parser))
        fatal("out of memory");
    y->parser_live = true;
    on_reset(free_yaml, y);
    yaml_parser_set_input_string(&y->parser, (const unsigned char *)text, size);
    if (!yaml_parser_load(&y->parser, c.doc)) {
        Loc l = {path, (int)y->parser.problem_mark.line + 1,
                 (int)y->parser.problem_mark.column + 1};
        error_at(l, "malformed YAML: %s%s%s",
                 y->parser.problem ? y->parser.problem : "?",
                 y->parser.context ? " " : "", y->parser.context ? y->parser.context : "");
    }
    y->doc_live = true;
    yaml_node_t *root = yaml_document_get_root_node(c.doc);
    if (!root)
        error_at(file_loc, "empty model file");

    Graph *g = xcalloc(1, sizeof *g);
    g->path = path;
    c.g = g;
    yaml_node_t *slots[7] = {0};
    each_pair(&c, root, "the model", top_pair, slots);
    if (!slots[0])
        error_at(loc_of(&c, root), "the model has no name");
    g->name = xstrdup(scalar(&c, slots[0], "name"));
    if (slots[5])
        each_pair(&c, slots[5], "dims", dim_pair, NULL);
    if (slots[1])
        each_pair(&c, slots[1], "inputs", input_pair, NULL);
    if (slots[6])
        each_pair(&c, slots[6], "state", state_pair, NULL);
    if (slots[2])
        each_pair(&c, slots[2], "weights", weight_pair, NULL);
    if (!slots[3])
        error_at(loc_of(&c, root), "the model has no nodes");
    expect(&c, slots[3], YAML_SEQUENCE_NODE, "nodes");
    Vec pending = {0};
    for (int i = 0; i < seq_len(slots[3]); i++) {
        yaml_node_t *m = seq_item(&c, slots[3], i);
        expect(&c, m, YAML_MAPPING_NODE, "a node");
        parse_node(&c, m, &pending);
    }
    for (int i = 0; i < pending.len; i++)
        resolve_inputs(&c, pending.data[i]);

    if (!slots[4])
        error_at(loc_of(&c, root), "the model has no outputs");
    expect(&c, slots[4], YAML_SEQUENCE_NODE, "outputs");
    if (seq_len(slots[4]) == 0)
        error_at(loc_of(&c, slots[4]), "the model lists no outputs");
    for (int i = 0; i < seq_len(slots[4]); i++) {
        yaml_node_t *it = seq_item(&c, slots[4], i);
        const char *name = scalar(&c, it, "an output name");
        Tensor *t = map_get(&c.names, name);
        if (!t)
            error_at(loc_of(&c, it), "output '%s' is not defined", name);
        if (t->is_output)
            error_at(loc_of(&c, it), "output '%s' is listed twice", name);
        if (t->kind == T_STATE)
            error_at(loc_of(&c, it), "'%s' is a state; list its update (or read it with "
                     "kiln_model_read_state)", name);
        t->is_output = true;
        vec_push(&g->outputs, t);
    }
    for (int i = 0; i < g->states.len; i++)
        resolve_update(&c, g->states.data[i]);
    int unused = unused_dim(g);
    if (unused >= 0)
        error_at(g->dims[unused].loc, "dimension '%s' is declared but no input, state "
                 "or range uses it", g->dims[unused].name);
    yaml_parser_delete(&y->parser);
    y->parser_live = false;
    return g;
}
