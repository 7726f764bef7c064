// scores.glsl: attention's scores as attention.comp, flash.comp and
// flash_cm.comp compute them. Which keys a query row sees (CAUSAL: key j
// when j <= last, the row's newest key i + SK - SQ; WINDOW > 0: only the
// WINDOW newest of those), and a visible key's score from q . k: times
// SCALE, capped by SOFTCAP * tanh(s / SOFTCAP) where SOFTCAP_ON, plus the
// mask's element (b, h, i, j) where HAS_MASK (MS_* its strides; the
// kernel's Args hold args.mask). Included after Args.

// Whether key j is visible to a row whose newest key is `last`.
bool kiln_key_visible(uint j, int last) {
    bool visible = true;
#if CAUSAL
    visible = int(j) <= last;
#endif
#if WINDOW > 0
    visible = visible && int(j) > last - WINDOW;
#endif
    return visible;
}

// The score of visible key j of row i (batch b, head h) from q . k.
float kiln_score(float qk, uint b, uint h, uint i, uint j) {
    float s = qk * SCALE;
#if SOFTCAP_ON
    s = SOFTCAP * kiln_tanh(s / SOFTCAP);
#endif
#if HAS_MASK
    s += float(args.mask.v[b * MS_B + h * MS_H + i * MS_I + j * MS_J]);
#endif
    return s;
}
