#version 460
// softmax.comp: y = exp(x - max) / sum(exp(x - max)) along a row, or its
// logarithm when LOG is 1 (log_softmax: x - max - log(sum)).
//
// Rows as in reduce.glsl (ROWS, LEN, INNER). One workgroup of WG
// invocations per row (groups loop over ROWS beyond the dispatch's count);
// invocations stride over the row and reduce through shared memory: the
// maximum, then the sum of exponentials, then the write.
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
        const uint base = kiln_row_base(row);
        float m = -1.0 / 0.0;
        for (uint c = l; c < LEN; c += WG)
            m = max(m, args.x.v[base + c * INNER]);
        m = kiln_reduce_max(m);
        float s = 0.0;
        for (uint c = l; c < LEN; c += WG)
            s += exp(args.x.v[base + c * INNER] - m);
        s = kiln_reduce_sum(s);
#if LOG
        const float shift = m + log(s);
        for (uint c = l; c < LEN; c += WG)
            args.y.v[base + c * INNER] = args.x.v[base + c * INNER] - shift;
#else
        const float inv = 1.0 / s;
        for (uint c = l; c < LEN; c += WG)
            args.y.v[base + c * INNER] = exp(args.x.v[base + c * INNER] - m) * inv;
#endif
    }
}
