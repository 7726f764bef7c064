#version 460
// coopmat.comp: C = A x B for f16 A and B with f32 accumulation on the
// matrix units, through cooperative matrices (VK_NV_cooperative_matrix:
// 16 x 16 x 16 fragments of f16 with an f32 accumulator, subgroups of 32).
// Only recorded for devices that have them (KILN_FEATURE_COOPMAT); the
// runtime runs matmul.comp instead elsewhere. Products, gemm and
// convolutions (implicit GEMM: A the weights, B the input's im2col matrix,
// gathered as the tiles load).
//
// A workgroup of WM x WN subgroups computes a BM x BN tile of C, each
// subgroup a (BM / WM) x (BN / WN) block of FM x FN fragments. K goes in
// steps of BK (32 or 64): the tiles of A (BM x BK) and B (BK x BN) go through
// shared memory as 16-byte vectors of
// eight halves, rows padded by one vector against bank conflicts; the next
// step's vectors are loaded into registers while this step's fragments
// multiply: PF (1 or 2) steps ahead, each in its own registers (PF 2: the
// loads of two steps in flight while one multiplies), and through NS (1
// or 2) shared stages (NS 2: the next step's tiles go to the other stage,
// one barrier a step instead of two; KILN_COOPMAT_PIPE, measured in
// bench/experiments/coopmat-pipe-h200.txt; EVEN_STEPS: every workgroup's
// steps come in pairs, so the loop's second step is not inside a test). Tiles wholly inside C are
// stored straight from the fragments; edge tiles (and every tile without
// C_DIRECT) go through a per-subgroup 16 x 16 staging area, element by
// element with bounds checks.
//
// Defines: M, N, K; A_SM and B_SK (row strides; A_SK and B_SN are 1),
// batches as in matmul.comp (BATCH, BRANK, BSHAPE,
// C_BSTRIDES, A_BSTRIDES, B_BSTRIDES); C_F16 when C is f16. Without
// A_GATHER and B_GATHER the compiler guarantees K, N, the row strides and
// batch strides are multiples of 8 (every vector is whole and 16-byte
// aligned).
//
// A_GATHER (A's rows not in whole aligned vectors: K or A_SM not a multiple
// of 8, a convolution's stem of K 147) and B_GATHER (B not in whole aligned
// vectors along N, a K-major B, or a convolution's input: CONV and CIMG as in
// product.glsl) load their tiles one element at a time, eight to a vector,
// and store them into shared memory as vectors (a gathered B by columns,
// [n][k] like A's tile, eight consecutive k of one column to a vector:
// consecutive invocations read consecutive columns); a gathered B is f32
// where B_F32 (converted to f16 as loaded). A convolution's B in
// vectors: a 1 x 1 kernel's images (CIMG) of a multiple of 8 positions.
// B_KVEC: a K-major f16 B (B_SK 1; K, B_SN and its batch strides
// multiples of 8: a decoder's weight stored for matvec_k.comp, gemm's
// trans_b, a transposed operand) gathered by columns, each vector of eight
// k one 16-byte load. M may follow the
// dynamic dims (a decoder's prompt; the row tiles' workgroups then too).
// C_DIRECT: tiles wholly inside C are stored straight from the fragments
// (no epilogue, C aligned); otherwise every tile goes through the staging
// area, and out of it, with STORE8 (an epilogue without a QKV split, N and
// the images' positions multiples of 8), eight consecutive columns of a row
// a lane (product.glsl's store_c8).
//
// EPILOGUE 1 (a fused bias, activation, residual or QKV split:
// product.glsl's store_c): every tile goes through the staging area, and
// store_c (store_c8 with STORE8) writes each element.
//
// KCHUNK (a product of one batch split along K, with few tiles): workgroup
// z computes the partial product of K's chunk z, [z * KCHUNK, (z + 1) *
// KCHUNK), as [SPLITS, M, N] f32: with SPLIT_LAST into args.part, and the
// last of a tile's SPLITS workgroups to finish adds the chunks up and
// applies the epilogue (product.glsl's split_last); else into c, and
// splitk.comp does that in a second dispatch (a convolution's split).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"

#define NT (32 * WM * WN)
#define TM (BM / WM) // a subgroup's block
#define TN (BN / WN)
#define FM (TM / 16)
#define FN (TN / 16)
layout(local_size_x = NT) in;

