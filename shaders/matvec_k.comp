#version 460
// matvec_k.comp: C = A x B for few rows of A (M <= 16: decode steps, small
// batches) with B K-major: column n of B is K contiguous elements starting
// at element n * B_SN (B_SK is 1). The compiler stores the weights of
// decode-shaped products so (quantize.c), in any --weights format; gemm's
// trans_b operand and attention's transposed keys come so. Each column is
// then one contiguous read, where matvec.comp reads a row-major B 16 to 128
// bytes a row: the product runs at the memory's bandwidth.
//
// A workgroup of WG invocations computes CN consecutive columns for all M
// rows. Invocation i takes chunks i, i + WG, ... of KV consecutive k: 16
// bytes of each column (a vec4 of f32, eight halves, sixteen 8-bit codes
// or thirty-two 4-bit ones, whose QBLOCK block has one scale), turns them
// into f32 four at a time (kiln_w4) and multiplies them with the same four
// k of every row of A; the chunk's sums are then scaled once. The M x CN
// partial sums then meet: a tree through shared memory, or (KILN_SUBGROUP,
// the build for devices with subgroup arithmetic) one subgroupAdd each and
// a sum over the subgroups. The sum goes through product.glsl's epilogue.
//
// Quantized B (weights.glsl's formats): element (k, n) is code n * B_SN + k
// and its scale (and zero point) index n * NBLK + k / QBLOCK.
//
// UNROLL U (default 1): each pass of an invocation's loop loads U chunks of
// every column before it multiplies any, U * CN loads of 16 bytes in
// flight (for tuning: KILN_MATVEC_K=WG,CN,U).
//
// TEAMS T (default 1): the workgroup is T teams of TL = WG / T invocations,
// each team its own CN columns (the workgroup's T * CN), K split over its
// TL invocations: more chunks an invocation, fewer workgroups. A_SHARED:
// the workgroup first copies A's rows (all M x K, as f32) into shared
// memory with whole-vector loads, and its invocations read their chunks'
// k from there (one read of A from memory a workgroup, not a strided one
// an invocation; each chunk's run of A padded by one vec4 where it is two
// or more, so that the invocations of a quarter subgroup, which read
// chunks KV apart, meet different banks). The first chunks' loads of B are
// issued before the copy.
//
// LAST_NORM (a decoding step's one row, lower_matmul.c, norm_after_product):
// a layer_norm or rms_norm of C plus a residual follows in the same kernel,
// done by the workgroup that finishes last (last_norm); the norm's own
// dispatch then runs only for more rows.
//
// GLU (a decoding step's one row, lower_matmul.c, glu_after_product): the
// product is a gated MLP's gate and up projections side by side (a QKV
// split of two parts of GLU_N columns each) and a SiLU of one times the
// other follows; a workgroup computes CN / 2 columns of each part, the
// same ones, and stores silu(gate) * up (GLU_SILU_FIRST: the gate is the
// first part) to args.glu, [M, GLU_N]: the elementwise dispatch then runs
// only for more rows, the parts themselves are not stored.
//
// ROPE_D (a decoding step's one row, lower_attention.c, rope_after_product):
// the product's parts are heads of ROPE_D columns (a QKV product), and the
// rotary embedding of the first part (ROPE0) and/or the second (ROPE1)
// follows: a workgroup computes CH = CN / 2 pairs (c, c + ROPE_D / 2) of one
// head, and stores a rotated part's pair as y1 = x1 cos[j] - x2 sin[j], y2 =
// x2 cos[j] + x1 sin[j] (j = c % ROPE_D, the first row of the tables
// args.rc and args.rs) to args.r0 (args.r1 at ROPE1_BASE: a decoder's key
// cache), the other parts as a QKV split stores them; the rope's own
// dispatch then runs only for more rows.
//
// A_Q8 (8- and 4-bit codes, kiln compile --activations int8): A's rows are
// quantized to 8-bit integers in shared memory first, each run of AB = 32
// k with its own scale (the largest |a| over 127, rounded to even), and a
// chunk's codes times A become integer dot products of four bytes, exact;
// the chunk's sum is then scaled by the weights' scale times A's. The
// KILN_SUBGROUP build multiplies four bytes in one instruction (SPIR-V
// OpSDot, the compiler then marks it as needing KILN_FEATURE_INTDOT), the
// other makes the same integer sums a byte at a time.
//
// A_H2 (fp8 codes, --precision f16): A's rows are staged in shared memory
// as f16 pairs, each chunk's scaled by a power of two, and the codes,
// moved into halves by their bits, multiply them in f16 pairs (four
// products a half summed in f16), in teams as A_Q8's: no conversion to f32
// a code.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
#include "weights.glsl"
#if KILN_SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
// F16_PAIRS (8- and 4-bit codes, f16 A): the codes times A in f16 pairs
// (chunk_halves); A_H2 (fp8 codes, f16 A): the same with A's rows staged
// in shared memory as pairs first (stage_h2, chunk_h2). Both in the
// KILN_SUBGROUP build only, which the compiler then marks as needing f16
// arithmetic too; the other build sums in f32 (chunk_f32).
#ifndef F16_PAIRS
#define F16_PAIRS 0
#endif
#ifndef A_H2
#define A_H2 0
#endif
#if KILN_SUBGROUP && (F16_PAIRS || A_H2)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#if KILN_SUBGROUP && F16_PAIRS
#define HALVES 1
#else
#define HALVES 0
#endif
#if KILN_SUBGROUP && A_H2
#define H2 1
#else
#define H2 0
#endif

