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
// SPLIT (few outputs over long reductions, fixed: lower_rows.c,
// reduce_chunks): output element q's LEN elements in CHUNKS chunks of CHUNK,
// a workgroup a chunk, in two dispatches. SPLIT 1 writes each chunk's
// partial (its sum, product, maximum or minimum of the kind's values; for
// LOG_SUM_EXP the sum of exp(v - m) and the chunk's maximum m) to part[2w],
// part[2w + 1], w = q * CHUNKS + chunk; SPLIT 2, a workgroup an output,
// combines its chunks' partials and writes y. Not for ARGMAX / ARGMIN.
//
// PER_THREAD (many short reductions, fixed: lower_rows.c, reduce_pass): an
// invocation an output, its LEN elements in order, no shared memory; a
// workgroup of WG a row left most invocations idle and spent its time in
// barriers (a global average pool of [32, 2048, 7, 7]: 83 us on an H100).
// Not for ARGMAX / ARGMIN.
//
// COLS (outputs adjacent in memory, each reduced along strided axes, fixed:
// lower_rows.c, reduce_cols): a workgroup takes COL_OUT neighbouring
// outputs, its WG / COL_OUT parts each a share of every one's elements, so
// that a subgroup reads COL_OUT neighbours at once; the parts' partials meet
// in shared memory (a sum down the columns of [1024, 8192] read each
// column's elements 32 KiB apart: 103 us on an H100, torch 22). Not for
// ARGMAX / ARGMIN.
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
#if SPLIT
    F32 part;
#endif
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

#if KIND == K_MAX
#define ACC0 (-1.0 / 0.0)
#elif KIND == K_MIN
#define ACC0 (1.0 / 0.0)
#elif KIND == K_PROD
#define ACC0 1.0
#else
#define ACC0 0.0
#endif

// acc combined with a value of the kind (LOG_SUM_EXP: v already exp(x - m))
float kiln_fold(float acc, float v) {
#if KIND == K_MAX
    return max(acc, v);
#elif KIND == K_MIN
    return min(acc, v);
#elif KIND == K_PROD
    return acc * v;
#else
    return acc + v;
#endif
}

// The kind's value of element x (LOG_SUM_EXP: exp(x - m))
float kiln_term(float v, float m) {
#if KIND == K_L1
    return abs(v);
#elif KIND == K_L2 || KIND == K_SUM_SQUARE
    return v * v;
#elif KIND == K_LOG_SUM_EXP
    return exp(v - m);
#else
    return v;
#endif
}

float kiln_reduce_kind(float acc) {
#if KIND == K_MAX
    return kiln_reduce_max(acc);
#elif KIND == K_MIN
    return kiln_reduce_min(acc);
#elif KIND == K_PROD
    return kiln_reduce_prod(acc);
#else
    return kiln_reduce_sum(acc);
#endif
}

// The output from the whole reduction (m: LOG_SUM_EXP's shift)
float kiln_finish(float acc, float m) {
#if KIND == K_MEAN
    return acc / float(RUN_COUNT);
#elif KIND == K_L2
    return sqrt(acc);
#elif KIND == K_LOG_SUM_EXP
    return m + log(acc);
#else
    return acc;
#endif
}

uint kiln_base_of(uint r) {
    uint base = 0, rem = r;
    for (int d = KRANK - 1; d >= 0; --d) {
        base += (rem % KSHAPE_[d]) * KSTR[d];
        rem /= KSHAPE_[d];
    }
    return base;
}

#if COLS
#define COL_OUT 32
#define COL_PARTS (WG / COL_OUT)
shared float col_part[WG];

// The combination of the parts' v (every invocation calls it; part 0's
// invocations get their output's).
float kiln_combine_parts(float v, uint l, bool as_max) {
    col_part[l] = v;
    barrier();
    if (l < COL_OUT)
        for (uint p = 1; p < COL_PARTS; ++p)
            v = as_max ? max(v, col_part[p * COL_OUT + l]) : kiln_fold(v, col_part[p * COL_OUT + l]);
    barrier();
    return v;
}