#if C_F16
#define C_BUF F16
#define C_T float16_t
#else
#define C_BUF F32
#define C_T float
#endif

#ifndef A_GATHER
#define A_GATHER 0
#endif
#ifndef SPLIT_LAST
#define SPLIT_LAST 0
#endif
#ifndef EVEN_STEPS
#define EVEN_STEPS 0
#endif
#ifndef B_GATHER
#define B_GATHER 0
#endif
#if A_GATHER
#define A_ARG F16R
#else
#define A_ARG U4R
#endif
#ifndef B_KVEC
#define B_KVEC 0
#endif
#if !B_GATHER || B_KVEC
#define B_ARG U4R
#elif B_F32
#define B_ARG F32R
#else
#define B_ARG F16R
#endif

layout(push_constant) uniform Args {
    C_BUF c;
    A_ARG a;
    B_ARG b;
#if SPLIT_LAST
    F32C part;
    KilnCounter count;
#endif
    F32R bias;
    F32R bscale_; // matmul.comp's slots, unused here
    U32R bzero_;
    KILN_SPLIT_OUTPUTS(C_BUF) // QKV split (common.glsl)
    KILN_RES_ARG
    KILN_DIMS
} args;

#ifdef KCHUNK
#define SPLITK SPLITS
#endif
#if SPLIT_LAST
#define P_OUT args.part.v // the partial products, f32
#define P_T float
#else
#define P_OUT args.c.v
#define P_T C_T
#endif

#define CONV_B(i) args.b.v[i]
#include "product.glsl"
#define TILES_M ((M + BM - 1) / BM)
#ifdef N_RUN // the run's columns: a dynamic batch of images' (cols_groups)
#define TILES_N ((uint(N_RUN) + BN - 1) / BN)
#else
#define TILES_N ((N + BN - 1) / BN)
#endif

// Shared tiles in vectors of 8 halves.
#define AS_STRIDE (BK / 8 + 1)  // A tile: BM rows of BK halves
const uint A_VECS = BM * BK / 8;
#if B_GATHER // B tile by columns, as A's: BN rows (n) of BK halves (k)
#define BS_STRIDE (BK / 8 + 1)
const uint B_ROWS = BN;
#else // BK rows (k) of BN halves (n)
#define BS_STRIDE (BN / 8 + 1)
const uint B_ROWS = BK, B_ROWVECS = BN / 8;
#endif
const uint B_VECS = BK * BN / 8;
const uint LA = (A_VECS + NT - 1) / NT, LB = (B_VECS + NT - 1) / NT;

#ifndef PF
#define PF 1
#endif
#ifndef NS
#define NS 1
#endif
const uint A_STAGE = BM * AS_STRIDE, B_STAGE = B_ROWS * BS_STRIDE;
shared uvec4 As[NS * A_STAGE];
shared uvec4 Bs[NS * B_STAGE];
shared float Cs[WM * WN][256];

uvec4 ra[PF][LA], rb[PF][LB];
uint k_end = K; // the end of this workgroup's K (its chunk's, with KCHUNK)

// Eight floats as a vector of eight halves.
uvec4 pack8(const float h[8]) {
    return uvec4(packHalf2x16(vec2(h[0], h[1])), packHalf2x16(vec2(h[2], h[3])),
                 packHalf2x16(vec2(h[4], h[5])), packHalf2x16(vec2(h[6], h[7])));
}

#if B_GATHER
// A gathered B's column gn of the batch at cb (BCol: where it starts), and
// its element gk. An invocation loads vectors of 8 along K of one column
// (consecutive invocations, consecutive columns): where NT is a multiple of
// BN that is the same column at every step, found once a tile (bcol).
#if CONV
#define BCol ConvCol
BCol b_col(uint cb, uint gn) { return conv_col(cb, gn); }
float b_at(BCol c, uint gk) { return conv_at(c, gk); }
#else
#define BCol uint
BCol b_col(uint cb, uint gn) { return B_INDEX(cb, 0u, gn); }
#if !B_KVEC
float b_at(BCol c, uint gk) { return float(args.b.v[c + gk * B_SK]); }
#endif
#endif
#if !B_KVEC
// A half of B (converted where B is f32).
float16_t b_half(uint i) { return float16_t(args.b.v[i]); }