layout(local_size_x = WG) in;

#if W_FORMAT == 0
#define KV 4u
#define BT V4R
#define RAW vec4
#else
#if W_FORMAT == 1
#define KV 8u
#elif W_FORMAT == 4 || W_FORMAT == 5
#define KV 32u
#else
#define KV 16u
#endif
#define BT U4R
#define RAW uvec4
#endif

// A four elements a load where A_VEC (its rows and batches in whole
// vectors): an 8-byte uvec2 of halves (U2R) or a vec4 of f32 (V4R); else
// (f16 rows not in whole vectors) one half at a time.
#if A_VEC && A_F16
#define A_BUF U2R
#define LOAD_A4(e) kiln_h4(args.a, e)
#elif A_VEC
#define A_BUF V4R
#define LOAD_A4(e) kiln_f4(args.a, e)
#else
#define A_BUF F16R
#define LOAD_A4(e) vec4(float(args.a.v[e]), float(args.a.v[(e) + 1]), \
                        float(args.a.v[(e) + 2]), float(args.a.v[(e) + 3]))
#endif
#if C_F16
#define C_BUF F16
#define C_T float16_t
#else
#define C_BUF F32
#define C_T float
#endif
#ifndef LAST_NORM
#define LAST_NORM 0
#endif
#ifndef GLU
#define GLU 0
#endif
#ifndef ROPE_D
#define ROPE_D 0
#endif
#define PAIRS (GLU || ROPE_D > 0) // a workgroup's columns as CH pairs
#ifndef A_Q8
#define A_Q8 0
#endif
#if A_Q8
// The codes as the dot products read them. int8: as they are. int4: each
// nibble in the top half of a byte (16 q, a signed byte), the sums then
// over Q8_UNIT = 16. The asymmetric formats' unsigned codes u: int8-asym's
// as u - 128 (XOR 0x80 a byte), int4-asym's as they are (a nibble a byte);
// sum a (u - z) = sum a u' - (z + Q8_SHIFT) sum a, sum a from the staging
// (sqsum).
#if W_FORMAT == 3
#define Q8_FLIP 0x80808080u
#define Q8_SHIFT -128
#else
#define Q8_FLIP 0u
#define Q8_SHIFT 0
#endif
#define Q8_ASYM (W_FORMAT == 3 || W_FORMAT == 5)
#if W_FORMAT == 4
const float Q8_UNIT = 16.0;
#else
const float Q8_UNIT = 1.0;
#endif
#if KILN_SUBGROUP // OpSDot: four signed bytes times four, summed
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018],
                  id = 4450)
int kiln_sdot(uint a, uint b, spirv_literal int packed_4x8); // PackedVectorFormat4x8Bit 0
int kiln_dot4(uint a, uint b) { return kiln_sdot(a, b, 0); }
#else
int kiln_dot4(uint a, uint b) {
    int s = 0;
    [[unroll]] for (int i = 0; i < 32; i += 8)
        s += bitfieldExtract(int(a), i, 8) * bitfieldExtract(int(b), i, 8);
    return s;
}
#endif
#endif
#ifndef R0_BUF // a part not rotated: its slot unused
#define R0_BUF F32
#define R0_T float
#endif
#ifndef R1_BUF
#define R1_BUF F32
#define R1_T float
#endif
#if LAST_NORM // C read back by the last workgroup: coherent (bypasses caches)
#if C_F16
#define C_ALIGN 2
#else
#define C_ALIGN 4
#endif
layout(buffer_reference, std430, buffer_reference_align = C_ALIGN) coherent buffer CCoherent {
    C_T v[];
};
#undef C_BUF
#define C_BUF CCoherent
#endif

// Elements e to e + 3 (e a multiple of 4) of a float tensor as f32: halves
// in a uvec2 (kiln_h4), f32 in a vec4 (kiln_f4).
vec4 kiln_h4(U2R b, uint e) {
    const uvec2 u = b.v[e / 4];
    return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
}
vec4 kiln_f4(V4R b, uint e) { return b.v[e / 4]; }

