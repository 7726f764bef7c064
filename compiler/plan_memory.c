/*
 * plan_memory.c: a place for every tensor's bytes.
 *
 * Weights are packed one after another into the weight buffer. Everything
 * else lives in one arena. A tensor's live range is the span of dispatch
 * indices from its first to its last use; inputs and outputs are pinned
 * (live for the whole run, since the host writes and reads them around the
 * dispatches). Views share their root's bytes, so the root's range covers
 * every use of every view.
 *
 * Placement is best fit: tensors in a given order; each goes into the
 * smallest gap between the already placed tensors whose ranges overlap its
 * own, or above them all when no gap fits. Offsets are multiples of the
 * alignment. Which order packs tightest depends on the graph, so several are
 * tried (decreasing size, decreasing size times lifetime, decreasing
 * lifetime, first use) and the smallest arena kept (the first order on a
 * tie); the search stops early when one reaches the lower bound, the largest
 * sum of (aligned) sizes live at any one step: no placement can do better.
 *
 * Inputs and outputs also get a place in the staging buffer (io_offset):
 * inputs first, then outputs (at the arena's alignment), guard bands, the
 * dynamic dimensions' values and indirect commands (16-byte aligned).
 */
#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Slot {
    Tensor *t;
    uint64_t size; /* aligned */
} Slot;

/* The placement orders: each a key, larger first; ties by first use, then
 * by tensor id (so every order is deterministic). */
enum { ORDER_SIZE, ORDER_AREA, ORDER_LIFE, ORDER_FIRST, ORDER_LAST, ORDER_END_FIRST, ORDER_COUNT };
static int order_kind; /* the order qsort's comparison uses */
#define MOVES 16       /* placements tried from each order */

static double order_key(const Slot *s) {
    double life = (double)s->t->last - (double)s->t->first + 1;
    switch (order_kind) {
    case ORDER_AREA: return (double)s->size * life;
    case ORDER_LIFE: return life;
    case ORDER_FIRST: return -(double)s->t->first;
    case ORDER_LAST: return (double)s->t->last;
    case ORDER_END_FIRST: return -(double)s->t->last;
    default: return (double)s->size;
    }
}

static int by_order(const void *x, const void *y) {
    const Slot *a = x, *b = y;
    double ka = order_key(a), kb = order_key(b);
    if (ka != kb)
        return ka > kb ? -1 : 1;
    if (a->size != b->size)
        return a->size > b->size ? -1 : 1;
    if (a->t->first != b->t->first)
        return a->t->first < b->t->first ? -1 : 1;
    return a->t->id < b->t->id ? -1 : a->t->id > b->t->id;
}

static int by_offset(const void *x, const void *y) {
    const Slot *a = *(const Slot *const *)x, *b = *(const Slot *const *)y;
    return a->t->offset < b->t->offset ? -1 : a->t->offset > b->t->offset;
}

static bool ranges_meet(const Tensor *a, const Tensor *b) {
    return a->first <= b->last && b->first <= a->last;
}

static void live_ranges(Graph *g, Program *p) {
    int n = p->ndispatches;
    for (int i = 0; i < g->tensors.len; i++) {
        Tensor *t = g->tensors.data[i];
        t->first = n + 1; /* unused until seen */
        t->last = -2;
    }
    for (int i = 0; i < n; i++) {
        Dispatch *d = p->dispatches[i];
        for (int k = 0; k < d->nargs; k++) {
            Tensor *r = tensor_root(d->args[k]);
            if (i < r->first)
                r->first = i;
            if (i > r->last)
                r->last = i;
        }
    }
    for (int i = 0; i < g->inputs.len; i++) {
        Tensor *t = g->inputs.data[i];
        t->first = -1;
        t->last = n;
    }
    for (int i = 0; i < g->outputs.len; i++) {
        Tensor *r = tensor_root(g->outputs.data[i]);
        r->first = -1;
        r->last = n;
    }
    /* States live across runs; an update lives until the copy into its
     * state after the last dispatch. */
    for (int i = 0; i < g->states.len; i++) {
        Tensor *s = g->states.data[i];
        s->first = -1;
        s->last = n;
        if (s->update)
            tensor_root(s->update)->last = n;
    }
    /* The dims and indirect commands: written before the dispatches. */
    Tensor *pinned[2] = {p->dims, p->indirect};
    for (int i = 0; i < 2; i++) {
        if (pinned[i]) {
            pinned[i]->first = -1;
            pinned[i]->last = n;
        }
    }
    /* --debug-tensors: every tensor a dispatch touches lives for the whole
     * run, so it can be read back afterwards. */
    for (int i = 0; p->debug_tensors && i < g->tensors.len; i++) {
        Tensor *t = g->tensors.data[i];
        if (t->kind == T_VALUE && !t->alias && t->last >= t->first) {
            t->first = -1;
            t->last = n;
        }
    }
}

