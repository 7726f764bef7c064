// common.glsl: what every kiln kernel shares.
//
// Tensors are reached through 64-bit device addresses that the runtime puts
// in push constants (up to 16 of them, 128 bytes), declared per kernel as
// `layout(push_constant) uniform Args { F32 out_; F32R in0; ... } args;`.
// Within one dispatch an output never shares bytes with an input (the memory
// planner guarantees it), so inputs are restrict and readonly.
//
// Buffer types by dtype: F32 I32 always (and V4, U4, U2: vec4, uvec4 and
// uvec2 views); F16 with NEED_F16 (16-bit storage), I64 with NEED_I64
// (int64), U8 and I8 with NEED_8BIT (8-bit storage; bool
// is U8 holding 0 or 1). The compiler defines the NEED_* a kernel uses and
// records the device features they require.
#extension GL_EXT_buffer_reference : require

// kiln compile --sync-check appends a main that declares the bindings as
// descriptors too and calls this kernel's (compile_spirv.c, sync_tail).
#ifdef KILN_SYNC_ARGS
#define main kiln_kernel_main
#endif

#define KILN_BUFFER(name, type, align)                                               \
    layout(buffer_reference, std430, buffer_reference_align = align) buffer name {   \
        type v[];                                                                    \
    };                                                                               \
    layout(buffer_reference, std430, buffer_reference_align = align) restrict readonly \
        buffer name##R {                                                             \
        type v[];                                                                    \
    };

KILN_BUFFER(F32, float, 4)
KILN_BUFFER(V4, vec4, 16)
KILN_BUFFER(I32, int, 4)
KILN_BUFFER(U32, uint, 4)
KILN_BUFFER(U4, uvec4, 16)
KILN_BUFFER(U2, uvec2, 8)

// Four halves read as one uvec2 (an f16vec4 without 16-bit storage).
vec4 kiln_half4(uvec2 u) { return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y)); }
#if defined(NEED_F16) && NEED_F16
#extension GL_EXT_shader_16bit_storage : require
KILN_BUFFER(F16, float16_t, 2)
#endif
#if defined(NEED_I64) && NEED_I64
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
KILN_BUFFER(I64, int64_t, 8)
#endif
#if defined(NEED_8BIT) && NEED_8BIT
#extension GL_EXT_shader_8bit_storage : require
KILN_BUFFER(U8, uint8_t, 1)
KILN_BUFFER(I8, int8_t, 1)
#endif

// Dynamic dimensions: a kernel whose sizes follow them (DYN 1) declares
// KILN_DIMS last in its Args; the compiler puts the address of the run's
// dimension values (int32, one per dimension) in push-constant slot 15, and
// writes sizes as expressions of KILN_DIM(i). Without DYN it is nothing.
#if defined(DYN) && DYN
#define KILN_DIMS layout(offset = 120) I32R kiln_dims_;
#define KILN_DIM(i) args.kiln_dims_.v[i]
#else
#define KILN_DIMS
#endif

// A matmul kernel's store of element (m, n) of C, batch offset cc. With a
// QKV split (SPLIT_N0, SPLIT_N1; the kernel declares outputs c1 and c2),
// columns [0, SPLIT_N0) go to c, the next SPLIT_N1 to c1 and the rest to
// c2, each its own row-major tensor, c1 and c2 from element SPLIT_BASE1
// and SPLIT_BASE2 on (0 unless set): row m of the batch at cc (M rows of N
// each, as C's batches lie) is row cc / N + m of each part.
#if defined(SPLIT_N0)
#ifndef SPLIT_BASE1 // c1 and c2 from these elements on (a decoder's cache state)
#define SPLIT_BASE1 0u
#endif
#ifndef SPLIT_BASE2
#define SPLIT_BASE2 0u
#endif
#define KILN_STORE_C(cc, m, n, val)                                                  \
    do {                                                                             \
        const uint row_ = (cc) / N + (m);                                            \
        if ((n) < SPLIT_N0)                                                          \
            args.c.v[row_ * SPLIT_N0 + (n)] = (val);                                 \
        else if ((n) < SPLIT_N0 + SPLIT_N1)                                          \
            args.c1.v[SPLIT_BASE1 + row_ * SPLIT_N1 + (n) - SPLIT_N0] = (val);        \
        else                                                                         \
            args.c2.v[SPLIT_BASE2 + row_ * (N - SPLIT_N0 - SPLIT_N1) + (n) - SPLIT_N0 - \
                      SPLIT_N1] = (val);                                             \
    } while (false)
#define KILN_SPLIT_OUTPUTS(T) T c1; T c2;
#else
#define KILN_STORE_C(cc, m, n, val) args.c.v[(cc) + (m) * N + (n)] = (val)
#define KILN_SPLIT_OUTPUTS(T)
#endif

// What the last workgroup of a dispatch to finish reads back (LAST_NORM in
// matvec_k.comp, SPLIT_LAST in matmul.comp and coopmat.comp, COMBINE_LAST
// in attention.comp): u32 counters
// (in the model's weights buffer; each workgroup bumps its own with
// atomicAdd, the last sets it back to zero) and f32 partial results, both
// coherent, so that the stores a workgroup makes before its
// memoryBarrierBuffer() and count are seen by the last one.
#if defined(SPLIT_LAST) && SPLIT_LAST || defined(LAST_NORM) && LAST_NORM || \
    defined(COMBINE_LAST) && COMBINE_LAST
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer KilnCounter {
    uint v[];
};
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer F32C {
    float v[];
};
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer V4C {
    vec4 v[];
};
#endif