layout(push_constant) uniform Args {
    C_BUF c;
    A_BUF a;
    BT b;
    F32R bias;
    F32R bscale; // quantized B only
    U32R bzero;
    KILN_SPLIT_OUTPUTS(C_BUF) // QKV split (common.glsl)
#if GLU
    GLU_BUF glu;
#endif
#if ROPE_D
    R0_BUF r0;
    R1_BUF r1;
    RC_BUF rc;
    RS_BUF rs;
#endif
#if LAST_NORM
#ifndef SPLIT_N0
    F32R pad6, pad7; // the split's slots
#endif
    KilnCounter count;
    NRES_BUF nres;
    NG_BUF ngamma;
    NB_BUF nbeta;
    NY_BUF ny;
    NSUM_BUF nsum;
#endif
    KILN_DIMS
} args;

#include "product.glsl"
#ifndef MROWS
#define MROWS M // the rows of this run: M at most (dynamic dims)
#endif
const uint CHUNKS = K / KV;
const uint OUTS = M * CN;

// The column that a workgroup's column c (0 to CN - 1) computes, n0 the
// workgroup's first: a ragged last workgroup reads the last column again.
// GLU: c < CN / 2 the first part's column n0 + c, the rest the second
// part's of the same index. ROPE_D: n0 + c % CH a pair of a head's columns
// (c, c + ROPE_D / 2), the first of them for c < CN / 2.
#if GLU
const uint CH = CN / 2; // columns of each part a workgroup
uint column(uint n0, uint c) {
    return min(n0 + c % CH, GLU_N - 1) + (c < CH ? 0 : GLU_N);
}
#elif ROPE_D
const uint CH = CN / 2, HALF = ROPE_D / 2, NPAIRS = N / 2;
uint pair_column(uint u) { return u / HALF * ROPE_D + u % HALF; }
uint column(uint n0, uint c) {
    return pair_column(min(n0 + c % CH, NPAIRS - 1)) + (c < CH ? 0 : HALF);
}
#else
const uint CH = CN;
uint column(uint n0, uint c) { return min(n0 + c, N - 1); }
#endif

#include "matvec_decode.glsl"

#ifndef UNROLL
#define UNROLL 1
#endif

// Chunk ch of the workgroup's CN columns: the raw 16 bytes of each, its
// scale and its offsets (kiln_w4's zo).
struct Chunk {
    RAW raw[CN];
    float s[CN];
    vec4 zo[CN];
#if A_Q8 && Q8_ASYM
    int zq[CN]; // the zero point in the codes as A_Q8 reads them (kiln_code_word)
#endif
};

Chunk load_chunk(uint cb, uint n0, uint ch) {
    Chunk q;
    const uint k = ch * KV;
    [[unroll]] for (uint c = 0; c < CN; ++c) {
        const uint col = column(n0, c);
        q.raw[c] = args.b.v[(cb + col * B_SN + k) / KV];
#if W_FORMAT >= 2
        q.s[c] = args.bscale.v[col * NBLK + k / QBLOCK] * FP8_UNIT;
#else
        q.s[c] = 1.0;
#endif
#if W_FORMAT == 3 || W_FORMAT == 5
        const uint z = kiln_byte(args.bzero, col * NBLK + k / QBLOCK);
#if A_Q8
        q.zq[c] = int(z) + Q8_SHIFT;
#endif
        q.zo[c] = kiln_offsets(float(z));
#elif defined(ZERO)
        q.zo[c] = kiln_offsets(ZERO);
#else
        q.zo[c] = vec4(0.0);
#endif
    }
    return q;
}

#ifndef TEAMS
#define TEAMS 1
#endif
#ifndef A_SHARED
#define A_SHARED 0
#endif
const uint TL = WG / TEAMS; // a team's invocations
#if A_SHARED
// A's rows in shared memory: vec4 u of a row (elements 4u to 4u + 3) at
// a_slot(u), a chunk's SEG vec4s followed by PADU unused.
const uint SEG = KV / 4, PADU = SEG >= 2 ? 1 : 0, ROWU = K / 4 / SEG * (SEG + PADU);
shared vec4 sa[M * ROWU];
uint a_slot(uint u) { return u / SEG * (SEG + PADU) + u % SEG; }
// Copies the run's rows of A (batch at ca) into sa.
void stage_a(uint ca) {
    for (uint u = gl_LocalInvocationID.x; u < MROWS * (K / 4); u += WG) {
        const uint m = u / (K / 4), v = u % (K / 4);
        sa[m * ROWU + a_slot(v)] = LOAD_A4(ca + m * A_SM + 4 * v);
    }
}
#define A4(ca, m, e) sa[(m) * ROWU + a_slot((e) / 4)]
#else
#define A4(ca, m, e) LOAD_A4((ca) + (m) * A_SM + (e))
#endif

#if A_Q8
#include "matvec_q8.glsl"
#endif

