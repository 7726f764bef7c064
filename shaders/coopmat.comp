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
// multiply. Tiles wholly inside C are stored straight from the fragments;
// edge tiles (and every tile without C_DIRECT) go through a per-subgroup
// 16 x 16 staging area, element by element with bounds checks.
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
// vectors along N, or a convolution's input: CONV and CIMG as in
// product.glsl) load their tiles one element at a time, eight to a vector,
// and store them into shared memory as the vector loads do; a gathered B is
// f32 where B_F32 (converted to f16 as loaded). A convolution's B in
// vectors: a 1 x 1 kernel's images (CIMG) of a multiple of 8 positions.
// C_DIRECT: tiles wholly inside C are stored straight from the fragments
// (no epilogue, C aligned); otherwise every tile goes through the staging
// area.
//
// EPILOGUE 1 (a fused bias, activation or QKV split: product.glsl's
// store_c): every tile goes through the staging area, and store_c writes
// each element.
//
// KCHUNK (a product of one batch split along K, with few tiles): workgroup
// z computes the partial product of K's chunk z, [z * KCHUNK, (z + 1) *
// KCHUNK), into c as [SPLITS, M, N] f32 (splitk.comp then adds the chunks
// and applies the epilogue).
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
#ifndef B_GATHER
#define B_GATHER 0
#endif
#if A_GATHER
#define A_ARG F16R
#else
#define A_ARG U4R
#endif
#if !B_GATHER
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
    F32R bias;
    F32R bscale_; // matmul.comp's slots, unused here
    U32R bzero_;
    KILN_SPLIT_OUTPUTS(C_BUF) // QKV split (common.glsl)
    KILN_RES_ARG
} args;

#define CONV_B(i) args.b.v[i]
#include "product.glsl"
#define TILES_M ((M + BM - 1) / BM)
#define TILES_N ((N + BN - 1) / BN)

// Shared tiles in vectors of 8 halves.
#define AS_STRIDE (BK / 8 + 1)  // A tile: BM rows of BK halves
const uint A_VECS = BM * BK / 8;
#define BS_STRIDE (BN / 8 + 1)  // B tile: BK rows (k) of BN halves (n)
const uint B_ROWS = BK, B_ROWVECS = BN / 8;
const uint B_VECS = BK * BN / 8;
const uint LA = (A_VECS + NT - 1) / NT, LB = (B_VECS + NT - 1) / NT;

shared uvec4 As[BM * AS_STRIDE];
shared uvec4 Bs[B_ROWS * BS_STRIDE];
shared float Cs[WM * WN][256];

uvec4 ra[LA], rb[LB];
uint k_end = K; // the end of this workgroup's K (its chunk's, with KCHUNK)

// Eight floats as a vector of eight halves.
uvec4 pack8(const float h[8]) {
    return uvec4(packHalf2x16(vec2(h[0], h[1])), packHalf2x16(vec2(h[2], h[3])),
                 packHalf2x16(vec2(h[4], h[5])), packHalf2x16(vec2(h[6], h[7])));
}

// B's element (gk, gn) of the batch at cb, gathered.
float b_at(uint cb, uint gk, uint gn) {
#if CONV
    return conv_at(conv_col(cb, gn), gk);
#else
    return float(args.b.v[B_INDEX(cb, gk, gn)]);
#endif
}

