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
// where HAS_BIAS (gemm); ACT(x) is an activation expression (product.glsl).
//
// CONV: B is the input of a 2-D convolution (NCHW, one group) read as its
// im2col matrix without one: element (k, p) is x[ci, oh * CSH - CPH + kh *
// CDH, ow * CSW - CPW + kw * CDW] (0 outside), where k = (ci * CKH + kh) *
// CKW + kw and p = oh * COW + ow, in an input of CIH x CIW from the batch's
// offset; A is the weights [OC, C * CKH * CKW]. HAS_RES adds res[cc + m * N
// + n] before the activation (a skip connection; product.glsl).
//
// Split K (SPLITK > 1, one batch): workgroup z takes the KCHUNK values of k
// from z * KCHUNK (a multiple of BK) and writes its partial product, a
// [SPLITK, M, N] scratch at z * M * N: with SPLIT_LAST to args.part, and the
// last of a tile's SPLITK workgroups to finish adds them up and applies the
// epilogue (product.glsl's split_last); else to C, without an epilogue,
// and splitk.comp does that in a second dispatch (a convolution's split).
// Products with few rows and long rows (BERT's FFN output: 24 tiles of 64
// x 64 on a GPU of 132 multiprocessors) fill the GPU that way.
//
// VEC4 (TM and TN multiples of 4): the next K step is read into registers
// while this one multiplies, and shared memory holds two stages of vec4s;
// each invocation's rows and columns come in groups of 4 (vec4 reads of
// shared memory), the groups spread at the group's width. A and B are read
// as vec4s (f32, or f16 as four halves; rows contiguous, at multiples of 4
// elements) unless A_SCALAR or B_SCALAR: then one element at a time (a
// convolution's input, gathered through conv_at, is always B_SCALAR). A's
// scalar loads go 8 along K and 4 down M a warp (32-byte runs of each
// row), its stage rows padded by one vec4 so that those stores hit 32
// banks; B_KMAJOR (B_SCALAR, B_SK 1: a decoder's K-major weights, a
// transposed operand) loads B the same way, 8 along K and 4 across N.
// Without VEC4 (quantized weights, tiles of fewer than 4 x 4) the tiles
// load one element at a time: A along k, and B along n or, with B_KMAJOR,
// along k.
//
// CIMG (a convolution over several images, VEC4 or not): the images fold
// into N, image i's OH * OW = CIMG positions at columns i * CIMG on, its
// input CIN_IMG elements from the last; C_IMG (product.glsl) writes C back
// as [images, M, CIMG]. Without CONV (a 1 x 1 kernel, unit strides, no
// padding) B is each image's input as a plain [C, CIMG] matrix, read as
// vec4s where CIMG is a multiple of 4.
//
// ONE_TILE (VEC4, fixed shapes whose dispatch has a workgroup for every
// tile and batch) drops the loops over tiles and batches, and the steps go
// two to an iteration with constant stage indices: on the H200 that took
// 4096^3 from 3.53 to 3.0 ms (512 invocations get 128 registers each; the
// kernel spilled before).
#extension GL_EXT_control_flow_attributes : enable
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

#ifndef A_SCALAR
#define A_SCALAR 0
#endif
#ifndef B_SCALAR
#define B_SCALAR 0
#endif
#ifndef B_KMAJOR
#define B_KMAJOR 0
#endif
// The VEC4 path's vec4 loads: f32 as vec4s, f16 (A_F16, B's W_FORMAT 1)
// as uvec2s of four halves (kiln_half4: no 16-bit storage needed).
#if VEC4 && !A_SCALAR && A_F16
#define AT U2R
#define A_VEC4(i) kiln_half4(args.a.v[i])
#elif VEC4 && !A_SCALAR
#define AT V4R
#define A_VEC4(i) args.a.v[i]
#else
#define AT A_BUF
#endif
#if VEC4 && !B_SCALAR && W_FORMAT == 1
#define BT U2R
#define B_VEC4(i) kiln_half4(args.b.v[i])
#elif VEC4 && !B_SCALAR
#define BT V4R
#define B_VEC4(i) args.b.v[i]
#else
#define BT B_BUF
#endif

layout(push_constant) uniform Args {
    C_BUF c;
    AT a;
    BT b;
#if SPLIT_LAST
    F32C part;
    KilnCounter count;
#endif
    F32R bias;
    F32R bscale; // quantized B only (weights.glsl)
    U32R bzero;
    KILN_SPLIT_OUTPUTS(C_BUF) // QKV split (common.glsl)
    KILN_RES_ARG
    KILN_DIMS
} args;

