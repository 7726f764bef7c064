#version 460
// Experiment: workgroup-scope matrices loaded from memory by coopMatLoadTensorNV,
// with alignment hints and a deep unroll (as llama.cpp's mul_mm_cm2 does).
// BT=1: B given as [N, K] (K contiguous), read through a transposing view.
// AHEAD=1: each step's matrices loaded one step ahead (not unrolled).
// An experiment, not a kiln kernel (bench/experiments/cm2-h200.txt item 9).
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = NT) in;
layout(push_constant) uniform Args { uint M, N, K; } p;
layout(binding = 0) readonly buffer A { float16_t a[]; };
layout(binding = 1) readonly buffer B { float16_t b[]; };
layout(binding = 2) writeonly buffer C { float16_t c[]; };
#ifndef UNROLL
#define UNROLL 8
#endif
#ifndef HINT
#define HINT 1
#endif
#ifndef BT
#define BT 1
#endif
#ifndef XM
#define XM 0
#endif
void main() {
#if XM
    const uint bm = p.M / BM;
    const uint m0 = (gl_WorkGroupID.x % bm) * BM, n0 = (gl_WorkGroupID.x / bm) * BN;
#else
    const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
#endif
    uint K = p.K, N = p.N;
#if HINT
    K &= ~7u; N &= ~7u;
#endif
    tensorLayoutNV<2> la = createTensorLayoutNV(2);
    tensorLayoutNV<2> lb = createTensorLayoutNV(2);
    tensorLayoutNV<2> lc = createTensorLayoutNV(2);
    la = setTensorLayoutDimensionNV(la, p.M, K);
    la = setTensorLayoutStrideNV(la, K, 1);
#if BT
    lb = setTensorLayoutDimensionNV(lb, N, K);
    lb = setTensorLayoutStrideNV(lb, K, 1);
    tensorViewNV<2, false, 1, 0> tv = createTensorViewNV(2, false, 1, 0);
#else
    lb = setTensorLayoutDimensionNV(lb, K, N);
    lb = setTensorLayoutStrideNV(lb, N, 1);
#endif
    lc = setTensorLayoutDimensionNV(lc, p.M, N);
    lc = setTensorLayoutStrideNV(lc, N, 1);
    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
#if AHEAD // each step's matrices loaded one step ahead, explicitly
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> fa;
    coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> fb;
    coopMatLoadTensorNV(fa, a, 0, sliceTensorLayoutNV(la, m0, BM, 0, BK));
#if BT
    coopMatLoadTensorNV(fb, b, 0, sliceTensorLayoutNV(lb, n0, BN, 0, BK), tv);
#else
    coopMatLoadTensorNV(fb, b, 0, sliceTensorLayoutNV(lb, 0, BK, n0, BN));
#endif
    for (uint k0 = BK; k0 < K; k0 += BK) {
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> na;
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> nb;
        coopMatLoadTensorNV(na, a, 0, sliceTensorLayoutNV(la, m0, BM, k0, BK));
#if BT
        coopMatLoadTensorNV(nb, b, 0, sliceTensorLayoutNV(lb, n0, BN, k0, BK), tv);
#else
        coopMatLoadTensorNV(nb, b, 0, sliceTensorLayoutNV(lb, k0, BK, n0, BN));
#endif
        acc = coopMatMulAdd(fa, fb, acc);
        fa = na;
        fb = nb;
    }
    acc = coopMatMulAdd(fa, fb, acc);
#else
    uint k0 = 0;
    const uint iters = K / (BK * UNROLL);
    for (uint i = 0; i < iters; ++i) {
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> fa;
            coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> fb;
            coopMatLoadTensorNV(fa, a, 0, sliceTensorLayoutNV(la, m0, BM, k0, BK));
#if BT
            coopMatLoadTensorNV(fb, b, 0, sliceTensorLayoutNV(lb, n0, BN, k0, BK), tv);
#else
            coopMatLoadTensorNV(fb, b, 0, sliceTensorLayoutNV(lb, k0, BK, n0, BN));
#endif
            acc = coopMatMulAdd(fa, fb, acc);
            k0 += BK;
        }
    }
#endif
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> h =
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
    coopMatStoreTensorNV(h, c, 0, sliceTensorLayoutNV(lc, m0, BM, n0, BN));
}
