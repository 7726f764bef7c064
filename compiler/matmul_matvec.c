/*
 * matmul_matvec.c: the kernels for few rows: matvec_k.comp (B K-major,
 * quantized or not) and matvec.comp's layout (its dispatch is bound with
 * the tiled kernel's: matmul_tiled.c, matmul_kernel).
 */
#include "matmul.h"

#include <stdlib.h>
#include <string.h>

/* Few rows (at most MATVEC_MAX_M): matvec.comp's column-parallel kernel, or
 * matvec_k.comp's where B is K-major; else matmul.comp's tiles. */
#define MATVEC_THREADS 256 /* NCOL x KSPLIT */
#define MATVEC_PART_FLOATS 3072 /* shared memory for partial sums: 12 KiB */

/* matvec.comp's layout for s: vec4 columns when B is f32 with 16-byte
 * aligned rows, vec4 rows of A likewise. Column lanes per workgroup (4 to
 * 32): as few as leave 256 workgroups over the columns and batches (128
 * from 9 rows up, where each workgroup's reads of A cost more), so that a
 * large GPU has a workgroup or two per multiprocessor, each reading B with
 * at least 64 contiguous bytes a row. Splits of K fill the rest of 256
 * invocations, as many as K has steps. Measured on an H200 (bench/).
 * KILN_MATVEC_NCOL (a power of two from 1 to 256) overrides the lanes, for
 * tuning. */
MatvecShape matvec_shape(const Node *n, const MatmulShape *s, int64_t rows) {
    MatvecShape v = {0};
    bool b_vec4 = n->wformat == WF_F32 && s->ops[2].t->dtype == KILN_DTYPE_F32 &&
                  s->b_sn == 1 && s->N % 4 == 0 && s->b_sk % 4 == 0 &&
                  all_multiples(s->brank, s->ops[2].strides, 4);
    v.vec = b_vec4 ? 4 : 1;
    v.avec = s->ops[1].t->dtype == KILN_DTYPE_F32 && s->a_sk == 1 && s->K % 4 == 0 &&
             s->a_sm % 4 == 0 && all_multiples(s->brank, s->ops[1].strides, 4);
    int64_t want_groups = rows > 8 ? 128 : 256;
    v.ncol = 4;
    while (v.ncol < 32 && groups_for(s->N, v.ncol * 2 * v.vec) * s->batch >= want_groups)
        v.ncol *= 2;
    const char *tune = getenv("KILN_MATVEC_NCOL");
    if (tune) {
        long t = strtol(tune, NULL, 10);
        if (t >= 1 && t <= MATVEC_THREADS && (t & (t - 1)) == 0)
            v.ncol = t;
    }
    int64_t steps = s->K / (v.avec ? 4 : 1);
    v.ksplit = MATVEC_THREADS / v.ncol;
    while (v.ksplit > 1 && v.ksplit > steps)
        v.ksplit /= 2;
    v.mc = MATVEC_PART_FLOATS / (v.ksplit * v.ncol * v.vec);
    if (v.mc > rows)
        v.mc = rows;
    return v;
}

/* Whether matvec_k.comp can compute s: B K-major (encoded so by quantize.c,
 * its strides set so by matmul_dispatch, or given with B_SK 1) in whole
 * 16-byte chunks along K, A contiguous along K (f32 in vec4s or f16). */
bool kmajor_shape(const Node *n, MatmulShape *s) {
    const Tensor *a = s->ops[1].t, *b = s->ops[2].t;
    int64_t kv = weight_chunk(b_weight_format(n, s));
    bool a_ok = s->a_sk == 1 && (a->dtype == KILN_DTYPE_F16 ||
                                 (a->dtype == KILN_DTYPE_F32 && s->a_sm % 4 == 0 &&
                                  all_multiples(s->brank, s->ops[1].strides, 4)));
    if (n->wkmajor) {
        if (!a_ok || s->K % kv || s->conv.in[0])
            internal_error("node '%s': a K-major weight where matvec_k.comp does not apply",
                           n->name);
        return true;
    }
    return a_ok && !matvec_k_off() && !n->wq && !s->conv.in[0] && s->b_sk == 1 &&
           s->K % kv == 0 && s->b_sn % kv == 0 && all_multiples(s->brank, s->ops[2].strides, kv) &&
           (b->dtype == KILN_DTYPE_F32 || b->dtype == KILN_DTYPE_F16);
}

