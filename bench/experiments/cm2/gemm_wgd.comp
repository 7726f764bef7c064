#version 460
// gemm_wgd.comp: an experiment, not a kiln kernel. gemm_wg.comp (one shared
// stage, rows padded by a vector) with each K step's tiles loaded D steps
// ahead into D register sets (the K loop unrolled D times; K a multiple of
// D x BK): more bytes in flight for a workgroup that holds its SM alone
// (cm2-h200.txt item 9). LOADONLY=1: the tiles' traffic alone. MMA_FIRST=1:
// each step's multiply-add before the next loads in program order.
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

#ifndef LOADONLY
#define LOADONLY 0
#endif
#ifndef MMA_FIRST
#define MMA_FIRST 0
#endif
#define AS_STRIDE (BK / 8 + 1)
#define BS_STRIDE (BN / 8 + 1)
const uint LA = BM * BK / 8 / NT, LB = BK * BN / 8 / NT;
shared uvec4 As[BM * AS_STRIDE];
shared uvec4 Bs[BK * BS_STRIDE];
uvec4 ra[D][LA], rb[D][LB];

void load(uint d, uint m0, uint n0, uint k0, uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT, row = e / (BK / 8), v = e % (BK / 8);
        ra[d][i] = a[((m0 + row) * p.K + k0) / 8 + v];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT, row = e / (BN / 8), v = e % (BN / 8);
        rb[d][i] = b[((k0 + row) * p.N + n0) / 8 + v];
    }
}
void store(uint d, uint tid) {
    [[unroll]] for (uint i = 0; i < LA; ++i) {
        const uint e = tid + i * NT;
        As[e / (BK / 8) * AS_STRIDE + e % (BK / 8)] = ra[d][i];
    }
    [[unroll]] for (uint i = 0; i < LB; ++i) {
        const uint e = tid + i * NT;
        Bs[e / (BN / 8) * BS_STRIDE + e % (BN / 8)] = rb[d][i];
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    [[unroll]] for (uint d = 0; d < D; ++d)
        load(d, m0, n0, d * BK, tid);
    for (uint k0 = 0; k0 < p.K; k0 += D * BK) {
        [[unroll]] for (uint d = 0; d < D; ++d) {
            const uint k = k0 + d * BK;
            store(d, tid);
            barrier();
#if !MMA_FIRST
            if (k + D * BK < p.K)
                load(d, m0, n0, k + D * BK, tid);
#endif
#if !LOADONLY
            coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> fa;
            coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> fb;
            coopMatLoad(fa, As, 0, AS_STRIDE, gl_CooperativeMatrixLayoutRowMajor);
            coopMatLoad(fb, Bs, 0, BS_STRIDE, gl_CooperativeMatrixLayoutRowMajor);
            acc = coopMatMulAdd(fa, fb, acc);
#endif
#if MMA_FIRST // the next loads after the multiply-add in program order
            if (k + D * BK < p.K)
                load(d, m0, n0, k + D * BK, tid);
#endif
            barrier();
        }
    }
#if LOADONLY // keep the stores: one vector of the last tiles to C
    c[m0 * p.N + n0 + tid] = float16_t(unpackHalf2x16(As[tid].x ^ Bs[tid].y).x);
#else
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> h =
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
    coopMatStore(h, c, (m0 * p.N + n0), p.N, gl_CooperativeMatrixLayoutRowMajor);
#endif
}