// B's eight halves at `at` and `stride` apart after it, as one vector.
uvec4 b_halves(uint at, uint stride) {
    return uvec4(packFloat2x16(f16vec2(b_half(at), b_half(at + stride))),
                 packFloat2x16(f16vec2(b_half(at + 2 * stride), b_half(at + 3 * stride))),
                 packFloat2x16(f16vec2(b_half(at + 4 * stride), b_half(at + 5 * stride))),
                 packFloat2x16(f16vec2(b_half(at + 6 * stride), b_half(at + 7 * stride))));
}
#endif

// B_WHOLE: the vector of eight k from gk of column c at once, the index
// math done once: a convolution whose K runs over channels last
// (CONV_KLAST, channels a multiple of 8: eight channels at one kernel
// offset, one bounds check, loads a plane apart), or a plain B whose K is
// a multiple of 8.
#if B_KVEC // a K-major f16 B (a decoder's weight): eight k of a column are one vector
#define B_WHOLE 1
uvec4 b_vec(BCol c, uint gk) { return args.b.v[(c + gk) / 8]; }
#elif CONV && CONV_KLAST && CIC % 8 == 0
#define B_WHOLE 1
uvec4 b_vec(BCol c, uint gk) {
    const uint khw = gk / CIC, ci = gk % CIC, kh = khw / CKW, kw = khw % CKW;
    const uint ih = uint(c.ih + int(kh * CDH)), iw = uint(c.iw + int(kw * CDW));
    if (ih >= CIH || iw >= CIW)
        return uvec4(0);
    return b_halves(c.base + (ci * CIH + ih) * CIW + iw, CIH * CIW);
}
#elif !CONV && K % 8 == 0
#define B_WHOLE 1
uvec4 b_vec(BCol c, uint gk) { return b_halves(c + gk * B_SK, B_SK); }
#else
#define B_WHOLE 0
#endif
#define B_ONE_COL (NT % BN == 0)
#if B_ONE_COL
BCol bcol;
#endif
#endif

// The vectors of step k0 from memory into ra[r] and rb[r] (zeros outside).
void load_tiles(uint r, uint ca, uint cb, uint m0, uint n0, uint k0, uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT, row = e / (BK / 8), v = e % (BK / 8);
        const uint gm = m0 + row, gk = k0 + v * 8;
#if A_GATHER
        float h[8];
        [[unroll]] for (uint j = 0; j < 8; ++j)
            h[j] = e < A_VECS && gm < M && gk + j < k_end
                       ? float(args.a.v[ca + gm * A_SM + gk + j]) : 0.0;
        ra[r][i] = pack8(h);
#else
        ra[r][i] = e < A_VECS && gm < M && gk < k_end ? args.a.v[(ca + gm * A_SM + gk) / 8]
                                                      : uvec4(0);
#endif
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
#if B_GATHER
        const uint e = tid + i * NT, gn = n0 + e % BN, gk = k0 + e / BN * 8;
#if B_ONE_COL
        const BCol c = bcol;
#else
        const BCol c = b_col(cb, gn);
#endif
#if B_WHOLE
        rb[r][i] = e < B_VECS && gn < N && gk < k_end ? b_vec(c, gk) : uvec4(0);
#else
        float h[8];
        [[unroll]] for (uint j = 0; j < 8; ++j)
            h[j] = e < B_VECS && gn < N && gk + j < k_end ? b_at(c, gk + j) : 0.0;
        rb[r][i] = pack8(h);
#endif
#else
        const uint e = tid + i * NT, gk = k0 + e / B_ROWVECS, gn = n0 + e % B_ROWVECS * 8;
        rb[r][i] = e < B_VECS && gk < k_end && gn < N ? args.b.v[B_INDEX(cb, gk, gn) / 8]
                                                      : uvec4(0);
#endif
    }
}

// Registers r into shared stage s.
void store_tiles(uint r, uint s, uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT;
        if (e < A_VECS)
            As[s * A_STAGE + (e / (BK / 8)) * AS_STRIDE + e % (BK / 8)] = ra[r][i];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT;
#if B_GATHER // column e % BN, vector e / BN along K
        if (e < B_VECS)
            Bs[s * B_STAGE + e % BN * BS_STRIDE + e / BN] = rb[r][i];
#else
        if (e < B_VECS)
            Bs[s * B_STAGE + (e / B_ROWVECS) * BS_STRIDE + e % B_ROWVECS] = rb[r][i];
#endif
    }
}

