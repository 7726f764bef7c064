/*
 * shape_signal.c: shape rules of dft, stft, log_mel and welch.
 */
#include "shape.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* dft(x [..., N, ..., 1|2]) -> [..., L or L/2+1, ..., 2]. */
void shape_dft(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    Spectral sp;
    spectral_params(n, &sp);
    int axis = norm_axis(n, "axis", attr_int(n, "axis"), x->rank);
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[axis] = sp.nout;
    shape[x->rank - 1] = 2;
    set_output(n, KILN_DTYPE_F32, x->rank, shape);
}

/* stft(signal [B, T(, 1|2)], [window [L]]) -> [B, frames, bins, 2]. */
void shape_stft(Node *n) {
    require_f32(n);
    Spectral sp;
    spectral_params(n, &sp);
    set_output(n, KILN_DTYPE_F32, 4, (int64_t[]){sp.outer, sp.inner, sp.nout, 2});
}

/* log_mel(x [..., T], [mel [n_fft/2+1, n_mels]]) -> [..., frames, n_mels];
 * welch(x [..., T]) -> [..., segment/2+1]. */
void shape_log_mel(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    Spectral sp;
    spectral_params(n, &sp);
    double rate = positive_float(n, "sample_rate");
    int64_t mels;
    if (n->ninputs > 1) {
        Tensor *m = n->inputs[1];
        if (m->rank != 2 || m->shape[0] != sp.nout)
            node_error_at(n, n->input_locs[1], "the mel matrix '%s' is %s; it must be "
                          "[%lld, n_mels] (n_fft / 2 + 1 bins)", m->name,
                          shape_str(m->rank, m->shape), (long long)sp.nout);
        mels = m->shape[1];
    } else {
        mels = positive_attr(n, "n_mels", 1 << 16);
        double fmax = attr_float(n, "fmax"), fmin = attr_float(n, "fmin");
        if (fmax == 0)
            fmax = rate / 2;
        if (!(fmin >= 0 && fmin < fmax && fmax <= rate / 2))
            node_error_at(n, node_attr(n, "fmax") ? attr_loc(n, "fmax") : n->loc, "need "
                          "0 <= fmin < fmax <= sample_rate / 2 (%g), got fmin %g, fmax %g",
                          rate / 2, fmin, fmax);
    }
    positive_float(n, "eps");
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = sp.inner;
    if (x->rank + 1 > MAX_RANK)
        node_error(n, "the result would have rank %d", x->rank + 1);
    shape[x->rank] = mels;
    set_output(n, KILN_DTYPE_F32, x->rank + 1, shape);
}

void shape_welch(Node *n) {
    Tensor *x = n->inputs[0];
    require_f32(n);
    Spectral sp;
    spectral_params(n, &sp);
    positive_float(n, "fs");
    int64_t shape[MAX_RANK];
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    shape[x->rank - 1] = sp.nout;
    set_output(n, KILN_DTYPE_F32, x->rank, shape);
}
