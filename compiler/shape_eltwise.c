/*
 * shape_eltwise.c: shape rules of the elementwise ops: unary, arithmetic,
 * comparison, logic, where, cast (numpy broadcasting).
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void shape_unary_float(Node *n) {
    Tensor *x = n->inputs[0];
    require(n, 0, is_float(x->dtype), "f32 or f16");
    set_output(n, x->dtype, x->rank, x->shape);
}

void shape_float_predicate(Node *n) {
    Tensor *x = n->inputs[0];
    require(n, 0, is_float(x->dtype), "f32 or f16");
    set_output(n, KILN_DTYPE_BOOL, x->rank, x->shape);
}

void shape_unary_numeric(Node *n) {
    Tensor *x = n->inputs[0];
    require(n, 0, is_numeric(x->dtype), "numeric (not bool)");
    set_output(n, x->dtype, x->rank, x->shape);
}

void shape_arith(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, is_numeric(n->inputs[i]->dtype), "numeric (not bool)");
    same_dtype(n, 0, n->ninputs - 1);
    int64_t shape[MAX_RANK];
    int rank = broadcast_inputs(n, 0, shape);
    set_output(n, n->inputs[0]->dtype, rank, shape);
}

void shape_bitwise(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, is_numeric(n->inputs[i]->dtype) && !is_float(n->inputs[i]->dtype),
                "integer");
    shape_arith(n);
}

void shape_shift(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, n->inputs[i]->dtype == KILN_DTYPE_U8 ||
                          n->inputs[i]->dtype == KILN_DTYPE_I8 ||
                          n->inputs[i]->dtype == KILN_DTYPE_I32 ||
                          n->inputs[i]->dtype == KILN_DTYPE_I64, "u8, i8, i32 or i64");
    shape_arith(n);
}

void shape_arith_float(Node *n) {
    require_float(n);
    shape_arith(n);
}

void shape_compare(Node *n) {
    same_dtype(n, 0, n->ninputs - 1);
    int64_t shape[MAX_RANK];
    int rank = broadcast_inputs(n, 0, shape);
    set_output(n, KILN_DTYPE_BOOL, rank, shape);
}

void shape_logical(Node *n) {
    for (int i = 0; i < n->ninputs; i++)
        require(n, i, n->inputs[i]->dtype == KILN_DTYPE_BOOL, "bool");
    int64_t shape[MAX_RANK];
    int rank = broadcast_inputs(n, 0, shape);
    set_output(n, KILN_DTYPE_BOOL, rank, shape);
}

/* where(cond, x, y) */
void shape_where(Node *n) {
    if (n->inputs[0]->dtype != KILN_DTYPE_BOOL)
        node_error_at(n, n->input_locs[0], "the condition '%s' of where must be bool, "
                      "not %s", n->inputs[0]->name,
                      kiln_dtype_name(n->inputs[0]->dtype));
    same_dtype(n, 1, 2);
    int64_t shape[MAX_RANK];
    int rank = broadcast_inputs(n, 0, shape);
    set_output(n, n->inputs[1]->dtype, rank, shape);
}

void shape_cast(Node *n) {
    Tensor *x = n->inputs[0];
    set_output(n, attr_dtype(n, "to"), x->rank, x->shape);
}
