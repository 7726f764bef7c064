/*
 * optimize.c: graph rewrites before lowering.
 *
 * Today: dead-node removal (nodes no output depends on are marked dead and
 * emit nothing). Views (reshape) are decided in lowering, where they alias
 * their input's bytes. Fusions land here, each its own pass behind an
 * Options flag.
 */
#include "kiln.h"

#include <stdio.h>

static void remove_dead_nodes(Graph *g, const Options *opt) {
    /* Nodes are in topological order: walk backwards, a node is live when
     * one of its outputs is a model output or feeds a live node. */
    bool *live = xcalloc((size_t)g->tensors.len + 1, sizeof(bool));
    for (int i = 0; i < g->outputs.len; i++)
        live[((Tensor *)g->outputs.data[i])->id] = true;
    for (int i = g->nodes.len - 1; i >= 0; i--) {
        Node *n = g->nodes.data[i];
        bool any = false;
        for (int k = 0; k < n->noutputs; k++)
            any |= live[n->outputs[k]->id];
        n->dead = !any;
        if (n->dead) {
            if (opt->verbose)
                fprintf(stderr, "kiln: node '%s' feeds no output; removed\n",
                        n->name);
            continue;
        }
        for (int k = 0; k < n->ninputs; k++)
            live[n->inputs[k]->id] = true;
    }
}

void optimize(Graph *g, const Options *opt) { remove_dead_nodes(g, opt); }
