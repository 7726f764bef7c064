#version 460
// eltwise.comp: out[i] = EXPR over up to 4 broadcast operands a, b, c, d.
//
// Defines: WG (invocations per group), COUNT (elements of out), RANK and
// SHAPE (the output's shape after merging dimensions every operand walks
// contiguously), N_IN, and per input k: IN<k>_MODE 0 (read at i), 1 (a
// scalar: element 0) or 2 (strided: IN<k>_STRIDES per dimension, 0 where
// broadcast). Invocations stride over the elements, so any COUNT runs with
// at most 65535 groups.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 out_;
    F32R in0;
    F32R in1;
    F32R in2;
    F32R in3;
} args;

#ifndef IN0_MODE
#define IN0_MODE 0
#endif
#ifndef IN1_MODE
#define IN1_MODE 0
#endif
#ifndef IN2_MODE
#define IN2_MODE 0
#endif
#ifndef IN3_MODE
#define IN3_MODE 0
#endif

#define STRIDED (N_IN > 0 && IN0_MODE == 2) || (N_IN > 1 && IN1_MODE == 2) || \
                (N_IN > 2 && IN2_MODE == 2) || (N_IN > 3 && IN3_MODE == 2)

const uint SHAPE_[RANK] = uint[RANK](SHAPE);
#if IN0_MODE == 2
const uint S0[RANK] = uint[RANK](IN0_STRIDES);
#endif
#if IN1_MODE == 2
const uint S1[RANK] = uint[RANK](IN1_STRIDES);
#endif
#if IN2_MODE == 2
const uint S2[RANK] = uint[RANK](IN2_STRIDES);
#endif
#if IN3_MODE == 2
const uint S3[RANK] = uint[RANK](IN3_STRIDES);
#endif

void main() {
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint i = gl_GlobalInvocationID.x; i < COUNT;) {
        uint o0 = 0, o1 = 0, o2 = 0, o3 = 0;
#if STRIDED
        uint rem = i;
        for (int d = RANK - 1; d >= 0; --d) {
            uint c = rem % SHAPE_[d];
            rem /= SHAPE_[d];
#if IN0_MODE == 2
            o0 += c * S0[d];
#endif
#if IN1_MODE == 2
            o1 += c * S1[d];
#endif
#if IN2_MODE == 2
            o2 += c * S2[d];
#endif
#if IN3_MODE == 2
            o3 += c * S3[d];
#endif
        }
#endif
        float a = 0.0, b = 0.0, c = 0.0, d = 0.0;
#if N_IN > 0
        a = args.in0.v[IN0_MODE == 0 ? i : IN0_MODE == 1 ? 0 : o0];
#endif
#if N_IN > 1
        b = args.in1.v[IN1_MODE == 0 ? i : IN1_MODE == 1 ? 0 : o1];
#endif
#if N_IN > 2
        c = args.in2.v[IN2_MODE == 0 ? i : IN2_MODE == 1 ? 0 : o2];
#endif
#if N_IN > 3
        d = args.in3.v[IN3_MODE == 0 ? i : IN3_MODE == 1 ? 0 : o3];
#endif
        args.out_.v[i] = EXPR;
        if (COUNT - i <= step)
            break; // the next index would pass COUNT (or wrap around)
        i += step;
    }
}
