/*
 * dynamic.h: what dynamic.c (which axes follow the dynamic dimensions)
 * takes from dynamic_dims.c (the dims and their expressions) beyond
 * kiln.h: the dependency runs one way.
 */
#ifndef KILN_DYNAMIC_H
#define KILN_DYNAMIC_H

#include "kiln.h"

/* e * k in out, unless a term overflows or it is not small. */
bool scale_small(const DimExpr *e, int64_t k, DimExpr *out);
/* e / k in q, where k divides every term of e. */
bool div_exact(const DimExpr *e, int64_t k, DimExpr *q);

#endif
