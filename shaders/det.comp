#version 460
// det.comp: the determinant of each M x M matrix of x, one invocation per
// matrix: Gaussian elimination with partial pivoting (the row of the
// largest magnitude in each column), on the matrix's copy in work; the
// determinant is the product of the pivots, its sign flipped by each row
// swap, 0 at a zero column.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 y;
    F32R x;
    F32 work;
    KILN_DIMS
} args;

void main() {
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint m = gl_GlobalInvocationID.x; m < COUNT;) {
        const uint base = m * uint(M * M);
        for (uint e = 0u; e < uint(M * M); ++e)
            args.work.v[base + e] = args.x.v[base + e];
        float det = 1.0;
        for (uint k = 0u; k < uint(M); ++k) {
            uint piv = k;
            float best = abs(args.work.v[base + k * uint(M) + k]);
            for (uint i = k + 1u; i < uint(M); ++i) {
                float v = abs(args.work.v[base + i * uint(M) + k]);
                if (v > best) {
                    best = v;
                    piv = i;
                }
            }
            if (best == 0.0) {
                det = 0.0;
                break;
            }
            if (piv != k) {
                for (uint j = k; j < uint(M); ++j) {
                    float t = args.work.v[base + k * uint(M) + j];
                    args.work.v[base + k * uint(M) + j] = args.work.v[base + piv * uint(M) + j];
                    args.work.v[base + piv * uint(M) + j] = t;
                }
                det = -det;
            }
            const float pivot = args.work.v[base + k * uint(M) + k];
            det *= pivot;
            for (uint i = k + 1u; i < uint(M); ++i) {
                const float f = args.work.v[base + i * uint(M) + k] / pivot;
                for (uint j = k + 1u; j < uint(M); ++j)
                    args.work.v[base + i * uint(M) + j] -= f * args.work.v[base + k * uint(M) + j];
            }
        }
        args.y.v[m] = det;
        if (COUNT - m <= step)
            break;
        m += step;
    }
}
