#version 460
// coopmat_wg.comp: C = A x B for f16 A and B with f32 accumulation on
// cooperative matrices of workgroup scope (VK_NV_cooperative_matrix2's
// cooperativeMatrixWorkgroupScope, through SPV_KHR_cooperative_matrix):
// the workgroup's 128 invocations hold one BM x BN accumulator (BM 128, BN
// 128 or 64) and multiply a BM x BK tile of A by a BK x BN tile of B each K
// step, and the driver splits the work among them (on an H200 it runs
// faster than coopmat.comp's 16 x 16 subgroup fragments: 4096^3 in 505
// against 723 us, bench/experiments/cm2-h200.txt). Only recorded for
// devices that have them (KILN_FEATURE_COOPMAT_WG); coopmat.comp runs
// elsewhere.
//
// Written in GL_NV_cooperative_matrix's syntax, which Debian 12's glslang
// compiles for any scope and size: kiln validates those words, then
// rewrites them as SPV_KHR_cooperative_matrix (compiler/spirv_khr.c; a
// matrix type's use, A, B or accumulator, from the multiply-add). A's and
// B's types must therefore differ in shape (BM, BN != BK).
//
// Every tile whole: M a multiple of BM, N of BN, K of BK, A's rows and B's
// rows (and their batch strides) multiples of 8 halves, so that each
// invocation loads 16-byte vectors of eight halves. B_KMAJOR: B is K-major
// as given (gemm's trans_b: B_SK 1, its columns B_SN apart, a multiple of
// 8), its tile kept so in shared memory (BN columns of BK halves) and
// loaded column-major. On an H200 (bench/experiments/
// coopmat-transb-h200.txt; gemm, so 128 x 64 tiles with the epilogue):
// [512, 768] x [768, 3072] 30.3 against 49.7 us on coopmat.comp's gathered
// columns, 2048^3 133.4 both, 4096^3 1126.6 against 1094.2. Each K step's tiles
// are loaded into registers one step ahead, stored to shared memory (rows
// padded by one vector: unpadded rows ran 4x slower), and the matrices
// loaded from there. Without EPILOGUE, C (f16 with C_F16, else f32) is
// stored straight from the accumulator. With EPILOGUE (a fused bias,
// activation or QKV split, gemm's alpha and beta: product.glsl's store_c,
// eight columns a call with STORE8), the accumulator goes to shared memory
// as f32 (the tiles' memory, BN 64: 32 KiB) and each invocation applies the
// epilogue to its elements from there. Batches as in matmul.comp
// (product.glsl).
//
// Defines: M, N, K, A_SM, B_SK (row strides; A_SK and B_SN are 1, or with
// B_KMAJOR B_SK 1 and B_SN the column stride), BATCH,
// BRANK, BSHAPE, C_BSTRIDES, A_BSTRIDES, B_BSTRIDES, BM, BN, BK, C_F16,
// EPILOGUE, STORE8 and product.glsl's epilogue defines.
// CEILING (KILN_COOPMAT_CEILING, for benchmarks only: C is then not the
// product): 1, the first step's matrices multiplied every step, nothing
// loaded after them, the matrix units' rate for these tiles; 2, the
// matrices loaded again from the shared tiles every step (at offsets that
// alternate, so that the loads cannot be hoisted), no memory traffic and
// no barriers: the rate at which shared memory feeds the matrix units; 3,
// the tiles' traffic alone (every step's loads, stores and barriers, no
// matrices until one multiply-add of the last step's tiles).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"

#define NT 128
layout(local_size_x = NT) in;

#if C_F16
#define C_BUF F16
#define C_T float16_t
#else
#define C_BUF F32
#define C_T float
#endif

layout(push_constant) uniform Args {
    C_BUF c;
    U4R a;
    U4R b;
    F32R bias;
    F32R bscale_; // matmul.comp's slots, unused here
    U32R bzero_;
    KILN_SPLIT_OUTPUTS(C_BUF) // QKV split (common.glsl)
    KILN_RES_ARG
    KILN_DIMS
} args;

#include "product.glsl"
#ifndef CEILING
#define CEILING 0
#endif
#ifndef EPILOGUE
#define EPILOGUE 0
#endif

#ifndef B_KMAJOR
#define B_KMAJOR 0
#endif
#define AS_STRIDE (BK / 8 + 1) // A tile: BM rows of BK halves, in vectors
#if B_KMAJOR // B tile as B is given: BN columns of BK halves, loaded column-major
#define B_ROW_VECS (BK / 8)
#define B_LINES BN
#else // B tile: BK rows of BN halves
#define B_ROW_VECS (BN / 8)
#define B_LINES BK
#endif
#define BS_STRIDE (B_ROW_VECS + 1)
const uint A_VECS = BM * BK / 8, B_VECS = BK * BN / 8;
const uint LA = A_VECS / NT, LB = B_VECS / NT;
const uint A_TILE = BM * AS_STRIDE, B_TILE = B_LINES * BS_STRIDE;
// The tiles of A and B (B's after A's), and with EPILOGUE the accumulator
// after the K loop (f32, BN / 4 vectors a row)
#if EPILOGUE && BM * BN / 4 > A_TILE + B_TILE
shared uvec4 S[BM * BN / 4];
#else
shared uvec4 S[A_TILE + B_TILE];
#endif
uvec4 ra[LA], rb[LB];

