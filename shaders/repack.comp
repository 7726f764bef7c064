#version 460
// repack.comp: a reshape that merges two adjacent dynamic axes or splits
// their product (compiler/lower_layout.c lower_repack). Tensors are stored
// at their largest shape, a run's elements at their place in it: along
// [O, S1, S2, R] dynamic in S1 and S2 (extents E1 and E2, read from the
// run's dims) they leave holes, while [O, S1 * S2, R], dynamic in the
// merged axis (the derived dim E1 * E2), holds them as a prefix of it.
// PACK 1: y [O, S1 * S2, R] from x [O, S1, S2, R], y[o, k, r] =
// x[o, k / E2, k % E2, r] for k < E1 * E2; PACK 0 the reverse. Elements
// are moved whole (ELEM and ELEM_R, its read-only type: U32, U2 for 8
// bytes, F16, U8); the rest of y is
// left as it was (don't-care).
#include "common.glsl"

layout(local_size_x = 256) in;

layout(push_constant) uniform Args {
    ELEM y;
    ELEM_R x;
    KILN_DIMS
} args;

const uint COUNT = O * S1 * S2 * R;

void main() {
    const uint e1 = uint(E1), e2 = uint(E2);
    for (uint i = gl_GlobalInvocationID.x; i < COUNT; i += gl_NumWorkGroups.x * 256) {
        const uint r = i % R, mid = i / R % (S1 * S2), o = i / (R * S1 * S2);
#if PACK // i in y: mid the merged axis' index
        if (mid < e1 * e2)
            args.y.v[i] = args.x.v[((o * S1 + mid / e2) * S2 + mid % e2) * R + r];
#else // i in y: mid = i1 * S2 + i2
        const uint i1 = mid / S2, i2 = mid % S2;
        if (i1 < e1 && i2 < e2)
            args.y.v[i] = args.x.v[(o * S1 * S2 + i1 * e2 + i2) * R + r];
#endif
    }
}
