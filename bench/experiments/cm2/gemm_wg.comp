#version 460
// gemm_wg.comp: an experiment, not a kiln kernel. C = A x B (f16 [M, K] x
// [K, N] row-major, f32 accumulation, C f16) on workgroup-scope cooperative
// matrices (VK_NV_cooperative_matrix2's cooperativeMatrixWorkgroupScope)
// fed from shared memory as coopmat.comp feeds its subgroup fragments: each
// K step's tiles loaded into registers one step ahead, stored to shared
// (NS stages, rows padded by PADV vectors of eight halves), one workgroup
// matrix of A (BM x BK) and of B (BK x BN) loaded from there and
// multiplied into the BM x BN accumulator.
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = NT) in;
layout(push_constant) uniform Args { uint M, N, K; } p;
layout(binding = 0) readonly buffer A { uvec4 a[]; };
layout(binding = 1) readonly buffer B { uvec4 b[]; };
layout(binding = 2) writeonly buffer C { float16_t c[]; };

#ifndef NS
#define NS 1
#endif
#ifndef PADV
#define PADV 1
#endif
#define AS_STRIDE (BK / 8 + PADV)
#define BS_STRIDE (BN / 8 + PADV)
const uint A_STAGE = BM * AS_STRIDE, B_STAGE = BK * BS_STRIDE;
const uint A_VECS = BM * BK / 8, B_VECS = BK * BN / 8;
const uint LA = A_VECS / NT, LB = B_VECS / NT;
shared uvec4 As[NS * A_STAGE];
shared uvec4 Bs[NS * B_STAGE];
uvec4 ra[LA], rb[LB];

void load(uint m0, uint n0, uint k0, uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT, row = e / (BK / 8), v = e % (BK / 8);
        ra[i] = a[((m0 + row) * p.K + k0) / 8 + v];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT, row = e / (BN / 8), v = e % (BN / 8);
        rb[i] = b[((k0 + row) * p.N + n0) / 8 + v];
    }
}
void store(uint s, uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT;
        As[s * A_STAGE + e / (BK / 8) * AS_STRIDE + e % (BK / 8)] = ra[i];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT;
        Bs[s * B_STAGE + e / (BN / 8) * BS_STRIDE + e % (BN / 8)] = rb[i];
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    load(m0, n0, 0, tid);
#define STEP(S)                                                                               \
    {                                                                                         \
        store(S, tid);                                                                        \
        barrier();                                                                            \
        if (k0 + BK < p.K)                                                                    \
            load(m0, n0, k0 + BK, tid);                                                       \
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> fa;                      \
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> fb;                      \
        coopMatLoad(fa, As, (S) * A_STAGE, AS_STRIDE, gl_CooperativeMatrixLayoutRowMajor);    \
        coopMatLoad(fb, Bs, (S) * B_STAGE, BS_STRIDE, gl_CooperativeMatrixLayoutRowMajor);    \
        acc = coopMatMulAdd(fa, fb, acc);                                                     \
    }
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
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> h =
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
    coopMatStore(h, c, (m0 * p.N + n0), p.N, gl_CooperativeMatrixLayoutRowMajor);
}
