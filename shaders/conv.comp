#version 460
// conv.comp: N-dimensional convolution (1 to 3 spatial dimensions) and its
// transpose, NC(D)HW layout.
//
// Spatial shapes are padded to 3 dimensions (size 1 where unused): IN_SP,
// OUT_SP, K_SP, STRIDE, PAD (at the beginning), DIL. N (NRUN of them this
// run), C (input channels),
// OC, G (groups). Weights: [OC, C/G, k...] for a convolution; [C, OC/G, k...]
// for a transpose (TRANSPOSED 1), where output position o takes input
// position i with o = i * stride - pad + k * dil. HAS_BIAS adds bias[oc],
// HAS_RES the element of res (a skip connection, y's shape); ACT(x) is an
// activation expression, last. X, W, Y and RES are f32 or f16 (X_BUF, W_BUF,
// Y_BUF and Y_T, RES_BUF), the arithmetic f32; the bias f32. Y_CLAST:
// y is stored channels last, [N, spatial, OC] (a transpose fused).
//
// DW_TILE: a depthwise convolution (G = C = OC, not transposed, 1 or 2
// spatial axes) on tiles: a workgroup takes DW_TH x DW_TW output positions
// of DW_CB channels of one image; their input window and weights go to
// shared memory once (each channel's window DW_XS floats apart, an odd
// count against bank conflicts), and each invocation sums the taps of
// DW_PX adjacent outputs of one row from there (each window row read once
// into registers for them). With Y_CLAST consecutive invocations take
// consecutive channels of one position (y's contiguous rows), else
// consecutive positions of one channel. DW_PX divides DW_TW.
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
#ifndef DW_TILE
#define DW_TILE 0
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
// NRUN (a dynamic batch): the run's images, an expression of the dims; the
// outputs past them are not computed.
#ifdef NRUN
#define COUNT (uint(NRUN) * OC * OUT_VOL)
#else
const uint COUNT = N * OC * OUT_VOL;
#endif
const uint CG = C / G, OCG = OC / G;

#if TRANSPOSED
// A transpose's output o: only the taps k with o + PAD - k DIL a multiple
// of STRIDE along each axis reach it (one in STRIDE^2 for a 2-D kernel of
// STRIDE's size): the first in [0, KSTEP) (KSTEP = STRIDE / gcd(STRIDE,
// DIL), from the compiler), then every KSTEP; for each, the products over
// the input channels first, first + SPLIT, ... of o's group.
const int KSTEP_[3] = int[3](KSTEP);

float conv_sum(uint o, uint first) {
    const uint sp = o % OUT_VOL, oc = (o / OUT_VOL) % OC, n = o / (OUT_VOL * OC);
    const int op[3] = int[3](int(sp / (OUT_[1] * OUT_[2])), int((sp / OUT_[2]) % OUT_[1]),
                             int(sp % OUT_[2]));
    const uint g = oc / OCG, ocl = oc - g * OCG;
    int kf[3];
    [[unroll]] for (int d = 0; d < 3; ++d) {
        kf[d] = int(K_[d]); // no tap reaches o along d
        // + STRIDE K DIL: a multiple of STRIDE that keeps % from negatives
        for (int k = KSTEP_[d] - 1; k >= 0; --k)
            if (k < int(K_[d]) &&
                (op[d] + PAD_[d] - k * DIL_[d] + STRIDE_[d] * int(K_[d]) * DIL_[d]) %
                        STRIDE_[d] == 0)
                kf[d] = k;
    }
    float acc = 0.0;
    for (int kz = kf[0]; kz < int(K_[0]); kz += KSTEP_[0]) {
        const int tz = op[0] + PAD_[0] - kz * DIL_[0], iz = tz / STRIDE_[0];
        if (tz < 0)
            break; // and every later tap
        if (iz >= int(IN_[0]))
            continue;
        for (int ky = kf[1]; ky < int(K_[1]); ky += KSTEP_[1]) {
            const int ty = op[1] + PAD_[1] - ky * DIL_[1], iy = ty / STRIDE_[1];
            if (ty < 0)
                break;
            if (iy >= int(IN_[1]))
                continue;
            for (int kx = kf[2]; kx < int(K_[2]); kx += KSTEP_[2]) {
                const int tx = op[2] + PAD_[2] - kx * DIL_[2], ix = tx / STRIDE_[2];
                if (tx < 0)
                    break;
                if (ix >= int(IN_[2]))
                    continue;
                const uint xi = (uint(iz) * IN_[1] + uint(iy)) * IN_[2] + uint(ix);
                const uint kk = (uint(kz) * K_[1] + uint(ky)) * K_[2] + uint(kx);
                for (uint ci = first; ci < CG; ci += SPLIT) {
                    const uint c = g * CG + ci;
                    acc += float(args.x.v[(n * C + c) * IN_VOL + xi]) *
                           float(args.w.v[(c * OCG + ocl) * K_VOL + kk]);
                }
            }
        }
    }
    return acc;
}
#else
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
        const uint wbase = (oc * CG + ci) * K_VOL;
        for (uint kk = 0; kk < K_VOL; ++kk) {
            const int kp[3] = int[3](int(kk / (K_[1] * K_[2])), int((kk / K_[2]) % K_[1]),
                                     int(kk % K_[2]));
            bool ok = true;
            uint xi = 0;
            [[unroll]] for (int d = 0; d < 3; ++d) {
                int i = op[d] * STRIDE_[d] - PAD_[d] + kp[d] * DIL_[d];
                ok = ok && i >= 0 && i < int(IN_[d]);
                xi = xi * IN_[d] + uint(max(i, 0));
            }
            if (ok)
                acc += float(args.x.v[xbase + xi]) * float(args.w.v[wbase + kk]);
        }
    }
    return acc;
}
#endif

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