#ifndef ONE_TILE
#define ONE_TILE 0
#endif
#ifndef SPLITK
#define SPLITK 1
#define KCHUNK ((K + BK - 1) / BK * BK)
#endif
#ifndef SPLIT_LAST
#define SPLIT_LAST 0
#endif

#define CONV_B(i) LOAD_B(i, 0u, 0u) // a convolution's input: f32 or f16 (W_FORMAT 1)
#include "product.glsl"
#if SPLIT_LAST // a partial product: split_last applies the epilogue
#define STORE_TILE(cc, gm, gn, v) store_part(cc, gm, gn, v)
#else
#define STORE_TILE(cc, gm, gn, v) store_c(cc, gm, gn, v)
#endif
#define TILES_M ((uint(M) + BM - 1) / BM) // M may follow the dynamic dims
#ifdef N_RUN // the run's columns: a dynamic batch of images' (cols_groups)
#define TILES_N ((uint(N_RUN) + BN - 1) / BN)
#else
#define TILES_N ((N + BN - 1) / BN)
#endif
#define TILES_Z (uint(BATCH_RUN) * SPLITK) // workgroup z: batch, or split of K

// Batch and split of workgroup z: the operands' offsets, and the first k.
void batch_split(uint z, out uint ca, out uint cb, out uint cc, out uint k0) {
#if SPLITK > 1
    kiln_batch_offsets(0, ca, cb, cc);
    cc = z * uint(M) * N;
    k0 = z * KCHUNK;
#else
    kiln_batch_offsets(z, ca, cb, cc);
    k0 = 0;
#endif
}

#if CONV
#define LOAD_B_AT(cb, gk, gn) conv_at(conv_col(cb, gn), gk)
#else
#define LOAD_B_AT(cb, gk, gn) LOAD_B(B_INDEX(cb, gk, gn), gk, gn)
#endif
#define LOAD_A_AT(ca, gm, gk) float(args.a.v[ca + (gm) * A_SM + (gk) * A_SK])

#if VEC4
#define BM4 (BM / 4)
#define BN4 (BN / 4)
#define STEPS (KCHUNK / BK) // K steps of a tile (or of its split)
#if A_SCALAR // what an invocation loads of A and of B a step: floats or vec4s
#define A_LOADS (BM * BK / NT)
#define A_REG float
shared vec4 As[2][BK][BM4 + 1];
#else
#define A_LOADS (BM4 * BK / NT)
#define A_REG vec4
shared vec4 As[2][BK][BM4];
#endif
#if B_SCALAR
#define B_LOADS (BN * BK / NT)
#define B_REG float
#else
#define B_LOADS (BN4 * BK / NT)
#define B_REG vec4
#endif
#if B_KMAJOR
shared vec4 Bs[2][BK][BN4 + 1];
#else
shared vec4 Bs[2][BK][BN4];
#endif

// A's row and k of its load l (scalar: 8 along k by 4 rows a warp).
void a_at(uint tid, uint l, out uint r, out uint kk) {
    uint v = tid + l * NT;
#if A_SCALAR
    uint w = v / 32, lane = v % 32;
    r = w % (BM / 4) * 4 + lane / 8;
    kk = w / (BM / 4) * 8 + lane % 8;
#else
    r = v % BM;
    kk = 4 * (v / BM);
#endif
}

// B's k and column of its load l (scalar): n fastest, or (B_KMAJOR) 8 along
// k by 4 columns a warp.
void b_at(uint tid, uint l, out uint kk, out uint c) {
    uint v = tid + l * NT;
#if B_KMAJOR
    uint w = v / 32, lane = v % 32;
    c = w % (BN / 4) * 4 + lane / 8;
    kk = w / (BN / 4) * 8 + lane % 8;
#else
    kk = v / BN;
    c = v % BN;
#endif
}

// A convolution's B where each invocation loads one column (NT a multiple
// of BN): that column, found once a tile (tile()).
#define CONV_ONE_COL (CONV && B_SCALAR && NT % BN == 0)
#if CONV_ONE_COL
ConvCol bcol;
#endif

