#version 460
// conv.comp: N-dimensional convolution (1 to 3 spatial dimensions) and its
// transpose, NC(D)HW layout.
//
// Spatial shapes are padded to 3 dimensions (size 1 where unused): IN_SP,
// OUT_SP, K_SP, STRIDE, PAD (at the beginning), DIL. N, C (input channels),
// OC, G (groups). Weights: [OC, C/G, k...] for a convolution; [C, OC/G, k...]
// for a transpose (TRANSPOSED 1), where output position o takes input
// position i with o = i * stride - pad + k * dil. HAS_BIAS adds bias[oc],
// HAS_RES the element of res (a skip connection, y's shape); ACT(x) is an
// activation expression, last. X, W, Y and RES are f32 or f16 (X_BUF, W_BUF,
// Y_BUF and Y_T, RES_BUF), the arithmetic f32; the bias f32. Y_CLAST:
// y is stored channels last, [N, spatial, OC] (a transpose fused).
//
// SPLIT invocations (a power of two dividing WG) share each output element:
// invocation j of them sums the input channels j, j + SPLIT, ... of its
// group, and the first adds up their sums through shared memory. The
// compiler splits small convolutions, whose one invocation per output would
// leave most of a large GPU idle and take as long as one output's chain of
// loads and multiply-adds; SPLIT 1 is one invocation per output.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"

layout(local_size_x = WG) in;

#ifndef RES_BUF
#define RES_BUF F32R
#endif

layout(push_constant) uniform Args {
    Y_BUF y;
    X_BUF x;
    W_BUF w;
    F32R bias;
    RES_BUF res;
    KILN_DIMS
} args;

#ifndef ACT
#define ACT(x) (x)
#endif

const uint IN_[3] = uint[3](IN_SP);
const uint OUT_[3] = uint[3](OUT_SP);
const uint K_[3] = uint[3](K_SP);
const int STRIDE_[3] = int[3](STRIDE);
const int PAD_[3] = int[3](PAD);
const int DIL_[3] = int[3](DIL);
const uint IN_VOL = IN_[0] * IN_[1] * IN_[2];
const uint OUT_VOL = OUT_[0] * OUT_[1] * OUT_[2];
const uint K_VOL = K_[0] * K_[1] * K_[2];
const uint COUNT = N * OC * OUT_VOL;
const uint CG = C / G, OCG = OC / G;

// Output o's products over the input channels first, first + SPLIT, ...
// of its group.
float conv_sum(uint o, uint first) {
    const uint sp = o % OUT_VOL, oc = (o / OUT_VOL) % OC, n = o / (OUT_VOL * OC);
    const int op[3] = int[3](int(sp / (OUT_[1] * OUT_[2])), int((sp / OUT_[2]) % OUT_[1]),
                             int(sp % OUT_[2]));
    const uint g = oc / OCG;
    float acc = 0.0;
    for (uint ci = first; ci < CG; ci += SPLIT) {
        const uint c = g * CG + ci;
        const uint xbase = (n * C + c) * IN_VOL;
#if TRANSPOSED
        const uint wbase = (c * OCG + (oc - g * OCG)) * K_VOL;
#else
        const uint wbase = (oc * CG + ci) * K_VOL;
#endif
        for (uint kk = 0; kk < K_VOL; ++kk) {
            const int kp[3] = int[3](int(kk / (K_[1] * K_[2])), int((kk / K_[2]) % K_[1]),
                                     int(kk % K_[2]));
            bool ok = true;
            uint xi = 0;
            [[unroll]] for (int d = 0; d < 3; ++d) {
#if TRANSPOSED
                int t = op[d] + PAD_[d] - kp[d] * DIL_[d];
                int i = t / STRIDE_[d];
                ok = ok && t >= 0 && t % STRIDE_[d] == 0 && i < int(IN_[d]);
#else
                int i = op[d] * STRIDE_[d] - PAD_[d] + kp[d] * DIL_[d];
                ok = ok && i >= 0 && i < int(IN_[d]);
#endif
                xi = xi * IN_[d] + uint(max(i, 0));
            }
            if (ok)
                acc += float(args.x.v[xbase + xi]) * float(args.w.v[wbase + kk]);
        }
    }
    return acc;
}

// Where output o (in [N, OC, spatial] order) is stored: there, or with
// Y_CLAST at [N, spatial, OC] (a transpose to channels last fused).
#ifdef Y_CLAST
#define Y_INDEX(o) (((o) / (OUT_VOL * OC) * OUT_VOL + (o) % OUT_VOL) * OC + ((o) / OUT_VOL) % OC)
#else
#define Y_INDEX(o) (o)
#endif

void finish(uint o, float acc) {
#if HAS_BIAS
    acc += args.bias.v[(o / OUT_VOL) % OC];
#endif
#if HAS_RES
    acc += float(args.res.v[o]);
#endif
    args.y.v[Y_INDEX(o)] = Y_T(ACT(acc));
}

#if SPLIT > 1
shared float part[WG];

void main() {
    const uint l = gl_LocalInvocationID.x, lane = l % SPLIT;
    const uint per_group = WG / SPLIT; // outputs a workgroup takes at a time
    for (uint o0 = gl_WorkGroupID.x * per_group; o0 < COUNT;
         o0 += gl_NumWorkGroups.x * per_group) {
        const uint o = o0 + l / SPLIT;
        part[l] = o < COUNT ? conv_sum(o, lane) : 0.0;
        barrier();
        if (lane == 0 && o < COUNT) {
            float acc = 0.0;
            [[unroll]] for (uint j = 0; j < SPLIT; ++j)
                acc += part[l + j];
            finish(o, acc);
        }
        barrier();
    }
}
#else
void main() {
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint o = gl_GlobalInvocationID.x; o < COUNT;) {
        finish(o, conv_sum(o, 0));
        if (COUNT - o <= step)
            break;
        o += step;
    }
}
#endif