void main() {
    const uint l = gl_LocalInvocationID.x, part = l / COL_OUT;
    for (uint g = gl_WorkGroupID.x; g * COL_OUT < ROWS; g += gl_NumWorkGroups.x) {
        const uint q = g * COL_OUT + l % COL_OUT;
        const bool live = q < ROWS;
        const uint r = live ? kiln_row_of(q) : 0, base = live ? kiln_base_of(r) : 0;
        float m = 0.0;
#if KIND == K_LOG_SUM_EXP
        float mm = -1.0 / 0.0;
        for (uint j = part; live && j < LEN; j += COL_PARTS)
            mm = max(mm, float(args.x.v[base + offset_of(j)]));
        mm = kiln_combine_parts(mm, l, true);
        if (l < COL_OUT)
            col_part[l] = isinf(mm) ? 0.0 : mm; // as below: all -inf sums to 0
        barrier();
        m = col_part[l % COL_OUT];
        barrier();
#endif
        float acc = ACC0;
        for (uint j = part; live && j < LEN; j += COL_PARTS)
            acc = kiln_fold(acc, kiln_term(float(args.x.v[base + offset_of(j)]), m));
        acc = kiln_combine_parts(acc, l, false);
        if (l < COL_OUT && live)
            args.y.v[r] = Y_T(kiln_finish(acc, m));
    }
}
#elif PER_THREAD
void main() {
    for (uint q = gl_GlobalInvocationID.x; q < ROWS; q += gl_NumWorkGroups.x * WG) {
        const uint r = kiln_row_of(q), base = kiln_base_of(r);
        float m = 0.0;
#if KIND == K_LOG_SUM_EXP
        m = -1.0 / 0.0;
        for (uint j = 0; j < LEN; ++j)
            if (COUNTS(j))
                m = max(m, float(args.x.v[base + offset_of(j)]));
        if (isinf(m))
            m = 0.0; // as below: all -inf sums to 0, +inf stays
#endif
        float acc = ACC0;
        for (uint j = 0; j < LEN; ++j)
            if (COUNTS(j))
                acc = kiln_fold(acc, kiln_term(float(args.x.v[base + offset_of(j)]), m));
        args.y.v[r] = Y_T(kiln_finish(acc, m));
    }
}
#elif SPLIT
void main() {
    const uint l = gl_LocalInvocationID.x;
#if SPLIT == 1
    for (uint w = gl_WorkGroupID.x; w < ROWS * CHUNKS; w += gl_NumWorkGroups.x) {
        const uint base = kiln_base_of(kiln_row_of(w / CHUNKS));
        const uint begin = (w % CHUNKS) * CHUNK, end = min(begin + CHUNK, uint(LEN));
        float m = 0.0;
#if KIND == K_LOG_SUM_EXP
        m = -1.0 / 0.0;
        for (uint j = begin + l; j < end; j += WG)
            m = max(m, float(args.x.v[base + offset_of(j)]));
        m = kiln_reduce_max(m);
        if (isinf(m))
            m = 0.0; // as below: all -inf sums to 0, +inf stays
#endif
        float acc = ACC0;
        for (uint j = begin + l; j < end; j += WG)
            acc = kiln_fold(acc, kiln_term(float(args.x.v[base + offset_of(j)]), m));
        acc = kiln_reduce_kind(acc);
        if (l == 0) {
            args.part.v[2 * w] = acc;
            args.part.v[2 * w + 1] = m;
        }
    }
#else
    for (uint q = gl_WorkGroupID.x; q < ROWS; q += gl_NumWorkGroups.x) {
        const uint r = kiln_row_of(q), first = q * CHUNKS;
        float m = 0.0;
#if KIND == K_LOG_SUM_EXP
        m = -1.0 / 0.0;
        for (uint i = l; i < CHUNKS; i += WG)
            m = max(m, args.part.v[2 * (first + i) + 1]);
        m = kiln_reduce_max(m);
#endif
        float acc = ACC0;
        for (uint i = l; i < CHUNKS; i += WG) {
#if KIND == K_LOG_SUM_EXP // each chunk's sum rescaled from its own maximum
            acc += args.part.v[2 * (first + i)] * exp(args.part.v[2 * (first + i) + 1] - m);
#else
            acc = kiln_fold(acc, args.part.v[2 * (first + i)]);
#endif
        }
        acc = kiln_reduce_kind(acc);
        if (l == 0)
            args.y.v[r] = Y_T(kiln_finish(acc, m));
    }
#endif
}
#else
void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint q = gl_WorkGroupID.x; q < ROWS; q += gl_NumWorkGroups.x) {
        const uint r = kiln_row_of(q); // the output element (the run's q-th)
        const uint base = kiln_base_of(r);
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
#if KIND != K_LOG_SUM_EXP
        const float m = 0.0;
#endif
        float acc = ACC0;
        for (uint j = l; j < LEN; j += WG)
            if (COUNTS(j))
                acc = kiln_fold(acc, kiln_term(float(args.x.v[base + offset_of(j)]), m));
        acc = kiln_reduce_kind(acc);
        if (l == 0)
            args.y.v[r] = Y_T(kiln_finish(acc, m));
#endif
    }
}
#endif
