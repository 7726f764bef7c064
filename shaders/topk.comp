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

#if RADIX
// Radix selection (RADIX 1, K at most 256): a workgroup finds a range's K
// best in about five passes over it, where K selection rounds take K. Each
// element's key (sel_key) orders as ranks_before does: a larger key ranks
// first, NaN first of all, -0 as +0; ties go by index, the smaller first,
// so the order is that of (key, ~index) as 64 bits. Passes 1-4 find the K-th
// best key a byte at a time (a histogram of the byte among the elements
// that match the bytes found so far, in shared memory); where more elements
// share that key than the K need, passes 5-8 find the K-th best ~index
// among them the same way. The K elements at or above that threshold are
// then gathered (an atomic counter) and each one's place is its count of
// better elements among them (K^2 comparisons). Fewer valid elements than
// K (a short last chunk; candidates NONE_I): all of them, the rest NONE_I.
#if WG < 16
#error "radix selection sums its 16 groups of bins with 16 invocations"
#endif
shared uint rs_hist[256];
shared uint rs_group[16];
// rs_state: the key's prefix, ~index's prefix, how many still wanted
// (0xffffffff: all), passes done (16 + the pass where the threshold's
// elements were exactly those wanted), how many gathered
shared uint rs_state[5];
shared uint rs_key[K];
shared uint rs_idx[K];
shared float rs_val[K];
shared uint rs_place[K];

uint sel_key(float v) {
    if (isnan(v))
        return 0xffffffffu;
    const uint b = floatBitsToUint(v == 0.0 ? 0.0 : v);
    const uint up = (b & 0x80000000u) != 0u ? ~b : b | 0x80000000u; // grows with v
#if LARGEST
    return up;
#else
    return ~up;
#endif
}

// whether (ka, ~ia) is above (kb, ~ib)
bool rs_above(uint ka, uint ia, uint kb, uint ib) {
    return ka != kb ? ka > kb : ia < ib;
}

// The K best of candidates begin to end - 1 in rs_key, rs_idx, rs_val,
// their places (0 the best) in rs_place; returns how many (at most K).
// Every invocation of the group must call it.
uint radix_select(uint base, uint begin, uint end) {
    const uint l = gl_LocalInvocationID.x;
    if (l == 0u) {
        rs_state[0] = 0u;
        rs_state[1] = 0u;
        rs_state[2] = K;
        rs_state[3] = 0u;
        rs_state[4] = 0u;
    }
    bool all = false; // fewer valid candidates than K: every one
    for (uint pass = 0u; pass < 8u; ++pass) {
        for (uint h = l; h < 256u; h += WG)
            rs_hist[h] = 0u;
        barrier();
        const uint shift = 24u - 8u * (pass & 3u);
        const uint mask = pass < 4u ? ~(0xffffffffu >> (8u * pass)) : 0xffffffffu;
        const uint imask = pass < 4u ? 0u : ~(0xffffffffu >> (8u * (pass - 4u)));
        const uint kp = rs_state[0], ip = rs_state[1];
        for (uint c = begin + l; c < end; c += WG) {
            float v;
            uint i;
            SEL_LOAD(base, c, v, i);
            if (i == NONE_I)
                continue;
            const uint key = sel_key(v);
            if (pass < 4u && (key & mask) == kp)
                atomicAdd(rs_hist[(key >> shift) & 255u], 1u);
            else if (pass >= 4u && key == kp && (~i & imask) == ip)
                atomicAdd(rs_hist[(~i >> shift) & 255u], 1u);
        }
        barrier();
        // the byte's bins in 16 groups of 16, summed by 16 invocations, so
        // that one invocation walks 16 group sums and one group's bins
        // (not 256 bins serially)
        if (l < 16u) {
            uint t = 0u;
            for (uint h = 0u; h < 16u; ++h)
                t += rs_hist[16u * l + h];
            rs_group[l] = t;
        }
        barrier();
        if (l == 0u) {
            uint want = rs_state[2], above = 0u, total = 0u, d = 0u, g = 0u;
            for (uint h = 0u; h < 16u; ++h)
                total += rs_group[h];
            if (pass == 0u && total <= want) {
                rs_state[2] = 0xffffffffu; // all of them
            } else {
                for (int h = 15; h >= 0; --h) {
                    if (above + rs_group[h] >= want) {
                        g = uint(h);
                        break;
                    }
                    above += rs_group[h];
                }
                for (int h = 15; h >= 0; --h) {
                    const uint c = rs_hist[16u * g + uint(h)];
                    if (above + c >= want) {
                        d = 16u * g + uint(h);
                        break;
                    }
                    above += c;
                }
                if (pass < 4u)
                    rs_state[0] = kp | (d << shift);
                else
                    rs_state[1] = ip | (d << shift);
                // the elements at the threshold found so far are exactly
                // the ones still wanted: no finer pass needed
                rs_state[2] = want - above;
                rs_state[3] = rs_hist[d] == want - above ? 16u + pass : pass + 1u;
            }
        }
        barrier();
        all = rs_state[2] == 0xffffffffu;
        if (all || rs_state[3] >= 16u)
            break;
    }
    // the threshold: (kt, it) where an ~index pass ran, else kt alone
    const uint kt = rs_state[0], it = rs_state[1];
    const bool by_index = !all && (rs_state[3] >= 20u || rs_state[3] == 8u);
    barrier();
    for (uint c = begin + l; c < end; c += WG) {
        float v;
        uint i;
        SEL_LOAD(base, c, v, i);
        if (i == NONE_I)
            continue;
        const uint key = sel_key(v);
        if (all || key > kt || key == kt && (!by_index || ~i >= it)) {
            const uint at = atomicAdd(rs_state[4], 1u);
            if (at < K) {
                rs_key[at] = key;
                rs_idx[at] = i;
                rs_val[at] = v;
            }
        }
    }
    barrier();
    const uint n = min(rs_state[4], K);
    for (uint e = l; e < n; e += WG) {
        uint place = 0u;
        for (uint f = 0u; f < n; ++f)
            place += rs_above(rs_key[f], rs_idx[f], rs_key[e], rs_idx[e]) ? 1u : 0u;
        rs_place[e] = place;
    }
    barrier();
    return n;
}
#endif

#if SPLIT == 1 && RADIX
void main() {
    for (uint w = gl_WorkGroupID.x; w < ROWS * CHUNKS; w += gl_NumWorkGroups.x) {
        const uint base = kiln_row_base(kiln_row_of(w / CHUNKS));
        const uint begin = (w % CHUNKS) * CHUNK, end = min(begin + CHUNK, uint(LEN));
        const uint n = radix_select(base, begin, end);
        for (uint e = gl_LocalInvocationID.x; e < K; e += WG) {
            const uint at = 2u * (w * K + (e < n ? rs_place[e] : e));
            args.cand.v[at] = e < n ? rs_val[e] : 0.0;
            args.cand.v[at + 1u] = uintBitsToFloat(e < n ? rs_idx[e] : NONE_I);
        }
        barrier();
    }
}
#elif SPLIT == 1
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
#if RADIX
        const uint n = radix_select(base, 0u, len);
        for (uint e = gl_LocalInvocationID.x; e < n; e += WG) {
            args.values.v[obase + rs_place[e] * INNER] = rs_val[e];
            args.indices.v[obase + rs_place[e] * INNER] = int64_t(rs_idx[e]);
        }
        barrier();
        continue;
#endif
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
