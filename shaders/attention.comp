#version 460
// attention.comp: out = softmax(mask(softcap(q k^T * SCALE))) v, for each
// (batch, head, query row), without materializing the scores.
//
// One workgroup of WG invocations per query row (groups loop past 65535).
// Keys are taken in chunks of WG: each invocation scores one key against the
// query (held in shared memory), the chunk's maximum updates a running
// maximum and sum (online softmax), and the chunk's probabilities, kept in
// shared memory, weight the value rows into per-invocation accumulators of
// the output's DV components (invocation l owns components l, l + WG, ...).
//
// Defines: B, H, KVH (key/value heads; query head h reads kv head
// h / (H / KVH)), SQ, SK, D, DV; element strides QS_B, QS_H, QS_S (and KS_*,
// VS_*, OS_*; the last dimension is contiguous), Q_OFF, K_OFF, V_OFF (where
// q's, k's and v's elements start: a packed QKV product's rows); SCALE; SOFTCAP (0: off);
// CAUSAL (key j visible to query i when j <= i + SK - SQ); WINDOW (0: off;
// else only the WINDOW newest visible keys); HAS_MASK with MS_B, MS_H, MS_I,
// MS_J (an additive mask, broadcast through zero strides). A query row that
// sees no key gets zeros.
//
// KVEC4: D and the keys' strides multiples of 4, each key's row read as
// vec4s (f32 keys).
//
// q, k, v, the mask and o are f32 or f16 (the compiler defines Q_BUF,
// K_BUF, V_BUF, MASK_BUF, O_BUF, their buffer types, and O_T, o's element
// type); arithmetic, the scores and the spans' parts are f32.
//
// VPRE (a span or row of at most VPRE <= WG keys: one chunk, a decode
// step): each invocation's values of the chunk's keys, and with KPRE (f32
// keys in vec4s, KVEC4) its key's row, are loaded first, before the query
// goes to shared memory, so that the workgroup waits on memory once rather
// than for the query, the keys, then the values eight keys at a time; the
// arithmetic is the same.
//
// SPLITS > 1 (few query rows, a decode step): the keys of each row are
// split into SPLITS spans, a workgroup each, and a workgroup writes its
// span's running maximum, sum and unnormalized DV outputs to o (then a
// [rows * SPLITS, DV + 2] scratch); COMBINE 1 is the second dispatch, a
// workgroup per row, which weighs the spans' parts by exp(m - max) into the
// output. COMBINE_LAST (SPLITS > 1): no second dispatch; the last of a
// row's span workgroups to finish (a u32 counter a row, args.count, that
// each bumps and the last sets back to zero) combines the row's parts,
// read back coherent, into args.dst.
#ifndef COMBINE_LAST
#define COMBINE_LAST 0
#endif
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"

layout(local_size_x = WG) in;

#ifndef SPLITS
#define SPLITS 1
#endif
#ifndef KPRE
#define KPRE 0
#endif
#ifndef COMBINE
#define COMBINE 0
#endif

#ifndef O_BUF // f32 throughout
#define O_BUF F32
#define O_T float
#define Q_BUF F32R
#define K_BUF F32R
#define V_BUF F32R
#endif
#ifndef MASK_BUF
#define MASK_BUF F32R
#endif

