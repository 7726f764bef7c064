#version 460
// flash_rows.comp: flash_cm.comp's attention (out = softmax(mask(softcap(q
// k^T * SCALE))) v, f16 q, k and v, q k^T and p v on the matrix units as
// 16 x 16 x 16 cooperative matrices with f32 accumulation, subgroups of 32)
// with the work split by query rows instead of keys, for long sequences.
//
// One workgroup per block of BQ = 16 * NSG query rows of one (batch, head);
// subgroup g owns rows 16 g to 16 g + 15 of the block. The keys go by in
// chunks of KC = 16 * KF, each loaded once for the whole workgroup (its
// invocations share the loads: 16-byte vectors of eight halves into
// registers while the chunk before is computed, then into shared memory),
// so every key and value is read from memory once per BQ rows, not once per
// 16 as in flash_cm.comp, where the subgroups split the keys of one block
// of 16 rows: at long sequences those re-reads are what its time goes to.
// flash_cm.comp stays the kernel for short sequences, where blocks of BQ
// rows would leave the GPU's multiprocessors idle.
//
// One pass over the keys (flash_cm.comp takes two). Each row keeps a
// reference mref, p = exp(score - mref), and only replaces it where a
// chunk's maximum passes it by more than RESCALE, so that p stays below
// e^RESCALE (within f16): then the row's sum(p) and its p v accumulators
// are scaled by exp(old - new). Cooperative matrices cannot scale their
// rows, so the accumulators go through the subgroup's area of shared
// memory to be scaled; scores that climb key after key (rare, and at most
// once per chunk) pay that round trip, while scores of one scale pay it at
// most once or twice a row. p v adds into accumulator fragments, sum(p)
// into the two invocations of a row. A subgroup skips the chunks none of
// its rows sees (CAUSAL, WINDOW) but loads them with the others. Values
// wider than DVH columns (DV 256) go by in slices of DVH, the pass once a
// slice, so that a slice's accumulators fit in registers; queries wider
// than 128 (QSHARED) stay in shared memory rather than in registers.
//
// A subgroup's area of shared memory holds its chunk of scores (16 x KC
// f32), then in their place its p (16 x KC halves, the layout p v's
// fragment loads) or, to be rescaled, its accumulators a fragment at a
// time, and at the end its output, a 16 x 16 fragment at a time,
// divided by sum(p) and written out: invocation s takes row s / 2, keys (or
// columns) of half s % 2 of the chunk (or fragment).
//
// Defines: as flash_cm.comp (B, H, KVH, SQ, SK, D, DV multiples of 16, the
// strides, SCALE, SOFTCAP_ON, SOFTCAP, CAUSAL, WINDOW, HAS_MASK, MS_*,
// MASK_BUF, O_BUF, O_T), NSG, KF, DVH (DV or a divisor of it, a multiple
// of 16) and QSHARED. SQ and SK may follow the dynamic dims.
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

#define BQ (16 * NSG)     // query rows a workgroup
#define KC (16 * KF)      // keys a chunk
#define DQ (D / 8)        // a query or key row in vectors of eight halves
#define DHQ (DVH / 8)     // a value row's slice
#define KRS (DQ + 1)      // rows in shared memory, padded by a vector
#define VRS (DHQ + 1)
#define FD (D / 16)       // fragments along d
#define FH (DVH / 16)     // along a slice of the values' d
#define KL ((KC * DQ + WG - 1) / WG)  // vectors of a chunk's keys an invocation loads
#define VL ((KC * DHQ + WG - 1) / WG) // and of its values' slice
#define SRS (KC / 4 + 1)  // a row of scores: KC f32 and 4 unused (at least 5)
#define PRS (KC / 8 + 1)  // a row of p: KC halves and 8 unused
#define ORS 5             // a row of an output fragment: 16 f32 and 4 unused
#define SAREA (16 * SRS)  // a subgroup's area
#define RESCALE 8.0       // how far past its reference a row's scores may go
// shared memory, in vectors: the chunk's keys, its values' slice, the
// subgroups' areas, then (QSHARED) the block's queries; without QSHARED the
// queries are staged at 0 and read into registers before the first chunk
#define KB 0
#define VB (KC * KRS)
#define SB (VB + KC * VRS)
#define QB (SB + NSG * SAREA)
#if QSHARED
#define SMEM (QB + BQ * KRS)
#define QAT QB
#else
#define SMEM (QB > BQ * KRS ? QB : BQ * KRS)
#define QAT 0
#endif
#define NBLK ((SQ + BQ - 1) / BQ)
#define FRAG16 fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define FRAG32 fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

