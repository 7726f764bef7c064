#version 460
// flash.comp: attention over many query rows (a prompt, an encoder):
// out = softmax(mask(softcap(q k^T * SCALE))) v, as attention.comp computes
// it, without materializing the scores, tiled so that a chunk of keys and
// values is read once for a block of query rows.
//
// One workgroup per block of BQ query rows of one (batch, head); WG = BQ /
// RM * TPR invocations: row groups of RM rows, TPR invocations to a group
// (invocation l: rows l / TPR * RM to that + RM - 1, lane t = l % TPR).
// The keys are taken in chunks of BK: the chunk's keys go to shared memory
// once for the block's BQ rows (attention.comp reads them once per row);
// each invocation scores the BK / TPR keys t, t + TPR, ... of each of its
// RM rows (a key read from shared memory serves RM rows, and a query's
// read is the same for the group's lanes), the rows' running maxima are
// updated through shared memory (online softmax), the values then take
// the keys' place, and each invocation keeps the output components t, t +
// TPR, ... of its rows in registers. A causal block stops at the newest
// key its last row sees, a windowed one starts at the oldest its first
// row sees.
//
// Shared memory holds rows as vec4s (D and DV rounded up to D4 and DV4
// vec4s, zeros past them), so that a score takes a vec4 of the query and
// of the key for four multiply-adds, and the value product a vec4 of four
// output components (invocation lane t keeps vec4s t, t + TPR, ...).
//
// Each chunk's keys are read into registers (KL of them an invocation)
// while the chunk before is computed, its values (VL) while the chunk
// before multiplies its p and this one's scores are computed, then stored
// to shared memory: the loads' latency is paid once, not once a chunk.
// Query and key rows are padded by one vec4 (KP4), the probabilities'
// rows by one float (PP), so that the TPR lanes reading keys t, t + TPR,
// ... at one d, and the rows of a subgroup, fall in different banks.
//
// Defines: as attention.comp (B, H, KVH, SQ, SK, D, DV, the strides QS_*,
// KS_*, VS_*, OS_*, SCALE, SOFTCAP_ON, SOFTCAP, CAUSAL, WINDOW, HAS_MASK and
// MS_*, the buffer types Q_BUF, K_BUF, V_BUF, MASK_BUF, O_BUF and O_T), and
// BQ, BK, TPR (BK a multiple of TPR), RM (a divisor of BQ, default 1), WG =
// BQ / RM * TPR. SQ and SK may follow the dynamic dims (a decoder's
// prompt; the workgroups then loop over the blocks). Storage f32 or f16;
// arithmetic, scores and sums f32.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"

layout(local_size_x = WG) in;

#ifndef RM
#define RM 1
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

layout(push_constant) uniform Args {
    O_BUF o;
    Q_BUF q;
    K_BUF k;
    V_BUF v;
    MASK_BUF mask;
    KILN_DIMS
} args;

#include "scores.glsl"

#define D4 ((D + 3) / 4)
#define DV4 ((DV + 3) / 4)
#define KP4 (D4 + 1)                    // a query or key row in shared memory, in vec4s
#define PP (BK + 1)                     // a row of the chunk's probabilities
#define SN (BK / TPR)                   // keys an invocation scores a chunk
#define ACC4 ((DV4 + TPR - 1) / TPR)    // output vec4s an invocation keeps
#define NBLK ((SQ + BQ - 1) / BQ)
#define QL ((BQ * D4 + WG - 1) / WG)    // vec4s an invocation loads: of the queries,
#define KL ((BK * D4 + WG - 1) / WG)    // of a chunk's keys
#define VL ((BK * DV4 + WG - 1) / WG)   // and of its values

shared vec4 qs[BQ * KP4];
#define KVR (KP4 > DV4 ? KP4 : DV4) // a row of the chunk's keys, then of its values
shared vec4 kv[BK * KVR];
shared float ps[BQ * PP];
shared float red[BQ * TPR];

vec4 kreg[KL], vreg[VL];