/* matvec_k.comp for s (kmajor_shape holds), rows up to mrows: WG
 * invocations along K a workgroup, CN columns. WG: 256, fewer where K has
 * fewer than WG / 2 chunks (at least 32); for rows that follow the dims
 * (M is their most, MATVEC_K_DYN_M: more partial sums a workgroup) halved
 * down to 64 while K has fewer than 4 * WG chunks (2 to 5 an invocation);
 * CN: 4, fewer where that leaves under 512 workgroups; their M x CN x WG
 * partial sums at most 16 KiB of shared memory. Measured on an H200 at
 * [1, 4096] x [4096, 4096] over WG 32 to 1024 and CN 1 to 8 (us, f32 / f16
 * / int8 / int4): 256 x 4 22.4 / 11.9 / 14.1 / 16.9, 128 x 4 23.6 / 12.4 /
 * 18.5 / 22.4, 512 x 4 23.1 / 14.0 / 14.7 / 20.1, 64 x 1 23.7 / 15.7 / 17.3 /
 * 24.6, 32 x 8 twice those; and on a decoder's dynamic products of K 2048
 * and 5632 (bench/experiments/matvec_k_dyn-h200.txt): 64 or 128, not 256,
 * at 2048 x 11264 22.3 against 31.2 us (f16), 17.3 against 29.1 (int8).
 * KILN_MATVEC_K=WG,CN[,UNROLL,TEAMS,A_SHARED] overrides them, for tuning
 * (0: matvec_k off). */
