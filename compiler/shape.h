/*
 * shape.h: what the shape rules share. infer_shapes.c (the driver: order,
 * the table of rules, states) calls shape_<family>.c, one per op family
 * named as in shaders/, which call shape_common.c and op_params.c (what
 * attributes mean; dynamic.c and lowering read it too): the dependencies
 * run one way. Each section is named after the file that defines it;
 * every op's shape rule is declared from ops.def at the end.
 */
#ifndef KILN_SHAPE_H
#define KILN_SHAPE_H

#include "kiln.h"

/* dtype classes */
static inline bool is_numeric(kiln_dtype d) { return d != KILN_DTYPE_BOOL; }
static inline bool is_index(kiln_dtype d) { return d == KILN_DTYPE_I32 || d == KILN_DTYPE_I64; }

/* ---- op_params.c ------------------------------------------------------- */

/* Where an attribute's value is (the node's place when it has none). */
Loc attr_loc(Node *n, const char *key);
/* A number attribute that must be positive (eps, rates). */
double positive_float(Node *n, const char *key);
/* An axis (possibly negative) of rank, normalized; out of range: an error. */
int norm_axis(Node *n, const char *key, int64_t axis, int rank);
/* The list attribute `key` as distinct normalized axes of rank; returns the
 * count, or -1 when absent. */
int attr_axes(Node *n, const char *key, int rank, int *axes);
/* depth_to_space's and space_to_depth's block (positive; x [N, C, H, W]). */
int64_t block_of(Node *n, Tensor *x);
/* An integer attribute in [1, most] (its row's default, or required). */
int64_t positive_attr(Node *n, const char *key, int64_t most);
/* v, the value of attribute key, checked to be in [1, most]. */
int64_t positive_value(Node *n, const char *key, int64_t v, int64_t most);

/* ---- shape_common.c ---------------------------------------------------- */

void set_output(Node *n, kiln_dtype dt, int rank, const int64_t *shape);
/* gemm's and conv's `activation`: none or an ACTIVATION row (ops.def). */
void check_activation(Node *n);
void require(Node *n, int i, bool ok, const char *what);
void same_dtype(Node *n, int first, int last);
int broadcast_inputs(Node *n, int first, int64_t *shape);
kiln_dtype attr_dtype(Node *n, const char *key);
void require_f32(Node *n);
/* Every input f32 or f16 (kernels that convert on load: f32 arithmetic). */
void require_float(Node *n);
void check_channel_param(Node *n, int i, int64_t c);
void check_index_extent(Node *n, const Tensor *x, const Tensor *idx);
void check_const_indices(Node *n, int k, const Tensor *x, int axis);
void same_shape(Node *n, int i, const Tensor *like, const char *what);
void set_output_i(Node *n, int i, const Tensor *like, int rank, const int64_t *shape);

/* ---- each op's shape rule, in shape_<family>.c (ops.def names it) ---- */

#define OP(id, name, mn, mx, flags, attrs, shape, lower, dyn, expr) void shape(Node *n);
#include "ops.def"
#undef OP

#endif /* KILN_SHAPE_H */