#if HALVES
// HALVES: a chunk's codes become halves two at a time: ORed into the
// mantissa of the half 1024 (0x6400), a code at bits 0 to 7 of a 16-bit
// half of a word (a byte, or a nibble at bits 0 to 3) makes 1024 + q (a
// nibble at bits 4 to 7: 1024 + 16 q), and one fma less the offset leaves
// w = (q - z) * UNIT exactly: UNIT 1 for 4-bit codes (|w| <= 15), 1/32 for
// 8-bit ones (|w| < 8). A's halves are paired to match (a nibble's pair
// is k and k + 4 of a word's eight, a byte's k and k + 2 of its four).
// Each half of a pair sums four products w * a in f16, then joins the
// chunk's f32 sum. Safe while each row's largest |a| in the chunk lies in
// [A_LO, A_HI]: 4 * 15 * 1024 < 65504 (no overflow), and the largest
// products stay normal halves (at least 2^-11); a chunk outside (or not
// finite) is summed in f32 instead (add_chunk). The products round to
// halves: about 1e-3 of the sum of their magnitudes.
#if BITS == 4
const float UNIT = 1.0;
#else
const float UNIT = 1.0 / 32.0;
#endif
const float A_LO = 1.0 / 64.0, A_HI = 1024.0;
f16vec2 kiln_h2(uint v) { return unpackFloat2x16(v); }
f16vec2 kiln_h2(float v) { return f16vec2(float16_t(v)); }

// The zero point z of a chunk's offsets zo (kiln_offsets).
float kiln_zero(vec4 zo) {
#if BITS == 4
    return zo[3] - 2048.0;
#else
    return zo[2];
#endif
}

// Chunk's (k on) sums of w * a into d, over UNIT (as add_chunk's); false
// (d then partial) where a row's A leaves [A_LO, A_HI].
bool chunk_halves(uint ca, uint k, Chunk q, inout float d[M][CN]) {
    const uint MAG = 0x64006400u;
    // w = h - lo (a nibble at bits 0 to 3), fma(h, mul, -hi) (bits 4 to 7),
    // fma(h, mul, -lo) (a byte)
#if BITS == 4
    const f16vec2 mul = kiln_h2(1.0 / 16.0);
    f16vec2 lo[CN], hi[CN];
    [[unroll]] for (uint c = 0; c < CN; ++c) {
        const float z = kiln_zero(q.zo[c]);
        lo[c] = kiln_h2(1024.0 + z);
        hi[c] = kiln_h2(64.0 + z);
    }
#else
    const f16vec2 mul = kiln_h2(UNIT);
    f16vec2 lo[CN];
    [[unroll]] for (uint c = 0; c < CN; ++c)
        lo[c] = kiln_h2(32.0 + kiln_zero(q.zo[c]) / 32.0);
#endif
    f16vec2 amax[M];
    [[unroll]] for (uint m = 0; m < M; ++m)
        amax[m] = f16vec2(0.0);
    [[unroll]] for (uint t = 0; t < KV / 8; ++t) { // eight k a step
        f16vec2 w[CN][4];
        [[unroll]] for (uint c = 0; c < CN; ++c) {
#if BITS == 4
            const uint x = q.raw[c][t] ^ FLIP, y = x >> 8;
            w[c][0] = kiln_h2((x & 0x000F000Fu) | MAG) - lo[c];           // k 0, 4
            w[c][1] = fma(kiln_h2((x & 0x00F000F0u) | MAG), mul, -hi[c]);    // 1, 5
            w[c][2] = kiln_h2((y & 0x000F000Fu) | MAG) - lo[c];           // 2, 6
            w[c][3] = fma(kiln_h2((y & 0x00F000F0u) | MAG), mul, -hi[c]);    // 3, 7
#else
            const uint x0 = q.raw[c][2 * t] ^ FLIP, x1 = q.raw[c][2 * t + 1] ^ FLIP;
            w[c][0] = fma(kiln_h2((x0 & 0x00FF00FFu) | MAG), mul, -lo[c]);        // k 0, 2
            w[c][1] = fma(kiln_h2(((x0 >> 8) & 0x00FF00FFu) | MAG), mul, -lo[c]); // 1, 3
            w[c][2] = fma(kiln_h2((x1 & 0x00FF00FFu) | MAG), mul, -lo[c]);        // 4, 6
            w[c][3] = fma(kiln_h2(((x1 >> 8) & 0x00FF00FFu) | MAG), mul, -lo[c]); // 5, 7
#endif
        }
        [[unroll]] for (uint m = 0; m < M; ++m) {
            if (m < MROWS) {
                const uint e = (ca + m * A_SM + k + 8u * t) / 4;
                const uvec2 u0 = args.a.v[e], u1 = args.a.v[e + 1]; // k 0-3, 4-7
                f16vec2 a[4];
#if BITS == 4
                a[0] = kiln_h2((u0.x & 0xFFFFu) | (u1.x << 16));
                a[1] = kiln_h2((u0.x >> 16) | (u1.x & 0xFFFF0000u));
                a[2] = kiln_h2((u0.y & 0xFFFFu) | (u1.y << 16));
                a[3] = kiln_h2((u0.y >> 16) | (u1.y & 0xFFFF0000u));
#else
                a[0] = kiln_h2((u0.x & 0xFFFFu) | (u0.y << 16));
                a[1] = kiln_h2((u0.x >> 16) | (u0.y & 0xFFFF0000u));
                a[2] = kiln_h2((u1.x & 0xFFFFu) | (u1.y << 16));
                a[3] = kiln_h2((u1.x >> 16) | (u1.y & 0xFFFF0000u));
#endif
                amax[m] = max(amax[m], max(max(abs(a[0]), abs(a[1])),
                                           max(abs(a[2]), abs(a[3]))));
                [[unroll]] for (uint c = 0; c < CN; ++c) {
                    f16vec2 s = w[c][0] * a[0];
                    s = fma(w[c][1], a[1], s);
                    s = fma(w[c][2], a[2], s);
                    s = fma(w[c][3], a[3], s);
                    const vec2 f = vec2(s);
                    d[m][c] += f.x + f.y;
                }
            }
        }
    }
    bool ok = true;
    [[unroll]] for (uint m = 0; m < M; ++m) {
        const float am = max(float(amax[m].x), float(amax[m].y));
        ok = ok && (m >= MROWS || (am >= A_LO && am <= A_HI));
    }
    [[unroll]] for (uint m = 0; m < M; ++m)
        [[unroll]] for (uint c = 0; c < CN; ++c)
            d[m][c] *= 1.0 / UNIT;
    return ok;
}
#endif

