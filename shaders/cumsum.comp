#version 460
// cumsum.comp: running sums along a row (rows as in reduce.glsl).
//
// One workgroup per row walks it in chunks of WG elements: each invocation
// loads one element, the chunk is scanned in shared memory (Hillis-Steele,
// log2(WG) steps) and the carry of the chunks before is added. EXCLUSIVE 1
// leaves each element out of its own sum; REVERSE 1 sums from the row's end.
// SCAN_T (with Y_BUF and X_BUF): the elements' type, float by default, int
// or int64_t for integer sums (exact, wrapping as the integers do).
#include "common.glsl"

layout(local_size_x = WG) in;

#ifndef SCAN_T
#define SCAN_T float
#define Y_BUF F32
#define X_BUF F32R
#endif

layout(push_constant) uniform Args {
    Y_BUF y;
    X_BUF x;
    KILN_DIMS
} args;

#include "reduce.glsl"

shared SCAN_T scan[WG];

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint row = gl_WorkGroupID.x; row < ROWS; row += gl_NumWorkGroups.x) {
        const uint base = kiln_row_base(kiln_row_of(row));
        SCAN_T carry = SCAN_T(0);
        for (uint c0 = 0; c0 < LEN; c0 += WG) {
            const uint c = c0 + l;
            const uint j = REVERSE != 0 ? LEN - 1 - c : c;
            const SCAN_T v = c < LEN ? args.x.v[base + j * INNER] : SCAN_T(0);
            scan[l] = v;
            barrier();
            for (uint s = 1; s < WG; s <<= 1) {
                SCAN_T add = l >= s ? scan[l - s] : SCAN_T(0);
                barrier();
                scan[l] += add;
                barrier();
            }
            const SCAN_T inclusive = scan[l] + carry;
            if (c < LEN)
                args.y.v[base + j * INNER] = EXCLUSIVE != 0 ? inclusive - v : inclusive;
            carry += scan[WG - 1];
            barrier();
        }
    }
}
