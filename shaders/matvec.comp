#version 460
// matvec.comp: C = A x B when A has few rows (M <= 16): decode steps, small
// batches. matmul.comp's tiles would leave most of a GPU idle there, and
// the product is bound by reading B once.
//
// A workgroup of NCOL x KSPLIT invocations computes CPG = NCOL * VEC
// columns of C for all M rows. Invocation (lane c, split s) owns VEC
// consecutive columns and sums over its share of k: VEC 4 (B f32, its rows
// 16-byte aligned) reads them as one vec4 per k, so NCOL lanes read
// 16 * NCOL contiguous bytes of a row of B; AVEC (A's rows contiguous and
// 16-byte aligned) takes 4 k at a time and reads each row of A as a vec4.
// The KSPLIT partial sums meet in shared memory, MC rows at a time: each
// element's KSPLIT parts are added by Q invocations, then their Q sums by
// one, which applies the epilogue. Same defines as matmul.comp (strides,
// batches, the bias and activation epilogue; B in any weights.glsl format
// with VEC 1).
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
#include "weights.glsl"

layout(local_size_x = NCOL, local_size_y = KSPLIT) in;

#if VEC == 4
#define BT V4R
#define VT vec4
#else
#define BT B_BUF
#define VT float
#endif
#if AVEC
#define AT V4R
#define KSTEP 4u
#else
#define AT A_BUF
#define KSTEP 1u
#endif

#if A_F16
#define A_BUF F16R
#else
#define A_BUF F32R
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
    AT a;
    BT b;
    F32R bias;
    F32R bscale; // quantized B only (weights.glsl)
    U32R bzero;
    KILN_SPLIT_OUTPUTS(C_BUF) // QKV split (common.glsl)
    KILN_DIMS
} args;

#include "product.glsl"
const uint NT = NCOL * KSPLIT;
const uint CPG = NCOL * VEC;
const uint TILES_N = (N + CPG - 1) / CPG;
const uint ROUNDS = (M + MC - 1) / MC;
const uint OUTS = MC * CPG;                 // elements of C one round sums
const uint Q = OUTS >= NT ? 1 : NT / OUTS;  // invocations adding one element's parts
#ifndef MROWS
#define MROWS M // the rows of this run: M at most (dynamic dims)
#endif

shared float part[KSPLIT][OUTS];
shared float red[Q][OUTS];

// Row k of B at this invocation's columns.
#if VEC == 4
#define LOAD_ROW(k) args.b.v[(cb + (k) * B_SK + n) / 4]
#else
#define LOAD_ROW(k) LOAD_B(cb + (k) * B_SK + n * B_SN, k, n)
#endif

void main() {
    const uint lc = gl_LocalInvocationID.x, s = gl_LocalInvocationID.y;
    const uint tid = s * NCOL + lc;
    for (uint bz = gl_WorkGroupID.z; bz < uint(BATCH_RUN); bz += gl_NumWorkGroups.z) {
        uint ca, cb, cc;
        kiln_batch_offsets(bz, ca, cb, cc);
        for (uint tile = gl_WorkGroupID.x; tile < TILES_N; tile += gl_NumWorkGroups.x) {
            const uint n = tile * CPG + lc * VEC;
            VT acc[M];
            [[unroll]] for (uint m = 0; m < M; ++m)
                acc[m] = VT(0.0);
            if (n < N) {
                for (uint k = s * KSTEP; k < K; k += KSPLIT * KSTEP) {
#if AVEC
                    const VT b0 = LOAD_ROW(k), b1 = LOAD_ROW(k + 1), b2 = LOAD_ROW(k + 2),
                             b3 = LOAD_ROW(k + 3);
                    [[unroll]] for (uint m = 0; m < M; ++m) {
                        if (m < MROWS) {
                            const vec4 av = args.a.v[(ca + m * A_SM + k) / 4];
                            acc[m] = fma(VT(av.x), b0, acc[m]);
                            acc[m] = fma(VT(av.y), b1, acc[m]);
                            acc[m] = fma(VT(av.z), b2, acc[m]);
                            acc[m] = fma(VT(av.w), b3, acc[m]);
                        }
                    }
#else
                    const VT b0 = LOAD_ROW(k);
                    [[unroll]] for (uint m = 0; m < M; ++m)
                        if (m < MROWS)
                            acc[m] = fma(VT(float(args.a.v[ca + m * A_SM + k * A_SK])), b0, acc[m]);
#endif
                }
            }
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) {
                [[unroll]] for (uint mm = 0; mm < MC; ++mm) {
                    if (r * MC + mm < M) {
#if VEC == 4
                        [[unroll]] for (uint v = 0; v < 4; ++v)
                            part[s][mm * CPG + lc * 4 + v] = acc[r * MC + mm][v];
#else
                        part[s][mm * CPG + lc] = acc[r * MC + mm];
#endif
                    }
                }
                barrier();
                for (uint o = tid; o < Q * OUTS; o += NT) {
                    const uint q = o / OUTS, e = o % OUTS;
                    float v = 0.0;
                    for (uint t = q; t < KSPLIT; t += Q)
                        v += part[t][e];
                    red[q][e] = v;
                }
                barrier();
                for (uint e = tid; e < OUTS; e += NT) {
                    const uint m = r * MC + e / CPG, col = tile * CPG + e % CPG;
                    if (m < MROWS && col < N) {
                        float v = 0.0;
                        for (uint q = 0; q < Q; ++q)
                            v += red[q][e];
                        store_c(cc, m, col, v);
                    }
                }
            }
        }
    }
}
