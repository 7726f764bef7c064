#version 460
// splitk.comp: a convolution's product split along K (matmul.comp or
// coopmat.comp with SPLITK and without SPLIT_LAST; other products add
// their chunks up in their own last workgroups, product.glsl's
// split_last): the sum of its SPLITK partial products, [SPLITK, M, N] f32
// in p, and then the product's epilogue (product.glsl: bias, residual,
// activation, QKV split), one invocation per element of C, WG to a
// workgroup. Same defines as matmul.comp for the product (one batch) and
// its epilogue; N_RUN (a convolution over a dynamic batch of images): the
// run's columns, the first N_RUN of each row of N.
#include "common.glsl"

layout(local_size_x = WG) in;

#if C_F16
#define C_BUF F16
#define C_T float16_t
#else
#define C_BUF F32
#define C_T float
#endif

// The slots of matmul.comp's arguments, p in A's and none in B's.
layout(push_constant) uniform Args {
    C_BUF c;
    F32R p;
    F32R b;
    F32R bias;
    F32R bscale;
    U32R bzero;
    KILN_SPLIT_OUTPUTS(C_BUF) // QKV split (common.glsl)
    KILN_RES_ARG
    KILN_DIMS
} args;

#include "product.glsl"

#ifdef N_RUN // a dynamic batch of images: the run's columns of each row
#define NR uint(N_RUN)
#else
#define NR N
#endif

void main() {
    const uint count = M * NR;
    for (uint e = gl_GlobalInvocationID.x; e < count; e += gl_NumWorkGroups.x * WG) {
        const uint m = e / NR, n = e % NR, at = m * N + n;
        float acc = 0.0;
        for (uint s = 0; s < SPLITK; ++s)
            acc += args.p.v[s * (M * N) + at];
        store_c(0, m, n, acc);
    }
}
