/*
 * emit_c.c: the generated .c and .h, from templates/.
 *
 * The templates (embedded in kiln at build time) fix the layout of the
 * output; this file renders each section as text and substitutes
 * {{PLACEHOLDERS}}. Everything rendered depends only on the model and the
 * command line, never on time, addresses or hash-table order, so compiling
 * the same model twice gives the same bytes.
 *
 * C99 has no empty arrays: a table with no rows gets one zero row and a
 * count of 0.
 */
#include "kiln.h"
#include "../runtime/kiln_hash.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct Subst {
    const char *key;
    const char *value;
} Subst;

/* Replaces every {{KEY}} in a template; an unknown key is a bug. */
static void render(Str *out, const char *tmpl, const Subst *subs, int nsubs) {
    const char *p = tmpl;
    while (*p) {
        const char *open = strstr(p, "{{");
        if (!open) {
            str_add(out, p);
            break;
        }
        str_addn(out, p, (size_t)(open - p));
        const char *close = strstr(open, "}}");
        if (!close)
            internal_error("unterminated placeholder in a template");
        size_t len = (size_t)(close - open - 2);
        int i;
        for (i = 0; i < nsubs; i++)
            if (strlen(subs[i].key) == len && strncmp(subs[i].key, open + 2, len) == 0)
                break;
        if (i == nsubs)
            internal_error("unknown template placeholder %.*s", (int)len, open + 2);
        str_add(out, subs[i].value);
        p = close + 2;
    }
}

/* A C string literal's contents. */
static char *c_string(const char *s) {
    Str o = {0};
    str_add(&o, "");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            str_addf(&o, "\\%c", c);
        else if (c < 32 || c >= 127)
            str_addf(&o, "\\%03o", c);
        else
            str_addn(&o, s, 1);
    }
    return o.buf;
}

/* Text that is safe inside a block comment, on one line. */
static char *c_comment(const char *s) {
    Str o = {0};
    str_add(&o, "");
    for (; *s; s++) {
        if (s[0] == '*' && s[1] == '/')
            str_add(&o, "* ");
        else if ((unsigned char)*s < 32)
            str_add(&o, " ");
        else
            str_addn(&o, s, 1);
    }
    return o.buf;
}

static char *u64(uint64_t v) { return format("%llu", (unsigned long long)v); }

/* Eight words a line, "0x%08xu," each: written by hand, since weights can
 * be tens of megabytes. */
static void emit_words(Str *s, const uint32_t *w, size_t n) {
    static const char hex[] = "0123456789abcdef";
    char line[8 * 13 + 8];
    for (size_t i = 0; i < n; i += 8) {
        char *o = line;
        *o++ = ' ', *o++ = ' ', *o++ = ' ';
        for (size_t k = i; k < n && k < i + 8; k++) {
            *o++ = ' ', *o++ = '0', *o++ = 'x';
            for (int b = 28; b >= 0; b -= 4)
                *o++ = hex[(w[k] >> b) & 15u];
            *o++ = 'u', *o++ = ',';
        }
        *o++ = '\n';
        str_addn(s, line, (size_t)(o - line));
    }
}

/* What a dispatch's needs or unless bits, or a kernel's alt_needs, stand
 * for: each bit's words, joined by "and". */
static const char *feature_words(uint32_t bits) {
    static const struct {
        uint32_t bit;
        const char *words;
    } named[] = {{KILN_FEATURE_COOPMAT_WG, "cooperative matrices of workgroup scope"},
                 {KILN_FEATURE_COOPMAT, "cooperative matrices"},
                 {KILN_FEATURE_SHARED48K, "48 KiB of shared memory"},
                 {KILN_FEATURE_SUBGROUP, "subgroup arithmetic"},
                 {KILN_FEATURE_INTDOT, "8-bit integer dot products"},
                 {KILN_FEATURE_FLOAT16, "f16 arithmetic (shaderFloat16)"}};
    Str s = {0};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (bits & named[i].bit) {
            str_addf(&s, "%s%s", s.len ? " and " : "", named[i].words);
            bits &= ~named[i].bit;
        }
    if (bits || !s.len)
        str_addf(&s, "%ssome features", s.len ? " and " : "");
    return s.buf;
}

