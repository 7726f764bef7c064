/*
 * rewrite.h: what rewrite.c's passes share with the attention rewrite
 * (rewrite_attention.c): the rewriter's state and the helpers that make
 * nodes and settle them.
 */
#ifndef KILN_REWRITE_H
#define KILN_REWRITE_H

#include "kiln.h"
#include "views.h"

typedef struct Rewriter {
    Graph *g;
    Vec order;  /* the nodes in their new order */
    Map tables; /* rope's [positions, h] cos and sin tables, by source */
    int rms, rope, attention, transposes, gelu, silu, outer, batch_norms;
} Rewriter;

/* t's producer when it is an op node, else NULL. */
Node *rw_made_by(const Tensor *t, OpKind op);
/* The value of a one-element f32 weight. */
bool rw_scalar_of(const Tensor *t, double *v);
/* n's attribute key as an axis of a tensor of rank `rank`, normalized. */
int rw_last_axis(Node *n, const char *key, int rank);
/* A new node of op over inputs in, named after at and what, with one output. */
Node *rw_new_node(Rewriter *r, OpKind op, const Node *at, const char *what, int nin,
                  Tensor *const *in);
/* A reshape of x to shape. */
Node *rw_new_view(Rewriter *r, const Node *at, const char *what, Tensor *x, int rank,
                  const int64_t *shape);
/* Infers the fresh nodes, then anchor (already changed; saved holds it as
 * it was); on an error the anchor is put back and nothing is kept. */
bool rw_settle(Rewriter *r, Node **fresh, int nfresh, Node *anchor, const Node *saved,
               const Tensor *saved_out);
/* Makes anchor the op `op` of inputs in; saves what it was, for settle. */
void rw_become(Node *anchor, OpKind op, int nin, Tensor *const *in, Node *saved,
               Tensor *saved_out);

/* rewrite_attention.c: softmax(Q K^T [+ mask]) V as one attention node,
 * and an attention node's operands read in place through their views. */
void try_attention(Rewriter *r, Node *n);
void try_attention_operands(Rewriter *r, Node *n);

#endif
