// select.glsl: the total order that top-k and sampling select by, and one
// selection round. Element (v, i) ranks before (w, j) when v is larger (or
// smaller, LARGEST 0), or equal with i < j; NaN ranks first, as in numpy.
// A round finds the best element ranked after (pv, pi) (the previous pick;
// NONE_I for the first round), so K rounds give the top K in order with no
// scratch memory. Needs reduce.glsl's WG and rows (kiln_row_base).
#define NONE_I 0xffffffffu
shared float sel_v[WG];
shared uint sel_i[WG];

bool ranks_before(float v, uint i, float w, uint j) {
    if (j == NONE_I)
        return i != NONE_I;
    if (i == NONE_I)
        return false;
    bool vn = isnan(v), wn = isnan(w);
    if (vn || wn)
        return vn && wn ? i < j : vn;
    if (v != w)
        return LARGEST != 0 ? v > w : v < w;
    return i < j;
}

// The best element of the row ranked after (pv, pi); NONE_I when none is.
// Every invocation of the group must call it.
void select_next(uint base, float pv, uint pi, out float bv, out uint bi) {
    const uint l = gl_LocalInvocationID.x;
    bv = 0.0;
    bi = NONE_I;
    for (uint c = l; c < LEN; c += WG) {
        float v = args.x.v[base + c * INNER];
        if ((pi == NONE_I || ranks_before(pv, pi, v, c)) && ranks_before(v, c, bv, bi)) {
            bv = v;
            bi = c;
        }
    }
    sel_v[l] = bv;
    sel_i[l] = bi;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (l < s && ranks_before(sel_v[l + s], sel_i[l + s], sel_v[l], sel_i[l])) {
            sel_v[l] = sel_v[l + s];
            sel_i[l] = sel_i[l + s];
        }
        barrier();
    }
    bv = sel_v[0];
    bi = sel_i[0];
    barrier();
}
