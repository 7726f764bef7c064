#version 460
// resize.comp: nearest or (multi)linear resampling of every dimension,
// ONNX Resize semantics, one invocation per output element.
//
// RANK, XSHAPE, YSHAPE, SCALE (per dimension, as floats); COORD: 0
// half_pixel, 1 asymmetric, 2 align_corners, 3 pytorch_half_pixel; LINEAR 1
// interpolates between the two nearest source elements of each dimension
// (clamped at the edges); LINEAR 0 picks one, rounding by NEAREST: 0
// round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 y;
    F32R x;
    KILN_DIMS
} args;

const uint XS[RANK] = uint[RANK](XSHAPE);
const uint YS[RANK] = uint[RANK](YSHAPE);
const float SC[RANK] = float[RANK](SCALE);
// The resized length in the coordinate formulas: input length * scale when
// scales were given (ONNX does not floor it there), else the output's.
const float OL[RANK] = float[RANK](OUT_LEN);

float source(uint c, int d) {
    float f = float(c);
#if COORD == 0
    return (f + 0.5) / SC[d] - 0.5;
#elif COORD == 1
    return f / SC[d];
#elif COORD == 2
    return OL[d] == 1.0 ? 0.0 : f * float(XS[d] - 1u) / (OL[d] - 1.0);
#else
    return OL[d] > 1.0 ? (f + 0.5) / SC[d] - 0.5 : 0.0;
#endif
}

uint nearest(float s, uint n) {
#if NEAREST == 0
    float r = (s - floor(s) == 0.5) ? floor(s) : round(s);
#elif NEAREST == 1
    float r = (s - floor(s) == 0.5) ? ceil(s) : round(s);
#elif NEAREST == 2
    float r = floor(s);
#else
    float r = ceil(s);
#endif
    return uint(clamp(r, 0.0, float(n - 1u)));
}

void main() {
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint o = gl_GlobalInvocationID.x; o < COUNT;) {
        uint lo[RANK], hi[RANK];
        float w[RANK];
        uint rem = o;
        for (int d = RANK - 1; d >= 0; --d) {
            uint c = rem % YS[d];
            rem /= YS[d];
            float s = source(c, d);
#if LINEAR
            float f = floor(s);
            w[d] = s - f;
            lo[d] = uint(clamp(f, 0.0, float(XS[d] - 1u)));
            hi[d] = uint(clamp(f + 1.0, 0.0, float(XS[d] - 1u)));
#else
            lo[d] = hi[d] = nearest(s, XS[d]);
            w[d] = 0.0;
#endif
        }
        float acc = 0.0;
        for (uint corner = 0; corner < (1u << RANK); ++corner) {
            float weight = 1.0;
            uint xi = 0;
            for (int d = 0; d < RANK; ++d) {
                bool up = ((corner >> uint(d)) & 1u) != 0u;
                weight *= up ? w[d] : 1.0 - w[d];
                xi = xi * XS[d] + (up ? hi[d] : lo[d]);
            }
            if (weight != 0.0)
                acc += weight * args.x.v[xi];
        }
        args.y.v[o] = acc;
        if (COUNT - o <= step)
            break;
        o += step;
    }
}
