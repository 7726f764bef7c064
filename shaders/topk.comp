#version 460
// topk.comp: the K largest (LARGEST 1) or smallest elements of each row, in
// order, with their indices (i64). Rows as in reduce.glsl (ROWS, LEN,
// INNER); outputs have K in place of LEN. One workgroup per row; each of the
// K selection rounds (select.glsl) is a parallel reduction over the row.
//
// SPLIT (few long rows, fixed: lower_rows.c, topk_chunks): each row's LEN
// elements in CHUNKS chunks of CHUNK, in two dispatches. SPLIT 1, a
// workgroup a chunk, selects the chunk's K best into cand (K pairs of value
// and index, the index's bits as a float, NONE_I where the chunk has fewer);
// SPLIT 2, a workgroup a row, selects the row's K from its CHUNKS * K
// candidates, ranked by value and original index as the whole row would be.
#include "common.glsl"

layout(local_size_x = WG) in;

#ifndef SPLIT
#define SPLIT 0
#endif

layout(push_constant) uniform Args {
    F32 values;
    F32R x;
    I64 indices;
#if SPLIT
    F32 cand;
#endif
    KILN_DIMS
} args;

#include "reduce.glsl"
#if SPLIT == 2
#define SEL_LOAD(base, c, v, i) \
    v = args.cand.v[2 * ((base) + (c))]; i = floatBitsToUint(args.cand.v[2 * ((base) + (c)) + 1])
#endif
#include "select.glsl"

#if SPLIT == 1
void main() {
    for (uint w = gl_WorkGroupID.x; w < ROWS * CHUNKS; w += gl_NumWorkGroups.x) {
        const uint base = kiln_row_base(kiln_row_of(w / CHUNKS));
        const uint begin = (w % CHUNKS) * CHUNK, end = min(begin + CHUNK, uint(LEN));
        float pv = 0.0;
        uint pi = NONE_I;
        for (uint k = 0; k < K; ++k) {
            select_range(base, begin, end, pv, pi, pv, pi);
            if (gl_LocalInvocationID.x == 0) {
                args.cand.v[2 * (w * K + k)] = pv;
                args.cand.v[2 * (w * K + k) + 1] = uintBitsToFloat(pi);
            }
        }
    }
}
#else
void main() {
    for (uint row = gl_WorkGroupID.x; row < ROWS; row += gl_NumWorkGroups.x) {
#if SPLIT == 2 // the row's candidates
        const uint base = row * CHUNKS * K, len = CHUNKS * K;
#else
        const uint base = kiln_row_base(kiln_row_of(row)), len = LEN;
#endif
        const uint obase = (kiln_row_of(row) / INNER) * (K * INNER) + (kiln_row_of(row) % INNER);
        float pv = 0.0;
        uint pi = NONE_I;
        for (uint k = 0; k < K; ++k) {
            select_range(base, 0, len, pv, pi, pv, pi);
            if (gl_LocalInvocationID.x == 0) {
                args.values.v[obase + k * INNER] = pv;
                args.indices.v[obase + k * INNER] = int64_t(pi);
            }
        }
    }
}
#endif