shared uvec4 sm[SMEM];

uvec4 kreg[KL], vreg[VL];

// Chunk [c0, c0 + KC) of the keys (and of the values' slice from column dh)
// into kreg (vreg): rows past kend zeros.
void fetch(uint l, uint kbase, uint vbase, uint c0, uint kend, bool values, uint dh) {
    [[unroll]] for (uint u = 0; u < KL; ++u) {
        const uint e = l + u * WG, jj = e / DQ;
        if (e < KC * DQ)
            kreg[u] = c0 + jj < kend ? args.k.v[(kbase + (c0 + jj) * KS_S) / 8 + e % DQ]
                                     : uvec4(0);
    }
    if (values)
        [[unroll]] for (uint u = 0; u < VL; ++u) {
            const uint e = l + u * WG, jj = e / DHQ;
            if (e < KC * DHQ)
                vreg[u] = c0 + jj < kend
                              ? args.v.v[(vbase + (c0 + jj) * VS_S + dh) / 8 + e % DHQ]
                              : uvec4(0);
        }
}

// kreg (and vreg) into the chunk's place.
void put(uint l, bool values) {
    [[unroll]] for (uint u = 0; u < KL; ++u) {
        const uint e = l + u * WG;
        if (e < KC * DQ)
            sm[KB + e / DQ * KRS + e % DQ] = kreg[u];
    }
    if (values)
        [[unroll]] for (uint u = 0; u < VL; ++u) {
            const uint e = l + u * WG;
            if (e < KC * DHQ)
                sm[VB + e / DHQ * VRS + e % DHQ] = vreg[u];
        }
}

void sync_subgroup() {
    subgroupMemoryBarrierShared();
    subgroupBarrier();
}

// The subgroup's scores of the chunk (q k^T, f32) into its area sa; qf its
// queries' fragments (QSHARED: read from shared memory at qa instead).
void scores(const FRAG16 qf[FD], uint qa, uint sa) {
    [[unroll]] for (uint kf = 0; kf < KF; ++kf) {
        FRAG32 acc = FRAG32(0.0);
        [[unroll]] for (uint f = 0; f < FD; ++f) {
            FRAG16 kfr; // 16 d x 16 keys: the keys' rows read by columns
            coopMatLoadNV(kfr, sm, KB + kf * 16 * KRS + f * 2, KRS, true);
#if QSHARED
            FRAG16 qfr;
            coopMatLoadNV(qfr, sm, qa + f * 2, KRS, false);
            acc = coopMatMulAddNV(qfr, kfr, acc);
#else
            acc = coopMatMulAddNV(qf[f], kfr, acc);
#endif
        }
        coopMatStoreNV(acc, sm, sa + kf * 4, SRS, false);
    }
}

// The invocation's KC / 2 scores of its row at chunk c0 (keys c0 + hf KC /
// 2 on), scaled, capped and masked (scores.glsl); -inf where not visible.
void row_scores(uint sa, uint r, uint hf, uint c0, uint i, int last, uint kend, uint b,
                uint h, out float x[KC / 2]) {
    [[unroll]] for (uint u = 0; u < KC / 8; ++u) {
        const uvec4 w = sm[sa + r * SRS + hf * (KC / 8) + u];
        [[unroll]] for (uint e = 0; e < 4; ++e) {
            const uint j = c0 + hf * (KC / 2) + 4 * u + e;
            x[4 * u + e] = -1.0 / 0.0;
            if (i < SQ && j < kend && kiln_key_visible(j, last))
                x[4 * u + e] = kiln_score(uintBitsToFloat(w[e]), b, h, i, j);
        }
    }
}

