#version 460
// grid_sample.comp: ONNX GridSample, one invocation per output element.
// Output element (n, c, o1..oR) reads x[n, c] at the R normalized
// coordinates grid[n, o1..oR, :] (the last axis's coordinate first, as
// ONNX and PyTorch order them), -1 and 1 naming the first and last pixel's
// centres (ALIGN 1) or outer edges (ALIGN 0).
//
// R spatial axes (1 to 3), XSPATIAL and OSPATIAL their input and output
// extents, C channels. MODE 0 nearest (rounding half to even), 1
// (multi)linear, 2 (multi)cubic (Keys, A = -0.75, four taps an axis). PAD:
// what a coordinate outside the input reads: 0 zeros, 1 the border pixel,
// 2 the input reflected at its border (ALIGN 1: about the outer pixels'
// centres, ALIGN 0: about their edges). A coordinate outside is first
// clamped (PAD 1) or reflected (PAD 2) into range, then each tap applies
// the same rule. EMPTY: x has no elements (only zeros come out).
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 y;
    F32R x;
    F32R grid;
    KILN_DIMS
} args;

const uint XS[R] = uint[R](XSPATIAL);
const uint OS[R] = uint[R](OSPATIAL);

#if MODE == 2
#define TAPS 4
#elif MODE == 1
#define TAPS 2
#else
#define TAPS 1
#endif

// The range a coordinate of an axis of length len may take before padding.
const float LOWEST = ALIGN != 0 ? 0.0 : -0.5;
float highest(uint len) { return float(len) - (ALIGN != 0 ? 1.0 : 0.5); }

// v reflected at lo and hi until it lies between them.
float reflect_into(float v, float lo, float hi) {
    float span = hi - lo;
    if (span <= 0.0)
        return lo;
    if (v < lo || v > hi) {
        float dx = v < lo ? lo - v : v - hi;
        float k = floor(dx / span), rest = dx - k * span;
        bool even = mod(k, 2.0) == 0.0;
        return (v < lo) == even ? lo + rest : hi - rest;
    }
    return v;
}

// Keys' cubic coefficients of the taps at -1, 0, 1, 2 from floor(x), t = x - floor(x).
void cubic_weights(float t, out float w[4]) {
    const float A = -0.75;
    float s = t + 1.0, u = 1.0 - t, v = 2.0 - t;
    w[0] = ((A * s - 5.0 * A) * s + 8.0 * A) * s - 4.0 * A;
    w[1] = ((A + 2.0) * t - (A + 3.0)) * t * t + 1.0;
    w[2] = ((A + 2.0) * u - (A + 3.0)) * u * u + 1.0;
    w[3] = ((A * v - 5.0 * A) * v + 8.0 * A) * v - 4.0 * A;
}

void main() {
    uint xcount = 1u, ocount = 1u;
    for (int d = 0; d < R; ++d) {
        xcount *= XS[d];
        ocount *= OS[d];
    }
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint o = gl_GlobalInvocationID.x; o < COUNT;) {
        uint spatial = o % ocount, nc = o / ocount, n = nc / C;
        uint g = (n * ocount + spatial) * uint(R);
        int base[R];
        float w[R][TAPS];
        for (int d = 0; d < R; ++d) {
            float len = float(XS[d]), lo = LOWEST, hi = highest(XS[d]);
            float gv = args.grid.v[g + uint(R - 1 - d)];
            float s = ALIGN != 0 ? (gv + 1.0) * 0.5 * (len - 1.0) : ((gv + 1.0) * len - 1.0) * 0.5;
#if MODE == 0
            s = roundEven(s);
#endif
            if (s < lo || s > hi) {
#if PAD == 1
                s = clamp(s, 0.0, len - 1.0);
#elif PAD == 2
                s = reflect_into(s, lo, hi);
#endif
            }
#if MODE == 0
            base[d] = int(s); // truncation, as ONNX's reference
            w[d][0] = 1.0;
#elif MODE == 1
            float f = floor(s);
            base[d] = int(f);
            w[d][1] = s - f;
            w[d][0] = 1.0 - (s - f);
#else
            float f = floor(s);
            base[d] = int(f) - 1;
            float cw[4];
            cubic_weights(s - f, cw);
            for (int k = 0; k < 4; ++k)
                w[d][k] = cw[k];
#endif
        }
        float acc = 0.0;
        uint corners = 1u;
        for (int d = 0; d < R; ++d)
            corners *= uint(TAPS);
        for (uint corner = 0u; corner < corners && EMPTY == 0; ++corner) {
            float weight = 1.0;
            uint xi = 0u, rest = corner;
            bool inside = true;
            for (int d = 0; d < R; ++d) {
                uint k = rest % uint(TAPS);
                rest /= uint(TAPS);
                int i = base[d] + int(k), len = int(XS[d]);
#if PAD == 0
                inside = inside && i >= 0 && i < len;
#elif PAD == 1
                i = clamp(i, 0, len - 1);
#else
                i = int(reflect_into(float(i), LOWEST, highest(XS[d])));
#endif
                weight *= w[d][k];
                xi = xi * XS[d] + uint(clamp(i, 0, len - 1));
            }
            if (inside)
                acc += weight * args.x.v[nc * xcount + xi];
        }
        args.y.v[o] = acc;
        if (COUNT - o <= step)
            break;
        o += step;
    }
}
