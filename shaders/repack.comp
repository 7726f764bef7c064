#version 460
// repack.comp: a reshape that merges two adjacent dynamic axes or splits
// their product (compiler/lower_layout.c lower_repack); the first may be a
// fixed one (E1 then its size). Tensors are stored at their largest shape,
// a run's elements at their place in it: along [O, S1, S2, R] dynamic in
// S1 and S2 (extents E1 and E2, read from the run's dims) they leave holes, while [O, S1 * S2, R], dynamic in the
// merged axis (the derived dim E1 * E2), holds them as a prefix of it.
// Each invocation takes an element j of the merged layout, k its index
// along the merged axis, and where k < E1 * E2 moves it from (PACK 1) or
// to (PACK 0) [o, k / E2, k % E2, r] of the other. With O 1 the merged
// layout's run is a prefix, E1 * E2 * R elements, and only those are
// visited (the workgroups follow it); else the whole largest shape is.
// Elements are moved whole (ELEM and ELEM_R, its read-only type: U32, U2
// for 8 bytes, F16, U8); the rest of the output is left as it was
// (don't-care).
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
    const uint limit = O == 1 ? min(e1 * e2 * R, COUNT) : COUNT;
    for (uint j = gl_GlobalInvocationID.x; j < limit; j += gl_NumWorkGroups.x * 256) {
        const uint r = j % R, k = j / R % (S1 * S2), o = j / (R * S1 * S2);
        if (k >= e1 * e2)
            continue;
        const uint s = ((o * S1 + k / e2) * S2 + k % e2) * R + r;
#if PACK
        args.y.v[j] = args.x.v[s];
#else
        args.y.v[s] = args.x.v[j];
#endif
    }
}