// Row `row`'s output from its SPLITS parts (PART(i): element i of the
// parts; DST: the output's buffer), invocation l of WG: each span's maximum
// and sum loaded together (wt holds the sum, then the span's weight), then
// each output component's SPLITS parts.
#define COMBINE_ROW(PART, DST)                                                     \
    void combine_row(uint row, uint l) {                                           \
        const uint i = row % SQ, h = (row / SQ) % H, b = row / (SQ * H);           \
        const uint pbase = row * SPLITS * (DV + 2);                                \
        float ms[SPLITS], wt[SPLITS];                                              \
        [[unroll]] for (uint s = 0; s < SPLITS; ++s) {                             \
            ms[s] = PART(pbase + s * (DV + 2));                                    \
            wt[s] = PART(pbase + s * (DV + 2) + 1);                                \
        }                                                                          \
        float m = -1.0 / 0.0;                                                      \
        [[unroll]] for (uint s = 0; s < SPLITS; ++s)                               \
            m = max(m, ms[s]);                                                     \
        float lsum = 0.0; /* a span that saw no key weighs 0 */                    \
        [[unroll]] for (uint s = 0; s < SPLITS; ++s) {                             \
            const float sum = wt[s];                                               \
            wt[s] = isinf(ms[s]) ? 0.0 : exp(ms[s] - m);                            \
            lsum += wt[s] * sum;                                                   \
        }                                                                          \
        const uint obase = b * OS_B + h * OS_H + i * OS_S;                         \
        for (uint d = l; d < DV; d += WG) {                                        \
            float a = 0.0;                                                         \
            [[unroll]] for (uint s = 0; s < SPLITS; ++s)                           \
                a += wt[s] * PART(pbase + s * (DV + 2) + 2 + d);                   \
            DST.v[obase + d] = O_T(lsum > 0.0 ? a / lsum : 0.0);                   \
        }                                                                          \
    }

#if COMBINE
layout(push_constant) uniform Args {
    O_BUF o;
    F32R part;
    KILN_DIMS
} args;

#define PART_AT(i) args.part.v[i]
COMBINE_ROW(PART_AT, args.o)

void main() {
    for (uint row = gl_WorkGroupID.x; row < B * H * SQ; row += gl_NumWorkGroups.x)
        combine_row(row, gl_LocalInvocationID.x);
}
#else
layout(push_constant) uniform Args {
#if SPLITS > 1 && COMBINE_LAST
    F32C o; // the spans' parts, read back by a row's last workgroup
#elif SPLITS > 1
    F32 o; // the spans' parts
#else
    O_BUF o;
#endif
    Q_BUF q;
#if KVEC4
    V4R k;
#else
    K_BUF k;
#endif
    V_BUF v;
    MASK_BUF mask;
#if COMBINE_LAST
    O_BUF dst; // the output
    KilnCounter count; // a row's span workgroups that are done
#endif
    KILN_DIMS
} args;

#include "reduce.glsl"
#include "scores.glsl"
#if COMBINE_LAST
#define PART_AT(i) args.o.v[i]
COMBINE_ROW(PART_AT, args.dst)
shared bool last_s;
#endif

#define ACC_N ((DV + WG - 1) / WG)
shared float qs[D];
shared float ps[WG];

