/*
 * ops.c: the op table's names and arities, derived from ops.def.
 */
#include "kiln.h"

#include <string.h>

const OpInfo op_info[OP_COUNT] = {
#define OP(id, name, mn, mx, flags, attrs, shape, lower, dyn, expr) \
    [OP_##id] = {name, mn, mx, flags, attrs, expr},
#include "ops.def"
#undef OP
};

OpKind op_lookup(const char *name) {
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(op_info[i].name, name) == 0)
            return (OpKind)i;
    return OP_COUNT;
}

int activation_lookup(const char *name) {
    if (strcmp(name, "none") == 0)
        return OP_COUNT;
    OpKind op = op_lookup(name);
    return op != OP_COUNT && (op_info[op].flags & ACTIVATION) ? (int)op : -1;
}

bool is_view_op(OpKind op) {
    return op == OP_RESHAPE || op == OP_SQUEEZE || op == OP_UNSQUEEZE || op == OP_FLATTEN;
}

const char *activation_names(void) {
    Str s = {0};
    str_add(&s, "none");
    for (int i = 0; i < OP_COUNT; i++)
        if (op_info[i].flags & ACTIVATION)
            str_addf(&s, " %s", op_info[i].name);
    return s.buf;
}

const char *op_arity_error(OpKind op, int n) {
    const OpInfo *o = &op_info[op];
    if (n >= o->min_inputs && n <= o->max_inputs)
        return NULL;
    if (o->max_inputs == VARIADIC)
        return format("%s takes at least %d input%s, got %d", o->name, o->min_inputs,
                      o->min_inputs == 1 ? "" : "s", n);
    if (o->min_inputs == o->max_inputs)
        return format("%s takes %d input%s, got %d", o->name, o->min_inputs,
                      o->min_inputs == 1 ? "" : "s", n);
    return format("%s takes %d to %d inputs, got %d", o->name, o->min_inputs, o->max_inputs,
                  n);
}

/* Finds `key` in an op's attribute list; returns its "=default" text (or ""
 * when it has none), or NULL when the op has no such attribute. */
const char *op_attr_default(OpKind op, const char *key) {
    size_t n = strlen(key);
    for (const char *p = op_info[op].attrs; *p;) {
        while (*p == ' ')
            p++;
        const char *e = p;
        while (*e && *e != ' ' && *e != '=')
            e++;
        bool match = (size_t)(e - p) == n && strncmp(p, key, n) == 0;
        const char *dflt = e;
        while (*e && *e != ' ')
            e++;
        if (match) {
            static char buf[64];
            if (*dflt != '=')
                return "";
            size_t len = (size_t)(e - dflt - 1);
            if (len >= sizeof buf)
                len = sizeof buf - 1;
            memcpy(buf, dflt + 1, len);
            buf[len] = 0;
            return xstrdup(buf);
        }
        p = e;
    }
    return NULL;
}