// Shared stage S's fragments multiplied into acc.
#if B_GATHER
#define LOAD_B_FRAG(j, S, kk)                                                                 \
    coopMatLoadNV(fb[j], Bs, (S) * B_STAGE + (wn * TN + j * 16) * BS_STRIDE + kk / 8,        \
                  BS_STRIDE, true)
#else
#define LOAD_B_FRAG(j, S, kk)                                                                 \
    coopMatLoadNV(fb[j], Bs, (S) * B_STAGE + kk * BS_STRIDE + (wn * TN + j * 16) / 8,        \
                  BS_STRIDE, false)
#endif
#define MMA_STAGE(S)                                                                          \
    [[unroll]] for (uint kk = 0; kk < BK; kk += 16) {                                         \
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[FM], fb[FN];                              \
        [[unroll]] for (uint i = 0; i < FM; ++i)                                              \
            coopMatLoadNV(fa[i], As, (S) * A_STAGE + (wm * TM + i * 16) * AS_STRIDE + kk / 8, \
                          AS_STRIDE, false);                                                  \
        [[unroll]] for (uint j = 0; j < FN; ++j)                                              \
            LOAD_B_FRAG(j, S, kk);                                                            \
        [[unroll]] for (uint i = 0; i < FM; ++i)                                              \
            [[unroll]] for (uint j = 0; j < FN; ++j)                                          \
                acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);                         \
    }

// One K step (k0) from registers R through shared stage S: R's vectors into
// S, the loads of the step PF ahead into R, S's fragments multiplied. With
// one stage a second barrier keeps the next step's stores after every
// subgroup's loads of this one; with two the next step writes the other
// stage, and the barrier after its stores comes after this step's loads.
#if NS == 1
#define STEP_BARRIER barrier();
#else
#define STEP_BARRIER
#endif
#define K_STEP(R, S)                                                                          \
    store_tiles(R, S, tid);                                                                   \
    barrier();                                                                                \
    if (k0 + PF * BK < k_end)                                                                 \
        load_tiles(R, ca, cb, m0, n0, k0 + PF * BK, tid);                                     \
    MMA_STAGE(S)                                                                              \
    STEP_BARRIER

// CEILING (KILN_COOPMAT_CEILING, for benchmarks only: C is then not the
// product): the K steps multiply without loading their tiles, to measure
// what the matrix units give this kernel's tiles. 1: the first step's
// fragments, loaded once, multiplied every step (multiply-adds only); 2:
// the first step's tiles stay in shared memory and every step loads its
// fragments from there (shared fragment loads and multiply-adds; no
// global loads, no barriers).
#ifndef CEILING
#define CEILING 0
#endif
#if CEILING == 1
#undef K_STEP
#define K_STEP(R, S)                                                                          \
    [[unroll]] for (uint kk = 0; kk < BK; kk += 16)                                           \
        [[unroll]] for (uint i = 0; i < FM; ++i)                                              \
            [[unroll]] for (uint j = 0; j < FN; ++j)                                          \
                acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);
#elif CEILING == 2
#undef K_STEP
#define K_STEP(R, S) MMA_STAGE(0)
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint sg = tid / 32, lane = tid % 32;
    const uint wm = sg / WN, wn = sg % WN;
