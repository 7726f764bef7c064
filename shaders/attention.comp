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
// VS_*, OS_*; the last dimension is contiguous); SCALE; SOFTCAP (0: off);
// CAUSAL (key j visible to query i when j <= i + SK - SQ); WINDOW (0: off;
// else only the WINDOW newest visible keys); HAS_MASK with MS_B, MS_H, MS_I,
// MS_J (an additive mask, broadcast through zero strides). A query row that
// sees no key gets zeros.
#include "common.glsl"

layout(local_size_x = WG) in;

layout(push_constant) uniform Args {
    F32 o;
    F32R q;
    F32R k;
    F32R v;
    F32R mask;
    KILN_DIMS
} args;

#include "reduce.glsl"

#define ACC_N ((DV + WG - 1) / WG)
shared float qs[D];
shared float ps[WG];

void main() {
    const uint l = gl_LocalInvocationID.x;
    for (uint row = gl_WorkGroupID.x; row < B * H * SQ; row += gl_NumWorkGroups.x) {
        const uint i = row % SQ, h = (row / SQ) % H, b = row / (SQ * H);
        const uint kvh = h / (H / KVH);
        const uint qbase = b * QS_B + h * QS_H + i * QS_S;
        const uint kbase = b * KS_B + kvh * KS_H, vbase = b * VS_B + kvh * VS_H;
        for (uint d = l; d < D; d += WG)
            qs[d] = args.q.v[qbase + d];
        barrier();
        float m = -1.0 / 0.0, lsum = 0.0, acc[ACC_N];
        for (int t = 0; t < ACC_N; ++t)
            acc[t] = 0.0;
        const int last = int(i) + (SK - SQ); // the newest key this row may see
        for (uint c0 = 0; c0 < SK; c0 += WG) {
            const uint j = c0 + l;
            float s = -1.0 / 0.0;
            bool visible = j < SK;
#if CAUSAL
            visible = visible && int(j) <= last;
#endif
#if WINDOW > 0
            visible = visible && int(j) > last - WINDOW;
#endif
            if (visible) {
                float dot = 0.0;
                const uint kr = kbase + j * KS_S;
                for (uint d = 0; d < D; ++d)
                    dot += qs[d] * args.k.v[kr + d];
                s = dot * SCALE;
#if SOFTCAP_ON
                s = SOFTCAP * kiln_tanh(s / SOFTCAP);
#endif
#if HAS_MASK
                s += args.mask.v[b * MS_B + h * MS_H + i * MS_I + j * MS_J];
#endif
            }
            const float m_new = max(m, kiln_reduce_max(s));
            if (isinf(m_new) && m_new < 0.0)
                continue; // nothing visible yet: uniform across the group
            const float p = exp(s - m_new);
            ps[l] = p;
            const float corr = exp(m - m_new);
            lsum = lsum * corr + kiln_reduce_sum(p); // its barriers publish ps
            const uint n = min(uint(WG), SK - c0);
            for (int t = 0; t < ACC_N; ++t) {
                const uint d = l + uint(t) * WG;
                float a = acc[t] * corr;
                if (d < DV)
                    for (uint jj = 0; jj < n; ++jj)
                        a += ps[jj] * args.v.v[vbase + (c0 + jj) * VS_S + d];
                acc[t] = a;
            }
            barrier();
            m = m_new;
        }
        const uint obase = b * OS_B + h * OS_H + i * OS_S;
        for (int t = 0; t < ACC_N; ++t) {
            const uint d = l + uint(t) * WG;
            if (d < DV)
                args.o.v[obase + d] = lsum > 0.0 ? acc[t] / lsum : 0.0;
        }
        barrier();
    }
}