static void emit_kernels(Str *s, Program *p, const char *px) {
    for (int i = 0; i < p->nmodules; i++) {
        Module *m = &p->modules[i];
        str_addf(s, "\n/* kernel %d: %s", i, m->family);
        for (const char *d = m->defines; *d;) {
            const char *nl = strchr(d, '\n');
            size_t len = nl ? (size_t)(nl - d) : strlen(d);
            str_addf(s, "\n *   %s", c_comment(format("%.*s", (int)len, d)));
            d += len + (nl ? 1 : 0);
        }
        str_addf(s, "\n */\nstatic const uint32_t %s_spirv_%d[%zu] = {\n", px, i,
                 m->nwords);
        emit_words(s, m->words, m->nwords);
        str_add(s, "};\n");
        if (m->alt_nwords) {
            str_addf(s, "/* kernel %d on devices with %s: the same with KILN_SUBGROUP 1 */\n"
                        "static const uint32_t %s_spirv_%d_alt[%zu] = {\n",
                     i, feature_words(m->alt_needs), px, i, m->alt_nwords);
            emit_words(s, m->alt_words, m->alt_nwords);
            str_add(s, "};\n");
        }
    }
    str_addf(s, "\n/* {SPIR-V, words, family, alt_spirv, alt_words, alt_needs} */\n"
                "static const kiln_kernel %s_kernels[%d] = {\n",
             px, p->nmodules ? p->nmodules : 1);
    for (int i = 0; i < p->nmodules; i++) {
        const Module *m = &p->modules[i];
        if (m->alt_nwords)
            str_addf(s, "    {%s_spirv_%d, %zuu, \"%s\", %s_spirv_%d_alt, %zuu, %uu},\n", px, i,
                     m->nwords, m->family, px, i, m->alt_nwords, m->alt_needs);
        else
            str_addf(s, "    {%s_spirv_%d, %zuu, \"%s\", 0, 0u, 0u},\n", px, i, m->nwords,
                     m->family);
    }
    if (!p->nmodules)
        str_add(s, "    {0, 0u, \"\", 0, 0u, 0u}\n");
    str_add(s, "};\n");
}

/* Copies the pieces of the weight image into a buffer. */
static void copy_piece(void *ctx, const void *data, size_t n) {
    uint8_t **at = ctx;
    memcpy(*at, data, n);
    *at += n;
}

static void emit_weights(Str *s, Graph *g, Program *p, const char *px, const char *file) {
    for (int i = 0; i < g->weights.len; i++) {
        Tensor *t = g->weights.data[i];
        if (t->offset != UINT64_MAX) /* else unused */
            str_addf(s, "/* %s: %s %s at %llu */\n", c_comment(t->name),
                     kiln_dtype_name(t->dtype), shape_str(t->rank, t->shape),
                     (unsigned long long)t->offset);
    }
    if (file) { /* write_weights_file set p->weights_checksum */
        str_addf(s, "/* The weights (%llu bytes) are in %s, which create reads and checks. */\n"
                    "#define %s_weights ((const uint32_t *)0)\n",
                 (unsigned long long)p->weight_bytes, c_comment(file), px);
        return;
    }
    size_t nwords = (size_t)(p->weight_bytes + 3) / 4;
    uint8_t *bytes = xcalloc(nwords * 4 + 4, 1), *at = bytes;
    weight_pieces(g, p, copy_piece, &at);
    p->weights_checksum = kiln__hash64(bytes, (size_t)p->weight_bytes);
    str_addf(s, "static const uint32_t %s_weights[%zu] = {\n", px, nwords ? nwords : 1);
    uint32_t *w = xcalloc(nwords + 1, 4);
    for (size_t i = 0; i < nwords; i++)
        w[i] = (uint32_t)bytes[4 * i] | (uint32_t)bytes[4 * i + 1] << 8 |
               (uint32_t)bytes[4 * i + 2] << 16 | (uint32_t)bytes[4 * i + 3] << 24;
    emit_words(s, w, nwords);
    if (!nwords)
        str_add(s, "    0u\n");
    str_add(s, "};\n");
    xfree(w);
    xfree(bytes);
}

static const char *dtype_enum(kiln_dtype dt) {
    static const char *const names[] = {"KILN_DTYPE_F32", "KILN_DTYPE_F16",
                                        "KILN_DTYPE_I32", "KILN_DTYPE_I64",
                                        "KILN_DTYPE_BOOL", "KILN_DTYPE_U8",
                                        "KILN_DTYPE_I8"};
    return names[dt];
}

