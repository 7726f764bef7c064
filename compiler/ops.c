/*
 * ops.c: the op table's names and arities, derived from ops.def.
 */
#include "kiln.h"

#include <string.h>

const OpInfo op_info[OP_COUNT] = {
#define OP(id, name, mn, mx, attrs, shape, lower, expr) [OP_##id] = {name, mn, mx, attrs, expr},
#include "ops.def"
#undef OP
};

OpKind op_lookup(const char *name) {
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(op_info[i].name, name) == 0)
            return (OpKind)i;
    return OP_COUNT;
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
