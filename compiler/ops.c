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