/* "{c0, {c...}}" of a kiln_extent. */
static char *extent_init(const DimExpr *e) {
    Str s = {0};
    str_addf(&s, "{%lldll, {", (long long)e->c0);
    for (int i = 0; i < MAX_DIMS; i++)
        str_addf(&s, "%s%lldll", i ? ", " : "", (long long)e->c[i]);
    str_add(&s, "}}");
    return s.buf;
}

static void emit_tensor_table(Str *s, Vec *list, const char *px, const char *what) {
    for (int i = 0; i < list->len; i++) { /* each dynamic tensor's extents */
        Tensor *t = list->data[i];
        if (!t->dyn_axes)
            continue;
        str_addf(s, "\nstatic const kiln_extent %s_%s_%d_extents[%d] = {", px, what, i, t->rank);
        for (int k = 0; k < t->rank; k++) {
            DimExpr fixed = {.c0 = t->shape[k]};
            char *e = extent_init(is_dyn(t, k) ? &t->ext[k] : &fixed);
            str_addf(s, "%s%s", k ? ", " : "", e);
            xfree(e);
        }
        str_add(s, "};\n");
    }
    str_addf(s, "\nstatic const kiln_tensor_info %s_%s[%d] = {\n", px, what,
             list->len ? list->len : 1);
    for (int i = 0; i < list->len; i++) {
        Tensor *t = list->data[i];
        Tensor *r = tensor_root(t);
        str_addf(s, "    {\"%s\", %s, %du, {", c_string(t->name), dtype_enum(t->dtype),
                 t->rank);
        for (int k = 0; k < t->rank; k++) {
            int64_t d = t->shape[k];
            if (t->kind == T_STATE && t->dynamic && k == t->dyn_axis && tensor_bytes(t))
                d = (int64_t)(slot_bytes(t) / (tensor_bytes(t) / (uint64_t)d)); /* storage */
            str_addf(s, "%s%lld", k ? ", " : "", (long long)d);
        }
        if (!t->rank)
            str_add(s, "0");
        str_addf(s, "}, %lluull, %s, %lluull, %lluull, 0x%xu, ",
                 (unsigned long long)slot_bytes(t),
                 r->buffer == KILN_BUFFER_WEIGHTS ? "KILN_BUFFER_WEIGHTS"
                                                  : "KILN_BUFFER_ARENA",
                 (unsigned long long)tensor_base(t), (unsigned long long)t->io_offset,
                 t->dyn_axes);
        if (t->dyn_axes)
            str_addf(s, "%s_%s_%d_extents},\n", px, what, i);
        else
            str_add(s, "NULL},\n");
    }
    if (!list->len) /* C99 has no empty arrays; every field named for C++ */
        str_add(s, "    {\"\", KILN_DTYPE_F32, 0u, {0}, 0ull, KILN_BUFFER_ARENA, 0ull, 0ull, "
                   "0x0u, NULL}\n");
    str_add(s, "};\n");
}

