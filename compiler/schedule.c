/*
 * schedule.c: barriers only where byte ranges conflict.
 *
 * The dispatch order is the lowering order (topological). Walking it, the
 * scheduler keeps the accesses made since the last barrier. A dispatch that
 * reads bytes one of them wrote (read after write), writes bytes one of them
 * read (write after read: memory reuse makes this happen) or writes bytes one
 * of them wrote (write after write) gets a barrier before it, which orders it
 * after everything earlier; the pending set then starts over. Independent
 * dispatches run with no barrier between them, as do the variants of one
 * matmul of which each run gives only one work (lower_matmul.c; with
 * --sync-check those get a barrier too) and a concat's copies of its
 * pieces into interleaved regions (Dispatch.disjoint_writes; with
 * --sync-check, a barrier). Each barrier records the
 * dispatch and tensor that made it necessary, for `kiln inspect`.
 *
 * The runtime adds the barriers around the whole schedule (input copies
 * before, output copies after); they are not counted here.
 */
#include "kiln.h"

typedef struct Access {
    uint32_t buffer;
    uint64_t begin, end; /* bytes */
    bool write;
    int dispatch;
    Tensor *t;
} Access;

static bool overlap(const Access *a, const Access *b) {
    if (a->begin == a->end || b->begin == b->end)
        return false; /* an unused slot */
    return a->buffer == b->buffer && a->begin < b->end && b->begin < a->end;
}

/* Whether d is a later variant of w (w->variant, its variant, ...): of a
 * product's kernels for different rows, a run gives work to one only. */
static bool later_variant(const Dispatch *w, const Dispatch *d) {
    for (const Dispatch *v = w->variant; v; v = v->variant)
        if (v == d)
            return true;
    return false;
}

void schedule(Graph *g, Program *p) {
    (void)g;
    Access *pending = NULL;
    int npending = 0, cap = 0;
    for (int i = 0; i < p->ndispatches; i++) {
        Dispatch *d = p->dispatches[i];
        Access mine[MAX_ARGS];
        for (int k = 0; k < d->nargs; k++) {
            Tensor *r = tensor_root(d->args[k]);
            uint64_t base = tensor_base(d->args[k]);
            mine[k] = (Access){r->buffer, base + d->arg_begin[k], base + d->arg_end[k],
                               (d->writes >> k) & 1u, i, d->args[k]};
        }
        /* Reads first, so a barrier's reason names the data dependency
         * (read after write) when there is one. */
        for (int pass = 0; pass < 2 * d->nargs && !d->barrier; pass++) {
            int k = pass % d->nargs;
            if (mine[k].write != (pass >= d->nargs))
                continue;
            for (int j = 0; j < npending; j++) {
                Access *a = &pending[j];
                /* Variants never both work in one run; --sync-check
                 * orders those a run chooses between (dynamic ones) all the
                 * same, since the validation layer cannot tell that one of
                 * them gets no workgroups. */
                Dispatch *w = p->dispatches[a->dispatch];
                if (!(a->write || mine[k].write) || !overlap(a, &mine[k]) ||
                    (later_variant(w, d) && !(p->sync_check && d->dynamic)))
                    continue;
                /* a concat's pieces: their elements are disjoint, their
                 * byte ranges interleave (strided regions); the validation
                 * layer sees ranges only, so --sync-check keeps the
                 * barrier */
                if (a->write && mine[k].write && w->disjoint_writes && d->disjoint_writes &&
                    w->node == d->node && a->t == mine[k].t && !p->sync_check)
                    continue;
                d->barrier = true;
                d->wait_on = a->dispatch;
                if (!mine[k].write)
                    d->reason = format("read after write: reads '%s', written by "
                                       "dispatch %d (%s)", mine[k].t->name,
                                       a->dispatch, w->node->name);
                else
                    d->reason = format("write after %s: writes '%s' over '%s', %s "
                                       "by dispatch %d (%s)",
                                       a->write ? "write" : "read", mine[k].t->name,
                                       a->t->name, a->write ? "written" : "read",
                                       a->dispatch, w->node->name);
                break;
            }
        }
        if (d->barrier)
            npending = 0;
        for (int k = 0; k < d->nargs; k++) {
            if (mine[k].buffer == KILN_BUFFER_WEIGHTS)
                continue; /* never written */
            if (npending == cap) {
                cap = cap ? cap * 2 : 64;
                pending = xrealloc(pending, sizeof *pending * (size_t)cap);
            }
            pending[npending++] = mine[k];
        }
    }
}
