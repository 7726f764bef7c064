#version 460
// matvec.comp: C = A x B when A has few rows (M <= 16): decode steps, small
// batches. matmul.comp's tiles would leave most of a GPU idle there.
//
// A workgroup of NCOL x KSPLIT invocations computes NCOL columns of C for all
// M rows. Invocation (column c, split s) sums over k = s, s + KSPLIT, ...:
// each step reads NCOL consecutive elements of a row of B (coalesced) and one
// element of A per row that the whole group shares; the KSPLIT partial sums
// meet in shared memory. Same defines as matmul.comp (strides, batches, the
// bias and activation epilogue).
#include "common.glsl"
#include "weights.glsl"

layout(local_size_x = NCOL, local_size_y = KSPLIT) in;

layout(push_constant) uniform Args {
    F32 c;
    F32R a;
    B_BUF b;
    F32R bias;
    F32R bscale; // quantized B only (weights.glsl)
    U32R bzero;
    KILN_DIMS
} args;

#ifndef ALPHA
#define ALPHA 1.0
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef ACT
#define ACT(x) (x)
#endif

const uint BSHAPE_[BRANK] = uint[BRANK](BSHAPE);
const uint CBS[BRANK] = uint[BRANK](C_BSTRIDES);
const uint ABS[BRANK] = uint[BRANK](A_BSTRIDES);
const uint BBS[BRANK] = uint[BRANK](B_BSTRIDES);
const uint TILES_N = (N + NCOL - 1) / NCOL;
#ifndef MROWS
#define MROWS M // the rows of this run: M at most (dynamic dims)
#endif

shared float part[KSPLIT][M][NCOL];

void main() {
    const uint lc = gl_LocalInvocationID.x, s = gl_LocalInvocationID.y;
    for (uint bz = gl_WorkGroupID.z; bz < BATCH; bz += gl_NumWorkGroups.z) {
        uint rem = bz, ca = 0, cb = 0, cc = 0;
        for (int d = BRANK - 1; d >= 0; --d) {
            uint x = rem % BSHAPE_[d];
            rem /= BSHAPE_[d];
            ca += x * ABS[d];
            cb += x * BBS[d];
            cc += x * CBS[d];
        }
        for (uint tile = gl_WorkGroupID.x; tile < TILES_N; tile += gl_NumWorkGroups.x) {
            const uint n = tile * NCOL + lc;
            float acc[M];
            for (uint m = 0; m < M; ++m)
                acc[m] = 0.0;
            if (n < N) {
                for (uint k = s; k < K; k += KSPLIT) {
                    const float bv = LOAD_B(cb + k * B_SK + n * B_SN, k, n);
                    for (uint m = 0; m < M; ++m)
                        if (m < MROWS)
                            acc[m] = fma(args.a.v[ca + m * A_SM + k * A_SK], bv, acc[m]);
                }
            }
            for (uint m = 0; m < M; ++m)
                part[s][m][lc] = acc[m];
            barrier();
            if (s == 0 && n < N) {
                for (uint m = 0; m < MROWS; ++m) {
                    float v = 0.0;
                    for (uint t = 0; t < KSPLIT; ++t)
                        v += part[t][m][lc];
                    v *= ALPHA;
#if HAS_BIAS
                    v += BETA * args.bias.v[m * BIAS_SM + n * BIAS_SN];
#endif
                    args.c.v[cc + m * N + n] = ACT(v);
                }
            }
            barrier();
        }
    }
}