/* Weights no dispatch or output uses (folded away, or of dead nodes) are
 * not placed; emit_c leaves them out. */
static void place_weights(Graph *g, Program *p) {
    uint64_t off = 0;
    for (int i = 0; i < g->weights.len; i++) {
        Tensor *t = g->weights.data[i];
        t->buffer = KILN_BUFFER_WEIGHTS;
        if (t->last < t->first) {
            t->offset = UINT64_MAX;
            continue;
        }
        t->offset = off;
        off = align_up(off + slot_bytes(t), p->alignment);
    }
    p->weight_bytes = off;
}

/* Places slots in their order (best fit among the placed ones whose
 * ranges meet); returns the arena's top. placed and meet: scratch, n long. */
static uint64_t place_in_order(Slot *slots, int n, Slot **placed, Slot **meet) {
    int nplaced = 0;
    uint64_t top = 0;
    for (int i = 0; i < n; i++) {
        Slot *s = &slots[i];
        int m = 0;
        for (int j = 0; j < nplaced; j++)
            if (ranges_meet(placed[j]->t, s->t))
                meet[m++] = placed[j];
        qsort(meet, (size_t)m, sizeof *meet, by_offset);
        /* Gaps between the tensors met, in offset order. */
        uint64_t best = UINT64_MAX, best_gap = UINT64_MAX, cursor = 0;
        for (int j = 0; j <= m; j++) {
            uint64_t end = j < m ? meet[j]->t->offset : UINT64_MAX;
            if (end > cursor && end - cursor >= s->size && j < m &&
                end - cursor < best_gap) {
                best = cursor;
                best_gap = end - cursor;
            }
            if (j < m) {
                uint64_t e = meet[j]->t->offset + meet[j]->size;
                if (e > cursor)
                    cursor = e;
            }
        }
        s->t->offset = best != UINT64_MAX ? best : cursor;
        if (s->t->offset + s->size > top)
            top = s->t->offset + s->size;
        placed[nplaced++] = s;
    }
    return top;
}

static void place_arena(Graph *g, Program *p) {
    Slot *slots = xcalloc((size_t)g->tensors.len + 1, sizeof *slots);
    int n = 0;
    for (int i = 0; i < g->tensors.len; i++) {
        Tensor *t = g->tensors.data[i];
        if (t->kind == T_WEIGHT || t->alias || t->last < t->first)
            continue;
        t->buffer = KILN_BUFFER_ARENA;
        t->offset = 0;
        uint64_t size = align_up(slot_bytes(t), p->alignment);
        if (size == 0)
            continue;
        slots[n].t = t;
        slots[n].size = size;
        n++;
    }
    /* Lower bound: the most bytes live at one step. */
    uint64_t peak = 0;
    for (int step = -1; step <= p->ndispatches; step++) {
        uint64_t live = 0;
        for (int i = 0; i < n; i++)
            if (slots[i].t->first <= step && step <= slots[i].t->last)
                live += slots[i].size;
        if (live > peak)
            peak = live;
    }
    p->peak_bytes = peak;

    Slot **placed = xcalloc((size_t)n + 1, sizeof *placed);
    Slot **meet = xcalloc((size_t)n + 1, sizeof *meet);
    uint64_t *best_offset = xcalloc((size_t)g->tensors.len + 1, sizeof *best_offset);
    uint64_t best_top = UINT64_MAX;
    /* A placement compares each slot with those placed before it: about n^2
     * steps. Large graphs get fewer moves (some 2e8 steps in all). */
    double per = (double)n * (double)n * ORDER_COUNT;
    int moves = per * MOVES > 2e8 ? (int)(2e8 / (per > 1 ? per : 1)) : MOVES;
    if (moves < 1)
        moves = 1;
    for (order_kind = 0; order_kind < ORDER_COUNT && best_top > peak; order_kind++) {
        qsort(slots, (size_t)n, sizeof *slots, by_order);
        /* Then, a few times, the slot that ends at the top moved to the
         * front of the order: placed first, it takes the lowest place. */
        for (int round = 0; round < moves && best_top > peak; round++) {
            uint64_t top = place_in_order(slots, n, placed, meet);
            if (top < best_top) {
                best_top = top;
                for (int i = 0; i < n; i++)
                    best_offset[slots[i].t->id] = slots[i].t->offset;
            }
            int at = n - 1;
            while (at > 0 && slots[at].t->offset + slots[at].size != top)
                at--;
            if (at == 0)
                break;
            Slot s = slots[at];
            memmove(slots + 1, slots, sizeof *slots * (size_t)at);
            slots[0] = s;
        }
    }
    for (int i = 0; i < n; i++)
        slots[i].t->offset = best_offset[slots[i].t->id];
    p->arena_bytes = n ? best_top : 0;
}

