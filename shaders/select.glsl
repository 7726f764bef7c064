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

// SEL_LOAD(base, c, v, i): candidate c of a selection, its value v and
// index i (by default element c of the row at base, index c; topk.comp's
// second pass reads the first's candidates instead).
#ifndef SEL_LOAD
#define SEL_LOAD(base, c, v, i) v = args.x.v[(base) + (c) * INNER]; i = (c)
#endif

// The best of candidates begin to end - 1 ranked after (pv, pi); NONE_I
// when none is. Every invocation of the group must call it.
void select_range(uint base, uint begin, uint end, float pv, uint pi, out float bv,
                  out uint bi) {
    const uint l = gl_LocalInvocationID.x;
    bv = 0.0;
    bi = NONE_I;
    for (uint c = begin + l; c < end; c += WG) {
        float v;
        uint i;
        SEL_LOAD(base, c, v, i);
        if ((pi == NONE_I || ranks_before(pv, pi, v, i)) && ranks_before(v, i, bv, bi)) {
            bv = v;
            bi = i;
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

// The best element of the row ranked after (pv, pi).
void select_next(uint base, float pv, uint pi, out float bv, out uint bi) {
    select_range(base, 0, LEN, pv, pi, bv, bi);
}