// A product kernel's residual (a convolution's skip connection, HAS_RES),
// read as f16 where RES_F16 (declared after the split outputs).
#if defined(HAS_RES) && HAS_RES && defined(RES_F16) && RES_F16
#define KILN_RES_ARG F16R res;
#elif defined(HAS_RES) && HAS_RES
#define KILN_RES_ARG F32R res;
#else
#define KILN_RES_ARG
#endif

// An index tensor's element v into an axis of len: made non-negative
// (negative ones count from the end), -1 outside [-len, len); kiln_slot: -1
// outside [0, len), no counting from the end. i64 indices are compared
// before they narrow (2^32 + 1 is outside, not 1).
int kiln_index(int v, uint len) {
    if (v < 0)
        v += int(len);
    return (v < 0 || v >= int(len)) ? -1 : v;
}
int kiln_slot(int v, uint len) { return (v < 0 || v >= int(len)) ? -1 : v; }
#if defined(NEED_I64) && NEED_I64
int kiln_index(int64_t v, uint len) {
    if (v < 0)
        v += int64_t(len);
    return (v < 0 || v >= int64_t(len)) ? -1 : int(v);
}
int kiln_slot(int64_t v, uint len) { return (v < 0 || v >= int64_t(len)) ? -1 : int(v); }
#endif

// --guard (INDEX_CHECK): the first index outside its axis that a dispatch
// meets, into its report (16 bytes the run filled with the guard pattern):
// a marker, the index, the axis' size and the index's position. The runtime
// names the node (kiln_guard.index_node).
#ifdef INDEX_CHECK
#define KILN_REPORT_INDEX(rep, value, len, pos)                                   \
    if (atomicCompSwap(rep.v[0], 0xA5C3E1F7u, 1u) == 0xA5C3E1F7u) {              \
        rep.v[1] = uint(value);                                                   \
        rep.v[2] = uint(len);                                                     \
        rep.v[3] = uint(pos);                                                     \
    }
#else
#define KILN_REPORT_INDEX(rep, value, len, pos)
#endif

const float KILN_PI = 3.14159265358979323846;

float kiln_sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }

// tanh without overflow: exp of a non-positive argument only.
float kiln_tanh(float x) {
    if (abs(x) < 0.5)
        return tanh(x);
    float e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}

// erf: its Taylor series near 0 (where 1 - p * exp(-x^2) would cancel), and
// Abramowitz and Stegun 7.1.26 elsewhere; absolute error below 2e-7.
float kiln_erf(float x) {
    float ax = abs(x);
    if (ax < 0.5) {
        float x2 = x * x;
        return 1.1283791670955126 * x *
               (1.0 + x2 * (-1.0 / 3.0 + x2 * (0.1 + x2 * (-1.0 / 42.0 +
               x2 * (1.0 / 216.0 + x2 * (-1.0 / 1320.0))))));
    }
    float t = 1.0 / (1.0 + 0.3275911 * ax);
    float p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 +
              t * (-1.453152027 + t * 1.061405429))));
    return sign(x) * (1.0 - p * exp(-x * x));
}

// Drivers guarantee sin, cos and tan only on [-pi, pi] (SPIR-V's precision
// rules): reduce the argument first, in two steps so the reduction itself
// stays accurate (Cody and Waite).
float kiln_reduce_angle(float x) {
    float k = round(x * 0.15915494309189535);
    return (x - k * 6.28125) - k * 0.0019353071795864769;
}
float kiln_sin(float x) { return sin(kiln_reduce_angle(x)); }
float kiln_cos(float x) { return cos(kiln_reduce_angle(x)); }
float kiln_tan(float x) { return tan(kiln_reduce_angle(x)); }

// gelu with erf (exact form): x * Phi(x).
float kiln_gelu(float x) { return 0.5 * x * (1.0 + kiln_erf(x * 0.70710678118654752)); }

// gelu, tanh approximation.
float kiln_gelu_tanh(float x) {
    return 0.5 * x * (1.0 + kiln_tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

// log(1 + exp(x)) without overflow.
float kiln_softplus(float x) { return max(x, 0.0) + log(1.0 + exp(-abs(x))); }

// pow with a negative base and an integral exponent, as numpy does.
float kiln_pow(float a, float b) {
    if (a < 0.0 && b == floor(b)) {
        float r = pow(-a, b);
        return mod(b, 2.0) == 0.0 ? r : -r;
    }
    return pow(a, b);
}

// Remainders: floor-mod takes the divisor's sign (Python, ONNX fmod=0);
// trunc-mod the dividend's (C fmod, ONNX fmod=1).
// a - b * floor(a / b); for an infinite b, ONNX Mod 28's rule (a when a and
// b agree in sign, else b) where the formula gives NaN.
float kiln_mod(float a, float b) {
    if (isinf(b) && !isinf(a) && !isnan(a))
        return a == 0.0 || (a < 0.0) == (b < 0.0) ? a : b;
    return a - b * floor(a / b);
}

// C's fmod: a - b * trunc(a / b); a for an infinite b.
float kiln_fmod(float a, float b) {
    return isinf(b) && !isinf(a) ? a : a - b * trunc(a / b);
}