static void emit_schedule(Str *s, Program *p, const char *px) {
    int nbind = 0;
    for (int i = 0; i < p->ndispatches; i++)
        nbind += p->dispatches[i]->nargs;
    str_addf(s, "\n/* Device addresses each dispatch receives, and the bytes it touches through\n"
                " * them: {buffer, offset, begin, end, writes}. */\n"
                "static const kiln_binding %s_bindings[%d] = {\n",
             px, nbind ? nbind : 1);
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        for (int k = 0; k < d->nargs; k++) {
            Tensor *t = d->args[k], *r = tensor_root(t);
            uint64_t base = tensor_base(t);
            str_addf(s, "    {%s, %lluull, %lluull, %lluull, %uu}, /* %d.%d %s %s */\n",
                     r->buffer == KILN_BUFFER_WEIGHTS ? "KILN_BUFFER_WEIGHTS"
                                                      : "KILN_BUFFER_ARENA",
                     (unsigned long long)(base + d->arg_offset[k]),
                     (unsigned long long)(base + d->arg_begin[k]),
                     (unsigned long long)(base + d->arg_end[k]), (d->writes >> k) & 1u,
                     i, k, (d->unused >> k) & 1u ? "unused, holds" : (d->writes >> k) & 1u
                     ? "writes" : "reads", c_comment(t->name));
        }
    }
    if (!nbind)
        str_add(s, "    {KILN_BUFFER_ARENA, 0ull, 0ull, 0ull, 0u}\n");
    str_add(s, "};\n");

    str_addf(s, "\n/* {kernel, {groups}, first binding, bindings, barrier, node, bytes, flops,\n"
                " *  dynamic groups: axis (3: none), {work}, scale, per group, work range,\n"
                " *  device features: needs, unless} */\n"
                "static const kiln_dispatch %s_dispatches[%d] = {\n",
             px, p->ndispatches ? p->ndispatches : 1);
    int b = 0;
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        str_addf(s, "    /* %d: %s (%s) %s", i, c_comment(d->label),
                 op_info[d->node->op].name, d->family);
        if (d->barrier)
            str_addf(s, "; barrier: %s", c_comment(d->reason));
        if (d->prefetch)
            str_add(s, "; a prefetch: never a barrier, it runs beside the work before it");
        if (d->dynamic)
            str_addf(s, "; groups[%d] follow %s", d->dyn_axis,
                     c_comment(dim_expr_str(p->graph, &d->work)));
        if (d->needs)
            str_addf(s, "; only on devices with %s", feature_words(d->needs));
        if (d->unless)
            str_addf(s, "; only on devices without %s", feature_words(d->unless));
        str_addf(s, " */\n    {%du, {%uu, %uu, %uu}, %du, %du, %uu, \"%s\", %lluull, %lluull,\n"
                    "     %du, %s, %lluull, %lluull, %lluull, %lluull, %uu, %uu},\n",
                 d->module, d->groups[0], d->groups[1], d->groups[2], b, d->nargs,
                 d->prefetch ? KILN_BARRIER_PREFETCH : (unsigned)d->barrier,
                 c_string(d->label),
                 (unsigned long long)(dispatch_bytes_read(d) + dispatch_bytes_written(d)),
                 (unsigned long long)d->flops, d->dynamic ? d->dyn_axis : 3,
                 extent_init(&d->work), /* these are 0 for a fixed dispatch */
                 (unsigned long long)d->scale, (unsigned long long)d->per_group,
                 (unsigned long long)d->work_min, (unsigned long long)d->work_max,
                 d->needs, d->unless);
        b += d->nargs;
    }
    if (!p->ndispatches)
        str_add(s, "    {0u, {0u, 0u, 0u}, 0u, 0u, 0u, \"\", 0ull, 0ull, 3u, "
                   "{0ll, {0ll, 0ll, 0ll, 0ll, 0ll, 0ll, 0ll, 0ll}}, 0ull, 0ull, 0ull, 0ull, 0u, "
                   "0u}\n");
    str_add(s, "};\n");
}

/* State updates computed elsewhere than in place: {src, dst, bytes}. */
static void emit_state_copies(Str *s, Program *p, const char *px) {
    str_addf(s, "\n/* State updates copied after the dispatches: {from, to, bytes} (arena) */\n"
                "static const kiln_state_copy %s_state_copies[%d] = {\n", px,
             p->nstate_copies ? p->nstate_copies : 1);
    for (int i = 0; i < p->nstate_copies; i++) {
        Tensor *st = p->state_copies[i], *u = tensor_root(st->update);
        str_addf(s, "    {%lluull, %lluull, %lluull}, /* %s -> %s */\n",
                 (unsigned long long)u->offset, (unsigned long long)st->offset,
                 (unsigned long long)tensor_bytes(st->update), c_comment(st->update->name),
                 c_comment(st->name));
    }
    if (!p->nstate_copies)
        str_add(s, "    {0ull, 0ull, 0ull}\n");
    str_add(s, "};\n");
}

/* Dynamic dimensions: {name, min, max}; then those derived from them:
 * {name, op, a, b}. */
static void emit_dims(Str *s, Graph *g, const char *px) {
    int declared = declared_dims(g), derived = g->ndims - declared;
    str_addf(s, "\n/* Dynamic dimensions: {name, min, max} */\n"
                "static const kiln_dim %s_dims[%d] = {\n", px, declared ? declared : 1);
    for (int i = 0; i < declared; i++)
        str_addf(s, "    {\"%s\", %lldll, %lldll},\n", c_string(g->dims[i].name),
                 (long long)g->dims[i].lo, (long long)g->dims[i].hi);
    if (!declared)
        str_add(s, "    {\"\", 0ll, 0ll}\n");
    str_add(s, "};\n");
    static const char *const ops[] = {"0", "KILN_DIM_MUL", "KILN_DIM_DIV", "KILN_DIM_MAX",
                                      "KILN_DIM_MIN"};
    str_addf(s, "\n/* Dims derived from them, each after the given ones: {name, op, a, b} */\n"
                "static const kiln_derived_dim %s_derived[%d] = {\n", px, derived ? derived : 1);
    for (int i = declared; i < g->ndims; i++)
        str_addf(s, "    {\"%s\", %s, %s, %s},\n", c_string(g->dims[i].name),
                 ops[g->dims[i].op], extent_init(&g->dims[i].a), extent_init(&g->dims[i].b));
    if (!derived)
        str_add(s, "    {\"\", 0, {0, {0}}, {0, {0}}}\n");
    str_add(s, "};\n");
}

