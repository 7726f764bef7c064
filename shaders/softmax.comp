#version 460
// softmax.comp: y = exp(x - max) / sum(exp(x - max)) along a row, or its
// logarithm when LOG is 1 (log_softmax: x - max - log(sum)).
//
// Rows as in reduce.glsl (ROWS, LEN, INNER); RUN_LEN (default LEN) of each
// row's elements count, the rest are left as they are (a row along a
// dynamic axis: LEN is its largest size, RUN_LEN the run's). One workgroup of WG
// invocations per row (groups loop over ROWS beyond the dispatch's count);
// invocations stride over the row and reduce through shared memory: the
// maximum, then the sum of exponentials, then the write.
//
// SPLIT (few long rows, fixed and contiguous: lower_rows.c,
// softmax_chunks): each row's LEN elements in CHUNKS chunks of CHUNK, a
// workgroup a chunk, in two dispatches. SPLIT 1 writes each chunk's maximum
// m and sum of exp(x - m) to stats[2w], stats[2w + 1] (w = row * CHUNKS +
// chunk; a chunk of -inf only sums to 0); SPLIT 2 combines its row's, the
// maximum M and the sum of each chunk's times exp(m - M), and writes its
// chunk.
//
// x and y are f32 or f16 (the compiler defines X_BUF and Y_BUF, their
// buffer types, and Y_T, y's element type); the arithmetic is f32.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    Y_BUF y;
    X_BUF x;
#if SPLIT
    F32 stats;
#endif
    KILN_DIMS
} args;

#include "reduce.glsl"

#ifndef RUN_LEN
#define RUN_LEN LEN
#endif

float x_at(uint i) { return float(args.x.v[i]); }

#if SPLIT
void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint w = gl_WorkGroupID.x; w < ROWS * CHUNKS; w += gl_NumWorkGroups.x) {
        const uint row = w / CHUNKS, begin = (w % CHUNKS) * CHUNK;
        const uint end = min(begin + CHUNK, uint(LEN));
        const uint base = kiln_row_base(kiln_row_of(row));
#if SPLIT == 1
        float m = -1.0 / 0.0;
        for (uint c = begin + l; c < end; c += WG)
            m = max(m, x_at(base + c));
        m = kiln_reduce_max(m);
        float s = 0.0;
        if (!(isinf(m) && m < 0.0))
            for (uint c = begin + l; c < end; c += WG)
                s += exp(x_at(base + c) - m);
        s = kiln_reduce_sum(s);
        if (l == 0) {
            args.stats.v[2 * w] = m;
            args.stats.v[2 * w + 1] = s;
        }
#else
        const uint first = row * CHUNKS;
        float m = -1.0 / 0.0;
        for (uint i = l; i < CHUNKS; i += WG)
            m = max(m, args.stats.v[2 * (first + i)]);
        m = kiln_reduce_max(m);
        float s = 0.0;
        for (uint i = l; i < CHUNKS; i += WG)
            s += args.stats.v[2 * (first + i) + 1] * exp(args.stats.v[2 * (first + i)] - m);
        s = kiln_reduce_sum(s);
#if LOG
        const float shift = m + log(s);
        for (uint c = begin + l; c < end; c += WG)
            args.y.v[base + c] = Y_T(x_at(base + c) - shift);
#else
        const float inv = 1.0 / s;
        for (uint c = begin + l; c < end; c += WG)
            args.y.v[base + c] = Y_T(exp(x_at(base + c) - m) * inv);
#endif
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
        float m = -1.0 / 0.0;
        for (uint t = 0; t < CACHE; ++t) {
            const uint c = l + t * WG;
            vals[t] = c < RUN_LEN ? x_at(base + c * INNER) : -1.0 / 0.0;
            m = max(m, vals[t]);
        }
        m = kiln_reduce_max(m);
        float s = 0.0;
        for (uint t = 0; t < CACHE; ++t)
            if (l + t * WG < RUN_LEN)
                s += exp(vals[t] - m);
        s = kiln_reduce_sum(s);
#if LOG
        const float shift = m + log(s);
        for (uint t = 0; t < CACHE; ++t)
            if (l + t * WG < RUN_LEN)
                args.y.v[base + (l + t * WG) * INNER] = Y_T(vals[t] - shift);
#else
        const float inv = 1.0 / s;
        for (uint t = 0; t < CACHE; ++t)
            if (l + t * WG < RUN_LEN)
                args.y.v[base + (l + t * WG) * INNER] = Y_T(exp(vals[t] - m) * inv);
#endif
#else
        float m = -1.0 / 0.0;
        for (uint c = l; c < RUN_LEN; c += WG)
            m = max(m, x_at(base + c * INNER));
        m = kiln_reduce_max(m);
        float s = 0.0;
        for (uint c = l; c < RUN_LEN; c += WG)
            s += exp(x_at(base + c * INNER) - m);
        s = kiln_reduce_sum(s);
#if LOG
        const float shift = m + log(s);
        for (uint c = l; c < RUN_LEN; c += WG)
            args.y.v[base + c * INNER] = Y_T(x_at(base + c * INNER) - shift);
#else
        const float inv = 1.0 / s;
        for (uint c = l; c < RUN_LEN; c += WG)
            args.y.v[base + c * INNER] = Y_T(exp(x_at(base + c * INNER) - m) * inv);
#endif
#endif
    }
}
#endif
