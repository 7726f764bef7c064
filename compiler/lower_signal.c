/*
 * lower_signal.c: dft, stft, log_mel and welch (fft.comp), with the
 * twiddle and window tables the compiler computes.
 */
#include "lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* Transforms up to this length keep the signal in shared memory (16 KB, the
 * least a Vulkan device offers); powers of two from 2 to it take the radix-2
 * path, the rest the direct sum. */
#define FFT_SMEM_MAX 2048


static Tensor *twiddle_table(Program *p, Node *n, int64_t L) {
    float *v = xcalloc((size_t)(2 * L), sizeof *v);
    twiddle_values(L, v);
    return table_weight(p, n, format("kiln.twiddles.%lld", (long long)L), 2,
                        (int64_t[]){L, 2}, v);
}

/* A periodic window of L samples (NULL for the rectangle); *sumsq gets the
 * sum of its squares. */
static Tensor *window_table(Program *p, Node *n, int kind, int64_t L, double *sumsq) {
    double *w = xcalloc((size_t)L, sizeof *w);
    float *f = xcalloc((size_t)L, sizeof *f);
    window_values((WindowKind)kind, L, true, w);
    *sumsq = 0;
    for (int64_t i = 0; i < L; i++) {
        f[i] = (float)w[i];
        *sumsq += (double)f[i] * f[i];
    }
    if (kind == WINDOW_RECT)
        return NULL;
    return table_weight(p, n, format("kiln.%s.%lld", window_names[kind], (long long)L), 1,
                        (int64_t[]){L}, f);
}

/* The transforms of sp from x into y, whose bin k of signal (o, i) is at
 * o * out_so + i * out_si + k * out_sj (|X|^2 when power, else two floats). */
static Dispatch *fft_dispatch(Program *p, Node *n, const Spectral *sp, Tensor *x, Tensor *y,
                              Tensor *window, bool power, bool detrend,
                              const int64_t *out_strides) {
    if (sp->outer * sp->inner * sp->nout == 0)
        return NULL;
    Dispatch *d = new_dispatch(p, n, "fft");
    int64_t L = sp->L, wg = 1;
    while (wg * 2 <= L && wg < 256)
        wg *= 2;
    bool smem = L <= FFT_SMEM_MAX, radix2 = smem && L >= 2 && (L & (L - 1)) == 0;
    int log2l = 0;
    while (((int64_t)1 << log2l) < L)
        log2l++;
    d->local_size = (uint32_t)wg;
    define_int(d, "WG", wg);
    define_int(d, "L", L);
    define_int(d, "LOG2L", log2l);
    define_int(d, "NIN", sp->nin);
    define_int(d, "NOUT", sp->nout);
    define_int(d, "C_IN", sp->C);
    define_int(d, "OUTER", sp->outer);
    define_int(d, "INNER", sp->inner);
    define_int(d, "IN_SO", sp->in_so);
    define_int(d, "IN_SI", sp->in_si);
    define_int(d, "IN_SJ", sp->in_sj);
    define_int(d, "OUT_SO", out_strides[0]);
    define_int(d, "OUT_SI", out_strides[1]);
    define_int(d, "OUT_SJ", out_strides[2]);
    define_int(d, "INVERSE", sp->inverse);
    define_int(d, "POWER", power);
    define_int(d, "DETREND", detrend);
    define_int(d, "SMEM", smem);
    define_int(d, "RADIX2", radix2);
    define_int(d, "HAS_WINDOW", window != NULL);
    dispatch_arg(d, y, true);
    dispatch_arg(d, x, false);
    dispatch_arg(d, twiddle_table(p, n, L), false);
    if (window)
        dispatch_arg(d, window, false);
    else
        dispatch_unused(d, x);
    d->groups[0] = groups_for(sp->outer * sp->inner, 1);
    if (!radix2) /* the bins spread over workgroups (fft.comp) */
        d->groups[1] = groups_for(sp->nout, wg);
    uint64_t per = radix2 ? (uint64_t)(5 * L * log2l) : (uint64_t)(8 * sp->nin * sp->nout);
    d->flops = per * (uint64_t)(sp->outer * sp->inner);
    return d;
}


