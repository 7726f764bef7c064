#version 460
// flash_cm.comp: flash.comp's attention (out = softmax(mask(softcap(q k^T *
// SCALE))) v over many query rows, the scores never written to memory) on
// the matrix units, for f16 queries, keys and values: q k^T and p v as
// cooperative matrices (VK_NV_cooperative_matrix, 16 x 16 x 16 fragments of
// f16 with f32 accumulation, subgroups of 32). Recorded for devices that
// have them (KILN_FEATURE_COOPMAT); flash.comp runs elsewhere.
//
// One workgroup per block of 16 query rows of one (batch, head); its NSG
// subgroups split the block's keys, chunks of 16 taken round-robin
// (subgroup g: chunks g, g + NSG, ...), each into its own area of shared
// memory, so that a subgroup synchronizes with itself only. One pass over
// the keys: each subgroup keeps a reference mref for each row and computes
// p = exp(score - mref), replacing the reference only where a chunk's
// maximum passes it by more than RESCALE and then scaling the row's sum
// and accumulators by exp(old - new), the accumulators through shared
// memory (flash_rows.comp says why this is rare). p v adds into
// accumulator fragments, and sum(p) into each invocation's share. The
// subgroups' fragments, sums and references then meet in shared memory,
// each subgroup's scaled to the row's greatest reference, and the block's
// output is written as sum(p v) / sum(p). A score that the fragments leave
// in shared memory (16 x 16 f32) is read by two invocations a row, eight
// keys each: invocation s of a subgroup takes row s / 2, keys 8 (s % 2) to
// 8 (s % 2) + 7, and writes their p as one vector of eight halves, the
// layout p v's fragment loads.
//
// Each chunk's keys and values are loaded into registers while the
// chunk before is computed (the first while the queries load), 16-byte
// vectors of eight halves (every stride and D, DV multiples of 8: the
// compiler's condition), then stored to shared memory in rows padded by
// one vector.
//
// Defines: as flash.comp (B, H, KVH, SQ, SK, D, DV multiples of 16, the
// strides, SCALE, SOFTCAP_ON, SOFTCAP, CAUSAL, WINDOW, HAS_MASK, MS_*,
// MASK_BUF, O_BUF, O_T), and NSG. SQ and SK may follow the dynamic dims.
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"

#define WG (32 * NSG)
layout(local_size_x = WG) in;

#ifndef MASK_BUF
#define MASK_BUF F32R
#endif

layout(push_constant) uniform Args {
    O_BUF o;
    U4R q; // f16, eight to a vector
    U4R k;
    U4R v;
    MASK_BUF mask;
    KILN_DIMS
} args;

#include "scores.glsl"

#define DQ (D / 8)   // a query or key row in vectors of eight halves
#define DVQ (DV / 8) // a value row
#define KRS (DQ + 1) // rows in shared memory, padded by a vector
#define VRS (DVQ + 1)
#define FD (D / 16)  // fragments along d
#define FV (DV / 16) // along the values' d
#define KL (D / 16)  // vectors of a chunk's keys an invocation loads
#define VL (DV / 16) // and of its values
#define SRS 5        // a row of scores in shared memory: 16 f32 and 4 unused
#define PRS 3        // a row of p: 16 halves and 8 unused
#define ORS (DV / 4 + 1) // a row of a subgroup's output: DV f32 and 4 unused
// A subgroup's area: its chunk's keys (16 x KRS), whose place its scores
// (16 x SRS) and then its p (16 x PRS) take once the keys are multiplied,
// and its values (16 x VRS); at the end its output (16 x ORS).
#define KREG (KRS > SRS ? 16 * KRS : 16 * SRS)
#define AREA (KREG + 16 * VRS > 16 * ORS ? KREG + 16 * VRS : 16 * ORS)
#define NBLK ((SQ + 15) / 16)
#define RESCALE 8.0 // how far past its reference a row's scores may go (flash_rows.comp)
#define FRAG16 fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define FRAG32 fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

shared uvec4 qs[16 * KRS];
shared uvec4 kv[NSG * AREA];
shared float red[NSG * 16], ref[NSG * 16];

uvec4 kreg[KL], vreg[VL];

// Chunk [c0, c0 + 16) of the keys (and values) into kreg (vreg): rows past
// kend zeros.
void fetch(uint s, uint kbase, uint vbase, uint c0, uint kend, bool values) {
    [[unroll]] for (uint u = 0; u < KL; ++u) {
        const uint e = s + u * 32, jj = e / DQ;
        kreg[u] = c0 + jj < kend ? args.k.v[(kbase + (c0 + jj) * KS_S) / 8 + e % DQ] : uvec4(0);
    }
    if (values)
        [[unroll]] for (uint u = 0; u < VL; ++u) {
            const uint e = s + u * 32, jj = e / DVQ;
            vreg[u] = c0 + jj < kend ? args.v.v[(vbase + (c0 + jj) * VS_S) / 8 + e % DVQ]
                                     : uvec4(0);
        }
}

