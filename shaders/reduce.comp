#version 460
// reduce.comp: one value per output element from the input elements that
// map to it: SUM, MEAN, MAX, MIN, PROD, L1, L2, SUM_SQUARE, LOG_SUM_EXP
// (KIND), or ARGMAX / ARGMIN (KIND, the index along the one reduced axis,
// written as i64; ties give the first index, or the last with LAST_INDEX).
//
// Output element r (the run's q-th of ROWS: kiln_row_of, where a dynamic
// axis is inside) starts at input element sum(k_d * KSTRIDES[d])
// over its coordinates k in KSHAPE (KRANK kept dimensions); the LEN reduced
// elements add sum(j_d * RSTRIDES[d]) over coordinates j in RSHAPE (RRANK
// dimensions). One workgroup per output element; invocations stride over
// the reduced elements and combine through shared memory. X and Y (but an
// ARG's i64) f32 or f16 (X_BUF, Y_BUF, Y_T), the arithmetic f32; an ARG's X
// also i32 or i64, compared as integers (ARG_T).
//
// RDYN_EXT (a reduced axis that follows the dims, RDYN_S at the largest):
// reduced element j counts when its coordinate along that axis, (j /
// RDYN_IN) % RDYN_S, is below the run's extent RDYN_EXT; MEAN divides by
// the elements that count.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
#if ARG
    I64 y;
#else
    Y_BUF y;
#endif
    X_BUF x;
    KILN_DIMS
} args;

#define INNER 1
#include "reduce.glsl"

const uint KSHAPE_[KRANK] = uint[KRANK](KSHAPE);
const uint KSTR[KRANK] = uint[KRANK](KSTRIDES);
const uint RSHAPE_[RRANK] = uint[RRANK](RSHAPE);
const uint RSTR[RRANK] = uint[RRANK](RSTRIDES);

#define K_SUM 0
#define K_MEAN 1
#define K_MAX 2
#define K_MIN 3
#define K_PROD 4
#define K_L1 5
#define K_L2 6
#define K_SUM_SQUARE 7
#define K_LOG_SUM_EXP 8
#define K_ARGMAX 9
#define K_ARGMIN 10

#ifdef RDYN_EXT
#define COUNTS(j) (((j) / RDYN_IN) % RDYN_S < (RDYN_EXT))
#define RUN_COUNT (LEN / RDYN_S * (RDYN_EXT))
#else
#define COUNTS(j) true
#define RUN_COUNT LEN
#endif

uint offset_of(uint j) {
    uint o = 0;
    for (int d = RRANK - 1; d >= 0; --d) {
        o += (j % RSHAPE_[d]) * RSTR[d];
        j /= RSHAPE_[d];
    }
    return o;
}

#if ARG
// ARG_T: the values' type, float or (integer x) int or int64_t
#ifndef ARG_T
#define ARG_T float
#define ARG_FLOAT 1
#else
#define ARG_FLOAT 0
#endif
#define NONE 0xffffffffu
shared ARG_T best_v[WG];
shared uint best_i[WG];
bool earlier(uint i, uint bi) { return LAST_INDEX != 0 ? i > bi : i < bi; }
// True when candidate (v, i) should replace (bv, bi); NaN wins, as in numpy.
bool better(ARG_T v, uint i, ARG_T bv, uint bi) {
    if (bi == NONE)
        return true;
#if ARG_FLOAT
    bool vn = isnan(v), bn = isnan(bv);
    if (vn || bn)
        return vn && bn ? earlier(i, bi) : vn;
#endif
    if (v != bv)
        return KIND == K_ARGMAX ? v > bv : v < bv;
    return earlier(i, bi);
}
#endif

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint q = gl_WorkGroupID.x; q < ROWS; q += gl_NumWorkGroups.x) {
        const uint r = kiln_row_of(q); // the output element (the run's q-th)
        uint base = 0, rem = r;
        for (int d = KRANK - 1; d >= 0; --d) {
            base += (rem % KSHAPE_[d]) * KSTR[d];
            rem /= KSHAPE_[d];
        }
#if ARG
        ARG_T bv = ARG_T(0);
        uint bi = NONE;
        for (uint j = l; j < LEN; j += WG) {
            if (!COUNTS(j))
                continue;
            ARG_T v = ARG_T(args.x.v[base + offset_of(j)]);
            if (better(v, j, bv, bi)) {
                bv = v;
                bi = j;
            }
        }
        best_v[l] = bv;
        best_i[l] = bi;
        barrier();
        for (uint s = WG / 2; s > 0; s >>= 1) {
            if (l < s && best_i[l + s] != NONE &&
                better(best_v[l + s], best_i[l + s], best_v[l], best_i[l])) {
                best_v[l] = best_v[l + s];
                best_i[l] = best_i[l + s];
            }
            barrier();
        }
        if (l == 0)
            args.y.v[r] = int64_t(best_i[0]);
        barrier();
#else
#if KIND == K_LOG_SUM_EXP
        float m = -1.0 / 0.0;
        for (uint j = l; j < LEN; j += WG)
            if (COUNTS(j))
                m = max(m, float(args.x.v[base + offset_of(j)]));
        m = kiln_reduce_max(m);
        if (isinf(m))
            m = 0.0; // all -inf: log(0) = -inf below; +inf: stays inf
#endif
#if KIND == K_MAX
        float acc = -1.0 / 0.0;
#elif KIND == K_MIN
        float acc = 1.0 / 0.0;
#elif KIND == K_PROD
        float acc = 1.0;
#else
        float acc = 0.0;
#endif
        for (uint j = l; j < LEN; j += WG) {
            if (!COUNTS(j))
                continue;
            float v = float(args.x.v[base + offset_of(j)]);
#if KIND == K_MAX
            acc = max(acc, v);
#elif KIND == K_MIN
            acc = min(acc, v);
#elif KIND == K_PROD
            acc *= v;
#elif KIND == K_L1
            acc += abs(v);
#elif KIND == K_L2 || KIND == K_SUM_SQUARE
            acc += v * v;
#elif KIND == K_LOG_SUM_EXP
            acc += exp(v - m);
#else
            acc += v;
#endif
        }
#if KIND == K_MAX
        acc = kiln_reduce_max(acc);
#elif KIND == K_MIN
        acc = kiln_reduce_min(acc);
#elif KIND == K_PROD
        acc = kiln_reduce_prod(acc);
#else
        acc = kiln_reduce_sum(acc);
#endif
        if (l == 0) {
#if KIND == K_MEAN
            acc /= float(RUN_COUNT);
#elif KIND == K_L2
            acc = sqrt(acc);
#elif KIND == K_LOG_SUM_EXP
            acc = m + log(acc);
#endif
            args.y.v[r] = Y_T(acc);
        }
#endif
    }
}