/* --guard: every slot of its own, in tensor order, with a band of GUARD
 * bytes before the first and after each (from the end of its bytes, rounded
 * to 4, to the next slot). */
#define GUARD_BYTES 256

static void add_guard(Program *p, uint64_t from, uint64_t to, const char *after) {
    from = align_up(from, 4);
    if (to <= from)
        return;
    p->guards = xrealloc(p->guards, sizeof(kiln_guard) * (size_t)(p->nguards + 1));
    kiln_guard *g = &p->guards[p->nguards++];
    g->offset = from;
    g->bytes = to - from;
    g->io_offset = 0; /* place_io */
    g->after = after;
    g->index_node = NULL;
}

static void place_arena_guarded(Graph *g, Program *p) {
    uint64_t band = align_up(GUARD_BYTES, p->alignment), cursor = band;
    add_guard(p, 0, band, "");
    uint64_t peak = 0;
    for (int i = 0; i < g->tensors.len; i++) {
        Tensor *t = g->tensors.data[i];
        if (t->kind == T_WEIGHT || t->alias || t->last < t->first || !slot_bytes(t))
            continue;
        t->buffer = KILN_BUFFER_ARENA;
        t->offset = cursor;
        uint64_t end = cursor + slot_bytes(t);
        if (t->index_report) { /* the slot itself is checked: the kernel's report */
            add_guard(p, cursor, end, t->name);
            p->guards[p->nguards - 1].index_node = t->index_report;
        }
        cursor = align_up(end, p->alignment) + band;
        add_guard(p, end, cursor, t->name);
        peak += align_up(slot_bytes(t), p->alignment);
    }
    p->arena_bytes = cursor;
    p->peak_bytes = peak; /* nothing shares: every byte is its own */
}

/* Inputs and outputs at the arena's alignment (at least 16 bytes): the
 * dispatches may reach them in staging itself (the runtime's direct I/O),
 * and a descriptor over one (--sync-check), which starts at the device's
 * alignment, then covers no other. With --guard a band before the first and
 * after each, which the runtime checks where the dispatches write staging. */
static void place_io(Graph *g, Program *p) {
    uint64_t align = p->alignment > 16 ? p->alignment : 16;
    uint64_t band = p->guard ? GUARD_BYTES : 0, off = align_up(band, align);
    for (int i = 0; i < g->inputs.len; i++) {
        Tensor *t = g->inputs.data[i];
        t->io_offset = off;
        off = align_up(off + slot_bytes(t) + band, align);
    }
    for (int i = 0; i < g->outputs.len; i++) {
        Tensor *t = g->outputs.data[i];
        t->io_offset = off;
        off = align_up(off + slot_bytes(t) + band, align);
    }
    for (int i = 0; i < p->nguards; i++) {
        p->guards[i].io_offset = off;
        off = align_up(off + p->guards[i].bytes, 16);
    }
    if (p->dims) {
        p->dims_io_offset = off;
        off = align_up(off + slot_bytes(p->dims), 16);
    }
    if (p->indirect) {
        p->indirect_io_offset = off;
        off = align_up(off + slot_bytes(p->indirect), 16);
    }
    p->io_bytes = off;
}

int check_plan(Graph *g, Program *p) {
    int bad = 0;
    for (int i = 0; i < g->tensors.len; i++) {
        Tensor *a = g->tensors.data[i];
        if (a->kind == T_WEIGHT || a->alias || a->last < a->first || !slot_bytes(a))
            continue;
        if (a->offset % p->alignment || a->offset + slot_bytes(a) > p->arena_bytes) {
            fprintf(stderr, "plan: '%s' at %llu is misaligned or outside the arena\n",
                    a->name, (unsigned long long)a->offset);
            bad++;
        }
        for (int j = i + 1; j < g->tensors.len; j++) {
            Tensor *b = g->tensors.data[j];
            if (b->kind == T_WEIGHT || b->alias || b->last < b->first ||
                !slot_bytes(b) || !ranges_meet(a, b))
                continue;
            if (a->offset < b->offset + slot_bytes(b) &&
                b->offset < a->offset + slot_bytes(a)) {
                fprintf(stderr, "plan: '%s' and '%s' are live together and overlap\n",
                        a->name, b->name);
                bad++;
            }
        }
    }
    return bad;
}

void plan_memory(Graph *g, Program *p) {
    live_ranges(g, p);
    place_weights(g, p);
    if (p->guard)
        place_arena_guarded(g, p);
    else
        place_arena(g, p);
    place_io(g, p);
    if (check_plan(g, p))
        internal_error("the memory plan overlaps live tensors");
}