void main() {
    const uint l = gl_LocalInvocationID.x;
    const uint span = (SK + SPLITS - 1) / SPLITS;
    for (uint task = gl_WorkGroupID.x; task < B * H * SQ * SPLITS; task += gl_NumWorkGroups.x) {
        const uint row = task / SPLITS, sp = task % SPLITS;
        const uint kbeg = sp * span, kend = min(uint(SK), kbeg + span);
        const uint i = row % SQ, h = (row / SQ) % H, b = row / (SQ * H);
        const uint kvh = h / (H / KVH);
        const uint qbase = Q_OFF + b * QS_B + h * QS_H + i * QS_S;
        const uint kbase = K_OFF + b * KS_B + kvh * KS_H, vbase = V_OFF + b * VS_B + kvh * VS_H;
#ifdef VPRE // the chunk's values (past its last key: that key again) and key
        float vpre[ACC_N][VPRE];
        [[unroll]] for (int t = 0; t < ACC_N; ++t) {
            const uint d = min(l + uint(t) * WG, uint(DV) - 1u);
            [[unroll]] for (uint u = 0; u < VPRE; ++u)
                vpre[t][u] = float(args.v.v[vbase + min(kbeg + u, max(kend, 1u) - 1u) * VS_S + d]);
        }
#if KPRE
        vec4 kpre[D / 4];
        {
            const uint kr = kbase + min(kbeg + l, max(kend, 1u) - 1u) * KS_S;
            [[unroll]] for (uint d = 0; d < D; d += 4)
                kpre[d / 4] = args.k.v[(kr + d) / 4];
        }
#endif
#endif
        for (uint d = l; d < D; d += WG)
            qs[d] = float(args.q.v[qbase + d]);
        barrier();
        float m = -1.0 / 0.0, lsum = 0.0, acc[ACC_N];
        for (int t = 0; t < ACC_N; ++t)
            acc[t] = 0.0;
        const int last = int(i) + (SK - SQ); // the newest key this row may see
        for (uint c0 = kbeg; c0 < kend; c0 += WG) {
            const uint j = c0 + l;
            float s = -1.0 / 0.0;
            if (j < kend && kiln_key_visible(j, last)) {
                float qk = 0.0;
#if !KPRE
                const uint kr = kbase + j * KS_S;
#endif
#if KPRE
                [[unroll]] for (uint d = 0; d < D; d += 4)
                    qk += dot(vec4(qs[d], qs[d + 1], qs[d + 2], qs[d + 3]), kpre[d / 4]);
#elif KVEC4 // the key's row as vec4s (16-byte aligned)
                for (uint d = 0; d < D; d += 4)
                    qk += dot(vec4(qs[d], qs[d + 1], qs[d + 2], qs[d + 3]),
                              args.k.v[(kr + d) / 4]);
#else
                for (uint d = 0; d < D; ++d)
                    qk += qs[d] * float(args.k.v[kr + d]);
#endif
                s = kiln_score(qk, b, h, i, j);
            }
            const float m_new = max(m, kiln_reduce_max(s));
            if (isinf(m_new) && m_new < 0.0)
                continue; // nothing visible yet: uniform across the group
            const float p = exp(s - m_new);
            ps[l] = p;
            const float corr = exp(m - m_new);
            lsum = lsum * corr + kiln_reduce_sum(p); // its barriers publish ps
            const uint n = min(uint(WG), kend - c0);
            for (int t = 0; t < ACC_N; ++t) {
                const uint d = l + uint(t) * WG;
                float a = acc[t] * corr;
#ifdef VPRE
                if (d < DV)
                    [[unroll]] for (uint u = 0; u < VPRE; ++u)
                        a += u < n ? ps[u] * vpre[t][u] : 0.0;
#else
                if (d < DV)
                    // eight keys' values loaded together (past the chunk's
                    // last key: that key again, weighed 0)
                    for (uint j0 = 0; j0 < n; j0 += 8) {
                        float vv[8];
                        [[unroll]] for (uint u = 0; u < 8; ++u)
                            vv[u] = float(args.v.v[vbase + min(c0 + j0 + u, kend - 1) * VS_S + d]);
                        [[unroll]] for (uint u = 0; u < 8; ++u)
                            a += j0 + u < n ? ps[j0 + u] * vv[u] : 0.0;
                    }
#endif
                acc[t] = a;
            }
            barrier();
            m = m_new;
        }
#if SPLITS > 1
        const uint pbase = task * (DV + 2); // this span's part: m, sum, outputs
        if (l == 0) {
            args.o.v[pbase] = m;
            args.o.v[pbase + 1] = lsum;
        }
        for (int t = 0; t < ACC_N; ++t) {
            const uint d = l + uint(t) * WG;
            if (d < DV)
                args.o.v[pbase + 2 + d] = acc[t];
        }
#if COMBINE_LAST // the row's last span to finish combines the parts
        memoryBarrierBuffer(); // this span's part before its count
        barrier();
        if (l == 0)
            last_s = atomicAdd(args.count.v[row], 1u) == SPLITS - 1u;
        barrier();
        if (last_s) { // uniform: a shared value
            memoryBarrierBuffer();
            combine_row(row, l);
            if (l == 0)
                args.count.v[row] = 0u; // for the next run
        }
#endif
#else
        const uint obase = b * OS_B + h * OS_H + i * OS_S;
        for (int t = 0; t < ACC_N; ++t) {
            const uint d = l + uint(t) * WG;
            if (d < DV)
                args.o.v[obase + d] = O_T(lsum > 0.0 ? acc[t] / lsum : 0.0);
        }
#endif
        barrier();
    }
}
#endif
