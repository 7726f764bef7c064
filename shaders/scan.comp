#version 460
// scan.comp: the selective scan of Mamba. For each batch b and channel d,
// over positions t in order, with state h[n] (n < NS, at most 256):
//   dt   = delta[b, t, d] (softplus of it when SOFTPLUS)
//   h[n] = exp(dt * A[d, n]) * h[n] + dt * Bm[b, t, n] * u[b, t, d]
//   y    = sum_n C[b, t, n] * h[n] + Dskip[d] * u[b, t, d]   (HAS_D)
//   y   *= silu(z[b, t, d])                                  (HAS_Z)
// One workgroup per (b, d), one invocation per state element; the sum over
// n is a shared-memory reduction per position. Shapes: u, delta, z, y
// [BATCH, L, DIM]; A [DIM, NS]; Bm, C [BATCH, L, NS]; Dskip [DIM].
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 y;
    F32R u;
    F32R delta;
    F32R A;
    F32R Bm;
    F32R C;
    F32R Dskip;
    F32R z;
    KILN_DIMS
} args;

#include "reduce.glsl"

void main() {
    const uint n = gl_LocalInvocationID.x;
    for (uint g = gl_WorkGroupID.x; g < BATCH * DIM; g += gl_NumWorkGroups.x) {
        const uint b = g / DIM, d = g % DIM;
        const float a = n < NS ? args.A.v[d * NS + n] : 0.0;
        float h = 0.0;
        for (uint t = 0; t < L; ++t) {
            const uint i = (b * L + t) * DIM + d;
            float dt = args.delta.v[i];
#if SOFTPLUS
            dt = kiln_softplus(dt);
#endif
            const float uv = args.u.v[i];
            float c = 0.0;
            if (n < NS) {
                const uint j = (b * L + t) * NS + n;
                h = exp(dt * a) * h + dt * args.Bm.v[j] * uv;
                c = args.C.v[j] * h;
            }
            float y = kiln_reduce_sum(c);
            if (n == 0) {
#if HAS_D
                y += args.Dskip.v[d] * uv;
#endif
#if HAS_Z
                const float zv = args.z.v[i];
                y *= zv * kiln_sigmoid(zv);
#endif
                args.y.v[i] = y;
            }
        }
    }
}
