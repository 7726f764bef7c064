#version 460
// eltwise.comp: out[o(i)] = STORE(EXPR) for the i-th of COUNT elements, with
// up to 6 operands a..f loaded at their own offsets.
//
// The compiler defines: WG (invocations per group); COUNT; RANK and SHAPE
// (the iteration shape, after merging dimensions every operand walks
// linearly); NOPS (the output and the inputs); STRIDES, RANK strides per
// operand, output first (0 where broadcast, permuted for a transpose, scaled
// by a slice's step, two's complement when negative) and BASES, the element
// each operand starts at; STRIDED (0 when no operand needs the offsets);
// TOUT and T0..T5 (buffer types); CT (the compute type); OUT_IDX and the
// loads A..F (each `CT(...args.inK.v[index])`, the index `i`, `0u` or
// `off[k]`); STORE(x) (conversion to the output's dtype); EXPR (over a..f).
// Invocations stride over the elements, so any COUNT runs with at most
// 65535 groups.
#include "common.glsl"

layout(local_size_x = WG) in;

#ifndef T0
#define T0 F32R
#endif
#ifndef T1
#define T1 F32R
#endif
#ifndef T2
#define T2 F32R
#endif
#ifndef T3
#define T3 F32R
#endif
#ifndef T4
#define T4 F32R
#endif
#ifndef T5
#define T5 F32R
#endif

layout(push_constant) uniform Args {
    TOUT out_;
    T0 in0;
    T1 in1;
    T2 in2;
    T3 in3;
    T4 in4;
    T5 in5;
} args;

#if STRIDED
const uint SHAPE_[RANK] = uint[RANK](SHAPE);
const uint STR[NOPS * RANK] = uint[NOPS * RANK](STRIDES);
const uint BASE[NOPS] = uint[NOPS](BASES);
#endif

void main() {
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint i = gl_GlobalInvocationID.x; i < COUNT;) {
#if STRIDED
        uint off[NOPS];
        for (int k = 0; k < NOPS; ++k)
            off[k] = BASE[k];
        uint rem = i;
        for (int d = RANK - 1; d >= 0; --d) {
            uint c = rem % SHAPE_[d];
            rem /= SHAPE_[d];
            for (int k = 0; k < NOPS; ++k)
                off[k] += c * STR[k * RANK + d];
        }
#endif
        CT a = A, b = B, c = C, d = D, e = E, f = F;
        args.out_.v[OUT_IDX] = STORE(EXPR);
        if (COUNT - i <= step)
            break; // the next index would pass COUNT (or wrap around)
        i += step;
    }
}