#if H2
// H2 (A_H2: fp8 codes, f16 A): A's rows in shared memory as f16 pairs,
// paired as a code word's bytes (k and k + 2, k + 1 and k + 3): chunk ch
// of row m (16 k) at sh[m * HROW + 3 ch], two uvec4s of 8 k each, (a0,
// a2), (a1, a3), (a4, a6), (a5, a7); the third slot unused, so that the
// invocations of a quarter subgroup, which read chunks apart, meet
// different banks. Each chunk's halves are scaled by a power of two that
// puts its largest |a| in [1, 2) (exact, but for elements under 2^-14 of
// it, which may lose low bits as subnormal halves); shf[m * CHUNKS + ch]
// is the factor that undoes it, -1 where the chunk holds an infinity (it
// is then summed in f32 from A in memory, add_chunk: a large finite
// element beside it could overflow a half; a NaN stays a NaN in halves).
// Not 0: a chunk left unstaged by mistake (shared memory often starts
// zeroed) would then be summed from memory and hide the mistake.
const uint HROW = CHUNKS * 3u;
shared uvec4 sh[M * HROW];
shared float shf[M * CHUNKS];

// Stages the run's rows of A (batch at ca) into sh and shf: an invocation
// a chunk of a row.
void stage_h2(uint ca) {
    for (uint u = gl_LocalInvocationID.x; u < MROWS * CHUNKS; u += WG) {
        const uint m = u / CHUNKS, ch = u % CHUNKS;
        vec4 v[4];
        float most = 0.0;
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
            v[i] = LOAD_A4(ca + m * A_SM + ch * KV + 4u * i);
            const vec4 av = abs(v[i]);
            most = max(most, max(max(av.x, av.y), max(av.z, av.w)));
        }
        int e;
        frexp(most, e); // most = f 2^e, f in [0.5, 1)
        const bool scaled = most > 0.0 && !isinf(most);
        const float up = scaled ? ldexp(1.0, 1 - e) : 1.0;
        shf[u] = isinf(most) ? -1.0 : scaled ? ldexp(1.0, e - 1) : 1.0;
        [[unroll]] for (uint j = 0; j < 2u; ++j) {
            const vec4 x = v[2u * j] * up, y = v[2u * j + 1u] * up;
            sh[m * HROW + 3u * ch + j] =
                uvec4(packHalf2x16(x.xz), packHalf2x16(x.yw), packHalf2x16(y.xz),
                      packHalf2x16(y.yw));
        }
    }
}

// The fp8 codes of a word as two f16 pairs, bytes 0 and 2 (even) and 1
// and 3 (odd), times H2_UNIT: e4m3's magnitude moved under an f16's sign
// (as kiln_w4: 2^-8, FP8_UNIT), e5m2's the top byte of an f16 times
// 2^-14: at most 1.75 and 3.5, so that four products with A's halves in
// [-2, 2] and their sum stay far from an f16's largest.
#if W_FORMAT == 6
const float H2_UNIT = 1.0; // FP8_UNIT in the scale makes up the 2^-8
#else
const float H2_UNIT = 16384.0;
#endif
void kiln_fp8_pairs(uint x, out f16vec2 even, out f16vec2 odd) {
#if W_FORMAT == 6
    odd = unpackFloat2x16((x & 0x80008000u) | ((x >> 1) & 0x3F803F80u));
    even = unpackFloat2x16(((x << 8) & 0x80008000u) | ((x << 7) & 0x3F803F80u));
#else
    const f16vec2 unit = f16vec2(float16_t(1.0 / 16384.0));
    odd = unpackFloat2x16(x & 0xFF00FF00u) * unit;
    even = unpackFloat2x16((x << 8) & 0xFF00FF00u) * unit;
#endif
}

