#version 460
// gemm_cm2.comp: an experiment, not a kiln kernel. C = A x B for f16 A
// [M, K] and B [K, N] (row-major) with f32 accumulation, C f16, through
// VK_NV_cooperative_matrix2: workgroup-scope matrices of BM x BN, the
// tiles loaded straight from memory by coopMatLoadTensorNV (the driver
// stages them). CEILING: the first step's tiles multiplied every step, no
// loads (the matrix units' rate for this tile). Compiled by a glslang newer
// than Debian 12's (bench/experiments/cm2/README.md).
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
#define UNROLL 4
#endif
#ifndef CEILING
#define CEILING 0
#endif

void main() {
    const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    tensorLayoutNV<2> la = createTensorLayoutNV(2);
    tensorLayoutNV<2> lb = createTensorLayoutNV(2);
    tensorLayoutNV<2> lc = createTensorLayoutNV(2);
    la = setTensorLayoutDimensionNV(la, p.M, p.K);
    lb = setTensorLayoutDimensionNV(lb, p.K, p.N);
    lc = setTensorLayoutDimensionNV(lc, p.M, p.N);
    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
#if CEILING
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> fa;
    coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> fb;
    coopMatLoadTensorNV(fa, a, 0, sliceTensorLayoutNV(la, m0, BM, 0, BK));
    coopMatLoadTensorNV(fb, b, 0, sliceTensorLayoutNV(lb, 0, BK, n0, BN));
    for (uint k0 = 0; k0 < p.K; k0 += BK * UNROLL) {
        [[unroll]] for (uint u = 0; u < UNROLL; ++u)
            acc = coopMatMulAdd(fa, fb, acc);
    }
#else
    for (uint k0 = 0; k0 < p.K; k0 += BK * UNROLL) {
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> fa;
            coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> fb;
            coopMatLoadTensorNV(fa, a, 0, sliceTensorLayoutNV(la, m0, BM, k0 + u * BK, BK));
            coopMatLoadTensorNV(fb, b, 0, sliceTensorLayoutNV(lb, k0 + u * BK, BK, n0, BN));
            acc = coopMatMulAdd(fa, fb, acc);
        }
    }
#endif
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> h =
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
    coopMatStoreTensorNV(h, c, 0, sliceTensorLayoutNV(lc, m0, BM, n0, BN));
}