#if DW_TILE
const uint OH = OUT_[1], OW = OUT_[2], IH = IN_[1], IW = IN_[2], KH = K_[1], KW = K_[2];
const uint PH = (DW_TH - 1) * uint(STRIDE_[1]) + (KH - 1) * uint(DIL_[1]) + 1;
const uint PW = (DW_TW - 1) * uint(STRIDE_[2]) + (KW - 1) * uint(DIL_[2]) + 1;
const uint TILES_H = (OH + DW_TH - 1) / DW_TH, TILES_W = (OW + DW_TW - 1) / DW_TW;
const uint CBLOCKS = (C + DW_CB - 1) / DW_CB;
// the window columns that DW_PX adjacent outputs of one row read
const uint DW_ROW = (DW_PX - 1) * uint(STRIDE_[2]) + (KW - 1) * uint(DIL_[2]) + 1;
#ifdef NRUN
#define TILES (uint(NRUN) * CBLOCKS * TILES_H * TILES_W)
#else
const uint TILES = N * CBLOCKS * TILES_H * TILES_W;
#endif
shared float xs[DW_CB * DW_XS];
shared float ws[DW_CB * K_VOL];

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint t = gl_WorkGroupID.x; t < TILES; t += gl_NumWorkGroups.x) {
        const uint tw = t % TILES_W, th = (t / TILES_W) % TILES_H;
        const uint c0 = (t / (TILES_W * TILES_H)) % CBLOCKS * DW_CB;
        const uint n = t / (TILES_W * TILES_H * CBLOCKS);
        const int ih0 = int(th * DW_TH) * STRIDE_[1] - PAD_[1];
        const int iw0 = int(tw * DW_TW) * STRIDE_[2] - PAD_[2];
        // the window of the tile's channels, zeros outside the input
        for (uint e = l; e < DW_CB * PH * PW; e += WG) {
            const uint cl = e / (PH * PW), r = e / PW % PH, q = e % PW, c = c0 + cl;
            const int ih = ih0 + int(r), iw = iw0 + int(q);
            xs[cl * DW_XS + r * PW + q] =
                c < C && ih >= 0 && ih < int(IH) && iw >= 0 && iw < int(IW)
                    ? float(args.x.v[((n * C + c) * IH + uint(ih)) * IW + uint(iw)]) : 0.0;
        }
        for (uint e = l; e < DW_CB * K_VOL; e += WG) {
            const uint c = c0 + e / K_VOL;
            ws[e] = c < C ? float(args.w.v[c * K_VOL + e % K_VOL]) : 0.0;
        }
        barrier();
        for (uint e = l; e < DW_CB * DW_TH * DW_TW / DW_PX; e += WG) {
#ifdef Y_CLAST
            const uint cl = e % DW_CB, p = e / DW_CB;
#else
            const uint cl = e / (DW_TH * DW_TW / DW_PX), p = e % (DW_TH * DW_TW / DW_PX);
#endif
            const uint py = p / (DW_TW / DW_PX), px = p % (DW_TW / DW_PX) * DW_PX;
            const uint oy = th * DW_TH + py, ox = tw * DW_TW + px, c = c0 + cl;
            if (c < C && oy < OH && ox < OW) {
                const uint xb = cl * DW_XS + py * uint(STRIDE_[1]) * PW + px * uint(STRIDE_[2]);
                // DW_PX outputs along the row: each window row's values
                // once into registers, shared by the outputs' taps
                float acc[DW_PX];
                [[unroll]] for (uint j = 0; j < DW_PX; ++j)
                    acc[j] = 0.0;
                [[unroll]] for (uint kh = 0; kh < KH; ++kh) {
                    float row[DW_ROW];
                    [[unroll]] for (uint q = 0; q < DW_ROW; ++q)
                        row[q] = xs[xb + kh * uint(DIL_[1]) * PW + q];
                    [[unroll]] for (uint kw = 0; kw < KW; ++kw) {
                        const float wv = ws[cl * K_VOL + kh * KW + kw];
                        [[unroll]] for (uint j = 0; j < DW_PX; ++j)
                            acc[j] += row[j * uint(STRIDE_[2]) + kw * uint(DIL_[2])] * wv;
                    }
                }
                [[unroll]] for (uint j = 0; j < DW_PX; ++j)
                    if (ox + j < OW)
                        finish(((n * OC + c) * OH + oy) * OW + ox + j, acc[j]);
            }
        }
        barrier(); // every invocation's reads before the next tile's window
    }
}
#elif SPLIT > 1
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
