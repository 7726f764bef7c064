#version 460
// scatter.comp: y[c with c[AXIS] = idx[c]] (op)= updates[c] for every element
// c of the updates (RANK, SHAPE of idx and updates, YSTRIDES of y). y was
// first filled with the data by a copy dispatch. REDUCE: 0 replace (the last
// writer wins; duplicates are undefined, as in ONNX), 1 add, 2 mul, 3 max,
// 4 min. The reductions are atomic: a compare-and-swap loop on the f32's
// bits, so duplicate indices combine correctly on any device.
#include "common.glsl"

layout(local_size_x = WG) in;

#ifndef TIDX
#define TIDX I32R
#endif
// Where element o's index is: its own place (scatter_elements), or, for
// gather_grad, its position among the indices (o / inner % nidx).
#ifndef IDX_AT
#define IDX_AT(o) (o)
#endif

layout(push_constant) uniform Args {
    U32 y;
    TIDX idx;
    F32R upd;
#ifdef INDEX_CHECK
    U32 report; // --guard: KILN_REPORT_INDEX
#endif
    KILN_DIMS
} args;

const uint SHAPE_[RANK] = uint[RANK](SHAPE);
const uint YSTR[RANK] = uint[RANK](YSTRIDES);

float combine(float old, float v) {
#if REDUCE == 1
    return old + v;
#elif REDUCE == 2
    return old * v;
#elif REDUCE == 3
    return max(old, v);
#else
    return min(old, v);
#endif
}

void main() {
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint o = gl_GlobalInvocationID.x; o < COUNT;) {
        uint rem = o, dst = 0;
        bool ok = true;
        for (int d = RANK - 1; d >= 0; --d) {
            uint c = rem % SHAPE_[d];
            rem /= SHAPE_[d];
            if (d == AXIS) {
                const int i = kiln_index(args.idx.v[IDX_AT(o)], AXIS_LEN);
                ok = i >= 0;
                if (!ok) {
                    KILN_REPORT_INDEX(args.report, args.idx.v[IDX_AT(o)], AXIS_LEN, IDX_AT(o))
                }
                c = uint(max(i, 0));
            }
            dst += c * YSTR[d];
        }
        if (ok) {
            float v = args.upd.v[o];
#if REDUCE == 0
            args.y.v[dst] = floatBitsToUint(v);
#else
            uint old = args.y.v[dst], seen;
            do {
                seen = old;
                old = atomicCompSwap(args.y.v[dst], seen,
                                     floatBitsToUint(combine(uintBitsToFloat(seen), v)));
            } while (old != seen);
#endif
        }
        if (COUNT - o <= step)
            break;
        o += step;
    }
}
