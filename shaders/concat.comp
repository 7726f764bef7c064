#version 460
// concat.comp: the pieces of a concatenation that their producers did not
// write in place (graph inputs, weights, a piece given twice or to several
// concats, regions that are not one block of the output), copied by one
// dispatch rather than one a piece. The output is OUTER rows of OW units;
// piece k is OUTER rows of W<k> units, landing at unit OFF<k> of each
// output row. A unit is one element of the dtype, or with UNIT4 16 bytes
// (every width and offset in bytes a multiple of 16: uvec4 copies). Piece
// k takes workgroups GB<k> to GB<k> + NG<k> - 1, whose invocations stride
// over its OUTER * W<k> units.
//
// Defines: P (pieces, 1 to 14), OUTER, OW, W0.., OFF0.., GB0.., NG0..,
// TOUT and T0.. (buffer types: U4 and U4R with UNIT4, else the dtype's).
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Args {
    TOUT out_;
#if P > 0
    T0 in0;
#endif
#if P > 1
    T1 in1;
#endif
#if P > 2
    T2 in2;
#endif
#if P > 3
    T3 in3;
#endif
#if P > 4
    T4 in4;
#endif
#if P > 5
    T5 in5;
#endif
#if P > 6
    T6 in6;
#endif
#if P > 7
    T7 in7;
#endif
#if P > 8
    T8 in8;
#endif
#if P > 9
    T9 in9;
#endif
#if P > 10
    T10 in10;
#endif
#if P > 11
    T11 in11;
#endif
#if P > 12
    T12 in12;
#endif
#if P > 13
    T13 in13;
#endif
} args;

#define COPY(k)                                                                      \
    if (g >= GB##k && g < GB##k + NG##k)                                             \
        for (uint u = (g - GB##k) * 256 + l; u < OUTER * W##k; u += NG##k * 256)      \
            args.out_.v[u / W##k * OW + OFF##k + u % W##k] = args.in##k.v[u];

void main() {
    const uint g = gl_WorkGroupID.x, l = gl_LocalInvocationID.x;
#if P > 0
    COPY(0)
#endif
#if P > 1
    COPY(1)
#endif
#if P > 2
    COPY(2)
#endif
#if P > 3
    COPY(3)
#endif
#if P > 4
    COPY(4)
#endif
#if P > 5
    COPY(5)
#endif
#if P > 6
    COPY(6)
#endif
#if P > 7
    COPY(7)
#endif
#if P > 8
    COPY(8)
#endif
#if P > 9
    COPY(9)
#endif
#if P > 10
    COPY(10)
#endif
#if P > 11
    COPY(11)
#endif
#if P > 12
    COPY(12)
#endif
#if P > 13
    COPY(13)
#endif
}
