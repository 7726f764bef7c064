#version 460
// matmul.comp: C[b] = A[b] x B[b], tiled through shared memory.
//
// Defines: M, N, K; element (m, k) of A is at A_SM*m + A_SK*k and (k, n) of
// B at B_SK*k + B_SN*n within a batch (so transposed operands cost nothing);
// BATCH batches over BRANK dimensions BSHAPE with per-operand element
// strides C_BSTRIDES, A_BSTRIDES, B_BSTRIDES (0: broadcast). A workgroup of
// (BM/TM) x (BN/TN) invocations computes a BM x BN tile of C, each
// invocation TM x TN elements spread at a stride of the group's width so that
// shared-memory reads and global writes are contiguous across invocations.
// Groups loop over tiles and batches beyond the dispatch's counts.
// Epilogue: C = ACT(ALPHA * acc + BETA * bias[m * BIAS_SM + n * BIAS_SN])
// where HAS_BIAS (gemm); ACT(x) is an activation expression.
#include "common.glsl"
#include "weights.glsl"

#define NTX (BN / TN)
#define NTY (BM / TM)
#define NT (NTX * NTY)
layout(local_size_x = NTX, local_size_y = NTY) in;

#if A_F16
#define A_BUF F16R
#else
#define A_BUF F32R
#endif
#if C_F16
#define C_BUF F16
#define C_T float16_t
#else
#define C_BUF F32
#define C_T float
#endif

layout(push_constant) uniform Args {
    C_BUF c;
    A_BUF a;
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
#define TILES_M ((uint(M) + BM - 1) / BM) // M may follow the dynamic dims
#define TILES_N ((N + BN - 1) / BN)

shared float As[BK][BM];
shared float Bs[BK][BN];

void main() {
    const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    const uint tid = ty * NTX + tx;
    for (uint bz = gl_WorkGroupID.z; bz < BATCH; bz += gl_NumWorkGroups.z) {
        uint rem = bz, ca = 0, cb = 0, cc = 0;
        for (int d = BRANK - 1; d >= 0; --d) {
            uint x = rem % BSHAPE_[d];
            rem /= BSHAPE_[d];
            ca += x * ABS[d];
            cb += x * BBS[d];
            cc += x * CBS[d];
        }
        for (uint tm = gl_WorkGroupID.y; tm < TILES_M; tm += gl_NumWorkGroups.y) {
            for (uint tn = gl_WorkGroupID.x; tn < TILES_N; tn += gl_NumWorkGroups.x) {
                const uint m0 = tm * BM, n0 = tn * BN;
                float acc[TM][TN];
                for (uint i = 0; i < TM; ++i)
                    for (uint j = 0; j < TN; ++j)
                        acc[i][j] = 0.0;
                for (uint k0 = 0; k0 < K; k0 += BK) {
                    for (uint e = tid; e < BM * BK; e += NT) {
                        uint r = e / BK, kk = e % BK;
                        uint gm = m0 + r, gk = k0 + kk;
                        As[kk][r] = (gm < M && gk < K) ? float(args.a.v[ca + gm * A_SM + gk * A_SK])
                                                       : 0.0;
                    }
                    for (uint e = tid; e < BK * BN; e += NT) {
                        uint kk = e / BN, cn = e % BN;
                        uint gk = k0 + kk, gn = n0 + cn;
                        Bs[kk][cn] = (gk < K && gn < N) ? LOAD_B(cb + gk * B_SK + gn * B_SN, gk, gn)
                                                        : 0.0;
                    }
                    barrier();
                    for (uint kk = 0; kk < BK; ++kk) {
                        float av[TM], bv[TN];
                        for (uint i = 0; i < TM; ++i)
                            av[i] = As[kk][ty + i * NTY];
                        for (uint j = 0; j < TN; ++j)
                            bv[j] = Bs[kk][tx + j * NTX];
                        for (uint i = 0; i < TM; ++i)
                            for (uint j = 0; j < TN; ++j)
                                acc[i][j] = fma(av[i], bv[j], acc[i][j]);
                    }
                    barrier();
                }
                for (uint i = 0; i < TM; ++i) {
                    uint gm = m0 + ty + i * NTY;
                    for (uint j = 0; j < TN; ++j) {
                        uint gn = n0 + tx + j * NTX;
                        if (gm < M && gn < N) {
                            float v = ALPHA * acc[i][j];
#if HAS_BIAS
                            v += BETA * args.bias.v[gm * BIAS_SM + gn * BIAS_SN];
#endif
                            args.c.v[cc + gm * N + gn] = C_T(ACT(v));
                        }
                    }
                }
            }
        }
    }
}
