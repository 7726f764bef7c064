#version 460
// norm.comp: layer, RMS, instance and group normalization, optionally on
// x + residual (writing the sum too).
//
// Rows as in reduce.glsl (ROWS, LEN, INNER = 1): each row is normalized on
// its own. RMS 0: y = (v - mean) / sqrt(var + EPS); RMS 1:
// y = v / sqrt(mean(v^2) + EPS); then * gamma + beta where present
// (HAS_GAMMA, HAS_BETA). gamma and beta of element j of row r are at
// (r % PR) * PJ + j / PD: PR 1, PJ 0, PD 1 for layer norms (one value per
// position), PR = C, PJ 1, PD = LEN for instance norm (one per channel),
// PR = G, PJ = C/G, PD = H*W for group norm. HAS_RES: v = x + res, and
// HAS_SUM writes v out. The variance is taken from centered values, not as
// E[x^2] - E[x]^2, which cancels badly for rows with a large mean.
//
// x, res, y and sum are f32 or f16 (the compiler defines X_BUF, RES_BUF,
// Y_BUF and SUM_BUF, their buffer types, and Y_T and SUM_T, the element
// types written); gamma and beta are f32; the arithmetic is f32.
//
// SPLIT (few long rows, contiguous: lower_rows.c, norm_chunks): each row's
// LEN elements are CHUNKS chunks of CHUNK (the last one shorter), a
// workgroup a chunk, in two dispatches. SPLIT 1 writes each chunk's mean m
// and the sum of its squared deviations q to stats (RMS: 0 and the sum of
// squares); SPLIT 2 combines its row's chunks, mean = sum(n m) / LEN and
// var = (sum(q) + sum(n (m - mean)^2)) / LEN (Chan, Golub and LeVeque's
// pairwise update: still from centered values), and normalizes its chunk.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    Y_BUF y;
    X_BUF x;
    F32R gamma;
    F32R beta;
    RES_BUF res;
    SUM_BUF sum;
#if SPLIT
    F32 stats;
#endif
    KILN_DIMS
} args;

#include "reduce.glsl"

float value(uint i) {
#if HAS_RES
    return float(args.x.v[i]) + float(args.res.v[i]);
#else
    return float(args.x.v[i]);
#endif
}

#if SPLIT
#define CACHE ((CHUNK + WG - 1) / WG)

// The elements of chunk k of a row.
uint chunk_len(uint k) { return min(uint(CHUNK), uint(LEN) - k * uint(CHUNK)); }

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint w = gl_WorkGroupID.x; w < ROWS * CHUNKS; w += gl_NumWorkGroups.x) {
        const uint row = w / CHUNKS, k = w % CHUNKS, n = chunk_len(k);
        const uint base = kiln_row_base(kiln_row_of(row)) + k * CHUNK;
        float vals[CACHE];
        float s = 0.0;
        for (uint t = 0; t < CACHE; ++t) {
            const uint c = l + t * WG;
            vals[t] = c < n ? value(base + c) : 0.0;
            s += vals[t];
        }
#if SPLIT == 1
#if RMS
        const float m = 0.0;
#else
        const float m = kiln_reduce_sum(s) / float(n);
#endif
        float q = 0.0;
        for (uint t = 0; t < CACHE; ++t) {
            const float d = l + t * WG < n ? vals[t] - m : 0.0;
            q += d * d;
        }
        q = kiln_reduce_sum(q);
        if (l == 0) {
            args.stats.v[2 * w] = m;
            args.stats.v[2 * w + 1] = q;
        }
#else
        const uint first = row * CHUNKS;
#if RMS
        const float mean = 0.0;
#else
        float a = 0.0;
        for (uint i = l; i < CHUNKS; i += WG)
            a += float(chunk_len(i)) * args.stats.v[2 * (first + i)];
        const float mean = kiln_reduce_sum(a) / float(LEN);
#endif
        float b = 0.0;
        for (uint i = l; i < CHUNKS; i += WG) {
            const float dm = args.stats.v[2 * (first + i)] - mean;
            b += args.stats.v[2 * (first + i) + 1] + float(chunk_len(i)) * dm * dm;
        }
        const float rstd = inversesqrt(kiln_reduce_sum(b) / float(LEN) + EPS);
        const uint pbase = (row % PR) * PJ;
        for (uint t = 0; t < CACHE; ++t) {
            const uint c = l + t * WG;
            if (c >= n)
                continue;
            const uint j = k * CHUNK + c, i = base + c;
            float v = vals[t];
#if HAS_SUM
            args.sum.v[i] = SUM_T(v);
#endif
            v = (v - mean) * rstd;
#if HAS_GAMMA
            v *= args.gamma.v[pbase + j / PD];
#endif
#if HAS_BETA
            v += args.beta.v[pbase + j / PD];
#endif
            args.y.v[i] = Y_T(v);
        }
#endif
    }
}
#else
// Rows of at most 16 * WG elements are read once, into registers.
#define CACHE ((LEN + WG - 1) / WG)

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint row = gl_WorkGroupID.x; row < ROWS; row += gl_NumWorkGroups.x) {
        const uint base = kiln_row_base(kiln_row_of(row));
#if CACHE <= 16
        float vals[CACHE];
        float s = 0.0;
        for (uint t = 0; t < CACHE; ++t) {
            const uint c = l + t * WG;
            vals[t] = c < LEN ? value(base + c * INNER) : 0.0;
            s += vals[t];
        }
#if RMS
        const float mean = 0.0;
#else
        const float mean = kiln_reduce_sum(s) / float(LEN);
#endif
        float q = 0.0;
        for (uint t = 0; t < CACHE; ++t) {
            float d = l + t * WG < LEN ? vals[t] - mean : 0.0;
            q += d * d;
        }
        const float rstd = inversesqrt(kiln_reduce_sum(q) / float(LEN) + EPS);
        const uint pbase = (row % PR) * PJ;
        for (uint t = 0; t < CACHE; ++t) {
            const uint c = l + t * WG;
            if (c >= LEN)
                continue;
            const uint i = base + c * INNER;
            float v = vals[t];
#if HAS_SUM
            args.sum.v[i] = SUM_T(v);
#endif
            v = (v - mean) * rstd;
#if HAS_GAMMA
            v *= args.gamma.v[pbase + c / PD];
#endif
#if HAS_BETA
            v += args.beta.v[pbase + c / PD];
#endif
            args.y.v[i] = Y_T(v);
        }
#else
#if RMS
        const float mean = 0.0;
#else
        float s = 0.0;
        for (uint c = l; c < LEN; c += WG)
            s += value(base + c * INNER);
        const float mean = kiln_reduce_sum(s) / float(LEN);
#endif
        float q = 0.0;
        for (uint c = l; c < LEN; c += WG) {
            float d = value(base + c * INNER) - mean;
            q += d * d;
        }
        const float rstd = inversesqrt(kiln_reduce_sum(q) / float(LEN) + EPS);
        const uint pbase = (row % PR) * PJ;
        for (uint c = l; c < LEN; c += WG) {
            const uint i = base + c * INNER;
            float v = value(i);
#if HAS_SUM
            args.sum.v[i] = SUM_T(v);
#endif
            v = (v - mean) * rstd;
#if HAS_GAMMA
            v *= args.gamma.v[pbase + c / PD];
#endif
#if HAS_BETA
            v += args.beta.v[pbase + c / PD];
#endif
            args.y.v[i] = Y_T(v);
        }
#endif
    }
}
#endif