// kreg (and vreg) into the subgroup's area at a.
void put(uint s, uint a, bool values) {
    [[unroll]] for (uint u = 0; u < KL; ++u) {
        const uint e = s + u * 32;
        kv[a + e / DQ * KRS + e % DQ] = kreg[u];
    }
    if (values)
        [[unroll]] for (uint u = 0; u < VL; ++u) {
            const uint e = s + u * 32;
            kv[a + KREG + e / DVQ * VRS + e % DVQ] = vreg[u];
        }
}

void sync_subgroup() {
    subgroupMemoryBarrierShared();
    subgroupBarrier();
}

// The chunk's scores (q k^T, f32) in place of its keys, at a.
void scores(const FRAG16 qf[FD], uint a) {
    FRAG32 acc = FRAG32(0.0);
    [[unroll]] for (uint f = 0; f < FD; ++f) {
        FRAG16 kf; // 16 d x 16 keys: the keys' rows read by columns
        coopMatLoadNV(kf, kv, a + f * 2, KRS, true);
        acc = coopMatMulAddNV(qf[f], kf, acc);
    }
    sync_subgroup(); // every fragment of the keys loaded
    coopMatStoreNV(acc, kv, a, SRS, false);
}

// The invocation's eight scores of its row at chunk c0 (keys c0 + 8 hf to
// c0 + 8 hf + 7), scaled, capped and masked (scores.glsl); -inf where not
// visible.
void row_scores(uint a, uint r, uint hf, uint c0, uint i, int last, uint kend, uint b,
                uint h, out float x[8]) {
    const uvec4 lo = kv[a + r * SRS + 2 * hf], hi = kv[a + r * SRS + 2 * hf + 1];
    [[unroll]] for (uint e = 0; e < 8; ++e) {
        const uint j = c0 + 8 * hf + e;
        x[e] = -1.0 / 0.0;
        if (i < SQ && j < kend && kiln_key_visible(j, last))
            x[e] = kiln_score(uintBitsToFloat(e < 4 ? lo[e] : hi[e - 4]), b, h, i, j);
    }
}

// The row's accumulators times alpha (its two invocations: the row's
// own), a fragment at a time through the subgroup's area a (where its
// scores go: the values after them stay).
void rescale(inout FRAG32 oacc[FV], uint a, uint r, uint hf, float alpha) {
    [[unroll]] for (uint j = 0; j < FV; ++j) {
        coopMatStoreNV(oacc[j], kv, a, SRS, false);
        sync_subgroup();
        [[unroll]] for (uint e = 0; e < 2; ++e) {
            const uint at = a + r * SRS + 2 * hf + e;
            kv[at] = floatBitsToUint(uintBitsToFloat(kv[at]) * alpha);
        }
        sync_subgroup();
        coopMatLoadNV(oacc[j], kv, a, SRS, false);
        sync_subgroup(); // loaded before the next fragment's store
    }
}

