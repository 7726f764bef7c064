#version 460
// gemm_wg.comp: an experiment, not a kiln kernel. C = A x B (f16 [M, K] x
// [K, N] row-major, f32 accumulation, C f16) on workgroup-scope cooperative
// matrices (VK_NV_cooperative_matrix2's cooperativeMatrixWorkgroupScope)
// fed from shared memory as coopmat.comp feeds its subgroup fragments: each
// K step's tiles loaded into registers one step ahead, stored to shared
// (NS stages, rows padded by PADV vectors of eight halves), one workgroup
// matrix of A (BM x BK) and of B (BK x BN) loaded from there and
// multiplied into the BM x BN accumulator. BT=1: B given as [N, K], its
// tile kept K-major in shared memory and loaded column-major. LOADONLY=1:
// the tiles' loads, stores and barriers alone, no matrices (C is not the
// product). HYBRID=1: A's matrix loaded from memory by coopMatLoadTensorNV
// a step ahead, only B's tile through shared memory.
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = NT) in;
layout(push_constant) uniform Args { uint M, N, K; } p;
layout(binding = 0) readonly buffer A { uvec4 a[]; };
layout(binding = 0) readonly buffer A16 { float16_t a16[]; }; // HYBRID's view of A
layout(binding = 1) readonly buffer B { uvec4 b[]; };
layout(binding = 2) writeonly buffer C { float16_t c[]; };

#ifndef NS
#define NS 1
#endif
#ifndef PADV
#define PADV 1
#endif
#ifndef BT
#define BT 0
#endif
#define AS_STRIDE (BK / 8 + PADV)
#if BT // B given as [N, K] and its tile kept so: BN rows of BK halves, loaded column-major
#define BS_STRIDE (BK / 8 + PADV)
#define B_STAGE_ROWS BN
#define B_ROW_VECS (BK / 8)
#define B_LAYOUT gl_CooperativeMatrixLayoutColumnMajor
#else
#define BS_STRIDE (BN / 8 + PADV)
#define B_STAGE_ROWS BK
#define B_ROW_VECS (BN / 8)
#define B_LAYOUT gl_CooperativeMatrixLayoutRowMajor
#endif
const uint A_STAGE = BM * AS_STRIDE, B_STAGE = B_STAGE_ROWS * BS_STRIDE;
const uint A_VECS = BM * BK / 8, B_VECS = BK * BN / 8;
const uint LA = A_VECS / NT, LB = B_VECS / NT;
shared uvec4 As[NS * A_STAGE];
shared uvec4 Bs[NS * B_STAGE];
uvec4 ra[LA], rb[LB];

#ifndef HYBRID
#define HYBRID 0
#endif
void load(uint m0, uint n0, uint k0, uint tid) {
    [[unroll]] for (uint i = 0; i < (HYBRID != 0 ? 0u : LA); ++i) {
        const uint e = tid + i * NT, row = e / (BK / 8), v = e % (BK / 8);
        ra[i] = a[((m0 + row) * p.K + k0) / 8 + v];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT, row = e / B_ROW_VECS, v = e % B_ROW_VECS;
#if BT
        rb[i] = b[((n0 + row) * p.K + k0) / 8 + v];
#else
        rb[i] = b[((k0 + row) * p.N + n0) / 8 + v];
#endif
    }
}
void store(uint s, uint tid) {
    [[unroll]] for (uint i = 0; i < (HYBRID != 0 ? 0u : LA); ++i) {
        const uint e = tid + i * NT;
        As[s * A_STAGE + e / (BK / 8) * AS_STRIDE + e % (BK / 8)] = ra[i];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT;
        Bs[s * B_STAGE + e / B_ROW_VECS * BS_STRIDE + e % B_ROW_VECS] = rb[i];
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    load(m0, n0, 0, tid);
#if HYBRID // A's matrix loaded by the driver from memory, a step ahead
    tensorLayoutNV<2> la = createTensorLayoutNV(2);
    la = setTensorLayoutDimensionNV(la, p.M, p.K & ~7u);
    la = setTensorLayoutStrideNV(la, p.K & ~7u, 1);
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> fa, na;
    coopMatLoadTensorNV(fa, a16, 0, sliceTensorLayoutNV(la, m0, BM, 0, BK));
#define LOAD_A_AHEAD                                                                          \
        if (k0 + BK < p.K)                                                                    \
            coopMatLoadTensorNV(na, a16, 0, sliceTensorLayoutNV(la, m0, BM, k0 + BK, BK));
#else
#define LOAD_A_AHEAD
#endif
#define STEP(S)                                                                               \
    {                                                                                         \
        store(S, tid);                                                                        \
        barrier();                                                                            \
        LOAD_A_AHEAD                                                                          \
        if (k0 + BK < p.K)                                                                    \
            load(m0, n0, k0 + BK, tid);                                                       \
        MATRICES(S)                                                                           \
    }
#if LOADONLY // the tiles' traffic alone: no matrices
#define MATRICES(S)
#elif HYBRID
#define MATRICES(S)                                                                           \
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> fb;                      \
        coopMatLoad(fb, Bs, (S) * B_STAGE, BS_STRIDE, B_LAYOUT);                              \
        acc = coopMatMulAdd(fa, fb, acc);                                                     \
        fa = na;
#else
#define MATRICES(S)                                                                           \
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> fa;                      \
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> fb;                      \
        coopMatLoad(fa, As, (S) * A_STAGE, AS_STRIDE, gl_CooperativeMatrixLayoutRowMajor);    \
        coopMatLoad(fb, Bs, (S) * B_STAGE, BS_STRIDE, B_LAYOUT);                              \
        acc = coopMatMulAdd(fa, fb, acc);
#endif
#if NS == 1
    for (uint k0 = 0; k0 < p.K; k0 += BK) {
        STEP(0)
        barrier();
    }
#else // two stages, two steps an iteration (K a multiple of 2 BK), one barrier a step
    for (uint k0 = 0; k0 < p.K; k0 += BK) {
        STEP(0)
        k0 += BK;
        STEP(1)
    }
#endif
#if LOADONLY // keep the stores: one vector of the last tiles to C
    barrier();
    c[m0 * p.N + n0 + tid] = float16_t(unpackHalf2x16(As[tid].x ^ Bs[tid].y).x);
    return;
#endif
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> h =
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
    coopMatStore(h, c, (m0 * p.N + n0), p.N, gl_CooperativeMatrixLayoutRowMajor);
}