// The step at k0 of the tile at (m0, n0), into registers.
void load_step(uint ca, uint cb, uint m0, uint n0, uint k0, uint tid,
               out A_REG ra[A_LOADS], out B_REG rb[B_LOADS]) {
    [[unroll]] for (uint l = 0; l < A_LOADS; ++l) {
        uint r, kk;
        a_at(tid, l, r, kk);
        uint gm = m0 + r, gk = k0 + kk;
#if A_SCALAR
        ra[l] = gm < M && gk < K ? LOAD_A_AT(ca, gm, gk) : 0.0;
#else
        ra[l] = gm < M && gk < K ? A_VEC4((ca + gm * A_SM + gk) / 4) : vec4(0.0);
#endif
    }
    [[unroll]] for (uint l = 0; l < B_LOADS; ++l) {
#if B_SCALAR
        uint kk, c;
        b_at(tid, l, kk, c);
        uint gk = k0 + kk, gn = n0 + c;
#if CONV_ONE_COL
        rb[l] = gk < K && gn < N ? conv_at(bcol, gk) : 0.0;
#else
        rb[l] = gk < K && gn < N ? LOAD_B_AT(cb, gk, gn) : 0.0;
#endif
#else
        uint v = tid + l * NT;
        uint gk = k0 + v / BN4, gn = n0 + 4 * (v % BN4);
        rb[l] = gk < K && gn < N ? B_VEC4(B_INDEX(cb, gk, gn) / 4) : vec4(0.0);
#endif
    }
}

void store_step(uint buf, uint tid, A_REG ra[A_LOADS], B_REG rb[B_LOADS]) {
    [[unroll]] for (uint l = 0; l < A_LOADS; ++l) {
        uint r, kk;
        a_at(tid, l, r, kk);
#if A_SCALAR
        As[buf][kk][r / 4][r % 4] = ra[l];
#else
        As[buf][kk][r / 4][r % 4] = ra[l].x;
        As[buf][kk + 1][r / 4][r % 4] = ra[l].y;
        As[buf][kk + 2][r / 4][r % 4] = ra[l].z;
        As[buf][kk + 3][r / 4][r % 4] = ra[l].w;
#endif
    }
    [[unroll]] for (uint l = 0; l < B_LOADS; ++l) {
#if B_SCALAR
        uint kk, c;
        b_at(tid, l, kk, c);
        Bs[buf][kk][c / 4][c % 4] = rb[l];
#else
        uint v = tid + l * NT;
        Bs[buf][v / BN4][v % BN4] = rb[l];
#endif
    }
}

// The products of stage buf's step, added into acc. Its callers pass a
// constant buf, so every shared-memory address is a constant offset.
void multiply(const uint buf, uint tx, uint ty, inout float acc[TM][TN]) {
    [[unroll]] for (uint kk = 0; kk < BK; ++kk) {
        vec4 av[TM / 4], bv[TN / 4];
        [[unroll]] for (uint i = 0; i < TM / 4; ++i)
            av[i] = As[buf][kk][i * NTY + ty];
        [[unroll]] for (uint j = 0; j < TN / 4; ++j)
            bv[j] = Bs[buf][kk][j * NTX + tx];
        [[unroll]] for (uint i = 0; i < TM; ++i)
            [[unroll]] for (uint j = 0; j < TN; ++j)
                acc[i][j] = fma(av[i / 4][i % 4], bv[j / 4][j % 4], acc[i][j]);
    }
}