/* --guard: the bands between arena slots and the index reports; the table
 * is empty otherwise. */
static void emit_guards(Str *s, Program *p, const char *px) {
    str_addf(s, "\n/* Guard bands (--guard): {arena offset, bytes, staging offset, after, "
                "index report of} */\n"
                "static const kiln_guard %s_guards[%d] = {\n",
             px, p->nguards ? p->nguards : 1);
    for (int i = 0; i < p->nguards; i++) {
        const kiln_guard *g = &p->guards[i];
        str_addf(s, "    {%lluull, %lluull, %lluull, \"%s\", ", (unsigned long long)g->offset,
                 (unsigned long long)g->bytes, (unsigned long long)g->io_offset,
                 c_string(g->after));
        if (g->index_node)
            str_addf(s, "\"%s\"},\n", c_string(g->index_node));
        else
            str_add(s, "NULL},\n");
    }
    if (!p->nguards)
        str_add(s, "    {0ull, 0ull, 0ull, \"\", NULL}\n");
    str_add(s, "};\n");
}

static char *tensor_list(Vec *list) {
    Str s = {0};
    str_add(&s, "");
    for (int i = 0; i < list->len; i++) {
        Tensor *t = list->data[i];
        str_addf(&s, " *   [%d] %s: %s %s, %llu bytes\n", i, c_comment(t->name),
                 kiln_dtype_name(t->dtype), shape_str(t->rank, t->shape),
                 (unsigned long long)tensor_bytes(t));
        for (int j = 0; t->row_count && j < list->len; j++)
            if (list->data[j] == t->row_count)
                str_addf(&s, " *       rows decided at run time: output [%d] holds how many "
                         "lead; the rest are -1\n", j);
    }
    return s.buf;
}

/* #define PREFIX_INPUT<i>_BYTES / PREFIX_OUTPUT<i>_BYTES: buffers of fixed
 * size for programs that allocate nothing. */
static char *size_macros(Vec *list, const char *upper, const char *what) {
    Str s = {0};
    str_add(&s, "");
    for (int i = 0; i < list->len; i++)
        str_addf(&s, "#define %s_%s%d_BYTES %lluull\n", upper, what, i,
                 (unsigned long long)tensor_bytes(list->data[i]));
    return s.buf;
}