// The vectors of step k0 from memory into ra and rb (zeros outside).
void load_tiles(uint ca, uint cb, uint m0, uint n0, uint k0, uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT, row = e / (BK / 8), v = e % (BK / 8);
        const uint gm = m0 + row, gk = k0 + v * 8;
#if A_GATHER
        float h[8];
        [[unroll]] for (uint j = 0; j < 8; ++j)
            h[j] = e < A_VECS && gm < M && gk + j < k_end
                       ? float(args.a.v[ca + gm * A_SM + gk + j]) : 0.0;
        ra[i] = pack8(h);
#else
        ra[i] = e < A_VECS && gm < M && gk < k_end ? args.a.v[(ca + gm * A_SM + gk) / 8] : uvec4(0);
#endif
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT, row = e / B_ROWVECS, v = e % B_ROWVECS;
        const uint gk = k0 + row, gn = n0 + v * 8;
#if B_GATHER
        float h[8];
        [[unroll]] for (uint j = 0; j < 8; ++j)
            h[j] = e < B_VECS && gk < k_end && gn + j < N ? b_at(cb, gk, gn + j) : 0.0;
        rb[i] = pack8(h);
#else
        rb[i] = e < B_VECS && gk < k_end && gn < N ? args.b.v[B_INDEX(cb, gk, gn) / 8] : uvec4(0);
#endif
    }
}

void store_tiles(uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT;
        if (e < A_VECS)
            As[(e / (BK / 8)) * AS_STRIDE + e % (BK / 8)] = ra[i];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT;
        if (e < B_VECS)
            Bs[(e / B_ROWVECS) * BS_STRIDE + e % B_ROWVECS] = rb[i];
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint sg = tid / 32, lane = tid % 32;
    const uint wm = sg / WN, wn = sg % WN;
#ifdef KCHUNK
    for (uint bz = gl_WorkGroupID.z; bz < SPLITS; bz += gl_NumWorkGroups.z) {
        const uint ca = 0, cb = 0, cc = bz * M * N, k_begin = bz * KCHUNK;
        k_end = min(K, k_begin + KCHUNK);
#else
    for (uint bz = gl_WorkGroupID.z; bz < BATCH; bz += gl_NumWorkGroups.z) {
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
                load_tiles(ca, cb, m0, n0, k_begin, tid);
                for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
                    store_tiles(tid);
                    barrier();
                    if (k0 + BK < k_end)
                        load_tiles(ca, cb, m0, n0, k0 + BK, tid);
                    [[unroll]] for (uint kk = 0; kk < BK; kk += 16) {
                        fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[FM], fb[FN];
                        [[unroll]] for (uint i = 0; i < FM; ++i)
                            coopMatLoadNV(fa[i], As, (wm * TM + i * 16) * AS_STRIDE + kk / 8,
                                          AS_STRIDE, false);
                        [[unroll]] for (uint j = 0; j < FN; ++j)
                            coopMatLoadNV(fb[j], Bs, kk * BS_STRIDE + (wn * TN + j * 16) / 8,
                                          BS_STRIDE, false);
                        [[unroll]] for (uint i = 0; i < FM; ++i)
                            [[unroll]] for (uint j = 0; j < FN; ++j)
                                acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);
                    }
                    barrier();
                }
                const bool whole = C_DIRECT != 0 && m0 + BM <= M && n0 + BN <= N;
                [[unroll]] for (uint i = 0; i < FM; ++i) {
                    [[unroll]] for (uint j = 0; j < FN; ++j) {
                        const uint r0 = m0 + wm * TM + i * 16, c0 = n0 + wn * TN + j * 16;
                        if (whole) {
#if C_F16
                            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> h =
                                fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>(acc[i][j]);
                            coopMatStoreNV(h, args.c.v, cc + r0 * N + c0, N, false);
#else
                            coopMatStoreNV(acc[i][j], args.c.v, cc + r0 * N + c0, N, false);
#endif
                        } else {
                            coopMatStoreNV(acc[i][j], Cs[sg], 0, 16, false);
                            subgroupMemoryBarrierShared();
                            subgroupBarrier();
                            for (uint e = lane; e < 256; e += 32) {
                                const uint gm = r0 + e / 16, gn = c0 + e % 16;
                                if (gm < M && gn < N)
#if EPILOGUE
                                    store_c(cc, gm, gn, Cs[sg][e]);
#else
                                    args.c.v[cc + gm * N + gn] = C_T(Cs[sg][e]);
#endif
                            }
                            subgroupBarrier();
                        }
                    }
                }
            }
        }
    }
}
