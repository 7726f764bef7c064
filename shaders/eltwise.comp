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
// SHAPE_DYN: one axis of SHAPE (and COUNT) follows the dynamic dims, an
// inner axis of a tensor stored at its largest shape: every operand is then
// found through STRIDES.
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
    KILN_DIMS
} args;

#ifndef SHAPE_DYN
#define SHAPE_DYN 0
#endif
#if STRIDED
#if !SHAPE_DYN
const uint SHAPE_[RANK] = uint[RANK](SHAPE);
#endif
const uint STR[NOPS * RANK] = uint[NOPS * RANK](STRIDES);
#endif

#if VEC4
// Every operand contiguous f32 and COUNT a multiple of 4: each invocation
// moves vec4s (TOUT and T0.. are the V4 types) and evaluates EXPR per lane.
void main() {
    const uint step = gl_NumWorkGroups.x * WG, n4 = COUNT / 4;
    for (uint q = gl_GlobalInvocationID.x; q < n4;) {
        vec4 a4 = vec4(0), b4 = vec4(0), c4 = vec4(0), d4 = vec4(0), e4 = vec4(0), f4 = vec4(0);
#if NOPS > 0 + 1
        a4 = args.in0.v[q];
#endif
#if NOPS > 1 + 1
        b4 = args.in1.v[q];
#endif
#if NOPS > 2 + 1
        c4 = args.in2.v[q];
#endif
#if NOPS > 3 + 1
        d4 = args.in3.v[q];
#endif
#if NOPS > 4 + 1
        e4 = args.in4.v[q];
#endif
#if NOPS > 5 + 1
        f4 = args.in5.v[q];
#endif
        vec4 r;
        for (int l = 0; l < 4; ++l) {
            float a = a4[l], b = b4[l], c = c4[l], d = d4[l], e = e4[l], f = f4[l];
            r[l] = EXPR;
        }
        args.out_.v[q] = r;
        if (n4 - q <= step)
            break;
        q += step;
    }
}
#else
void main() {
    const uint step = gl_NumWorkGroups.x * WG;
#if STRIDED
    const uint BASE[NOPS] = uint[NOPS](BASES); // may follow the dynamic dims
#if SHAPE_DYN // an inner axis's size follows them
    const uint SHAPE_[RANK] = uint[RANK](SHAPE);
#endif
#endif
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
#endif