static const char *basename_of(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

void emit_c(Graph *g, Program *p, const Options *opt, const char *header_name,
            Str *out_c, Str *out_h) {
    const char *px = opt->name;
    char *upper = xstrdup(px);
    for (char *c = upper; *c; c++)
        *c = (char)toupper((unsigned char)*c);
    int barriers = 0;
    for (int i = 0; i < p->ndispatches; i++)
        barriers += p->dispatches[i]->barrier;
    uint64_t spirv = spirv_bytes(p);

    Str kernels = {0}, weights = {0}, tensors = {0}, sched = {0};
    emit_kernels(&kernels, p, px);
    emit_weights(&weights, g, p, px, opt->weights_file);
    emit_tensor_table(&tensors, &g->inputs, px, "inputs");
    emit_tensor_table(&tensors, &g->outputs, px, "outputs");
    emit_tensor_table(&tensors, &g->states, px, "states");
    /* --debug-tensors: every node output, in schedule order. */
    Vec debug = {0};
    for (int i = 0; p->debug_tensors && i < g->nodes.len; i++) {
        Node *n = g->nodes.data[i];
        for (int k = 0; !n->dead && k < n->noutputs; k++) {
            Tensor *r = tensor_root(n->outputs[k]);
            if (r->kind == T_VALUE && r->last >= r->first)
                vec_push(&debug, n->outputs[k]);
        }
    }
    emit_tensor_table(&tensors, &debug, px, "debug_tensors");
    emit_schedule(&sched, p, px);
    emit_guards(&sched, p, px);
    emit_dims(&sched, g, px);
    emit_state_copies(&sched, p, px);

    /* The dispatch table, and the tuning variables set when it was built
     * (they change the kernels), in the opening comment. */
    Str table = {0}, lines = {0}, tuning = {0};
    str_add(&table, "");
    str_add(&lines, "");
    str_add(&tuning, "");
    inspect_table(p, &table);
    for (char *line = table.buf, *end; *line; line = end + 1) {
        end = strchr(line, '\n');
        *end = 0;
        char *text = c_comment(line);
        size_t len = strlen(text);
        while (len && text[len - 1] == ' ')
            text[--len] = 0;
        str_addf(&lines, " *%s%s\n", *text ? " " : "", text);
    }
    for (int i = 0; tuning_variables[i]; i++) {
        const char *v = getenv(tuning_variables[i]);
        if (v)
            str_addf(&tuning, " * tuning: %s=%s (set when it was compiled)\n",
                     tuning_variables[i], c_comment(v));
    }

    char *source_c = xstrdup(basename_of(header_name));
    size_t n = strlen(source_c);
    if (n > 2 && strcmp(source_c + n - 2, ".h") == 0)
        source_c[n - 1] = 'c';
    Subst subs[] = {
        {"VERSION", KILN_VERSION},
        {"SOURCE", c_comment(g->path)},
        {"SOURCE_C", c_comment(source_c)},
        {"COMMAND", c_comment(opt->command)},
        {"MODEL", c_comment(g->name)},
        {"MODEL_C", c_string(g->name)},
        {"HEADER", c_string(basename_of(header_name))},
        {"PREFIX", px},
        {"PREFIX_UPPER", upper},
        {"GUARD", format("KILN_MODEL_%s_H", upper)},
        {"DISPATCH_COUNT", format("%d", p->ndispatches)},
        {"BARRIER_COUNT", format("%d", barriers)},
        {"KERNEL_COUNT", format("%d", p->nmodules)},
        {"SPIRV_BYTES", u64(spirv)},
        {"ARENA_BYTES", u64(p->arena_bytes)},
        {"PEAK_BYTES", u64(p->peak_bytes)},
        {"WEIGHT_BYTES", u64(p->weight_bytes)},
        {"IO_BYTES", u64(p->io_bytes)},
        {"ALIGNMENT", u64(p->alignment)},
        {"FEATURES", format("%u", p->features)},
        {"INPUT_COUNT", format("%d", g->inputs.len)},
        {"OUTPUT_COUNT", format("%d", g->outputs.len)},
        {"DEBUG_COUNT", format("%d", debug.len)},
        {"GUARD_COUNT", format("%d", p->nguards)},
        {"WEIGHTS_FILE", opt->weights_file ? format("\"%s\"", c_string(opt->weights_file))
                                           : "NULL"},
        {"WEIGHTS_CHECKSUM", u64(p->weights_checksum)},
        {"DIM_COUNT", format("%d", declared_dims(g))},
        {"DERIVED_COUNT", format("%d", g->ndims - declared_dims(g))},
        {"DIMS_OFFSET", u64(p->dims ? p->dims->offset : 0)},
        {"DIMS_IO_OFFSET", u64(p->dims_io_offset)},
        {"INDIRECT_OFFSET", u64(p->indirect ? p->indirect->offset : 0)},
        {"INDIRECT_IO_OFFSET", u64(p->indirect_io_offset)},
        {"INDIRECT_COUNT", format("%d", p->nindirect)},
        {"STATE_COUNT", format("%d", g->states.len)},
        {"STATE_COPY_COUNT", format("%d", p->nstate_copies)},
        {"SYNC_CHECK", p->sync_check ? "1u" : "0u"},
        {"INPUT_LIST", tensor_list(&g->inputs)},
        {"SIZE_MACROS", format("%s%s", size_macros(&g->inputs, upper, "INPUT"),
                               size_macros(&g->outputs, upper, "OUTPUT"))},
        {"OUTPUT_LIST", tensor_list(&g->outputs)},
        {"KERNELS", kernels.buf},
        {"WEIGHTS", weights.buf},
        {"TENSORS", tensors.buf},
        {"SCHEDULE", sched.buf},
        {"DISPATCH_TABLE", lines.buf},
        {"TUNING", tuning.buf},
    };
    int nsubs = (int)(sizeof subs / sizeof subs[0]);
    const EmbeddedFile *tc = embedded_file("model.c.in");
    const EmbeddedFile *th = embedded_file("model.h.in");
    if (!tc || !th)
        internal_error("templates are missing from this build of kiln");
    render(out_c, tc->text, subs, nsubs);
    render(out_h, th->text, subs, nsubs);
}
