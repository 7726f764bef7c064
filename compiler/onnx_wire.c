/*
 * onnx_wire.c: an ONNX file's weights kept out of protobuf-c's copy.
 *
 * protobuf-c copies every bytes field it unpacks, and the raw_data of a
 * model's initializers is nearly all of its size: unpacking BERT-base
 * copied 434 MB. Before the unpack, onnx_take_raw_data walks the protobuf
 * wire format down to ModelProto.graph (field 7), its initializers (field
 * 5) and their raw_data (field 9), and writes a copy of the file in which
 * each raw_data of RAW_MIN bytes or more is empty, recording where it is in
 * the original; after the unpack, onnx_put_raw_data points each such
 * initializer's raw_data back at those bytes. The copy holds the rest of the
 * file only (the graph, names, small tensors): a few hundred kilobytes.
 *
 * Anything the walk does not expect (a malformed varint, a length past the
 * end, a group) stops it: the file is then unpacked as it is and protobuf-c
 * judges it. Repeated fields keep protobuf's semantics: the k-th initializer
 * field in the file, whichever graph field holds it, is initializer[k]
 * after the unpack, and the last raw_data of a tensor wins.
 *
 * Also here: fill_absent_names, the names protobuf-c leaves NULL made "".
 */
#include "onnx.h"

#include <string.h>

#define RAW_MIN 1024 /* smaller raw_data stays inline */

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

typedef struct Walk {
    const uint8_t *base;
    Str out;
    RawSpan *spans;
    size_t nspans, cap, initializers;
    bool bad;
} Walk;

/* A varint at *p (before end); false when malformed or cut off. */
static bool get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

static void put_varint(Str *s, uint64_t v) {
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        v >>= 7;
    } while (v);
    str_addn(s, b, n);
}

/* One field at *p: its number, wire type and, for WIRE_LEN, its payload;
 * *p moves past it. False (and w->bad) when it is not well formed. */
static bool next_field(Walk *w, const uint8_t **p, const uint8_t *end, uint64_t *number,
                       int *type, const uint8_t **payload, size_t *len) {
    uint64_t key, n = 0;
    if (!get_varint(p, end, &key))
        return !(w->bad = true);
    *number = key >> 3;
    *type = (int)(key & 7);
    switch (*type) {
    case WIRE_VARINT: return get_varint(p, end, &n) || !(w->bad = true);
    case WIRE_I64: n = 8; break;
    case WIRE_I32: n = 4; break;
    case WIRE_LEN:
        if (!get_varint(p, end, &n))
            return !(w->bad = true);
        *payload = *p;
        *len = (size_t)n;
        break;
    default: return !(w->bad = true); /* groups: not in onnx.proto */
    }
    if (n > (uint64_t)(end - *p))
        return !(w->bad = true);
    *p += n;
    return true;
}

/* The message in [p, end) at nesting `level` (0 ModelProto, 1 GraphProto,
 * 2 TensorProto) into w->out, with the fields that lead to raw_data
 * rewritten. */
static void walk(Walk *w, const uint8_t *p, const uint8_t *end, int level) {
    while (p < end && !w->bad) {
        const uint8_t *start = p, *payload = NULL;
        uint64_t number;
        int type;
        size_t len = 0;
        if (!next_field(w, &p, end, &number, &type, &payload, &len))
            return;
        bool into = type == WIRE_LEN && ((level == 0 && number == 7) ||
                                          (level == 1 && number == 5));
        if (into) {
            Str outer = w->out; /* the sub-message is written on its own */
            memset(&w->out, 0, sizeof w->out);
            size_t tensor = w->initializers;
            walk(w, payload, payload + len, level + 1);
            Str inner = w->out;
            w->out = outer;
            put_varint(&w->out, number << 3 | WIRE_LEN);
            put_varint(&w->out, inner.len);
            str_addn(&w->out, inner.buf ? inner.buf : "", inner.len);
            xfree(inner.buf);
            if (level == 1)
                w->initializers = tensor + 1;
        } else if (level == 2 && number == 9 && type == WIRE_LEN && len >= RAW_MIN) {
            if (w->nspans == w->cap) {
                w->cap = w->cap ? 2 * w->cap : 64;
                w->spans = xrealloc(w->spans, w->cap * sizeof *w->spans);
            }
            w->spans[w->nspans++] = (RawSpan){w->initializers, payload, len};
            put_varint(&w->out, 9 << 3 | WIRE_LEN);
            put_varint(&w->out, 0);
        } else {
            if (level == 2 && number == 9 && w->nspans &&
                w->spans[w->nspans - 1].initializer == w->initializers)
                w->nspans--; /* a later, inline raw_data wins */
            str_addn(&w->out, start, (size_t)(p - start));
        }
    }
}

const uint8_t *onnx_take_raw_data(const uint8_t *raw, size_t size, size_t *out_size,
                                  RawSpan **spans, size_t *nspans) {
    Walk w = {0};
    w.base = raw;
    walk(&w, raw, raw + size, 0);
    *spans = NULL;
    *nspans = 0;
    *out_size = size;
    if (w.bad || !w.nspans) {
        xfree(w.out.buf);
        xfree(w.spans);
        return raw;
    }
    *spans = w.spans;
    *nspans = w.nspans;
    *out_size = w.out.len;
    return (const uint8_t *)w.out.buf;
}

void onnx_put_raw_data(Onnx__GraphProto *gp, const RawSpan *spans, size_t nspans) {
    for (size_t i = 0; i < nspans; i++) {
        if (spans[i].initializer >= gp->n_initializer)
            internal_error("initializer %zu of %zu in the ONNX wire walk",
                           spans[i].initializer, gp->n_initializer);
        Onnx__TensorProto *tp = gp->initializer[spans[i].initializer];
        tp->has_raw_data = 1;
        tp->raw_data.data = (uint8_t *)(uintptr_t)spans[i].data; /* never written unless borrowed */
        tp->raw_data.len = spans[i].len;
    }
}

static void fill_string(char **s) {
    if (!*s)
        *s = (char *)"";
}

void fill_absent_names(Onnx__GraphProto *gp) {
    fill_string(&gp->name);
    Onnx__ValueInfoProto **lists[3] = {gp->input, gp->output, gp->value_info};
    size_t counts[3] = {gp->n_input, gp->n_output, gp->n_value_info};
    for (int l = 0; l < 3; l++)
        for (size_t i = 0; i < counts[l]; i++)
            fill_string(&lists[l][i]->name);
    for (size_t i = 0; i < gp->n_initializer; i++)
        fill_string(&gp->initializer[i]->name);
    for (size_t i = 0; i < gp->n_node; i++) {
        Onnx__NodeProto *n = gp->node[i];
        fill_string(&n->name);
        fill_string(&n->op_type);
        fill_string(&n->domain);
        for (size_t a = 0; a < n->n_attribute; a++) {
            fill_string(&n->attribute[a]->name);
            if (n->attribute[a]->t)
                fill_string(&n->attribute[a]->t->name);
        }
    }
}
