#version 460
// roi_align.comp: ONNX RoiAlign, one invocation per output element (roi,
// channel, ph, pw). Region r is rois[r] = (x1, y1, x2, y2) of image
// batch_indices[r], times SPATIAL_SCALE, less half a pixel (HALF_PIXEL 1;
// otherwise its extent is at least one pixel). Each of the OH x OW bins
// averages (MAX 0) or takes the largest of (MAX 1) a grid of SAMPLING x
// SAMPLING bilinear samples (SAMPLING 0: ceil(region / bins) a side, decided
// per region at run time). A sample more than a pixel outside the image
// reads 0; one less than a pixel outside reads the edge. MAX takes, at each
// sample, the largest of its four weighted corners, as ONNX's reference
// and onnxruntime do.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 y;
    F32R x;
    F32R rois;
    TIDX batch_indices;
    KILN_DIMS
} args;

void main() {
    const uint step = gl_NumWorkGroups.x * WG;
    for (uint o = gl_GlobalInvocationID.x; o < COUNT;) {
        const uint pw = o % uint(OW), ph = (o / uint(OW)) % uint(OH);
        const uint c = (o / uint(OW * OH)) % uint(C), r = o / uint(OW * OH * C);
        const uint image = uint(clamp(int(args.batch_indices.v[r]), 0, N - 1));
        const float offset = HALF_PIXEL != 0 ? 0.5 : 0.0;
        const float x0 = args.rois.v[r * 4u] * SPATIAL_SCALE - offset;
        const float y0 = args.rois.v[r * 4u + 1u] * SPATIAL_SCALE - offset;
        float rw = args.rois.v[r * 4u + 2u] * SPATIAL_SCALE - offset - x0;
        float rh = args.rois.v[r * 4u + 3u] * SPATIAL_SCALE - offset - y0;
#if !HALF_PIXEL
        rw = max(rw, 1.0);
        rh = max(rh, 1.0);
#endif
        const float bh = rh / float(OH), bw = rw / float(OW);
        const int gh = SAMPLING > 0 ? SAMPLING : int(ceil(rh / float(OH)));
        const int gw = SAMPLING > 0 ? SAMPLING : int(ceil(rw / float(OW)));
        const uint plane = (image * uint(C) + c) * uint(H * W);
        float acc = 0.0;
        bool first = true;
        for (int iy = 0; iy < gh; ++iy) {
            float sy = y0 + float(ph) * bh + (float(iy) + 0.5) * bh / float(gh);
            for (int ix = 0; ix < gw; ++ix) {
                float sx = x0 + float(pw) * bw + (float(ix) + 0.5) * bw / float(gw);
                float v = 0.0;
                if (!(sy < -1.0 || sy > float(H) || sx < -1.0 || sx > float(W))) {
                    float yy = max(sy, 0.0), xx = max(sx, 0.0);
                    int ylo = int(yy), xlo = int(xx), yhi, xhi;
                    if (ylo >= H - 1) {
                        ylo = yhi = H - 1;
                        yy = float(ylo);
                    } else {
                        yhi = ylo + 1;
                    }
                    if (xlo >= W - 1) {
                        xlo = xhi = W - 1;
                        xx = float(xlo);
                    } else {
                        xhi = xlo + 1;
                    }
                    float ly = yy - float(ylo), lx = xx - float(xlo), hy = 1.0 - ly, hx = 1.0 - lx;
                    float a = hy * hx * args.x.v[plane + uint(ylo * W + xlo)];
                    float b = hy * lx * args.x.v[plane + uint(ylo * W + xhi)];
                    float e = ly * hx * args.x.v[plane + uint(yhi * W + xlo)];
                    float f = ly * lx * args.x.v[plane + uint(yhi * W + xhi)];
#if MAX
                    v = max(max(a, b), max(e, f));
#else
                    v = a + b + e + f;
#endif
                }
#if MAX
                acc = first ? v : max(acc, v);
                first = false;
#else
                acc += v;
#endif
            }
        }
#if !MAX
        acc /= float(max(gh * gw, 1));
#endif
        args.y.v[o] = acc;
        if (COUNT - o <= step)
            break;
        o += step;
    }
}