Dispatch *matvec_k_kernel(Program *p, Node *n, const MatmulShape *s, int64_t mrows) {
    int fmt = b_weight_format(n, s);
    int64_t chunks = s->K / weight_chunk(fmt), wg = 256, cn = 4;
    while (s->dyn ? wg > 64 && chunks < 4 * wg : wg > 32 && chunks < wg / 2)
        wg /= 2;
    /* a QKV split's product: CN 2 at least, a workgroup's columns pairs
     * for glu_after_product (a gated MLP's gate and up) and
     * rope_after_product (a head's columns c and c + D / 2) */
    int64_t least = n->nsiblings && !n->split_out && s->N % 2 == 0 ? 2 : 1;
    while (cn > least && groups_for(s->N, cn) * s->batch < 512)
        cn /= 2;
    /* Fixed-shape int4 B where A's rows fit in shared memory (as f32, a
     * chunk's run of A padded by a vec4 where it is two or more: stage_a
     * in matvec_k.comp; at most 32 KiB): 256 invocations in 8 teams of
     * 32, A in shared memory, the teams halved (each larger) down to 2
     * while they leave fewer than 256 workgroups. Measured on an H200
     * (bench/experiments/matvec_k_teams-h200.txt, us at one row): 4096 x
     * 16384 38.6 -> 27.4 (8 teams), 4096 x 4096 17.2 -> 12.7 (4); not int8
     * (33.5 -> 33.0, 13.9 -> 14.7) nor a decoder's dynamic products (f16
     * and int4 at K 2048 and 5632: 5 to 75% slower). */
    int64_t seg = weight_chunk(fmt) / 4;
    bool a_fits = mrows * s->K / 4 / seg * (seg + (seg >= 2)) * 16 <= 32768;
    long teams = 1, ashared = 0;
    if (!s->dyn && (fmt == WF_INT4 || fmt == WF_INT4_ASYM) && a_fits) {
        wg = 256, teams = 8, ashared = 1;
        while (teams > 2 && groups_for(s->N, cn * teams) * s->batch < 256)
            teams /= 2;
    }
    /* KILN_MATVEC_K=WG,CN[,UNROLL[,TEAMS[,A_SHARED]]], for tuning
     * (bench/experiments) */
    const char *tune = getenv("KILN_MATVEC_K");
    long t[5] = {0, 0, 1, 1, 0}, unroll = 1;
    int nt = tune ? sscanf(tune, "%ld,%ld,%ld,%ld,%ld", &t[0], &t[1], &t[2], &t[3], &t[4]) : 0;
    if (nt >= 2 && t[0] >= 1 && t[0] <= 1024 && (t[0] & (t[0] - 1)) == 0 && t[1] >= 1 &&
        t[1] <= 16 && t[2] >= 1 && t[2] <= 8 && t[3] >= 1 && t[3] <= t[0] &&
        (t[3] & (t[3] - 1)) == 0)
        wg = t[0], cn = t[1], unroll = t[2], teams = t[3], ashared = t[4] != 0;
    while (mrows * cn * wg > 4096 && wg > teams)
        wg /= 2;
    while (mrows * cn * wg > 4096)
        cn /= 2;
    if (!a_fits)
        ashared = 0;
    /* --activations int8: A's rows as bytes in shared memory, a scale per
     * 32 k (and for the asymmetric formats a sum per 16), in teams (each
     * workgroup's copy of A then serves more columns: 256 invocations in 8
     * teams, halved down to 2 while they leave fewer than 256 workgroups),
     * beside the partial sums: at most 32 KiB (lavapipe's limit), else A
     * as it is. fp8 codes times f16 A (--precision f16) on devices with f16
     * arithmetic: A's rows as f16 pairs in shared memory (A_H2, 52 bytes
     * a chunk of 16 k), within the same 32 KiB, in teams of 16 (16 halved
     * as above: its staging costs more than A_Q8's, and more columns
     * share it). Measured on an H200 at one row (us, the second of two
     * products; bench/experiments/act_int8-h200.txt section 8): e4m3 4096
     * x 65536 93.4 -> 88.9 (8 teams) -> 84.9 (16), 4096 x 16384 28.1 ->
     * 26.0 -> 24.7; e5m2 (8 teams) 95.8 -> 83.7 and 28.9 -> 24.5.
     * KILN_F16_PAIRS=0 turns it off, as F16_PAIRS below */
    const char *pairs_env = getenv("KILN_F16_PAIRS");
    bool pairs_off = pairs_env && strcmp(pairs_env, "0") == 0;
    bool a_vec = s->a_sm % 4 == 0 && all_multiples(s->brank, s->ops[1].strides, 4);
    bool a_f16 = s->ops[1].t->dtype == KILN_DTYPE_F16;
    bool asym = fmt == WF_INT8_ASYM || fmt == WF_INT4_ASYM;
    bool q8 = n->act_int8 && fmt >= WF_INT8 && fmt <= WF_INT4_ASYM && s->K % 32 == 0;
    bool h2 = !q8 && (fmt == WF_FP8_E4M3 || fmt == WF_FP8_E5M2) && a_f16 && a_vec && !pairs_off;
    int64_t qwg = wg, qteams = teams;
    if ((q8 || h2) && !tune) {
        qwg = 256, qteams = h2 ? 16 : 8;
        while (qteams > 2 && groups_for(s->N, cn * qteams) * s->batch < 256)
            qteams /= 2;
        while (mrows * cn * qwg > 4096 && qwg > qteams)
            qwg /= 2;
    }
    q8 = q8 && mrows * s->K + mrows * s->K / 8 + (asym ? mrows * s->K / 4 : 0) +
                       mrows * cn * qwg * 4 <= 32768;
    h2 = h2 && mrows * (s->K / 16) * 52 + mrows * cn * qwg * 4 <= 32768;
    if (q8 || h2)
        wg = qwg, teams = qteams, ashared = 0;
    Dispatch *d = new_dispatch(p, n, "matvec_k");
    d->local_size = (uint32_t)wg;
    define_int(d, "M", mrows);
    define_str(d, "MROWS", rows_glsl(s));
    define_product(d, s);
    define_operand_types(p, d, s);
    define_int(d, "WG", wg);
    define_int(d, "CN", cn);
    /* A four elements a load (A's rows and batches in whole vectors) */
    define_int(d, "A_VEC", a_vec);
    /* 8- and 4-bit codes times f16 A (--precision f16) in f16 pairs on
     * devices with f16 arithmetic (the KILN_SUBGROUP build, which then
     * needs it too): measured on an H200 at one row of a decoder's
     * products (bench/experiments/matvec_k_f16-h200.txt), int4 2048 x
     * 11264 11.8 -> 10.3 us, 5632 x 2048 8.7 -> 7.6, 2048 x 32000 24.9 ->
     * 20.7; KILN_F16_PAIRS=0 turns it off, for comparison */
    if (fmt >= WF_INT8 && fmt <= WF_INT4_ASYM && a_f16 && a_vec && !ashared && !q8 &&
        !pairs_off) {
        define_int(d, "F16_PAIRS", 1);
        d->alt_needs = KILN_FEATURE_FLOAT16;
    }
    if (h2) {
        define_int(d, "A_H2", 1);
        d->alt_needs = KILN_FEATURE_FLOAT16;
    }
    if (unroll > 1)
        define_int(d, "UNROLL", unroll);
    if (teams > 1)
        define_int(d, "TEAMS", teams);
    if (ashared)
        define_int(d, "A_SHARED", 1);
    if (q8) { /* OpSDot in the subgroup build */
        define_int(d, "A_Q8", 1);
        d->alt_needs |= KILN_FEATURE_INTDOT;
    }
    define_int(d, "W_FORMAT", fmt);
    if (fmt >= WF_INT8) {
        define_int(d, "QBLOCK", QUANT_BLOCK);
        define_int(d, "NBLK", (s->K + QUANT_BLOCK - 1) / QUANT_BLOCK);
    }
    dispatch_arg(d, s->ops[0].t, true);
    dispatch_arg(d, s->ops[1].t, false);
    dispatch_arg(d, n->wq ? n->wq : s->ops[2].t, false);
    d->flops = 2ull * (uint64_t)(mrows * s->N) * (uint64_t)s->K * (uint64_t)s->batch;
    d->groups[0] = groups_for(s->N, cn * teams);
    d->groups[1] = 1;
    d->groups[2] = groups_for(s->batch, 1);
    return d;
}
