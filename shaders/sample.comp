#version 460
// sample.comp: one token per row of logits (rows of LEN along the last
// axis), drawn from softmax(logits / TEMPERATURE) restricted to the TOP_K
// most likely tokens (0: no limit) and to the smallest prefix of them whose
// probability reaches TOP_P. The seed is a run-time input (its first element,
// i32 or i64), mixed with the row number (of the largest shape), so each row and each seed draws
// differently and a seed reproduces its draws. TEMPERATURE 0 or TOP_K 1 is
// greedy (the argmax). Candidates are selected in order (select.glsl), at
// most MAX_CAND of them.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    I64 y;
    F32R x;
    TSEED seed;
    KILN_DIMS
} args;

#define INNER 1
#define LARGEST 1
#include "reduce.glsl"
#include "select.glsl"

shared float cand_p[MAX_CAND];
shared uint cand_i[MAX_CAND];

uint mix32(uint h) {
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint q = gl_WorkGroupID.x; q < ROWS; q += gl_NumWorkGroups.x) {
        const uint row = kiln_row_of(q); // of the largest shape (the run's q-th)
        const uint base = row * LEN;
        float bv;
        uint bi;
        select_next(base, 0.0, NONE_I, bv, bi);
#if GREEDY
        if (l == 0)
            args.y.v[row] = int64_t(bi);
#else
        // Normalizer over the whole row, at the temperature.
        float s = 0.0;
        for (uint c = l; c < LEN; c += WG)
            s += exp((args.x.v[base + c] - bv) / TEMPERATURE);
        const float z = kiln_reduce_sum(s);
        // Candidates in order until top_k or top_p is reached.
        float mass = 0.0, pv = bv;
        uint pi = bi, n = 0;
        const uint limit = min(uint(TOP_K), uint(MAX_CAND));
        while (pi != NONE_I && n < limit && mass < TOP_P) {
            const float p = exp((pv - bv) / TEMPERATURE) / z;
            if (l == 0) {
                cand_p[n] = p;
                cand_i[n] = pi;
            }
            mass += p;
            n++;
            if (n < limit && mass < TOP_P)
                select_next(base, pv, pi, pv, pi);
        }
        barrier();
        if (l == 0) {
            const uint seed_lo = uint(int64_t(args.seed.v[0]) & int64_t(0xffffffff));
            const uint seed_hi = uint(int64_t(args.seed.v[0]) >> 32);
            uint h = mix32(seed_lo ^ mix32(seed_hi + 0x9e3779b9u) ^ mix32(row + 0x632be5abu));
            const float u = float(h >> 8) * (1.0 / 16777216.0) * mass;
            float acc = 0.0;
            uint pick = cand_i[n - 1];
            for (uint k = 0; k < n; ++k) {
                acc += cand_p[k];
                if (u < acc) {
                    pick = cand_i[k];
                    break;
                }
            }
            args.y.v[row] = int64_t(pick);
        }
        barrier();
#endif
    }
}
