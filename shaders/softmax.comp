#version 460
// softmax.comp: y = exp(x - max) / sum(exp(x - max)) over rows of COLS.
//
// One workgroup of WG invocations per row (groups loop over ROWS beyond the
// dispatch's count); invocations stride over the row and reduce through
// shared memory: max, then the sum of exponentials, then the write.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 y;
    F32R x;
} args;

#include "reduce.glsl"

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint row = gl_WorkGroupID.x; row < ROWS; row += gl_NumWorkGroups.x) {
        const uint base = row * COLS;
        float m = -1.0 / 0.0;
        for (uint c = l; c < COLS; c += WG)
            m = max(m, args.x.v[base + c]);
        m = kiln_reduce_max(m);
        float s = 0.0;
        for (uint c = l; c < COLS; c += WG)
            s += exp(args.x.v[base + c] - m);
        s = kiln_reduce_sum(s);
        const float inv = 1.0 / s;
        for (uint c = l; c < COLS; c += WG)
            args.y.v[base + c] = exp(args.x.v[base + c] - m) * inv;
    }
}
