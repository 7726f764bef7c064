#version 460
// index.comp: copies whose source element depends on coordinates or on
// index tensors. One invocation per output element (striding past 65535
// groups). MODE:
//   MODE_GATHER          y[o, p, i] = x[o, idx[p], i]: OUTER, NIDX, AXIS_LEN, INNER
//   MODE_GATHER_ND       y[t, e] = x[row(t), e], x as [rows, REST]: row(t) is
//                        tuple t's TUPLE indices (idx[t, j], into TDIMS) in
//                        row-major order plus its batch's first row (BATCH_ROWS
//                        rows and BATCH_TUPLES tuples a batch); 0 where an index
//                        is outside its dimension
//   MODE_GATHER_ELEMENTS y[c] = x[c with c[AXIS] = idx[c]]: RANK, SHAPE (of y and
//                        idx), XSTRIDES, AXIS, AXIS_LEN
//   MODE_ONE_HOT         y[o, d, i] = idx[o, i] == d ? ON : OFF: DEPTH, INNER
//   MODE_TRILU           y[.., r, c] = x if c - r >= K (UPPER) or <= K (lower), else 0:
//                        ROWS_, COLS_
//   MODE_PAD             y[c] = x[c - BEGIN] inside, else by PAD_MODE: 0 constant
//                        (VALUE), 1 reflect, 2 edge: RANK, SHAPE (of y), XSHAPE,
//                        XSTRIDES, BEGIN
// Indices are i32 or i64 (TIDX); negative ones count from the end; an index
// outside the axis reads 0 (gather) rather than outside the tensor, and with
// INDEX_CHECK (--guard) is reported (KILN_REPORT_INDEX).
// TDATA / TDATA_R are the data's buffer types; CONV(x) converts a float to
// the data's element type.
#include "common.glsl"

layout(local_size_x = WG) in;

#define MODE_GATHER 0
#define MODE_GATHER_ELEMENTS 1
#define MODE_ONE_HOT 2
#define MODE_TRILU 3
#define MODE_PAD 4
#define MODE_GATHER_ND 5

#ifndef TIDX
#define TIDX I32R
#endif

layout(push_constant) uniform Args {
    TDATA y;
    TDATA_R x;
    TIDX idx;
#ifdef INDEX_CHECK
    U32 report; // --guard: KILN_REPORT_INDEX
#endif
    KILN_DIMS
} args;

// y[at] = cond ? val : other, as a branch: a select between 8-bit values (bool
// and uint8 data) would need the Int8 capability, which 8-bit storage alone
// does not give (it allows loads, stores and conversions).
#define PUT(at, cond, val, other) if (cond) args.y.v[at] = val; else args.y.v[at] = other

#if MODE == MODE_GATHER_ELEMENTS || MODE == MODE_PAD
const uint SHAPE_[RANK] = uint[RANK](SHAPE);
const uint XSTR[RANK] = uint[RANK](XSTRIDES);
#endif
#if MODE == MODE_GATHER_ND
const uint TDIMS_[TUPLE] = uint[TUPLE](TDIMS);
#endif
#if MODE == MODE_PAD
const uint XSHAPE_[RANK] = uint[RANK](XSHAPE);
const int BEGIN_[RANK] = int[RANK](BEGIN);
#endif

// The index at position p, made non-negative against len; -1 when outside
// (reported under --guard).
int index_at(uint p, uint len) {
    const int i = kiln_index(args.idx.v[p], len);
#if defined(INDEX_CHECK) && (MODE == MODE_GATHER || MODE == MODE_GATHER_ND || \
                             MODE == MODE_GATHER_ELEMENTS)
    if (i < 0) {
        KILN_REPORT_INDEX(args.report, args.idx.v[p], len, p)
    }
#endif
    return i;
}

#if MODE == MODE_PAD
// Maps a padded coordinate to the source's, or -1 for the constant.
int pad_source(int c, int n) {
    if (c >= 0 && c < n)
        return c;
#if PAD_MODE == 0
    return -1;
#elif PAD_MODE == 2
    return c < 0 ? 0 : n - 1;
#else
    if (n == 1)
        return 0;
    // Reflection is symmetric about 0, and % is only defined (in GLSL) for
    // non-negative operands.
    uint period = uint(2 * (n - 1));
    uint m = uint(abs(c)) % period;
    return int(m < uint(n) ? m : period - m);
#endif
}
#endif

void main() {
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint o = gl_GlobalInvocationID.x; o < COUNT;) {
#if MODE == MODE_GATHER
        uint inner = o % INNER, p = (o / INNER) % NIDX, outer = o / (INNER * NIDX);
        int i = index_at(p, AXIS_LEN);
        PUT(o, i >= 0, args.x.v[(outer * AXIS_LEN + uint(i)) * INNER + inner], CONV(0.0));
#elif MODE == MODE_GATHER_ND
        const uint t = o / REST, e = o % REST;
        uint row = 0;
        bool ok = true;
        for (uint j = 0; j < TUPLE; ++j) {
            const int i = index_at(t * TUPLE + j, TDIMS_[j]);
            ok = ok && i >= 0;
            row = row * TDIMS_[j] + uint(max(i, 0));
        }
        row += t / BATCH_TUPLES * BATCH_ROWS;
        PUT(o, ok, args.x.v[row * REST + e], CONV(0.0));
#elif MODE == MODE_GATHER_ELEMENTS
        uint rem = o, src = 0;
        bool ok = true;
        for (int d = RANK - 1; d >= 0; --d) {
            uint c = rem % SHAPE_[d];
            rem /= SHAPE_[d];
            if (d == AXIS) {
                int i = index_at(o, AXIS_LEN);
                ok = i >= 0;
                c = uint(max(i, 0));
            }
            src += c * XSTR[d];
        }
        PUT(o, ok, args.x.v[src], CONV(0.0));
#elif MODE == MODE_ONE_HOT
        uint inner = o % INNER, d = (o / INNER) % DEPTH, outer = o / (INNER * DEPTH);
        int i = index_at(outer * INNER + inner, DEPTH);
        args.y.v[o] = CONV(i == int(d) ? ON : OFF);
#elif MODE == MODE_TRILU
        int c = int(o % COLS_), r = int((o / COLS_) % ROWS_);
#if UPPER
        bool keep = c - r >= K;
#else
        bool keep = c - r <= K;
#endif
        PUT(o, keep, args.x.v[o], CONV(0.0));
#elif MODE == MODE_PAD
        uint rem = o, src = 0;
        bool inside = true;
        for (int d = RANK - 1; d >= 0; --d) {
            int c = int(rem % SHAPE_[d]) - BEGIN_[d];
            rem /= SHAPE_[d];
            int s = pad_source(c, int(XSHAPE_[d]));
            inside = inside && s >= 0;
            src += uint(max(s, 0)) * XSTR[d];
        }
        PUT(o, inside, args.x.v[src], CONV(VALUE));
#endif
        if (COUNT - o <= step)
            break;
        o += step;
    }
}
