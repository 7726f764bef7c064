#version 460
// resize.comp: nearest, (multi)linear or (multi)cubic resampling of every
// dimension, ONNX Resize semantics, one invocation per output element.
//
// RANK, XSHAPE, YSHAPE, SCALE (per dimension, as floats); COORD: 0
// half_pixel, 1 asymmetric, 2 align_corners, 3 pytorch_half_pixel, 4
// tf_half_pixel_for_nn, 5 tf_crop_and_resize (the region ROI_START to
// ROI_END of each axis, fractions of its last index; an element whose
// source lies outside the input is EXTRAPOLATION), 6 half_pixel_symmetric
// (half_pixel shifted by the input's centre times the part of the resized
// length that the output's whole length drops). MODE 0 picks the nearest source element, rounding
// by NEAREST: 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil;
// MODE 1 interpolates between the two nearest source elements of each
// dimension; MODE 2 between the four nearest, with Keys' cubic of
// coefficient CUBIC_A, EXCLUDE 1 dropping (and renormalizing without) the
// taps outside the input. Taps past an edge read the edge element. x and
// y f32 or f16 (X_BUF, Y_BUF, Y_T), the arithmetic f32.
#include "common.glsl"

layout(local_size_x = WG) in;

#ifndef Y_BUF
#define Y_BUF F32
#define Y_T float
#define X_BUF F32R
#endif

layout(push_constant) uniform Args {
    Y_BUF y;
    X_BUF x;
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
#elif COORD == 3
    return OL[d] > 1.0 ? (f + 0.5) / SC[d] - 0.5 : 0.0;
#elif COORD == 5
    const float RS[RANK] = float[RANK](ROI_START), RE[RANK] = float[RANK](ROI_END);
    float last = float(XS[d] - 1u);
    return OL[d] > 1.0 ? RS[d] * last + f * (RE[d] - RS[d]) * last / (OL[d] - 1.0)
                       : 0.5 * (RS[d] + RE[d]) * last;
#elif COORD == 6
    float offset = 0.5 * float(XS[d]) * (1.0 - float(YS[d]) / OL[d]);
    return offset + (f + 0.5) / SC[d] - 0.5;
#else
    return (f + 0.5) / SC[d];
#endif
}

#if MODE == 2
#define LOG2_TAPS 2
#elif MODE == 1
#define LOG2_TAPS 1
#else
#define LOG2_TAPS 0
#endif
#define TAPS (1 << LOG2_TAPS)

// Keys' cubic convolution kernel at distance x.
float cubic_weight(float x) {
    const float A = CUBIC_A;
    x = abs(x);
    if (x <= 1.0)
        return ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    if (x < 2.0)
        return ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    return 0.0;
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
        uint idx[RANK][TAPS];
        float w[RANK][TAPS];
        uint rem = o;
        bool outside = false;
        for (int d = RANK - 1; d >= 0; --d) {
            uint c = rem % YS[d];
            rem /= YS[d];
            float s = source(c, d), last = float(XS[d] - 1u);
#if COORD == 5
            outside = outside || s < 0.0 || s > last;
#endif
#if MODE == 2
            float f = floor(s), sum = 0.0;
            for (int k = 0; k < 4; ++k) {
                float pos = f - 1.0 + float(k), wt = cubic_weight(s - pos);
#if EXCLUDE
                if (pos < 0.0 || pos > last)
                    wt = 0.0;
#endif
                w[d][k] = wt;
                sum += wt;
                idx[d][k] = uint(clamp(pos, 0.0, last));
            }
#if EXCLUDE
            for (int k = 0; k < 4; ++k)
                w[d][k] /= sum;
#endif
#elif MODE == 1
            float f = floor(s);
            w[d][1] = s - f;
            w[d][0] = 1.0 - w[d][1];
            idx[d][0] = uint(clamp(f, 0.0, last));
            idx[d][1] = uint(clamp(f + 1.0, 0.0, last));
#else
            idx[d][0] = nearest(s, XS[d]);
            w[d][0] = 1.0;
#endif
        }
        float acc = 0.0;
        for (uint corner = 0; corner < (1u << (RANK * LOG2_TAPS)); ++corner) {
            float weight = 1.0;
            uint xi = 0;
            for (int d = 0; d < RANK; ++d) {
                uint k = (corner >> uint(d * LOG2_TAPS)) & uint(TAPS - 1);
                weight *= w[d][k];
                xi = xi * XS[d] + idx[d][k];
            }
            if (weight != 0.0)
                acc += weight * float(args.x.v[xi]);
        }
#if COORD == 5
        if (outside)
            acc = EXTRAPOLATION;
#endif
        args.y.v[o] = Y_T(acc);
        if (COUNT - o <= step)
            break;
        o += step;
    }
}
