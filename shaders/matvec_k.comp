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
// into f32 four at a time and multiplies them with the same four k of every
// row of A. The M x CN partial sums then meet: a tree through shared memory,
// or (KILN_SUBGROUP, the build for devices with subgroup arithmetic) one
// subgroupAdd each and a sum over the subgroups. The sum goes through
// product.glsl's epilogue.
//
// Quantized B (weights.glsl's formats): element (k, n) is code n * B_SN + k
// and its scale (and zero point) index n * NBLK + k / QBLOCK.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
#include "weights.glsl"
#if KILN_SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
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

#if A_F16
#define A_BUF F16R
#define LOAD_A4(e) vec4(float(args.a.v[e]), float(args.a.v[(e) + 1]), \
                        float(args.a.v[(e) + 2]), float(args.a.v[(e) + 3]))
#else
#define A_BUF V4R
#define LOAD_A4(e) args.a.v[(e) / 4]
#endif
#if C_F16
#define C_BUF F16
#define C_T float16_t
#else
#define C_BUF F32
#define C_T float
#endif

layout(push_constant) uniform Args {
    C_BUF c;
    A_BUF a;
    BT b;
    F32R bias;
    F32R bscale; // quantized B only
    U32R bzero;
    KILN_SPLIT_OUTPUTS(C_BUF) // QKV split (common.glsl)
    KILN_DIMS
} args;

#include "product.glsl"
#ifndef MROWS
#define MROWS M // the rows of this run: M at most (dynamic dims)
#endif
const uint CHUNKS = K / KV;
const uint OUTS = M * CN;

// Four weights, piece p (k 4p to 4p + 3) of a chunk, as f32: s the chunk's
// scale, z its zero point.
vec4 kiln_w4(RAW raw, uint p, float s, float z) {
#if W_FORMAT == 0
    return raw;
#elif W_FORMAT == 1
    return vec4(unpackHalf2x16(raw[2 * p]), unpackHalf2x16(raw[2 * p + 1]));
#elif W_FORMAT == 2
    const int w = int(raw[p]);
    return vec4(bitfieldExtract(w, 0, 8), bitfieldExtract(w, 8, 8), bitfieldExtract(w, 16, 8),
                bitfieldExtract(w, 24, 8)) * s;
#elif W_FORMAT == 3
    const uint w = raw[p];
    return (vec4(bitfieldExtract(w, 0, 8), bitfieldExtract(w, 8, 8), bitfieldExtract(w, 16, 8),
                 bitfieldExtract(w, 24, 8)) - z) * s;
#elif W_FORMAT == 4
    const int w = int(raw[p >> 1]);
    const int o = int(p & 1u) * 16;
    return vec4(bitfieldExtract(w, o, 4), bitfieldExtract(w, o + 4, 4),
                bitfieldExtract(w, o + 8, 4), bitfieldExtract(w, o + 12, 4)) * s;
#elif W_FORMAT == 5
    const uint w = raw[p >> 1];
    const int o = int(p & 1u) * 16;
    return (vec4(bitfieldExtract(w, o, 4), bitfieldExtract(w, o + 4, 4),
                 bitfieldExtract(w, o + 8, 4), bitfieldExtract(w, o + 12, 4)) - z) * s;
#else
    const uint w = raw[p];
    vec4 v;
    [[unroll]] for (int j = 0; j < 4; ++j) {
#if W_FORMAT == 6
        v[j] = kiln_fp8_e4m3(bitfieldExtract(w, 8 * j, 8));
#else
        v[j] = kiln_fp8_e5m2(bitfieldExtract(w, 8 * j, 8));
#endif
    }
    return v * s;
#endif
}

shared float red[OUTS][WG];

void main() {
    const uint lane = gl_LocalInvocationID.x;
    const uint n0 = gl_WorkGroupID.x * CN;
    for (uint bz = gl_WorkGroupID.z; bz < BATCH; bz += gl_NumWorkGroups.z) {
        uint ca, cb, cc;
        kiln_batch_offsets(bz, ca, cb, cc);
        float acc[M][CN];
        [[unroll]] for (uint m = 0; m < M; ++m)
            [[unroll]] for (uint c = 0; c < CN; ++c)
                acc[m][c] = 0.0;
        for (uint ch = lane; ch < CHUNKS; ch += WG) {
            const uint k = ch * KV;
            RAW raw[CN];
            float s[CN], z[CN];
            [[unroll]] for (uint c = 0; c < CN; ++c) {
                const uint col = min(n0 + c, N - 1); // a ragged last group reads column N - 1 again
                raw[c] = args.b.v[(cb + col * B_SN + k) / KV];
#if W_FORMAT >= 2
                s[c] = args.bscale.v[col * NBLK + k / QBLOCK];
#else
                s[c] = 1.0;
#endif
#if W_FORMAT == 3 || W_FORMAT == 5
                z[c] = float(kiln_byte(args.bzero, col * NBLK + k / QBLOCK));
#else
                z[c] = 0.0;
#endif
            }
            [[unroll]] for (uint p = 0; p < KV / 4; ++p) {
                vec4 w[CN];
                [[unroll]] for (uint c = 0; c < CN; ++c)
                    w[c] = kiln_w4(raw[c], p, s[c], z[c]);
                [[unroll]] for (uint m = 0; m < M; ++m) {
                    if (m < MROWS) {
                        const vec4 av = LOAD_A4(ca + m * A_SM + k + 4 * p);
                        [[unroll]] for (uint c = 0; c < CN; ++c)
                            acc[m][c] += dot(av, w[c]);
                    }
                }
            }
        }
#if KILN_SUBGROUP
        [[unroll]] for (uint o = 0; o < OUTS; ++o) {
            const float v = subgroupAdd(acc[o / CN][o % CN]);
            if (subgroupElect())
                red[o][gl_SubgroupID] = v;
        }
        barrier();
        for (uint o = lane; o < OUTS; o += WG) {
            float v = 0.0;
            for (uint i = 0; i < gl_NumSubgroups; ++i)
                v += red[o][i];
            const uint m = o / CN, col = n0 + o % CN;
            if (m < MROWS && col < N)
                store_c(cc, m, col, v);
        }
#else
        [[unroll]] for (uint o = 0; o < OUTS; ++o)
            red[o][lane] = acc[o / CN][o % CN];
        barrier();
        [[unroll]] for (uint h = WG / 2; h > 0; h >>= 1) {
            if (lane < h)
                [[unroll]] for (uint o = 0; o < OUTS; ++o)
                    red[o][lane] += red[o][lane + h];
            barrier();
        }
        for (uint o = lane; o < OUTS; o += WG) {
            const uint m = o / CN, col = n0 + o % CN;
            if (m < MROWS && col < N)
                store_c(cc, m, col, red[o][0]);
        }
#endif
        barrier(); // red is written again by the next batch
    }
}