// The tile at (m0, n0) of the batch at offsets ca, cb, cc, over STEPS steps
// of K from k0. Steps alternate
// between the two stages, two to an iteration (the last one or two after
// the loop): the next step's loads are in flight while this one multiplies,
// then go to the other stage, whose last reader was before the previous
// barrier.
void tile(uint ca, uint cb, uint cc, uint m0, uint n0, uint k0, uint tid, uint tx,
          uint ty) {
    float acc[TM][TN];
    [[unroll]] for (uint i = 0; i < TM; ++i)
        [[unroll]] for (uint j = 0; j < TN; ++j)
            acc[i][j] = 0.0;
#if CONV_ONE_COL
    bcol = conv_col(cb, n0 + tid % BN);
#endif
    A_REG ra[A_LOADS];
    B_REG rb[B_LOADS];
    load_step(ca, cb, m0, n0, k0, tid, ra, rb);
    store_step(0, tid, ra, rb);
    barrier();
    for (uint s = 0; s + 2 < STEPS; s += 2, k0 += 2 * BK) {
        load_step(ca, cb, m0, n0, k0 + BK, tid, ra, rb);
        multiply(0, tx, ty, acc);
        store_step(1, tid, ra, rb);
        barrier();
        load_step(ca, cb, m0, n0, k0 + 2 * BK, tid, ra, rb);
        multiply(1, tx, ty, acc);
        store_step(0, tid, ra, rb);
        barrier();
    }
    if (STEPS % 2 == 0) {
        load_step(ca, cb, m0, n0, k0 + BK, tid, ra, rb);
        multiply(0, tx, ty, acc);
        store_step(1, tid, ra, rb);
        barrier();
        multiply(1, tx, ty, acc);
    } else {
        multiply(0, tx, ty, acc);
    }
    [[unroll]] for (uint i = 0; i < TM; ++i) {
        uint gm = m0 + 4 * ((i / 4) * NTY + ty) + i % 4;
        [[unroll]] for (uint j = 0; j < TN; ++j) {
            uint gn = n0 + 4 * ((j / 4) * NTX + tx) + j % 4;
            if (gm < M && gn < N)
                STORE_TILE(cc, gm, gn, acc[i][j]);
        }
    }
#if SPLIT_LAST
    split_last(m0 / BM * TILES_N + n0 / BN, m0, n0, tid);
#endif
}

void main() {
    const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    const uint tid = ty * NTX + tx;
    uint ca, cb, cc, k0;
#if ONE_TILE
    batch_split(gl_WorkGroupID.z, ca, cb, cc, k0);
    tile(ca, cb, cc, gl_WorkGroupID.y * BM, gl_WorkGroupID.x * BN, k0, tid, tx, ty);
#else
    for (uint bz = gl_WorkGroupID.z; bz < TILES_Z; bz += gl_NumWorkGroups.z) {
        batch_split(bz, ca, cb, cc, k0);
        for (uint tm = gl_WorkGroupID.y; tm < TILES_M; tm += gl_NumWorkGroups.y) {
            for (uint tn = gl_WorkGroupID.x; tn < TILES_N; tn += gl_NumWorkGroups.x) {
                tile(ca, cb, cc, tm * BM, tn * BN, k0, tid, tx, ty);
                barrier(); // the last step's readers, before the next tile's stores
            }
        }
    }
#endif
}
#else
// Loads go along k for A (row-major) and, with B_KMAJOR, for B: rows padded
// by one float so that a warp's stores down a column hit distinct banks.
shared float As[BK][BM + 1];
#if B_KMAJOR
shared float Bs[BK][BN + 1];
#else
shared float Bs[BK][BN];
#endif

void main() {
    const uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    const uint tid = ty * NTX + tx;
    for (uint bz = gl_WorkGroupID.z; bz < TILES_Z; bz += gl_NumWorkGroups.z) {
        uint ca, cb, cc, kbeg;
        batch_split(bz, ca, cb, cc, kbeg);
        const uint kend = min(K, kbeg + KCHUNK);
        for (uint tm = gl_WorkGroupID.y; tm < TILES_M; tm += gl_NumWorkGroups.y) {
            for (uint tn = gl_WorkGroupID.x; tn < TILES_N; tn += gl_NumWorkGroups.x) {
                const uint m0 = tm * BM, n0 = tn * BN;
                float acc[TM][TN];
                for (uint i = 0; i < TM; ++i)
                    for (uint j = 0; j < TN; ++j)
                        acc[i][j] = 0.0;
                for (uint k0 = kbeg; k0 < kend; k0 += BK) {
                    for (uint e = tid; e < BM * BK; e += NT) {
                        uint r = e / BK, kk = e % BK;
                        uint gm = m0 + r, gk = k0 + kk;
                        As[kk][r] = (gm < M && gk < kend) ? LOAD_A_AT(ca, gm, gk) : 0.0;
                    }
                    for (uint e = tid; e < BK * BN; e += NT) {
#if B_KMAJOR
                        uint kk = e % BK, cn = e / BK;
#else
                        uint kk = e / BN, cn = e % BN;
#endif
                        uint gk = k0 + kk, gn = n0 + cn;
                        Bs[kk][cn] = (gk < kend && gn < N) ? LOAD_B_AT(cb, gk, gn)
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
                        if (gm < M && gn < N)
                            STORE_TILE(cc, gm, gn, acc[i][j]);
                    }
                }
#if SPLIT_LAST
                split_last(tm * TILES_N + tn, m0, n0, tid);
#endif
            }
        }
    }
}
#endif
