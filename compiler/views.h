/*
 * views.h: a tensor followed back through views, transposes, broadcasts
 * and parts picked out of another (views.c), as the rewrites read their
 * operands in place.
 */
#ifndef KILN_VIEWS_H
#define KILN_VIEWS_H

#include "kiln.h"

/* A tensor seen as an index map into root's elements (contiguous at root's
 * stored shape): element i lies at base + the sum over axes of (i[a] /
 * div[a]) * stride[a]. div > 1 comes from merging a broadcast axis into
 * the axis before it: heads repeated for grouped-query attention; base
 * from a part taken by a constant index or slice (qkv[1]). */
typedef struct View {
    Tensor *root;
    int rank;
    int64_t size[MAX_RANK], stride[MAX_RANK], div[MAX_RANK];
    int64_t base;
} View;

/* t followed back through transposes, views, broadcasts and parts picked
 * (a gather of one constant index, a split's part, a slice of unit steps)
 * to the tensor whose elements it indexes; false where the chain is not one
 * such map. */
bool trace_view(Tensor *t, View *v);
/* The same, through products by one-element f32 constants too (a scaled
 * query or key), their product multiplied into *scale. */
bool trace_view_scaled(Tensor *t, View *v, double *scale);
/* The same, stopping at tensor `stop` where the way back meets it (NULL:
 * no stop), as the view of stop's elements. */
bool trace_view_until(Tensor *t, View *v, double *scale, const Tensor *stop);
/* v viewed at `shape` (rank axes, its element count), as a reshape views
 * it; false where an axis merged would have no single stride. */
bool reshape_view(View *v, int rank, const int64_t *shape);
/* Whether n is a view node (reshape and the like: no dispatch of its own). */
bool is_view(const Node *n);

#endif