// Chunk ch's (16 k) sums of codes times A into d, as add_chunk's: the
// codes times A's staged halves in f16 pairs, four products a half summed
// in f16, then in f32 times the chunk's factor; false (d then partial)
// where a row's chunk of A holds an infinity.
bool chunk_h2(uint ch, Chunk q, inout float d[M][CN]) {
    f16vec2 s[M][CN][2];
    [[unroll]] for (uint m = 0; m < M; ++m)
        [[unroll]] for (uint c = 0; c < CN; ++c)
            s[m][c][0] = s[m][c][1] = f16vec2(0.0);
    [[unroll]] for (uint i = 0; i < 4u; ++i) { // a word (four k) a step
        f16vec2 we[CN], wo[CN];
        [[unroll]] for (uint c = 0; c < CN; ++c)
            kiln_fp8_pairs(q.raw[c][i], we[c], wo[c]);
        [[unroll]] for (uint m = 0; m < M; ++m) {
            if (m < MROWS) {
                const uvec4 av = sh[m * HROW + 3u * ch + i / 2u];
                const f16vec2 ae = unpackFloat2x16((i & 1u) != 0u ? av.z : av.x);
                const f16vec2 ao = unpackFloat2x16((i & 1u) != 0u ? av.w : av.y);
                [[unroll]] for (uint c = 0; c < CN; ++c) {
                    s[m][c][i / 2u] = fma(we[c], ae, s[m][c][i / 2u]);
                    s[m][c][i / 2u] = fma(wo[c], ao, s[m][c][i / 2u]);
                }
            }
        }
    }
    bool ok = true;
    [[unroll]] for (uint m = 0; m < M; ++m) {
        if (m < MROWS) {
            const float f = shf[m * CHUNKS + ch];
            ok = ok && f >= 0.0;
            [[unroll]] for (uint c = 0; c < CN; ++c) {
                const vec2 t = vec2(s[m][c][0]) + vec2(s[m][c][1]);
                d[m][c] += (t.x + t.y) * (f * H2_UNIT);
            }
        }
    }
    return ok;
}
#endif

// Chunk's (k on) sums of codes (less their zero point) times A into d, in
// f32.
void chunk_f32(uint ca, uint k, Chunk q, inout float d[M][CN]) {
    [[unroll]] for (uint p = 0; p < KV / 4; ++p) {
        vec4 w[CN];
        [[unroll]] for (uint c = 0; c < CN; ++c)
            w[c] = kiln_w4(q.raw[c], p, q.zo[c]);
        [[unroll]] for (uint m = 0; m < M; ++m) {
            if (m < MROWS) {
                const vec4 av = A4(ca, m, k + 4 * p);
                [[unroll]] for (uint c = 0; c < CN; ++c)
                    d[m][c] += dot(av, w[c]);
            }
        }
    }
}

