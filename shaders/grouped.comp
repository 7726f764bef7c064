#version 460
// grouped.comp: the matmul of a mixture-of-experts layer. Row m of C is row
// m of A [M, K] times B[e] [K, N], plus bias[e] [N] (HAS_BIAS), where
// e = IDX[m] picks the row's expert among E. A row whose index lies outside
// [0, E) (a token routed nowhere: -1) gets zeros.
//
// A workgroup of NCOL x KSPLIT invocations computes NCOL columns of RB rows;
// invocation (column c, split s) sums over k = s, s + KSPLIT, ... reading
// NCOL consecutive elements of each row's expert matrix (coalesced; rows
// that share an expert share the cache lines), and the KSPLIT partial sums
// meet in shared memory, as in matvec.comp.
#include "common.glsl"

layout(local_size_x = NCOL, local_size_y = KSPLIT) in;

#ifndef TIDX
#define TIDX I32R
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif

layout(push_constant) uniform Args {
    F32 c;
    F32R a;
    F32R b;
    TIDX idx;
    F32R bias;
} args;

const uint TILES_N = (N + NCOL - 1) / NCOL;
const uint BLOCKS_M = (M + RB - 1) / RB;

shared float part[KSPLIT][RB][NCOL];

void main() {
    const uint lc = gl_LocalInvocationID.x, s = gl_LocalInvocationID.y;
    for (uint blk = gl_WorkGroupID.y; blk < BLOCKS_M; blk += gl_NumWorkGroups.y) {
        int e[RB];
        for (uint r = 0; r < RB; ++r) {
            const uint m = blk * RB + r;
            e[r] = m < M ? kiln_slot(args.idx.v[m], E) : -1;
        }
        for (uint tile = gl_WorkGroupID.x; tile < TILES_N; tile += gl_NumWorkGroups.x) {
            const uint n = tile * NCOL + lc;
            float acc[RB];
            for (uint r = 0; r < RB; ++r)
                acc[r] = 0.0;
            if (n < N) {
                for (uint k = s; k < K; k += KSPLIT)
                    for (uint r = 0; r < RB; ++r)
                        if (e[r] >= 0)
                            acc[r] = fma(args.a.v[(blk * RB + r) * K + k],
                                         args.b.v[(uint(e[r]) * K + k) * N + n], acc[r]);
            }
            for (uint r = 0; r < RB; ++r)
                part[s][r][lc] = acc[r];
            barrier();
            if (s == 0 && n < N) {
                for (uint r = 0; r < RB; ++r) {
                    const uint m = blk * RB + r;
                    if (m >= M)
                        break;
                    float v = 0.0;
                    for (uint t = 0; t < KSPLIT; ++t)
                        v += part[t][r][lc];
#if HAS_BIAS
                    if (e[r] >= 0)
                        v += args.bias.v[uint(e[r]) * N + n];
#endif
                    args.c.v[m * N + n] = v;
                }
            }
            barrier();
        }
    }
}