#ifdef KCHUNK
    for (uint bz = gl_WorkGroupID.z; bz < SPLITS; bz += gl_NumWorkGroups.z) {
        const uint ca = 0, cb = 0, cc = bz * M * N, k_begin = bz * KCHUNK;
        k_end = min(K, k_begin + KCHUNK);
#else
    for (uint bz = gl_WorkGroupID.z; bz < uint(BATCH_RUN); bz += gl_NumWorkGroups.z) {
        uint ca, cb, cc;
        const uint k_begin = 0;
        kiln_batch_offsets(bz, ca, cb, cc);
#endif
        for (uint tm = gl_WorkGroupID.y; tm < TILES_M; tm += gl_NumWorkGroups.y) {
            for (uint tn = gl_WorkGroupID.x; tn < TILES_N; tn += gl_NumWorkGroups.x) {
                const uint m0 = tm * BM, n0 = tn * BN;
                fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[FM][FN];
                [[unroll]] for (uint i = 0; i < FM; ++i)
                    [[unroll]] for (uint j = 0; j < FN; ++j)
                        acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
#if B_GATHER && B_ONE_COL
                bcol = b_col(cb, n0 + tid % BN);
#endif
                load_tiles(0, ca, cb, m0, n0, k_begin, tid);
#if PF == 2
                if (k_begin + BK < k_end)
                    load_tiles(1, ca, cb, m0, n0, k_begin + BK, tid);
#endif
#if CEILING // the first step's tiles, kept in stage 0
                store_tiles(0, 0, tid);
                barrier();
#endif
#if CEILING == 1
                fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[FM], fb[FN];
                [[unroll]] for (uint i = 0; i < FM; ++i)
                    coopMatLoadNV(fa[i], As, (wm * TM + i * 16) * AS_STRIDE, AS_STRIDE, false);
                [[unroll]] for (uint j = 0; j < FN; ++j)
                    LOAD_B_FRAG(j, 0, 0);
#endif
#if CEILING
                // The ceiling's steps inside a test of k0: the form in which
                // the multiply-adds alone ran fastest on an H200 (4096^3:
                // 350 and 420 TFLOP/s for 1 and 2, 159 and 140 in the plain
                // loop below), the higher ceiling the one to measure against.
                for (uint k0 = k_begin; k0 < k_end;) {
                    if (k0 < k_end) {
                        K_STEP(0, 0)
                        k0 += BK;
                    }
                }
#else
                // The plain loop, one step an iteration, where one register
                // set and one stage serve every step: the product's steps
                // inside a test of k0 (as the second step below must be)
                // made 4096^3 1.33x slower on an H200 (d55f3b9 to 549fddc).
                for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
                    K_STEP(0, 0)
#if EVEN_STEPS // the steps come in pairs: the second needs no test
                    k0 += BK;
                    K_STEP(PF - 1, NS - 1)
#elif PF == 2 || NS == 2
                    k0 += BK;
                    if (k0 < k_end) {
                        K_STEP(PF - 1, NS - 1)
                    }
#endif
                }
#endif
#if NS == 2 || CEILING
                barrier(); // the last step's fragments loaded before the next tile's stores
#endif
                const bool whole = C_DIRECT != 0 && m0 + BM <= M && n0 + BN <= N;
                [[unroll]] for (uint i = 0; i < FM; ++i) {
                    [[unroll]] for (uint j = 0; j < FN; ++j) {
                        const uint r0 = m0 + wm * TM + i * 16, c0 = n0 + wn * TN + j * 16;
                        if (whole) {
#if C_F16 && !SPLIT_LAST
                            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> h =
                                fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(acc[i][j]);
                            coopMatStoreNV(h, args.c.v, cc + r0 * N + c0, N, false);
#else
                            coopMatStoreNV(acc[i][j], P_OUT, cc + r0 * N + c0, N, false);
#endif
                        } else {
                            coopMatStoreNV(acc[i][j], Cs[sg], 0, 16, false);
                            subgroupMemoryBarrierShared();
                            subgroupBarrier();
#if STORE8 // each lane eight consecutive columns of one row
                            const uint gm = r0 + lane / 2, gn = c0 + lane % 2 * 8;
                            if (gm < M && gn < N) {
                                float v[8];
                                [[unroll]] for (uint k = 0; k < 8; ++k)
                                    v[k] = Cs[sg][lane * 8 + k];
                                store_c8(cc, gm, gn, v);
                            }
#else
                            for (uint e = lane; e < 256; e += 32) {
                                const uint gm = r0 + e / 16, gn = c0 + e % 16;
                                if (gm < M && gn < N)
#if EPILOGUE
                                    store_c(cc, gm, gn, Cs[sg][e]);
#else
                                    P_OUT[cc + gm * N + gn] = P_T(Cs[sg][e]);
#endif
                            }
#endif
                            subgroupBarrier();
                        }
                    }
                }
#if SPLIT_LAST
                split_last(tm * TILES_N + tn, m0, n0, tid);
#endif
            }
        }
    }
}