/* dft and stft: complex bins, two floats each. */
void lower_dft(Program *p, Node *n) {
    Spectral sp;
    spectral_params(n, &sp);
    Tensor *window = n->op == OP_STFT && n->ninputs > 1 ? n->inputs[1] : NULL;
    int64_t strides[3];
    if (n->op == OP_DFT) { /* [outer, nout, inner, 2] */
        strides[0] = sp.nout * sp.inner * 2;
        strides[1] = 2;
        strides[2] = sp.inner * 2;
    } else { /* [batch, frames, nout, 2] */
        strides[0] = sp.inner * sp.nout * 2;
        strides[1] = sp.nout * 2;
        strides[2] = 2;
    }
    fft_dispatch(p, n, &sp, n->inputs[0], n->outputs[0], window, false, false, strides);
}

/* log_mel: the power spectrogram of every frame (scratch), then one matmul
 * by the mel filter bank with log(max(x, eps)) in its epilogue. */
void lower_log_mel(Program *p, Node *n) {
    Spectral sp;
    spectral_params(n, &sp);
    Tensor *y = n->outputs[0];
    int64_t frames = sp.outer * sp.inner, mels = y->shape[y->rank - 1];
    double sumsq;
    Tensor *window = window_table(p, n, sp.window, sp.L, &sumsq);
    Tensor *spec = scratch(p, n, "power", 2, (int64_t[]){frames, sp.nout});
    int64_t strides[3] = {sp.inner * sp.nout, sp.nout, 1};
    if (!fft_dispatch(p, n, &sp, n->inputs[0], spec, window, true, false, strides))
        return;
    Tensor *mel = n->ninputs > 1 ? n->inputs[1] : NULL;
    if (!mel) {
        double rate = attr_float(n, "sample_rate"), fmax = attr_float(n, "fmax");
        double *m = xcalloc((size_t)(sp.nout * mels), sizeof *m);
        float *f = xcalloc((size_t)(sp.nout * mels), sizeof *f);
        if (!mel_weight_values(mels, sp.L, rate, attr_float(n, "fmin"),
                               fmax > 0 ? fmax : rate / 2, m))
            node_error(n, "the mel filters reach past the last DFT bin");
        for (int64_t i = 0; i < sp.nout * mels; i++)
            f[i] = (float)m[i];
        mel = table_weight(p, n, format("%s.mel", n->name), 2, (int64_t[]){sp.nout, mels}, f);
    }
    MatmulShape s = matrix_product(y, spec, mel, frames, mels, sp.nout, false, false);
    for (Dispatch *d = matmul_dispatch(p, n, &s); d; d = d->variant) {
        define_float(d, "EPS", attr_float(n, "eps"));
        define_str(d, "ACT(x)", "log(max(x, EPS))");
        bind_bias(d, NULL, whole(spec), 1.0, spec);
    }
}

/* welch: the power spectrum of every detrended, windowed segment
 * (scratch), then their mean, scaled to a one-sided density. */
void lower_welch(Program *p, Node *n) {
    Spectral sp;
    spectral_params(n, &sp);
    double sumsq;
    Tensor *window = window_table(p, n, sp.window, sp.L, &sumsq);
    Tensor *spec = scratch(p, n, "power", 3, (int64_t[]){sp.outer, sp.inner, sp.nout});
    int64_t strides[3] = {sp.inner * sp.nout, sp.nout, 1};
    if (!fft_dispatch(p, n, &sp, n->inputs[0], spec, window, true, true, strides))
        return;
    Dispatch *d = new_dispatch(p, n, "fft");
    d->local_size = 256;
    define_int(d, "WG", 256);
    define_int(d, "MODE_AVERAGE", 1);
    define_int(d, "OUTER", sp.outer);
    define_int(d, "NOUT", sp.nout);
    define_int(d, "FRAMES", sp.inner);
    define_int(d, "SEGMENT", sp.L);
    define_float(d, "SCALE", 1.0 / (attr_float(n, "fs") * sumsq * (double)sp.inner));
    dispatch_arg(d, n->outputs[0], true);
    dispatch_arg(d, spec, false);
    dispatch_unused(d, spec);
    dispatch_unused(d, spec);
    d->groups[0] = groups_for(sp.outer * sp.nout, 256);
    d->flops = (uint64_t)(sp.outer * sp.inner * sp.nout);
}
