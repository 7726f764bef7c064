#version 460
// layer_norm.comp: y = (x - mean) / sqrt(var + EPS) * gamma + beta per row.
//
// One workgroup of WG invocations per row, as in softmax.comp. The variance
// is computed from the centered values (two passes over the row), not as
// E[x^2] - E[x]^2, which cancels badly for rows with a large mean.
// HAS_GAMMA and HAS_BETA say whether those inputs are present.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 y;
    F32R x;
    F32R gamma;
    F32R beta;
} args;

#include "reduce.glsl"

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint row = gl_WorkGroupID.x; row < ROWS; row += gl_NumWorkGroups.x) {
        const uint base = row * COLS;
        float s = 0.0;
        for (uint c = l; c < COLS; c += WG)
            s += args.x.v[base + c];
        const float mean = kiln_reduce_sum(s) / float(COLS);
        float q = 0.0;
        for (uint c = l; c < COLS; c += WG) {
            float d = args.x.v[base + c] - mean;
            q += d * d;
        }
        const float rstd = inversesqrt(kiln_reduce_sum(q) / float(COLS) + EPS);
        for (uint c = l; c < COLS; c += WG) {
            float v = (args.x.v[base + c] - mean) * rstd;
#if HAS_GAMMA
            v *= args.gamma.v[c];
#endif
#if HAS_BETA
            v += args.beta.v[c];
#endif
            args.y.v[base + c] = v;
        }
    }
}
