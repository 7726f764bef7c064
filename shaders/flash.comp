#version 460
// flash.comp: attention over many query rows (a prompt, an encoder):
// out = softmax(mask(softcap(q k^T * SCALE))) v, as attention.comp computes
// it, without materializing the scores, tiled so that a chunk of keys and
// values is read once for a block of query rows.
//
// One workgroup per block of BQ query rows of one (batch, head); WG = BQ *
// TPR invocations, TPR to a row (invocation l: row l / TPR, lane t = l %
// TPR). The keys are taken in chunks of BK: the chunk's keys and values go
// to shared memory once for the block's BQ rows (attention.comp reads them
// once per row); each invocation scores the BK / TPR keys t, t + TPR, ... of
// its row, the row's running maximum is updated through shared memory
// (online softmax), and each invocation keeps the output components t, t +
// TPR, ... of its row in registers. A causal block stops at the newest key
// its last row sees, a windowed one starts at the oldest its first row sees.
//
// Each chunk's keys and values are read into registers (KL and VL of them
// an invocation) while the one before is computed, then stored to shared
// memory: the loads' latency is paid once, not once a chunk. Shared rows
// are padded by one float (KP, PP) so that the TPR lanes reading
// keys t, t + TPR, ... at one d, and the rows of a subgroup, fall in
// different banks.
//
// Defines: as attention.comp (B, H, KVH, SQ, SK, D, DV, the strides QS_*,
// KS_*, VS_*, OS_*, SCALE, SOFTCAP_ON, SOFTCAP, CAUSAL, WINDOW, HAS_MASK and
// MS_*, the buffer types Q_BUF, K_BUF, V_BUF, MASK_BUF, O_BUF and O_T), and
// BQ, BK, TPR (BK a multiple of TPR), WG = BQ * TPR. Storage f32 or f16;
// arithmetic, scores and sums f32.
#include "common.glsl"

layout(local_size_x = WG) in;

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
} args;

#define KP (D + 1)                      // a query or key row in shared memory
#define PP (BK + 1)                     // a row of the chunk's probabilities
#define SN (BK / TPR)                   // keys an invocation scores a chunk
#define ACC_N ((DV + TPR - 1) / TPR)    // output components an invocation keeps
#define NBLK ((SQ + BQ - 1) / BQ)

#define KL ((BK * D + WG - 1) / WG)     // key elements an invocation loads a chunk
#define VL ((BK * DV + WG - 1) / WG)

shared float qs[BQ * KP];
shared float ks[BK * KP];
shared float vs[BK * DV];
shared float ps[BQ * PP];
shared float red[WG];

float kreg[KL], vreg[VL];

// Chunk [c0, c0 + n) of the keys and values into kreg, vreg (zeros past n).
void fetch(uint l, uint kbase, uint vbase, uint c0, uint n) {
    for (int u = 0; u < KL; ++u) {
        const uint e = l + uint(u) * WG, jj = e / D, d = e % D;
        kreg[u] = 0.0;
        if (jj < n)
            kreg[u] = float(args.k.v[kbase + (c0 + jj) * KS_S + d]);
    }
    for (int u = 0; u < VL; ++u) {
        const uint e = l + uint(u) * WG, jj = e / DV, d = e % DV;
        vreg[u] = 0.0;
        if (jj < n)
            vreg[u] = float(args.v.v[vbase + (c0 + jj) * VS_S + d]);
    }
}

