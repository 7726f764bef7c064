#version 460
// cumsum.comp: running sums along a row (rows as in reduce.glsl).
//
// One workgroup per row walks it in chunks of WG elements: each invocation
// loads one element, the chunk is scanned in shared memory (Hillis-Steele,
// log2(WG) steps) and the carry of the chunks before is added. EXCLUSIVE 1
// leaves each element out of its own sum; REVERSE 1 sums from the row's end.
// SCAN_T (with Y_BUF and X_BUF): the elements' type, float by default, int
// or int64_t for integer sums (exact, wrapping as the integers do).
//
// SPLIT (few long rows of floats, fixed: lower_rows.c, cumsum_chunks): each
// row's LEN elements, in the scan's order, in CHUNKS chunks of CHUNK, a
// workgroup a chunk, in two dispatches. SPLIT 1 writes each chunk's sum to
// sums[w] (w = row * CHUNKS + chunk); SPLIT 2 starts its chunk's scan from
// the sum of the row's chunks before it.
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
#if SPLIT
    F32 sums;
#endif
    KILN_DIMS
} args;

#include "reduce.glsl"

shared SCAN_T scan[WG];

#if SPLIT
#define ITEMS (ROWS * CHUNKS)
#else
#define ITEMS ROWS
#define CHUNKS 1
#define CHUNK LEN
#endif

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint w = gl_WorkGroupID.x; w < ITEMS; w += gl_NumWorkGroups.x) {
        const uint row = w / CHUNKS, begin = (w % CHUNKS) * CHUNK;
        const uint end = min(begin + CHUNK, uint(LEN));
        const uint base = kiln_row_base(kiln_row_of(row));
#if SPLIT == 1 // the chunk's sum
        SCAN_T s = SCAN_T(0);
        for (uint c = begin + l; c < end; c += WG)
            s += args.x.v[base + (REVERSE != 0 ? LEN - 1 - c : c) * INNER];
        s = kiln_reduce_sum(s);
        if (l == 0)
            args.sums.v[w] = s;
#else
#if SPLIT == 2 // the chunks' before it
        SCAN_T before = SCAN_T(0);
        for (uint i = l; i < w % CHUNKS; i += WG)
            before += args.sums.v[row * CHUNKS + i];
        SCAN_T carry = kiln_reduce_sum(before);
#else
        SCAN_T carry = SCAN_T(0);
#endif
        for (uint c0 = begin; c0 < end; c0 += WG) {
            const uint c = c0 + l;
            const uint j = REVERSE != 0 ? LEN - 1 - c : c;
            const SCAN_T v = c < end ? args.x.v[base + j * INNER] : SCAN_T(0);
            scan[l] = v;
            barrier();
            for (uint s = 1; s < WG; s <<= 1) {
                SCAN_T add = l >= s ? scan[l - s] : SCAN_T(0);
                barrier();
                scan[l] += add;
                barrier();
            }
            const SCAN_T inclusive = scan[l] + carry;
            if (c < end)
                args.y.v[base + j * INNER] = EXCLUSIVE != 0 ? inclusive - v : inclusive;
            carry += scan[WG - 1];
            barrier();
        }
#endif
    }
}
