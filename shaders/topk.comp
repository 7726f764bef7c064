#version 460
// topk.comp: the K largest (LARGEST 1) or smallest elements of each row, in
// order, with their indices (i64). Rows as in reduce.glsl (ROWS, LEN,
// INNER); outputs have K in place of LEN. One workgroup per row; each of the
// K selection rounds (select.glsl) is a parallel reduction over the row.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 values;
    F32R x;
    I64 indices;
    KILN_DIMS
} args;

#include "reduce.glsl"
#include "select.glsl"

void main() {
    for (uint row = gl_WorkGroupID.x; row < ROWS; row += gl_NumWorkGroups.x) {
        const uint base = kiln_row_base(kiln_row_of(row));
        const uint obase = (kiln_row_of(row) / INNER) * (K * INNER) + (kiln_row_of(row) % INNER);
        float pv = 0.0;
        uint pi = NONE_I;
        for (uint k = 0; k < K; ++k) {
            select_next(base, pv, pi, pv, pi);
            if (gl_LocalInvocationID.x == 0) {
                args.values.v[obase + k * INNER] = pv;
                args.indices.v[obase + k * INNER] = int64_t(pi);
            }
        }
    }
}