void main() {
    const uint l = gl_LocalInvocationID.x, r = l / TPR, t = l % TPR;
    for (uint task = gl_WorkGroupID.x; task < B * H * NBLK; task += gl_NumWorkGroups.x) {
        const uint blk = task % NBLK, h = (task / NBLK) % H, b = task / (NBLK * H);
        const uint kvh = h / (H / KVH);
        const uint q0 = blk * BQ, i = q0 + r;
        const bool row_ok = i < SQ;
        const uint kbase = b * KS_B + kvh * KS_H, vbase = b * VS_B + kvh * VS_H;
        // the keys some row of the block sees: [kbeg, kend)
        const int shift = int(SK) - int(SQ); // row i's newest key: i + shift
        int kend = int(SK), kbeg = 0;
#if CAUSAL
        kend = clamp(int(min(q0 + BQ, uint(SQ))) + shift, 0, int(SK));
#endif
#if WINDOW > 0
        kbeg = clamp(int(q0) + shift - WINDOW + 1, 0, int(SK));
#endif
        if (kbeg < kend)
            fetch(l, kbase, vbase, uint(kbeg), min(uint(BK), uint(kend - kbeg)));
        float qreg[(BQ * D + WG - 1) / WG];
        for (int u = 0; u < (BQ * D + WG - 1) / WG; ++u) {
            const uint e = l + uint(u) * WG, rr = e / D, d = e % D;
            qreg[u] = 0.0;
            if (rr < BQ && q0 + rr < SQ)
                qreg[u] = float(args.q.v[b * QS_B + h * QS_H + (q0 + rr) * QS_S + d]);
        }
        for (int u = 0; u < (BQ * D + WG - 1) / WG; ++u) {
            const uint e = l + uint(u) * WG;
            if (e < BQ * D)
                qs[e / D * KP + e % D] = qreg[u];
        }
        const int last = int(i) + shift;
        float m = -1.0 / 0.0, lpart = 0.0, acc[ACC_N];
        for (int c = 0; c < ACC_N; ++c)
            acc[c] = 0.0;
        for (uint c0 = uint(kbeg); int(c0) < kend; c0 += BK) {
            const uint n = min(uint(BK), uint(kend) - c0);
            for (int u = 0; u < KL; ++u) {
                const uint e = l + uint(u) * WG;
                if (e < BK * D)
                    ks[e / D * KP + e % D] = kreg[u];
            }
            for (int u = 0; u < VL; ++u) {
                const uint e = l + uint(u) * WG;
                if (e < BK * DV)
                    vs[e] = vreg[u];
            }
            barrier();
            if (int(c0 + BK) < kend) // the next chunk's loads, under this one's work
                fetch(l, kbase, vbase, c0 + BK, min(uint(BK), uint(kend) - c0 - BK));
            float s[SN];
            for (int kk = 0; kk < SN; ++kk)
                s[kk] = 0.0;
            for (uint d = 0; d < D; ++d) {
                const float qd = qs[r * KP + d];
                for (int kk = 0; kk < SN; ++kk)
                    s[kk] += qd * ks[(t + uint(kk) * TPR) * KP + d];
            }
            float cmax = -1.0 / 0.0;
            for (int kk = 0; kk < SN; ++kk) {
                const uint jj = t + uint(kk) * TPR, j = c0 + jj;
                bool visible = row_ok && jj < n;
#if CAUSAL
                visible = visible && int(j) <= last;
#endif
#if WINDOW > 0
                visible = visible && int(j) > last - WINDOW;
#endif
                float x = s[kk] * SCALE;
#if SOFTCAP_ON
                x = SOFTCAP * kiln_tanh(x / SOFTCAP);
#endif
#if HAS_MASK
                if (visible)
                    x += float(args.mask.v[b * MS_B + h * MS_H + i * MS_I + j * MS_J]);
#endif
                s[kk] = visible ? x : -1.0 / 0.0;
                cmax = max(cmax, s[kk]);
            }
            red[l] = cmax;
            barrier();
            float m_new = m;
            for (uint u = 0; u < TPR; ++u)
                m_new = max(m_new, red[r * TPR + u]);
            const bool none = isinf(m_new) && m_new < 0.0; // the row sees no key yet
            const float corr = none ? 1.0 : exp(m - m_new);
            float psum = 0.0;
            for (int kk = 0; kk < SN; ++kk) {
                const float pv = none ? 0.0 : exp(s[kk] - m_new);
                ps[r * PP + t + uint(kk) * TPR] = pv;
                psum += pv;
            }
            lpart = lpart * corr + psum;
            m = m_new;
            barrier();
            for (int c = 0; c < ACC_N; ++c)
                acc[c] *= corr;
            for (uint jj = 0; jj < n; ++jj) {
                const float pj = ps[r * PP + jj];
                for (int c = 0; c < ACC_N; ++c)
                    acc[c] += pj * vs[jj * DV + min(t + uint(c) * TPR, DV - 1)];
            }
            barrier(); // the next chunk overwrites ks, vs, ps and red
        }
        red[l] = lpart;
        barrier();
        float lsum = 0.0;
        for (uint u = 0; u < TPR; ++u)
            lsum += red[r * TPR + u];
        if (row_ok) {
            const uint obase = b * OS_B + h * OS_H + i * OS_S;
            for (int c = 0; c < ACC_N; ++c) {
                const uint d = t + uint(c) * TPR;
                if (d < DV)
                    args.o.v[obase + d] = O_T(lsum > 0.0 ? acc[c] / lsum : 0.0);
            }
        }
        barrier(); // the next task overwrites qs and red
    }
}
