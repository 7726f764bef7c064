#version 460
// nms.comp: ONNX NonMaxSuppression. boxes [B, N, 4], scores [B, C, N].
//
// PHASE 1, one workgroup per (batch, class) pair: the candidates are the
// boxes whose score is above SCORE_THRESHOLD (SCORE_FILTER 1; every box
// otherwise; NaN scores never); up to K rounds each pick the best candidate
// left (highest score, then lowest box number) and drop it and every
// candidate whose intersection over union with it is above IOU_THRESHOLD.
// Dropping at once what a pick suppresses selects what ONNX's reference
// selects by checking each box against the picks before it. Each
// invocation owns the boxes j = its index mod WG (their flags in alive),
// so only the picks cross invocations. picks[pair] = count, box numbers.
//
// PHASE 2, one workgroup: every pair's picks in order as (batch, class,
// box) rows of selected, -1 in the rows after them, and (WITH_COUNT) the
// number of rows selected.
//
// Boxes are [y1, x1, y2, x2] (either corner first), or CENTER 1: [x_centre,
// y_centre, width, height].
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    I64 selected;
    I64 count;
    F32R boxes;
    F32R scores;
    F32 alive;
    F32 picks;
    KILN_DIMS
} args;

#define NONE 0xffffffffu
#define PAIRS (B * C)

shared float best_v[WG];
shared uint best_i[WG];

// (v, i) before (w, j): a higher score, or an equal one and a lower box.
bool better(float v, uint i, float w, uint j) {
    if (i == NONE)
        return false;
    return j == NONE || v > w || (v == w && i < j);
}

// [x_min, y_min, x_max, y_max] of box i of batch b.
vec4 corners(uint b, uint i) {
    uint o = (b * uint(N) + i) * 4u;
    vec4 r = vec4(args.boxes.v[o], args.boxes.v[o + 1u], args.boxes.v[o + 2u],
                  args.boxes.v[o + 3u]);
#if CENTER
    return vec4(r.x - r.z / 2.0, r.y - r.w / 2.0, r.x + r.z / 2.0, r.y + r.w / 2.0);
#else
    return vec4(min(r.y, r.w), min(r.x, r.z), max(r.y, r.w), max(r.x, r.z));
#endif
}

// Whether a box with these corners is suppressed by the pick's, as ONNX's
// reference decides it (no overlap or an empty box: not suppressed).
bool suppressed(vec4 p, vec4 q) {
    float ix0 = max(p.x, q.x), ix1 = min(p.z, q.z);
    if (ix1 <= ix0)
        return false;
    float iy0 = max(p.y, q.y), iy1 = min(p.w, q.w);
    if (iy1 <= iy0)
        return false;
    float inter = (ix1 - ix0) * (iy1 - iy0);
    if (inter <= 0.0)
        return false;
    float a1 = (p.z - p.x) * (p.w - p.y), a2 = (q.z - q.x) * (q.w - q.y);
    float uni = a1 + a2 - inter;
    if (a1 <= 0.0 || a2 <= 0.0 || uni <= 0.0)
        return false;
    return inter / uni > IOU_THRESHOLD;
}

void main() {
    const uint l = gl_LocalInvocationID.x;
#if PHASE == 1
    for (uint pair = gl_WorkGroupID.x; pair < PAIRS; pair += gl_NumWorkGroups.x) {
        const uint b = pair / uint(C), base = pair * uint(N), out_base = pair * uint(K + 1);
        for (uint j = l; j < uint(N); j += WG) {
            float s = args.scores.v[base + j];
            bool ok = !isnan(s);
#if SCORE_FILTER
            ok = ok && s > SCORE_THRESHOLD;
#endif
            args.alive.v[base + j] = ok ? 1.0 : 0.0;
        }
        uint count = 0u;
        for (uint k = 0u; k < uint(K); ++k) {
            float bv = 0.0;
            uint bi = NONE;
            for (uint j = l; j < uint(N); j += WG) {
                float s = args.scores.v[base + j];
                if (args.alive.v[base + j] != 0.0 && better(s, j, bv, bi)) {
                    bv = s;
                    bi = j;
                }
            }
            best_v[l] = bv;
            best_i[l] = bi;
            barrier();
            for (uint s = WG / 2u; s > 0u; s >>= 1) {
                if (l < s && better(best_v[l + s], best_i[l + s], best_v[l], best_i[l])) {
                    best_v[l] = best_v[l + s];
                    best_i[l] = best_i[l + s];
                }
                barrier();
            }
            const uint pick = best_i[0];
            barrier(); // every invocation has read the pick before the next round
            if (pick == NONE)
                break;
            if (l == 0u)
                args.picks.v[out_base + 1u + k] = float(pick);
            count++;
            const vec4 p = corners(b, pick);
            for (uint j = l; j < uint(N); j += WG)
                if (args.alive.v[base + j] != 0.0 && (j == pick || suppressed(p, corners(b, j))))
                    args.alive.v[base + j] = 0.0;
        }
        if (l == 0u)
            args.picks.v[out_base] = float(count);
    }
#else
    uint row = 0u;
    for (uint pair = 0u; pair < PAIRS; ++pair) {
        const uint n = uint(args.picks.v[pair * uint(K + 1)]);
        for (uint r = l; r < n; r += WG) {
            const uint o = (row + r) * 3u;
            args.selected.v[o] = int64_t(pair / uint(C));
            args.selected.v[o + 1u] = int64_t(pair % uint(C));
            args.selected.v[o + 2u] = int64_t(args.picks.v[pair * uint(K + 1) + 1u + r]);
        }
        row += n;
    }
    for (uint r = row + l; r < uint(PAIRS * K); r += WG)
        for (uint e = 0u; e < 3u; ++e)
            args.selected.v[r * 3u + e] = int64_t(-1);
#if WITH_COUNT
    if (l == 0u)
        args.count.v[0] = int64_t(row);
#endif
#endif
}