// Chunk ch's products with A's rows, scaled once, into acc.
void add_chunk(uint ca, uint ch, Chunk q, inout float acc[M][CN]) {
#if A_Q8
    chunk_q8(ch, q, acc);
#else
    const uint k = ch * KV;
    float d[M][CN]; // this chunk's sums of weights (codes) times A
    [[unroll]] for (uint m = 0; m < M; ++m)
        [[unroll]] for (uint c = 0; c < CN; ++c)
            d[m][c] = 0.0;
#if HALVES || H2
#if HALVES
    if (!chunk_halves(ca, k, q, d)) { // A out of the halves' range: again in f32
#else
    if (!chunk_h2(ch, q, d)) { // A holds an infinity: again in f32
#endif
        [[unroll]] for (uint m = 0; m < M; ++m)
            [[unroll]] for (uint c = 0; c < CN; ++c)
                d[m][c] = 0.0;
        chunk_f32(ca, k, q, d);
    }
#else
    chunk_f32(ca, k, q, d);
#endif
    [[unroll]] for (uint m = 0; m < M; ++m)
        [[unroll]] for (uint c = 0; c < CN; ++c)
            acc[m][c] = fma(q.s[c], d[m][c], acc[m][c]);
#endif
}

// Stores output o (0 to M * CN - 1, row-major over M x CN) of a team's
// columns from n0, whose sum v is, of the batch at cc of C; GLU (one
// batch): output o (0 to M * CH - 1) of row m, whose parts' sums are v
// and w.
void store(uint cc, uint n0, uint o, float v) {
    const uint m = o / CN, col = n0 + o % CN;
    if (m < MROWS && col < N)
        store_c(cc, m, col, v);
}
#if GLU
void store_glu(uint n0, uint o, float v, float w) {
    const uint m = o / CH, col = n0 + o % CH;
    if (m >= MROWS || col >= GLU_N)
        return;
    const float a = epilogue_value(m, col, 0u, v), b = epilogue_value(m, GLU_N + col, 0u, w);
#if GLU_SILU_FIRST
    const float y = a * kiln_sigmoid(a) * b;
#else
    const float y = a * b * kiln_sigmoid(b);
#endif
    args.glu.v[m * GLU_N + col] = GLU_T(y);
}
void store_pair(uint cc, uint n0, uint o, float v, float w) { store_glu(n0, o, v, w); }
#elif ROPE_D
#ifndef ROPE0
#define ROPE0 0
#endif
#ifndef ROPE1
#define ROPE1 0
#endif
#ifndef ROPE1_BASE
#define ROPE1_BASE 0u
#endif
// Pair o (0 to M * CH - 1, row-major over M x CH) of row m, its columns'
// sums v and w: rotated where its part is (one batch), else stored.
void store_pair(uint cc, uint n0, uint o, float v, float w) {
    const uint m = o / CH, u = n0 + o % CH;
    if (m >= MROWS || u >= NPAIRS)
        return;
    const uint c1 = pair_column(u), c2 = c1 + HALF, j = u % HALF;
    const uint part = c1 < SPLIT_N0 ? 0u : c1 < SPLIT_N0 + SPLIT_N1 ? 1u : 2u;
    if ((part == 0u && ROPE0 != 0) || (part == 1u && ROPE1 != 0)) {
        const float x1 = epilogue_value(m, c1, 0u, v), x2 = epilogue_value(m, c2, 0u, w);
        const float cs = float(args.rc.v[j]), sn = float(args.rs.v[j]);
        const float y1 = x1 * cs - x2 * sn, y2 = x2 * cs + x1 * sn;
        if (part == 0u) {
            args.r0.v[m * SPLIT_N0 + c1] = R0_T(y1);
            args.r0.v[m * SPLIT_N0 + c2] = R0_T(y2);
        } else {
            args.r1.v[ROPE1_BASE + m * SPLIT_N1 + c1 - SPLIT_N0] = R1_T(y1);
            args.r1.v[ROPE1_BASE + m * SPLIT_N1 + c2 - SPLIT_N0] = R1_T(y2);
        }
    } else {
        store_c(cc, m, c1, v);
        store_c(cc, m, c2, w);
    }
}
#endif

#if LAST_NORM
#include "reduce.glsl"
shared bool last_s;

// Element n of the row's h = C + res (the norm's input; one row).
float last_h(uint n) { return float(args.c.v[n]) + float(args.nres.v[n]); }

// LAST_NORM: a layer_norm or rms_norm (NORM_RMS) of h over its N elements
// after the product, done by its last workgroup once every workgroup's
// columns are in C (a count in memory that each workgroup bumps and the
// last sets back to 0): y = (h - mean) / sqrt(var + EPS) * gamma + beta
// (mean 0 and var the mean square for rms), h stored too where NORM_SUM
// (the residual stream). The run has one row (M 1). Each invocation holds
// its NPER elements of h in registers, all loaded at once.
const uint NPER = (N + WG - 1) / WG;
void last_norm() {
    const uint lane = gl_LocalInvocationID.x;
    float h[NPER];
    [[unroll]] for (uint i = 0; i < NPER; ++i) {
        const uint n = lane + i * WG;
        h[i] = n < N ? last_h(n) : 0.0;
    }
    float mean = 0.0;
#if !NORM_RMS
    float s1 = 0.0;
    [[unroll]] for (uint i = 0; i < NPER; ++i)
        s1 += h[i];
    mean = kiln_reduce_sum(s1) / float(N);
#endif
    float s2 = 0.0;
    [[unroll]] for (uint i = 0; i < NPER; ++i) {
        const float d = lane + i * WG < N ? h[i] - mean : 0.0;
        s2 += d * d;
    }
    const float r = inversesqrt(kiln_reduce_sum(s2) / float(N) + EPS);
    [[unroll]] for (uint i = 0; i < NPER; ++i) {
        const uint n = lane + i * WG;
        if (n >= N)
            continue;
        float y = (h[i] - mean) * r;
#if NORM_GAMMA
        y *= float(args.ngamma.v[n]);
#endif
#if NORM_BETA
        y += float(args.nbeta.v[n]);
#endif
        args.ny.v[n] = NY_T(y);
#if NORM_SUM
        args.nsum.v[n] = NSUM_T(h[i]);
#endif
    }
}
#endif

// Each team's partial sums: red[t * OUTS + o][i] for output o of team t,
// i its invocations (KILN_SUBGROUP: its subgroups, where they lie within
// a team).
shared float red[TEAMS * OUTS][TL];

void main() {
    const uint lane = gl_LocalInvocationID.x;
    const uint team = TEAMS == 1 ? 0 : lane / TL; // the invocation's team
    const uint lt = TEAMS == 1 ? lane : lane % TL; // and its place in it
    const uint n0 = (gl_WorkGroupID.x * TEAMS + team) * CH;
    const uint r0 = team * OUTS; // the team's rows of red
    for (uint bz = gl_WorkGroupID.z; bz < uint(BATCH_RUN); bz += gl_NumWorkGroups.z) {
        uint ca, cb, cc;
        kiln_batch_offsets(bz, ca, cb, cc);
        float acc[M][CN];
        [[unroll]] for (uint m = 0; m < M; ++m)
            [[unroll]] for (uint c = 0; c < CN; ++c)
                acc[m][c] = 0.0;
        Chunk q[UNROLL]; // loaded first, all of them in flight
#if A_SHARED || A_Q8 || H2 // the first chunks' loads issued before A's copy
        [[unroll]] for (uint u = 0; u < UNROLL; ++u)
            q[u] = load_chunk(cb, n0, min(lt + u * TL, CHUNKS - 1));
#if A_Q8
        stage_q8(ca);
#elif H2
        stage_h2(ca);
#else
        stage_a(ca);
#endif
        barrier();
#endif
        for (uint ch0 = lt; ch0 < CHUNKS; ch0 += TL * UNROLL) {
#if A_SHARED || A_Q8 || H2
            if (ch0 != lt)
#endif
                [[unroll]] for (uint u = 0; u < UNROLL; ++u)
                    q[u] = load_chunk(cb, n0, min(ch0 + u * TL, CHUNKS - 1));
            [[unroll]] for (uint u = 0; u < UNROLL; ++u)
                if (ch0 + u * TL < CHUNKS)
                    add_chunk(ca, ch0 + u * TL, q[u], acc);
        }
        uint parts = TL; // the partial sums of each output in red
#if KILN_SUBGROUP
        // subgroups within a team (one team: the workgroup's subgroups)
        if (TEAMS == 1 || gl_SubgroupSize <= TL) { // uniform
            parts = TEAMS == 1 ? gl_NumSubgroups : TL / gl_SubgroupSize;
            [[unroll]] for (uint o = 0; o < OUTS; ++o) {
                if (o / CN < MROWS) { // a run of fewer rows than M sums only its own
                    const float v = subgroupAdd(acc[o / CN][o % CN]);
                    if (subgroupElect())
                        red[r0 + o][TEAMS == 1 ? gl_SubgroupID : gl_SubgroupID % parts] = v;
                }
            }
        } else
#endif
        {
            [[unroll]] for (uint o = 0; o < OUTS; ++o)
                red[r0 + o][lt] = acc[o / CN][o % CN];
        }
        barrier();
#if !KILN_SUBGROUP
        // a tree over each team's invocations
        [[unroll]] for (uint h = TL / 2; h > 0; h >>= 1) {
            if (lt < h)
                [[unroll]] for (uint o = 0; o < OUTS; ++o)
                    if (o / CN < MROWS)
                        red[r0 + o][lt] += red[r0 + o][lt + h];
            barrier();
        }
        parts = 1;
#endif
#if PAIRS
        for (uint o = lane; o < TEAMS * M * CH; o += WG) {
            const uint t = o / (M * CH), ot = o % (M * CH);
            const uint e = t * OUTS + ot / CH * CN + ot % CH; // the pair's first column
            float v = 0.0, w = 0.0;
            for (uint i = 0; i < parts; ++i) {
                v += red[e][i];
                w += red[e + CH][i];
            }
            store_pair(cc, (gl_WorkGroupID.x * TEAMS + t) * CH, ot, v, w);
        }
#else
        for (uint o = lane; o < TEAMS * OUTS; o += WG) {
            float v = 0.0;
            for (uint i = 0; i < parts; ++i)
                v += red[o][i];
            store(cc, (gl_WorkGroupID.x * TEAMS + o / OUTS) * CH, o % OUTS, v);
        }
#endif
#if LAST_NORM
        // the last workgroup to finish normalizes the row (all of C)
        memoryBarrierBuffer(); // this workgroup's C before its count
        barrier();
        if (lane == 0)
            last_s = atomicAdd(args.count.v[0], 1u) == gl_NumWorkGroups.x - 1u;
        barrier();
        if (last_s) { // uniform: a shared value
            memoryBarrierBuffer();
            last_norm();
            if (lane == 0)
                args.count.v[0] = 0u; // for the next run
        }
#endif
        barrier(); // red (and sa) are written again by the next batch
    }
}