// The vectors of step k0 of the tile at (m0, n0) into ra and rb.
void load_tiles(uint ca, uint cb, uint m0, uint n0, uint k0, uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT, row = e / (BK / 8), v = e % (BK / 8);
        ra[i] = args.a.v[(ca + (m0 + row) * A_SM + k0) / 8 + v];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT, line = e / B_ROW_VECS, v = e % B_ROW_VECS;
#if B_KMAJOR // line: a column of the tile, v: eight k of it
        rb[i] = args.b.v[B_INDEX(cb, k0, n0 + line) / 8 + v];
#else
        rb[i] = args.b.v[B_INDEX(cb, k0 + line, n0) / 8 + v];
#endif
    }
}

// ra and rb into the shared tiles.
void store_tiles(uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT;
        S[e / (BK / 8) * AS_STRIDE + e % (BK / 8)] = ra[i];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT;
        S[A_TILE + e / B_ROW_VECS * BS_STRIDE + e % B_ROW_VECS] = rb[i];
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    for (uint bz = gl_WorkGroupID.z; bz < uint(BATCH_RUN); bz += gl_NumWorkGroups.z) {
        uint ca, cb, cc;
        kiln_batch_offsets(bz, ca, cb, cc);
        fcoopmatNV<32, gl_ScopeWorkgroup, BM, BN> acc =
            fcoopmatNV<32, gl_ScopeWorkgroup, BM, BN>(0.0);
        load_tiles(ca, cb, m0, n0, 0, tid);
#if CEILING == 3
        for (uint k0 = 0; k0 < K; k0 += BK) {
            store_tiles(tid);
            barrier();
            if (k0 + BK < K)
                load_tiles(ca, cb, m0, n0, k0 + BK, tid);
            barrier();
        }
        fcoopmatNV<16, gl_ScopeWorkgroup, BM, BK> fa;
        fcoopmatNV<16, gl_ScopeWorkgroup, BK, BN> fb;
        coopMatLoadNV(fa, S, 0, AS_STRIDE, false);
        coopMatLoadNV(fb, S, A_TILE, BS_STRIDE, B_KMAJOR != 0);
        acc = coopMatMulAddNV(fa, fb, acc);
        barrier();
#elif CEILING
#if CEILING == 2 // the tiles' padding read too: zeros, not what memory held
        for (uint e = tid; e < S.length(); e += NT)
            S[e] = uvec4(0);
        barrier();
#endif
        store_tiles(tid);
        barrier();
        fcoopmatNV<16, gl_ScopeWorkgroup, BM, BK> fa;
        fcoopmatNV<16, gl_ScopeWorkgroup, BK, BN> fb;
        coopMatLoadNV(fa, S, 0, AS_STRIDE, false);
        coopMatLoadNV(fb, S, A_TILE, BS_STRIDE, B_KMAJOR != 0);
        for (uint k0 = 0; k0 < K; k0 += BK) {
#if CEILING == 2 // odd steps: A's rows 8 vectors on, B's 8 back, both within S
            const uint o = (k0 / BK % 2) * 8;
            coopMatLoadNV(fa, S, o, AS_STRIDE, false);
            coopMatLoadNV(fb, S, A_TILE - o, BS_STRIDE, B_KMAJOR != 0);
#endif
            acc = coopMatMulAddNV(fa, fb, acc);
        }
        barrier();
#else
        for (uint k0 = 0; k0 < K; k0 += BK) {
            store_tiles(tid);
            barrier();
            if (k0 + BK < K)
                load_tiles(ca, cb, m0, n0, k0 + BK, tid);
            fcoopmatNV<16, gl_ScopeWorkgroup, BM, BK> fa;
            fcoopmatNV<16, gl_ScopeWorkgroup, BK, BN> fb;
            coopMatLoadNV(fa, S, 0, AS_STRIDE, false);
            coopMatLoadNV(fb, S, A_TILE, BS_STRIDE, B_KMAJOR != 0);
            acc = coopMatMulAddNV(fa, fb, acc);
            barrier(); // every matrix loaded before the next step's stores
        }
#endif
#if EPILOGUE // the K loop ended on a barrier: the tiles' memory is free
        coopMatStoreNV(acc, S, 0, BN / 4, false);
        barrier();
#if STORE8 // eight consecutive columns of one row a call
        for (uint e = tid * 8; e < BM * BN; e += NT * 8) {
            float v[8];
            [[unroll]] for (uint j = 0; j < 8; ++j)
                v[j] = uintBitsToFloat(S[(e + j) / 4][(e + j) % 4]);
            store_c8(cc, m0 + e / BN, n0 + e % BN, v);
        }
#else
        for (uint e = tid; e < BM * BN; e += NT)
            store_c(cc, m0 + e / BN, n0 + e % BN, uintBitsToFloat(S[e / 4][e % 4]));
#endif
        barrier(); // every element read before the next batch's tiles
#elif C_F16
        fcoopmatNV<16, gl_ScopeWorkgroup, BM, BN> h = fcoopmatNV<16, gl_ScopeWorkgroup, BM, BN>(acc);
        coopMatStoreNV(h, args.c.v, cc + m0 * N + n0, N, false);
#else
        coopMatStoreNV(acc, args.c.v, cc + m0 * N + n0, N, false);
#endif
    }
}