// The row's accumulators times alpha (its two invocations: the row's
// own), a fragment at a time through the subgroup's area sa.
void rescale(inout FRAG32 oacc[FH], uint sa, uint r, uint hf, float alpha) {
    [[unroll]] for (uint j = 0; j < FH; ++j) {
        coopMatStoreNV(oacc[j], sm, sa, ORS, false);
        sync_subgroup();
        [[unroll]] for (uint e = 0; e < 2; ++e) {
            const uint at = sa + r * ORS + 2 * hf + e;
            sm[at] = floatBitsToUint(uintBitsToFloat(sm[at]) * alpha);
        }
        sync_subgroup();
        coopMatLoadNV(oacc[j], sm, sa, ORS, false);
        sync_subgroup(); // loaded before the next fragment's store
    }
}

void main() {
    const uint l = gl_LocalInvocationID.x, g = l / 32, s = l % 32;
    const uint r = s / 2, hf = s % 2; // the invocation's row and half of a chunk
    const uint sa = SB + g * SAREA;   // the subgroup's area
    const uint qa = QAT + 16 * g * KRS; // its queries (staged, or QSHARED)
    for (uint task = gl_WorkGroupID.x; task < B * H * NBLK; task += gl_NumWorkGroups.x) {
        const uint blk = task % NBLK, h = (task / NBLK) % H, b = task / (NBLK * H);
        const uint kvh = h / (H / KVH), q0 = blk * BQ, g0 = q0 + 16 * g, i = g0 + r;
        const uint kbase = K_OFF + b * KS_B + kvh * KS_H, vbase = V_OFF + b * VS_B + kvh * VS_H;
        const uint qbase = Q_OFF + b * QS_B + h * QS_H;
        // the keys some row of the block sees, [kbeg, kend), and some row of
        // the subgroup's, [gbeg, gend) (empty past the last row)
        const int shift = int(SK) - int(SQ); // row i's newest key: i + shift
        int kend_i = int(SK), kbeg_i = 0, gend_i = g0 < uint(SQ) ? int(SK) : 0, gbeg_i = 0;
#if CAUSAL
        kend_i = clamp(int(min(q0 + BQ, uint(SQ))) + shift, 0, int(SK));
        gend_i = g0 < uint(SQ) ? clamp(int(min(g0 + 16, uint(SQ))) + shift, 0, int(SK)) : 0;
#endif
#if WINDOW > 0
        kbeg_i = clamp(int(q0) + shift - WINDOW + 1, 0, int(SK));
        gbeg_i = clamp(int(g0) + shift - WINDOW + 1, 0, int(SK));
#endif
        const uint kbeg = uint(kbeg_i), kend = uint(max(kend_i, kbeg_i));
        const uint gbeg = uint(gbeg_i), gend = uint(max(gend_i, gbeg_i));
        const uint chunks = (kend - kbeg + KC - 1) / KC;
        const int last = int(i) + shift;
        if (chunks > 0) // the first chunk, loading with the queries
            fetch(l, kbase, vbase, kbeg, kend, true, 0);
        for (uint e = l; e < BQ * DQ; e += WG) {
            const uint rr = e / DQ;
            sm[QAT + rr * KRS + e % DQ] =
                q0 + rr < SQ ? args.q.v[(qbase + (q0 + rr) * QS_S) / 8 + e % DQ] : uvec4(0);
        }
        barrier();
        FRAG16 qf[FD];
#if !QSHARED
        [[unroll]] for (uint f = 0; f < FD; ++f)
            coopMatLoadNV(qf[f], sm, qa + f * 2, KRS, false);
        barrier(); // the queries' staging is the chunks' place
#endif

        // One pass a slice of the values' columns: each chunk's scores, p =
        // exp(score - mref) against the row's reference mref, sum(p) and p v.
        for (uint dh = 0; dh < DV; dh += DVH) {
            if (chunks > 0 && dh > 0)
                fetch(l, kbase, vbase, kbeg, kend, true, dh);
            float lsum = 0.0, mref = -1.0 / 0.0;
            bool started = false; // subgroup-uniform: some p v added
            FRAG32 oacc[FH];
            [[unroll]] for (uint j = 0; j < FH; ++j)
                oacc[j] = FRAG32(0.0);
            for (uint c = 0; c < chunks; ++c) {
                const uint c0 = kbeg + c * KC;
                put(l, true);
                barrier();
                if (c + 1 < chunks)
                    fetch(l, kbase, vbase, c0 + KC, kend, true, dh);
                if (c0 < gend && c0 + KC > gbeg) { // subgroup-uniform
                    scores(qf, qa, sa);
                    sync_subgroup();
                    float x[KC / 2];
                    row_scores(sa, r, hf, c0, i, last, kend, b, h, x);
                    float cm = x[0];
                    [[unroll]] for (uint e = 1; e < KC / 2; ++e)
                        cm = max(cm, x[e]);
                    cm = max(cm, subgroupShuffleXor(cm, 1));
                    // A new reference only where the chunk's maximum passes
                    // the row's by more than RESCALE (p at most e^RESCALE,
                    // within f16): the sum and the row's output rescaled.
                    const bool grow = cm > mref + RESCALE;
                    float alpha = 1.0;
                    if (grow) {
                        alpha = exp(mref - cm); // 0 from -inf: nothing added yet
                        mref = cm;
                        lsum *= alpha;
                    }
                    sync_subgroup(); // every score read: the area is free
                    if (started && subgroupAny(grow))
                        rescale(oacc, sa, r, hf, alpha);
                    const bool none = isinf(mref); // no visible key yet: p 0
                    [[unroll]] for (uint u = 0; u < KF; ++u) {
                        uvec4 pk;
                        [[unroll]] for (uint e = 0; e < 4; ++e) {
                            const float p0 = none ? 0.0 : exp(x[8 * u + 2 * e] - mref);
                            const float p1 = none ? 0.0 : exp(x[8 * u + 2 * e + 1] - mref);
                            lsum += p0 + p1;
                            pk[e] = packHalf2x16(vec2(p0, p1));
                        }
                        sm[sa + r * PRS + hf * KF + u] = pk;
                    }
                    sync_subgroup();
                    [[unroll]] for (uint kf = 0; kf < KF; ++kf) {
                        FRAG16 pf; // 16 rows x 16 keys
                        coopMatLoadNV(pf, sm, sa + kf * 2, PRS, false);
                        [[unroll]] for (uint j = 0; j < FH; ++j) {
                            FRAG16 vf; // 16 keys x 16 of the slice's columns
                            coopMatLoadNV(vf, sm, VB + kf * 16 * VRS + j * 2, VRS, false);
                            oacc[j] = coopMatMulAddNV(pf, vf, oacc[j]);
                        }
                    }
                    started = true;
                }
                barrier(); // the next chunk overwrites the keys and values, the area p
            }
            const float den = lsum + subgroupShuffleXor(lsum, 1);
            // The slice's output, a fragment at a time through the area.
            [[unroll]] for (uint j = 0; j < FH; ++j) {
                coopMatStoreNV(oacc[j], sm, sa, ORS, false);
                sync_subgroup();
                const uvec4 lo = sm[sa + r * ORS + 2 * hf], hi = sm[sa + r * ORS + 2 * hf + 1];
                if (i < SQ)
                    [[unroll]] for (uint e = 0; e < 8; ++e) {
                        const float acc = uintBitsToFloat(e < 4 ? lo[e] : hi[e - 4]);
                        const uint d = dh + 16 * j + 8 * hf + e;
                        args.o.v[b * OS_B + h * OS_H + i * OS_S + d] =
                            O_T(den > 0.0 ? acc / den : 0.0);
                    }
                sync_subgroup(); // read before the next fragment's store
            }
            barrier(); // the next slice's first put, the next task's queries
        }
    }
}