void main() {
    const uint l = gl_LocalInvocationID.x, g = l / 32, s = l % 32;
    const uint r = s / 2, hf = s % 2; // the invocation's row and half of a chunk
    const uint a = g * AREA; // the subgroup's area
    for (uint task = gl_WorkGroupID.x; task < B * H * NBLK; task += gl_NumWorkGroups.x) {
        const uint blk = task % NBLK, h = (task / NBLK) % H, b = task / (NBLK * H);
        const uint kvh = h / (H / KVH), q0 = blk * 16, i = q0 + r;
        const uint kbase = K_OFF + b * KS_B + kvh * KS_H, vbase = V_OFF + b * VS_B + kvh * VS_H;
        const uint qbase = Q_OFF + b * QS_B + h * QS_H;
        // the keys some row of the block sees: [kbeg, kend)
        const int shift = int(SK) - int(SQ); // row i's newest key: i + shift
        int kend_i = int(SK), kbeg_i = 0;
#if CAUSAL
        kend_i = clamp(int(min(q0 + 16, uint(SQ))) + shift, 0, int(SK));
#endif
#if WINDOW > 0
        kbeg_i = clamp(int(q0) + shift - WINDOW + 1, 0, int(SK));
#endif
        const uint kbeg = uint(kbeg_i), kend = uint(max(kend_i, kbeg_i));
        const uint chunks = (kend - kbeg + 15) / 16;
        const int last = int(i) + shift;
        if (g < chunks) // the first chunk, loading with the queries
            fetch(s, kbase, vbase, kbeg + 16 * g, kend, true);
        for (uint e = l; e < 16 * DQ; e += WG) {
            const uint rr = e / DQ;
            qs[rr * KRS + e % DQ] = q0 + rr < SQ ? args.q.v[(qbase + (q0 + rr) * QS_S) / 8 + e % DQ]
                                                 : uvec4(0);
        }
        barrier();
        FRAG16 qf[FD];
        [[unroll]] for (uint f = 0; f < FD; ++f)
            coopMatLoadNV(qf[f], qs, f * 2, KRS, false);

        // One pass: p = exp(score - mref) against the row's reference mref
        // in this subgroup, sum(p) and p v.
        float lsum = 0.0, mref = -1.0 / 0.0;
        bool started = false; // subgroup-uniform: some p v added
        FRAG32 oacc[FV];
        [[unroll]] for (uint j = 0; j < FV; ++j)
            oacc[j] = FRAG32(0.0);
        for (uint c = g; c < chunks; c += NSG) {
            put(s, a, true);
            sync_subgroup();
            if (c + NSG < chunks)
                fetch(s, kbase, vbase, kbeg + 16 * (c + NSG), kend, true);
            scores(qf, a);
            sync_subgroup();
            float x[8];
            row_scores(a, r, hf, kbeg + 16 * c, i, last, kend, b, h, x);
            float cm = x[0];
            [[unroll]] for (uint e = 1; e < 8; ++e)
                cm = max(cm, x[e]);
            cm = max(cm, subgroupShuffleXor(cm, 1));
            // a new reference only where the chunk passes it by RESCALE
            const bool grow = cm > mref + RESCALE;
            float alpha = 1.0;
            if (grow) {
                alpha = exp(mref - cm); // 0 from -inf: nothing added yet
                mref = cm;
                lsum *= alpha;
            }
            sync_subgroup(); // every score read: the area is free
            if (started && subgroupAny(grow))
                rescale(oacc, a, r, hf, alpha);
            const bool none = isinf(mref); // no visible key yet: p 0
            uvec4 pk;
            [[unroll]] for (uint e = 0; e < 4; ++e) {
                const float p0 = none ? 0.0 : exp(x[2 * e] - mref);
                const float p1 = none ? 0.0 : exp(x[2 * e + 1] - mref);
                lsum += p0 + p1;
                pk[e] = packHalf2x16(vec2(p0, p1));
            }
            kv[a + r * PRS + hf] = pk;
            sync_subgroup();
            FRAG16 pf;
            coopMatLoadNV(pf, kv, a, PRS, false);
            [[unroll]] for (uint j = 0; j < FV; ++j) {
                FRAG16 vf; // 16 keys x 16 of the values' d
                coopMatLoadNV(vf, kv, a + KREG + j * 2, VRS, false);
                oacc[j] = coopMatMulAddNV(pf, vf, oacc[j]);
            }
            started = true;
            sync_subgroup();
        }
        lsum += subgroupShuffleXor(lsum, 1);
        if (hf == 0) {
            red[g * 16 + r] = lsum;
            ref[g * 16 + r] = mref;
        }
        [[unroll]] for (uint j = 0; j < FV; ++j)
            coopMatStoreNV(oacc[j], kv, a + j * 4, ORS, false);
        barrier();
        // The block's output: the subgroups' sums of p v over their sums of
        // p, each subgroup's taken to the rows' greatest reference.
        for (uint e = l; e < 16 * DV; e += WG) {
            const uint rr = e / DV, d = e % DV;
            if (q0 + rr >= SQ)
                continue;
            float m = -1.0 / 0.0;
            for (uint u = 0; u < NSG; ++u)
                m = max(m, ref[u * 16 + rr]);
            float acc = 0.0, den = 0.0;
            for (uint u = 0; u < NSG; ++u) {
                const float mu = ref[u * 16 + rr];
                const float w = isinf(mu) ? 0.0 : exp(mu - m);
                const uint f = rr * ORS * 4 + d;
                acc += w * uintBitsToFloat(kv[u * AREA + f / 4][f % 4]);
                den += w * red[u * 16 + rr];
            }
            args.o.v[b * OS_B + h * OS_H + (q0 + rr) * OS_S + d] = O_T(den > 0.0 ? acc / den : 0.0);
        }
        barrier(); // the next task overwrites qs, kv and red
    }
}