// Chunk [c0, c0 + n) of the keys into kreg (zeros past n, and past D in a
// row).
void fetch_keys(uint l, uint kbase, uint c0, uint n) {
    for (int u = 0; u < KL; ++u) {
        const uint e = l + uint(u) * WG, jj = e / D4, d = e % D4 * 4;
        kreg[u] = vec4(0.0);
        if (jj < n)
            for (uint c = 0; c < 4 && d + c < D; ++c)
                kreg[u][c] = float(args.k.v[kbase + (c0 + jj) * KS_S + d + c]);
    }
}

// The same chunk of the values into vreg (zeros past n, and past DV).
void fetch_values(uint l, uint vbase, uint c0, uint n) {
    for (int u = 0; u < VL; ++u) {
        const uint e = l + uint(u) * WG, jj = e / DV4, d = e % DV4 * 4;
        vreg[u] = vec4(0.0);
        if (jj < n)
            for (uint c = 0; c < 4 && d + c < DV; ++c)
                vreg[u][c] = float(args.v.v[vbase + (c0 + jj) * VS_S + d + c]);
    }
}

void main() {
    // the invocation's row group r (its rows r * RM to r * RM + RM - 1) and lane t
    const uint l = gl_LocalInvocationID.x, r = l / TPR, t = l % TPR, r0 = r * RM;
    for (uint task = gl_WorkGroupID.x; task < B * H * NBLK; task += gl_NumWorkGroups.x) {
        const uint blk = task % NBLK, h = (task / NBLK) % H, b = task / (NBLK * H);
        const uint kvh = h / (H / KVH);
        const uint q0 = blk * BQ;
        const uint kbase = K_OFF + b * KS_B + kvh * KS_H, vbase = V_OFF + b * VS_B + kvh * VS_H;
        // the keys some row of the block sees: [kbeg, kend)
        const int shift = int(SK) - int(SQ); // row i's newest key: i + shift
        int kend = int(SK), kbeg = 0;
#if CAUSAL
        kend = clamp(int(min(q0 + BQ, uint(SQ))) + shift, 0, int(SK));
#endif
#if WINDOW > 0
        kbeg = clamp(int(q0) + shift - WINDOW + 1, 0, int(SK));
#endif
        if (kbeg < kend) {
            fetch_keys(l, kbase, uint(kbeg), min(uint(BK), uint(kend - kbeg)));
            fetch_values(l, vbase, uint(kbeg), min(uint(BK), uint(kend - kbeg)));
        }
        vec4 qreg[QL];
        for (int u = 0; u < QL; ++u) {
            const uint e = l + uint(u) * WG, rr = e / D4, d = e % D4 * 4;
            qreg[u] = vec4(0.0);
            if (rr < BQ && q0 + rr < SQ)
                for (uint c = 0; c < 4 && d + c < D; ++c)
                    qreg[u][c] = float(args.q.v[Q_OFF + b * QS_B + h * QS_H + (q0 + rr) * QS_S + d + c]);
        }
        for (int u = 0; u < QL; ++u) {
            const uint e = l + uint(u) * WG;
            if (e < BQ * D4)
                qs[e / D4 * KP4 + e % D4] = qreg[u];
        }
        float m[RM], lpart[RM];
        vec4 acc[RM][ACC4];
        [[unroll]] for (int mm = 0; mm < RM; ++mm) {
            m[mm] = -1.0 / 0.0;
            lpart[mm] = 0.0;
            for (int c = 0; c < ACC4; ++c)
                acc[mm][c] = vec4(0.0);
        }
        for (uint c0 = uint(kbeg); int(c0) < kend; c0 += BK) {
            const uint n = min(uint(BK), uint(kend) - c0);
            for (int u = 0; u < KL; ++u) {
                const uint e = l + uint(u) * WG;
                if (e < BK * D4)
                    kv[e / D4 * KP4 + e % D4] = kreg[u];
            }
            barrier();
            const bool more = int(c0 + BK) < kend;
            const uint nn = more ? min(uint(BK), uint(kend) - c0 - BK) : 0;
            if (more) // the next chunk's keys, under this one's work
                fetch_keys(l, kbase, c0 + BK, nn);
            float s[RM][SN];
            [[unroll]] for (int mm = 0; mm < RM; ++mm)
                for (int kk = 0; kk < SN; ++kk)
                    s[mm][kk] = 0.0;
            for (uint d = 0; d < D4; ++d) {
                vec4 qd[RM]; // the rows' queries at d: the same for the row group's lanes
                [[unroll]] for (int mm = 0; mm < RM; ++mm)
                    qd[mm] = qs[(r0 + uint(mm)) * KP4 + d];
                for (int kk = 0; kk < SN; ++kk) {
                    const vec4 kd = kv[(t + uint(kk) * TPR) * KP4 + d];
                    [[unroll]] for (int mm = 0; mm < RM; ++mm)
                        s[mm][kk] += dot(qd[mm], kd);
                }
            }
            [[unroll]] for (int mm = 0; mm < RM; ++mm) {
                const uint i = q0 + r0 + uint(mm);
                const int last = int(i) + shift;
                float cmax = -1.0 / 0.0;
                for (int kk = 0; kk < SN; ++kk) {
                    const uint jj = t + uint(kk) * TPR, j = c0 + jj;
                    float x = -1.0 / 0.0;
                    if (i < SQ && jj < n && kiln_key_visible(j, last))
                        x = kiln_score(s[mm][kk], b, h, i, j);
                    s[mm][kk] = x;
                    cmax = max(cmax, x);
                }
                red[(r0 + uint(mm)) * TPR + t] = cmax;
            }
            barrier();
            float corr[RM];
            [[unroll]] for (int mm = 0; mm < RM; ++mm) {
                const uint row = r0 + uint(mm);
                float m_new = m[mm];
                for (uint u = 0; u < TPR; ++u)
                    m_new = max(m_new, red[row * TPR + u]);
                const bool none = isinf(m_new) && m_new < 0.0; // the row sees no key yet
                corr[mm] = none ? 1.0 : exp(m[mm] - m_new);
                float psum = 0.0;
                for (int kk = 0; kk < SN; ++kk) {
                    const float pv = none ? 0.0 : exp(s[mm][kk] - m_new);
                    ps[row * PP + t + uint(kk) * TPR] = pv;
                    psum += pv;
                }
                lpart[mm] = lpart[mm] * corr[mm] + psum;
                m[mm] = m_new;
            }
            // every key read (the barrier before red's reads): the values
            // take their place
            for (int u = 0; u < VL; ++u) {
                const uint e = l + uint(u) * WG;
                if (e < BK * DV4)
                    kv[e] = vreg[u];
            }
            barrier();
            if (more) // and its values, under this one's p v and the next scores
                fetch_values(l, vbase, c0 + BK, nn);
            [[unroll]] for (int mm = 0; mm < RM; ++mm)
                for (int c = 0; c < ACC4; ++c)
                    acc[mm][c] *= corr[mm];
            for (uint jj = 0; jj < BK; ++jj) { // past n: p and the values are 0
                float pj[RM]; // the same for the row group's lanes
                [[unroll]] for (int mm = 0; mm < RM; ++mm)
                    pj[mm] = ps[(r0 + uint(mm)) * PP + jj];
                for (int c = 0; c < ACC4; ++c) {
                    const vec4 vv = kv[jj * DV4 + min(t + uint(c) * TPR, DV4 - 1)];
                    [[unroll]] for (int mm = 0; mm < RM; ++mm)
                        acc[mm][c] += pj[mm] * vv;
                }
            }
            barrier(); // the next chunk overwrites kv, ps and red
        }
        [[unroll]] for (int mm = 0; mm < RM; ++mm)
            red[(r0 + uint(mm)) * TPR + t] = lpart[mm];
        barrier();
        [[unroll]] for (int mm = 0; mm < RM; ++mm) {
            const uint row = r0 + uint(mm), i = q0 + row;
            float lsum = 0.0;
            for (uint u = 0; u < TPR; ++u)
                lsum += red[row * TPR + u];
            if (i < SQ) {
                const uint obase = b * OS_B + h * OS_H + i * OS_S;
                for (int c = 0; c < ACC4; ++c) {
                    const uint d = (t + uint(c) * TPR) * 4;
                    for (uint e = 0; e < 4; ++e)
                        if (d + e < DV)
                            args.o.v[obase + d + e] =
                                O_T(lsum > 0.0 ? acc[mm][c][e] / lsum : 0.0);
                }
            }
        }
        barrier(); // the next task overwrites qs and red
    }
}
